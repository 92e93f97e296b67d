"""nn and scan ops over ragged dims (ops/nn/ragged.py, NOTE [ Ops over ragged dims in nn ]):
``layer_norm`` / ``rms_norm`` over a ragged ``normalized_shape``, ``cumsum``/``cumprod``, ``F.normalize`` and
1-d pooling over the ragged dim of ``(B, C, j0)``. Each against the per-sample dense reference
with a zero-length sample, gradients to every input (first and second order), no_grad and
inference_mode, the no-leakage property and one compiled test per family."""

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged.kernels import canvas as cv

from _reference import ALL_LAYOUTS, LAYOUTS, R, SEQ, SQUARE, assert_close, build, few, per_sample_check, seeds, structures
from _structures import bit_equal, comps_for, per_sample_check_any_ints

FEW = few(10)
DT = torch.float64


def _second_order(fn, ref, comps, ragged_dims, seed=0):
    """Second derivatives through ``fn`` equal those through ``ref`` per sample: the gradient of
    ⟨grad(⟨out, c⟩, x), w⟩ w.r.t. x."""
    x, leaves = build(comps, ragged_dims, requires_grad=True)
    refl = [c.detach().clone().requires_grad_() for c in comps]
    out = fn(x)
    outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
    exp = [ref(c) for c in refl]
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(e.shape, generator=g, dtype=e.dtype) for e in exp]
    w = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c in comps]
    gm = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cot)), leaves, create_graph=True, allow_unused=True)
    gr = torch.autograd.grad(sum((e * c).sum() for e, c in zip(exp, cot)), refl, create_graph=True, allow_unused=True)
    lm = sum((a * b).sum() for a, b in zip(gm, w) if a is not None)
    lr = sum((a * b).sum() for a, b in zip(gr, w) if a is not None)
    # a gradient that does not depend on x (a linear op) has second derivative 0 on either side
    ggm = torch.autograd.grad(lm, leaves, allow_unused=True) if getattr(lm, "requires_grad", False) else [None] * len(comps)
    ggr = torch.autograd.grad(lr, refl, allow_unused=True) if getattr(lr, "requires_grad", False) else [None] * len(comps)
    for k, (a, b, c) in enumerate(zip(ggm, ggr, comps)):
        z = torch.zeros_like(c)
        assert_close(z if a is None else a, z if b is None else b, f"second derivative of sample {k}")


def _modes(fn, ref, comps, ragged_dims):
    """no_grad and inference_mode give the per-sample reference too."""
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            x = mj.nested_tensor([c.clone() for c in comps], ragged_dims=ragged_dims)
            out = fn(x)
            outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
            for i, (o, c) in enumerate(zip(outs, comps)):
                assert_close(o, ref(c), f"{ctx.__name__}: sample {i}")


def _no_leakage(fn, comps, ragged_dims, j=0):
    """Changing sample j leaves every other sample's output bit-identical."""
    with torch.no_grad():
        a = fn(mj.nested_tensor([c.clone() for c in comps], ragged_dims=ragged_dims))
        changed = [c.clone() for c in comps]
        changed[j] = changed[j] * 3 + 1
        b = fn(mj.nested_tensor(changed, ragged_dims=ragged_dims))
    oa = a.unbind() if isinstance(a, mj.MultiJaggedTensor) else a.unbind(0)
    ob = b.unbind() if isinstance(b, mj.MultiJaggedTensor) else b.unbind(0)
    for i in range(len(comps)):
        if i != j:
            assert bit_equal(oa[i], ob[i]), f"sample {i} changed when sample {j} did"


def _compiled_matches_eager(fn, comps, ragged_dims):
    x, leaves = build(comps, ragged_dims, requires_grad=True)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    x2, leaves2 = build(comps, ragged_dims, requires_grad=True)
    ref = fn(x2)
    assert_close(out.values() if isinstance(out, mj.MultiJaggedTensor) else out,
                 ref.values() if isinstance(ref, mj.MultiJaggedTensor) else ref, "compiled forward")
    gm = torch.autograd.grad((out * out).sum() if not isinstance(out, mj.MultiJaggedTensor) else (out.values() ** 2).sum(), leaves)
    gr = torch.autograd.grad((ref * ref).sum() if not isinstance(ref, mj.MultiJaggedTensor) else (ref.values() ** 2).sum(), leaves2)
    for a, b in zip(gm, gr):
        assert_close(a, b, "compiled gradient")


COMPS_SEQ = lambda seed: comps_for([(3, 2), (0, 2), (4, 2), (1, 2)], seed)  # noqa: E731  (a zero-length sample)


# ----------------------------------------------------------------------------- layer_norm
# (layout, number of trailing dims normalized): each includes a ragged dim
LN_CASES = [(SEQ, 2), (SQUARE, 2), (SQUARE, 3), (LAYOUTS[2], 2), (LAYOUTS[2], 3), (LAYOUTS[3], 2), (LAYOUTS[3], 3)]


@pytest.mark.parametrize("layout,k", LN_CASES, ids=[f"{l}-{k}" for l, k in LN_CASES])
@FEW
@given(data=st.data(), seed=seeds)
def test_layer_norm_over_ragged_dims_matches_per_sample(layout, k, data, seed):
    s = data.draw(structures(layout, min_batch=0))
    comps = s.components(seed)
    per_sample_check(lambda x: F.layer_norm(x, x.shape[-k:]), R(comps, s.ragged_dims),
                     ref=lambda c: F.layer_norm(c, c.shape[-k:]), seed=seed)


@pytest.mark.parametrize("layout,k", LN_CASES, ids=[f"{l}-{k}" for l, k in LN_CASES])
@FEW
@given(data=st.data(), seed=seeds, eps=st.sampled_from([None, 1e-3]))
def test_rms_norm_over_ragged_dims_matches_per_sample(layout, k, data, seed, eps):
    """``F.rms_norm`` over trailing dims holding a ragged one: each sample over its own extent
    (``eps`` None: the dtype's epsilon, as dense torch)."""
    s = data.draw(structures(layout, min_batch=0))
    comps = s.components(seed)
    per_sample_check(lambda x: F.rms_norm(x, x.shape[-k:], eps=eps), R(comps, s.ragged_dims),
                     ref=lambda c: F.rms_norm(c, c.shape[-k:], eps=eps), seed=seed)


def test_rms_norm_over_ragged_dims_second_order_leakage_and_errors():
    comps = COMPS_SEQ(5)
    fn, ref = (lambda x: F.rms_norm(x, x.shape[1:], eps=1e-3)), (lambda c: F.rms_norm(c, c.shape, eps=1e-3))
    _second_order(fn, ref, comps, (1,))
    _no_leakage(fn, comps, (1,))
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    with pytest.raises(ValueError, match="weight and bias to be None"):
        F.rms_norm(x, x.shape[1:], torch.ones(2, dtype=DT))
    with pytest.raises(RuntimeError, match="batch dimension"):
        F.rms_norm(x, x.shape)


def test_layer_norm_over_ragged_dims_second_order_modes_leakage():
    comps = COMPS_SEQ(1)
    fn, ref = (lambda x: F.layer_norm(x, x.shape[1:], eps=1e-3)), (lambda c: F.layer_norm(c, c.shape, eps=1e-3))
    _second_order(fn, ref, comps, (1,))
    _modes(fn, ref, comps, (1,))
    _no_leakage(fn, comps, (1,))


def test_layer_norm_module_without_affine_over_ragged_dims():
    comps = COMPS_SEQ(2)
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    out = torch.nn.LayerNorm(x.shape[1:], elementwise_affine=False)(x)
    for o, c in zip(out.unbind(), comps):
        assert_close(o, F.layer_norm(c, c.shape))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norms_over_ragged_dims_in_low_precision_are_as_accurate_as_dense(op, dtype):
    """float16 / bfloat16 over a ragged dim compute in float32 and round once, as dense torch's
    CPU norms (rms_norm's default eps is float32's, dense's compute dtype): each sample's result
    is dense's, and its gradient at least as close to the float64 truth as dense's."""
    f = getattr(F, op)
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 16, generator=g).to(dtype).requires_grad_() for n in (3, 1, 6, 9)]
    x = mj.as_nested_tensor(comps)
    out = f(x, x.shape[1:])
    refs = [f(c, c.shape) for c in comps]
    truth_in = [c.detach().double().requires_grad_() for c in comps]
    truths = [f(c, c.shape) for c in truth_in]
    for o, r in zip(out.unbind(), refs):
        assert o.dtype == dtype and torch.equal(o, r)
    ws = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in truths]
    ours = torch.autograd.grad(sum((o * w.to(dtype)).sum() for o, w in zip(out.unbind(), ws)), comps)
    dense = torch.autograd.grad(sum((r * w.to(dtype)).sum() for r, w in zip(refs, ws)), comps)
    exact = torch.autograd.grad(sum((t * w.to(dtype).double()).sum() for t, w in zip(truths, ws)), truth_in)
    err = lambda gs: max((a.double() - t).abs().max().item() for a, t in zip(gs, exact))  # noqa: E731
    assert err(ours) <= err(dense) * 1.05 + 1e-6


def test_layer_norm_over_ragged_dims_rejects_weight_and_bias():
    x = mj.nested_tensor(COMPS_SEQ(3), ragged_dims=(1,))
    with pytest.raises(ValueError, match="weight and bias to be None"):
        F.layer_norm(x, x.shape[1:], torch.ones(2, dtype=DT))
    with pytest.raises(RuntimeError, match="batch dimension"):
        F.layer_norm(x, x.shape)


def test_layer_norm_fastpath_falls_through_for_ragged_normalized_shape():
    from torch_multijagged.ops import fastpath

    x = mj.nested_tensor(COMPS_SEQ(4), ragged_dims=(1,)).requires_grad_()
    assert fastpath.FAST[F.layer_norm](x, x.shape[1:]) is NotImplemented


def test_layer_norm_over_ragged_dims_compiles():
    _compiled_matches_eager(lambda x: F.layer_norm(x, x.shape[1:]), COMPS_SEQ(5), (1,))


# ----------------------------------------------------------------------------- cumsum / cumprod
SCANS = {"cumsum": torch.cumsum, "cumprod": torch.cumprod, "logcumsumexp": torch.logcumsumexp}


@pytest.mark.parametrize("name", list(SCANS))
@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=str)
@FEW
@given(data=st.data(), seed=seeds)
def test_scan_every_dim_matches_per_sample(name, layout, data, seed):
    s = data.draw(structures(layout, min_batch=0))
    ndim = len(s.layout.shape(1, 1, 1, 1, 1)) + 1
    d = data.draw(st.integers(1, ndim - 1))
    comps = s.components(seed, low=-1.5, high=1.5, ties=name == "cumprod")  # ties: zeros for cumprod
    f = SCANS[name]
    per_sample_check(lambda x: f(x, d), R(comps, s.ragged_dims), ref=lambda c: f(c, d - 1), seed=seed)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float32])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_dtypes_follow_dense(name, dtype):
    comps = [t.to(dtype) for t in comps_for([(3, 2), (0, 2), (5, 2)], 7, low=-2, high=2)]
    f = SCANS[name]
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    for d in (1, 2):
        out = f(x, d)
        for o, c in zip(out.unbind(), comps):
            assert_close(o, f(c, d - 1), f"{name} dim {d}", rtol=1e-5, atol=1e-5)
    out = torch.cumsum(x, 1, dtype=torch.float64)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("layout", [SEQ, SQUARE], ids=str)
def test_scan_in_place_matches_per_sample(name, layout):
    """``y.cumsum_(d)`` writes the scan into ``y``, with gradients through the write, per sample."""
    shapes = [(3, 2), (0, 2), (4, 2)] if layout is SEQ else [(3, 3, 2), (0, 0, 2), (2, 2, 2)]
    comps = comps_for(shapes, 11, low=-1.5, high=1.5)
    rd = (1,) if layout is SEQ else (1, 2)
    for d in range(1, len(shapes[0]) + 1):
        per_sample_check(lambda x: getattr(x * 1, name + "_")(d), R(comps, rd),
                         ref=lambda c: getattr(c * 1, name + "_")(d - 1))
    x = mj.nested_tensor([t.to(torch.int32) for t in comps_for(shapes, 12, low=-3, high=3)], ragged_dims=rd)
    want = [getattr(c.clone(), name + "_")(0) for c in x.unbind()]
    assert getattr(x, name + "_")(1) is x and x.dtype == torch.int32  # in place, its own dtype, as dense
    assert all(torch.equal(a, b) for a, b in zip(x.unbind(), want))


def test_cumprod_with_zeros_gradient_as_dense_second_order():
    comps = [torch.tensor([[1.5, 0.0], [0.0, 2.0], [3.0, -1.0], [0.5, 0.0]], dtype=DT), torch.zeros(0, 2, dtype=DT),
             torch.tensor([[0.0, 1.0], [2.0, 2.0]], dtype=DT)]
    per_sample_check(lambda x: torch.cumprod(x, 1), R(comps, (1,)), ref=lambda c: torch.cumprod(c, 0))
    _second_order(lambda x: torch.cumprod(x, 1), lambda c: torch.cumprod(c, 0), comps, (1,))
    _second_order(lambda x: x.cumsum(1), lambda c: c.cumsum(0), comps, (1,))
    _second_order(lambda x: x.logcumsumexp(1), lambda c: c.logcumsumexp(0), comps, (1,))


def test_scan_modes_and_no_leakage_on_a_pair():
    comps = comps_for([(3, 3, 2), (0, 0, 2), (4, 4, 2)], 8)
    for d in (1, 2):
        fn, ref = (lambda x: torch.cumsum(x, d)), (lambda c: torch.cumsum(c, d - 1))
        _modes(fn, ref, comps, (1, 2))
        _no_leakage(fn, comps, (1, 2))
        _no_leakage(lambda x: torch.cumprod(x, d), comps, (1, 2), j=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_logcumsumexp_with_infinities_has_dense_gradient(dtype):
    """``logcumsumexp`` along a ragged dim beside ``±inf``: values and the gradient's nans as dense
    torch's formula gives them (``[1, inf, 2]``: ``[1, nan, 0]``; differentiating the scan gave
    ``[nan, nan, 0]``), per sample, cotangents of both signs, a zero-length sample."""
    inf = float("inf")
    comps = [torch.tensor([[1.0, -2.0], [inf, 0.5], [2.0, 1.0]], dtype=dtype), torch.zeros(0, 2, dtype=dtype),
             torch.tensor([[-inf, 3.0], [0.0, -inf], [1.0, inf]], dtype=dtype)]
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    per_sample_check(lambda x: torch.logcumsumexp(x, 1), R(comps, (1,)), ref=lambda c: torch.logcumsumexp(c, 0), **tol)
    leaves = [c.clone().requires_grad_() for c in comps]
    got = torch.autograd.grad(torch.logcumsumexp(mj.as_nested_tensor(leaves, ragged_dims=(1,)), 1).values().sum(), leaves)
    assert_close(got[0][:, 0], torch.tensor([1.0, float("nan"), 0.0], dtype=dtype), "sample 0")


def test_logcumsumexp_wide_range_and_integers():
    """Pairwise ``logaddexp`` keeps prefixes far below the sample's maximum finite (a shift by the
    global maximum would underflow them to -inf); integers raise as in dense torch."""
    comps = [torch.tensor([[-800.0], [0.0], [800.0]], dtype=DT), torch.zeros(0, 1, dtype=DT)]
    per_sample_check(lambda x: torch.logcumsumexp(x, 1), R(comps, (1,)), ref=lambda c: torch.logcumsumexp(c, 0))
    with pytest.raises(RuntimeError, match="logcumsumexp"):
        torch.logcumsumexp(mj.nested_tensor([torch.arange(3)]), 1)


def test_scan_along_the_batch_dim_raises():
    x = mj.nested_tensor(COMPS_SEQ(9), ragged_dims=(1,))
    with pytest.raises(NotImplementedError, match="cumsum\\(\\): along the batch dim"):
        torch.cumsum(x, 0)


def test_scan_compiles():
    _compiled_matches_eager(lambda x: torch.cumprod(x, 1) + x.cumsum(-1), COMPS_SEQ(10), (1,))


# ----------------------------------------------------------------------------- normalize
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@FEW
@given(data=st.data(), seed=seeds)
def test_normalize_every_dim_matches_per_sample(p, layout, data, seed):
    s = data.draw(structures(layout, min_batch=0))
    ndim = len(s.layout.shape(1, 1, 1, 1)) + 1
    d = data.draw(st.integers(1, ndim - 1))
    comps = s.components(seed)
    per_sample_check(lambda x: F.normalize(x, p, d), R(comps, s.ragged_dims), ref=lambda c: F.normalize(c, p, d - 1) if c.numel() else c * 1, seed=seed)  # dense inf norm refuses empty


def test_normalize_second_order_modes_leakage_and_compile():
    comps = COMPS_SEQ(11)
    for d in (1, 2):
        fn, ref = (lambda x: F.normalize(x, dim=d)), (lambda c: F.normalize(c, dim=d - 1))
        _second_order(fn, ref, comps, (1,))
        _modes(fn, ref, comps, (1,))
        _no_leakage(fn, comps, (1,))
    _compiled_matches_eager(lambda x: F.normalize(x, dim=1) + F.normalize(x, dim=-1), comps, (1,))


# ----------------------------------------------------------------------------- pooling
def _or_empty(fn):
    """Dense pooling, or an empty (…, 0) result where dense torch refuses a too-short sample
    (ours pools it to nothing; NOTE [ Ops over ragged dims in nn ])."""

    def ref(c):
        if c.shape[-1] == 0:
            return c * 1
        try:
            return fn(c)
        except RuntimeError as e:
            assert "too small" in str(e) or "Invalid computed output size" in str(e), e
            return c.narrow(-1, 0, 0) * 1

    return ref


POOL_ARGS = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2), st.booleans(), st.booleans(), st.integers(1, 2))


def _pool_comps(data, seed, rank3=False):
    b = data.draw(st.integers(1, 4))
    ns = [data.draw(st.integers(0, 9)) for _ in range(b)]
    shapes = [(2, 3, n) if rank3 else (3, n) for n in ns]
    return comps_for(shapes, seed), (3 if rank3 else 2,)


@FEW
@given(data=st.data(), seed=seeds, args=POOL_ARGS, rank3=st.booleans())
def test_avg_pool1d_over_ragged_dim_matches_per_sample(data, seed, args, rank3):
    k, s, p, ceil, cip, _ = args
    p = min(p, k // 2)
    comps, rd = _pool_comps(data, seed, rank3)
    fn = lambda t: F.avg_pool1d(t, k, s, p, ceil, cip)  # noqa: E731
    per_sample_check_any_ints(fn, _or_empty(fn), comps, rd, seed=seed)


@FEW
@given(data=st.data(), seed=seeds, args=POOL_ARGS, rank3=st.booleans(), ties=st.booleans())
def test_max_pool1d_over_ragged_dim_matches_per_sample(data, seed, args, rank3, ties):
    k, s, p, ceil, _, dil = args
    # with dilation and padding a window can miss a short sample entirely; dense torch then
    # indexes out of bounds (heap corruption in its double backward), so no reference exists
    p = 0 if dil > 1 else min(p, k // 2)
    comps, rd = _pool_comps(data, seed, rank3)
    if ties:  # the first maximum takes the gradient, as dense
        comps = [(c * 2).round() / 2 for c in comps]
    fn = lambda t: F.max_pool1d(t, k, s, p, dil, ceil)  # noqa: E731
    _, out = per_sample_check_any_ints(fn, _or_empty(fn), comps, rd, seed=seed)
    x = mj.nested_tensor(comps, ragged_dims=rd)
    _, idx = F.max_pool1d(x, k, s, p, dil, ceil, return_indices=True)
    ref_idx = _or_empty(lambda t: F.max_pool1d(t, k, s, p, dil, ceil, return_indices=True)[1])
    for i, c in zip(idx.unbind(), comps):
        assert_close(i, ref_idx(c).to(torch.int64), "indices", rtol=0, atol=0)


def test_pool1d_second_order_modes_leakage():
    comps = comps_for([(3, 5), (3, 0), (3, 2), (3, 8)], 12)  # n >= 2: every dilated window below hits the sample
    cases = [
        (lambda t: F.avg_pool1d(t, 3, 2, 1, True, False)),
        (lambda t: F.max_pool1d(t, 2, 1, 1, 2)),
        (lambda t: torch.nn.AvgPool1d(2)(t)),
    ]
    for fn in cases:
        ref = _or_empty(fn)
        _second_order(fn, ref, comps, (2,))
        _modes(fn, ref, comps, (2,))
        _no_leakage(fn, comps, (2,), j=3)


def test_pool1d_output_lengths_differ_and_may_be_zero():
    x = mj.nested_tensor(comps_for([(2, 5), (2, 1), (2, 0), (2, 7)], 13), ragged_dims=(2,))
    out = F.avg_pool1d(x, 3, 2)  # lengths (5-3)//2+1 = 2, too short → 0, 0, (7-3)//2+1 = 3
    assert out.sizes()[:, 0].tolist() == [2, 0, 0, 3]
    same = F.max_pool1d(x, 3, 1, 1)  # same lengths: the input's nested int is kept
    assert same.shape[2] == x.shape[2]


@pytest.mark.parametrize("size", [1, 3])
@FEW
@given(data=st.data(), seed=seeds)
def test_adaptive_pool1d_over_ragged_dim_matches_per_sample(size, data, seed):
    b = data.draw(st.integers(1, 4))
    comps = comps_for([(3, data.draw(st.integers(1, 9))) for _ in range(b)], seed)  # dense refuses n = 0
    for fn in (lambda t: F.adaptive_avg_pool1d(t, size), lambda t: F.adaptive_max_pool1d(t, size)):
        per_sample_check(fn, R(comps, (2,)), dense_out=True, seed=seed)
    x = mj.nested_tensor(comps, ragged_dims=(2,))
    idx = F.adaptive_max_pool1d(x, size, return_indices=True)[1]
    assert_close(idx, torch.stack([F.adaptive_max_pool1d(c, size, return_indices=True)[1] for c in comps]), "indices")


NAN = float("nan")
# components (C, n) with two NaNs in one window: [1, nan, 3, nan] (dense index 3), a NaN after
# the maximum, NaNs in the other channel; a zero-length sample
_NAN_POOL_COMPS = [[[1.0, NAN, 3.0, NAN, 2.0, 5.0, NAN, 1.0], [NAN, 4.0, NAN, 0.0, 1.0, 1.0, 1.0, 1.0]],
                   [[], []], [[2.0, NAN, NAN, 0.5], [7.0, 7.0, 1.0, NAN]]]
_NAN_POOLS = {
    "max_pool1d 4": (lambda t: F.max_pool1d(t, 4, return_indices=True), False),
    "max_pool1d 3, 1, 1": (lambda t: F.max_pool1d(t, 3, 1, 1, return_indices=True), False),
    "adaptive_max_pool1d 1": (lambda t: F.adaptive_max_pool1d(t, 1, return_indices=True), True),
    "adaptive_max_pool1d 3": (lambda t: F.adaptive_max_pool1d(t, 3, return_indices=True), True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("pool", _NAN_POOLS, ids=str)
def test_max_pool1d_reads_the_last_nan_of_a_window(pool, dtype):
    """A window holding NaNs pools to its last NaN, as dense max pooling on the CPU (its scan
    takes every NaN): the index is that NaN's and the gradient goes there (the first NaN's was
    taken, by ``argmax`` and by ``max`` for adaptive pooling to size 1)."""
    fn, dense_out = _NAN_POOLS[pool]
    comps = [torch.tensor(c, dtype=dtype).reshape(2, -1) for c in _NAN_POOL_COMPS]
    x, leaves = build(comps, (2,), requires_grad=True)
    out, idx = fn(x)
    outs, idxs = (list(out), list(idx)) if dense_out else (out.unbind(), idx.unbind())
    g = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=g, dtype=dtype) for o in outs]
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots)), leaves)
    for i, (c, o, k, cot, gr) in enumerate(zip(comps, outs, idxs, cots, grads)):
        if c.shape[-1] == 0:  # dense refuses an empty sample; ours pools it to nothing / -inf
            assert (o.numel() == 0 or o.isneginf().all()) and gr.numel() == 0
            continue
        leaf = c.clone().requires_grad_()
        ro, rk = fn(leaf)
        assert_close(o, ro, f"sample {i}")
        assert torch.equal(k, rk), f"sample {i}: indices {k.tolist()} != dense {rk.tolist()}"
        assert_close(gr, torch.autograd.grad((ro * cot).sum(), leaf)[0], f"grad of sample {i}")


def test_adaptive_pool1d_zero_length_sample_and_modes():
    comps = comps_for([(3, 4), (3, 0), (3, 2)], 14)
    x = mj.nested_tensor(comps, ragged_dims=(2,))
    avg, mx = F.adaptive_avg_pool1d(x, 1), F.adaptive_max_pool1d(x, 1)
    assert avg[1].isnan().all() and mx[1].isneginf().all()  # mean / max of nothing
    assert F.adaptive_max_pool1d(x, 3)[1].isneginf().all()  # every output size agrees
    full = [0, 2]
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            y = mj.nested_tensor(comps, ragged_dims=(2,))
            assert_close(F.adaptive_avg_pool1d(y, 1)[full], torch.stack([F.adaptive_avg_pool1d(comps[i], 1) for i in full]))
            assert_close(F.adaptive_avg_pool1d(y, 2)[full], torch.stack([F.adaptive_avg_pool1d(comps[i], 2) for i in full]))


def test_adaptive_pool1d_compiles_and_pooling_says_why_not():
    comps = comps_for([(3, 4), (3, 1), (3, 6)], 15)
    _compiled_matches_eager(lambda t: F.adaptive_avg_pool1d(t, 1) + F.adaptive_max_pool1d(t, 1), comps, (2,))
    x = mj.nested_tensor(comps, ragged_dims=(2,))
    with pytest.raises(Exception, match="torch.compile cannot trace"):
        torch.compile(lambda t: F.avg_pool1d(t, 2), backend="aot_eager", fullgraph=True)(x)


def test_pool1d_over_static_last_dim_matches_per_sample():
    comps = comps_for([(3, 6), (0, 6), (2, 6)], 16)
    for fn in (lambda t: F.avg_pool1d(t, 2), lambda t: F.max_pool1d(t, 3, 1, 1), lambda t: F.adaptive_avg_pool1d(t, 2)):
        # dense refuses an unbatched (0, L) input; the reference pools a zero row and keeps none
        ref = lambda c, fn=fn: fn(c) if c.shape[0] else fn(torch.cat([c, c.new_zeros(1, c.shape[1])]))[:0]  # noqa: E731
        per_sample_check(fn, R(comps, (1,)), ref=ref, seed=3)


def test_pool1d_rejects_bad_arguments_as_dense():
    x = mj.nested_tensor(comps_for([(3, 6), (3, 2)], 17), ragged_dims=(2,))
    with pytest.raises(RuntimeError, match="pad should be"):
        F.avg_pool1d(x, 2, 1, 2)
    with pytest.raises(NotImplementedError, match="only ragged one"):
        F.avg_pool1d(mj.nested_tensor(comps_for([(3, 3, 2), (2, 2, 2)], 1), ragged_dims=(1, 2)).transpose(1, 3), 2)


def test_pool1d_between_compiled_convs_is_a_graph_break():
    """Without fullgraph, 1-d pooling over the ragged dim between compiled convolutions breaks
    the graph there and runs eagerly (NOTE [ Eager-only routes ]); adaptive pooling to size 1
    stays compiled. Results and gradients (input and weights) equal eager, over batches of
    different lengths with an empty signal."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(3, 3, 3, dtype=DT, generator=g, requires_grad=True) for _ in range(2))

    def f(t):
        y = F.conv1d(t, w1, padding=1) * 2 + 1
        y = F.avg_pool1d(y, 2) + F.max_pool1d(y, 2) * F.max_pool1d(y, 3, 2, 1).amax(-1, keepdim=True)
        y = F.conv1d(F.max_pool1d(y, 2, 1, 1), w2, padding=1)
        return (F.adaptive_avg_pool1d(y, 3) + F.adaptive_max_pool1d(y, 2).sum(-1, keepdim=True)
                + F.adaptive_avg_pool1d(y, 1) * F.adaptive_max_pool1d(y, 1))

    cf = torch.compile(f, backend="aot_eager")
    for seed, lengths in enumerate(([5, 7, 0, 4], [6, 9, 4])):
        comps = comps_for([(3, n) for n in lengths], seed)
        x1, x2 = (mj.nested_tensor(comps, ragged_dims=(2,), requires_grad=True) for _ in range(2))
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out, ref, equal_nan=True)
        full = [i for i, n in enumerate(lengths) if n]  # an empty signal pools to NaN (a mean of nothing)
        got = torch.autograd.grad(out[full].sum(), [x1, w1, w2])
        want = torch.autograd.grad(ref[full].sum(), [x2, w1, w2])
        torch.testing.assert_close(got[0].values(), want[0].values())
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b)


def test_pool1d_of_one_geometry_shares_the_nested_int():
    """Poolings (and a strided conv1d) of one window geometry on one extent give one nested int
    (``mapped_extent`` keyed by the size rule), so their outputs add, also in a compiled region;
    a pooling that keeps every length keeps the input's."""
    x = mj.nested_tensor(comps_for([(3, 5), (3, 0), (3, 8)], 3), ragged_dims=(2,))
    w = torch.randn(3, 3, 2, dtype=x.dtype)
    a, b, c = F.avg_pool1d(x, 2), F.max_pool1d(x, 2), F.conv1d(x, w, stride=2)
    assert a._partition.extents[0] is b._partition.extents[0] is c._partition.extents[0]
    assert F.max_pool1d(x, 3, 1, 1)._partition is x._partition
    for t, o in zip(x.unbind(), (a + b + c).unbind()):
        want = F.avg_pool1d(t, 2) + F.max_pool1d(t, 2) + F.conv1d(t, w, stride=2) if t.numel() else o
        assert_close(o, want, "sum")


# ----------------------------------------------------------------------------- pooling: dtypes, canvas
_POOL_DTYPES = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float32,
                torch.float64, torch.complex64]
_DTYPE_POOLS = {
    "avg_pool1d 3, 2, 1": lambda t: F.avg_pool1d(t, 3, 2, 1),
    "avg_pool1d 3, 2, 1 counting no pad": lambda t: F.avg_pool1d(t, 3, 2, 1, False, False),
    "avg_pool1d 2 ceil": lambda t: F.avg_pool1d(t, 2, ceil_mode=True),
    "max_pool1d 3, 2, 1": lambda t: F.max_pool1d(t, 3, 2, 1),
    "max_pool1d 3, 2, 1 indices": lambda t: F.max_pool1d(t, 3, 2, 1, return_indices=True),
    "adaptive_avg_pool1d 3": lambda t: F.adaptive_avg_pool1d(t, 3),
    "adaptive_avg_pool1d 1": lambda t: F.adaptive_avg_pool1d(t, 1),
    "adaptive_max_pool1d 3": lambda t: F.adaptive_max_pool1d(t, 3, return_indices=True),
    "adaptive_max_pool1d 1": lambda t: F.adaptive_max_pool1d(t, 1),
    "lp_pool1d 2": lambda t: F.lp_pool1d(t, 2, 2),
}
# component shapes of each layout from a length n, and its ragged dims
_POOL_LAYOUTS = {"(C, n)": (lambda n: (3, n), (2,)), "(S, C, n)": (lambda n: (2, 3, n), (3,)), "(n, C)": (lambda n: (n, 7), (1,))}


def _dtype_values(shape, dtype, g):
    """Integers with negative window sums (truncation and floor differ), floats that are not
    integral (a second rounding shows)."""
    t = torch.randint(-50, 50, shape, generator=g)
    if dtype == torch.bool:
        return t > 0
    if dtype == torch.uint8:
        return t.abs().to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        f = t.double() / 7 + torch.randn(shape, generator=g, dtype=torch.float64)
        return (torch.complex(f, torch.randn(shape, generator=g, dtype=torch.float64)) if dtype.is_complex else f).to(dtype)
    return t.to(dtype)


def _samples(out, n: int):
    if isinstance(out, tuple):
        return list(zip(*(_samples(o, n) for o in out)))
    return list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out.unbind(0))


@pytest.mark.parametrize("dtype", _POOL_DTYPES, ids=str)
@pytest.mark.parametrize("layout", _POOL_LAYOUTS)
@pytest.mark.parametrize("pool", _DTYPE_POOLS)
def test_pool1d_dtypes_are_dense(pool, layout, dtype):
    """Every dtype as dense torch per sample: its dtype and values bit for bit (int64 average
    pools truncate the window's sum, float16 / bfloat16 ones divide in float32 and round once),
    or its own error where it refuses the dtype (``max_pool1d`` refuses integers but with
    ``return_indices``; adaptive pools refuse integers and bool, and complex but for the mean
    of size 1). A zero-length sample rides along (dense refuses it; ours pools it to nothing)."""
    fn, (shape, rd) = _DTYPE_POOLS[pool], _POOL_LAYOUTS[layout]
    g = torch.Generator().manual_seed(7)
    comps = [_dtype_values(shape(n), dtype, g) for n in (7, 0, 4, 9)]
    x = mj.nested_tensor(comps, ragged_dims=rd)
    try:
        want = [None if c.numel() == 0 else fn(c) for c in comps]
    except Exception as e:  # dense refuses the dtype: ours raises its error (NOTE [ Error names ] renames it)
        with pytest.raises(type(e)) as got:
            fn(x)
        assert _message(got.value) == _message(e)
        return
    for i, (o, w) in enumerate(zip(_samples(fn(x), len(comps)), want)):
        if w is None:
            continue
        for a, b in zip(o, w) if isinstance(w, tuple) else [(o, w)]:
            assert a.dtype == b.dtype, f"sample {i}: dtype {a.dtype} != dense {b.dtype}"
            # adaptive average pooling to size 1 is the routed mean, which sums in another order
            tol = {} if pool == "adaptive_avg_pool1d 1" else dict(rtol=0, atol=0)
            torch.testing.assert_close(a, b, equal_nan=True, **tol, msg=lambda m, i=i: f"sample {i}: {m}")


def _message(e: BaseException) -> str:
    """An error's message without the op it names first and the aten op named last."""
    return re.sub(r" \(in [\w.]+\)$", "", re.sub(r"^[\w.]+\(\): ", "", str(e)))


def _a_window_misses(n: int, out: int, k: int, s: int, p: int, d: int) -> bool:
    """Whether a dilated window of a length-n sample reads no position of it."""
    return any(all(not 0 <= o * s - p + t * d < n for t in range(k)) for o in range(out))


def test_max_pool1d_windows_of_only_the_lowest_value_index_like_dense():
    """A window whose values are all the dtype's lowest value (``-inf``, ``iinfo.min``) keeps the
    dense kernel's first position in the sample, beside padding too: its index, and the gradient
    goes there (on the canvas that first position could be a gutter cell)."""
    inf = float("inf")
    comps = [torch.tensor([[-inf, -inf, 1.0, -inf, -inf, -inf, -inf]], dtype=DT), torch.zeros(1, 0, dtype=DT),
             torch.tensor([[-inf]], dtype=DT), torch.tensor([[-inf, 2.0, -inf, -inf, -inf]], dtype=DT),
             torch.tensor([[-inf, -inf, -inf, 5.0]], dtype=DT)]  # not first on the canvas: a gutter before it
    for k, s, p, d in [(3, 2, 1, 1), (3, 1, 1, 1), (2, 2, 1, 1), (4, 3, 2, 1), (3, 1, 0, 2), (2, 1, 1, 2)]:
        fn = lambda t: F.max_pool1d(t, k, s, p, d, return_indices=True)  # noqa: E731
        x, leaves = build(comps, (2,), requires_grad=True)
        out, idx = fn(x)
        grads = torch.autograd.grad(out.values().sum(), leaves)
        for i, (c, o, j, gr) in enumerate(zip(comps, out.unbind(), idx.unbind(), grads)):
            if _a_window_misses(c.shape[-1], o.shape[-1], k, s, p, d):
                # dense torch reads outside the sample there: ours reads the lowest value, no
                # other sample (sample 3's gradient above would show it)
                assert o.isneginf().all() and not gr.any(), f"{(k, s, p, d)} sample {i}"
                continue
            try:
                leaf = c.clone().requires_grad_()
                ro, rj = fn(leaf)
            except RuntimeError:  # too short for this window (or empty): pooled to nothing
                assert o.numel() == 0 and j.numel() == 0 and not gr.any()
                continue
            assert torch.equal(o, ro) and torch.equal(j, rj), f"{(k, s, p, d)} sample {i}: {j.tolist()} != {rj.tolist()}"
            assert torch.equal(gr, torch.autograd.grad(ro.sum(), leaf)[0]), f"{(k, s, p, d)} sample {i}: gradient"
    low = torch.iinfo(torch.int64).min
    ints = [torch.tensor([[low, low, 3, low, low]]), torch.tensor([[low, low]])]
    out, idx = F.max_pool1d(mj.nested_tensor(ints, ragged_dims=(2,)), 3, 2, 1, return_indices=True)
    for c, o, j in zip(ints, out.unbind(), idx.unbind()):
        ro, rj = F.max_pool1d(c, 3, 2, 1, return_indices=True)
        assert torch.equal(o, ro) and torch.equal(j, rj), (j.tolist(), rj.tolist())


@pytest.mark.parametrize("args", [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (4, 3, 2, 1, True), (3, 1, 0, 2, False), (5, 2, 2, 1, True)],
                         ids=str)
def test_max_pool1d_of_many_samples_matches_per_sample(args):
    """64 signals of 0–60 steps (the canvas then spans several pages, each sample's index
    relative to its own page): values, indices with ties and NaNs, and gradients per sample."""
    k, s, p, d, ceil = args
    g = torch.Generator().manual_seed(k * 10 + s)
    lengths = torch.randint(0, 61, (64,), generator=g).tolist()
    lengths[5] = 0
    comps = [(torch.randn(5, n, generator=g, dtype=DT) * 2).round() / 2 for n in lengths]  # ties
    comps[3][1, 2:4] = float("nan")
    fn = lambda t: F.max_pool1d(t, k, s, p, d, ceil, return_indices=True)  # noqa: E731
    x, leaves = build(comps, (2,), requires_grad=True)
    out, idx = fn(x)
    key = ("canvas", 1, (cv.Window(k, s, p, p, d, ceil_mode=ceil),), (2,), ())
    assert x._partition.derived(key, None).pages > 1  # what this test is about
    cot = [torch.randn(o.shape, generator=g, dtype=DT) for o in out.unbind()]
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), leaves)
    for i, (c, o, j, ct, gr) in enumerate(zip(comps, out.unbind(), idx.unbind(), cot, grads)):
        if c.shape[-1] < d * (k - 1) + 1 - 2 * p or c.shape[-1] == 0:
            assert o.numel() == 0 and not gr.any(), f"sample {i}"
            continue
        leaf = c.clone().requires_grad_()
        ro, rj = fn(leaf)
        assert_close(o, ro, f"sample {i}", rtol=0, atol=0)
        assert torch.equal(j, rj), f"sample {i}: indices"
        assert_close(gr, torch.autograd.grad((ro * ct).sum(), leaf)[0], f"grad of sample {i}")


@pytest.mark.parametrize("center", [True, False])
def test_stft_of_waveforms_per_sample(center):
    """Each waveform's own spectrogram (complex ``(B, F, j_frames)``), gradients to every sample,
    an empty waveform with no frame; one frame-count rule gives one nested int."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, dtype=DT, generator=g, requires_grad=True) for n in (300, 0, 129, 64)]
    win = torch.hann_window(64, dtype=DT)
    kw = dict(n_fft=64, hop_length=16, window=win, return_complex=True, center=center)
    x = mj.as_nested_tensor(ws)
    out = torch.stft(x, **kw)
    assert out.dtype == torch.complex128 and out.shape[1] == 33
    refs = [torch.stft(w, **kw) if w.shape[0] else None for w in ws]
    for o, r in zip(out.unbind(), refs):
        if r is None:
            assert o.shape == (33, 0)
        else:
            torch.testing.assert_close(o, r)
    ga = torch.autograd.grad(out.abs().sum(), ws, allow_unused=True)
    gb = torch.autograd.grad(sum(r.abs().sum() for r in refs if r is not None), ws, allow_unused=True)
    for a, b, w in zip(ga, gb, ws):
        torch.testing.assert_close(a if a is not None else torch.zeros_like(w), b if b is not None else torch.zeros_like(w))
    assert torch.stft(x, **kw).shape[2] is out.shape[2]
    short = mj.as_nested_tensor([torch.randn(100, dtype=DT), torch.randn(10, dtype=DT)])
    if not center:  # dense torch refuses a waveform shorter than n_fft: so does its sample here
        with pytest.raises(RuntimeError, match="sample 1"):
            torch.stft(short, **kw)


@pytest.mark.parametrize("kw", [
    dict(n_fft=63, hop_length=16, center=True),  # an odd n_fft's centring pads n_fft - 1
    dict(n_fft=31, hop_length=7, center=False),
    dict(n_fft=32, hop_length=8, win_length=16, center=False, align_to_window=True),
    dict(n_fft=32, hop_length=8, win_length=16, center=True),
    dict(n_fft=33, hop_length=5, win_length=20, center=True, pad_mode="constant"),
], ids=["odd centred", "odd", "aligned to window", "short window centred", "odd constant pad"])
def test_stft_frame_counts_are_dense_ones(kw):
    """The ragged frame count of every sample is the one dense torch gives it, for every framing
    argument: the sizes, offsets and values agree (a formula for the count once disagreed for an
    odd ``n_fft`` and ``align_to_window``, leaving offsets that did not match the values)."""
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(n, dtype=DT, generator=g) for n in (64, 50, 0, 97)]
    win = torch.hann_window(kw.get("win_length") or kw["n_fft"], dtype=DT)
    kw = dict(kw, window=win, return_complex=True)
    out = torch.stft(mj.nested_tensor(ws), **kw)
    refs = [torch.stft(w, **kw) if w.shape[0] else None for w in ws]
    assert out.sizes()[:, 0].tolist() == [r.shape[-1] if r is not None else 0 for r in refs]
    assert out.values().shape[1] == sum(r.shape[-1] for r in refs if r is not None)
    for o, r in zip(out.unbind(), refs):
        if r is None:
            assert o.shape[-1] == 0
        else:
            torch.testing.assert_close(o, r, rtol=0, atol=0)


@pytest.mark.parametrize("center", [True, False])
def test_istft_round_trip_to_the_waveforms_own_nested_int(center):
    """``istft(stft(x), length=x.shape[1])`` gives back each waveform, with ``x``'s nested int;
    without ``length`` each sample has dense torch's length (a new ragged size). Gradients to
    every waveform; with ``center`` a waveform without a frame rebuilds as empty."""
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(n, dtype=DT, generator=g, requires_grad=True) for n in (300, 0, 129, 64)]
    if not center:
        ws = [w for w in ws if w.shape[0]]  # dense torch refuses a waveform shorter than n_fft
    # without centring, a Hann window's zero first sample leaves nothing to rebuild it from: dense refuses
    win = torch.hann_window(64, dtype=DT) if center else torch.ones(64, dtype=DT)
    kw = dict(n_fft=64, hop_length=16, window=win, center=center)
    x = mj.as_nested_tensor(ws)
    spec = torch.stft(x, return_complex=True, **kw)
    back = torch.istft(spec, length=x.shape[1], **kw)
    assert back.shape[1] is x.shape[1]
    refs = [torch.istft(torch.stft(w, return_complex=True, **kw), length=w.shape[0], **kw) if w.shape[0] else w * 1
            for w in ws]
    for o, r in zip(back.unbind(), refs):
        torch.testing.assert_close(o, r)
    cot = [torch.randn(r.shape, dtype=DT, generator=g) for r in refs]
    ga = torch.autograd.grad(sum((o * c).sum() for o, c in zip(back.unbind(), cot)), ws, materialize_grads=True,
                             allow_unused=True)
    gb = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), ws, materialize_grads=True,
                             allow_unused=True)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)
    free = torch.istft(spec, **kw)
    for o, w in zip(free.unbind(), ws):
        if w.shape[0]:
            torch.testing.assert_close(o, torch.istft(torch.stft(w, return_complex=True, **kw), **kw))
        else:
            assert o.shape == (0,)
    with pytest.raises(mj.StructureError, match="length"):
        torch.istft(spec, length=mj.as_nested_tensor([torch.ones(3)]).shape[1], **kw)
