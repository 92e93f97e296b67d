"""Feature transforms over static trailing dims: norms, dropout, ``rrelu`` and ``prelu``. They
keep the structure and run on the packed values; statistics tensors (mean / rstd) share the input's
partition.

NOTE [ Norms under double backward ]

aten's double-backward formulas of ``native_layer_norm_backward`` and
``_fused_rms_norm_backward`` are composites that ``view`` the input as ``(M, N)`` with
M = Π leading sizes — a product with a nested int, which no handler can honour. Eagerly, when a
gradient is needed, ``layer_norm`` / ``rms_norm`` are therefore routed through the values bridge
(the norm runs on the packed ``(T, *static)`` values under torch's own autograd, every order
included). Under ``torch.compile`` ``layer_norm`` keeps the handlers below, which serve
first-order gradients (a double backward there raises from the ``view``). ``rms_norm`` takes the
bridge there too: on CPU aten's ``_fused_rms_norm`` is itself a composite, whose input check
multiplies the sizes before the normalised dims, and traced, the product of two ragged sizes
fails (their hints are nested ints).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import StructureError
from .._table import register_multi_jagged_func
from .. import bridged
from . import ragged as ragged_nn
from .._common import MJT, describe, static_dims, wrap
from .._routing import _dense, _needs_grad, route

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


def _packed(t):
    """The packed values of a statistics tensor (multi_jagged, or already packed)."""
    return t._values if isinstance(t, MJT) else t


@register_multi_jagged_func(aten.native_layer_norm.default, "input: mjt, normalized_shape: any, weight: t?, bias: t?, eps: any")
def native_layer_norm_default(func, x, normalized_shape, weight, bias, eps):
    _check_trailing("layer_norm", x, normalized_shape)
    out, mean, rstd = func(x._values, normalized_shape, weight, bias, eps)
    # mean / rstd have the input's shape with the normalized dims kept as 1 (dense torch's):
    # the input's structure, so a caller reads them per sample like the output.
    return _like(x, out), _like(x, mean), _like(x, rstd)


@register_multi_jagged_func(
    aten.native_layer_norm_backward.default,
    "grad_out: mjt, input: mjt, normalized_shape: any, mean: any, rstd: any, weight: t?, bias: t?, output_mask: any",
)
def native_layer_norm_backward_default(func, grad, x, normalized_shape, mean, rstd, weight, bias, mask):
    gx, gw, gb = func(grad._values, x._values, normalized_shape, _packed(mean), _packed(rstd), weight, bias, mask)
    return (_like(x, gx) if gx is not None else None), gw, gb


@register_multi_jagged_func(aten._fused_rms_norm.default, "input: mjt, normalized_shape: any, weight: t?, eps: any?")
def _fused_rms_norm_default(func, x, normalized_shape, weight=None, eps=None):
    _check_trailing("rms_norm", x, normalized_shape)
    out, rstd = func(x._values, normalized_shape, weight, eps)
    return _like(x, out), _like(x, rstd)  # see native_layer_norm_default


@register_multi_jagged_func(
    aten._fused_rms_norm_backward.default,
    "grad_out: mjt, input: mjt, normalized_shape: any, rstd: any, weight: t?, output_mask: any",
)
def _fused_rms_norm_backward_default(func, grad, x, normalized_shape, rstd, weight, mask):
    gx, gw = func(grad._values, x._values, normalized_shape, _packed(rstd), weight, mask)
    return (_like(x, gx) if gx is not None else None), gw


@register_multi_jagged_func(aten.native_dropout.default, "input: mjt, p: any, train: any?")
def native_dropout_default(func, x, p, train=None):
    out, mask = func(x._values, p, train)
    return _like(x, out), _like(x, mask)


# ----------------------------------------------------------------------------- routes
def _bridged(input, *params) -> bool:
    """Eager, with a gradient to compute: take the values bridge (NOTE [ Norms under double
    backward ])."""
    return (
        isinstance(input, MJT)
        and all(p is None or _dense(p) for p in params)
        and not torch.compiler.is_compiling()
        and _needs_grad(input, *params)
    )


@route(F.layer_norm)
def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if isinstance(input, MJT) and ragged_nn.covers_ragged(input, normalized_shape):
        return ragged_nn.layer_norm_ragged(input, normalized_shape, weight, bias, eps)
    if not _bridged(input, weight, bias):
        return NotImplemented
    _check_trailing("layer_norm", input, normalized_shape)
    return bridged.layer_norm(input, normalized_shape, weight, bias, eps)


@route(torch.layer_norm)
def _torch_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """``torch.layer_norm`` (``F.layer_norm``'s own call, with cuDNN's flag) over ragged dims, as
    ``F.layer_norm``; over static dims the op table (``F.layer_norm`` declines to it)."""
    if isinstance(input, MJT) and ragged_nn.covers_ragged(input, normalized_shape):
        return ragged_nn.layer_norm_ragged(input, normalized_shape, weight, bias, eps)
    return NotImplemented


@route(F.rms_norm, torch.rms_norm)
def _rms_norm(input, normalized_shape, weight=None, eps=None):
    if isinstance(input, MJT) and ragged_nn.covers_ragged(input, normalized_shape):
        return ragged_nn.rms_norm_ragged(input, normalized_shape, weight, eps)
    traced = isinstance(input, MJT) and torch.compiler.is_compiling() and (weight is None or _dense(weight))
    if not (traced or _bridged(input, weight)):  # NOTE [ Norms under double backward ]
        return NotImplemented
    _check_trailing("rms_norm", input, normalized_shape)
    return bridged.rms_norm(input, normalized_shape, weight, eps)


@route(F.rrelu, torch.rrelu)
def _rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False, generator=None):
    """Eval: ``leaky_relu`` with the mean slope. Training: a slope drawn uniformly in
    ``[lower, upper]`` for every negative element (``uniform_`` on the input's structure), 1 for
    the others — the gradient is the slope, as dense torch's."""
    if not isinstance(input, MJT):
        return NotImplemented
    if inplace:  # the out-of-place result written in place, as dense's rrelu_ writes its own
        out = _rrelu(input.clone() if torch.is_grad_enabled() and input.requires_grad else input, lower, upper,
                     training, False, generator)
        return input.copy_(out)
    if not training:
        return F.leaky_relu(input, (lower + upper) / 2)
    slope = torch.empty_like(input).detach().uniform_(lower, upper, generator=generator)
    return torch.where(input >= 0, input, input * slope)


# ----------------------------------------------------------------------------- channel dropout
def _channel_dropout(name: str, ndim: int):
    """``F.dropout1d`` / ``dropout2d`` / ``dropout3d`` of ``(B, C, *spatial)`` with a static channel
    dim: every channel of every sample zeroed with probability ``p``, the rest scaled by
    ``1 / (1 - p)`` — dense torch's ``feature_dropout``, its noise ``(B, C, 1, …)`` broadcast over
    the sample's own spatial sizes (aten's composite multiplies two ragged sizes)."""

    def routed(input, p=0.5, training=True, inplace=False):
        if not isinstance(input, MJT) or input.dim() != ndim:
            return NotImplemented
        if p < 0.0 or p > 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        tokens = input._ragged_dims == (1,) and ndim == 3
        if 1 in input._ragged_dims and not tokens:
            raise ValueError(f"{name}(): the channel dim (dim 1) of {describe(input)} must be static")
        if not training or p == 0.0:
            return input
        if p == 1.0:
            noise = input.new_zeros(())
        elif tokens:
            # (B, j0, C): each sample's rows are its channels, as dense dropout1d of the sample
            # (n, C) zeroes whole rows; a noise value per packed row
            noise = torch.empty_like(input[:, :, :1]).bernoulli_(1 - p).div_(1 - p)
        else:
            shape = (input.shape[0], input.shape[1], *([1] * (ndim - 2)))
            noise = torch.empty(shape, dtype=input.dtype, device=input.device).bernoulli_(1 - p).div_(1 - p)
        return input.mul_(noise) if inplace else input * noise

    return routed


route(F.dropout1d)(_channel_dropout("dropout1d", 3))
route(F.dropout2d)(_channel_dropout("dropout2d", 4))
route(F.dropout3d)(_channel_dropout("dropout3d", 5))


# ----------------------------------------------------------------------------- prelu
@route(F.prelu, torch.prelu)
def _prelu(input, weight):
    """``x`` where ``x > 0``, else ``weight · x``, with ``weight`` of one element or one per channel
    (dim 1, a static dim: images ``(B, C, j0, j1)``), as dense torch."""
    if not isinstance(input, MJT) or isinstance(weight, MJT):
        return NotImplemented
    if weight.numel() != 1:
        if 1 in input._ragged_dims or weight.dim() != 1 or weight.shape[0] != input.shape[1]:
            raise StructureError(
                f"prelu(): expected a weight of 1 element or one per channel (dim 1, static) of {describe(input)}, "
                f"got {tuple(weight.shape)}"
            )
        weight = weight.view(-1, *([1] * (input.dim() - 2)))
    return torch.where(input > 0, input, weight * input)
