"""Construction, conversions and the public accessors listed in README.md (constructors.py, tensor.py)."""

import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor, multi_jagged

from _reference import (
    LAYOUTS,
    SEQ,
    SQUARE,
    STATIC_LEAD,
    assert_close,
    build,
    components,
    is_nested_int,
    seeds,
    structures,
)


# ----------------------------------------------------------------------------- independent oracles
def expected_values(comps, ragged_dims):
    """Packed values written out by hand: ragged dims first (row-major), then static dims."""
    rows = []
    for c in comps:
        rag = [d - 1 for d in ragged_dims]
        s = c.movedim(rag, list(range(len(rag))))
        rows += [s[idx] for idx in _ragged_coords(s.shape[: len(rag)])]
    static = [n for d, n in enumerate(_shape0(comps)) if d + 1 not in ragged_dims]
    out = torch.stack(rows) if rows else torch.zeros(0, *static, dtype=_dtype(comps))
    # torch.jagged's values(): with one ragged dim r, the rows at dim r - 1
    return out.movedim(0, ragged_dims[0] - 1) if len(ragged_dims) == 1 else out


def _shape0(comps):
    """A component's shape; for B = 0 the template that ``components`` remembers."""
    return tuple(comps[0].shape) if len(comps) else tuple(comps.template)


def _dtype(comps):
    return comps[0].dtype if len(comps) else comps.dtype


def _ragged_coords(extents):
    if not extents:
        return [()]
    return [(a,) + rest for a in range(extents[0]) for rest in _ragged_coords(extents[1:])]


def expected_padded(comps, pad, envelope=None):
    shape = envelope or [max((c.shape[d] for c in comps), default=n) for d, n in enumerate(_shape0(comps))]
    out = torch.full((len(comps), *shape), pad, dtype=_dtype(comps))
    for i, c in enumerate(comps):
        out[(i,) + tuple(slice(0, n) for n in c.shape)] = c
    return out


# ----------------------------------------------------------------------------- the layout object
def test_layout_object_is_registered():
    x = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=multi_jagged)
    assert torch.multi_jagged is multi_jagged
    assert x.layout is multi_jagged
    assert isinstance(x, MultiJaggedTensor)
    assert isinstance(x, torch.Tensor)


# ----------------------------------------------------------------------------- nested_tensor / as_nested_tensor
def test_nested_tensor_copies():
    a = [torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[5.0, 6.0]])]
    x = torch.nested.nested_tensor(a, layout=multi_jagged)
    a[0].fill_(0.0)  # the source changes, the copy does not
    assert [c.tolist() for c in x.unbind()] == [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]]
    assert x.is_leaf and not x.requires_grad
    y = torch.nested.nested_tensor(a, layout=multi_jagged, requires_grad=True, dtype=torch.float64)
    assert y.is_leaf and y.requires_grad and y.dtype == torch.float64


def test_as_nested_tensor_is_differentiable_wrt_the_list():
    a = [torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True), torch.zeros(0, 2, requires_grad=True),
         torch.tensor([[5.0, 6.0]], requires_grad=True)]
    x = torch.nested.as_nested_tensor(a, layout=multi_jagged)
    assert x.layout is multi_jagged and x.requires_grad
    w = torch.tensor([10.0, 100.0])
    (x * w).sum().backward()
    assert a[0].grad.tolist() == [[10.0, 100.0], [10.0, 100.0]]  # d/dx Σ x·w = w per row
    assert a[1].grad is None or a[1].grad.shape == (0, 2)
    assert a[2].grad.tolist() == [[10.0, 100.0]]


@pytest.mark.parametrize("layout", [torch.jagged, multi_jagged], ids=str)
def test_as_nested_tensor_of_a_tensor_as_torch_jagged(layout):
    """A dense ``(B, N, …)`` gives B samples ``(N, …)`` viewing its storage (a write reaches it,
    gradients flow back), ``N = 0`` and ``B = 0`` included; a nested tensor of the layout is
    returned as it is; a 1-D tensor raises — each as ``torch.jagged`` does."""
    g = torch.Generator().manual_seed(0)
    for shape in ((3, 4, 2), (2, 0, 2), (2, 3)):
        if layout is torch.jagged and 0 in shape:
            continue  # torch.jagged: "step must be nonzero"
        p = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
        x = torch.nested.as_nested_tensor(p, layout=layout)
        assert x.layout is layout and x.shape[0] == shape[0]
        for a, c in zip(x.unbind(), p.unbind()):
            torch.testing.assert_close(a, c)
        if p.numel():
            got, = torch.autograd.grad((x * x).values().sum(), p)
            torch.testing.assert_close(got, 2 * p)
        dense = p.detach().clone()
        torch.nested.as_nested_tensor(dense, layout=layout).mul_(0)
        assert not dense.any()
    y = torch.nested.nested_tensor([torch.ones(3, 2), torch.ones(1, 2)], layout=layout)
    assert torch.nested.as_nested_tensor(y, layout=layout) is y
    assert torch.nested.as_nested_tensor(y, layout=layout, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(RuntimeError, match=r"dim\(\) > 1"):
        torch.nested.as_nested_tensor(torch.zeros(3), layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_roundtrip_and_accessors(layout):
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        # B = 0: a list cannot express it, from_packed can (``build``)
        x = mj.nested_tensor(comps, ragged_dims=s.ragged_dims) if comps else build(comps, s.ragged_dims)[0]
        b, r = s.batch, len(s.ragged_dims)
        shape0 = comps[0].shape if comps else s.shapes.template  # a component's shape
        assert x.ragged_dims == s.ragged_dims
        # logical shape: B, nested ints at the ragged dims, plain ints elsewhere
        assert x.dim() == len(shape0) + 1 and x.shape[0] == b
        for d in range(1, x.dim()):
            if d in s.ragged_dims:
                assert is_nested_int(x.shape[d]), (d, x.shape)
            else:
                assert x.shape[d] == shape0[d - 1]
        # one nested int per distinct per-sample extent vector (a square pair shares one)
        if r == 2:
            same = [e[0] for e in s.sizes] == [e[1] for e in s.sizes]
            assert (x.shape[1] == x.shape[2]) == same, (x.shape, s.sizes)
            if layout is SQUARE:
                assert x.shape[1] == x.shape[2]
        # sizes: (B, R) int64 exact per-sample extents (distinguishes (0, 3) from (0, 7))
        sizes = x.sizes()
        assert sizes.dtype == torch.int64 and tuple(sizes.shape) == (b, r)
        assert sizes.tolist() == [list(e) for e in s.sizes]
        # offsets: (B+1,) int64 exclusive prefix sums of the rows per sample
        rows = [math.prod(e) for e in s.sizes]
        assert x.offsets().dtype == torch.int64
        assert x.offsets().tolist() == [sum(rows[:i]) for i in range(b + 1)]
        # values: (T, *static), storage order = ragged coordinates row-major, then static dims
        assert_close(x.values(), expected_values(comps, s.ragged_dims), "values")
        # unbind gives the components back
        got = x.unbind()
        assert isinstance(got, tuple) and len(got) == b
        for g, c in zip(got, comps):
            assert_close(g, c, "unbind")
        # occupancy = valid cells / (B · Π max extents); an empty envelope counts as fully occupied
        maxes = [max(e[k] for e in s.sizes) for k in range(r)]
        envelope = b * math.prod(maxes)
        assert x.occupancy() == pytest.approx(sum(rows) / envelope if envelope else 1.0)

    check()


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_to_padded_tensor(layout):
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x, leaves = build(comps, s.ragged_dims, requires_grad=True)
        out = torch.nested.to_padded_tensor(x, -7.0)
        assert_close(out, expected_padded(comps, -7.0), "to_padded_tensor")
        # gradient: the valid region of the padded cotangent, per component
        cot = torch.randn(out.shape, dtype=out.dtype)
        grads = torch.autograd.grad((out * cot).sum(), leaves) if leaves else ()  # B = 0: no leaves
        for i, (g, c) in enumerate(zip(grads, comps)):
            assert_close(g, cot[(i,) + tuple(slice(0, n) for n in c.shape)], f"grad {i}")
        # output_size: a larger envelope, padded on every dim
        big = [s.batch] + [n + 1 for n in out.shape[1:]]
        out2 = torch.nested.to_padded_tensor(x, 0.5, output_size=big)
        assert_close(out2, expected_padded(comps, 0.5, big[1:]), "to_padded_tensor(output_size)")

    check()


def test_to_padded_tensor_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[5.0, 6.0, 7.0]])])
    # components (2, 2) and (1, 3): both dims differ, so both are ragged: (B, j0, j1)
    assert x.ragged_dims == (1, 2)
    assert torch.nested.to_padded_tensor(x, 0.0).tolist() == [
        [[1.0, 2.0, 0.0], [3.0, 4.0, 0.0]],  # = sample 0 padded to (2, 3)
        [[5.0, 6.0, 7.0], [0.0, 0.0, 0.0]],  # = sample 1 padded to (2, 3)
    ]
    assert x.occupancy() == pytest.approx(7 / 12)  # = (2·2 + 1·3) / (2 · 2 · 3)


def test_nested_tensor_from_python_lists():
    x = torch.nested.nested_tensor([[1.0, 2.0], [3.0]], layout=multi_jagged)
    assert x.ragged_dims == (1,) and [c.tolist() for c in x.unbind()] == [[1.0, 2.0], [3.0]]


def test_values_is_differentiable():
    x = mj.nested_tensor([torch.ones(3, 2), torch.ones(0, 2), torch.ones(1, 2)], requires_grad=True)
    w = torch.tensor([1.0, 10.0])
    (x.values() * w).sum().backward()
    assert [g.tolist() for g in x.grad.unbind()] == [[[1.0, 10.0]] * 3, [], [[1.0, 10.0]]]  # = w per row


# ----------------------------------------------------------------------------- inference rules
def _c(*shape):
    return torch.zeros(*shape)


@pytest.mark.parametrize(
    "shapes, ragged_dims",
    [
        ([(3, 2), (0, 2), (1, 2)], (1,)),  # (B, j0, C)
        ([(2, 2, 4), (0, 0, 4), (3, 3, 4)], (1, 2)),  # (B, j0, j0, C)
        ([(2, 3, 4), (1, 0, 4)], (1, 2)),  # (B, j0, j1, C)
        ([(5, 2, 4), (5, 0, 4)], (2,)),  # (B, S, j0, C)
        ([(2, 3), (2, 3)], (1,)),  # nothing differs: dim 1 is ragged, as torch.jagged does
        ([(4,)], (1,)),  # 1-D components
    ],
)
def test_inference(shapes, ragged_dims):
    x = torch.nested.nested_tensor([_c(*s) for s in shapes], layout=multi_jagged)
    assert x.ragged_dims == ragged_dims
    assert x.sizes().tolist() == [[s[d - 1] for d in ragged_dims] for s in shapes]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_inference_random(layout):
    @given(structures(layout, min_batch=1), seeds)  # inference needs a component
    def check(s, seed):
        comps = components(s.shapes, seed)
        differ = tuple(d + 1 for d in range(comps[0].dim()) if len({c.shape[d] for c in comps}) > 1)
        ragged = differ or (1,)
        # a zero-size dim left static is test_zero_size_static_dim's business
        assume(all(comps[0].shape[d - 1] > 0 for d in range(1, comps[0].dim() + 1) if d not in ragged))
        x = torch.nested.nested_tensor(comps, layout=multi_jagged)
        assert x.ragged_dims == ragged
        for g, c in zip(x.unbind(), comps):
            assert_close(g, c, "unbind")

    check()


@pytest.mark.parametrize(
    "shapes, ragged_dims",
    [
        ([(2, 0), (1, 0)], (1,)),  # (B, j0, 0): torch.jagged accepts it
        ([(2, 0, 3), (1, 0, 3)], (1,)),
        ([(0, 0, 1)], (1,)),  # one empty sample: only dim 1 is inferred ragged, dim 2 (size 0) is static
    ],
)
def test_zero_size_static_dim(shapes, ragged_dims):
    comps = [torch.zeros(*s) for s in shapes]
    x = mj.nested_tensor(comps)
    assert x.ragged_dims == ragged_dims
    assert [tuple(c.shape) for c in x.unbind()] == shapes
    assert (x + 1).shape == x.shape


def test_square_pair_shares_one_nested_int():
    x = mj.nested_tensor([_c(2, 2, 4), _c(0, 0, 4), _c(3, 3, 4)])
    assert x.ragged_dims == (1, 2)
    assert is_nested_int(x.shape[1]) and x.shape[1] == x.shape[2]
    j = str(x.shape[1])
    assert str(x.shape) == f"torch.Size([3, {j}, {j}, 4])"


def test_rectangular_pair_has_two_nested_ints():
    x = mj.nested_tensor([_c(2, 3, 4), _c(1, 0, 4)])
    assert x.shape[1] != x.shape[2]
    # the same per-sample extent vector on both dims is a square pair, whatever the caller meant
    y = mj.nested_tensor([_c(2, 2, 4), _c(1, 1, 4)], ragged_dims=(1, 2))
    assert y.shape[1] == y.shape[2]


def test_ragged_dims_keeps_the_schema_when_lengths_are_equal():
    x = mj.nested_tensor([_c(2, 2, 4), _c(2, 2, 4)], ragged_dims=(1, 2))
    assert x.ragged_dims == (1, 2)
    assert is_nested_int(x.shape[1]) and x.shape[1] == x.shape[2]
    assert x.sizes().tolist() == [[2, 2], [2, 2]]
    y = mj.as_nested_tensor([_c(3, 2, 4), _c(3, 2, 4)], ragged_dims=(2,))
    assert y.ragged_dims == (2,) and y.shape[1] == 3 and is_nested_int(y.shape[2])
    # without ragged_dims the same list infers dim 1
    assert mj.nested_tensor([_c(3, 2, 4), _c(3, 2, 4)]).ragged_dims == (1,)


def test_inference_errors():
    with pytest.raises(ValueError, match="nested_tensor"):
        mj.nested_tensor([_c(2, 3), _c(2, 3, 1)])  # ranks differ
    with pytest.raises(ValueError, match="ragged_dims"):
        mj.nested_tensor([_c(2, 3), _c(1, 4)], ragged_dims=(1,))  # dim 2 differs, not ragged
    with pytest.raises(ValueError, match="ragged_dims"):
        mj.nested_tensor([_c(2, 3)], ragged_dims=(0,))
    with pytest.raises(ValueError, match="as_nested_tensor"):
        mj.as_nested_tensor([])


# ----------------------------------------------------------------------------- from_packed
def test_from_packed_is_a_zero_copy_view():
    v = torch.arange(10.0).reshape(5, 2)
    off = torch.tensor([0, 3, 3, 5])
    x = mj.from_packed(v, off, torch.tensor([3, 0, 2]))
    assert x.values().data_ptr() == v.data_ptr()
    assert [c.tolist() for c in x.unbind()] == [
        [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]],  # = rows 0..2
        [],  # = rows 3..2 (empty sample)
        [[6.0, 7.0], [8.0, 9.0]],  # = rows 3..4
    ]
    # one ragged dim: the nested int is keyed on the offsets themselves, as torch.jagged does
    njt = torch.nested.nested_tensor_from_jagged(v, off)
    assert x.shape[1] == njt.shape[1]


def test_from_packed_pairs_golden():
    # two samples: a (2, 3) pair (6 rows) and a (0, 5) pair (0 rows)
    v = torch.arange(6.0).reshape(6, 1)
    x = mj.from_packed(v, torch.tensor([0, 6, 6]), torch.tensor([[2, 3], [0, 5]]), ragged_dims=(1, 2), validate=True)
    a, b = x.unbind()
    assert a[..., 0].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # = rows 0..5 row-major over (2, 3)
    assert tuple(b.shape) == (0, 5, 1)  # = the exact extents, not (0, 0)
    # (B, S, j0, C): the ragged dim comes first in storage, the static S after it
    v = torch.arange(12.0).reshape(3, 2, 2)  # (T=3, S=2, C=2)
    y = mj.from_packed(v, torch.tensor([0, 1, 3]), torch.tensor([1, 2]), ragged_dims=(2,))
    c0, c1 = y.unbind()
    assert c0.tolist() == [[[0.0, 1.0]], [[2.0, 3.0]]]  # = v[0:1] with (n, S) → (S, n)
    assert c1.tolist() == [[[4.0, 5.0], [8.0, 9.0]], [[6.0, 7.0], [10.0, 11.0]]]  # = v[1:3].transpose(0, 1)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_batch_zero(layout):
    r = len(layout.ragged_dims)
    static = {"seq": (3,), "square": (3,), "rect": (3,), "static_lead": (2, 3)}[layout.name]
    x = mj.from_packed(torch.zeros(0, *static), torch.zeros(1, dtype=torch.int64),
                       torch.zeros(0, r, dtype=torch.int64), ragged_dims=layout.ragged_dims, validate=True)
    assert x.shape[0] == 0 and x.dim() == 1 + r + len(static)
    assert x.unbind() == ()
    assert tuple(x.sizes().shape) == (0, r)
    assert x.offsets().tolist() == [0]
    padded = torch.nested.to_padded_tensor(x, 0.0)
    assert padded.shape[0] == 0 and padded.dim() == x.dim()
    assert (x + 1).unbind() == ()
    assert (x * x).shape[0] == 0
    assert x.sum().item() == 0.0
    assert torch.relu(x).unbind() == ()
    assert F_linear(x).unbind() == ()


def F_linear(x):
    return torch.nn.functional.linear(x, torch.ones(4, x.shape[-1]))


def test_from_packed_cheap_checks_always_run():
    v, off, sizes = torch.zeros(5, 2), torch.tensor([0, 3, 3, 5]), torch.tensor([3, 0, 2])
    with pytest.raises(TypeError, match="from_packed.*offsets"):
        mj.from_packed(v, off.int(), sizes)
    with pytest.raises(TypeError, match="from_packed.*offsets"):
        mj.from_packed(v, off.reshape(2, 2), sizes)
    with pytest.raises(TypeError, match="from_packed.*sizes"):
        mj.from_packed(v, off, sizes.float())
    with pytest.raises(ValueError, match="from_packed.*sizes"):
        mj.from_packed(v, off, torch.tensor([3, 0]))  # B = 3 offsets say, 2 sizes
    with pytest.raises(ValueError, match="from_packed.*sizes"):
        mj.from_packed(v, off, sizes.view(3, 1, 1))
    with pytest.raises(ValueError, match="from_packed.*sizes"):
        mj.from_packed(v, off, sizes, ragged_dims=(1, 2))  # R = 2 but sizes has one column
    for bad in [(0,), (3,), (2, 1), (1, 1)]:
        with pytest.raises(ValueError, match="from_packed.*ragged_dims"):
            mj.from_packed(v, off, sizes.unsqueeze(1).expand(3, len(bad)).contiguous(), ragged_dims=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_from_packed_offsets_on_another_device():
    with pytest.raises(ValueError, match="from_packed.*offsets"):
        mj.from_packed(torch.zeros(5, 2), torch.tensor([0, 3, 3, 5], device="cuda"), torch.tensor([3, 0, 2]))


@pytest.mark.parametrize(
    "offsets, why",
    [
        ([1, 3, 3, 5], "start at 0"),
        ([0, 3, 2, 5], "non-decreasing"),
        ([0, 3, 3, 4], "end at"),
        ([0, 2, 3, 5], "disagree with sizes"),
    ],
)
@pytest.mark.parametrize("validate", [False, True])
def test_from_packed_validate(offsets, why, validate):
    # offsets on the CPU cost no device sync to read: checked with or without validate=
    v, sizes = torch.zeros(5, 2), torch.tensor([3, 0, 2])
    off = torch.tensor(offsets)
    with pytest.raises(ValueError, match=f"from_packed\\(\\): offsets .*{why}"):
        mj.from_packed(v, off, sizes, validate=validate)


def test_from_packed_validate_pairs():
    v = torch.zeros(7, 1)
    # (2, 3) and (1, 1): 6 + 1 rows
    mj.from_packed(v, torch.tensor([0, 6, 7]), torch.tensor([[2, 3], [1, 1]]), ragged_dims=(1, 2), validate=True)
    for validate in (False, True):
        with pytest.raises(ValueError, match="from_packed.*sizes"):
            # (3, 2) would also be 6 rows, but (1, 2) is 2 ≠ 1
            mj.from_packed(v, torch.tensor([0, 6, 7]), torch.tensor([[3, 2], [1, 2]]), ragged_dims=(1, 2), validate=validate)


# ----------------------------------------------------------------------------- from_padded
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_from_padded(layout):
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        envelope = [max((c.shape[d] for c in comps), default=n) + (d + 1 in s.ragged_dims) for d, n in enumerate(_shape0(comps))]
        padded = expected_padded(comps, 99.0, envelope).requires_grad_()
        lengths = torch.tensor(s.sizes, dtype=torch.int64).reshape(s.batch, len(s.ragged_dims))
        if lengths.shape[1] == 1 and seed % 2:
            lengths = lengths[:, 0]  # (B,) is accepted for R = 1
        x = mj.from_padded(padded, lengths, ragged_dims=s.ragged_dims)
        assert x.ragged_dims == s.ragged_dims
        for g, c in zip(x.unbind(), comps):
            assert_close(g, c, "from_padded")
        # gradient: the cotangent inside the valid region, zero in the padding
        cots = components(s.shapes, seed + 1)
        loss = sum(((g * c).sum() for g, c in zip(x.unbind(), cots)), (x.values() * 0).sum())  # a graph for B = 0 too
        (gp,) = torch.autograd.grad(loss, padded)
        assert_close(gp, expected_padded(cots, 0.0, envelope), "grad of padded")

    check()


def test_from_padded_errors():
    p = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="from_padded.*lengths"):
        mj.from_padded(p, torch.tensor([1, 5]))  # 5 > 3
    with pytest.raises(ValueError, match="from_padded.*lengths"):
        mj.from_padded(p, torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="from_padded.*lengths"):
        mj.from_padded(p, torch.tensor([1, 2, 3]))  # B = 2
    with pytest.raises(ValueError, match="from_padded.*ragged_dims"):
        mj.from_padded(p, torch.tensor([1, 2]), ragged_dims=(3,))


def test_from_padded_of_no_sample_takes_an_empty_list():
    """B = 0 with its lengths as a Python list: ``[]`` has no dtype of its own (torch reads it as
    float), it is no sample's length."""
    x = mj.from_padded(torch.zeros(0, 4, 3), [])
    assert x.shape[0] == 0 and x.shape[2] == 3 and x.unbind() == ()
    with pytest.raises(TypeError, match="integer dtype"):
        mj.from_padded(torch.zeros(2, 4, 3), [1.0, 2.0])


# ----------------------------------------------------------------------------- torch.jagged bridge
def test_to_padded_tensor_output_size_pads_and_never_cuts():
    """``output_size`` pads every dim; an entry smaller than a static dim (as one smaller than a
    ragged dim's longest extent) raises instead of cutting every sample's data."""
    x = mj.nested_tensor([torch.arange(6.0).view(2, 3), torch.zeros(0, 3), torch.arange(3.0).view(1, 3)])
    big = torch.nested.to_padded_tensor(x, -1.0, output_size=(3, 3, 4))
    assert big[0, :2, :3].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and big[1].eq(-1).all()
    assert big[2, 0, :3].tolist() == [0.0, 1.0, 2.0] and big[2, 1:].eq(-1).all() and big[:, :, 3].eq(-1).all()
    with pytest.raises(ValueError, match=r"output_size\[2\] = 2 is smaller than dim 2's size 3"):
        x.to_padded_tensor(0.0, output_size=(3, 2, 2))
    with pytest.raises(ValueError, match=r"output_size\[1\] = 1 is smaller than the longest extent 2"):
        x.to_padded_tensor(0.0, output_size=(3, 1, 3))
    lead = mj.nested_tensor([torch.ones(3, 2, 4), torch.ones(3, 1, 4)])  # (B, S, j0, C)
    with pytest.raises(ValueError, match=r"output_size\[1\] = 1 is smaller than dim 1's size 3"):
        lead.to_padded_tensor(0.0, output_size=(2, 1, 2, 4))


def test_from_jagged_checks_the_offsets_against_the_values():
    """torch.jagged takes offsets as given: offsets ending before the values' rows would leave
    rows no sample owns, which whole-tensor ops count; ``from_jagged`` refuses them."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        njt = torch.nested.nested_tensor_from_jagged(torch.arange(12.0).view(6, 2), torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"from_jagged\(\): the torch.jagged tensor's offsets must end at the packed row count 6"):
        mj.from_jagged(njt)


def test_from_jagged_keeps_the_nested_int():
    a = [torch.randn(3, 4), torch.randn(0, 4), torch.randn(2, 4)]
    njt = torch.nested.nested_tensor(a, layout=torch.jagged)
    x = mj.from_jagged(njt)
    assert x.shape[1] == njt.shape[1]
    assert x.shape == njt.shape
    assert x.values().data_ptr() == njt.values().data_ptr()  # shares the values
    for g, c in zip(x.unbind(), a):
        assert_close(g, c, "from_jagged")
    back = x.to_jagged()
    assert back.layout == torch.jagged and back.shape == njt.shape and back.shape[1] == njt.shape[1]


@pytest.mark.parametrize("layout", [SEQ, STATIC_LEAD], ids=str)
def test_to_jagged(layout):
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x, leaves = build(comps, s.ragged_dims, requires_grad=True)
        njt = x.to_jagged()
        assert njt.layout == torch.jagged and njt.is_nested
        assert njt.shape == x.shape and njt.shape[s.ragged_dims[0]] == x.shape[s.ragged_dims[0]]
        for g, c in zip(njt.unbind(), comps):
            assert_close(g, c, "to_jagged")
        # differentiable both ways
        y = mj.from_jagged(njt * 2)
        assert y.shape == x.shape
        cots = components(s.shapes, seed + 1)
        if not leaves:  # B = 0
            return
        grads = torch.autograd.grad(sum((g * c).sum() for g, c in zip(y.unbind(), cots)), leaves)
        for g, c in zip(grads, cots):
            assert_close(g, 2 * c, "grad through to_jagged / from_jagged")

    check()


def test_jagged_bridge_errors():
    nc = torch.nested.narrow(torch.zeros(2, 5, 4), 1, torch.tensor([0, 1]), torch.tensor([3, 2]), layout=torch.jagged)
    with pytest.raises(ValueError, match="from_jagged.*contiguous"):
        mj.from_jagged(nc)
    pair = mj.nested_tensor([_c(2, 3, 1), _c(1, 0, 1)])
    with pytest.raises(ValueError, match="to_jagged.*ragged"):
        pair.to_jagged()
    with pytest.raises(TypeError, match="from_jagged"):
        mj.from_jagged(torch.zeros(2, 3))


# ----------------------------------------------------------------------------- other layouts unchanged
_PRELUDE = """
import json, torch
a = [torch.arange(6.).reshape(3, 2), torch.arange(2.).reshape(1, 2) + 10]
out = {}
"""

_CONSTRUCT = """
s = torch.nested.nested_tensor(a)
out["strided"] = [str(s.layout), s.is_nested, [t.tolist() for t in s.unbind()]]
j = torch.nested.nested_tensor(a, layout=torch.jagged, dtype=torch.float64, requires_grad=True)
out["jagged"] = [str(j.layout), j.dtype == torch.float64, j.requires_grad, j.is_leaf,
                 j.values().tolist(), j.offsets().tolist()]
g = [t.clone().requires_grad_() for t in a]
k = torch.nested.as_nested_tensor(g, layout=torch.jagged)
k.values().sum().backward()
out["as_jagged"] = [str(k.layout), [t.grad.tolist() for t in g]]
m = torch.nested.as_nested_tensor(a)
out["as_strided"] = [str(m.layout), [t.tolist() for t in m.unbind()]]
try:
    torch.nested.nested_tensor(a, layout=torch.sparse_coo)
    out["bad_layout"] = None
except Exception as e:
    out["bad_layout"] = type(e).__name__
"""

_TO_PADDED = """
s = torch.nested.nested_tensor(a)
j = torch.nested.nested_tensor(a, layout=torch.jagged)
out["strided"] = [torch.nested.to_padded_tensor(s, -1.0).tolist(),
                  torch.nested.to_padded_tensor(s, 0.0, output_size=(2, 4, 3)).tolist()]
out["jagged"] = torch.nested.to_padded_tensor(j, -1.0).tolist()
"""


_PARTS = {"construct": _CONSTRUCT, "to_padded": _TO_PADDED}
_DRIVER = """
results = {}
for name, body in PARTS.items():
    out = {}
    try:
        exec(PRELUDE + body)
        results[name] = out
    except Exception as e:
        results[name] = "error: " + type(e).__name__ + ": " + str(e)
print(json.dumps(results))
"""


def _run(prefix):
    script = f"{prefix}\nimport json\nPRELUDE = {_PRELUDE!r}\nPARTS = {_PARTS!r}\n{_DRIVER}"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain_and_ours():
    """The same scripts run by plain torch (no import of the package) and after the import."""
    return _run(""), _run("import torch_multijagged")


@pytest.mark.parametrize(
    "part",
    [
        "construct",
        "to_padded",
    ],
)
def test_strided_and_jagged_layouts_unchanged(plain_and_ours, part):
    plain, ours = plain_and_ours
    assert isinstance(plain[part], dict), plain[part]
    assert ours[part] == plain[part]


def test_from_packed_on_a_batchs_offsets_shares_its_structure():
    """``from_packed(v, x.offsets(), x.sizes())`` — keys and values beside the queries — reuses
    x's extent and partition (one nested int, no relabelling between them); other lengths on
    the same offsets tensor (after an in-place write to it) or a copy of the offsets do not."""
    x = mj.nested_tensor([torch.randn(n, 2) for n in (3, 0, 2)])
    k = mj.from_packed(torch.randn(5, 4), x.offsets(), x.sizes())
    assert k._partition is x._partition and k.shape[1] is x.shape[1]
    assert [t.shape for t in k.unbind()] == [(3, 4), (0, 4), (2, 4)]
    c = mj.from_packed(torch.randn(5, 4), x.offsets().clone(), x.sizes())
    assert c._partition is not x._partition and c.shape[1] != x.shape[1]
    assert torch.equal((x.sum(-1) + c.sum(-1)).values(), x.values().sum(-1) + c.values().sum(-1))
    off = torch.tensor([0, 2, 5])
    a = mj.from_packed(torch.randn(5, 1), off, torch.tensor([2, 3]))
    off[1] = 1  # now lengths (1, 4): a new structure on the same tensor
    b = mj.from_packed(torch.randn(5, 1), off, torch.tensor([1, 4]))
    assert b._partition is not a._partition and [t.shape[0] for t in b.unbind()] == [1, 4]


@pytest.mark.parametrize("jagged_dim", [1, 2, 3])
def test_values_round_trip_as_torch_jagged(jagged_dim):
    """``values()`` of one ragged dim ``r`` holds the rows at dim ``r - 1``, as ``torch.jagged``'s:
    ``nested_tensor_from_jagged(x.values(), x.offsets(), jagged_dim=x._ragged_idx)`` rebuilds
    ``x`` (with rows first it silently read the wrong elements), also after a transpose."""
    g = torch.Generator().manual_seed(0)
    shape = [3, 4, 5]
    shape[jagged_dim - 1] = 9
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    off = torch.tensor([0, 3, 3, 8, 9])  # an empty sample too
    ours = mj.nested_tensor_from_jagged(v, off, jagged_dim=jagged_dim)
    njt = torch.nested.nested_tensor_from_jagged(v, off, jagged_dim=jagged_dim)
    assert ours.values().shape == njt.values().shape == v.shape
    torch.testing.assert_close(ours.values(), njt.values())
    back = mj.nested_tensor_from_jagged(ours.values() * 2, ours.offsets(), jagged_dim=ours._ragged_idx)
    for a, b in zip(back.unbind(), njt.unbind()):
        torch.testing.assert_close(a, b * 2)
    if jagged_dim < 3:
        t, tn = ours.transpose(jagged_dim, jagged_dim + 1), njt.transpose(jagged_dim, jagged_dim + 1)
        assert t._ragged_idx == tn._ragged_idx
        torch.testing.assert_close(t.values(), tn.values())
