"""``embedding`` and ``embedding_bag`` with a multi_jagged index: the dense op on the packed
indices (NOTE [ Indices on packed rows ] in ``gather.py``), the index's structure with the
embedding dim after it; ``embedding_bag`` bags each sample's indices."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ...tensor import values_of, wrap_values
from .._table import register_multi_jagged_func
from .._common import MJT, describe, wrap
from .._routing import route

aten = torch.ops.aten

__all__: list[str] = []

_LAYOUT = "layout torch.multi_jagged"


# --------------------------------------------------------------------------- embedding
@register_multi_jagged_func(
    aten.embedding.default, "weight: t, indices: mjt, padding_idx: any?, scale_grad_by_freq: any?, sparse: any?"
)
def embedding_default(func, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``(B, *, j…)`` integer indices → ``(B, *, j…, D)``: the dense op on the packed indices; the
    embedding dim is a new last static dim, so the partition is unchanged."""
    if sparse and weight.requires_grad:
        # aten's sparse gradient (embedding_sparse_backward) reshapes the indices across the ragged dims
        raise NotImplementedError(f"embedding(): sparse=True gradients are not supported for {_LAYOUT}; use sparse=False")
    out = func(weight, indices._values, padding_idx, scale_grad_by_freq, sparse)
    return wrap(out, indices._partition, indices._ragged_dims)


@route(F.embedding)
def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """The dense op on the packed indices under autograd (``wrap_values``): the weight's gradient
    is aten's on dense tensors, so it differentiates again (a second-order gradient reaches the
    weight, as dense's); the handler above serves calls below autograd."""
    if not isinstance(input, MJT) or isinstance(weight, MJT):
        return NotImplemented
    if sparse and weight.requires_grad:
        raise NotImplementedError(f"embedding(): sparse=True gradients are not supported for {_LAYOUT}; use sparse=False")
    out = F.embedding(input._values, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    return wrap_values(out, input._partition, input._ragged_dims)


@register_multi_jagged_func(
    aten.embedding_dense_backward.default,
    "grad_output: mjt, indices: mjt, num_weights: any, padding_idx: any, scale_grad_by_freq: any",
)
def embedding_dense_backward_default(func, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    return func(grad_output._values, indices._values, num_weights, padding_idx, scale_grad_by_freq)


@register_multi_jagged_func(aten.embedding_renorm_.default, "self: t, indices: mjt, max_norm: any, norm_type: any")
def embedding_renorm__default(func, weight, indices, max_norm, norm_type):
    # F.embedding(max_norm=…) renormalises the looked-up rows of the (dense) weight in place
    return func(weight, indices._values, max_norm, norm_type)


# --------------------------------------------------------------------------- embedding_bag
_BAG_OPS = [aten._embedding_bag.default, aten._embedding_bag_forward_only.default]


def _bag_structure(op: str, indices: MJT) -> None:
    nd = len(indices._size)
    if indices._ragged_dims != tuple(range(1, nd)) or indices._values.dim() != 1:
        raise ValueError(
            f"{op}(): expected a multi_jagged input whose dims after the batch are all ragged, "
            f"(B, j0) or (B, j0, j1), got {describe(indices)} with ragged dims {indices._ragged_dims}"
        )


@register_multi_jagged_func(_BAG_OPS, "weight: t, indices: mjt, offsets: t, ...")
def _embedding_bag_default(func, weight, indices, offsets, *args):
    """Bags along the last ragged dim (``offsets`` are its segments, from the route). For
    ``(B, j0)`` the result is dense ``(B, D)`` as torch.jagged's; with more ragged dims it keeps
    the others: ``(B, j0, j1)`` → ``(B, j0, D)``."""
    args = list(args)
    # args: scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx
    if len(args) > 3 and isinstance(args[3], MJT):
        args[3] = args[3]._values
    out, offset2bag, bag_size, max_indices = func(weight, indices._values, offsets, *args)
    if len(indices._size) > 2:
        sub = indices._partition.map_to_sub(tuple(range(len(indices._size) - 2)))[1]
        out = wrap(out, sub, indices._ragged_dims[:-1])
    return out, offset2bag, bag_size, max_indices


def _unwrapped(args) -> list:
    return [a._values if isinstance(a, MJT) else a for a in args]


@register_multi_jagged_func(aten._embedding_bag_backward.default, "grad: any, indices: any, offsets: t, ...")
def _embedding_bag_backward_default(func, *args):
    # the indices and per_sample_weights saved by the forward may be multi_jagged; the gradient
    # of a multi-ragged input's bags is too: all are packed in the same order as the bags
    return func(*_unwrapped(args))


@register_multi_jagged_func(
    aten._embedding_bag_per_sample_weights_backward.default, "grad: any, weight: t, indices: any, offsets: t, ..."
)
def _embedding_bag_per_sample_weights_backward_default(func, grad, weight, indices, *args):
    out = func(*_unwrapped((grad, weight, indices, *args)))
    if not isinstance(indices, MJT):
        raise AssertionError("per_sample_weights gradient without the multi_jagged indices' structure")
    return wrap(out, indices._partition, indices._ragged_dims)


_MODES = {"sum": 0, "mean": 1, "max": 2}


@route(F.embedding_bag)
def _embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                   mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """A multi_jagged ``(B, j0)`` input is B bags, as torch.jagged's. F.embedding_bag itself would
    take it for a dense ``(B, N)`` batch (``is_nested`` is False for this layout) and build
    ``arange(0, numel, input.size(1))`` from the nested int (the ``guard_int`` AttributeError)."""
    if isinstance(weight, MJT) and weight.dtype == torch.long and isinstance(input, torch.Tensor) and input.is_floating_point():
        # the deprecated order embedding_bag(weight, input), which F.embedding_bag still accepts
        warnings.warn("Argument order of nn.functional.embedding_bag was changed.", stacklevel=2)
        weight, input = input, weight
    if not isinstance(input, MJT):
        return NotImplemented
    if input.is_floating_point() or input.dtype == torch.bool:
        raise ValueError(f"embedding_bag(): expected integer indices, got {input.dtype}")
    if offsets is not None:
        raise ValueError("embedding_bag(): expected offsets=None for a multi_jagged input (its rows are the bags)")
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    if per_sample_weights is not None:
        if not isinstance(per_sample_weights, MJT):
            raise ValueError("If input is nested, then per_sample_weights must be nested if specified")
        if mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for "
                f"mode='sum' (got mode='{mode}')."
            )
    if mode not in _MODES:
        raise ValueError("mode has to be one of sum, mean or max")
    if mode == "max" and (scale_grad_by_freq or sparse):
        raise ValueError("max mode does not support scaling the gradient by the frequency or sparse weights")
    nd = len(input._size)
    if nd > 2 and input._ragged_dims == tuple(range(1, nd - 1)):
        # a static last dim: each sample is dense's 2-D input, a bag of that many ids per row
        # (multi-hot fields of a history), so every packed row is a bag
        psw = None
        if per_sample_weights is not None:
            if not (per_sample_weights._partition.same_as(input._partition) and per_sample_weights.shape[-1] == input.shape[-1]
                    and per_sample_weights._ragged_dims == input._ragged_dims):
                raise ValueError(f"embedding_bag(): expected per_sample_weights of the input's structure {describe(input)}, "
                                 f"got {describe(per_sample_weights)}")
            psw = values_of(per_sample_weights)
        out = F.embedding_bag(values_of(input), weight, None, max_norm, norm_type, scale_grad_by_freq, mode, sparse, psw,
                              include_last_offset, padding_idx)
        return wrap_values(out, input._partition, input._ragged_dims)
    _bag_structure("embedding_bag", input)
    if per_sample_weights is not None and not (
        per_sample_weights._partition.same_as(input._partition) and per_sample_weights._ragged_dims == input._ragged_dims
    ):
        raise ValueError(
            f"embedding_bag(): expected per_sample_weights of the input's structure {describe(input)}, "
            f"got {describe(per_sample_weights)}"
        )
    if max_norm is not None:
        with torch.no_grad():
            torch.embedding_renorm_(weight, input, max_norm, norm_type)
    cu = input._partition.offsets if len(input._size) == 2 else input._partition.segments()[0]
    # torch.embedding_bag's composite body calls aten._embedding_bag (handler above) with the
    # multi_jagged indices, so aten's own derivatives run (weight and per_sample_weights).
    return torch.embedding_bag(weight, input, cu, scale_grad_by_freq, _MODES[mode], sparse,
                               per_sample_weights, True, padding_idx)[0]
