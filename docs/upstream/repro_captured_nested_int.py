"""A nested int captured from outside a compiled function cannot be used inside it.

``j = x.shape[1]`` read eagerly, then used in a ``torch.compile``'d function that receives ``x``
(``t.view(t.shape[0], j, 4)``): dynamo wraps the closed-over ``SymInt`` as a
``UserDefinedObjectVariable`` and fails to put it in the graph ("Failed to convert args/kwargs
to proxy"). Reading the size inside the function works. With ``fullgraph=False`` it is a graph
break. The nested int is a function of an input (its offsets), so dynamo could proxy it as
that input's size.
"""
import torch
from _repro import case, control, report
from _toys import jagged

x = jagged(2, 3)
j = x.shape[1]


def compiled(fn):
    def run():
        torch._dynamo.reset()
        torch.compile(fn, backend="eager", fullgraph=True)(x)
    return run


control("the size read inside the function", compiled(lambda t: t.view(t.shape[0], t.shape[1], 4) * 2))
case("a nested int closed over from outside", compiled(lambda t: t.view(t.shape[0], j, 4) * 2),
     "Failed to convert args/kwargs to proxy")
report()
