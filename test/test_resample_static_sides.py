"""``F.interpolate`` where some spatial sizes are shared: a U-Net / FPN skip's size of a static
side beside a nested int (``size=skip.shape[-2:]`` of images of one width), and videos whose clips
share a length ``(B, C, T, j0, j1)`` — each sample's dense call, values and gradients. (Dense
``interpolate`` refuses empty images and volumes, so no sample here is empty; ``test_resample.py``
covers empty samples where a scale allows them.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj


@pytest.mark.parametrize("sizes", [[(8, 12), (16, 12), (4, 12)], [(6, 10), (6, 4)], [(8, 12), (16, 6), (4, 2)]],
                         ids=["one width", "one height", "both ragged"])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("second", ["skip", "int"])
def test_interpolate_to_a_skips_sizes_with_a_static_side(sizes, mode, second):
    """The U-Net / FPN skip ``F.interpolate(up, size=skip.shape[-2:])`` where the skip has a static
    side (images of one width): ``size`` mixes a nested int and an int (and ``(skip.shape[2], 7)``
    on any images). Each image's dense resize to its skip's size, values and gradients; a side
    given as an int is static in the result, as dense's."""
    leaves = [torch.randn(3, h, w, dtype=torch.float64, requires_grad=True) for h, w in sizes]
    skip = mj.as_nested_tensor(leaves)
    size = skip.shape[-2:] if second == "skip" else (skip.shape[2], 7)
    up = F.interpolate(F.max_pool2d(skip, 2), size=size, mode=mode)
    want = [F.interpolate(F.max_pool2d(c[None], 2), size=(c.shape[1], c.shape[2] if second == "skip" else 7),
                          mode=mode)[0] for c in leaves]
    dense = not any(isinstance(n, torch.SymInt) for n in size)  # (6, 7) of images of height 6: dense's batch
    assert isinstance(up, mj.MultiJaggedTensor) != dense
    for a, b in zip(list(up) if dense else up.unbind(), want):
        torch.testing.assert_close(a, b)
    for d, n in zip((2, 3), () if dense else size):
        assert (d in up.ragged_dims) == isinstance(n, torch.SymInt)
    got = torch.autograd.grad((up * up).sum(), leaves)
    ref = torch.autograd.grad(sum((w * w).sum() for w in want), leaves)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("sizes", [[(4, 6, 8), (4, 4, 2), (4, 1, 3)], [(3, 6, 8), (5, 6, 2)], [(3, 6, 8), (5, 2, 8)]],
                         ids=["clips of one length", "one height", "one width"])
@pytest.mark.parametrize("kw", [dict(scale_factor=(1, 2, 2), mode="nearest"), dict(scale_factor=2, mode="trilinear"),
                                dict(size=(2, 3, 4), mode="trilinear"),
                                dict(scale_factor=(0.5, 1.5, 2), mode="trilinear", align_corners=True)],
                         ids=["nearest (1, 2, 2)", "trilinear x2", "size", "trilinear mixed"])
def test_interpolate_volumes_with_static_sides(sizes, kw):
    """Videos ``(B, C, T, j0, j1)`` whose clips share a length (or volumes sharing a side): each
    volume's dense ``interpolate``, values and gradients; a side every volume shares stays static
    when its new size is one. It raised, asking for every spatial dim ragged."""
    leaves = [torch.randn(2, *sz, dtype=torch.float64, requires_grad=True) for sz in sizes]
    x = mj.as_nested_tensor(leaves)
    assert 0 < len(x.ragged_dims) < 3
    y = F.interpolate(x, **kw)
    outs = y.unbind() if mj.is_nested(y) else list(y)
    want = [F.interpolate(c[None], **kw)[0] for c in leaves]
    for a, b in zip(outs, want):
        torch.testing.assert_close(a, b)
    if mj.is_nested(y):
        assert all(d not in y.ragged_dims for d in (2, 3, 4) if d not in x.ragged_dims)
    got = torch.autograd.grad(sum((o * o).sum() for o in outs), leaves)
    ref = torch.autograd.grad(sum((w * w).sum() for w in want), leaves)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
