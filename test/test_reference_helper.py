"""The oracle can fail: ``per_sample_check`` rejects wrong values, wrong gradients and wrong
structure (a test that cannot fail is a defect)."""

import pytest
import torch

from _reference import R, SQUARE, components, normalize_nested_ints, per_sample_check


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
