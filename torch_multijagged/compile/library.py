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
LIB.define("linear_param_grads(Tensor grad, Tensor x) -> (Tensor, Tensor)")
LIB.define("unbind(Tensor x) -> Tensor[]")
LIB.define("pack_like(Tensor?[] components, Tensor like) -> Tensor")
LIB.define("to_padded(Tensor x, float padding, SymInt[]? output_size=None) -> Tensor")
LIB.define("from_padded_like(Tensor padded, Tensor like) -> Tensor")
LIB.define("mean_scale(Tensor x, int[] dim, bool keepdim) -> Tensor")
LIB.define("reduce(Tensor x, str kind, int[]? dim, bool keepdim) -> Tensor")
LIB.define("expand_like(Tensor grad, Tensor like, int[]? dim, bool keepdim) -> Tensor")


# --------------------------------------------------------------------------- dense kernels
def _linear_dense(x, weight, bias=None):
    return F.linear(x, weight, bias)


def _linear_param_grads_dense(grad, x):
    g2 = grad.reshape(-1, grad.shape[-1])
    return g2.t().mm(x.reshape(-1, x.shape[-1])), g2.sum(0)


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


def _mean_scale_dense(x, dim, keepdim):
    n = 1
    for d in dim:
        n *= x.shape[d]
    shape = [1 if d in dim or d - x.dim() in dim else s for d, s in enumerate(x.shape)]
    if not keepdim:
        shape = [s for d, s in enumerate(shape) if not (d in dim or d - x.dim() in dim)]
    return x.new_full(shape, 1.0 / n)


def _reduce_dense(x, kind, dim=None, keepdim=False):
    dims = list(range(x.dim())) if dim is None else list(dim)
    if kind in ("sum", "mean"):
        return getattr(torch, kind)(x, dims, keepdim=keepdim)
    return getattr(torch, kind)(x, dims, keepdim=keepdim)


def _expand_like_dense(grad, like, dim=None, keepdim=False):
    dims = sorted(d % like.dim() for d in (range(like.dim()) if dim is None else dim))
    if not keepdim:
        for d in dims:
            grad = grad.unsqueeze(d)
    return grad.expand(like.shape).clone()


for _name, _fn in [
    ("reduce", _reduce_dense),
    ("expand_like", _expand_like_dense),
    ("mean_scale", _mean_scale_dense),
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
    gw = gb = None
    if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
        gw, gb = mj.linear_param_grads(grad, x)
    return gx, gw, gb if ctx.has_bias else None


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
    ctx.save_for_backward(x)
    ctx.args = (kind, dim, keepdim)


def _reduce_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    kind, dim, keepdim = ctx.args
    if kind not in ("sum", "mean"):
        raise NotImplementedError(f"multijagged::reduce: no derivative for {kind!r} yet")
    if kind == "mean":
        grad = grad * mj.mean_scale(x.detach(), list(range(x.dim())) if dim is None else dim, keepdim)
    return mj.expand_like(grad, x, dim, keepdim), None, None, None


torch.library.register_autograd("multijagged::reduce", _reduce_backward, setup_context=_reduce_setup, lib=LIB)
