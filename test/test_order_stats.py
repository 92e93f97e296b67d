"""Order statistics along ragged and static dims (ops/reductions/order.py, NOTE [ Order statistics
along ragged dims ]; index maps in kernels/along.py; the structure rule in NOTE [ Indexing along
ragged dims ]): ``sort`` / ``argsort`` / ``topk`` / ``kthvalue`` / ``median`` / ``nanmedian`` /
``cummax`` / ``cummin``.

Every case is checked against the per-sample reference — unbind the batch, apply the dense op to
each component along dim ``d - 1`` — for shapes, dtypes, values (NaN-aware, exact), indices and the
structure rule (``kthvalue`` / ``median`` remove the dim, ``topk`` makes it static of size k, the
others keep it ragged with the input's nested int), with gradients of every leaf in float64,
zero-length samples, B = 0, three ragged dims, every dtype the dense op takes, ties and NaNs.

Tie order: eagerly (NOTE [ Dense ops on segments ], per sample or per length) every index is
compared exactly with dense torch's own on the sample — ``sort`` with or without ``stable``,
``topk`` sorted or not, the tied element ``kthvalue`` / ``median`` return. On the index-map path
(the one ``torch.compile`` traces; forced here with ``segment_path("index_map")``) ties keep their
order: ``sort`` / ``argsort`` indices are compared with dense ``stable=True``, ``topk``'s with the
first k of a stable sort, and ``kthvalue`` / ``median`` / ``nanmedian`` indices must point to an
element equal to the value. Where dense raises for a sample (median of an empty dim, k larger than
a sample), ours raises the same type naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import given, strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj
from torch_multijagged.ops.reductions.segment_ops import segment_path

from _reference import (
    ALL_LAYOUTS,
    DTYPES,
    Comps,
    Structure,
    any_structure,
    assert_close,
    build,
    few,
    grid,
    seeds,
    structures,
)
from _structures import bit_equal, comps_for, packed_args, per_sample_outputs

F64 = torch.float64
NAN = math.nan


# ----------------------------------------------------------------------------- the ops
@dataclass(frozen=True)
class Op:
    """``ours(x, dim, p)`` on a multi_jagged tensor and ``ref(component, dim, p)`` on a dense one
    (``p``: the drawn arguments); ``kind``: how indices are compared (``exact``, ``topk``,
    ``pick``); ``shape``: what happens to the dim (``keep``, ``static`` of size k, ``remove``)."""

    ours: Callable
    ref: Callable
    kind: str
    shape: str
    k: str = ""  # "topk" / "kth": the op takes k; "" otherwise (median needs a non-empty dim)


# How the eager ops run (NOTE [ Dense ops on segments ]): the rule, or forced per sample / per length.
EAGER_PATHS = (None, "per_sample", "per_length")


def _index_map(p) -> bool:
    return p.get("path") == "index_map"


def _sort(t, d, p):
    if p["form"] == 0:
        return torch.sort(t, d, p["descending"])
    if p["form"] == 1:
        return t.sort(dim=d, descending=p["descending"])
    return torch.sort(t, stable=True, dim=d, descending=p["descending"])


def _argsort(t, d, p):
    if p["form"] == 0:
        return torch.argsort(t, d, p["descending"])
    return t.argsort(dim=d, descending=p["descending"], stable=True)


def _topk(t, d, p):
    if p["form"] == 0:
        return t.topk(p["k"], d, largest=p["largest"], sorted=p["sorted"])
    return torch.topk(t, p["k"], dim=d, largest=p["largest"], sorted=p["sorted"])


def _kthvalue(t, d, p):
    if p["form"] == 0:
        return t.kthvalue(p["k"], d, p["keepdim"])
    return torch.kthvalue(t, p["k"], dim=d, keepdim=p["keepdim"])


def _median(name):
    def f(t, d, p):
        if p["form"] == 0:
            return getattr(t, name)(d, p["keepdim"])
        return getattr(torch, name)(t, dim=d, keepdim=p["keepdim"])

    return f


def _scan(name):
    def f(t, d, p):
        return getattr(t, name)(d) if p["form"] == 0 else getattr(torch, name)(t, dim=d)

    return f


OPS = {
    # stable=True only where ours is asked for it (form 2 of sort, form 1 of argsort), or on the
    # index-map path, which is always stable
    "sort": Op(_sort, lambda c, d, p: torch.sort(c, dim=d, descending=p["descending"], stable=p["form"] == 2 or _index_map(p)),
               "exact", "keep"),
    "argsort": Op(_argsort, lambda c, d, p: torch.argsort(c, dim=d, descending=p["descending"], stable=p["form"] == 1 or _index_map(p)),
                  "exact", "keep"),
    "topk": Op(_topk, lambda c, d, p: torch.topk(c, p["k"], d, p["largest"], p["sorted"]), "topk", "static", "topk"),
    "kthvalue": Op(_kthvalue, lambda c, d, p: torch.kthvalue(c, p["k"], d, p["keepdim"]), "pick", "remove", "kth"),
    "median": Op(_median("median"), lambda c, d, p: torch.median(c, d, p["keepdim"]), "pick", "remove"),
    "nanmedian": Op(_median("nanmedian"), lambda c, d, p: torch.nanmedian(c, d, p["keepdim"]), "pick", "remove"),
    "cummax": Op(_scan("cummax"), lambda c, d, p: torch.cummax(c, d), "exact", "keep"),
    "cummin": Op(_scan("cummin"), lambda c, d, p: torch.cummin(c, d), "exact", "keep"),
}


def _params(op: Op, data, k_max: int = 3) -> dict:
    """Arguments of ``op``: spelling, ``descending`` / ``largest`` / ``keepdim``, and k."""
    p = {
        "form": data.draw(st.integers(0, 2), label="form"),
        "descending": data.draw(st.booleans(), label="descending"),
        "largest": data.draw(st.booleans(), label="largest"),
        "keepdim": data.draw(st.booleans(), label="keepdim"),
        "sorted": data.draw(st.booleans(), label="sorted"),
        "path": data.draw(st.sampled_from(EAGER_PATHS), label="path"),
    }
    if op.k == "topk":  # k = 0 is valid for dense topk (an empty dim)
        p["k"] = data.draw(st.sampled_from([1, 2, 3, 0]).filter(lambda k: k <= k_max), label="k")
    elif op.k == "kth":
        p["k"] = data.draw(st.integers(1, max(1, k_max)), label="k")
    return p


def _min_extent(op: Op, p: dict) -> int:
    """The smallest extent along the dim for which dense torch does not raise."""
    return p["k"] if op.k else (1 if op.kind == "pick" else 0)


# ----------------------------------------------------------------------------- structures
def _extent_index(s: Structure, d: int) -> int:
    """Which entry of ``s.lengths`` rows sizes logical ragged dim ``d``."""
    return s.ragged_dims.index(d) if s.layout.free > 1 else 0


def _fit(s: Structure, d: int, at_least: int) -> Structure:
    """``s`` with every sample at least ``at_least`` long along ragged dim ``d``."""
    i = _extent_index(s, d)
    rows = tuple(tuple(max(v, at_least) if j == i else v for j, v in enumerate(r)) for r in s.lengths)
    return dataclasses.replace(s, lengths=rows)


def _resize(s: Structure, d: int, sample: int, size: int) -> Structure:
    """``s`` with sample ``sample`` of extent ``size`` along ragged dim ``d``."""
    i = _extent_index(s, d)
    rows = [list(r) for r in s.lengths]
    rows[sample][i] = size
    return dataclasses.replace(s, lengths=tuple(tuple(r) for r in rows))


def _ndim(s: Structure) -> int:
    return len(s.shapes.template) + 1


def _static_dims(s: Structure) -> list[int]:
    return [d for d in range(1, _ndim(s)) if d not in s.ragged_dims]


def _values(s: Structure, seed: int, ties: bool, nans: bool) -> Comps:
    """Components of ``s``: with ``ties``, multiples of 0.5 (small ints anyway for integer
    dtypes); with ``nans``, about one float element in five is NaN and one in ten each +inf and
    -inf."""
    comps = s.components(seed, ties=ties)
    if not (nans and s.dtype.is_floating_point):
        return comps
    g = torch.Generator().manual_seed(seed + 1)

    def special(c):
        u = torch.rand(c.shape, generator=g)
        c = torch.where(u < 0.2, torch.full_like(c, NAN), c)
        return torch.where((u >= 0.2) & (u < 0.3), torch.full_like(c, math.inf), torch.where(u >= 0.9, torch.full_like(c, -math.inf), c))

    out = Comps(special(c) for c in comps)
    out.template, out.dtype = comps.template, comps.dtype
    return out


# ----------------------------------------------------------------------------- the check
def _pair(out):
    """``(values or None, indices)`` of an op's result."""
    return (out[0], out[1]) if isinstance(out, tuple) else (None, out)


def _same(actual, expected, what: str):
    assert_close(actual, expected, what, rtol=0, atol=0)  # shape, dtype, values; NaN == NaN


def _check_structure(o, x, d: int, op: Op, p: dict, what: str):
    """The structure rule: ragged dims other than ``d`` keep their nested ints (shifted down when
    ``d`` is removed); ``d`` itself keeps its nested int (``keep``), becomes static (``static``)
    or goes (``remove``; size 1 with keepdim); a dense ``(B, …)`` result when none is left."""
    removes = op.shape == "remove" and not p["keepdim"]
    kept = [r for r in x.ragged_dims if op.shape == "keep" or r != d]
    mapped = [r - (r > d) if removes else r for r in kept]
    assert o.dim() == x.dim() - removes, f"{what}: rank {o.dim()} for input {tuple(x.shape)}"
    if not kept:
        assert not isinstance(o, mj.MultiJaggedTensor), f"{what}: expected a dense (B, …) result, got {o!r}"
        assert o.shape[0] == x.shape[0]
        return
    assert isinstance(o, mj.MultiJaggedTensor), f"{what}: expected a multi_jagged result, got {type(o).__name__}"
    assert o.ragged_dims == tuple(mapped), f"{what}: ragged dims {o.ragged_dims} != {tuple(mapped)}"
    for r, r2 in zip(kept, mapped):
        assert o.shape[r2] == x.shape[r], f"{what}: dim {r2} is {o.shape[r2]}, not the input's {x.shape[r]}"


def _probe(s: Structure, op: Op, d: int, p: dict):
    """The dense op on a component of ``s`` with every ragged extent ``max(k, 1)``: the shape and
    dtype a B = 0 result must have past the batch dim."""
    n = max(p.get("k", 1), 1)
    c = torch.zeros(s.layout.shape(n, n, s.s, s.c, n), dtype=s.dtype)
    return _pair(op.ref(c, d - 1, p))


def _check_empty_batch(out, x, s: Structure, op: Op, d: int, p: dict):
    for o, like in zip(out, _probe(s, op, d, p)):
        if o is None:
            continue
        assert o.shape[0] == 0 and o.dtype == like.dtype, f"B = 0: {tuple(o.shape)} {o.dtype} vs {like.dtype}"
        assert o.dim() == like.dim() + 1
        ragged = o.ragged_dims if isinstance(o, mj.MultiJaggedTensor) else ()
        for j in range(1, o.dim()):
            if j not in ragged:
                assert o.shape[j] == like.shape[j - 1], f"B = 0: dim {j} is {o.shape[j]}, dense gives {like.shape[j - 1]}"
        if isinstance(o, mj.MultiJaggedTensor):
            assert o.unbind() == ()


def check(op: Op, s: Structure, comps, d: int, p: dict, seed: int = 0, neg: bool = False, grad: bool = True):
    """``op`` along logical dim ``d`` of the batch built from ``comps`` against the dense op along
    ``d - 1`` of every component (``neg``: ``d`` spelled as a negative dim, the same for both),
    on the path ``p["path"]`` names (NOTE [ Dense ops on segments ])."""
    if _index_map(p):
        p = dict(p, sorted=True)  # the index-map path always sorts topk's k
    with segment_path(p.get("path")):
        _check(op, s, comps, d, p, seed, neg, grad)


def _check(op: Op, s: Structure, comps, d: int, p: dict, seed: int, neg: bool, grad: bool):
    grad = grad and s.dtype == F64
    kind = op.kind if _index_map(p) and d in s.ragged_dims else "exact"
    x, leaves = build(comps, s.ragged_dims, requires_grad=grad)
    dim, ref_dim = (d - x.dim(), d - x.dim()) if neg else (d, d - 1)
    ref_leaves = [c.detach().clone().requires_grad_(grad) for c in comps]
    expected = []
    for i, c in enumerate(ref_leaves):
        try:
            expected.append(_pair(op.ref(c, ref_dim, p)))
        except Exception as e:  # dense raises for sample i: ours raises the same type, naming it
            with pytest.raises(type(e), match=rf"sample {i}\b"):
                op.ours(x, dim, p)
            return
    out = _pair(op.ours(x, dim, p))
    for o, what in zip(out, ("values", "indices")):
        if o is not None:
            _check_structure(o, x, d, op, p, what)
    if not comps:
        _check_empty_batch(out, x, s, op, d, p)
        return
    got_v = per_sample_outputs(out[0]) if out[0] is not None else [None] * len(comps)
    got_i = per_sample_outputs(out[1])
    same_indices = True
    for i, (c, (ev, ei), ov, oi) in enumerate(zip(ref_leaves, expected, got_v, got_i)):
        c = c.detach()
        if ev is not None:
            _same(ov, ev, f"values of sample {i}")
        assert oi.shape == ei.shape and oi.dtype == ei.dtype, f"indices of sample {i}: {tuple(oi.shape)} {oi.dtype}"
        if kind == "exact":
            _same(oi, ei, f"indices of sample {i}")
        elif kind == "topk":
            _same(c.gather(ref_dim, oi), ov, f"topk indices of sample {i} select its values")
            if d in s.ragged_dims:  # the index-map path is stable (NOTE): the first k of a stable sort
                first = torch.sort(c, dim=ref_dim, descending=p["largest"], stable=True).indices.narrow(ref_dim, 0, p["k"])
                _same(oi, first, f"topk indices of sample {i} (stable)")
        else:  # pick: the index points to an element equal to the value
            at = oi if p["keepdim"] else oi.unsqueeze(ref_dim)
            picked = c.gather(ref_dim, at)
            _same(picked if p["keepdim"] else picked.squeeze(ref_dim), ov, f"{op.kind} indices of sample {i}")
        same_indices = same_indices and torch.equal(oi, ei)
    if not grad or out[0] is None:
        return
    # Gradients of every leaf under a random cotangent. Where ours and dense picked different
    # (equal-valued) elements on ties, the reference is the dense gather at our indices, which
    # the checks above proved select the values.
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(ev.shape, generator=gen, dtype=F64) for ev, _ in expected]
    if same_indices:
        ref_vals = [ev for ev, _ in expected]
    else:
        ref_vals = []
        for c, oi in zip(ref_leaves, got_i):
            at = oi if op.shape != "remove" or p["keepdim"] else oi.unsqueeze(ref_dim)
            v = c.gather(ref_dim, at)
            ref_vals.append(v if op.shape != "remove" or p["keepdim"] else v.squeeze(ref_dim))
    g_ours = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got_v, cots)), leaves, allow_unused=True)
    g_ref = torch.autograd.grad(sum((e * w).sum() for e, w in zip(ref_vals, cots)), ref_leaves, allow_unused=True)
    for i, (a, b, leaf) in enumerate(zip(g_ours, g_ref, ref_leaves)):
        z = torch.zeros_like(leaf)
        assert_close(z if a is None else a, z if b is None else b, f"grad of sample {i}")


# ----------------------------------------------------------------------------- per sample
@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_along_ragged_dim_per_sample(name, layout):
    """Along a ragged dim (any of the layout's, positive or negative), with zero-length samples
    where dense accepts them (along the dim for sort / argsort / cummax / cummin / topk(0), along
    the other ragged dims for every op), ties and NaNs, gradients in float64. (B = 0:
    ``test_empty_batch``; samples too short for the op: ``test_sample_too_short_raises_naming_it``.)"""
    op = OPS[name]

    @grid
    @given(structures(layout, min_batch=0), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(s.ragged_dims), label="dim")
        p = _params(op, data)
        s = _fit(s, d, _min_extent(op, p))
        comps = _values(s, seed, data.draw(st.booleans(), label="ties"), data.draw(st.booleans(), label="nans"))
        check(op, s, comps, d, p, seed, neg=data.draw(st.booleans(), label="neg"))

    run()


@pytest.mark.parametrize("name", [n for n in OPS if n not in ("cummax", "cummin")])
def test_index_map_path_per_sample(name):
    """The index-map path (``kernels/along.py``: ``segment_order``; the one ``torch.compile``
    traces), run eagerly: values and gradients as dense per sample, ties in their stable order
    (the module docstring), zero-length samples, every layout."""
    op = OPS[name]

    @few(16)
    @given(any_structure(ALL_LAYOUTS, min_batch=0), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(s.ragged_dims), label="dim")
        p = dict(_params(op, data), path="index_map")
        s = _fit(s, d, _min_extent(op, p))
        comps = _values(s, seed, data.draw(st.booleans(), label="ties"), data.draw(st.booleans(), label="nans"))
        check(op, s, comps, d, p, seed)

    run()


@pytest.mark.parametrize("name", OPS)
def test_along_static_dim_per_sample(name):
    """Along a static dim (C, or S of (B, S, j0, C) / (B, j0, S, j1, j2, C)): the dense op on the
    packed values, the ragged dims untouched (shifted when the dim is removed)."""
    op = OPS[name]

    @few(10)
    @given(any_structure(ALL_LAYOUTS, min_batch=0), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(_static_dims(s)), label="dim")
        size = s.layout.shape(1, 1, s.s, s.c, 1)[d - 1]
        p = _params(op, data, k_max=size)
        comps = _values(s, seed, data.draw(st.booleans(), label="ties"), data.draw(st.booleans(), label="nans"))
        check(op, s, comps, d, p, seed, neg=data.draw(st.booleans(), label="neg"))

    run()


def _dtype_cases():
    for name, op in OPS.items():
        for dtype in DTYPES:
            try:  # the dense op on a small tensor of this dtype: skip the dtypes it refuses
                op.ref(torch.zeros(3, 2, dtype=dtype), 0, {"form": 0, "descending": False, "largest": True, "keepdim": False, "k": 1, "sorted": True})
                marks = ()
            except (RuntimeError, TypeError, NotImplementedError) as e:
                marks = pytest.mark.skip(reason=f"dense {name} refuses {dtype}: {str(e).splitlines()[0][:80]}")
            yield pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.parametrize("name,dtype", list(_dtype_cases()))
def test_dtypes_per_sample(name, dtype):
    """Every dtype the dense op takes: the result dtypes (values: the input's, indices: int64)
    and values, with ties (small ints, bools) and NaNs for floats."""
    op = OPS[name]

    @few(4)
    @given(any_structure(ALL_LAYOUTS, min_batch=0, dtypes=(dtype,)), seeds, st.data())
    def run(s, seed, data):
        dims = s.ragged_dims if data.draw(st.integers(0, 3), label="ragged") else _static_dims(s)
        d = data.draw(st.sampled_from(dims), label="dim")
        size = s.layout.shape(1, 1, s.s, s.c, 1)[d - 1] if d not in s.ragged_dims else 3
        p = _params(op, data, k_max=size)
        if d in s.ragged_dims:
            s = _fit(s, d, _min_extent(op, p))
        comps = _values(s, seed, ties=True, nans=data.draw(st.booleans(), label="nans"))
        check(op, s, comps, d, p, seed)

    run()


# ----------------------------------------------------------------------------- dense raises
@pytest.mark.parametrize("name", ["topk", "kthvalue", "median", "nanmedian"])
def test_sample_too_short_raises_naming_it(name):
    """A sample with no element along the dim (median, kthvalue: IndexError) or fewer than k
    (topk, kthvalue: RuntimeError) raises what dense torch raises for it, naming the sample."""
    op = OPS[name]

    @few(10)
    @given(any_structure(ALL_LAYOUTS), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(s.ragged_dims), label="dim")
        p = _params(op, data)
        p["k"] = max(p.get("k", 1), 1)
        j = data.draw(st.integers(0, s.batch - 1), label="sample")
        s = _resize(_fit(s, d, p["k"]), d, j, data.draw(st.integers(0, p["k"] - 1), label="size"))
        check(op, s, _values(s, seed, ties=True, nans=False), d, p, seed)

    run()


@pytest.mark.parametrize("name", OPS)
def test_empty_batch(name):
    """B = 0 along every ragged and static dim of every layout: B = 0 results of the structure
    the rule gives, with the dtypes and static sizes dense torch gives for one sample (hypothesis
    draws B = 0 rarely, so every case is spelled out here)."""
    op = OPS[name]
    for layout in ALL_LAYOUTS:
        s = Structure(layout, (), 2, 3)
        for d in range(1, _ndim(s)):
            for keepdim in (False, True):
                p = {"form": 0, "descending": True, "largest": False, "keepdim": keepdim, "k": 2, "sorted": True}
                check(op, s, s.components(0), d, p)


def test_k_out_of_range_raises_naming_the_sample():
    """Regression: k = 0 for kthvalue and k < 0 for topk fit no sample: dense's RuntimeError for
    the first one (topk(-1) raised from a slice, without naming a sample); a zero-length sample
    in kthvalue is dense's IndexError (it was a RuntimeError)."""
    x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], ragged_dims=(1,))
    for fn in (lambda t: t.kthvalue(0, 1), lambda t: t.topk(-1, 1)):
        with pytest.raises(RuntimeError) as dense:
            fn(torch.ones(2, 3).unsqueeze(0))
        with pytest.raises(type(dense.value), match=r"out of range for sample 0\b"):
            fn(x)
    y = mj.nested_tensor([torch.ones(3, 2), torch.ones(0, 2), torch.ones(1, 2)], ragged_dims=(1,))
    with pytest.raises(IndexError):
        torch.kthvalue(torch.ones(0, 2), 1, 0)
    with pytest.raises(IndexError, match=r"kthvalue\(\).*non-zero size in sample 1\b"):
        y.kthvalue(1, 1)
    with pytest.raises(RuntimeError, match=r"kthvalue\(\).*k = 2 out of range for sample 2\b"):
        mj.nested_tensor([torch.ones(3, 2), torch.ones(2, 2), torch.ones(1, 2)], ragged_dims=(1,)).kthvalue(2, 1)


def test_empty_batch_and_all_empty_samples():
    """Regression: B = 0, or samples all empty along the dim (no packed rows): the results have
    dense's dtypes and static sizes (``reshape(0, -1)`` of the rows raised)."""
    b0 = mj.from_packed(torch.zeros(0, 2), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64), ragged_dims=(1,))
    v, i = b0.sort(1)
    assert v.shape[0] == 0 and v.shape[2] == 2 and v.dtype == torch.float32 and i.dtype == torch.int64
    assert b0.topk(2, 1).values.shape == (0, 2, 2)
    assert b0.median(1).values.shape == (0, 2) and b0.kthvalue(1, 1, keepdim=True).indices.shape == (0, 1, 2)
    e = mj.nested_tensor([torch.zeros(0, 2), torch.zeros(0, 2)], ragged_dims=(1,))
    assert [t.shape for t in e.cummax(1).values.unbind()] == [(0, 2), (0, 2)]
    assert e.argsort(1).shape == e.shape
    assert e.topk(0, 1).values.shape == (2, 0, 2)  # dense topk(0) of an empty dim: (0, 2)


# ----------------------------------------------------------------------------- no leakage
@pytest.mark.parametrize("name", OPS)
def test_no_cross_sample_leakage(name):
    """Changing sample j (values, or values and extents) leaves every output of sample i ≠ j
    bit-identical, and a loss on sample i alone has a zero gradient on every other sample."""
    op = OPS[name]

    @few(8)
    @given(any_structure(ALL_LAYOUTS, min_batch=2), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(s.ragged_dims), label="dim")
        p = _params(op, data)
        need = _min_extent(op, p)
        s = _fit(s, d, need)
        comps = _values(s, seed, ties=True, nans=data.draw(st.booleans(), label="nans"))
        j = data.draw(st.integers(0, s.batch - 1), label="j")
        new_len = data.draw(st.none() | st.integers(max(need, 1), 4), label="new_len")
        shape = list(comps[j].shape)
        if new_len is not None:
            for r in s.ragged_dims:
                shape[r - 1] = new_len
        other = Comps(comps)
        other[j] = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 5), dtype=F64) * 4 - 2
        outs = []
        for cs in (comps, other):
            x = mj.nested_tensor(list(cs), ragged_dims=s.ragged_dims)
            outs.append([per_sample_outputs(o) for o in _pair(op.ours(x, d, p)) if o is not None])
        for a, b in zip(*outs):
            for i in range(s.batch):
                if i != j:
                    assert bit_equal(a[i], b[i]), f"sample {i} changed when sample {j} did"
        if op.ours is _argsort:
            return
        i = data.draw(st.integers(0, s.batch - 1).filter(lambda k: k != j), label="i")
        x, leaves = build(comps, s.ragged_dims, requires_grad=True)
        oi = per_sample_outputs(_pair(op.ours(x, d, p))[0])[i]
        gs = torch.autograd.grad(torch.nan_to_num(oi).sum(), leaves, allow_unused=True)
        for k, g in enumerate(gs):
            if k != i and g is not None:
                assert bool((g == 0).all()), f"a loss on sample {i} has a gradient on sample {k}"

    run()


# ----------------------------------------------------------------------------- second order
GRADGRAD = {
    "sort_square_row": (comps_for([(2, 2, 2), (0, 0, 2), (3, 3, 2)], 1), (1, 2), lambda x: x.sort(-2, descending=True).values),
    "topk_rect": (comps_for([(2, 3, 2), (2, 0, 2), (3, 1, 2)], 2), (1, 2), lambda x: x.topk(2, 1).values),
    "cummax_seq": (comps_for([(3, 2), (0, 2), (4, 2)], 3), (1,), lambda x: x.cummax(1).values),
    "median_rect3_mid": (comps_for([(2, 2, 1, 2, 2), (3, 2, 2, 1, 2)], 4), (1, 3, 4), lambda x: x.median(3).values),
    "kthvalue_cube_keepdim": (comps_for([(2, 2, 2, 1), (3, 3, 3, 1)], 5), (1, 2, 3), lambda x: x.kthvalue(2, 2, keepdim=True).values),
}


@pytest.mark.parametrize("path", [None, "per_length", "index_map"], ids=str)
@pytest.mark.parametrize("name", GRADGRAD, ids=str)
def test_gradgradcheck(name, path):
    """Second order in float64 through the packed values (distinct values: no ties), on every path
    (cummax has no index-map path: there it runs eagerly as always)."""
    comps, rd, f = GRADGRAD[name]
    v, off, sizes = packed_args(comps, rd)

    def fn(v):
        with segment_path(path):
            out = f(mj.from_packed(v, off, sizes, rd))
        return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

    assert torch.autograd.gradcheck(fn, (v.requires_grad_(),))
    assert torch.autograd.gradgradcheck(fn, (v,))


# ----------------------------------------------------------------------------- inference mode
def test_inference_mode_gives_the_same_values():
    @few(5)
    @given(any_structure(ALL_LAYOUTS), seeds, st.data())
    def run(s, seed, data):
        d = data.draw(st.sampled_from(s.ragged_dims), label="dim")
        for name, op in OPS.items():
            p = _params(op, data)
            cs = _values(_fit(s, d, _min_extent(op, p)), seed, ties=True, nans=True)
            x = mj.nested_tensor(list(cs), ragged_dims=s.ragged_dims)
            eager = [per_sample_outputs(o) for o in _pair(op.ours(x, d, p)) if o is not None]
            with torch.inference_mode():
                xi = mj.nested_tensor(list(cs), ragged_dims=s.ragged_dims)
                inf = [per_sample_outputs(o) for o in _pair(op.ours(xi, d, p)) if o is not None]
            for a, b in zip(eager, inf):
                assert all(bit_equal(u, w) for u, w in zip(a, b)), name

    run()


# ----------------------------------------------------------------------------- compile
def test_compiled_sort_along_ragged_dim_is_one_graph():
    """``sort`` / ``argsort`` / ``topk`` / ``kthvalue`` / ``median`` along a ragged dim make no new
    extent: under torch.compile(fullgraph=True) one graph serves changing lengths, with eager's
    values, indices and gradients."""
    torch._dynamo.reset()

    def f(t):
        v, i = torch.sort(t * 2, dim=1, descending=True)
        top = t.topk(1, dim=1).values.sum((1, 2)) + t.kthvalue(1, dim=1).values.sum(-1) + t.median(1).values.sum(-1)
        return (v + i.to(v.dtype)).sum(-1) * 3 + t.argsort(1).sum(-1) + top.unsqueeze(1)

    cc = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cc, fullgraph=True)
    for seed, ns in enumerate(([3, 1, 4], [2, 5, 1], [4, 4, 2])):
        comps = comps_for([(n, 2) for n in ns], seed)
        x1, x2 = (mj.nested_tensor(comps, ragged_dims=(1,), requires_grad=True) for _ in range(2))
        out, ref = cf(x1), f(x2)
        assert bit_equal(out.values(), ref.values())
        (g1,), (g2,) = torch.autograd.grad(out.values().sum(), [x1]), torch.autograd.grad(ref.values().sum(), [x2])
        assert bit_equal(g1.values(), g2.values())
    assert cc.frame_count == 1
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- token pruning
@few(10)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.integers(1, 3), st.integers(0, 5), seeds, st.booleans())
def test_token_pruning_idiom(ns, c, k, seed, ties):
    """``x.gather(1, scores.argsort(1, descending=True)[:, :k, None].expand(-1, -1, C))``: the k
    best tokens of each sample (all of them when shorter), with x (B, j0, C) and scores (B, j0)
    built separately from the same lengths; values and gradients of x per sample."""
    g = torch.Generator().manual_seed(seed)
    xc = [torch.randn(n, c, generator=g, dtype=F64) for n in ns]
    sc = [(torch.randint(-2, 3, (n,), generator=g) if ties else torch.randn(n, generator=g)).to(F64) for n in ns]
    x, leaves = build(xc, (1,), requires_grad=True)
    scores = mj.nested_tensor(sc, ragged_dims=(1,))
    out = x.gather(1, scores.argsort(1, descending=True)[:, :k, None].expand(-1, -1, c))
    ref_leaves = [t.clone().requires_grad_() for t in xc]
    ref = [t.gather(0, s.argsort(dim=0, descending=True, stable=True)[:k, None].expand(-1, c)) for t, s in zip(ref_leaves, sc)]
    got = out.unbind()
    assert len(got) == len(ns)
    for i, (o, r) in enumerate(zip(got, ref)):
        _same(o, r, f"sample {i}")
    cots = [torch.randn(r.shape, generator=g, dtype=F64) for r in ref]
    ga = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, cots)), leaves, allow_unused=True)
    gb = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, cots)), ref_leaves, allow_unused=True)
    for i, (a, b, leaf) in enumerate(zip(ga, gb, xc)):
        z = torch.zeros_like(leaf)
        assert_close(z if a is None else a, z if b is None else b, f"grad of sample {i}")


@few(10)
@given(st.integers(0, 4), st.integers(1, 6), st.integers(1, 3), st.integers(0, 5), seeds)
def test_token_pruning_from_mask(b, n, c, k, seed):
    """``mj.from_mask(dense (B, N, C), keep (B, N))`` and the scores the same way, then the k
    best kept tokens per sample: values, and gradients reaching the dense batch, against the
    per-sample ``dense[i][keep[i]]`` reference (samples that keep nothing, or everything)."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(b, n, c, generator=g, dtype=F64)
    scores = torch.randint(-2, 3, (b, n), generator=g).to(F64)  # ties: the order is stable
    keep = torch.rand(b, n, generator=g) < 0.6
    if b > 1:
        keep[0] = False  # a sample that keeps nothing
        keep[1] = True  # and one that keeps everything
    leaf, ref_leaf = dense.clone().requires_grad_(), dense.clone().requires_grad_()
    x, s = mj.from_mask(leaf, keep), mj.from_mask(scores, keep)
    assert [t.shape[0] for t in x.unbind()] == keep.sum(1).tolist()
    out = x.gather(1, s.argsort(1, descending=True)[:, :k, None].expand(-1, -1, c))
    ref = []
    for i in range(b):
        xi, si = ref_leaf[i][keep[i]], scores[i][keep[i]]
        ref.append(xi.gather(0, si.argsort(dim=0, descending=True, stable=True)[:k, None].expand(-1, c)))
    got = out.unbind()
    assert len(got) == b and out.shape[0] == b
    for i, (o, r) in enumerate(zip(got, ref)):
        _same(o, r, f"sample {i}")
    if b == 0:
        return
    cots = [torch.randn(r.shape, generator=g, dtype=F64) for r in ref]
    (ga,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, cots)), [leaf])
    (gb,) = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, cots)), [ref_leaf])
    assert_close(ga, gb, "grad of the dense batch")


# ----------------------------------------------------------------------------- golden
def _lists(t):
    return [c.tolist() for c in t.unbind()] if isinstance(t, mj.MultiJaggedTensor) else t.tolist()


def _eq(a, b):
    """Nested lists equal, NaN == NaN."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_eq(u, w) for u, w in zip(a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_sort_golden():
    # x: sample 0 = [[3, 1], [1, 2], [2, 2]], sample 1 empty, sample 2 = [[5, nan], [5, 0]] (B, j0, 2)
    x = mj.nested_tensor([torch.tensor([[3.0, 1.0], [1.0, 2.0], [2.0, 2.0]]), torch.zeros(0, 2), torch.tensor([[5.0, NAN], [5.0, 0.0]])])
    v, i = x.sort(1)
    assert v.shape == x.shape and i.shape == x.shape
    expected = [[[1.0, 1.0], [2.0, 2.0], [3.0, 2.0]], [], [[5.0, 0.0], [5.0, NAN]]]  # = col 0: sort(3,1,2), col 1: sort(1,2,2); nan last
    assert _eq(_lists(v), expected)
    expected = [[[1, 0], [2, 1], [0, 2]], [], [[0, 1], [1, 0]]]  # = ties keep their order: 2 (row 1) before 2 (row 2); 5 before 5
    assert _lists(i) == expected
    v, i = x.sort(1, descending=True)
    expected = [[[3.0, 2.0], [2.0, 2.0], [1.0, 1.0]], [], [[5.0, NAN], [5.0, 0.0]]]  # = nan is the largest
    assert _eq(_lists(v), expected)
    expected = [[[0, 1], [2, 2], [1, 0]], [], [[0, 0], [1, 1]]]  # = descending and stable: ties still in row order
    assert _lists(i) == expected
    assert _lists(x.argsort(1, descending=True)) == expected


def test_sort_along_rows_and_median_along_columns_of_a_square_golden():
    # pair sample 0 = [[3, 1], [2, 4]], sample 1 = [[5]] (B, j0, j0)
    x = mj.nested_tensor([torch.tensor([[3.0, 1.0], [2.0, 4.0]]), torch.tensor([[5.0]])], ragged_dims=(1, 2))
    v, i = x.sort(2)
    assert v.shape == x.shape
    assert _lists(v) == [[[1.0, 3.0], [2.0, 4.0]], [[5.0]]]  # = each row sorted
    assert _lists(i) == [[[1, 0], [0, 1]], [[0]]]
    m, mi = x.median(1)  # (B, j0): the column medians, the other dim's nested int
    assert m.shape == (2, x.shape[2]) and m.ragged_dims == (1,)
    assert _lists(m) == [[2.0, 1.0], [5.0]]  # = lower median of [3, 2] and of [1, 4]; [5]
    assert _lists(mi) == [[1, 0], [0]]


def test_topk_kthvalue_median_golden():
    # sample 0 = [4, 1, 3, 2], sample 1 = [7, nan, 5] (B, j0, 1)
    x = mj.nested_tensor([torch.tensor([[4.0], [1.0], [3.0], [2.0]]), torch.tensor([[7.0], [NAN], [5.0]])])
    v, i = x.topk(2, 1)
    assert not isinstance(v, mj.MultiJaggedTensor) and v.shape == (2, 2, 1)  # the dim is static: size k
    assert _eq(v.tolist(), [[[4.0], [3.0]], [[NAN], [7.0]]])  # = the 2 largest; nan is the largest
    assert i.tolist() == [[[0], [2]], [[1], [0]]]
    v, i = x.topk(2, 1, largest=False)
    assert v.tolist() == [[[1.0], [2.0]], [[5.0], [7.0]]]  # = the 2 smallest
    assert i.tolist() == [[[1], [3]], [[2], [0]]]
    v, i = x.kthvalue(2, 1)
    assert v.shape == (2, 1) and v.tolist() == [[2.0], [7.0]]  # = sorted [1, 2, 3, 4][1], [5, 7, nan][1]
    assert i.tolist() == [[3], [0]]
    v, i = x.median(1, keepdim=True)
    assert v.shape == (2, 1, 1)
    assert _eq(v.tolist(), [[[2.0]], [[NAN]]])  # = lower median [1, 2, 3, 4][(4-1)//2]; a nan gives nan
    assert i.tolist() == [[[3]], [[1]]]
    v, i = x.nanmedian(1)
    assert v.tolist() == [[2.0], [5.0]]  # = nan ignored: lower median of [5, 7] = [5, 7][(2-1)//2]
    assert i.tolist() == [[3], [2]]


@pytest.mark.parametrize("path", [None, "index_map"], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_nanmedian_of_an_all_nan_column_has_dense_index(dtype, path):
    """``nanmedian`` along a ragged dim of a column that is all nan gives dense torch's index (its
    selection's, e.g. 2 of 4; it gave 0), and its gradient goes to that element; lengths 1 to 13
    (sample 4 has a number in one column), a sample empty along the other ragged dim — eagerly and
    on the index-map path (which reads that index from dense torch per length)."""
    comps = [torch.full((n, 1 if n != 5 else 0, 2), NAN, dtype=dtype) for n in range(1, 14)]
    comps[3][1, 0, 1] = 2.0
    leaves = [c.clone().requires_grad_() for c in comps]
    with segment_path(path):
        v, i = torch.nanmedian(mj.as_nested_tensor(leaves, ragged_dims=(1, 2)), 1)
    got_v, got_i = v.unbind(), i.unbind()
    cots = [torch.randn(e.shape, generator=torch.Generator().manual_seed(n), dtype=dtype) for n, e in enumerate(got_v)]
    grads = torch.autograd.grad(sum((e * c).sum() for e, c in zip(got_v, cots)), leaves)
    for n, (c, gv, gi, cot, gr) in enumerate(zip(comps, got_v, got_i, cots, grads)):
        leaf = c.clone().requires_grad_()
        rv, ri = torch.nanmedian(leaf, 0)
        assert torch.equal(gi, ri), f"sample {n}: index {gi.tolist()} != dense {ri.tolist()}"
        assert_close(gv, rv, f"sample {n}")
        assert_close(gr, torch.autograd.grad((rv * cot).sum(), leaf)[0], f"grad of sample {n}")


def test_cummax_cummin_golden():
    # sample 0 = [1, 3, 3, 2], sample 1 empty, sample 2 = [2, nan, 1, nan, 0] (B, j0)
    x = mj.nested_tensor([torch.tensor([1.0, 3.0, 3.0, 2.0]), torch.zeros(0), torch.tensor([2.0, NAN, 1.0, NAN, 0.0])])
    v, i = x.cummax(1)
    assert v.shape == x.shape
    assert _eq(_lists(v), [[1.0, 3.0, 3.0, 3.0], [], [2.0, NAN, NAN, NAN, NAN]])  # = running max; nan stays once seen
    # = a tie takes the later index (3 at 2 after 3 at 1); a nan takes over (1), a number never
    # displaces it (1 at 2), a later nan takes over again (3) — dense's isnan(x) || x >= out
    assert _lists(i) == [[0, 1, 2, 2], [], [0, 1, 1, 3, 3]]
    v, i = torch.cummin(x, 1)
    assert _eq(_lists(v), [[1.0, 1.0, 1.0, 1.0], [], [2.0, NAN, NAN, NAN, NAN]])
    assert _lists(i) == [[0, 0, 0, 0], [], [0, 1, 1, 3, 3]]  # = nothing after 1 is <= 1: index 0; the nans as above


def test_over_every_element_and_unsupported_dims():
    """``median()`` / ``nanmedian()`` without a dim: over every element of the batch (as ``sum()``);
    the batch dim and ``msort`` (which sorts along it) raise NotImplementedError."""
    comps = [torch.tensor([[4.0, 1.0]]), torch.zeros(0, 2), torch.tensor([[3.0, NAN], [2.0, 6.0]])]
    x = mj.nested_tensor(comps)
    every = torch.cat([c.flatten() for c in comps])  # [4, 1, 3, nan, 2, 6]
    assert math.isnan(x.median().item())  # = a nan gives nan
    assert x.nanmedian().item() == every.nanmedian().item() == 3.0  # = lower median of [1, 2, 3, 4, 6]
    for fn in (lambda t: t.sort(0), lambda t: t.topk(1, 0), lambda t: t.median(0), lambda t: t.cummax(0)):
        with pytest.raises(NotImplementedError, match="batch dim"):
            fn(x)
    with pytest.raises(NotImplementedError, match="msort"):
        torch.msort(x)


def test_static_dim_sort_regression():
    """Regression: along a static dim, sort called ``torch.sort(v, dim, stable=True, …)``, an
    invalid combination of arguments (TypeError) for every call."""
    x = mj.nested_tensor([torch.tensor([[3.0, 1.0, 2.0]]), torch.zeros(0, 3)], ragged_dims=(1,))
    v, i = x.sort(-1)
    assert _lists(v) == [[[1.0, 2.0, 3.0]], []] and _lists(i) == [[[1, 2, 0]], []]  # = sort(3, 1, 2)
    assert _lists(x.argsort(2, descending=True)) == [[[0, 2, 1]], []]
