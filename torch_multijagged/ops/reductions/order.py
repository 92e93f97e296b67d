"""Order statistics per sample: ``sort`` / ``argsort`` / ``topk`` / ``kthvalue`` / ``median`` /
``nanmedian`` / ``quantile`` / ``nanquantile`` / ``cummax`` / ``cummin`` along ragged dims (along static dims, the dense op on the
values).

NOTE [ Order statistics along ragged dims ]

Along ragged dim k the elements that one dense call would order are a *segment*: the cells of one
sample that share every other coordinate (the rows ``Partition.map_to_sub`` maps to one row of
the partition without dim k), one column per static element.

Eagerly every one of these ops is the dense op itself on each segment (``segment_ops.py``, NOTE
[ Dense ops on segments ]): per sample on a view of its rows, or regrouped by length, so values,
indices — dense's own tie order, stable or not, ``topk`` sorted or not, the tied element a
selection returns — and gradients are dense torch's on the sample. ``cummax`` / ``cummin`` are
eager only (a graph break under ``torch.compile``).

Traced (``torch.compile``), the rest run on *index maps*, with no host sizes: ``sort`` orders
every column of every segment at once (``kernels/along.py``: ``segment_order``, a stable sort by
value and then by segment) and writes the order into the segment's own rows; ``kthvalue`` /
``median`` / ``nanmedian`` pick one position of that order per segment and column (the lower
median; ``median`` gives the first NaN of a column that has one, ``nanmedian`` the median of the
rest, as dense torch, and for a column that is all NaN the index dense torch's selection gives,
which only dense torch knows: ``_all_nan_place``); ``quantile`` / ``nanquantile`` pick the two
places around ``q · (n − 1)`` and interpolate them as aten's ``quantile_impl`` does; ``topk``
takes the first k. Only indices are computed this way (without autograd); values are gathered
from the input with them (``_gather_values``: an ``index_select`` of the flat values, which
saves only the index, as dense saves only its indices), so the gradient is dense torch's: each
output's gradient goes to the element it came from. There ties keep their order (``stable=True``
in dense terms, also for ``sort(stable=False)`` and ``topk``, whose order dense torch leaves
unspecified); values agree with dense, and the index among tied elements may be another one.

``topk``'s and ``kthvalue``'s k must fit every sample, and ``median`` needs a non-empty dim, or
they raise naming the sample, as dense torch raises for it.
"""

from __future__ import annotations

import math

import torch

from ...bridge import values_of, wrap_values
from ...kernels.along import packed_rows, segment_order
from .._common import MJT, canonical_dim, component_rows, describe, static_dims, wrap
from ...structure import _is_traced, partition_for
from .._routing import route
from ..indexing.along import check_samples, eager, eager_or_traced, ragged_dim, take_static
from .segment_ops import eager_segments, run_segments, shortest

rt = torch.return_types


def _columns(v: torch.Tensor) -> torch.Tensor:
    # not reshape(T, -1): with no rows (B = 0, or every sample empty) the -1 is ambiguous
    return v.reshape(v.shape[0], math.prod(v.shape[1:]))


def _segments(x: MJT, k: int):
    """``(segment (T,), coordinate along k (T,), sub partition, row stride along k (T,))``."""
    p = x._partition
    keep = tuple(i for i in range(p.nragged) if i != k)
    seg, sub = p.map_to_sub(keep)
    sample, coords = p.row_coords()
    n = p.device_sizes()[sample]
    stride = n[:, k + 1:].prod(1) if k + 1 < p.nragged else torch.ones_like(sample)
    return seg, coords[:, k], sub, stride


def _sorted_rows(x: MJT, k: int, descending: bool) -> torch.Tensor:
    """(T, S): the input row whose element lands at each row (and column) once every segment is
    sorted."""
    seg, _, _, _ = _segments(x, k)
    keys = _columns(x._values.detach())
    order = segment_order(seg, keys, descending)
    slots = torch.sort(seg, stable=True)[1]  # each segment's rows, in coordinate order
    src = torch.empty_like(order)
    src[slots] = order
    return src


def _gather_values(x: MJT, rows: torch.Tensor) -> torch.Tensor:
    """Values of ``x`` at input rows ``rows`` ((N, S)), differentiable: (N, *static). An
    ``index_select`` of the flat values, whose backward keeps only the index and the size (a
    ``gather`` would save the input: writing it in place after the op would break the backward,
    where dense's order statistics keep only their indices)."""
    v = values_of(x)
    cols = _columns(v)
    flat = rows * cols.shape[1] + torch.arange(cols.shape[1], device=rows.device)
    return cols.reshape(-1).index_select(0, flat.reshape(-1)).reshape(rows.shape[0], *v.shape[1:])


def _wrap(t: torch.Tensor, x: MJT) -> MJT:
    """Values ``t`` of ``x``'s structure; differentiable when they carry a gradient."""
    return wrap_values(t, x._partition, x._ragged_dims) if t.requires_grad else wrap(t, x._partition, x._ragged_dims)


def _sub(x: MJT, k: int):
    """The partition without ragged dim ``k`` (the batch's when it is the only one)."""
    p = x._partition
    return p.map_to_sub(tuple(i for i in range(p.nragged) if i != k))[1]


@eager_or_traced
def sort_ragged(op: str, x: MJT, k: int, descending: bool, stable: bool = True):
    if eager_segments(x):
        def dense(t, d, out=None):
            return torch.sort(t, dim=d, descending=descending, stable=stable, out=out)

        out = run_segments(x, k, dense, "keep", sort_like=True, contiguous=True)
        if out is not None:
            return _wrap(out[0], x), wrap(out[1], x._partition, x._ragged_dims)
    src = _sorted_rows(x, k, descending)
    _, coord, _, _ = _segments(x, k)
    values = wrap_values(_gather_values(x, src), x._partition, x._ragged_dims)
    indices = wrap(coord[src].reshape(x._values.shape), x._partition, x._ragged_dims)
    return values, indices


def _pick_rows(x: MJT, k: int, src: torch.Tensor, position: torch.Tensor):
    """``(rows, coordinate along k, sub partition)``: the input row of the element at ``position``
    ((segments, S) places in the sorted order, per segment and column) of every segment — each
    non-empty, so it has a cell at coordinate 0."""
    _, coord, sub, _ = _segments(x, k)
    p = x._partition
    if sub.nragged:
        sample, coords = sub.row_coords()
    else:
        sample = torch.arange(p.batch, device=p.offsets.device)
        coords = sample.new_zeros(p.batch, 0)
    zero = torch.zeros_like(sample).unsqueeze(1)
    first = packed_rows(p.offsets, p.device_sizes(), sample, torch.cat([coords[:, :k], zero, coords[:, k:]], 1))
    n = p.device_sizes()[sample]
    step = n[:, k + 1:].prod(1) if k + 1 < p.nragged else torch.ones_like(sample)
    return src.gather(0, first.unsqueeze(1) + position * step.unsqueeze(1)), coord, sub


def _without(x: MJT, k: int, sub, t: torch.Tensor, differentiable: bool = True):
    """Per-segment rows ``t`` as the result without ragged dim k: dense ``(B, …)`` when no
    ragged dim is left."""
    if not sub.nragged:
        return t
    d = x._ragged_dims[k]
    ragged = tuple(r - (r > d) for r in x._ragged_dims if r != d)
    return wrap_values(t, sub, ragged) if differentiable and t.requires_grad else wrap(t, sub, ragged)


def _pick(op: str, x: MJT, k: int, src: torch.Tensor, position: torch.Tensor):
    """The element at ``position`` of every segment (``_pick_rows``): ``(values, indices)``
    without dim k."""
    rows, coord, sub = _pick_rows(x, k, src, position)
    values = _gather_values(x, rows)
    indices = coord[rows].reshape(values.shape)
    return _without(x, k, sub, values), _without(x, k, sub, indices, False)


def _remove(x: MJT, k: int, out):
    """``run_segments``' per-segment ``(values, indices)`` as the result without dim k."""
    if out is None:
        return None
    sub = _sub(x, k)
    return _without(x, k, sub, out[0]), _without(x, k, sub, out[1], False)


def _seg_lengths(x: MJT, k: int) -> torch.Tensor:
    """(S_rows,) size along k of every segment."""
    p = x._partition
    keep = tuple(i for i in range(p.nragged) if i != k)
    sub = p.map_to_sub(keep)[1]
    sample = sub.row_sample() if sub.nragged else torch.arange(p.batch, device=p.offsets.device)
    return p.extents[k].lengths()[sample]


def _keepdim(out, d: int, keepdim: bool):
    return out if not keepdim else tuple(o.unsqueeze(d) for o in out)


@eager_or_traced
def kthvalue_ragged(op: str, x: MJT, k: int, kth: int, keepdim: bool):
    def fail(s, n):  # the first sample dense torch refuses, with its exception type
        if n == 0:
            raise IndexError(f"{op}(): Expected reduction dim {x._ragged_dims[k]} to have non-zero size in sample {s} of {describe(x)}")
        raise RuntimeError(f"{op}(): selected number k = {kth} out of range for sample {s} of {describe(x)} (size {n})")

    eager = eager_segments(x)
    if not (eager and 1 <= kth <= shortest(x, k)):  # eagerly, every sample long enough: nothing to name
        check_samples(x, k, lambda n: (n < kth) | torch.full_like(n, kth < 1, dtype=torch.bool), fail,
                      f"{op}(): selected number k = {kth} out of range for a sample")
    if eager:
        out = _remove(x, k, run_segments(x, k, lambda t, d, out=None: torch.kthvalue(t, kth, d, out=out), "remove",
                                         contiguous=True))
        if out is not None:
            return _keepdim(out, x._ragged_dims[k], keepdim)
    src = _sorted_rows(x, k, False)
    position = torch.full((_seg_lengths(x, k).shape[0], src.shape[1]), kth - 1, dtype=torch.int64, device=src.device)
    return _keepdim(_pick(op, x, k, src, position), x._ragged_dims[k], keepdim)


def _nan_counts(x: MJT, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(length (S, 1), NaN count (S, columns))`` of every segment along ragged dim k."""
    seg, _, _, _ = _segments(x, k)
    keys = _columns(x._values.detach())
    length = _seg_lengths(x, k).unsqueeze(1)
    nan = keys.isnan().to(torch.int64) if keys.is_floating_point() else torch.zeros_like(keys, dtype=torch.int64)
    return length, torch.zeros(length.shape[0], keys.shape[1], dtype=torch.int64, device=keys.device).index_add_(0, seg, nan)


def _all_nan_place(x: MJT, k: int, length: torch.Tensor) -> torch.Tensor:
    """(S, 1): the index dense ``nanmedian`` gives a column of ``length`` elements that are all
    nan — its place in the sorted order too, which keeps nans in index order. Dense torch's
    selection leaves there whatever its partitioning moved to the front of elements that all
    compare equal (on the CPU ``std::nth_element`` around place 0: 2 of 4, 5 of 7, 8 of 13 — no
    rule of n to write down, and another one on other devices or builds), so it is read from
    dense torch itself, once per length of the extent, and cached on the partition. Traced (no
    host lengths), or no nan (integers): 0."""
    e = x._partition.extents[k]
    if _is_traced(e.offsets) or not x.is_floating_point():
        return torch.zeros_like(length)
    dtype, device = x.dtype, x._values.device

    def compute(p):
        host = e.host_lengths()
        table = torch.zeros(int(host.max()) + 1 if host.numel() else 1, dtype=torch.int64, device=device)
        for n in torch.unique(host[host > 0]).tolist():  # each length once, per structure (cached)
            table[n] = torch.nanmedian(torch.full((n,), math.nan, dtype=dtype, device=device), 0).indices
        return table

    return x._partition.derived(("all_nan_median", k, dtype), compute)[length]


def _materialised(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied where a stride is 0 (an ``expand``): torch's CPU ``median`` / ``nanmedian``
    along a dim of such a tensor read memory outside it (torch 2.13: ``tensor([[3.], [1.]])
    .expand(-1, 3).median(1)`` is not ``[3, 1]``), which in a packed batch is another sample's rows."""
    return t.contiguous() if 0 in t.stride() else t


@eager_or_traced
def median_ragged(op: str, x: MJT, k: int, keepdim: bool, ignore_nan: bool):
    def empty(s, n):
        raise IndexError(f"{op}(): Expected reduction dim {x._ragged_dims[k]} to have non-zero size in sample {s} of {describe(x)}")

    eager = eager_segments(x)
    if not (eager and shortest(x, k) > 0):
        check_samples(x, k, lambda n: n == 0, empty, f"{op}(): Expected reduction dim to have non-zero size in every sample")
    if eager:
        dense = torch.nanmedian if ignore_nan else torch.median
        out = _remove(x, k, run_segments(x, k, lambda t, d, out=None: dense(_materialised(t), d, out=out), "remove"))
        if out is not None:
            return _keepdim(out, x._ragged_dims[k], keepdim)
    src = _sorted_rows(x, k, False)
    length, nans = _nan_counts(x, k)
    if ignore_nan:
        m = length - nans
        position = torch.where(m > 0, torch.div(m - 1, 2, rounding_mode="floor"), _all_nan_place(x, k, length))
    else:
        position = torch.where(nans > 0, length - nans, torch.div(length - 1, 2, rounding_mode="floor"))
    return _keepdim(_pick(op, x, k, src, position), x._ragged_dims[k], keepdim)


_QUANTILE_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


@eager_or_traced
def quantile_ragged(op: str, x: MJT, k: int, q: float, keepdim: bool, interpolation: str, ignore_nan: bool):
    """aten's ``quantile_impl`` per segment: ranks ``q · (n − 1)`` in the input's dtype (``n`` the
    non-NaN count for ``nanquantile``; for ``quantile`` a NaN makes the rank the last place, where
    the sort put the NaN), rounded by ``interpolation``, and the two neighbouring order statistics
    interpolated with ``lerp`` — so values and gradients are dense torch's."""
    def empty(s, n):
        raise RuntimeError(f"{op}(): input tensor must be non-empty (sample {s} of {describe(x)} is empty along dim {x._ragged_dims[k]})")

    if not x.dtype.is_floating_point or x.dtype in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"{op}() input tensor must be either float or double dtype")
    eager = eager_segments(x)
    if not (eager and shortest(x, k) > 0):
        check_samples(x, k, lambda n: n == 0, empty, f"{op}(): input tensor must be non-empty in every sample")
    if eager:
        dense = torch.nanquantile if ignore_nan else torch.quantile
        seg = run_segments(x, k, lambda t, d, out=None: dense(t, q, dim=d, interpolation=interpolation, out=out),
                           "remove", indexed=False)
        if seg is not None:
            out = _without(x, k, _sub(x, k), seg[0])
            return out.unsqueeze(x._ragged_dims[k]) if keepdim else out
    src = _sorted_rows(x, k, False)
    length, nans = _nan_counts(x, k)
    qt = torch.tensor(q, dtype=x.dtype, device=nans.device)
    if ignore_nan:
        ranks = (qt * (length - nans - 1)).clamp_min(0)
    else:
        last = (length - 1).to(x.dtype).expand_as(nans)
        ranks = torch.where(nans > 0, last, qt * last)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    below = ranks.to(torch.int64)
    rows, _, sub = _pick_rows(x, k, src, below)
    out = _gather_values(x, rows)
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        above = _gather_values(x, _pick_rows(x, k, src, ranks.ceil().to(torch.int64))[0])
        out = out.lerp(above, weights.reshape(out.shape))
    out = _without(x, k, sub, out)
    return out.unsqueeze(x._ragged_dims[k]) if keepdim else out


def _as_static(x: MJT, k: int, sub, t: torch.Tensor, differentiable: bool = True):
    """Per-segment results ``(segments, size, *static)`` as ragged dim k made static of ``size``
    (the layout ``take_static`` gives); ``sub``: the partition without dim k."""
    d = x._ragged_dims[k]
    statics = sorted(static_dims(len(x._size), x._ragged_dims) + (d,))
    t = t.movedim(1, 1 + statics.index(d))
    if not sub.nragged:
        return t
    ragged = tuple(r for r in x._ragged_dims if r != d)
    return wrap_values(t, sub, ragged) if differentiable and t.requires_grad else wrap(t, sub, ragged)


@eager_or_traced
def topk_ragged(op: str, x: MJT, k: int, kk: int, largest: bool, sorted: bool = True):
    def short(s, n):
        raise RuntimeError(f"{op}(): selected index k = {kk} out of range for sample {s} of {describe(x)} (size {n})")

    eager = eager_segments(x)
    if not (eager and 0 <= kk <= shortest(x, k)):  # k < 0 fits no sample
        check_samples(x, k, lambda n: (n < kk) | torch.full_like(n, kk < 0, dtype=torch.bool), short,
                      f"{op}(): selected index k = {kk} out of range for a sample")
    if eager and kk > 0:
        out = run_segments(x, k, lambda t, d, out=None: torch.topk(t, kk, d, largest, sorted, out=out), "static",
                           width=kk)
        if out is not None:
            sub = _sub(x, k)
            return _as_static(x, k, sub, out[0]), _as_static(x, k, sub, out[1], False)
    table = torch.arange(kk, device=x._partition.offsets.device)
    if kk == 0:  # nothing to select: the empty static dim (no sort)
        return take_static(x, k, 0, table), take_static(wrap(torch.zeros_like(x._values, dtype=torch.int64),
                                                             x._partition, x._ragged_dims), k, 0, table)
    values, indices = sort_ragged(op, x, k, largest)
    return take_static(values, k, kk, table), take_static(indices, k, kk, table)


@eager
def scan_ragged(op: str, x: MJT, k: int, is_max: bool):
    dense = torch.cummax if is_max else torch.cummin
    out = run_segments(x, k, lambda t, d, out=None: dense(t, d, out=out), "keep")
    if out is None:  # no packed rows: nothing to scan
        v = values_of(x)
        out = v.clone(), torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    return _wrap(out[0], x), wrap(out[1], x._partition, x._ragged_dims)


# ----------------------------------------------------------------------------- static dims
def _static(op: str, x: MJT, d: int, fn, removes: bool):
    """``fn(values, vd)`` → (values, indices) along static dim ``d``, structure kept."""
    vd = static_dims(x.dim(), x._ragged_dims).index(d) + 1
    values, indices = fn(values_of(x), vd)
    ragged = tuple(r - (r > d) for r in x._ragged_dims) if removes else x._ragged_dims
    return wrap_values(values, x._partition, ragged), wrap(indices, x._partition, ragged)


def _dim(op: str, x: MJT, dim):
    d = canonical_dim(op, len(x._size), dim)
    if d == 0:
        raise NotImplementedError(f"{op}(): along the batch dim of {describe(x)} for layout torch.multi_jagged")
    return d, ragged_dim(op, x, d)


@route(torch.sort, torch.Tensor.sort)
def _sort(input, dim=-1, descending=False, stable=False, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    if isinstance(dim, bool):  # sort(stable, dim=..., descending=...) overload
        dim = -1
    d, hit = _dim("sort", input, dim)
    if hit is None:
        # dim= by keyword: with stable=, torch.sort takes only its keyword-only overload (a
        # positional dim is a TypeError)
        v, i = _static("sort", input, d, lambda v, vd: torch.sort(v, dim=vd, descending=descending, stable=bool(stable)),
                       False)
    else:
        v, i = sort_ragged("sort", input, hit[1], bool(descending), bool(stable))
    return rt.sort((v, i))


@route(torch.argsort, torch.Tensor.argsort)
def _argsort(input, dim=-1, descending=False, stable=False):
    if not isinstance(input, MJT):
        return NotImplemented
    return _sort(input, dim, descending, stable)[1]


@route(torch.msort, torch.Tensor.msort)
def _msort(input, *, out=None):
    if not isinstance(input, MJT):
        return NotImplemented
    raise NotImplementedError(f"msort(): sorts along the batch dim of {describe(input)} for layout torch.multi_jagged")


@route(torch.topk, torch.Tensor.topk)
def _topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    d, hit = _dim("topk", input, dim)
    if hit is None:
        v, i = _static("topk", input, d, lambda v, vd: torch.topk(v, k, vd, largest, sorted), False)
    else:
        v, i = topk_ragged("topk", input, hit[1], int(k), bool(largest), bool(sorted))
    return rt.topk((v, i))


@route(torch.kthvalue, torch.Tensor.kthvalue)
def _kthvalue(input, k, dim=-1, keepdim=False, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    d, hit = _dim("kthvalue", input, dim)
    if hit is None:
        v, i = _static("kthvalue", input, d, lambda v, vd: torch.kthvalue(v, k, vd, keepdim), not keepdim)
    else:
        v, i = kthvalue_ragged("kthvalue", input, hit[1], int(k), bool(keepdim))
    return rt.kthvalue((v, i))


def _median_route(name: str, ignore_nan: bool, result):
    dense = getattr(torch, name)

    def routed(input, dim=None, keepdim=False, *, out=None):
        if not isinstance(input, MJT) or out is not None:
            return NotImplemented
        if dim is None:
            return dense(values_of(input))  # over every element of the batch, as sum() is
        d, hit = _dim(name, input, dim)
        if hit is None:
            v, i = _static(name, input, d, lambda v, vd: dense(_materialised(v), vd, keepdim), not keepdim)
        else:
            v, i = median_ragged(name, input, hit[1], bool(keepdim), ignore_nan)
        return result((v, i))

    return routed


def _quantile_route(name: str, ignore_nan: bool):
    dense = getattr(torch, name)

    def routed(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
        if not isinstance(input, MJT):
            return NotImplemented
        if out is not None:  # (dense's composite quantile would resize ``out`` before failing)
            raise NotImplementedError(f"{name}(): out= variants are not supported for layout torch.multi_jagged")
        if interpolation not in _QUANTILE_MODES:
            raise ValueError(f"{name}() interpolation must be one of {', '.join(_QUANTILE_MODES)}. Got {interpolation}")
        if dim is None:
            # every element, as sum() is; with keepdim every dim kept as 1 (after a q dim), as dense
            out = dense(values_of(input), q, interpolation=interpolation)
            return out.reshape(*out.shape, *([1] * input.dim())) if keepdim else out
        d, hit = _dim(name, input, dim)
        if isinstance(q, torch.Tensor) and q.dim() > 0:
            if q.dim() > 1:
                raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
            # dense torch leads the output with a q dim: a dense result when the dim taken was the
            # batch's only ragged dim, one quantile per q stacked (the batch dim cannot move)
            if hit is None or len(input._ragged_dims) > 1:
                raise NotImplementedError(
                    f"{name}() along dim {dim} of {describe(input)} with several q: the output would lead with a q dim, "
                    "before the batch, and keep a ragged dim (layout torch.multi_jagged); call it once per q"
                )
            return torch.stack([routed(input, qi, dim, keepdim, interpolation=interpolation) for qi in q.unbind()])
        if hit is None:
            vd = static_dims(input.dim(), input._ragged_dims).index(d) + 1
            v = dense(values_of(input), q, vd, keepdim, interpolation=interpolation)
            ragged = input._ragged_dims if keepdim else tuple(r - (r > d) for r in input._ragged_dims)
            return wrap_values(v, input._partition, ragged)
        return quantile_ragged(name, input, hit[1], float(q), bool(keepdim), interpolation, ignore_nan)

    return routed


@route(torch.mode, torch.Tensor.mode)
def _mode(input, dim=-1, keepdim=False, *, out=None):
    """Along a static dim, the dense op on the values. Along a ragged dim dense torch leaves the
    index of a tied mode to its kernel, so the dense op runs on each sample (its kernel's index,
    whatever it picks); eager only."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    d, hit = _dim("mode", input, dim)
    if hit is not None:
        return rt.mode(_mode_per_sample(input, d, bool(keepdim)))
    return rt.mode(_static("mode", input, d, lambda v, vd: torch.mode(v, vd, keepdim), not keepdim))


@eager
def _mode_per_sample(x: MJT, d: int, keepdim: bool):
    outs = []
    for i, c in enumerate(x.unbind()):
        if c.shape[d - 1] == 0:
            raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size in sample {i} of {describe(x)}")
        outs.append(torch.mode(c, d - 1, keepdim))
    rest = [r for r in x._ragged_dims if r != d]
    if not rest:  # the dim was the only ragged one: one mode per sample, a dense (B, …)
        if not outs:
            shape = [0] + [1 if k == d and keepdim else n for k, n in enumerate(x.shape) if k and (k != d or keepdim)]
            return values_of(x).new_zeros(shape), torch.zeros(shape, dtype=torch.int64, device=x.device)
        return torch.stack([o.values for o in outs]), torch.stack([o.indices for o in outs])
    p = x._partition
    part = partition_for([p.extents[x._ragged_dims.index(r)] for r in rest])
    ragged = tuple(r if keepdim or r < d else r - 1 for r in rest)
    rag = [r - 1 for r in ragged]
    if not outs:  # an empty batch: no rows, the static sizes the samples' modes would have
        static = [1 if k == d else x.shape[k] for k in range(1, x.dim()) if (k == d and keepdim) or k not in x._ragged_dims]
        v = values_of(x).new_zeros((0, *static))
        return wrap_values(v, part, ragged), wrap(torch.zeros(v.shape, dtype=torch.int64, device=v.device), part, ragged)
    v = torch.cat([component_rows(o.values, rag) for o in outs])
    i = torch.cat([component_rows(o.indices, rag) for o in outs])
    return wrap_values(v, part, ragged), wrap(i, part, ragged)


route(torch.quantile, torch.Tensor.quantile)(_quantile_route("quantile", False))
route(torch.nanquantile, torch.Tensor.nanquantile)(_quantile_route("nanquantile", True))
route(torch.median, torch.Tensor.median)(_median_route("median", False, rt.median))
route(torch.nanmedian, torch.Tensor.nanmedian)(_median_route("nanmedian", True, rt.nanmedian))


def _scan_route(name: str, is_max: bool, result):
    dense = getattr(torch, name)

    def routed(input, dim, *, out=None):
        if not isinstance(input, MJT) or out is not None:
            return NotImplemented
        d, hit = _dim(name, input, dim)
        if hit is None:
            v, i = _static(name, input, d, lambda v, vd: dense(v, vd), False)
        else:
            v, i = scan_ragged(name, input, hit[1], is_max)
        return result((v, i))

    return routed


route(torch.cummax, torch.Tensor.cummax)(_scan_route("cummax", True, rt.cummax))
route(torch.cummin, torch.Tensor.cummin)(_scan_route("cummin", False, rt.cummin))

__all__ = ["sort_ragged", "topk_ragged", "kthvalue_ragged", "median_ragged", "scan_ragged"]


@route(torch.multinomial, torch.Tensor.multinomial)
def _multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
    """Draws per sample (sampling after a top-k / nucleus filter of each sample's candidates):
    along a static last dim every packed row is a distribution, as dense's 2-D input; along a
    ragged last dim of ``(B, j0)`` or ``(B, S, j0)`` each sample's rows, padded with zero
    probabilities, which are never drawn (a dense ``(B, num_samples)`` or ``(B, S, num_samples)``).
    Dense's errors stand: a sample with too few categories without replacement, or no mass."""
    if not isinstance(input, MJT):
        return NotImplemented
    if out is not None:
        raise NotImplementedError("multinomial(): out= variants are not supported for layout torch.multi_jagged")
    last = input.dim() - 1
    if input.dim() > 3 or input.dim() < 2:
        raise RuntimeError(f"multinomial(): prob_dist must be 1 or 2 dim, got samples of {describe(input)}")
    if last not in input._ragged_dims:  # (B, j0, C): a distribution per packed row
        return wrap_values(torch.multinomial(values_of(input), num_samples, replacement, generator=generator),
                           input._partition, input._ragged_dims)
    if input._ragged_dims != (last,):
        raise NotImplementedError(f"multinomial(): of {describe(input)}, ragged in its rows and its categories "
                                  "(layout torch.multi_jagged)")
    sizes = input._partition.host_sizes()[:, 0]
    if not replacement and input._partition.batch and int(sizes.min()) < num_samples:  # dense's check, per sample
        i = int((sizes < num_samples).nonzero()[0])  # SYNC: none — host sizes
        raise RuntimeError(f"multinomial(): cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                           f"(sample {i} has {int(sizes[i])} categories, {num_samples} asked)")
    padded = input.to_padded_tensor(0.0)
    if padded.numel() == 0 and input._partition.batch == 0:  # no samples: no draws, as dense's (0, n)
        return torch.zeros((*padded.shape[:-1], num_samples), dtype=torch.int64, device=padded.device)
    flat = padded.reshape(-1, padded.shape[-1])
    drawn = torch.multinomial(flat, num_samples, replacement, generator=generator)
    return drawn.reshape(*padded.shape[:-1], num_samples)
