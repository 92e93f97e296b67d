"""Basic indexing of static dims: ``x[:, :, 0]``, ``x[..., 1:3]``, ``x[:, :, None]`` (full slices over
the batch and ragged dims), against the per-sample reference, with gradients."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as tmj
from torch_multijagged.errors import StructureError

S = slice(None)
CASES = [
    (S, S, 0),
    (S, S, -1, slice(1, None)),
    (Ellipsis, slice(1, 3)),
    (Ellipsis, -1),
    (S, S, None),
    (S, S, 1, slice(None, None, 2)),
    (S, None, S, 2),
    (S,),
    (Ellipsis,),
]


@pytest.mark.parametrize("idx", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("lens", [(2, 0, 3), (1,)])
def test_static_indexing_matches_per_sample(idx, lens):
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, 4, generator=g, dtype=torch.float64) for n in lens]
    x = tmj.nested_tensor(comps, requires_grad=True)
    y = x[idx]
    per = [c[idx] if idx[0] is Ellipsis else c[idx[1:]] for c in comps]
    assert len(y.unbind()) == len(per)
    for a, b in zip(y.unbind(), per):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad((y.values() ** 2).sum(), x)
    cs = [c.clone().requires_grad_() for c in comps]
    tot = sum(((c[idx] if idx[0] is Ellipsis else c[idx[1:]]) ** 2).sum() for c in cs)
    refs = torch.autograd.grad(tot, cs)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)


def test_indexing_the_batch_dim_with_a_slice_raises():
    x = tmj.nested_tensor([torch.randn(n, 3) for n in (2, 3)])
    with pytest.raises(ValueError, match="batch dim"):
        x[0:1]


@pytest.mark.parametrize("idx", [(S, 1), (S, slice(0, 1)), (S, -1), (S, slice(None, None, 2))])
def test_indexing_a_ragged_dim_is_per_sample(idx):
    comps = [torch.randn(n, 3) for n in (2, 3)]
    x = tmj.nested_tensor(comps)
    out = x[idx]
    got = list(out.unbind()) if isinstance(out, tmj.MultiJaggedTensor) else list(out)
    for o, c in zip(got, comps):
        torch.testing.assert_close(o, c[idx[1:]])


def test_sample_then_dense_indexing():
    comps = [torch.randn(n, 3) for n in (2, 3)]
    x = tmj.nested_tensor(comps)
    torch.testing.assert_close(x[1, :, 2], comps[1][:, 2])
    torch.testing.assert_close(x[0, 1], comps[0][1])


@pytest.mark.parametrize("dim", [2, -1])
@pytest.mark.parametrize("lens", [(2, 0, 3), (1,)])
def test_unbind_static_dim(dim, lens):
    g = torch.Generator().manual_seed(1)
    comps = [torch.randn(n, 3, 4, generator=g, dtype=torch.float64) for n in lens]
    x = tmj.nested_tensor(comps, requires_grad=True)
    pieces = x.unbind(dim)
    cdim = dim - 1 if dim > 0 else dim
    assert len(pieces) == comps[0].shape[cdim]
    w = [float(i + 1) for i in range(len(pieces))]
    for i, p in enumerate(pieces):
        for a, c in zip(p.unbind(), comps):
            torch.testing.assert_close(a, c.unbind(cdim)[i])
    gx, = torch.autograd.grad(sum(wi * (p.values() ** 2).sum() for wi, p in zip(w, pieces)), x)
    cs = [c.clone().requires_grad_() for c in comps]
    refs = torch.autograd.grad(sum(wi * (p ** 2).sum() for c in cs for wi, p in zip(w, c.unbind(cdim))), cs)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)


def test_unbind_ragged_dim_raises():
    x = tmj.nested_tensor([torch.randn(n, 3) for n in (2, 3)])
    with pytest.raises(StructureError, match="expected a static dim"):
        x.unbind(1)
