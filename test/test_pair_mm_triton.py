"""The Triton pair matmul kernel (kernels/pair_mm_triton.py, NOTE [ Pair matmul kernel ]) and its
op ``multijagged::pair_matmul_triton`` (compile/triton_pair_mm.py) against the oracle
``pair_matmul_naive`` (NOTE [ Pair matmul contract ]); the triangle multiplicative update
(``einsum`` over a ragged dim of multi_jagged pairs) with the kernels forced on against the
default path and the per-sample dense einsum, gradients included; and triangle attention
(q/k/v ``(B, j0, H, j0, d)`` with a pair bias ``(B, 1, H, j0, j0)``) on the Triton attention
kernel against the reference path and dense SDPA per sample, ``d(bias)`` included.

Without CUDA the kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET is set
before the kernels are imported, as in test_attention_triton.py). The interpreter is slow, so the
cases are few and small; 16-wide tiles make a sample of 40 span three tiles along i, j and k, and
20 channels two channel blocks.
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

import torch_multijagged as mj  # noqa: E402
from torch_multijagged.compile import attention as cattn  # noqa: E402
from torch_multijagged.compile import kernel_choice  # noqa: E402
from torch_multijagged.compile import pair_mm as cpm  # noqa: E402
from torch_multijagged.kernels import attention_triton as kat  # noqa: E402
from torch_multijagged.kernels import pair_mm as kpm  # noqa: E402
from torch_multijagged.kernels import pair_mm_triton as kt  # noqa: E402

if not CUDA and type(kt._pair_mm_kernel).__name__ != "InterpretedFunction":
    pytest.skip("the Triton kernels were imported before TRITON_INTERPRET=1 was set; run this module alone "
                "or set TRITON_INTERPRET=1", allow_module_level=True)

from torch_multijagged.compile import triton_pair_mm  # noqa: E402,F401  (registers the op)

DEVICE = "cuda" if CUDA else "cpu"
OPS = torch.ops.multijagged
SMALL = (16, 16, 16, 16, 4)  # (BLOCK_I, BLOCK_J, BLOCK_K, BLOCK_C, num_warps)
FLAGS = [(False, False), (False, True), (True, False), (True, True)]


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


def _case(ns, c, dtype=torch.float32, seed=0, device=DEVICE):
    """Packed x, y ``(Σ n², c)``, offsets, lengths, max_n for samples of sizes ``ns``."""
    g = torch.Generator().manual_seed(seed)
    n = torch.tensor(ns, dtype=torch.int64)
    off = torch.zeros(len(ns) + 1, dtype=torch.int64)
    off[1:] = (n * n).cumsum(0)
    t = int(off[-1])
    x = torch.randn(t, c, generator=g).to(device, dtype)
    y = torch.randn(t, c, generator=g).to(device, dtype)
    return x, y, off.to(device), n.to(device), max(ns, default=0)


def _oracle(x, y, off, n, tx, ty):
    """The per-sample loop in float64, rounded once to x's dtype."""
    return kpm.pair_matmul_naive(x.double(), y.double(), off, n, tx, ty).to(x.dtype)


# ----------------------------------------------------------------------------- kernel vs oracle
@pytest.mark.parametrize("tx, ty", FLAGS, ids=lambda f: str(int(f)))
def test_kernel_matches_naive(tx, ty):
    # lengths 0 and 1, one spanning three 16-tiles (40), one ending mid-tile (17)
    x, y, off, n, m = _case((3, 0, 1, 40, 17), 3)
    got = kt.pair_matmul_triton(x, y, off, n, m, tx, ty, tiles=SMALL)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, _oracle(x, y, off, n, tx, ty), **_tol(torch.float32))


@pytest.mark.parametrize("tx, ty", [(False, True), (True, False)], ids=("outgoing", "incoming"))
def test_kernel_channel_blocks_and_default_tiles(tx, ty):
    # 20 channels: two channel blocks, the second masked; the launcher's own tiles
    x, y, off, n, m = _case((5, 0, 18), 20, seed=1)
    torch.testing.assert_close(kt.pair_matmul_triton(x, y, off, n, m, tx, ty), _oracle(x, y, off, n, tx, ty),
                               **_tol(torch.float32))


@pytest.mark.parametrize("tx, ty", [(False, True), (True, False)], ids=("outgoing", "incoming"))
def test_kernel_float16(tx, ty):
    x, y, off, n, m = _case((6, 0, 1, 20), 3, torch.float16, seed=2)
    got = kt.pair_matmul_triton(x, y, off, n, m, tx, ty, tiles=SMALL)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), _oracle(x, y, off, n, tx, ty).float(), **_tol(torch.float16))


@pytest.mark.skipif(not CUDA, reason="Triton's interpreter multiplies the raw bits of bfloat16 tl.dot operands "
                    "(triton-lang/triton#11584: not supported yet)")
def test_kernel_bfloat16():
    x, y, off, n, m = _case((6, 0, 1, 20), 3, torch.bfloat16, seed=2)
    got = kt.pair_matmul_triton(x, y, off, n, m, False, True)
    torch.testing.assert_close(got.float(), _oracle(x, y, off, n, False, True).float(), atol=6e-2, rtol=6e-2)


def test_kernel_non_contiguous_inputs():
    x, y, off, n, m = _case((4, 0, 7), 3, seed=3)
    xs = x.t().contiguous().t()  # channel-major storage
    ys = torch.stack([y, y], -1)[..., 0]  # channel stride 2
    assert not xs.is_contiguous() and not ys.is_contiguous()
    got = kt.pair_matmul_triton(xs, ys, off, n, m, False, True, tiles=SMALL)
    torch.testing.assert_close(got, _oracle(x, y, off, n, False, True), **_tol(torch.float32))


def test_kernel_empty_batches():
    for ns in ((), (0, 0), (0, 1)):
        x, y, off, n, m = _case(ns, 4)
        got = kt.pair_matmul_triton(x, y, off, n, m, False, True)
        assert got.shape == x.shape
        torch.testing.assert_close(got, _oracle(x, y, off, n, False, True))


def test_kernel_no_cross_sample_leakage():
    x, y, off, n, m = _case((4, 6, 3), 2, seed=4)
    got = kt.pair_matmul_triton(x, y, off, n, m, False, True, tiles=SMALL)
    x2, y2 = x.clone(), y.clone()
    x2[16:52] += 3.0  # sample 1's rows
    y2[16:52] -= 1.0
    got2 = kt.pair_matmul_triton(x2, y2, off, n, m, False, True, tiles=SMALL)
    assert torch.equal(got[:16], got2[:16]) and torch.equal(got[52:], got2[52:])
    assert not torch.equal(got[16:52], got2[16:52])


def test_kernel_rejects_bad_arguments():
    x, y, off, n, m = _case((2, 3), 2)
    with pytest.raises(TypeError, match=r"pair_matmul_triton\(\): expected x and y of one dtype"):
        kt.pair_matmul_triton(x.double(), y.double(), off, n, m)
    with pytest.raises(ValueError, match=r"expected x and y of one shape \(T, C\)"):
        kt.pair_matmul_triton(x, y[:, :1], off, n, m)
    with pytest.raises(ValueError, match=r"expected lengths \(B,\) and offsets \(B \+ 1,\)"):
        kt.pair_matmul_triton(x, y, off[:-1], n, m)
    with pytest.raises(ValueError, match=r"n² · C < 2\*\*31"):
        kt.pair_matmul_triton(x, y, off, n, 2**15 + 1)


# ----------------------------------------------------------------------------- the op and its dispatch
def test_op_matches_naive_and_opcheck():
    x, y, off, n, m = _case((3, 0, 5), 3, seed=5)
    for tx, ty in FLAGS:
        torch.testing.assert_close(OPS.pair_matmul_triton(x, y, off, n, m, tx, ty), _oracle(x, y, off, n, tx, ty),
                                   **_tol(torch.float32))
    # Under the interpreter the op cannot run on fake tensors (the interpreter reads their data),
    # so the fake-tensor and aot-dispatch checks need CUDA.
    kw = {} if CUDA else dict(test_utils=("test_schema",))
    torch.library.opcheck(OPS.pair_matmul_triton, (x, y, off, n, m, False, True), **kw)


@pytest.mark.parametrize("tx, ty", FLAGS, ids=lambda f: str(int(f)))
def test_op_gradients_to_second_order_match_the_packed_reference(tx, ty):
    """A direct call differentiates: first and second order equal ``pair_matmul_packed``'s."""
    x, y, off, n, m = _case((3, 0, 5), 3, seed=7)
    grads = []
    for fn in (lambda a, b: OPS.pair_matmul_triton(a, b, off, n, m, tx, ty),
               lambda a, b: OPS.pair_matmul_packed(a, b, off, n, tx, ty)):
        a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
        out = fn(a, b)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        ga, gb = torch.autograd.grad(out, (a, b), g, create_graph=True)
        w = torch.randn(ga.shape, generator=torch.Generator().manual_seed(2)).to(ga)
        grads.append((ga, gb, *torch.autograd.grad((ga * w).sum() + (gb * w).sum(), (a, b))))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **_tol(torch.float32))


def test_dispatch_picks_the_kernel_only_where_it_applies(monkeypatch):
    launches = []
    real = kt._launch
    monkeypatch.setattr(kt, "_launch", lambda kernel, *a, **k: (launches.append(kernel), real(kernel, *a, **k)))
    x, y, off, n, m = _case((3, 0, 2), 2, seed=6)
    want = _oracle(x, y, off, n, True, False)
    with kernel_choice.triton_kernels(True):
        torch.testing.assert_close(cpm.pair_matmul_values(x, y, off, n, m, True, False), want)
        assert launches == [kt._pair_mm_kernel]
        # float64: no Triton kernel, the bucketed reference
        got = cpm.pair_matmul_values(x.double(), y.double(), off, n, m, True, False)
        torch.testing.assert_close(got, want.double())
        assert len(launches) == 1
    with kernel_choice.triton_kernels(False):
        torch.testing.assert_close(cpm.pair_matmul_values(x, y, off, n, m, True, False), want)
    assert len(launches) == 1
    if not CUDA:  # the CPU default path is the bucketed reference
        cpm.pair_matmul_values(x, y, off, n, m, True, False)
        assert len(launches) == 1


# ----------------------------------------------------------------------------- triangle multiplication
LENS = (3, 0, 1, 17)  # zero-length and one-cell samples; 17 spans two tiles of 16
EINSUMS = {"outgoing": ("...ikc,...jkc->...ijc", "ikc,jkc->ijc"), "incoming": ("...kic,...kjc->...ijc",
                                                                                 "kic,kjc->ijc")}


def _pairs(ns, c, seed, device=DEVICE, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ca = [torch.randn(k, k, c, generator=g).to(device, dtype).requires_grad_() for k in ns]
    cb = [torch.randn(k, k, c, generator=g).to(device, dtype).requires_grad_() for k in ns]
    return mj.as_nested_tensor(ca, ragged_dims=(1, 2)), mj.as_nested_tensor(cb, ragged_dims=(1, 2)), ca + cb


def _cot(outs, seed):
    g = torch.Generator().manual_seed(seed + 99)
    return [torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in outs]


def _einsum_run(eq, ns, c, forced, seed=0, device=DEVICE, fn=None):
    """(per-sample outputs, grads of every component) of ``eq`` on multi_jagged pairs."""
    a, b, leaves = _pairs(ns, c, seed, device)
    with kernel_choice.triton_kernels(forced):
        out = torch.einsum(eq, a, b) if fn is None else fn(a, b)
        assert isinstance(out, mj.MultiJaggedTensor)
        if fn is None:  # eager: the output keeps the pair's nested int
            assert out.shape[1] is a.shape[1]
        outs = out.unbind()
        loss = sum((o * w).sum() for o, w in zip(outs, _cot(outs, seed)))
        grads = torch.autograd.grad(loss, leaves)
    return [o.detach() for o in outs], grads, leaves


@pytest.mark.parametrize("name", list(EINSUMS))
def test_triangle_einsum_with_kernel_matches_reference_path(name, monkeypatch):
    launches = []
    real = kt._launch
    monkeypatch.setattr(kt, "_launch", lambda kernel, *a, **k: (launches.append(kernel), real(kernel, *a, **k)))
    eq, dense_eq = EINSUMS[name]
    outs, grads, leaves = _einsum_run(eq, LENS, 3, forced=True)
    assert launches == [kt._pair_mm_kernel] * 3, "expected the kernel in forward and for both gradients"
    monkeypatch.setattr(kt, "_launch", lambda *a, **k: pytest.fail("the kernel ran with triton_kernels(False)"))
    want_outs, want_grads, _ = _einsum_run(eq, LENS, 3, forced=False)
    for i, (o, w) in enumerate(zip(outs, want_outs)):
        torch.testing.assert_close(o, w, **_tol(torch.float32), msg=f"sample {i}")
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        torch.testing.assert_close(g, w, **_tol(torch.float32), msg=f"grad {i}")
    # the per-sample dense einsum (float64), forward and gradients
    half = len(LENS)
    for i in range(half):
        a = leaves[i].detach().double().requires_grad_()
        b = leaves[half + i].detach().double().requires_grad_()
        o = torch.einsum(dense_eq, a, b)
        torch.testing.assert_close(outs[i].double(), o, **_tol(torch.float32), msg=f"sample {i} vs dense")
        ga, gb = torch.autograd.grad((o * _cot(outs, 0)[i].double()).sum(), (a, b))
        torch.testing.assert_close(grads[i].double(), ga, **_tol(torch.float32))
        torch.testing.assert_close(grads[half + i].double(), gb, **_tol(torch.float32))


def test_triangle_einsum_with_kernel_no_grad_and_second_order():
    a, b, leaves = _pairs((4, 0, 2), 2, seed=7)
    with kernel_choice.triton_kernels(True):
        want = [o.detach() for o in torch.einsum("...ikc,...jkc->...ijc", a, b).unbind()]
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                got = torch.einsum("...ikc,...jkc->...ijc", a, b).unbind()
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
        # second order: the backward is pair_matmul again, so the kernel runs at every order
        out = torch.einsum("...kic,...kjc->...ijc", a, b)
        gs = torch.autograd.grad(sum((o * o).sum() for o in out.unbind()), leaves, create_graph=True)
        g2 = torch.autograd.grad(sum(g.square().sum() for g in gs), leaves)
    with kernel_choice.triton_kernels(False):
        out = torch.einsum("...kic,...kjc->...ijc", a, b)
        gs = torch.autograd.grad(sum((o * o).sum() for o in out.unbind()), leaves, create_graph=True)
        w2 = torch.autograd.grad(sum(g.square().sum() for g in gs), leaves)
    for g, w in zip(g2, w2):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-5)


# ----------------------------------------------------------------------------- triangle attention
H, D = 2, 4
ATT_LENS = (5, 0, 1, 9)


def _attention_path():
    """The Triton attention kernel: on CUDA the default dispatch picks it for a biased call (NOTE
    [ Attention backends ]); on the CPU the attention dispatcher does not read
    ``triton_kernels``, so the backend is forced."""
    import contextlib

    return contextlib.nullcontext() if CUDA else cattn.backend("triton")


def _triangle_attention(p):
    """Starting-node triangle attention on a pair ``p (B, j0, j0, 3·H·D + H)``: q/k/v
    ``(B, j0, H, j0, D)`` (rows batch, columns attend), bias ``(B, 1, H, j0, j0)``."""
    q, k, v = (t.unflatten(-1, (H, D)).transpose(-2, -3) for t in p[..., : 3 * H * D].chunk(3, -1))
    bias = p[..., 3 * H * D:].permute(0, 3, 1, 2).unsqueeze(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(-2, -3).flatten(-2)


def _attention_run(forced, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    comps = [torch.randn(n, n, 3 * H * D + H, generator=g).to(device).requires_grad_() for n in ATT_LENS]
    p = mj.as_nested_tensor(comps, ragged_dims=(1, 2))
    if forced:
        with kernel_choice.triton_kernels(True), _attention_path():
            out = _triangle_attention(p)
    else:
        with kernel_choice.triton_kernels(False), cattn.backend("bucketed"):
            out = _triangle_attention(p)
    outs = out.unbind()
    loss = sum((o * w).sum() for o, w in zip(outs, _cot(outs, seed)))
    with kernel_choice.triton_kernels(forced), (_attention_path() if forced else cattn.backend("bucketed")):
        grads = torch.autograd.grad(loss, comps)
    return [o.detach() for o in outs], grads, comps


def test_triangle_attention_with_triton_kernel_matches_reference(monkeypatch):
    launches = []
    real = kat._launch
    monkeypatch.setattr(kat, "_launch", lambda kernel, *a, **k: (launches.append(kernel), real(kernel, *a, **k)))
    outs, grads, comps = _attention_run(True)
    assert kat._fwd_kernel in launches and kat._bwd_kernel in launches, launches
    launches.clear()
    want_outs, want_grads, _ = _attention_run(False)
    assert not launches
    tol = dict(atol=2e-5, rtol=2e-5)
    for i, (o, w) in enumerate(zip(outs, want_outs)):
        torch.testing.assert_close(o, w, **tol, msg=f"sample {i}")
    for i, (gr, w) in enumerate(zip(grads, want_grads)):
        # the last H channels are the bias: d(bias) summed over the rows it is broadcast to
        torch.testing.assert_close(gr[..., 3 * H * D:], w[..., 3 * H * D:], **tol, msg=f"d(bias) {i}")
        torch.testing.assert_close(gr, w, **tol, msg=f"grad {i}")
    # the per-sample dense SDPA (float64) on each sample as a batch of one
    for i, c in enumerate(comps):
        d = c.detach().double().unsqueeze(0).requires_grad_()
        o = _triangle_attention(d)[0]
        torch.testing.assert_close(outs[i].double(), o, **tol, msg=f"sample {i} vs dense")
        (gd,) = torch.autograd.grad((o * _cot(outs, 0)[i].double()).sum(), d)
        torch.testing.assert_close(grads[i].double(), gd[0], **tol, msg=f"grad {i} vs dense")


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tx, ty", FLAGS, ids=lambda f: str(int(f)))
def test_cuda_kernel_default_tiles(dtype, tx, ty):
    g = torch.Generator().manual_seed(0)
    ns = [0, 1] + torch.randint(2, 100, (30,), generator=g).tolist() + [257]
    x, y, off, n, m = _case(ns, 37, dtype)
    got = OPS.pair_matmul_triton(x, y, off, n, m, tx, ty)
    want = _oracle(x, y, off, n, tx, ty)
    # half: operands rounded, sums of up to 257 products accumulated in float32
    tol = _tol(dtype) if dtype == torch.float32 else dict(atol=0.25, rtol=2e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", list(EINSUMS))
def test_cuda_triangle_einsum_compiled(name):
    eq = EINSUMS[name][0]
    ns = (33, 0, 1, 70, 12)
    compiled = torch.compile(lambda a, b: torch.einsum(eq, a, b), fullgraph=True)
    outs, grads, _ = _einsum_run(eq, ns, 24, forced=True, fn=compiled)
    want_outs, want_grads, _ = _einsum_run(eq, ns, 24, forced=False)  # on CUDA: still the Triton op
    ref_outs, ref_grads, _ = _einsum_run(eq, ns, 24, forced=False, device="cpu")  # the bucketed reference
    for o, w, r in zip(outs, want_outs, ref_outs):
        torch.testing.assert_close(o, w, **_tol(torch.float32))
        torch.testing.assert_close(o.cpu(), r, atol=1e-4, rtol=1e-5)
    for gr, w, r in zip(grads, want_grads, ref_grads):
        torch.testing.assert_close(gr, w, **_tol(torch.float32))
        torch.testing.assert_close(gr.cpu(), r, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_triangle_attention_matches_cpu_reference():
    outs, grads, _ = _attention_run(True)
    ref_outs, ref_grads, _ = _attention_run(False, device="cpu")
    for o, r in zip(outs, ref_outs):
        torch.testing.assert_close(o.cpu(), r, atol=2e-5, rtol=2e-5)
    for gr, r in zip(grads, ref_grads):
        torch.testing.assert_close(gr.cpu(), r, atol=2e-5, rtol=2e-5)
