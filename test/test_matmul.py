"""``matmul`` between multi_jagged tensors (ops/contractions/matmul.py ``_matmul``), eagerly, against the
per-sample dense reference with gradients: attention scores ``q @ k.transpose(1, 2)`` (square
when q and k share an extent, rectangular across two extents), ``attn @ v`` contracting a
ragged dim, and with a dense weight. The compile tests compare compiled output with eager
output only; these tie eager to dense torch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import R, assert_close, complex_grad_check, few, per_sample_check, seeds
from _structures import comps_for, length_pairs, lengths

FEW = few(8)


def _scores(q, k):
    return q @ k.transpose(1, 2)


def _scores_ref(q, k):
    return q @ k.transpose(0, 1)


@pytest.mark.parametrize("share", ["one_tensor", "separate_equal_lengths"])
def test_attention_scores_square(share):
    """``q @ k.transpose(1, 2)``: ``(B, j0, C) @ (B, C, j0)`` → ``(B, j0, j0)``."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        qs = comps_for([(n, c) for n in ns], seed)
        if share == "one_tensor":
            out = per_sample_check(lambda q: _scores(q, q * 0.5), R(qs, (1,)), ref=lambda q: _scores_ref(q, q * 0.5), seed=seed)
        else:
            ks = comps_for([(n, c) for n in ns], seed + 1)
            out = per_sample_check(_scores, R(qs, (1,)), R(ks, (1,)), ref=_scores_ref, seed=seed)
        assert out.ragged_dims == (1, 2)

    check()


def test_attention_scores_rect():
    """Queries and keys of different lengths: ``(B, j0, C) @ (B, C, j1)`` → ``(B, j0, j1)``."""

    @FEW
    @given(length_pairs(max_batch=3), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        out = per_sample_check(_scores, R(comps_for([(n, c) for n in ns], seed), (1,)),
                               R(comps_for([(m, c) for m in ms], seed + 1), (1,)), ref=_scores_ref, seed=seed)
        assert out.sizes().tolist() == [[n, m] for n, m in zip(ns, ms)]

    check()


def test_attn_at_v_contracts_ragged_dim():
    """``softmax(q kᵀ) @ v``: ``(B, j0, j1) @ (B, j1, C)`` → ``(B, j0, C)``, k and v sharing
    lengths (v built separately)."""

    @FEW
    @given(length_pairs(max_batch=3), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm

        def f(q, k, v):
            return torch.softmax(_scores(q, k), -1) @ v

        def ref(q, k, v):
            return torch.softmax(_scores_ref(q, k), -1) @ v

        out = per_sample_check(f, R(comps_for([(n, c) for n in ns], seed), (1,)), R(comps_for([(m, c) for m in ms], seed + 1), (1,)),
                               R(comps_for([(m, 2) for m in ms], seed + 2), (1,)), ref=ref, seed=seed)
        assert out.ragged_dims == (1,)

    check()


def test_pair_at_single():
    """A square pair times singles: ``(B, j0, j0) @ (B, j0, C)`` (the pair built from the singles)."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        per_sample_check(lambda x: (x[..., :1] * x[..., :1].transpose(1, 2)) @ x, R(comps_for([(n, c) for n in ns], seed), (1,)),
                         ref=lambda x: (x[:, :1] * x[:, :1].transpose(0, 1)) @ x, seed=seed)

    check()


def test_matmul_with_dense_weight():
    """``(B, j0, C) @ (C, D)``: a weight shared by every sample."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        w = comps_for([(c, 2)], seed + 1)[0]
        per_sample_check(lambda x, w: x @ w, R(comps_for([(n, c) for n in ns], seed), (1,)), w, ref=lambda x, w: x @ w, seed=seed)

    check()


def test_matmul_golden():
    q = mj.nested_tensor([torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.zeros(0, 2)], ragged_dims=(1,))
    k = mj.nested_tensor([torch.tensor([[3.0, 1.0], [1.0, 1.0], [0.0, 1.0]]), torch.tensor([[1.0, 1.0]])], ragged_dims=(1,))
    s = q @ k.transpose(1, 2)
    assert s.shape == (2, q.shape[1], k.shape[1])
    torch.testing.assert_close(s.unbind()[0], torch.tensor([[3.0, 1.0, 0.0], [2.0, 2.0, 2.0]]))  # = [[q0·k0, q0·k1, q0·k2], [q1·k0, …]]
    assert s.unbind()[1].shape == (0, 1)
    v = mj.nested_tensor([torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[5.0]])], ragged_dims=(1,))
    o = s @ v
    torch.testing.assert_close(o.unbind()[0], torch.tensor([[5.0], [12.0]]))  # = [3·1 + 1·2 + 0·3, 2·(1 + 2 + 3)]
    assert o.unbind()[1].shape == (0, 1)


# ----------------------------------------------------------------------------- mm, mv, outer, dot, inner, add*
def _square(ns, seed):
    return [m + 3 * torch.eye(m.shape[0], dtype=m.dtype) for m in comps_for([(n, n) for n in ns], seed)]


# name → (fn(x, v, s, w, m) on: x (B, j0, C), v (B, j0), s (B, j0, j0), w dense (C, D), m (B, j0, D); ref(same, per sample))
PRODUCTS = {
    "mm_dense": lambda x, v, s, w, m: torch.mm(x, w),
    "mm_contract_ragged": lambda x, v, s, w, m: x.transpose(-1, -2).mm(m),
    "mm_ragged_square": lambda x, v, s, w, m: torch.mm(s, x),
    "mv_dense": lambda x, v, s, w, m: torch.mv(x, w[:, 0]),
    "mv_ragged": lambda x, v, s, w, m: s.mv(v),
    "outer_dense": lambda x, v, s, w, m: torch.outer(v, w[0]),
    "outer_ragged": lambda x, v, s, w, m: torch.ger(v, v * 2),
    "dot": lambda x, v, s, w, m: torch.dot(v, v.sin()),
    "vdot": lambda x, v, s, w, m: v.vdot(v.cos()),
    "inner_dense_vector": lambda x, v, s, w, m: torch.inner(x, w[:, 0]),
    "inner_dense_matrix": lambda x, v, s, w, m: torch.inner(x, w.t()),
    "inner_ragged": lambda x, v, s, w, m: torch.inner(x, x.cos()),
    "addmm": lambda x, v, s, w, m: torch.addmm(w[0], x, w, beta=0.5, alpha=2.0),
    "addmm_ragged_input": lambda x, v, s, w, m: torch.addmm(m, x, w),
    "addmm_beta0": lambda x, v, s, w, m: torch.addmm(torch.where(m > 1e9, m, float("nan")), x, w, beta=0),  # nan ignored
    "addr": lambda x, v, s, w, m: torch.addr(m, v, w[0], alpha=0.5),
    "baddbmm": lambda x, v, s, w, m: torch.baddbmm(s, x, x.transpose(1, 2), beta=2.0),
    "matmul_matrix_vector": lambda x, v, s, w, m: s @ v,
    "matmul_vector_matrix": lambda x, v, s, w, m: torch.matmul(v, s),
    "matmul_vector_vector": lambda x, v, s, w, m: v @ v.sin(),
    "matmul_vector_rows": lambda x, v, s, w, m: v @ x,
    "matmul_rows_vector": lambda x, v, s, w, m: x.mT @ v,
    "addmv": lambda x, v, s, w, m: torch.addmv(w[:, 0], x.mT, v, beta=0.5, alpha=2.0),
}
# per sample a scalar, or a static vector: a dense (B,) or (B, C)
_DENSE_RESULTS = ("dot", "vdot", "mm_contract_ragged", "matmul_vector_vector", "matmul_vector_rows",
                  "matmul_rows_vector", "addmv")


def test_dense_matrix_times_a_ragged_dim_every_sample_has_its_size():
    """``w @ x`` with a dense ``(m, k)`` and ``x (B, j0, n)`` whose samples all have ``k`` rows (a
    batch of equal lengths, inferred ragged): each sample's dense product, a dense ``(B, m, n)``,
    gradients included; other lengths raise naming the sizes."""
    cs = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    w = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = w @ mj.as_nested_tensor(cs)
    assert type(y) is torch.Tensor
    assert_close(y, torch.stack([w @ c for c in cs]))
    got = torch.autograd.grad((y * y).sum(), [w, *cs])
    want = torch.autograd.grad(sum(((w @ c) ** 2).sum() for c in cs), [w, *cs])
    for a, b in zip(got, want):
        assert_close(a, b)
    with pytest.raises(RuntimeError, match=r"sizes \[3, 2\]"):
        torch.ones(2, 3) @ mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16])
def test_scaled_products_keep_the_dtype_and_scalars_of_dense(dtype):
    """``addr`` / ``addmm`` / ``addmv`` / ``baddbmm`` with integer, bool and bfloat16 operands: each
    sample's result is dense's, dtype included — integer products truncate a float ``alpha`` /
    ``beta`` as dense casts it (``addr`` refuses one, as dense), bool reads them as bools, bfloat16
    within an ulp."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        t = torch.randn(*shape, generator=g) * 3
        return t > 0 if dtype == torch.bool else t.to(dtype)

    u, w = rnd(2), rnd(2, 2)
    # (an empty sample with integer samples and float scalars: dense addmm's empty product takes
    # another path, which refuses the float where the others truncate it)
    for ns, kw in [((3, 0, 2), dict(beta=3, alpha=2)), ((3, 2), dict(beta=0.5, alpha=2.5)),
                   ((3, 0, 2), dict(beta=0, alpha=1))]:
        mats = [rnd(2, n) for n in ns]
        vecs = [rnd(n) for n in ns]
        M, V = mj.nested_tensor(mats), mj.nested_tensor(vecs)
        cases = [("addr", lambda: torch.addr(M, u, V, **kw), lambda i: torch.addr(mats[i], u, vecs[i], **kw))]
        if dtype != torch.bool:  # dense addmm / addmv / baddbmm have no bool kernel
            cases += [("addmv", lambda: torch.addmv(u, M, V, **kw), lambda i: torch.addmv(u, mats[i], vecs[i], **kw)),
                      ("addmm", lambda: torch.addmm(w, M, M.mT, **kw),
                       lambda i: torch.addmm(w, mats[i], mats[i].mT, **kw))]
        for name, ours, dense in cases:  # noqa: B023  (each case runs in its iteration)
            try:
                want = [dense(i) for i in range(len(ns))]
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match="must not be a floating point"):
                    ours()
                assert "must not be a floating point" in str(e)
                continue
            out = ours()
            got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else list(out)
            for a, b in zip(got, want):
                # (bfloat16: dense's kernels round in their own places — addr scales a vector before
                # the outer product, addmm accumulates in one pass —, ours rounds the product and
                # then the sum once: within an ulp)
                exact = dtype != torch.bfloat16
                assert a.dtype == b.dtype
                torch.testing.assert_close(a, b, rtol=0 if exact else 1.6e-2, atol=0 if exact else 1e-2)


@pytest.mark.parametrize("name", PRODUCTS)
def test_matrix_products_per_sample(name):
    """``mm``, ``mv``, ``outer``/``ger``, ``dot``/``vdot``, ``inner``, ``addmm``, ``addr`` and
    ``baddbmm`` are the dense op on each sample (a ``(B, j0, C)`` tensor's samples are
    ``(n, C)`` matrices), gradients of every operand included."""
    f = PRODUCTS[name]

    def ref(x, v, s, w, m):
        if name == "baddbmm":  # per sample a matrix product (dense baddbmm wants a batch)
            return 2.0 * s + x @ x.t()
        return f(x, v, s, w, m)

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        comps = [comps_for([(n, c) for n in ns], seed), comps_for([(n,) for n in ns], seed + 1), _square(ns, seed + 2),
                 comps_for([(n, 2) for n in ns], seed + 4)]
        w = comps_for([(c, 2)], seed + 3)[0]
        leaves = [[t.clone().requires_grad_() for t in cs] for cs in comps]
        x, v, sq, m = (mj.as_nested_tensor(ls, ragged_dims=(1, 2) if k == 2 else (1,)) for k, ls in enumerate(leaves))
        # the operands of one model share x's nested int (a zero of x's structure added to each)
        z = torch.zeros_like(x[..., :1])
        wl = w.clone().requires_grad_()
        out = f(x, (z + v.unsqueeze(-1)).squeeze(-1), z + sq, wl, z + m)
        refs = [[t.clone().requires_grad_() for t in cs] for cs in comps]
        wr = w.clone().requires_grad_()
        expected = [ref(*(r[i] for r in refs[:3]), wr, refs[3][i]) for i in range(len(ns))]
        got = list(out.unbind(0)) if name in _DENSE_RESULTS else list(out.unbind())
        if name in _DENSE_RESULTS:
            assert not isinstance(out, mj.MultiJaggedTensor)
        assert len(got) == len(expected)
        cot = [torch.randn(e.shape, dtype=e.dtype, generator=torch.Generator().manual_seed(seed + i)) for i, e in enumerate(expected)]
        for i, (a, e) in enumerate(zip(got, expected)):
            assert_close(a, e, f"sample {i}")
        flat_leaves = [t for ls in leaves for t in ls] + [wl]
        flat_refs = [t for rs in refs for t in rs] + [wr]
        g = torch.autograd.grad(sum((a * k).sum() for a, k in zip(got, cot)), flat_leaves, allow_unused=True)
        g_ref = torch.autograd.grad(sum((e * k).sum() for e, k in zip(expected, cot)), flat_refs, allow_unused=True)
        for k, (a, b, leaf) in enumerate(zip(g, g_ref, flat_refs)):
            zero = torch.zeros_like(leaf)
            assert_close(zero if a is None else a, zero if b is None else b, f"grad of leaf {k}")

    check()


def test_matmul_with_a_vector_broadcasts_and_keeps_the_dtype():
    """A multi_jagged vector ``(B, j0)`` against samples of three dims broadcasts their leading dim
    as dense matmul does, ``(H, n, n) @ (n,) → (H, n)``; integer products stay in their dtype."""
    ns = (3, 0, 2)
    hs = [torch.randn(2, n, n, dtype=torch.float64, requires_grad=True) for n in ns]
    vs = [torch.randn(n, dtype=torch.float64, requires_grad=True) for n in ns]
    h, v = mj.as_nested_tensor(hs, ragged_dims=(2, 3)), mj.as_nested_tensor(vs)
    for f in (lambda a, b: a @ b, lambda a, b: b @ a):
        got = f(h, v).unbind()
        expected = [f(a, b) for a, b in zip(hs, vs)]
        for a, e in zip(got, expected):
            assert_close(a, e)
        g = torch.autograd.grad(sum(a.sum() for a in got), hs + vs)
        g_ref = torch.autograd.grad(sum(e.sum() for e in expected), hs + vs)
        for a, e in zip(g, g_ref):
            assert_close(a, e)
    ints = [torch.arange(n, dtype=torch.int32) for n in ns]
    vi = mj.nested_tensor(ints)
    out = vi @ vi
    assert out.dtype == torch.int32 and torch.dot(vi, vi).dtype == torch.int32
    assert out.tolist() == [int(a @ a) for a in ints]
    with pytest.raises(RuntimeError, match="same dtype"):
        vi @ vi.double()
    with pytest.raises(RuntimeError, match="Bool"):
        vi.bool() @ vi.bool()
    with pytest.raises(RuntimeError, match=r"matmul\(\): the 1-D samples .* dense operand"):
        vi @ torch.ones(3, dtype=torch.int32)


def test_matrix_product_errors():
    x = mj.nested_tensor([torch.randn(2, 3), torch.randn(0, 3)])
    with pytest.raises(RuntimeError, match=r"mm\(\): expected operands of 2-D, 2-D per sample"):
        torch.mm(x.unsqueeze(-1), torch.randn(1, 2))
    with pytest.raises(RuntimeError, match=r"dot\(\): expected operands of 1-D, 1-D per sample"):
        torch.dot(x, x)
    with pytest.raises(RuntimeError, match=r"mv\(\)"):
        torch.mv(x, torch.randn(3, 1))


_DENSE_4D = {
    # name: (components' shapes from n, ragged dims, dense operand shape, multi_jagged on the left)
    "heads scores q @ kᵀ": (lambda n: (2, 4, n), (3,), (2, 3, 4), False),  # dense (B, H, L, D) @ (B, H, D, j)
    "heads rows @ w": (lambda n: (2, n, 4), (2,), (2, 4, 5), True),  # (B, H, j, D) @ (B, H, D, E)
    "pair rows @ shared w": (lambda n: (n, n, 4), (1, 2), (1, 4, 5), True),  # (B, j, j, C) @ (B, 1, C, E)
    "w @ pair columns": (lambda n: (n, 4, n), (1, 3), (1, 2, 4), False),  # (B, 1, F, C) @ (B, j, C, j)
}


@pytest.mark.parametrize("case", _DENSE_4D)
@pytest.mark.parametrize("batch_one", [False, True])
def test_matmul_with_a_dense_per_sample_operand_of_four_dims(case, batch_one):
    """``(B, H, L, D) @ (B, H, D, j)`` (attention scores with dense queries, Perceiver's latents)
    and its kin: per sample and head, dense size-1 dims broadcasting (a dense batch of 1 too);
    gradients to both operands."""
    shape_of, rd, dense_shape, left = _DENSE_4D[case]
    g = torch.Generator().manual_seed(0)
    ns = (3, 0, 2)
    comps = [torch.randn(*shape_of(n), dtype=torch.float64, generator=g, requires_grad=True) for n in ns]
    w = torch.randn(1 if batch_one else len(ns), *dense_shape, dtype=torch.float64, generator=g, requires_grad=True)
    x = mj.as_nested_tensor(comps, ragged_dims=rd)
    out = torch.matmul(x, w) if left else torch.matmul(w, x)
    refs = [(c @ w[0 if batch_one else i]) if left else (w[0 if batch_one else i] @ c) for i, c in enumerate(comps)]
    for a, r in zip(out.unbind(), refs):
        assert_close(a, r)
    got = torch.autograd.grad(sum((a ** 2).sum() for a in out.unbind()), [*comps, w])
    exp = torch.autograd.grad(sum((r ** 2).sum() for r in refs), [*comps, w])
    for a, b in zip(got, exp):
        assert_close(a, b)


def test_scaled_fp8_matmuls_per_sample():
    """``F.scaled_mm`` of fp8 rows ``(B, j0, K)`` and a dense ``(K, N)``, and ``F.scaled_grouped_mm``
    with one ``(K, N)`` per sample (the samples are the groups), tensor-wise scales: each sample's
    dense ``scaled_mm``, bit for bit, an empty sample included; other scales and ``offs`` raise."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    tw = F.ScalingType.TensorWise
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    comps = [torch.randn(n, 16, generator=g).to(torch.float8_e4m3fn) for n in (16, 0, 5)]
    x = mj.nested_tensor(comps)
    w = torch.randn(16, 8, generator=g).to(torch.float8_e4m3fn).t().contiguous().t()
    ws = torch.randn(3, 16, 8, generator=g).to(torch.float8_e4m3fn).transpose(-1, -2).contiguous().transpose(-1, -2)
    out = F.scaled_mm(x, w, sa, tw, sb, tw, output_dtype=torch.float32)
    grouped = F.scaled_grouped_mm(x, ws, sa, tw, sb, tw, output_dtype=torch.float32)
    legacy = torch._scaled_mm(x, w, sa, sb, out_dtype=torch.float32)  # the older API (torchao's)
    for i, c in enumerate(comps):
        assert torch.equal(out.unbind()[i], F.scaled_mm(c, w, sa, tw, sb, tw, output_dtype=torch.float32))
        assert torch.equal(grouped.unbind()[i], F.scaled_mm(c, ws[i], sa, tw, sb, tw, output_dtype=torch.float32))
        assert torch.equal(legacy.unbind()[i], torch._scaled_mm(c, w, sa, sb, out_dtype=torch.float32))
    rw = F.ScalingType.RowWise
    with pytest.raises(NotImplementedError, match="tensor-wise scales"):
        F.scaled_mm(x, w, torch.ones(21, 1), rw, torch.ones(1, 8), rw, output_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="offs must be None"):
        F.scaled_grouped_mm(x, ws, sa, tw, sb, tw, offs=torch.tensor([16, 16, 21], dtype=torch.int32),
                            output_dtype=torch.float32)
    with pytest.raises(RuntimeError, match="B = 3"):
        F.scaled_grouped_mm(x, ws[:2], sa, tw, sb, tw, output_dtype=torch.float32)


@pytest.mark.parametrize("pair", [False, True])
def test_matmul_with_a_dense_vector_is_per_sample(pair):
    """``x @ v`` and ``v @ x`` with a 1-D dense ``v``: dense matmul's vector rule per sample (the
    vector dim dropped), with gradients to ``x`` and ``v``; an empty sample gives an empty row."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 0, 5)]
    if pair:
        comps = [c[:, None, :] + c[None, :, :] for c in comps]
    x = mj.nested_tensor(comps, requires_grad=True)
    v = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    y, z = x @ v, v @ x.transpose(-1, -2)
    assert isinstance(y, mj.MultiJaggedTensor) and y.dim() == x.dim() - 1
    leaves = [c.clone().requires_grad_() for c in comps]
    vd = v.detach().clone().requires_grad_()
    ys, zs = [c @ vd for c in leaves], [vd @ c.transpose(-1, -2) for c in leaves]
    for a, b in zip(y.unbind() + z.unbind(), ys + zs):
        torch.testing.assert_close(a, b)
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in ys]
    gx, gv = torch.autograd.grad((y * mj.nested_tensor(w)).sum() + (z * mj.nested_tensor(w)).sum(), [x, v])
    refs = torch.autograd.grad(sum(((a + b) * c).sum() for a, b, c in zip(ys, zs, w)), leaves + [vd])
    for a, b in zip(gx.unbind(), refs[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gv, refs[-1])



def test_dense_matrix_times_a_batch_with_gradients():
    """``P @ x.mT`` with a dense ``(m, k)`` matrix ``P`` that requires grad (vit-pytorch's patch
    merger): per sample ``P @ xᵢᵀ``, gradients to ``P`` and ``x``; also over a pair's rows."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 0, 5)]
    x = mj.nested_tensor(comps, requires_grad=True)
    P = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    out = P @ x.transpose(-1, -2)
    pair = x.unsqueeze(1) * x.unsqueeze(2)
    out2 = torch.matmul(P, pair.transpose(-1, -2))
    leaves = [c.clone().requires_grad_() for c in comps]
    Pd = P.detach().clone().requires_grad_()
    refs = [Pd @ c.T for c in leaves]
    refs2 = [Pd @ (c[:, None] * c[None]).transpose(-1, -2) for c in leaves]
    for a, r in zip(out.unbind() + out2.unbind(), refs + refs2):
        torch.testing.assert_close(a, r)
    got = torch.autograd.grad((out * out).sum() + (out2 * out2).sum(), [x, P])
    want = torch.autograd.grad(sum((r * r).sum() for r in refs + refs2), leaves + [Pd])
    for a, w in zip(got[0].unbind(), want[:-1]):
        torch.testing.assert_close(a, w)
    torch.testing.assert_close(got[1], want[-1])


def _complex(comps, seed):
    """Complex copies of real components: the real part as given, a seeded imaginary part."""
    g = torch.Generator().manual_seed(seed)
    return [torch.complex(c, torch.randn(c.shape, generator=g, dtype=c.dtype)) for c in comps]


COMPLEX_DENSE = {
    "x @ W": (lambda x, w: x @ w, lambda x, w: x @ w),
    "matmul": (torch.matmul, torch.matmul),
    "W.mT @ x.mT": (lambda x, w: (w.mT @ x.mT).mT, lambda x, w: (w.mT @ x.mT).mT),
    "mm": (torch.mm, torch.mm),
    "linear + bias": (lambda x, w: torch.nn.functional.linear(x, w.mT, w[0]),
                      lambda x, w: torch.nn.functional.linear(x, w.mT, w[0])),
    "linear (the op)": (lambda x, w: torch.ops.multijagged.linear(x, w.mT, w[0]),
                        lambda x, w: torch.nn.functional.linear(x, w.mT, w[0])),
}


@pytest.mark.parametrize("name", COMPLEX_DENSE)
def test_complex_matmul_with_dense_weight_gradients(name):
    """``(B, j0, C) @ (C, D)`` of complex128 values (``multijagged::linear`` and its parameter
    gradients): the gradients of x and W are dense torch's — ``grad @ Wᴴ`` and ``xᴴ @ grad``, not
    their conjugates — to second order, a zero-length sample included."""
    fn, ref = COMPLEX_DENSE[name]

    @FEW
    @given(lengths(min_batch=1, max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        w = _complex(comps_for([(c, 2)], seed + 1), seed + 2)[0]
        xs = _complex(comps_for([(n, c) for n in (*ns, 0)], seed), seed)
        complex_grad_check(fn, R(xs, (1,)), w, ref=ref, seed=seed, second_order=True)

    check()


def test_complex_mv_and_vector_matmul_gradients():
    """``mv`` and ``x @ v`` / ``v @ x.mT`` with a dense complex vector: gradients as dense."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 3, generator=g, dtype=torch.complex128) for n in (2, 0, 4)]
    v = torch.randn(3, generator=g, dtype=torch.complex128)
    complex_grad_check(torch.mv, R(xs, (1,)), v, second_order=True)
    complex_grad_check(lambda x, v: x @ v, R(xs, (1,)), v, second_order=True)
    complex_grad_check(lambda x, v: v @ x.mT, R(xs, (1,)), v, ref=lambda x, v: v @ x.mT, second_order=True)


def test_matmul_over_a_zero_sized_inner_dim_backward():
    """``(B, j0, 0) @ (0, D)``: zeros, and zero gradients of the right shapes (dense torch's)."""
    comps = [torch.zeros(n, 0, dtype=torch.float64) for n in (2, 0, 1)]
    w = torch.zeros(0, 4, dtype=torch.float64)
    per_sample_check(lambda x, w: x @ w, R(comps, (1,)), w, ref=lambda x, w: x @ w)
