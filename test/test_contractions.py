"""``einsum`` contractions valid per sample (NOTE [ einsum by broadcasting ]): pair-producing
(``bhid,bhjd->bhij``), contracting a ragged dim (``bij,bjd->bid``), outer products over a static or
ragged MSA depth (``bsic,bsjd->bijcd``), ``...``, dense operands, transposed storage — against
the per-sample reference with gradients of every leaf, zero-length samples, B = 0, second order,
and one compiled graph over changing lengths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import few, seeds

F64 = torch.float64

# equation: (per-operand component shape from (n, m, s) and ragged dims, or a dense shape)
CASES = {
    "scores bhid,bhjd->bhij": ("bhid,bhjd->bhij", [(lambda n, m, s: (2, n, 3), (2,)), (lambda n, m, s: (2, n, 3), (2,))]),
    "contract ragged bij,bjd->bid": ("bij,bjd->bid", [(lambda n, m, s: (n, n), (1, 2)), (lambda n, m, s: (n, 4), (1,))]),
    "attention out bhij,bjhd->bihd": ("bhij,bjhd->bihd", [(lambda n, m, s: (2, n, n), (2, 3)), (lambda n, m, s: (n, 2, 3), (1,))]),
    "outer mean bsic,bsjd->bijcd": ("bsic,bsjd->bijcd", [(lambda n, m, s: (s, n, 2), (2,)), (lambda n, m, s: (s, n, 3), (2,))]),
    "outer, ragged depth bsic,bsjd->bijcd": ("bsic,bsjd->bijcd", [(lambda n, m, s: (m, n, 2), (1, 2)), (lambda n, m, s: (m, n, 3), (1, 2))]),
    "rectangular bic,bjc->bij": ("bic,bjc->bij", [(lambda n, m, s: (n, 2), (1,)), (lambda n, m, s: (m, 2), (1,))]),
    "transposed storage bci,bjc->bij": ("bci,bjc->bij", [(lambda n, m, s: (2, n), (2,)), (lambda n, m, s: (n, 2), (1,))]),
    "ellipsis b...c,b...c->b...": ("b...c,b...c->b...", [(lambda n, m, s: (n, 3), (1,)), (lambda n, m, s: (n, 3), (1,))]),
    # an ellipsis moved in the output (its letters must not meet the packed-row letter)
    "ellipsis moved bn...->b...n": ("bn...->b...n", [(lambda n, m, s: (n, 2, 3), (1,))]),
    "with dense bsic,ce->bise": ("bsic,ce->bise", [(lambda n, m, s: (s, n, 2), (2,)), (2, 5)]),
    "triangle bikc,bjkc->bijc": ("bikc,bjkc->bijc", [(lambda n, m, s: (n, n, 2), (1, 2)), (lambda n, m, s: (n, n, 2), (1, 2))]),
    "sum out bi,bi->b": ("bi,bi->b", [(lambda n, m, s: (n,), (1,)), (lambda n, m, s: (n,), (1,))]),
    "two contracted bic,bjc->bi": ("bic,bjc->bi", [(lambda n, m, s: (n, 2), (1,)), (lambda n, m, s: (m, 2), (1,))]),
}


def _per_sample_eq(eq: str, specs) -> str:
    lhs, out = eq.split("->")
    terms = [t[1:] if not isinstance(spec, tuple) or callable(spec[0]) else t for t, spec in zip(lhs.split(","), specs)]
    return ",".join(terms) + "->" + (out[1:] if not out.startswith("b...") else out[1:])


@pytest.mark.parametrize("case", CASES)
@given(ns=st.lists(st.integers(0, 4), min_size=0, max_size=4), ms=st.lists(st.integers(1, 3), min_size=4, max_size=4),
       s=st.integers(1, 3), seed=seeds)
@few(8)
def test_einsum_per_sample(case, ns, ms, s, seed):
    eq, specs = CASES[case]
    g = torch.Generator().manual_seed(seed)
    b = len(ns)
    ops, leaves, per = [], [], []
    for spec in specs:
        if callable(spec[0]):
            shape, ragged = spec
            comps = [torch.randn(shape(n, m, s), generator=g, dtype=F64, requires_grad=True) for n, m in zip(ns, ms)]
            if b == 0:
                template = shape(0, 0, s)
                static = [e for d, e in enumerate(template) if d + 1 not in ragged]
                ops.append(mj.from_packed(torch.zeros(0, *static, dtype=F64), torch.zeros(1, dtype=torch.int64),
                                          torch.zeros(0, len(ragged), dtype=torch.int64), ragged_dims=ragged))
            else:
                ops.append(mj.as_nested_tensor(comps, ragged_dims=ragged))
            leaves += comps
            per.append(comps)
        else:
            t = torch.randn(spec, generator=g, dtype=F64, requires_grad=True)
            ops.append(t)
            leaves.append(t)
            per.append(None)
    out = torch.einsum(eq, *ops)
    if b == 0:
        assert out.shape[0] == 0
        return
    sample_eq = _per_sample_eq(eq, specs)
    refs = [torch.einsum(sample_eq, *[p[i] if p is not None else o for p, o in zip(per, ops)]) for i in range(b)]
    got = list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out)
    for i, (a, r) in enumerate(zip(got, refs)):
        assert a.shape == r.shape, f"sample {i}: {a.shape} != {r.shape}"
        torch.testing.assert_close(a, r, msg=lambda m: f"sample {i}: {m}")
    cot = [torch.randn(r.shape, generator=g, dtype=F64) for r in refs]
    g1 = torch.autograd.grad(sum((a * c).sum() for a, c in zip(got, cot)), leaves, allow_unused=True)
    g2 = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), leaves, allow_unused=True)
    for a, r, leaf in zip(g1, g2, leaves):
        torch.testing.assert_close(torch.zeros_like(leaf) if a is None else a, torch.zeros_like(leaf) if r is None else r)


@pytest.mark.parametrize("case", ["scores bhid,bhjd->bhij", "contract ragged bij,bjd->bid"])
def test_einsum_second_order(case):
    eq, specs = CASES[case]
    ns = (3, 0, 2)
    comps = [[torch.randn(spec[0](n, 1, 2), dtype=F64, requires_grad=True) for n in ns] for spec in specs]

    def f(*flat):
        it = iter(flat)
        ops = [mj.as_nested_tensor([next(it) for _ in ns], ragged_dims=spec[1]) for spec in specs]
        return torch.einsum(eq, *ops).values()

    assert torch.autograd.gradgradcheck(f, tuple(c for cs in comps for c in cs))


def test_einsum_no_leakage():
    ns = (3, 2, 4)
    q = [torch.randn(2, n, 3, dtype=F64) for n in ns]
    other = list(q)
    other[1] = q[1] + 1
    a = torch.einsum("bhid,bhjd->bhij", *(mj.nested_tensor(q, ragged_dims=(2,)),) * 2).unbind()
    b = torch.einsum("bhid,bhjd->bhij", *(mj.nested_tensor(other, ragged_dims=(2,)),) * 2).unbind()
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and not torch.equal(a[1], b[1])


def test_einsum_errors():
    x = mj.nested_tensor([torch.randn(n, 2) for n in (2, 3)])
    with pytest.raises(NotImplementedError, match="batch subscript"):
        torch.einsum("bic,bjc", x, x)  # implicit output 'ij' sums over the batch
    y = mj.nested_tensor([torch.randn(n, 2) for n in (3, 3)])
    with pytest.raises(ValueError):
        torch.einsum("bic,bic->bi", x, y)  # per-sample sizes differ along i (2 and 3: no broadcast)


@pytest.mark.parametrize("equation", ["bic,bjc->bik", "bic->bk", "bic,cd->bkd", "bic->bik"])
def test_einsum_output_letter_of_no_input_raises(equation):
    """A typo in the output (``->bik`` for ``->bij``) raises dense's error, never a new dim of 1."""
    x = mj.nested_tensor([torch.randn(n, 4) for n in (2, 3)])
    ops = (x, torch.randn(4, 2)) if "cd" in equation else (x, x) if "," in equation else (x,)
    with pytest.raises(ValueError, match="output subscript k does not appear"):
        torch.einsum(equation, *ops)
    with pytest.raises(ValueError, match="must be in \\[a-zA-Z\\]"):
        torch.einsum("b1c->bc", x)


_INT_EQUATIONS = ["bic->bc", "bic->b", "bic,bjc->bc", "bic,bjc->bij", "bic,bic->bi", "bic,bjc->bijc", "bic,bic->b",
                  "bic,c->bc", "bic,c->bi", "bii->b", "bii->bi", "bij,bjc->bic"]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("equation", _INT_EQUATIONS)
def test_einsum_integer_and_bool_dtypes_per_sample(equation, dtype):
    """Dense einsum sums the subscripts only one operand has with ``sum`` (integers accumulate into
    int64, a bool sum counts) before its products, whose ``bmm`` keeps the dtype (and has no bool
    kernel): values and dtypes per sample, no wrap-around."""
    g = torch.Generator().manual_seed(0)
    ns = (3, 2, 0)
    hi = 2 if dtype == torch.bool else 120
    terms = equation.split("->")[0].split(",")

    def operand(t):
        if t == "c":
            return torch.randint(0, hi, (4,), generator=g).to(dtype), None
        shape = {"bic": lambda n: (n, 4), "bjc": lambda n: (n, 4), "bii": lambda n: (n, n), "bij": lambda n: (n, n)}[t]
        comps = [torch.randint(0, hi, shape(n), generator=g).to(dtype) for n in ns]
        return mj.nested_tensor(comps, ragged_dims=(1, 2) if t in ("bii", "bij") else (1,)), comps

    ops = [operand(t) for t in terms]
    per = [[o if c is None else c[i] for o, c in ops] for i in range(len(ns))]
    sub = equation.replace("b", "")
    try:
        refs = [torch.einsum(sub, *p) for p in per]
    except RuntimeError as e:  # bool products dense has no kernel for
        with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
            torch.einsum(equation, *[o for o, _ in ops])
        assert "Bool" in str(e)
        return
    out = torch.einsum(equation, *[o for o, _ in ops])
    got = out.unbind() if mj.is_nested(out) else list(out)
    for a, b in zip(got, refs):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("equation,n", [("bic->bc", 1), ("bic,bjc->bijc", 2), ("bic,bjc->bij", 2), ("bic,bic->bi", 2),
                                        ("bic,bic->bic", 2), ("bic,bic,bic->bi", 3), ("bic,bjc,bjc->bic", 3)])
def test_einsum_under_autocast_lowers_where_dense_runs_a_bmm(equation, n):
    """Autocast lowers dense einsum's ``bmm`` only: a sum, an outer or elementwise product stays
    float32. Per sample, values and dtype."""
    xs = [torch.randn(k, 4) for k in (3, 2, 0)]
    x = mj.nested_tensor(xs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.einsum(equation, *([x] * n))
        refs = [torch.einsum(equation.replace("b", ""), *([c] * n)) for c in xs]
        vd = torch.linalg.vecdot(x, x)
        vrefs = [torch.linalg.vecdot(c, c) for c in xs]
    for a, b in zip(out.unbind(), refs):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    for a, b in zip(vd.unbind(), vrefs):
        assert a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(a, b)


def test_compiled_attention_scores_are_one_graph():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cc = CompileCounterWithBackend("aot_eager")

    def f(q, k, v):
        return torch.einsum("bhij,bhjd->bhid", torch.einsum("bhid,bhjd->bhij", q, k).softmax(-1), v)

    cf = torch.compile(f, backend=cc, fullgraph=True)
    for ns in ((3, 2, 4), (5, 1, 2), (2, 2, 2)):
        x = mj.nested_tensor([torch.randn(2, n, 4, dtype=F64) for n in ns], ragged_dims=(2,))
        torch.testing.assert_close(cf(x, x, x).values(), f(x, x, x).values())
    assert cc.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("form", ["dense ([2], [0])", "dense 1", "mjt ([2], [2])", "dense-first ([1], [2])"])
def test_tensordot_per_sample(form):
    """``tensordot`` as the per-sample ``tensordot`` of each sample (stacked), gradients included."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=F64, requires_grad=True) for n in (3, 0, 2)]
    w = torch.randn(4, 5, generator=g, dtype=F64, requires_grad=True)
    x = mj.as_nested_tensor(comps)
    fn, ref = {
        "dense ([2], [0])": (lambda: torch.tensordot(x, w, dims=([2], [0])), lambda c: torch.tensordot(c, w, dims=([1], [0]))),
        "dense 1": (lambda: torch.tensordot(x, w, dims=1), lambda c: torch.tensordot(c, w, dims=1)),
        "mjt ([2], [2])": (lambda: torch.tensordot(x, x, dims=([2], [2])), lambda c: torch.tensordot(c, c, dims=([1], [1]))),
        "dense-first ([1], [2])": (lambda: torch.tensordot(w.t(), x, dims=([1], [2])), lambda c: torch.tensordot(w.t(), c, dims=([1], [1]))),
    }[form]
    out = fn()
    refs = [ref(c) for c in comps]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    leaves = comps + ([] if form.startswith("mjt") else [w])
    got = torch.autograd.grad(sum((a ** 2).sum() for a in out.unbind()), leaves)
    want = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("equation", ["bnd,bnd->bd", "bnd,bnd->bn", "bnd,bne->bde", "bnd,bnd->bnd"])
def test_einsum_dense_size_one_dims_broadcast_along_ragged_subscripts(equation):
    """A dense ``(B, 1, D)`` operand under a subscript that is ragged in the batch broadcasts, as
    dense einsum broadcasts size-1 dims: each sample's einsum with the dense row, gradients of
    every input."""
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (3, 0, 5)]
    w = torch.randn(3, 1, 2 if "bne" in equation else 4, generator=g, dtype=torch.float64, requires_grad=True)
    out = torch.einsum(equation, mj.as_nested_tensor(leaves), w)
    got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
    refs = [torch.einsum(equation, c[None], w[i:i + 1])[0] for i, c in enumerate(leaves)]
    for a, r in zip(got, refs):
        torch.testing.assert_close(a, r)
    for a, r in zip(torch.autograd.grad(sum((a * a).sum() for a in got), [*leaves, w]),
                    torch.autograd.grad(sum((r * r).sum() for r in refs), [*leaves, w])):
        torch.testing.assert_close(a, r)
    with pytest.raises(NotImplementedError, match="dense operands cannot index the ragged dims"):
        torch.einsum(equation, mj.as_nested_tensor(leaves), torch.randn(3, 2, w.shape[-1], dtype=torch.float64))


_CHAINS = {
    "pair pair tokens": ("ppx", lambda P, X, V, W: [P, P, X]),
    "vector pair tokens": ("vpx", lambda P, X, V, W: [V, P, X]),
    "pair pair vector": ("ppv", lambda P, X, V, W: [P, P, V]),
    "tokens weight": ("xW", lambda P, X, V, W: [X, W]),
    "vector tokens weight": ("vxW", lambda P, X, V, W: [V, X, W]),
    "vector pair vector": ("vpv", lambda P, X, V, W: [V, P, V]),
    "weight tokens": ("Wx", lambda P, X, V, W: [W.T, X.mT]),
}


@pytest.mark.parametrize("name", list(_CHAINS))
def test_multi_dot_and_chain_matmul_per_sample(name):
    """``linalg.multi_dot`` of per-sample matrices (a pair, a token batch, a ragged vector first or
    last, a dense weight shared by every sample): each sample's chain, values and gradients."""
    g = torch.Generator().manual_seed(0)
    ns = (3, 2, 0)
    P = [torch.randn(n, n, dtype=F64, generator=g, requires_grad=True) for n in ns]
    X = [torch.randn(n, 4, dtype=F64, generator=g, requires_grad=True) for n in ns]
    V = [torch.randn(n, dtype=F64, generator=g, requires_grad=True) for n in ns]
    W = torch.randn(4, 5, dtype=F64, generator=g, requires_grad=True)
    p, x, v = mj.as_nested_tensor(P, ragged_dims=(1, 2)), mj.as_nested_tensor(X), mj.as_nested_tensor(V)
    _, chain = _CHAINS[name]
    out = torch.linalg.multi_dot(chain(p, x, v, W))
    refs = [torch.linalg.multi_dot(chain(P[i], X[i], V[i], W)) for i in range(len(ns))]
    got = out.unbind() if mj.is_nested(out) else list(out)
    for a, b in zip(got, refs):
        torch.testing.assert_close(a, b)
    leaves = [*P, *X, *V, W]
    ws = [torch.randn(b.shape, dtype=F64, generator=g) for b in refs]
    ga = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, ws)), leaves, allow_unused=True)
    gb = torch.autograd.grad(sum((b * w).sum() for b, w in zip(refs, ws)), leaves, allow_unused=True)
    for a, b in zip(ga, gb):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    if all(mj.is_nested(t) and t.dim() == 3 for t in chain(p, x, v, W)):
        torch.testing.assert_close(torch.chain_matmul(*chain(p, x, v, W)).values(), out.values())


def test_multi_dot_errors_as_dense():
    p = mj.nested_tensor([torch.randn(3, 3), torch.randn(2, 2)], ragged_dims=(1, 2))
    v = mj.nested_tensor([torch.randn(3), torch.randn(2)])
    with pytest.raises(RuntimeError, match="expected at least 2 tensors but got 1"):
        torch.linalg.multi_dot([p])
    with pytest.raises(RuntimeError, match="tensor 1 must be 2D but got 1D"):
        torch.linalg.multi_dot([p, v, p])
    with pytest.raises(RuntimeError, match="the first tensor must be 1D or 2D but got 3D"):
        torch.linalg.multi_dot([p.unsqueeze(-1), p])
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.multi_dot([p, p.double()])
    with pytest.raises(RuntimeError, match="Tensor dimension is 1, expected 2"):
        torch.chain_matmul(p, v)


def test_mixed_dtypes_raise_where_dense_contracts_them():
    """A subscript the output drops, shared by operands of other dtypes, is dense's ``bmm`` of
    mixed dtypes (an error), for three operands as for two; a product alone promotes."""
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)])
    d = x.double()
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.einsum("bic,bic,bjc->bij", x, x, d)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.einsum("bic,bjc->bij", x, d)
    out = torch.einsum("bic,bic,bj->bij", x, x, d[..., 0])  # c contracted between the float32 two only
    assert out.dtype == torch.float64
    refs = [torch.einsum("ic,ic,j->ij", a, a, b[..., 0]) for a, b in zip(x.unbind(), d.unbind())]
    for a, b in zip(out.unbind(), refs):
        torch.testing.assert_close(a, b)


def test_bilinear_pairs_positions_one_to_one_in_one_dtype():
    """Dense ``bilinear`` refuses operands of other dtypes, and positions that do not pair one to
    one (no broadcasting of a length-1 sample); integer operands keep their dtype."""
    W = torch.randn(5, 4, 4)
    a = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    b = mj.nested_tensor([torch.randn(1, 4), torch.randn(2, 4)])
    with pytest.raises(RuntimeError, match="input batch dimensions do not match"):
        F.bilinear(a, b, W)
    with pytest.raises(RuntimeError, match="All tensors must have the same dtype, got input1: float, input2: double"):
        F.bilinear(a, a.double(), W)
    with pytest.raises(RuntimeError, match="bias: double"):
        F.bilinear(a, a, W, torch.zeros(5, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    xi = [torch.randint(0, 3, (n, 4), dtype=torch.int32, generator=g) for n in (3, 0, 2)]
    Wi = torch.randint(0, 3, (2, 4, 4), dtype=torch.int32, generator=g)
    out = F.bilinear(mj.nested_tensor(xi), mj.nested_tensor(xi), Wi)
    for o, c in zip(out.unbind(), xi):
        r = F.bilinear(c, c, Wi)
        assert o.dtype == r.dtype == torch.int32 and torch.equal(o, r)


def test_baddbmm_expands_the_input_never_the_product():
    """``input`` broadcasts to each sample's product (a column of ones is fine), but a product
    with a length 1 where ``input`` has more raises, as that sample's dense call."""
    a = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    b = mj.nested_tensor([torch.randn(1, 4), torch.randn(2, 4)])
    M = mj.nested_tensor([torch.randn(3, 3), torch.randn(2, 2)], ragged_dims=(1, 2))
    with pytest.raises(RuntimeError, match="expanded size of the input must match"):
        torch.baddbmm(M, a, b.mT)
    a = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4), torch.randn(0, 4)])
    M = mj.nested_tensor([torch.randn(3, 3), torch.randn(2, 2), torch.randn(0, 0)], ragged_dims=(1, 2))
    col = mj.nested_tensor([torch.randn(3, 1), torch.randn(2, 1), torch.randn(0, 1)])
    for inp in (col, M):
        out = torch.baddbmm(inp, a, a.mT, beta=0.5)
        for o, i, s in zip(out.unbind(), inp.unbind(), a.unbind()):
            torch.testing.assert_close(o, torch.baddbmm(i[None], s[None], s.mT[None], beta=0.5)[0])
