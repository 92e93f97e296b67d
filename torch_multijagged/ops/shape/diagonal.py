"""Diagonals of multi_jagged tensors (``diagonal`` and its backward): over two static dims a view
of the values; over the two ragged dims of a square pair the cells ``(a, a + offset)`` gathered;
over a ragged and a static dim each sample's own diagonal, ``min`` of its two sides long (a new
extent)."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ...errors import StructureError
from ...kernels.along import packed_rows
from .._table import register_multi_jagged_func
from ...structure import extent_of, mapped_extent, partition_for, same_extent
from .._common import canonical_dim, describe, static_dims, wrap
from .views import _mark_reorder_copy

aten = torch.ops.aten

__all__ = ["square_extent"]


# ----------------------------------------------------------------------------- diagonal
_DIAGONAL = "a diagonal of ragged dims (x.diagonal(), a copy where dense gives a view)"

def _diag_dims(op: str, inp_ndim: int, ragged_dims, offset, dim1, dim2):
    a, b = canonical_dim(op, inp_ndim, dim1), canonical_dim(op, inp_ndim, dim2)
    if a == b:
        raise ValueError(f"{op}(): expected distinct dims, got dim1 = dim2 = {a}")
    if 0 in (a, b):
        raise StructureError(f"{op}(): cannot take a diagonal over the batch dim of a multi_jagged tensor")
    ragged = (a in ragged_dims) + (b in ragged_dims)
    if (ragged == 1 or (ragged == 2 and offset != 0)) and torch.compiler.is_compiling():
        raise NotImplementedError(
            f"{op}(): a diagonal with offset {offset} over dims {a}, {b} of ragged dims {tuple(ragged_dims)} makes a new "
            "extent, which needs the lengths on the host: not under torch.compile for layout torch.multi_jagged"
        )
    if a > b:
        offset = -offset  # dense: the diagonal of the transposed matrix
    return min(a, b), max(a, b), ragged, offset


# A diagonal over a ragged dim and a static one (a sample's ``(n, C)`` matrix): cell ``k`` of
# each sample's diagonal is ``(k + max(−offset, 0), k + max(offset, 0))`` of dims ``(a, b)``, and
# the sample's diagonal is ``min(size_a − max(−offset, 0), size_b − max(offset, 0))`` long, at
# least 0: a new extent mapped from the ragged one (``mapped_extent``: equal rules give one
# nested int), appended last as dense appends the diagonal.
def _mixed_plan(inp, a: int, b: int, offset: int):
    """``(out partition, input row of every output row, static coordinate of every output row,
    values dim of the static side)`` of the diagonal over dims ``a < b``, one ragged."""
    p = inp._partition
    r, st = (a, b) if a in inp._ragged_dims else (b, a)
    k = inp._ragged_dims.index(r)
    size = int(inp._size[st])
    shift_a, shift_b = max(-offset, 0), max(offset, 0)
    shift_r, shift_s = (shift_a, shift_b) if r == a else (shift_b, shift_a)
    rule = ("diagonal_beside", r == a, size, offset)
    diag = mapped_extent(p.extents[k], rule, lambda n: torch.minimum(n - shift_r, torch.full_like(n, size - shift_s)).clamp_min(0))
    out = partition_for([e for i, e in enumerate(p.extents) if i != k] + [diag])

    def rows(out):
        sample, coords = out.row_coords()
        pos = coords[:, -1]
        full = [coords[:, i] for i in range(coords.shape[1] - 1)]
        full.insert(k, pos + shift_r)
        return packed_rows(p.offsets, p.device_sizes(), sample, torch.stack(full, 1)), pos + shift_s

    row, col = out.derived(("diagonal_beside_rows", p, k, rule), rows)
    vd = static_dims(len(inp._size), inp._ragged_dims).index(st) + 1
    return out, row, col, vd


def _diagonal_rows(full, out, a: int, b: int, offset: int = 0) -> torch.Tensor:
    """Row of the ``full`` partition holding, for every row of the ``out`` partition, the cell
    ``(a, a + offset)`` (``offset ≥ 0``) or ``(a − offset, a)`` of ``full``'s ragged dims ``a < b``
    (storage order; one extent): ``out`` holds ``full``'s other ragged dims in order, then the
    diagonal's, whose extent is the pair's shortened by ``|offset|``. Cached on ``out``; the key
    holds ``full`` itself, so its id cannot be reused while the entry lives. For a square pair
    (no other ragged dim) the formula ``o²_i + a·(n_i + 1) + offset`` (or ``… + |offset|·n_i``);
    with other ragged dims, the cell's coordinates packed into ``full``'s rows."""

    def square(out):
        sample = out.row_sample()
        local = torch.arange(out.rows, device=out.offsets.device) - out.offsets[sample]
        n = full.extents[a].lengths().to(out.offsets.device)[sample]
        shift = offset if offset >= 0 else -offset * n
        return full.offsets[sample] + local * (n + 1) + shift

    def general(out):
        sample, coords = out.row_coords()
        k = coords[:, -1]
        others = [coords[:, i] for i in range(coords.shape[1] - 1)]
        first, second = (k, k + offset) if offset >= 0 else (k - offset, k)
        others.insert(a, first)
        others.insert(b, second)
        return packed_rows(full.offsets, full.device_sizes(), sample, torch.stack(others, 1))

    return out.derived(("diagonal_rows", full, offset, a, b), square if full.nragged == 2 else general)


def _diagonal_extent(e, offset: int):
    """The extent of the diagonal at ``offset`` of a square pair of extent ``e``: ``max(n − |offset|, 0)``
    per sample, one nested int for ``offset`` and ``−offset``."""
    k = abs(offset)
    return e if k == 0 else mapped_extent(e, ("diagonal", k), lambda n: (n - k).clamp_min(0))


def square_extent(op: str, inp, a: int, b: int, context: str = ""):
    """The extent of ragged dims ``a`` and ``b`` of ``inp`` where they are one extent (the two dims
    of a square pair, other ragged dims beside them or not); else a NotImplementedError naming
    ``op`` (``context`` says more, e.g. the einsum equation)."""
    p = inp._partition
    ea, eb = p.extents[inp._ragged_dims.index(a)], p.extents[inp._ragged_dims.index(b)]
    if not same_extent(ea, eb):
        raise NotImplementedError(
            f"{op}(): a diagonal over ragged dims needs a square pair (two ragged dims of one extent), got "
            f"{describe(inp)} for layout torch.multi_jagged{context}"
        )
    return ea


def _diagonal_partition(extents, a: int, b: int, diag):
    """The partition of a diagonal over ragged dims ``a < b`` (storage order) of ``extents``:
    the other extents in order, then the diagonal's ``diag`` (dense appends the diagonal last)."""
    return partition_for([e for i, e in enumerate(extents) if i not in (a, b)] + [diag])


@register_multi_jagged_func(aten.diagonal.default, "self: mjt, offset: any?, dim1: any?, dim2: any?")
def diagonal_default(func, inp, offset=0, dim1=0, dim2=1):
    """Diagonal as dense torch defines it (the two dims removed, the diagonal appended last).
    Over two static dims: a view of the values. Over the two ragged dims of a square pair
    ``(B, j0, j0, *S)``: the cells ``(a, a + offset)`` gathered — ``(B, *S, j0)`` with the singles'
    partition (at ``offset ≠ 0`` a new extent, ``max(n − |offset|, 0)`` per sample); a copy
    (NOTE [ Reordered ragged dims are copies ])."""
    ndim = len(inp._size)
    stat = static_dims(ndim, inp._ragged_dims)
    a, b, ragged, offset = _diag_dims("diagonal", ndim, inp._ragged_dims, offset, dim1, dim2)
    if ragged == 1:
        out, row, col, vd = _mixed_plan(inp, a, b, offset)
        picked = inp._values.index_select(0, row).movedim(vd, 1)
        values = picked[torch.arange(picked.shape[0], device=picked.device), col]
        _mark_reorder_copy(values, _DIAGONAL, base=inp)
        out_ragged = tuple(r - (r > a) - (r > b) for r in inp._ragged_dims if r not in (a, b)) + (ndim - 2,)
        return wrap(values, out, out_ragged)
    if not ragged:
        values = inp._values.diagonal(offset, stat.index(a) + 1, stat.index(b) + 1)
        out_ragged = tuple(r - (r > a) - (r > b) for r in inp._ragged_dims)
        return wrap(values, inp._partition, out_ragged)
    e = square_extent("diagonal", inp, a, b)
    p = inp._partition
    ka, kb = inp._ragged_dims.index(a), inp._ragged_dims.index(b)
    out = _diagonal_partition(p.extents, ka, kb, _diagonal_extent(e, offset))
    values = inp._values.index_select(0, _diagonal_rows(p, out, ka, kb, offset))
    _mark_reorder_copy(values, _DIAGONAL, base=inp)
    out_ragged = tuple(r - (r > a) - (r > b) for r in inp._ragged_dims if r not in (a, b)) + (ndim - 2,)
    return wrap(values, out, out_ragged)


@register_multi_jagged_func(aten.diagonal_backward.default, "grad: mjt, input_sizes: any, offset: any, dim1: any, dim2: any")
def diagonal_backward_default(func, grad, input_sizes, offset, dim1, dim2):
    ndim = len(input_sizes)
    in_ragged = tuple(d for d in range(1, ndim) if is_nested_int(input_sizes[d]))
    stat = static_dims(ndim, in_ragged)
    static_sizes = [input_sizes[d] for d in stat]
    v = grad._values
    a, b, ragged, offset = _diag_dims("diagonal_backward", ndim, in_ragged, offset, dim1, dim2)
    if ragged == 1:
        extents = [extent_of(input_sizes[d]) for d in in_ragged]
        if any(e is None for e in extents):
            raise NotImplementedError("diagonal_backward(): the input's ragged size is not an eager nested int")
        full = partition_for(extents)
        like = _Sized(full, in_ragged, input_sizes)
        _, row, col, vd = _mixed_plan(like, a, b, offset)
        shape = [full.rows] + static_sizes
        moved = v.new_zeros([shape[0], shape[vd], *[s for i, s in enumerate(shape) if i not in (0, vd)]])
        moved = moved.index_put((row, col), v)
        return wrap(moved.movedim(1, vd), full, in_ragged)
    if not ragged:
        values = func(v, [v.shape[0], *static_sizes], offset, stat.index(a) + 1, stat.index(b) + 1)
        return wrap(values, grad._partition, in_ragged)
    # the input's own extents (a pair of two nested ints with equal lengths, as einsum's 'bii'
    # reads one, gets its gradient in its own shape)
    extents = [extent_of(input_sizes[d]) for d in in_ragged]
    ka, kb = in_ragged.index(a), in_ragged.index(b)
    if any(e is None for e in extents):
        if offset != 0:
            raise NotImplementedError("diagonal_backward(): the input's ragged size is not an eager nested int")
        extents = list(grad._partition.extents[:-1])  # the grad's: the other dims, then the diagonal's
        extents[ka:ka] = [grad._partition.extents[-1]]
        extents[kb:kb] = [grad._partition.extents[-1]]
    full = partition_for(extents)
    rows = _diagonal_rows(full, grad._partition, ka, kb, offset)
    values = v.new_zeros((full.rows, *v.shape[1:])).index_copy(0, rows, v)
    return wrap(values, full, in_ragged)


class _Sized:
    """What ``_mixed_plan`` reads of an input known by its partition and sizes alone (the
    backward's ``input_sizes``)."""

    def __init__(self, partition, ragged_dims, sizes) -> None:
        self._partition, self._ragged_dims, self._size = partition, tuple(ragged_dims), tuple(sizes)
