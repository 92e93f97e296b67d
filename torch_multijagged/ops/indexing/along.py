"""Ops along a ragged dim, the machinery: every output cell reads one input cell (or a fill).

NOTE [ Indexing along ragged dims ]

Along a ragged dim every op is the dense op applied to each sample: ``x[:, -1]`` is each sample's
last token, ``x[:, 1:]`` drops each sample's first, ``cat`` concatenates each sample's pieces,
``sort`` sorts each sample's own elements. They are all one move: every output row reads one
input row, chosen by arithmetic on the output row's sample and ragged coordinates
(``kernels/along.py``: ``packed_rows``), and the values are gathered with dense autograd (a
gather's gradient is a scatter-add, so every order of gradients works and a row read twice gets
both gradients). Constant padding reads a fill instead.

The structure rule — the same eagerly and under ``torch.compile``, since it depends on the op
and its arguments, never on the lengths:

* **the dim is removed** by an integer index (``select``, ``x[:, i]``, ``kthvalue``, ``median``);
* **the dim becomes static** when the op fixes its size whatever the sample's size: ``narrow``
  (``length``), ``topk`` (``k``), ``index_select`` / ``gather`` with a dense index (the index's
  size). A sample too short for it raises, naming the sample, as dense torch raises for it;
* **the dim stays ragged** when the size follows the sample's: slices (clamped per sample, as
  dense slicing clamps), ``cat``, ``pad``, ``repeat``, and the ops that keep the size (``sort``,
  ``flip``, ``roll``, ``cummax``), or ``gather`` with a multi_jagged index (the index's extent).
  A new per-sample size is a new extent, ``structure.mapped_extent`` keyed by the size rule, so
  that the same slice of one extent twice gives one nested int; a size that equals the input's
  keeps its nested int.

When no ragged dim remains the result is a dense ``(B, …)`` tensor, as for a reduction over every
ragged dim. An op that builds a new extent needs its sizes on the host: under ``torch.compile``
it is a graph break (``eager``; NOTE [ Eager-only routes ]). The others trace (``eager_or_traced``):
their maps are arithmetic on device sizes, and the bounds check that eagerly names the sample
(``check_samples``) is an assert in the graph — never dropped, since a gather past a sample's end
would read the next sample's rows.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ...bridge import values_of, wrap_values
from ...kernels.along import BLOCKS_MIN_ELEMENTS, gather_runs, packed_rows
from ...structure import RaggedExtent, _is_traced, partition_for
from .._common import MJT, canonical_dim, eager_route, static_dims

__all__ = ["ragged_dim", "keep_along", "drop_along", "take_static", "check_samples", "first_bad", "eager", "eager_or_traced", "EAGER"]

EAGER = "{op}() along a ragged dim reads per-sample sizes on the host: a graph break under torch.compile"


def ragged_dim(op: str, x: MJT, dim) -> Optional[tuple[int, int]]:
    """``(d, k)``: the canonical dim and its index among ``x``'s ragged dims, or None when ``dim``
    is not ragged."""
    d = canonical_dim(op, len(x._size), dim)
    if d in x._ragged_dims:
        return d, x._ragged_dims.index(d)
    return None


def first_bad(bad: torch.Tensor) -> Optional[int]:
    """The first sample where the host mask ``bad`` (B,) holds, or None."""
    hit = bad.nonzero()
    return int(hit[0, 0]) if hit.numel() else None  # SYNC: none — host tensors


def check_samples(x: MJT, k: int, bad_of, fail, traced_message: str) -> None:
    """Refuse a sample that dense torch would refuse: ``bad_of(n)`` marks them from the sizes
    ``n`` (B,) along ragged dim ``k``. Eagerly ``fail(sample, size)`` raises for the first one
    (host sizes, no sync); traced, an assert in the graph fails with ``traced_message``."""
    e = x._partition.extents[k]
    if _is_traced(e.offsets):
        torch._assert_async(~bad_of(e.lengths()).any(), traced_message)
        return
    n = e.host_lengths()
    bad = first_bad(bad_of(n))
    if bad is not None:
        fail(bad, int(n[bad]))


def _gather_rows(x: MJT, sample: torch.Tensor, coords: torch.Tensor, valid=None, fill=None) -> torch.Tensor:
    p = x._partition
    rows = packed_rows(p.offsets, p.device_sizes(), sample, coords)
    return _take_rows(x, rows if valid is None else torch.where(valid, rows, torch.zeros_like(rows)), valid, fill)


def by_blocks(x: MJT, numel: Optional[int] = None) -> bool:
    """Whether ops along ``x``'s first ragged dim move its values as blocks of consecutive rows
    (NOTE [ Blocks of consecutive rows ] in kernels/along.py): samples large enough (``numel``
    elements in all, ``x``'s own by default), eagerly, on the CPU, outside dispatch modes and
    functorch transforms."""
    v, b = x._values, x._partition.batch
    return (v.device.type == "cpu" and b > 0 and (v.numel() if numel is None else numel) >= b * BLOCKS_MIN_ELEMENTS
            and not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active())


def _take_rows(x: MJT, rows: torch.Tensor, valid=None, fill=None, runs=None) -> torch.Tensor:
    """``x``'s packed rows ``rows`` (0 where ``valid`` is false), the ``fill`` there. ``runs``:
    ``(back, dropped)`` of ``gather_runs`` when ``rows`` read runs of consecutive rows, each row
    at most once (a slice)."""
    v = values_of(x)
    if valid is None:
        if runs is not None and rows.shape[0] and by_blocks(x):
            return gather_runs(v, rows, *runs)
        return v.index_select(0, rows)
    if v.shape[0] == 0:  # nothing to read: every output cell is the fill
        out = v.new_zeros((rows.shape[0], *v.shape[1:]))
        if v.requires_grad:  # still a function of the input, as dense pad's output is
            out = out + v.sum() * 0
    else:
        out = v.index_select(0, rows)
    mask = valid.reshape(-1, *([1] * (v.dim() - 1)))
    # the fill as a 0-d tensor of out's dtype (what dense pad casts its value to): broadcast, not a
    # full-size buffer
    return torch.where(mask, out, torch.tensor(0 if fill is None else fill, device=out.device).to(out.dtype))


def keep_along(
    x: MJT,
    extents: list[RaggedExtent],
    source: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    valid: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    fill=None,
    key=None,
    runs: Optional[Callable[[], tuple]] = None,
) -> MJT:
    """``x`` with ragged extents ``extents`` (storage order): the output cell of sample ``s`` at
    ragged coordinates ``a`` (T, R) reads ``x``'s cell at ``source(s, a)`` (T, R); where
    ``valid(s, a)`` is false it holds ``fill`` instead. ``key``: names what ``source`` and
    ``valid`` compute (a function of the structure alone), so that the rows read are cached on
    the output's partition (NOTE [ Derived maps ] in structure.py) and a call on a structure
    seen before costs one gather. ``runs``: eagerly, ``(back, dropped)`` of ``gather_runs`` from
    host sizes, where every row is read at most once and in runs of consecutive rows (NOTE
    [ Blocks of consecutive rows ] in kernels/along.py), computed with the rows (cached alike)."""
    p = x._partition
    same = len(extents) == p.nragged and all(a is b for a, b in zip(extents, p.extents))
    out = p if same else partition_for(extents)  # sizes kept: the input's own partition (and maps)

    def plan(out):
        sample, coords = out.row_coords()
        src = source(sample, coords)
        ok = valid(sample, coords) if valid is not None else None
        rows = packed_rows(p.offsets, p.device_sizes(), sample, src)
        blocks = runs() if runs is not None and not _is_traced(p.offsets) else None
        return (rows, None, blocks) if ok is None else (torch.where(ok, rows, torch.zeros_like(rows)), ok, None)

    cached = key is not None and not _is_traced(p.offsets)
    rows, ok, blocks = out.derived(("keep_along", p, x._ragged_dims, key), plan) if cached else plan(out)
    return wrap_values(_take_rows(x, rows, ok, fill, blocks), out, x._ragged_dims)


def drop_along(x: MJT, k: int, position: Callable[[], torch.Tensor], key=None):
    """``x`` without its ragged dim ``k``: every remaining cell of sample ``s`` reads coordinate
    ``position()[s]`` along it ((B,) on the values' device). Dense ``(B, …)`` when no ragged dim
    remains. ``key``: names what ``position`` computes (a function of the structure alone), so
    that the rows read are cached on the partition (NOTE [ Derived maps ] in structure.py)."""
    p = x._partition
    keep = tuple(i for i in range(p.nragged) if i != k)
    d = x._ragged_dims[k]

    def plan(p):
        if keep:
            sub = p.map_to_sub(keep)[1]
            sample, coords = sub.row_coords()
        else:
            sample = torch.arange(p.batch, device=p.offsets.device)
            coords = sample.new_zeros(p.batch, 0)
        src = torch.cat([coords[:, :k], position()[sample].unsqueeze(1), coords[:, k:]], 1)
        return packed_rows(p.offsets, p.device_sizes(), sample, src)

    rows = plan(p) if key is None or _is_traced(p.offsets) else p.derived(("drop_along", k, key), plan)
    v = _take_rows(x, rows)
    if not keep:
        return v
    ragged = tuple(r - (r > d) for r in x._ragged_dims if r != d)
    return wrap_values(v, p.map_to_sub(keep)[1], ragged)


def take_static(x: MJT, k: int, size: int, table: torch.Tensor):
    """Ragged dim ``k`` made static of ``size``: position ``j`` of every remaining cell of sample
    ``s`` reads coordinate ``table[s, j]`` ((B, size)) or ``table[j]`` ((size,)) along it. The
    rows are gathered in (cell, j) order and folded into the values; no new extent, so it traces."""
    p = x._partition
    d = x._ragged_dims[k]
    keep = tuple(i for i in range(p.nragged) if i != k)
    if keep:
        sub = p.map_to_sub(keep)[1]
        sample, coords = sub.row_coords()
        cells = sub.rows
    else:
        sample = torch.arange(p.batch, device=p.offsets.device)
        coords = sample.new_zeros(p.batch, 0)
        cells = p.batch
    pos = table[sample] if table.dim() == 2 else table.unsqueeze(0).expand(sample.shape[0], size)
    src = torch.cat([coords[:, :k].repeat_interleave(size, 0), pos.reshape(-1, 1), coords[:, k:].repeat_interleave(size, 0)], 1)
    v = _gather_rows(x, sample.repeat_interleave(size), src)
    v = v.reshape(cells, size, *v.shape[1:])
    statics = sorted(static_dims(len(x._size), x._ragged_dims) + (d,))
    v = v.movedim(1, 1 + statics.index(d))
    if not keep:
        return v
    return wrap_values(v, sub, tuple(r for r in x._ragged_dims if r != d))


def eager(fn):
    """The route ``fn`` as an eager-only route (NOTE [ Eager-only routes ])."""
    return eager_route(EAGER)(fn)


def eager_or_traced(fn):
    """The route ``fn``, which makes no new extent and traces: it runs under ``torch.compile``
    too (checking bounds in the graph rather than on the host)."""
    return eager_route(EAGER, traceable=lambda *args, **kwargs: True)(fn)
