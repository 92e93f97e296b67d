"""Recurrent layers over a ragged dim (NOTE [ Recurrent layers on packed sequences ] in
``ops/nn/rnn.py``): ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` on ``(B, j0, C)`` — or its sequence-first
token for ``batch_first=False`` — against the module on each sample alone: outputs, ``h_n`` /
``c_n``, gradients to every input, initial state and parameter, second order, a zero-length
sample (empty output, its initial state as final state) and an empty batch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from _reference import SEQ, few, seeds, structures
from _structures import bit_equal

F64 = torch.float64

LAYERS = {
    "lstm-2-bi": lambda c, bf: nn.LSTM(c, 3, num_layers=2, bidirectional=True, batch_first=bf),
    "lstm-proj": lambda c, bf: nn.LSTM(c, 4, proj_size=2, batch_first=bf),
    "gru": lambda c, bf: nn.GRU(c, 3, batch_first=bf),
    "gru-bi-nobias": lambda c, bf: nn.GRU(c, 3, bidirectional=True, bias=False, batch_first=bf),
    "rnn-relu-2": lambda c, bf: nn.RNN(c, 3, num_layers=2, nonlinearity="relu", batch_first=bf),
}


def _states(h):
    return list(h) if isinstance(h, tuple) else [h]


def _run(layer, x, hx, batch_first):
    """``layer`` on the batch, returned batch-first with its final states."""
    out, h = layer(x if batch_first else x.transpose(0, 1), hx)
    return (out if batch_first else out.transpose(0, 1)), _states(h)


def _run_sample(layer, c, hx_i, batch_first):
    out, h = layer(c.unsqueeze(0) if batch_first else c.unsqueeze(1), hx_i)
    return (out[0] if batch_first else out[:, 0]), _states(h)


def _initial(layer, b, seed):
    g = torch.Generator().manual_seed(seed)
    d = 2 if layer.bidirectional else 1
    h = torch.randn(layer.num_layers * d, b, layer.proj_size or layer.hidden_size, dtype=F64, generator=g, requires_grad=True)
    if isinstance(layer, nn.LSTM):
        return (h, torch.randn(layer.num_layers * d, b, layer.hidden_size, dtype=F64, generator=g, requires_grad=True))
    return h


@few(20)
@given(structures(SEQ, min_batch=0, min_c=2, max_c=3), seeds, st.sampled_from(sorted(LAYERS)), st.booleans(), st.booleans())
def test_recurrent_layers_match_each_sample_with_gradients(s, seed, name, batch_first, given_hx):
    torch.manual_seed(seed % 1000)
    layer = LAYERS[name](s.c, batch_first).double()
    comps = s.components(seed)
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves) if leaves else mj.from_packed(
        torch.zeros(0, s.c, dtype=F64, requires_grad=True), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64))
    hx = _initial(layer, len(leaves), seed) if given_hx else None
    out, finals = _run(layer, x, hx, batch_first)
    assert isinstance(out, mj.MultiJaggedTensor) and out.shape[1] is x.shape[1]
    starts = _states(hx) if given_hx else [torch.zeros_like(f) for f in finals]
    loss_ref = 0
    for i, c in enumerate(leaves):
        h_i = None if hx is None else tuple(h[:, i:i + 1] for h in _states(hx)) if isinstance(hx, tuple) else hx[:, i:i + 1]
        if c.shape[0] == 0:  # the dense layer refuses an empty sequence: empty output, the initial state
            assert out.unbind()[i].shape[0] == 0
            for f, h0 in zip(finals, starts):
                assert torch.equal(f[:, i], h0[:, i])
            continue
        ref, ref_finals = _run_sample(layer, c, h_i, batch_first)
        torch.testing.assert_close(out.unbind()[i], ref)
        for f, r in zip(finals, ref_finals):
            torch.testing.assert_close(f[:, i], r[:, 0])
        loss_ref = loss_ref + (ref * ref).sum() + sum((r * r).sum() for r in ref_finals)
    for i, c in enumerate(leaves):  # an empty sample's final state is its initial one
        if c.shape[0] == 0 and given_hx:
            loss_ref = loss_ref + sum((h[:, i] ** 2).sum() for h in _states(hx))
    if not leaves or isinstance(loss_ref, int):  # nothing to differentiate: every sample empty, no hx
        return
    loss = (out * out).sum() + sum((f * f).sum() for f in finals)
    wrt = [*leaves, *layer.parameters(), *(_states(hx) if given_hx else [])]
    got = torch.autograd.grad(loss, wrt, allow_unused=True)
    want = torch.autograd.grad(loss_ref, wrt, allow_unused=True)
    for t, a, b in zip(wrt, got, want):
        torch.testing.assert_close(a if a is not None else torch.zeros_like(t), b if b is not None else torch.zeros_like(t))


def test_recurrent_second_order_gradients():
    torch.manual_seed(0)
    layer = nn.GRU(2, 3, batch_first=True).double()
    leaves = [torch.randn(n, 2, dtype=F64, requires_grad=True) for n in (3, 1, 2)]
    out, h = layer(mj.as_nested_tensor(leaves))
    g = torch.autograd.grad((out * out).sum() + (h * h).sum(), leaves, create_graph=True)
    g2 = torch.autograd.grad(sum((t * t).sum() for t in g), [*leaves, *layer.parameters()])
    refs = []
    for c in leaves:
        o, hh = layer(c.unsqueeze(0))
        refs.append((o * o).sum() + (hh * hh).sum())
    r = torch.autograd.grad(sum(refs), leaves, create_graph=True)
    r2 = torch.autograd.grad(sum((t * t).sum() for t in r), [*leaves, *layer.parameters()])
    for a, b in zip(g2, r2):
        torch.testing.assert_close(a, b)


def test_recurrent_layers_do_not_leak_between_samples():
    torch.manual_seed(0)
    layer = nn.LSTM(2, 3, batch_first=True, bidirectional=True)
    comps = [torch.randn(n, 2) for n in (3, 0, 4, 2)]
    a, (ha, _) = layer(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    comps[2] = comps[2] * 10 + 1
    b, (hb, _) = layer(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    for i in (0, 3):
        assert bit_equal(a.unbind()[i], b.unbind()[i]) and bit_equal(ha[:, i], hb[:, i])
    assert not torch.equal(a.unbind()[2], b.unbind()[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recurrent_layer_dtypes(dtype):
    torch.manual_seed(0)
    layer = nn.GRU(2, 3, batch_first=True).to(dtype)
    comps = [torch.randn(n, 2, dtype=dtype) for n in (3, 1)]
    out, h = layer(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    assert out.dtype == dtype and h.dtype == dtype
    for o, c in zip(out.unbind(), comps):
        torch.testing.assert_close(o, layer(c.unsqueeze(0))[0][0])


@pytest.mark.parametrize("layer", ["lstm", "lstm_proj", "gru", "rnn", "rnn_bi2"])
def test_recurrent_layers_under_cpu_autocast_return_dense_dtypes(layer):
    """Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` the output and final states have the
    dtypes the dense layer gives one sample (oneDNN's LSTM computes in bfloat16 there), values
    within bfloat16's tolerance of it."""
    torch.manual_seed(0)
    m = {"lstm": lambda: nn.LSTM(6, 4, batch_first=True), "lstm_proj": lambda: nn.LSTM(6, 4, batch_first=True, proj_size=2),
         "gru": lambda: nn.GRU(6, 4, batch_first=True), "rnn": lambda: nn.RNN(6, 4, batch_first=True),
         "rnn_bi2": lambda: nn.RNN(6, 4, num_layers=2, bidirectional=True, batch_first=True)}[layer]()
    xs = [torch.randn(4, 6), torch.randn(2, 6), torch.randn(3, 6)]
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's notice about projections
        out, states = m(mj.nested_tensor(xs))
        refs = [m(x[None]) for x in xs]
    states = states if isinstance(states, tuple) else (states,)
    for i, (ro, rs) in enumerate(refs):
        rs = rs if isinstance(rs, tuple) else (rs,)
        assert out.dtype == ro.dtype and [h.dtype for h in states] == [h.dtype for h in rs]
        torch.testing.assert_close(out.unbind()[i].float(), ro[0].float(), atol=2e-2, rtol=2e-2)
        for h, r in zip(states, rs):
            torch.testing.assert_close(h[:, i].float(), r[:, 0].float(), atol=2e-2, rtol=2e-2)


def test_recurrent_layer_refuses_what_it_cannot_run():
    x = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(1, 2)], layout=mj.multi_jagged)
    for hx in (None, torch.zeros(1, 2, 3)):  # a batch-first batch given to a sequence-first layer: the module
        with pytest.raises(RuntimeError):  # reads dim 1 as the batch (zeros((1, j0, 3)), or its hidden size check)
            nn.GRU(2, 3)(x, hx)
    with pytest.raises(StructureError, match="batch_first=False.*transpose"):
        torch.gru(x, torch.zeros(1, 2, 3), [torch.randn(9, 2), torch.randn(9, 3)], False, 1, 0.0, False, False, False)
    signals = mj.as_nested_tensor([torch.randn(2, n) for n in (3, 1)], ragged_dims=(2,))  # (B, C, j0)
    with pytest.raises(StructureError, match=r"expected a batch of sequences \(B, j0, C\)"):
        torch.gru(signals, torch.zeros(1, 2, 3), [torch.randn(9, 2), torch.randn(9, 3)], False, 1, 0.0, False, False, True)


def test_recurrent_layer_under_compile_breaks_the_graph_and_matches_eager():
    torch.manual_seed(0)
    layer = nn.LSTM(2, 3, batch_first=True)
    x = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(1, 2), torch.randn(2, 2)], layout=mj.multi_jagged)
    torch._dynamo.reset()
    out = torch.compile(lambda t: layer(t * 2)[0].sin(), backend="aot_eager")(x)
    ref = layer(x * 2)[0].sin()
    for a, b in zip(out.unbind(), ref.unbind()):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="RNN, GRU, or LSTM"):  # as for a dense input: dynamo refuses the module
        torch.compile(lambda t: layer(t)[0], backend="aot_eager", fullgraph=True)(x)



def test_recurrent_layer_after_inference_mode_on_the_same_batch():
    """The time-major map is cached on the batch's partition: built first under inference mode it
    must still serve a training step (NOTE [ Derived maps ])."""
    torch.manual_seed(0)
    layer = nn.GRU(2, 3, batch_first=True)
    x = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(1, 2)], layout=mj.multi_jagged)
    with torch.inference_mode():
        first, _ = layer(x)
    out, h = layer(x)
    (out.sum() + h.sum()).backward()
    assert all(p.grad is not None for p in layer.parameters())
    for a, b in zip(first.unbind(), out.unbind()):
        torch.testing.assert_close(a, b)
