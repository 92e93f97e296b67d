"""The dense op along a ragged dim of a multi_jagged structure, by sample or padded (NOTE [ Dense
ops along a ragged dim ] in ``kernels/dense_along.py``): the form's choice and its cached maps."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from ..compile.kernel_choice import use_triton
from ..kernels import dense_along as da
from ..kernels.reference import _is_traced
from ..structure import Partition
from ._common import MJT, sample_rows

__all__ = ["eager", "dense_along", "per_sample", "padded_form", "same_lines", "ragged_after"]


def eager(x: MJT) -> bool:
    """Whether ``x``'s op along a ragged dim may take the dense forms: real (untraced) values
    and host sizes, and no Triton kernel chosen for its device (``kernel_choice.use_triton``)."""
    v = x._values
    return not torch.compiler.is_compiling() and not _is_traced(v) and not use_triton(v)


def _place(p: Partition, k: int, right: bool):
    """``((pos, segment, cell), segments, m)`` of the envelope along ragged dim ``k`` (NOTE
    [ Derived maps ], key ``("envelope", k, right)``)."""
    def compute(p: Partition):
        keep = tuple(i for i in range(p.nragged) if i != k)
        segment, sub = p.map_to_sub(keep)
        _, coords = p.row_coords()
        e = p.extents[k]
        m = e.max
        if right:
            sample = sub.row_sample() if sub.nragged else torch.arange(p.batch, device=p.offsets.device)
            seg_len = e.lengths().to(p.offsets.device).index_select(0, sample)
        else:
            seg_len = segment.new_zeros(0)
        return da.padded_positions_along(segment, coords[:, k], seg_len, m, right), sub.rows, m

    return p.derived(("envelope", k, right), compute)


def dense_along(fn: Callable[..., object], x: MJT, d: int, tensors: Sequence[torch.Tensor], fills: Sequence,
                right: bool = False, by_lines: bool = True, length_one: bool = False,
                fn_out: Optional[Callable[..., object]] = None, out_dtypes: Sequence[torch.dtype] = ()
                ) -> tuple[torch.Tensor, ...]:
    """``fn(*components, dim)`` along ragged logical dim ``d`` of ``x``'s structure, for packed
    ``tensors`` of that structure (``x``'s values or tensors shaped as them), as packed results.
    ``fills``: each tensor's neutral element for the padded form; ``right``: pad before the
    segments instead of after them (a scan whose backward reads the cells after each one).
    ``by_lines``: the kernel computes every line along the dim alike whatever the tensor's
    other sizes (the scans); otherwise (softmax) the padded form is taken only where its
    envelope gives every line the layout the sample's own call gives it (``same_lines``).
    ``length_one``: a segment of one cell is its own result, as the dense op's derivative takes
    it (``cumprod``'s backward passes the gradient through for a dim of size 1; in an envelope
    it would divide ``output · grad`` by the input). ``fn_out(*components, dim, *outs)``: the op
    writing results of ``out_dtypes`` into ``outs``, for ``kernels.dense_along.by_sample``. Eager
    only (``eager(x)``)."""
    p = x._partition
    # a complex product of one cell is not the cell (``1 · (inf + 0j)`` has a nan part), so a
    # complex ``length_one`` goes sample by sample
    if not padded_form(x, d, tensors[0], by_lines) or (length_one and tensors[0].is_complex()):
        return da.by_sample(fn, tensors, sample_rows(p)[0], x._ragged_dims, d - 1, fn_out, out_dtypes)
    k = x._ragged_dims.index(d)
    place, segments, m = _place(p, k, right)
    # SYNC: none — host lengths
    if not (length_one and m > 1 and bool((p.extents[k].host_lengths() == 1).any())):
        return da.padded(fn, tensors, fills, place, segments, m)
    one = p.derived(("length_one", k), lambda p: p.extents[k].lengths().to(p.offsets.device)[p.row_sample()] == 1)
    cols = [one.view(-1, *([1] * (t.dim() - 1))) for t in tensors]
    outs = da.padded(fn, [torch.where(c, f, t) for c, f, t in zip(cols, fills, tensors)], fills, place, segments, m)
    return tuple(torch.where(cols[0], tensors[0].to(o.dtype), o) for o in outs)


def padded_form(x: MJT, d: int, values: torch.Tensor, by_lines: bool) -> bool:
    """Whether ``dense_along`` takes the padded form for packed ``values`` (else sample by sample)."""
    p = x._partition
    return (by_lines or same_lines(x, d)) and da.use_padded(p.rows, math.prod(values.shape[1:]), p.batch)


def per_sample(fn: Callable[..., object], x: MJT, d: int, tensors: Sequence[torch.Tensor],
               fn_out: Optional[Callable[..., object]] = None, out_dtypes: Sequence[torch.dtype] = ()
               ) -> tuple[torch.Tensor, ...]:
    """``fn(*components, dim)`` sample by sample along logical dim ``d`` (ragged or static) of
    ``x``'s structure (``kernels.dense_along.by_sample``). Eager only."""
    return da.by_sample(fn, tensors, sample_rows(x._partition)[0], x._ragged_dims, d - 1, fn_out, out_dtypes)


def ragged_after(x: MJT, d: int) -> bool:
    """Whether a ragged dim follows dim ``d``: a softmax along a static ``d`` then vectorises, in
    each sample's own call, across elements whose count depends on the sample."""
    return any(r > d for r in x._ragged_dims)


def same_lines(x: MJT, d: int) -> bool:
    """Whether aten's softmax kernels see every line along ragged dim ``d`` in the envelope
    ``(segments, m, *static)`` as in the sample's own call: the dim is not last (the last-dim
    kernels reduce a line by vector lanes and a length-dependent tail) and only static dims
    follow it (the other kernels vectorise across the elements after the dim, so which of
    them take the scalar tail depends on how many there are)."""
    return all(e not in x._ragged_dims for e in range(d + 1, len(x._size))) and d < len(x._size) - 1
