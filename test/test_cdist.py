"""``torch.cdist`` on multi_jagged batches against dense ``cdist`` on each sample, bit for bit:
values, dtypes, the gradients of every input (second order where dense has one), ties, every
``compute_mode`` (dense's matmul form for long samples), zero-length samples, B = 1, batch dims
before the rows, dense operands on either side, dense's errors — in both eager forms (sample by
sample, and samples of one shape batched) and in the traced formula."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from torch_multijagged.ops.nn.distances import cdist_path
from _reference import RECT, SEQ, SQUARE, STATIC_LEAD, empty_batch, few, seeds, structures
from _structures import bit_equal, comps_for, packed_args

F64 = torch.float64
INF = math.inf
PS = [0.0, 0.5, 1.0, 2.0, 3.0, INF]
MODES = ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"]
PATHS = ["per_sample", "per_shape", None]


class Rows:
    """A multi_jagged operand: its components and ragged dims."""

    def __init__(self, comps, ragged_dims=(1,)):
        self.comps, self.ragged_dims = list(comps), ragged_dims


class Dense:
    """A dense ``(B, …)`` operand: sample i reads slice i (or slice 0 for a size of 1)."""

    def __init__(self, t):
        self.t = t


def cdist_check(a, b, p=2.0, mode=MODES[0], path=None, seed=0):
    """``torch.cdist`` of two operands (``Rows``, ``Dense`` or a shared dense tensor) against
    dense ``cdist`` on each sample: output values bit for bit, then the gradients of a random
    cotangent — bit for bit for the batches' components, equal for a dense ``(B, …)`` operand
    (whose per-sample reference sums zeros into the other slices: the sign of a zero may differ)
    and close for a shared one, a ``(1, …)`` included (a sum over the samples in another order).
    Returns the output."""
    mj_args, leaves, ref_leaves, parts, kinds = [], [], [], [], []
    built = {}
    for op in (a, b):
        if id(op) in built:  # the same batch twice: cdist(x, x)
            mj_args.append(built[id(op)][0])
            parts.append(built[id(op)][1])
            continue
        if isinstance(op, Rows):
            ml = [c.clone().requires_grad_() for c in op.comps]
            rl = [c.clone().requires_grad_() for c in op.comps]
            x = mj.as_nested_tensor(ml, ragged_dims=op.ragged_dims)
            leaves += ml
            ref_leaves += rl
            kinds += ["rows"] * len(ml)
            part = (lambda i, rl=rl: rl[i])
        else:
            t = op.t if isinstance(op, Dense) else op
            x, rt = t.clone().requires_grad_(), t.clone().requires_grad_()
            leaves.append(x)
            ref_leaves.append(rt)
            kinds.append("dense" if isinstance(op, Dense) and t.shape[0] > 1 else "shared")
            part = ((lambda i, rt=rt: rt[i if rt.shape[0] > 1 else 0]) if isinstance(op, Dense) else (lambda i, rt=rt: rt))
        built[id(op)] = (x, part)
        mj_args.append(x)
        parts.append(part)
    batch = len(next(op for op in (a, b) if isinstance(op, Rows)).comps)
    with cdist_path(path):
        out = torch.cdist(mj_args[0], mj_args[1], p, mode)
    refs = [torch.cdist(parts[0](i), parts[1](i), p, mode) for i in range(batch)]
    got = out.unbind()
    assert len(got) == batch
    for i, (o, r) in enumerate(zip(got, refs)):
        assert bit_equal(o, r), f"sample {i}: {o} vs dense {r}"
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(r.shape, generator=gen, dtype=r.dtype) for r in refs]
    g_mj = torch.autograd.grad(sum((o * c).sum() for o, c in zip(got, cots)), leaves, allow_unused=True)
    g_ref = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cots)), ref_leaves, allow_unused=True)
    for k, (gm, gr, leaf, kind) in enumerate(zip(g_mj, g_ref, ref_leaves, kinds)):
        gm = torch.zeros_like(leaf) if gm is None else gm
        gr = torch.zeros_like(leaf) if gr is None else gr
        if kind == "rows":
            assert bit_equal(gm, gr), f"gradient of component {k}: {gm} vs dense {gr}"
        elif kind == "dense":
            # dense's bits where BLAS takes the same kernel for a sample's product alone and in the
            # batch; some CPUs' BLAS picks another for the degenerate shapes (C = 1): a rounding apart
            eps = torch.finfo(gr.dtype).eps
            torch.testing.assert_close(gm, gr, rtol=8 * eps, atol=32 * eps * float(gr.abs().max()),
                                       msg=lambda m: f"gradient of the dense operand: {m}")
        else:
            torch.testing.assert_close(gm, gr, rtol=1e-5, atol=1e-6)
    return out


def _other(comps, seed, rows=None):
    """Components with the batch dims of ``comps`` and other rows (``rows(n)`` of them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in comps:
        n = c.shape[-2]
        m = rows(n) if rows else (n + 1) % 4
        out.append(((torch.rand((*c.shape[:-2], m, c.shape[-1]), generator=g, dtype=F64) * 8).round() / 2 - 2).to(c.dtype))
    return out


# ----------------------------------------------------------------------------- per sample, bit for bit
@few(20)
@given(structures(SEQ, min_c=1, max_c=4, max_len=5), seeds, st.sampled_from(PS), st.sampled_from(MODES),
       st.sampled_from(PATHS), st.booleans(), st.booleans())
def test_cdist_of_row_sets_is_dense_per_sample(s, seed, p, mode, path, ties, cross):
    """``(B, j0, C)`` with itself or with ``(B, j1, C)``; ``ties``: coordinates on a half-integer
    grid (a zero distance, equal largest coordinates for p = inf, a zero difference for p < 1)."""
    comps = s.components(seed, ties=ties)
    x = Rows(comps)
    y = Rows(_other(comps, seed + 1)) if cross else x
    cdist_check(x, y, p, mode, path, seed)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("p", PS)
def test_cdist_integer_points_with_ties_every_p_and_mode(p, mode, path):
    """Points on an integer grid (ties everywhere), lengths that repeat (batched together in the
    per-shape form), a zero-length sample and one past dense's 25-row switch to the matmul form."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randint(-2, 3, (n, 3), generator=g).to(F64) for n in (3, 0, 3, 5, 27, 3, 1)]
    other = [torch.randint(-2, 3, (n, 3), generator=g).to(F64) for n in (2, 4, 2, 0, 2, 26, 1)]
    cdist_check(Rows(comps), Rows(comps), p, mode, path)
    cdist_check(Rows(comps), Rows(other), p, mode, path, seed=1)


def test_cdist_inf_gives_every_tied_coordinate_the_full_sign():
    """Dense ``cdist``'s p = inf gradient: ``sign(x_i − y_j)`` at every coordinate that ties for
    the largest difference (the inf-norm of the differences would split it between them)."""
    x = mj.nested_tensor([torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 0.0], [2.0, 0.0]])], requires_grad=True)
    y = mj.nested_tensor([torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]])])
    g, = torch.autograd.grad(torch.cdist(x, y, p=INF).sum(), x)
    assert [t.tolist() for t in g.unbind()] == [[[-1.0, -1.0]], [[-1.0, -1.0], [1.0, -1.0]]]


@pytest.mark.parametrize("path", PATHS)
def test_cdist_long_samples_take_dense_matmul_form(path):
    """p = 2 over more than 25 rows is dense's matmul form, whose rounding leaves a small
    distance of a point to itself: the batch gives the same numbers, and batches samples of one
    length only where dense would not switch form."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g) * 100 for n in (30, 30, 4, 4, 26)]
    out = cdist_check(Rows(comps), Rows(comps), 2.0, MODES[0], path)
    assert any(bool(o.diagonal().ne(0).any()) for o in out.unbind()[:2])  # the matmul form's rounding
    # a batch on the right: each sample's (M, n) is stored (n, M), and its matmul backward must see
    # the gradient's layout that it sees alone (BLAS rounds by the transposes)
    for c in (1, 2, 3):
        comps = [torch.randn(n, c, generator=g) for n in (26, 26, 30, 40, 3)]
        for m in (3, 5):
            cdist_check(torch.randn(m, c, generator=g), Rows(comps), 2.0, MODES[0], path, seed=c)
            cdist_check(Dense(torch.randn(5, m, c, generator=g)), Rows(comps), 2.0, MODES[1], path, seed=c)


def test_cdist_one_sample_and_float32():
    g = torch.Generator().manual_seed(0)
    c = [torch.randn(6, 4, generator=g)]
    for p in PS:
        cdist_check(Rows(c), Rows(c), p)
        cdist_check(Rows(c), Rows(_other(c, 1, lambda n: 3)), p)


def test_cdist_of_an_empty_batch():
    x = empty_batch((0, 3), (1,), requires_grad=True)
    out = torch.cdist(x, x)
    assert out.shape[0] == 0 and out.dim() == 3 and out.dtype == F64
    assert out.values().shape == (0,)


# ----------------------------------------------------------------------------- batch dims, dense operands
@few(12)
@given(structures(RECT, min_c=1, max_c=3, max_len=3) | structures(SQUARE, min_c=1, max_c=3, max_len=3)
       | structures(STATIC_LEAD, min_c=1, max_c=3, max_len=3), seeds, st.sampled_from(PS), st.sampled_from(PATHS),
       st.booleans())
def test_cdist_with_batch_dims_before_the_rows(s, seed, p, path, cross):
    """Samples ``(n, m, C)`` / ``(S, n, C)``: dense ``cdist`` batched over the dims before the rows
    (``(B, j0, j1, C)`` with itself is ``(B, j0, j1, j1)``)."""
    comps = s.components(seed, ties=True)
    x = Rows(comps, s.ragged_dims)
    y = Rows(_other(comps, seed + 1), s.ragged_dims) if cross else x
    cdist_check(x, y, p, MODES[seed % 3], path, seed)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, INF])
def test_cdist_with_dense_operands_on_either_side(p, path):
    """A dense ``(B, M, C)`` (sample i's ``(M, C)``), ``(1, M, C)`` (every sample's) and a shared
    ``(M, C)`` (a codebook) on either side; a shared ``(K, M, C)`` batch against samples ``(K, n, C)``."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randint(-2, 3, (n, 3), generator=g).to(F64) for n in (3, 0, 3, 5, 1)]
    per = torch.randint(-2, 3, (5, 4, 3), generator=g).to(F64)
    one = torch.randint(-2, 3, (1, 4, 3), generator=g).to(F64)
    book = torch.randint(-2, 3, (4, 3), generator=g).to(F64)
    x = Rows(comps)
    for d in (Dense(per), Dense(one), book):
        cdist_check(x, d, p, path=path)
        cdist_check(d, x, p, path=path)
    lead = Rows([torch.randint(-2, 3, (2, n, 3), generator=g).to(F64) for n in (3, 0, 3)], (2,))
    cdist_check(lead, torch.randn(2, 4, 3, dtype=F64, generator=g), p, path=path)
    cdist_check(torch.randn(1, 4, 3, dtype=F64, generator=g), lead, p, path=path)


def test_cdist_structure_of_the_result():
    x = mj.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
    y = mj.nested_tensor([torch.randn(1, 3), torch.randn(5, 3)])
    assert torch.cdist(x, x).shape[1] is x.shape[1] and torch.cdist(x, x).shape[2] is x.shape[1]
    xy = torch.cdist(x, y)
    assert xy.ragged_dims == (1, 2) and xy.shape[1] is x.shape[1] and xy.shape[2] is y.shape[1]
    xb = torch.cdist(x, torch.randn(7, 3))
    assert xb.ragged_dims == (1,) and xb.shape[2] == 7
    bx = torch.cdist(torch.randn(7, 3), x)
    assert bx.ragged_dims == (2,) and bx.shape[1] == 7
    z = mj.nested_tensor([torch.randn(2, 3, 8), torch.randn(1, 4, 8)])
    zz = torch.cdist(z, z)
    assert zz.ragged_dims == (1, 2, 3) and [tuple(t.shape) for t in zz.unbind()] == [(2, 3, 3), (1, 4, 4)]


def test_cdist_does_not_leak_between_samples():
    for path in PATHS:
        comps = [torch.randn(n, 3) for n in (3, 3, 3, 2)]
        with cdist_path(path):
            a = torch.cdist(mj.as_nested_tensor(comps), mj.as_nested_tensor(comps), 1.0)
            comps[1] = comps[1] * 7 + 2
            b = torch.cdist(mj.as_nested_tensor(comps), mj.as_nested_tensor(comps), 1.0)
        for i in (0, 2, 3):
            assert bit_equal(a.unbind()[i], b.unbind()[i])
        assert not torch.equal(a.unbind()[1], b.unbind()[1])


# ----------------------------------------------------------------------------- second order
def _packed(comps, rd=(1,)):
    v, off, sizes = packed_args(comps, rd)
    return v.requires_grad_(), off, sizes


@pytest.mark.parametrize("p", PS)
def test_cdist_gradcheck_in_float64(p):
    """First order, numerically (points apart: no zero distance, no tie)."""
    comps = [c * 3 for c in comps_for([(2, 3), (0, 3), (3, 3)], 0)]
    other = [c * 3 + 0.1 for c in comps_for([(3, 3), (2, 3), (1, 3)], 1)]
    (v, off, sizes), (w, off2, sizes2) = _packed(comps), _packed(other)
    with cdist_path("per_sample"):
        assert torch.autograd.gradcheck(
            lambda v, w: torch.cdist(mj.from_packed(v, off, sizes), mj.from_packed(w, off2, sizes2), p).values(), (v, w))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths", [(27, 3, 0, 3), (27, 3, 3), (27, 26)])
def test_cdist_second_order_where_dense_has_one(lengths, mode, path):
    """Dense ``cdist`` differentiates twice in its matmul form (p = 2, and more than 25 rows or
    ``use_mm_for_euclid_dist``) and raises elsewhere (``_cdist_backward`` has no derivative; an
    empty sample takes it in every mode): the batch does the same — the same second
    derivatives, or the same error where the per-sample loop over the batch raises."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 2, generator=g, dtype=F64) for n in lengths]
    for p in (2.0, 1.0):
        leaves = [c.clone().requires_grad_() for c in comps]
        refs = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves)
        with cdist_path(path):
            out = torch.cdist(x, x, p, mode).unbind()
        dense = [torch.cdist(r, r, p, mode) for r in refs]
        cots = [torch.randn(d.shape, generator=g, dtype=F64) for d in dense]
        gm = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out, cots)), leaves, create_graph=True)
        gr = torch.autograd.grad(sum((d * c).sum() for d, c in zip(dense, cots)), refs, create_graph=True)
        twice = p == 2.0 and all(lengths) and (mode == MODES[1] or (mode == MODES[0] and min(lengths) > 25))
        if twice:
            a = torch.autograd.grad(sum((u * u).sum() for u in gm), leaves)
            b = torch.autograd.grad(sum((w * w).sum() for w in gr), refs)
            for u, w in zip(a, b):
                assert bit_equal(u, w)
        else:
            with pytest.raises(NotImplementedError, match="_cdist_backward"):
                torch.autograd.grad(sum((w * w).sum() for w in gr), refs)
            with pytest.raises(NotImplementedError, match="_cdist_backward"):
                torch.autograd.grad(sum((u * u).sum() for u in gm), leaves)


def test_cdist_gradgradcheck_in_the_matmul_form():
    """Points apart (the distance of a point to itself has no derivative); no empty sample (dense
    has no second order there)."""
    comps = [c * 3 for c in comps_for([(2, 3), (4, 3), (3, 3)], 0)]
    other = [c * 3 + 0.1 for c in comps_for([(3, 3), (2, 3), (1, 3)], 1)]
    (v, off, sizes), (w, off2, sizes2) = _packed(comps), _packed(other)
    for path in PATHS:
        with cdist_path(path):
            assert torch.autograd.gradgradcheck(
                lambda v, w: torch.cdist(mj.from_packed(v, off, sizes), mj.from_packed(w, off2, sizes2), 2.0,
                                         MODES[1]).values(), (v, w))


# ----------------------------------------------------------------------------- errors, as dense
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cdist_low_precision_on_the_cpu_raises_as_dense(dtype):
    comps = [torch.randn(3, 2).to(dtype), torch.randn(2, 2).to(dtype)]
    with pytest.raises(NotImplementedError, match="not implemented for"):
        torch.cdist(comps[0], comps[0])
    for path in PATHS:
        with cdist_path(path), pytest.raises(NotImplementedError, match="not implemented for"):
            torch.cdist(mj.nested_tensor(comps), mj.nested_tensor(comps))
    x = mj.nested_tensor(comps)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # on autocast's float32 list, as dense
        assert torch.cdist(x, x).dtype == torch.float32


def test_cdist_errors_as_dense():
    x = mj.nested_tensor([torch.randn(3, 2), torch.randn(2, 2)])
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.cdist(x.long(), x.long())
    with pytest.raises(RuntimeError, match="same number of columns"):
        torch.cdist(x, torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.cdist(x, x, p=-1.0)
    with pytest.raises(ValueError, match="not a valid value for compute_mode"):
        torch.cdist(x, x, compute_mode="fast")
    with pytest.raises(RuntimeError, match="expected scalar type"):
        torch.cdist(x, torch.randn(4, 2, dtype=F64))
    signals = mj.as_nested_tensor([torch.randn(2, n) for n in (3, 1)], ragged_dims=(2,))
    with pytest.raises(StructureError, match="static last dim"):
        torch.cdist(signals, signals)
    with pytest.raises(StructureError, match="needs size 2 or 1 along the batch dim"):
        torch.cdist(x, torch.randn(3, 4, 2))
    with pytest.raises(StructureError, match="dense operand of 2 to 3 dims"):
        torch.cdist(x, torch.randn(2, 1, 4, 2))
    lead = mj.nested_tensor([torch.randn(3, 2), torch.randn(5, 2)]).unsqueeze(2)  # (B, j0, 1, C)
    with pytest.raises(StructureError, match="ragged dim 1"):
        torch.cdist(lead, torch.randn(2, 4, 2))  # per sample (n, 1, C) with (2, 4, C): n against 2


# ----------------------------------------------------------------------------- traced
@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_cdist_keeps_the_traced_formula(_fresh_dynamo):
    """Under ``torch.compile`` (no host sizes) the norm of the differences runs, one graph for new
    lengths; its values and gradients — p = inf's full sign at ties included — are the eager ones
    (exact for these small integer points)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")

    def fn(x):
        return torch.cdist(x, x, INF) + torch.cdist(x, x, 1.0)

    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for lengths in [(3, 0, 5), (1, 4, 2), (6, 6, 2)]:
        g = torch.Generator().manual_seed(sum(lengths))
        comps = [torch.randint(-1, 2, (n, 3), generator=g).to(F64) for n in lengths]
        x = mj.nested_tensor(comps, requires_grad=True)
        y = mj.nested_tensor(comps, requires_grad=True)
        a, b = compiled(x), fn(y)
        assert torch.equal(a.values(), b.values())
        ga, = torch.autograd.grad(a.values().sum(), x)
        gb, = torch.autograd.grad(b.values().sum(), y)
        assert torch.equal(ga.values(), gb.values())
    assert counter.frame_count == 1


def test_compiled_cdist_of_two_batches_with_lengths_that_meet(_fresh_dynamo):
    """``torch.cdist(a, b)`` of two batches in a compiled function (not fullgraph: a pair of two
    extents is built outside a graph) trains over calls whose lengths differ and then coincide —
    the output then is a square — values and gradients of both inputs as dense per sample."""
    f = torch.compile(lambda a, b: torch.cdist(a, b).sum(-1), backend="aot_eager")
    for l1, l2 in [((3, 0, 5), (2, 2, 4)), ((2, 2, 2), (2, 2, 2)), ((4, 1, 2), (3, 3, 1))]:
        g = torch.Generator().manual_seed(sum(l1))
        xs = [torch.randn(n, 4, dtype=F64, generator=g).requires_grad_() for n in l1]
        ys = [torch.randn(n, 4, dtype=F64, generator=g).requires_grad_() for n in l2]
        out = f(mj.as_nested_tensor(xs), mj.as_nested_tensor(ys))
        refs = [torch.cdist(x, y).sum(-1) for x, y in zip(xs, ys)]
        for o, r in zip(out.unbind(), refs):
            torch.testing.assert_close(o, r)
        got = torch.autograd.grad(out.values().sum(), xs + ys)
        want = torch.autograd.grad(sum(r.sum() for r in refs), xs + ys, allow_unused=True)
        for p, q in zip(got, want):
            torch.testing.assert_close(p, torch.zeros_like(p) if q is None else q)
