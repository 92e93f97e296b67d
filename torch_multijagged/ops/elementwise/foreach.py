"""The list ops optimizers run (``torch.optim``'s ``foreach`` implementations: ``_foreach_add_``,
``_foreach_lerp_``, ``_foreach_addcdiv_``, ``_foreach_norm`` …, and the ``fused`` kernels
``_fused_adam_`` / ``_fused_adamw_`` / ``_fused_sgd_`` / ``_fused_adagrad_``) on lists that hold
multi_jagged tensors: elementwise per list position, so each runs on the packed values, every
position's tensors of one structure (a parameter, its gradient, its optimizer states) or a
number-like dense tensor (a step count); results of a multi_jagged position are wrapped back.
``foreach`` is the default on CUDA, ``fused`` on request."""

from __future__ import annotations

import torch

from ...errors import StructureError
from .._common import MJT, describe, wrap
from .._table import op_name, register_multi_jagged_func

aten = torch.ops.aten


def _positions(func, args, kwargs) -> list:
    """The multi_jagged tensor at each position of the op's tensor lists (None where none), after
    checking that every tensor at a multi_jagged position shares its structure or is one number."""
    lists = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) and a
             and any(isinstance(t, torch.Tensor) for t in a)]
    if not lists:
        return []
    n = len(lists[0])
    first: list = [None] * n
    for lst in lists:
        for i, t in enumerate(lst[:n]):
            if not isinstance(t, MJT):
                continue
            m = first[i]
            if m is None:
                first[i] = t
            elif t._ragged_dims != m._ragged_dims or not t._partition.same_as(m._partition):
                raise StructureError(f"{op_name(func)}(): the tensors at list position {i} have different structures, "
                                     f"{describe(m)} and {describe(t)}")
    for lst in lists:
        for i, t in enumerate(lst[:n]):
            if first[i] is not None and isinstance(t, torch.Tensor) and not isinstance(t, MJT) and t.numel() != 1:
                raise StructureError(f"{op_name(func)}(): a dense {tuple(t.shape)} beside the multi_jagged "
                                     f"{describe(first[i])} at list position {i}: only one-number tensors mix with it")
    return first


def _unwrap(a):
    if isinstance(a, MJT):
        return a._values
    if isinstance(a, (list, tuple)):
        return type(a)(_unwrap(x) for x in a)
    return a


def _rewrap(out, first: list):
    if isinstance(out, (list, tuple)) and len(out) == len(first):
        return type(out)(wrap(o, m._partition, m._ragged_dims) if m is not None and isinstance(o, torch.Tensor)
                         and o.shape == m._values.shape else o for o, m in zip(out, first))
    return out


def foreach_default(func, *args, **kwargs):
    """``func`` on the packed values of every multi_jagged tensor in its lists (module docstring)."""
    first = _positions(func, args, kwargs)
    out = func(*_unwrap(args), **_unwrap(kwargs))
    return _rewrap(out, first)


def _list_ops():
    """Every overload of the list ops (aten's registered schemas: its namespace lists ops lazily)."""
    ops = []
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name.split("::")[-1]
        if schema.name.startswith("aten::") and (name.startswith("_foreach_") or name in _FUSED):
            packet = getattr(aten, name)
            op = getattr(packet, schema.overload_name or "default")
            if op not in ops:
                ops.append(op)
    return ops


_FUSED = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_")


register_multi_jagged_func(_list_ops(), "tensors: any, ...")(foreach_default)
