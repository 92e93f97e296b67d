"""The aten op table: one handler per aten overload, registered with a schema string.

NOTE [ Op table ]

``register_multi_jagged_func(aten_ops, "self: mjt, other: any?, ...")`` files a handler for each
overload in ``aten_ops``. The schema string lists positional arguments as ``name: kind`` with
kind ``mjt`` (a MultiJaggedTensor), ``t`` (a dense tensor), ``any``; a trailing ``?`` makes an
argument optional and a final ``...`` admits further unchecked arguments. Handlers are named
after the aten overload (``sum_dim_IntList``) and receive ``(func, *args, **kwargs)``.

Lookup (``dispatch``, which ``MultiJaggedTensor.__torch_dispatch__`` calls: NOTE [ Handler
lookup ] in tensor.py): the metadata queries in ``FAST`` (``shape/metadata.py`` fills it), the
table, then the pointwise tag (the fallback ``elementwise/pointwise.py`` registers with
``register_pointwise_fallback``), a composite's decomposition, then ``NotImplementedError`` naming
the op and the layout. There is no per-sample fallback. This module imports no family: families
register into it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..tensor import _FORWARD_AD, MultiJaggedTensor

__all__ = ["register_multi_jagged_func", "register_pointwise_fallback", "dispatch", "MULTI_JAGGED_OPS", "FAST", "op_name"]

MULTI_JAGGED_OPS: dict[Any, tuple[Callable, "_Schema"]] = {}
# One-argument metadata queries (sym_size, dim, …) that autograd and the dispatcher ask on every
# op, looked up before the schema check.
FAST: dict[Any, Callable[[Any], Any]] = {}


def op_name(func) -> str:
    name = getattr(func, "__name__", str(func))
    return name[: -len(".default")] if name.endswith(".default") else name


_KINDS: dict[str, Callable[[Any], bool]] = {
    "mjt": lambda x: isinstance(x, MultiJaggedTensor),
    "t": lambda x: isinstance(x, torch.Tensor) and not isinstance(x, MultiJaggedTensor),
    "any": lambda x: True,
}
_DESC = {"mjt": "a multi_jagged tensor", "t": "a dense tensor", "any": "anything"}


class _Schema:
    """A parsed schema string; ``check`` is the per-call cost, so it is kept to a loop."""

    __slots__ = ("args", "min_args", "variadic", "text")

    def __init__(self, text: str) -> None:
        parts = [p.strip() for p in text.split(",")]
        self.variadic = parts[-1] == "..."
        if self.variadic:
            parts = parts[:-1]
        self.args = []
        for p in parts:
            name, kind = (s.strip() for s in p.split(":"))
            optional = kind.endswith("?")
            kind = kind.rstrip("?")
            if kind not in _KINDS:
                raise AssertionError(f"unknown argument kind {kind!r} in schema {text!r}")
            self.args.append((name, kind, optional))
        self.min_args = sum(not opt for _, _, opt in self.args)
        self.text = text

    def check(self, func, args: Sequence[Any]) -> None:
        n = len(args)
        if n < self.min_args or (n > len(self.args) and not self.variadic):
            raise TypeError(
                f"{op_name(func)}(): expected {self.min_args} to {len(self.args)} positional "
                f"arguments ({self.text}), got {n}"
            )
        for (name, kind, optional), a in zip(self.args, args):
            if kind == "any" or (optional and a is None):
                continue
            if not _KINDS[kind](a):
                if kind == "mjt" and isinstance(a, torch.Tensor):
                    # a dense tensor where this op's multi_jagged form reads a multi_jagged one: the
                    # combination is what is missing, not a wrong argument of the user's
                    raise TypeError(
                        f"{op_name(func)}(): a dense {name} {tuple(a.shape)} with multi_jagged operands is not "
                        "supported for layout torch.multi_jagged (this op takes a multi_jagged "
                        f"{name}: {self.text})"
                    )
                raise TypeError(
                    f"{op_name(func)}(): expected {name} to be {_DESC[kind]}, got "
                    f"{type(a).__name__} for layout torch.multi_jagged"
                )


def register_multi_jagged_func(aten_ops, schema: str):
    """Decorator: file ``handler(func, *args, **kwargs)`` for every overload in ``aten_ops``."""
    if not isinstance(aten_ops, (list, tuple)):
        aten_ops = [aten_ops]
    parsed = _Schema(schema)

    def wrapper(handler):
        for op in aten_ops:
            if op in MULTI_JAGGED_OPS:
                raise AssertionError(f"{op} is registered twice")
            MULTI_JAGGED_OPS[op] = (handler, parsed)
        return handler

    return wrapper


_POINTWISE: dict[Any, bool] = {}  # func.tags builds a list per access


def _no_pointwise(func, *args, **kwargs):
    raise NotImplementedError(f"{op_name(func)}(): the pointwise family is not loaded")


_pointwise = _no_pointwise


def register_pointwise_fallback(fn):
    """Decorator: ``fn(func, *args, **kwargs)`` handles every op tagged ``torch.Tag.pointwise``
    that has no handler of its own (``elementwise/pointwise.py``)."""
    global _pointwise
    _pointwise = fn
    return fn


def _in_place_of_pointwise(func) -> bool:
    """``func`` is the in-place form of an op tagged pointwise (``abs_`` of ``abs``, ``copysign_.Scalar``
    of ``copysign.Scalar``): torch 2.13 tags some in-place forms ``inplace`` only (``abs_``, ``gcd_``,
    ``heaviside_``, ``gelu_``, ``threshold_``, …); they are as elementwise as their functional forms."""
    if not isinstance(func, torch._ops.OpOverload):
        return False
    schema = func._schema
    base = schema.name.split("::")[-1]
    if not base.endswith("_") or base.endswith("__") or not schema.arguments or schema.arguments[0].alias_info is None \
            or not schema.arguments[0].alias_info.is_write:
        return False
    functional = getattr(getattr(torch.ops.aten, base[:-1], None), func._overloadname, None)
    return isinstance(functional, torch._ops.OpOverload) and torch.Tag.pointwise in functional.tags


_COMPOSITE: dict[Any, bool] = {}


def _composite(func) -> bool:
    hit = _COMPOSITE.get(func)
    if hit is None:
        hit = _COMPOSITE[func] = isinstance(func, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
        )
    return hit


def dispatch(func, args, kwargs):
    if len(args) == 1 and not kwargs:
        fast = FAST.get(func)
        if fast is not None:
            return fast(args[0])
    entry = MULTI_JAGGED_OPS.get(func)
    if entry is not None:
        handler, schema = entry
        schema.check(func, args)
        return handler(func, *args, **kwargs)
    is_pointwise = _POINTWISE.get(func)
    if is_pointwise is None:
        is_pointwise = _POINTWISE[func] = torch.Tag.pointwise in func.tags or _in_place_of_pointwise(func)
    if is_pointwise:
        return _pointwise(func, *args, **kwargs)
    if _composite(func):
        # A composite op reaches dispatch intact when the autograd keys are off (inference_mode);
        # elsewhere it decomposes before dispatch. Decompose it here the same way.
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    if any(a.is_out for a in func._schema.arguments):  # as the pointwise fallback says (NOTE [ Route arguments ])
        raise NotImplementedError(f"{op_name(func)}(): out= variants are not supported for layout torch.multi_jagged")
    if func in (torch.ops.aten._make_dual.default, torch.ops.aten._has_same_storage_numel.default):
        raise NotImplementedError(_FORWARD_AD)
    raise NotImplementedError(
        f"{op_name(func)}(): not supported for layout torch.multi_jagged "
        "(no handler in the op table; see CONTRIBUTING.md to add one)"
    )
