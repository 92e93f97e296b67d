"""Elementwise losses (ops/losses.py) against the per-sample reference: ``reduction="none"`` per
sample, ``"sum"``/``"mean"`` over every existing element (dense torch on the concatenated
samples), gradients of input, target and the weights, every layout, a zero-length sample."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import torch_multijagged as mj

from _reference import LAYOUTS, build, components, grid, seeds, structures

LOSSES = {
    "mse": lambda x, y: F.mse_loss(x, y, reduction=RED),
    "smooth_l1": lambda x, y: F.smooth_l1_loss(x, y, reduction=RED, beta=0.7),
    "smooth_l1_beta0": lambda x, y: F.smooth_l1_loss(x, y, reduction=RED, beta=0.0),
    "huber": lambda x, y: F.huber_loss(x, y, reduction=RED, delta=0.6),
    "bce_logits": lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid(), reduction=RED),
    "bce_logits_pos_weight": lambda x, y: F.binary_cross_entropy_with_logits(
        x, y.sigmoid(), reduction=RED, pos_weight=PW),
    "l1": lambda x, y: F.l1_loss(x, y, reduction=RED),
}
RED = "mean"
PW = None


def _flat(t):
    return t.reshape(-1)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("loss", LOSSES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_loss_matches_per_sample(layout, loss, reduction):
    global RED, PW

    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        global RED, PW
        RED = reduction
        xc, yc = components(s.shapes, seed), components(s.shapes, seed + 1)
        x, xl = build(xc, s.ragged_dims, requires_grad=True)
        y, yl = build(yc, s.ragged_dims, requires_grad=True)
        pw = torch.rand(s.shapes[0][-1], dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5
        PW = pw
        out = LOSSES[loss](x, y)
        rx = [c.detach().clone().requires_grad_() for c in xc]
        ry = [c.detach().clone().requires_grad_() for c in yc]
        if reduction == "none":
            ref = [LOSSES[loss](a, b) for a, b in zip(rx, ry)]
            outs = out.unbind()
            assert len(outs) == len(ref)
            for o, r in zip(outs, ref):
                torch.testing.assert_close(o, r)
            cot = [torch.rand_like(r) for r in ref]
            got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cot)), [*xl, *yl], allow_unused=True)
            want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(ref, cot)), [*rx, *ry], allow_unused=True)
        else:
            RED = reduction
            ref = LOSSES[loss](torch.cat([_flat(a) for a in rx]), torch.cat([_flat(b) for b in ry])) if "pos_weight" not in loss else \
                LOSSES[loss](torch.cat([a.reshape(-1, a.shape[-1]) for a in rx]), torch.cat([b.reshape(-1, b.shape[-1]) for b in ry]))
            assert not isinstance(out, mj.MultiJaggedTensor) and out.dim() == 0
            torch.testing.assert_close(out, ref, equal_nan=True)
            got = torch.autograd.grad(out, [*xl, *yl], allow_unused=True)
            want = torch.autograd.grad(ref, [*rx, *ry], allow_unused=True)
        for g, w in zip(got, want):
            if w is None:
                assert g is None or not g.abs().sum()
            else:
                torch.testing.assert_close(g, w, equal_nan=True)

    check()


def test_losses_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 4.0], [5.0, 6.0]])])
    y = mj.nested_tensor([torch.tensor([[0.0, 0.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 3.0], [3.0, 3.0]])])
    # squared differences 1, 4 | 0, 1, 4, 9: sum 19 over 6 existing elements
    assert F.mse_loss(x, y, reduction="sum").item() == 19.0
    assert F.mse_loss(x, y).item() == pytest.approx(19 / 6)
    assert [c.tolist() for c in F.mse_loss(x, y, reduction="none").unbind()] == [[[1.0, 4.0]], [], [[0.0, 1.0], [4.0, 9.0]]]
    # huber, delta 1: |d| = 1, 2 | 0, 1, 2, 3 → 0.5·d² below 1, d - 0.5 above: 0.5, 1.5 | 0, 0.5, 1.5, 2.5
    assert F.huber_loss(x, y, reduction="sum").item() == pytest.approx(6.5)


def test_loss_double_backward_and_compile():
    x = mj.nested_tensor([torch.randn(3, 4, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)], requires_grad=True)
    y = mj.nested_tensor([torch.randn(3, 4, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)])
    (g,) = torch.autograd.grad(F.smooth_l1_loss(x, y, beta=0.5), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.values().pow(2).sum(), x)
    xv = x.values().detach().requires_grad_()
    (gd,) = torch.autograd.grad(F.smooth_l1_loss(xv, y.values(), beta=0.5), xv, create_graph=True)
    (ggd,) = torch.autograd.grad(gd.pow(2).sum(), xv)
    torch.testing.assert_close(gg.values(), ggd)

    y = (x.detach() * 1.3 + 0.2).sin()  # x's nested int: operands combine in a graph only then

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(a, b):
        return F.mse_loss(a, b) + F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction="sum")

    got = f(x, y)
    want = F.mse_loss(x.values(), y.values()) + F.binary_cross_entropy_with_logits(x.values(), y.values().sigmoid(), reduction="sum")
    torch.testing.assert_close(got, want)


def test_loss_bad_reduction_raises():
    x = mj.nested_tensor([torch.randn(2, 3)])
    with pytest.raises(ValueError, match="mse_loss\\(\\): expected reduction"):
        F.mse_loss(x, x, reduction="avg")
