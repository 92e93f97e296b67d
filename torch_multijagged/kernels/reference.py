"""Pure-torch reference implementations of the structural kernels.

Plain tensors in and out; nothing here knows about ``MultiJaggedTensor``. Each function is the
CPU implementation, the specification of any Triton twin with the same signature, and the test
oracle for it. All are vectorised (no per-sample Python loop) and host-sync free: sizes that
depend on the data arrive as arguments (``rows``) that the caller reads off a shape carrier.
"""

from __future__ import annotations

import contextlib
import functools

import math

import torch

__all__ = ["row_sample", "row_coords", "row_map", "segment_reduce", "segment_softmax", "segment_softmax_backward"]


def row_sample(offsets: torch.Tensor, rows) -> torch.Tensor:
    """(T,) sample index of every packed row. ``offsets``: (B+1,) int64, ``rows`` = T.

    Exact in every form; which form depends on who runs it (NOTE [ Index maps under Inductor ])."""
    if not _is_traced(offsets) and rows >= _REPEAT_MIN_ROWS:
        # O(T), no sync (``output_size`` given)
        b = offsets.shape[0] - 1
        return torch.repeat_interleave(torch.arange(b, device=offsets.device), offsets.diff(), output_size=rows)
    r = torch.arange(rows, device=offsets.device, dtype=offsets.dtype)
    if _is_traced(offsets):
        return _search_sample(offsets, r)
    return torch.searchsorted(offsets, r, right=True) - 1


# NOTE [ Index maps under Inductor ]
#
# Every ragged index map reduces to row -> sample; the rest (local coordinates, a pair cell's row
# and column) is arithmetic on it (``remainder``/``div``, gathers from (B,) tensors), which
# Inductor fuses into the gathers and reductions that read the map.
#
# Traced (dynamo / AOTAutograd), row -> sample must avoid ``searchsorted`` and ``cumsum``: Inductor's
# CPU backend lowers neither (each stays an ATen fallback call, a fusion barrier), and it
# decomposes ``repeat_interleave`` only for a static output size, into the same two ops. We use
#   * B <= 32: ``sample = #{1 <= i < B : offsets[i] <= r}``, a reduction over B. Inductor realizes
#     a reduction once per row, so every consumer reads one int64 (B compares per row);
#   * larger B: a branchless binary search, ceil(log2 B) rounds of gather / compare / select.
#     Pointwise, so Inductor inlines it into each consumer instead of storing it (measured on the
#     pair block, B = 8: ~5% slower forward than the fallback when used for every B).
# Eagerly one ATen call is fastest (B = 8..512, 1 thread, µs; the eager maps are cached per
# structure, so this is paid once):
#
#   rows      searchsorted  repeat_interleave  binary search (eager ops)
#   ~300          10-17          25-37            120-170
#   ~7,000       90-140          40-94            330-1200
#   ~64,000        1230            165              6200
_REPEAT_MIN_ROWS = 1024
_SUM_MAX_B = 32


def _is_traced(t: torch.Tensor) -> bool:
    """True while dynamo / AOTAutograd trace (fake or functional tensors), not for real data."""
    if type(t) is torch.Tensor and not torch._is_functional_tensor(t) and not _functorch_wrapped(t):
        return False  # real data, the eager case: answered without ``is_fake``'s walk
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t) or isinstance(t, torch._subclasses.functional_tensor.FunctionalTensor)


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_NULL = contextlib.nullcontext()


def lead_major(t: torch.Tensor) -> bool:
    """Whether packed values ``t`` lie static dims first: ``(*static, T)`` in memory, seen as
    ``(T, *static)`` (a product's attention scores, NOTE [ Lead-major products ] in ragged_mm.py)."""
    return t.dim() > 1 and t.stride(0) == 1 and t.shape[0] > 1 and not t.is_contiguous()


def building():
    """The context a cached map is built in: outside ``torch.inference_mode``. Maps are shared by
    every later op on the structure, and a map first built as an inference tensor could not be
    saved for backward by a later op that records autograd (dense torch carries no such state
    from one call to the next, so it must not fail there either)."""
    if torch.is_inference_mode_enabled() and not torch.compiler.is_compiling():
        return torch.inference_mode(False)
    return _NULL


def built_outside_inference_mode(fn):
    """``fn`` run in ``building()``: for a memoised builder of maps (under ``lru_cache``)."""
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        with building():
            return fn(*args, **kwargs)

    return inner


def _search_rounds(b) -> int:
    """Rounds of the binary search over ``b`` samples: enough that ``2**k > b - 1``. For a
    dynamic B this guards on a bucket of B (one graph per bucket), not on its value."""
    if isinstance(b, int):
        return max(b - 1, 0).bit_length()
    for k in (8, 12, 16, 24, 32, 48):
        if b <= (1 << k):
            return k
    return 62


def _search_sample(offsets: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The largest ``i < B`` with ``offsets[i] <= r``, elementwise (``r < offsets[B]``); zero-length
    samples (equal offsets) resolve to the last sample that starts at or before ``r``."""
    b = offsets.shape[0] - 1
    if b <= _SUM_MAX_B:  # a guard on a bucket of B when B is dynamic
        # offsets[B] = T > r counts nothing: the slice to the end keeps a dim of B (≥ 2 where B is
        # dynamic), where ``offsets[1:B]`` would ask whether B - 1 is 1 (a guard that split B = 2 off)
        return (offsets[1:].unsqueeze(0) <= r.unsqueeze(1)).sum(1)
    # Binary lifting: ``offsets[pos] <= r`` holds (true at 0); each round tries a step of 2**k. A
    # candidate at or past B reads ``offsets[B] = T > r`` (clamped) and is refused.
    pos = torch.zeros_like(r)
    for k in reversed(range(_search_rounds(b))):
        cand = pos + (1 << k)
        pos = torch.where(offsets[cand.clamp(max=b)] <= r, cand, pos)
    return pos


def row_coords(offsets: torch.Tensor, sizes: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample index (T,) and local ragged coordinates (T, R) of every packed row.

    ``sizes``: (B, R) per-sample extents. Row ``o_i + Σ_k a_k Π_{l>k} n_{i,l}`` has coordinates
    ``(a_1..a_R)``. Rows only exist for samples whose extents are all ≥ 1, so the divisions
    below never see a zero."""
    sample = row_sample(offsets, rows)
    local = torch.arange(rows, device=offsets.device, dtype=offsets.dtype) - offsets[sample]
    r = sizes.shape[1]
    coords = [local] * r
    for k in reversed(range(r)):
        if k == 0:
            coords[0] = local
            break
        n = sizes[sample, k]
        coords[k] = torch.remainder(local, n)
        local = torch.div(local, n, rounding_mode="floor")
    if r == 0:
        return sample, local.new_zeros(rows, 0)
    return sample, torch.stack(coords, dim=1)


def row_map(
    offsets: torch.Tensor, sizes: torch.Tensor, rows, keep: tuple[int, ...], sub_offsets: torch.Tensor
) -> torch.Tensor:
    """For every row of a partition, the row of its sub-partition that keeps ragged dims ``keep``.

    This single map serves both directions: gathering with it broadcasts the sub-partition's
    rows over the dropped dims (pair from singles, ``expand``), and scatter-reducing with it
    reduces the dropped dims (``sum`` over a pair's columns, the autograd engine's
    un-broadcast). ``sub_offsets``: (B+1,) row offsets of the sub-partition (``arange(B+1)``
    when ``keep`` is empty: one row per sample)."""
    sample, coords = row_coords(offsets, sizes, rows)
    idx = sub_offsets[sample]
    stride = None
    for k in reversed(keep):
        term = coords[:, k] if stride is None else coords[:, k] * stride
        idx = idx + term
        n = sizes[sample, k]
        stride = n if stride is None else stride * n
    return idx


def row_reorder(
    offsets: torch.Tensor, sizes: torch.Tensor, rows, order: tuple[int, ...], src_offsets: torch.Tensor
) -> torch.Tensor:
    """For every row of a partition whose k-th ragged dim is the source's dim ``order[k]``, the
    source row holding the same element (a per-sample transpose of ragged dims)."""
    sample, coords = row_coords(offsets, sizes, rows)
    r = len(order)
    src_sizes = [None] * r
    src_coords = [None] * r
    for k, j in enumerate(order):
        src_sizes[j] = sizes[sample, k]
        src_coords[j] = coords[:, k]
    idx = src_offsets[sample]
    stride = None
    for j in reversed(range(r)):
        idx = idx + (src_coords[j] if stride is None else src_coords[j] * stride)
        stride = src_sizes[j] if stride is None else stride * src_sizes[j]
    return idx


def segment_reduce(
    values: torch.Tensor, index: torch.Tensor, out_rows, reduce: str, empty=0
) -> torch.Tensor:
    """Reduce rows of ``values`` (T, *F) into ``out_rows`` rows by ``index`` (T,).

    ``reduce``: "sum", "amax", "amin", "prod", "mean" or "logsumexp". Output rows that receive no
    row hold ``empty`` (pass the reduction's identity; amax/amin have none, so the caller
    decides; dense torch gives NaN for an empty mean and -inf for an empty logsumexp)."""
    if reduce in ("mean", "logsumexp"):
        return _segment_mean_logsumexp(values, index, out_rows, reduce, empty)
    out_shape = (out_rows, *values.shape[1:])
    if reduce == "sum" and isinstance(out_rows, int) and out_rows == 1:
        # one segment (a reduction over the batch): a plain sum. Inductor's CPU code generation
        # (torch 2.13, 2 threads, dynamic rows) fails on an index_add into a (1, …) buffer.
        out = values.sum(0, keepdim=True, dtype=values.dtype)  # integers stay in their dtype, as index_add
        return out + empty if empty else out
    idx = index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    if reduce == "sum":
        out = values.new_full(out_shape, empty) if empty else values.new_zeros(out_shape)
        if values.requires_grad and not torch.compiler.is_compiling():
            # ``scatter_add``'s backward saves only the index; ``index_add``'s saves ``values``, so
            # writing them in place afterwards (``y -= y.mean(1, keepdim=True)``) made the backward
            # raise where dense torch's sum saves nothing. As fast on the CPU (measured).
            return out.scatter_add(0, idx, values)
        return out.index_add(0, index, values)
    out = values.new_full(out_shape, empty)
    return out.scatter_reduce(0, idx, values, reduce=reduce, include_self=False)


def segment_softmax(values: torch.Tensor, index: torch.Tensor, out_rows, log: bool = False) -> torch.Tensor:
    """Softmax of ``values`` (T, *F) over the rows that share a segment ``index`` (T,)."""
    mx = segment_reduce(values.detach(), index, out_rows, "amax")[index]
    z = values - mx
    e = z.exp()
    s = segment_reduce(e, index, out_rows, "sum")[index]
    return z - s.log() if log else e / s


def segment_softmax_backward(grad: torch.Tensor, out: torch.Tensor, index: torch.Tensor, out_rows,
                             log: bool = False) -> torch.Tensor:
    """Input gradient of ``segment_softmax`` from the output gradient ``grad`` and the output
    ``out`` (both (T, *F)): ``y·(g - Σ g·y)``, or ``g - exp(y)·Σ g`` for log_softmax."""
    if log:
        return grad - out.exp() * segment_reduce(grad, index, out_rows, "sum")[index]
    return out * (grad - segment_reduce(grad * out, index, out_rows, "sum")[index])


def _segment_mean_logsumexp(values, index, out_rows, reduce: str, empty):
    count = values.new_zeros(out_rows).index_add(0, index, values.new_ones(values.shape[0]))
    count = count.view(-1, *([1] * (values.dim() - 1)))
    if reduce == "mean":
        out = segment_reduce(values, index, out_rows, "sum") / count
    else:  # an infinite max is taken as 0 (so +inf gives +inf, not NaN)
        m = segment_reduce(values.detach(), index, out_rows, "amax", empty=float("-inf"))
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        out = segment_reduce((values - m[index]).exp(), index, out_rows, "sum").log() + m
    return torch.where(count > 0, out, torch.full_like(out, empty))


def storage_perm(ndim: int, ragged_dims: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Permutations between a component's logical dims (``ndim - 1`` of them) and storage order
    (ragged dims first, then static dims, each in logical order): ``(to_storage, to_logical)``."""
    comp = list(range(ndim - 1))
    rag = [d - 1 for d in ragged_dims]
    to_storage = rag + [d for d in comp if d not in rag]
    to_logical = [to_storage.index(d) for d in comp]
    return to_storage, to_logical


def pack_components(components, ragged_dims: tuple[int, ...]) -> torch.Tensor:
    """Concatenate components (each ``(*logical)``) into packed values ``(T, *static)``.

    A per-sample loop is inherent here (the input is a list)."""
    ndim = components[0].dim() + 1
    to_storage, _ = storage_perm(ndim, ragged_dims)
    r = len(ragged_dims)
    if r == 1 and ragged_dims[0] == 1:
        return torch.cat(list(components), 0)  # each component already is its packed rows
    identity = to_storage == sorted(to_storage)
    rows = []
    for c in components:
        s = c if identity else c.permute(to_storage)
        n = 1
        for k in range(r):
            n *= s.shape[k]
        # an explicit row count: reshape(-1, …) is ambiguous when a static dim has size 0
        rows.append(s.reshape(n, *s.shape[r:]) if r else s.unsqueeze(0))
    return torch.cat(rows, 0)


def unpack_components(
    values: torch.Tensor, host_sizes: torch.Tensor, ragged_dims: tuple[int, ...]
) -> list[torch.Tensor]:
    """Split packed values into components (views where possible), given (B, R) host sizes."""
    r = len(ragged_dims)
    ndim = r + values.dim()
    _, to_logical = storage_perm(ndim, ragged_dims)
    # SYNC: none — ``host_sizes`` lives on the CPU (split sizes must be Python ints). One read: traced,
    # each read makes new unbacked sizes, and a second one's would be left out of the outputs
    sizes = host_sizes.tolist()
    counts = [math.prod(ns) for ns in sizes] if r else [1] * host_sizes.shape[0]
    static = values.shape[1:]
    out = []
    for piece, ns in zip(values.split(counts, 0), sizes):
        out.append(piece.reshape(*ns, *static).permute(to_logical))
    return out


# ----------------------------------------------------------------------------- pair broadcast, padding
# Twins of ``kernels/pair_triton.py`` and ``kernels/padding_triton.py`` (dispatch in
# ``compile/triton_pair.py``); differentiable by ordinary autograd.
_PAIR_COMBINE = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


def pair_combine(left: torch.Tensor, right: torch.Tensor, li: torch.Tensor, ri: torch.Tensor, op: str) -> torch.Tensor:
    """``left[li] ∘ right[ri]`` (``op``: "add", "sub" or "mul"): ``left`` (L, *F), ``right``
    (R, *F), ``li``/``ri`` (T,) int64 row maps (``row_map``), result (T, *F)."""
    return _PAIR_COMBINE[op](left.index_select(0, li), right.index_select(0, ri))


def pair_add_layer_norm(left, right, li, ri, weight, bias, eps: float) -> torch.Tensor:
    """``layer_norm(left[li] + right[ri])`` over the last dim (the sum is rounded to the inputs'
    dtype first, as the unfused ops do)."""
    x = left.index_select(0, li) + right.index_select(0, ri)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def padded_positions(offsets: torch.Tensor, sizes: torch.Tensor, rows, maxes) -> torch.Tensor:
    """(T,) flat cell of every packed row in the padded ``(B, *maxes)`` envelope."""
    sample, coords = row_coords(offsets, sizes, rows)
    pos = sample
    for k, m in enumerate(maxes):
        pos = pos * m + coords[:, k]
    return pos


def to_padded_rows(values: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, maxes, padding) -> torch.Tensor:
    """``(B, *maxes, *F)``: the rows of ``values`` (T, *F) at their cells, ``padding`` elsewhere."""
    b = offsets.shape[0] - 1
    cells = b
    for m in maxes:
        cells = cells * m
    static = values.shape[1:]
    flat = values.new_full((cells, *static), padding)
    flat = flat.index_copy(0, padded_positions(offsets, sizes, values.shape[0], maxes), values)
    return flat.reshape(b, *maxes, *static)


def from_padded_rows(padded: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, rows) -> torch.Tensor:
    """``(rows, *F)``: the real cells of ``padded`` (B, M_1..M_R, *F) as packed rows."""
    r = sizes.shape[1]
    # flatten, not reshape(-1, …): with a zero-size static dim, -1 is ambiguous
    flat = padded.flatten(0, r)
    return flat.index_select(0, padded_positions(offsets, sizes, rows, padded.shape[1:1 + r]))
