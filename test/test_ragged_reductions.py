"""Reductions and softmax over ragged dims (ops/reductions/reduce.py, ops/reductions/routes.py).

NOTE [ Reducing ragged dims ]: reducing some ragged dims keeps the structure of the others (a
pair reduced over one dim gives back the singles' nested int); reducing all of them gives a
dense ``(B, …)`` tensor. Checked against the per-sample reference (forward and gradients),
torch.jagged on one ragged dim, gradcheck, the no-leakage property and golden cases.
"""

import math

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import LAYOUTS, R, SQUARE, few, assert_close, build, components, per_sample_check, seeds, structures
from _structures import rect_pair, bit_equal, comps_for, dense_forward_check, empty_aware, length_pairs, lengths, packed_args, per_sample_outputs

FEW = few(10)

# Negative dims mean the same thing on a (B, …) multi_jagged tensor and on its (…) components.
# dims per layout: single ragged dims, ragged mixed with static, and every ragged dim (dense).
DIMS = {
    "seq": [(-2,), (-2, -1)],  # (B, j0, C)
    "square": [(-3,), (-2,), (-3, -1), (-2, -1), (-3, -2), (-3, -2, -1)],  # (B, j0, j0, C)
    "rect": [(-3,), (-2,), (-3, -1), (-3, -2)],  # (B, j0, j1, C)
    "static_lead": [(-2,), (-3, -2), (-2, -1)],  # (B, S, j0, C)
}
RAGGED = {"seq": (-2,), "square": (-3, -2), "rect": (-3, -2), "static_lead": (-2,)}
LAYOUT = {str(lay): lay for lay in LAYOUTS}

# name -> (fn(t, dims, keepdim), kind for empty_aware, takes a list of dims)
REDUCTIONS = {
    "sum": (lambda t, d, k: t.sum(d, keepdim=k), "sum", True),
    "mean": (lambda t, d, k: t.mean(d, keepdim=k), "mean", True),
    "amax": (lambda t, d, k: torch.amax(t, d, keepdim=k), "amax", True),
    "amin": (lambda t, d, k: t.amin(d, keepdim=k), "amin", True),
    "prod": (lambda t, d, k: t.prod(d[0], keepdim=k), "prod", False),
    "logsumexp": (lambda t, d, k: torch.logsumexp(t, d, keepdim=k), "logsumexp", True),
    "var": (lambda t, d, k: t.var(d, keepdim=k), "var", True),
    "var_c0": (lambda t, d, k: torch.var(t, d, correction=0, keepdim=k), "var", True),
    "std": (lambda t, d, k: t.std(d, keepdim=k), "std", True),  # n - correction <= 0 gives nan, as dense
    "vector_norm": (lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k), "norm", True),
    "vector_norm_1": (lambda t, d, k: torch.linalg.vector_norm(t, 1, d, keepdim=k), "norm", True),
    "vector_norm_3": (lambda t, d, k: torch.linalg.vector_norm(t, 3, d, keepdim=k), "norm", True),
    "Tensor.norm": (lambda t, d, k: t.norm(dim=d, keepdim=k), "norm", True),  # reference: see _REF
    "any": (lambda t, d, k: torch.any(t > 0.5, dim=d, keepdim=k), "any", True),
    "all": (lambda t, d, k: (t > -1.5).all(dim=d, keepdim=k), "all", True),
    "argmax": (lambda t, d, k: t.argmax(d[0], keepdim=k), "argmax", False),
    "argmin": (lambda t, d, k: torch.argmin(t, d[0], keepdim=k), "argmin", False),
    "max.values": (lambda t, d, k: t.max(d[0], keepdim=k).values, "amax", False),
    "min.indices": (lambda t, d, k: torch.min(t, d[0], keepdim=k).indices, "argmin", False),
    # composites of the above (routes.py)
    "nansum": (lambda t, d, k: torch.nansum(torch.where(t > 1.5, float("nan"), t), d, keepdim=k), "sum", True),
    "nanmean": (lambda t, d, k: t.nanmean(d, keepdim=k), "mean", True),
    "count_nonzero": (lambda t, d, k: torch.count_nonzero((t > 0) if not k else t.round(), d), "count", True),
    "aminmax.max": (lambda t, d, k: torch.aminmax(t, dim=d[0], keepdim=k).max, "amax", False),
    "var_mean.mean": (lambda t, d, k: torch.var_mean(t, d, keepdim=k)[1], "mean", True),
    "std_mean.std": (lambda t, d, k: torch.std_mean(t, d, correction=0, keepdim=k)[0], "std", True),
    "linalg.norm": (lambda t, d, k: torch.linalg.norm(t, 3, d[0], keepdim=k), "norm", False),
}


# Dense references that differ from the tested call: dense Tensor.norm over 3 dims is a matrix norm.
_REF = {"Tensor.norm": lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k)}


def _cases():
    """(reduction, layout, dims); reductions taking one dim get the single-dim cases only."""
    for name, (_, _, multi) in REDUCTIONS.items():
        for layout, dims_list in DIMS.items():
            for dims in dims_list:
                if multi or len(dims) == 1:
                    yield pytest.param(name, layout, dims, id=f"{name}-{layout}-{dims}")


def _check_reduction(name, s, seed, dims, keepdim):
    fn, kind, multi = REDUCTIONS[name]
    dense = set(RAGGED[str(s.layout)]) <= set(dims)
    rfn = _REF.get(name, fn)
    ref = empty_aware(lambda t: rfn(t, dims, keepdim), kind, dims)
    comps = components(s.shapes, seed)
    grad = kind not in ("any", "all", "argmax", "argmin", "count")
    if dense and not grad:
        dense_forward_check(lambda x: fn(x, dims, keepdim), ref, comps, s.ragged_dims)
        return
    out = per_sample_check(
        lambda x: fn(x, dims, keepdim), R(comps, s.ragged_dims), ref=ref, dense_out=dense, grad=grad, seed=seed
    )
    assert isinstance(out, mj.MultiJaggedTensor) != dense


@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
@pytest.mark.parametrize("name,layout,dims", list(_cases()))
def test_reduction_per_sample(name, layout, dims, keepdim):
    """Every reduction over ragged (and static) dims equals the dense op per component,
    including over empty extents (finfo.min / finfo.max / 0 where dense torch refuses), with
    gradients."""

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3, max_len=3), seeds)
    def check(s, seed):
        _check_reduction(name, s, seed, dims, keepdim)

    check()


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "logsumexp", "var_c0", "vector_norm", "any", "argmax"])
@pytest.mark.parametrize("dim", [1, 2, -2, -3])
def test_reduction_of_broadcast_pair(name, dim):
    """Reductions of the pair made by broadcasting (the model path), gradients reaching x."""
    fn, kind, _ = REDUCTIONS[name]

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        def op(t):
            return fn(t.unsqueeze(-2) * t.unsqueeze(-3) + t.unsqueeze(-2), (dim,), False)

        def ref(c):
            p = c.unsqueeze(-2) * c.unsqueeze(-3) + c.unsqueeze(-2)
            d = dim if dim < 0 else dim - 1
            return empty_aware(lambda t: fn(t, (d,), False), kind, (d,))(p)

        per_sample_check(op, R(comps_for([(n, 2) for n in ns], seed), (1,)), ref=ref)

    check()


# ----------------------------------------------------------------------------- nested ints
def test_pair_reduction_returns_the_singles_nested_int():
    """``pair.mean(dim=-2)`` has the singles' ``j0``; ``x + s`` works and is per-sample right."""

    @FEW
    @given(lengths(), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        comps = comps_for([(n, c) for n in ns], seed)
        x = mj.nested_tensor(comps, ragged_dims=(1,))
        pair = x.unsqueeze(-2) + x.unsqueeze(-3)
        for dim in (-2, -3, 1, 2):
            for red in (lambda p: p.mean(dim=dim), lambda p: p.sum(dim), lambda p: p.amax(dim), lambda p: torch.logsumexp(p, dim)):
                s = red(pair)
                assert s.shape == x.shape and s.shape[1] == x.shape[1]
                assert s.ragged_dims == x.ragged_dims
                y = x + s
                for yi, xi, si in zip(y.unbind(), x.unbind(), s.unbind()):
                    assert_close(yi, xi + si)
        # mixed with a static dim: (B, j0) still carries x's j0
        assert pair.sum((1, 3)).shape == (len(ns), x.shape[1])
        # keepdim over a pair dim gives the row / column roles back: they broadcast again
        row, col = pair.sum(-2, keepdim=True), pair.sum(-3, keepdim=True)
        assert row.shape == (len(ns), x.shape[1], 1, c) and col.shape == (len(ns), 1, x.shape[1], c)
        again = row + col
        assert again.shape == pair.shape
        for a, ci in zip(again.unbind(), comps):
            pc = ci.unsqueeze(-2) + ci.unsqueeze(-3)
            assert_close(a, pc.sum(-2, keepdim=True) + pc.sum(-3, keepdim=True))

    check()


def test_rect_reduction_returns_each_sides_nested_int():
    @FEW
    @given(length_pairs(), seeds)
    def check(nm, seed):
        ns, ms = nm
        x, y, rect = rect_pair(ns, ms, seed)  # (B, j_x, j_y, 2)
        over_keys, over_queries = rect.sum(-2), rect.mean(-3)
        assert over_keys.shape == x.shape
        if ns != ms:  # equal lengths: see test_rect_from_equal_lengths_keeps_each_sides_nested_int
            assert over_queries.shape == y.shape
        for a, xi, yi in zip((x + over_keys).unbind(), x.unbind(), y.unbind()):
            assert_close(a, xi + (xi.unsqueeze(-2) * yi.unsqueeze(-3)).sum(-2))
        for a, xi, yi in zip((y - over_queries).unbind(), x.unbind(), y.unbind()):
            assert_close(a, yi - (xi.unsqueeze(-2) * yi.unsqueeze(-3)).mean(-3))

    check()


def test_rect_from_equal_lengths_keeps_each_sides_nested_int():
    """A tensor derived from another keeps that tensor's size source for the dims
    it inherits — dim 2 of ``x.unsqueeze(-2) * y.unsqueeze(-3)`` comes from y."""
    x = mj.nested_tensor(comps_for([(n, 2) for n in (2, 0)], 0), ragged_dims=(1,))
    y = mj.nested_tensor(comps_for([(n, 2) for n in (2, 0)], 1), ragged_dims=(1,))
    assert x.shape[1] != y.shape[1]
    rect = x.unsqueeze(-2) * y.unsqueeze(-3)
    assert rect.shape == (2, x.shape[1], y.shape[1], 2)
    assert rect.mean(-3).shape == y.shape


def test_non_leading_pair_reduction_returns_the_singles_nested_int():
    x = mj.nested_tensor(comps_for([(2, n, 3) for n in (3, 0, 2)], 5), ragged_dims=(2,))
    pair = x.unsqueeze(-2) * x.unsqueeze(-3)  # (B, S, j0, j0, C)
    s = pair.mean(-2)
    assert s.shape == x.shape and s.ragged_dims == (2,)
    for si, xi in zip((s + x).unbind(), x.unbind()):
        assert_close(si, (xi.unsqueeze(-2) * xi.unsqueeze(-3)).mean(-2) + xi)


# ----------------------------------------------------------------------------- softmax
SOFTMAX = {
    "softmax": lambda t, d: t.softmax(d),
    "log_softmax": lambda t, d: torch.log_softmax(t, d),
    "F.softmax": lambda t, d: torch.nn.functional.softmax(t, dim=d),
}
SOFTMAX_DIMS = [("seq", -2), ("square", -3), ("square", -2), ("rect", -3), ("rect", -2), ("static_lead", -2), ("square", -1), ("static_lead", -3)]


@pytest.mark.parametrize("layout,dim", SOFTMAX_DIMS, ids=[f"{a}{b}" for a, b in SOFTMAX_DIMS])
@pytest.mark.parametrize("name", SOFTMAX, ids=str)
def test_softmax_per_sample(name, layout, dim):
    """Softmax along a row or a column of a pair, the sequence dim, or a static dim."""

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3, max_len=4), seeds)
    def check(s, seed):
        f = SOFTMAX[name]
        # per_sample_check also asserts that the output keeps the input's nested ints
        per_sample_check(lambda t: f(t, dim), R(components(s.shapes, seed), s.ragged_dims), seed=seed)

    check()


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_over_broadcast_pair(name):
    """Attention-style: softmax over the key dim of a rectangular pair, then a weighted sum
    back to the queries (gradients reach both x and y)."""
    f = SOFTMAX[name]

    @FEW
    @given(length_pairs(max_batch=3), seeds)
    def check(nm, seed):
        ns, ms = nm

        def fn(x, y):
            logits = (x.unsqueeze(-2) * y.unsqueeze(-3)).sum(-1)  # (B, j0, j1)
            w = f(logits, -1)
            return (w.unsqueeze(-1) * y.unsqueeze(-3)).sum(-2)  # (B, j0, C)

        per_sample_check(fn, R(comps_for([(n, 2) for n in ns], seed), (1,)), R(comps_for([(m, 2) for m in ms], seed + 1), (1,)))

    check()


# ----------------------------------------------------------------------------- torch.jagged parity
# name -> (fn, whether torch.jagged differentiates it); log_softmax over the ragged dim is not
# supported by torch.jagged, nor are sum/mean backward (aten._nested_sum_backward).
NJT_OPS = {
    "sum": (lambda t: t.sum(1), False),
    "sum_keepdim": (lambda t: t.sum(1, keepdim=True), False),
    "mean": (lambda t: t.mean(1), False),
    "amax": (lambda t: t.amax(1), True),
    "amin": (lambda t: t.amin(1), True),
    "argmax": (lambda t: t.argmax(1), False),
    "argmin": (lambda t: t.argmin(1), False),
    # torch 2.13's NJT softmax *backward* along the ragged dim disagrees with the dense
    # per-sample gradient (checked by hand), so only its forward is compared; ours is checked
    # against the dense reference in test_softmax_per_sample.
    "softmax": (lambda t: t.softmax(1), False),
    "softmax_static": (lambda t: t.softmax(-1), True),
}


@pytest.mark.parametrize("name", NJT_OPS, ids=str)
def test_matches_torch_jagged(name):
    """On (B, j0, C) with an empty sample: same values, same shape (with ``from_jagged`` the
    nested int is NJT's own) and, where NJT differentiates, same gradients. (One non-empty
    sample is always present: torch.jagged fails when every sample is empty.)"""
    f, njt_grad = NJT_OPS[name]

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 4), st.integers(1, 3), seeds)
    def check(ns, extra, c, seed):
        comps = comps_for([(n, c) for n in (*ns, extra)], seed)
        leaves = [t.clone().requires_grad_(njt_grad) for t in comps]
        njt = torch.nested.as_nested_tensor(leaves, layout=torch.jagged)
        ours = mj.from_jagged(njt)  # same offsets, so the same nested int
        expected, got = f(njt), f(ours)
        assert got.shape == expected.shape
        if expected.is_nested:
            assert isinstance(got, mj.MultiJaggedTensor)
            e_vals, g_vals = expected.values(), got.values()
        else:
            e_vals, g_vals = expected, got
        # bit for bit, except softmax: NJT takes it on a padded copy, we per segment, and the
        # exponentials' sums may round differently in the last place
        tol = 1e-14 if name.startswith("softmax") else 0
        assert_close(g_vals, e_vals, name, rtol=tol, atol=tol)
        if not njt_grad:
            return
        g = torch.randn(e_vals.shape, generator=torch.Generator().manual_seed(seed), dtype=e_vals.dtype)
        ge = torch.autograd.grad((e_vals * g).sum(), leaves, allow_unused=True, retain_graph=True)
        gg = torch.autograd.grad((g_vals * g).sum(), leaves, allow_unused=True)
        for a, b, leaf in zip(gg, ge, comps):
            assert_close(a if a is not None else torch.zeros_like(leaf), b if b is not None else torch.zeros_like(leaf))

    check()


# ----------------------------------------------------------------------------- batch dim
def test_batch_dim_reductions():
    """Over the batch dim and every ragged dim: all rows are one segment (dense, no batch)."""

    @FEW
    @given(structures(SQUARE, max_batch=3), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x = mj.nested_tensor(comps, ragged_dims=s.ragged_dims)
        cells = torch.cat([c.reshape(-1, s.c) for c in comps])  # every (a, b) cell of every sample
        assert_close(x.sum((0, 1, 2)), cells.sum(0))
        assert_close(x.mean((0, 1, 2)), cells.mean(0))  # mean over all cells, not of per-sample means
        if cells.shape[0]:
            assert_close(x.amax((0, 1, 2)), cells.amax(0))
        else:  # no element in the batch: dense's error, not an empty extent's value
            with pytest.raises(IndexError, match="non-zero size"):
                x.amax((0, 1, 2))
        assert_close(x.sum(), cells.sum())
        assert_close(x.mean(), cells.mean())

    check()


def test_batch_dim_alone_raises():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    with pytest.raises(NotImplementedError, match="batch dim"):
        x.sum(0)
    with pytest.raises((NotImplementedError, ValueError), match="batch"):
        x.argmax(0)
    with pytest.raises((NotImplementedError, ValueError), match="batch"):
        x.softmax(0)


# ----------------------------------------------------------------------------- golden
def test_reductions_golden():
    x = mj.nested_tensor(
        [torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[5.0, -6.0]])], ragged_dims=(1,)
    )
    lo, hi = torch.finfo(torch.float32).min, torch.finfo(torch.float32).max
    nan = math.nan
    cases = {
        "sum": (x.sum(1), [[4.0, 6.0], [0.0, 0.0], [5.0, -6.0]]),  # = [1+3, 2+4], [empty → 0], [5, -6]
        "mean": (x.mean(1), [[2.0, 3.0], [nan, nan], [5.0, -6.0]]),  # = [(1+3)/2, (2+4)/2], [0/0], [5, -6]
        "amax": (x.amax(1), [[3.0, 4.0], [lo, lo], [5.0, -6.0]]),  # = [max(1,3), max(2,4)], [finfo.min]
        "amin": (x.amin(1), [[1.0, 2.0], [hi, hi], [5.0, -6.0]]),  # = [min(1,3), min(2,4)], [finfo.max]
        "prod": (x.prod(1), [[3.0, 8.0], [1.0, 1.0], [5.0, -6.0]]),  # = [1·3, 2·4], [empty → 1]
        "sum_all": (x.sum((1, 2)), [10.0, 0.0, -1.0]),  # = [1+2+3+4, 0, 5-6]
        "var": (x.var(1), [[2.0, 2.0], [nan, nan], [nan, nan]]),  # = [((1-2)²+(3-2)²)/1, …], n=0 and n=1 → nan
        "norm": (torch.linalg.vector_norm(x, 1, 1), [[4.0, 6.0], [0.0, 0.0], [5.0, 6.0]]),  # = [|1|+|3|, |2|+|4|]
        "logsumexp": (
            torch.logsumexp(x, 1),
            [[math.log(math.e + math.e**3), math.log(math.e**2 + math.e**4)], [-math.inf, -math.inf], [5.0, -6.0]],
        ),  # = [log(e¹+e³), log(e²+e⁴)], [log 0], [5, -6]
    }
    for name, (out, expected) in cases.items():
        assert not isinstance(out, mj.MultiJaggedTensor), name
        torch.testing.assert_close(out, torch.tensor(expected), equal_nan=True, msg=name)
    assert x.argmax(1).tolist() == [[1, 1], [0, 0], [0, 0]]  # = [argmax(1,3), argmax(2,4)], [empty → 0]
    assert x.argmin(1).tolist() == [[0, 0], [0, 0], [0, 0]]
    assert (x > 2).any(1).tolist() == [[True, True], [False, False], [True, False]]  # empty any → False
    assert (x > 2).all(1).tolist() == [[False, False], [True, True], [True, False]]  # empty all → True


def test_pair_reductions_golden():
    # x = [1, 2], [3]; pair = x_a + x_b
    x = mj.nested_tensor([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], ragged_dims=(1,))
    pair = x.unsqueeze(-1) + x.unsqueeze(-2)  # [[2, 3], [3, 4]], [[6]]
    rows = pair.sum(-1)
    assert rows.shape == x.shape
    expected = [[5.0, 7.0], [6.0]]  # = [2+3, 3+4], [6]
    for o, e in zip(rows.unbind(), expected):
        torch.testing.assert_close(o, torch.tensor(e))
    cols = pair.amax(-2)
    for o, e in zip(cols.unbind(), [[3.0, 4.0], [6.0]]):  # = [max(2,3), max(3,4)], [6]
        torch.testing.assert_close(o, torch.tensor(e))
    torch.testing.assert_close(pair.sum((1, 2)), torch.tensor([12.0, 6.0]))  # = [2+3+3+4, 6]
    torch.testing.assert_close(pair.mean((1, 2)), torch.tensor([3.0, 6.0]))  # = [12/4, 6/1]
    sm = pair.softmax(-1)
    e = math.e
    for o, ex in zip(sm.unbind(), [[[1 / (1 + e), e / (1 + e)], [1 / (1 + e), e / (1 + e)]], [[1.0]]]):  # = softmax([2,3]) = softmax([3,4])
        torch.testing.assert_close(o, torch.tensor(ex))


def test_softmax_golden():
    x = mj.nested_tensor([torch.tensor([0.0, math.log(3.0)]), torch.zeros(0), torch.tensor([7.0])], ragged_dims=(1,))
    out = x.softmax(1)
    expected = [[0.25, 0.75], [], [1.0]]  # = [1/(1+3), 3/(1+3)], [], [e⁷/e⁷]
    for o, e in zip(out.unbind(), expected):
        torch.testing.assert_close(o, torch.tensor(e))
    ls = x.log_softmax(1)
    for o, e in zip(ls.unbind(), [[math.log(0.25), math.log(0.75)], [], [0.0]]):
        torch.testing.assert_close(o, torch.tensor(e))


def test_grad_golden():
    leaves = [torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True), torch.zeros(0, 2, requires_grad=True),
              torch.tensor([[0.0, 5.0], [2.0, 3.0], [4.0, 0.0]], requires_grad=True)]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    x.mean(1).sum().backward()
    torch.testing.assert_close(leaves[0].grad, torch.full((2, 2), 0.5))  # = 1/n, n = 2
    torch.testing.assert_close(leaves[2].grad, torch.full((3, 2), 1 / 3))  # = 1/n, n = 3
    assert leaves[1].grad.shape == (0, 2)
    for leaf in leaves:
        leaf.grad = None
    x.prod(1).sum().backward()
    # ∂/∂x_a Π_b x_b = Π_{b≠a} x_b, exact with zeros: [[3, 4], [1, 2]] and [[0, 0], [0, 0], [0, 15]]
    torch.testing.assert_close(leaves[0].grad, torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    torch.testing.assert_close(leaves[2].grad, torch.tensor([[8.0, 0.0], [0.0, 0.0], [0.0, 15.0]]))  # col 0: 2·4 for the zero; col 1: 5·3 for the zero


@pytest.mark.parametrize("comp", [[[0.7]], [[0.7], [0.7]]], ids=["n=1", "constant"])
def test_std_grad_at_zero_spread(comp):
    leaf = torch.tensor(comp, dtype=torch.float64, requires_grad=True)
    x = mj.as_nested_tensor([leaf], ragged_dims=(1,))
    x.std(1, correction=0).sum().backward()
    dense = torch.tensor(comp, dtype=torch.float64, requires_grad=True)
    dense.std(0, correction=0).sum().backward()
    assert dense.grad.eq(0).all()  # torch's std_backward masks std == 0
    assert_close(leaf.grad, dense.grad)


@pytest.mark.parametrize("ord", [2, 3, "Tensor.norm"])
def test_norm_grad_at_zero_vector(ord):
    leaf = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    dense = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    x = mj.as_nested_tensor([leaf], ragged_dims=(1,))
    if ord == "Tensor.norm":
        x.norm(dim=1).sum().backward()
        dense.norm(dim=0).sum().backward()
    else:
        torch.linalg.vector_norm(x, ord, dim=1).sum().backward()
        torch.linalg.vector_norm(dense, ord, dim=0).sum().backward()
    assert dense.grad.eq(0).all()  # subgradient 0, as torch's norm_backward
    assert_close(leaf.grad, dense.grad)


@pytest.mark.parametrize("ord", [0.5, 0.3, -1, -2.5, 1.5, 0])
@pytest.mark.parametrize("dim", [1, 2, (1, 2)])
def test_norm_below_one_and_negative_grad_at_zero_entries(ord, dim):
    """``vector_norm`` with ``ord < 1`` over entries that are 0: dense norm backward gives those
    entries (and, for ``ord < 0``, a whole vector holding a 0, whose norm is 0) a zero gradient,
    where ``|x|^p`` differentiated at 0 is inf · 0 = NaN; per sample, an empty sample included.
    ``ord = 0`` counts nonzeros and is differentiable with a zero gradient."""
    g = torch.Generator().manual_seed(2)
    comps = [torch.randn(n, 3, dtype=torch.float64, generator=g) for n in (3, 0, 4)]
    comps[0][1, 0] = comps[0][2, 2] = comps[2][0, 1] = 0.0
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    out = torch.linalg.vector_norm(x, ord, dim=dim)
    dd = tuple(d - 1 for d in dim) if isinstance(dim, tuple) else dim - 1
    refs = [torch.linalg.vector_norm(c, ord, dim=dd) for c in leaves[:1] + leaves[2:]]
    got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
    for a, b in zip([got[0], got[2]], refs):
        assert_close(a, b)
    assert out.requires_grad
    w = torch.randn(out.shape if not isinstance(out, mj.MultiJaggedTensor) else (1,), dtype=torch.float64, generator=g)
    loss_ours = (out * w).sum() if not isinstance(out, mj.MultiJaggedTensor) else sum(o.sum() for o in out.unbind())
    ga = torch.autograd.grad(loss_ours, leaves)
    if isinstance(out, mj.MultiJaggedTensor):
        gb = torch.autograd.grad(sum(r.sum() for r in refs), [leaves[0], leaves[2]], allow_unused=True)
    else:
        gb = torch.autograd.grad(sum((r * wi).sum() for r, wi in zip(refs, [w[0], w[2]])), [leaves[0], leaves[2]],
                                 allow_unused=True)
    for a, b in zip([ga[0], ga[2]], gb):
        assert not a.isnan().any()
        assert_close(a, torch.zeros_like(a) if b is None else b)  # dense gives ord = 0 no gradient


def test_any_and_all_over_no_dims_are_elementwise_as_dense():
    """Dense ``any`` / ``all`` with ``dim=()`` reduce nothing (unlike ``sum``): ``x != 0``, per sample."""
    comps = [torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 0.0]])]
    x = mj.nested_tensor(comps)
    for f in (lambda t: t.any(dim=()), lambda t: t.all(dim=[]), lambda t: torch.any(t, dim=(), keepdim=True)):
        out = f(x)
        assert out.shape[:2] == x.shape[:2] and out.dtype == torch.bool
        for o, c in zip(out.unbind(), comps):
            assert torch.equal(o, f(c))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logsumexp_of_masked_entries_is_finite_as_dense(dtype):
    """Entries equal to ``finfo.min`` (an additive mask's fill) are real values, not an empty
    segment: a fully masked row's logsumexp is ``finfo.min`` with dense's gradient, over a ragged
    and over a static dim; an empty sample's stays ``-inf``."""
    lo = torch.finfo(dtype).min
    g = torch.Generator().manual_seed(0)
    leaves = [torch.full((3, 2), lo, dtype=dtype), torch.randn(2, 2, generator=g).to(dtype), torch.zeros(0, 2, dtype=dtype)]
    leaves[1][0, 1] = lo
    leaves = [t.requires_grad_() for t in leaves]
    x = mj.as_nested_tensor(leaves)
    for dim in (1, 2):
        out = x.logsumexp(dim)
        got = list(out.unbind()) if dim == 2 else list(out.unbind(0))
        refs = [t.logsumexp(dim - 1) for t in leaves]
        grads = torch.autograd.grad(sum(o.float().sum() for o in got), leaves, allow_unused=True)
        want = torch.autograd.grad(sum(r.float().sum() for r in refs), leaves, allow_unused=True)
        for o, r, gm, gr in zip(got, refs, grads, want):
            torch.testing.assert_close(o, r)
            if gr is not None:
                torch.testing.assert_close(gm, gr)
    assert x.logsumexp(1)[2].isneginf().all()


def test_var_grad_does_not_leak_nan_into_other_samples():
    leaves = [torch.tensor([[0.5, 1.0]], dtype=torch.float64, requires_grad=True),  # n = 1: var = nan
              torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64, requires_grad=True)]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    v = x.var(1)  # [[nan, nan], [2, 4.5]]  # = [0/0], [((1-2)²+(3-2)²)/1, ((2-3.5)²+(5-3.5)²)/1]
    torch.testing.assert_close(v[1], torch.tensor([2.0, 4.5], dtype=torch.float64))
    v[1].sum().backward()  # the loss does not involve sample 0
    torch.testing.assert_close(leaves[1].grad, torch.tensor([[-2.0, -3.0], [2.0, 3.0]], dtype=torch.float64))  # = 2(x - mean)/(2-1)
    # sample 0's var backward runs with a zero cotangent, as in the stacked per-sample reference
    # torch.stack([c.var(0) for c in leaves])[1]: 2/(n-1) · 0 · (x - mean) = inf · 0 = nan
    assert leaves[0].grad.isnan().all()


@pytest.mark.parametrize("loss", ["nansum", "select"])
def test_var_with_one_element_has_nan_gradient_as_dense(loss):
    """``var(correction=1)`` over a sample with one element: nan, and so is its gradient whenever
    the backward runs — also with a zero cotangent (``nansum``), where dense torch's
    ``2 / (n - 1) · g · (x - mean)`` is ``inf · 0``."""
    comps = [torch.tensor([[0.5, 1.0]], dtype=torch.float64), torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64)]
    ours = [c.clone().requires_grad_() for c in comps]
    ref = [c.clone().requires_grad_() for c in comps]
    v = mj.as_nested_tensor(ours, ragged_dims=(1,)).var(1, correction=1)
    dense = torch.stack([c.var(0, correction=1) for c in ref])
    pick = (lambda t: t.nansum()) if loss == "nansum" else (lambda t: t[1].sum())
    got = torch.autograd.grad(pick(v), ours)
    want = torch.autograd.grad(pick(dense), ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert got[0].isnan().all() and not got[1].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", ["nanmean", "nansum"])
def test_nan_reductions_over_an_all_nan_column_have_dense_gradients(op, dtype):
    """``nanmean`` along a ragged dim of a column that is all nan: nan, and so is its gradient
    (dense ``nansum / 0`` backward: ``inf · 0``; a ``where`` gave 0); nan elements of other
    columns get 0; ``nansum``'s gradient stays dense's. A zero-length sample, per sample."""
    nan = float("nan")
    comps = [torch.tensor([[nan, 1.0], [nan, nan], [nan, 3.0]], dtype=dtype), torch.zeros(0, 2, dtype=dtype),
             torch.tensor([[2.0, nan]], dtype=dtype)]
    fn = (lambda t, d: torch.nanmean(t, d)) if op == "nanmean" else (lambda t, d: torch.nansum(t, d))
    per_sample_check(lambda x: fn(x, 1), R(comps, (1,)), ref=lambda c: fn(c, 0), dense_out=True)
    ours = [c.clone().requires_grad_() for c in comps]
    got = torch.autograd.grad(fn(mj.as_nested_tensor(ours, ragged_dims=(1,)), 1).sum(), ours)
    if op == "nanmean":
        assert got[0][:, 0].isnan().all() and torch.equal(got[0][:, 1], torch.tensor([0.5, 0.0, 0.5], dtype=dtype))


# ----------------------------------------------------------------------------- gradcheck
SQ_COMPS = comps_for([(2, 2, 2), (0, 0, 2), (3, 3, 2)], 11)
RECT_COMPS = comps_for([(2, 3, 2), (0, 2, 2), (1, 1, 2), (3, 2, 2)], 12)
SEQ_COMPS = comps_for([(2, 2), (0, 2), (3, 2)], 13)

GRADCHECK = {
    "sum_row": (SQ_COMPS, (1, 2), lambda x: x.sum(-2)),
    "sum_dense": (SQ_COMPS, (1, 2), lambda x: x.sum((1, 2))),
    "sum_mixed": (RECT_COMPS, (1, 2), lambda x: x.sum((1, 3))),
    "mean_col": (SQ_COMPS, (1, 2), lambda x: x.mean(1)),
    "mean_rect": (RECT_COMPS, (1, 2), lambda x: x.mean(-2, keepdim=True)),
    "amax": (SQ_COMPS, (1, 2), lambda x: x.amax(-2)),
    "amin_dense": (RECT_COMPS, (1, 2), lambda x: x.amin((1, 2))),
    "prod": (SQ_COMPS, (1, 2), lambda x: x.prod(1)),
    "prod_seq": (SEQ_COMPS, (1,), lambda x: x.prod(1)),
    "logsumexp": (SQ_COMPS, (1, 2), lambda x: torch.logsumexp(x, -2)),
    "var": (SQ_COMPS, (1, 2), lambda x: x.var(1)),
    "std": (SQ_COMPS, (1, 2), lambda x: x.std(-2)),
    "vector_norm": (SQ_COMPS, (1, 2), lambda x: torch.linalg.vector_norm(x, dim=-2)),
    "norm_mixed": (SQ_COMPS, (1, 2), lambda x: x.norm(dim=(1, 3))),
    "softmax_row": (SQ_COMPS, (1, 2), lambda x: x.softmax(-2)),
    "softmax_col": (RECT_COMPS, (1, 2), lambda x: x.softmax(1)),
    "log_softmax_seq": (SEQ_COMPS, (1,), lambda x: x.log_softmax(1)),
    "log_softmax_rect": (RECT_COMPS, (1, 2), lambda x: x.log_softmax(-2)),
    "broadcast_then_mean": (SEQ_COMPS, (1,), lambda x: (x.unsqueeze(-2) * x.unsqueeze(-3)).mean(-2)),
}


@pytest.mark.parametrize("name", GRADCHECK, ids=str)
def test_gradcheck(name):
    comps, ragged_dims, f = GRADCHECK[name]
    v, off, sizes = packed_args(comps, ragged_dims)

    def fn(v):
        out = f(mj.from_packed(v, off, sizes, ragged_dims))
        return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

    assert torch.autograd.gradcheck(fn, (v.requires_grad_(),))


# ----------------------------------------------------------------------------- no leakage
LEAK = {
    "sum": lambda t, d: t.sum(d),
    "mean": lambda t, d: t.mean(d),
    "amax": lambda t, d: t.amax(d),
    "amin": lambda t, d: t.amin(d),
    "prod": lambda t, d: t.prod(d[0]),
    "logsumexp": lambda t, d: torch.logsumexp(t, d),
    "var": lambda t, d: t.var(d, correction=0),  # correction=1 with n = 1 is nan: tested separately
    "var_unbiased": lambda t, d: t.var(d),  # forward only
    "std": lambda t, d: t.std(d),
    "norm": lambda t, d: torch.linalg.vector_norm(t, dim=d),
    "any": lambda t, d: (t > 0).any(d[0]),
    "all": lambda t, d: (t > 0).all(d[0]),
    "argmax": lambda t, d: t.argmax(d[0]),
    "argmin": lambda t, d: t.argmin(d[0]),
    "softmax": lambda t, d: t.softmax(d[0]),
    "log_softmax": lambda t, d: t.log_softmax(d[0]),
}
# over every ragged dim (dense (B, …) outputs)
LEAK_DENSE = {
    "sum_dense": lambda t, r: t.sum(r),
    "mean_dense": lambda t, r: t.mean(r),
    "amax_dense": lambda t, r: t.amax(r),
    "logsumexp_dense": lambda t, r: torch.logsumexp(t, r),
    "var_dense": lambda t, r: t.var(r),
    "norm_dense": lambda t, r: t.norm(dim=r),
}
LEAK_DIMS = {"seq": (-2,), "square": (-2,), "rect": (-3,), "static_lead": (-2,)}
GRAD_LEAK = ["softmax", "log_softmax", "mean", "sum", "amax", "logsumexp", "var", "norm", "prod", "mean_dense", "logsumexp_dense", "norm_dense"]


def _perturbed(s, comps, j, seed, new_len):
    """Sample j replaced by fresh values (and, with ``new_len``, a different extent)."""
    g = torch.Generator().manual_seed(seed + 99)
    shape = list(comps[j].shape)
    if new_len is not None:
        for d in s.ragged_dims:
            shape[d - 1] = new_len
    out = list(comps)
    out[j] = torch.rand(shape, generator=g, dtype=comps[j].dtype) * 4 - 2
    return out


@pytest.mark.parametrize("layout", list(LEAK_DIMS))
@pytest.mark.parametrize("name", [*LEAK, *LEAK_DENSE], ids=str)
def test_no_cross_sample_leakage(name, layout):
    """Changing sample j (values, or values and extent) leaves every output of sample i ≠ j
    unchanged bit for bit; for the differentiable ones, a loss on sample i alone gives the same
    gradient for sample i, and exactly zero for every other sample."""
    f, dims = (LEAK[name], LEAK_DIMS[layout]) if name in LEAK else (LEAK_DENSE[name], RAGGED[layout])

    @FEW
    @given(structures(LAYOUT[layout], max_batch=4, max_len=4), seeds, st.data())
    def check(s, seed, data):
        b = s.batch
        comps = components(s.shapes, seed)
        j = data.draw(st.integers(0, b - 1))
        new_len = data.draw(st.none() | st.integers(0, 4))
        other = _perturbed(s, comps, j, seed, new_len)
        outs = []
        for cs in (comps, other):
            x = mj.nested_tensor(cs, ragged_dims=s.ragged_dims)
            outs.append(per_sample_outputs(f(x, dims)))
        for i in range(b):
            if i != j:
                assert bit_equal(outs[0][i], outs[1][i]), f"sample {i} changed when sample {j} did"
        if name not in GRAD_LEAK or b < 2:
            return
        i = data.draw(st.integers(0, b - 1).filter(lambda k: k != j))
        grads = []
        for cs in (comps, other):
            x, leaves = build(cs, s.ragged_dims, requires_grad=True)
            oi = per_sample_outputs(f(x, dims))[i]
            w = torch.rand(oi.shape, generator=torch.Generator().manual_seed(seed), dtype=oi.dtype)
            gs = torch.autograd.grad((torch.nan_to_num(oi) * w).sum(), leaves, allow_unused=True)
            gs = [torch.zeros_like(lf) if gg is None else gg for gg, lf in zip(gs, leaves)]
            for k, gg in enumerate(gs):
                if k != i:
                    assert bool((gg == 0).all()), f"loss on sample {i} has a gradient on sample {k}: {gg}"
            grads.append(gs[i])
        assert bit_equal(grads[0], grads[1]), f"grad of sample {i} changed when sample {j} did"

    check()


def test_dist_linalg_norm_and_nan_reductions_golden():
    x = mj.nested_tensor([torch.tensor([[3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[0.0, float("nan")], [1.0, 2.0]])])
    y = torch.zeros_like(x)
    assert torch.nansum(x).item() == 10.0  # = 3 + 4 + 0 + 1 + 2 (nan skipped)
    assert torch.nanmean(x).item() == 2.0  # = 10 / 5 non-nan elements
    assert torch.count_nonzero(x).item() == 5  # nan counts as nonzero
    clean = torch.nan_to_num(x)
    assert torch.dist(clean, y).item() == pytest.approx(math.sqrt(9 + 16 + 1 + 4))
    assert torch.dist(clean, y, 1).item() == 10.0
    assert torch.linalg.norm(clean, dim=-1).unbind()[0].tolist() == [5.0]  # ‖(3, 4)‖
    assert torch.linalg.norm(clean, "fro", dim=(1, 2)).tolist() == [5.0, 0.0, pytest.approx(math.sqrt(5))]
    lo, hi = torch.aminmax(clean)
    assert (lo.item(), hi.item()) == (0.0, 4.0)
    nuc = torch.linalg.norm(clean, "nuc", dim=(1, 2))  # each sample's matrix, as matrix_norm
    assert torch.allclose(nuc, torch.stack([torch.linalg.norm(c, "nuc") for c in clean.unbind()]))


@pytest.mark.parametrize("op", ["trapezoid", "trapz", "cumulative_trapezoid"])
def test_trapezoid_along_a_ragged_dim_per_sample(op):
    """The trapezoidal rule along a ragged dim integrates each sample's points alone (an empty or
    one-point sample gives 0, as dense), with gradients; a pair reduces one of its ragged dims."""
    f = getattr(torch, op)

    @FEW
    @given(lengths(min_batch=1), st.sampled_from([None, 0.5]), seeds)
    def check(ns, dx, seed):
        kw = {} if dx is None else {"dx": dx}
        comps = comps_for([(n, 3) for n in ns], seed)
        pairs = comps_for([(n, n) for n in ns], seed + 1)
        cumulative = op == "cumulative_trapezoid"  # one point fewer: a new ragged size
        per_sample_check(lambda t: f(t, dim=1, **kw), R(comps, (1,)), ref=lambda c: f(c, dim=0, **kw),
                         dense_out=not cumulative, new_ragged=cumulative, seed=seed)
        per_sample_check(lambda t: f(t, dim=-2, **kw), R(pairs, (1, 2)), ref=lambda c: f(c, dim=-2, **kw),
                         new_ragged=cumulative, seed=seed)

    check()


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_complex_logsumexp_per_sample(dim):
    """``logsumexp`` of complex samples shifts by the real part's max, as dense's does: each
    sample's values bit for bit and the gradient of every sample (an empty sample included
    along the static dim), along a ragged and a static dim."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, dtype=torch.complex128, generator=g).requires_grad_() for n in (3, 1, 0, 4)]
    if dim == 1:
        comps = [c for c in comps if c.shape[0]]  # dense logsumexp of an empty dim is -inf: kept out of the gradient
    x = mj.as_nested_tensor(comps)
    out = x.logsumexp(dim)
    refs = [c.logsumexp(dim - 1 if dim > 0 else dim) for c in comps]
    for a, r in zip(out.unbind(), refs):
        assert a.dtype == r.dtype and torch.equal(a, r)
    cots = [torch.randn(r.shape, dtype=r.dtype, generator=g) for r in refs]
    got = torch.autograd.grad(out, comps, mj.nested_tensor(cots) if isinstance(out, mj.MultiJaggedTensor) else torch.stack(cots))
    want = torch.autograd.grad(refs, comps, cots)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
