"""``abs``, ``sgn``, ``softsign``, ``special.i0e`` / ``i1e``, ``copysign`` and ``nextafter`` with
derivatives that need no concrete sizes: aten's formulas record ``sgn``, whose double backward
builds zeros of the input's sizes (nested ints here), and give ``copysign``'s / ``nextafter``'s
``other`` a zero tensor of its sizes. Eagerly and under ``torch.compile`` alike (dynamo traces the
Functions; aten's formulas failed there too, asking for the sizes)."""

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
            or not _needs_grad(input)
        ):
            return NotImplemented
        return fn.apply(input)

    return routed


def _scaled_bessel(fn, derivative):
    """``fn`` (``special.i0e`` / ``i1e``) as a Function whose backward is ``derivative(grad, x)``:
    aten's formula with its ``sgn`` taken on a detached x (see ``_AbsReal``), the rest recorded,
    so that every order is differentiable."""

    class _Bessel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x)
            return fn(x)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            if grad is None:
                return None
            (x,) = ctx.saved_tensors
            return derivative(grad, x)

    return _Bessel


def _i0e_grad(grad, x):
    """``grad · (i1e(x) − sgn(x) · i0e(x))``."""
    return grad * (torch.special.i1e(x) - x.detach().sgn() * torch.special.i0e(x))


def _i1e_grad(grad, x):
    """aten's ``i1e_backward``: ``grad / 2`` at 0, else ``grad · (i0e(x) − i1e(x) · (sgn(x) + 1 / x))``."""
    zero = x.detach() == 0
    # 1 / x where x is 0 would be inf in the branch ``where`` drops, and its derivative
    # (−1 / x²) would make the second derivative 0 · inf = NaN there: take 1 / 1 instead
    safe = torch.where(zero, torch.ones_like(x), x)
    slope = torch.special.i0e(x) - torch.special.i1e(x) * (x.detach().sgn() + safe.reciprocal())
    return torch.where(zero, grad * 0.5, grad * slope)


_I0e = _scaled_bessel(torch.special.i0e, _i0e_grad)
_I1e = _scaled_bessel(torch.special.i1e, _i1e_grad)


route(torch.abs, torch.Tensor.abs, torch.absolute, torch.Tensor.absolute)(_sgn_route(_AbsReal))
route(torch.special.i0e)(_sgn_route(_I0e))
route(torch.special.i1e)(_sgn_route(_I1e))
route(torch.sgn, torch.Tensor.sgn)(_sgn_route(_SgnReal))


@route(F.softsign)
def _softsign(input):
    # F.softsign's body would call abs with the router off (aten's formula, see _AbsReal)
    return input / (input.abs() + 1) if isinstance(input, MJT) else NotImplemented


class _ZeroDerivative(torch.autograd.Function):
    """``out`` — the op computed from ``other`` detached — with ``other`` an input again, of zero
    derivative: dense autograd's ``copysign`` / ``nextafter`` give ``other`` zeros of its sizes
    (``at::_efficientzerotensor``, a factory that cannot take nested ints), here ``zeros_like``,
    which the op table builds. The output requires grad whenever ``other`` does, as dense's."""

    @staticmethod
    def forward(ctx, out, other):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.other = other.detach()
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, torch.zeros_like(ctx.other)


def _zero_derivative_route(fn):
    """``fn(input, other)`` whose derivative in ``other`` is zero: ``other`` detached when it is
    multi_jagged and requires grad (off the eager values path: a dense operand broadcast over
    ragged dims, or an op the path does not take)."""

    def routed(input, other, *, out=None):
        if out is not None or not isinstance(other, MJT) or not _needs_grad(other):
            return NotImplemented
        return _ZeroDerivative.apply(fn(input, other.detach()), other)

    return routed


route(torch.copysign, torch.Tensor.copysign)(_zero_derivative_route(torch.copysign))
route(torch.nextafter, torch.Tensor.nextafter)(_zero_derivative_route(torch.nextafter))
