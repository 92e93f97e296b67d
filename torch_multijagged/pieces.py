"""Images held as per-image dense tensors between image-by-image ops.

NOTE [ Per-image pieces ]

Where images are large, convolutions and norms run image by image, as a user's loop would
(NOTE [ Convolutions image by image ] in ``kernels/per_image.py``). Concatenating each op's
per-image outputs into packed pixel rows, only for the next op to split them again, cost a
whole-batch copy per op and per direction. So the result of such an op *holds its pieces* — one
dense ``(1, C, hᵢ, wᵢ)`` tensor per image (``None`` for an image without pixels), in the memory
format the dense op gave: contiguous, as a user's loop has its images (the ops that go image by
image copy a view of pixel rows, which is channels last, to a contiguous image once; below 32
channels convolutions and batch norm keep the view's format, NOTE [ Convolutions image by image ])
— and packs them into its values only when something reads them. A chain conv → norm → activation → conv then runs the
loop's own dense calls, one layer at a time instead of one image at a time (on the benchmarks'
GroupNorm CNN, B = 16, fwd + bwd, one thread, that order alone costs 2–6 % over the loop's, out of
cache between layers; the nodes below add ≈ 60 µs per op).

* **Storage.** A wrapper holding pieces has no ``_values`` entry; ``MultiJaggedTensor._values``
  is then a non-data descriptor (``_PackOnRead`` in ``tensor.py``) that packs the pieces (one
  copy, under ``no_grad``: the wrapper's own autograd node carries the gradient), stores the
  values and forgets the pieces. Every other op, and every other path (dispatch, compile,
  pickling, deep copy), sees an ordinary tensor.
* **Autograd.** A result is the differentiable output of its pieces (``_AdoptPieces``: one node whose
  backward splits the gradient into pieces). When those pieces all carry a graph, consumers read
  them directly, and the autograd API asks them for the result's gradient (NOTE [ Pieces read
  directly ]). Otherwise (a leaf, a tensor whose pieces need no gradient, one the API sealed) a
  consumer reads them through ``_PiecesOf``, a node on that tensor's wrapper whose backward hands the
  per-piece gradients back as a wrapper *holding them as pieces*: every gradient of such a tensor
  reaches its wrapper. Either way hooks, ``retain_grad``, ``torch.autograd.grad(…, inputs=x)`` and
  every order of gradients behave as on any tensor, and no gradient is packed unless something reads it.
  A gradient that was packed (something read the values) reaches a contiguous piece as a
  contiguous image: an elementwise backward given a channels-last gradient and a contiguous saved
  input runs several times slower than on either format alone.
* **Staleness.** Pieces are read only while the wrapper's version counter is unchanged (an
  in-place op through the wrapper packs and writes the values) and while the values were never
  packed; otherwise the consumer takes the values as any other op.
  All consumers of one tensor share one ``_PiecesOf`` node, so the engine sums their gradients
  per piece.
* **Scope.** Eager only (no compile, dispatch mode or transform: there the values are read), 2-d
  images with both spatial dims ragged (values ``(P, C)``). Pieces are made by the ops that go
  image by image — conv, group norm and batch norm over large images; max and average pooling, elementwise
  ops and arithmetic between tensors that hold pieces (of one partition, or with a Python
  scalar), in place too (``relu_``, ``out += identity``: new pieces, the tensor's history
  rebased onto them as an in-place op's), and a channel ``cat`` of image batches of one partition
  — and read by those and by ``sum`` / ``mean`` over both spatial dims (global pooling: each
  image's own reduction). Attention scores ``(B, H, j0, j1)`` are images too, their heads the
  channels: ``q @ kᵀ`` makes them as pieces where blocks are large, ``softmax`` along any dim, a
  ``masked_fill`` by a mask of their structure and ``attn @ v`` read them (NOTE [ Attention scores
  held per sample ] in ``ops/contractions/sample_mm.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .structure import Partition
from .kernels.per_image import pack_images as pack
from .tensor import MultiJaggedTensor, values_of
from .wrappers import _built, _new_wrapper
from .writes import _eager

__all__ = ["wrapper_version", "wrapper_requires_grad", "holds_pieces", "split", "pack", "from_pieces", "map_pieces",
           "zip_pieces", "rewrite", "rewrite_with", "reduce_images", "reduce_all", "lead_major", "rewritable_here",
           "image_sizes", "in_size_order"]

MJT = MultiJaggedTensor
_DisableTF = torch._C.DisableTorchFunctionSubclass


def wrapper_version(x: MJT) -> int:
    """The wrapper's own version counter (not its values'), read below ``__torch_function__``; 0
    for an inference tensor, which has none (its writes read the values, which drops its pieces)."""
    with _DisableTF():
        try:
            return x._version
        except RuntimeError:
            if x.is_inference():
                return 0
            raise


def wrapper_requires_grad(x: MJT) -> bool:
    """The wrapper's own ``requires_grad``, read below ``__torch_function__``."""
    with _DisableTF():
        return x.requires_grad


def image_sizes(partition: Partition) -> list[tuple[int, int]]:
    """``(hᵢ, wᵢ)`` per image of a partition of two ragged dims (host lengths)."""
    return partition.derived("image_sizes", _image_sizes)


def _image_sizes(partition: Partition) -> list[tuple[int, int]]:
    return [tuple(hw) for hw in partition.host_sizes().tolist()]  # SYNC: none — host lengths


def rewritable_here(x: MJT) -> bool:
    """Whether an in-place op may give ``x`` new pieces: not under ``inference_mode`` unless ``x``
    is an inference tensor (new pieces made there would be inference tensors, through which no
    gradient reaches ``x``'s history; dense's write there changes the values and records nothing,
    which the general path's write into the packed values does)."""
    if not torch.is_inference_mode_enabled():
        return True
    with _DisableTF():
        return x.is_inference()


def lead_major(x: MJT) -> bool:
    """Whether the wrapper of images ``x`` reports lead-major values (a ``(C, P)`` buffer: attention
    scores held per sample), which its pieces are packed into."""
    return x._strides[1] != 1


def holds_pieces(x) -> bool:
    """Whether ``x`` holds per-image pieces that are still current (cheap; no autograd)."""
    if not isinstance(x, MJT) or not _eager():
        # eager only: dynamo cannot read a tensor's ``__dict__`` (in its eager fallback frames),
        # and under a dispatch mode or a transform the values are what every op reads
        return False
    rec = x.__dict__.get("_pieces")
    if rec is None:
        return False
    if rec[1] != wrapper_version(x):
        del x.__dict__["_pieces"]  # written in place: the values (packed then) are the truth
        return False
    return True


class _PiecesOf(torch.autograd.Function):
    """``x``'s pieces (those with pixels) as outputs of a node on ``x``: gradients reach ``x``."""

    @staticmethod
    def forward(ctx, x: MJT, live: list):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.x = (x._partition, x._ragged_dims, [tuple(p.shape) for p in live], x.dtype, x.device)
        return tuple(p.detach() for p in live)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        partition, ragged_dims, shapes, dtype, device = ctx.x
        if all(g is None for g in grads):
            return None, None
        grads = [torch.zeros(s, dtype=dtype, device=device) if g is None else g for g, s in zip(grads, shapes)]
        it = iter(grads)
        full = [None if n == 0 else next(it) for n in (h * w for h, w in image_sizes(partition))]
        return from_pieces(full, partition, ragged_dims, shapes[0][1], dtype, device), None


def _planar(live) -> list[bool]:
    """Which pieces are contiguous (channels first) images."""
    return [p.is_contiguous() for p in live]


def _grads_as(grad: MJT, planar: list[bool]) -> list[Tensor]:
    """``grad``'s images, each in its piece's format: a gradient read from packed rows is a
    channels-last view, and the elementwise backwards that meet it (with a contiguous saved input)
    would mix two formats, several times slower than either; one copy per image avoids that (an
    expanded gradient, a global mean's, stays as it is)."""
    parts = [p for p in split(grad) if p is not None]
    return [g.contiguous() if c and _channels_last(g) else g for g, c in zip(parts, planar)]


def _channels_last(g: Tensor) -> bool:
    return not g.is_contiguous() and g.is_contiguous(memory_format=torch.channels_last)


class _AdoptPieces(torch.autograd.Function):
    """``box[0]``, a wrapper built around pieces, made the differentiable output of the pieces."""

    @staticmethod
    def forward(ctx, box: list, *live):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.n_live = len(live)
        ctx.planar = _planar(live)
        return box[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return (None,) * (1 + ctx.n_live)
        return (None, *_grads_as(grad, ctx.planar))


# NOTE [ Pieces read directly ]
#
# A result made of pieces that all carry a graph (``from_pieces`` under autograd: a conv's, a
# norm's, an activation's outputs) hands every gradient it receives to them: its node's backward
# splits the gradient into pieces. Its consumers may then read the pieces themselves instead of
# through ``_PiecesOf``, as the values path reads a result's values (NOTE [ Eager values path ] in
# ``ops/fastpath.py``): a chain conv → norm → activation → conv records the loop's dense graph and
# nothing else, and its backward runs no Python (two nodes per op fewer, each a pass over the
# images; 3–4 % of the benchmarks' CNN step at B = 4). The gradient *with respect to the result*
# is then the gradient with respect to its pieces, which the autograd API answers
# (``torch.autograd.grad(…, inputs=y)``, ``backward(inputs=[y])``, ``retain_grad``/``grad``,
# ``register_hook``, ``grad_fn``:
# ``read_directly`` below). A result that no consumer read yet when the API asks is *sealed*
# instead: its later consumers read through its node, and the API runs on the wrapper as on any
# tensor. A hook registered after a direct read sees the whole gradient but cannot replace it
# (the images' backwards do not wait for one another): one that returns a new gradient raises.
# The record lives apart from the pieces (``_own_pieces``: the live pieces, the wrapper's version,
# whether a consumer read them), so packing the values keeps it; an in-place write through the
# wrapper (a new version, whose graph starts at the write) ends it.


# Pieces exist outside functorch transforms only (``holds_pieces``), where ``Function.apply``'s
# Python layer (functorch's unwrapping) has nothing to do: its C++ ``apply`` is called directly.
_functorch = torch._C._are_functorch_transforms_active
_apply_adopt_pieces = torch._C._FunctionBase.__dict__["apply"].__get__(None, _AdoptPieces)


def _own(x: MJT, live: list[Tensor]) -> None:
    x.__dict__["_own_pieces"] = (live, wrapper_version(x), [False])


def _own_record(x: MJT):
    rec = x.__dict__.get("_own_pieces")
    if rec is not None and rec[1] != wrapper_version(x):
        del x.__dict__["_own_pieces"]  # written in place since: its graph starts at the write
        return None
    return rec


def read_directly(x) -> Optional[list[Tensor]]:
    """The live pieces of ``x`` that consumers read directly (NOTE [ Pieces read directly ]): its
    gradient is theirs. None otherwise; a result whose pieces no consumer read yet is sealed (its
    consumers read through its node from now on)."""
    if not isinstance(x, MJT):
        return None
    rec = _own_record(x)
    if rec is None:
        return None
    if not rec[2][0]:
        del x.__dict__["_own_pieces"]
        return None
    return rec[0]


def gradient_from(x: MJT, live: list[Tensor], grads) -> Optional[MJT]:
    """``x``'s gradient from the gradients ``grads`` of its live pieces ``live`` (zeros for a piece
    that got none; None when none did), holding them as pieces."""
    return _gradient_maker(x, live)(grads)


def _gradient_maker(x: MJT, live: list[Tensor]) -> Callable[[list], Optional[MJT]]:
    """``gradient_from`` bound to ``x``'s structure only (a hook must not hold ``x``: the pieces
    hold the hook)."""
    partition, ragged_dims, c, device = x._partition, x._ragged_dims, x._size[1], x.device
    shapes = [(p.shape, p.dtype) for p in live]

    def make(grads) -> Optional[MJT]:
        grads = list(grads)
        if all(g is None for g in grads):
            return None
        grads = [torch.zeros(s, dtype=d, device=device) if g is None else g for g, (s, d) in zip(grads, shapes)]
        it = iter(grads)
        full = [None if h * w == 0 else next(it) for h, w in image_sizes(partition)]
        return from_pieces(full, partition, ragged_dims, c, grads[0].dtype, device)

    return make


def register_hook(x: MJT, live: list[Tensor], hook) -> Any:
    """``x.register_hook(hook)`` for ``x`` read directly: ``hook`` is called with the whole
    gradient once every piece's is computed (``register_multi_grad_hook``)."""
    make = _gradient_maker(x, live)

    def on_pieces(grads) -> None:
        g = make(grads)
        r = None if g is None else hook(g)
        if r is not None and r is not g:
            raise RuntimeError(
                "register_hook(): this multi_jagged tensor holds its images one by one and other ops "
                "already read them, so a hook can see its gradient but not replace it; register the "
                "hook before the tensor is used (or return None from it)"
            )

    return torch.autograd.graph.register_multi_grad_hook(live, on_pieces)


def split(x: MJT) -> list[Optional[Tensor]]:
    """``x``'s images as ``(1, C, hᵢ, wᵢ)`` tensors (``None`` without pixels), carrying ``x``'s
    gradient: its pieces when it holds them, else views of its pixel rows."""
    if holds_pieces(x):
        rec = x.__dict__["_pieces"]
        pieces = rec[0]
        if not torch.is_grad_enabled() or not wrapper_requires_grad(x):
            return [None if p is None else p.detach() for p in pieces]
        own = _own_record(x)
        if own is not None:
            own[2][0] = True  # NOTE [ Pieces read directly ]
            return list(pieces)
        if len(rec) == 3:
            return rec[2]  # every consumer shares one node: the engine sums their gradients per piece
        it = iter(_PiecesOf.apply(x, [p for p in pieces if p is not None]))
        out = [None if p is None else next(it) for p in pieces]
        x.__dict__["_pieces"] = (pieces, rec[1], out)
        return out
    v = values_of(x) if (torch.is_grad_enabled() and wrapper_requires_grad(x)) else x._values
    sizes = image_sizes(x._partition)
    c = v.shape[1]
    out: list[Optional[Tensor]] = []
    for r, (h, w) in zip(v.split([h * w for h, w in sizes]), sizes):
        out.append(None if h * w == 0 else r.view(1, h, w, c).permute(0, 3, 1, 2))
    return out


def _wrapper(partition: Partition, ragged_dims: tuple[int, ...], channels: int, dtype: torch.dtype,
             device: torch.device, lead_major: bool = False) -> MJT:
    """A wrapper of pixel rows ``(P, channels)`` built as ``MultiJaggedTensor.__new__`` builds one,
    but without values: the caller stores its pieces, which the first read of ``_values`` packs."""
    def geometry():
        standin = (torch.empty((channels, partition.rows), device="meta").T if lead_major
                   else torch.empty((partition.rows, channels), device="meta"))
        return partition.logical_size_stride(standin, ragged_dims)

    if _eager():  # NOTE [ Building a wrapper ] in wrappers.py
        key = ("pieces_wrapper", ragged_dims, channels, dtype, device, torch.is_inference_mode_enabled(), lead_major)
        r, size, stride = _built(MJT, partition, key, geometry, dtype, device, False)
    else:
        size, stride, stored = geometry()
        with _DisableTF():
            r = _new_wrapper(MJT, size, stored, dtype, device, False)
    r._partition, r._ragged_dims, r._size, r._strides = partition, ragged_dims, size, stride
    return r


def from_pieces(pieces: list[Optional[Tensor]], partition: Partition, ragged_dims: tuple[int, ...], channels: int,
                dtype: torch.dtype, device: torch.device, lead_major: bool = False) -> MJT:
    """The wrapper of per-image pieces ``(1, C, hᵢ, wᵢ)`` (``None`` for an image without pixels)
    with ``partition``; differentiable with respect to every piece."""
    y = _wrapper(partition, ragged_dims, channels, dtype, device, lead_major)
    live = [p for p in pieces if p is not None]
    y.__dict__["_pieces"] = (pieces, None)
    own = False
    if torch.is_grad_enabled() and any(p.requires_grad for p in live):
        y = (_AdoptPieces.apply if _functorch() else _apply_adopt_pieces)([y], *live)
        own = all(p.requires_grad for p in live)
    y.__dict__["_pieces"] = (pieces, wrapper_version(y))
    if own:
        _own(y, live)
    return y


def in_size_order(fn: Callable[[int], Optional[Tensor]], parts: list[Optional[Tensor]], *,
                  largest_last: bool) -> list[Optional[Tensor]]:
    """``[fn(i) for i in range(len(parts))]``, called in order of ``parts[i]``'s size (increasing
    with ``largest_last``, else decreasing).

    The order sets the peak memory of the backward. The engine runs the most recently recorded
    of the ready nodes first, so an op's per-image backwards run in the reverse of this order,
    all of them before the previous op's (layer by layer, where a loop goes sample by sample).
    A convolution's or pooling's backward allocates more than it frees (its input's gradient, and
    transients a few times its image): the largest image's should run first, while the fewest of
    the op's input gradients are live (``largest_last``). An elementwise op's or a norm's backward
    frees about what it allocates (its output's gradient and what it saved): the smallest should
    run first, so that the largest allocates after they freed theirs. On the benchmarks' skewed
    GroupNorm CNN (B = 16) the two orders took the peak from 1.25× to 1.1× the loop's."""
    order = sorted(range(len(parts)), key=lambda i: 0 if parts[i] is None else parts[i].numel(),
                   reverse=not largest_last)
    out: list[Optional[Tensor]] = [None] * len(parts)
    for i in order:
        out[i] = fn(i)
    return out


def map_pieces(fn: Callable[[Tensor], Tensor], x: MJT, channels: Optional[int] = None) -> MJT:
    """``fn`` on each image of ``x`` (pieces in, pieces out; the structure kept)."""
    ps = split(x)
    out = in_size_order(lambda i: None if ps[i] is None else fn(ps[i]), ps, largest_last=False)
    if any(p is not None for p in ps) and all(o is p for o, p in zip(out, ps)):
        return x  # ``fn`` returned every image itself (``dropout`` in eval): so does the op, as dense
    live = [p for p in out if p is not None]
    c = live[0].shape[1] if live else (channels if channels is not None else x.shape[1])
    dtype = live[0].dtype if live else x.dtype
    return from_pieces(out, x._partition, x._ragged_dims, c, dtype, x.device, lead_major(x))


def zip_pieces(fn: Callable[[Tensor, Tensor], Tensor], a: MJT, b: MJT) -> MJT:
    """``fn`` on each pair of images of ``a`` and ``b`` (one partition)."""
    ps, qs = split(a), split(b)
    out = in_size_order(lambda i: None if ps[i] is None else fn(ps[i], qs[i]), ps, largest_last=False)
    live = [p for p in out if p is not None]
    dtype = live[0].dtype if live else torch.promote_types(a.dtype, b.dtype)
    held = a if holds_pieces(a) else b
    return from_pieces(out, a._partition, a._ragged_dims, live[0].shape[1] if live else a.shape[1], dtype, a.device,
                       lead_major(held))


class _Rewrite(torch.autograd.Function):
    """``x`` rewritten in place with new pieces: its history rebased onto them (``mark_dirty``)."""

    @staticmethod
    def forward(ctx, x: MJT, *live):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.mark_dirty(x)
        ctx.n_live = len(live)
        ctx.planar = _planar(live)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return (None,) * (1 + ctx.n_live)
        return (None, *_grads_as(grad, ctx.planar))


def rewrite(fn: Callable[[Tensor], Tensor], x: MJT) -> MJT:
    """``x`` after an in-place elementwise op (``relu_``, ``F.relu(…, inplace=True)``): ``fn`` on
    each image, out of place — the old pieces may be saved for a backward, and stay as they were —
    then ``x`` holds the new ones, with its history rebased onto them as an in-place op's (a leaf
    that requires grad refuses, as dense). The same object is returned."""
    ps = split(x)
    return _rewritten(x, in_size_order(lambda i: None if ps[i] is None else fn(ps[i]), ps, largest_last=False))


def rewrite_with(fn: Callable[[Tensor, Tensor], Tensor], x: MJT, other: MJT) -> MJT:
    """``x`` after an in-place op with ``other`` (``out += identity``; one partition, both holding
    pieces): ``fn`` on each pair of images, as ``rewrite``."""
    ps, qs = split(x), split(other)
    return _rewritten(x, in_size_order(lambda i: None if ps[i] is None else fn(ps[i], qs[i]), ps, largest_last=False))


def _rewritten(x: MJT, out: list[Optional[Tensor]]) -> MJT:
    live = [p for p in out if p is not None]
    own = False
    if torch.is_grad_enabled() and (wrapper_requires_grad(x) or any(p.requires_grad for p in live)):
        x = _Rewrite.apply(x, *live)
        own = bool(live) and all(p.requires_grad for p in live)
    elif not x.is_inference():
        torch.autograd.graph.increment_version(x)
    x.__dict__["_pieces"] = (out, wrapper_version(x))
    if own:
        _own(x, live)
    return x


def reduce_images(kind: str, x: MJT, keepdim: bool, dtype: Optional[torch.dtype]) -> Tensor:
    """``x.sum`` / ``x.mean`` over both spatial dims: dense ``(B, C)`` (``(B, C, 1, 1)`` with
    ``keepdim``), each image's own reduction (an image without pixels: 0 / NaN, as dense)."""
    fn = torch.sum if kind == "sum" else torch.mean
    c = x._size[1]
    parts = split(x)
    live = [p for p in parts if p is not None]
    out_dtype = dtype if dtype is not None else live[0].dtype if live else x.dtype
    rows = []
    for p in parts:
        if p is None:
            rows.append(torch.full((1, c, 1, 1), 0.0 if kind == "sum" else float("nan"), dtype=out_dtype, device=x.device))
        else:
            rows.append(_image_mean(p, dtype) if kind == "mean" else fn(p, (2, 3), keepdim=True, dtype=dtype))
    out = torch.cat(rows) if rows else torch.empty((0, c, 1, 1), dtype=out_dtype, device=x.device)
    return out if keepdim else out.flatten(1)


def reduce_all(kind: str, x: MJT, dtype: Optional[torch.dtype]) -> Tensor:
    """``x.sum()`` / ``x.mean()`` over every element: the images' own sums, added (0 / NaN without
    a pixel, as dense). Each piece's gradient is then its own expanded scalar, as the loop's."""
    parts = [p for p in split(x) if p is not None]
    out_dtype = dtype if dtype is not None else x.dtype
    if not parts:
        return torch.full((), float("nan") if kind == "mean" else 0.0, dtype=out_dtype, device=x.device)
    # half and bfloat16 accumulate in float32, as dense's reduction does (per-sample sums in half
    # overflowed where the mean does not)
    acc = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    total = torch.stack([p.sum(dtype=acc) for p in parts]).sum()
    return (total if kind == "sum" else total / sum(p.numel() for p in parts)).to(out_dtype)


def _image_mean(p: Tensor, dtype: Optional[torch.dtype]) -> Tensor:
    """``p.mean((2, 3), keepdim=True)``; in float32 / float64 as the sum divided by the pixel count,
    which is what aten's CPU mean computes (bit for bit), but whose backward is an expanded view
    of one ``(1, C, 1, 1)`` gradient instead of a new gradient the size of the image: the engine
    runs every image's pooling backward before the first convolution's, so those gradients would
    all be live at once (+8 % of the skewed GroupNorm CNN's peak)."""
    if p.dtype in (torch.float32, torch.float64) and dtype in (None, p.dtype):
        return p.sum((2, 3), keepdim=True) / (p.shape[2] * p.shape[3])
    return p.mean((2, 3), keepdim=True, dtype=dtype)
