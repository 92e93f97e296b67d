"""Unchanged ``nn`` attention modules on multi_jagged batches (NOTE [ Batch-second tokens ] in
ops/attention/mha.py): ``nn.MultiheadAttention(batch_first=True)``, ``nn.TransformerEncoderLayer`` and
``nn.TransformerEncoder``, against the per-sample reference (each sample alone, batch of one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_multijagged as tmj
from torch_multijagged.ops.attention.mha import BatchSecond

E, H = 16, 4
LENS = [(3, 0, 5, 1), (1,), (2, 2, 7)]
DT = torch.float64


def _comps(lens, e=E, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, e, dtype=DT, generator=g) for n in lens]


def _check(f, params, comps, *, others=()):
    """``f`` on the batch vs ``f`` per sample: outputs and gradients of the input and every
    parameter (torch.autograd.grad over all leaves)."""
    x = tmj.nested_tensor(comps, requires_grad=True)
    extra = [tmj.nested_tensor(o, requires_grad=True) for o in others]
    y = f(x, *extra)
    assert isinstance(y, tmj.MultiJaggedTensor) and y.shape[0] == len(comps)
    xs = [c.clone().requires_grad_() for c in comps]
    os_ = [[c.clone().requires_grad_() for c in o] for o in others]
    refs = []
    for i, c in enumerate(xs):
        if c.shape[0] == 0:
            refs.append(c * 0)
            continue
        refs.append(f(c.unsqueeze(0), *[o[i].unsqueeze(0) for o in os_])[0])
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    leaves = [x, *extra, *params]
    grads = torch.autograd.grad((y.values() ** 2).sum(), leaves, allow_unused=True)
    ref_leaves = [*xs, *[c for o in os_ for c in o], *params]
    ref_grads = torch.autograd.grad(sum((r ** 2).sum() for r in refs), ref_leaves, allow_unused=True)
    b = len(comps)
    for gx, rg in zip([grads[0], *grads[1:1 + len(extra)]], [ref_grads[i * b:(i + 1) * b] for i in range(1 + len(extra))]):
        for a, r in zip(gx.unbind(), rg):
            torch.testing.assert_close(a, torch.zeros_like(a) if r is None else r)
    for a, r in zip(grads[1 + len(extra):], ref_grads[b * (1 + len(extra)):]):
        torch.testing.assert_close(a, torch.zeros_like(a) if r is None else r)


@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("train", [True, False])
def test_multihead_attention_self(lens, train):
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT).train(train)
    _check(lambda x: m(x, x, x, need_weights=False)[0], list(m.parameters()), _comps(lens))


@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_need_weights(average):
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    comps = _comps((3, 0, 5))
    x = tmj.nested_tensor(comps)
    out, w = m(x, x, x, average_attn_weights=average)
    assert isinstance(w, tmj.MultiJaggedTensor)
    for i, c in enumerate(comps):
        if not c.shape[0]:
            continue
        ro, rw = m(c[None], c[None], c[None], average_attn_weights=average)
        torch.testing.assert_close(out.unbind()[i], ro[0])
        torch.testing.assert_close(w.unbind()[i], rw[0])


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_native_multi_head_attention_called_directly(need_weights, average):
    """The fused inference kernel behind ``nn.MultiheadAttention``'s fast path, called directly."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT).eval()
    args = (E, H, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias)
    comps = _comps((3, 0, 5))
    x = tmj.nested_tensor(comps)
    with torch.no_grad():
        out, w = torch._native_multi_head_attention(x, x, x, *args, need_weights=need_weights,
                                                    average_attn_weights=average)
        assert (w is None) == (not need_weights)
        for i, c in enumerate(comps):
            if not c.shape[0]:
                assert out.unbind()[i].shape == c.shape
                continue
            ro, rw = torch._native_multi_head_attention(c[None], c[None], c[None], *args, need_weights=need_weights,
                                                        average_attn_weights=average)
            torch.testing.assert_close(out.unbind()[i], ro[0])
            if need_weights:
                torch.testing.assert_close(w.unbind()[i], rw[0])
        with pytest.raises(NotImplementedError, match="dense mask"):
            torch._native_multi_head_attention(x, x, x, *args, mask=torch.ones(2, 2, dtype=torch.bool))


def test_multihead_attention_cross():
    """Query on one extent, key/value on another (different lengths per sample)."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    _check(lambda q, kv: m(q, kv, kv, need_weights=False)[0], list(m.parameters()), _comps((3, 2, 5)),
           others=[_comps((4, 1, 2), seed=1)])


def _dense_query_check(f, params, queries, memory, *, weights=False):
    """``f(queries, memory)`` with dense queries ``(B, L, E)`` and multi_jagged memory against
    ``f`` per sample (a batch of one): outputs (and the attention weights, each sample's ``(…, L,
    nᵢ)``), and gradients of the queries, every memory component and every parameter."""
    q = queries.clone().requires_grad_()
    mem = [c.clone().requires_grad_() for c in memory]
    out = f(q, tmj.as_nested_tensor(mem))
    y, w = out if weights else (out, None)
    assert type(y) is torch.Tensor and y.shape[:2] == q.shape[:2]
    qr = queries.clone().requires_grad_()
    mr = [c.clone().requires_grad_() for c in memory]
    refs = [f(qr[i:i + 1], mr[i][None]) for i in range(len(memory))]
    refs = [(r[0][0], r[1][0]) if weights else (r[0], None) for r in refs]
    for i, (ry, rw) in enumerate(refs):
        torch.testing.assert_close(y[i], ry)
        if weights:
            torch.testing.assert_close(w.unbind()[i], rw)
    loss = (y ** 2).sum() + ((w ** 2).sum() if weights else 0)
    got = torch.autograd.grad(loss, [q, *mem, *params], allow_unused=True)
    exp = torch.autograd.grad(sum((ry ** 2).sum() + ((rw ** 2).sum() if weights else 0) for ry, rw in refs),
                              [qr, *mr, *params], allow_unused=True)
    for a, b in zip(got, exp):
        torch.testing.assert_close(torch.zeros(()) if a is None else a, torch.zeros(()) if b is None else b)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multihead_attention_dense_queries_over_ragged_memory(need_weights, average):
    """A DETR decoder's cross attention: dense object queries ``(B, L, E)`` over each sample's
    own memory ``(B, j0, E)`` (an empty memory gives zero attention output, as dense); the output
    is dense, the weights ``(B, L, j0)`` (``(B, H, L, j0)`` unaveraged)."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    queries = torch.randn(4, 5, E, dtype=DT, generator=torch.Generator().manual_seed(3))
    _dense_query_check(lambda q, mem: m(q, mem, mem, need_weights=need_weights, average_attn_weights=average)
                       if need_weights else m(q, mem, mem, need_weights=False)[0],
                       list(m.parameters()), queries, _comps((3, 0, 5, 1)), weights=need_weights)


@pytest.mark.parametrize("train", [True, False])
def test_transformer_decoder_layer_dense_targets_over_ragged_memory(train):
    layer = nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=True, dtype=DT).train(train)
    queries = torch.randn(3, 4, E, dtype=DT, generator=torch.Generator().manual_seed(4))
    _dense_query_check(lambda t, mem: layer(t, mem), list(layer.parameters()), queries, _comps((2, 5, 1)))


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multihead_attention_ragged_queries_over_dense_memory(need_weights, average):
    """Each sample's tokens ``(B, j0, E)`` reading a dense memory ``(B, S, E)`` (a Perceiver's
    decoder over its latents): the output keeps the queries' structure, the weights are
    ``(B, j0, S)``; gradients to the tokens, the memory and every parameter."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    comps = _comps((3, 0, 5, 1))
    memory = torch.randn(len(comps), 4, E, dtype=DT, generator=torch.Generator().manual_seed(5))
    xs = [c.clone().requires_grad_() for c in comps]
    mem = memory.clone().requires_grad_()
    out, w = m(tmj.as_nested_tensor(xs), mem, mem, need_weights=need_weights, average_attn_weights=average)
    xr = [c.clone().requires_grad_() for c in comps]
    mr = memory.clone().requires_grad_()
    refs = [m(c[None], mr[i:i + 1], mr[i:i + 1], need_weights=need_weights, average_attn_weights=average)
            for i, c in enumerate(xr)]
    for i, (ro, rw) in enumerate(refs):
        torch.testing.assert_close(out.unbind()[i], ro[0])
        if need_weights:
            torch.testing.assert_close(w.unbind()[i], rw[0])
    loss = (out.values() ** 2).sum() + ((w.values() ** 2).sum() if need_weights else 0)
    params = list(m.parameters())
    got = torch.autograd.grad(loss, [*xs, mem, *params], allow_unused=True)
    exp = torch.autograd.grad(sum((ro ** 2).sum() + ((rw ** 2).sum() if need_weights else 0) for ro, rw in refs),
                              [*xr, mr, *params], allow_unused=True)
    for a, b in zip(got, exp):
        torch.testing.assert_close(torch.zeros(()) if a is None else a, torch.zeros(()) if b is None else b)


def test_multihead_attention_separate_projections():
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT, kdim=E, vdim=E)
    m._qkv_same_embed_dim = False
    m.q_proj_weight = nn.Parameter(torch.randn(E, E, dtype=DT) / 4)
    m.k_proj_weight = nn.Parameter(torch.randn(E, E, dtype=DT) / 4)
    m.v_proj_weight = nn.Parameter(torch.randn(E, E, dtype=DT) / 4)
    params = [m.q_proj_weight, m.k_proj_weight, m.v_proj_weight, m.in_proj_bias, m.out_proj.weight]
    _check(lambda x: m(x, x, x, need_weights=False)[0], params, _comps((3, 0, 4)))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first, dtype=DT)
    _check(lambda x: layer(x), list(layer.parameters()), _comps((3, 0, 5, 1)))


def test_transformer_encoder_stack_causal():
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, dtype=DT), 2, enable_nested_tensor=False
    )
    _check(lambda x: enc(x, is_causal=True, mask=_causal_hint(x)), list(enc.parameters()), _comps((3, 0, 5)))


def _causal_hint(x):
    # dense code passes the square causal mask with is_causal=True; ragged lengths have none, the
    # per-sample causal mask is what is_causal means (dense checks the mask only when not None)
    n = x.shape[1] if not isinstance(x, tmj.MultiJaggedTensor) else 1
    return nn.Transformer.generate_square_subsequent_mask(n, dtype=DT)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_transformer_encoder_eval_modes(mode):
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, 32, dropout=0.1, batch_first=True, dtype=DT), 2, enable_nested_tensor=False
    ).eval()
    comps = _comps((3, 0, 5))
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        y = enc(tmj.nested_tensor(comps))
        for a, c in zip(y.unbind(), comps):
            if c.shape[0]:
                torch.testing.assert_close(a, enc(c[None])[0])


def test_dropout_in_training_is_seeded():
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.5, batch_first=True, dtype=DT)
    x = tmj.nested_tensor(_comps((3, 4)))
    torch.manual_seed(3)
    a = layer(x)
    torch.manual_seed(3)
    b = layer(x)
    torch.manual_seed(4)
    c = layer(x)
    assert torch.equal(a.values(), b.values())
    assert not torch.equal(a.values(), c.values())


def test_no_leakage_between_samples():
    layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True, dtype=DT)
    comps = _comps((3, 2, 5))
    x1 = tmj.nested_tensor(comps, requires_grad=True)
    comps2 = [comps[0], comps[1] + 1.0, comps[2]]
    x2 = tmj.nested_tensor(comps2, requires_grad=True)
    y1, y2 = layer(x1), layer(x2)
    g1, = torch.autograd.grad((y1.values() ** 2).sum(), x1)
    g2, = torch.autograd.grad((y2.values() ** 2).sum(), x2)
    for i in (0, 2):
        assert torch.equal(y1.unbind()[i], y2.unbind()[i])
        assert torch.equal(g1.unbind()[i], g2.unbind()[i])
    assert not torch.equal(y1.unbind()[1], y2.unbind()[1])


def test_key_padding_mask_is_refused_for_multi_jagged_keys():
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    x = tmj.nested_tensor(_comps((3, 2)))
    with pytest.raises(ValueError, match="key_padding_mask is not needed for multi_jagged keys"):
        m(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dtype", [torch.bool, DT], ids=["bool", "float"])
def test_key_padding_mask_over_a_padded_dense_context(need_weights, dtype):
    """Ragged queries (image tokens) attending to a padded dense context with its key_padding_mask
    (Stable Diffusion's cross-attention): dense MHA per sample, output, weights and gradients of the
    queries and every parameter; a mask beside attn_mask or is_causal, or of the wrong shape,
    raises."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    g = torch.Generator().manual_seed(4)
    comps = [torch.randn(n, E, dtype=DT, generator=g) for n in (3, 1, 0, 4)]
    ctx = torch.randn(4, 5, E, dtype=DT, generator=g)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    kpm = pad if dtype == torch.bool else torch.randn(4, 5, dtype=DT, generator=g)
    leaves = [c.clone().requires_grad_() for c in comps]
    out, w = m(tmj.as_nested_tensor(leaves), ctx, ctx, key_padding_mask=kpm, need_weights=need_weights)
    refs = [m(c[None], ctx[i:i + 1], ctx[i:i + 1], key_padding_mask=kpm[i:i + 1], need_weights=need_weights)
            for i, c in enumerate(leaves)]
    for i, (o, (r, rw)) in enumerate(zip(out.unbind(), refs)):
        torch.testing.assert_close(o, r[0])
        if need_weights:
            torch.testing.assert_close(w.unbind()[i], rw[0])
    params = list(m.parameters())
    got = torch.autograd.grad((out ** 2).sum(), [*leaves, *params])
    exp = torch.autograd.grad(sum((r ** 2).sum() for r, _ in refs), [*leaves, *params])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    x = tmj.nested_tensor(comps)
    for kw in (dict(add_bias_kv=True), dict(add_zero_attn=True)):  # appended keys: the mask padded, as dense's
        extra = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT, **kw)
        got = extra(x, ctx, ctx, key_padding_mask=kpm, need_weights=need_weights)
        for i, c in enumerate(comps):
            want = extra(c[None], ctx[i:i + 1], ctx[i:i + 1], key_padding_mask=kpm[i:i + 1], need_weights=need_weights)
            torch.testing.assert_close(got[0].unbind()[i], want[0][0])
            if need_weights:
                torch.testing.assert_close(got[1].unbind()[i], want[1][0])
    if dtype == torch.bool:  # the module makes a bool mask float first; the function takes it as it is
        args = (E, H, m.in_proj_weight, m.in_proj_bias, None, None, False, 0.0, m.out_proj.weight, m.out_proj.bias)
        o = F.multi_head_attention_forward(x.transpose(0, 1), ctx.transpose(0, 1), ctx.transpose(0, 1), *args,
                                           key_padding_mask=pad, need_weights=False)[0].transpose(0, 1)
        for i, (a, c) in enumerate(zip(o.unbind(), comps)):
            r = F.multi_head_attention_forward(c[:, None], ctx[i][:, None], ctx[i][:, None], *args,
                                               key_padding_mask=pad[i:i + 1], need_weights=False)[0][:, 0]
            torch.testing.assert_close(a, r)
    with pytest.raises(NotImplementedError, match="key_padding_mask with attn_mask or is_causal"):
        m(x, ctx, ctx, key_padding_mask=kpm, is_causal=True, attn_mask=torch.ones(1, 1))
    with pytest.raises(RuntimeError, match=r"expected key_padding_mask of shape \(4, 5\)"):
        m(x, ctx, ctx, key_padding_mask=kpm[:, :4])


def test_dense_attn_mask_without_is_causal_is_refused():
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    x = tmj.nested_tensor(_comps((3, 2)))
    with pytest.raises(NotImplementedError, match="dense attn_mask cannot address ragged"):
        m(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool))


@pytest.mark.parametrize("bias_kv,zero_attn", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_bias_kv_and_zero_attn(bias_kv, zero_attn, need_weights):
    """``add_bias_kv`` (a learned key and value after each sample's keys) and ``add_zero_attn`` (a
    zero key and value after those), as dense per sample: outputs, attention weights and the
    gradients of the input and every parameter (``bias_k`` / ``bias_v`` included)."""
    m = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=bias_kv, add_zero_attn=zero_attn, dtype=DT)
    if bias_kv:
        with torch.no_grad():  # not zeros (the module's init), so that a misplaced bias shows
            m.bias_k.normal_(), m.bias_v.normal_()
    _check(lambda x: m(x, x, x, need_weights=need_weights)[0], list(m.parameters()), _comps((3, 0, 5, 1)))
    if need_weights:
        comps = _comps((3, 0, 5))
        x = tmj.nested_tensor(comps)
        w = m(x, x, x)[1]
        for a, c in zip(w.unbind(), comps):
            assert a.shape == (c.shape[0], c.shape[0] + bias_kv + zero_attn)
            if c.shape[0]:
                torch.testing.assert_close(a, m(c[None], c[None], c[None])[1][0])
    x = tmj.nested_tensor(_comps((3, 2)))
    with pytest.raises(NotImplementedError, match="is_causal"):
        m(x, x, x, is_causal=True, attn_mask=torch.ones(3, 3, dtype=torch.bool).triu(1), need_weights=False)


@pytest.mark.parametrize("bias_kv,zero_attn", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_bias_kv_and_zero_attn_with_a_dense_query(bias_kv, zero_attn, need_weights):
    """A dense query ``(B, L, E)`` (a decoder's object queries) over multi_jagged memory with
    ``add_bias_kv`` / ``add_zero_attn``: each sample's queries over its own keys and the appended
    ones, as dense per sample — an empty memory sample included — outputs, weights and the
    gradients of the query, the memory and every parameter."""
    g = torch.Generator().manual_seed(2)
    m = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=bias_kv, add_zero_attn=zero_attn, dtype=DT)
    if bias_kv:
        with torch.no_grad():
            m.bias_k.normal_(generator=g), m.bias_v.normal_(generator=g)
    mems = [c.requires_grad_() for c in _comps((3, 1, 0, 4))]
    q = torch.randn(len(mems), 2, E, dtype=DT, generator=g, requires_grad=True)
    out, w = m(q, tmj.as_nested_tensor(mems), tmj.as_nested_tensor(mems), need_weights=need_weights)
    per = [m(q[i:i + 1], c[None], c[None], need_weights=need_weights) for i, c in enumerate(mems)]
    ref = torch.cat([o for o, _ in per])
    torch.testing.assert_close(out, ref)
    leaves = [q, *mems, *m.parameters()]
    cot = torch.randn(ref.shape, dtype=DT, generator=g)
    for a, b in zip(torch.autograd.grad(out, leaves, cot, allow_unused=True),
                    torch.autograd.grad(ref, leaves, cot, allow_unused=True)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    if need_weights:
        for a, (_, wr) in zip(w.unbind(), per):
            torch.testing.assert_close(a, wr[0])


@pytest.mark.parametrize("average", [True, False])
def test_causal_attention_weights(average):
    """``is_causal=True`` with the attention weights asked for (the module's default
    ``need_weights=True``): each sample's own causal mask, as dense with its square mask."""
    m = nn.MultiheadAttention(E, H, batch_first=True, dtype=DT)
    comps = _comps((3, 0, 5))
    x = tmj.nested_tensor(comps)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)  # a hint: dense needs it, each sample masks itself
    _check(lambda x: m(x, x, x, is_causal=True, attn_mask=mask[:x.shape[1], :x.shape[1]] if x.dim() == 3 and
                      not isinstance(x, tmj.MultiJaggedTensor) else mask)[0], list(m.parameters()), comps)
    w = m(x, x, x, is_causal=True, attn_mask=mask, average_attn_weights=average)[1]
    for a, c in zip(w.unbind(), comps):
        n = c.shape[0]
        if n:
            torch.testing.assert_close(a, m(c[None], c[None], c[None], is_causal=True, attn_mask=mask[:n, :n],
                                            average_attn_weights=average)[1][0])


def test_a_batch_handed_to_the_sequence_first_module_says_how_to_call_it():
    """``nn.MultiheadAttention(batch_first=False)(x, x, x)`` with a batch-first multi_jagged ``x``:
    a clear error naming the two ways (not dense's reading of the ragged dim as the batch)."""
    m = nn.MultiheadAttention(E, H, dtype=DT)
    x = tmj.nested_tensor(_comps((3, 2)))
    with pytest.raises(TypeError, match="batch_first=True, or pass x.transpose"):
        m(x, x, x)


def test_batch_second_token():
    x = tmj.nested_tensor(_comps((3, 2)))
    t = x.transpose(0, 1)
    assert isinstance(t, BatchSecond)
    assert t.shape[1] == 2 and t.shape[0] == x.shape[1] and t.dim() == 3
    assert t.transpose(1, 0) is x
    assert torch.transpose(t, 0, 1) is x
    # sequence-first code runs the ops that do not care where the batch is (test_batch_moved.py)
    w = torch.randn(4, E, dtype=DT)
    for a, c in zip((F.linear(t + 1, w)).transpose(0, 1).unbind(), x.unbind()):
        torch.testing.assert_close(a, F.linear(c + 1, w))
    for a, c in zip(torch.cumsum(t, 0).transpose(0, 1).unbind(), x.unbind()):  # over each sequence
        torch.testing.assert_close(a, torch.cumsum(c, 0))
    with pytest.raises(NotImplementedError, match="batch dim is not at dim 0"):
        torch.flip(t, [1])  # the batch dim


def test_token_at_a_compiled_boundary_a_clear_error():
    """A compiled function may move the batch inside but not return a token: rebuilt at the
    boundary it would be outside the autograd graph (a gradient silently lost)."""
    x = tmj.nested_tensor(_comps((3, 2)), requires_grad=True)
    with pytest.raises(Exception, match="cannot be an input or an output of a torch.compile'd function"):
        torch.compile(lambda t: t.transpose(0, 1) * 2, backend="aot_eager", fullgraph=True)(x)
    torch._dynamo.reset()


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_with_a_per_sample_mask_folded_over_heads(need_weights):
    """``nn.MultiheadAttention(…, attn_mask=bias)`` with a per-sample ``(B·H, L, S)`` mask built from
    the batch (WavLM's relative position bias): each sample's mask, with gradients."""
    torch.manual_seed(0)
    comps = [torch.randn(n, 8, dtype=torch.float64) for n in (3, 5)]
    x = tmj.nested_tensor(comps, requires_grad=True)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    bias = torch.einsum("bic,bjc->bij", x, x).unsqueeze(1).expand(-1, 2, -1, -1).flatten(0, 1)
    out, _ = mha(x, x, x, attn_mask=bias, need_weights=need_weights)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [mha(c[None], c[None], c[None], attn_mask=(c @ c.T)[None].expand(2, -1, -1), need_weights=need_weights)[0][0]
            for c in leaves]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    got, = torch.autograd.grad((out * out).sum(), x)
    for a, w in zip(got.unbind(), torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)):
        torch.testing.assert_close(a, w)


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_encoder_layer_fused_inference_kernel(norm_first, activation):
    """``torch._transformer_encoder_layer_fwd``, which ``nn.TransformerEncoderLayer`` calls in eval
    without gradients where ``has_torch_function`` does not stop it (under ``torch.compile``): the
    layer per sample, an empty sample included; compiled with ``fullgraph`` it raised."""
    m = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, norm_first=norm_first,
                                         activation=activation).eval().double()
    samples = [torch.randn(n, 8, dtype=torch.float64) for n in (3, 1, 0, 5)]
    x = torch.nested.nested_tensor(samples, layout=tmj.multi_jagged)
    sa = m.self_attn
    with torch.no_grad():
        ref = [m(s.unsqueeze(0))[0] for s in samples]
        out = torch._transformer_encoder_layer_fwd(
            x, 8, 2, sa.in_proj_weight, sa.in_proj_bias, sa.out_proj.weight, sa.out_proj.bias, activation == "gelu",
            norm_first, m.norm1.eps, m.norm1.weight, m.norm1.bias, m.norm2.weight, m.norm2.bias, m.linear1.weight,
            m.linear1.bias, m.linear2.weight, m.linear2.bias, None, None)
        for a, b in zip(out.unbind(), ref):
            torch.testing.assert_close(a, b)
        torch._dynamo.reset()
        compiled = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
        for a, b in zip(compiled.unbind(), ref):
            torch.testing.assert_close(a, b)
        torch._dynamo.reset()


def test_multi_jagged_3d_attn_mask_one_per_sample_and_head():
    """A multi_jagged ``(B, L, S)`` mask is dense's 3-d form with one head (bool: True masked out;
    float: added); with several heads dense wants ``(B·H, L, S)``, and the error says how to fold."""
    torch.manual_seed(0)
    xs = [torch.randn(n, 4, dtype=torch.float64) for n in (3, 2)]
    bools = [torch.rand(n, n) > 0.5 for n in (3, 2)]
    for b in bools:
        b.fill_diagonal_(False)
    floats = [torch.randn(n, n, dtype=torch.float64) for n in (3, 2)]
    x = tmj.nested_tensor(xs)
    one = nn.MultiheadAttention(4, 1, batch_first=True).double()
    for masks in (bools, floats):
        out = one(x, x, x, attn_mask=tmj.nested_tensor(masks), need_weights=False)[0]
        for a, xi, mi in zip(out.unbind(), xs, masks):
            torch.testing.assert_close(a, one(xi[None], xi[None], xi[None], attn_mask=mi, need_weights=False)[0][0])
    two = nn.MultiheadAttention(4, 2, batch_first=True).double()
    with pytest.raises(RuntimeError, match=r"\(B·2, L, S\): fold the heads in"):
        two(x, x, x, attn_mask=tmj.nested_tensor(bools))
