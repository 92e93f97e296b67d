"""``__torch_function__`` routes: composite ops whose decomposition would reshape across ragged
dims, or whose aten derivative cannot handle ragged sizes, are sent to ops that reach
``__torch_dispatch__`` intact. A route only *routes*: it calls other torch functions and never
touches packed values. Returning ``NotImplemented`` falls back to the ordinary call.

See NOTE [ Subclass mechanism ] in ``tensor.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..compile import library  # noqa: F401
from . import dispatch as _dispatch
from ._common import MJT, canonical_dim

mj = torch.ops.multijagged

ROUTES: dict[Any, Callable[..., Any]] = {}


def route(*funcs):
    def wrapper(fn):
        for f in funcs:
            ROUTES[f] = fn
        return fn

    return wrapper


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, MJT)


def _call(op, *args):
    """Call a ``multijagged::`` op, skipping torch.library's Python autograd wrapper when no
    argument needs a gradient (it was half of ``linear``'s eager overhead). Under dynamo the
    plain call is traced: the wrapper costs nothing in a compiled graph."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
    ):
        return op(*args)
    # Below autograd, with no dispatch mode active, the dispatcher would only forward the call to
    # MultiJaggedTensor.__torch_dispatch__: go to the op table directly.
    return _dispatch(op, args, {})


@route(F.linear, torch._C._nn.linear)
def _linear(input, weight, bias=None):
    if isinstance(input, MJT) and _dense(weight) and (bias is None or _dense(bias)):
        return _call(mj.linear.default, input, weight, bias)
    return NotImplemented


@route(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul(input, other, *, out=None):
    if out is None and isinstance(input, MJT) and _dense(other) and other.dim() == 2:
        return _call(mj.linear.default, input, other.t(), None)
    return NotImplemented


def _reduction_route(kind: str):
    def routed(input, dim=None, keepdim=False, *, dtype=None):
        if not isinstance(input, MJT) or dtype is not None:
            return NotImplemented
        if dim is None:
            return mj.reduce.default(input, kind, None, False)
        dims = [dim] if isinstance(dim, int) else list(dim)
        canon = {canonical_dim(kind, input.dim(), d) for d in dims}
        # Dense results (every ragged dim reduced) and means over ragged dims: aten's backward
        # would expand a dense grad to nested-int sizes or divide by a nested int.
        if (0 in canon or set(input._ragged_dims) <= canon) or (kind == "mean" and canon & set(input._ragged_dims)):
            return mj.reduce.default(input, kind, sorted(canon), keepdim)
        return NotImplemented

    return routed


route(torch.sum, torch.Tensor.sum)(_reduction_route("sum"))
route(torch.mean, torch.Tensor.mean)(_reduction_route("mean"))


@route(torch.unbind, torch.Tensor.unbind)
def _unbind(input, dim=0):
    if isinstance(input, MJT) and dim == 0:
        return tuple(mj.unbind.default(input))
    return NotImplemented


@route(torch.Tensor.__getitem__)
def _getitem(input, index):
    if isinstance(input, MJT) and isinstance(index, int):
        b = input._partition.batch
        if not -b <= index < b:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {b}")
        return mj.unbind.default(input)[index]
    return NotImplemented


@route(torch.select, torch.Tensor.select)
def _select(input, dim, index):
    if isinstance(input, MJT) and isinstance(dim, int) and canonical_dim("select", input.dim(), dim) == 0:
        return _getitem(input, index)
    return NotImplemented


@route(F.group_norm)
def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Per component ``(n, C, *rest)``: dim 0 of the component is group_norm's batch, so on the
    packed values ``(T, C, *rest)`` it is exactly ``group_norm`` — valid when the only ragged dim
    is dim 1."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input._ragged_dims != (1,):
        raise ValueError(
            f"group_norm(): expected components (n, C, *) with only dim 1 ragged, got ragged dims "
            f"{input._ragged_dims} for layout torch.multi_jagged"
        )
    from ..bridge import values_of, wrap_values_like

    return wrap_values_like(F.group_norm(values_of(input), num_groups, weight, bias, eps), input)
