"""Metadata queries (sizes, strides, numel, contiguity): answered without touching the data."""

import torch

from . import register_multi_jagged_func, views

aten = torch.ops.aten

# Queried on every op by autograd and the dispatcher, so ``dispatch`` looks these up before the
# schema check (see FAST in ops/__init__.py).
FAST = {
    aten.sym_size.default: lambda x: x._size,
    aten.dim.default: lambda x: len(x._size),
    aten.sym_stride.default: lambda x: x._strides,
    # Logical numel equals the packed numel: no padding is stored.
    aten.sym_numel.default: lambda x: x._values.numel(),
    aten.numel.default: lambda x: x._values.numel(),
    aten.sym_storage_offset.default: lambda x: x._values.storage_offset(),
    aten.is_non_overlapping_and_dense.default: lambda x: False,
}


@register_multi_jagged_func(
    [aten.is_contiguous.default, aten.is_contiguous.memory_format, aten.sym_is_contiguous.default],
    "self: mjt, memory_format: any?",
)
def is_contiguous_default(func, inp, memory_format=torch.contiguous_format):
    if memory_format not in (torch.contiguous_format, torch.preserve_format):
        return False
    # A copy made by reordering ragged dims is not contiguous, so that .contiguous() gives a
    # writable tensor (NOTE [ Reordered ragged dims are copies ] in views.py).
    return inp._values.is_contiguous() and not views.is_reorder_copy(inp)


@register_multi_jagged_func(aten.is_strides_like_format.default, "self: mjt, memory_format: any")
def is_strides_like_format_default(func, inp, memory_format):
    return memory_format == torch.contiguous_format and inp._values.is_contiguous()


@register_multi_jagged_func(aten.size.default, "self: mjt")
def size_default(func, inp):
    # C++ code that asks for concrete sizes (``t.sizes()``) lands here; a ragged dim has none.
    # The usual caller is an aten derivative formula run under create_graph=True (sgn's, reached
    # through a composite op that calls ``abs``): say so instead of "no handler".
    raise NotImplementedError(
        f"size(): concrete sizes were requested of a tensor of layout torch.multi_jagged, shape "
        f"{tuple(inp._size)}, whose ragged dims are nested ints; the caller (often an aten "
        "double-backward formula) is not supported for this layout"
    )
