"""Attention scores held per sample (NOTE [ Attention scores held per sample ] in
``ops/contractions/sample_mm.py``): ``q @ kᵀ`` of ``(B, H, j0, D)`` operands keeps each sample's
``(1, H, n, m)`` block, the scale, dropout, softmax and a causal mask run block by block, and
``attn @ v`` reads the blocks; anything else reads packed values. Every result and gradient is the
per-sample chain's, with an empty and a one-token sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged import pieces
from torch_multijagged.kernels import ragged_mm as kmm
from torch_multijagged.ops.contractions import sample_mm

from _structures import assert_samples_and_grads

F64 = torch.float64
H, D = 3, 4
LENGTHS = [(5, 0, 1, 7), (6,), (4, 4, 2)]


@pytest.fixture(autouse=True)
def _held(monkeypatch):
    """Every product whose samples all run alone holds its scores, however small."""
    monkeypatch.setattr(sample_mm, "HELD_CELLS", 0)
    with kmm.force_plan("loop"):
        yield


def _leaves(lengths, seed=0, dtype=F64, width=3 * H * D):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, width, generator=g, dtype=dtype).requires_grad_() for n in lengths]


def _heads(t):
    """``(…, n, H·D)`` → ``(…, H, n, D)``, on a batch or on one sample."""
    return t.unflatten(-1, (H, D)).transpose(-3, -2)


def _qkv(x):
    return [_heads(t) for t in x.chunk(3, -1)]


def _chain(x, causal=False):
    q, k, v = _qkv(x)
    s = q @ k.transpose(-1, -2) * D ** -0.5
    if causal:
        s = s.masked_fill(~torch.ones_like(s, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_chain_values_and_gradients(lengths, causal):
    leaves = _leaves(lengths)
    x = mj.as_nested_tensor(leaves)
    q, k, _ = _qkv(x)
    scores = q @ k.transpose(-1, -2)
    assert pieces.holds_pieces(scores) and pieces.holds_pieces(torch.softmax(scores * 0.5, -1))
    out = _chain(x, causal)
    refs = [_chain(c[None], causal)[0] for c in leaves]
    assert_samples_and_grads(out, refs, leaves)


def test_cross_attention_and_second_order_gradients():
    """Queries and keys of different lengths (``(B, H, j0, j1)`` scores); the gradient of the
    gradient as the per-sample chain's."""
    lq, lk = (3, 0, 5, 2), (4, 2, 1, 6)
    qs, kvs = _leaves(lq, 1, width=H * D), _leaves(lk, 2, width=2 * H * D)
    xq, xkv = mj.as_nested_tensor(qs), mj.as_nested_tensor(kvs)

    def attend(a, b):
        q, (k, v) = _heads(a), [_heads(t) for t in b.chunk(2, -1)]
        s = q @ k.transpose(-1, -2)
        return torch.softmax(s, -1) @ v, s

    out, s = attend(xq, xkv)
    assert pieces.holds_pieces(s)
    refs = [attend(a[None], b[None])[0][0] for a, b in zip(qs, kvs)]
    leaves = qs + kvs
    assert_samples_and_grads(out, refs, leaves)
    ga = torch.autograd.grad((attend(xq, xkv)[0] ** 2).sum(), leaves, create_graph=True)
    gb = torch.autograd.grad(sum((r ** 2).sum() for r in [attend(a[None], b[None])[0] for a, b in zip(qs, kvs)]),
                             leaves, create_graph=True)
    gga = torch.autograd.grad(sum((g ** 3).sum() for g in ga), leaves)
    ggb = torch.autograd.grad(sum((g ** 3).sum() for g in gb), leaves)
    for a, b in zip(ga + gga, gb + ggb):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex128])
def test_dtypes(dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in _leaves((5, 0, 3))]
    x = mj.as_nested_tensor(leaves)
    q, k, v = _qkv(x)
    s = q @ k.transpose(-1, -2)
    assert s.dtype == dtype and pieces.holds_pieces(s)
    out = (s * 0.5) @ v
    refs = [((a @ b.mT) * 0.5) @ c for a, b, c in zip(*[[_qkv(t[None])[i][0] for t in leaves] for i in range(3)])]
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert out.dtype == dtype
    if dtype.is_complex:  # gradients of Σ|out|², the conjugate products' own
        for a, b in zip(out.unbind(), refs):
            torch.testing.assert_close(a, b)
        ga = torch.autograd.grad((out.abs() ** 2).sum(), leaves)
        gb = torch.autograd.grad(sum((r.abs() ** 2).sum() for r in refs), leaves)
        for a, b in zip(ga, gb):
            torch.testing.assert_close(a, b)
        return
    assert_samples_and_grads(out, refs, leaves, **tol)


def test_no_leakage_between_samples():
    """Changing one sample changes no other sample's output or gradient."""
    a, b = _leaves((4, 6, 3), 3), _leaves((4, 6, 3), 3)
    with torch.no_grad():
        b[1].add_(torch.randn(b[1].shape, dtype=F64))
    outs = []
    for leaves in (a, b):
        out = _chain(mj.as_nested_tensor(leaves))
        grads = torch.autograd.grad((out * out).sum(), leaves)
        outs.append((out.unbind(), grads))
    for i in (0, 2):
        torch.testing.assert_close(outs[0][0][i], outs[1][0][i])
        torch.testing.assert_close(outs[0][1][i], outs[1][1][i])
    assert not torch.allclose(outs[0][0][1], outs[1][0][1])


def _reads(s):
    """Consumers that read the packed values of scores ``s`` (or a view of them)."""
    return {
        "unbind": lambda: torch.cat([t.reshape(-1) for t in s.unbind()]),
        "head mean": lambda: torch.cat([t.reshape(-1) for t in s.mean(1).unbind()]),
        "sum over keys": lambda: torch.cat([t.reshape(-1) for t in s.sum(-1).unbind()]),
        "transpose @": lambda: torch.cat([t.reshape(-1) for t in (s.transpose(-1, -2) @ s).unbind()]),
    }


@pytest.mark.parametrize("what", list(_reads(None)))
def test_other_consumers_read_packed_values(what):
    leaves = _leaves((5, 0, 2))
    x = mj.as_nested_tensor(leaves)
    q, k, _ = _qkv(x)
    s = torch.softmax(q @ k.transpose(-1, -2), -1)
    assert pieces.holds_pieces(s)
    got = _reads(s)[what]()
    refs = []
    for c in leaves:
        qi, ki, _ = _qkv(c[None])
        refs.append(_reads(mj.as_nested_tensor([torch.softmax(qi @ ki.mT, -1)[0]]))[what]())
    torch.testing.assert_close(got, torch.cat(refs))
    ga = torch.autograd.grad((got * got).sum(), leaves)
    gb = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


def test_in_place_writes_and_gradient_of_the_scores():
    """An in-place scale rewrites the blocks (still held), a masked write packs them, and the
    gradient asked of held scores is the per-sample one."""
    leaves = _leaves((4, 0, 3))
    x = mj.as_nested_tensor(leaves)
    q, k, v = _qkv(x)
    s = q @ k.transpose(-1, -2)
    s.mul_(0.5)
    assert pieces.holds_pieces(s)
    s.masked_fill_(s > 1.0, 1.0)
    assert not pieces.holds_pieces(s)
    out = torch.softmax(s, -1) @ v
    s2 = q @ k.transpose(-1, -2)
    out2 = torch.softmax(s2, -1) @ v
    (gs,) = torch.autograd.grad((out2 * out2).sum(), [s2])
    refs, grads = [], []
    for c in leaves:
        qi, ki, vi = _qkv(c[None])
        si = (qi @ ki.mT).detach().requires_grad_()
        oi = torch.softmax(si, -1) @ vi
        refs.append((torch.softmax((si * 0.5).clamp(max=1.0), -1) @ vi)[0])
        grads.append(torch.autograd.grad((oi * oi).sum(), [si])[0][0])
    for a, b in zip(out.unbind(), refs):
        torch.testing.assert_close(a, b)
    for a, b in zip(gs.unbind(), grads):
        torch.testing.assert_close(a, b)


def test_dropout_no_grad_and_inference_mode():
    leaves = _leaves((4, 0, 3))
    x = mj.as_nested_tensor([t.detach() for t in leaves])
    refs = [_chain(c.detach()[None])[0] for c in leaves]
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            out = _chain(x)
        for a, b in zip(out.unbind(), refs):
            torch.testing.assert_close(a, b)
    q, k, _ = _qkv(x)
    p = F.dropout(torch.softmax(q @ k.transpose(-1, -2), -1), p=0.5, training=True)
    assert pieces.holds_pieces(p)
    for t in p.unbind():  # every kept probability is scaled by 2, and each dropped one is 0
        assert bool(((t == 0) | (t > 0)).all())


def test_small_blocks_and_groups_stay_packed(monkeypatch):
    """Below the size rule, or where the plan groups samples, the scores are packed values."""
    x = mj.as_nested_tensor(_leaves((5, 3, 2)))
    q, k, _ = _qkv(x)
    monkeypatch.setattr(sample_mm, "HELD_CELLS", 10 ** 9)
    assert not pieces.holds_pieces(q @ k.transpose(-1, -2))
    monkeypatch.setattr(sample_mm, "HELD_CELLS", 0)
    with kmm.force_plan("padded"):
        assert not pieces.holds_pieces(q @ k.transpose(-1, -2))


def test_softmax_of_image_pieces_along_every_dim():
    """softmax / log_softmax of images held as pieces (a conv's output), along channels, rows or
    columns: per image, with gradients."""
    g = torch.Generator().manual_seed(4)
    leaves = [torch.randn(2, h, w, generator=g, dtype=F64).requires_grad_() for h, w in ((3, 4), (0, 2), (2, 2))]
    weight = torch.randn(2, 2, 3, 3, generator=g, dtype=F64, requires_grad=True)
    x = mj.as_nested_tensor(leaves)
    for dim in (1, 2, -1):
        for fn in (torch.softmax, torch.log_softmax):
            y = F.conv2d(x, weight, padding=1)
            if not pieces.holds_pieces(y):
                y = pieces.map_pieces(lambda p: p * 1, y)  # small images: held as pieces all the same
            assert pieces.holds_pieces(y)
            out = fn(y, dim)
            assert pieces.holds_pieces(out)
            refs = [fn(F.conv2d(c[None], weight, padding=1), dim)[0] if c.numel() else c.new_zeros(2, *c.shape[1:])
                    for c in leaves]
            assert_samples_and_grads(out, refs, leaves + [weight])


def test_images_held_as_pieces_under_inference_mode():
    """Convolutions image by image under ``inference_mode`` (inference tensors have no version
    counter): values as under ``no_grad``, an in-place scale keeps the pieces, a masked write
    packs them."""
    g = torch.Generator().manual_seed(5)
    x = mj.nested_tensor([torch.randn(2, h, w, generator=g, dtype=F64) for h, w in ((5, 4), (0, 3), (3, 6))])
    weight = torch.randn(2, 2, 3, 3, generator=g, dtype=F64)

    def run():
        y = pieces.map_pieces(lambda p: F.conv2d(p, weight, padding=1), x)
        y.mul_(2.0)
        held = pieces.holds_pieces(y)
        y.masked_fill_(y > 1.0, 1.0)
        return y, held, pieces.holds_pieces(y)

    with torch.inference_mode():
        got, held, after = run()
    assert held and not after
    with torch.no_grad():
        want, _, _ = run()
    for a, b in zip(got.unbind(), want.unbind()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("equations", [("bhid,bhjd->bhij", "bhij,bhjd->bhid"), ("bhid,bhjd->bhji", "bhji,bhjd->bhid")])
def test_einsum_forms(equations):
    """The chain written with ``einsum``, the scores stored transposed in the second form: the
    operands' matrices are transposed as the subscripts say."""
    first, second = equations
    leaves = _leaves((5, 0, 1, 4))

    def chain(x):
        q, k, v = _qkv(x)
        s = torch.einsum(first, q, k)
        return torch.einsum(second, torch.softmax(s, -1 if first.endswith("ij") else -2), v), s

    out, s = chain(mj.as_nested_tensor(leaves))
    assert pieces.holds_pieces(s)
    refs = [chain(c[None])[0][0] for c in leaves]
    assert_samples_and_grads(out, refs, leaves)


@pytest.mark.parametrize("order", ["scores first", "bias first"])
def test_scores_plus_a_bias_of_their_structure(order):
    """``q @ kᵀ + bias`` with a bias ``(B, H, j0, j0)`` of the scores' structure held as packed
    values (a pair projected to heads, as attention with pair bias has it): block by block, the
    bias read as views of its rows; values and gradients of the input and the pair."""
    leaves = _leaves((5, 0, 3, 4))
    g = torch.Generator().manual_seed(6)
    proj = torch.randn(H, 2, generator=g, dtype=F64, requires_grad=True)

    def attend(x, pair):
        q, k, v = _qkv(x)
        s = q @ k.transpose(-1, -2)
        bias = (pair @ proj.T).permute(0, 3, 1, 2)
        s = s + bias if order == "scores first" else bias + s
        return torch.softmax(s, -1) @ v, s

    x = mj.as_nested_tensor(leaves)
    rows = x[..., :2]
    out, s = attend(x, rows.unsqueeze(-2) * rows.unsqueeze(-3))
    assert pieces.holds_pieces(s)
    refs = [attend(c[None], (c[:, :2].unsqueeze(-2) * c[:, :2].unsqueeze(-3))[None])[0][0] for c in leaves]
    assert_samples_and_grads(out, refs, leaves + [proj])


def test_image_pieces_with_packed_images_of_their_structure():
    """An image batch held as pieces combined with one of its structure held as packed rows (and
    one channel broadcast): image by image, values and gradients."""
    g = torch.Generator().manual_seed(7)
    leaves = [torch.randn(2, h, w, generator=g, dtype=F64).requires_grad_() for h, w in ((3, 4), (0, 2), (2, 5))]
    weight = torch.randn(2, 2, 1, 1, generator=g, dtype=F64, requires_grad=True)
    x = mj.as_nested_tensor(leaves)

    def f(t):
        y = pieces.map_pieces(lambda p: F.conv2d(p, weight), t) if isinstance(t, mj.MultiJaggedTensor) else \
            torch.einsum("oc,bchw->bohw", weight[:, :, 0, 0], t)  # the 1×1 conv (dense refuses 0 rows)
        return (y * t) - t[:, :1] * 0.5

    out = f(x)
    assert pieces.holds_pieces(out)
    refs = [f(c[None])[0] for c in leaves]
    assert_samples_and_grads(out, refs, leaves + [weight])


def test_a_zero_dim_tensor_scale_keeps_the_blocks():
    """``scores * self.scale`` with a 0-dim tensor (one that requires grad too): block by block,
    its gradient the sum over samples."""
    leaves = _leaves((5, 0, 3))
    scale = torch.tensor(0.3, dtype=F64, requires_grad=True)

    def attend(x):
        q, k, v = _qkv(x)
        s = scale * (q @ k.transpose(-1, -2) * scale)
        return torch.softmax(s, -1) @ v, s

    out, s = attend(mj.as_nested_tensor(leaves))
    assert pieces.holds_pieces(s)
    assert_samples_and_grads(out, [attend(c[None])[0][0] for c in leaves], leaves + [scale])


def _sample_scores(c):
    q, k, _ = _qkv(c[None])
    return (q @ k.transpose(-1, -2))[0]


def test_held_scores_through_the_autograd_api_saving_and_compile():
    """``retain_grad``, a hook, ``torch.save``, ``deepcopy``, a compiled consumer, a transposed
    product and a product of two held operands see the per-sample scores."""
    import copy
    import io

    leaves = _leaves((5, 0, 3))
    x = mj.as_nested_tensor(leaves)
    q, k, v = _qkv(x)
    s = q @ k.transpose(-1, -2)
    s.retain_grad()
    seen = []
    s.register_hook(seen.append)
    out = torch.softmax(s, -1) @ v
    (out * out).sum().backward()
    for i, c in enumerate(leaves):
        si = _sample_scores(c.detach()).requires_grad_()
        oi = torch.softmax(si, -1) @ _qkv(c.detach()[None])[2][0]
        want = torch.autograd.grad((oi * oi).sum(), [si])[0]
        torch.testing.assert_close(s.grad.unbind()[i], want)
        torch.testing.assert_close(seen[0].unbind()[i], want)
    buf = io.BytesIO()
    torch.save((q @ k.transpose(-1, -2)).detach(), buf)
    buf.seek(0)
    copies = [torch.load(buf, weights_only=False), copy.deepcopy((q @ k.transpose(-1, -2)).detach())]
    compiled = torch.compile(lambda t: torch.softmax(t, -1) * 2, backend="aot_eager", fullgraph=True)
    got = compiled(q @ k.transpose(-1, -2))
    a = torch.softmax(q @ k.transpose(-1, -2), -1)
    assert pieces.holds_pieces(a)
    transposed, squared = a.transpose(-1, -2) @ v, a @ a
    for i, c in enumerate(leaves):
        ref = _sample_scores(c).detach()
        ai = torch.softmax(ref, -1)
        for t in copies:
            torch.testing.assert_close(t.unbind()[i], ref)
        torch.testing.assert_close(got.unbind()[i], ai * 2)
        torch.testing.assert_close(transposed.unbind()[i], ai.mT @ _qkv(c.detach()[None])[2][0])
        torch.testing.assert_close(squared.unbind()[i], ai @ ai)


def test_integer_scores_stay_packed():
    """Integer products are never held (pieces are floating images); values as dense."""
    g = torch.Generator().manual_seed(8)
    comps = [torch.randint(-3, 4, (H, n, D), generator=g) for n in (4, 0, 3)]
    q = mj.nested_tensor(comps, ragged_dims=(2,))
    s = q @ q.transpose(-1, -2)
    assert s.dtype == torch.int64 and not pieces.holds_pieces(s)
    for a, c in zip(s.unbind(), comps):
        assert torch.equal(a, c @ c.mT)


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_full_reductions_of_held_blocks(kind):
    """``s.sum()`` / ``s.mean()`` of held scores: each sample's own reduction, added, without
    packing (values and gradients as dense); a batch of empty samples gives 0 / NaN."""
    leaves = _leaves((5, 0, 3))
    x = mj.as_nested_tensor(leaves)
    q, k, _ = _qkv(x)
    s = q @ k.transpose(-1, -2)
    got = getattr(s, kind)()
    assert pieces.holds_pieces(s)
    ref = torch.cat([_sample_scores(c).reshape(-1) for c in leaves])
    ref = getattr(ref, kind)()
    torch.testing.assert_close(got, ref)
    ga = torch.autograd.grad(got, leaves)
    gb = torch.autograd.grad(ref, leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)
    e = pieces.map_pieces(lambda p: p * 1, mj.nested_tensor([torch.zeros(2, 0, 3, dtype=F64), torch.zeros(2, 4, 0, dtype=F64)]))
    assert pieces.holds_pieces(e)
    want = torch.zeros((), dtype=F64) if kind == "sum" else torch.full((), float("nan"), dtype=F64)
    torch.testing.assert_close(getattr(e, kind)(), want, equal_nan=True)


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_head_reductions_of_held_blocks(kind, keepdim):
    """Attention weights averaged over heads (``s.mean(1)``, as ``nn.MultiheadAttention`` returns
    them): each sample's own, the scores not packed; values and gradients."""
    leaves = _leaves((5, 0, 3))
    x = mj.as_nested_tensor(leaves)
    q, k, _ = _qkv(x)
    s = q @ k.transpose(-1, -2)
    out = getattr(s, kind)(1, keepdim=keepdim)
    assert pieces.holds_pieces(s) and out.shape[0] == 3 and len(out.shape) == (4 if keepdim else 3)
    refs = [getattr(_sample_scores(c), kind)(0, keepdim=keepdim) for c in leaves]
    assert_samples_and_grads(out, refs, leaves)


@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_with_weights(average):
    """``nn.MultiheadAttention(need_weights=True)``: output and weights as the module per sample,
    gradients of the input and every parameter."""
    torch.manual_seed(9)
    mha = torch.nn.MultiheadAttention(H * D, H, batch_first=True, dtype=F64)
    leaves = _leaves((5, 0, 3), width=H * D)
    x = mj.as_nested_tensor(leaves)
    out, w = mha(x, x, x, average_attn_weights=average)
    refs = [mha(c[None], c[None], c[None], average_attn_weights=average) for c in leaves]
    for a, b in zip(w.unbind(), refs):
        torch.testing.assert_close(a, b[1][0])
    assert_samples_and_grads(out, [r[0][0] for r in refs], leaves + list(mha.parameters()))


def test_held_scores_pack_lead_major_and_alias_as_dense():
    """Held scores read as values are lead-major, as the packed path makes them, so they are
    contiguous as torch.jagged reports it and ``.contiguous()`` is the tensor itself; ``dropout``
    in eval (and with p = 0) returns its input: writes through the result reach the scores."""
    leaves = [t.detach() for t in _leaves((5, 0, 3))]
    x = mj.as_nested_tensor(leaves)
    q, k, _ = _qkv(x)
    ops = {"contiguous": lambda t: t.contiguous(), "dropout eval": lambda t: F.dropout(t, 0.3, training=False),
           "dropout p=0": lambda t: F.dropout(t, 0.0, training=True), "none": lambda t: t}
    for name, op in ops.items():
        s = q @ k.transpose(-1, -2)
        assert pieces.holds_pieces(s)
        op(s).mul_(2)
        rows = s._values.shape[0]
        assert s._values.stride() == (1, rows), name
        for got, c in zip(s.unbind(), leaves):
            torch.testing.assert_close(got, _sample_scores(c) * 2, msg=name)
    s = q @ k.transpose(-1, -2)
    assert s.is_contiguous() and torch.ones_like(s)._values.stride() == s._values.stride()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_full_reductions_of_reduced_precision_blocks_accumulate_in_float(dtype):
    """``mean()`` / ``sum()`` of half scores whose per-sample sums exceed half's range: float
    accumulation, as dense (the per-sample sums in half overflowed to inf)."""
    x = mj.nested_tensor([torch.full((n, 3 * H * D), 1.0, dtype=dtype) for n in (40, 0, 30)])
    q, k, _ = _qkv(x * 4)
    s = q @ k.transpose(-1, -2)  # every score 64, about 8,000 of them per sample
    assert pieces.holds_pieces(s)
    want = torch.cat([t.reshape(-1) for t in s.unbind()])
    for kind in ("mean", "sum"):
        s = q @ k.transpose(-1, -2)
        got = getattr(s, kind)()
        assert got.dtype == dtype
        torch.testing.assert_close(got, getattr(want, kind)())


def test_in_place_write_under_inference_mode_keeps_the_history():
    """``s.mul_(c)`` inside ``inference_mode`` on held scores that require grad: the values change
    and the history is the product's, as dense (new inference-tensor pieces had cut the gradient
    of q and k); a read there (a logged max) packs them as a normal tensor, which later ops use."""
    leaves = _leaves((5, 0, 3))

    def attend(x, log=None):
        q, k, v = _qkv(x)
        s = q @ k.transpose(-1, -2)
        with torch.inference_mode():
            s.mul_(0.5)
            if log is not None:
                log.append(s.amax(-1))
        return torch.softmax(s, -1) @ v

    out = attend(mj.as_nested_tensor(leaves))
    refs = [attend(c[None])[0] for c in leaves]
    assert_samples_and_grads(out, refs, leaves)
    logged: list = []
    out = attend(mj.as_nested_tensor(leaves), logged)
    assert_samples_and_grads(out, [attend(c[None])[0] for c in leaves], leaves)
