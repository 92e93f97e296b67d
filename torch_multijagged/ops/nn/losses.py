"""Losses on multi_jagged inputs: routes that write each loss with elementwise ops, ``log_softmax``
and ``gather`` over a static dim, and a reduction, as dense torch defines it (``torch.jagged``
has no handler for these aten ops).

``reduction="mean"`` averages over every element that exists — the mean over the concatenated
samples, as dense torch on the packed values — and ``"sum"`` sums them; both give a dense scalar.
``cross_entropy`` / ``nll_loss`` with class indices divide by the summed target weights of the
positions not ignored, as dense torch's weighted mean. For a per-sample mean, take
``reduction="none"`` and ``.mean(dim=...)`` over the sample's dims (README, Losses). Written with
differentiable ops, so gradients reach input and target, to any order, and the routes trace
under ``torch.compile``.

NOTE [ Class dim of cross_entropy ]

Dense torch's class dim is dim 1 of ``(N, C, d1, …)``, with targets ``(N, d1, …)``. We follow it
exactly: a multi_jagged ``(B, C, j0)`` input takes ``(B, j0)`` class indices (per sample, dense
torch on ``(1, C, n)``). Token logits are usually ``(B, j0, C)``, whose dim 1 is the ragged dim:
no class dim can be ragged, so that call raises and says to pass ``logits.transpose(1, 2)``
(a view), as dense code does for ``(N, d, C)`` logits — never a silent reinterpretation.

NOTE [ Class losses on the packed values ]

The class dim is static and the first static dim, so the packed values of a ``(B, C, …)`` input
are ``(T, C, *rest)``: dense torch's ``(N, C, d…)`` with the T rows of every sample as its
batch. Class indices ``(B, …)`` of the same extents pack their rows in the same order,
``(T, *rest)``, and probabilities of the input's shape are ``(T, C, *rest)`` too. So
``cross_entropy`` / ``nll_loss`` are exactly the dense op on the packed values — every option
(weight, ignore_index, label_smoothing, probabilities, each reduction) is dense torch's own on
the concatenated samples, the weighted mean included — and run as one dense call
(``bridged.class_loss``) with its C++ backward of every order, where the composite below costs
about ten wrapper ops and their backward (5–10× a per-sample loop on token logits). The
composite stays where the bridge cannot go: under ``torch.compile`` (Dynamo cannot trace the
bridge), targets whose extents differ (its elementwise ops name the mismatch), and a weight
that needs a gradient (aten's ``nll_loss`` has no derivative for ``weight``; the composite
gives one).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from ...errors import StructureError
from ...structure import same_extent
from .. import bridged
from .._common import MJT, describe
from .._routing import route
from ..shape.leading import BatchMoved, token_op

__all__: list[str] = []


def _reduce(op: str, loss, reduction: str):
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"{op}(): expected reduction in ('none', 'mean', 'sum'), got {reduction!r}")


def _involved(*ts) -> bool:
    return any(isinstance(t, MJT) for t in ts)


def _legacy(op: str, size_average, reduce, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        raise NotImplementedError(f"{op}(): size_average/reduce are deprecated; pass reduction= for layout torch.multi_jagged")
    return reduction


_LOWER = (torch.float16, torch.bfloat16)


def _autocast_fp32(*ts):
    """Dense autocast runs every loss here in float32 (its fp32 list: the aten loss ops cast
    float16/bfloat16 inputs up, float64 stays). The routes compute with elementwise ops that
    autocast leaves alone, so they cast as it would; outside autocast nothing changes."""
    t0 = next((t for t in ts if isinstance(t, torch.Tensor)), None)
    if t0 is None or not torch.is_autocast_enabled(t0.device.type):
        return ts
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in _LOWER else t for t in ts)


def _dense_dtype(fn, *tensors, **kwargs) -> torch.dtype:
    """The dtype dense ``fn`` gives for operands of these dtypes, from a one-element call: it
    raises where dense refuses them (an integer ``mse_loss``, an integer target of
    ``binary_cross_entropy_with_logits``), with dense's message; the routes below compute with
    elementwise ops, which would promote where the aten kernels refuse or cast."""
    def one(t):
        return torch.zeros(1, dtype=t.dtype, device=t.device) if isinstance(t, torch.Tensor) else t

    return fn(*map(one, tensors), reduction="none", **{k: one(v) for k, v in kwargs.items()}).dtype


def _as(loss, dtype: torch.dtype):
    return loss if loss.dtype == dtype else loss.to(dtype)


def _unbool(dtype: torch.dtype, *ts):
    """Bool operands as ``dtype`` (the kernels read a bool target as 0 / 1, where ``-`` refuses it)."""
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.bool else t for t in ts)


@route(F.mse_loss)
def _mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    reduction = _legacy("mse_loss", size_average, reduce, reduction)
    input, target = _autocast_fp32(input, target)
    dtype = _dense_dtype(F.mse_loss, input, target)
    input, target = _unbool(dtype, input, target)
    return _reduce("mse_loss", _as((input - target).square(), dtype), reduction)


@route(F.l1_loss)
def _l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    # aten's composite would reduce with aten's sum, whose backward expands to nested-int sizes
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    reduction = _legacy("l1_loss", size_average, reduce, reduction)
    input, target = _autocast_fp32(input, target)
    dtype = _dense_dtype(F.l1_loss, input, target)
    input, target = _unbool(dtype, input, target)
    return _reduce("l1_loss", _as((input - target).abs(), dtype), reduction)


@route(F.smooth_l1_loss)
def _smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    if not _involved(input, target):
        return NotImplemented
    reduction = _legacy("smooth_l1_loss", size_average, reduce, reduction)
    input, target = _autocast_fp32(input, target)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss(): expected beta >= 0, got " + str(beta))
    dtype = _dense_dtype(F.smooth_l1_loss, input, target)
    input, target = _unbool(dtype, input, target)
    d = (input - target).abs()
    loss = d if beta == 0 else torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce("smooth_l1_loss", _as(loss, dtype), reduction)


@route(F.huber_loss)
def _huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    if delta <= 0:
        raise RuntimeError("huber_loss(): expected delta > 0, got " + str(delta))
    input, target = _autocast_fp32(input, target)
    dtype = _dense_dtype(F.huber_loss, input, target)
    input, target = _unbool(dtype, input, target)
    d = (input - target).abs()
    return _reduce("huber_loss", _as(torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), dtype), reduction)


@route(F.binary_cross_entropy_with_logits)
def _bce_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
    if not _involved(input, target, weight, pos_weight):
        return NotImplemented
    reduction = _legacy("binary_cross_entropy_with_logits", size_average, reduce, reduction)
    for arg, t in (("weight", weight), ("pos_weight", pos_weight)):
        if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled():
            # dense torch's refusal: its kernel has no derivative for the weights (the formula below would)
            raise RuntimeError(f"The function 'binary_cross_entropy_with_logits' is not differentiable with respect to "
                               f"argument '{arg}'. This input cannot have requires_grad True.")
    input, target, weight, pos_weight = _autocast_fp32(input, target, weight, pos_weight)
    dtype = _dense_dtype(F.binary_cross_entropy_with_logits, input, target, weight, pos_weight=pos_weight)
    input, target, weight, pos_weight = _unbool(dtype, input, target, weight, pos_weight)
    # dense torch's stable form: (1 - y)·x + l·(log1p(exp(-|x|)) + max(-x, 0)), l = 1 + (p - 1)·y
    soft = torch.log1p(torch.exp(-input.abs())) + torch.clamp(-input, min=0)
    if pos_weight is None:
        loss = (1 - target) * input + soft
    else:
        loss = (1 - target) * input + (1 + (pos_weight - 1) * target) * soft
    if weight is not None:
        loss = loss * weight
    return _reduce("binary_cross_entropy_with_logits", _as(loss, dtype), reduction)


# ----------------------------------------------------------------------------- class losses
def _check_reduction(op: str, reduction: str, allowed=("none", "mean", "sum")) -> None:
    if reduction not in allowed:
        raise ValueError(f"{op}(): expected reduction in {allowed}, got {reduction!r}")


def _class_input(op: str, input) -> int:
    """The number of classes of ``input``, whose class dim is dim 1 (NOTE [ Class dim of
    cross_entropy ])."""
    if not isinstance(input, MJT):
        raise TypeError(f"{op}(): expected input to be a multi_jagged tensor when target is one, got dense {describe(input)}")
    if 1 in input._ragged_dims:
        raise StructureError(
            f"{op}(): expected the class dim (dim 1, as dense torch's (N, C, d1, ...)) to be static, got "
            f"{describe(input)} whose dim 1 is ragged (layout torch.multi_jagged); for logits (B, j0, C) with "
            "targets (B, j0) pass logits.transpose(1, 2), of shape (B, C, j0)"
        )
    return input.shape[1]


def _class_weight(op: str, weight, n_classes: int, ndim: int):
    """``weight`` (C,) viewed to broadcast along the class dim of a (B, C, d1, …) input."""
    if weight is None:
        return None
    if isinstance(weight, MJT) or weight.dim() != 1 or weight.shape[0] != n_classes:
        raise RuntimeError(
            f"{op}(): weight tensor should be defined either for all {n_classes} classes or no classes but got "
            f"weight tensor of shape: {describe(weight)}"
        )
    return weight.view(n_classes, *[1] * (ndim - 2))


def _check_indices(op: str, input, target) -> None:
    """Class indices: a multi_jagged integer tensor shaped as ``input`` without dim 1."""
    want = "(" + ", ".join(str(s) for i, s in enumerate(input.shape) if i != 1) + ")"
    if not isinstance(target, MJT):
        raise TypeError(f"{op}(): expected target to be a multi_jagged tensor of shape {want} (input {describe(input)} "
                        f"without the class dim 1), got dense {describe(target)}")
    ok = target.dim() == input.dim() - 1 and target._ragged_dims == tuple(d - 1 for d in input._ragged_dims)
    ok = ok and all(target.shape[d] == input.shape[d + 1] for d in range(1, target.dim()) if d not in target._ragged_dims)
    if not ok:
        raise StructureError(f"{op}(): expected target of shape {want} (input {describe(input)} without the class dim 1), "
                             f"got {describe(target)}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise RuntimeError(f"{op}(): expected target of class indices to have an integer dtype, got {target.dtype}")


def _nll_terms(op: str, logp, target, wv, ignore_index: int):
    """Per position ``-w[t]·logp[t]`` (0 where ``t == ignore_index``), the weights ``w[t]`` (0
    there) and the ignore mask, all of the target's structure. An index out of ``[0, C)`` raises
    in ``gather``, as dense torch raises."""
    _check_indices(op, logp, target)
    ignored = target == ignore_index
    safe = target.masked_fill(ignored, 0).long().unsqueeze(1)
    picked = logp.gather(1, safe).squeeze(1)
    if wv is None:
        w_t = (~ignored).to(logp.dtype)
    else:
        # w[t] by the same gather on the weight broadcast over the input's structure
        w_t = (torch.zeros_like(logp, dtype=wv.dtype).detach() + wv).gather(1, safe).squeeze(1)
        w_t = w_t.masked_fill(ignored, 0)
    # where, not a product with w_t = 0: logp[0] of an ignored position may be -inf
    loss = torch.where(ignored, torch.zeros_like(picked).detach(), -(picked * w_t))
    return loss, w_t, ignored


def _packed(input, target, weight) -> bool:
    """Whether a class loss runs as the dense op on the packed values (NOTE [ Class losses on
    the packed values ]): eager, a multi_jagged target with the input's extents, no gradient
    for ``weight``."""
    if torch.compiler.is_compiling() or not isinstance(target, MJT):
        return False
    if weight is not None and weight.requires_grad and torch.is_grad_enabled():
        return False
    a, b = input._partition, target._partition
    return a is b or (a.batch == b.batch and len(a.extents) == len(b.extents)
                      and all(same_extent(e, f) for e, f in zip(a.extents, b.extents)))


def _weighted(loss, w_t, reduction: str):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w_t.sum()  # dense torch's weighted mean; 0/0 = nan when nothing counts


@route(F.nll_loss)
def _nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    if not _involved(input, target, weight):
        return NotImplemented
    reduction = _legacy("nll_loss", size_average, reduce, reduction)
    _check_reduction("nll_loss", reduction)
    input, weight = _autocast_fp32(input, weight)
    c = _class_input("nll_loss", input)
    wv = _class_weight("nll_loss", weight, c, input.dim())
    if _packed(input, target, weight):
        _check_indices("nll_loss", input, target)
        return bridged.class_loss(F.nll_loss, input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)
    loss, w_t, _ = _nll_terms("nll_loss", input, target, wv, ignore_index)
    return _weighted(loss, w_t, reduction)


@route(F.cross_entropy)
def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                   label_smoothing=0.0):
    """Class indices (target (B, d1, …) of integers) or class probabilities (target of the
    input's shape), with ``weight``, ``ignore_index`` and ``label_smoothing`` as dense torch's
    ``cross_entropy`` (aten's ``cross_entropy_loss``)."""
    if not _involved(input, target, weight):
        return NotImplemented
    op = "cross_entropy"
    reduction = _legacy(op, size_average, reduce, reduction)
    _check_reduction(op, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"{op}(): label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    input, target, weight = _autocast_fp32(input, target, weight)
    c = _class_input(op, input)
    wv = _class_weight(op, weight, c, input.dim())
    if _packed(input, target, weight):
        if not _same_shape(input, target):
            _check_indices(op, input, target)
        return bridged.class_loss(F.cross_entropy, input, target, weight=weight, ignore_index=ignore_index,
                                  reduction=reduction, label_smoothing=label_smoothing)
    logp = input.log_softmax(1)
    if _same_shape(input, target):  # dense torch's rule: probabilities when the shapes agree
        return _cross_entropy_probs(logp, target, wv, ignore_index, reduction, label_smoothing)
    loss, w_t, ignored = _nll_terms(op, logp, target, wv, ignore_index)
    if label_smoothing == 0.0:
        return _weighted(loss, w_t, reduction)
    smooth = -(logp if wv is None else logp * wv).sum(1)
    smooth = torch.where(ignored, torch.zeros_like(smooth).detach(), smooth)
    eps = label_smoothing
    if reduction == "none":
        return (1 - eps) * loss + (eps / c) * smooth
    total = (1 - eps) * loss.sum() + (eps / c) * smooth.sum()
    # both terms share dense torch's denominator: the summed weights of the counted positions
    return total if reduction == "sum" else total / w_t.sum()


def _same_shape(input, target) -> bool:
    """Same logical shape up to the ragged extents (which the elementwise ops check)."""
    return (
        isinstance(target, MJT)
        and target.dim() == input.dim()
        and target._ragged_dims == input._ragged_dims
        and all(target.shape[d] == input.shape[d] for d in range(1, input.dim()) if d not in input._ragged_dims)
    )


def _cross_entropy_probs(logp, target, wv, ignore_index, reduction, label_smoothing):
    op = "cross_entropy"
    if not target.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): Expected floating point type for target with class probabilities, got {target.dtype}")
    if ignore_index >= 0:
        raise RuntimeError(f"{op}(): ignore_index is not supported for floating point target")
    c = logp.shape[1]
    if label_smoothing > 0:
        target = target * (1 - label_smoothing) + label_smoothing / c
    loss = -(logp * target if wv is None else logp * target * wv).sum(1)
    # mean: over the positions (input numel / C), nan when there are none, as dense torch
    return _reduce(op, loss, reduction)


# ----------------------------------------------------------------------------- kl_div
_KL_MEAN_WARNING = (
    "reduction: 'mean' divides the total loss by both the batch size and the support size."
    "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
    "'mean' will be changed to behave the same as 'batchmean' in the next major release."
)


@route(F.kl_div)
def _kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """``batchmean`` divides the sum by ``input.size(0)`` as dense torch does, which for a
    multi_jagged input is B, the number of samples: the mean over samples of each sample's
    summed KL — not a mean per token (README, Losses)."""
    if not _involved(input, target):
        return NotImplemented
    op = "kl_div"
    reduction = _legacy(op, size_average, reduce, reduction)
    _check_reduction(op, reduction, ("none", "mean", "sum", "batchmean"))
    if reduction == "mean":
        warnings.warn(_KL_MEAN_WARNING)
    input, target = _autocast_fp32(input, target)
    if log_target:
        loss = torch.exp(target) * (target - input)
    else:
        loss = torch.xlogy(target, target) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.size(0)
    return _reduce(op, loss, reduction)


# ----------------------------------------------------------------------------- elementwise losses
# Dense torch's composites reduce with aten's sum, whose backward expands a dense gradient to
# nested-int sizes; the routes below write each loss with elementwise ops and reduce with the
# multi_jagged reductions, as the losses above (the formulas are aten's).
def _elementwise_loss(op: str, size_average, reduce, reduction: str, *ts):
    reduction = _legacy(op, size_average, reduce, reduction)
    _check_reduction(op, reduction)
    return reduction, _autocast_fp32(*ts)


@route(F.soft_margin_loss)
def _soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input, target):
        return NotImplemented
    reduction, (input, target) = _elementwise_loss("soft_margin_loss", size_average, reduce, reduction, input, target)
    return _reduce("soft_margin_loss", torch.log1p(torch.exp(-input * target)), reduction)


@route(torch.binary_cross_entropy_with_logits)
def _torch_bce_with_logits(input, target, weight=None, pos_weight=None, reduction=1):
    """``torch.binary_cross_entropy_with_logits`` (aten's call: the reduction as its enum)."""
    reduction = _REDUCTIONS.get(reduction, reduction)
    return _bce_with_logits(input, target, weight, reduction=reduction, pos_weight=pos_weight)


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # aten's Reduction enum


@route(F.binary_cross_entropy)
def _binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input, target, weight):
        return NotImplemented
    op = "binary_cross_entropy"
    reduction, (input, target, weight) = _elementwise_loss(op, size_average, reduce, reduction, input, target, weight)
    # aten: (y - 1)·max(log(1 - x), -100) - y·max(log x, -100)
    loss = (target - 1) * torch.clamp(torch.log1p(-input), min=-100) - target * torch.clamp(torch.log(input), min=-100)
    if weight is not None:
        loss = loss * weight
    return _reduce(op, loss, reduction)


@route(F.hinge_embedding_loss)
def _hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input, target):
        return NotImplemented
    op = "hinge_embedding_loss"
    reduction, (input, target) = _elementwise_loss(op, size_average, reduce, reduction, input, target)
    zero = torch.zeros_like(input).detach()
    loss = torch.where(target != 1, (margin - input).clamp_min(0), zero) + torch.where(target != -1, input, zero)
    return _reduce(op, loss, reduction)


@route(F.margin_ranking_loss)
def _margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input1, input2, target):
        return NotImplemented
    op = "margin_ranking_loss"
    reduction, (input1, input2, target) = _elementwise_loss(op, size_average, reduce, reduction, input1, input2, target)
    return _reduce(op, (-target * (input1 - input2) + margin).clamp_min(0), reduction)


@route(F.poisson_nll_loss)
def _poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None, reduction="mean"):
    if not _involved(input, target):
        return NotImplemented
    op = "poisson_nll_loss"
    reduction, (input, target) = _elementwise_loss(op, size_average, reduce, reduction, input, target)
    loss = torch.exp(input) - target * input if log_input else input - target * torch.log(input + eps)
    if full:
        stirling = target * torch.log(target) - target + 0.5 * torch.log(2 * math.pi * target)
        loss = loss + stirling.masked_fill(target <= 1, 0)
    return _reduce(op, loss, reduction)


@route(F.gaussian_nll_loss)
def _gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    if not _involved(input, target, var):
        return NotImplemented
    op = "gaussian_nll_loss"
    _check_reduction(op, reduction)
    input, target, var = _autocast_fp32(input, target, var)
    if not isinstance(var, torch.Tensor):
        var = torch.full_like(input, float(var)).detach()
    elif var.dim() == input.dim() - 1:  # one variance per position: input (…, D), var (…)
        var = var.unsqueeze(-1)
    if (var.detach() < 0).any():
        raise ValueError("var has negative entry/entries")
    # dense torch clamps a clone of var in place under no_grad: the clamped value, var's gradient
    var = var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(op, loss, reduction)


# ----------------------------------------------------------------------------- losses over the last dim
# Dense torch takes (N, D) / (N, C) inputs with (N,) targets; a multi_jagged (B, j…, D) input is
# per sample such an input, its last dim the feature / class dim, and the per-position loss has
# the target's structure (B, j…).
def _last_dim_input(op: str, input) -> None:
    if not isinstance(input, MJT) or input._ragged_dims and input._ragged_dims[-1] == input.dim() - 1:
        raise StructureError(f"{op}(): expected a multi_jagged input whose last dim is static (the feature dim), got {describe(input)}")


@route(F.pairwise_distance, torch.pairwise_distance)
def _pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """``‖x1 - x2 + eps‖_p`` over the last dim, as dense torch."""
    if not _involved(x1, x2):
        return NotImplemented
    _last_dim_input("pairwise_distance", x1 if isinstance(x1, MJT) else x2)
    return torch.linalg.vector_norm(x1 - x2 + eps, p, -1, keepdim)


@route(F.cosine_embedding_loss)
def _cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input1, input2, target):
        return NotImplemented
    op = "cosine_embedding_loss"
    reduction, (input1, input2, target) = _elementwise_loss(op, size_average, reduce, reduction, input1, input2, target)
    _last_dim_input(op, input1)
    eps = 1e-12  # aten's EPSILON
    prod = (input1 * input2).sum(-1)
    mag = ((input1 * input1).sum(-1) + eps) * ((input2 * input2).sum(-1) + eps)
    cos = prod / torch.sqrt(mag)
    zero = torch.zeros_like(cos).detach()
    loss = torch.where(target == 1, 1 - cos, zero) + torch.where(target == -1, (cos - margin).clamp_min(0), zero)
    return _reduce(op, loss, reduction)


def _triplet(op, anchor, positive, negative, margin, swap, reduction, distance):
    _last_dim_input(op, anchor)
    d_pos = distance(anchor, positive)
    d_neg = distance(anchor, negative)
    if swap:
        d_neg = torch.minimum(d_neg, distance(positive, negative))
    return _reduce(op, (margin + d_pos - d_neg).clamp_min(0), reduction)


@route(F.triplet_margin_loss)
def _triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                         reduce=None, reduction="mean"):
    if not _involved(anchor, positive, negative):
        return NotImplemented
    op = "triplet_margin_loss"
    reduction, (anchor, positive, negative) = _elementwise_loss(op, size_average, reduce, reduction, anchor, positive, negative)
    return _triplet(op, anchor, positive, negative, margin, swap, reduction, lambda a, b: _pairwise_distance(a, b, p, eps))


@route(F.triplet_margin_with_distance_loss)
def _triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False,
                                       reduction="mean"):
    if not _involved(anchor, positive, negative):
        return NotImplemented
    op = "triplet_margin_with_distance_loss"
    _check_reduction(op, reduction)
    if margin <= 0:
        raise ValueError(f"{op}: expected margin to be greater than 0, got {margin} instead")
    return _triplet(op, anchor, positive, negative, margin, swap, reduction, distance_function or _pairwise_distance)


@route(F.multilabel_soft_margin_loss)
def _multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input, target, weight):
        return NotImplemented
    op = "multilabel_soft_margin_loss"
    reduction, (input, target, weight) = _elementwise_loss(op, size_average, reduce, reduction, input, target, weight)
    _last_dim_input(op, input)
    loss = -(target * F.logsigmoid(input) + (1 - target) * F.logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    return _reduce(op, loss.sum(-1) / input.shape[-1], reduction)


def _class_targets(op: str, input, target):
    """Class indices ``(B, j…)`` for an input ``(B, j…, C)`` (class dim last, as dense torch's
    ``(N, C)`` of these losses)."""
    _last_dim_input(op, input)
    if not isinstance(target, MJT) or target.dim() != input.dim() - 1 or target._ragged_dims != input._ragged_dims:
        raise StructureError(f"{op}(): expected a multi_jagged target of the input's shape {describe(input)} without its "
                             f"last (class) dim, got {describe(target)}")
    if target.dtype.is_floating_point or target.dtype == torch.bool:
        raise RuntimeError(f"{op}(): expected target of class indices to have an integer dtype, got {target.dtype}")


@route(F.multi_margin_loss)
def _multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean"):
    if not _involved(input, target, weight):
        return NotImplemented
    op = "multi_margin_loss"
    reduction, (input, weight) = _elementwise_loss(op, size_average, reduce, reduction, input, weight)
    if p not in (1, 2):
        raise ValueError(f"{op}(): only p == 1 and p == 2 supported")
    _class_targets(op, input, target)
    c = input.shape[-1]
    t = target.long().unsqueeze(-1)
    z = (margin - input.gather(-1, t) + input).clamp_min(0)  # an index out of [0, C) raises in gather
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * (torch.zeros_like(input, dtype=weight.dtype).detach() + weight).gather(-1, t)
    z = z.masked_fill(F.one_hot(target.long(), c).bool(), 0)  # the target class itself is not a margin
    return _reduce(op, z.sum(-1) / c, reduction)


@route(F.multilabel_margin_loss)
def _multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Per position, ``Σ_j Σ_i max(0, 1 - (x[y_j] - x[i])) / C`` over the targets ``y_j`` before
    the first ``-1`` and the classes ``i`` that are not targets, as dense torch."""
    if not _involved(input, target):
        return NotImplemented
    op = "multilabel_margin_loss"
    reduction, (input,) = _elementwise_loss(op, size_average, reduce, reduction, input)
    _last_dim_input(op, input)
    if not _same_shape(input, target) or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise StructureError(f"{op}(): expected a multi_jagged integer target of the input's shape {describe(input)}, "
                             f"got {describe(target)} of dtype {target.dtype}")
    c = input.shape[-1]
    t = target.long()
    valid = (t >= 0).long().cumprod(-1).bool()  # the targets before the first -1
    safe = t.clamp_min(0)
    is_target = (F.one_hot(safe, c) * valid.unsqueeze(-1)).sum(-2) > 0
    z = (1 - (input.gather(-1, safe).unsqueeze(-1) - input.unsqueeze(-2))).clamp_min(0)  # (…, target j, class i)
    z = z * (valid.unsqueeze(-1) & ~is_target.unsqueeze(-2))
    return _reduce(op, z.sum((-2, -1)) / c, reduction)


# ----------------------------------------------------------------------------- CTC
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """``F.ctc_loss`` with per-sample log-probabilities ``(B, j0, C)`` (each sample an unbatched
    ``(T_i, C)`` input), or their sequence-first token ``x.transpose(0, 1)`` — the dense call's
    ``(T, N, C)`` — and targets dense or multi_jagged ``(B, j1)`` (each sample's labels; their
    concatenation is the dense call's 1-d form). The log-probabilities are padded to the longest
    sample: CTC reads no step past a sample's input length, so the padding never enters the loss
    or its gradient — an input length past the sample's own length raises, as the sample's own
    dense call does. Multi_jagged targets are padded to ``(B, S)``, the dense call's padded form:
    each sample reads the first ``target_lengths[i]`` of its own labels, and a target length past
    them raises (the concatenated form would read the next sample's labels)."""
    if isinstance(log_probs, BatchMoved):
        if log_probs._perm != (1, 0, 2):
            return NotImplemented
        log_probs = log_probs._mjt
    if not isinstance(log_probs, MJT) and not isinstance(targets, MJT):
        return NotImplemented
    if isinstance(log_probs, MJT):
        if log_probs.dim() != 3 or log_probs._ragged_dims != (1,):
            raise StructureError(f"ctc_loss(): expected log-probabilities (B, j0, C), got {describe(log_probs)}")
        _check_lengths("input_lengths", input_lengths, log_probs, "length")
        log_probs = log_probs.to_padded_tensor(0.0).transpose(0, 1)
    if isinstance(targets, MJT):
        if targets.dim() != 2:
            raise StructureError(f"ctc_loss(): expected targets (B, j1) (each sample's labels), got {describe(targets)}")
        _check_lengths("target_lengths", target_lengths, targets, "number of labels")
        targets = targets.to_padded_tensor(0)
    return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


def _check_lengths(name: str, lengths, x: MJT, what: str) -> None:
    """Each of ``lengths`` (a tensor or a sequence of ints, one per sample) at most its sample's
    length along ``x``'s ragged dim, as each sample's own dense call requires. Eager only."""
    if torch.compiler.is_compiling():
        return
    # SYNC: lengths given as a device tensor are read once (the dense call reads them too)
    given = torch.as_tensor(lengths).reshape(-1).tolist() if not isinstance(lengths, int) else None
    own = x.sizes()[:, 0].tolist()
    if given is None or len(given) != len(own):
        return  # the dense call's own error names the mismatch
    for i, (g, n) in enumerate(zip(given, own)):
        if g > n:
            raise RuntimeError(f"ctc_loss(): {name}[{i}] = {g} exceeds sample {i}'s {what}, {n}")


route(F.ctc_loss)(_ctc_loss)
token_op(F.ctc_loss)(_ctc_loss)
