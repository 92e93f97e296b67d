"""Reductions over ragged dims sample by sample (NOTE [ Reductions sample by sample ] in
ops/reductions/reduce.py): ``sum`` / ``mean`` / ``amax`` / ``amin`` (and what builds on them:
``var``), ``logsumexp`` and the arg-extremes (``argmax`` / ``argmin``, ``max(dim)`` /
``min(dim)``'s indices) over ragged dims of long samples run dense torch's own reduction on every
sample's component. Values and gradients bit-equal to the dense op per sample (float32 and
float64, every layout, with static dims reduced too), on the eager values path and the general
path; empty extents and B = 0; second order; no leakage; writes after the reduction; the rule
that picks the form; and the traced (compiled) form, which keeps the segment reduction."""

from __future__ import annotations

import contextlib

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.kernels import dense_along as da
from torch_multijagged.ops.reductions import reduce as red

from _reference import assert_close, general_path
from _structures import bit_equal, empty_aware, packed_args

LENGTHS = (5, 0, 7, 1, 3)  # a zero-length sample, a sample of one
# name -> (ragged dims, component shape of length n)
LAYOUTS = {
    "seq": ((1,), lambda n: (n, 3)),
    "pair": ((1, 2), lambda n: (n, n, 2)),
    "rect": ((1, 2), lambda n: (n, n // 2 + 1, 2)),
    "static_lead": ((2,), lambda n: (2, n, 3)),
    "cube": ((1, 2, 3), lambda n: (n, 2 if n else 0, n // 2 + 1, 2)),
}
# layout -> dims of the component (no batch dim) to reduce: each touches a ragged dim
DIMS = {
    "seq": [(0,), (0, 1)],
    "pair": [(0,), (1,), (0, 1), (1, 2), (0, 1, 2)],
    "rect": [(0,), (1,), (0, 1), (0, 2)],
    "static_lead": [(1,), (0, 1), (1, 2)],
    "cube": [(0,), (1,), (2,), (0, 2), (1, 2, 3), (0, 1, 2)],
}
KINDS = {
    "sum": lambda t, d: t.sum(d),
    "mean": lambda t, d: t.mean(d),
    "amax": lambda t, d: t.amax(d),
    "amin": lambda t, d: torch.amin(t, d),
}
CASES = [(lay, d) for lay, ds in DIMS.items() for d in ds]


@contextlib.contextmanager
def form(which: str):
    """Force the per-sample form (``"sample"``) or the segment reduction (``"segment"``)."""
    names = ("SUM_ROWS", "SUM_ELEMENTS", "SUM_TOTAL", "SUM_ROW_MAX", "EXTREME_ELEMENTS", "EXTREME_SAMPLES")
    prev = [getattr(red, n) for n in names]
    values = (0, 0, 0, 10**9, 0, 10**9) if which == "sample" else (10**9, 10**9, 10**9, 0, 10**9, -1)
    for n, v in zip(names, values):
        setattr(red, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, prev):
            setattr(red, n, v)


@contextlib.contextmanager
def spy(monkeypatch):
    """The reductions ``kernels.dense_along.reduce_by_sample`` ran (their kinds)."""
    calls: list[str] = []
    real = da.reduce_by_sample

    def counted(values, sizes, counts, reduced, vdims, kind, empty):
        calls.append(kind)
        return real(values, sizes, counts, reduced, vdims, kind, empty)

    monkeypatch.setattr(da, "reduce_by_sample", counted)
    yield calls


def _comps(layout: str, dtype, seed: int = 0, lengths=LENGTHS, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(LAYOUTS[layout][1](n), generator=g, dtype=torch.float64) * 2 for n in lengths]
    return [(c.round() if ties else c).to(dtype) for c in out]


def _ref(kind: str, d):
    """Dense's reduction of a component; amax / amin over an empty extent: the empty rule's value."""
    return empty_aware(lambda t: KINDS[kind](t, d), kind, d)


def _nested(comps, layout, requires_grad=False):
    return mj.nested_tensor(comps, ragged_dims=LAYOUTS[layout][0], requires_grad=requires_grad)


def _batch_dims(d):
    return tuple(e + 1 for e in d)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layout,d", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_values_and_gradients_bit_equal_per_sample(layout, d, kind, monkeypatch):
    """Each sample's result and gradient are dense torch's bit for bit (ties share the gradient
    of amax / amin as dense's), on the values path and the general path, float32 and float64."""
    with form("sample"), spy(monkeypatch) as calls:
        for dtype in (torch.float32, torch.float64):
            comps = _comps(layout, dtype, ties=kind in ("amax", "amin"))
            grads = None
            for path in (contextlib.nullcontext, general_path):
                with path():
                    x = _nested(comps, layout, requires_grad=True)
                    out = KINDS[kind](x, _batch_dims(d))
                    outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
                    if grads is None:
                        grads = [torch.randn(o.shape, dtype=dtype, generator=torch.Generator().manual_seed(i))
                                 for i, o in enumerate(outs)]
                    gx, = torch.autograd.grad(outs, x, grads)
                for i, (c, o, g) in enumerate(zip(comps, outs, grads)):
                    if layout == "static_lead" and kind in ("sum", "mean"):
                        # the values hold a sample's rows ragged dim first, a permuted layout of
                        # this component: a sum adds in another order (as over ``x.unbind()[i]``)
                        assert_close(o, _ref(kind, d)(c), f"{dtype} {path.__name__}: sample {i}'s value",
                                     rtol=1e-6, atol=1e-6)
                    else:
                        assert bit_equal(o, _ref(kind, d)(c)), f"{dtype} {path.__name__}: sample {i}'s value"
                    if c.numel() == 0:
                        continue
                    leaf = c.clone().requires_grad_()
                    want, = torch.autograd.grad(KINDS[kind](leaf, d), leaf, g)
                    assert bit_equal(gx.unbind()[i], want), f"{dtype} {path.__name__}: sample {i}'s gradient"
    assert calls, "the per-sample form did not run"


@pytest.mark.parametrize("which", ["sample", "segment"])
@pytest.mark.parametrize("kind", list(KINDS) + ["logsumexp", "var"])
def test_both_forms_match_dense_with_keepdim_and_static_dims(kind, which):
    """keepdim, a static dim reduced with the ragged ones, the composites built on the forms."""
    fn = {"var": lambda t, d, keepdim: t.var(d, keepdim=keepdim)}.get(kind, getattr(torch, kind))
    with form(which):
        for layout, d, keep in [("pair", (1,), True), ("pair", (0, 2), False), ("static_lead", (0, 1), True),
                                ("cube", (1, 3), False)]:
            comps = _comps(layout, torch.float64, seed=1, lengths=(4, 2, 3))
            x = _nested(comps, layout, requires_grad=True)
            out = fn(x, _batch_dims(d), keepdim=keep)
            leaves = [c.clone().requires_grad_() for c in comps]
            refs = [fn(c, d, keepdim=keep) for c in leaves]
            outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
            for o, r in zip(outs, refs):
                assert_close(o, r, f"{layout} {d}")
            ga, = torch.autograd.grad(sum((o * o).sum() for o in outs), x)
            gb = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
            for a, b in zip(ga.unbind(), gb):
                assert_close(a, b, f"{layout} {d} gradient")


@pytest.mark.parametrize("kind", list(KINDS))
def test_long_samples_take_the_per_sample_form_and_equal_dense_bit_for_bit(kind, monkeypatch):
    """At the default rule, long samples (a pair of 60-80 rows a side) run sample by sample:
    ``z.sum((1, 2))`` and ``z.mean(-2)`` are dense's float32 sums bit for bit (a segment
    reduction adds in another order); short ones (tokens of 3-8 rows, B = 32) keep the
    segment reduction."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, n, 64, generator=g) for n in (60, 80, 0, 71)]
    with spy(monkeypatch) as calls:
        z = mj.nested_tensor(comps, requires_grad=True)
        for dims, dense in (((1, 2), (0, 1)), ((2,), (1,))):
            out = KINDS[kind](z, dims)
            outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
            for i, c in enumerate(comps):
                assert bit_equal(outs[i], _ref(kind, dense)(c)), f"{dims}: sample {i}"
        assert len(calls) == 2
        short = mj.nested_tensor([torch.randn(3 + i % 6, 16, generator=g) for i in range(32)])
        KINDS[kind](short, 1)
        assert len(calls) == 2, "short samples took the per-sample form"


@pytest.mark.parametrize("which", ["sample", "segment"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_second_order(kind, which):
    """gradgradcheck of ``f(x)²`` w.r.t. the packed values (and the output gradient); an empty
    sample for ``sum`` only (a mean of nothing is nan, an amax of nothing the lowest value, whose
    square overflows: no finite difference checks them)."""
    for layout, d in [("pair", (1,)), ("pair", (0, 1)), ("cube", (0, 2))]:
        comps = _comps(layout, torch.float64, seed=2, lengths=(3, 0 if kind == "sum" else 1, 4))
        v, off, sizes = packed_args(comps, LAYOUTS[layout][0])

        def f(v):
            out = KINDS[kind](mj.from_packed(v, off, sizes, LAYOUTS[layout][0]), _batch_dims(d)) ** 2
            return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

        with form(which):
            assert torch.autograd.gradgradcheck(f, (v.requires_grad_(),)), f"{layout} {d}"


@pytest.mark.parametrize("which", ["sample", "segment"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_no_leakage(kind, which):
    """Changing one sample leaves every other sample's result and gradient bit-identical."""
    for layout, d in [("pair", (1, 2)), ("pair", (1,)), ("cube", (1, 3)), ("seq", (0,))]:
        comps = _comps(layout, torch.float32, seed=4)
        res = []
        with form(which):
            for k in (1.0, 3.0):
                cs = [c.clone() for c in comps]
                cs[2] = cs[2] * k - 1
                x = _nested(cs, layout, requires_grad=True)
                out = KINDS[kind](x, _batch_dims(d))
                res.append((out.detach(), torch.autograd.grad((out * out).sum(), x)[0]))
        dense = not isinstance(res[0][0], mj.MultiJaggedTensor)
        for i in (0, 1, 3, 4):
            a, b = (res[0][0][i], res[1][0][i]) if dense else (res[0][0].unbind()[i], res[1][0].unbind()[i])
            assert bit_equal(a, b), f"{layout} {d}: sample {i}'s value"
            assert bit_equal(res[0][1].unbind()[i], res[1][1].unbind()[i]), f"{layout} {d}: sample {i}'s gradient"


def test_empty_extents_and_empty_batch():
    """An empty reduced extent with other extents kept gives the empty rule's value (sum 0, mean
    nan, amax the lowest value) and no gradient; all-empty batches and B = 0 keep dense's shapes."""
    comps = [torch.randn(3, 0, 2), torch.randn(2, 4, 2), torch.randn(0, 3, 2)]
    with form("sample"):
        x = mj.nested_tensor(comps, ragged_dims=(1, 2), requires_grad=True)
        for kind in KINDS:
            out = KINDS[kind](x, (2,))
            for i, c in enumerate(comps):
                assert bit_equal(out.unbind()[i], _ref(kind, (1,))(c)), f"{kind}: sample {i}"
            g, = torch.autograd.grad(out.values().sum(), x)
            assert g.values().shape == x.values().shape
        for lengths in ((0, 0), ()):
            y = mj.nested_tensor([torch.zeros(n, n, 2) for n in lengths] or [torch.zeros(0, 0, 2)])
            y = y if lengths else y[:0]
            assert y.sum((1, 2)).shape == (len(lengths), 2)
            assert y.mean(2).values().shape == (0, 2)


def test_in_place_write_after_a_sum_keeps_its_backward_and_after_amax_raises_as_dense():
    """The sum saves no values (dense ``sum`` saves nothing): ``y -= y.mean(1, keepdim=True)``
    differentiates. ``amax`` saves its input and result, as dense's: a write into the input
    afterwards makes the backward raise."""
    comps = _comps("pair", torch.float64, seed=5, lengths=(3, 4))
    with form("sample"):
        x = _nested(comps, "pair", requires_grad=True)
        y = x * 1.0
        y -= y.mean(1, keepdim=True)
        g, = torch.autograd.grad((y * y).sum(), x)
        for gi, c in zip(g.unbind(), comps):
            leaf = c.clone().requires_grad_()
            t = leaf * 1.0
            t = t - t.mean(0, keepdim=True)
            want, = torch.autograd.grad((t * t).sum(), leaf)
            assert_close(gi, want)
        y = x * 1.0
        m = y.amax(2)
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(m.sum(), x)


def test_compiled_reduction_keeps_the_segment_form(monkeypatch):
    """Traced, no host sizes: the segment reduction, one graph, the same values."""
    comps = _comps("pair", torch.float32, seed=6, lengths=(4, 2, 3))
    x = _nested(comps, "pair")
    with form("sample"), spy(monkeypatch) as calls:
        out = torch.compile(lambda t: t.sum((1, 2)) + t.amax(2).sum(1), backend="aot_eager", fullgraph=True)(x)
        assert not calls
    for o, c in zip(out.unbind(0), comps):
        assert_close(o, c.sum((0, 1)) + c.amax(1).sum(0), rtol=1e-5, atol=1e-5)


ARG_KINDS = {
    "argmax": lambda t, d, keepdim: t.argmax(d, keepdim=keepdim),
    "argmin": lambda t, d, keepdim: torch.argmin(t, d, keepdim=keepdim),
    "max": lambda t, d, keepdim: t.max(d, keepdim=keepdim),
    "min": lambda t, d, keepdim: torch.min(t, d, keepdim=keepdim),
}


@pytest.mark.parametrize("which", ["sample", "segment"])
@pytest.mark.parametrize("kind", list(ARG_KINDS))
@pytest.mark.parametrize("layout,d", [(lay, d) for lay, ds in DIMS.items() for d in ds if len(d) == 1],
                         ids=lambda v: str(v))
def test_arg_extremes_equal_dense_per_sample(layout, d, kind, which, monkeypatch):
    """``argmax`` / ``argmin`` and the indices of ``max(dim)`` / ``min(dim)`` over a ragged dim are
    dense's per sample in both forms: the first extreme, ties (rounded values) and NaN (which
    counts as the extreme) included; integers too. An empty reduced extent gives index 0 (and
    the empty rule's value), as torch.jagged; dense torch refuses it."""
    real, calls = da.arg_extreme_by_sample, []
    monkeypatch.setattr(da, "arg_extreme_by_sample", lambda *a: calls.append(a[-1]) or real(*a))
    for dtype in (torch.float32, torch.int64):
        comps = _comps(layout, torch.float64, seed=7, ties=True)
        if dtype.is_floating_point:
            for c in comps:
                if c.numel() > 4:
                    c.view(-1)[[1, 3]] = float("nan")
        comps = [c.to(dtype) for c in comps]
        x = _nested(comps, layout)
        for keep in (False, True):
            with form(which):
                out = ARG_KINDS[kind](x, d[0] + 1, keep)
            pairs = zip(*(o.unbind() if isinstance(o, mj.MultiJaggedTensor) else o.unbind(0)
                          for o in (out if isinstance(out, tuple) else (out,))))
            for i, (c, got) in enumerate(zip(comps, pairs)):
                if c.shape[d[0]] == 0:
                    assert not got[-1].any(), f"sample {i}: an empty extent's index"
                    continue
                want = ARG_KINDS[kind](c, d[0], keep)
                want = tuple(want) if isinstance(want, tuple) else (want,)
                for a, b in zip(got, want):
                    assert_close(a, b, f"{dtype} keepdim={keep}: sample {i}", rtol=0, atol=0)
    assert bool(calls) == (which == "sample"), calls


@pytest.mark.parametrize("layout,d", [("seq", (0,)), ("pair", (1,)), ("pair", (0, 1)), ("rect", (0, 2)),
                                      ("cube", (1, 3))])
def test_logsumexp_per_sample_is_dense_bit_for_bit(layout, d, monkeypatch):
    """Long samples' ``logsumexp`` over ragged dims is dense torch's own per sample (one call,
    not the shifted segment form): each value bit-equal, -inf entries and an all -inf slice
    included, an empty extent -inf; gradients as dense's (an all -inf slice's NaN included)."""
    comps = _comps(layout, torch.float32, seed=8)
    for c in comps:
        if c.numel() > 4:
            c.view(-1)[:3] = float("-inf")
    with form("sample"), spy(monkeypatch) as calls:
        x = _nested(comps, layout, requires_grad=True)
        out = x.logsumexp(_batch_dims(d))
    assert "logsumexp" in calls
    outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
    grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(outs)]
    gx, = torch.autograd.grad(outs, x, grads)
    for i, (c, o, g) in enumerate(zip(comps, outs, grads)):
        leaf = c.clone().requires_grad_()
        want = leaf.logsumexp(d)
        assert bit_equal(o, want.detach()), f"sample {i}'s value"
        if c.numel():
            gw, = torch.autograd.grad(want, leaf, g)
            assert_close(gx.unbind()[i], gw, f"sample {i}'s gradient", rtol=1e-6, atol=1e-6)
