"""``multijagged::`` custom op schemas, dense kernels, fake impls and autograd formulas.

NOTE [ Why custom ops ]

Some composite aten ops decompose (``CompositeImplicitAutograd``) into reshapes across the ragged
dims before a subclass sees them (``linear`` → ``view(B·j0, C)``), and some derivative formulas
need per-row data the aten formula cannot express (``unbind`` → ``stack``). The router
(``ops/_routing.py``) sends those calls here. Each op below is an ordinary ``torch.library`` op:

* its *dense* kernel defines it for plain tensors (a dense tensor is a multi_jagged tensor with
  no ragged dims), which is what ``opcheck`` exercises;
* a multi_jagged argument makes the dispatcher call ``MultiJaggedTensor.__torch_dispatch__``,
  where the handler in ``ops/shape/padded.py`` does the work on packed values;
* the autograd formula is written in terms of other ops, so it runs on wrappers and compiles.
"""

from __future__ import annotations

import math
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


def _conj(t):
    """``conj(t)`` materialized (NOTE [ Complex gradients ]); a real tensor as it is, for free."""
    return torch.conj_physical(t) if t.is_complex() else t


def _rows(t):
    """``t`` as a matrix of its last dim's rows; ``reshape(-1, 0)`` cannot infer the row count of
    an empty tensor whose last dim is 0 (a contraction over a zero-sized dim), this can."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _linear_param_grads_dense(grad, x, weight, bias):
    """(grad_weight, grad_bias) over all leading dims; an empty tensor for the one not asked for.
    grad_weight is gradᵀ·conj(x) (NOTE [ Complex gradients ])."""
    g2 = _rows(grad)
    gw = g2.t().mm(_conj(_rows(x))) if weight else g2.new_empty(0)
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
        return grad * _conj((x - result).exp())
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
        return grad * _conj(others)
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

# NOTE [ Undefined gradients ]
#
# An autograd function materialises an undefined output gradient as ``at::zeros(sizes)``, which
# cannot take a multi_jagged tensor's nested-int sizes. Under ``create_graph=True`` undefined
# gradients are common (a formula returns None for an input whose derivative is 0), so every
# formula here turns materialisation off and passes None through. Inputs used only for their
# structure or with a zero derivative are passed detached, so that no edge carries an undefined
# gradient back at all.


# NOTE [ Complex gradients ]
#
# For complex tensors torch's autograd propagates the conjugate Wirtinger derivative: the
# gradient of a holomorphic ``y = f(x)`` is ``grad · conj(f'(x))`` — ``grad @ Wᴴ`` and ``xᴴ @ grad``
# for ``y = x @ W``, ``grad · conj(Π_{l≠k} x_l)`` for a product. Every hand-written formula here
# (and in the handlers that compute them on packed values) therefore multiplies by the *conjugate*
# of an input or saved value; without it the gradient of a complex input comes back conjugated,
# a silently wrong answer since the forward is right. ``_conj`` materializes the conjugate
# (``conj_physical``): a handler runs below the Conjugate dispatch key, where a lazy ``conj()``
# view's bit is ignored by pointwise ops (``g * x.conj()`` would read x unconjugated); for real
# dtypes it returns the tensor itself (no copy, no kernel). A formula that differentiates such a backward again
# conjugates in turn: the adjoint of ``g ↦ g · conj(a)`` is ``gg ↦ gg · a``, and of
# ``x ↦ g · conj(h(x))`` (h holomorphic) it is ``gg ↦ conj(gg) · g · conj(h'(x))``.


def _no_zero_fill(ctx) -> None:
    ctx.set_materialize_grads(False)


def _linear_setup(ctx, inputs, output):
    x, weight, bias = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    if grad is None:
        return None, None, None
    x, weight = ctx.saved_tensors
    # grad @ conj(weight) (NOTE [ Complex gradients ]): linear(grad, wᴴ)
    gx = mj.linear(grad, _conj(weight.t()).contiguous(), None) if ctx.needs_input_grad[0] else None
    need_w = ctx.needs_input_grad[1]
    need_b = ctx.has_bias and ctx.needs_input_grad[2]
    gw = gb = None
    if need_w or need_b:
        # x enters gw only: without it, x is structure only (NOTE [ Undefined gradients ])
        gw, gb = mj.linear_param_grads(grad, x if need_w else x.detach(), need_w, need_b)
    return gx, gw if need_w else None, gb if need_b else None


torch.library.register_autograd("multijagged::linear", _linear_backward, setup_context=_linear_setup, lib=LIB)


def _unbind_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.save_for_backward(inputs[0].detach())  # only its structure is used
    ctx.shapes = [o.shape for o in output]


def _unbind_backward(ctx, grads):
    (x,) = ctx.saved_tensors
    if all(g is None for g in grads):
        return None
    # Unused components get explicit zeros (dense, so they can be made): torch.library's autograd
    # does not see that pack_like's output needs a gradient when its list holds a None, and a
    # double backward through it would silently be 0.
    like = next(g for g in grads if g is not None)
    grads = [like.new_zeros(s) if g is None else g for g, s in zip(grads, ctx.shapes)]
    return mj.pack_like(grads, x)


torch.library.register_autograd("multijagged::unbind", _unbind_backward, setup_context=_unbind_setup, lib=LIB)


def _pack_like_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.count = len(inputs[0])


def _pack_like_backward(ctx, grad):
    if grad is None:
        return [None] * ctx.count, None
    return list(mj.unbind(grad)), None


torch.library.register_autograd("multijagged::pack_like", _pack_like_backward, setup_context=_pack_like_setup, lib=LIB)


def _to_padded_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.save_for_backward(inputs[0].detach())  # only its structure is used


def _to_padded_backward(ctx, grad):
    if grad is None:
        return None, None, None
    (x,) = ctx.saved_tensors
    return mj.from_padded_like(grad, x), None, None


torch.library.register_autograd("multijagged::to_padded", _to_padded_backward, setup_context=_to_padded_setup, lib=LIB)


def _from_padded_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.shape = inputs[0].shape


def _from_padded_backward(ctx, grad):
    if grad is None:
        return None, None
    return mj.to_padded(grad, 0.0, list(ctx.shape)), None


torch.library.register_autograd(
    "multijagged::from_padded_like", _from_padded_backward, setup_context=_from_padded_setup, lib=LIB
)


def _reduce_setup(ctx, inputs, output):
    x, kind, dim, keepdim = inputs
    _no_zero_fill(ctx)
    # result matters to the second derivative of logsumexp only (NOTE [ Double backward ])
    ctx.save_for_backward(x, output if kind == "logsumexp" else output.detach())
    ctx.args = (kind, dim, keepdim)


def _reduce_backward(ctx, grad):
    if grad is None:
        return None, None, None, None
    x, result = ctx.saved_tensors
    kind = ctx.args[0]
    # x matters to the second derivative of logsumexp and prod only
    x = x if kind in ("logsumexp", "prod") else x.detach()
    return mj.reduce_backward(grad, x, result, *ctx.args), None, None, None


torch.library.register_autograd("multijagged::reduce", _reduce_backward, setup_context=_reduce_setup, lib=LIB)


# NOTE [ Double backward ]
#
# Every ``multijagged::`` op has an autograd formula: torch's fallback for an op without one
# returns *no* gradient (a warning and zeros), which would be a silently wrong second derivative.
# The formulas below are written with other ``multijagged::`` ops and pointwise ops, which are
# differentiable in turn, so third and higher orders are right too or raise.
#
# ``reduce_backward`` is linear in ``grad``: gi = gather(grad) · local(x, result), where
# local = reduce_backward(1, x, result) is the kind's local derivative. Hence
#   d/dgrad   = reduce(gg · local, "sum")   (for sum: reduce(gg, "sum"); not reduce(gg, "mean")
#               for mean, which is 0/0 = nan over an empty extent where the adjoint is 0)
#   d/dx      = 0 for sum, mean, amax, amin (local is constant in x almost everywhere);
#               gg · gi for logsumexp (local = exp(x − result));
#               for prod, Σ_{j≠k} gg_j · g · Π_{l≠j,k} x_l — see ``_prod_double_backward``
#   d/dresult = 0, except −reduce_sum(gg · gi) for logsumexp.


def _reduce_backward_setup(ctx, inputs, output):
    grad, x, result, kind, dim, keepdim = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, x, result, output)
    ctx.args = (kind, dim, keepdim)


def _reduce_backward_backward(ctx, gg):
    if gg is None:
        return None, None, None, None, None, None
    grad, x, result, gi = ctx.saved_tensors
    kind, dim, keepdim = ctx.args
    need_grad, need_x, need_result = ctx.needs_input_grad[:3]
    d_grad = d_x = d_result = None
    if kind == "sum":
        if need_grad:
            d_grad = mj.reduce(gg, "sum", dim, keepdim)
        return d_grad, None, None, None, None, None
    local = None
    if need_grad or (kind == "prod" and need_x):
        # the local derivative depends on x (differentiably) for logsumexp and prod only
        lx, lr = (x, result) if kind in ("logsumexp", "prod") else (x.detach(), result.detach())
        local = mj.reduce_backward(torch.ones_like(grad), lx, lr, kind, dim, keepdim)
    # local is the conjugate of the local derivative for a complex x (NOTE [ Complex gradients ]),
    # and gi = gather(grad) · conj(local derivative) is antiholomorphic in x: conj(gg) below
    if need_grad:
        d_grad = mj.reduce(gg * _conj(local), "sum", dim, keepdim)
    if kind == "logsumexp":
        if need_x:
            d_x = _conj(gg) * gi
        if need_result:
            d_result = -mj.reduce(_conj(gg) * gi, "sum", dim, keepdim)
    elif kind == "prod" and need_x:
        d_x = _prod_double_backward(gg, grad, x, result, local, dim, keepdim)
    return d_grad, d_x, d_result, None, None, None


def _prod_double_backward(gg, grad, x, result, others, dim, keepdim):
    """d/dx_k of Σ_j gg_j · g · Π_{l≠j} x_l  =  g · Σ_{j≠k} gg_j · Π_{l≠j,k} x_l (real x).

    Without zeros in the segment this is g · (S − gg_k · others_k) / x_k with
    S = Σ_j gg_j · others_j; with a zero the division is undefined and the exact form needs the
    segment's zero count, which this formula does not carry: raise rather than return a wrong
    number. For a complex x, ``others`` holds conj(Π_{l≠k} x_l) and the first backward is
    antiholomorphic in x, so gg and x enter conjugated (NOTE [ Complex gradients ]):
    g · Σ_{j≠k} conj(gg_j) · conj(Π_{l≠j,k} x_l)."""
    # SYNC: one host read, on the double-backward path only, to refuse what this formula
    # cannot compute exactly.
    if bool((x == 0).any()):
        raise NotImplementedError(
            "prod(): double backward w.r.t. the input is not supported for layout torch.multi_jagged "
            "when the reduced elements contain zeros"
        )
    gg, xc = _conj(gg), _conj(x)
    s = mj.reduce_backward(mj.reduce(gg * others, "sum", dim, keepdim), x, result, "sum", dim, keepdim)
    g = mj.reduce_backward(grad, x, result, "sum", dim, keepdim)
    return g * (s - gg * others) / xc


torch.library.register_autograd(
    "multijagged::reduce_backward", _reduce_backward_backward, setup_context=_reduce_backward_setup, lib=LIB
)


def _linear_param_grads_setup(ctx, inputs, output):
    grad, x, weight, bias = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, x)
    ctx.flags = (weight, bias)


def _linear_param_grads_backward(ctx, ggw, ggb):
    """gw = gradᵀ·conj(x) and gb = Σ grad over rows: d/dgrad = x·ggwᵀ + ggb, d/dx = grad·conj(ggw)
    (antiholomorphic in x: NOTE [ Complex gradients ])."""
    grad, x = ctx.saved_tensors
    weight, bias = ctx.flags
    ggw = ggw if weight else None  # the output not asked for is an empty placeholder
    ggb = ggb if bias else None
    d_grad = d_x = None
    if ctx.needs_input_grad[0]:
        if ggw is not None:
            d_grad = mj.linear(x, ggw, ggb)
        elif ggb is not None:
            d_grad = torch.zeros_like(grad) + ggb
    if ctx.needs_input_grad[1] and ggw is not None:
        d_x = mj.linear(grad, _conj(ggw.t()).contiguous(), None)
    return d_grad, d_x, None, None


torch.library.register_autograd(
    "multijagged::linear_param_grads",
    _linear_param_grads_backward,
    setup_context=_linear_param_grads_setup,
    lib=LIB,
)
