"""``multijagged::pair_matmul``: per-sample matrix products of square ragged pairs (the
triangle multiplicative update), and its packed kernels.

Two levels, as the other structural ops:

* ``pair_matmul(x, y, tx, ty)`` takes multi_jagged square pairs ``(B, …, j0, …, j0, …)`` of
  one structure and static shape and multiplies, per sample and static index, the matrices
  spanned by the two ragged dims (in storage order): ``X' @ Y'`` with ``X' = Xᵀ`` when ``tx``.
  It carries the autograd formula (below), written with ``pair_matmul`` itself, so it
  differentiates to any order and traces under ``torch.compile``. Its handler
  (``ops/contractions/pair_mm.py``) runs one of the packed kernels on the values.
* The packed kernels (NOTE [ Pair matmul contract ] in ``kernels/pair_mm.py``):
  ``pair_matmul_packed`` (the bucketed pure-torch formulation, NOTE [ Bucketed pair matmul ]) and
  ``pair_matmul_triton`` (``kernels/pair_mm_triton.py``), picked by ``pair_matmul_values``
  with the rule of ``kernel_choice.use_triton``. Both are opaque to ``torch.compile`` (fake
  impls give the shape), so the CPU path may plan its groups from host lengths.

Gradients of ``C = X' Y'``: ``dX' = dC Y'ᴴ`` and ``dY' = X'ᴴ dC`` (``ᵀ`` for real dtypes; NOTE
[ Complex gradients ] in ``library.py``), i.e. with ``Ȳ = conj(Y)``, ``X̄ = conj(X)``

    dX = pair_matmul(dC, Ȳ, False, not ty)   if not tx   else   pair_matmul(Ȳ, dC, ty, True)
    dY = pair_matmul(X̄, dC, not tx, False)   if not ty   else   pair_matmul(dC, X̄, True, tx)
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import pair_mm as kpm
from .kernel_choice import use_triton
from .library import LIB, _conj, _no_zero_fill

__all__ = ["pair_matmul_values"]

mj = torch.ops.multijagged

LIB.define("pair_matmul(Tensor x, Tensor y, bool tx, bool ty) -> Tensor")
LIB.define("pair_matmul_packed(Tensor x, Tensor y, Tensor offsets, Tensor lengths, bool tx, bool ty) -> Tensor")


def _pair_matmul_dense(x: Tensor, y: Tensor, tx: bool, ty: bool) -> Tensor:
    """A dense tensor is a pair without ragged dims: the matrices span dims 1 and 2."""
    a = x.transpose(1, 2) if tx else x
    b = y.transpose(1, 2) if ty else y
    return torch.einsum("bik...,bkj...->bij...", a, b)


LIB.impl("pair_matmul", _pair_matmul_dense, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::pair_matmul", _pair_matmul_dense, lib=LIB)


def _packed(x: Tensor, y: Tensor, offsets: Tensor, lengths: Tensor, tx: bool, ty: bool) -> Tensor:
    return kpm.pair_matmul_reference(x, y, offsets, lengths, tx, ty)


def _packed_fake(x: Tensor, y: Tensor, offsets: Tensor, lengths: Tensor, tx: bool, ty: bool) -> Tensor:
    return torch.empty_like(x)


LIB.impl("pair_matmul_packed", _packed, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::pair_matmul_packed", _packed_fake, lib=LIB)

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


def pair_matmul_values(x: Tensor, y: Tensor, offsets: Tensor, lengths: Tensor, max_n, tx: bool, ty: bool) -> Tensor:
    """The packed product of NOTE [ Pair matmul contract ]: the Triton kernel where
    ``use_triton`` says so (float16/bfloat16/float32), the bucketed reference elsewhere."""
    if x.dtype in _FLOAT and use_triton(x):
        from . import triton_pair_mm  # noqa: F401  (registers the op; imports triton)

        return mj.pair_matmul_triton(x, y, offsets, lengths, max_n, tx, ty)
    return mj.pair_matmul_packed(x, y, offsets, lengths, tx, ty)


# --------------------------------------------------------------------------- autograd
def _setup(ctx, inputs, output):
    x, y, tx, ty = inputs
    _no_zero_fill(ctx)
    ctx.flags = (tx, ty)
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, y if ctx.needs_input_grad[0] else None)


def _grads(mm, grad, x, y, tx, ty, need_x, need_y):
    """(dX, dY) of ``C = X' Y'``, with ``mm(a, b, ta, tb)`` the product (the module docstring)."""
    dx = dy = None
    if need_x:
        y = _conj(y)
        dx = mm(grad, y, False, not ty) if not tx else mm(y, grad, ty, True)
    if need_y:
        x = _conj(x)
        dy = mm(x, grad, not tx, False) if not ty else mm(grad, x, True, tx)
    return dx, dy


def _backward(ctx, grad):
    if grad is None:
        return None, None, None, None
    x, y = ctx.saved_tensors
    dx, dy = _grads(mj.pair_matmul, grad, x, y, *ctx.flags, *ctx.needs_input_grad[:2])
    return dx, dy, None, None


torch.library.register_autograd("multijagged::pair_matmul", _backward, setup_context=_setup, lib=LIB)


# The packed kernel has the same formula, with the same offsets and lengths, so that a direct call
# differentiates to any order too (the handler of ``pair_matmul`` calls it below autograd).
def _packed_setup(ctx, inputs, output):
    x, y, offsets, lengths, tx, ty = inputs
    _no_zero_fill(ctx)
    ctx.flags = (tx, ty)
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, y if ctx.needs_input_grad[0] else None, offsets,
                          lengths)


def _packed_backward(ctx, grad):
    if grad is None:
        return None, None, None, None, None, None
    x, y, offsets, lengths = ctx.saved_tensors

    def mm(a, b, ta, tb):
        return mj.pair_matmul_packed(a, b, offsets, lengths, ta, tb)

    dx, dy = _grads(mm, grad, x, y, *ctx.flags, *ctx.needs_input_grad[:2])
    return dx, dy, None, None, None, None


torch.library.register_autograd("multijagged::pair_matmul_packed", _packed_backward, setup_context=_packed_setup,
                                lib=LIB)
