"""``__torch_function__`` routes of the shape family: ``reshape`` / ``view`` / ``flatten`` / ``unflatten``,
the ``split`` family, ``narrow``, ``squeeze()``, ``channel_shuffle``, ``view_copy`` (NOTE [ Routes ]
in ``ops/_routing.py`` says what a route may do).

Errors name the op the user called (``reshape()``, not the ``view()`` it routes to); piece sizes
of the ``split`` family and the sizes of ``unflatten`` come from dense torch itself, run on a
meta tensor of the static sizes, so edge cases (size 0, more chunks than elements, uneven
pieces, ``-1``) and their errors are exactly dense torch's.
"""

from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ... import constructors
from .. import bridged
from ...errors import StructureError
from .._common import MJT, canonical_dim, describe
from ...bridge import static_as_ragged
from .._routing import _needs_grad, _static_dim, _uniform, route, unify_shape
from ...structure import broadcast_extent, extent_of, partition_for, same_extent, sizes_of
from ..indexing.slicing import narrow_ragged, slice_ragged
from ..elementwise import trailing
from .views import check_view_shape
from . import flatten as ragged_flatten
from . import merged, regroup, rows, tokens


# ----------------------------------------------------------------------------- reshape family
def _normalize_shape(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def reshape_as(op: str, input: MJT, shape) -> MJT:
    """``reshape`` = ``view``, after a copy when the static dims cannot be viewed with their
    strides; aten's composite would multiply nested ints to check the element count. The shape
    is checked first, so that a bad one is reported under ``op``'s name."""
    if torch.compiler.is_compiling():
        check_view_shape(op, input, shape)
        traced = ragged_flatten.traced_static_view(op, input, shape)
        if traced is not NotImplemented:
            return traced
        # A failed view cannot be caught while tracing: copy unless the tensor is contiguous,
        # where every regrouping of static dims is a view (NOTE [ Contiguity as torch.jagged
        # reports it ] in ops/shape/views.py).
        return (input if input.is_contiguous() else input.contiguous()).view(shape)
    # Eagerly the view checks the shape itself (``view_default``); a shape it refuses is checked
    # again under ``op``'s name, so the error names the op the user called.
    try:
        return input.view(shape)
    except StructureError:
        check_view_shape(op, input, shape)
        raise
    except RuntimeError:  # not viewable with these strides: copy, as reshape does
        check_view_shape(op, input, shape)
        return input.contiguous().view(shape)


@route(torch.reshape, torch.Tensor.reshape, sequence="shape")
def _reshape(input, *shape):
    if not isinstance(input, MJT):
        return NotImplemented
    input = unify_shape(input, _normalize_shape(shape))  # equal sizes, other nested ints
    if tokens.flat_request(input, _normalize_shape(shape)):  # NOTE [ Flattening the batch dim ]
        return tokens.flatten_batch("reshape", input, _normalize_shape(shape))
    if merged.merge_request(input, _normalize_shape(shape)):  # NOTE [ Batch-merged tokens ] in merged.py
        return merged.merge_batch("reshape", input, _normalize_shape(shape))
    rows_op = rows.rows_request(input, _normalize_shape(shape))  # NOTE [ Rows as samples ] in rows.py
    if rows_op is not None:
        return rows_op("reshape", input)
    plan = ragged_flatten.view_plan("reshape", input, _normalize_shape(shape))  # merging / splitting ragged dims
    if plan is not None:
        return plan()
    if torch.compiler.is_compiling():
        return reshape_as("reshape", input, _normalize_shape(shape))
    try:
        return reshape_as("reshape", input, _normalize_shape(shape))
    except StructureError:
        # elements regrouped across a ragged dim: NOTE [ Regrouping across a ragged dim ] in regroup.py
        plan = regroup.regroup_plan("reshape", input, _normalize_shape(shape))
        if plan is not None:
            return plan()
        groups = _groups(input, _normalize_shape(shape))
        if groups is None:
            raise
        return _by_groups(input, groups)


def _groups(x: MJT, shape):
    """For a reshape that splits or merges several groups of dims at once (a patchify
    ``(B, C, H // p, p, W // p, p)`` of images with one static side splits a static and a ragged
    dim; ``(B, h * w, p * p * C)`` after it merges two groups): ``x``'s dims after the batch dim and
    ``shape``'s paired into groups of one dim to several or several to one, as dense ``view`` pairs
    them (ints with ints of the same product, a ragged size with sizes that name one). None where
    no such pairing exists, or where one group alone changes (the reshape itself decides that one)."""
    src, dst = list(x.shape[1:]), list(shape[1:])
    if not shape or shape[0] not in (-1, x._partition.batch):
        return None
    if any(isinstance(t, int) and t == -1 for t in dst):
        return None
    groups = _pair(src, dst)
    if groups is None or sum(1 for a, b in groups if len(a) != 1 or len(b) != 1) < 2:
        return None
    return groups


def _by_groups(x: MJT, groups):
    """``x`` reshaped one group at a time: static regroups, then splits, then merges; a merge into a
    ragged size names it ``-1`` (the merged dim's nested int is the reshape's own, as for a single
    merge)."""
    widths = [len(a) for a, _ in groups]
    for kind in ("regroup", "split", "merge"):
        for k, (a, b) in enumerate(groups):
            if _kind(a, b) != kind:
                continue
            start = 1 + sum(widths[:k])
            to = [-1] if kind == "merge" and not isinstance(b[0], int) else b
            x = x.reshape(*x.shape[:start], *to, *x.shape[start + widths[k]:])
            widths[k] = len(b)
    return x


def _kind(a: list, b: list) -> str:
    if len(a) > 1 and len(b) > 1:
        return "regroup"
    if len(b) > 1:
        return "split"
    return "merge" if len(a) > 1 else "same"


def _pair(src: list, dst: list):
    """``[(source sizes, target sizes), …]`` covering both lists in order, each pair one to many or
    many to one (or many ints to many ints); ints pair with ints of the same product, ragged sizes
    with sizes of the same per-sample product (backtracking); None where none fits."""
    if not src and not dst:
        return []
    if not src or not dst:
        return None
    for a in range(1, len(src) + 1):
        for b in range(1, len(dst) + 1):
            left, right = src[:a], dst[:b]
            if a > 1 and b > 1 and not all(isinstance(t, int) for t in left + right):
                break  # several to several: static dims only (a regroup, ``(8, 3)`` as ``(12, 2)``)
            if not _fits(left, right):
                continue
            rest = _pair(src[a:], dst[b:])
            if rest is not None:
                return [(left, right), *rest]
    return None


def _fits(left: list, right: list) -> bool:
    """Whether two groups of sizes hold the same number of elements in every sample (ragged sizes
    by their per-sample values: a group naming another ragged size, ``2 * n`` for ``4 * n``, is no
    pair)."""
    ragged_l = [s for s in left if not isinstance(s, int)]
    ragged_r = [s for s in right if not isinstance(s, int)]
    if not ragged_l and not ragged_r:
        return math.prod(left) == math.prod(right)
    if not ragged_l or not ragged_r:
        return False
    a, b = _per_sample(left), _per_sample(right)
    return a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))


def _per_sample(sizes: list):
    """Each sample's product of ``sizes`` (ints and eager nested ints), or None where a size has no
    per-sample values here."""
    prod = None
    for s in sizes:
        v = s if isinstance(s, int) else sizes_of(s)
        if v is None:
            return None
        prod = v if prod is None else prod * v
    return prod


@route(torch.Tensor.view, sequence="size")
def _view(input, *shape, dtype=None):
    """``view`` that merges or splits ragged dims (``view_plan`` in flatten.py) or regroups elements
    across one (``regroup.py``); anything else goes on to aten's ``view`` (ops/shape/views.py)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if dtype is not None or (len(shape) == 1 and isinstance(shape[0], torch.dtype)):
        if shape and dtype is not None:
            raise TypeError("view() received an invalid combination of arguments: both a size and dtype")
        return trailing.view_dtype(input, dtype if dtype is not None else shape[0])
    if not shape:
        return NotImplemented
    size = _normalize_shape(shape)
    relabelled = unify_shape(input, size)  # equal sizes, other nested ints
    if relabelled is not input:
        return relabelled.view(size)  # the view (possibly aten's) of the relabelled tensor
    if tokens.flat_request(input, size):  # NOTE [ Flattening the batch dim ] in tokens.py
        return tokens.flatten_batch("view", input, size)
    if merged.merge_request(input, size):  # NOTE [ Batch-merged tokens ] in merged.py
        return merged.merge_batch("view", input, size)
    rows_op = rows.rows_request(input, size)  # NOTE [ Rows as samples ] in rows.py
    if rows_op is not None:
        return rows_op("view", input)
    plan = ragged_flatten.view_plan("view", input, size) or regroup.regroup_plan("view", input, size)
    if plan is not None:
        return plan()
    return ragged_flatten.traced_static_view("view", input, size)


def _scatter_into_static(name: str):
    def routed(input, src, dim=0, *args, **kwargs):
        """``torch.slice_scatter`` / ``select_scatter`` along a static dim: on the packed values, under
        autograd (aten's derivative builds a zero tensor of ``src``'s nested-int sizes)."""
        if not isinstance(input, MJT) or not _needs_grad(input, src):
            return NotImplemented  # without gradients: the op table's handler
        d = _static_dim(name, input, dim)
        vd = [e for e in range(1, input.dim()) if e not in input._ragged_dims].index(d) + 1
        return bridged.scatter_into_static(name, input, src, vd, args, kwargs)

    return routed


route(torch.slice_scatter)(_scatter_into_static("slice_scatter"))
route(torch.select_scatter)(_scatter_into_static("select_scatter"))


@route(torch.Tensor.expand, sequence="size")
def _expand(input, *size, implicit=False):
    """``expand`` of a ragged dim to a static size that every sample has there (``argsort(…)[:, :1,
    None].expand(B, 1, C)``): that dim made static first (NOTE [ Ragged dims of one size in every
    sample ] in flatten.py); every other expand is aten's (ops/shape/views.py)."""
    if not isinstance(input, MJT):
        return NotImplemented
    size = _normalize_shape(size)
    if len(size) == input.dim() and any(_wider(input, d, size[d]) for d in input._ragged_dims):
        return _broadcast_ragged(input, size, implicit)
    grown = _static_as_named_ragged(input, size)
    if grown is not None:
        return grown.expand(size, implicit=implicit)
    fixed = [d for d in input._ragged_dims if d < len(size) and type(size[d]) is int and size[d] != -1]
    if not fixed or len(size) != input.dim():
        return NotImplemented
    for d in fixed:
        if torch.compiler.is_compiling():
            raise StructureError(
                f"expand(): ragged dim {d} of {describe(input)} cannot be expanded to the static size {size[d]} under "
                "torch.compile: whether every sample has that size is known eagerly only; expand it to -1 (or its "
                "ragged size), or take the size from a static dim"
            )
        if ragged_flatten.common_size(input, d) != size[d]:
            sizes = input._partition.extents[input._ragged_dims.index(d)].host_lengths().tolist()
            raise StructureError(f"expand(): ragged dim {d} of {describe(input)} cannot be expanded to {size[d]}: its "
                                 f"size is not {size[d]} in every sample (sizes {sizes}); give -1 or its ragged size")
    return ragged_flatten.as_static(input, fixed).expand(size, implicit=implicit)


def _static_as_named_ragged(input: MJT, size):
    """``input`` with each static dim that ``size`` names by a ragged size of this batch, every
    sample of which has the static size there, made that ragged dim (NOTE [ Static sizes equal to a
    ragged dim ] in ops/_routing.py): a pair of equal lengths, inferred ``(B, j0, n)``, expanded to
    ``(B, n, n)`` with ``n = x.shape[1]`` (openfold3's LMA bias). None where there is none (or
    under torch.compile, where whether every sample has a size is unknown)."""
    if len(size) != input.dim() or torch.compiler.is_compiling():
        return None
    out = None
    for d in range(1, input.dim()):
        s = size[d]
        if d in input._ragged_dims or input._size[d] == 1 or not (isinstance(s, torch.SymInt) and is_nested_int(s)):
            continue
        e = next((f for f in input._partition.extents if f.nested_int is s or f.nested_int == s), None) or extent_of(s)
        if e is None or e.batch != input._partition.batch or not _uniform(e, input._size[d]):
            return None
        x = input if out is None else out
        out = static_as_ragged(x, d, next((f for f in x._partition.extents if same_extent(f, e)), e))
    return out


def _wider(input: MJT, d: int, s) -> bool:
    """Whether ``s`` asks ragged dim ``d`` of ``input`` for another ragged size than its own
    (eagerly; compiled, every ragged ``expand`` is aten's, which keeps a dim's own size only)."""
    if not isinstance(s, torch.SymInt) or torch.compiler.is_compiling():
        return False
    e = input._partition.extents[input._ragged_dims.index(d)]
    return not (s is e.nested_int or s.node is e.nested_int.node)


def _broadcast_ragged(input: MJT, size, implicit: bool):
    """``expand`` of ragged dims to other ragged sizes (``x[:, :1].expand(-1, n, -1)``: each
    sample's one row over its ``n``): where a dim has size 1 in a sample, that sample's row is
    broadcast, as dense expand does; elsewhere the sizes must be equal. Computed as a product with
    ones of the wider sizes (as ``expand_as``: exact for every value, a gather whose gradient sums
    back); the rest of ``size`` is an ordinary ``expand`` of the result. Eager only: it reads the
    sizes on the host."""
    extents = list(input._partition.extents)
    for k, d in enumerate(input._ragged_dims):
        if not _wider(input, d, size[d]):
            continue
        e, t = extents[k], extent_of(size[d])
        if t is None or t.batch != e.batch:
            raise StructureError(f"expand(): ragged dim {d} of {describe(input)} cannot be expanded to {size[d]}: only "
                                 "to a ragged size of a batch of as many samples, eagerly")
        if broadcast_extent(e, t) is not t and not same_extent(e, t):
            raise StructureError(
                f"expand(): ragged dim {d} of {describe(input)} cannot be expanded to {size[d]}: a sample's size must "
                f"be 1 or {size[d]}'s (sizes {e.host_lengths().tolist()} against {t.host_lengths().tolist()})")
        extents[k] = t
    partition = partition_for(extents)
    statics = input.dim() - 1 - len(input._ragged_dims)
    ones = MJT(torch.ones((partition.rows,) + (1,) * statics, dtype=input.dtype, device=input.device), partition,
               input._ragged_dims)
    out = input * ones
    rest = [-1 if d in input._ragged_dims else s for d, s in enumerate(size)]
    return out if all(s == -1 for s in rest) else out.expand(rest, implicit=implicit)


def _like_route(method: str):
    """``x.view_as(y)`` / ``x.reshape_as(y)`` as ``x.view(y.shape)`` / ``x.reshape(y.shape)``, so
    that the shape's nested ints are read as ``view`` reads them (``x.flatten(2)…view_as(x)`` of
    images: back to their ``(H, W)``); aten's composite passes them below the routes."""
    def routed(input, other):
        if not isinstance(input, MJT) or not isinstance(other, torch.Tensor):
            return NotImplemented
        return getattr(input, method)(other.shape)

    return routed


route(torch.Tensor.view_as)(_like_route("view"))
route(torch.Tensor.reshape_as)(_like_route("reshape"))


@route(torch.flatten, torch.Tensor.flatten)
def _flatten(input, start_dim=0, end_dim=-1):
    if not isinstance(input, MJT):
        return NotImplemented
    start = canonical_dim("flatten", input.dim(), start_dim)
    end = canonical_dim("flatten", input.dim(), end_dim)
    if start > end:
        raise ValueError(f"flatten(): expected start_dim <= end_dim, got {start_dim} and {end_dim}")
    if start == end:
        return input
    if start == 0 and end >= max(input._ragged_dims):  # NOTE [ Flattening the batch dim ]
        return tokens.flatten_batch("flatten", input, (-1, *input._size[end + 1:]))
    if start == 0 and input._ragged_dims and end < min(input._ragged_dims):  # NOTE [ Batch-merged tokens ]
        return merged.flatten_merge(input, end)
    if start == 0 and end == 1 and rows.merge_rows_request(input, (-1, *input._size[2:])):  # NOTE [ Rows as samples ]
        return rows.merge_rows("flatten", input)
    if start > 0 and ragged_flatten._last_ragged_with_static(input, start, end):  # NOTE [ Flattening ragged dims ]
        return ragged_flatten.flatten_ragged_static("flatten", input, start, end)
    if start > 0 and all(d in input._ragged_dims for d in range(start, end + 1)):
        return ragged_flatten.flatten_ragged("flatten", input, start, end)  # NOTE [ Flattening ragged dims ]
    if start == 0 or any(start <= d <= end for d in input._ragged_dims):
        error = StructureError(
            f"flatten(): only static dims or consecutive ragged dims of a multi_jagged tensor can be flattened, "
            f"got dims {start}..{end} of {describe(input)}"
        )
        if start == 0 or torch.compiler.is_compiling():
            raise error
        # static dims before a ragged one (images of one height, ``(B, C, H, j0)``): each sample's
        # elements regrouped, a copy as dense flatten's of a non-contiguous tensor (NOTE
        # [ Regrouping across a ragged dim ] in regroup.py)
        plan = regroup.regroup_plan("flatten", input, (*input.shape[:start], -1, *input.shape[end + 1:]))
        if plan is None:
            raise error
        return plan()
    size = 1
    for d in range(start, end + 1):
        size *= input.shape[d]
    return reshape_as("flatten", input, (*input.shape[:start], size, *input.shape[end + 1:]))


@route(torch.ravel, torch.Tensor.ravel)
def _ravel(input):
    if not isinstance(input, MJT):
        return NotImplemented
    return tokens.flatten_batch("ravel", input, (-1,))  # NOTE [ Flattening the batch dim ]


@route(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(input, dim, sizes):
    """``unflatten`` of a static dim (``-1`` inferred as dense torch does); a ragged dim splits
    only back into the ragged dims it was flattened from (NOTE [ Flattening ragged dims ]), the
    batch dim not at all."""
    if not isinstance(input, MJT):
        return NotImplemented
    if isinstance(dim, int) and canonical_dim("unflatten", input.dim(), dim) == 0 and len(sizes) == 2:
        shape = (*sizes, *input._size[1:])
        if rows.split_rows_request(input, shape):  # NOTE [ Rows as samples ] in rows.py
            return rows.split_rows("unflatten", input)
    if isinstance(dim, int) and canonical_dim("unflatten", input.dim(), dim) in input._ragged_dims:
        d = canonical_dim("unflatten", input.dim(), dim)
        if ragged_flatten._static_split(input, d, tuple(sizes)):  # a ragged part and static sizes
            return ragged_flatten.unflatten_ragged_static("unflatten", input, d, tuple(sizes))
        return ragged_flatten.unflatten_ragged("unflatten", input, d, sizes)
    d = _static_dim("unflatten", input, dim)
    new = _unflat_sizes(int(input.shape[d]), sizes)
    if new is None:  # dense torch's own checks and -1 inference (its errors name the dim the user gave)
        new = _probe(input, d).unflatten(dim, sizes).shape[d : d + len(sizes)]
    return reshape_as("unflatten", input, (*input.shape[:d], *new, *input.shape[d + 1:]))


def _unflat_sizes(n: int, sizes) -> tuple[int, ...] | None:
    """The sizes ``unflatten`` splits a dim of ``n`` elements into, for plain sizes that hold
    them (at most one ``-1``, inferred); None for anything else, which the dense op on a meta
    probe then checks in its own words."""
    if not isinstance(sizes, (tuple, list, torch.Size)) or not sizes or not all(type(s) is int for s in sizes):
        return None
    holes = [k for k, s in enumerate(sizes) if s == -1]
    if len(holes) > 1 or any(s < -1 for s in sizes):
        return None
    known = 1
    for s in sizes:
        known *= s if s != -1 else 1
    if holes:
        if known == 0 or n % known:
            return None
        return tuple(n // known if s == -1 else s for s in sizes)
    return tuple(sizes) if known == n else None


# ----------------------------------------------------------------------------- split family
def _probe(input: MJT, d: int) -> torch.Tensor:
    """A meta tensor with ``input``'s static sizes (1 for the batch and ragged dims) whose only
    non-zero stride is 1 at dim ``d``: a piece's storage offset is where it starts along ``d``."""
    shape = [1 if i == 0 or i in input._ragged_dims else s for i, s in enumerate(input.shape)]
    return torch.empty_strided(shape, [1 if i == d else 0 for i in range(len(shape))], device="meta")


class _SplitStatic(torch.autograd.Function):
    """Consecutive pieces of a multi_jagged tensor along static dim ``d`` whose backward writes the
    gradient once: ``cat`` of the pieces' gradients (zeros for unused pieces, made like the piece).
    Each piece as its own ``narrow`` would instead zero-fill a full-size buffer per piece and sum
    them (``SliceBackward``), which cost a third of a SwiGLU step. Like dense ``split``'s, the
    pieces are views that may not be modified in place."""

    @staticmethod
    def forward(ctx, input, d, bounds):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        ctx.save_for_backward(input.detach())  # its structure only
        ctx.d, ctx.bounds = d, bounds
        return tuple(input.narrow(d, s, n) for s, n in bounds)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        if all(g is None for g in grads):
            return None, None, None
        (x,) = ctx.saved_tensors
        d = ctx.d
        full = [torch.zeros_like(x.narrow(d, s, n)) if g is None else g for g, (s, n) in zip(grads, ctx.bounds)]
        return torch.cat(full, d), None, None


def _batch_pieces(input: MJT, dense_split) -> tuple:
    """Sub-batches along the batch dim (``constructors.split_batch``: views of the values with new
    nested ints, as ``torch.jagged``'s ``chunk`` on dim 0). ``dense_split(probe)`` is the dense op
    on a meta tensor ``(B, 1)`` (2-D, as ``vsplit`` requires): its pieces' sizes and offsets are
    the sub-batches'."""
    bounds = tuple((p.storage_offset(), p.shape[0]) for p in dense_split(torch.empty(input.shape[0], 1, device="meta")))
    return constructors.split_batch(input, bounds)


def _split_pieces(op: str, input: MJT, dim: int, dense_split) -> tuple:
    """Pieces of ``input`` along static ``dim``. ``dense_split(probe)`` is the dense op on a meta
    tensor of the dim's size: its pieces' sizes and offsets are the pieces' (tensor_split's can
    overlap or be empty). Eagerly with gradients, consecutive pieces go through ``_SplitStatic``
    (one ``cat`` in backward); otherwise each is a ``narrow`` view with its own backward (aten's
    ``split_backward`` would build zeros of nested-int sizes for unused pieces)."""
    if canonical_dim(op, input.dim(), dim) == 0:
        return _batch_pieces(input, dense_split)
    d = _static_dim(op, input, dim)
    pieces = dense_split(_probe(input, d))
    bounds = pieces.bounds if isinstance(pieces, _Bounds) else tuple((p.storage_offset(), p.shape[d]) for p in pieces)
    consecutive = all(s == sum(n for _, n in bounds[:i]) for i, (s, _) in enumerate(bounds))
    if (consecutive and sum(n for _, n in bounds) == input.shape[d] and _needs_grad(input)
            and not torch.compiler.is_compiling()):
        return _SplitStatic.apply(input, d, bounds)
    return tuple(input.narrow(d, s, n) for s, n in bounds)


def _dim_arg(args, kwargs, index: int):
    if "dim" in kwargs:
        return kwargs["dim"]
    return args[index] if len(args) > index else 0


class _Bounds:
    """Stands for the meta probe of ``_split_pieces`` where the pieces of ``chunk(k)`` or
    ``split(s)`` (plain positive ints) are known without running the dense op: their
    ``(offset, size)`` along the dim, as dense torch makes them."""

    def __init__(self, bounds):
        self.bounds = bounds


def _simple_bounds(method: str, n: int, arg) -> _Bounds | None:
    if type(arg) is not int or arg <= 0 or n <= 0:
        return None
    if method == "chunk":
        size = -(-n // arg)  # dense chunk: pieces of ceil(n / k), the last one shorter, none empty
    elif method == "split":
        size = arg
    else:
        return None
    return _Bounds(tuple((s, min(size, n - s)) for s in range(0, n, size)))


def _split_route(op: str, method: str):
    def routed(input, *args, **kwargs):
        if not isinstance(input, MJT):
            return NotImplemented
        dim = _dim_arg(args, kwargs, 1)
        rest = {k: v for k, v in kwargs.items() if k != "dim"}
        dense = lambda t: getattr(t, method)(*args[:1], **rest, dim=dim)  # noqa: E731
        if args and not rest and isinstance(dim, int) and canonical_dim(op, input.dim(), dim) not in (0, *input._ragged_dims):
            known = _simple_bounds(method, int(input.shape[dim]), args[0])
            if known is not None:
                return _split_pieces(op, input, dim, lambda t: known)
        return _split_pieces(op, input, dim, dense)

    return routed


route(torch.split, torch.Tensor.split)(_split_route("split", "split"))
route(torch.chunk, torch.Tensor.chunk)(_split_route("chunk", "chunk"))
route(torch.split_with_sizes, torch.Tensor.split_with_sizes)(_split_route("split_with_sizes", "split_with_sizes"))
route(torch.unsafe_split, torch.Tensor.unsafe_split)(_split_route("unsafe_split", "unsafe_split"))
route(torch.unsafe_chunk, torch.Tensor.unsafe_chunk)(_split_route("unsafe_chunk", "unsafe_chunk"))
route(torch.tensor_split, torch.Tensor.tensor_split)(_split_route("tensor_split", "tensor_split"))


@route(torch.narrow, torch.Tensor.narrow)
def _narrow(input, dim, start, length):
    """``narrow`` of the batch dim: a sub-batch (``constructors.narrow_batch``); of a static dim:
    aten's ``narrow`` (a ``slice`` of the values); of a ragged dim: per sample, a static result
    (NOTE [ Indexing along ragged dims ])."""
    if not isinstance(input, MJT):
        return NotImplemented
    d = canonical_dim("narrow", input.dim(), dim)
    if d == 0:
        return constructors.narrow_batch(input, start, length)
    if d in input._ragged_dims:
        k = input._ragged_dims.index(d)
        if isinstance(length, torch.SymInt) and type(start) is int and start >= 0:
            # a ragged length (``y.narrow(-1, 0, x.shape[-1])``): each sample's own, which it must hold
            # (dense narrow's rule); the dim keeps that length's nested int
            n = input._partition.extents[k].host_lengths()
            want = extent_of(length)
            if want is None or want.batch != input._partition.batch:
                raise TypeError(f"narrow(): the ragged length {length} along dim {d} of {describe(input)} is not a "
                                "ragged size of a batch of as many samples")
            if bool((start + want.host_lengths() > n).any()):
                raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size in a sample "
                                   f"of {describe(input)} at dim {d}")
            if start == 0:
                return slice_ragged("narrow", input, d, k, start, length, 1)
            # from ``start`` to each sample's end (``x.narrow(1, 1, n - 1)``, ``x[:, 1:]``'s nested int)
            out = slice_ragged("narrow", input, d, k, start, None, 1)
            if not torch.equal(out._partition.extents[k].host_lengths(), want.host_lengths()):
                raise TypeError(f"narrow(): a ragged length from start {start} along dim {d} of {describe(input)} that "
                                "stops before a sample's end: only from 0, or to each sample's end, for layout "
                                "torch.multi_jagged")
            return out
        return narrow_ragged("narrow", input, d, k, int(start), int(length))
    return NotImplemented


def _xsplit_route(op: str, pick_dim):
    """``hsplit`` / ``vsplit`` / ``dsplit``: ``tensor_split`` along a fixed dim."""

    def routed(input, sections):
        if not isinstance(input, MJT):
            return NotImplemented
        d = pick_dim(input.dim())
        if d:
            _static_dim(op, input, d)

        def dense(t):
            return getattr(torch, op)(t, sections)  # dense torch's dim choice and checks

        return _split_pieces(op, input, d, dense)

    return routed


route(torch.hsplit, torch.Tensor.hsplit)(_xsplit_route("hsplit", lambda n: 1 if n > 1 else 0))
route(torch.vsplit, torch.Tensor.vsplit)(_xsplit_route("vsplit", lambda n: 0))
route(torch.dsplit, torch.Tensor.dsplit)(_xsplit_route("dsplit", lambda n: 2))


@route(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(input, dim=None):
    """``squeeze()`` drops the static size-1 dims and the ragged dims of size 1 in every sample (as
    each sample's ``squeeze()``); a ragged dim of size 1 in some samples only stays (their results'
    ranks would differ). aten's backward for it would unsqueeze every size-1 dim, the batch dim
    (B = 1) included, so name the dims."""
    if not isinstance(input, MJT):
        return NotImplemented
    if dim is not None:
        want = [dim] if isinstance(dim, int) else list(dim)
        units = [d for d in (canonical_dim("squeeze", input.dim(), w) for w in want) if d in input._ragged_dims]
        if units and ragged_flatten.unit_ragged(input, units):
            # ragged dims of size 1 in every sample squeeze as dense sizes of 1 do
            return torch.squeeze(ragged_flatten.as_static(input, units), dim)
        return NotImplemented
    dims = [d for d in range(1, input.dim()) if d not in input._ragged_dims and input.shape[d] == 1]
    units = [d for d in input._ragged_dims if ragged_flatten.unit_ragged(input, [d])]
    if units:
        return torch.squeeze(ragged_flatten.as_static(input, units), sorted(dims + units))
    return torch.squeeze(input, dims) if dims else input.view(input.shape)


@route(torch.channel_shuffle, torch.native_channel_shuffle)
def _channel_shuffle(input, groups):
    """Channels (static dim 1, as dense torch's ``(N, C, *)``) regrouped: ``unflatten`` into
    ``(groups, C / groups)``, ``transpose``, ``flatten`` back."""
    if not isinstance(input, MJT):
        return NotImplemented
    from ..vision.conv import channels_first  # (vision imports shape)

    input = channels_first("channel_shuffle", input)
    if input.dim() < 3 or 1 in input._ragged_dims:
        raise StructureError(f"channel_shuffle(): expected a static channel dim 1, as dense (N, C, *), got {describe(input)}")
    c = input.shape[1]
    if groups <= 0 or c % groups:
        raise RuntimeError(f"channel_shuffle(): Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    return input.unflatten(1, (groups, c // groups)).transpose(1, 2).flatten(1, 2)


@route(torch.view_copy)
def _view_copy(input, size, *, out=None):
    """``view_copy``: ``view`` (the sizes as ``view`` takes them), then a copy."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    return input.view(size).clone()
