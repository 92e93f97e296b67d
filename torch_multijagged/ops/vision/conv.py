"""Convolution, transposed convolution and pooling over ragged spatial dims.

Images ``(B, C, j0, j1)`` and signals ``(B, C, j0)`` (channels first, as torchvision code writes
them; any spatial dim may also be static, e.g. ``(B, C, 32, j0)`` for text lines of one height):
``conv1d``/``conv2d`` (any kernel, stride, padding including ``"same"``, dilation, groups, bias),
``conv_transpose1d``/``conv_transpose2d``, ``max_pool2d`` (``return_indices`` too) and
``avg_pool2d``, per sample equal to the dense op on each image. They run as one dense op over a
canvas that holds every image (NOTE [ Canvas ] in ``kernels/canvas.py``), except where running
the dense op on each sample's view of the packed rows measured faster (``per_sample.py``; the
rules in ``kernels/per_image.py``): 2-d convolutions of large images with enough input channels
(NOTE [ Convolutions image by image ]), 2-d max and average pooling of few or large images
(NOTE [ Pooling image by image ]) and 1-d convolutions of few or long signals (NOTE
[ Convolutions of signals sample by sample ]).
Volumes ``(B, C, j0, j1, j2)``: ``conv3d``, ``conv_transpose3d``, ``max_pool3d`` (``return_indices``
too), ``avg_pool3d`` run volume by volume (one dense call each on a view of its voxel rows; a 3-d
canvas would be mostly gutter), the outputs packed back as voxel rows.

Extents. An op whose window keeps a size (stride-1 ``"same"`` convs) keeps that dim's nested int;
one that changes sizes gives the dim a new extent, ``structure.mapped_extent`` keyed by the size
rule (``Window.rule``), so two ops of one rule on one extent — a strided conv and a pooling of
the same geometry, the two branches of a ResNet downsampling block — give the same nested int and
can be added. Sample sizes follow dense torch (``kernels.canvas.output_sizes``: an image smaller
than the window raises naming the sample; an empty image gives an empty output).

Autograd is dense autograd on the packed values (the canvas copy in, the dense op, the gather
out), so every order of gradients works. New extents are built from host sizes, so these ops run
eagerly; under ``torch.compile`` stride-1 convolutions that keep every size go through
``multijagged::spatial_conv`` (``compile/spatial.py``), and the rest raise naming the op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import pieces
from ...bridge import values_of, wrap_values
from .. import bridged
from ...compile import spatial as csp
from ...errors import StructureError
from ...kernels import canvas as cv
from ...kernels import per_image as pim
from ...structure import flat_extent, mapped_extent, partition_for
from . import per_sample
from .._table import register_multi_jagged_func
from .._common import MJT, autocast_lower, component_rows, describe, eager_route, equal_sizes, wrap
from .._routing import _needs_grad, route

mj = torch.ops.multijagged

__all__ = ["is_ragged_spatial", "as_spatial", "channels_first", "conv", "conv_transpose", "pool", "unfold"]


def is_ragged_spatial(x, nspatial: int) -> bool:
    """Components ``(C, *spatial)``: some spatial dim ragged, or dim 1 the only ragged one (how
    ``nested_tensor`` lays out images that all have one size; ``as_spatial``)."""
    return isinstance(x, MJT) and x.dim() == nspatial + 2 and bool(x._ragged_dims) and (
        max(x._ragged_dims) >= 2 or x._ragged_dims == (1,)
    )


def as_spatial(op: str, x: MJT, nspatial: int) -> MJT:
    """``x`` with its spatial dims ragged. Images of one size make ``nested_tensor`` (as
    ``torch.jagged``) call dim 1 ragged: ``(B, j0, H, W)``. When every sample has the same size
    there, it is the channel dim, and ``x`` is relaid as ``(B, C, j1, j2)`` (constant extents,
    one nested int for equal sides); a dim 1 that truly varies is a ragged channel dim, an error."""
    if x._ragged_dims != (1,):
        return x
    host = x._partition.extents[0].host_lengths()
    if host.numel() and not bool((host == host[0]).all()):
        raise StructureError(
            f"{op}(): expected a static channel dim (dim 1) in {describe(x)}, but its sizes differ across the "
            f"batch ({host.tolist()}) for layout torch.multi_jagged; channels must have one size"
        )
    b, c = x._partition.batch, int(host[0]) if host.numel() else 0
    spatial = [int(n) for n in x.shape[2:]]
    grad = _needs_grad(x)
    v = values_of(x) if grad else x._values
    rows = v.reshape(b, c, *spatial).movedim(1, -1).reshape(-1, c)
    by_size: dict[int, object] = {}
    for n in spatial:
        if n not in by_size:
            by_size[n] = equal_sizes(x, n)
    part = partition_for([by_size[n] for n in spatial])
    dims = tuple(range(2, 2 + nspatial))
    return wrap_values(rows, part, dims) if grad else wrap(rows, part, dims)


def channels_first(op: str, x):
    """``x`` with dim 1 read as channels where images of one size made ``nested_tensor`` call it
    ragged (``as_spatial``); anything else as it is."""
    if isinstance(x, MJT) and x._ragged_dims == (1,) and x.dim() >= 3:
        return as_spatial(op, x, x.dim() - 2)
    return x


def _check_layout(op: str, x: MJT, nspatial: int, weight=None) -> None:
    if 1 in x._ragged_dims and x._ragged_dims != (1,):
        raise StructureError(
            f"{op}(): expected a static channel dim (dim 1) in {describe(x)}, but it is ragged for layout "
            "torch.multi_jagged; channels must have one size across the batch"
        )
    if x.dim() != nspatial + 2:
        raise ValueError(
            f"{op}(): expected a ({'B, C, ' + ', '.join(['L'] * nspatial)}) input with {nspatial} spatial dim"
            f"{'s' if nspatial > 1 else ''}, got {describe(x)}"
        )
    if weight is not None and (not isinstance(weight, torch.Tensor) or isinstance(weight, MJT) or weight.dim() != nspatial + 2):
        got = f"{weight.dim()}-D" if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(
            f"{op}(): expected a dense {nspatial + 2}-D weight for the input {describe(x)} ({nspatial} spatial dim"
            f"{'s' if nspatial > 1 else ''}), got {got}"
        )


def _tuple(op: str, v, n: int, name: str) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            v = tuple(v) * n
        if len(v) != n:
            raise ValueError(f"{op}(): expected {name} to be an int or {n} ints, got {v}")
        return tuple(int(a) for a in v)
    return (int(v),) * n


# ----------------------------------------------------------------------------- pixel rows
def _canonical(x: MJT, nspatial: int) -> bool:
    """Values are the pixel rows ``(P, C)`` themselves: every spatial dim ragged, in order."""
    return x._ragged_dims == tuple(range(2, 2 + nspatial))


def _element_pixels(partition, ragged_dims, static: dict, nspatial: int, sizes: torch.Tensor) -> torch.Tensor:
    """For values ``(T, C, *static spatial)`` read as elements ``(T·Q, C)`` (channels moved
    last), each element's pixel row: sample-major, row-major over the spatial dims."""
    dev = partition.offsets.device
    sample, coords = partition.row_coords()
    t_rows = sample.shape[0]
    qs = [static[d] for d in range(2, 2 + nspatial) if d in static]
    q = math.prod(qs)
    t = torch.arange(t_rows, device=dev).repeat_interleave(q)
    qi = torch.arange(q, device=dev).repeat(t_rows)
    s = sample[t]
    sz = sizes.to(dev)
    comp = []
    rem = qi
    static_coords = {}
    for d in reversed([d for d in range(2, 2 + nspatial) if d in static]):
        static_coords[d] = rem % static[d]
        rem = torch.div(rem, static[d], rounding_mode="floor")
    for d in range(2, 2 + nspatial):
        comp.append(coords[t, ragged_dims.index(d)] if d in ragged_dims else static_coords[d])
    counts = sz.prod(1)
    poff = torch.cumsum(counts, 0) - counts
    pix = comp[0]
    for a in range(1, nspatial):
        pix = pix * sz[s, a] + comp[a]
    return poff[s] + pix


def _pixel_rows(x: MJT, v: torch.Tensor, nspatial: int, sizes: torch.Tensor) -> torch.Tensor:
    """``(P, C)`` pixel rows of ``x`` (values ``v``, differentiable)."""
    if _canonical(x, nspatial):
        return v
    static = {d: int(x.shape[d]) for d in range(2, 2 + nspatial) if d not in x._ragged_dims}
    key = ("pixel_rows", x._ragged_dims, tuple(sorted(static.items())), nspatial)
    inv = x._partition.derived(key, lambda p: torch.argsort(_element_pixels(p, x._ragged_dims, static, nspatial, sizes)))
    return v.movedim(1, -1).reshape(-1, v.shape[1]).index_select(0, inv)


def _wrap_pixels(x: MJT, rows: torch.Tensor, out_sizes: torch.Tensor, windows, nspatial: int, grad: bool) -> MJT:
    """The output tensor of pixel rows ``rows (P', C')``: each ragged spatial dim gets the
    extent its window's rule maps it to (``mapped_extent``), each static one its new size."""
    part = per_sample.mapped_partition(x, windows)
    if _canonical(x, nspatial):
        return wrap_values(rows, part, x._ragged_dims) if grad else wrap(rows, part, x._ragged_dims)
    static = {d: int(out_sizes[0, d - 2]) if out_sizes.shape[0] else 0 for d in range(2, 2 + nspatial) if d not in x._ragged_dims}
    key = ("pixel_rows_out", x._ragged_dims, tuple(sorted(static.items())), nspatial)
    fwd = part.derived(key, lambda q: _element_pixels(q, x._ragged_dims, static, nspatial, out_sizes))
    c = rows.shape[1]
    vals = rows.index_select(0, fwd).view(part.rows, *[static[d] for d in sorted(static)], c).movedim(-1, 1).contiguous()
    return wrap_values(vals, part, x._ragged_dims) if grad else wrap(vals, part, x._ragged_dims)


_WHY = (
    "{op}(): a window that changes the per-sample sizes of a ragged spatial dim makes a new extent from host sizes, "
    "which torch.compile cannot trace for layout torch.multi_jagged: a graph break (stride-1 convolutions "
    "that keep every size compile)"
)


def _plan(op: str, x: MJT, windows, nspatial: int):
    # the static spatial sizes too: one partition serves every width of a static dim
    # (``x`` and ``x[..., :1]`` of a ragged height), and each needs its own canvas
    static = tuple(x._size[d] for d in range(2, 2 + nspatial) if d not in x._ragged_dims)

    def sizes_of(p):  # raises where dense torch does, naming ``op`` (a failure is not cached)
        sizes = per_sample.spatial_sizes(x, nspatial)
        return sizes, cv.output_sizes(op, sizes, windows)

    sizes, out_sizes = x._partition.derived(("canvas_sizes", nspatial, tuple(windows), x._ragged_dims, static),
                                            sizes_of)
    key = ("canvas", nspatial, tuple(windows), x._ragged_dims, static)
    plan = x._partition.derived(key, lambda p: cv.plan_canvas(sizes, windows, x._values.device))
    return sizes, out_sizes, plan


def _run(op: str, x: MJT, windows, nspatial: int, fill: float, dense, rows_op=None):
    """Pixel rows → canvas → ``dense(canvas)`` → output pixel rows → tensor (or ``rows_op(rows,
    plan)`` doing all of it)."""
    sizes, out_sizes, plan = _plan(op, x, windows, nspatial)
    grad = _needs_grad(x)
    v = values_of(x) if grad else x._values
    rows = _pixel_rows(x, v, nspatial, sizes)
    extra = None
    if rows_op is not None:
        res = rows_op(rows, plan)
    else:
        out = dense(cv.to_canvas(rows, plan, fill), plan)
        if isinstance(out, tuple):
            out, extra = out
        res = cv.from_canvas(out, plan)
    grad = grad or res.requires_grad
    return _wrap_pixels(x, res, out_sizes, windows, nspatial, grad), plan, out_sizes, extra


# ----------------------------------------------------------------------------- convolutions


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _traced_conv(op, nspatial, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> bool:
    """Whether the compiled path takes this conv: size-keeping, pixel rows as values."""
    if not (_canonical(input, nspatial) and isinstance(weight, torch.Tensor) and weight.dim() == nspatial + 2):
        return False
    if padding == "same":
        return all(int(a) == 1 for a in _tuple(op, stride, nspatial, "stride"))
    if isinstance(padding, str):
        return False
    k, d = tuple(weight.shape[2:]), _tuple(op, dilation, nspatial, "dilation")
    p = _tuple(op, padding, nspatial, "padding")
    return csp.keeps_sizes(k, _tuple(op, stride, nspatial, "stride"), [(a, a) for a in p], d)


@eager_route(_WHY, traceable=_traced_conv)
def conv(op: str, nspatial: int, input: MJT, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    _check_layout(op, input, nspatial, weight)
    input = as_spatial(op, input, nspatial)
    c = int(input.shape[1])
    if weight.shape[1] * groups != c:
        raise ValueError(
            f"{op}(): expected an input with {weight.shape[1] * groups} channels (weight of shape "
            f"{tuple(weight.shape)}, groups={groups}), got {c} channels in {describe(input)}"
        )
    k = tuple(weight.shape[2:])
    s = _tuple(op, stride, nspatial, "stride")
    d = _tuple(op, dilation, nspatial, "dilation")
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nspatial
        elif padding == "same":
            if any(a != 1 for a in s):
                raise ValueError(f"{op}(): padding='same' is not supported for strided convolutions")
            pads = [(dd * (kk - 1) // 2, dd * (kk - 1) - dd * (kk - 1) // 2) for kk, dd in zip(k, d)]
        else:
            raise ValueError(f"{op}(): invalid padding string {padding!r}, should be one of ('valid', 'same')")
    else:
        pads = [(a, a) for a in _tuple(op, padding, nspatial, "padding")]
    windows = tuple(cv.Window(kk, ss, pl, pr, dd) for kk, ss, (pl, pr), dd in zip(k, s, pads, d))
    if torch.compiler.is_compiling() and _canonical(input, nspatial) and csp.keeps_sizes(k, s, pads, d):
        return mj.spatial_conv(input, weight, bias, [a for pr in pads for a in pr], list(d), groups)
    if nspatial == 3:
        return _per_volume(op, input, windows, weight.shape[0],
                           lambda v: cv.onednn_safe_conv(F.pad(v, [a for pr in reversed(pads) for a in pr]), weight, bias, s,
                                                         (0, 0, 0), d, groups))
    fn = _CONV[nspatial]
    pad_canvas = tuple(pl for pl, _ in pads)
    if nspatial == 2 and _canonical(input, 2) and all(pl == pr for pl, pr in pads):
        if pim.per_image_applies(pieces.image_sizes(input._partition), c, pieces.holds_pieces(input)) or (
                pim.thin_per_image_applies(c, weight.shape[0], per_sample.window_out_sizes(op, input, windows))):
            # large images (or a thin input whose output images are): the dense op per image on
            # views of the rows (NOTE [ Convolutions image by image ] in kernels/per_image.py)
            return per_sample.conv_per_image(op, input, windows, weight, bias, s, pad_canvas, d, groups)
    if (nspatial == 1 and _canonical(input, 1) and pads[0][0] == pads[0][1] and input._values.numel()
            and pim.signals_per_sample_applies(per_sample.sample_lengths(input), c * weight.shape[0] * k[0] // groups)):
        # signals few or long enough: the dense conv on each (NOTE [ Convolutions of signals
        # sample by sample ] in kernels/per_image.py)
        return per_sample.conv1d_per_sample(op, input, windows, weight, bias, s[0], pads[0][0], d[0], groups)
    if (nspatial == 2 and len(input._ragged_dims) == 1 and input._partition.batch <= ONE_RAGGED_SIDE_PER_SAMPLE_UP_TO
            and not torch.compiler.is_compiling() and input._values.numel()):
        # one ragged side, the other static (a spectrogram (B, C, T, F)): the dense conv per sample
        return _conv_one_ragged_side(op, input, windows, weight, bias, s, pads, d, groups)
    # oneDNN's forward, a backward of per-tap GEMMs (NOTE [ Conv backward on the canvas ])
    if not cv.canvas_conv_applies(input._values, weight, groups):
        out, *_ = _run(op, input, windows, nspatial, 0.0,
                       lambda canvas, plan: fn(canvas, weight, bias, s, pad_canvas, d, groups), None)
        return out
    device = input.device.type
    if torch.is_autocast_enabled(device) and input.is_floating_point():
        # dense autocast runs a conv in its lower precision: cast here (differentiable: the
        # gradients reach the leaves in their dtypes), and compute without autocast, whose casts
        # inside the rows' conv would leave its backward mixing the saved float32 rows and weight
        # with a bfloat16 gradient
        input, weight, bias = autocast_lower(input, weight, bias)
        with torch.autocast(device, enabled=False):
            return _rows_conv(op, input, windows, nspatial, fn, weight, bias, s, pad_canvas, d, groups)
    return _rows_conv(op, input, windows, nspatial, fn, weight, bias, s, pad_canvas, d, groups)


def _rows_conv(op: str, input: MJT, windows, nspatial: int, fn, weight, bias, s, pad_canvas, d, groups) -> MJT:
    out, *_ = _run(op, input, windows, nspatial, 0.0,
                   lambda canvas, plan: fn(canvas, weight, bias, s, pad_canvas, d, groups),
                   lambda rows, plan: cv.rows_conv(rows, plan, weight, bias, s, pad_canvas, d))
    return out


# NOTE [ Convolutions with one ragged side ]
#
# A 2-d batch with one ragged spatial dim and a static one — log-mel spectrograms ``(B, C, T, F)``
# under an ASR front end's stride-2 convolutions, text lines of one height ``(B, C, H, W)`` — has
# no pixel rows to put on a canvas without a gather (its values are ``(T, C, F)``: each ragged
# position holds all channels and columns). Up to ``ONE_RAGGED_SIDE_PER_SAMPLE_UP_TO`` samples, the
# dense conv runs on each sample's component (a view of its rows) and the outputs are packed back
# as rows of the mapped extent: the user's loop, plus a copy of each input and output (a sample's
# component is a permuted view of its rows) and one ``cat``. Measured (one thread, an ASR front
# end: two 3×3 stride-2 convs 1 → 8 → 8 with ReLU, F = 40, lengths 60–310; × a loop over the
# samples, forward / forward + backward): per sample 2.5 / 2.0 at B = 4, 1.7 / 1.5 at B = 16,
# 1.4 / 1.3 at B = 64 and 1.6 / 1.3 at B = 256; the canvas 4.9 / 3.5, 2.2 / 1.9, 1.6 / 1.5 and
# 1.6 / 1.5. Above the bound (not measured) the canvas stays.
ONE_RAGGED_SIDE_PER_SAMPLE_UP_TO = 256


def _conv_one_ragged_side(op: str, x: MJT, windows, weight, bias, stride, pads, dilation, groups) -> MJT:
    """The conv of each sample of a batch ``(B, C, H, W)`` with one ragged spatial dim, as dense;
    an empty sample (or one whose output is empty) has no output row."""
    rd = x._ragged_dims[0]
    static = int(x.shape[5 - rd])  # the other spatial dim's size
    # raises where dense torch does, naming the sample (a failure is not cached)
    out_sizes = x._partition.derived(("one_ragged_side_out", op, rd, static, tuple(w.rule() for w in windows)),
                                     lambda p: cv.output_sizes(op, per_sample.spatial_sizes(x, 2), windows))
    grad = _needs_grad(x)
    v = values_of(x) if grad else x._values
    symmetric = all(pl == pr for pl, pr in pads)
    flat_pad = [a for pr in reversed(pads) for a in pr]
    outs = []
    # SYNC: none — host sizes (the extents' host lengths)
    for r, n_out in zip(v.split(x._partition.extents[0].host_lengths().tolist()), out_sizes.prod(1).tolist()):
        if r.shape[0] == 0 or n_out == 0:
            continue
        comp = r.movedim(0, rd - 1).unsqueeze(0)  # (1, C, H, W): rows (n, C, W) or (n, C, H)
        if symmetric:
            out = cv.onednn_safe_conv(comp, weight, bias, stride, tuple(pl for pl, _ in pads), dilation, groups)
        else:
            out = cv.onednn_safe_conv(F.pad(comp, flat_pad), weight, bias, stride, (0, 0), dilation, groups)
        outs.append(out[0].movedim(rd - 1, 0))
    part = per_sample.mapped_partition(x, windows)
    if outs:
        res = torch.cat(outs)
    else:  # no output row: still on the input's graph
        w_out = [int(out_sizes[0, k]) if out_sizes.shape[0] else 0 for k in range(2) if k + 2 != rd]
        res = v.new_zeros(0, weight.shape[0], *w_out) + (v.sum() * 0 if grad else 0)
    grad = grad or res.requires_grad
    return wrap_values(res, part, x._ragged_dims) if grad else wrap(res, part, x._ragged_dims)


def _per_volume(op: str, x: MJT, windows, channels: int, fn, indices: bool = False):
    """``fn`` on each volume ``(1, C, d, h, w)`` (a view of its voxel rows), the outputs packed
    back as voxel rows; an empty volume (or one whose output is empty) has no output voxel. With
    ``indices``, ``fn`` returns ``(out, flat index within the volume)``, packed alike."""
    sizes = per_sample.spatial_sizes(x, 3)
    out_sizes = cv.output_sizes(op, sizes, windows)  # raises where dense torch does, naming the sample
    grad = _needs_grad(x)
    v = values_of(x) if grad else x._values
    rows = _pixel_rows(x, v, 3, sizes)
    c = rows.shape[1]
    outs, idxs = [], []
    # SYNC: none — host sizes (the extents' host lengths)
    for r, (dd, hh, ww), n_out in zip(rows.split(sizes.prod(1).tolist()), sizes.tolist(), out_sizes.prod(1).tolist()):
        if r.shape[0] == 0 or n_out == 0:
            continue
        out = fn(r.view(1, dd, hh, ww, c).permute(0, 4, 1, 2, 3))
        if indices:
            out, idx = out
            idxs.append(idx[0].permute(1, 2, 3, 0).reshape(-1, c))
        outs.append(out[0].permute(1, 2, 3, 0).reshape(-1, out.shape[1]))
    if outs:
        res = torch.cat(outs)
    else:  # no output voxel: still on the input's graph
        res = rows.new_zeros(0, channels) + (rows.sum() * 0 if grad else 0)
    out = _wrap_pixels(x, res, out_sizes, windows, 3, grad or res.requires_grad)
    if not indices:
        return out
    idx = torch.cat(idxs) if idxs else torch.zeros(0, c, dtype=torch.int64, device=rows.device)
    return out, _wrap_pixels(x, idx, out_sizes, windows, 3, False)


@eager_route(_WHY)
def conv_transpose(op: str, nspatial: int, input: MJT, weight, bias=None, stride=1, padding=0, output_padding=0,
                   groups=1, dilation=1):
    _check_layout(op, input, nspatial, weight)
    input = as_spatial(op, input, nspatial)
    c = int(input.shape[1])
    if weight.shape[0] != c:
        raise ValueError(
            f"{op}(): expected an input with {weight.shape[0]} channels (weight of shape {tuple(weight.shape)}), "
            f"got {c} channels in {describe(input)}"
        )
    k = tuple(weight.shape[2:])
    s = _tuple(op, stride, nspatial, "stride")
    p = _tuple(op, padding, nspatial, "padding")
    op_ = _tuple(op, output_padding, nspatial, "output_padding")
    d = _tuple(op, dilation, nspatial, "dilation")
    for a in range(nspatial):
        if op_[a] >= s[a] and op_[a] >= d[a]:
            raise ValueError(f"{op}(): output padding must be smaller than either stride or dilation, got {op_}")
    windows = tuple(cv.Window(k[a], s[a], p[a], p[a], d[a], transposed=True, output_padding=op_[a]) for a in range(nspatial))
    if nspatial == 3:
        return _per_volume(op, input, windows, weight.shape[1] * groups,
                           lambda v: cv.onednn_safe_conv(v, weight, bias, s, p, d, groups, True, op_))
    fn = _CONV_T[nspatial]
    out, *_ = _run(op, input, windows, nspatial, 0.0, lambda canvas, plan: fn(canvas, weight, bias, s, 0, 0, groups, d))
    return out


# ----------------------------------------------------------------------------- pooling
def _low(dtype: torch.dtype) -> float:
    return float("-inf") if dtype.is_floating_point else float(torch.iinfo(dtype).min)


@eager_route(_WHY)
def pool(op: str, nspatial: int, input: MJT, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
         return_indices=False, count_include_pad=True, divisor_override=None):
    _check_layout(op, input, nspatial)
    input = as_spatial(op, input, nspatial)
    k = _tuple(op, kernel_size, nspatial, "kernel_size")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _tuple(op, stride, nspatial, "stride")
    p = _tuple(op, padding, nspatial, "padding")
    d = _tuple(op, dilation, nspatial, "dilation")
    for a in range(nspatial):
        if p[a] > k[a] // 2:
            raise ValueError(f"{op}(): pad should be at most half of effective kernel size, but got pad={p[a]}, kernel_size={k[a]}")
        if k[a] < 1 or s[a] < 1 or d[a] < 1:
            raise ValueError(f"{op}(): kernel_size, stride and dilation must be positive, got {k}, {s}, {d}")
    windows = tuple(cv.Window(k[a], s[a], p[a], p[a], d[a], ceil_mode=bool(ceil_mode)) for a in range(nspatial))
    is_max = op.startswith("max")
    if nspatial == 3:
        c = input._size[1]
        if is_max:
            return _per_volume(op, input, windows, c, lambda v: F.max_pool3d(v, k, s, p, d, bool(ceil_mode), return_indices),
                               indices=return_indices)
        return _per_volume(op, input, windows, c,
                           lambda v: F.avg_pool3d(v, k, s, p, bool(ceil_mode), count_include_pad, divisor_override))
    if nspatial == 2 and not return_indices and pieces.holds_pieces(input):
        # images held one by one (NOTE [ Per-image pieces ]): the dense pool on each, as the loop
        if is_max:
            return per_sample.pool_pieces(op, input, windows, lambda t: F.max_pool2d(t, k, s, p, d, bool(ceil_mode)))
        return per_sample.pool_pieces(op, input, windows,
                            lambda t: F.avg_pool2d(t, k, s, p, bool(ceil_mode), count_include_pad, divisor_override))
    if nspatial == 2 and _canonical(input, 2) and pim.pool_per_image_applies(pieces.image_sizes(input._partition),
                                                                             input._size[1]):
        # the dense pool on each image's view of the rows, the outputs packed as rows (NOTE
        # [ Pooling image by image ] in kernels/per_image.py)
        if is_max:
            return per_sample.pool_per_image(op, input, windows, lambda t: F.max_pool2d(t, k, s, p, d, bool(ceil_mode), return_indices),
                                   return_indices)
        return per_sample.pool_per_image(op, input, windows,
                               lambda t: F.avg_pool2d(t, k, s, p, bool(ceil_mode), count_include_pad, divisor_override), False)
    if is_max:
        fn = F.max_pool2d if nspatial == 2 else F.max_pool1d

        def dense(canvas, plan):
            return fn(canvas, k, s, p, d, False, return_indices)

        low = _low(input.dtype)
        out, plan, out_sizes, idx = _run(op, input, windows, nspatial, low, dense)
        # SYNC: one read — whether any window holds only the lowest value. There the canvas
        # kernel may keep a gutter cell as the index (and the gradient); such a batch runs again
        # by ``max_pool2d_rows``, which maps those windows into their images and reads the values
        # from the pixel rows. Autograd through the canvas kernel is 2× faster where it is right.
        if nspatial == 2 and bool((out._values == low).any()):
            return _max_pool2d_by_rows(op, input, windows, low, return_indices)
        if not return_indices:
            return out
        local = cv.local_index(cv.from_canvas(idx, plan), plan)
        return out, _wrap_pixels(input, local, out_sizes, windows, nspatial, False)

    def dense(canvas, plan):
        if nspatial == 2:
            return F.avg_pool2d(canvas, k, s, p, False, True, 1)
        return F.avg_pool1d(canvas, k[0], s[0], p[0], False, True) * k[0]

    out, plan, out_sizes, _ = _run(op, input, windows, nspatial, 0.0, dense)
    div = cv.avg_divisor(plan, windows, count_include_pad, divisor_override, out.dtype, out.device)
    return _divide(out, div, input, windows, nspatial, out_sizes)


def _max_pool2d_by_rows(op: str, x: MJT, windows, low: float, return_indices: bool):
    """2-d max pooling by ``canvas.max_pool2d_rows``: dense's indices and gradient also for a
    window that holds only the lowest value (``-inf`` masks)."""
    found = []

    def rows_op(rows, plan):
        res, local = cv.max_pool2d_rows(rows, plan, windows, low, return_indices)
        found.append(local)
        return res

    out, _, out_sizes, _ = _run(op, x, windows, 2, low, None, rows_op)
    return (out, _wrap_pixels(x, found[0], out_sizes, windows, 2, False)) if return_indices else out


def _divide(out: MJT, div: torch.Tensor, input: MJT, windows, nspatial: int, out_sizes) -> MJT:
    """``out / div`` with ``div`` given per output pixel row (sample-major, row-major); integers
    divide truncating, as dense average pooling of int64 (an int64 result)."""
    d = _wrap_pixels(input, div, out_sizes, windows, nspatial, False)
    return out / d if out.is_floating_point() or out.is_complex() else torch.div(out, d, rounding_mode="trunc")


@register_multi_jagged_func(
    mj.spatial_conv.default, "x: mjt, weight: t, bias: t?, padding: any, dilation: any, groups: any"
)
def spatial_conv_default(func, x, weight, bias, padding, dilation, groups):
    out = mj.spatial_conv_rows(x._values, x._partition.device_sizes(), weight, bias, padding, dilation, groups)
    return wrap(out, x._partition, x._ragged_dims)


@register_multi_jagged_func(
    mj.spatial_conv_param_grads.default,
    "grad: mjt, x: mjt, weight: t, padding: any, dilation: any, groups: any, need_weight: any, need_bias: any",
)
def spatial_conv_param_grads_default(func, grad, x, weight, padding, dilation, groups, need_weight, need_bias):
    return mj.spatial_conv_rows_param_grads(
        grad._values, x._values, x._partition.device_sizes(), weight, padding, dilation, groups, need_weight, need_bias
    )


# ----------------------------------------------------------------------------- unfold (patches)
@eager_route(_WHY)
def unfold(op: str, input: MJT, kernel_size, dilation=1, padding=0, stride=1):
    """``F.unfold`` of images ``(B, C, j0, j1)``: ``(B, C·kh·kw, j_t)``, each image's patches as
    dense ``F.unfold`` lays them out (channel-major, then kernel position; patches row-major), the
    token extent the flatten of the output grid's extents (``structure.flat_extent``), so it is the
    extent ``conv2d(…, stride=…).flatten(2)`` of the same geometry gives."""
    _check_layout(op, input, 2)
    input = as_spatial(op, input, 2)
    k = _tuple(op, kernel_size, 2, "kernel_size")
    d = _tuple(op, dilation, 2, "dilation")
    p = _tuple(op, padding, 2, "padding")
    s = _tuple(op, stride, 2, "stride")
    windows = tuple(cv.Window(k[a], s[a], p[a], p[a], d[a]) for a in range(2))

    def dense(canvas, plan):
        cols = F.unfold(canvas, k, d, p, s)  # (pages, C·k², L)
        return cols.view(cols.shape[0], cols.shape[1], *plan.out_shape)

    grid, *_ = _run(op, input, windows, 2, 0.0, dense)
    if grid._ragged_dims == (2,):
        # a static width (ConvBERT's (B, C, j0, 1)): each row of windows is w' consecutive
        # patches, so the patches row-major are the grid's values with the width moved inside
        # the row; one patch per row keeps the grid's extent (the input's, for a size-keeping window)
        w = grid._size[3]
        ext = grid._partition.extents[0]
        if w != 1:
            ext = mapped_extent(ext, ("patches_per_row", w), lambda n, w=w: n * w)
        grad = _needs_grad(grid)
        v = values_of(grid) if grad else grid._values
        v = v.movedim(2, 1).reshape(-1, v.shape[1])
        tokens = partition_for([ext])
        return wrap_values(v, tokens, (2,)) if grad else wrap(v, tokens, (2,))
    if grid._ragged_dims != (2, 3):
        raise StructureError(
            f"{op}(): expected both spatial dims ragged, or a ragged height and a static width, got {describe(input)}"
        )
    tokens = partition_for([flat_extent(grid._partition)])
    if _needs_grad(grid):
        return wrap_values(values_of(grid), tokens, (2,))
    return wrap(grid._values, tokens, (2,))


# ----------------------------------------------------------------------------- routes
@route(F.unfold)
def _unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    if not is_ragged_spatial(input, 2):
        return NotImplemented
    return unfold("unfold", input, kernel_size, dilation, padding, stride)


def _conv_t_route(n: int):
    name = f"conv_transpose{n}d"

    def routed(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        if not is_ragged_spatial(input, n):
            return NotImplemented
        return conv_transpose(name, n, input, weight, bias, stride, padding, output_padding, groups, dilation)

    return routed


for _n in (1, 2, 3):
    route(_CONV_T[_n])(_conv_t_route(_n))


def _max_pool_route(nsp: int, always_indices: bool):
    op = f"max_pool{nsp}d"

    def routed(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if not is_ragged_spatial(input, nsp):
            return NotImplemented
        return pool(op, nsp, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices or always_indices)

    return routed


def _avg_pool_route(nsp: int):
    op = f"avg_pool{nsp}d"

    def routed(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        if not is_ragged_spatial(input, nsp):
            return NotImplemented
        return pool(op, nsp, input, kernel_size, stride, padding, 1, ceil_mode, False, count_include_pad, divisor_override)

    return routed


route(F.max_pool2d, torch.max_pool2d)(_max_pool_route(2, False))
route(F.max_pool2d_with_indices)(_max_pool_route(2, True))
route(F.max_pool3d, torch.max_pool3d)(_max_pool_route(3, False))
route(F.max_pool3d_with_indices)(_max_pool_route(3, True))
route(F.avg_pool2d)(_avg_pool_route(2))
route(F.avg_pool3d)(_avg_pool_route(3))


@eager_route(_WHY)
def _fractional(op: str, nsp: int, input: MJT, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                _random_samples=None):
    """``fractional_max_pool2d/3d``: dense torch's kernel on each image with that image's random
    samples (``_random_samples[i]``; drawn ``(B, C, nsp)`` at once when not given, as the dense
    call draws them). ``output_size`` gives a dense ``(B, C, *output_size)``; ``output_ratio``
    gives each image ``int(n · ratio)`` per side (a new extent per ragged side, by rule)."""
    _check_layout(op, input, nsp)
    x = as_spatial(op, input, nsp)
    if output_size is None and output_ratio is None:
        raise ValueError(f"{op} requires specifying either an output_size or an output_ratio")
    b, c = x._partition.batch, int(x._size[1])
    samples = _random_samples
    if samples is None:
        samples = torch.rand(b, c, nsp, dtype=x.dtype, device=x.device)
    elif samples.dim() != 3 or samples.shape[0] != b:
        raise ValueError(f"{op}(): expected _random_samples of shape ({b}, {c}, {nsp}), got {tuple(samples.shape)}")
    k = _tuple(op, kernel_size, nsp, "kernel_size")
    sizes = per_sample.spatial_sizes(x, nsp)
    if output_size is not None:
        fixed = _tuple(op, output_size, nsp, "output_size")
        out = torch.tensor(fixed, dtype=torch.int64).expand(b, nsp)
    else:
        ratio = output_ratio if isinstance(output_ratio, (list, tuple)) else (output_ratio,) * nsp
        ratio = tuple(float(r) for r in (ratio * nsp if len(ratio) == 1 else ratio))
        out = torch.stack([(sizes[:, a].double() * r).floor().long() for a, r in enumerate(ratio)], 1)
    kernel = torch._C._nn.fractional_max_pool2d if nsp == 2 else torch._C._nn.fractional_max_pool3d
    vals, idxs = [], []
    # SYNC: none — host sizes
    for i, (img, o) in enumerate(zip(x.unbind(), out.tolist())):
        try:
            v, j = kernel(img.unsqueeze(0), k, o, samples[i:i + 1])
        except RuntimeError as err:
            raise RuntimeError(f"{op}(): sample {i} of {describe(x)}: {err}") from None
        vals.append(v[0])
        idxs.append(j[0])
    if output_size is not None:
        res = (torch.stack(vals), torch.stack(idxs)) if vals else (
            x._values.new_zeros(0, c, *fixed), torch.zeros(0, c, *fixed, dtype=torch.int64, device=x.device))
        return res if return_indices else res[0]
    p = x._partition
    extents = [mapped_extent(p.extents[n], ("fractional", ratio[d - 2]), lambda m, r=ratio[d - 2]: (m.double() * r).floor().long())
               for n, d in enumerate(x._ragged_dims)]
    part = partition_for(extents)
    rag = [d - 1 for d in x._ragged_dims]
    if not vals:
        raise ValueError(f"{op}(): of an empty batch {describe(x)}")
    res = (wrap_values(torch.cat([component_rows(v, rag) for v in vals]), part, x._ragged_dims),
           wrap(torch.cat([component_rows(j, rag) for j in idxs]), part, x._ragged_dims))
    return res if return_indices else res[0]


def _fractional_route(nsp: int, always_indices: bool):
    op = f"fractional_max_pool{nsp}d"

    def routed(input, kernel_size, output_size=None, output_ratio=None, return_indices=False, _random_samples=None):
        if not is_ragged_spatial(input, nsp):
            return NotImplemented
        return _fractional(op, nsp, input, kernel_size, output_size, output_ratio, return_indices or always_indices,
                           _random_samples)

    return routed


route(F.fractional_max_pool2d)(_fractional_route(2, False))
route(F.fractional_max_pool2d_with_indices)(_fractional_route(2, True))
route(F.fractional_max_pool3d)(_fractional_route(3, False))
route(F.fractional_max_pool3d_with_indices)(_fractional_route(3, True))


def _conv_route(fn, nspatial: int):
    name = fn.__name__

    def routed(input, weight, bias=None, *args, **kwargs):
        """To the values (``bridged.conv``) when components are ``(n, C, *spatial)`` with only dim
        1 ragged; aten's conv asks for concrete sizes, which a ragged dim has not."""
        if not isinstance(input, MJT) or isinstance(weight, MJT) or isinstance(bias, MJT):
            return NotImplemented
        if len(input._size) == nspatial + 2 and (input._ragged_dims == (1,) or max(input._ragged_dims) >= 2):
            # ragged spatial dims: one dense conv over a canvas of the images
            return conv(name, nspatial, input, weight, bias, *args, **kwargs)
        if input._ragged_dims != (1,) or len(input._size) != nspatial + 3:
            raise StructureError(
                f"{name}(): expected components (n, C, {', '.join('L' * nspatial)}) with only dim 1 ragged "
                f"(the conv's batch), got {describe(input)} with ragged dims {input._ragged_dims} for "
                "layout torch.multi_jagged; conv1d / conv2d / conv3d also take ragged spatial dims (B, C, j0[, j1[, j2]])"
            )
        return bridged.conv(fn, input, weight, bias, *args, **kwargs)

    return routed


for _fn, _n in ((F.conv1d, 1), (F.conv2d, 2), (F.conv3d, 3)):
    route(_fn)(_conv_route(_fn, _n))
