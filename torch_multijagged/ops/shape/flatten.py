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
dims stay in the graph. Flattening a ragged dim together with a static dim stays an
error: the rows would be reordered per sample, not relabelled.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int, statically_known_true

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import Partition, flat_extent, partition_for
from .._common import MJT, describe, eager_route, wrap
from .._routing import _needs_grad, route
from . import merged, tokens
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
        raise StructureError(
            f"{op}(): expected a static dim, or a ragged dim made by flattening ragged dims, of {describe(x)}; got "
            f"ragged dim {d}, which was not made by flattening, so it cannot be split into {tuple(sizes)}"
        )
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
    when ``size`` asks for neither (the ordinary view path then checks it)."""
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
            return None
        start, end, target = found[0]
        if is_nested_int(target):
            if torch.compiler.is_compiling():
                # whether ``target`` is the merged extent's nested int is known once it is made
                return lambda: _plan_eagerly(op, x, size)
            k = x._ragged_dims.index(start)
            sub = x._partition if end - start + 1 == x._partition.nragged else partition_for(x._partition.extents[k:k + end - start + 1])
            if target != flat_extent(sub).nested_int:
                return None
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
            return None
        d, sizes = found[0]
        return lambda: unflatten_ragged(op, x, d, sizes)
    return None


@eager_route(_WHY)
def _plan_eagerly(op: str, x: MJT, size) -> MJT:
    """``x.view(size)`` / ``reshape`` that names a merged ragged dim, or the dims to split one
    into, by nested ints: planned eagerly (a graph break under compile); a size that is neither
    goes the ordinary way (and its error)."""
    plan = view_plan(op, x, size)
    if plan is not None:
        return plan()
    return x.reshape(size) if op == "reshape" else x.view(size)


def _normalize(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


@route(torch.Tensor.view)
def _view(input, *shape):
    """``view`` that merges or splits ragged dims (``view_plan``); anything else goes on to aten's
    ``view`` (ops/shape/views.py)."""
    if not isinstance(input, MJT) or not shape or isinstance(shape[0], torch.dtype):
        return NotImplemented
    if tokens.flat_request(input, _normalize(shape)):  # NOTE [ Flattening the batch dim ] in tokens.py
        return tokens.flatten_batch("view", input, _normalize(shape))
    if merged.merge_request(input, _normalize(shape)):  # NOTE [ Batch-merged tokens ] in merged.py
        return merged.merge_batch("view", input, _normalize(shape))
    plan = view_plan("view", input, _normalize(shape))
    if plan is not None:
        return plan()
    return traced_static_view("view", input, _normalize(shape))


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
