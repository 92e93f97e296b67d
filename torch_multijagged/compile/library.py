"""``multijagged::`` custom op schemas, dense kernels, fake impls and autograd formulas.

NOTE [ Why custom ops ]

Some composite aten ops decompose (``CompositeImplicitAutograd``) into reshapes across the ragged
dims before a subclass sees them (``linear`` → ``view(B·j0, C)``), and some derivative formulas
need per-row data the aten formula cannot express (``unbind`` → ``stack``). The router
(``ops/routes.py``) sends those calls here. Each op below is an ordinary ``torch.library`` op:

* its *dense* kernel defines it for plain tensors (a dense tensor is a multi_jagged tensor with
  no ragged dims), which is what ``opcheck`` exercises;
* a multi_jagged argument makes the dispatcher call ``MultiJaggedTensor.__torch_dispatch__``,
  where the handler in ``ops/custom.py`` does the work on packed values;
* the autograd formula is written in terms of other ops, so it runs on wrappers and compiles.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = ["LIB"]

LIB = torch.library.Library("multijagged", "DEF")

LIB.define("linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")
LIB.define("linear_param_grads(Tensor grad, Tensor x, bool weight, bool bias) -> (Tensor, Tensor)")
LIB.define("unbind(Tensor x) -> Tensor[]")
LIB.define("pack_like(Tensor?[] components, Tensor like) -> Tensor")
LIB.define("to_padded(Tensor x, float padding, SymInt[]? output_size=None) -> Tensor")
LIB.define("from_padded_like(Tensor padded, Tensor like) -> Tensor")
LIB.define("reduce(Tensor x, str kind, int[]? dim, bool keepdim) -> Tensor")
LIB.define(
    "reduce_backward(Tensor grad, Tensor x, Tensor result, str kind, int[]? dim, bool keepdim) -> Tensor"
)


# --------------------------------------------------------------------------- dense kernels
def _linear_dense(x, weight, bias=None):
    return F.linear(x, weight, bias)


def _linear_param_grads_dense(grad, x, weight, bias):
    """(grad_weight, grad_bias) over all leading dims; an empty tensor for the one not asked for."""
    g2 = grad.reshape(-1, grad.shape[-1])
    gw = g2.t().mm(x.reshape(-1, x.shape[-1])) if weight else g2.new_empty(0)
    return gw, g2.sum(0) if bias else g2.new_empty(0)


def _unbind_dense(x):
    return [t.clone() for t in x.unbind(0)]


def _pack_like_dense(components: Sequence[Optional[torch.Tensor]], like):
    return torch.stack([torch.zeros_like(l) if c is None else c for c, l in zip(components, like.unbind(0))])


def _to_padded_dense(x, padding, output_size=None):
    if output_size is not None and tuple(output_size) != tuple(x.shape):
        return F.pad(x, [p for d in reversed(range(x.dim())) for p in (0, output_size[d] - x.shape[d])], value=padding)
    return x.clone()


def _from_padded_like_dense(padded, like):
    return padded[tuple(slice(0, s) for s in like.shape)].clone()


REDUCTIONS = ("sum", "mean", "amax", "amin", "prod", "logsumexp")


def _dims(x, dim):
    return list(range(x.dim())) if dim is None else [d % x.dim() for d in dim]


def _reduce_dense(x, kind, dim=None, keepdim=False):
    dims = _dims(x, dim)
    if kind == "prod":
        for d in sorted(dims, reverse=True):
            x = x.prod(d, keepdim=True)
        return x if keepdim else x.reshape([s for i, s in enumerate(x.shape) if i not in dims])
    if kind == "logsumexp":
        return torch.logsumexp(x, dims, keepdim=keepdim)
    return getattr(torch, kind)(x, dims, keepdim=keepdim)


def _reduce_backward_dense(grad, x, result, kind, dim=None, keepdim=False):
    """d reduce / d x, written out (no autograd inside a kernel: it must also run on fakes)."""
    dims = _dims(x, dim)
    if not keepdim:
        for d in sorted(dims):
            grad, result = grad.unsqueeze(d), result.unsqueeze(d)
    if kind == "sum":
        return grad.expand_as(x).clone()
    if kind == "mean":
        n = 1
        for d in dims:
            n *= x.shape[d]
        return (grad / n).expand_as(x).clone()
    if kind == "logsumexp":
        return grad * (x - result).exp()
    if kind in ("amax", "amin"):
        hit = (x == result).to(x.dtype)
        return grad * hit / hit.sum(dims, keepdim=True)
    if kind == "prod":
        zero = x == 0
        nonzero = torch.where(zero, torch.ones_like(x), x)
        nonzero_prod = nonzero.prod(dims[0], keepdim=True) if len(dims) == 1 else _reduce_dense(nonzero, "prod", dims, True)
        zeros = zero.to(x.dtype).sum(dims, keepdim=True)
        others = torch.where(
            zeros == 0, nonzero_prod / nonzero, torch.where((zeros == 1) & zero, nonzero_prod, torch.zeros_like(x))
        )
        return grad * others
    raise ValueError(f"reduce_backward(): expected kind in {REDUCTIONS}, got {kind!r}")


for _name, _fn in [
    ("reduce", _reduce_dense),
    ("reduce_backward", _reduce_backward_dense),
    ("linear", _linear_dense),
    ("linear_param_grads", _linear_param_grads_dense),
    ("unbind", _unbind_dense),
    ("pack_like", _pack_like_dense),
    ("to_padded", _to_padded_dense),
    ("from_padded_like", _from_padded_like_dense),
]:
    LIB.impl(_name, _fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"multijagged::{_name}", _fn, lib=LIB)


# --------------------------------------------------------------------------- autograd
mj = torch.ops.multijagged


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    gx = mj.linear(grad, weight.t().contiguous(), None) if ctx.needs_input_grad[0] else None
    need_w = ctx.needs_input_grad[1]
    need_b = ctx.has_bias and ctx.needs_input_grad[2]
    gw = gb = None
    if need_w or need_b:
        gw, gb = mj.linear_param_grads(grad, x, need_w, need_b)
    return gx, gw if need_w else None, gb if need_b else None


torch.library.register_autograd("multijagged::linear", _linear_backward, setup_context=_linear_setup, lib=LIB)


def _unbind_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])  # only its structure is used


def _unbind_backward(ctx, grads):
    (x,) = ctx.saved_tensors
    return mj.pack_like(list(grads), x)


torch.library.register_autograd("multijagged::unbind", _unbind_backward, setup_context=_unbind_setup, lib=LIB)


def _pack_like_setup(ctx, inputs, output):
    pass


def _pack_like_backward(ctx, grad):
    return list(mj.unbind(grad)), None


torch.library.register_autograd("multijagged::pack_like", _pack_like_backward, setup_context=_pack_like_setup, lib=LIB)


def _to_padded_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _to_padded_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return mj.from_padded_like(grad, x), None, None


torch.library.register_autograd("multijagged::to_padded", _to_padded_backward, setup_context=_to_padded_setup, lib=LIB)


def _from_padded_setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape


def _from_padded_backward(ctx, grad):
    return mj.to_padded(grad, 0.0, list(ctx.shape)), None


torch.library.register_autograd(
    "multijagged::from_padded_like", _from_padded_backward, setup_context=_from_padded_setup, lib=LIB
)


def _reduce_setup(ctx, inputs, output):
    x, kind, dim, keepdim = inputs
    ctx.save_for_backward(x, output)
    ctx.args = (kind, dim, keepdim)


def _reduce_backward(ctx, grad):
    x, result = ctx.saved_tensors
    return mj.reduce_backward(grad, x, result, *ctx.args), None, None, None


torch.library.register_autograd("multijagged::reduce", _reduce_backward, setup_context=_reduce_setup, lib=LIB)
