"""The Triton segment kernels (kernels/segment_triton.py) and their ops (compile/triton_segment.py)
against the references ``segment_reduce`` / ``segment_softmax`` / ``segment_softmax_backward``
(kernels/reference.py), and the reductions / softmax of a multi_jagged pair with the kernels forced
on against the default path and the per-sample dense reference.

Without CUDA the kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET is set before
the kernels are imported, as in test_attention_triton.py). The interpreter is slow, so the cases
are few and small; ``block_t=4`` makes segments of a few rows span several row tiles.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import torch_multijagged as mj  # noqa: E402
from torch_multijagged.compile import kernel_choice  # noqa: E402
from torch_multijagged.compile import segment as seg  # noqa: E402
from torch_multijagged.kernels import reference as ref  # noqa: E402
from torch_multijagged.kernels import segment_triton as kt  # noqa: E402

if not CUDA and type(kt._reduce_kernel).__name__ != "InterpretedFunction":
    pytest.skip("the Triton kernels were imported before TRITON_INTERPRET=1 was set; run this module alone "
                "or set TRITON_INTERPRET=1", allow_module_level=True)

from torch_multijagged.compile import triton_segment  # noqa: E402,F401  (registers the ops)

DEVICE = "cuda" if CUDA else "cpu"
OPS = torch.ops.multijagged
KINDS = ("sum", "mean", "amax", "amin", "logsumexp")
# what an empty segment holds in dense torch (amax/amin: the handler's choice, any value works)
EMPTY = {"sum": 0.0, "mean": float("nan"), "amax": -5.0, "amin": 5.0, "logsumexp": float("-inf")}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _tol(dtype):
    return {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-5, rtol=1e-5),
            torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}[dtype]


def _case(t, feat, out_rows, dtype=torch.float32, seed=0, ties=False, device=DEVICE):
    """values (t, *feat) and an unsorted index into ``out_rows`` segments; segment 1 (and the last
    when out_rows > 3) is empty."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(t, *feat, generator=g, dtype=torch.float64)
    if ties:
        v = (v * 2).round() / 2
    live = [r for r in range(out_rows) if r != 1 and not (out_rows > 3 and r == out_rows - 1)]
    index = torch.tensor(live, dtype=torch.int64)[torch.randint(len(live), (t,), generator=g)] if t else \
        torch.zeros(0, dtype=torch.int64)
    return v.to(device, dtype), index.to(device)


def _ref_reduce(v, index, rows, kind):
    """The reference in float64 (half types: then rounded once, as the kernel rounds)."""
    return ref.segment_reduce(v.double(), index, rows, kind, EMPTY[kind]).to(v.dtype)


# ----------------------------------------------------------------------------- kernels vs reference
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_reduce_kernel_matches_reference(kind, dtype):
    for t, feat, rows in ((13, (), 5), (17, (3,), 6), (9, (2, 5), 4)):
        v, index = _case(t, feat, rows, dtype, ties=kind in ("amax", "amin"))
        got = kt.segment_reduce_triton(v, index, rows, kind, EMPTY[kind], block_t=4)
        want = _ref_reduce(v, index, rows, kind)
        assert got.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, equal_nan=True, **_tol(dtype))
        if kind in ("amax", "amin"):  # exact, empty segments included
            assert torch.equal(got, want)
        empty = got[1]  # segment 1 has no rows: it holds `empty` exactly
        assert torch.equal(empty, torch.full_like(empty, EMPTY[kind])) or EMPTY[kind] != EMPTY[kind]


def test_reduce_kernel_matches_reference_float32_reference_dtype():
    # against the reference run in float32 itself (the handler's float32 path), default tiles
    v, index = _case(40, (33,), 7)
    for kind in KINDS:
        got = kt.segment_reduce_triton(v, index, 7, kind, EMPTY[kind])
        want = ref.segment_reduce(v, index, 7, kind, EMPTY[kind])
        torch.testing.assert_close(got, want, equal_nan=True, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_reduce_kernel_zero_rows_and_zero_segments(kind):
    v, index = _case(0, (3,), 4)
    got = kt.segment_reduce_triton(v, index, 4, kind, EMPTY[kind])
    torch.testing.assert_close(got, torch.full((4, 3), EMPTY[kind], device=DEVICE), equal_nan=True)
    v, index = _case(0, (3,), 0)
    assert kt.segment_reduce_triton(v, index, 0, kind, EMPTY[kind]).shape == (0, 3)
    v, index = _case(5, (0, 2), 3)  # no feature elements
    assert kt.segment_reduce_triton(v, index, 3, kind, EMPTY[kind]).shape == (3, 0, 2)


def test_reduce_kernel_non_finite():
    inf, nan = float("inf"), float("nan")
    # segments: 0 = [1, nan, 2], 1 = [-inf, -inf], 2 = [3, +inf], 3 = [] (empty)
    v = torch.tensor([1.0, -inf, nan, 3.0, -inf, 2.0, inf], device=DEVICE).unsqueeze(1)
    index = torch.tensor([0, 1, 0, 2, 1, 0, 2], device=DEVICE)
    for kind in KINDS:
        got = kt.segment_reduce_triton(v, index, 4, kind, EMPTY[kind], block_t=2)
        want = ref.segment_reduce(v, index, 4, kind, EMPTY[kind])
        torch.testing.assert_close(got, want, equal_nan=True, msg=kind)
    # the dense ops' values, written out
    lse = kt.segment_reduce_triton(v, index, 4, "logsumexp", -inf)[:, 0].tolist()
    assert lse[0] != lse[0] and lse[1] == -inf and lse[2] == inf and lse[3] == -inf  # = [nan, -inf, inf, -inf]
    amax = kt.segment_reduce_triton(v, index, 4, "amax", -7.0)[:, 0].tolist()
    assert amax[0] != amax[0] and amax[1:] == [-inf, inf, -7.0]  # = [nan (NaN wins), -inf, inf, empty]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_kernels_match_reference(log, dtype):
    for t, feat, rows in ((13, (), 5), (17, (3, 2), 6)):
        v, index = _case(t, feat, rows, dtype)
        got = kt.segment_softmax_triton(v, index, rows, log, block_t=4)
        want = ref.segment_softmax(v.double(), index, rows, log).to(dtype)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, **_tol(dtype))
        grad = torch.randn(v.shape, dtype=torch.float64).to(DEVICE, dtype)
        gi = kt.segment_softmax_backward_triton(grad, got, index, rows, log, block_t=4)
        want_gi = ref.segment_softmax_backward(grad.double(), got.double(), index, rows, log).to(dtype)
        torch.testing.assert_close(gi, want_gi, **_tol(dtype))


def test_softmax_kernels_non_finite_and_empty():
    inf = float("inf")
    # segments: 0 = [-inf, 1, 2], 1 = [-inf, -inf] (dense softmax: NaN), 2 = [+inf, 0] (NaN)
    v = torch.tensor([-inf, -inf, 1.0, inf, -inf, 2.0, 0.0], device=DEVICE).unsqueeze(1)
    index = torch.tensor([0, 1, 0, 2, 1, 0, 2], device=DEVICE)
    for log in (False, True):
        got = kt.segment_softmax_triton(v, index, 4, log, block_t=2)
        want = ref.segment_softmax(v, index, 4, log)
        torch.testing.assert_close(got, want, equal_nan=True)
        dense = (torch.log_softmax if log else torch.softmax)(torch.tensor([-inf, 1.0, 2.0]), 0)
        torch.testing.assert_close(got[[0, 2, 5], 0].cpu(), dense)
    v, index = _case(0, (3,), 2)
    assert kt.segment_softmax_triton(v, index, 2).shape == (0, 3)
    assert kt.segment_softmax_backward_triton(v, v, index, 2).shape == (0, 3)


def test_kernels_reject_bad_arguments():
    v, index = _case(4, (2,), 3)
    with pytest.raises(ValueError, match=r"segment_reduce_triton\(\): expected reduce in"):
        kt.segment_reduce_triton(v, index, 3, "prod")
    with pytest.raises(TypeError, match="expected values of a dtype"):
        kt.segment_reduce_triton(v.long(), index, 3, "sum")
    with pytest.raises(TypeError, match="expected an int64 index"):
        kt.segment_softmax_triton(v, index.int(), 3)
    with pytest.raises(ValueError, match="expected values"):
        kt.segment_softmax_triton(v, index[:2], 3)


def test_reference_mean_and_logsumexp_golden():
    # the twins' new kinds, written out; segment 1 is empty (dense torch: NaN mean, -inf logsumexp)
    v = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    index = torch.tensor([0, 0, 2])
    mean = ref.segment_reduce(v, index, 3, "mean", float("nan"))[:, 0]
    torch.testing.assert_close(mean, torch.tensor([1.5, float("nan"), 4.0], dtype=torch.float64), equal_nan=True)
    # = [(1 + 2) / 2, empty, 4]
    lse = ref.segment_reduce(v, index, 3, "logsumexp", float("-inf"))[:, 0]
    want = torch.tensor([math.log(math.exp(1) + math.exp(2)), float("-inf"), 4.0], dtype=torch.float64)
    torch.testing.assert_close(lse, want)  # = [log(e¹ + e²), empty, log(e⁴)]
    for kind, got in (("mean", mean), ("logsumexp", lse)):
        k = kt.segment_reduce_triton(v.to(DEVICE), index.to(DEVICE), 3, kind, EMPTY[kind])
        torch.testing.assert_close(k[:, 0].cpu(), got, equal_nan=True)


def test_dispatch_picks_the_kernel_only_where_it_applies(monkeypatch):
    launches = []
    real = kt._launch
    monkeypatch.setattr(kt, "_launch", lambda kernel, *a, **k: (launches.append(kernel), real(kernel, *a, **k)))
    v, index = _case(6, (2,), 3)
    with kernel_choice.triton_kernels(True):
        for args in ((v.long(), index, 3, "sum"), (v, index, 3, "prod"), (v, torch.zeros_like(index), 1, "sum")):
            torch.testing.assert_close(seg.segment_reduce(*args), ref.segment_reduce(*args))
        assert launches == []  # integers, prod, one segment: the reference
        torch.testing.assert_close(seg.segment_reduce(v, index, 3, "sum"), ref.segment_reduce(v, index, 3, "sum"))
        seg.segment_softmax(v, index, 3)
        seg.segment_softmax_backward(v, v, index, 3)
    assert launches == [kt._reduce_kernel, kt._softmax_kernel, kt._softmax_bwd_kernel]


# ----------------------------------------------------------------------------- ops: autograd
def _leaf(t, feat, rows, seed=0, ties=False):
    v, index = _case(t, feat, rows, torch.float64, seed=seed, ties=ties)
    return v.requires_grad_(), index


def _grads(fn, v, seed=1):
    """First and (through a weighted sum of the first) second derivatives of ``fn(v)``."""
    out = fn(v)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    (gi,) = torch.autograd.grad(out, v, g, create_graph=True)
    w = torch.randn(gi.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=gi.dtype).to(gi.device)
    # linear kinds (sum, mean): the first derivative is constant in v
    ggi = torch.autograd.grad(gi, v, w)[0] if gi.requires_grad else torch.zeros_like(v)
    return out, gi, ggi


def _close(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, equal_nan=True, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_reduce_op_gradients_match_reference(kind):
    """First and second derivatives of the op equal autograd through the reference (amax/amin
    with ties: the gradient is shared evenly, as dense amax)."""
    v, index = _leaf(11, (2,), 5, ties=kind in ("amax", "amin"))
    empty = 0.0 if kind in ("mean", "logsumexp") else EMPTY[kind]  # finite: gradients of empty rows

    def op(x):
        return OPS.segment_reduce_triton(x, index, 5, kind, empty)

    def twin(x):
        return ref.segment_reduce(x, index, 5, kind, empty)

    got, want = _grads(op, v), _grads(twin, v)
    _close(got, want)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_op_gradients_match_reference(log):
    v, index = _leaf(12, (3,), 5)
    got = _grads(lambda x: OPS.segment_softmax_triton(x, index, 5, log), v)
    want = _grads(lambda x: ref.segment_softmax(x, index, 5, log), v)
    _close(got, want)
    # the backward op's own derivative w.r.t. both its inputs (a third-order term of softmax)
    y = ref.segment_softmax(v.detach(), index, 5, log).requires_grad_()
    g = torch.randn_like(y).requires_grad_()
    gg = torch.randn_like(y)
    a = torch.autograd.grad(OPS.segment_softmax_backward_triton(g, y, index, 5, log), (g, y), gg)
    b = torch.autograd.grad(ref.segment_softmax_backward(g, y, index, 5, log), (g, y), gg)
    _close(a, b)


def test_ops_opcheck():
    # Under the interpreter the ops cannot run on fake tensors (the interpreter reads their data),
    # so the fake-tensor and aot-dispatch checks need CUDA; schema and autograd registration run.
    kw = {} if CUDA else dict(test_utils=("test_schema", "test_autograd_registration"))
    v, index = _case(9, (3,), 4)
    v.requires_grad_()
    for kind in KINDS:
        torch.library.opcheck(OPS.segment_reduce_triton, (v, index, 4, kind, EMPTY[kind]), **kw)
    for log in (False, True):
        torch.library.opcheck(OPS.segment_softmax_triton, (v, index, 4, log), **kw)
        y = OPS.segment_softmax_triton(v.detach(), index, 4, log)
        g = torch.randn_like(y).requires_grad_()
        torch.library.opcheck(OPS.segment_softmax_backward_triton, (g, y, index, 4, log), **kw)


# ----------------------------------------------------------------------------- end to end
LENS = (3, 0, 2, 4)  # a zero-length sample
C = 3

PAIR_OPS = {
    # name: (multi_jagged fn, dense fn on one component (j0, j0, C))
    "sum(1)": (lambda x: x.sum(1), lambda t: t.sum(0)),
    "mean(2)": (lambda x: x.mean(2), lambda t: t.mean(1)),
    "amax(2)": (lambda x: x.amax(2), lambda t: t.amax(1)),
    "amin(1)": (lambda x: x.amin(1), lambda t: t.amin(0)),
    "logsumexp(1)": (lambda x: x.logsumexp(1), lambda t: t.logsumexp(0)),
    "softmax(2)": (lambda x: F.softmax(x, dim=2), lambda t: F.softmax(t, dim=1)),
    "log_softmax(1)": (lambda x: F.log_softmax(x, dim=1), lambda t: F.log_softmax(t, dim=0)),
}


def _pair(seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    comps = [((torch.randn(n, n, C, generator=g, dtype=torch.float64) * 2).round() / 2).to(device) for n in LENS]
    leaves = [c.requires_grad_() for c in comps]
    return mj.as_nested_tensor(leaves, ragged_dims=(1, 2)), leaves


def _run(name, forced, device=DEVICE):
    x, leaves = _pair(device=device)
    assert x.shape[1] == x.shape[2]  # (B, j0, j0, C): one nested int
    fn = PAIR_OPS[name][0]
    if forced:
        with kernel_choice.triton_kernels(True):
            out = fn(x)
            outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
            loss = sum((o * torch.arange(o.numel(), device=device).reshape(o.shape).cos()).sum() for o in outs)
            grads = torch.autograd.grad(loss, leaves)
    else:
        out = fn(x)
        outs = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
        loss = sum((o * torch.arange(o.numel(), device=device).reshape(o.shape).cos()).sum() for o in outs)
        grads = torch.autograd.grad(loss, leaves)
    return [o.detach() for o in outs], grads, leaves


@pytest.mark.parametrize("name", list(PAIR_OPS))
def test_pair_ops_with_kernels_match_default_and_per_sample(name, monkeypatch):
    launches = []
    real = kt._launch
    monkeypatch.setattr(kt, "_launch", lambda kernel, *a, **k: (launches.append(kernel), real(kernel, *a, **k)))
    outs, grads, leaves = _run(name, forced=True)
    want = {kt._softmax_kernel, kt._softmax_bwd_kernel} if "softmax" in name else {kt._reduce_kernel}
    assert want <= set(launches), f"expected the kernels {want} to run, got {set(launches)}"
    monkeypatch.setattr(kt, "_launch", real)
    want_outs, want_grads, _ = _run(name, forced=False)
    dense = PAIR_OPS[name][1]
    for i, (o, w, leaf) in enumerate(zip(outs, want_outs, leaves)):
        torch.testing.assert_close(o, w, equal_nan=True, atol=1e-12, rtol=1e-12, msg=f"sample {i}")
        if leaf.shape[0] == 0:  # dense amax/amin raise over an empty dim; the sample is empty here
            assert o.numel() == 0 and o.shape[-1] == C
            continue
        torch.testing.assert_close(o, dense(leaf.detach()), equal_nan=True, atol=1e-12, rtol=1e-12,
                                   msg=f"sample {i} vs dense")
    for i, (g, w, leaf) in enumerate(zip(grads, want_grads, leaves)):
        torch.testing.assert_close(g, w, equal_nan=True, atol=1e-12, rtol=1e-12, msg=f"grad {i}")
        if leaf.shape[0] == 0:
            continue
        c = leaf.detach().requires_grad_()
        o = dense(c)
        (d,) = torch.autograd.grad((o * torch.arange(o.numel()).to(o.device).reshape(o.shape).cos()).sum(), c)
        torch.testing.assert_close(g, d, equal_nan=True, atol=1e-12, rtol=1e-12, msg=f"grad {i} vs dense")


def test_default_path_keeps_the_reference_on_cpu(monkeypatch):
    if CUDA:
        pytest.skip("on CUDA the default path is the kernel")
    monkeypatch.setattr(kt, "_launch", lambda *a, **k: pytest.fail("a kernel ran on the CPU default path"))
    for name in PAIR_OPS:
        _run(name, forced=False)


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_kernels_default_tiles(dtype):
    v, index = _case(3000, (37,), 400, dtype)
    for kind in KINDS:
        got = OPS.segment_reduce_triton(v, index, 400, kind, EMPTY[kind])
        torch.testing.assert_close(got, _ref_reduce(v, index, 400, kind), equal_nan=True, **_tol(dtype))
    for log in (False, True):
        got = OPS.segment_softmax_triton(v, index, 400, log)
        torch.testing.assert_close(got, ref.segment_softmax(v.double(), index, 400, log).to(dtype), **_tol(dtype))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_ops_compile():
    v, index = _case(500, (16,), 40, torch.float32)
    v.requires_grad_()

    def f(x):
        return (OPS.segment_softmax_triton(x, index, 40, False) * 2).sum(0) + \
            OPS.segment_reduce_triton(x, index, 40, "logsumexp", float("-inf")).sum(0)

    got = torch.compile(f, fullgraph=True)(v)
    (gg,) = torch.autograd.grad(got.sum(), v)
    want = f(v)
    (gw,) = torch.autograd.grad(want.sum(), v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gg, gw)
