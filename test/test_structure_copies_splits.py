"""Structure ops whose dense counterparts are views or edge cases: a transpose that reorders
ragged dims is a copy (in-place writes raise), the split family's piece sizes as dense torch makes
them, the per-sample diagonal of a square pair (``diagonal``, ``einsum('bii->bi')``), and errors
that name the op the user called (reshape family, unflatten) — per-sample reference with gradients."""

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import R, SEQ, assert_close, components, few, per_sample_check, seeds, structures
from _structures import comps_for, lengths

FEW = few(10)

# ----------------------------------------------------------------------------- reordered ragged dims are copies
def _static_slice(t):
    """An index that slices the last static dim of ``t`` (``t[..., :1]`` or ``t[:, :1]``)."""
    return (slice(None), slice(0, 1)) if t.ragged_dims[-1] == t.dim() - 1 else (Ellipsis, slice(0, 1))


IN_PLACE = {
    "add_": lambda t: t.add_(1.0),
    "mul_": lambda t: t.mul_(2.0),
    "fill_": lambda t: t.fill_(0.5),
    "zero_": lambda t: t.zero_(),
    "copy_": lambda t: t.copy_(t * 3),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, 7.0),
    "setitem": lambda t: t.__setitem__(_static_slice(t), 1.0),
    "iadd": lambda t: t.__iadd__(1.0),
    "view.add_": lambda t: t[_static_slice(t)].add_(1.0),  # a view of the copy shares its storage
    "detach.add_": lambda t: t.detach().add_(1.0),
}
REORDERS = {
    "transpose(1,2)": lambda p: p.transpose(1, 2),
    "permute(0,2,1,3)": lambda p: p.permute(0, 2, 1, 3),
    "mT.mT": lambda p: p.transpose(-2, -3).unsqueeze(-1).squeeze(-1),
    "diagonal": lambda p: p.diagonal(0, 1, 2),
}


@pytest.mark.parametrize("reorder", REORDERS, ids=str)
@pytest.mark.parametrize("op", IN_PLACE, ids=str)
def test_in_place_on_reordered_ragged_dims_raises(op, reorder):
    """A transpose / permute that reorders ragged dims (and a pair's diagonal) gathers rows: a copy,
    where dense torch gives a view. An in-place op on it would silently not reach the original,
    so it raises, naming the op; the original is untouched."""
    p = mj.nested_tensor(comps_for([(2, 3, 2), (0, 4, 2), (1, 1, 2)] if reorder != "diagonal" else [(2, 2, 2), (0, 0, 2), (1, 1, 2)], 0),
                         ragged_dims=(1, 2))
    before = [c.clone() for c in p.unbind()]
    t = REORDERS[reorder](p)
    assert not t.is_contiguous()
    name = {"setitem": "(copy_|fill_|index_put_)", "iadd": "add_", "view.add_": "add_", "detach.add_": "add_"}.get(op, op)
    origin = "a diagonal of ragged dims" if reorder == "diagonal" else "a transpose / permute"
    with pytest.raises(NotImplementedError, match=rf"^{name}\(\): cannot write in place .*{origin}.* copy"):
        IN_PLACE[op](t)
    for a, b in zip(p.unbind(), before):
        assert torch.equal(a, b)


def test_contiguous_of_reordered_copy_is_writable():
    """``.contiguous()`` gives an ordinary tensor, as for a dense transpose; writing to it
    leaves the original alone (it is a copy in dense torch too)."""
    comps = comps_for([(2, 3, 2), (0, 4, 2), (1, 1, 2)], 1)
    p = mj.nested_tensor(comps, ragged_dims=(1, 2))
    c = p.transpose(1, 2).contiguous()
    assert c.is_contiguous()
    c.add_(1.0).mul_(2.0)
    for got, comp in zip(c.unbind(), comps):
        assert_close(got, (comp.transpose(0, 1) + 1) * 2)
    for got, comp in zip(p.unbind(), comps):
        assert torch.equal(got, comp)
    p.transpose(1, 2).clone().zero_()  # clone: writable too


def test_in_place_on_static_transpose_reaches_original():
    """Transposes that keep the ragged dims' order are views of the values, as in dense torch."""
    comps = comps_for([(2, 3), (0, 3), (1, 3)], 2)
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    x.transpose(1, 2).mul_(2.0)  # (B, C, j0): the ragged dim moves, no other ragged dim to swap with
    for got, comp in zip(x.unbind(), comps):
        assert_close(got, comp * 2)
    p = mj.nested_tensor(comps_for([(2, 3, 2, 2), (0, 1, 2, 2)], 3), ragged_dims=(1, 2))
    before = [c.clone() for c in p.unbind()]
    p.transpose(-1, -2).add_(1.0)
    for got, b in zip(p.unbind(), before):
        assert_close(got, b + 1)


VIEWS = {  # negative dims: the same view of the batch and of a sample
    "static slice": lambda t: t[..., :2],  # the general mechanism: an autograd view of its base
    "transpose": lambda t: t.transpose(-1, -2),  # these four: the eager values path
    "permute": lambda t: t.permute(*range(t.dim() - 2), t.dim() - 1, t.dim() - 2),
    "view": lambda t: t.view(t.shape[:-1] + (2, -1)),
    "unsqueeze": lambda t: t.unsqueeze(-1),
    # a view made by a handler (an autograd view) of a values-path view: its values' version counter
    # is not the base's, so the write is recognised by the storage it writes (stamp_write)
    "view, then a static select": lambda t: t.view(t.shape[:-1] + (2, -1))[..., 0],
    "transpose, then a static slice": lambda t: t.transpose(-1, -2)[..., :1, :],
}
SCENARIOS = {  # what is written, what is used afterwards
    "write the view, use the view": lambda q, v: (v.div_(3.0), v.add_(v.detach()), v)[-1],
    "write the view, use the base": lambda q, v: (v.div_(3.0), q)[-1],
    "write the base, use the view": lambda q, v: (q.mul_(3.0), v)[-1],
    # both written, one after the other: the second write would hide the first from its gradient
    "write the base, then the view": lambda q, v: (q.mul_(3.0), v.neg_(), q)[-1],
    "write the view, then the base": lambda q, v: (v.mul_(-2.0), q.clamp_(-0.5, 0.5), q)[-1],
}


def _write_and_use(view, scenario):
    def f(x):
        q = x * 1.0  # a non-leaf base that requires grad: autograd records the writes
        return SCENARIOS[scenario](q, VIEWS[view](q)).sin()
    return f


def _per_sample_write_check(f, comps, compiled=None):
    leaves = [c.clone().requires_grad_() for c in comps]
    got = list((compiled or f)(mj.as_nested_tensor(leaves)).unbind())
    refs = [f(c) for c in leaves]
    for a, r in zip(got, refs):
        assert_close(a, r)
    g1 = torch.autograd.grad(sum((a ** 2).sum() for a in got), leaves)
    g2 = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves)
    for a, b in zip(g1, g2):
        assert_close(a, b)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
@pytest.mark.parametrize("view", VIEWS, ids=str)
@pytest.mark.parametrize("layout", ["(B, j0, C)", "(B, j0, j0, C)"])
def test_in_place_through_views_with_autograd_recording(layout, view, scenario):
    """An in-place write through a view reaches the base and a write into the base reaches the
    view, values and gradients as in dense torch, per sample — or, where autograd does not
    connect the two (a view made on the eager values path, NOTE [ Writes into shared values ] in
    writes.py), using the other one afterwards raises instead of returning a gradient that misses
    the write. Writing through such a view and using only the view is differentiated."""
    shapes = [(4, 6), (1, 6), (3, 6)] if layout == "(B, j0, C)" else [(4, 4, 6), (1, 1, 6), (3, 3, 6)]
    f = _write_and_use(view, scenario)
    if view != "static slice" and scenario != "write the view, use the view":
        with pytest.raises(NotImplementedError, match="written in place through another tensor that shares them"):
            _per_sample_write_check(f, comps_for(shapes, 4))
        return
    _per_sample_write_check(f, comps_for(shapes, 4))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_in_place_through_a_channel_slice_of_images_with_autograd_recording(scenario):
    """``out[:, :C] += shortcut`` (GhostNet's residual into a concatenation) on images
    ``(B, C, j0, j1)``: autograd's bookkeeping of the write multiplies the view's two ragged sizes
    (their product is the nested int of the two dims flattened)."""
    def f(x):
        q = torch.cat([x, x.sin()], -3)
        return SCENARIOS[scenario](q, q[..., :3, :, :]).cos()

    _per_sample_write_check(f, comps_for([(4, 3, 5), (4, 0, 2), (4, 2, 2)], 4))


def test_zero_length_sample_written_through_a_slice():
    _per_sample_write_check(_write_and_use("static slice", "write the view, use the base"), comps_for([(4, 6), (0, 6), (3, 6)], 4))


def test_values_saved_for_backward_then_written_in_place_raise_as_dense():
    """``y = q.sin()`` saves ``q``'s values; writing ``q`` in place afterwards makes the backward
    raise, as dense torch's does (it used to return the gradient at the new values)."""
    def f(x):
        q = x * 1.0
        y = q.sin()
        q.mul_(2.0)
        return y
    comps = comps_for([(4, 6), (0, 6), (3, 6)], 7)
    leaf = comps[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(f(leaf).sum(), [leaf])  # dense
    leaves = [c.clone().requires_grad_() for c in comps]
    out = f(mj.as_nested_tensor(leaves))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out.sum(), leaves)


def test_writes_through_a_values_path_view_without_autograd_are_plain():
    """Without autograd recording the writes are plain data writes, as in dense torch."""
    comps = comps_for([(4, 6), (0, 6), (3, 6)], 8)
    leaves = [c.clone().requires_grad_() for c in comps]
    q = mj.as_nested_tensor(leaves) * 1.0
    v = q.transpose(-1, -2)
    with torch.no_grad():
        v.mul_(2.0)
        out = q + 1
    for a, c in zip(out.unbind(), comps):
        assert_close(a, c * 2 + 1)


@pytest.mark.parametrize("view", ["static slice", "transpose", "view", "unsqueeze"], ids=str)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_in_place_through_views_with_autograd_recording_compiled(view, scenario):
    """Under torch.compile(fullgraph=True) views are autograd views of their base (the values
    path is eager only): every scenario as in dense torch, one graph over changing lengths —
    except a view / reshape of static dims, which the trace takes on the values (not an autograd
    view of the wrapper): writing into it or its base is refused (NOTE [ Writes into shared
    values ] in tensor.py)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    f = _write_and_use(view, scenario)
    if view == "view":
        with pytest.raises(Exception, match="writing in place into a multi_jagged tensor"):
            _per_sample_write_check(f, comps_for([(n, 6) for n in (4, 1, 3)], 5),
                                    compiled=torch.compile(f, backend="aot_eager", fullgraph=True))
        torch._dynamo.reset()
        return
    cc = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cc, fullgraph=True)
    for ns in ((4, 1, 3), (2, 5, 1), (3, 3, 6)):
        _per_sample_write_check(f, comps_for([(n, 6) for n in ns], 5), compiled=cf)
    assert cc.frame_count == 1
    torch._dynamo.reset()


@pytest.mark.xfail(strict=True, reason=(
    "under torch.compile, an in-place op with autograd recording on a view whose two ragged dims "
    "are not adjacent ((B, j0, C, j0) here; OpenFold's triangle attention divides "
    "q: (B, j0, H, j0, C) in place) fails while dynamo runs it on fake tensors: torch multiplies "
    "the view's two symbolic ragged sizes, whose hints are nested ints (ValueError: unsupported: "
    "NestedIntNode, from NestedIntNode.mul)"))
def test_in_place_on_a_view_splitting_ragged_dims_compiled():
    torch._dynamo.reset()
    f = _write_and_use("transpose", "write the view, use the view")
    _per_sample_write_check(f, comps_for([(4, 4, 6), (1, 1, 6), (3, 3, 6)], 6),
                            compiled=torch.compile(f, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- split family: dense edge cases
SPLIT_EDGE = {
    "chunk": [lambda t, k: t.chunk(k, -1), [1, 2, 3, 4, 7]],
    "split": [lambda t, k: t.split(k, -1), [1, 2, 3, 6]],
    "split_with_sizes": [lambda t, k: t.split_with_sizes(k, -1), None],
    "tensor_split(sections)": [lambda t, k: torch.tensor_split(t, k, -1), [1, 2, 3, 7]],
    "tensor_split(indices)": [lambda t, k: t.tensor_split(k, dim=-1), [[1], [0, 2], [3, 1], [2, 9]]],
    "unsafe_split": [lambda t, k: t.unsafe_split(k, -1), [1, 2, 4]],
}


def _pieces_check(f, k, comps, ragged_dims, seed):
    """Same number of pieces as dense torch on every component, each piece per sample, and the
    gradient of one piece (the others unused)."""
    x = mj.nested_tensor(comps, ragged_dims=ragged_dims)
    ref = [f(c, k) for c in comps]
    pieces = f(x, k)
    assert isinstance(pieces, tuple)
    assert len(pieces) == len(ref[0]), f"{len(pieces)} pieces, dense gives {len(ref[0])}"
    for j, piece in enumerate(pieces):
        assert piece.shape[1] == x.shape[1]
        for i, comp in enumerate(piece.unbind()):
            assert_close(comp, ref[i][j], f"piece {j} sample {i}")
    j = seed % len(pieces)
    per_sample_check(lambda t: f(t, k)[j] * 2, R(comps, ragged_dims), ref=lambda c: f(c, k)[j] * 2, seed=seed)


@pytest.mark.parametrize("c", [0, 1, 2, 5])
@pytest.mark.parametrize("op", SPLIT_EDGE, ids=str)
def test_split_family_edge_cases_match_dense(op, c):
    """Size 0, more chunks than elements, uneven pieces, empty and overlapping tensor_split
    indices: pieces as dense torch makes them (``chunk(3)`` of a size-0 dim is 3 pieces)."""
    f, ks = SPLIT_EDGE[op]
    if ks is None:
        ks = [[c], [0, c], [c, 0, 0]] + ([[1, c - 1]] if c else [])
    if op.startswith("split") or op == "unsafe_split":
        ks = [k for k in ks if c or isinstance(k, list)] + ([0] if c == 0 and op == "split" else [])
    comps = comps_for([(2, c), (0, c), (3, c)], c)
    for k in ks:
        _pieces_check(f, k, comps, (1,), seed=c)


def test_chunk_of_zero_size_dim_golden():
    x = mj.nested_tensor([torch.zeros(2, 0), torch.zeros(0, 0)], ragged_dims=(1,))
    pieces = x.chunk(3, -1)
    assert len(pieces) == 3 == len(torch.zeros(2, 0).chunk(3, -1))  # dense: 3 empty pieces
    assert [tuple(p.unbind()[0].shape) for p in pieces] == [(2, 0)] * 3


def test_split_family_errors_mirror_dense():
    """Errors are dense torch's own (computed on a meta tensor), with the user's dim."""
    x = mj.nested_tensor(comps_for([(2, 5), (0, 5)], 0), ragged_dims=(1,))
    d = torch.zeros(2, 3, 5)  # a dense tensor of the same logical rank and static sizes
    calls = {
        "chunk(0)": lambda t: t.chunk(0, -1),
        "split(0)": lambda t: t.split(0, -1),
        "split([2, 2])": lambda t: t.split([2, 2], -1),
        "dsplit(2)": lambda t: torch.dsplit(t.unsqueeze(2), 2),  # logical dim 2 has size 1
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError) as dense:
            call(d)
        with pytest.raises(RuntimeError) as ours:
            call(x)
        assert str(ours.value) == str(dense.value), name
    with pytest.raises(ValueError, match=r"^hsplit\(\).*static dim"):
        torch.hsplit(x, 1)  # dim 1 is ragged
    # vsplit splits dim 0, the batch: sub-batches (test_njt_shape_parity.py)
    assert [p.shape[0] for p in torch.vsplit(x, 2)] == [1, 1]


def test_hsplit_dsplit_static_dims():
    """``hsplit`` / ``dsplit`` split logical dims 1 and 2 as dense torch does on (B, …)."""
    comps = comps_for([(4, 2, 6), (4, 0, 6), (4, 3, 6)], 4)
    for f, ref in ((lambda t: torch.hsplit(t, 2), lambda c: torch.tensor_split(c, 2, 0)),
                   (lambda t: torch.hsplit(t, [1, 3]), lambda c: torch.tensor_split(c, [1, 3], 0))):
        for j in range(len(ref(comps[0]))):
            per_sample_check(lambda t: f(t)[j], R(comps, (2,)), ref=lambda c: ref(c)[j])
    comps = comps_for([(2, 4, 6), (0, 4, 6)], 5)
    for j in range(2):  # logical dim 2 (size 4) is component dim 1
        per_sample_check(lambda t: torch.dsplit(t, 2)[j], R(comps, (1,)), ref=lambda c: torch.tensor_split(c, 2, 1)[j])


# ----------------------------------------------------------------------------- diagonal / einsum diagonal
def test_pair_diagonal():
    """``diagonal`` over the two ragged dims of a square pair: per-sample diagonal (moved last,
    as dense torch does), with gradients; over two static dims: a view of the values."""

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        comps = comps_for([(n, n, c) for n in ns], seed)
        out = per_sample_check(lambda p: p.diagonal(0, 1, 2), R(comps, (1, 2)), ref=lambda t: t.diagonal(0, 0, 1), seed=seed)
        assert out.ragged_dims == (2,)
        per_sample_check(lambda p: torch.diagonal(p, 0, -2, -3).sin(), R(comps, (1, 2)), ref=lambda t: torch.diagonal(t, 0, -2, -3).sin(),
                         seed=seed)
        for off in (1, -1, 2):
            # off the main diagonal: a new extent, max(n - |off|, 0) per sample, either dim order
            out = per_sample_check(lambda p: p.diagonal(off, 1, 2), R(comps, (1, 2)), ref=lambda t: t.diagonal(off, 0, 1),
                                   seed=seed)
            whole = mj.nested_tensor(comps, ragged_dims=(1, 2))
            assert whole.diagonal(off, 1, 2).shape[-1] == whole.diagonal(-off, 1, 2).shape[-1]  # one nested int
            per_sample_check(lambda p: p.diagonal(off, 2, 1), R(comps, (1, 2)), ref=lambda t: t.diagonal(off, 1, 0), seed=seed)
        sq = comps_for([(n, c, c) for n in ns], seed + 1)
        for off in (0, 1, -1):
            per_sample_check(lambda x: x.diagonal(off, -2, -1), R(sq, (1,)), ref=lambda t: t.diagonal(off, -2, -1), seed=seed)
            per_sample_check(lambda x: x.diagonal(off, -1, -2), R(sq, (1,)), ref=lambda t: t.diagonal(off, -1, -2), seed=seed)

    check()


# a square pair beside a further ragged dim: (n, m) per sample, a zero on either side
_PAIR_AND_MORE = ((3, 2), (1, 4), (0, 1), (2, 0))
# component shape from (n, m), ragged dims, the two dims of one extent (logical)
_SQUARE_BESIDE = {
    "(j0, j0, j1)": (lambda n, m: (n, n, m), (1, 2, 3), (1, 2)),
    "(j1, j0, j0)": (lambda n, m: (m, n, n), (1, 2, 3), (2, 3)),
    "(j0, j1, j0)": (lambda n, m: (n, m, n), (1, 2, 3), (1, 3)),
    "(j0, C, j0, j1)": (lambda n, m: (n, 2, n, m), (1, 3, 4), (1, 3)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", _SQUARE_BESIDE, ids=str)
def test_diagonal_of_square_dims_beside_another_ragged_dim(layout, dtype):
    """``diagonal`` over two ragged dims of one extent where the tensor has a further ragged dim
    (``(B, j0, j0, j1)``, the pair dims anywhere): per sample, either dim order, off the main
    diagonal too, with gradients (it said the dims were no square pair)."""
    shape, ragged, (a, b) = _SQUARE_BESIDE[layout]
    comps = comps_for([shape(n, m) for n, m in _PAIR_AND_MORE], 3, dtype=dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    for off in (0, 1, -1):
        for d1, d2 in ((a, b), (b, a)):
            out = per_sample_check(lambda p: p.diagonal(off, d1, d2), R(comps, ragged),
                                   ref=lambda t: t.diagonal(off, d1 - 1, d2 - 1), new_ragged=off != 0, **tol)
            assert out.ragged_dims[-1] == out.dim() - 1  # the diagonal, appended last as dense does


_EINSUM_SQUARE_BESIDE = {
    "biij->bij": (lambda n, m: (n, n, m), "iij->ij"),
    "biij->bji": (lambda n, m: (n, n, m), "iij->ji"),
    "biij->bj": (lambda n, m: (n, n, m), "iij->j"),
    "bjii->bji": (lambda n, m: (m, n, n), "jii->ji"),
    "bjii->bij": (lambda n, m: (m, n, n), "jii->ij"),
    "biji->bij": (lambda n, m: (n, m, n), "iji->ij"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("eq", _EINSUM_SQUARE_BESIDE, ids=str)
def test_einsum_diagonal_of_square_dims_beside_another_ragged_dim(eq, dtype):
    """A subscript repeated on two ragged dims of one extent takes their diagonal wherever the
    dims sit beside a further ragged dim, with gradients (it asked for a square pair)."""
    shape, ref_eq = _EINSUM_SQUARE_BESIDE[eq]
    comps = comps_for([shape(n, m) for n, m in _PAIR_AND_MORE], 5, dtype=dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    per_sample_check(lambda p: torch.einsum(eq, p), R(comps, (1, 2, 3)), ref=lambda t: torch.einsum(ref_eq, t), **tol)


def test_diagonal_errors():
    rect = mj.nested_tensor(comps_for([(2, 3, 2), (0, 1, 2)], 0), ragged_dims=(1, 2))
    with pytest.raises(NotImplementedError, match=r"^diagonal\(\).*square pair"):
        rect.diagonal(0, 1, 2)
    sq_comps = comps_for([(2, 2, 2), (1, 1, 2), (0, 0, 2), (3, 3, 2)], 0)
    sq = mj.nested_tensor(sq_comps, ragged_dims=(1, 2))
    for dims in ((1, 3), (2, 3), (3, 2)):  # a ragged and a static dim: each sample's own diagonal (a new extent)
        for offset in (0, 1, -1):
            for a, c in zip(sq.diagonal(offset, *dims).unbind(), sq_comps):
                torch.testing.assert_close(a, c.diagonal(offset, dims[0] - 1, dims[1] - 1))
    with pytest.raises(ValueError, match=r"^diagonal\(\).*batch"):
        sq.diagonal(0, 0, 1)


EINSUM_DIAG = {
    "bii->bi": ((1, 2), lambda n, c: (n, n), "ii->i", None),
    "biic->bic": ((1, 2), lambda n, c: (n, n, c), "iic->ic", None),
    "biic->bci": ((1, 2), lambda n, c: (n, n, c), "iic->ci", None),
    "biic,cd->bid": ((1, 2), lambda n, c: (n, n, c), "iic,cd->id", lambda c: (c, 2)),
    "biic,c->bi": ((1, 2), lambda n, c: (n, n, c), "iic,c->i", lambda c: (c,)),
}


@pytest.mark.parametrize("eq", EINSUM_DIAG, ids=str)
def test_einsum_diagonal_of_square_pair(eq):
    """A subscript repeated on the two ragged dims of a square pair takes the per-sample
    diagonal (``einsum('bii->bi', pair)`` raised an IndexError)."""
    ragged, shape, ref_eq, wshape = EINSUM_DIAG[eq]

    @FEW
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        comps = comps_for([shape(n, c) for n in ns], seed)
        if wshape is None:
            per_sample_check(lambda p: torch.einsum(eq, p), R(comps, ragged), ref=lambda t: torch.einsum(ref_eq, t), seed=seed)
        else:
            w = comps_for([wshape(c)], seed + 1)[0]
            per_sample_check(lambda p, w: torch.einsum(eq, p, w), R(comps, ragged), w,
                             ref=lambda t, w: torch.einsum(ref_eq, t, w), seed=seed)

    check()


@pytest.mark.parametrize("eq", ["biic->bic", "bii->bi"])
def test_einsum_diagonal_of_a_pair_of_two_nested_ints_with_equal_lengths(eq):
    """A pair built from two batches of equal lengths (``x.unsqueeze(2) * y.unsqueeze(1)``: dims
    ``(j0, j1)``) reads as square; the gradient comes back in the pair's own shape (autograd
    refused ``(j0, j0)`` for ``(j0, j1)``), per sample, to both batches."""
    ns = (3, 0, 1, 2)
    c1, c2 = comps_for([(n, 2) for n in ns], 0), comps_for([(n, 2) for n in ns], 1)
    ref_eq = eq.replace("b", "")

    def f(x, y):
        p = x.unsqueeze(-2) * y.unsqueeze(-3)
        return torch.einsum(eq if x.dim() == 3 else ref_eq, p if eq.startswith("biic") else p.sum(-1))

    per_sample_check(f, R(c1, (1,)), R(c2, (1,)), new_ragged=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("eq", ["bnd,->bnd", "bnd,->bn", ",bnd->bnd", "bnd,->bdn", "bnd,->b"])
def test_einsum_with_a_0d_operand(eq, dtype):
    """A 0-d dense operand (an empty term, as dense ``einsum`` takes it) scales the product,
    either side, with its gradient (its empty term was refused as a count mismatch)."""
    comps = comps_for([(n, 4) for n in (3, 0, 2)], 6, dtype=dtype)
    scale = torch.tensor(2.5, dtype=dtype)
    ref_eq = ",".join(t[1:] if t else t for t in eq.split("->")[0].split(",")) + "->" + eq.split("->")[1][1:]
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    if eq.startswith(","):
        per_sample_check(lambda s, x: torch.einsum(eq, s, x), scale, R(comps, (1,)), ref=lambda s, x: torch.einsum(ref_eq, s, x),
                         dense_out=eq.endswith("->b"), **tol)
    else:
        per_sample_check(lambda x, s: torch.einsum(eq, x, s), R(comps, (1,)), scale, ref=lambda x, s: torch.einsum(ref_eq, x, s),
                         dense_out=eq.endswith("->b"), **tol)


def test_einsum_diagonal_golden():
    p = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 0)], ragged_dims=(1, 2))
    d = torch.einsum("bii->bi", p)
    assert d.shape == (2, p.shape[1])  # the pair's nested int
    torch.testing.assert_close(d.unbind()[0], torch.tensor([1.0, 4.0]))  # = [p00, p11]
    assert d.unbind()[1].shape == (0,)


def test_einsum_misuse_errors():
    p = mj.nested_tensor(comps_for([(2, 2, 3), (0, 0, 3)], 0), ragged_dims=(1, 2))
    rect = mj.nested_tensor(comps_for([(2, 3, 3), (0, 1, 3)], 0), ragged_dims=(1, 2))
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    with pytest.raises(NotImplementedError, match=r"^einsum\(\).*square pair"):
        torch.einsum("bii->bi", rect[..., 0])  # a rectangular pair has no diagonal
    with pytest.raises(NotImplementedError, match=r"^einsum\(\).*ragged and a static"):
        torch.einsum("bicc->bic", p)  # c labels ragged dim 2 and static dim 3
    with pytest.raises(ValueError, match=r"^einsum\(\).*number of subscripts"):
        torch.einsum("bic->bic", p)
    with pytest.raises(ValueError, match=r"^einsum\(\).*output subscript"):
        torch.einsum("bic->bicc", x)
    with pytest.raises(ValueError, match=r"^einsum\(\).*operands"):
        torch.einsum("bic,bic->bic", x)
    with pytest.raises(NotImplementedError, match=r"^einsum\(\).*batch"):
        torch.einsum("bib->bi", x[..., :2].unsqueeze(-1).expand(-1, -1, 2, 2).flatten(-2)[..., :2].unsqueeze(-1)[..., 0])
    tr = torch.einsum("bii->b", p[..., 0])  # the trace of each sample: valid per sample, by broadcasting
    torch.testing.assert_close(tr, torch.stack([torch.einsum("ii->", c) for c in p[..., 0].unbind()]))


# ----------------------------------------------------------------------------- errors name the op
def test_reshape_family_errors_name_the_op():
    x = mj.nested_tensor(comps_for([(2, 6), (0, 6)], 0), ragged_dims=(1,))
    with pytest.raises(ValueError, match=r"^reshape\(\).*regroup"):
        x.reshape(x.shape[0], x.shape[1], 4)
    with pytest.raises(ValueError, match=r"^reshape\(\).*batch and ragged"):
        torch.reshape(x, (2, 6))
    with pytest.raises(ValueError, match=r"^reshape\(\).*two samples"):
        torch.reshape(x, (-1, 4))  # flattening the batch dim (test_flatten_batch.py), rows across samples
    with pytest.raises(ValueError, match=r"^view\(\)"):
        x.view(x.shape[0], x.shape[1], 4)
    lead_comps = comps_for([(2, 2, 6), (2, 0, 6)], 0)
    lead = mj.nested_tensor(lead_comps, ragged_dims=(2,))
    flat = lead.flatten(1, 2)  # a static dim into the ragged one after it: each sample regrouped (a copy)
    assert [t.shape for t in flat.unbind()] == [(4, 6), (0, 6)]
    assert all(torch.equal(a, c.flatten(0, 1)) for a, c in zip(flat.unbind(), lead_comps))
    split = x.unflatten(1, (1, -1))  # the ragged dim split as each sample's dense unflatten
    assert [t.shape for t in split.unbind()] == [(1, 2, 6), (1, 0, 6)]
    with pytest.raises(ValueError, match=r"^unflatten\(\).*static dim"):
        torch.unflatten(x, 0, (1, 2))
    with pytest.raises(RuntimeError, match=r"dim 2"):  # dense torch's message, with the user's dim
        x.unflatten(2, (4, -1))


@pytest.mark.parametrize("sizes", [(3, 2), (3, -1), (-1, 1, 2), (6,)], ids=str)
def test_unflatten_static_dims(sizes):
    @FEW
    @given(structures(SEQ, max_batch=3, min_c=6, max_c=6), seeds)
    def check(s, seed):
        per_sample_check(lambda t: t.unflatten(-1, sizes), R(components(s.shapes, seed), s.ragged_dims),
                         ref=lambda c: c.unflatten(-1, sizes), seed=seed)

    check()


# ----------------------------------------------------------------------------- split backward
@pytest.mark.parametrize("split", [lambda x: x.chunk(3, -1), lambda x: x.split([1, 3, 2], -1),
                                   lambda x: torch.tensor_split(x, [2, 4], -1)])
def test_split_backward_writes_once_and_matches_per_sample(split):
    """Eager pieces with gradients come from one autograd node whose backward is one cat (zeros
    for unused pieces), not one zero-filled full-size buffer per piece; values, gradients with an
    unused piece, second order, and dense's refusal of in-place writes to the pieces."""
    import torch_multijagged as tmj

    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 6, dtype=torch.float64, generator=g) for n in (2, 0, 3)]
    x = tmj.nested_tensor(comps, requires_grad=True)
    pieces = split(x)
    node = pieces[0].grad_fn  # one node for all pieces: ours, or dense split's on the values path
    if type(node).__name__ == "_AdoptBackward":
        node = node.next_functions[0][0]
    assert type(node).__name__ in ("_SplitStaticBackward", "SplitBackward0", "SplitWithSizesBackward0")
    assert all(p.grad_fn.next_functions[0][0] is node for p in pieces[1:]) or all(p.grad_fn is node for p in pieces)
    loss = (pieces[0] ** 3).values().sum() + (pieces[2] * 2).values().sum()  # piece 1 unused
    gx, = torch.autograd.grad(loss, x, create_graph=True)
    ggx, = torch.autograd.grad(gx.values().sum(), x)
    cs = [c.clone().requires_grad_() for c in comps]
    ref_loss = sum((split(c)[0] ** 3).sum() + (split(c)[2] * 2).sum() for c in cs)
    rg = torch.autograd.grad(ref_loss, cs, create_graph=True)
    rgg = torch.autograd.grad(sum(r.sum() for r in rg), cs)
    for a, b, c, d in zip(gx.unbind(), rg, ggx.unbind(), rgg):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, d)
    y = x * 1
    with pytest.raises(RuntimeError, match="view"):
        split(y)[0].add_(1)


SPLIT_CALLS = {
    "chunk(2, -1)": lambda t: t.chunk(2, -1),
    "chunk(4, dim=-1)": lambda t: t.chunk(4, dim=-1),
    "torch.chunk(t, 3, -1)": lambda t: torch.chunk(t, 3, -1),
    "split(2, -1)": lambda t: t.split(2, -1),
    "split([1, 0, 4], dim=-1)": lambda t: t.split([1, 0, 4], dim=-1),
    "torch.split(t, [3, 2], -1)": lambda t: torch.split(t, [3, 2], -1),
    "torch.split(t, 5, dim=t.dim() - 1)": lambda t: torch.split(t, 5, dim=t.dim() - 1),
    "a static dim before another": lambda t: t.unflatten(-1, (5, 1)).chunk(2, -2),
    "static dim before the ragged one": lambda t: t.unflatten(-1, (5, 1)).transpose(1, 2).chunk(2, 1),
}


@pytest.mark.parametrize("layout", [(1,), (1, 2)], ids=["(B, j0, C)", "(B, j0, j0, C)"])
@pytest.mark.parametrize("call", SPLIT_CALLS, ids=str)
def test_split_pieces_of_a_result_with_gradients(call, layout):
    """chunk / split of an intermediate (the eager values path's pieces: views of its values): the
    pieces and the gradients reaching every leaf per sample, a zero-length sample, second order,
    and a piece saved and loaded."""
    import io

    f = SPLIT_CALLS[call]
    shapes = [(2, 5), (0, 5), (3, 5)] if layout == (1,) else [(2, 2, 5), (0, 0, 5), (3, 3, 5)]
    if call == "static dim before the ragged one" and layout == (1, 2):
        pytest.skip("a transpose of the pair's ragged dims")
    comps = comps_for(shapes, 3, dtype=torch.float64)
    x = mj.nested_tensor(comps, ragged_dims=layout, requires_grad=True)
    w = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    pieces = f(torch.nn.functional.linear(x, w))
    loss = sum(((k + 1) * p.sin()).sum() for k, p in enumerate(pieces))
    gx, gw = torch.autograd.grad(loss, (x, w), create_graph=True)
    ggx, ggw = torch.autograd.grad((gx * gx).sum() + gw.sum(), (x, w))
    cs = [c.clone().requires_grad_() for c in comps]
    wr = w.detach().clone().requires_grad_()
    ref_pieces = [f(torch.nn.functional.linear(c, wr).unsqueeze(0)) for c in cs]
    for k, p in enumerate(pieces):
        for a, ref in zip(p.unbind(), ref_pieces):
            torch.testing.assert_close(a, ref[k].squeeze(0))
    ref_loss = sum(((k + 1) * p.sin()).sum() for r in ref_pieces for k, p in enumerate(r))
    rgx = torch.autograd.grad(ref_loss, cs + [wr], create_graph=True)
    rgg = torch.autograd.grad(sum((g * g).sum() for g in rgx[:-1]) + rgx[-1].sum(), cs + [wr])
    for a, b in zip(gx.unbind(), rgx[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gw, rgx[-1])
    for a, b in zip(ggx.unbind(), rgg[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(ggw, rgg[-1])
    buf = io.BytesIO()
    pieces[0].shape, pieces[0].offsets()  # metadata read before saving
    torch.save(pieces[0].detach(), buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    for a, b in zip(back.unbind(), pieces[0].unbind()):
        torch.testing.assert_close(a, b.detach())


def test_split_piece_writes_as_dense():
    """An in-place write into a piece raises while autograd records (dense torch refuses writes
    into the views of a function that returns several); under no_grad it writes through to the
    split tensor, as dense's does."""
    x = mj.nested_tensor(comps_for([(2, 4), (0, 4), (3, 4)], 1), requires_grad=True)
    for f in (lambda t: t.chunk(2, -1), lambda t: torch.split(t, [1, 3], -1)):
        y = x * 2
        with pytest.raises(RuntimeError, match=r"^add_\(\): .*view and is being modified inplace"):
            f(y)[0].add_(1)
        y = x * 2
        a = f(y)[0]
        with torch.no_grad():
            a.mul_(0)
        assert all((c[:, :1] == 0).all() for c in y.detach().unbind())
    d = x.detach()
    a, b = d.chunk(2, -1)
    a.add_(1)  # nothing records: a plain write into d
    for c, ref in zip(d.unbind(), comps_for([(2, 4), (0, 4), (3, 4)], 1)):
        torch.testing.assert_close(c[:, :2], ref[:, :2] + 1)


FLATTEN_CALLS = {
    "unflatten(-1, (2, 3))": lambda t: t.unflatten(-1, (2, 3)),
    "unflatten(-1, (-1, 2, 1))": lambda t: t.unflatten(-1, (-1, 2, 1)),
    "torch.unflatten(t, dim=-1, sizes=(3, 2))": lambda t: torch.unflatten(t, dim=-1, sizes=(3, 2)),
    "unflatten then flatten(-2)": lambda t: t.unflatten(-1, (2, 3)).flatten(-2),
    "flatten(start_dim=-3, end_dim=-1)": lambda t: t.unflatten(-1, (3, 2, 1)).flatten(start_dim=-3, end_dim=-1),
    "heads before the ragged dim": lambda t: t.unflatten(-1, (2, 3)).transpose(-2, -3).unflatten(-3, (1, 2)),
    "flatten heads before the ragged dim": lambda t: t.unflatten(-1, (2, 3)).transpose(-2, -3).unflatten(-3, (1, 2)).flatten(-4, -3),
    "torch.flatten of a transpose (a copy)": lambda t: torch.flatten(t.unflatten(-1, (2, 3)).transpose(-1, -2), -2),
}


@pytest.mark.parametrize("layout", [(1,), (1, 2)], ids=["(B, j0, C)", "(B, j0, j0, C)"])
@pytest.mark.parametrize("call", FLATTEN_CALLS, ids=str)
def test_flatten_unflatten_of_a_result_with_gradients(call, layout):
    """flatten / unflatten of static dims of an intermediate (the eager values path): shapes and
    values per sample, gradients reaching every leaf, second order, a zero-length sample."""
    f = FLATTEN_CALLS[call]
    shapes = [(2, 6), (0, 6), (3, 6)] if layout == (1,) else [(2, 2, 6), (0, 0, 6), (3, 3, 6)]
    comps = comps_for(shapes, 5, dtype=torch.float64)
    x = mj.nested_tensor(comps, ragged_dims=layout, requires_grad=True)
    w = torch.randn(6, 6, dtype=torch.float64, requires_grad=True)
    out = f(torch.nn.functional.linear(x, w))
    cs = [c.clone().requires_grad_() for c in comps]
    wr = w.detach().clone().requires_grad_()
    refs = [f(torch.nn.functional.linear(c, wr).unsqueeze(0)).squeeze(0) for c in cs]
    assert out.dim() == refs[0].dim() + 1
    for a, r in zip(out.unbind(), refs):
        assert a.shape == r.shape
        torch.testing.assert_close(a, r)
    loss = (out.sin() * out).sum()
    gx, gw = torch.autograd.grad(loss, (x, w), create_graph=True)
    ggx, ggw = torch.autograd.grad((gx * gx).sum() + gw.sum(), (x, w))
    rl = sum((r.sin() * r).sum() for r in refs)
    rg = torch.autograd.grad(rl, cs + [wr], create_graph=True)
    rgg = torch.autograd.grad(sum((g * g).sum() for g in rg[:-1]) + rg[-1].sum(), cs + [wr])
    for a, b in zip(gx.unbind(), rg[:-1]):
        torch.testing.assert_close(a, b)
    for a, b in zip(ggx.unbind(), rgg[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gw, rg[-1])
    torch.testing.assert_close(ggw, rgg[-1])


@pytest.mark.parametrize("view", [v for v in VIEWS if v != "static slice"])
def test_write_a_view_made_after_the_base_was_written(view):
    """``q.mul_(3); v = q.transpose(-1, -2); v.neg_(); use q``: the view shares q's values but not its
    autograd history (the eager values path), so q's gradient would miss the view's write: using q
    raises — its own earlier write must not hide the view's."""
    comps = comps_for([(4, 6), (1, 6), (3, 6)], 4)
    leaves = [c.clone().requires_grad_() for c in comps]
    q = mj.as_nested_tensor(leaves) * 1.0
    q.mul_(3.0)
    v = VIEWS[view](q)
    v.neg_()
    with pytest.raises(NotImplementedError, match="written in place through another tensor that shares them"):
        q.sin()


def _stale_programs():
    def seq():
        return mj.nested_tensor(comps_for([(2, 4), (0, 4), (3, 4)], 0), requires_grad=True)

    def pair():
        return mj.nested_tensor(comps_for([(2, 2, 3), (1, 1, 3), (3, 3, 3)], 1), ragged_dims=(1, 2), requires_grad=True)

    def alias_after_own_write(x):  # y's own write, then one through a values-path view of its view
        y = x * 1
        t = y[..., :2]
        t.mul_(2.0)
        t.unsqueeze(-1).mul_(3.0)
        return (y * y).sum()

    def saved_then_written_through_a_view(x):  # dense: "modified by an inplace operation"
        y = x * 1
        z = torch.sin(y)
        y[..., :2].mul_(2.0)
        return z.sum()

    def read_after(view):
        def prog(x):
            y = x * 1
            t = view(y)
            y[..., :1].mul_(2.0)  # the base written through a view of its own
            return (t * t).sum()
        return prog

    return {
        "a write through an alias after the tensor's own write": (seq, alias_after_own_write, NotImplementedError,
                                                                   "written in place through another tensor"),
        "values saved for backward, then written through a view": (seq, saved_then_written_through_a_view, RuntimeError,
                                                                    "modified by an inplace operation"),
        "a view of a ragged slice": (seq, read_after(lambda y: y[:, 1:].unsqueeze(-1)), NotImplementedError, "take the slice again"),
        "a ragged slice of a transpose": (seq, read_after(lambda y: y.transpose(-1, -2)[..., 1:]), NotImplementedError,
                                          "take the slice again"),
        "a narrow along a pair's ragged dim": (pair, read_after(lambda y: y.narrow(1, 0, 1)), NotImplementedError,
                                               "take the slice again"),
        "a transpose of a pair's ragged dims": (pair, read_after(lambda y: y.transpose(1, 2)), NotImplementedError,
                                                "take the slice again"),
        # the values path hands the handler a stand-in of the view: the base's storage tells the write
        "a reordering of a pair's ragged dims taken from a view": (
            pair, read_after(lambda y: y.permute(0, 1, 2, 3).permute(0, 3, 2, 1)), NotImplementedError, "take the slice again"),
    }


@pytest.mark.parametrize("case", list(_stale_programs()), ids=str)
def test_writes_that_a_copy_or_an_alias_would_miss_raise(case):
    """Programs whose dense result reflects a write that ours could not (a copy taken before its
    base was written, a gradient that would miss a write through an alias, values saved for a
    backward and written through a view): each raises instead of answering differently."""
    make, prog, exc, words = _stale_programs()[case]
    x = make()
    with pytest.raises(exc, match=words):
        torch.autograd.grad(prog(x), x)
