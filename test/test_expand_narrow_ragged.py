"""``expand`` of a ragged dim to another ragged size, and ``narrow`` of a ragged dim from an offset
to each sample's end, as model code writes them: ``x[:, :1].expand(-1, n, -1)`` (a CLS row over
every token), ``x.narrow(1, 1, n - 1)`` (drop the first token). Each is checked against the
per-sample dense op, with gradients (first and second order), a sample without rows, the errors
dense raises, and no leakage between samples."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.errors import StructureError

from _reference import assert_close

DT = torch.float64


def _comps(lengths=(3, 0, 1, 2), c=4, seed=0, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=DT).to(dtype) for n in lengths]


def _leaves(comps):
    return [c.detach().clone().requires_grad_() for c in comps]


EXPANDS = {
    # name: (f(x, n), dense per sample f(x_i, n_i))
    "first row over every token": (lambda x, n: x[:, :1].expand(-1, n, -1), lambda xi, ni: xi[:1].expand(ni, -1)),
    "all sizes given": (lambda x, n: x[:, :1].expand(x.shape[0], n, 4), lambda xi, ni: xi[:1].expand(ni, 4)),
    "with a static dim expanded too": (lambda x, n: x[:, :1, None].expand(-1, n, 5, -1),
                                       lambda xi, ni: xi[:1, None].expand(ni, 5, -1)),
    "a mean kept as a row": (lambda x, n: x[:, :1].mean(-1, keepdim=True).expand(-1, n, 3),
                             lambda xi, ni: xi[:1].mean(-1, keepdim=True).expand(ni, 3)),
}


@pytest.mark.parametrize("name", list(EXPANDS))
def test_expand_a_row_over_another_ragged_size(name):
    f, dense = EXPANDS[name]
    comps = _comps()
    leaves = _leaves(comps)
    x = mj.as_nested_tensor(leaves)
    n = x.shape[1]
    out = f(x, n)
    assert out.shape[1] is n
    refs = [dense(xi, xi.shape[0]) for xi in leaves]
    for o, r in zip(out.unbind(), refs):
        assert torch.equal(o, r)
    cot = [torch.randn(r.shape, dtype=DT, generator=torch.Generator().manual_seed(i)) for i, r in enumerate(refs)]
    (g,) = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), [x], create_graph=True)
    ref_g = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), leaves, create_graph=True)
    for a, b in zip(g.unbind(), ref_g):
        assert_close(a, b)
    # second order: a function of the gradient, through the expand's backward
    w = torch.randn(4, dtype=DT, requires_grad=True)
    (g2,) = torch.autograd.grad((g * w).sin().sum((1, 2)).sum(), [w])
    (ref2,) = torch.autograd.grad(sum((b * w).sin().sum() for b in ref_g), [w])
    assert_close(g2, ref2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_expand_keeps_the_dtype(dtype):
    comps = _comps(dtype=dtype)
    x = mj.nested_tensor(comps)
    out = x[:, :1].expand(-1, x.shape[1], -1)
    assert out.dtype == dtype
    for o, c in zip(out.unbind(), comps):
        assert torch.equal(o, c[:1].expand(c.shape[0], -1))


def test_expand_no_leakage_between_samples():
    comps = _comps((4, 1, 3))
    x = mj.nested_tensor(comps)
    before = x[:, :1].expand(-1, x.shape[1], -1).unbind()
    comps[1] = comps[1] + 100.0
    y = mj.nested_tensor(comps)
    after = y[:, :1].expand(-1, y.shape[1], -1).unbind()
    assert torch.equal(before[0], after[0]) and torch.equal(before[2], after[2])
    assert not torch.equal(before[1], after[1])


def test_expand_refuses_what_dense_refuses():
    x = mj.nested_tensor(_comps((3, 1, 2)))
    n = x.shape[1]
    with pytest.raises(StructureError, match="size must be 1 or"):
        x[:, 1:].expand(-1, n, -1)  # sizes 2, 0, 1 against 3, 1, 2
    with pytest.raises(StructureError, match="size must be 1 or"):
        x.expand(-1, x[:, :1].shape[1], -1)  # 3 rows cannot become 1
    other = mj.nested_tensor(_comps((2, 2)))
    with pytest.raises(StructureError, match="as many samples"):
        x[:, :1].expand(-1, other.shape[1], -1)


def test_expand_under_compile_says_eager():
    x = mj.nested_tensor(_comps((3, 1, 2)))

    @torch.compile(backend="eager", fullgraph=True)
    def f(t, u):
        return t[:, :1].expand(-1, u.shape[1], -1)

    with pytest.raises(Exception, match="eagerly|ragged"):
        f(x, x * 1)


def test_narrow_from_an_offset_to_each_sample_end():
    comps = _comps((3, 0, 1, 2))
    leaves = _leaves(comps[:1] + comps[2:])  # narrow(1, 1, n - 1) needs every sample to hold a row
    x = mj.as_nested_tensor(leaves)
    n = x.shape[1]
    out = x.narrow(1, 1, n - 1)
    assert out.shape[1] is x[:, 1:].shape[1]
    for o, xi in zip(out.unbind(), leaves):
        assert torch.equal(o, xi.narrow(0, 1, xi.shape[0] - 1))
    (g,) = torch.autograd.grad((out * out).sum((1, 2)).sum(), [x])
    for gi, xi in zip(g.unbind(), leaves):
        assert_close(gi, torch.cat([torch.zeros_like(xi[:1]), 2 * xi[1:].detach()]))


def test_narrow_refuses_what_dense_refuses():
    x = mj.nested_tensor(_comps((3, 1, 2)))
    n = x.shape[1]
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        x.narrow(1, 2, n - 1)  # sample 1 holds 1 row: 2 + 0 > 1
    short = mj.nested_tensor(_comps((1, 0, 0))).shape[1]
    with pytest.raises(TypeError, match="stops before a sample's end"):
        x.narrow(1, 1, short)  # rows 1..1 of samples of 3, 1 and 2 rows: short of the end in samples 0 and 2
    other = mj.nested_tensor(_comps((2, 2)))
    with pytest.raises(TypeError, match="as many samples"):
        x.narrow(1, 0, other.shape[1])
    empty = mj.nested_tensor(_comps((3, 0, 2)))
    with pytest.raises(ValueError, match="negative in sample 1"):
        empty.narrow(1, 1, empty.shape[1] - 1)  # a sample without rows has no rows after the first
