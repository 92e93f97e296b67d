"""Both ways of moving images on and off the canvas, convolutions, pooling and 1-d convolutions
sample by sample, and both group-norm kernels, against the per-sample dense op: the threshold
rules (``kernels.canvas.BLOCK_ROWS``, ``kernels.per_image.PIXELS_PER_IMAGE``,
``kernels.per_image.POOL_CALL_NS``, ``kernels.per_image.SIGNAL_CALL_NS``,
``kernels.norms.ROWS_PER_SAMPLE_NATIVE``) pick one by the images' sizes, so each test forces
each choice on the same small images (a zero-size image among them)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, strategies as st
import torch
import torch.nn.functional as F

from torch_multijagged.kernels import canvas, norms, per_image
import torch_multijagged as mj
from torch_multijagged import multi_jagged
from test_spatial import SIZES1, SIZES2, _batch, _check, _images

F64 = torch.float64


@pytest.fixture(params=["blocks", "index", "per-image"])
def placement(request, monkeypatch):
    monkeypatch.setattr(canvas, "BLOCK_ROWS", 0 if request.param == "blocks" else 10**9)
    monkeypatch.setattr(per_image, "PIXELS_PER_IMAGE", 0 if request.param == "per-image" else 10**9)
    monkeypatch.setattr(per_image, "HELD_PIXELS_PER_IMAGE", 0 if request.param == "per-image" else 10**9)
    monkeypatch.setattr(per_image, "MIN_CHANNELS", 0)
    monkeypatch.setattr(per_image, "POOL_CALL_NS", 0.0 if request.param == "per-image" else float("inf"))
    monkeypatch.setattr(per_image, "SIGNAL_CALL_NS", 0.0 if request.param == "per-image" else float("inf"))
    return request.param


@pytest.fixture(params=["per-image kernel", "segment sums"])
def norm_kernel(request, monkeypatch):
    monkeypatch.setattr(norms, "ROWS_PER_SAMPLE_NATIVE", 0 if request.param == "per-image kernel" else 10**9)
    return request.param


def _params(*shapes, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=F64, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=1), dict(padding=(0, 2), dilation=2),
                                dict(padding="same", dilation=(1, 2)), dict(groups=2, padding=1)], ids=str)
def test_conv2d(placement, kw):
    w, b = _params((4 if kw.get("groups") else 3, 4 // kw.get("groups", 1), 3, 3), (4 if kw.get("groups") else 3,))
    _check(lambda x: F.conv2d(x, w, b, **kw), lambda x: F.conv2d(x, w, b, **kw), _images(SIZES2), [w, b])


def test_conv1d_and_transposed(placement):
    w, b = _params((3, 4, 3), (3,))
    _check(lambda x: F.conv1d(x, w, b, padding=1), lambda x: F.conv1d(x, w, b, padding=1), _images(SIZES1), [w, b])
    wt, = _params((4, 3, 3, 3))
    _check(lambda x: F.conv_transpose2d(x, wt, stride=2), lambda x: F.conv_transpose2d(x, wt, stride=2),
           _images(SIZES2), [wt])


def test_pooling_fills_the_gutters_with_its_identity(placement):
    # negative images: a max pool reading a zero gutter instead of -inf would be wrong
    comps = [-c.abs() - 1 for c in _images(SIZES2)]
    _check(lambda x: F.max_pool2d(x, 3, stride=1, padding=1), lambda x: F.max_pool2d(x, 3, stride=1, padding=1), comps)
    _check(lambda x: F.avg_pool2d(x, 2, ceil_mode=True), lambda x: F.avg_pool2d(x, 2, ceil_mode=True), _images(SIZES2))


def test_conv_second_order(placement):
    small = [c[:, :3, :3].clone().requires_grad_() for c in _images([(3, 3), (2, 3), (0, 3)], c=2)]
    w, = _params((2, 2, 3, 3))
    torch.autograd.gradgradcheck(
        lambda wt, *t: F.conv2d(_stack(t), wt, padding=1).values(), (w, *[s for s in small if s.numel()]))


def _stack(t):
    import torch_multijagged as mj
    return mj.as_nested_tensor(list(t))


def test_group_norm(norm_kernel):
    w, b = _params((4,), (4,))
    _check(lambda x: F.group_norm(x, 2, w, b), lambda x: torch.group_norm(x, 2, w, b, 1e-5), _images(SIZES2), [w, b])
    _check(lambda x: F.group_norm(x, 4), lambda x: torch.group_norm(x, 4, None, None, 1e-5), _images(SIZES2))
    # a channel per group, on signals too (the per-sample kernel reads them transposed)
    _check(lambda x: F.group_norm(x, 4, w, b), lambda x: torch.group_norm(x, 4, w, b, 1e-5), _images(SIZES1), [w, b])


def test_group_norm_second_order(norm_kernel):
    small = [c[:, :2, :2].clone().requires_grad_() for c in _images([(2, 2), (2, 2)], c=2)]
    w, b = _params((2,), (2,))
    torch.autograd.gradgradcheck(lambda wt, bt, *t: F.group_norm(_stack(t), 1, wt, bt).values(), (w, b, *small))


def test_float32_within_dense_tolerance(placement, norm_kernel):
    comps = _images(SIZES2, dtype=torch.float32)
    x = _batch(comps)
    out = F.group_norm(F.conv2d(x, torch.ones(4, 4, 3, 3) / 36, padding=1), 2)
    for o, c in zip(out.unbind(), comps):
        if c.numel():
            torch.testing.assert_close(o, F.group_norm(F.conv2d(c[None], torch.ones(4, 4, 3, 3) / 36, padding=1), 2)[0],
                                       rtol=1e-5, atol=1e-5)


@st.composite
def _conv_geometry(draw):
    b = draw(st.integers(1, 4))
    sizes = [(draw(st.integers(0, 9)), draw(st.integers(0, 9))) for _ in range(b)]
    groups = draw(st.sampled_from([1, 2]))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = draw(st.integers(1, 3))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = draw(st.integers(1, 2))
    return sizes, groups, k, s, p, d, draw(st.booleans())


@given(_conv_geometry())
def test_per_image_conv_random_geometries(monkeypatch_module, geo):
    """Random sizes (zero sides too), kernels, strides, paddings, dilations and groups through the
    per-image conv: per sample with the input's and the parameters' gradients, or the dense
    error for an image smaller than the window."""
    sizes, groups, k, s, p, d, bias = geo
    assume(any(h * w for h, w in sizes))  # the path takes batches with a pixel (test_conv2d has the empty ones)
    comps = _images(sizes, c=4, seed=len(sizes))
    w, b = _params((2 * groups, 4 // groups, *k), (2 * groups,), seed=sum(k) + s)
    b = b if bias else None
    fn = lambda t: F.conv2d(t, w, b, s, p, d, groups)  # noqa: E731
    if any(c.numel() and any((n + 2 * pp - dd * (kk - 1) - 1) < 0 for n, pp, dd, kk in zip(c.shape[1:], p, (d, d), k))
           for c in comps):
        with pytest.raises(ValueError, match="smaller than the window"):
            fn(_batch(comps))
        return
    _check(fn, fn, comps, [t for t in (w, b) if t is not None])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setattr(per_image, "PIXELS_PER_IMAGE", 0)
    mp.setattr(per_image, "HELD_PIXELS_PER_IMAGE", 0)
    mp.setattr(per_image, "MIN_CHANNELS", 0)
    yield
    mp.undo()


@pytest.mark.parametrize("form", ["per sample", "canvas"])
@pytest.mark.parametrize("layout", ["(B, C, T, F)", "(B, C, H, j)"])
@pytest.mark.parametrize("kw", [dict(stride=2), dict(padding=1), dict(padding="same", dilation=2),
                                dict(stride=(2, 1), padding=(0, 2)), dict(groups=2, padding=1)], ids=str)
def test_conv2d_with_one_ragged_side(form, layout, kw, monkeypatch):
    """A batch with one ragged spatial dim and a static one (spectrograms, text lines): the dense
    conv per sample (NOTE [ Convolutions with one ragged side ] in ops/vision/conv.py) or the
    canvas, each as dense on every sample, an empty sample included, gradients of the input and
    the parameters; both give the output one nested int per window rule."""
    from torch_multijagged.ops.vision import conv as vconv
    monkeypatch.setattr(vconv, "ONE_RAGGED_SIDE_PER_SAMPLE_UP_TO", 1 << 30 if form == "per sample" else -1)
    sizes = [(n, 9) for n in (7, 3, 0, 12)] if layout == "(B, C, T, F)" else [(5, n) for n in (7, 3, 0, 12)]
    comps = _images(sizes)
    g = 2 if kw.get("groups") else 1
    w, b = _params((4, comps[0].shape[0] // g, 3, 3), (4,))
    y = _check(lambda x: F.conv2d(x, w, b, **kw), lambda x: F.conv2d(x, w, b, **kw), comps, [w, b])
    assert len(y._ragged_dims) == 1
    x = _batch(comps)
    assert F.conv2d(x, w.detach(), None, **kw).shape == F.conv2d(x, w.detach(), b.detach(), **kw).shape  # one rule, one nested int


@pytest.mark.parametrize("dtype", [F64, torch.int64])
@pytest.mark.parametrize("kw", [dict(kernel_size=2, stride=2, padding=1), dict(kernel_size=3, stride=1, padding=1),
                                dict(kernel_size=2, stride=1, padding=1, dilation=2), dict(kernel_size=3, stride=2, ceil_mode=True)],
                         ids=str)
@pytest.mark.parametrize("layout", ["images", "one static side"])
def test_max_pool2d_of_windows_holding_only_the_lowest_value(dtype, kw, layout):
    """A window whose every cell holds the dtype's lowest value (``-inf`` masks) beside padding:
    dense keeps the window's first cell in the image as its index (and gradient), where the
    canvas's gutters — the lowest value too — would give a gutter cell. Values, indices and
    gradients of every image as dense's, an image of mixed values beside."""
    low = float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min
    sizes = [(3, 4), (5, 2), (0, 0), (2, 3)] if layout == "images" else [(n, 4) for n in (3, 5, 0, 2)]
    g = torch.Generator().manual_seed(5)
    comps = []
    for i, (h, w) in enumerate(sizes):
        c = (torch.randn(2, h, w, generator=g, dtype=F64) * 4).to(dtype)
        if i != 1:
            c[:] = low
        else:
            c[:, 0, 0] = low
        comps.append(c)
    if dtype.is_floating_point:
        leaves = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves)
    else:
        leaves, x = comps, _batch(comps)
    out, idx = F.max_pool2d(x, return_indices=True, **kw)
    refs = []
    for o, i, c in zip(out.unbind(), idx.unbind(), leaves):
        if not c.numel():
            continue
        ro, ri = F.max_pool2d(c[None], return_indices=True, **kw)
        refs.append(ro[0])
        assert torch.equal(o, ro[0]) and torch.equal(i, ri[0])
    if dtype.is_floating_point:
        live = [c for c in leaves if c.numel()]
        w = [torch.randn(r.shape, generator=g, dtype=F64) for r in refs]
        cot = [w.pop(0) if c.numel() else torch.zeros(o.shape, dtype=F64) for c, o in zip(leaves, out.unbind())]
        got = torch.autograd.grad(out, leaves, torch.nested.nested_tensor(cot, layout=multi_jagged))
        want = torch.autograd.grad(refs, live, [c for c, l in zip(cot, leaves) if l.numel()])
        for a, b in zip([g for g, c in zip(got, leaves) if c.numel()], want):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["conv1d", "conv1d stride 2", "conv1d per sample", "conv2d", "conv2d per image"])
def test_convolutions_under_autocast_as_dense_per_sample(case, monkeypatch):
    """Under CPU bfloat16 autocast a convolution runs in bfloat16 as dense autocast's: output
    bfloat16, gradients of the float32 input and parameters in float32, values as the dense
    autocast conv of each sample (the canvas path's own backward used to mix dtypes)."""
    monkeypatch.setattr(per_image, "SIGNAL_CALL_NS", 0.0 if "per sample" in case else float("inf"))
    g = torch.Generator().manual_seed(0)
    if case.startswith("conv1d"):
        conv = torch.nn.Conv1d(16, 8, 3, stride=2 if "stride" in case else 1, padding=1)
        comps = [torch.randn(16, n, generator=g) for n in (11, 20, 7)]
    else:
        conv = torch.nn.Conv2d(16, 8, 3, padding=1)
        sides = [(40, 36), (33, 41), (38, 30)] if "per image" in case else [(5, 6), (7, 7), (4, 9)]
        comps = [torch.randn(16, h, w, generator=g) for h, w in sides]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(x)
    assert out.dtype == torch.bfloat16
    params = list(conv.parameters())
    got = torch.autograd.grad(out.values().float().sum(), [*leaves, *params])
    refs = []
    for c in comps:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            refs.append(conv(c.unsqueeze(0).requires_grad_()))
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r[0], rtol=2e-2, atol=2e-2)
    dense_leaves = [c.clone().requires_grad_() for c in comps]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dense = [conv(c.unsqueeze(0)) for c in dense_leaves]
    want = torch.autograd.grad(sum(d.float().sum() for d in dense), [*dense_leaves, *params])
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == torch.float32
        # bfloat16 sums over thousands of pixels in another order: an ulp of the largest entries
        torch.testing.assert_close(a, b, rtol=5e-2, atol=1e-2 * float(b.abs().max()))
