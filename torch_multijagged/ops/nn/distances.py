"""Distances between the rows of each sample: ``torch.cdist`` (two batches, or a batch and a dense
``(B, M, C)``: each sample's ``(j0, j1)`` matrix), ``F.pdist`` (each sample's pairs ``i < j``, a new
extent) and ``F.cosine_similarity`` over any dim (dense torch's formula: each input over its
clamped 2-norm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import mapped_extent, partition_for
from .._common import MJT, autocast_float32, describe, eager_route
from .._routing import route
from .losses import _involved

__all__: list[str] = []


@route(torch.cdist)
def _cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """``‖x1[i] - x2[j]‖_p`` for every pair of rows of each sample: ``(B, j0, C)`` with ``(B, j1, C)``
    (or a dense ``(B, M, C)``) is ``(B, j0, j1)``, as the dense op on each sample. Computed as the
    norm of the pair of differences (dense torch's matmul form for large inputs rounds otherwise;
    ``compute_mode`` does not change the values beyond rounding)."""
    if not _involved(x1, x2):
        return NotImplemented
    if torch.is_autocast_enabled(x1.device.type):
        x1, x2 = autocast_float32(x1, x2)  # on dense autocast's float32 list
    for t in (x1, x2):
        if t.dim() != 3 or (isinstance(t, MJT) and t._ragged_dims[-1] == 2):
            raise StructureError(
                f"cdist(): expected batches of row vectors (B, j0, C) (a static last dim), got {describe(t)}"
            )
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    return torch.linalg.vector_norm(x1.unsqueeze(2) - x2.unsqueeze(1), p, -1)


@route(F.pdist, torch.pdist)
def _pdist(input, p=2.0):
    """Each sample's ``pdist``: the distances of its rows' pairs ``i < j`` in row-major order, a
    ``(B, j)`` batch of ``nᵢ(nᵢ − 1)/2`` each (a new extent, eager only) — the upper triangle of the
    sample's ``cdist``, whose gradient dense torch's ``pdist`` also has."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 3 or input._ragged_dims != (1,):
        raise StructureError(f"pdist(): expected a batch of row vectors (B, j0, C), got {describe(input)}")
    return _pdist_rows(input, float(p))


@eager_route("{op}(): each sample's number of pairs is a new ragged size, built from host lengths")
def _pdist_rows(x: MJT, p: float):
    e = x._partition.extents[0]
    pairs = mapped_extent(e, ("pdist",), lambda n: n * (n - 1) // 2)
    full = torch.cdist(x, x, p=p)  # (B, j0, j0): row-major (i, j) per sample
    _, coords = full._partition.row_coords()
    upper = (coords[:, 0] < coords[:, 1]).nonzero().squeeze(1)
    return wrap_values(values_of(full).index_select(0, upper), partition_for((pairs,)), (1,))


@route(F.cosine_similarity, torch.cosine_similarity)
def _cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Dense torch's formula: each input divided by its 2-norm over ``dim``, the norm clamped below
    at ``eps`` without a gradient through the clamp, then the product summed over ``dim``."""
    if not _involved(x1, x2):
        return NotImplemented
    common = torch.promote_types(x1.dtype, x2.dtype)
    if not common.is_floating_point:  # as dense torch: a complex pair would give a complex "similarity"
        raise RuntimeError(f"expected common dtype to be floating point, yet common dtype is {str(common).replace('torch.', '')}")

    def unit(t):
        n = torch.linalg.vector_norm(t, 2, dim, keepdim=True)
        return t / (n + (n.clamp_min(eps) - n).detach())

    return (unit(x1) * unit(x2)).sum(dim)
