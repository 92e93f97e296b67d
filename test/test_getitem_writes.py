"""Index assignment beyond the ragged slices: writes through a strided slice of the batch dim
(``x[::2].mul_(0)``, a gather where dense gives a view, so it writes back and refuses stale reads),
a 0-d integer tensor index, ``x[b, keep] = v`` with a multi_jagged ``keep``, and a negative step over
the batch (refused, as dense) — each against the per-sample dense writes, with gradients."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as tmj


@pytest.mark.parametrize("index", [slice(None, None, 2), slice(0, 4, 3), slice(1, None, 2)])
def test_writes_through_a_strided_slice_of_the_batch_reach_the_original(index):
    """Dense ``x[::2]`` is a view: ``x[::2].mul_(0)`` and ``x[::2][:, 0] = 7`` change ``x``. Ours
    gathers the samples' rows, a copy that writes itself back; reading it after ``x`` was written
    raises rather than show stale values."""
    comps = [torch.arange(n * 3, dtype=torch.float64).view(n, 3) + 1 for n in (2, 1, 3, 0, 2)]
    for write in (lambda t: t.mul_(0), lambda t: t.__setitem__((Ellipsis, 0), 7.0), lambda t: t.add_(t)):
        x = tmj.nested_tensor(comps)
        write(x[index])
        want = [c.clone() for c in comps]
        picked = list(range(5))[index]
        for i in picked:
            write(want[i][None])
        for a, b in zip(x.unbind(), want):
            torch.testing.assert_close(a, b)
    x = tmj.nested_tensor(comps)
    v = x[index]
    x.add_(1)
    with pytest.raises(NotImplementedError, match="strided slice of the batch dim"):
        v.sum()
    # with gradients: the write reaches x's graph as dense's write through a view
    leaves = [c.clone().requires_grad_() for c in comps]
    x = tmj.as_nested_tensor(leaves) * 1
    x[index].mul_(3)
    refs = [c * 1 for c in leaves]
    for i in list(range(5))[index]:
        refs[i] = refs[i] * 3
    got = torch.autograd.grad((x * x).sum(), leaves)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_index_assignment_by_a_multi_jagged_index_per_sample():
    """``x[b, keep] = v`` writes what ``x[b, keep]`` reads (``b = arange(B)[:, None]``, ``keep`` each
    sample's positions): dense ``x_i[keep_i] = v_i`` per sample, a scalar or a value of ``keep``'s
    structure, with gradients to ``x``'s other rows and to ``v``; an empty sample and an empty
    index included."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 2, dtype=torch.float64, generator=g) for n in (3, 5, 0, 2)]
    ks = [torch.tensor(k, dtype=torch.int64) for k in ([2, 0], [4, -1, 3], [], [])]
    keep = tmj.nested_tensor(ks)
    b = torch.arange(4)[:, None]
    vs = [torch.randn(len(k), 2, dtype=torch.float64, generator=g, requires_grad=True) for k in ks]
    for value, per in [(7.0, lambda i: 7.0), ("mj", lambda i: vs[i] * 3)]:
        leaves = [c.clone().requires_grad_() for c in xs]
        x = tmj.as_nested_tensor(leaves) * 1
        x[b, keep] = 7.0 if value == 7.0 else tmj.as_nested_tensor(vs) * 3
        refs = []
        for i, c in enumerate(leaves):
            r = c * 1
            r[ks[i]] = per(i)
            refs.append(r)
        for a, r in zip(x.unbind(), refs):
            torch.testing.assert_close(a, r)
        wrt = leaves + (vs if value == "mj" else [])
        got = torch.autograd.grad((x * x).sum(), wrt)
        want = torch.autograd.grad(sum((r * r).sum() for r in refs), wrt)
        for a, w in zip(got, want):
            torch.testing.assert_close(a, w)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        tmj.nested_tensor(xs)[b, keep] = torch.ones(7, 2, dtype=torch.float64)


def test_index_assignment_with_0d_integer_tensors():
    """A 0-d integer tensor index writes as the int it holds (as ``x[index]`` reads it)."""
    comps = [torch.zeros(2, 3), torch.zeros(4, 3)]
    with_empty = tmj.nested_tensor([*comps, torch.zeros(0, 3)])
    with pytest.raises(IndexError):  # as dense ``t[-1] = v`` of the empty sample, and as ``x[:, -1] = v``
        with_empty[:, torch.tensor(-1)] = 2.0
    with_empty[:, :, torch.tensor(2)] = 2.0  # a static dim: the empty sample holds nothing to write
    assert [t.shape for t in with_empty.unbind()] == [(2, 3), (4, 3), (0, 3)]
    assert all(bool((t[:, 2] == 2).all()) for t in with_empty.unbind())
    for index, per in [((slice(None), torch.tensor(-1)), lambda t: t[-1]),
                       ((slice(None), torch.tensor(0), 1), lambda t: t[0, 1]),
                       ((slice(None), slice(None), torch.tensor(2)), lambda t: t[:, 2]),
                       (torch.tensor(1), lambda t: t)]:
        x = tmj.nested_tensor(comps)
        x[index] = 2.0
        want = [c.clone() for c in comps]
        for i, w in enumerate(want):
            if isinstance(index, tuple) or i == 1:
                per(w).fill_(2.0)
        for a, b in zip(x.unbind(), want):
            assert torch.equal(a, b)


def test_a_negative_step_over_the_batch_raises_as_dense():
    x = tmj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
    with pytest.raises(ValueError, match="step must be greater than zero"):
        x[::-1]
