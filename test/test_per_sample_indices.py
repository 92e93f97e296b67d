"""Per-sample index tensors that ``test_ragged_indexing.py``'s forms do not cover: ``gather`` /
``take_along_dim`` / ``scatter*`` along a *static* dim with an index ragged along it (DETR's class
cost), ``take_along_dim``'s broadcasting, ``x[b, idx]`` with an index of any structure (kNN
neighbours, a class cost over a static dim), ``index_add`` / ``index_copy`` / ``index_fill`` /
``index_reduce`` with a multi_jagged index (message passing as PyG writes it) and ``bincount``
per sample — against the dense op on each sample, with gradients of every input, zero-length
samples and no leakage between samples; and the expanded-index fast path of ``gather`` /
``scatter`` along a ragged dim against the same index materialised."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj

from _reference import R, RECT, RECT3_MID, SEQ, SQUARE, STATIC_LEAD, empty_batch, few, per_sample_check, seeds, structures
from _structures import bit_equal, packed_args

F64 = torch.float64


def _ints(shape, low: int, high: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(low, max(high, low + 1), tuple(shape), generator=g) if high > low else torch.zeros(shape, dtype=torch.int64)


def _distinct_along(shape, dim: int, size: int, g: torch.Generator) -> torch.Tensor:
    """Indices in ``[0, size)`` of ``shape`` whose fibres along ``dim`` hold distinct values
    (``scatter`` of duplicates keeps an unspecified one, dense too)."""
    full = list(shape)
    full[dim] = size
    order = torch.rand(full, generator=g).argsort(dim)
    return order.narrow(dim, 0, shape[dim])


# ----------------------------------------------------------------------------- along a static dim, ragged index
@st.composite
def _static_case(draw):
    """A structure, a static dim ``d`` of it, and per sample an index of the component's shape
    with its own size ``m_i`` (≤ the size there, 0 included) along ``d``."""
    s = draw(structures(draw(st.sampled_from([SEQ, STATIC_LEAD, RECT, RECT3_MID])), min_c=2, max_c=4))
    statics = [e for e in range(1, len(s.shapes.template) + 1) if e not in s.ragged_dims]
    d = draw(st.sampled_from(statics))
    ms = [draw(st.integers(0, s.shapes[i][d - 1])) for i in range(s.batch)]
    return s, d, ms, draw(seeds)


def _index_ragged_dims(s, d):
    return tuple(sorted(s.ragged_dims + (d,)))


@given(case=_static_case())
@few(20)
def test_gather_along_a_static_dim_with_an_index_ragged_along_it(case):
    """``prob.gather(2, labels (B, j0, j1))`` of ``prob (B, j0, K)``: each sample's own number of
    positions along the static dim; ``take_along_dim`` too (negative positions modulo the size)."""
    s, d, ms, seed = case
    g = torch.Generator().manual_seed(seed)
    comps = s.components(seed)
    shapes = [list(c.shape[:d - 1]) + [m] + list(c.shape[d:]) for c, m in zip(comps, ms)]
    index = [_ints(sh, 0, c.shape[d - 1], g) for sh, c in zip(shapes, comps)]
    rd = _index_ragged_dims(s, d)
    per_sample_check(lambda x, i: x.gather(d, i), R(comps, s.ragged_dims), R(index, rd),
                     ref=lambda c, i: c.gather(d - 1, i), seed=seed, new_ragged=True)  # x's nested ints, the index's along d
    wrapped = [_ints(sh, -c.shape[d - 1], 2 * c.shape[d - 1], g) for sh, c in zip(shapes, comps)]
    per_sample_check(lambda x, i: torch.take_along_dim(x, i, d), R(comps, s.ragged_dims), R(wrapped, rd),
                     ref=lambda c, i: torch.take_along_dim(c, i, d - 1), seed=seed, new_ragged=True)


@pytest.mark.parametrize("op", ["scatter", "scatter_add", "sum", "prod", "mean", "amax", "amin", "value"])
@pytest.mark.parametrize("include_self", [True, False])
@given(case=_static_case())
@few(8)
def test_scatter_along_a_static_dim_with_an_index_ragged_along_it(op, include_self, case):
    """``scatter`` / ``scatter_add`` / ``scatter_reduce`` along a static dim by an index ragged
    along it, a src of the index's shape: gradients of self and src."""
    if include_self is False and op in ("scatter", "scatter_add", "value"):
        return
    s, d, ms, seed = case
    g = torch.Generator().manual_seed(seed)
    comps = s.components(seed)
    shapes = [list(c.shape[:d - 1]) + [m] + list(c.shape[d:]) for c, m in zip(comps, ms)]
    if op in ("scatter", "value"):  # distinct positions per fibre: dense keeps an unspecified duplicate
        index = [_distinct_along(sh, d - 1, c.shape[d - 1], g) for sh, c in zip(shapes, comps)]
    else:
        index = [_ints(sh, 0, c.shape[d - 1], g) for sh, c in zip(shapes, comps)]
    srcs = [torch.rand(sh, generator=g, dtype=F64) + 0.5 for sh in shapes]
    rd = _index_ragged_dims(s, d)
    if op == "value":
        per_sample_check(lambda x, i: x.scatter(d, i, 2.5), R(comps, s.ragged_dims), R(index, rd),
                         ref=lambda c, i: c.scatter(d - 1, i, 2.5), seed=seed)
        return
    if op in ("scatter", "scatter_add"):
        fn, ref = (lambda x, i, v: getattr(x, op)(d, i, v)), (lambda c, i, v: getattr(c, op)(d - 1, i, v))
    else:
        fn = lambda x, i, v: x.scatter_reduce(d, i, v, op, include_self=include_self)  # noqa: E731
        ref = lambda c, i, v: c.scatter_reduce(d - 1, i, v, op, include_self=include_self)  # noqa: E731
    per_sample_check(fn, R(comps, s.ragged_dims), R(index, rd), R(srcs, rd), ref=ref, seed=seed)


def test_detr_class_cost_and_errors():
    """DETR's matcher: ``-prob.gather(2, labels.unsqueeze(1).expand(-1, n, -1))``, a sample without
    targets included; an index past the static size raises, naming the sample, as dense."""
    g = torch.Generator().manual_seed(0)
    probs = [torch.rand(n, 5, generator=g, dtype=F64).softmax(-1) for n in (3, 2, 4)]
    labels = [torch.tensor([4, 0]), torch.zeros(0, dtype=torch.int64), torch.tensor([1, 1, 3])]
    p, y = mj.as_nested_tensor([t.clone().requires_grad_() for t in probs]), mj.nested_tensor(labels)
    cost = -p.gather(2, y.unsqueeze(1).expand(-1, p.shape[1], -1))
    for c, pr, lab in zip(cost.unbind(), probs, labels):
        torch.testing.assert_close(c, -pr[:, lab])
    bad = mj.nested_tensor([torch.tensor([[0], [5], [1]]), torch.zeros(2, 0, dtype=torch.int64), torch.zeros(4, 1, dtype=torch.int64)],
                           ragged_dims=(1, 2))
    with pytest.raises(RuntimeError, match="out of bounds.*sample 0"):
        p.gather(2, bad)
    other = mj.nested_tensor([torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, 0, dtype=torch.int64),
                              torch.zeros(4, 1, dtype=torch.int64)], ragged_dims=(1, 2))
    with pytest.raises(mj.StructureError, match="ragged dims and static sizes"):
        p.gather(2, other)  # sample 0 has 3 rows


def test_gather_along_a_static_dim_does_not_leak():
    g = torch.Generator().manual_seed(1)
    comps = [torch.randn(n, 4, generator=g) for n in (3, 2, 4)]
    index = mj.nested_tensor([torch.randint(0, 4, (n, m), generator=g) for n, m in ((3, 2), (2, 5), (4, 1))], ragged_dims=(1, 2))
    a = mj.nested_tensor(comps).gather(2, index)
    comps[1] = comps[1] * 3 + 1
    b = mj.nested_tensor(comps).gather(2, index)
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and bit_equal(a.unbind()[2], b.unbind()[2])
    assert not torch.equal(a.unbind()[1], b.unbind()[1])


# ----------------------------------------------------------------------------- take_along_dim broadcasting
def test_take_along_dim_broadcasts_input_and_index_as_dense():
    """EdgeConv's neighbour features ``take_along_dim(f.unsqueeze(1), knn.unsqueeze(-1), 2)``: the
    input's size-1 dim against the index's ragged one (no copy of the input) and the index's
    size-1 feature dim against the input's; also a static 1 of the input against a static size of
    the index, and an index's static 1 against the input's ragged dim."""
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(n, 3, generator=g, dtype=F64) for n in (4, 0, 1, 3)]
    knn = [torch.randint(-n, max(n, 1), (n, min(n, 2)), generator=g) for n in (4, 0, 1, 3)]
    per_sample_check(lambda f, i: torch.take_along_dim(f.unsqueeze(1), i.unsqueeze(-1), dim=2), R(feats, (1,)),
                     R(knn, (1, 2)), ref=lambda f, i: torch.take_along_dim(f[None], i[..., None], 1))
    col = [torch.randn(n, 1, generator=g, dtype=F64) for n in (4, 0, 1, 3)]
    five = [torch.randint(0, max(n, 1), (m, 5), generator=g) for n, m in ((4, 2), (0, 0), (1, 3), (3, 1))]
    per_sample_check(lambda x, i: torch.take_along_dim(x, i, dim=1), R(col, (1,)), R(five, (1,)),
                     ref=lambda x, i: torch.take_along_dim(x, i, 0))
    rows = [torch.randint(0, max(n, 1), (2, 1), generator=g) for n in (4, 1, 1, 3)]
    seq = [torch.randn(n, 3, generator=g, dtype=F64) for n in (4, 1, 1, 3)]
    dense_rows = torch.stack(rows)  # (B, 2, 1): a dense index along the ragged dim, broadcast over C
    out = torch.take_along_dim(mj.nested_tensor(seq), dense_rows, dim=1)
    for o, x, i in zip(out, seq, rows):
        torch.testing.assert_close(o, torch.take_along_dim(x, i, 0))
    lens = (4, 0, 1, 3)
    sq = [torch.randn(n, n, 2, generator=g, dtype=F64) for n in lens]
    one = [torch.randint(0, max(n, 1), (1, n, 2), generator=g) for n in lens]  # a static 1 against the pair's rows
    per_sample_check(lambda x, i: torch.take_along_dim(x, i, dim=2), R(sq, (1, 2)), R(one, (2,)),
                     ref=lambda x, i: torch.take_along_dim(x, i, 1))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        torch.take_along_dim(mj.nested_tensor(seq), mj.nested_tensor([i[:, 0] for i in rows]), dim=1)


def test_take_along_dim_broadcast_does_not_leak():
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(n, 3, generator=g) for n in (4, 2, 3)]
    knn = mj.nested_tensor([torch.randint(0, n, (n, 2), generator=g) for n in (4, 2, 3)])
    a = torch.take_along_dim(mj.nested_tensor(feats).unsqueeze(1), knn.unsqueeze(-1), dim=2)
    feats[1] = feats[1] + 5
    b = torch.take_along_dim(mj.nested_tensor(feats).unsqueeze(1), knn.unsqueeze(-1), dim=2)
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and bit_equal(a.unbind()[2], b.unbind()[2])
    assert not torch.equal(a.unbind()[1], b.unbind()[1])


def test_take_along_dim_of_a_dense_table_by_ragged_indices_is_gather_per_sample():
    """``torch.take_along_dim(table, idx, 1)`` with a dense ``(B, V)`` table and multi_jagged ``(B, j)``
    indices reads each sample's row of the table, negative indices from its end, as dense per
    sample; gradients reach the table. Other shapes, and ``out=``, raise naming the op."""
    g = torch.Generator().manual_seed(3)
    table = torch.randn(3, 6, dtype=F64, generator=g, requires_grad=True)
    idx = [torch.tensor([5, 0, -1]), torch.tensor([], dtype=torch.long), torch.tensor([1, 1, 4, -6])]
    out = torch.take_along_dim(table, mj.nested_tensor(idx), 1)
    refs = [torch.take_along_dim(table[b], i, 0) for b, i in enumerate(idx)]
    for a, r in zip(out.unbind(), refs):
        assert torch.equal(a, r)
    w = [torch.randn(r.shape, dtype=F64, generator=g) for r in refs]
    got, = torch.autograd.grad(sum((a * c).sum() for a, c in zip(out.unbind(), w)), table)
    exp, = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, w)), table)
    assert torch.equal(got, exp)
    with pytest.raises(NotImplementedError, match="take_along_dim"):
        torch.take_along_dim(table[:2], mj.nested_tensor(idx), 1)
    with pytest.raises(NotImplementedError, match="out= variants"):
        torch.take_along_dim(mj.nested_tensor([torch.ones(2, 2)]), mj.nested_tensor([torch.zeros(2, 2, dtype=torch.long)]),
                             1, out=torch.empty(0))


def test_a_dense_operand_where_a_multi_jagged_one_is_read_names_the_combination():
    """A dense tensor where an op's multi_jagged form reads a multi_jagged one (``isin(dense, x)``) is
    named as the unsupported combination, not as a wrong argument type."""
    x = mj.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])])
    with pytest.raises(TypeError, match=r"isin\(\): a dense elements \(2,\) with multi_jagged operands is not supported"):
        torch.isin(torch.tensor([1, 2]), x)
    with pytest.raises(NotImplementedError, match="an index per sample"):
        mj.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]).index_select(2, x)


# ----------------------------------------------------------------------------- x[b, idx]
@st.composite
def _rows_case(draw):
    """``x`` (one of four layouts, a zero-length sample likely) and a multi_jagged index of one of
    four forms into its dim 1, values in ``[-size, size)`` (negative: from the end)."""
    form = draw(st.sampled_from(["(B, j1)", "(B, j1, k)", "(B, j1, j2)", "(B, k, j1)"]))
    lay = draw(st.sampled_from([SEQ, SQUARE, RECT, STATIC_LEAD, RECT3_MID]))
    s = draw(structures(lay, min_c=1, max_c=3))
    seed = draw(seeds)
    g = torch.Generator().manual_seed(seed)
    k = draw(st.integers(1, 3))
    index, comps = [], s.components(seed)
    for c in comps:
        n = c.shape[0]
        m, m2 = (draw(st.integers(0, 3)), draw(st.integers(0, 3))) if n else (0, 0)
        shape = {"(B, j1)": (m,), "(B, j1, k)": (m, k), "(B, j1, j2)": (m, m2), "(B, k, j1)": (k, m)}[form]
        index.append(_ints(shape, -n, n, g))
    rd = {"(B, j1)": (1,), "(B, j1, k)": (1,), "(B, j1, j2)": (1, 2), "(B, k, j1)": (2,)}[form]
    return s, comps, index, rd, seed


@given(case=_rows_case())
@few(25)
def test_rows_by_a_per_sample_index_of_any_structure(case):
    """``x[b, idx]`` per sample ``x_i[idx_i]``, ``b = arange(B)`` with as many trailing 1s as the
    index has dims after the batch (dense broadcasting's form): dim 1 ragged or static, ragged
    dims after it kept."""
    s, comps, index, rd, seed = case
    ones = (1,) * (len(rd) + (1 if len(index[0].shape) > len(rd) else 0))
    b = torch.arange(s.batch).view(-1, *ones)
    per_sample_check(lambda x, i: x[b, i], R(comps, s.ragged_dims), R(index, rd), ref=lambda c, i: c[i], seed=seed,
                     new_ragged=True)


def test_knn_neighbours_and_class_cost_by_index():
    """The report's two idioms: ``f[b, knn]`` with ``knn`` the first k of each row's ``argsort`` (a
    sample shorter than k keeps its own number), and ``prob.transpose(1, 2)[b, labels]``."""
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(n, 4, generator=g, dtype=F64) for n in (5, 1, 0, 3)]
    f = mj.as_nested_tensor([t.clone().requires_grad_() for t in feats])
    knn = torch.cdist(f, f).argsort(-1)[..., :2]
    out = f[torch.arange(4)[:, None, None], knn]
    refs = [t[torch.cdist(t, t).argsort(-1)[..., :2]] for t in feats]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    probs = [torch.rand(n, 6, generator=g, dtype=F64) for n in (3, 2, 0, 1)]
    labels = [torch.tensor([5, 0]), torch.zeros(0, dtype=torch.int64), torch.tensor([1, 2]), torch.tensor([3, 3, 3])]
    per_sample_check(lambda p, y: p.transpose(1, 2)[torch.arange(4)[:, None], y], R(probs, (1,)), R(labels, (1,)),
                     ref=lambda p, y: p.T[y], new_ragged=True)


def test_rows_by_index_errors():
    x = mj.nested_tensor([torch.randn(5, 3), torch.randn(2, 5)])  # (B, 5, j0): dim 2 stays in the result
    y = mj.nested_tensor([torch.tensor([1, 4]), torch.tensor([0])])
    with pytest.raises(RuntimeError, match="arange"):
        x[torch.tensor([[1], [0]]), y]  # another sample's rows, which hold another extent
    with pytest.raises(RuntimeError, match="out of bounds"):
        x[torch.arange(2)[:, None], mj.nested_tensor([torch.tensor([5]), torch.tensor([0])])]
    with pytest.raises(IndexError, match="one sample per sample"):
        x[torch.arange(2)[None, :], y]


def test_rows_by_index_do_not_leak():
    g = torch.Generator().manual_seed(3)
    comps = [torch.randn(n, 3, generator=g) for n in (4, 2, 3)]
    idx = mj.nested_tensor([torch.randint(0, n, (n, 2), generator=g) for n in (4, 2, 3)])
    a = mj.nested_tensor(comps)[torch.arange(3)[:, None, None], idx]
    comps[1] = comps[1] - 4
    b = mj.nested_tensor(comps)[torch.arange(3)[:, None, None], idx]
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and bit_equal(a.unbind()[2], b.unbind()[2])
    assert not torch.equal(a.unbind()[1], b.unbind()[1])


# ----------------------------------------------------------------------------- the expanded-index fast path
@pytest.mark.parametrize("op", ["gather", "take_along_dim", "scatter_add", "amax", "mean", "scatter"])
@pytest.mark.parametrize("layout", [SEQ, RECT])
def test_an_expanded_index_equals_it_materialised(op, layout):
    """Along a ragged dim an index expanded over the static dims (``dst.unsqueeze(-1).expand(-1,
    -1, C)``: the rows computed once per row) gives what the same index made contiguous gives,
    values and gradients; and it equals the dense op per sample."""
    g = torch.Generator().manual_seed(0)
    lens = [(4, 2), (0, 3), (3, 0), (2, 2)]
    xs = [torch.randn(layout.shape(n, m, 1, 3), generator=g, dtype=F64) for n, m in lens]
    d = layout.ragged_dims[-1]
    n_of = [x.shape[d - 1] for x in xs]
    edges = []
    for x, n in zip(xs, n_of):
        shape = x.shape[:d - 1] + ((min(n, 5) if op == "scatter" else 5) if n else 0,)
        edges.append(_distinct_along(shape, d - 1, n, g) if op == "scatter" else torch.randint(0, max(n, 1), shape, generator=g))
    srcs = [torch.randn(*e.shape, 3, generator=g, dtype=F64) for e in edges]
    rd = layout.ragged_dims
    calls = {
        "gather": (lambda x, i, s: x.gather(d, i), lambda c, i, s: c.gather(d - 1, i)),
        "take_along_dim": (lambda x, i, s: torch.take_along_dim(x, i, d), lambda c, i, s: torch.take_along_dim(c, i, d - 1)),
        "scatter_add": (lambda x, i, s: x.scatter_add(d, i, s), lambda c, i, s: c.scatter_add(d - 1, i, s)),
        "scatter": (lambda x, i, s: x.scatter(d, i, s), lambda c, i, s: c.scatter(d - 1, i, s)),
        "amax": (lambda x, i, s: x.scatter_reduce(d, i, s, "amax", include_self=False),
                 lambda c, i, s: c.scatter_reduce(d - 1, i, s, "amax", include_self=False)),
        "mean": (lambda x, i, s: x.scatter_reduce(d, i, s, "mean"), lambda c, i, s: c.scatter_reduce(d - 1, i, s, "mean")),
    }
    fn, ref = calls[op]
    expanded = per_sample_check(lambda x, e, s: fn(x, e.unsqueeze(-1).expand(*[-1] * e.dim(), 3), s),
                                R(xs, rd), R(edges, rd), R(srcs, rd),
                                ref=lambda c, e, s: ref(c, e.unsqueeze(-1).expand(*e.shape, 3), s),
                                new_ragged=op in ("gather", "take_along_dim"))  # x's nested ints, the index's along d
    index = mj.nested_tensor(edges, ragged_dims=rd).unsqueeze(-1).expand(*[-1] * (d + 1), 3)
    assert index.values().stride()[-1] == 0  # the fast path's form
    contiguous = mj.nested_tensor([e.unsqueeze(-1).expand(*e.shape, 3).contiguous() for e in edges], ragged_dims=rd)
    assert contiguous.values().stride()[-1] == 1
    xs_mj, src_mj = mj.nested_tensor(xs, ragged_dims=rd), mj.nested_tensor(srcs, ragged_dims=rd)
    for a, b in zip(fn(xs_mj, index, src_mj).unbind(), fn(xs_mj, contiguous, src_mj).unbind()):
        assert bit_equal(a, b)
    assert len(expanded.unbind()) == len(xs)


def test_index_rows_are_cached_per_input_structure():
    """The rows an index names are cached on its partition for the latest input structure: the
    same index into two batches of other lengths reads each batch's own rows."""
    g = torch.Generator().manual_seed(0)
    index = mj.nested_tensor([torch.randint(0, 2, (3, 2), generator=g) for _ in range(3)])
    for lens in ((2, 3, 4), (5, 2, 2), (2, 3, 4)):
        comps = [torch.randn(n, 2, generator=g) for n in lens]
        out = mj.nested_tensor(comps).gather(1, index)
        for o, c, i in zip(out.unbind(), comps, index.unbind()):
            torch.testing.assert_close(o, c.gather(0, i))


# ----------------------------------------------------------------------------- index_add & co with a per-sample index
_UPDATES = {
    "index_add": (lambda x, d, i, s: x.index_add(d, i, s), lambda c, d, i, s: c.index_add(d, i, s)),
    "index_add(alpha)": (lambda x, d, i, s: torch.index_add(x, d, i, s, alpha=-1.5),
                         lambda c, d, i, s: torch.index_add(c, d, i, s, alpha=-1.5)),
    "index_copy": (lambda x, d, i, s: x.index_copy(d, i, s), lambda c, d, i, s: c.index_copy(d, i, s)),
    "index_fill": (lambda x, d, i, s: x.index_fill(d, i, -2.0), lambda c, d, i, s: c.index_fill(d, i, -2.0)),
    "index_add_": (lambda x, d, i, s: x.clone().index_add_(d, i, s), lambda c, d, i, s: c.clone().index_add_(d, i, s)),
    "index_copy_": (lambda x, d, i, s: x.clone().index_copy_(d, i, s), lambda c, d, i, s: c.clone().index_copy_(d, i, s)),
    "index_fill_": (lambda x, d, i, s: x.clone().index_fill_(d, i, 3.0), lambda c, d, i, s: c.clone().index_fill_(d, i, 3.0)),
    **{f"index_reduce({r}, {inc})": (
        lambda x, d, i, s, r=r, inc=inc: x.index_reduce(d, i, s, r, include_self=inc),
        lambda c, d, i, s, r=r, inc=inc: c.index_reduce(d, i, s, r, include_self=inc))
       for r in ("prod", "mean", "amax", "amin") for inc in (True, False)},
    "index_reduce_": (lambda x, d, i, s: x.clone().index_reduce_(d, i, s, "amax"),
                      lambda c, d, i, s: c.clone().index_reduce_(d, i, s, "amax")),
}


@st.composite
def _update_case(draw):
    """``x`` of one of four layouts, a dim ``d`` (ragged or static), per sample a 1-d index of
    ``m_i`` positions in ``[0, n_i)`` along it (distinct for the copies) and a source of ``x``'s
    shape with ``m_i`` along ``d``; a sample with nothing to index where ``n_i = 0``."""
    s = draw(structures(draw(st.sampled_from([SEQ, SQUARE, RECT, STATIC_LEAD])), min_c=1, max_c=3))
    d = draw(st.sampled_from(range(1, len(s.shapes.template) + 1)))
    seed = draw(seeds)
    return s, d, [draw(st.integers(0, 4)) for _ in range(s.batch)], seed


@pytest.mark.parametrize("name", list(_UPDATES))
@given(case=_update_case())
@few(8)
def test_index_updates_with_a_per_sample_index(name, case):
    """``x.index_add(d, index (B, j), source)``: each sample ``x_i.index_add(d - 1, index_i,
    source_i)``, along a ragged dim or a static one; gradients of ``x`` and the source."""
    s, d, ms, seed = case
    g = torch.Generator().manual_seed(seed)
    comps = s.components(seed)
    fn, ref = _UPDATES[name]
    index, srcs = [], []
    for c, m in zip(comps, ms):
        n = c.shape[d - 1]
        m = min(m, n) if "copy" in name else (m if n else 0)
        index.append(torch.randperm(n, generator=g)[:m] if "copy" in name else _ints((m,), 0, n, g))
        shape = list(c.shape)
        shape[d - 1] = m
        srcs.append(torch.rand(shape, generator=g, dtype=F64) + 0.5)
    rd = tuple(sorted(set(s.ragged_dims) | {d}))
    per_sample_check(lambda x, i, v: fn(x, d, i, v), R(comps, s.ragged_dims), R(index, (1,)), R(srcs, rd),
                     ref=lambda c, i, v: ref(c, d - 1, i, v), seed=seed)


def test_message_passing_as_pyg_writes_it_and_errors():
    """``out.index_add(1, dst, msg)`` of a batch of graphs (PyG's ``index_add(0, dst, msg)`` per
    graph), an edgeless graph and a graph without nodes included; an index past a sample's
    nodes raises dense's exception type naming the sample; an index_fill counts negative
    positions from the sample's own end."""
    g = torch.Generator().manual_seed(0)
    nodes, edges = (3, 0, 4, 2), (5, 0, 0, 3)
    x = [torch.randn(n, 2, generator=g, dtype=F64) for n in nodes]
    dst = [torch.randint(0, max(n, 1), (e,), generator=g) for n, e in zip(nodes, edges)]
    msg = [torch.randn(e, 2, generator=g, dtype=F64) for e in edges]
    per_sample_check(lambda x, i, m: torch.zeros_like(x).index_add(1, i, m), R(x, (1,)), R(dst, (1,)), R(msg, (1,)),
                     ref=lambda c, i, m: torch.zeros_like(c).index_add(0, i, m))
    xs = mj.nested_tensor(x)
    bad = mj.nested_tensor([torch.tensor([0, 3]), torch.zeros(0, dtype=torch.int64), torch.tensor([1]), torch.tensor([0])])
    src = mj.nested_tensor([torch.ones(2, 2), torch.ones(0, 2), torch.ones(1, 2), torch.ones(1, 2)]).double()
    with pytest.raises(RuntimeError, match="sample 0"):
        xs.index_add(1, bad, src)
    with pytest.raises(IndexError, match="sample 0"):
        xs.index_copy(1, bad, src)
    with pytest.raises(IndexError, match="sample 0"):
        xs.index_reduce(1, bad, src, "amax")
    with pytest.raises(IndexError, match="sample 0"):
        xs.index_add(1, bad.to(torch.int32), src)
    with pytest.raises(RuntimeError, match="long tensor"):
        xs.index_copy(1, bad.to(torch.int32), src)
    with pytest.raises(RuntimeError, match="same scalar type"):
        xs.index_add(1, bad, src.float())
    with pytest.raises(mj.StructureError, match="index's extent"):
        xs.index_add(1, mj.nested_tensor([torch.tensor([0]), torch.zeros(0, dtype=torch.int64), torch.tensor([1]), torch.tensor([0])]), src)
    with pytest.raises(NotImplementedError, match=r"\(B, j\)"):
        xs.index_add(1, mj.nested_tensor([torch.zeros(1, 2, dtype=torch.int64)] * 4), src)
    with pytest.raises(RuntimeError, match="reduce argument"):
        xs.index_reduce(1, bad, src, "sum")
    neg = mj.nested_tensor([torch.tensor([-1]), torch.zeros(0, dtype=torch.int64), torch.tensor([-4, 1]), torch.tensor([-2])])
    per_sample_check(lambda x, i: x.index_fill(1, i, 7.0), R(x, (1,)), R(neg.unbind(), (1,)),
                     ref=lambda c, i: c.index_fill(0, i, 7.0))
    value = torch.tensor(0.5, dtype=F64, requires_grad=True)
    out = mj.nested_tensor(x).index_fill(1, neg, value)
    (out * out).sum().backward()
    want = sum((2 * 0.5 * (c.index_fill(0, i, 1.0) - c.index_fill(0, i, 0.0))).sum() for c, i in zip(x, neg.unbind()))
    torch.testing.assert_close(value.grad, want)


def test_index_add_with_a_per_sample_index_does_not_leak():
    g = torch.Generator().manual_seed(4)
    dst = mj.nested_tensor([torch.randint(0, n, (5,), generator=g) for n in (3, 2, 4)])
    msg = [torch.randn(5, 2, generator=g) for _ in range(3)]
    a = mj.nested_tensor([torch.zeros(n, 2) for n in (3, 2, 4)]).index_add(1, dst, mj.nested_tensor(msg))
    msg[1] = msg[1] + 9
    b = mj.nested_tensor([torch.zeros(n, 2) for n in (3, 2, 4)]).index_add(1, dst, mj.nested_tensor(msg))
    assert bit_equal(a.unbind()[0], b.unbind()[0]) and bit_equal(a.unbind()[2], b.unbind()[2])
    assert not torch.equal(a.unbind()[1], b.unbind()[1])


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("ragged", [True, False])
def test_index_reduce_with_a_dense_index(reduce, include_self, ragged):
    """One dense index for every sample, along the ragged dim (each sample's own positions) or a
    static one, as ``index_add`` / ``index_copy`` / ``index_fill`` take it; gradients of both."""
    g = torch.Generator().manual_seed(0)
    lens = (3, 2, 4) if ragged else (3, 0, 2)
    comps = [torch.rand(n, 3, generator=g, dtype=F64) + 0.5 for n in lens]
    index = torch.tensor([1, 0, 1])
    d = 1 if ragged else 2
    srcs = [torch.rand(*((3, 3) if ragged else (n, 3)), generator=g, dtype=F64) + 0.5 for n in lens]
    per_sample_check(lambda x, v: x.index_reduce(d, index, v, reduce, include_self=include_self),
                     R(comps, (1,)), R(srcs, (1,)) if not ragged else R(srcs, (1,)),
                     ref=lambda c, v: c.index_reduce(d - 1, index, v, reduce, include_self=include_self))


# ----------------------------------------------------------------------------- bincount
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
@pytest.mark.parametrize("minlength", [0, 3, 7])
def test_bincount_per_sample(dtype, minlength):
    """``bincount`` of a ``(B, j0)`` batch: each sample's own bins ``(B, j1)`` (an empty sample:
    ``minlength`` zeros), with weights of the input's shape in the dtypes dense gives."""
    g = torch.Generator().manual_seed(0)
    vals = [torch.randint(0, 6, (n,), generator=g).to(dtype) for n in (5, 0, 1, 8)]
    x = mj.nested_tensor(vals)
    out = torch.bincount(x, minlength=minlength)
    assert isinstance(out, mj.MultiJaggedTensor) and out.ragged_dims == (1,)
    for o, v in zip(out.unbind(), vals):
        ref = torch.bincount(v, minlength=minlength)
        assert o.dtype == ref.dtype and torch.equal(o, ref)
    for wdtype in (torch.float32, torch.float64, torch.int32):
        ws = [torch.rand(v.shape, generator=g).to(wdtype) for v in vals]
        out = x.bincount(mj.nested_tensor(ws), minlength)
        for o, v, w in zip(out.unbind(), vals, ws):
            ref = torch.bincount(v, w, minlength)
            if v.numel():  # (dense gives an empty sample int64 counts whatever the weights: a batch has one dtype)
                assert o.dtype == ref.dtype
            torch.testing.assert_close(o, ref.to(o.dtype))
        empty = mj.nested_tensor([torch.zeros(0, dtype=dtype)] * 2).bincount(mj.nested_tensor([torch.zeros(0, dtype=wdtype)] * 2))
        assert empty.dtype == torch.bincount(torch.zeros(1, dtype=dtype), torch.zeros(1, dtype=wdtype)).dtype


def test_bincount_errors_and_no_leakage():
    x = mj.nested_tensor([torch.tensor([0, 2]), torch.tensor([1])])
    with pytest.raises(RuntimeError, match="non-negative.*sample 1"):
        torch.bincount(mj.nested_tensor([torch.tensor([0, 2]), torch.tensor([-1])]))
    with pytest.raises(RuntimeError, match="values\\(\\).reshape"):
        torch.bincount(mj.nested_tensor([torch.zeros(2, 3, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64)]))
    with pytest.raises(NotImplementedError):
        torch.bincount(x.float())
    with pytest.raises(RuntimeError, match="minlength"):
        torch.bincount(x, minlength=-1)
    with pytest.raises(RuntimeError, match="weights"):
        torch.bincount(x, torch.ones(3))
    a = torch.bincount(mj.nested_tensor([torch.tensor([0, 2]), torch.tensor([1, 1]), torch.tensor([3])]))
    b = torch.bincount(mj.nested_tensor([torch.tensor([0, 2]), torch.tensor([4, 4, 0]), torch.tensor([3])]))
    assert torch.equal(a.unbind()[0], b.unbind()[0]) and torch.equal(a.unbind()[2], b.unbind()[2])


# ----------------------------------------------------------------------------- torch.compile
def test_compiled_per_sample_indices_are_one_graph():
    """Without a new extent these trace, one graph (``fullgraph=True``) over three length vectors:
    message passing with an expanded index and with a ``(B, j)`` index, kNN rows ``f[b, knn]``,
    and a gather / scatter along a static dim by an index ragged along it (sharing the input's
    nested int, as traced extents are compared by identity)."""
    def step(f, dst, knn, labels):
        e = dst.unsqueeze(-1).expand(-1, -1, f.shape[-1])
        msg = f.gather(1, e)
        out = torch.zeros_like(f).scatter_reduce(1, e, msg, "amax", include_self=False) + f.index_add(1, dst, msg)
        cost = f.gather(2, labels) + torch.zeros_like(f).scatter_add(2, labels, torch.ones_like(labels, dtype=f.dtype)).sum(2, keepdim=True)
        return out.sum() + f[torch.arange(f.shape[0])[:, None, None], knn].sum() + cost.sum()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for ns, ms in (((3, 1, 4), (2, 0, 3)), ((2, 5, 2), (1, 1, 4)), ((4, 4, 1), (3, 2, 2))):
        f = mj.nested_tensor([torch.randn(n, 3, generator=g) for n in ns])
        dst = mj.nested_tensor([torch.randint(0, n, (2 * n,), generator=g) for n in ns])
        knn = mj.nested_tensor([torch.randint(0, n, (n, 2), generator=g) for n in ns])
        lab = mj.nested_tensor([torch.randint(0, 3, (m,), generator=g) for m in ms])
        labels = f[..., :1].long() * 0 + lab.unsqueeze(1)  # (B, j0, j1): f's nested int along dim 1
        torch.testing.assert_close(compiled(f, dst, knn, labels), step(f, dst, knn, labels))
    assert counter.frame_count == 1, "new lengths at a fixed batch size must not recompile"


def test_an_empty_batch():
    """B = 0 through every new form: a batch of no samples, the dtype dense gives a sample."""
    x = empty_batch((0, 5), (1,))
    idx2 = empty_batch((0, 0), (1, 2), dtype=torch.int64)
    idx1 = empty_batch((0,), (1,), dtype=torch.int64)
    outs = [
        x.gather(2, idx2), torch.take_along_dim(x, idx2, 2), x.scatter_add(2, idx2, empty_batch((0, 0), (1, 2))),
        x[torch.arange(0)[:, None], idx1], x[torch.arange(0)[:, None, None], empty_batch((0, 2), (1,), dtype=torch.int64)],
        empty_batch((5, 0), (2,))[torch.arange(0)[:, None], idx1],
        x.index_add(1, idx1, empty_batch((0, 5), (1,))), x.index_add(2, idx1, empty_batch((0, 0), (1, 2))),
        x.index_fill(1, idx1, 2.0), x.index_reduce(1, idx1, empty_batch((0, 5), (1,)), "amax"),
        torch.take_along_dim(x.unsqueeze(1), idx2.unsqueeze(-1), 2),
    ]
    for out in outs:
        assert isinstance(out, mj.MultiJaggedTensor) and out.shape[0] == 0 and out.dtype == F64 and out.unbind() == ()
    counts = torch.bincount(idx1, empty_batch((0,), (1,), dtype=torch.float32))
    assert counts.shape[0] == 0 and counts.dtype == torch.float32


def _gradgrad(fn, *parts):
    """gradgradcheck of ``fn`` over the packed values of multi_jagged operands ``(comps,
    ragged_dims)`` (floating ones differentiated) — second order, as dense torch has it."""
    built = []
    for comps, rd in parts:
        v, off, sizes = packed_args(comps, rd)
        built.append((v.requires_grad_(v.is_floating_point()), off, sizes, rd))

    def f(*vs):
        return fn(*[mj.from_packed(v, off, sizes, rd) for v, (_, off, sizes, rd) in zip(vs, built)]).values()

    leaves = [v for v, *_ in built if v.is_floating_point()]
    return torch.autograd.gradgradcheck(_closed(f, built), leaves, fast_mode=True)


def _closed(f, built):
    def g(*floats):
        it = iter(floats)
        return f(*[next(it) if v.is_floating_point() else v for v, *_ in built])
    return g


def test_second_order():
    g = torch.Generator().manual_seed(0)
    probs = [torch.rand(n, 4, generator=g, dtype=F64) for n in (3, 0, 2)]
    labels = [torch.randint(0, 4, (n, m), generator=g) for n, m in ((3, 2), (0, 1), (2, 0))]
    assert _gradgrad(lambda p, y: p.gather(2, y) ** 2, (probs, (1,)), (labels, (1, 2)))
    srcs = [torch.rand(n, m, generator=g, dtype=F64) for n, m in ((3, 2), (0, 1), (2, 0))]
    assert _gradgrad(lambda p, y, s: p.scatter_reduce(2, y, s, "prod") ** 2, (probs, (1,)), (labels, (1, 2)), (srcs, (1, 2)))
    feats = [torch.randn(n, 3, generator=g, dtype=F64) for n in (3, 0, 2)]
    knn = [torch.randint(0, max(n, 1), (n, 2), generator=g) for n in (3, 0, 2)]
    assert _gradgrad(lambda f, k: torch.take_along_dim(f.unsqueeze(1), k.unsqueeze(-1), 2) ** 2, (feats, (1,)), (knn, (1,)))
    assert _gradgrad(lambda f, k: f[torch.arange(3)[:, None, None], k] ** 2, (feats, (1,)), (knn, (1,)))
    ys = [torch.tensor([3, 0]), torch.zeros(0, dtype=torch.int64), torch.tensor([1])]
    assert _gradgrad(lambda p, y: p.transpose(1, 2)[torch.arange(3)[:, None], y] ** 2, (probs, (1,)), (ys, (1,)))
    dst = [torch.randint(0, max(n, 1), (e,), generator=g) for n, e in ((3, 4), (0, 0), (2, 3))]
    msg = [torch.randn(e, 3, generator=g, dtype=F64) for e in (4, 0, 3)]
    assert _gradgrad(lambda x, i, m: x.index_add(1, i, m) ** 2, (feats, (1,)), (dst, (1,)), (msg, (1,)))
    assert _gradgrad(lambda x, i, m: x.index_reduce(1, i, m, "amax") ** 2, (feats, (1,)), (dst, (1,)), (msg, (1,)))
    assert _gradgrad(lambda x, i, m: x.scatter_reduce(1, i.unsqueeze(-1).expand(-1, -1, 3), m, "mean") ** 2,
                     (feats, (1,)), (dst, (1,)), (msg, (1,)))


def test_gather_with_sparse_grad_gives_the_dense_gradient():
    """``gather(..., sparse_grad=True)`` along a static dim differentiates, its gradient dense (no
    sparse multi_jagged tensor exists) with the sparse one's values; ``backward`` and
    ``autograd.grad`` alike."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(k, 4, dtype=F64, generator=g) for k in (3, 0, 5)]
    ids = [torch.randint(0, 4, (k, 2), generator=g) for k in (3, 0, 5)]
    i = mj.nested_tensor(ids)
    for entry in ("backward", "grad"):
        x = mj.nested_tensor(xs, requires_grad=True)
        y = torch.gather(x, 2, i, sparse_grad=True)
        for a, c, ii in zip(y.unbind(), xs, ids):
            assert torch.equal(a, c.gather(1, ii))
        if entry == "backward":
            (y * y).sum().backward()
            gx = x.grad
        else:
            gx, = torch.autograd.grad((y * y).sum(), x)
        for a, c, ii in zip(gx.unbind(), xs, ids):
            leaf = c.clone().requires_grad_()
            want, = torch.autograd.grad((torch.gather(leaf, 1, ii, sparse_grad=True) ** 2).sum(), leaf)
            assert torch.equal(a, want.to_dense())
