"""Dense ops along one ragged dim, computed by dense torch itself: sample by sample on views of
the packed rows, or once on a padded envelope of the dim's segments.

NOTE [ Dense ops along a ragged dim ]

``softmax`` / ``log_softmax`` (and their backward) and ``cumsum`` / ``cumprod`` / ``logcumsumexp``
along a ragged dim are the dense op applied to every *segment* (the
cells of one sample that share every other coordinate). Eagerly they run as the dense kernel
itself, in one of two forms, so that every row sees dense torch's own sequence of operations
(its accumulation type, its rounding, its NaN and tie rules) and autograd records dense ops
(dense torch's own derivative formulas, of every order):

* ``by_sample``: the dense op on each sample's component, a view of its packed rows laid out as
  ``x.unbind()`` gives it (the user's loop). Where no gradient is recorded the results are
  written into the packed result (aten's out= kernels into contiguous views; a permuted result
  is copied in, since ``_softmax.out`` writes a permuted ``out=`` wrong); else one ``cat`` packs
  them. Exactly the per-sample computation, also for kernels whose result depends on the length
  (the vector lanes of a last-dim softmax, ``cumprod``'s backward for a length of 1 or a zero in
  the sample). It costs a few dense calls and a few µs of Python per sample.
* ``padded``: the segments written into an envelope ``(segments, max n, *static)`` filled with
  the op's neutral element (``-inf`` for a softmax, 0 for a sum, 1 for a product), the dense op
  along it once, the real cells read back. A scan reads only the cells before each one, so a
  fill after the segments changes nothing (``cumprod``, whose backward reads the cells after
  each one, puts it before them); a softmax's fill adds ``exp(-inf) = 0`` to its sum. Pays the
  envelope's empty cells (1/ρ) and two copies, but one call for the batch. A softmax takes it
  only where the envelope gives every line the kernel path the sample's own call gives it
  (``ops/_along.py``: ``same_lines``).

``use_padded`` picks the form by the average elements per sample (``PADDED_BELOW``), measured
(``docs/design.md`` §16). Both need host sizes, so they are eager only; traced code keeps the
segment formulations of ``reference.py`` and ``ops/nn/ragged.py``.

Reductions over ragged dims of long samples take the per-sample form too
(``reduce_by_sample``, and ``amax`` / ``amin``'s derivative ``extreme_backward_by_sample``;
NOTE [ Reductions sample by sample ] in ``ops/reductions/reduce.py``).

Plain tensors in and out; sizes arrive as host tensors and ints.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Sequence

import torch

from .reference import lead_major, storage_perm

__all__ = ["PADDED_BELOW", "use_padded", "by_sample", "pack_rows", "reduce_by_sample", "extreme_backward_by_sample",
           "padded_positions_along", "padded"]

# Below this many elements per sample (rows · static elements / B) one padded call beats a dense
# call per sample (measured, docs/design.md).
PADDED_BELOW = 2048


def _cat(parts: list) -> torch.Tensor:
    """``torch.cat(parts)`` of one dtype, outside autocast: its "promote" policy refuses a float16
    join under a bfloat16 autocast (and the reverse), where each part is what dense gave."""
    if torch.is_autocast_enabled(parts[0].device.type):
        with torch.autocast(parts[0].device.type, enabled=False):
            return torch.cat(parts, 0)
    return torch.cat(parts, 0)


def use_padded(rows: int, static: int, batch: int) -> bool:
    """Whether the padded form is the faster one for ``rows`` packed rows of ``static`` elements
    each over ``batch`` samples."""
    return batch > 1 and rows * static < PADDED_BELOW * batch


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class _PackRows(torch.autograd.Function):
    """Samples' results ``(*ragged sizes, *static)`` (any strides) written into packed rows ``(T,
    *static)`` with one copy each: ``cat`` would need their ragged dims merged first, a second copy
    where a result's storage order is not its own (a permuted ``einsum`` result). The backward hands
    each result the view of its rows (differentiable: any order)."""

    @staticmethod
    def forward(ctx, r: int, like, *results):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.shapes = [t.shape for t in results]
        ctx.counts = [math.prod(t.shape[:r]) for t in results]
        shape = (sum(ctx.counts), *results[0].shape[r:])
        if like is not None and like.shape == shape:
            out = _new_rows(like, results[0].dtype)
        else:
            out = results[0].new_empty(shape)
        for t, rows in zip(results, out.split(ctx.counts, 0)):
            rows.view(t.shape).copy_(t)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return (None,) * (len(ctx.shapes) + 2)
        return (None, None, *(g.reshape(shape) for g, shape in zip(grad.split(ctx.counts, 0), ctx.shapes)))


def _new_rows(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised packed rows shaped as ``like``, in its memory order where it lies static dims
    first (so that every sample's result is copied in as contiguous blocks), else row-major."""
    if lead_major(like):
        return torch.empty_like(like, dtype=dtype)
    return like.new_empty(like.shape, dtype=dtype)


def pack_rows(r: int, results: Sequence[torch.Tensor], like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Results ``(*ragged sizes, *static)`` of ``r`` ragged dims each, in any strides, as packed rows
    ``(T, *static)``: one copy each, differentiably (``_PackRows``); in ``like``'s memory order
    where it lies static dims first (``_new_rows``)."""
    return _PackRows.apply(r, None if like is None else like.detach(), *results)


@functools.lru_cache(maxsize=None)
def _perm(ndim: int, ragged_dims: tuple[int, ...]) -> tuple[list[int], list[int], bool]:
    """``storage_perm`` and whether it is the identity, per layout (callers do not mutate them)."""
    to_storage, to_logical = storage_perm(ndim, ragged_dims)
    return to_storage, to_logical, to_storage == sorted(to_storage)


def by_sample(fn: Callable[..., object], tensors: Sequence[torch.Tensor], host_sizes,
              ragged_dims: tuple[int, ...], dim: int, fn_out: Optional[Callable[..., object]] = None,
              out_dtypes: Sequence[torch.dtype] = ()) -> tuple[torch.Tensor, ...]:
    """``fn(*components, dim)`` for every sample (``dim``: the op's dim in a component), each
    result (or tuple of results, shaped as the components) packed back into rows.

    ``tensors``: packed values ``(T, *static)`` of one partition, whose (B, R) host sizes are
    ``host_sizes`` (a tensor, or its rows as Python ints). Samples without elements are skipped (their results have no rows). Where no
    gradient is recorded and a sample's component is its rows as they lie (the ragged dims lead,
    in order), ``fn_out(*components, dim, *outs)`` writes each sample's results straight into
    views of the packed results (``out_dtypes``, one per result) instead of a ``cat`` of them
    (aten's out= kernels, which write a contiguous ``out`` correctly: a permuted one can come out
    wrong, as for ``_softmax.out``); where the component is a permuted view of the rows, the
    functional op's result is copied into the same permuted view of the packed result."""
    r = len(ragged_dims)
    to_storage, to_logical, identity = _perm(r + tensors[0].dim(), ragged_dims)
    # SYNC: none — host sizes
    sizes = host_sizes.tolist() if isinstance(host_sizes, torch.Tensor) else host_sizes
    counts = [math.prod(ns) for ns in sizes]
    pieces = [t.split_with_sizes(counts) for t in tensors]
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if out_dtypes and not recording and not identity:
        # a sample's result is a permuted view of the packed result: the functional op, copied in
        rows, static = tensors[0].shape[0], tensors[0].shape[1:]
        outs_packed = [_new_rows(tensors[0], dt) for dt in out_dtypes]
        out_pieces = [o.split_with_sizes(counts) for o in outs_packed]
        for i, ns in enumerate(sizes):
            if counts[i]:
                res = _as_tuple(fn(*[p[i].view(*ns, *p[i].shape[1:]).permute(to_logical) for p in pieces], dim))
                for o, y in zip(out_pieces, res):
                    o[i].view(*ns, *static).permute(to_logical).copy_(y)
        return tuple(outs_packed)
    if fn_out is not None and identity and not recording:
        rows, static = tensors[0].shape[0], tensors[0].shape[1:]
        outs_packed = [tensors[0].new_empty((rows, *static), dtype=dt) for dt in out_dtypes]
        out_pieces = [o.split_with_sizes(counts) for o in outs_packed]
        if r == 1:  # a sample's rows are its component: no views to make (the common case, kept lean)
            for args in zip(*pieces, *out_pieces):
                if args[0].shape[0]:
                    fn_out(*args[:len(pieces)], dim, *args[len(pieces):])
            return tuple(outs_packed)
        for i, ns in enumerate(sizes):
            if counts[i]:
                fn_out(*[p[i].view(*ns, *p[i].shape[1:]) for p in pieces], dim,
                       *[o[i].view(*ns, *static) for o in out_pieces])
        return tuple(outs_packed)
    outs: list[list[torch.Tensor]] = []
    for i, ns in enumerate(sizes):
        if counts[i] == 0:
            continue
        if r == 1 and identity:  # a sample's rows are its component
            outs.append(list(_as_tuple(fn(*[p[i] for p in pieces], dim))))
            continue
        comps = []
        for p in pieces:
            c = p[i].view(*ns, *p[i].shape[1:])
            comps.append(c if identity else c.permute(to_logical))
        outs.append(list(_as_tuple(fn(*comps, dim))))
    if not outs:  # no element anywhere: the op on an empty component, for its dtype and shapes
        comps = [t.reshape(*([0] * r), *t.shape[1:]).permute(to_logical) for t in tensors]
        outs.append(list(_as_tuple(fn(*comps, dim))))
    packed = []
    for j in range(len(outs[0])):
        if not identity:
            # a result in the component's order is not its rows: written into them with one copy,
            # where merging its ragged dims (a copy) and then a ``cat`` (another) would take two
            packed.append(pack_rows(r, [o[j].permute(to_storage) for o in outs], tensors[0]))
            continue
        rows_j = []
        for o in outs:
            n = math.prod(o[j].shape[:r])
            rows_j.append(o[j].reshape(n, *o[j].shape[r:]))  # an explicit row count: a static size may be 0
        packed.append(rows_j[0] if len(rows_j) == 1 else _cat(rows_j))
    return tuple(packed)


def reduce_by_sample(values: torch.Tensor, sizes: Sequence[Sequence[int]], counts: Sequence[int],
                     reduced: Sequence[int], vdims: Sequence[int], kind: str, empty) -> torch.Tensor:
    """Dense torch's reduction ``kind`` (``"sum"``, ``"amax"``, ``"amin"`` or ``"logsumexp"``) of
    every sample's component, packed as rows: ``(Σ kept rows, *static with vdims as 1)``.

    ``values``: packed rows ``(T, *static)`` whose sample i holds ``counts[i]`` rows of ragged
    sizes ``sizes[i]`` (host ints); ``reduced``: the ragged dims reduced (their indices among the
    ragged dims); ``vdims``: the static dims reduced (dims of ``values``), kept as size 1. A
    sample's results are the rows of its kept ragged dims, row-major; where its reduced extents
    hold nothing, they are ``empty`` (amax / amin have no identity)."""
    static = list(values.shape[1:])
    r = len(sizes[0]) if sizes else 0
    dims = [*reduced, *(r - 1 + d for d in vdims)]
    out_static = [1 if i + 1 in vdims else n for i, n in enumerate(static)]
    op = getattr(torch.Tensor, kind)
    outs = []
    if r == 1 and not vdims:
        # one ragged dim, reduced alone (tokens ``(B, j0, C)`` over j0): each sample's rows as they
        # lie, one result row each (≈ 2.5 µs a sample less than the general form's views)
        for piece, n in zip(values.split_with_sizes(list(counts)), counts):
            outs.append(op(piece, 0, keepdim=True) if n else values.new_full((1, *static), empty))
        return values.new_full((0, *static), empty) if not outs else outs[0] if len(outs) == 1 else _cat(outs)
    for piece, ns, n in zip(values.split_with_sizes(list(counts)), sizes, counts):
        if n == 0:
            kept = math.prod(m for k, m in enumerate(ns) if k not in reduced)
            if kept:
                outs.append(values.new_full((kept, *out_static), empty))
            continue
        y = op(piece.view(*ns, *static), dims, keepdim=True)
        outs.append(y.view(-1, *out_static))  # n > 0: no size is 0
    if not outs:
        return values.new_full((0, *out_static), empty)
    return outs[0] if len(outs) == 1 else _cat(outs)


def arg_extreme_by_sample(values: torch.Tensor, sizes: Sequence[Sequence[int]], counts: Sequence[int],
                          reduced: int, kind: str) -> torch.Tensor:
    """Dense torch's ``argmax`` (``kind`` ``"amax"``) or ``argmin`` (``"amin"``) of every sample's
    component along its ragged dim ``reduced`` (an index among the ragged dims), packed as rows
    ``(Σ kept rows, *static)``, as ``reduce_by_sample`` packs them: the first extreme's position,
    a NaN counting as the extreme. Where a sample's reduced extent is empty, its kept rows hold 0."""
    static = list(values.shape[1:])
    op = torch.argmax if kind == "amax" else torch.argmin
    outs = []
    for piece, ns, n in zip(values.split_with_sizes(list(counts)), sizes, counts):
        if n == 0:
            kept = math.prod(m for k, m in enumerate(ns) if k != reduced)
            if kept:
                outs.append(values.new_zeros((kept, *static), dtype=torch.int64))
            continue
        outs.append(op(piece.view(*ns, *static), reduced, keepdim=True).view(-1, *static))
    if not outs:
        return values.new_zeros((0, *static), dtype=torch.int64)
    return outs[0] if len(outs) == 1 else _cat(outs)


def extreme_backward_by_sample(grad: torch.Tensor, values: torch.Tensor, result: torch.Tensor,
                               sizes: Sequence[Sequence[int]], counts: Sequence[int], reduced: Sequence[int],
                               vdims: Sequence[int]) -> torch.Tensor:
    """Dense torch's ``amax`` / ``amin`` derivative per sample (``(grad / ties) · (x == result)``:
    ties share the gradient, a NaN result gives NaN) for ``reduce_by_sample``'s ``result`` and its
    gradient ``grad`` (its rows and shape), as packed rows of ``values``. Written into the packed
    gradient (out=) where nothing records; recorded, packed by one ``cat``."""
    static = list(values.shape[1:])
    r = len(sizes[0]) if sizes else 0
    dims = [*reduced, *(r - 1 + d for d in vdims)]
    out_static = list(result.shape[1:])
    recording = torch.is_grad_enabled() and (grad.requires_grad or values.requires_grad or result.requires_grad)
    kept = [math.prod(m for k, m in enumerate(ns) if k not in reduced) for ns in sizes]
    gs, rs = grad.split_with_sizes(kept), result.split_with_sizes(kept)
    gi = None if recording else values.new_empty(values.shape)
    gis = None if gi is None else gi.split_with_sizes(list(counts))
    outs = []
    for i, (piece, ns, n) in enumerate(zip(values.split_with_sizes(list(counts)), sizes, counts)):
        if n == 0:  # no rows (an empty reduced extent's results take no gradient)
            continue
        shape = [*(1 if k in reduced else m for k, m in enumerate(ns)), *out_static]
        hit = piece.view(*ns, *static) == rs[i].view(shape)
        scaled = gs[i].view(shape) / hit.sum(dims, keepdim=True)
        if gis is None:
            outs.append((scaled * hit).view(n, *static))
        else:
            torch.mul(scaled, hit, out=gis[i].view(*ns, *static))
    if gi is not None:
        return gi
    return values.new_zeros(values.shape) if not outs else outs[0] if len(outs) == 1 else _cat(outs)


def padded_positions_along(segment: torch.Tensor, coord: torch.Tensor, seg_len: torch.Tensor, m: int,
                           right: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pos, segment, cell)``: the flat cell ``pos`` (T,) of every packed row in an envelope of
    ``(segments, m)`` cells, its segment ``segment`` (T,) and its cell ``cell`` (T,) along the
    dim. ``coord`` (T,): the row's coordinate along the dim; ``right`` aligns each segment (of
    ``seg_len`` (segments,) cells) to the envelope's end instead of its start."""
    cell = coord + (m - seg_len).index_select(0, segment) if right else coord
    return segment * m + cell, segment, cell


def padded(fn: Callable[..., object], tensors: Sequence[torch.Tensor], fills: Sequence, place, segments: int,
           m: int) -> tuple[torch.Tensor, ...]:
    """``fn(*envelopes, 1)`` on envelopes ``(segments, m, *static)`` holding each packed tensor's
    rows at their cells ``place`` (from ``padded_positions_along``) and its fill elsewhere; every
    result read back at those cells as packed rows. Differentiable (dense autograd: the fill gets
    no gradient, the read-back's gradient is scattered into the envelope)."""
    pos = place[0]
    envs = []
    for t, fill in zip(tensors, fills):
        static = t.shape[1:]
        env = t.new_full((segments * m, *static), fill)
        env.index_copy_(0, pos, t)
        envs.append(env.view(segments, m, *static))
    outs = _as_tuple(fn(*envs, 1))
    # flatten, not reshape(-1, …): with a zero-size static dim, -1 is ambiguous
    return tuple(o.flatten(0, 1).index_select(0, pos) for o in outs)
