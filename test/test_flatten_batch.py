"""Flattening the batch dim into the rows and back (NOTE [ Flattening the batch dim ] in
``ops/shape/tokens.py``): ``x.view(-1, C)`` / ``reshape`` / ``flatten(0, k)`` / ``ravel`` against
the samples' elements concatenated in order, and ``y.view(x.shape)`` (GPT-2's ``Conv1D``, OPT's
feed-forward, a language model's loss) against the per-sample computation, with gradients to
every leaf, second order, a zero-length sample and an empty batch."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from torch_multijagged.ops.shape.tokens import FlatBatch
from _reference import DTYPES, RECT3_MID, SEQ, SQUARE, STATIC_LEAD, build, few, seeds, structures
from _structures import bit_equal

F64 = torch.float64


def _concat(comps, shape):
    """The reference: the samples' elements concatenated in order, viewed as ``shape``."""
    flat = torch.cat([c.reshape(-1) for c in comps]) if comps else torch.zeros(0, dtype=F64)
    return flat.view(shape)


def _flat_forms(x):
    """``(name, call, the dense shape it asks for)`` for every way to flatten the batch dim of ``x``."""
    last = max(x._ragged_dims)
    tail = tuple(int(s) for s in x.shape[last + 1:])
    forms = [
        ("reshape(-1)", lambda t: t.reshape(-1), (-1,)),
        ("flatten()", lambda t: t.flatten(), (-1,)),
        ("ravel()", lambda t: t.ravel(), (-1,)),
        (f"flatten(0, {last})", lambda t: t.flatten(0, last), (-1, *tail)),
        ("reshape(-1, *tail)", lambda t: t.reshape(-1, *tail), (-1, *tail)),
        ("torch.reshape(-1, *tail)", lambda t: torch.reshape(t, (-1, *tail)), (-1, *tail)),
    ]
    if x._ragged_dims == tuple(range(1, len(x._ragged_dims) + 1)):  # values in the samples' order: views
        forms += [("view(-1)", lambda t: t.view(-1), (-1,)), ("view(-1, *tail)", lambda t: t.view(-1, *tail), (-1, *tail))]
    if tail and tail[-1] % 2 == 0:
        forms.append(("reshape(-1, C/2)", lambda t: t.reshape(-1, tail[-1] // 2), (-1, tail[-1] // 2)))
    if x.shape[0]:
        # the rows as einops' ``'b n d -> (b n) d'`` computes them: the product of the sizes
        rows = x.shape[0]
        for d in range(1, last + 1):
            rows = rows * x.shape[d]
        forms.append(("reshape(B * n, *tail)", lambda t: t.reshape(rows, *tail), (-1, *tail)))
    return forms


@few(25)
@given(structures(SEQ, min_batch=0) | structures(SQUARE) | structures(STATIC_LEAD) | structures(RECT3_MID), seeds)
def test_flatten_is_the_samples_concatenated_with_gradients(s, seed):
    comps = s.components(seed)
    x, leaves = build(comps, s.ragged_dims, requires_grad=True)
    for name, fn, shape in _flat_forms(x):
        out = fn(x)
        assert type(out) is FlatBatch, name
        ref = _concat(leaves, shape) if leaves else _concat([], shape)
        assert out.shape == ref.shape and torch.equal(out.detach(), ref.detach()), name
        if leaves:
            w = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(seed % 1000))
            got = torch.autograd.grad((out * w).sum(), leaves)
            want = torch.autograd.grad((ref * w).sum(), leaves)
            for g, h in zip(got, want):
                torch.testing.assert_close(g, h, rtol=0, atol=0, msg=name)


def test_view_shares_the_values_and_reshape_of_a_static_lead_copies():
    x = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(0, 3), torch.randn(4, 3)], layout=mj.multi_jagged)
    assert x.view(-1, 3).data_ptr() == x._values.data_ptr()
    lead = mj.as_nested_tensor([torch.randn(2, n, 3) for n in (1, 3)], ragged_dims=(2,))  # (B, S, j0, C)
    with pytest.raises(RuntimeError, match="not stored in the samples' order.*reshape"):
        lead.view(-1, 3)
    torch.testing.assert_close(lead.reshape(-1, 3), torch.cat([c.reshape(-1, 3) for c in lead.unbind()]))


FLAT_WRITES = {
    "flatten_mul_": lambda t: t.flatten(0, 2).mul_(2),
    "reshape_mul_": lambda t: t.reshape(-1).mul_(2),
    "slice_fill_": lambda t: t.reshape(-1, 3)[:, :1].fill_(7),
    "setitem": lambda t: t.reshape(-1).__setitem__(0, 5.0),
    "relu_inplace": lambda t: F.relu(t.reshape(-1), inplace=True),
    "out": lambda t: torch.add(t.reshape(-1), 1, out=t.reshape(-1)),
}


@pytest.mark.parametrize("name", FLAT_WRITES)
def test_writes_into_a_copied_flat_batch_refuse(name):
    """``(B, S, j0, C).reshape(-1)`` concatenates the samples' elements, which the packed rows do
    not hold in that order: a copy where dense reshape of a contiguous batch is a view, so an
    in-place op on it (or on a view of it) raises instead of silently missing the original. A
    result computed from it, and a flat batch that views the values, write freely."""
    lead = mj.as_nested_tensor([torch.ones(2, n, 3) for n in (3, 0, 2)], ragged_dims=(2,))
    with pytest.raises(NotImplementedError, match="copy for layout torch.multi_jagged"):
        FLAT_WRITES[name](lead)
    assert all(bool((c == 1).all()) for c in lead.unbind())
    (lead.reshape(-1) * 1).mul_(2)
    seq = mj.nested_tensor([torch.ones(n, 3) for n in (3, 0, 2)])
    seq.reshape(-1).mul_(2)  # a view of the values: as dense
    assert all(bool((c == 2).all()) for c in seq.unbind())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: x.view(-1, 8), "divide the 4 elements"),  # a row would straddle two samples
        (lambda x: x.reshape(-1, 3), "divide the 4 elements"),
        (lambda x: x.reshape(-1, 0), "divide"),
    ],
)
def test_flatten_requests_that_mix_samples_raise(call, match):
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(1, 4), torch.randn(3, 4)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match=match):
        call(x)


def test_flattening_the_batch_dim_with_some_ragged_dims_only_raises():
    x = mj.nested_tensor([torch.randn(3, 2, 2), torch.randn(3, 3, 1)], ragged_dims=(2, 3))  # images
    with pytest.raises(StructureError, match="flatten"):
        x.flatten(0, 2)  # the batch, the channels and the rows, not the columns
    pair = torch.nested.nested_tensor([torch.randn(2, 2, 3), torch.randn(3, 3, 3)], layout=mj.multi_jagged)
    assert pair.flatten(0, 1).shape[0] == 5  # the rows as samples (NOTE [ Rows as samples ])


def test_shapes_that_keep_the_batch_dim_are_unchanged():
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=mj.multi_jagged)
    for y in (x.view(-1, x.shape[1], 4), x.view(2, -1, 4), x.reshape(-1, -1, 2, 2)):
        assert isinstance(y, mj.MultiJaggedTensor)


# ----------------------------------------------------------------------------- and back
class Conv1D(torch.nn.Module):
    """GPT-2's ``Conv1D`` (``transformers.pytorch_utils``), as written there."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = torch.nn.Parameter(torch.randn(nx, nf, dtype=F64))
        self.bias = torch.nn.Parameter(torch.randn(nf, dtype=F64))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


def _opt_ffn(ln, fc1, fc2):
    def forward(h):  # OPT's decoder feed-forward, as written in transformers' OPTDecoderLayer
        shape = h.shape
        h = h.reshape(-1, h.size(-1))
        residual = h
        h = fc2(F.relu(fc1(ln(h))))
        return (residual + h).view(shape)

    return forward


def _round_trip_modules(c):
    torch.manual_seed(0)
    conv = Conv1D(5, c)
    ln, fc1, fc2 = torch.nn.LayerNorm(c).double(), torch.nn.Linear(c, 7).double(), torch.nn.Linear(7, c).double()
    return {
        "conv1d": (conv, list(conv.parameters())),
        "opt_ffn": (_opt_ffn(ln, fc1, fc2), [*ln.parameters(), *fc1.parameters(), *fc2.parameters()]),
        "unflatten": (lambda h: (h.flatten(0, h.dim() - 2) * 2).unflatten(0, h.shape[:-1]), []),
        "view_as": (lambda h: torch.tanh(h.reshape(-1)).view_as(h), []),
        "reshape_as": (lambda h: torch.tanh(h.reshape(-1)).reshape_as(h), []),
        "torch.reshape": (lambda h: torch.reshape(torch.tanh(h.reshape(-1, h.shape[-1])), h.shape), []),
    }


@few(15)
@given(structures(SEQ, min_c=2, max_c=4) | structures(SQUARE, min_c=2, max_c=4), seeds, st.sampled_from(sorted(_round_trip_modules(2))))
def test_round_trip_matches_per_sample_with_gradients_to_every_leaf(s, seed, name):
    comps = s.components(seed)
    x, leaves = build(comps, s.ragged_dims, requires_grad=True)
    mod, params = _round_trip_modules(s.c)[name]
    out = mod(x)
    assert isinstance(out, mj.MultiJaggedTensor) and out.shape[: len(s.ragged_dims) + 1] == x.shape[: len(s.ragged_dims) + 1]
    refs = [mod(c.unsqueeze(0)).squeeze(0) for c in leaves]
    for a, b in zip(out.unbind(), refs):
        torch.testing.assert_close(a, b)
    inputs = [*leaves, *params]
    got = torch.autograd.grad((out * out).sum(), inputs, create_graph=True)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), inputs, create_graph=True)
    for g, h in zip(got, want):
        torch.testing.assert_close(g, h)
    # second order: the gradient's own gradient, to every leaf
    g2 = torch.autograd.grad(sum((g * g).sum() for g in got), inputs, allow_unused=True)
    h2 = torch.autograd.grad(sum((h * h).sum() for h in want), inputs, allow_unused=True)
    for g, h in zip(g2, h2):
        torch.testing.assert_close(g if g is not None else torch.zeros_like(h), h if h is not None else torch.zeros_like(g))


def test_round_trip_does_not_leak_between_samples():
    conv = Conv1D(3, 4)
    comps = [torch.randn(n, 4, dtype=F64) for n in (2, 0, 3)]
    a = conv(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    comps[2] = comps[2] * 100 + 1
    b = conv(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and not torch.equal(a.unbind()[2], b.unbind()[2])


def test_language_model_loss_over_flattened_tokens():
    g = torch.Generator().manual_seed(0)
    lens = (3, 0, 5)
    logits = [torch.randn(n, 6, dtype=F64, generator=g, requires_grad=True) for n in lens]
    labels = [torch.randint(0, 6, (n,), generator=g) for n in lens]
    x = mj.as_nested_tensor(logits)
    y = torch.nested.nested_tensor(labels, layout=mj.multi_jagged)
    flat_labels = y.view(-1)
    assert flat_labels.dtype == torch.int64 and type(flat_labels) is FlatBatch
    loss = F.cross_entropy(x.view(-1, x.size(-1)), flat_labels)
    ref = F.cross_entropy(torch.cat(logits), torch.cat(labels))
    torch.testing.assert_close(loss, ref)
    for a, b in zip(torch.autograd.grad(loss, logits), torch.autograd.grad(ref, logits)):
        torch.testing.assert_close(a, b)
    # the causal LM's shift, as Hugging Face writes it: predict token t + 1 from position t
    shifted = F.cross_entropy(x[..., :-1, :].contiguous().view(-1, x.size(-1)), y[..., 1:].contiguous().view(-1))
    ref = F.cross_entropy(torch.cat([t[:-1] for t in logits]), torch.cat([t[1:] for t in labels]))
    torch.testing.assert_close(shifted, ref)
    for a, b in zip(torch.autograd.grad(shifted, logits), torch.autograd.grad(ref, logits)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_flattens_and_comes_back(dtype):
    comps = [torch.arange(n * 3).view(n, 3).to(dtype) for n in (2, 0, 1)]
    x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    flat = x.view(-1, 3)
    assert flat.dtype == dtype and torch.equal(flat, torch.cat(comps))
    back = flat.view(x.shape)
    assert back.dtype == dtype and all(torch.equal(a, b) for a, b in zip(back.unbind(), comps))


def test_restoring_to_another_batch_or_a_wrong_size_raises():
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=mj.multi_jagged)
    other = torch.nested.nested_tensor([torch.randn(1, 4), torch.randn(1, 4)], layout=mj.multi_jagged)
    flat = x.view(-1, 4)
    with pytest.raises(StructureError, match="expected"):
        flat.view(other.shape)
    with pytest.raises(StructureError, match="expected"):
        flat.view(3, x.shape[1], 4)  # not the batch size
    with pytest.raises(RuntimeError, match="cannot view a tensor of 20 elements"):
        flat.view(2, x.shape[1], 3)
    assert flat.view(-1, 2).shape == (10, 2)  # a dense view stays dense
    with pytest.raises(RuntimeError):  # dense torch's own error for a plain tensor
        flat.detach().as_subclass(torch.Tensor).view(x.shape)


def test_flat_batch_is_dense_to_every_op():
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=mj.multi_jagged)
    flat = x.view(-1, 4)
    assert type(flat.sum(0)) is FlatBatch and type(torch.cat([flat, flat])) is FlatBatch
    assert type(flat.topk(2, dim=-1).values) is FlatBatch
    assert repr(flat).startswith("tensor(") and f"{flat.sum():.3f}" == f"{flat.sum().item():.3f}"
    assert copy.deepcopy(flat).view(x.shape).shape == x.shape
    buf = io.BytesIO()
    torch.save(flat, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert type(loaded) is torch.Tensor and torch.equal(loaded, flat)
    w = torch.randn(4, 4, requires_grad=True)
    y = flat @ w
    assert type(y._base) is not FlatBatch or y._base is not y  # attributes are not re-wrapped


def test_a_flat_batch_meets_a_multi_jagged_operand_as_a_dense_tensor():
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=mj.multi_jagged)
    flat = x.view(-1, 4)
    for call in (lambda: x + flat, lambda: flat + x):  # dense (5, 4) against (2, j0, 4): no broadcast
        with pytest.raises(StructureError, match="cannot broadcast"):
            call()
    assert torch.equal((x + flat.view_as(x)).values(), 2 * x.values())
    gram = flat.T @ flat  # statistics over every token, applied to each: the multi_jagged operand's matmul
    for a, b in zip((x @ gram).unbind(), x.unbind()):
        torch.testing.assert_close(a, b @ gram.as_subclass(torch.Tensor))


def test_flatten_under_compile_breaks_the_graph_and_matches_eager():
    conv = Conv1D(3, 4).float()
    x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(1, 4), torch.randn(3, 4)], layout=mj.multi_jagged).requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(conv, backend="aot_eager")(x)
    ref = conv(x)
    for a, b in zip(out.unbind(), ref.unbind()):
        torch.testing.assert_close(a, b)
    gx = torch.autograd.grad(out.sum(), x)[0]
    rx = torch.autograd.grad(ref.sum(), x)[0]
    for a, b in zip(gx.unbind(), rx.unbind()):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="FlatBatch"):
        torch.compile(conv, backend="aot_eager", fullgraph=True)(x)


def test_per_sample_view_of_flattened_rows_is_the_batch_not_an_even_split():
    """``loss.view(B, -1).sum(1)`` after a loss over flattened tokens: dense code's per-sample sum.
    On the samples concatenated an even split would silently mix samples: ``(B, -1)`` names the
    ragged dim instead, any other ``(B, …)`` views each sample's elements, and raises where a
    sample's elements do not fit it."""
    g = torch.Generator().manual_seed(0)
    lens = (3, 1, 4)
    logits = [torch.randn(n, 5, dtype=F64, generator=g) for n in lens]
    labels = [torch.randint(0, 5, (n,), generator=g) for n in lens]
    x = mj.as_nested_tensor(logits)
    y = torch.nested.nested_tensor(labels, layout=mj.multi_jagged)
    loss = F.cross_entropy(x.view(-1, 5), y.view(-1), reduction="none")
    per = loss.view(3, -1)
    assert isinstance(per, mj.MultiJaggedTensor) and per.shape[1] is x.shape[1]
    want = torch.stack([F.cross_entropy(a, b, reduction="sum") for a, b in zip(logits, labels)])
    torch.testing.assert_close(per.sum(1), want)
    with pytest.raises(StructureError, match="split evenly"):
        loss.view(3, 2, -1)  # 8 rows would split as 3 × 2 × … across samples
    assert loss.view(4, 2).shape == (4, 2)  # a first size that is not the batch's: a dense view
    pair = torch.nested.nested_tensor([torch.randn(2, 2, 3), torch.randn(1, 1, 3)], layout=mj.multi_jagged)
    per = pair.reshape(-1, 3).view(2, -1)  # each sample's elements: (12,) and (3,)
    assert isinstance(per, mj.MultiJaggedTensor)
    for a, c in zip(per.unbind(), pair.unbind()):
        torch.testing.assert_close(a, c.reshape(-1))
    with pytest.raises(StructureError, match="split evenly"):
        pair.reshape(-1, 3).view(2, 2, 2, -1)  # 3 elements of sample 1 cannot take (2, 2, -1)
    one = torch.nested.nested_tensor([torch.randn(3, 2)], layout=mj.multi_jagged)
    assert not isinstance(one.view(-1, 2).view(1, 6), mj.MultiJaggedTensor)  # one sample: the even split is it


@pytest.mark.parametrize("spell", ["view", "reshape", "unflatten"])
def test_flattened_elements_viewed_per_sample(spell):
    """``per_elem.view(B, -1).mean(1)`` after an elementwise loss over ``x.view(-1)`` (every element
    of the batch, not its rows): each sample's own elements, as the batch's ``view(B, -1)`` reads
    them — an even split mixed samples silently. Values and gradients per sample, a zero-length
    sample included; ``q.reshape(-1, D).view(B, H, -1, D)`` (each sample's size inside) raises
    where it mixed samples, and the batch's own shape views it back."""
    g = torch.Generator().manual_seed(3)
    comps = [torch.randn(n, 4, dtype=F64, generator=g) for n in (5, 0, 1, 3)]
    x = mj.as_nested_tensor([c.clone().requires_grad_() for c in comps])
    leaves = [c.clone().requires_grad_() for c in comps]
    B = x.shape[0]

    def back(t, *rest):
        return {"view": lambda: t.view(B, *rest), "reshape": lambda: t.reshape(B, *rest),
                "unflatten": lambda: t.unflatten(0, (B, *rest[:len(rest) - t.dim() + 1]))}[spell]()

    per_elem = F.binary_cross_entropy_with_logits(x.view(-1), torch.ones(x.numel(), dtype=F64), reduction="none")
    got = back(per_elem, -1)
    assert isinstance(got, mj.MultiJaggedTensor)
    refs = [F.binary_cross_entropy_with_logits(c.view(-1), torch.ones(c.numel(), dtype=F64), reduction="none")
            for c in leaves]
    for a, r in zip(got.unbind(), refs):
        torch.testing.assert_close(a, r)
    w = torch.arange(1.0, B + 1, dtype=F64)
    sums = got.sum(1)
    gx = torch.autograd.grad((sums * w).sum(), x)[0]
    gr = torch.autograd.grad(sum(wi * r.sum() for wi, r in zip(w, refs)), leaves)
    for a, b in zip(gx.unbind(), gr):
        torch.testing.assert_close(a, b)
    q = (x * 2).unflatten(-1, (2, 2)).transpose(1, 2)  # (B, 2, j0, 2): heads first
    with pytest.raises(StructureError, match="split evenly, not by sample; give -1 right after the batch size"):
        back(q.reshape(-1, 2), 2, -1, 2)  # each sample's size inside: view back with the batch's shape
    heads = q.reshape(-1, 2).view(q.shape)
    for a, c in zip(heads.unbind(), comps):
        torch.testing.assert_close(a, (c * 2).unflatten(-1, (2, 2)).transpose(0, 1))
    rows = x.view(-1, 4)  # (B, -1) of a loss per row: each sample's rows
    torch.testing.assert_close(back(rows.sum(-1), -1).sum(1), x.sum((1, 2)))
    same = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(2, 4)], layout=mj.multi_jagged)
    even = same.view(-1).view(2, -1)  # every sample as long: dense's even split is per sample
    assert not isinstance(even, mj.MultiJaggedTensor) and torch.equal(even, torch.stack([c.reshape(-1) for c in same.unbind()]))


def test_rows_moved_or_dropped_are_viewed_as_dense():
    """Only a FlatBatch that still holds the samples' elements in order (the flattening, then ops
    that keep its shape, its rows or its order) is read sample by sample: after a transpose, a
    strided or masked selection, a join or a repeat, ``(B, -1)`` is dense's even split, as before;
    and the per-sample result is a view, whose writes reach the batch and which sees the batch's."""
    ss = [torch.arange(n * 4.).view(n, 4) + 100 * i for i, n in enumerate((2, 3, 1))]
    x = torch.nested.nested_tensor(ss, layout=mj.multi_jagged)
    f = x.reshape(-1, 4)
    moved = {"t": f.t(), "T": f.T, "step": f[::2], "mask": f[torch.tensor([1, 0, 1, 0, 1, 0]).bool()],
             "cat": torch.cat([f, f], 0), "repeat": f.repeat(2, 1)}
    for name, g in moved.items():
        out = g.reshape(3, -1)
        assert not isinstance(out, mj.MultiJaggedTensor), name
        assert torch.equal(out, g.as_subclass(torch.Tensor).reshape(3, -1)), name
    with pytest.raises(StructureError, match="split evenly"):
        f.flip(0).reshape(3, -1)  # the batch's rows, reordered: neither per sample nor an even split is meant
    kept = {"exp": f.exp(), "row sums": f.sum(-1), "linear": F.linear(f, torch.eye(4)), "view": f.view(-1)}
    for name, g in kept.items():
        out = g.reshape(3, -1)
        assert isinstance(out, mj.MultiJaggedTensor), name
        for a, c in zip(out.unbind(), ss):
            want = {"exp": c.exp(), "row sums": c.sum(-1), "linear": c, "view": c}[name]
            torch.testing.assert_close(a, want.reshape(-1))
    y = x.clone()
    r = y.view(-1).view(3, -1)
    r.mul_(2)  # a view: the write reaches the batch
    for a, c in zip(y.unbind(), ss):
        torch.testing.assert_close(a, 2 * c)
    y.add_(1)
    for a, c in zip(r.unbind(), ss):
        torch.testing.assert_close(a, (2 * c + 1).reshape(-1))


def test_rows_kept_after_ops_along_other_dims():
    """Ops that keep each row where it was (a reduction or a selection along a later dim, ``max`` /
    ``sort`` along the last, a linear map of each row) keep the samples' elements in order, so
    ``(B, -1)`` of their result is each sample's (a per-sample loss of ``(B, j0, K, C)`` pairs
    flattened to ``(B·j0·K, C)`` rows); ops that move elements along dim 0 (a permutation matrix
    applied, a pad of dim 0, a shift) give dense's view."""
    g = torch.Generator().manual_seed(5)
    pr = [torch.randn(n, 2, 4, generator=g) for n in (2, 3, 1)]
    tg = [torch.randn(n, 2, 4, generator=g) for n in (2, 3, 1)]
    pred, tgt = (torch.nested.nested_tensor(t, layout=mj.multi_jagged) for t in (pr, tg))
    per = F.mse_loss(pred.reshape(-1, 4), tgt.reshape(-1, 4), reduction="none").sum(-1).view(3, -1).mean(1)
    want = [F.mse_loss(p, t, reduction="none").sum(-1).mean() for p, t in zip(pr, tg)]
    torch.testing.assert_close(per, torch.stack(want))
    f = pred.reshape(-1, 4)
    for name, y, fn in [("column", f[:, 0], lambda c: c[..., 0]), ("max", f.max(-1).values, lambda c: c.amax(-1)),
                        ("sort", f.sort(-1).values, lambda c: c.sort(-1).values), ("norm", f.norm(dim=-1),
                                                                                 lambda c: c.norm(dim=-1))]:
        r = y.view(3, -1)
        assert isinstance(r, mj.MultiJaggedTensor), name
        for a, c in zip(r.unbind(), pr):
            torch.testing.assert_close(a, fn(c).reshape(-1))
    v = pred.view(-1)
    m = torch.zeros(f.shape, dtype=torch.bool)
    m[3:] = True
    moved = [("permutation", torch.eye(v.numel()).flip(0) @ v), ("pad", F.pad(v, (4, -4))),
             ("shift", torch.fft.fftshift(v)), ("where", torch.where(torch.tensor(True), v.flip(0), v)),
             ("rows merged, then flipped", v.view(1, -1).flip(-1)), ("flipud", torch.flipud(f)),
             ("msort", torch.msort(-f)), ("rot90", torch.rot90(f, k=2)), ("topk dim=0", f.topk(k=6, dim=0).values),
             ("masked_scatter", torch.zeros_like(f).masked_scatter(m, f))]
    for name, y in moved:
        y = y.reshape(-1)
        r = y.view(3, -1)
        assert not isinstance(r, mj.MultiJaggedTensor) and torch.equal(r, y.as_subclass(torch.Tensor).view(3, -1)), name
    one = torch.nested.nested_tensor([torch.arange(n * 4.).view(n, 4) for n in (2, 3, 1)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match="split evenly"):
        one.view(-1, 4).flip(0).sum(-1).view(3, -1)  # the batch's row count, rows moved: not read per sample


def test_transposed_flat_batch_stays_a_flat_batch():
    """``.T`` / ``.mT`` / ``.H`` / ``.real`` of a FlatBatch are results (a FlatBatch), as ``.t()`` is, so a
    computation through them views back into the batch: ``Categorical(logits=(B, j0, V)).sample()``
    (whose draw goes through ``.T``) gives each sample's draws; ``.grad`` stays as it is."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 5, generator=g) for n in (3, 0, 2)]
    logits = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    f = logits.view(-1, 5)
    for t in (f.T, f.mT, f.H, f.real):
        assert isinstance(t, FlatBatch)
        assert isinstance(t.mT.view(logits.shape), mj.MultiJaggedTensor)
    assert f.grad is None
    torch.manual_seed(0)
    draws = torch.distributions.Categorical(logits=logits).sample()
    assert isinstance(draws, mj.MultiJaggedTensor) and draws.shape[1] is logits.shape[1]
    for d, c in zip(draws.unbind(), comps):
        assert d.shape == c.shape[:1] and bool(((d >= 0) & (d < 5)).all())
    torch.manual_seed(0)
    want = torch.multinomial(torch.cat(comps).softmax(-1), 1, True).T  # Categorical's draw, on the rows
    torch.testing.assert_close(torch.cat(list(draws.unbind())), want.reshape(-1))


def test_in_place_write_into_flattened_rows_with_grad_raises_clearly():
    """``h.view(-1, C).mul_(2)`` (and ``relu_``, a masked write, ``index_add_``) on a batch that records
    gradients: the rows are a view of its values made inside a custom Function, which autograd
    cannot rebase; the error says so and names what works (autograd's own message named a
    function the user never called). Under no_grad the write reaches the batch."""
    lin = torch.nn.Linear(4, 4)
    x = torch.nested.nested_tensor([torch.randn(n, 4) for n in (5, 1, 3)], layout=mj.multi_jagged)
    h = lin(x)
    writes = [lambda r: r.mul_(2), lambda r: F.relu(r, inplace=True), lambda r: r.__setitem__(r > 0, 0.0),
              lambda r: r.index_add_(0, torch.tensor([0]), torch.ones(1, 4))]
    for write in writes:
        with pytest.raises(RuntimeError, match=r"cannot write in place into the batch flattened into rows .* "
                                               r"Write into the batch itself"):
            write(h.view(-1, 4))
    packed = mj.from_packed(torch.ones(5, 4, requires_grad=True) * 1, torch.tensor([0, 2, 2, 5]),
                            torch.tensor([[2], [0], [3]]))
    with torch.no_grad():
        rows = packed.view(-1, 4)  # rows of a batch that records gradients, taken under no_grad
        first = rows[:1]
    for t in (rows, first):  # then written with grad mode on: dense's refusal (the gradient would miss it)
        with pytest.raises(RuntimeError, match="created in no_grad mode and is being modified inplace"):
            t.mul_(2)
    with torch.no_grad():
        pieces = (rows.unbind(0)[0], rows.split(2)[0], torch.narrow(input=rows, dim=0, start=0, length=2))
    for write in [lambda t=t: t.mul_(2) for t in pieces] + [lambda: torch.mul(torch.ones(5, 4), 2, out=rows),
                                                         lambda: F.leaky_relu(rows, 0.5, inplace=True)]:
        with pytest.raises(RuntimeError, match="created in no_grad mode"):
            write()
    rows.detach().mul_(1)  # a detached alias takes writes, as dense's
    with torch.no_grad():
        y = lin(x)
        before = [t.clone() for t in y.unbind()]
        y.view(-1, 4).mul_(2)
    for a, b in zip(y.unbind(), before):
        torch.testing.assert_close(a, 2 * b)


def test_heads_flattened_and_back():
    """``(B, H, j0, D).reshape(-1, D)`` (the samples' elements in their order, a copy) back to the
    batch's shape, after ops on the rows too: einops' ``pack`` / ``unpack`` over ``'* d'``
    (taylor-series linear attention); it raised. Gradients reach the components."""
    from einops import pack, unpack

    xs = [torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True) for n in (3, 0, 5)]
    x = mj.as_nested_tensor(xs, ragged_dims=(2,))
    f = x.reshape(-1, 4)
    for y, k in ((f.reshape(x.shape), 1), (f.view(3, 2, x.shape[2], 4), 1), ((f * 3).reshape(x.shape), 3),
                 (unpack(*pack([x], "* d"), "* d")[0], 1)):
        assert y.shape[2] == x.shape[2] and y._ragged_dims == (2,)
        assert all(torch.equal(a, k * b) for a, b in zip(y.unbind(), xs))
    got = torch.autograd.grad((f * 3).reshape(x.shape).sum(dim=(1, 2, 3)).sum(), xs)
    for g in got:
        torch.testing.assert_close(g, torch.full_like(g, 3.0))


def test_rows_with_a_later_minus_one_say_how_to_flatten():
    # DGCNN's ``x.view(batch_size * num_points, -1)``: refused, naming the spellings that work
    x = mj.nested_tensor([torch.randn(n, 4) for n in (3, 2)])
    b, n, c = x.shape
    with pytest.raises(StructureError, match=r"takes every later size given \(x.view\(B \* n, C\)\)"):
        x.view(b * n, -1)
    assert x.view(b * n, c).shape == (5, 4) and x.view(-1, c).shape == (5, 4)
