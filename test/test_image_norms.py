"""Normalisation and adaptive pooling over ragged spatial dims (ops/vision/norms.py, NOTE [ Norms and
adaptive pooling over ragged spatial dims ]): ``batch_norm``, ``instance_norm``, ``group_norm``,
``layer_norm`` over channels-last images and ``adaptive_{avg,max}_pool{1,2}d``, on images
``(B, C, j0, j1)``, square batches ``(B, C, j0, j0)``, one static side ``(B, C, 3, j0)`` /
``(B, C, j0, 3)`` and signals ``(B, C, j0)``. Each against the dense op per sample (for
``batch_norm``: over the concatenated valid pixels), with a zero-size sample, gradients to every
input, second order, no_grad / inference_mode and no leakage."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, strategies as st

import torch_multijagged as mj

from _reference import assert_close, extent_rows, few, random_values, seeds
from _structures import bit_equal

FEW = few(10)
DT = torch.float64
S = 3  # the static side of the one-static-side layouts

# kind: (component shape from (c, n, m), ragged dims)
KINDS = {
    "rect": (lambda c, n, m: (c, n, m), (2, 3)),
    "square": (lambda c, n, m: (c, n, n), (2, 3)),
    "static_h": (lambda c, n, m: (c, S, m), (3,)),
    "static_w": (lambda c, n, m: (c, n, S), (2,)),
    "signal": (lambda c, n, m: (c, n), (2,)),
}
IMAGES = ("rect", "square", "static_h", "static_w")


@st.composite
def batches(draw, kinds=tuple(KINDS), min_c=1, max_c=4, max_side=5):
    """``(kind, c, sizes)``: usually several samples with one of zero size (``extent_rows``)."""
    kind = draw(st.sampled_from(kinds))
    b = draw(st.integers(1, 4))
    rows = draw(extent_rows(b, 2, 1 if kind in ("square", "static_w", "signal") else 2, max_side))
    if kind == "static_h":
        rows = [(n, m if m or not n else 0) for n, m in rows]
    c = draw(st.integers(min_c, max_c))
    return kind, c, rows


def comps_of(kind, c, rows, seed, dtype=DT, ties=False):
    g = torch.Generator().manual_seed(seed)
    shape = KINDS[kind][0]
    return [random_values(shape(c, n, m), g, dtype, ties=ties) for n, m in rows]


def _make(comps, rd, grad=True):
    leaves = [x.detach().clone().requires_grad_(grad) for x in comps]
    return mj.as_nested_tensor(leaves, ragged_dims=rd), leaves


def _outs(out):
    return list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out.unbind(0))


def check(fn, ref, comps, rd, params=(), seed=0, rtol=1e-7, atol=1e-7, grad=True):
    """``fn(x, *params)`` against ``ref(components, *params)`` (a list with one expected output
    per sample, or None where a sample is not compared); the gradients of every component and
    every parameter under a random cotangent agree. Returns the output."""
    x, leaves = _make(comps, rd, grad)
    ps = [p.detach().clone().requires_grad_(grad and p.is_floating_point()) for p in params]
    out = fn(x, *ps)
    outs = _outs(out[0] if isinstance(out, tuple) else out)
    rl = [c.detach().clone().requires_grad_(grad) for c in comps]
    rp = [p.detach().clone().requires_grad_(grad and p.is_floating_point()) for p in params]
    exp = ref(rl, *rp)
    assert len(outs) == len(exp)
    for i, (o, e) in enumerate(zip(outs, exp)):
        if e is not None:
            assert_close(o, e, f"sample {i}", rtol, atol)
    if not grad:
        return out
    g = torch.Generator().manual_seed(seed)
    cot = [None if e is None else torch.randn(e.shape, generator=g, dtype=e.dtype) for e in exp]
    lm = sum((o * c).sum() for o, c in zip(outs, cot) if c is not None)
    lr = sum((e * c).sum() for e, c in zip(exp, cot) if c is not None)
    if not isinstance(lr, torch.Tensor) or not lr.requires_grad:
        return out
    gm = torch.autograd.grad(lm, leaves + ps, allow_unused=True)
    gr = torch.autograd.grad(lr, rl + rp, allow_unused=True)
    for k, (a, b, like) in enumerate(zip(gm, gr, rl + rp)):
        z = torch.zeros_like(like)
        assert_close(z if a is None else a, z if b is None else b, f"gradient of input {k}", rtol, atol)
    return out


def _pixels(c):
    return c.flatten(1).T  # (pixels, C), row-major over the spatial dims


def _unpixels(p, like):
    return p.T.reshape(like.shape)


def _modes(fn, ref, comps, rd):
    """no_grad and inference_mode give the same outputs as the reference."""
    exp = ref([c.clone() for c in comps])
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            outs = _outs(fn(mj.nested_tensor([c.clone() for c in comps], ragged_dims=rd)))
        for i, (o, e) in enumerate(zip(outs, exp)):
            if e is not None:
                assert_close(o, e, f"{ctx.__name__}: sample {i}")


def _no_leakage(fn, comps, rd, j=0):
    with torch.no_grad():
        a = _outs(fn(mj.nested_tensor([c.clone() for c in comps], ragged_dims=rd)))
        changed = [c.clone() for c in comps]
        changed[j] = changed[j] * 3 + 1
        b = _outs(fn(mj.nested_tensor(changed, ragged_dims=rd)))
    for i in range(len(comps)):
        if i != j:
            assert bit_equal(a[i], b[i]), f"sample {i} changed when sample {j} did"


FIXED = {  # a fixed batch per kind with a zero-size sample
    "rect": [(4, 5), (0, 3), (6, 2), (1, 7)],
    "square": [(4, 4), (0, 0), (3, 3)],
    "static_h": [(3, 4), (3, 0), (3, 7)],
    "static_w": [(4, 3), (0, 3), (6, 3)],
    "signal": [(5, 0), (0, 0), (3, 0)],
}


def fixed(kind, c=3, seed=0, **kw):
    return comps_of(kind, c, FIXED[kind], seed, **kw), KINDS[kind][1]


# ----------------------------------------------------------------------------- batch_norm
def _bn_ref(training, rm=None, rv=None, momentum=0.1):
    """Dense batch_norm over the concatenated valid pixels of the batch."""
    def ref(comps, w=None, b=None):
        pix = torch.cat([_pixels(c) for c in comps])
        out = F.batch_norm(pix, rm, rv, w, b, training, momentum)
        return [_unpixels(p, c) for p, c in zip(out.split([_pixels(c).shape[0] for c in comps]), comps)]
    return ref


@pytest.mark.parametrize("affine", [False, True])
@FEW
@given(case=batches(), seed=seeds, training=st.booleans())
def test_batch_norm_statistics_over_valid_pixels(case, seed, training, affine):
    kind, c, rows = case
    comps = comps_of(kind, c, rows, seed)
    if sum(x[0].numel() for x in comps) < 2:
        return  # dense batch_norm refuses one value per channel in training
    rd = KINDS[kind][1]
    g = torch.Generator().manual_seed(seed)
    params = (torch.randn(c, generator=g, dtype=DT), torch.randn(c, generator=g, dtype=DT)) if affine else ()
    rm, rv = torch.randn(c, generator=g, dtype=DT), torch.rand(c, generator=g, dtype=DT) + 0.5
    rm_ref, rv_ref, rm_got, rv_got = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    check(lambda x, *p: F.batch_norm(x, rm_got, rv_got, *p, training=training),
          _bn_ref(training, rm_ref, rv_ref), comps, rd, params, seed)
    assert_close(rm_got, rm_ref, "running_mean")
    assert_close(rv_got, rv_ref, "running_var")  # unbiased with the valid pixel count


def test_batch_norm_module_momentum_none_and_eval():
    """nn.BatchNorm2d with a cumulative average (momentum=None) over two steps, then eval, equals
    nn.BatchNorm1d on the (pixels, C) matrix of the same pixels."""
    comps, rd = fixed("rect")
    m = torch.nn.BatchNorm2d(3, momentum=None).double()
    r = torch.nn.BatchNorm1d(3, momentum=None).double()
    with torch.no_grad():
        m.weight.copy_(torch.tensor([1.0, 2.0, -1.0]))
        r.weight.copy_(m.weight)
    for step in range(2):
        cs = [c * (step + 1) + step for c in comps]
        check(lambda x, *p: m(x), lambda cs_, *p: [_unpixels(o, c) for o, c in zip(
            r(torch.cat([_pixels(c) for c in cs_])).split([_pixels(c).shape[0] for c in cs_]), cs_)], cs, rd, seed=step)
    assert_close(m.running_mean, r.running_mean, "running_mean")
    assert_close(m.running_var, r.running_var, "running_var")
    assert int(m.num_batches_tracked) == 2
    m.eval(), r.eval()
    check(lambda x: m(x), lambda cs_: [_unpixels(r(_pixels(c)), c) for c in cs_], comps, rd)


def test_batch_norm_1d_signal_and_static_side_float32():
    for kind in ("signal", "static_h", "static_w"):
        comps, rd = fixed(kind, dtype=torch.float32)
        check(lambda x: torch.nn.BatchNorm1d(3)(x) if kind == "signal" else torch.nn.BatchNorm2d(3)(x),
              _bn_ref(True), comps, rd, rtol=1e-5, atol=1e-5)


def test_batch_norm_no_running_stats_modes_second_order():
    comps, rd = fixed("rect", c=2)
    fn, ref = (lambda x: F.batch_norm(x, None, None, training=True)), _bn_ref(True)
    _modes(fn, ref, comps, rd)
    w, b = torch.randn(2, dtype=DT, requires_grad=True), torch.randn(2, dtype=DT, requires_grad=True)
    small = [c[:, :2, :2].clone().requires_grad_() for c in comps]
    torch.autograd.gradgradcheck(
        lambda *t: F.batch_norm(mj.as_nested_tensor(list(t[:-2]), ragged_dims=rd), None, None, t[-2], t[-1], True).values(),
        (*small, w, b))


def test_batch_norm_errors_name_the_op():
    comps, rd = fixed("rect")
    x = mj.nested_tensor(comps, ragged_dims=rd)
    with pytest.raises(ValueError, match=r"batch_norm\(\): expected weight of shape \(3,\)"):
        F.batch_norm(x, None, None, torch.ones(4, dtype=DT), training=True)
    with pytest.raises(ValueError, match=r"batch_norm\(\): expected running_mean of shape \(3,\)"):
        F.batch_norm(x, torch.zeros(2, dtype=DT), torch.ones(2, dtype=DT))
    cl = x.permute(0, 2, 3, 1)  # channels last: the channel dim 1 is ragged
    with pytest.raises(ValueError, match=r"batch_norm\(\): expected a channels-first input"):
        F.batch_norm(cl, None, None, training=True)


# ----------------------------------------------------------------------------- instance_norm
def _per_sample(dense_fn, comps):
    return [dense_fn(c.unsqueeze(0))[0] if c[0].numel() else c * 1 for c in comps]


@pytest.mark.parametrize("affine", [False, True])
@FEW
@given(case=batches(), seed=seeds)
def test_instance_norm_matches_per_sample(case, seed, affine):
    kind, c, rows = case
    comps = comps_of(kind, c, rows, seed)
    if any(x[0].numel() == 1 for x in comps):
        return  # dense instance_norm refuses one pixel (test_instance_norm_one_pixel_raises)
    rd = KINDS[kind][1]
    g = torch.Generator().manual_seed(seed)
    params = (torch.randn(c, generator=g, dtype=DT), torch.randn(c, generator=g, dtype=DT)) if affine else ()
    check(lambda x, *p: F.instance_norm(x, None, None, *p),
          lambda cs, *p: _per_sample(lambda t: F.instance_norm(t, None, None, *p), cs), comps, rd, params, seed)


def test_instance_norm_running_stats_average_per_sample_updates():
    """track_running_stats: the running statistics move towards the average over the samples
    with pixels of their dense per-sample updates (each with its own unbiased variance); on
    equal-size images this is the batched dense call."""
    comps, rd = fixed("rect")
    m = torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.3).double()
    check(lambda x: m(x), lambda cs: _per_sample(lambda t: F.instance_norm(t, None, None, m.weight, m.bias), cs), comps, rd)
    per = []
    for c in comps:
        if c[0].numel():
            rm, rv = torch.zeros(3, dtype=DT), torch.ones(3, dtype=DT)
            F.instance_norm(c.unsqueeze(0), rm, rv, momentum=0.3)
            per.append((rm, rv))
    assert_close(m.running_mean, torch.stack([p[0] for p in per]).mean(0), "running_mean")
    assert_close(m.running_var, torch.stack([p[1] for p in per]).mean(0), "running_var")
    # equal sizes: the batched dense call
    eq = [torch.randn(3, 4, 5, dtype=DT) for _ in range(3)]
    a = torch.nn.InstanceNorm2d(3, track_running_stats=True).double()
    b = torch.nn.InstanceNorm2d(3, track_running_stats=True).double()
    a(mj.nested_tensor(eq, ragged_dims=(2, 3)))
    b(torch.stack(eq))
    assert_close(a.running_mean, b.running_mean, "running_mean (equal sizes)")
    assert_close(a.running_var, b.running_var, "running_var (equal sizes)")
    # eval: the running statistics normalise every pixel
    m.eval()
    check(lambda x: m(x), lambda cs: [F.instance_norm(c.unsqueeze(0), m.running_mean, m.running_var, m.weight, m.bias,
                                                      use_input_stats=False)[0] for c in cs], comps, rd)


def test_instance_norm_one_pixel_raises_naming_the_sample():
    x = mj.nested_tensor([torch.randn(2, 3, 3), torch.randn(2, 1, 1)], ragged_dims=(2, 3))
    with pytest.raises(ValueError, match=r"instance_norm\(\): expected more than 1 spatial element .* sample 1"):
        F.instance_norm(x)


def test_instance_norm_modes_leakage_second_order_float32():
    comps, rd = fixed("static_h")
    fn = lambda x: F.instance_norm(x)  # noqa: E731
    _modes(fn, lambda cs: _per_sample(F.instance_norm, cs), comps, rd)
    _no_leakage(fn, comps, rd)
    c32, _ = fixed("rect", dtype=torch.float32)
    check(fn, lambda cs: _per_sample(F.instance_norm, cs), c32, (2, 3), rtol=1e-5, atol=1e-5)
    small = [c[:2, :2, :2].clone().requires_grad_() for c in fixed("rect")[0]]
    w, b = torch.randn(2, dtype=DT, requires_grad=True), torch.randn(2, dtype=DT, requires_grad=True)
    torch.autograd.gradgradcheck(
        lambda *t: F.instance_norm(mj.as_nested_tensor(list(t[:-2]), ragged_dims=(2, 3)), weight=t[-2], bias=t[-1]).values(),
        (*small, w, b))


# ----------------------------------------------------------------------------- group_norm
@FEW
@given(case=batches(min_c=2, max_c=6), seed=seeds, data=st.data())
def test_group_norm_matches_per_sample(case, seed, data):
    kind, c, rows = case
    groups = data.draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    comps = comps_of(kind, c, rows, seed)
    rd = KINDS[kind][1]
    g = torch.Generator().manual_seed(seed)
    params = (torch.randn(c, generator=g, dtype=DT), torch.randn(c, generator=g, dtype=DT))
    # the reference is aten's group_norm: F.group_norm refuses a one-image batch of one pixel
    # ("more than 1 value per channel"), which in a batch of several images it would not
    check(lambda x, w, b: F.group_norm(x, groups, w, b),
          lambda cs, w, b: _per_sample(lambda t: torch.group_norm(t, groups, w, b, 1e-5), cs), comps, rd, params, seed)


def test_group_norm_module_modes_leakage_second_order_errors():
    comps, rd = fixed("rect", c=4)
    m = torch.nn.GroupNorm(2, 4).double()
    ref = lambda cs: _per_sample(lambda t: F.group_norm(t, 2, m.weight, m.bias), cs)  # noqa: E731
    check(lambda x: m(x), ref, comps, rd)
    _modes(lambda x: m(x), ref, comps, rd)
    _no_leakage(lambda x: m(x), comps, rd)
    c32, _ = fixed("square", c=4, dtype=torch.float32)
    check(lambda x: F.group_norm(x, 2), lambda cs: _per_sample(lambda t: F.group_norm(t, 2), cs), c32, (2, 3),
          rtol=1e-5, atol=1e-5)
    small = [c[:2, :2, :2].clone().requires_grad_() for c in comps]
    w, b = torch.randn(2, dtype=DT, requires_grad=True), torch.randn(2, dtype=DT, requires_grad=True)
    torch.autograd.gradgradcheck(
        lambda *t: F.group_norm(mj.as_nested_tensor(list(t[:-2]), ragged_dims=(2, 3)), 1, t[-2], t[-1]).values(),
        (*small, w, b))
    x = mj.nested_tensor(comps, ragged_dims=rd)
    with pytest.raises(ValueError, match=r"group_norm\(\): expected the number of channels \(4\) to be divisible"):
        F.group_norm(x, 3)
    with pytest.raises(ValueError, match=r"group_norm\(\): expected weight of shape \(4,\)"):
        F.group_norm(x, 2, torch.ones(3, dtype=DT))


def test_group_norm_ragged_batch_of_rows_unchanged():
    """The existing case (components (n, C, L), only dim 1 ragged: n is group_norm's batch); with
    every n equal, a weight of C's size (not n's) keeps that reading."""
    comps = [torch.randn(n, 4, 3, dtype=DT) for n in (2, 0, 3)]
    check(lambda x: F.group_norm(x, 2), lambda cs: [F.group_norm(c, 2) for c in cs], comps, (1,))
    equal = [torch.randn(3, 4, 5, dtype=DT) for _ in range(2)]
    w = torch.randn(4, dtype=DT)
    check(lambda x: F.group_norm(x, 2, w), lambda cs: [F.group_norm(c, 2, w) for c in cs], equal, (1,))


@pytest.mark.parametrize("shape,count", [((4, 4, 6), 1), ((4, 4, 6), 3), ((4, 5, 6), 1), ((6, 7), 2), ((4, 2, 3, 2), 2)])
def test_group_norm_of_one_size_images_reads_dim_1_as_channels(shape, count):
    """Images (signals, volumes) of one size, whose dim 1 ``nested_tensor`` calls ragged, are
    channels first as for ``conv2d``, ``batch_norm`` and ``instance_norm``: each image's dense
    ``group_norm`` (a batch of one), values and gradients; never the rows of a ``(n, C, *)``
    component (that reading is for a dim 1 that truly varies)."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(shape, dtype=DT, generator=g) for _ in range(count)]
    params = (torch.randn(shape[0], dtype=DT, generator=g), torch.randn(shape[0], dtype=DT, generator=g))
    check(lambda x, w, b: F.group_norm(x, 2, w, b), lambda cs, w, b: [F.group_norm(c[None], 2, w, b)[0] for c in cs],
          comps, (1,), params)
    x = mj.nested_tensor(comps)
    assert x._ragged_dims == (1,)
    for a, c in zip(torch.nn.GroupNorm(2, shape[0]).double()(x).unbind(), comps):
        torch.testing.assert_close(a, F.group_norm(c[None], 2)[0])


# ----------------------------------------------------------------------------- layer_norm (channels last)
@FEW
@given(case=batches(kinds=("rect", "square")), seed=seeds)
def test_layer_norm_over_channels_last(case, seed):
    kind, c, rows = case
    comps = [x.permute(1, 2, 0).contiguous() for x in comps_of(kind, c, rows, seed)]  # (H, W, C)
    g = torch.Generator().manual_seed(seed)
    params = (torch.randn(c, generator=g, dtype=DT), torch.randn(c, generator=g, dtype=DT))
    ref = lambda cs, w, b: [F.layer_norm(x, (c,), w, b) for x in cs]  # noqa: E731
    check(lambda x, w, b: F.layer_norm(x, (c,), w, b), ref, comps, (1, 2), params, seed)
    _modes(lambda x: F.layer_norm(x, (c,), params[0], params[1]), lambda cs: ref(cs, *params), comps, (1, 2))


# ----------------------------------------------------------------------------- adaptive pooling
def _pool_ref(dense, out_size, which=0):
    """Dense pooling per sample; a sample without pixels is not compared (dense raises)."""
    def ref(cs):
        res = []
        for c in cs:
            if c[0].numel() == 0:
                res.append(None)
                continue
            r = dense(c, out_size)
            res.append(r[which] if isinstance(r, tuple) else r)
        return res
    return ref


SIZES = st.tuples(st.integers(1, 6), st.integers(1, 6))


@FEW
@given(case=batches(kinds=IMAGES), seed=seeds, size=SIZES, ties=st.booleans())
def test_adaptive_pool2d_matches_per_sample(case, seed, size, ties):
    kind, c, rows = case
    comps = comps_of(kind, c, rows, seed, ties=ties)
    if ties:
        comps = [x.relu() for x in comps]  # zeros tie: the first maximum takes the gradient
    rd = KINDS[kind][1]
    for fn, dense in ((F.adaptive_avg_pool2d, F.adaptive_avg_pool2d),
                      (lambda x, s: F.adaptive_max_pool2d(x, s), lambda c, s: F.adaptive_max_pool2d(c, s))):
        out = check(lambda x, f=fn: f(x, size), _pool_ref(dense, size), comps, rd, seed=seed)
        assert type(out) is torch.Tensor and tuple(out.shape) == (len(rows), c, *size)
    out, idx = F.adaptive_max_pool2d(mj.nested_tensor(comps, ragged_dims=rd), size, return_indices=True)
    for i, x in enumerate(comps):
        if x[0].numel():
            assert torch.equal(idx[i], F.adaptive_max_pool2d(x, size, return_indices=True)[1]), f"indices of sample {i}"


@FEW
@given(case=batches(kinds=("signal",)), seed=seeds, size=st.integers(1, 6))
@example(case=("signal", 1, [(0, 5)]), seed=2766, size=6)  # no element in the whole batch
def test_adaptive_pool1d_matches_per_sample(case, seed, size):
    kind, c, rows = case
    comps = comps_of(kind, c, rows, seed)
    for fn in (F.adaptive_avg_pool1d, F.adaptive_max_pool1d):
        out = check(lambda x, f=fn: f(x, size), _pool_ref(fn, size), comps, (2,), seed=seed)
        assert type(out) is torch.Tensor and tuple(out.shape) == (len(rows), c, size)


def test_adaptive_pool2d_golden_and_empty_sample():
    # one 2×3 image pooled to (1, 2): windows w ∈ [0, 2) and [1, 3)
    img = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]]], dtype=DT)
    x = mj.nested_tensor([img, torch.zeros(1, 0, 2, dtype=DT)], ragged_dims=(2, 3))
    avg = F.adaptive_avg_pool2d(x, (1, 2))
    assert_close(avg[0], torch.tensor([[[(1 + 2 + 4 + 5) / 4, (2 + 3 + 5 + 7) / 4]]], dtype=DT), "average")
    assert torch.isnan(avg[1]).all()  # a sample without pixels: the mean of nothing
    mx, idx = F.adaptive_max_pool2d(x, (1, 2), return_indices=True)
    assert_close(mx[0], torch.tensor([[[5.0, 7.0]]], dtype=DT), "max")
    assert idx[0].tolist() == [[[4, 5]]]  # flat index h·W + w: 5 at (1, 1), 7 at (1, 2)
    assert torch.isneginf(mx[1]).all() and (idx[1] == 0).all()  # identity of max, index 0


def test_adaptive_pool2d_static_side_of_size_zero_is_a_batch_without_pixels():
    # every image 0 pixels wide (a static side of 0): each pools like the empty sample above
    x = mj.nested_tensor([torch.randn(2, 3, 0, dtype=DT), torch.randn(2, 1, 0, dtype=DT)], ragged_dims=(2,))
    assert x.shape[3] == 0
    assert torch.isnan(F.adaptive_avg_pool2d(x, (2, 1))).all()
    mx, idx = F.adaptive_max_pool2d(x, (2, 1), return_indices=True)
    assert mx.shape == (2, 2, 2, 1) and torch.isneginf(mx).all() and (idx == 0).all()


def test_adaptive_pool2d_static_side_none_keeps_it_and_global_pool_is_dense():
    comps, rd = fixed("static_h")  # (B, C, 3, j0)
    check(lambda x: F.adaptive_avg_pool2d(x, (None, 2)), _pool_ref(F.adaptive_avg_pool2d, (None, 2)), comps, rd)
    # None at the ragged side keeps it (its nested int), the static side pooled: a text line's
    # height pooled to 1 or 2, its width kept (nn.AdaptiveAvgPool2d((1, None)))
    for size in ((1, None), (2, None), (None, None)):
        for fn in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d):
            out = check(lambda x, f=fn: f(x, size), _pool_ref(fn, size), comps, rd)
            assert out.ragged_dims == (3,)
    x = mj.nested_tensor(comps, ragged_dims=rd)
    assert F.adaptive_avg_pool2d(x, (2, None)).shape[3] == x.shape[3]  # the input's nested int
    # tied maxima: the first takes the whole gradient, as dense
    ties = [torch.ones(2, 3, w, dtype=DT, requires_grad=True) for w in (3, 1)]
    out = F.adaptive_max_pool2d(mj.as_nested_tensor(ties, ragged_dims=(3,)), (2, None))
    got = torch.autograd.grad(sum(t.sum() for t in out.unbind()), ties)
    want = torch.autograd.grad(sum(F.adaptive_max_pool2d(t[None], (2, None)).sum() for t in ties), ties)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with pytest.raises(NotImplementedError, match=r"adaptive_max_pool2d.*return_indices"):
        F.adaptive_max_pool2d(x, (2, None), return_indices=True)
    both, rd2 = fixed("rect")  # both sides ragged: one kept, the other pooled to a size, is not supported
    with pytest.raises(NotImplementedError, match=r"adaptive_avg_pool2d\(\): pooling ragged dim 2"):
        F.adaptive_avg_pool2d(mj.nested_tensor(both, ragged_dims=rd2), (2, None))
    # global pooling (size 1) is the routed mean: the same dense (B, C, 1, 1) as any other size
    for kind in ("rect", "static_w"):
        cs, r = fixed(kind)
        one = check(lambda x: F.adaptive_avg_pool2d(x, 1), _pool_ref(F.adaptive_avg_pool2d, 1), cs, r)
        two = F.adaptive_avg_pool2d(mj.nested_tensor(cs, ragged_dims=r), (1, 2))
        assert type(one) is type(two) is torch.Tensor and one.shape[:2] == two.shape[:2] and one.dim() == two.dim() == 4
        check(lambda x: torch.nn.AdaptiveMaxPool2d(1)(x), _pool_ref(F.adaptive_max_pool2d, 1, 0), cs, r)


def test_adaptive_pool2d_modes_leakage_second_order_float32_module():
    comps, rd = fixed("rect")
    for fn, dense in ((lambda x: F.adaptive_avg_pool2d(x, (2, 3)), lambda c: F.adaptive_avg_pool2d(c, (2, 3))),
                      (lambda x: F.adaptive_max_pool2d(x, (3, 2)), lambda c: F.adaptive_max_pool2d(c, (3, 2)))):
        ref = lambda cs: [dense(c) if c[0].numel() else None for c in cs]  # noqa: E731
        _modes(fn, ref, comps, rd)
        _no_leakage(fn, comps, rd)
        small = [c[:, :3, :3].clone().requires_grad_() for c in comps if c[0].numel()]
        torch.autograd.gradgradcheck(lambda *t: fn(mj.as_nested_tensor(list(t), ragged_dims=rd)), small)
    c32, _ = fixed("square", dtype=torch.float32)
    check(lambda x: torch.nn.AdaptiveAvgPool2d((3, 2))(x), _pool_ref(F.adaptive_avg_pool2d, (3, 2)), c32, (2, 3),
          rtol=1e-5, atol=1e-5)
    out, idx = torch.nn.AdaptiveMaxPool2d(2, return_indices=True)(mj.nested_tensor(c32, ragged_dims=(2, 3)))
    assert idx.dtype == torch.int64 and out.dtype == torch.float32


def test_adaptive_pool2d_errors_name_the_op():
    x = mj.nested_tensor([torch.ones(2, 3, 4, dtype=torch.int64), torch.ones(2, 1, 2, dtype=torch.int64)], ragged_dims=(2, 3))
    with pytest.raises(NotImplementedError, match="adaptive_avg_pool2d"):
        F.adaptive_avg_pool2d(x, 2)
    cl = mj.nested_tensor([torch.randn(3, 4, 2), torch.randn(1, 2, 2)], ragged_dims=(1, 2))  # (B, j0, j1, C)
    with pytest.raises(NotImplementedError, match=r"adaptive_max_pool2d\(\): expected channels-first"):
        F.adaptive_max_pool2d(cl, 2)


def test_global_average_pool_compiles():
    comps, rd = fixed("rect")
    x, leaves = _make(comps, rd)
    out = torch.compile(lambda t: F.adaptive_avg_pool2d(t, 1), backend="aot_eager", fullgraph=True)(x)
    assert_close(out, torch.stack([F.adaptive_avg_pool2d(c, 1) if c[0].numel() else torch.full((3, 1, 1), float("nan"),
                                                                                             dtype=DT) for c in comps]), "compiled")
    g = torch.autograd.grad(out.nan_to_num().sum(), leaves)
    for c, gi in zip(comps, g):
        if c[0].numel():
            assert_close(gi, torch.full_like(c, 1 / c[0].numel()), "compiled gradient")


def test_eager_only_ops_raise_under_compile_and_the_norms_trace():
    comps, rd = fixed("rect")
    x = mj.nested_tensor(comps, ragged_dims=rd)
    for op, fn in (("adaptive_avg_pool2d", lambda t: F.adaptive_avg_pool2d(t, 2)),
                   ("adaptive_max_pool2d", lambda t: F.adaptive_max_pool2d(t, 2)),
                   ("instance_norm", lambda t: F.instance_norm(t, torch.zeros(3, dtype=DT), torch.ones(3, dtype=DT)))):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=op + r"\(\): .*torch.compile cannot trace"):
            torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    # batch norm's statistics are over the packed pixel rows, group norm's and instance norm's
    # (without running statistics) segment sums over each sample's: they trace
    for op, fn in (("batch_norm", lambda t: F.batch_norm(t, None, None, training=True)),
                   ("group_norm", lambda t: F.group_norm(t, 1)), ("instance_norm", lambda t: F.instance_norm(t))):
        torch._dynamo.reset()
        assert_close(torch.compile(fn, backend="aot_eager", fullgraph=True)(x).values(), fn(x).values(), "compiled " + op)
    # a sample of one pixel raises in training, as eagerly (checked when the graph runs)
    one = mj.nested_tensor([torch.randn(3, 4, 5, dtype=DT), torch.randn(3, 1, 1, dtype=DT)], ragged_dims=(2, 3))
    with pytest.raises(RuntimeError, match=r"instance_norm\(\): expected more than 1 spatial element"):
        torch.compile(lambda t: F.instance_norm(t), backend="aot_eager", fullgraph=True)(one)


def _compiled_vs_eager(f, batches, params):
    """``f`` compiled without fullgraph (graph breaks allowed) against ``f`` eagerly, on batches
    of different sizes: outputs and the gradients of the input and every parameter."""
    cf = torch.compile(f, backend="aot_eager")
    for comps in batches:
        x1, x2 = (mj.nested_tensor(comps, ragged_dims=(2, 3), requires_grad=True) for _ in range(2))
        out, ref = cf(x1), f(x2)
        assert_close(out, ref, "compiled forward")
        got = torch.autograd.grad(out.sum(), [x1, *params])
        want = torch.autograd.grad(ref.sum(), [x2, *params])
        assert_close(got[0].values(), want[0].values(), "compiled input gradient")
        for a, b in zip(got[1:], want[1:]):
            assert_close(a, b, "compiled parameter gradient")


def test_compiled_norms_and_adaptive_pools_are_graph_breaks():
    """Without fullgraph, each adaptive pool between compiled convolutions breaks the graph there
    and runs eagerly (NOTE [ Eager-only routes ]; the norms trace): results and gradients equal
    eager."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(4, 4, 3, 3, dtype=DT, generator=g, requires_grad=True) for _ in range(2))
    nw, nb = (torch.randn(4, dtype=DT, generator=g, requires_grad=True) for _ in range(2))

    def norms(t):
        y = F.conv2d(t, w1, padding=1)
        y = F.batch_norm(y, None, None, nw, nb, training=True)
        y = F.instance_norm(F.conv2d(y, w2, padding=1)) * 2 + 1
        y = F.group_norm(y, 2, nw, nb)
        return F.conv2d(y, w2, padding=1).sum((-2, -1))

    def pools(t):
        y = F.conv2d(t, w1, padding=1)
        y = F.adaptive_avg_pool2d(y, (2, 3)) + F.adaptive_max_pool2d(y * 2 + 1, 2).sum(-1, keepdim=True)
        return F.conv2d(y, w2, padding=1)

    sizes = ([(4, 5), (3, 3), (0, 2)], [(5, 5), (6, 3), (2, 4), (3, 1)])
    batches = [comps_of("rect", 4, rows, seed) for seed, rows in enumerate(sizes)]
    _compiled_vs_eager(norms, batches, [w1, w2, nw, nb])
    _compiled_vs_eager(pools, [[c for c in b if c.numel()] for b in batches], [w1, w2])


def test_batch_norm_float32_statistics_are_accurate_over_many_pixels():
    """float32 batch norm over ~2·10⁵ pixels with a large mean: statistics and the bias and input
    gradients within float32 rounding of the float64 computation (torch's CPU kernel on the packed
    (P, C) values summed naively: its bias gradient was 1e-2 off)."""
    g = torch.Generator().manual_seed(0)
    imgs = [torch.randn(8, h, w, generator=g, dtype=torch.float64) * 0.5 + 3 for h, w in [(300, 320), (250, 330)]]
    w = torch.rand(8, dtype=torch.float64, generator=g) + 0.5
    b = torch.randn(8, dtype=torch.float64, generator=g)

    def run(dtype):
        x = mj.nested_tensor([i.to(dtype) for i in imgs], ragged_dims=(2, 3)).requires_grad_()
        wt, bt = w.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()
        y = F.batch_norm(x, None, None, wt, bt, training=True)
        cot = (1 + 0.5 * torch.cos(torch.arange(y.values().numel(), dtype=torch.float64))).view(y.values().shape).to(dtype)
        loss = (y.values() * cot).sum()
        gx, gw, gb = torch.autograd.grad(loss, [x, wt, bt])
        return y.values().double(), gx.values().double(), gw.double(), gb.double()

    # weight gradient: Σ cot·x̂ cancels (x̂ has zero mean), so float32 rounding alone is ~1e-4 of it
    for name, a, r, tol in zip("y gx gw gb".split(), run(torch.float32), run(torch.float64), (2e-6, 2e-5, 2e-3, 2e-6)):
        assert ((a - r).abs().max() / r.abs().max()) < tol, name


@pytest.mark.parametrize("op", ["group_norm", "instance_norm"])
def test_norm_gradients_recorded_for_double_backward_match_per_sample(op):
    """With ``create_graph=True`` the norms' backward runs its differentiable form (the one
    ``gradgradcheck`` differentiates, but never compares with the truth): its first-order
    gradients of input, weight and bias equal the per-sample reference's."""
    comps, rd = fixed("rect", c=4)
    comps = [c.detach().requires_grad_() for c in comps]
    w, b = torch.randn(4, dtype=DT, requires_grad=True), torch.randn(4, dtype=DT, requires_grad=True)
    if op == "group_norm":
        f, ref = (lambda x: F.group_norm(x, 2, w, b)), (lambda t: F.group_norm(t, 2, w, b))
    else:
        f, ref = (lambda x: F.instance_norm(x, weight=w, bias=b)), (lambda t: F.instance_norm(t, weight=w, bias=b))
    out = f(mj.as_nested_tensor(comps, ragged_dims=rd))
    refs = _per_sample(ref, comps)
    g = torch.Generator().manual_seed(3)
    cot = [torch.randn(r.shape, generator=g, dtype=DT) for r in refs]
    got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), [*comps, w, b], create_graph=True)
    want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), [*comps, w, b])
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


# ----------------------------------------------------------------------------- LRN and Lp pooling
@FEW
@given(batches(min_c=1, max_c=5), seeds, st.integers(1, 4))
def test_local_response_norm_per_sample(case, seed, size):
    kind, c, rows = case
    comps = comps_of(kind, c, rows, seed)
    check(lambda x: F.local_response_norm(x, size, 0.2, 0.75, 1.5),
          lambda cs: [F.local_response_norm(t.unsqueeze(0), size, 0.2, 0.75, 1.5)[0] if t.numel() else t for t in cs],
          comps, KINDS[kind][1], seed=seed)


def test_local_response_norm_refuses_a_ragged_channel_dim():
    tokens = torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(4, 3)], layout=mj.multi_jagged)
    with pytest.raises(ValueError, match="static channel dim"):
        F.local_response_norm(tokens, 2)


@pytest.mark.parametrize("kind", ["rect", "signal"])
@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0])
def test_lp_pool_per_sample(kind, norm_type):
    sizes = {"rect": [(4, 5), (2, 3), (6, 2)], "signal": [(5, 0), (2, 0), (7, 0)]}[kind]
    comps = comps_of(kind, 2, sizes, 0)
    comps = [c.abs() + 0.1 for c in comps]  # positive: the Lp norm's gradient is defined
    fn = (lambda x: F.lp_pool2d(x, norm_type, 2)) if kind == "rect" else (lambda x: F.lp_pool1d(x, norm_type, 2))
    check(fn, lambda cs: [fn(t.unsqueeze(0))[0] for t in cs], comps, KINDS[kind][1])



@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64], ids=str)
@pytest.mark.parametrize("kind", ["signal", "rect"])
def test_norms_refuse_the_dtypes_dense_refuses(kind, dtype):
    """``group_norm`` and ``instance_norm`` of integers, bool or complex raise dense's own error
    (its kernels take floating dtypes only), as they would for each sample."""
    sizes = {"rect": [(4, 5), (2, 3), (6, 2)], "signal": [(5, 0), (2, 0), (7, 0)]}[kind]
    comps = [c.to(dtype) for c in comps_of(kind, 4, sizes, 0)]
    x = mj.nested_tensor(comps, ragged_dims=KINDS[kind][1])
    for fn in (lambda t: F.group_norm(t, 2), lambda t: F.instance_norm(t)):
        with pytest.raises(Exception) as dense:
            fn(comps[0][None])
        with pytest.raises(type(dense.value)) as ours:
            fn(x)
        assert str(dense.value).split(" not implemented")[0] in str(ours.value)


@pytest.mark.parametrize("pool", ["avg", "max"])
@pytest.mark.parametrize("size", [(1, None), (None, 1)])
def test_adaptive_pool_of_a_ragged_side_to_one_beside_a_kept_ragged_side(pool, size):
    """``nn.AdaptiveAvgPool2d((1, None))`` on images of any height and width (text lines of varying
    height, each pooled to one row, its width kept): each image's dense pooling, gradients included
    (the max's to the first maximum, ties included); an image empty along the pooled side raises."""
    m = torch.nn.AdaptiveAvgPool2d(size) if pool == "avg" else torch.nn.AdaptiveMaxPool2d(size)
    g = torch.Generator().manual_seed(0)
    comps = [(torch.randn(2, h, w, generator=g, dtype=torch.float64) * 2).round() for h, w in [(3, 5), (4, 2), (1, 6)]]
    comps[0] = comps[0][:, :1, :1].expand(2, 3, 5).clone()  # every pixel tied in each channel
    comps = [c.requires_grad_() for c in comps]
    out = m(mj.as_nested_tensor(comps, ragged_dims=(2, 3)))
    refs = [m(c[None])[0] for c in comps]
    for o, r in zip(out.unbind(), refs):
        assert_close(o, r)
    got = torch.autograd.grad((out * out).sum(), comps)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), comps)
    for a, b in zip(got, want):
        assert_close(a, b)
    empty = mj.nested_tensor([torch.randn(2, 3, 4), torch.randn(2, 0, 4) if size[0] == 1 else torch.randn(2, 3, 0)],
                             ragged_dims=(2, 3))
    with pytest.raises(RuntimeError, match="non-zero size"):
        m(empty)
