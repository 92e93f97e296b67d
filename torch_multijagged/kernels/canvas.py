"""Windowed ops (convolutions, pooling) over ragged spatial dims, computed on a canvas.

NOTE [ Canvas ]

A batch of images of different sizes ``(B, C, j0, j1)`` is stored as packed pixel rows
``(P, C)``, ``P = Σ hᵢ·wᵢ``, row-major ``(h, w)`` per sample. A windowed op (conv, pooling,
transposed conv) must see each image on its own, with the op's zero padding around it. We place
every image once on one canvas ``(1, C, H_c, W_c)`` — channels last, so a canvas pixel is a row
and the copy is a row gather — with *gutters* of zeros (``-inf`` for max pooling) between them,
run the dense op once on the canvas, and gather each image's output pixels back. The canvas op is
the dense op (oneDNN on the CPU), called once per layer whatever B is; its autograd is dense
autograd (``index_copy`` in, ``index_select`` out), so any order of gradients works.

Exactness. Per axis, output pixel ``o`` of an image placed at ``X`` reads the canvas at
``X + o·s − p_l + j·d`` (``j < k``): image pixels, or positions up to ``p_l`` before it and
``r = max(0, (out−1)·s − p_l + d(k−1) − (n−1))`` after it. A gutter of ``max(p_l, r)`` between
neighbours (and a trailing margin) makes every such position a zero (or ``-inf``) that belongs
to no image — exactly the dense op's padding. Origins are aligned to the stride (``X ≡ 0 mod s``)
so that the canvas op's output grid, with canvas padding ``p_l``, starts each image's output at
``X / s``; the gutter is also at least ``(out−1)·s + 1 − n``, so that neighbours' outputs never
share an output pixel (with ``p_l > d(k−1)`` the outer outputs read padding only, and a shared
pixel would keep one of the two gradients the gather's backward scatters to it). Transposed
convolutions scatter instead of gather: image input ``i`` reaches canvas output ``(X+i)·s + j·d``;
with canvas padding 0 the image's output starts at ``X·s + p_l`` and a gutter of
``⌊(d(k−1) − p_l + output_padding)/s⌋ + 1`` keeps neighbours' scatters apart.
Average pooling sums on the canvas (``divisor_override=1``) and divides by dense torch's
per-window divisor, computed from each image's own size (``avg_divisor``), so ``ceil_mode`` and
``count_include_pad`` follow dense exactly.

Packing. Images are placed by shelf packing (sorted by height, rows of a common width) over a
few canvas widths, keeping the smallest canvas; with sides 32–128 the canvas holds 0.85–0.95
image pixels per canvas pixel (``CanvasPlan.occupancy``), against ``ρ = Σ hᵢwᵢ / (B·H·W)`` for
the padded envelope (docs/design.md §19 has the measurements). Plans depend only on the sizes
and the window geometry; callers cache them on the partition (NOTE [ Derived maps ]).

This module is pure torch on host sizes; it knows nothing of the subclass.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .reference import building

__all__ = ["rows_conv", "onednn_safe_conv", "canvas_conv_applies", "Window", "CanvasPlan", "output_sizes", "plan_canvas", "to_canvas", "to_out_canvas", "from_canvas", "avg_divisor", "local_index", "max_pool1d_rows", "max_pool2d_rows"]


@dataclass(frozen=True)
class Window:
    """One spatial axis of a windowed op, in dense torch's terms."""

    kernel: int
    stride: int
    pad_l: int
    pad_r: int
    dilation: int = 1
    ceil_mode: bool = False
    transposed: bool = False
    output_padding: int = 0

    def out_len(self, n: Tensor) -> Tensor:
        """Dense torch's output size for input sizes ``n`` (int64), unclamped (may be ≤ 0)."""
        k_eff = self.dilation * (self.kernel - 1)
        if self.transposed:
            return (n - 1) * self.stride - self.pad_l - self.pad_r + k_eff + self.output_padding + 1
        num = n + self.pad_l + self.pad_r - k_eff - 1
        if self.ceil_mode:
            out = torch.div(num + self.stride - 1, self.stride, rounding_mode="floor") + 1
            # pooling_output_shape: the last window must start inside the input or its left padding
            return torch.where((out - 1) * self.stride >= n + self.pad_l, out - 1, out)
        return torch.div(num, self.stride, rounding_mode="floor") + 1

    def rule(self) -> tuple:
        """A key naming the size map ``n ↦ out_len(n)`` (``n ↦ 0`` at 0, ``output_sizes``): equal
        keys, equal maps, so ops of one rule on one extent share the output's nested int."""
        k_eff = self.dilation * (self.kernel - 1)
        if self.transposed:
            return ("affine", self.stride, -self.pad_l - self.pad_r + k_eff + self.output_padding + 1)
        a = self.pad_l + self.pad_r - k_eff - 1
        if self.ceil_mode:
            return ("ceil", a, self.stride, self.pad_l)
        return ("floor", a, self.stride)

    def gutter(self, n: Tensor, out: Tensor) -> int:
        """Zeros needed between two images along this axis (NOTE [ Canvas ])."""
        k_eff = self.dilation * (self.kernel - 1)
        if self.transposed:
            return max(0, (k_eff - self.pad_l + self.output_padding) // self.stride) + 1
        over = (out - 1) * self.stride - self.pad_l + k_eff - (n - 1)
        # The outputs' footprints must not overlap either: with padding past the kernel
        # (pad_l > k_eff) an image's first and last outputs read padding only, and a gutter of
        # max(pad_l, over) lets one image's last output land on the next one's first. The
        # forward gathers the right value (both are the bias) but the gather's backward scatters
        # the two gradients onto one canvas pixel and keeps one. With stride-aligned origins the
        # next output starts at ceil((n + gutter) / s), which must be ≥ out.
        apart = (out - 1) * self.stride + 1 - n
        r = int(torch.maximum(over, apart).clamp(min=0).max()) if n.numel() else 0
        return max(self.pad_l, r)

    @property
    def align(self) -> int:
        return 1 if self.transposed else self.stride

    def onednn_safe_len(self, n: int) -> int:
        """The smallest width ``≥ n`` on which oneDNN's conv of this window (padding ``pad_l`` on
        both sides) has two outputs or more and no tap that reads only padding; for a transposed
        window, the same of the conv its input gradient and weight gradient are (NOTE [ oneDNN's
        one-column convolutions ])."""
        k_eff = self.dilation * (self.kernel - 1)
        while True:
            if self.transposed:  # the conv from the output (length m) back to the input (length n)
                m = (n - 1) * self.stride - 2 * self.pad_l + k_eff + self.output_padding + 1
                src, out = m, n
            else:
                src, out = n, (n + 2 * self.pad_l - k_eff - 1) // self.stride + 1
            if out >= 2 and all(any(0 <= o * self.stride - self.pad_l + j * self.dilation < src for o in range(out))
                                for j in range(self.kernel)):
                return n
            n += 1


# NOTE [ oneDNN's one-column convolutions ]
#
# torch 2.13's oneDNN (CPU) computes bf16 convolutions wrongly when the output is one pixel wide:
# with the AMX kernels (``brg_conv_fwd``/``bwd_w``, chosen for ≥ 128 channels on CPUs with
# AMX-BF16) the forward returns garbage, NaN or ~1e38, differing run to run, whenever the
# output width is 1 and its height (or depth) more than 1, and the weight gradient does so for
# an output width of 1 (1-d: a short output) and a kernel column that reads only padding. A
# wider output is exact (sweeps of shapes, kernels, strides, paddings, dilations and channel
# counts; fp16, fp32, the input gradient and the transposed forward are unaffected). A canvas of
# narrow images hits it where each image's own conv may not (four columns of 160 channels, a
# 2×2 stride-2 conv: one output column). So the canvas's last axis is widened, by gutter, until
# its conv has two output columns or more and every kernel column reads some canvas pixel
# (``Window.onednn_safe_len``): the extra columns are zeros that no image's output reads, so
# results are unchanged, for every dtype (the planner does not know it; a canvas that narrow is
# small). A transposed conv's canvas (two columns or more, padding 0) needs nothing.
# ``onednn_safe_conv`` does the same for a dense conv of one image or volume, for reduced-precision
# CPU inputs only.


@dataclass
class CanvasPlan:
    """Where every image sits on the canvas and where its output lands."""

    pages: int  # the canvas is a batch of pages (N, C, *shape)
    shape: tuple[int, ...]  # a page's spatial shape
    out_shape: tuple[int, ...]  # the canvas op's output spatial shape (per page)
    in_index: Tensor  # (P,) canvas pixel (page-major) of every input pixel row
    out_index: Tensor  # (P',) output-canvas pixel (page-major) of every output pixel row
    origins: Tensor  # (B, S) host: each image's origin on its page
    out_origins: Tensor  # (B, S) host: each image's output origin on its output page
    in_sizes: Tensor  # (B, S) host
    out_sizes: Tensor  # (B, S) host
    pixel_sample: Tensor  # (P',) sample of every output pixel row (device)
    occupancy: float  # input pixels / canvas pixels
    in_gutter: Tensor  # canvas pixels that hold no input pixel
    out_gutter: Tensor  # output-canvas pixels that are no image's output
    cache: dict = dataclasses.field(default_factory=dict)  # placements (``_where``)
    page_of: Optional[Tensor] = None  # (B,) host: each image's page


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _pack(sizes: list[tuple[int, ...]], order: list[int], page: tuple, gut: tuple, align: tuple):
    """Shelf packing of boxes ``sizes[i]`` (1-d: segments; 2-d: rows of a common width) in
    ``order`` onto pages whose usable extent is ``page`` (``None`` along the first axis: one
    page, as long as needed). Returns ``({i: (page, *origin)}, pages, used extent)``."""
    pos = {}
    if len(page) == 1:
        (lp,), (g,), (a,) = page, gut, align
        pg = x = used = 0
        for i in order:
            x = _align(x, a)
            if lp is not None and x and x + sizes[i][0] > lp:
                pg, x = pg + 1, 0
            pos[i] = (pg, x)
            used = max(used, x + sizes[i][0])
            x += sizes[i][0] + g
        return pos, pg + 1, (used,)
    hp, wp = page
    gh, gw = gut
    ah, aw = align
    # First fit decreasing height: boxes come tallest first; each goes on the first shelf of its
    # page with room left (a shelf is as tall as its first box), else opens a shelf or a page.
    shelves: list[list[int]] = []  # [page, y, height, next x]
    pg = y_next = used_h = used_w = 0
    for i in order:
        h, w = sizes[i]
        for sh in shelves:
            x = _align(sh[3], aw)
            if sh[0] == pg and h <= sh[2] and x + w <= wp:
                break
        else:
            if hp is not None and y_next and y_next + h > hp:
                pg, y_next = pg + 1, 0
            sh = [pg, y_next, h, 0]
            shelves.append(sh)
            y_next = _align(y_next + h + gh, ah)
            x = 0
        pos[i] = (sh[0], sh[1], x)
        sh[3] = x + w + gw
        used_h, used_w = max(used_h, sh[1] + h), max(used_w, x + w)
    return pos, pg + 1, (used_h, used_w)


# Relative cost of one dense op over N pages of equal area, against one page: measured on the
# CPU (oneDNN), a batch of pages parallelises the backward better than one large plane (§19 of
# docs/design.md); a mild preference, so that packing density still decides.
def _batch_factor(pages: int) -> float:
    return 1.0 + 0.3 / math.sqrt(pages)


def _choose(sizes: list[tuple[int, ...]], live: list[int], gut: tuple, align: tuple):
    """The cheapest packing among a few page shapes (``_batch_factor`` × canvas pixels)."""
    s = len(gut)
    order = sorted(live, key=lambda i: tuple(-n for n in sizes[i]))
    big = [max(sizes[i][a] for i in live) for a in range(s)]
    total = sum(math.prod(n + g for n, g in zip(sizes[i], gut)) for i in live)
    cands = []
    if s == 1:
        cands += [(None,)] + [(_align(int(big[0] * f), align[0]),) for f in (1, 2, 4, 8)]
    else:
        side = math.sqrt(total)
        cands += [(None, max(big[1], int(side * f))) for f in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0)]
        cands += [(int(big[0] * fh), int(big[1] * fw)) for fh in (1, 1.5, 2) for fw in (1, 1.5, 2)]
    best = None
    for page in cands:
        pos, pages, used = _pack(sizes, order, page, gut, align)
        shape = tuple(u + g for u, g in zip(used, gut))
        cost = pages * math.prod(shape) * _batch_factor(pages)
        if best is None or cost < best[0]:
            best = (cost, pos, pages, shape)
    return best[1:]


def output_sizes(op: str, sizes: Tensor, windows: Sequence[Window]) -> Tensor:
    """(B, S) per-sample output sizes: ``Window.out_len`` per axis, and 0 along an axis of size
    0 (an empty image has an empty output: the batch's way of holding no image, where the dense
    op would raise on empty input). Each axis is a function of that axis' input size alone, so a
    ragged input extent maps to a ragged output extent (``Window.rule``). Raises where dense
    torch raises: an image with pixels whose output would be empty."""
    raw = torch.stack([w.out_len(sizes[:, a]) for a, w in enumerate(windows)], 1)
    bad = (sizes.prod(1) > 0) & (raw < 1).any(1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        size = "×".join(str(int(n)) for n in sizes[i])
        want = "×".join(str(int(n)) for n in raw[i])
        raise ValueError(
            f"{op}(): sample {i} of spatial size {size} is smaller than the window (with its padding, dilation and "
            f"stride): its output would have size {want} (the dense op raises for it)"
        )
    return torch.where(sizes == 0, torch.zeros_like(raw), raw.clamp(min=0))


def plan_canvas(sizes: Tensor, windows: Sequence[Window], device: torch.device) -> CanvasPlan:
    """The canvas for images of ``sizes`` ((B, S) int64 host, S = 1 or 2) under ``windows``
    (one per axis); ``output_sizes`` must have accepted the sizes."""
    b, s = sizes.shape
    outs = torch.where(sizes == 0, torch.zeros_like(sizes), torch.stack([w.out_len(sizes[:, a]) for a, w in enumerate(windows)], 1).clamp(min=0))
    area = sizes.prod(1) if s else sizes.new_zeros(b)
    # Every image with pixels is placed (its pixels must land somewhere that no other image reads);
    # the gutters are sized by the images that have an output.
    placed = [i for i in range(b) if int(area[i]) > 0]
    live = [i for i in placed if int(outs[i].prod()) > 0]
    gut = [w.gutter(sizes[live, a], outs[live, a]) if live else 0 for a, w in enumerate(windows)]
    producing, live = live, placed
    origins = torch.zeros(b, s, dtype=torch.int64)
    page_of = torch.zeros(b, dtype=torch.int64)
    if live:
        boxes = [tuple(int(n) for n in row) for row in sizes.tolist()]
        pos, pages, shape = _choose(boxes, live, tuple(gut), tuple(w.align for w in windows))
        for i, (pg, *org) in pos.items():
            page_of[i] = pg
            origins[i] = torch.tensor(org)
    else:
        pages, shape = 1, tuple(1 + g for g in gut)
    # Trailing margin: a transposed conv's output may run past its input footprint.
    # A canvas at least one window wide (an all-empty batch still runs the op once).
    shape = tuple(
        max(n + (w.output_padding + w.pad_l + 1 if w.transposed else 0), w.dilation * (w.kernel - 1) + 1)
        for n, w in zip(shape, windows)
    )
    # The last axis wide enough for oneDNN (NOTE [ oneDNN's one-column convolutions ]).
    shape = (*shape[:-1], windows[-1].onednn_safe_len(shape[-1])) if shape else shape
    out_shape, out_origins = [], torch.zeros(b, s, dtype=torch.int64)
    for a, w in enumerate(windows):
        canvas_n = torch.tensor([shape[a]])
        if w.transposed:
            out_shape.append(int(Window(w.kernel, w.stride, 0, 0, w.dilation, transposed=True).out_len(canvas_n)))
            out_origins[:, a] = origins[:, a] * w.stride + w.pad_l
        else:
            full = Window(w.kernel, w.stride, w.pad_l, w.pad_l, w.dilation)
            out_shape.append(int(full.out_len(canvas_n)))
            out_origins[:, a] = origins[:, a] // w.stride
    ends = out_origins + outs
    if producing and bool((ends[producing] > torch.tensor(out_shape)).any()):  # pragma: no cover - planner invariant
        raise AssertionError(f"canvas plan: an output runs past the canvas {sizes.tolist()} {windows} {out_shape} {ends.tolist()} {shape}")
    in_index = _pixel_index(sizes, origins, page_of, shape, device)
    out_index = _pixel_index(outs, out_origins, page_of, tuple(out_shape), device)
    sample = torch.repeat_interleave(torch.arange(b), outs.prod(1) if s else torch.zeros(b, dtype=torch.int64)).to(device)
    canvas_px = pages * math.prod(shape)
    occ = float(area.sum()) / canvas_px if canvas_px else 1.0
    return CanvasPlan(pages, shape, tuple(out_shape), in_index, out_index, origins, out_origins, sizes, outs, sample, occ,
                      _complement(in_index, canvas_px), _complement(out_index, pages * math.prod(out_shape)),
                      page_of=page_of)


def _pixel_index(sizes: Tensor, origins: Tensor, page: Tensor, shape: tuple[int, ...], device) -> Tensor:
    """(Σ Π sizes,) canvas pixel (row-major over ``(pages, *shape)``) of every pixel of every
    image, in sample-major, row-major order."""
    counts = sizes.prod(1)
    total = int(counts.sum())
    sample = torch.repeat_interleave(torch.arange(sizes.shape[0]), counts)
    start = torch.cumsum(counts, 0) - counts
    local = torch.arange(total) - start[sample]
    if sizes.shape[1] == 1:
        idx = origins[sample, 0] + local
    else:
        w = sizes[sample, 1]
        idx = (origins[sample, 0] + torch.div(local, w, rounding_mode="floor")) * shape[1] + origins[sample, 1] + local % w
    return (idx + page[sample] * math.prod(shape)).to(device)


def _complement(index: Tensor, total: int) -> Tensor:
    keep = torch.ones(total, dtype=torch.bool, device=index.device)
    keep[index] = False
    return keep.nonzero().squeeze(1)


# NOTE [ Placing images by blocks ]
#
# A pixel row's canvas row is an index (``in_index``), but an image is a rectangle of the canvas:
# ``h`` runs of ``w`` consecutive rows, one every canvas width. Moving images by index
# (``index_fill_`` of the gutters, ``index_copy_`` of the pixels, ``index_select`` back) costs a
# per-row loop: over a CNN step on 16 images of 24–96 px a side with 32 channels these three were
# a third of its time (1 thread). Where images are large enough (``BLOCK_ROWS`` pixels on
# average), a placement instead zero-fills the canvas (a memset) and copies each image as one
# strided block — ``B`` copies, each at copy speed — and gathers back the same way. Small images
# (many tiny blocks, where the per-call cost would dominate) keep the index path. Around the
# threshold the two are level (a 32-channel 3×3 conv, forward and backward, 1 thread; index time /
# blocks time): B = 256 images of 63 px on average 0.98, of 98 px 0.99, of 260 px 1.03; B = 64 of
# 101 px 1.02.
BLOCK_ROWS = 64


@dataclass(frozen=True)
class _Where:
    """Where pixel rows sit in canvas rows: ``index`` (one canvas row per pixel row), ``gutter``
    (the other canvas rows), ``total`` canvas rows, and ``blocks`` — per image ``(first pixel
    row, h, w, first canvas row, canvas width)`` — or None for the index path."""

    index: Tensor
    gutter: Optional[Tensor]
    total: int
    rows: int
    blocks: Optional[tuple]


def _block_view(buf: Tensor, dst: int, h: int, w: int, width: int) -> Tensor:
    """Canvas rows ``buf (M, C)`` of the ``h × w`` rectangle whose first row is ``dst``."""
    s0, s1 = buf.stride()
    return buf.as_strided((h, w, buf.shape[1]), (width * s0, s0, s1), buf.storage_offset() + dst * s0)


def _where(plan: CanvasPlan, side: str, margin: int = 0, blocks: bool = True) -> _Where:
    """The placement of the input (``side="in"``) or output (``"out"``) pixels, after ``margin``
    zero rows and before as many (cached on the plan); ``blocks=False``: the index path always."""
    key = ("where", side, margin, blocks)
    hit = plan.cache.get(key)
    if hit is not None:
        return hit
    with building():
        return _build_where(plan, side, margin, key, blocks)


def _build_where(plan: CanvasPlan, side: str, margin: int, key, by_blocks: bool = True) -> _Where:
    index, shape, sizes, origins = ((plan.in_index, plan.shape, plan.in_sizes, plan.origins) if side == "in" else
                                    (plan.out_index, plan.out_shape, plan.out_sizes, plan.out_origins))
    page = math.prod(shape)
    total = plan.pages * page + 2 * margin
    if margin:
        index = index + margin
    counts = sizes.prod(1) if sizes.shape[1] else torch.zeros(sizes.shape[0], dtype=torch.int64)
    b, rows = counts.shape[0], int(counts.sum())
    blocks = None
    if by_blocks and plan.page_of is not None and b and rows >= BLOCK_ROWS * b and sizes.shape[1] in (1, 2):
        width = shape[-1] if sizes.shape[1] == 2 else 1
        starts = (torch.cumsum(counts, 0) - counts).tolist()
        blocks = []
        for i in range(b):
            if int(counts[i]) == 0:
                continue
            if sizes.shape[1] == 2:
                h, w = int(sizes[i, 0]), int(sizes[i, 1])
                first = int(origins[i, 0]) * shape[1] + int(origins[i, 1])
            else:
                h, w = 1, int(sizes[i, 0])
                first = int(origins[i, 0])
            blocks.append((starts[i], h, w, margin + int(plan.page_of[i]) * page + first, width))
        blocks = tuple(blocks)
    # the gutter rows only on the index path (placing by blocks zero-fills instead)
    gutter = None if blocks is not None else (_complement(index, total) if margin else
                                              plan.in_gutter if side == "in" else plan.out_gutter)
    hit = plan.cache[key] = _Where(index, gutter, total, rows, blocks)
    return hit


def _scatter(rows: Tensor, where: _Where, fill: float) -> Tensor:
    if where.blocks is None:
        out = rows.new_empty(where.total, rows.shape[1])
        out.index_fill_(0, where.gutter, fill)
        return out.index_copy_(0, where.index, rows)
    out = rows.new_full((where.total, rows.shape[1]), fill) if fill else rows.new_zeros(where.total, rows.shape[1])
    for start, h, w, dst, width in where.blocks:
        _block_view(out, dst, h, w, width).copy_(rows.narrow(0, start, h * w).view(h, w, -1))
    return out


def _gather(canvas: Tensor, where: _Where) -> Tensor:
    if where.blocks is None:
        return canvas.index_select(0, where.index)
    canvas = canvas if canvas.stride(1) == 1 else canvas.contiguous()
    out = canvas.new_empty(where.rows, canvas.shape[1])
    for start, h, w, dst, width in where.blocks:
        out.narrow(0, start, h * w).view(h, w, -1).copy_(_block_view(canvas, dst, h, w, width))
    return out


class _Scatter(torch.autograd.Function):
    """Rows ``(P, C)`` to canvas rows ``(M, C)`` placed by ``where``, ``fill`` in the gutters.
    Written, not cloned: one pass over the canvas. Its backward is ``_Gather``, whose backward
    is this, so every order differentiates."""

    @staticmethod
    def forward(ctx, rows, where, fill):  # type: ignore[override]
        ctx.where = where
        return _scatter(rows, where, fill)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _Gather.apply(grad, ctx.where), None, None


class _Gather(torch.autograd.Function):
    """Canvas rows ``(M, C)`` placed by ``where``: ``(P, C)``."""

    @staticmethod
    def forward(ctx, canvas, where):  # type: ignore[override]
        ctx.where = where
        return _gather(canvas, where)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _Scatter.apply(grad, ctx.where, 0.0), None


def to_canvas(rows: Tensor, plan: CanvasPlan, fill: float = 0.0) -> Tensor:
    """``rows (P, C)`` placed on the canvas: ``(pages, C, *plan.shape)``, channels last."""
    c = rows.shape[1]
    canvas = _Scatter.apply(rows, _where(plan, "in"), fill)
    return canvas.view(plan.pages, *plan.shape, c).movedim(-1, 1)


def to_out_canvas(rows: Tensor, plan: CanvasPlan) -> Tensor:
    """Output pixel rows ``(P', C')`` placed on the output canvas ``(pages, C', *out_shape)``
    (zeros elsewhere): an output gradient for ``aten.convolution_backward`` on the canvas."""
    c = rows.shape[1]
    canvas = _Scatter.apply(rows, _where(plan, "out"), 0.0)
    return canvas.view(plan.pages, *plan.out_shape, c).movedim(-1, 1)


def from_canvas(out: Tensor, plan: CanvasPlan) -> Tensor:
    """Every image's output pixels ``(P', C')`` from the canvas op's output ``(pages, C', *out_shape)``."""
    c = out.shape[1]
    flat = out.movedim(1, -1).reshape(-1, c)
    return _Gather.apply(flat, _where(plan, "out"))


def local_index(canvas_index: Tensor, plan: CanvasPlan) -> Tensor:
    """Max pooling's ``return_indices``: canvas pixels → each image's flat index (dense torch's
    convention: ``h · w_i + w`` within the sample)."""
    sample = plan.pixel_sample  # indices are within a page (the op's per-plane convention)
    if len(plan.shape) == 1:
        return canvas_index - plan.origins[:, 0].to(canvas_index.device)[sample].unsqueeze(1)
    wc = plan.shape[1]
    org = plan.origins.to(canvas_index.device)[sample]
    w = plan.in_sizes.to(canvas_index.device)[sample, 1]
    cy = torch.div(canvas_index, wc, rounding_mode="floor") - org[:, :1]
    cx = canvas_index % wc - org[:, 1:]
    return cy * w.unsqueeze(1) + cx


def max_pool1d_rows(rows: Tensor, plan: CanvasPlan, window: Window, low: float,
                    index: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Dense ``max_pool1d_with_indices`` of every 1-d image of ``rows (P, C)``: the output rows
    ``(P', C)`` and, with ``index``, each one's index in its image.

    The canvas's gutters hold ``low`` (the dtype's lowest value), which never beats a value of
    the image, so the index is the dense kernel's own (its first maximum, its last NaN) except
    in a window whose values are all ``low``: the kernel keeps its first position, which on the
    canvas may be a gutter cell left of the image; there it becomes the window's first position
    in the image, as on the image alone. The canvas op runs without autograd; where ``rows``
    requires grad the outputs are read from ``rows`` at those indices (a gather, so the gradient
    goes where dense's does, to every order). A dilated window that misses its image (dense
    torch reads outside the tensor there) is ``low``, with dense's index and no gradient."""
    c = rows.shape[1]
    grad = rows.requires_grad
    with torch.no_grad():
        # by index: on 1-d images one index_copy beats a copy per image (B = 4–16 signals of
        # 20–300 rows, 40 channels: 1.7–2.8× faster)
        canvas = _scatter(rows.detach(), _where(plan, "in", blocks=False), low)
        canvas = canvas.view(plan.pages, plan.shape[0], c).movedim(-1, 1)
        # channels last: the CPU kernel vectorises over the channels (10× a contiguous canvas)
        out, idx = torch.max_pool1d_with_indices(canvas, window.kernel, window.stride, window.pad_l, window.dilation)
        where = _where(plan, "out", blocks=False)
        out = _gather(out.movedim(1, -1).reshape(-1, c), where)
        if not (index or grad):
            return out, None
        origin, first, start, miss = _max_pool_maps(plan, window)
        local = _gather(idx.movedim(1, -1).reshape(-1, c), where) - origin
        local = torch.where(local < 0, first, local)
    return (_from_rows(out, rows, local, start, miss) if grad else out), local


def _from_rows(out: Tensor, rows: Tensor, local: Tensor, start: Tensor, miss: Optional[Tensor]) -> Tensor:
    """The pooled values read from the pixel rows at the cells found (``start + local``), so that
    their gradient reaches the rows; a window that holds no cell of its image (``miss``) keeps
    ``out``'s value."""
    if miss is None:
        return rows.gather(0, local + start)
    return torch.where(miss, out, rows.gather(0, torch.where(miss, start, local + start)))


def _max_pool_maps(plan: CanvasPlan, window: Window) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Per output row of a 1-d canvas: its image's origin on the canvas, then ``_first_cells``."""
    key = ("max_pool_maps", window)
    hit = plan.cache.get(key)
    if hit is None:
        with building():
            outs = plan.out_sizes[:, 0]
            sample = torch.repeat_interleave(torch.arange(outs.shape[0]), outs)
            origin = plan.origins[sample, 0].unsqueeze(1).to(plan.in_index.device)
        hit = plan.cache[key] = (origin, *_first_cells(plan, (window,)))
    return hit


def _first_cells(plan: CanvasPlan, windows: Sequence[Window]) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(P', 1)`` per output row: the flat index in its image (row-major) of its window's first
    cell inside the image — dense pooling's initial index, each axis's first tap at or after 0 —,
    the image's first input row, and whether the window misses the image (None where none does)."""
    key = ("max_pool_first", tuple(windows))
    hit = plan.cache.get(key)
    if hit is not None:
        return hit
    with building():
        outs = plan.out_sizes
        counts = outs.prod(1)
        sample = torch.repeat_interleave(torch.arange(outs.shape[0]), counts)
        local = torch.arange(sample.shape[0]) - (torch.cumsum(counts, 0) - counts)[sample]
        coords = [local] if len(windows) == 1 else [torch.div(local, outs[sample, 1], rounding_mode="floor"),
                                                    local % outs[sample, 1]]
        first = torch.zeros_like(local)
        miss = torch.zeros_like(local, dtype=torch.bool)
        for a, w in enumerate(windows):
            lo = coords[a] * w.stride - w.pad_l
            d = w.dilation
            f = torch.where(lo < 0, lo + torch.div(-lo + d - 1, d, rounding_mode="floor") * d, lo)
            n = plan.in_sizes[sample, a]
            miss |= f >= n
            first = first * n + f
        pixels = plan.in_sizes.prod(1)
        dev = plan.in_index.device
        maps = [t.unsqueeze(1).to(dev) for t in (first, (torch.cumsum(pixels, 0) - pixels)[sample], miss)]
        hit = (maps[0], maps[1], maps[2] if bool(miss.any()) else None)
        plan.cache[key] = hit
    return hit


def max_pool2d_rows(rows: Tensor, plan: CanvasPlan, windows: Sequence[Window], low: float,
                    index: bool) -> tuple[Tensor, Optional[Tensor]]:
    """Dense ``max_pool2d_with_indices`` of every image of ``rows (P, C)`` (pixel rows): the
    output rows ``(P', C)`` and, with ``index``, each one's flat index in its image — as
    ``max_pool1d_rows``: the kernel on the canvas without autograd (its rules by construction;
    gutters of the lowest value), a window of the lowest value only given the window's first cell
    in the image (the kernel may keep a gutter cell there), and the values read from ``rows`` at
    the indices where ``rows`` requires grad (the gradient goes where dense's does, any order). A
    dilated window that misses its image is the lowest value, without gradient."""
    k, s, p, d = (tuple(getattr(w, f) for w in windows) for f in ("kernel", "stride", "pad_l", "dilation"))
    grad = rows.requires_grad
    with torch.no_grad():
        out, idx = F.max_pool2d(to_canvas(rows.detach(), plan, low), k, s, p, d, False, True)
        out = from_canvas(out, plan)
        if not (index or grad):
            return out, None
        first, start, miss = _first_cells(plan, windows)
        local = torch.where(out == low, first, local_index(from_canvas(idx, plan), plan))
    return (_from_rows(out, rows, local, start, miss) if grad else out), local


def avg_divisor(plan: CanvasPlan, windows: Sequence[Window], count_include_pad: bool,
                divisor_override: Optional[int], dtype: torch.dtype, device) -> Tensor:
    """(P', 1) dense torch's average-pooling divisor of every output pixel, from its image's
    size (``avg_pool2d``'s CPU kernel: the window clipped to the padded input for
    ``count_include_pad``, to the input otherwise)."""
    outs = plan.out_sizes
    b, s = outs.shape
    counts = outs.prod(1)
    total = int(counts.sum())
    if divisor_override:
        return torch.full((total, 1), float(divisor_override), dtype=dtype, device=device)
    sample = torch.repeat_interleave(torch.arange(b), counts)
    start = torch.cumsum(counts, 0) - counts
    local = torch.arange(total) - start[sample]
    coords = [local] if s == 1 else [torch.div(local, outs[sample, 1], rounding_mode="floor"), local % outs[sample, 1]]
    div = torch.ones(total, dtype=torch.int64)
    for a, w in enumerate(windows):
        n = plan.in_sizes[sample, a]
        lo = coords[a] * w.stride - w.pad_l
        hi = torch.minimum(lo + w.kernel, n + w.pad_r)
        if count_include_pad:
            div = div * (hi - lo)
        else:
            div = div * (torch.minimum(hi, n) - lo.clamp(min=0))
    return div.to(device=device, dtype=dtype).unsqueeze(1)


# --------------------------------------------------------------------------- conv backward
# NOTE [ Conv backward on the canvas ]
#
# oneDNN's CPU backward of a channels-last conv over one large plane is slow: for a 334×362
# canvas of 32 channels, 217 ms against a 27 ms forward (1 thread), 185 ms of it the weight
# gradient. ``canvas_conv`` keeps oneDNN's forward and computes the backward itself:
#
#   grad_input                = conv_transpose(G, kernel)       (a forward-type oneDNN op: 28 ms)
#   grad_weight[:, :, ky, kx] = Gᵀ · X_tap                      (one GEMM per tap: 73 ms)
#
# where ``X_tap`` holds, for every output pixel, the input pixel that tap reads. For a stride-1
# conv that keeps sizes (``2·padding = dilation·(kernel − 1)``) the canvas and its output share
# one pixel grid, so on the flat channels-last rows every tap is a constant row shift
# ``(ky·d − p)·W + (kx·d − p)``: a view, no copy (a pixel next to an image reads its zero gutter;
# a shift past a row's end reads the zero gutter that ends every row, or the zero rows added
# before and after). Other strides gather each tap as a strided view of the padded canvas (a
# copy per tap). Exact, since G is zero off the images' outputs; written with differentiable ops,
# so every order of gradients works. Used for one group and ≥ 16 input channels (with 3 input
# channels the taps' GEMMs are too thin and oneDNN's weight gradient is faster).

def onednn_safe_conv(x: Tensor, weight: Tensor, bias, stride, padding, dilation, groups: int = 1,
                     transposed: bool = False, output_padding=None) -> Tensor:
    """The dense ``conv{1,2,3}d`` (or ``conv_transpose{1,2,3}d``) of ``x`` with per-axis
    ``stride``/``padding``/``dilation``; a reduced-precision CPU input too narrow for oneDNN gets
    zero columns on the right, and the output loses what they add (NOTE [ oneDNN's one-column
    convolutions ])."""
    s = weight.dim() - 2
    op_ = tuple(output_padding) if output_padding is not None else (0,) * s
    if transposed:
        def run(t):
            return _CONV_T[s](t, weight, bias, stride, padding, op_, groups, dilation)
    else:
        def run(t):
            return _CONV[s](t, weight, bias, stride, padding, dilation, groups)
    if x.device.type != "cpu" or x.dtype not in (torch.bfloat16, torch.float16):
        return run(x)
    w = Window(int(weight.shape[-1]), int(stride[-1]), int(padding[-1]), int(padding[-1]), int(dilation[-1]),
               transposed=transposed, output_padding=int(op_[-1]))
    n = int(x.shape[-1])
    wide = w.onednn_safe_len(n)
    if wide == n:
        return run(x)
    return run(F.pad(x, (0, wide - n)))[..., :int(w.out_len(torch.tensor(n)))]


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def canvas_conv_applies(rows: Tensor, weight: Tensor, groups: int) -> bool:
    return groups == 1 and weight.shape[1] >= 16 and weight.dim() in (3, 4) and rows.is_floating_point()


def _canvas_rows(rows: Tensor, plan: CanvasPlan, margin: int) -> Tensor:
    """``(margin + M + margin, C)``: the canvas's flat rows between zero margins (differentiable)."""
    return _Scatter.apply(rows, _where(plan, "in", margin), 0.0)


def _as_canvas(buf: Tensor, plan: CanvasPlan, margin: int) -> Tensor:
    m = plan.pages * math.prod(plan.shape)
    return buf.narrow(0, margin, m).view(plan.pages, *plan.shape, buf.shape[1]).movedim(-1, 1)


def _same(weight: Tensor, stride, padding, dilation) -> bool:
    return all(s == 1 and 2 * p == d * (k - 1) for s, p, d, k in zip(stride, padding, dilation, weight.shape[2:]))


def _margin(plan: CanvasPlan, weight: Tensor, stride, padding, dilation) -> int:
    if not _same(weight, stride, padding, dilation):
        return 0
    width = plan.shape[-1] if len(plan.shape) == 2 else 1
    return padding[0] * width + (padding[1] if len(padding) == 2 else 0)


class _RowsConv(torch.autograd.Function):
    """Pixel rows → canvas → oneDNN conv → output pixel rows, as one node: it saves the rows (which
    the layer before already holds), not the canvas (NOTE [ Conv backward on the canvas ])."""

    @staticmethod
    def forward(ctx, rows, weight, bias, plan, stride, padding, dilation):  # type: ignore[override]
        margin = _margin(plan, weight, stride, padding, dilation)
        canvas = _as_canvas(_canvas_rows(rows, plan, margin), plan, margin)
        conv = F.conv2d if weight.dim() == 4 else F.conv1d
        out = conv(canvas, weight, bias, stride, padding, dilation)
        ctx.save_for_backward(rows, weight)
        ctx.geometry = (plan, stride, padding, dilation, margin, bias is not None)
        return _gather(out.movedim(1, -1).reshape(-1, out.shape[1]), _where(plan, "out"))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        rows, weight = ctx.saved_tensors
        plan, stride, padding, dilation, margin, has_bias = ctx.geometry
        g = to_out_canvas(grad, plan)
        gx = gw = gb = None
        if ctx.needs_input_grad[1]:
            buf = _canvas_rows(rows, plan, margin)
            gw = _taps_weight_grad(g, _as_canvas(buf, plan, margin), buf, margin, weight, stride, padding, dilation)
            del buf  # one canvas-sized buffer at a time (peak memory)
        if ctx.needs_input_grad[0]:
            gcanvas = _input_grad(g, plan, weight, stride, padding, dilation)
            del g
            gx = _Gather.apply(gcanvas.movedim(1, -1).reshape(-1, gcanvas.shape[1]), _where(plan, "in"))
        if has_bias and ctx.needs_input_grad[2]:
            gb = grad.sum(0)
        return gx, gw, gb, None, None, None, None


def _input_grad(grad, plan: CanvasPlan, weight, stride, padding, dilation):
    """The input canvas's gradient: the transposed conv of ``grad`` (output canvas)."""
    if _same(weight, stride, padding, dilation):
        # the transposed conv of a size-keeping conv is one too: flipped, transposed kernel
        conv = F.conv2d if weight.dim() == 4 else F.conv1d
        return conv(grad, weight.transpose(0, 1).flip(list(range(2, weight.dim()))), None, 1, padding, dilation)
    k = weight.shape[2:]
    out_pad = [int(n) - ((int(o) - 1) * s - 2 * p + d * (kk - 1) + 1)
               for n, o, s, p, d, kk in zip(plan.shape, grad.shape[2:], stride, padding, dilation, k)]
    tconv = F.conv_transpose2d if weight.dim() == 4 else F.conv_transpose1d
    return tconv(grad, weight, None, stride, padding, out_pad, 1, dilation)


def _taps_weight_grad(grad: Tensor, canvas: Tensor, buf: Tensor, margin: int, weight: Tensor, stride, padding,
                      dilation) -> Tensor:
    """Σ over output pixels of grad ⊗ the input pixel each tap reads: one GEMM per tap."""
    co, ci, *k = weight.shape
    g = grad.movedim(1, -1).reshape(-1, co).t()
    taps = []
    if _same(weight, stride, padding, dilation):
        m = g.shape[1]
        width = canvas.shape[-1] if len(k) == 2 else 1
        offs = [margin + sum((t * d - p) * w for t, d, p, w in zip(tap, dilation, padding, (width, 1)[-len(k):]))
                for tap in _taps(k)]
        if not torch.is_grad_enabled():
            # Blocks of rows, every tap per block: g's block is read from cache by all the taps
            # (1.75× faster than one GEMM per tap over all rows, 1 thread, 32 channels).
            out = g.new_zeros(len(offs), co, ci)
            step = max(2048, (1 << 19) // max(ci, co))
            for s0 in range(0, m, step):
                s1 = min(m, s0 + step)
                gb = g[:, s0:s1]
                for t, off in enumerate(offs):
                    out[t].addmm_(gb, buf[off + s0: off + s1])
            return out.permute(1, 2, 0).reshape(co, ci, *k)
        for off in offs:
            taps.append(g @ buf[off: off + m])
    else:
        # the dense weight gradient on the canvas: no padded copy of it, no strided copy per tap
        # (they were the peak of a CNN step with a strided conv)
        return torch.ops.aten.convolution_backward(
            grad, canvas, weight, None, list(stride), list(padding), list(dilation), False, [0] * len(k), 1,
            [False, True, False])[1]
    return torch.stack(taps, -1).view(co, ci, *k)


def _taps(k):
    if len(k) == 1:
        return [(a,) for a in range(k[0])]
    return [(a, b) for a in range(k[0]) for b in range(k[1])]


def rows_conv(rows: Tensor, plan: CanvasPlan, weight: Tensor, bias, stride, padding, dilation) -> Tensor:
    """A one-group conv with symmetric canvas padding, pixel rows in and out (NOTE [ Conv backward
    on the canvas ])."""
    t = lambda v: tuple(int(a) for a in v)  # noqa: E731
    return _RowsConv.apply(rows, weight, bias, plan, t(stride), t(padding), t(dilation))
