"""Per-sample matrix products of square ragged pairs, channels batched: the contraction behind
the triangle multiplicative update (pure torch; the Triton twin is ``pair_mm_triton.py``).

NOTE [ Pair matmul contract ]

A square pair ``(B, j0, j0, *S)`` stores sample b's ``n_b × n_b`` cells as ``n_b²`` consecutive
packed rows ``offsets[b] … offsets[b+1]`` (row-major over the two ragged dims), each row holding
the ``C = ΠS`` channels. ``pair_matmul(x, y, offsets, lengths, tx, ty)`` computes, for every
sample and channel, the matrix product ``X' @ Y'`` with ``X' = Xᵀ if tx else X`` (``Y'`` alike):

    out[b][i, j, c] = Σ_k X'[b][i, k, c] · Y'[b][k, j, c]

``x``, ``y`` and the result are ``(T, C)`` with ``T = Σ n_b²``. The triangle update "outgoing"
(``Σ_k a_ik b_jk``) is ``(tx, ty) = (False, True)`` and "incoming" (``Σ_k a_ki b_kj``) is
``(True, False)``; their gradients are products of the same kind (``compile/pair_mm.py``).

NOTE [ Bucketed pair matmul ]

On the CPU the fastest exact formulation we measured (docs/design.md, "Triangle
multiplication") is a handful of batched matmuls over *length buckets*: samples are sorted by
``n``, split into consecutive groups (``_buckets``), and each group is padded with zeros to its
own largest ``n`` only — zero rows and columns contribute nothing to a product, so the result is
exact — and multiplied with one ``bmm`` over (samples × channels). The split minimises a cost
model, ``Σ_groups (members · n_max³ · C + overhead)``: one group is the padded envelope (no
per-call overhead, ``B·N_max³`` work); one group per distinct length is exact work but a
call per length. Groups whose members all have one length need no padding, just a gather.
The plan depends on the host lengths only, and is cached per ``(lengths, C)``.
"""

from __future__ import annotations

import functools

import torch

from .reference import built_outside_inference_mode

__all__ = ["pair_matmul_reference", "pair_matmul_naive"]

# Per-group overhead, in multiply-adds: the gathers, the bmm call and the scatter cost about as
# much as ~0.3 M multiply-adds on the CPUs we measured (see the module NOTE).
_GROUP_COST = 300_000
# A group whose members form at most this many runs of consecutive samples of one length is
# read and written through strided views of those runs (no index) when ``_runs_cheaper``; else
# gathered. Costs in ns, measured on the CPUs we use (one thread): a strided copy moves an
# element in ~0.56 ns and each run costs three of them (two operands, the write-back) plus ~12 µs
# of calls; a gather reads the padded blocks with two ``index_select``s and two masks and writes
# back with ``index_copy_`` (~2× a plain copy per element): ~3 ns per padded element.
_MAX_RUNS = 8
_RUN_NS = 12_000
_RUN_ELEMENT_NS = 1.7
_GATHER_ELEMENT_NS = 3.0


def _runs_cheaper(runs, members: int, size: int, channels: int) -> bool:
    real = sum(m * n * n for _, m, _, n in runs) * channels
    return len(runs) * _RUN_NS + real * _RUN_ELEMENT_NS <= members * size * size * channels * _GATHER_ELEMENT_NS


@functools.lru_cache(maxsize=256)
def _buckets(lengths: tuple[int, ...], channels: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``((n_max, samples), …)``: a split of the non-empty samples into groups padded to their
    ``n_max``, minimising the cost model of NOTE [ Bucketed pair matmul ] (an O(G²) dynamic
    programme over the G distinct lengths)."""
    order = sorted((n, b) for b, n in enumerate(lengths) if n > 0)
    if not order:
        return ()
    distinct = sorted({n for n, _ in order})
    count = [sum(1 for n, _ in order if n == d) for d in distinct]
    g = len(distinct)
    best = [0.0] + [float("inf")] * g  # best[e]: cost of the first e distinct lengths
    cut = [0] * (g + 1)
    for e in range(1, g + 1):
        members = 0
        for s in range(e - 1, -1, -1):  # group = distinct[s:e], padded to distinct[e-1]
            members += count[s]
            c = best[s] + members * distinct[e - 1] ** 3 * channels + _GROUP_COST
            if c < best[e]:
                best[e], cut[e] = c, s
    groups = []
    e = g
    while e > 0:
        s = cut[e]
        lo, hi = distinct[s], distinct[e - 1]
        groups.append((hi, tuple(b for n, b in order if lo <= n <= hi)))
        e = s
    return tuple(reversed(groups))


@functools.lru_cache(maxsize=8)
@built_outside_inference_mode
def _plan(lengths: tuple[int, ...], channels: int):
    """One entry per group of ``_buckets``' split:

    * ``("runs", size, ((first row, samples, n), …), padded)`` — the members form at most
      ``_MAX_RUNS`` runs of consecutive samples of one length ``n`` each: each run's rows are one
      contiguous slice, read into the ``(m, C, n, n)`` corner of its zero-padded blocks and
      written back through strided views (no index); ``padded``: some run is shorter than
      ``size``, so the blocks start as zeros;
    * ``("gather", size, idx, idx_t, pad, pad_t, dst, pos)`` — ``idx``/``idx_t`` (flat indices into
      the ``(T, C)`` values, transposed blocks for ``idx_t``) gather the group's channel-major
      zero-padded ``(g·C, size, size)`` blocks, ``pad``/``pad_t`` mark their padded cells (None
      when no member is padded), and ``out.view(-1)[dst] = result.view(-1)[pos]`` writes the
      valid results back (``pos`` None: every result element is valid).

    CPU int64/bool tensors of about the result's size: few plans are kept."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n * n)
    c = channels
    plan = []
    ch = torch.arange(c, device="cpu")[None, :, None, None]  # CPU whatever the default device
    for size, samples in _buckets(lengths, channels):
        runs = []  # [first row, samples, last sample, n] of each run of consecutive samples of one length
        for b in samples:
            if runs and runs[-1][2] == b - 1 and runs[-1][3] == lengths[b]:
                runs[-1][1] += 1
                runs[-1][2] = b
            else:
                runs.append([offsets[b], 1, b, lengths[b]])
            if len(runs) > _MAX_RUNS:
                break
        if len(runs) <= _MAX_RUNS and _runs_cheaper(runs, len(samples), size, c):
            plan.append(("runs", size, tuple((r, m, n) for r, m, _, n in runs), any(n < size for *_, n in runs)))
            continue
        ns = torch.tensor([lengths[b] for b in samples], dtype=torch.int64, device="cpu")[:, None, None]
        os_ = torch.tensor([offsets[b] for b in samples], dtype=torch.int64, device="cpu")[:, None, None]
        i = torch.arange(size, device="cpu")
        valid = (i[None, :, None] < ns) & (i[None, None, :] < ns)  # (g, s, s)
        rows = torch.where(valid, os_ + i[None, :, None] * ns + i[None, None, :], 0)
        idx = (rows[:, None] * c + ch).reshape(-1)
        idx_t = (rows.transpose(1, 2)[:, None] * c + ch).reshape(-1)
        if bool(valid.all()):
            plan.append(("gather", size, idx, idx_t, None, None, idx, None))
            continue
        keep = valid[:, None].expand(-1, c, -1, -1)
        pad = ~keep.reshape(-1)
        pad_t = ~keep.transpose(2, 3).reshape(-1)
        pos = torch.arange(keep.numel(), device="cpu")[keep.reshape(-1)]
        plan.append(("gather", size, idx, idx_t, pad, pad_t, idx[keep.reshape(-1)], pos))
    return tuple(plan)


def _block(x: torch.Tensor, entry, transpose: bool) -> torch.Tensor:
    """The ``(g·C, s, s)`` channel-major zero-padded blocks of ``x`` for one group."""
    c = x.shape[1]
    if entry[0] == "runs":
        _, size, runs, padded = entry
        out = (x.new_zeros if padded else x.new_empty)(sum(m for _, m, _ in runs), c, size, size)
        k = 0
        for r, m, n in runs:
            p = x[r:r + m * n * n].view(m, n, n, c)
            out[k:k + m, :, :n, :n].copy_(p.permute(0, 3, 2, 1) if transpose else p.permute(0, 3, 1, 2))
            k += m
        return out.view(-1, size, size)
    _, size, idx, idx_t, pad, pad_t, _, _ = entry
    out = x.reshape(-1).index_select(0, (idx_t if transpose else idx).to(x.device))
    if pad is not None:
        out.masked_fill_((pad_t if transpose else pad).to(x.device), 0)
    return out.view(-1, size, size)


def pair_matmul_reference(x: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                          tx: bool, ty: bool) -> torch.Tensor:
    """NOTE [ Pair matmul contract ], computed as NOTE [ Bucketed pair matmul ]: per group one
    copy per operand into channel-major padded blocks (a gather, or strided copies of a few runs),
    one ``bmm``, one write-back."""
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"pair_matmul(): expected x and y of one shape (T, C), got {tuple(x.shape)} and {tuple(y.shape)}")
    x, y = x.contiguous(), y.contiguous()
    c = x.shape[1]
    # SYNC: host lengths plan the groups; on the CPU (this path's device) it is a plain read.
    plan = _plan(tuple(lengths.tolist()), c)
    out = x.new_empty(x.shape)  # every row belongs to exactly one group
    flat = out.view(-1)
    for entry in plan:
        r = torch.bmm(_block(x, entry, tx), _block(y, entry, ty))
        if entry[0] == "runs":
            _, size, runs, _ = entry
            r = r.view(-1, c, size, size)
            k = 0
            for row, m, n in runs:
                out[row:row + m * n * n].view(m, n, n, c).copy_(r[k:k + m, :, :n, :n].permute(0, 2, 3, 1))
                k += m
            continue
        dst, pos = entry[6].to(x.device), entry[7]
        flat.index_copy_(0, dst, r.view(-1) if pos is None else r.view(-1).index_select(0, pos.to(x.device)))
    return out


def pair_matmul_naive(x: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                      tx: bool, ty: bool) -> torch.Tensor:
    """The contract as a per-sample loop: the oracle of the tests, never a hot path."""
    out = torch.zeros_like(x)
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            continue
        s = int(offsets[b])
        a = x[s:s + n * n].view(n, n, -1)
        bb = y[s:s + n * n].view(n, n, -1)
        a = a.transpose(0, 1) if tx else a
        bb = bb.transpose(0, 1) if ty else bb
        out[s:s + n * n] = torch.einsum("ikc,kjc->ijc", a, bb).reshape(n * n, -1)
    return out
