"""Dynamo cannot read any attribute of a traceable subclass that defines ``__getattr__``.

A wrapper subclass with a ``__getattr__`` fallback (for lazily computed metadata) loses all
attribute access under ``torch.compile``: ``t.inner`` — an inner tensor named by
``__tensor_flatten__`` and present in the instance dict — becomes an opaque ``GetAttrVariable``
("Unsupported python_type() call"; inside an ``autograd.Function``: "Dynamo does not know how
to trace method `view_as` of class `<unknown type>`"). Python's own lookup never reaches
``__getattr__`` for that name.
"""
import torch
from _repro import case, control, report
from _toys import Wrapper


class WithGetattr(Wrapper):
    def __getattr__(self, name):  # e.g. metadata computed on first use
        raise AttributeError(name)


def read_inner(cls):
    def run():
        torch._dynamo.reset()
        torch.compile(lambda t: t.inner * 2, backend="eager", fullgraph=True)(cls(torch.randn(3)))
    return run


control("the same subclass without __getattr__", read_inner(Wrapper))
case("t.inner of a subclass with __getattr__", read_inner(WithGetattr), "Unsupported")
report()
