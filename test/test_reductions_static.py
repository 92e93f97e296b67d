"""Reductions over static dims, global reductions and the sum over the ragged dim of (B, j0, C)
(ops/reductions/reduce.py, ops/reductions/routes.py)."""

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor

from _reference import LAYOUTS, SEQ, STATIC_LEAD, R, assert_close, build, components, grid, per_sample_check, seeds, structures

D = torch.float64

# Static dims per layout, as logical dims of the batch; the component dim is one less.
STATIC_DIMS = {
    "seq": [-1, 2],
    "square": [-1, 3],
    "rect": [-1, 3],
    "static_lead": [1, -1, 3, (1, 3), (1, -1)],
}


def _component_dims(dim):
    dims = dim if isinstance(dim, tuple) else (dim,)
    out = tuple(d - 1 if d > 0 else d for d in dims)
    return out if isinstance(dim, tuple) else out[0]


REDUCTIONS = {
    "sum": lambda t, d, k: t.sum(d, keepdim=k),
    "mean": lambda t, d, k: t.mean(d, keepdim=k),
    "amax": lambda t, d, k: t.amax(d, keepdim=k),
    "amin": lambda t, d, k: t.amin(d, keepdim=k),
    "torch.sum": lambda t, d, k: torch.sum(t, d, keepdim=k),
    "torch.mean": lambda t, d, k: torch.mean(t, dim=d, keepdim=k),
}


@pytest.mark.parametrize("op", REDUCTIONS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_reduce_static_dims(layout, op):
    @grid
    @given(structures(layout), seeds, st.sampled_from(STATIC_DIMS[layout.name]), st.booleans())
    def check(s, seed, dim, keepdim):
        f = REDUCTIONS[op]
        out = per_sample_check(
            lambda t: f(t, dim, keepdim),
            R(components(s.shapes, seed), s.ragged_dims),
            ref=lambda t: f(t, _component_dims(dim), keepdim),
        )
        assert isinstance(out, MultiJaggedTensor)
        if keepdim:
            assert out.ragged_dims == s.ragged_dims and out.dim() == len(s.shapes.template) + 1

    check()


def test_reduce_static_dtype():
    x = mj.nested_tensor([torch.ones(2, 3), torch.ones(0, 3)])
    y = x.sum(-1, dtype=torch.float64)
    assert y.dtype == torch.float64 and [c.tolist() for c in y.unbind()] == [[3.0, 3.0], []]  # = 1+1+1


def test_reduce_static_golden():
    # (B, S=2, j0, C=2)
    x = mj.nested_tensor([torch.tensor([[[1.0, 2.0]], [[3.0, 5.0]]]), torch.zeros(2, 0, 2)])
    assert x.ragged_dims == (2,)
    assert [c.tolist() for c in x.sum(1).unbind()] == [[[4.0, 7.0]], []]  # = [1+3, 2+5]
    assert [c.tolist() for c in x.amax(-1).unbind()] == [[[2.0], [5.0]], [[], []]]  # = max(1, 2), max(3, 5)
    assert [c.tolist() for c in x.mean((1, -1)).unbind()] == [[2.75], []]  # = (1+2+3+5) / 4


# ----------------------------------------------------------------------------- global reductions
GLOBAL = {
    "sum": (lambda x: x.sum(), lambda cs: sum(c.sum() for c in cs)),
    "mean": (lambda x: x.mean(), lambda cs: sum(c.sum() for c in cs) / sum(c.numel() for c in cs)),
    "torch.sum": (torch.sum, lambda cs: sum(c.sum() for c in cs)),
}


@pytest.mark.parametrize("op", GLOBAL, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_global_reductions(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        f, ref = GLOBAL[op]
        x, leaves = build(comps, s.ragged_dims, requires_grad=True)
        out = f(x)
        assert not isinstance(out, MultiJaggedTensor) and out.dim() == 0
        rl = [c.clone().requires_grad_() for c in comps]
        expected = ref(rl)
        assert_close(out, expected, op, rtol=1e-9, atol=1e-9)
        if out.isnan():  # every sample empty: nothing to differentiate
            return
        g = torch.autograd.grad(out * 3, leaves, allow_unused=True)
        gr = torch.autograd.grad(expected * 3, rl, allow_unused=True)
        for a, b, c in zip(g, gr, comps):
            assert_close(torch.zeros_like(c) if a is None else a, torch.zeros_like(c) if b is None else b, "grad")

    check()


def test_global_reductions_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[5.0, 9.0]])])
    assert x.sum().item() == 24.0  # = 1+2+3+4+5+9
    assert x.mean().item() == 4.0  # = 24 / 6 elements (the empty sample counts for nothing)


# ----------------------------------------------------------------------------- sum over the ragged dim of (B, j0, C)
RAGGED = {
    "sum1": (lambda t: t.sum(1), lambda c: c.sum(0)),
    "sum-2": (lambda t: t.sum(-2), lambda c: c.sum(0)),
    "sum1_keepdim": (lambda t: t.sum(1, keepdim=True), lambda c: c.sum(0, keepdim=True)),
    "torch.sum_dim_list": (lambda t: torch.sum(t, dim=[1]), lambda c: c.sum(0)),
    "sum(1,2)": (lambda t: t.sum((1, 2)), lambda c: c.sum()),
    "mean1": (lambda t: t.mean(1), lambda c: c.mean(0)),
}


@pytest.mark.parametrize("op", RAGGED, ids=str)
def test_reduce_the_ragged_dim_of_a_sequence(op):
    @given(structures(SEQ), seeds)
    def check(s, seed):
        fn, ref = RAGGED[op]
        # dense (B, C) result = stack of per-sample sums; an empty sample sums to 0 (its mean is nan)
        per_sample_check(fn, R(components(s.shapes, seed), s.ragged_dims), ref=ref, dense_out=True)

    check()


def test_sum_over_the_ragged_dim_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[5.0, 9.0]])])
    assert x.sum(1).tolist() == [
        [4.0, 6.0],  # = [1+3, 2+4]
        [0.0, 0.0],  # = empty sample
        [5.0, 9.0],  # = [5, 9]
    ]
    assert x.mean(1)[0].tolist() == [2.0, 3.0]  # = [(1+3)/2, (2+4)/2]
    assert x.sum((1, 2)).tolist() == [10.0, 0.0, 14.0]  # = [1+2+3+4, 0, 5+9]


def test_sum_over_the_ragged_dim_grad_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[5.0, 9.0]])],
                         requires_grad=True)
    w = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    (x.sum(1) * w).sum().backward()
    # d/dx Σ_i w_i · Σ_rows x_i = w_i for every row of sample i
    assert [g.tolist() for g in x.grad.unbind()] == [[[1.0, 10.0], [1.0, 10.0]], [], [[3.0, 30.0]]]


def test_batch_zero_reductions():
    x = mj.from_packed(torch.zeros(0, 3), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64))
    assert x.sum().item() == 0.0
    assert tuple(x.sum(1).shape) == (0, 3)
    assert x.sum(-1).unbind() == ()
    y = mj.from_packed(torch.zeros(0, 2, 3), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64),
                       ragged_dims=STATIC_LEAD.ragged_dims)
    assert y.amax(1).unbind() == () and y.mean(-1).shape[0] == 0


@pytest.mark.parametrize("op", ["mean(-1)", "mean()", "mean(1)"])
def test_mean_of_integers_raises_like_dense(op):
    comps = [torch.ones(3, 4, dtype=torch.int64), torch.ones(0, 4, dtype=torch.int64)]
    fn = {"mean(-1)": lambda t: t.mean(-1), "mean()": lambda t: t.mean(), "mean(1)": lambda t: t.mean(1)}[op]
    with pytest.raises(RuntimeError, match="mean"):
        fn(comps[0])  # the per-sample reference raises …
    with pytest.raises(RuntimeError, match="mean"):
        fn(mj.nested_tensor(comps))  # … and so must the batch


@pytest.mark.parametrize("op", ["amax", "amin", "max", "min", "argmax"])
@pytest.mark.parametrize("batch", ["B=0", "all samples empty", "C=0"])
def test_whole_reduction_of_a_batch_without_elements_raises_as_dense(op, batch):
    """Over every dim of a batch holding no element there is no sample extent for the
    empty-extent rule to give a value to: dense torch raises, and so do we; along a dim the rule
    applies (each sample's lowest / highest value)."""
    comps = {"B=0": None, "all samples empty": [torch.randn(0, 4), torch.randn(0, 4)],
             "C=0": [torch.randn(2, 0), torch.randn(3, 0)]}[batch]
    if comps is None:
        x = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)], layout=mj.multi_jagged)[0:0]
    else:
        x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    with pytest.raises((RuntimeError, IndexError), match="Expected reduction dim"):
        getattr(x, op)()
    if op in ("amax", "amin"):  # every dim named, the batch dim among them
        with pytest.raises(IndexError, match="Expected reduction dim 0 to have non-zero size"):
            getattr(x, op)(dim=(0, 1, 2))
    if batch == "all samples empty" and op in ("amax", "amin"):
        lowest = torch.finfo(x.dtype).min if op == "amax" else torch.finfo(x.dtype).max
        assert torch.equal(getattr(x, op)(dim=1), torch.full((2, 4), lowest))


@pytest.mark.parametrize("dx", [None, 0.5])
@pytest.mark.parametrize("dim", [1, 3, -1])
def test_cumulative_trapezoid_along_a_static_dim_per_sample(dim, dx):
    """``cumulative_trapezoid`` along a static dim of ``(B, S, j0, C)`` (and ``trapezoid`` beside
    it): dense's terms per sample, bit for bit, with gradients; an empty sample included."""
    kw = {} if dx is None else {"dx": dx}
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(2, n, 3, dtype=D, generator=g).requires_grad_() for n in (3, 0, 2)]
    x = mj.as_nested_tensor(comps, ragged_dims=(2,))
    dd = dim - 1 if dim > 0 else dim
    for f in (torch.cumulative_trapezoid, torch.trapezoid):
        out = f(x, dim=dim, **kw)
        refs = [f(c, dim=dd, **kw) for c in comps]
        for a, r in zip(out.unbind(), refs):
            assert torch.equal(a, r)
        got = torch.autograd.grad((out * out).values().sum(), comps)
        want = torch.autograd.grad(sum((r * r).sum() for r in refs), comps)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


RENORM_LAYOUTS = {
    "lead": ([(2, n, 3) for n in (3, 0, 2)], (2,)),
    "seq": ([(n, 3) for n in (3, 0, 2)], (1,)),
    "rect": ([(n, m, 2) for n, m in ((3, 1), (0, 2), (2, 3))], (1, 2)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.complex128])
@pytest.mark.parametrize("p", [2, 1, 0.5])
@pytest.mark.parametrize("layout", RENORM_LAYOUTS)
def test_renorm_along_every_dim_per_sample(layout, p, dtype):
    """``renorm`` along a static or a ragged dim: each sample's sub-tensors along it (the norm over
    every other dim of the sample, ragged ones included) scaled as dense's, with gradients; the
    batch dim and a one-dimensional sample raise."""
    shapes, rd = RENORM_LAYOUTS[layout]
    g = torch.Generator().manual_seed(1)
    comps = [(torch.randn(*s, dtype=dtype, generator=g) * 2).requires_grad_(dtype == D) for s in shapes]
    x = mj.as_nested_tensor(comps, ragged_dims=rd)
    for d in range(1, x.dim()):
        out = torch.renorm(x, p, d, 1.0)
        refs = [torch.renorm(c, p, d - 1, 1.0) for c in comps]
        for a, r in zip(out.unbind(), refs):
            assert a.dtype == r.dtype
            torch.testing.assert_close(a, r)
        if dtype == D:
            got = torch.autograd.grad((out * out).values().sum(), comps)
            want = torch.autograd.grad(sum((r * r).sum() for r in refs), comps)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)
    with pytest.raises(NotImplementedError, match="renorm.*batch dim"):
        torch.renorm(x, p, 0, 1.0)
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.renorm(mj.nested_tensor([torch.ones(2), torch.ones(1)]), p, 1, 1.0)
