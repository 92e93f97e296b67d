"""Images of one size (a batch of one image, or of equal sizes), whose dim 1 ``nested_tensor``
calls ragged as ``torch.jagged`` does: every vision op reads dim 1 as the channels, as each image's
dense call (a batch of one) does — values and gradients per sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

DT = torch.float64

_OPS = {
    "interpolate bilinear": lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
    "interpolate nearest to a size": lambda t: F.interpolate(t, size=(3, 4)),
    "upsample module": lambda t: torch.nn.Upsample(scale_factor=2)(t),
    "pixel_shuffle": lambda t: F.pixel_shuffle(t, 2),
    "pixel_unshuffle": lambda t: F.pixel_unshuffle(t, 2),
    "local_response_norm": lambda t: F.local_response_norm(t, 2),
    "channel_shuffle": lambda t: F.channel_shuffle(t, 2),
    "grid_sample": lambda t: F.grid_sample(t, torch.linspace(-1, 1, 30, dtype=DT).view(1, 3, 5, 2).expand(t.shape[0], 3, 5, 2),
                                           align_corners=False),
    "group_norm": lambda t: F.group_norm(t, 2),
    "conv2d": lambda t: F.conv2d(t, torch.ones(3, 4, 3, 3, dtype=DT), padding=1),
    "max_pool2d": lambda t: F.max_pool2d(t, 2),
    "adaptive_avg_pool2d": lambda t: F.adaptive_avg_pool2d(t, (2, 3)),
}


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("name", list(_OPS))
def test_vision_ops_read_dim_1_of_one_size_images_as_channels(name, count):
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(4, 6, 8, dtype=DT, generator=g, requires_grad=True) for _ in range(count)]
    x = mj.as_nested_tensor(comps)
    assert x._ragged_dims == (1,)
    op = _OPS[name]
    out = op(x)
    refs = [op(c[None])[0] for c in comps]
    got = out.unbind() if mj.is_nested(out) else list(out)
    for a, r in zip(got, refs):
        torch.testing.assert_close(a, r)
    ws = [torch.randn(r.shape, dtype=DT, generator=g) for r in refs]
    ga = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, ws)), comps)
    gb = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, ws)), comps)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


def test_a_dim_1_that_truly_varies_is_no_channel_dim():
    x = mj.nested_tensor([torch.randn(4, 6, 8), torch.randn(5, 6, 8)])
    for op in ("interpolate bilinear", "pixel_shuffle", "local_response_norm", "channel_shuffle", "grid_sample"):
        with pytest.raises(ValueError, match="static channel dim"):
            _OPS[op](x)
