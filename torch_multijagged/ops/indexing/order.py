"""Order along ragged dims, per sample: ``flip`` (and ``fliplr`` / ``flipud`` / ``reversed``),
``roll``, ``rot90``, ``diff`` and ``gradient`` — each sample's positions reversed, shifted or
differenced within its own extent; along static dims they act on the values (NOTE [ Indexing along ragged
dims ] in ``along.py``)."""

from __future__ import annotations

import math

import torch

from ... import constructors
from ...bridge import values_of, wrap_values
from ...kernels.along import join_blocks
from .._common import MJT, canonical_dim, describe, sample_rows, static_dims
from .._routing import route
from .along import by_blocks, eager_or_traced, keep_along
from .slicing import _static_values

__all__ = ["flip_ragged"]


@eager_or_traced
def flip_ragged(op: str, x: MJT, ragged: list[int], shifts=None):
    """Flip (``shifts`` None) or roll the ragged dims ``ragged`` (indices) of each sample (sizes
    kept: no new extent, so it traces)."""
    n = x._partition.device_sizes()

    def source(sample, a):
        a = a.clone()
        for j, k in enumerate(ragged):
            nk = n[sample, k]
            if shifts is None:
                a[:, k] = nk - 1 - a[:, k]
            else:
                # a row's sample has nk ≥ 1; Inductor's fused kernel may evaluate lanes of no row,
                # whose 0 would raise its integer-division check
                a[:, k] = torch.remainder(a[:, k] - shifts[j], nk.clamp_min(1))
        return a

    if shifts is not None and ragged == [0] and by_blocks(x):
        # each sample's last ``shift`` positions, then the rest: one cat (NOTE [ Blocks of
        # consecutive rows ] in kernels/along.py)
        plan = x._partition.derived(("roll_blocks", shifts[0]), lambda p: _roll_blocks(p, shifts[0]))
        return wrap_values(join_blocks((values_of(x),), plan), x._partition, x._ragged_dims)
    return keep_along(x, list(x._partition.extents), source, key=("flip", tuple(ragged), None if shifts is None else tuple(shifts)))


def _roll_blocks(p, shift: int):
    """The blocks of ``roll(shift)`` along the first ragged dim: per sample its rows from position
    ``n - shift % n`` on, then those before."""
    sizes, counts = sample_rows(p)
    splits: list[int] = []
    order = []
    for ns, r in zip(sizes, counts):
        inner = math.prod(ns[1:])  # rows per position along the dim
        head = (ns[0] - shift % ns[0]) * inner if ns[0] else 0
        first = len(splits)
        splits += [c for c in (head, r - head) if c]
        order += [(0, first + 1), (0, first)] if head and r - head else [(0, first)] if r else []
    return [splits], order


@route(torch.flip, torch.Tensor.flip, sequence="dims")
def _flip(input, *dims):
    if not isinstance(input, MJT):
        return NotImplemented
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims
    canon = [canonical_dim("flip", input.dim(), d) for d in dims]
    if 0 in canon:  # the samples in reverse order, then the other dims
        rest = [d for d in canon if d != 0]
        out = constructors.select_batch(input, torch.arange(input._partition.batch - 1, -1, -1))
        return out.flip(rest) if rest else out
    ragged = [input._ragged_dims.index(d) for d in canon if d in input._ragged_dims]
    statics = [static_dims(input.dim(), input._ragged_dims).index(d) + 1 for d in canon if d not in input._ragged_dims]
    out = flip_ragged("flip", input, ragged) if ragged else input
    if statics or not ragged:  # flip of no dim at all is a copy, as in dense torch
        out = _static_values(out, lambda v: v.flip(statics))
    return out


@route(torch.Tensor.__reversed__)
def _reversed(input):
    """``reversed(x)``: the samples in reverse order (dense torch's ``flip(0)``)."""
    return _flip(input, [0]) if isinstance(input, MJT) else NotImplemented


@route(torch.fliplr, torch.Tensor.fliplr)
def _fliplr(input):
    return _flip(input, [1]) if isinstance(input, MJT) else NotImplemented


@route(torch.flipud, torch.Tensor.flipud)
def _flipud(input):
    """``flipud``: dense torch's ``flip(0)``, the samples in reverse order."""
    return _flip(input, [0]) if isinstance(input, MJT) else NotImplemented


@route(torch.roll, torch.Tensor.roll)
def _roll(input, shifts, dims=None):
    if not isinstance(input, MJT):
        return NotImplemented
    if dims is None:
        raise NotImplementedError(f"roll(): without dims (the flattened tensor) of {describe(input)} for layout torch.multi_jagged; name the dims")
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll(): shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    canon = [canonical_dim("roll", input.dim(), d) for d in dims]
    if 0 in canon:
        raise NotImplementedError(f"roll(): along the batch dim of {describe(input)} for layout torch.multi_jagged")
    ragged = [(input._ragged_dims.index(d), s) for d, s in zip(canon, shifts) if d in input._ragged_dims]
    statics = [(static_dims(input.dim(), input._ragged_dims).index(d) + 1, s) for d, s in zip(canon, shifts)
               if d not in input._ragged_dims]
    out = flip_ragged("roll", input, [k for k, _ in ragged], [s for _, s in ragged]) if ragged else input
    if statics:
        out = _static_values(out, lambda v: v.roll([s for _, s in statics], [vd for vd, _ in statics]))
    return out


@route(torch.diff, torch.Tensor.diff)
def _diff(input, n=1, dim=-1, prepend=None, append=None):
    """``diff`` along a ragged dim: per sample ``x[1:] - x[:-1]`` along it (each sample one row
    shorter, an empty one stays empty), ``n`` times; along a static dim it acts on the values."""
    if not isinstance(input, MJT):
        return NotImplemented
    d = canonical_dim("diff", input.dim(), dim)
    if d not in input._ragged_dims:
        return NotImplemented
    if prepend is not None or append is not None:
        # as dense: joined along the dim first (each sample's own pieces, torch.cat's rule)
        input = torch.cat([t for t in (prepend, input, append) if t is not None], d)
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")  # dense's words
    if n == 0:
        return input.clone()  # a new tensor, as dense's (never the input itself)
    head = (slice(None),) * d
    step = torch.ne if input.dtype == torch.bool else torch.sub  # dense: logical_xor for bool
    for _ in range(n):
        input = step(input[head + (slice(1, None),)], input[head + (slice(None, -1),)])
    return input


@route(torch.gradient)
def _gradient(input, *, spacing=1, dim=None, edge_order=1):
    """``torch.gradient`` along given dims, ragged ones included: dense's own formula (central
    differences inside, one-sided ones of ``edge_order`` at each sample's ends), from slices of the
    dim and their ``cat``, so that each sample's result is dense's on it. Coordinates as tensors
    are taken along static dims only (along a ragged dim they would differ per sample)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if dim is None:
        raise NotImplementedError(f"gradient(): over every dim of {describe(input)}, the batch dim too, for layout "
                                  "torch.multi_jagged; give dim")
    dims = [canonical_dim("gradient", input.dim(), d) for d in ([dim] if isinstance(dim, int) else dim)]
    if len(set(dims)) != len(dims):
        raise RuntimeError("torch.gradient expected each dimension to be given once")  # dense's duplicate-dim check
    if 0 in dims:
        raise NotImplementedError(f"gradient(): along the batch dim of {describe(input)} for layout torch.multi_jagged")
    if edge_order not in (1, 2):
        raise RuntimeError("torch.gradient only supports edge_order=1 and edge_order=2.")
    steps = list(spacing) if isinstance(spacing, (list, tuple)) else [spacing] * len(dims)
    if len(steps) != len(dims):
        raise RuntimeError(f"torch.gradient expected spacing to be unspecified, a scalar or it's spacing and dim "
                           f"arguments to have the same length, but got a spacing argument of length {len(steps)} "
                           f"and a dim argument of length {len(dims)}.")
    p = input._partition
    for d in dims:
        if d in input._ragged_dims:
            lengths = p.extents[input._ragged_dims.index(d)].host_lengths()
            # SYNC: none — host lengths
            small = lengths.numel() > 0 and int(lengths.min()) < edge_order + 1
        else:
            small = input.shape[d] < edge_order + 1
        if small:
            raise RuntimeError("torch.gradient expected each dimension size to be at least edge_order+1")
    out = []
    for d, h in zip(dims, steps):
        if isinstance(h, torch.Tensor) and h.dim() > 0:
            if d in input._ragged_dims:
                raise NotImplementedError(f"gradient(): coordinates along ragged dim {d} of {describe(input)} (they "
                                          "would differ per sample); give a scalar spacing")
            out.append(_gradient_coordinates(input, d, h, edge_order))
            continue
        head = (slice(None),) * d

        def at(a, b):
            return input[head + (slice(a, b),)]

        center = (at(2, None) - at(None, -2)) / h
        if edge_order == 1:
            first = (at(1, 2) - at(0, 1)) / h
            last = (at(-1, None) - at(-2, -1)) / h
        else:
            first = (at(0, 1) * -1.5 + at(1, 2) * 2 - at(2, 3) * 0.5) / h
            last = (at(-3, -2) * 0.5 + at(-2, -1) * -2 + at(-1, None) * 1.5) / h
        out.append(torch.cat([first, center / 2, last], d))
    return tuple(out)


def _gradient_coordinates(input: MJT, d: int, coords: torch.Tensor, edge_order: int):
    """``gradient`` along static dim ``d`` with coordinates: dense's op on the values."""
    vd = static_dims(input.dim(), input._ragged_dims).index(d) + 1
    return _static_values(input, lambda v: torch.gradient(v, spacing=[coords], dim=vd, edge_order=edge_order)[0])


@route(torch.rot90, torch.Tensor.rot90)
def _rot90(input, k=1, dims=(0, 1)):
    """dense torch's composition: ``flip`` of one of the two dims and a ``transpose`` (ragged dims
    included: a rectangular pair ``(B, j0, j1)`` turns into ``(B, j1, j0)``)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if len(dims) != 2:
        raise RuntimeError(f"rot90(): expected total rotation dims == 2, but got dims = {len(dims)}")
    d0, d1 = (canonical_dim("rot90", input.dim(), d) for d in dims)
    if d0 == d1:
        raise RuntimeError(f"rot90(): expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    if 0 in (d0, d1):
        raise NotImplementedError(f"rot90(): along the batch dim of {describe(input)} for layout torch.multi_jagged")
    k %= 4
    if k == 1:
        return _flip(input, [d1]).transpose(d0, d1)
    if k == 2:
        return _flip(input, [d0, d1])
    if k == 3:
        return _flip(input, [d0]).transpose(d0, d1)
    return input.clone()
