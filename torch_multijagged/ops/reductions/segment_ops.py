"""The dense op itself on every segment along a ragged dim, eagerly: ``sort``, ``topk``,
``kthvalue``, ``median``, ``nanmedian``, ``quantile``, ``cummax`` / ``cummin`` per sample.

NOTE [ Dense ops on segments ]

Along ragged dim k the elements one dense call orders are a *segment* (NOTE [ Order statistics
along ragged dims ] in ``order.py``). Sample ``s``'s packed rows, read as ``(outer, n, inner, S)``
(the extents before k, along k, after k, and the static elements), hold its segments
(``kernels/along.py``: ``segment_blocks``): a view, no copy. Eagerly the dense op runs along dim 1
of that view (with one ragged dim, along dim 0 of the rows themselves: the component with the dim
first), so every value, index and tie is the dense op's own on that sample — stable or not,
``topk`` sorted or not, which of equal elements ``kthvalue`` / ``median`` return, NaN, ±inf,
every dtype and dense's errors — and its gradient is dense autograd's (the backward keeps what
dense's keeps: for these ops the indices only, so writing the input in place after the op leaves
the backward valid, as dense). Without autograd each call writes its results into their rows of
the output (``out=``); with it the results are concatenated. Ops that make the dim static or
remove it give one result per segment and column, in the segments' order (the partition without
dim k). An op marked ``contiguous`` (stable ``sort``, ``kthvalue``) runs on a transposed,
contiguous copy of a long sample's rows, which its kernel reads faster (``RULE``).

Two ways to run the calls, picked per call by a measured rule (``RULE``; docs/design.md §21):

* **per sample**: one dense call per sample with work, on its view (few samples, or long ones);
* **per length**: the rows regrouped once (``length_order``: samples ordered by their length along
  k, each segment's ``n`` rows consecutive) with one ``index_select``, the dense op once per
  distinct length on ``(segments, n, S)``, and the results put back with one more
  ``index_select`` — when many samples share few lengths the calls saved outweigh the copies
  (on the CPU only: other devices' kernels may pick their algorithm by the whole tensor's size).

Each row's result depends only on that row (dense kernels copy each row and run the same
algorithm on it, whatever its stride or its neighbours), so both give the per-sample results bit
for bit. One exception is dense's: a 1-D integer sort (``(B, j0)``, ascending, ``stable=False``)
of at least ``32768`` elements takes a stable radix sort, so there each sample runs alone, on its
1-D rows. Traced (``torch.compile``), the ops keep the index-map path of ``order.py``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, Optional

import torch

from ...bridge import values_of
from ...kernels.along import length_order, segment_blocks
from ...pieces import wrapper_requires_grad
from ...structure import Partition, _is_traced
from .._common import MJT

__all__ = ["eager_segments", "run_segments", "shortest", "segment_path", "RULE", "PATHS"]

# dense ``at::internal::GRAIN_SIZE``: a 1-D sort at least this long may take another algorithm
_RADIX_ROWS = 32768
# The measured rules (docs/design.md §21), in units of one per-sample call. Regroup by length
# when ``samples − group_call · lengths > fixed_calls + elements / call_elements``: a call per
# sample against a call per distinct length (each costs ``group_call`` sample calls: a 3-D
# call and its views), the regrouping's fixed cost, and its copies (the values in and the
# results out: a call costs about as much as copying ``call_elements`` elements).
# ``contiguous_rows``: an op marked ``contiguous`` runs on a transposed, contiguous copy of a
# sample's rows when the sample is at least this long (there the copy costs less than the
# strided reads it saves).
RULE = {"group_call": 1.3, "fixed_calls": 8, "call_elements": 1000, "contiguous_rows": 128}

PATHS = ("per_sample", "per_length", "index_map")
_FORCED: Optional[str] = None


@contextlib.contextmanager
def segment_path(path: Optional[str]) -> Iterator[None]:
    """Force how order statistics along ragged dims run inside the block (tests, benchmarks):
    ``per_sample`` / ``per_length`` (NOTE [ Dense ops on segments ]), ``index_map`` (the traced
    path of ``order.py``, eagerly), or None (the rule)."""
    global _FORCED
    if path is not None and path not in PATHS:
        raise ValueError(f"segment_path(): expected one of {PATHS} or None, got {path!r}")
    prev, _FORCED = _FORCED, path
    try:
        yield
    finally:
        _FORCED = prev


def eager_segments(x: MJT) -> bool:
    """Whether the per-segment dense path applies: real data (not a trace), not forced off."""
    if _FORCED == "index_map":
        return False
    return not (_is_traced(x._partition.offsets) or _is_traced(x._values) or torch.compiler.is_compiling())


def _blocks(p: Partition, k: int):
    """Host plan, cached: ``(rows, cells, work, distinct, longest, shortest)`` — every sample's
    packed rows and segments, ``[(sample, outer, n, inner)]`` of the samples with rows, the number
    of distinct lengths among them, and the longest and shortest length of all samples."""
    def compute(p):
        outer, n, inner = segment_blocks(p.host_sizes(), k)
        rows = outer * n * inner
        keep = rows > 0
        busy = keep.nonzero().flatten()
        # SYNC: none — host sizes
        work = list(zip(busy.tolist(), outer[keep].tolist(), n[keep].tolist(), inner[keep].tolist()))
        longest, least = (int(n.max()), int(n.min())) if n.numel() else (0, 0)
        return rows.tolist(), (outer * inner).tolist(), work, len(set(n[keep].tolist())), longest, least

    return p.derived(("segment_blocks", k), compute)


def _groups(p: Partition, k: int):
    """``(gather, place, cell_place, [(n, row count)])`` of ``length_order`` on the values'
    device, cached."""
    def compute(p):
        gather, place, cell_place, lengths = length_order(p.host_sizes(), k)
        dev = p.offsets.device
        # SYNC: none — host tensors (the maps are copied to the values' device)
        return gather.to(dev), place.to(dev), cell_place.to(dev), [tuple(r) for r in lengths.tolist()]

    return p.derived(("segment_groups", k), compute)


def shortest(x: MJT, k: int) -> int:
    """The shortest extent along ragged dim ``k`` (host sizes, cached with the plan)."""
    return _blocks(x._partition, k)[5]


def _pair(out, indexed: bool):
    return out if indexed else (out, None)


def run_segments(x: MJT, k: int, fn: Callable, shape: str, width: int = 0, indexed: bool = True,
                 sort_like: bool = False, contiguous: bool = False):
    """``fn(t, dim, out=None)`` — the dense op along ``dim`` of a plain tensor, returning
    ``(values, indices)`` (``indexed``) or values alone — on every segment of ``x`` along ragged dim
    ``k`` (NOTE [ Dense ops on segments ]). ``shape``: ``keep`` (results per element: ``(T,
    *static)``), ``static`` (``width`` per segment: ``(segments, width, *static)``) or ``remove``
    (one per segment: ``(segments, *static)``). ``sort_like``: ``fn`` is a sort, whose 1-D form
    may take another algorithm; ``contiguous``: ``fn`` runs faster on contiguous rows (the rule's
    ``contiguous_rows``). Returns ``(values, indices or None)``, or None when ``x`` has no packed
    rows (the caller's general path builds the empty results)."""
    p = x._partition
    rows, cells, work, distinct, longest, _ = _blocks(p, k)
    if not work:
        return None
    grad = torch.is_grad_enabled() and wrapper_requires_grad(x)
    v = values_of(x) if grad else x._values
    static = tuple(v.shape[1:])
    s = math.prod(static)
    if _FORCED in ("per_sample", "per_length"):
        regroup = _FORCED == "per_length"
    else:
        # CPU only: there every row's result is known to depend on that row alone (the kernels of
        # other devices may pick their algorithm by the whole tensor's size; unmeasured)
        regroup = v.is_cpu and (
            len(work) - RULE["group_call"] * distinct > RULE["fixed_calls"] + v.shape[0] * s / RULE["call_elements"])
    if sort_like and len(x._size) == 2 and longest >= _RADIX_ROWS:
        regroup = False  # a 1-D sort this long may take another algorithm: each sample alone
    if regroup:
        value, index = _per_length(v.reshape(v.shape[0], s), p, k, fn, shape, width, indexed, grad)
    else:
        lead = {"keep": (v.shape[0],), "static": (sum(cells), width), "remove": (sum(cells),)}[shape]
        if grad:
            value, index = _per_sample_grad(v, rows, work, fn, shape, width, indexed, contiguous, p.nragged == 1)
        else:
            value = v.new_empty((*lead, *static))
            index = torch.empty(value.shape, dtype=torch.int64, device=v.device) if indexed else None
            _per_sample_out(v, rows, cells, work, fn, shape, width, value, index, contiguous, p.nragged == 1)
            return value, index
    lead = value.shape[:-1] if shape != "keep" else value.shape[:1]
    return value.reshape(*lead, *static), (index.reshape(*lead, *static) if index is not None else None)


def _transposed(t: torch.Tensor, contiguous: bool, n: int, s: int) -> bool:
    return contiguous and s > 1 and n >= RULE["contiguous_rows"] and t.dim() > 1


def _per_sample_out(v, rows, cells, work, fn, shape, width, value, index, contiguous, simple):
    """The op per sample, writing each sample's results into its part of ``value`` / ``index``
    (``out=``: no concatenation; no autograd)."""
    s = math.prod(v.shape[1:])
    indexed = index is not None
    if simple:  # one ragged dim: a sample's rows are its component with the dim first
        pieces = v.split_with_sizes(rows)
        outs_v = value.split_with_sizes(rows) if shape == "keep" else value.unbind(0)
        outs_i = (index.split_with_sizes(rows) if shape == "keep" else index.unbind(0)) if indexed else None
        for i, _, n, _ in work:
            t = pieces[i]
            if _transposed(t, contiguous, n, s):
                res_v, res_i = _pair(fn(t.reshape(n, s).t().contiguous(), 1), indexed)
                outs_v[i].copy_(_untranspose(res_v, shape, outs_v[i].shape))
                if indexed:
                    outs_i[i].copy_(_untranspose(res_i, shape, outs_i[i].shape))
            else:
                fn(t, 0, out=(outs_v[i], outs_i[i]) if indexed else outs_v[i])
        return
    pieces = v.reshape(v.shape[0], s).split_with_sizes(rows)
    per = rows if shape == "keep" else cells
    outs_v = value.reshape(*value.shape[:2 if shape == "static" else 1], s).split_with_sizes(per)
    outs_i = index.reshape(*index.shape[:2 if shape == "static" else 1], s).split_with_sizes(per) if indexed else None
    for i, outer, n, inner in work:
        out_v = _block_out(outs_v[i], shape, outer, n, inner, width, s)
        out_i = _block_out(outs_i[i], shape, outer, n, inner, width, s) if indexed else None
        fn(pieces[i].view(outer, n, inner, s), 1, out=(out_v, out_i) if indexed else out_v)


def _block_out(t, shape, outer, n, inner, width, s):
    """A sample's part of the results as the op along dim 1 of ``(outer, n, inner, S)`` writes it."""
    if shape == "keep":
        return t.view(outer, n, inner, s)
    if shape == "remove":
        return t.view(outer, inner, s)
    return t.view(outer, inner, width, s).permute(0, 2, 1, 3)


def _untranspose(t: torch.Tensor, shape: str, like) -> torch.Tensor:
    """A result of the op along dim 1 of a sample's ``(S, n)`` rows as the op along dim 0 of its
    ``(n, *static)`` rows gives it (``like``: that shape)."""
    return t.reshape(like) if shape == "remove" else t.t().reshape(like)


def _per_sample_grad(v, rows, work, fn, shape, width, indexed, contiguous, simple):
    """The op per sample under autograd (dense autograd of the op, then a ``cat``)."""
    s = math.prod(v.shape[1:])
    vals, idxs = [], []
    if simple:
        pieces = v.split_with_sizes(rows)
        for i, _, n, _ in work:
            t = pieces[i]
            if _transposed(t, contiguous, n, s):
                res_v, res_i = _pair(fn(t.reshape(n, s).t().contiguous(), 1), indexed)
                like = (n if shape == "keep" else width, *v.shape[1:]) if shape != "remove" else v.shape[1:]
                res_v = _untranspose(res_v, shape, like)
                res_i = _untranspose(res_i, shape, like) if indexed else None
            else:
                res_v, res_i = _pair(fn(t, 0), indexed)
            # row counts spelled out: with no static elements (s = 0) a -1 would be ambiguous
            lead = (t.shape[0],) if shape == "keep" else (1, width) if shape == "static" else (1,)
            vals.append(res_v.reshape(*lead, s))
            if indexed:
                idxs.append(res_i.reshape(*lead, s))
    else:
        pieces = v.reshape(v.shape[0], s).split_with_sizes(rows)
        for i, outer, n, inner in work:
            res_v, res_i = _pair(fn(pieces[i].view(outer, n, inner, s), 1), indexed)
            vals.append(_from_block(res_v, shape, outer, inner, width, s))
            if indexed:
                idxs.append(_from_block(res_i, shape, outer, inner, width, s))
    return torch.cat(vals), (torch.cat(idxs) if indexed else None)


def _from_block(t, shape, outer, inner, width, s):
    """The op's result along dim 1 of ``(outer, n, inner, S)`` as packed rows ``(rows, S)``
    (``keep``), per segment ``(segments, width, S)`` (``static``) or ``(segments, S)``."""
    if shape == "keep":
        return t.reshape(outer * t.shape[1] * inner, s)
    if shape == "remove":
        return t.reshape(outer * inner, s)
    return t.transpose(1, 2).reshape(outer * inner, width, s)


def _per_length(v2: torch.Tensor, p: Partition, k: int, fn: Callable, shape: str, width: int, indexed: bool,
                grad: bool):
    """The rows regrouped by length (``length_order``), the op once per length, the results put
    back in packed order; ``v2``: the values as ``(T, S)``."""
    gather, place, cell_place, lengths = _groups(p, k)
    s = v2.shape[1]
    rows = [count for _, count in lengths]
    segs = [count // n for n, count in lengths]
    groups = v2.index_select(0, gather).split_with_sizes(rows)
    tail = () if s == 1 else (s,)  # one column: the op along dim 1 of ``(segments, n)``
    out_tail = {"keep": (-1,), "static": (width,), "remove": ()}[shape] + tail
    if not grad:  # every length's results into one buffer, in the regrouped order
        lead = {"keep": (v2.shape[0],), "static": (sum(segs), width), "remove": (sum(segs),)}[shape]
        out_v = v2.new_empty((*lead, s))
        out_i = torch.empty(out_v.shape, dtype=torch.int64, device=v2.device) if indexed else None
        parts_v = out_v.split_with_sizes(rows if shape == "keep" else segs)
        parts_i = out_i.split_with_sizes(rows if shape == "keep" else segs) if indexed else None
    vals, idxs = [], []
    for j, (n, _) in enumerate(lengths):
        t = groups[j].view(segs[j], n, *tail)
        if grad:
            res_v, res_i = _pair(fn(t, 1), indexed)
            lead = (segs[j] * n,) if shape == "keep" else (segs[j], width) if shape == "static" else (segs[j],)
            vals.append(res_v.reshape(*lead, s))
            if indexed:
                idxs.append(res_i.reshape(*lead, s))
        else:
            ov = parts_v[j].view(segs[j], *out_tail)
            oi = parts_i[j].view(segs[j], *out_tail) if indexed else None
            fn(t, 1, out=(ov, oi) if indexed else ov)
    if grad:
        out_v, out_i = torch.cat(vals), (torch.cat(idxs) if indexed else None)
    back = place if shape == "keep" else cell_place
    return out_v.index_select(0, back), (out_i.index_select(0, back) if indexed else None)
