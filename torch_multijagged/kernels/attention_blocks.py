"""The ``blocks`` CPU backend of varlen attention (NOTE [ Attention by blocks of equal segments ]):
one dense call per run of equal consecutive segments, on views of the packed buffers. Same
contract as ``kernels/attention.py`` (NOTE [ Varlen attention contract ]), which re-exports it;
built on ``attention_common.py`` and, for dropout, ``attention_bucketed.py``."""

from __future__ import annotations

from typing import Optional

import torch

from .attention_bucketed import attention_bucketed, attention_bucketed_backward
from .attention_common import (
    NEG_INF, _compute_dtype, _dense_forward, _flash_fwd, _flash_ok, _grad_buffers, _expand_heads, _host_lengths,
    _reduce_heads, _scale, _unfused_ok, _unit_last,
)

__all__ = ["attention_blocks", "attention_blocks_backward", "block_runs"]


# ----------------------------------------------------------------------------- blocks
# NOTE [ Attention by blocks of equal segments ]
#
# When consecutive segments have equal (Lq, Lk) and read one bias block — the rows of a pair
# attending along their columns (triangle attention: a sample's n rows are n segments of n keys
# sharing the sample's bias) — their packed rows are one contiguous ``(m, L, H, D)`` block.
# ``attention_blocks`` runs one dense call per such run on views of the packed buffers (no
# gather, no padding), with the bias as a ``(1, H, Lq, Lk)`` view broadcast over the run (never
# copied per segment), and its gradient summed over the run. It is what a per-sample loop of
# dense attention does, with one call per run of equal segments instead of per sample. Dropout
# goes to ``attention_bucketed`` (the dispatcher never picks this path for it).


# NOTE [ Keeping the probabilities ]
#
# The ``blocks`` backward recomputes each run's probabilities from ``lse``, as torch's fused
# kernel does: one product ``q·kᵀ`` and an ``exp`` pass per score entry more than a backward that
# reads them. Dense SDPA's math path — the one a per-sample loop takes when the mask needs a
# gradient, as triangle attention's pair bias does — keeps each sample's probabilities instead.
# Given a list ``probs``, ``attention_blocks`` does the same: each run's scores go through one
# ``softmax`` (the fused forward's online softmax is no faster at these lengths) and the run's
# ``(m, H, Lq, Lk)`` probabilities are appended to ``probs``; ``attention_blocks_backward`` given
# that list reads them. Triangle attention (4 heads × 8, runs of 40–48 rows, 2 threads): the
# backward 12 → 6.7 ms, the forward unchanged. The autograd formula of the eager values path
# decides (``keeps_probs`` in compile/attention.py): with a bias that needs a gradient, as the
# dense op, and up to ``KEEP_PROBS_MAX`` entries, beyond which recomputing bounds the memory.


# score entries the backward keeps live at once (512 KB in float32: the scores, probabilities and
# their gradient of one chunk stay in a core's L2 cache); measured on 1 thread, runs of 40–64
_BLOCKS_CHUNK = 1 << 17


def block_runs(cu_q: torch.Tensor, cu_k: torch.Tensor, bias_start: Optional[torch.Tensor] = None):
    """``[(first segment, segments, Lq, Lk), …]``: maximal runs of consecutive segments with equal
    lengths (and one ``bias_start``), skipping segments without queries or keys. Host ints."""
    lq, lk = _host_lengths(cu_q), _host_lengths(cu_k)
    n = lq.shape[0]
    if n == 0:
        return []
    key = torch.stack([lq, lk] + ([bias_start.cpu()] if bias_start is not None else []), 1)
    start = torch.ones(n, dtype=torch.bool)
    start[1:] = (key[1:] != key[:-1]).any(1)
    firsts = start.nonzero().flatten().tolist()
    ends = firsts[1:] + [n]
    lq_l, lk_l = lq.tolist(), lk.tolist()
    return [(a, b - a, lq_l[a], lk_l[a]) for a, b in zip(firsts, ends) if lq_l[a] > 0 and lk_l[a] > 0]


def _run_views(x, row0, m, length):
    """Rows ``row0 … row0 + m·length`` of a packed ``(T, H, D)`` buffer as ``(m, H, length, D)``."""
    return x[row0: row0 + m * length].view(m, length, *x.shape[1:]).transpose(1, 2)


def _run_bias(bias, start, lq, lk):
    return bias[start: start + lq * lk].view(lq, lk, bias.shape[1]).permute(2, 0, 1).unsqueeze(0)


def _outputs(q, v, runs, need_lse):
    """``(out, lse)`` buffers for ``runs``: every query row is written when each segment with
    queries has keys, and they need no fill then (``lse`` is left unwritten altogether when no
    backward will read it)."""
    hq = q.shape[1]
    covered = sum(m * lq for _, m, lq, _ in runs) == q.shape[0]
    out = q.new_empty(q.shape[0], hq, v.shape[-1]) if covered else q.new_zeros(q.shape[0], hq, v.shape[-1])
    ct = _compute_dtype(q.dtype)
    if covered or not need_lse:
        return out, torch.empty((q.shape[0], hq), dtype=ct, device=q.device)
    return out, torch.full((q.shape[0], hq), NEG_INF, dtype=ct, device=q.device)


def attention_blocks(q, k, v, cu_q, cu_k, bias=None, bias_start=None, keep=None, causal=False,
                     scale=None, dropout_p=0.0, *, need_lse=True, probs: Optional[list] = None):
    """NOTE [ Attention by blocks of equal segments ]; with dropout, ``attention_bucketed``.
    ``probs``: a list receiving each run's probabilities (NOTE [ Keeping the probabilities ])."""
    if probs is not None:
        if keep is not None:
            raise ValueError("attention_blocks(): probabilities are kept without dropout only")
        return _blocks_keeping(q, k, v, cu_q, cu_k, bias, bias_start, causal, _scale(q, scale), need_lse, probs)
    if keep is not None:
        return attention_bucketed(q, k, v, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p,
                                  need_lse=need_lse)
    scale = _scale(q, scale)
    hq = q.shape[1]
    runs = block_runs(cu_q, cu_k, bias_start)
    cq, ck = cu_q.tolist(), cu_k.tolist()  # SYNC: none (CPU path: host tensors)
    bs = bias_start.tolist() if bias_start is not None else None
    out, lse = _outputs(q, v, runs, need_lse)
    fused = bias is None and _flash_ok(q, v, None, False)
    if fused:  # the fused kernel reads the last dim as contiguous (``_unit_last``)
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    gqa = k.shape[1] != hq
    for s0, m, lq, lk in runs:
        r0, r1, k0 = cq[s0], cq[s0] + m * lq, ck[s0]
        qb = q[r0:r1].view(m, lq, hq, -1).transpose(1, 2)
        kb = k[k0: k0 + m * lk].view(m, lk, *k.shape[1:]).transpose(1, 2)
        vb = v[k0: k0 + m * lk].view(m, lk, *v.shape[1:]).transpose(1, 2)
        if gqa:
            kb, vb = _expand_heads(kb, hq), _expand_heads(vb, hq)
        if fused and not _unfused_ok(qb, kb, None, None, need_lse):
            # the per-sample loop's own call, with as little Python around it (B calls)
            ob, lb = _flash_fwd(qb, kb, vb, 0.0, causal, scale=scale)
        else:
            bias_b = None if bias is None else _run_bias(bias, bs[s0], lq, lk).to(q.dtype)
            ob, lb = _dense_forward(qb, kb, vb, bias_b, None, causal, scale, 0.0, need_lse=need_lse)
        out[r0:r1] = ob.transpose(1, 2).reshape(m * lq, hq, -1)
        if need_lse:
            lse[r0:r1] = lb.transpose(1, 2).reshape(m * lq, hq)
    return out, lse


def _blocks_keeping(q, k, v, cu_q, cu_k, bias, bias_start, causal, scale, need_lse, probs):
    """``attention_blocks`` appending each run's probabilities to ``probs`` (in the compute dtype)."""
    hq = q.shape[1]
    ct = _compute_dtype(q.dtype)
    runs = block_runs(cu_q, cu_k, bias_start)
    cq, ck = cu_q.tolist(), cu_k.tolist()  # SYNC: none (CPU path: host tensors)
    bs = bias_start.tolist() if bias_start is not None else None
    out, lse = _outputs(q, v, runs, need_lse)
    # every run of a bias without -inf has a visible key in each row: a plain softmax then
    safe = bias is not None and bool(torch.isneginf(bias).any())
    for s0, m, lq, lk in runs:
        r0, r1, k0 = cq[s0], cq[s0] + m * lq, ck[s0]
        qb = _run_views(q, r0, m, lq).to(ct)
        kb = _expand_heads(_run_views(k, k0, m, lk), hq).to(ct)
        vb = _expand_heads(_run_views(v, k0, m, lk), hq).to(ct)
        s = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
        if bias is not None:
            s.add_(_run_bias(bias, bs[s0], lq, lk).to(q.dtype).to(ct))
        if causal:
            s.masked_fill_(torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1), NEG_INF)
        if need_lse:
            lse[r0:r1] = torch.logsumexp(s, -1).transpose(1, 2).reshape(m * lq, hq)
        p = torch.ops.aten._safe_softmax(s, -1) if safe else torch.softmax(s, -1)
        out[r0:r1] = torch.matmul(p, vb).transpose(1, 2).reshape(m * lq, hq, -1).to(q.dtype)
        probs.append(p)
    return out, lse


def _run_rows(x, row0, m, length, dtype):
    """Rows ``row0 … row0 + m·length`` of a packed ``(T, H, D)`` buffer as a contiguous
    ``(m, H, length, D)`` copy in ``dtype``: each operand feeds several products, and a permuted
    view would be copied by every ``matmul`` that reads it."""
    return _run_views(x, row0, m, length).to(dtype).contiguous()


def attention_blocks_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias=None, bias_start=None, keep=None,
                              causal=False, scale=None, dropout_p=0.0, need_dbias=False, *,
                              probs: Optional[list] = None):
    """``probs``: the runs' probabilities that ``attention_blocks`` kept (NOTE [ Keeping the
    probabilities ]), read instead of recomputed.

    ``_math_backward``'s formula (the bias gradient rules out the fused kernel), recomputing the
    probabilities from ``lse``, written for the CPU's cache and BLAS: a run goes ``_BLOCKS_CHUNK``
    score entries at a time (its scores stay in cache across the in-place elementwise passes);
    the products with a head-size output (``dq``, ``dk``, ``dv``) are computed transposed
    (``kᵀ·dsᵀ`` …), BLAS being several times faster writing ``(D, L)`` than ``(L, D)`` for a
    small ``D``; a row with no visible key (``lse`` -inf, or the fused kernel's 0) takes ``lse``
    as +inf so that its all -inf scores give ``exp = 0`` without a ``where`` over the scores."""
    if keep is not None:
        return attention_bucketed_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias, bias_start, keep, causal,
                                           scale, dropout_p, need_dbias)
    scale = _scale(q, scale)
    hq, hk = q.shape[1], k.shape[1]
    ct = _compute_dtype(q.dtype)
    dq, dk, dv, dbias = _grad_buffers(q, k, v, bias, need_dbias)
    runs = block_runs(cu_q, cu_k, bias_start)
    cq, ck = cu_q.tolist(), cu_k.tolist()  # SYNC: none (CPU path: host tensors)
    bs = bias_start.tolist() if bias_start is not None else None
    lse_c = None if probs is not None else torch.where(torch.isneginf(lse), float("inf"), lse.to(ct))
    delta_all = (grad.to(ct) * out.to(ct)).sum(-1)  # (Tq, Hq): rowsum(dout · out) = rowsum(p · dp)
    if probs is not None and len(probs) != len(runs):
        raise ValueError(f"attention_blocks_backward(): {len(probs)} kept probabilities for {len(runs)} runs")
    for i, (s0, m_run, lq, lk) in enumerate(runs):
        kept = None if probs is None else probs[i]
        # the bias block as _scores reads it (q's dtype, then the compute dtype), made contiguous
        # once per run: adding a permuted view costs several times a contiguous add
        bias_b = None if bias is None or kept is not None else (
            _run_bias(bias, bs[s0], lq, lk).to(q.dtype).to(ct).contiguous())
        dacc = torch.zeros(hq, lq, lk, dtype=ct, device=q.device) if need_dbias else None
        hide = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1) if causal and kept is None else None
        qr, gr = _run_rows(q, cq[s0], m_run, lq, ct), _run_rows(grad, cq[s0], m_run, lq, ct)
        kr = _expand_heads(_run_rows(k, ck[s0], m_run, lk, ct), hq)
        vr = _expand_heads(_run_rows(v, ck[s0], m_run, lk, ct), hq)
        # kept probabilities come from memory anyway: a run in one piece then
        step = m_run if kept is not None else max(1, _BLOCKS_CHUNK // (hq * lq * lk))
        for c0 in range(0, m_run, step):
            m = min(step, m_run - c0)
            rq, rk = cq[s0] + c0 * lq, ck[s0] + c0 * lk
            qb, gb, kb, vb = qr[c0: c0 + m], gr[c0: c0 + m], kr[c0: c0 + m], vr[c0: c0 + m]
            delta = delta_all[rq: rq + m * lq].view(m, lq, hq).transpose(1, 2).unsqueeze(-1)
            if kept is not None:
                p = kept[c0: c0 + m]
            else:
                s = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
                if bias_b is not None:
                    s.add_(bias_b)
                if hide is not None:
                    s.masked_fill_(hide, NEG_INF)
                p = s.sub_(lse_c[rq: rq + m * lq].view(m, lq, hq).transpose(1, 2).unsqueeze(-1)).exp_()
            dvT = torch.matmul(gb.transpose(-1, -2), p)  # (m, H, Dv, Lk)
            dp = torch.matmul(gb, vb.transpose(-1, -2))
            ds = dp.sub_(delta).mul_(p)
            dqT = torch.matmul(kb.transpose(-1, -2), ds.transpose(-1, -2)).mul_(scale)  # (m, H, D, Lq)
            dkT = torch.matmul(qb.transpose(-1, -2), ds).mul_(scale)  # (m, H, D, Lk)
            dq[rq: rq + m * lq].view(m, lq, hq, -1).copy_(dqT.permute(0, 3, 1, 2))
            dk[rk: rk + m * lk].view(m, lk, hk, -1).copy_(_reduce_heads(dkT, hk).permute(0, 3, 1, 2))
            dv[rk: rk + m * lk].view(m, lk, hk, -1).copy_(_reduce_heads(dvT, hk).permute(0, 3, 1, 2))
            if dacc is not None:
                dacc += ds.sum(0)  # (Hq, Lq, Lk): the run shares one bias block
        if dacc is not None:
            d = dacc.sum(0, keepdim=True) if bias.shape[1] == 1 else dacc
            dbias[bs[s0]: bs[s0] + lq * lk].view(lq, lk, -1).add_(d.permute(1, 2, 0))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None if dbias is None else dbias.to(bias.dtype)
