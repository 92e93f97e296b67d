"""``abs``, ``sgn`` and ``softsign`` with derivatives that need no concrete sizes: aten's formulas
record ``sgn``, whose double backward builds zeros of the input's sizes (nested ints here)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._common import MJT
from .._routing import _needs_grad, route


class _AbsReal(torch.autograd.Function):
    """``abs`` with the derivative ``grad · sgn(x)`` taken on a detached x. aten's formula
    records ``x.sgn()``, whose own derivative (``sgn_backward``, reached under
    ``create_graph=True``) builds a zero tensor from the input's concrete sizes, which a
    multi_jagged tensor does not have. sgn is piecewise constant, so detaching it loses nothing."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        ctx.save_for_backward(x)
        return x.abs()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None
        (x,) = ctx.saved_tensors
        return grad * x.detach().sgn()


class _SgnReal(torch.autograd.Function):
    """``sgn`` of a real tensor: derivative 0 (see ``_AbsReal`` for why not aten's formula)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        return x.sgn()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return None if grad is None else torch.zeros_like(grad)


def _sgn_route(fn):
    def routed(input):
        if (
            not isinstance(input, MJT)
            or not input.dtype.is_floating_point
            or torch.compiler.is_compiling()
            or not _needs_grad(input)
        ):
            return NotImplemented
        return fn.apply(input)

    return routed


route(torch.abs, torch.Tensor.abs, torch.absolute, torch.Tensor.absolute)(_sgn_route(_AbsReal))
route(torch.sgn, torch.Tensor.sgn)(_sgn_route(_SgnReal))


@route(F.softsign)
def _softsign(input):
    # F.softsign's body would call abs with the router off (aten's formula, see _AbsReal)
    return input / (input.abs() + 1) if isinstance(input, MJT) else NotImplemented
