"""Differentiable crossings between a MultiJaggedTensor and its packed values.

``values_of(x)`` is ``x.values()``; ``wrap_values(values, partition, ragged_dims)`` is the
zero-copy view behind ``from_packed``. Gradients cross unchanged: the packed values *are* the
elements, with no padding.
"""

from __future__ import annotations

import torch

from .structure import Partition
from .tensor import MultiJaggedTensor

__all__ = ["values_of", "wrap_values", "wrap_values_like", "relabel"]


class _ValuesOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: MultiJaggedTensor):  # type: ignore[override]
        ctx.partition, ctx.ragged_dims = x._partition, x._ragged_dims
        return x._values.view_as(x._values)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return MultiJaggedTensor(grad, ctx.partition, ctx.ragged_dims)


class _WrapValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, partition: Partition, ragged_dims):  # type: ignore[override]
        return MultiJaggedTensor(values.view_as(values), partition, ragged_dims)

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):  # type: ignore[override]
        return grad._values, None, None


class _Relabel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: MultiJaggedTensor, partition: Partition):  # type: ignore[override]
        ctx.partition = x._partition
        return MultiJaggedTensor(x._values.view_as(x._values), partition, x._ragged_dims)

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):  # type: ignore[override]
        return MultiJaggedTensor(grad._values, ctx.partition, grad._ragged_dims), None


def relabel(x: MultiJaggedTensor, partition: Partition) -> MultiJaggedTensor:
    """``x`` with the nested ints of an equal-sized ``partition``; differentiable (gradients
    return with x's own nested ints, as the autograd engine checks)."""
    return _Relabel.apply(x, partition)


def values_of(x: MultiJaggedTensor) -> torch.Tensor:
    """Packed ``(T, *static)`` values of ``x``; differentiable."""
    return _ValuesOf.apply(x)


def wrap_values(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]) -> MultiJaggedTensor:
    """A MultiJaggedTensor viewing ``values``; differentiable w.r.t. ``values``."""
    return _WrapValues.apply(values, partition, ragged_dims)


def wrap_values_like(values: torch.Tensor, like: MultiJaggedTensor) -> MultiJaggedTensor:
    """``values`` (same row count as ``like``) with ``like``'s structure; differentiable."""
    if values.shape[0] != like._values.shape[0]:
        raise ValueError(
            f"wrap_values_like(): expected {like._values.shape[0]} packed rows, got {values.shape[0]}"
        )
    return wrap_values(values, like._partition, like._ragged_dims)
