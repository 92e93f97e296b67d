"""Feature transforms over static trailing dims: norms and dropout. They keep the structure and
run on the packed values; statistics tensors (mean / rstd) share the input's partition."""

from __future__ import annotations

import torch

from . import register_multi_jagged_func
from ._common import MJT, describe, static_dims, wrap

aten = torch.ops.aten


def _check_trailing(op: str, x: MJT, normalized_shape) -> None:
    n = len(normalized_shape)
    stat = static_dims(len(x._size), x._ragged_dims)
    if n and (n > len(stat) or stat[-n:] != tuple(range(len(x._size) - n, len(x._size)))):
        raise ValueError(
            f"{op}(): expected normalized_shape {list(normalized_shape)} to cover static trailing dims "
            f"of {describe(x)}"
        )


def _like(x: MJT, v: torch.Tensor):
    return wrap(v, x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.native_layer_norm.default, "input: mjt, normalized_shape: any, weight: t?, bias: t?, eps: any")
def native_layer_norm_default(func, x, normalized_shape, weight, bias, eps):
    _check_trailing("layer_norm", x, normalized_shape)
    out, mean, rstd = func(x._values, normalized_shape, weight, bias, eps)
    # mean / rstd are not differentiable outputs (derivatives.yaml) and only come back to the
    # backward below: they stay packed, which saves two wrapper constructions per call.
    return _like(x, out), mean, rstd


@register_multi_jagged_func(
    aten.native_layer_norm_backward.default,
    "grad_out: mjt, input: mjt, normalized_shape: any, mean: t, rstd: t, weight: t?, bias: t?, output_mask: any",
)
def native_layer_norm_backward_default(func, grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    gx, gw, gb = func(grad._values, x._values, normalized_shape, mean, rstd, weight, bias, mask)
    return (_like(x, gx) if gx is not None else None), gw, gb


@register_multi_jagged_func(aten._fused_rms_norm.default, "input: mjt, normalized_shape: any, weight: t?, eps: any?")
def _fused_rms_norm_default(func, x, normalized_shape, weight=None, eps=None):
    _check_trailing("rms_norm", x, normalized_shape)
    out, rstd = func(x._values, normalized_shape, weight, eps)
    return _like(x, out), rstd  # see native_layer_norm_default


@register_multi_jagged_func(
    aten._fused_rms_norm_backward.default,
    "grad_out: mjt, input: mjt, normalized_shape: any, rstd: t, weight: t?, output_mask: any",
)
def _fused_rms_norm_backward_default(func, grad, x, normalized_shape, rstd, weight, mask):
    gx, gw = func(grad._values, x._values, normalized_shape, rstd, weight, mask)
    return (_like(x, gx) if gx is not None else None), gw


@register_multi_jagged_func(aten.native_dropout.default, "input: mjt, p: any, train: any?")
def native_dropout_default(func, x, p, train=None):
    out, mask = func(x._values, p, train)
    return _like(x, out), _like(x, mask)
