"""``torch.searchsorted`` with per-sample boundaries (ops/elementwise/pointwise.py): each sample's
values searched among its own boundaries as the dense op searches them — values of another
extent or dense, ties, inf, NaN boundaries (aten's own bisection), ``sorter=``, one value for
every sample, ``out_int32`` — and in one compiled graph."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.ops.elementwise import pointwise


@pytest.fixture(params=["per sample", "bisection"])
def path(request, monkeypatch):
    """Both eager forms: the dense op on each sample (small batches) and every row's bisection at
    once (large ones)."""
    monkeypatch.setattr(pointwise, "SEARCH_PER_SAMPLE_UP_TO", 1 << 30 if request.param == "per sample" else -1)
    return request.param


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_searchsorted_with_per_sample_boundaries(right, dtype, path):
    """Each sample's values searched among its own sorted boundaries (a multi_jagged ``(B, j0)``),
    values multi_jagged of another extent or dense ``(B, M)``; ties, values past the end, an empty
    boundary list, and for floats ``inf``."""
    g = torch.Generator().manual_seed(0)
    bounds = [torch.tensor([1, 3, 3, 7]), torch.zeros(0, dtype=torch.int64), torch.tensor([2, 5])]
    values = [torch.tensor([0, 3, 7, 8, 3]), torch.tensor([4, 9]), torch.tensor([5, 1, 9])]  # 9: past every boundary
    bounds = [b.to(dtype) for b in bounds]
    values = [v.to(dtype) for v in values]
    if dtype.is_floating_point:
        values[0][-1] = float("inf")
    s = torch.nested.nested_tensor(bounds, layout=mj.multi_jagged)
    v = torch.nested.nested_tensor(values, layout=mj.multi_jagged)
    out = torch.searchsorted(s, v, right=right)
    for o, b, x in zip(out.unbind(), bounds, values):
        assert torch.equal(o, torch.searchsorted(b, x, right=right))
    dense = torch.randint(0, 9, (3, 4), generator=g).to(dtype)
    got = torch.searchsorted(s, dense, right=right)
    for i, b in enumerate(bounds):
        assert torch.equal(got[i], torch.searchsorted(b, dense[i], right=right))
    with pytest.raises(ValueError, match="same batch"):
        torch.searchsorted(s, torch.zeros(2, 3, dtype=dtype))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_nan_boundaries_stay_in_their_sample(right, path):
    """A sample whose last boundaries are NaN (sorted last, as torch.sort puts them) leaves the
    other samples' searches alone: each sample's values as dense searches them, and changing one
    sample's boundaries changes no other sample's result."""
    nan = float("nan")
    bounds = [torch.tensor([nan, nan]), torch.tensor([0.0]), torch.tensor([1.0, nan]), torch.zeros(0)]
    values = [torch.tensor([0.0, nan]), torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([0.5, 3.0, nan]), torch.tensor([1.0])]
    out = torch.searchsorted(mj.as_nested_tensor(bounds), mj.as_nested_tensor(values), right=right)
    for o, b, x in zip(out.unbind(), bounds, values):
        assert torch.equal(o, torch.searchsorted(b, x, right=right))
    calm = torch.searchsorted(mj.as_nested_tensor([torch.tensor([5.0, 6.0])] + bounds[1:]), mj.as_nested_tensor(values),
                              right=right)
    for a, b in list(zip(out.unbind(), calm.unbind()))[1:]:
        assert torch.equal(a, b)
    # a NaN inside a sample's boundaries: dense's own probes decide, whatever the other samples' lengths
    mid = torch.tensor([0.0, 1.0, nan, 2.0])
    queries = torch.tensor([-1.0, 0.5, 1.5, 5.0, nan])
    for other in (torch.arange(3.0), torch.arange(9.0)):
        got = torch.searchsorted(mj.as_nested_tensor([mid, other]), mj.as_nested_tensor([queries, other]), right=right)
        assert torch.equal(got.unbind()[0], torch.searchsorted(mid, queries, right=right))


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_with_a_per_sample_sorter_and_one_value(side, path):
    """``sorter=`` of the boundaries' structure (each sample's ``argsort``) and one number searched
    in every sample (a dense ``(B,)`` of dense's 0-d answers), as dense per sample; ``out_int32``."""
    g = torch.Generator().manual_seed(1)
    bounds = [torch.randint(0, 9, (n,), generator=g).double() for n in (5, 0, 3, 1)]
    values = [torch.randint(-1, 10, (m,), generator=g).double() for m in (4, 2, 0, 3)]
    order = [b.argsort() for b in bounds]
    b, v, s = (mj.as_nested_tensor(t) for t in (bounds, values, order))
    out = torch.searchsorted(b, v, side=side, sorter=s, out_int32=True)
    for o, bi, vi, si in zip(out.unbind(), bounds, values, order):
        assert torch.equal(o, torch.searchsorted(bi, vi, side=side, sorter=si, out_int32=True))
    sorted_b = mj.as_nested_tensor([t.sort().values for t in bounds])
    one = torch.searchsorted(sorted_b, 4.0, side=side)
    assert one.shape == (4,)
    for o, bi in zip(one, bounds):
        assert torch.equal(o, torch.searchsorted(bi.sort().values, 4.0, side=side))
    with pytest.raises(ValueError, match="sorter"):
        torch.searchsorted(b, v, sorter=mj.as_nested_tensor([t[:1] for t in order]))


def test_searchsorted_with_per_sample_boundaries_compiles_into_one_graph():
    s = torch.nested.nested_tensor([torch.tensor([1.0, 3.0, 7.0]), torch.tensor([2.0])], layout=mj.multi_jagged)
    v = torch.nested.nested_tensor([torch.tensor([0.0, 4.0, 9.0]), torch.tensor([5.0, 1.0])], layout=mj.multi_jagged)
    torch._dynamo.reset()
    out = torch.compile(lambda a, b: torch.searchsorted(a, b), backend="aot_eager", fullgraph=True)(s, v)
    assert [t.tolist() for t in out.unbind()] == [[0, 2, 3], [1, 0]]


@pytest.mark.parametrize("right", [False, True])
def test_bucketize_with_per_sample_boundaries(right, path):
    """``torch.bucketize(values, boundaries)`` with per-sample boundaries: each sample's values by
    its own boundaries, as dense ``bucketize`` of the sample (ties, an empty boundary list, values
    multi_jagged or dense ``(B, M)``), ``out_int32``."""
    bounds = [torch.tensor([1.0, 3.0, 5.0]), torch.tensor([2.0]), torch.zeros(0)]
    values = [torch.tensor([0.0, 3.0, 6.0, 5.0]), torch.tensor([2.0, 3.0]), torch.tensor([1.0])]
    b, v = mj.nested_tensor(bounds), mj.nested_tensor(values)
    out = torch.bucketize(v, b, right=right, out_int32=True)
    for o, x, bd in zip(out.unbind(), values, bounds):
        assert torch.equal(o, torch.bucketize(x, bd, right=right, out_int32=True))
    dense = torch.tensor([[1.0, 4.0], [2.0, 0.0], [7.0, 1.0]])
    got = torch.bucketize(dense, b, right=right)
    for i, bd in enumerate(bounds):
        assert torch.equal(got[i], torch.bucketize(dense[i], bd, right=right))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_with_boundaries_per_position(right):
    """NeRF's inverse-CDF sampling over rays: boundaries ``(B, j0, K)`` (a sorted CDF per position)
    and values ``(B, j0, M)`` of the same structure, each row searched among its own boundaries as
    dense's N-d form does per sample; with a sorter, int32 output; other structures raise."""
    g = torch.Generator().manual_seed(0)
    n = (3, 0, 5)
    raw = [torch.rand(k, 4, generator=g) for k in n]
    us = [torch.cat([torch.rand(k, 2, generator=g), r[:, 1:2]], 1) for k, r in zip(n, raw)]  # a tie per row
    cdf, u = mj.nested_tensor([c.sort(-1)[0] for c in raw]), mj.nested_tensor(us)
    out = torch.searchsorted(cdf, u, right=right)
    for o, c, v in zip(out.unbind(), cdf.unbind(), us):
        assert torch.equal(o, torch.searchsorted(c, v, right=right))
    sorter = mj.nested_tensor([c.argsort(-1) for c in raw])
    out = torch.searchsorted(mj.nested_tensor(raw), u, right=right, sorter=sorter, out_int32=True)
    for o, c, s, v in zip(out.unbind(), raw, sorter.unbind(), us):
        assert torch.equal(o, torch.searchsorted(c, v, right=right, sorter=s, out_int32=True))
    with pytest.raises(mj.StructureError, match="per-position"):
        torch.searchsorted(cdf, mj.nested_tensor([torch.rand(k, 3) for k in (1, 2, 3)]))


@pytest.mark.parametrize("kw", [{}, {"right": True}, {"side": "right"}, {"out_int32": True}])
def test_dense_boundaries_per_sample(kw):
    """Dense ``(B, K)`` boundaries (dense's N-d form: row b for sample b's values) with multi_jagged
    values ``(B, j0)`` and ``(B, j0, C)``, a ``sorter`` of the boundaries' shape too; it raised."""
    g = torch.Generator().manual_seed(0)
    bins = torch.randn(3, 4, generator=g).sort(-1).values
    for vals in ([torch.randn(n, generator=g) for n in (2, 0, 5)], [torch.randn(n, 3, generator=g) for n in (2, 0, 5)]):
        got = torch.searchsorted(bins, mj.nested_tensor(vals), **kw)
        for i, a in enumerate(got.unbind()):
            assert torch.equal(a, torch.searchsorted(bins[i], vals[i], **kw))
    unsorted = torch.randn(3, 4, generator=g)
    order = unsorted.argsort(-1)
    vals = [torch.randn(n, generator=g) for n in (2, 0, 5)]
    got = torch.searchsorted(unsorted, mj.nested_tensor(vals), sorter=order, **kw)
    for i, a in enumerate(got.unbind()):
        assert torch.equal(a, torch.searchsorted(unsorted[i], vals[i], sorter=order[i], **kw))


def test_dense_boundaries_with_no_rows_and_side_checks():
    bins = torch.tensor([[0.0, 1.0, 2.0], [0.5, 1.5, 2.5]])
    empty = mj.nested_tensor([torch.zeros(0), torch.zeros(0)])
    assert [t.shape for t in torch.searchsorted(bins, empty).unbind()] == [(0,), (0,)]
    assert torch.searchsorted(bins[:0], mj.nested_tensor([torch.rand(3), torch.rand(2)])[0:0]).shape[0] == 0
    v = mj.nested_tensor([torch.tensor([1.0]), torch.tensor([1.5, 2.0])])
    with pytest.raises(RuntimeError, match="side can only be 'left' or 'right'"):
        torch.searchsorted(bins, v, side="bogus")
    with pytest.raises(RuntimeError, match="can't be set to opposites"):
        torch.searchsorted(bins, v, right=True, side="left")
