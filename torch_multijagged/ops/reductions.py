"""Reductions and normalisations over static and ragged dims.

NOTE [ Reducing ragged dims ]

Reducing a set of ragged dims maps every packed row to its row in the sub-partition that keeps
the other ragged dims (``map_to_sub``), and scatter-reduces into it (``segment_reduce``). A pair
built from singles recorded the singles' partition as that sub-partition, so
``pair.sum(dim=-2)`` comes back with the singles' own partition and nested int. Reducing every
ragged dim leaves one row per sample: the result is a dense ``(B, …)`` tensor, as ``torch.jagged``
returns for a sum over its ragged dim. Reducing the batch dim requires reducing every ragged dim
with it (a global reduction over the listed dims), again as ``torch.jagged`` does.
"""

from __future__ import annotations

import torch

from ..compile import library  # noqa: F401  (defines multijagged::mean_scale)
from ..kernels import reference as ref
from . import op_name, register_multi_jagged_func
from ._common import MJT, canonical_dim, describe, map_to_sub, static_dims, wrap

aten = torch.ops.aten
mj = torch.ops.multijagged


def _split_dims(func, x: MJT, dims):
    """Canonical reduced dims → (batch?, ragged positions reduced, static values dims)."""
    ndim = len(x._size)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = range(ndim)
    elif isinstance(dims, int):
        dims = [dims]
    dims = sorted({canonical_dim(op_name(func), ndim, d) for d in dims})
    stat = static_dims(ndim, x._ragged_dims)
    batch = 0 in dims
    red_r = tuple(k for k, d in enumerate(x._ragged_dims) if d in dims)
    vdims = [stat.index(d) + 1 for d in dims if d in stat]
    if batch and len(red_r) != len(x._ragged_dims):
        raise NotImplementedError(
            f"{op_name(func)}(): reducing the batch dim of {describe(x)} requires reducing all its ragged dims too"
        )
    return dims, batch, red_r, vdims


def _reduce_values(v: torch.Tensor, vdims, kind: str, **kw) -> torch.Tensor:
    if not vdims:
        return v
    if kind == "sum":
        return v.sum(vdims, keepdim=True, **kw)
    return getattr(v, kind)(vdims, keepdim=True)


def _finish(x: MJT, v: torch.Tensor, sub, dims, red_r, keepdim: bool):
    """``v``: (rows of ``sub``, *static of x with reduced dims kept as 1). Shape the output."""
    ndim = len(x._size)
    kept_r = [d for k, d in enumerate(x._ragged_dims) if k not in red_r]
    # insert size-1 dims where reduced ragged dims sit (among the non-kept-ragged dims)
    non_kept = [d for d in range(1, ndim) if d not in kept_r]
    red_ragged_dims = {x._ragged_dims[k] for k in red_r}
    for i, d in enumerate(non_kept):
        if d in red_ragged_dims:
            v = v.unsqueeze(i + 1)
    out_ragged = tuple(kept_r)
    if not keepdim:
        drop = [i + 1 for i, d in enumerate(non_kept) if d in dims]
        v = v.squeeze(drop) if drop else v
        out_ragged = tuple(d - sum(1 for e in dims if e < d) for d in kept_r)
    if not kept_r:
        return v  # dense (B, …): one row per sample
    return wrap(v, sub, out_ragged)


def _reduce(func, x: MJT, dims, keepdim: bool, kind: str, **kw):
    dims, batch, red_r, vdims = _split_dims(func, x, dims)
    v = x._values
    if batch:
        # Global over batch, all ragged dims and the listed static dims: a dense result.
        out = v.sum([0] + vdims, **kw) if kind == "sum" else getattr(v, kind)([0] + vdims)
        if keepdim:
            out = out.reshape(*[1 if d in dims else s for d, s in enumerate(x.shape)])
        return out
    v = _reduce_values(v, vdims, kind, **kw)
    if not red_r:
        sub = x._partition
    else:
        keep = tuple(k for k in range(len(x._ragged_dims)) if k not in red_r)
        index, sub = map_to_sub(x._partition, keep)
        v = ref.segment_reduce(v, index, sub.rows, {"sum": "sum", "amax": "amax", "amin": "amin"}[kind])
    return _finish(x, v, sub, dims, red_r, keepdim)


@register_multi_jagged_func(aten.sum.dim_IntList, "self: mjt, dim: any?, keepdim: any?, dtype: any?")
def sum_dim_IntList(func, x, dim=None, keepdim=False, dtype=None):
    return _reduce(func, x, dim, keepdim, "sum", **({"dtype": dtype} if dtype is not None else {}))


@register_multi_jagged_func(aten.sum.default, "self: mjt")
def sum_default(func, x, dtype=None):
    return x._values.sum(dtype=dtype)


@register_multi_jagged_func(aten.amax.default, "self: mjt, dim: any?, keepdim: any?")
def amax_default(func, x, dim=(), keepdim=False):
    return _reduce(func, x, dim, keepdim, "amax")


@register_multi_jagged_func(aten.amin.default, "self: mjt, dim: any?, keepdim: any?")
def amin_default(func, x, dim=(), keepdim=False):
    return _reduce(func, x, dim, keepdim, "amin")


def _inv_counts(x: MJT, red_r, vdims, out):
    """1 / (number of elements reduced into each output element), broadcastable to ``out``'s
    values (or to the dense ``out``)."""
    n = 1
    for vd in vdims:
        n *= x._values.shape[vd]
    keep = tuple(k for k in range(len(x._ragged_dims)) if k not in red_r)
    _, sub = map_to_sub(x._partition, keep)
    sample = map_to_sub(sub, ())[0] if keep else torch.arange(sub.rows, device=x._values.device)
    count = torch.ones_like(sample)
    for k in red_r:
        count = count * x._partition.extents[k].lengths()[sample]
    vals = out._values if isinstance(out, MJT) else out
    inv = (1.0 / (count * n).to(vals.dtype))
    return inv.reshape(-1, *([1] * (vals.dim() - 1)))


@register_multi_jagged_func(aten.mean.dim, "self: mjt, dim: any?, keepdim: any?, dtype: any?")
def mean_dim(func, x, dim=None, keepdim=False, dtype=None):
    dims, batch, red_r, vdims = _split_dims(func, x, dim)
    if batch:
        v = x._values if dtype is None else x._values.to(dtype)
        out = v.mean([0] + vdims)
        if keepdim:
            out = out.reshape(*[1 if d in dims else s for d, s in enumerate(x.shape)])
        return out
    if not red_r:
        v = x._values.mean(vdims, keepdim=True, dtype=dtype)
        return _finish(x, v, x._partition, dims, red_r, keepdim)
    out = sum_dim_IntList(aten.sum.dim_IntList, x, dim, keepdim, dtype)
    inv = _inv_counts(x, red_r, vdims, out)
    if isinstance(out, MJT):
        return wrap(out._values * inv, out._partition, out._ragged_dims)
    return out * inv


@register_multi_jagged_func(mj.mean_scale.default, "x: mjt, dim: any, keepdim: any")
def mean_scale_default(func, x, dim, keepdim):
    """``1 / count`` shaped like ``x.sum(dim, keepdim)``: the route for ``mean`` over ragged dims
    multiplies by it, since aten's ``mean`` backward divides by the (nested int) size."""
    dims, batch, red_r, vdims = _split_dims(func, x, dim)
    if batch:
        n = x._values.shape[0]
        for vd in vdims:
            n = n * x._values.shape[vd]
        shape = [1 if d in dims else s for d, s in enumerate(x.shape)] if keepdim else [
            s for d, s in enumerate(x.shape) if d not in dims
        ]
        return x._values.new_ones(shape) / n
    if not red_r:
        raise AssertionError("mean_scale is only routed for reductions over ragged dims")
    keep = tuple(k for k in range(len(x._ragged_dims)) if k not in red_r)
    _, sub = map_to_sub(x._partition, keep)
    ones = x._values.new_ones(sub.rows, *[1 if i + 1 in vdims else s for i, s in enumerate(x._values.shape[1:])])
    shaped = _finish(x, ones, sub, dims, red_r, keepdim)
    inv = _inv_counts(x, red_r, vdims, shaped)
    if isinstance(shaped, MJT):
        return wrap(shaped._values * inv, shaped._partition, shaped._ragged_dims)
    return shaped * inv


@register_multi_jagged_func(aten.mean.default, "self: mjt")
def mean_default(func, x, dtype=None):
    return x._values.mean(dtype=dtype)


def _softmax_common(func, x, dim, log):
    d = canonical_dim(op_name(func), len(x._size), dim)
    if d == 0:
        raise ValueError(f"{op_name(func)}(): softmax over the batch dim of {describe(x)} is not supported")
    if d in x._ragged_dims:
        k = x._ragged_dims.index(d)
        keep = tuple(i for i in range(len(x._ragged_dims)) if i != k)
        index, sub = map_to_sub(x._partition, keep)
        return d, index, sub
    return d, None, None


@register_multi_jagged_func([aten._softmax.default, aten._log_softmax.default], "self: mjt, dim: any, half_to_float: any")
def _softmax_default(func, x, dim, half_to_float):
    log = func is aten._log_softmax.default
    d, index, sub = _softmax_common(func, x, dim, log)
    if index is None:
        vd = static_dims(len(x._size), x._ragged_dims).index(d) + 1
        return wrap(func(x._values, vd, half_to_float), x._partition, x._ragged_dims)
    return wrap(ref.segment_softmax(x._values, index, sub.rows, log=log), x._partition, x._ragged_dims)


@register_multi_jagged_func(
    [aten._softmax_backward_data.default, aten._log_softmax_backward_data.default],
    "grad_output: mjt, output: mjt, dim: any, input_dtype: any",
)
def _softmax_backward_data_default(func, grad, out, dim, input_dtype):
    log = func is aten._log_softmax_backward_data.default
    d, index, sub = _softmax_common(func, out, dim, log)
    if index is None:
        vd = static_dims(out.dim(), out._ragged_dims).index(d) + 1
        return wrap(func(grad._values, out._values, vd, input_dtype), out._partition, out._ragged_dims)
    g, y = grad._values, out._values
    if log:
        gi = g - y.exp() * ref.segment_reduce(g, index, sub.rows, "sum")[index]
    else:
        gi = y * (g - ref.segment_reduce(g * y, index, sub.rows, "sum")[index])
    return wrap(gi, out._partition, out._ragged_dims)


_KINDS = {"sum": sum_dim_IntList, "mean": mean_dim, "amax": amax_default, "amin": amin_default}


@register_multi_jagged_func(mj.reduce.default, "x: mjt, kind: any, dim: any?, keepdim: any")
def reduce_default(func, x, kind, dim, keepdim):
    """The routed form of reductions whose result is dense (every ragged dim reduced) or whose
    aten derivative would divide by a nested int (``mean``); see ``ops/routes.py``."""
    handler = _KINDS.get(kind)
    if handler is None:
        raise ValueError(f"reduce(): expected kind in {sorted(_KINDS)}, got {kind!r}")
    return handler(func, x, dim, keepdim)


@register_multi_jagged_func(mj.expand_like.default, "grad: any, like: mjt, dim: any?, keepdim: any")
def expand_like_default(func, grad, like, dim, keepdim):
    """Backward of ``reduce``: broadcast the reduced gradient back over ``like``'s structure."""
    dims, *_ = _split_dims(func, like, dim)
    if not keepdim:
        for d in dims:
            grad = grad.unsqueeze(d)
    if isinstance(grad, MJT):
        return grad.expand(like.shape)
    # A dense gradient (B or 1, 1…, static…): gather it per row as pointwise broadcasting does.
    from .pointwise import _align_dense

    aligned = _align_dense(func, (grad, like), grad, like._partition, len(like._size), static_dims(len(like._size), like._ragged_dims), like._partition.batch)
    return wrap(aligned.expand(like._values.shape).contiguous(), like._partition, like._ragged_dims)
