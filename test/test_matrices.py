"""Per-sample matrix structure (ops/shape/matrices.py): ``tril`` / ``triu`` over the last two dims
(ragged or static), ``trace``, ``diag``, ``diagflat``; and ``rot90`` (ops/indexing/slicing.py),
``channel_shuffle`` and ``view_copy`` (ops/shape/reshape.py) — against the per-sample reference
with gradients, zero-length samples and the errors."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import torch_multijagged as mj

from _reference import R, RECT, SEQ, STATIC_LEAD, few, per_sample_check, seeds, structures
from _structures import comps_for, lengths, per_sample_check_any_ints

FEW = few(8)


def _square_matrices(ns, seed):
    return comps_for([(n, n) for n in ns], seed)


# structure → (component shape from n, ragged dims)
MATRICES = {
    "square (B, j0, j0)": (lambda n: (n, n), (1, 2)),
    "tokens (B, j0, C)": (lambda n: (n, 3), (1,)),
    "channels (B, C, j0)": (lambda n: (3, n), (2,)),
    "static matrices (B, j0, k, k)": (lambda n: (n, 3, 3), (1,)),
    "pair (B, j0, j0, C)": (lambda n: (n, n, 2), (1, 2)),
}


@pytest.mark.parametrize("diagonal", [-1, 0, 2])
@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("structure", MATRICES)
def test_tril_triu_per_sample(structure, op, diagonal):
    shape, ragged = MATRICES[structure]
    f = getattr(torch, op)

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        per_sample_check(lambda x: f(x, diagonal), R(comps_for([shape(n) for n in ns], seed), ragged), seed=seed)

    check()


@pytest.mark.parametrize("op", ["tril_", "triu_"])
def test_tril_triu_in_place(op):
    """``x.tril_(k)`` / ``x.triu_(k)`` write the out-of-place result into ``x``, with gradients."""
    per_sample_check(lambda x: getattr(x * 1, op)(-1), R(_square_matrices((3, 0, 2), 7), (1, 2)),
                     ref=lambda c: getattr(c * 1, op)(-1))
    per_sample_check(lambda x: getattr(x * 1, op)(1), R(comps_for([(n, 3) for n in (3, 0, 2)], 8), (1,)),
                     ref=lambda c: getattr(c * 1, op)(1))


def test_tril_of_a_rectangular_pair_and_golden():
    """``(B, j0, j1)``: row and column coordinates of different extents."""

    @FEW
    @given(structures(RECT, max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(lambda x: x.tril(-1), R(s.components(seed), s.ragged_dims), ref=lambda c: c.tril(-1), seed=seed)

    check()
    x = mj.nested_tensor([torch.arange(1.0, 10.0).view(3, 3), torch.zeros(0, 0)], ragged_dims=(1, 2))
    assert x.triu().unbind()[0].tolist() == [[1.0, 2.0, 3.0], [0.0, 5.0, 6.0], [0.0, 0.0, 9.0]]
    with pytest.raises(RuntimeError, match="tril"):
        torch.tril(mj.nested_tensor([torch.ones(2), torch.ones(3)]))


def test_trace_diag_diagflat_per_sample():
    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        sq = R(_square_matrices(ns, seed), (1, 2))
        vec = R(comps_for([(n,) for n in ns], seed + 1), (1,))
        per_sample_check(torch.trace, sq, dense_out=True, seed=seed)
        per_sample_check(lambda x: x.diag(), sq, ref=torch.diag, seed=seed)  # matrix → its diagonal
        per_sample_check(torch.diag, vec, seed=seed)  # vector → (n, n) matrix
        per_sample_check(torch.diagflat, vec, seed=seed)

    check()


@pytest.mark.parametrize("offset", [0, 1, -1, 3, -4])
def test_diagonal_over_a_ragged_and_a_static_dim(offset):
    """Each sample's own diagonal of its ``(n, C)`` matrix (either order of the dims, a static dim
    beside), ``min`` of its sides long: a new extent, appended last; ``trace`` of such samples a
    dense ``(B,)``; with gradients and an empty sample."""

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        per_sample_check_any_ints(lambda x: torch.diagonal(x, offset, 1, 2), lambda c: torch.diagonal(c, offset, 0, 1),
                                  comps_for([(n, 3) for n in ns], seed), (1,), seed=seed)
        per_sample_check_any_ints(lambda x: torch.diagonal(x, offset, 3, 1), lambda c: torch.diagonal(c, offset, 2, 0),
                                  comps_for([(2, n, 4) for n in ns], seed + 1), (2,), seed=seed)
        per_sample_check_any_ints(lambda x: x.diagonal(offset, 2, 1), lambda c: c.diagonal(offset, 1, 0),
                                  comps_for([(n, 4, 2) for n in ns], seed + 2), (1,), seed=seed)
        if offset == 0:
            per_sample_check(torch.trace, R(comps_for([(n, 3) for n in ns], seed), (1,)), dense_out=True, seed=seed)

    check()


def test_diag_errors():
    v = mj.nested_tensor([torch.ones(2), torch.ones(0)])
    with pytest.raises(NotImplementedError, match="diag.*new extent"):
        torch.diag(v, 1)
    # an off-diagonal of a ragged (n, n) has max(n - |k|, 0) elements: a new ragged size
    sq = [torch.randn(n, n) for n in (2, 3, 0)]
    for k in (1, -2):
        for a, c in zip(torch.diag(mj.nested_tensor(sq, ragged_dims=(1, 2)), k).unbind(), sq):
            torch.testing.assert_close(a, torch.diag(c, k))
    with pytest.raises(RuntimeError, match="diagflat"):
        torch.diagflat(mj.nested_tensor([torch.ones(2, 3), torch.ones(0, 3)]))
    with pytest.raises(RuntimeError, match="trace"):
        torch.trace(v)  # a batch of vectors
    with pytest.raises(NotImplementedError, match="Bool"):
        torch.trace(mj.nested_tensor([torch.ones(2, 2, dtype=torch.bool)], ragged_dims=(1, 2)))


@pytest.mark.parametrize("k", [0, 1, 2, 3, -1])
def test_rot90_per_sample(k):
    """Over two static dims, a ragged and a static dim, and the two ragged dims of a rectangular
    pair (whose nested ints swap)."""

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        per_sample_check(lambda x: torch.rot90(x, k, (2, 3)), R(comps_for([(n, 2, 3) for n in ns], seed), (1,)),
                         ref=lambda c: torch.rot90(c, k, (1, 2)), seed=seed)
        per_sample_check_any_ints(lambda x: x.rot90(k, (1, 2)), lambda c: c.rot90(k, (0, 1)),
                                  comps_for([(n, 3) for n in ns], seed + 1), (1,), seed=seed)
        per_sample_check_any_ints(lambda x: x.rot90(k, (2, 1)), lambda c: c.rot90(k, (1, 0)),
                                  comps_for([(n, n + 1, 2) for n in ns], seed + 2), (1, 2), seed=seed)

    check()


def test_rot90_errors():
    x = mj.nested_tensor([torch.ones(2, 3)])
    with pytest.raises(NotImplementedError, match="rot90.*batch dim"):
        torch.rot90(x, 1, (0, 1))
    with pytest.raises(RuntimeError, match="rot90"):
        torch.rot90(x, 1, (1, 1))


@pytest.mark.parametrize("layout", [SEQ, STATIC_LEAD], ids=str)
def test_channel_shuffle_and_view_copy(layout):
    @FEW
    @given(structures(layout, max_batch=3, min_c=4, max_c=4), seeds)
    def check(s, seed):
        x = R(s.components(seed), s.ragged_dims)
        chans = R([c.movedim(-1, 0) for c in s.components(seed)], tuple(d + 1 for d in s.ragged_dims))  # (B, C, …)
        per_sample_check(lambda t: F.channel_shuffle(t, 2), chans, ref=lambda c: F.channel_shuffle(c.unsqueeze(0), 2)[0], seed=seed)
        per_sample_check(lambda t: torch.view_copy(t, [*t.shape[:-1], 2, 2]), x, ref=lambda c: torch.view_copy(c, [*c.shape[:-1], 2, 2]), seed=seed)

    check()
    with pytest.raises(RuntimeError, match="channel_shuffle"):
        F.channel_shuffle(mj.nested_tensor([torch.ones(3, 2), torch.ones(3, 0)], ragged_dims=(2,)), 2)
