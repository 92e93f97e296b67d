"""The ``*_copy`` variants of the view ops (what functionalization and ``torch.export`` write),
``x.view(dtype)``, and ``torch.gradient`` along static and ragged dims: each checked against the
dense op per sample (values, gradients of every leaf, a zero-length sample where dense takes one)."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj

F64 = torch.float64


def _leaves(shapes, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=dtype, generator=g).requires_grad_(dtype.is_floating_point) for s in shapes]


def _pair(xs):
    x = mj.as_nested_tensor(xs)
    return x.unsqueeze(2) * x.unsqueeze(1), [c.unsqueeze(1) * c.unsqueeze(0) for c in xs]


def _check(out, refs, leaves):
    """``out`` (a tensor or a tuple of them) equals ``refs`` per sample, values and gradients."""
    outs, refs = (list(out), list(refs)) if isinstance(out, tuple) else ([out], [refs])
    flat_a, flat_b = [], []
    for o, r in zip(outs, refs):
        got = o.unbind() if mj.is_nested(o) else [o]
        want = r if mj.is_nested(o) else [r]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        flat_a += list(got)
        flat_b += list(want)
    if not leaves[0].requires_grad or not any(a.requires_grad for a in flat_a):
        assert not any(b.requires_grad for b in flat_b)
        return
    ws = [torch.randn(b.shape, dtype=b.dtype, generator=torch.Generator().manual_seed(i)) for i, b in enumerate(flat_b)]
    ga = torch.autograd.grad(sum((a * w).sum() for a, w in zip(flat_a, ws)), leaves, allow_unused=True)
    gb = torch.autograd.grad(sum((b * w).sum() for b, w in zip(flat_b, ws)), leaves, allow_unused=True)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


COPIES = [
    ("transpose_copy", lambda t, b: torch.transpose_copy(t, b, 1 + b)),
    ("permute_copy", lambda t, b: torch.permute_copy(t, (0, 2, 1)) if b else torch.permute_copy(t, (1, 0))),
    ("unsqueeze_copy", lambda t, b: torch.unsqueeze_copy(t, -1)),
    ("squeeze_copy", lambda t, b: torch.squeeze_copy(t.unsqueeze(-1), -1)),
    ("narrow_copy", lambda t, b: torch.narrow_copy(t, 1 + b, 1, 2)),
    ("Tensor.narrow_copy", lambda t, b: t.narrow_copy(-1, 0, 3)),
    ("select_copy", lambda t, b: torch.select_copy(t, -1, 2)),
    ("slice_copy", lambda t, b: torch.slice_copy(t, -1, 1, None, 2)),
    ("expand_copy", lambda t, b: torch.expand_copy(t.unsqueeze(-1), (*t.shape, 2))),
    ("unfold_copy", lambda t, b: torch.unfold_copy(t, -1, 2, 1)),
    ("diagonal_copy", lambda t, b: torch.diagonal_copy(t.unsqueeze(-1) * t.unsqueeze(-2), 0, -2, -1)),
    ("alias_copy", lambda t, b: torch.alias_copy(t)),
    # dense's result claims requires_grad, then has no derivative; ours is detached
    ("detach_copy", lambda t, b: torch.detach_copy(t) if b else t.detach().clone()),
    ("view_copy", lambda t, b: torch.view_copy(t, (*t.shape[:-1], 2, 2))),
    ("view_as_real_copy", lambda t, b: torch.view_as_real_copy(t.to(torch.complex128))),
]


@pytest.mark.parametrize("name,op", COPIES, ids=[c[0] for c in COPIES])
def test_copy_variant_per_sample(name, op):
    xs = _leaves([(3, 4), (0, 4), (2, 4)])
    x = mj.as_nested_tensor(xs)
    out = op(x, 1)
    assert mj.is_nested(out) and out.is_contiguous()
    _check(out, [op(c, 0) for c in xs], xs)


def test_copy_variant_is_a_copy():
    """A write into the result never reaches the input (the view would)."""
    x = mj.nested_tensor([torch.ones(3, 4), torch.ones(2, 4)])
    for y in (torch.transpose_copy(x, 1, 2), torch.alias_copy(x), torch.select_copy(x, 2, 0),
              torch.narrow_copy(x, 2, 0, 2)):
        y.mul_(0)
        assert all(bool((c == 1).all()) for c in x.unbind())


def test_copy_variants_with_sequence_results():
    xs = _leaves([(3, 4), (0, 4), (2, 4)])
    x = mj.as_nested_tensor(xs)
    _check(torch.split_copy(x, 3, dim=2), tuple(zip(*[torch.split_copy(c, 3, dim=1) for c in xs])), xs)
    _check(torch.split_with_sizes_copy(x, [1, 3], dim=-1),
           tuple(zip(*[torch.split_with_sizes_copy(c, [1, 3], dim=-1) for c in xs])), xs)
    parts = torch.unbind_copy(x)
    assert isinstance(parts, tuple) and [p.shape for p in parts] == [c.shape for c in xs]
    _check(parts, tuple(xs), xs)


def test_copy_variant_of_a_pair_along_ragged_dims():
    xs = _leaves([(3, 2), (1, 2), (0, 2)], seed=1)
    p, refs = _pair(xs)
    _check(torch.transpose_copy(p, 1, 2), [r.transpose(0, 1) for r in refs], xs)
    p, refs = _pair(xs)
    _check(torch.diagonal_copy(p, 0, 1, 2), [r.diagonal(0, 0, 1) for r in refs], xs)


def test_copy_variant_refuses_out():
    x = mj.nested_tensor([torch.ones(3, 4), torch.ones(2, 4)])
    with pytest.raises(NotImplementedError, match=r"transpose_copy\(\): out= variants"):
        torch.transpose_copy(x, 1, 2, out=torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float64, torch.uint8, torch.complex64])
def test_view_dtype_per_sample(dtype):
    xs = [t.detach() for t in _leaves([(3, 4), (0, 4), (2, 4)], dtype=torch.float32)]
    x = mj.nested_tensor(xs)
    for y in (x.view(dtype), x.view(dtype=dtype), torch.view_copy(x, dtype)):
        assert y.dtype == dtype
        _check(y, [c.view(dtype) for c in xs], xs)
    # a write through the view reaches the input, as dense's
    x.view(dtype).zero_()
    assert all(bool((c == 0).all()) for c in x.unbind())


def test_view_dtype_with_a_ragged_last_dim():
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)]).transpose(1, 2)
    _check(x.view(torch.int32), [c.transpose(0, 1).view(torch.int32) for c in x.detach().transpose(1, 2).unbind()],
           [torch.zeros(1)])
    with pytest.raises(RuntimeError, match="last dim must be static"):
        x.view(torch.float16)


@pytest.mark.parametrize("edge_order", [1, 2])
@pytest.mark.parametrize("dim,spacing", [(1, 1), (1, 0.5), (2, 2.0), ((1, 2), [0.5, 3.0]), (-1, 1), ((2, 1), 2)])
def test_gradient_per_sample(dim, spacing, edge_order):
    xs = _leaves([(4, 5), (3, 5), (7, 5)])
    x = mj.as_nested_tensor(xs)
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = torch.gradient(x, dim=dim, spacing=spacing, edge_order=edge_order)
    assert isinstance(out, tuple) and len(out) == len(dims)
    refs = tuple([torch.gradient(c, dim=[d - 1 if d > 0 else d for d in dims], spacing=spacing,
                                 edge_order=edge_order)[k] for c in xs] for k in range(len(dims)))
    _check(out, refs, xs)


def test_gradient_of_a_pair_and_of_integers():
    xs = _leaves([(3, 2), (4, 2)], seed=2)
    p, refs = _pair(xs)
    _check(torch.gradient(p, dim=(1, 2)), tuple(zip(*[torch.gradient(r, dim=(0, 1)) for r in refs])), xs)
    ints = [torch.arange(4).view(4, 1) * 3, torch.arange(6).view(6, 1) ** 2]
    _check(torch.gradient(mj.nested_tensor(ints), dim=1), ([torch.gradient(c, dim=0)[0] for c in ints],),
           [torch.zeros(1)])


def test_gradient_with_coordinates_along_a_static_dim():
    xs = _leaves([(3, 5), (0, 5), (2, 5)])
    co = torch.tensor([0.0, 1.0, 3.0, 4.0, 7.0], dtype=F64)
    _check(torch.gradient(mj.as_nested_tensor(xs), spacing=[co], dim=2),
           ([torch.gradient(c, spacing=[co], dim=1)[0] for c in xs],), xs)


def test_gradient_errors():
    x = mj.nested_tensor([torch.randn(1, 2), torch.randn(3, 2)])
    with pytest.raises(RuntimeError, match="at least edge_order"):  # dense's, for the short sample
        torch.gradient(x, dim=1)
    with pytest.raises(RuntimeError, match="at least edge_order"):
        torch.gradient(mj.nested_tensor([torch.randn(0, 2), torch.randn(3, 2)]), dim=1)
    with pytest.raises(RuntimeError, match="at least edge_order"):
        torch.gradient(mj.nested_tensor([torch.randn(2, 2), torch.randn(3, 2)]), dim=1, edge_order=2)
    with pytest.raises(NotImplementedError, match="give dim"):
        torch.gradient(x)
    with pytest.raises(NotImplementedError, match="batch dim"):
        torch.gradient(x, dim=0)
    with pytest.raises(NotImplementedError, match="coordinates along ragged dim"):
        torch.gradient(mj.nested_tensor([torch.randn(3, 2), torch.randn(4, 2)]), spacing=[torch.arange(3.0)], dim=1)
