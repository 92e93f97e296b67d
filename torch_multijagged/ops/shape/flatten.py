"""Flattening consecutive ragged dims into one, and back: NaViT-style patch tokens.

NOTE [ Flattening ragged dims ]

``x (B, D, j_h, j_w).flatten(2)`` is ``(B, D, j_t)`` with ``t_i = h_i·w_i``: the packed rows are
row-major over the ragged coordinates already, so merging consecutive ragged dims keeps every row
where it is — a zero-copy relabel of the partition. The merged extent is
``structure.flat_extent(sub)`` of the partition ``sub`` of the merged dims (its offsets are
``sub``'s row offsets; cached on ``sub``, so flattening the same structure twice gives the same
nested int), and its partition remembers ``sub`` under ``("unflat",)``, so that
``t.unflatten(2, (j_h, j_w))`` (sizes given as the original nested ints, or ``-1``) restores the
original extents and nested ints. ``flatten``, ``reshape`` / ``view`` to the merged shape
(``(B, D, -1)``) and ``unflatten`` / ``reshape`` / ``view`` back are recognised (a route for each;
``reshape``/``view`` only when the requested shape is exactly the merge or the split, with static
sizes unchanged). Gradients cross unchanged through the values bridge (every order).

Merging two distinct extents needs the host lengths (the new extent's carriers: total, max and
sum of squares of ``h_i·w_i``) and makes a new nested int, which a compiled region cannot do: under
``torch.compile`` a merge or split of ragged dims is a graph break (with ``fullgraph=True`` an
error naming the op; NOTE [ Eager-only routes ] in ``_common.py``); flattens and views of static
dims stay in the graph.

The last ragged dim merges with the static dims right after it the same way: ``(B, j0, k, C)
.flatten(1, 2)`` (or ``reshape(B, -1, C)``, or ``reshape(B, src_len * k, C)`` naming the size as
the nested int times ``k``) is ``(B, j, C)`` with ``nᵢ·k`` per sample, the packed rows read ``k``
at a time — a view of the values when the static dims come right after the rows, else a copy
(``reshape``; ``view`` then raises, as dense torch's). Its extent is ``structure.mapped_extent``
of the ragged one under ``("times", k)``, and remembers it: ``unflatten(1, (-1, k))`` (or the
view back) restores the original nested int. Splitting any last ragged dim into ``(-1, k…)``
checks per sample that ``k`` divides the size (dense torch's rule) and makes a new extent.
Merging a ragged dim with static dims *before* it, or one that is not the last ragged dim, stays
an error: the rows would be reordered per sample, not regrouped.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int, statically_known_true

from ...bridge import ragged_as_static, values_of, wrap_values
from ...errors import StructureError
from ...structure import (_is_traced, Partition, RaggedExtent, extent_of, flat_extent, floordiv_of, mapped_extent, partition_for,
                          same_extent, same_product)
from .._common import MJT, describe, eager_route, static_dims, wrap
from .._routing import _needs_grad
from ...kernels.along import packed_rows
from . import views
from .views import check_view_shape

__all__ = ["flatten_ragged", "unflatten_ragged", "view_plan"]

_LAYOUT = "layout torch.multi_jagged"


_WHY = (
    "{op}(): merging or splitting ragged dims needs the per-sample sizes on the host (a new ragged extent), "
    f"which torch.compile cannot trace for {_LAYOUT}: a graph break"
)


def _relabel(x: MJT, partition: Partition, ragged_dims: tuple[int, ...]) -> MJT:
    """``x``'s values (rows unchanged) with another partition and ragged dims; differentiable."""
    if _needs_grad(x):
        return wrap_values(values_of(x), partition, ragged_dims)
    return wrap(x._values, partition, ragged_dims)


def _merged(x: MJT, k: int, m: int) -> tuple[Partition, Partition]:
    """``(sub, out)``: the partition of ragged dims ``k .. k+m-1`` and ``x``'s partition with them
    merged into one (its extent ``flat_extent(sub)``)."""
    p = x._partition
    sub = p if m == p.nragged else partition_for(p.extents[k:k + m])
    flat = flat_extent(sub)
    if m == p.nragged:
        return sub, partition_for([flat])
    return sub, partition_for([*p.extents[:k], flat, *p.extents[k + m:]])


@eager_route(_WHY)
def flatten_ragged(op: str, x: MJT, start: int, end: int) -> MJT:
    """``x`` with its consecutive ragged dims ``start .. end`` (canonical) merged into one
    (NOTE [ Flattening ragged dims ])."""
    k = x._ragged_dims.index(start)
    m = end - start + 1
    _, out = _merged(x, k, m)
    ragged = tuple(d if d <= start else d - (m - 1) for d in x._ragged_dims if not start < d <= end)
    return _relabel(x, out, ragged)


def _unflat(x: MJT, k: int) -> Optional[Partition]:
    """The partition that ragged dim ``k`` of ``x`` was flattened from, if any."""
    e = x._partition.extents[k]
    return partition_for([e]).cache.get(("unflat",))


@eager_route(_WHY)
def unflatten_ragged(op: str, x: MJT, d: int, sizes) -> MJT:
    """Ragged dim ``d`` (canonical) of ``x`` split back into the ragged dims it was flattened
    from; ``sizes`` are their nested ints (or ``-1``)."""
    k = x._ragged_dims.index(d)
    sub = _unflat(x, k)
    if sub is None:
        # not a flattening of ragged dims: the split ``reshape`` makes of each sample (a static
        # dim flattened with a ragged one, ``(B, S, j0, C).flatten(1, 2)``; an even split)
        shape = (*x.shape[:d], *sizes, *x.shape[d + 1:])
        try:
            return x.reshape(shape)
        except (StructureError, RuntimeError) as e:
            raise StructureError(
                f"{op}(): cannot split ragged dim {d} of {describe(x)} into {tuple(sizes)}: it was not made by "
                f"flattening ragged dims, and as a reshape to {tuple(shape)}: {e}"
            ) from None
    want = [e.nested_int for e in sub.extents]
    sizes = list(sizes)
    if len(sizes) != len(want) or not all(s == -1 or (is_nested_int(s) and s == w) for s, w in zip(sizes, want)):
        raise StructureError(
            f"{op}(): ragged dim {d} of {describe(x)} was flattened from ragged sizes ({', '.join(map(str, want))}); "
            f"expected those (or -1 for each), got {tuple(sizes)}"
        )
    p = x._partition
    m = len(want)
    out = sub if p.nragged == 1 else partition_for([*p.extents[:k], *sub.extents, *p.extents[k + 1:]])
    ragged = []
    for r in x._ragged_dims:
        ragged += list(range(d, d + m)) if r == d else [r if r < d else r + m - 1]
    return _relabel(x, out, tuple(ragged))


# ----------------------------------------------------------------------------- a ragged dim with static dims
def _times(e: RaggedExtent, k: int) -> RaggedExtent:
    """The extent of ``e``'s sizes times ``k``; it remembers ``e`` as its ``k``-th part."""
    out = mapped_extent(e, ("times", k), lambda n: n * k)
    out.cache.setdefault(("mapped", ("part", k)), e)
    return out


def _part(op: str, x: MJT, d: int, e: RaggedExtent, k: int) -> RaggedExtent:
    """The extent of ``e``'s sizes divided by ``k`` (the extent that ``e`` was made from by
    ``_times``, if it was), checking per sample that ``k`` divides the size, as dense torch does."""
    hit = e.cache.get(("mapped", ("part", k)))
    if hit is not None:
        return hit
    host = e.host_lengths()
    bad = (host % k).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise RuntimeError(
            f"{op}(): sample {i} of {describe(x)} has {int(host[i])} elements along ragged dim {d}, which is not a "
            f"multiple of {k}"
        )
    # the sizes are ``n // k``: the nested int ``n // k`` names (``floordiv``), made here if not yet
    out = e.cache.get(("mapped", ("floordiv", k)))
    if out is None:
        out = mapped_extent(e, ("floordiv", k), lambda n: torch.div(n, k, rounding_mode="floor"))
        if out is not e:
            out.cache.setdefault(("floordiv_of",), (e, k))
    e.cache[("mapped", ("part", k))] = out
    if out is not e:
        out.cache.setdefault(("mapped", ("times", k)), e)
    return out


def _last_ragged_with_static(x: MJT, start: int, end: int) -> bool:
    """Whether dims ``start .. end`` are the last ragged dim and static dims after it."""
    return start == x._ragged_dims[-1] and end > start


@eager_route(_WHY)
def flatten_ragged_static(op: str, x: MJT, start: int, end: int) -> MJT:
    """``x`` with its last ragged dim ``start`` and the static dims ``start+1 .. end`` after it
    merged into one ragged dim of ``nᵢ·Π sizes`` (NOTE [ Flattening ragged dims ])."""
    k = math.prod(x._size[start + 1:end + 1])
    p = x._partition
    out = partition_for([*p.extents[:-1], _times(p.extents[-1], k)])
    v = values_of(x) if _needs_grad(x) else x._values
    statics = static_dims(x.dim(), x._ragged_dims)
    merged = [statics.index(d) + 1 for d in range(start + 1, end + 1)]  # their values dims
    v = v.movedim(merged, list(range(1, len(merged) + 1)))
    shape = (v.shape[0] * k, *v.shape[len(merged) + 1:])
    try:
        new, copied = v.view(shape), False
    except RuntimeError:
        if op == "view":
            raise RuntimeError(
                f"view(): cannot view {describe(x)} with dims {start}..{end} merged: the elements are not stored in "
                "that order (a static dim before the ragged one); use .reshape(...) instead"
            ) from None
        new, copied = v.reshape(shape), True
    y = wrap_values(new, out, x._ragged_dims) if _needs_grad(x) else wrap(new, out, x._ragged_dims)
    if copied and new.numel():
        # dense reshape of a contiguous sample is a view here: a write into the copy would be lost
        from .views import _mark_reorder_copy

        _mark_reorder_copy(y._values, "a reshape merging a ragged dim with static dims stored apart from it", base=x)
    return y


@eager_route(_WHY)
def unflatten_ragged_static(op: str, x: MJT, d: int, sizes) -> MJT:
    """The last ragged dim ``d`` of ``x`` split into a ragged dim and static dims ``sizes[1:]``
    (``sizes[0]``: ``-1`` or the nested int of the part); per sample ``unflatten(0, (-1, *sizes[1:]))``."""
    k = math.prod(sizes[1:])
    p = x._partition
    part = _part(op, x, d, p.extents[-1], k)
    named = extent_of(sizes[0]) if sizes[0] != -1 else None
    if sizes[0] != -1 and not _same_size(sizes[0], part.nested_int) and not (named is not None and same_extent(named, part)):
        # (a nested int of the same sizes, such as ``T // k``'s, names the part too)
        raise StructureError(
            f"{op}(): ragged dim {d} of {describe(x)} splits into ({part.nested_int}, {', '.join(map(str, sizes[1:]))}); "
            f"got {tuple(sizes)}"
        )
    out = partition_for([*p.extents[:-1], part])
    v = values_of(x) if _needs_grad(x) else x._values
    new = v.view(v.shape[0] // k, *sizes[1:], *v.shape[1:])
    # the new static dims sit right after the ragged dim: in the values, after the static dims
    # before it (none when the ragged dims come first)
    statics = static_dims(x.dim() + len(sizes) - 1, x._ragged_dims)
    before = len([s_ for s_ in statics if s_ < d])
    if before:
        new = new.movedim(list(range(1, len(sizes))), list(range(1 + before, before + len(sizes))))
    ragged = x._ragged_dims
    return wrap_values(new, out, ragged) if _needs_grad(x) else wrap(new, out, ragged)


def _static_split(x: MJT, d: int, sizes) -> bool:
    """Whether ``sizes`` splits ragged dim ``d`` into a ragged part and plain static sizes."""
    return (d == x._ragged_dims[-1] and len(sizes) >= 2 and (sizes[0] == -1 or is_nested_int(sizes[0]))
            and all(type(s) is int and s > 0 for s in sizes[1:]))


# ----------------------------------------------------------------------------- view / reshape
def _runs(x: MJT) -> list[tuple[int, int]]:
    """Every ``(start, end)`` span of at least two consecutive ragged dims of ``x``."""
    rd = x._ragged_dims
    out = []
    for i in range(len(rd)):
        j = i
        while j + 1 < len(rd) and rd[j + 1] == rd[j] + 1:
            j += 1
            out.append((rd[i], rd[j]))
    return out


def _same_size(a, b) -> bool:
    """``a`` is the nested int ``b`` itself (identity while tracing, where comparing two symbolic
    nested ints would guard on them)."""
    if a is b:
        return True
    if torch.compiler.is_compiling() or not (is_nested_int(a) and is_nested_int(b)):
        return bool(statically_known_true(a == b)) if is_nested_int(a) and is_nested_int(b) else False
    return bool(a == b)


def _fits(given, expected) -> bool:
    return all(g == -1 or g == e for g, e in zip(given, expected)) and len(given) == len(expected)


def view_plan(op: str, x: MJT, size) -> Optional[Callable[[], MJT]]:
    """For ``x.view(size)`` / ``reshape``: a thunk doing the flatten or unflatten of ragged dims
    that ``size`` asks for (its static sizes unchanged, ``-1`` anywhere a size is implied), or None
    when ``size`` asks for neither (the ordinary view path then checks it). A size that names
    consecutive ragged dims flattened (``H * W``) while regrouping static dims as well
    (``(B, C, H, W) → (B, -1, 48, H * W)``) flattens them first, then views the rest."""
    plan = _view_plan(op, x, size)
    if plan is not None:
        return plan
    # The readings below cost host work: tried only where the size holds a nested int that is
    # not one of x's (a product, a flattened dim's factors, a floor division), or a -1 that may
    # stand for ragged dims flattened; every other view goes straight to the ordinary path.
    syms = [s for s in size if isinstance(s, torch.SymInt)]
    several = len(x._ragged_dims) > 1
    if not syms and _drops_ragged(x, size) and not torch.compiler.is_compiling() and uniform_ragged(x, x._ragged_dims):
        # every sample has one size along each ragged dim (a global pooling's 1 × 1, a prefix
        # ``y[:, :k]``, equal-length tokens) and the size names none: dense sizes (NOTE [ Ragged
        # dims of one size in every sample ])
        return lambda: _static_view(op, x, size)
    if not (syms or several) or torch.compiler.is_compiling():
        return None
    own = [x._size[d] for d in x._ragged_dims]
    if any(not any(s is n for n in own) and is_nested_int(s) for s in syms):
        named = _named_run(x, size, own)
        if named is not None:
            return lambda: _flatten_then_view(op, x, size, *named)
        split = _named_split(x, size)
        if split is not None:
            return lambda: getattr(unflatten_ragged(op, x, *split), op)(tuple(size))
        splits = _ragged_splits(x, size)
        if splits is not None:
            return lambda: _split_ragged_dims(op, x, size, splits)
        merges = _ragged_merges(x, size)
        if merges is not None:
            return lambda: _merge_ragged_dims(op, x, merges)
        factored = _factored_for_merge(x, size)
        if factored is not None:  # (B, j0, 15) as (B, 3 * n, 5): (B, j0, 3, 5) first
            return lambda: getattr(factored(), op)(tuple(size))
        k = _divided_by(x, size)
        if k is not None:
            return lambda: _split_then_view(op, x, size, k)
    if several and any(type(s) is int and s == -1 for s in size) and _runs(x):
        run = _implied_run(op, x, size)
        if run is not None:
            return lambda: getattr(flatten_ragged(op, x, *run), op)(tuple(size))
    return None


def _drops_ragged(x: MJT, size) -> bool:
    """Whether ``size`` (no nested int in it) can only mean static sizes where ``x`` has ragged dims:
    not when it keeps them as ``-1`` (``reshape(-1, -1, C)``, ``view(B, -1, C)``: the same layout
    whatever the lengths), nor when it holds several ``-1`` (dense would refuse it)."""
    implied = [i for i, s in enumerate(size) if type(s) is int and s == -1]
    if len(implied) > 1:
        return False
    return not (len(size) == x.dim() and all(d in implied for d in x._ragged_dims))


# NOTE [ Ragged dims of one size in every sample ]
#
# A ragged dim whose size is the same in every sample — a global pooling's ``1 × 1``, a prefix
# ``y[:, :k]`` of samples that all hold ``k`` (einops' ``unpack`` of packed memory tokens), an
# ``argsort(…)[:, :1]``, equal-length tokens a Swin block views as ``(B, 4, 4, C)`` — stays ragged:
# the structure follows the op, not the lengths. Each sample's dense code sees a dim of that size,
# so ``reshape`` / ``view`` to a size that names no ragged dim, ``expand`` of the dim to that size
# and ``squeeze`` of a dim of size 1 take it as dense sizes do: the dim is made static first
# (``as_static``: the values reshaped where it is the one ragged dim, else ``narrow(d, 0, s)``; a
# dense tensor once no ragged dim is left), then the op runs as on that tensor. Eager only: the
# test reads the extent's shape carriers (its largest size and total), which are symbols under
# ``torch.compile`` — there a static size given for a ragged dim raises (a guard on every length
# would recompile per batch), as NOTE [ Static sizes equal to a ragged dim ] in ``_routing.py``
# rules for operands.
def _static_view(op: str, x: MJT, size):
    """``x.view(size)`` / ``x.reshape(size)`` where every ragged dim of ``x`` has one size in every
    sample. ``reshape`` reads ``as_static``'s result (a copy where it must be one, as dense
    ``reshape`` may be). ``view`` is a view of ``x``'s own values or refuses, as dense ``view``
    does: the values, all samples of one shape, are a dense ``(B, *sizes, *static)`` tensor in
    storage order, so the view is that tensor's, writes and all; ``x`` itself a copy standing for
    a view (a slice along a ragged dim) or values whose order cannot give it (``(B, C, j0)``'s rows
    are ``(n, C)``) refuse rather than return a copy whose writes would be lost."""
    if op == "reshape":
        return as_static(x, x._ragged_dims).reshape(tuple(size))
    why = None
    if views.is_copy(x):
        why = "it is a copy (a slice along a ragged dim, or a reordering) that writes back only through multi_jagged ops"
    else:
        rd, n = x._ragged_dims, len(x._size)
        v = values_of(x)
        t = v.view(x._partition.batch, *(common_size(x, d) for d in rd), *v.shape[1:])
        order = [0, *rd, *(d for d in range(1, n) if d not in rd)]  # t's dims: batch, ragged, static
        t = t.permute([order.index(d) for d in range(n)])
        try:
            return t.view(tuple(size))
        except RuntimeError:
            why = "its packed values (ragged dims first, then static dims) cannot be viewed so"
    raise NotImplementedError(
        f"view(): {describe(x)} has one size in every sample along its ragged dims, but a view of shape "
        f"{tuple(size)} would be a copy for layout torch.multi_jagged: {why}, so writes into it would be lost; "
        "use reshape (a copy where it must be one, as dense reshape may be)"
    )


def common_size(x: MJT, d: int) -> Optional[int]:
    """The size every sample of the (non-empty, eager) batch has along ragged dim ``d``, else None."""
    e = x._partition.extents[x._ragged_dims.index(d)]
    if x._partition.batch == 0 or _is_traced(e.offsets):
        return None
    # one size: the largest times B is the total (the shape carriers: no tensor op per reshape)
    return e.max if e.max * e.batch == e.total else None


def uniform_ragged(x: MJT, dims) -> bool:
    """Whether every sample of the (non-empty, eager) batch has one size along each of ragged
    ``dims`` (NOTE [ Ragged dims of one size in every sample ])."""
    return bool(dims) and all(common_size(x, d) is not None for d in dims)


def unit_ragged(x: MJT, dims) -> bool:
    """Whether every sample of the (non-empty) batch has size 1 along each of ragged ``dims``."""
    return bool(dims) and all(common_size(x, d) == 1 for d in dims)


def as_static(x: MJT, dims):
    """``x`` with ragged ``dims`` (one size in every sample: ``uniform_ragged``) made static dims of
    that size (NOTE [ Ragged dims of one size in every sample ]), a dense tensor once no ragged dim
    is left; differentiable."""
    from ..indexing.slicing import narrow_ragged

    for d in sorted(dims, reverse=True):
        s = common_size(x, d)
        if len(x._ragged_dims) == 1:
            x = ragged_as_static(x, d, s)  # the values reshaped: a view, as dense torch's
        else:
            x = narrow_ragged("view", x, d, x._ragged_dims.index(d), 0, s)
    return x


def _ragged_splits(x: MJT, size) -> Optional[dict[int, tuple[int, bool]]]:
    """``{k: (f, inner)}``: ragged dims ``k`` (indices among x's) that ``size`` splits into
    ``(n // f, f)`` (``inner`` False) or ``(f, n // f)`` (``inner`` True), naming ``n // f`` by its
    nested int, every other dim of ``x`` kept in place (``(B, C, H, W)`` as ``(B, C, H // p, p, W // p,
    p)``: image patches, einops' ``'b c (h p1) (w p2)'``; ``(B, C, p, H // p, p, W // p)``: a grid,
    ``'b c (p1 h) (p2 w)'``) — unless the only split is ``(n // f, f)`` of the last ragged dim (a
    view: ``_divided_by``); else None."""
    splits: dict[int, tuple[int, bool]] = {}
    i = 1
    for d in range(1, x.dim()):
        if i >= len(size):
            return None
        if d not in x._ragged_dims:
            if not (type(size[i]) is int and size[i] == x._size[d]):
                return None
            i += 1
            continue
        k = x._ragged_dims.index(d)
        e = x._partition.extents[k]
        if is_nested_int(size[i]) and _same_size(size[i], e.nested_int):
            i += 1
            continue
        if i + 1 >= len(size):
            return None
        part, f, inner = (size[i], size[i + 1], False) if is_nested_int(size[i]) else (size[i + 1], size[i], True)
        named = extent_of(part) if is_nested_int(part) else None
        link = None if named is None else floordiv_of(named)
        if link is None or link[0] is not e or type(f) is not int or f != link[1]:
            return None
        splits[k] = (f, inner)
        i += 2
    if i != len(size) or not splits or splits == {len(x._ragged_dims) - 1: (splits.get(len(x._ragged_dims) - 1, (0,))[0], False)}:
        return None
    return splits


def _split_ragged_dims(op: str, x: MJT, size, splits: dict[int, tuple[int, bool]]) -> MJT:
    """``x`` with ragged dims ``k`` split into ``(n // f, f)`` or ``(f, n // f)`` (``_ragged_splits``;
    each sample's size must divide, as dense torch's view requires): the parts stay ragged, the
    factors become static dims beside them. Not a view of the packed rows (row ``h·W + w`` of a
    sample moves to ``(h // p, w // p)``'s rows), so the rows are gathered — a copy that refuses
    writes, as a reordering of ragged dims is (NOTE [ Reordered ragged dims are copies ] in views.py)."""
    from .views import _mark_reorder_copy

    p = x._partition
    extents = [
        _part(op, x, x._ragged_dims[k], e, splits[k][0]) if k in splits else e for k, e in enumerate(p.extents)
    ]
    out = partition_for(extents)
    sample, coords = out.row_coords()  # (R, m) coordinates of the parts
    factors = [splits.get(k, (1, False))[0] for k in range(p.nragged)]
    inner = torch.tensor([splits.get(k, (1, False))[1] for k in range(p.nragged)], device=coords.device)
    grid = torch.cartesian_prod(*[torch.arange(f, device=coords.device) for f in factors]).reshape(-1, len(factors))
    outer_src = coords.unsqueeze(1) * torch.tensor(factors, device=coords.device) + grid  # h = a·f + q
    parts = out.device_sizes()[sample]  # (R, m): each part's size in the row's sample
    inner_src = grid.unsqueeze(0) * parts.unsqueeze(1) + coords.unsqueeze(1)  # h = q·(n // f) + a
    src = torch.where(inner, inner_src, outer_src)  # (R, F, m)
    rows = packed_rows(p.offsets, p.device_sizes(), sample.repeat_interleave(grid.shape[0]), src.reshape(-1, len(factors)))
    v = values_of(x) if _needs_grad(x) else x._values
    g = v.index_select(0, rows).reshape(coords.shape[0], *[factors[k] for k in splits], *v.shape[1:])
    # values dims: (rows, factors…, statics…) → the output's static dims in logical order
    labels, d_out = [], 0
    out_ragged = []
    for d in range(1, x.dim()):
        if d in x._ragged_dims:
            k = x._ragged_dims.index(d)
            if k in splits and splits[k][1]:  # (f, n // f): the factor first
                d_out += 1
                labels.append(("f", k))
            d_out += 1
            out_ragged.append(d_out)
            if k in splits and not splits[k][1]:
                d_out += 1
                labels.append(("f", k))
        else:
            d_out += 1
            labels.append(("s", d))
    have = [("f", k) for k in splits] + [("s", d) for d in range(1, x.dim()) if d not in x._ragged_dims]
    values = g.permute(0, *[1 + have.index(lab) for lab in labels])
    values = values.contiguous()
    y = wrap_values(values, out, tuple(out_ragged)) if _needs_grad(x) else wrap(values, out, tuple(out_ragged))
    if values.numel():
        _mark_reorder_copy(y._values, "a split of ragged dims into parts and static factors", base=x)
    return y


def _times_of(size, e: RaggedExtent, f: int) -> bool:
    """Whether nested int ``size`` names ``e``'s sizes times ``f``: ``n * f`` of ``e``'s own nested
    int, or the extent ``e`` was split from (``H`` after ``H // f``)."""
    if not is_nested_int(size) or not isinstance(size, torch.SymInt):
        return False
    node = size.node
    if getattr(node, "t_id", None) == e.nested_int.node.t_id and getattr(node, "coeff", None) == f:
        return True
    named = extent_of(size)
    return named is not None and named is e.cache.get(("mapped", ("times", f)))


def _factored_for_merge(x: MJT, size) -> Optional[Callable[[], MJT]]:
    """For a ``size`` that names a ragged dim times ``f`` where ``x`` has that ragged dim followed
    by a static dim of ``f·m`` (openfold3's ``(B, N, A·C)`` logits viewed as ``(B, N·A, C)``): a
    thunk splitting that static dim into ``(f, m)``, after which the size is a merge
    (``_ragged_merges``); else None."""
    for s in size:
        if not (is_nested_int(s) and isinstance(s, torch.SymInt)):
            continue
        f = getattr(s.node, "coeff", 1)
        for k, d in enumerate(x._ragged_dims):
            if (f > 1 and d + 1 < x.dim() and d + 1 not in x._ragged_dims and x._size[d + 1] % f == 0
                    and x._size[d + 1] != f and _times_of(s, x._partition.extents[k], f)):
                return lambda: x.unflatten(d + 1, (f, x._size[d + 1] // f))  # noqa: B023  (returned at once)
    return None


def _ragged_merges(x: MJT, size) -> Optional[dict[int, tuple[int, bool]]]:
    """``{k: (f, inner)}``: ragged dims ``k`` of ``x`` with a static dim ``f`` after them (``inner``
    False) or before them (``inner`` True) that ``size`` merges into one ragged dim of ``n·f``
    (``(B, C, H // p, p, W // p, p)`` or ``(B, C, p, H // p, p, W // p)`` back to ``(B, C, H, W)``),
    every other dim kept — unless the only merge is the last ragged dim with the static dim after
    it (a view: ``flatten_ragged_static``); else None."""
    merges: dict[int, tuple[int, bool]] = {}
    one_inferred = sum(1 for s in size if type(s) is int and s == -1) == 1
    i, d = 1, 1
    while d < x.dim():
        if i >= len(size):
            return None
        if d not in x._ragged_dims:
            nxt = d + 1 if d + 1 < x.dim() and d + 1 in x._ragged_dims else None
            if nxt is not None and is_nested_int(size[i]):
                k = x._ragged_dims.index(nxt)
                if _times_of(size[i], x._partition.extents[k], x._size[d]):  # (f, n) merged: inner
                    merges[k] = (x._size[d], True)
                    i, d = i + 1, d + 2
                    continue
            # a kept static dim, or the one -1 standing for it (Swin's ``view(B, H, W, -1)``)
            if not (type(size[i]) is int and (size[i] == x._size[d] or (size[i] == -1 and one_inferred))):
                return None
            i, d = i + 1, d + 1
            continue
        k = x._ragged_dims.index(d)
        e = x._partition.extents[k]
        if is_nested_int(size[i]) and _same_size(size[i], e.nested_int):
            i, d = i + 1, d + 1
            continue
        f = x._size[d + 1] if d + 1 < x.dim() and d + 1 not in x._ragged_dims else None
        if f is None or not _times_of(size[i], e, f):
            return None
        merges[k] = (f, False)
        i, d = i + 1, d + 2
    last = len(x._ragged_dims) - 1
    if i != len(size) or not merges or (set(merges) == {last} and not merges[last][1]):
        return None
    return merges


def _merge_ragged_dims(op: str, x: MJT, merges: dict[int, tuple[int, bool]]) -> MJT:
    """``x`` with ragged dims ``k`` and the static factor beside each merged into one ragged dim of
    ``n·f`` (``_ragged_merges``): every output row ``(H, W)`` reads the input row ``(H // p, W // p)``
    at factor positions ``(H % p, W % p)`` (the factor after the part), or the row ``(H % m, …)`` at
    ``(H // m, …)`` (before it, ``m`` the part's size) — a gather, the inverse of
    ``_split_ragged_dims``; a copy that refuses writes."""
    from .views import _mark_reorder_copy

    p = x._partition
    extents = [_times(e, merges[k][0]) if k in merges else e for k, e in enumerate(p.extents)]
    out = partition_for(extents)
    sample, coords = out.row_coords()  # (R, m) output coordinates
    factors = torch.tensor([merges.get(k, (1, False))[0] for k in range(p.nragged)], device=coords.device)
    inner = torch.tensor([merges.get(k, (1, False))[1] for k in range(p.nragged)], device=coords.device)
    parts = p.device_sizes()[sample]  # (R, m): each part's size in the row's sample
    safe = parts.clamp_min(1)
    part_coord = torch.where(inner, coords % safe, torch.div(coords, factors, rounding_mode="floor"))
    factor_pos = torch.where(inner, torch.div(coords, safe, rounding_mode="floor"), coords % factors)
    rows = packed_rows(p.offsets, p.device_sizes(), sample, part_coord)
    statics = static_dims(x.dim(), x._ragged_dims)
    factor_dims = [statics.index(x._ragged_dims[k] + (-1 if merges[k][1] else 1)) + 1 for k in merges]  # values dims
    v = values_of(x) if _needs_grad(x) else x._values
    v = v.movedim(factor_dims, list(range(1, len(factor_dims) + 1)))
    values = v[(rows, *[factor_pos[:, k] for k in merges])]
    merged_statics = {x._ragged_dims[k] + (-1 if merges[k][1] else 1) for k in merges}
    out_ragged, d_out = [], 0
    for d in range(1, x.dim()):
        if d in merged_statics:
            continue  # merged into its ragged dim
        d_out += 1
        if d in x._ragged_dims:
            out_ragged.append(d_out)
    y = wrap_values(values, out, tuple(out_ragged)) if _needs_grad(x) else wrap(values, out, tuple(out_ragged))
    if values.numel():
        _mark_reorder_copy(y._values, "a merge of ragged dims with static factors", base=x)
    return y


def _divided_by(x: MJT, size) -> Optional[int]:
    """``k`` where ``size`` names the last ragged dim of ``x`` floor-divided by ``k`` at its place
    (``x.reshape(B, T // k, k * C)``: frames stacked by ``k``), or None."""
    d = x._ragged_dims[-1]
    if d >= len(size) or not is_nested_int(size[d]):
        return None
    named = extent_of(size[d])
    link = None if named is None else floordiv_of(named)
    return link[1] if link is not None and link[0] is x._partition.extents[-1] else None


def _split_then_view(op: str, x: MJT, size, k: int) -> MJT:
    """The last ragged dim split into ``(n // k, k)`` (each sample's size must divide, as dense
    torch's view requires), then viewed as ``size`` with the part's nested int at its place."""
    d = x._ragged_dims[-1]
    y = unflatten_ragged_static(op, x, d, (-1, k))
    size = list(size)
    size[d] = y._size[d]
    return getattr(y, op)(tuple(size))


def _implied_run(op: str, x: MJT, size) -> Optional[tuple[int, int]]:
    """For a ``size`` with a ``-1`` (the caller checks) that ``x`` cannot take as it stands, the one span of
    consecutive ragged dims that, flattened, makes ``size`` an ordinary view
    (``(B, 256, H, W) → (B, 4, 64, -1)``: the ``-1`` is ``H * W``), or None."""
    if _ordinary(op, x, size):
        return None
    found = [run for run in _runs(x) if _ordinary(op, flatten_ragged(op, x, *run), size)]
    return found[0] if len(found) == 1 else None


def _named_split(x: MJT, size) -> Optional[tuple[int, list]]:
    """``(d, nested ints)``: a ragged dim ``d`` of ``x`` flattened from ragged dims whose nested
    ints stand in a row in ``size`` (``(B, 8, 16, H * W) → (B, -1, H, W)``), or None."""
    for k, d in enumerate(x._ragged_dims):
        sub = _unflat(x, k)
        if sub is None:
            continue
        want = [e.nested_int for e in sub.extents]
        for i in range(1, len(size) - len(want) + 1):
            if all(is_nested_int(a) and _same_size(a, w) for a, w in zip(size[i:i + len(want)], want)):
                return d, want
    return None


def _named_run(x: MJT, size, own) -> Optional[tuple[int, int, int]]:
    """``(start, end, i)``: the span of consecutive ragged dims of ``x`` whose flattened nested int
    (or a product of the same sizes in another order) is ``size[i]``, or None. ``own``: x's
    nested ints."""
    for i, s in enumerate(size):
        if not is_nested_int(s) or any(s is n for n in own):
            continue
        for start, end in _runs(x):
            k = x._ragged_dims.index(start)
            sub = partition_for(x._partition.extents[k:k + end - start + 1])
            if _same_size(s, flat_extent(sub).nested_int) or same_product(s, sub.extents):
                return start, end, i
    return None


def _flatten_then_view(op: str, x: MJT, size, start: int, end: int, i: int) -> MJT:
    y = flatten_ragged(op, x, start, end)
    size = list(size)
    size[i] = y._size[start]  # ``W * H`` names the same sizes as the flattened ``H * W``
    return getattr(y, op)(tuple(size))


def _view_plan(op: str, x: MJT, size) -> Optional[Callable[[], MJT]]:
    size = list(size)
    n = x.dim()
    if len(size) < n:
        found = []
        for start, end in _runs(x):
            if n - (end - start) != len(size):
                continue
            rest_ok = _fits(size[:start], x.shape[:start]) and _fits(size[start + 1:], x.shape[end + 1:])
            target = size[start]
            if rest_ok and (target == -1 or is_nested_int(target)):
                found.append((start, end, target))
        if len(found) != 1:
            return _static_merge_plan(op, x, size)
        start, end, target = found[0]
        if is_nested_int(target):
            if torch.compiler.is_compiling():
                # whether ``target`` is the merged extent's nested int is known once it is made
                return lambda: _plan_eagerly(op, x, size)
            k = x._ragged_dims.index(start)
            sub = x._partition if end - start + 1 == x._partition.nragged else partition_for(x._partition.extents[k:k + end - start + 1])
            if target != flat_extent(sub).nested_int and not same_product(target, sub.extents):
                return _static_merge_plan(op, x, size)
        return lambda: flatten_ragged(op, x, start, end)
    if len(size) > n:
        m = len(size) - n + 1  # ragged dim d would split into size[d : d + m]
        found = []
        for k, d in enumerate(x._ragged_dims):
            if not (_fits(size[:d], x.shape[:d]) and _fits(size[d + m:], x.shape[d + 1:])
                    and any(is_nested_int(s) for s in size[d:d + m])):
                continue
            if _same_size(size[d], x.shape[d]):
                # dim d kept whole (``q.view(q.shape[:-1] + (H, -1))``): the new dims regroup static
                # ones, which needs no host sizes — not a split of d (whose pieces are other extents)
                continue
            if torch.compiler.is_compiling():
                # whether dim d was flattened from those dims is known on the host (its extent's link)
                return lambda: _plan_eagerly(op, x, size)
            sub = _unflat(x, k)
            if sub is None or sub.nragged != m:
                continue
            want = [e.nested_int for e in sub.extents]
            if all(s == -1 or (is_nested_int(s) and s == w) for s, w in zip(size[d:d + m], want)):
                found.append((d, size[d:d + m]))
        if len(found) != 1:
            return _static_split_plan(op, x, size) if not found else None
        d, sizes = found[0]
        return lambda: unflatten_ragged(op, x, d, sizes)
    return None


def _ordinary(op: str, x: MJT, size) -> bool:
    """Whether ``size`` is an ordinary view of ``x`` (its ragged dims kept whole)."""
    try:
        check_view_shape(op, x, size)
    except RuntimeError:
        return False
    return True


def _static_merge_plan(op: str, x: MJT, size) -> Optional[Callable[[], MJT]]:
    """``size`` merges the last ragged dim with the static dims after it: the sizes before and
    after keep ``x``'s, and the merged size is ``-1``, the merge's own nested int, or the nested int
    times the static sizes (``src_len * k``)."""
    d = x._ragged_dims[-1]
    end = d + x.dim() - len(size)
    if end <= d or d >= len(size) or not (_fits(size[:d], x.shape[:d]) and _fits(size[d + 1:], x.shape[end + 1:])):
        return None
    target = size[d]
    k = math.prod(x._size[d + 1:end + 1])
    if k == 1 or not (target == -1 or is_nested_int(target)):
        return None  # (dropping size-one dims is a view of the static dims, which traces)
    if (target == -1 or _same_size(target, x.shape[d])) and _ordinary(op, x, size):
        # the ragged dim kept whole (``-1`` or its own nested int, ``x.reshape(B, N, -1)``) with the
        # static dims after it regrouped: that reading wins, even where every sample is empty and
        # the merged sizes would equal the ragged dim's own
        return None
    if is_nested_int(target):
        if torch.compiler.is_compiling():
            return None
        e = x._partition.extents[-1]
        if not _same_size(target, e.nested_int * k) and not _same_size(target, _times(e, k).nested_int):
            return None
    return lambda: flatten_ragged_static(op, x, d, end)


def _static_split_plan(op: str, x: MJT, size) -> Optional[Callable[[], MJT]]:
    """``size`` splits the last ragged dim into a ragged part (``-1`` or its nested int) and
    static sizes, keeping every other size."""
    d = x._ragged_dims[-1]
    m = len(size) - x.dim() + 1
    sizes = size[d:d + m]
    if not (_fits(size[:d], x.shape[:d]) and _fits(size[d + m:], x.shape[d + 1:]) and _static_split(x, d, sizes)):
        return None
    if (sizes[0] == -1 or _same_size(sizes[0], x.shape[d])) and _ordinary(op, x, size):
        # the ragged dim kept whole (``-1`` or its own nested int), with the static dims regrouped
        # (``qkv.reshape(B, N, 3, H, -1)``, the -1 standing for the head size): that reading wins
        return None
    if torch.compiler.is_compiling():
        return None
    return lambda: unflatten_ragged_static(op, x, d, sizes)


@eager_route(_WHY)
def _plan_eagerly(op: str, x: MJT, size) -> MJT:
    """``x.view(size)`` / ``reshape`` that names a merged ragged dim, or the dims to split one
    into, by nested ints: planned eagerly (a graph break under compile); a size that is neither
    goes the ordinary way (and its error)."""
    plan = view_plan(op, x, size)
    if plan is not None:
        return plan()
    return x.reshape(size) if op == "reshape" else x.view(size)


def traced_static_view(op: str, x: MJT, shape):
    """While tracing a tensor that needs gradients: ``x`` with its static dims regrouped to
    ``shape`` by a view (``reshape`` for every op but ``view``) of its packed values, with autograd
    on the values; otherwise ``NotImplemented`` (aten's ``view`` on the wrapper). The wrapper's own
    ViewBackward0 reshapes the gradient to ``x``'s sizes, and AOT's joint trace of that multiplies
    the nested ints of two ragged dims (unsupported)."""
    if not (torch.compiler.is_compiling() and _needs_grad(x)):
        return NotImplemented
    static, ragged = check_view_shape(op, x, shape)
    v = values_of(x)
    new = v.view(v.shape[0], *static) if op == "view" else v.reshape(v.shape[0], *static)
    out = wrap_values(new, x._partition, ragged)
    # not an autograd view of x: an in-place write into either would not reach the other's
    # gradient, so such writes are refused in the trace (NOTE [ Writes into shared values ] in writes.py)
    x.__dict__["_traced_alias"] = out.__dict__["_traced_alias"] = True
    return out
