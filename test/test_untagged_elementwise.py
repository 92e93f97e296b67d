"""Elementwise aten ops that torch 2.13 leaves without the pointwise tag (``floor_divide``,
``hardswish``, the in-place comparisons; ops/elementwise/pointwise.py ``_UNTAGGED``; in-place forms of
tagged ops, ``abs_``, ``gcd_``…, ops/_table.py) and a sweep of common elementwise ops over every
dtype they take, against the per-sample reference (values and result dtype)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import torch_multijagged as mj

from _reference import LAYOUTS, R, components, few, per_sample_check, seeds, structures

INTS = (torch.int8, torch.int32, torch.int64, torch.uint8)
FLOATS = (torch.float32, torch.float64)
NUMS = INTS + FLOATS

def _nonzero(y):
    """A divisor in 1..3 for every dtype (``abs(y) + 1`` wraps to 0 for uint8 255; integer
    division by zero raises in dense torch too)."""
    return y.abs() % 3 + 1


# name -> (fn(x, y) with y a second operand of x's structure, dtypes)
OPS = {
    "x // 2": (lambda x, y: x // 2, NUMS),
    "x // y": (lambda x, y: x // (_nonzero(y)), NUMS),
    "floor_divide": (lambda x, y: torch.floor_divide(x, _nonzero(y)), NUMS),
    "x //= 3": (lambda x, y: x.clone().floor_divide_(3), NUMS),
    "x //= y": (lambda x, y: x.clone().floor_divide_(_nonzero(y)), NUMS),
    "remainder": (lambda x, y: x % 3, NUMS),
    "remainder_tensor": (lambda x, y: torch.remainder(x, _nonzero(y)), NUMS),
    "fmod": (lambda x, y: torch.fmod(x, _nonzero(y)), NUMS),
    "div_floor": (lambda x, y: torch.div(x, _nonzero(y), rounding_mode="floor"), NUMS),
    "div_trunc": (lambda x, y: torch.div(x, 2, rounding_mode="trunc"), NUMS),
    "bitwise_and": (lambda x, y: x & y, INTS + (torch.bool,)),
    "bitwise_or": (lambda x, y: x | y, INTS + (torch.bool,)),
    "bitwise_xor": (lambda x, y: torch.bitwise_xor(x, y), INTS + (torch.bool,)),
    "bitwise_not": (lambda x, y: ~x, INTS + (torch.bool,)),
    "shift": (lambda x, y: (x.abs() << 1) >> 1, (torch.int32, torch.int64)),
    "logical_and": (lambda x, y: torch.logical_and(x, y), NUMS + (torch.bool,)),
    "logical_or": (lambda x, y: torch.logical_or(x, y), NUMS + (torch.bool,)),
    "logical_xor": (lambda x, y: torch.logical_xor(x, y), NUMS + (torch.bool,)),
    "logical_not": (lambda x, y: torch.logical_not(x), NUMS + (torch.bool,)),
    "clamp": (lambda x, y: x.clamp(-1, 1), NUMS),
    "clamp_tensor": (lambda x, y: torch.clamp(x, min=y), NUMS),
    "clamp_max": (lambda x, y: x.clamp_max(0), NUMS),
    "where": (lambda x, y: torch.where(x > y, x, y), NUMS + (torch.bool,)),
    "where_scalar": (lambda x, y: torch.where(x > 0, x, 0), NUMS),
    "lerp": (lambda x, y: torch.lerp(x, y, 0.25), FLOATS),
    "addcmul": (lambda x, y: torch.addcmul(x, x, y, value=2), NUMS),
    "addcdiv": (lambda x, y: torch.addcdiv(x, x, _nonzero(y), value=0.5), FLOATS),
    "heaviside": (lambda x, y: torch.heaviside(x, y), NUMS),
    "copysign": (lambda x, y: torch.copysign(x, y), NUMS),
    "nan_to_num": (lambda x, y: torch.nan_to_num(x / y), FLOATS),
    "maximum": (lambda x, y: torch.maximum(x, y), NUMS + (torch.bool,)),
    "sign": (lambda x, y: torch.sign(x), NUMS),
    "hardswish": (lambda x, y: F.hardswish(x), FLOATS),
    # in-place comparisons: 0 or 1 in x's own dtype
    "x.lt_(0)": (lambda x, y: x.clone().lt_(0), NUMS + (torch.bool,)),
    "x.ge_(y)": (lambda x, y: x.clone().ge_(y), NUMS + (torch.bool,)),
    "x.eq_(y)": (lambda x, y: x.clone().eq_(y), NUMS + (torch.bool,)),
    "x.ne_(1)": (lambda x, y: x.clone().ne_(1), NUMS + (torch.bool,)),
    "x.le_(y) x.gt_(0)": (lambda x, y: x.clone().le_(y).clone().gt_(0), NUMS),
    # in-place forms that torch 2.13 tags ``inplace`` only, their functional forms ``pointwise``
    "x.abs_()": (lambda x, y: x.clone().abs_(), NUMS),
    "x.copysign_(y)": (lambda x, y: x.clone().copysign_(y), FLOATS),
    "x.copysign_(-1)": (lambda x, y: x.clone().copysign_(-1), FLOATS),
    "x.heaviside_(y)": (lambda x, y: x.clone().heaviside_(y), NUMS),
    "x.gcd_(y) x.lcm_(y)": (lambda x, y: x.clone().gcd_(y) + x.clone().lcm_(_nonzero(y)), (torch.int32, torch.int64)),
    "x.true_divide_(y)": (lambda x, y: x.clone().true_divide_(_nonzero(y)), FLOATS),
    "x.xlogy_(2)": (lambda x, y: x.clone().xlogy_(2.0), FLOATS),
    "F.threshold_": (lambda x, y: F.threshold_(x.clone(), 0.1, 2.0), FLOATS),
    "F.mish(inplace)": (lambda x, y: F.mish(x.clone(), inplace=True), FLOATS),
    "gelu_": (lambda x, y: torch._C._nn.gelu_(x.clone()), FLOATS),
    # elementwise with one dense parameter for every element
    "isin": (lambda x, y: torch.isin(x, torch.tensor([0, 1, -2], dtype=x.dtype)), NUMS),
    "isin_scalar": (lambda x, y: torch.isin(x, 1), NUMS),
    "bucketize": (lambda x, y: torch.bucketize(x, torch.tensor([-1, 0, 1], dtype=x.dtype)), NUMS),
    "searchsorted": (lambda x, y: torch.searchsorted(torch.tensor([-1, 0, 1], dtype=x.dtype), x, right=True), NUMS),
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_elementwise_per_sample_dtypes(name, layout):
    f, dtypes = OPS[name]

    @few(5)
    @given(structures(layout, max_batch=3, dtypes=dtypes), seeds)
    def check(s, seed):
        # per_sample_check(share=True): y carries x's nested ints, as a model's operands do
        per_sample_check(f, R(components(s.shapes, seed, dtype=s.dtype), s.ragged_dims),
                         R(components(s.shapes, seed + 1, dtype=s.dtype), s.ragged_dims), share=True, grad=False)

    check()


@pytest.mark.parametrize("name", ["hardswish", "lerp", "addcdiv", "clamp_tensor", "where", "copysign", "x.copysign_(y)", "x.abs_()", "x.copysign_(-1)",
                                  "x.true_divide_(y)", "x.xlogy_(2)", "F.threshold_", "F.mish(inplace)", "gelu_"])
def test_elementwise_grads(name):
    f, _ = OPS[name]

    @few(8)
    @given(structures(LAYOUTS[1], max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(f, R(components(s.shapes, seed), s.ragged_dims), R(components(s.shapes, seed + 1), s.ragged_dims), share=True, seed=seed)

    check()


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_equal_and_allclose(layout):
    """``torch.equal`` / ``torch.allclose`` give a Python bool over the whole batch: True for equal
    elements and per-sample extents (operands built separately), False when an element or an
    extent differs, or against a dense tensor."""

    @few(5)
    @given(structures(layout, max_batch=3), seeds)
    def check(s, seed):
        cs = components(s.shapes, seed)
        x = mj.nested_tensor(cs, ragged_dims=s.ragged_dims)
        y = mj.nested_tensor([c.clone() for c in cs], ragged_dims=s.ragged_dims)
        assert torch.equal(x, y) is True and torch.allclose(x, y) is True
        assert torch.allclose(x, y + 1e-9) is True and torch.equal(x, y + 1e-9) is (x.numel() == 0)
        assert torch.equal(x, y + 1) is (x.numel() == 0) and torch.allclose(x, y + 1) is (x.numel() == 0)
        assert torch.equal(x, x.values()) is False
        if any(c.numel() for c in cs):
            longer = [torch.cat([c, c], 0) if c.shape[0] else c for c in cs]  # another extent
            z = mj.nested_tensor(longer, ragged_dims=s.ragged_dims) if s.ragged_dims == (1,) else None
            if z is not None:
                assert torch.equal(x, z) is False

    check()


def test_floor_divide_golden():
    x = mj.nested_tensor([torch.tensor([7, -7, 6]), torch.zeros(0, dtype=torch.int64)])
    assert [c.tolist() for c in (x // 2).unbind()] == [[3, -4, 3], []]  # = floor(7/2), floor(-7/2), 6/2
    f = mj.nested_tensor([torch.tensor([7.5, -1.0]), torch.zeros(0)])
    assert [c.tolist() for c in (f // 2).unbind()] == [[3.0, -1.0], []]
    assert [c.tolist() for c in (f // f).unbind()] == [[1.0, 1.0], []]
    y = f.clone()
    y //= 2
    assert [c.tolist() for c in y.unbind()] == [[3.0, -1.0], []]
