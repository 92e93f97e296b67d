"""Reductions and normalisations over static and ragged dims.

NOTE [ Reducing ragged dims ]

A reduction over ``dims`` is planned once (``_plan``): the static dims go to the values' dims
(``vdims``); the reduced ragged dims map every packed row to its row in the sub-partition that
keeps the other ragged dims (``Partition.map_to_sub``), where rows are scatter-reduced (``segment_reduce``).
A pair built from singles recorded the singles' partition as that sub-partition, so
``pair.sum(dim=-2)`` returns tensors with the singles' own partition and nested int. Reducing
every ragged dim leaves one row per sample: a dense ``(B, …)`` result, as ``torch.jagged`` gives
for its ragged dim. Reducing the batch dim requires reducing every ragged dim too; then all rows
form one segment and the result is dense without a batch dim.

Intermediate layout "K": ``(rows of the sub-partition, *static dims of x with vdims as 1)``. The
forward produces K and shapes it into the output (``_to_output``); backward formulas bring the
output back to K (``_from_output``) and gather it to x's rows (``_to_rows``).

Result dtypes are dense torch's: ``sum``/``prod`` of bool and integers accumulate in int64 (an
explicit ``dtype=`` is honoured), ``logsumexp`` of them runs in the default float dtype,
float16/bfloat16 accumulate in float32 and round once, ``any``/``all`` give bool (uint8 for
uint8), ``amax``/``amin`` keep the dtype (bool included).

Reductions over ragged dims are routed (``routes.py``) to ``multijagged::reduce``, whose
backward (``reduce_backward`` below) is written on packed values: aten's formulas would divide
by (``mean``) or expand to (dense results) nested-int sizes, or (``prod``) use ``cumprod`` along
a ragged dim. The aten overloads below still serve calls that reach dispatch directly, such as
the autograd engine's ``sum_to_size`` un-broadcast.
"""

from __future__ import annotations

import math

import torch

from ...compile import library  # noqa: F401  (defines multijagged::reduce*)
from ...compile import segment as seg
from ...errors import StructureError
from ...kernels import dense_along as da
from ...kernels import reference as ref
from ...structure import building
from .._table import op_name, register_multi_jagged_func
from .._common import MJT, canonical_dim, canonical_dims, describe, sample_rows, static_dims, wrap
from .. import _along as along

aten = torch.ops.aten
mj = torch.ops.multijagged


class _Plan:
    __slots__ = ("dims", "batch", "red_r", "vdims", "index", "sub", "rows")

    def __init__(self, func, x: MJT, dims, name: str | None = None) -> None:
        name = name or op_name(func)
        ndim = len(x._size)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = range(ndim)
        elif isinstance(dims, int):
            dims = [dims]
        self.dims = canonical_dims(name, ndim, dims)
        stat = static_dims(ndim, x._ragged_dims)
        self.batch = 0 in self.dims
        self.red_r = tuple(k for k, d in enumerate(x._ragged_dims) if d in self.dims)
        self.vdims = [stat.index(d) + 1 for d in self.dims if d in stat]
        if self.batch and len(self.red_r) != len(x._ragged_dims):
            raise NotImplementedError(
                f"{name}(): reducing the batch dim of {describe(x)} requires reducing all its ragged dims too"
            )
        p = x._partition
        if self.batch:  # every row is one segment
            self.index, self.sub, self.rows = p.offsets.new_zeros(p.rows), None, 1
        elif self.red_r:
            keep = tuple(k for k in range(len(x._ragged_dims)) if k not in self.red_r)
            self.index, self.sub = p.map_to_sub(keep)
            self.rows = self.sub.rows
        else:
            self.index, self.sub, self.rows = None, p, p.rows

    def count(self, x: MJT, dtype: torch.dtype, v: torch.Tensor | None = None) -> torch.Tensor:
        """Number of elements reduced into each K row (K layout, in ``dtype``: the dtype the mean
        divides in, not x's own — a bool or integer count would saturate or truncate). ``v``:
        x's values, where the caller holds them (the eager values path)."""
        v = x._values if v is None else v
        n = 1
        for vd in self.vdims:
            n *= v.shape[vd]
        if self.index is None:
            c = torch.full((1,), float(n), dtype=dtype, device=v.device)
        else:
            # rows per output row: a function of the structure alone, so cached on the partition
            # (NOTE [ Derived maps ] in structure.py); every mean over these dims reads it
            # every mean over these dims reads it, scaled by the static elements and shaped to
            # broadcast against the K rows: cached in that form too
            key = ("row_counts", self.batch, self.red_r, dtype, v.device)
            return x._partition.derived(
                (key, n, v.dim()),
                lambda p: (
                    p.derived(key, lambda p: seg.segment_reduce(v.new_ones(v.shape[0], dtype=dtype), self.index, self.rows, "sum"))
                    * n
                ).reshape(-1, *([1] * (v.dim() - 1))),
            )
        return c.reshape(-1, *([1] * (v.dim() - 1)))

    def _may_be_empty(self, x: MJT, v: torch.Tensor) -> bool:
        """Whether a K row may have no elements reduced into it: a static reduced dim of size 0, or
        (eagerly, from the host sizes, cached) a sample whose reduced ragged extent is 0; traced,
        always."""
        if any(v.shape[vd] == 0 for vd in self.vdims):
            return True
        if not self.red_r:
            return False
        p = x._partition
        if ref._is_traced(p.offsets):
            return True
        red = list(self.red_r)
        return p.derived(("empty_in", self.red_r), lambda p: bool((p.host_sizes()[:, red] == 0).any()))

    def mean(self, x: MJT, s: torch.Tensor, v: torch.Tensor | None = None) -> torch.Tensor:
        """The K rows' sums ``s`` divided by their counts: NaN where a count is 0, as dense's mean
        of no elements, put there by a ``where`` whose backward sends that row nothing. Dividing by
        the 0 would give its gradient ``1 / 0``, which the double backward multiplies by the sum of
        the row's (no) elements: NaN, where dense, which divides after expanding the gradient to
        the elements, has 0."""
        v = x._values if v is None else v
        c = self.count(x, s.dtype, v)
        if not self._may_be_empty(x, v):
            return s / c
        empty = c == 0
        return torch.where(empty, s.new_zeros(()) / 0, s / c.masked_fill(empty, 1))  # 0 / 0: dense's NaN of the dtype


def plan_cached(func, x: MJT, dims, name: str | None = None) -> _Plan:
    """``_Plan(func, x, dims)``, cached on x's partition: a plan is a function of the structure
    (``ndim``, ragged dims, reduced dims) and the partition's cached row maps, so the eager values
    path, which reduces the same structures step after step, plans each once. Eager only: a
    traced partition's cache is the trace's."""
    key = ("reduce_plan", len(x._size), x._ragged_dims, dims if isinstance(dims, int) or dims is None else tuple(dims))
    cache = x._partition.cache
    hit = cache.get(key)
    if hit is None:
        with building():
            hit = cache[key] = _Plan(func, x, dims, name)
    return hit


def _static_reduce(v: torch.Tensor, vdims, kind: str, empty=None) -> torch.Tensor:
    """``v`` reduced over its static dims ``vdims`` (kept as size 1). ``empty``: what ``amax`` /
    ``amin`` give over an empty dim where the caller has a value for it (``any``, ``all``, the
    shift of ``logsumexp``); without one they raise as dense torch's."""
    if not vdims:
        return v
    if kind == "sum":  # in v's dtype: _reduce has promoted it already (or dtype= asked for it)
        return v.sum(vdims, keepdim=True, dtype=v.dtype)
    if kind in ("amax", "amin"):
        if empty is not None and any(v.shape[d] == 0 for d in vdims):
            return v.new_full([1 if d in vdims else n for d, n in enumerate(v.shape)], empty)
        return getattr(v, kind)(vdims, keepdim=True)
    for d in vdims:  # prod / any / all take one dim at a time
        v = v.prod(d, keepdim=True, dtype=v.dtype) if kind == "prod" else getattr(v, kind)(d, keepdim=True)
    return v


_SEGMENT = {"sum": "sum", "amax": "amax", "amin": "amin", "prod": "prod", "any": "amax", "all": "amin"}
_EMPTY = {"sum": 0, "prod": 1, "any": 0, "all": 1}  # identities of the reductions


def _empty_value(kind: str, dtype: torch.dtype):
    """What an empty segment holds. amax/amin have no identity: like torch.jagged, an empty
    extent gives the dtype's lowest (amax) / highest (amin) value (False / True for bool)."""
    if kind in _EMPTY:
        return _EMPTY[kind]
    if dtype == torch.bool:
        return kind == "amin"
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min if kind == "amax" else info.max


def _forward_k(plan: _Plan, x: MJT, v: torch.Tensor, kind: str, empty_ok: bool = False) -> torch.Tensor:
    """Reduce values ``v`` (x's rows) to layout K. ``empty_ok``: an ``amax`` / ``amin`` over an
    empty static dim gives the empty segment's value instead of raising (``logsumexp``'s shift)."""
    if by_sample(plan, x, v, kind):  # NOTE [ Reductions sample by sample ]
        sizes, counts = sample_rows(x._partition)
        red = plan.red_r
        if kind == "sum":
            return _SampleSum.apply(v, plan.index, sizes, counts, red, plan.vdims)
        return _SampleExtreme.apply(v, sizes, counts, red, plan.vdims, kind)
    if kind in ("any", "all"):
        v = v.to(torch.uint8) if v.dtype == torch.bool else (v != 0).to(torch.uint8)
        empty_ok = True
    empty = _empty_value(kind, v.dtype) if empty_ok else None
    v = _static_reduce(v, plan.vdims, {"any": "amax", "all": "amin"}.get(kind, kind), empty)
    if plan.index is not None:
        v = seg.segment_reduce(v, plan.index, plan.rows, _SEGMENT[kind], empty=_empty_value(kind, v.dtype))
    if kind in ("any", "all"):  # bool, except uint8 in → uint8 out (dense torch's legacy rule)
        return v if x.dtype == torch.uint8 else v.bool()
    return v


# NOTE [ Reductions sample by sample ]
#
# Eagerly (host sizes, no Triton kernel chosen: ``_along.eager``), a ``sum`` / ``amax`` / ``amin``
# of floating values over ragged dims (not the batch dim) whose samples are long runs as dense
# torch's own reduction of every sample's component, a view of its packed rows
# (``kernels/dense_along.reduce_by_sample``): the user's loop, so each result is dense's bit for
# bit, and one dense call per sample reads its rows as fast as dense torch does, where the
# segment reduction (``index_add`` / ``scatter_reduce`` into the output rows) pays per row read
# (1.5× a dense sum at 64 elements a row). ``mean`` divides that sum, as dense's CPU ``mean``.
#
# * ``sum`` (``_SampleSum``): the sums per sample forward, and one gather of the output gradient
#   to the rows backward (the gradient ``expand``s no sample alone could pack), which
#   saves only the row map: an in-place write into the values afterwards stays legal, as after
#   dense ``sum``. Taken from 256 rows and 4,096 elements a sample (``SUM_ROWS``,
#   ``SUM_ELEMENTS``), where a call per sample costs less than the segment reduction's per-row
#   cost (measured, 1 thread, 1–768 elements a row: break-even near 1,000 rows of 1 element,
#   300 of 16, 250 of 64), for rows of fewer than 512 elements (``SUM_ROW_MAX``: from 256 a
#   row the two are level within 10%), and from 2^19 elements in all (``SUM_TOTAL``), below
#   which the saving is less than the node's Python backward (≈ 15 µs; the segment
#   reduction's backward runs in C++).
# * ``amax`` / ``amin`` (``_SampleExtreme``): the extremes per sample forward, dense's derivative
#   per sample backward (ties share the gradient, a NaN result gives NaN; written into the packed
#   gradient), which saves the input and the result as dense's does (a write into either
#   afterwards raises). The eager values path takes them (``ops/fastpath.py``: the route's
#   backward costs three gathers and a scatter, ≈ 0.25 ms fixed) while the calls per sample cost
#   less than that (``EXTREME_ELEMENTS`` elements a sample, or at most ``EXTREME_SAMPLES``
#   samples).
# * ``logsumexp``: dense's per sample where ``amax`` is taken (one pass over the rows; the shifted
#   segment form reads them six times: max, gather, subtract, exp, sum, and the count), its
#   gradient the route's. ``argmax`` / ``argmin`` (and ``max(dim)``'s indices) likewise: the
#   segment form finds the first element equal to the segment's extreme, 3.5-4× the loop's time
#   at 8 and 32 samples of 20-200 rows of 256 (measured); dense's per sample is the loop.
#
# A sample whose reduced extents are empty gives the empty segment's value, as the segment
# reduction (an ``amax`` per sample would raise; an arg-extreme gives 0, a logsumexp -inf).
# Traced code keeps the segment reduction.
SUM_ROWS = 256
SUM_ELEMENTS = 4096
SUM_TOTAL = 1 << 19
SUM_ROW_MAX = 512
EXTREME_ELEMENTS = 4096
EXTREME_SAMPLES = 16


def by_sample(plan: _Plan, x: MJT, v: torch.Tensor, kind: str) -> bool:
    """Whether ``kind`` over ``plan``'s dims of values ``v`` (x's rows) runs sample by sample
    (NOTE [ Reductions sample by sample ])."""
    if plan.index is None or plan.batch or kind not in ("sum", "amax", "amin") or not v.is_floating_point():
        return False
    if not along.eager(x):  # first: traced sizes compared with the thresholds would become guards
        return False
    p = x._partition
    row = math.prod(v.shape[1:])
    if kind == "sum":
        return (p.rows >= SUM_ROWS * p.batch and 0 < row < SUM_ROW_MAX
                and p.rows * row >= max(SUM_ELEMENTS * p.batch, SUM_TOTAL))
    return _extremes_by_sample(p, row)


def _extremes_by_sample(p, row: int) -> bool:
    """The rule for ``amax`` / ``amin`` and the arg-extremes: rows with elements, and few samples
    or long ones (NOTE [ Reductions sample by sample ])."""
    return row > 0 and (p.batch <= EXTREME_SAMPLES or p.rows * row >= EXTREME_ELEMENTS * p.batch)


def _arg_by_sample(plan: _Plan, x: MJT, v: torch.Tensor) -> bool:
    """Whether ``argmax`` / ``argmin`` over ``plan``'s ragged dim runs as dense torch's per sample
    (eagerly, where ``amax`` / ``amin`` would: NOTE [ Reductions sample by sample ]); otherwise
    it finds the first element equal to the segment's extreme, which reads the values three times
    more."""
    if plan.index is None or plan.batch or not along.eager(x):
        return False
    return _extremes_by_sample(x._partition, math.prod(v.shape[1:]))


def extreme_on_values(plan: _Plan, x: MJT, v: torch.Tensor, kind: str) -> bool:
    """Whether the eager values path takes ``amax`` / ``amin`` over ``plan``'s dims: over static
    dims alone, or sample by sample; the segment reduction's gradient is the route's."""
    return not plan.batch and (plan.index is None or by_sample(plan, x, v, kind))


class _SampleSum(torch.autograd.Function):
    """``sum`` of the rows ``v`` per sample (NOTE [ Reductions sample by sample ]), K layout;
    backward the output gradient gathered to the rows by ``index``, differentiable again."""

    @staticmethod
    def forward(ctx, v, index, sizes, counts, red, vdims):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(index)
        ctx.shape = v.shape
        return da.reduce_by_sample(v, sizes, counts, red, vdims, "sum", 0)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return (None,) * 6
        (index,) = ctx.saved_tensors
        # a gather by the expanded row map: ≈ 10% faster than ``index_select`` on the CPU (measured)
        rows = index.view(-1, *([1] * (grad.dim() - 1))).expand(index.shape[0], *grad.shape[1:])
        return grad.gather(0, rows).expand(ctx.shape), None, None, None, None, None


class _SampleExtreme(torch.autograd.Function):
    """``amax`` / ``amin`` of the rows ``v`` per sample (NOTE [ Reductions sample by sample ]), K
    layout; backward dense's derivative per sample, which reads the saved input and result (a
    write into either afterwards raises, as dense's), differentiable again."""

    @staticmethod
    def forward(ctx, v, sizes, counts, red, vdims, kind):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        k = da.reduce_by_sample(v, sizes, counts, red, vdims, kind, _empty_value(kind, v.dtype))
        ctx.save_for_backward(v, k)
        ctx.args = sizes, counts, red, vdims
        return k

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return (None,) * 6
        v, k = ctx.saved_tensors
        return (da.extreme_backward_by_sample(grad, v, k, *ctx.args),) + (None,) * 5


def _promote(kind: str, v: torch.Tensor) -> torch.Tensor:
    """The input dtype dense torch reduces in when no ``dtype=`` is given: ``sum``/``prod`` of
    bool and integers accumulate in int64; ``logsumexp`` of them in the default float dtype."""
    if v.dtype.is_floating_point or v.dtype.is_complex:
        return v
    if kind in ("sum", "prod"):
        return v.to(torch.int64)
    if kind == "logsumexp":
        return v.to(torch.get_default_dtype())
    return v


def _to_output(plan: _Plan, x: MJT, k: torch.Tensor, keepdim: bool):
    ndim = len(x._size)
    kept_r = [d for i, d in enumerate(x._ragged_dims) if i not in plan.red_r]
    if not keepdim:
        # K holds the reduced static dims as size 1 (``vdims``) and the reduced ragged dims not at
        # all: dropping the former is the whole move (no view ops for the autograd graph to keep)
        k = k.squeeze(tuple(plan.vdims)) if plan.vdims else k
        if kept_r:
            return wrap(k, plan.sub, tuple(d - sum(1 for e in plan.dims if e < d) for d in kept_r))
        return k.squeeze(0) if plan.batch else k
    non_kept = [d for d in range(1, ndim) if d not in kept_r]
    reduced_ragged = {x._ragged_dims[i] for i in plan.red_r}
    for i, d in enumerate(non_kept):
        if d in reduced_ragged:
            k = k.unsqueeze(i + 1)
    if kept_r:
        return wrap(k, plan.sub, tuple(kept_r))
    return k  # dense (B, …) — or (1, …) over the batch dim


def _from_output(plan: _Plan, x: MJT, r, keepdim: bool) -> torch.Tensor:
    """Inverse of ``_to_output``: an output-shaped tensor back to layout K."""
    ndim = len(x._size)
    k = r._values if isinstance(r, MJT) else r
    if plan.batch and not keepdim:
        k = k.unsqueeze(0)
    kept_r = [d for i, d in enumerate(x._ragged_dims) if i not in plan.red_r]
    non_kept = [d for d in range(1, ndim) if d not in kept_r]
    if not keepdim:
        for i, d in enumerate(non_kept):
            if d in plan.dims:
                k = k.unsqueeze(i + 1)
    reduced_ragged = {x._ragged_dims[i] for i in plan.red_r}
    drop = [i + 1 for i, d in enumerate(non_kept) if d in reduced_ragged]
    return k.squeeze(drop) if drop else k


def _to_rows(plan: _Plan, k: torch.Tensor) -> torch.Tensor:
    return k if plan.index is None else k.index_select(0, plan.index)


def _reduce(func, x: MJT, dims, keepdim: bool, kind: str, dtype=None, name: str | None = None,
            values: torch.Tensor | None = None, plan: _Plan | None = None):
    """``values``: x's values where the caller holds them (the eager values path reads them with
    their graph; x's own are then not read); ``plan``: a plan the caller has (``plan_cached``)."""
    plan = _Plan(func, x, dims, name) if plan is None else plan
    v = x._values if values is None else values
    v = _promote(kind, v) if dtype is None else v.to(dtype)
    # float16 / bfloat16 accumulate in float32 and round once, as dense torch does: a segment
    # sum rounded at every step drifts by several ulps
    low = v.dtype if v.dtype in (torch.float16, torch.bfloat16) and kind in ("sum", "mean", "logsumexp") else None
    if low is not None:
        v = v.float()
    if kind in ("mean", "logsumexp") and not (v.dtype.is_floating_point or v.dtype.is_complex):
        raise RuntimeError(
            f"{name or op_name(func)}(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {str(v.dtype).replace('torch.', '').capitalize()}"
        )
    if kind == "mean":
        k = plan.mean(x, _forward_k(plan, x, v, "sum"), v)
    elif kind == "logsumexp" and low is None and not v.is_complex() and by_sample(plan, x, v, "amax"):
        # dense torch's own logsumexp per sample: one pass over the rows where the shifted form
        # below takes six (NOTE [ Reductions sample by sample ])
        sizes, counts = sample_rows(x._partition)
        k = da.reduce_by_sample(v, sizes, counts, plan.red_r, plan.vdims, "logsumexp", -math.inf)
    elif kind == "logsumexp":
        if low is not None:
            # dense torch's steps: ``x - max`` and ``exp`` in the input's dtype, their sum
            # accumulated in float32 and rounded once, ``log`` and ``+ max`` in the input's dtype
            v = v.to(low)
        # a complex input's shift is its real part's max, as dense logsumexp takes it
        m = _forward_k(plan, x, v.detach().real if v.is_complex() else v.detach(), "amax", empty_ok=True)
        # an empty segment's max is the lowest value, as is a real one of masked entries
        # (``finfo.min``): only the empty ones (and infinite maxima) shift by 0
        m = torch.where(torch.isinf(m) | (plan.count(x, m.dtype, v) == 0), torch.zeros_like(m), m)
        e = (v - _to_rows(plan, m)).exp()
        s = _forward_k(plan, x, e if low is None else e.float(), "sum")
        k = (s if low is None else s.to(low)).log() + m
        low = None
    else:
        k = _forward_k(plan, x, v, kind)
    return _to_output(plan, x, k if low is None else k.to(low), keepdim)


# ----------------------------------------------------------------------------- aten overloads
@register_multi_jagged_func(aten.sum.dim_IntList, "self: mjt, dim: any?, keepdim: any?, dtype: any?")
def sum_dim_IntList(func, x, dim=None, keepdim=False, dtype=None):
    return _reduce(func, x, dim, keepdim, "sum", dtype)


@register_multi_jagged_func(aten.sum.default, "self: mjt")
def sum_default(func, x, dtype=None):
    return x._values.sum(dtype=dtype)


@register_multi_jagged_func(aten.mean.dim, "self: mjt, dim: any?, keepdim: any?, dtype: any?")
def mean_dim(func, x, dim=None, keepdim=False, dtype=None):
    return _reduce(func, x, dim, keepdim, "mean", dtype)


@register_multi_jagged_func(aten.mean.default, "self: mjt")
def mean_default(func, x, dtype=None):
    return x._values.mean(dtype=dtype)  # raises for integer dtypes, as dense torch


@register_multi_jagged_func(aten.amax.default, "self: mjt, dim: any?, keepdim: any?")
def amax_default(func, x, dim=(), keepdim=False):
    return _reduce(func, x, dim, keepdim, "amax")


@register_multi_jagged_func(aten.amin.default, "self: mjt, dim: any?, keepdim: any?")
def amin_default(func, x, dim=(), keepdim=False):
    return _reduce(func, x, dim, keepdim, "amin")


@register_multi_jagged_func(aten.prod.dim_int, "self: mjt, dim: any, keepdim: any?, dtype: any?")
def prod_dim_int(func, x, dim, keepdim=False, dtype=None):
    return _reduce(func, x, [dim], keepdim, "prod", dtype)


@register_multi_jagged_func(aten.prod.default, "self: mjt")
def prod_default(func, x, dtype=None):
    return x._values.prod(dtype=dtype)


@register_multi_jagged_func(aten.logsumexp.default, "self: mjt, dim: any, keepdim: any?")
def logsumexp_default(func, x, dim, keepdim=False):
    return _reduce(func, x, dim, keepdim, "logsumexp")


@register_multi_jagged_func([aten.any.dim, aten.any.dims, aten.all.dim, aten.all.dims], "self: mjt, dim: any?, keepdim: any?")
def any_dim(func, x, dim=None, keepdim=False):
    kind = "any" if func in (aten.any.dim, aten.any.dims) else "all"
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        # dense any / all over ``dim=()`` reduce nothing (unlike sum's "every dim"): ``x != 0``
        return wrap(func(x._values, dim, keepdim), x._partition, x._ragged_dims)
    return _reduce(func, x, dim, keepdim, kind)


@register_multi_jagged_func([aten.any.default, aten.all.default], "self: mjt")
def any_default(func, x):
    return func(x._values)


@register_multi_jagged_func([aten.argmax.default, aten.argmin.default], "self: mjt, dim: any?, keepdim: any?")
def argmax_default(func, x, dim=None, keepdim=False):
    """Index of the first extreme element along ``dim`` (local to the sample along a ragged dim).

    Without ``dim``: a flat index into the packed values as ``torch.jagged``'s ``values()`` lays
    them out (the ragged rows at dim ``r - 1`` for one ragged dim ``r``; rows first otherwise)."""
    if x.dtype == torch.bool:
        raise RuntimeError(f"{op_name(func)}(): does not support bool input")  # as dense torch
    if dim is None:
        flat = func(_njt_values(x))  # with keepdim, every dim of size 1, as dense torch's flat argmax
        return flat.reshape((1,) * len(x._size)) if keepdim else flat
    return _arg_extreme(func, x, dim, keepdim)


def _njt_values(x):
    return x._values.movedim(0, x._ragged_dims[0] - 1) if len(x._ragged_dims) == 1 else x._values


@register_multi_jagged_func([aten.max.default, aten.min.default], "self: mjt")
def max_default(func, x):
    """Full ``max``/``min``: a dense 0-dim tensor; an empty tensor raises as dense torch does."""
    return func(x._values)


def _arg_extreme(func, x, dim, keepdim):
    kind = "amax" if func in (aten.argmax.default, aten.max.dim) else "amin"
    plan = _Plan(func, x, [dim])
    if plan.batch:
        raise StructureError(f"{op_name(func)}(): cannot take the arg-extreme over the batch dim of {describe(x)}")
    # bool has no arg-extreme kernel; uint8 orders False < True the same way (max(dim) needs it)
    v = x._values if x.dtype != torch.bool else x._values.to(torch.uint8)
    if not plan.red_r:
        return _to_output(plan, x, getattr(torch, "arg" + kind[1:])(v, plan.vdims[0], keepdim=True), keepdim)
    k = list(plan.red_r)[0]
    if _arg_by_sample(plan, x, v):
        sizes, counts = sample_rows(x._partition)
        return _to_output(plan, x, da.arg_extreme_by_sample(v, sizes, counts, k, kind), keepdim)
    best = _to_rows(plan, _forward_k(plan, x, v, kind))
    _, coords = x._partition.row_coords()
    pos = coords[:, k].reshape(-1, *([1] * (v.dim() - 1))).expand_as(v)
    hit = (v == best) | (v.isnan() & best.isnan())
    big = torch.iinfo(torch.int64).max
    first = torch.where(hit, pos, torch.full_like(pos, big))
    k_out = ref.segment_reduce(first, plan.index, plan.rows, "amin", empty=0)
    return _to_output(plan, x, k_out, keepdim)


# ----------------------------------------------------------------------------- routed op
_KINDS = library.REDUCTIONS


@register_multi_jagged_func(mj.reduce.default, "x: mjt, kind: any, dim: any?, keepdim: any")
def reduce_default(func, x, kind, dim, keepdim):
    if kind not in _KINDS:
        raise ValueError(f"reduce(): expected kind in {_KINDS}, got {kind!r}")
    if kind in ("amax", "amin") and x._values.numel() == 0 and (not dim or any(d % len(x._size) == 0 for d in dim)):
        # over every dim (or the batch dim) of a batch without elements: no sample's extent for
        # the empty-extent rule to give a value to; dense torch (and our max()) raise
        if not dim:
            raise RuntimeError(f"{kind}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        raise IndexError(f"{kind}(): Expected reduction dim 0 to have non-zero size.")
    return _reduce(func, x, dim, keepdim, kind, name=kind)


@register_multi_jagged_func(
    mj.reduce_backward.default, "grad: any, x: mjt, result: any, kind: any, dim: any?, keepdim: any"
)
def reduce_backward_default(func, grad, x, result, kind, dim, keepdim):
    """Gradient of ``reduce`` w.r.t. x, on packed values: the output gradient gathered back to
    x's rows (K layout in between), times the kind's local derivative — conjugated for a complex
    x, and materialized (``conj_physical``: a lazy ``conj()`` bit is ignored below the Conjugate
    dispatch key, where handlers run; NOTE [ Complex gradients ] in compile/library.py)."""
    plan = _Plan(func, x, dim)
    v = x._values
    k = _from_output(plan, x, grad, keepdim)
    if kind == "mean":
        k = k / plan.count(x, k.dtype)  # per output row, before the gather
    g = _to_rows(plan, k)
    if kind in ("sum", "mean"):
        gi = g if g.shape == v.shape else g.expand_as(v)
    elif kind == "logsumexp":
        gi = g * torch.conj_physical((v - _to_rows(plan, _from_output(plan, x, result, keepdim))).exp())
    elif kind in ("amax", "amin"):
        # Ties share the gradient evenly, as for dense amax/amin.
        hit = (v == _to_rows(plan, _from_output(plan, x, result, keepdim))).to(v.dtype)
        gi = g * hit / _to_rows(plan, _forward_k(plan, x, hit, "sum"))
    elif kind == "prod":
        gi = g * torch.conj_physical(_prod_others(plan, x, v))
    else:
        raise ValueError(f"reduce_backward(): expected kind in {_KINDS}, got {kind!r}")
    return wrap(gi if gi.is_contiguous() else gi.contiguous(), x._partition, x._ragged_dims)


def _prod_others(plan: _Plan, x: MJT, v: torch.Tensor) -> torch.Tensor:
    """∏ of the other elements of each element's segment, exact with zeros in the segment."""
    zero = v == 0
    nonzero_prod = _to_rows(plan, _forward_k(plan, x, torch.where(zero, torch.ones_like(v), v), "prod"))
    zeros = _to_rows(plan, _forward_k(plan, x, zero.to(v.dtype), "sum"))
    only_me = torch.where(zero, nonzero_prod, torch.zeros_like(v))  # I am the single zero
    return torch.where(zeros == 0, nonzero_prod / torch.where(zero, torch.ones_like(v), v),
                       torch.where(zeros == 1, only_me, torch.zeros_like(v)))


# ----------------------------------------------------------------------------- softmax
def _softmax_segments(func, x, dim):
    d = canonical_dim(op_name(func), len(x._size), dim)
    if d == 0:
        raise StructureError(f"{op_name(func)}(): softmax over the batch dim of {describe(x)} is not supported")
    if d in x._ragged_dims:
        k = x._ragged_dims.index(d)
        keep = tuple(i for i in range(len(x._ragged_dims)) if i != k)
        index, sub = x._partition.map_to_sub(keep)
        return d, index, sub
    return d, None, None


def _softmax_along(x: MJT, v: torch.Tensor, d: int, log: bool, half_to_float: bool) -> torch.Tensor:
    """aten's (log-)softmax of values ``v`` (x's structure) along ragged dim ``d``, sample by sample
    or padded (NOTE [ Dense ops along a ragged dim ]); written with out= where nothing records."""
    dt = torch.float32 if half_to_float else v.dtype
    dense = torch._log_softmax if log else torch._softmax  # torch's bindings: less call overhead than ``func``
    out, = along.dense_along(lambda t, dim: dense(t, dim, half_to_float), x, d, [v], [float("-inf")],
                             by_lines=False, out_dtypes=[dt],
                             fn_out=lambda t, dim, o: dense(t, dim, half_to_float, out=o))
    return out


def _softmax_backward_along(out: MJT, g: torch.Tensor, y: torch.Tensor, d: int, log: bool, input_dtype) -> torch.Tensor:
    """aten's backward of ``_softmax_along`` from the output gradient ``g`` and the output ``y``
    (values of ``out``'s structure)."""
    dense = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    key = "out" if log else "grad_input"  # the out= argument's name in each schema
    # the output's fill: softmax's 0, log_softmax's -inf (exp(-inf) = 0 again)
    gi, = along.dense_along(lambda g, y, dim: dense(g, y, dim, input_dtype), out, d, [g, y],
                            [0.0, float("-inf") if log else 0.0], by_lines=False, out_dtypes=[input_dtype],
                            fn_out=lambda g, y, dim, o: dense(g, y, dim, input_dtype, **{key: o}))
    return gi


class SoftmaxAlong(torch.autograd.Function):
    """``softmax`` / ``log_softmax`` of values ``v`` along ragged dim ``d`` of ``x``'s structure on
    the eager values path, where the dense op runs sample by sample: aten's kernels write each
    sample's result into the packed buffer in both directions (``_softmax_along``,
    ``_softmax_backward_along``), one node for the batch. Recorded on the values instead, the
    samples' results would be packed by a ``cat`` forward and their gradients by another
    backward, with a node per sample. A backward that records (``create_graph``) runs dense's
    backward op per sample under autograd, so every order is dense's."""

    @staticmethod
    def forward(ctx, v, x, d, log):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        y = _softmax_along(x, v, d, log, False)
        ctx.save_for_backward(y)
        ctx.structure, ctx.d, ctx.log, ctx.dtype = (x._partition, x._ragged_dims), d, log, v.dtype
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None, None, None
        (y,) = ctx.saved_tensors
        out = MJT(y.detach(), *ctx.structure)
        return _softmax_backward_along(out, grad, y, ctx.d, ctx.log, ctx.dtype), None, None, None


@register_multi_jagged_func([aten._softmax.default, aten._log_softmax.default], "self: mjt, dim: any, half_to_float: any")
def _softmax_default(func, x, dim, half_to_float):
    log = func is aten._log_softmax.default
    n = len(x._size)
    if isinstance(dim, int) and -n <= dim < n and dim % n:
        d = dim % n
    else:  # raises dense torch's error for a dim out of range, ours for the batch dim
        d = _softmax_segments(func, x, dim)[0]
    if d not in x._ragged_dims:
        if along.ragged_after(x, d) and along.eager(x):
            out, = along.per_sample(lambda t, dim: func(t, dim, half_to_float), x, d, [x._values])
            return wrap(out, x._partition, x._ragged_dims)
        vd = static_dims(n, x._ragged_dims).index(d) + 1
        return wrap(func(x._values, vd, half_to_float), x._partition, x._ragged_dims)
    if not x._values.is_floating_point():
        # Dense torch has no integer / bool softmax kernel: raise its own error (a one-element
        # probe; an empty tensor would skip the kernel's dtype check).
        func(x._values.new_zeros(1), 0, half_to_float)
    if along.eager(x):  # NOTE [ Dense ops along a ragged dim ]: aten's kernel on every segment
        return wrap(_softmax_along(x, x._values, d, log, half_to_float), x._partition, x._ragged_dims)
    _, index, sub = _softmax_segments(func, x, d)
    return wrap(seg.segment_softmax(x._values, index, sub.rows, log=log), x._partition, x._ragged_dims)


@register_multi_jagged_func(
    [aten._softmax_backward_data.default, aten._log_softmax_backward_data.default],
    "grad_output: mjt, output: mjt, dim: any, input_dtype: any",
)
def _softmax_backward_data_default(func, grad, out, dim, input_dtype):
    log = func is aten._log_softmax_backward_data.default
    d, index, sub = _softmax_segments(func, out, dim)
    if index is None:
        if along.ragged_after(out, d) and along.eager(out):
            gi, = along.per_sample(lambda g, y, dim: func(g, y, dim, input_dtype), out, d, [grad._values, out._values])
            return wrap(gi, out._partition, out._ragged_dims)
        vd = static_dims(len(out._size), out._ragged_dims).index(d) + 1
        return wrap(func(grad._values, out._values, vd, input_dtype), out._partition, out._ragged_dims)
    if along.eager(out):
        gi = _softmax_backward_along(out, grad._values, out._values, d, log, input_dtype)
        return wrap(gi, out._partition, out._ragged_dims)
    gi = seg.segment_softmax_backward(grad._values, out._values, index, sub.rows, log=log)
    return wrap(gi, out._partition, out._ragged_dims)


@register_multi_jagged_func([aten.max.dim, aten.min.dim], "self: mjt, dim: any, keepdim: any?")
def max_dim(func, x, dim, keepdim=False):
    """``(values, indices)``; values as ``amax``/``amin`` (an empty extent gives the dtype's
    lowest / highest value, as torch.jagged), indices as ``argmax``/``argmin``."""
    is_max = func is aten.max.dim
    values = _reduce(func, x, [dim], keepdim, "amax" if is_max else "amin")
    return values, _arg_extreme(func, x, dim, keepdim)
