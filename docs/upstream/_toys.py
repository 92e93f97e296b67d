"""Toy subclasses and inputs for the repro scripts beside this file.

Nothing here imports ``torch_multijagged``: the toys are the smallest subclasses that show a
limitation, so that every repro runs on plain torch.
"""

from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_map


class Wrapper(torch.Tensor):
    """The smallest traceable wrapper subclass: one inner tensor, every op run on it."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, requires_grad=inner.requires_grad)

    def __init__(self, inner):
        self.inner = inner

    def __tensor_flatten__(self):
        return ["inner"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["inner"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*tree_map(lambda t: t.inner if isinstance(t, Wrapper) else t, args), **(kwargs or {}))
        return tree_map(lambda t: cls(t) if isinstance(t, torch.Tensor) else t, out)


# ----------------------------------------------------------------------------- a toy ragged layout
aten = torch.ops.aten
_LAYOUT_QUERIES = (aten.is_contiguous.default, aten.is_contiguous.memory_format,
                   aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default)


class Ragged(torch.Tensor):
    """A toy ragged batch, as a third-party layout must be built: a traceable wrapper subclass
    *without* the NestedTensor dispatch key whose sizes hold nested ints.

    Logical size ``(B, j_0, …, j_{R-1}, *static)``; data: packed rows ``values (T, *static)`` and,
    per ragged dim, ``(B+1,)`` offsets whose nested int (``get_tensor_symint``, as torch.jagged's)
    is that dim's size. Every aten op runs on the values (elementwise ops and reductions over
    static dims); ``sum`` over the batch and every ragged dim gives a dense tensor. Strides and
    contiguity are answered in Python (C++ cannot compute them from nested ints)."""

    @staticmethod
    def __new__(cls, values, offsets):
        from torch.nested._internal.nested_tensor import get_tensor_symint

        offsets = tuple(offsets)
        size = (offsets[0].shape[0] - 1, *(get_tensor_symint(o) for o in offsets), *values.shape[1:])
        strides = (math.prod(values.shape[1:]),) * (1 + len(offsets)) + values.stride()[1:]
        r = torch.Tensor._make_wrapper_subclass(cls, size, strides, dtype=values.dtype, device=values.device,
                                                storage_size=0, dispatch_sizes_strides_policy="strides")
        r.values_, r.strides_, r.ragged = values, strides, len(offsets)
        for i, o in enumerate(offsets):
            setattr(r, f"off{i}", o)
        return r

    def __init__(self, *args, **kwargs):
        pass

    def __repr__(self):
        return f"Ragged(size={tuple(self.shape)})"

    @property
    def offsets_(self):
        return tuple(getattr(self, f"off{i}") for i in range(self.ragged))

    def __tensor_flatten__(self):
        return ["values_", *(f"off{i}" for i in range(self.ragged))], self.ragged

    @staticmethod
    def __tensor_unflatten__(inner, n, outer_size, outer_stride):
        from torch._subclasses.fake_tensor import FakeTensor

        offsets = [inner[f"off{i}"] for i in range(n)]
        for i, o in enumerate(offsets):
            if isinstance(o, FakeTensor):  # keep the traced nested int, as torch.jagged does
                o.nested_int_memo = outer_size[1 + i]
        return Ragged(inner["values_"], offsets)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        x = next(a for a in args if isinstance(a, Ragged))
        k = 1 + x.ragged  # the batch and ragged dims: the values' packed dim
        if func is aten.sym_stride.default:
            return x.strides_
        if func in _LAYOUT_QUERIES:
            return True
        if func is aten.sum.dim_IntList and set(range(k)) <= {d % x.dim() for d in args[1]}:
            static = sorted({d % x.dim() - k + 1 for d in args[1]} - set(range(1 - k, 1)))
            return x.values_.sum([0, *static], *args[2:])  # dense
        out = func(*tree_map(lambda t: t.values_ if isinstance(t, Ragged) else t, args), **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() >= 1 and out.shape[0] == x.values_.shape[0]:
            return Ragged(out, x.offsets_)
        return out


class Values(torch.autograd.Function):
    """``values`` of a Ragged tensor, differentiable: the way to a dense loss."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(*(getattr(x, f"off{i}") for i in range(x.ragged)))  # inner tensors by name
        return x.values_.view_as(x.values_)

    @staticmethod
    def backward(ctx, grad):
        return FromValues.apply(grad, *ctx.saved_tensors)  # differentiable: double backward flows


class FromValues(torch.autograd.Function):
    """A Ragged tensor viewing dense ``values`` (typically a leaf that requires grad)."""

    @staticmethod
    def forward(ctx, values, *offsets):
        ctx.n = len(offsets)
        return Ragged(values.view_as(values), offsets)

    @staticmethod
    def backward(ctx, grad):
        return (Values.apply(grad), *([None] * ctx.n))


def ragged(*lengths, static=(4,), requires_grad=True):
    """``(x, values)``: a toy ``(B, j…, *static)`` batch over a leaf ``values``; ``lengths[r][b]`` is
    sample b's size along ragged dim r."""
    torch.manual_seed(0)
    ls = [torch.tensor(length) for length in lengths]
    offsets = [torch.cat([torch.zeros(1, dtype=torch.long), length.cumsum(0)]) for length in ls]
    rows = int(torch.stack(ls).prod(0).sum())
    values = torch.randn(rows, *static, requires_grad=requires_grad)
    return FromValues.apply(values, *offsets), values


def jagged(*lengths, dim=4, requires_grad=False):
    """A torch.jagged ``(B, j0, dim)`` batch."""
    torch.manual_seed(0)
    return torch.nested.nested_tensor([torch.randn(n, dim) for n in lengths], layout=torch.jagged,
                                      requires_grad=requires_grad)
