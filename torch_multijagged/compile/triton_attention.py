"""``multijagged::varlen_attention_triton`` and its backward: the Triton kernels of
``kernels/attention_triton.py`` as ``torch.library.triton_op`` ops, so that ``torch.compile`` sees
the launches (Inductor schedules them; no graph break).

Not imported by the package: the dispatcher (``compile/attention.py``) imports this module when it
picks the ``triton`` backend (CUDA, no dropout, short segments). The ops take what NOTE [ Varlen
attention contract ] takes, minus dropout; ``scale`` is explicit. The backward op returns an
empty ``dbias`` unless ``need_dbias`` (an op output cannot be None). ``lse`` is not
differentiable, and the backward op has no derivative of its own: a double backward raises, as
for dense SDPA's fused kernels (NOTE [ Double backward ] in ``library.py``).

Under ``TRITON_INTERPRET=1`` the ops run eagerly on CPU tensors (``wrap_triton`` hands back the
interpreted kernel), but not under fake tensors: the interpreter would read their data.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..kernels.attention_triton import attention_triton, attention_triton_backward
from .library import _no_zero_fill

__all__ = ["varlen_attention_triton", "varlen_attention_triton_backward"]


@torch.library.triton_op("multijagged::varlen_attention_triton", mutates_args=())
def varlen_attention_triton(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
                            bias: Optional[Tensor], bias_start: Optional[Tensor], causal: bool,
                            scale: float) -> tuple[Tensor, Tensor]:
    return attention_triton(q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, causal, scale)


@torch.library.triton_op("multijagged::varlen_attention_triton_backward", mutates_args=())
def varlen_attention_triton_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                     cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, bias: Optional[Tensor],
                                     bias_start: Optional[Tensor], causal: bool, scale: float,
                                     need_dbias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, db = attention_triton_backward(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias, bias_start,
                                               causal, scale, need_dbias and bias is not None)
    return dq, dk, dv, q.new_empty(0) if db is None else db


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, causal, scale = inputs
    _no_zero_fill(ctx)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k, bias, bias_start)
    ctx.args = (max_q, max_k, causal, scale)


def _backward(ctx, grad, _grad_lse):
    if grad is None:
        return (None,) * 11
    q, k, v, out, lse, cu_q, cu_k, bias, bias_start = ctx.saved_tensors
    max_q, max_k, causal, scale = ctx.args
    n = ctx.needs_input_grad
    need_dbias = bias is not None and n[7]
    dq, dk, dv, db = torch.ops.multijagged.varlen_attention_triton_backward(
        grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias, bias_start, causal, scale, need_dbias
    )
    return (dq if n[0] else None, dk if n[1] else None, dv if n[2] else None, None, None, None, None,
            db if need_dbias else None, None, None, None)


def _backward_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.count = len(inputs)


def _double_backward(ctx, *grads):
    if all(g is None for g in grads):
        return (None,) * ctx.count
    raise NotImplementedError(
        "varlen_attention_triton_backward(): double backward is not supported for layout torch.multi_jagged "
        "(as for dense SDPA's fused kernels)"
    )


varlen_attention_triton.register_autograd(_backward, setup_context=_setup)
varlen_attention_triton_backward.register_autograd(_double_backward, setup_context=_backward_setup)
