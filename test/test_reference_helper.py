"""The oracle can fail: ``per_sample_check`` rejects wrong values, wrong gradients and wrong
structure (a test that cannot fail is a defect)."""

import pytest
import torch

from hypothesis import given

from _reference import (
    DTYPES,
    R,
    RECT3,
    RECT3_MID,
    SQUARE,
    Structure,
    build,
    components,
    normalize_nested_ints,
    per_sample_check,
    random_values,
    structures,
)


def _x():
    return R(components([(2, 2, 3), (0, 0, 3), (1, 1, 3)], seed=0), SQUARE.ragged_dims)


def test_accepts_a_correct_op():
    per_sample_check(torch.sin, _x())


def test_rejects_wrong_values():
    with pytest.raises(AssertionError, match="sample 0"):
        per_sample_check(torch.sin, _x(), ref=torch.cos)


def test_rejects_wrong_gradients():
    # same forward value, gradient 1 instead of 1.5
    with pytest.raises(AssertionError, match="grad of input leaf"):
        per_sample_check(lambda t: t + (t * 0.5).detach(), _x(), ref=lambda t: t * 1.5)


def test_rejects_a_dense_result_where_a_ragged_one_is_expected():
    with pytest.raises(AssertionError, match="multi_jagged output"):
        per_sample_check(lambda t: t.sum(), _x())


def test_normalize_nested_ints():
    assert normalize_nested_ints("(3, j17, j17, j4) j170") == "(3, j0, j0, j1) j2"


# ----------------------------------------------------------------------------- generators
def test_build_makes_batch_zero_from_a_structure():
    s = Structure(RECT3_MID, (), 2, 3, torch.float32)
    comps = s.components(0)
    assert comps == [] and comps.template == (0, 2, 0, 0, 3)
    x, leaves = build(comps, s.ragged_dims, requires_grad=True)
    assert leaves == [] and x.shape[0] == 0 and x.dim() == 6 and x.dtype == torch.float32
    assert x.ragged_dims == (1, 3, 4) and tuple(x.sizes().shape) == (0, 3)


def test_per_sample_check_checks_dtype_and_rank_at_batch_zero():
    x = R(Structure(SQUARE, (), 1, 3).components(0), SQUARE.ragged_dims)
    per_sample_check(lambda t: t.sum(-1), x)
    with pytest.raises(AssertionError, match="B = 0: dtype"):
        per_sample_check(lambda t: t.float(), x, ref=lambda t: t)
    with pytest.raises(AssertionError, match="B = 0: output rank"):
        per_sample_check(lambda t: t, x, ref=lambda t: t.sum(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_values_fit_the_dtype(dtype):
    v = random_values((400,), torch.Generator().manual_seed(0), dtype)
    assert v.dtype == dtype
    if dtype == torch.bool:
        assert 100 < int(v.sum()) < 300
    elif not dtype.is_floating_point:
        assert set(v.tolist()) == {-2, -1, 0, 1, 2}  # small: zeros and ties are common
    else:
        assert -2 <= float(v.min()) and float(v.max()) <= 2 and len(set(v.tolist())) > 100


@given(structures(RECT3, min_batch=0, dtypes=DTYPES))
def test_structures_draw_what_they_promise(s):
    assert s.layout is RECT3 and all(len(e) == 3 for e in s.lengths)
    assert all(min(e) >= 0 for e in s.lengths) and s.dtype in DTYPES
    assert [tuple(c.shape) for c in s.components(0)] == [tuple(sh) for sh in s.shapes]
