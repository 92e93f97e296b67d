"""``quantile`` / ``nanquantile`` along ragged and static dims (NOTE [ Order statistics along ragged
dims ] in ``ops/reductions/order.py``) against the dense op on each sample: every interpolation
mode, ties, NaNs, ``keepdim``, gradients to every element, the no-leakage property, and the
errors dense torch raises (an empty sample, an integer dtype)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged.ops.reductions.segment_ops import segment_path
from _reference import LAYOUTS, SEQ, SQUARE, few, seeds, structures
from _structures import bit_equal

F64 = torch.float64
MODES = ["linear", "lower", "higher", "midpoint", "nearest"]


def _nonempty(s):
    return all(min(e) > 0 for e in s.sizes)


def _with_nans(comps, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in comps:
        c = c.clone()
        if c.numel() and torch.rand((), generator=g) < 0.5:
            c.view(-1)[torch.randint(0, c.numel(), (1,), generator=g)] = math.nan
        out.append(c)
    return out


@pytest.mark.parametrize("path", [None, "per_length", "index_map"], ids=str)
def test_quantile_along_each_dim_per_sample(path):
    """Eagerly the dense quantile per segment (NOTE [ Dense ops on segments ]: per sample, per
    length by the rule, or forced per length); the index-map path (``torch.compile``'s) forced."""
    with segment_path(path):
        _quantile_along_each_dim_per_sample()


@few(25)
@given(structures(SEQ, min_batch=1) | structures(SQUARE) | structures(LAYOUTS[3]), seeds, st.floats(0, 1),
       st.sampled_from(MODES), st.booleans(), st.booleans(), st.booleans())
def _quantile_along_each_dim_per_sample(s, seed, q, mode, ignore_nan, keepdim, nans):
    if not _nonempty(s):
        return  # dense quantile refuses an empty tensor whatever the dim (test_empty_sample_raises)
    f = torch.nanquantile if ignore_nan else torch.quantile
    comps = s.components(seed, ties=True)
    if nans:
        comps = _with_nans(comps, seed)
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves, ragged_dims=s.ragged_dims)
    for dim in range(1, x.dim()):
        out = f(x, q, dim=dim, keepdim=keepdim, interpolation=mode)
        refs = [f(c, q, dim=dim - 1, keepdim=keepdim, interpolation=mode) for c in leaves]
        got = list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out.unbind(0))
        for a, b in zip(got, refs):
            torch.testing.assert_close(a, b, equal_nan=True)
        w = [torch.randn(r.shape, dtype=F64, generator=torch.Generator().manual_seed(seed % 97)) for r in refs]
        ga = torch.autograd.grad(sum((torch.nan_to_num(a) * c).sum() for a, c in zip(got, w)), leaves, allow_unused=True)
        gb = torch.autograd.grad(sum((torch.nan_to_num(b) * c).sum() for b, c in zip(refs, w)), leaves, allow_unused=True)
        for a, b, c in zip(ga, gb, leaves):
            torch.testing.assert_close(a if a is not None else torch.zeros_like(c), b if b is not None else torch.zeros_like(c))


def test_quantile_over_every_element_and_several_q():
    comps = [torch.tensor([3.0, 1.0, 2.0], dtype=F64), torch.tensor([5.0], dtype=F64)]
    x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    qs = torch.tensor([0.0, 0.25, 1.0], dtype=F64)
    torch.testing.assert_close(torch.quantile(x, qs), torch.quantile(torch.cat(comps), qs))
    # keepdim without dim: every dim kept as 1 (after the q dim), as dense torch's
    for q, shape in ((0.25, (1, 1)), (qs, (3, 1, 1))):
        kept = torch.nanquantile(x, q, keepdim=True)
        assert kept.shape == shape
        torch.testing.assert_close(kept.reshape(-1), torch.nanquantile(torch.cat(comps), q).reshape(-1))
    # a pair keeps a ragged dim: the leading q dim would come before the batch
    with pytest.raises(NotImplementedError, match="several q"):
        torch.quantile(x.unsqueeze(-1) + x.unsqueeze(-2), qs, dim=1)
    with pytest.raises(RuntimeError, match="1D"):
        torch.quantile(x, qs.view(3, 1), dim=1)


@pytest.mark.parametrize("path", [None, "index_map"], ids=str)
@pytest.mark.parametrize("f", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_several_q_along_the_only_ragged_dim_lead_a_dense_result(f, keepdim, mode, path):
    """``quantile(x, q, dim)`` with a 1-D ``q`` along the batch's only ragged dim is dense ``(Q, B, …)``,
    as ``torch.stack`` of each sample's dense result along dim 1; gradients to every element (eagerly,
    and on the index-map path ``torch.compile`` traces)."""
    g = torch.Generator().manual_seed(4)
    comps = [torch.randn(n, 3, dtype=F64, generator=g) for n in (4, 1, 6)]
    comps[2][1, 0] = math.nan
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    qs = torch.tensor([0.1, 0.5, 0.9, 0.5], dtype=F64)
    with segment_path(path):
        out = f(x, qs, dim=1, keepdim=keepdim, interpolation=mode)
    want = torch.stack([f(c, qs, dim=0, keepdim=keepdim, interpolation=mode) for c in leaves], 1)
    assert type(out) is torch.Tensor and out.shape == want.shape
    torch.testing.assert_close(out, want, equal_nan=True)
    w = torch.randn(want.shape, dtype=F64, generator=g)
    ga = torch.autograd.grad((torch.nan_to_num(out) * w).sum(), leaves)
    gb = torch.autograd.grad((torch.nan_to_num(want) * w).sum(), leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


def test_empty_sample_and_integer_dtype_raise_as_dense():
    x = torch.nested.nested_tensor([torch.rand(3), torch.rand(0)], layout=mj.multi_jagged)
    with pytest.raises(RuntimeError, match="non-empty"):
        torch.quantile(x, 0.5, dim=1)
    with pytest.raises(RuntimeError, match="float or double"):
        torch.quantile(torch.nested.nested_tensor([torch.arange(3)], layout=mj.multi_jagged), 0.5, dim=1)
    with pytest.raises(ValueError, match="interpolation"):
        torch.quantile(x, 0.5, dim=1, interpolation="cubic")


@pytest.mark.parametrize("path", [None, "index_map"], ids=str)
def test_quantile_golden(path):
    with segment_path(path):
        _quantile_golden()


def _quantile_golden():
    # sample 0 = [4, 1, 3, 2] (sorted 1 2 3 4), sample 1 = [7, nan, 5]
    x = torch.nested.nested_tensor([torch.tensor([4.0, 1.0, 3.0, 2.0]), torch.tensor([7.0, math.nan, 5.0])],
                                   layout=mj.multi_jagged)
    assert torch.quantile(x, 0.5, dim=1)[0].item() == 2.5  # = rank 1.5 between 2 and 3
    assert math.isnan(torch.quantile(x, 0.5, dim=1)[1].item())  # = a nan makes it nan
    assert torch.nanquantile(x, 0.5, dim=1).tolist() == [2.5, 6.0]  # = [5, 7] at rank 0.5
    # q = 0.4 on sample 0: rank 0.4 · 3 = 1.2 between 2 (rank 1) and 3 (rank 2)
    got = {m: torch.quantile(x, 0.4, dim=1, interpolation=m)[0].item() for m in MODES}
    assert got["lower"] == 2.0 and got["higher"] == 3.0 and got["nearest"] == 2.0 and got["midpoint"] == 2.5
    assert abs(got["linear"] - 2.2) < 1e-6


def test_quantile_does_not_leak_between_samples():
    comps = [torch.rand(4, 2), torch.rand(3, 2), torch.rand(5, 2)]
    a = torch.quantile(torch.nested.nested_tensor(comps, layout=mj.multi_jagged), 0.3, dim=1)
    comps[1] = comps[1] * 10 - 3
    b = torch.quantile(torch.nested.nested_tensor(comps, layout=mj.multi_jagged), 0.3, dim=1)
    assert bit_equal(a[0], b[0]) and bit_equal(a[2], b[2]) and not torch.equal(a[1], b[1])


def test_mode_along_static_dims_and_along_a_ragged_dim_per_sample():
    comps = [torch.tensor([[1, 2, 2], [3, 3, 1]]), torch.tensor([[5, 5, 4]])]
    x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    v, i = torch.mode(x, -1)
    for a, b, c in zip(v.unbind(), i.unbind(), comps):
        r = torch.mode(c, -1)
        assert torch.equal(a, r.values) and torch.equal(b, r.indices)
    v, _ = x.mode(2, keepdim=True)
    assert v.shape[:2] == x.shape[:2] and v.shape[2] == 1


@few(8)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.booleans(), st.booleans(), seeds)
def test_mode_along_a_ragged_dim_is_the_dense_kernel_per_sample(ns, pair, keepdim, seed):
    # ties are common (values in 0..2): the index is dense torch's kernel's, whatever it picks
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randint(0, 3, (n, n, 2) if pair else (n, 2), generator=g).double().requires_grad_() for n in ns]
    x = mj.as_nested_tensor(comps, ragged_dims=(1, 2) if pair else (1,))
    d = 2 if pair else 1
    v, i = torch.mode(x, d, keepdim=keepdim)
    refs = [torch.mode(c, d - 1, keepdim=keepdim) for c in comps]
    got = zip(v.unbind(), i.unbind()) if pair else zip(v, i)  # one ragged dim left, or a dense (B, …)
    for (a, b), r in zip(got, refs):
        assert torch.equal(a, r.values) and torch.equal(b, r.indices)
    w = [torch.randn(r.values.shape, generator=g, dtype=torch.float64) for r in refs]
    vals = v.unbind() if pair else list(v)
    g1 = torch.autograd.grad(sum((a * t).sum() for a, t in zip(vals, w)), comps)
    g2 = torch.autograd.grad(sum((r.values * t).sum() for r, t in zip(refs, w)), comps)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    with pytest.raises(IndexError, match="sample 1"):
        torch.mode(mj.as_nested_tensor([torch.ones(2, 3), torch.ones(0, 3)]), 1)  # as dense torch refuses it


@pytest.mark.parametrize("name", ["quantile", "nanquantile"])
@pytest.mark.parametrize("dim", [None, 1, 2])
def test_out_is_refused_and_left_alone(name, dim):
    # dense's composite quantile resized a dense ``out`` (to nested-int sizes) before failing
    x = torch.nested.nested_tensor([torch.randn(n, 3) for n in (4, 0, 5)], layout=mj.multi_jagged)
    out = torch.empty(0)
    with pytest.raises(NotImplementedError, match=rf"{name}\(\): out= variants are not supported"):
        getattr(torch, name)(x, 0.5, dim=dim, out=out)
    assert out.shape == (0,)
