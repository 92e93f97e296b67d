"""The plain-tensor attention kernels (NOTE [ Varlen attention contract ], kernels/attention.py):
``attention_reference`` / ``attention_loop`` / ``attention_bucketed`` and their backwards,
``bucket_plan``, and the ``multijagged::`` attention ops under ``torch.library.opcheck``.

The oracle is written out here, per segment and in float64 autograd: scores ``q kᵀ·scale +
bias``, the causal mask, a softmax that gives a row with no visible key zero probability, the
keep mask scaled by ``1 / (1 - p)``, ``@ v``. Nothing here calls the package to compute an
expected value.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from _reference import few, seeds
from torch_multijagged.kernels import attention as kattn
from torch_multijagged.kernels import attention_blocks as kblocks

mjops = torch.ops.multijagged
BACKENDS = {
    "reference": (kattn.attention_reference, kattn.attention_reference_backward),
    "loop": (kattn.attention_loop, kattn.attention_loop_backward),
    "bucketed": (kattn.attention_bucketed, kattn.attention_bucketed_backward),
    "blocks": (kattn.attention_blocks, kattn.attention_blocks_backward),
}


# ----------------------------------------------------------------------------- cases
def _cu(lengths):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out


@st.composite
def segment_cases(draw, max_n=5, max_len=6):
    """Segments with lengths (incl. 0 on either side), heads ``(Hq, Hk)`` with ``Hq % Hk == 0``,
    an optional bias ``(Tb, Hb)`` with ``Hb ∈ {1, Hq}`` whose blocks may be shared by several
    segments of one shape (the rows of a pair attending along their columns), causal, and a
    dropout probability with its random keep mask."""
    n = draw(st.integers(1, max_n))
    lq = draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n))
    cross = draw(st.booleans())
    lk = draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n)) if cross else list(lq)
    hk = draw(st.sampled_from([1, 2]))
    hq = hk * draw(st.sampled_from([1, 2]))
    bias = draw(st.sampled_from([None, "own", "shared"]))
    hb = draw(st.sampled_from([1, hq]))
    causal = draw(st.booleans())
    p = draw(st.sampled_from([0.0, 0.0, 0.4]))
    dv = draw(st.sampled_from([3, 4]))
    if bias == "shared":
        # every segment of one (Lq, Lk) shape reads the same block
        lk = list(lq)
    return dict(lq=lq, lk=lk, hq=hq, hk=hk, bias=bias, hb=hb, causal=causal, p=p, dv=dv,
                seed=draw(seeds), scale=draw(st.sampled_from([None, 0.7])))


def _make(case, dtype=torch.float64):
    g = torch.Generator().manual_seed(case["seed"])
    lq, lk, hq, hk, d = case["lq"], case["lk"], case["hq"], case["hk"], 3
    q = torch.randn(sum(lq), hq, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lk), hk, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lk), hk, case["dv"], generator=g, dtype=dtype)
    bias = start = None
    if case["bias"] == "own":
        blocks = [a * b for a, b in zip(lq, lk)]
        bias = torch.randn(sum(blocks), case["hb"], generator=g, dtype=dtype)
        start = _cu(blocks)[:-1]
    elif case["bias"] == "shared":
        shapes = sorted(set(zip(lq, lk)))
        first = {}
        pos = 0
        for a, b in shapes:
            first[(a, b)] = pos
            pos += a * b
        bias = torch.randn(pos, case["hb"], generator=g, dtype=dtype)
        start = torch.tensor([first[(a, b)] for a, b in zip(lq, lk)], dtype=torch.int64)
    keep = None
    if case["p"] > 0:
        ts = sum(a * b for a, b in zip(lq, lk))
        keep = torch.rand(ts, hq, generator=g) >= case["p"]
    return q, k, v, _cu(lq), _cu(lk), bias, start, keep


def oracle(q, k, v, cu_q, cu_k, bias, start, keep, causal, scale, p):
    """Per-segment float64 attention, differentiable (the contract written out)."""
    hq, hk = q.shape[1], k.shape[1]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs, cs = [], 0
    for s in range(cu_q.shape[0] - 1):
        a0, a1, b0, b1 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        lq, lk = a1 - a0, b1 - b0
        qs = q[a0:a1].transpose(0, 1)  # (Hq, Lq, D)
        ks = k[b0:b1].transpose(0, 1).repeat_interleave(hq // hk, 0)
        vs = v[b0:b1].transpose(0, 1).repeat_interleave(hq // hk, 0)
        sc = qs @ ks.transpose(-1, -2) * scale
        if bias is not None:
            blk = bias[int(start[s]): int(start[s]) + lq * lk].reshape(lq, lk, bias.shape[1]).permute(2, 0, 1)
            sc = sc + blk
        if causal:
            sc = sc.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
        visible = ~torch.isneginf(sc)
        # a row with no visible key: zero probabilities (and no gradient), as dense SDPA
        pr = torch.softmax(sc.masked_fill(~visible, -1e300) if lk else sc, -1) * visible
        if keep is not None:
            kb = keep[cs: cs + lq * lk].reshape(lq, lk, hq).permute(2, 0, 1)
            pr = pr * kb * (1 / (1 - p) if p < 1 else 0.0)
        cs += lq * lk
        outs.append((pr @ vs).transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(0, hq, v.shape[-1])


def _grads(case, name):
    q, k, v, cu_q, cu_k, bias, start, keep = _make(case)
    leaves = [q, k, v] + ([bias] if bias is not None else [])
    leaves = [x.clone().requires_grad_() for x in leaves]
    rq, rk, rv = leaves[:3]
    rb = leaves[3] if bias is not None else None
    ref = oracle(rq, rk, rv, cu_q, cu_k, rb, start, keep, case["causal"], case["scale"], case["p"])
    go = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    ref_grads = torch.autograd.grad(ref, leaves, go, allow_unused=True) if ref.requires_grad else [None] * len(leaves)
    fwd, bwd = BACKENDS[name]
    out, lse = fwd(q, k, v, cu_q, cu_k, bias, start, keep, case["causal"], case["scale"], case["p"])
    got = bwd(go, q, k, v, out, lse, cu_q, cu_k, bias, start, keep, case["causal"], case["scale"], case["p"],
              bias is not None)
    return out, lse, ref, got, ref_grads, (q, k, cu_q, cu_k, bias, start)


# ----------------------------------------------------------------------------- forward / backward
@pytest.mark.parametrize("name", sorted(BACKENDS))
@few(20)
@given(case=segment_cases())
def test_kernel_matches_oracle(name, case):
    out, lse, ref, got, ref_grads, _ = _grads(case, name)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for what, a, b in zip(("dq", "dk", "dv", "dbias"), got, ref_grads):
        if b is None and a is None:
            continue
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", sorted(BACKENDS))
@few(10)
@given(case=segment_cases())
def test_kernel_lse(name, case):
    """``lse`` is the log-sum-exp of the visible scores (before dropout) for every query row
    that sees a key; float64 in, float64 out."""
    case = dict(case, p=0.0)
    q, k, v, cu_q, cu_k, bias, start, _ = _make(case)
    out, lse = BACKENDS[name][0](q, k, v, cu_q, cu_k, bias, start, None, case["causal"], case["scale"], 0.0)
    assert lse.shape == q.shape[:2] and lse.dtype == torch.float64
    scale = 1 / math.sqrt(q.shape[-1]) if case["scale"] is None else case["scale"]
    r = q.shape[1] // k.shape[1]
    for s in range(len(case["lq"])):
        a0, b0 = int(cu_q[s]), int(cu_k[s])
        lq, lk = case["lq"][s], case["lk"][s]
        sc = q[a0:a0 + lq].transpose(0, 1) @ k[b0:b0 + lk].transpose(0, 1).repeat_interleave(r, 0).transpose(1, 2)
        sc = sc * scale
        if bias is not None:
            sc = sc + bias[int(start[s]): int(start[s]) + lq * lk].reshape(lq, lk, bias.shape[1]).permute(2, 0, 1)
        if case["causal"]:
            sc = sc.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
        want = torch.logsumexp(sc, -1).transpose(0, 1)  # (Lq, Hq)
        seen = torch.isfinite(want)
        torch.testing.assert_close(lse[a0:a0 + lq][seen], want[seen], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_kernel_low_precision_dtypes(dtype, name):
    """Half inputs: out in the input dtype, lse in float32 (the contract), close to float64."""
    case = dict(lq=[5, 0, 7, 2], lk=[3, 4, 7, 0], hq=2, hk=1, bias="own", hb=2, causal=False, p=0.0, dv=3,
                seed=3, scale=None)
    q, k, v, cu_q, cu_k, bias, start, _ = _make(case)
    ref = oracle(q, k, v, cu_q, cu_k, bias, start, None, False, None, 0.0)
    low = [x.to(dtype) for x in (q, k, v, bias)]
    out, lse = BACKENDS[name][0](low[0], low[1], low[2], cu_q, cu_k, low[3], start, None, False, None, 0.0)
    assert out.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_kernel_no_segments_and_all_empty(name):
    """N = 0 segments, and segments that are all empty: empty / zero outputs, zero grads."""
    for lq, lk in (([], []), ([0, 0], [0, 3]), ([2, 3], [0, 0])):
        case = dict(lq=lq, lk=lk, hq=2, hk=2, bias=None, hb=1, causal=False, p=0.0, dv=3, seed=0, scale=None)
        out, lse, ref, got, ref_grads, _ = _grads(case, name)
        assert torch.equal(out, torch.zeros(sum(lq), 2, 3, dtype=torch.float64))
        for a in got[:3]:
            assert torch.equal(a, torch.zeros_like(a))


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_kernel_dropout_p_one_is_zero(name):
    """p = 1: every entry dropped — zero outputs and gradients, not 0/0 = nan (F.dropout's p = 1)."""
    case = dict(lq=[3, 2], lk=[4, 1], hq=2, hk=2, bias=None, hb=1, causal=False, p=1.0, dv=3, seed=0, scale=None)
    q, k, v, cu_q, cu_k, _, _, _ = _make(dict(case, p=0.0))
    keep = torch.zeros(3 * 4 + 2 * 1, 2, dtype=torch.bool)
    fwd, bwd = BACKENDS[name]
    out, lse = fwd(q, k, v, cu_q, cu_k, None, None, keep, False, None, 1.0)
    assert torch.equal(out, torch.zeros_like(out))
    dq, dk, dv, _ = bwd(torch.ones_like(out), q, k, v, out, lse, cu_q, cu_k, None, None, keep, False, None, 1.0, False)
    for g in (dq, dk, dv):
        assert torch.equal(g, torch.zeros_like(g))


# ----------------------------------------------------------------------------- buckets
@st.composite
def length_vectors(draw, max_n=12, max_len=40):
    n = draw(st.integers(0, max_n))
    lq = draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n))
    lk = draw(st.one_of(st.just(lq), st.lists(st.integers(0, max_len), min_size=n, max_size=n)))
    return torch.tensor(lq, dtype=torch.int64), torch.tensor(lk, dtype=torch.int64)


@few(40)
@given(lens=length_vectors(), slack=st.sampled_from([0.0, 0.15, 1.0]), floor=st.sampled_from([0, 64, 4096]))
def test_bucket_plan_properties(lens, slack, floor):
    """Every live segment (Lq > 0 and Lk > 0) in exactly one bucket, no dead one in any; a
    bucket of several segments wastes at most ``slack·Σ Lq·Lk + floor`` score entries; with no
    slack and no floor only segments of one shape share a bucket; deterministic."""
    lq, lk = lens
    buckets = kattn.bucket_plan(lq, lk, slack, floor)
    assert buckets == [] or all(b.dtype == torch.int64 and b.dim() == 1 and b.numel() > 0 for b in buckets)
    members = torch.cat(buckets).tolist() if buckets else []
    live = ((lq > 0) & (lk > 0)).nonzero().flatten().tolist()
    assert sorted(members) == live, "every live segment exactly once"
    for b in buckets:
        area = int((lq[b] * lk[b]).sum())
        padded = b.numel() * int(lq[b].max()) * int(lk[b].max())
        if b.numel() > 1:
            assert padded <= (1 + slack) * area + floor
        if slack == 0 and floor == 0:
            assert len(set(zip(lq[b].tolist(), lk[b].tolist()))) == 1
    again = kattn.bucket_plan(lq, lk, slack, floor)
    assert len(again) == len(buckets) and all(torch.equal(a, b) for a, b in zip(again, buckets))


def test_bucket_plan_golden():
    lq = lk = torch.tensor([2, 8, 0, 7, 8, 1])
    # sorted by length, descending, stable; segment 2 (empty) in no bucket.
    # 8, 8, 7 share a bucket: 3·8·8 = 192 ≤ 1.15·(64 + 64 + 49) = 203.55;
    # 2 does not join it: 4·8·8 = 256 > 1.15·(177 + 4); 1 does not join 2: 2·2·2 = 8 > 1.15·(4 + 1) = 5.75
    b = kattn.bucket_plan(lq, lk, slack=0.15, floor=0)
    assert [x.tolist() for x in b] == [[1, 4, 3], [0], [5]]
    # with a floor of 4 wasted entries it does: 8 ≤ 5.75 + 4
    b = kattn.bucket_plan(lq, lk, slack=0.15, floor=4)
    assert [x.tolist() for x in b] == [[1, 4, 3], [0, 5]]


@pytest.mark.parametrize("fwd_bwd", ["forward", "backward"])
@few(10)
@given(case=segment_cases(max_n=6), split=st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_bucketed_any_partition(fwd_bwd, case, split):
    """Any grouping of the live segments into buckets gives the oracle's result: padding inside
    a bucket never leaks into a segment."""
    q, k, v, cu_q, cu_k, bias, start, keep = _make(case)
    lq, lk = torch.tensor(case["lq"]), torch.tensor(case["lk"])
    live = ((lq > 0) & (lk > 0)).nonzero().flatten()
    groups = {}
    for s in live.tolist():
        groups.setdefault(split[s % len(split)], []).append(s)
    buckets = [torch.tensor(g) for g in groups.values()]
    args = (case["causal"], case["scale"], case["p"])
    out, lse = kattn.attention_bucketed(q, k, v, cu_q, cu_k, bias, start, keep, *args, buckets=buckets)
    ref_out, ref_lse = kattn.attention_reference(q, k, v, cu_q, cu_k, bias, start, keep, *args)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    if fwd_bwd == "backward":
        go = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(0))
        need = bias is not None
        got = kattn.attention_bucketed_backward(go, q, k, v, out, lse, cu_q, cu_k, bias, start, keep, *args, need,
                                                buckets=buckets)
        want = kattn.attention_reference_backward(go, q, k, v, ref_out, ref_lse, cu_q, cu_k, bias, start, keep, *args,
                                                  need)
        for a, b in zip(got, want):
            if a is None:
                assert b is None
            else:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_score_offsets():
    cu_q, cu_k = _cu([2, 0, 3]), _cu([4, 5, 1])
    assert kattn.score_offsets(cu_q, cu_k).tolist() == [0, 8, 8, 11]  # = [0, 2·4, +0·5, +3·1]


# ----------------------------------------------------------------------------- ops
def _op_inputs(bias=True, dropout=False):
    case = dict(lq=[3, 0, 2], lk=[2, 3, 0], hq=2, hk=1, bias="own" if bias else None, hb=2, causal=False, p=0.0,
                dv=3, seed=0, scale=None)
    q, k, v, cu_q, cu_k, b, start, _ = _make(case)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if b is not None:
        b.requires_grad_()
    seed = torch.tensor([123]) if dropout else None
    return (q, k, v, cu_q, cu_k, 3, 3, b, start, seed, False, 0.5, 0.3 if dropout else 0.0)


@pytest.mark.parametrize("bias, dropout", [(False, False), (True, False), (True, True)])
def test_opcheck_varlen_attention(bias, dropout):
    torch.library.opcheck(mjops.varlen_attention.default, _op_inputs(bias, dropout))


@pytest.mark.parametrize("mask, dropout, causal", [(False, False, False), (True, False, False), (True, True, False),
                                                   (False, False, True)])
def test_opcheck_sdpa_dense(mask, dropout, causal):
    """``multijagged::sdpa`` on plain tensors (its dense definition), GQA heads at dim -3."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    m = torch.randn(1, 4, 3, 6, generator=g, dtype=torch.float64, requires_grad=True) if mask else None
    seed = torch.tensor([5]) if dropout else None
    torch.library.opcheck(mjops.sdpa.default, (q, k, v, m, seed, causal, 0.4, 0.2 if dropout else 0.0))


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_dense_op_matches_dense_sdpa(causal):
    """The op's dense definition is dense SDPA (enable_gqa), forward and gradients."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    out, _ = mjops.sdpa(q, k, v, None, None, causal, 0.5, 0.0)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.5, enable_gqa=True)
    torch.testing.assert_close(out, want)
    a = torch.autograd.grad(out.sum(), (q, k, v))
    b = torch.autograd.grad(want.sum(), (q, k, v))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


def test_dense_keep_is_a_function_of_the_seed():
    from torch_multijagged.compile.attention import dense_keep

    a = dense_keep(torch.tensor([7]), (50, 3), 0.3, "cpu")
    b = dense_keep(torch.tensor([7]), (50, 3), 0.3, "cpu")
    c = dense_keep(torch.tensor([8]), (50, 3), 0.3, "cpu")
    assert a.dtype == torch.bool and torch.equal(a, b) and not torch.equal(a, c)
    assert abs(1 - a.double().mean().item() - 0.3) < 0.1


@pytest.mark.parametrize("hb", [1, 3])
def test_blocks_backend_on_pair_rows_shares_the_bias(hb):
    """Triangle attention's segments: sample b's n_b rows are n_b segments of n_b keys sharing
    one bias block. ``blocks`` runs one dense call per sample on views; values, lse and every
    gradient (the bias's summed over the rows) equal the oracle's."""
    ns = [3, 0, 2, 2]
    seg = [n for n in ns for _ in range(n)]
    cu = _cu(seg)
    starts, acc = [], 0
    for n in ns:
        starts += [acc] * n
        acc += n * n
    start = torch.tensor(starts, dtype=torch.int64)
    assert kattn.block_runs(cu, cu, start) == [(0, 3, 3, 3), (3, 2, 2, 2), (5, 2, 2, 2)]
    g = torch.Generator().manual_seed(0)
    t = int(cu[-1])
    q, k, v = (torch.randn(t, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(acc, hb, generator=g, dtype=torch.float64)
    out, lse = kattn.attention_blocks(q, k, v, cu, cu, bias, start, None, False, 0.5)
    ref_out, ref_lse = kattn.attention_reference(q, k, v, cu, cu, bias, start, None, False, 0.5)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = kattn.attention_blocks_backward(go, q, k, v, out, lse, cu, cu, bias, start, None, False, 0.5, 0.0, True)
    want = kattn.attention_reference_backward(go, q, k, v, ref_out, ref_lse, cu, cu, bias, start, None, False, 0.5,
                                              0.0, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _pair_rows(ns):
    """Triangle attention's segments: sample b's n_b rows are n_b segments of n_b keys that
    share the sample's bias block. Returns ``(cu, bias_start, bias rows)``."""
    seg = [n for n in ns for _ in range(n)]
    starts, acc = [], 0
    for n in ns:
        starts += [acc] * n
        acc += n * n
    return _cu(seg), torch.tensor(starts, dtype=torch.int64), acc


def _pair_rows_case(ns, heads, hb_all, causal, seed, hidden_bias_rows=0):
    """Pair rows ``_pair_rows(ns)`` with float64 ``q, k, v`` (heads ``(Hq, Hk)``, head size 3) and a
    bias of ``Hq`` heads or one, its first ``hidden_bias_rows`` rows -inf; the oracle's output, a
    random cotangent and the oracle's gradients of the four (zeros where unused). Returns
    ``(cu, start, (q, k, v, bias), out, cotangent, gradients)``."""
    cu, start, tb = _pair_rows(ns)
    hq, hk = heads
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q = torch.randn(t, hq, 3, generator=g, dtype=torch.float64)
    k, v = (torch.randn(t, hk, 3, generator=g, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(tb, hq if hb_all else 1, generator=g, dtype=torch.float64)
    bias[:hidden_bias_rows] = float("-inf")
    leaves = [x.clone().requires_grad_() for x in (q, k, v, bias)]
    ref = oracle(*leaves[:3], cu, cu, leaves[3], start, None, causal, None, 0.0)
    go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(ref, leaves, go, allow_unused=True, materialize_grads=True)
    return cu, start, (q, k, v, bias), ref.detach(), go, want


@pytest.mark.parametrize("chunk", [1, 40])
@few(10)
@given(ns=st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(any), heads=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
       hb_all=st.booleans(), causal=st.booleans(), seed=seeds)
def test_blocks_backward_in_chunks_matches_oracle(chunk, ns, heads, hb_all, causal, seed):
    """``attention_blocks_backward`` splits a run into chunks of ``_BLOCKS_CHUNK`` score entries
    (at least one segment each); chunk boundaries inside a run (one segment per chunk, or a few)
    change no gradient, the bias's summed over every chunk of the run included."""
    cu, start, (q, k, v, bias), _, go, want = _pair_rows_case(ns, heads, hb_all, causal, seed)
    old = kblocks._BLOCKS_CHUNK
    kblocks._BLOCKS_CHUNK = chunk
    try:
        out, lse = kattn.attention_blocks(q, k, v, cu, cu, bias, start, None, causal, None)
        got = kattn.attention_blocks_backward(go, q, k, v, out, lse, cu, cu, bias, start, None, causal, None, 0.0, True)
    finally:
        kblocks._BLOCKS_CHUNK = old
    for what, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")


@few(12)
@given(ns=st.lists(st.integers(0, 5), min_size=1, max_size=3).filter(any), heads=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
       hb_all=st.booleans(), causal=st.booleans(), hide=st.booleans(), need_lse=st.booleans(), seed=seeds)
def test_blocks_keeping_probabilities_matches_oracle(ns, heads, hb_all, causal, hide, need_lse, seed):
    """NOTE [ Keeping the probabilities ]: ``attention_blocks`` given a list appends one
    ``(m, Hq, Lq, Lk)`` block of probabilities per run (the oracle's softmax), its output and
    ``lse`` (when asked) equal the oracle's, and ``attention_blocks_backward`` reading them gives
    the oracle's gradients — with GQA heads, causal masks, and a bias hiding every key of a row
    (zero output row, zero probabilities, zero gradients, never nan)."""
    n0 = next(n for n in ns if n)
    # with ``hide``, the first sample's query row 0 sees no key (every head, when the bias has one)
    cu, start, (q, k, v, bias), ref, go, want = _pair_rows_case(ns, heads, hb_all, causal, seed, n0 if hide else 0)
    hq = heads[0]
    probs = []
    out, lse = kattn.attention_blocks(q, k, v, cu, cu, bias, start, None, causal, None, need_lse=need_lse,
                                      probs=probs)
    runs = kattn.block_runs(cu, cu, start)
    assert [tuple(p.shape) for p in probs] == [(m, hq, lq, lk) for _, m, lq, lk in runs]
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    if need_lse:
        torch.testing.assert_close(lse, kattn.attention_reference(q, k, v, cu, cu, bias, start, None, causal, None)[1])
    for p in probs:
        assert torch.isfinite(p).all()
    got = kattn.attention_blocks_backward(go, q, k, v, out, lse, cu, cu, bias, start, None, causal, None, 0.0, True,
                                          probs=probs)
    for what, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"{what}: {m}")
    if hide:
        rows = [int(cu[s]) for s in range(n0)]  # query row 0 of each of the first sample's segments
        assert torch.equal(out[rows], torch.zeros_like(out[rows]))


def test_blocks_kept_probabilities_must_match_the_runs():
    cu, start, tb = _pair_rows([2, 3])
    q = torch.randn(int(cu[-1]), 1, 2)
    bias = torch.randn(tb, 1)
    probs = []
    out, lse = kattn.attention_blocks(q, q, q, cu, cu, bias, start, None, False, None, probs=probs)
    with pytest.raises(ValueError, match="1 kept probabilities for 2 runs"):
        kattn.attention_blocks_backward(out, q, q, q, out, lse, cu, cu, bias, start, None, False, None, 0.0, True,
                                        probs=probs[:1])
    with pytest.raises(ValueError, match="without dropout only"):
        kattn.attention_blocks(q, q, q, cu, cu, bias, start, torch.ones(13, 1, dtype=torch.bool), False, None, 0.5,
                               probs=[])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_blocks_backward_rows_without_visible_key_and_half_types(dtype):
    """Pair rows (segments sharing their sample's bias block, one sample empty) where the bias
    hides every key of some query rows: those rows get zero gradients and the others the
    oracle's, in float64, float32 and bfloat16 (computed in float32, returned in the input
    dtype), with GQA heads and the run split into chunks."""
    cu, start, acc = _pair_rows([3, 0, 4])
    g = torch.Generator().manual_seed(5)
    t = int(cu[-1])
    q = torch.randn(t, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(t, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(acc, 4, generator=g, dtype=torch.float64)
    bias[9 + 2 * 4: 9 + 3 * 4, 1] = float("-inf")  # sample 2, query row 2, head 1: no visible key
    leaves = [x.clone().requires_grad_() for x in (q, k, v, bias)]
    ref = oracle(*leaves[:3], cu, cu, leaves[3], start, None, False, None, 0.0)
    go = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, leaves, go)
    low = [x.to(dtype) for x in (q, k, v, bias, go)]
    old = kblocks._BLOCKS_CHUNK
    kblocks._BLOCKS_CHUNK = 2 * 4 * 16  # sample 2's run of 4 segments in chunks of 2
    try:
        out, lse = kattn.attention_blocks(*low[:3], cu, cu, low[3], start, None, False, None)
        # such a row's lse is not specified: the fused kernel's 0, the math path's -inf
        lse_inf = kattn.attention_reference(*low[:3], cu, cu, low[3], start, None, False, None)[1]
        hidden = torch.tensor([9 + 4 * j + 2 for j in range(4)])  # query 2 of each of sample 2's segments
        assert torch.isneginf(lse_inf[hidden, 1]).all()
        gots = [kattn.attention_blocks_backward(low[4], *low[:3], out, m, cu, cu, low[3], start, None, False, None,
                                                0.0, True) for m in (lse, lse_inf)]
    finally:
        kblocks._BLOCKS_CHUNK = old
    tol = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
    for got in gots:
        for what, a, b, x in zip(("dq", "dk", "dv", "dbias"), got, ref_grads, (q, k, v, bias)):
            assert a.dtype == dtype and a.shape == x.shape and torch.isfinite(a).all(), what
            torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
        assert torch.equal(got[0][hidden, 1], torch.zeros(4, 8, dtype=dtype))


@pytest.mark.parametrize("name", ["bucketed", "reference", "blocks"])
def test_one_bias_block_read_by_segments_of_different_lengths(name):
    """Segments may share a ``bias_start`` yet differ in (Lq, Lk): each reads its own
    ``Lq × Lk`` window of the block, so a per-block gather must key on the lengths too."""
    lq, lk = [2, 3, 1, 3], [3, 2, 3, 2]
    cu_q, cu_k = _cu(lq), _cu(lk)
    start = torch.zeros(4, dtype=torch.int64)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(int(cu_q[-1]), 2, 4, generator=g, dtype=torch.float64)
    k = torch.randn(int(cu_k[-1]), 2, 4, generator=g, dtype=torch.float64)
    v = torch.randn(int(cu_k[-1]), 2, 4, generator=g, dtype=torch.float64)
    bias = torch.randn(6, 2, generator=g, dtype=torch.float64)
    out, _ = BACKENDS[name][0](q, k, v, cu_q, cu_k, bias, start, None, False, 0.5, 0.0)
    for s in range(4):
        a0, b0, m, n = int(cu_q[s]), int(cu_k[s]), lq[s], lk[s]
        sc = q[a0:a0 + m].transpose(0, 1) @ k[b0:b0 + n].transpose(0, 1).transpose(1, 2) * 0.5
        sc = sc + bias[: m * n].reshape(m, n, 2).permute(2, 0, 1)
        want = (sc.softmax(-1) @ v[b0:b0 + n].transpose(0, 1)).transpose(0, 1)
        torch.testing.assert_close(out[a0:a0 + m], want)


@pytest.mark.parametrize("backend", ["loop", "blocks", "bucketed", "reference"])
@pytest.mark.parametrize("lengths", [[3], [3, 3, 3, 3], [2, 5, 0, 4]], ids=str)
def test_strided_last_dim_read_as_strided(backend, lengths):
    """torch's fused CPU kernel reads the head dim as contiguous whatever its stride; a strided
    view (``x[..., ::2]``) must still attend over the elements it shows, forward and backward."""
    import torch.nn.functional as F

    import torch_multijagged as mj
    from torch_multijagged.compile import attention as cattn

    g = torch.Generator().manual_seed(len(lengths))
    comps = [torch.randn(n, 2, 8, dtype=torch.float64, generator=g) for n in lengths]
    x = mj.nested_tensor(comps, requires_grad=True)
    q = x.transpose(1, 2)[..., ::2]  # (B, 2, j, 4), last-dim stride 2
    with cattn.backend(backend):
        out = F.scaled_dot_product_attention(q, q, q)
    grad = torch.autograd.grad(out.values().sin().sum(), x)[0]
    for o, gx, c in zip(out.unbind(), grad.unbind(), comps):
        c = c.detach().requires_grad_()
        qc = c.transpose(0, 1)[..., ::2]
        want = F.scaled_dot_product_attention(qc, qc, qc)
        torch.testing.assert_close(o, want)
        torch.testing.assert_close(gx, torch.autograd.grad(want.sin().sum(), c)[0])


def test_an_empty_head_dim_attends_uniformly_as_dense():
    """q and k with head dim 0 score 0 everywhere: dense torch averages v (no division by √0)."""
    import torch.nn.functional as F

    import torch_multijagged as mj

    g = torch.Generator().manual_seed(3)
    qs = [torch.randn(n, 2, 0, dtype=torch.float64) for n in (3, 0, 1, 2)]
    vs = [torch.randn(n, 2, 4, dtype=torch.float64, generator=g) for n in (3, 0, 1, 2)]
    q = mj.nested_tensor(qs).transpose(1, 2)
    v = mj.nested_tensor(vs).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, q, v)
    for o, a, b in zip(out.unbind(), qs, vs):
        a, b = a.transpose(0, 1), b.transpose(0, 1)
        torch.testing.assert_close(o, F.scaled_dot_product_attention(a, a, b))


@pytest.mark.parametrize("name", ["loop", "bucketed", "blocks"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("dv", [16, 8])
def test_forward_without_lse_matches_oracle(name, causal, heads, dv, monkeypatch):
    """NOTE [ Short segments without the row log-sum-exp ]: float32 segments whose scores
    ``H·Lq·Lk`` fall in the unfused range (4·40·40, 4·48·30), below it (4·3·3) and above it
    (4·400·400), with empty segments on either side, attend as the oracle when no ``lse`` is
    asked for. The unfused formula runs for the segments in range that are called alone: every
    one in the loop, the runs of one segment in blocks (two equal consecutive segments are one
    fused call), none in buckets of several segments; with a value head size of its own (which
    the fused kernel does not take) as well."""
    from torch_multijagged.kernels import attention_common as kcommon

    hq, hk = heads
    lq, lk = [40, 48, 0, 40, 3, 6, 400, 40, 40], [40, 30, 5, 40, 3, 0, 400, 40, 40]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lq), hq, 16, generator=g)
    k = torch.randn(sum(lk), hk, 16, generator=g)
    v = torch.randn(sum(lk), hk, dv, generator=g)
    calls = []
    real = kcommon._softmax_forward

    def spy(qb, *args):
        calls.append(qb.shape[-2])
        return real(qb, *args)

    monkeypatch.setattr(kcommon, "_softmax_forward", spy)
    from torch_multijagged.kernels import attention_bucketed as kbucketed
    real_into = kbucketed.segment_softmax_into

    def spy_into(dest, qs, *args):  # the loop's segments of their own, straight into the output rows
        took = real_into(dest, qs, *args)
        if took:
            calls.append(qs.shape[0])
        return took

    monkeypatch.setattr(kbucketed, "segment_softmax_into", spy_into)
    out, _ = BACKENDS[name][0](q, k, v, _cu(lq), _cu(lk), None, None, None, causal, 0.3, 0.0, need_lse=False)
    want = oracle(q.double(), k.double(), v.double(), _cu(lq), _cu(lk), None, None, None, causal, 0.3, 0.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    if name != "bucketed":
        assert sorted(calls) == {"loop": [40, 40, 40, 40, 48], "blocks": [40, 40, 48]}[name]
    # a forward that a backward will read computes lse, with the fused kernel
    calls.clear()
    out, lse = BACKENDS[name][0](q, k, v, _cu(lq), _cu(lk), None, None, None, causal, 0.3, 0.0)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    assert not calls and lse.shape == (sum(lq), hq) and bool(torch.isfinite(lse[:sum(lq[:5])]).all())


@pytest.mark.parametrize("backend", [None, "loop", "blocks"])
def test_inference_attention_per_sample_and_without_leakage(backend):
    """Under ``no_grad`` (no ``lse``: NOTE [ Short segments without the row log-sum-exp ]) a
    float32 ``(B, H, j, D)`` batch attends as each sample alone, an empty sample included, and
    changing one sample leaves the others' outputs unchanged."""
    import torch.nn.functional as F

    import torch_multijagged as mj
    from torch_multijagged.compile import attention as cattn

    g = torch.Generator().manual_seed(11)
    comps = [torch.randn(n, 4, 32, generator=g) for n in (60, 0, 120, 30)]

    def run(cs):
        x = mj.nested_tensor(cs).transpose(1, 2)
        with torch.no_grad(), cattn.backend(backend):
            return F.scaled_dot_product_attention(x, x, x, is_causal=True).unbind()

    outs = run(comps)
    for o, c in zip(outs, comps):
        c = c.transpose(0, 1)
        torch.testing.assert_close(o, F.scaled_dot_product_attention(c, c, c, is_causal=True))
    changed = run([comps[0], comps[1], comps[2] * 3, comps[3]])
    for i in (0, 1, 3):
        assert torch.equal(changed[i], outs[i])


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_non_finite_output_gradient_stays_in_its_segment(name, fused):
    """An output gradient that is inf / NaN in one segment (a loss that overflowed there) gives
    that segment non-finite gradients, as dense attention of that sample alone does, and leaves
    every other segment's gradients those of the segment alone: padded query slots of a bucket
    read some segment's rows and must add nothing (0 · inf is NaN), whatever those rows hold."""
    g = torch.Generator().manual_seed(3)
    lq = [3, 1, 4, 2, 0, 4]
    hq = 2
    q, k, v = (torch.randn(sum(lq), hq, 3, generator=g, dtype=torch.float64) for _ in range(3))
    cu = _cu(lq)
    go = torch.randn(sum(lq), hq, 3, generator=g, dtype=torch.float64)
    go[0, 0, 1] = float("inf")  # the first query row of segment 0: where padded slots point
    go[1, 1, 0] = float("nan")
    fwd, bwd = BACKENDS[name]
    # one bucket of every segment: each shorter segment's padded slots point at row 0
    kw = {"buckets": [torch.arange(len(lq))], "fused": fused} if name == "bucketed" else {}
    if name != "bucketed" and not fused:
        pytest.skip("one path")
    out, lse = fwd(q, k, v, cu, cu, None, None, None, False, None, 0.0, **kw)
    dq, dk, dv, _ = bwd(go, q, k, v, out, lse, cu, cu, None, None, None, False, None, 0.0, False, **kw)
    for s in range(1, len(lq)):
        a, b = int(cu[s]), int(cu[s + 1])
        leaves = [t[a:b].clone().requires_grad_() for t in (q, k, v)]
        ref = oracle(*leaves, _cu([b - a]), _cu([b - a]), None, None, None, False, None, 0.0)
        want = torch.autograd.grad(ref, leaves, go[a:b], allow_unused=True) if b > a else [t[a:b] for t in (q, k, v)]
        for got, w in zip((dq, dk, dv), want):
            torch.testing.assert_close(got[a:b], torch.zeros_like(got[a:b]) if w is None else w)
    assert not bool(torch.isfinite(dq[:3]).all())  # segment 0's own gradients are non-finite, as dense


@pytest.mark.parametrize("causal", [False, True])
def test_loop_segments_into_the_output_rows_are_the_gathered_path_s_bits(causal, monkeypatch):
    """The ``loop`` backend's segments of their own go straight from the packed rows into the
    output rows (``segment_softmax_into``): with one intra-op thread the product writes the rows
    itself, with two through a copy. Both give the bits of the gathered path it replaces."""
    from torch_multijagged.kernels import attention_bucketed as kbucketed

    lq, lk = [40, 48, 0, 40, 3], [40, 30, 5, 40, 3]
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(sum(n), 4, 16, generator=g) for n in (lq, lk, lk))
    run = BACKENDS["loop"][0]
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2):
            torch.set_num_threads(t)
            outs.append(run(q, k, v, _cu(lq), _cu(lk), None, None, None, causal, 0.3, 0.0, need_lse=False)[0])
        monkeypatch.setattr(kbucketed, "segment_softmax_into", lambda *args: False)
        gathered = run(q, k, v, _cu(lq), _cu(lk), None, None, None, causal, 0.3, 0.0, need_lse=False)[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], gathered) and torch.equal(outs[1], gathered)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_without_lse_keeps_reduced_precision_fused(dtype, monkeypatch):
    """The unfused formula is float32's: in half precision its products would round the scores,
    where the fused kernel accumulates in float32. Half-precision segments in its score range keep
    the fused kernel, and attend as the oracle within the dtype's tolerance."""
    from torch_multijagged.kernels import attention_common as kcommon

    lq = lk = [40, 48, 0, 40]
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(sum(lq), 4, 16, generator=g).to(dtype) for _ in range(3))
    took = []
    real = kcommon._unfused_fits

    def spy(t, scores):
        ok = real(t, scores)
        took.append(ok)
        return ok

    monkeypatch.setattr(kcommon, "_unfused_fits", spy)
    out, _ = BACKENDS["loop"][0](q, k, v, _cu(lq), _cu(lk), None, None, None, False, 0.3, 0.0, need_lse=False)
    assert took and not any(took)
    want = oracle(q.double(), k.double(), v.double(), _cu(lq), _cu(lk), None, None, None, False, 0.3, 0.0)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
