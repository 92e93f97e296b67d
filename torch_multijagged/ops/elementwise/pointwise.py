"""Pointwise ops (the ``torch.Tag.pointwise`` fallback) and their broadcasting; ``broadcast_tensors``,
``meshgrid`` and ``kron`` with a dense operand, which are broadcasts.

NOTE [ Broadcasting over ragged dims ]

Operands are aligned on logical dims (dense operands right-aligned, as in torch). At each dim:

* if some multi_jagged operand is ragged there, every other multi_jagged operand must be ragged
  with the same extent (same nested int, or equal sizes) or static of size 1, and dense operands
  must have size 1 there (eagerly, or every sample's size there); the output is ragged with that extent. Eagerly, two extents whose
  sizes broadcast in every sample (equal, or one of them 1: ``x[:, :1] + x``) broadcast too, when
  the result's sizes are one operand's: the other's rows are read at coordinate 0 there; and a
  static size that is every sample's size there is made that ragged dim before the op (NOTE
  [ Static sizes equal to a ragged dim ] in ops/_routing.py);
* otherwise the usual dense broadcasting of static sizes applies;
* at the batch dim, multi_jagged operands need equal B; a dense operand that spans it with size B
  is gathered per packed row (its sample's slice).

So ``(B, j0, 1, C) + (B, 1, j0, C)`` creates the square pair ``(B, j0, j0, C)`` (both pair dims
carry the operands' extent ``j0``), and ``(B, j0, 1, C) * (B, 1, j1, C)`` the rectangular one.
An operand whose ragged dims are a subset of the output's is *gathered* into the output rows
with the cached row map (``Partition.map_to_sub``); its size-1 dims at the new ragged positions vanish.
Eagerly on the CPU, large samples take a per-sample loop instead (NOTE [ Broadcasting into new
ragged dims per sample ] in ``per_sample.py``).
Two tensors that merely pack to the same number of rows — ``(2, 6, C)`` and ``(3, 4, C)`` — never
combine: extents are compared, not row counts.
"""

from __future__ import annotations

import math

import torch

from ...compile.kernel_choice import use_triton
from ...structure import _is_traced, broadcast_extent, partition_for, same_extent
from .._common import MJT, describe, static_dims, wrap
from . import per_sample as _per_sample
from ...errors import STATIC_TRACED, TRACED_EXTENTS, StructureError
from .._routing import in_place_route, route
from .._table import op_name, register_multi_jagged_func, register_pointwise_fallback

aten = torch.ops.aten

__all__ = ["pointwise", "broadcast_values"]


def _error(func, args, why: str) -> StructureError:
    shapes = " and ".join(describe(a) for a in args if isinstance(a, torch.Tensor))
    return StructureError(f"{op_name(func)}(): cannot broadcast multi_jagged operands of shapes {shapes}: {why}")


def _same_layout(m: MJT, ref: MJT) -> bool:
    if m._ragged_dims != ref._ragged_dims or m._values.dim() != ref._values.dim():
        return False
    return m._partition.same_as(ref._partition)


# func -> 0 functional, 1 in-place on self, 2 other mutation (out=); schema parsing is not free.
_KIND: dict = {}


def _kind(func) -> int:
    k = _KIND.get(func)
    if k is None:
        schema = func._schema
        if not schema.is_mutable:
            k = 0
        elif schema.name.endswith("_") and schema.arguments[0].alias_info is not None:
            k = 1
        else:
            k = 2
        _KIND[func] = k
    return k


@register_pointwise_fallback
def pointwise(func, *args, **kwargs):
    kind = _kind(func)
    if kind == 2:
        raise NotImplementedError(f"{op_name(func)}(): out= variants are not supported for layout torch.multi_jagged")
    ref = None
    simple = True  # every tensor operand lines up with ref's values as they are
    for a in args:
        if isinstance(a, MJT):
            if ref is None:
                ref = a
            elif simple and a is not ref and not _same_layout(a, ref):
                simple = False
        elif isinstance(a, torch.Tensor) and simple and a.dim():
            simple = None  # decide below, once ref is known
    if ref is None or (kwargs and any(isinstance(v, MJT) for v in kwargs.values())):
        raise NotImplementedError(f"{op_name(func)}(): multi_jagged tensors as keyword arguments are not supported")
    if simple is None:
        # Dense operands may broadcast over the static dims after the last ragged dim only.
        rd = ref._ragged_dims
        trailing = len(ref._size) - 1 - (rd[-1] if rd else 0)
        simple = all(
            _same_layout(a, ref) if isinstance(a, MJT) else a.dim() <= trailing
            for a in args
            if isinstance(a, torch.Tensor)
        )
    if simple:
        new_args = [a._values if isinstance(a, MJT) else a for a in args]
        if kind == 1:
            return _inplace(func, args, new_args, kwargs)
        return _wrap_out(func(*new_args, **kwargs), ref._partition, ref._ragged_dims)
    partition, ragged_dims, out_static = _out_structure(func, args)
    if kind == 0 and func in _PAIR_OPS and not kwargs and use_triton(ref._values):
        out = _pair_kernel(func, args, partition, ragged_dims, out_static)
        if out is not None:
            return out
    new_args = _align(func, args, partition, ragged_dims, out_static)
    if kind == 1:
        self = args[0]
        if not isinstance(self, MJT) or self._ragged_dims != ragged_dims or self._partition is not partition:
            raise _error(func, args, "an in-place op cannot change the structure of self")
        return _inplace(func, args, new_args, kwargs)
    return _wrap_out(func(*new_args, **kwargs), partition, ragged_dims)


def broadcast_values(func, a: MJT, b: MJT, va: torch.Tensor, vb: torch.Tensor) -> MJT:
    """``func(a, b)`` for a functional binary op of two multi_jagged operands, computed on values
    ``va``/``vb`` standing for a's and b's (the eager values path's, which carry their gradients):
    the checks, structure and values of ``pointwise`` without building wrappers around them. The
    output structure and each operand's row map are cached per pair of structures
    (``_broadcast_plan``); large samples on the CPU are computed one by one (``per_sample.pays``),
    the rest by gathering rows."""
    if _same_layout(a, b):
        return wrap(func(va, vb), a._partition, a._ragged_dims)
    partition, ragged_dims, out_static, plan = _broadcast_plan(func, a, b, va, vb)
    if func in _PAIR_OPS and use_triton(va):
        out = _pair_kernel(func, (a, b), partition, ragged_dims, out_static, (va, vb))
        if out is not None:
            return out
    if plan is None:
        # NOTE [ Broadcasting into new ragged dims per sample ] in per_sample.py
        return wrap(_per_sample.broadcast_per_sample(func, a, b, va, vb, partition, ragged_dims, out_static),
                    partition, ragged_dims)
    (ia, sa), (ib, sb) = plan
    if sa is not None:
        va = va.reshape(va.shape[0], *sa)
    if sb is not None:
        vb = vb.reshape(vb.shape[0], *sb)
    return wrap(func(va if ia is None else va.index_select(0, ia), vb if ib is None else vb.index_select(0, ib)),
                partition, ragged_dims)


def dense_operand_rows(func, x: MJT, t: torch.Tensor, args) -> torch.Tensor | None:
    """A dense operand ``t`` of ``func(*args)`` that spans the batch or has size-1 dims at ``x``'s
    ragged dims (``x - x.mean(1, keepdim=True)``: ``(B, 1, C)``), as rows lined up with ``x``'s
    values (``_align_dense``), where the result keeps ``x``'s ragged dims; None otherwise. The eager values path computes such a broadcast with these rows, so that autograd
    records it as dense ops on ``t`` (an ``index_select``, whose derivative is an ``index_add``):
    differentiable twice, where the autograd engine's own un-broadcasting of ``t``'s gradient (a
    ``sum`` whose derivative expands a dense tensor to nested-int sizes) is not."""
    partition, out_dims, out_static = _out_structure(func, args)
    if partition is not x._partition or out_dims != x._ragged_dims:
        return None
    return _align_dense(func, args, t, partition, len(x._size), out_static, partition.batch)


def _broadcast_plan(func, a: MJT, b: MJT, va: torch.Tensor, vb: torch.Tensor):
    """``(partition, ragged_dims, out_static, plan)`` of ``broadcast_values``: the output structure
    (``_out_structure``) and, where the rows are gathered, each operand's ``(row map, static
    sizes)`` (``_align_mjt``'s index, or None where the operand has the output's rows; the static
    sizes it keeps, or None where it keeps them all); ``plan`` None where the samples are computed
    one by one. Cached on a's partition: all of it is a function of the two partitions (their
    extents), ragged dims and static sizes (``va``/``vb`` have a's and b's). The entry holds b's
    partition and is checked against it, one entry per key: a long-lived ``a`` met by a new ``b``
    each step replaces its entry rather than collecting them."""
    key = ("broadcast", a._ragged_dims, b._ragged_dims, va.shape[1:], vb.shape[1:])
    cache = a._partition.cache
    hit = cache.get(key)
    if hit is not None and hit[0] is b._partition:
        return hit[1]
    partition, out_dims, out_static = _out_structure(func, (a, b))
    plan = None
    if not _per_sample.pays(a, b, va, vb, partition, out_dims, out_static):
        plan = tuple(_align_plan(m, partition, out_dims, out_static) for m in (a, b))
    out = partition, out_dims, out_static, plan
    cache[key] = (b._partition, out)
    return out


def _wrap_out(out, partition, ragged_dims):
    if isinstance(out, tuple):  # frexp: (mantissa, exponent)
        return tuple(wrap(o, partition, ragged_dims) for o in out)
    return wrap(out, partition, ragged_dims)


def _inplace(func, args, new_args, kwargs):
    self = args[0]
    if not isinstance(self, MJT):
        raise _error(func, args, "in-place op on a dense self with a multi_jagged operand")
    func(*new_args, **kwargs)
    return self


def _out_structure(func, args):
    """Output partition, ragged dims and static dims of a broadcast (checked)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    mjts = [a for a in tensors if isinstance(a, MJT)]
    ndim = len(mjts[0]._size)
    batch = mjts[0]._partition.batch
    for m in mjts:
        if len(m._size) != ndim:
            raise _error(func, args, f"multi_jagged operands need the same number of dims, got {len(m._size)} and {ndim}")
        if m._partition.batch != batch:
            raise _error(func, args, f"batch sizes differ ({m._partition.batch} vs {batch})")
    # (an MJT's .dim()/.shape would go through __torch_function__: read its stored size)
    if any(t.dim() > ndim for t in tensors if not isinstance(t, MJT)):
        raise _error(func, args, "a dense operand has more dims than the multi_jagged one")

    # Output ragged dims and their extents, in logical (= storage) order.
    out_dims, extents = [], []
    for d in range(1, ndim):
        ext = None
        for m in mjts:
            if d in m._ragged_dims:
                e = m._partition.extents[m._ragged_dims.index(d)]
                if ext is None:
                    ext = e
                elif not same_extent(ext, e):
                    wide = broadcast_extent(ext, e)
                    if wide is None:
                        if _is_traced(ext.offsets) or _is_traced(e.offsets):
                            raise _error(func, args, f"ragged dim {d} is not provably one nested int: {TRACED_EXTENTS}")
                        raise _error(func, args, f"ragged dim {d} has different per-sample sizes")
                    ext = wide
        if ext is None:
            continue
        for t in tensors:
            if isinstance(t, MJT):
                if d not in t._ragged_dims and t._size[d] != 1:
                    why = f"dim {d} is ragged in one operand and static of size {t._size[d]} in another"
                    if _is_traced(ext.offsets):  # NOTE [ Static sizes equal to a ragged dim ] in ops/_routing.py
                        why += STATIC_TRACED
                    raise _error(func, args, why)
            else:
                dd = d - (ndim - t.dim())
                if dd >= 0 and t.shape[dd] != 1:
                    why = f"a dense operand has size {t.shape[dd]} along ragged dim {d}"
                    raise _error(func, args, why + STATIC_TRACED if _is_traced(ext.offsets) else why)
        out_dims.append(d)
        extents.append(ext)
    out_dims = tuple(out_dims)
    partition = _output_partition(mjts, out_dims, extents)
    out_static = static_dims(ndim, out_dims)
    return partition, out_dims, out_static


def _align(func, args, partition, out_dims, out_static):
    """The operands' values aligned to the output rows."""
    ndim = len(next(a for a in args if isinstance(a, MJT))._size)
    new_args = []
    for a in args:
        if isinstance(a, MJT):
            new_args.append(_align_mjt(a, partition, out_dims, out_static))
        elif isinstance(a, torch.Tensor):
            new_args.append(_align_dense(func, args, a, partition, ndim, out_static, partition.batch))
        else:
            new_args.append(a)
    return new_args


# add/sub/mul of two operands that are both gathered into new rows (a pair from singles): one
# Triton launch gathers and combines (compile/triton_pair.py), where the default path writes
# both gathers out first.
_PAIR_OPS = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul"}


def _pair_kernel(func, args, partition, out_dims, out_static, vals=(None, None)):
    """``x ∘ y`` through the pair kernel, or None where it does not apply (an operand not
    gathered, or the operands' dtypes or static shapes differ: those broadcast as usual).
    ``vals``: values standing for the operands' own (``broadcast_values``)."""
    if len(args) != 2 or not all(isinstance(a, MJT) and a._ragged_dims != out_dims for a in args):
        return None
    (left, li), (right, ri) = (
        _align_mjt(a, partition, out_dims, out_static, gather=False, vals=v) for a, v in zip(args, vals)
    )
    if left.dtype != right.dtype or left.shape[1:] != right.shape[1:]:
        return None
    from ...compile.triton_pair import pair_combine  # imports triton: only on this path

    return wrap(pair_combine(left, right, li, ri, _PAIR_OPS[func]), partition, out_dims)


def _own_extents(m, out_dims, extents) -> bool:
    """Whether ``m``'s ragged dims carry the output's extents (not size-1 broadcasts)."""
    return all(same_extent(e, extents[out_dims.index(d)]) for d, e in zip(m._ragged_dims, m._partition.extents))


def _output_partition(mjts, out_dims, extents):
    for m in mjts:
        if m._ragged_dims == out_dims and _own_extents(m, out_dims, extents):
            return m._partition
    if not extents:
        raise AssertionError("multi_jagged operands without ragged dims")
    p = partition_for(extents)
    for m in mjts:
        if _own_extents(m, out_dims, extents):
            keep = tuple(out_dims.index(d) for d in m._ragged_dims)
            p.note_sub(keep, m._partition)
    return p


def _align_plan(m: MJT, partition, out_dims, out_static) -> tuple:
    """``(index, static)``: the row map aligning m's values to the output rows (None where m has
    them), and the static sizes m's values keep, dropping m's size-1 static dims that sit where
    the output is ragged (None where m keeps them all)."""
    index = None
    if not _own_extents(m, out_dims, partition.extents):
        # a ragged dim of size 1 in some samples against the output's sizes (its own in the
        # others): each output row reads m's row at coordinate 0 there
        index = partition.broadcast_map(m._partition, tuple(out_dims.index(d) for d in m._ragged_dims))
    elif m._ragged_dims != out_dims:
        index, _ = partition.map_to_sub(tuple(out_dims.index(d) for d in m._ragged_dims))
    m_static = static_dims(len(m._size), m._ragged_dims)
    if len(m_static) == len(out_static):
        return index, None
    return index, tuple(m._size[d] for d in m_static if d in out_static)


def _align_mjt(m: MJT, partition, out_dims, out_static, gather: bool = True, vals: torch.Tensor | None = None):
    """m's values (or ``vals``, standing for them) aligned to the output rows; with
    ``gather=False``, ``(values, index)``: the rows not yet gathered and the row map (None where
    m already has the output's rows)."""
    vals = m._values if vals is None else vals
    index, static = _align_plan(m, partition, out_dims, out_static)
    if static is not None:
        vals = vals.reshape(vals.shape[0], *static)
    if gather and index is not None:
        vals = vals.index_select(0, index)
    return vals if gather else (vals, index)


def _align_dense(func, args, t: torch.Tensor, partition, ndim, out_static, batch):
    lead = ndim - t.dim()
    spans_batch = lead == 0 and t.shape[0] != 1
    if spans_batch and t.shape[0] != batch:
        raise _error(func, args, f"a dense operand has size {t.shape[0]} along the batch dim, expected {batch} or 1")
    kept = [t.shape[d - lead] if d - lead >= 0 else 1 for d in out_static]
    if spans_batch:
        t = t.reshape(batch, *kept).index_select(0, partition.row_sample())
        return t
    return t.reshape(1, *kept) if t.dim() else t


# Elementwise ops that lack the pointwise tag (mostly activation backwards).
_UNTAGGED = [
    aten.leaky_relu_backward.default,
    aten.hardtanh_backward.default,
    aten.elu_backward.default,
    aten.softplus_backward.default,
    aten.hardsigmoid_backward.default,
    aten.hardswish_backward.default,
    aten.mish_backward.default,
    aten.softshrink_backward.default,
    aten.hardshrink_backward.default,
    aten._masked_scale.default,
    aten.rsub.Tensor,
    aten.rsub.Scalar,
    # elementwise ops that torch 2.13 leaves untagged (``x // 2``, ``F.hardswish``)
    aten.floor_divide.default,
    aten.floor_divide.Scalar,
    aten.floor_divide_.Tensor,
    aten.floor_divide_.Scalar,
    aten.hardswish.default,
    aten.hardswish_.default,
    # in-place comparisons (``x.lt_(3)``: 0 or 1 in x's dtype), which torch 2.13 tags ``inplace`` only
    *(getattr(getattr(aten, _c + "_"), _o) for _c in ("lt", "le", "gt", "ge", "eq", "ne") for _o in ("Scalar", "Tensor")),
    # complex numbers from two real tensors (Llama's complex rotary embedding: ``torch.polar``)
    aten.polar.default,
    aten.complex.default,
    # ``F.logsigmoid``: elementwise, returning a buffer beside the output (a tuple)
    aten.log_sigmoid_forward.default,
    aten.log_sigmoid_backward.default,
]
register_multi_jagged_func(_UNTAGGED, "a: any, ...")(pointwise)


# ----------------------------------------------------------------------------- whole-tensor comparisons
@register_multi_jagged_func(aten.equal.default, "self: any, other: any")
def equal_default(func, a, b):
    """``torch.equal``: a Python bool, True when both have the same shape — the same ragged dims
    with equal per-sample extents, the same static sizes — and the same elements. (aten tags it
    pointwise, but it returns a bool, not a tensor.) A dense tensor never has a multi_jagged
    tensor's shape."""
    if not (isinstance(a, MJT) and isinstance(b, MJT)):
        return False
    if len(a._size) != len(b._size) or a._values.shape[1:] != b._values.shape[1:] or not _same_layout(a, b):
        return False
    return func(a._values, b._values)


@register_multi_jagged_func(aten.allclose.default, "self: any, other: any, rtol: any?, atol: any?, equal_nan: any?")
def allclose_default(func, a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """``torch.allclose``: ``isclose`` with its broadcasting (NOTE [ Broadcasting over ragged dims
    ]), then ``all``."""
    # SYNC: the result is a Python bool, as dense allclose's
    return bool(aten.isclose.default(a, b, rtol, atol, equal_nan).all())


# ----------------------------------------------------------------------------- elementwise with a dense parameter
@register_multi_jagged_func([aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar], "elements: mjt, test_elements: any, ...")
def isin_Tensor(func, x, test, *args, **kwargs):
    """``isin(x, test_elements)``: elementwise on the packed values; ``test_elements`` is one set
    for every element, so it must be dense (or a scalar)."""
    if isinstance(test, MJT):
        raise NotImplementedError("isin(): a multi_jagged test_elements is not supported for layout torch.multi_jagged (pass a dense tensor)")
    return wrap(func(x._values, test, *args, **kwargs), x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.bucketize.Tensor, "self: mjt, boundaries: t, ...")
def bucketize_Tensor(func, x, boundaries, *args, **kwargs):
    """``bucketize(x, boundaries)``: one dense 1-D ``boundaries`` for every element."""
    return wrap(func(x._values, boundaries, *args, **kwargs), x._partition, x._ragged_dims)


@route(torch.bucketize)
def _bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    """Per-sample boundaries (a multi_jagged ``(B, j0)``): each sample's values bucketed by its own
    boundaries, as dense ``bucketize`` of the sample — ``searchsorted(boundaries, input, right=right)``,
    which it is in dense torch."""
    if not isinstance(boundaries, MJT):
        return NotImplemented  # dense boundaries: the op table's elementwise handler
    if out is not None:
        raise NotImplementedError("bucketize(): out= with per-sample boundaries for layout torch.multi_jagged")
    return _searchsorted(boundaries, input, out_int32=out_int32, right=right)


@register_multi_jagged_func(aten.searchsorted.Tensor, "sorted_sequence: any, self: any, ...")
def searchsorted_Tensor(func, sorted_sequence, x, *args, **kwargs):
    """``searchsorted(boundaries, x)`` with dense 1-D ``boundaries``: elementwise on ``x``'s
    values. Per-sample boundaries (a multi_jagged ``sorted_sequence``) are not supported."""
    if isinstance(sorted_sequence, MJT) or not isinstance(x, MJT) or sorted_sequence.dim() != 1:
        raise NotImplementedError(
            "searchsorted(): for layout torch.multi_jagged, expected dense 1-D boundaries and multi_jagged "
            f"values, got {describe(sorted_sequence)} and {describe(x) if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
    if kwargs.get("sorter") is not None:
        raise NotImplementedError("searchsorted(): sorter= is not supported for layout torch.multi_jagged")
    return wrap(func(sorted_sequence, x._values, *args, **kwargs), x._partition, x._ragged_dims)


@route(torch.searchsorted)
def _searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, out=None, sorter=None):
    """Per-sample boundaries: a multi_jagged ``(B, j0)`` ``sorted_sequence`` (each sample's sorted
    1-d boundaries, or unsorted with a per-sample ``sorter`` of the same structure) with values of
    the same batch — multi_jagged ``(B, j1, …)``, dense ``(B, …)`` or one number for every sample
    (a dense ``(B,)``) —, each value searched among its own sample's boundaries as the dense op
    searches: by the dense op on each sample up to ``SEARCH_PER_SAMPLE_UP_TO`` samples, above
    that every row at once by ``_bisect`` (its very probes, so boundaries holding NaN, which no
    sort order places, give dense's answer and nothing of another sample)."""
    per_sample_dense = (
        isinstance(sorted_sequence, torch.Tensor) and not isinstance(sorted_sequence, MJT) and isinstance(input, MJT)
        and sorted_sequence.dim() == 2 and sorted_sequence.shape[0] == input._partition.batch and out is None
        and not (isinstance(sorter, torch.Tensor) and (isinstance(sorter, MJT) or sorter.shape != sorted_sequence.shape)))
    if not (per_sample_dense or isinstance(sorted_sequence, MJT)):
        return NotImplemented  # dense boundaries: the op table's elementwise handler
    if out is not None:
        raise NotImplementedError("searchsorted(): out= with per-sample boundaries for layout torch.multi_jagged")
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True")
        right = side == "right"
    if per_sample_dense:
        # dense per-sample boundaries (B, K), as dense's N-d form reads them: row b of each packed
        # row's sample, the row's values searched there
        rows = input._partition.row_sample()
        v = input._values
        found = torch.searchsorted(sorted_sequence.index_select(0, rows), v.reshape(v.shape[0], math.prod(v.shape[1:])),
                                   out_int32=out_int32, right=right,
                                   sorter=None if sorter is None else sorter.index_select(0, rows))
        return wrap(found.reshape(v.shape), input._partition, input._ragged_dims)
    scalar = isinstance(input, (int, float, bool)) or (isinstance(input, torch.Tensor) and not isinstance(input, MJT) and input.dim() == 0)
    if scalar:  # one number for every sample: each sample's answer a 0-d tensor, as dense's
        input = torch.as_tensor(input, device=sorted_sequence.device).expand(sorted_sequence.shape[0]).reshape(-1, 1)
    per_position = (sorted_sequence.dim() > 2 and isinstance(input, MJT) and input.dim() == sorted_sequence.dim()
                    and sorted_sequence.dim() - 1 not in sorted_sequence._ragged_dims
                    and input._ragged_dims == sorted_sequence._ragged_dims
                    and input._partition.same_as(sorted_sequence._partition))
    if per_position:
        # boundaries per position (B, j0, K) (NeRF's per-ray CDF): dense's N-d form, whose leading
        # dims match the values', on the packed rows, which line up
        sv = sorter._values if isinstance(sorter, MJT) else sorter
        found = torch.searchsorted(sorted_sequence._values, input._values, out_int32=out_int32, right=right, sorter=sv)
        return wrap(found, input._partition, input._ragged_dims)
    if sorted_sequence.dim() != 2 or not isinstance(input, torch.Tensor) or input.shape[0] != sorted_sequence.shape[0]:
        raise StructureError(
            f"searchsorted(): expected per-sample boundaries (B, j0) and values with the same batch, or "
            f"per-position (B, j0, …, K) with values of their structure, got "
            f"{describe(sorted_sequence)} and {describe(input)}"
        )
    n = sorted_sequence._partition.extents[0].lengths()
    if sorter is not None:
        if not (isinstance(sorter, MJT) and sorter._ragged_dims == (1,) and sorter.dim() == 2
                and same_extent(sorter._partition.extents[0], sorted_sequence._partition.extents[0])):
            raise StructureError(f"searchsorted(): expected a sorter of the boundaries' structure {describe(sorted_sequence)}, "
                                 f"got {describe(sorter)}")
        if sorter.dtype != torch.int64:
            raise RuntimeError(f"torch.searchsorted(): sorter must be a tensor of long dtype but got dtype {sorter.dtype}")
    if isinstance(input, MJT):
        k = len(input._ragged_dims)
        if input._ragged_dims != tuple(range(1, k + 1)):
            raise StructureError(f"searchsorted(): expected values whose ragged dims follow the batch dim, got {describe(input)}")
    if sorted_sequence.shape[0] <= SEARCH_PER_SAMPLE_UP_TO and not _is_traced(n):
        return _search_each(sorted_sequence, sorter, input, right, out_int32, scalar)
    bounds = sorted_sequence.to_padded_tensor(0)  # (B, N); the padding is never probed eagerly
    if sorter is not None:
        bounds = bounds.gather(1, sorter.to_padded_tensor(0))  # dense reads boundary sorter[mid] at probe mid
    dtype = torch.int32 if out_int32 else torch.int64
    b = bounds.shape[0]
    if isinstance(input, MJT):
        padded = input.to_padded_tensor(0)
        found = _bisect(bounds, n, padded.reshape(b, -1), right).to(dtype).reshape(padded.shape)
        sample, coords = input._partition.row_coords()
        return wrap(found[(sample, *coords.unbind(1))], input._partition, input._ragged_dims)
    found = _bisect(bounds, n, input.reshape(b, -1), right).to(dtype)
    return found.reshape(b) if scalar else found.reshape(input.shape)


# Up to this many samples, per-sample boundaries are searched by the dense op on each sample
# (one call each); above, all rows at once by ``_bisect`` (≈ 8 small ops per bisection step,
# whatever the batch size). Measured (one thread, 50–200 boundaries and values per sample): the
# bisection costs ≈ 0.45 ms at any B, the calls ≈ 5 µs per sample (docs/design.md).
SEARCH_PER_SAMPLE_UP_TO = 64


def _search_each(sorted_sequence: MJT, sorter, input, right: bool, out_int32: bool, scalar: bool):
    """``searchsorted`` of each sample's values among its own boundaries by the dense op itself,
    sample by sample on views of the packed rows (eager: host sizes)."""
    # SYNC: none — host lengths
    m = sorted_sequence._partition.extents[0].host_lengths().tolist()
    bounds = sorted_sequence._values.split(m)
    sorters = sorter._values.split(m) if sorter is not None else [None] * len(m)
    if isinstance(input, MJT):
        sizes = input._partition.host_sizes().tolist()
        static = input._values.shape[1:]
        rows = input._values.split([math.prod(s) for s in sizes])
        if len(sizes[0] if sizes else ()) == 1:  # one ragged dim: a sample's rows are its component
            outs = [torch.searchsorted(bd, r, right=right, sorter=so, out_int32=out_int32)
                    for bd, r, so in zip(bounds, rows, sorters)]
        else:
            outs = [torch.searchsorted(bd, r.view(*s, *static), right=right, sorter=so, out_int32=out_int32).view(r.shape)
                    for bd, r, s, so in zip(bounds, rows, sizes, sorters)]
        out = torch.cat(outs) if outs else input._values.new_empty(input._values.shape, dtype=torch.int32 if out_int32 else torch.int64)
        return wrap(out, input._partition, input._ragged_dims)
    outs = [torch.searchsorted(bd, v, right=right, sorter=so, out_int32=out_int32) for bd, v, so in zip(bounds, input, sorters)]
    if not outs:
        return torch.empty(input.shape[:1] if scalar else input.shape, dtype=torch.int32 if out_int32 else torch.int64,
                           device=input.device)
    out = torch.stack(outs)
    return out.reshape(-1) if scalar else out


def _bisect(bounds: torch.Tensor, n: torch.Tensor, values: torch.Tensor, right: bool) -> torch.Tensor:
    """Row ``i`` of ``values`` (B, M) searched among the first ``n[i]`` of row ``i`` of ``bounds``
    (B, N), every row at once by aten's own bisection (``cus_lower_bound`` / ``cus_upper_bound``):
    the same midpoints, and the same test ``!(mid >= v)`` (``>`` for ``right``), so that a NaN
    boundary or value steers each row as it steers the dense op on that sample alone. At most
    ``N.bit_length()`` steps, no host read. Traced, one padded search instead (the same answers
    for sorted rows; NaN boundaries are exact eagerly only)."""
    width = bounds.shape[1]
    if _is_traced(n) or not isinstance(width, int):
        # traced: the step count would depend on the longest sample; one search over the rows
        # padded with each row's last boundary (sorted rows: the same answers), capped at n
        pad = torch.arange(width, device=n.device).unsqueeze(0) >= n.unsqueeze(1)
        last = bounds.gather(1, (n - 1).clamp_min(0).unsqueeze(1))
        found = torch.searchsorted(torch.where(pad, last, bounds), values, right=right)
        return torch.minimum(found, n.unsqueeze(1))
    start = torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    end = n.to(torch.int64).unsqueeze(1).expand(values.shape)
    last = max(bounds.shape[1] - 1, 0)
    for _ in range(bounds.shape[1].bit_length()):
        active = start < end
        mid = start + ((end - start) >> 1)
        probe = bounds.gather(1, mid.clamp(max=last))
        after = ~(probe > values) if right else ~(probe >= values)
        start = torch.where(active & after, mid + 1, start)
        end = torch.where(active & ~after, mid, end)
    return start


# ``x.copysign_(y)`` with ``y`` requiring grad: the out-of-place op on the values (whose derivative
# of ``y`` is dense torch's zeros) written in place; aten's in-place derivative builds those zeros
# at nested-int sizes
route(torch.Tensor.copysign_)(in_place_route("copysign_"))
# and so for ``sgn_`` / ``nextafter_``, whose out-of-place routes (ops/elementwise/signs.py) give the
# derivatives dense torch does
route(torch.Tensor.sgn_)(in_place_route("sgn_"))
route(torch.Tensor.nextafter_)(in_place_route("nextafter_"))


@route(torch.broadcast_tensors)
def _broadcast_tensors(*tensors):
    """Each operand broadcast to the common shape (NOTE [ Broadcasting over ragged dims ]): a
    ``where`` with an all-False mask of that shape, so each result keeps its operand's dtype and
    its gradient sums back over the broadcast dims. Copies, where dense torch returns views."""
    if not any(isinstance(t, MJT) for t in tensors):
        return NotImplemented
    mask = None
    for t in tensors:
        z = torch.zeros_like(t, dtype=torch.bool).detach()
        mask = z if mask is None else mask | z
    return tuple(torch.where(mask, t, t) for t in tensors)


@route(torch.meshgrid, torch._C._VariableFunctions.meshgrid)
def _meshgrid(*tensors, indexing=None):
    """Per sample, dense ``meshgrid`` of the samples' vectors: multi_jagged ``(B, jᵢ)`` operands,
    each viewed along its own dim of ``(B, j₀, j₁, …)`` (the first two swapped for ``"xy"``) and
    broadcast to the common shape (copies, where dense torch returns views). A dense operand,
    one vector for every sample, would be broadcast against the batch dim: refused."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if not any(isinstance(t, MJT) for t in tensors):
        return NotImplemented
    if not all(isinstance(t, MJT) and t.dim() == 2 for t in tensors):
        raise NotImplementedError(
            f"meshgrid(): expected multi_jagged operands of 1-D samples (B, j0), got {', '.join(describe(t) for t in tensors)} "
            "(dense operands with multi_jagged ones are not supported for layout torch.multi_jagged)")
    if indexing not in (None, "ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    if any(t.dtype != tensors[0].dtype for t in tensors):
        raise RuntimeError("meshgrid(): expected all tensors to have the same dtype")
    k = len(tensors)
    where = list(range(k))
    if indexing == "xy" and k > 1:
        where[0], where[1] = 1, 0
    shaped = []
    for t, pos in zip(tensors, where):
        for _ in range(pos):
            t = t.unsqueeze(1)
        for _ in range(k - 1 - pos):
            t = t.unsqueeze(-1)
        shaped.append(t)
    return _broadcast_tensors(*shaped)


@route(torch.kron, torch.Tensor.kron)
def _kron(input, other, *, out=None):
    """Per sample, dense ``kron`` of a multi_jagged ``input`` and a dense ``other`` (shared by every
    sample): the dims interleaved, ``(a₀, b₀, a₁, b₁, …)``, as a broadcast product, then each pair
    flattened (a ragged ``aᵢ`` times a static ``bᵢ`` is a new ragged size, ``bᵢ`` its inner dim as
    in dense kron). The shorter operand takes leading dims of size 1, as in dense kron."""
    if out is not None or not (isinstance(input, MJT) or isinstance(other, MJT)):
        return NotImplemented
    if not isinstance(input, MJT) or isinstance(other, MJT):
        raise NotImplementedError(
            f"kron(): {describe(input)} and {describe(other)} are not supported for layout torch.multi_jagged "
            "(supported: a multi_jagged input and a dense other)")
    if len(input._ragged_dims) > 1:
        raise NotImplementedError(
            f"kron(): an input with several ragged dims ({describe(input)}) is not supported for layout "
            "torch.multi_jagged: each ragged dim would merge with a static one before the next ragged dim")
    nd = max(input.dim() - 1, other.dim())
    a = input
    for _ in range(nd - (input.dim() - 1)):
        a = a.unsqueeze(1)
    for i in reversed(range(nd)):  # per-sample dim i sits at i + 1: a size-1 dim after each
        a = a.unsqueeze(i + 2)
    b_sizes = (1,) * (nd - other.dim()) + tuple(other.shape)
    b = other.reshape([s for bs in b_sizes for s in (1, bs)])
    product = a * b
    for i in range(nd):
        product = product.flatten(i + 1, i + 2)
    return product


@route(torch.Tensor.expand_as)
def _expand_as(input, other):
    """A dense ``input`` expanded to a multi_jagged ``other``'s shape (``gate.expand_as(x)`` of a
    ``(B, C, 1, 1)`` gate): each sample's slice broadcast to that sample's shape, as the pointwise
    broadcasting rules (NOTE [ Broadcasting over ragged dims ]). A copy, where dense torch gives a
    view; its gradient sums back over the expanded dims."""
    if not isinstance(other, MJT):
        return NotImplemented
    if isinstance(input, MJT):
        if (len(input._size) == len(other._size) and set(input._ragged_dims) < set(other._ragged_dims)
                and all(input._size[d] != 1 for d in set(other._ragged_dims) - set(input._ragged_dims))):
            return input.expand(other.shape)  # static dims of other's ragged sizes: ``expand``'s route
        if input._ragged_dims != other._ragged_dims or len(input._size) != len(other._size) or all(
                same_extent(a, b) for a, b in zip(input._partition.extents, other._partition.extents)):
            return NotImplemented  # the expand handler's (size-1 static dims)
        # ragged dims of size 1 per sample (``x[:, 0:1].expand_as(x)``): broadcast per sample, by
        # a product with ones (exact for every value: -0.0, inf and NaN stay), on the values path
        try:
            out = input * torch.ones_like(other, dtype=input.dtype).detach()
        except StructureError as e:
            raise StructureError(f"expand_as(): {describe(input)} cannot be expanded to {describe(other)}: {e}") from e
        if out._ragged_dims != other._ragged_dims or out._values.shape[1:] != other._values.shape[1:]:
            raise StructureError(f"expand_as(): {describe(input)} cannot be expanded to {describe(other)}")
        return out
    why = f"expand_as(): the tensor of shape {describe(input)} cannot be expanded to the shape {describe(other)}"
    mask = torch.zeros_like(other, dtype=torch.bool).detach()
    try:
        out = torch.where(mask, input, input)
    except StructureError as e:
        raise StructureError(f"{why}: {e}") from e
    if not isinstance(out, MJT) or out._ragged_dims != other._ragged_dims or out.dim() != other.dim() or any(
            a != b for a, b in zip(out._values.shape[1:], other._values.shape[1:])):
        raise StructureError(why)
    return out
