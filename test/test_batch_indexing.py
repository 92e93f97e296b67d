"""Selecting and joining along the batch dim as dense does: strided and empty slices, empty list
indices, uint8 masks, and ``torch.cat`` of batches whose ragged dims share nested ints differently
(a rectangular batch with one whose samples happen to be square, or an empty one) or of several
dtypes — against the list of components."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as tmj


@pytest.mark.parametrize("sl", [slice(3, 1, 2), slice(-1, 0, 2), slice(1, None, 2), slice(None, None, 3)])
def test_a_strided_slice_of_the_batch_is_the_samples_it_names(sl):
    """``x[a:b:step]`` is the samples ``range(4)[a:b:step]`` names, an empty batch included (as
    dense and ``x[3:1]``)."""
    comps = [torch.full((n, 2), float(n)) for n in (1, 0, 3, 4)]
    y = tmj.nested_tensor(comps)[sl]
    want = comps[sl]
    assert y.shape[0] == len(want) and all(torch.equal(a, b) for a, b in zip(y.unbind(), want))


def test_an_empty_list_index_selects_nothing_as_dense():
    """``x[[]]`` is an empty batch; ``x[:, []]`` and ``x[..., []]`` select no position of each
    sample (dense ``c[[]]``, ``c[..., []]`` per sample)."""
    comps = [torch.randn(n, 3) for n in (2, 0, 1)]
    x = tmj.nested_tensor(comps)
    assert x[[]].shape[0] == 0 and x[[]].unbind() == ()
    for idx, per in (((slice(None), []), lambda c: c[[]]), ((Ellipsis, []), lambda c: c[..., []])):
        assert [t.shape for t in x[idx].unbind()] == [per(c).shape for c in comps]


def test_a_uint8_index_is_a_mask_as_dense():
    """Dense indexing reads a uint8 tensor as a mask (deprecated, with a warning), not as
    numbers: on the batch dim and on a static dim alike."""
    comps = [torch.arange(2.0 * n).view(n, 2) for n in (1, 2, 0, 3)]
    x = tmj.nested_tensor(comps)
    m = torch.tensor([1, 0, 1, 1], dtype=torch.uint8)
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        y = x[m]
    assert [t.tolist() for t in y.unbind()] == [comps[0].tolist(), comps[2].tolist(), comps[3].tolist()]
    with pytest.warns(UserWarning, match="uint8 is now deprecated"):
        z = x[..., torch.tensor([0, 1], dtype=torch.uint8)]
    assert [t.tolist() for t in z.unbind()] == [c[..., [1]].tolist() for c in comps]


def test_joining_a_rectangular_batch_with_square_or_empty_ones_is_rectangular():
    """Two ragged dims share a nested int in ``cat([...], 0)`` only where every batch with samples
    shares it: a rectangular batch joined with one whose samples happen to be square (inference
    gives it one nested int), or with an empty batch of one shared nested int (``from_packed``,
    ``from_padded`` of B = 0), is rectangular; samples and gradients as the components'."""
    g = torch.Generator().manual_seed(0)
    rect = [torch.randn(2, 3, 1, generator=g, requires_grad=True), torch.randn(1, 2, 1, generator=g, requires_grad=True)]
    square = [torch.randn(2, 2, 1, generator=g, requires_grad=True), torch.randn(3, 3, 1, generator=g, requires_grad=True)]
    r, q = tmj.as_nested_tensor(rect), tmj.as_nested_tensor(square)
    assert q.shape[1] is q.shape[2]
    empty = tmj.from_packed(torch.zeros(0, 1), torch.tensor([0]), torch.zeros(0, 2, dtype=torch.long), (1, 2))
    for parts, comps in (([r, q], rect + square), ([q, r], square + rect), ([empty, r], rect), ([q, empty, q], square * 2)):
        z = torch.cat(parts, 0)
        assert (z.shape[1] is z.shape[2]) == all(c.shape[0] == c.shape[1] for c in comps)
        assert [a.tolist() for a in z.unbind()] == [c.tolist() for c in comps]
    z = torch.cat([r, q], 0)
    got = torch.autograd.grad(sum((a * a).sum() for a in z.unbind()), rect + square)
    for a, c in zip(got, rect + square):
        torch.testing.assert_close(a, 2 * c)
    parts = [tmj.nested_tensor([torch.ones(2, 3, dtype=dt)]) for dt in (torch.int32, torch.float32, torch.float64)]
    joined = torch.cat(parts, 0)  # three batches of three dtypes: promoted as dense cat
    assert joined.dtype == torch.float64 and joined.shape[0] == 3


@pytest.mark.parametrize("repeats", [2, torch.tensor(2), torch.tensor([1, 0, 3])])
def test_repeat_interleave_of_samples(repeats):
    """``x.repeat_interleave(k, dim=0)`` repeats samples (a history per candidate, a mask per head),
    with gradients summed over the copies; it raised a view error."""
    comps = [torch.randn(n, 4, dtype=torch.float64, requires_grad=True) for n in (3, 0, 2)]
    x = torch.nested.as_nested_tensor(comps, layout=tmj.multi_jagged)
    counts = torch.as_tensor(repeats).expand(3).tolist()
    y = x.repeat_interleave(repeats, dim=0)
    want = [c for c, k in zip(comps, counts) for _ in range(k)]
    assert y.shape[0] == len(want) and all(torch.equal(a, b) for a, b in zip(y.unbind(), want))
    got = torch.autograd.grad((y * y).sum(dim=(1, 2)).sum(), comps)
    for g, c, k in zip(got, comps, counts):
        torch.testing.assert_close(g, 2 * k * c)
    with pytest.raises(RuntimeError, match="repeats must have the same size as input along dim"):
        x.repeat_interleave(torch.tensor([1, 2]), dim=0)
