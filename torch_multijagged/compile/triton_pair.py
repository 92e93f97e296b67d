"""Pair broadcast and jagged ↔ padded as ``multijagged::`` Triton ops, and the functions that pick
them or their pure-torch references.

The ops (``torch.library.triton_op``, so ``torch.compile`` sees the launches; kernels in
``kernels/pair_triton.py`` and ``kernels/padding_triton.py``, whose NOTEs give the index
arithmetic) take plain tensors:

* ``pair_combine_triton(left, right, li, ri, op)``: ``left[li] ∘ right[ri]``, op in add/sub/mul;
* ``pair_add_layer_norm_triton(left, right, li, ri, weight, bias, eps)``: ``layer_norm`` over the
  last dim of ``left[li] + right[ri]``, the sum never stored; ``(out, mean, rstd)``;
* ``to_padded_triton(values, offsets, sizes, maxes, padding)`` and its inverse
  ``from_padded_triton(padded, offsets, sizes, rows)`` (each is the other's backward).

Each has an autograd formula. The pair ops' backward ops scatter with atomics; the double
backward of ``pair_combine`` is written with the pair ops themselves (the op is bilinear), while
the fused LayerNorm's backward op has none and a double backward raises, as for dense SDPA's
fused kernels (NOTE [ Double backward ] in ``library.py``). Outputs of an op cannot be None, so a
backward op returns an empty tensor for a gradient not asked for.

The dispatch functions ``pair_combine``, ``pair_add_layer_norm``, ``to_padded_rows`` and
``from_padded_rows`` run the op where ``kernel_choice.use_triton`` holds and the kernel covers
the case, and ``kernels/reference.py``'s twin otherwise. The handlers call them: the pointwise
handler for ``add``/``sub``/``mul`` of two operands that are both gathered into new pair rows
(``ops/elementwise/pointwise.py``), and ``to_padded``/``from_padded_like`` (``ops/shape/padded.py``). The fused
LayerNorm has no automatic hook (``add`` and ``layer_norm`` reach the handlers as two separate
calls); callers use ``pair_add_layer_norm`` directly.

Under ``TRITON_INTERPRET=1`` the ops run eagerly on CPU tensors, but not under fake tensors (the
interpreter would read their data).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..kernels import padding_triton as kd
from ..kernels import pair_triton as kp
from ..kernels import reference as ref
from .kernel_choice import use_triton
from .library import _no_zero_fill

__all__ = ["pair_combine", "pair_add_layer_norm", "to_padded_rows", "from_padded_rows"]

_OPS = torch.ops.multijagged


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


# ----------------------------------------------------------------------------- pair_combine
@torch.library.triton_op("multijagged::pair_combine_triton", mutates_args=())
def pair_combine_triton(left: Tensor, right: Tensor, li: Tensor, ri: Tensor, op: str) -> Tensor:
    return kp.pair_combine_triton(left, right, li, ri, op)


@torch.library.triton_op("multijagged::pair_combine_triton_backward", mutates_args=())
def pair_combine_triton_backward(grad: Tensor, left: Tensor, right: Tensor, li: Tensor, ri: Tensor, op: str,
                                 need_left: bool, need_right: bool) -> tuple[Tensor, Tensor]:
    gl, gr = kp.pair_combine_triton_backward(grad, left, right, li, ri, op, need_left, need_right)
    return _empty(left) if gl is None else gl, _empty(right) if gr is None else gr


def _combine_setup(ctx, inputs, output):
    left, right, li, ri, op = inputs
    _no_zero_fill(ctx)
    # add/sub read the operands for their shapes only (NOTE [ Undefined gradients ] in library.py)
    if op != "mul":
        left, right = left.detach(), right.detach()
    ctx.save_for_backward(left, right, li, ri)
    ctx.op = op


def _combine_backward(ctx, grad):
    if grad is None:
        return None, None, None, None, None
    left, right, li, ri = ctx.saved_tensors
    nl, nr = ctx.needs_input_grad[:2]
    gl, gr = _OPS.pair_combine_triton_backward(grad, left, right, li, ri, ctx.op, nl, nr)
    return gl if nl else None, gr if nr else None, None, None, None


def _combine_backward_setup(ctx, inputs, output):
    grad, left, right, li, ri, op, need_left, need_right = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, left, right, li, ri)
    ctx.args = (op, need_left, need_right)


def _combine_double_backward(ctx, ggl, ggr):
    """gl = Σ_li g·∂, gr = Σ_ri ±g·∂ (∂ = the other operand for mul, 1 else): bilinear in
    ``(g, operands)``, so every derivative is another pair op."""
    grad, left, right, li, ri = ctx.saved_tensors
    op, need_left, need_right = ctx.args
    ggl = ggl if need_left else None  # an output not asked for is an empty placeholder
    ggr = ggr if need_right else None
    n = ctx.needs_input_grad
    d_grad = d_left = d_right = None
    if n[0] and (ggl is not None or ggr is not None):
        zl = ggl if ggl is not None else torch.zeros_like(left)
        zr = ggr if ggr is not None else torch.zeros_like(right)
        if op == "mul":  # ggl[li]·right[ri] + left[li]·ggr[ri]
            d_grad = _OPS.pair_combine_triton(zl, right, li, ri, "mul") + _OPS.pair_combine_triton(left, zr, li, ri,
                                                                                                    "mul")
        else:
            d_grad = _OPS.pair_combine_triton(zl, zr, li, ri, op)
    if op == "mul":
        if n[1] and ggr is not None:  # gr = Σ_ri g·left[li]  →  ∂/∂left = Σ_li g·ggr[ri]
            d_left = _OPS.pair_combine_triton_backward(grad, left, ggr, li, ri, "mul", True, False)[0]
        if n[2] and ggl is not None:  # gl = Σ_li g·right[ri]  →  ∂/∂right = Σ_ri g·ggl[li]
            d_right = _OPS.pair_combine_triton_backward(grad, ggl, right, li, ri, "mul", False, True)[1]
    return d_grad, d_left, d_right, None, None, None, None, None


pair_combine_triton.register_autograd(_combine_backward, setup_context=_combine_setup)
pair_combine_triton_backward.register_autograd(_combine_double_backward, setup_context=_combine_backward_setup)


# ----------------------------------------------------------------------------- fused LayerNorm
@torch.library.triton_op("multijagged::pair_add_layer_norm_triton", mutates_args=())
def pair_add_layer_norm_triton(left: Tensor, right: Tensor, li: Tensor, ri: Tensor, weight: Optional[Tensor],
                               bias: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return kp.pair_add_layer_norm_triton(left, right, li, ri, weight, bias, eps)


@torch.library.triton_op("multijagged::pair_add_layer_norm_triton_backward", mutates_args=())
def pair_add_layer_norm_triton_backward(grad: Tensor, left: Tensor, right: Tensor, li: Tensor, ri: Tensor,
                                        weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, rstd: Tensor,
                                        need_left: bool, need_right: bool, need_weight: bool,
                                        need_bias: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gl, gr, gw, gb = kp.pair_add_layer_norm_triton_backward(grad, left, right, li, ri, weight, mean, rstd, need_left,
                                                            need_right, need_weight and weight is not None,
                                                            need_bias and bias is not None)
    return (_empty(left) if gl is None else gl, _empty(right) if gr is None else gr,
            _empty(left) if gw is None else gw, _empty(left) if gb is None else gb.to(bias.dtype))


def _ln_setup(ctx, inputs, output):
    left, right, li, ri, weight, bias, eps = inputs
    _no_zero_fill(ctx)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(left, right, li, ri, weight, bias, output[1], output[2])


def _ln_backward(ctx, grad, _gm, _gr):
    if grad is None:
        return (None,) * 7
    left, right, li, ri, weight, bias, mean, rstd = ctx.saved_tensors
    n = ctx.needs_input_grad
    need_w, need_b = weight is not None and n[4], bias is not None and n[5]
    gl, gr, gw, gb = _OPS.pair_add_layer_norm_triton_backward(grad, left, right, li, ri, weight, bias, mean, rstd,
                                                              n[0], n[1], need_w, need_b)
    return (gl if n[0] else None, gr if n[1] else None, None, None, gw if need_w else None, gb if need_b else None,
            None)


def _ln_backward_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.count = len(inputs)


def _ln_double_backward(ctx, *grads):
    if all(g is None for g in grads):
        return (None,) * ctx.count
    raise NotImplementedError(
        "pair_add_layer_norm_triton_backward(): double backward is not supported for layout torch.multi_jagged "
        "(as for dense SDPA's fused kernels)"
    )


pair_add_layer_norm_triton.register_autograd(_ln_backward, setup_context=_ln_setup)
pair_add_layer_norm_triton_backward.register_autograd(_ln_double_backward, setup_context=_ln_backward_setup)


# ----------------------------------------------------------------------------- jagged <-> padded
@torch.library.triton_op("multijagged::to_padded_triton", mutates_args=())
def to_padded_triton(values: Tensor, offsets: Tensor, sizes: Tensor, maxes: Sequence[int], padding: float) -> Tensor:
    return kd.to_padded_triton(values, offsets, sizes, list(maxes), padding)


@torch.library.triton_op("multijagged::from_padded_triton", mutates_args=())
def from_padded_triton(padded: Tensor, offsets: Tensor, sizes: Tensor, rows: int) -> Tensor:
    return kd.from_padded_triton(padded, offsets, sizes, rows)


def _to_padded_setup(ctx, inputs, output):
    values, offsets, sizes, maxes, padding = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(offsets, sizes)
    ctx.rows = values.shape[0]


def _to_padded_backward(ctx, grad):
    if grad is None:
        return None, None, None, None, None
    offsets, sizes = ctx.saved_tensors
    return _OPS.from_padded_triton(grad, offsets, sizes, ctx.rows), None, None, None, None


def _from_padded_setup(ctx, inputs, output):
    padded, offsets, sizes, rows = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(offsets, sizes)
    ctx.maxes = list(padded.shape[1:1 + sizes.shape[1]])


def _from_padded_backward(ctx, grad):
    if grad is None:
        return None, None, None, None
    offsets, sizes = ctx.saved_tensors
    return _OPS.to_padded_triton(grad, offsets, sizes, ctx.maxes, 0.0), None, None, None


to_padded_triton.register_autograd(_to_padded_backward, setup_context=_to_padded_setup)
from_padded_triton.register_autograd(_from_padded_backward, setup_context=_from_padded_setup)


# ----------------------------------------------------------------------------- dispatch
def _pair_covered(left: Tensor, right: Tensor) -> bool:
    return (left.dtype in kp.DTYPES and right.dtype == left.dtype and right.device == left.device
            and left.dim() >= 1 and left.shape[1:] == right.shape[1:])


def pair_combine(left: Tensor, right: Tensor, li: Tensor, ri: Tensor, op: str) -> Tensor:
    """``left[li] ∘ right[ri]`` (``op``: "add", "sub" or "mul") over packed pair rows: ``left``
    (L, *F), ``right`` (R, *F), ``li``/``ri`` (T,) int64 row maps; the Triton op where
    ``use_triton(left)`` holds and the operands share dtype and ``F``, the reference otherwise."""
    if use_triton(left) and _pair_covered(left, right) and op in kp.OPS:
        return _OPS.pair_combine_triton(left, right, li, ri, op)
    return ref.pair_combine(left, right, li, ri, op)


def pair_add_layer_norm(left: Tensor, right: Tensor, li: Tensor, ri: Tensor, weight: Optional[Tensor] = None,
                        bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm(left[li] + right[ri], (C,), weight, bias, eps)`` in one kernel where
    ``use_triton(left)`` holds (the pair sum is never stored), the reference otherwise."""
    if (use_triton(left) and _pair_covered(left, right) and left.dim() >= 2
            and 1 <= left.shape[-1] <= kp.MAX_LN_WIDTH):
        return _OPS.pair_add_layer_norm_triton(left, right, li, ri, weight, bias, float(eps))[0]
    return ref.pair_add_layer_norm(left, right, li, ri, weight, bias, eps)


def _pad_covered(t: Tensor, sizes: Tensor) -> bool:
    return t.dtype in kd.DTYPES and sizes.dim() == 2 and sizes.shape[1] <= kd.MAX_RAGGED


def to_padded_rows(values: Tensor, offsets: Tensor, sizes: Tensor, maxes: Sequence[int], padding: float) -> Tensor:
    """``(B, *maxes, *F)``: the packed rows ``values`` (T, *F) of a partition (row ``offsets``
    (B+1,), per-sample extents ``sizes`` (B, R)) at their cells, ``padding`` elsewhere."""
    if use_triton(values) and _pad_covered(values, sizes):
        return _OPS.to_padded_triton(values, offsets, sizes, list(maxes), float(padding))
    return ref.to_padded_rows(values, offsets, sizes, maxes, padding)


def from_padded_rows(padded: Tensor, offsets: Tensor, sizes: Tensor, rows) -> Tensor:
    """``(rows, *F)``: the real cells of ``padded`` (B, M_1..M_R, *F) as packed rows."""
    if use_triton(padded) and _pad_covered(padded, sizes):
        return _OPS.from_padded_triton(padded, offsets, sizes, rows)
    return ref.from_padded_rows(padded, offsets, sizes, rows)
