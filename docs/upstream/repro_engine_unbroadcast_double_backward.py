"""Double backward through the autograd engine's un-broadcast of a dense operand.

``y = op(x, w)`` with ``x`` ragged ``(B, j0, C)`` and a dense ``w`` ``(C,)`` that requires grad:
``w``'s gradient comes back ragged, and the engine reduces it to ``w``'s shape itself
(``validate_outputs`` → ``InputMetadata::reduce_grad`` → ``at::sum_to``). Under
``create_graph=True`` that ``sum`` is recorded; its derivative (``sum_backward``) expands the
*dense* gradient-of-gradient to ``self.sym_sizes()`` — nested-int sizes, which a dense tensor
cannot take ("SymIntArrayRef expected to contain only concrete integers"). The expand's only
tensor argument is dense, so no subclass handler can intercept it, and the call happens inside
the C++ engine. The toy subclass in ``_repro.py`` is a ragged layout without the NestedTensor
key (torch.jagged fails here too, at ``aten._nested_sum_backward``, which it does not
implement).
"""
import torch
from _repro import case, control, report
from _toys import Values, ragged


def double_backward(op):
    def run():
        x, _ = ragged([2, 3])
        w = torch.randn(4, requires_grad=True)
        _, gw = torch.autograd.grad(Values.apply(op(x, w)).pow(2).sum(), (x, w), create_graph=True)
        (ggw,) = torch.autograd.grad(gw.sum(), w)
        if not torch.isfinite(ggw).all():
            return f"second derivative {ggw.tolist()}"
    return run


def first_order():
    x, _ = ragged([2, 3])
    w = torch.randn(4, requires_grad=True)
    torch.autograd.grad(Values.apply(torch.atan2(x, w)).sum(), (x, w))


def double_backward_without_broadcast():
    x, _ = ragged([2, 3])
    (gx,) = torch.autograd.grad(Values.apply(x * x).pow(2).sum(), x, create_graph=True)
    torch.autograd.grad(Values.apply(gx).sum(), x)


control("first order (the engine's sum_to, not recorded)", first_order)
control("double backward with no dense operand", double_backward_without_broadcast)
case("double backward of atan2(x, w), w dense (C,) requiring grad", double_backward(torch.atan2), "concrete integers")
case("double backward of x * w, w dense (C,) requiring grad", double_backward(torch.mul), "concrete integers")
report()
