"""Order statistics along ragged dims, the eager paths (NOTE [ Dense ops on segments ] in
ops/reductions/segment_ops.py): dense CPU's own tie order on long samples, the 1-d integer radix
sort, an input written in place after the op, the rule that regroups samples by length, and
``cummax`` (eager only) at a compiled region's edge.
The ops and their per-sample checks: test_order_stats.py."""

from __future__ import annotations

import math

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.ops.reductions import segment_ops
from torch_multijagged.ops.reductions.segment_ops import segment_path

from _reference import build
from _structures import bit_equal, comps_for, per_sample_outputs

F64 = torch.float64
NAN = math.nan
EAGER_PATHS = (None, "per_sample", "per_length")


# ----------------------------------------------------------------------------- dense's own ties
LONG = [0, 1, 5, 17, 40, 70, 130, 300]  # past the small-size branches of the sorts and selections


def _long_ties(dtype, seed: int, c: int = 3) -> list[torch.Tensor]:
    """Samples of ``LONG`` lengths (and C = ``c``) with many ties: a few small values, and for
    floats NaN, ±inf and ±0."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in LONG:
        t = torch.randint(-2, 3, (n, c), generator=g)
        if dtype == torch.bool:
            out.append(t > 0)
            continue
        t = t.to(dtype)
        if dtype.is_floating_point:
            u = torch.rand(n, c, generator=g)
            t = torch.where(u < 0.1, NAN, torch.where(u < 0.15, math.inf, torch.where(u < 0.2, -math.inf, t)))
            t = torch.where((u > 0.9) & (t == 0), -0.0, t)
        out.append(t)
    return out


LONG_OPS = {
    "sort": lambda t, d: torch.sort(t, d),
    "sort_descending": lambda t, d: torch.sort(t, d, descending=True),
    "sort_stable": lambda t, d: torch.sort(t, stable=True, dim=d),
    "argsort_descending_stable": lambda t, d: (torch.argsort(t, d, descending=True, stable=True),),
    "topk_sorted": lambda t, d: torch.topk(t, 3, d),
    "topk_unsorted_smallest": lambda t, d: torch.topk(t, 5, d, largest=False, sorted=False),
    "topk_1": lambda t, d: torch.topk(t, 1, d),
    "kthvalue": lambda t, d: torch.kthvalue(t, 4, d),
    "median": lambda t, d: torch.median(t, d),
    "nanmedian": lambda t, d: torch.nanmedian(t, d, keepdim=True),
    "cummax": lambda t, d: torch.cummax(t, d),
    "cummin": lambda t, d: torch.cummin(t, d),
}


def _long_cases():
    for name in LONG_OPS:
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool):
            need = {"topk_sorted": 3, "topk_unsorted_smallest": 5, "topk_1": 1, "kthvalue": 4, "median": 1, "nanmedian": 1}
            try:
                LONG_OPS[name](torch.zeros(6, 2, dtype=dtype), 0)
            except (RuntimeError, TypeError, NotImplementedError):
                continue  # dense refuses the dtype
            yield pytest.param(name, dtype, need.get(name, 0), id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.parametrize("path", EAGER_PATHS, ids=str)
@pytest.mark.parametrize("name,dtype,need", list(_long_cases()))
def test_ties_are_dense_cpus_own(name, dtype, need, path):
    """Long samples full of ties (and NaN, ±inf, ±0): values and indices equal dense torch's on
    each sample bit for bit — the unstable sort's tie order, ``topk``'s unsorted order and its
    selection's choice among equal elements, which element ``kthvalue`` / ``median`` return —
    along the ragged dim of ``(B, j0, C)`` and along both ragged dims of a pair."""
    f = LONG_OPS[name]
    comps = [c for c in _long_ties(dtype, 0) if c.shape[0] >= need]
    grad = dtype == F64 and not name.startswith("argsort")
    x, leaves = build(comps, (1,), requires_grad=grad)
    with segment_path(path):
        outs = f(x, 1)
    refs = [f(c, 0) for c in leaves]
    for j, o in enumerate(outs):
        for i, (got, ref, c) in enumerate(zip(per_sample_outputs(o), refs, comps)):
            assert bit_equal(got.detach(), ref[j].detach()), f"{name} output {j} of sample {i} (length {c.shape[0]})"
    if grad:  # dense autograd of the op per sample, whatever the path (transposed rows included)
        g = torch.Generator().manual_seed(2)
        cots = [torch.randn(r[0].shape, generator=g, dtype=F64) for r in refs]
        ga = torch.autograd.grad(sum((o * w).sum() for o, w in zip(per_sample_outputs(outs[0]), cots)), leaves)
        gb = torch.autograd.grad(sum((r[0] * w).sum() for r, w in zip(refs, cots)), leaves)
        for i, (a, b) in enumerate(zip(ga, gb)):
            assert torch.equal(a, b), f"{name}: gradient of sample {i}"
    # a pair (B, j0, j0): along its rows and its columns (several ragged dims)
    pairs = [c[:, :1] + c[:, :1].T if dtype != torch.bool else c[:, :1] ^ c[:, :1].T for c in comps if c.shape[0] <= 70]
    for d in (1, 2):
        with segment_path(path):
            outs = f(mj.nested_tensor(pairs, ragged_dims=(1, 2)), d)
        for j, o in enumerate(outs):
            for i, (got, c) in enumerate(zip(per_sample_outputs(o), pairs)):
                assert bit_equal(got, f(c, d - 1)[j]), f"{name} output {j} of pair {i} along dim {d}"


@pytest.mark.parametrize("path", EAGER_PATHS, ids=str)
def test_long_integer_sort_of_a_1d_sample_is_dense(path):
    """A ``(B, j0)`` integer sample of at least 32768 elements: dense sorts such a 1-D tensor with a
    stable radix sort (``stable=False``, ascending), so its tie order is the stable one there and
    not on a short row; each such sample is sorted alone, as dense sorts it."""
    g = torch.Generator().manual_seed(3)
    comps = [torch.randint(0, 9, (n,), generator=g) for n in (40000, 3, 3, 7, 3)]
    with segment_path(path):
        v, i = mj.nested_tensor(comps).sort(1)
    for a, b, c in zip(v.unbind(), i.unbind(), comps):
        ref = torch.sort(c)
        assert torch.equal(a, ref.values) and torch.equal(b, ref.indices)


INPLACE = {
    "sort": lambda y: y.sort(1).values,
    "topk": lambda y: y.topk(2, 1).values,
    "kthvalue": lambda y: y.kthvalue(2, 1).values,
    "median": lambda y: y.median(1).values,
    "nanmedian": lambda y: y.nanmedian(1).values,
    "quantile": lambda y: y.quantile(0.3, 1),
}


@pytest.mark.parametrize("path", EAGER_PATHS + ("index_map",), ids=str)
@pytest.mark.parametrize("name", INPLACE)
def test_input_written_in_place_after_the_op(name, path):
    """``out = y.op(1); y.mul_(2)``, then the backward: it runs, as dense (these backwards need
    only the indices), with dense's gradients — the values are gathered with an index only, not
    saved from the input (they raised "... modified by an inplace operation")."""
    f = INPLACE[name]
    g = torch.Generator().manual_seed(1)
    comps = [torch.randint(-2, 3, (n, 3), generator=g).to(F64) for n in (4, 2, 6)]
    x = mj.nested_tensor(comps, requires_grad=True)
    y = x * 1
    with segment_path(path):
        out = f(y)
    y.mul_(2)
    w = [torch.randn(o.shape, generator=g, dtype=F64) for o in per_sample_outputs(out)]
    (gx,) = torch.autograd.grad(sum((o * c).sum() for o, c in zip(per_sample_outputs(out), w)), [x])
    for c, cot, got in zip(comps, w, gx.unbind()):
        leaf = c.clone().requires_grad_()
        yc = leaf * 1
        oc = f(yc.unsqueeze(0))[0]  # the dense op on the sample (as a batch of one, dim 1)
        yc.mul_(2)
        (ref,) = torch.autograd.grad((oc * cot).sum(), [leaf])
        if path == "index_map" and name != "quantile":  # ties may pick another equal element there
            assert torch.equal(got.sum(0), ref.sum(0))
        else:
            assert torch.equal(got, ref)


def test_the_rule_regroups_many_samples_of_few_lengths():
    """The measured rule (``segment_ops.RULE``): many samples of few lengths are regrouped by length;
    a few long samples run one by one (a spy on the regrouping)."""
    calls = []
    real = segment_ops._per_length

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    segment_ops._per_length = spy
    try:
        many = mj.nested_tensor([torch.randn(n % 3 + 1, 2) for n in range(300)])
        few_long = mj.nested_tensor([torch.randn(n, 64) for n in (300, 500, 700)])
        for x in (many, few_long):
            v, i = x.sort(1)
            for a, b, c in zip(v.unbind(), i.unbind(), x.unbind()):
                ref = torch.sort(c, 0)
                assert torch.equal(a, ref.values) and torch.equal(b, ref.indices)
            calls.append(0)
    finally:
        segment_ops._per_length = real
    assert calls == [1, 0, 0]


def test_compiled_cummax_along_ragged_dim_is_a_graph_break():
    """``cummax`` runs the dense op per segment (NOTE [ Dense ops on segments ]), on sizes read on
    the host: a graph break (the regions around it compile), with fullgraph=True an error naming
    the op."""
    torch._dynamo.reset()

    def f(t):
        return torch.cummax(t * 2, dim=1).values.sum(-1) * 3

    comps = comps_for([(3, 2), (1, 2)], 0)
    out = torch.compile(f, backend="aot_eager")(mj.nested_tensor(comps, ragged_dims=(1,)))
    assert bit_equal(out.values(), f(mj.nested_tensor(comps, ragged_dims=(1,))).values())
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"cummax\(\) along a ragged dim reads per-sample sizes on the host"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(mj.nested_tensor(comps, ragged_dims=(1,)))


@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_median_of_an_expanded_dim_reads_only_its_sample(op):
    """torch's CPU ``median`` / ``nanmedian`` along a dim of an expanded (stride-0) tensor read
    memory outside it (torch 2.13), which in a packed batch is the next sample's rows: the values
    are materialised first, so every sample's median is its own elements' (the dense op on the
    sample made contiguous), whether the reduced dim is static or ragged."""
    comps = [torch.tensor([[3.0], [1.0], [2.0]]), torch.tensor([[5.0], [4.0]]), torch.zeros(0, 1)]
    for t in (False, True):  # the static dim reduced; the ragged one (each sample non-empty there)
        x = mj.nested_tensor(comps[:2] if t else comps).expand(-1, -1, 3)
        y = x.transpose(1, 2) if t else x
        got = getattr(y, op)(2)
        for v, i, c in zip(got.values.unbind(), got.indices.unbind(), y.unbind()):
            want = getattr(c.contiguous(), op)(1)
            assert torch.equal(v, want.values) and torch.equal(i, want.indices)
