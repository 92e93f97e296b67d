"""The Triton pair-broadcast and jagged ↔ padded kernels (kernels/pair_triton.py,
kernels/padding_triton.py), their ops (compile/triton_pair.py) and the handlers that use them,
against the pure-torch twins in kernels/reference.py and the per-sample dense reference.

Without CUDA the kernels run in Triton's interpreter on CPU tensors (conftest sets
TRITON_INTERPRET=1 before anything imports them; this module sets it too, for a lone run). The
interpreter is slow: structures are tiny and fixed, chosen so that a zero-length sample, B = 1,
rectangular pairs and several ragged dims all occur.
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
from torch_multijagged.compile import kernel_choice, triton_pair  # noqa: E402
from torch_multijagged.kernels import padding_triton as kd  # noqa: E402
from torch_multijagged.kernels import pair_triton as kp  # noqa: E402
from torch_multijagged.kernels import reference as ref  # noqa: E402

from _reference import R, per_sample_check  # noqa: E402

if not CUDA and type(kp._pair_fwd_kernel).__name__ != "InterpretedFunction":
    pytest.skip("the Triton kernels were imported before TRITON_INTERPRET=1 was set; run this module alone "
                "or set TRITON_INTERPRET=1", allow_module_level=True)

DEVICE = "cuda" if CUDA else "cpu"
OPS = torch.ops.multijagged
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Under the interpreter only schema and autograd registration can be checked: the fake-tensor and
# aot-dispatch checks would run the interpreter on fake tensors (it reads their data).
OPCHECK = {} if CUDA else dict(test_utils=("test_schema", "test_autograd_registration"))


def _tol(dtype):
    return {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-5, rtol=1e-5)}.get(
        dtype, dict(atol=3e-2, rtol=3e-2))


def _offsets(counts):
    counts = torch.as_tensor(counts, dtype=torch.int64)
    return F.pad(counts.cumsum(0), (1, 0))


def _pair_maps(ns, ms):
    """``(li, ri)`` of the rectangular pair ``(B, j_n, j_m)`` built from singles of lengths
    ``ns`` and ``ms``: the row maps ``ops/elementwise/pointwise.py`` gathers with."""
    ns, ms = torch.tensor(ns), torch.tensor(ms)
    sizes = torch.stack([ns, ms], 1)
    off = _offsets(ns * ms)
    t = int((ns * ms).sum())
    li = ref.row_map(off, sizes, t, (0,), _offsets(ns))
    ri = ref.row_map(off, sizes, t, (1,), _offsets(ms))
    return li.to(DEVICE), ri.to(DEVICE)


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


# name: (ns, ms, static)
PAIRS = {
    "rect_zero_len": ([3, 0, 2], [2, 4, 1], (5,)),
    "square_b1": ([4], [4], (3,)),
    "static_mid": ([2, 3], [3, 0], (2, 6)),
    "wide_multi_block": ([3, 2], [5, 1], (130,)),  # several feature blocks, a partial last one
}


# ----------------------------------------------------------------------------- pair_combine
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(PAIRS))
def test_pair_combine_op_matches_reference(name, dtype):
    ns, ms, static = PAIRS[name]
    li, ri = _pair_maps(ns, ms)
    left0, right0 = _rand(sum(ns), *static, dtype=dtype), _rand(sum(ms), *static, dtype=dtype, seed=1)
    for op in kp.OPS:
        left, right = left0.clone().requires_grad_(), right0.clone().requires_grad_()
        rl, rr = left0.clone().requires_grad_(), right0.clone().requires_grad_()
        out = OPS.pair_combine_triton(left, right, li, ri, op)
        want = ref.pair_combine(rl, rr, li, ri, op)
        assert out.dtype == dtype and out.shape == want.shape
        # one rounding from float32 (or float64): bitwise what torch's pointwise op gives, except
        # that Triton's interpreter rounds float32 -> bfloat16 toward zero (one ulp)
        exact = CUDA or dtype != torch.bfloat16
        torch.testing.assert_close(out, want, **(dict(atol=0, rtol=0) if exact else _tol(dtype)), msg=op)
        grad = _rand(*out.shape, dtype=dtype, seed=2)
        got = torch.autograd.grad(out, (left, right), grad)
        exp = torch.autograd.grad(want, (rl, rr), grad)
        for a, b, what in zip(got, exp, ("left", "right")):
            assert a.dtype == dtype
            torch.testing.assert_close(a, b, **_tol(dtype), msg=f"{op} grad {what}")


def test_pair_combine_one_input_needs_grad_and_empty():
    li, ri = _pair_maps([2, 0, 3], [1, 2, 2])
    left, right = _rand(5, 4).requires_grad_(), _rand(5, 4, seed=1)
    out = OPS.pair_combine_triton(left, right, li, ri, "mul")
    (gl,) = torch.autograd.grad(out, [left], torch.ones_like(out))
    torch.testing.assert_close(gl, torch.zeros_like(left).index_add(0, li, right[ri]))
    # no pair rows at all (every sample has a zero extent), and a zero-width static dim
    li0, ri0 = _pair_maps([0, 2], [3, 0])
    assert li0.numel() == 0
    out0 = OPS.pair_combine_triton(left[:2], right[:3], li0, ri0, "add")
    assert out0.shape == (0, 4)
    out1 = OPS.pair_combine_triton(left.detach()[:, :0], right[:, :0], li, ri, "sub")
    assert out1.shape == (li.shape[0], 0)


def test_pair_combine_double_backward_matches_reference():
    li, ri = _pair_maps([3, 0, 2], [2, 3, 2])
    dtype = torch.float64
    for op in kp.OPS:
        ins = [_rand(5, 3, dtype=dtype).requires_grad_(), _rand(7, 3, dtype=dtype, seed=1).requires_grad_()]
        refs = [t.detach().clone().requires_grad_() for t in ins]
        grad = _rand(li.shape[0], 3, dtype=dtype, seed=2).requires_grad_()
        rgrad = grad.detach().clone().requires_grad_()
        g1 = torch.autograd.grad(OPS.pair_combine_triton(*ins, li, ri, op), ins, grad, create_graph=True)
        r1 = torch.autograd.grad(ref.pair_combine(*refs, li, ri, op), refs, rgrad, create_graph=True)
        w = [_rand(5, 3, dtype=dtype, seed=3), _rand(7, 3, dtype=dtype, seed=4)]
        s = (g1[0] * w[0]).sum() + (g1[1] * w[1]).sum()
        rs = (r1[0] * w[0]).sum() + (r1[1] * w[1]).sum()
        wrt, rwrt = [grad] + ins, [rgrad] + refs
        got = torch.autograd.grad(s, wrt, allow_unused=True)
        exp = torch.autograd.grad(rs, rwrt, allow_unused=True)
        for a, b, what in zip(got, exp, ("grad", "left", "right")):
            a = torch.zeros_like(wrt[0 if what == "grad" else 1 + ("left", "right").index(what)]) if a is None else a
            b = torch.zeros_like(a) if b is None else b
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"{op} d/d{what}")


def test_pair_combine_launcher_checks():
    li, ri = _pair_maps([2], [2])
    a = _rand(2, 3)
    with pytest.raises(TypeError, match=r"^pair_combine_triton\(\): expected left and right of one dtype"):
        kp.pair_combine_triton(a, a.double(), li, ri, "add")
    with pytest.raises(ValueError, match=r"^pair_combine_triton\(\): expected op in"):
        kp.pair_combine_triton(a, a, li, ri, "div")
    with pytest.raises(ValueError, match=r"^pair_combine_triton\(\): expected left \(L, \*F\)"):
        kp.pair_combine_triton(a, a[:, :2], li, ri, "add")


# ----------------------------------------------------------------------------- fused LayerNorm
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["rect_zero_len", "square_b1", "static_mid"])
def test_pair_add_layer_norm_op_matches_reference(name, dtype):
    ns, ms, static = PAIRS[name]
    li, ri = _pair_maps(ns, ms)
    c = static[-1]
    leaves = [_rand(sum(ns), *static, dtype=dtype), _rand(sum(ms), *static, dtype=dtype, seed=1),
              _rand(c, dtype=dtype, seed=2), _rand(c, dtype=dtype, seed=3)]
    for affine in (True, False):
        ins = [t.clone().requires_grad_() for t in (leaves if affine else leaves[:2])]
        refs = [t.clone().requires_grad_() for t in (leaves if affine else leaves[:2])]
        w, b = (ins[2], ins[3]) if affine else (None, None)
        rw, rb = (refs[2], refs[3]) if affine else (None, None)
        out, mean, rstd = OPS.pair_add_layer_norm_triton(ins[0], ins[1], li, ri, w, b, 1e-5)
        want = ref.pair_add_layer_norm(refs[0], refs[1], li, ri, rw, rb, 1e-5)
        assert out.dtype == dtype and not mean.requires_grad
        torch.testing.assert_close(out, want, **_tol(dtype))
        grad = _rand(*out.shape, dtype=dtype, seed=4)
        got = torch.autograd.grad(out, ins, grad)
        # the gradients against float64 truth: in half precision the reference's own sums over
        # every row (weight, bias) round further from it than the kernel's float32 accumulation
        r64 = [t.detach().double().requires_grad_() for t in refs]
        truth = ref.pair_add_layer_norm(r64[0], r64[1], li, ri, *(r64[2:] if affine else (None, None)), 1e-5)
        exp = torch.autograd.grad(truth, r64, grad.double())
        for a, e, what in zip(got, exp, ("left", "right", "weight", "bias")):
            assert a.dtype == dtype, what
            torch.testing.assert_close(a, e.to(dtype), **_tol(dtype), msg=f"grad {what} (affine={affine})")


def test_pair_add_layer_norm_double_backward_raises():
    li, ri = _pair_maps([2, 1], [2, 2])
    left = _rand(3, 4).requires_grad_()
    out, _, _ = OPS.pair_add_layer_norm_triton(left, _rand(4, 4, seed=1), li, ri, None, None, 1e-5)
    (g,) = torch.autograd.grad(out.square().sum(), [left], create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward is not supported for layout torch.multi_jagged"):
        torch.autograd.grad(g.sum(), [left])


# ----------------------------------------------------------------------------- jagged <-> padded
def _partition(sizes):
    sizes = torch.tensor(sizes, dtype=torch.int64).reshape(len(sizes), -1)
    off = _offsets(sizes.prod(1))
    return off.to(DEVICE), sizes.to(DEVICE), int(off[-1])


# name: (per-sample extents, extra envelope per ragged dim, static)
PADDED = {
    "seq_zero_len": ([[3], [0], [5]], [0], (2,)),
    "seq_b1_bigger_envelope": ([[4]], [2], (3,)),
    "rect_zero_len": ([[2, 3], [3, 0], [1, 4]], [0, 1], (5,)),
    "cube_static2": ([[2, 1, 3], [1, 2, 2]], [1, 0, 0], (2, 3)),
    "four_dims_no_static": ([[2, 1, 2, 3], [1, 2, 1, 0], [1, 1, 2, 2]], [0, 0, 1, 0], ()),
    "wide_multi_block": ([[3], [1]], [0], (150,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(PADDED))
def test_padded_ops_match_reference(name, dtype):
    sizes, extra, static = PADDED[name]
    off, sz, rows = _partition(sizes)
    maxes = [max(col) + e for col, e in zip(zip(*sizes), extra)]
    values = _rand(rows, *static, dtype=dtype).requires_grad_()
    rvalues = values.detach().clone().requires_grad_()
    # float64 keeps a padding float32 cannot hold
    padding = 0.1 if dtype == torch.float64 else -float("inf")
    out = OPS.to_padded_triton(values, off, sz, maxes, padding)
    want = ref.to_padded_rows(rvalues, off, sz, maxes, padding)
    assert out.shape == (len(sizes), *maxes, *static) and out.dtype == dtype
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    grad = _rand(*out.shape, dtype=dtype, seed=1)
    (g,) = torch.autograd.grad(out, [values], grad)
    (e,) = torch.autograd.grad(want, [rvalues], grad)
    torch.testing.assert_close(g, e, atol=0, rtol=0)
    # the inverse: pad cells are never read (nan there must not leak), gradients zero there
    padded = want.detach().nan_to_num(0.0).clone()
    padded[torch.isinf(want.detach()) | (want.detach() == padding)] = float("nan")
    padded.requires_grad_()
    rpadded = padded.detach().clone().requires_grad_()
    back = OPS.from_padded_triton(padded, off, sz, rows)
    torch.testing.assert_close(back, values.detach(), atol=0, rtol=0)
    gb = _rand(*back.shape, dtype=dtype, seed=2)
    (g,) = torch.autograd.grad(back, [padded], gb)
    (e,) = torch.autograd.grad(ref.from_padded_rows(rpadded, off, sz, rows), [rpadded], gb)
    torch.testing.assert_close(g, e, atol=0, rtol=0)


def test_padded_ops_double_backward_and_opcheck():
    off, sz, rows = _partition([[2, 3], [0, 2], [3, 1]])
    values = _rand(rows, 4, dtype=torch.float64).requires_grad_()
    out = OPS.to_padded_triton(values, off, sz, [3, 3], 0.0)
    cot = _rand(*out.shape, dtype=torch.float64, seed=1).requires_grad_()
    # the backward (from_padded) is differentiable in the cotangent: d/dcot <g, w> = to_padded(w)
    (g,) = torch.autograd.grad(out, [values], cot, create_graph=True)
    w = _rand(*g.shape, dtype=torch.float64, seed=2)
    (gg,) = torch.autograd.grad((g * w).sum(), [cot])
    torch.testing.assert_close(gg, ref.to_padded_rows(w, off, sz, [3, 3], 0.0), atol=0, rtol=0)
    torch.library.opcheck(OPS.to_padded_triton, (values, off, sz, [3, 4], -1.0), **OPCHECK)
    padded = _rand(3, 3, 3, 4, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(OPS.from_padded_triton, (padded, off, sz, rows), **OPCHECK)


def test_padded_launcher_checks():
    off, sz, rows = _partition([[2, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"^to_padded_triton\(\): expected at most 4 ragged dims, got 5"):
        kd.to_padded_triton(_rand(rows, 2), off, sz, [2, 1, 1, 1, 1], 0.0)
    with pytest.raises(TypeError, match=r"^to_padded_triton\(\): expected values of a dtype"):
        kd.to_padded_triton(torch.zeros(2, dtype=torch.int64, device=DEVICE), *_partition([[2]])[:2], [2], 0.0)


def test_pair_ops_opcheck():
    li, ri = _pair_maps([2, 0, 3], [1, 2, 2])
    left, right = _rand(5, 4).requires_grad_(), _rand(5, 4, seed=1).requires_grad_()
    torch.library.opcheck(OPS.pair_combine_triton, (left, right, li, ri, "mul"), **OPCHECK)
    grad = _rand(li.shape[0], 4, seed=2)
    torch.library.opcheck(OPS.pair_combine_triton_backward, (grad, left, right, li, ri, "mul", True, True),
                          **OPCHECK)
    w, b = _rand(4, seed=3).requires_grad_(), _rand(4, seed=4).requires_grad_()
    torch.library.opcheck(OPS.pair_add_layer_norm_triton, (left, right, li, ri, w, b, 1e-5), **OPCHECK)
    out, mean, rstd = OPS.pair_add_layer_norm_triton(left, right, li, ri, w, b, 1e-5)
    torch.library.opcheck(OPS.pair_add_layer_norm_triton_backward,
                          (grad, left, right, li, ri, w, b, mean, rstd, True, True, True, True), **OPCHECK)


# ----------------------------------------------------------------------------- dispatch functions
def test_dispatch_functions_pick_kernel_or_reference(monkeypatch):
    calls = []
    for mod, name in ((kp, "pair_combine_triton"), (kp, "pair_add_layer_norm_triton"), (kd, "to_padded_triton"),
                      (kd, "from_padded_triton")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n), _r(*a, **k))[1])
    li, ri = _pair_maps([2, 3], [1, 2])
    left, right = _rand(5, 4), _rand(3, 4, seed=1)
    off, sz, rows = _partition([[2, 3], [0, 2]])
    vals = _rand(rows, 2)
    runs = {}
    for forced in (False, True):
        with kernel_choice.triton_kernels(forced):
            runs[forced] = (
                triton_pair.pair_combine(left, right, li, ri, "sub"),
                triton_pair.pair_add_layer_norm(left, right, li, ri, None, None, 1e-5),
                triton_pair.to_padded_rows(vals, off, sz, [2, 3], 7.0),
                triton_pair.from_padded_rows(triton_pair.to_padded_rows(vals, off, sz, [2, 3], 7.0), off, sz, rows),
                # not covered (an integer dtype): the reference, forced or not
                triton_pair.pair_combine(left.long(), right.long(), li, ri, "add"),
            )
        assert len(calls) == (5 if forced else 0), calls
    for a, b in zip(runs[False], runs[True]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- through the handlers
def _spy(monkeypatch, mod, name):
    calls = []
    real = getattr(mod, name)
    monkeypatch.setattr(mod, name, lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def _comps(shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]


PAIR_FNS = {  # name: (fn, static dims of the singles (B, j, *static))
    "add": (lambda x, y: x.unsqueeze(-2) + y.unsqueeze(-3), (4,)),
    "sub": (lambda x, y: x.unsqueeze(-2) - y.unsqueeze(-3), (4,)),
    "mul": (lambda x, y: x.unsqueeze(-2) * y.unsqueeze(-3), (4,)),
    # (B, j0, 1, S, C) · (B, 1, j1, S, C): a static dim between the pair dims and C
    "mul_static": (lambda x, y: x.unsqueeze(-3) * y.unsqueeze(-4), (2, 3)),
}


@pytest.mark.parametrize("name", list(PAIR_FNS))
def test_pair_broadcast_uses_kernel_and_matches_dense(name, monkeypatch):
    fn, static = PAIR_FNS[name]
    calls = _spy(monkeypatch, kp, "pair_combine_triton")
    ns, ms = [3, 0, 2], [2, 3, 1]
    xs, ys = _comps([(n, *static) for n in ns]), _comps([(m, *static) for m in ms], seed=1)
    with kernel_choice.triton_kernels(True):
        per_sample_check(fn, R(xs, (1,)), R(ys, (1,)), atol=1e-10, rtol=1e-10)
    assert calls, "the pair kernel did not run"
    # the forced result equals the default (unforced) path's
    n0 = len(calls)
    x, y = mj.nested_tensor(xs, ragged_dims=(1,)), mj.nested_tensor(ys, ragged_dims=(1,))
    default = fn(x, y)
    assert len(calls) == n0, "the default CPU path must not run the kernel"
    with kernel_choice.triton_kernels(True):
        forced = fn(x, y)
    assert len(calls) == n0 + 1
    torch.testing.assert_close(forced.values(), default.values(), atol=0, rtol=0)


def test_pair_broadcast_square_b1_float32(monkeypatch):
    calls = _spy(monkeypatch, kp, "pair_combine_triton")
    xs = _comps([(5, 3)], dtype=torch.float32)
    with kernel_choice.triton_kernels(True):
        # one tensor on both sides: the square pair (B, j0, j0, C), one nested int
        per_sample_check(lambda x: x.unsqueeze(-2) * x.unsqueeze(-3), R(xs, (1,)), atol=1e-5, rtol=1e-5)
    assert calls


def test_pair_broadcast_not_covered_falls_back(monkeypatch):
    calls = _spy(monkeypatch, kp, "pair_combine_triton")
    xs, ys = _comps([(2, 3), (1, 3)]), _comps([(3, 1), (2, 1)], seed=1)
    with kernel_choice.triton_kernels(True):
        # static sizes differ (3 vs 1: broadcast over C), and add with alpha: the usual path
        per_sample_check(lambda x, y: x.unsqueeze(-2) + y.unsqueeze(-3), R(xs, (1,)), R(ys, (1,)))
        per_sample_check(lambda x, y: torch.add(x.unsqueeze(-2), y.unsqueeze(-3), alpha=2), R(xs, (1,)),
                         R(_comps([(3, 3), (2, 3)], seed=2), (1,)))
    assert not calls


def _pad_ref(maxes, padding):
    def ref_fn(c):
        pads = []
        for d in reversed(range(c.dim())):
            pads += [0, maxes[d] - c.shape[d]]
        return F.pad(c, pads, value=padding)
    return ref_fn


@pytest.mark.parametrize("layout", ["seq", "rect", "static_lead"])
def test_to_padded_tensor_uses_kernel_and_matches_dense(layout, monkeypatch):
    calls = _spy(monkeypatch, kd, "to_padded_triton")
    back_calls = _spy(monkeypatch, kd, "from_padded_triton")
    shapes, rd = {
        "seq": ([(3, 2), (0, 2), (4, 2)], (1,)),
        "rect": ([(2, 3, 2), (3, 0, 2), (1, 1, 2)], (1, 2)),
        "static_lead": ([(2, 3, 4), (2, 0, 4)], (2,)),  # (B, S, j0, C): a static dim before the ragged one
    }[layout]
    maxes = [max(s[d] for s in shapes) for d in range(len(shapes[0]))]
    comps = _comps(shapes)
    with kernel_choice.triton_kernels(True):
        per_sample_check(lambda x: torch.nested.to_padded_tensor(x, -2.5), R(comps, rd), ref=_pad_ref(maxes, -2.5),
                         dense_out=True)
    assert calls and back_calls, "to_padded and its backward (from_padded) must run the kernels"
    x = mj.nested_tensor(comps, ragged_dims=rd)
    out_size = [len(shapes)] + [m + 1 for m in maxes]
    default = torch.nested.to_padded_tensor(x, 1.5, out_size)
    with kernel_choice.triton_kernels(True):
        forced = torch.nested.to_padded_tensor(x, 1.5, out_size)
    torch.testing.assert_close(forced, default, atol=0, rtol=0)


@pytest.mark.parametrize("rd", [(1,), (1, 2)], ids=str)
def test_from_padded_uses_kernel_and_matches_dense(rd, monkeypatch):
    calls = _spy(monkeypatch, kd, "from_padded_triton")
    back_calls = _spy(monkeypatch, kd, "to_padded_triton")
    lengths = torch.tensor([[3, 1], [0, 2], [2, 3]])[:, :len(rd)]
    padded = _comps([(3, 3, 3, 2)])[0] if len(rd) == 2 else _comps([(3, 4, 2)])[0]
    leaf = padded.clone().requires_grad_()
    rleaf = padded.clone().requires_grad_()
    with kernel_choice.triton_kernels(True):
        x = mj.from_padded(leaf, lengths, ragged_dims=rd)
        comps = x.unbind()
    default = mj.from_padded(rleaf, lengths, ragged_dims=rd)
    assert calls
    for i, (c, d) in enumerate(zip(comps, default.unbind())):
        want = padded[i][tuple(slice(0, int(n)) for n in lengths[i])]  # the per-sample dense slice
        torch.testing.assert_close(c, want, atol=0, rtol=0)
        torch.testing.assert_close(c, d, atol=0, rtol=0)
    # gradients: the valid region gets the cotangent, padding gets zero
    cot = [torch.randn_like(c) for c in comps]
    with kernel_choice.triton_kernels(True):
        loss = sum((c * w).sum() for c, w in zip(x.unbind(), cot))
        (g,) = torch.autograd.grad(loss, [leaf])
    (e,) = torch.autograd.grad(sum((c * w).sum() for c, w in zip(default.unbind(), cot)), [rleaf])
    torch.testing.assert_close(g, e, atol=0, rtol=0)
    assert back_calls, "from_padded's backward (to_padded) must run the kernel"


# ----------------------------------------------------------------------------- CUDA only
@pytest.mark.skipif(not CUDA, reason="torch.compile of a triton_op needs CUDA (the interpreter cannot trace)")
def test_ops_compile_cuda():
    li, ri = _pair_maps([30, 0, 17], [9, 12, 40])
    left, right = _rand(47, 64).requires_grad_(), _rand(61, 64, seed=1).requires_grad_()
    w, b = _rand(64, seed=2).requires_grad_(), _rand(64, seed=3).requires_grad_()

    def f(left, right, w, b):
        p = OPS.pair_combine_triton(left, right, li, ri, "mul")
        return p + OPS.pair_add_layer_norm_triton(left, right, li, ri, w, b, 1e-5)[0]

    out = torch.compile(f, fullgraph=True)(left, right, w, b)
    rl, rr, rw, rb = (t.detach().clone().requires_grad_() for t in (left, right, w, b))
    want = ref.pair_combine(rl, rr, li, ri, "mul") + ref.pair_add_layer_norm(rl, rr, li, ri, rw, rb, 1e-5)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    got = torch.autograd.grad(out.sum(), (left, right, w, b))
    exp = torch.autograd.grad(want.sum(), (rl, rr, rw, rb))
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, atol=1e-3, rtol=1e-4)
    off, sz, rows = _partition([[30, 2], [0, 5], [7, 7]])
    vals = _rand(rows, 16).requires_grad_()
    pad = torch.compile(lambda v: OPS.to_padded_triton(v, off, sz, [30, 7], -1.0), fullgraph=True)(vals)
    torch.testing.assert_close(pad, ref.to_padded_rows(vals.detach(), off, sz, [30, 7], -1.0))


@pytest.mark.skipif(not CUDA, reason="production-size launches compile for the GPU only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_pair_kernels_production_sizes_cuda(dtype):
    ns = torch.randint(0, 96, (16,)).tolist()
    li, ri = _pair_maps(ns, ns)
    left, right = _rand(sum(ns), 128, dtype=dtype), _rand(sum(ns), 128, dtype=dtype, seed=1)
    torch.testing.assert_close(OPS.pair_combine_triton(left, right, li, ri, "add"),
                               ref.pair_combine(left, right, li, ri, "add"), atol=0, rtol=0)
    w, b = _rand(128, dtype=dtype, seed=2), _rand(128, dtype=dtype, seed=3)
    out = OPS.pair_add_layer_norm_triton(left, right, li, ri, w, b, 1e-5)[0]
    torch.testing.assert_close(out, ref.pair_add_layer_norm(left, right, li, ri, w, b, 1e-5), **_tol(dtype))
