"""``scatter`` / ``scatter_add`` / ``gather`` along static and ragged dims; ``scatter_`` (in place),
``scatter_reduce``, ``index_add`` / ``index_copy`` / ``index_fill`` along static dims.

NOTE [ Scatter and gather ]

What the backward of value-selecting reductions needs (aten's
``max(dim)`` backward is ``new_zeros(sizes).scatter(dim, indices, grad)``, its double backward a
``gather``), plus the one-hot that routes ``max(dim)`` over a ragged dim (``reductions/routes.py``, ``_selected``).
Along a static dim they act on the values; every tensor operand must then have self's ragged
dims and structure. Along a ragged dim the index must have size 1 there (one position per
sample and remaining coordinate) and carry self's other ragged dims (a dense ``(B, …)`` index
when that dim is self's only ragged one): it is compared with each row's coordinate. An index
outside a sample's extent selects nothing there (dense torch raises; an empty extent's
arg-extreme is 0, which must select nothing).

``torch.take`` with a multi_jagged index takes each sample's indices into its own elements (a
gather from the batch flattened into rows).
"""

from __future__ import annotations

import math

import torch

from ...bridge import ragged_as_static, values_of, wrap_values
from ...compile import segment as seg
from ...errors import StructureError
from ...structure import same_extent
from .._common import MJT, canonical_dim, describe, eager_route, static_dims, wrap
from .._routing import route
from .._table import op_name, register_multi_jagged_func

aten = torch.ops.aten


def _same_structure(func, x: MJT, t, what: str) -> None:
    if isinstance(t, MJT) and (t._ragged_dims != x._ragged_dims or not t._partition.same_as(x._partition)):
        raise StructureError(f"{op_name(func)}(): expected {what} with the structure of self {describe(x)}, got {describe(t)}")
    if isinstance(t, torch.Tensor) and not isinstance(t, MJT):
        raise NotImplementedError(f"{op_name(func)}(): a dense {what} along a static dim of layout torch.multi_jagged")


def _to_rows_along(func, x: MJT, d: int, t, what: str):
    """``t`` (index or src, size 1 along ragged dim ``d`` of x) as ``(x rows, *x static)``, and
    the map of x's rows to t's rows (``(index, sub)``)."""
    k = x._ragged_dims.index(d)
    keep = tuple(i for i in range(len(x._ragged_dims)) if i != k)
    rowidx, sub = x._partition.map_to_sub(keep)
    if isinstance(t, MJT):
        want = tuple(r for r in x._ragged_dims if r != d)
        if t._ragged_dims != want or not t._partition.same_as(sub) or t.shape[d] != 1:
            raise NotImplementedError(
                f"{op_name(func)}(): along ragged dim {d} of {describe(x)}, expected a {what} of size 1 there "
                f"with the other ragged dims of self, got {describe(t)} for layout torch.multi_jagged"
            )
        v = t._values.squeeze(static_dims(len(t._size), t._ragged_dims).index(d) + 1)
    else:
        if keep or t.dim() != len(x._size) or t.shape[0] != x._partition.batch or t.shape[d] != 1:
            raise NotImplementedError(
                f"{op_name(func)}(): along ragged dim {d} of {describe(x)}, expected a dense {what} (B, …) with "
                f"size 1 there, got {describe(t)} for layout torch.multi_jagged"
            )
        v = t.squeeze(d)
    if tuple(v.shape[1:]) != tuple(x._values.shape[1:]):
        raise NotImplementedError(f"{op_name(func)}(): expected a {what} matching the static sizes of self {describe(x)}, got {describe(t)}")
    return v.index_select(0, rowidx), rowidx, sub


def _hits(x: MJT, d: int, index_rows: torch.Tensor) -> torch.Tensor:
    _, coords = x._partition.row_coords()
    pos = coords[:, x._ragged_dims.index(d)].reshape(-1, *([1] * (index_rows.dim() - 1)))
    return index_rows == pos


@register_multi_jagged_func(
    [aten.scatter.src, aten.scatter.value, aten.scatter_add.default], "self: mjt, dim: any, index: any, src: any"
)
def scatter_src(func, x, dim, index, src):
    d = canonical_dim(op_name(func), len(x._size), dim)
    if d == 0:
        raise NotImplementedError(f"{op_name(func)}(): along the batch dim of layout torch.multi_jagged")
    if d not in x._ragged_dims:
        for t, what in ((index, "index"), (src, "src")):
            _same_structure(func, x, t, what)
        vd = static_dims(len(x._size), x._ragged_dims).index(d) + 1
        s = src._values if isinstance(src, MJT) else src
        return wrap(func(x._values, vd, index._values, s), x._partition, x._ragged_dims)
    idx, _, _ = _to_rows_along(func, x, d, index, "index")
    s = _to_rows_along(func, x, d, src, "src")[0] if isinstance(src, torch.Tensor) else src
    hit = _hits(x, d, idx)
    v = x._values
    if func is aten.scatter_add.default:
        out = v + torch.where(hit, s, torch.zeros_like(v))
    else:
        out = torch.where(hit, s, v) if isinstance(s, torch.Tensor) else v.masked_fill(hit, s)
    return wrap(out, x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.gather.default, "self: mjt, dim: any, index: any, sparse_grad: any?")
def gather_default(func, x, dim, index, sparse_grad=False):
    d = canonical_dim(op_name(func), len(x._size), dim)
    if d == 0:
        raise NotImplementedError(f"{op_name(func)}(): along the batch dim of layout torch.multi_jagged")
    if d not in x._ragged_dims:
        _same_structure(func, x, index, "index")
        vd = static_dims(len(x._size), x._ragged_dims).index(d) + 1
        return wrap(func(x._values, vd, index._values), x._partition, x._ragged_dims)
    idx, rowidx, sub = _to_rows_along(func, x, d, index, "index")
    v = x._values
    # the one hit of each index row, summed out of its segment (0 where nothing is hit)
    k = seg.segment_reduce(torch.where(_hits(x, d, idx), v, torch.zeros_like(v)), rowidx, sub.rows, "sum")
    if isinstance(index, MJT):
        vd = static_dims(len(index._size), index._ragged_dims).index(d) + 1
        return wrap(k.unsqueeze(vd), index._partition, index._ragged_dims)
    return k.unsqueeze(d)


def _static(func, x: MJT, dim, *ts) -> int:
    """The values dim of static dim ``dim`` (the tensor operands checked to have x's structure);
    a ragged or the batch dim raises, naming the op."""
    d = canonical_dim(op_name(func), len(x._size), dim)
    if d == 0 or d in x._ragged_dims:
        raise NotImplementedError(
            f"{op_name(func)}(): along {'the batch' if d == 0 else 'ragged'} dim {d} of {describe(x)} is not supported "
            "for layout torch.multi_jagged (along static dims it is)"
        )
    for t, what in ts:
        _same_structure(func, x, t, what)
    return static_dims(len(x._size), x._ragged_dims).index(d) + 1


def _packed(t):
    return t._values if isinstance(t, MJT) else t


@register_multi_jagged_func([aten.scatter_.src, aten.scatter_.value], "self: mjt, dim: any, index: mjt, src: any")
def scatter__src(func, x, dim, index, src):
    """In place along a static dim (``F.gumbel_softmax(hard=True)``'s one-hot)."""
    vd = _static(func, x, dim, (index, "index"), *([(src, "src")] if isinstance(src, torch.Tensor) else []))
    func(x._values, vd, index._values, _packed(src))
    return x


@register_multi_jagged_func(aten.scatter_reduce.two, "self: mjt, dim: any, index: mjt, src: mjt, reduce: any, ...")
def scatter_reduce_two(func, x, dim, index, src, reduce, *args, **kwargs):
    vd = _static(func, x, dim, (index, "index"), (src, "src"))
    return wrap(func(x._values, vd, index._values, src._values, reduce, *args, **kwargs), x._partition, x._ragged_dims)


@register_multi_jagged_func([aten.index_add.default, aten.index_copy.default], "self: mjt, dim: any, index: t, source: mjt, ...")
def index_add_default(func, x, dim, index, source, *args, **kwargs):
    """Along a static dim, with one dense index for every sample (the dims of ``source`` other than
    ``dim`` are self's)."""
    vd = _static(func, x, dim, (source, "source"))
    return wrap(func(x._values, vd, index, source._values, *args, **kwargs), x._partition, x._ragged_dims)


@register_multi_jagged_func([aten.index_fill.int_Scalar, aten.index_fill.int_Tensor], "self: mjt, dim: any, index: t, value: any")
def index_fill_int(func, x, dim, index, value):
    """Along a static dim (``index_copy``'s gradient)."""
    vd = _static(func, x, dim)
    return wrap(func(x._values, vd, index, value), x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.index_select.default, "self: mjt, dim: any, index: t")
def index_select_default(func, x, dim, index):
    """Along a static dim (``index_add``'s gradient; ``torch.index_select`` along a ragged dim is a
    route, ``indexing/slicing.py``)."""
    vd = _static(func, x, dim)
    return wrap(func(x._values, vd, index), x._partition, x._ragged_dims)


@register_multi_jagged_func(aten.index_add_.default, "self: mjt, dim: any, index: t, source: mjt, ...")
def index_add__default(func, x, dim, index, source, *args, **kwargs):
    """In place along a static dim (``index_select``'s gradient)."""
    vd = _static(func, x, dim, (source, "source"))
    func(x._values, vd, index, source._values, *args, **kwargs)
    return x


@route(torch.take, torch.Tensor.take)
@eager_route("{op}(): the per-sample bounds check reads the indices on the host")
def _take(input, index, *, out=None):
    """``torch.take`` per sample: a multi_jagged ``index`` (of any structure with the same batch)
    holds, for each sample, indices into that sample's elements in row-major order (negative ones
    from its end), as the dense op on each sample; the result has the index's structure. The
    elements are read from the batch flattened into rows (NOTE [ Flattening the batch dim ])."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    if not isinstance(index, MJT):
        raise NotImplementedError(
            f"take(): with a dense index on {describe(input)}: index each sample with a multi_jagged index (per-sample "
            "positions), or flatten the batch first (x.reshape(-1)) for positions into every element"
        )
    if index._partition.batch != input._partition.batch:
        raise StructureError(f"take(): index {describe(index)} and input {describe(input)} have different batch sizes")
    if index.dtype != torch.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype}")
    p = input._partition
    per_row = math.prod(input._values.shape[1:])
    counts = (p.offsets.diff() * per_row)  # elements per sample
    starts = p.offsets[:-1] * per_row
    iv = index._values
    sample = index._partition.row_sample().reshape(-1, *([1] * (iv.dim() - 1))).expand_as(iv)
    n = counts[sample]
    bad = (iv >= n) | (iv < -n)
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        s = int(sample.reshape(-1)[i])
        raise IndexError(f"take(): out of range: tried to access index {int(iv.reshape(-1)[i])} on sample {s} of "
                         f"{int(counts[s])} elements of {describe(input)}")
    flat = input.reshape(-1).as_subclass(torch.Tensor)
    picked = flat[torch.where(iv < 0, iv + n, iv) + starts[sample]]
    return wrap_values(picked, index._partition, index._ragged_dims)


def _shape_of_selection(src, pos) -> bool:
    """Whether ``src`` (the value broadcast against the selection) has the selection ``pos``'s shape."""
    if isinstance(pos, MJT) and isinstance(src, MJT):
        return (src._ragged_dims == pos._ragged_dims and src._partition.same_as(pos._partition)
                and src._values.shape[1:] == pos._values.shape[1:])
    return not isinstance(src, MJT) and not isinstance(pos, MJT) and src.shape == pos.shape


def _static_where_selected(src, pos):
    """``src`` with each ragged dim where the selection ``pos`` is static made static (every sample
    has that size there: the broadcast made ``pos``'s static dim ragged to meet ``value``'s, as
    elementwise ops do; the write needs the selection's own shape)."""
    if not isinstance(src, MJT) or len(src._size) != pos.dim():
        return src
    ragged_pos = pos._ragged_dims if isinstance(pos, MJT) else ()
    for d in sorted((d for d in src._ragged_dims if d not in ragged_pos), reverse=True):
        src = ragged_as_static(src, d, pos.shape[d])
        if not isinstance(src, MJT):
            break
    return src


def assign_index(x: MJT, index, value, getitem):
    """``x[index] = value`` for any index that ``x[index]`` reads (``getitem``, its route): along
    ragged dims per sample (``x[:, 1:] = v``, ``x[:, 0] = cls``, ``x[:, [0, 1]] = v``) as along
    static ones (``x[..., :2] = 0``). The selected elements are read off a tensor of element
    positions indexed as ``x`` would be, ``value`` is broadcast to that selection as dense
    ``__setitem__`` does, and ``x`` becomes ``where(selected, value at its position, x)`` through
    ``copy_``, so gradients reach ``x``'s unselected elements and ``value``. Python's own indexing
    would compare the slice bounds with nested ints ("relation is indeterminate"). Returns
    None, or NotImplemented for an index that ``getitem`` does not read."""
    v = x._values
    pos = getitem(wrap(torch.arange(v.numel(), device=v.device).view(v.shape), x._partition, x._ragged_dims), index)
    if pos is NotImplemented:
        return NotImplemented
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=x.dtype, device=x.device)
    elif value.dim() == 0 and not isinstance(value, MJT):
        value = value.to(x.device)
    value = value.to(x.dtype)
    try:
        src = torch.where(torch.ones_like(pos, dtype=torch.bool), value, value)  # value broadcast to the selection
        src = _static_where_selected(src, pos)
        fits = _shape_of_selection(src, pos)
    except (RuntimeError, StructureError):
        fits = False
    if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {describe(value)} cannot be broadcast to "
                           f"indexing result of shape {describe(pos)}")
    flat = (pos._values if isinstance(pos, MJT) else pos).reshape(-1)
    if flat.numel() == 0:
        return None
    src_flat = (values_of(src) if isinstance(src, MJT) else src).reshape(-1)
    # dense ``index_put`` on the packed values: where the selection names an element twice, the
    # last write stands and every written element of ``value`` gets its gradient, as dense
    # ``__setitem__``'s ``index_put`` gives them
    new = values_of(x).reshape(-1).index_put((flat,), src_flat)
    x.copy_(wrap_values(new.view(v.shape), x._partition, x._ragged_dims))
    return None


# NOTE [ Scattering a batch into a dense tensor ]
#
# ``torch.zeros(B, E).scatter_add(1, experts, ones)`` (each sample's count per expert, with
# ``experts`` a multi_jagged ``(B, j)``): a dense ``self`` whose dim 0 is the batch takes, per
# sample, dense torch's scatter of that sample's index and source,
# ``out[i] = self[i].scatter…(dim - 1, index[i], src[i])``. Every element of the index names one
# element of ``self``: its sample, its own coordinates (ragged ones from its packed row), the
# index value at ``dim``. So the whole batch is one dense scatter into ``self`` flattened, with
# dense torch's derivatives. As dense torch, the index may not be larger than ``self`` at any dim
# but ``dim`` (each sample's ragged extent at most ``self``'s size there) and its values must lie
# in ``[0, self.size(dim))``; ``src`` is a multi_jagged tensor of the index's structure, a dense
# ``(B, …)`` tensor at least as large as each sample's index, or a number.
def _element_coords(index: MJT):
    """The logical coordinates (dims 0 … n-1) of every element of ``index``'s values, each
    broadcastable to the values' shape ``(T, *static)``."""
    sample, coords = index._partition.row_coords()
    v = index._values
    lead = (v.shape[0],) + (1,) * (v.dim() - 1)
    out, k, s = [sample.view(lead)], 0, 1
    for e in range(1, index.dim()):
        if e in index._ragged_dims:
            out.append(coords[:, k].view(lead))
            k += 1
        else:
            shape = [1] * v.dim()
            shape[s] = v.shape[s]
            out.append(torch.arange(v.shape[s], device=v.device).view(shape))
            s += 1
    return out


def _linear(coords, strides):
    lin = coords[0] * strides[0]
    for c, st in zip(coords[1:], strides[1:]):
        lin = lin + c * st
    return lin


def same_shape(a: MJT, b) -> bool:
    """Whether ``a`` has ``b``'s shape sample by sample: its ragged dims, extents and static sizes."""
    return (isinstance(b, MJT) and a._ragged_dims == b._ragged_dims and a.dim() == b.dim()
            and all(a.shape[e] == b.shape[e] for e in static_dims(a.dim(), a._ragged_dims))
            and all(same_extent(u, v) for u, v in zip(a._partition.extents, b._partition.extents)))


def _fits(op: str, what: str, index: MJT, target: torch.Tensor, dim) -> None:
    """Dense scatter's size rule: ``index`` no larger than ``target`` at every dim but ``dim``."""
    if target.dim() != index.dim() or target.shape[0] != index._partition.batch:
        raise RuntimeError(f"{op}(): Index tensor must have the same number of dimensions as {what} tensor "
                           f"(index {describe(index)}, {what} {tuple(target.shape)})")
    for e in range(1, index.dim()):
        if e == dim:
            continue
        if e in index._ragged_dims:
            n = int(index._partition.extents[index._ragged_dims.index(e)].max)  # SYNC: none (host lengths)
        else:
            n = index.shape[e]
        if n > target.shape[e]:
            raise RuntimeError(f"{op}(): Expected index {describe(index)} to be no larger than {what} "
                               f"{tuple(target.shape)} apart from dimension {dim}")


def _dense_places(op: str, what: str, input: torch.Tensor, dim: int, index: MJT):
    """``(coords, base, lin)``: after dense torch's checks, the coordinates of every index element
    (``_element_coords``), ``input`` contiguous, and the flat place in it each index element names
    (the index's values' shape)."""
    d = canonical_dim(op, input.dim(), dim)
    if d == 0:
        raise StructureError(f"{op}(): cannot index the batch dim of {describe(index)} (layout torch.multi_jagged)")
    if index.dtype != torch.int64:
        raise RuntimeError(f"{op}(): Expected dtype int64 for index")
    _fits(op, what, index, input, d)
    iv = index._values
    if iv.numel() and bool(((iv < 0) | (iv >= input.shape[d])).any()):  # SYNC: dense torch checks too
        raise RuntimeError(f"{op}(): index out of bounds for dimension {d} with size {input.shape[d]}")
    coords = _element_coords(index)
    base = input.contiguous()
    return coords, base, _linear(coords[:d] + [iv] + coords[d + 1:], base.stride()).expand(iv.shape)


@eager_route("{op}() of a multi_jagged index into a dense tensor checks the index on the host: a graph break "
             "under torch.compile")
def scatter_into_dense(op: str, input: torch.Tensor, dim: int, index: MJT, src, reduce=None, include_self=True):
    """NOTE [ Scattering a batch into a dense tensor ]; ``reduce``: None (``scatter``), ``"add"``
    (``scatter_add``) or ``scatter_reduce``'s reduction."""
    coords, base, lin = _dense_places(op, "self", input, dim, index)
    lin = lin.reshape(-1)
    if isinstance(src, MJT):
        if not same_shape(src, index):
            raise StructureError(f"{op}(): expected src with the shape of index {describe(index)}, got {describe(src)}")
        s = values_of(src).reshape(-1)
    elif isinstance(src, torch.Tensor):
        _fits(op, "src", index, src, None)
        sc = src.contiguous()
        s = sc.reshape(-1)[_linear(coords, sc.stride()).expand(index._values.shape).reshape(-1)]
    else:
        s = torch.full(lin.shape, src, dtype=input.dtype, device=input.device)
    flat = base.reshape(-1)
    s = s.to(input.dtype)
    if reduce is None:
        out = flat.scatter(0, lin, s)
    elif reduce == "add":
        out = flat.scatter_add(0, lin, s)
    else:
        out = flat.scatter_reduce(0, lin, s, reduce, include_self=include_self)
    return out.view(input.shape)


@eager_route("{op}() of a dense tensor by a multi_jagged index checks the index on the host: a graph break under "
             "torch.compile")
def table_rows_by_index(table: torch.Tensor, batch_index: torch.Tensor, index: MJT) -> MJT:
    """``table[b, index]`` of a dense ``(B, K, …)`` table (features of K sampled points per
    sample, PointNet++'s ``index_points``): sample i is dense ``table[b_i][index_i]``, the index's
    dims then the table's after dim 1; ``b`` one entry per sample of the index, as
    ``rows_by_index`` takes it. Differentiable w.r.t. ``table``; dense indexing checks the bounds."""
    for what, t in (("batch index", batch_index), ("index", index)):
        if t.dtype not in (torch.int64, torch.int32):
            raise IndexError(f"index(): table[b, index] takes int64 or int32 index tensors for layout torch.multi_jagged, got {t.dtype} "
                             f"({what})")
    q = index._partition
    if batch_index.dim() <= index.dim() and batch_index.numel() == 1:
        batch_index = batch_index.reshape(1).expand(q.batch)
    if batch_index.dim() == 0 or batch_index.dim() > index.dim() or batch_index.shape[0] != q.batch or any(
            n != 1 for n in batch_index.shape[1:]):
        raise IndexError(f"index(): shape mismatch: the batch index {tuple(batch_index.shape)} does not give one sample "
                         f"per sample of the index {describe(index)}")
    iv = index._values
    b = batch_index.reshape(-1).index_select(0, q.row_sample()).view(-1, *([1] * (iv.dim() - 1))).expand(iv.shape)
    return wrap_values(table[b, iv], q, index._ragged_dims)


def gather_from_dense(op: str, input: torch.Tensor, dim: int, index: MJT) -> MJT:
    """``dense.gather(dim, index)`` with a multi_jagged index: per sample dense torch's gather,
    ``out[i] = input[i].gather(dim - 1, index[i])``, a multi_jagged tensor of the index's structure
    (RoBERTa's ``token_type_ids.expand(B, -1).gather(1, position_ids)``); the reverse of NOTE
    [ Scattering a batch into a dense tensor ], with its rules for sizes and index values."""
    _, base, lin = _dense_places(op, "input", input, dim, index)
    return wrap_values(base.reshape(-1)[lin], index._partition, index._ragged_dims)
