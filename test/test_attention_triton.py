"""The Triton varlen attention kernels (kernels/attention_triton.py) and their ops
(compile/triton_attention.py) against the oracle ``attention_reference`` / ``_backward``
(NOTE [ Varlen attention contract ]) and, for one case, dense SDPA per segment.

Without CUDA the kernels run in Triton's interpreter on CPU tensors: TRITON_INTERPRET must be set
before ``triton.jit`` decorates them, so this module sets it before importing the kernels (and
leaves it set: triton reads it again at run time). The interpreter is slow, so the cases are few
and small; small tiles (``block_m``/``block_n`` = 16) make segments of up to ~40 rows span several
blocks, which is what the block loops, the causal bounds and the atomics need covering.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from torch_multijagged.kernels import attention_triton as kt  # noqa: E402
from torch_multijagged.kernels.attention import attention_reference, attention_reference_backward  # noqa: E402

if not CUDA and type(kt._fwd_kernel).__name__ != "InterpretedFunction":
    pytest.skip("the Triton kernels were imported before TRITON_INTERPRET=1 was set; run this module alone "
                "or set TRITON_INTERPRET=1", allow_module_level=True)

from torch_multijagged.compile import triton_attention  # noqa: E402,F401  (registers the ops)

DEVICE = "cuda" if CUDA else "cpu"
OPS = torch.ops.multijagged
SMALL = dict(block_m=16, block_n=16)
NEG_INF = float("-inf")


def _cu(lengths):
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    return F.pad(lengths.cumsum(0), (1, 0)).to(DEVICE)


def _case(lq, lk, hq=2, hk=1, d=8, dv=None, hb=None, dtype=torch.float32, share=False, masked=0.0, seed=0):
    """Packed q, k, v (+ bias with one block per segment, or one per distinct shape if ``share``)."""
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    cu_q, cu_k = _cu(lq), _cu(lk)
    tq, tk = sum(lq), sum(lk)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE, dtype)

    q, k, v = rnd(tq, hq, d), rnd(tk, hk, d), rnd(tk, hk, dv)
    bias = bias_start = None
    if hb is not None:
        starts, blocks, total = [], {}, 0
        for a, b in zip(lq, lk):
            key = (a, b) if share else len(starts)
            if key not in blocks:
                blocks[key], total = total, total + a * b
            starts.append(blocks[key])
        bias = torch.randn(total, hb, generator=g)
        if masked:
            bias[torch.rand(total, hb, generator=g) < masked] = NEG_INF
        bias = bias.to(DEVICE, dtype)
        bias_start = torch.tensor(starts, dtype=torch.int64, device=DEVICE)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max(lq, default=0), max_k=max(lk, default=0),
                bias=bias, bias_start=bias_start)


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _run_both(c, causal, scale=None, need_dbias=None, **tiles):
    """(kernel, reference) forward outputs and backward grads for one case."""
    need_dbias = c["bias"] is not None if need_dbias is None else need_dbias
    args = (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], c["bias"], c["bias_start"])
    out, lse = kt.attention_triton(*args, causal, scale, **tiles)
    ref_out, ref_lse = attention_reference(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["bias"], c["bias_start"],
                                           None, causal, scale)
    grad = torch.randn_like(out)
    grads = kt.attention_triton_backward(grad, *args[:3], out, lse, *args[3:], causal, scale, need_dbias, **tiles)
    ref_grads = attention_reference_backward(grad, c["q"], c["k"], c["v"], ref_out, ref_lse, c["cu_q"], c["cu_k"],
                                             c["bias"], c["bias_start"], None, causal, scale, 0.0, need_dbias)
    return (out, lse, *grads), (ref_out, ref_lse, *ref_grads)


def _assert_matches(got, ref, dtype):
    names = ("out", "lse", "dq", "dk", "dv", "dbias")
    for name, a, b in zip(names, got, ref):
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert torch.isfinite(a).all() or name == "lse", name
        if name == "lse":  # unspecified where a query sees no key (both give -inf there)
            live = torch.isfinite(b)
            a, b = a[live], b[live]
        torch.testing.assert_close(a.float(), b.float(), **_tol(dtype), msg=name)


# ----------------------------------------------------------------------------- kernels vs oracle
CASES = {
    # name: (lq, lk, hq, hk, d, dv, hb, causal, dtype)
    "mha_nobias": ([3, 0, 1, 20, 5], [4, 3, 0, 17, 1], 2, 2, 8, 8, None, False, torch.float32),
    "gqa_bias_per_head_causal": ([33, 1, 0, 7], [40, 2, 5, 7], 4, 2, 12, 7, 4, True, torch.float32),
    "gqa_bias_shared_heads": ([17, 2, 9], [5, 19, 9], 4, 1, 5, 16, 1, False, torch.float32),
    "mqa_bias1_causal_d_odd": ([1, 23, 6], [1, 12, 30], 3, 1, 20, 3, 1, True, torch.float32),
    "fp16_gqa_bias_causal": ([18, 0, 5], [21, 4, 5], 4, 2, 16, 16, 4, True, torch.float16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_reference(name):
    lq, lk, hq, hk, d, dv, hb, causal, dtype = CASES[name]
    c = _case(lq, lk, hq, hk, d, dv, hb, dtype, masked=0.1)
    got, ref = _run_both(c, causal, scale=0.37, **SMALL)
    _assert_matches(got, ref, dtype)


def test_kernels_default_tiles_match_reference():
    # the launchers' own tiles (one block per short segment), default scale 1/sqrt(D)
    c = _case([9, 0, 30, 1], [12, 6, 25, 0], 4, 2, 24, 24, 4, masked=0.1)
    got, ref = _run_both(c, causal=True)
    _assert_matches(got, ref, torch.float32)


@pytest.mark.skipif(not CUDA, reason="Triton's interpreter multiplies the raw bits of bfloat16 tl.dot operands "
                    "(triton-lang/triton#11584: not supported yet)")
def test_kernels_bfloat16():
    c = _case([7, 12], [9, 3], 2, 1, 16, 16, 1, torch.bfloat16)
    out, lse = kt.attention_triton(*(c[n] for n in ("q", "k", "v", "cu_q", "cu_k", "max_q", "max_k", "bias",
                                                    "bias_start")), False, None, **SMALL)
    ref, _ = attention_reference(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["bias"], c["bias_start"])
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_kernels_shared_bias_blocks():
    # segments 0, 2, 3 share one (4, 6) block and segments 1, 4 one (2, 3) block: dbias sums over them
    c = _case([4, 2, 4, 4, 2, 0], [6, 3, 6, 6, 3, 5], 2, 2, 8, 8, 2, share=True)
    assert c["bias_start"].tolist() == [0, 24, 0, 0, 24, 30]
    got, ref = _run_both(c, causal=False, **SMALL)
    _assert_matches(got, ref, torch.float32)
    c1 = _case([4, 2, 4, 4, 2], [6, 3, 6, 6, 3], 4, 2, 8, 8, 1, share=True, seed=1)  # and over heads (Hb = 1)
    got, ref = _run_both(c1, causal=True, **SMALL)
    _assert_matches(got, ref, torch.float32)


def test_kernels_fully_masked_rows_and_empty_segments():
    lq, lk = [5, 0, 3, 4], [6, 4, 0, 3]
    c = _case(lq, lk, 2, 1, 8, 8, 2)
    bias = c["bias"].clone()
    bias[0:6] = NEG_INF  # segment 0, query 0: every key masked, both heads
    bias[30 + 3:30 + 6, 1] = NEG_INF  # segment 3, query 1, head 1
    c["bias"] = bias
    got, ref = _run_both(c, causal=False, **SMALL)
    _assert_matches(got, ref, torch.float32)
    out, lse, dq = got[0], got[1], got[2]
    dead_q = [0, 5, 6, 7]  # seg 0 row 0, seg 2 (no keys) rows 5..7
    assert (out[dead_q] == 0).all() and (dq[dead_q] == 0).all()
    assert (out[9, 1] == 0).all() and (dq[9, 1] == 0).all() and (out[9, 0] != 0).any()
    assert torch.isneginf(lse[dead_q]).all()
    dk, dv = got[3], got[4]
    assert (dk[6:10] == 0).all() and (dv[6:10] == 0).all()  # segment 1: keys but no queries


def test_kernels_non_contiguous_inputs():
    lq, lk = [6, 0, 11], [9, 2, 4]
    c = _case(lq, lk, 2, 2, 8, 8, 2, masked=0.1)
    # transposed / strided views of the same values
    q = c["q"].transpose(0, 1).contiguous().transpose(0, 1)
    k = torch.stack([c["k"], c["k"]], -1)[..., 0]  # head-dim stride 2
    v = c["v"].permute(2, 0, 1).contiguous().permute(1, 2, 0)
    bias = c["bias"].t().contiguous().t()
    cu_q = torch.stack([c["cu_q"], c["cu_q"]], 1)[:, 0]
    assert not any(t.is_contiguous() for t in (q, k, v, bias, cu_q))
    assert torch.equal(k, c["k"])
    nc = dict(c, q=q, k=k, v=v, bias=bias, cu_q=cu_q)
    got, ref = _run_both(nc, causal=True, **SMALL)
    _assert_matches(got, ref, torch.float32)
    # an expanded (stride-0) output gradient, as `out.sum().backward()` makes
    args = (q, k, v, cu_q, c["cu_k"], c["max_q"], c["max_k"], bias, c["bias_start"])
    out, lse = kt.attention_triton(*args, True, None, **SMALL)
    grad = torch.ones((), device=DEVICE).expand_as(out)
    got = kt.attention_triton_backward(grad, q, k, v, out, lse, *args[3:], True, None, True, **SMALL)
    want = attention_reference_backward(grad.contiguous(), c["q"], c["k"], c["v"], out, lse, c["cu_q"], c["cu_k"],
                                        c["bias"], c["bias_start"], None, True, None, 0.0, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_kernels_match_dense_sdpa_per_segment():
    # anchors the oracle: unbind the segments, run dense SDPA on each (GQA by repeat_interleave)
    lq, lk = [5, 0, 12, 1], [7, 3, 12, 4]
    c = _case(lq, lk, 4, 2, 8, 8, 4, masked=0.0)
    args = (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], c["bias"], c["bias_start"])
    out, _ = kt.attention_triton(*args, False, None, **SMALL)
    cq, ck, bs = c["cu_q"].tolist(), c["cu_k"].tolist(), c["bias_start"].tolist()
    for s, (a, b) in enumerate(zip(lq, lk)):
        qs = c["q"][cq[s]:cq[s + 1]].transpose(0, 1)
        ks = c["k"][ck[s]:ck[s + 1]].transpose(0, 1).repeat_interleave(2, 0)
        vs = c["v"][ck[s]:ck[s + 1]].transpose(0, 1).repeat_interleave(2, 0)
        mask = c["bias"][bs[s]:bs[s] + a * b].reshape(a, b, 4).permute(2, 0, 1)
        want = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask) if a else qs.new_zeros(4, 0, 8)
        torch.testing.assert_close(out[cq[s]:cq[s + 1]].transpose(0, 1), want, atol=1e-5, rtol=1e-5)


def test_kernels_no_cross_segment_leakage():
    lq, lk = [4, 6, 3], [5, 7, 2]
    c = _case(lq, lk, 2, 1, 8, 8, 1)
    args = lambda c: (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], c["bias"],
                      c["bias_start"])
    out, _ = kt.attention_triton(*args(c), False, None, **SMALL)
    c2 = dict(c, k=c["k"].clone(), v=c["v"].clone(), bias=c["bias"].clone())
    c2["k"][5:12] += 3.0  # segment 1's keys, values and bias block
    c2["v"][5:12] -= 1.0
    c2["bias"][20:62] += 2.0
    out2, _ = kt.attention_triton(*args(c2), False, None, **SMALL)
    assert torch.equal(out[:4], out2[:4]) and torch.equal(out[10:], out2[10:])
    assert not torch.equal(out[4:10], out2[4:10])


def test_kernels_empty_batch():
    c = _case([], [], 2, 1, 8, 8, 1)
    got, ref = _run_both(c, causal=False)
    assert got[0].shape == (0, 2, 8) and got[2].shape == (0, 2, 8) and got[5].shape == (0, 1)
    c = _case([0, 0], [0, 3], 2, 1, 8, 8)
    got, ref = _run_both(c, causal=True)
    _assert_matches(got, ref, torch.float32)


def test_kernels_reject_bad_arguments():
    c = _case([2], [3], 2, 1, 8, 8)
    args = (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], 2, 3)
    with pytest.raises(ValueError, match="no dropout"):
        kt.attention_triton(*args, keep=torch.ones(6, 2, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="expected q, k, v of one dtype"):
        kt.attention_triton(c["q"].double(), c["k"].double(), c["v"].double(), *args[3:])
    with pytest.raises(ValueError, match="Hq % Hk"):
        kt.attention_triton(c["q"][:, :1].expand(-1, 3, -1), torch.cat([c["k"]] * 2, 1), torch.cat([c["v"]] * 2, 1),
                            *args[3:])
    with pytest.raises(ValueError, match="head sizes <= 128"):
        kt.attention_triton(c["q"].new_zeros(2, 2, 130), c["k"].new_zeros(3, 1, 130), c["v"], *args[3:])
    with pytest.raises(ValueError, match="bias and bias_start together"):
        kt.attention_triton(*args, bias=c["q"].new_zeros(6, 1))


# ----------------------------------------------------------------------------- the ops
def _op_args(c, causal, scale):
    return (c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], c["bias"], c["bias_start"], causal,
            scale)


def test_op_autograd_matches_reference():
    c = _case([6, 0, 9], [4, 5, 9], 4, 2, 8, 8, 1, masked=0.1)
    leaves = [c[n].requires_grad_() for n in ("q", "k", "v", "bias")]
    out, lse = OPS.varlen_attention_triton(*_op_args(c, True, 0.5))
    assert not lse.requires_grad
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    ref_out, ref_lse = attention_reference(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["bias"], c["bias_start"],
                                           None, True, 0.5)
    want = attention_reference_backward(grad, c["q"], c["k"], c["v"], ref_out, ref_lse, c["cu_q"], c["cu_k"], c["bias"],
                                        c["bias_start"], None, True, 0.5, 0.0, True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # no bias gradient asked for: the backward op returns an empty dbias, autograd none
    c["bias"].requires_grad_(False)
    out, _ = OPS.varlen_attention_triton(*_op_args(c, True, 0.5))
    assert torch.autograd.grad(out, [c["q"]], grad)[0].shape == c["q"].shape


def test_op_double_backward_raises():
    c = _case([3, 2], [2, 4], 2, 1, 8, 8)
    q = c["q"].requires_grad_()
    out, _ = OPS.varlen_attention_triton(*_op_args(c, False, 0.3))
    (gq,) = torch.autograd.grad(out.square().sum(), [q], create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward is not supported for layout torch.multi_jagged"):
        torch.autograd.grad(gq.sum(), [q])


def test_op_opcheck():
    c = _case([3, 0, 5], [4, 2, 5], 2, 1, 8, 8, 2)
    c["q"].requires_grad_()
    c["bias"].requires_grad_()
    # Under the interpreter the ops cannot run on fake tensors (the interpreter reads their data),
    # so the fake-tensor and aot-dispatch checks need CUDA; schema and autograd registration run.
    utils = None if CUDA else ("test_schema", "test_autograd_registration")
    kw = {} if utils is None else dict(test_utils=utils)
    torch.library.opcheck(OPS.varlen_attention_triton, _op_args(c, True, 0.4), **kw)
    out, lse = OPS.varlen_attention_triton(*_op_args(c, True, 0.4))
    bargs = (torch.randn_like(out), c["q"], c["k"], c["v"], out.detach(), lse, c["cu_q"], c["cu_k"], c["max_q"],
             c["max_k"], c["bias"], c["bias_start"], True, 0.4, True)
    torch.library.opcheck(OPS.varlen_attention_triton_backward, bargs, **kw)


@pytest.mark.skipif(not CUDA, reason="torch.compile of a triton_op needs CUDA (wrap_triton is eager-only in the "
                    "interpreter)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_op_compiles_cuda(dtype):
    c = _case([5, 0, 40, 1], [7, 3, 33, 9], 4, 2, 64, 64, 1, dtype, masked=0.05)
    leaves = [c[n].requires_grad_() for n in ("q", "k", "v", "bias")]

    def f(q, k, v, bias):
        out, _ = OPS.varlen_attention_triton(q, k, v, c["cu_q"], c["cu_k"], c["max_q"], c["max_k"], bias,
                                             c["bias_start"], True, 0.125)
        return out

    out = torch.compile(f, fullgraph=True)(*leaves)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    ref_out, ref_lse = attention_reference(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"], c["bias"], c["bias_start"],
                                           None, True, 0.125)
    want = attention_reference_backward(torch.ones_like(out), c["q"], c["k"], c["v"], ref_out, ref_lse, c["cu_q"],
                                        c["cu_k"], c["bias"], c["bias_start"], None, True, 0.125, 0.0, True)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, **_tol(dtype))


@pytest.mark.skipif(not CUDA, reason="the production tiles compile for the GPU only")
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_kernels_production_tiles_cuda(d, dtype):
    lq = torch.randint(0, 200, (24,)).tolist()
    lk = torch.randint(0, 256, (24,)).tolist()
    c = _case(lq, lk, 8, 2, d, d, 8, dtype, masked=0.05)
    got, ref = _run_both(c, causal=False)
    _assert_matches(got, ref, dtype)
