"""Shape, batch-dim and metadata parity with ``torch.jagged``: ``view`` / ``reshape``
with ``-1`` for the batch or a ragged dim, ``Tensor.to_padded_tensor``, ``narrow`` / ``chunk`` /
``split`` on the batch dim, ``torch.nested.narrow(..., layout=multi_jagged)``,
``nested_tensor_from_jagged``, ``is_nested``, and strides / contiguity as ``torch.jagged`` reports
them. Each is compared with what ``torch.jagged`` does on the same input and with the per-sample
reference (zero-length samples, gradients, ``no_grad`` / ``inference_mode``)."""

import re

import pytest
import torch
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged import StructureError

from _reference import R, assert_close, few, normalize_nested_ints, per_sample_check, seeds
from _structures import comps_for, lengths

FEW = few(8)
MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _seq(ns, c=4, seed=0, **kw):
    return comps_for([(n, c) for n in ns], seed, **kw)


# ----------------------------------------------------------------------------- view / reshape with -1
# (component shape for the ragged dims given as n, logical size with -1, dense reference on a component)
VIEW_CASES = {
    "seq view(-1,-1,4)": ((1,), lambda n: (n, 4), lambda t: t.view(-1, -1, 4), lambda c: c),
    "seq view(-1,-1,2,2)": ((1,), lambda n: (n, 4), lambda t: t.view(-1, -1, 2, 2), lambda c: c.reshape(c.shape[0], 2, 2)),
    "seq reshape(B,-1,4)": ((1,), lambda n: (n, 4), lambda t: t.reshape(t.shape[0], -1, 4), lambda c: c),
    "seq reshape(-1,j,-1)": ((1,), lambda n: (n, 4), lambda t: t.reshape(-1, t.shape[1], -1), lambda c: c),
    "seq view(-1,-1,-1)": ((1,), lambda n: (n, 4), lambda t: t.view(-1, -1, -1), lambda c: c),
    "seq reshape(-1,-1,2,-1)": ((1,), lambda n: (n, 4), lambda t: t.reshape(-1, -1, 2, -1), lambda c: c.reshape(c.shape[0], 2, 2)),
    "square view(-1,-1,-1,2,2)": ((1, 2), lambda n: (n, n, 4), lambda t: t.view(-1, -1, -1, 2, 2),
                                  lambda c: c.reshape(*c.shape[:2], 2, 2)),
    "square view(B,j,-1,4)": ((1, 2), lambda n: (n, n, 4), lambda t: t.view(t.shape[0], t.shape[1], -1, 4), lambda c: c),
    "static_lead view(-1,6,-1,4)": ((3,), lambda n: (2, 3, n, 4), lambda t: t.view(-1, 6, -1, 4),
                                    lambda c: c.reshape(6, c.shape[2], 4)),
    "static_lead reshape(-1,-1,-1,2,2) (-1 static then ragged)": (
        (2,), lambda n: (6, n, 4), lambda t: t.reshape(-1, -1, -1, 2, 2), lambda c: c.reshape(6, c.shape[1], 2, 2)),
    "mid view(-1,-1,-1,-1,1)": ((1, 3), lambda n: (n, 2, n + 1, 3), lambda t: t.view(-1, -1, -1, -1, 3),
                                lambda c: c),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(VIEW_CASES))
def test_view_reshape_minus_one_for_batch_and_ragged_dims(case, mode):
    ragged, shape, fn, ref = VIEW_CASES[case]

    @FEW
    @given(lengths(min_batch=1), seeds)
    def check(ns, seed):
        comps = comps_for([shape(n) for n in ns], seed)
        with MODES[mode]():
            out = per_sample_check(fn, R(comps, ragged), ref=ref, seed=seed, grad=mode == "grad")
        x = mj.nested_tensor(comps, ragged_dims=ragged)
        y = fn(x)
        for d in y.ragged_dims:  # the ragged dims keep their nested ints
            assert any(y.shape[d] is x.shape[r] or y.shape[d] == x.shape[r] for r in x.ragged_dims)
        assert out.shape[0] == len(ns)

    check()


# the same sizes on torch.jagged and on ours: both give the same shape, or both raise RuntimeError
NJT_SIZES = [(-1, -1, 4), (3, -1, 4), (-1, -1, 2, 2), (-1, -1, -1), (3, -1, 2, -1), (2, -1, 4), (3, 3, 4),
             (3, -1, 5), (-1, -1, 8)]
# beyond torch.jagged (which raises): flattening the batch dim into the rows gives the samples'
# elements concatenated (NOTE [ Flattening the batch dim ], test_flatten_batch.py)
FLAT_SIZES = {(-1, 4): (8, 4), (-1,): (32,), (-1, 2, 2): (8, 2, 2)}


@pytest.mark.parametrize("op", ["view", "reshape"])
@pytest.mark.parametrize("size", NJT_SIZES, ids=str)
def test_view_sizes_match_torch_jagged(op, size):
    comps = _seq([3, 0, 5])
    njt = torch.nested.nested_tensor(comps, layout=torch.jagged)
    ours = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    results = []
    for t in (njt, ours):
        try:
            results.append(str(tuple(getattr(t, op)(size).shape)))
        except RuntimeError:
            results.append("RuntimeError")
    assert normalize_nested_ints(results[0]) == normalize_nested_ints(results[1])


@pytest.mark.parametrize("op", ["view", "reshape"])
@pytest.mark.parametrize("size", list(FLAT_SIZES), ids=str)
def test_view_sizes_that_flatten_the_batch_dim_where_torch_jagged_raises(op, size):
    comps = _seq([3, 0, 5])
    with pytest.raises(RuntimeError):
        getattr(torch.nested.nested_tensor(comps, layout=torch.jagged), op)(size)
    out = getattr(torch.nested.nested_tensor(comps, layout=mj.multi_jagged), op)(size)
    assert not isinstance(out, mj.MultiJaggedTensor) and tuple(out.shape) == FLAT_SIZES[size]
    assert torch.equal(out, torch.cat(comps).view(size))


def test_view_errors_name_the_size():
    x = mj.nested_tensor(_seq([3, 0, 5]))
    with pytest.raises(StructureError, match=r"^view\(\).*dim 1 must be the ragged size j\d+ or -1, got 3"):
        x.view(3, 3, 4)
    with pytest.raises(StructureError, match=r"^reshape\(\).*dim 0 must be the batch size 3 or -1, got 2"):
        x.reshape(2, -1, 4)
    with pytest.raises(StructureError, match=r"^view\(\).*size -1 at dim 2 cannot be inferred.*4 elements"):
        x.view(-1, -1, -1, 3)
    with pytest.raises(StructureError, match=r"^view\(\).*only one dimension can be inferred"):
        x.view(-1, x.shape[1], -1, -1)
    with pytest.raises(StructureError, match=r"^view\(\).*regroup between ragged dims.*\(5,\) at dims \(2,\)"):
        x.view(-1, x.shape[1], 5)
    # a -1 there regroups each sample's elements across the ragged dim, as dense (regroup.py): 3 · 4 into rows of 5
    with pytest.raises(RuntimeError, match=r"^view\(\): sample 0 of .* 12 elements .* not a multiple of 5"):
        x.view(-1, -1, 5)
    other = mj.nested_tensor(_seq([1, 1, 1]))
    with pytest.raises(StructureError, match=r"^view\(\).*size j\d+ at dim 1 is not a ragged size"):
        x.view(3, other.shape[1], 4)
    # (B, 1, j0, C): the -1s could place j0 at dim 1 or 2 → ambiguous, and the error says what to do
    y = mj.nested_tensor(comps_for([(1, n, 2) for n in (2, 0, 1)], 0), ragged_dims=(2,))
    assert y.view(-1, -1, -1, 2).shape[2] == y.shape[2]  # the ragged dim's own place wins
    z = mj.nested_tensor(comps_for([(n, 1, 1) for n in (2, 0, 1)], 0), ragged_dims=(1,))
    assert z.view(-1, -1, 1, -1).shape[1] == z.shape[1]
    with pytest.raises(StructureError, match=r"ambiguous.*dims \[\(2,\), \(3,\)\]"):
        z.view(-1, 1, -1, -1)  # j0 at dim 2 or at dim 3


def test_view_minus_one_compiles():
    x = mj.nested_tensor(_seq([3, 0, 5]), requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(t):
        return t.view(-1, -1, 2, 2).reshape(-1, -1, 4) * 2

    out = f(x)
    (g,) = torch.autograd.grad(out.values().sum(), x)
    for o, c in zip(out.unbind(), x.unbind()):
        assert_close(o, c.detach() * 2)
    assert_close(g.values(), torch.full_like(x.values(), 2.0))


# ----------------------------------------------------------------------------- Tensor.to_padded_tensor
@pytest.mark.parametrize("mode", list(MODES))
def test_to_padded_tensor_method_matches_torch_nested(mode):
    comps = _seq([3, 0, 5], dtype=torch.float64)
    njt = torch.nested.nested_tensor(comps, layout=torch.jagged)
    x = mj.nested_tensor(comps, requires_grad=mode == "grad")
    with MODES[mode]():
        out = x.to_padded_tensor(-1.0)
        assert_close(out, njt.to_padded_tensor(-1.0))
        assert_close(out, torch.nested.to_padded_tensor(x, -1.0))
        assert_close(x.to_padded_tensor(0.0, output_size=(3, 6, 4)), njt.to_padded_tensor(0.0, output_size=(3, 6, 4)))
    if mode == "grad":
        w = torch.randn(out.shape, dtype=out.dtype)
        (g,) = torch.autograd.grad((out * w).sum(), x)
        for gi, wi, c in zip(g.unbind(), w, comps):
            assert_close(gi, wi[: c.shape[0]])


# ----------------------------------------------------------------------------- batch dim: narrow / chunk / split
def _check_pieces(pieces, comps, bounds, ragged, square=False):
    """Each piece holds samples ``start .. start + length`` of ``comps`` with their shapes."""
    assert len(pieces) == len(bounds)
    for p, (s, n) in zip(pieces, bounds):
        assert isinstance(p, mj.MultiJaggedTensor) and p.shape[0] == n and p.ragged_dims == ragged
        for a, b in zip(p.unbind(), comps[s : s + n]):
            assert_close(a, b)
        if square:
            assert p.shape[1] == p.shape[2]  # a square pair stays square (one nested int)


BATCH_SPLITS = {
    "chunk(2)": (lambda t: t.chunk(2, 0), lambda b: torch.empty(b).chunk(2)),
    "chunk(5)": (lambda t: torch.chunk(t, 5, dim=0), lambda b: torch.empty(b).chunk(5)),
    "split(2)": (lambda t: t.split(2, 0), lambda b: torch.empty(b).split(2)),
    "split(1)": (lambda t: torch.split(t, 1), lambda b: torch.empty(b).split(1)),
    "split_with_sizes": (lambda t: t.split_with_sizes([1, t.shape[0] - 1], 0), lambda b: torch.empty(b).split_with_sizes([1, b - 1])),
    "split([..])": (lambda t: t.split([t.shape[0] - 1, 1]), lambda b: torch.empty(b).split([b - 1, 1])),
    "tensor_split": (lambda t: torch.tensor_split(t, [1, 1], 0), lambda b: torch.empty(b).tensor_split([1, 1])),
    "vsplit": (lambda t: torch.vsplit(t, [1]), lambda b: torch.empty(b, 1).vsplit([1])),
    "narrow(0,1,2)": (lambda t: (t.narrow(0, 1, 2),), lambda b: (torch.empty(b).narrow(0, 1, 2),)),
    "narrow(0,-2,1)": (lambda t: (torch.narrow(t, 0, -2, 1),), lambda b: (torch.empty(b).narrow(0, -2, 1),)),
}
LAYOUTS = {"seq": ((1,), lambda n: (n, 3)), "square": ((1, 2), lambda n: (n, n, 2)),
           "static_lead": ((2,), lambda n: (2, n, 3)), "rect": ((1, 2), lambda n: (n, n + 1, 2))}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("split", list(BATCH_SPLITS))
def test_split_family_and_narrow_on_the_batch_dim(split, layout, mode):
    fn, dense = BATCH_SPLITS[split]
    ragged, shape = LAYOUTS[layout]

    @FEW
    @given(lengths(min_batch=3, max_batch=5), seeds)
    def check(ns, seed):
        comps = comps_for([shape(n) for n in ns], seed)
        bounds = [(p.storage_offset(), p.shape[0]) for p in dense(len(ns))]
        leaves = [c.clone().requires_grad_(mode == "grad") for c in comps]
        with MODES[mode]():
            x = mj.as_nested_tensor(leaves, ragged_dims=ragged)
            pieces = fn(x)
        _check_pieces(pieces, comps, bounds, ragged, square=layout == "square")
        if mode != "grad":
            return
        # gradients: Σ over pieces of (piece · w) against the same weights on the listed samples
        g = torch.Generator().manual_seed(seed)
        loss, want = 0, [torch.zeros_like(c) for c in comps]
        for p, (s, n) in zip(pieces, bounds):
            w = torch.randn(p.values().shape, generator=g, dtype=p.dtype)
            loss = loss + (p.values() * w).sum()
            rows = w.movedim(ragged[0] - 1, 0) if len(ragged) == 1 else w  # values(): torch.jagged's layout
            wp = mj.from_packed(rows, p.offsets(), p.sizes(), ragged).unbind()
            for i, wi in enumerate(wp):
                want[s + i] = want[s + i] + wi
        got = torch.autograd.grad(loss, leaves, allow_unused=True)
        for gi, wi in zip(got, want):
            assert_close(torch.zeros_like(wi) if gi is None else gi, wi)

    check()


def test_batch_pieces_are_views_with_new_nested_ints():
    x = mj.nested_tensor(_seq([3, 0, 5, 2]))
    a, b = x.chunk(2)
    assert a.values().data_ptr() == x.values().data_ptr()
    assert b.values().data_ptr() == x.values()[3:].data_ptr()
    assert a.shape[1] != x.shape[1]  # new nested ints, as torch.jagged's chunk gives
    njt = torch.nested.nested_tensor(_seq([3, 0, 5, 2]), layout=torch.jagged)
    for ours, theirs in zip(x.chunk(2), njt.chunk(2, 0)):  # torch.jagged supports chunk on dim 0
        assert len(ours.unbind()) == len(theirs.unbind())
        for o, t in zip(ours.unbind(), theirs.unbind()):
            assert_close(o, t)


def test_batch_dim_edge_cases_follow_dense_torch():
    x = mj.nested_tensor(_seq([3, 0, 5]))
    with pytest.raises((RuntimeError, IndexError)):
        x.narrow(0, 2, 2)  # out of range: dense narrow's error
    with pytest.raises(RuntimeError, match=r"^narrow\(\).*sample 1"):
        x.narrow(1, 0, 1)  # the ragged dim, per sample: sample 1 is empty, as dense narrow raises
    assert x.narrow(0, 1, 0).shape[0] == 0 and x.narrow(0, 1, 0).unbind() == ()
    empty = mj.from_packed(torch.zeros(0, 4), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64))
    pieces = empty.chunk(2)  # B = 0: as many empty pieces as dense chunk gives
    assert len(pieces) == len(torch.empty(0).chunk(2)) and all(p.shape[0] == 0 for p in pieces)
    assert [p.shape[0] for p in x.chunk(5)] == [t.shape[0] for t in torch.empty(3).chunk(5)]


# ----------------------------------------------------------------------------- torch.nested.narrow from padded
@pytest.mark.parametrize("mode", list(MODES))
def test_torch_nested_narrow_matches_torch_jagged_and_per_sample(mode):
    g = torch.Generator().manual_seed(0)
    padded = torch.randn(4, 6, 3, generator=g, dtype=torch.float64)
    start, length = torch.tensor([0, 2, 1, 6]), torch.tensor([3, 0, 5, 0])
    njt = torch.nested.narrow(padded, 1, start, length, layout=torch.jagged)
    leaf = padded.clone().requires_grad_(mode == "grad")
    with MODES[mode]():
        x = torch.nested.narrow(leaf, 1, start, length, layout=mj.multi_jagged)
    assert isinstance(x, mj.MultiJaggedTensor) and x.shape[0] == 4
    for i, (o, t) in enumerate(zip(x.unbind(), njt.unbind())):
        assert_close(o, t)
        assert_close(o, padded[i, start[i] : start[i] + length[i]])
    if mode == "grad":
        w = torch.randn(x.values().shape, generator=g, dtype=torch.float64)
        (got,) = torch.autograd.grad((x.values() * w).sum(), leaf)
        want = torch.zeros_like(padded)
        for i, wi in enumerate(mj.from_packed(w, x.offsets(), x.sizes()).unbind()):
            want[i, start[i] : start[i] + length[i]] += wi
        assert_close(got, want)


def test_narrow_from_padded_int_bounds_other_dims_and_errors():
    padded = torch.randn(3, 2, 5)
    x = mj.narrow(padded, 2, 1, 3)  # ints, and a ragged dim other than 1 (torch.jagged: dim=1 only)
    assert x.ragged_dims == (2,)
    for i, o in enumerate(x.unbind()):
        assert_close(o, padded[i, :, 1:4])
    njt = torch.nested.narrow(padded, 1, 0, 2, layout=torch.jagged)
    ours = torch.nested.narrow(padded, 1, 0, 2, layout=mj.multi_jagged)
    for o, t in zip(ours.unbind(), njt.unbind()):
        assert_close(o, t)
    with pytest.raises(ValueError, match=r"^narrow\(\).*start \+ length <= 5"):
        mj.narrow(padded, 2, torch.tensor([0, 1, 3]), 3)
    with pytest.raises(ValueError, match=r"^narrow\(\).*dim in \[1, 2\]"):
        mj.narrow(padded, 0, 0, 1)
    assert torch.nested.narrow(padded, 0, 0, 1).layout == torch.strided  # other layouts untouched


# ----------------------------------------------------------------------------- nested_tensor_from_jagged
def test_nested_tensor_from_jagged_zero_copy_shares_the_nested_int():
    values = torch.randn(10, 4, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 10])
    njt = torch.nested.nested_tensor_from_jagged(values, offsets)
    x = mj.nested_tensor_from_jagged(values, offsets)
    assert x.values().data_ptr() == values.data_ptr()
    assert x.shape == njt.shape  # keyed on the same offsets: the same j
    for o, t in zip(x.unbind(), njt.unbind()):
        assert_close(o, t)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["lengths (holes)", "jagged_dim=2", "int32 offsets"])
def test_nested_tensor_from_jagged_matches_torch_jagged(kind, mode):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(10, 4, generator=g, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 10])
    kw, values = {}, base
    if kind == "lengths (holes)":
        kw["lengths"] = torch.tensor([2, 0, 4])
    elif kind == "jagged_dim=2":
        values, kw["jagged_dim"] = base.t(), 2
    else:
        offsets = offsets.to(torch.int32)
    njt = torch.nested.nested_tensor_from_jagged(values, offsets, **kw)
    leaf = values.clone().requires_grad_(mode == "grad")
    with MODES[mode]():
        x = mj.nested_tensor_from_jagged(leaf, offsets, **kw)
    assert normalize_nested_ints(str(tuple(x.shape))) == normalize_nested_ints(str(tuple(njt.shape)))
    for o, t in zip(x.unbind(), njt.unbind()):
        assert_close(o, t)
    if mode == "grad":
        njt_leaf = values.clone().requires_grad_()
        njt2 = torch.nested.nested_tensor_from_jagged(njt_leaf, offsets, **kw)
        ws = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c in njt.unbind()]
        (got,) = torch.autograd.grad(sum((c * w).sum() for c, w in zip(x.unbind(), ws)), leaf)
        (want,) = torch.autograd.grad(sum((c * w).sum() for c, w in zip(njt2.unbind(), ws)), njt_leaf)
        assert_close(got, want)


def test_nested_tensor_from_jagged_with_lengths_alone():
    """``nested_tensor_from_jagged(values, lengths=…)`` without offsets, as torch.nested takes it:
    the samples one after another, a view of the values (as torch.jagged's), an empty one too;
    neither offsets nor lengths raises torch's error."""
    v = torch.arange(8.0).view(4, 2)
    lengths = torch.tensor([1, 0, 3])
    x = mj.nested_tensor_from_jagged(v, lengths=lengths)
    ref = torch.nested.nested_tensor_from_jagged(v, lengths=lengths)
    assert [a.tolist() for a in x.unbind()] == [a.tolist() for a in ref.unbind()]
    assert x.values().data_ptr() == v.data_ptr()
    with pytest.raises(RuntimeError, match="At least one of offsets or lengths"):
        mj.nested_tensor_from_jagged(v)


def test_nested_tensor_from_jagged_errors():
    with pytest.raises(ValueError, match=r"^nested_tensor_from_jagged\(\).*within the 4 rows"):
        mj.nested_tensor_from_jagged(torch.randn(4, 2), torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match=r"^nested_tensor_from_jagged\(\).*jagged_dim"):
        mj.nested_tensor_from_jagged(torch.randn(4, 2), torch.tensor([0, 4]), jagged_dim=3)


# ----------------------------------------------------------------------------- is_nested
def test_is_nested_predicate_for_both_layouts():
    comps = _seq([2, 0])
    x = mj.nested_tensor(comps)
    assert mj.is_nested(x) and mj.is_nested(torch.nested.nested_tensor(comps, layout=torch.jagged))
    assert not mj.is_nested(torch.ones(2)) and not mj.is_nested([1])
    # x.is_nested stays False: True would make torch.compile refuse the input ("strided
    # NestedTensor") and autograd treat it as a C++ nested tensor (docs/design.md)
    assert x.is_nested is False


# ----------------------------------------------------------------------------- strides and contiguity
def _heads(t):
    return t.unflatten(-1, (2, 2)).transpose(1, 2)  # (B, j0, 4) → (B, 2, j0, 2)


CONTIG_CASES = {
    "x": lambda t: t,
    "transpose(1,2)": lambda t: t.transpose(1, 2),
    "transpose(1,2).contiguous()": lambda t: t.transpose(1, 2).contiguous(),
    "transpose(1,2).contiguous().transpose(1,2)": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    "heads": _heads,
    "heads.contiguous()": lambda t: _heads(t).contiguous(),
    "heads.contiguous().transpose(1,2)": lambda t: _heads(t).contiguous().transpose(1, 2),
    "x[..., 1:3]": lambda t: t[..., 1:3],
    "unsqueeze(-1)": lambda t: t.unsqueeze(-1),
}


@pytest.mark.parametrize("case", list(CONTIG_CASES))
def test_strides_and_contiguity_match_torch_jagged(case):
    fn = CONTIG_CASES[case]
    comps = _seq([3, 0, 5], dtype=torch.float64)
    njt = fn(torch.nested.nested_tensor(comps, layout=torch.jagged))
    ours = fn(mj.nested_tensor(comps))
    assert ours.is_contiguous() == njt.is_contiguous()
    norm = [normalize_nested_ints(str(t.stride())) for t in (njt, ours)]
    # T (the packed rows) appears in strides of contiguous non-leading layouts: 8 on both sides
    assert norm[0] == norm[1]
    for o, t in zip(ours.unbind(), njt.unbind()):
        assert_close(o, t)


def test_contiguous_values_and_gradients_per_sample():
    @FEW
    @given(lengths(min_batch=1), seeds)
    def check(ns, seed):
        comps = comps_for([(n, 4) for n in ns], seed)
        out = per_sample_check(lambda t: _heads(t).contiguous() * 2, R(comps, (1,)),
                               ref=lambda c: c.unflatten(-1, (2, 2)).transpose(0, 1).contiguous() * 2, seed=seed)
        assert out.is_contiguous()
        # downstream ops on the non-row-major values: back to (B, j0, 4) through reshape
        per_sample_check(lambda t: _heads(t).contiguous().transpose(1, 2).reshape(-1, -1, 4), R(comps, (1,)),
                         ref=lambda c: c, seed=seed)

    check()


def test_contiguity_under_compile():
    x = mj.nested_tensor(_seq([3, 0, 5]), requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(t):
        h = _heads(t)
        flag = h.is_contiguous()
        return (h.contiguous() * 2).transpose(1, 2).reshape(-1, -1, 4), flag

    out, flag = f(x)
    assert flag is False or flag == False  # noqa: E712 — as torch.jagged: a transpose is not contiguous
    (g,) = torch.autograd.grad(out.values().sum(), x)
    for o, c in zip(out.unbind(), x.unbind()):
        assert_close(o, c.detach() * 2)
    assert_close(g.values(), torch.full_like(x.values(), 2.0))


def test_multi_ragged_contiguity_is_defined_and_contiguous_holds():
    """Several ragged dims (no torch.jagged counterpart): ``contiguous()`` always gives a tensor
    that reports contiguous, with the same components."""
    comps = comps_for([(2, n, n, 3) for n in (2, 0, 3)], 0)
    x = mj.nested_tensor(comps, ragged_dims=(2, 3))
    assert not x.is_contiguous()  # the static dim 1 leads the ragged dims, as torch.jagged would store it
    y = x.contiguous()
    assert y.is_contiguous() and not re.search(r"j\d+\*j", str(y.stride()))
    for a, b in zip(y.unbind(), comps):
        assert_close(a, b)


STATIC_SPLITS = {
    **{f"chunk({k})": (lambda t, d, k=k: t.chunk(k, d)) for k in (1, 2, 3, 4, 8)},
    **{f"split({s})": (lambda t, d, s=s: t.split(s, d)) for s in (1, 2, 3, 7, 10)},
    "split_with_sizes": lambda t, d: t.split_with_sizes([2, 0, 5], d),
    "tensor_split(3)": lambda t, d: t.tensor_split(3, d),
    "unflatten(-1)": lambda t, d: (t.unflatten(d, (-1, 7)),),
    "unflatten(7, -1)": lambda t, d: (t.unflatten(d, (7, -1)),),
    "unflatten(1, 7)": lambda t, d: (t.unflatten(d, (1, 7)),),
}


@pytest.mark.parametrize("name", list(STATIC_SPLITS))
@pytest.mark.parametrize("where", ["last", "middle"])
def test_static_dim_split_family_per_sample(name, where):
    # pieces of an uneven static dim (7 elements) equal dense torch's per sample, gradients too
    f = STATIC_SPLITS[name]
    g = torch.Generator().manual_seed(3)
    shapes = [(n, 7, 2) if where == "middle" else (n, 2, 7) for n in (3, 0, 2)]
    comps = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]
    x = mj.as_nested_tensor(comps)
    d = 2 if where == "middle" else 3
    pieces = f(x, d)
    dense = [f(c, d - 1) for c in comps]
    assert len(pieces) == len(dense[0])
    for k, p in enumerate(pieces):
        for i, q in enumerate(p.unbind()):
            assert_close(q, dense[i][k], f"{name} piece {k} sample {i}")
    w = [torch.randn(q.shape, generator=g, dtype=torch.float64) for q in pieces[-1].unbind()]
    loss = sum((q * wi).sum() for q, wi in zip(pieces[-1].unbind(), w))
    ref = sum((dense[i][-1] * wi).sum() for i, wi in enumerate(w))
    for got, want in zip(torch.autograd.grad(loss, comps), torch.autograd.grad(ref, comps)):
        assert_close(got, want, f"{name} gradient")
