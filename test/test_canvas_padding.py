"""(1) conv1d/conv2d over ragged images with padding past the kernel
(p > d·(k−1)), whose outer outputs read padding only, against the per-sample dense op with
gradients of the input, weight and bias; (2) F.pad of a zero-size static dim keeps autograd."""

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged.kernels import canvas, per_image

torch.set_num_threads(1)
F64 = torch.float64


@pytest.fixture(params=["blocks", "index"])
def placement(request, monkeypatch):
    monkeypatch.setattr(canvas, "BLOCK_ROWS", 0 if request.param == "blocks" else 10**9)
    monkeypatch.setattr(per_image, "PIXELS_PER_IMAGE", 10**9)
    return request.param


def _check(fn, comps, params):
    """Forward and gradients of every leaf against ``fn`` on each sample alone."""
    x = mj.nested_tensor([c.detach() for c in comps], requires_grad=True)
    outs = fn(x).unbind()
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    refs = [fn(c[None])[0] for c in leaves]
    for i, (o, r) in enumerate(zip(outs, refs)):
        torch.testing.assert_close(o, r, msg=lambda m: f"sample {i}: {m}")
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(r.shape, generator=g, dtype=F64) for r in refs]
    got = torch.autograd.grad(sum((o * t).sum() for o, t in zip(outs, cots)), [x, *params])
    want = torch.autograd.grad(sum((r * t).sum() for r, t in zip(refs, cots)), [*leaves, *params])
    for i, (a, b) in enumerate(zip(got[0].unbind(), want[: len(leaves)])):
        torch.testing.assert_close(a, b, msg=lambda m: f"grad of sample {i}: {m}")
    for name, a, b in zip(("weight", "bias"), got[1:], want[len(leaves):]):
        torch.testing.assert_close(a, b, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("n, k, stride, padding, dilation", [
    (1, 1, 1, 1, 1),   # the report's case: outputs of length n + 2, the outer two = bias
    (2, 1, 1, 1, 1),
    (1, 2, 1, 2, 1),
    (2, 2, 1, 3, 2),   # dilated: d·(k−1) = 2 < 3
    (2, 3, 1, 3, 1),
    (1, 1, 2, 1, 1),   # strided
    (2, 2, 2, 3, 1),
    (2, 1, 3, 2, 1),
], ids=str)
def test_conv_bias_grad_with_outputs_in_the_padding_only(placement, n, k, stride, padding, dilation):
    g = torch.Generator().manual_seed(0)
    sizes = [(3,), (5,), (0,), (4,)] if n == 1 else [(2, 2), (3, 1), (0, 2), (4, 3)]
    comps = [torch.randn(2, *s, generator=g, dtype=F64) for s in sizes]
    w = torch.randn(3, 2, *(k,) * n, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=F64, requires_grad=True)
    conv = F.conv1d if n == 1 else F.conv2d
    # the per-sample reference skips the empty image (dense conv refuses it; ours gives no output)
    live = [c for c in comps if c.numel()]
    _check(lambda t: conv(t, w, b, stride, padding, dilation), live, [w, b])
    # with the empty image in the batch too: the bias gradient counts every output pixel
    x = mj.nested_tensor(comps)
    y = conv(x, w, b, stride, padding, dilation)
    (gb,) = torch.autograd.grad(y.sum(tuple(range(y.dim()))), b)
    count = sum(conv(c[None], w, b, stride, padding, dilation)[0, 0].numel() for c in live)
    torch.testing.assert_close(gb, torch.full_like(gb, float(count)))


def test_conv_bias_grad_report_examples():
    b = torch.zeros(1, requires_grad=True)
    x = mj.nested_tensor([torch.randn(1, 3), torch.randn(1, 5)])
    y = F.conv1d(x, torch.randn(1, 1, 1), b, padding=1)  # outputs of length 5 and 7
    assert torch.autograd.grad(y.sum((0, 1, 2)), b)[0].item() == 12
    x2 = mj.nested_tensor([torch.randn(1, 2, 2), torch.randn(1, 3, 1)], ragged_dims=(2, 3))
    y2 = F.conv2d(x2, torch.randn(1, 1, 1, 1), b, padding=1)  # 4×4 and 5×3 outputs
    assert torch.autograd.grad(y2.sum((0, 1, 2, 3)), b)[0].item() == 31


@pytest.mark.parametrize("pad, value", [((1, 1), 0.0), ((2, 0), 1.5), ((1, 1, 1, 0), 0.5)], ids=str)
def test_pad_of_a_zero_size_static_dim_keeps_autograd(pad, value):
    comps = [torch.randn(2, 3, dtype=F64), torch.randn(4, 3, dtype=F64)]
    x = mj.nested_tensor(comps, requires_grad=True)
    y = F.pad(x.narrow(2, 0, 0), pad, value=value)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [F.pad(c.narrow(1, 0, 0), pad, value=value) for c in leaves]
    assert refs[0].requires_grad and y.requires_grad
    for o, r in zip(y.unbind(), refs):
        torch.testing.assert_close(o, r)
    cots = [torch.randn(r.shape, dtype=F64) for r in refs]
    (gx,) = torch.autograd.grad(sum((o * t).sum() for o, t in zip(y.unbind(), cots)), x)
    want = torch.autograd.grad(sum((r * t).sum() for r, t in zip(refs, cots)), leaves)
    for a, b in zip(gx.unbind(), want):
        torch.testing.assert_close(a, b)
