"""``torch.func.grad`` with tensor subclasses whose sizes hold nested ints.

Two observations:

* Inside a functorch transform the input is wrapped in a C++ ``TensorWrapper``, so a
  subclass's ``__torch_function__`` is never called for ops on it: a layout that routes
  composite ops there (a reduction over a ragged dim to its own op with its own derivative) is
  bypassed, and aten's formulas run instead.
* torch.jagged itself fails under ``torch.func.grad`` where plain ``torch.autograd.grad`` of the
  same function works: wrapped, the tensor no longer looks nested to its derivative formulas
  (``values()``: "values backward with respect to self with layout Strided";
  ``to_padded_tensor``: ``aten._nested_tensor_size``).
"""
import typing

import torch
from _repro import case, control, report
from _toys import Wrapper, jagged


class Seen(Wrapper):
    calls: typing.ClassVar[list] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def torch_function_seen_under_grad():
    Seen.calls.clear()
    torch.func.grad(lambda t: t.sin().sum())(Seen(torch.randn(3)))
    if "sin" not in Seen.calls:
        return f"__torch_function__ saw {Seen.calls or 'nothing'} inside torch.func.grad"


LOSSES = {
    "values().sum()": (lambda t: t.sin().values().sum(), "layout Strided"),
    "to_padded_tensor().sum()": (lambda t: torch.nested.to_padded_tensor(t.sin(), 0.0).sum(), "_nested_tensor_size"),
}


def autograd_grad_on_jagged():
    for loss, _ in LOSSES.values():
        x = jagged(2, 3, requires_grad=True)
        torch.autograd.grad(loss(x), x)


control("torch.autograd.grad of the same functions on torch.jagged", autograd_grad_on_jagged)
case("__torch_function__ of a subclass under torch.func.grad", torch_function_seen_under_grad, "saw")
for name, (loss, expect) in LOSSES.items():
    case(f"torch.func.grad of {name} on torch.jagged", lambda loss=loss: torch.func.grad(loss)(jagged(2, 3)), expect)
report()
