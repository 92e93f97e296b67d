"""What the CPU backends of varlen attention share (NOTE [ Varlen attention contract ],
``kernels/attention.py``): the score layout, the padded math formula and torch's fused CPU kernel
on one padded batch, the head and scale helpers, the host lengths and the gradient buffers.

The bottom of the attention kernels: imports none of them. ``attention_bucketed.py`` (the
bucketed and loop paths) and ``attention_blocks.py`` (the blocks path) build on it, and
``attention.py`` re-exports it."""

from __future__ import annotations

import math

import torch

__all__ = ["score_offsets"]

_flash_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
NEG_INF = float("-inf")


def score_offsets(cu_q: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
    """``(N+1,)`` exclusive prefix sum of ``Lq_s · Lk_s``: where each segment's score block starts."""
    n = cu_q.diff() * cu_k.diff()
    out = n.new_zeros(n.shape[0] + 1)
    torch.cumsum(n, 0, out=out[1:])
    return out


# ----------------------------------------------------------------------------- padded math
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scores(qb, kb, bias_b, causal, scale):
    """Masked scores ``(n, Hq, Lm, Sm)`` in the compute dtype; ``bias_b`` holds -inf at padded keys."""
    ct = _compute_dtype(qb.dtype)
    s = torch.matmul(qb.to(ct), kb.to(ct).transpose(-1, -2)) * scale
    if bias_b is not None:
        s = s + bias_b.to(ct)
    if causal:
        lm, sm = s.shape[-2], s.shape[-1]
        hide = torch.ones(lm, sm, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hide, NEG_INF)
    return s


def _probs(s, lse):
    p = torch.exp(s - lse.unsqueeze(-1))
    # rows with no visible key: lse = -inf and s - lse = nan; they get no probability mass
    return torch.where(torch.isneginf(lse).unsqueeze(-1), torch.zeros((), dtype=p.dtype), p)


def _kept(x, keep_b, dropout_p):
    """``x`` at kept entries, scaled by ``1 / (1 - p)``; p = 1 drops everything (zeros, as
    ``F.dropout``) rather than computing ``0 / 0``."""
    return x * keep_b * (1.0 / (1.0 - dropout_p) if dropout_p < 1 else 0.0)


def _math_forward(qb, kb, vb, bias_b, keep_b, causal, scale, dropout_p):
    s = _scores(qb, kb, bias_b, causal, scale)
    lse = torch.logsumexp(s, -1)
    p = _probs(s, lse)
    if keep_b is not None:
        p = _kept(p, keep_b, dropout_p)
    out = torch.matmul(p, vb.to(p.dtype)).to(qb.dtype)
    return out, lse


def _math_backward(go, qb, kb, vb, ob, lse, bias_b, keep_b, causal, scale, dropout_p):
    ct = _compute_dtype(qb.dtype)
    s = _scores(qb, kb, bias_b, causal, scale)
    p = _probs(s, lse.to(ct))
    go, vb, qb_c, kb_c = go.to(ct), vb.to(ct), qb.to(ct), kb.to(ct)
    pd = p if keep_b is None else _kept(p, keep_b, dropout_p)
    dv = torch.matmul(pd.transpose(-1, -2), go)
    dp = torch.matmul(go, vb.transpose(-1, -2))
    if keep_b is not None:
        dp = _kept(dp, keep_b, dropout_p)
    delta = (go * ob.to(ct)).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = torch.matmul(ds, kb_c) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qb_c) * scale
    return dq, dk, dv, ds


def _flash_ok(q, v, keep, need_dbias, fused=True) -> bool:
    # torch's fused CPU kernel: no dropout, no gradient for the mask, one head size
    return (
        keep is None and not need_dbias and q.device.type == "cpu" and q.shape[-1] == v.shape[-1]
        and fused
    )


def _unit_last(t):
    """``t`` with a unit stride in its last dim: torch's fused CPU kernel reads the last dim as
    contiguous whatever its stride (``F.scaled_dot_product_attention`` makes it so before calling
    it), so a strided view (``x[..., ::2]``, a packed-qkv slice) would be read wrongly."""
    return t if t is None or t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


# NOTE [ Short segments without the row log-sum-exp ]
#
# When no backward will read ``lse`` (a forward under ``no_grad``), one segment's attention is
# ``softmax(q kᵀ · scale) v``: two BLAS products on views of the packed rows and one softmax, the
# scores ``(H, Lq, Lk)`` staying in a core's L2 cache. For short segments this beats torch's fused
# CPU kernel, whose online softmax rescales per block of keys: a loop over the segments of the
# 512-sample, 50–197-token batch of ``benchmarks/attention.py`` ran 1.2–1.3× faster on 1 and 2
# threads, and 1.09× at 8–64 tokens; at 200–1000 tokens the fused kernel is faster (docs/design.md
# §8). Computing ``lse`` as well made it no faster than the fused kernel, so a forward that
# saves for backward keeps the fused kernel. float32 only (the fused kernel accumulates half
# precision in float32; the unfused products would round the scores to half precision), one
# segment per call (no padded rows), no bias (a row that masks every key has no softmax). The
# ``loop`` backend runs such segments through ``segment_softmax_into``, straight from the packed
# rows into the output's (no gather, no scatter, a few Python calls a segment). On the 64- and
# 512-sample batches of ``benchmarks/attention.py``, interleaved with the gathered path in one
# process: 1.2 % and 3.3 % faster on one thread (where the product also writes the output rows
# itself, skipping a copy of rows out of cache), level and 6.5 % faster on two.
_UNFUSED_SCORES = (1 << 12, 1 << 19)  # score entries H·Lq·Lk per call: 16 KB to 2 MB in float32


def _unfused_fits(t, scores: int) -> bool:
    """Whether one segment of ``scores`` entries ``H·Lq·Lk`` with queries like ``t`` takes the
    unfused formula: float32 on the CPU, in ``_UNFUSED_SCORES``."""
    lo, hi = _UNFUSED_SCORES
    return t.dtype == torch.float32 and t.device.type == "cpu" and lo <= scores <= hi


def _unfused_ok(qb, kb, bias_b, keep_b, need_lse: bool) -> bool:
    if need_lse or bias_b is not None or keep_b is not None:
        return False
    n, h, lq, _ = qb.shape
    return n == 1 and _unfused_fits(qb, h * lq * kb.shape[-2])


def _softmax_forward(qb, kb, vb, causal, scale):
    """NOTE [ Short segments without the row log-sum-exp ]: ``(out, None)``. The scale is the
    product's ``alpha`` (no pass over the scores: 2 threads, 64 segments of 50–197 tokens, 12 heads
    of 64, 1.09–1.10× faster than scaling the scores)."""
    n, h, lq, d = qb.shape
    lk = kb.shape[-2]
    p = _probabilities(qb.reshape(n * h, lq, d), kb.reshape(n * h, lk, d), causal, scale)
    return torch.matmul(p.view(n, h, lq, lk), vb), None


def _probabilities(q3, k3, causal: bool, scale: float):
    """``softmax(q kᵀ · scale)`` of ``(N, Lq, D)`` and ``(N, Lk, D)``, the scale as the product's
    ``alpha``; the future keys masked when ``causal``."""
    n, lq, lk = q3.shape[0], q3.shape[1], k3.shape[1]
    s = torch.baddbmm(q3.new_empty(n, lq, lk), q3, k3.transpose(-1, -2), beta=0, alpha=scale)
    if causal:
        s.masked_fill_(torch.ones(lq, lk, dtype=torch.bool, device=s.device).triu(1), NEG_INF)
    return torch.softmax(s, -1)


def segment_softmax_into(dest, q, k, v, causal: bool, scale: float) -> bool:
    """``_softmax_forward`` of one segment given as packed rows — ``q (Lq, H, D)``, ``k``/``v``
    ``(Lk, H, D)`` — written into its output rows ``dest (Lq, H, Dv)``, where
    ``_unfused_ok`` would take it (float32 on the CPU, the scores in ``_UNFUSED_SCORES``); False
    (nothing written) elsewhere. With one intra-op thread the product writes ``dest`` itself (a
    strided ``bmm``, which aten runs head by head); with more it writes a contiguous block that is
    copied, since the batched product parallelises better than the heads' (NOTE [ Short segments
    without the row log-sum-exp ]). The same products as ``_softmax_forward``: the same bits."""
    if not _unfused_fits(q, q.shape[1] * q.shape[0] * k.shape[0]):
        return False
    v3, d3 = v.transpose(0, 1), dest.transpose(0, 1)
    p = _probabilities(q.transpose(0, 1), k.transpose(0, 1), causal, scale)
    if torch.get_num_threads() == 1:
        torch.bmm(p, v3, out=d3)
    else:
        d3.copy_(torch.bmm(p, v3))
    return True


def _dense_forward(qb, kb, vb, bias_b, keep_b, causal, scale, dropout_p, fused=True, need_lse=True):
    """One padded batch ``(n, H, L, D)``: torch's fused CPU kernel when it applies; without ``lse``
    (``need_lse=False``, returned as None) for short segments, ``_softmax_forward``."""
    if fused and _unfused_ok(qb, kb, bias_b, keep_b, need_lse):
        return _softmax_forward(qb, kb, vb, causal, scale)
    if _flash_ok(qb, vb, keep_b, False, fused):
        qb, kb, vb, bias_b = _unit_last(qb), _unit_last(kb), _unit_last(vb), _unit_last(bias_b)
        out, lse = _flash_fwd(qb, kb, vb, 0.0, causal, attn_mask=bias_b, scale=scale)
        return out, lse.to(_compute_dtype(qb.dtype))
    return _math_forward(qb, kb, vb, bias_b, keep_b, causal, scale, dropout_p)


def _dense_backward(go, qb, kb, vb, ob, lse, bias_b, keep_b, causal, scale, dropout_p, need_dbias, fused=True):
    if _flash_ok(qb, vb, keep_b, need_dbias, fused):
        # the fused kernel's own lse convention: a row with no visible key has lse 0, not -inf
        lse_k = torch.where(torch.isneginf(lse), torch.zeros((), dtype=lse.dtype), lse)
        go, qb, kb, vb, ob, bias_b = (_unit_last(t) for t in (go, qb, kb, vb, ob, bias_b))
        dq, dk, dv = _flash_bwd(go, qb, kb, vb, ob, lse_k, 0.0, causal, attn_mask=bias_b, scale=scale)
        return dq, dk, dv, None
    return _math_backward(go, qb, kb, vb, ob, lse, bias_b, keep_b, causal, scale, dropout_p)


# ----------------------------------------------------------------------------- helpers
def _expand_heads(x, hq):
    """``(n, Hk, S, D)`` → ``(n, Hq, S, D)`` by ``repeat_interleave`` (enable_gqa)."""
    r = hq // x.shape[1]
    return x if r == 1 else x.repeat_interleave(r, dim=1)


def _reduce_heads(dx, hk):
    r = dx.shape[1] // hk
    return dx if r == 1 else dx.reshape(dx.shape[0], hk, r, *dx.shape[2:]).sum(2)


def _scale(q, scale):
    return (1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0) if scale is None else scale


def _host_lengths(cu):
    # SYNC: the CPU paths size their padded buckets from the lengths (free on the CPU; the CUDA
    # paths never come here).
    return cu.diff().cpu()


def _grad_buffers(q, k, v, bias, need_dbias: bool):
    """Zeroed ``(dq, dk, dv, dbias)`` accumulators in the compute dtype (``dbias`` None unless asked)."""
    ct = _compute_dtype(q.dtype)
    z = [torch.zeros(t.shape, dtype=ct, device=q.device) for t in (q, k, v)]
    return (*z, torch.zeros(bias.shape, dtype=ct, device=q.device) if need_dbias else None)
