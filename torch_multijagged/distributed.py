"""Collectives of multi_jagged batches over ``torch.distributed``.

``all_gather`` / ``gather`` / ``broadcast`` / ``scatter`` move whole samples between processes:
every rank may hold a different batch size and different lengths, and the result is an ordinary
multi_jagged tensor rebuilt with ``from_packed`` (samples in rank order, each sample unchanged).

NOTE [ Collectives of a multi_jagged batch ]

A batch crosses processes as three plain tensors, sent one after the other by the same collective:

1. a fixed-length int64 *header*: dtype, batch size B, packed row count T, whether it needs a
   gradient, logical rank, ragged dims and static sizes (a batch is its packed values plus these);
2. its ``(B, R)`` per-sample sizes (``x.sizes()``);
3. its packed values ``(T, *static)`` (``values_of(x)``).

Headers go first because every later buffer is sized from them, and because they let every rank
check the others' dtype, ragged dims and static sizes *before* any buffer of the wrong size is
sent. A rank whose input is unusable still takes part in the header exchange with an *error
header*, then raises; the other ranks read that header and raise too, instead of waiting forever
in the next collective. Dense collectives of gloo need equal sizes on every rank, so sizes and
values are padded with zero rows to the largest B and T and trimmed after; a buffer that is empty
on every rank is not sent at all. bool travels as uint8 and complex as real pairs (gloo has
neither). Offsets are not sent: they are the prefix sum of the products of the sizes.

Gradients: ``torch.distributed``'s collectives are not differentiable. ``all_gather`` is when, on
some rank, grad mode is on and the input requires grad (the ranks agree through the header): the
values then travel through ``torch.distributed.nn.functional.all_gather``, whose backward is itself
a collective — every rank's result requires grad and every rank must run backward through it.
The gradient reaching a rank's input is the sum over ranks of the gradients of their results with
respect to its samples (the gradient of the sum of the per-rank losses). ``gather``, ``broadcast``
and ``scatter`` return tensors that do not require grad.

Each call reads the headers (and sizes) on the host: one device-to-host copy per call on an
accelerator backend (``# SYNC:`` below); ``from_packed`` needs host sizes anyway.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .constructors import from_packed
from .tensor import MultiJaggedTensor, values_of

__all__ = ["all_gather", "gather", "broadcast", "scatter"]

# Header fields (int64): dtype index (-1: the sender's input was unusable), B, T, needs grad,
# logical rank, bit mask of the ragged dims, then the static sizes of values padded with -1.
_DTYPE, _B, _T, _GRAD, _NDIM, _RAGGED, _STATIC = range(7)
_MAX_STATIC = 24
_HEADER_LEN = _STATIC + _MAX_STATIC
_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
)


# ----------------------------------------------------------------------------- headers
class _Unusable(Exception):
    """This rank's input cannot be sent; carries the error to raise after the header exchange."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _header(op: str, x, grad: bool) -> torch.Tensor:
    """``x``'s header on the host, or raise ``_Unusable`` with the user-facing error."""
    if not isinstance(x, MultiJaggedTensor):
        raise _Unusable(TypeError(f"{op}(): expected a multi_jagged tensor, got {type(x).__name__}"))
    if x.dtype not in _DTYPES:
        raise _Unusable(TypeError(f"{op}(): expected one of the dtypes {_DTYPES}, got {x.dtype}"))
    static = x._values.shape[1:]
    if len(static) > _MAX_STATIC or x.dim() > 63:  # the ragged dims are bits of one int64
        raise _Unusable(ValueError(f"{op}(): expected at most {_MAX_STATIC} static dims, got {len(static)}"))
    h = torch.full((_HEADER_LEN,), -1, dtype=torch.int64)
    h[_DTYPE] = _DTYPES.index(x.dtype)
    h[_B] = x._partition.batch
    h[_T] = x._values.shape[0]
    h[_GRAD] = int(grad)
    h[_NDIM] = x.dim()
    h[_RAGGED] = sum(1 << d for d in x.ragged_dims)
    h[_STATIC : _STATIC + len(static)] = torch.tensor(static, dtype=torch.int64)
    return h


def _error_header() -> torch.Tensor:
    h = torch.full((_HEADER_LEN,), -1, dtype=torch.int64)
    h[_B] = h[_T] = h[_GRAD] = 0
    return h


def _schema(h: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...]]:
    """(dtype, ragged dims, static sizes) of a host header."""
    ndim, mask = int(h[_NDIM]), int(h[_RAGGED])
    ragged = tuple(d for d in range(ndim) if mask >> d & 1)
    static = tuple(int(s) for s in h[_STATIC : _STATIC + ndim - 1 - len(ragged)])
    return _DTYPES[int(h[_DTYPE])], ragged, static


def _describe(h: torch.Tensor) -> str:
    dtype, ragged, static = _schema(h)
    return f"dtype={dtype}, ragged_dims={ragged}, static sizes={static}"


def _check_headers(op: str, headers: torch.Tensor, ranks: Sequence[int]) -> None:
    """Raise the same error on every rank if some rank's input was unusable or the ranks' dtype,
    ragged dims or static sizes differ (batch sizes and lengths may differ)."""
    bad = [r for r, h in zip(ranks, headers) if h[_DTYPE] < 0]
    if bad:
        raise ValueError(f"{op}(): the input on rank(s) {bad} was rejected (see the error raised there)")
    first = headers[0]
    keep = torch.ones(_HEADER_LEN, dtype=torch.bool)
    keep[[_B, _T, _GRAD]] = False
    for r, h in zip(ranks, headers):
        if not torch.equal(h[keep], first[keep]):
            raise ValueError(
                f"{op}(): expected the same dtype, ragged dims and static sizes on every rank, got "
                f"rank {ranks[0]}: {_describe(first)} and rank {r}: {_describe(h)}"
            )


def _default_device(group) -> torch.device:
    """Where a rank without an input receives: the CPU for gloo, else the current accelerator
    (as NCCL requires)."""
    if dist.get_backend(group) == dist.Backend.GLOO:
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()
    if acc is None:
        return torch.device("cpu")
    return torch.device(acc.type, torch.accelerator.current_device_index())


def _group_ranks(group) -> list[int]:
    """Global ranks of ``group`` in group-rank order (error messages name global ranks)."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def _exchange_headers(op: str, x, group, grad: bool) -> tuple[torch.Tensor, torch.device]:
    """All ranks' headers ``(W, H)`` on the host, checked; raises this rank's own error (after the
    exchange, so that the others learn of it) if its input was unusable."""
    try:
        header, device, error = _header(op, x, grad), x.device, None
    except _Unusable as u:
        header, device, error = _error_header(), _default_device(group), u.error
    gathered = [torch.empty_like(header, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, header.to(device), group=group)
    if error is not None:
        raise error
    # SYNC: the headers size every later buffer (a no-op copy on gloo).
    headers = torch.stack(gathered).cpu()
    _check_headers(op, headers, _group_ranks(group))
    return headers, device


# ----------------------------------------------------------------------------- buffers
def _to_wire(v: torch.Tensor) -> torch.Tensor:
    """Values as a dtype every backend sends (gloo has no bool or complex)."""
    if v.dtype == torch.bool:
        return v.view(torch.uint8)
    if v.is_complex():
        return torch.view_as_real(v)
    return v


def _from_wire(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return w.view(torch.bool)
    if dtype.is_complex:
        return torch.view_as_complex(w.contiguous())
    return w


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` (differentiable), contiguous for the wire."""
    if t.shape[0] == rows:
        return t.contiguous()
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


def _all_gather_rows(t: torch.Tensor, counts: list[int], rank: int, group, grad: bool) -> list[torch.Tensor]:
    """Every rank's ``t`` (``counts[r]`` rows on rank r), gathered: pad to the largest, trim."""
    rows = max(counts, default=0)
    if rows * math.prod(t.shape[1:]) == 0:
        # Nothing to send on any rank: this rank's own piece keeps its autograd history.
        return [t if r == rank else t.new_zeros((c, *t.shape[1:])) for r, c in enumerate(counts)]
    padded = _pad_rows(t, rows)
    if grad:
        from torch.distributed.nn.functional import all_gather as differentiable_all_gather

        if not padded.requires_grad:
            # Another rank needs the gradient: this rank must take part in backward's collective
            # too, which it does only if its result is part of the graph.
            padded = padded.detach().requires_grad_()
        pieces = differentiable_all_gather(padded, group=group)
    else:
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded, group=group)
    return [p[:c] for p, c in zip(pieces, counts)]


def _offsets(sizes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """(B+1,) row offsets of host ``sizes`` (B, R): the prefix sum of each sample's row count."""
    off = torch.zeros(sizes.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(sizes.prod(1), 0, out=off[1:])
    return off.to(device)


def _build(values: torch.Tensor, sizes: torch.Tensor, header: torch.Tensor) -> MultiJaggedTensor:
    dtype, ragged, _ = _schema(header)
    return from_packed(_from_wire(values, dtype), _offsets(sizes, values.device), sizes, ragged)


def _needs_grad(x) -> bool:
    return torch.is_grad_enabled() and isinstance(x, MultiJaggedTensor) and x.requires_grad


# ----------------------------------------------------------------------------- collectives
def all_gather(x: MultiJaggedTensor, group: Optional[dist.ProcessGroup] = None) -> MultiJaggedTensor:
    """Every rank's samples, on every rank: ``(ΣB_r, j…, …)`` holding rank 0's samples, then
    rank 1's, … (``unbind()`` of the result is the concatenation of the ranks' ``unbind()``).

    Batch sizes (0 included) and lengths may differ per rank; dtype, ragged dims and static sizes
    must agree (else every rank raises ``ValueError``). Differentiable when some rank's input
    requires grad: then backward is a collective every rank must run (NOTE [ Collectives of a
    multi_jagged batch ]). Extents that are equal per sample share one nested int, as in
    ``from_packed``."""
    op = "all_gather"
    headers, device = _exchange_headers(op, x, group, _needs_grad(x))
    grad = bool(headers[:, _GRAD].any())
    rank = dist.get_rank(group)
    bs, ts = headers[:, _B].tolist(), headers[:, _T].tolist()
    gathered = _all_gather_rows(x.sizes().to(device), bs, rank, group, grad=False)
    # SYNC: from_packed needs the gathered sizes on the host (a no-op copy on gloo).
    sizes = torch.cat(gathered).cpu()
    values = values_of(x) if grad else values_of(x).detach()
    pieces = _all_gather_rows(_to_wire(values), ts, rank, group, grad)
    return _build(torch.cat(pieces), sizes, headers[0])


def gather(x: MultiJaggedTensor, dst: int = 0, group: Optional[dist.ProcessGroup] = None) -> Optional[MultiJaggedTensor]:
    """``all_gather(x)`` delivered to global rank ``dst`` only; other ranks get ``None``. Not
    differentiable (the result does not require grad)."""
    op = "gather"
    headers, device = _exchange_headers(op, x, group, False)
    here = dist.get_rank() == dst
    out: list[torch.Tensor] = []  # on dst
    for t, per_rank in ((x.sizes().to(device), headers[:, _B]), (_to_wire(values_of(x).detach()), headers[:, _T])):
        counts: list[int] = per_rank.tolist()
        rows = max(counts, default=0)
        if rows * math.prod(t.shape[1:]) == 0:
            out.append(t.new_zeros((sum(counts), *t.shape[1:])))
            continue
        padded = _pad_rows(t, rows)
        pieces = [torch.empty_like(padded) for _ in counts] if here else None
        dist.gather(padded, pieces, dst=dst, group=group)
        if pieces is not None:
            out.append(torch.cat([p[:c] for p, c in zip(pieces, counts)]))
    if not here:
        return None
    # SYNC: from_packed needs the sizes on the host (a no-op copy on gloo).
    return _build(out[1], out[0].cpu(), headers[0])


def _source_header(op: str, x, src: int, group, device, n_extra: int = 0, extra=None, error=None):
    """Broadcast the source's header, followed by ``n_extra`` int64 fields (``extra`` on the
    source), from ``src``; returns (header, extra, device) on every rank, or raises on every rank
    if the source's input was unusable (``error``, or a failed header)."""
    if dist.get_rank() == src:
        try:
            if error is not None:
                raise _Unusable(error)
            header, device = _header(op, x, False), x.device
        except _Unusable as u:
            header, device, error = _error_header(), device or _default_device(group), u.error
            extra = None
        buf = torch.cat([header, extra if extra is not None else torch.zeros(n_extra, dtype=torch.int64)])
    else:
        device = device or _default_device(group)
        buf = torch.empty(_HEADER_LEN + n_extra, dtype=torch.int64)
    buf = buf.to(device)
    dist.broadcast(buf, src, group=group)
    if error is not None:
        raise error
    # SYNC: the header sizes the buffers that follow (a no-op copy on gloo).
    buf = buf.cpu()
    if buf[_DTYPE] < 0:
        raise ValueError(f"{op}(): the input on the source rank {src} was rejected (see the error raised there)")
    return buf[:_HEADER_LEN], buf[_HEADER_LEN:], device


def _empty_like_header(h: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Receive buffers (sizes (B, R), wire values (T, *static)) for the batch of header ``h``."""
    dtype, ragged, static = _schema(h)
    sizes = torch.empty((int(h[_B]), len(ragged)), dtype=torch.int64, device=device)
    values = _to_wire(torch.empty((int(h[_T]), *static), dtype=dtype, device=device))
    return sizes, values


def broadcast(
    x: Optional[MultiJaggedTensor],
    src: int = 0,
    group: Optional[dist.ProcessGroup] = None,
    *,
    device: Optional[torch.device] = None,
) -> MultiJaggedTensor:
    """The batch ``x`` of global rank ``src``, on every rank. ``x`` is ignored elsewhere (pass
    ``None``); receivers allocate on ``device`` (default: the CPU for gloo, the current
    accelerator otherwise). ``src`` gets ``x`` itself back. Not differentiable."""
    op = "broadcast"
    header, _, device = _source_header(op, x, src, group, device)
    if dist.get_rank() == src:
        assert x is not None  # else _source_header raised on every rank
        for t in (x.sizes().to(device), _to_wire(values_of(x).detach()).contiguous()):
            if t.numel():
                dist.broadcast(t, src, group=group)
        return x
    sizes, values = _empty_like_header(header, device)
    for t in (sizes, values):
        if t.numel():
            dist.broadcast(t, src, group=group)
    # SYNC: from_packed needs the sizes on the host (a no-op copy on gloo).
    return _build(values, sizes.cpu(), header)


def _split_counts(op: str, b: int, world: int, split_sizes) -> list[int]:
    if split_sizes is None:
        # As ``torch.tensor_split``: the first ``b % world`` ranks get one sample more.
        return [b // world + (r < b % world) for r in range(world)]
    counts = list(split_sizes)
    if len(counts) != world or any(not isinstance(c, int) or c < 0 for c in counts) or sum(counts) != b:
        raise ValueError(
            f"{op}(): expected split_sizes to be {world} non-negative ints summing to the batch size {b}, got {split_sizes}"
        )
    return counts


def scatter(
    x: Optional[MultiJaggedTensor],
    src: int = 0,
    group: Optional[dist.ProcessGroup] = None,
    *,
    split_sizes: Optional[Sequence[int]] = None,
    device: Optional[torch.device] = None,
) -> MultiJaggedTensor:
    """Consecutive samples of global rank ``src``'s batch ``x`` to each rank: rank r (in group
    order) gets ``split_sizes[r]`` samples (default: as even as ``torch.tensor_split``, the first
    ranks one more). ``x`` is ignored on other ranks (pass ``None``); receivers allocate on
    ``device`` (default as ``broadcast``). Not differentiable."""
    op = "scatter"
    world = dist.get_world_size(group)
    here = dist.get_rank() == src
    extra = error = None
    if here and isinstance(x, MultiJaggedTensor):
        try:
            bs = _split_counts(op, x._partition.batch, world, split_sizes)
        except ValueError as e:
            error = e
        else:
            # Each rank's row count from the host sizes, without reading the device offsets.
            row_counts = [int(r.sum()) for r in x.sizes().prod(1).split(bs)]
            extra = torch.tensor([bs, row_counts], dtype=torch.int64).T.flatten()
    header, table, device = _source_header(op, x, src, group, device, 2 * world, extra, error)
    counts = table.view(world, 2)
    empty = header.clone()
    empty[_B] = empty[_T] = 0
    sizes, values = _empty_like_header(empty, device)
    mine = dist.get_rank(group)
    out = []
    full = (x.sizes(), _to_wire(values_of(x).detach())) if here and x is not None else (None, None)
    per_rank: list[list[int]] = counts.T.tolist()
    for buf, n, whole in zip((sizes, values), per_rank, full):
        rows = max(n, default=0)
        piece = buf.new_empty((rows, *buf.shape[1:]))
        if piece.numel():
            parts = [_pad_rows(p.to(device), rows) for p in whole.split(n)] if whole is not None else None
            dist.scatter(piece, parts, src=src, group=group)
        out.append(piece[: n[mine]])
    # SYNC: from_packed needs the sizes on the host (a no-op copy on gloo).
    return _build(out[1], out[0].cpu(), header)
