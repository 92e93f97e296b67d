"""``torch.multinomial`` of a multi_jagged batch of distributions: each sample's draws from its
own categories (random, so checked by support and by one-hot distributions, which have one draw)."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj


def test_draws_over_a_ragged_last_dim_stay_in_each_sample():
    g = torch.Generator().manual_seed(0)
    lengths = (5, 1, 3)
    p = torch.nested.nested_tensor([torch.rand(n, generator=g) + 0.01 for n in lengths], layout=mj.multi_jagged)
    for n, replacement in ((1, False), (6, True)):
        d = torch.multinomial(p, n, replacement, generator=g)
        assert type(d) is torch.Tensor and d.shape == (3, n) and d.dtype == torch.int64
        assert bool((d >= 0).all()) and bool((d < torch.tensor(lengths)[:, None]).all())
    one_hot = torch.nested.nested_tensor([torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0]), torch.tensor([0.0, 1.0])],
                                         layout=mj.multi_jagged)
    assert one_hot.multinomial(1).flatten().tolist() == [2, 0, 1]
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        torch.multinomial(p, 2)  # sample 1 has one category (dense raises for it)
    heads = mj.nested_tensor([torch.eye(3)[:2, :n] for n in (3, 2)], ragged_dims=(2,))  # (B, S, j0): one-hot rows
    assert torch.multinomial(heads, 1).tolist() == [[[0], [1]], [[0], [1]]]


def test_draws_over_a_static_last_dim_per_row():
    rows = [torch.eye(4)[torch.tensor([3, 1])], torch.zeros(0, 4), torch.eye(4)[torch.tensor([0])]]
    x = mj.nested_tensor(rows)
    d = torch.multinomial(x, 1)
    assert d.shape[0] == 3 and [t.flatten().tolist() for t in d.unbind()] == [[3, 1], [], [0]]
    with pytest.raises(NotImplementedError, match="out="):
        torch.multinomial(x, 1, out=torch.empty(0, dtype=torch.long))


def test_no_samples_draw_nothing():
    p = torch.nested.nested_tensor([torch.rand(3), torch.rand(2)], layout=mj.multi_jagged)[0:0]
    d = torch.multinomial(p, 2, replacement=True)
    assert type(d) is torch.Tensor and d.shape == (0, 2) and d.dtype == torch.int64
