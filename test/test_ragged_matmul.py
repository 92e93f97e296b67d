"""Matmul between multi_jagged tensors as per-sample products of the packed values (NOTE [ Matmul
between multi_jagged tensors ] in ops/contractions/ragged_mm.py, NOTE [ Ragged matmul contract ]
in kernels/ragged_mm.py): ``q @ kᵀ`` creating a pair, ``attn @ v`` contracting it, their
``einsum`` and ``bmm`` spellings, rectangular pairs, static rows, a dense result — against the
dense op per sample, gradients of every operand to second order, every plan (one matmul per
sample, one zero-padded group, the cost rule's split), both eager paths, zero-length samples,
B = 0, float64 / float32 / bfloat16 / complex / integer values, and compiled."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged.kernels import ragged_mm as kmm

from _reference import assert_close, complex_grad_check, empty_batch, few, general_path, per_sample_check, R, seeds
from _structures import comps_for, length_pairs

F64 = torch.float64
PLANS = [None, "loop", "padded"]


def _t(x):
    return x.transpose(-1, -2)


# name: (fn on multi_jagged operands, per-sample reference, [(component shape from (n, m), ragged dims)], dense result)
CASES = {
    "x @ x.mT": (lambda x: x @ _t(x), lambda x: x @ x.T, [(lambda n, m: (n, 3), (1,))], False),
    "q @ k.mT, heads": (lambda q, k: q @ _t(k), lambda q, k: q @ _t(k), [(lambda n, m: (2, n, 3), (2,))] * 2, False),
    "q @ k.mT, rectangular": (lambda q, k: q @ _t(k), lambda q, k: q @ k.T,
                              [(lambda n, m: (n, 3), (1,)), (lambda n, m: (m, 3), (1,))], False),
    "attn @ v, heads": (lambda a, v: a @ v, lambda a, v: a @ v,
                        [(lambda n, m: (2, n, n), (2, 3)), (lambda n, m: (2, n, 3), (2,))], False),
    "attn @ v, rectangular": (lambda a, v: a @ v, lambda a, v: a @ v,
                              [(lambda n, m: (n, m), (1, 2)), (lambda n, m: (m, 3), (1,))], False),
    "rect pair @ rect pair": (lambda a, b: a @ b, lambda a, b: a @ b,
                              [(lambda n, m: (n, m), (1, 2)), (lambda n, m: (m, n), (1, 2))], False),
    "x.mT @ v, dense result": (lambda x, v: _t(x) @ v, lambda x, v: x.T @ v,
                               [(lambda n, m: (n, 3), (1,)), (lambda n, m: (n, 2), (1,))], True),
    "x.mT @ pair, static rows": (lambda x, p: _t(x) @ p, lambda x, p: x.T @ p,
                                 [(lambda n, m: (n, 3), (1,)), (lambda n, m: (n, n), (1, 2))], False),
    "x @ w per sample": (lambda x, w: x @ w, lambda x, w: x @ w,
                         [(lambda n, m: (n, 3), (1,)), (lambda n, m: (3, n), (2,))], False),
    "two lead dims": (lambda q, k: q @ _t(k), lambda q, k: q @ _t(k), [(lambda n, m: (2, 2, n, 3), (3,))] * 2, False),
    "einsum bic,bjc->bij": (lambda x, y: torch.einsum("bic,bjc->bij", x, y), lambda x, y: torch.einsum("ic,jc->ij", x, y),
                            [(lambda n, m: (n, 3), (1,))] * 2, False),
    "einsum bic,bjc->bji": (lambda x, y: torch.einsum("bic,bjc->bji", x, y), lambda x, y: torch.einsum("ic,jc->ji", x, y),
                            [(lambda n, m: (n, 3), (1,)), (lambda n, m: (m, 3), (1,))], False),
    "einsum bci,bcj->bij": (lambda x, y: torch.einsum("bci,bcj->bij", x, y), lambda x, y: torch.einsum("ci,cj->ij", x, y),
                            [(lambda n, m: (3, n), (2,)), (lambda n, m: (3, m), (2,))], False),
    "einsum bhid,bhjd->bhij": (lambda q, k: torch.einsum("bhid,bhjd->bhij", q, k),
                               lambda q, k: torch.einsum("hid,hjd->hij", q, k), [(lambda n, m: (2, n, 3), (2,))] * 2, False),
    "einsum bhij,bhjd->bhid": (lambda a, v: torch.einsum("bhij,bhjd->bhid", a, v),
                               lambda a, v: torch.einsum("hij,hjd->hid", a, v),
                               [(lambda n, m: (2, n, n), (2, 3)), (lambda n, m: (2, n, 3), (2,))], False),
    "bmm": (lambda x, y: torch.bmm(x, _t(y)), lambda x, y: x @ y.T, [(lambda n, m: (n, 3), (1,)), (lambda n, m: (m, 3), (1,))],
            False),
}
_RECT = {"q @ k.mT, rectangular", "attn @ v, rectangular", "rect pair @ rect pair", "einsum bic,bjc->bji",
         "einsum bci,bcj->bij", "bmm"}


def _lengths_of(case, ns, ms):
    """Equal-length operands share ``ns`` (a contracted ragged dim); rectangular cases draw ``ms``."""
    return ns, (ms if case in _RECT else ns)


def _operands(case, ns, ms, seed, dtype=F64):
    _, _, specs, _ = CASES[case]
    return [R(comps_for([shape(n, m) for n, m in zip(ns, ms)], seed + k, dtype=dtype), rd) for k, (shape, rd) in enumerate(specs)]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("case", CASES)
def test_product_per_sample(case, plan):
    """Values and the gradients of every operand equal the dense op per sample, under every plan;
    zero-length samples (either side of a rectangular pair) included."""
    fn, ref, _, dense = CASES[case]

    @few(6)
    @given(length_pairs(max_batch=4, max_len=5), seeds)
    def check(nm, seed):
        ns, ms = _lengths_of(case, *nm)
        with kmm.force_plan(plan):
            per_sample_check(fn, *_operands(case, ns, ms, seed), ref=ref, dense_out=dense, seed=seed, new_ragged=True)

    check()


@pytest.mark.parametrize("case", ["x @ x.mT", "q @ k.mT, heads", "attn @ v, heads", "x.mT @ v, dense result",
                                  "einsum bhij,bhjd->bhid"])
def test_general_path_agrees(case):
    """The general mechanism (routes: ``matmul``, ``einsum``) gives what the values path gives."""
    fn, ref, _, dense = CASES[case]
    with general_path():
        per_sample_check(fn, *_operands(case, (3, 0, 5, 1), (2, 4, 0, 3), 0), ref=ref, dense_out=dense, new_ragged=True)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("case", ["x @ x.mT", "attn @ v, heads", "q @ k.mT, rectangular", "x.mT @ pair, static rows",
                                  "x.mT @ v, dense result"])
def test_second_order(case, plan):
    """``gradgradcheck`` in float64: the product's backward is the same kind of product."""
    fn, _, specs, dense = CASES[case]
    ns, ms = _lengths_of(case, (3, 0, 2), (1, 2, 0))
    comps = [[c.requires_grad_() for c in comps_for([shape(n, m) for n, m in zip(ns, ms)], k)] for k, (shape, _) in enumerate(specs)]

    def f(*flat):
        it = iter(flat)
        ops = [mj.as_nested_tensor([next(it) for _ in ns], ragged_dims=rd) for _, rd in specs]
        out = fn(*ops)
        return out if dense else out.values()

    with kmm.force_plan(plan):
        assert torch.autograd.gradgradcheck(f, tuple(c for cs in comps for c in cs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("case", ["x @ x.mT", "q @ k.mT, heads", "attn @ v, heads", "x.mT @ v, dense result"])
def test_dtypes(case, plan, dtype):
    """The result dtype and values of the dense op per sample (bfloat16 within its rounding)."""
    fn, ref, _, dense = CASES[case]
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.int64: 0}[dtype]
    ops = _operands(case, (3, 0, 6, 1, 6), (2, 4, 0, 3, 6), 1, dtype)
    with kmm.force_plan(plan):
        if dense and not dtype.is_floating_point:  # (the harness draws float cotangents for a dense result)
            out = fn(*[mj.nested_tensor(r.comps, ragged_dims=r.ragged_dims) for r in ops])
            assert_close(out, torch.stack([ref(*cs) for cs in zip(*(r.comps for r in ops))]), rtol=0, atol=0)
            return
        per_sample_check(fn, *ops, ref=ref, dense_out=dense, new_ragged=True, grad=dtype.is_floating_point, rtol=tol, atol=tol)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("case", ["x @ x.mT", "attn @ v, heads", "x.mT @ pair, static rows"])
def test_complex_gradients(case, plan):
    """complex128: values, and gradients to second order as dense torch's (``grad @ otherᴴ``)."""
    fn, ref, _, _ = CASES[case]
    g = torch.Generator().manual_seed(0)
    ops = [R([torch.complex(c, torch.randn(c.shape, generator=g, dtype=F64)) for c in r.comps], r.ragged_dims)
           for r in _operands(case, (3, 0, 2), (3, 0, 2), 2)]
    with kmm.force_plan(plan):
        complex_grad_check(fn, *ops, ref=ref, second_order=True)


def test_empty_batch_and_all_empty_samples():
    """B = 0, and samples that are all empty (a contracted ragged dim of length 0 gives zeros)."""
    for case in ("x @ x.mT", "attn @ v, heads", "x.mT @ v, dense result"):
        fn, ref, _, dense = CASES[case]
        per_sample_check(fn, *_operands(case, (0, 0), (0, 0), 0), ref=ref, dense_out=dense, new_ragged=True)
    x = empty_batch((0, 3), (1,), requires_grad=True)
    out = x @ _t(x)
    assert out.shape[0] == 0 and out.ragged_dims == (1, 2)
    d = _t(x) @ empty_batch((0, 2), (1,))
    assert not isinstance(d, mj.MultiJaggedTensor) and d.shape == (0, 3, 2)
    z = _t(mj.nested_tensor([torch.ones(0, 3), torch.ones(2, 3)])) @ mj.nested_tensor([torch.ones(0, 2), torch.ones(2, 2)])
    assert torch.equal(z, torch.stack([torch.zeros(3, 2), torch.full((3, 2), 2.0)]))


def test_operands_of_other_dtypes_raise_as_dense():
    """Dense matmul, bmm and a contracting einsum promote nothing: two batches of other dtypes
    raise (a product without a contraction promotes, as dense einsum's does); autocast casts
    both first."""
    x = mj.nested_tensor([torch.randn(n, 4, dtype=torch.float64) for n in (3, 0, 2)])
    y = mj.nested_tensor([torch.randn(n, 4) for n in (3, 0, 2)])
    with pytest.raises(RuntimeError, match="same dtype"):
        x @ y.mT
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.bmm(x, y.mT)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.einsum("bic,bjc->bij", x, y)
    assert torch.einsum("bic,bic->bic", x, y).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (x.float() @ y.bfloat16().mT).dtype == torch.bfloat16
        for out in (x.float() @ y.mT, torch.bmm(y, y.mT), torch.bmm(x.float(), y.bfloat16().mT),
                    torch.einsum("bic,bjc->bij", y, y.bfloat16())):
            assert out.dtype == torch.bfloat16
        # each sample's product is dense autocast's bmm of that sample
        for a, c in zip(torch.bmm(y, y.mT).unbind(), y.unbind()):
            assert torch.equal(a, torch.bmm(c[None], c.mT[None])[0])


@pytest.mark.parametrize("plan", PLANS)
def test_no_leakage(plan):
    """A sample's result depends on its own values only (bit for bit), whatever the plan groups;
    a sample with infinities, shorter than the group it is padded in, gives dense's result (its
    padding along the contracted dim reads zeros, never its own infinities)."""
    ns = (5, 3, 2, 5)
    g = torch.Generator().manual_seed(0)
    q = [torch.randn(2, n, 4, dtype=F64, generator=g) for n in ns]
    other = list(q)
    other[1] = torch.where(torch.rand(q[1].shape, generator=g) > 0.7, float("inf"), q[1] * 1e6)
    with kmm.force_plan(plan):
        outs = []
        for qs in (q, other):
            x = mj.nested_tensor(qs, ragged_dims=(2,))
            s = x @ _t(x)
            outs.append((s.unbind(), (s.tanh() @ x).unbind()))
    for k in (0, 2, 3):
        assert torch.equal(outs[0][0][k], outs[1][0][k]) and torch.equal(outs[0][1][k], outs[1][1][k])
    dense = other[1] @ _t(other[1])
    torch.testing.assert_close(outs[1][0][1], dense, equal_nan=True)
    torch.testing.assert_close(outs[1][1][1], dense.tanh() @ other[1], equal_nan=True)


def test_plans_follow_the_cost_rule():
    """Large samples each get their own matmul; many tiny ones share one zero-padded group; a
    skewed batch pads the short samples together and runs the long one alone."""
    def plan_of(lengths, c=64):
        lens = tuple(lengths)
        spec = (("i", "c"), ("j", "c"), ("i", "j"), False, True, (("c", c), ("i", lens), ("j", lens)), ())
        p = kmm._plan(spec, None, "cpu", torch.float32)
        return len(p.singles[2]), [len(g[4]) for g in p.groups]

    assert plan_of([150, 180, 120, 160]) == (4, [])
    singles, groups = plan_of([3, 2, 4, 3] * 8)
    assert singles == 0 and len(groups) == 1
    singles, groups = plan_of([200] + [8, 12, 9, 14, 10, 11, 13] * 4)
    assert singles >= 1 and groups and all(g > 1 for g in groups)


def test_compiled_function_matches_eager():
    """Under ``torch.compile`` the traced path (the broadcast product) runs and matches eager, one
    graph over changing lengths."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cc = CompileCounterWithBackend("aot_eager")

    def f(x, v):
        return torch.softmax(x @ x.mT, -1) @ v

    cf = torch.compile(f, backend=cc, fullgraph=True)
    for ns in ((3, 2, 4), (5, 1, 2), (2, 2, 2)):
        x = mj.nested_tensor([torch.randn(n, 4, dtype=F64) for n in ns])
        v = mj.nested_tensor([torch.randn(n, 3, dtype=F64) for n in ns])
        v = torch.zeros_like(x[..., :1]) + v  # one nested int
        assert_close(cf(x, v).values(), f(x, v).values())
    assert cc.frame_count == 1
    torch._dynamo.reset()


def _pack(comps, labels, dims, lead):
    """Per-sample logical ``(*lead, r, c)`` matrices as packed values stored with ``labels``
    (NOTE [ Ragged matmul contract ]): ragged labels as rows, then lead, then static labels."""
    ragged = [lab for lab in labels if isinstance(dims[lab], tuple)]
    static = [lab for lab in labels if not isinstance(dims[lab], tuple)]
    nl = len(lead)
    order = [nl + labels.index(lab) for lab in ragged] + list(range(nl)) + [nl + labels.index(lab) for lab in static]
    rows = []
    for c in comps:
        s = c.permute(order)
        n = 1
        for k in range(len(ragged)):
            n *= s.shape[k]
        rows.append(s.reshape(n, *s.shape[len(ragged):]))
    return torch.cat(rows)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("ragged", ["mkn", "mk", "kn", "mn", "m", "k", "n"])
def test_kernel_every_layout(ragged, lead, plan):
    """The packed kernel against dense products per sample, for every choice of ragged and static
    row, contracted and column dims and every transposition of either operand: values and both
    gradients (the backward's products take the other layouts)."""
    lens = (3, 0, 5, 1, 4)
    dims = {"m": lens if "m" in ragged else 2, "k": tuple(n % 4 for n in lens) if "k" in ragged else 3,
            "n": tuple((2 * n) % 5 for n in lens) if "n" in ragged else 4}
    spec_dims = tuple(sorted(dims.items()))

    def size(lab, b):
        s = dims[lab]
        return s[b] if isinstance(s, tuple) else s

    g = torch.Generator().manual_seed(0)
    for tx in (False, True):
        for ty in (False, True):
            sx, sy = (("k", "m") if tx else ("m", "k")), (("n", "k") if ty else ("k", "n"))
            if not any(isinstance(dims[lab], tuple) for lab in sx) or not any(isinstance(dims[lab], tuple) for lab in sy):
                continue  # a multi_jagged operand has a ragged dim
            xs = [torch.randn(*lead, size(sx[0], b), size(sx[1], b), generator=g, dtype=F64, requires_grad=True)
                  for b in range(len(lens))]
            ys = [torch.randn(*lead, size(sy[0], b), size(sy[1], b), generator=g, dtype=F64, requires_grad=True)
                  for b in range(len(lens))]
            xv = _pack(xs, sx, dims, lead).detach().requires_grad_()
            yv = _pack(ys, sy, dims, lead).detach().requires_grad_()
            spec = (sx, sy, ("m", "n"), tx, ty, spec_dims, lead)
            with kmm.force_plan(plan):
                out = kmm.ragged_matmul(xv, yv, spec)
            refs = [(a.mT if tx else a) @ (c.mT if ty else c) for a, c in zip(xs, ys)]
            expected = _pack(refs, ("m", "n"), dims, lead)
            assert_close(out, expected.detach(), f"tx={tx} ty={ty}")
            cot = torch.randn(out.shape, generator=g, dtype=F64)
            gx, gy = torch.autograd.grad((out * cot).sum(), [xv, yv])
            want = torch.autograd.grad((expected * cot).sum(), xs + ys)
            assert_close(gx, _pack(want[:len(lens)], sx, dims, lead), f"grad x, tx={tx} ty={ty}")
            assert_close(gy, _pack(want[len(lens):], sy, dims, lead), f"grad y, tx={tx} ty={ty}")


def test_integer_products_by_broadcasting_keep_their_dtype_and_bool_raises():
    """Where the product is the broadcast product summed (a ragged dim among the lead dims; traced
    code), an integer matmul / einsum keeps the operands' dtype, as dense's does (a sum would
    accumulate into int64), bit for bit per sample; bool has no matmul kernel, as in dense torch."""
    g = torch.Generator().manual_seed(0)
    z = mj.nested_tensor([torch.randint(-3, 4, (n, n, 3), dtype=torch.int8, generator=g) for n in (3, 0, 2)])
    w = mj.nested_tensor([torch.randint(-3, 4, (n, 3, 2), dtype=torch.int8, generator=g) for n in (3, 0, 2)])
    for out, ref in ((z @ w, lambda c, d: c @ d),
                     (torch.einsum("bijc,bicd->bijd", z, w), lambda c, d: torch.einsum("ijc,icd->ijd", c, d))):
        assert out.dtype == torch.int8
        for a, c, d in zip(out.unbind(), z.unbind(), w.unbind()):
            assert torch.equal(a, ref(c, d))
    b = mj.nested_tensor([torch.rand(n, 2, n, generator=g) > 0.5 for n in (3, 2)])
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        b @ b.mT
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        torch.einsum("bikj,bilj->bkl", b, b)
    x = mj.nested_tensor([torch.randint(0, 5, (n, 4), dtype=torch.int32, generator=g) for n in (3, 0, 5)])
    f = torch.compile(lambda a: a @ a.mT, backend="aot_eager", fullgraph=True)
    out = f(x)
    assert out.dtype == torch.int32
    for a, c in zip(out.unbind(), x.unbind()):
        assert torch.equal(a, c @ c.mT)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("grad", [False, True])
def test_attention_scores_lie_lead_major_through_the_unfused_chain(threads, grad, plan):
    """``softmax(q @ kᵀ · s) @ v`` written out (eager attention): the scores ``(B, H, j0, j0)``
    come out lead-major (``(H, T)`` in memory: NOTE [ Lead-major products ]), each sample's
    ``(H, n, n)`` block written by its product, and the softmax keeps that order; values and the
    gradients of q, k and v are the per-sample chain's, with an empty and a one-token sample, on
    one thread (the product writes the blocks) and two (it copies them), for every plan (a
    group gathers the lead-major rows along the buffer's last dim)."""
    g = torch.Generator().manual_seed(0)
    lengths, h, d = (5, 0, 1, 7), 3, 4
    comps = [[torch.randn(n, h, d, dtype=F64, generator=g) for n in lengths] for _ in range(3)]
    leaves = [[c.clone().requires_grad_(grad) for c in cs] for cs in comps]
    x = [mj.nested_tensor(cs, requires_grad=grad) for cs in comps]  # (B, j0, H, D)
    q, k, v = (t.transpose(1, 2) for t in x)  # (B, H, j0, D), as a head split gives
    refs = [((a.transpose(0, 1) @ b.transpose(0, 1).transpose(-2, -1)) * 0.5).softmax(-1) @ c.transpose(0, 1)
            for a, b, c in zip(*leaves)]
    w = [torch.randn(r.shape, dtype=F64, generator=g) for r in refs]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with kmm.force_plan(plan):
            scores = q @ k.transpose(-2, -1)
            rows = scores._values.shape[0]
            assert scores._values.stride() == (1, rows)
            p = (scores * 0.5).softmax(-1)
            assert p._values.stride() == (1, rows)
            out = p @ v
            if grad:
                ours = torch.autograd.grad(out, x, mj.nested_tensor([c.transpose(0, 1) for c in w]).transpose(1, 2))
    finally:
        torch.set_num_threads(before)
    for got, ref in zip(out.unbind(), refs):
        torch.testing.assert_close(got, ref)
    if grad:
        dense = torch.autograd.grad(refs, [c for cs in leaves for c in cs], w)
        for i, t in enumerate(ours):
            for j, got in enumerate(t.unbind()):
                torch.testing.assert_close(got, dense[i * len(lengths) + j])
