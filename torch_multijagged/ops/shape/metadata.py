"""Metadata queries (sizes, strides, numel, contiguity): answered without touching the data."""

import torch

from .._common import MJT
from .._routing import route
from .._table import FAST, register_multi_jagged_func
from . import views

aten = torch.ops.aten

# Queried on every op by autograd and the dispatcher, so ``dispatch`` looks these up before the
# schema check (``FAST`` in ``_table.py``).
FAST.update({
    aten.sym_size.default: lambda x: x._size,
    aten.dim.default: lambda x: len(x._size),
    aten.sym_stride.default: lambda x: x._strides,
    # Logical numel equals the packed numel: no padding is stored.
    aten.sym_numel.default: lambda x: x._values.numel(),
    aten.numel.default: lambda x: x._values.numel(),
    aten.sym_storage_offset.default: lambda x: x._values.storage_offset(),
    aten.is_non_overlapping_and_dense.default: lambda x: _non_overlapping_and_dense(x),
})


def _non_overlapping_and_dense(x: MJT) -> bool:
    # What autograd's gradient layout contract asks of a leaf: with True, AccumulateGrad keeps a
    # gradient of the leaf's own layout (its strides agree) instead of copying each one into
    # torch.jagged's contiguous order (NOTE [ Contiguity as torch.jagged reports it ] in views.py),
    # a transposing copy for channels-last images that every later accumulation then reads
    # strided. Contiguous packed values are dense per sample; other layouts answer False as before.
    v = x.__dict__.get("_values")  # per-image pieces are not packed (and not read here)
    return v is not None and v.is_contiguous()


@register_multi_jagged_func(
    [aten.is_contiguous.default, aten.is_contiguous.memory_format, aten.sym_is_contiguous.default],
    "self: mjt, memory_format: any?",
)
def is_contiguous_default(func, inp, memory_format=torch.contiguous_format):
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        # packed pixel rows are channels last (NOTE [ Memory formats of images ] in elementwise/factory.py)
        n = len(inp._size)
        return (n == (4 if memory_format is torch.channels_last else 5) and inp._ragged_dims == tuple(range(2, n))
                and inp._values.is_contiguous())
    if memory_format not in (torch.contiguous_format, torch.preserve_format):
        return False
    # A copy made by reordering ragged dims is not contiguous, so that .contiguous() gives a
    # writable tensor (NOTE [ Reordered ragged dims are copies ] in ops/shape/views.py).
    return views.njt_order_values(inp).is_contiguous() and not views.is_reorder_copy(inp)


@register_multi_jagged_func(aten.is_strides_like_format.default, "self: mjt, memory_format: any")
def is_strides_like_format_default(func, inp, memory_format):
    return memory_format == torch.contiguous_format and views.njt_order_values(inp).is_contiguous()


@register_multi_jagged_func(aten.size.default, "self: mjt")
def size_default(func, inp):
    # C++ code that asks for concrete sizes (``t.sizes()``) lands here; a ragged dim has none.
    # The callers seen: an aten derivative formula run under create_graph=True (sgn's, reached
    # through a composite op that calls ``abs``), the TorchScript interpreter (a
    # ``@torch.jit.script`` function), and autograd formatting its error for a tensor saved for
    # backward and then modified in place: say so instead of "no handler".
    raise NotImplementedError(
        f"size(): concrete sizes were requested of a tensor of layout torch.multi_jagged, shape "
        f"{tuple(inp._size)}, whose ragged dims are nested ints; the caller (often an aten "
        "double-backward formula; also a TorchScript function, or autograd reporting that a tensor "
        "needed for the gradient was modified in place) is not supported for this layout"
    )


@register_multi_jagged_func(aten.is_same_size.default, "self: mjt, other: any")
def is_same_size_default(func, inp, other):
    # nested ints compare by identity, as torch.jagged's
    return isinstance(other, torch.Tensor) and tuple(inp._size) == tuple(other.shape)


@register_multi_jagged_func([aten._is_all_true.default, aten._is_any_true.default], "self: mjt")
def _is_all_true_default(func, inp):
    # ``torch._is_all_true``, which ``torch.testing`` and ``assert (a == b).all()``-style checks use
    return func(inp._values)


@register_multi_jagged_func(aten.is_pinned.default, "self: mjt, device: any?")
def is_pinned_default(func, inp, device=None):
    return inp._values.is_pinned() if device is None else inp._values.is_pinned(device)


@register_multi_jagged_func(aten._pin_memory.default, "self: mjt, device: any?")
def _pin_memory_default(func, inp, device=None):
    # Same device, same offsets: the nested ints stay (pinning moves no data across devices).
    return type(inp)(func(inp._values, device), inp._partition, inp._ragged_dims)


@register_multi_jagged_func(aten.record_stream.default, "self: mjt, s: any")
def record_stream_default(func, inp, s):
    inp._values.record_stream(s)
    inp._partition.offsets.record_stream(s)


@route(torch.Tensor.numel, torch.numel, torch.Tensor.nelement)
def _numel(input):
    """The packed element count (no padding is stored): rows × the static sizes. The wrapper's
    C++ numel would multiply nested ints."""
    if not isinstance(input, MJT):
        return NotImplemented
    n = input._partition.rows
    for d, s in enumerate(input._size):
        if d and d not in input._ragged_dims:
            n = n * s
    return n


@route(torch.Tensor.nbytes.__get__)
def _nbytes(input):
    """``x.nbytes``: the packed elements' bytes (``numel() * itemsize``), as the element count above."""
    if not isinstance(input, MJT):
        return NotImplemented
    return _numel(input) * input.dtype.itemsize
