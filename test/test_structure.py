"""structure.py: partitions and their derived maps (NOTE [ Derived maps ]) — each map computed
once per partition and shared by every tensor and op that has the partition; maps checked
against the per-sample definition, with a zero-length sample."""

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import torch_multijagged as mj
from torch_multijagged import structure
from torch_multijagged.structure import partition_for, register_partition

LENGTHS = [2, 0, 3]  # a zero-length sample in the middle
C = 2


def _singles(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, C, generator=g) for n in LENGTHS]
    return comps, mj.nested_tensor(comps, requires_grad=requires_grad)


def test_derived_computes_once_per_key_and_is_shared_by_tensors_of_one_partition():
    _, x = _singles()
    calls = []

    def compute(p):
        calls.append(p)
        return torch.arange(p.rows)

    first = x._partition.derived(("test", "rows"), compute)
    y = x * 2 + 1  # keeps the structure: the same partition object
    assert y._partition is x._partition
    again = y._partition.derived(("test", "rows"), compute)
    assert again is first and calls == [x._partition]
    other = x._partition.derived(("test", "other key"), compute)
    assert other is not first and len(calls) == 2


def test_derived_with_an_unhashable_key_computes_without_caching():
    # the tracing case (a key holding symbolic sizes cannot be hashed), imitated with a list
    _, x = _singles()
    calls = []
    for _ in range(2):
        x._partition.derived(("test", [1]), lambda p: calls.append(1) or torch.zeros(1))
    assert len(calls) == 2


def test_two_broadcasts_on_one_structure_build_the_row_map_once(monkeypatch):
    """x.unsqueeze(-2) ∘ x.unsqueeze(-3) twice: one pair partition, one row map per side (the
    formula runs once each), and the same map object for the second op."""
    comps, x = _singles()
    real, calls = structure._row_map_by_segments, []

    def counting(p, keep, sub):
        calls.append(keep)
        return real(p, keep, sub)

    monkeypatch.setattr(structure, "_row_map_by_segments", counting)
    monkeypatch.setattr(structure.ref, "row_map", None)  # the traced form: not the eager one's
    a = x.unsqueeze(-2) + x.unsqueeze(-3)
    maps = {keep: a._partition.map_to_sub(keep)[0] for keep in [(0,), (1,)]}
    b = x.unsqueeze(-2) * x.unsqueeze(-3)
    assert b._partition is a._partition
    assert all(b._partition.map_to_sub(keep)[0] is m for keep, m in maps.items())
    assert sorted(calls) == [(0,), (1,)]
    # the maps against their definition: pair cell (i, r, c) reads singles row o_i + r (keep the
    # row dim) or o_i + c (keep the column dim)
    o = [0, 2, 2]
    rows = [o[i] + r for i, n in enumerate(LENGTHS) for r in range(n) for _ in range(n)]
    cols = [o[i] + c for i, n in enumerate(LENGTHS) for _ in range(n) for c in range(n)]
    assert maps[(0,)].tolist() == rows and maps[(1,)].tolist() == cols
    for ai, bi, ci in zip(a.unbind(), b.unbind(), comps):
        torch.testing.assert_close(ai, ci[:, None] + ci[None, :])
        torch.testing.assert_close(bi, ci[:, None] * ci[None, :])
    # reducing a pair dim returns the singles' own partition (note_sub), hence their nested int
    assert a.sum(-2)._partition is x._partition and a.sum(-2).shape[1] == x.shape[1]


def test_reduction_reuses_the_map_of_an_earlier_reduction(monkeypatch):
    comps, x = _singles(requires_grad=True)
    pair = x.unsqueeze(-2) * x.unsqueeze(-3)
    calls = []
    for name, mod in (("row_map", structure.ref), ("_row_map_by_segments", structure)):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, **k: calls.append(a) or real(*a, **k))
    s1 = pair.sum(-2)
    s2 = pair.mean(-2)
    (s1.sum() + s2.sum()).backward()  # backward gathers with the same map
    assert calls == []  # built by the broadcast, before the patch: never rebuilt
    for si, mi, ci in zip(s1.unbind(), s2.unbind(), comps):
        full = ci[:, None] * ci[None, :]
        torch.testing.assert_close(si, full.sum(0))
        if ci.shape[0]:
            torch.testing.assert_close(mi, full.mean(0))
        else:
            assert mi.shape == (0, C)


def test_segments_cached_and_per_sample():
    """Partition.segments: for a pair, every row of every sample is one segment of n_i rows."""
    _, x = _singles()
    pair = x.unsqueeze(-2) + x.unsqueeze(-3)
    p = pair._partition
    cu, sample = p.segments()
    assert p.segments()[0] is cu
    assert cu.tolist() == [0, 2, 4, 7, 10, 13]  # rows of sample 0: 2 each; sample 1: none; sample 2: 3 each
    assert sample.tolist() == [0, 0, 2, 2, 2]
    assert pair.cu_seqlens().tolist() == cu.tolist()
    assert x.cu_seqlens().tolist() == [0, 2, 2, 5]


def test_row_coords_and_device_sizes_cached():
    _, x = _singles()
    pair = x.unsqueeze(-2) + x.unsqueeze(-3)
    p = pair._partition
    sample, coords = p.row_coords()
    assert p.row_coords()[1] is coords and p.device_sizes() is p.device_sizes()
    want = [(i, r, c) for i, n in enumerate(LENGTHS) for r in range(n) for c in range(n)]
    assert [(s, *rc) for s, rc in zip(sample.tolist(), coords.tolist())] == want
    assert p.device_sizes().tolist() == [[n, n] for n in LENGTHS]


def test_reorder_rows_cached_and_a_transpose():
    g = torch.Generator().manual_seed(1)
    comps = [torch.randn(a, b, generator=g) for a, b in [(2, 3), (0, 2), (1, 0), (2, 1)]]
    x = mj.nested_tensor(comps, ragged_dims=(1, 2))
    index, out = x._partition.reorder_rows((1, 0))
    assert x._partition.reorder_rows((1, 0))[0] is index
    t = x.transpose(1, 2)
    assert t._partition is out
    for ti, ci in zip(t.unbind(), comps):
        torch.testing.assert_close(ti, ci.t())


def test_partition_for_is_canonical_and_constructors_register_theirs():
    _, x = _singles()
    (e,) = x._partition.extents
    assert partition_for([e]) is x._partition  # registered by the constructor
    pair = partition_for([e, e])
    assert partition_for((e, e)) is pair and pair.rows == sum(n * n for n in LENGTHS)
    fresh = structure.Partition.from_extents([e, e])
    assert register_partition(fresh) is fresh and partition_for([e, e]) is fresh


@pytest.mark.parametrize("output_size", [None, [3, 4, 5]], ids=["envelope", "output_size"])
def test_padded_positions_computed_once_per_envelope(monkeypatch, output_size):
    """to_padded_tensor twice with one envelope: the row → padded-cell map (``("padded_pos",
    maxes)``) is built once; the values against the per-sample definition."""
    g = torch.Generator().manual_seed(2)
    comps = [torch.randn(a, b, generator=g) for a, b in [(2, 3), (0, 2), (1, 0)]]
    x = mj.nested_tensor(comps, ragged_dims=(1, 2))
    real, calls = structure.ref.row_coords, []
    monkeypatch.setattr(structure.ref, "row_coords", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = torch.nested.to_padded_tensor(x, -1.0, output_size)
    second = torch.nested.to_padded_tensor(x, 0.0, output_size)
    assert len(calls) == 1
    keys = [k for k in x._partition.cache if isinstance(k, tuple) and k[0] == "padded_pos"]
    assert len(keys) == 1
    shape = (3, 2, 3) if output_size is None else tuple(output_size)
    for out, fill in ((first, -1.0), (second, 0.0)):
        want = torch.full(shape, fill)
        for i, c in enumerate(comps):
            want[i, : c.shape[0], : c.shape[1]] = c
        torch.testing.assert_close(out, want)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.integers(2, 3).flatmap(
        lambda r: st.lists(st.lists(st.integers(0, 3), min_size=r, max_size=r), min_size=0, max_size=5)
    ),
    share=st.booleans(),
)
def test_eager_row_maps_equal_the_reference_formula(sizes, share):
    """``map_to_sub``'s eager form (spread over the segments of the last ragged dim) against
    ``ref.row_map`` (the traced form, itself checked against enumeration in test_index_maps.py),
    for every increasing ``keep``; zero-size extents and shared extents (a square pair) included."""
    r = 3 if not sizes else len(sizes[0])
    if share:  # the last two dims with one extent, as a pair built from singles
        sizes = [s[:-1] + [s[-2]] for s in sizes]
    host = torch.tensor(sizes, dtype=torch.int64).reshape(len(sizes), r)
    p = structure.partition_from_sizes(host, torch.device("cpu"))
    for k in range(1, r):
        for keep in itertools.combinations(range(r), k):
            index, sub = p.map_to_sub(keep)
            want = structure.ref.row_map(p.offsets, p.device_sizes(), p.rows, keep, sub.offsets)
            assert torch.equal(index, want), (sizes, keep)


@pytest.mark.parametrize("b", [0, 1, 64, 65, 300])
def test_extent_carriers_size_sum_max_and_square_sum(b):
    # small batches size the carriers from Python ints, large ones with reductions: both agree
    lengths = torch.randint(0, 9, (b,), generator=torch.Generator().manual_seed(b))
    e = structure.RaggedExtent.from_lengths(lengths, torch.device("cpu"))
    ns = lengths.tolist()
    assert e.sum_carrier.shape[0] == sum(ns)
    assert e.max_carrier.shape[0] == max(ns, default=0)
    assert e.sq_carrier.shape[0] == sum(n * n for n in ns)
    assert torch.equal(e.offsets, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]))


def test_extent_of_names_the_extent_of_an_eager_nested_int():
    import gc

    from torch_multijagged.structure import _EXTENT_OF_NODE, extent_of

    x = torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(4, 3)], layout=mj.multi_jagged)
    assert extent_of(x.shape[1]) is x._partition.extents[0]
    assert extent_of(3) is None and extent_of(x.shape[0]) is None
    njt = torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(4, 3)], layout=torch.jagged)
    assert extent_of(njt.shape[1]) is None  # a nested int this package did not make
    import weakref

    y = torch.nested.nested_tensor([torch.rand(5, 3)], layout=mj.multi_jagged)
    key = id(y.shape[1].node)
    extent = weakref.ref(y._partition.extents[0])
    assert _EXTENT_OF_NODE.get(key) is extent()
    del y
    gc.collect()
    assert extent() is None and _EXTENT_OF_NODE.get(key) is None  # the entry goes with its extent
