"""Flattening consecutive ragged dims into one and back (torch_multijagged/ops/ragged_flatten.py,
NOTE [ Flattening ragged dims ]): NaViT patch tokens ``(B, D, j_h, j_w) → (B, D, j_t) → (B, j_t, D)``
with ``t_i = h_i·w_i``, zero-copy, and ``unflatten`` back to the original nested ints.

Oracle: dense ``flatten`` / ``unflatten`` of every component.
"""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged.errors import StructureError
from torch_multijagged.structure import extent_of
from _reference import few, seeds
from _structures import bit_equal, comps_for, packed_args

D = torch.float64


def _batch(shapes, ragged_dims, seed=0, dtype=D):
    leaves = [c.to(dtype).requires_grad_() for c in comps_for(shapes, seed)]
    return leaves, mj.as_nested_tensor(leaves, ragged_dims=ragged_dims)


def _same(out, expected):
    got = out.unbind()
    assert len(got) == len(expected)
    for i, (o, e) in enumerate(zip(got, expected)):
        assert o.shape == e.shape and bit_equal(o, e), f"sample {i}: {o.shape} vs {e.shape}"


def _grads_agree(out, expected, leaves, seed=0):
    """The gradients of a random cotangent through ``out`` (multi_jagged) and through the dense
    per-sample ``expected`` reach the leaves equally."""
    g = torch.Generator().manual_seed(seed)
    cots = [torch.randn(e.shape, generator=g, dtype=e.dtype) for e in expected]
    gm = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cots)), leaves, allow_unused=True)
    gr = list(cots)  # d/dleaf of Σ (flatten(leaf) · c) is c reshaped like the leaf
    for k, (a, c, leaf) in enumerate(zip(gm, gr, leaves)):
        a = torch.zeros_like(leaf) if a is None else a
        assert torch.equal(a, c.reshape(leaf.shape)), f"grad of leaf {k}"


# ----------------------------------------------------------------------------- flatten
def test_flatten_two_ragged_dims_every_spelling():
    """``flatten(2)``, ``flatten(-2, -1)``, ``torch.flatten(x, 2)``, ``reshape``/``view`` to
    ``(B, D, -1)``: one nested int j_t with t_i = h_i·w_i, the rows unchanged (zero copy)."""
    leaves, x = _batch([(4, 3, 2), (4, 0, 5), (4, 2, 2), (4, 1, 3)], (2, 3))
    expected = [c.flatten(1) for c in leaves]
    t = x.flatten(2)
    _same(t, expected)
    assert t.sizes().tolist() == [[6], [0], [4], [3]]  # = [3·2, 0·5, 2·2, 1·3]
    assert t.values().data_ptr() == x.values().data_ptr()  # zero copy
    for other in (x.flatten(-2, -1), torch.flatten(x, 2), x.reshape(4, 4, -1), x.view(4, 4, -1), x.reshape(-1, 4, -1),
                  x.view(4, 4, t.shape[2]), torch.reshape(x, (4, 4, -1))):
        assert other.shape == t.shape  # the same nested int: flattening one structure twice
        _same(other, expected)
    _grads_agree(t, expected, leaves)
    tok = t.transpose(1, 2)  # (B, j_t, D) tokens
    assert tok.shape[1] == t.shape[2] and tok.shape[2] == 4
    _same(tok, [c.flatten(1).T for c in leaves])


def test_unflatten_restores_the_original_nested_ints():
    leaves, x = _batch([(4, 3, 2), (4, 0, 5), (4, 2, 2)], (2, 3))
    t = x.flatten(2)
    for back in (t.unflatten(2, (x.shape[2], x.shape[3])), t.unflatten(-1, (-1, x.shape[3])), t.unflatten(2, (x.shape[2], -1)),
                 torch.unflatten(t, 2, (x.shape[2], x.shape[3])), t.view(3, 4, x.shape[2], x.shape[3]),
                 t.reshape(3, 4, x.shape[2], -1)):
        assert back.shape == x.shape and back._partition is x._partition
        _same(back, [c.detach() for c in leaves])
    tok = t.transpose(1, 2)
    img = tok.unflatten(1, (x.shape[2], x.shape[3])).permute(0, 3, 1, 2)
    assert img.shape == x.shape
    _same(img, [c.detach() for c in leaves])
    _grads_agree(t.unflatten(2, (x.shape[2], x.shape[3])).flatten(2), [c.flatten(1) for c in leaves], leaves)


def test_flatten_square_and_three_ragged_dims():
    """A square batch flattens to j_t (t_i = n_i²); three ragged dims flatten in part (the
    remaining ragged dim keeps its nested int) or in full, and back."""
    leaves, sq = _batch([(2, 3, 3), (2, 0, 0), (2, 2, 2)], (2, 3))
    t = sq.flatten(2)
    assert t.sizes().tolist() == [[9], [0], [4]]
    assert t.unflatten(2, (sq.shape[2], sq.shape[3])).shape == sq.shape
    shapes = [(3, 1, 2, 2), (1, 0, 2, 2), (2, 2, 1, 2)]
    leaves, cube = _batch(shapes, (1, 2, 3))  # (B, j0, j1, j2, C)
    a = cube.flatten(2, 3)  # (B, j0, j12, C)
    assert a.shape[1] == cube.shape[1] and a.ragged_dims == (1, 2)
    _same(a, [c.detach().flatten(1, 2) for c in leaves])
    b = a.unflatten(2, (cube.shape[2], cube.shape[3]))
    assert b.shape == cube.shape
    _same(b, [c.detach() for c in leaves])
    whole = cube.flatten(1, 3)
    assert whole.sizes().tolist() == [[6], [0], [4]]  # = [3·1·2, 1·0·2, 2·2·1]
    _same(whole, [c.detach().flatten(0, 2) for c in leaves])
    assert whole.unflatten(1, (cube.shape[1], cube.shape[2], cube.shape[3])).shape == cube.shape


@few(10)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4), st.integers(1, 3), seeds,
       st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_flatten_unflatten_random(sides, d, seed, dtype):
    shapes = [(d, h, w) for h, w in sides]
    leaves, x = _batch(shapes, (2, 3), seed, dtype)
    t = x.flatten(2)
    _same(t, [c.detach().flatten(1) for c in leaves])
    _grads_agree(t, [c.detach().flatten(1) for c in leaves], leaves, seed)
    back = t.transpose(1, 2).unflatten(1, (x.shape[2], x.shape[3]))
    _same(back, [c.detach().permute(1, 2, 0) for c in leaves])


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_flatten_without_grad(ctx):
    leaves, x = _batch([(4, 3, 2), (4, 0, 5)], (2, 3))
    with ctx():
        t = x.flatten(2)
        assert not t.requires_grad
        _same(t, [c.detach().flatten(1) for c in leaves])
        assert t.unflatten(2, (x.shape[2], x.shape[3])).shape == x.shape


def test_flatten_no_leakage():
    comps = comps_for([(2, 2, 3), (2, 1, 1), (2, 3, 2)], 1)
    other = [c.clone() for c in comps]
    other[1] = other[1] - 3
    a = mj.nested_tensor(comps, ragged_dims=(2, 3)).flatten(2).unbind()
    b = mj.nested_tensor(other, ragged_dims=(2, 3)).flatten(2).unbind()
    assert bit_equal(a[0], b[0]) and bit_equal(a[2], b[2]) and not bit_equal(a[1], b[1])


def test_flatten_double_backward():
    comps = comps_for([(2, 2, 3), (2, 0, 2), (2, 3, 1)], 2)
    v, off, sizes = packed_args(comps, (2, 3))
    v.requires_grad_()

    def f(values):
        t = mj.from_packed(values, off, sizes, (2, 3)).flatten(2).transpose(1, 2)
        return (t * t).transpose(1, 2).unflatten(2, (-1, -1)).values()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.autograd.gradgradcheck(f, (v,), fast_mode=True)


def test_flatten_errors_name_the_op():
    _, x = _batch([(4, 3, 2), (4, 0, 5)], (2, 3))
    with pytest.raises(StructureError, match=r"flatten\(\): only static dims or consecutive ragged dims"):
        x.flatten(1, 2)  # a static and a ragged dim
    with pytest.raises(StructureError, match=r"flatten\(\)"):
        x.flatten(0, 2)  # the batch dim with some of the ragged dims (all of them: test_flatten_batch.py)
    t = x.flatten(2)
    with pytest.raises(StructureError, match=r"unflatten\(\): ragged dim 2 .* flattened from ragged sizes"):
        t.unflatten(2, (3, -1))
    _, seq = _batch([(3, 4), (2, 4)], (1,))
    with pytest.raises(StructureError, match=r"unflatten\(\): cannot split ragged dim 1 .* not made by flattening ragged"):
        seq.unflatten(1, (seq.shape[1], seq.shape[1]))
    with pytest.raises(StructureError):
        x.view(2, 4, 7)  # not a merge: the ordinary view error


def test_flatten_of_ragged_dims_is_eager_only_under_compile():
    """Merging two extents builds a new one from host lengths: a clear error under fullgraph; the
    tokens themselves (made eagerly) go through a compiled region."""
    _, x = _batch([(4, 3, 2), (4, 1, 5)], (2, 3))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="torch.compile cannot trace"):
        torch.compile(lambda t: t.flatten(2) * 2, fullgraph=True, backend="aot_eager")(x.detach())
    tok = x.detach().flatten(2).transpose(1, 2)
    torch._dynamo.reset()
    out = torch.compile(lambda t: (t * 2).sum(1), fullgraph=True, backend="aot_eager")(tok)
    torch.testing.assert_close(out, torch.stack([c.detach().flatten(1).sum(1) * 2 for c in x.unbind()]))


# ----------------------------------------------------------------------------- NaViT
def _attention_ref(tok, heads):
    n, d = tok.shape
    q = tok.view(n, heads, d // heads).transpose(0, 1)
    return F.scaled_dot_product_attention(q, q, q).transpose(0, 1).reshape(n, d)


def test_navit_patchify_flatten_attention_unflatten():
    """Variable-size images → patchify (conv2d, stride p) → tokens (B, j_t, D) → SDPA over
    (B, H, j_t, d) → back to (B, D, j_h, j_w); per image equal to the dense pipeline, gradients
    to the images and the patch weights."""
    p, dim, heads = 4, 8, 2
    g = torch.Generator().manual_seed(0)
    imgs = [torch.randn(3, h * p, w * p, generator=g, dtype=D).requires_grad_() for h, w in [(3, 4), (2, 2), (1, 5), (2, 1)]]
    weight = torch.randn(dim, 3, p, p, generator=g, dtype=D).requires_grad_()
    x = mj.as_nested_tensor(imgs, ragged_dims=(2, 3))
    try:
        patches = F.conv2d(x, weight, stride=p)  # (B, D, j_h, j_w)
    except (NotImplementedError, StructureError):
        pytest.skip("conv2d over ragged spatial dims not available")
    tok = patches.flatten(2).transpose(1, 2)  # (B, j_t, D)
    b, t = tok.shape[0], tok.shape[1]
    q = tok.reshape(b, t, heads, dim // heads).transpose(1, 2)  # (B, H, j_t, d)
    o = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(b, t, dim)
    out = o.transpose(1, 2).unflatten(2, (patches.shape[2], patches.shape[3]))  # (B, D, j_h, j_w)
    assert out.shape == patches.shape
    ref_imgs = [i.detach().clone().requires_grad_() for i in imgs]
    ref_w = weight.detach().clone().requires_grad_()
    expected = []
    for im in ref_imgs:
        pt = F.conv2d(im.unsqueeze(0), ref_w, stride=p)[0]  # (D, h, w)
        expected.append(_attention_ref(pt.flatten(1).T, heads).T.reshape(pt.shape))
    for i, (a, e) in enumerate(zip(out.unbind(), expected)):
        torch.testing.assert_close(a, e, msg=lambda m: f"image {i}: {m}")
    cots = [torch.randn(e.shape, generator=g, dtype=D) for e in expected]
    gm = torch.autograd.grad(sum((a * c).sum() for a, c in zip(out.unbind(), cots)), [*imgs, weight])
    gr = torch.autograd.grad(sum((e * c).sum() for e, c in zip(expected, cots)), [*ref_imgs, ref_w])
    for k, (a, e) in enumerate(zip(gm, gr)):
        torch.testing.assert_close(a, e, msg=lambda m: f"grad {k}: {m}")


def test_navit_tokens_from_a_nested_tensor():
    """The same pipeline on patch features built directly ``(B, D, j_h, j_w)`` (no conv)."""
    heads, dim = 2, 6
    g = torch.Generator().manual_seed(1)
    feats = [torch.randn(dim, h, w, generator=g, dtype=D).requires_grad_() for h, w in [(3, 2), (0, 4), (2, 2)]]
    x = mj.as_nested_tensor(feats, ragged_dims=(2, 3))
    tok = x.flatten(2).transpose(1, 2)
    b, t = tok.shape[0], tok.shape[1]
    q = tok.reshape(b, t, heads, dim // heads).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(b, t, dim)
    out = o.transpose(1, 2).unflatten(2, (x.shape[2], x.shape[3]))
    assert out.shape == x.shape
    for i, (a, f) in enumerate(zip(out.unbind(), feats)):
        if f.shape[1] * f.shape[2] == 0:
            assert a.numel() == 0
            continue
        torch.testing.assert_close(a, _attention_ref(f.detach().flatten(1).T, heads).T.reshape(f.shape))
    out.values().sum().backward()
    assert all(f.grad is not None and f.grad.shape == f.shape for f in feats)


def test_flatten_of_ragged_dims_between_compiled_ops_is_a_graph_break():
    """Without fullgraph, merging ragged dims (flatten, reshape/view to the merge) between
    compiled ops breaks the graph there and runs eagerly (NOTE [ Eager-only routes ]); a flatten
    of static dims stays compiled. Results and gradients (input and weights) equal eager, over
    batches of different sizes with an empty image."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(3, 3, 3, 3, dtype=D, generator=g, requires_grad=True)
    w2 = torch.randn(4, 6, dtype=D, generator=g, requires_grad=True)

    def f(t):
        y = F.conv2d(t, w1, padding=1) * 2 + 1  # (B, 3, j_h, j_w)
        a = y.flatten(2)  # (B, 3, j_t)
        y = a + y.reshape(y.shape[0], 3, -1) * 2 + y.view(y.shape[0], 3, a.shape[2])
        y = torch.cat([y, y * y], 1).transpose(1, 2)  # (B, j_t, 6)
        return (y @ w2.t()).unsqueeze(2).flatten(2, 3) * 2 + 1  # a static flatten: compiled

    cf = torch.compile(f, backend="aot_eager")
    for seed, sides in enumerate(([(4, 5), (3, 3), (0, 2)], [(5, 5), (6, 3), (2, 4), (1, 1)])):
        comps = comps_for([(3, h, w) for h, w in sides], seed)
        x1, x2 = (mj.nested_tensor(comps, ragged_dims=(2, 3), requires_grad=True) for _ in range(2))
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out.values(), ref.values())
        got = torch.autograd.grad(out.values().sum(), [x1, w1, w2])
        want = torch.autograd.grad(ref.values().sum(), [x2, w1, w2])
        torch.testing.assert_close(got[0].values(), want[0].values())
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b)


def test_unflatten_after_a_compiled_region_between_flatten_and_unflatten():
    """A compiled block between ``flatten`` and ``unflatten`` (the NaViT encoder) returns tokens
    whose ragged dim still knows the dims it was flattened from (NOTE [ Extents across a compiled
    region ]): ``unflatten`` restores the image nested ints, with eager's values and gradients."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, dtype=D, generator=g, requires_grad=True)
    block = torch.compile(lambda t: (t.transpose(1, 2) @ w.t()).relu().transpose(1, 2), backend="aot_eager", fullgraph=True)
    for seed, sides in enumerate(([(4, 5), (3, 3), (0, 2)], [(5, 5), (6, 3), (2, 4), (1, 1)])):
        leaves, x = _batch([(3, h, w_) for h, w_ in sides], (2, 3), seed)
        h, wd = x.shape[2], x.shape[3]
        out = block(x.flatten(2)).unflatten(2, (h, wd))
        assert out.shape[2] == h and out.shape[3] == wd
        buf = io.BytesIO()
        torch.save(x, buf)  # the compiled region left nothing on x that pickling refuses
        buf.seek(0)
        assert bit_equal(torch.load(buf).values(), x.values())
        ref = [(c.flatten(1).t() @ w.t()).relu().t().unflatten(1, c.shape[1:]) for c in leaves]
        for i, (o, r) in enumerate(zip(out.unbind(), ref)):
            torch.testing.assert_close(o, r, msg=f"sample {i}")
        cots = [torch.randn(r.shape, generator=g, dtype=D) for r in ref]
        got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cots)), [*leaves, w])
        want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(ref, cots)), [*leaves, w])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("spelling", ["view", "reshape", "unflatten"])
def test_split_of_a_token_dim_under_compile_is_a_graph_break(spelling):
    """Splitting a token dim back into image dims inside a compiled function, with nested ints
    read from an input's shape: a graph break (the split runs eagerly, equal to eager), and under
    fullgraph an error naming the op."""
    leaves, x = _batch([(4, 3, 2), (4, 1, 5), (4, 0, 2)], (2, 3))
    split = {
        "view": lambda t, h, w: t.view(t.shape[0], 4, h, w),
        "reshape": lambda t, h, w: t.reshape(-1, 4, h, w),
        "unflatten": lambda t, h, w: t.unflatten(2, (h, w)),
    }[spelling]

    def f(img, tok):
        return split(tok * 2, img.shape[2], img.shape[3]) + img

    tok = x.flatten(2)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's own notes on the break
        out = torch.compile(f, backend="aot_eager")(x, tok)
    assert out.shape[2] == x.shape[2] and out.shape[3] == x.shape[3]
    _same(out, [c * 3 for c in leaves])
    torch._dynamo.reset()
    with pytest.raises(Exception, match=rf"{'view' if spelling == 'view' else spelling}\(\): .*torch.compile cannot trace"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(x, tok)


@pytest.mark.parametrize("grad", [False, True])
def test_static_regrouping_beside_ragged_spatial_dims_compiles_fullgraph(grad):
    """Splitting or merging *static* dims of ``(B, C, j_h, j_w)`` (channel groups) is no ragged
    split: under ``fullgraph=True`` it stays in the graph, by every spelling, and its gradients
    equal eager's (autograd on the packed values: the wrapper's own view backward would multiply
    the two ragged sizes while AOT traces it)."""

    def f(t):
        a = t.unflatten(1, (2, 3)).sin().flatten(1, 2)
        b = t.view(t.shape[0], 2, 3, t.shape[2], t.shape[3]).reshape(t.shape[0], 6, t.shape[2], -1)
        return a * b

    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    for seed, sides in enumerate(([(5, 2), (2, 4), (0, 3)], [(3, 3), (1, 6)])):
        leaves, x = _batch([(6, h, w) for h, w in sides], (2, 3), seed)
        if not grad:
            x = x.detach()
        out = cf(x)
        _same(out, [c.detach().sin() * c.detach() for c in leaves])
        if grad:
            cots = [torch.randn(c.shape, dtype=D) for c in leaves]
            got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cots)), leaves)
            want = torch.autograd.grad(sum((f_ * c).sum() for f_, c in zip((l.sin() * l for l in leaves), cots)), leaves)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- a ragged dim with static dims
@few(10)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.sampled_from([(2,), (3,), (2, 2)]),
       st.sampled_from(["seq", "lead", "pair"]), seeds)
def test_last_ragged_dim_with_static_dims_per_sample(ns, k, kind, seed):
    """``(B, j0, k…, C).flatten(1, 1 + len(k))`` is each sample's ``flatten``: ``nᵢ·Πk`` rows; the
    way back (``unflatten`` with ``-1`` or the nested int, a ``view``) restores the nested int.
    Also with a static dim before the ragged one (a copy) and on a square pair's last dim."""
    g = torch.Generator().manual_seed(seed)
    lead = {"seq": (), "lead": (2,), "pair": ()}[kind]
    ragged_dims = {"seq": (1,), "lead": (2,), "pair": (1, 2)}[kind]
    comps = [torch.randn(*lead, *((n, n) if kind == "pair" else (n,)), *k, 3, dtype=D, generator=g).requires_grad_()
             for n in ns]
    x = mj.as_nested_tensor(comps, ragged_dims=ragged_dims)
    d = ragged_dims[-1]
    y = x.flatten(d, d + len(k))
    assert y.ragged_dims == ragged_dims and (y.shape[d] is not x.shape[d] or not any(ns))  # (0·k = 0: the same sizes)
    refs = [c.flatten(d - 1, d - 1 + len(k)) for c in comps]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    for spelled in (x.reshape(*x.shape[:d], -1, 3), x.reshape(*x.shape[:d], x.shape[d] * math.prod(k), 3)):
        assert spelled.shape[d] is y.shape[d]
    back = y.unflatten(d, (-1, *k))
    assert back.shape[d] is x.shape[d]
    assert y.unflatten(d, (x.shape[d], *k)).shape[d] is x.shape[d]
    if kind != "lead":
        assert y.view(*x.shape).shape[d] is x.shape[d]
    cot = [torch.randn_like(r) for r in refs]
    got = torch.autograd.grad(sum((a * w).sum() for a, w in zip(back.flatten(d, d + len(k)).unbind(), cot)), comps)
    want = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, cot)), comps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_split_a_ragged_dim_into_static_parts():
    _, x = _batch([(4, 3), (2, 3), (0, 3)], (1,))
    y = x.unflatten(1, (-1, 2))  # a new nested int, each sample's (nᵢ / 2, 2, 3)
    assert y.ragged_dims == (1,) and y.shape[2] == 2
    for a, c in zip(y.unbind(), x.unbind()):
        torch.testing.assert_close(a, c.unflatten(0, (-1, 2)))
    assert y.flatten(1, 2).shape[1] is x.shape[1]  # and back to the original nested int
    assert x.view(3, -1, 2, 3).shape[1] is y.shape[1]
    flat = x.view(3, -1)  # each sample's elements in a row: (B, j) with 3·nᵢ
    for a, c in zip(flat.unbind(), x.unbind()):
        torch.testing.assert_close(a, c.reshape(-1))
    assert x.reshape(3, -1, 3).shape[1] is x.shape[1]  # a -1 that can be the ragged dim is the ragged dim
    with pytest.raises(RuntimeError, match=r"unflatten\(\): sample 0 of \(2, j\d+, 3\) has 3 elements along ragged dim 1, which is not a multiple of 2"):
        _batch([(3, 3), (2, 3)], (1,))[1].unflatten(1, (-1, 2))
    with pytest.raises(StructureError, match=r"unflatten\(\): ragged dim 1 .* splits into"):
        x.unflatten(1, (x.shape[1], 2))  # the part is another nested int


def test_unflatten_a_ragged_dim_into_a_static_part_first():
    """``flat.unflatten(1, (S, -1))`` of documents flattened from ``(B, S, j0, C)`` (or of any ragged
    dim whose every sample holds a multiple of S) splits each sample as its dense ``unflatten``:
    ``(S, nᵢ, C)``, with gradients; a sample that does not divide raises naming it."""
    leaves, doc = _batch([(3, 4, 2), (3, 0, 2), (3, 5, 2)], (2,))
    flat = doc.flatten(1, 2)
    back = flat.unflatten(1, (3, -1))
    assert back.ragged_dims == (2,) and back.shape[1] == 3
    _same(back, [t.detach() for t in leaves])
    _grads_agree(back, [t.flatten(0, 1).unflatten(0, (3, -1)) for t in leaves], leaves)
    _, seq = _batch([(4, 3), (2, 3)], (1,))
    with pytest.raises((RuntimeError, StructureError), match="sample"):
        seq.unflatten(1, (4, -1))


@pytest.mark.parametrize("op", ["reshape", "view"])
def test_a_ragged_size_times_a_factor_of_the_next_static_dim(op):
    """openfold3's per-atom logits: ``(B, N, A·C)`` as ``(B, A·N, C)`` with ``N = x.shape[1]`` — the
    static dim split into ``(A, C)`` and ``A`` merged into the ragged dim, each sample's dense
    ``reshape`` (``(n, 15) → (3n, 5)``), with gradients; a factor that does not divide raises."""
    leaves, x = _batch([(3, 15), (0, 15), (2, 15)], (1,))
    b, n = x.shape[0], x.shape[1]
    out = getattr(x, op)(b, n * 3, 5)
    _same(out, [t.detach().reshape(t.shape[0] * 3, 5) for t in leaves])
    _grads_agree(getattr(x, op)(b, n * 3, 5), [t.reshape(t.shape[0] * 3, 5) for t in leaves], leaves)
    with pytest.raises((StructureError, RuntimeError)):
        getattr(x, op)(b, n * 4, -1)


def test_swin_window_partition_and_reverse_round_trip():
    """Swin's ``window_partition`` (windows of every image as one flat batch) and
    ``window_reverse`` (``view(B, H // w, W // w, w, w, -1)``, permute, ``view(B, H, W, -1)``: the
    -1 standing for the channels) give each image back, with gradients."""
    w = 4
    leaves, x = _batch([(8, 12, 3), (4, 4, 3), (0, 8, 3)], (1, 2))
    b, h, wd, c = x.shape

    def partition(t):
        return t.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, w, w, c)

    def reverse(wins):
        return wins.view(b, h // w, wd // w, w, w, -1).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, wd, -1)

    out = reverse(partition(x) * 2)
    _same(out, [2 * t.detach() for t in leaves])
    _grads_agree(reverse(partition(x)), list(leaves), leaves)  # the identity: each cotangent back


def test_packed_qkv_reshape_with_the_head_size_left_to_minus_one():
    """``qkv.reshape(B, N, 3, H, -1)`` (BEiT's attention): the ragged dim named by its own nested
    int stays whole and the -1 is the head size — not a split of the ragged dim into (N, 3, H)."""
    leaves, x = _batch([(3, 24), (1, 24), (0, 24), (4, 24)], (1,))
    b, n, _ = x.shape
    for out in (x.reshape(b, n, 3, 2, -1), x.view(b, n, 3, 2, -1), x.reshape(b, -1, 3, 2, 4)):
        assert out.shape[1] is n and tuple(out.shape[2:]) == (3, 2, 4)
        _same(out, [t.detach().reshape(t.shape[0], 3, 2, 4) for t in leaves])
    _grads_agree(x.reshape(b, n, 3, 2, -1), [t.reshape(t.shape[0], 3, 2, 4) for t in leaves], leaves)


@pytest.mark.parametrize("lengths", [(0, 0), "no samples", (2, 0, 1)])
def test_heads_merged_back_keep_the_ragged_dim_when_every_sample_is_empty(lengths):
    """``attn_output.reshape(*x.shape[:2], -1)`` (every Hugging Face attention module) regroups the
    static dims after the ragged one, also where every sample is empty or the batch has none:
    there the merged sizes ``n·H`` equal the ragged dim's own, and reading the size as that merge
    gave the head size as the width."""
    if lengths == "no samples":
        leaves, x = _batch([(2, 4, 8), (1, 4, 8)], (1,))
        leaves, x = [], x[:0]
    else:
        leaves, x = _batch([(n, 4, 8) for n in lengths], (1,))
    b, n = x.shape[:2]
    for out in (x.reshape(b, n, -1), x.view(b, n, -1), x.reshape(b, n, 32)):
        assert out.shape[1] is n and out.shape[2] == 32
        _same(out, [t.detach().reshape(t.shape[0], 32) for t in leaves])
    assert x.reshape(b, n, -1).sum(1).shape == (b, 32)


def test_frames_stacked_by_floor_division_of_the_ragged_size():
    """``x.reshape(B, T // k, k * C)`` / ``x.view(B, T // k, k, C)`` (speech encoders stacking k
    frames): each sample's ``reshape(t // k, …)``, gradients included; a sample whose length
    ``k`` does not divide raises, as dense torch's reshape does."""
    leaves, x = _batch([(4, 3), (2, 3), (0, 3), (6, 3)], (1,))
    b, t, c = x.shape
    for out, shape in ((x.reshape(b, t // 2, 2 * c), (-1, 6)), (x.view(b, t // 2, 2, c), (-1, 2, 3)),
                       (x.reshape(b, t // 2, -1), (-1, 6))):
        _same(out, [leaf.detach().reshape(leaf.shape[0] // 2, *shape[1:]) for leaf in leaves])
    _grads_agree(x.reshape(b, t // 2, 2 * c), [leaf.reshape(leaf.shape[0] // 2, 6) for leaf in leaves], leaves)
    _, odd = _batch([(3, 3), (2, 3)], (1,))
    with pytest.raises(RuntimeError, match="not a multiple of 2"):
        odd.reshape(2, odd.shape[1] // 2, 6)


def test_merge_with_a_static_dim_before_the_ragged_one_is_a_copy():
    _, x = _batch([(2, 3, 2, 4), (2, 1, 2, 4)], (2,))
    with pytest.raises(RuntimeError, match=r"view\(\): cannot view .* use .reshape"):
        x.view(2, 2, -1, 4)
    y = x.flatten(1, 2)  # a static dim with the ragged dim after it: each sample's elements regrouped, a copy
    assert all(torch.equal(a, c.flatten(0, 1)) for a, c in zip(y.unbind(), x.unbind()))


def test_sew_upsampling_channels_to_sequence_length():
    """SEW's upsampling: a projection to ``k·C`` features, ``reshape(B, n, k, C)``, then
    ``reshape(B, n * k, C)`` with the size computed from the nested int."""
    comps = [torch.randn(n, 4, dtype=D, requires_grad=True) for n in (3, 0, 2)]
    w = torch.randn(8, 4, dtype=D, requires_grad=True)

    def up(h):
        h = F.gelu(F.linear(h, w))
        b, n, c = h.size()
        return h.reshape(b, n, 2, c // 2).reshape(b, n * 2, c // 2)

    x = mj.as_nested_tensor(comps)
    y = up(x)
    refs = [up(c.unsqueeze(0))[0] for c in comps]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    got = torch.autograd.grad(sum(a.pow(2).sum() for a in y.unbind()), comps + [w])
    want = torch.autograd.grad(sum(r.pow(2).sum() for r in refs), comps + [w])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_product_of_ragged_sizes_names_the_flattened_dim():
    """``B, C, H, W = x.shape; x.view(B, C, H * W)`` (global-context attention, ``einops``-free
    patch tokens): the product of two ragged sizes is the nested int of those dims flattened —
    the one ``flatten`` gives, in any grouping of three — with each sample's ``h·w`` elements;
    multiples keep their factor, and sizes of batches of different sizes do not multiply."""
    leaves, x = _batch([(4, 3, 2), (4, 0, 5), (4, 2, 2)], (2, 3))
    b, c, h, w = x.shape
    assert h * w == x.flatten(2).shape[2] and (h * w) * 2 == 2 * x.flatten(2).shape[2]
    expected = [t.flatten(1) for t in leaves]
    for out in (x.view(b, c, h * w), x.reshape(b, c, h * w), x.reshape(b, c, w * h).view(b, c, h, w).flatten(2)):
        _same(out, expected)
    _grads_agree(x.view(b, c, h * w), expected, leaves)
    sq_leaves, sq = _batch([(3, 3, 2), (0, 0, 2), (2, 2, 2)], (1, 2))
    _, n, m, _ = sq.shape
    assert n is m and n * n == sq.flatten(1, 2).shape[1]
    _same(sq.reshape(3, n * n, 2), [t.flatten(0, 1) for t in sq_leaves])
    cube_leaves, cube = _batch([(3, 1, 2, 2), (1, 0, 2, 2), (2, 2, 1, 2)], (1, 2, 3))
    _, d0, d1, d2, _ = cube.shape
    assert d0 * d1 * d2 == d0 * (d1 * d2) == cube.flatten(1, 3).shape[1]
    _same(cube.view(3, d0 * d1 * d2, 2), [t.flatten(0, 2) for t in cube_leaves])
    _, other = _batch([(3, 2), (1, 2)], (1,))
    with pytest.raises(ValueError, match="unsupported"):
        h * other.shape[1]  # a batch of two against one of three: no per-sample product


def test_flatten_or_unflatten_with_a_static_regrouping_in_one_view():
    """One ``reshape`` that flattens the spatial dims and regroups the channels (EfficientViT's
    ``(B, C, H, W) → (B, -1, 3·d, H·W)``; MobileNetV4's ``(B, h·k, H, W) → (B, h, k, -1)``, the
    ``-1`` standing for ``H·W``) and one that undoes both (``(B, h, k, H·W) → (B, -1, H, W)``):
    per sample, gradients included; the ``-1`` absorbs the one span of ragged dims that fits."""
    leaves, x = _batch([(6, 3, 2), (6, 0, 5), (6, 2, 2)], (2, 3))
    b, c, h, w = x.shape
    _same(x.reshape(b, -1, 3, h * w), [t.reshape(2, 3, t.shape[1] * t.shape[2]) for t in leaves])
    _same(x.view(b, 2, 3, -1), [t.reshape(2, 3, -1) for t in leaves])
    grouped = x.reshape(b, 2, 3, w * h)
    _same(grouped, [t.reshape(2, 3, -1) for t in leaves])
    back = grouped.reshape(b, -1, h, w)
    assert back.shape == x.shape
    _same(back, [t.detach() for t in leaves])
    _grads_agree(x.reshape(b, 2, 3, -1), [t.reshape(2, 3, -1) for t in leaves], leaves)
    cube_leaves, cube = _batch([(2, 3, 1, 2, 2), (2, 1, 0, 2, 2)], (2, 3, 4))
    _same(cube.reshape(2, 1, 2, -1, 2), [t.detach().reshape(1, 2, t.shape[1] * t.shape[2] * t.shape[3], 2) for t in cube_leaves])


def test_floor_division_of_a_ragged_size_is_per_sample():
    """``H // s`` (a query stride, a pooled grid): each sample's size floor-divided, one nested int
    per divisor (``H // 1`` is ``H``'s); other arithmetic (two ragged sizes, a remainder that
    differs per sample) still raises the ragged-size error."""
    _, x = _batch([(2, 5, 3), (2, 4, 4), (2, 0, 1)], (2, 3))
    h = x.shape[2]
    assert h // 1 == h and (h // 2) == (h // 2) and (h // 2) != h
    assert extent_of(h // 2).host_lengths().tolist() == [5 // 2, 4 // 2, 0 // 2]
    assert h - h == 0  # a size minus itself: every sample's 0
    assert (2 * h) // 2 is not None and bool((2 * h) // 2 == h)  # each sample's multiple divided back
    for bad in (lambda: h // 0, lambda: h % 2, lambda: h % h, lambda: h - x.shape[3]):
        with pytest.raises((TypeError, ValueError, ZeroDivisionError)):
            bad()


@pytest.mark.parametrize("method", ["view_as", "reshape_as"])
def test_view_as_back_to_images_after_flattening(method):
    """``y = x.flatten(2)…; y.view_as(x)`` (non-local / global-context blocks): back to each image's
    ``(H, W)``, with gradients, as ``y.view(B, C, H, W)``."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in ((4, 5), (2, 6), (1, 1))]
    x = mj.nested_tensor(comps, requires_grad=True)
    y = getattr(x.flatten(2).softmax(-1), method)(x)
    leaves = [c.clone().requires_grad_() for c in comps]
    ref = [getattr(c.flatten(1).softmax(-1), method)(c) for c in leaves]
    assert y.shape == x.shape
    for a, b in zip(y.unbind(), ref):
        torch.testing.assert_close(a, b)
    w = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in ref]
    gx, = torch.autograd.grad((y * mj.nested_tensor(w)).sum(), x)
    for a, b in zip(gx.unbind(), torch.autograd.grad(sum((r * wi).sum() for r, wi in zip(ref, w)), leaves)):
        torch.testing.assert_close(a, b)



def test_image_patches_by_splitting_both_ragged_dims():
    """ViT patchify as einops writes it: ``reshape(B, C, H // p, p, W // p, p)`` splits both
    ragged dims into parts and static factors (a gather), ``permute`` + ``reshape`` give the
    tokens ``(B, (h w), p·p·C)``, and the inverse (``(h p1) (w p2)``) gives the images back —
    per sample, with gradients; a side that ``p`` does not divide raises as dense."""
    einops = pytest.importorskip("einops")
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in ((8, 12), (12, 4), (4, 4))]
    im = mj.nested_tensor(comps, requires_grad=True)
    B, C, H, W = im.shape
    p = 4
    y = im.reshape(B, C, H // p, p, W // p, p)
    assert y._ragged_dims == (2, 4) and bool(y.shape[2] == H // p)
    for a, c in zip(y.unbind(), comps):
        torch.testing.assert_close(a, c.reshape(C, c.shape[1] // p, p, c.shape[2] // p, p))
    torch.testing.assert_close(y.reshape(B, C, H, W).values(), im.values())  # back, by the nested ints
    w = torch.randn(p * p * C, p * p * C, generator=g, dtype=torch.float64)
    tok = einops.rearrange(im, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p) @ w
    back = einops.rearrange(tok, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", h=H // p, p1=p, p2=p)
    assert bool(back.shape[2] == H) and bool(back.shape[3] == W)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [einops.rearrange(einops.rearrange(c[None], "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p) @ w,
                             "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", h=c.shape[1] // p, p1=p, p2=p)[0] for c in leaves]
    for a, r in zip(back.unbind(), refs):
        torch.testing.assert_close(a, r)
    got, = torch.autograd.grad((back * back).sum(), im)
    for a, r in zip(got.unbind(), torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)):
        torch.testing.assert_close(a, r)
    with pytest.raises(RuntimeError, match="not a multiple of 8"):
        im.reshape(B, C, H // 8, 8, W)
    with pytest.raises(NotImplementedError, match="split of ragged dims"):
        y.zero_()  # a copy, as a reordering of ragged dims is


def test_floor_division_names_the_split_part_and_quotients_of_products():
    """``L // 16`` names the part that ``reshape(B, C, L // 16, 16)`` makes (one nested int), and
    ``(H * W) // W`` is ``H`` (einops recovering an axis of a flattened one)."""
    x = mj.nested_tensor([torch.randn(3, 64), torch.randn(3, 128)])
    B, C, L = x.shape
    n = L // 16
    y = x.reshape(B, C, n, 16)
    assert bool(y.shape[2] == n)  # one nested int
    z = y.permute(0, 2, 3, 1).reshape(B, n, 16 * C)
    assert bool(z.shape[1] == n)
    im = mj.nested_tensor([torch.randn(2, 4, 6), torch.randn(2, 6, 4)])
    _, _, H, W = im.shape
    flat = im.flatten(2).shape[2]
    assert bool(flat // W == H) and bool(flat // H == W)
    with pytest.raises(TypeError, match="nested int"):
        x.shape[2] // W  # not a factor of it


@pytest.mark.parametrize("lens", [(0,), (0, 0), (0, 4), (2, 0, 6)])
def test_floor_division_of_empty_samples_is_its_own_size(lens):
    """``T // 2`` of a batch whose samples are all empty has ``T``'s sizes (zeros) but is another
    quantity: ``reshape(B, T // 2, 2 * C)`` regroups as each sample's dense reshape does, and a
    patchify of empty images too."""
    xs = [torch.arange(n * 6, dtype=torch.float64).view(n, 6) for n in lens]
    x = mj.nested_tensor(xs)
    B, T, C = x.shape
    y = x.reshape(B, T // 2, 2 * C)
    for a, c in zip(y.unbind(), xs):
        assert torch.equal(a, c.reshape(c.shape[0] // 2, 2 * C))
    ims = [torch.randn(3, h, 8) for h in (0,) * len(lens)]
    im = mj.nested_tensor(ims, ragged_dims=(2, 3))
    B, C, H, W = im.shape
    p = im.reshape(B, C, H // 4, 4, W // 4, 4)
    assert [t.shape for t in p.unbind()] == [c.reshape(3, 0, 4, 2, 4).shape for c in ims]


@pytest.mark.parametrize("sides", [((1, 5), (1, 3)), ((1, 1), (1, 1)), ((0, 4),), ((3, 1), (2, 1))])
def test_tokens_back_to_images_whose_flat_sizes_equal_a_side(sides):
    """``x.flatten(2).transpose(1, 2)`` then ``.transpose(1, 2).reshape(B, C, H, W)`` (and
    ``view_as``): where each image's ``H·W`` equals its ``W`` (one pixel high) or its ``H``, the
    named sizes are the factors of the flattened dim, not another name for it; a square pair's
    ``flatten(1, 2)`` likewise goes back to ``(B, N, N, C)``."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in sides]
    x = mj.nested_tensor(comps, ragged_dims=(2, 3), requires_grad=True)
    B, C, H, W = x.shape
    t = x.flatten(2).transpose(1, 2) * 2
    for back in (t.transpose(1, 2).reshape(B, C, H, W), t.transpose(1, 2).contiguous().view_as(x)):
        assert back._ragged_dims == (2, 3)
        for a, c in zip(back.unbind(), comps):
            torch.testing.assert_close(a, c * 2)
    got, = torch.autograd.grad(t.transpose(1, 2).reshape(B, C, H, W).sum(), x)
    for a, c in zip(got.unbind(), comps):
        torch.testing.assert_close(a, torch.full_like(c, 2.0))
    pairs = [torch.randn(n, n, 4, generator=g) for n, _ in sides]
    z = mj.nested_tensor(pairs, ragged_dims=(1, 2))
    B, N, _, Cz = z.shape
    for a, c in zip(z.flatten(1, 2).reshape(B, N, N, Cz).unbind(), pairs):
        assert torch.equal(a, c)


def test_slices_and_expand_by_one_times_a_ragged_size():
    """``1 * n`` is ``n`` itself (einops' ``unpack`` slices ``y[:, 0 : 1 * n]``)."""
    einops = pytest.importorskip("einops")
    xs = [torch.randn(n, 8) for n in (3, 0, 5)]
    x = mj.nested_tensor(xs)
    n = x.shape[1]
    assert (1 * n) is not n and extent_of(1 * n) is extent_of(n)
    assert torch.equal(x[:, : 1 * n].values(), x.values())
    assert x.expand(3, 1 * n, 8).shape[1] is not None
    reg = torch.randn(3, 4, 8)
    y, ps = einops.pack([x, reg], "b * d")
    x2, r2 = einops.unpack(y, ps, "b * d")
    assert all(torch.equal(a, b) for a, b in zip(x2.unbind(), xs)) and torch.equal(r2, reg)


@pytest.mark.parametrize("pattern", ["b c (p1 h) (p2 w) -> b h w p1 p2 c", "b c (h p1) (p2 w) -> b (h w) (p1 p2 c)",
                                     "b c (p1 h) w -> b h p1 w c"])
def test_grids_with_the_factor_outside_the_part(pattern):
    """``'(p1 h)'`` (MaxViT's grid, CrossFormer's long-distance groups): the ragged dim split into
    ``(p, H // p)`` — the factor before the part — and merged back by the inverse pattern, per
    sample, with gradients."""
    einops = pytest.importorskip("einops")
    g = torch.Generator().manual_seed(1)
    comps = [torch.randn(2, h, w, generator=g, dtype=torch.float64) for h, w in ((8, 12), (4, 8), (12, 4))]
    im = mj.nested_tensor(comps, requires_grad=True)
    k = {"p1": 4, "p2": 4} if "p2" in pattern else {"p1": 4}
    y = einops.rearrange(im, pattern, **k)
    lhs, rhs = pattern.split(" -> ")
    h = {"h": im.shape[2] // 4}
    back = einops.rearrange(y, f"{rhs} -> {lhs}", **k, **({"h": h["h"]} if "(h w)" in rhs else {}))
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [einops.rearrange(c[None], pattern, **k)[0] for c in leaves]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    for a, c in zip(back.unbind(), comps):
        torch.testing.assert_close(a, c)
    got, = torch.autograd.grad((y * y).sum() + (back * back).sum(), im)
    want = torch.autograd.grad(sum((r * r).sum() + (c * c).sum() for r, c in zip(refs, leaves)), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)


WRITES = {
    "flatten_mul_": lambda t: t.flatten(-2).mul_(2),
    "reshape_mul_": lambda t: t.reshape(t.shape[0], t.shape[1], -1).mul_(2),
    "slice_fill_": lambda t: t.flatten(-2)[..., :1].fill_(7),
    "setitem": lambda t: t.flatten(-2).__setitem__((slice(None), 0), 5.0),
}


@pytest.mark.parametrize("name", WRITES)
def test_writes_into_a_merge_stored_apart_refuse(name):
    """``(B, S, j0, C).flatten(-2)`` gathers each sample's ``(S, nᵢ·C)`` (a static dim sits before
    the ragged one in the rows): dense reshape of a contiguous sample is a view, so an in-place op
    on the copy would silently miss the original — it raises, as a reordering of ragged dims does.
    Reads and a merge stored next to its rows (``(B, j0, k, C).flatten(1, 2)``, a view) write as dense."""
    _, x = _batch([(2, 3, 3), (2, 0, 3), (2, 2, 3)], (2,))
    before = x.values().clone()
    with pytest.raises(NotImplementedError, match="copy for layout torch.multi_jagged"):
        WRITES[name](x)
    torch.testing.assert_close(x.values(), before)
    for a, c in zip(x.flatten(-2).unbind(), x.unbind()):  # reads are the dense reshape's
        torch.testing.assert_close(a, c.flatten(-2))
    y = x.flatten(-2).clone()
    y.mul_(2)  # a clone writes freely
    comps, z = _batch([(3, 2, 3), (0, 2, 3), (2, 2, 3)], (1,))
    z.flatten(1, 2).mul_(2)  # a view of the rows: writes through as dense
    for a, c in zip(z.unbind(), comps):
        torch.testing.assert_close(a, c * 2)
