"""The list ops optimizers run (``torch.optim``'s ``foreach`` implementations: ``_foreach_add_``,
``_foreach_lerp_``, ``_foreach_addcdiv_``, ``_foreach_norm`` …, and the ``fused`` kernels
``_fused_adam_`` / ``_fused_adamw_`` / ``_fused_sgd_`` / ``_fused_adagrad_``) on lists that hold
multi_jagged tensors: elementwise per list position, so each runs on the packed values, every
position's tensors of one structure (a parameter, its gradient, its optimizer states) or a
number-like dense tensor (a step count); results of a multi_jagged position are wrapped back.
``foreach`` is the default on CUDA, ``fused`` on request. Also what the single-tensor steps and
``GradScaler`` need beyond them: ``torch.maximum(a, b, out=a)`` (``amsgrad``, Adamax) into a
multi_jagged ``out``, the scaler's ``_amp_foreach_non_finite_check_and_unscale_``, and a refusal
of ``Adafactor``, whose step would be wrong for a ragged dim among a parameter's last two."""

from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ...errors import StructureError
from .._common import MJT, describe, wrap
from .._routing import castable, route
from .._table import op_name, register_multi_jagged_func
from ...writes import written_args

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
    _bump_written(func, args, kwargs)
    return _rewrap(out, first)


def _bump_written(func, args, kwargs) -> None:
    """The version counters of the multi_jagged tensors a list op wrote: autograd bumps a single
    tensor's for its in-place op (``x.add_(1)``), not a list's elements here, and a backward that
    saved one must raise after the write (an optimizer step or EMA update between forward and
    backward), as dense torch's does — the dispatcher bumps their values' counters (``record_write``)."""
    pos, names = written_args(func)
    for t in [args[i] for i in pos if i < len(args)] + [kwargs[n] for n in names if n in kwargs]:
        for x in t if isinstance(t, (list, tuple)) else (t,):
            if isinstance(x, MJT):
                with torch._C.DisableTorchFunctionSubclass():
                    if not x.is_inference():
                        torch.autograd.graph.increment_version(x)


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


_FUSED = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_",
          "_amp_foreach_non_finite_check_and_unscale_")  # (``GradScaler``'s unscale of the gradients)


register_multi_jagged_func(_list_ops(), "tensors: any, ...")(foreach_default)


def _extreme_out(name: str):
    dense = getattr(torch, name)

    def routed(input, other, *, out=None):
        """``torch.maximum(a, b, out=a)`` (Adam's ``amsgrad`` and Adamax's single-tensor steps) into a
        multi_jagged ``out``: the op, then written into ``out`` (its structure, dense's cast)."""
        if out is None or not isinstance(out, MJT):
            return NotImplemented
        return out.copy_(castable(dense(input, other), out.dtype))

    return routed


for _name in ("maximum", "minimum", "fmax", "fmin"):
    route(getattr(torch, _name))(_extreme_out(_name))


def _refuse_adafactor(optimizer, args, kwargs) -> None:
    """``Adafactor`` divides the norms of a gradient over its last two dims by their sizes as
    numbers (``grad.size(-2)``): a ragged one reaches it as a placeholder, and the step would be
    silently wrong, so it raises (an optimizer step pre-hook, run for every optimizer: a type test)."""
    if type(optimizer).__name__ != "Adafactor":
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(p, MJT) and any(d >= p.dim() - 2 for d in p._ragged_dims):
                raise NotImplementedError(
                    f"Adafactor.step(): a multi_jagged parameter {describe(p)} with a ragged dim among its last two "
                    "(Adafactor divides by their sizes as numbers, which a ragged dim does not have) is not supported "
                    "for layout torch.multi_jagged; use another optimizer, or keep those dims static")


register_optimizer_step_pre_hook(_refuse_adafactor)
