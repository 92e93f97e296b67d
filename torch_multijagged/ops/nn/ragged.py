"""nn and scan ops over ragged dims: ``layer_norm`` over a ragged ``normalized_shape``,
``cumsum``/``cumprod``/``logcumsumexp``, ``F.normalize`` and 1-d pooling over the ragged dim of ``(B, C, j0)``.

NOTE [ Ops over ragged dims in nn ]

* ``layer_norm`` whose ``normalized_shape`` covers a ragged dim (``(j0, C)`` of ``(B, j0, C)``):
  mean and biased variance per sample (per remaining coordinate) over every element it has, as
  ``torch.jagged``. Written with ``multijagged::reduce`` and its gather-back
  (``reduce_backward``), so gradients of any order and ``torch.compile`` work (``torch.jagged``'s
  backward raises). ``weight``/``bias`` would need the ragged shape: a ``ValueError`` (``torch.jagged``
  ignores them silently).
* ``cumsum``/``cumprod``/``logcumsumexp`` along any non-batch dim: eagerly dense torch's own scan
  on the packed values under dense autograd — along a static dim the values' dim, along a ragged
  dim every segment (NOTE [ Dense ops along a ragged dim ] in kernels/dense_along.py) — so values
  (its accumulation type and rounding), dtypes and gradients (every order, nans beside ``±inf``
  included) are dense's. Traced (no host sizes): Hillis–Steele scans of ``multijagged::shift``
  (NOTE [ Scans by shifting ] in compile/shift.py) combining with ``+``, ``*`` or ``logaddexp``;
  ``logcumsumexp``'s gradient there is dense torch's formula, a scan from the end
  (``_LogCumSumExp``), so its nans beside ``±inf`` are dense's.
* ``F.normalize(x, p, dim)``: ``x / max(‖x‖_p, eps)`` with the norm over ``dim`` per sample
  (the routed ``vector_norm``), gathered back to ``x``'s elements.
* Pooling (``avg_pool1d``, ``max_pool1d``, ``adaptive_*_pool1d``) over a last ragged dim of
  components ``(C, n)`` or ``(S, C, n)``: every sample pooled on its own; output lengths follow
  the dense formula per sample and may differ or be 0 (dense torch raises for an output size
  < 1; a zero-length sample pools to nothing). New lengths are new per-sample extents, built on
  the host from the host copy of the input's lengths (no device sync), so these run eagerly
  only (under ``torch.compile`` a graph break, NOTE [ Eager-only routes ] in ``_common.py``);
  ``adaptive_*_pool1d(x, 1)`` is a reduction and compiles. Adaptive pooling of few, long or
  skewed samples runs the dense kernel on each sample's view of its rows (NOTE [ Adaptive
  pooling sample by sample ] in kernels/per_image.py). Other average and adaptive windows are
  gathered from the packed rows (no padded envelope) and reduced under torch's autograd on the
  values, as dense's kernels compute: int64 sums divide truncating (an int64 result), float16 /
  bfloat16 sums divide in float32 and round once. ``max_pool1d`` runs dense's own kernel once on
  a canvas of every sample (NOTE [ Canvas ] in kernels/canvas.py, ``max_pool1d_rows``) and
  gathers the values at its indices. A max pool reads the first maximum of a window, or its
  *last* NaN where it holds one (the dense kernels' scan ``val > max || isnan(val)``, as the 2-d
  pools of ``vision/norms.py``): index and gradient go there, also for
  ``adaptive_max_pool1d(x, 1)``, whose ``max`` reduction reads the first NaN. Dtypes are dense's:
  each route first runs the dense kernel the dense call would (``max_pool1d`` without indices
  refuses integers, ``max_pool1d_with_indices`` takes them) on a small input of the dtype.
* ``torch.stft`` of waveforms ``(B, j0)``: each sample's spectrogram ``(B, F, j_frames)``, its frame
  count (dense torch's) a new extent of the same kind; one dense call per sample, eager only.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ...bridge import values_of, wrap_values
from ...compile import shift as _shift  # noqa: F401  (defines multijagged::shift)
from ...kernels import canvas as cv
from ...kernels import per_image as pim
from ...kernels import reference as ref
from ...errors import StructureError
from ...structure import extent_of, mapped_extent, partition_for
from .._table import register_multi_jagged_func
from .._common import MJT, canonical_dim, canonical_dims, describe, eager_route, equal_sizes, sample_rows, static_dims, wrap
from .._routing import _call, _needs_grad, in_place_route, route
from .. import _along as along

__all__ = ["covers_ragged", "layer_norm_ragged"]

mj = torch.ops.multijagged


# ----------------------------------------------------------------------------- shift (scans)
@register_multi_jagged_func(mj.shift.default, "x: mjt, dim: any, shift: any, fill: any")
def shift_default(func, x, dim, shift, fill):
    """NOTE [ Scans by shifting ]: along a ragged dim each row reads the row ``shift`` positions
    before it in its own segment (row stride: the product of the later ragged extents)."""
    d = canonical_dim("shift", len(x._size), dim)
    if d == 0:
        raise NotImplementedError("shift(): along the batch dim of layout torch.multi_jagged")
    v = x._values
    if d not in x._ragged_dims:
        vd = static_dims(len(x._size), x._ragged_dims).index(d) + 1
        return wrap(func(v, vd, shift, fill), x._partition, x._ragged_dims)
    k = x._ragged_dims.index(d)
    p = x._partition
    sample, coords = p.row_coords()
    sizes = p.device_sizes()
    stride = torch.ones_like(sample)
    for later in range(k + 1, p.nragged):
        stride = stride * sizes[sample, later]
    src = coords[:, k] - shift
    ok = (src >= 0) & (src < sizes[sample, k])
    rows = torch.arange(p.rows, device=v.device) - shift * stride
    g = v.index_select(0, torch.where(ok, rows, torch.zeros_like(rows)))
    ok = ok.view(-1, *([1] * (v.dim() - 1)))
    return wrap(torch.where(ok, g, torch.full_like(g, fill)), p, x._ragged_dims)


def _rounds(m) -> int:
    """Hillis–Steele rounds for extent ``m``: ⌈log₂ m⌉. A symbolic ``m`` (tracing) guards on a
    bucket (one graph per bucket, as ``kernels.reference._search_rounds``); extra rounds only
    shift past every segment's end."""
    if isinstance(m, int):
        return max(m - 1, 0).bit_length()
    for k in (4, 8, 12, 16, 20, 24, 32):
        if m <= (1 << k):
            return k
    return 62


# scan kind → (combine, fill of the rows shifted in from before a segment's start)
_SCANS = {
    "cumsum": (torch.add, 0.0),
    "cumprod": (torch.mul, 1.0),
    "logcumsumexp": (torch.logaddexp, float("-inf")),
}


def _scan(op: str, input, dim, dtype):
    d = canonical_dim(op, input.dim(), dim)
    if d == 0:
        raise NotImplementedError(
            f"{op}(): along the batch dim of layout torch.multi_jagged (samples have different shapes); "
            "scan a ragged or static dim"
        )
    if op == "logcumsumexp" and dtype is None and not (input.dtype.is_floating_point or input.dtype.is_complex):
        raise RuntimeError(f"logcumsumexp(): expected floating point or complex input, got {input.dtype}")
    if along.eager(input):
        return _dense_scan(op, input, d, dtype)
    if dtype is not None:
        input = input.to(dtype)
    elif not (input.dtype.is_floating_point or input.dtype.is_complex):
        input = input.to(torch.int64)  # dense torch's integer promotion for cumsum/cumprod
    if op == "logcumsumexp" and input.is_floating_point() and input.requires_grad:
        return _LogCumSumExp.apply(input, d)
    return _rounds_of(op, input, d)


# the fill of a scan's envelope: its combine's identity
_FILL = {"cumsum": 0, "cumprod": 1, "logcumsumexp": float("-inf")}


def _dense_scan(op: str, input: MJT, d: int, dtype) -> MJT:
    return wrap_values(scan_values(op, input, d, dtype, values_of(input)), input._partition, input._ragged_dims)


def scan_values(op: str, input: MJT, d: int, dtype, v: torch.Tensor) -> torch.Tensor:
    """The dense scan of ``input``'s values ``v`` under dense autograd (NOTE [ Dense ops along a
    ragged dim ] in kernels/dense_along.py): along a static dim the values' own dim, along a ragged
    dim every segment; eager only. ``cumprod`` pads before the segments: its backward sums
    ``output · grad`` over the cells after each one, which a trailing fill after an infinite
    product would make nan."""
    fn = getattr(torch, op)
    if op == "logcumsumexp":
        v = v if dtype is None else v.to(dtype)
        out_dtype = v.dtype
    else:
        # integers accumulate in int64, as dense
        out_dtype = dtype or (v.dtype if v.dtype.is_floating_point or v.dtype.is_complex else torch.int64)
        fn = functools.partial(fn, dtype=dtype)
    if d not in input._ragged_dims:
        return fn(v, static_dims(input.dim(), input._ragged_dims).index(d) + 1)
    if op == "cumsum" and out_dtype == (dtype or v.dtype) and (out_dtype.is_floating_point or out_dtype.is_complex) \
            and v.requires_grad and torch.is_grad_enabled():
        return _CumsumAlong.apply(v if dtype is None else v.to(dtype), input, d)
    out, = along.dense_along(fn, input, d, [v], [_FILL[op]], right=op == "cumprod", length_one=op == "cumprod",
                             fn_out=lambda t, dim, o: fn(t, dim, out=o), out_dtypes=[out_dtype])
    return out


def _reversed_cumsum(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.flip(dim).cumsum(dim).flip(dim)  # dense torch's ``cumsum`` derivative


class _CumsumAlong(torch.autograd.Function):
    """``cumsum`` of floating values ``v`` along ragged dim ``d`` of ``x``'s structure, where it
    records: aten's scan writes every segment's result into the packed buffer (``out=``, no
    ``cat``; NOTE [ Dense ops along a ragged dim ]), one node for the batch; backward dense's
    derivative, the scan from the end, per segment (differentiable again: under ``create_graph``
    its ops record). The fill after a segment in an envelope adds zeros to the reversed scan."""

    @staticmethod
    def forward(ctx, v, x, d):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.structure, ctx.d = (x._partition, x._ragged_dims), d
        out, = along.dense_along(torch.cumsum, x, d, [v], [0], fn_out=lambda t, dim, o: torch.cumsum(t, dim, out=o),
                                 out_dtypes=[v.dtype])
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None, None
        gi, = along.dense_along(_reversed_cumsum, MJT(grad.detach(), *ctx.structure), ctx.d, [grad], [0])
        return gi, None, None


def _rounds_of(op: str, input, d: int, reverse: bool = False):
    """The scan ``op`` of ``input`` along dim ``d`` (from the end with ``reverse``)."""
    combine, fill = _SCANS[op]
    m = input._partition.extents[input._ragged_dims.index(d)].max if d in input._ragged_dims else input.shape[d]
    y, s = input, -1 if reverse else 1
    for _ in range(_rounds(m)):
        shifted = _call(mj.shift.default, y, d, s, fill)
        if op == "logcumsumexp":
            # A row shifted in from before its segment's start adds no term (logaddexp(y, -inf) = y),
            # but logaddexp's second derivative there is inf / inf: such rows keep y through a where.
            valid = _call(mj.shift.default, torch.ones_like(y).detach(), d, s, 0.0) > 0
            y = torch.where(valid, combine(y, torch.where(valid, shifted, y)), y)
        else:
            y = combine(y, shifted)
        s *= 2
    return y.clone() if y is input else y


class _LogCumSumExp(torch.autograd.Function):
    """``logcumsumexp`` of a real input with dense torch's backward formula (``logcumsumexp_backward``):
    ``exp(rlcse(log g⁺ − y) + x) − exp(rlcse(log g⁻ − y) + x)``, ``rlcse`` the scan from the end
    and ``g⁺`` / ``g⁻`` the positive / negative parts of the gradient (the lowest finite value
    elsewhere). The scan's own derivative is the same where every term is finite, but its nans
    differ beside an infinite input (``[1, inf, 2]``: dense ``[1, nan, 0]``, the scan's
    ``[nan, nan, 0]``). The formula is written with the scans above, so it differentiates again."""

    @staticmethod
    def forward(ctx, input, d):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        y = _rounds_of("logcumsumexp", input, d)
        ctx.save_for_backward(input, y)
        ctx.d = d
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None
        x, y = ctx.saved_tensors
        log_abs = grad.abs().log()
        low = torch.full_like(log_abs, torch.finfo(log_abs.dtype).min)

        def part(sign):
            return (_rounds_of("logcumsumexp", torch.where(sign, log_abs, low) - y, ctx.d, reverse=True) + x).exp()

        return part(grad > 0) - part(grad < 0), None


def _scan_route(op: str):
    def routed(input, dim, *, dtype=None, out=None):
        if not isinstance(input, MJT) or out is not None or not isinstance(dim, int):
            return NotImplemented
        return _scan(op, input, dim, dtype)

    return routed


route(torch.cumsum, torch.Tensor.cumsum)(_scan_route("cumsum"))
route(torch.cumprod, torch.Tensor.cumprod)(_scan_route("cumprod"))
route(torch.logcumsumexp, torch.Tensor.logcumsumexp)(_scan_route("logcumsumexp"))

def _scan_in_place(name: str):
    """``x.cumsum_`` / ``x.cumprod_``: the out-of-place scan written back (``in_place_route``),
    refusing what the dense in-place scan refuses: a ``dtype=`` other than ``x``'s, and bool (the
    out-of-place scan promotes it to int64; in place there is no bool kernel)."""
    write = in_place_route(name)

    def routed(input, *args, **kwargs):
        if isinstance(input, MJT):
            dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
            if dtype is not None and dtype != input.dtype:
                raise RuntimeError(f"{name}(): bad in-place call: input tensor dtype {input.dtype} and output tensor "
                                   f"dtype {dtype} should match")
            if input.dtype == torch.bool:
                raise NotImplementedError(f"{name}(): not implemented for 'Bool' (as dense torch's in-place scan)")
        return write(input, *args, **kwargs)

    return routed


route(torch.Tensor.cumsum_)(_scan_in_place("cumsum_"))
route(torch.Tensor.cumprod_)(_scan_in_place("cumprod_"))


# ----------------------------------------------------------------------------- norms
def _rows(r, like, dims):
    """A keepdim reduction result ``r`` gathered back to ``like``'s elements (differentiable in
    ``r``): a dense ``(B, 1, …)`` result would broadcast over the batch, and the double backward
    of that broadcast expands a dense tensor to nested-int sizes."""
    return _call(mj.reduce_backward.default, r, like.detach(), r.detach(), "sum", dims, True)


def covers_ragged(x: MJT, normalized_shape) -> bool:
    """Whether a ``layer_norm`` of ``x`` over ``normalized_shape`` normalizes a ragged dim."""
    n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return any(d >= len(x._size) - n for d in x._ragged_dims)


def _ragged_norm_dims(op: str, input: MJT, normalized_shape, affine: bool) -> list[int]:
    """The dims a ``layer_norm`` / ``rms_norm`` over ``normalized_shape`` (which holds a ragged
    dim) normalizes, after dense torch's checks and ours (no affine: no dense tensor has a ragged
    shape)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    ndim = input.dim()
    if len(shape) >= ndim:
        raise RuntimeError(f"{op}(): not supported when normalizing over the batch dimension for layout torch.multi_jagged")
    dims = list(range(ndim - len(shape), ndim))
    if any(input.shape[d] != s for d, s in zip(dims, shape)):
        raise ValueError(
            f"{op}(): expected normalized_shape to be the trailing sizes of input {describe(input)}, "
            f"got {list(shape)}"
        )
    if affine:
        raise ValueError(
            f"{op}(): expected weight and bias to be None when normalized_shape {list(shape)} includes a "
            "ragged dim (no dense tensor has a ragged shape; use elementwise_affine=False and apply an affine "
            "over the static dims after the norm), for layout torch.multi_jagged"
        )
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        raise RuntimeError(f"{op}(): expected a floating point input, got {input.dtype}")
    return dims


def _low(input: MJT):
    """float16 / bfloat16 inputs run in float32 and round once, as dense torch's CPU norms do."""
    return input.dtype if input.dtype in (torch.float16, torch.bfloat16) else None


def layer_norm_ragged(input: MJT, normalized_shape, weight, bias, eps):
    dims = _ragged_norm_dims("layer_norm", input, normalized_shape, weight is not None or bias is not None)
    low = _low(input)
    x = input.float() if low is not None else input
    centred = x - _rows(_call(mj.reduce.default, x, "mean", dims, True), x, dims)
    var = _call(mj.reduce.default, centred * centred, "mean", dims, True)
    out = centred * _rows((var + eps).rsqrt(), x, dims)
    return out.to(low) if low is not None else out


def rms_norm_ragged(input: MJT, normalized_shape, weight, eps):
    """``F.rms_norm`` over dims that hold a ragged one: each sample's elements over its own extent,
    ``x · rsqrt(mean(x²) + eps)`` (``eps`` None: the compute dtype's machine epsilon, float32's for
    float16 / bfloat16, as dense torch)."""
    dims = _ragged_norm_dims("rms_norm", input, normalized_shape, weight is not None)
    low = _low(input)
    x = input.float() if low is not None else input
    eps = torch.finfo(x.dtype).eps if eps is None else eps  # dense's: the compute dtype's epsilon
    ms = _call(mj.reduce.default, x * x, "mean", dims, True)
    out = x * _rows((ms + eps).rsqrt(), x, dims)
    return out.to(low) if low is not None else out


@route(F.normalize)
def _normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = canonical_dims("normalize", input.dim(), dims)
    if 0 in dims:
        raise NotImplementedError(
            f"normalize(): over the batch dim of {describe(input)} for layout torch.multi_jagged "
            "(samples have different shapes); normalize over ragged or static dims"
        )
    norm = torch.linalg.vector_norm(input, p, dims, keepdim=True)
    return input / _rows(norm.clamp_min(eps), input, dims)


# ----------------------------------------------------------------------------- pooling
def _one(op: str, v, name: str) -> int:
    if isinstance(v, (list, tuple)):
        if len(v) != 1:
            raise ValueError(f"{op}(): expected {name} to be a single int, got {v}")
        v = v[0]
    return int(v)


def _pooled(op: str, input) -> str | None:
    """``"ragged"`` (last dim the only ragged one), ``"static"`` (last dim static: each packed
    row pools on its own) or an error."""
    n = input.dim()
    if input._ragged_dims == (n - 1,) and n in (3, 4):
        return "ragged"
    if (n - 1) not in input._ragged_dims and input._values.dim() in (2, 3):
        return "static"
    raise NotImplementedError(
        f"{op}(): expected components (C, n) or (S, C, n) whose last dim is the only ragged one, or a static "
        f"last dim, got {describe(input)} for layout torch.multi_jagged"
    )


_WHY = (
    "{op}(): pooling makes new per-sample lengths (a new ragged extent, built on the host), which torch.compile "
    "cannot trace for layout torch.multi_jagged: a graph break (adaptive pooling to size 1, a reduction, compiles)"
)


def _declined(input, *args, **kwargs) -> bool:
    """A call the route declines (a dense input: ``NotImplemented``) is no graph break."""
    return not isinstance(input, MJT)


def _reduces(input, output_size, *args, **kwargs) -> bool:
    """``adaptive_*_pool1d`` to size 1 over the ragged last dim is a reduction and stays in the
    graph; so do calls that the route declines or refuses (its own error, raised while tracing)."""
    if not isinstance(input, MJT):
        return True
    try:
        return _pooled("", input) == "ragged" and _one("", output_size, "output_size") == 1
    except (ValueError, NotImplementedError, TypeError):
        return True


def _values(x: MJT):
    return values_of(x) if _needs_grad(x) else x._values


def _out(v, partition, ragged_dims, grad: bool):
    return wrap_values(v, partition, ragged_dims) if grad else wrap(v, partition, ragged_dims)


def _windows(x: MJT, out_part, starts_fn, k: int, step: int, limit_fn=None):
    """Gathered windows ``(T_out, k, *static)`` of x's rows, their validity mask ``(T_out, k)``
    and positions: window of out row r (sample i, local position o) reads positions
    ``starts_fn(o, n_i) + t·step``, valid inside ``[0, n_i)`` (and below ``limit_fn(o, n_i)``)."""
    sample, coords = out_part.row_coords()
    n = x._partition.extents[0].lengths()[sample]
    start = starts_fn(coords[:, 0], n)
    pos = start.unsqueeze(1) + torch.arange(k, device=n.device) * step
    ok = (pos >= 0) & (pos < n.unsqueeze(1))
    if limit_fn is not None:
        ok = ok & (pos < limit_fn(coords[:, 0], n).unsqueeze(1))
    rows = torch.where(ok, x._partition.offsets[sample].unsqueeze(1) + pos, torch.zeros_like(pos))
    return rows, ok, pos, start, n


def _gather(v, rows, ok):
    if v.shape[0] == 0 and rows.numel():
        # no element in the batch: every window is empty (``ok`` all False), its rows point at a
        # row that does not exist; read a zero row instead (still a function of ``v``)
        v = v.sum(0, keepdim=True, dtype=v.dtype)
    w = v.index_select(0, rows.reshape(-1)).view(*rows.shape, *v.shape[1:])
    return w, ok.view(*ok.shape, *([1] * (v.dim() - 1)))


def _window_arg(masked: torch.Tensor) -> torch.Tensor:
    """``(N, 1, *static)``: the slot of every window ``(N, k, *static)`` that dense max pooling
    reads — its last NaN, else its first maximum (NOTE [ Ops over ragged dims in nn ])."""
    w = masked.detach()
    nan = w.isnan()
    last_nan = (w.shape[1] - 1) - nan.flip(1).to(torch.uint8).argmax(1, keepdim=True)
    return torch.where(nan.any(1, keepdim=True), last_nan, w.argmax(1, keepdim=True))


def _out_partition(x: MJT, window: cv.Window):
    """The pooled partition: dense torch's ``pooling_output_shape`` per sample, clamped at 0 (a
    zero-length sample pools to nothing), as ``mapped_extent`` keyed by the window's size rule
    (``Window.rule``, as the convolutions and 2-d pools of spatial.py): two poolings, or a pooling
    and a strided ``conv1d``, of one geometry on one extent share the output's nested int (they
    can be added, also in a compiled region after the graph break), and a pooling that keeps
    every length keeps the input's."""
    e = x._partition.extents[0]
    # SYNC: none — output lengths from the host copy of the input's lengths
    out = mapped_extent(e, window.rule(), lambda n: torch.where(n == 0, n, window.out_len(n).clamp(min=0)))
    return x._partition if out is e else partition_for([out])


def _avg_pool1d_ragged(x, k, stride, pad, ceil_mode, count_include_pad):
    part = _out_partition(x, cv.Window(k, stride, pad, pad, 1, ceil_mode=bool(ceil_mode)))
    rows, ok, pos, start, n = _windows(x, part, lambda o, n: o * stride - pad, k, 1)
    v = _values(x)
    w, m = _gather(v, rows, ok)
    end = torch.minimum(start + k, n + pad)
    if count_include_pad:
        div = end - start
    else:
        div = torch.minimum(end, n) - start.clamp_min(0)
    div = div.clamp_min(1).view(-1, *([1] * (v.dim() - 1)))
    return _out(_window_mean(w, m, div), part, x._ragged_dims, v.requires_grad)


def _window_mean(w: torch.Tensor, m: torch.Tensor, div: torch.Tensor) -> torch.Tensor:
    """The sum of every window's valid members over ``div``, as dense torch's average pools
    compute it: integers sum in int64 and divide truncating (``avg_pool1d`` of int64 is int64),
    float16 / bfloat16 sum and divide in float32 and round once."""
    total = torch.where(m, w, torch.zeros_like(w))
    if not (w.is_floating_point() or w.is_complex()):
        return torch.div(total.sum(1), div, rounding_mode="trunc").to(w.dtype)
    if w.dtype in (torch.float16, torch.bfloat16):
        return (total.sum(1, dtype=torch.float32) / div.to(torch.float32)).to(w.dtype)
    return total.sum(1) / div.to(w.dtype)


def _max_pool1d_ragged(x, k, stride, pad, dilation, ceil_mode, return_indices):
    """Max pooling along the ragged last dim on a canvas (NOTE [ Canvas ] in kernels/canvas.py):
    dense ``max_pool1d_with_indices`` once over every sample, so its index rules (the first
    maximum of a window, or its last NaN) hold by construction; with autograd the values are
    gathered from the packed rows at those indices (``canvas.max_pool1d_rows``)."""
    window = cv.Window(k, stride, pad, pad, dilation, ceil_mode=bool(ceil_mode))
    part = _out_partition(x, window)
    v = _values(x)
    flat = v.reshape(v.shape[0], math.prod(v.shape[1:]))  # (T, S·C): every channel pools on its own
    # the plan of a conv1d of the same window over this extent (ops/vision/conv.py, ``_plan``)
    key = ("canvas", 1, (window,), x._ragged_dims, ())
    plan = x._partition.derived(key, lambda q: cv.plan_canvas(q.extents[0].host_lengths().unsqueeze(1), (window,), v.device))
    low = float("-inf") if v.is_floating_point() else float(torch.iinfo(v.dtype).min)
    out, idx = cv.max_pool1d_rows(flat, plan, window, low, return_indices)
    if v.requires_grad and not v.shape[0]:
        out = out + flat.sum() * 0  # no row at all: still on v's graph
    shape = (part.rows, *v.shape[1:])
    out = _out(out.view(shape), part, x._ragged_dims, v.requires_grad)
    return (out, wrap(idx.view(shape), part, x._ragged_dims)) if return_indices else out


def _static_last(x, fn, two: bool = False):
    """Pooling a static last dim: every packed row pools on its own (components ``(n, C)``
    become dense ``(C'=n, L=C)`` inputs), so the dense op on the values is exact."""
    v = _values(x)
    if v.shape[0]:
        r = fn(v)
    else:  # no row (an empty batch, or every sample empty): the dense op refuses an empty batch of rows
        r = fn(v.new_zeros((1, *v.shape[1:])))
        r = tuple(t[:0] for t in r) if two else r[:0] + v.sum() * 0
    if two:
        return _out(r[0], x._partition, x._ragged_dims, v.requires_grad), wrap(r[1], x._partition, x._ragged_dims)
    return _out(r, x._partition, x._ragged_dims, v.requires_grad)


@route(torch.avg_pool1d)
@eager_route(_WHY, traceable=_declined)
def _avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    if not isinstance(input, MJT):
        return NotImplemented
    op = "avg_pool1d"
    k = _one(op, kernel_size, "kernel_size")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _one(op, stride, "stride")
    p = _one(op, padding, "padding")
    # dense torch's own argument and dtype checks, on a probe long enough for one window
    torch.avg_pool1d(input._values.new_zeros(1, 1, k), k, s, p, ceil_mode, count_include_pad)
    if _pooled(op, input) == "static":
        return _static_last(input, lambda v: torch.avg_pool1d(v, k, s, p, ceil_mode, count_include_pad))
    return _avg_pool1d_ragged(input, k, s, p, ceil_mode, count_include_pad)


def _max_pool1d_impl(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    op = "max_pool1d"
    k = _one(op, kernel_size, "kernel_size")
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else _one(op, stride, "stride")
    p, d = _one(op, padding, "padding"), _one(op, dilation, "dilation")
    # dense torch's own argument and dtype checks, of the kernel the dense call runs (``max_pool1d``
    # refuses integers, ``max_pool1d_with_indices`` takes them)
    dense = torch.max_pool1d_with_indices if return_indices else torch.max_pool1d
    dense(input._values.new_zeros(1, 1, d * (k - 1) + 1), k, s, p, d, ceil_mode)
    if _pooled(op, input) == "static":
        out, idx = _static_last(input, lambda v: torch.max_pool1d_with_indices(v, k, s, p, d, ceil_mode), two=True)
        return (out, idx) if return_indices else out
    return _max_pool1d_ragged(input, k, s, p, d, ceil_mode, return_indices)


def _max_pool1d_route(always_indices: bool):
    @eager_route(_WHY, traceable=_declined)
    def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if not isinstance(input, MJT):
            return NotImplemented
        return _max_pool1d_impl(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices or always_indices)

    return max_pool1d


route(F.max_pool1d, F._max_pool1d, torch.max_pool1d)(_max_pool1d_route(False))
route(F.max_pool1d_with_indices, torch.max_pool1d_with_indices)(_max_pool1d_route(True))


def _adaptive_windows(x: MJT, size: int):
    """Dense torch's adaptive windows ``[⌊o·n/L⌋, ⌈(o+1)·n/L⌉)`` of every (sample, o): out rows
    are B·L (a dense result); the widest window is ⌈max n / L⌉ + 1."""
    b = x._partition.batch
    out_part = partition_for([equal_sizes(x, size)])
    k = -(-int(x._partition.extents[0].max) // size) + 1
    rows, ok, pos, start, n = _windows(
        x, out_part, lambda o, n: torch.div(o * n, size, rounding_mode="floor"), k, 1,
        limit_fn=lambda o, n: -torch.div(-(o + 1) * n, size, rounding_mode="floor"),
    )
    return rows, ok, pos, b


def _signals(x: MJT, size: int, average: bool):
    """Each sample's input to the dense adaptive pool (``(1, C, n)`` or ``(S, C, n)``, a view of
    its rows; ``None`` for a sample without elements) where pooling sample by sample is the
    cheaper path, else ``None`` (NOTE [ Adaptive pooling sample by sample ] in
    ``kernels/per_image.py``: the gather reads ``⌈max n / size⌉ + 1`` rows per window, so a
    long sample makes every sample's windows that wide)."""
    p = x._partition
    lead = tuple(x.shape[1:-1])
    channels = math.prod(lead)
    if channels == 0:
        return [None] * p.batch  # every output empty (dense max pooling refuses 0 channels)
    _, lengths = sample_rows(p)  # SYNC: none — host sizes
    k = -(-max(lengths, default=0) // size) + 1
    if not pim.adaptive_signals_each_applies(p.batch, sum(lengths), p.batch * size * k, channels, average):
        return None
    comps = ref.unpack_components(_values(x), p.host_sizes(), x._ragged_dims)
    return [None if n == 0 else c.unsqueeze(0) if len(lead) == 1 else c.flatten(0, len(lead) - 2)
            for c, n in zip(comps, lengths)]


def _adaptive_probe(fn, x: MJT, size: int) -> None:
    """Dense torch's own dtype and argument checks: its adaptive pool on a one-channel input of
    ``x``'s dtype (its kernels refuse integers, bool and, but for the mean of size 1, complex)."""
    fn(torch.zeros((1, 1, max(size, 1)), dtype=x.dtype, device=x.device), size)


def _to_dense(v, b: int, size: int):
    """Out rows ``(B·L, *static)`` as dense ``(B, *static, L)``."""
    return v.reshape(b, size, *v.shape[1:]).movedim(1, -1)


@route(torch.adaptive_avg_pool1d)
@eager_route(_WHY, traceable=_reduces)
def _adaptive_avg_pool1d(input, output_size):
    if not isinstance(input, MJT):
        return NotImplemented
    op = "adaptive_avg_pool1d"
    size = _one(op, output_size, "output_size")
    _adaptive_probe(torch.adaptive_avg_pool1d, input, size)
    kind = _pooled(op, input)
    if kind == "ragged" and size == 1:
        return input.mean(-1, keepdim=True)  # a reduction: dense (B, *static, 1); compiles
    if kind == "static":
        return _static_last(input, lambda v: torch.adaptive_avg_pool1d(v, size))
    parts = _signals(input, size, True)
    if parts is not None:
        return pim.adaptive_pool_each(parts, lambda p: torch.adaptive_avg_pool1d(p, size), (*input.shape[1:-1], size),
                                      float("nan"), input.dtype, input.device, anchor=lambda: _values(input))
    rows, ok, _, b = _adaptive_windows(input, size)
    w, m = _gather(_values(input), rows, ok)
    return _to_dense(_window_mean(w, m, ok.sum(1).view(-1, *([1] * (w.dim() - 2)))), b, size)


def _adaptive_max(input, output_size, return_indices):
    op = "adaptive_max_pool1d"
    size = _one(op, output_size, "output_size")
    _adaptive_probe(torch.adaptive_max_pool1d, input, size)
    kind = _pooled(op, input)
    if kind == "ragged" and size == 1:
        out, idx = torch.max(input, -1, keepdim=True)  # the first maximum takes the gradient; compiles
        if input.is_floating_point():
            out, idx = _last_nan_wins(input, out, idx)
        # a sample without elements pools to -inf, as for any other output size (max gives the
        # dtype's lowest value there)
        empty = input._partition.extents[0].lengths() == 0
        out = out.masked_fill(empty.view(-1, *([1] * (out.dim() - 1))), float("-inf"))
        return (out, idx) if return_indices else out
    if kind == "static":
        out, idx = _static_last(input, lambda v: torch.adaptive_max_pool1d(v, size), two=True)
        return (out, idx) if return_indices else out
    parts = _signals(input, size, False)
    if parts is not None:
        out, idx = pim.adaptive_pool_each(parts, lambda p: torch.adaptive_max_pool1d(p, size), (*input.shape[1:-1], size),
                                          float("-inf"), input.dtype, input.device, indices=True,
                                          anchor=lambda: _values(input))
        return (out, idx) if return_indices else out
    rows, ok, pos, b = _adaptive_windows(input, size)
    v = _values(input)
    w, m = _gather(v, rows, ok)
    masked = torch.where(m, w, torch.full_like(w, float("-inf")))
    arg = _window_arg(masked)
    out = _to_dense(masked.gather(1, arg).squeeze(1), b, size)
    idx = _to_dense(pos.view(*pos.shape, *([1] * (v.dim() - 1))).expand_as(w).gather(1, arg).squeeze(1), b, size)
    return (out, idx) if return_indices else out


def _last_nan_wins(x: MJT, out: torch.Tensor, idx: torch.Tensor):
    """``max(x, -1, keepdim=True)``'s ``(out, idx)`` with dense pooling's rule where a column
    holds a NaN: its last NaN (``max`` reads the first) gives the index and takes the gradient.
    Segment reductions on the packed rows, so it compiles."""
    p = x._partition
    v = _values(x)
    _, coords = p.row_coords()
    pos = coords[:, 0].view(-1, *([1] * (v.dim() - 1))).expand(v.shape)
    last = ref.segment_reduce(torch.where(v.detach().isnan(), pos, -1), p.row_sample(), p.batch, "amax", empty=-1)
    has = last >= 0  # (B, *static)
    row = torch.where(has, p.offsets[:-1].view(-1, *([1] * (v.dim() - 1))) + last, 0)
    if v.shape[0] == 0:  # no element in the batch (so no NaN): read a zero row, still a function of v
        v = v.sum(0, keepdim=True, dtype=v.dtype)
    at = v.gather(0, row)
    return torch.where(has.unsqueeze(-1), at.unsqueeze(-1), out), torch.where(has.unsqueeze(-1), last.unsqueeze(-1), idx)


def _adaptive_max_route(always_indices: bool):
    @eager_route(_WHY, traceable=_reduces)
    def adaptive_max_pool1d(input, output_size, return_indices=False):
        if not isinstance(input, MJT):
            return NotImplemented
        return _adaptive_max(input, output_size, return_indices or always_indices)

    return adaptive_max_pool1d


route(F.adaptive_max_pool1d, F._adaptive_max_pool1d)(_adaptive_max_route(False))
route(F.adaptive_max_pool1d_with_indices, torch.adaptive_max_pool1d)(_adaptive_max_route(True))


# ----------------------------------------------------------------------------- STFT of waveforms
@route(torch.stft, torch.Tensor.stft)
def _stft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, pad_mode="reflect",
          normalized=False, onesided=None, return_complex=None, align_to_window=None):
    """``torch.stft`` of waveforms ``(B, j0)``: each sample's own spectrogram, ``(B, F, j_frames)``
    with its frame count a new ragged size (an empty waveform has no frame, where dense torch
    refuses it). One dense call per sample."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 2 or input._ragged_dims != (1,):
        raise StructureError(f"stft(): expected waveforms (B, j0), got {describe(input)}")
    kw = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center, pad_mode=pad_mode,
              normalized=normalized, onesided=onesided, return_complex=return_complex, align_to_window=align_to_window)
    return _stft_samples(input, kw)


@eager_route("{op}(): each waveform's frame count is a new ragged size, built from host lengths")
def _stft_samples(x: MJT, kw: dict) -> MJT:
    hop = kw["hop_length"] or kw["n_fft"] // 4
    e = x._partition.extents[0]
    parts = []
    counts = []
    for i, w in enumerate(x.unbind()):
        if w.shape[0] == 0:
            counts.append(0)
            continue
        try:
            parts.append(torch.stft(w, **kw).transpose(0, 1))  # (frames, F, …)
        except RuntimeError as err:
            raise RuntimeError(f"stft(): sample {i} of {describe(x)} (length {w.shape[0]}): {err}") from None
        counts.append(parts[-1].shape[0])
    # the frame counts dense torch gave each waveform (they depend on every framing argument: an odd
    # ``n_fft``'s centring pads ``n_fft - 1``, ``align_to_window`` shifts the frames), under a key of all of them
    key = ("stft", kw["n_fft"], hop, kw["win_length"], bool(kw["center"]), kw["align_to_window"])
    frames = mapped_extent(e, key, lambda n: torch.tensor(counts, dtype=n.dtype))
    if not parts:  # no frame at all: the width from a waveform of n_fft ones
        probe = torch.stft(torch.ones(kw["n_fft"], dtype=x.dtype, device=x.device), **kw).transpose(0, 1)
        values = probe[:0] + values_of(x).sum() * 0
    else:
        values = torch.cat(parts)
    return wrap_values(values, partition_for((frames,)), (2,))


def _istft_lengths(frames: torch.Tensor, n_fft: int, hop: int, center: bool) -> torch.Tensor:
    """Samples of the signals ``torch.istft`` rebuilds from ``frames`` frames without ``length``
    (dense torch's count; 0 for no frame)."""
    n = n_fft + hop * (frames - 1) - (2 * (n_fft // 2) if center else 0)
    return torch.where(frames > 0, n.clamp_min(0), torch.zeros_like(frames))


@route(torch.istft, torch.Tensor.istft)
def _istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False, onesided=None,
           length=None, return_complex=False):
    """``torch.istft`` of spectrograms ``(B, F, j_frames)``: each sample's own signal, ``(B, j)``.
    ``length`` may be the nested int of the waveforms (``x.shape[1]``): each signal then has its
    waveform's length and the result that nested int (``stft`` → ``istft`` round trips); without
    it, dense torch's length per sample (a new ragged size). One dense call per sample."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 3 or input._ragged_dims != (2,):
        raise StructureError(f"istft(): expected spectrograms (B, F, j_frames), got {describe(input)}")
    kw = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center,
              normalized=normalized, onesided=onesided, return_complex=return_complex)
    return _istft_samples(input, kw, length)


@eager_route("{op}(): each signal's length is a new ragged size, built from host lengths")
def _istft_samples(x: MJT, kw: dict, length) -> MJT:
    hop = kw["hop_length"] or kw["n_fft"] // 4
    if isinstance(length, torch.SymInt):
        out = extent_of(length)
        if out is None or out.batch != x._partition.batch:
            raise StructureError(
                f"istft(): expected length to be the nested int of a ragged dim of this batch's waveforms, got {length}"
            )
        lengths = out.host_lengths().tolist()  # SYNC: none — host lengths
    elif length is None:
        out = mapped_extent(x._partition.extents[0], ("istft", kw["n_fft"], hop, bool(kw["center"])),
                            lambda n: _istft_lengths(n, kw["n_fft"], hop, bool(kw["center"])))
        lengths = [None] * x._partition.batch
    else:
        parts = [torch.istft(s, length=int(length), **kw) for s in x.unbind()]
        return torch.stack(parts)  # one length for every sample: a dense (B, length), as dense torch's
    parts = []
    for i, (s, n) in enumerate(zip(x.unbind(), lengths)):
        if s.shape[-1] == 0:
            if n:
                raise RuntimeError(f"istft(): sample {i} of {describe(x)} has no frame to rebuild {n} samples from")
            continue
        try:
            parts.append(torch.istft(s, length=n, **kw))
        except RuntimeError as err:
            raise RuntimeError(f"istft(): sample {i} of {describe(x)} ({s.shape[-1]} frames): {err}") from None
    if not parts:
        dtype = torch.empty(0, dtype=x.dtype).real.dtype if not kw["return_complex"] else x.dtype
        values = values_of(x).real.sum().to(dtype) * 0 + torch.zeros(0, dtype=dtype, device=x.device)
    else:
        values = torch.cat(parts)
    return wrap_values(values, partition_for((out,)), (1,))
