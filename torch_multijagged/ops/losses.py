"""Elementwise losses on multi_jagged inputs: routes that write each loss with elementwise ops and
a reduction, as dense torch defines it (``torch.jagged`` has no handler for these aten ops).

``reduction="mean"`` averages over every element that exists — the mean over the concatenated
samples, as dense torch on the packed values — and ``"sum"`` sums them; both give a dense scalar.
For a per-sample mean, take ``reduction="none"`` and ``.mean(dim=...)`` over the sample's dims.
Written with differentiable ops, so gradients reach input and target, to any order, and the
routes trace under ``torch.compile``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import MJT
from .routes import route

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


@route(F.mse_loss)
def _mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    reduction = _legacy("mse_loss", size_average, reduce, reduction)
    return _reduce("mse_loss", (input - target).square(), reduction)


@route(F.l1_loss)
def _l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    # aten's composite would reduce with aten's sum, whose backward expands to nested-int sizes
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    reduction = _legacy("l1_loss", size_average, reduce, reduction)
    return _reduce("l1_loss", (input - target).abs(), reduction)


@route(F.smooth_l1_loss)
def _smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    if not _involved(input, target):
        return NotImplemented
    reduction = _legacy("smooth_l1_loss", size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss(): expected beta >= 0, got " + str(beta))
    d = (input - target).abs()
    loss = d if beta == 0 else torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce("smooth_l1_loss", loss, reduction)


@route(F.huber_loss)
def _huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    if not _involved(input, target) or weight is not None:
        return NotImplemented
    if delta <= 0:
        raise RuntimeError("huber_loss(): expected delta > 0, got " + str(delta))
    d = (input - target).abs()
    return _reduce("huber_loss", torch.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@route(F.binary_cross_entropy_with_logits)
def _bce_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
    if not _involved(input, target, weight, pos_weight):
        return NotImplemented
    reduction = _legacy("binary_cross_entropy_with_logits", size_average, reduce, reduction)
    # dense torch's stable form: (1 - y)·x + l·(log1p(exp(-|x|)) + max(-x, 0)), l = 1 + (p - 1)·y
    soft = torch.log1p(torch.exp(-input.abs())) + torch.clamp(-input, min=0)
    if pos_weight is None:
        loss = (1 - target) * input + soft
    else:
        loss = (1 - target) * input + (1 + (pos_weight - 1) * target) * soft
    if weight is not None:
        loss = loss * weight
    return _reduce("binary_cross_entropy_with_logits", loss, reduction)
