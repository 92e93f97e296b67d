"""Nested-int arithmetic is constant-only: no product of two nested ints, no ``add``, no ``sym_max``.

``NestedIntNode`` (``torch/nested/_internal/nested_int.py``) implements ``mul`` by a constant
and comparisons, nothing else. Hence:

* a tensor with two ragged dims ``(B, j0, j1, C)`` has no ``numel()`` / ``sym_numel()`` and no
  contiguous batch stride (``j0 * j1`` raises ``ValueError: unsupported``), and composites that
  multiply sizes (``reshape``'s element count, a ``(M, N)`` view with M = B·j0·j1 in a
  derivative) fail on it;
* a wrapper subclass with a nested-int size cannot let C++ compute its strides or contiguity
  (``_make_wrapper_subclass`` without a Python strides policy: ``'NestedIntNode' object has no
  attribute 'add'`` / ``'sym_max'``), so every stride and contiguity query must go to Python.
"""
import torch
from _repro import case, control, report
from torch.nested._internal.nested_tensor import get_tensor_symint

j0 = get_tensor_symint(torch.tensor([0, 2, 5]))
j1 = get_tensor_symint(torch.tensor([0, 1, 3]))


class Subclass(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def wrapper_with_cpp_strides():
    t = torch.Tensor._make_wrapper_subclass(Subclass, (2, j0, 4), (4 * j0, 4, 1), dtype=torch.float32)
    t.is_contiguous()


control("a nested int times a constant", lambda: 4 * j0)
case("j0 * j1", lambda: j0 * j1, "unsupported")
case("_make_wrapper_subclass((2, j0, 4), strides (4*j0, 4, 1)) with C++ strides", wrapper_with_cpp_strides,
     "has no attribute")
report()
