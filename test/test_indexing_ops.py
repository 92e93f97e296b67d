"""Indexing-style ops (ops/indexing/gather.py): ``F.embedding``, ``F.embedding_bag``, ``masked_select``,
``index_put`` / ``x[idx] = v``, ``take_along_dim`` and ops along static dims, against the
per-sample dense reference (batched matmul with a dense operand: ``test_matmul_dense_operand.py``), with zero-length samples, gradients to every input, ``no_grad`` /
``inference_mode`` and one fullgraph compile test per family."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged import multi_jagged

from _reference import CUBE, R, RECT, RECT3, RECT3_MID, SEQ, SQUARE, STATIC_LEAD, few, per_sample_check, seeds, structures
from _structures import lengths, per_sample_check_any_ints

FEW = few(8)
V = 7  # vocabulary size of the embedding tests


def _ints(structure, seed, high=V):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, high, s, generator=g) for s in structure.shapes]


def _components_equal(out, expected, **kw):
    got = out.unbind()
    assert len(got) == len(expected)
    for i, (a, e) in enumerate(zip(got, expected)):
        assert a.shape == e.shape, f"sample {i}: {tuple(a.shape)} != {tuple(e.shape)}"
        torch.testing.assert_close(a, e, msg=lambda m: f"sample {i}: {m}", **kw)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


# --------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT, STATIC_LEAD, RECT3], ids=str)
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_per_sample(layout, padding_idx):
    """``(B, …)`` int indices → ``(B, …, D)``, the ragged dims kept; the weight's gradient (and
    none at ``padding_idx``) as the dense op on the samples."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(V, 3, dtype=torch.float64, generator=g, requires_grad=True)
        idx = _ints(s, seed)
        x = mj.nested_tensor(idx, ragged_dims=layout.ragged_dims)
        out = F.embedding(x, w, padding_idx=padding_idx)
        assert out.ragged_dims == layout.ragged_dims and out.shape[-1] == 3
        assert all(out.shape[d] == x.shape[d] for d in layout.ragged_dims)  # the indices' nested ints
        w_ref = w.detach().clone().requires_grad_()
        expected = [F.embedding(i, w_ref, padding_idx=padding_idx) for i in idx]
        _components_equal(out, [e.detach() for e in expected])
        cot = [torch.randn(e.shape, dtype=e.dtype, generator=g) for e in expected]
        gw, = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), [w])
        gw_ref, = torch.autograd.grad(sum((e * c).sum() for e, c in zip(expected, cot)), [w_ref])
        torch.testing.assert_close(gw, gw_ref)

    check()


def test_embedding_max_norm_renormalises_the_weight_as_dense():
    idx = [torch.tensor([0, 3, 3]), torch.tensor([], dtype=torch.int64), torch.tensor([5, 1])]
    w = torch.randn(V, 4) * 5
    w_ref = w.clone()
    out = F.embedding(torch.nested.nested_tensor(idx, layout=multi_jagged), w, max_norm=1.0)
    expected = [F.embedding(i, w_ref, max_norm=1.0) for i in idx]
    torch.testing.assert_close(w, w_ref)  # the looked-up rows renormalised in place, the others untouched
    _components_equal(out, expected)


def test_embedding_no_grad_inference_mode_and_sparse():
    idx = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)], layout=multi_jagged)
    w = torch.randn(V, 3, requires_grad=True)
    expected = [F.embedding(i, w.detach()) for i in idx.unbind()]
    with torch.no_grad():
        _components_equal(F.embedding(idx, w), expected)
    with torch.inference_mode():
        _components_equal(F.embedding(idx, w), expected)
    with pytest.raises(NotImplementedError, match="embedding.*sparse"):
        F.embedding(idx, w, sparse=True)


def test_embedding_second_order():
    """The weight's gradient differentiates again (``create_graph=True``), as dense's; an empty
    sample contributes nothing (dense's own double backward fails on an empty index)."""
    w = torch.randn(V, 3, dtype=torch.float64, requires_grad=True)
    idx = [torch.tensor([1, 4, 1]), torch.zeros(0, dtype=torch.int64), torch.tensor([2, 1])]
    out = F.embedding(mj.nested_tensor(idx), w, padding_idx=2)
    (g,) = torch.autograd.grad((out ** 3).values().sum(), w, create_graph=True)
    (gg,) = torch.autograd.grad((g * g).sum(), w)
    (g_ref,) = torch.autograd.grad(sum((F.embedding(i, w, padding_idx=2) ** 3).sum() for i in idx if i.numel()), w,
                                   create_graph=True)
    (gg_ref,) = torch.autograd.grad((g_ref * g_ref).sum(), w)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(gg, gg_ref)


def test_embedding_compiles_fullgraph():
    idx = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([6, 5, 4])], layout=multi_jagged)
    w = torch.randn(V, 3, requires_grad=True)
    fn = lambda i, w: F.embedding(i, w, padding_idx=4).sin()  # noqa: E731
    out = _compiled(fn)(idx, w)
    ref = fn(idx, w)
    _components_equal(out, [r.detach() for r in ref.unbind()])
    g, = torch.autograd.grad(out.values().sum(), [w])
    g_ref, = torch.autograd.grad(ref.values().sum(), [w])
    torch.testing.assert_close(g, g_ref)


# --------------------------------------------------------------------------- embedding_bag
def _bag_ref(i, w, mode, psw=None):
    """One bag per component (the dense op on a 1-D input with offsets [0]); an empty bag is zeros."""
    return F.embedding_bag(i.reshape(-1), w, torch.tensor([0]), mode=mode, per_sample_weights=psw)[0]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "per_sample_weights"])
def test_embedding_bag_per_sample_and_njt(mode, weighted):
    """``(B, j0)`` int indices → dense ``(B, D)``, one bag per sample, as torch.jagged; gradients
    to the weight and to ``per_sample_weights``."""
    if weighted and mode != "sum":
        pytest.skip("per_sample_weights is only defined for mode='sum'")

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        g = torch.Generator().manual_seed(seed)
        idx = [torch.randint(0, V, (n,), generator=g) for n in ns]
        psw = [torch.randn(n, generator=g, dtype=torch.float64) for n in ns] if weighted else None
        w = torch.randn(V, 3, generator=g, dtype=torch.float64, requires_grad=True)
        x = torch.nested.nested_tensor(idx, layout=multi_jagged)
        p = mj.as_nested_tensor([t.clone().requires_grad_() for t in psw]) if weighted else None
        out = F.embedding_bag(x, w, mode=mode, per_sample_weights=p)
        w_ref = w.detach().clone().requires_grad_()
        p_ref = [t.clone().requires_grad_() for t in psw] if weighted else [None] * len(ns)
        expected = torch.stack([_bag_ref(i, w_ref, mode, q) for i, q in zip(idx, p_ref)])
        torch.testing.assert_close(out, expected.detach())
        cot = torch.randn(expected.shape, dtype=expected.dtype, generator=g)
        inputs, inputs_ref = [w] + ([p] if weighted else []), [w_ref] + (p_ref if weighted else [])
        grads = torch.autograd.grad((out * cot).sum(), inputs)
        grads_ref = torch.autograd.grad((expected * cot).sum(), inputs_ref)
        torch.testing.assert_close(grads[0], grads_ref[0])
        if weighted:
            _components_equal(grads[1], list(grads_ref[1:]))
        njt = torch.nested.nested_tensor(idx, layout=torch.jagged)
        njt_psw = torch.nested.nested_tensor_from_jagged(torch.cat(psw), njt.offsets()) if weighted else None
        torch.testing.assert_close(out.detach(), F.embedding_bag(njt, w, mode=mode, per_sample_weights=njt_psw))

    check()


def test_embedding_bag_two_ragged_dims_bags_along_the_last():
    """Beyond torch.jagged: ``(B, j0, j1)`` → ``(B, j0, D)``, a bag per row of every sample."""
    idx = [torch.randint(0, V, (n, m)) for n, m in [(2, 3), (0, 2), (3, 0)]]
    x = mj.nested_tensor(idx, ragged_dims=(1, 2))
    w = torch.randn(V, 4, requires_grad=True)
    out = F.embedding_bag(x, w, mode="sum")
    assert out.ragged_dims == (1,) and out.shape[1] == x.shape[1]
    expected = [torch.stack([_bag_ref(r, w, "sum") for r in i]) if len(i) else torch.zeros(0, 4) for i in idx]
    _components_equal(out, expected)
    g, = torch.autograd.grad(out.values().sum(), [w])
    g_ref, = torch.autograd.grad(sum(e.sum() for e in expected), [w])
    torch.testing.assert_close(g, g_ref)


def test_embedding_bag_errors_no_grad_inference_mode_and_compile():
    idx = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64), torch.tensor([3])], layout=multi_jagged)
    w = torch.randn(V, 3, requires_grad=True)
    expected = torch.stack([_bag_ref(i, w.detach(), "mean") for i in idx.unbind()])
    with torch.no_grad():
        torch.testing.assert_close(F.embedding_bag(idx, w), expected)
    with torch.inference_mode():
        torch.testing.assert_close(F.embedding_bag(idx, w), expected)
    with pytest.raises(ValueError, match="offsets"):
        F.embedding_bag(idx, w, torch.tensor([0, 1]))
    with pytest.warns(UserWarning, match="Argument order"):  # the deprecated (weight, input) order
        torch.testing.assert_close(F.embedding_bag(w.detach(), idx), expected)
    static = mj.nested_tensor([torch.zeros(3, 2, dtype=torch.int64)], ragged_dims=(2,))  # a static dim before the ragged
    with pytest.raises(ValueError, match="embedding_bag"):
        F.embedding_bag(static, w)
    out = _compiled(lambda i, w: F.embedding_bag(i, w, mode="sum") * 2)(idx, w)
    torch.testing.assert_close(out, torch.stack([_bag_ref(i, w, "sum") for i in idx.unbind()]) * 2)
    g, = torch.autograd.grad(out.sum(), [w])
    torch.testing.assert_close(g, torch.autograd.grad(F.embedding_bag(idx, w, mode="sum").sum() * 2, [w])[0])


# --------------------------------------------------------------------------- masked_select
@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT, STATIC_LEAD, CUBE, RECT3_MID], ids=str)
def test_masked_select_per_sample(layout):
    """``(B, …)`` → ``(B, j)`` with each sample's selected elements in its row-major order (the
    dense op per sample), also where a static dim comes before a ragged one (the packed order
    differs); gradient as dense (zeros where not selected)."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = s.components(seed)
        masks = [c > 0 for c in comps]
        leaves = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves, ragged_dims=layout.ragged_dims)
        mask = mj.nested_tensor(masks, ragged_dims=layout.ragged_dims)
        out = torch.masked_select(x, mask)
        assert out.ragged_dims == (1,)
        refs = [c.clone().requires_grad_() for c in comps]
        expected = [torch.masked_select(r, m) for r, m in zip(refs, masks)]
        _components_equal(out, [e.detach() for e in expected])
        cot = [torch.randn(e.shape, dtype=e.dtype) for e in expected]
        g = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), leaves)
        g_ref = torch.autograd.grad(sum((e * c).sum() for e, c in zip(expected, cot)), refs)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(x.masked_select(mask).values(), out.values())  # the method too
        # a mask of size 1 along the last static dim broadcasts over it, as dense
        if comps[0].shape[-1] > 1 and layout.ragged_dims[-1] != comps[0].dim():
            narrow = [m[..., :1] for m in masks]
            bx = torch.masked_select(x, mj.as_nested_tensor(narrow, ragged_dims=layout.ragged_dims))
            _components_equal(bx, [torch.masked_select(c, m) for c, m in zip(comps, narrow)])

    check()


@pytest.mark.parametrize("layout", [SEQ, STATIC_LEAD], ids=str)
def test_masked_select_double_backward(layout):
    """Second order through masked_select: d/dx of Σ sel³ is 3x²·mask, whose d/dx (summed) is 6x·mask."""
    comps = [torch.randn(*layout.shape(n, n, 2, 3), dtype=torch.float64) for n in (2, 0, 3)]
    x = mj.nested_tensor(comps, ragged_dims=layout.ragged_dims).requires_grad_()
    mask = x.detach() > 0
    sel = torch.masked_select(x, mask)
    g, = torch.autograd.grad(sel.pow(3).values().sum(), [x], create_graph=True)
    _components_equal(g.detach(), [3 * c * c * (c > 0) for c in comps])
    gg, = torch.autograd.grad(g.values().sum(), [x])
    _components_equal(gg, [6 * c * (c > 0) for c in comps])


@pytest.mark.parametrize("source", ["like_x", "selected", "dense"])
@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT, STATIC_LEAD, CUBE], ids=str)
def test_masked_scatter_per_sample(layout, source):
    """``x.masked_scatter(mask, src)`` per sample as dense: sample b's selected elements (row-major)
    take the first elements of its own source — a source of x's structure, the ``(B, j)`` of
    ``masked_select``, or a dense source that every sample reads from its start — with the
    gradients of x and of the source."""
    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = s.components(seed)
        masks = [c > 0 for c in comps]
        mask = R(masks, layout.ragged_dims)
        if source == "like_x":
            src = R(s.components(seed + 1), layout.ragged_dims)
        elif source == "selected":
            src = R([torch.randn(int(m.sum()), dtype=torch.float64) for m in masks], (1,))
        else:
            src = torch.randn(max([m.numel() for m in masks] + [1]), dtype=torch.float64)
        per_sample_check(lambda a, m, t: a.masked_scatter(m, t), R(comps, layout.ragged_dims), mask, src,
                         ref=lambda a, m, t: a.masked_scatter(m, t))

    check()


def test_masked_scatter_double_backward_and_errors():
    comps = [torch.randn(3, 2, dtype=torch.float64), torch.randn(0, 2, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)]
    masks = [c > 0 for c in comps]
    x = mj.nested_tensor(comps).requires_grad_()
    src = mj.nested_tensor([c + 1 for c in comps]).requires_grad_()
    mask = mj.nested_tensor(masks)
    y = x.masked_scatter(mask, src)
    gx, gs = torch.autograd.grad(y.pow(3).sum(), [x, src], create_graph=True)
    # d/dsrc of Σ y³ at the selected (leading) source elements: 3 src²; d²/dsrc²: 6 src
    (ggs,) = torch.autograd.grad(gs.sum(), [src])
    first = [torch.zeros(c.numel(), dtype=torch.bool).index_fill(0, torch.arange(int(m.sum())), True).view(c.shape) for c, m in zip(comps, masks)]
    _components_equal(ggs, [6 * (c + 1) * f for c, f in zip(comps, first)])
    _components_equal(gx.detach(), [3 * c * c * ~m for c, m in zip(comps, masks)])
    short = mj.nested_tensor([torch.zeros(0, dtype=torch.float64)] * 3)  # fewer source elements than selected
    with pytest.raises(RuntimeError, match="masked_scatter"):
        x.detach().masked_scatter(mask, short)
    other_batch = mj.nested_tensor([torch.randn(n, 2, dtype=torch.float64) for n in (3, 0)])
    with pytest.raises(RuntimeError, match="masked_scatter"):
        x.detach().masked_scatter(mask, other_batch)


def test_masked_scatter_with_a_mask_broadcast_over_static_dims():
    """A per-token mask ``(B, j0, 1)`` broadcasts over the features, as dense ``masked_scatter``'s
    (and ``masked_fill``'s) does: values and gradients of input and source per sample."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(k, 4, dtype=torch.float64, generator=g, requires_grad=True) for k in (3, 0, 5)]
    ms = [torch.rand(k, 1, generator=g) > 0.5 for k in (3, 0, 5)]
    ss = [torch.randn(k, 4, dtype=torch.float64, generator=g, requires_grad=True) for k in (3, 0, 5)]
    out = mj.as_nested_tensor(xs).masked_scatter(mj.nested_tensor(ms), mj.as_nested_tensor(ss))
    refs = [a.masked_scatter(m, s) for a, m, s in zip(xs, ms, ss)]
    _components_equal(out.detach(), [r.detach() for r in refs])
    got = torch.autograd.grad((out * out).sum(), xs + ss)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), xs + ss)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("ragged_dims", [(1,), (2,)], ids=["ragged_lead", "static_lead"])
def test_masked_scatter_compiles_fullgraph(ragged_dims):
    """One graph (no data-dependent size) for every length, values and the gradients of x and the
    source as dense per sample; an empty sample and a short source too."""
    from torch._dynamo.testing import CompileCounter

    cnt = CompileCounter()
    torch._dynamo.reset()
    fn = lambda x, m, s: x.masked_scatter(m, s) * 2  # noqa: E731
    compiled = torch.compile(fn, backend=cnt, fullgraph=True)
    for sizes in [(3, 0, 5), (2, 4, 1), (6, 1, 0)]:
        shape = (lambda n: (n, 3)) if ragged_dims == (1,) else (lambda n: (2, n, 3))
        comps = [torch.randn(shape(n), dtype=torch.float64) for n in sizes]
        x = mj.nested_tensor(comps, ragged_dims=ragged_dims).requires_grad_()
        m = mj.nested_tensor([c > 0 for c in comps], ragged_dims=ragged_dims)
        src = torch.randn(40, dtype=torch.float64, requires_grad=True)
        out = compiled(x, m, src)
        xs = [c.clone().requires_grad_() for c in comps]
        src_ref = src.detach().clone().requires_grad_()
        ref = [fn(c, c > 0, src_ref) for c in xs]
        _components_equal(out.detach(), [r.detach() for r in ref])
        w = [torch.randn_like(r) for r in ref]
        g = torch.autograd.grad(out, [x, src], mj.nested_tensor(w, ragged_dims=ragged_dims))
        g_ref = torch.autograd.grad(ref, xs + [src_ref], w)
        _components_equal(g[0], list(g_ref[:-1]))
        torch.testing.assert_close(g[1], g_ref[-1])
    assert cnt.frame_count == 1
    with pytest.raises(RuntimeError, match="masked_scatter"):
        compiled(x.detach(), m, torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("mask", [torch.tensor(True), torch.tensor(False), torch.tensor([True, False, True]),
                                  torch.tensor([[[False]], [[True]], [[True]]])], ids=str)
def test_masked_select_with_a_dense_mask(mask):
    """A dense boolean mask broadcasts over every sample (0-d, one per feature, one per sample
    ``(B, 1, 1)``), as dense ``masked_select`` per sample, with the gradient."""
    comps = [torch.randn(n, 3, dtype=torch.float64, requires_grad=True) for n in (2, 0, 4)]
    x = mj.as_nested_tensor(comps)
    out = torch.masked_select(x, mask)
    per = [mask[i] if mask.dim() == 3 else mask for i in range(len(comps))]
    ref = [torch.masked_select(c, m) for c, m in zip(comps, per)]
    _components_equal(out.detach(), [r.detach() for r in ref])
    w = [torch.randn_like(r) for r in ref]
    got = torch.autograd.grad(out, comps, mj.as_nested_tensor(w), allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(ref, comps, w, allow_unused=True, materialize_grads=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mask", [torch.tensor([True, False, True]), torch.tensor(True)], ids=str)
def test_masked_scatter_with_a_dense_mask(mask):
    """A dense boolean mask broadcasts over every sample, as dense ``masked_scatter`` per sample
    (each sample reading the dense source from its start), with the gradients."""
    comps = [torch.randn(n, 3, dtype=torch.float64, requires_grad=True) for n in (2, 0, 4)]
    src = torch.randn(20, dtype=torch.float64, requires_grad=True)
    out = mj.as_nested_tensor(comps).masked_scatter(mask, src)
    ref = [c.masked_scatter(mask, src) for c in comps]
    _components_equal(out.detach(), [r.detach() for r in ref])
    got = torch.autograd.grad(sum((t * t).sum() for t in out.unbind()), comps + [src])
    want = torch.autograd.grad(sum((r * r).sum() for r in ref), comps + [src])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_masked_select_matches_njt_and_errors():
    comps = [torch.randn(3), torch.randn(0), torch.randn(4)]
    masks = [c > 0 for c in comps]
    njt = torch.nested.nested_tensor(comps, layout=torch.jagged)
    njt_out = torch.masked_select(njt, torch.nested.nested_tensor_from_jagged(torch.cat(masks), njt.offsets()))
    x = torch.nested.nested_tensor(comps, layout=multi_jagged)
    mask = torch.nested.nested_tensor(masks, layout=multi_jagged)
    out = torch.masked_select(x, mask)
    _components_equal(out, list(njt_out.unbind()))
    with torch.no_grad():
        _components_equal(torch.masked_select(x, mask), list(njt_out.unbind()))
    with torch.inference_mode():
        _components_equal(torch.masked_select(x, mask), list(njt_out.unbind()))
    other = torch.nested.nested_tensor([c > 0 for c in [torch.randn(2), torch.randn(0), torch.randn(4)]], layout=multi_jagged)
    with pytest.raises(RuntimeError, match="masked_select"):
        torch.masked_select(x, other)
    with pytest.raises(RuntimeError, match="masked_select"):
        torch.masked_select(x, torch.randn(3) > 0)


# --------------------------------------------------------------------------- index_put
def _unique_points(sizes, count, gen):
    """Distinct (sample, ragged coordinates…) points of a batch with per-sample ``sizes``."""
    pts = [(b, *c) for b, ext in enumerate(sizes) for c in torch.cartesian_prod(*[torch.arange(n) for n in ext]).reshape(-1, len(ext)).tolist()]
    perm = torch.randperm(len(pts), generator=gen)[:count].tolist()
    return [pts[k] for k in perm]


@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT, RECT3], ids=str)
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_every_ragged_dim_indexed(layout, accumulate):
    """``index_put(x, [b, a…], v)``: one packed row per index (torch.jagged's case, any number of
    ragged dims); negative ragged indices count from each sample's own extent; gradients to x
    and v as the dense op on each sample."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        g = torch.Generator().manual_seed(seed)
        pts = _unique_points(s.sizes, 3, g)
        sizes = s.sizes
        # half of the coordinates negative: counted from B, or from the sample's own extent
        idx = [torch.tensor([p[k] - ((sizes[p[0]][k - 1] if k else s.batch) if (k + j) % 2 else 0) for j, p in enumerate(pts)], dtype=torch.int64)
               for k in range(len(layout.ragged_dims) + 1)] if pts else [torch.zeros(0, dtype=torch.int64)] * (len(layout.ragged_dims) + 1)
        v = torch.randn(len(pts), s.c, generator=g, dtype=torch.float64)

        comps = s.components(seed)
        leaves = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves, ragged_dims=layout.ragged_dims)
        vl = v.clone().requires_grad_()
        out = torch.index_put(x, idx, vl, accumulate=accumulate)
        refs = [c.clone().requires_grad_() for c in comps]
        vr = v.clone().requires_grad_()
        ys = [r.clone() for r in refs]
        for j, p in enumerate(pts):
            cell = ys[p[0]][tuple(p[1:])]
            ys[p[0]] = ys[p[0]].index_put((*[torch.tensor(c) for c in p[1:]],), vr[j] + cell if accumulate else vr[j])
        _components_equal(out, [y.detach() for y in ys])
        cot = [torch.randn(y.shape, dtype=y.dtype, generator=g) for y in ys]
        grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), leaves + [vl], allow_unused=True)
        grads_ref = torch.autograd.grad(sum((y * c).sum() for y, c in zip(ys, cot)), refs + [vr], allow_unused=True)
        for a, b, leaf in zip(grads, grads_ref, leaves + [vl]):
            # an input the reference never reads (no cell to write: v is empty) has no gradient there
            a = torch.zeros_like(leaf) if a is None else a
            b = torch.zeros_like(leaf) if b is None else b
            torch.testing.assert_close(a, b)

    check()


@pytest.mark.parametrize("layout", [SEQ, SQUARE, STATIC_LEAD], ids=str)
def test_index_put_whole_ragged_dims(layout):
    """``x[b] = v`` / ``x[b, s] = v``: indices leave ragged dims whole, ``v`` broadcasts over them
    (torch.jagged pads for this); the gradient to x is zero where written."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = s.components(seed)
        b = torch.tensor([s.batch - 1, 0])
        v = torch.randn(s.c, dtype=torch.float64)
        leaves = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves, ragged_dims=layout.ragged_dims)
        out = torch.index_put(x, [b], v)
        expected = [c.detach().clone() for c in comps]
        for i in b.tolist():
            expected[i][...] = v
        _components_equal(out, expected)
        g = torch.autograd.grad(out.values().sum(), leaves, allow_unused=True)
        for i, gi in enumerate(g):
            want = torch.zeros_like(comps[i]) if i in b.tolist() else torch.ones_like(comps[i])
            torch.testing.assert_close(gi if gi is not None else torch.zeros_like(comps[i]), want)
        if layout is STATIC_LEAD:  # a static index next to the batch index
            y = torch.index_put(x.detach(), [b[:1], torch.tensor([0])], v)
            e = [c.detach().clone() for c in comps]
            e[b[0].item()][0] = v
            _components_equal(y, e)

    check()


def test_setitem_in_place_no_grad_inference_mode_and_errors():
    comps = [torch.randn(n, 2) for n in (3, 0, 2)]
    x = torch.nested.nested_tensor(comps, layout=multi_jagged).requires_grad_()
    v = torch.randn(2, requires_grad=True)
    b, a = torch.tensor([0, 2]), torch.tensor([-1, 1])
    y = x * 1
    y[b, a] = v  # Tensor.__setitem__ → index_put_
    expected = [c.clone() for c in comps]
    expected[0][2], expected[2][1] = v.detach(), v.detach()
    _components_equal(y, expected)
    gx, gv = torch.autograd.grad(y.values().sum(), [x, v])
    torch.testing.assert_close(gv, torch.full((2,), 2.0))
    assert gx.unbind()[0][2].abs().sum() == 0 and gx.unbind()[0][0].sum() == 2
    for ctx in (torch.no_grad(), torch.inference_mode()):
        z = x.detach() * 1
        with ctx:
            z[b, a] = v
            _components_equal(torch.index_put(z, [b, a], v), expected)
            _components_equal(z, expected)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.index_put(x.detach(), [torch.tensor([0]), torch.tensor([3])], torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="shape mismatch"):  # v may not vary along a ragged dim left whole
        torch.index_put(x.detach(), [torch.tensor([0])], torch.randn(3, 2))
    with pytest.raises(NotImplementedError, match="index_put.*requires grad"):
        torch.index_put(x, [torch.tensor([0])], v)
    with pytest.raises(NotImplementedError, match="index_put.*multi_jagged"):
        torch.ops.aten.index_put.default(x.detach(), [None, torch.tensor([0])], torch.tensor(1.0))


@pytest.mark.parametrize("layout", [SEQ, SQUARE, STATIC_LEAD, RECT3_MID], ids=str)
def test_setitem_boolean_mask(layout):
    """``x[mask] = v`` with a multi_jagged boolean mask of x's structure: a scalar, or one value per
    selected element in each sample's row-major order (the packed order differs where a static
    dim comes first); gradients to x and v as dense; ``x[mask]`` reads them back."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = s.components(seed)
        masks = [c > 0 for c in comps]
        count = int(sum(int(m.sum()) for m in masks))
        v = torch.randn(count, dtype=torch.float64, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        x = mj.nested_tensor(comps, ragged_dims=layout.ragged_dims).requires_grad_()
        mask = mj.nested_tensor(masks, ragged_dims=layout.ragged_dims)
        y = x * 1
        y[mask] = v
        refs = [c.clone().requires_grad_() for c in comps]
        vr = v.detach().clone().requires_grad_()
        ys, k = [], 0
        for r, m in zip(refs, masks):
            yi, n = r.clone(), int(m.sum())
            yi[m] = vr[k:k + n]
            ys.append(yi)
            k += n
        _components_equal(y, [t.detach() for t in ys])
        torch.testing.assert_close(y[mask], v.detach())
        cot = [torch.randn(t.shape, dtype=t.dtype) for t in ys]
        g = torch.autograd.grad(sum((a * c).sum() for a, c in zip(y.unbind(), cot)), [x, v])
        g_ref = torch.autograd.grad(sum((a * c).sum() for a, c in zip(ys, cot)), refs + [vr])
        _components_equal(g[0], list(g_ref[:-1]))
        torch.testing.assert_close(g[1], g_ref[-1])
        z = x.detach() * 1
        z[mask] = 0.0
        _components_equal(z, [c.masked_fill(m, 0.0) for c, m in zip(comps, masks)])

    check()


@pytest.mark.parametrize("layout", [SEQ, SQUARE, STATIC_LEAD, RECT3_MID], ids=str)
@pytest.mark.parametrize("over", ["elements", "rows"])
def test_getitem_boolean_mask_reads_elements_or_whole_rows(layout, over):
    """``x[mask]`` with a multi_jagged boolean mask is dense torch's: the selected elements of
    the whole batch in row-major order, a dense tensor; with a mask of x's leading dims through
    every ragged dim (``keep`` of ``(B, j0)`` for ``(B, j0, C)``: token dropping), the selected
    rows ``(K, *rest)``. Gradients reach x, to second order."""

    @FEW
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = s.components(seed)
        trailing = comps[0].dim() - len(layout.ragged_dims)
        rows = over == "rows"
        if rows and (trailing == 0 or layout.ragged_dims != tuple(range(1, len(layout.ragged_dims) + 1))):
            x = mj.nested_tensor(comps, ragged_dims=layout.ragged_dims)
            with pytest.raises(RuntimeError, match=r"index\(\): expected a boolean mask"):
                x[x[..., 0] > 0]  # a dim of the mask's is a ragged dim, or ragged dims do not lead
            return
        pick = (lambda c: c[..., 0] > 0) if rows else (lambda c: c > 0)
        refs = [c.clone().requires_grad_() for c in comps]
        x = mj.nested_tensor(comps, ragged_dims=layout.ragged_dims).requires_grad_()
        out = x[pick(x)]
        ref = torch.cat([r[pick(r)] for r in refs])
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, ref)
        cot = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(seed))
        g = torch.autograd.grad((out * out * cot).sum(), x, create_graph=True)[0]
        g_ref = torch.autograd.grad((ref * ref * cot).sum(), refs, create_graph=True)
        _components_equal(g, [t.detach() for t in g_ref])
        if ref.numel() == 0:
            return  # nothing selected: the gradient is zeros, with no graph (dense alike)
        gg = torch.autograd.grad((g * g).sum(), x)[0]
        gg_ref = torch.autograd.grad(sum((t * t).sum() for t in g_ref), refs)
        _components_equal(gg, list(gg_ref))

    check()


def test_getitem_boolean_mask_of_rows_sets_and_errors():
    """``x[keep] = v`` writes whole rows; a mask whose structure differs raises."""
    comps = [torch.randn(n, 3, generator=torch.Generator().manual_seed(n)) for n in (3, 0, 4)]
    x = mj.nested_tensor(comps)
    keep = x[..., 0] > 0
    y = x.clone()
    y[keep] = torch.arange(3.0)
    _components_equal(y, [c.masked_scatter((c[:, :1] > 0).expand_as(c), torch.arange(3.0).repeat(int((c[:, 0] > 0).sum())))
                          for c in comps])
    other = mj.nested_tensor([torch.ones(n, dtype=torch.bool) for n in (3, 1, 4)])
    with pytest.raises(RuntimeError, match=r"index\(\): expected a boolean mask"):
        x[other]


def test_index_put_compiles_fullgraph():
    x = torch.nested.nested_tensor([torch.randn(n, 2) for n in (3, 1, 2)], layout=multi_jagged).requires_grad_()
    v = torch.randn(2, 2, requires_grad=True)
    idx = [torch.tensor([0, 2]), torch.tensor([1, -1])]
    fn = lambda x, v: torch.index_put(x * 2, idx, v).sin()  # noqa: E731
    out, ref = _compiled(fn)(x, v), fn(x, v)
    _components_equal(out, [r.detach() for r in ref.unbind()])
    g = torch.autograd.grad(out.values().sum(), [x, v])
    g_ref = torch.autograd.grad(ref.values().sum(), [x, v])
    _components_equal(g[0], list(g_ref[0].unbind()))
    torch.testing.assert_close(g[1], g_ref[1])


# --------------------------------------------------------------------------- take_along_dim, constant_pad_nd
@pytest.mark.parametrize("layout", [SEQ, SQUARE, STATIC_LEAD], ids=str)
def test_take_along_static_dim_and_constant_pad_nd(layout):
    """``take_along_dim`` along the last (static) dim with multi_jagged indices, also broadcast
    from size 1 over another static dim; ``torch.constant_pad_nd`` as ``F.pad`` (static and
    ragged dims)."""

    @FEW
    @given(structures(layout, min_c=2), seeds)
    def check(s, seed):
        comps = s.components(seed)
        g = torch.Generator().manual_seed(seed)
        idx = [torch.randint(0, s.c, (*c.shape[:-1], 3), generator=g) for c in comps]
        per_sample_check(lambda x, i: torch.take_along_dim(x, i, -1), R(comps, s.ragged_dims), R(idx, s.ragged_dims),
                         ref=lambda c, i: torch.take_along_dim(c, i, -1))
        per_sample_check(lambda x: torch.constant_pad_nd(x, (1, 2), 0.5), R(comps, s.ragged_dims),
                         ref=lambda c: torch.constant_pad_nd(c, (1, 2), 0.5))
        if layout is not STATIC_LEAD:  # along the (last) ragged dim: a new extent n + 3
            per_sample_check_any_ints(lambda x: torch.constant_pad_nd(x, (0, 0, 2, 1)), lambda c: torch.constant_pad_nd(c, (0, 0, 2, 1)),
                                      comps, s.ragged_dims)
        if layout is STATIC_LEAD:  # indices of size 1 along S broadcast over it
            one = [i[:1] for i in idx]
            per_sample_check(lambda x, i: torch.take_along_dim(x, i, -1), R(comps, s.ragged_dims), R(one, s.ragged_dims),
                             ref=lambda c, i: torch.take_along_dim(c, i, -1))

    check()


# --------------------------------------------------------------------------- along static dims: scatter_, scatter_reduce, index_*; nonzero
@pytest.mark.parametrize("layout", [SEQ, SQUARE, STATIC_LEAD], ids=str)
def test_static_dim_index_ops_and_nonzero(layout):
    """``scatter_`` (in place), ``scatter_reduce``, ``index_add`` / ``index_copy`` / ``index_fill``
    / ``index_select`` along the last (static) dim, and ``nonzero`` / ``argwhere`` per sample
    (``(B, j, D)``: each sample's positions in its row-major order)."""

    @FEW
    @given(structures(layout, min_c=2), seeds)
    def check(s, seed):
        comps = s.components(seed)
        g = torch.Generator().manual_seed(seed)
        idx = R([torch.randint(0, s.c, c.shape, generator=g) for c in comps], s.ragged_dims)
        src = R(s.components(seed + 1), s.ragged_dims)
        x = R(comps, s.ragged_dims)
        ix = torch.tensor([s.c - 1, 0])
        narrow = R([c[..., :2] for c in s.components(seed + 2)], s.ragged_dims)
        per_sample_check(lambda a, i, b: a.clone().scatter_(-1, i, b), x, idx, src, ref=lambda a, i, b: a.clone().scatter_(-1, i, b))
        per_sample_check(lambda a, i: a.clone().scatter_(-1, i, 0.5), x, idx, ref=lambda a, i: a.clone().scatter_(-1, i, 0.5))
        for reduce in ("sum", "amax", "mean"):
            per_sample_check(lambda a, i, b: torch.scatter_reduce(a, -1, i, b, reduce, include_self=False), x, idx, src,
                             ref=lambda a, i, b: torch.scatter_reduce(a, -1, i, b, reduce, include_self=False))
        per_sample_check(lambda a, b: a.index_add(-1, ix, b, alpha=2.0), x, narrow, ref=lambda a, b: a.index_add(-1, ix, b, alpha=2.0))
        per_sample_check(lambda a, b: torch.index_copy(a, -1, ix, b), x, narrow, ref=lambda a, b: torch.index_copy(a, -1, ix, b))
        per_sample_check(lambda a: torch.ops.aten.index_fill(a, -1, ix, -1.0), x, ref=lambda a: a.index_fill(-1, ix, -1.0))
        per_sample_check(lambda a: torch.ops.aten.index_select(a, -1, ix), x, ref=lambda a: a.index_select(-1, ix))
        ints = [(c > 0.3).to(torch.int64) for c in comps]
        m = mj.nested_tensor(ints, ragged_dims=s.ragged_dims)
        for f in (torch.nonzero, torch.argwhere):  # a new extent: the number of nonzeros per sample
            _components_equal(f(m), [f(c) for c in ints])

    check()
    x = mj.nested_tensor([torch.tensor([[0, 2], [3, 0]]), torch.zeros(0, 2, dtype=torch.int64)])
    assert [c.tolist() for c in x.nonzero().unbind()] == [[[0, 1], [1, 0]], []]
    rows, cols = torch.nonzero(x, as_tuple=True)
    assert rows.unbind()[0].tolist() == [0, 1] and cols.unbind()[0].tolist() == [1, 0]
    assert rows.shape == cols.shape  # one extent: the columns combine
    for got, want in zip(torch.where(x > 0), (rows, cols)):  # one-argument where is nonzero
        assert [c.tolist() for c in got.unbind()] == [c.tolist() for c in want.unbind()]
    # along the ragged dim with per-sample indices (test_ragged_indexing.py): every row into row 0
    out = torch.scatter_reduce(x.double(), 1, torch.zeros_like(x), x.double(), "sum")
    for o, c in zip(out.unbind(), x.unbind()):
        assert torch.equal(o, c.double().scatter_reduce(0, torch.zeros_like(c), c.double(), "sum"))


def test_masked_scatter_in_place_per_sample_with_gradients():
    """``x.masked_scatter_(mask, source)``: each sample's masked elements from its source in
    row-major order, as dense; gradients reach x's other elements and the source."""
    comps = [torch.randn(n, 3, dtype=torch.float64) for n in (3, 0, 2)]
    srcs = [torch.randn(n, 3, dtype=torch.float64) for n in (3, 0, 2)]
    leaves = [c.clone().requires_grad_() for c in comps]
    src_leaves = [c.clone().requires_grad_() for c in srcs]
    x, src = mj.as_nested_tensor(leaves), mj.as_nested_tensor(src_leaves)
    mask = x.detach() > 0
    y = x * 1.0
    out = y.masked_scatter_(mask, src)
    assert out is y
    refs = [(c * 1.0).masked_scatter_(c.detach() > 0, s) for c, s in zip(leaves, src_leaves)]
    _components_equal(y, [r.detach() for r in refs])
    g1 = torch.autograd.grad(sum((a ** 2).sum() for a in y.unbind()), leaves + src_leaves)
    g2 = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves + src_leaves)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


_IN_PLACE = {
    # name: (ours on x (B, j, 4), dense on a sample (j, 4))
    "index_fill_ static": (lambda x: x.index_fill_(-1, torch.tensor([0, 2]), 5.), lambda t: t.index_fill_(-1, torch.tensor([0, 2]), 5.)),
    "index_fill_ ragged": (lambda x: x.index_fill_(1, torch.tensor([0]), 5.), lambda t: t.index_fill_(0, torch.tensor([0]), 5.)),
    "scatter_ dense index": (lambda x: x.scatter_(1, torch.zeros(3, 1, 4, dtype=torch.long), 7.),
                             lambda t: t.scatter_(0, torch.zeros(1, 4, dtype=torch.long), 7.)),
    "scatter_add_ dense index": (lambda x: x.scatter_add_(1, torch.zeros(3, 1, 4, dtype=torch.long), torch.ones(3, 1, 4, dtype=torch.float64)),
                                 lambda t: t.scatter_add_(0, torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.float64))),
    "index_add_ static": (lambda x: x.index_add_(-1, torch.tensor([1, 1]), torch.ones(3, 1, 2, dtype=torch.float64).expand(3, 1, 2) * x[..., :2]),
                          None),
}


@pytest.mark.parametrize("name", [n for n, (_, d) in _IN_PLACE.items() if d is not None])
def test_in_place_index_updates_are_per_sample_with_gradients(name):
    """The in-place forms of index_fill / scatter / scatter_add (along static and ragged dims, with
    dense indices) as the out-of-place op written back: per sample, with gradients through the
    write (to the tensor written into)."""
    ours, dense = _IN_PLACE[name]
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 1)]
    leaf = mj.nested_tensor(comps, requires_grad=True)
    x = leaf * 1
    assert ours(x) is x
    leaves = [c.clone().requires_grad_() for c in comps]
    ts = [t * 1 for t in leaves]
    for t in ts:
        dense(t)
    for a, b in zip(x.unbind(), ts):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad((x * x).sum(), leaf)
    refs = torch.autograd.grad(sum((t * t).sum() for t in ts), leaves)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
@pytest.mark.parametrize("dim", [1, 2])
def test_scatter_with_the_deprecated_reduce_keyword(reduce, dim):
    """``x.scatter(d, index, src or value, reduce=)`` (still in model code) as dense's, along the
    ragged dim and a static one, with a tensor source and a scalar."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (3, 0, 4)]
    if dim == 1:
        idx = [torch.randint(0, max(n, 1), (max(n - 1, 0), 3), generator=g) for n in (3, 0, 4)]
    else:
        idx = [torch.randint(0, 3, (n, 2), generator=g) for n in (3, 0, 4)]
    src = [torch.randn(i.shape, generator=g, dtype=torch.float64) for i in idx]
    x, index, source = (mj.nested_tensor(t) for t in (comps, idx, src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dense torch warns that reduce= is deprecated
        for got, c, i, s in zip(x.scatter(dim, index, source, reduce=reduce).unbind(), comps, idx, src):
            torch.testing.assert_close(got, c.scatter(dim - 1, i, s, reduce=reduce))
        for got, c, i in zip(x.scatter(dim, index, 0.5, reduce=reduce).unbind(), comps, idx):
            torch.testing.assert_close(got, c.scatter(dim - 1, i, 0.5, reduce=reduce))
    with pytest.raises(RuntimeError, match="reduce argument must be either add or multiply"):
        x.scatter(dim, index, source, reduce="mean")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("lengths", [(0, 40, 70), (3, 0, 2, 5, 1), (300, 0, 1)], ids=str)
@pytest.mark.parametrize("shape", ["seq", "seq_c", "pair", "static_lead"])
def test_nonzero_per_sample_long_and_short(shape, lengths, dtype):
    """``nonzero`` / ``argwhere`` / ``nonzero(as_tuple=True)`` per sample on long samples (each its
    own dense ``nonzero`` into its rows of the output) and short ones (one ``nonzero`` of the packed
    values), a zero-length sample, NaN counted as nonzero as dense counts it, and layouts whose
    ragged dim does not lead or that have two."""
    g = torch.Generator().manual_seed(len(lengths))
    make = {"seq": lambda n: (n * 64,), "seq_c": lambda n: (n, 64), "pair": lambda n: (n, n, 3), "static_lead": lambda n: (2, n, 40)}[shape]
    ragged = {"seq": (1,), "seq_c": (1,), "pair": (1, 2), "static_lead": (2,)}[shape]
    comps = []
    for n in lengths:
        t = torch.randint(-1, 2, make(n), generator=g)
        if dtype == torch.float32:
            t = torch.where(torch.rand(t.shape, generator=g) < 0.1, torch.full(t.shape, float("nan")), t.float())
        comps.append(t.to(dtype))
    x = mj.nested_tensor(comps, ragged_dims=ragged)
    for f in (torch.nonzero, torch.argwhere):
        got = f(x)
        assert got.shape[0] == len(comps)
        for a, c in zip(got.unbind(), comps):
            assert torch.equal(a, f(c))
    for j, col in enumerate(torch.nonzero(x, as_tuple=True)):
        for a, c in zip(col.unbind(), comps):
            assert torch.equal(a, torch.nonzero(c, as_tuple=True)[j])


def test_scatter_src_of_another_dtype_raises_as_dense():
    # the src was cast to self's dtype (2.7 into int32 summed to 6); a number is still cast
    lens = (3, 0, 2)
    x = mj.nested_tensor([torch.zeros(n, 2, dtype=torch.int32) for n in lens])
    idx = mj.nested_tensor([torch.zeros(n, 2, dtype=torch.long) for n in lens])
    src = mj.nested_tensor([torch.full((n, 2), 2.7) for n in lens])
    for f in (lambda: x.scatter_add(1, idx, src), lambda: x.clone().scatter_(1, idx, src),
              lambda: x.scatter_reduce(1, idx, src, "amax"), lambda: x.scatter(2, idx, src),
              lambda: torch.zeros(3, 4).scatter_add_(1, idx.long(), idx)):
        with pytest.raises(RuntimeError, match="Expected self.dtype to be equal to src.dtype"):
            f()
    assert x.scatter(1, idx, 2.7).unbind()[0].tolist() == [[2, 2], [0, 0], [0, 0]]
