"""``nearest`` interpolation with a scale that keeps the size: kernels disagree.

With ``scale_factor`` given and ``floor(n·s) == n`` (n = 9, s = 1.1), the source index is
``floor(dst · (1/s))``, which repeats pixel 0 and drops the last one. Some kernels instead take
an ``out == in`` shortcut and copy:

* forward, 2-d: the per-channel CPU kernel (taken when ``out_h + out_w <= 128``) copies; the
  generic kernel (larger images) does not — the same row resamples differently depending on the
  image's height;
* 1-d: the forward (generic kernel) picks ``(x0, x0, x1)`` for n = 3, s = 1.3, but the backward
  returns the cotangent unchanged, so the gradient is not the forward's adjoint.

(``nearest-exact`` is consistent.) Fixed when both agree.
"""
import torch
import torch.nn.functional as F
from _repro import case, report


def forward_independent_of_height():
    row = torch.arange(9.0).view(1, 1, 1, 9)
    small = F.interpolate(row, scale_factor=(1.0, 1.1), mode="nearest")[0, 0, 0]
    tall = F.interpolate(row.expand(1, 1, 120, 9).contiguous(), scale_factor=(1.0, 1.1), mode="nearest")[0, 0, 0]
    if not torch.equal(small, tall):
        return f"one row, height 1: {small.tolist()}; height 120: {tall.tolist()}"


def backward_is_adjoint():
    x = torch.arange(3.0).view(1, 1, 3).requires_grad_()
    y = F.interpolate(x, scale_factor=1.3, mode="nearest")
    picks = y.detach().flatten().long()
    g = torch.tensor([1.0, 10.0, 100.0])
    (gx,) = torch.autograd.grad(y, x, g.view(1, 1, 3))
    adjoint = torch.zeros(3).index_add_(0, picks, g)
    if not torch.equal(gx.flatten(), adjoint):
        return f"forward picks {picks.tolist()}; backward {gx.flatten().tolist()}, adjoint {adjoint.tolist()}"


case("2-d nearest, one row at two heights", forward_independent_of_height, "height")
case("1-d nearest, backward against the forward's adjoint", backward_is_adjoint, "forward picks")
report()
