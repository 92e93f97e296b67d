"""The batch dim merged with the static dims after it (NOTE [ Batch-merged tokens ]): attention
written with ``bmm`` over ``(B·H, N, D)`` — ``view(-1, N, D)`` / ``reshape(B * H, -1, D)``,
``bmm``, ``baddbmm``, the scores viewed back to ``(B, H, N, N)`` — per sample, with gradients of
every leaf, a zero-length sample, no leakage between samples, second order and compile."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj
from torch_multijagged.ops.shape.merged import BatchMerged

from _reference import few, seeds
from _structures import assert_samples_and_grads

F64 = torch.float64


def _comps(ns, width, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, width, generator=g, dtype=F64).to(dtype).requires_grad_() for n in ns]


def classic_attention(x, heads, bias, mode):
    """Multi-head self-attention the way pre-SDPA model code writes it, for a dense ``(B, N, C)``
    batch or a multi_jagged ``(B, j0, C)`` one: heads folded into the batch around ``bmm``."""
    b, n, c = x.shape
    d = c // heads
    q = x.view(b, n, heads, d).transpose(1, 2)  # (B, H, N, D)
    if mode == "view":  # DeBERTa-v2: contiguous, then view(-1, N, D)
        q = q.contiguous().view(-1, n, d)
    elif mode == "reshape":  # BART / XGLM: reshape(B * H, -1, D)
        q = q.reshape(b * heads, -1, d)
    else:  # flatten(0, 1)
        q = q.flatten(0, 1)
    k = q * 0.5
    if mode == "reshape":
        alibi = (bias[:, None] * torch.ones_like(x[..., 0])[:, None, :]).reshape(b * heads, 1, n)  # Bloom's ALiBi
        scores = alibi.baddbmm(q, k.transpose(-1, -2), beta=1.0, alpha=d ** -0.5)
    else:
        scores = torch.bmm(q, k.transpose(1, 2)) / d ** 0.5
    assert scores.size() == (b * heads, n, n)
    scores = scores.view(b, heads, n, n) + bias[:, None, None]  # back to (B, H, N, N)
    probs = F.softmax(scores, dim=-1).view(b * heads, n, n)
    out = torch.bmm(probs, q)  # (B·H, N, D)
    return out.view(b, heads, n, d).transpose(1, 2).reshape(b, n, c)


def _per_sample(fn, comps, extra):
    """``fn`` on each non-empty sample as a batch of one (dense ``view(-1, 0, D)`` refuses an empty one)."""
    return [fn(c.unsqueeze(0), *extra)[0] if c.shape[0] else None for c in comps]


def _check(fn, comps, extra, **tol):
    x = mj.as_nested_tensor(comps)
    out = fn(x, *extra)
    assert isinstance(out, mj.MultiJaggedTensor) and out.shape[1] is x.shape[1]
    got = out.unbind()
    refs = _per_sample(fn, comps, extra)
    for a, r, c in zip(got, refs, comps):
        if r is None:
            assert a.shape == c.shape
        else:
            torch.testing.assert_close(a, r, **tol)
    leaves = list(comps) + [t for t in extra if isinstance(t, torch.Tensor) and t.requires_grad]
    cot = [torch.randn_like(a) for a in got]
    g1 = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, cot)), leaves, allow_unused=True)
    live = [(r * w).sum() for r, w in zip(refs, cot) if r is not None]
    g2 = torch.autograd.grad(sum(live), leaves, allow_unused=True) if live else [None] * len(leaves)
    for t, a, b in zip(leaves, g1, g2):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        torch.testing.assert_close(a, b, **tol)


@few(12)
@given(ns=st.lists(st.integers(0, 5), min_size=1, max_size=4), heads=st.sampled_from([2, 3]),
       mode=st.sampled_from(["view", "reshape", "flatten"]), seed=seeds)
def test_classic_attention_per_sample(ns, heads, mode, seed):
    comps = _comps(ns, heads * 2, seed)
    bias = torch.randn(heads, dtype=F64, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    _check(lambda x, b: classic_attention(x, heads, b, mode), comps, (bias,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_classic_attention_dtypes(dtype):
    comps = _comps((3, 0, 4), 4, dtype=dtype)
    bias = torch.zeros(2, dtype=dtype, requires_grad=True)
    tol = dict(rtol=5e-2, atol=1e-1) if dtype == torch.bfloat16 else {}  # sums in another order
    _check(lambda x, b: classic_attention(x, 2, b, "reshape"), comps, (bias,), **tol)
    out = classic_attention(mj.as_nested_tensor(comps), 2, bias, "view")
    assert out.dtype == dtype


def test_no_leakage_between_samples():
    comps = _comps((3, 2, 4), 4)
    bias = torch.randn(2, dtype=F64)
    before = classic_attention(mj.as_nested_tensor(comps), 2, bias, "view").unbind()
    comps[1] = comps[1].detach() * 7 + 1
    after = classic_attention(mj.as_nested_tensor(comps), 2, bias, "view").unbind()
    torch.testing.assert_close(before[0], after[0], rtol=0, atol=0)
    torch.testing.assert_close(before[2], after[2], rtol=0, atol=0)
    assert not torch.allclose(before[1], after[1])


def test_second_order():
    comps = _comps((3, 0, 2), 4)
    bias = torch.randn(2, dtype=F64)

    def loss(cs):
        return sum((a ** 2).sum() for a in cs)

    out = classic_attention(mj.as_nested_tensor(comps), 2, bias, "reshape").unbind()
    g = torch.autograd.grad(loss(out), comps, create_graph=True)
    gg = torch.autograd.grad(sum(t.sum() for t in g), comps)
    for i, c in enumerate(comps):
        if not c.shape[0]:
            continue
        ref = classic_attention(c.unsqueeze(0), 2, bias, "reshape")[0]
        (rg,) = torch.autograd.grad((ref ** 2).sum(), c, create_graph=True)
        (rgg,) = torch.autograd.grad(rg.sum(), c)
        torch.testing.assert_close(g[i], rg)
        torch.testing.assert_close(gg[i], rgg)


def test_token_shape_and_views_back():
    x = mj.as_nested_tensor(_comps((3, 1, 4), 6))
    y = x.unflatten(-1, (3, 2)).transpose(1, 2)  # (3, 3, j0, 2)
    t = y.reshape(9, -1, 2)
    assert isinstance(t, BatchMerged) and t.shape == (9, x.shape[1], 2) and t.dim() == 3 and t.size(0) == 9
    assert t.dtype == F64 and t.shape[1] is x.shape[1]
    for back in (t.view(3, 3, x.shape[1], 2), t.view(-1, 3, x.shape[1], 2), t.reshape(3, -1, x.shape[1], 2),
                 t.unflatten(0, (3, 3))):
        assert isinstance(back, mj.MultiJaggedTensor)
        for a, b in zip(back.unbind(), y.unbind()):
            torch.testing.assert_close(a, b)
    assert isinstance(t.view(9, x.shape[1], 1, 2), BatchMerged)  # another (B·H, …) view stays merged
    for same in (y.view(-1, 3, x.shape[1], 2), y.reshape(-1, 3, x.shape[1], 2), y.view(-1, 3, x.shape[1], 1, 2)):
        assert isinstance(same, mj.MultiJaggedTensor) and same.shape[0] == 3  # a -1 that is the batch: no merge
    with pytest.raises(RuntimeError, match=r"^view\(\): cannot view \(3, 3, j\d+, 2\) as \(9, j\d+, 3\): merging"):
        y.view(9, x.shape[1], 3)
    assert isinstance(y.flatten(0, 1), BatchMerged) and isinstance(y.view(-1, x.shape[1], 2), BatchMerged)
    y6 = x.unflatten(-1, (3, 2)).unsqueeze(1).expand(3, 2, x.shape[1], 3, 2).permute(0, 1, 3, 2, 4)  # (3, 2, 3, j0, 2)
    t6 = y6.flatten(0, 2)
    assert isinstance(t6, BatchMerged) and t6.shape[0] == 18
    back6 = t6.view(3, 2, 3, x.shape[1], 2)
    for a, b in zip(back6.unbind(), y6.unbind()):
        torch.testing.assert_close(a, b)
    t2 = t.transpose(1, 2)  # (9, 2, j0)
    assert isinstance(t2, BatchMerged) and t2.shape[1] == 2
    u = t.unsqueeze(1).squeeze(1)
    assert isinstance(u, BatchMerged) and u.shape == t.shape


def test_dense_operands_reductions_and_in_place():
    comps = _comps((3, 0, 2), 4)
    x = mj.as_nested_tensor(comps)
    q = x.view(3, x.shape[1], 2, 2).transpose(1, 2).reshape(6, -1, 2)  # (6, j0, 2)
    dense = torch.arange(6, dtype=F64).view(6, 1, 1)
    s = (q + dense).view(3, 2, x.shape[1], 2)
    r = q.sum((1, 2))  # every ragged dim: dense (B·H,)
    assert not isinstance(r, (mj.MultiJaggedTensor, BatchMerged)) and r.shape == (6,)
    m = q.mean(-1)  # (6, j0): still merged
    assert isinstance(m, BatchMerged)
    for i, c in enumerate(comps):
        qi = c.view(-1, 2, 2).transpose(0, 1)  # (2, n, 2)
        torch.testing.assert_close(s.unbind()[i], qi + torch.arange(2 * i, 2 * i + 2, dtype=F64).view(2, 1, 1))
        torch.testing.assert_close(r[2 * i:2 * i + 2], qi.sum((1, 2)))
        torch.testing.assert_close(m.view(3, 2, x.shape[1]).unbind()[i], qi.mean(-1))
    w = torch.randn(2, 5, dtype=F64)
    p = q @ w  # a dense matrix on the right
    assert isinstance(p, BatchMerged) and p.shape[-1] == 5
    with torch.no_grad():
        z = x.detach().clone().view(3, x.shape[1], 2, 2).transpose(1, 2)
        tz = z.reshape(6, -1, 2)
        assert tz.masked_fill_(tz > 0, 0.0) is tz
        assert (z.values() <= 0).all()  # the write reached the batch-first tensor


@pytest.mark.parametrize("op", ["max_keepdim", "max_indices", "min", "logsumexp", "norm", "norm_p", "vector_norm",
                                "argmax"])
def test_more_reductions_over_folded_heads_per_sample(op):
    """The stable-softmax shift ``w.max(-1, keepdim=True)[0]``, ``logsumexp``, ``norm(dim=-1)`` and the
    arg-extremes on ``(B·H, j0, …)`` tokens, over their other dims, as each sample's dense code:
    values, and gradients of every leaf."""
    heads, d = 2, 2
    f = {"max_keepdim": lambda w, q: w.max(-1, keepdim=True).values, "max_indices": lambda w, q: w.max(-1)[1],
         "min": lambda w, q: torch.min(w, dim=1)[0], "logsumexp": lambda w, q: w.logsumexp(-1),
         "norm": lambda w, q: q.norm(dim=-1), "norm_p": lambda w, q: q.norm(2, -1),
         "vector_norm": lambda w, q: torch.linalg.vector_norm(q, 2, -1), "argmax": lambda w, q: w.argmax(-1)}[op]

    def fn(x):
        b, n, c = x.shape
        q = x.view(b, n, heads, d).transpose(1, 2).reshape(b * heads, n, d)
        w = torch.bmm(q, q.transpose(1, 2))
        r = f(w, q).to(x.dtype)  # (B·H, N) or (B·H, N, 1); indices as floats
        r = r.reshape(b, heads, n, -1).sum((1, 3))  # (B, N)
        return r.unsqueeze(-1) * x

    _check(fn, _comps((3, 0, 4), heads * d, seed=5), ())


def test_errors_name_the_op():
    x = mj.as_nested_tensor(_comps((3, 1, 4), 4))
    t = x.view(3, x.shape[1], 2, 2).transpose(1, 2).reshape(6, -1, 2)
    with pytest.raises(NotImplementedError, match=r"^cumsum\(\): along dim 0"):
        t.cumsum(0)
    with pytest.raises(NotImplementedError, match=r"^softmax\(\): along dim 0"):
        t.softmax(0)
    with pytest.raises(NotImplementedError, match=r"^sum\(\): along dim 0"):
        t.sum(0)
    with pytest.raises(NotImplementedError, match=r"^transpose\(\): along dim 0"):
        t.transpose(0, 1)
    with pytest.raises(RuntimeError, match=r"view\(\): cannot view"):
        t.view(2, 3, x.shape[1], 2)
    with pytest.raises(NotImplementedError, match="view the merged tensor back"):
        t + x
    with pytest.raises(RuntimeError, match="does not broadcast"):
        t + torch.ones(5, 1, 1, dtype=F64)
    other = x.view(3, x.shape[1], 4, 1).transpose(1, 2).reshape(12, -1, 1)
    with pytest.raises(RuntimeError, match="different merges"):
        torch.bmm(t, other.transpose(1, 2))
    with pytest.raises(RuntimeError, match="3-D"):
        torch.bmm(t, t.unsqueeze(1).transpose(-1, -2))
    with pytest.raises(IndexError):
        t.transpose(1, 5)


def test_baddbmm_beta_zero_ignores_input():
    comps = _comps((3, 2), 4)
    x = mj.as_nested_tensor(comps)
    q = x.view(2, x.shape[1], 2, 2).transpose(1, 2).reshape(4, -1, 2)
    nan = torch.full((4, 1, 1), float("nan"), dtype=F64)
    s = torch.baddbmm(nan, q, q.transpose(1, 2), beta=0, alpha=2.0)
    ref = torch.bmm(q, q.transpose(1, 2)) * 2.0
    for a, b in zip(s.view(2, 2, x.shape[1], x.shape[1]).unbind(), ref.view(2, 2, x.shape[1], x.shape[1]).unbind()):
        torch.testing.assert_close(a, b)


def test_compiled_one_graph_over_lengths():
    cc = CompileCounterWithBackend("aot_eager")
    bias = torch.randn(2, dtype=F64)
    fn = torch.compile(lambda x: classic_attention(x, 2, bias, "view"), backend=cc, fullgraph=True)
    for ns in [(3, 0, 5), (2, 4, 1)]:
        comps = _comps(ns, 4, seed=sum(ns))
        out = fn(mj.as_nested_tensor(comps))
        g = torch.autograd.grad(out.values().pow(2).sum(), comps)
        for a, gc, c in zip(out.unbind(), g, comps):
            if c.shape[0]:
                ref = classic_attention(c.unsqueeze(0), 2, bias, "view")[0]
                torch.testing.assert_close(a, ref)
                (rg,) = torch.autograd.grad(ref.pow(2).sum(), c)
                torch.testing.assert_close(gc, rg)
    assert cc.frame_count == 1


def test_sdpa_of_folded_heads():
    """``F.scaled_dot_product_attention`` on ``(B·H, N, D)``: each slice's attention, as dense."""
    comps = _comps((3, 0, 4), 4)

    def fn(x, causal):
        b, n, c = x.shape
        q = x.view(b, n, 2, 2).transpose(1, 2).reshape(b * 2, -1, 2)
        o = F.scaled_dot_product_attention(q, q * 0.5, q.sin(), is_causal=causal)
        return o.view(b, 2, n, 2).transpose(1, 2).reshape(b, n, c)

    for causal in (False, True):
        _check(lambda x, causal=causal: fn(x, causal), comps, ())


@pytest.mark.parametrize("spacing", ["bid,bjd->bij", "b i d, b j d -> b i j"])
def test_einsum_of_folded_heads_per_sample(spacing):
    """Attention written with einsum after einops' ``'b n (h d) -> (b h) n d'`` (Perceiver, CvT):
    ``einsum('bid,bjd->bij')`` and ``einsum('bij,bjd->bid')`` on ``(B·H, j0, D)`` tokens, a
    contraction over the ragged dim (``'bnd,bne->bde'``, linear attention: dense) and dense
    latents against a token — per sample, with gradients."""
    h, d = 2, 3
    comps = _comps((3, 0, 4), h * d)
    x = mj.as_nested_tensor(comps)
    b = len(comps)
    q = x.unflatten(-1, (h, d)).transpose(1, 2).reshape(b * h, x.shape[1], d)
    sim = torch.einsum(spacing, q, q)
    assert isinstance(sim, BatchMerged)
    o = torch.einsum("bij,bjd->bid", sim.softmax(-1), q)
    out = o.reshape(b, h, x.shape[1], d).transpose(1, 2).flatten(2)
    kv = torch.einsum("bnd,bne->bde", q, q)  # (B·H, D, D): dense
    inverted = F.normalize(torch.einsum("bid,bjd->bij", q, q), dim=-2)  # Perceiver's inverted attention
    lat = torch.randn(b * h, 2, d, dtype=F64)
    cross = torch.einsum("bid,bjd->bij", lat, q)
    refs, kvs, crosses = [], [], []
    for i, c in enumerate(comps):
        qq = c.unflatten(-1, (h, d)).transpose(0, 1)
        s = torch.einsum("bid,bjd->bij", qq, qq)
        refs.append(torch.einsum("bij,bjd->bid", s.softmax(-1), qq).transpose(0, 1).flatten(1))
        kvs.append(torch.einsum("bnd,bne->bde", qq, qq))
        crosses.append(torch.einsum("bid,bjd->bij", lat[i * h:(i + 1) * h], qq))
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    for a, c in zip(inverted.reshape(b, h, x.shape[1], x.shape[1]).unbind(), comps):
        qq = c.unflatten(-1, (h, d)).transpose(0, 1)
        torch.testing.assert_close(a, F.normalize(torch.einsum("bid,bjd->bij", qq, qq), dim=-2))
    torch.testing.assert_close(kv, torch.cat(kvs))
    for a, r in zip(cross.reshape(b, h, 2, x.shape[1]).unbind(), crosses):
        torch.testing.assert_close(a, r)
    loss = (out * out).sum() + kv.sum()
    got = torch.autograd.grad(loss, comps)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs) + sum(k.sum() for k in kvs), comps)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w)


def test_cat_of_folded_heads():
    """``torch.cat`` of tokens of one merge along another dim (the batch-first tensors' dim + 1),
    and of a single token along the merged dim (``einops.pack``): per sample, with gradients."""
    comps = _comps((3, 0, 2), 6)
    x = mj.as_nested_tensor(comps)
    b = len(comps)
    q = x.unflatten(-1, (2, 3)).transpose(1, 2).reshape(b * 2, x.shape[1], 3)
    both = torch.cat([q, q * 2], -1)
    one = torch.cat([q], 0)
    assert isinstance(both, BatchMerged) and isinstance(one, BatchMerged)
    out = both.reshape(b, 2, x.shape[1], 6)
    refs = [torch.cat([t, t * 2], -1) for t in (c.unflatten(-1, (2, 3)).transpose(0, 1) for c in comps)]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    torch.testing.assert_close(one.reshape(b, 2, x.shape[1], 3).values(), q.reshape(b, 2, x.shape[1], 3).values())
    got = torch.autograd.grad((out * out).sum(), comps)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), comps)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w)
    with pytest.raises(NotImplementedError, match="along dim 0"):
        torch.cat([q, q], 0)


@pytest.mark.parametrize("how", ["reshape", "view", "flatten"])
def test_merging_the_batch_with_a_dim_of_one_is_the_batch(how):
    """``(B, 1, j0)`` waveforms as ``(B·1, j0)`` (torchaudio's ``Spectrogram`` reshapes to
    ``(-1, L)``): the batch itself, on which ``stft`` runs per sample."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(1, n, dtype=torch.float64, generator=g) for n in (300, 100, 64)]
    x = mj.nested_tensor(ws, ragged_dims=(2,))
    y = {"reshape": lambda: x.reshape(-1, x.shape[-1]), "view": lambda: x.view(-1, x.shape[-1]),
         "flatten": lambda: x.flatten(0, 1)}[how]()
    assert not isinstance(y, BatchMerged) and y.shape[0] == 3 and y._ragged_dims == (1,)
    win = torch.hann_window(64, dtype=torch.float64)
    s = torch.stft(y, 64, 16, window=win, return_complex=True)
    for a, w in zip(s.unbind(), ws):
        torch.testing.assert_close(a, torch.stft(w[0], 64, 16, window=win, return_complex=True))


def _qkv_attention(qkv, n_heads, legacy):
    """guided-diffusion's ``QKVAttention`` / ``QKVAttentionLegacy`` (ADM U-Nets), as written there."""
    bs, width, length = qkv.shape
    ch = width // (3 * n_heads)
    scale = 1 / math.sqrt(math.sqrt(ch))
    if legacy:
        q, k, v = qkv.reshape(bs * n_heads, ch * 3, length).split(ch, dim=1)
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
    else:
        q, k, v = qkv.chunk(3, dim=1)
        weight = torch.einsum("bct,bcs->bts", (q * scale).view(bs * n_heads, ch, length),
                              (k * scale).view(bs * n_heads, ch, length))
        v = v.reshape(bs * n_heads, ch, length)
    weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
    a = torch.einsum("bts,bcs->bct", weight, v)
    return a.reshape(bs, -1, length)


@pytest.mark.parametrize("legacy", [False, True])
def test_guided_diffusion_qkv_attention_per_sample(legacy):
    """Heads folded into the batch by a reshape that also splits the channels (``B·H, 3·ch``), a
    ``split`` / ``chunk`` of the folded tensor's channels, and ``reshape(bs, -1, length)`` back (the
    ``-1`` holding H·ch): each sample's dense attention, values and gradients."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(18, n, dtype=torch.float64, generator=g, requires_grad=True) for n in (4, 1, 6)]
    out = _qkv_attention(mj.as_nested_tensor(xs), 2, legacy)
    refs = [_qkv_attention(c[None], 2, legacy)[0] for c in xs]
    assert_samples_and_grads(out, refs, xs)
    empty = mj.nested_tensor([torch.randn(18, 3), torch.randn(18, 0)])
    assert [t.shape for t in _qkv_attention(empty, 2, legacy).unbind()] == [(6, 3), (6, 0)]
    x = mj.nested_tensor([c.detach() for c in xs])
    with pytest.raises(NotImplementedError, match="along dim 0"):
        x.reshape(6, 9, x.shape[2]).split(3)  # the merged dim itself


@pytest.mark.parametrize("lens", [(5,), (5, 5), (4, 6)])
def test_heads_folded_with_a_trailing_minus_one_for_any_lengths(lens):
    """``x.reshape(B * H, D, -1)`` of ``(B, H·D, j0)`` folds the heads whatever the lengths (a
    batch of one, equal lengths): the -1 stands for the ragged dim, and the fold goes back."""
    xs = [torch.randn(24, n, dtype=torch.float64) for n in lens]
    x = mj.nested_tensor(xs, ragged_dims=(2,))
    B, _, L = x.shape
    folded = x.reshape(B * 3, 8, -1)
    assert isinstance(folded, BatchMerged) and folded._mjt._ragged_dims == (3,)  # a batch, whatever the lengths
    back = (folded * 2).reshape(B, 3, 8, L).reshape(B, 24, L)
    for a, c in zip(back.unbind(), xs):
        torch.testing.assert_close(a, c * 2)


def test_heads_fold_into_an_empty_batch():
    """``(B, H, j0, D).reshape(B * H, j0, D)`` at B = 0 (``0·H == 0 == B``) folds the heads, as for
    B > 0 (invariant-point-attention's ``(b h) n d``), and unfolds back; sizes that cannot be a
    fold still raise."""
    for x in (mj.from_padded(torch.zeros(0, 0, 8), torch.zeros(0, 1, dtype=torch.long)),
              mj.nested_tensor([torch.randn(n, 8) for n in (3, 0, 5)])):
        b, n = x.shape[0], x.shape[1]
        heads = x.unflatten(-1, (2, 4)).transpose(1, 2)  # (B, 2, j0, 4)
        folded = heads.reshape(b * 2, n, 4)
        assert isinstance(folded, BatchMerged) and tuple(folded.shape) == (b * 2, n, 4)
        back = folded.reshape(b, 2, n, 4).transpose(1, 2).flatten(2)
        assert back.shape[0] == b and all(torch.equal(u, v) for u, v in zip(back.unbind(), x.unbind()))
        with pytest.raises(Exception):
            heads.reshape(b * 2, n, 3)


def test_heads_fold_into_an_empty_batch_with_minus_one():
    """``reshape(-1, j0, D)`` (BART's spelling) folds the heads of an empty batch too."""
    x = mj.nested_tensor([torch.randn(2, 3, 4), torch.randn(2, 1, 4)], ragged_dims=(2,))[0:0]
    folded = x.reshape(-1, x.shape[2], 4)
    assert isinstance(folded, BatchMerged) and folded.shape[0] == 0
    assert folded.reshape(0, 2, x.shape[2], 4).shape[1] == 2
