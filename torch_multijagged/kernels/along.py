"""Index maps for ops along one ragged dim: where each output row reads its input row.

Plain tensors in and out (NOTE [ Packed-row partition ] in ``structure.py`` for the row layout).
The ops of ``ops/indexing/`` and ``ops/reductions/order.py`` compute, for every output row, the
sample and the ragged coordinates of the input cell it reads; ``packed_rows`` turns those into
packed rows of the input, and the values are gathered with them (dense autograd: the gradient of
a gather is a scatter-add, so a row read twice gets both gradients).

NOTE [ Blocks of consecutive rows ]

Along the *first* ragged dim of a batch, a sample's cells at one coordinate are consecutive
packed rows, so the ops that keep whole stretches of that dim move blocks of consecutive rows: a
slice keeps one block of each sample, ``cat`` joins each sample's blocks of its operands, a
constant pad puts blocks of fill around each sample, ``roll`` swaps two blocks. Eagerly on the
CPU (host row counts; the index maps stay the traced and accelerator form) they move the values
as blocks instead of row by row, with dense torch's autograd:

* ``join_blocks`` (``cat``, constant ``pad``, ``roll``): one ``torch.cat`` of views of the sources
  (``split`` by host row counts) — one copy per element, where a gather through an index map
  joined the sources first (a second copy) — and a gradient that is dense torch's own (narrow
  views of the output's gradient, one ``cat`` back per source);
* ``gather_runs`` (slices): ``index_select`` of the rows, which copies faster than a ``cat`` of
  many views, and a gradient that joins the output gradient's blocks with zero blocks between them,
  one pass over the input's size, where ``index_select``'s own derivative zero-fills the input's
  size and then scatter-adds into it (two passes; the scatter-add also per element).

Below ``BLOCKS_MIN_ELEMENTS`` elements per sample (mean) the index maps are faster: a ``cat``
pays per block, and short samples make many short blocks (measured on one CPU thread, forward
and backward: at ~100 elements per sample the blocks cost 7× the maps, at ~4k they break even,
at ~27k they take 0.44–0.9× the maps' time).

A plan is ``(splits, order)``: ``splits[i]`` the row counts that split source ``i`` into its
blocks, ``order`` the ``(source, block)`` pairs in output order; blocks of no rows are left out.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["packed_rows", "slice_bounds", "segment_order", "segment_blocks", "length_order", "BLOCKS_MIN_ELEMENTS", "plan_blocks", "join_blocks", "gather_runs"]

Blocks = tuple[Sequence[Sequence[int]], Sequence[tuple[int, int]]]

# Elements per sample (mean) from which blocks beat index maps (NOTE [ Blocks of consecutive rows ]).
BLOCKS_MIN_ELEMENTS = 4096


def plan_blocks(blocks, sources: int) -> Blocks:
    """The plan (NOTE [ Blocks of consecutive rows ]) of ``blocks``, ``(source, rows, used)`` for
    every block of every source in output order: each source's blocks in their own order, those
    not ``used`` read by no output row (a crop)."""
    splits: list[list[int]] = [[] for _ in range(sources)]
    order = []
    for i, n, used in blocks:
        if n:
            if used:
                order.append((i, len(splits[i])))
            splits[i].append(n)
    return splits, order


def join_blocks(sources: Sequence[torch.Tensor], plan: Blocks) -> torch.Tensor:
    """The blocks of ``sources`` (packed rows ``(N_i, *static)`` of one dtype) in the order of
    ``plan`` (NOTE [ Blocks of consecutive rows ]), as one tensor; differentiable: a source none
    of whose rows is read (no rows, or all cropped) joins as no rows, so that the result depends
    on every source, as a dense ``cat`` or ``pad`` of an empty tensor does."""
    splits, order = plan
    blocks = [s.split(c) for s, c in zip(sources, splits)]
    pieces = [blocks[i][j] for i, j in order]
    read = {i for i, _ in order}
    return torch.cat(pieces + [s[:0] for i, s in enumerate(sources) if i not in read])


class _GatherRuns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, rows: torch.Tensor, back: Blocks, dropped: int):  # type: ignore[override]
        ctx.back, ctx.dropped = back, dropped
        return values.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        # under create_graph the join is recorded (dense autograd): every order of gradients
        zeros = grad.new_zeros((ctx.dropped, *grad.shape[1:]))
        return join_blocks((grad, zeros), ctx.back), None, None, None


def gather_runs(values: torch.Tensor, rows: torch.Tensor, back: Blocks, dropped: int) -> torch.Tensor:
    """``values.index_select(0, rows)`` for ``rows`` that read each row at most once, in runs of
    consecutive rows; its gradient is ``join_blocks((grad, zeros), back)``: ``back`` puts the
    gradient's blocks (source 0) where their rows are read and blocks of ``zeros`` (source 1,
    ``dropped`` rows in all) where rows are not (NOTE [ Blocks of consecutive rows ])."""
    return _GatherRuns.apply(values, rows, back, dropped)


def packed_rows(offsets: torch.Tensor, sizes: torch.Tensor, sample: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Packed row of ragged coordinate ``coords[r]`` (R,) of sample ``sample[r]``:
    ``offsets[s] + Σ_k a_k Π_{l>k} n_{s,l}``. ``sizes``: (B, R) per-sample extents."""
    row = offsets[sample]
    if coords.shape[1] == 0:
        return row
    n = sizes[sample]
    stride = torch.ones_like(row)
    for k in reversed(range(coords.shape[1])):
        row = row + coords[:, k] * stride
        stride = stride * n[:, k]
    return row


def slice_bounds(n: torch.Tensor, start, stop, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, length)`` per sample of ``range(n_i)[start:stop:step]`` (``step > 0``), the way
    Python and dense torch clamp slice bounds: negative bounds count from each sample's end. A
    bound may be a ``(B,)`` tensor of per-sample bounds (a nested int's sizes)."""
    def bound(v, default):
        if v is None:
            return default
        b = v.to(n.device, n.dtype) if isinstance(v, torch.Tensor) else torch.full_like(n, v)  # per sample, or one
        b = torch.where(b < 0, b + n, b)
        return torch.minimum(b.clamp_min(0), n)

    first = bound(start, torch.zeros_like(n))
    last = bound(stop, n)
    length = torch.div((last - first).clamp_min(0) + step - 1, step, rounding_mode="floor")
    return first, length


def segment_order(segment: torch.Tensor, keys: torch.Tensor, descending: bool) -> torch.Tensor:
    """For keys ``(T, S)`` whose rows belong to ``segment`` (T,), the row order that sorts each
    column within each segment (stable: ties keep their row order, as dense ``stable=True``;
    NaN sorts as the largest value, as in ``torch.sort``), segments in increasing order. Returns
    ``(T, S)`` row indices."""
    _, by_key = torch.sort(keys, dim=0, descending=descending, stable=True)
    seg = segment.unsqueeze(1).expand_as(by_key).gather(0, by_key)
    _, by_segment = torch.sort(seg, dim=0, stable=True)
    return by_key.gather(0, by_segment)


def segment_blocks(sizes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(outer, n, inner)`` (B,) each: sample ``s``'s packed rows, read as ``(outer, n, inner)``,
    hold its segments along ragged dim ``k`` — ``n = sizes[s, k]`` long, ``outer`` the product of
    the extents before ``k``, ``inner`` of those after. ``sizes``: (B, R) per-sample extents."""
    outer = sizes[:, :k].prod(1)
    inner = sizes[:, k + 1:].prod(1)
    return outer, sizes[:, k], inner


def length_order(sizes: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed rows regrouped so that every segment along ragged dim ``k`` is ``n`` consecutive
    rows and the segments of one length ``n`` are consecutive: samples ordered by ``n`` (stably),
    each sample's segments in its own order. ``sizes``: (B, R) per-sample extents (any device).

    Returns ``(gather (T,), place (T,), cell_place (cells,), lengths (G,))``: row ``j`` of the
    regrouped rows is packed row ``gather[j]``; packed row ``r`` is regrouped row ``place[r]``
    (``gather``'s inverse); segment ``c`` (the rows of the partition without dim ``k``, in their
    packed order) is regrouped segment ``cell_place[c]``; ``lengths`` (L, 2) lists, in the
    regrouped order, each distinct length that has rows and how many regrouped rows it holds."""
    outer, n, inner = segment_blocks(sizes, k)
    rows, cells = outer * n * inner, outer * inner
    b = sizes.shape[0]
    order = torch.sort(n, stable=True).indices
    new_row0 = torch.empty_like(rows)
    new_row0[order] = torch.cumsum(rows[order], 0) - rows[order]
    new_cell0 = torch.empty_like(cells)
    new_cell0[order] = torch.cumsum(cells[order], 0) - cells[order]
    sample = torch.repeat_interleave(torch.arange(b, device=sizes.device), rows)
    local = torch.arange(sample.shape[0], device=sizes.device) - (torch.cumsum(rows, 0) - rows)[sample]
    ni, i_, nn = (n * inner)[sample], inner[sample], n[sample]
    o, rem = torch.div(local, ni, rounding_mode="floor"), torch.remainder(local, ni)
    a, i = torch.div(rem, i_, rounding_mode="floor"), torch.remainder(rem, i_)
    place = new_row0[sample] + o * ni + i * nn + a
    gather = torch.empty_like(place)
    gather[place] = torch.arange(place.shape[0], device=sizes.device)
    cell_sample = torch.repeat_interleave(torch.arange(b, device=sizes.device), cells)
    cell_place = new_cell0[cell_sample] + torch.arange(cell_sample.shape[0], device=sizes.device) - (
        torch.cumsum(cells, 0) - cells)[cell_sample]
    busy = order[rows[order] > 0]
    ns = torch.unique_consecutive(n[busy])
    per = torch.zeros_like(ns)
    per.index_add_(0, torch.searchsorted(ns, n[busy]), rows[busy])
    return gather, place, cell_place, torch.stack([ns, per], 1)
