"""Pooling and convolutions run sample by sample (ops/vision/per_sample.py, NOTE [ Pooling image by
image ], NOTE [ Convolutions of signals sample by sample ] and NOTE [ Adaptive pooling sample by
sample ] in kernels/per_image.py), against the per-sample dense op: adaptive pooling of images,
volumes and signals by either path (forced through the rules' constants), the gradients those
paths hand to aten's pooling backwards (in the memory format of its input, else aten transposes
the whole image's gradient), the default rules' choice for a few large images or long signals,
and group norm with a channel per group, bit for bit the dense kernel's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torch_multijagged as mj
from torch_multijagged.kernels import canvas, norms, per_image
from torch_multijagged.ops.vision import norms as vision_norms
from test_spatial import _check, _images

aten = torch.ops.aten
F64 = torch.float64


def _every_sample(mp, on: bool) -> None:
    """Adaptive pooling sample by sample (``on``) or by (pixel, window) pairs / the gather."""
    mp.setattr(per_image, "CALL_NS", 0.0 if on else float("inf"))
    for name in ("EACH_NS", "SIGNAL_EACH_NS", "SIGNAL_VALUE_NS"):
        mp.setattr(per_image, name, 0.0 if on else float("inf"))


@pytest.fixture(params=["sample by sample", "all at once"])
def adaptive_path(request, monkeypatch):
    _every_sample(monkeypatch, request.param == "sample by sample")
    return request.param


def _check_dense_out(fn, dense, comps, rd, fill, dtype=F64, rtol=1e-7, atol=1e-7, lead=False):
    """``fn(batch)`` (a dense ``(B, …)`` result) against ``dense`` per sample (on the component
    itself with ``lead``: its leading static dim is dense's batch), gradients of every sample
    included (a sample without pixels: ``fill``, no gradient)."""
    leaves = [c.to(dtype).detach().clone().requires_grad_() for c in comps]
    out = fn(mj.as_nested_tensor(leaves, ragged_dims=rd))
    assert type(out) is torch.Tensor and out.shape[0] == len(comps)
    refs = [c.to(dtype).detach().clone().requires_grad_() for c in comps]
    g = torch.Generator().manual_seed(0)
    cot = torch.randn(out.shape, generator=g, dtype=F64).to(dtype)
    loss, ref_loss = (out.nan_to_num(0.0, 0.0, 0.0) * cot).sum(), 0
    for i, r in enumerate(refs):
        if r[0].numel() == 0:
            assert (out[i].isnan() if fill != fill else out[i] == fill).all(), f"sample {i} without pixels"
            continue
        want = dense(r) if lead else dense(r[None])[0]
        torch.testing.assert_close(out[i], want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"sample {i}: {m}")
        ref_loss = ref_loss + (want.nan_to_num(0.0, 0.0, 0.0) * cot[i]).sum()
    got = torch.autograd.grad(loss, leaves)
    want = torch.autograd.grad(ref_loss, refs, allow_unused=True)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, rtol=rtol, atol=atol,
                                   msg=lambda m: f"gradient of sample {i}: {m}")
    return out


IMAGES = [(7, 9), (0, 4), (13, 5), (3, 11), (1, 1)]
VOLUMES = [(5, 4, 6), (2, 0, 3), (7, 3, 4)]
SIGNALS = [9, 0, 23, 4, 1]


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
@pytest.mark.parametrize("size", [(3, 2), (5, 4), (1, 3), (14, 6)], ids=str)
def test_adaptive_pool2d_both_paths(adaptive_path, size, dtype):
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    comps = _images(IMAGES, c=3, dtype=dtype, seed=sum(size))
    _check_dense_out(lambda x: F.adaptive_avg_pool2d(x, size), lambda c: F.adaptive_avg_pool2d(c, size), comps, (2, 3),
                     float("nan"), dtype, **tol)
    _check_dense_out(lambda x: F.adaptive_max_pool2d(x, size), lambda c: F.adaptive_max_pool2d(c, size), comps, (2, 3),
                     float("-inf"), dtype, **tol)
    out, idx = F.adaptive_max_pool2d(mj.nested_tensor(comps, ragged_dims=(2, 3)), size, return_indices=True)
    for i, c in enumerate(comps):
        want = F.adaptive_max_pool2d(c[None], size, return_indices=True)[1][0] if c[0].numel() else torch.zeros_like(idx[i])
        assert torch.equal(idx[i], want), f"indices of sample {i}"


def test_adaptive_pool2d_layouts_both_paths(adaptive_path):
    # one static side (B, C, 3, j0); leading static dims (B, S, C, j0, j1): S pools as dense's batch
    side = [torch.randn(2, 3, w, dtype=F64) for w in (8, 0, 5)]
    lead = [torch.randn(2, 3, h, w, dtype=F64) for h, w in ((4, 6), (0, 2), (5, 3))]
    for comps, rd in ((side, (3,)), (lead, (3, 4))):
        for size in ((2, 3), (4, 7)):
            _check_dense_out(lambda x: F.adaptive_avg_pool2d(x, size), lambda c: F.adaptive_avg_pool2d(c, size), comps, rd,
                             float("nan"), lead=rd == (3, 4))
            _check_dense_out(lambda x: F.adaptive_max_pool2d(x, size), lambda c: F.adaptive_max_pool2d(c, size), comps, rd,
                             float("-inf"), lead=rd == (3, 4))


def test_adaptive_pool3d_and_1d_both_paths(adaptive_path):
    vols = [torch.randn(2, *s, dtype=F64) for s in VOLUMES]
    for size in ((2, 3, 2), (4, 1, 5)):
        _check_dense_out(lambda x: F.adaptive_avg_pool3d(x, size), lambda c: F.adaptive_avg_pool3d(c, size), vols,
                         (2, 3, 4), float("nan"))
        _check_dense_out(lambda x: F.adaptive_max_pool3d(x, size), lambda c: F.adaptive_max_pool3d(c, size), vols,
                         (2, 3, 4), float("-inf"))
    sig = [torch.randn(3, n, dtype=F64) for n in SIGNALS]
    lead = [torch.randn(2, 3, n, dtype=F64) for n in SIGNALS]  # (B, S, C, j0)
    for comps, rd in ((sig, (2,)), (lead, (3,))):
        for size in (3, 7, 30):
            _check_dense_out(lambda x: F.adaptive_avg_pool1d(x, size), lambda c: F.adaptive_avg_pool1d(c, size), comps, rd,
                             float("nan"), lead=rd == (3,))
            _check_dense_out(lambda x: F.adaptive_max_pool1d(x, size), lambda c: F.adaptive_max_pool1d(c, size), comps, rd,
                             float("-inf"), lead=rd == (3,))


def test_adaptive_pool_nan_ties_and_no_leakage_sample_by_sample(monkeypatch):
    _every_sample(monkeypatch, True)
    comps = [torch.zeros(2, 6, 5, dtype=F64), torch.randn(2, 4, 7, dtype=F64).relu()]
    comps[0][0, 1, 2] = float("nan")
    comps[0][0, 3, 1] = float("nan")  # the last NaN of a window takes the index and the gradient
    _check_dense_out(lambda x: F.adaptive_max_pool2d(x, (2, 3)), lambda c: F.adaptive_max_pool2d(c, (2, 3)), comps,
                     (2, 3), float("-inf"))
    for fn in (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), lambda x: F.adaptive_max_pool2d(x, (3, 2))):
        a = [torch.randn(2, 5, 6, dtype=F64), torch.randn(2, 7, 3, dtype=F64)]
        b = [a[0], a[1] * 3 + 1]
        out_a, out_b = fn(mj.nested_tensor(a, ragged_dims=(2, 3))), fn(mj.nested_tensor(b, ragged_dims=(2, 3)))
        assert torch.equal(out_a[0], out_b[0])  # changing sample 1 leaves sample 0 unchanged


def test_adaptive_pool_of_a_batch_without_pixels_keeps_the_graph(adaptive_path):
    x = mj.nested_tensor([torch.zeros(3, 0, 4), torch.zeros(3, 2, 0)], ragged_dims=(2, 3), requires_grad=True)
    for fn in (lambda t: F.adaptive_avg_pool2d(t, 2), lambda t: F.adaptive_max_pool2d(t, 2)):
        out = fn(x)
        assert out.shape == (2, 3, 2, 2) and out.requires_grad
        (g,) = torch.autograd.grad(out.nan_to_num(0.0, 0.0, 0.0).sum(), x)
        assert g.values().shape == (0, 3)


def test_adaptive_pool2d_second_order_sample_by_sample(monkeypatch):
    _every_sample(monkeypatch, True)
    small = [torch.randn(2, h, w, dtype=F64, requires_grad=True) for h, w in ((3, 4), (2, 3))]
    for fn in (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), lambda x: F.adaptive_max_pool2d(x, (3, 2))):
        torch.autograd.gradgradcheck(lambda *t: fn(mj.as_nested_tensor(list(t), ragged_dims=(2, 3))), small)


# ----------------------------------------------------------------------------- gradients' memory format
class _BackwardFormats(TorchDispatchMode):
    """Records, for each pooling backward, whether its gradient is channels last as its input is."""

    OPS = {aten._adaptive_avg_pool2d_backward.default: (0, 1), aten.adaptive_max_pool2d_backward.default: (0, 1),
           aten.avg_pool2d_backward.default: (0, 1), aten.max_pool2d_with_indices_backward.default: (0, 1)}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            g, x = (args[i] for i in self.OPS[func])
            cl = torch.channels_last
            self.seen.append((func, g.is_contiguous(memory_format=cl), x.is_contiguous(memory_format=cl)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("loss", ["sum", "flatten"])
@pytest.mark.parametrize("op", ["adaptive_avg", "adaptive_max", "avg", "max"])
def test_pooling_backward_receives_its_input_s_memory_format(op, loss, monkeypatch):
    """Each image's pooling backward gets a gradient in its input's (channels-last) format, for
    the expanded gradient of a sum and the contiguous one of a flatten alike."""
    _every_sample(monkeypatch, True)
    monkeypatch.setattr(per_image, "POOL_CALL_NS", 0.0)
    fn = {"adaptive_avg": lambda t: F.adaptive_avg_pool2d(t, 3), "adaptive_max": lambda t: F.adaptive_max_pool2d(t, 3),
          "avg": lambda t: F.avg_pool2d(t, 2), "max": lambda t: F.max_pool2d(t, 2)}[op]
    x = torch.nested.nested_tensor([torch.randn(4, 9, 7), torch.randn(4, 6, 10)], layout=mj.multi_jagged, requires_grad=True)
    out = fn(x)
    if loss == "sum":
        total = out.sum()
    else:
        flat = out.flatten(1) if op.startswith("adaptive") else F.adaptive_avg_pool2d(out, 2).flatten(1)
        total = (flat @ torch.randn(flat.shape[1], 2)).sum()
    with _BackwardFormats() as mode:
        torch.autograd.grad(total, x)
    seen = [s for s in mode.seen if s[0] != aten._adaptive_avg_pool2d_backward.default or op == "adaptive_avg"]
    assert seen, "no pooling backward ran image by image"
    for func, grad_cl, input_cl in seen:
        assert grad_cl == input_cl, f"{func}: gradient channels last {grad_cl}, input channels last {input_cl}"


# ----------------------------------------------------------------------------- the default rules
def _no_canvas(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the canvas was used")
    for name in ("to_canvas", "from_canvas", "rows_conv", "max_pool1d_rows", "max_pool2d_rows"):
        monkeypatch.setattr(canvas, name, refuse)


def test_few_large_images_pool_image_by_image(monkeypatch):
    """At the default rules a few large images never build (pixel, window) pairs nor a canvas."""
    _no_canvas(monkeypatch)

    def refuse(*a, **k):
        raise AssertionError("(pixel, window) pairs were built")
    monkeypatch.setattr(vision_norms, "_candidates", refuse)
    comps = _images([(40, 33), (0, 5), (25, 48)], c=16, dtype=torch.float32)
    tol = dict(rtol=1e-5, atol=1e-6)
    _check_dense_out(lambda t: F.adaptive_avg_pool2d(t, 7), lambda c: F.adaptive_avg_pool2d(c, 7), comps, (2, 3),
                     float("nan"), torch.float32, **tol)
    _check_dense_out(lambda t: F.adaptive_max_pool2d(t, 7), lambda c: F.adaptive_max_pool2d(c, 7), comps, (2, 3),
                     float("-inf"), torch.float32, **tol)
    for fn in (lambda t: F.avg_pool2d(t, 2), lambda t: F.max_pool2d(t, 3, 2, 1)):
        _check(fn, fn, comps, rtol=1e-5, atol=1e-6)


def test_few_waveforms_convolve_sample_by_sample(monkeypatch):
    """A wav2vec2-style front end on four waveforms at the default rule: each signal's dense conv
    (no canvas), equal to the per-sample conv with every gradient."""
    _no_canvas(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(8, 1, 10, generator=g, dtype=F64, requires_grad=True)
    w2 = torch.randn(8, 8, 3, generator=g, dtype=F64, requires_grad=True)
    b2 = torch.randn(8, generator=g, dtype=F64, requires_grad=True)
    waves = [torch.randn(1, n, generator=g, dtype=F64) for n in (1600, 4000, 2400, 3200)]
    fn = lambda t: F.conv1d(F.gelu(F.conv1d(t, w1, stride=5)), w2, b2, stride=2, padding=1)  # noqa: E731
    _check(fn, fn, waves, [w1, w2, b2])


# ----------------------------------------------------------------------------- 1-d convolutions
CONV1D = [dict(cin=1, k=10, stride=5), dict(cin=1, k=3, padding=1, bias=False), dict(cin=4, k=3, stride=2),
          dict(cin=4, k=3, padding=2, dilation=2), dict(cin=4, k=1, groups=2), dict(cin=6, k=4, stride=3, padding=1, groups=3),
          dict(cin=4, k=5, padding="same")]


@pytest.mark.parametrize("kw", CONV1D, ids=str)
@pytest.mark.parametrize("per_sample", [True, False], ids=["per sample", "canvas"])
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
def test_conv1d_sample_by_sample_or_canvas(kw, per_sample, dtype, monkeypatch):
    monkeypatch.setattr(per_image, "SIGNAL_CALL_NS", 0.0 if per_sample else float("inf"))
    kw = dict(kw)
    cin, k, groups, bias = kw.pop("cin"), kw.pop("k"), kw.get("groups", 1), kw.pop("bias", True)
    g = torch.Generator().manual_seed(k)
    w = torch.randn(6, cin // groups, k, generator=g, dtype=F64).to(dtype).requires_grad_()
    b = torch.randn(6, generator=g, dtype=F64).to(dtype).requires_grad_() if bias else None
    comps = _images([14, 0, 31, 10, 12], c=cin, dtype=dtype, seed=cin)
    fn = lambda t: F.conv1d(t, w, b, **kw)  # noqa: E731
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    _check(fn, fn, comps, [t for t in (w, b) if t is not None], **tol)


def test_conv1d_sample_by_sample_no_leakage_and_errors(monkeypatch):
    monkeypatch.setattr(per_image, "SIGNAL_CALL_NS", 0.0)
    w = torch.randn(3, 2, 4, dtype=F64)
    a = [torch.randn(2, 9, dtype=F64), torch.randn(2, 6, dtype=F64)]
    b = [a[0], a[1] * 2 - 1]
    out_a, out_b = (F.conv1d(mj.nested_tensor(c, ragged_dims=(2,)), w, stride=2) for c in (a, b))
    assert torch.equal(out_a[0], out_b[0])
    with pytest.raises(ValueError, match="sample 1 .*smaller than the window"):
        F.conv1d(mj.nested_tensor([torch.randn(2, 9, dtype=F64), torch.randn(2, 2, dtype=F64)], ragged_dims=(2,)), w)


def test_conv1d_sample_by_sample_bfloat16(monkeypatch):
    monkeypatch.setattr(per_image, "SIGNAL_CALL_NS", 0.0)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, 3, generator=g).bfloat16()
    comps = [torch.randn(3, n, generator=g).bfloat16() for n in (5, 0, 9)]
    out = F.conv1d(mj.nested_tensor(comps, ragged_dims=(2,)), w, padding=1)
    assert out.dtype == torch.bfloat16
    for o, c in zip(out.unbind(), comps):
        if c.numel():
            torch.testing.assert_close(o, F.conv1d(c[None], w, padding=1)[0], rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------------- group norm
def test_group_norm_of_a_channel_per_group_is_the_dense_kernel_bit_for_bit(monkeypatch):
    """A channel per group (wav2vec2's ``GroupNorm(C, C)``) on signals: the dense contiguous
    kernel on each sample, so its float32 output is the per-sample loop's exactly."""
    monkeypatch.setattr(norms, "ROWS_PER_SAMPLE_NATIVE", 0)
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    comps = [torch.randn(8, n, generator=g) for n in (300, 0, 517)]
    out = F.group_norm(mj.nested_tensor(comps, ragged_dims=(2,)), 8, w, b)
    for o, c in zip(out.unbind(), comps):
        if c.numel():
            assert torch.equal(o, F.group_norm(c[None], 8, w, b)[0])
    _check(lambda x: F.group_norm(x, 8, w.double(), b.double()), lambda x: F.group_norm(x, 8, w.double(), b.double()),
           [c.double() for c in comps])
