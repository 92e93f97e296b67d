"""Per-sample matrix structure: ``tril`` / ``triu`` (aten handlers) and ``trace``, ``diag``,
``diagflat`` (routes). A sample's matrix dims are its last two, ragged or static: a square pair
``(B, j0, j0)`` holds one ``(n, n)`` matrix per sample, ``(B, j0, k, k)`` a batch of ``k × k``
matrices per sample.

``tril`` / ``triu`` keep an element when its column minus its row is at most (at least) the
diagonal offset: rows and columns of a ragged dim come from the packed rows' coordinates
(``Partition.row_coords``), of a static dim from an ``arange`` over the values; two static dims
are the dense op on the values. aten's derivative (the gradient's ``tril`` / ``triu``) reaches the
same handler. ``diag`` of a per-sample vector builds the ``(n, n)`` square pair as a broadcast
product masked to its diagonal; an offset would give a new extent ``n + |k|`` and is refused."""

from __future__ import annotations

import torch

from .._common import MJT, describe, static_dims, wrap
from .._routing import in_place_route, route
from .._table import register_multi_jagged_func

aten = torch.ops.aten

__all__: list[str] = []


def _coordinate(x: MJT, d: int, v: torch.Tensor) -> torch.Tensor:
    """Each element's index along logical dim ``d``, broadcastable to the packed values ``v``."""
    if d in x._ragged_dims:
        _, coords = x._partition.row_coords()
        return coords[:, x._ragged_dims.index(d)].view(-1, *[1] * (v.dim() - 1))
    vd = static_dims(len(x._size), x._ragged_dims).index(d) + 1
    shape = [1] * v.dim()
    shape[vd] = v.shape[vd]
    return torch.arange(v.shape[vd], device=v.device).view(shape)


def _band(op: str, func, x: MJT, diagonal: int, lower: bool):
    nd = len(x._size)
    if nd < 3:
        raise RuntimeError(f"{op}(): expected samples of at least 2 dims, got {describe(x)}")
    r, c = nd - 2, nd - 1
    v = x._values
    if r not in x._ragged_dims and c not in x._ragged_dims:
        return wrap(func(v, diagonal), x._partition, x._ragged_dims)
    offset = _coordinate(x, c, v) - _coordinate(x, r, v)
    keep = offset <= diagonal if lower else offset >= diagonal
    return wrap(torch.where(keep, v, torch.zeros((), dtype=v.dtype, device=v.device)), x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.tril.default, "self: mjt, diagonal: any?")
def tril_default(func, x, diagonal=0):
    return _band("tril", func, x, diagonal, lower=True)


@register_multi_jagged_func(aten.triu.default, "self: mjt, diagonal: any?")
def triu_default(func, x, diagonal=0):
    return _band("triu", func, x, diagonal, lower=False)


route(torch.Tensor.tril_)(in_place_route("tril_"))
route(torch.Tensor.triu_)(in_place_route("triu_"))


def _sample_dims(op: str, input: MJT, want: tuple[int, ...]) -> int:
    n = input.dim() - 1
    if n not in want:
        raise RuntimeError(f"{op}(): expected samples of {' or '.join(f'{w}-D' for w in want)}, got {describe(input)}")
    return n


@route(torch.trace, torch.Tensor.trace)
def _trace(input):
    """The sum of each sample's diagonal: a dense ``(B,)``."""
    if not isinstance(input, MJT):
        return NotImplemented
    _sample_dims("trace", input, (2,))
    if input.dtype == torch.bool:
        raise NotImplementedError("\"trace\" not implemented for 'Bool'")  # as dense (a sum would count)
    return torch.diagonal(input, 0, 1, 2).sum(-1)


def _diag_matrix(op: str, input: MJT, diagonal: int):
    """A per-sample vector ``(B, j0)`` → the square pair ``(B, j0, j0)`` with it on the diagonal."""
    if diagonal != 0:
        raise NotImplementedError(
            f"{op}(): an offset diagonal of a per-sample vector ({describe(input)}) gives matrices of a new extent "
            "n + |diagonal|, not supported for layout torch.multi_jagged; use diagonal=0"
        )
    square = input.unsqueeze(-1) * torch.ones_like(input).detach().unsqueeze(-2)  # value x_i at (i, j)
    return torch.triu(torch.tril(square))


@route(torch.diag, torch.Tensor.diag)
def _diag(input, diagonal=0, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    if _sample_dims("diag", input, (1, 2)) == 1:
        return _diag_matrix("diag", input, diagonal)
    return torch.diagonal(input, diagonal, 1, 2)


@route(torch.diagflat, torch.Tensor.diagflat)
def _diagflat(input, offset=0):
    """Per-sample vectors only: flattening a sample of more dims merges a ragged dim with others
    into a new extent."""
    if not isinstance(input, MJT):
        return NotImplemented
    _sample_dims("diagflat", input, (1,))
    return _diag_matrix("diagflat", input, offset)
