"""Contractions that no packed-values form covers, run eagerly as the dense ``einsum`` of each
sample: the recogniser that ``einsum`` and ``matmul`` share (the computation is the values
bridge's ``sample_einsum``).

NOTE [ Contractions sample by sample ]

Some products contract a dim while a ragged dim sits where neither the static-dim contraction on
the packed rows, nor the pair product (NOTE [ Contracting a ragged dim ]), nor the per-sample
matmul (NOTE [ Matmul between multi_jagged tensors ]) reaches it: triangle attention's scores
``(B, j0, H, j0, d) @ (B, j0, H, d, j0)`` (a ragged *lead* dim), the outer-product mean
``bsic,bsjd->bijcd`` (two free dims per operand), attention with the heads between the rows
``bihd,bjhd->bhij``. The broadcast product (NOTE [ einsum by broadcasting ]) gets them right but
materialises ``Π`` of every subscript's size per sample before the sum — tens of times the work
and memory of the contraction. ``sample_spec`` recognises a contraction that is the same dense
``einsum`` in every sample: every multi_jagged operand leads with the one batch subscript, which
leads the output too; no subscript repeats within a term (a diagonal goes first); each subscript
has one size wherever it appears (one ragged extent, ``same_extent``, or one static size, or
static sizes 1 and one other, which each sample's einsum broadcasts as dense einsum does: the
MSA's pair-weighted average ``...hqk,...hkc->...qhc`` of weights ``(B, 1, H, j0, j0)`` and values
``(B, S, H, j0, c)``); dense operands hold
neither the batch nor a ragged subscript (every sample's, passed whole); and at least one
subscript is contracted (a plain product materialises nothing more than its output). Then
``bridged.sample_einsum`` runs dense ``einsum`` on each sample's views of the packed values — each
operand's subscripts written in its storage order (its ragged dims, then its static ones), so a
sample's tensor is a ``view`` of its rows, no permute — with the output's subscripts in *its*
storage order, and concatenates the results into the output's rows, under dense autograd (every
order, dense's own formulas). Its cost is the per-sample loop's (one call per sample, about
10–20 µs forward and backward on the CPU) plus a ``split`` and a ``cat``; for batches of tiny
samples the broadcast product is cheaper, hence the rule: per sample when the broadcast product
would hold more than ``_PER_SAMPLE_ELEMENTS`` elements per sample on average. Eager only (host
sizes): traced, the broadcast product stays, which Inductor fuses into the sum.
"""

from __future__ import annotations

import math

import torch

from ...structure import RaggedExtent, _is_traced, same_extent
from .._common import MJT

__all__ = ["sample_spec"]

# Per sample beyond this many elements of the broadcast product per sample (CPU, one thread, float32:
# the broadcast product's multiply and sum cost about as much as one per-sample call, forward and
# backward, at ten to twenty thousand elements per sample; docs/design.md §18, "Contractions sample by sample").
_PER_SAMPLE_ELEMENTS = 16384

_functorch = torch._C._are_functorch_transforms_active


def _sizes_of(x, term: str, sizes: dict) -> bool:
    """Record the size of each subscript of ``term`` on ``x`` into ``sizes`` (an extent or an int);
    False where a subscript already has another size."""
    rd = x._ragged_dims if isinstance(x, MJT) else ()
    for d, c in enumerate(term):
        if d == 0 and isinstance(x, MJT):
            continue
        s = x._partition.extents[rd.index(d)] if d in rd else (x._size[d] if isinstance(x, MJT) else x.shape[d])
        seen = sizes.setdefault(c, s)
        if seen is s:
            continue
        if isinstance(seen, RaggedExtent) != isinstance(s, RaggedExtent):
            return False
        if isinstance(s, RaggedExtent):
            if not same_extent(seen, s):
                return False
        elif seen != s:
            if seen != 1 and s != 1:
                return False
            sizes[c] = max(seen, s)  # a static size-1 dim broadcasts, in each sample's einsum too
    return True


def _storage_term(x, term: str) -> str:
    """``term`` in ``x``'s storage order: its ragged dims' subscripts, then its static ones."""
    if not isinstance(x, MJT):
        return term
    rd = x._ragged_dims
    return "".join(term[d] for d in rd) + "".join(c for d, c in enumerate(term) if d and d not in rd)


def sample_spec(terms: list, operands: list, out: str):
    """``(per-sample equation, output extents, output ragged dims)`` for ``einsum`` of ``terms``
    (one subscript per dim, no ellipsis) into ``out`` as NOTE [ Contractions sample by sample ]
    describes, else None."""
    first = next((k for k, o in enumerate(operands) if isinstance(o, MJT)), None)
    if first is None or torch.compiler.is_compiling() or _functorch():
        return None
    b = terms[first][0]
    batch = operands[first]._partition.batch
    if not out.startswith(b) or batch == 0:
        return None
    for t, o in zip(terms, operands):
        if len(set(t)) != len(t):
            return None
        if isinstance(o, MJT) and (t[0] != b or o._partition.batch != batch or _is_traced(o._partition.offsets)):
            return None
    sizes: dict = {}
    if not all(_sizes_of(o, t, sizes) for t, o in zip(terms, operands)):
        return None
    ragged = {c for c, s in sizes.items() if isinstance(s, RaggedExtent)}
    if any(not isinstance(o, MJT) and (b in t or ragged & set(t)) for t, o in zip(terms, operands)):
        return None
    if not set(out[1:]) <= set(sizes) or set(sizes) <= set(out):  # nothing contracted: the broadcast product
        return None
    # SYNC: none — the extents' host lengths
    host = {c: sizes[c].host_lengths().tolist() for c in ragged}
    static = math.prod(s for c, s in sizes.items() if c not in ragged)
    product = sum(math.prod(host[c][i] for c in ragged) for i in range(batch)) * static
    if product <= _PER_SAMPLE_ELEMENTS * batch:
        return None
    out_rd = tuple(d for d, c in enumerate(out) if c in ragged)
    out_term = "".join(out[d] for d in out_rd) + "".join(c for d, c in enumerate(out) if d and d not in out_rd)
    equation = ",".join(_storage_term(o, t) for t, o in zip(terms, operands)) + "->" + out_term
    return equation, [sizes[out[d]] for d in out_rd], out_rd
