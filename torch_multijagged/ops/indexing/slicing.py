"""Indexing along ragged dims, per sample: ``select`` / ``x[:, i]``, slices ``x[:, a:b:s]``,
``narrow``, ``index_select``, ``gather`` / ``take_along_dim`` / ``scatter`` / ``scatter_add`` /
``scatter_reduce`` (message passing over a batch of graphs), ``unfold`` (sliding windows) (NOTE [ Indexing along ragged dims ] in ``along.py``: which results are ragged, static or dense).
Along static dims these ops act on the values; ``gather`` / ``scatter*`` along a static dim by an
index ragged along it (each sample's own number of positions) read and write the values' elements
(``_static_places``)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ... import constructors
from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...kernels.along import packed_rows, plan_blocks, slice_bounds
from ...structure import _is_traced, building, extent_of, mapped_extent, same_extent
from .._common import MJT, canonical_dim, describe, sample_rows, static_dims
from .._routing import _scalar_name, in_place_route, route
from ..shape.views import _mark_reorder_copy, mark_view_copy
from .scatter import gather_from_dense, same_shape, scatter_into_dense
from .along import check_samples, drop_along, eager, eager_or_traced, keep_along, ragged_dim, take_static

__all__ = ["select_ragged", "slice_ragged", "narrow_ragged", "positions_ragged", "take_static"]


def _lengths(x: MJT, k: int) -> torch.Tensor:
    return x._partition.extents[k].host_lengths()


@eager_or_traced
def select_ragged(op: str, x: MJT, d: int, k: int, index: int):
    """``x.select(d, index)`` per sample: a negative index counts from each sample's end. No new
    extent, so it also traces (one graph over changing lengths)."""
    def position(n):
        return n + index if index < 0 else torch.full_like(n, index)

    def fail(s, n):
        raise IndexError(f"{op}(): index {index} is out of bounds for dimension {d} with size {n} in sample {s} of {describe(x)}")

    if ("drop_along", k, ("select", index)) not in x._partition.cache:  # (a hit was checked)
        check_samples(x, k, lambda n: (position(n) < 0) | (position(n) >= n), fail,
                      f"{op}(): index {index} is out of bounds for dimension {d} of a sample")
    out = drop_along(x, k, lambda: position(x._partition.extents[k].lengths()), key=("select", index))
    return mark_view_copy(out, x, (slice(None),) * d + (index,))  # dense: a view


@eager
def slice_ragged(op: str, x: MJT, d: int, k: int, start, stop, step: int):
    """``x[..., start:stop:step]`` along ragged dim ``d``, bounds clamped per sample."""
    if step <= 0:
        raise ValueError("step must be greater than zero")
    e = x._partition.extents[k]
    index = (slice(None),) * d + (slice(start, stop, step),)  # as given: a write back slices again
    (start, skey, _), (stop, tkey, named) = _bound(op, x, start), _bound(op, x, stop)
    key = ("slice", skey, tkey, step)
    out = e.cache.get(("mapped", key))
    if out is None:  # (a slice seen before costs dict lookups: its extent and rows are cached)
        if named is not None and torch.equal(slice_bounds(e.host_lengths(), start, stop, step)[1], named.host_lengths()):
            # ``y[..., :n]`` with ``n`` another tensor's ragged size: where every sample keeps that
            # size, the result has that nested int (a causal conv's output trimmed to its input's)
            e.cache[("mapped", key)] = named
        out = mapped_extent(e, key, lambda n: slice_bounds(n, start, stop, step)[1])
    extents = list(x._partition.extents)
    extents[k] = out

    def source(sample, a):
        first = slice_bounds(e.host_lengths(), start, stop, step)[0].to(e.offsets.device)
        a = a.clone()
        a[:, k] = first[sample] + a[:, k] * step
        return a

    def runs():
        # per sample, its rows before the slice, in it, after it: zero, gradient, zero blocks
        sizes, counts = sample_rows(x._partition)
        first, length = (t.tolist() for t in slice_bounds(e.host_lengths(), start, stop, step))
        blocks = []
        for ns, r, a, n in zip(sizes, counts, first, length):
            inner = math.prod(ns[1:])  # rows per position along the dim
            blocks += [(1, a * inner, True), (0, n * inner, True), (1, r - (a + n) * inner, True)]
        back = plan_blocks(blocks, 2)
        return back, sum(back[0][1])

    out = keep_along(x, extents, source, key=("slice", k, skey, tkey, step), runs=runs if k == 0 and step == 1 else None)
    return mark_view_copy(out, x, index)


def _bound(op: str, x: MJT, v):
    """A slice bound, its cache key and its extent: an int or None as it is (no extent); a nested
    int of this batch (an eager extent of ``x``'s batch size) as that extent's per-sample sizes,
    keyed by the nested int's id (never reused)."""
    if v is None or type(v) is int:
        return v, v, None
    e = extent_of(v) if isinstance(v, torch.SymInt) else None
    if e is None or v.node.coeff != 1 or e.batch != x._partition.batch:
        raise TypeError(f"{op}(): slice bounds along a ragged dim of {describe(x)} must be ints, None, or a ragged size "
                        f"of the same batch, got {v}")
    return e.host_lengths(), ("nested", v.node.t_id), e


@eager_or_traced
def narrow_ragged(op: str, x: MJT, d: int, k: int, start: int, length: int):
    """``x.narrow(d, start, length)`` per sample: every sample must hold ``start + length``
    (a negative ``start`` counts from its end); the dim becomes static of size ``length``."""
    if length < 0:
        raise RuntimeError(f"{op}(): length must be non-negative.")

    def first_of(n):
        return n + start if start < 0 else torch.full_like(n, start)

    def bad_start(s, n):  # dense torch's two checks, in its order and with its exception types
        raise IndexError(
            f"{op}(): start out of range (expected to be in range of [{-n}, {n}], but got {start}) in sample {s} "
            f"of {describe(x)} at dim {d}"
        )

    def bad_length(s, n):
        raise RuntimeError(
            f"{op}(): start ({start}) + length ({length}) exceeds dimension size ({n}) in sample {s} of {describe(x)} at dim {d}"
        )

    check_samples(x, k, lambda n: (first_of(n) < 0) | (first_of(n) > n), bad_start, f"{op}(): start out of range in a sample")
    check_samples(x, k, lambda n: first_of(n) + length > n, bad_length, f"{op}(): start + length exceeds the size of a sample")
    n = x._partition.extents[k].lengths()
    table = first_of(n).unsqueeze(1) + torch.arange(length, device=n.device)
    out = take_static(x, k, length, table)
    if isinstance(out, MJT) and out._values.numel():
        # dense gives a view; ours is a copy whose dim is static where ``x[index]`` would read a
        # ragged one, so it cannot be assigned back: writes into it refuse (NOTE [ Reordered ragged
        # dims are copies ] in shape/views.py)
        _mark_reorder_copy(out._values, "a narrow of a ragged dim", base=x)
    return out


@eager_or_traced
def index_select_ragged(op: str, x: MJT, d: int, k: int, index: torch.Tensor):
    if isinstance(index, MJT) or index.dim() > 1 or index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}(): expected a 1-D dense int64 index, got {describe(index)} of {index.dtype}")
    index = index.reshape(-1).to(torch.int64).to(x._partition.offsets.device)
    if index.numel():
        lo, hi = index.min(), index.max()

        def fail(s, n):
            raise IndexError(f"{op}(): index out of range in sample {s} of {describe(x)} (size {n} at dim {d})")

        # SYNC: none on the CPU; eagerly on an accelerator, the index's bounds come to the host once
        check_samples(x, k, lambda n: (n <= hi.to(n.device)) | (lo < 0).to(n.device), fail, f"{op}(): index out of range in a sample")
    return take_static(x, k, index.numel(), index)


@eager
def positions_ragged(op: str, x: MJT, d: int, k: int, index: torch.Tensor):
    """``x[:, idx]`` along ragged dim ``d`` with an index list that may hold negative positions:
    each counts from its sample's own end (as dense indexing of that sample), so the positions
    differ per sample — a ``(B, m)`` table; a position outside a sample raises, naming it."""
    index = index.reshape(-1).to(torch.int64)
    n = x._partition.extents[k].host_lengths()
    table = torch.where(index < 0, index + n[:, None], index)  # (B, m), host
    bad = ((table < 0) | (table >= n[:, None])).any(1).nonzero()
    if bad.numel():
        s_ = int(bad[0, 0])
        raise IndexError(f"{op}(): index out of range in sample {s_} of {describe(x)} (size {int(n[s_])} at dim {d})")
    return take_static(x, k, index.numel(), table.to(x._partition.offsets.device))


def _check_index_range(op: str, x: MJT, d: int, index_values: torch.Tensor, n_rows: torch.Tensor, sample: torch.Tensor):
    """Dense gather / scatter raise for an index out of range; so must we, naming the sample
    (traced: an assert in the graph)."""
    bad = (index_values < 0) | (index_values >= n_rows.reshape(-1, *([1] * (index_values.dim() - 1))))
    if _is_traced(x._partition.offsets):
        torch._assert_async(~bad.any(), f"{op}(): index out of bounds for dimension {d} in a sample")
        return
    if bool(bad.any()):  # SYNC: the check dense torch makes; free on the CPU
        row = int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0, 0])
        s = int(sample[row])
        raise RuntimeError(f"{op}(): index out of bounds for dimension {d} in sample {s} of {describe(x)}")


def _wrapped(index_values: torch.Tensor, n_rows: torch.Tensor) -> torch.Tensor:
    """``take_along_dim``'s indices taken modulo each sample's size along the dim, as dense
    ``take_along_dim`` takes them (``-1`` the last, and ``n`` the first too); a sample of size 0
    keeps them, for the range check to refuse."""
    n = n_rows.reshape(-1, *([1] * (index_values.dim() - 1)))
    return torch.where(n > 0, torch.remainder(index_values, n.clamp_min(1)), index_values)


def _distinct(v: torch.Tensor) -> torch.Tensor:
    """``v`` (index values ``(R, *static)``) without its broadcast dims: size 1 where its stride is
    0 (an ``expand``ed index, ``dst.unsqueeze(-1).expand(-1, -1, C)``), so that the arithmetic on
    it runs once per distinct element; ``.expand(v.shape)`` gives the whole back as a view."""
    at = tuple(slice(0, 1) if st == 0 and sz != 1 else slice(None) for st, sz in zip(v.stride()[1:], v.shape[1:]))
    return v[(slice(None),) + at] if any(s != slice(None) for s in at) else v


def _rows_of(op: str, x: MJT, d: int, first: torch.Tensor, idx: torch.Tensor, stride, n: torch.Tensor,
             sample: torch.Tensor, wrap: bool) -> torch.Tensor:
    """The packed row ``first + idx · stride`` of ``x`` that each element of the index values
    ``idx`` ``(R, *static)`` names (``first``, ``stride``, ``n``, ``sample``: per index row; stride
    None is 1), checked to lie in ``[0, n)`` (``wrap``: taken modulo ``n`` first). The arithmetic
    and the check run once per distinct element (``_distinct``): an expanded index keeps its
    stride-0 dims, which dense ``gather`` / ``scatter`` read fastest."""
    shape = idx.shape
    idx = _distinct(idx).to(torch.int64)
    idx = _wrapped(idx, n) if wrap else idx
    _check_index_range(op, x, d, idx, n, sample)
    lead = (-1, *([1] * (idx.dim() - 1)))
    rows = first.reshape(lead) + (idx if stride is None else idx * stride.reshape(lead))
    return rows.expand(shape)


def _index_row_plan(p, q, x_ragged: tuple, q_ragged: tuple, k: Optional[int]):
    """``(sample, first, n, stride)`` per row of an index of partition ``q`` (ragged dims
    ``q_ragged``) into a tensor of partition ``p`` (ragged dims ``x_ragged``) along its ragged dim
    ``k``: the row's sample, the packed row of ``p`` at its coordinates with 0 along ``k``, the
    sample's size along ``k`` and its row stride there (None: 1). ``k`` None (along a static dim):
    the packed row at its coordinates, and no size or stride. A map of two structures: the
    latest ``p`` is kept on ``q`` (NOTE [ Derived maps ] in structure.py), so the layers of a
    model that index one batch alike build it once."""
    key = ("index_rows", x_ragged, q_ragged, k)
    hit = q.cache.get(key)
    if hit is not None and hit[0] is p:
        return hit[1]
    with building():
        sample, coords = q.row_coords()
        first = coords[:, [q_ragged.index(r) for r in x_ragged]]  # p's coordinates (a copy)
        if k is None:  # along a static dim: the row itself
            plan = (sample, packed_rows(p.offsets, p.device_sizes(), sample, first), None, None)
        else:
            first[:, k] = 0
            n = p.device_sizes()[sample]
            stride = n[:, k + 1:].prod(1) if k + 1 < n.shape[1] else None
            plan = (sample, packed_rows(p.offsets, p.device_sizes(), sample, first), n[:, k], stride)
    if not _is_traced(p.offsets) and not _is_traced(q.offsets):
        q.cache[key] = (p, plan)  # one entry per key: the latest p
    return plan


def _index_rows(op: str, x: MJT, d: int, k: int, index, wrap: bool = False, broadcast: bool = False):
    """For ``gather`` / ``scatter`` along ragged dim ``d``: ``(rows, result, squeeze)`` — the packed
    row of ``x`` that every element of ``index`` names (shaped as ``index``'s values, or as a dense
    index moved to ``(B·m, *static)``), a function that gives a result of ``index``'s shape from
    values of that shape, and the dims of ``x``'s values to squeeze before reading them.
    ``wrap``: indices modulo the sample's size (``_wrapped``), where gather and scatter refuse any
    outside ``[0, n)``. ``broadcast`` (``take_along_dim``): a static dim of size 1 of ``x`` where
    the index has a ragged dim is read at its one position (``squeeze``), as dense broadcasting."""
    p = x._partition
    if isinstance(index, MJT) and d not in index._ragged_dims and index.dim() == x.dim():
        return _static_index_rows(op, x, d, k, index, wrap, broadcast)
    if isinstance(index, MJT):
        statics = static_dims(x.dim(), x._ragged_dims)
        spread = tuple(e for e in index._ragged_dims if e in statics and broadcast and x.shape[e] == 1)
        if index.dim() != x.dim() or index._partition.batch != p.batch or index._ragged_dims != tuple(
            sorted(x._ragged_dims + spread)
        ) or any(
            r != d and not same_extent(index._partition.extents[index._ragged_dims.index(r)], e)
            for r, e in zip(x._ragged_dims, p.extents)
        ) or any(index.shape[e] != x.shape[e] for e in statics if e not in spread):
            raise StructureError(
                f"{op}(): expected an index with the ragged dims and static sizes of {describe(x)} (any extent "
                f"along dim {d}), got {describe(index)}"
            )
        q = index._partition
        sample, first, n, stride = _index_row_plan(p, q, x._ragged_dims, index._ragged_dims, k)
        rows = _rows_of(op, x, d, first, index._values, stride, n, sample, wrap)
        return rows, lambda v: wrap_values(v, q, index._ragged_dims), tuple(statics.index(e) + 1 for e in spread)
    if x._ragged_dims != (d,) or index.dim() != x.dim() or index.shape[0] != p.batch:
        raise NotImplementedError(
            f"{op}(): a dense index along a ragged dim needs a tensor whose only ragged dim is {d} and an index "
            f"(B, …) of its rank, got {describe(x)} and {describe(index)}"
        )
    idx = index.movedim(d, 1)  # (B, m, *static)
    m = idx.shape[1]
    if tuple(idx.shape[2:]) != tuple(x._values.shape[1:]):
        raise NotImplementedError(f"{op}(): expected the index's static sizes to be those of {describe(x)}, got {describe(index)} for layout torch.multi_jagged")
    sample = torch.arange(p.batch, device=p.offsets.device).repeat_interleave(m)
    rows = _rows_of(op, x, d, p.offsets[sample], idx.reshape(p.batch * m, *idx.shape[2:]), None,
                    p.extents[0].lengths()[sample], sample, wrap)
    return rows, lambda v: v.reshape(p.batch, m, *v.shape[1:]).movedim(1, d), ()


def _static_index_rows(op: str, x: MJT, d: int, k: int, index: MJT, wrap: bool, broadcast: bool = False):
    """``_index_rows`` for a multi_jagged index whose dim ``d`` is static (``m`` positions per
    cell: ``topk``'s indices of a pair, ``(B, j0, k)`` into ``(B, j0, j0)``) and whose other dims
    are ``x``'s (``broadcast``: or ragged where ``x`` has a static 1): its ``m`` positions are
    moved into the rows, ``(R·m, *static)``, each naming a row of ``x`` in its cell's sample and
    coordinates."""
    p = x._partition
    keep = tuple(r for r in x._ragged_dims if r != d)
    statics = static_dims(x.dim(), x._ragged_dims)
    spread = tuple(e for e in index._ragged_dims if e in statics and broadcast and x.shape[e] == 1)
    if index._ragged_dims != tuple(sorted(keep + spread)) or index._partition.batch != p.batch or any(
        index.shape[e] != x.shape[e] for e in statics if e not in spread
    ) or not all(same_extent(index._partition.extents[index._ragged_dims.index(r)], e)
                 for r, e in zip(x._ragged_dims, p.extents) if r != d):
        raise StructureError(
            f"{op}(): expected an index with the ragged dims and static sizes of {describe(x)} (any extent, or a static "
            f"size, along dim {d}), got {describe(index)}"
        )
    q = index._partition
    at = static_dims(index.dim(), index._ragged_dims).index(d) + 1  # dim d among the index's values dims
    idx = index._values.movedim(at, 1)  # (R, m, *static of x)
    m = idx.shape[1]
    sample, coords = q.row_coords()
    n = p.device_sizes()[sample]
    mine = coords[:, [index._ragged_dims.index(r) for r in keep]]
    base = torch.cat([mine[:, :k], torch.zeros_like(coords[:, :1]), mine[:, k:]], 1)
    stride = n[:, k + 1:].prod(1) if k + 1 < n.shape[1] else torch.ones_like(sample)
    rows = _rows_of(op, x, d, packed_rows(p.offsets, p.device_sizes(), sample, base), idx, stride, n[:, k], sample, wrap)
    rows = rows.reshape(-1, *idx.shape[2:])  # (R·m, *static of x)
    r = idx.shape[0]

    def result(v):
        return wrap_values(v.reshape(r, m, *v.shape[1:]).movedim(1, at), q, index._ragged_dims)

    def flat(v):  # an index-shaped values tensor (a source) in the rows' order
        return v.movedim(at, 1).reshape(-1, *v.shape[1:at], *v.shape[at + 1:])

    result.flat = flat  # type: ignore[attr-defined]
    return rows, result, tuple(statics.index(e) + 1 for e in spread)


@eager_or_traced
def gather_ragged(op: str, x: MJT, d: int, k: int, index, wrap: bool = False, broadcast: bool = False):
    """``x.gather(d, index)`` per sample: ``out[s][…, j, …] = x[s][…, index[s][…, j, …], …]``
    (``wrap``: ``take_along_dim``'s indices, modulo the sample's size; ``broadcast``: its
    broadcasting of a size-1 dim of ``x``, ``_index_rows``)."""
    rows, result, squeeze = _index_rows(op, x, d, k, index, wrap, broadcast)
    v = values_of(x)
    return result((v.squeeze(squeeze) if squeeze else v).gather(0, rows))


@eager_or_traced
def scatter_ragged(op: str, x: MJT, d: int, k: int, index, src, add, include_self: bool = True):
    """``x.scatter(d, index, src)`` (``scatter_add`` with ``add`` True, ``scatter_reduce`` with
    ``add`` a reduction's name) per sample: ``out[s][…, index[s][…, j, …], …] = src[s][…, j, …]``;
    ``src`` has ``index``'s shape (a multi_jagged tensor of its structure, or a dense one for a
    dense index) or is a number."""
    rows, shaped, _ = _index_rows(op, x, d, k, index)
    if isinstance(src, MJT) and not same_shape(src, index):
        # the packed rows alone could agree while the samples do not: each sample's src would
        # then be read from its neighbours' rows
        raise StructureError(f"{op}(): expected src with the shape of index {describe(index)}, got {describe(src)}")
    if isinstance(src, torch.Tensor):
        s = values_of(src) if isinstance(src, MJT) else src.movedim(d, 1).reshape(rows.shape[0], *rows.shape[1:])
        if isinstance(src, MJT) and hasattr(shaped, "flat"):
            s = shaped.flat(s)
        if s.shape != rows.shape:
            raise StructureError(f"{op}(): expected src with the shape of index {describe(index)}, got {describe(src)}")
    else:
        s = torch.full(rows.shape, src, dtype=x.dtype, device=rows.device)
    v = values_of(x)
    if isinstance(add, str):
        out = v.scatter_reduce(0, rows, s.to(v.dtype), add, include_self=include_self)
    else:
        out = v.scatter_add(0, rows, s.to(v.dtype)) if add else v.scatter(0, rows, s.to(v.dtype))
    return wrap_values(out, x._partition, x._ragged_dims)


def _static_places(op: str, x: MJT, d: int, index: MJT, broadcast: bool = False):
    """``gather`` / ``scatter`` along static dim ``d`` of ``x`` with a multi_jagged index that is
    ragged along it (a sample's own number of positions: DETR's class cost
    ``prob.gather(2, labels (B, j0, j1))`` of ``prob (B, j0, K)``): the flat position in ``x``'s
    values (row-major) of the element every element of the index's values names. The index has ``x``'s other ragged dims and static sizes
    (``broadcast``: or a ragged dim where ``x`` has a static 1, read at its one position)."""
    p, q = x._partition, index._partition
    statics = static_dims(x.dim(), x._ragged_dims)
    spread = tuple(e for e in index._ragged_dims if e != d and e in statics and broadcast and x.shape[e] == 1)
    if index.dim() != x.dim() or q.batch != p.batch or index._ragged_dims != tuple(
        sorted(x._ragged_dims + (d,) + spread)
    ) or any(
        not same_extent(q.extents[index._ragged_dims.index(r)], e) for r, e in zip(x._ragged_dims, p.extents)
    ) or any(index.shape[e] != x.shape[e] for e in statics if e != d and e not in spread):
        raise StructureError(
            f"{op}(): expected an index with the ragged dims and static sizes of {describe(x)} (any extent, or a static "
            f"size, along dim {d}), got {describe(index)}"
        )
    sample, first, _, _ = _index_row_plan(p, q, x._ragged_dims, index._ragged_dims, None)
    sizes = [x.shape[e] for e in statics]
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]  # of x's values, row-major
    idx = index._values.to(torch.int64)
    size = x.shape[d]
    _check_index_range(op, x, d, _distinct(idx), sample.new_full((1,), size), sample)
    lead = (-1, *([1] * (idx.dim() - 1)))
    pos = first.reshape(lead) * math.prod(sizes) + idx * strides[statics.index(d)]
    for j, e in enumerate(static_dims(index.dim(), index._ragged_dims)):  # the index's values dims 1, 2, …
        at = [1] * idx.dim()
        at[j + 1] = -1
        pos = pos + torch.arange(index.shape[e], device=pos.device).reshape(at) * strides[statics.index(e)]
    return pos.expand(idx.shape)


@eager_or_traced
def gather_static(op: str, x: MJT, d: int, index: MJT, broadcast: bool = False):
    """``x.gather(d, index)`` along static dim ``d`` with an index ragged along it, per sample
    (``_static_places``): the index's structure."""
    pos = _static_places(op, x, d, index, broadcast)
    picked = values_of(x).reshape(-1).index_select(0, pos.reshape(-1))
    return wrap_values(picked.view(pos.shape), index._partition, index._ragged_dims)


@eager_or_traced
def scatter_static(op: str, x: MJT, d: int, index: MJT, src, add, include_self: bool = True):
    """``scatter`` / ``scatter_add`` / ``scatter_reduce`` (``add`` as for ``scatter_ragged``) along
    static dim ``d`` with an index ragged along it, per sample (``_static_places``); ``src`` of the
    index's shape, or a number."""
    pos = _static_places(op, x, d, index)
    if isinstance(src, MJT):
        if not same_shape(src, index):
            raise StructureError(f"{op}(): expected src with the shape of index {describe(index)}, got {describe(src)}")
        s = values_of(src).reshape(-1)
    elif isinstance(src, torch.Tensor):
        raise NotImplementedError(f"{op}(): a dense src {tuple(src.shape)} with the multi_jagged index {describe(index)} "
                                  "ragged along the scattered dim, for layout torch.multi_jagged: give a src of the index's shape")
    else:
        s = torch.full((pos.numel(),), src, dtype=x.dtype, device=pos.device)
    v = values_of(x)
    flat, at, s = v.reshape(-1), pos.reshape(-1), s.to(v.dtype)
    if isinstance(add, str):
        out = flat.scatter_reduce(0, at, s, add, include_self=include_self)
    else:
        out = flat.scatter_add(0, at, s) if add else flat.scatter(0, at, s)
    return wrap_values(out.view(v.shape), x._partition, x._ragged_dims)


# ----------------------------------------------------------------------------- routes
@route(torch.index_select, torch.Tensor.index_select)
def _index_select(input, dim, index, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    d = canonical_dim("index_select", input.dim(), dim)
    if d == 0:
        if index.dim() > 1:
            raise IndexError(f"index_select(): Index is supposed to be a vector, got {index.dim()}-D")
        return constructors.select_batch(input, index)  # samples, in the index's order
    hit = ragged_dim("index_select", input, dim)
    if hit is None:
        if isinstance(index, MJT):
            raise NotImplementedError(
                f"index_select(): along static dim {d} of {describe(input)} by a multi_jagged index {describe(index)} "
                "(an index per sample) for layout torch.multi_jagged: index by a dense vector, or gather along the "
                "dim with the index expanded to the input's other dims")
        vd = static_dims(input.dim(), input._ragged_dims).index(d) + 1
        return _static_values(input, lambda v: v.index_select(vd, index))
    return index_select_ragged("index_select", input, *hit, index)


def _static_values(x: MJT, fn):
    """``fn`` applied to the values of ``x`` (static dims only: the structure is kept)."""
    return wrap_values(fn(values_of(x)), x._partition, x._ragged_dims)


@route(torch.gather, torch.Tensor.gather)
def _gather(input, dim, index, *, sparse_grad=False, out=None):
    if isinstance(index, MJT) and isinstance(input, torch.Tensor) and not isinstance(input, MJT) and out is None \
            and isinstance(dim, int):
        return gather_from_dense("gather", input, dim, index)
    if not isinstance(input, MJT) or out is not None or not isinstance(dim, int):
        return NotImplemented
    hit = ragged_dim("gather", input, dim)
    if hit is None and _ragged_along(input, dim, index):
        return gather_static("gather", input, canonical_dim("gather", input.dim(), dim), index)
    if sparse_grad and (hit is None or hit[0] == 0):
        # a sparse gradient of a multi_jagged tensor does not exist: the gradient is dense, its
        # values the sparse one's (along a ragged dim, gather_ragged's is dense already)
        return torch.gather(input, dim, index)
    if hit is None or hit[0] == 0:
        return NotImplemented  # static dims: the op table's handler
    return gather_ragged("gather", input, *hit, index)


def _ragged_along(input: MJT, dim: int, index) -> bool:
    """Whether ``index`` is a multi_jagged index ragged along ``input``'s static dim ``dim``
    (``gather_static`` / ``scatter_static``)."""
    if not isinstance(index, MJT) or index.dim() != input.dim():
        return False
    d = canonical_dim("gather", input.dim(), dim)
    return d != 0 and d not in input._ragged_dims and d in index._ragged_dims


@route(torch.take_along_dim, torch.Tensor.take_along_dim)
def _take_along_dim(input, indices, dim=None, *, out=None):
    if out is not None:
        raise NotImplementedError("take_along_dim(): out= variants are not supported for layout torch.multi_jagged")
    if isinstance(indices, torch.Tensor) and indices.dtype != torch.int64:
        raise RuntimeError(f"take_along_dim(): dtype of indices should be Long but got {_scalar_name(indices.dtype)}")
    if isinstance(input, MJT) and dim is None and isinstance(indices, MJT):
        return _take_along_flattened(input, indices)
    if not isinstance(input, MJT) and isinstance(indices, MJT) and dim is not None:
        # a dense table read per sample by multi_jagged indices along a static dim: ``gather``'s
        # (dense input, multi_jagged index), with take_along_dim's modulo; its sizes elsewhere are
        # the indices' (dense broadcasting of a size-1 dim is not taken)
        d = canonical_dim("take_along_dim", input.dim(), dim)
        if input.dim() != indices.dim() or any(input.shape[e] != indices.shape[e] for e in range(input.dim())
                                               if e != d and e not in indices._ragged_dims):
            raise NotImplementedError(
                f"take_along_dim(): a dense input {tuple(input.shape)} with multi_jagged indices {describe(indices)} "
                "takes one of equal rank and sizes but along dim (gather's rule) for layout torch.multi_jagged")
        return torch.gather(input, d, torch.remainder(indices, input.shape[d]) if input.shape[d] else indices)
    if not isinstance(input, MJT) or dim is None:
        return NotImplemented
    hit = ragged_dim("take_along_dim", input, dim)
    d = canonical_dim("take_along_dim", input.dim(), dim)
    if isinstance(indices, MJT):
        if indices.dim() != input.dim():
            if hit is None:
                return NotImplemented
            raise RuntimeError(f"take_along_dim(): input and indices should have the same number of dimensions, but got "
                               f"{input.dim()} dimensions for input, and {indices.dim()} dimensions for indices")
        input, indices = _broadcast_along(input, indices, d)
    if (hit is None and not isinstance(indices, MJT) and isinstance(indices, torch.Tensor) and indices.dim() == input.dim()
            and indices.shape[0] in (1, input._partition.batch) and all(indices.shape[e] == 1 for e in input._ragged_dims)):
        # dense indices broadcast over the ragged dims (one index per sample, ``(B, 1, k)``): as a
        # batch of the input's structure, dense's broadcasting per sample
        indices = torch.zeros_like(input.narrow(d, 0, 1), dtype=torch.int64) + indices
    if hit is None:
        if not (isinstance(indices, MJT) and indices.dim() == input.dim()):
            return NotImplemented
        # a static dim: gather's handler (or ``gather_static`` for indices ragged along it)
        if input.shape[d] > 0:  # dense takes the indices modulo the size (``_wrapped``)
            indices = torch.remainder(indices, input.shape[d])
        if d in indices._ragged_dims:
            return gather_static("take_along_dim", input, d, indices, broadcast=True)
        return torch.gather(input, dim, indices)
    if not isinstance(indices, MJT) and indices.dim() == input.dim():
        indices = indices.expand(*[indices.shape[e] if e in (0, hit[0]) else input.shape[e] for e in range(input.dim())])
    return gather_ragged("take_along_dim", input, *hit, indices, wrap=True, broadcast=True)


def _take_along_flattened(input: MJT, indices: MJT) -> MJT:
    """``take_along_dim`` without ``dim``: dense gathers from the input flattened, by the indices
    flattened (``input.view(-1).gather(0, indices.view(-1))``), so each sample's indices address
    its own elements in row-major order (``torch.take``'s handler) and its result is one dim: the
    indices' ragged and static dims flattened into one ragged dim. As ``gather``, a negative
    index raises."""
    if indices.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"take_along_dim(): Expected dtype int32/int64 for indices, got {indices.dtype}")
    negative = indices._values < 0
    if bool(negative.any()):
        raise RuntimeError(f"take_along_dim(): index {int(indices._values[negative][0])} is out of bounds: without dim, "
                           "the indices address each sample's elements flattened, from 0")
    picked = torch.take(input, indices.long())
    return picked if picked.dim() == 2 else picked.flatten(1)


def _broadcast_along(input: MJT, indices: MJT, d: int):
    """``take_along_dim``'s broadcasting of ``input`` and ``indices`` at every dim but ``d``, as
    dense: a static 1 of ``indices`` expands to ``input``'s size there (static, or its ragged size:
    a copy of the indices), a static 1 of ``input`` to the indices' static size (a view); a static 1
    of ``input`` where the indices are ragged is read at its one position by the gather itself
    (``broadcast=True``), with no copy of ``input``."""
    statics = static_dims(input.dim(), input._ragged_dims)
    grow, spread = [-1] * input.dim(), [-1] * input.dim()
    for e in range(1, input.dim()):
        if e == d or e in indices._ragged_dims:
            continue
        if indices.shape[e] == 1 and (e not in statics or input.shape[e] != 1):
            grow[e] = input.shape[e]
        elif e in statics and input.shape[e] == 1:
            spread[e] = indices.shape[e]
    if any(s != -1 for s in grow):
        indices = indices.expand(grow)
    if any(s != -1 for s in spread):
        input = input.expand(spread)
    return input, indices


def _check_src_dtype(name: str, input, src) -> None:
    """Dense scatters take a ``src`` tensor of ``self``'s dtype only (a number is cast)."""
    if isinstance(src, torch.Tensor) and isinstance(input, torch.Tensor) and src.dtype != input.dtype:
        raise RuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype")


def _scatter_route(name: str, add: bool):
    def routed(input, dim, index, src=None, *, value=None, reduce=None, out=None):
        _check_src_dtype(name, input, src)
        if (isinstance(index, MJT) and isinstance(input, torch.Tensor) and not isinstance(input, MJT) and out is None and reduce is None
                and isinstance(dim, int)):
            # NOTE [ Scattering a batch into a dense tensor ] in scatter.py
            return scatter_into_dense(name, input, dim, index, value if src is None else src, "add" if add else None)
        if isinstance(input, MJT) and out is None and reduce is not None and not add:
            # the deprecated ``scatter(…, reduce=)``: ``scatter_reduce`` including self, as dense
            if reduce not in ("add", "multiply"):
                raise RuntimeError("reduce argument must be either add or multiply.")
            s = value if src is None else src
            if not isinstance(s, torch.Tensor):
                s = torch.full_like(index, s, dtype=input.dtype)
            return input.scatter_reduce(dim, index, s, "sum" if reduce == "add" else "prod")
        if not isinstance(input, MJT) or out is not None or reduce is not None or not isinstance(dim, int):
            return NotImplemented
        hit = ragged_dim(name, input, dim)
        if hit is None and _ragged_along(input, dim, index):
            return scatter_static(name, input, canonical_dim(name, input.dim(), dim), index, value if src is None else src, add)
        if hit is None or hit[0] == 0:
            return NotImplemented  # static dims: the op table's handler
        return scatter_ragged(name, input, *hit, index, value if src is None else src, add)

    return routed


@route(torch.scatter_reduce, torch.Tensor.scatter_reduce)
def _scatter_reduce(input, dim, index, src, reduce, *, include_self=True, out=None):
    _check_src_dtype("scatter_reduce", input, src)
    if isinstance(index, MJT) and isinstance(input, torch.Tensor) and not isinstance(input, MJT) and out is None and isinstance(dim, int):
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
        return scatter_into_dense("scatter_reduce", input, dim, index, src, reduce, bool(include_self))
    if not isinstance(input, MJT) or out is not None or not isinstance(dim, int):
        return NotImplemented
    hit = ragged_dim("scatter_reduce", input, dim)
    if hit is None and not _ragged_along(input, dim, index):
        return NotImplemented  # static dims: the op table's handler
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if hit is None:
        d = canonical_dim("scatter_reduce", input.dim(), dim)
        return scatter_static("scatter_reduce", input, d, index, src, reduce, bool(include_self))
    return scatter_ragged("scatter_reduce", input, *hit, index, src, reduce, bool(include_self))


route(torch.scatter, torch.Tensor.scatter)(_scatter_route("scatter", False))
route(torch.scatter_add, torch.Tensor.scatter_add)(_scatter_route("scatter_add", True))


for _name in ("scatter_", "scatter_add_", "scatter_reduce_"):
    # a dense self too: ``torch.zeros(B, E).scatter_add_(1, experts, ones)`` (NOTE [ Scattering a
    # batch into a dense tensor ] in scatter.py)
    route(getattr(torch.Tensor, _name))(in_place_route(_name, dense_self=True))


@route(F.glu)
def _glu(input, dim=-1):
    """``F.glu`` along a ragged dim: each sample's first half gated by its second,
    ``x[:n/2] · σ(x[n/2:])`` along it, as dense; every sample's size there must be even. Along an
    even static dim under autograd, the same composition: aten's ``glu_backward`` has a derivative
    that asks for concrete sizes (a second order would raise); otherwise the op table's handler."""
    if not isinstance(input, MJT):
        return NotImplemented
    d = canonical_dim("glu", input.dim(), dim)
    if torch.compiler.is_compiling():
        return NotImplemented  # traced: the handler names the ragged dim
    if d not in input._ragged_dims:
        if not (torch.is_grad_enabled() and input.requires_grad and input.shape[d] % 2 == 0):
            return NotImplemented  # the op table's handler (an odd size: aten's error)
    else:
        n = _lengths(input, input._ragged_dims.index(d))
        odd = (n % 2).nonzero()
        if odd.numel():
            s = int(odd[0])
            raise RuntimeError(f"glu(): Halving dimension must be even, but dimension {d} is size {int(n[s])} "
                               f"in sample {s} of {describe(input)}")
    half = input.shape[d] // 2
    head = (slice(None),) * d
    return input[head + (slice(None, half),)] * torch.sigmoid(input[head + (slice(half, None),)])


@eager
def unfold_ragged(op: str, x: MJT, d: int, k: int, size: int, step: int):
    """``x.unfold(d, size, step)`` along ragged dim ``d``, per sample: its windows, ``m = (n - size)
    // step + 1`` of them along ``d`` (a new extent), their ``size`` elements in a new last dim.
    Every sample must hold ``size`` elements (dense torch's rule, so an empty sample raises)."""
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")  # dense torch's words
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if size == 0:
        raise NotImplementedError(f"{op}(): windows of size 0 along ragged dim {d} of {describe(x)} for layout torch.multi_jagged")

    def fail(s, n):
        raise RuntimeError(f"{op}(): maximum size for tensor at dimension {d} is {n} but size is {size} in sample {s} of {describe(x)}")

    check_samples(x, k, lambda n: n < size, fail, f"{op}(): a sample is shorter than the window")
    out = mapped_extent(x._partition.extents[k], ("unfold", size, step), lambda n: (n - size) // step + 1)
    extents = list(x._partition.extents)
    extents[k] = out

    def element(t: int):
        def source(sample, a):
            a = a.clone()
            a[:, k] = a[:, k] * step + t
            return a

        return source

    out = torch.stack([keep_along(x, extents, element(t)) for t in range(size)], dim=-1)
    _mark_reorder_copy(out._values, "windows along a ragged dim (unfold)", base=x)  # dense: a view; windows overlap
    return out


@route(torch.Tensor.unfold)
def _unfold(input, dimension, size, step):
    """``x.unfold(d, size, step)`` along a ragged dim (``unfold_ragged``); along a static dim it
    acts on the values (``aten.unfold``'s handler)."""
    if not isinstance(input, MJT):
        return NotImplemented
    hit = ragged_dim("unfold", input, dimension)
    if hit is None:
        return NotImplemented
    return unfold_ragged("unfold", input, *hit, size, step)
