"""Feature transforms and everyday nn ops (ops/nn/norms.py, ops/contractions/matmul.py, ops/elementwise/factory.py,
ops/shape/views.py) against the per-sample reference."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor

from _reference import (
    LAYOUTS,
    SEQ,
    STATIC_LEAD,
    R,
    assert_close,
    build,
    components,
    grid,
    per_sample_check,
    seeds,
    structures,
)

layouts = pytest.mark.parametrize("layout", LAYOUTS, ids=str)
D = torch.float64


def _dense(seed, *shape):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- linear / matmul
LINEAR = {
    "linear_bias": lambda x, w, b: F.linear(x, w, b),
    "linear_nobias": lambda x, w, b: F.linear(x, w),
    "matmul_operator": lambda x, w, b: x @ w.t() + b,
    "torch_matmul": lambda x, w, b: torch.matmul(x, w.t()),
    "nn_linear_module": None,  # built per example
}


@pytest.mark.parametrize("op", LINEAR, ids=str)
@layouts
def test_linear(layout, op):
    @grid
    @given(structures(layout), seeds, st.integers(1, 4))
    def check(s, seed, out_features):
        x = R(components(s.shapes, seed), s.ragged_dims)
        w, b = _dense(seed, out_features, s.c), _dense(seed + 1, out_features)
        if op == "nn_linear_module":
            m = torch.nn.Linear(s.c, out_features, dtype=D)
            out = per_sample_check(m, x)
            # parameter gradients: Σ over samples of the per-component gradients
            comps = components(s.shapes, seed)
            m.zero_grad()
            (m(mj.nested_tensor(comps, ragged_dims=s.ragged_dims)) * 1).sum().backward()
            # d Σ(x Wᵀ + b) / dW[o, k] = Σ over all rows of x[…, k], the same for every o
            col = sum(c.reshape(-1, s.c).sum(0) for c in comps)
            assert_close(m.weight.grad, col.expand(out_features, s.c), "weight grad")
            rows = sum(c.reshape(-1, s.c).shape[0] for c in comps)
            assert_close(m.bias.grad, torch.full((out_features,), float(rows), dtype=D), "bias grad")
            return
        out = per_sample_check(LINEAR[op], x, w, b)
        assert out.shape[-1] == out_features

    check()


def test_linear_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2)])
    w = torch.tensor([[1.0, 1.0], [1.0, -1.0], [2.0, 0.0]])
    b = torch.tensor([0.0, 10.0, 100.0])
    assert [c.tolist() for c in F.linear(x, w, b).unbind()] == [
        [[3.0, 9.0, 102.0], [7.0, 9.0, 106.0]],  # = [1+2, 1-2+10, 2·1+100], [3+4, 3-4+10, 2·3+100]
        [],
    ]


def test_linear_wrong_features():
    x = mj.nested_tensor([torch.zeros(2, 3), torch.zeros(0, 3)])
    with pytest.raises((ValueError, RuntimeError), match="linear|shape"):
        F.linear(x, torch.zeros(4, 5))


@pytest.mark.parametrize("grad", ["none", "input", "weight", "module"])
def test_linear_refuses_a_ragged_last_dim(grad):
    """(B, C, j0) with C = weight.shape[-1]: per sample, dense linear contracts the ragged last dim
    (and raises unless its length happens to equal C), never C — with or without gradients."""
    comps = [_dense(n, 3, n).requires_grad_(grad == "input") for n in (3, 4, 2)]
    x = mj.as_nested_tensor(comps)  # differentiable in the components
    w = _dense(0, 5, 3).requires_grad_(grad == "weight")
    with pytest.raises(RuntimeError):
        F.linear(comps[1], w)  # the dense op on a sample
    f = torch.nn.Linear(3, 5, dtype=D) if grad == "module" else (lambda t: F.linear(t, w))
    with pytest.raises(ValueError, match="linear.*last dim of input to be static"):
        f(x)


# ----------------------------------------------------------------------------- norms
NORMS = {
    "layer_norm_affine": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5),
    "layer_norm_plain": lambda x, w, b: F.layer_norm(x, (x.shape[-1],)),
    "rms_norm_weight": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
    "rms_norm_plain": lambda x, w, b: F.rms_norm(x, (x.shape[-1],)),
}


@pytest.mark.parametrize("op", NORMS, ids=str)
@layouts
def test_norms(layout, op):
    @grid
    @given(structures(layout, min_c=2, max_c=4), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        per_sample_check(NORMS[op], x, _dense(seed, s.c), _dense(seed + 1, s.c), rtol=1e-6, atol=1e-6)

    check()


def test_layer_norm_over_two_static_dims():
    # (B, S, j0, C) → normalized_shape (C,) only: S is not trailing next to C
    s = [(3, 2, 4), (3, 0, 4)]
    x = R(components(s, 0), STATIC_LEAD.ragged_dims)
    per_sample_check(lambda t: F.layer_norm(t, (4,)), x)
    # (B, j0, S, C) has two static trailing dims
    y = R(components([(2, 3, 4), (0, 3, 4)], 1), (1,))
    per_sample_check(lambda t: F.layer_norm(t, (3, 4)), y)


def test_layer_norm_over_a_ragged_dim_with_weight_is_rejected():
    # without weight/bias it normalizes per sample (test/test_ragged_nn.py); no dense weight has
    # the ragged shape
    x = mj.nested_tensor([torch.zeros(3, 2, 4), torch.zeros(3, 0, 4)])  # (B, S, j0, C)
    with pytest.raises((ValueError, RuntimeError), match="layer_norm"):
        F.layer_norm(x, (x.shape[-2], 4), torch.ones(4))


@layouts
def test_native_layer_norm_statistics_per_sample(layout):
    """``aten.native_layer_norm`` returns ``(out, mean, rstd)``: the statistics have the input's
    structure (the normalized dims kept as 1), per sample as dense torch's; ``_fused_rms_norm``'s
    ``rstd`` too. The backward ops take them back."""

    @grid
    @given(structures(layout, min_c=2, max_c=4), seeds)
    def check(s, seed):
        w, b = _dense(seed, s.c), _dense(seed + 1, s.c)
        x = R(components(s.shapes, seed), s.ragged_dims)
        for k in (1, 2):  # mean, rstd
            per_sample_check(lambda t, w, b: torch.ops.aten.native_layer_norm(t, [s.c], w, b, 1e-5)[k], x, w, b, grad=False)
        per_sample_check(lambda t, w: torch.ops.aten._fused_rms_norm(t, [s.c], w, 1e-5)[1], x, w, grad=False)

    check()


def test_layer_norm_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 3.0]]), torch.zeros(0, 2), torch.tensor([[2.0, 2.0]])])
    out = F.layer_norm(x, (2,), eps=0.0)
    assert [c.tolist() for c in out.unbind()][0] == [[-1.0, 1.0]]  # = ([1, 3] - 2) / 1
    assert out.unbind()[1].shape == (0, 2)


@pytest.mark.parametrize("with_affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("extra", [(), (3,)], ids=["(B,j0,C)", "(B,j0,C,L)"])
def test_group_norm(extra, with_affine):
    @grid
    @given(structures(SEQ, min_c=2, max_c=2), seeds, st.sampled_from([2, 4]))
    def check(s, seed, c_mult):
        c = s.c * c_mult  # 2 groups of at least 2 channels (dense group_norm rejects 1 value per group)
        shapes = [(n, c, *extra) for n, _ in s.lengths]
        x = R(components(shapes, seed), (1,))
        w, b = (_dense(seed, c), _dense(seed + 1, c)) if with_affine else (None, None)
        per_sample_check(lambda t, *wb: F.group_norm(t, 2, *wb, eps=1e-5), x, *([w, b] if with_affine else []),
                         rtol=1e-6, atol=1e-6)

    check()


# static_lead (B, S, j0, C) is a channels-first image with S channels: test/test_image_norms.py
@pytest.mark.parametrize("layout", [l for l in LAYOUTS if l.name not in ("seq", "static_lead")], ids=str)
def test_group_norm_needs_one_leading_ragged_dim(layout):
    s = [layout.shape(2, 3, 2, 4), layout.shape(0, 1, 2, 4)]
    x = mj.nested_tensor([torch.zeros(*t) for t in s], ragged_dims=layout.ragged_dims)
    with pytest.raises(ValueError, match="group_norm"):
        F.group_norm(x, 2)


# ----------------------------------------------------------------------------- activations
ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "elu": F.elu,
    "selu": F.selu,
    "mish": F.mish,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "leaky_relu": lambda t: F.leaky_relu(t, 0.2),
    "hardsigmoid": F.hardsigmoid,
    "nn.GELU module": torch.nn.GELU(),
    "swiglu_like": lambda t: F.silu(t) * torch.sigmoid(t),
    "rrelu_eval": lambda t: F.rrelu(t, 0.1, 0.3, training=False),
    "torch.rrelu_eval": lambda t: torch.rrelu(t, 0.2, 0.4),
}


@pytest.mark.parametrize("op", ACTIVATIONS, ids=str)
@layouts
def test_activations(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        per_sample_check(ACTIVATIONS[op], R(components(s.shapes, seed, low=-4, high=4), s.ragged_dims))

    check()


def test_rrelu_training_and_gumbel_hard():
    """``rrelu`` in training: negative elements scaled by a slope in [lower, upper] (their
    gradient), the others kept; ``gumbel_softmax(hard=True)`` gives one 1 per row (its one-hot is
    an in-place ``scatter_`` along the static dim)."""
    comps = components([(5, 4), (0, 4), (3, 4)], seed=3)
    x, leaves = build(comps, (1,), requires_grad=True)
    out = F.rrelu(x, 0.1, 0.3, training=True)
    grads = torch.autograd.grad(out.sum(), leaves)
    for o, c, g in zip(out.unbind(), comps, grads):
        neg = c < 0
        assert torch.equal(o[~neg], c[~neg]) and torch.equal(g[~neg], torch.ones_like(g[~neg]))
        slope = o[neg] / c[neg]
        assert ((slope >= 0.1) & (slope <= 0.3)).all() and torch.allclose(g[neg], slope)
    hard = F.gumbel_softmax(x, hard=True)
    for h in hard.unbind():
        assert ((h == 0) | (h == 1)).all() and (h.sum(-1) == 1).all()


@layouts
def test_bilinear(layout):
    @grid
    @given(structures(layout, min_c=2, max_c=3), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        y = R(components(s.shapes, seed + 1), s.ragged_dims)
        per_sample_check(F.bilinear, x, y, _dense(seed, 4, s.c, s.c), _dense(seed + 1, 4), share=True, rtol=1e-6, atol=1e-6)
        per_sample_check(lambda a, b, w: F.bilinear(a, b, w), x, y, _dense(seed + 2, 2, s.c, s.c), share=True, rtol=1e-6, atol=1e-6)

    check()


# ----------------------------------------------------------------------------- dropout
@layouts
def test_dropout_identities(layout):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        per_sample_check(lambda t: F.dropout(t, 0.0), x, ref=lambda t: t)
        per_sample_check(lambda t: F.dropout(t, 0.5, training=False), x, ref=lambda t: t)
        m = torch.nn.Dropout(0.7).eval()
        per_sample_check(m, x, ref=lambda t: t)

    check()


@layouts
def test_dropout_half(layout):
    shapes = [layout.shape(n, m, 3, 24) for n, m in [(9, 7), (0, 5), (6, 0), (8, 8)]]
    comps = components(shapes, seed=0, low=0.5, high=1.5)  # no zeros in x
    x, leaves = build(comps, layout.ragged_dims, requires_grad=True)
    out = F.dropout(x, 0.5)
    assert isinstance(out, MultiJaggedTensor) and out.shape == x.shape
    got = out.unbind()
    kept = 0
    total = 0
    for o, c in zip(got, comps):
        assert o.shape == c.shape
        dropped = o == 0
        assert torch.equal(o[~dropped], 2 * c[~dropped])  # kept elements scaled by 1 / (1 - p)
        kept += int((~dropped).sum())
        total += c.numel()
    assert total > 400 and 0.4 < kept / total < 0.6
    grads = torch.autograd.grad(sum(o.sum() for o in got), leaves)
    for g, o in zip(grads, got):
        assert torch.equal(g, torch.where(o != 0, 2.0, 0.0).to(g.dtype))  # d out / d x = mask / (1 - p)


# ----------------------------------------------------------------------------- softmax
SOFTMAX = {
    "softmax_last": lambda t: t.softmax(-1),
    "log_softmax_last": lambda t: F.log_softmax(t, dim=-1),
    "softmax_last_f32": lambda t: torch.softmax(t, -1, dtype=torch.float32).double(),
}


@pytest.mark.parametrize("op", SOFTMAX, ids=str)
@layouts
def test_softmax_over_static_dim(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        per_sample_check(SOFTMAX[op], R(components(s.shapes, seed), s.ragged_dims), rtol=1e-5, atol=1e-6)

    check()


def test_softmax_over_static_leading_dim():
    # (B, S, j0, C): logical dim 1 is static; component dim 0
    x = R(components([(3, 2, 4), (3, 0, 4), (3, 1, 4)], 0), STATIC_LEAD.ragged_dims)
    per_sample_check(lambda t: t.softmax(1), x, ref=lambda t: t.softmax(0))
    per_sample_check(lambda t: t.log_softmax(-3), x, ref=lambda t: t.log_softmax(0))


def test_softmax_golden():
    x = mj.nested_tensor([torch.tensor([[0.0, 0.0], [0.0, torch.log(torch.tensor(3.0))]]), torch.zeros(0, 2)])
    got = [c.tolist() for c in x.softmax(-1).unbind()]
    assert got[1] == []
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor([[0.5, 0.5], [0.25, 0.75]]))  # = [1, 1] / 2, [1, 3] / 4


# ----------------------------------------------------------------------------- masked_fill / where
MASKED = {
    "masked_fill_scalar": lambda x, m: x.masked_fill(m > 0, -0.5),
    "masked_fill_0dim": lambda x, m: x.masked_fill(m > 0, torch.tensor(3.0, dtype=D)),
    "masked_fill_self_mask": lambda x, m: x.masked_fill(x > 0, 0.0) + m,
    "masked_fill_": lambda x, m: (x * 1).masked_fill_(m > 0, 2.0),
    "where_mask": lambda x, m: torch.where(m > 0, x, -x),
}


@pytest.mark.parametrize("op", MASKED, ids=str)
@layouts
def test_masked_fill(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        m = R(components(s.shapes, seed + 1), s.ragged_dims)
        per_sample_check(MASKED[op], x, m)

    check()


def test_masked_fill_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, -2.0]]), torch.zeros(0, 2), torch.tensor([[-3.0, 4.0], [5.0, -6.0]])])
    assert [c.tolist() for c in x.masked_fill(x < 0, 0.0).unbind()] == [
        [[1.0, 0.0]],  # = [1, max(-2→0)]
        [],
        [[0.0, 4.0], [5.0, 0.0]],
    ]


# ----------------------------------------------------------------------------- factories, copies, fills
LIKE = {
    "zeros_like": (torch.zeros_like, lambda c: torch.zeros_like(c)),
    "ones_like": (torch.ones_like, lambda c: torch.ones_like(c)),
    "full_like": (lambda x: torch.full_like(x, 2.5), lambda c: torch.full_like(c, 2.5)),
    "zeros_like_int": (lambda x: torch.zeros_like(x, dtype=torch.int32), lambda c: torch.zeros_like(c, dtype=torch.int32)),
}


@pytest.mark.parametrize("op", LIKE, ids=str)
@layouts
def test_like_factories(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        fn, ref = LIKE[op]
        per_sample_check(fn, R(components(s.shapes, seed), s.ragged_dims), ref=ref, grad=False)

    check()


@pytest.mark.parametrize("op", ["empty_like", "rand_like", "randn_like"])
@layouts
def test_random_and_empty_like(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x = mj.nested_tensor(comps, ragged_dims=s.ragged_dims)
        y = getattr(torch, op)(x)
        assert isinstance(y, MultiJaggedTensor) and y.shape == x.shape and y.dtype == x.dtype
        assert y.ragged_dims == x.ragged_dims and torch.equal(y.sizes(), x.sizes())
        for a, c in zip(y.unbind(), comps):
            assert a.shape == c.shape
            if op == "rand_like":
                assert bool(((a >= 0) & (a < 1)).all())
        if op != "empty_like":
            assert y.values().numel() == 0 or not torch.equal(y.values(), x.values())

    check()


@layouts
def test_copy_fill_zero(layout):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        a, b = components(s.shapes, seed), components(s.shapes, seed + 1)
        x = mj.nested_tensor(a, ragged_dims=s.ragged_dims)
        y = mj.nested_tensor(b, ragged_dims=s.ragged_dims)  # equal sizes, its own nested ints
        assert x.copy_(y) is x
        for got, want in zip(x.unbind(), b):
            assert_close(got, want, "copy_")
        assert x.copy_(torch.arange(s.c, dtype=D)) is x  # a dense src broadcasts over static dims
        for got, c in zip(x.unbind(), a):
            assert_close(got, torch.arange(s.c, dtype=D).expand(c.shape), "copy_ dense")
        assert x.fill_(1.25) is x
        for got, c in zip(x.unbind(), a):
            assert_close(got, torch.full_like(c, 1.25), "fill_")
        assert x.zero_() is x
        assert x.values().abs().sum() == 0

    check()


def test_copy_is_differentiable():
    x = R(components([(2, 3), (0, 3), (1, 3)], 0), (1,))
    y = R(components([(2, 3), (0, 3), (1, 3)], 1), (1,))
    per_sample_check(lambda a, b: (a * 1).copy_(b) * a, x, y, ref=lambda a, b: b * a)


# ----------------------------------------------------------------------------- component access
@layouts
def test_unbind_and_index(layout):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        for i in range(s.batch):
            x, leaves = build(comps, s.ragged_dims, requires_grad=True)
            xi = x[i]
            assert not isinstance(xi, MultiJaggedTensor)
            assert_close(xi, comps[i], f"x[{i}]")
            assert_close(x[i - s.batch], comps[i], f"x[{i - s.batch}]")
            assert_close(x.select(0, i), comps[i], f"x.select(0, {i})")
            cot = torch.randn(comps[i].shape, dtype=D)
            grads = torch.autograd.grad((xi * cot).sum(), leaves, allow_unused=True)
            for k, (g, c) in enumerate(zip(grads, comps)):
                want = cot if k == i else torch.zeros_like(c)
                assert_close(torch.zeros_like(c) if g is None else g, want, f"grad of component {k} through x[{i}]")
        x = mj.nested_tensor(comps, ragged_dims=s.ragged_dims)
        with pytest.raises(IndexError):
            x[s.batch]
        got = torch.unbind(x)
        assert len(got) == s.batch and all(torch.equal(g, c) for g, c in zip(got, comps))

    check()


def test_grad_of_a_leaf_multi_jagged_tensor():
    """``x.requires_grad_()`` then ``x.grad.unbind()`` equals the per-component gradients."""
    comps = components([(2, 2, 3), (0, 0, 3), (3, 3, 3)], 0)
    x = mj.nested_tensor(comps, ragged_dims=(1, 2)).requires_grad_()
    w = torch.randn(4, 3, dtype=D)
    (F.gelu(F.linear(x, w)) * 0.5).sum().backward()
    assert isinstance(x.grad, MultiJaggedTensor) and x.grad.shape == x.shape
    for g, c in zip(x.grad.unbind(), comps):
        leaf = c.clone().requires_grad_()
        (F.gelu(F.linear(leaf, w)) * 0.5).sum().backward()
        assert_close(g, leaf.grad, "x.grad component")
