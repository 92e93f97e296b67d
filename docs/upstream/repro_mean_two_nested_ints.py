"""``mean`` over a static dim records the input's numel: a product of two nested ints.

A tensor with two ragged dims ``(B, j0, j1, C)`` — rectangular pairs, ragged images — has no
``numel()``: ``NestedIntNode.mul`` accepts constants only (``j0 * j1`` raises ``ValueError:
unsupported``), eagerly and under fake tensors (whose symbolic nested ints carry the same node
as hint). aten's ``mean.dim`` derivative captures ``self.sym_numel()`` when the op is recorded
(``mean_backward(grad, self.sym_sizes(), dim, self.sym_numel(), keepdim)``) although, for a
reduction over given dims, ``mean_backward`` divides by the product of the *reduced* sizes only
(``_safe_size``). So ``x.mean(-1)`` over the static dim fails as soon as ``x`` requires grad.
Fixed when that works; the product itself is ``repro_nested_int_arithmetic.py``.
"""

from _repro import case, control, report
from _toys import ragged


def mean_static_dim(requires_grad):
    def run():
        x, _ = ragged([2, 3], [1, 2], requires_grad=requires_grad)  # (2, j0, j1, 4)
        y = x.mean(-1)
        if tuple(y.shape) != tuple(x.shape[:-1]):
            return f"shape {tuple(y.shape)}"
    return run


control("mean(-1) without grad", mean_static_dim(False))
control("sum(-1) with grad (its derivative needs no numel)",
        lambda: ragged([2, 3], [1, 2])[0].sum(-1))
case("mean(-1) over the static dim of (B, j0, j1, C) with grad", mean_static_dim(True), "unsupported")
report()
