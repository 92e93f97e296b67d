"""``einsum``: contractions of static dims on the packed values, diagonals of square pairs,
(through ``pair_product``) contractions of a ragged dim of square pairs, (through
``product_spec`` and ``permuted_spec``, eagerly) two-operand products of matmul's shape in any
subscript order as per-sample matmuls, and (through ``sample_spec``, eagerly) other contractions
as dense ``einsum`` per sample; the broadcast product otherwise."""

from __future__ import annotations

import functools

import torch

from .. import bridged
from .._common import MJT, autocast_lower, describe, same_partition
from .._routing import route
from ..shape.diagonal import square_extent
from .pair_mm import pair_product
from .ragged_mm import permuted_spec, product_spec
from .sample_einsum import sample_spec

_LAYOUT = "layout torch.multi_jagged"


def _diagonals(op: MJT, term: str, equation: str):
    """``(op, term)`` with every subscript repeated on two ragged dims replaced by the diagonal
    (``biic`` on a square pair → ``bic``, via ``torch.diagonal``)."""
    for d1 in op._ragged_dims:
        c = term[d1]
        d2 = next((d for d in op._ragged_dims if d > d1 and term[d] == c), None)
        if d2 is None:
            continue
        square_extent("einsum", op, d1, d2, f" (subscript {c!r} on ragged dims {d1} and {d2} of {equation!r})")
        # diagonal removes both dims and appends the diagonal; move it back to d1
        op = torch.diagonal(op, 0, d1, d2).movedim(-1, d1)
        term = term[:d2] + term[d2 + 1:]
        return _diagonals(op, term, equation)
    for d in range(1, op.dim()):
        c = term[d]
        if d not in op._ragged_dims and any(term[r] == c for r in op._ragged_dims):
            raise NotImplementedError(
                f"einsum(): subscript {c!r} labels both a ragged and a static dim of {describe(op)} in "
                f"{equation!r}, which {_LAYOUT} cannot express"
            )
    if term[0] in term[1:]:
        raise NotImplementedError(f"einsum(): the batch subscript {term[0]!r} labels another dim too in {equation!r}")
    return op, term


def _explicit(equation: str, operands) -> tuple[list[str], str]:
    """``(terms, out)`` of ``equation`` with one subscript per dim: every ``...`` replaced by
    letters the equation does not use (right-aligned across operands, as broadcasting), and an
    implicit output made explicit as dense torch does (the ellipsis dims, then the subscripts
    that appear once, in alphabetical order)."""
    ndims = tuple(len(o._size) if isinstance(o, MJT) else o.dim() for o in operands)
    terms, out = _explicit_dims(equation, ndims)
    return list(terms), out


@functools.lru_cache(maxsize=256)
def _explicit_dims(equation: str, ndims: tuple[int, ...]) -> tuple[tuple[str, ...], str]:
    """``_explicit`` of operands with ``ndims`` dims (cached: parsed once per equation and ranks)."""
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"einsum(): expected {len(terms)} operands for {equation!r}, got {len(ndims)}")
    free = [c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in equation]
    widths = [nd - (len(t) - 3) if "..." in t else 0 for t, nd in zip(terms, ndims)]
    ell = free[: max(widths, default=0)][::-1]
    if any(w < 0 for w in widths) or len(ell) < max(widths, default=0):
        raise ValueError(f"einsum(): an ellipsis covers more dims than operand has in {equation!r}")
    bad = next((i for i, c in enumerate(lhs) if not (c.isascii() and c.isalpha()) and c not in ",."), None)
    if bad is not None:  # dense's words
        raise ValueError(f"einsum(): invalid subscript given at index {bad} in the equation string, subscripts must "
                         "be in [a-zA-Z]")
    terms = [t.replace("...", "".join(ell[len(ell) - w:])) for t, w in zip(terms, widths)]
    for k, (term, nd) in enumerate(zip(terms, ndims)):
        if len(term) != nd or not (term.isalpha() or not term):  # '' is a 0-d operand's term
            raise ValueError(
                f"einsum(): the number of subscripts in the equation ({len(term)}) does not match the number "
                f"of dimensions ({nd}) for operand {k} in {equation!r}"
            )
    if not arrow:
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1 and c not in ell)
        out = "".join(ell) + "".join(once)
    else:
        out = out.replace("...", "".join(ell))
        if not out.isalpha() and out:
            raise ValueError(f"einsum(): invalid output subscripts {out!r} in {equation!r}")
        missing = next((c for c in out if c not in "".join(terms)), None)
        if missing is not None:  # dense's words: a letter for no dim, never a new dim of size 1
            raise ValueError(f"einsum(): output subscript {missing} does not appear in the equation for any input "
                             "operand")
    return tuple(terms), out


@route(torch.einsum)
def _einsum(equation, *operands):
    """``einsum`` that contracts static dims only: every multi_jagged operand carries the same
    batch and ragged subscripts (and structure), which the output keeps in order; the packed rows
    stand in for them, so the contraction runs on the values. A subscript repeated on the two
    ragged dims of a square pair takes its diagonal first (``bii->bi``)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not any(isinstance(o, MJT) for o in operands):
        return NotImplemented
    terms, out = _explicit(equation, operands)
    if len(set(out)) != len(out):
        raise ValueError(f"einsum(): expected each output subscript once, got {out!r} in {equation!r}")
    dtypes = [o.dtype for o in operands]  # (each read is a call on a multi_jagged operand: once)
    if not all(d.is_floating_point or d.is_complex for d in dtypes):
        summed = _sum_alone(equation, terms, list(operands), out)
        if summed is not None:
            return summed
    if torch.is_autocast_enabled(operands[0].device.type) and _contracts(terms, out):
        operands = autocast_lower(*operands)  # as dense einsum's products (bmm) under autocast
        dtypes = [o.dtype for o in operands]
    operands, terms = list(operands), list(terms)
    product = pair_product(terms, operands, out)  # NOTE [ Contracting a ragged dim ]
    if product is not None:
        return product
    if len(set(dtypes)) > 1:
        _check_contracted_dtypes(equation, terms, dtypes, out)
    if len(operands) == 2 and dtypes[0] == dtypes[1]:
        plan = product_spec(operands[0], terms[0], operands[1], terms[1], out)
        if plan is not None:  # NOTE [ Matmul between multi_jagged tensors ]
            return bridged.ragged_matmul(*plan)
        product = _permuted_product(terms, operands, out)
        if product is not None:
            return product
    for k, o in enumerate(operands):
        if isinstance(o, MJT):
            operands[k], terms[k] = _diagonals(o, terms[k], equation)
    _squeeze_dense_broadcasts(terms, operands)
    mjts = [o for o in operands if isinstance(o, MJT)]
    ref = mjts[0]
    ragged_letters = ref_term = None
    for term, op in zip(terms, operands):
        if isinstance(op, MJT):
            ref_term = ref_term or term
            letters = term[0] + "".join(term[d] for d in op._ragged_dims)
            ragged_letters = ragged_letters or letters
            if letters != ragged_letters or op._ragged_dims != ref._ragged_dims or not same_partition(op._partition, ref._partition):
                return _general_einsum(equation, terms, operands, out)
    dense_terms = [t for t, o in zip(terms, operands) if not isinstance(o, MJT)]
    positions = [out.find(c) for c in ragged_letters]
    if any(c in t for t in dense_terms for c in ragged_letters) or -1 in positions or positions != sorted(positions) or positions[0] != 0:
        return _general_einsum(equation, terms, operands, out)
    used = set("".join(terms) + out)  # (an ellipsis' letters too, which the equation does not show)
    row = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in used)

    def packed(term):
        return row + "".join(c for c in term if c not in ragged_letters)

    packed_eq = ",".join(packed(t) if isinstance(o, MJT) else t for t, o in zip(terms, operands)) + "->" + packed(out)
    return bridged.einsum(packed_eq, operands, ref._partition, tuple(positions[1:]))


def _check_contracted_dtypes(equation: str, terms: list, dtypes: list, out: str) -> None:
    """A contraction is a ``bmm`` in dense einsum, which promotes nothing (a product alone does):
    operands of other dtypes (``dtypes``, one per term) that share a subscript the output drops
    raise, as there."""
    for c in sorted(set("".join(terms)) - set(out)):
        held = [d for t, d in zip(terms, dtypes) if c in t]
        if len(set(held)) > 1:
            other = next(d for d in held if d != held[0])
            raise RuntimeError(f"einsum(): expected scalar type {held[0]} but found {other} (contracting "
                               f"subscript {c!r} of {equation!r})")


def _contracts(terms: list, out: str) -> bool:
    """Whether dense einsum runs a ``bmm``, which autocast lowers: a subscript that the output drops
    appears in two operands (one operand's sums, outer and elementwise products are a ``sum`` and a
    ``mul``, which it does not)."""
    seen: set = set()
    for t in terms:
        if (set(t) - set(out)) & seen:
            return True
        seen |= set(t) - set(out)
    return False


def _sum_alone(equation: str, terms: list, operands: list, out: str):
    """Integer and bool operands: dense einsum first takes each operand's diagonals and sums the
    subscripts that only it has and the output drops, with ``sum`` — which accumulates into int64
    (a bool sum counts) — before any product, whose ``bmm`` keeps the dtype. The equation with
    those sums done, or None where there are none."""
    changed = False
    for k, (t, o) in enumerate(zip(terms, operands)):
        if o.is_floating_point() or o.is_complex():
            continue
        if isinstance(o, MJT) and len(set(t)) < len(t):
            o, t = _diagonals(o, t, equation)
        elif len(set(t)) < len(t):
            o, t = _dense_diagonals(o, t)
        others = "".join(u for j, u in enumerate(terms) if j != k) + out
        alone = [i for i, c in enumerate(t) if c not in others]
        if alone or t != terms[k]:
            changed = True
            operands[k] = o.sum(alone) if alone else o
            terms[k] = "".join(c for i, c in enumerate(t) if i not in alone)
    if not changed:
        return None
    return torch.einsum(",".join(terms) + "->" + out, *operands)


def _dense_diagonals(o: torch.Tensor, t: str):
    """A dense operand's repeated subscripts as its diagonals (dense einsum's first step)."""
    for i, c in enumerate(t):
        j = t.find(c, i + 1)
        if j != -1:
            return _dense_diagonals(torch.diagonal(o, 0, i, j).movedim(-1, i), t[:j] + t[j + 1:])
    return o, t


def _permuted_product(terms: list, operands: list, out: str):
    """A per-sample matmul (NOTE [ Matmul between multi_jagged tensors ]) in another subscript order:
    the operands permuted into matmul's (``matmul_form``), the product permuted into ``out``'s; None
    where the permuted operands are not one either."""
    if torch.compiler.is_compiling():
        return None  # (traced: product_spec takes none; no permutes into the graph)
    hit = permuted_spec(operands[0], terms[0], operands[1], terms[1], out)
    if hit is None:
        return None
    res = bridged.ragged_matmul(*hit[0])
    return res if hit[1] is None else res.permute(hit[1])


def _general_einsum(equation: str, terms: list, operands: list, out: str):
    """A contraction no packed-values form takes: eagerly dense ``einsum`` sample by sample where
    the broadcast product would be large (NOTE [ Contractions sample by sample ]), else the
    broadcast product (NOTE [ einsum by broadcasting ])."""
    spec = sample_spec(terms, operands, out)
    if spec is not None:
        return bridged.sample_einsum(spec[0], operands, *spec[1:])
    return _broadcast_einsum(equation, terms, operands, out)


def _squeeze_dense_broadcasts(terms: list, operands: list) -> None:
    """A dense operand's size-1 dim under a subscript that is ragged in a multi_jagged operand
    broadcasts, as dense einsum broadcasts size-1 dims (``bnd,bnd->bd`` with a ``(B, 1, D)``
    weight): the same product with that dim squeezed and its subscript dropped (in place)."""
    ragged = {t[d] for t, o in zip(terms, operands) if isinstance(o, MJT) for d in o._ragged_dims}
    for k, (t, o) in enumerate(zip(terms, operands)):
        if isinstance(o, MJT):
            continue
        drop = [i for i, c in enumerate(t) if c in ragged and o.shape[i] == 1]
        if drop:
            operands[k] = o.squeeze(drop)
            terms[k] = "".join(c for i, c in enumerate(t) if i not in drop)


def _broadcast_einsum(equation: str, terms: list, operands: list, out: str):
    """NOTE [ einsum by broadcasting ]

    Any contraction that is valid per sample, as the broadcast product summed over the contracted
    subscripts: every operand is permuted to one subscript order (the output's, then the
    contracted ones) and unsqueezed where it lacks a subscript, so that multiplying them creates
    the ragged dims the output needs (``bhid,bhjd->bhij``: ``(B, H, j0, 1, D) · (B, H, 1, j0, D)``
    is a pair, NOTE [ Broadcasting over ragged dims ]) and summing contracts them, ragged ones
    included (``bij,bjd->bid``). It materialises the product (``Π`` of every subscript's size per
    sample); the pair product, the static-dim contraction and (eagerly) the per-sample matmul of
    NOTE [ Matmul between multi_jagged tensors ] above are the fast paths, and traced code keeps
    this one (Inductor fuses the product into the sum). Every multi_jagged operand has the batch subscript at
    dim 0, and the output starts with it."""
    batch = {t[0] for t, o in zip(terms, operands) if isinstance(o, MJT)}
    if len(batch) != 1:
        raise ValueError(f"einsum(): multi_jagged operands must share the batch subscript (their dim 0) in {equation!r}")
    b = batch.pop()
    if not out.startswith(b):
        raise NotImplementedError(
            f"einsum(): the output must start with the batch subscript {b!r} in {equation!r} for {_LAYOUT}"
        )
    ragged = {t[d] for t, o in zip(terms, operands) if isinstance(o, MJT) for d in o._ragged_dims}
    if any(c in ragged for t, o in zip(terms, operands) if not isinstance(o, MJT) for c in t):
        raise NotImplementedError(f"einsum(): dense operands cannot index the ragged dims in {equation!r} for {_LAYOUT}")
    contracted = []
    for t in terms:
        contracted += [c for c in t if c not in out and c not in contracted]
    order = out + "".join(contracted)
    product = None
    for t, o in zip(terms, operands):
        perm = sorted(range(len(t)), key=lambda i: order.index(t[i]))
        if perm != list(range(len(t))):
            o = o.permute(perm)
        have = "".join(t[i] for i in perm)
        for pos, c in enumerate(order):
            if c not in have:
                o = o.unsqueeze(pos)
                have = have[:pos] + c + have[pos:]
        product = o if product is None else product * o
    if contracted:
        # dense einsum contracts with bmm: an integer result keeps its dtype (a sum would
        # accumulate into int64), and bmm has no bool kernel
        if product.dtype == torch.bool:
            raise RuntimeError('einsum(): "bmm" not implemented for \'Bool\'')
        product = product.sum(dim=list(range(len(out), len(order))), dtype=product.dtype)
    return product


@route(torch.tensordot)
def _tensordot(a, b, dims=2, out=None):
    """``tensordot`` as ``einsum``: per sample when a multi_jagged operand is involved — two
    multi_jagged operands share the batch dim (``out[s] = tensordot(a[s], b[s], dims)`` with the
    dims of the samples), a dense one contributes its remaining dims after ``a``'s."""
    if out is not None or not (isinstance(a, MJT) or isinstance(b, MJT)):
        return NotImplemented
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    elif isinstance(dims, torch.Tensor):
        da, db = [int(d) for d in dims[0].reshape(-1)], [int(d) for d in dims[1].reshape(-1)]  # SYNC: dims are a spec
    else:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(da) != len(db):
        raise RuntimeError(f"both dimension lists should have same length, got {len(da)} and {len(db)}")
    da = [d % a.dim() for d in da]
    db = [d % b.dim() for d in db]
    if (isinstance(a, MJT) and 0 in da) or (isinstance(b, MJT) and 0 in db):
        raise NotImplementedError(f"tensordot(): contracting the batch dim of a multi_jagged operand for {_LAYOUT}")
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    ta = [next(letters) for _ in range(a.dim())]
    tb = [next(letters) for _ in range(b.dim())]
    for i, j in zip(da, db):
        tb[j] = ta[i]
    if isinstance(a, MJT) and isinstance(b, MJT):
        tb[0] = ta[0]
    out_terms = [c for i, c in enumerate(ta) if i not in da]
    out_terms += [c for j, c in enumerate(tb) if j not in db and not (isinstance(a, MJT) and isinstance(b, MJT) and j == 0)]
    if not isinstance(a, MJT):  # the batch subscript leads the output
        out_terms = [c for c in tb if c in out_terms][:1] + [c for c in out_terms if c != tb[0]]
    return torch.einsum(f"{''.join(ta)},{''.join(tb)}->{''.join(out_terms)}", a, b)
