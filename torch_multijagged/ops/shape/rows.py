"""The batch dim merged with the first ragged dim: the rows of a pair as a batch of sequences.

NOTE [ Rows as samples ]

Triangle attention (AlphaFold's, alphafold3-pytorch's ``TriangleAttention``) attends along each
row of a pair ``(B, n, n, C)`` by folding the rows into the batch: einops' ``pack_one(z, '* n d')``
is ``z.reshape(-1, n, C)``, the bias ``(B, H, n, n)`` is repeated per row with
``repeat(bias, 'b ... -> (b r) ...', r=n)`` (an expand to ``(B, n, H, n, n)``, then a reshape to
``(B·n, H, n, n)``), and the result goes back with ``reshape(B, n, n, C)``. Sample ``i``'s ``nᵢ``
rows are ``nᵢ`` samples of the merged batch, each with the other ragged dims' sizes of sample
``i``: a batch of ``Σ nᵢ`` samples, whose extents repeat each extent's size ``nᵢ`` times.

The packed values are ordered sample by sample, then by the ragged coordinates row-major, so
when the merged ragged dim is the first one (dim 1) they are already ordered row by row: the
merge is the same values under a new partition, and so is the split back — zero-copy views both
ways, with gradients (``wrap_values``). The merged extents are canonical (cached on the extent
they repeat, keyed by the merged one), so a repeated bias and the packed rows of the pair it came
from get the same nested ints and combine. A merged partition remembers what it came from, so a
shape naming the original batch size and ragged size — ``(B, n, …)`` or ``(-1, n, …)``, or
``unflatten(0, (B, n))`` — splits it back.

A merge is asked for by ``reshape`` / ``view`` whose first size is ``-1`` or ``B·n`` (einops
computes ``B * n``: a multiple of the nested int) and whose later sizes keep the other dims as
they are (ragged ones as their nested ints or ``-1``), or by ``flatten(0, 1)``. A tensor with no
ragged dim after dim 1 has no rows to keep ragged: that request flattens the batch
(NOTE [ Flattening the batch dim ] in ``tokens.py``). New extents need host sizes: eager only
(under ``torch.compile`` a graph break).
"""

from __future__ import annotations

import torch

from ...bridge import values_of, wrap_values
from ...structure import RaggedExtent, _node_extent, partition_for
from .._common import MJT, eager_route

__all__ = ["rows_request", "merge_rows_request", "merge_rows", "split_rows_request", "split_rows"]

_EAGER = "{op}(): folding a ragged dim into the batch makes new per-sample sizes (eager only for layout torch.multi_jagged)"


def _is_size(s, extent: RaggedExtent) -> bool:
    """Whether ``s`` is ``extent``'s nested int (or a copy of its node: einops' arithmetic)."""
    return isinstance(s, torch.SymInt) and getattr(s.node, "coeff", None) == 1 and _node_extent(s.node) is extent


def _rows_extent(g: RaggedExtent, e: RaggedExtent) -> RaggedExtent:
    """``g``'s sizes with each sample's repeated ``e``'s size times: ``g`` over the rows of ``e``
    (cached on ``g``, keyed by ``e``, which the entry holds)."""
    key = ("rows_of", id(e))
    hit = g.cache.get(key)
    if hit is None or hit[0] is not e:
        lengths = g.host_lengths().repeat_interleave(e.host_lengths())
        hit = g.cache[key] = (e, RaggedExtent.from_lengths(lengths, g.offsets.device))
    return hit[1]


def _keeps(x: MJT, start: int, sizes, holes: bool, also=()) -> bool:
    """Whether ``sizes`` name ``x``'s dims from ``start`` on as they are: a ragged dim by its nested
    int (or by the one of ``also`` at its place among the ragged dims), a static dim by its size,
    either by ``-1`` where ``holes`` allows one."""
    for d, s in zip(range(start, x.dim()), sizes):
        if holes and isinstance(s, int) and s == -1:
            continue
        if d in x._ragged_dims:
            k = x._ragged_dims.index(d)
            if not any(_is_size(s, e) for e in (x._partition.extents[k], *also[k:k + 1])):
                return False
        elif not (isinstance(s, int) and s == x._size[d]):
            return False
    return True


def merge_rows_request(x: MJT, shape: tuple) -> bool:
    """Whether ``shape`` folds ``x``'s dim 1, its first ragged dim, into the batch while keeping
    every later dim (NOTE [ Rows as samples ])."""
    rd = x._ragged_dims
    if len(rd) < 2 or rd[0] != 1 or len(shape) != x.dim() - 1 or torch.compiler.is_compiling():
        return False
    e = x._partition.extents[0]
    first = shape[0]
    if isinstance(first, torch.SymInt):  # B·n: the nested int of n times the batch size
        if getattr(first.node, "coeff", None) != x._partition.batch or _node_extent(first.node) is not e:
            return False
    elif first != -1:
        return False
    return _keeps(x, 2, shape[1:], holes=first != -1)


@eager_route(_EAGER)
def merge_rows(op: str, x: MJT) -> MJT:
    p = x._partition
    e = p.extents[0]
    q = partition_for([_rows_extent(g, e) for g in p.extents[1:]])
    q.cache.setdefault(("rows_origin",), (p, x._ragged_dims))
    return wrap_values(values_of(x), q, tuple(d - 1 for d in x._ragged_dims[1:]))


def split_rows_request(x: MJT, shape: tuple) -> bool:
    """Whether ``shape`` splits a merged batch (``merge_rows``) back: ``(B or -1, n, *x's other
    sizes)``, ragged ones as ``x``'s nested ints, the original ones or ``-1``."""
    origin = x._partition.cache.get(("rows_origin",)) if not torch.compiler.is_compiling() else None
    if origin is None or len(shape) != x.dim() + 1:
        return False
    p, rd = origin
    if not (isinstance(shape[0], int) and shape[0] in (-1, p.batch)) or not _is_size(shape[1], p.extents[0]):
        return False
    return tuple(d - 1 for d in rd[1:]) == x._ragged_dims and _keeps(x, 1, shape[2:], holes=shape[0] != -1,
                                                                     also=p.extents[1:])


@eager_route(_EAGER)
def split_rows(op: str, x: MJT) -> MJT:
    p, rd = x._partition.cache[("rows_origin",)]
    return wrap_values(values_of(x), p, rd)


def rows_request(x: MJT, shape: tuple):
    """``merge_rows`` or ``split_rows`` when ``shape`` asks for one, else None."""
    if merge_rows_request(x, shape):
        return merge_rows
    if split_rows_request(x, shape):
        return split_rows
    return None
