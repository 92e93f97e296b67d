"""repr, serialization and the tensor-level conversions (tensor.py, ops/factory.py)."""

import copy
import io
import pickle

import pytest
import torch
from expecttest import TestCase
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor, multi_jagged

from _reference import LAYOUTS, assert_close, components, normalize_nested_ints, seeds, structures


def _pair():
    return mj.nested_tensor([torch.zeros(2, 2, 3), torch.zeros(0, 0, 3), torch.zeros(1, 1, 3)])


def _rect():
    return mj.nested_tensor([torch.zeros(2, 3, 1), torch.zeros(0, 4, 1)])


class TestRepr(TestCase):
    def test_sequence(self):
        x = mj.nested_tensor([torch.zeros(3, 4), torch.zeros(0, 4)])
        self.assertExpectedInline(
            normalize_nested_ints(repr(x)),
            """MultiJaggedTensor(shape=(2, j0, 4), ragged_dims=(1,), sizes=[[3], [0]], dtype=torch.float32, device=cpu)""",
        )

    def test_square_pair_prints_one_nested_int(self):
        self.assertExpectedInline(
            normalize_nested_ints(repr(_pair())),
            """MultiJaggedTensor(shape=(3, j0, j0, 3), ragged_dims=(1, 2), sizes=[[2, 2], [0, 0], [1, 1]], dtype=torch.float32, device=cpu)""",
        )

    def test_rectangular_pair(self):
        # the exact extents (0, 4) are shown, not (0, 0)
        self.assertExpectedInline(
            normalize_nested_ints(repr(_rect())),
            """MultiJaggedTensor(shape=(2, j0, j1, 1), ragged_dims=(1, 2), sizes=[[2, 3], [0, 4]], dtype=torch.float32, device=cpu)""",
        )

    def test_static_leading_dim_and_grad(self):
        x = mj.nested_tensor([torch.zeros(5, 2, 3), torch.zeros(5, 0, 3)], requires_grad=True)
        self.assertExpectedInline(
            normalize_nested_ints(repr(x)),
            """MultiJaggedTensor(shape=(2, 5, j0, 3), ragged_dims=(2,), sizes=[[2], [0]], dtype=torch.float32, device=cpu, requires_grad=True)""",
        )
        assert "grad_fn=" in repr(x * 2)

    def test_shape_str(self):
        self.assertExpectedInline(normalize_nested_ints(str(_pair().shape)), """torch.Size([3, j0, j0, 3])""")
        self.assertExpectedInline(normalize_nested_ints(str(_rect().shape)), """torch.Size([2, j0, j1, 1])""")


# ----------------------------------------------------------------------------- round trips
def _save_load(x):
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


ROUNDTRIPS = {
    "torch.save": _save_load,
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
    "deepcopy": copy.deepcopy,
}


def _assert_same(y, x):
    assert isinstance(y, MultiJaggedTensor) and y.layout is multi_jagged
    assert y.ragged_dims == x.ragged_dims
    assert torch.equal(y.sizes(), x.sizes())
    assert torch.equal(y.offsets(), x.offsets())
    assert_close(y.values(), x.values(), "values")
    assert y.dtype == x.dtype and y.requires_grad == x.requires_grad
    for a, b in zip(y.unbind(), x.unbind()):
        assert_close(a, b, "component")
    # extent sharing survives: a square pair keeps one nested int for both dims
    for d in x.ragged_dims:
        for e in x.ragged_dims:
            assert (y.shape[d] == y.shape[e]) == (x.shape[d] == x.shape[e])


@pytest.mark.parametrize("how", ROUNDTRIPS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_roundtrip(layout, how):
    @given(structures(layout), seeds)
    def check(s, seed):
        x = mj.nested_tensor(components(s.shapes, seed), ragged_dims=s.ragged_dims)
        _assert_same(ROUNDTRIPS[how](x), x)

    check()


@pytest.mark.parametrize("how", ROUNDTRIPS, ids=str)
def test_roundtrip_leaf_with_grad_and_batch_zero(how):
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)], requires_grad=True)
    y = ROUNDTRIPS[how](x)
    _assert_same(y, x)
    assert y.is_leaf
    (y * 2).sum().backward()
    assert [g.tolist() for g in y.grad.unbind()] == [[[2.0] * 3] * 2, []]  # d(2y)/dy = 2
    z = mj.from_packed(torch.zeros(0, 2, 3), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 2, dtype=torch.int64),
                       ragged_dims=(1, 2))
    _assert_same(ROUNDTRIPS[how](z), z)


def test_deepcopy_is_independent():
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)])
    y = copy.deepcopy(x)
    y.fill_(5.0)
    assert x.unbind()[0].tolist() == [[1.0] * 3] * 2


# ----------------------------------------------------------------------------- conversions
def test_to_dtype_and_device():
    x = mj.nested_tensor([torch.tensor([[1.5, 2.5]]), torch.zeros(0, 2)], requires_grad=True)
    y = x.to(torch.float64)
    assert isinstance(y, MultiJaggedTensor) and y.dtype == torch.float64 and y.values().dtype == torch.float64
    assert y.shape == x.shape and y.shape[1] == x.shape[1]  # same device: same nested int
    assert [c.tolist() for c in y.unbind()] == [[[1.5, 2.5]], []]
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and [g.tolist() for g in x.grad.unbind()] == [[[1.0, 1.0]], []]
    z = x.to(torch.int64)
    assert [c.tolist() for c in z.unbind()] == [[[1, 2]], []]  # = trunc(1.5), trunc(2.5)
    assert x.to("cpu").device.type == "cpu" and x.to("cpu").shape == x.shape
    assert x.double().dtype == torch.float64 and x.half().dtype == torch.float16


def test_clone_detach_contiguous_requires_grad():
    x = _pair()
    c = x.clone()
    assert isinstance(c, MultiJaggedTensor) and c.shape == x.shape and c.shape[1] == x.shape[1]
    assert c.values().data_ptr() != x.values().data_ptr()
    c.fill_(1.0)
    assert x.values().abs().sum() == 0  # clone does not alias
    assert x.is_contiguous() and x.contiguous().shape == x.shape
    y = x.requires_grad_()
    assert y is x and x.requires_grad and x.is_leaf
    d = (x * 3).detach()
    assert isinstance(d, MultiJaggedTensor) and not d.requires_grad and d.shape == x.shape
    (x * 3).sum().backward()
    assert [g.tolist() for g in x.grad.unbind()][0] == [[[3.0] * 3] * 2] * 2  # d(3x)/dx = 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_to_another_device_and_back():
    x = _pair()
    y = x.to("cuda")
    assert y.device.type == "cuda" and y.offsets().device.type == "cuda"
    assert torch.equal(y.sizes(), x.sizes()) and y.ragged_dims == x.ragged_dims
    assert y.shape[1] == y.shape[2]  # extent sharing survives the move
    z = y.cpu()
    for a, b in zip(z.unbind(), x.unbind()):
        assert torch.equal(a, b)
