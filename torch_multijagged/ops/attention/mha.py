"""``nn.MultiheadAttention`` (and so ``nn.TransformerEncoderLayer``) on multi_jagged batches.

NOTE [ Batch-second tokens ]

``nn.MultiheadAttention(batch_first=True).forward`` swaps the batch dim to second place
(``query.transpose(1, 0)``), calls ``F.multi_head_attention_forward`` (sequence-first) and swaps
the result back. This layout has the batch at dim 0 by construction, so ``transpose(0, 1)`` of a
3-D multi_jagged tensor returns a ``BatchSecond``: a token that holds the original tensor and
supports exactly three things — its metadata, being swapped back (``transpose(0, 1)`` returns the
original), and being passed to ``F.multi_head_attention_forward``, which is routed to ``_mha``: the
same computation on the batch-first tensors (in-projection, ``F.scaled_dot_product_attention`` on
``(B, H, j, D)``, out-projection) with a ``BatchSecond`` result. Anything else raises. The
tokens are not part of the autograd graph: gradients flow through the batch-first tensors they
hold, so a module runs unchanged, forward and backward, and no ``key_padding_mask`` is needed —
each sample has its own length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._common import MJT, describe
from .._routing import route

__all__ = ["BatchSecond"]

_OP = "multi_head_attention_forward"
_SWAPS = {torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes, torch.swapdims,
          torch.Tensor.swapdims}


def _swaps_batch(args, kwargs) -> bool:
    dims = list(args[1:3])
    for name in ("dim0", "dim1", "axis0", "axis1"):
        if name in kwargs:
            dims.append(kwargs[name])
    if len(dims) != 2:
        return False
    n = args[0].dim()
    return sorted(d % n for d in dims) == [0, 1]


class BatchSecond(torch.Tensor):
    """A 3-D multi_jagged tensor with its batch dim swapped to second place (NOTE [ Batch-second
    tokens ]); ``transpose(0, 1)`` gives the tensor back."""

    _mjt: MJT

    @staticmethod
    def __new__(cls, mjt: MJT):
        size = list(mjt._size)
        size[0], size[1] = size[1], size[0]
        stride = list(mjt._strides)
        stride[0], stride[1] = stride[1], stride[0]
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, stride, 0, torch.contiguous_format, mjt.dtype, torch.strided, mjt.device, False, False,
            "sizes", False, False, storage_size=0,
        )
        r._mjt = mjt
        r._size, r._strides = tuple(size), tuple(stride)
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"BatchSecond({self._mjt!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SWAPS and isinstance(args[0], BatchSecond) and _swaps_batch(args, kwargs):
            return args[0]._mjt
        if func is F.multi_head_attention_forward:
            return _mha(*args, **kwargs)
        if getattr(func, "__name__", "") == "__get__" or func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        raise NotImplementedError(
            f"{getattr(func, '__name__', func)}(): a multi_jagged tensor with its batch dim swapped to dim 1 "
            "(transpose(0, 1)) supports only being swapped back and F.multi_head_attention_forward "
            "(nn.MultiheadAttention with batch_first=True); keep the batch first for other ops"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        meta = _DISPATCH_METADATA.get(func)
        if meta is not None:
            return meta(args[0])
        raise NotImplementedError(
            f"{func}: a multi_jagged tensor with its batch dim swapped to dim 1 has no data of its own "
            "(see BatchSecond)"
        )


_METADATA = {torch.Tensor.dim, torch.Tensor.size, torch.Tensor.ndimension, torch.Tensor.is_floating_point,
             torch.Tensor.is_complex, torch.Tensor.__hash__}


aten = torch.ops.aten
_DISPATCH_METADATA = {
    aten.sym_size.default: lambda x: x._size,
    aten.dim.default: lambda x: len(x._size),
    aten.sym_stride.default: lambda x: x._strides,
    aten.sym_numel.default: lambda x: x._mjt._values.numel(),
    aten.numel.default: lambda x: x._mjt._values.numel(),
    aten.sym_storage_offset.default: lambda x: 0,
    aten.is_contiguous.default: lambda x: False,
    aten.sym_is_contiguous.default: lambda x: False,
}


@route(*_SWAPS)
def _swap(input, *args, **kwargs):
    if isinstance(input, MJT) and input.dim() == 3 and _swaps_batch((input, *args), kwargs):
        if torch.compiler.is_compiling():
            raise NotImplementedError(
                "transpose(0, 1) of a multi_jagged tensor (nn.MultiheadAttention's batch_first swap) is not "
                "supported under torch.compile; compile a module that calls F.scaled_dot_product_attention on "
                "(B, H, j, D) instead (README, Attention)"
            )
        return BatchSecond(input)
    return NotImplemented


def _unwrap(name: str, t):
    if isinstance(t, BatchSecond):
        return t._mjt
    raise TypeError(
        f"{_OP}(): expected {name} to be a multi_jagged tensor swapped to sequence-first like the query, got "
        f"{type(t).__name__} {describe(t)}"
    )


def _mha(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
         add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
         need_weights=True, attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
         v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True, is_causal=False):
    """``F.multi_head_attention_forward`` on batch-first multi_jagged tensors (NOTE [ Batch-second
    tokens ]); returns ``(BatchSecond output, weights or None)`` like the dense function."""
    same_qk, same_kv = query is key, key is value
    q, k, v = _unwrap("query", query), _unwrap("key", key), _unwrap("value", value)
    e = q.shape[-1]
    if e != embed_dim_to_check:
        raise ValueError(f"{_OP}(): expected query's embedding size {embed_dim_to_check}, got {e}")
    if e % num_heads:
        raise ValueError(f"{_OP}(): embed_dim {e} not divisible by num_heads {num_heads}")
    for name, arg in (("bias_k", bias_k), ("bias_v", bias_v), ("static_k", static_k), ("static_v", static_v)):
        if arg is not None:
            raise NotImplementedError(f"{_OP}(): {name} is not supported for layout torch.multi_jagged")
    if add_zero_attn:
        raise NotImplementedError(f"{_OP}(): add_zero_attn is not supported for layout torch.multi_jagged")
    if key_padding_mask is not None:
        raise ValueError(
            f"{_OP}(): key_padding_mask is not needed for layout torch.multi_jagged (every sample has its own "
            f"length), got {describe(key_padding_mask)}"
        )
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
    qh, kh, vh = (t.unflatten(-1, (num_heads, -1)).transpose(1, 2) for t in (qp, kp, vp))
    p = dropout_p if training else 0.0
    weights = None
    if need_weights:
        # the probabilities themselves are asked for: an explicit softmax (dense does the same)
        scores = torch.matmul(qh * math.sqrt(1.0 / hd), kh.transpose(-2, -1))
        if causal:
            raise NotImplementedError(f"{_OP}(): need_weights=True with is_causal=True is not supported for layout "
                                      "torch.multi_jagged (pass need_weights=False)")
        probs = torch.softmax(scores, dim=-1)
        dropped = F.dropout(probs, p=p) if p > 0.0 else probs
        out = torch.matmul(dropped, vh)
        weights = dropped.mean(1) if average_attn_weights else dropped
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, dropout_p=p, is_causal=causal)
    out = F.linear(out.transpose(1, 2).flatten(-2), out_proj_weight, out_proj_bias)
    return BatchSecond(out), weights
