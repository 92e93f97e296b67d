"""Broadcasting into new ragged dims sample by sample (ops/elementwise/per_sample.py, NOTE
[ Broadcasting into new ragged dims per sample ]): with the rule's threshold at 0 every such
broadcast takes the loop, which must give dense torch's values bit for bit, its dtypes and its
gradients (first and second order), with or without a graph; the rule itself picks the loop for
large samples and the gathers for small ones."""

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged.ops.elementwise import per_sample

from _reference import R, few, per_sample_check, seeds
from _structures import comps_for, length_pairs, lengths

FEW = few(8)


@pytest.fixture
def always(monkeypatch):
    """Every broadcast into new ragged dims through the loop; counts its calls."""
    calls = []
    loop = per_sample.broadcast_per_sample

    def counted(*args):
        calls.append(1)
        return loop(*args)

    monkeypatch.setattr(per_sample, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(per_sample, "broadcast_per_sample", counted)
    return calls


OPS = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum,
    "copysign": torch.copysign,
}


@pytest.mark.parametrize("op", OPS, ids=str)
def test_square_and_rectangular_pairs(always, op):
    """``(B, j0, 1, C) ∘ (B, 1, j0, C)`` and ``(B, j0, 1, C) ∘ (B, 1, j1, C)``: values and
    gradients of both operands against dense per sample, zero-length samples included."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        f = OPS[op]
        xs = comps_for([(n, c) for n in ns], seed)
        ys = comps_for([(m, c) for m in ms], seed + 1)
        per_sample_check(lambda x: f(x.unsqueeze(-2), x.unsqueeze(-3)), R(xs, (1,)), rtol=0, atol=0)
        out = per_sample_check(lambda x, y: f(x.unsqueeze(-2), y.unsqueeze(-3)), R(xs, (1,)), R(ys, (1,)),
                               rtol=0, atol=0)
        assert out.sizes().tolist() == [[n, m] for n, m in zip(ns, ms)]

    check()
    assert always


def test_static_dims_before_and_after_the_ragged_ones(always):
    """``(B, S, j0, 1, C) ∘ (B, S, 1, j1, C)`` (storage order puts the ragged dims first) and a
    static tail of two dims, ``(B, j0, 1, C1, C2) ∘ (B, 1, j1, 1, C2)``."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, s, seed):
        ns, ms = nm
        xs = comps_for([(s, n, 2) for n in ns], seed)
        ys = comps_for([(s, m, 2) for m in ms], seed + 1)
        out = per_sample_check(lambda x, y: x.unsqueeze(-2) * y.unsqueeze(-3), R(xs, (2,)), R(ys, (2,)),
                               rtol=0, atol=0)
        assert out.ragged_dims == (2, 3)
        xs = comps_for([(n, 2, 3) for n in ns], seed)
        ys = comps_for([(m, 1, 3) for m in ms], seed + 1)
        per_sample_check(lambda x, y: x.unsqueeze(2) - y.unsqueeze(1), R(xs, (1,)), R(ys, (1,)), rtol=0, atol=0,
                         ref=lambda a, b: a.unsqueeze(1) - b.unsqueeze(0))

    check()
    assert always


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("grad", [True, False])
def test_dtypes_with_and_without_a_graph(always, dtype, grad):
    """Each dtype's dense result (bool ``+`` is ``or``, ints stay ints, an int operand with a float
    one promotes), with a graph (concatenated results) and without (written into the output)."""
    ns = (3, 0, 4, 1)
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(n, 2, generator=g) * 4).to(dtype) for n in ns]
    ys = [(torch.randn(n, 2, generator=g) * 4).to(dtype) for n in ns]
    zs = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in ns]
    floating = dtype.is_floating_point and grad
    x = mj.nested_tensor(xs, requires_grad=floating)
    y, z = mj.nested_tensor(ys), mj.nested_tensor(zs)
    with torch.set_grad_enabled(grad):
        for out, ref in (
            (x.unsqueeze(2) + y.unsqueeze(1), [a.unsqueeze(1) + b.unsqueeze(0) for a, b in zip(xs, ys)]),
            (x.unsqueeze(2) * z.unsqueeze(1), [a.unsqueeze(1) * b.unsqueeze(0) for a, b in zip(xs, zs)]),
        ):
            assert out.dtype == ref[0].dtype
            assert out.requires_grad == floating
            for o, r in zip(out.unbind(), ref):
                assert o.dtype == r.dtype and torch.equal(o, r)
    assert len(always) == 2


def test_second_order(always):
    """Gradients of gradients through the loop are dense's (its graph is dense ops)."""
    ns = (3, 0, 2)
    xs = comps_for([(n, 2) for n in ns], 1, dtype=torch.float64)
    leaves = [c.clone().requires_grad_() for c in xs]
    x = mj.as_nested_tensor(leaves)
    (g,) = torch.autograd.grad(((x.unsqueeze(2) * x.unsqueeze(1)) ** 2).sum(), x, create_graph=True)
    got = torch.autograd.grad((g.values() ** 2).sum(), leaves)
    refs = [c.clone().requires_grad_() for c in xs]
    gs = torch.autograd.grad(sum(((r.unsqueeze(1) * r.unsqueeze(0)) ** 2).sum() for r in refs), refs, create_graph=True)
    want = torch.autograd.grad(sum((gi**2).sum() for gi in gs), refs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert always


def test_rule_picks_the_loop_for_large_samples_only(monkeypatch):
    calls = []
    loop = per_sample.broadcast_per_sample
    monkeypatch.setattr(per_sample, "broadcast_per_sample", lambda *a: calls.append(1) or loop(*a))
    c = 64
    small = mj.nested_tensor([torch.randn(n, c) for n in (2, 3, 0)])
    small.unsqueeze(2) * small.unsqueeze(1)
    assert not calls
    n = int((2 * per_sample.MIN_ELEMENTS / c) ** 0.5) + 2  # a mean over the batch, its empty sample too
    large = mj.nested_tensor([torch.randn(m, c) for m in (n, n + 1, 0, n)])
    out = large.unsqueeze(2) * large.unsqueeze(1)
    assert calls
    for o, v in zip(out.unbind(), large.unbind()):
        assert torch.equal(o, v.unsqueeze(1) * v.unsqueeze(0))
    same = large * large  # no new ragged dims: the values as they are
    assert len(calls) == 1 and same.ragged_dims == (1,)


@FEW
@given(lengths(), seeds)
def test_loop_and_gathers_agree(ns, seed):
    """The two forms give the same values, bit for bit."""
    xs = comps_for([(n, 3) for n in ns], seed)
    x = mj.nested_tensor(xs)
    old = per_sample.MIN_ELEMENTS
    try:
        per_sample.MIN_ELEMENTS = 0
        a = x.unsqueeze(2) / (x.unsqueeze(1).abs() + 1)
        per_sample.MIN_ELEMENTS = 10**18
        b = x.unsqueeze(2) / (x.unsqueeze(1).abs() + 1)
    finally:
        per_sample.MIN_ELEMENTS = old
    assert torch.equal(a.values(), b.values())
