"""Factories cannot take nested ints: no tensor argument reaches a subclass handler.

``torch.ones(x.shape)``, ``torch.zeros(x.shape)``, ``torch.full(x.shape, v)``,
``torch.arange(x.shape[1])`` receive only sizes. For a ragged tensor (torch.jagged here) those
hold a nested int, which the dense kernels refuse ("SymIntArrayRef expected to contain only
concrete integers"; ``arange``: "'NestedIntNode' object has no attribute 'guard_int'"), and no
``__torch_dispatch__`` / ``__torch_function__`` of the layout is consulted: the only
argument carrying the layout is the nested int itself. The same happens inside library code
(``F.embedding_bag`` builds ``torch.arange(0, numel, input.size(1))``).
"""
import torch
from _repro import case, control, report
from _toys import jagged

x = jagged(2, 3)
j = x.shape[1]


def factory(fn):
    """Fixed when the factory returns a tensor whose shape holds the nested int."""
    def run():
        out = fn()
        if j not in tuple(out.shape):
            return f"got {type(out).__name__} of shape {tuple(out.shape)}"
    return run


control("torch.ones_like(x) (a tensor argument reaches the layout)", lambda: torch.ones_like(x))
case("torch.ones(x.shape)", factory(lambda: torch.ones(x.shape)), "concrete integers")
case("torch.zeros(x.shape)", factory(lambda: torch.zeros(x.shape)), "concrete integers")
case("torch.full(x.shape, 1.0)", factory(lambda: torch.full(x.shape, 1.0)), "concrete integers")
case("torch.arange(x.shape[1])", factory(lambda: torch.arange(j)), "guard_int")
report()
