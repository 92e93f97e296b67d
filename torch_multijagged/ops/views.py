"""Structure ops: unsqueeze / squeeze / expand / permute / transpose, component access."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ..errors import StructureError
from ..kernels import reference as ref
from . import register_multi_jagged_func
from ._common import MJT, canonical_dim, describe, device_sizes, same_partition, map_to_sub, partition_for, note_sub, static_dims, wrap

aten = torch.ops.aten


@register_multi_jagged_func(aten.unsqueeze.default, "self: mjt, dim: any")
def unsqueeze_default(func, inp, dim):
    d = canonical_dim("unsqueeze", len(inp._size) + 1, dim)
    if d == 0:
        raise StructureError(f"unsqueeze(): cannot insert a dim before the batch dim of {describe(inp)}")
    ragged = tuple(r + 1 if r >= d else r for r in inp._ragged_dims)
    vd = sum(1 for s in static_dims(len(inp._size), inp._ragged_dims) if s < d) + 1
    return wrap(inp._values.unsqueeze(vd), inp._partition, ragged)


def _squeeze(inp, dims):
    ndim = len(inp._size)
    stat = static_dims(ndim, inp._ragged_dims)
    drop = []
    for d in sorted({canonical_dim("squeeze", ndim, d) for d in dims}):
        if d == 0:
            raise StructureError(f"squeeze(): cannot squeeze the batch dim of {describe(inp)}")
        if d in inp._ragged_dims:
            raise StructureError(f"squeeze(): cannot squeeze ragged dim {d} of {describe(inp)}")
        if inp.shape[d] == 1:
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
            if e is None or inp.shape[d] != 1:
                raise StructureError(
                    f"expand(): cannot expand dim {d} of {describe(inp)} to ragged size {s}: only a size-1 "
                    "dim can become ragged, with an extent the tensor already has"
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
        note_sub(partition, keep, inp._partition)
        index, _ = map_to_sub(partition, keep)
        values = values.index_select(0, index)
        in_static = static_dims(ndim, inp._ragged_dims)
        keep_v = [i + 1 for i, d in enumerate(in_static) if d not in out_dims]
        values = values.reshape(values.shape[0], *[values.shape[i] for i in keep_v])
    return wrap(values.expand(values.shape[0], *static_size), partition, out_dims)


def _permute(inp, perm):
    ndim = len(inp._size)
    perm = [canonical_dim("permute", ndim, p) for p in perm]
    if sorted(perm) != list(range(ndim)):
        raise StructureError(f"permute(): expected a permutation of {ndim} dims, got {perm}")
    if perm[0] != 0:
        raise StructureError(f"permute(): the batch dim of {describe(inp)} must stay first")
    new_ragged = tuple(i for i, p in enumerate(perm) if p in inp._ragged_dims)
    # ragged_order[k]: which of the input's ragged dims becomes the output's k-th ragged dim
    ragged_order = tuple(inp._ragged_dims.index(perm[i]) for i in new_ragged)
    stat = static_dims(ndim, inp._ragged_dims)
    vperm = [0] + [stat.index(p) + 1 for p in perm if p not in inp._ragged_dims and p != 0]
    values, partition = inp._values.permute(vperm), inp._partition
    if ragged_order != tuple(sorted(ragged_order)):
        # The ragged dims change storage order: a per-sample transpose of the packed rows.
        index, partition = _reorder_rows(partition, ragged_order)
        values = values.index_select(0, index)
    return wrap(values, partition, new_ragged)


def _reorder_rows(p, order: tuple[int, ...]):
    """Rows of ``p`` gathered so that ragged dim ``order[k]`` becomes the k-th (cached)."""
    key = ("reorder", order)
    hit = p.cache.get(key)
    if hit is None:
        out = partition_for([p.extents[k] for k in order])
        index = ref.row_reorder(out.offsets, device_sizes(out), out.rows, order, p.offsets)
        hit = p.cache[key] = (index, out)
    return hit


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
        raise StructureError(f"unbind(): only dim 0 is supported for layout torch.multi_jagged, got {dim}")
    return tuple(ref.unpack_components(inp._values, inp._partition.host_sizes(), inp._ragged_dims))


def _static_vdim(op: str, inp, dim) -> tuple[int, int]:
    d = canonical_dim(op, len(inp._size), dim)
    if d == 0 or d in inp._ragged_dims:
        raise StructureError(f"{op}(): expected a static dim of {describe(inp)}, got dim {dim} (batch or ragged)")
    return d, static_dims(len(inp._size), inp._ragged_dims).index(d) + 1


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


@register_multi_jagged_func([aten.view.default, aten._unsafe_view.default, aten.reshape.default], "self: mjt, size: any")
def view_default(func, inp, size):
    """View / reshape of static dims. The batch and ragged dims stay (as the same nested ints);
    static dims may regroup only within the runs between ragged dims."""
    size = list(size)
    ragged_new = tuple(d for d, s in enumerate(size) if is_nested_int(s))
    if len(ragged_new) != len(inp._ragged_dims) or any(
        size[d] != inp._size[o] for d, o in zip(ragged_new, inp._ragged_dims)
    ) or size[0] not in (inp._partition.batch, -1):
        raise StructureError(
            f"{func.__name__.split('.')[0]}(): cannot view {describe(inp)} as {tuple(size)}: the batch and ragged "
            "dims must stay, with the same nested ints"
        )
    old_segs = _segments(inp._size, inp._ragged_dims)
    new_segs = _segments(size, ragged_new)
    for o, n in zip(old_segs, new_segs):
        if -1 in n:
            known = _prod([s for s in n if s != -1])
            n[n.index(-1)] = _prod(o) // known if known else 0
        if _prod(o) != _prod(n):
            raise StructureError(
                f"{func.__name__.split('.')[0]}(): cannot view {describe(inp)} as {tuple(size)}: static dims may only "
                "regroup between ragged dims"
            )
    static = [s for seg in new_segs for s in seg]
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
