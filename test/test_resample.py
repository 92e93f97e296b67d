"""``F.interpolate`` / ``nn.Upsample`` and ``pixel_shuffle`` / ``pixel_unshuffle`` over ragged
spatial dims (torch_multijagged/ops/resample.py, NOTE [ Resampling ragged images ]).

Oracle: the dense op on every image ``(1, C, H, W)`` (contiguous NCHW, as the images were given).
``nearest`` / ``nearest-exact`` / ``pixel_*shuffle`` must pick the very same pixels (bit-equal
outputs); ``linear`` / ``bilinear`` agree to rounding. A sample whose output side is 0 (a zero-size
image, or ``floor(n·s) = 0``) is empty, where dense torch raises.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import assume, example, given, strategies as st

import torch_multijagged as mj
from torch_multijagged import pieces
from _reference import empty_batch, few, grid, seeds
from _structures import assert_samples_and_grads, bit_equal, comps_for, packed_args

D = torch.float64


# ----------------------------------------------------------------------------- helpers
def _images(sides, c, seed, dtype=D, requires_grad=True):
    """Leaves ``(c, *side)`` and the multi_jagged batch built from them (spatial dims ragged)."""
    g = torch.Generator().manual_seed(seed)
    leaves = [(torch.rand((c, *s), generator=g, dtype=torch.float64) * 4 - 2).to(dtype).requires_grad_(requires_grad)
              for s in sides]
    nsp = len(sides[0])
    return leaves, mj.as_nested_tensor(leaves, ragged_dims=tuple(range(2, 2 + nsp)))


def _out_sides(side, scale):
    scales = scale if isinstance(scale, (tuple, list)) else [scale] * len(side)
    return [math.floor(float(n) * s) for n, s in zip(side, scales)]


def _vanishes(sides, kw) -> bool:
    """Whether an image with pixels would be scaled to a side of 0 (dense raises, and so does the
    batch: ``test_interpolate_by_a_scale_to_an_empty_side_raises_as_dense``; ``area`` pools to it)."""
    if "scale_factor" not in kw or kw.get("mode") == "area":
        return False
    return any(0 not in side and 0 in _out_sides(side, kw["scale_factor"]) for side in sides)


def _dense_interp(img, **kw):
    """Dense interpolate of one image ``(C, *side)``; an empty result where dense torch raises
    for an empty image (what the layout gives) or pools to an empty size (``area``)."""
    out = _out_sides(img.shape[1:], kw["scale_factor"]) if "scale_factor" in kw else list(kw["size"])
    if 0 in out or 0 in img.shape[1:]:
        return img.new_zeros((img.shape[0], *out)) + 0 * img.sum()
    if kw.get("mode", "nearest").startswith("nearest"):
        # the pixels dense torch picks (its forward on an image of pixel numbers), gathered: dense
        # torch's own backward disagrees with its forward when a scale keeps the size (length 3,
        # scale 1.3 picks (x0, x0, x1), but aten's backward returns the cotangent unchanged)
        sides = img.shape[1:]
        exact = img.dtype if img.dtype in (torch.float32, torch.float64) else torch.float32  # integers exact
        num = torch.arange(math.prod(sides), dtype=exact).view(1, 1, *sides)
        idx = F.interpolate(num, **kw)[0, 0].long()
        return img.flatten(1)[:, idx.flatten()].view(img.shape[0], *idx.shape)
    return F.interpolate(img.unsqueeze(0).contiguous(), **kw)[0]


def _check(fn, ref, leaves, x, exact: bool, grad: bool = True, rtol=1e-7, atol=1e-7, dense_out=False, seed=0):
    """``fn(x)`` per sample against ``ref(leaf)``, then the gradients of a random cotangent."""
    out = fn(x)
    if dense_out:
        assert not isinstance(out, mj.MultiJaggedTensor)
        got = list(out.unbind(0))
    else:
        assert isinstance(out, mj.MultiJaggedTensor)
        got = list(out.unbind())
    ref_leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    expected = [ref(t) for t in ref_leaves]
    assert len(got) == len(expected)
    for i, (o, e) in enumerate(zip(got, expected)):
        assert o.shape == e.shape and o.dtype == e.dtype, f"sample {i}: {o.shape} {o.dtype} vs {e.shape} {e.dtype}"
        if exact:
            assert bit_equal(o, e), f"sample {i} differs"
        else:
            torch.testing.assert_close(o, e, rtol=rtol, atol=atol, msg=lambda m: f"sample {i}: {m}")
    if not grad or not expected:
        return out
    g = torch.Generator().manual_seed(seed)
    cots = [torch.randn(e.shape, generator=g, dtype=torch.float64).to(e.dtype) for e in expected]
    lm = sum((o * c).sum() for o, c in zip(got, cots))
    lr = sum((e * c).sum() for e, c in zip(expected, cots))
    gm = torch.autograd.grad(lm, leaves, allow_unused=True)
    gr = torch.autograd.grad(lr, ref_leaves, allow_unused=True)
    for k, (a, b, leaf) in enumerate(zip(gm, gr, leaves)):
        a = torch.zeros_like(leaf) if a is None else a
        b = torch.zeros_like(leaf) if b is None else b
        torch.testing.assert_close(a, b, rtol=max(rtol, 1e-6), atol=max(atol, 1e-6), msg=lambda m: f"grad of leaf {k}: {m}")
    return out


_SIDES = st.sampled_from([0, 1, 2, 3, 4, 5, 7, 9])
_SCALES = st.sampled_from([0.5, 0.7, 1.0, 1.3, 1.5, 2.0, 2.5, 3.0, 0.9999, 2.0001, 1 / 3])


@st.composite
def interp_cases(draw, nsp: int):
    b = draw(st.integers(1, 4))
    sides = [tuple(draw(_SIDES) for _ in range(nsp)) for _ in range(b)]
    if draw(st.booleans()):  # most batches hold a zero-size image
        sides[draw(st.integers(0, b - 1))] = tuple(0 if k == 0 else 3 for k in range(nsp))
    modes = ["nearest", "nearest-exact", "bilinear" if nsp == 2 else "linear"]
    mode = draw(st.sampled_from(modes))
    scale = draw(_SCALES)
    if nsp == 2 and draw(st.booleans()):
        scale = (scale, draw(_SCALES))
    kw = dict(scale_factor=scale, mode=mode, recompute_scale_factor=draw(st.sampled_from([None, True, False])))
    if mode in ("linear", "bilinear"):
        kw["align_corners"] = draw(st.booleans())
    return sides, draw(st.integers(1, 3)), kw


# ----------------------------------------------------------------------------- interpolate
@grid
@given(interp_cases(2), seeds, st.sampled_from([torch.float32, torch.float64]))
def test_interpolate_2d_matches_dense_per_image(case, seed, dtype):
    sides, c, kw = case
    assume(not _vanishes(sides, kw))
    leaves, x = _images(sides, c, seed, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x,
           exact=kw["mode"].startswith("nearest"), rtol=tol, atol=tol, seed=seed)


@grid
@given(interp_cases(1), seeds, st.sampled_from([torch.float32, torch.float64]))
@example(([(3,)], 1, {"scale_factor": 1.3, "mode": "nearest", "recompute_scale_factor": None}), 2, torch.float32)
def test_interpolate_1d_matches_dense_per_signal(case, seed, dtype):
    sides, c, kw = case
    assume(not _vanishes(sides, kw))
    leaves, x = _images(sides, c, seed, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x,
           exact=kw["mode"].startswith("nearest"), rtol=tol, atol=tol, seed=seed)


@st.composite
def per_sample_cases(draw):
    """``bicubic``, ``area`` and antialiased resampling (a dense call per image): 1-d (area only)
    or 2-d, by a scale (zero-size images allowed) or to one size (none)."""
    nsp = draw(st.sampled_from([1, 2]))
    mode, extra = draw(st.sampled_from([("area", {}), ("bicubic", {"align_corners": False}), ("bicubic", {"align_corners": True}),
                                        ("bilinear", {"antialias": True}), ("bicubic", {"antialias": True})]))
    if nsp == 1 and mode != "area":
        mode, extra = "area", {}
    by_size = draw(st.booleans())
    b = draw(st.integers(1, 4))
    sides = [tuple(draw(st.sampled_from([1, 2, 3, 5, 7, 9])) for _ in range(nsp)) for _ in range(b)]
    if by_size:
        kw = dict(size=tuple(draw(st.integers(1, 6)) for _ in range(nsp)))
    else:
        if draw(st.booleans()):
            sides[draw(st.integers(0, b - 1))] = tuple(0 if k == 0 else 3 for k in range(nsp))
        scale = draw(_SCALES)
        kw = dict(scale_factor=scale if nsp == 1 or draw(st.booleans()) else (scale, draw(_SCALES)),
                  recompute_scale_factor=draw(st.sampled_from([None, True])))
    return sides, draw(st.integers(1, 3)), dict(mode=mode, **extra, **kw)


@grid
@given(per_sample_cases(), seeds, st.sampled_from([torch.float32, torch.float64]))
def test_interpolate_bicubic_area_antialias_match_dense_per_image(case, seed, dtype):
    """The modes without a packed form run dense torch per image: values and gradients are its
    own, the output a dense batch for ``size=`` and the scaled extents (those of every mode) for a
    scale."""
    sides, c, kw = case
    assume(not _vanishes(sides, kw))
    leaves, x = _images(sides, c, seed, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    out = _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x, exact=False,
                 rtol=tol, atol=tol, dense_out="size" in kw, seed=seed)
    if "scale_factor" in kw and not _vanishes(sides, dict(kw, mode="nearest")):
        linear = F.interpolate(x.detach(), scale_factor=kw["scale_factor"], mode="nearest")
        assert out.shape == linear.shape  # one nested int per size rule, whatever the mode


@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="trilinear"), dict(scale_factor=(1.5, 2, 0.5), mode="nearest"),
                                dict(size=(4, 3, 5), mode="trilinear", align_corners=True),
                                dict(scale_factor=0.5, mode="area"), dict(scale_factor=2, mode="nearest-exact")],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_interpolate_volumes_match_dense_per_volume(kw):
    """Volumes ``(B, C, j0, j1, j2)`` (a 3-d U-Net's decoder, video): every mode, dense torch per
    volume, values and gradients; ``size=`` gives a dense batch, a scale the scaled extents; each
    volume to another batch's sizes (a skip connection)."""
    g = torch.Generator().manual_seed(0)
    vols = [torch.randn(2, d, h, w, dtype=torch.float64, generator=g, requires_grad=True)
            for d, h, w in [(4, 5, 3), (3, 4, 6), (2, 2, 2)]]
    x = mj.as_nested_tensor(vols)
    out = F.interpolate(x, **kw)
    assert isinstance(out, mj.MultiJaggedTensor) != ("size" in kw)
    assert_samples_and_grads(out, [F.interpolate(v[None], **kw)[0] for v in vols], vols)
    skip = mj.nested_tensor([torch.zeros(1, 6, 7, 5), torch.zeros(1, 5, 5, 5), torch.zeros(1, 3, 3, 3)])
    up = F.interpolate(x, size=skip.shape[-3:], mode="trilinear")
    assert up.shape[-3:] == skip.shape[-3:]
    assert_samples_and_grads(up, [F.interpolate(v[None], size=s.shape[-3:], mode="trilinear")[0]
                                  for v, s in zip(vols, skip.unbind())], vols)
    with pytest.raises(ValueError, match="sample 1"):
        F.interpolate(mj.nested_tensor([torch.ones(1, 2, 2, 2), torch.ones(1, 0, 2, 2)], ragged_dims=(2, 3, 4)),
                      size=(2, 2, 2))


def test_interpolate_per_sample_modes_to_another_batch_and_double_backward():
    """``size=`` another batch's nested ints (an FPN's skip connection) and second-order
    gradients, for a mode run per image."""
    leaves, x = _images([(3, 4), (2, 5), (4, 1)], 2, 3)
    _, skip = _images([(5, 2), (4, 4), (6, 3)], 1, 4)
    out = F.interpolate(x, size=skip.shape[-2:], mode="bicubic", align_corners=False)
    assert out.shape[-2:] == skip.shape[-2:]
    for o, leaf, sk in zip(out.unbind(), leaves, skip.unbind()):
        torch.testing.assert_close(o, F.interpolate(leaf[None], size=sk.shape[-2:], mode="bicubic", align_corners=False)[0])
    _gradgrad(lambda t: F.interpolate(t, scale_factor=1.5, mode="bicubic", align_corners=False),
              comps_for([(2, 3, 4), (2, 0, 2), (2, 2, 1)], 7), (2, 3))
    _gradgrad(lambda t: F.interpolate(t, size=(3, 2), mode="area"), comps_for([(2, 3, 4), (2, 1, 2)], 8), (2, 3))


@st.composite
def to_own_size_cases(draw, nsp: int):
    """Source and target sides per image (an empty image only to an empty one, as dense torch
    refuses either alone), a mode and its align_corners."""
    b = draw(st.integers(1, 4))
    nonzero = st.sampled_from([1, 2, 3, 4, 5, 7, 9])
    pairs = [(tuple(draw(nonzero) for _ in range(nsp)), tuple(draw(nonzero) for _ in range(nsp))) for _ in range(b)]
    if draw(st.booleans()):
        empty = tuple(0 if k == 0 else 3 for k in range(nsp))
        pairs[draw(st.integers(0, b - 1))] = (empty, empty)
    mode = draw(st.sampled_from(["nearest", "nearest-exact", "bilinear" if nsp == 2 else "linear"]))
    kw = dict(mode=mode)
    if mode in ("linear", "bilinear"):
        kw["align_corners"] = draw(st.booleans())
    return pairs, draw(st.integers(1, 3)), kw


@grid
@given(st.sampled_from([1, 2]).flatmap(to_own_size_cases), seeds, st.sampled_from([torch.float32, torch.float64]))
def test_interpolate_each_image_to_another_batch_s_sizes(case, seed, dtype):
    """``F.interpolate(x, size=skip.shape[-2:])`` (an FPN or U-Net skip connection): each image to
    its own target size, the result sharing ``skip``'s nested ints so that it adds to it."""
    pairs, c, kw = case
    nsp = len(pairs[0][0])
    leaves, x = _images([src for src, _ in pairs], c, seed, dtype)
    _, skip = _images([dst for _, dst in pairs], 1, seed + 1, dtype, requires_grad=False)
    targets = iter([dst for _, dst in pairs])
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    out = _check(lambda t: F.interpolate(t, size=skip.shape[-nsp:], **kw),
                 lambda t: _dense_interp(t, size=next(targets), **kw), leaves, x,
                 exact=kw["mode"].startswith("nearest"), rtol=tol, atol=tol, seed=seed)
    assert all(out.shape[d] is skip.shape[d] for d in range(2, 2 + nsp))
    assert (out + skip).shape[2] is skip.shape[2]


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_interpolate_by_a_scale_to_an_empty_side_raises_as_dense(mode):
    """A 1×1 image scaled by 0.5 (or a 5×1 one: one side) would be empty: dense raises, and so
    does the batch, naming the sample; an empty image scaled stays empty (the batch's extension).
    ``area`` pools to the empty size, in dense and here."""
    _, x = _images([(4, 5), (1, 1)], 2, 0)
    assert [tuple(t.shape[1:]) for t in F.interpolate(x, scale_factor=0.5, mode="area").unbind()] == [(2, 2), (0, 0)]
    with pytest.raises(ValueError, match=r"sample 1 .* \(1, 1\) and cannot be resized to \(0, 0\)"):
        F.interpolate(x, scale_factor=0.5, mode=mode)
    with pytest.raises(RuntimeError, match="sizes should be greater than 0"):
        F.interpolate(x.unbind()[1].unsqueeze(0), scale_factor=0.5, mode=mode)
    _, tall = _images([(5, 1), (4, 2)], 2, 1)
    with pytest.raises(ValueError, match=r"sample 0 .* cannot be resized to \(2, 0\)"):
        F.interpolate(tall, scale_factor=0.5, mode=mode)
    _, some_empty = _images([(4, 6), (0, 3)], 2, 2)
    assert [tuple(t.shape[1:]) for t in F.interpolate(some_empty, scale_factor=0.5, mode=mode).unbind()] == [(2, 3), (0, 1)]


def test_interpolate_to_nested_ints_refuses_what_dense_refuses():
    _, x = _images([(4, 5), (0, 3)], 2, 0)
    _, skip = _images([(8, 10), (2, 3)], 1, 1)
    with pytest.raises(ValueError, match="sample 1 .* cannot be resized"):
        F.interpolate(x, size=skip.shape[-2:])
    _, other = _images([(2, 3), (4, 5), (6, 7)], 1, 2)
    with pytest.raises(ValueError, match="nested ints of another batch of 2 images"):
        F.interpolate(x, size=other.shape[-2:])
    with pytest.raises(ValueError, match=r"sample 1 .* \(0, 3\) and cannot be resized to \(2, 5\)"):
        F.interpolate(x, size=(skip.shape[2], 5))  # a nested int beside an int: each image's own size
    with pytest.raises(ValueError, match="positive ints, or nested ints of another batch"):
        F.interpolate(x, size=(skip.shape[2], 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_interpolate_nearest_picks_dense_pixels_on_many_sizes(mode, dtype):
    """Bit for bit over sides up to 150 (both of aten's 2-d kernels: out_h + out_w <= 128 or not),
    scales near the shortcuts (1, 2) and recomputed scales; float64 uses double index math in
    the generic kernel."""
    sides = [(1, 1), (3, 150), (63, 1), (64, 1), (39, 11), (70, 127), (5, 100), (128, 2), (17, 33), (0, 4)]
    for k, scale in enumerate([2.0001, 1.0001, 0.9999, 1.9999, 0.37, 1.7, 3.0, 0.5, (2.0001, 1.1), (0.61, 2.0)]):
        for rec in (None, True):
            kw = dict(scale_factor=scale, mode=mode, recompute_scale_factor=rec)
            kw1 = dict(kw, scale_factor=scale if isinstance(scale, float) else scale[0])
            kept = [side for side in sides if not _vanishes([side], kw)]  # the others raise, as dense
            leaves, x = _images(kept, 2, k, dtype, requires_grad=False)
            _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x, exact=True, grad=False)
            signals, s = _images([(n,) for n, _ in sides if not _vanishes([(n,)], kw1)], 2, k, dtype, requires_grad=False)
            _check(lambda t: F.interpolate(t, **kw1), lambda t: _dense_interp(t, **kw1), signals, s, exact=True, grad=False)


def test_interpolate_bilinear_bfloat16():
    leaves, x = _images([(4, 5), (7, 2), (0, 3)], 3, 0, torch.bfloat16)
    kw = dict(scale_factor=(1.7, 0.6), mode="bilinear", align_corners=False)
    _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x, exact=False,
           rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "nearest-exact"])
def test_interpolate_size_gives_dense_batch(mode):
    """``size=(h, w)``: every image resized to one size — a dense ``(B, C, h, w)`` result."""
    leaves, x = _images([(4, 5), (7, 2), (1, 1)], 3, 1)
    kw = dict(size=(6, 3), mode=mode)
    out = _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x,
                 exact=mode.startswith("nearest"), dense_out=True)
    assert out.shape == (3, 3, 6, 3) and out.is_contiguous()
    up = nn.Upsample(size=5, mode="nearest")(x)  # an int size: every side
    assert up.shape == (3, 3, 5, 5)


def test_interpolate_size_refuses_an_empty_image():
    _, x = _images([(4, 5), (0, 2)], 3, 1)
    with pytest.raises(ValueError, match=r"interpolate\(\): sample 1 .*\(0, 2\)"):
        F.interpolate(x, size=(3, 3))


def test_interpolate_nested_ints_follow_the_size_rule():
    """The same factor on the same extent gives the same nested int whatever the mode; a square
    batch stays square; factor 1 keeps the input's nested int; the zero-size image stays empty."""
    _, x = _images([(4, 4), (7, 7), (0, 0)], 2, 2)
    assert x.shape[2] == x.shape[3]
    a = F.interpolate(x, scale_factor=1.5)
    b = F.interpolate(x, scale_factor=1.5, mode="bilinear")
    assert a.shape[2] == a.shape[3] == b.shape[2] and a.shape[2] != x.shape[2]
    assert (a + b).shape == a.shape
    assert a.sizes().tolist() == [[6, 6], [10, 10], [0, 0]]  # = floor([4, 7, 0] · 1.5)
    same = F.interpolate(x, scale_factor=1.0, mode="bilinear")
    assert same.shape == x.shape
    assert F.interpolate(x, scale_factor=(2.0, 0.5)).sizes().tolist() == [[8, 2], [14, 3], [0, 0]]
    up = nn.Upsample(scale_factor=2, mode="nearest")(x)
    assert up.shape[2] == F.interpolate(x, scale_factor=2.0, mode="bilinear").shape[2]


# NOTE [ Resampling image by image ]: outputs averaging at least 128 (linear) / 2,048 (nearest)
# pixels per image run dense torch on each image and hold their images as pieces.
_LARGE = [(40, 61), (0, 5), (57, 44), (66, 70)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("c", [2, 5])
@pytest.mark.parametrize("kw", [dict(scale_factor=2.0, mode="nearest"), dict(scale_factor=2.0001, mode="nearest"),
                                dict(scale_factor=(1.0001, 2.0), mode="nearest"), dict(scale_factor=1.3, mode="nearest-exact"),
                                dict(scale_factor=2.0, mode="nearest", recompute_scale_factor=True),
                                dict(scale_factor=2.0, mode="bilinear"), dict(scale_factor=(0.6, 1.7), mode="bilinear", align_corners=True)],
                         ids=str)
def test_interpolate_large_images_image_by_image(kw, c, dtype):
    """Large images, one empty: dense torch per image (nearest bit for bit, gradients those of the
    forward's picks, also where aten's nearest kernels differ: C > 3, out_h + out_w > 128, a scale
    whose shortcut differs), gradients; the result holds per-image pieces where it runs image by
    image and adds to another mode's result (one nested int per size rule)."""
    leaves, x = _images(_LARGE, c, 1, dtype)
    exact = kw["mode"].startswith("nearest")
    tol = {torch.float32: 1e-5, torch.float64: 1e-7, torch.bfloat16: 2e-2}[dtype]
    # image by image: bilinear, and nearest where aten's two index rules agree (here ×2, float32 /
    # bfloat16); the others stay on the gather (reading the values packs pieces: check first)
    by_image = kw["mode"] == "bilinear" or (kw["mode"] == "nearest" and kw["scale_factor"] == 2.0 and dtype != torch.float64)
    assert pieces.holds_pieces(F.interpolate(x, **kw)) == by_image
    out = _check(lambda t: F.interpolate(t, **kw), lambda t: _dense_interp(t, **kw), leaves, x, exact=exact,
                 rtol=tol, atol=tol)
    with torch.no_grad():
        assert (out + F.interpolate(x, **dict(kw, mode="bilinear", align_corners=False))).shape == out.shape


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_interpolate_large_images_to_sizes_and_from_pieces(mode):
    """``size=`` (a dense batch) and ``size=skip.shape[-2:]`` (the skip's nested ints) image by
    image; an input that holds pieces (a per-image conv's output) stays image by image."""
    leaves, x = _images([(40, 61), (57, 44)], 16, 2, torch.float32)
    _check(lambda t: F.interpolate(t, size=(90, 70), mode=mode), lambda t: _dense_interp(t, size=(90, 70), mode=mode),
           leaves, x, exact=mode == "nearest", rtol=1e-5, atol=1e-5, dense_out=True)
    _, skip = _images([(80, 122), (114, 88)], 1, 3, torch.float32, requires_grad=False)
    targets = iter([(80, 122), (114, 88)])
    assert pieces.holds_pieces(F.interpolate(x, size=skip.shape[-2:], mode=mode))
    out = _check(lambda t: F.interpolate(t, size=skip.shape[-2:], mode=mode),
                 lambda t: _dense_interp(t, size=next(targets), mode=mode), leaves, x, exact=mode == "nearest",
                 rtol=1e-5, atol=1e-5)
    assert out.shape[2] is skip.shape[2]
    w = torch.randn(16, 16, 3, 3, dtype=torch.float32)
    y = F.conv2d(x, w, padding=1)
    assert pieces.holds_pieces(y)
    got = F.interpolate(y, scale_factor=0.5, mode=mode)
    assert pieces.holds_pieces(got)
    for o, leaf in zip(got.unbind(), leaves):
        torch.testing.assert_close(o, _dense_interp(F.conv2d(leaf[None], w, padding=1)[0], scale_factor=0.5, mode=mode),
                                   rtol=1e-4, atol=1e-4)


def test_interpolate_downscale_to_zero_raises_but_area_pools_to_it():
    """floor(1 · 0.5) = 0: dense raises for nearest, and so does the batch; ``area`` pools to the
    empty side, in dense and here."""
    leaves, x = _images([(1, 3), (4, 4)], 2, 3)
    with pytest.raises(ValueError, match=r"sample 0 .* \(1, 3\) and cannot be resized to \(0, 1\)"):
        F.interpolate(x, scale_factor=0.5)
    out = F.interpolate(x, scale_factor=0.5, mode="area")
    assert out.sizes().tolist() == [[0, 1], [2, 2]]  # = floor([1, 3] · 0.5), floor([4, 4] · 0.5)
    assert out.unbind()[0].shape == (2, 0, 1)


def test_interpolate_no_leakage():
    """Changing image 1 changes no output of images 0 and 2."""
    for kw in (dict(scale_factor=1.7, mode="bilinear"), dict(scale_factor=(2.0, 0.6)), dict(scale_factor=2.5, mode="nearest-exact")):
        comps = comps_for([(2, 3, 4), (2, 5, 2), (2, 4, 4)], 0)
        other = [c.clone() for c in comps]
        other[1] = other[1] * 7 + 1
        a = F.interpolate(mj.nested_tensor(comps, ragged_dims=(2, 3)), **kw).unbind()
        b = F.interpolate(mj.nested_tensor(other, ragged_dims=(2, 3)), **kw).unbind()
        assert bit_equal(a[0], b[0]) and bit_equal(a[2], b[2]) and not bit_equal(a[1], b[1])


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_interpolate_without_grad(ctx):
    leaves, x = _images([(3, 4), (1, 2), (2, 2)], 2, 4)
    with ctx():
        for kw in (dict(scale_factor=2.0), dict(scale_factor=1.5, mode="bilinear"), dict(size=(3, 3), mode="bilinear")):
            out = F.interpolate(x, **kw)
            assert not out.requires_grad
            exp = [_dense_interp(t.detach(), **kw) for t in leaves]
            got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
            for o, e in zip(got, exp):
                torch.testing.assert_close(o, e)


def test_interpolate_empty_batch():
    x = empty_batch((3, 0, 0), (2, 3))
    out = F.interpolate(x, scale_factor=2.0, mode="bilinear")
    assert out.shape[0] == 0 and out.dim() == 4
    assert F.interpolate(x, size=(2, 3)).shape == (0, 3, 2, 3)


def _gradgrad(fn, comps, rd):
    v, off, sizes = packed_args(comps, rd)
    v.requires_grad_()

    def f(values):
        out = fn(mj.from_packed(values, off, sizes, rd))
        return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.autograd.gradgradcheck(f, (v,), fast_mode=True)


@pytest.mark.parametrize("kw", [dict(scale_factor=1.5, mode="bilinear"), dict(scale_factor=(0.7, 2.0), mode="bilinear", align_corners=True),
                                dict(scale_factor=2.0), dict(size=(2, 3), mode="bilinear")])
def test_interpolate_double_backward(kw):
    sides = [(2, 3), (1, 2), (3, 1)] if "size" in kw else [(2, 3), (0, 2), (3, 1)]  # size=: no empty image
    _gradgrad(lambda x: F.interpolate(x, **kw), comps_for([(2, *s) for s in sides], 5), (2, 3))


def test_interpolate_linear_double_backward():
    _gradgrad(lambda x: F.interpolate(x, scale_factor=1.7, mode="linear"), comps_for([(2, 3), (2, 0), (2, 4)], 6), (2,))


def test_interpolate_errors_name_the_op():
    _, x = _images([(3, 4), (2, 2)], 2, 0)
    with pytest.raises(ValueError, match=r"interpolate\(\).*only one of size or scale_factor"):
        F.interpolate(x, size=(2, 2), scale_factor=2.0)
    with pytest.raises(ValueError, match=r"interpolate\(\).*either size or scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match=r"interpolate\(\).*scale_factor"):
        F.interpolate(x, scale_factor=(2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match=r"interpolate\(\).*positive"):
        F.interpolate(x, scale_factor=-1.0)
    with pytest.raises(NotImplementedError, match=r"interpolate\(\).*'lanczos'"):
        F.interpolate(x, scale_factor=2.0, mode="lanczos")
    with pytest.raises(ValueError, match="Anti-alias"):  # dense: no antialiased nearest
        F.interpolate(x, scale_factor=2.0, mode="nearest", antialias=True)
    with pytest.raises(NotImplementedError, match="bicubic"):  # dense: bicubic needs a 4-d input
        F.interpolate(mj.nested_tensor([torch.randn(2, 3), torch.randn(2, 1)], ragged_dims=(2,)), scale_factor=2.0,
                      mode="bicubic")
    with pytest.raises(ValueError, match="align_corners"):
        F.interpolate(x, scale_factor=2.0, mode="nearest", align_corners=True)
    with pytest.raises(NotImplementedError, match="linear"):  # dense: linear needs a 3-d input
        F.interpolate(x, scale_factor=2.0, mode="linear")
    seq = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])  # (B, j0, 4): spatial dim static
    with pytest.raises(ValueError, match=r"interpolate\(\): expected a static channel dim"):
        F.interpolate(seq, scale_factor=2.0)
    ints = mj.nested_tensor([torch.ones(2, 3, 4, dtype=torch.int64), torch.ones(2, 2, 2, dtype=torch.int64)], ragged_dims=(2, 3))
    with pytest.raises(RuntimeError):  # dense torch's own dtype check
        F.interpolate(ints, scale_factor=2.0, mode="bilinear")


def test_resampling_is_eager_only_under_compile():
    """New per-sample sizes are built on the host: a clear error under fullgraph compile."""
    _, x = _images([(3, 4), (2, 2)], 2, 0, requires_grad=False)
    for fn in (lambda t: F.interpolate(t, scale_factor=2.0) * 2, lambda t: F.pixel_shuffle(torch.cat([t] * 4, 1), 2) * 2,
               lambda t: F.interpolate(t, size=(2, 2), mode="bilinear")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="torch.compile cannot trace"):
            torch.compile(fn, fullgraph=True, backend="aot_eager")(x)


# ----------------------------------------------------------------------------- pixel shuffle
def _dense_shuffle(fn, r, up: bool):
    """Dense ``pixel_(un)shuffle`` of one image; for an empty image the empty result directly
    (dense torch's PixelShuffleBackward0 rejects the gradient of an empty image)."""

    def ref(img):
        if img.numel():
            return fn(img, r)
        c, h, w = img.shape
        shape = (c // (r * r), h * r, w * r) if up else (c * r * r, h // r, w // r)
        return img.new_zeros(shape) + 0 * img.sum()

    return ref


@few(10)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4), st.integers(1, 3),
       st.integers(1, 2), seeds, st.sampled_from([torch.float32, torch.float64]))
def test_pixel_shuffle_matches_dense(sides, r, c, seed, dtype):
    leaves, x = _images(sides, c * r * r, seed, dtype)
    out = _check(lambda t: F.pixel_shuffle(t, r), _dense_shuffle(F.pixel_shuffle, r, True), leaves, x, exact=True, seed=seed)
    assert out.sizes().tolist() == [[h * r, w * r] for h, w in sides]
    leaves2, y = _images([(h * r, w * r) for h, w in sides], c, seed + 1, dtype)
    back = _check(lambda t: nn.PixelUnshuffle(r)(t), _dense_shuffle(F.pixel_unshuffle, r, False), leaves2, y, exact=True,
                  seed=seed)
    assert back.shape[1] == c * r * r


def test_pixel_shuffle_round_trip_keeps_nested_ints():
    _, x = _images([(3, 4), (0, 2), (2, 2)], 8, 0)
    y = F.pixel_shuffle(x, 2)
    assert y.shape[1] == 2 and y.sizes().tolist() == [[6, 8], [0, 4], [4, 4]]  # = 2·[(3, 4), (0, 2), (2, 2)]
    z = F.pixel_unshuffle(y, 2)
    assert z.shape == x.shape  # the original nested ints
    assert all(torch.equal(a, b) for a, b in zip(z.unbind(), x.unbind()))
    assert (F.interpolate(x, scale_factor=2.0) + torch.cat([y] * 4, 1)).shape[2] == y.shape[2]  # one size rule, one j


def test_pixel_unshuffle_names_the_indivisible_sample():
    _, x = _images([(4, 4), (3, 4), (0, 0)], 1, 0)
    with pytest.raises(ValueError, match=r"pixel_unshuffle\(\).*divisible by downscale_factor 2.*sample 1 of size \(3, 4\)"):
        F.pixel_unshuffle(x, 2)
    with pytest.raises(RuntimeError, match="divisible"):  # dense torch's channel check
        F.pixel_shuffle(x, 2)
    with pytest.raises(ValueError, match=r"pixel_shuffle\(\): expected upscale_factor"):
        F.pixel_shuffle(x, 0)
    with pytest.raises(ValueError, match=r"pixel_shuffle\(\): expected a static channel dim"):
        F.pixel_shuffle(mj.nested_tensor([torch.randn(3, 4, 4), torch.randn(2, 4, 4)]), 2)


def test_pixel_shuffle_no_leakage_and_without_grad():
    comps = comps_for([(4, 2, 3), (4, 1, 1), (4, 3, 2)], 0)
    other = [c.clone() for c in comps]
    other[1] = other[1] + 5
    with torch.inference_mode():
        a = F.pixel_shuffle(mj.nested_tensor(comps, ragged_dims=(2, 3)), 2).unbind()
    with torch.no_grad():
        b = F.pixel_shuffle(mj.nested_tensor(other, ragged_dims=(2, 3)), 2).unbind()
    assert bit_equal(a[0], b[0]) and bit_equal(a[2], b[2]) and not bit_equal(a[1], b[1])


def test_pixel_shuffle_double_backward():
    _gradgrad(lambda x: F.pixel_shuffle(x, 2), comps_for([(4, 2, 1), (4, 0, 2), (4, 1, 2)], 7), (2, 3))
    _gradgrad(lambda x: F.pixel_unshuffle(x, 2), comps_for([(1, 2, 4), (1, 0, 2), (1, 2, 2)], 8), (2, 3))


def test_resampling_between_compiled_convs_is_a_graph_break():
    """Without fullgraph, interpolate and pixel_(un)shuffle between compiled convolutions break
    the graph there and run eagerly (NOTE [ Eager-only routes ]); results and gradients (input and
    weights) equal eager, over batches of different sizes with an empty image."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(2, 2, 3, 3, dtype=D, generator=g, requires_grad=True) for _ in range(2))
    w3 = torch.randn(2, 8, 1, 1, dtype=D, generator=g, requires_grad=True)

    def f(t):
        y = F.conv2d(t, w1, padding=1)
        y = F.interpolate(y, scale_factor=2.0, mode="bilinear") + F.interpolate(y, scale_factor=2.0) * 2
        y = F.conv2d(F.pixel_unshuffle(F.conv2d(y, w2, padding=1), 2), w3)  # back to the input's sizes
        y = F.pixel_shuffle(torch.cat([y] * 4, 1), 2) * 2 + 1
        return F.conv2d(y, w2, padding=1).sum((-2, -1))

    cf = torch.compile(f, backend="aot_eager")
    for seed, sides in enumerate(([(3, 4), (2, 2), (0, 3)], [(4, 4), (1, 5), (3, 2), (2, 1)])):
        _, x1 = _images(sides, 2, seed)
        _, x2 = _images(sides, 2, seed)
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out, ref)
        got = torch.autograd.grad(out.sum(), [x1, w1, w2, w3])
        want = torch.autograd.grad(ref.sum(), [x2, w1, w2, w3])
        torch.testing.assert_close(got[0].values(), want[0].values())
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_per_image(mode, padding_mode):
    """A warp of each image at its own grid (optical flow, spatial transformers): values and the
    gradients of images and grids, per image; a grid of another size gives that size."""
    g = torch.Generator().manual_seed(0)
    sizes, out_sizes = ((5, 7), (4, 4), (6, 3)), ((3, 2), (4, 5), (2, 2))
    imgs = [torch.randn(3, h, w, dtype=torch.float64, generator=g, requires_grad=True) for h, w in sizes]
    grids = [(torch.rand(h, w, 2, dtype=torch.float64, generator=g) * 2.4 - 1.2).requires_grad_() for h, w in out_sizes]
    x = mj.as_nested_tensor(imgs, ragged_dims=(2, 3))
    grid = mj.as_nested_tensor(grids, ragged_dims=(1, 2))
    out = F.grid_sample(x, grid, mode, padding_mode, align_corners=False)
    assert out.shape[2] is grid.shape[1] and out.shape[3] is grid.shape[2]
    refs = [F.grid_sample(i[None], q[None], mode, padding_mode, align_corners=False)[0] for i, q in zip(imgs, grids)]
    assert_samples_and_grads(out, refs, imgs + grids)
    dense_grid = torch.rand(3, 2, 2, 2, dtype=torch.float64, generator=g) * 2 - 1  # one size for every image
    got = F.grid_sample(x, dense_grid, mode, padding_mode, align_corners=False)
    torch.testing.assert_close(got, torch.stack([F.grid_sample(i[None], q[None], mode, padding_mode, align_corners=False)[0]
                                                 for i, q in zip(imgs, dense_grid)]))


def test_grid_sample_with_a_grid_ragged_in_one_side_and_an_empty_grid():
    g = torch.Generator().manual_seed(1)
    imgs = [torch.randn(2, h, w, dtype=torch.float64, generator=g) for h, w in ((5, 7), (4, 4), (6, 3))]
    grids = [torch.rand(n, 3, 2, dtype=torch.float64, generator=g) * 2 - 1 for n in (2, 0, 3)]  # (B, j, 3, 2)
    x = mj.as_nested_tensor(imgs, ragged_dims=(2, 3))
    out = F.grid_sample(x, mj.as_nested_tensor(grids), align_corners=True)
    for o, i, q in zip(out.unbind(), imgs, grids):
        want = F.grid_sample(i[None], q[None], align_corners=True)[0] if q.shape[0] else i.new_zeros(2, 0, 3)
        torch.testing.assert_close(o, want)


def test_affine_grid_one_matrix_per_position():
    """``theta`` ``(B, j, 2, 3)`` with ``size=[j, C, H, W]``: each position's grid, as dense
    ``affine_grid`` on that sample's matrices; gradients to theta."""
    g = torch.Generator().manual_seed(2)
    thetas = [torch.randn(n, 2, 3, dtype=torch.float64, generator=g, requires_grad=True) for n in (2, 1, 3)]
    t = mj.as_nested_tensor(thetas)
    out = F.affine_grid(t, [t.shape[1], 1, 3, 4], align_corners=False)
    assert_samples_and_grads(out, [F.affine_grid(c, [c.shape[0], 1, 3, 4], align_corners=False) for c in thetas], thetas)
    with pytest.raises(ValueError, match=r"size \[j, C, H, W\]"):
        F.affine_grid(t, [3, 1, 3, 4], align_corners=False)


@pytest.mark.parametrize("kernel,padding,stride", [(3, 1, 1), (2, 0, 2)])
def test_fold_back_into_each_image(kernel, padding, stride):
    """``F.unfold`` → ``F.fold`` to the images' own nested ints: each image's blocks summed back
    into its own plane (the result has ``x``'s nested ints), gradients; two ints give every image
    one size (a dense batch)."""
    g = torch.Generator().manual_seed(0)
    sides = ((5, 7), (4, 4), (6, 3)) if stride == 1 else ((4, 6), (2, 2), (6, 4))
    imgs = [torch.randn(2, h, w, dtype=torch.float64, generator=g, requires_grad=True) for h, w in sides]
    x = mj.as_nested_tensor(imgs, ragged_dims=(2, 3))
    y = F.fold(F.unfold(x, kernel, padding=padding, stride=stride), x.shape[-2:], kernel, padding=padding, stride=stride)
    assert y.shape[2] is x.shape[2] and y.shape[3] is x.shape[3]
    refs = [F.fold(F.unfold(i[None], kernel, padding=padding, stride=stride), i.shape[-2:], kernel, padding=padding,
                   stride=stride)[0] for i in imgs]
    assert_samples_and_grads(y, refs, imgs)
    blocks = mj.as_nested_tensor([torch.randn(8, 4, dtype=torch.float64, generator=g) for _ in range(3)], ragged_dims=(2,))
    dense = F.fold(blocks, (3, 3), 2)
    torch.testing.assert_close(dense, torch.stack([F.fold(b[None], (3, 3), 2)[0] for b in blocks.unbind()]))
    with pytest.raises(RuntimeError, match="sample 0"):
        F.fold(blocks, (4, 4), 2)  # 4 blocks do not tile a 4 × 4 plane with a 2 × 2 kernel


def test_affine_grid_and_grid_sample_under_compile_break_the_graph_and_match_eager():
    g = torch.Generator().manual_seed(3)
    th = mj.as_nested_tensor([torch.randn(n, 2, 3, generator=g) for n in (2, 1, 3)])
    x = mj.as_nested_tensor([torch.randn(2, h, w, generator=g) for h, w in ((5, 7), (4, 4), (6, 3))], ragged_dims=(2, 3))
    grid = mj.as_nested_tensor([torch.rand(h, w, 2, generator=g) * 2 - 1 for h, w in ((2, 3), (4, 1), (3, 3))],
                               ragged_dims=(1, 2))

    def f(t, img, q):
        return F.affine_grid(t, [t.shape[1], 1, 3, 3], align_corners=False) * 2, F.grid_sample(img, q, align_corners=False) + 1

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager")(th, x, grid)
    want = f(th, x, grid)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.values(), b.values())


@pytest.mark.parametrize("sizes", [[(6, 8), (5, 8), (0, 8)], [(8, 6), (8, 5)]], ids=["one width", "one height"])
@pytest.mark.parametrize("kw", [dict(scale_factor=2.0, mode="nearest"), dict(scale_factor=2, mode="bilinear"),
                                dict(scale_factor=0.5, mode="bilinear", align_corners=True),
                                dict(size=(4, 4), mode="bilinear")], ids=["nearest x2", "bilinear x2", "bilinear /2", "size"])
def test_interpolate_images_with_one_static_side(sizes, kw):
    """Images sharing a width (or a height), whose shared side ``nested_tensor`` makes static:
    each image's dense ``interpolate``, values and gradients, the static side static again."""
    if "size" in kw and any(h * w == 0 for h, w in sizes):
        sizes = [s for s in sizes if s[0] * s[1]]  # dense torch refuses to resize an empty image
    comps = [torch.randn(3, h, w, dtype=torch.float64) for h, w in sizes]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    assert len(x.ragged_dims) == 1
    y = F.interpolate(x, **kw)
    outs = y.unbind() if isinstance(y, mj.MultiJaggedTensor) else list(y)
    if isinstance(y, mj.MultiJaggedTensor):
        assert y.ragged_dims == x.ragged_dims  # the shared side stays static
    cot = [torch.randn(o.shape, dtype=torch.float64) for o in outs]
    got = torch.autograd.grad([(o * g).sum() for o, g in zip(outs, cot)], leaves, allow_unused=True, materialize_grads=True)
    for o, c, g, gc in zip(outs, comps, got, cot):
        if c.numel() == 0:
            assert o.numel() == 0
            continue
        leaf = c.clone().requires_grad_()
        ref = F.interpolate(leaf[None], **kw)[0]
        torch.testing.assert_close(o, ref)
        torch.testing.assert_close(g, torch.autograd.grad((ref * gc).sum(), leaf)[0])


_ONE_SIDE = {"one width": ([(6, 8), (4, 8), (0, 8)], (2,)), "one height": ([(8, 6), (8, 4)], (3,))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(_ONE_SIDE))
def test_shuffles_unpool_and_flatten_of_images_with_one_static_side(case, dtype):
    """Images sharing a width (or a height), whose shared side ``nested_tensor`` makes static:
    ``pixel_shuffle`` / ``pixel_unshuffle`` (the side static again), ``max_unpool2d`` (with and
    without ``output_size``) and ``flatten`` of both sides are each image's dense op, values and
    gradients; ``view`` of both sides, which the packed order cannot give, names ``reshape``."""
    from _reference import R, components, per_sample_check

    sizes, rd = _ONE_SIDE[case]
    # an empty image: dense pixel_shuffle's backward refuses it, dense pixel_unshuffle returns it
    # unchanged (its own shape, not (C·r², 0, W/r)), dense max_pool2d refuses it
    full = [s for s in sizes if s[0] * s[1]]
    comps = components([(8, h, w) for h, w in sizes], 0, dtype)
    for f, empty in ((lambda t: F.pixel_shuffle(t, 2), "forward"), (lambda t: F.pixel_unshuffle(t, 2), None),
                     (lambda t: t.flatten(2), "both"), (lambda t: t.flatten(1) * 2.0, "both"),
                     (lambda t: t.reshape(t.shape[0], 8, -1), "both")):
        cases = [(components([(8, h, w) for h, w in full], 2, dtype), True)]
        for cs, g in cases + ([(comps, empty == "both")] if empty else []):
            out = per_sample_check(f, R(cs, rd), ref=lambda c, f=f: f(c[None])[0], new_ragged=True, grad=g)
            if out.dim() == 4:
                assert out.ragged_dims == rd  # the shared side static again
    comps = components([(3, h, w) for h, w in full], 1, dtype)

    def unpool(t, sized=False):
        p, i = F.max_pool2d(t, 2, return_indices=True)
        return F.max_unpool2d(p, i, 2, output_size=t.shape[-2:] if sized else None)

    for sized in (False, True):
        out = per_sample_check(lambda t: unpool(t, sized), R(comps, rd), ref=lambda c: unpool(c[None], sized)[0],
                               new_ragged=not sized)
        assert out.ragged_dims == rd
    x = mj.as_nested_tensor(comps, ragged_dims=rd)
    with pytest.raises(RuntimeError, match="reshape"):
        x.view(x.shape[0], 3, -1)
