"""Building the wrapper of a ``MultiJaggedTensor``: its C++ tensor object, whose sizes hold nested
ints (NOTE [ Building a wrapper ]). ``tensor.py`` stores the values and structure on it."""

from __future__ import annotations

import torch

from .structure import Partition

__all__: list[str] = []


# NOTE [ Building a wrapper ]
#
# Every op of the eager values path builds a wrapper, so its construction is part of every op's
# host cost. ``_make_wrapper_subclass`` reads the new tensor's ``device`` attribute through Python,
# which on our class is a ``__torch_function__`` call (≈ 2.5 µs of a ≈ 8 µs construction): it runs
# with subclass torch functions disabled. What remains is mostly C++ parsing the nested ints of the
# size and stride: five calls into each Python node (``is_int`` thrice, ``maybe_as_int``,
# ``clone``), ≈ 1.7 µs per nested int. The strides a wrapper reports come from Python (the
# ``"strides"`` policy: ``_strides``, with ``torch.jagged``'s batch stride ``C*j0``), so C++ never
# reads the strides it stores: those are plain ints (the nested batch stride stored as the packed
# row stride), one nested int fewer to parse for every wrapper with one ragged dim. Storing torch's C++ nested ints of the same ids instead (``torch._C._get_nested_int``)
# was measured and rejected: C++ compares a C++ nested int with a Python one as unequal (its
# ``nested_int()`` is not asked of a Python node), so autograd's gradient shape checks fail
# wherever a wrapper with C++ sizes meets one whose sizes had to stay Python (two ragged dims: C++
# cannot multiply nested ints, which a view's geometry does).
#
# Eagerly, the nested ints are parsed once or twice per structure instead: a wrapper of a structure
# (partition, ragged dims, static sizes and strides of its values, dtype, device, class) is
# detached below the Python and autograd keys into a plain *template* tensor, cached on the
# partition, whose C++ sizes are those nested ints (``aten.detach``'s kernel copies the sizes
# without reading them, and drops the Python keys; ≈ 3 µs, paid by the second wrapper of a
# structure, so that a structure built once costs nothing more). Every later wrapper of the structure is
# ``Tensor._make_subclass`` of the template: one more shallow copy, to which torch adds the Python
# keys back because the class defines ``__torch_dispatch__`` (≈ 2.6 µs, against ≈ 13 µs for a pair's
# ``_make_wrapper_subclass``). Both copies run below autograd and ``ADInplaceOrView``, so that the
# wrapper is no view of the template and gets a version counter of its own (``detach`` shares its
# source's). Wrappers of one structure then share the template's empty storage (no bytes; wrappers
# never reach a kernel that reads it). Under tracing, dispatch modes and functorch transforms
# every wrapper is built as before: sizes there may be symbolic and fake tensors track storages.
# A template made under ``inference_mode`` is an inference tensor, as its copies are: templates are
# kept apart by the mode they were made in (a normal wrapper of an inference template would have no
# version counter, and the values path would read stale values after a write).

_DisableTF = torch._C.DisableTorchFunctionSubclass
_PYTHON_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.PythonTLSSnapshot)
_BelowAutograd = torch._C._AutoDispatchBelowADInplaceOrView
_make_subclass = torch.Tensor._make_subclass
_detach = torch._C._VariableFunctions.detach


def _built(cls, partition: Partition, key, geometry, dtype, device, requires_grad: bool):
    """``(wrapper, size, stride)``: a wrapper of ``cls`` without values yet, of the sizes and strides
    that ``key`` fixes within ``partition`` (``geometry()``: ``(size, stride, stored)``, asked on the
    first build only). Eager only (NOTE [ Building a wrapper ])."""
    cache = partition.cache
    hit = cache.get(key)
    if hit is not None and hit[3] is not None:
        with _BelowAutograd():
            r = _make_subclass(cls, hit[3], requires_grad, dispatch_sizes_strides_policy="strides")  # type: ignore[call-arg]
        return r, hit[0], hit[1]
    size, stride, stored = geometry() if hit is None else hit[:3]
    with _DisableTF():
        r = _new_wrapper(cls, size, stored, dtype, device, requires_grad)
    if hit is None:  # the structure's first wrapper: no template unless a second one is built
        cache[key] = (size, stride, stored, None)
    else:
        with _DisableTF(), _BelowAutograd(), torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEYS):
            cache[key] = (size, stride, stored, _detach(r))
    return r, size, stride


def _new_wrapper(cls, size, stride, dtype, device, requires_grad):
    return torch.Tensor._make_wrapper_subclass(
        cls,
        size,
        stride,
        0,
        torch.contiguous_format,
        dtype,
        torch.strided,
        device,
        False,
        requires_grad,
        # sizes, dim and numel are answered in C++ from the stored size; strides and
        # contiguity come from Python (NOTE [ Subclass mechanism ]). numel, which C++ would
        # compute as a product of nested ints, is routed in __torch_function__ (ops/_routing.py).
        "strides",
        False,
        False,
        # The wrapper owns no storage; a size computed from nested-int sizes would fail.
        storage_size=0,
    )
