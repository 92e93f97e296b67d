"""Gradients of reductions that the grid tests could not reach (ops/reductions/reduce.py,
ops/reductions/routes.py, ops/elementwise/factory.py): var/std/norm/prod over static dims, ``max``/``min`` over a static
dim (aten's backward: ``new_zeros`` + ``scatter``), the tie rule, three ragged dims in every order,
and the dense kernel of ``multijagged::reduce_backward`` against dense autograd.
"""

import contextlib
import itertools
import math
import re

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import LAYOUTS, LAYOUTS3, R, complex_grad_check, components, few, per_sample_check, seeds, structures
from _structures import empty_aware, packed_args

D = torch.float64
LAYOUT = {str(lay): lay for lay in (*LAYOUTS, *LAYOUTS3)}
# static dims (negative: the same dims of the batch and of a component)
STATIC = {"seq": [(-1,)], "square": [(-1,)], "rect": [(-1,)], "static_lead": [(-3,), (-1,), (-3, -1)], "cube": [(-1,)]}


# ----------------------------------------------------------------------------- static dims
STATIC_OPS = {
    "var": lambda t, d, k: t.var(d, keepdim=k),
    "var_unbiased_False": lambda t, d, k: torch.var(t, d, False, k),
    "var_correction0": lambda t, d, k: t.var(d, correction=0, keepdim=k),
    "std": lambda t, d, k: torch.std(t, d, keepdim=k),
    "std_correction2": lambda t, d, k: t.std(d, correction=2, keepdim=k),
    "norm": lambda t, d, k: t.norm(dim=d, keepdim=k),
    "norm_p3": lambda t, d, k: torch.norm(t, 3, d, keepdim=k),
    "vector_norm": lambda t, d, k: torch.linalg.vector_norm(t, dim=d, keepdim=k),
    "vector_norm_1": lambda t, d, k: torch.linalg.vector_norm(t, 1, d, keepdim=k),
    "vector_norm_inf": lambda t, d, k: torch.linalg.vector_norm(t, math.inf, d, keepdim=k),
    "prod": lambda t, d, k: t.prod(d[0], keepdim=k),
    "max.values": lambda t, d, k: t.max(d[0], keepdim=k).values,
    "min.values": lambda t, d, k: torch.min(t, d[0], keepdim=k).values,
    "amax": lambda t, d, k: t.amax(d, keepdim=k),
}


@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
@pytest.mark.parametrize("layout", list(STATIC))
@pytest.mark.parametrize("name", STATIC_OPS)
def test_static_dim_reduction_grads(name, layout, keepdim):
    """Forward and backward over static dims equal the dense op per sample (values drawn with
    ties, so the tie rule of max/min/amax is exercised; size-1 dims give n - correction <= 0)."""
    f = STATIC_OPS[name]

    @few(8)
    @given(structures(LAYOUT[layout], max_batch=3, max_len=3), seeds, st.data())
    def check(s, seed, data):
        dims = data.draw(st.sampled_from([d for d in STATIC[layout] if len(d) == 1 or name not in ("prod", "max.values", "min.values")]))
        per_sample_check(lambda t: f(t, dims, keepdim), R(components(s.shapes, seed, ties=True), s.ragged_dims), seed=seed)

    check()


def test_prod_over_static_dim_backward_golden():
    leaf = torch.tensor([[2.0, 0.0, 3.0], [1.0, 4.0, 5.0]], requires_grad=True)
    x = mj.as_nested_tensor([leaf, torch.zeros(0, 3)], ragged_dims=(1,))
    p = x.prod(-1)
    assert [c.tolist() for c in p.unbind()] == [[0.0, 20.0], []]  # = 2·0·3, 1·4·5
    p.sum().backward()
    assert leaf.grad.tolist() == [[0.0, 6.0, 0.0], [20.0, 5.0, 4.0]]  # = Π of the others (exact with the zero)


# ----------------------------------------------------------------------------- max/min over a static dim: new_* and scatter/gather
def test_new_factories_structure():
    x = mj.nested_tensor([torch.ones(2, 3), torch.ones(0, 3)], ragged_dims=(1,))
    z = x.new_zeros(x.shape)
    assert isinstance(z, mj.MultiJaggedTensor) and z.shape == x.shape and z.dtype == x.dtype
    assert [c.tolist() for c in z.unbind()] == [[[0.0] * 3] * 2, []]
    assert [c.tolist() for c in x.new_full(x.shape, 7.0).unbind()] == [[[7.0] * 3] * 2, []]
    o = x.new_ones((2, x.shape[1], 4, 1), dtype=torch.int32)  # own nested int, other static sizes
    assert o.shape == (2, x.shape[1], 4, 1) and o.dtype == torch.int32 and o.unbind()[0].shape == (2, 4, 1)
    assert x.new_empty(x.shape).shape == x.shape
    d = x.new_zeros((2, 5))  # plain ints: dense, as torch.jagged
    assert not isinstance(d, mj.MultiJaggedTensor) and d.shape == (2, 5) and d.dtype == x.dtype
    y = mj.nested_tensor([torch.ones(1, 3), torch.ones(4, 3)], ragged_dims=(1,))
    with pytest.raises(NotImplementedError, match="new_zeros"):
        x.new_zeros(y.shape)  # another tensor's nested int


def test_new_factories_with_some_of_selfs_nested_ints():
    """A size holding some of self's nested ints — a ragged dim set to 1, as OpenFold's
    row-wise dropout makes its mask ``z.new_ones([B, 1, j0, C])`` — is, per sample, the size with
    each nested int read as that sample's extent; the result broadcasts against self."""
    pair_comps = [torch.randn(n, n, 2, dtype=D) for n in (3, 0, 2)]
    z = mj.nested_tensor(pair_comps)
    rows = z.new_ones([3, 1, z.shape[2], 2])
    assert rows.shape[2] == z.shape[2]
    assert [tuple(c.shape) for c in rows.unbind()] == [(1, 3, 2), (1, 0, 2), (1, 2, 2)] and rows.dtype == D
    assert all(torch.equal(c, torch.ones_like(c)) for c in rows.unbind())
    cols = z.new_full([3, z.shape[1], 1], 5.0, dtype=torch.int32)
    assert [c.tolist() for c in cols.unbind()] == [[[5]] * 3, [], [[5]] * 2]
    comps = [torch.randn(n, n, 2, dtype=D, requires_grad=True) for n in (3, 0, 2)]
    zz = mj.as_nested_tensor(comps)
    out = zz * (zz.new_ones([3, 1, zz.shape[2], 2]) * 2)  # a mask shared along the rows
    got = list(out.unbind())
    for a, c in zip(got, comps):
        torch.testing.assert_close(a, c * 2)
    grads = torch.autograd.grad(sum((a ** 2).sum() for a in got), comps)
    for g, c in zip(grads, comps):
        torch.testing.assert_close(g, 8 * c)
    rect = mj.nested_tensor([torch.randn(n, m) for n, m in ((3, 1), (0, 2), (2, 2))], ragged_dims=(1, 2))
    swapped = rect.new_zeros([3, rect.shape[2], rect.shape[1]])  # the extents in the other order
    assert [tuple(c.shape) for c in swapped.unbind()] == [(1, 3), (2, 0), (2, 2)]
    other = mj.nested_tensor([torch.ones(1, 1), torch.ones(4, 1), torch.ones(2, 1)])
    with pytest.raises(NotImplementedError, match=r"new_ones\(\): expected a size holding nested ints of self"):
        z.new_ones([3, other.shape[1], 1])
    with pytest.raises(NotImplementedError, match="batch size at dim 0"):
        z.new_ones([z.shape[1], 2])
    with pytest.raises(ValueError, match="batch size 3"):
        z.new_ones([2, 1, z.shape[2]])


@pytest.mark.parametrize("op", ["new_zeros", "new_ones", "new_full", "new_empty"])
def test_new_factories_with_a_leading_one_and_nested_ints(op):
    """``x.new_zeros((1, H, n, n))`` as dense code writes for a batch of one, ``n`` read from
    ``x.shape``: with B = 1 the 1 is the batch, and each sample's tensor is dense's ``(H, n, n)``
    (a zero-length sample too), combining with ``x``; with more samples a ``(1, …)`` tensor of their
    ragged sizes has no form, and the error names the size to write, which works."""
    args = (2.0,) if op == "new_full" else ()
    for lens in ((4,), (0,)):
        x = mj.nested_tensor([torch.randn(2, n, n, dtype=D) for n in lens], ragged_dims=(2, 3))
        h, n = x.shape[1], x.shape[2]
        m = getattr(x, op)((1, h, n, n), *args)
        assert m.shape == x.shape and m.dtype == D
        want = getattr(x.unbind()[0], op)((h, lens[0], lens[0]), *args)
        assert m.unbind()[0].shape == want.shape
        if op != "new_empty":
            assert torch.equal(m.unbind()[0], want)
            assert torch.equal((x + m).unbind()[0], x.unbind()[0] + want)
    x = mj.nested_tensor([torch.randn(2, n, n, dtype=D) for n in (3, 0, 2)], ragged_dims=(2, 3))
    h, n = x.shape[1], x.shape[2]
    for size, hint in (((1, h, n, n), "write (3, 2, j"), ((h, n, n), "write (3, 2, j"), ((n, n), "write (3, j")):
        with pytest.raises((ValueError, NotImplementedError), match=re.escape(hint)):
            getattr(x, op)(size, *args)
    m = getattr(x, op)((x.shape[0], h, n, n), *args)  # the size the error names
    assert [tuple(c.shape) for c in m.unbind()] == [(2, 3, 3), (2, 0, 0), (2, 2, 2)]


def test_max_over_static_dim_backward_golden():
    leaf = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)
    x = mj.as_nested_tensor([leaf, torch.zeros(0, 3)], ragged_dims=(1,))
    v, i = x.max(dim=2)
    assert [c.tolist() for c in v.unbind()] == [[3.0, 2.0], []] and [c.tolist() for c in i.unbind()] == [[1, 0], []]
    (v * torch.tensor(10.0)).sum().backward()
    # dense max(dim): the whole gradient to the returned index (first of the ties)
    assert leaf.grad.tolist() == [[0.0, 10.0, 0.0], [10.0, 0.0, 0.0]]
    dense = leaf.detach().clone().requires_grad_()
    (dense.max(1).values * 10).sum().backward()
    assert torch.equal(leaf.grad, dense.grad)


def test_gather_scatter_static_dim_per_sample():
    comps = components([(3, 4), (0, 4), (2, 4)], 3)
    idx = [torch.tensor([[3, 0], [1, 1], [2, 0]]), torch.zeros(0, 2, dtype=torch.int64), torch.tensor([[0, 0], [3, 2]])]
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    ix = mj.nested_tensor(idx, ragged_dims=(1,))
    ix = mj.from_packed(ix.values(), x.offsets(), x.sizes())  # the same structure as x
    for o, c, i in zip(x.gather(-1, ix).unbind(), comps, idx):
        torch.testing.assert_close(o, c.gather(-1, i))
    src = ix.to(D) * 0 - 1
    for o, c, i in zip(x.scatter(-1, ix, src).unbind(), comps, idx):
        torch.testing.assert_close(o, c.scatter(-1, i, -torch.ones(i.shape, dtype=D)))


def test_scatter_gather_along_ragged_dim_with_size_one_index():
    comps = [torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.zeros(0, 2), torch.tensor([[7.0, 8.0]])]
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    idx = torch.tensor([[[2, 0]], [[0, 0]], [[0, 0]]])  # (B, 1, C); sample 1 has no row 0
    with pytest.raises(RuntimeError, match="sample 1"):  # as dense gather raises for sample 1
        x.gather(1, idx)
    with pytest.raises(RuntimeError, match="sample 1"):
        x.scatter(1, idx, torch.full((3, 1, 2), -1.0))
    x2 = mj.nested_tensor([comps[0], comps[2]], ragged_dims=(1,))
    idx2 = idx[[0, 2]]
    assert x2.gather(1, idx2).tolist() == [[[5.0, 2.0]], [[7.0, 8.0]]]  # = comp[idx, c]
    s = x2.scatter(1, idx2, torch.full((2, 1, 2), -1.0))
    assert [c.tolist() for c in s.unbind()] == [[[1.0, -1.0], [3.0, 4.0], [-1.0, 6.0]], [[-1.0, -1.0]]]


def test_max_over_static_dim_double_backward():
    comps = components([(2, 3, 2), (0, 3, 2), (1, 3, 2)], 5)
    v, off, sizes = packed_args(comps, (1,))

    def fn(v):
        return mj.from_packed(v, off, sizes, (1,)).max(dim=2).values.values()

    assert torch.autograd.gradgradcheck(fn, (v.requires_grad_(),))


# ----------------------------------------------------------------------------- tie rule
def test_tie_rule_golden():
    """amax / amin share the gradient evenly among ties (as dense amax); max(dim).values sends
    it to the returned index (as dense max(dim)); over a ragged and over a static dim."""
    sample = [[1.0, 3.0], [3.0, 3.0], [0.0, 3.0]]
    third = 1 / 3
    cases = {
        # over the ragged dim (dim 1 of (B, j0, 2), dim 0 of a component)
        "amax_ragged": (lambda t: t.amax(1), lambda c: c.amax(0), [[0.0, third], [1.0, third], [0.0, third]]),  # col 0: one 3; col 1: three 3s
        "amin_ragged": (lambda t: t.amin(1), lambda c: c.amin(0), [[0.0, third], [0.0, third], [1.0, third]]),  # col 0: the 0; col 1: three 3s
        "max_ragged": (lambda t: t.max(1).values, lambda c: c.max(0).values, [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),  # first index of the max
        "min_ragged": (lambda t: t.min(1).values, lambda c: c.min(0).values, [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]),
        # over the static dim (dim 2 of the batch, dim 1 of a component)
        "amax_static": (lambda t: t.amax(2), lambda c: c.amax(1), [[0.0, 1.0], [0.5, 0.5], [0.0, 1.0]]),  # row 1: 3 = 3
        "amin_static": (lambda t: t.amin(-1), lambda c: c.amin(-1), [[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]]),
        "max_static": (lambda t: t.max(2).values, lambda c: c.max(1).values, [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
        "min_static": (lambda t: t.min(-1).values, lambda c: c.min(-1).values, [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]),
    }
    for name, (f, fd, expected) in cases.items():
        leaf = torch.tensor(sample, requires_grad=True)
        x = mj.as_nested_tensor([leaf, torch.zeros(0, 2), torch.tensor([[2.0, -1.0]])], ragged_dims=(1,))
        out = f(x)
        (out.values() if isinstance(out, mj.MultiJaggedTensor) else out[0]).sum().backward()
        torch.testing.assert_close(leaf.grad, torch.tensor(expected), msg=name)
        dense = torch.tensor(sample, requires_grad=True)
        fd(dense).sum().backward()
        assert torch.allclose(leaf.grad, dense.grad), name


TIE_OPS = {
    "amax": lambda t, d: t.amax(d),
    "amin": lambda t, d: t.amin(d),
    "max.values": lambda t, d: t.max(d).values,
    "min.values": lambda t, d: t.min(d).values,
}
TIE_DIMS = {"seq": [-2, -1], "square": [-3, -2, -1], "rect": [-3, -2], "static_lead": [-3, -2], "cube": [-4, -2]}


@pytest.mark.parametrize("layout", list(TIE_DIMS))
@pytest.mark.parametrize("name", TIE_OPS)
def test_tie_rule_per_sample(name, layout):
    """Values in multiples of 0.5 (ties common): gradients equal dense torch's per sample."""
    f = TIE_OPS[name]

    @few(8)
    @given(structures(LAYOUT[layout], max_batch=3, max_len=3, max_c=2), seeds, st.data())
    def check(s, seed, data):
        d = data.draw(st.sampled_from(TIE_DIMS[layout]))
        dense = d in [r - len(s.layout.shape(1, 1, 1, 1, 1)) - 1 for r in s.ragged_dims] and len(s.ragged_dims) == 1
        kind = "amax" if name.startswith(("amax", "max")) else "amin"
        per_sample_check(
            lambda t: f(t, d), R(components(s.shapes, seed, ties=True, low=-1, high=1), s.ragged_dims),
            ref=empty_aware(lambda c: f(c, d), kind, (d,)), dense_out=dense, seed=seed,
        )

    check()


# ----------------------------------------------------------------------------- three ragged dims
THREE = {
    "sum": (lambda t, d, k: t.sum(d, keepdim=k), "sum"),
    "mean": (lambda t, d, k: t.mean(d, keepdim=k), "mean"),
    "amax": (lambda t, d, k: t.amax(d, keepdim=k), "amax"),
    "amin": (lambda t, d, k: torch.amin(t, d, keepdim=k), "amin"),
    "logsumexp": (lambda t, d, k: torch.logsumexp(t, d, keepdim=k), "logsumexp"),
    "var": (lambda t, d, k: t.var(d, correction=0, keepdim=k), "var"),
    "norm": (lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k), "norm"),
}


@pytest.mark.parametrize("layout", [str(lay) for lay in LAYOUTS3])
@pytest.mark.parametrize("name", THREE)
def test_three_ragged_dims_every_order(name, layout):
    """Every non-empty subset of the three ragged dims, in every order, with or without a
    static dim and keepdim: per-sample dense result and gradients."""
    f, kind = THREE[name]
    lay = LAYOUT[layout]
    rank = len(lay.shape(1, 1, 1, 1, 1)) + 1
    ragged = [r - rank for r in lay.ragged_dims]  # negative

    @few(12)
    @given(structures(lay, max_batch=3, max_len=3, max_c=2), seeds, st.data())
    def check(s, seed, data):
        subset = data.draw(st.lists(st.sampled_from(ragged), min_size=1, max_size=3, unique=True))
        dims = tuple(data.draw(st.permutations(subset)))
        if data.draw(st.booleans()):
            dims = dims + (-1,)
        keepdim = data.draw(st.booleans())
        dense = set(ragged) <= set(dims)
        per_sample_check(
            lambda t: f(t, dims, keepdim), R(components(s.shapes, seed), s.ragged_dims),
            ref=empty_aware(lambda c: f(c, dims, keepdim), kind, dims), dense_out=dense, seed=seed,
        )

    check()


@pytest.mark.parametrize("dims", list(itertools.permutations((1, 2, 3), 2)) + list(itertools.permutations((1, 2, 3))))
def test_three_ragged_dims_order_golden(dims):
    """(B, j0, j1, j2): a sample of extents (2, 3, 2) holding 100a + 10b + c at (a, b, c), so a
    wrong order of dims shows in the digits, and a sample of extents (1, 0, 2)."""
    a, b, c = torch.meshgrid(torch.arange(2.0), torch.arange(3.0), torch.arange(2.0), indexing="ij")
    comp = 100 * a + 10 * b + c  # (2, 3, 2): the digits name the coordinate
    x = mj.nested_tensor([comp, torch.zeros(1, 0, 2)], ragged_dims=(1, 2, 3))
    out = x.sum(dims)
    expected = comp.sum(tuple(d - 1 for d in dims))
    got = out.unbind()[0] if isinstance(out, mj.MultiJaggedTensor) else out[0]
    torch.testing.assert_close(got, expected)
    got_max = x.amax(dims)
    got_max = got_max.unbind()[0] if isinstance(got_max, mj.MultiJaggedTensor) else got_max[0]
    torch.testing.assert_close(got_max, comp.amax(tuple(d - 1 for d in dims)))


@pytest.mark.parametrize("dim", [1, 2, 3, 4])
def test_four_ragged_dims_keep_three_golden(dim):
    """(B, j0, j1, j2, j3): reducing one ragged dim keeps three, the only case where the row map
    composes strides over more than two kept dims. Extents (2, 3, 2, 2) hold 1000a + 100b + 10c + d
    at (a, b, c, d), so a wrong stride shows in the digits; gradients per sample too."""
    a, b, c, d = torch.meshgrid(*(torch.arange(n, dtype=torch.float64) for n in (2, 3, 2, 2)), indexing="ij")
    comp = 1000 * a + 100 * b + 10 * c + d
    comps = [comp, torch.zeros(1, 2, 0, 3, dtype=torch.float64), comp[:1, 1:, :, :1] + 0.5]
    per_sample_check(lambda t: t.sum(dim), R(comps, (1, 2, 3, 4)), ref=lambda x: x.sum(dim - 1))
    per_sample_check(lambda t: t.amax(dim, keepdim=True), R(comps[::2], (1, 2, 3, 4)), ref=lambda x: x.amax(dim - 1, keepdim=True))


def test_argmax_ties_pick_the_first_golden():
    """Dense argmax/argmin return the first of tied extremes; so do ours along a ragged dim, per
    sample (indices local to the sample)."""
    x = mj.nested_tensor([torch.tensor([[1.0, 5.0], [3.0, 5.0], [3.0, 0.0]]), torch.zeros(0, 2), torch.tensor([[2.0, 2.0]])])
    assert x.argmax(1).tolist() == [[1, 0], [0, 0], [0, 0]]  # col 0: 3 at rows 1 and 2 -> 1; col 1: 5 at rows 0, 1 -> 0
    assert x.argmin(1).tolist() == [[0, 2], [0, 0], [0, 0]]  # empty sample -> 0, as torch.jagged
    assert x.max(1).indices.tolist() == [[1, 0], [0, 0], [0, 0]]


# ----------------------------------------------------------------------------- dense reduce_backward kernel
def _dense_reduce(x, kind, dims, keepdim):
    dims = list(range(x.dim())) if dims is None else dims
    if kind == "prod":
        for d in sorted(dims, reverse=True):
            x = x.prod(d, keepdim=True)
        return x if keepdim else x.reshape([s for i, s in enumerate(x.shape) if i not in [e % x.dim() for e in dims]])
    if kind == "logsumexp":
        return torch.logsumexp(x, dims, keepdim=keepdim)
    return getattr(torch, kind)(x, dims, keepdim=keepdim)


@pytest.mark.parametrize("kind", ["sum", "mean", "amax", "amin", "prod", "logsumexp"])
def test_reduce_backward_dense_kernel_matches_autograd(kind):
    """``multijagged::reduce_backward`` on plain tensors (its dense kernel) equals
    ``torch.autograd.grad`` of the dense reduction: values from {-1, 0, 1, 2} (ties and zeros)."""

    @few(25)
    @given(st.lists(st.integers(1, 3), min_size=1, max_size=3), seeds, st.data())
    def check(shape, seed, data):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randint(-1, 3, tuple(shape), generator=g).to(D)).requires_grad_()
        dims = data.draw(st.none() | st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape), unique_by=lambda d: d % len(shape)))
        keepdim = data.draw(st.booleans())
        result = _dense_reduce(x, kind, dims, keepdim)
        grad = torch.randn(result.shape, generator=g, dtype=D)
        (expected,) = torch.autograd.grad(result, x, grad)
        got = torch.ops.multijagged.reduce_backward(grad, x.detach(), result.detach(), kind, dims, keepdim)
        torch.testing.assert_close(got, expected)

    check()


@pytest.mark.parametrize("kind", ["sum", "mean", "prod", "logsumexp"])
def test_reduce_backward_dense_kernel_matches_autograd_complex(kind):
    """The dense kernel of ``multijagged::reduce_backward`` for complex128 values (zeros among
    them): dense autograd's conjugate Wirtinger derivative, ``grad · conj(f'(x))``."""

    @few(15)
    @given(st.lists(st.integers(1, 3), min_size=1, max_size=3), seeds, st.data())
    def check(shape, seed, data):
        g = torch.Generator().manual_seed(seed)
        re, im = (torch.randint(-1, 3, tuple(shape), generator=g).to(D) for _ in range(2))
        x = torch.complex(re, im).requires_grad_()
        dims = data.draw(st.none() | st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape), unique_by=lambda d: d % len(shape)))
        keepdim = data.draw(st.booleans())
        result = _dense_reduce(x, kind, dims, keepdim)
        grad = torch.randn(result.shape, generator=g, dtype=x.dtype)
        (expected,) = torch.autograd.grad(result, x, grad)
        got = torch.ops.multijagged.reduce_backward(grad, x.detach(), result.detach(), kind, dims, keepdim)
        torch.testing.assert_close(got, expected)

    check()


def _complex_comps(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.complex128) for s in shapes]


COMPLEX_REDUCTIONS = {
    # name: (layout's component shapes, ragged dims, fn, ref, second order)
    "prod static": ([(2, 3), (0, 3), (1, 3)], (1,), lambda x: x.prod(-1), lambda c: c.prod(-1), True),
    "prod ragged": ([(2, 3), (0, 3), (1, 3)], (1,), lambda x: x.prod(1), lambda c: c.prod(0), True),
    "prod ragged, pair": ([(2, 2, 2), (0, 0, 2), (3, 3, 2)], (1, 2), lambda x: x.prod(2), lambda c: c.prod(1), True),
    "norm static": ([(2, 3), (0, 3), (1, 3)], (1,), lambda x: x.norm(dim=-1), lambda c: c.norm(dim=-1), False),
    "norm ragged": ([(2, 3), (0, 3), (1, 3)], (1,), lambda x: torch.linalg.vector_norm(x, dim=1),
                    lambda c: torch.linalg.vector_norm(c, dim=0), False),
    "var ragged": ([(2, 3), (3, 3), (4, 3)], (1,), lambda x: x.var(1), lambda c: c.var(0), False),
    "std static": ([(2, 3), (0, 3), (1, 3)], (1,), lambda x: x.std(-1, correction=0),
                   lambda c: c.std(-1, correction=0), False),
}


@pytest.mark.parametrize("name", COMPLEX_REDUCTIONS)
def test_complex_reductions_per_sample_with_gradients(name):
    """prod (``multijagged::reduce_backward``'s conjugated local derivative, and its double
    backward), and the real-valued norm / var / std of complex128 samples (squared magnitudes,
    not squares): values and gradients as dense torch's per sample."""
    shapes, rd, fn, ref, second = COMPLEX_REDUCTIONS[name]
    for seed in range(3):
        complex_grad_check(fn, R(_complex_comps(shapes, seed), rd), ref=ref, seed=seed, second_order=second)


class _Passthrough(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that changes nothing: under it the eager values path is off, and ops run
    the general mechanism (their backward is ``multijagged::reduce_backward``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["values", "general"])
@pytest.mark.parametrize("layout, dims", [("tokens", (1,)), ("pair", (1, 2)), ("pair", (2,))])
def test_mean_double_backward_with_an_empty_sample_as_dense(layout, dims, path):
    """A gradient penalty through a mean over ragged dims with an empty sample (masked out of the
    loss, as a NaN mean must be): dense's second derivative is finite there — its mean divides
    after expanding the gradient to no elements — and so is ours, to every leaf. The division by
    the empty row's count of 0 made it NaN, which reached the weights."""
    g = torch.Generator().manual_seed(0)
    lengths = (2, 0, 1)
    shapes = [(n, 3) if layout == "tokens" else (n, n, 3) for n in lengths]
    comps = [torch.randn(s, dtype=D, generator=g, requires_grad=True) for s in shapes]
    w = torch.randn(3, dtype=D, generator=g, requires_grad=True)
    keep = torch.tensor([n > 0 for n in lengths])

    def penalty(means, leaves):
        loss = torch.where(keep.reshape(-1, *[1] * (means.dim() - 1)), means * w, 0).sum()
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        return sum((gr * gr).sum() for gr in grads)

    with _Passthrough() if path == "general" else contextlib.nullcontext():
        means = torch.nested.as_nested_tensor(comps, layout=mj.multi_jagged).mean(dims)
        ours = torch.autograd.grad(penalty(means.to_padded_tensor(0.0) if mj.is_nested(means) else means, comps),
                                   [w, *comps], allow_unused=True, materialize_grads=True)
    dense_means = torch.nn.utils.rnn.pad_sequence([c.mean(tuple(d - 1 for d in dims)) for c in comps], batch_first=True)
    ref = torch.autograd.grad(penalty(dense_means, comps), [w, *comps], allow_unused=True, materialize_grads=True)
    for a, b in zip(ours, ref):
        assert not a.isnan().any()
        torch.testing.assert_close(a, b)


def test_reduce_backward_mean_golden():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    r = x.mean(1)
    got = torch.ops.multijagged.reduce_backward(torch.tensor([3.0, 6.0]), x, r, "mean", [1], False)
    assert got.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]  # = grad / n, n = 3


@pytest.mark.parametrize("case", ["tokens mean", "tokens sum", "pair rows", "image mean", "channels"])
def test_centring_in_place_after_a_ragged_reduction(case):
    """``y -= y.mean(1, keepdim=True)`` on a result whose sum saved nothing: dense torch's sum and
    mean save no input, so the write is allowed and the gradient is the centred function's. The
    segment sum saved the values (``index_add``'s backward keeps its source), and the backward
    raised "modified by an inplace operation"."""
    shapes, ragged, dim = {
        "tokens mean": ([(3, 4), (0, 4), (2, 4)], (1,), 1),
        "tokens sum": ([(3, 4), (0, 4), (2, 4)], (1,), 1),
        "pair rows": ([(3, 3, 2), (0, 0, 2), (2, 2, 2)], (1, 2), 2),
        "image mean": ([(2, 3, 4), (2, 0, 0), (2, 2, 1)], (2, 3), (2, 3)),
        "channels": ([(2, 3), (2, 0), (2, 5)], (2,), 2),
    }[case]
    stat = (lambda t, d: t.sum(d, keepdim=True)) if case == "tokens sum" else (lambda t, d: t.mean(d, keepdim=True))

    def centred(t, d):
        y = t * t  # saves t, not y
        y -= stat(y, d)
        return y

    def sample_dim(d):
        return tuple(k - 1 for k in d) if isinstance(d, tuple) else d - 1

    per_sample_check(lambda x: centred(x, dim), R(components(shapes, 3), ragged),
                     ref=lambda c: centred(c, sample_dim(dim)))
