"""Dense and multi_jagged operands meeting in indexing: a dense table indexed by a multi_jagged index
(``table[b, idx]`` of a ``(B, K, …)`` table, each sample's own rows: PointNet++'s feature
propagation), and a batch taken along a static dim by dense indices broadcast over its rows;
against the per-sample reference with gradients and a zero-length sample."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj


@pytest.mark.parametrize("batch_index", ["arange3", "arange2", "permuted", "one"])
def test_table_rows_per_sample(batch_index):
    g = torch.Generator().manual_seed(0)
    b, k, c = 3, 4, 5
    table = torch.randn(b, k, c, dtype=torch.float64, generator=g, requires_grad=True)
    ids = [torch.randint(0, k, (n, 2), generator=g) for n in (3, 0, 5)]
    idx = torch.nested.nested_tensor(ids, layout=mj.multi_jagged)
    bi = {"arange3": torch.arange(b)[:, None, None], "arange2": torch.arange(b)[:, None],
          "permuted": torch.tensor([2, 0, 1])[:, None, None], "one": torch.tensor(1)}[batch_index]
    rows = bi.reshape(-1).expand(b)
    out = table[bi, idx]
    want = [table[rows[i]][ids[i]] for i in range(b)]
    assert out.shape[0] == b and out._ragged_dims == (1,)
    for a, w in zip(out.unbind(), want):
        assert torch.equal(a, w)
    (got,) = torch.autograd.grad((out * out).sum(dim=(1, 2, 3)).sum(), table)
    (ref,) = torch.autograd.grad(sum((w * w).sum() for w in want), table)
    torch.testing.assert_close(got, ref)


def test_table_rows_errors():
    table = torch.randn(3, 4, 5)
    idx = mj.nested_tensor([torch.randint(0, 4, (n, 2)) for n in (3, 0, 5)])
    with pytest.raises(IndexError, match="one sample per sample"):
        table[torch.arange(2)[:, None, None], idx]
    with pytest.raises(IndexError, match="out of bounds"):
        table[torch.arange(3)[:, None, None], idx + 10]
    with pytest.raises(IndexError, match="int64 or int32"):
        table[torch.arange(3)[:, None, None], idx.float()]


@pytest.mark.parametrize("index", [[[[1, 3]], [[0, 0]], [[3, -1]]], [[[2]]]])
def test_take_along_a_static_dim_by_dense_indices_broadcast_over_the_rows(index):
    """``take_along_dim(x, idx, dim=2)`` of ``(B, j0, C)`` with a dense ``(B or 1, 1, k)`` index:
    dense broadcasts it over each sample's rows (it failed in torch's C++)."""
    comps = [torch.randn(n, 4, dtype=torch.float64, requires_grad=True) for n in (3, 0, 2)]
    x = torch.nested.as_nested_tensor(comps, layout=mj.multi_jagged)
    idx = torch.tensor(index)
    out = torch.take_along_dim(x, idx, 2)
    want = [torch.take_along_dim(c, idx[i if idx.shape[0] > 1 else 0], 1) for i, c in enumerate(comps)]
    for a, w in zip(out.unbind(), want):
        assert torch.equal(a, w)
    got = torch.autograd.grad(out.sum(dim=(1, 2)).sum(), comps, allow_unused=True, materialize_grads=True)
    ref = torch.autograd.grad(sum(w.sum() for w in want), comps, allow_unused=True, materialize_grads=True)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
