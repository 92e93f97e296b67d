"""Joins along ragged dims, per sample: ``torch.cat`` (sizes add; a dense ``(B, k, …)`` or
``(1, k, …)`` operand joins every sample — the class token), ``F.pad`` (constant, reflect,
replicate, circular, as dense pads each sample as a batch of one; ``torch.constant_pad_nd`` too), ``repeat`` /
``tile`` and ``repeat_interleave`` (by a number, or a count per position). The result's dim stays ragged (NOTE [ Indexing along ragged dims ] in ``along.py``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import constructors, pieces
from ...bridge import static_as_ragged, values_of, wrap_values
from ...errors import StructureError
from ...kernels.along import join_blocks, packed_rows, plan_blocks
from ...structure import Partition, RaggedExtent, mapped_extent, partition_for, same_extent, sizes_of
from .._common import MJT, autocast_float32, canonical_dim, describe, equal_sizes, sample_rows, static_dims
from .._routing import assume_joined, route, static_sizes_as_ragged
from .along import by_blocks, eager, keep_along

_MODES = ("constant", "reflect", "replicate", "circular")


# ----------------------------------------------------------------------------- cat
def _as_rows(op: str, t, like: MJT, d: int):
    """A dense cat operand ``(B or 1, m, *static)`` as packed rows ``(B·m, *static)`` and its
    per-sample size ``m`` along ``d`` (only when ``d`` is ``like``'s one ragged dim)."""
    b = like._partition.batch
    if like._ragged_dims != (d,) or t.dim() != like.dim() or t.shape[0] not in (1, b):
        raise StructureError(
            f"{op}(): a dense operand joins a multi_jagged one along its only ragged dim, as (B, …) or (1, …) of "
            f"the same rank; got {describe(t)} with {describe(like)} along dim {d}"
        )
    rows = t.expand(b, *t.shape[1:]).movedim(d, 1)
    if tuple(rows.shape[2:]) != tuple(like._values.shape[1:]):
        raise StructureError(f"{op}(): expected the static sizes of {describe(like)}, got {describe(t)}")
    return rows.reshape(b * rows.shape[1], *rows.shape[2:]), rows.shape[1]


@eager
def cat_ragged(op: str, tensors, d: int):
    """Per-sample concatenation along ragged dim ``d``."""
    first = next(t for t in tensors if isinstance(t, MJT))
    k = first._ragged_dims.index(d)
    p = first._partition
    parts = []  # (values, its partition or a dense operand's size along d, its extent along d or that size)
    for t in tensors:
        if isinstance(t, MJT):
            q = t._partition
            if t._ragged_dims != first._ragged_dims or t._values.shape[1:] != first._values.shape[1:] or any(
                i != k and not same_extent(a, b) for i, (a, b) in enumerate(zip(q.extents, p.extents))
            ):
                raise StructureError(
                    f"{op}(): expected tensors that differ only along dim {d}, got {describe(first)} and {describe(t)}"
                )
            parts.append((values_of(t), q, q.extents[k]))
        elif isinstance(t, torch.Tensor):
            rows, m = _as_rows(op, t, first, d)
            parts.append((rows, m, m))
        else:
            raise TypeError(f"{op}(): expected tensors, got {type(t).__name__}")
    e = p.extents[k]
    key = ("cat", tuple(part[2] if isinstance(part[2], int) else id(part[2]) for part in parts))
    pinned = [part[2] for part in parts if not isinstance(part[2], int)]
    out_e = mapped_extent(e, key, lambda n: sum(part[2] if isinstance(part[2], int) else part[2].host_lengths() for part in parts))
    out_e.cache.setdefault(("cat_sources", key), pinned)  # keep the extents named by id alive
    extents = list(p.extents)
    extents[k] = out_e
    out = partition_for(extents)
    dtype = first.dtype
    for part in parts:
        dtype = torch.promote_types(dtype, part[0].dtype)
    sources = [part[0].to(dtype) for part in parts]
    if k == 0 and by_blocks(first, sum(v.numel() for v in sources)):
        # each sample's rows of every operand, one after another: one cat of views (NOTE [ Blocks
        # of consecutive rows ] in kernels/along.py)
        plan = out.derived(("cat_blocks", key), lambda out: _cat_blocks(parts, p.batch))
        return wrap_values(join_blocks(sources, plan), out, first._ragged_dims)
    # the ragged dim is part of the key: joined back to the sizes it had, a cat along either dim of a
    # square pair has the pair's own partition as output, its operands' extents along the dim alike
    rows = out.derived(("cat_rows", k, key), lambda out: _cat_rows(out, k, parts))
    return wrap_values(torch.cat(sources, 0).index_select(0, rows), out, first._ragged_dims)


def _cat_blocks(parts, batch: int):
    """The blocks of a ``cat`` along the first ragged dim: each sample's rows of every operand in
    turn (a dense operand's, ``m`` rows per sample)."""
    counts = [sample_rows(part[1])[1] if isinstance(part[1], Partition) else [part[1]] * batch for part in parts]
    return plan_blocks([(j, c[s], True) for s in range(batch) for j, c in enumerate(counts)], len(parts))


def _cat_rows(out: Partition, k: int, parts) -> torch.Tensor:
    """The row of the operands' joined values (one after another) that each row of ``out`` reads."""
    sample, coords = out.row_coords()
    a = coords[:, k]
    base = 0
    start = torch.zeros_like(sample)
    rows = torch.zeros_like(sample)
    for v, q, e in parts:
        if isinstance(q, Partition):
            off, sizes, n = q.offsets, q.device_sizes(), e.lengths().to(sample.device)[sample]
        else:
            off = torch.arange(out.batch + 1, device=out.offsets.device) * q
            sizes = torch.full((out.batch, 1), q, device=out.offsets.device, dtype=torch.int64)
            n = torch.full_like(sample, q)
        hit = (a >= start) & (a < start + n)
        local = coords.clone()
        local[:, k] = torch.where(hit, a - start, torch.zeros_like(a))
        src = packed_rows(off, sizes, sample, local) + base
        rows = torch.where(hit, src, rows)
        start = start + n
        base += v.shape[0]
    return rows


@route(torch.cat, torch.concat, torch.concatenate)
def _cat(tensors, dim=0, *, out=None, axis=None):
    if axis is not None:  # ``torch.concatenate``'s NumPy name for dim
        dim = axis
    if out is not None or not isinstance(tensors, (list, tuple)):
        return NotImplemented
    first = next((t for t in tensors if isinstance(t, MJT)), None)
    if first is None:
        return NotImplemented
    kept = [t for t in tensors if isinstance(t, MJT) or t.shape != (0,)]
    if len(kept) < len(tensors):
        # dense torch's legacy rule: a 1-d empty tensor joins anything (skipped). Hugging Face's
        # caches start as ``torch.tensor([])`` and grow by ``cat([cache, keys], dim=-2)``.
        return kept[0].clone() if len(kept) == 1 else torch.cat(kept, dim)
    d = canonical_dim("cat", first.dim(), dim)
    if d == 1 and _images_with_pieces(tensors):
        # channels of images held one by one (a U-Net skip, a DenseNet block): each image's own
        # cat, pieces out (NOTE [ Per-image pieces ] in pieces.py)
        parts = zip(*[pieces.split(t) for t in tensors])
        out = [None if ps[0] is None else torch.cat(ps, 1) for ps in parts]
        c = sum(t._size[1] for t in tensors)
        return pieces.from_pieces(out, first._partition, first._ragged_dims, c, first.dtype, first.device)
    if d == 0:
        if all(isinstance(t, MJT) for t in tensors):
            return constructors.cat_batch(list(tensors))  # the batches' samples one after another
        raise RuntimeError("cat(): along the batch dim, expected only multi_jagged tensors (a dense tensor has no samples)")
    joined = assume_joined("cat", tensors, first, d)
    if any(a is not b for a, b in zip(joined, tensors)):
        return torch.cat(joined, d)
    # a static size (a dense operand's too) that is every sample's size of another's ragged dim
    # joins as that dim (NOTE [ Static sizes equal to a ragged dim ] in ops/_routing.py)
    joined = static_sizes_as_ragged(tuple(tensors), False, skip=d)
    if any(a is not b for a, b in zip(joined, tensors)):
        return torch.cat(list(joined), d)
    ms = [t for t in tensors if isinstance(t, MJT)]
    mixed = any(d in t._ragged_dims for t in ms) and any(d not in t._ragged_dims for t in ms)
    if mixed and not torch.compiler.is_compiling():
        # along a ragged dim of some operands, a static one of others (a pair's first row,
        # ``P.narrow(1, 0, 1)``, prepended to it): each of those holds that many rows in every sample
        tensors = [static_as_ragged(t, d, equal_sizes(t, t._size[d])) if isinstance(t, MJT) and d not in t._ragged_dims
                   else t for t in tensors]
        return cat_ragged("cat", list(tensors), d)
    if d not in first._ragged_dims:
        return NotImplemented  # static dims: the op table's handler
    return cat_ragged("cat", list(tensors), d)


def _stack_args(tensors, out, min_dim: int) -> bool:
    """Whether a ``hstack`` / ``vstack`` / ``dstack`` call joins multi_jagged tensors (dense ones
    of at least ``min_dim`` dims beside them), the routes' business."""
    return (out is None and isinstance(tensors, (list, tuple)) and any(isinstance(t, MJT) for t in tensors)
            and all(isinstance(t, MJT) or (isinstance(t, torch.Tensor) and t.dim() >= min_dim) for t in tensors))


@route(torch.hstack, torch.column_stack)
def _hstack(tensors, *, out=None):
    """``cat`` along dim 1, as dense ``hstack`` / ``column_stack`` of tensors of two or more dims
    (a batch has: its ragged dim 1 joins each sample's rows)."""
    return torch.cat(list(tensors), 1) if _stack_args(tensors, out, 2) else NotImplemented


@route(torch.vstack, torch.row_stack)
def _vstack(tensors, *, out=None):
    """``cat`` along dim 0, as dense ``vstack`` / ``row_stack`` of tensors of two or more dims:
    the batches' samples one after another."""
    return torch.cat(list(tensors), 0) if _stack_args(tensors, out, 2) else NotImplemented


@route(torch.dstack)
def _dstack(tensors, *, out=None):
    """``cat`` along dim 2 after ``atleast_3d``, as dense ``dstack`` (a pair's second ragged dim)."""
    if not _stack_args(tensors, out, 3):
        return NotImplemented
    return torch.cat([t.unsqueeze(-1) if t.dim() == 2 else t for t in tensors], 2)


def _images_with_pieces(tensors) -> bool:
    """Image batches ``(B, C, j0, j1)`` of one partition and dtype, some holding per-image pieces."""
    first = tensors[0]
    return (
        all(isinstance(t, MJT) for t in tensors)
        and all(t._partition is first._partition and t._ragged_dims == (2, 3) and len(t._size) == 4
                and t.dtype == first.dtype for t in tensors)
        and any(pieces.holds_pieces(t) for t in tensors)
    )


# ----------------------------------------------------------------------------- pad
def _source(mode: str, q: torch.Tensor, n: torch.Tensor, lo: int, hi: int):
    """Input coordinate that padded position ``q`` (input coordinates: may be < 0 or >= n) reads,
    and whether it reads one (constant mode reads the fill outside). ``(lo, hi)``: the pads."""
    if mode == "constant":
        return q.clamp_min(0), (q >= 0) & (q < n)
    if mode == "replicate":
        return torch.minimum(q.clamp_min(0), n - 1), None
    if mode == "circular":
        # dense crops first (a negative pad), then wraps around what is left: a pad that crops
        # one side and pads the other wraps the cropped length
        first = max(-lo, 0)
        kept = n - first - max(-hi, 0)
        return first + torch.remainder(q - first, kept.clamp_min(1)), None
    r = torch.where(q < 0, -q, q)  # reflect
    return torch.where(r >= n, 2 * (n - 1) - r, r), None


def _check_pad(op: str, x: MJT, pad: list, mode: str, value) -> None:
    """Dense ``F.pad`` on a meta tensor of sample shapes: its errors (input rank for a mode, reflect
    padding not below the size, circular wrapping twice, a crop past the size…) are dense torch's
    own, raised naming the first sample that has them. Each of these rules holds for a dim's size
    from some size on, so a batch passes where the shortest sample along every ragged dim passes:
    those (at most one per ragged dim) are checked first, and only a batch that fails is walked
    sample by sample for the first failing one."""
    sizes = x._partition.host_sizes()
    rows = sizes.tolist()  # SYNC: none — host sizes
    if not rows:
        return
    shortest = sorted({int(sizes[:, k].argmin()) for k in range(sizes.shape[1])} or {0})
    if all(_pad_error(x, pad, mode, value, rows[i]) is None for i in shortest):
        return
    seen = set()
    for i, row in enumerate(rows):
        if tuple(row) in seen:
            continue
        seen.add(tuple(row))
        e = _pad_error(x, pad, mode, value, row)
        if e is not None:  # re-raised with the sample named, same type
            shape = tuple(x.shape[d] if d not in x._ragged_dims else row[x._ragged_dims.index(d)] for d in range(1, x.dim()))
            raise type(e)(f"{op}(): {e} (sample {i} of {describe(x)}, component shape {shape})") from e


def _pad_error(x: MJT, pad: list, mode: str, value, row: list) -> Exception | None:
    """Dense ``F.pad``'s error on a meta sample of ragged sizes ``row`` as a batch of one, ``(1,
    …)`` — a batch's rank, so that the ranks a mode takes (a replicate pad of two dims: 3-d or
    4-d input) are those of a dense batch; None where it has none."""
    shape = [1] + [x.shape[d] if d not in x._ragged_dims else row[x._ragged_dims.index(d)] for d in range(1, x.dim())]
    try:
        F.pad(torch.empty(shape, device="meta", dtype=x.dtype), pad, mode=mode, value=value if mode == "constant" else None)
    except Exception as e:
        return e
    return None


@eager
def pad_ragged(op: str, x: MJT, pad: list, pads: dict, mode: str, value):
    """``F.pad`` of each sample: ``pads`` maps logical dims to ``(before, after)``."""
    if mode != "constant" and not x.is_floating_point() and len(pad) // 2 < x.dim():
        # dense torch's own dtype check, which every sample fails alike (a meta tensor's is not
        # its kernel's: another type and message): the pad of a small sample of this dtype, as a
        # batch of one (reflection and replication pads refuse bool; constant padding takes every dtype)
        shape = [1] * x.dim()
        for i in range(len(pad) // 2):
            shape[-1 - i] = abs(pad[2 * i]) + abs(pad[2 * i + 1]) + 1
        F.pad(torch.zeros(shape, dtype=x.dtype, device=x.device), pad, mode=mode)
    p = x._partition
    # checked once per structure and pad (NOTE [ Derived maps ] in structure.py): it raises or holds
    p.derived(("pad_checked", x._ragged_dims, tuple(x._values.shape[1:]), x.dtype, tuple(pad), mode, value),
              lambda p: _check_pad(op, x, pad, mode, value) or True)
    ragged = {d: pads[d] for d in pads if d in x._ragged_dims}
    extents = list(p.extents)
    for d, (lo, hi) in ragged.items():
        k = x._ragged_dims.index(d)
        if mode == "circular" and (lo < 0 or hi < 0):
            # a crop that leaves less than a pad wraps around: dense reads memory outside the
            # sample there (crop to nothing) or raises an overlap error (a torch quirk: with
            # autograd on it returns values), so refuse it, naming the sample
            n_host = p.extents[k].host_lengths()  # SYNC: none — host lengths
            kept = n_host - max(-lo, 0) - max(-hi, 0)
            bad = (((kept <= 0) & (n_host + lo + hi > 0)) | (kept < max(lo, hi, 0))).nonzero().flatten()
            if bad.numel():
                i = int(bad[0])
                raise RuntimeError(f"{op}(): circular padding ({lo}, {hi}) of ragged dim {d} crops sample {i} (size "
                                   f"{int(n_host[i])}) to {max(int(kept[i]), 0)} and wraps around it by more than that "
                                   "(dense torch reads outside the tensor or raises)")
        extents[k] = mapped_extent(p.extents[k], ("pad", lo, hi), lambda n, lo=lo, hi=hi: n + lo + hi)
    n = p.device_sizes()

    def source(sample, a):
        a = a.clone()
        for d, (lo, _) in ragged.items():
            k = x._ragged_dims.index(d)
            a[:, k] = _source(mode, a[:, k] - lo, n[sample, k], lo, ragged[d][1])[0]
        return a

    def valid(sample, a):
        if mode != "constant":
            return None
        ok = torch.ones_like(sample, dtype=torch.bool)
        for d, (lo, _) in ragged.items():
            k = x._ragged_dims.index(d)
            q = a[:, k] - lo
            ok = ok & (q >= 0) & (q < n[sample, k])
        return ok

    out = x
    if mode == "constant" and len(ragged) == 1 and x._ragged_dims[0] in ragged and by_blocks(x, 2 * x._values.numel()):
        # fill blocks around each sample's rows, one cat (NOTE [ Blocks of consecutive rows ] in
        # kernels/along.py; from half the size of the others: the maps' pad also writes the fill
        # through a mask, a second pass)
        lo, hi = ragged[x._ragged_dims[0]]
        q = partition_for(extents)
        plan = q.derived(("pad_blocks", p, lo, hi), lambda q: _pad_blocks(p, lo, hi))
        if plan[0]:
            v = values_of(x)
            fill = v.new_empty((sum(plan[0][1]), *v.shape[1:])).fill_(torch.tensor(value).to(v.dtype))
            out = wrap_values(join_blocks((v, fill), plan), q, x._ragged_dims)
    if out is x and ragged:
        out = keep_along(x, extents, source, valid, value, key=("pad", mode, tuple(ragged.items())))
    statics = {d: pads[d] for d in pads if d not in x._ragged_dims}
    if not statics:
        return out
    v = values_of(out)
    for d, (lo, hi) in statics.items():
        vd = static_dims(x.dim(), x._ragged_dims).index(d) + 1
        size = v.shape[vd]
        q = torch.arange(-lo, size + hi, device=v.device)
        src, ok = _source(mode, q, torch.tensor(size, device=v.device), lo, hi)
        if mode == "constant":
            if size == 0:
                src = torch.zeros_like(q)
            # an empty dim reads nothing, but the result stays on v's graph (dense pad's does)
            g = v.index_select(vd, src.clamp(0, max(size - 1, 0))) if size else torch.cat(
                [v, v.new_zeros(*v.shape[:vd], q.shape[0], *v.shape[vd + 1:])], vd)
            shape = [1] * v.dim()
            shape[vd] = -1
            v = torch.where(ok.reshape(shape), g, torch.full_like(g, value))
        else:
            v = v.index_select(vd, src)
    return wrap_values(v, out._partition, out._ragged_dims)


def _pad_blocks(p: Partition, lo: int, hi: int):
    """The blocks of a constant pad ``(lo, hi)`` of the first ragged dim (NOTE [ Blocks of
    consecutive rows ] in kernels/along.py): per sample, ``lo`` fill rows, its own rows, ``hi`` fill
    rows, per position along the dim (a negative pad crops the sample's rows instead); ``((), ())``
    where a sample keeps fewer than none of its own (dense torch's rule then: the general path)."""
    sizes, counts = sample_rows(p)
    blocks = []
    for ns, r in zip(sizes, counts):
        inner = math.prod(ns[1:])  # rows per position along the dim
        kept = ns[0] - max(-lo, 0) - max(-hi, 0)
        if kept < 0:
            return (), ()
        blocks += [(1, max(lo, 0) * inner, True), (0, max(-lo, 0) * inner, False), (0, kept * inner, True),
                   (0, max(-hi, 0) * inner, False), (1, max(hi, 0) * inner, True)]
    return plan_blocks(blocks, 2)


@route(F.pad, torch._C._nn.pad)
def _pad(input, pad, mode="constant", value=None):
    if not isinstance(input, MJT):
        return NotImplemented
    if mode not in _MODES:
        raise NotImplementedError(f"pad(): mode {mode!r} for layout torch.multi_jagged (supported: {', '.join(_MODES)})")
    if mode in ("reflect", "replicate") and torch.is_autocast_enabled(input.device.type):
        (input,) = autocast_float32(input)  # reflection and replication pads: dense autocast's float32 list
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > input.dim():
        raise RuntimeError(f"Padding length should be divisible by 2 and at most twice the number of dims, got {len(pad)}")
    if mode == "constant" and any(isinstance(p, torch.SymInt) for p in pad) and not torch.compiler.is_compiling():
        per = [sizes_of(p) if isinstance(p, torch.SymInt) else None for p in pad]
        if all(v is None or v.shape == (input._partition.batch,) for v in per) and any(v is not None for v in per):
            return _pad_by_sample(input, pad, per, value)
    pads = {}
    for i in range(len(pad) // 2):
        d = input.dim() - 1 - i
        if pad[2 * i] or pad[2 * i + 1]:
            pads[d] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if 0 in pads:
        raise NotImplementedError(f"pad(): along the batch dim of {describe(input)} for layout torch.multi_jagged")
    if len(pad) // 2 == input.dim() and mode == "constant":
        pad = pad[:-2]  # the batch dim's (0, 0): each sample's pad has one dim fewer
    if not pads and mode == "constant":
        return input.clone()
    last = max(input._ragged_dims, default=0)
    if mode == "constant" and all(d > last for d in pads):
        # only static dims after every ragged dim: the values' trailing dims, padded as they are
        # (no host sizes: it traces)
        k = input.dim() - 1 - last
        v = F.pad(values_of(input), pad[:2 * k], value=0.0 if value is None else value)
        return wrap_values(v, input._partition, input._ragged_dims)
    return pad_ragged("pad", input, pad, pads, mode, 0.0 if value is None else value)


def _pad_by_sample(input: MJT, pad: list, per: list, value):
    """``F.pad`` by amounts that are ragged sizes, each sample by its own (``F.pad(x, (0, 0, 0, L - T))``
    of ``(B, T, C)`` tokens: every sample padded to L): dense ``F.pad`` on each component, packed
    again (a dim whose new sizes agree is static); differentiable. Eager only (host sizes)."""
    # SYNC: none — host sizes
    hosts = [None if v is None else v.tolist() for v in per]
    outs = []
    for i, c in enumerate(input.unbind()):
        amounts = [p if h is None else h[i] for p, h in zip(pad, hosts)]
        if len(amounts) // 2 == input.dim():
            amounts = amounts[:-2]  # the batch dim's pair: each sample has one dim fewer
        outs.append(F.pad(c, amounts, value=0.0 if value is None else value))
    return constructors.as_nested_tensor(outs)


# ----------------------------------------------------------------------------- repeat / tile
@eager
def repeat_ragged(op: str, x: MJT, reps: list[int]):
    """Each sample repeated ``reps[d]`` times along each dim ``d >= 1`` (``reps[0] == 1``)."""
    p = x._partition
    extents = list(p.extents)
    for k, d in enumerate(x._ragged_dims):
        if reps[d] != 1:
            extents[k] = mapped_extent(p.extents[k], ("repeat", reps[d]), lambda n, r=reps[d]: n * r)
    n = p.device_sizes()

    def source(sample, a):
        a = a.clone()
        for k, d in enumerate(x._ragged_dims):
            if reps[d] != 1:
                a[:, k] = torch.remainder(a[:, k], n[sample, k])
        return a

    out = keep_along(x, extents, source) if any(reps[d] != 1 for d in x._ragged_dims) else x
    static_reps = [1] + [reps[d] for d in static_dims(x.dim(), x._ragged_dims)]
    if all(r == 1 for r in static_reps) and out is not x:
        return out
    return wrap_values(values_of(out).repeat(static_reps), out._partition, out._ragged_dims)


@route(torch.Tensor.repeat, sequence="repeats")
def _repeat(input, *sizes):
    if not isinstance(input, MJT):
        return NotImplemented
    reps = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)) else list(sizes)
    if len(reps) < input.dim():
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    if len(reps) > input.dim():
        raise NotImplementedError(
            f"repeat(): repeats {tuple(reps)} of {describe(input)} would add leading dims, before the batch dim "
            "(layout torch.multi_jagged)"
        )
    if reps[0] == 1 and all(reps[d] == 1 for d in input._ragged_dims):
        # static dims alone: the values' repeat (no new extent, no host sizes: it traces)
        static_reps = [1] + [int(reps[d]) for d in static_dims(input.dim(), input._ragged_dims)]
        return wrap_values(values_of(input).repeat(static_reps), input._partition, input._ragged_dims)
    if reps[0] != 1:  # the batch repeated: every sample again, in order, then each sample's own repeats
        b = input._partition.batch
        input = constructors.select_batch(input, torch.arange(b).repeat(int(reps[0])))
    return repeat_ragged("repeat", input, [1] + [int(r) for r in reps[1:]])


@route(torch.tile, torch.Tensor.tile, sequence="dims")
def _tile(input, *dims):
    if not isinstance(input, MJT):
        return NotImplemented
    reps = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)) else list(dims)
    reps = [1] * (input.dim() - len(reps)) + reps
    return _repeat(input, reps)


@route(torch.constant_pad_nd)
def _constant_pad_nd(input, pad, value=0):
    """``torch.constant_pad_nd``: ``F.pad`` in constant mode (along ragged dims too)."""
    return _pad(input, pad, "constant", value) if isinstance(input, MJT) else NotImplemented


# ----------------------------------------------------------------------------- repeat_interleave
@eager
def repeat_interleave_ragged(op: str, x: MJT, repeats) -> MJT:
    """Each position along the only ragged dim repeated ``repeats`` times in place: a number (every
    sample grows ``repeats``-fold) or a multi_jagged ``(B, j0)`` integer tensor of the dim's own
    extent, one count per position (a TTS length regulator: each phoneme held for its duration);
    the new sizes are the per-sample sums, a new extent."""
    e = x._partition.extents[0]
    v = values_of(x)
    if isinstance(repeats, MJT):
        if repeats.dim() != 2 or not same_extent(repeats._partition.extents[0], e) or repeats.dtype.is_floating_point:
            raise StructureError(f"{op}(): expected integer repeats (B, j) with the extent of {describe(x)}'s ragged dim, got {describe(repeats)}")
        counts = repeats._values.to(torch.int64)
        if bool((counts < 0).any()):
            raise RuntimeError("repeats can not be negative")
        lengths = torch.zeros(x._partition.batch, dtype=torch.int64).index_add_(
            0, x._partition.row_sample().cpu(), counts.cpu())
        out_extent = RaggedExtent.from_lengths(lengths, v.device)
        values = v.repeat_interleave(counts, dim=0, output_size=int(lengths.sum()))
    else:
        r = int(repeats)
        if r < 0:
            raise RuntimeError("repeats can not be negative")
        out_extent = mapped_extent(e, ("repeat", r), lambda n: n * r)
        values = v.repeat_interleave(r, dim=0)
    return wrap_values(values, partition_for((out_extent,)), x._ragged_dims)


@route(torch.repeat_interleave, torch.Tensor.repeat_interleave)
def _repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    if not isinstance(input, MJT):
        return NotImplemented  # repeat_interleave(repeats) of a multi_jagged repeats: dense torch's error
    if repeats is None and dim is None:
        # ``repeat_interleave(counts)``: each sample's positions, each repeated its count (segment
        # ids from counts), a ``(B, j)`` batch of each sample's result
        if input.dim() != 2 or input._ragged_dims != (1,):
            raise RuntimeError(f"repeat_interleave(): repeat_interleave only accept 1D vector as repeat, got "
                               f"samples of {describe(input)}")  # dense's words
        _, coords = input._partition.row_coords()
        positions = MJT(coords[:, 0].to(input.dtype), input._partition, input._ragged_dims)
        return repeat_interleave_ragged("repeat_interleave", positions, input)
    if dim is None:  # dense torch repeats the flattened input's elements: the batch flattened into rows
        return torch.repeat_interleave(input.reshape(-1), repeats, output_size=output_size)
    d = canonical_dim("repeat_interleave", input.dim(), dim)
    if d == 0 and not isinstance(repeats, MJT):
        # samples repeated (a history per candidate, a mask per head): the batch indexed by each
        # sample's number repeated, as ``x[index]`` gathers samples
        b = input._partition.batch
        index = torch.arange(b, device=input.device).repeat_interleave(repeats, output_size=output_size)
        return input[index]
    if d not in input._ragged_dims:
        return NotImplemented  # a static dim: the op table
    if len(input._ragged_dims) != 1:
        raise NotImplementedError(
            f"repeat_interleave(): along a ragged dim of {describe(input)}, which has several; only a batch with one "
            "ragged dim (layout torch.multi_jagged)"
        )
    if isinstance(repeats, torch.Tensor) and not isinstance(repeats, MJT) and repeats.numel() != 1:
        raise StructureError(
            f"repeat_interleave(): along ragged dim {d} of {describe(input)}, repeats must be a number or a multi_jagged "
            f"(B, j) tensor (one count per position of each sample), got a dense {tuple(repeats.shape)}"
        )
    return repeat_interleave_ragged("repeat_interleave", input, repeats)
