"""Basic indexing of static dims: ``x[:, :, 0]``, ``x[..., 1:3]``, ``x[:, :, None]`` (full slices over
the batch and ragged dims), against the per-sample reference, with gradients."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as tmj
from hypothesis import assume, given, settings, strategies as st

from _reference import scaled, seeds
from torch_multijagged.errors import StructureError

S = slice(None)
CASES = [
    (S, S, 0),
    (S, S, -1, slice(1, None)),
    (Ellipsis, slice(1, 3)),
    (Ellipsis, -1),
    (S, S, None),
    (S, S, 1, slice(None, None, 2)),
    (S, None, S, 2),
    (S,),
    (Ellipsis,),
]


@pytest.mark.parametrize("idx", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("lens", [(2, 0, 3), (1,)])
def test_static_indexing_matches_per_sample(idx, lens):
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, 4, generator=g, dtype=torch.float64) for n in lens]
    x = tmj.nested_tensor(comps, requires_grad=True)
    y = x[idx]
    per = [c[idx] if idx[0] is Ellipsis else c[idx[1:]] for c in comps]
    assert len(y.unbind()) == len(per)
    for a, b in zip(y.unbind(), per):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad((y.values() ** 2).sum(), x)
    cs = [c.clone().requires_grad_() for c in comps]
    tot = sum(((c[idx] if idx[0] is Ellipsis else c[idx[1:]]) ** 2).sum() for c in cs)
    refs = torch.autograd.grad(tot, cs)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)


def test_indexing_the_batch_dim_with_a_slice_is_a_sub_batch():
    x = tmj.nested_tensor([torch.randn(n, 3) for n in (2, 3)])
    y = x[0:1]
    assert y.shape[0] == 1 and torch.equal(y.unbind()[0], x.unbind()[0])


@pytest.mark.parametrize("idx", [(S, 1), (S, slice(0, 1)), (S, -1), (S, slice(None, None, 2))])
def test_indexing_a_ragged_dim_is_per_sample(idx):
    comps = [torch.randn(n, 3) for n in (2, 3)]
    x = tmj.nested_tensor(comps)
    out = x[idx]
    got = list(out.unbind()) if isinstance(out, tmj.MultiJaggedTensor) else list(out)
    for o, c in zip(got, comps):
        torch.testing.assert_close(o, c[idx[1:]])


@pytest.mark.parametrize("name", ["stop", "start", "step", "static stop", "select", "select both", "sample"])
def test_zero_dim_integer_tensors_index_as_ints(name):
    """A 0-d integer tensor as an index or a slice bound (``x[:, :n_keep]`` with ``n_keep`` computed
    as a tensor) indexes as the int it holds, per sample, as in dense indexing."""
    t = torch.tensor
    items = {"stop": (slice(None), slice(None, t(2))), "start": (slice(None), slice(t(1), None)),
             "step": (slice(None), slice(None, None, t(2))), "static stop": (slice(None), slice(None), slice(None, t(2))),
             "select": (slice(None), t(1)), "select both": (slice(None), t(-1), t(2)), "sample": t(1)}[name]
    # a zero-length sample where each sample keeps a slice (a select has no row to take there)
    comps = [torch.randn(n, 3) for n in ((3, 5, 2) if "select" in name or name == "sample" else (3, 0, 5, 2))]
    x = tmj.nested_tensor(comps)
    out = x[items]
    plain = tuple(int(i) if isinstance(i, torch.Tensor) else slice(*(None if b is None else int(b) for b in
                  (i.start, i.stop, i.step))) if isinstance(i, slice) else i for i in (items if isinstance(items, tuple) else (items,)))
    if name == "sample":
        torch.testing.assert_close(out, comps[1])
        return
    got = list(out.unbind()) if isinstance(out, tmj.MultiJaggedTensor) else list(out)
    for o, c in zip(got, comps):
        torch.testing.assert_close(o, c[plain[1:]])


def test_sample_then_dense_indexing():
    comps = [torch.randn(n, 3) for n in (2, 3)]
    x = tmj.nested_tensor(comps)
    torch.testing.assert_close(x[1, :, 2], comps[1][:, 2])
    torch.testing.assert_close(x[0, 1], comps[0][1])


@pytest.mark.parametrize("dim", [2, -1])
@pytest.mark.parametrize("lens", [(2, 0, 3), (1,)])
def test_unbind_static_dim(dim, lens):
    g = torch.Generator().manual_seed(1)
    comps = [torch.randn(n, 3, 4, generator=g, dtype=torch.float64) for n in lens]
    x = tmj.nested_tensor(comps, requires_grad=True)
    pieces = x.unbind(dim)
    cdim = dim - 1 if dim > 0 else dim
    assert len(pieces) == comps[0].shape[cdim]
    w = [float(i + 1) for i in range(len(pieces))]
    for i, p in enumerate(pieces):
        for a, c in zip(p.unbind(), comps):
            torch.testing.assert_close(a, c.unbind(cdim)[i])
    gx, = torch.autograd.grad(sum(wi * (p.values() ** 2).sum() for wi, p in zip(w, pieces)), x)
    cs = [c.clone().requires_grad_() for c in comps]
    refs = torch.autograd.grad(sum(wi * (p ** 2).sum() for c in cs for wi, p in zip(w, c.unbind(cdim))), cs)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)


def test_unbind_ragged_dim_raises():
    x = tmj.nested_tensor([torch.randn(n, 3) for n in (2, 3)])
    with pytest.raises(StructureError, match="expected a static dim"):
        x.unbind(1)


# ----------------------------------------------------------------------------- samples by index, mask or slice
def _batch_of(ns, pair=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randn(*((n, n) if pair else (n,)), 3, generator=g, dtype=torch.float64, requires_grad=True) for n in ns]
    return comps, tmj.as_nested_tensor(comps, ragged_dims=(1, 2) if pair else (1,))


@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("index", [[2, 0], [-1, 1, 1], torch.tensor([3, 0]), torch.tensor([True, False, True, True]),
                                   slice(1, None), slice(None, None, 2), slice(-2, None), slice(3, 1)],
                         ids=str)
def test_samples_selected_by_index_mask_or_slice(pair, index):
    """``x[[2, 0]]``, ``x[idx]``, ``x[mask]``, ``x[1:]``, ``x[::2]``: the samples in that order,
    a sub-batch with its own nested ints (a square pair stays square), gradients to the picked
    samples (twice to a repeated one), and ``index_select(0, …)`` alike."""
    comps, x = _batch_of((3, 0, 4, 2), pair)
    y = x[index]
    picked = list(range(4))[index] if isinstance(index, slice) else (
        torch.arange(4)[index].tolist() if isinstance(index, torch.Tensor) else [i % 4 for i in index])
    assert y.shape[0] == len(picked)
    if pair and len(picked):
        assert y.shape[1] is y.shape[2]
    for a, i in zip(y.unbind(), picked):
        torch.testing.assert_close(a, comps[i])
    if not picked:
        return
    w = [torch.randn_like(comps[i]) for i in picked]
    got = torch.autograd.grad(sum((a * t).sum() for a, t in zip(y.unbind(), w)), comps, allow_unused=True)
    want = torch.autograd.grad(sum((comps[i] * t).sum() for i, t in zip(picked, w)), comps, allow_unused=True)
    for c, a, b in zip(comps, got, want):
        torch.testing.assert_close(torch.zeros_like(c) if a is None else a, torch.zeros_like(c) if b is None else b)
    if isinstance(index, list):
        for a, b in zip(x.index_select(0, torch.tensor(index)).unbind(), y.unbind()):
            torch.testing.assert_close(a, b)


def test_reversed_gives_the_samples_in_reverse_order():
    comps, x = _batch_of((3, 0, 2))
    for out in (reversed(x), torch.flipud(x), x.flipud()):  # dense torch's flip(0)
        assert [tuple(t.shape) for t in out.unbind()] == [(2, 3), (0, 3), (3, 3)]
        for a, c in zip(out.unbind(), comps[::-1]):
            torch.testing.assert_close(a, c)
    for a, c in zip(torch.fliplr(x).unbind(), comps):  # flip(1): each sample's rows reversed
        torch.testing.assert_close(a, c.flip(0))


def test_samples_then_other_dims_and_bad_indices():
    comps, x = _batch_of((3, 1, 4))
    y = x[[2, 0], 1:, ::2]
    for a, i in zip(y.unbind(), (2, 0)):
        torch.testing.assert_close(a, comps[i][1:, ::2])
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x[[0, 3]]
    torch.testing.assert_close(x[torch.tensor(2)], comps[2])  # a 0-d index tensor: one sample, as an int
    with pytest.raises(IndexError, match="out of bounds"):
        x.index_select(0, torch.tensor([-4]))


@pytest.mark.parametrize("index", [
    (torch.tensor([True]),), ([True, False],), (torch.tensor([True, False, True, False]),),
    (Ellipsis, torch.tensor([True, False])), (slice(None), slice(None), [True, False, True, True]),
    (torch.tensor([True, False]), torch.tensor([0])), (slice(None), torch.tensor([True, False, True])),
], ids=str)
def test_a_mask_of_another_length_than_its_dim_raises(index):
    """A boolean mask must be as long as the dim it indexes, as in dense indexing (reading and
    writing); the masks of the right length select as dense torch's."""
    comps, x = _batch_of((3, 0, 5))
    with pytest.raises(IndexError, match="shape of the mask"):
        x[index]
    with pytest.raises(IndexError, match="shape of the mask"):
        x.clone()[index] = 1.0
    picked = x[torch.tensor([True, False, True])]
    assert [t.shape for t in picked.unbind()] == [comps[0].shape, comps[2].shape]
    feats = x[..., torch.tensor([True, False, True])]
    for a, c in zip(feats.unbind(), comps):
        torch.testing.assert_close(a, c[..., torch.tensor([True, False, True])])


@pytest.mark.parametrize("index", [[0, 2], [2, 0, 2], torch.tensor([1, -1]), torch.tensor([True, False, True])], ids=str)
def test_one_index_list_along_a_static_or_ragged_dim(index):
    """``x[..., [0, 2]]`` (features) and ``x[:, [0, 1]]`` (positions in every sample: a static dim
    of that many), as dense torch's single advanced index: the dim keeps its place."""
    comps, x = _batch_of((3, 4, 2))
    feats = x[..., index]
    for a, c in zip(feats.unbind(), comps):
        torch.testing.assert_close(a, c[..., index])
    pos = [0, 1] if not isinstance(index, torch.Tensor) or index.dtype == torch.bool else [1, 0]
    rows = x[:, pos]
    assert not isinstance(rows, tmj.MultiJaggedTensor) and rows.shape == (3, 2, 3)  # every dim static: dense
    for a, c in zip(rows.unbind(0), comps):
        torch.testing.assert_close(a, c[pos])
    g = torch.autograd.grad(feats.values().sum() + rows.sum(), comps)
    want = torch.autograd.grad(sum(c[..., index].sum() + c[pos].sum() for c in comps), comps)
    for a, b in zip(g, want):
        torch.testing.assert_close(a, b)
    last = x[:, [-1, 0, -2]]  # negative positions count from each sample's own end
    for a, c in zip(last.unbind(0), comps):
        torch.testing.assert_close(a, c[[-1, 0, -2]])
    got = torch.autograd.grad((last * last).sum(), comps)
    for a, b in zip(got, torch.autograd.grad(sum((c[[-1, 0, -2]] ** 2).sum() for c in comps), comps)):
        torch.testing.assert_close(a, b)
    with pytest.raises(IndexError, match="sample 2"):
        x[:, [-3]]  # sample 2 has 2 rows


@pytest.mark.parametrize("pair", [False, True])
def test_batches_joined_reversed_and_repeated(pair):
    """``torch.cat([x, y], 0)``: the samples one after another (a square pair stays square);
    ``x.flip(0)``: in reverse; ``x.repeat(2, 1, …)``: the batch twice — with gradients."""
    cx, x = _batch_of((3, 0, 2), pair, seed=1)
    cy, y = _batch_of((4, 1), pair, seed=2)
    z = torch.cat([x, y], 0)
    assert z.shape[0] == 5 and (not pair or z.shape[1] is z.shape[2])
    for a, c in zip(z.unbind(), cx + cy):
        torch.testing.assert_close(a, c)
    f = x.flip(0)
    r = x.repeat(2, *([1] * (x.dim() - 1)))
    for a, c in zip(f.unbind(), cx[::-1]):
        torch.testing.assert_close(a, c)
    for a, c in zip(r.unbind(), cx + cx):
        torch.testing.assert_close(a, c)
    loss = sum((a * a).sum() for a in z.unbind()) + f.values().sum() + r.values().pow(3).sum()
    got = torch.autograd.grad(loss, cx + cy)
    want = torch.autograd.grad(sum((c * c).sum() for c in cx + cy) + sum(c.sum() + 2 * c.pow(3).sum() for c in cx),
                               cx + cy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_joining_batches_of_other_layouts_raises():
    _, x = _batch_of((3, 1))
    _, p = _batch_of((2, 2), pair=True)
    with pytest.raises(RuntimeError, match="one layout"):
        torch.cat([x, p], 0)
    with pytest.raises(RuntimeError, match="only multi_jagged"):
        torch.cat([x, torch.randn(2, 3, 3)], 0)


@pytest.mark.parametrize("op", ["index_add", "index_copy", "index_fill"])
def test_index_updates_along_a_ragged_dim_per_sample(op):
    """``index_add`` / ``index_copy`` / ``index_fill`` along a ragged dim: positions within each
    sample, a source per sample (a dense ``(B, k, C)`` or a batch), gradients to the input and
    the source; a position past a sample's end raises naming the sample, as dense torch raises."""
    comps, x = _batch_of((4, 2, 3), seed=3)
    idx = torch.tensor([1, 0])
    src = [torch.randn(2, 3, dtype=torch.float64, requires_grad=True) for _ in comps]
    kw = {"index_add": dict(alpha=2.0)}.get(op, {})
    arg = torch.stack(src) if op != "index_fill" else -1.5
    y = getattr(x, op)(1, idx, arg, **kw)
    refs = [getattr(c, op)(0, idx, s if op != "index_fill" else -1.5, **kw) for c, s in zip(comps, src)]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    leaves = comps + (src if op != "index_fill" else [])
    got = torch.autograd.grad(sum((a * a).sum() for a in y.unbind()), leaves)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    with pytest.raises((RuntimeError, IndexError), match="sample 1"):
        getattr(x, op)(1, torch.tensor([3]), arg[:, :1] if op != "index_fill" else arg)


def test_dense_table_indexed_by_a_multi_jagged_index():
    """``table[index]`` with a multi_jagged integer index: each sample ``table[index_i]``, the
    index's structure with ``table.shape[1:]`` after it (positional embeddings from
    ``tmj.position_ids(x)``, per-class weights from labels); gradients reach the table; a
    non-integer index and an index past the table raise."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(10, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)
    x = tmj.nested_tensor([torch.randn(n, 4) for n in (3, 0, 5)])
    for index in (tmj.position_ids(x),
                  tmj.nested_tensor([torch.randint(0, 10, (n, n), generator=g) for n in (2, 0, 3)]),
                  tmj.nested_tensor([torch.randint(-10, 10, (n, 2), generator=g) for n in (4, 1)])):
        out = table[index]
        assert tmj.is_nested(out) and out.shape[len(index.shape):] == table.shape[1:]
        refs = [table[i] for i in index.unbind()]
        for a, r in zip(out.unbind(), refs):
            torch.testing.assert_close(a, r)
        cot = [torch.randn(r.shape, dtype=r.dtype, generator=g) for r in refs]
        (got,) = torch.autograd.grad(sum((a * c).sum() for a, c in zip(out.unbind(), cot)), table)
        (exp,) = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), table)
        torch.testing.assert_close(got, exp)
    assert (x + torch.randn(10, 4)[tmj.position_ids(x)]).shape == x.shape
    # basic indices after the index: the rows' own dims, as dense indexing (``table[idx, 0]``)
    pos = tmj.position_ids(x)
    for rest in ((0,), (Ellipsis,), (slice(1, 3),), (None, 1), (2, -1)):
        out = table[(pos, *rest)]
        for a, i in zip(out.unbind(), pos.unbind()):
            torch.testing.assert_close(a, table[(i, *rest)])
    with pytest.raises(IndexError, match="must hold integers"):
        table[tmj.position_ids(x).double()]
    with pytest.raises(IndexError, match="out of bounds"):
        table[tmj.nested_tensor([torch.tensor([10])])]


_ITEMS = st.one_of(
    st.just(slice(None)), st.just(None), st.just(Ellipsis), st.sampled_from([0, 1, -1, -2]),
    st.builds(slice, st.sampled_from([None, 0, 1, -1, -2]), st.sampled_from([None, 1, 2, -1]),
              st.sampled_from([None, 1, 2])),
)
_STRUCTS = {
    "seq": (lambda n: (n, 3, 2), (1,)),
    "pair": (lambda n: (n, n, 2), (1, 2)),
    "static lead": (lambda n: (2, n, 3), (2,)),
}


@settings(max_examples=scaled(60))
@given(st.sampled_from(sorted(_STRUCTS)), st.lists(_ITEMS, min_size=1, max_size=4), seeds)
def test_basic_indexing_of_the_other_dims_is_per_sample(name, items, seed):
    """Any mix of ints, slices, None and one Ellipsis after the batch dim's ':' equals dense
    indexing of each sample, including the dense indexing that follows once no ragged dim is
    left (``x[:, 0, 1]``)."""
    assume(sum(i is Ellipsis for i in items) <= 1)
    shape_of, rd = _STRUCTS[name]
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randn(*shape_of(n), dtype=torch.float64, generator=g) for n in (3, 1, 4)]
    try:
        refs = [c[tuple(items)] for c in comps]
    except IndexError:
        assume(False)  # dense refuses some sample: tested elsewhere
    out = tmj.nested_tensor(comps, ragged_dims=rd)[(slice(None), *items)]
    got = out.unbind() if tmj.is_nested(out) else list(out)
    assert len(got) == len(refs)
    for a, r in zip(got, refs):
        assert a.shape == r.shape and torch.equal(a, r)


_SET_STRUCTS = dict(_STRUCTS, image=(lambda n: (2, n, 5 - n), (2, 3)))


@settings(max_examples=scaled(60))
@given(st.sampled_from(sorted(_SET_STRUCTS)), st.lists(st.one_of(_ITEMS, st.sampled_from([[0], [1, 0]])), min_size=1, max_size=4),
       st.sampled_from(["number", "0-d", "last dim", "augmented"]), st.sampled_from([(3, 1, 4), (3, 0, 4)]),
       st.sampled_from([slice(None), slice(1, None)]), seeds)
def test_index_assignment_is_per_sample(name, items, value, lens, lead, seed):
    """``y[lead, *items] = v`` (a number, a 0-d tensor, one value per position of a static last
    dim) and ``y[lead, *items] += v`` equal dense assignment into each selected sample — along
    ragged dims per sample, one index list included — with gradients to the batch and to ``v``."""
    assume(sum(i is Ellipsis for i in items) <= 1 and sum(isinstance(i, list) for i in items) <= 1)
    # ``y[:, None] += v`` and ``y[1:, ...] += v`` write through an unsqueeze / a narrow of the
    # values first, which autograd does not connect to ``y`` (refused: test_structure_copies_splits.py)
    assume(value != "augmented" or (None not in items and lead == slice(None)))
    shape_of, rd = _SET_STRUCTS[name]
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randn(*shape_of(n), dtype=torch.float64, generator=g, requires_grad=True) for n in lens]
    idx = tuple(items)
    picked = range(len(lens))[lead]
    try:
        sel = [comps[i].detach()[idx] for i in picked]
    except IndexError:
        assume(False)  # dense refuses some sample: the batch raises too (tested below)
    # an index list past an empty sample's size: dense torch skips the bounds check on a tensor of
    # no elements, ours raises (an error where dense is lenient, never a wrong value)
    assume(not any(isinstance(i, list) for i in items) or all(s.numel() for s in sel))
    last = {s.shape[-1] for s in sel if s.dim()}
    if value == "last dim":
        # (a last dim that every sample selects empty may be a ragged one in the batch, which a
        # dense value of size 0 does not broadcast against: a clear error)
        assume(len(last) == 1 and all(s.dim() for s in sel) and 0 not in last)
        v = torch.randn(last.pop(), dtype=torch.float64, generator=g, requires_grad=True)
    else:
        v = 2.5 if value == "number" else torch.tensor(-1.5, dtype=torch.float64, requires_grad=True)

    def assign(t, index):
        t = t * 1.0
        if value == "augmented":
            t[index] += v
        else:
            t[index] = v
        return t

    out = assign(tmj.as_nested_tensor(comps, ragged_dims=rd), (lead, *items))
    refs = [assign(c, idx) if i in picked else c * 1.0 for i, c in enumerate(comps)]
    got = out.unbind()
    for a, r in zip(got, refs):
        assert a.shape == r.shape and torch.equal(a, r)
    cot = [torch.randn(r.shape, dtype=r.dtype, generator=g) for r in refs]
    wrt = comps + ([v] if isinstance(v, torch.Tensor) else [])
    g1 = torch.autograd.grad(sum((a * c).sum() for a, c in zip(got, cot)), wrt, allow_unused=True)
    g2 = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), wrt, allow_unused=True)
    for a, b, t in zip(g1, g2, wrt):  # (an empty selection leaves v unused)
        torch.testing.assert_close(torch.zeros_like(t) if a is None else a, torch.zeros_like(t) if b is None else b)


def test_index_assignment_along_ragged_dims_values_and_errors():
    """``x[:, 0] = cls`` (the first token of every sample), ``x[:, 1:] = other`` with a batch of
    the selection's sizes, the selection's shape in the mismatch error, a sample too short for
    the index as dense torch's error, and a leaf that requires grad refused as dense."""
    comps = [torch.arange(n * 3.0).view(n, 3) for n in (3, 1, 2)]
    x = tmj.nested_tensor(comps)
    cls = torch.tensor([7.0, 8.0, 9.0])
    x[:, 0] = cls
    rest = tmj.nested_tensor([-torch.ones(n - 1, 3) for n in (3, 1, 2)])
    x[:, 1:] = rest
    for a, n in zip(x.unbind(), (3, 1, 2)):
        assert torch.equal(a, torch.cat([cls[None], -torch.ones(n - 1, 3)]))
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \(2,\) cannot be broadcast"):
        x[:, 0] = torch.ones(2)
    short = tmj.nested_tensor([torch.ones(2, 3), torch.ones(0, 3)])
    with pytest.raises(IndexError, match="out of bounds"):
        short[:, 1] = 0.0
    leaf = tmj.nested_tensor(comps, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf[..., 0] = 1.0
    with torch.no_grad():
        leaf[..., 0] = 1.0  # as dense: allowed without grad mode
    assert all(torch.equal(a[..., 0], torch.ones(len(a))) for a in leaf.unbind())


# --------------------------------------------------------------------------- several index tensors
def _pairwise_cases():
    t = torch.tensor
    return [
        ("b,k", (t([0, 1, 0]), t([0, 2, 1]))),
        ("lists", ([0, 1], [2, 0])),
        ("negative", ([0, 1], [-1, -2])),
        ("b,k,c", (t([0, 1]), t([2, 4]), t([1, 3]))),
        ("b,k,slice", ([1, 0], [3, 0], slice(None, 2))),
        ("broadcast", (t([[0], [1]]), t([0, 1]))),
        ("ellipsis after", ([0, 1], [1, 1], Ellipsis)),
        ("b,:,c", ([0, 1, 1], S, [1, 3, 0])),
        ("mask,k", (t([True, True, False]), [1, 4])),
    ]


@pytest.mark.parametrize("name,index", _pairwise_cases(), ids=[c[0] for c in _pairwise_cases()])
@pytest.mark.parametrize("pair", [False, True])
def test_several_index_tensors_pair_up_as_dense(name, index, pair):
    """``x[b, k]``: the index tensors broadcast together and pair up (``x[b, k][j] =
    x[b[j]][k[j]]``), as dense indexing of the per-sample list — not a sub-batch indexed by ``k``
    (an outer product) — with gradients to every sample."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 0)]
    if pair:
        comps = [c[:, None, :] * c[None, :, :] for c in comps]
    x = tmj.nested_tensor(comps, requires_grad=True)
    leaves = [c.clone().requires_grad_() for c in comps]
    if pair and name == "broadcast":  # a 2-D grid of ragged results would need two batch dims
        with pytest.raises(NotImplementedError, match="several batch dims"):
            x[index]
        return

    def per_sample(items, cs):
        adv = [torch.as_tensor(i) if isinstance(i, (list, torch.Tensor)) else None for i in items]
        adv = [a.nonzero().flatten() if a is not None and a.dtype == torch.bool else a for a in adv]
        shape = torch.broadcast_shapes(*[a.shape for a in adv if a is not None])
        adv = [None if a is None else a.expand(shape).reshape(-1) for a in adv]
        if items[-1] is Ellipsis:
            items = items[:-1]
        parts = [cs[int(adv[0][j])][tuple(int(a[j]) if a is not None else it for a, it in zip(adv[1:], items[1:]))]
                 for j in range(adv[0].numel())]
        return parts, shape

    y = x[index]
    parts, shape = per_sample(index, leaves)
    if isinstance(y, tmj.MultiJaggedTensor):
        got = y.unbind()
        assert len(got) == len(parts)
    else:
        assert y.shape == (*shape, *parts[0].shape)
        got = y.reshape(-1, *parts[0].shape).unbind()
    for a, b in zip(got, parts):
        torch.testing.assert_close(a, b)
    w = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in parts]
    if isinstance(y, tmj.MultiJaggedTensor):
        loss = (y * tmj.nested_tensor(w)).sum()
    else:
        loss = (y.reshape(-1, *parts[0].shape) * torch.stack(w)).sum()
    gx, = torch.autograd.grad(loss, x)
    refs = torch.autograd.grad(sum((p * wi).sum() for p, wi in zip(parts, w)), leaves, allow_unused=True)
    for a, b, c in zip(gx.unbind(), refs, comps):
        torch.testing.assert_close(a, torch.zeros_like(c) if b is None else b)


@pytest.mark.parametrize("index", [
    (slice(None), [0, 1], [2, 3]), (slice(None), torch.tensor([[0, 1], [1, -1]])), (slice(None), [0, -1], [2, 3], slice(None)),
    (slice(None), [1], torch.tensor([[0], [3]])), (Ellipsis, [0, -1], [1, 2]),
    (slice(None), slice(None), torch.tensor([[0], [3]]), torch.tensor([1, -5])),
    (Ellipsis, torch.tensor([[0, 5], [3, -1]])), (slice(None), slice(None), torch.tensor([[0], [3]])),
], ids=str)
def test_index_tensors_after_the_whole_batch_pair_up_per_sample(index):
    """``x[:, a, b]`` and ``x[:, idx2d]`` (the batch whole, index tensors on adjacent dims, a ragged
    one among them: each sample's positions) and ``x[..., a, b]`` on static dims after the ragged
    one (a sample of any length, an empty one too), as dense indexing per sample; reading and
    writing, with gradients."""
    lens = (3, 2, 5) if not (index[0] is Ellipsis or isinstance(index[1], slice)) else (3, 0, 5)
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, 6, dtype=torch.float64, generator=g, requires_grad=True) for n in lens]
    x = tmj.as_nested_tensor(comps)
    per = index if index[0] is Ellipsis else index[1:]
    out = x[index]
    refs = [c[per] for c in comps]
    got = out.unbind() if isinstance(out, tmj.MultiJaggedTensor) else out.unbind(0)
    for a, r in zip(got, refs):
        torch.testing.assert_close(a, r)
    flat = out.values() if isinstance(out, tmj.MultiJaggedTensor) else out
    for a, b in zip(torch.autograd.grad((flat ** 2).sum(), comps), torch.autograd.grad(sum((r ** 2).sum() for r in refs), comps)):
        torch.testing.assert_close(a, b)
    y = x.detach().clone()
    y[index] = 7.0
    for t, c in zip(y.unbind(), comps):
        want = c.detach().clone()
        want[per] = 7.0
        torch.testing.assert_close(t, want)


def test_several_index_tensors_errors_and_round_trip():
    x = tmj.nested_tensor([torch.arange(3.), torch.arange(5.) + 10])
    with pytest.raises(IndexError, match="could not be broadcast"):
        x[[0, 1], [2, 4, 1]]
    with pytest.raises(RuntimeError, match="out of bounds"):
        x[[0, 1], [3, 4]]  # sample 0 has 3 elements
    b, k = torch.tensor([0, 1, 1]), torch.tensor([2, 4, 0])
    x[b, k] = torch.tensor([-1., -2., -3.])  # index_put: pairwise too, so a write reads back
    assert x[b, k].tolist() == [-1., -2., -3.]


# --------------------------------------------------------------------------- writes through ragged slices
def _slice_writes():
    return [
        ("slice method", lambda z: z[:, 1:].mul_(0), lambda t: t[1:].mul_(0)),
        ("view of a slice", lambda z: z[:, 1:][..., 0].zero_(), lambda t: t[1:][..., 0].zero_()),
        ("augmented on a name", lambda z: z[:, 1:].__iadd__(1), lambda t: t[1:].__iadd__(1)),
        ("augmented assignment", lambda z: z.__setitem__((S, slice(1, None)), z[:, 1:].__imul__(2)),
         lambda t: t.__setitem__(slice(1, None), t[1:].__imul__(2))),
        ("strided", lambda z: z[:, ::2].fill_(7), lambda t: t[::2].fill_(7)),
        ("negative start", lambda z: z[:, -2:].neg_(), lambda t: t[-2:].neg_()),
        ("torch function", lambda z: torch.relu_(z[:, 1:].sub_(6)), lambda t: torch.relu_(t[1:].sub_(6))),
        ("setitem into a slice", lambda z: z[:, 1:].__setitem__((S, 0), -1.), lambda t: t[1:].__setitem__(0, -1.)),
    ]


@pytest.mark.parametrize("name,ours,dense", _slice_writes(), ids=[c[0] for c in _slice_writes()])
@pytest.mark.parametrize("pair", [False, True])
def test_in_place_ops_on_a_ragged_slice_reach_the_original(name, ours, dense, pair):
    """Dense slicing gives a view, so an in-place op on ``x[:, 1:]`` (or on a view of it) changes
    ``x``; ours gathers a copy, which writes itself back (NOTE [ Slices of ragged dims write
    through ])."""
    lens = (3, 5, 2) if name == "setitem into a slice" else (3, 5, 1, 0)  # (dense raises on t[1:][0] of one row)
    comps = [torch.arange(n * 4, dtype=torch.float64).view(n, 4) for n in lens]
    if pair:
        comps = [c[:, None, :] - c[None, :, :] for c in comps]
    x = tmj.nested_tensor(comps)
    ours(x)
    for c in comps:
        dense(c)
    for a, b in zip(x.unbind(), comps):
        torch.testing.assert_close(a, b)


def test_writes_through_pair_selects_and_slices_with_gradients():
    comps = [torch.randn(n, 3, dtype=torch.float64) for n in (3, 4, 2)]
    x = tmj.nested_tensor(comps, requires_grad=True)
    leaves = [c.clone().requires_grad_() for c in comps]
    y = x.unsqueeze(1) * x.unsqueeze(2)
    y[:, 0].mul_(3)          # a pair's row: a ragged select that stays multi_jagged
    y[:, :, 1:2].zero_()
    with pytest.raises(NotImplementedError, match="narrow"):
        y.narrow(2, 1, 1).zero_()  # its dim is static where y[:, :, 1:2] reads a ragged one: refused
    ys = [c[:, None] * c[None] for c in leaves]
    for t in ys:
        t[0].mul_(3)
        t[:, 1:2].zero_()
    for a, b in zip(y.unbind(), ys):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad((y * y).sum(), x)
    refs = torch.autograd.grad(sum((t * t).sum() for t in ys), leaves)
    for a, b in zip(gx.unbind(), refs):
        torch.testing.assert_close(a, b)
    leaf = tmj.nested_tensor(comps, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        leaf[:, 1:].mul_(0)  # as dense: a view of a leaf that requires grad


def test_writes_into_windows_of_a_ragged_dim_raise():
    x = tmj.nested_tensor([torch.ones(3, 2), torch.ones(4, 2)])
    w = x.unfold(1, 2, 1)
    with pytest.raises(NotImplementedError, match="unfold"):
        w.zero_()
    w.contiguous().zero_()  # a deliberate copy is writable
    assert all(bool((t == 1).all()) for t in x.unbind())


def _sample_writes():
    return [
        ("mask", torch.tensor([True, False, True]), 3.0, [(0, S), (2, S)]),
        ("list, int", ([0, 1], 0), 5.0, [(0, 0), (1, 0)]),
        ("list, slice", ([0, 1], slice(1, None)), 5.0, [(0, slice(1, None)), (1, slice(1, None))]),
        ("list, :, int", ([2, 0], S, 0), 7.0, [(2, (S, 0)), (0, (S, 0))]),
        ("tensor, batch", torch.tensor([0, 2]), "batch", [(0, S), (2, S)]),
    ]


@pytest.mark.parametrize("name,index,value,per", _sample_writes(), ids=[c[0] for c in _sample_writes()])
def test_writes_into_samples_selected_by_index_or_mask(name, index, value, per):
    """``x[mask] = v``, ``x[[0, 1], 1:] = v``, ``x[b] = batch``: the samples the index reads, and
    what the rest of the index selects in each, written with gradients to ``x`` and ``v``."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 2)]
    leaf = tmj.nested_tensor(comps, requires_grad=True)
    x = leaf * 1
    leaves = [c.clone().requires_grad_() for c in comps]
    ds = [c * 1 for c in leaves]
    if value == "batch":
        parts = [torch.randn(comps[i].shape, generator=g, dtype=torch.float64) for i, _ in per]
        value = tmj.nested_tensor(parts)
        for (i, idx), p in zip(per, parts):
            ds[i][idx] = p
    else:
        for i, idx in per:
            ds[i][idx] = value
    x[index] = value
    for a, b in zip(x.unbind(), ds):
        torch.testing.assert_close(a, b)
    gx, = torch.autograd.grad((x * x).sum(), leaf)
    for a, b in zip(gx.unbind(), torch.autograd.grad(sum((d * d).sum() for d in ds), leaves)):
        torch.testing.assert_close(a, b)


def test_a_stale_ragged_slice_refuses_to_write_back():
    """A slice taken before its base was written does not show that write (a copy), so writing it
    back would undo it: that raises instead of silently losing the write. Writes through the same
    slice one after another, and ``x[:, 1:] *= k`` repeated, stay per sample."""
    x = tmj.nested_tensor([torch.ones(3, 2), torch.ones(4, 2)])
    t = x[:, 1:]
    t.mul_(2)
    t.add_(1)
    assert [a[:, 0].tolist() for a in x.unbind()] == [[1, 3, 3], [1, 3, 3, 3]]
    x.add_(10)
    with pytest.raises(NotImplementedError, match="take the slice again"):
        t.mul_(2)
    other = x[:, :2]
    x[:, 1:].zero_()  # writes x: an earlier slice of it is stale
    with pytest.raises(NotImplementedError, match="take the slice again"):
        other.fill_(5)
    y = tmj.nested_tensor([torch.ones(3, 2), torch.ones(4, 2)]) * 1
    y[:, 1:] *= 3
    y[:, 1:] *= 3
    assert [a[:, 0].tolist() for a in y.unbind()] == [[1, 9, 9], [1, 9, 9, 9]]


VIEWS_OF_BASE = {  # a view of x, then a slice of a ragged dim of it: dense gives a view of x
    "view": (lambda t: t.view(t.shape[0], -1, 2), lambda c: c.view(-1, 2)),
    "static select": (lambda t: t[..., 0], lambda c: c[..., 0]),
    "static slice": (lambda t: t[..., :1], lambda c: c[..., :1]),
    "narrow of a static dim": (lambda t: t.narrow(2, 0, 1), lambda c: c.narrow(1, 0, 1)),
    "unsqueeze": (lambda t: t.unsqueeze(1), lambda c: c.unsqueeze(0)),
    "transpose": (lambda t: t.transpose(1, 2), lambda c: c.transpose(0, 1)),
}


@pytest.mark.parametrize("view", VIEWS_OF_BASE, ids=str)
def test_writes_through_a_ragged_slice_of_a_view_reach_the_tensor(view):
    """``y.view(…)[:, 1:].mul_(3)``, ``y[..., 0][:, 1:].mul_(3)``: the slice is written back into the
    view it was taken from, which no one else holds — and through it into ``y``, as dense torch's
    view of a view (the write was lost)."""
    fn, ref = VIEWS_OF_BASE[view]
    comps = [torch.arange(6.0).reshape(3, 2) + 1, torch.zeros(0, 2), torch.arange(4.0).reshape(2, 2) + 1]
    y = tmj.nested_tensor(comps)
    ragged = 2 if view in ("unsqueeze", "transpose") else 1
    sl = (slice(None),) * ragged + (slice(1, None),)
    fn(y)[sl].mul_(3)
    for got, c in zip(y.unbind(), comps):
        want = c.clone()
        ref(want)[sl[1:]].mul_(3)
        torch.testing.assert_close(got, want)


def test_a_write_through_a_view_of_a_slice_no_one_holds_raises():
    """The slice is written back as a whole; once it is gone, a write through a view of it cannot
    reach the tensor: that raises instead of losing the write. Held, the same write reaches it."""
    y = tmj.nested_tensor([torch.ones(3, 4), torch.ones(2, 4)])
    with pytest.raises(NotImplementedError, match="once the slice itself is gone"):
        y[:, 1:].unflatten(-1, (2, 2))[..., 0].mul_(3)
    s = y[:, 1:]
    s.unflatten(-1, (2, 2))[..., 0].mul_(3)
    assert [a[:, 0].tolist() for a in y.unbind()] == [[1, 3, 3], [1, 3]]


def test_reading_a_slice_taken_before_its_base_was_written_raises():
    """A slice along a ragged dim is a copy: after a write into its base it does not show the
    write, where dense torch's view would — reading it then raises (its sizes still answer); taken
    again, it shows the write. Writing through the slice itself keeps it current."""
    x = tmj.nested_tensor([torch.ones(3, 2), torch.ones(0, 2), torch.ones(2, 2)])
    s = x[:, 1:]
    x.mul_(2)
    assert s.shape[0] == 3 and s.dim() == 3
    for read in (lambda t: t.sum(), lambda t: t + 1, lambda t: torch.cat([t, t], 1), lambda t: t.unbind()):
        with pytest.raises(NotImplementedError, match="take the slice again"):
            read(s)
    assert [a.sum().item() for a in x[:, 1:].unbind()] == [8.0, 0.0, 4.0]
    t = x[:, 1:]
    t.mul_(3)
    assert [a.sum().item() for a in t.unbind()] == [24.0, 0.0, 12.0]
    other = x[:, :1]
    t.add_(1)  # writes x through t: a slice taken before that is stale
    with pytest.raises(NotImplementedError, match="take the slice again"):
        other.sum()


@pytest.mark.parametrize("read", ["torch.save", "deepcopy", "values", "pickle"])
@pytest.mark.parametrize("copy_kind", ["ragged slice", "pair transpose"])
def test_a_stale_copy_refuses_to_be_saved_copied_or_read_as_values(read, copy_kind):
    """The reads that do not pass ``__torch_function__`` (``torch.save``, ``pickle``, ``deepcopy``,
    ``values()``) refuse a stale copy too, instead of handing out values that miss the write."""
    import copy
    import io
    import pickle

    x = tmj.nested_tensor([torch.ones(3, 2), torch.ones(0, 2), torch.ones(2, 2)])
    if copy_kind == "pair transpose":
        x = x.unsqueeze(2) + x.unsqueeze(1)  # (B, j, j, 2)
        s = x.transpose(1, 2)
    else:
        s = x[:, 1:]
    fresh = {"torch.save": lambda t: torch.save(t, io.BytesIO()), "deepcopy": copy.deepcopy,
             "values": lambda t: t.values(), "pickle": pickle.dumps}[read]
    fresh(s)  # before the write: fine
    x.mul_(0)
    with pytest.raises(NotImplementedError):
        fresh(s)


@pytest.mark.parametrize("batch_index", ["arange column", "permuted", "one sample (1, 1)", "one sample 0-d"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_rows_by_a_multi_jagged_index_per_sample(batch_index, dtype):
    """``x[torch.arange(B)[:, None], keep]`` (token selection with a per-sample index): sample i
    holds rows ``keep_i`` of x's sample ``b_i``, negative indices from the end, with the index's
    nested int and x's static dims; gradients of x; an index past a sample's end raises."""
    g = torch.Generator().manual_seed(0)
    leaves = [(torch.randn(n, 2, 3, generator=g, dtype=torch.float64) * 4).to(dtype) for n in (3, 0, 5)]
    if dtype.is_floating_point:
        leaves = [t.requires_grad_() for t in leaves]
    x = tmj.as_nested_tensor(leaves)
    b = {"arange column": torch.arange(3)[:, None], "permuted": torch.tensor([2, 0, 0]),
         "one sample (1, 1)": torch.tensor([[2]]), "one sample 0-d": torch.tensor(2)}[batch_index]
    keep = [torch.tensor([0, 2, -1]), torch.zeros(0, dtype=torch.int64), torch.tensor([4, 1, 1, -5])]
    if batch_index != "arange column":
        keep = [torch.tensor([4, -1]), torch.tensor([1, 0]), torch.zeros(0, dtype=torch.int64)]
    index = tmj.nested_tensor(keep)
    out = x[b, index]
    assert out.shape[1] is index.shape[1] and tuple(out.shape[2:]) == (2, 3)
    assert torch.equal(x[b, index, :, :].values(), out.values())
    refs = [leaves[int(s)][k] for s, k in zip(b.reshape(-1).expand(3), keep)]  # one batch entry broadcasts
    for o, r in zip(out.unbind(), refs):
        assert torch.equal(o, r)
    if dtype.is_floating_point:
        for leaf, a, r in zip(leaves, torch.autograd.grad(sum((o * o).sum() for o in out.unbind()), leaves, allow_unused=True),
                              torch.autograd.grad(sum((r * r).sum() for r in refs), leaves, allow_unused=True)):
            torch.testing.assert_close(torch.zeros_like(leaf) if a is None else a, torch.zeros_like(leaf) if r is None else r)
    with pytest.raises(RuntimeError, match="out of bounds"):
        x[torch.arange(3)[:, None], tmj.nested_tensor([torch.tensor([3]), torch.zeros(0, dtype=torch.int64), torch.tensor([0])])]
    with pytest.raises(IndexError, match="one sample per sample"):
        x[torch.arange(2)[:, None], index]
    for dtype in (torch.uint8, torch.int16, torch.bool):  # dense reads bytes and bools as masks
        with pytest.raises(IndexError, match="takes int64 or int32 index tensors"):
            x[torch.arange(3)[:, None], index.to(dtype)]
