"""Attention over packed variable-length segments: the pure-torch CPU paths and the test oracle.

NOTE [ Varlen attention contract ]

Every attention this package computes — self or cross attention over a ragged sequence dim,
rows of a pair attending along their columns — reduces to *segments*: segment ``s`` has
``Lq_s`` query rows and ``Lk_s`` key rows in packed buffers. Plain tensors only:

* ``q (Tq, Hq, D)``, ``k (Tk, Hk, D)``, ``v (Tk, Hk, Dv)`` with ``Hq % Hk == 0``: query head
  ``h`` reads key/value head ``h // (Hq // Hk)`` (``enable_gqa``'s ``repeat_interleave``);
* ``cu_q``, ``cu_k`` ``(N+1,)`` int64: segment ``s`` is q rows ``cu_q[s]:cu_q[s+1]`` and k/v
  rows ``cu_k[s]:cu_k[s+1]`` (flash-attn's ``cu_seqlens``); ``max_q``/``max_k`` bound the lengths;
* ``bias (Tb, Hb)`` or None, ``Hb`` in ``{1, Hq}``, added to the scores: segment ``s`` reads the
  ``(Lq_s, Lk_s)`` block at rows ``bias_start[s] + a·Lk_s + b`` (row-major). Several segments may
  share one block (the rows of a pair attending along their columns with a bias shared by rows);
* ``keep (Ts, Hq)`` bool or None: the dropout keep mask in *score layout* — segment ``s``'s block
  at rows ``cs[s] + a·Lk_s + b`` with ``cs`` the exclusive prefix sum of ``Lq_s·Lk_s``; kept
  probabilities are scaled by ``1 / (1 - dropout_p)`` (dense SDPA's dropout, after softmax);
* ``causal``: key ``b`` is visible to query ``a`` iff ``b <= a`` (top-left, as dense SDPA).

The forward returns ``out (Tq, Hq, Dv)`` in q's dtype and ``lse (Tq, Hq)`` (float32 for half
types, else q's dtype), the log-sum-exp
of the visible scores (before dropout). A query with no visible key (``Lk_s = 0`` or every key
masked) gets a zero output row and no gradient, as dense SDPA gives for a fully masked row; its
``lse`` is not specified. The backward returns ``(dq, dk, dv, dbias)``, ``dbias`` summed over the
segments that share a block (and over heads when ``Hb = 1``).

Two CPU paths implement the contract (the dispatcher in ``ops/attention/sdpa.py`` picks one per call):
``attention_bucketed`` sorts segments by length and pads only within buckets of similar length
(one dense call per bucket), ``attention_loop`` runs one dense call per segment on views. Both
run torch's fused CPU flash kernel where it applies (no bias gradient, no dropout) and a
padded math formula otherwise. ``attention_reference`` is the single-bucket case: the oracle.
"""

from __future__ import annotations

# The paths live in modules below this one (imports point down only): ``attention_common.py``
# (what every CPU path shares), ``attention_bucketed.py`` (the bucketed path, which the loop and
# reference entry points below run) and ``attention_blocks.py`` (the blocks path). This module
# re-exports their names unchanged.
from .attention_common import (  # noqa: F401
    NEG_INF, _compute_dtype, _dense_backward, _dense_forward, _expand_heads, _flash_bwd, _flash_fwd, _flash_ok,
    _grad_buffers, _host_lengths, _kept, _math_backward, _math_forward, _probs, _reduce_heads, _scale, _scores,
    score_offsets,
)
from .attention_bucketed import (  # noqa: F401
    _BUCKET_CACHE, _Bucket, _buckets, _is_traced, attention_bucketed, attention_bucketed_backward, bucket_plan,
)
from .attention_blocks import attention_blocks, attention_blocks_backward, block_runs  # noqa: F401

__all__ = [
    "attention_reference",
    "attention_reference_backward",
    "attention_bucketed",
    "attention_bucketed_backward",
    "attention_loop",
    "attention_loop_backward",
    "bucket_plan",
    "score_offsets",
]


# ----------------------------------------------------------------------------- entry points
def attention_reference(q, k, v, cu_q, cu_k, bias=None, bias_start=None, keep=None, causal=False,
                        scale=None, dropout_p=0.0):
    """The oracle: every segment in one padded bucket, padded math (no fused kernel)."""
    lq, lk = _host_lengths(cu_q), _host_lengths(cu_k)
    live = ((lq > 0) & (lk > 0)).nonzero().flatten()
    buckets = [live] if live.numel() else []
    return attention_bucketed(q, k, v, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p,
                              buckets=buckets, fused=False)


def attention_reference_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias=None, bias_start=None, keep=None,
                                 causal=False, scale=None, dropout_p=0.0, need_dbias=False):
    lq, lk = _host_lengths(cu_q), _host_lengths(cu_k)
    live = ((lq > 0) & (lk > 0)).nonzero().flatten()
    buckets = [live] if live.numel() else []
    return attention_bucketed_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias, bias_start, keep, causal, scale,
                                       dropout_p, need_dbias, buckets=buckets, fused=False)


def attention_loop(q, k, v, cu_q, cu_k, bias=None, bias_start=None, keep=None, causal=False,
                   scale=None, dropout_p=0.0, *, need_lse=True):
    """One dense call per segment; no gather for q/k/v (views of the packed buffers)."""
    return attention_bucketed(q, k, v, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p,
                              buckets="loop", need_lse=need_lse)


def attention_loop_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias=None, bias_start=None, keep=None,
                            causal=False, scale=None, dropout_p=0.0, need_dbias=False):
    return attention_bucketed_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias, bias_start, keep, causal,
                                       scale, dropout_p, need_dbias, buckets="loop")
