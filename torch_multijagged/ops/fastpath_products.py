"""Products between multi_jagged tensors on the eager values path (NOTE [ Eager values path ] in
``fastpath.py``): ``einsum``'s contraction of a ragged dim of square pairs (NOTE [ Contracting a
ragged dim ]), and ``matmul`` / ``einsum`` products of NOTE [ Matmul between multi_jagged
tensors ] — in any subscript order, with attention scores held per sample where the blocks are
large (NOTE [ Attention scores held per sample ]). Entries of the values path's table (``FAST``),
registered on import."""

from __future__ import annotations

import torch

from ..kernels import ragged_mm as _kmm
from ..structure import partition_for
from .contractions import einsum as _ein, pair_mm as _pm, ragged_mm as _rmm, sample_mm as _smm
from .fastpath import FAST, MJT, _DisableTF, result, values

__all__: list[str] = []


def _pair_mm(a, b, tx, ty):
    return result(_pm.pair_matmul_on_values(a._partition, values(a), values(b), tx, ty), a._partition, a._ragged_dims)


def _einsum(equation, *operands):
    """The contraction of a ragged dim of two square pairs (NOTE [ Contracting a ragged dim ]) on
    the values; every other ``einsum`` takes its route."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or not all(isinstance(o, MJT) for o in operands):
        return NotImplemented
    terms, out = _ein._explicit(equation, operands)
    if len(set(out)) != len(out):
        return NotImplemented  # the route raises
    if torch.is_autocast_enabled(operands[0].device.type):
        return NotImplemented  # the route casts as dense autocast does
    product = _pm.pair_product(list(terms), list(operands), out, mm=_pair_mm)
    if product is not None:
        return product
    plan = _rmm.product_spec(operands[0], terms[0], operands[1], terms[1], out)
    # the same product in another subscript order (``bihd,bjhd->bhij``), as the route's
    hit = None if plan is not None else _rmm.permuted_spec(operands[0], terms[0], operands[1], terms[1], out)
    if hit is None:
        return _ragged_product(plan)
    res = _ragged_product(hit[0])
    return res if res is NotImplemented or hit[1] is None else res.permute(hit[1])


def _ragged_product(plan):
    """A product of NOTE [ Matmul between multi_jagged tensors ] on the values (``plan`` from
    ``product_spec``; None: not one)."""
    if plan is None:
        return NotImplemented
    x, y, spec, extents, ragged_dims = plan
    with _DisableTF():  # (a wrapper holding pieces has no values to read them from)
        dtype, device = x.dtype, x.device
        if dtype != y.dtype or torch.is_autocast_enabled(device.type):
            return NotImplemented  # the route raises as dense does, or casts as autocast does
    held = _smm.sample_product(x, y, spec, extents, ragged_dims, dtype, device, values, result)
    if held is not None:
        return held
    out = _kmm.ragged_matmul(values(x), values(y), spec)
    return result(out, partition_for(extents), ragged_dims) if extents else out


def _matmul(input, other):
    if not (isinstance(input, MJT) and isinstance(other, MJT)):
        return NotImplemented
    return _ragged_product(_rmm.matmul_spec(input, other))


FAST[torch.einsum] = _einsum
FAST[torch.matmul] = FAST[torch.Tensor.matmul] = FAST[torch.Tensor.__matmul__] = _matmul
