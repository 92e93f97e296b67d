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

__all__ = ["pair_matmul_reference", "pair_matmul_naive"]

# Per-group overhead, in multiply-adds: the gathers, the bmm call and the scatter cost about as
# much as ~0.3 M multiply-adds on the CPUs we measured (see the module NOTE).
_GROUP_COST = 300_000


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


@functools.lru_cache(maxsize=256)
def _plan(lengths: tuple[int, ...], channels: int):
    """``((size, uniform, src, dst), …)`` per group of ``_buckets``: the packed rows of its
    samples (``src``, in order) and their positions in the group's ``(G, size, size)``
    zero-padded block, flattened (``dst``); ``uniform`` when no member needs padding. CPU int64."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n * n)
    plan = []
    for size, samples in _buckets(lengths, channels):
        ns = torch.tensor([lengths[b] for b in samples], dtype=torch.int64)[:, None, None]
        os_ = torch.tensor([offsets[b] for b in samples], dtype=torch.int64)[:, None, None]
        i = torch.arange(size)
        valid = (i[None, :, None] < ns) & (i[None, None, :] < ns)  # (G, s, s)
        src = (os_ + i[None, :, None] * ns + i[None, None, :])[valid]
        dst = torch.arange(len(samples) * size * size).reshape(len(samples), size, size)[valid]
        plan.append((size, len(samples), bool(valid.all()), src, dst))
    return tuple(plan)


def _mm(a: torch.Tensor, b: torch.Tensor, g: int, s: int, ta: bool, tb: bool) -> torch.Tensor:
    """``(G·s·s, C)`` blocks → ``(G·s·s, C)``: per block and channel ``A' @ B'``, one ``bmm`` over
    (block, channel) on contiguous channel-major copies. The transposes are folded into those
    copies, so BLAS reads both operands with unit stride."""
    c = a.shape[-1]
    a = a.view(g, s, s, c).permute(0, 3, 2, 1) if ta else a.view(g, s, s, c).permute(0, 3, 1, 2)
    b = b.view(g, s, s, c).permute(0, 3, 2, 1) if tb else b.view(g, s, s, c).permute(0, 3, 1, 2)
    # .contiguous(), not reshape: for G = 1 the reshape is a strided view, and CPU bmm clones
    # every matrix of a batch whose matrices are not unit-stride in a row or column
    r = torch.bmm(a.contiguous().view(g * c, s, s), b.contiguous().view(g * c, s, s))
    return r.view(g, c, s, s).permute(0, 2, 3, 1).reshape(g * s * s, c)


def pair_matmul_reference(x: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                          tx: bool, ty: bool) -> torch.Tensor:
    """NOTE [ Pair matmul contract ], computed as NOTE [ Bucketed pair matmul ]."""
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"pair_matmul(): expected x and y of one shape (T, C), got {tuple(x.shape)} and {tuple(y.shape)}")
    # SYNC: host lengths plan the groups; on the CPU (this path's device) it is a plain read.
    c = x.shape[1]
    plan = _plan(tuple(lengths.tolist()), c)
    if len(plan) == 1 and plan[0][2] and plan[0][3].numel() == x.shape[0]:
        # one group of equal lengths covering every row in order: no gather at all
        return _mm(x, y, plan[0][1], plan[0][0], tx, ty)
    out = x.new_zeros(x.shape)
    for size, g, uniform, src, dst in plan:
        src = src.to(x.device)
        if uniform:
            out.index_copy_(0, src, _mm(x.index_select(0, src), y.index_select(0, src), g, size, tx, ty))
            continue
        dst = dst.to(x.device)
        a = x.new_zeros(g * size * size, c).index_copy_(0, dst, x.index_select(0, src))
        b = y.new_zeros(g * size * size, c).index_copy_(0, dst, y.index_select(0, src))
        out.index_copy_(0, src, _mm(a, b, g, size, tx, ty).index_select(0, dst))
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
