"""``F.scaled_dot_product_attention`` with one side dense: dense queries over each sample's own
multi_jagged keys and values (DETR's object queries, Perceiver's latents, pooling by learned
queries), and multi_jagged queries over a dense memory (a Perceiver's decoder), against dense
SDPA per sample. The modules that call it (``nn.MultiheadAttention``, a decoder layer) are in
``test_attention_modules.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_sdpa_dense_queries_over_ragged_keys(causal, shared):
    """``F.scaled_dot_product_attention(q, k, v)`` with a dense ``q (B, H, L, D)`` (or one shared
    ``(1, H, L, D)``: pooling by learned queries) and multi_jagged ``k / v (B, H, j0, D)``: per
    sample, a dense result; gradients to q, k and v; no leakage; a mask or other structures raise."""
    g = torch.Generator().manual_seed(0)
    ns, h, length, d = (4, 0, 6, 1), 2, 3, 5
    q = torch.randn(1 if shared else len(ns), h, length, d, dtype=torch.float64, generator=g, requires_grad=True)
    ks = [torch.randn(h, n, d, dtype=torch.float64, generator=g, requires_grad=True) for n in ns]
    vs = [torch.randn(h, n, 2, dtype=torch.float64, generator=g, requires_grad=True) for n in ns]
    k, v = mj.as_nested_tensor(ks, ragged_dims=(2,)), mj.as_nested_tensor(vs, ragged_dims=(2,))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert type(out) is torch.Tensor and out.shape == (len(ns), h, length, 2)
    refs = [F.scaled_dot_product_attention(q[0 if shared else i][None], ks[i][None], vs[i][None], is_causal=causal)[0]
            for i in range(len(ns))]
    for o, r in zip(out, refs):
        torch.testing.assert_close(o, r)
    got = torch.autograd.grad((out ** 2).sum(), [q, *ks, *vs])
    exp = torch.autograd.grad(sum((r ** 2).sum() for r in refs), [q, *ks, *vs])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    other = [t.detach().clone() for t in ks]
    other[2] = other[2] * 3
    moved = F.scaled_dot_product_attention(q.detach(), mj.as_nested_tensor(other, ragged_dims=(2,)), v.detach(),
                                           is_causal=causal)
    torch.testing.assert_close(moved[[0, 1, 3]], out.detach()[[0, 1, 3]], rtol=0, atol=0)
    with pytest.raises(mj.StructureError, match="attn_mask"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(length, 1, dtype=torch.bool))
    pair_k = mj.nested_tensor([torch.randn(n, n, d) for n in (2, 3)])
    with pytest.raises(mj.StructureError, match="only ragged dim is dim -2"):
        F.scaled_dot_product_attention(torch.randn(2, 2, 3, d), pair_k, pair_k)
    with pytest.raises(mj.StructureError, match="batch size"):
        F.scaled_dot_product_attention(torch.randn(3, h, length, d, dtype=torch.float64), k, v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_sdpa_ragged_queries_over_dense_keys(causal, shared):
    """Multi_jagged ``q (B, H, j0, D)`` over dense ``k / v (B, H, S, D)`` (or ``(1, H, S, D)``,
    one memory for the batch: a Perceiver's decoder reading its latents): per sample, the
    queries' structure back; gradients to q, k and v; a mask raises."""
    g = torch.Generator().manual_seed(1)
    ns, h, s, d = (4, 0, 6), 2, 3, 5
    qs = [torch.randn(h, n, d, dtype=torch.float64, generator=g, requires_grad=True) for n in ns]
    b = 1 if shared else len(ns)
    k = torch.randn(b, h, s, d, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(b, h, s, 2, dtype=torch.float64, generator=g, requires_grad=True)
    out = F.scaled_dot_product_attention(mj.as_nested_tensor(qs, ragged_dims=(2,)), k, v, is_causal=causal)
    assert mj.is_nested(out) and out.shape[-1] == 2
    refs = [F.scaled_dot_product_attention(qs[i][None], k[0 if shared else i][None], v[0 if shared else i][None],
                                           is_causal=causal)[0] for i in range(len(ns))]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    got = torch.autograd.grad(sum((o ** 2).sum() for o in out.unbind()), [*qs, k, v])
    exp = torch.autograd.grad(sum((r ** 2).sum() for r in refs), [*qs, k, v])
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
    with pytest.raises(mj.StructureError, match="attn_mask"):
        F.scaled_dot_product_attention(mj.as_nested_tensor(qs, ragged_dims=(2,)), k, v,
                                       attn_mask=torch.ones(2, s, dtype=torch.bool))  # a query dim of 2: no sample's


@pytest.mark.parametrize("kind", ["bool (B, 1, 1, S)", "float (B, 1, 1, S)", "bool (B, H, 1, S)", "float (1, S)",
                                  "multi_jagged (B, 1, j0, S)"])
def test_sdpa_ragged_queries_over_padded_dense_keys_with_a_mask(kind):
    """Ragged queries (image tokens) reading a padded dense context with its padding mask
    (Stable Diffusion's cross-attention): a dense mask broadcast over the query dim, or a
    multi_jagged one with the queries' ragged dim; per sample, values and gradients of q, k, v and
    a float mask (a sample whose every key is masked is NaN, as dense)."""
    g = torch.Generator().manual_seed(2)
    ns, h, s, d = (3, 1, 0, 4), 2, 5, 4
    qs = [torch.randn(h, n, d, dtype=torch.float64, generator=g, requires_grad=True) for n in ns]
    k = torch.randn(len(ns), h, s, d, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(len(ns), h, s, 3, dtype=torch.float64, generator=g, requires_grad=True)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    mask = {"bool (B, 1, 1, S)": ~pad[:, None, None], "bool (B, H, 1, S)": ~pad[:, None, None].expand(-1, h, -1, -1),
            "float (B, 1, 1, S)": torch.randn(len(ns), 1, 1, s, dtype=torch.float64, generator=g, requires_grad=True),
            "float (1, S)": torch.randn(1, s, dtype=torch.float64, generator=g, requires_grad=True),
            "multi_jagged (B, 1, j0, S)": None}[kind]
    if mask is None:
        per = [torch.rand(1, n, s, generator=g) > 0.3 for n in ns]
        mask = mj.nested_tensor(per, ragged_dims=(2,))
    else:
        per = [mask[0] if mask.dim() == 2 else mask[i] for i in range(len(ns))]
    out = F.scaled_dot_product_attention(mj.as_nested_tensor(qs, ragged_dims=(2,)), k, v, attn_mask=mask)
    refs = [F.scaled_dot_product_attention(qs[i][None], k[i][None], v[i][None], attn_mask=per[i][None])[0]
            for i in range(len(ns))]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r, equal_nan=True)
    if kind == "bool (B, 1, 1, S)":  # compiled alike (the mask's key dim is the keys' rows there too)
        torch._dynamo.reset()
        f = torch.compile(lambda q, kk, vv, m: F.scaled_dot_product_attention(q, kk, vv, attn_mask=m), backend="aot_eager")
        for o, r in zip(f(mj.as_nested_tensor(qs, ragged_dims=(2,)), k, v, mask).unbind(), refs):
            torch.testing.assert_close(o, r)
    leaves = [*qs, k, v] + ([mask] if mask.requires_grad else [])
    got = torch.autograd.grad(sum((o ** 2).sum() for o in out.unbind()), leaves)
    exp = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e)
