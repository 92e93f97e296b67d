"""Batched matmul with a dense per-sample operand (``bmm`` / ``matmul`` of a multi_jagged batch
and a dense ``(B, …)`` tensor), against the per-sample dense reference, with zero-length samples,
gradients to every input and a fullgraph compile test."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import multi_jagged

from _reference import PS, R, few, per_sample_check, seeds
from _structures import comps_for, lengths
from test_indexing_ops import _compiled, _components_equal

FEW = few(8)


def _dense_ps(ns, shape, seed):
    return torch.randn(len(ns), *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("call", ["matmul", "bmm"])
def test_bmm_ragged_rows_times_dense(call):
    """``(B, j, D) @ (B, D, E)`` → ``(B, j, E)``; gradients to both operands."""
    fn = torch.matmul if call == "matmul" else torch.bmm

    @FEW
    @given(lengths(), st.integers(1, 3), seeds)
    def check(ns, d, seed):
        out = per_sample_check(lambda x, o: fn(x, o), R(comps_for([(n, d) for n in ns], seed), (1,)),
                               PS(_dense_ps(ns, (d, 4), seed)), ref=torch.matmul, seed=seed)
        assert out.ragged_dims == (1,)

    check()


def test_bmm_dense_times_transposed_ragged():
    """``(B, F, E) @ (B, E, j)`` → ``(B, F, j)``, the ragged operand a transposed ``(B, j, E)``."""

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        out = per_sample_check(lambda o, x: o @ x.transpose(1, 2), PS(_dense_ps(ns, (5, 3), seed)),
                               R(comps_for([(n, 3) for n in ns], seed), (1,)), ref=lambda o, x: o @ x.T, seed=seed)
        assert out.ragged_dims == (2,)

    check()


@pytest.mark.parametrize("case", ["heads @ (H, D, E)", "heads @ (1, D, E)", "(H, E, D) @ heads transposed"])
def test_matmul_with_a_dense_operand_of_fewer_dims_broadcasts_its_leading_dims(case):
    """``(B, H, j, D) @ (H, D, E)``, a dense size-1 head dim, and ``(H, E, D) @ (B, H, D, j)``: as dense
    matmul, the dense operand's missing leading dims broadcast over the batch; gradients to both."""

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        g = torch.Generator().manual_seed(seed)
        x = R(comps_for([(n, 4, 3) for n in ns], seed), (1,))  # (B, j, H=4, D=3)
        if case == "heads @ (H, D, E)":
            w = torch.randn(4, 3, 5, dtype=torch.float64, generator=g)
            out = per_sample_check(lambda a, b: a.transpose(1, 2) @ b, x, w, ref=lambda a, b: a.transpose(0, 1) @ b,
                                   seed=seed)
        elif case == "heads @ (1, D, E)":
            w = torch.randn(1, 3, 5, dtype=torch.float64, generator=g)
            out = per_sample_check(lambda a, b: a.transpose(1, 2) @ b, x, w, ref=lambda a, b: a.transpose(0, 1) @ b,
                                   seed=seed)
        else:
            w = torch.randn(4, 5, 3, dtype=torch.float64, generator=g)
            out = per_sample_check(lambda a, b: b @ a.permute(0, 2, 3, 1), x, w, ref=lambda a, b: b @ a.permute(1, 2, 0),
                                   seed=seed)
        assert out.dim() == 4

    check()


def test_bmm_contracting_the_ragged_dim_gives_dense():
    """``(B, D, j) @ (B, j, E)`` → dense ``(B, D, E)`` (the dense operand's gradient above)."""

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        a, b = comps_for([(n, 2) for n in ns], seed), comps_for([(n, 3) for n in ns], seed + 1)
        per_sample_check(lambda x, y: torch.bmm(x.transpose(1, 2), y), R(a, (1,)), R(b, (1,)),
                         ref=lambda x, y: x.T @ y, dense_out=True, seed=seed)

    check()


def test_matmul_dense_per_sample_broadcast_no_grad_inference_mode_and_errors():
    comps = [torch.randn(n, 4) for n in (2, 0, 3)]
    x = torch.nested.nested_tensor(comps, layout=multi_jagged)
    o = torch.randn(1, 4, 5)
    _components_equal(x @ o, [c @ o[0] for c in comps])  # a dense batch of one broadcasts
    o3 = torch.randn(3, 4, 5)
    for ctx in (torch.no_grad(), torch.inference_mode()):
        with ctx:
            _components_equal(torch.bmm(x, o3), [c @ oi for c, oi in zip(comps, o3)])
            _components_equal(x @ o3, [c @ oi for c, oi in zip(comps, o3)])
    with pytest.raises(ValueError, match="bmm\\(\\): mat2 must be 3D"):
        torch.bmm(x, torch.randn(4, 5))
    with pytest.raises(RuntimeError, match="batch size 3, got 2"):
        torch.bmm(x, torch.randn(2, 4, 5))
    with pytest.raises(RuntimeError, match="mat2.shape\\[1\\] == 4"):
        torch.bmm(x, torch.randn(3, 5, 5))
    x4 = mj.nested_tensor([torch.randn(n, 2, 4) for n in (2, 3)], ragged_dims=(1,))
    w = torch.randn(2, 1, 4, 5)  # a dense size 1 broadcasts over the ragged dim, as per sample
    for a, c, wi in zip((x4 @ w).unbind(), x4.unbind(), w):
        torch.testing.assert_close(a, c @ wi)
    with pytest.raises(NotImplementedError, match="matmul.*multi_jagged"):
        x4 @ torch.randn(2, 3, 4, 5)  # a dense size against the ragged dim


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_grouped_mm_samples_are_the_groups(dtype):
    """``F.grouped_mm(x, w)`` of ``(B, j0, K)`` and ``(B, K, N)``: sample i's rows times ``w[i]``
    (mixture-of-experts tokens grouped per expert), gradients to both, second order; ``out_dtype``
    accumulates in it; ``offs`` (the batch's own) and ``bias`` raise."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=dtype, requires_grad=True) for n in (3, 0, 2)]
    w = torch.randn(3, 4, 5, generator=g, dtype=dtype, requires_grad=True)
    x = mj.as_nested_tensor(comps)
    out = F.grouped_mm(x, w)
    refs = [c @ wi for c, wi in zip(comps, w)]
    _components_equal(out, [r.detach() for r in refs])
    cot = [torch.randn(r.shape, generator=g, dtype=dtype) for r in refs]
    got = torch.autograd.grad(sum((o * o * c).sum() for o, c in zip(out.unbind(), cot)), comps + [w], create_graph=True)
    exp = torch.autograd.grad(sum((r * r * c).sum() for r, c in zip(refs, cot)), comps + [w], create_graph=True)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, **tol)
    if dtype == torch.float64:
        got2 = torch.autograd.grad(sum((t * t).sum() for t in got), comps + [w])
        exp2 = torch.autograd.grad(sum((t * t).sum() for t in exp), comps + [w])
        for a, b in zip(got2, exp2):
            torch.testing.assert_close(a, b)
    wide = F.grouped_mm(x, w, out_dtype=torch.float64)
    assert wide.dtype == torch.float64
    _components_equal(wide, [c.detach().double() @ wi.detach().double() for c, wi in zip(comps, w)])
    with pytest.raises(RuntimeError, match="offs must be None"):
        F.grouped_mm(x, w, offs=torch.tensor([3, 3, 5], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="bias"):
        F.grouped_mm(x, w, bias=torch.zeros(3, 5, dtype=dtype))


@given(lengths=st.lists(st.integers(0, 6), min_size=0, max_size=4), width=st.sampled_from([None, 1, 2]),
       floats=st.booleans(), seed=seeds)
@FEW
def test_unique_consecutive_along_the_ragged_dim_per_sample(lengths, width, floats, seed):
    """Runs of equal rows collapse within each sample (a CTC decoder's repeats), never across
    samples; inverse and counts as dense per sample; float values (NaN: each its own run, as
    dense) carry the gradient of a row selection; dim=None is dense torch's over every element."""
    g = torch.Generator().manual_seed(seed)
    shape = () if width is None else (width,)
    comps = [torch.randint(0, 2, (n, *shape), generator=g) for n in lengths]
    if floats:
        comps = [c.double().masked_fill(torch.rand(c.shape, generator=g) < 0.1, float("nan")).requires_grad_() for c in comps]
    x = mj.as_nested_tensor(comps) if comps else mj.nested_tensor([torch.zeros(0, *shape, dtype=torch.int64)])[:0]
    for ri in (False, True):
        for rc in (False, True):
            out = torch.unique_consecutive(x, return_inverse=ri, return_counts=rc, dim=1)
            outs = out if isinstance(out, tuple) else (out,)
            for i, c in enumerate(comps):
                ref = torch.unique_consecutive(c, return_inverse=ri, return_counts=rc, dim=0)
                ref = ref if isinstance(ref, tuple) else (ref,)
                for o, r in zip(outs, ref):
                    torch.testing.assert_close(o.unbind()[i], r.detach(), equal_nan=True, rtol=0, atol=0)
    if floats and comps:
        out = x.unique_consecutive(dim=1)
        refs = [c.unique_consecutive(dim=0) for c in comps]
        gx = torch.autograd.grad(sum(torch.where(o.isnan(), 0.0, o).sum() for o in out.unbind()), comps, allow_unused=True)
        # dense has no derivative: the reference is the selection of each run's first row
        for c, r, gi in zip(comps, refs, gx):
            keep = torch.ones(c.shape[0], dtype=torch.bool)
            if c.shape[0] > 1:
                keep[1:] = (c[1:] != c[:-1]).reshape(c.shape[0] - 1, -1).any(1)
            expected = torch.zeros_like(c).index_put((keep.nonzero()[:, 0],), (~r.detach().isnan()).double())
            torch.testing.assert_close(torch.zeros_like(c) if gi is None else gi, expected)
    if comps:
        flat = torch.unique_consecutive(x, return_inverse=True, return_counts=True)
        dense = torch.unique_consecutive(torch.cat([c.detach().reshape(-1) for c in comps]), return_inverse=True,
                                         return_counts=True)
        torch.testing.assert_close(flat[0], dense[0], equal_nan=True)
        torch.testing.assert_close(flat[1].values().reshape(-1), dense[1])
        torch.testing.assert_close(flat[2], dense[2])


def test_unique_consecutive_errors():
    pair = mj.nested_tensor([torch.zeros(2, 2, dtype=torch.int64), torch.zeros(1, 1, dtype=torch.int64)])
    with pytest.raises(NotImplementedError, match="only ragged dim 1"):
        pair.unique_consecutive(dim=1)
    seq = mj.nested_tensor([torch.zeros(2, 3), torch.zeros(1, 3)])
    with pytest.raises(NotImplementedError, match="only ragged dim 1"):
        seq.unique_consecutive(dim=2)
    # a static dim before a ragged one, over every element: row-major order, as dense flattens
    comps = [torch.tensor([[1, 1, 2], [2, 3, 3]]), torch.tensor([[3], [4]]), torch.zeros(2, 0, dtype=torch.int64)]
    lead = mj.nested_tensor(comps, ragged_dims=(2,))
    values, inverse, counts = lead.unique_consecutive(return_inverse=True, return_counts=True)
    dense = torch.unique_consecutive(torch.cat([c.reshape(-1) for c in comps]), return_inverse=True, return_counts=True)
    assert torch.equal(values, dense[0]) and torch.equal(counts, dense[2])
    assert torch.equal(torch.cat([t.reshape(-1) for t in inverse.unbind()]), dense[1])


def test_bmm_compiles_fullgraph():
    x = torch.nested.nested_tensor([torch.randn(n, 4) for n in (2, 1, 3)], layout=multi_jagged).requires_grad_()
    o = torch.randn(3, 4, 5, requires_grad=True)
    f = torch.randn(3, 6, 4, requires_grad=True)
    fn = lambda x, o, f: ((x @ o).sin(), f @ x.transpose(1, 2))  # noqa: E731
    out, ref = _compiled(fn)(x, o, f), fn(x, o, f)
    for a, b in zip(out, ref):
        _components_equal(a, [r.detach() for r in b.unbind()])
    g = torch.autograd.grad(out[0].values().sum() + out[1].values().sum(), [x, o, f])
    g_ref = torch.autograd.grad(ref[0].values().sum() + ref[1].values().sum(), [x, o, f])
    _components_equal(g[0], list(g_ref[0].unbind()))
    torch.testing.assert_close(g[1], g_ref[1])
    torch.testing.assert_close(g[2], g_ref[2])


def test_empty_batch_every_op():
    """B = 0 (built with from_packed: a list cannot express it) for every op of the module."""
    def empty(static, rd, dtype=torch.float32):
        return mj.from_packed(torch.zeros((0, *static), dtype=dtype), torch.zeros(1, dtype=torch.int64),
                              torch.zeros(0, len(rd), dtype=torch.int64), ragged_dims=rd)

    i, x, w = empty((), (1,), torch.int64), empty((4,), (1,)), torch.randn(5, 3)
    assert F.embedding(i, w).shape[0] == 0 and F.embedding(i, w).shape[2] == 3
    assert F.embedding_bag(i, w).shape == (0, 3)
    assert torch.bmm(x, torch.randn(0, 4, 5)).unbind() == ()
    assert torch.bmm(torch.randn(0, 5, 4), x.transpose(1, 2)).shape[1] == 5
    assert torch.masked_select(x, x > 0).unbind() == ()
    none = torch.zeros(0, dtype=torch.int64)
    assert torch.index_put(x, [none, none], torch.tensor(1.0)).unbind() == ()
    assert torch.index_put(x, [none], torch.tensor(1.0)).unbind() == ()
