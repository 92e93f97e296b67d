"""``F.pdist``, ``F.cosine_similarity``, ``F.prelu`` and ``Tensor.unfold`` of a static dim on
multi_jagged tensors, against the dense op on each sample: values, gradients to every input
(second order where the op has one), a zero-length sample, the no-leakage property
(``torch.cdist``: ``test_cdist.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from _reference import LAYOUTS, R, SEQ, few, per_sample_check, seeds, structures
from _structures import bit_equal

F64 = torch.float64


@few(15)
@given(structures(SEQ, min_c=2, max_c=4) | structures(LAYOUTS[1], min_c=2, max_c=4), seeds, st.sampled_from([-1, 1]))
def test_cosine_similarity_over_static_and_ragged_dims(s, seed, dim):
    comps = s.components(seed)
    other = [torch.flip(c, (-1,)) * 0.5 + 0.1 for c in comps]
    per_sample_check(lambda x, y: F.cosine_similarity(x, y, dim=dim), R(comps, s.ragged_dims), R(other, s.ragged_dims),
                     ref=lambda x, y: F.cosine_similarity(x, y, dim=dim - 1 if dim > 0 else dim), seed=seed,
                     dense_out=dim == 1 and s.ragged_dims == (1,))  # the only ragged dim reduced


@pytest.mark.parametrize("dtype", [torch.complex128, torch.int64])
def test_cosine_similarity_refuses_complex_and_integers_as_dense(dtype):
    comps = [torch.ones(2, 3, dtype=dtype), torch.ones(0, 3, dtype=dtype)]
    with pytest.raises(RuntimeError, match="floating point"):
        F.cosine_similarity(comps[0], comps[0], dim=-1)
    with pytest.raises(RuntimeError, match="floating point"):
        F.cosine_similarity(mj.nested_tensor(comps), mj.nested_tensor(comps), dim=-1)


def test_cosine_similarity_clamps_small_norms_as_dense():
    comps = [torch.zeros(2, 3, dtype=F64), torch.full((1, 3), 1e-10, dtype=F64)]
    x = mj.as_nested_tensor([c.clone().requires_grad_() for c in comps])
    out = F.cosine_similarity(x, x + 1, dim=-1)
    for o, c in zip(out.unbind(), comps):
        torch.testing.assert_close(o, F.cosine_similarity(c, c + 1, dim=-1))


@few(10)
@given(structures(SEQ, min_c=1, max_c=3), seeds)
def test_prelu_one_weight(s, seed):
    w = torch.tensor([0.25], dtype=F64)
    per_sample_check(lambda x, w: F.prelu(x, w), R(s.components(seed), (1,)), w, seed=seed)


def test_prelu_per_channel_of_images():
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(3, h, w, dtype=F64, generator=g, requires_grad=True) for h, w in ((2, 3), (0, 1), (4, 2))]
    w = torch.rand(3, dtype=F64, generator=g, requires_grad=True)
    out = F.prelu(mj.as_nested_tensor(comps, ragged_dims=(2, 3)), w)
    refs = [F.prelu(c.unsqueeze(0), w)[0] for c in comps]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    ga = torch.autograd.grad(sum((o * o).sum() for o in out.unbind()), [*comps, w])
    gb = torch.autograd.grad(sum((r * r).sum() for r in refs), [*comps, w])
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)
    tokens = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match="one per channel"):
        F.prelu(tokens, torch.rand(3))  # dim 1 is ragged: no channel dim there


@few(15)
@given(structures(SEQ, min_c=3, max_c=5) | structures(LAYOUTS[3], min_c=3, max_c=5), seeds, st.integers(1, 3), st.integers(1, 2))
def test_unfold_of_the_last_static_dim(s, seed, size, step):
    per_sample_check(lambda x: x.unfold(-1, size, step), R(s.components(seed), s.ragged_dims), seed=seed)


def test_unfold_refuses_the_batch_dim():
    # along a ragged dim it is per sample (test_ragged_indexing.py); the batch dim has no windows
    x = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match="static dim"):
        x.unfold(0, 1, 1)


def test_distances_do_not_leak_between_samples():
    comps = [torch.randn(n, 3) for n in (3, 2, 4)]
    a = torch.cdist(mj.as_nested_tensor(comps), mj.as_nested_tensor(comps))
    comps[1] = comps[1] * 7 + 2
    b = torch.cdist(mj.as_nested_tensor(comps), mj.as_nested_tensor(comps))
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and bit_equal(a.unbind()[2], b.unbind()[2])
    assert not torch.equal(a.unbind()[1], b.unbind()[1])


@few(10)
@given(structures(SEQ, min_c=1, max_c=3), seeds, st.sampled_from([1.0, 2.0, 3.0]))
def test_pdist_per_sample(s, seed, p):
    """Each sample's pairs ``i < j`` (none for a sample of 0 or 1 rows): a new extent."""
    comps = s.components(seed)
    leaves = [c.clone().requires_grad_() for c in comps]
    out = F.pdist(mj.as_nested_tensor(leaves), p)
    # dense pdist's backward crashes (a segfault, torch 2.13) on a sample of no rows: no reference graph there
    refs = [F.pdist(c, p) if c.shape[0] else c.new_zeros(0) for c in leaves]
    for a, b in zip(out.unbind(), refs):
        torch.testing.assert_close(a, b)
    if sum(r.numel() for r in refs):
        ga = torch.autograd.grad((out * out).sum(), leaves, allow_unused=True)
        gb = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves, allow_unused=True)
        for a, b, c in zip(ga, gb, leaves):
            torch.testing.assert_close(a if a is not None else torch.zeros_like(c), b if b is not None else torch.zeros_like(c))
    x = mj.as_nested_tensor(comps)
    assert F.pdist(x, p).shape[1] is F.pdist(x, p).shape[1]  # one size rule on one extent: one nested int
