"""The ``*_copy`` variants of the view ops (``torch.transpose_copy``, ``torch.select_copy``, …):
what functionalization and ``torch.export`` write for a view. Each is its view op on this layout
(every structure the view takes, ragged dims included), materialised as a new tensor in the
contiguous memory format, as dense torch's: a write into the result never reaches the input, and
a sequence result (``unbind_copy``, ``split_copy``) is a tuple of such tensors."""

from __future__ import annotations

from typing import Callable

import torch

from .._common import MJT
from .._routing import route

__all__: list[str] = []


def _materialised(result):
    if isinstance(result, (list, tuple)):
        return tuple(_materialised(r) for r in result)
    return result.clone(memory_format=torch.contiguous_format)


def _copy_of(name: str, view: Callable) -> Callable:
    """The route of the ``*_copy`` op ``name`` whose view is ``view(input, *args, **kwargs)``."""

    def routed(input, *args, **kwargs):
        if not isinstance(input, MJT):
            return NotImplemented
        if kwargs.pop("out", None) is not None:
            raise NotImplementedError(f"{name}(): out= variants are not supported for layout torch.multi_jagged")
        return _materialised(view(input, *args, **kwargs))

    return routed


def _slice(input, dim=0, start=None, end=None, step=1):
    if not isinstance(dim, int):
        raise TypeError(f"slice_copy(): expected an int dim, got {type(dim).__name__}")
    return input[(slice(None),) * (dim % input.dim()) + (slice(start, end, step),)]


def _squeeze(input, dim=None):
    return input.squeeze() if dim is None else input.squeeze(dim)


def _view(input, *size):
    # ``view_copy(x, dtype)`` and ``view_copy(x, size)``, as ``Tensor.view``
    return input.view(*size)


def _expand(input, size, *, implicit=False):
    return input.expand(size)


_VIEWS = {
    torch.alias_copy: lambda input: input,
    torch.detach_copy: torch.detach,
    torch.diagonal_copy: torch.diagonal,
    torch.expand_copy: _expand,
    torch.narrow_copy: torch.narrow,
    torch.Tensor.narrow_copy: torch.narrow,
    torch.permute_copy: torch.permute,
    torch.select_copy: torch.select,
    torch.slice_copy: _slice,
    torch.split_copy: torch.split,
    torch.split_with_sizes_copy: torch.split_with_sizes,
    torch.squeeze_copy: _squeeze,
    torch.t_copy: torch.t,
    torch.transpose_copy: torch.transpose,
    torch.unbind_copy: torch.unbind,
    torch.unfold_copy: torch.Tensor.unfold,
    torch.unsqueeze_copy: torch.unsqueeze,
    torch.view_as_complex_copy: torch.view_as_complex,
    torch.view_as_real_copy: torch.view_as_real,
    torch.view_copy: _view,
}

for _op, _view_op in _VIEWS.items():
    route(_op)(_copy_of(_op.__name__, _view_op))
