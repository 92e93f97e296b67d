"""A Python tensor subclass cannot report ``is_nested = True``.

A third-party nested layout (a traceable wrapper subclass without the ``NestedTensor`` dispatch
key) would like ``x.is_nested`` to be True, as for torch.jagged. With a Python property returning
True:

* dynamo refuses the input: ``Attempted to wrap strided NestedTensor`` (``variables/builder.py``
  accepts an ``is_nested`` tensor only if it is torch.jagged's ``NestedTensor`` class);
* the autograd API takes the C++ nested-tensor path for it (``torch.autograd._make_grads`` /
  ``_calculate_shape``: ``_nested_tensor_size()``), which a Python subclass does not have.
"""
import torch
from _repro import case, control, report
from _toys import Wrapper


class NestedWrapper(Wrapper):
    @property
    def is_nested(self):
        return True


def compiles():
    x = NestedWrapper(torch.randn(3, 4))
    torch.compile(lambda t: t.sin(), backend="eager", fullgraph=True)(x)


def autograd_reports_shape_mismatch():
    x = NestedWrapper(torch.randn(3, 4)).requires_grad_()
    try:
        torch.autograd.grad(x * 2, x, grad_outputs=torch.ones(3, 5))
    except RuntimeError as e:
        if "Mismatch in shape" in str(e):
            return None  # the ordinary error for a dense-shaped subclass
        raise
    return "a mismatched grad_output was accepted"


control("the same subclass without is_nested compiles",
        lambda: torch.compile(lambda t: t.sin(), backend="eager", fullgraph=True)(Wrapper(torch.randn(3, 4))))
case("torch.compile of an is_nested subclass", compiles, "Attempted to wrap strided NestedTensor")
case("autograd.grad shape check of an is_nested subclass", autograd_reports_shape_mismatch, "_nested_tensor_size")
report()
