"""The ``torch.nested`` integration: ``nested_tensor``, ``as_nested_tensor``, ``to_padded_tensor``
and ``narrow`` take ``layout=torch.multi_jagged`` (and ``torch.multi_jagged`` names the layout);
every other layout goes to torch's own function, unchanged."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from . import _frames
from .constructors import as_nested_tensor, nested_tensor, to_padded_tensor
from .jagged_views import narrow
from .layout import multi_jagged
from .structure import _is_traced
from .tensor import MultiJaggedTensor

__all__: list[str] = []


_ORIGINAL: dict[str, Callable[..., Any]] = {}


def _install() -> None:
    """Teach ``torch.nested`` the ``multi_jagged`` layout; other layouts are untouched."""
    if _ORIGINAL:
        return
    tn = torch.nested
    for name in ("nested_tensor", "as_nested_tensor", "to_padded_tensor", "narrow"):
        _ORIGINAL[name] = getattr(tn, name)

    @functools.wraps(_ORIGINAL["nested_tensor"])
    def nested_tensor_(tensor_list, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
        if layout is multi_jagged:
            return nested_tensor(tensor_list, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)
        return _ORIGINAL["nested_tensor"](
            tensor_list, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad, pin_memory=pin_memory
        )

    @functools.wraps(_ORIGINAL["as_nested_tensor"])
    def as_nested_tensor_(ts, dtype=None, device=None, layout=None):
        if layout is multi_jagged:
            return as_nested_tensor(ts, dtype=dtype, device=device)
        return _ORIGINAL["as_nested_tensor"](ts, dtype=dtype, device=device, layout=layout)

    @functools.wraps(_ORIGINAL["to_padded_tensor"])
    def to_padded_tensor_(input, padding, output_size=None, out=None):
        if isinstance(input, MultiJaggedTensor):
            if out is not None:
                raise NotImplementedError("to_padded_tensor(): out= is not supported for layout torch.multi_jagged")
            return to_padded_tensor(input, padding, output_size)
        if out is None:
            return _ORIGINAL["to_padded_tensor"](input, padding, output_size)
        return _ORIGINAL["to_padded_tensor"](input, padding, output_size, out=out)

    @functools.wraps(_ORIGINAL["narrow"])
    def narrow_(tensor, dim, start, length, layout=torch.strided):
        if layout is multi_jagged:
            if any(_is_traced(t) for t in (tensor, start, length) if isinstance(t, torch.Tensor)):
                # dynamo puts ``torch.nested.narrow`` in its graph and runs it on fake tensors:
                # refuse, and it breaks the graph here (NOTE [ Constructors under torch.compile ])
                raise NotImplementedError(narrow._torchdynamo_disable_msg)  # type: ignore[attr-defined]
            return narrow(tensor, dim, start, length, layout)
        return _ORIGINAL["narrow"](tensor, dim, start, length, layout=layout)

    # its eager call at that break runs as it is, uncompiled, as ``narrow``'s own
    _frames.skip_code_now(narrow_.__code__, recursive=True)

    tn.narrow = narrow_
    tn.nested_tensor = nested_tensor_
    tn.as_nested_tensor = as_nested_tensor_
    tn.to_padded_tensor = to_padded_tensor_
    torch.multi_jagged = multi_jagged  # type: ignore[attr-defined]
