"""Batches that hold no element at all — every sample zero-length, or a static dim of size 0 —
against the per-sample dense op: reductions whose dense form has a value for an empty dim
(``logsumexp`` → -inf, ``any`` → False, ``all`` → True, ``trapezoid`` → 0) and ops along a ragged
dim under autograd with no static elements (``sort``, ``argsort``, ``cummax``, ``cummin``)."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.ops.reductions.segment_ops import segment_path

D = torch.float64

# (components, ragged dims, the dim reduced: a static dim of size 0 or an all-empty ragged dim)
BATCHES = {
    "static_zero_lead": ([(2, n, 0) for n in (3, 0, 2)], (2,), 3),
    "static_zero_mid": ([(n, 0, 3) for n in (3, 0, 2)], (1,), 2),
    "all_empty_seq": ([(0, 3), (0, 3)], (1,), 1),
    "all_empty_lead": ([(2, 0, 3), (2, 0, 3)], (2,), 2),
    "all_empty_pair": ([(0, 0, 3), (0, 0, 3)], (1, 2), 2),
    "all_empty_channels": ([(3, 0), (3, 0)], (2,), 2),
}

REDUCE = {
    "logsumexp": lambda t, d: torch.logsumexp(t, d),
    "logsumexp_keepdim": lambda t, d: torch.logsumexp(t, d, keepdim=True),
    "any": lambda t, d: (t > 0).any(d),
    "all": lambda t, d: (t > 0).all(d),
    "trapezoid": lambda t, d: torch.trapezoid(t, dim=d),
    "cumulative_trapezoid": lambda t, d: torch.cumulative_trapezoid(t, dim=d),
}


def _batch(name, grad=False):
    shapes, rd, d = BATCHES[name]
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(*s, dtype=D, generator=g).requires_grad_(grad) for s in shapes]
    return comps, mj.as_nested_tensor(comps, ragged_dims=rd), d


def _samples(out):
    return list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out.unbind(0))


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("batch", BATCHES)
def test_reductions_over_no_elements_match_dense(batch, op):
    comps, x, d = _batch(batch, grad=True)
    f = REDUCE[op]
    if d in x._ragged_dims and op == "cumulative_trapezoid":
        pytest.skip("a new ragged size from all-empty extents: covered along ragged dims elsewhere")
    out = f(x, d)
    refs = [f(c, d - 1) for c in comps]
    for a, r in zip(_samples(out), refs):
        assert a.dtype == r.dtype and a.shape == r.shape
        torch.testing.assert_close(a, r, equal_nan=True)
    if out.requires_grad:
        flat = out.values() if isinstance(out, mj.MultiJaggedTensor) else out
        got = torch.autograd.grad(flat.sum(), comps, allow_unused=True)
        # dense trapezoid of an empty dim is a constant (no graph): its gradient is zero
        want = (torch.autograd.grad(sum(r.sum() for r in refs), comps, allow_unused=True)
                if any(r.requires_grad for r in refs) else [torch.zeros_like(c) for c in comps])
        for a, b in zip(got, want):
            torch.testing.assert_close(torch.zeros_like(b) if a is None else a, b)


ORDER = {
    "sort": lambda t, d: torch.sort(t, d)[0],
    "argsort": lambda t, d: torch.argsort(t, d),
    "cummax": lambda t, d: torch.cummax(t, d)[0],
    "cummin": lambda t, d: torch.cummin(t, d)[1],
    "sort_descending_indices": lambda t, d: torch.sort(t, d, descending=True)[1],
}
NO_COLUMNS = {
    "lead": ([(2, n, 0) for n in (3, 0, 2)], (2,)),
    "seq": ([(n, 2, 0) for n in (3, 0, 2)], (1,)),
    "rect": ([(n, m, 0) for n, m in ((3, 1), (0, 2), (2, 2))], (1, 2)),
}


@pytest.mark.parametrize("path", ["chosen", "per_sample", "per_length"])
@pytest.mark.parametrize("layout", NO_COLUMNS)
@pytest.mark.parametrize("op", ORDER)
def test_ops_along_a_ragged_dim_with_no_static_elements_under_autograd(op, layout, path):
    shapes, rd = NO_COLUMNS[layout]
    comps = [torch.randn(*s, dtype=D).requires_grad_() for s in shapes]
    x = mj.as_nested_tensor(comps, ragged_dims=rd)
    with segment_path(None if path == "chosen" else path):
        out = ORDER[op](x, rd[0])
    for a, c in zip(out.unbind(), comps):
        r = ORDER[op](c, rd[0] - 1)
        assert a.dtype == r.dtype and a.shape == r.shape


@pytest.mark.parametrize("shape", [(), (3,)])
def test_trapezoid_with_sample_points_per_sample(shape):
    """``trapezoid(y, x)`` / ``cumulative_trapezoid(y, x)`` with sample points of ``y``'s shape along
    the ragged dim: dense's terms per sample (an empty and a one-point sample give 0), values and
    gradients of both; it raised from an internal slice."""
    g = torch.Generator().manual_seed(0)
    ys = [torch.randn(n, *shape, dtype=torch.float64, generator=g).requires_grad_() for n in (3, 0, 1, 5)]
    xs = [torch.rand(n, *shape, dtype=torch.float64, generator=g).cumsum(0).requires_grad_() for n in (3, 0, 1, 5)]
    y, x = (torch.nested.as_nested_tensor(t, layout=mj.multi_jagged) for t in (ys, xs))
    out = torch.trapezoid(y, x, dim=1)
    want = torch.stack([torch.trapezoid(a, b, dim=0) for a, b in zip(ys, xs)])
    assert torch.equal(out, want)
    got = torch.autograd.grad(out.sum(), ys + xs, allow_unused=True, materialize_grads=True)
    ref = torch.autograd.grad(want.sum(), ys + xs, allow_unused=True, materialize_grads=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
    cum = torch.cumulative_trapezoid(y, x, dim=1)
    for a, b, c in zip(cum.unbind(), ys, xs):
        assert torch.equal(a, torch.cumulative_trapezoid(b, c, dim=0))
