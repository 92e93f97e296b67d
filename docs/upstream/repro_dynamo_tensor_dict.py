"""Dynamo fails with an internal error on ``t.__dict__`` of a traceable tensor subclass.

``torch.compile(lambda t: (t.sin(), len(t.__dict__)))`` on torch.jagged (or any traceable
wrapper subclass) raises ``InternalTorchDynamoError: AttributeError: 'dict' object has no
attribute 'node'`` instead of tracing or graph-breaking. A layout's own code reads its
instance dict (its metadata); after any graph break in a user's model, dynamo's frame hook
compiles such library frames as top-level frames and hits this, so the user gets an internal
error rather than the eager fallback the break intended.
"""
import torch
from _repro import case, control, report
from _toys import jagged

x = jagged(2, 3)


def compiled(fn):
    def run():
        torch._dynamo.reset()
        torch.compile(fn, backend="eager")(x)
    return run


control("the same function without __dict__", compiled(lambda t: t.sin()))
case("t.__dict__ of torch.jagged under torch.compile", compiled(lambda t: (t.sin(), len(t.__dict__))),
     "'dict' object has no attribute 'node'")
report()
