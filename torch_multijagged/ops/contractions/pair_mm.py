"""Contractions over a ragged dim of square pairs: ``multijagged::pair_matmul``'s handler and
the recognisers that send ``einsum`` / ``matmul`` calls to it.

NOTE [ Contracting a ragged dim ]

A contraction over a ragged dim pairs coordinates *within* each sample: the triangle update
``einsum("...ikc,...jkc->...ijc", a, b)`` on ``(B, j0, j0, C)`` is, per sample and channel, the
``n × n`` matrix product ``A Bᵀ``. ``pair_product`` recognises the calls of this shape — two
multi_jagged square pairs of one structure whose ragged dims are two of the three subscripts
``u, v, k`` (``k`` contracted, ``u`` and ``v`` the output's ragged dims) and whose static
dims carry the same subscripts in both operands (channels, heads: batched; those the output
drops are summed after the product) — and
runs ``multijagged::pair_matmul`` (``compile/pair_mm.py``): O(Σ nᵢ³ C) work and O(Σ nᵢ² C)
memory, no padding to the batch's largest sample and no per-sample Python loop. Everything else
that contracts a ragged dim goes through the broadcast product (``matmul``'s general case):
exact, but it materialises the product before the sum.
"""

from __future__ import annotations

import torch

from ...compile import pair_mm as cpm
from ...structure import same_extent
from .._table import register_multi_jagged_func
from .._common import MJT, describe, same_partition, static_dims, wrap

mj = torch.ops.multijagged

__all__ = ["pair_product", "is_square_pair"]


@register_multi_jagged_func(mj.pair_matmul.default, "x: mjt, y: mjt, tx: any, ty: any")
def pair_matmul_default(func, x, y, tx, ty):
    if not (is_square_pair(x) and is_square_pair(y)) or not same_partition(x._partition, y._partition):
        raise ValueError(f"pair_matmul(): expected two square pairs of one structure, got {describe(x)} and {describe(y)}")
    if x._ragged_dims != y._ragged_dims or x._values.shape[1:] != y._values.shape[1:]:
        raise ValueError(f"pair_matmul(): expected operands of one layout and static shape, got {describe(x)} and {describe(y)}")
    return wrap(pair_matmul_on_values(x._partition, x._values, y._values, tx, ty), x._partition, x._ragged_dims)


def pair_matmul_on_values(p, v: torch.Tensor, w: torch.Tensor, tx, ty) -> torch.Tensor:
    """``pair_matmul``'s values from the values ``v``, ``w`` of two square pairs of partition
    ``p`` with one layout and static shape (the eager values path calls it under autograd)."""
    c = 1
    for k in v.shape[1:]:
        c *= k
    flat = v.shape[0], c  # not -1: T may be 0
    e = p.extents[0]
    out = cpm.pair_matmul_values(v.reshape(flat), w.reshape(flat), p.offsets, e.lengths(), e.max, bool(tx), bool(ty))
    return out.view(v.shape)


def is_square_pair(x) -> bool:
    """Two ragged dims of one extent."""
    if not isinstance(x, MJT) or len(x._ragged_dims) != 2:
        return False
    a, b = x._partition.extents
    return same_extent(a, b)


def pair_product(terms: list[str], operands: list, out: str, mm=None):
    """``einsum(",".join(terms) + "->" + out, *operands)`` as ``pair_matmul`` when it has the
    shape of NOTE [ Contracting a ragged dim ]; else None. ``terms``/``out`` have one subscript
    per dim (no ellipsis). ``mm(a, b, tx, ty)`` computes the product (default: the op; the eager
    values path passes its own)."""
    if len(operands) != 2 or not all(is_square_pair(o) for o in operands):
        return None
    a, b = operands
    ta, tb = terms
    if not same_partition(a._partition, b._partition) or ta[0] != tb[0] or out[:1] != ta[0]:
        return None
    ra = "".join(ta[d] for d in a._ragged_dims)
    rb = "".join(tb[d] for d in b._ragged_dims)
    shared = set(ra) & set(rb)
    if len(set(ra)) != 2 or len(set(rb)) != 2 or len(shared) != 1:
        return None
    k = shared.pop()
    if k in out:
        return None
    u, v = ra.replace(k, ""), rb.replace(k, "")
    ro = "".join(c for c in out[1:] if c in (u, v))
    if sorted(ro) != sorted(u + v) or u == v:
        return None
    sa = [ta[d] for d in static_dims(len(a._size), a._ragged_dims)]
    sb = [tb[d] for d in static_dims(len(b._size), b._ragged_dims)]
    so = [c for c in out[1:] if c not in (u, v)]
    if sorted(sa) != sorted(sb) or len(set(sa)) != len(sa) or not set(so) <= set(sa):
        return None
    summed = [c for c in sa if c not in so]  # contracted static dims: batched, summed after
    so = so + summed
    if ro[0] == v:  # the output's first ragged dim comes from b: swap the roles, so that the
        # product's rows are the output's first ragged dim and no ragged transpose (a copy) follows
        a, b, ta, tb, ra, rb, u, v = b, a, tb, ta, rb, ra, v, u

    def canonical(x, term):
        """x with dims (batch, its two ragged dims in storage order, static dims in out order)."""
        order = [0] + list(x._ragged_dims) + [term.index(c) for c in so]
        return x.permute(order) if order != list(range(len(x._size))) else x

    a, b = canonical(a, ta), canonical(b, tb)
    if a._size[3:] != b._size[3:]:
        return None  # broadcasting static sizes: the general path
    res = (mm or mj.pair_matmul)(a, b, ra[0] == k, rb[1] == k)  # rows u, columns v
    if summed:
        n = len(res._size)
        res = res.sum(list(range(n - len(summed), n)))
        so = so[: len(so) - len(summed)]
    term = ta[0] + u + v + "".join(so)
    order = [term.index(c) for c in out]
    return res if order == list(range(len(order))) else res.permute(order)
