"""Indexing-style ops: ``masked_select``, ``index_put`` / ``x[idx] = v`` (with ``index`` for its
gradient), ``unique_consecutive``, and ``bmm`` / ``grouped_mm`` with a dense per-sample operand
(``embedding`` and ``embedding_bag``: ``embedding.py``).

NOTE [ Indices on packed rows ]

An index into the batch dim and the ragged dims of a multi_jagged tensor names packed rows: for
sample ``b`` and ragged coordinates ``(a_1..a_q)`` of the first ``q`` ragged dims (storage order,
NOTE [ Packed-row partition ] in structure.py) the rows are the contiguous block that starts at
``offsets[b] + Σ_k a_k Π_{l>k} n_{b,l}`` and holds ``Π_{l>q} n_{b,l}`` rows. Indices over a logical
prefix ``0..k-1`` index the batch dim, the ragged dims among them and the static dims among them;
on the packed values that is ``[rows, *static indices]`` with the remaining dims in the same order,
so ``index_put`` / ``index`` run as the dense op on the values. When every ragged dim is indexed
(``x[b, a] = v``, torch.jagged's case) each index names one row and nothing is copied or synced;
when some ragged dims are left whole (``x[b] = v``) the blocks are expanded to rows, which needs
their total on the host (torch.jagged pads instead).

NOTE [ Batched matmul with a dense per-sample operand ]

``(B, j, D) @ (B, D, E)`` multiplies every packed row of sample ``b`` by ``other[b]``. Gathering
``other[row_sample]`` copies a ``(D, E)`` matrix per row (T·D·E elements); the padded batched
product ``to_padded (B, max j, D) @ (B, D, E)`` pays ``1/ρ`` in rows instead and keeps ``other``
as it is. Measured on CPU float32, one thread, B = 64, j uniform in [50, 150] (T = 6166,
ρ = 0.64), D = E = 64, forward medians of 15 interleaved runs: gather 250–350 ms, padded 12–16 ms
(15–28× in favour of padding on this shared machine; the gather writes 101 MB), so the padded
form is used (see docs/design.md). The transposed case ``(B, F, E) @ (B, E, j)`` is the same product on the
packed rows with ``other[b]ᵀ``, and the gradient of the dense operand, ``(B, D, j) @ (B, j, E)``
contracting the ragged dim, is a padded batched product too (zeros in the padding add nothing).
"""

from __future__ import annotations

import math

import torch

from ...bridge import relabel
from ...tensor import values_of, wrap_values
from ...kernels.along import packed_rows
from ...structure import Partition, RaggedExtent, partition_for
from .._table import register_multi_jagged_func
from .._common import MJT, autocast_lower, canonical_dim, describe, eager_route, wrap
from ..shape.padded import _padded_positions
from .. import bridged
from ..contractions.matmul import broadcast_matmul
from ..contractions.ragged_mm import matmul_spec
from .._routing import _needs_grad, _uniform, route

aten = torch.ops.aten

__all__: list[str] = []

_LAYOUT = "layout torch.multi_jagged"


# --------------------------------------------------------------------------- masked_select
def _ragged_lead(x: MJT) -> bool:
    """Ragged dims first (``(B, j0, …)``, ``(B, j0, j1, …)``): then the packed values list each
    sample's elements in the component's own row-major order."""
    return x._ragged_dims == tuple(range(1, len(x._ragged_dims) + 1))


def _same_structure(op: str, x: MJT, other: MJT, what: str) -> None:
    if not (x._ragged_dims == other._ragged_dims and len(x._size) == len(other._size)
            and x._values.shape[1:] == other._values.shape[1:] and x._partition.same_as(other._partition)):
        raise RuntimeError(
            f"{op}(): expected {what} of the input's shape {describe(x)} (the same ragged structure), "
            f"got {describe(other)}"
        )


def _selected_partition(mask: MJT, values_mask: torch.Tensor) -> Partition:
    counts = values_mask.flatten(1).sum(1) if values_mask.dim() > 1 else values_mask.to(torch.int64)
    per_row = torch.zeros(mask._partition.batch, dtype=torch.int64, device=values_mask.device)
    per_row = per_row.index_add(0, mask._partition.row_sample(), counts.to(torch.int64))
    # SYNC: the output's ragged extent is the number of selected elements per sample, which only
    # the mask's data decides (dense masked_select syncs to size its output too).
    return partition_for([RaggedExtent.from_lengths(per_row.cpu(), values_mask.device)])


def _logical_order(x: MJT, mask_values: torch.Tensor, every: bool = False) -> torch.Tensor:
    """For a static dim before a ragged one (``(B, S, j0, C)``), the packed values do not list a
    sample's elements in its row-major order: the permutation that sorts the selected elements
    (storage order) by their row-major position in the batch; with ``every``, all the elements
    (flattened)."""
    p = x._partition
    sample, coords = p.row_coords()
    nd = len(x._size)
    sizes = p.device_sizes()[sample]  # (T, R)
    extent = [sizes[:, x._ragged_dims.index(d)] if d in x._ragged_dims else x._size[d] for d in range(1, nd)]
    static_numel = 1
    for d in range(1, nd):
        if d not in x._ragged_dims:
            static_numel *= x._size[d]
    lead = (-1,) + (1,) * (mask_values.dim() - 1)
    key = (p.offsets[sample] * static_numel).view(lead)  # the sample's first element
    stride = torch.ones_like(sample)
    s = mask_values.dim() - 1
    for d in reversed(range(1, nd)):
        if d in x._ragged_dims:
            key = key + (coords[:, x._ragged_dims.index(d)] * stride).view(lead)
        else:
            shape = [1] * mask_values.dim()
            shape[s] = -1
            key = key + torch.arange(x._size[d], device=stride.device).view(shape) * stride.view(lead)
            s -= 1
        stride = stride * extent[d - 1]
    key = key.expand(mask_values.shape)
    return torch.argsort(key.reshape(-1) if every else key.masked_select(mask_values))


@register_multi_jagged_func(aten.masked_select.default, "self: mjt, mask: mjt")
def masked_select_default(func, x, mask):
    """``(B, …)`` → ``(B, j)``: each sample's selected elements, in its row-major order (as
    torch.jagged's, which takes ``(B, j0)`` only; here any structure)."""
    _same_structure("masked_select", x, mask, "a mask")
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    out = func(x._values, mask._values)
    if not _ragged_lead(x):
        out = out[_logical_order(x, mask._values)]
    return wrap(out, _selected_partition(mask, mask._values), (1,))


@register_multi_jagged_func(aten.masked_scatter.default, "self: mjt, mask: mjt, source: any")
def masked_scatter_default(func, x, mask, source):
    """Per sample, as dense ``masked_scatter``: sample ``b``'s selected elements (in its row-major
    order) take the first elements of *its own* source in row-major order — a multi_jagged
    ``source`` of any structure: the ``(B, j)`` result of ``masked_select`` (its gradient), or a
    tensor of ``x``'s structure. A dense
    ``source`` is one for every sample: each sample starts at its first element."""
    xv, sv = x._values, source._values if isinstance(source, MJT) else source
    return wrap(_scattered(x, mask, source, xv, sv), x._partition, x._ragged_dims)


def _scattered(x: MJT, mask: MJT, source: torch.Tensor, xv: torch.Tensor, sv: torch.Tensor) -> torch.Tensor:
    """The values of ``x.masked_scatter(mask, source)`` from ``xv`` and ``sv`` standing for x's and
    the source's values (``values_of`` on the route: the result is then differentiable in both,
    to any order, by dense ops)."""
    if (mask._ragged_dims == x._ragged_dims and mask._partition.same_as(x._partition)
            and mask._values.dim() == xv.dim() and mask._values.shape[1:] != xv.shape[1:]
            and all(a in (1, b) for a, b in zip(mask._values.shape[1:], xv.shape[1:]))):
        # a mask of size 1 at static dims broadcasts there, as dense masked_scatter's does
        mask = MJT(mask._values.expand(xv.shape), x._partition, x._ragged_dims)
    _same_structure("masked_scatter", x, mask, "a mask")
    if isinstance(source, MJT) and source._partition.batch != x._partition.batch:
        raise RuntimeError(f"masked_scatter(): expected a source of batch size {x._partition.batch}, got {describe(source)}")
    if sv.dtype != xv.dtype:
        raise RuntimeError(f"masked_scatter(): expected self and source to have same dtypes but got {xv.dtype} and {sv.dtype}")
    m = mask._values
    if m.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter(): only boolean masks are supported, got a mask of dtype {m.dtype}")
    src = sv.reshape(-1)
    if isinstance(source, MJT) and not _ragged_lead(source) and src.numel():
        # a static dim before a ragged one (``(B, S, j0, C)``): each sample's elements in its
        # row-major order first (samples stay grouped, so their starts are unchanged)
        src = src.index_select(0, _logical_order(source, sv, every=True))
    if src.numel() == 0:  # nothing to read: only an empty selection is valid
        torch._assert_async(~m.any(), _TOO_FEW)
        return xv.clone()
    # every element reads its would-be source element (0 where unselected), and ``where`` keeps
    # the selected ones: no data-dependent size, so a compiled graph needs no unbacked symbol
    picked = src[_source_positions(x, m, source)].view(m.shape)
    return torch.where(m, picked, xv)


_TOO_FEW = "masked_scatter: expected source to have at least as many elements as the ones in each sample's mask"


def _source_positions(x: MJT, mask_values: torch.Tensor, source) -> torch.Tensor:
    """For every element of ``x`` (storage order, flattened), the position in the flattened source
    values that it takes if selected: its sample's source start plus its rank among the sample's
    selected elements in row-major order; 0 where unselected. Bounds are checked per sample without
    a sync."""
    p = x._partition
    sel = mask_values.reshape(-1).to(torch.int64)
    per_row = sel.shape[0] // mask_values.shape[0] if mask_values.shape[0] else 1
    sample = p.row_sample().repeat_interleave(per_row) if per_row != 1 else p.row_sample()
    if _ragged_lead(x):  # storage order is each sample's row-major order, samples in turn
        seen = sel.cumsum(0)
    else:
        order = _logical_order(x, mask_values, every=True)
        seen = torch.empty_like(sel).index_copy(0, order, sel.index_select(0, order).cumsum(0))
    counts = torch.zeros(p.batch, dtype=torch.int64, device=sel.device).index_add(0, sample, sel)
    rank = seen - 1 - (counts.cumsum(0) - counts).index_select(0, sample)
    if isinstance(source, MJT):
        per_src = math.prod(source._values.shape[1:])
        starts = source._partition.offsets * per_src
        available = (starts[1:] - starts[:-1]).index_select(0, sample)
        pos = starts[:-1].index_select(0, sample) + rank
    else:
        available = source.numel()
        pos = rank
    chosen = sel.bool()
    torch._assert_async((~chosen | (rank < available)).all(), _TOO_FEW)
    return torch.where(chosen, pos, 0)


class _MaskedSelect(torch.autograd.Function):
    """aten's ``masked_select_backward`` infers a size from the input's concrete sizes, which a
    multi_jagged tensor does not have: the gradient is ``masked_scatter`` into zeros here, whose
    own gradient is ``masked_select`` again (so every order is defined)."""

    @staticmethod
    def forward(ctx, x, mask):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes
        ctx.save_for_backward(x.detach(), mask)  # x only for its structure
        return aten.masked_select.default(x, mask)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None
        x, mask = ctx.saved_tensors
        return _ScatterSelected.apply(grad, x, mask), None


class _ScatterSelected(torch.autograd.Function):
    """``masked_scatter(zeros_like(like), mask, source)``: the gradient of ``_MaskedSelect``."""

    @staticmethod
    def forward(ctx, source, like, mask):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(like, mask)
        ctx.source_partition = source._partition if isinstance(source, MJT) else None
        return aten.masked_scatter.default(torch.zeros_like(like), mask, source)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None, None
        _, mask = ctx.saved_tensors
        out = _MaskedSelect.apply(grad, mask)
        # the selection's extent is new; the engine wants the source's own nested int back
        return (out if ctx.source_partition is None else relabel(out, ctx.source_partition)), None, None


@route(torch.masked_select, torch.Tensor.masked_select)
def _masked_select(input, mask, *, out=None):
    if out is not None or not isinstance(input, MJT):
        return NotImplemented
    if isinstance(mask, torch.Tensor) and not isinstance(mask, MJT) and mask.dtype == torch.bool:
        # a dense mask broadcast over every sample, as dense per sample (a 0-d one, one per feature)
        mask = torch.zeros_like(input, dtype=torch.bool) | mask
    if not isinstance(mask, MJT):
        raise RuntimeError(
            f"masked_select(): expected a boolean mask, multi_jagged of the input's shape {describe(input)} or dense "
            f"broadcasting over it, got {describe(mask)}"
        )
    static = [d for d in range(1, input.dim()) if d not in input._ragged_dims]
    if mask.dim() == input.dim() and mask._ragged_dims == input._ragged_dims and any(
            mask.shape[d] == 1 != input.shape[d] for d in static):
        mask = mask.expand_as(input)  # static dims of size 1 broadcast, as dense (``(B, j0, 1)`` for ``(B, j0, C)``)
    if torch.is_grad_enabled() and input.requires_grad:
        return _MaskedSelect.apply(input, mask)
    return aten.masked_select.default(input, mask)


@route(torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere)
def _nonzero(input, *, out=None, as_tuple=False):
    """``(B, j, D)``: each sample's nonzero positions (its ``D`` dims), in its row-major order, as
    dense ``nonzero`` per sample (``_nonzero_positions``). ``as_tuple=True`` gives the ``D``
    columns ``(B, j)``."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    out = _nonzero_positions(input)
    return out.unbind(-1) if as_tuple else out  # (the columns on one extent)


# Samples of at least this many elements on average run one dense ``nonzero`` each, straight into
# their rows of the output; smaller ones share one ``nonzero`` of the packed values (measured,
# docs/design.md §21)
_ELEMENTS_PER_SAMPLE = 2048


def _nonzero_positions(x: MJT) -> MJT:
    """``(B, j, D)``: the coordinates of every nonzero element of each sample (its ``D`` dims), in
    its row-major order. With one leading ragged dim and long samples, dense ``nonzero`` of each
    sample's rows (its component) writes into its rows of the output, after a count per sample;
    otherwise one ``nonzero`` of the packed values gives each element's packed row and static
    coordinates, its ragged coordinates are its row's (``Partition.row_coords``), and the count
    per sample is where the samples' first rows fall among the (sorted) rows."""
    v = x._values
    p = x._partition
    if p.nragged == 1 and _ragged_lead(x) and v.is_cpu and v.numel() >= _ELEMENTS_PER_SAMPLE * max(p.batch, 1):
        pieces = v.split_with_sizes(p.extents[0].host_lengths().tolist())
        counts = [int(torch.count_nonzero(q)) for q in pieces]  # SYNC: none — CPU tensors
        out = torch.empty(sum(counts), v.dim(), dtype=torch.int64, device=v.device)
        for q, o in zip(pieces, out.split_with_sizes(counts)):
            if o.shape[0]:
                torch.nonzero(q, out=o)
        extent = RaggedExtent.from_lengths(torch.tensor(counts, dtype=torch.int64), v.device)
        return wrap(out, partition_for([extent]), (1,))
    # SYNC: the number of nonzeros sizes the output (dense ``nonzero`` syncs for it too)
    at = v.nonzero()
    row = at[:, 0]
    # SYNC: the output's extent, the count per sample (as dense ``nonzero``)
    counts = torch.searchsorted(row, p.offsets).diff().cpu()
    if p.nragged == 1:  # the row's column becomes the ragged coordinate
        out = at
        out[:, 0] = p.row_coords()[1][:, 0].index_select(0, row)
    else:
        out = torch.cat([p.row_coords()[1].index_select(0, row), at[:, 1:]], 1)
    if not _ragged_lead(x):  # the logical order of the dims, then of the elements
        statics = [d for d in range(1, len(x._size)) if d not in x._ragged_dims]
        order = [x._ragged_dims.index(d) if d in x._ragged_dims else len(x._ragged_dims) + statics.index(d)
                 for d in range(1, len(x._size))]
        out = out[:, order][_logical_order(x, v != 0)]
    return wrap(out, partition_for([RaggedExtent.from_lengths(counts, v.device)]), (1,))


@route(torch.where)
def _where_condition(condition, input=None, other=None, *, out=None):
    """``torch.where(condition)`` alone: ``nonzero(condition, as_tuple=True)``, each sample's
    coordinates ``(B, j)`` per dim, as dense torch's one-argument ``where`` is its ``nonzero``."""
    if input is not None or other is not None or out is not None or not isinstance(condition, MJT):
        return NotImplemented
    return _nonzero(condition, as_tuple=True)


@route(torch.Tensor.masked_scatter_)
def _masked_scatter_(input, mask, source):
    """In place: the out-of-place ``masked_scatter`` copied into ``input`` (autograd records the
    copy, so gradients reach ``input``'s unmasked elements and the source)."""
    if not isinstance(input, MJT) or not isinstance(source, torch.Tensor):
        return NotImplemented
    return input.copy_(torch.masked_scatter(input, mask, source))


@route(torch.masked_scatter, torch.Tensor.masked_scatter)
def _masked_scatter(input, mask, source):
    """On the values under autograd (``_scattered``): the gradients of ``input`` and of the source
    are dense ops' (a ``where`` and a gather), aten's ``masked_scatter_backward`` pads to the
    source's concrete sizes, which a multi_jagged source does not have."""
    if not isinstance(input, MJT) or not isinstance(source, torch.Tensor):
        return NotImplemented
    if isinstance(mask, torch.Tensor) and not isinstance(mask, MJT) and mask.dtype == torch.bool:
        mask = torch.zeros_like(input, dtype=torch.bool) | mask  # a dense mask broadcast over every sample
    if not isinstance(mask, MJT):
        return NotImplemented
    sv = values_of(source) if isinstance(source, MJT) else source
    return wrap_values(_scattered(input, mask, source, values_of(input), sv), input._partition, input._ragged_dims)


# --------------------------------------------------------------------------- unique_consecutive
@route(torch.unique_consecutive, torch.Tensor.unique_consecutive)
def _unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """Along the ragged dim of ``(B, j0, …)``, per sample: each run of equal rows kept once
    (collapsing repeats, as a CTC decoder does), a new extent; the inverse ``(B, j0)`` gives each
    row's run within its sample, the counts ``(B, j)`` each run's length. Runs never cross samples.
    With ``dim=None`` it is dense torch's over every element in row-major order (dense results,
    the inverse shaped as the input), as ``unique``. The values are differentiable (a selection of
    rows), where dense torch's derivative is not implemented."""
    if not isinstance(input, MJT):
        return NotImplemented
    p, v = input._partition, input._values
    if dim is None:
        # a static dim before a ragged one: the elements in row-major order first (the packed
        # values are not), and each element's inverse back at its own place
        order = None if _ragged_lead(input) else _logical_order(input, v, every=True)
        flat = v.reshape(-1) if order is None else v.reshape(-1).index_select(0, order)
        out = torch.unique_consecutive(flat, return_inverse=return_inverse, return_counts=return_counts)
        if not return_inverse:
            return out
        values, inverse, *counts = out
        if order is not None:
            inverse = torch.empty_like(inverse).index_copy(0, order, inverse)
        return (values, MJT(inverse.reshape(v.shape), p, input._ragged_dims), *counts)
    d = canonical_dim("unique_consecutive", len(input._size), dim)
    if input._ragged_dims != (1,) or d != 1:
        raise NotImplementedError(
            f"unique_consecutive(dim={dim}) of {describe(input)} for {_LAYOUT}: supported along the only ragged "
            "dim 1 (runs of rows within each sample), or over every element (dim=None)")
    t = v.shape[0]
    rows = torch.arange(t, device=v.device)
    sample = p.row_sample()
    flat = v.reshape(t, math.prod(v.shape[1:]))
    keep = rows == p.offsets[sample]  # a sample's first row starts a run
    if t > 1:
        keep[1:] |= (flat[1:] != flat[:-1]).any(1)
    run = torch.cumsum(keep, 0) - 1  # each row's run, over the whole batch
    lengths = torch.zeros(p.batch, dtype=torch.int64, device=v.device).index_add(0, sample, keep.to(torch.int64))
    # SYNC: the runs per sample size the result (dense unique_consecutive syncs to size its output too)
    part = partition_for([RaggedExtent.from_lengths(lengths.cpu(), v.device)])
    src = values_of(input) if _needs_grad(input) else v
    result = [wrap_values(src[keep], part, (1,))]
    if return_inverse:
        result.append(MJT(run - part.offsets[sample], p, (1,)))
    if return_counts:
        counts = torch.zeros(part.rows, dtype=torch.int64, device=v.device).index_add(0, run, torch.ones_like(run))
        result.append(MJT(counts, part, (1,)))
    return result[0] if len(result) == 1 else tuple(result)


# --------------------------------------------------------------------------- index_put / index
def _check_in_range(op: str, idx: torch.Tensor, size: torch.Tensor, what: str) -> torch.Tensor:
    """``idx`` with negative entries counted from ``size`` (as dense indexing); out-of-range
    entries fail without a host sync (``_assert_async``, as torch.jagged)."""
    idx = torch.where(idx < 0, idx + size, idx)
    torch._assert_async(((idx >= 0) & (idx < size)).all(), f"{op}(): an index into {what} is out of bounds")
    return idx


def _mask_index(op: str, x: MJT, indices):
    """A boolean multi_jagged index of ``x``'s structure (``x[x > 0] = v``), or of its leading
    dims through every ragged dim when those lead (``x[keep]`` of ``(B, j0, C)`` with ``keep``
    ``(B, j0)``: whole rows, as dense torch's mask over leading dims), else None."""
    if len(indices) == 1 and isinstance(indices[0], MJT):
        mask = indices[0]
        if mask.dtype != torch.bool:
            raise NotImplementedError(f"{op}(): a multi_jagged index must be a boolean mask of the input's structure for {_LAYOUT}")
        m = mask._values.dim()
        if (len(mask._size) < len(x._size) and mask._ragged_dims == x._ragged_dims and _ragged_lead(x)
                and mask._values.shape[1:] == x._values.shape[1:m] and x._partition.same_as(mask._partition)):
            return mask  # storage order is row-major over the masked dims: no reordering
        _same_structure(op, x, mask, "a boolean mask (or one of its leading dims through every ragged dim)")
        return mask
    return None


def _packed_indices(op: str, x: MJT, indices):
    """NOTE [ Indices on packed rows ]: ``(start (I,), length (I,) or None, static)`` for integer
    ``indices`` over logical dims ``0..k-1`` (broadcast to ``I``): the first packed row each index
    tuple names, the number of rows in its block (None when every ragged dim is indexed: one row
    each) and the index tensors of the static dims among them."""
    nd = len(x._size)
    if len(indices) > nd:
        raise IndexError(f"{op}(): too many indices for tensor of dimension {nd} (got {len(indices)})")
    if not indices or any(i is None for i in indices):
        raise NotImplementedError(
            f"{op}(): for {_LAYOUT}, expected index tensors for the batch dim and each dim before the "
            f"last one indexed, got {[None if i is None else tuple(i.shape) for i in indices]}"
        )
    for i in indices:
        if isinstance(i, MJT) or i.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8):
            raise NotImplementedError(
                f"{op}(): for {_LAYOUT}, expected dense integer index tensors over the batch dim and a prefix of "
                f"the dims, got {'a multi_jagged' if isinstance(i, MJT) else i.dtype} index"
            )
    idx = torch.broadcast_tensors(*[i.to(torch.int64) for i in indices])
    p = x._partition
    sizes = p.device_sizes()
    b = _check_in_range(op, idx[0], torch.tensor(p.batch, device=idx[0].device), "the batch dim")
    start = p.offsets[b]
    q = sum(1 for d in range(1, len(idx)) if d in x._ragged_dims)
    n = sizes[b]  # (I, R)
    # stride of ragged dim k within a sample: product of the later ragged extents
    stride = torch.ones_like(start)
    strides = []
    for k in reversed(range(p.nragged)):
        strides.append(stride)
        stride = stride * n[..., k]
    strides.reverse()
    static = []
    k = 0
    for d in range(1, len(idx)):
        if d in x._ragged_dims:
            a = _check_in_range(op, idx[d], n[..., k], f"ragged dim {d}")
            start = start + a * strides[k]
            k += 1
        else:
            static.append(idx[d])
    length = None if q == p.nragged else strides[q - 1] if q else stride
    return start, length, static


def _expand_blocks(start, length, static):
    """Rows of every block, the block each row belongs to, and the static indices per row."""
    flat_len = length.reshape(-1)
    # SYNC: the number of rows the blocks hold sizes the result (torch.jagged pads to the max length instead)
    total = int(flat_len.sum()) if flat_len.numel() else 0
    block = torch.repeat_interleave(torch.arange(flat_len.shape[0], device=start.device), flat_len, output_size=total)
    first = torch.cumsum(flat_len, 0) - flat_len
    rows = start.reshape(-1)[block] + torch.arange(total, device=start.device) - first[block]
    return rows, block, [s.reshape(-1)[block] for s in static]


def _block_values(op: str, x: MJT, v: torch.Tensor, lead: tuple, k: int, block: torch.Tensor) -> torch.Tensor:
    """``v`` broadcast to the logical result ``(*I, *dims k…)``, one entry per expanded row: ``v``
    may not vary along a ragged dim that is left whole."""
    rest = list(range(k, len(x._size)))
    target = list(lead) + [1 if d in x._ragged_dims else x._size[d] for d in rest]
    try:
        shape = torch.broadcast_shapes(tuple(v.shape), tuple(target))
    except RuntimeError:
        shape = None
    if shape is None or list(shape) != target:
        raise RuntimeError(
            f"{op}(): shape mismatch: value tensor of shape {tuple(v.shape)} cannot be broadcast to the indexing "
            f"result {tuple(lead)} + {tuple(x._size[k:])} (its ragged dims must have size 1 in the value)"
        )
    ragged_at = tuple(len(lead) + i for i, d in enumerate(rest) if d in x._ragged_dims)
    vb = v.expand(target).squeeze(ragged_at) if ragged_at else v.expand(target)
    vb = vb.flatten(0, len(lead) - 1) if lead else vb.unsqueeze(0)  # (blocks, *static rest)
    return vb[block]


@register_multi_jagged_func(
    [aten.index_put.default, aten.index_put_.default], "self: mjt, indices: any, values: t, accumulate: any?"
)
def index_put_default(func, x, indices, values, accumulate=False):
    """``x[b, a…, s…] = v`` over the batch dim and a prefix of the other dims (NOTE [ Indices on
    packed rows ]): torch.jagged's cases, with any number of ragged dims, negative indices
    counted from each sample's own extent, and ``x[b] = v`` without padding; and ``x[mask] = v``
    with a boolean mask of x's structure (``v`` in each sample's row-major order)."""
    op = "index_put"
    mask = _mask_index(op, x, indices)
    if mask is not None:
        vidx, vals = [mask._values], values
        if not _ragged_lead(x) and values.numel() != 1:
            # v lists the selected elements in row-major order; the packed values in storage order
            order = _logical_order(x, mask._values)
            full = values.expand(order.shape)
            vals = full.new_empty(order.shape).index_copy(0, order, full)
    else:
        start, length, static = _packed_indices(op, x, list(indices))
        if length is None:
            vidx, vals = [start, *static], values
        else:
            if torch.is_grad_enabled() and values.requires_grad:
                # its gradient, grad.index(indices), would have ragged dims that values has not
                raise NotImplementedError(
                    f"{op}(): a value that requires grad, written over whole ragged dims of {describe(x)} (indices "
                    f"over {len(indices)} of its dims), is not supported for {_LAYOUT}; index every ragged dim or "
                    "detach the value"
                )
            rows, block, static = _expand_blocks(start, length, static)
            vidx, vals = [rows, *static], _block_values(op, x, values, tuple(start.shape), len(indices), block)
    if func is aten.index_put_.default:
        x._values.index_put_(vidx, vals, accumulate)
        return x
    return wrap(x._values.index_put(vidx, vals, accumulate), x._partition, x._ragged_dims)


def table_lookup(table: torch.Tensor, index: MJT) -> MJT:
    """``table[index]``: a dense tensor indexed along its dim 0 by a multi_jagged integer index
    (``pos_table[mj.position_ids(x)]``, ``class_weights[labels]``): each sample ``table[index_i]``,
    the index's structure with ``table.shape[1:]`` after it; differentiable w.r.t. ``table``."""
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise IndexError(f"index(): a multi_jagged index into a dense tensor {tuple(table.shape)} must hold integers, "
                         f"got {index.dtype} {describe(index)}")
    if table.dim() == 0:
        raise IndexError("index(): a 0-d tensor cannot be indexed by a multi_jagged index")
    return wrap_values(table[index._values], index._partition, index._ragged_dims)


def rows_by_index(x: MJT, batch_index: torch.Tensor, index: MJT) -> MJT:
    """``x[b, index]``: a dense integer batch index ``b`` of one entry per sample of ``index``
    (``torch.arange(B)[:, None]`` or ``[:, None, None]``, as many trailing 1s as dense
    broadcasting wants, or ``(B',)``; one entry broadcasts) and a multi_jagged integer ``index``
    of any structure: sample i is dense ``x_{b_i}[index_i]``, the index's dims then ``x``'s after
    dim 1 (token selection ``x[arange(B)[:, None], keep]``, kNN neighbours ``f[b, idx]`` with
    ``idx (B, j0, k)``, a class cost ``prob.transpose(1, 2)[b, labels]`` that indexes a static dim).
    Indices count from the end when negative and are bounds-checked per sample; differentiable
    w.r.t. ``x``. Where ``x`` has ragged dims after dim 1 they stay in the result, so each index
    sample must read its own sample (``b_i = i``)."""
    op = "index"
    for what, t in (("batch index", batch_index), ("index", index)):
        if t.dtype not in (torch.int64, torch.int32):
            # (dense torch reads a byte or bool index as a mask; per-sample masks are x[mask])
            raise IndexError(f"{op}(): x[b, index] takes int64 or int32 index tensors for {_LAYOUT}, got {t.dtype} ({what})")
    q = index._partition
    nb = q.batch
    if batch_index.dim() <= index.dim() and batch_index.numel() == 1:
        batch_index = batch_index.reshape(1).expand(nb)  # one sample for every index sample: broadcast, as dense
    if batch_index.dim() == 0 or batch_index.dim() > index.dim() or batch_index.shape[0] != nb or any(
            n != 1 for n in batch_index.shape[1:]):
        raise IndexError(f"{op}(): shape mismatch: the batch index {tuple(batch_index.shape)} does not give one sample "
                         f"per sample of the index {describe(index)}")
    p = x._partition
    b = _check_in_range(op, batch_index.reshape(-1).to(torch.int64), torch.tensor(p.batch, device=batch_index.device),
                        "the batch dim")
    iv = index._values.to(torch.int64)
    lead = (-1, *([1] * (iv.dim() - 1)))
    v = values_of(x) if _needs_grad(x) else x._values
    made = wrap_values if _needs_grad(x) else wrap
    if x._ragged_dims == (1,):  # rows of the samples: one row per index element
        src = b[q.row_sample()]
        rows = p.offsets[src].view(lead) + _check_in_range(op, iv, p.extents[0].lengths()[src].view(lead), "a ragged dim")
        return made(v.index_select(0, rows.reshape(-1)).view(*iv.shape, *v.shape[1:]), q, index._ragged_dims)
    return _elements_by_index(x, b, index, iv, v, made)


@eager_route("index(): x[b, index] whose ragged dims after dim 1 stay in the result makes a partition of the index's "
             "extents and those on the host: a graph break under torch.compile")
def _elements_by_index(x: MJT, b: torch.Tensor, index: MJT, iv: torch.Tensor, v: torch.Tensor, made) -> MJT:
    """``rows_by_index`` where dim 1 of ``x`` is static or other ragged dims follow it: every
    element of the result reads one element of ``x``'s values (row-major), at the row of its
    sample and ragged coordinates — the index value along dim 1 — and its static coordinates."""
    op = "index"
    p, q = x._partition, index._partition
    rest = [r for r in x._ragged_dims if r != 1]  # x's ragged dims the result keeps
    if rest:
        if q.batch != p.batch:
            raise NotImplementedError(
                f"{op}(): x[b, index] of {describe(x)}, whose ragged dims after dim 1 stay in the result, needs an index of "
                f"its batch size, one sample per sample (b = arange(B)), got {describe(index)} for {_LAYOUT}")
        torch._assert_async((b == torch.arange(p.batch, device=b.device)).all(),
                            f"{op}(): x[b, index] of a batch whose ragged dims after dim 1 stay in the result reads each "
                            "sample from itself: b must be arange(B)")
        out_p = partition_for([*q.extents, *(p.extents[x._ragged_dims.index(r)] for r in rest)])
        sample, coords = out_p.row_coords()
        na = len(q.extents)
        iv = iv.index_select(0, packed_rows(q.offsets, q.device_sizes(), sample, coords[:, :na]))
        src, c = sample, coords[:, na:]
    else:
        out_p = q
        sample = q.row_sample()
        src, c = b[sample], sample.new_zeros(sample.shape[0], 0)
    statics = [e for e in range(1, x.dim()) if e not in x._ragged_dims]
    sizes = [x.shape[e] for e in statics]
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]  # of x's values, row-major
    lead = (-1, *([1] * (iv.dim() - 1)))
    if 1 in x._ragged_dims:  # the index names rows: offset + a · (rows per position along dim 1) + the rest's
        n = p.device_sizes()[src]
        iv = _check_in_range(op, iv, n[:, 0].view(lead), "a ragged dim")
        first = packed_rows(p.offsets, p.device_sizes(), src, torch.cat([torch.zeros_like(c[:, :1]), c], 1))
        pos = (first.view(lead) + iv * n[:, 1:].prod(1).view(lead)) * math.prod(sizes)
        kept = list(zip(statics, strides))
    else:  # the index names a position along static dim 1 of the row at the rest's coordinates
        iv = _check_in_range(op, iv, torch.tensor(x.shape[1], device=iv.device), "dim 1")
        first = packed_rows(p.offsets, p.device_sizes(), src, c)
        pos = first.view(lead) * math.prod(sizes) + iv * strides[0]
        kept = list(zip(statics[1:], strides[1:]))
    pos = pos.reshape(*pos.shape, *([1] * len(kept)))
    for j, (e, st) in enumerate(kept):
        at = [1] * pos.dim()
        at[iv.dim() + j] = -1
        pos = pos + torch.arange(x.shape[e], device=pos.device).view(at) * st
    out = v.reshape(-1).index_select(0, pos.reshape(-1)).view(pos.shape)
    shift = index.dim() - 2
    return made(out, out_p, (*index._ragged_dims, *(r + shift for r in rest)))


def mask_index(x: MJT, mask: MJT) -> torch.Tensor:
    """``x[mask]`` with a boolean multi_jagged mask of ``x``'s structure or of its leading dims
    through every ragged dim: dense, the selected elements (rows) in row-major order, as dense
    torch's; differentiable, computed on the values (aten's derivative would build zeros of the
    input's nested-int sizes)."""
    _mask_index("index", x, [mask])
    return _selected(x, values_of(x) if _needs_grad(x) else x._values, mask)


def _selected(x: MJT, v: torch.Tensor, mask: MJT) -> torch.Tensor:
    """``x``'s values ``v`` where ``mask`` (checked by ``_mask_index``) holds, in row-major order."""
    out = v[mask._values]
    return out if _ragged_lead(x) else out[_logical_order(x, mask._values)]


@register_multi_jagged_func(aten.index.Tensor, "self: mjt, indices: any")
def index_Tensor(func, x, indices):
    """``x[b, a…, s…]`` with every ragged dim indexed: a dense ``(I, *rest)`` (also the gradient
    of ``index_put``'s values)."""
    mask = _mask_index("index", x, indices)
    if mask is not None:  # x[mask]: the selected elements in row-major order, as masked_select
        return _selected(x, x._values, mask)
    start, length, static = _packed_indices("index", x, list(indices))
    if length is not None:
        raise NotImplementedError(
            f"index(): indexing {describe(x)} without an index for every ragged dim would give a ragged result; "
            f"not supported for {_LAYOUT} (select samples with x[i] or unbind())"
        )
    return x._values[(start, *static)]


# --------------------------------------------------------------------------- bmm
def _padded(x: MJT) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, max n, *static)`` zero-padded rows of a one-ragged-dim tensor and the rows' cells."""
    p = x._partition
    m = p.extents[0].max
    pos = _padded_positions(x, [m])
    flat = x._values.new_zeros((p.batch * m, *x._values.shape[1:])).index_copy(0, pos, x._values)
    return flat.reshape(p.batch, m, *x._values.shape[1:]), pos


def _rows_times(x: MJT, mats: torch.Tensor) -> MJT:
    """Every packed row ``r`` (a vector of length D) of sample ``b`` times ``mats[b]`` (D, E),
    as a padded batched product (NOTE [ Batched matmul with a dense per-sample operand ])."""
    padded, pos = _padded(x)
    out = torch.bmm(padded, mats).flatten(0, 1).index_select(0, pos)
    return out


def _bmm_error(x, other, why):
    return RuntimeError(f"bmm(): not supported between inputs of shapes {describe(x)} and {describe(other)} "
                        f"for {_LAYOUT}: {why}")


@register_multi_jagged_func(aten.bmm.default, "self: any, mat2: any")
def bmm_default(func, x, other):
    """Per-sample batched matmul with one ragged dim among the rows or columns:
    ``(B, j, D) @ (B, D, E)``, ``(B, F, E) @ (B, E, j)`` (multi_jagged results), and
    ``(B, D, j) @ (B, j, E)`` contracting the ragged dim (dense result; also the gradient of the
    dense operand). Other multi_jagged × multi_jagged products go through ``matmul``."""
    if x.dim() != 3:
        raise ValueError("bmm(): input must be 3D")
    if other.dim() != 3:
        raise ValueError("bmm(): mat2 must be 3D")
    if isinstance(x, MJT) and not isinstance(other, MJT):
        if x._ragged_dims != (1,):
            raise _bmm_error(x, other, "expected the multi_jagged operand (B, j, D) with only dim 1 ragged")
        _batch_check(x, other)
        if other.shape[1] != x._size[2]:
            raise _bmm_error(x, other, f"expected mat2.shape[1] == {x._size[2]}")
        return wrap(_rows_times(x, other), x._partition, (1,))
    if isinstance(other, MJT) and not isinstance(x, MJT):
        if other._ragged_dims != (2,):
            raise _bmm_error(x, other, "expected the multi_jagged operand (B, E, j) with only dim 2 ragged")
        _batch_check(other, x)
        if x.shape[2] != other._size[1]:
            raise _bmm_error(x, other, f"expected input.shape[2] == {other._size[1]}")
        # (B, F, E) @ (B, E, j): packed rows hold the columns; row r of sample b becomes x[b] @ r
        return wrap(_rows_times(other, x.transpose(1, 2)), other._partition, (2,))
    if x._ragged_dims == (2,) and other._ragged_dims == (1,):
        _same_rows(x, other)
        px, _ = _padded(x)
        po, _ = _padded(other)
        return torch.bmm(px.transpose(1, 2), po)  # zero padding adds nothing to the sums
    return broadcast_matmul(x, other)


@route(torch._grouped_mm)
def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``F.grouped_mm(x, w)`` of ``(B, j0, K)`` rows and one ``(K, N)`` matrix per sample ``(B, K,
    N)``: the samples are the groups (mixture-of-experts tokens routed per expert), each sample's
    rows times its own matrix, as ``torch.bmm`` (differentiable to both), on any device and dtype.
    ``offs`` is the batch's own offsets, so it is not given."""
    if not isinstance(mat_a, MJT):
        return NotImplemented
    if offs is not None:
        raise RuntimeError(f"grouped_mm(): the groups of {describe(mat_a)} are its samples; offs must be None")
    if isinstance(mat_b, MJT) or mat_b.dim() != 3:
        raise RuntimeError(f"grouped_mm(): expected a dense (B, K, N) mat_b for {describe(mat_a)}, got {describe(mat_b)}")
    if bias is not None:
        raise NotImplementedError("grouped_mm(): bias is not supported")  # nor by torch's kernels
    if out_dtype is not None:  # accumulate in it, as the kernels do
        mat_a, mat_b = mat_a.to(out_dtype), mat_b.to(out_dtype)
    return torch.bmm(mat_a, mat_b)


def _batch_check(x: MJT, dense: torch.Tensor) -> None:
    if dense.shape[0] != x._partition.batch:
        raise _bmm_error(x, dense, f"expected the dense operand's batch size {x._partition.batch}, got {dense.shape[0]}")


def _same_rows(x: MJT, other: MJT) -> None:
    if not x._partition.same_as(other._partition):
        raise RuntimeError(
            f"bmm(): expected the contracted ragged dims to have the same sizes, got {describe(x)} and {describe(other)}"
        )


@route(torch.bmm, torch.Tensor.bmm)
def _bmm(input, mat2, *, out=None):
    """``(B, D, j) @ (B, j', E)`` with equal-sized but distinct extents: ``mat2`` relabelled onto
    ``input``'s (NOTE [ Equal sizes, different nested ints ] in ops/_routing.py; the automatic
    relabelling only pairs extents at the same logical dim), so that each operand's gradient
    comes back with its own nested int."""
    if out is None and isinstance(input, MJT) and isinstance(mat2, MJT) and input.dim() == mat2.dim() == 3:
        if torch.is_autocast_enabled(input.device.type):
            input, mat2 = autocast_lower(input, mat2)  # as dense autocast casts bmm's operands
        if input.dtype != mat2.dtype:  # dense bmm promotes nothing
            raise RuntimeError(f"bmm(): expected scalar type {input.dtype} but found {mat2.dtype}")
        plan = matmul_spec(input, mat2)
        if plan is not None:  # NOTE [ Matmul between multi_jagged tensors ] in ops/contractions/ragged_mm.py
            return bridged.ragged_matmul(*plan)
        if (2 in input._ragged_dims) != (1 in mat2._ragged_dims):
            # a contracted dim static in one operand and ragged in the other (graphs of one size:
            # (B, j0, n) @ (B, j1, C), each j1 = n): matmul's per-sample products, which read the
            # static size as the equal ragged one (NOTE [ Static sizes equal to a ragged dim ] in
            # ops/_routing.py); for three-dim operands ``bmm`` is ``matmul``
            return torch.matmul(input, mat2)
    if (out is None and isinstance(input, MJT) and isinstance(mat2, MJT) and input._partition is not mat2._partition
            and input._partition.nragged == mat2._partition.nragged == 1 and input._partition.same_as(mat2._partition)):
        return torch.bmm(input, relabel(mat2, input._partition))
    if out is None and isinstance(input, MJT) != isinstance(mat2, MJT) and input.dim() == mat2.dim() == 3:
        # a dense operand contracting a ragged dim that has its size in every sample (graphs of one
        # size): matmul reads it as that static size; other sizes raise below
        mjt, d, k = (mat2, 1, input.shape[2]) if isinstance(mat2, MJT) else (input, 2, mat2.shape[1])
        if (d in mjt._ragged_dims and not torch.compiler.is_compiling()
                and _uniform(mjt._partition.extents[mjt._ragged_dims.index(d)], k)):
            return torch.matmul(input, mat2)
    return NotImplemented
