"""aten derivative formulas that build tensors from sizes instead of from a tensor.

A formula that calls a factory on ``self.sym_sizes()`` (``at::zeros(sizes)``), a dense
``expand`` to those sizes, or a ``view`` to a product of them, cannot produce a ragged tensor:
no tensor argument carries the layout to its handler (``repro_factories_nested_ints.py``), and a
product of sizes with a nested int is not a size of the ragged tensor. On torch.jagged:

* ``split`` with an unused piece: ``split_backward`` fills the piece with ``zeros(sizes)``;
* ``abs`` differentiated twice: ``sgn_backward`` asks for the input's concrete sizes
  (``aten.size``);
* ``layer_norm`` differentiated twice: ``native_layer_norm_backward``'s derivative views the input
  as ``(M, N)`` with M = B·j0 (``view(): cannot view shape (2, j0, 6) as [2*j0, 6]``).

Others of the kind, for a layout whose ops run under aten's formulas: ``sum``/``mean`` to a dense
result (``sum_backward`` expands a dense gradient to nested-int sizes), ``masked_select``
(``masked_select_backward`` infers a size), ``prod`` (``prod_backward``), ``cumsum``
(``grad.sym_numel()``), ``mean`` (``repro_mean_two_nested_ints.py``).
"""
import torch
import torch.nn.functional as F
from _repro import case, control, report
from _toys import jagged


def x6():
    return jagged(2, 3, dim=6, requires_grad=True)


def split_one_piece_unused():
    a, _ = torch.split(x6(), 3, dim=-1)
    a.values().sum().backward()


def twice(fn):
    def run():
        x = x6()
        (g,) = torch.autograd.grad(fn(x).values().pow(3).sum(), x, create_graph=True)
        torch.autograd.grad(g.values().sum(), x)
    return run


def split_both_used():
    a, b = torch.split(x6(), 3, dim=-1)
    (a.values().sum() + b.values().sum()).backward()


control("split with both pieces used", split_both_used)
control("abs and layer_norm, first order", lambda: [torch.autograd.grad(f(x).values().sum(), x)
                                                    for f in (torch.abs, lambda t: F.layer_norm(t, (6,)))
                                                    for x in [x6()]])
case("torch.split(njt, 3, -1), one piece unused", split_one_piece_unused, "concrete integers")
case("abs, double backward", twice(torch.abs), "aten.size")
case("layer_norm over the static dim, double backward", twice(lambda t: F.layer_norm(t, (6,))), "cannot view shape")
report()
