"""Convolution, transposed convolution and pooling over ragged spatial dims (ops/vision/conv.py,
kernels/canvas.py), against the per-sample reference: each image through the dense op alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import example, given, strategies as st

import torch_multijagged as mj
from torch_multijagged import multi_jagged
from torch_multijagged.errors import StructureError


F64 = torch.float64
# one empty image; sides ≥ 5 otherwise, so every geometry below is defined on every image
SIZES2 = [(7, 9), (5, 6), (0, 3), (9, 5), (6, 6)]
SIZES1 = [7, 5, 0, 12, 6]


def _images(sizes, c=4, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(c, *((s,) if isinstance(s, int) else s), generator=g, dtype=torch.float64).to(dtype) for s in sizes]


def _batch(comps, requires_grad=False):
    return torch.nested.nested_tensor([c.detach() for c in comps], layout=multi_jagged, requires_grad=requires_grad)


def _leaves(comps):
    return [c.detach().clone().requires_grad_() for c in comps]


def _check(fn_ours, fn_dense, comps, params=(), grads=True, rtol=1e-7, atol=1e-7):
    """Forward per sample, then gradients of every input and parameter against the per-sample
    reference (a random cotangent per sample)."""
    x = _batch(comps, requires_grad=grads)
    out = fn_ours(x)
    outs = out.unbind()
    leaves = _leaves(comps)
    refs = []
    for i, c in enumerate(leaves):
        if c.numel() == 0:
            assert outs[i].numel() == 0, f"sample {i}: an empty image gives an empty output"
            refs.append(None)
            continue
        r = fn_dense(c.unsqueeze(0)).squeeze(0)
        torch.testing.assert_close(outs[i], r, rtol=rtol, atol=atol, msg=lambda m: f"sample {i}: {m}")
        refs.append(r)
    if not grads:
        return out
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs]
    loss = sum((o * t).sum() for o, t in zip(outs, cots))
    ref_loss = sum((r * t).sum() for r, t in zip(refs, cots) if r is not None)
    got = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    want = torch.autograd.grad(ref_loss, [*leaves, *params], allow_unused=True)
    for i, (a, b) in enumerate(zip(got[0].unbind(), want[: len(leaves)])):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, rtol=rtol, atol=atol,
                                   msg=lambda m: f"grad of sample {i}: {m}")
    for k, (a, b) in enumerate(zip(got[1:], want[len(leaves):])):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"grad of parameter {k}: {m}")
    return out


CONV2D = [
    dict(k=3, stride=1, padding=1),
    dict(k=3, stride=1, padding="same", dilation=2),
    dict(k=2, stride=1, padding="same"),  # asymmetric "same"
    dict(k=3, stride=2, padding=1),
    dict(k=1, stride=2, padding=0, bias=False),
    dict(k=5, stride=3, padding=2),
    dict(k=3, stride=1, padding=1, groups=2),
    dict(k=4, stride=2, padding=1, groups=4, bias=False),
    dict(k=3, stride=1, padding="valid"),
    dict(k=(3, 1), stride=(2, 1), padding=(1, 0)),
    dict(k=(1, 3), stride=(1, 2), padding=(0, 2), dilation=(1, 2)),
]


def _conv_params(n, cfg, c=4, cout=8, seed=3):
    k = cfg["k"]
    k = (k,) * n if isinstance(k, int) else k
    g = torch.Generator().manual_seed(seed)
    groups = cfg.get("groups", 1)
    w = torch.randn(cout, c // groups, *k, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(cout, generator=g, dtype=F64, requires_grad=True) if cfg.get("bias", True) else None
    kw = {key: cfg[key] for key in ("stride", "padding", "dilation", "groups") if key in cfg}
    return w, b, kw


@pytest.mark.parametrize("cfg", CONV2D, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_conv2d_per_sample_with_gradients(cfg):
    w, b, kw = _conv_params(2, cfg)
    params = [w] + ([b] if b is not None else [])
    _check(lambda x: F.conv2d(x, w, b, **kw), lambda x: F.conv2d(x, w, b, **kw), _images(SIZES2), params)


@pytest.mark.parametrize("cfg", [dict(k=3, stride=1, padding=1), dict(k=3, stride=2, padding=1, dilation=2),
                                 dict(k=2, stride=1, padding="same", groups=2), dict(k=1, stride=3, padding=0)],
                         ids=str)
def test_conv1d_per_sample_with_gradients(cfg):
    w, b, kw = _conv_params(1, cfg)
    params = [w] + ([b] if b is not None else [])
    _check(lambda x: F.conv1d(x, w, b, **kw), lambda x: F.conv1d(x, w, b, **kw), _images(SIZES1), params)


CONV_T = [
    dict(k=3, stride=2, padding=1, output_padding=1),
    dict(k=2, stride=2, padding=0),
    dict(k=3, stride=1, padding=1),
    dict(k=4, stride=2, padding=1, groups=2, bias=False),
    dict(k=3, stride=2, padding=0, dilation=2),
]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("cfg", CONV_T, ids=str)
def test_conv_transpose_per_sample_with_gradients(n, cfg):
    g = torch.Generator().manual_seed(5)
    groups = cfg.get("groups", 1)
    w = torch.randn(4, 6 // groups, *(cfg["k"],) * n, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=F64, requires_grad=True) if cfg.get("bias", True) else None
    kw = {key: cfg[key] for key in ("stride", "padding", "output_padding", "groups", "dilation") if key in cfg}
    fn = F.conv_transpose2d if n == 2 else F.conv_transpose1d
    sizes = SIZES2 if n == 2 else SIZES1
    _check(lambda x: fn(x, w, b, **kw), lambda x: fn(x, w, b, **kw), _images(sizes), [w] + ([b] if b is not None else []))


POOLS = [
    ("max", dict(kernel_size=2)),
    ("max", dict(kernel_size=3, stride=2, padding=1)),
    ("max", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max", dict(kernel_size=2, stride=1, dilation=2)),
    ("max", dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))),
    ("avg", dict(kernel_size=2)),
    ("avg", dict(kernel_size=3, stride=2, padding=1)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=True)),
    ("avg", dict(kernel_size=2, stride=1, divisor_override=3)),
]


@pytest.mark.parametrize("kind,kw", POOLS, ids=str)
def test_pool2d_per_sample_with_gradients(kind, kw):
    fn = F.max_pool2d if kind == "max" else F.avg_pool2d
    _check(lambda x: fn(x, **kw), lambda x: fn(x, **kw), _images(SIZES2))


def test_max_pool2d_return_indices_and_first_maximum_takes_gradient():
    """Ties (zeros after a ReLU): dense max pooling gives the whole gradient to the first
    maximum in scan order; so must we, and the indices are dense's per-sample flat indices."""
    comps = [c.clamp(min=0) for c in _images(SIZES2)]  # many zero ties
    x = _batch(comps)
    out, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    for o, i, c in zip(out.unbind(), idx.unbind(), comps):
        if c.numel():
            r, ri = F.max_pool2d(c[None], 3, 2, 1, return_indices=True)
            assert torch.equal(o, r[0]) and torch.equal(i, ri[0])
    _check(lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1), comps)
    o2, i2 = nn.MaxPool2d(2, return_indices=True)(x)
    assert i2.dtype == torch.int64 and o2.shape[2] is not x.shape[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes_as_dense(dtype):
    comps = _images(SIZES2, dtype=dtype)
    w = torch.randn(6, 4, 3, 3).to(dtype)
    tol = dict(rtol=1.6e-2, atol=1e-1) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    x = _batch(comps)
    for fn in (lambda t: F.conv2d(t, w, padding=1), lambda t: F.conv2d(t, w, stride=2), lambda t: F.max_pool2d(t, 2),
               lambda t: F.avg_pool2d(t, 2)):
        out = fn(x)
        assert out.dtype == dtype
        for o, c in zip(out.unbind(), comps):
            if c.numel():
                torch.testing.assert_close(o, fn(c[None])[0], **tol)



@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
def test_integer_average_pools_as_dense(dtype):
    """Average pooling of int64 images is int64, each window's sum divided truncating (dense's
    integer kernel), padded windows and ``divisor_override`` too; other integer dtypes and bool
    raise dense's own error. ``lp_pool2d`` of int64 reads those truncated averages."""
    g = torch.Generator().manual_seed(4)
    comps = [torch.randint(-40, 40, (2, h, w), generator=g).to(dtype) for h, w in [(7, 9), (5, 6), (0, 3), (9, 5)]]
    x = _batch(comps)
    for fn in (lambda t: F.avg_pool2d(t, 2), lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
               lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True), lambda t: F.avg_pool2d(t, 2, divisor_override=3),
               lambda t: F.lp_pool2d(t, 2, 2)):
        try:
            want = [fn(c[None])[0] if c.numel() else None for c in comps]
        except (RuntimeError, NotImplementedError) as e:
            with pytest.raises(type(e)):
                fn(x)
            continue
        for i, (o, w) in enumerate(zip(fn(x).unbind(), want)):
            if w is not None:
                assert o.dtype == w.dtype and torch.equal(o, w), f"sample {i}: {o} != {w}"

def test_keeps_nested_int_when_sizes_are_kept_and_shares_it_by_rule():
    x = _batch(_images(SIZES2))
    w3 = torch.randn(4, 4, 3, 3, dtype=F64)
    w1 = torch.randn(4, 4, 1, 1, dtype=F64)
    y = F.conv2d(x, w3, padding=1)
    assert y.shape[2] is x.shape[2] and y.shape[3] is x.shape[3]
    assert F.conv2d(x, w3, padding="same").shape[2] is x.shape[2]
    # strided conv 3x3/2 pad 1 and max pooling 3x3/2 pad 1: one size rule, one nested int
    a, b = F.conv2d(x, w3, stride=2, padding=1), F.max_pool2d(x, 3, 2, 1)
    assert a.shape[2] is b.shape[2] and a.shape[3] is b.shape[3]
    (a + b).unbind()  # they add
    # the same op twice: the same nested int (cached on the extent)
    assert F.conv2d(x, w1, stride=2).shape[2] is F.conv2d(x, w1, stride=2).shape[2]
    # a ResNet shortcut (1x1 / 2) next to a 3x3 / 2 pad 1 main branch: equal sizes, so they add eagerly
    (F.conv2d(x, w1, stride=2) + a).unbind()


def test_square_batch_stays_square():
    comps = _images([(5, 5), (7, 7), (0, 0), (4, 4)])
    x = _batch(comps)
    assert x.shape[2] is x.shape[3]
    w = torch.randn(6, 4, 3, 3, dtype=F64, requires_grad=True)
    y = _check(lambda t: F.conv2d(t, w, stride=2, padding=1), lambda t: F.conv2d(t, w, stride=2, padding=1), comps, [w])
    assert y.shape[2] is y.shape[3]


def test_equal_size_images_and_batch_of_one():
    """``nested_tensor`` of images of one size calls dim 1 ragged, as torch.jagged does; the
    spatial ops read it as channels."""
    w = torch.randn(6, 4, 3, 3, dtype=F64, requires_grad=True)
    for comps in (_images([(5, 6), (5, 6)]), _images([(7, 4)])):
        x = _batch(comps)
        assert x._ragged_dims == (1,)
        _check(lambda t: F.conv2d(t, w, stride=2, padding=1), lambda t: F.conv2d(t, w, stride=2, padding=1), comps, [w])
        _check(lambda t: F.max_pool2d(t, 2), lambda t: F.max_pool2d(t, 2), comps)
    x = torch.nested.nested_tensor([torch.randn(3, 5, 5), torch.randn(2, 5, 5)], layout=multi_jagged)
    with pytest.raises(StructureError, match=r"conv2d\(\): expected a static channel dim"):
        F.conv2d(x, torch.randn(4, 3, 3, 3))


def test_static_spatial_dim_and_transposed_storage():
    # text lines: one height, widths vary -> (B, C, 6, j0)
    comps = _images([(6, 9), (6, 5), (6, 0), (6, 12)])
    x = _batch(comps)
    assert x._ragged_dims == (3,)
    w = torch.randn(6, 4, 3, 3, dtype=F64, requires_grad=True)
    for kw in (dict(padding=1), dict(stride=2, padding=1), dict(stride=(1, 2), padding=(0, 1))):
        y = _check(lambda t: F.conv2d(t, w, **kw), lambda t: F.conv2d(t, w, **kw), comps, [w])
        assert y._ragged_dims == (3,)
    _check(lambda t: F.avg_pool2d(t, 2), lambda t: F.avg_pool2d(t, 2), comps)
    # a transposed view: (B, C, j1, j0)
    comps = _images(SIZES2)
    xt = _batch(comps).transpose(2, 3)
    out = F.conv2d(xt, w.detach(), stride=2, padding=1)
    for o, c in zip(out.unbind(), comps):
        if c.numel():
            torch.testing.assert_close(o, F.conv2d(c.transpose(1, 2)[None], w.detach(), stride=2, padding=1)[0])


def test_no_leakage_between_images():
    """Changing image j leaves every other image's output (and gradient) bit-identical."""
    comps = _images(SIZES2)
    changed = list(comps)
    changed[1] = changed[1] * 7 + 1
    w = torch.randn(6, 4, 3, 3, dtype=F64)
    b = torch.randn(6, dtype=F64)
    for fn in (lambda t: F.conv2d(t, w, b, padding=1), lambda t: F.conv2d(t, w, b, stride=2, padding=2, dilation=2),
               lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), lambda t: F.avg_pool2d(t, 3, 2, 1),
               lambda t: F.conv_transpose2d(t, w.transpose(0, 1), None, 2, 1, 1)):
        xa, xb = _batch(comps, True), _batch(changed, True)
        oa, ob = fn(xa), fn(xb)
        ga = torch.autograd.grad(oa.values().square().sum(), xa)[0]
        gb = torch.autograd.grad(ob.values().square().sum(), xb)[0]
        for i, (p, q, r, s) in enumerate(zip(oa.unbind(), ob.unbind(), ga.unbind(), gb.unbind())):
            if i != 1:
                assert torch.equal(p, q) and torch.equal(r, s), i


def test_second_order_gradients():
    comps = _images([(4, 5), (0, 2), (3, 3)], c=2)
    w = torch.randn(3, 2, 3, 3, dtype=F64, requires_grad=True)
    b = torch.randn(3, dtype=F64, requires_grad=True)
    x = _batch(comps, requires_grad=True)
    v = x.values().detach().requires_grad_()
    off, sizes = x._partition.offsets, x._partition.host_sizes()

    def f(v, w, b):
        t = mj.from_packed(v, off, sizes, (2, 3))
        y = F.conv2d(t, w, b, stride=2, padding=1).tanh()
        y = F.max_pool2d(F.conv_transpose2d(y, w, None, 2, 1, 1), 2, 1, ceil_mode=True)
        return F.avg_pool2d(y, 2, 1, 1).values()

    assert torch.autograd.gradcheck(f, (v, w, b))
    assert torch.autograd.gradgradcheck(f, (v, w, b))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_grad_modes(mode):
    comps = _images(SIZES2)
    w = torch.randn(6, 4, 3, 3, dtype=F64, requires_grad=True)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    x = _batch(comps, requires_grad=mode == "no_grad")
    with ctx:
        for fn in (lambda t: F.conv2d(t, w, padding=1), lambda t: F.max_pool2d(F.conv2d(t, w, stride=2), 2)):
            y = fn(x)
            assert not y.requires_grad
            for o, c in zip(y.unbind(), comps):
                if c.numel():
                    torch.testing.assert_close(o, fn(c[None])[0])


def test_modules_run_unchanged():
    """A torchvision-style block: Conv2d / MaxPool2d / AvgPool2d / ConvTranspose2d modules."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.AvgPool2d(2, 1),
        nn.ConvTranspose2d(8, 4, 2, stride=2),
    ).double()
    comps = _images(SIZES2)
    _check(net, net, comps, list(net.parameters()))


def test_samples_smaller_than_the_window_raise_naming_the_sample():
    x = _batch(_images([(7, 7), (2, 9)]))
    with pytest.raises(ValueError, match=r"conv2d\(\): sample 1 of spatial size 2×9 is smaller than the window"):
        F.conv2d(x, torch.randn(3, 4, 3, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"max_pool2d\(\): sample 1"):
        F.max_pool2d(x, 3)


def test_bad_input_errors_name_the_op():
    x = _batch(_images(SIZES2))
    with pytest.raises(ValueError, match=r"conv2d\(\): expected an input with 3 channels"):
        F.conv2d(x, torch.randn(6, 3, 3, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"conv1d\(\): expected a dense 3-D weight"):
        F.conv1d(_batch(_images(SIZES1)), torch.randn(6, 4, 3, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"conv2d\(\): padding='same' is not supported for strided"):
        F.conv2d(x, torch.randn(6, 4, 3, 3, dtype=F64), stride=2, padding="same")
    with pytest.raises(ValueError, match=r"conv_transpose2d\(\): expected an input with 5 channels"):
        F.conv_transpose2d(x, torch.randn(5, 4, 3, 3, dtype=F64))
    with pytest.raises(ValueError, match=r"max_pool2d\(\): pad should be at most half"):
        F.max_pool2d(x, 2, padding=2)
    ragged_c = mj.nested_tensor([torch.randn(3, 4, 5), torch.randn(2, 6, 5)], ragged_dims=(1, 2))
    with pytest.raises(StructureError, match=r"conv2d\(\): expected a static channel dim"):
        F.conv2d(ragged_c, torch.randn(6, 3, 3, 3))
    with pytest.raises(ValueError, match=r"conv2d\(\): expected components \(n, C, L, L\).*also take ragged spatial dims"):
        F.conv2d(x.unsqueeze(-1), torch.randn(6, 4, 3, 3, dtype=F64))


@st.composite
def _geometry(draw):
    n = draw(st.sampled_from([1, 2]))
    b = draw(st.integers(1, 4))
    sizes = [tuple(draw(st.integers(0, 9)) for _ in range(n)) for _ in range(b)]
    kind = draw(st.sampled_from(["conv", "tconv", "max", "avg"]))
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 3))
    p = draw(st.integers(0, k // 2))
    d = draw(st.integers(1, 2)) if kind != "avg" else 1
    ceil = draw(st.booleans()) if kind in ("max", "avg") else False
    return n, sizes, kind, k, s, p, d, ceil


@given(_geometry())
@example((2, [(8, 0), (0, 0)], "conv", 1, 1, 0, 1, False))  # a static side of 0 (every image 0 wide)
def test_random_geometries_match_dense_or_raise_like_dense(geo):
    n, sizes, kind, k, s, p, d, ceil = geo
    comps = _images([sz if n == 2 else sz[0] for sz in sizes], c=2, seed=len(sizes))
    w = torch.randn(3, 2, *(k,) * n, dtype=F64)
    conv, tconv = (F.conv2d, F.conv_transpose2d) if n == 2 else (F.conv1d, F.conv_transpose1d)
    mpool, apool = (F.max_pool2d, F.avg_pool2d) if n == 2 else (None, None)
    if kind in ("max", "avg") and n == 1:
        kind = "conv"
    fn = {
        "conv": lambda t: conv(t, w, None, s, p, d),
        "tconv": lambda t: tconv(t, w.transpose(0, 1), None, s, p, 0, 1, d),
        "max": lambda t: mpool(t, k, s, p, d, ceil),
        "avg": lambda t: apool(t, k, s, p, ceil),
    }[kind]
    dense_raises = False
    for c in comps:
        if c.numel():
            try:
                fn(c[None])
            except RuntimeError:
                dense_raises = True
    if dense_raises:
        with pytest.raises(ValueError, match="smaller than the window"):
            fn(_batch(comps))
        return
    _check(fn, fn, comps, grads=False)


def test_compiled_size_keeping_convs_one_graph_over_new_sizes():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(6, 4, 3, 3, dtype=F64, generator=g, requires_grad=True)
    b1 = torch.randn(6, dtype=F64, generator=g, requires_grad=True)
    w2 = torch.randn(6, 3, 2, 2, dtype=F64, generator=g, requires_grad=True)

    def f(x):
        y = F.conv2d(x, w1, b1, padding=1).relu()
        y = F.conv2d(y, w2, None, padding="same", groups=2, dilation=1)
        return (y * y).sum((-2, -1))

    cc = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cc, fullgraph=True)
    for sizes in ([(5, 7), (4, 6), (0, 2)], [(6, 3), (8, 8), (2, 9)], [(1, 1), (3, 9), (7, 7)]):
        comps = _images(sizes)
        x1, x2 = _batch(comps, True), _batch(comps, True)
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out, ref)
        got = torch.autograd.grad(out.sum(), [x1, w1, b1, w2])
        want = torch.autograd.grad(ref.sum(), [x2, w1, b1, w2])
        torch.testing.assert_close(got[0].values(), want[0].values())
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b)
    assert cc.frame_count == 1


@pytest.mark.parametrize("norm, train, backend", [("batch", True, "inductor"), ("batch", False, "aot_eager"),
                                                  ("group", True, "inductor"), ("instance", True, "aot_eager")])
def test_compiled_cnn_with_norms_one_graph(norm, train, backend):
    """conv → norm → ReLU → conv, ``fullgraph=True``: batch norm traces on the packed pixel rows
    (its statistics are over them), group and instance norm as segment sums over each image's rows, and the
    convolutions' parameter gradients come back in the strides their fake says (Inductor checks
    them). One graph over new sizes; the output, the gradients of the input and of every
    parameter, and the running statistics equal eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = {"batch": lambda: nn.BatchNorm2d(8), "group": lambda: nn.GroupNorm(2, 8),
             "instance": lambda: nn.InstanceNorm2d(8, affine=True)}[norm]
    make = lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), layer(), nn.ReLU(),  # noqa: E731
                                 nn.Conv2d(8, 8, 3, padding=1)).double().train(train)
    model = make()
    ref = make()
    ref.load_state_dict(model.state_dict())
    cc = CompileCounterWithBackend(backend)
    cf = torch.compile(model, backend=cc, fullgraph=True)
    for sizes in ([(5, 7), (4, 6), (0, 2)], [(20, 13), (9, 30), (16, 16)], [(2, 3), (7, 1), (6, 9)]):
        comps = _images(sizes, c=3)
        x1, x2 = _batch(comps, True), _batch(comps, True)
        out, want = cf(x1), ref(x2)
        torch.testing.assert_close(out.values(), want.values())
        got = torch.autograd.grad((out.values() ** 2).sum(), [x1, *model.parameters()])
        exp = torch.autograd.grad((want.values() ** 2).sum(), [x2, *ref.parameters()])
        torch.testing.assert_close(got[0].values(), exp[0].values())
        for a, b in zip(got[1:], exp[1:]):
            torch.testing.assert_close(a, b)
        if norm == "batch":
            torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
            torch.testing.assert_close(model[1].running_var, ref[1].running_var)
    assert cc.frame_count == 1
    torch._dynamo.reset()


def test_compiled_size_changing_window_raises_naming_the_op():
    torch._dynamo.reset()
    x = _batch(_images(SIZES2))
    w = torch.randn(6, 4, 3, 3, dtype=F64)
    with pytest.raises(Exception, match=r"conv2d\(\): a window that changes the per-sample sizes of a ragged spatial dim"):
        torch.compile(lambda t: F.conv2d(t, w, stride=2), backend="aot_eager", fullgraph=True)(x)


def test_compiled_size_changing_window_is_a_graph_break():
    """Without fullgraph, a strided conv or a pooling between compiled convs breaks the graph
    there and runs eagerly; results and gradients equal eager."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(4, 4, 3, 3, dtype=F64, generator=g, requires_grad=True)
    w2 = torch.randn(4, 4, 3, 3, dtype=F64, generator=g, requires_grad=True)

    def f(t):
        y = F.conv2d(t, w1, padding=1).relu()
        y = F.max_pool2d(F.conv2d(y, w2, stride=2, padding=1), 2, ceil_mode=True)
        return F.conv2d(y, w2, padding=1).sum((-2, -1))

    cf = torch.compile(f, backend="aot_eager")
    for sizes in ([(7, 9), (5, 6), (0, 3)], [(6, 6), (9, 5), (8, 8)]):
        comps = _images(sizes)
        x1, x2 = _batch(comps, True), _batch(comps, True)
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out, ref)
        got = torch.autograd.grad(out.sum(), [x1, w1, w2])
        want = torch.autograd.grad(ref.sum(), [x2, w1, w2])
        torch.testing.assert_close(got[0].values(), want[0].values())
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b)


WIDE = [
    dict(k=3, stride=1, padding=1),
    dict(k=3, stride=1, padding=2, dilation=2),
    dict(k=3, stride=2, padding=1),
    dict(k=1, stride=2, padding=0),
    dict(k=3, stride=1, padding=0),
    dict(k=(3, 1), stride=(2, 1), padding=(1, 0)),
    dict(k=4, stride=3, padding=2, dilation=1),
]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("cfg", WIDE, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_wide_conv_backward_by_taps(n, cfg):
    """≥ 16 input channels take the canvas conv with its own backward (per-tap GEMMs,
    NOTE [ Conv backward on the canvas ]): gradients of input, weight and bias per sample."""
    if n == 1 and not isinstance(cfg["k"], int):
        pytest.skip("a 2-d kernel")
    w, b, kw = _conv_params(n, cfg, c=16, cout=5)
    fn = F.conv2d if n == 2 else F.conv1d
    _check(lambda x: fn(x, w, b, **kw), lambda x: fn(x, w, b, **kw), _images(SIZES2 if n == 2 else SIZES1, c=16), [w, b])


def test_wide_conv_on_pages_and_second_order():
    from torch_multijagged.kernels import canvas as cv

    comps = _images([(9, 9), (8, 9), (9, 7), (0, 4), (6, 9)], c=16)
    plan = cv.plan_canvas(torch.tensor([list(c.shape[1:]) for c in comps]), (cv.Window(3, 1, 1, 1),) * 2, torch.device("cpu"))
    w = torch.randn(3, 16, 3, 3, dtype=F64, requires_grad=True)
    b = torch.randn(3, dtype=F64, requires_grad=True)
    orig = cv._batch_factor
    try:
        cv._batch_factor = lambda pages: 1.0 + 100.0 / pages  # force a batch of pages
        assert cv.plan_canvas(torch.tensor([list(c.shape[1:]) for c in comps]), (cv.Window(3, 1, 1, 1),) * 2,
                              torch.device("cpu")).pages > 1
        _check(lambda x: F.conv2d(x, w, b, padding=1), lambda x: F.conv2d(x, w, b, padding=1), comps, [w, b])
        _check(lambda x: F.conv2d(x, w, b, stride=2, padding=1), lambda x: F.conv2d(x, w, b, stride=2, padding=1), comps, [w, b])
    finally:
        cv._batch_factor = orig
    del plan
    small = _images([(3, 4), (0, 2), (2, 3)], c=16)
    x = _batch(small)
    v = x.values().detach().requires_grad_()
    off, sizes = x._partition.offsets, x._partition.host_sizes()
    w2 = torch.randn(2, 16, 3, 3, dtype=F64, requires_grad=True)

    def f(v, w2):
        t = mj.from_packed(v, off, sizes, (2, 3))
        return F.conv2d(F.conv2d(t, torch.cat([w2] * 8), None, padding=1).tanh(), w2, None, stride=2, padding=1).values()

    assert torch.autograd.gradcheck(f, (v, w2), fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (v, w2), fast_mode=True)


def test_readme_images_example_runs():
    """The README's images example runs as written and its shapes are what the text says."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("### Images and signals of different sizes", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {"torch": torch, "F": F, "multi_jagged": multi_jagged, "mj": mj}
    exec(compile(code, "README.md", "exec"), env)
    assert tuple(env["logits"].shape) == (4, 10)
    assert env["tokens"].shape[2] == 16 and env["grid"].shape[2] is env["h"].shape[2]
    assert [t.shape[0] for t in env["tokens"].unbind()] == [48, 12, 64, 10]  # = (h/4)·(w/4) per image


@pytest.mark.parametrize("kw", [dict(kernel_size=2, stride=2), dict(kernel_size=3, padding=1, stride=2),
                                dict(kernel_size=(2, 3), dilation=(1, 2), stride=1)], ids=str)
def test_unfold_patches_per_sample_with_gradients(kw):
    _check(lambda x: F.unfold(x, **kw), lambda x: F.unfold(x, **kw), _images(SIZES2))


@pytest.mark.parametrize("kw", [dict(kernel_size=(3, 1), padding=(1, 0)), dict(kernel_size=(2, 2), stride=(2, 1)),
                                dict(kernel_size=(2, 1), dilation=(2, 1))], ids=str)
@pytest.mark.parametrize("width", [1, 3])
def test_unfold_of_a_ragged_height_and_a_static_width(kw, width):
    # (B, C, j0, w): ConvBERT's per-position windows over (B, C, j0, 1); each sample's patches
    # row-major, a zero-length sample among them
    if width == 1 and kw["kernel_size"][1] > 1:
        pytest.skip("a 2-wide window over a 1-wide image: dense refuses it too")
    out = _check(lambda x: F.unfold(x, **kw), lambda x: F.unfold(x, **kw), _images([(7, width), (5, width), (0, width)]))
    if width == 1 and kw.get("padding") == (1, 0):
        x = _batch(_images([(7, 1), (5, 1)]))
        assert F.unfold(x, **kw).shape[2] is x.shape[2], "a size-keeping window keeps the input's nested int"
    assert out.dim() == 3


def test_a_static_width_of_its_own_gets_a_canvas_of_its_own():
    """``x`` and ``x[..., :1]`` of a ragged height share the height's partition; a convolution or
    ``unfold`` of each needs its own canvas (its width differs), where the second reused the
    first's and failed (the canvas plan was cached on the partition without the static width)."""
    comps = _images([(7, 3), (5, 3), (0, 3)], c=2)
    w = torch.randn(4, 2, 3, 1, dtype=F64)
    x = _batch(comps)
    for width in (3, 1, 2):
        conv = F.conv2d(x[..., :width], w, padding=(1, 0))
        patches = F.unfold(x[..., :width], (3, 1), padding=(1, 0))
        for i, t in enumerate(comps):
            if not t.shape[1]:  # (dense refuses an empty image; ours gives an empty output)
                assert conv.unbind()[i].numel() == 0 and patches.unbind()[i].numel() == 0
                continue
            torch.testing.assert_close(conv.unbind()[i], F.conv2d(t[..., :width], w, padding=(1, 0)))
            torch.testing.assert_close(patches.unbind()[i], F.unfold(t[None, :, :, :width], (3, 1), padding=(1, 0))[0])


def test_unfold_tokens_share_the_patch_conv_nested_int():
    """NaViT patchify two ways: ``unfold`` and ``conv2d(stride=p).flatten(2)`` give one token extent."""
    x = _batch(_images([(8, 12), (4, 8), (0, 4)], c=3))
    w = torch.randn(5, 3, 4, 4, dtype=F64)
    u = F.unfold(x, 4, stride=4)
    c = F.conv2d(x, w, stride=4).flatten(2)
    assert u.shape[2] is c.shape[2]
    torch.testing.assert_close((w.flatten(1) @ u).values(), c.values())


def test_compiled_path_op_differentiates_to_second_order():
    """``multijagged::spatial_conv`` (the op compiled graphs use) and its parameter-gradient op
    differentiate to any order, like the eager path."""
    mjops = torch.ops.multijagged
    x = _batch(_images([(4, 5), (3, 3), (0, 2)], c=2))
    off, sizes = x._partition.offsets, x._partition.host_sizes()
    v = x.values().detach().requires_grad_()
    w = torch.randn(4, 1, 3, 3, dtype=F64, requires_grad=True)
    b = torch.randn(4, dtype=F64, requires_grad=True)

    def f(v, w, b):
        t = mj.from_packed(v, off, sizes, (2, 3))
        return mjops.spatial_conv(t, w, b, [1, 1, 1, 1], [1, 1], 2).values()

    assert torch.autograd.gradcheck(f, (v, w, b))
    assert torch.autograd.gradgradcheck(f, (v, w, b))


@pytest.mark.parametrize("then", ["is_contiguous", "contiguous", "channel slice", "residual add_"])
def test_in_place_activation_after_a_convolution_then_any_op(then):
    """timm's ``ConvNormAct`` (a convolution, then ``ReLU(inplace=True)``) followed by
    ``.contiguous()``, a layout query, a channel slice or an in-place residual add: the
    convolution's result wraps its output rows, which the in-place write then changes — reading
    them afterwards is an ordinary read, per sample with gradients."""
    w = torch.randn(4, 4, 3, 3, dtype=F64, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def f(t):
        y = F.conv2d(t, w, padding=1)
        if then == "residual add_":  # torchvision's order: add the identity, then the activation
            y += t
            return F.relu(y, inplace=True).contiguous()
        y = F.relu(y, inplace=True)
        if then == "is_contiguous":
            assert y.is_contiguous() in (True, False)
            return y * 2
        if then == "contiguous":
            return y.contiguous().sin()
        return y[:, 1:3].cos()

    _check(f, f, _images(SIZES2), [w])


def test_channels_last_requests_on_images():
    """``x.contiguous(memory_format=torch.channels_last)`` / ``to`` / ``clone`` / ``empty_like``, as
    CNN training code asks of its inputs: the packed pixel rows are channels last already, so
    the values are kept (or copied) contiguous and ``is_contiguous(channels_last)`` holds for
    images whose spatial dims are all ragged; values unchanged, gradients pass; another rank
    raises as dense."""
    comps = _images(SIZES2)
    x = _batch(comps, requires_grad=True)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last_3d)
    for y in (x.contiguous(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last),
              x.clone(memory_format=torch.channels_last), x.transpose(2, 3).contiguous(memory_format=torch.channels_last)):
        assert y.is_contiguous(memory_format=torch.channels_last)
    _check(lambda t: t.transpose(2, 3).contiguous(memory_format=torch.channels_last).sin(),
           lambda t: t.transpose(2, 3).contiguous(memory_format=torch.channels_last).sin(), comps)
    assert torch.empty_like(x, memory_format=torch.channels_last).shape == x.shape
    seq = mj.nested_tensor([torch.randn(n, 4) for n in (3, 2)])
    with pytest.raises(RuntimeError, match="required rank 4"):
        seq.contiguous(memory_format=torch.channels_last)


def test_ragged_dims_of_size_one_in_every_sample_drop_as_dense_ones():
    """A global pooling that leaves ``1 × 1`` per image (``AvgPool2d(8, ceil_mode=True)``,
    transformers' EfficientNet pooler): ``reshape(p.shape[:2])``, ``view(B, C)`` and ``squeeze`` drop
    those dims as dense sizes of 1, with gradients; a dim not of size 1 everywhere still refuses."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(4, h, w, generator=g, dtype=torch.float64) for h, w in ((2, 3), (3, 2), (1, 1))]
    x = mj.nested_tensor(comps, requires_grad=True)
    p = torch.nn.AvgPool2d(8, ceil_mode=True)(x)
    r = p.reshape(p.shape[:2])
    assert type(r) is torch.Tensor and r.shape == (3, 4)
    torch.testing.assert_close(r, torch.stack([c.mean((1, 2)) for c in comps]))
    torch.testing.assert_close(p.squeeze(-1).squeeze(-1), r)
    torch.testing.assert_close(p.view(3, 4), r)
    got, = torch.autograd.grad((r * r).sum(), x)
    leaves = [c.clone().requires_grad_() for c in comps]
    want = torch.autograd.grad(sum((c.mean((1, 2)) ** 2).sum() for c in leaves), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)
    with pytest.raises(Exception):
        x.squeeze(-1)


@pytest.mark.parametrize("size", [(-1, -1, 4), (2, -1, 4)])
def test_size_keeping_ragged_dims_keeps_them_when_every_length_is_one(size):
    """``reshape(-1, -1, C)`` / ``view(B, -1, C)`` keep the ragged dim whatever the lengths: a batch
    whose samples all have one token keeps the layout (the unit-size path is for sizes that drop
    ragged dims, and two ``-1`` are not a dense size)."""
    comps = [torch.arange(4.0).reshape(1, 4), torch.arange(4.0, 8.0).reshape(1, 4)]
    x = mj.nested_tensor(comps, requires_grad=True)
    for op in ("reshape", "view"):
        y = getattr(x * 2, op)(size)
        assert isinstance(y, mj.MultiJaggedTensor) and y.shape == x.shape
        for a, c in zip(y.unbind(), comps):
            torch.testing.assert_close(a, c * 2)
    got, = torch.autograd.grad(x.reshape(size).sum(), x)
    for a in got.unbind():
        torch.testing.assert_close(a, torch.ones(1, 4))


# ----------------------------------------------------------------------------- oneDNN's one-column convolutions
# NOTE [ oneDNN's one-column convolutions ] in kernels/canvas.py: oneDNN's bf16 conv (AMX kernels)
# is wrong for an output one pixel wide. The canvas is planned wide enough on every machine; the
# values are checked where the kernels exist (they are chosen at run time by the CPU).
_AMX_BF16 = torch.backends.mkldnn.is_available() and torch.backends.cpu.get_cpu_capability().startswith("AVX512") and \
    getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


@pytest.mark.parametrize("window", [(2, 2, 0, 1), (3, 2, 1, 1), (2, 3, 0, 1), (3, 3, 1, 2), (1, 2, 0, 1), (4, 4, 2, 1),
                                    (3, 1, 1, 1)])
@pytest.mark.parametrize("widths", [[3, 2, 2], [1], [2, 1, 3], [5, 9]])
def test_canvas_conv_has_two_output_columns_and_no_padding_only_column(window, widths):
    from torch_multijagged.kernels import canvas as cv
    k, s, p, d = window
    w = cv.Window(k, s, p, p, d)
    widths = [max(n, d * (k - 1) + 1 - 2 * p) for n in widths]
    sizes = torch.tensor([[4, n] for n in widths] + [[0, 0]])
    plan = cv.plan_canvas(sizes, (cv.Window(k, s, p, p, d), w), torch.device("cpu"))
    n = plan.shape[-1]
    assert plan.out_shape[-1] >= 2
    assert all(any(0 <= o * s - p + j * d < n for o in range(plan.out_shape[-1])) for j in range(k))


def _bf16_conv_case(fn, sizes, cin, cout, k, stride, padding, transposed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randn(cin, *s, generator=g).bfloat16() for s in sizes]
    wshape = (cin, cout, *k) if transposed else (cout, cin, *k)
    weight = (torch.randn(*wshape, generator=g) / (cin * math.prod(k)) ** 0.5).bfloat16()
    bias = torch.randn(cout, generator=g).bfloat16()
    x, wt, b = _batch(comps, requires_grad=True), weight.clone().requires_grad_(), bias.clone().requires_grad_()
    for _ in range(3):  # the wrong values oneDNN returns differ run to run
        y = fn(x, wt, b, stride, padding)
        cots = [torch.randn(a.shape, generator=g).bfloat16() for a in y.unbind()]
        loss = sum((a.float() * c.float()).sum() for a, c in zip(y.unbind(), cots))
        gx, gw, gb = torch.autograd.grad(loss, (x, wt, b))
        # reference: each sample alone, in float32 without oneDNN, rounded as the output is
        leaves = [c.float().requires_grad_() for c in comps]
        wf, bf = weight.float().requires_grad_(), bias.float().requires_grad_()
        with torch.backends.mkldnn.flags(enabled=False):
            ref = [None if c.numel() == 0 else fn(c[None], wf, bf, stride, padding)[0] for c in leaves]
            live = [(r, c) for r, c in zip(ref, cots) if r is not None]
            rgx = torch.autograd.grad(sum((r * c.float()).sum() for r, c in live), (*leaves, wf, bf), allow_unused=True)
        for a, r in zip(y.unbind(), ref):
            if r is not None:
                torch.testing.assert_close(a.float(), r.bfloat16().float(), rtol=0.02, atol=0.05)
        for a, r, c in zip(gx.unbind(), rgx, comps):
            torch.testing.assert_close(a.float(), torch.zeros(c.shape) if r is None else r, rtol=0.02, atol=0.05)
        for got, want in ((gw, rgx[-2]), (gb, rgx[-1])):  # sums over many pixels, rounded to bf16
            torch.testing.assert_close(got.float(), want, rtol=0.02, atol=0.02 * float(want.abs().max()) + 0.05)


@pytest.mark.skipif(not _AMX_BF16, reason="oneDNN's AMX bf16 convolutions run only on CPUs with AMX")
@pytest.mark.parametrize("case", [
    # a canvas 4 columns wide, one output column (each image alone is fine)
    (F.conv2d, [(2, 3), (2, 2), (4, 2), (0, 0)], 160, 320, (2, 2), 2, 0),
    (F.conv2d, [(5, 1), (3, 1), (0, 0)], 128, 128, (3, 3), 2, 1),
    (F.conv2d, [(9, 2), (5, 1), (0, 0)], 160, 128, (3, 3), 3, 1),
    (F.conv1d, [(1,), (2,), (0,)], 160, 320, (3,), 2, 1),
    (F.conv_transpose2d, [(4, 1), (3, 1), (0, 0)], 320, 160, (3, 3), 2, 1),
    # large images convolved one by one (NOTE [ Convolutions image by image ]), one column each
    (F.conv2d, [(1100, 3), (1000, 2), (0, 0)], 160, 320, (2, 2), 2, 0),
])
def test_bf16_convs_of_narrow_canvases_match_the_exact_per_sample_conv(case):
    fn, sizes, cin, cout, k, stride, padding = case
    _bf16_conv_case(fn, sizes, cin, cout, k, stride, padding, transposed=fn is F.conv_transpose2d)


@pytest.mark.skipif(not _AMX_BF16, reason="oneDNN's AMX bf16 convolutions run only on CPUs with AMX")
def test_bf16_conv3d_of_narrow_volumes_matches_the_exact_per_sample_conv():
    _bf16_conv_case(F.conv3d, [(2, 4, 3), (2, 2, 3), (0, 0, 0)], 160, 320, (2, 2, 2), 2, 0)
