"""Ragged dims of one size in every sample (a prefix ``y[:, :k]`` every sample holds, an
``argsort(…)[:, :1]``, equal-length tokens) reshaped, viewed and expanded to that static size as
dense sizes (NOTE [ Ragged dims of one size in every sample ] in ops/shape/flatten.py), against
each sample's dense code."""

import pytest
import torch

import torch_multijagged as mj

from _reference import PS, R, per_sample_check
from _structures import assert_samples_and_grads, comps_for

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: {}}
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prefix_every_sample_holds_reshapes_to_its_static_size(dtype):
    """Memory tokens packed before ragged ones and read back (einops' ``unpack``, x_transformers'
    ``num_memory_tokens``): ``y[:, :2].reshape(B, 2, C)`` is dense, as each sample's; an empty
    sample keeps its two memory tokens."""
    comps = comps_for([(3, 4), (0, 4), (5, 4)], 0, dtype=dtype)
    mem = PS(comps_for([(3, 2, 4)], 1, dtype=dtype)[0])

    def read_back(x, m, op):
        return getattr(torch.cat([m, x], 1)[:, :2], op)(x.shape[0], 2, 4)

    out = per_sample_check(lambda x, m: read_back(x, m, "reshape") * 2, R(comps, (1,)), mem, dense_out=True,
                           ref=lambda c, m: torch.cat([m, c], 0)[:2].reshape(2, 4) * 2, **TOL[dtype])
    assert type(out) is torch.Tensor
    # the slice is a copy standing for a view: a view of it could not write back, so view refuses
    with pytest.raises(NotImplementedError, match="use reshape"):
        read_back(mj.as_nested_tensor(comps, ragged_dims=(1,)), mem.t, "view")
    per_sample_check(lambda x, m: torch.cat([m, x], 1)[:, :2].reshape(3, 8), R(comps, (1,)), mem, dense_out=True,
                     ref=lambda c, m: torch.cat([m, c], 0)[:2].reshape(8), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_einops_unpack_of_packed_memory_tokens(dtype):
    einops = pytest.importorskip("einops")
    comps = comps_for([(3, 4), (5, 4), (0, 4)], 2, dtype=dtype)
    mem = PS(comps_for([(3, 2, 4)], 3, dtype=dtype)[0])

    def roundtrip(x, m):
        y, ps = einops.pack([m, x], "b * d")
        a, b = einops.unpack(y * 3, ps, "b * d")
        return a, b

    per_sample_check(lambda x, m: roundtrip(x, m)[0], R(comps, (1,)), mem, dense_out=True,
                     ref=lambda c, m: m * 3, **TOL[dtype])
    per_sample_check(lambda x, m: roundtrip(x, m)[1], R(comps, (1,)), mem, ref=lambda c, m: c * 3, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_expand_of_a_ragged_dim_to_the_size_every_sample_has(dtype):
    """``argsort(…)[:, :1, None].expand(B, 1, C)`` (token pruning's top index as a gather index):
    dense, as each sample's; the gradient of an expanded float sums back per sample."""
    comps = comps_for([(6, 4), (3, 4), (7, 4), (4, 4)], 4, dtype=dtype)
    x = mj.nested_tensor(comps)
    idx = x.sum(-1).argsort(1, descending=True)[:, :1, None]
    for size in ((4, 1, 4), (-1, 1, 4), (4, 1, -1)):
        got = idx.expand(*size)
        assert type(got) is torch.Tensor and got.shape == (4, 1, 1 if size[2] == -1 else 4)
        for g, c in zip(got, comps):
            torch.testing.assert_close(g, c.sum(-1).argsort(0, descending=True)[:1, None].expand(1, *size[2:]))
    per_sample_check(lambda t: t[:, 1:3, :1].expand(4, 2, 5) * 2, R(comps, (1,)), dense_out=True,
                     ref=lambda c: c[1:3, :1].expand(2, 5) * 2, **TOL[dtype])
    per_sample_check(lambda t: t[:, :2].expand(size=(4, 2, 4)) + 1, R(comps, (1,)), dense_out=True,
                     ref=lambda c: c[:2] + 1, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_ragged_dim_of_one_size_beside_a_ragged_one(dtype):
    """``(B, j0, j1, C)`` whose ``j1`` is 1 in every sample: expanded to a static 1, ``j0`` stays ragged
    (a multi_jagged result, each sample's); reshaped to static sizes where both are uniform."""
    pairs = comps_for([(3, 1, 2), (0, 1, 2), (2, 1, 2)], 5, dtype=dtype)
    out = per_sample_check(lambda p: p.expand(3, -1, 1, 2) * 2, R(pairs, (1, 2)), ref=lambda c: c * 2, **TOL[dtype])
    assert out.ragged_dims == (1,)
    squares = comps_for([(3, 3, 2), (3, 3, 2)], 6, dtype=dtype)
    per_sample_check(lambda p: p.reshape(2, 9, 2), R(squares, (1, 2)), dense_out=True, ref=lambda c: c.reshape(9, 2),
                     **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_equal_length_tokens_view_as_a_window_grid(dtype):
    """A Swin block's ``x.view(B, H, W, C)`` of ``(B, j0, C)`` tokens, 16 per sample, and its window
    partition; ``(B, C, j0)`` (the rows ``(n, C)`` in storage) viewed ``(B, C, 4, 4)`` too."""
    comps = comps_for([(16, 3), (16, 3), (16, 3)], 7, dtype=dtype)

    def windows(x):
        g = x.view(x.shape[0], 4, 4, 3)
        return g.view(-1, 2, 2, 2, 2, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, 3)

    per_sample_check(lambda x: windows(x).reshape(3, 4, 4, 3), R(comps, (1,)), dense_out=True,
                     ref=lambda c: windows(c.unsqueeze(0)), **TOL[dtype])
    channels = comps_for([(3, 16)] * 3, 8, dtype=dtype)
    for op, size in (("view", (3, 4, 4)), ("reshape", (3, 4, 4)), ("reshape", (48,))):
        # a split of the tokens, and a merge of the channels with them (a copy: the rows are (n, C))
        per_sample_check(lambda x: getattr(x, op)(3, *size), R(channels, (2,)), dense_out=True,
                         ref=lambda c: c.reshape(size), **TOL[dtype])
    with pytest.raises(NotImplementedError, match="cannot be viewed so"):
        mj.as_nested_tensor(channels, ragged_dims=(2,)).view(3, 48)


def test_a_view_of_dense_sizes_writes_through_several_ragged_dims():
    """Pairs of one size in every sample: the view is the values' own, writes and reads both ways."""
    z = mj.nested_tensor([torch.zeros(3, 3, 2), torch.zeros(3, 3, 2)], ragged_dims=(1, 2))
    v = z.view(2, 9, 2)
    v.add_(1)
    assert all(torch.equal(c, torch.ones(3, 3, 2)) for c in z.unbind())
    z.add_(1)
    assert torch.equal(v, torch.full((2, 9, 2), 2.0))


def test_a_view_of_dense_sizes_writes_through_the_one_ragged_dim():
    """With one ragged dim the static result is a view of the values, as dense torch's view."""
    x = mj.nested_tensor([torch.zeros(2, 3), torch.zeros(2, 3)])
    v = x.view(2, 2, 3)
    v[:, 0] = 1.0
    assert all(torch.equal(c, torch.tensor([[1.0] * 3, [0.0] * 3])) for c in x.unbind())


def test_every_sample_empty_reshapes_and_expands_to_zero():
    x = mj.nested_tensor([torch.zeros(0, 4), torch.zeros(0, 4)])
    assert x.reshape(2, 0, 2, 2).shape == (2, 0, 2, 2) and x.view(2, 0, 4).shape == (2, 0, 4)
    assert x.expand(2, 0, 4).shape == (2, 0, 4)


def test_sizes_that_differ_per_sample_still_raise_naming_them():
    x = mj.nested_tensor([torch.randn(n, 4) for n in (2, 3)])
    with pytest.raises(mj.StructureError, match=r"dim 1 must be the ragged size .* \(a static size .* sizes \[2, 3\]\)"):
        x.reshape(2, 2, 4)
    with pytest.raises(mj.StructureError, match=r"expand\(\): ragged dim 1 .* size is not 3 in every sample \(sizes \[2, 3\]\)"):
        x[..., :1].expand(2, 3, 4)
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        x[:, :2].reshape(2, 3, 4)  # one size (2) in every sample, but a shape dense refuses
    with pytest.raises(mj.StructureError, match="not 3 in every sample"):
        x[:, :2].expand(2, 3, 4)


def test_a_static_size_for_a_ragged_dim_under_torch_compile_raises_saying_so():
    """Whether every sample has the size is known eagerly only: compiled, it raises (never a
    guessed size)."""
    torch._dynamo.reset()
    x = mj.nested_tensor([torch.randn(2, 4), torch.randn(2, 4)])
    for f in (lambda y: y.reshape(2, 2, 4), lambda y: y.view(2, 8), lambda y: y[..., :1].expand(2, 2, 3)):
        with pytest.raises(Exception, match="under torch.compile"):
            torch.compile(f, backend="aot_eager", fullgraph=True)(x)


def test_squeeze_without_dims_drops_ragged_dims_of_size_one_in_every_sample():
    """``x[:, :1].squeeze()`` drops the sliced ragged dim of size 1 in every sample and the static
    ones, as each sample's ``squeeze()`` (a dense ``(B, C)``); a ragged dim of size 1 in some samples
    only stays. Gradients reach the input."""
    comps = [torch.randn(n, 1, 4, dtype=torch.float64, requires_grad=True) for n in (3, 2, 5)]
    x = mj.as_nested_tensor(comps)
    y = x[:, :1].squeeze()
    assert type(y) is torch.Tensor and y.shape == (3, 4)
    torch.testing.assert_close(y, torch.stack([c[:1].squeeze() for c in comps]))
    got = torch.autograd.grad((y * y).sum(), comps)
    want = torch.autograd.grad(sum((c[:1].squeeze() ** 2).sum() for c in comps), comps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    pair = mj.nested_tensor([torch.randn(1, n, 1) for n in (2, 3)], ragged_dims=(1, 2)).squeeze()
    assert pair.shape[0] == 2 and pair.dim() == 2 and pair.ragged_dims == (1,)
    some = mj.nested_tensor([torch.randn(1, 2), torch.randn(3, 2)]).squeeze()
    assert some.dim() == 3 and some.ragged_dims == (1,)


@pytest.mark.parametrize("op", ["mul_", "add_", "sub_"])
def test_in_place_into_a_dense_tensor_of_an_operand_of_one_size(op):
    """``x *= g`` with a dense ``x (B, n, n, C)`` and a multi_jagged ``g`` whose ragged dims have
    ``x``'s size in every sample (a pair of one protein, or of equal lengths, inferred
    ``(B, j0, n, C)``: openfold3's in-place triangle update) writes each sample's dense result
    into ``x``; gradients reach both. Other sizes still raise."""
    g_comps = [torch.randn(3, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    g = mj.as_nested_tensor(g_comps)
    x0 = torch.randn(2, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    x = x0 * 1
    getattr(x, op)(g)
    want = [getattr(x0[i] * 1, op)(c) for i, c in enumerate(g_comps)]
    torch.testing.assert_close(x, torch.stack(want))
    got = torch.autograd.grad((x * x).sum(), [x0, *g_comps])
    exp = torch.autograd.grad(sum((w * w).sum() for w in want), [x0, *g_comps])
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    other = mj.nested_tensor([torch.randn(3, 3, 2), torch.randn(2, 3, 2)])
    with pytest.raises(Exception, match="ragged|broadcast"):
        getattr(torch.randn(2, 3, 3, 2), op)(other)


def test_setitem_of_a_value_ragged_where_the_selection_is_static_of_that_size():
    """``a[:, 0:2] = v`` where ``a`` ``(B, C, j0, n)`` has a static last dim that every sample's ``j0``
    equals (a pair of equal lengths, inferred with one ragged dim) and ``v`` is ``(B, 2, j0, j0)``
    (openfold3's chunked in-place triangle update): each sample's dense ``__setitem__``, gradients
    reaching ``a`` and ``v``."""
    zs = [torch.randn(4, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    a = mj.as_nested_tensor(zs).permute(0, 3, 1, 2).contiguous()  # (2, 3, j0, 4)
    b = a.clone()
    v = b[:, :2, :, :1] * b[:, :2, :, :1].transpose(-1, -2)  # (2, 2, j0, j0)
    a[:, 0:2] = v
    refs = []
    for t in zs:
        at = t.permute(2, 0, 1).contiguous()
        bt = at.clone()
        at[0:2] = bt[:2, :, :1] * bt[:2, :, :1].transpose(-1, -2)
        refs.append(at)
    assert_samples_and_grads(a, refs, zs)


@pytest.mark.parametrize("how", ["expand", "expand_minus_one", "expand_as"])
def test_expand_a_static_dim_to_a_ragged_size_every_sample_has(how):
    """``x.expand(B, n, n)`` of a pair of equal lengths inferred ``(B, j0, 4)`` with ``n = x.shape[1]``
    (openfold3's LMA bias): the static dim, of ``n``'s size in every sample, becomes that ragged dim;
    each sample unchanged, as its dense ``expand(4, 4)``; gradients. Another size still raises."""
    xs = [torch.randn(4, 4, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    x = mj.as_nested_tensor(xs)
    n = x.shape[1]
    y = {"expand": lambda: x.expand(2, n, n), "expand_minus_one": lambda: x.expand(-1, -1, n),
         "expand_as": lambda: x.expand_as(x + x.transpose(1, 2))}[how]()
    assert y.shape[2] is n
    for a, c in zip(y.unbind(), xs):
        assert torch.equal(a, c)
    got = torch.autograd.grad((y * y).sum(), xs)
    for g, c in zip(got, xs):
        torch.testing.assert_close(g, 2 * c)
    other = mj.nested_tensor([torch.randn(3, 4), torch.randn(3, 4)])
    with pytest.raises(mj.StructureError):
        other.expand(2, other.shape[1], other.shape[1])
