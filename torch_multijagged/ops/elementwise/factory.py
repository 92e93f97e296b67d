"""Ops that keep the structure and act on the values as a whole: copies, ``*_like``, fills,
conversions, random fills."""

from __future__ import annotations

import torch

from .._table import op_name, register_multi_jagged_func
from ..shape import views
from .._common import MJT, describe, same_partition, wrap
from .pointwise import pointwise
from .._routing import route
from ...structure import extent_of, mapped_from, partition_for

aten = torch.ops.aten


def _same_values_op(func, inp, *args, **kwargs):
    return wrap(func(inp._values, *args, **kwargs), inp._partition, inp._ragged_dims)


_CHANNELS_LAST = {torch.channels_last: 4, torch.channels_last_3d: 5}


def _values_format(func, inp, kwargs: dict) -> dict:
    """``kwargs`` with a channels-last request made a request for contiguous values: the packed
    rows ``(P, C)`` of images ``(B, C, j0, j1)`` are each image's pixels in channels-last order
    already (NOTE [ Memory formats of images ])."""
    fmt = kwargs.get("memory_format")
    rank = _CHANNELS_LAST.get(fmt)
    if rank is None:
        return kwargs
    if len(inp._size) != rank:
        raise RuntimeError(f"{op_name(func)}(): required rank {rank} tensor to use {str(fmt).split('.')[-1]} format, "
                           f"got {describe(inp)}")
    return dict(kwargs, memory_format=torch.contiguous_format)


# NOTE [ Memory formats of images ]
#
# An image batch ``(B, C, j0, j1)`` keeps its pixels as packed rows ``(P, C)``: row-major over each
# image's pixels, channels last. So ``x.contiguous(memory_format=torch.channels_last)`` (and
# ``clone`` / ``to`` / ``*_like`` with that format) asks for contiguous values, and
# ``is_contiguous(memory_format=torch.channels_last)`` is true for contiguous values whose every
# dim after the channels is ragged (``channels_last_3d`` likewise for volumes). Like any memory
# format it never changes a value; a batch of another rank raises as dense torch does.


@register_multi_jagged_func(
    [
        aten.clone.default,
        aten.detach.default,
        aten.alias.default,
        aten.empty_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.rand_like.default,
        aten.randn_like.default,
        aten.randint_like.default,
        aten.randint_like.low_dtype,
        aten.bernoulli.default,
        aten.bernoulli.p,
        aten.fill.Scalar,
        aten.fill.Tensor,
    ],
    "self: mjt, ...",
)
def like_default(func, inp, *args, **kwargs):
    """Same structure, values from ``func`` on the values (``clone``, ``detach``, ``*_like``…).

    Memory-format requests are honoured on the values (they are the storage)."""
    if func is aten.clone.default and kwargs.get("memory_format") is torch.contiguous_format:
        # contiguous in torch.jagged's order (NOTE [ Contiguity as torch.jagged reports it ] in ops/shape/views.py)
        return wrap(views.contiguous_values(inp), inp._partition, inp._ragged_dims)
    if func in (aten.detach.default, aten.alias.default) and _plain_eager():
        return wrap(_alias_sharing_version(func, inp._values), inp._partition, inp._ragged_dims)
    return _same_values_op(func, inp, *args, **_values_format(func, inp, kwargs))


def _plain_eager() -> bool:
    return not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active())


def _alias_sharing_version(func, values: torch.Tensor) -> torch.Tensor:
    """``func`` (``detach`` / ``alias``) of ``values`` sharing their version counter, as the dense
    op does. A handler runs below ``ADInplaceOrView``, where these ops make a tensor with a counter
    of its own: a write through ``x.detach()`` then left the counter of ``x``'s values unchanged, and
    a backward that saved them (``y = x.sin(); x.detach().mul_(2)``; ``y = x.exp();
    y.detach().zero_()``) returned a silently wrong gradient where dense torch raises. So the op
    runs with ``ADInplaceOrView`` (which shares the counter) let through."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.ADInplaceOrView)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.no_grad():
        return func(values)


@register_multi_jagged_func(aten._to_copy.default, "self: mjt")
def _to_copy_default(func, inp, **kwargs):
    values = func(inp._values, **_values_format(func, inp, kwargs))
    if values.device == inp._values.device:
        return wrap(values, inp._partition, inp._ragged_dims)
    # A new device gets new offsets, hence new nested ints (as with torch.jagged).
    return wrap(values, inp._partition.to(values.device), inp._ragged_dims)


@register_multi_jagged_func(
    [aten.fill_.Scalar, aten.zero_.default, aten.bernoulli_.float, aten.bernoulli_.Tensor,
     aten.uniform_.default, aten.normal_.default, aten.random_.default, getattr(aten.random_, "from"), aten.random_.to,
     aten.exponential_.default],
    "self: mjt, ...",
)
def fill__Scalar(func, inp, *args, **kwargs):
    func(inp._values, *args, **kwargs)
    return inp


@register_multi_jagged_func(aten.fill_.Tensor, "self: mjt, value: t")
def fill__Tensor(func, inp, value):
    if value.dim() != 0:
        raise ValueError(f"fill_(): expected a 0-dim value tensor, got shape {tuple(value.shape)}")
    inp._values.fill_(value)
    return inp


@register_multi_jagged_func(aten.copy_.default, "self: mjt, src: any, non_blocking: any?")
def copy__default(func, dst, src, non_blocking=False):
    if isinstance(src, MJT):
        if src._ragged_dims != dst._ragged_dims or not same_partition(src._partition, dst._partition):
            raise ValueError(f"copy_(): expected src with the structure of self {describe(dst)}, got {describe(src)}")
        dst._values.copy_(src._values, non_blocking)
        return dst
    # Dense src broadcasts over static dims (the pointwise rules).
    return pointwise(aten.copy_.default, dst, src, non_blocking)


@register_multi_jagged_func(aten.masked_fill.Tensor, "self: any, mask: any, value: t")
def masked_fill_Tensor(func, inp, mask, value):
    return pointwise(aten.where.self, mask, value.to(inp.dtype), inp)


@register_multi_jagged_func(aten.masked_fill_.Tensor, "self: mjt, mask: any, value: t")
def masked_fill__Tensor(func, inp, mask, value):
    out = pointwise(aten.where.self, mask, value.to(inp.dtype), inp)
    inp._values.copy_(out._values)
    return inp


@register_multi_jagged_func(aten.masked_fill_.Scalar, "self: mjt, mask: any, value: any")
def masked_fill__Scalar(func, inp, mask, value):
    out = pointwise(aten.masked_fill.Scalar, inp, mask, value)
    if out._partition is not inp._partition or out._ragged_dims != inp._ragged_dims:
        raise ValueError(f"{op_name(func)}(): the mask would change the structure of self {describe(inp)}")
    inp._values.copy_(out._values)
    return inp



@register_multi_jagged_func(
    [aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default],
    "self: mjt, size: any, ...",
)
def new_zeros_default(func, inp, size, *args, **kwargs):
    """``new_*(size)``. A size of plain ints gives a dense tensor (as ``torch.jagged``). A size
    holding ``self``'s own nested ints, in the order of its ragged dims, gives a multi_jagged
    tensor with ``self``'s structure, those ragged dims and the other entries as static sizes —
    what aten's backward formulas ask for (``max(dim)``'s ``new_zeros(self.sizes())``). A size
    holding some of them, in any order, gives the structure of those extents alone (per sample,
    each nested int read as that sample's extent)."""
    from torch.fx.experimental.symbolic_shapes import is_nested_int

    size = list(size)
    ragged = tuple(d for d, s in enumerate(size) if is_nested_int(s))
    if not ragged:
        return func(inp._values, size, *args, **kwargs)
    p = inp._partition
    mine = [e.nested_int for e in p.extents]
    if ragged[0] == 0 or size[0] != p.batch:
        # The result holds every sample of self, its dim 0 the batch: a leading 1 (dense code's
        # batch of one) is self's batch only where B = 1, and a (1, …) tensor of B samples' ragged
        # sizes has no form. The size with B first broadcasts per sample as the 1 would.
        want = [p.batch, *size[1:]] if size[0] == 1 else [p.batch, *size]
        msg = (f"{op_name(func)}(): expected the batch size at dim 0 of a size holding nested ints, got "
               f"{tuple(size)}: the result holds every sample of self (batch size {p.batch}); write {tuple(want)} "
               "(self.shape[0] first), which each sample reads as its own")
        raise (NotImplementedError if ragged[0] == 0 else ValueError)(msg)
    static = [s for d, s in enumerate(size) if d and d not in ragged]
    if len(ragged) == len(mine) and all(size[d] == j for d, j in zip(ragged, mine)):
        return wrap(func(inp._values, [inp._values.shape[0], *static], *args, **kwargs), p, ragged)
    # Some of self's nested ints, e.g. a ragged dim set to 1 (a dropout mask shared along it,
    # OpenFold's DropoutRowwise), or sizes mapped from them (``n - 1``, ``n // 2`` of self's ``n``:
    # NOTE [ Ragged sizes plus an int ] in ragged_sizes.py): per sample the size with each nested
    # int read as that sample's extent, so the structure of those extents alone.
    picked = []
    for d in ragged:
        k = next((k for k, j in enumerate(mine) if size[d] == j), None)
        e = p.extents[k] if k is not None else extent_of(size[d])
        if e is None or (k is None and not mapped_from(e, p.extents)):
            raise NotImplementedError(
                f"{op_name(func)}(): expected a size holding nested ints of self {describe(inp)} or sizes mapped "
                f"from them (n - 1, n // 2), got {tuple(size)} for layout torch.multi_jagged"
            )
        picked.append(e)
    sub = partition_for(picked)
    return wrap(func(inp._values, [sub.rows, *static], *args, **kwargs), sub, ragged)


@register_multi_jagged_func(aten.new_empty_strided.default, "self: mjt, size: any, stride: any, ...")
def new_empty_strided_default(func, inp, size, stride, **kwargs):
    """``new_empty(size)``: the strides asked for are the layout's own (packed values). Autograd's
    backward of an in-place op on a view (``CopySlices``: ``q = x[..., :2]; q.mul_(2)``, or a
    transposed view under ``torch.compile``) allocates the base's gradient with it."""
    return new_zeros_default(aten.new_empty.default, inp, size, **kwargs)


@route(torch.Tensor.detach, torch.detach)
def _detach(input):
    # Under inference_mode, aten's detach of a tensor made outside it would give the (inference)
    # output the input's version counter, which torch refuses for subclasses ("Cannot set
    # version_counter for inference tensor"; torch.jagged fails the same way). A new wrapper over
    # the detached values is what dense torch returns there: same data, no graph.
    if not (isinstance(input, MJT) and torch.is_inference_mode_enabled() and not input.is_inference()):
        return NotImplemented
    return wrap(input._values.detach(), input._partition, input._ragged_dims)


@route(torch.nn.functional.one_hot)
def _one_hot(tensor, num_classes=-1):
    """aten's ``one_hot`` skips its range checks for a tensor of symbolic (nested-int) sizes and
    would drop a class out of range silently: they are made here, as dense torch makes them
    (``num_classes=-1`` takes the batch's largest class, as ``torch.jagged``'s)."""
    if not isinstance(tensor, MJT) or tensor.dtype != torch.int64 or torch.compiler.is_compiling():
        return NotImplemented
    if bool((tensor < 0).any()):  # SYNC: dense torch's own check
        raise RuntimeError("Class values must be non-negative.")
    if num_classes >= 0 and bool((tensor >= num_classes).any()):
        raise RuntimeError("Class values must be smaller than num_classes.")
    return NotImplemented
