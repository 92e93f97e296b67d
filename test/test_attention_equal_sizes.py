"""``F.scaled_dot_product_attention`` with a mask whose dims have one size in every sample where
the scores have the other kind of dim (NOTE [ Static sizes equal to a ragged dim ] in
ops/_routing.py), as elementwise ops take such operands: a pair bias of equal-length samples (a
cropped batch, B = 1), which inference makes ``(B, j0, n, C)``, beside scores ragged along the
other pair dim; a dense mask of one length beside an equal-length batch; and a dense mask of the
scores' full rank (its batch dim 1 or B) over static queries. Against dense SDPA per sample,
values and the gradients of every leaf."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

F64 = torch.float64


def _grads(outs, refs, got_leaves, ref_leaves):
    torch.testing.assert_close(len(outs), len(refs))
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    ws = [torch.randn(r.shape, dtype=F64, generator=torch.Generator().manual_seed(i)) for i, r in enumerate(refs)]
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, ws)), got_leaves)
    exp = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, ws)), ref_leaves)
    return got, exp


@pytest.mark.parametrize("lengths", [(5,), (4, 4, 4)], ids=["B=1", "cropped"])
def test_triangle_attention_with_a_pair_bias_of_equal_lengths(lengths):
    """Triangle attention over a pair built by ``nested_tensor`` from equal-length samples: the
    pair is ``(B, j0, n, C)`` (the second pair dim static), its bias ``(B, 1, 1, j0, n)`` after the
    permute; rows attend along columns with the bias, as each sample's dense code."""
    g = torch.Generator().manual_seed(0)
    zs = [torch.randn(n, n, 4, dtype=F64, generator=g, requires_grad=True) for n in lengths]
    w = torch.randn(4, 2, dtype=F64, generator=g, requires_grad=True)

    def block(z, batched):
        q = z.unsqueeze(-3) if batched else z[:, None]  # rows as a batch dim: (…, I, 1, J, C)
        bias = (z @ w)[..., :1].movedim(-1, -3)  # (…, 1, I, J)
        bias = bias.unsqueeze(-4) if batched else bias
        return F.scaled_dot_product_attention(q, q, q, attn_mask=bias)

    z = torch.nested.as_nested_tensor(zs, layout=mj.multi_jagged)
    assert len(z._ragged_dims) == 1  # inference: equal lengths leave one pair dim static
    out = block(z, True)
    refs = [block(c, False) for c in zs]
    got, exp = _grads(out.unbind(), refs, [*zs, w], [*zs, w])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shape", [(1, 1, 1, 3, 3), (3, 1, 1, 3, 3), (3, 1, 1, 1, 3), (1, 1, 1, 1, 1), (1, 3, 3)])
def test_dense_mask_of_the_scores_rank_over_static_queries(shape):
    """Queries ``(B, j0, 1, L, D)`` with L static (each row attends inside itself) and a dense mask
    with a batch dim (1 or B) of the scores' rank, or fewer dims: each sample reads its slice;
    the mask's gradient comes back in its own shape; an empty sample."""
    g = torch.Generator().manual_seed(1)
    ns, length = (4, 0, 2), 3
    xs = [torch.randn(n, length, 4, dtype=F64, generator=g, requires_grad=True) for n in ns]
    m = torch.randn(shape, dtype=F64, generator=g, requires_grad=True)
    q = mj.as_nested_tensor(xs).unsqueeze(2)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    full = m.expand(len(ns), *m.shape[1:]) if m.dim() == 5 else m
    refs = [F.scaled_dot_product_attention(c[:, None], c[:, None], c[:, None], attn_mask=full[i] if m.dim() == 5 else m)
            for i, c in enumerate(xs)]
    got, exp = _grads(out.unbind(), refs, [*xs, m], [*xs, m])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)


def test_dense_square_mask_beside_an_equal_length_batch():
    """A dense ``(N, N)`` mask (a fixed causal or relative bias) beside queries ``(B, H, j0, D)`` whose
    samples all have N tokens: each sample's dense attention with that mask; other lengths raise."""
    g = torch.Generator().manual_seed(2)
    n, h = 4, 2
    qs = [torch.randn(h, n, 3, dtype=F64, generator=g, requires_grad=True) for _ in range(3)]
    m = torch.randn(n, n, dtype=F64, generator=g, requires_grad=True)
    q = mj.as_nested_tensor(qs, ragged_dims=(2,))
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    refs = [F.scaled_dot_product_attention(c, c, c, attn_mask=m) for c in qs]
    got, exp = _grads(out.unbind(), refs, [*qs, m], [*qs, m])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    other = mj.nested_tensor([torch.randn(h, k, 3, dtype=F64) for k in (4, 3)], ragged_dims=(2,))
    with pytest.raises(mj.StructureError, match="attn_mask"):
        F.scaled_dot_product_attention(other, other, other, attn_mask=m.detach())
