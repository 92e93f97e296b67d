"""``matmul`` between multi_jagged tensors (ops/contractions/matmul.py ``_matmul``), eagerly, against the
per-sample dense reference with gradients: attention scores ``q @ k.transpose(1, 2)`` (square
when q and k share an extent, rectangular across two extents), ``attn @ v`` contracting a
ragged dim, and with a dense weight. The compile tests compare compiled output with eager
output only; these tie eager to dense torch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import R, few, per_sample_check, seeds
from _structures import comps_for, length_pairs, lengths

FEW = few(8)


def _scores(q, k):
    return q @ k.transpose(1, 2)


def _scores_ref(q, k):
    return q @ k.transpose(0, 1)


@pytest.mark.parametrize("share", ["one_tensor", "separate_equal_lengths"])
def test_attention_scores_square(share):
    """``q @ k.transpose(1, 2)``: ``(B, j0, C) @ (B, C, j0)`` → ``(B, j0, j0)``."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        qs = comps_for([(n, c) for n in ns], seed)
        if share == "one_tensor":
            out = per_sample_check(lambda q: _scores(q, q * 0.5), R(qs, (1,)), ref=lambda q: _scores_ref(q, q * 0.5), seed=seed)
        else:
            ks = comps_for([(n, c) for n in ns], seed + 1)
            out = per_sample_check(_scores, R(qs, (1,)), R(ks, (1,)), ref=_scores_ref, seed=seed)
        assert out.ragged_dims == (1, 2)

    check()


def test_attention_scores_rect():
    """Queries and keys of different lengths: ``(B, j0, C) @ (B, C, j1)`` → ``(B, j0, j1)``."""

    @FEW
    @given(length_pairs(max_batch=3), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        out = per_sample_check(_scores, R(comps_for([(n, c) for n in ns], seed), (1,)),
                               R(comps_for([(m, c) for m in ms], seed + 1), (1,)), ref=_scores_ref, seed=seed)
        assert out.sizes().tolist() == [[n, m] for n, m in zip(ns, ms)]

    check()


def test_attn_at_v_contracts_ragged_dim():
    """``softmax(q kᵀ) @ v``: ``(B, j0, j1) @ (B, j1, C)`` → ``(B, j0, C)``, k and v sharing
    lengths (v built separately)."""

    @FEW
    @given(length_pairs(max_batch=3), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm

        def f(q, k, v):
            return torch.softmax(_scores(q, k), -1) @ v

        def ref(q, k, v):
            return torch.softmax(_scores_ref(q, k), -1) @ v

        out = per_sample_check(f, R(comps_for([(n, c) for n in ns], seed), (1,)), R(comps_for([(m, c) for m in ms], seed + 1), (1,)),
                               R(comps_for([(m, 2) for m in ms], seed + 2), (1,)), ref=ref, seed=seed)
        assert out.ragged_dims == (1,)

    check()


def test_pair_at_single():
    """A square pair times singles: ``(B, j0, j0) @ (B, j0, C)`` (the pair built from the singles)."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        per_sample_check(lambda x: (x[..., :1] * x[..., :1].transpose(1, 2)) @ x, R(comps_for([(n, c) for n in ns], seed), (1,)),
                         ref=lambda x: (x[:, :1] * x[:, :1].transpose(0, 1)) @ x, seed=seed)

    check()


def test_matmul_with_dense_weight():
    """``(B, j0, C) @ (C, D)``: a weight shared by every sample."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        w = comps_for([(c, 2)], seed + 1)[0]
        per_sample_check(lambda x, w: x @ w, R(comps_for([(n, c) for n in ns], seed), (1,)), w, ref=lambda x, w: x @ w, seed=seed)

    check()


def test_matmul_golden():
    q = mj.nested_tensor([torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.zeros(0, 2)], ragged_dims=(1,))
    k = mj.nested_tensor([torch.tensor([[3.0, 1.0], [1.0, 1.0], [0.0, 1.0]]), torch.tensor([[1.0, 1.0]])], ragged_dims=(1,))
    s = q @ k.transpose(1, 2)
    assert s.shape == (2, q.shape[1], k.shape[1])
    torch.testing.assert_close(s.unbind()[0], torch.tensor([[3.0, 1.0, 0.0], [2.0, 2.0, 2.0]]))  # = [[q0·k0, q0·k1, q0·k2], [q1·k0, …]]
    assert s.unbind()[1].shape == (0, 1)
    v = mj.nested_tensor([torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[5.0]])], ragged_dims=(1,))
    o = s @ v
    torch.testing.assert_close(o.unbind()[0], torch.tensor([[5.0], [12.0]]))  # = [3·1 + 1·2 + 0·3, 2·(1 + 2 + 3)]
    assert o.unbind()[1].shape == (0, 1)
