"""Structure ops: unsqueeze / squeeze / expand / permute / transpose, component access."""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ...errors import StructureError, op_label
from ...kernels import reference as ref
from .. import bridged
from .._table import register_multi_jagged_func
from ...structure import extent_of, partition_for
from .._common import MJT, canonical_dim, canonical_dims, describe, same_partition, static_dims, wrap
from ...writes import WRITE_CLOCK, _storage_ptr, written_args, written_since

aten = torch.ops.aten


def unsqueeze_plan(inp, dim) -> tuple[int, tuple[int, ...]]:
    """``(values dim, ragged dims)`` of ``inp.unsqueeze(dim)``: the values gain a dim where the
    new logical dim falls among the static ones."""
    d = canonical_dim("unsqueeze", len(inp._size) + 1, dim)
    if d == 0:
        raise StructureError(f"unsqueeze(): cannot insert a dim before the batch dim of {describe(inp)}")
    ragged = tuple(r + 1 if r >= d else r for r in inp._ragged_dims)
    vd = sum(1 for s in static_dims(len(inp._size), inp._ragged_dims) if s < d) + 1
    return vd, ragged


@register_multi_jagged_func(aten.unsqueeze.default, "self: mjt, dim: any")
def unsqueeze_default(func, inp, dim):
    vd, ragged = unsqueeze_plan(inp, dim)
    return wrap(inp._values.unsqueeze(vd), inp._partition, ragged)


def _squeeze(inp, dims):
    ndim = len(inp._size)
    stat = static_dims(ndim, inp._ragged_dims)
    drop = []
    for d in canonical_dims("squeeze", ndim, dims):
        if d == 0:
            raise StructureError(f"squeeze(): cannot squeeze the batch dim of {describe(inp)}")
        if d in inp._ragged_dims:
            raise StructureError(f"squeeze(): cannot squeeze ragged dim {d} of {describe(inp)}")
        if inp._size[d] == 1:
            drop.append(d)
    if not drop:
        return wrap(inp._values, inp._partition, inp._ragged_dims)
    values = inp._values.squeeze(tuple(stat.index(d) + 1 for d in drop))
    ragged = tuple(r - sum(1 for d in drop if d < r) for r in inp._ragged_dims)
    return wrap(values, inp._partition, ragged)


@register_multi_jagged_func(aten.squeeze.dim, "self: mjt, dim: any")
def squeeze_dim(func, inp, dim):
    return _squeeze(inp, [dim])


@register_multi_jagged_func(aten.squeeze.dims, "self: mjt, dim: any")
def squeeze_dims(func, inp, dims):
    return _squeeze(inp, list(dims))


@register_multi_jagged_func(aten.squeeze.default, "self: mjt")
def squeeze_default(func, inp):
    return _squeeze(inp, list(static_dims(len(inp._size), inp._ragged_dims)))


@register_multi_jagged_func(aten.expand.default, "self: mjt, size: any, implicit: any?")
def expand_default(func, inp, size, implicit=False):
    """Expand static size-1 dims, including to a ragged extent the tensor already carries
    (``(B, j0, 1, C).expand(B, j0, j0, C)`` gathers rows into the square pair)."""
    ndim = len(inp._size)
    if len(size) != ndim:
        raise StructureError(f"expand(): expected {ndim} sizes for {describe(inp)}, got {len(size)}")
    if size[0] not in (-1, inp._partition.batch):
        raise StructureError(f"expand(): cannot expand the batch dim of {describe(inp)} to {size[0]}")
    known = {id(e): e for e in inp._partition.extents}
    out_dims, extents, static_size = [], [], []
    for d in range(1, ndim):
        s = size[d]
        if d in inp._ragged_dims:
            e = inp._partition.extents[inp._ragged_dims.index(d)]
            if not (s == -1 or (is_nested_int(s) and s == e.nested_int)):
                raise StructureError(f"expand(): ragged dim {d} of {describe(inp)} cannot be expanded to {s}")
            out_dims.append(d)
            extents.append(e)
        elif is_nested_int(s):
            e = next((e for e in known.values() if e.nested_int == s), None)
            if e is None:
                # a ragged size of another tensor of this batch (``x.mean(2, keepdim=True).expand_as(x)``
                # of images: each sample's row broadcast over its own height)
                e = extent_of(s)
                if e is not None and e.batch != inp._partition.batch:
                    e = None
            if e is None or inp.shape[d] != 1:
                raise StructureError(
                    f"expand(): cannot expand dim {d} of {describe(inp)} to ragged size {s}: only a size-1 "
                    "dim can become ragged, to a ragged size of a batch of as many samples"
                )
            out_dims.append(d)
            extents.append(e)
        else:
            static_size.append(s)
    out_dims = tuple(out_dims)
    values = inp._values
    partition = inp._partition
    if out_dims != inp._ragged_dims:
        partition = partition_for(extents)
        keep = tuple(out_dims.index(d) for d in inp._ragged_dims)
        partition.note_sub(keep, inp._partition)
        index, _ = partition.map_to_sub(keep)
        values = values.index_select(0, index)
        in_static = static_dims(ndim, inp._ragged_dims)
        keep_v = [i + 1 for i, d in enumerate(in_static) if d not in out_dims]
        values = values.reshape(values.shape[0], *[values.shape[i] for i in keep_v])
    values = values.expand(values.shape[0], *static_size)
    if torch._C._current_autograd_node() is not None and not ref._is_traced(values):
        # In backward (``sum``'s and ``mean``'s formulas expand the gradient): an expanded gradient
        # would reach a view's backward, whose C++ ``reshape`` computes strides by multiplying the
        # sizes — nested ints, which cannot multiply each other — and fail. A gradient is a new
        # tensor: materialising it changes no aliasing.
        values = values.contiguous()
    return wrap(values, partition, out_dims)


@functools.lru_cache(maxsize=None)
def _permute_plan(ndim: int, ragged_dims: tuple[int, ...], perm: tuple[int, ...]):
    """``(new ragged dims, ragged order, values permutation)`` of a batch-first ``perm``, per layout:
    ``ragged_order[k]`` is which of the input's ragged dims becomes the output's k-th."""
    new_ragged = tuple(i for i, p in enumerate(perm) if p in ragged_dims)
    ragged_order = tuple(ragged_dims.index(perm[i]) for i in new_ragged)
    stat = static_dims(ndim, ragged_dims)
    vperm = (0, *(stat.index(p) + 1 for p in perm if p not in ragged_dims and p != 0))
    return new_ragged, ragged_order, vperm


def _permute(inp, perm):
    ndim = len(inp._size)
    perm = [canonical_dim("permute", ndim, p) for p in perm]
    if sorted(perm) != list(range(ndim)):
        raise StructureError(f"permute(): expected a permutation of {ndim} dims, got {perm}")
    if perm[0] != 0:
        raise StructureError(f"permute(): the batch dim of {describe(inp)} must stay first")
    new_ragged, ragged_order, vperm = _permute_plan(ndim, inp._ragged_dims, tuple(perm))
    values, partition = inp._values.permute(vperm), inp._partition
    if ragged_order != tuple(sorted(ragged_order)):
        # The ragged dims change storage order: a per-sample transpose of the packed rows, which
        # no strides can express — a copy (NOTE [ Reordered ragged dims are copies ]).
        index, partition = partition.reorder_rows(ragged_order)
        values = values.index_select(0, index)
        _mark_reorder_copy(values, base=inp)
    return wrap(values, partition, new_ragged)


# NOTE [ Reordered ragged dims are copies ]
#
# ``transpose`` / ``permute`` that reorders ragged dims gathers the packed rows (a per-sample
# transpose of a rectangular block is not a strided view), so the result does not share memory
# with its input, unlike a dense transpose. Reads are the same; a *write* would silently not
# reach the original. So such a copy (and every view of it, which shares its storage) reports
# ``is_contiguous() == False`` and refuses in-place ops (``guard_write``, checked once per
# dispatch for every aten op that writes a tensor argument); ``.contiguous()`` / ``.clone()``
# give an ordinary, writable tensor, as ``.contiguous()`` does for a dense transpose.
# Copies are recognised by their storage: a registry of storage pointer → weak reference to
# the gathered values (a pointer only counts while that tensor lives, so reuse cannot confuse
# it). Empty values have no storage to write and are not registered. Other copies made where a
# dense sample's op is a view register the same way: a merge of the last ragged dim with static
# dims stored apart from it (``(B, S, j0, C).flatten(-2)``, ``flatten.py``), a split of ragged
# dims into parts, and the batch dim flattened where the elements are not stored in the samples'
# order (``(B, S, j0, C).reshape(-1)``, a dense ``FlatBatch`` whose in-place methods never reach
# ``__torch_dispatch__``: ``guard_dense_write`` checks them at the function level).
#
# NOTE [ Slices of ragged dims write through ]
#
# A slice, ``select`` or ``narrow`` along a ragged dim (``x[:, 1:]``, ``x[:, -1]`` of a pair,
# ``x.narrow(1, 0, 2)``), and a strided slice of the batch dim (``x[::2]``), gather rows too,
# where dense torch gives a view. Those copies are
# registered with the index that made them (``mark_view_copy``), and an in-place op on one (or
# on a view of it: ``x[:, 1:].mul_(0)``, ``x[:, 1:][..., 0].zero_()``, ``t = x[:, 1:]; t += 1``)
# writes through: ``__torch_function__`` runs the op on the copy (``write_through``) and then
# assigns the copy back, ``base[index] = copy`` — the differentiable index assignment
# (``ops/indexing/scatter.py``), so gradients and version counters follow as for a dense view.
# ``x[:, 1:] *= 2`` assigns twice (the write-through, then Python's own ``__setitem__``), with
# the same values. Writes the function level does not see (an ``out=`` argument, an aten call)
# still refuse (``guard_write``). Windows (``unfold``) overlap, so they refuse as reordered
# copies do. A dense result (``x[:, 0]`` of ``(B, j0, C)``) is a plain tensor: a copy, written
# to freely, as ``torch.jagged``'s. The slice holds its base (a dense view holds its base's
# storage), so a slice of a view no one else holds (``y.view(…)[:, 1:]``) still writes back. A
# slice taken before its base was written does not show that write: reading it then raises
# (``_check_slices_fresh``, while any copy lives), as writing it back does.
_REORDER_COPIES: dict[int, tuple] = {}  # storage pointer → (weakref to values, origin, write-back or None)
_WRITING: set[int] = set()  # copies an in-place op is writing through now (``write_through``)

_REORDERED = "a transpose / permute that reorders ragged dims"


def _mark_copy(values: torch.Tensor, origin: str, writeback=None, base=None) -> None:
    """Register ``values`` (a copy made where dense torch gives a view of ``base``): with
    ``writeback`` (``(copy, base, index, [base's versions])``) it writes through, else writes into it
    refuse; reading it after ``base`` was written raises (``_check_slices_fresh``)."""
    ptr = _storage_ptr(values)
    if ptr:
        seen = writeback if writeback is not None else ((None, base, None, _state(base)) if base is not None else None)
        _REORDER_COPIES[ptr] = (weakref.ref(values, lambda _, ptr=ptr: _REORDER_COPIES.pop(ptr, None)), origin,
                                writeback, seen)


def _mark_reorder_copy(values: torch.Tensor, origin: str = _REORDERED, base=None) -> None:
    _mark_copy(values, origin, base=base)


def mark_copy_of(y: MJT, origin: str, base: MJT) -> MJT:
    """``y`` (a batch copied from ``base`` where dense torch gives a view) registered as such a copy:
    writes into it refuse (for the route modules, which do not read packed values)."""
    if y._values.numel():
        _mark_copy(y._values, origin, base=base)
    return y


def _state(base: MJT) -> list:
    """What a copy remembers of its base: its versions and the write clock (``_written``)."""
    return [_versions(base), WRITE_CLOCK[0]]


def _written(base: MJT, state: list) -> bool:
    """Whether ``base`` was written since ``state``: its versions, or a dispatched write into its
    storage (through a tensor sharing it that autograd does not connect, a stand-in the values
    path gave a handler)."""
    if _versions(base) != state[0]:
        return True
    v = base.__dict__.get("_values")
    return v is not None and written_since(v, state[1])


def _versions(x: MJT) -> tuple[int, int]:
    """The wrapper's and its values' version counters (a write through either path bumps one)."""
    with torch._C.DisableTorchFunctionSubclass():
        if x.is_inference() or x._values.is_inference():
            return -1, -1  # inference tensors count no versions: their writes cannot be told
        return x._version, x._values._version


def mark_view_copy(out, base: MJT, index: tuple, origin: str = "a slice of a ragged dim"):
    """``out``, the rows of ``base[index]`` gathered where dense indexing gives a view, made to
    write through (NOTE [ Slices of ragged dims write through ]); ``out`` unchanged otherwise."""
    if isinstance(out, MJT) and type(out._values) is torch.Tensor:
        # the base is held, as a dense view holds its base's storage: a base that is itself a view
        # (``y.view(…)[:, 1:]``, ``y[..., 0][:, 1:]``) is written back even when no one else holds it
        _mark_copy(out._values, origin, (weakref.ref(out), base, index, _state(base)))
    return out


def _registered(x) -> tuple[int, Optional[tuple]]:
    """``(storage pointer, registry entry or None)`` of ``x`` (``(0, None)`` for what is not a
    multi_jagged tensor with packed values: per-image pieces not packed yet are not copies)."""
    if not isinstance(x, MJT):
        return 0, None
    ptr = x.__dict__.get("_storage_ptr")
    if ptr is None:  # a wrapper keeps its values' storage: looked up once
        v = x.__dict__.get("_values")
        if v is None:
            return 0, None
        ptr = x.__dict__["_storage_ptr"] = _storage_ptr(v)
    return ptr, (_REORDER_COPIES.get(ptr) if ptr else None)


# reading these does not read the elements: a stale slice answers them as its base would
_METADATA_READS = frozenset({"__get__", "size", "dim", "ndimension", "numel", "stride", "is_contiguous", "__len__",
                             "storage_offset", "element_size", "is_floating_point", "is_complex", "__hash__",
                             "detach", "requires_grad_", "retain_grad", "register_hook", "__reduce_ex__", "__setstate__"})


def _check_slices_fresh(func, args) -> None:
    """Raise when ``func`` reads a copy made where dense torch gives a view (a slice along a ragged
    dim, a reordering of ragged dims…), or a view of one, after the tensor it was taken from was
    written: it does not show that write where dense torch's view would (NOTE [ Slices of ragged
    dims write through ])."""
    for a in args:
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            _, hit = _registered(x)
            seen = hit[3] if hit is not None and hit[0]() is not None else None
            if seen is not None and _written(seen[1], seen[3]):
                if getattr(func, "__name__", "") in _METADATA_READS:
                    return
                name = op_label(func)
                raise NotImplementedError(
                    f"{name}(): this tensor comes from {hit[1]} of {describe(seen[1])} taken before that tensor was "
                    "written in place: it is a copy for layout torch.multi_jagged, so it does not show the write "
                    "(dense torch's view would); take the slice again after the write"
                )


def _live_copy(x: MJT) -> Optional[tuple]:
    """The registry entry of the copy ``x``'s values are (a view of), while it lives, else None."""
    if not _REORDER_COPIES:
        return None
    hit = _registered(x)[1]
    return hit if hit is not None and hit[0]() is not None else None


def is_copy(x: MJT) -> bool:
    """Whether ``x``'s values are (a view of) a copy made where dense torch gives a view: a slice
    along a ragged dim (written back through multi_jagged ops) or a copy that refuses writes."""
    return _live_copy(x) is not None


def is_reorder_copy(x: MJT) -> bool:
    """Whether ``x``'s values are (a view of) a copy that refuses writes (a reordering of ragged
    dims, windows; not a slice, which writes through)."""
    hit = _live_copy(x)
    return hit is not None and hit[2] is None


# in-place methods that change metadata or storage, not the elements: never written through
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "detach_", "retain_grad", "set_", "resize_",
                         "resize_as_", "record_stream", "pin_memory"})
_IN_PLACE: dict = {}  # function → whether it writes its first argument (by name, cached)


def _writes_self(func) -> bool:
    hit = _IN_PLACE.get(func)
    if hit is None:
        name = getattr(func, "__name__", "") or ""
        hit = _IN_PLACE[func] = name not in _NOT_WRITES and (
            (name.endswith("_") and not name.startswith("_")) or name == "__setitem__"
            or (name.startswith("__i") and name.endswith("__") and name not in ("__init__", "__index__", "__int__",
                                                                                 "__invert__", "__iter__"))
        )
    return hit


def writeback_target(func, args, kwargs):
    """``(pointer, (copy, base, index))`` when ``func`` writes in place into a slice copy that
    writes through (NOTE [ Slices of ragged dims write through ]), else None. Called only while
    some copy lives."""
    if not args:
        return None
    if not (_writes_self(func) or (kwargs and kwargs.get("inplace") is True)):
        _check_slices_fresh(func, args)
        return None
    ptr, hit = _registered(args[0])
    if hit is None or hit[2] is None or hit[0]() is None:
        return None
    return ptr, hit[2]


def write_through(target, run):
    """Run the in-place op (``run()``) on the copy, then assign the copy back to its base. A base
    written since the copy was taken (or last written back) would be overwritten with stale
    elements where dense torch's view would have seen the write: that raises instead."""
    ptr, (copy_ref, base, index, seen) = target
    if copy_ref() is None:
        # only a view of the copy's values lives (``y[:, :1].unflatten(…)[..., 0].mul_(…)``): the
        # copy that would be assigned back is gone
        raise NotImplementedError(
            f"cannot write in place through a view of a slice of {describe(base)} along a ragged dim once the "
            "slice itself is gone: the slice is a copy for layout torch.multi_jagged and is written back as a "
            "whole, so keep it in a variable while writing through its views (s = x[:, 1:]; s[..., 0].mul_(2))"
        )
    if _written(base, seen):
        raise NotImplementedError(
            f"cannot write in place to a slice of {describe(base)} along a ragged dim taken before that tensor was "
            "written: the slice is a copy for layout torch.multi_jagged, so it does not show the later write, and "
            "writing it back would undo it; take the slice again after the write"
        )
    _WRITING.add(ptr)
    try:
        result = run()
    finally:
        _WRITING.discard(ptr)
    copy = copy_ref()
    if copy is not None:
        base[index] = copy
        seen[:] = _state(base)
    return result


def guard_write(func, args, kwargs) -> None:
    """Raise when an aten op would write into a copy made where dense torch gives a view (NOTE
    [ Reordered ragged dims are copies ]), outside a write-through; called for every dispatched
    op, so the common case is two dict lookups."""
    if not _REORDER_COPIES:
        return
    pos, names = written_args(func)
    if not pos and not names:
        return
    targets = [args[i] for i in pos if i < len(args)] + [kwargs[n] for n in names if n in kwargs]
    for t in targets:
        for x in (t if isinstance(t, (list, tuple)) else (t,)):
            ptr, hit = _registered(x)
            if hit is None or hit[0]() is None or ptr in _WRITING:
                continue
            name = func.__name__.split(".")[0]
            how = ("write through indexing (x[:, 1:] = v, x[:, 1:] += v) or an in-place method of the slice"
                   if hit[2] is not None else "write to the original")
            raise NotImplementedError(
                f"{name}(): cannot write in place to {describe(x)}: it comes from {hit[1]}, which is a copy for layout "
                f"torch.multi_jagged (not a view of the original), so the write would not reach the original; {how}, "
                "or call .contiguous() to write to the copy deliberately"
            )


def guard_dense_write(func, args, kwargs) -> None:
    """Raise when ``func``, called on a dense tensor (a ``FlatBatch``, which never reaches
    ``__torch_dispatch__``), writes in place into a registered copy (NOTE [ Reordered ragged dims
    are copies ]): the batch dim flattened where the elements are not stored in the samples'
    order, which dense torch's ``reshape`` of a contiguous batch gives as a view."""
    if not _REORDER_COPIES or not args:
        return
    out = kwargs.get("out") if kwargs else None
    targets = [out] if isinstance(out, torch.Tensor) else []
    if _writes_self(func) or (kwargs and kwargs.get("inplace") is True):
        targets.append(args[0])
    for t in targets:
        hit = _REORDER_COPIES.get(_storage_ptr(t)) if isinstance(t, torch.Tensor) else None
        if hit is not None and hit[0]() is not None:
            name = op_label(func)
            raise NotImplementedError(
                f"{name}(): cannot write in place to this tensor: it comes from {hit[1]}, which is a copy for layout "
                "torch.multi_jagged (not a view of the original), so the write would not reach the original; "
                "write to the original, or call .clone() to write to the copy deliberately"
            )


# NOTE [ Contiguity as torch.jagged reports it ]
#
# ``torch.jagged`` stores a ``(B, S, j0, C)`` tensor as values ``(S, ΣN, C)``: the packed dim sits
# where the ragged dim is, and ``is_contiguous()`` is that buffer's contiguity, so
# ``(B, j0, C).transpose(1, 2)`` is not contiguous and its ``.contiguous()`` is a copy with values
# ``(C, ΣN)``. Our values keep the packed rows first, ``(ΣN, S, C)``, with any strides; read in
# torch.jagged's order (the packed dim moved to the first ragged dim's place among the static
# dims, ``njt_order_values``) they are the same buffer. So ``is_contiguous()`` asks that view,
# ``stride()`` reports its strides (the batch stride ``row·j0``, as torch.jagged, for one ragged
# dim), and ``clone(memory_format=torch.contiguous_format)`` / ``.contiguous()`` lay the values
# out contiguously in that order — on a (B, j0, …) tensor, exactly the row-major packed values.
def njt_order_values(x: MJT) -> torch.Tensor:
    """``x``'s values with the packed dim at the first ragged dim's place among the static dims
    (NOTE [ Contiguity as torch.jagged reports it ]): a view."""
    lead = x._ragged_dims[0] - 1  # static dims before the first ragged dim
    return x._values if lead == 0 else x._values.movedim(0, lead)


def contiguous_values(x: MJT) -> torch.Tensor:
    """A contiguous copy of ``x``'s values in torch.jagged's order, as packed-rows-first values."""
    lead = x._ragged_dims[0] - 1
    v = x._values
    return v.clone(memory_format=torch.contiguous_format) if lead == 0 else (
        v.movedim(0, lead).clone(memory_format=torch.contiguous_format).movedim(lead, 0)
    )


@register_multi_jagged_func(aten.permute.default, "self: mjt, dims: any")
def permute_default(func, inp, dims):
    return _permute(inp, dims)


@register_multi_jagged_func(aten.transpose.int, "self: mjt, dim0: any, dim1: any")
def transpose_int(func, inp, dim0, dim1):
    ndim = len(inp._size)
    perm = list(range(ndim))
    a, b = canonical_dim("transpose", ndim, dim0), canonical_dim("transpose", ndim, dim1)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(inp, perm)


@register_multi_jagged_func(aten.unbind.int, "self: mjt, dim: any?")
def unbind_int(func, inp, dim=0):
    if canonical_dim("unbind", len(inp._size), dim) != 0:
        # a static dim: views of the values (aten's backward stacks the pieces again)
        d, vd = _static_vdim("unbind", inp, dim)
        ragged = tuple(r - 1 if r > d else r for r in inp._ragged_dims)
        return tuple(wrap(v, inp._partition, ragged) for v in inp._values.unbind(vd))
    return tuple(ref.unpack_components(inp._values, inp._partition.host_sizes(), inp._ragged_dims))


def _static_vdim(op: str, inp, dim) -> tuple[int, int]:
    d = canonical_dim(op, len(inp._size), dim)
    if d == 0 or d in inp._ragged_dims:
        raise StructureError(f"{op}(): expected a static dim of {describe(inp)}, got dim {dim} (batch or ragged)")
    return d, static_dims(len(inp._size), inp._ragged_dims).index(d) + 1


@register_multi_jagged_func([aten.slice_scatter.default, aten.select_scatter.default], "self: mjt, src: any, dim: any, ...")
def slice_scatter_default(func, inp, src, dim=0, *args, **kwargs):
    """``slice_scatter`` / ``select_scatter`` along a static dim (what a functionalised write
    through ``x[..., :2]`` becomes): on the values, ``src`` of ``inp``'s structure (or a dense
    tensor of the slice's static shape, the same for every row)."""
    op = "slice_scatter" if func is aten.slice_scatter.default else "select_scatter"
    _, vd = _static_vdim(op, inp, dim)
    return bridged.scatter_into_static(op, inp, src, vd, args, kwargs)  # (below autograd: nothing records)


@register_multi_jagged_func(aten.glu.default, "self: mjt, dim: any?")
def glu_default(func, inp, dim=-1):
    """``F.glu`` halves a static dim; each element's pair lies in its own row."""
    _, vd = _static_vdim("glu", inp, dim)
    return wrap(func(inp._values, vd), inp._partition, inp._ragged_dims)


@register_multi_jagged_func(aten.glu_backward.default, "grad_output: mjt, self: mjt, dim: any")
def glu_backward_default(func, grad, inp, dim):
    _, vd = _static_vdim("glu_backward", inp, dim)
    return wrap(func(grad._values, inp._values, vd), inp._partition, inp._ragged_dims)


@register_multi_jagged_func(aten.select.int, "self: mjt, dim: any, index: any")
def select_int(func, inp, dim, index):
    if canonical_dim("select", len(inp._size), dim) != 0:
        d, vd = _static_vdim("select", inp, dim)
        ragged = tuple(r - 1 if r > d else r for r in inp._ragged_dims)
        return wrap(inp._values.select(vd, index), inp._partition, ragged)
    b = inp._partition.batch
    if not -b <= index < b:
        raise IndexError(f"select(): index {index} is out of range for batch size {b}")
    return unbind_int(aten.unbind.int, inp)[index]


def _segments(shape, ragged_dims):
    """Static sizes of ``shape`` (without the batch dim) grouped between ragged dims."""
    segs, cur = [], []
    for d in range(1, len(shape)):
        if d in ragged_dims:
            segs.append(cur)
            cur = []
        else:
            cur.append(shape[d])
    segs.append(cur)
    return segs


def _prod(xs):
    out = 1
    for v in xs:
        out = out * v
    return out


def _resolve_segment(old: list, new: list, dims: list) -> tuple[list, str | None]:
    """``new`` static sizes (at logical ``dims``) regrouping ``old``, with a ``-1`` inferred as
    dense ``view`` does; ``(sizes, None)`` or ``(None, what is wrong)``."""
    holes = [k for k, s in enumerate(new) if s == -1]
    bad = next((k for k, s in enumerate(new) if s != -1 and s < 0), None)
    if bad is not None:
        return None, f"invalid size {new[bad]} at dim {dims[bad]}"
    if len(holes) > 1:
        return None, f"only one dimension can be inferred, got -1 at dims {[dims[k] for k in holes]}"
    total = _prod(old)
    if holes:
        k = holes[0]
        known = _prod([s for s in new if s != -1])
        if known == 0 or total % known:
            return None, (
                f"size -1 at dim {dims[k]} cannot be inferred: the static dims there hold {total} elements "
                f"{tuple(old)}, which the other sizes {tuple(s for s in new if s != -1)} do not divide"
            )
        new = list(new)
        new[k] = total // known
    if _prod(new) != total:
        return None, (
            f"static dims may only regroup between ragged dims: sizes {tuple(new)} at dims "
            f"{tuple(dims)} must hold the {total} elements of {tuple(old)}"
        )
    return new, None


def _ragged_positions(inp, size) -> list[tuple[int, ...]]:
    """Every way to place ``inp``'s ragged dims, in order, at dims of ``size`` that hold their
    nested int or ``-1``, taking every nested int of ``size``."""
    import itertools

    nested = [inp._size[d] for d in inp._ragged_dims]
    is_nested = [is_nested_int(s) for s in size]
    fixed = {d for d in range(1, len(size)) if is_nested[d]}
    out = []
    for pos in itertools.combinations(range(1, len(size)), len(nested)):
        if fixed <= set(pos) and all(
            _same_size(size[p], n) if is_nested[p] else size[p] == -1 for p, n in zip(pos, nested)
        ):
            out.append(pos)
    return out


def _same_size(a, b) -> bool:
    """``a == b`` for sizes that may be nested ints, asking the nested-int node (a Python
    callback, several µs) only when ``a`` is not the very object ``b``: a shape built from
    ``x.shape`` holds x's own nested ints."""
    return a is b or a == b


def check_view_shape(op: str, inp, size) -> tuple[list, tuple[int, ...]]:
    """``(static sizes, ragged dims)`` of ``inp`` viewed as ``size``, or a StructureError naming
    ``op`` (the op the user called: ``view``, ``reshape``, ``flatten``, ``unflatten``) and the
    size that was the problem. The batch and ragged dims stay (as the same nested ints) and static
    dims may regroup only within the runs between ragged dims. As with ``torch.jagged``, ``-1``
    may stand for the batch dim or for a ragged dim; where it could be either a ragged dim or an
    inferred static size, the ragged dims' own positions win (``(B, j0, 1, C).view(-1, -1, -1, C)``
    keeps ``j0`` at dim 1), and a choice that is still ambiguous raises."""
    size = list(size)

    def head() -> str:  # the message's start, built only when raising (formatting nested ints is slow)
        what = f"cannot view {describe(inp)} as" if op == "view" else f"cannot {op} {describe(inp)} to"
        return f"{op}(): {what} {tuple(size)}"

    b = inp._partition.batch
    if not size or is_nested_int(size[0]) or size[0] not in (b, -1):
        got = size[0] if size else "no dims"
        hint = ""
        if size and is_nested_int(size[0]) and len(inp._ragged_dims) > 1 and inp._ragged_dims[0] == 1:
            # rows folded into the batch keep every later dim; features split in a second step
            hint = ("; to fold the rows of dim 1 into the batch, keep the later dims as they are "
                    "(x.reshape(B * n, *x.shape[2:])), then reshape the features (.unflatten(-1, (H, D)))")
        elif size and is_nested_int(size[0]) and -1 in size[1:]:
            if _rows_size(inp, size[0]):
                # ``x.view(B * N, -1)``: flattening the batch dim into rows takes every later size
                hint = ("; flattening the batch dim into rows takes every later size given (x.view(B * n, C)), "
                        "or -1 first (x.view(-1, C))")
        raise StructureError(f"{head()}: dim 0 must be the batch size {b} or -1, got {got} (the batch and ragged dims "
                             f"must stay){hint}")
    nested = [inp._size[d] for d in inp._ragged_dims]
    for d in range(1, len(size)):
        if is_nested_int(size[d]) and not any(_same_size(size[d], n) for n in nested):
            raise StructureError(f"{head()}: size {size[d]} at dim {d} is not a ragged size of {describe(inp)}")
    candidates = _ragged_positions(inp, size)
    if not candidates:
        if len(size) == len(inp._size):
            d = next(d for d in inp._ragged_dims if not (size[d] == -1 or size[d] == inp._size[d]))
            why = ""
            if type(size[d]) is int and size[d] >= 0:  # NOTE [ Ragged dims of one size in every sample ] in flatten.py
                why = (" (under torch.compile a static size cannot stand for a ragged dim: whether every sample has "
                       "it is known eagerly only)" if torch.compiler.is_compiling() else
                       f" (a static size stands for a ragged dim where every sample has it; sizes "
                       f"{inp._partition.extents[inp._ragged_dims.index(d)].host_lengths().tolist()})")
            elif is_nested_int(size[d]):  # ragged sizes swapped: each sample's elements regrouped
                why = (" (regrouping a sample's elements across its ragged dims, as Transformer-XL's rel_shift does "
                       "with a pad and a view, is not supported: gather with relative positions, or index with "
                       "mj.position_ids, instead)")
            raise StructureError(f"{head()}: dim {d} must be the ragged size {inp._size[d]} or -1, got {size[d]}{why}")
        why = ""
        if torch.compiler.is_compiling() and not any(is_nested_int(s) for s in size):
            why = (" (under torch.compile static sizes cannot stand for ragged dims: whether every sample has them is "
                   "known eagerly only)")
        raise StructureError(
            f"{head()}: the batch and ragged dims must stay: expected the ragged sizes "
            f"({', '.join(str(n) for n in nested)}) in this order, each given as itself or -1{why}"
        )
    old_segs = _segments(inp._size, inp._ragged_dims)
    solved, problem = {}, None
    for pos in candidates:
        bounds = (0, *pos, len(size))
        statics = []
        for o, lo, hi in zip(old_segs, bounds[:-1], bounds[1:]):
            got, why = _resolve_segment(o, size[lo + 1 : hi], list(range(lo + 1, hi)))
            if got is None:
                if problem is None or pos == inp._ragged_dims:
                    problem = why
                break
            statics += got
        else:
            solved[pos] = statics
    if not solved:
        raise StructureError(f"{head()}: {problem}")
    if len(solved) > 1:
        if inp._ragged_dims not in solved:
            raise StructureError(
                f"{head()}: ambiguous: -1 could stand for a ragged dim at dims {list(solved)}; give the ragged "
                "sizes themselves (x.shape[d])"
            )
        return solved[inp._ragged_dims], inp._ragged_dims
    (pos, statics), = solved.items()
    return statics, pos


@register_multi_jagged_func([aten.view.default, aten._unsafe_view.default, aten.reshape.default], "self: mjt, size: any")
def view_default(func, inp, size):
    """View / reshape of static dims (``check_view_shape``)."""
    static, ragged_new = check_view_shape(func.__name__.split(".")[0], inp, size)
    v = inp._values
    values = v.view(v.shape[0], *static) if func is aten.view.default else v.reshape(v.shape[0], *static)
    return wrap(values, inp._partition, ragged_new)


@register_multi_jagged_func(aten.slice.Tensor, "self: mjt, dim: any?, start: any?, end: any?, step: any?")
def slice_Tensor(func, inp, dim=0, start=None, end=None, step=1):
    _, vd = _static_vdim("slice", inp, dim)
    return wrap(func(inp._values, vd, start, end, step), inp._partition, inp._ragged_dims)


@register_multi_jagged_func(aten.slice_backward.default, "grad: mjt, input_sizes: any, dim: any, start: any, end: any, step: any")
def slice_backward_default(func, grad, input_sizes, dim, start, end, step):
    _, vd = _static_vdim("slice_backward", grad, dim)
    static = [s for d, s in enumerate(input_sizes) if d and d not in grad._ragged_dims]
    return wrap(func(grad._values, [grad._values.shape[0], *static], vd, start, end, step), grad._partition, grad._ragged_dims)


@register_multi_jagged_func(aten.unfold.default, "self: mjt, dimension: any, size: any, step: any")
def unfold_default(func, inp, dimension, size, step):
    """``x.unfold(d, size, step)`` of a static dim: windows of each row's elements, a new last dim."""
    _, vd = _static_vdim("unfold", inp, dimension)
    return wrap(func(inp._values, vd, size, step), inp._partition, inp._ragged_dims)


@register_multi_jagged_func(aten.unfold_backward.default, "grad_in: mjt, input_sizes: any, dim: any, size: any, step: any")
def unfold_backward_default(func, grad, input_sizes, dim, size, step):
    d = canonical_dim("unfold_backward", len(input_sizes), dim)
    static = [s for e, s in enumerate(input_sizes) if e and e not in grad._ragged_dims]
    vd = static_dims(len(input_sizes), grad._ragged_dims).index(d) + 1
    return wrap(func(grad._values, [grad._values.shape[0], *static], vd, size, step), grad._partition, grad._ragged_dims)


@register_multi_jagged_func(aten.select_backward.default, "grad: mjt, input_sizes: any, dim: any, index: any")
def select_backward_default(func, grad, input_sizes, dim, index):
    d = canonical_dim("select_backward", len(input_sizes), dim)
    ragged = tuple(r + 1 if r >= d else r for r in grad._ragged_dims)
    vd = static_dims(len(input_sizes), ragged).index(d) + 1
    static = [s for e, s in enumerate(input_sizes) if e and e not in ragged]
    return wrap(func(grad._values, [grad._values.shape[0], *static], vd, index), grad._partition, ragged)


@register_multi_jagged_func(aten.cat.default, "tensors: any, dim: any?")
def cat_default(func, tensors, dim=0, op="cat"):
    """Concatenate multi_jagged tensors of one structure along a static dim."""
    first = tensors[0]
    if not all(isinstance(t, MJT) for t in tensors):
        raise TypeError(f"{op}(): expected all tensors to be multi_jagged for layout torch.multi_jagged")
    _, vd = _static_vdim(op, first, dim)
    for t in tensors[1:]:
        if t._ragged_dims != first._ragged_dims or not same_partition(t._partition, first._partition):
            raise StructureError(f"{op}(): expected tensors of one structure, got {describe(first)} and {describe(t)}")
    return wrap(torch.cat([t._values for t in tensors], vd), first._partition, first._ragged_dims)


@register_multi_jagged_func(aten.stack.default, "tensors: any, dim: any?")
def stack_default(func, tensors, dim=0):
    """Stack multi_jagged tensors of one structure along a new static dim."""
    first = tensors[0]
    d = canonical_dim("stack", len(first._size) + 1, dim)
    if d == 0:
        raise StructureError(f"stack(): cannot stack along the batch dim of {describe(first)}")
    pieces = [unsqueeze_default(aten.unsqueeze.default, t, d) if isinstance(t, MJT) else t for t in tensors]
    return cat_default(aten.cat.default, pieces, d, op="stack")


def _rows_size(x: MJT, size) -> bool:
    """Whether ``size`` is the product of ``x``'s sizes through its last ragged dim (``B * n`` of
    ``(B, n, d)``, ``B * S * n`` of ``(B, S, n, d)``): a nested int, as eager products of ragged
    sizes are the nested int of the dims flattened, times the static sizes."""
    if not is_nested_int(size) or torch.compiler.is_compiling() or not x._partition.batch:
        return False
    want = x._partition.batch
    try:
        for d in range(1, max(x._ragged_dims) + 1):
            want = want * x._size[d]
        return bool(size == want)
    except (TypeError, ValueError):  # sizes that do not multiply (traced nested ints)
        return False
