"""The values crossings: the packed values of a multi_jagged tensor as a differentiable dense
tensor (``values_of``), and a dense tensor as the values of a new wrapper (``wrap_values``).

NOTE [ Differentiable backward of the bridge ] in ``bridge.py`` says why each crossing's backward
is the other crossing when the gradient itself needs a graph (``create_graph=True``). Imported by
``tensor.py`` once ``MultiJaggedTensor`` is defined, and re-exported there: import these names
from ``tensor``.
"""

from __future__ import annotations

import torch

from .structure import Partition
from .tensor import MultiJaggedTensor
from .writes import WRITE_CLOCK, _eager, check_not_written_through_alias

__all__ = ["values_of", "wrap_values"]


def _graph(grad: torch.Tensor) -> bool:
    # In backward, grad mode is on only under create_graph=True.
    return torch.is_grad_enabled() and grad.requires_grad


class _ValuesOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: MultiJaggedTensor):
        ctx.set_materialize_grads(False)
        ctx.partition, ctx.ragged_dims = x._partition, x._ragged_dims
        return x._values.view_as(x._values)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if grad is None:
            return None
        if 0 in grad.stride() and grad.numel() > 1:
            # An expanded gradient (``values().sum()``'s) would reach aten's view/reshape
            # backward formulas, which reshape in C++ and fail on a non-viewable wrapper with
            # nested-int sizes: materialise it.
            grad = grad.contiguous()
        if _graph(grad):
            return _WrapValues.apply(grad, ctx.partition, ctx.ragged_dims)
        return MultiJaggedTensor(grad, ctx.partition, ctx.ragged_dims)


class _WrapValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, partition: Partition, ragged_dims):
        ctx.set_materialize_grads(False)
        # ``detach``, not a view: a view made here (the forward runs in no-grad mode) of values
        # that require grad could not be read under autograd once an in-place op on the wrapper
        # wrote it ("a view was created in no_grad mode … modified inplace"); the wrapper's own
        # node carries the gradient, and ``detach`` keeps the storage and version counter.
        return MultiJaggedTensor(values.detach(), partition, ragged_dims)

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):
        if grad is None:
            return None, None, None
        return (_ValuesOf.apply(grad) if _graph(grad) else grad._values), None, None


def values_of(x: MultiJaggedTensor) -> torch.Tensor:
    """Packed ``(T, *static)`` values of ``x``; differentiable."""
    # _eager() first: dynamo fails reading x.__dict__ (NOTE [ Own frames under torch.compile ])
    if torch.is_grad_enabled() and _eager() and ("_vgraph" in x.__dict__ or WRITE_CLOCK[0]):
        check_not_written_through_alias(x, "values")  # NOTE [ Writes into shared values ] in writes.py
    return _ValuesOf.apply(x)


def wrap_values(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]) -> MultiJaggedTensor:
    """A MultiJaggedTensor viewing ``values``; differentiable w.r.t. ``values``."""
    return _WrapValues.apply(values, partition, ragged_dims)
