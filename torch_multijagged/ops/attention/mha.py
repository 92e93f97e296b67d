"""``nn.MultiheadAttention`` (and so ``nn.TransformerEncoderLayer``) on multi_jagged batches.

NOTE [ Batch-second tokens ]

``nn.MultiheadAttention(batch_first=True).forward`` swaps the batch dim to second place
(``query.transpose(1, 0)``), calls ``F.multi_head_attention_forward`` (sequence-first) and swaps
the result back. This layout has the batch at dim 0 by construction, so ``transpose(0, 1)`` of a
3-D multi_jagged tensor returns a ``BatchSecond``: a batch-moved token (NOTE [ Batch-moved
tokens ] in ``shape/leading.py``) that holds the original tensor and supports its metadata, being
swapped back (``transpose(0, 1)`` returns the original), the ops that do not care where the batch
is (elementwise, last-dim ops such as ``linear`` / ``layer_norm`` / ``dropout``, reductions with
mapped dims: so ``nn.TransformerEncoderLayer(batch_first=False)`` runs on sequence-first input),
and being passed to ``F.multi_head_attention_forward``, which is ``_mha``: the same computation on
the batch-first tensors (in-projection, ``F.scaled_dot_product_attention`` on ``(B, H, j, D)``,
out-projection) with a ``BatchSecond`` result. Anything else raises. The
tokens are not part of the autograd graph: gradients flow through the batch-first tensors they
hold, so a module runs unchanged, forward and backward, and no ``key_padding_mask`` is needed —
each sample has its own length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...constructors import as_nested_tensor, from_packed
from .._common import MJT, canonical_dim, describe
from .._routing import route
from ..shape.leading import BatchMoved, batch_transpose, token_op
from ..shape.merged import BatchMerged
from .sdpa import dense_as_rows

__all__ = ["BatchSecond"]

_OP = "multi_head_attention_forward"
_SWAPS = {torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes, torch.swapdims,
          torch.Tensor.swapdims}


class BatchSecond(BatchMoved):
    """A multi_jagged tensor with its batch dim swapped to second place (NOTE [ Batch-second
    tokens ]): a batch-moved token (NOTE [ Batch-moved tokens ]) that
    ``F.multi_head_attention_forward`` also takes."""

    @staticmethod
    def __new__(cls, mjt: MJT):
        return BatchMoved.__new__(cls, mjt, (1, 0) + tuple(range(2, mjt.dim())))

    def __repr__(self) -> str:  # type: ignore[override]
        return f"BatchSecond({self._mjt!r})"


@route(*_SWAPS)
def _swap(input, *args, **kwargs):
    if not isinstance(input, MJT):
        return NotImplemented
    dims = list(args[:2]) + [kwargs[k] for k in ("dim0", "dim1", "axis0", "axis1") if k in kwargs]
    if len(dims) != 2:
        return NotImplemented
    a, b = (canonical_dim("transpose", input.dim(), d) for d in dims)
    if 0 not in (a, b) or a == b:
        return NotImplemented  # the batch stays first: the op table's handler
    if input.dim() == 3 and sorted((a, b)) == [0, 1]:
        return BatchSecond(input)
    return batch_transpose(input, a, b)


def _unwrap(name: str, t):
    if isinstance(t, BatchMoved) and t._perm == (1, 0, 2):
        return t._mjt
    raise TypeError(
        f"{_OP}(): expected {name} to be a multi_jagged tensor swapped to sequence-first like the query, got "
        f"{type(t).__name__} {describe(t)}"
    )


@token_op(F.multi_head_attention_forward)
def _mha(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
         add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
         need_weights=True, attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
         v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True, is_causal=False):
    """``F.multi_head_attention_forward`` on batch-first multi_jagged tensors (NOTE [ Batch-second
    tokens ]); returns ``(BatchSecond output, weights or None)`` like the dense function."""
    same_qk, same_kv = query is key, key is value
    # A dense query (L, B, E) against multi_jagged keys: each sample's L queries over its own keys
    # (a DETR decoder's object queries); the output is dense, sequence-first as the dense function's.
    # Dense keys and values (S, B, E) under multi_jagged queries: each sample's tokens reading a
    # fixed memory (a Perceiver's decoder); the output keeps the queries' structure.
    dense_q = not isinstance(query, (BatchMoved, MJT))
    dense_kv = not dense_q and not isinstance(key, (BatchMoved, MJT)) and not isinstance(value, (BatchMoved, MJT))
    q = query.transpose(0, 1) if dense_q else _unwrap("query", query)
    k, v = (key.transpose(0, 1), value.transpose(0, 1)) if dense_kv else (_unwrap("key", key), _unwrap("value", value))
    e = q.shape[-1]
    if e != embed_dim_to_check:
        raise ValueError(f"{_OP}(): expected query's embedding size {embed_dim_to_check}, got {e}")
    if e % num_heads:
        raise ValueError(f"{_OP}(): embed_dim {e} not divisible by num_heads {num_heads}")
    for name, arg in (("static_k", static_k), ("static_v", static_v)):
        if arg is not None:
            raise NotImplementedError(f"{_OP}(): {name} is not supported for layout torch.multi_jagged")
    if (bias_k is None) != (bias_v is None):
        raise AssertionError(f"{_OP}(): bias_k and bias_v are given together")  # dense asserts it too
    if (bias_k is not None or add_zero_attn) and is_causal:
        raise NotImplementedError(
            f"{_OP}(): bias_k / bias_v and add_zero_attn with is_causal=True are not supported for layout torch.multi_jagged"
        )
    mask = None
    if key_padding_mask is not None:
        if not dense_kv or isinstance(key_padding_mask, MJT):
            raise ValueError(
                f"{_OP}(): key_padding_mask is not needed for multi_jagged keys (every sample has its own "
                f"length), got {describe(key_padding_mask)}"
            )
        # padded dense keys (a text context read by ragged image tokens): dense's mask, -inf where
        # True (a float mask as given), added to every head's scores
        s_len = k.shape[1]
        if key_padding_mask.shape != (k.shape[0], s_len):
            raise RuntimeError(f"{_OP}(): expected key_padding_mask of shape {(k.shape[0], s_len)}, got "
                               f"{tuple(key_padding_mask.shape)}")
        if is_causal or attn_mask is not None:
            raise NotImplementedError(f"{_OP}(): key_padding_mask with attn_mask or is_causal=True is not supported "
                                      "for layout torch.multi_jagged")
        if key_padding_mask.dtype == torch.bool:
            key_padding_mask = torch.zeros_like(key_padding_mask, dtype=q.dtype).masked_fill_(key_padding_mask,
                                                                                                float("-inf"))
        elif not torch.is_floating_point(key_padding_mask):
            raise AssertionError(f"{_OP}(): only bool and floating types of key_padding_mask are supported")
        mask = key_padding_mask.view(k.shape[0], 1, 1, s_len)
    if attn_mask is not None and not is_causal and isinstance(attn_mask, BatchMerged):
        # a per-sample mask folded as dense's (B·H, L, S): the batch-first (B, H, L, S) it holds
        mask = attn_mask._mjt
        if mask.dim() != 4 or mask._size[1] != num_heads:
            raise RuntimeError(f"{_OP}(): expected a per-sample attn_mask of (B·{num_heads}, L, S), got {describe(mask)}")
        if mask.dtype == torch.bool:  # nn.MultiheadAttention's convention: True is masked out
            mask = ~mask
        attn_mask = None
    if attn_mask is not None and not is_causal and isinstance(attn_mask, MJT) and attn_mask.dim() == 3:
        # dense's 3-d mask holds one per (sample, head), B·H of them: with one head, one per sample
        if num_heads != 1:
            raise RuntimeError(
                f"{_OP}(): a multi_jagged attn_mask {describe(attn_mask)} has one mask per sample; as dense, a 3-d "
                f"mask holds one per sample and head, (B·{num_heads}, L, S): fold the heads in "
                "(m.unsqueeze(1).expand(-1, H, -1, -1).flatten(0, 1))"
            )
        mask = ~attn_mask.unsqueeze(1) if attn_mask.dtype == torch.bool else attn_mask.unsqueeze(1)
        attn_mask = None
    if attn_mask is not None and not is_causal:
        raise NotImplementedError(
            f"{_OP}(): a dense attn_mask cannot address ragged sequences (layout torch.multi_jagged); pass "
            "is_causal=True for causal attention, or call F.scaled_dot_product_attention with a multi_jagged mask"
        )
    # With is_causal=True, attn_mask is only a hint (dense attention needs it for the square
    # mask, which ragged lengths cannot be written as): causal masking is per sample.
    causal = bool(is_causal)
    hd = e // num_heads
    if not use_separate_proj_weight:
        w, b = in_proj_weight, in_proj_bias
        # unbind over a static dim, not chunk: its backward stacks the three gradients once,
        # where chunk's slice backwards zero-fill and add three full-size buffers
        if same_qk and same_kv:
            qp, kp, vp = F.linear(q, w, b).unflatten(-1, (3, e)).unbind(-2)
        elif same_kv:
            qp = F.linear(q, w[:e], None if b is None else b[:e])
            kp, vp = F.linear(k, w[e:], None if b is None else b[e:]).unflatten(-1, (2, e)).unbind(-2)
        else:
            bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
            wq, wk, wv = w.chunk(3)
            qp, kp, vp = F.linear(q, wq, bq), F.linear(k, wk, bk), F.linear(v, wv, bv)
    else:
        bq, bk, bv = (None, None, None) if in_proj_bias is None else (
            in_proj_bias[:e], in_proj_bias[e:2 * e], in_proj_bias[2 * e:])
        qp, kp, vp = F.linear(q, q_proj_weight, bq), F.linear(k, k_proj_weight, bk), F.linear(v, v_proj_weight, bv)
    if bias_k is not None:
        # dense appends the learned key and value (1, 1, E) after each sample's keys, then a zero
        # key and value for add_zero_attn: here along each sample's ragged dim (a new extent)
        kp = torch.cat([kp, bias_k.reshape(1, 1, e).expand(kp.shape[0], 1, e)], dim=1)
        vp = torch.cat([vp, bias_v.reshape(1, 1, e).expand(vp.shape[0], 1, e)], dim=1)
    if add_zero_attn:
        kp = torch.cat([kp, kp.new_zeros(kp.shape[0], 1, e)], dim=1)
        vp = torch.cat([vp, vp.new_zeros(vp.shape[0], 1, e)], dim=1)
    if key_padding_mask is not None and mask.shape[-1] != kp.shape[1]:
        mask = F.pad(mask, (0, kp.shape[1] - mask.shape[-1]))  # the appended keys are never masked, as dense's
    qh, kh, vh = (t.unflatten(-1, (num_heads, -1)).transpose(1, 2) for t in (qp, kp, vp))
    p = dropout_p if training else 0.0
    weights = None
    if need_weights:
        # the probabilities themselves are asked for: an explicit softmax (dense does the same)
        if causal and dense_q:
            raise NotImplementedError(f"{_OP}(): need_weights=True with is_causal=True and a dense query is not "
                                      "supported for layout torch.multi_jagged (pass need_weights=False)")
        rows, back = dense_as_rows(_OP, qh, kh) if dense_q else (qh, None)
        scores = torch.matmul(rows * math.sqrt(1.0 / hd), kh.transpose(-2, -1))
        if causal:  # each sample's own square mask: query i reads keys 0..i
            scores = scores.masked_fill(~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        probs = torch.softmax(scores, dim=-1)
        dropped = F.dropout(probs, p=p) if p > 0.0 else probs
        out = torch.matmul(dropped, vh)
        weights = dropped.mean(1) if average_attn_weights else dropped
        if dense_q:
            # each sample's weights (…, L, nᵢ): L static, the keys ragged
            out = back(out)
            weights = as_nested_tensor(list(weights.unbind()), ragged_dims=(weights.dim() - 1,)) if weights.shape[0] \
                else _no_weights(weights, kh, ([] if average_attn_weights else [qh.shape[1]]) + [qh.shape[2]])
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=p, is_causal=causal)
    out = F.linear(out.transpose(1, 2).flatten(-2), out_proj_weight, out_proj_bias)
    return (out.transpose(0, 1) if dense_q else BatchSecond(out)), weights


def _no_weights(weights, keys: MJT, static: list) -> MJT:
    """The attention weights ``(0, [H,] L, j)`` of an empty batch (dense queries of length ``L``):
    no sample, the keys' ragged dim last."""
    values = torch.zeros((0, *static), dtype=weights.dtype, device=weights.device) + weights.sum() * 0  # (on the graph)
    off = keys._partition.offsets.new_zeros(1)
    return from_packed(values, off, off.new_zeros(0, 1), (len(static) + 1,))


@route(F.multi_head_attention_forward)
def _mha_batch_first_given(query, key, value, *args, **kwargs):
    """A multi_jagged ``(B, j, E)`` batch handed straight to the sequence-first function
    (``nn.MultiheadAttention(batch_first=False)(x, x, x)``): dense reads it as ``(L, N, E)``, the
    ragged dim as the batch, which no sample means; say how to call it."""
    if isinstance(query, MJT) and not isinstance(query, BatchMoved):
        raise TypeError(
            f"{_OP}(): got a multi_jagged batch {describe(query)}, which is batch-first; this function (and "
            "nn.MultiheadAttention(batch_first=False)) reads (L, N, E): use batch_first=True, or pass x.transpose(0, 1)"
        )
    return NotImplemented


@route(torch._native_multi_head_attention, torch.ops.aten._native_multi_head_attention.default)
def _native_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask=None,
                need_weights=True, average_attn_weights=True, mask_type=None):
    """The fused inference kernel ``nn.MultiheadAttention``'s fast path calls (batch-first, no
    dropout), called directly: the same computation as ``_mha`` on the batch-first tensors."""
    if not isinstance(query, MJT):
        return NotImplemented
    if mask is not None:
        raise NotImplementedError(
            "_native_multi_head_attention(): a dense mask cannot address ragged sequences (layout "
            "torch.multi_jagged); every sample attends over its own length"
        )
    q = BatchSecond(query)
    k = q if key is query else BatchSecond(key)
    v = k if value is key else BatchSecond(value)
    out, weights = _mha(q, k, v, embed_dim, num_head, qkv_weight, qkv_bias, None, None, False, 0.0, proj_weight,
                        proj_bias, training=False, need_weights=need_weights, average_attn_weights=average_attn_weights)
    return out._mjt, weights


@route(torch._transformer_encoder_layer_fwd)
def _encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                       eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1,
                       ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """The fused inference kernel ``nn.TransformerEncoderLayer``'s fast path calls (eval, no
    gradient; dynamo takes that path where eager's ``has_torch_function`` test does not): the
    layer's own computation, its attention through ``_native_mha``."""
    if not isinstance(src, MJT):
        return NotImplemented
    if mask is not None:
        raise NotImplementedError(
            "_transformer_encoder_layer_fwd(): a dense mask cannot address ragged sequences (layout "
            "torch.multi_jagged); every sample attends over its own length"
        )

    def attend(x):
        return torch._native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                                  proj_bias, None, False)[0]

    def feed_forward(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm(x, w, b):
        return F.layer_norm(x, (embed_dim,), w, b, eps)

    x = src
    if norm_first:
        x = x + attend(norm(x, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(x + attend(x), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)
