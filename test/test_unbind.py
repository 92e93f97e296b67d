"""unbind / x[i]: views without gradients (as torch.jagged), differentiable otherwise."""

import pytest
import torch

import torch_multijagged as mj

from _structures import assert_samples_and_grads


def test_unbind_without_grad_returns_views():
    comps = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(1, 3)]
    x = mj.nested_tensor(comps)
    parts = x.unbind()
    assert all(p._base is not None for p in parts)
    parts[0].zero_()  # a view: writes through to the packed values
    assert torch.equal(x.values()[:2], torch.zeros(2, 3))
    assert torch.equal(x[2], comps[2])


def test_unbind_with_grad_is_differentiable():
    comps = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(1, 3)]
    x = mj.nested_tensor(comps, requires_grad=True)
    a, b, c = x.unbind()
    (a.sum() * 2 + (c * c).sum() + x[0][1].sum()).backward()
    # d/da = 2 (+1 on row 1 from x[0][1]); d/dc = 2c; the empty sample has no elements
    expected = torch.cat([torch.full((2, 3), 2.0) + torch.tensor([[0.0], [1.0]]), 2 * comps[2]])
    torch.testing.assert_close(x.grad.values(), expected)


def test_tolist_is_each_samples_lists():
    """``x.tolist()``: one nested list per sample, its own lengths (dense ``tolist`` of each
    component), for every structure, an empty sample, integers, and B = 0."""
    from hypothesis import given

    from _reference import ALL_LAYOUTS, few, seeds, structures
    from hypothesis import strategies as st

    @few(10)
    @given(st.sampled_from(ALL_LAYOUTS).flatmap(lambda lay: structures(lay, min_batch=0)), seeds)
    def check(s, seed):
        comps = s.components(seed)
        x = mj.nested_tensor(comps, ragged_dims=s.layout.ragged_dims) if comps else None
        if x is None:
            return
        assert x.tolist() == [c.tolist() for c in comps]
        assert x.long().tolist() == [c.long().tolist() for c in comps]
        assert x.requires_grad_().tolist() == [c.tolist() for c in comps]

    check()
    assert mj.nested_tensor([torch.ones(2, 3)])[:0].tolist() == []


def test_unbind_of_a_static_dim_with_unused_pieces_per_sample():
    """``q, k, v = x.unflatten(-1, (3, 2)).unbind(-2)`` with some pieces unused: the gradient of
    those is zero (aten's backward expanded a dense zero to nested sizes and raised), first and
    second order, per sample; the pieces refuse in-place writes as dense's multi-output views."""
    import pytest

    D = torch.float64
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 6, generator=g, dtype=D) for n in (3, 0, 2)]
    x = mj.nested_tensor(comps, requires_grad=True)
    leaves = [c.clone().requires_grad_() for c in comps]
    for used in ((1,), (0, 2), (0, 1, 2)):
        got = x.unflatten(-1, (3, 2)).unbind(-2)
        refs = [c.unflatten(-1, (3, 2)).unbind(-2) for c in leaves]
        for k in range(3):
            for a, r in zip(got[k].unbind(), refs):
                torch.testing.assert_close(a, r[k])
        gx, = torch.autograd.grad(sum((got[k] ** 3).sum() for k in used), x, create_graph=True)
        gr = torch.autograd.grad(sum((r[k] ** 3).sum() for r in refs for k in used), leaves, create_graph=True)
        for a, b in zip(gx.unbind(), gr):
            torch.testing.assert_close(a, b)
        ggx, = torch.autograd.grad((gx * gx).sum(), x)
        ggr = torch.autograd.grad(sum((b * b).sum() for b in gr), leaves)
        for a, b in zip(ggx.unbind(), ggr):
            torch.testing.assert_close(a, b)
    pieces = (x * 1).unflatten(-1, (3, 2)).unbind(2)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        pieces[0].mul_(2)


@pytest.mark.parametrize("case", ["pair_last", "before_ragged", "keyword", "function"])
def test_unbind_of_a_static_dim_anywhere_per_sample(case):
    """A static dim before, between or after ragged dims (``(B, 3, j0, C)``, ``(B, j0, j0, 3)``),
    by keyword and as ``torch.unbind``: each piece equals the samples' own pieces, values and
    gradients (pieces used with different weights), and the pieces are views of the input."""
    D = torch.float64
    g = torch.Generator().manual_seed(1)
    ns = (3, 0, 2, 1)
    if case == "pair_last":
        comps, rd, dim = [torch.randn(n, n, 3, generator=g, dtype=D) for n in ns], (1, 2), -1
    else:
        comps, rd, dim = [torch.randn(3, n, 2, generator=g, dtype=D) for n in ns], (2,), 1
    x = mj.nested_tensor(comps, ragged_dims=rd, requires_grad=True)
    leaves = [c.clone().requires_grad_() for c in comps]
    call = {"keyword": lambda t: t.unbind(dim=dim), "function": lambda t: torch.unbind(t, dim)}.get(
        case, lambda t: t.unbind(dim))
    got = call(x * 1)
    refs = [c.unbind(dim - 1 if dim > 0 else dim) for c in leaves]
    assert len(got) == 3
    for k in range(3):
        assert got[k].shape[0] == len(ns) and got[k].dim() == x.dim() - 1
        for a, r in zip(got[k].unbind(), refs):
            torch.testing.assert_close(a, r[k])
    gx, = torch.autograd.grad(sum((k + 1) * (got[k] ** 2).sum() for k in range(3)), x)
    gr = torch.autograd.grad(sum((k + 1) * (r[k] ** 2).sum() for r in refs for k in range(3)), leaves)
    for a, b in zip(gx.unbind(), gr):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        base = x.clone()
        pieces = call(base)
        base.add_(1)
        for k in range(3):
            for a, c in zip(pieces[k].unbind(), comps):
                torch.testing.assert_close(a, c.unbind(dim - 1 if dim > 0 else dim)[k] + 1)


@pytest.mark.parametrize("op", ["unbind", "split"])
def test_pieces_made_under_no_grad_refuse_writes_in_grad_mode(op):
    """Pieces of a static dim taken under ``no_grad`` from a batch that records gradients, then
    written in grad mode: dense raises (a view made in no_grad mode), and so does the batch (it
    gave a silently wrong gradient). Pieces of a batch that needs no gradient refuse a write of a
    value that does, take plain writes, and a piece saved for backward sees the batch's later write."""
    leaf = torch.ones(6, 3, requires_grad=True)
    x = mj.from_packed(leaf * 1, torch.tensor([0, 2, 2, 6]), torch.tensor([[2], [0], [4]]))
    with torch.no_grad():
        p = x.unbind(2)[0] if op == "unbind" else x.split(1, 2)[0]
    with pytest.raises(RuntimeError, match="created in no_grad mode"):
        p.mul_(5)
    w = torch.tensor(2.0, requires_grad=True)
    z = torch.nested.nested_tensor([torch.ones(n, 3) for n in (2, 0, 4)], layout=mj.multi_jagged)
    piece = z.unbind(2)[0] if op == "unbind" else z.split(1, 2)[0]
    with pytest.raises(RuntimeError, match="is being modified inplace"):
        piece.mul_(w)  # a batch that needs no gradient, written with a value that does: as dense
    piece.mul_(3)  # a plain write, and one under no_grad, go through
    with torch.no_grad():
        piece.mul_(w)
    assert torch.equal(z.unbind()[0][:, 0], torch.full((2,), 6.0))
    saved = z.unbind(2)[1] if op == "unbind" else z.split(1, 2)[1]
    y = (w * saved * saved).sum()  # saves the piece; the batch written afterwards: as dense, backward raises
    z.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_unbind_of_a_static_dim_with_unused_pieces_compiles():
    """``x.unbind(2)[0] * 2`` under ``torch.compile(fullgraph=True)`` with the other pieces unused
    (aten's unbind backward failed there on nested-int sizes): each sample's values and gradients,
    as eager."""
    g = torch.Generator().manual_seed(2)
    leaves = [torch.randn(n, 3, generator=g, requires_grad=True) for n in (2, 1, 0, 3)]
    x = mj.as_nested_tensor(leaves)
    torch._dynamo.reset()
    for fn in (lambda t: t.unbind(2)[0] * 2, lambda t: t.unbind(-1)[2].sin() + t.unbind(2)[1]):
        got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
        refs = [fn(c[None])[0] for c in leaves]
        assert_samples_and_grads(got, refs, leaves)


def test_multihead_attention_weights_alone_carry_the_gradient():
    """A loss on ``nn.MultiheadAttention``'s returned weights only (the value projection unused):
    gradients of the input and the in-projection as the module's on each sample."""
    D = torch.float64
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(6, 2, batch_first=True, dtype=D)
    comps = [torch.randn(n, 6, dtype=D) for n in (3, 2)]
    x = mj.nested_tensor(comps, requires_grad=True)
    _, w = mha(x, x, x, need_weights=True)
    loss = sum((a ** 2).sum() for a in w.unbind())
    gx, gw = torch.autograd.grad(loss, [x, mha.in_proj_weight])
    leaves = [c.clone().requires_grad_() for c in comps]
    ref = sum((mha(c[None], c[None], c[None], need_weights=True)[1][0] ** 2).sum() for c in leaves)
    rx = torch.autograd.grad(ref, leaves + [mha.in_proj_weight])
    for a, b in zip(gx.unbind(), rx[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gw, rx[-1])


def _layouts():
    g = torch.Generator().manual_seed(3)
    seq = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (2, 0, 3)]
    lead = [torch.randn(2, n, 3, generator=g, dtype=torch.float64) for n in (2, 0, 3)]  # (B, S, j0, C)
    pair = [torch.randn(n, n, 2, generator=g, dtype=torch.float64) for n in (2, 0, 3)]
    return [(seq, None), (lead, (2,)), (pair, (1, 2))]


def test_samples_with_grad_per_sample_to_second_order():
    """``x[i]`` (negative too), ``select(0, i)`` and ``unbind()`` with autograd recording: each
    sample's gradient, first and second order, as each sample run alone."""
    for comps, ragged in _layouts():
        leaves = [c.clone().requires_grad_() for c in comps]
        x = mj.as_nested_tensor(leaves, ragged_dims=ragged)
        y = x.tanh()
        w = [torch.randn(c.shape, generator=torch.Generator().manual_seed(i), dtype=c.dtype) for i, c in enumerate(comps)]
        for i in range(-len(comps), len(comps)):
            torch.testing.assert_close(y[i], comps[i].tanh())
        loss = (y[0] ** 2 * w[0]).sum() + (y.select(0, -1) * w[-1]).sum() + sum((c ** 3).sum() for c in y.unbind())
        g = torch.autograd.grad(loss, leaves, create_graph=True)
        gg = torch.autograd.grad(sum((t * t).sum() for t in g), leaves)
        ref_leaves = [c.clone().requires_grad_() for c in comps]
        ys = [t.tanh() for t in ref_leaves]
        ref = (ys[0] ** 2 * w[0]).sum() + (ys[-1] * w[-1]).sum() + sum((t ** 3).sum() for t in ys)
        rg = torch.autograd.grad(ref, ref_leaves, create_graph=True)
        rgg = torch.autograd.grad(sum((t * t).sum() for t in rg), ref_leaves)
        for a, b in zip(g + gg, rg + rgg):
            torch.testing.assert_close(a, b)


def test_writes_into_samples_with_grad_raise_not_vanish():
    """With autograd recording, ``y[0]`` and ``unbind()``'s components are views of the batch's
    values that autograd cannot connect back to ``y``: a write into one raises (dense ``unbind``'s
    components raise too). They were copies, and ``y[0][1] = 5`` left ``y`` and its gradient
    unchanged where dense ``y[0]`` writes through. Without grad they write through, as views."""
    comps = [torch.randn(3, 4), torch.randn(0, 4), torch.randn(2, 4)]
    x = mj.nested_tensor(comps, requires_grad=True)
    writes = [lambda y: y[0].__setitem__(1, 5.0), lambda y: y.select(0, 0)[1].fill_(5.0),
              lambda y: y.unbind()[0].mul_(2), lambda y: y[-1].mul_(2), lambda y: y[2].zero_()]
    for write in writes:
        y = x * 2
        before = y.detach().clone()
        with pytest.raises(RuntimeError, match="modified inplace"):
            write(y)
        for a, b in zip(y.unbind(), before.unbind()):
            assert torch.equal(a, b)
    with torch.no_grad():
        y = x * 2
        y[0][1] = 5.0
    assert torch.equal(y.unbind()[0][1], torch.full((4,), 5.0))
