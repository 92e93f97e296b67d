"""``index_add`` / ``index_copy`` / ``index_fill`` / ``index_reduce`` along ragged and static dims,
with one dense index for every sample or each sample's own (a multi_jagged ``(B, j)`` index:
message passing as PyG writes it, ``out.index_add(0, dst, msg)`` per graph), and ``bincount`` of
each sample.

NOTE [ Index updates with per-sample indices ]

Dense ``x.index_add(d, index, source)`` adds ``source``'s slices along ``d`` at the positions
``index`` names; per sample, ``x_i.index_add(d - 1, index_i, source_i)``, with ``source_i`` of
``x_i``'s shape but ``len(index_i)`` along ``d``. That is ``scatter_add`` with the index laid along
``d`` and expanded to the source's shape: ``index (B, j)`` → ``(B, 1, …, j, …, 1)`` →
``source``'s shape, which keeps stride 0 over the static dims (no copy; the scatter then computes
each row's target once, ``slicing._index_rows``) and copies only where the source is ragged
beside ``d``. So ``index_copy`` is ``scatter``, ``index_fill`` a ``scatter`` of its value into
``x``'s shape with ``len(index_i)`` along ``d``, and ``index_reduce`` ``scatter_reduce`` with
the same reduction and ``include_self`` — along a ragged dim (``scatter_ragged``) or a static one
(``scatter_static``), every gradient a dense scatter's. Dense torch's rules are checked first,
per sample, with its exception types: the index's dtype (``index_copy`` / ``index_fill`` take
int64 only), its range (``index_fill`` counts a negative index from the end once; the others
refuse it), the source's dtype and shape.

With one dense 1-d index for every sample, along a static dim the dense op runs on the packed
values (``index_add`` / ``index_copy`` / ``index_fill``: the op table's handlers in
``scatter.py``; ``index_reduce`` here, under dense autograd), and along a ragged dim on each
sample in turn (its positions are within the sample).

``bincount`` of a ``(B, j0)`` batch is each sample's own, a ``(B, j1)`` batch of counts: dense
``bincount`` takes one 1-d tensor, and applied to each sample gives ``max(v_i) + 1`` bins (at
least ``minlength``). One dense ``bincount`` of every value shifted to its sample's first bin
computes them all; the bins per sample come from the values, so sizing the result reads them on
the host.
"""

from __future__ import annotations

import torch

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import RaggedExtent, _is_traced, partition_for, same_extent
from .._common import MJT, canonical_dim, component_rows, describe, eager_route, static_dims
from .._routing import in_place_route, route
from .along import eager, first_bad, ragged_dim

__all__: list[str] = []

_REDUCE = ("prod", "mean", "amax", "amin")  # index_reduce's (scatter_reduce's also take sum)
# dense's exception types per op: (a dtype other than int64, a position out of range)
_ERRORS = {
    "index_add": {torch.int64: RuntimeError, torch.int32: IndexError},
    "index_copy": {torch.int64: IndexError},
    "index_fill": {torch.int64: IndexError},
    "index_reduce": {torch.int64: IndexError, torch.int32: IndexError},
}


def _index_update_route(name: str):
    """``index_add`` / ``index_copy`` / ``index_fill`` (``index_reduce``: its own route): a
    multi_jagged index, per sample (``_per_sample_index``); a dense one along a ragged dim, the
    dense op on each sample (``_index_update_per_sample``); along a static dim the op table's
    handler."""
    dense = getattr(torch, name)
    operand = "value" if name == "index_fill" else "source"  # as torch names it

    def routed(input, dim, index, *args, **kwargs):
        _refuse_dense_self(name, input, index)
        if not isinstance(input, MJT) or kwargs.get("out") is not None or not isinstance(dim, int):
            return NotImplemented
        if len(args) != 1 and operand not in kwargs:
            return NotImplemented  # dense's binding error
        source = args[0] if args else kwargs.pop(operand)
        if isinstance(index, MJT):
            return _per_sample_index(name, input, dim, index, source, kwargs)
        hit = ragged_dim(name, input, dim)
        if hit is None:
            return NotImplemented
        return _index_update_per_sample(name, dense, input, hit[0], index, source, kwargs)

    return routed


@route(torch.index_reduce, torch.Tensor.index_reduce)
def _index_reduce(input, dim, index, source, reduce, *, include_self=True, out=None):
    """``index_reduce`` (NOTE [ Index updates with per-sample indices ]): a multi_jagged index per
    sample; a dense one along a ragged dim on each sample, along a static dim on the values."""
    _refuse_dense_self("index_reduce", input, index)
    if not isinstance(input, MJT) or out is not None or not isinstance(dim, int):
        return NotImplemented
    if reduce not in _REDUCE:
        raise RuntimeError(f"index_reduce(): reduce argument must be either prod, mean, amax or amin, got {reduce}")
    kwargs = {"reduce": reduce, "include_self": include_self}
    if isinstance(index, MJT):
        return _per_sample_index("index_reduce", input, dim, index, source, kwargs)
    hit = ragged_dim("index_reduce", input, dim)
    if hit is not None:
        return _index_update_per_sample("index_reduce", torch.index_reduce, input, hit[0], index, source, kwargs)
    d = canonical_dim("index_reduce", input.dim(), dim)
    if d == 0:
        raise NotImplementedError(f"index_reduce(): along the batch dim of {describe(input)} for layout torch.multi_jagged")
    if not (isinstance(source, MJT) and source._ragged_dims == input._ragged_dims and source.dim() == input.dim()
            and source._partition.same_as(input._partition)):
        raise StructureError(f"index_reduce(): expected a source with the ragged dims of {describe(input)}, got {describe(source)}")
    vd = static_dims(input.dim(), input._ragged_dims).index(d) + 1
    return wrap_values(values_of(input).index_reduce(vd, index, values_of(source), reduce, include_self=include_self),
                       input._partition, input._ragged_dims)


def _refuse_dense_self(name: str, input, index) -> None:
    """A multi_jagged index into a dense ``self``: which sample's positions would name which
    rows of ``self`` is not the op's (its index is one 1-d list for the whole tensor)."""
    if isinstance(index, MJT) and isinstance(input, torch.Tensor) and not isinstance(input, MJT):
        raise NotImplementedError(
            f"{name}(): a multi_jagged index {describe(index)} into a dense self {tuple(input.shape)} for layout "
            "torch.multi_jagged; supported: a multi_jagged self with a dense 1-d index (the same for every sample "
            "along a static dim, each sample's own positions along a ragged dim) or a multi_jagged (B, j) index (each "
            "sample's own positions). Each sample's positions in a dense (B, …) tensor: scatter / scatter_add / "
            "scatter_reduce with the multi_jagged index"
        )


def _index_update_in_place(name: str):
    """``x.index_add_(…)`` and its kin: ``in_place_route``, refusing a dense ``x`` with a
    multi_jagged index as the out-of-place op does."""
    inner = in_place_route(name)

    def routed(input, *args, **kwargs):
        _refuse_dense_self(name, input, args[1] if len(args) > 1 else kwargs.get("index"))
        return inner(input, *args, **kwargs)

    return routed


@eager
def _index_update_per_sample(name: str, dense, x: MJT, d: int, index, source, kwargs):
    comps = x.unbind()
    if isinstance(source, MJT):
        sources = source.unbind()
    elif isinstance(source, torch.Tensor) and source.dim() == x.dim():
        sources = list(source.unbind(0)) if source.shape[0] == len(comps) else None
        if sources is None:
            raise RuntimeError(f"{name}(): a dense source of size {tuple(source.shape)} for {describe(x)}: expected "
                               f"{len(comps)} samples along dim 0")
    else:
        sources = [source] * len(comps)  # a fill value
    rag = [r - 1 for r in x._ragged_dims]
    rows = []
    for i, (c, src) in enumerate(zip(comps, sources)):
        try:
            rows.append(component_rows(dense(c, d - 1, index, src, **kwargs), rag))
        except (RuntimeError, IndexError) as err:
            raise type(err)(f"{name}(): sample {i} of {describe(x)}: {err}") from None
    if not rows:
        return x.clone()
    return wrap_values(torch.cat(rows), x._partition, x._ragged_dims)


def _per_sample_index(name: str, x: MJT, dim: int, index: MJT, source, kwargs):
    """NOTE [ Index updates with per-sample indices ]: ``index (B, j)``, sample i's 1-d index
    into ``x_i`` along ``dim``."""
    d = canonical_dim(name, x.dim(), dim)
    if d == 0:
        raise NotImplementedError(f"{name}(): along the batch dim of {describe(x)} for layout torch.multi_jagged")
    if index.dim() != 2 or index._partition.batch != x._partition.batch:
        raise NotImplementedError(
            f"{name}(): a multi_jagged index holds each sample's 1-d index, (B, j) with B = {x._partition.batch} for "
            f"{describe(x)}, got {describe(index)} for layout torch.multi_jagged")
    errors = _ERRORS[name]
    if index.dtype not in errors:
        kind = "Expected a long tensor for index, but got" if name == "index_copy" else "Expected dtype int64 for index, got"
        raise (IndexError if name == "index_fill" else RuntimeError)(f"{name}(): {kind} {index.dtype}")
    if name != "index_fill":
        _check_source(name, x, d, index, source)
    iv = _checked(name, x, d, index, errors[index.dtype])
    along = index if iv is index._values else wrap_values(iv, index._partition, (1,))
    # the index laid along d: (B, 1, …, j, …, 1)
    for _ in range(d - 1):
        along = along.unsqueeze(1)
    for _ in range(x.dim() - 1 - d):
        along = along.unsqueeze(-1)
    if name == "index_fill":  # x's shape with the index's extent along d
        if isinstance(source, torch.Tensor) and source.dim() != 0:
            raise IndexError(f"index_fill(): only supports a 0-dimensional value tensor, but got tensor with "
                             f"{source.dim()} dimension(s).")
        along = along.expand([-1 if e in (0, d) else x.shape[e] for e in range(x.dim())])
        if isinstance(source, torch.Tensor):  # a tensor value: its gradient is the sum over the filled places
            source = torch.zeros_like(along, dtype=x.dtype) + source.to(x.dtype)
        return torch.scatter(x, d, along, source) if isinstance(source, torch.Tensor) else torch.scatter(x, d, along, value=source)
    along = along.expand([-1 if e in (0, d) else source.shape[e] for e in range(x.dim())])
    if name == "index_add":
        alpha = kwargs.get("alpha", 1)
        return torch.scatter_add(x, d, along, source if alpha == 1 else source * alpha)
    if name == "index_copy":
        return torch.scatter(x, d, along, source)
    return torch.scatter_reduce(x, d, along, source, kwargs["reduce"], include_self=bool(kwargs["include_self"]))


def _checked(name: str, x: MJT, d: int, index: MJT, error) -> torch.Tensor:
    """The index's values, in range of each sample's size along ``d`` (``index_fill``: a negative
    one counted from the end once, as dense); else dense's ``error``, naming the sample (traced:
    an assert in the graph)."""
    iv = index._values
    sample = index._partition.row_sample()
    if d in x._ragged_dims:
        n = x._partition.extents[x._ragged_dims.index(d)].lengths().to(iv.device)[sample]
    else:
        n = torch.full_like(sample, x.shape[d])
    if name == "index_fill":
        iv = torch.where(iv < 0, iv + n, iv)
    bad = (iv < 0) | (iv >= n)
    if _is_traced(x._partition.offsets) or _is_traced(index._partition.offsets):
        torch._assert_async(~bad.any(), f"{name}(): index out of range in a sample")
        return iv
    row = first_bad(bad) if bool(bad.any()) else None  # SYNC: the check dense torch makes; free on the CPU
    if row is not None:
        raise error(f"{name}(): index {int(index._values[row])} is out of bounds for dimension {d} with size "
                    f"{int(n[row])} in sample {int(sample[row])} of {describe(x)}")
    return iv


def _check_source(name: str, x: MJT, d: int, index: MJT, source) -> None:
    """Dense's rules for the source: ``x``'s dtype, and ``x``'s shape but the index's extent
    along ``d``, sample by sample."""
    if not isinstance(source, MJT):
        raise StructureError(f"{name}(): with a multi_jagged index {describe(index)}, expected a multi_jagged source of "
                             f"{describe(x)}'s shape with the index's extent along dim {d}, got {describe(source)}")
    if source.dtype != x.dtype:
        raise RuntimeError(f"{name}(): self ({x.dtype}) and source ({source.dtype}) must have the same scalar type")
    want = tuple(sorted(set(x._ragged_dims) | {d}))
    fits = source.dim() == x.dim() and source._ragged_dims == want and same_extent(
        source._partition.extents[want.index(d)], index._partition.extents[0]) and all(
        same_extent(source._partition.extents[want.index(r)], e) for r, e in zip(x._ragged_dims, x._partition.extents)
        if r != d) and all(source.shape[e] == x.shape[e] for e in range(1, x.dim()) if e != d and e not in want)
    if not fits:
        raise StructureError(f"{name}(): expected a source of {describe(x)}'s shape with the index's extent "
                             f"{index.shape[1]} along dim {d}, got {describe(source)}")


for _name in ("index_add", "index_copy", "index_fill"):
    route(getattr(torch, _name), getattr(torch.Tensor, _name))(_index_update_route(_name))
for _name in ("index_fill_", "index_copy_", "index_add_", "index_reduce_"):
    route(getattr(torch.Tensor, _name))(_index_update_in_place(_name))


# --------------------------------------------------------------------------- bincount
_COUNTABLE = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@route(torch.bincount, torch.Tensor.bincount)
@eager_route("bincount(): each sample's number of bins comes from its values, read on the host: a graph break "
             "under torch.compile")
def _bincount(input, weights=None, minlength=0):
    """``bincount`` of each sample (NOTE [ Index updates with per-sample indices ]): ``(B, j0)`` →
    ``(B, j1)``, sample i's ``max(v_i) + 1`` bins, at least ``minlength``; ``weights`` a
    multi_jagged tensor of the input's shape (the result's dtype as dense's for a sample that
    holds values: dense gives an empty one int64 counts, a batch has one dtype)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 2 or input._ragged_dims != (1,):
        raise RuntimeError(
            f"bincount(): counts each sample's values, a multi_jagged (B, j) input (dense bincount only supports 1-d "
            f"non-negative integral inputs), got {describe(input)}; for one count over every element, "
            "torch.bincount(x.values().reshape(-1))")
    if input.dtype not in _COUNTABLE:
        raise NotImplementedError(f"bincount(): not implemented for {input.dtype} (layout torch.multi_jagged)")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and not (isinstance(weights, MJT) and weights._ragged_dims == (1,) and weights.dim() == 2
                                    and same_extent(weights._partition.extents[0], input._partition.extents[0])):
        raise RuntimeError(f"bincount(): weights should be a multi_jagged tensor of the input's shape {describe(input)}, "
                           f"got {describe(weights)}")
    p = input._partition
    v = input._values.to(torch.int64)
    sample = p.row_sample()
    if v.numel() and bool((v < 0).any()):  # SYNC: dense checks too; free on the CPU
        row = int((v < 0).nonzero()[0, 0])
        raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (sample {int(sample[row])} of "
                           f"{describe(input)})")
    top = torch.full((p.batch,), -1, dtype=torch.int64, device=v.device).scatter_reduce(0, sample, v, "amax")
    # SYNC: each sample's number of bins sizes the result (its values decide it, as dense's)
    bins = torch.clamp_min(top + 1, minlength).cpu()
    part = partition_for([RaggedExtent.from_lengths(bins, v.device)])
    counts = torch.bincount(part.offsets[sample] + v, None if weights is None else values_of(weights), minlength=part.rows)
    if weights is not None and v.numel() == 0:
        # dense gives int64 counts for an empty input whatever the weights: the batch takes the
        # dtype of its samples that hold values (one dtype for every batch of these dtypes)
        counts = counts.to(torch.bincount(v.new_zeros(1), weights._values.new_zeros(1)).dtype)
    return wrap_values(counts, part, (1,))
