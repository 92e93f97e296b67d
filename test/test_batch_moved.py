"""Static dims in front of the batch dim (NOTE [ Batch-moved tokens ]): the packed-qkv idiom
``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``, ``torch.stack([a, b], 0)``,
``movedim`` — per sample, with gradients of every leaf and a zero-length sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged.ops.shape.leading import BatchMoved

F64 = torch.float64
B, H, D = 3, 2, 4


def _comps(ns=(3, 0, 4), width=3 * H * D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, width, generator=g, dtype=F64, requires_grad=True) for n in ns]


@pytest.mark.parametrize("split", ["unbind", "index", "select"])
def test_packed_qkv_attention_per_sample(split):
    comps = _comps()
    x = mj.as_nested_tensor(comps)
    qkv = x.reshape(B, x.shape[1], 3, H, D).permute(2, 0, 3, 1, 4)  # (3, B, H, j0, D)
    assert isinstance(qkv, BatchMoved) and qkv.shape[:3] == (3, B, H) and qkv.dim() == 5
    q, k, v = {"unbind": lambda: qkv.unbind(0), "index": lambda: (qkv[0], qkv[1], qkv[2]),
               "select": lambda: tuple(qkv.select(0, i) for i in range(3))}[split]()
    assert isinstance(q, mj.MultiJaggedTensor) and q.shape[1] == H and q.shape[2] == x.shape[1]
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)  # (B, j0, H·D)
    refs = []
    for c in comps:
        s = c.reshape(c.shape[0], 3, H, D).permute(1, 2, 0, 3)  # (3, H, n, D)
        refs.append(F.scaled_dot_product_attention(s[0], s[1], s[2]).transpose(0, 1).flatten(-2))
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    got = torch.autograd.grad(sum((a ** 2).sum() for a in out.unbind()), comps)
    want = torch.autograd.grad(sum((r ** 2).sum() for r in refs), comps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_stack_along_the_batch_dim_and_back():
    comps = _comps(width=2)
    x = mj.as_nested_tensor(comps)
    s = torch.stack([x, 2 * x], 0)  # (2, B, j0, 2)
    assert isinstance(s, BatchMoved) and s.shape[:2] == (2, B) and len(s) == 2
    a, b = s.unbind(0)
    for u, w, c in zip(a.unbind(), b.unbind(), comps):
        torch.testing.assert_close(u, c)
        torch.testing.assert_close(w, 2 * c)
    back = s.permute(1, 0, 2, 3)  # the batch first again: (B, 2, j0, 2)
    assert isinstance(back, mj.MultiJaggedTensor)
    for t, c in zip(back.unbind(), comps):
        torch.testing.assert_close(t, torch.stack([c, 2 * c]))
    moved = s.movedim(0, -1)  # (B, j0, 2, 2)
    for t, c in zip(moved.unbind(), comps):
        torch.testing.assert_close(t, torch.stack([c, 2 * c], -1))


def test_movedim_and_transpose_compose():
    x = mj.as_nested_tensor(_comps(width=6))
    y = x.unflatten(-1, (2, 3)).movedim(2, 0)  # (2, B, j0, 3)
    assert isinstance(y, BatchMoved) and y.shape[0] == 2
    z = y.transpose(0, 1)  # (B, 2, j0, 3): batch first
    assert isinstance(z, mj.MultiJaggedTensor)
    for t, c in zip(z.unbind(), x.unbind()):
        torch.testing.assert_close(t, c.unflatten(-1, (2, 3)).movedim(1, 0))


def test_token_errors_name_the_op():
    x = mj.as_nested_tensor(_comps(width=6))
    y = x.unflatten(-1, (2, 3)).permute(2, 0, 1, 3)
    with pytest.raises(NotImplementedError, match=r"^flip\(\).*batch dim is not at dim 0"):
        y.flip(1)  # the batch dim
    with pytest.raises(IndexError):
        y[2]
    full = mj.as_nested_tensor(_comps(ns=(3, 1, 4), width=6))
    lead = full.permute(1, 0, 2)  # a ragged dim leads: x[i] selects per sample, unbind(0) cannot
    first = lead[0]  # the first token of each sample: (B, C)
    torch.testing.assert_close(first, torch.stack([c[0] for c in full.unbind()]))
    with pytest.raises(NotImplementedError, match="ragged"):
        lead.unbind(0)


def test_sequence_first_encoder_layer_per_sample():
    """``nn.TransformerEncoderLayer(batch_first=False)`` on sequence-first input ``x.transpose(0, 1)``
    (N, B, C): each sample as the dense layer computes it, gradients of the input and every
    parameter included."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=False).double().eval()
    comps = [torch.randn(n, 8, dtype=F64, requires_grad=True) for n in (3, 1, 4)]
    x = mj.as_nested_tensor(comps)
    out = layer(x.transpose(0, 1)).transpose(0, 1)  # back to (B, j0, C)
    assert isinstance(out, mj.MultiJaggedTensor)
    refs = [layer(c.unsqueeze(1))[:, 0] for c in comps]  # (n, 1, C): a batch of one, sequence-first
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    params = list(layer.parameters())
    got = torch.autograd.grad(sum((a ** 2).sum() for a in out.unbind()), comps + params)
    want = torch.autograd.grad(sum((r ** 2).sum() for r in refs), comps + params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_sequence_first_ops_map_their_dims():
    comps = [torch.randn(n, 3, dtype=F64) for n in (2, 4)]
    x = mj.nested_tensor(comps)
    s = x.transpose(0, 1)  # (N, B, C)
    m = s.mean(0)  # over each sample's sequence: dense (B, C)
    assert type(m) is torch.Tensor
    torch.testing.assert_close(m, torch.stack([c.mean(0) for c in comps]))
    bias = torch.randn(3, dtype=F64)
    y = (torch.softmax(s * 2 + bias, dim=-1) - 1).transpose(0, 1)
    for a, c in zip(y.unbind(), comps):
        torch.testing.assert_close(a, torch.softmax(c * 2 + bias, -1) - 1)
    z = s.sum(-1, keepdim=True).transpose(0, 1)
    for a, c in zip(z.unbind(), comps):
        torch.testing.assert_close(a, c.sum(-1, keepdim=True))
    per = torch.randn(2, 3, dtype=F64)  # (B, C): dense broadcasting gives sample b the row per[b]
    for a, c, p in zip((s + per).transpose(0, 1).unbind(), comps, per):
        torch.testing.assert_close(a, c + p)
    with pytest.raises(NotImplementedError, match="dense operand of 4 dims"):
        s + torch.randn(1, 1, 2, 3, dtype=F64)


@pytest.mark.parametrize("op", ["max", "min", "argmax", "cumsum", "norm", "std", "logsumexp", "median", "slice", "sort",
                                "argsort", "topk", "kthvalue", "flip", "roll"])
@pytest.mark.parametrize("dim", [0, -1])
def test_sequence_first_ops_over_one_dim_per_sample(op, dim):
    """Ops over one dim of a sequence-first token (``max(0)``, ``cumsum(0)``, ``norm(dim=0)``, ``t[1:]``,
    ``sort(0)``, ``flip(0)``) act on the mapped dim of each sample, with gradients; the result keeps the
    token's layout."""
    g = torch.Generator().manual_seed(1)
    # an empty sample where dense takes one along the dim
    ns = (2, 4, 0, 1) if op in ("cumsum", "sort", "argsort", "flip", "roll", "slice") or dim == -1 else (2, 4, 1)
    comps = [torch.randn(n, 3, generator=g, dtype=F64) for n in ns]
    x = mj.nested_tensor(comps, requires_grad=True)
    leaves = [c.clone().requires_grad_() for c in comps]
    fns = {
        "max": lambda t, d: t.max(d).values, "min": lambda t, d: torch.min(t, dim=d)[0],
        "argmax": lambda t, d: t.argmax(d), "cumsum": lambda t, d: t.cumsum(d),
        "norm": lambda t, d: t.norm(dim=d), "std": lambda t, d: t.std(d), "logsumexp": lambda t, d: t.logsumexp(d),
        "median": lambda t, d: t.median(d).values, "slice": lambda t, d: t[1:] if d == 0 else t[..., 1:],
        "sort": lambda t, d: torch.sort(t, dim=d, descending=True, stable=True).values,
        "argsort": lambda t, d: t.argsort(d), "topk": lambda t, d: t.topk(1, d).values,
        "kthvalue": lambda t, d: t.kthvalue(1, d).values, "flip": lambda t, d: t.flip(d),
        "roll": lambda t, d: torch.roll(t, shifts=1, dims=d),
    }
    f = fns[op]
    if op == "slice" and dim == -1:
        pytest.skip("a slice of the last dim is not a leading-dim index")
    out = f(x.transpose(0, 1), dim)  # (N, B, C) token: dim 0 is each sample's sequence
    ref = [f(c, dim) for c in leaves]  # (N, C) per sample: the same dim
    if isinstance(out, BatchMoved):
        out = out.transpose(0, 1)
        got = out.unbind()
    elif isinstance(out, mj.MultiJaggedTensor):
        got = out.unbind()
    else:
        got = list(out.transpose(0, 1)) if out.dim() == 3 else list(out)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, equal_nan=True)  # std of one element is nan, as dense
    if op in ("argmax", "argsort"):
        return
    gx, = torch.autograd.grad(sum((a * a).sum() for a in got), x)
    refs = torch.autograd.grad(sum((b * b).sum() for b in ref), leaves)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_keepdim_reduction_over_a_ragged_dim_keeps_the_token_order(op):
    """``t.mean(0, keepdim=True)`` of a sequence-first ``(N, B, C)`` token is dense ``(1, B, C)``
    (every ragged dim reduced), and of the packed-qkv token ``(3, B, H, N, D)`` over dims
    ``(0, 3)`` ``(1, B, H, 1, D)``: the token's order, not the batch-first tensor's. CLIP's
    ``AttentionPool2d`` prepends that mean with ``cat`` along dim 0."""
    comps = _comps()
    x = mj.nested_tensor(comps, requires_grad=True)
    t = x.transpose(0, 1)
    f = getattr(torch.Tensor, op)
    m = f(t, 0, keepdim=True)
    assert type(m) is torch.Tensor and m.shape == (1, B, 3 * H * D)
    ok = [c for c in comps if c.shape[0]]
    want = torch.stack([f(c, 0, keepdim=True) for c in ok], 1)
    torch.testing.assert_close(m[:, [i for i, c in enumerate(comps) if c.shape[0]]], want)
    qkv = x.reshape(B, x.shape[1], 3, H, D).permute(2, 0, 3, 1, 4)
    r = f(qkv, (0, 3), keepdim=True)
    assert type(r) is torch.Tensor and r.shape == (1, B, H, 1, D)
    for i, c in enumerate(comps):
        if c.shape[0]:
            torch.testing.assert_close(r[:, i], f(c.view(-1, 3, H, D).permute(1, 2, 0, 3), (0, 2), keepdim=True))
    if op in ("sum", "mean"):
        gx, = torch.autograd.grad(m.sum() + r.sum(), x)
        refs = torch.autograd.grad(sum(f(c, 0).sum() + f(c.view(-1, 3, H, D), (0, 1)).sum() for c in ok), ok)
        for a, b in zip([g for g, c in zip(gx.unbind(), comps) if c.shape[0]], refs):
            torch.testing.assert_close(a, b)


def test_clip_attention_pool_per_sample():
    """CLIP's ``AttentionPool2d`` as written: sequence-first tokens, their mean prepended."""
    mha = torch.nn.MultiheadAttention(8, 2, dtype=F64).eval()

    def pool(x):
        x = x.transpose(0, 1)
        x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0)
        return mha(x[:1], x, x, need_weights=False)[0][0]

    comps = _comps((3, 2, 5), width=8)
    got = pool(mj.nested_tensor(comps))
    torch.testing.assert_close(got, torch.cat([pool(c[None]) for c in comps]))


def test_sequence_first_chunk_squeeze_and_comparisons_per_sample():
    """fairseq's in-projection ``F.linear(t, w).chunk(3, dim=-1)`` on a sequence-first ``(N, B, C)``
    token, CLIP's ``t[:1].squeeze(0)``, and comparisons / logical ops building a mask from the token,
    as each sample's dense code; gradients through the chunks."""
    comps = _comps((3, 0, 4), width=4)
    x = mj.nested_tensor(comps, requires_grad=True)
    w = torch.randn(12, 4, dtype=F64, requires_grad=True)
    t = x.transpose(0, 1)
    q, k, v = F.linear(t, w).chunk(3, dim=-1)
    s0, s1 = torch.split(F.linear(t, w), [4, 8], -1)
    assert s1.shape[-1] == 8
    m = (t > 0) & ~(t.abs() < 0.1)
    first = mj.nested_tensor([c for c in comps if c.shape[0]]).transpose(0, 1)[:1].squeeze(0)  # (B, C): first tokens
    for i, c in enumerate(comps):
        qi, ki, vi = F.linear(c, w).chunk(3, -1)
        torch.testing.assert_close(q.transpose(0, 1).unbind()[i], qi)
        torch.testing.assert_close(v.transpose(0, 1).unbind()[i], vi)
        torch.testing.assert_close(s0.transpose(0, 1).unbind()[i], F.linear(c, w)[:, :4])
        assert torch.equal(m.transpose(0, 1).unbind()[i], (c > 0) & ~(c.abs() < 0.1))
    torch.testing.assert_close(first, torch.stack([c[0] for c in comps if c.shape[0]]))
    gx, gw = torch.autograd.grad((q * k).sum() + v.sum(), [x, w])
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    refs = [F.linear(c, w).chunk(3, -1) for c in leaves]
    want = torch.autograd.grad(sum((a * b).sum() + c.sum() for a, b, c in refs), [*leaves, w])
    for a, b in zip(gx.unbind(), want[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gw, want[-1])
    with pytest.raises(NotImplementedError, match="squeeze"):
        t.squeeze()
    with pytest.raises((NotImplementedError, mj.StructureError), match="chunk"):
        t.chunk(2)  # along the token's dim 0, each sample's sequence: never the batch-first tensor's samples


def test_sequence_first_cat_with_a_dense_token_per_sample():
    """``torch.cat([cls, t], 0)`` of a sequence-first token and a dense ``(1, B, C)`` prepends the
    dense row to each sample, with gradients of both; ``cat`` of tokens along other dims too; along
    the batch dim it raises, naming the permutation."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=F64) for n in (2, 4, 0)]
    cls = torch.randn(1, 3, 3, generator=g, dtype=F64, requires_grad=True)
    x = mj.nested_tensor(comps, requires_grad=True)
    t = x.transpose(0, 1)
    out = torch.cat([cls, t], 0)
    assert isinstance(out, BatchMoved)
    got = out.transpose(0, 1).unbind()
    leaves = [c.clone().requires_grad_() for c in comps]
    c2 = cls.detach().clone().requires_grad_()
    refs = [torch.cat([c2[:, i], c], 0) for i, c in enumerate(leaves)]
    for a, b in zip(got, refs):
        torch.testing.assert_close(a, b)
    gx, gc = torch.autograd.grad(sum((a ** 2).sum() for a in got), [x, cls])
    want = torch.autograd.grad(sum((b ** 2).sum() for b in refs), leaves + [c2])
    for a, b in zip(gx.unbind(), want[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gc, want[-1])
    for a, c in zip(torch.cat([t, 2 * t], -1).transpose(0, 1).unbind(), comps):
        torch.testing.assert_close(a, torch.cat([c, 2 * c], -1))
    with pytest.raises(NotImplementedError, match=r"^cat\(\).*permuted \(1, 0, 2\)"):
        torch.cat([t, t], 1)


def test_unbind_of_the_leading_dim_is_one_unbind():
    # q, k, v = qkv.unbind(0) backpropagates as dense unbind does: one node stacking the three
    # gradients, not a select per piece whose backward scatters into a zero gradient of the whole
    x = mj.nested_tensor([torch.randn(n, 12) for n in (3, 0, 5)]).requires_grad_()
    qkv = x.reshape(3, x.shape[1], 3, 2, 2).permute(2, 0, 3, 1, 4)
    pieces = qkv.unbind(0)

    def nodes(t):
        seen, todo = [], [t.grad_fn]
        while todo:
            f = todo.pop()
            if f is not None and f not in seen:
                seen.append(f)
                todo += [g for g, _ in f.next_functions]
        return seen

    names = [[type(f).__name__ for f in nodes(p)] for p in pieces]
    assert not any("Select" in n for ns in names for n in ns), names
    unbinds = [{f for f in nodes(p) if "Unbind" in type(f).__name__} for p in pieces]
    assert len(unbinds[0]) == 1 and unbinds[0] == unbinds[1] == unbinds[2], names


def test_size_one_dims_added_to_a_token():
    """``unsqueeze`` and a ``reshape`` that only adds size-1 dims (einops' ``'b n (l h) -> l b h n 1'``,
    En-transformer's output gates) keep the token, per sample, with gradients."""
    from einops import rearrange

    xs = [torch.randn(n, 4, dtype=torch.float64, requires_grad=True) for n in (3, 0, 5)]
    x = torch.nested.as_nested_tensor(xs, layout=mj.multi_jagged)
    ref = [rearrange(xi[None], "b n (l h) -> l b h n 1", h=2) for xi in xs]
    for out in (rearrange(x, "b n (l h) -> l b h n 1", h=2), x.unflatten(-1, (2, 2)).permute(2, 0, 3, 1).unsqueeze(-1)):
        assert out.shape[:3] == (2, 3, 2) and out.shape[4] == 1
        for l in range(2):
            for i, r in enumerate(ref):
                assert torch.equal(out[l].unbind()[i], r[l, 0])
    mid = x.unflatten(-1, (2, 2)).permute(2, 0, 3, 1).unsqueeze(2)  # (2, B, 1, 2, j0)
    assert mid.shape[:4] == (2, 3, 1, 2)
    for l in range(2):
        for i, xi in enumerate(xs):
            assert torch.equal(mid[l].unbind()[i], xi[None].unflatten(-1, (2, 2)).permute(2, 0, 3, 1).unsqueeze(2)[l, 0])
    out = x.unflatten(-1, (2, 2)).permute(2, 0, 3, 1).unsqueeze(-1) * 3
    total = sum((out[l] ** 2).sum(dim=(1, 2, 3)).sum() for l in range(2))
    for g, xi in zip(torch.autograd.grad(total, xs), xs):
        torch.testing.assert_close(g, 18 * xi)
