"""Several advanced indices together: ``x[b, k]``, ``x[b, k, c]``, ``x[[0, 1], :, [2, 3]]`` —
index tensors on the batch dim and on other dims pair up as dense indexing's do (the route is
``getitem.py``'s; the packed-row arithmetic is ``gather.py``'s, NOTE [ Indices on packed rows ])."""

from __future__ import annotations

import torch

from ...tensor import values_of
from .._common import MJT, describe
from .._routing import _needs_grad
from .gather import _LAYOUT, _packed_indices

__all__ = ["pairwise_index"]


def pairwise_index(x: MJT, items: tuple, index_of) -> torch.Tensor | MJT:
    """``x[b, k, …]`` where the batch index ``b`` and other dims' indices are index lists or
    tensors (``index_of`` reads one as a 1-D integer tensor, or gives None): dense indexing's rule
    for several advanced indices — they broadcast together and pair up, ``x[b, k][j] =
    x[b[j]][k[j]]`` — with the broadcast dim first (the batch index leads). ``items``: one per
    dim from dim 0, no Ellipsis. Indices of the batch dim and a prefix of the other dims that
    reaches every ragged dim name packed rows (NOTE [ Indices on packed rows ]): a dense
    ``index`` of the values, differentiable; any other form (a ragged dim left whole, an index
    after a slice) takes each sample's own indexing, one result per index tuple, stacked when
    their shapes agree and a new batch of them otherwise."""
    adv = [index_of(it) for it in items]
    try:
        bcast = torch.broadcast_tensors(*[a for a in adv if a is not None])
    except RuntimeError:
        shapes = [list(a.shape) for a in adv if a is not None]
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}") from None
    it_b = iter(bcast)
    adv = [None if a is None else next(it_b) for a in adv]
    p = 0  # leading items that are index tensors or ints
    while p < len(items) and (adv[p] is not None or (type(items[p]) is int)):
        p += 1
    lead = [adv[d] if adv[d] is not None else torch.tensor(items[d]) for d in range(p)]
    rest = items[p:]
    reaches_all = p > x._ragged_dims[-1]
    later_advanced = any(a is not None for a in adv[p:])
    if reaches_all and not later_advanced:
        start, length, static = _packed_indices("index", x, lead)
        v = values_of(x) if _needs_grad(x) else x._values
        out = v[(start, *static)]  # (I, dims after the prefix)
        return out[(slice(None),) + tuple(rest)] if rest else out
    # per index tuple: the sample's own indexing (each advanced index read at position j)
    comps = x.unbind()
    flat = [None if a is None else a.reshape(-1).tolist() for a in adv]  # SYNC: the index tuples
    parts = []
    for j in range(len(flat[0])):
        sub = tuple(a[j] if a is not None else it for a, it in zip(flat[1:], items[1:]))
        parts.append(comps[flat[0][j]][sub])
    if not parts:
        raise NotImplementedError(f"index(): an empty selection from {describe(x)} with several index tensors")
    whole = any(adv[d] is None and type(items[d]) is not int for d in x._ragged_dims if d < len(items))
    if not whole and len(items) > x._ragged_dims[-1]:  # every ragged dim indexed: one shape
        return torch.stack(parts).reshape(*bcast[0].shape, *parts[0].shape)
    if bcast[0].dim() != 1:
        raise NotImplementedError(
            f"index(): index tensors of {bcast[0].dim()} dims that leave a ragged dim of {describe(x)} whole are not "
            f"supported for {_LAYOUT} (the result would have several batch dims)"
        )
    from ...constructors import as_nested_tensor

    return as_nested_tensor(parts)
