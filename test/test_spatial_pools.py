"""Unpooling, volumes and fractional max pooling of ragged spatial batches, per sample against
the dense op (split from test_spatial.py, whose helpers they use)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

from _structures import assert_samples_and_grads
from test_spatial import F64, _batch, _check, _images, _leaves


@pytest.mark.parametrize("nd", [1, 2])
@pytest.mark.parametrize("kernel,stride", [(2, None), (3, 2)])
def test_max_unpool_after_max_pool_with_indices(nd, kernel, stride):
    """SegNet's decoder step: ``max_pool(…, return_indices=True)`` then ``max_unpool`` on each
    image's default plane ``(n − 1)·s + k`` per side (odd sides come back smaller, as dense), with
    gradients through both."""
    # sides the unpool plane reproduces (even for 2/2, odd for 3/2): otherwise a max sits outside
    # the plane and dense torch raises, as we do (below)
    sides = (6, 8, 4, 10) if kernel == 2 else (7, 5, 9, 3)
    sizes = list(sides) if nd == 1 else list(zip(sides, reversed(sides)))
    comps = _images(sizes, c=3)
    pool, unpool = (F.max_pool1d, F.max_unpool1d) if nd == 1 else (F.max_pool2d, F.max_unpool2d)
    leaves = _leaves(comps)
    x = mj.as_nested_tensor(leaves, ragged_dims=tuple(range(2, nd + 2)))
    y, idx = pool(x, kernel, stride, return_indices=True)
    out = unpool(y, idx, kernel, stride)
    refs = []
    for c in leaves:
        yi, ii = pool(c.unsqueeze(0), kernel, stride, return_indices=True)
        refs.append(unpool(yi, ii, kernel, stride)[0])
    assert_samples_and_grads(out, refs, leaves)
    with pytest.raises(NotImplementedError, match="output_size"):
        unpool(y, idx, kernel, stride, output_size=[4] * nd)
    if nd == 2 and kernel == 2:  # a 7 × 9 image: its maxima in the last row lie outside the 6 × 8 plane
        odd = mj.as_nested_tensor(_images([(7, 9), (4, 4)], c=3), ragged_dims=(2, 3))
        yo, io = pool(odd, 2, return_indices=True)
        with pytest.raises(RuntimeError, match="invalid max index"):
            unpool(yo, io, 2)


def test_max_unpool_to_the_pooled_tensors_own_sizes():
    """``output_size=x.shape`` (SegNet, U-Net decoders): odd sides come back whole, the result has
    ``x``'s nested ints (so it joins ``x`` in a ``cat``), each image as dense with its own size."""
    comps = _images([(7, 9), (4, 6), (5, 5)], c=3)
    leaves = _leaves(comps)
    x = mj.as_nested_tensor(leaves, ragged_dims=(2, 3))
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    out = F.max_unpool2d(y, idx, 2, output_size=x.shape)
    assert out.shape[2] is x.shape[2] and out.shape[3] is x.shape[3]
    refs = []
    for c in leaves:
        yi, ii = F.max_pool2d(c[None], 2, return_indices=True)
        refs.append(F.max_unpool2d(yi, ii, 2, output_size=c.shape[-2:])[0])
    for a, b in zip(out.unbind(), refs):
        torch.testing.assert_close(a, b)
    ga = torch.autograd.grad((torch.cat([out, x], 1) ** 2).sum(), leaves)
    gb = torch.autograd.grad(sum((torch.cat([r, c], 0) ** 2).sum() for r, c in zip(refs, leaves)), leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)
    other = mj.as_nested_tensor(_images([(2, 2), (2, 2), (2, 2)], c=3), ragged_dims=(2, 3))
    with pytest.raises(ValueError, match="default ± stride"):
        F.max_unpool2d(y, idx, 2, output_size=other.shape)


# ----------------------------------------------------------------------------- volumes
SIZES3 = [(3, 4, 5), (2, 2, 2), (0, 2, 3), (4, 3, 3)]
VOLUME_OPS = {
    "conv3d pad 1": lambda w: (lambda t: F.conv3d(t, w, padding=1)),
    "conv3d same dilated": lambda w: (lambda t: F.conv3d(t, w, padding="same", dilation=(2, 1, 1))),
    "conv3d strided groups": lambda w: (lambda t: F.conv3d(t, w[:, :2, :2, :2, :2], stride=(1, 2, 1), groups=2)),
    "conv_transpose3d": lambda w: (lambda t: F.conv_transpose3d(t, w.transpose(0, 1)[:, :3], stride=(2, 1, 2), padding=1,
                                                                output_padding=(1, 0, 0))),
    "max_pool3d": lambda w: (lambda t: F.max_pool3d(t, 2, 1, ceil_mode=True)),
    "max_pool3d indices": lambda w: (lambda t: F.max_pool3d(t, (1, 2, 2), return_indices=True)[1].to(t.dtype)),
    "avg_pool3d": lambda w: (lambda t: F.avg_pool3d(t, 2, 1, padding=1, count_include_pad=False)),
    "avg_pool3d divisor": lambda w: (lambda t: F.avg_pool3d(t, (1, 2, 2), divisor_override=3)),
    "lp_pool3d": lambda w: (lambda t: F.lp_pool3d(t, 2, (1, 2, 2))),
}


@pytest.mark.parametrize("name", sorted(VOLUME_OPS))
def test_volumes_per_sample_with_gradients(name):
    """Ragged volumes ``(B, C, j0, j1, j2)``: each op volume by volume, equal to the dense op on
    each sample, gradients of the input and the weight, an empty volume giving an empty output."""
    w = torch.randn(4, 4, 3, 3, 3, dtype=F64, generator=torch.Generator().manual_seed(5)).requires_grad_()
    fn = VOLUME_OPS[name](w)
    params = (w,) if name.startswith("conv") else ()
    _check(fn, fn, _images(SIZES3), params, grads="indices" not in name)


def test_volumes_share_extents_by_rule_and_adaptive_pools():
    x = _batch(_images(SIZES3))
    w = torch.randn(4, 4, 2, 2, 2, dtype=F64)
    a, b = F.conv3d(x, w), F.max_pool3d(x, 2, 1)  # one window rule on every axis: one nested int per axis
    assert all(a.shape[d] is b.shape[d] for d in (2, 3, 4))
    assert F.conv3d(x, torch.ones(4, 4, 3, 3, 3, dtype=F64), padding=1).shape[2:] == x.shape[2:]  # sizes kept: the same nested ints
    for fn in (lambda t: F.adaptive_avg_pool3d(t, (2, 1, 2)), lambda t: F.adaptive_max_pool3d(t, 2),
               lambda t: F.adaptive_avg_pool3d(t, 1)):
        out = fn(x)
        for i, c in enumerate(x.unbind()):
            if c.numel():
                torch.testing.assert_close(out[i], fn(c.unsqueeze(0))[0])
    with pytest.raises(ValueError, match="sample 1"):
        F.max_pool3d(x, 3)  # a 2×2×2 volume has no 3×3×3 window, as dense torch refuses it
    pooled, idx = F.max_pool3d(x, 2, return_indices=True)
    big = F.max_unpool3d(pooled, idx, 2, output_size=x.shape)  # each volume back at its own size
    assert all(big.shape[d] is x.shape[d] for d in (2, 3, 4))
    for i, c in enumerate(x.unbind()):
        if c.numel():
            p, j = F.max_pool3d(c.unsqueeze(0), 2, return_indices=True)
            torch.testing.assert_close(big.unbind()[i], F.max_unpool3d(p, j, 2, output_size=c.shape[1:])[0])


@pytest.mark.parametrize("three", [False, True])
@pytest.mark.parametrize("mode", ["ratio", "size", "drawn"])
def test_fractional_max_pool_per_sample(three, mode):
    """Dense torch's kernel on each image with its own random samples; ``output_ratio`` gives
    each image ``int(n · ratio)`` per side, ``output_size`` a dense batch; samples drawn when not
    given are ``rand(B, C, n)`` (one draw for the batch, as the dense call)."""
    sizes = [(4, 6, 4), (6, 4, 5), (5, 5, 4)] if three else [(6, 8), (9, 5), (4, 4)]
    comps = _images(sizes, c=2)
    nsp = 3 if three else 2
    f = F.fractional_max_pool3d if three else F.fractional_max_pool2d
    samples = torch.rand(len(comps), 2, nsp, dtype=F64, generator=torch.Generator().manual_seed(4))
    kw = dict(output_ratio=(0.5,) * nsp) if mode != "size" else dict(output_size=(2,) * nsp)
    x = _batch(comps, requires_grad=True)
    if mode == "drawn":
        torch.manual_seed(7)
        out, idx = f(x, 2, return_indices=True, **kw)
        torch.manual_seed(7)
        samples = torch.rand(len(comps), 2, nsp, dtype=F64)
    else:
        out, idx = f(x, 2, return_indices=True, _random_samples=samples, **kw)
    leaves = _leaves(comps)
    refs = [f(c.unsqueeze(0), 2, return_indices=True, _random_samples=samples[i:i + 1], **kw) for i, c in enumerate(leaves)]
    vals = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else list(out)
    inds = idx.unbind() if isinstance(idx, mj.MultiJaggedTensor) else list(idx)
    assert isinstance(out, mj.MultiJaggedTensor) == (mode != "size")
    for a, b, (rv, ri) in zip(vals, inds, refs):
        torch.testing.assert_close(a, rv[0])
        assert torch.equal(b, ri[0])
    g = torch.autograd.grad(sum(v.pow(2).sum() for v in vals), x)[0]
    want = torch.autograd.grad(sum(rv.pow(2).sum() for rv, _ in refs), leaves)
    for a, b in zip(g.unbind(), want):
        torch.testing.assert_close(a, b)


def test_fractional_max_pool_of_an_empty_batch_keeps_dense_shape():
    from _reference import empty_batch

    x = empty_batch((2, 0, 0), (2, 3))  # B = 0 images of 2 channels
    out, idx = F.fractional_max_pool2d(x, 2, output_size=(2, 3), return_indices=True,
                                       _random_samples=torch.rand(0, 2, 2, dtype=x.dtype))
    assert out.shape == (0, 2, 2, 3) and idx.shape == (0, 2, 2, 3) and idx.dtype == torch.int64
