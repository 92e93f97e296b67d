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
from torch_multijagged.ops.nn import rnn
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


@pytest.mark.parametrize("per_sample", [False, True], ids=["packed", "per-sample"])
@few(20)
@given(structures(SEQ, min_batch=0, min_c=2, max_c=3), seeds, st.sampled_from(sorted(LAYERS)), st.booleans(), st.booleans())
def test_recurrent_layers_match_each_sample_with_gradients(per_sample, s, seed, name, batch_first, given_hx):
    """Either path (NOTE [ Recurrent layers sample by sample ]): the packed overload, or a dense
    call per group of equal-length samples."""
    torch.manual_seed(seed % 1000)
    layer = LAYERS[name](s.c, batch_first).double()
    comps = s.components(seed)
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves) if leaves else mj.from_packed(
        torch.zeros(0, s.c, dtype=F64, requires_grad=True), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64))
    hx = _initial(layer, len(leaves), seed) if given_hx else None
    with rnn.per_sample(per_sample):
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


@pytest.mark.parametrize("per_sample", [False, True], ids=["packed", "per-sample"])
def test_recurrent_second_order_gradients(per_sample):
    torch.manual_seed(0)
    layer = nn.GRU(2, 3, batch_first=True).double()
    leaves = [torch.randn(n, 2, dtype=F64, requires_grad=True) for n in (3, 1, 2, 1)]
    with rnn.per_sample(per_sample):
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
        try:
            refs = [m(x[None]) for x in xs]
        except RuntimeError as e:  # the dense layer itself: oneDNN without this CPU's bfloat16 primitive
            pytest.skip(f"dense {layer} under bfloat16 autocast fails on this CPU: {str(e)[:80]}")
        out, states = m(mj.nested_tensor(xs))
    states = states if isinstance(states, tuple) else (states,)
    for i, (ro, rs) in enumerate(refs):
        rs = rs if isinstance(rs, tuple) else (rs,)
        assert out.dtype == ro.dtype and [h.dtype for h in states] == [h.dtype for h in rs]
        torch.testing.assert_close(out.unbind()[i].float(), ro[0].float(), atol=2e-2, rtol=2e-2)
        for h, r in zip(states, rs):
            torch.testing.assert_close(h[:, i].float(), r[:, 0].float(), atol=2e-2, rtol=2e-2)


class _MyLSTM(nn.LSTM):
    def forward(self, input, hx=None):
        return super().forward(input, hx)


@pytest.mark.parametrize("layer", [nn.GRU, nn.LSTM, nn.RNN, _MyLSTM])
def test_recurrent_layer_given_the_other_time_layout_says_so(layer):
    """The module reads its batch size from dim 1 (``batch_first=False``) or dim 0 before the
    recurrent op sees the input: that read raises the layout error, not torch's internal one
    about nested ints (NOTE [ Recurrent layers given the other time layout ])."""
    x = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(1, 2)], layout=mj.multi_jagged)
    zeros = torch.zeros(1, 2, 3)
    for hx in (None, (zeros, zeros) if issubclass(layer, nn.LSTM) else zeros):
        with pytest.raises(StructureError, match=r"\(batch_first=False\) takes a sequence-first input.*pass x.transpose\(0, 1\)"):
            layer(2, 3)(x, hx)
        with pytest.raises(StructureError, match=r"\(batch_first=True\) takes a batch-first input.*batch itself"):
            layer(2, 3, batch_first=True)(x.transpose(0, 1), hx)
        layer(2, 3)(x.transpose(0, 1), hx)  # the right layouts run
        layer(2, 3, batch_first=True)(x, hx)
    assert x.size(1) is x.shape[1]  # reading a ragged size elsewhere is unchanged


def test_recurrent_layer_refuses_what_it_cannot_run():
    x = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(1, 2)], layout=mj.multi_jagged)
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



def _per_sample_reference(layer, xs, hx):
    """Outputs, final states and the gradients of every input, parameter and initial state of
    the module run on each sample alone."""
    leaves = [c.detach().clone().requires_grad_() for c in xs]
    states = [h.detach().clone().requires_grad_() for h in _states(hx)]
    outs, finals, loss = [], [], 0
    for i, c in enumerate(leaves):
        h_i = tuple(h[:, i:i + 1] for h in states) if isinstance(layer, nn.LSTM) else states[0][:, i:i + 1]
        if c.shape[0] == 0:
            outs.append(None)
            finals.append([h[:, i:i + 1] for h in states])
            continue
        o, f = layer(c[None] if layer.batch_first else c[:, None], h_i)
        outs.append(o[0] if layer.batch_first else o[:, 0])
        finals.append(_states(f))
    finals = [torch.cat(f, 1) for f in zip(*finals)]
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=o.dtype) if o is not None else None for o in outs]
    fcots = [torch.randn(f.shape, generator=g, dtype=f.dtype) for f in finals]
    loss = sum((o * c).sum() for o, c in zip(outs, cots) if o is not None) + sum((f * c).sum() for f, c in zip(finals, fcots))
    grads = torch.autograd.grad(loss, [*leaves, *layer.parameters(), *states], allow_unused=True)
    return outs, finals, cots, fcots, grads


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("name", ["lstm", "lstm-2-bi", "gru-bi"])
def test_recurrent_layers_by_groups_of_equal_lengths(name, batch_first):
    """Equal lengths share one dense call: lengths (5, 0, 3, 5, 1, 3, 5) make groups whose
    order is not the samples' (their rows and final states are put back) and an empty sample
    (its initial states as final states); float32, initial states given, against each sample
    alone — outputs, ``h_n``/``c_n``, gradients of every input, parameter and initial state."""
    torch.manual_seed(0)
    layer = {"lstm": lambda: nn.LSTM(3, 4, batch_first=batch_first),
             "lstm-2-bi": lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=batch_first),
             "gru-bi": lambda: nn.GRU(3, 4, bidirectional=True, batch_first=batch_first)}[name]()
    lengths = (5, 0, 3, 5, 1, 3, 5)
    xs = [torch.randn(n, 3) for n in lengths]
    d = layer.num_layers * (2 if layer.bidirectional else 1)
    h0 = torch.randn(d, len(xs), 4)
    hx = (h0, torch.randn(d, len(xs), 4)) if isinstance(layer, nn.LSTM) else h0
    outs, finals, cots, fcots, want = _per_sample_reference(layer, xs, hx)
    leaves = [c.detach().clone().requires_grad_() for c in xs]
    states = [h.detach().clone().requires_grad_() for h in _states(hx)]
    with rnn.per_sample(True):
        x = mj.as_nested_tensor(leaves)
        out, got_finals = layer(x if batch_first else x.transpose(0, 1), tuple(states) if len(states) == 2 else states[0])
    out = out if batch_first else out.transpose(0, 1)
    got_finals = _states(got_finals)
    for i, (o, r) in enumerate(zip(out.unbind(), outs)):
        if r is None:
            assert o.shape[0] == 0
        else:
            torch.testing.assert_close(o, r, msg=lambda m, i=i: f"sample {i}: {m}")
    for f, r in zip(got_finals, finals):
        torch.testing.assert_close(f, r)
    loss = sum((o * c).sum() for o, c in zip(out.unbind(), cots) if c is not None) + sum((f * c).sum() for f, c in zip(got_finals, fcots))
    got = torch.autograd.grad(loss, [*leaves, *layer.parameters(), *states], allow_unused=True)
    for k, (a, b, t) in enumerate(zip(got, want, [*leaves, *layer.parameters(), *states])):
        z = torch.zeros_like(t)
        torch.testing.assert_close(z if a is None else a, z if b is None else b, msg=lambda m, k=k: f"gradient {k}: {m}")


def test_lstm_picks_per_sample_calls_where_they_pay(monkeypatch):
    """The cost rule (NOTE [ Recurrent layers sample by sample ]): an LSTM that oneDNN runs takes
    the dense call per group with autograd, and without it for a few long sequences; a GRU, a
    float64 LSTM, or one with projections keep the packed overload. Both give the reference."""
    taken = []
    real = rnn._by_groups
    monkeypatch.setattr(rnn, "_by_groups", lambda *a, **k: taken.append(True) or real(*a, **k))
    torch.manual_seed(0)

    def run(layer, lengths, grad, dtype=torch.float32):
        taken.clear()
        xs = [torch.randn(n, 3, dtype=dtype) for n in lengths]
        layer = layer.to(dtype)
        with torch.set_grad_enabled(grad):
            out, _ = layer(mj.nested_tensor(xs))
            for o, c in zip(out.unbind(), xs):
                if c.shape[0]:
                    torch.testing.assert_close(o, layer(c[None])[0][0], rtol=1e-5, atol=1e-5)
        return bool(taken)

    lstm = nn.LSTM(3, 8, batch_first=True)
    assert run(lstm, (3, 0, 50, 7), grad=True)
    assert run(lstm, (200, 180, 150), grad=False)  # three calls against 200 packed steps
    assert not run(lstm, [5] * 30 + list(range(1, 31)), grad=False)  # 30 groups of short sequences
    assert not run(lstm, (3, 0, 50, 7), grad=True, dtype=F64)  # no oneDNN: the dense call is no faster
    assert not run(nn.GRU(3, 8, batch_first=True), (3, 0, 50, 7), grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not run(nn.LSTM(3, 8, proj_size=2, batch_first=True), (3, 0, 50, 7), grad=True)


@pytest.mark.parametrize("enforce_sorted", [False, True])
@pytest.mark.parametrize("sequence_first", [False, True])
@pytest.mark.parametrize("shorter", [False, True], ids=["own-lengths", "shorter"])
def test_pack_padded_sequence_of_a_batch(shorter, sequence_first, enforce_sorted):
    """``pack_padded_sequence(x, lengths, batch_first=True)`` (or of ``x.transpose(0, 1)``) packs
    each sample's first ``lengths[i]`` rows, as dense packs the padded batch: data, batch sizes,
    sort order, gradients of every sample; an LSTM on it gives each sample's run."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

    g = torch.Generator().manual_seed(3)
    own = (6, 5, 5, 2) if enforce_sorted else (3, 6, 2, 5)
    lengths = torch.tensor([n - 1 if shorter and n > 2 else n for n in own])
    comps = [torch.randn(n, 3, generator=g, dtype=F64) for n in own]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    got = pack_padded_sequence(x.transpose(0, 1) if sequence_first else x, lengths, batch_first=not sequence_first,
                               enforce_sorted=enforce_sorted)
    ref_leaves = [c.clone().requires_grad_() for c in comps]
    want = pack_padded_sequence(pad_sequence(ref_leaves, batch_first=True), lengths, batch_first=True,
                                enforce_sorted=enforce_sorted)
    assert torch.equal(got.data, want.data) and torch.equal(got.batch_sizes, want.batch_sizes)
    for a, b in ((got.sorted_indices, want.sorted_indices), (got.unsorted_indices, want.unsorted_indices)):
        assert (a is None and b is None) or torch.equal(a, b)
    cot = torch.randn(want.data.shape, generator=g, dtype=F64)
    for a, b in zip(torch.autograd.grad((got.data * cot).sum(), leaves), torch.autograd.grad((want.data * cot).sum(), ref_leaves)):
        torch.testing.assert_close(a, b)
    layer = nn.LSTM(3, 4).double()
    out, (h, c) = layer(got)
    for i, (leaf, n) in enumerate(zip(comps, lengths.tolist())):
        _, (hr, cr) = layer(leaf[:n, None])
        torch.testing.assert_close(h[:, i], hr[:, 0])
        torch.testing.assert_close(c[:, i], cr[:, 0])


def test_pack_padded_sequence_refuses_as_dense_and_past_a_sample():
    from torch.nn.utils.rnn import pack_padded_sequence

    x = torch.nested.nested_tensor([torch.randn(n, 3) for n in (3, 0, 4)], layout=mj.multi_jagged)
    with pytest.raises(RuntimeError, match="greater than 0"):  # dense refuses an empty sequence
        pack_padded_sequence(x, torch.tensor([3, 0, 4]), batch_first=True, enforce_sorted=False)
    y = torch.nested.nested_tensor([torch.randn(n, 3) for n in (3, 2, 4)], layout=mj.multi_jagged)
    with pytest.raises(ValueError, match="a length of 5 for a sample of length 4"):
        pack_padded_sequence(y, torch.tensor([3, 2, 5]), batch_first=True, enforce_sorted=False)
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        pack_padded_sequence(y, torch.tensor([3, 2, 4]), batch_first=True)
    with pytest.raises(RuntimeError, match="equal to batch_size"):
        pack_padded_sequence(y, torch.tensor([3, 2]), batch_first=True)
    with pytest.raises(StructureError, match="batch_first=False.*batch-first"):
        pack_padded_sequence(y, torch.tensor([3, 2, 2]))
    with pytest.raises(StructureError, match="batch_first=True.*sequence-first"):
        pack_padded_sequence(y.transpose(0, 1), torch.tensor([3, 2, 2]), batch_first=True)
