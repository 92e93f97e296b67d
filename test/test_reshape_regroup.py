"""``reshape`` / ``view`` regrouping static elements into or out of a ragged dim, per sample as
dense torch's (ops/shape/regroup.py, NOTE [ Regrouping across a ragged dim ]): values, dtypes,
gradients of every component, a zero-length sample, an empty batch, which forms are views, and
the errors."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.errors import StructureError
from _reference import R, per_sample_check

F64 = torch.float64


def _comps(shapes, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, dtype=F64, generator=g) * 4).to(dtype) for s in shapes]


# name: (component shapes, ragged dims, the batched call, the dense call on a sample)
CASES = {
    "(n, 6) -> (2n, 3)": ([(2, 6), (0, 6), (4, 6)], (1,), lambda t: t.reshape(t.shape[0], -1, 3), lambda s: s.reshape(-1, 3)),
    "view (n, 6) -> (2n, 3)": ([(2, 6), (0, 6), (4, 6)], (1,), lambda t: t.view(t.shape[0], -1, 3), lambda s: s.view(-1, 3)),
    "(n, 6) -> (3n/2, 4)": ([(2, 6), (0, 6), (4, 6)], (1,), lambda t: t.reshape(3, -1, 4), lambda s: s.reshape(-1, 4)),
    "(n, 2, 3) -> (3n, 2)": ([(1, 2, 3), (0, 2, 3), (3, 2, 3)], (1,), lambda t: t.reshape(3, -1, 2), lambda s: s.reshape(-1, 2)),
    "(2, n, 6) -> (2, 2n, 3)": ([(2, 1, 6), (2, 0, 6), (2, 3, 6)], (2,), lambda t: t.reshape(3, 2, -1, 3),
                                lambda s: s.reshape(2, -1, 3)),
    "(n, 6) -> (3, 2n)": ([(2, 6), (0, 6), (4, 6)], (1,), lambda t: t.reshape(3, 3, -1), lambda s: s.reshape(3, -1)),
    "(2, n, 6) -> (4n, 3)": ([(2, 1, 6), (2, 0, 6), (2, 3, 6)], (2,), lambda t: t.reshape(3, -1, 3),
                             lambda s: s.reshape(-1, 3)),
    "(2, n, 6) -> (4, n, 3)": ([(2, 1, 6), (2, 0, 6), (2, 3, 6)], (2,), lambda t: t.reshape(3, 4, -1, 3),
                               lambda s: s.reshape(4, -1, 3)),
    "(3, n, 4) transposed -> (2n, 6)": ([(2, 3, 4), (0, 3, 4), (2, 3, 4)], (1,),
                                        lambda t: t.transpose(1, 2).reshape(3, -1, 6),
                                        lambda s: s.transpose(0, 1).reshape(-1, 6)),
    "(n, m) -> (2, nm/2)": ([(2, 4), (3, 2), (0, 5)], (1, 2), lambda t: t.reshape(3, 2, -1), lambda s: s.reshape(2, -1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.int64])
@pytest.mark.parametrize("name", CASES)
def test_regrouping_reshape_per_sample(name, dtype):
    shapes, ragged, fn, ref = CASES[name]
    tol = 1e-5 if dtype == torch.float32 else 1e-7
    out = per_sample_check(fn, R(_comps(shapes, dtype), ragged), ref=ref, new_ragged=True, rtol=tol, atol=tol)
    assert out.dtype == dtype and len(out.ragged_dims) == 1


def test_regrouping_views_share_the_packed_values():
    """The ``-1`` at the last ragged dim with the sizes before it kept is a view of the packed
    values (writes reach the input); the forms that reorder elements are copies, refused by
    ``view`` with the spelling that works."""
    x = mj.nested_tensor(_comps([(2, 6), (0, 6), (4, 6)]))
    y = x.view(3, -1, 3)
    y.mul_(2)
    assert torch.equal(y.values(), x.values().view(-1, 3)) and y.values().data_ptr() == x.values().data_ptr()
    with pytest.raises(StructureError, match=r"view\(\): cannot view \(3, j\d+, 6\) as \(3, 3, -1\).*use \.reshape"):
        x.view(3, 3, -1)
    lead = mj.nested_tensor(_comps([(2, 1, 6), (2, 3, 6)]), ragged_dims=(2,))  # stored (rows, 2, 6)
    with pytest.raises(RuntimeError, match=r"view\(\): cannot view .*use \.reshape"):
        lead.view(2, 2, -1, 3)
    z = mj.nested_tensor(_comps([(2, 4), (3, 2)]))
    with pytest.raises(StructureError, match=r"view\(\): cannot view \(2, j\d+, j\d+\) as \(2, 2, -1\).*use \.reshape"):
        z.view(2, 2, -1)


def test_regrouping_reshape_errors_and_the_empty_batch():
    """A sample whose elements the static sizes do not divide raises dense torch's error, naming
    the sample; sizes that are no regrouping (no ``-1``) keep their own error; B = 0 takes the
    shape dense torch infers for empty samples."""
    x = mj.nested_tensor(_comps([(2, 6), (1, 6)]))
    with pytest.raises(RuntimeError, match=r"reshape\(\): sample 1 of \(2, j\d+\) has 6 elements .* not a multiple of 4"):
        x.reshape(2, -1, 4)  # (each sample's elements in a row, then split)
    with pytest.raises(RuntimeError, match=r"view\(\): sample 1 of .* not a multiple of 4"):
        x.view(2, -1, 4)
    with pytest.raises(RuntimeError, match=r"reshape\(\): cannot reshape sample 1 of \(2, j\d+, 6\) to \(4, -1\): .*invalid"):
        x.reshape(2, 4, -1)
    with pytest.raises(StructureError, match=r"reshape\(\): cannot reshape"):
        x.reshape(2, 4, 3)
    empty = mj.from_packed(torch.zeros(0, 6), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64))
    for size, ragged, static in (((0, -1, 3), (1,), 2), ((0, 3, -1), (2,), 1)):
        out = empty.reshape(size)
        assert out.shape[0] == 0 and out.ragged_dims == ragged and out.shape[static] == 3 and out.dtype == empty.dtype


def test_a_regrouping_copy_refuses_in_place_writes():
    """Dense ``reshape`` of a contiguous sample is a view, so a write into our per-sample copy
    would be lost: it raises instead (``view`` keeps refusing such a regrouping); the view-like
    regrouping stays a view and writes through."""
    x = mj.nested_tensor([torch.zeros(3, 2, 4), torch.zeros(3, 1, 4)], ragged_dims=(2,))  # (B, 3, j0, 4)
    y = x.reshape(2, -1, 6)
    with pytest.raises(NotImplementedError, match="regrouping elements across a ragged dim"):
        y.add_(1)
    torch.testing.assert_close(y.contiguous().add_(1).unbind()[0], torch.ones(4, 6))  # a deliberate copy
    t = mj.nested_tensor([torch.zeros(2, 6), torch.zeros(1, 6)])
    v = t.reshape(2, -1, 3)
    v.add_(1)
    assert all(bool((s == 1).all()) for s in t.unbind())


@pytest.mark.parametrize("layout", ["static_before", "pair"])
def test_reshape_to_one_dim_per_sample(layout):
    """``reshape(B, -1)`` flattens each sample, whatever its ragged dims' places: values and
    gradients as dense on each sample, with a zero-length sample."""
    if layout == "static_before":
        comps = [torch.randn(3, n, 4, dtype=torch.float64) for n in (2, 0, 4)]
        rd = (2,)
    else:
        comps = [torch.randn(n, n, 2, dtype=torch.float64) for n in (2, 0, 3)]
        rd = (1, 2)
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves, ragged_dims=rd)
    y = x.reshape(3, -1)
    cot = [torch.randn(c.numel(), dtype=torch.float64) for c in comps]
    got = torch.autograd.grad([(a * g).sum() for a, g in zip(y.unbind(), cot)], leaves)
    for a, c, g, gc in zip(y.unbind(), comps, got, cot):
        torch.testing.assert_close(a, c.reshape(-1))
        torch.testing.assert_close(g, gc.reshape(c.shape))
