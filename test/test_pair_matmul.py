"""Contractions over a ragged dim of square pairs (``multijagged::pair_matmul``, ops/contractions/pair_mm.py):
the packed kernel against a per-sample loop, ``einsum`` (ellipsis, implicit output, every
operand order) and ``matmul`` against the dense op per sample, with gradients, second order,
zero-length samples, no leakage, dtypes and ``torch.compile``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged.kernels import pair_mm as kpm

from _reference import R, complex_grad_check, few, seeds
from _structures import comps_for, lengths

# equation on (B, j0, j0, C) pairs → the per-sample equation
EQUATIONS = [
    "...ikc,...jkc->...ijc",  # triangle update, outgoing
    "...kic,...kjc->...ijc",  # triangle update, incoming
    "bikc,bkjc->bijc",
    "bkic,bjkc->bjic",  # output's ragged dims from b first
    "bikc,bjkc->bcij",  # channels first in the output
    "...ikc,...kjc",  # implicit output: c is contracted too
    "bikc,bjkc->bij",  # a static dim summed
]


def _sample_eq(eq: str) -> str:
    lhs, arrow, out = eq.replace("...", "").partition("->")
    lhs = lhs.replace("b", "")
    return lhs + (arrow + out.replace("b", "") if arrow else "")


def _pairs(ns, c, seed, dtype=torch.float64):
    za = comps_for([(n, n, c) for n in ns], seed, dtype=dtype)
    zb = comps_for([(n, n, c) for n in ns], seed + 1, dtype=dtype)
    a = mj.nested_tensor(za, ragged_dims=(1, 2))
    b = mj.nested_tensor(zb, ragged_dims=(1, 2))
    return za, zb, a, b


def _offsets(ns):
    n = torch.tensor(ns, dtype=torch.int64)
    off = torch.zeros(len(ns) + 1, dtype=torch.int64)
    off[1:] = (n * n).cumsum(0)
    return n, off


# ----------------------------------------------------------------------------- packed kernel
@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
@pytest.mark.parametrize(
    "ns", [(3, 0, 5, 5, 2), (1,), (0, 0), (4, 4, 4), (5, 0, 5, 7, 7, 7), (64, 9, 11, 8), tuple(range(1, 25))], ids=str
)
def test_bucketed_kernel_equals_per_sample_loop(ns, tx, ty):
    n, off = _offsets(ns)
    g = torch.Generator().manual_seed(len(ns))
    x = torch.randn(int(off[-1]), 3, generator=g, dtype=torch.float64)
    y = torch.randn(int(off[-1]), 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(kpm.pair_matmul_reference(x, y, off, n, tx, ty), kpm.pair_matmul_naive(x, y, off, n, tx, ty))


@pytest.mark.parametrize("form", ["runs", "gather"])
@pytest.mark.parametrize("tx", [False, True])
@pytest.mark.parametrize("ty", [False, True])
@pytest.mark.parametrize("ns", [(3, 0, 5, 5, 2), (4, 4, 4), (5, 0, 5, 7, 7, 7), (2, 3, 2, 3), (6, 5, 6, 6, 5)], ids=str)
def test_bucketed_kernel_each_block_form(ns, tx, ty, form, monkeypatch):
    """Both ways of reading a group — strided copies of runs of equal consecutive lengths (padded
    to the group's largest, or not) and one gather — against the per-sample loop, whichever the
    cost rule would pick for these sizes; a non-finite value in a neighbour must not leak."""
    monkeypatch.setattr(kpm, "_RUN_NS", 0 if form == "runs" else 10**12)
    monkeypatch.setattr(kpm, "_GROUP_COST", 10**9)  # one group: padding wherever lengths differ
    kpm._plan.cache_clear()
    kpm._buckets.cache_clear()
    try:
        plan = kpm._plan(tuple(ns), 2)
        assert {e[0] for e in plan} == {form}
        n, off = _offsets(ns)
        g = torch.Generator().manual_seed(len(ns))
        x = torch.randn(int(off[-1]), 2, generator=g, dtype=torch.float64)
        y = torch.randn(int(off[-1]), 2, generator=g, dtype=torch.float64)
        got = kpm.pair_matmul_reference(x, y, off, n, tx, ty)
        torch.testing.assert_close(got, kpm.pair_matmul_naive(x, y, off, n, tx, ty))
        last = int(off[-2])  # the last sample's rows: inf there must stay there
        x[last:], y[last:] = float("inf"), float("inf")
        got = kpm.pair_matmul_reference(x, y, off, n, tx, ty)
        torch.testing.assert_close(got[:last], kpm.pair_matmul_naive(x, y, off, n, tx, ty)[:last])
    finally:
        kpm._plan.cache_clear()
        kpm._buckets.cache_clear()


def test_buckets_pad_only_within_a_group():
    """The skewed batch (one long sample, short ones) must not pad the short samples to the long
    one: that is the B·N_max² buffer the layout exists to avoid."""
    groups = kpm._buckets((64, 9, 11, 8), 32)
    assert [g[1] for g in groups if 0 in g[1]] == [(0,)], groups
    assert max(size for size, members in groups if 0 not in members) <= 11
    # every non-empty sample is in exactly one group; empty ones in none
    members = sorted(b for _, ms in kpm._buckets((3, 0, 5, 5, 2), 4) for b in ms)
    assert members == [0, 2, 3, 4]


# ----------------------------------------------------------------------------- einsum / matmul
@pytest.mark.parametrize("eq", EQUATIONS)
@few(6)
@given(ns=lengths(max_batch=4, max_len=5), seed=seeds)
def test_einsum_contracting_a_ragged_dim_per_sample(eq, ns, seed):
    za, zb, a, b = _pairs(ns, 3, seed)
    a.requires_grad_()
    b.requires_grad_()
    out = torch.einsum(eq, a, b)
    se = _sample_eq(eq)
    refs = [torch.einsum(se, x, y) for x, y in zip(za, zb)]
    got = out.unbind()
    assert len(got) == len(refs)
    for o, r in zip(got, refs):
        torch.testing.assert_close(o, r)
    # gradients of both operands, against the per-sample reference's
    gs = comps_for([r.shape for r in refs], seed + 2)
    ga, gb = torch.autograd.grad(out, (a, b), mj.nested_tensor(gs, ragged_dims=out._ragged_dims))
    for x, y, g, da, db in zip(za, zb, gs, ga.unbind(), gb.unbind()):
        x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
        rx, ry = torch.autograd.grad(torch.einsum(se, x, y), (x, y), g)
        torch.testing.assert_close(da, rx)
        torch.testing.assert_close(db, ry)


def test_einsum_of_one_operand_with_itself_and_a_dense_batch_of_one():
    za, _, a, _ = _pairs((3, 0, 2), 2, 0)
    a.requires_grad_()
    out = torch.einsum("...ikc,...jkc->...ijc", a, a)
    for o, x in zip(out.unbind(), za):
        torch.testing.assert_close(o, torch.einsum("ikc,jkc->ijc", x, x))
    (g,) = torch.autograd.grad(out.sum(), a)
    for d, x in zip(g.unbind(), za):
        x = x.clone().requires_grad_()
        (r,) = torch.autograd.grad(torch.einsum("ikc,jkc->ijc", x, x).sum(), x)
        torch.testing.assert_close(d, r)


@pytest.mark.parametrize("transpose", [False, True])
def test_matmul_of_channel_first_pairs_per_sample(transpose):
    za, zb, a, b = _pairs((4, 0, 3, 1), 2, 3)
    x, y = a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2)  # (B, C, j0, j0)
    y = y.transpose(-1, -2) if transpose else y
    out = x @ y
    assert out.shape[:2] == (4, 2) and out._ragged_dims == (2, 3)
    for o, p, q in zip(out.unbind(), za, zb):
        p, q = p.permute(2, 0, 1), q.permute(2, 0, 1)
        torch.testing.assert_close(o, p @ (q.transpose(-1, -2) if transpose else q))


def test_matmul_does_not_materialise_the_cube():
    """Square pairs take ``pair_matmul``: no (…, n, n, n) broadcast product in the graph."""
    _, _, a, b = _pairs((6, 5), 2, 4)
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Spy():
        a.permute(0, 3, 1, 2) @ b.permute(0, 3, 1, 2)
    assert torch.ops.multijagged.pair_matmul.default in seen
    assert torch.ops.aten.mul.Tensor not in seen


def test_no_leakage_between_samples():
    za, zb, a, b = _pairs((3, 4, 2), 2, 5)
    zb2 = [t.clone() for t in zb]
    zb2[1] = zb2[1] * 7 + 1
    b2 = mj.nested_tensor(zb2, ragged_dims=(1, 2))
    o1 = torch.einsum("...ikc,...jkc->...ijc", a, b).unbind()
    o2 = torch.einsum("...ikc,...jkc->...ijc", a, b2).unbind()
    assert torch.equal(o1[0], o2[0]) and torch.equal(o1[2], o2[2]) and not torch.equal(o1[1], o2[1])


def test_second_order_gradients_gradgradcheck():
    """pair_matmul's backward is pair_matmul, so every order is exact: gradgradcheck on the
    packed values through ``from_packed``."""
    ns = (2, 0, 3)
    n, off = _offsets(ns)
    sizes = torch.tensor([[k, k] for k in ns])
    g = torch.Generator().manual_seed(0)
    va = torch.randn(int(off[-1]), 2, dtype=torch.float64, generator=g, requires_grad=True)
    vb = torch.randn(int(off[-1]), 2, dtype=torch.float64, generator=g, requires_grad=True)

    def f(va, vb):
        a = mj.from_packed(va, off, sizes, (1, 2))
        b = mj.from_packed(vb, off, sizes, (1, 2))
        return torch.einsum("...kic,...kjc->...ijc", a, b).values()

    assert torch.autograd.gradcheck(f, (va, vb))
    assert torch.autograd.gradgradcheck(f, (va, vb))


@pytest.mark.parametrize("eq", EQUATIONS[:3] + ["matmul", "matmul mT", "mT matmul mT"])
def test_complex_pairs_gradients_are_dense_torchs(eq):
    """complex128 pairs: the gradients are ``dC Y'ᴴ`` and ``X'ᴴ dC`` (dense torch's conjugate
    Wirtinger derivative), to second order, a zero-length sample included; and gradcheck /
    gradgradcheck of the complex packed values (``X' = Xᵀ`` forms too)."""
    ns = (2, 0, 3)
    g = torch.Generator().manual_seed(0)
    za, zb = ([torch.randn(n, n, 2, generator=g, dtype=torch.complex128) for n in ns] for _ in range(2))
    if eq.startswith(("matmul", "mT")):
        za, zb = [z[..., 0] for z in za], [z[..., 1] for z in zb]
        ta, tb = eq.startswith("mT"), eq.endswith("mT")

        def fn(a, b):
            return (a.mT if ta else a) @ (b.mT if tb else b)

        ref = fn
    else:
        def fn(a, b):
            return torch.einsum(eq, a, b)

        def ref(a, b):
            return torch.einsum(_sample_eq(eq), a, b)
    complex_grad_check(fn, R(za, (1, 2)), R(zb, (1, 2)), ref=ref, second_order=True)
    n, off = _offsets(ns)
    sizes = torch.tensor([[k, k] for k in ns])
    va, vb = (torch.cat([z.reshape(-1, *z.shape[2:]) for z in zs]).requires_grad_() for zs in (za, zb))

    def f(va, vb):
        return fn(mj.from_packed(va, off, sizes, (1, 2)), mj.from_packed(vb, off, sizes, (1, 2))).values()

    assert torch.autograd.gradcheck(f, (va, vb))
    assert torch.autograd.gradgradcheck(f, (va, vb))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64])
def test_dtypes_as_dense(dtype):
    za, zb, a, b = _pairs((3, 0, 2), 2, 6, dtype=dtype)
    out = torch.einsum("...ikc,...jkc->...ijc", a, b)
    assert out.dtype == dtype
    for o, x, y in zip(out.unbind(), za, zb):
        torch.testing.assert_close(o, torch.einsum("ikc,jkc->ijc", x, y))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_under_no_grad_and_inference_mode(mode):
    za, zb, a, b = _pairs((3, 1), 2, 7)
    a.requires_grad_()
    with getattr(torch, mode)():
        out = torch.einsum("...kic,...kjc->...ijc", a, b)
    assert not out.requires_grad
    for o, x, y in zip(out.unbind(), za, zb):
        torch.testing.assert_close(o, torch.einsum("kic,kjc->ijc", x, y))


def test_batch_of_zero_length_samples_and_b1():
    for ns in [(0, 0), (5,)]:
        za, zb, a, b = _pairs(ns, 2, 8)
        out = torch.einsum("...ikc,...jkc->...ijc", a, b)
        for o, x, y in zip(out.unbind(), za, zb):
            torch.testing.assert_close(o, torch.einsum("ikc,jkc->ijc", x, y))


def test_compiled_fullgraph_no_recompile_as_lengths_change():
    from torch._dynamo.testing import CompileCounterWithBackend

    lin = torch.nn.Linear(4, 8, dtype=torch.float64)

    def f(z):
        a, b = lin(z).chunk(2, -1)
        return torch.einsum("...ikc,...jkc->...ijc", a.sigmoid(), b)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    for seed, ns in enumerate([(3, 5, 2), (4, 0, 6), (7, 1, 3)]):
        comps = comps_for([(n, n, 4) for n in ns], seed)
        z1 = mj.nested_tensor(comps, ragged_dims=(1, 2), requires_grad=True)
        z2 = mj.nested_tensor(comps, ragged_dims=(1, 2), requires_grad=True)
        out, ref = compiled(z1), f(z2)
        torch.testing.assert_close(out.values(), ref.values())
        (g1,) = torch.autograd.grad((out * out).sum(), z1)
        (g2,) = torch.autograd.grad((ref * ref).sum(), z2)
        torch.testing.assert_close(g1.values(), g2.values())
    assert counter.frame_count == 1


@pytest.mark.parametrize("eq", ["bijc,bkc->bikc", "bij,bjk,bkl->bil"])
def test_other_contractions_run_per_sample(eq):
    """Contractions the pair product does not take run by broadcasting (test_contractions.py)."""
    p = mj.nested_tensor(comps_for([(2, 2, 3), (1, 1, 3)], 0), ragged_dims=(1, 2))
    q = mj.nested_tensor(comps_for([(2, 3), (1, 3)], 1))
    s = mj.nested_tensor(comps_for([(2, 2), (1, 1)], 2), ragged_dims=(1, 2))
    ops = (p, q) if eq.count(",") == 1 else (s, s, s)
    sample_eq = ",".join(t[1:] for t in eq.split("->")[0].split(",")) + "->" + eq.split("->")[1][1:]
    for i, o in enumerate(torch.einsum(eq, *ops).unbind()):
        torch.testing.assert_close(o, torch.einsum(sample_eq, *[op.unbind()[i] for op in ops]))
