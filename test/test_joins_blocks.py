"""Slices, ``select``, ``cat``, constant ``F.pad`` and ``roll`` along the first ragged dim in
both of their forms (NOTE [ Blocks of consecutive rows ] in kernels/along.py): blocks of
consecutive rows and index maps, forced in turn — per sample against dense torch, float32 and
float64, gradients of every input (a dense class token's too), zero-length samples and B = 0,
second order, no leakage between samples, and the maps cached per structure. Also ``F.pad`` of
ragged dims in the reflect, replicate and circular modes as dense pads each sample as a batch of
one ``(1, …)``: the pad lengths a dense batch takes, and dense's error where it refuses."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged.ops.indexing import along, joins

from _reference import ALL_LAYOUTS, SEQ, PS, R, few, per_sample_check, seeds, structures
from _structures import assert_samples_and_grads, bit_equal, comps_for, packed_args
from test_ragged_indexing import check

FORMS = ("blocks", "maps")
DTYPES = (torch.float32, torch.float64)


@contextlib.contextmanager
def form(name: str):
    """Every batch moved as blocks (``blocks``) or through index maps (``maps``)."""
    old = along.BLOCKS_MIN_ELEMENTS
    along.BLOCKS_MIN_ELEMENTS = 0 if name == "blocks" else 1 << 62
    try:
        yield
    finally:
        along.BLOCKS_MIN_ELEMENTS = old


def _at(d: int, item):
    """``item`` at logical dim ``d`` of the batch, and at ``d - 1`` of a component."""
    return (slice(None),) * d + (item,), (slice(None),) * (d - 1) + (item,)


def _pad_of(d: int, ndim: int, lo: int, hi: int) -> list[int]:
    """``F.pad``'s list padding logical dim ``d`` of a batch of rank ``ndim`` by ``(lo, hi)``."""
    return [0, 0] * (ndim - 1 - d) + [lo, hi]


def _ops(d: int, ndim: int):
    """(name, op on the batch, op on a component) along ragged dim ``d``."""
    out = []
    for sl in (slice(1, None), slice(2, -3), slice(None, 2), slice(-2, None), slice(5, None), slice(0, 0), slice(1, -1),
               slice(None, None, 2)):
        bi, ci = _at(d, sl)
        out.append((f"slice{(sl.start, sl.stop, sl.step)}", lambda x, bi=bi: x[bi], lambda c, ci=ci: c[ci]))
    for lo, hi in ((1, 2), (-1, 1), (2, -1), (0, 3), (-1, -1)):
        pp = _pad_of(d, ndim, lo, hi)
        out.append((f"pad{(lo, hi)}", lambda x, pp=pp: F.pad(x, pp, value=0.5), lambda c, pp=pp: F.pad(c, pp, value=0.5)))
    bi, ci = _at(d, slice(1, None))
    out.append(("cat(x,x[1:])", lambda x, bi=bi: torch.cat([x, x[bi]], d), lambda c, ci=ci: torch.cat([c, c[ci]], d - 1)))
    out.append(("cat(x,x)", lambda x: torch.cat([x, x * 2], d), lambda c: torch.cat([c, c * 2], d - 1)))
    out.append(("roll(2)", lambda x: x.roll(2, d), lambda c: c.roll(2, d - 1)))
    return out


_NAMES = [name for name, _, _ in _ops(1, 3)]


@pytest.mark.parametrize("name", _NAMES)
@pytest.mark.parametrize("how", FORMS)
@given(s=st.sampled_from(ALL_LAYOUTS).flatmap(lambda lay: structures(lay, min_batch=0)), seed=seeds,
       dtype=st.sampled_from(DTYPES))
@few(10)
def test_ops_along_the_first_ragged_dim_in_both_forms(name, how, s, seed, dtype):
    d = s.ragged_dims[0]
    comps = s.components(seed, dtype=dtype)
    _, fn, ref = next(op for op in _ops(d, len(s.shapes.template) + 1) if op[0] == name)
    with form(how):
        check(fn, ref, comps, s.ragged_dims)


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("index", [0, -1, 2])
@given(s=st.sampled_from(ALL_LAYOUTS).flatmap(lambda lay: structures(lay, min_batch=0)), seed=seeds,
       dtype=st.sampled_from(DTYPES))
@few(8)
def test_select_of_the_first_ragged_dim_in_both_forms(how, index, s, seed, dtype):
    """``x[:, i]`` (every sample holding ``i``, else dense's error naming it), twice: its rows are
    cached per structure and index."""
    d = s.ragged_dims[0]
    bi, ci = _at(d, index)
    with form(how):
        for _ in range(2):
            check(lambda x: x[bi], lambda c: c[ci], s.components(seed, dtype=dtype), s.ragged_dims)


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(s=structures(SEQ, min_batch=0), seed=seeds, m=st.integers(1, 3))
@few(10)
def test_cat_with_class_and_register_tokens_in_both_forms(how, dtype, s, seed, m):
    """``cat([cls.expand(B, 1, C), x, reg.expand(B, m, C)], 1)``, a ``(1, m, C)`` token block
    shared by every sample, and a per-sample ``(B, m, C)`` one: the tokens' gradients too."""
    comps = s.components(seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    b, c = len(comps), s.c
    cls, reg = torch.randn(1, 1, c, generator=g, dtype=dtype), torch.randn(1, m, c, generator=g, dtype=dtype)
    per = torch.randn(b, m, c, generator=g, dtype=dtype)
    tol = {} if dtype == torch.float64 else {"rtol": 1e-6, "atol": 1e-6}
    with form(how):
        per_sample_check(lambda x, t, r: torch.cat([t.expand(b, 1, c), x, r.expand(b, m, c)], 1), R(comps, (1,)), cls, reg,
                         ref=lambda x, t, r: torch.cat([t[0], x, r[0]], 0), new_ragged=True, **tol)
        per_sample_check(lambda x, t: torch.cat([t, x], 1), R(comps, (1,)), reg,
                         ref=lambda x, t: torch.cat([t[0], x], 0), new_ragged=True, **tol)
        per_sample_check(lambda x, t: torch.cat([x, t], 1), R(comps, (1,)), PS(per),
                         ref=lambda x, t: torch.cat([x, t], 0), new_ragged=True, **tol)


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("name", ["slice(1, None, None)", "pad(1, 2)", "pad(-1, 1)", "cat(x,x[1:])", "roll(2)"])
def test_no_leakage_between_samples(how, name):
    """Changing sample j's values (and its cotangent) leaves every other sample's result and
    gradient bit for bit unchanged."""
    lengths = (3, 1, 5, 2)
    for rd, shapes in (((1,), [(n, 3) for n in lengths]), ((1, 2), [(n, n, 2) for n in lengths])):
        _, fn, _ = next(op for op in _ops(1, len(shapes[0]) + 1) if op[0] == name)
        base = comps_for(shapes, 5)
        with form(how):
            outs, grads = [], []
            for variant in range(2):
                comps = [c.clone() for c in base]
                comps[2] = comps[2] + variant  # sample 2 differs
                x = mj.nested_tensor(comps, ragged_dims=rd, requires_grad=True)
                y = fn(x)
                cot = [torch.ones_like(t) * (1 + variant * (i == 2)) for i, t in enumerate(y.unbind())]
                (g,) = torch.autograd.grad(y, x, mj.nested_tensor(cot, ragged_dims=rd))
                outs.append(y.unbind())
                grads.append(g.unbind())
            for i in (0, 1, 3):
                assert bit_equal(outs[0][i], outs[1][i]), (name, rd, i)
                assert bit_equal(grads[0][i], grads[1][i]), (name, rd, i)


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("name", ["slice(1, None, None)", "slice(2, -3, None)", "pad(-1, 1)", "pad(1, 2)", "cat(x,x)", "roll(2)"])
def test_second_order(how, name):
    """gradgradcheck w.r.t. the packed values, tokens and a pair along their first ragged dim."""
    for rd, shapes in (((1,), [(4, 2), (1, 2), (6, 2)]), ((1, 2), [(3, 3, 1), (5, 5, 1)])):
        _, fn, _ = next(op for op in _ops(1, len(shapes[0]) + 1) if op[0] == name)
        v, off, sizes = packed_args(comps_for(shapes, 3), rd)

        def f(v):
            y = fn(mj.from_packed(v, off, sizes, rd))
            return (y * y).values()

        with form(how), warnings.catch_warnings():
            warnings.simplefilter("error")
            assert torch.autograd.gradgradcheck(f, (v.requires_grad_(),))


def test_blocks_form_is_taken_where_samples_are_large():
    """The blocks run where the samples hold enough elements and the maps elsewhere (spied), and
    both give dense's values."""
    seen = []

    def spy(fn):
        def wrapped(*args):
            seen.append(fn.__name__)
            return fn(*args)
        return wrapped

    big = [torch.randn(n, 256) for n in (40, 0, 70)]
    small = [torch.randn(n, 2) for n in (4, 0, 7)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(along, "gather_runs", spy(along.gather_runs))
        mp.setattr(joins, "join_blocks", spy(joins.join_blocks))
        for comps, expect in ((big, ["gather_runs", "join_blocks", "gather_runs", "join_blocks"]), (small, [])):
            seen.clear()
            x = mj.nested_tensor(comps, requires_grad=True)
            outs = (x[:, 1:], F.pad(x, (0, 0, 2, 1)), torch.cat([x[:, :1], x], 1))
            for y, want in zip(outs, ([c[1:] for c in comps], [F.pad(c, (0, 0, 2, 1)) for c in comps],
                                      [torch.cat([c[:1], c]) for c in comps])):
                assert all(torch.equal(a, b) for a, b in zip(y.unbind(), want))
            assert seen == expect, seen


def test_slices_of_one_batch_read_their_own_rows():
    """The rows of a slice along a ragged dim are cached per structure, dim and bounds: one batch
    sliced in turn with other bounds and steps, and again, gives each call dense's result."""
    comps = comps_for([(5, 2), (3, 2), (7, 2)], 1)
    x = mj.nested_tensor(comps)
    for how in FORMS * 2:
        with form(how):
            for sl in (slice(1, None), slice(None, -1), slice(1, None, 2), slice(0, 2), slice(-3, None), slice(1, None)):
                for a, c in zip(x[:, sl].unbind(), comps):
                    assert torch.equal(a, c[sl]), (how, sl)
            for i in (0, 1, -1, 2, 0):
                assert torch.equal(x[:, i], torch.stack([c[i] for c in comps])), (how, i)


@pytest.mark.parametrize("how", FORMS)
def test_slice_writes_through_in_both_forms(how):
    """A slice along a ragged dim written in place writes its base (NOTE [ Slices of ragged dims
    write through ] in ops/shape/views.py), gradients following as for a dense view."""
    comps = comps_for([(4, 3), (0, 3), (6, 3)], 2)
    leaves = [c.clone().requires_grad_() for c in comps]
    with form(how):
        x = mj.as_nested_tensor(leaves) * 1
        s = x[:, 1:]
        s.mul_(3)
        want = [c.clone() for c in comps]
        for w in want:
            w[1:] *= 3
        assert all(torch.equal(a, w) for a, w in zip(x.unbind(), want))
        grads = torch.autograd.grad(x.sum(), leaves)
    for g, c in zip(grads, comps):
        expect = torch.ones_like(c)
        expect[1:] = 3
        assert torch.equal(g, expect)


@pytest.mark.parametrize("case", ["narrow(1, 0, n)", "[:, :n - 1]", "[:, 1:n]", "[:, :n - 1][..., 0]"])
def test_slice_bounded_by_a_ragged_size_writes_through(case):
    """A slice whose bound is a ragged size (``x.narrow(1, 0, n)``, ``x[:, : n - 1]``) written in
    place writes its base, as one with int bounds, gradients as for a dense view."""
    f = {"narrow(1, 0, n)": lambda t, n: t.narrow(1 if t.dim() == 3 else 0, 0, n),
         "[:, :n - 1]": lambda t, n: t[:, : n - 1] if t.dim() == 3 else t[: n - 1],
         "[:, 1:n]": lambda t, n: t[:, 1:n] if t.dim() == 3 else t[1:n],
         "[:, :n - 1][..., 0]": lambda t, n: (t[:, : n - 1] if t.dim() == 3 else t[: n - 1])[..., 0]}[case]
    comps = comps_for([(4, 3), (1, 3), (6, 3)], 3)
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves) * 1
    f(x, x.shape[1]).mul_(3)
    want = [c * 1 for c in leaves]
    for w in want:
        f(w, w.shape[0]).mul_(3)
    assert_samples_and_grads(x, want, leaves)


@pytest.mark.parametrize("case", ["prepend row", "diff prepend", "middle column"])
def test_cat_along_a_ragged_dim_of_an_operand_static_there(case):
    """A pair's first row ``P.narrow(1, 0, 1)`` (static size 1 along dim 1) joined to the pair along
    its ragged dim 1 (``diff(prepend=…)``, a start token row): every sample takes that many rows;
    values and gradients as each sample's dense ``cat``."""
    g = torch.Generator().manual_seed(0)
    cs = [torch.randn(k, k, 2, dtype=torch.float64, generator=g, requires_grad=True) for k in (3, 1, 5)]
    pair = mj.as_nested_tensor(cs, ragged_dims=(1, 2))
    f, ref = {
        "prepend row": (lambda p: torch.cat([p.narrow(1, 0, 1), p], 1), lambda c: torch.cat([c[:1], c], 0)),
        "diff prepend": (lambda p: p.diff(dim=1, prepend=p.narrow(1, 0, 1)), lambda c: c.diff(dim=0, prepend=c[:1])),
        "middle column": (lambda p: torch.cat([p, p.narrow(2, 0, 1), p], 2), lambda c: torch.cat([c, c[:, :1], c], 1)),
    }[case]
    _assert_samples_and_grads(f(pair), [ref(c) for c in cs], cs)


def _assert_samples_and_grads(out, refs, leaves):
    """``out`` equals the per-sample ``refs`` exactly, and ``Σ out²``'s gradients theirs."""
    for a, r in zip(out.unbind(), refs):
        assert torch.equal(a, r)
    got = torch.autograd.grad((out * out).sum(), leaves)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_cat_back_to_the_sizes_along_either_dim_of_a_square_pair():
    """Pieces of a square pair sliced along dim 1 and joined back to each sample's own size, then
    the same slices along dim 2 joined: both outputs have the pair's partition and their pieces
    the same extents along the dim (``torch.gradient``'s one-sided ends and central differences);
    the second join must not reuse the first's row map."""
    g = torch.Generator().manual_seed(0)
    cs = [torch.randn(k, k, 2, dtype=torch.float64, generator=g, requires_grad=True) for k in (3, 2, 0, 5)]
    pair = mj.as_nested_tensor(cs, ragged_dims=(1, 2))

    def join(t, d):
        h = (slice(None),) * d
        return torch.cat([t[h + (slice(1, 2),)], t[h + (slice(2, None),)] * 2, t[h + (slice(-1, None),)] * 3], d)

    for d in (1, 2, 1):
        _assert_samples_and_grads(join(pair, d), [join(c, d - 1) for c in cs], cs)

# ----------------------------------------------------------------------------- non-constant pads
_MODES = ("reflect", "replicate", "circular")


def _batch_of_one(pad, mode):
    return lambda c: F.pad(c[None], pad, mode=mode)[0]


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_constant_pad_of_ragged_dims_pads_each_sample_as_a_batch_of_one(mode, dtype):
    """Tokens ``(B, j0, C)`` padded along j0 with four pad values, a ``(B, j0)`` batch with two, a
    pair ``(B, j0, j0, C)`` along both with six: the ranks a dense batch takes for these lengths
    (dense refuses them on an unbatched sample), each sample as dense pads ``(1, …)``."""
    g = torch.Generator().manual_seed(4)
    lengths = (3, 2, 5) if mode != "circular" else (3, 1, 5)
    tokens = [torch.randn(n, 4, generator=g, dtype=dtype) for n in lengths]
    check(lambda x: F.pad(x, (0, 0, 1, 1), mode=mode), _batch_of_one((0, 0, 1, 1), mode), tokens, (1,))
    check(lambda x: F.pad(x, (1, 2, 1, 1), mode=mode), _batch_of_one((1, 2, 1, 1), mode), tokens, (1,))
    rows = [t[:, 0] for t in tokens]
    check(lambda x: F.pad(x, (1, 1), mode=mode), _batch_of_one((1, 1), mode), rows, (1,))
    pairs = [torch.randn(n, n, 2, generator=g, dtype=dtype) for n in lengths]
    check(lambda x: F.pad(x, (0, 0, 1, 1, 1, 1), mode=mode), _batch_of_one((0, 0, 1, 1, 1, 1), mode), pairs, (1, 2))


@pytest.mark.parametrize("mode", _MODES)
def test_non_constant_pad_refuses_what_a_dense_batch_refuses(mode):
    """Pad lengths a dense batch of one refuses (six values on a ``(1, n, C)`` sample, two on a
    ``(1, S, C, n)`` one): dense's error, naming the sample; an empty sample where dense refuses
    its mode's pad of an empty dim."""
    g = torch.Generator().manual_seed(5)
    tokens = [torch.randn(n, 4, generator=g) for n in (3, 2, 4)]
    check(lambda x: F.pad(x, (1, 1, 1, 1, 0, 0), mode=mode), _batch_of_one((1, 1, 1, 1, 0, 0), mode), tokens, (1,))
    lead = [torch.randn(2, 3, n, generator=g) for n in (3, 4)]
    check(lambda x: F.pad(x, (1, 1), mode=mode), _batch_of_one((1, 1), mode), lead, (3,))
    with pytest.raises(NotImplementedError, match="sample 0"):
        F.pad(mj.nested_tensor(tokens), (1, 1, 1, 1, 0, 0), mode=mode)
    empty = [torch.randn(n, 4, generator=g) for n in (3, 0, 4)]
    check(lambda x: F.pad(x, (0, 0, 1, 1), mode=mode), _batch_of_one((0, 0, 1, 1), mode), empty, (1,))


# --------------------------------------------------------------------------- static dims only: the values' own op
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bool])
def test_constant_pad_of_static_dims_after_the_ragged_ones(dtype):
    """``F.pad`` of only static dims after every ragged dim pads the packed values: per sample as
    dense (a crop by a negative pad, two dims at once, the fill value, every dtype), gradients for
    floats, and under ``torch.compile(fullgraph=True)`` one graph over new lengths (it needs no
    host sizes; it was a graph break)."""
    g = torch.Generator().manual_seed(0)
    fill = True if dtype == torch.bool else 3
    for pad in [(1, 2), (-1, 2), (2, 0, 1, 1)]:
        for ls in [(3, 0, 2), (1, 4, 2)]:
            comps = [(torch.randn(n, 3, 5, generator=g, dtype=torch.float64) * 3).to(dtype) for n in ls]
            per_sample_check(lambda x: F.pad(x, pad, value=fill), R(comps, (1,)), ref=lambda c: F.pad(c, pad, value=fill),
                             grad=dtype.is_floating_point)
            pair = [(torch.randn(n, n, 5, generator=g, dtype=torch.float64) * 3).to(dtype) for n in ls]
            per_sample_check(lambda x: F.pad(x, pad[:2], value=fill), R(pair, (1, 2)), ref=lambda c: F.pad(c, pad[:2], value=fill),
                             grad=dtype.is_floating_point)
    if dtype.is_floating_point:
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        cc = CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda x: F.pad(x * 2, (1, 2), value=0.5), backend=cc, fullgraph=True)
        for ls in [(3, 0, 2), (5, 1, 4)]:
            x = mj.nested_tensor([torch.randn(n, 4, dtype=dtype) for n in ls], requires_grad=True)
            out = f(x)
            for o, c in zip(out.unbind(), x.unbind()):
                torch.testing.assert_close(o, F.pad(c.detach() * 2, (1, 2), value=0.5))
            gx, = torch.autograd.grad((out.values() ** 2).sum(), x)
            torch.testing.assert_close(gx.values(), 8 * x.values().detach())
        assert cc.frame_count == 1


def test_repeat_and_tile_of_static_dims_trace():
    """``repeat`` / ``tile`` that repeat static dims only repeat the packed values: per sample as
    dense (two static dims, one ragged dim between), gradients, and under
    ``torch.compile(fullgraph=True)`` one graph over new lengths (a graph break before)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    g = torch.Generator().manual_seed(0)
    for ls in [(3, 0, 2), (1, 4, 2)]:
        comps = [torch.randn(2, n, 3, generator=g, dtype=torch.float64) for n in ls]  # (B, 2, j0, 3)
        per_sample_check(lambda x: x.repeat(1, 2, 1, 3), R(comps, (2,)), ref=lambda c: c.repeat(2, 1, 3))
        per_sample_check(lambda x: x.tile((3, 1, 2)), R(comps, (2,)), ref=lambda c: c.tile((3, 1, 2)))
    torch._dynamo.reset()
    cc = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x: (x * 2).repeat(1, 1, 3), backend=cc, fullgraph=True)
    for ls in [(3, 0, 2), (5, 1, 4)]:
        x = mj.nested_tensor([torch.randn(n, 4, dtype=torch.float64) for n in ls], requires_grad=True)
        out = f(x)
        for o, c in zip(out.unbind(), x.unbind()):
            torch.testing.assert_close(o, (c.detach() * 2).repeat(1, 3))
        gx, = torch.autograd.grad(out.values().sum(), x)
        torch.testing.assert_close(gx.values(), torch.full_like(x.values(), 6.0))
    assert cc.frame_count == 1
