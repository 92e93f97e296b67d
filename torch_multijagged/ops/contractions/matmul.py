"""``linear`` and ``matmul`` / ``@`` on multi_jagged operands: the routes that pick the
contraction, and the handlers of ``multijagged::linear`` (and its parameter gradients).

``linear`` and ``x @ W`` with a dense 2-D ``W`` act on the packed rows (``multijagged::linear``;
eagerly with gradients, the values bridge: NOTE [ Bridged computations ]). ``matmul`` with a dense
per-sample operand goes to ``bmm``'s handler (``indexing/gather.py``, NOTE [ Batched matmul with
a dense per-sample operand ]); between square pairs that contract a ragged dim, to
``multijagged::pair_matmul`` (``pair_mm.py``, NOTE [ Contracting a ragged dim ]); otherwise, as the
broadcast product summed over the contracted dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...compile import library
from .. import bridged
from .._common import MJT, describe, wrap
from .._routing import _call, _dense, _needs_grad, route
from .._table import register_multi_jagged_func
from .pair_mm import pair_product

mj = torch.ops.multijagged


def _autocast_lower(*ts):
    """Under autocast, the cast that dense autocast gives matmul and linear (its lower-precision
    list: float32/float16/bfloat16 tensors to the autocast dtype, float64 kept). Autocast does not
    reach the computations below: the ``multijagged::`` ops are not on its list and the broadcast
    product of ``_matmul`` is a mul and a sum."""
    dt = torch.get_autocast_dtype(next(t for t in ts if isinstance(t, torch.Tensor)).device.type)
    return tuple(
        t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t for t in ts
    )


@route(F.linear, torch._C._nn.linear)
def _linear(input, weight, bias=None):
    if isinstance(input, MJT) and _dense(weight) and (bias is None or _dense(bias)):
        if torch.is_autocast_enabled(input.device.type):
            input, weight, bias = _autocast_lower(input, weight, bias)
        if torch.compiler.is_compiling() or not _needs_grad(input, weight, bias):
            return _call(mj.linear.default, input, weight, bias)
        # Eagerly, with gradients, the values bridge lets the dense linear run under torch's own (C++) autograd:
        # cheaper than torch.library's Python autograd wrapper, on the op that dominates models.
        # Dynamo cannot trace the bridge (it reads the subclass's attributes), hence the op above.
        return bridged.linear(input, weight, bias)
    return NotImplemented


@route(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul(input, other, *, out=None):
    if out is not None or input.dim() < 3 or other.dim() < 2:
        return NotImplemented
    if torch.is_autocast_enabled(input.device.type):
        input, other = _autocast_lower(input, other)
    if isinstance(input, MJT) and _dense(other) and other.dim() == 2:
        return _call(mj.linear.default, input, other.t(), None)
    if isinstance(input, MJT) != isinstance(other, MJT) and input.dim() == other.dim():
        # A dense per-sample operand (B, …): bmm's handler (ops/indexing/gather.py, NOTE [ Batched matmul
        # with a dense per-sample operand ]); a dense batch of 1 broadcasts, as in dense matmul.
        if input.dim() > 3:
            mjt = input if isinstance(input, MJT) else other
            raise NotImplementedError(
                f"matmul(): {describe(input)} @ {describe(other)}: a dense per-sample operand of more than 3 dims "
                f"is not supported for layout torch.multi_jagged (batched matmul takes (B, j, D) @ (B, D, E) and "
                f"(B, F, E) @ (B, E, j)); got a multi_jagged operand with ragged dims {mjt._ragged_dims}"
            )
        b = (input if isinstance(input, MJT) else other)._partition.batch
        if _dense(input) and input.shape[0] == 1 and b != 1:
            input = input.expand(b, -1, -1)
        if _dense(other) and other.shape[0] == 1 and b != 1:
            other = other.expand(b, -1, -1)
        return torch.bmm(input, other)
    if isinstance(input, MJT) and isinstance(other, MJT) and input.dim() == other.dim():
        # Square pairs contracting a ragged dim: per-sample products (NOTE [ Contracting a ragged
        # dim ] in ops/contractions/pair_mm.py)
        lead = "abcdefgh"[: input.dim() - 2]
        product = pair_product([lead + "ik", lead + "kj"], [input, other], lead + "ij")
        if product is not None:
            return product
        # Batched matmul whose row, column or contracted dims may be ragged (attention:
        # (B, j0, C) @ (B, C, j0) → (B, j0, j0); (B, j0, j0) @ (B, j0, C) → (B, j0, C)), as the
        # broadcast product summed over the contracted dim. Eagerly this materialises
        # (…, n, k, m); compiled, Inductor fuses the gather, product and sum.
        return (input.unsqueeze(-1) * other.unsqueeze(-3)).sum(-2)
    return NotImplemented


@register_multi_jagged_func(mj.linear.default, "x: mjt, weight: t, bias: t?")
def linear_default(func, x, weight, bias=None):
    v = x._values
    if v.dim() < 2 or x._ragged_dims[-1] == len(x._size) - 1 or v.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear(): expected the last dim of input to be static and equal to weight.shape[-1] = "
            f"{weight.shape[-1]}, got input shape {tuple(x.shape)}"
        )
    return wrap(F.linear(v, weight, bias), x._partition, x._ragged_dims)


@register_multi_jagged_func(mj.linear_param_grads.default, "grad: mjt, x: mjt, weight: any, bias: any")
def linear_param_grads_default(func, grad, x, weight, bias):
    return library._linear_param_grads_dense(grad._values, x._values, weight, bias)
