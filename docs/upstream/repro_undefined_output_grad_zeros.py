"""An output that receives no gradient is materialised as ``at::zeros(sizes)``: not for nested ints.

When an ``autograd.Function`` with several outputs gets no gradient for one of them, the C++
``PyNode`` materialises it with ``VariableInfo::zeros`` → ``at::zeros(sym_sizes)``, a factory
that cannot take nested-int sizes ("SymIntArrayRef expected to contain only concrete
integers"). ``python_function.cpp`` uses ``zeros_like`` instead only when
``output.is_nested()`` — the C++ ``NestedTensor`` key, which a Python subclass other than
torch.jagged's cannot carry (see ``repro_is_nested.py``). Two places hit it:

* eagerly, any multi-output ``autograd.Function`` on such tensors, unless it calls
  ``ctx.set_materialize_grads(False)``;
* under ``torch.compile``, a compiled region that returns a subclass tensor the loss does not
  use: AOTAutograd's ``CompiledFunction`` is such an autograd.Function and materialises
  (there is no user-side switch).

The toy subclass in ``_repro.py`` is a ragged layout without the NestedTensor key (torch.jagged
itself passes both cases, through ``zeros_like``).
"""
import torch
from _repro import case, control, report
from _toys import Values, ragged


class TwoOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.sin(), t.cos()

    @staticmethod
    def backward(ctx, grad_sin, grad_cos):
        return grad_sin + grad_cos


def eager_function_one_output_unused():
    x, _ = ragged([2, 3])
    a, _ = TwoOutputs.apply(x)
    Values.apply(a).sum().backward()


def both(t):
    y = t.sin()
    return y, Values.apply(y * y).sum()


def compiled_region_unused_output():
    x, _ = ragged([2, 3])
    _, loss = torch.compile(both, backend="aot_eager", fullgraph=True)(x)
    loss.backward()


def compiled_loss_only():
    x, _ = ragged([2, 3])
    torch.compile(lambda t: both(t)[1], backend="aot_eager", fullgraph=True)(x).backward()


control("the compiled region returning the loss only", compiled_loss_only)
control("eager, every output used", lambda: sum(Values.apply(o).sum() for o in TwoOutputs.apply(ragged([2, 3])[0])).backward())
case("eager autograd.Function, one of two outputs unused", eager_function_one_output_unused, "concrete integers")
case("compiled region (aot_eager) returning an unused subclass output", compiled_region_unused_output, "concrete integers")
report()
