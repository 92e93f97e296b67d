"""``F.embedding_bag`` / ``nn.EmbeddingBag`` of a multi_jagged input whose last dim is static: each
sample is dense's 2-D input, one bag per row, against the per-sample reference with gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_of_rows_of_ids(mode):
    # (B, j0, T): each sample is dense's 2-D input, one bag of T ids per row (multi-hot fields of
    # a history); it raised. Gradients reach the weight and per_sample_weights.
    g = torch.Generator().manual_seed(0)
    w = torch.randn(20, 6, dtype=torch.float64, generator=g, requires_grad=True)
    ids = [torch.randint(0, 20, (n, 4), generator=g) for n in (3, 0, 2)]
    h = torch.nested.nested_tensor(ids, layout=mj.multi_jagged)
    for pidx in (None, 0):
        out = F.embedding_bag(h, w, mode=mode, padding_idx=pidx)
        ref = [F.embedding_bag(t, w, mode=mode, padding_idx=pidx) for t in ids]
        for a, r in zip(out.unbind(), ref):
            torch.testing.assert_close(a, r)
        (got,) = torch.autograd.grad((out * out).sum(dim=(1, 2)).sum(), w)
        (want,) = torch.autograd.grad(sum((r * r).sum() for r in ref), w)
        torch.testing.assert_close(got, want)
    if mode == "sum":
        ws = [torch.rand(n, 4, dtype=torch.float64, generator=g, requires_grad=True) for n in (3, 0, 2)]
        out = F.embedding_bag(h, w, mode="sum", per_sample_weights=torch.nested.as_nested_tensor(ws, layout=mj.multi_jagged))
        ref = [F.embedding_bag(t, w, mode="sum", per_sample_weights=q) for t, q in zip(ids, ws)]
        got = torch.autograd.grad((out * out).sum(dim=(1, 2)).sum(), [w, *ws])
        want = torch.autograd.grad(sum((r * r).sum() for r in ref), [w, *ws])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
