"""Which products of two multi_jagged tensors run as per-sample matmuls on the packed values
(``kernels/ragged_mm.py``): the recogniser that ``matmul``, ``bmm`` and ``einsum`` share.

NOTE [ Matmul between multi_jagged tensors ]

``q @ k.transpose(-1, -2)`` on ``(B, H, j0, D)`` creates a pair ``(B, H, j0, j0)``; ``attn @ v``
contracts it again; ``einsum("bic,bjc->bij", x, x)`` is the same product. Per sample each is one
dense matmul, ``(H, n, D) @ (H, D, n)``. ``product_spec`` recognises a two-operand contraction of
that shape — one batch subscript leading every term, the same static *lead* subscripts next in
one order with one size, then two matrix subscripts per operand, one of them contracted (ragged in
both operands with equal per-sample sizes, or static in both with one size), the output's two
being the operands' others in either order — where no ragged dim sits among the lead dims; it
names the operand that holds the output's rows ``x`` and gives ``kernels/ragged_mm.py``'s spec
(NOTE [ Ragged matmul contract ]): labels are the subscripts, transposes are flags, and
per-sample sizes are the extents' host lengths. Eager only: traced, the host lengths do not
exist, and the broadcast product summed over the contracted dim (which Inductor fuses) stays.
Square pairs times square pairs contracting a ragged dim stay ``pair_matmul``'s (NOTE
[ Contracting a ragged dim ]): they are recognised first. An ``einsum`` whose subscripts have
that shape in another order (the heads between the rows, ``bihd,bjhd->bhij`` and
``bhij,bjhd->bihd``) is the same product of permuted operands (views: a permute moves no packed
row), its result permuted into the output's order (``matmul_form``).
"""

from __future__ import annotations

import torch

from ...structure import RaggedExtent, _is_traced, same_extent
from .._common import MJT

__all__ = ["product_spec", "matmul_spec", "matmul_form", "permuted_spec"]

_functorch = torch._C._are_functorch_transforms_active


def _dim(x: MJT, d: int):
    rd = x._ragged_dims
    return x._partition.extents[rd.index(d)] if d in rd else x._size[d]


def _host(s, seen: dict):
    """A label's size: a static size, or the extent's host lengths as a tuple (one per extent)."""
    if not isinstance(s, RaggedExtent):
        return s
    hit = seen.get(id(s))
    if hit is None:
        # SYNC: none — the extent's host lengths (kept on it; read once where it was built)
        hit = seen[id(s)] = tuple(s.host_lengths().tolist())
    return hit


def product_spec(a, ta: str, b, tb: str, out: str):
    """``(x, y, spec, output extents, output ragged dims)`` for ``einsum(f"{ta},{tb}->{out}", a,
    b)`` as NOTE [ Matmul between multi_jagged tensors ] describes, else None. ``x``/``y`` are
    ``a``/``b`` in the order the kernel takes them; the output has no ragged dim when both of its
    matrix dims are static (a dense ``(B, …, m, n)``). Dtypes are the caller's to compare."""
    if not (isinstance(a, MJT) and isinstance(b, MJT)) or not (a._ragged_dims and b._ragged_dims):
        return None
    nd = len(a._size)
    if not (nd == len(b._size) == len(ta) == len(tb) == len(out)) or nd < 3:
        return None
    lead = ta[1:-2]
    if ta[0] != tb[0] or ta[0] != out[0] or tb[1:-2] != lead or out[1:-2] != lead:
        return None
    (a0, a1), (b0, b1), (row, col) = ta[-2:], tb[-2:], out[-2:]
    kk = a0 if a0 in (b0, b1) else a1  # the contracted subscript: in both operands, not in the output
    if (a0 == a1 or b0 == b1 or row == col or kk not in (b0, b1) or kk in out or {row, col} != {a0, a1, b0, b1} - {kk}
            or a._ragged_dims[0] < nd - 2 or b._ragged_dims[0] < nd - 2 or len(set(ta)) != nd or len(set(tb)) != nd):
        return None
    pa, pb = a._partition, b._partition
    if (a._size[1:-2] != b._size[1:-2] or pa.batch != pb.batch or torch.compiler.is_compiling() or _functorch()
            or _is_traced(pa.offsets) or _is_traced(pb.offsets)):
        return None
    ka, kb = _dim(a, ta.index(kk)), _dim(b, tb.index(kk))
    if isinstance(ka, RaggedExtent) != isinstance(kb, RaggedExtent):
        return None
    if not (same_extent(ka, kb) if isinstance(ka, RaggedExtent) else ka == kb):
        return None
    (x, tx_), (y, ty_) = ((a, ta), (b, tb)) if row in (a0, a1) else ((b, tb), (a, ta))
    r, c = _dim(x, tx_.index(row)), _dim(y, ty_.index(col))
    seen: dict = {}
    dims = ((row, _host(r, seen)), (kk, _host(ka, seen)), (col, _host(c, seen)))
    spec = (tuple(tx_[-2:]), tuple(ty_[-2:]), (row, col), tx_[-1] == row, ty_[-2] == col, dims, tuple(a._size[1:-2]))
    ragged = [(d, e) for d, e in ((nd - 2, r), (nd - 1, c)) if isinstance(e, RaggedExtent)]
    return x, y, spec, [e for _, e in ragged], tuple(d for d, _ in ragged)


def matmul_spec(a, b):
    """``product_spec`` of ``a @ b`` (two multi_jagged tensors of one rank), checked directly (the
    hot case: no subscripts to match)."""
    if not (isinstance(a, MJT) and isinstance(b, MJT)) or not (a._ragged_dims and b._ragged_dims):
        return None
    nd = len(a._size)
    rda, rdb = a._ragged_dims, b._ragged_dims
    pa, pb = a._partition, b._partition
    if (nd != len(b._size) or nd < 3 or rda[0] < nd - 2 or rdb[0] < nd - 2 or a._size[1:-2] != b._size[1:-2]
            or pa.batch != pb.batch or torch.compiler.is_compiling() or _functorch()
            or _is_traced(pa.offsets) or _is_traced(pb.offsets)):
        return None
    m, ka, kb, n = _dim(a, nd - 2), _dim(a, nd - 1), _dim(b, nd - 2), _dim(b, nd - 1)
    if isinstance(ka, RaggedExtent) != isinstance(kb, RaggedExtent):
        return None
    if not (same_extent(ka, kb) if isinstance(ka, RaggedExtent) else ka == kb):
        return None
    seen: dict = {}
    dims = (("i", _host(m, seen)), ("k", _host(ka, seen)), ("j", _host(n, seen)))
    spec = (("i", "k"), ("k", "j"), ("i", "j"), False, False, dims, tuple(a._size[1:-2]))
    ragged = [(d, e) for d, e in ((nd - 2, m), (nd - 1, n)) if isinstance(e, RaggedExtent)]
    return a, b, spec, [e for _, e in ragged], tuple(d for d, _ in ragged)


def matmul_form(ta: str, tb: str, out: str):
    """``(perm_a, perm_b, (ta', tb', out'), perm_out)`` when ``einsum(f"{ta},{tb}->{out}")`` is a
    batched matmul in another subscript order: one batch subscript leading every term, lead
    subscripts in both operands and the output, one contracted subscript, one free subscript per
    operand and no other. ``ta'``/``tb'``/``out'`` are the terms of matmul's order (batch, the lead
    subscripts as the output orders them, then the matrix pair), ``perm_a``/``perm_b`` the
    operands' permutations into them and ``perm_out`` the product's into ``out``; None otherwise,
    or where every term already has that order (``product_spec`` has seen it)."""
    if not (ta and tb and out) or ta[0] != tb[0] or out[0] != ta[0]:
        return None
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb) or len(set(out)) != len(out):
        return None
    lead = [c for c in out[1:] if c in ta and c in tb]
    kk = [c for c in ta[1:] if c in tb and c not in out]
    row = [c for c in ta[1:] if c not in tb and c in out]
    col = [c for c in tb[1:] if c not in ta and c in out]
    if len(kk) != 1 or len(row) != 1 or len(col) != 1 or len(ta) != len(lead) + 3 or len(tb) != len(lead) + 3:
        return None
    if len(out) != len(lead) + 3:
        return None
    b, mid = ta[0], "".join(lead)
    ta2, tb2, out2 = b + mid + row[0] + kk[0], b + mid + kk[0] + col[0], b + mid + row[0] + col[0]
    if (ta2, tb2, out2) == (ta, tb, out):
        return None
    return ([ta.index(c) for c in ta2], [tb.index(c) for c in tb2], (ta2, tb2, out2), [out2.index(c) for c in out])


def permuted_spec(a, ta: str, b, tb: str, out: str):
    """``(plan, perm_out)`` where ``einsum(f"{ta},{tb}->{out}", a, b)`` is a per-sample matmul of
    permuted operands (``matmul_form``): ``plan`` is ``product_spec`` of the permuted operands
    (views: a permute moves no packed row), ``perm_out`` the product's permutation into ``out``'s
    order (None: already in it); None otherwise. Eager only, as ``product_spec``."""
    if not (isinstance(a, MJT) and isinstance(b, MJT)):
        return None
    form = matmul_form(ta, tb, out)
    if form is None:
        return None
    pa, pb, (ta2, tb2, out2), po = form
    plan = product_spec(a.permute(pa), ta2, b.permute(pb), tb2, out2)
    return None if plan is None else (plan, None if po == sorted(po) else po)
