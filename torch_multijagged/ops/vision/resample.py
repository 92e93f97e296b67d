"""Resampling over ragged spatial dims: ``F.interpolate`` (``nn.Upsample``) and
``pixel_shuffle`` / ``pixel_unshuffle`` on images ``(B, C, j0, j1)`` and signals ``(B, C, j0)``.

NOTE [ Resampling ragged images ]

Every sample is resampled on its own, exactly as the dense op resamples that image:

* ``scale_factor`` (a float or one per spatial dim): sample i's output side is
  ``floor(n_i · s)`` (dense torch's rule, in double). The new per-sample sizes are a new ragged
  extent, ``structure.mapped_extent(e, ("scale", s), …)``: keyed by the *size rule*, not the op,
  so the same factor on the same extent gives the same nested int whatever the mode (a nearest
  and a bilinear upsample of one batch can be added; ``pixel_shuffle(x, 2)`` too), a square batch
  ``(B, C, j0, j0)`` stays square, and ``s = 1`` keeps the input's nested int. A side that
  becomes 0 (a zero-size sample, or ``floor(n·s) = 0``) gives an empty sample where dense
  torch raises. ``size=(h, w)``: every sample is resized to the same size, so the result is a
  dense ``(B, C, h, w)`` tensor; a sample with a zero side cannot be resized to a non-empty size
  and raises naming the sample, as dense torch raises for that image.
* The source index and weights follow aten's CPU kernels bit for bit for the index math, so
  that ``nearest`` picks the same pixels as dense torch: the scale is ``(opmath)(1/s)`` when
  ``scale_factor`` is given and not recomputed, else ``(opmath)n_in / n_out``. ``nearest`` in
  2-d has two CPU kernels that differ at the edges (which one runs depends on the image): the
  per-channel kernel, taken when ``out_h + out_w <= 128`` (for a contiguous NCHW image, which is
  what the reference is), computes ``floor((float)dst · scale)`` in float32 with the shortcuts
  ``out == in`` (copy) and ``out == 2·in`` (``dst >> 1``); the generic kernel computes
  ``floorf(scale · dst)`` in opmath (float64 for double inputs) with no shortcut. 1-d always runs
  the generic kernel. ``nearest-exact`` likewise (``floorf((dst + 0.5)·scale)`` in double vs.
  ``floorf(max(scale·(dst+0.5) − 0.5, 0) + 0.5)`` in opmath). ``linear``/``bilinear`` use
  aten's ``compute_source_index_and_lambda`` (copy when ``out == in``; align_corners scale
  ``(n−1)/(out−1)``), with weights rounded to the input dtype and the sum taken in opmath.
* The output is gathered from the packed pixel rows (one index per output pixel and tap) with
  weights built by tensor ops from per-sample sizes (no per-sample loop, no padded envelope), on
  the values under torch's own autograd (``bridge.values_of`` / ``wrap_values``): gradients of
  every order. The new sizes are built on the host from the host copy of the input's lengths,
  so these routes run eagerly only: under ``torch.compile`` a graph break (with
  ``fullgraph=True`` an error naming the op; NOTE [ Eager-only routes ] in ``_common.py``).
* ``bicubic``, ``area`` and ``antialias=True`` have no packed form here: dense ``F.interpolate``
  runs on each image (a view of its packed rows), a loop over the samples whose values and
  gradients are dense torch's own; sizes and extents follow the rules above, so their results
  combine with the packed modes'.
* Images image by image: see NOTE [ Resampling image by image ].
* ``pixel_shuffle(x, r)``: ``(B, C·r², j0, j1) → (B, C, j0·r, j1·r)`` (extent key
  ``("scale", r)``); ``pixel_unshuffle(x, r)`` the inverse, extent key ``("div", r)``; every
  sample's sides must be divisible by ``r`` (else a ValueError naming the sample, as dense
  raises). One gather each, zero-size samples stay empty.

NOTE [ Resampling image by image ]

The gather above computes its index math with tensor ops over every output pixel and tap, ~20
ops over ``T_out`` entries whatever C is; a user's loop pays one dense call per image instead.
So 2-d images of the packed modes whose *output* holds at least ``_PER_IMAGE_PIXELS[kind]``
pixels per image on average (or that already hold per-image pieces) run dense ``F.interpolate``
on each image — a channels-last view ``(1, C, h, w)`` of its pixel rows, or its piece — and the
result holds its images as pieces (NOTE [ Per-image pieces ] in ``pieces.py``: no packing
until something reads the values; the next conv or pool reads them as they are). Measured (one
thread, fp32, ×2, forward / forward + backward, image by image over the gather): bilinear, B = 64,
C = 16, sides 4–12 (≈ 260 output pixels per image) 0.34 / 0.59, B = 32, C = 4, sides 8–16
(≈ 580 px) 0.30 / 0.59, while at B = 128, sides 2–4 (≈ 40 px) the gather takes 0.7 / 0.4 of a
per-image loop; nearest, whose gather has one tap and little index math: B = 8, C = 16, sides
16–64 (≈ 6,400 px) 0.35 / 0.75, while at ≈ 260 px the gather takes 0.9 / 0.6 of the loop and
image by image costs more than the loop (its backward). Many tiny images stay on the gather,
which wins there.

Channels-last views change which of aten's CPU kernels runs: ``bilinear`` then takes its
channels-last kernel (equal to rounding), and ``nearest`` / ``nearest-exact`` take the
per-channel kernel for C > 3 whatever the output size, where an NCHW image of
``out_h + out_w > 128`` takes the generic one, which may pick other pixels (NOTE [ Resampling
ragged images ]); aten's nearest backward, whatever the layout, follows the per-channel rule,
so even an NCHW copy would not give the forward's gradient there. A nearest batch runs image by
image only where the two rules pick the same pixels for every image (``_same_picks``: a
``nearest`` float32 ×2 or to given sizes, say); otherwise it stays on the gather.
"""

from __future__ import annotations

import math
import struct

import torch
import torch.nn.functional as F

from ... import pieces
from ...bridge import ragged_as_static, static_as_ragged, values_of, wrap_values
from ...errors import StructureError
from ...structure import extent_of, mapped_extent, partition_for
from .._common import MJT, describe, eager_route, equal_sizes, wrap
from .._routing import _needs_grad, route
from .conv import channels_first

__all__ = []

_LAYOUT = "layout torch.multi_jagged"
_MODES = ("nearest", "nearest-exact", "linear", "bilinear")
_PER_SAMPLE_MODES = ("bicubic", "area")  # and antialias=True: a dense call per image
_VOLUME_MODES = ("trilinear",)  # volumes (B, C, j0, j1, j2) take every mode image by image
_VEC_LIMIT = 128  # aten's _use_vectorized_kernel_cond_2d: out_h + out_w <= 128
# average output pixels per image from which 2-d images run one by one (NOTE [ Resampling image by image ])
_PER_IMAGE_PIXELS = {"linear": 128, "nearest": 2048}


# ----------------------------------------------------------------------------- helpers
_WHY = (
    "{op}(): resampling ragged spatial dims makes new per-sample sizes (a new ragged extent, built on the host), "
    f"which torch.compile cannot trace for {_LAYOUT}: a graph break"
)


def _declined(input, *args, **kwargs) -> bool:
    """A call the route declines (a dense input: ``NotImplemented``) is no graph break."""
    return not isinstance(input, MJT)


def _spatial(op: str, x: MJT, nsp_allowed: tuple[int, ...]) -> int:
    """The number of spatial dims of ``x`` — ``(B, C, j0)`` or ``(B, C, j0, j1)``, every spatial
    dim ragged, C static — or an error naming ``op``."""
    nsp = x.dim() - 2
    # (the channel dim the only static one: read from the sizes, so that pieces stay unpacked)
    if nsp in nsp_allowed and x._ragged_dims == tuple(range(2, 2 + nsp)):
        return nsp
    shapes = " or ".join({1: "(B, C, j0)", 2: "(B, C, j0, j1)", 3: "(B, C, j0, j1, j2)"}[n] for n in nsp_allowed)
    raise NotImplementedError(
        f"{op}(): expected {shapes} with every spatial dim ragged and a static channel dim, got "
        f"{describe(x)} with ragged dims {x._ragged_dims} for {_LAYOUT}"
    )


def _values(x: MJT) -> torch.Tensor:
    return values_of(x) if _needs_grad(x) else x._values


def _finish(v: torch.Tensor, partition, ragged_dims) -> MJT:
    return wrap_values(v, partition, ragged_dims) if v.requires_grad else wrap(v, partition, ragged_dims)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _entries(off: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sample, local)`` of every entry of a packed axis with offsets ``off``: the sample it
    belongs to and its index inside the sample."""
    lengths = off.diff()
    sample = torch.repeat_interleave(torch.arange(lengths.shape[0], device=off.device), lengths, output_size=total)
    return sample, torch.arange(total, device=off.device) - off[sample]


# ----------------------------------------------------------------------------- index math
def _scale(n_in, n_out, scale, dt):
    """aten's ``compute_scales_value<dt>``: ``(dt)(1/scale)`` when a scale is given, else
    ``(dt)n_in / n_out`` (per entry)."""
    if scale is not None:
        return torch.full(n_in.shape, 1.0 / scale, dtype=dt, device=n_in.device)
    return n_in.to(dt) / n_out.to(dt)


def _nearest_src(dst, n_in, n_out, scale, exact: bool, opm, vec):
    """Source index of every output index ``dst`` (per-entry ``n_in``/``n_out``); ``vec`` (per
    entry bool, or None for 1-d) marks the per-channel 2-d kernel (NOTE [ Resampling ragged
    images ])."""
    f32 = torch.float32
    s = _scale(n_in, n_out, scale, opm)
    d = dst.to(opm)
    if exact:
        generic = ((s * (d + 0.5) - 0.5).clamp_min(0) + 0.5).to(f32).floor()
    else:
        generic = (s * d).to(f32).floor()
    src = generic.to(torch.int64)
    if vec is not None:
        sf = _scale(n_in, n_out, scale, f32)
        if exact:
            fast = ((dst.to(torch.float64) + 0.5) * sf.to(torch.float64)).to(f32).floor().to(torch.int64)
        else:
            fast = (dst.to(f32) * sf).floor().to(torch.int64)
            fast = torch.where(n_out == n_in, dst, torch.where(n_out == 2 * n_in, dst >> 1, fast))
        src = torch.where(vec, fast, src)
    return torch.minimum(src, n_in - 1)


def _linear_src(dst, n_in, n_out, scale, align_corners: bool, opm, dtype):
    """aten's ``compute_source_index_and_lambda``: ``(i0, i1, w0, w1)`` per output index, weights
    rounded to ``dtype`` (as dense stores them) and returned in opmath."""
    d = dst.to(opm)
    if align_corners:
        s = torch.where(n_out > 1, (n_in - 1).to(opm) / (n_out - 1).clamp_min(1).to(opm), torch.zeros((), dtype=opm))
        real = s * d
    else:
        real = (_scale(n_in, n_out, scale, opm) * (d + 0.5) - 0.5).clamp_min(0)
    i0 = torch.minimum(real.to(torch.float32).floor().to(torch.int64), n_in - 1)
    w1 = (real - i0.to(opm)).clamp(0, 1)
    same = n_out == n_in
    i0 = torch.where(same, dst, i0)
    w1 = torch.where(same, torch.zeros((), dtype=opm), w1)
    i1 = i0 + (i0 < n_in - 1).to(torch.int64)
    w0 = (1 - w1).to(dtype).to(opm)
    return i0, i1, w0, w1.to(dtype).to(opm)


def _axis_taps(off, total, n_in_dev, scale, mode, align_corners, opm, dtype, vec_sample):
    """Taps ``[(src, weight or None)]`` of one spatial axis, one entry per (sample, output
    index), packed by the output offsets ``off``."""
    sample, dst = _entries(off, total)
    n_out = off.diff()[sample]
    n_in = n_in_dev[sample]
    if mode in ("nearest", "nearest-exact"):
        vec = None if vec_sample is None else vec_sample[sample]
        return [(_nearest_src(dst, n_in, n_out, scale, mode == "nearest-exact", opm, vec), None)]
    i0, i1, w0, w1 = _linear_src(dst, n_in, n_out, scale, bool(align_corners), opm, dtype)
    return [(i0, w0), (i1, w1)]


def _gather(v, in_p, offs, taps, sample, coords, opm):
    """Every output pixel (``sample`` / ``coords``: ``(T_out,)``, ``(T_out, nsp)``) gathered from
    the packed input pixels ``v`` ``(T, C)``; linear taps are summed in dense torch's order (the
    last axis first) in opmath."""
    entry = [off[sample] + coords[:, k] for k, off in enumerate(offs)]
    base = in_p.offsets[sample]
    if len(taps) == 1:
        picks = [[(base + src[entry[0]], w) for src, w in taps[0]]]
        outer = [None]
    else:
        w_in = in_p.extents[1].lengths()[sample]
        picks = [[(base + sh[entry[0]] * w_in + sw[entry[1]], ww) for sw, ww in taps[1]] for sh, _ in taps[0]]
        outer = [wh for _, wh in taps[0]]
    if taps[0][0][1] is None:  # nearest: one tap per axis
        return v.index_select(0, picks[0][0][0])
    vo = v.to(opm)
    out = None
    for inner, wh in zip(picks, outer):
        t = None
        for rows, w in inner:
            term = vo.index_select(0, rows) * w[entry[-1]].unsqueeze(1)
            t = term if t is None else t + term
        if wh is not None:
            t = t * wh[entry[0]].unsqueeze(1)
        out = t if out is None else out + t
    return out.to(v.dtype)


# ----------------------------------------------------------------------------- interpolate
def _check_interp_args(input: MJT, nsp: int, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """Dense torch's argument checks (its messages), then its mode/dtype checks on a one-pixel
    probe; returns ``(sizes, scales, extents)``, one of them set, with one entry per spatial dim
    (``extents``: the extents of another batch's nested ints given as ``size``)."""
    op = "interpolate"
    if mode not in _MODES + _PER_SAMPLE_MODES + _VOLUME_MODES:
        raise NotImplementedError(
            f"{op}(): mode {mode!r} over ragged spatial dims is not supported for {_LAYOUT} (supported: "
            f"{', '.join(_MODES + _PER_SAMPLE_MODES + _VOLUME_MODES)})"
        )
    if size is not None and scale_factor is not None:
        raise ValueError(f"{op}(): only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError(f"{op}(): either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError(f"{op}(): recompute_scale_factor is not meaningful with an explicit size.")
    spec = size if size is not None else scale_factor
    vals = list(spec) if isinstance(spec, (list, tuple)) else [spec] * nsp
    if len(vals) != nsp:
        what = "size" if size is not None else "scale_factor"
        raise ValueError(f"{op}(): expected {what} with {nsp} entries for input {describe(input)}, got {spec}")
    extents = None
    if size is not None and any(isinstance(s, torch.SymInt) for s in vals) and all(
            isinstance(s, torch.SymInt) or (type(s) is int and s > 0) for s in vals):
        # another batch's sizes, ``skip.shape[-2:]``, where a side may be static (images of one
        # width): that side as an extent of equal sizes, made static again by the caller
        extents = [extent_of(s) if isinstance(s, torch.SymInt) else equal_sizes(input, s) for s in vals]
        if any(e is None or e.batch != input._partition.batch for e in extents):
            raise ValueError(
                f"{op}(): expected size to be positive ints or the nested ints of another batch of {input._partition.batch} "
                f"images (e.g. skip.shape[-{nsp}:]), got {size}"
            )
    elif size is not None:
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in vals) or any(s <= 0 for s in vals):
            raise ValueError(
                f"{op}(): expected size to be positive ints, or nested ints of another batch's ragged dims (beside "
                f"positive ints), got {size}"
            )
    elif not all(isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in vals):
        raise ValueError(f"{op}(): expected scale_factor to be positive finite numbers, got {scale_factor}")
    c = input._size[1]
    F.interpolate(torch.zeros((1, c) + (1,) * nsp, dtype=input.dtype, device=input.device), size=(1,) * nsp, mode=mode,
                  align_corners=align_corners, antialias=antialias)
    if extents is not None:
        return None, None, extents
    return (vals, None, None) if size is not None else (None, [float(s) for s in vals], None)


@route(F.interpolate)
@eager_route(_WHY, traceable=_declined)
def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                 antialias=False):
    """NOTE [ Resampling ragged images ]."""
    if not isinstance(input, MJT):
        return NotImplemented
    input = channels_first("interpolate", input)
    op = "interpolate"
    sides = _static_sides(input)
    if sides:
        return _interpolate_static_sides(input, sides, size, scale_factor, mode, align_corners, recompute_scale_factor,
                                         antialias)
    nsp = _spatial(op, input, (1, 2, 3))
    sizes, scales, own = _check_interp_args(input, nsp, size, scale_factor, mode, align_corners, recompute_scale_factor,
                                            antialias)
    out = _resample(input, op, nsp, sizes, scales, own, mode, align_corners, recompute_scale_factor, antialias)
    if own is not None:  # a size given as an int beside nested ints: that side static, as dense's
        for i, n in enumerate(size):
            if not isinstance(n, torch.SymInt):
                out = ragged_side_as_static(out, 2 + i)
    return out


def _resample(input: MJT, op: str, nsp: int, sizes, scales, own, mode, align_corners, recompute_scale_factor,
              antialias):
    """``_interpolate`` of images whose spatial dims are all ragged, after its checks."""
    p = input._partition
    dev = p.offsets.device
    b = p.batch
    if sizes is not None:
        # SYNC: none — host lengths, to name a sample that dense torch would refuse.
        host = p.host_sizes()
        empty = (host == 0).any(1).nonzero()
        if empty.numel():
            i = int(empty[0, 0])
            raise ValueError(
                f"{op}(): sample {i} of {describe(input)} has spatial size {tuple(host[i].tolist())} and cannot be "
                f"resized to {tuple(sizes)} (dense torch raises for an empty image)"
            )
    elif own is not None:
        _check_own_sizes(op, input, own)
    elif mode != "area":  # a side scaled to 0 (a 1×1 image by 0.5): dense raises (``area`` pools to it)
        _check_own_sizes(op, input, _scaled_extents(p, scales))
    if nsp == 3 or mode in _PER_SAMPLE_MODES or antialias:
        return _interpolate_per_sample(input, sizes, scales, own, mode, align_corners, recompute_scale_factor, antialias)
    if nsp == 2:
        targets = _image_targets(input, sizes, scales, own)
        if _per_image_applies(input, mode, targets[1]) and (
                not mode.startswith("nearest") or _same_picks(input, mode, targets[1], scales, recompute_scale_factor)):
            return _interpolate_images(input, targets, scales, mode, align_corners, recompute_scale_factor)
    if sizes is not None:
        offs = [torch.arange(b + 1, device=dev) * m for m in sizes]
        totals = [b * m for m in sizes]
        out_len = [torch.full((b,), m, dtype=torch.int64, device=dev) for m in sizes]
        kernel_scales = [None] * nsp
        n = math.prod(sizes)
        flat = torch.arange(b * n, device=dev)
        sample = torch.div(flat, n, rounding_mode="floor")
        local = flat - sample * n
        coords = torch.stack([torch.div(local, sizes[1], rounding_mode="floor"), local % sizes[1]], 1) if nsp == 2 else local.unsqueeze(1)
    else:
        # each image to its own size: the extents of another batch's nested ints (an FPN or U-Net
        # skip connection, ``size=skip.shape[-2:]``), which the result shares, with dense torch's
        # scales from the sizes; or dense torch's output size floor(n·s) (double) from the host lengths
        ext = own if own is not None else _scaled_extents(p, scales)
        offs = [e.offsets for e in ext]
        totals = [e.total for e in ext]
        out_len = [e.lengths() for e in ext]
        kernel_scales = [None] * nsp if own is not None or recompute_scale_factor else scales
        out_p = partition_for(ext)
        sample, coords = out_p.row_coords()
    v = _values(input)
    opm = _opmath(v.dtype)
    vec = (out_len[0] + out_len[1] <= _VEC_LIMIT) if nsp == 2 and mode.startswith("nearest") else None
    taps = [_axis_taps(off, total, e.lengths(), s, mode, align_corners, opm, v.dtype, vec)
            for off, total, e, s in zip(offs, totals, p.extents, kernel_scales)]
    out = _gather(v, p, offs, taps, sample, coords, opm)
    if sizes is None:
        return _finish(out, out_p, input._ragged_dims)
    return out.view(b, *sizes, out.shape[1]).movedim(-1, 1).contiguous()


def _image_targets(input: MJT, sizes, scales, own):
    """``(extents, [(H, W)] per image)``: the output's extents (None for ``size=``, a dense
    batch) and each image's output size, on the host."""
    p = input._partition
    if sizes is not None:
        return None, [tuple(sizes)] * p.batch
    ext = own if own is not None else _scaled_extents(p, scales)
    # SYNC: none — host lengths
    return ext, [tuple(hw) for hw in torch.stack([e.host_lengths() for e in ext], 1).tolist()]


def _per_image_applies(input: MJT, mode: str, targets) -> bool:
    """NOTE [ Resampling image by image ]: images that hold pieces, or whose outputs average at
    least ``_PER_IMAGE_PIXELS`` pixels."""
    total = sum(h * w for h, w in targets)
    kind = "nearest" if mode.startswith("nearest") else "linear"
    return total > 0 and (pieces.holds_pieces(input) or total >= _PER_IMAGE_PIXELS[kind] * len(targets))


def _interpolate_images(input: MJT, targets, scales, mode, align_corners, recompute_scale_factor):
    """Dense ``F.interpolate`` on each image (NOTE [ Resampling image by image ]): pieces out on
    the output extents, or the dense ``(B, C, h, w)`` batch for ``size=``."""
    ext, out_sizes = targets
    c = input._size[1]
    outs = []
    for img, (h, w) in zip(pieces.split(input), out_sizes):
        if img is None or h * w == 0:
            outs.append(None)
            continue
        if scales is None:  # to given sizes: dense torch's scales from the sizes
            outs.append(F.interpolate(img, size=(h, w), mode=mode, align_corners=align_corners))
        else:
            outs.append(F.interpolate(img, scale_factor=scales, mode=mode, align_corners=align_corners,
                                      recompute_scale_factor=recompute_scale_factor))
    if ext is None:
        return torch.cat(outs).contiguous()
    live = [o for o in outs if o is not None]
    return pieces.from_pieces(outs, partition_for(ext), input._ragged_dims, c, live[0].dtype, live[0].device)


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _same_picks(input: MJT, mode: str, out_sizes, scales, recompute_scale_factor) -> bool:
    """Whether dense nearest on each image's channels-last view, forward and backward, picks the
    pixels the NCHW image's forward picks (NOTE [ Resampling image by image ]). aten's backward
    and its per-channel forward kernel use one index rule (float32 scale; shortcuts ``out == in``:
    copy, ``out == 2·in``: ``dst >> 1``); the generic forward, which an NCHW image of
    ``out_h + out_w > 128`` takes, computes ``floor(dst · scale)`` in opmath with no shortcut.
    For such images the two agree where opmath is float32, the mode ``nearest`` and the
    shortcuts' scales exactly 1 or 0.5 — always when the scale comes from the sizes."""
    large = [k for k, (h, w) in enumerate(out_sizes) if h + w > _VEC_LIMIT]
    if not large:
        return True
    if mode != "nearest" or input.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if scales is None or recompute_scale_factor:
        return True
    inv = [_f32(1.0 / sc) for sc in scales]
    in_sizes = pieces.image_sizes(input._partition)
    for k in large:
        for n_in, n_out, i in zip(in_sizes[k], out_sizes[k], inv):
            if (n_out == n_in and i != 1.0) or (n_out == 2 * n_in and i != 0.5):
                return False
    return True


def _scaled_extents(p, scales):
    """Each spatial extent of ``p`` scaled as dense torch sizes its output, ``floor(n·s)`` in
    double, keyed by the size rule (NOTE [ Resampling ragged images ])."""
    return [mapped_extent(e, ("scale", s), lambda n, s=s: (n.to(torch.float64) * s).floor()) for e, s in zip(p.extents, scales)]


def _static_side(x: MJT):
    """The static spatial dim of images ``(B, C, j0, W)`` / ``(B, C, H, j0)`` (every image of one
    width, or of one height: ``nested_tensor`` makes a side whose sizes agree static), else None."""
    if x.dim() != 4 or len(x._ragged_dims) != 1 or x._ragged_dims[0] not in (2, 3):
        return None
    return 5 - x._ragged_dims[0]


def static_side_as_ragged(xs, d: int) -> list:
    """Images ``xs`` of one structure with one static side ``d`` (``_static_side``), that side made
    a ragged dim of equal sizes (``bridge.static_as_ragged``; one extent for all, so that they keep
    one structure); differentiable."""
    ext = equal_sizes(xs[0], int(xs[0]._size[d]))
    return [static_as_ragged(x, d, ext) for x in xs]


def ragged_side_as_static(out, d: int):
    """``out`` with ragged dim ``d`` made static again where every image's size there is one (as
    dense torch's per-image sizes are), else ``out``; differentiable."""
    if not isinstance(out, MJT) or d not in out._ragged_dims:
        return out
    lengths = out._partition.extents[out._ragged_dims.index(d)].host_lengths()  # SYNC: none — host lengths
    if out._partition.batch == 0 or not bool((lengths == lengths[0]).all()):
        return out
    return ragged_as_static(out, d, int(lengths[0]))


def _static_sides(x: MJT) -> tuple[int, ...]:
    """The static spatial dims of images ``(B, C, j0, W)`` (``_static_side``) or volumes ``(B, C,
    T, j0, j1)`` (clips of one length, frames of their own sizes) with a static channel dim and
    some spatial dim ragged, else ``()``."""
    if x.dim() == 4:
        side = _static_side(x)
        return () if side is None else (side,)
    if x.dim() != 5 or not x._ragged_dims or x._ragged_dims[0] < 2:
        return ()
    return tuple(d for d in (2, 3, 4) if d not in x._ragged_dims)


def _interpolate_static_sides(x: MJT, sides: tuple[int, ...], size, scale_factor, mode, align_corners,
                              recompute_scale_factor, antialias):
    """Images or volumes with static sides (``_static_sides``): those sides made ragged dims of equal
    sizes, resampled as such, and made static again where every sample's new size is one (a scale)."""
    for d in sides:
        x = static_side_as_ragged([x], d)[0]
    out = F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                        recompute_scale_factor=recompute_scale_factor, antialias=antialias)
    for d in sides:
        out = ragged_side_as_static(out, d)
    return out


def _interpolate_per_sample(input: MJT, sizes, scales, own, mode, align_corners, recompute_scale_factor, antialias):
    """``bicubic``, ``area``, ``antialias=True`` and volumes, which have no packed form here: dense
    ``F.interpolate`` on each image, a loop over the samples on views of the packed values (so
    gradients of every order are dense torch's). The result is what the packed modes give: a
    dense ``(B, C, h, w)`` for ``size=(h, w)``, else the batch on the scaled extents (or on the
    extents of the nested ints given as ``size``); an image whose input or output has a zero side
    stays empty there, where dense torch raises."""
    p = input._partition
    v = _values(input)
    c = v.shape[1]
    host = p.host_sizes()  # SYNC: none — the host copy of the sizes
    if sizes is not None:
        ext, targets = None, [tuple(sizes)] * p.batch
    else:
        ext = own if own is not None else _scaled_extents(p, scales)
        targets = torch.stack([e.host_lengths() for e in ext], 1).tolist()
    outs, start = [], 0
    for n_in, n_out in zip(host.tolist(), targets):
        rows = math.prod(n_in)
        image = v[start:start + rows].t().reshape(c, *n_in)
        start += rows
        if rows == 0 or math.prod(n_out) == 0:
            outs.append(v.reshape(-1)[:0].view(c, *n_out))  # empty, on v's graph (an empty batch still needs a grad)
        elif own is not None or sizes is not None:
            outs.append(F.interpolate(image[None], size=tuple(n_out), mode=mode, align_corners=align_corners,
                                      antialias=antialias)[0])
        else:
            outs.append(F.interpolate(image[None], scale_factor=scales, mode=mode, align_corners=align_corners,
                                      recompute_scale_factor=recompute_scale_factor, antialias=antialias)[0])
    if ext is None:
        return torch.stack(outs)
    out = torch.cat([o.reshape(c, -1).t() for o in outs])
    return _finish(out, partition_for(ext), input._ragged_dims)


def _check_own_sizes(op: str, x: MJT, extents) -> None:
    """Dense torch refuses to resize an empty image or to an empty size: each sample's pair."""
    host_in = x._partition.host_sizes()
    host_out = torch.stack([e.host_lengths() for e in extents], 1)  # SYNC: none — host lengths
    bad = ((host_in == 0).any(1) != (host_out == 0).any(1)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(
            f"{op}(): sample {i} of {describe(x)} has spatial size {tuple(host_in[i].tolist())} and cannot be resized "
            f"to {tuple(host_out[i].tolist())} (dense torch raises for an empty input or output)"
        )


# ----------------------------------------------------------------------------- pixel shuffle
def _flat_rows(v: torch.Tensor, index: torch.Tensor, channels: int) -> torch.Tensor:
    """``v`` ``(T, C)`` read at flat element positions ``index`` ``(T_out, channels)``."""
    return v.reshape(-1).index_select(0, index.reshape(-1)).view(index.shape[0], channels)


def _scaled(e, r: int):
    """``e`` with every size times ``r`` (key ``("scale", r)``), remembering that dividing it back
    by ``r`` gives ``e`` (so ``pixel_unshuffle(pixel_shuffle(x, r), r)`` keeps x's nested ints)."""
    out = mapped_extent(e, ("scale", float(r)), lambda n: n * r)
    out.cache.setdefault(("mapped", ("div", r)), e)
    return out


def _divided(e, r: int):
    """``e`` with every size divided by ``r`` (all divisible; key ``("div", r)``), remembering the
    way back (``_scaled``)."""
    out = mapped_extent(e, ("div", r), lambda n: torch.div(n, r, rounding_mode="floor"))
    out.cache.setdefault(("mapped", ("scale", float(r))), e)
    return out


def _factor(op: str, name: str, r) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ValueError(f"{op}(): expected {name} to be a positive int, got {r!r}")
    return r


@route(torch.pixel_shuffle, F.pixel_shuffle)
@eager_route(_WHY, traceable=_declined)
def _pixel_shuffle(input, upscale_factor):
    """``(B, C·r², j0, j1) → (B, C, j0·r, j1·r)``: out pixel ``(h·r+i, w·r+j)`` channel ``c`` is in
    pixel ``(h, w)`` channel ``c·r² + i·r + j``, per sample as dense ``pixel_shuffle``."""
    if not isinstance(input, MJT):
        return NotImplemented
    input = channels_first("pixel_shuffle", input)
    side = _static_side(input)
    if side is not None:  # one static side: shuffled as a ragged one of equal sizes (as interpolate)
        return ragged_side_as_static(F.pixel_shuffle(static_side_as_ragged([input], side)[0], upscale_factor), side)
    op = "pixel_shuffle"
    _spatial(op, input, (2,))
    r = _factor(op, "upscale_factor", upscale_factor)
    c_in = input._values.shape[1]
    torch.pixel_shuffle(input._values.new_zeros(1, c_in, 1, 1), r)  # dense torch's channel check
    c = c_in // (r * r)
    p = input._partition
    ext = [_scaled(e, r) for e in p.extents]
    out_p = partition_for(ext)
    sample, coords = out_p.row_coords()
    h, i = torch.div(coords[:, 0], r, rounding_mode="floor"), coords[:, 0] % r
    w, j = torch.div(coords[:, 1], r, rounding_mode="floor"), coords[:, 1] % r
    row = p.offsets[sample] + h * p.extents[1].lengths()[sample] + w
    index = (row * c_in + i * r + j).unsqueeze(1) + torch.arange(c, device=row.device) * (r * r)
    return _finish(_flat_rows(_values(input), index, c), out_p, input._ragged_dims)


@route(torch.pixel_unshuffle, F.pixel_unshuffle)
@eager_route(_WHY, traceable=_declined)
def _pixel_unshuffle(input, downscale_factor):
    """``(B, C, j0, j1) → (B, C·r², j0/r, j1/r)``, the inverse of ``pixel_shuffle``; every sample's
    sides must be divisible by ``r``."""
    if not isinstance(input, MJT):
        return NotImplemented
    input = channels_first("pixel_unshuffle", input)
    side = _static_side(input)
    if side is not None:  # one static side: as a ragged one of equal sizes (as interpolate)
        return ragged_side_as_static(F.pixel_unshuffle(static_side_as_ragged([input], side)[0], downscale_factor), side)
    op = "pixel_unshuffle"
    _spatial(op, input, (2,))
    r = _factor(op, "downscale_factor", downscale_factor)
    c = input._values.shape[1]
    torch.pixel_unshuffle(input._values.new_zeros(1, c, r, r), r)  # dense torch's dtype checks
    p = input._partition
    # SYNC: none — host lengths
    host = p.host_sizes()
    bad = (host % r != 0).any(1).nonzero()
    if bad.numel():
        k = int(bad[0, 0])
        raise ValueError(
            f"{op}(): expected every sample's height and width to be divisible by downscale_factor {r}, got "
            f"sample {k} of size {tuple(host[k].tolist())} in {describe(input)}"
        )
    ext = [_divided(e, r) for e in p.extents]
    out_p = partition_for(ext)
    sample, coords = out_p.row_coords()
    w_in = p.extents[1].lengths()[sample]
    base = p.offsets[sample] + coords[:, 0] * r * w_in + coords[:, 1] * r  # (T_out,)
    ar = torch.arange(r, device=base.device)
    row = base.view(-1, 1, 1) + ar.view(1, r, 1) * w_in.view(-1, 1, 1) + ar.view(1, 1, r)  # (T_out, i, j)
    index = row.unsqueeze(1) * c + torch.arange(c, device=base.device).view(1, c, 1, 1)  # (T_out, c, i, j)
    return _finish(_flat_rows(_values(input), index.reshape(index.shape[0], c * r * r), c * r * r), out_p, input._ragged_dims)


# ----------------------------------------------------------------------------- grid_sample
@route(F.grid_sample)
def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """``F.grid_sample`` per image: images ``(B, C, *)`` sampled at each image's own grid
    ``(B, k_h, k_w, 2)`` (multi_jagged with either or both of ``k_h``, ``k_w`` ragged, or a dense
    ``(B, H', W', 2)``) — the warps of optical flow and spatial transformers on images of
    different sizes. The output has the grid's sizes. One dense call per image, eager only."""
    if not isinstance(input, MJT):
        return NotImplemented
    input = channels_first("grid_sample", input)
    if input.dim() != 4 or 1 in input._ragged_dims:
        raise StructureError(f"grid_sample(): expected images (B, C, H, W) with a static channel dim, got {describe(input)}")
    if isinstance(grid, MJT) and (grid.dim() != 4 or 3 in grid._ragged_dims):
        raise StructureError(f"grid_sample(): expected a grid (B, k_h, k_w, 2), got {describe(grid)}")
    if grid.shape[0] != input.shape[0]:
        raise StructureError(f"grid_sample(): the grid's batch {grid.shape[0]} is not the images' {input.shape[0]}")
    return _grid_sample_images(input, grid, mode, padding_mode, align_corners)


@eager_route("{op}(): one dense call per image, from host sizes")
def _grid_sample_images(input: MJT, grid, mode, padding_mode, align_corners):
    grids = grid.unbind() if isinstance(grid, MJT) else list(grid.unbind(0))
    outs = []
    for img, g in zip(input.unbind(), grids):
        if g.shape[0] * g.shape[1] == 0:  # no sampling point: an empty output of the grid's size
            outs.append(img.new_zeros((img.shape[0], *g.shape[:2])) + img.sum() * 0)
            continue
        outs.append(F.grid_sample(img[None], g[None], mode, padding_mode, align_corners)[0])
    if not isinstance(grid, MJT):
        return torch.stack(outs)  # a dense grid: every output has its size
    ragged = tuple(d + 1 for d in grid._ragged_dims)  # the output (B, C, k_h, k_w): the grid's ragged dims, moved by C
    front = [d - 1 for d in ragged]
    perm = front + [d for d in range(3) if d not in front]
    rows = [o.permute(perm).reshape(-1, *[o.shape[d] for d in perm[len(front):]]) for o in outs]
    return wrap_values(torch.cat(rows), grid._partition, ragged)


@route(F.affine_grid)
@eager_route("{op}(): the size names the batch's ragged size by its nested int, read eagerly")
def _affine_grid(theta, size, align_corners=None):
    """``F.affine_grid`` with one affine matrix per position of a batch, ``theta`` ``(B, j, 2, 3)``
    and ``size`` ``[j, C, H, W]`` (the ragged size as dense torch's N, a static grid): the dense op
    on the packed matrices, ``(B, j, H, W, 2)``."""
    if not isinstance(theta, MJT):
        return NotImplemented
    size = list(size)
    if theta._ragged_dims != (1,) or theta.dim() != 4 or not size or extent_of(size[0]) is not theta._partition.extents[0] or any(
            isinstance(z, torch.SymInt) for z in size[1:]):
        raise StructureError(
            f"affine_grid(): expected theta (B, j, 2, 3) with size [j, C, H, W] (its ragged size first, the rest fixed), "
            f"got {describe(theta)} and {size}"
        )
    v = values_of(theta)
    out = F.affine_grid(v, [v.shape[0], *size[1:]], align_corners)
    return wrap_values(out, theta._partition, (1,))


@route(F.fold)
def _fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """``F.fold`` (col2im) per sample: blocks ``(B, C·∏k, j)`` summed back into each sample's
    image. ``output_size`` as two ints gives every image that size (a dense ``(B, C, H, W)``); as
    a batch's nested ints (``x.shape[-2:]`` of the images ``F.unfold`` cut), each image its own
    size and the result those nested ints. One dense call per sample, eager only."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 3 or input._ragged_dims != (2,):
        raise StructureError(f"fold(): expected blocks (B, C·∏kernel, j), got {describe(input)}")
    sizes = list(output_size) if isinstance(output_size, (list, tuple, torch.Size)) else [output_size] * 2
    nested = [isinstance(z, torch.SymInt) for z in sizes]
    extents = [extent_of(z) for z in sizes] if all(nested) else None
    if len(sizes) != 2 or (any(nested) and (extents is None or any(e is None for e in extents))):
        raise NotImplementedError(
            f"fold(): output_size {tuple(sizes)}: give two ints (one size for every image) or a batch's two nested ints "
            "(each image its own size) (layout torch.multi_jagged)"
        )
    return _fold_images(input, sizes, extents, kernel_size, dilation, padding, stride)


@eager_route("{op}(): one dense call per image, from host sizes")
def _fold_images(x: MJT, sizes, extents, kernel_size, dilation, padding, stride):
    hs = extents[0].host_lengths().tolist() if extents else [int(sizes[0])] * x.shape[0]
    ws = extents[1].host_lengths().tolist() if extents else [int(sizes[1])] * x.shape[0]
    outs = []
    for i, (blocks, h, w) in enumerate(zip(x.unbind(), hs, ws)):
        try:
            outs.append(F.fold(blocks[None], (h, w), kernel_size, dilation, padding, stride)[0])
        except RuntimeError as err:
            raise RuntimeError(f"fold(): sample {i} of {describe(x)} (output size {h} × {w}): {err}") from None
    if extents is None:
        return torch.stack(outs)
    rows = [o.permute(1, 2, 0).reshape(-1, o.shape[0]) for o in outs]
    return wrap_values(torch.cat(rows), partition_for(tuple(extents)), (2, 3))
