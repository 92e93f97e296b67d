"""Metadata queries (sizes, strides, numel, contiguity): answered without touching the data."""

import torch

from . import register_multi_jagged_func

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
    return inp._values.is_contiguous()


@register_multi_jagged_func(aten.is_strides_like_format.default, "self: mjt, memory_format: any")
def is_strides_like_format_default(func, inp, memory_format):
    return memory_format == torch.contiguous_format and inp._values.is_contiguous()
