"""``F.scaled_dot_product_attention`` on multi_jagged tensors.

The oracle is the per-sample reference: unbind, run dense ``F.scaled_dot_product_attention`` on
each sample in float64, compare outputs and the gradients of every leaf (q, k, v, a float mask,
the weights of a projection). Every case runs under each CPU backend forced with
``backend(name)`` as well as under the dispatcher's own choice. Documented semantics that the
reference checks along the way: a sample with no keys (cross attention) or a fully masked row
gives zero output rows, as dense SDPA; ``is_causal`` is top-left aligned.

The ``triton`` backend is tested where it can run: on CUDA, or on CPU with ``TRITON_INTERPRET=1``
set in the environment (``TRITON_INTERPRET=1 pytest test/test_attention.py -k triton``); ``flash``
and ``flash_attn`` only on CUDA. Plain-tensor kernel tests (``attention_bucketed`` & co.,
``bucket_plan``, opcheck of the ops) are in test_attention_kernels.py.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given, strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj
from _reference import PS, R, components, few, per_sample_check, seeds
from _structures import bit_equal, length_pairs, length_triples, lengths
from torch_multijagged.errors import StructureError
from torch_multijagged.ops.attention import backend

sdpa = F.scaled_dot_product_attention
H, D = 2, 3
#: None is the dispatcher's own choice; the others are forced (NOTE [ Attention backends ])
CPU_BACKENDS = (None, "reference", "loop", "bucketed", "blocks")
_TRITON_MODULE = Path(__file__).parent.parent / "torch_multijagged" / "compile" / "triton_attention.py"


def _using(name):
    return nullcontext() if name is None else backend(name)


def _t(x):
    """``(…, j, H, D)`` → ``(…, H, j, D)``: the torch.jagged convention (dense or multi_jagged
    alike; for a component the leading B is absent, so this is the same call)."""
    return x.transpose(-3, -2)


def _comps(shapes, seed, dtype=torch.float64):
    return components(shapes, seed, dtype=dtype)


def _check(fn, ref, *args, bk=None, **kw):
    """``per_sample_check`` with the forward and the backward under backend ``bk``."""
    with _using(bk):
        return per_sample_check(fn, *args, ref=ref, **kw)


# ----------------------------------------------------------------------------- self attention
@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@few(6)
@given(ns=lengths(max_len=5), seed=seeds, scale=st.sampled_from([None, 0.3]))
@example(ns=(4,), seed=0, scale=None)  # B = 1
@example(ns=(0,), seed=0, scale=None)  # B = 1 with no tokens at all
def test_self_attention_bhjd(bk, causal, ns, seed, scale):
    """q, k, v ``(B, H, j, D)`` from ``(B, j, H, D).transpose(1, 2)``; is_causal, scale."""
    q, k, v = (R(_comps([(n, H, D) for n in ns], seed + i), (1,)) for i in range(3))

    def fn(q, k, v):
        out = sdpa(_t(q), _t(k), _t(v), is_causal=causal, scale=scale)
        assert out.shape[2] == q.shape[1], "the output keeps q's nested int"
        return out

    _check(fn, lambda q, k, v: sdpa(_t(q), _t(k), _t(v), is_causal=causal, scale=scale), q, k, v, bk=bk)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@few(6)
@given(ns=lengths(max_len=5), seed=seeds)
def test_fused_qkv_linear_then_linear_layer_norm_residual_mean(bk, ns, seed):
    """A fused qkv ``Linear`` + ``chunk`` + ``unflatten`` + ``transpose`` (non-contiguous q/k/v,
    which torch.jagged refuses), the output back to ``(B, j, H·D)`` with ``.transpose(1, 2)
    .flatten(-2)``, then an output ``Linear``, ``layer_norm``, a residual add and a mean over the
    ragged dim (the result composes with ops that already work)."""
    e = H * D
    g = torch.Generator().manual_seed(seed)
    w_qkv, b_qkv = torch.randn(3 * e, e, generator=g, dtype=torch.float64), torch.randn(3 * e, generator=g, dtype=torch.float64)
    w_o = torch.randn(e, e, generator=g, dtype=torch.float64)
    x = R(_comps([(n, e) for n in ns], seed), (1,))

    def block(x, w_qkv, b_qkv, w_o, mean_dim):
        q, k, v = F.linear(x, w_qkv, b_qkv).chunk(3, -1)
        q, k, v = (_t(t.unflatten(-1, (H, D))) for t in (q, k, v))
        a = sdpa(q, k, v)
        y = F.linear(_t(a).flatten(-2), w_o)
        y = F.layer_norm(y, (e,)) + x
        return y.mean(mean_dim)

    _check(lambda *a: block(*a, 1), lambda *a: block(*a, 0), x, w_qkv, b_qkv, w_o, bk=bk, dense_out=True)


# ----------------------------------------------------------------------------- cross attention
@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@few(6)
@given(nm=length_pairs(max_len=5), seed=seeds)
@example(nm=((3, 2, 0), (0, 4, 2)), seed=1)  # no keys for sample 0, no queries for sample 2
@example(nm=((2,), (5,)), seed=2)  # B = 1, Lq < Lk
def test_cross_attention(bk, causal, nm, seed):
    """k/v on another extent than q (Lq != Lk per sample); a sample with no keys gets zero
    output rows; is_causal top-left aligned with Lq != Lk, as dense."""
    ns, ms = nm
    q = R(_comps([(n, H, D) for n in ns], seed), (1,))
    k, v = (R(_comps([(m, H, D) for m in ms], seed + i), (1,)) for i in (1, 2))

    def fn(q, k, v):
        return sdpa(_t(q), _t(k), _t(v), is_causal=causal)

    out = _check(fn, fn, q, k, v, bk=bk)
    for o, n, m in zip(out.unbind(), ns, ms):
        if m == 0:
            assert torch.equal(o, torch.zeros(H, n, D, dtype=o.dtype)), "no keys: zero output rows (documented)"


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("hk", [1, 2])
@few(5)
@given(nm=length_pairs(max_len=4), seed=seeds, cross=st.booleans())
def test_enable_gqa(bk, hk, nm, seed, cross):
    """Fewer key/value heads (Hq = 4, Hk ∈ {1, 2}) with enable_gqa, self and cross attention."""
    ns, ms = nm
    ms = ms if cross else ns
    q = R(_comps([(n, 4, D) for n in ns], seed), (1,))
    k, v = (R(_comps([(m, hk, D) for m in ms], seed + i), (1,)) for i in (1, 2))

    def fn(q, k, v):
        return sdpa(_t(q), _t(k), _t(v), enable_gqa=True)

    _check(fn, fn, q, k, v, bk=bk)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("side", ["keys", "queries"])
@few(4)
@given(nm=length_pairs(max_len=4), seed=seeds, cross=st.booleans())
def test_one_head_broadcasts_over_the_others(bk, side, nm, seed, cross):
    """One key/value head for every query head without ``enable_gqa`` (timm's MobileNetV4
    multi-query attention), or one query head over several key heads: the size-1 head dim
    broadcasts as in dense SDPA."""
    ns, ms = nm
    ms = ms if cross else ns
    # dense SDPA keeps one query head where a sample has no queries or no keys: a batch
    # has one head count for all samples
    assume(side == "keys" or (all(ns) and all(ms)))
    hq, hk = (3, 1) if side == "keys" else (1, 3)
    q = R(_comps([(n, hq, D) for n in ns], seed), (1,))
    k, v = (R(_comps([(m, hk, D) for m in ms], seed + i), (1,)) for i in (1, 2))

    def fn(q, k, v):
        return sdpa(_t(q), _t(k), _t(v))

    _check(fn, fn, q, k, v, bk=bk)


def test_gqa_without_enable_gqa_raises():
    q = mj.nested_tensor([torch.randn(3, 4, D), torch.randn(2, 4, D)], ragged_dims=(1,))
    k = mj.nested_tensor([torch.randn(3, 2, D), torch.randn(2, 2, D)], ragged_dims=(1,))
    with pytest.raises(ValueError, match="scaled_dot_product_attention.*enable_gqa"):
        sdpa(_t(q), _t(k), _t(k))
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):  # 4 % 3 != 0
        k3 = mj.nested_tensor([torch.randn(3, 3, D), torch.randn(2, 3, D)], ragged_dims=(1,))
        sdpa(_t(q), _t(k3), _t(k3), enable_gqa=True)


# ----------------------------------------------------------------------------- masks
@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mh", [1, H])
@few(5)
@given(nm=length_pairs(max_len=4), seed=seeds, cross=st.booleans())
def test_multi_jagged_mask(bk, kind, mh, nm, seed, cross):
    """A bool or float multi_jagged mask ``(B, H or 1, j_q, j_k)``; the float one is a leaf whose
    gradient is compared. Random bool masks include fully masked rows (zero output, as dense)."""
    ns, ms = nm
    ms = ms if cross else ns
    q = R(_comps([(n, H, D) for n in ns], seed), (1,))
    k, v = (R(_comps([(m, H, D) for m in ms], seed + i), (1,)) for i in (1, 2))
    shapes = [(mh, n, m) for n, m in zip(ns, ms)]
    if kind == "float":
        mask = R(_comps(shapes, seed + 3), (2, 3))

        def fn(q, k, v, m):
            return sdpa(_t(q), _t(k), _t(v), attn_mask=m)

        _check(fn, fn, q, k, v, mask, bk=bk)
        return
    # a bool operand is no leaf: built inside fn, sample i's mask picked by its index
    bools = _comps(shapes, seed + 3, torch.bool)

    def fn(q, k, v, idx):
        return sdpa(_t(q), _t(k), _t(v), attn_mask=mj.nested_tensor(bools, ragged_dims=(2, 3)))

    def ref(q, k, v, i):
        return sdpa(_t(q), _t(k), _t(v), attn_mask=bools[int(i)])

    # the index is a float leaf that neither side differentiates (per_sample_check makes every
    # tensor operand a leaf)
    _check(fn, ref, q, k, v, PS(torch.arange(len(ns), dtype=torch.float64)), bk=bk)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("to_bhjj", ["permute", "movedim", "transpose"])
@few(5)
@given(ns=lengths(max_len=4), seed=seeds)
def test_pair_bias_from_linear(bk, to_bhjj, ns, seed):
    """A pair bias projected from a ``(B, j0, j0, C)`` pair by a ``Linear`` to ``(B, j0, j0, H)``
    and moved to ``(B, H, j0, j0)`` (``permute(0, 3, 1, 2)`` — or ``movedim(-1, 1)``, or two
    transposes); the pair and the projection weight get gradients."""
    c = 3
    moves = {
        "permute": (lambda b: b.permute(0, 3, 1, 2), lambda b: b.permute(2, 0, 1)),
        "movedim": (lambda b: b.movedim(-1, 1), lambda b: b.movedim(-1, 0)),
        "transpose": (lambda b: b.transpose(-1, -3).transpose(-1, -2), lambda b: b.transpose(-1, -3).transpose(-1, -2)),
    }[to_bhjj]
    q, k, v = (R(_comps([(n, H, D) for n in ns], seed + i), (1,)) for i in range(3))
    pair = R(_comps([(n, n, c) for n in ns], seed + 3), (1, 2))
    w = torch.randn(H, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def fn(q, k, v, pair, w):
        bias = moves[0](F.linear(pair, w))
        assert bias.shape[1] == H and bias.ragged_dims == (2, 3)
        return sdpa(_t(q), _t(k), _t(v), attn_mask=bias)

    def ref(q, k, v, pair, w):
        return sdpa(_t(q), _t(k), _t(v), attn_mask=moves[1](F.linear(pair, w)))

    _check(fn, ref, q, k, v, pair, w, bk=bk)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("shape", [(-1, 1, 1, 1), (1,), (H, 1, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@few(3)
@given(ns=lengths(max_len=4), seed=seeds)
def test_dense_broadcast_mask(bk, shape, kind, ns, seed):
    """A dense mask that broadcasts over the ragged dims: per sample ``(B, 1, 1, 1)``, shared
    ``(1,)``, per head ``(H, 1, 1)``; a float one gets its gradient."""
    q, k, v = (R(_comps([(n, H, D) for n in ns], seed + i), (1,)) for i in range(3))
    g = torch.Generator().manual_seed(seed)
    full = tuple(len(ns) if s == -1 else s for s in shape)
    m = torch.rand(full, generator=g, dtype=torch.float64)
    m = m < 0.6 if kind == "bool" else m * 4 - 2

    def ref4(q, k, v, m):
        # sample i as a batch of one, so that a mask of rank 4 broadcasts as it does for B; dense
        # SDPA refuses a 1-d mask (a dim -2 is required), ours broadcasts it: (1,) is (1, 1) there
        m = m.reshape(1, 1) if m.dim() == 1 else m
        return sdpa(*[_t(x).unsqueeze(0) for x in (q, k, v)], attn_mask=m).squeeze(0)

    if kind == "float":
        # a per-sample (B, …) mask is a PS operand (sample i sees m[i]); the others are shared
        mask = PS(m) if shape[0] == -1 else m

        def fn(q, k, v, m):
            return sdpa(_t(q), _t(k), _t(v), attn_mask=m)

        _check(fn, ref4, q, k, v, mask, bk=bk)
        return

    def fn_b(q, k, v, idx):
        return sdpa(_t(q), _t(k), _t(v), attn_mask=m)

    def ref_b(q, k, v, i):
        return ref4(q, k, v, m[int(i)] if shape[0] == -1 else m)

    _check(fn_b, ref_b, q, k, v, PS(torch.arange(len(ns), dtype=torch.float64)), bk=bk)


# ----------------------------------------------------------------------------- more ragged dims
@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("bias", [None, "shared", "per_row"])
@few(5)
@given(ns=lengths(max_len=4), seed=seeds)
def test_triangle_attention(bk, bias, ns, seed):
    """Triangle-style attention: q ``(B, j0, H, j0, D)`` (each row of a pair attends along its
    columns), with no bias, a bias ``(B, 1, H, j0, j0)`` shared by the rows (broadcast, never
    copied) or a per-row bias ``(B, j0, H, j0, j0)`` (three ragged dims)."""
    q, k, v = (R(_comps([(n, n, H, D) for n in ns], seed + i), (1, 2)) for i in range(3))
    args = [q, k, v]
    if bias == "shared":
        args.append(R(_comps([(n, n, H) for n in ns], seed + 3), (1, 2)))
        to_mask = (lambda b: b.permute(0, 3, 1, 2).unsqueeze(1), lambda b: b.permute(2, 0, 1).unsqueeze(0))
    elif bias == "per_row":
        args.append(R(_comps([(n, n, n, H) for n in ns], seed + 3), (1, 2, 3)))
        to_mask = (lambda b: b.permute(0, 1, 4, 2, 3), lambda b: b.permute(0, 3, 1, 2))

    def fn(q, k, v, b=None):
        m = None if b is None else to_mask[0](b)
        return sdpa(_t(q), _t(k), _t(v), attn_mask=m)

    def ref(q, k, v, b=None):
        m = None if b is None else to_mask[1](b)
        return sdpa(_t(q), _t(k), _t(v), attn_mask=m)

    _check(fn, ref, *args, bk=bk)


def _triangle(ns, seed, dtype=torch.float64):
    """q, k, v ``(B, j0, j0, H, D)`` and a pair bias ``(B, j0, j0, H)``, leaves."""
    q, k, v = (mj.nested_tensor(_comps([(n, n, H, D) for n in ns], seed + i, dtype), ragged_dims=(1, 2),
                                requires_grad=True) for i in range(3))
    b = mj.nested_tensor(_comps([(n, n, H) for n in ns], seed + 3, dtype), ragged_dims=(1, 2), requires_grad=True)
    return q, k, v, b


@pytest.mark.parametrize("keeps", ["bias grad", "no bias grad", "over the cap"])
def test_triangle_attention_keeps_probabilities_for_the_backward(monkeypatch, keeps):
    """NOTE [ Keeping the probabilities ]: eagerly, with a pair bias that needs a gradient, the
    ``blocks`` forward keeps each sample's probabilities and the backward reads them (dense SDPA's
    math path keeps them too); without a bias gradient, or beyond ``KEEP_PROBS_MAX`` entries, the
    backward recomputes them. Outputs and every gradient equal the per-sample dense ones."""
    from torch_multijagged.compile import attention as cattn
    from torch_multijagged.kernels import attention as kattn_mod

    calls = []
    fwd, bwd = kattn_mod.attention_blocks, kattn_mod.attention_blocks_backward
    monkeypatch.setattr(kattn_mod, "attention_blocks", lambda *a, **kw: calls.append(("fwd", kw.get("probs") is not None)) or fwd(*a, **kw))
    monkeypatch.setattr(kattn_mod, "attention_blocks_backward", lambda *a, **kw: calls.append(("bwd", kw.get("probs") is not None)) or bwd(*a, **kw))
    if keeps == "over the cap":
        monkeypatch.setattr(cattn, "KEEP_PROBS_MAX", (2 * 2 * 2 + 4 * 4 * 4) * H - 1)
    ns = [2, 0, 4]
    q, k, v, b = _triangle(ns, 3)
    leaves = [q, k, v] + ([b] if keeps != "no bias grad" else [])
    if keeps == "no bias grad":
        b = b.detach()
    with backend("blocks"):
        out = sdpa(_t(q), _t(k), _t(v), attn_mask=b.permute(0, 3, 1, 2).unsqueeze(1))
        go = [torch.randn(o.shape, dtype=o.dtype) for o in out.unbind()]
        grads = torch.autograd.grad(out, leaves, mj.nested_tensor(go, ragged_dims=(1, 3)))
    kept = keeps == "bias grad"
    assert calls == [("fwd", kept), ("bwd", kept)]
    for i, n in enumerate(ns):
        d = [x.unbind()[i].detach().requires_grad_() for x in leaves]
        ref = sdpa(_t(d[0]), _t(d[1]), _t(d[2]), attn_mask=(d[3] if kept or keeps == "over the cap" else
                                                             b.unbind()[i]).permute(2, 0, 1).unsqueeze(0))
        torch.testing.assert_close(out.unbind()[i], ref)
        for got, want in zip(grads, torch.autograd.grad(ref, d, go[i], allow_unused=True, materialize_grads=True)):
            torch.testing.assert_close(got.unbind()[i], want)


def test_triangle_attention_kept_probabilities_under_create_graph():
    """A backward recording a graph takes the op's formula, which reads ``lse``: the forward that
    kept the probabilities did not write it, so it is recomputed. The first-order gradients equal
    the kept path's, and the double backward raises as it does without the kept probabilities."""
    q, k, v, b = _triangle([3, 1, 2], 5)
    with backend("blocks"):
        out = sdpa(_t(q), _t(k), _t(v), attn_mask=b.permute(0, 3, 1, 2).unsqueeze(1))
        loss = (out * out).sum()
        first = torch.autograd.grad(loss, (q, k, v, b), retain_graph=True)
        graphed = torch.autograd.grad(loss, (q, k, v, b), create_graph=True)
        for a, c in zip(first, graphed):
            torch.testing.assert_close(a.values(), c.values().detach(), rtol=1e-12, atol=1e-12)
        with pytest.raises(NotImplementedError, match="double backward"):
            torch.autograd.grad(graphed[0].values().sum(), (q, k, v, b))


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@few(5)
@given(nmk=length_triples(max_len=3), seed=seeds)
def test_rect_pair_rows_attend_cross(bk, causal, nmk, seed):
    """q ``(B, j0, H, j1, D)`` attending to k/v ``(B, j0, H, j2, D)``: ragged batch dim j0, cross
    attention along j1 → j2, with a bias ``(B, 1, H, j1, j2)`` shared by the rows."""
    ns, ms, ks = nmk
    q = R(_comps([(n, m, H, D) for n, m in zip(ns, ms)], seed), (1, 2))
    k, v = (R(_comps([(n, kk, H, D) for n, kk in zip(ns, ks)], seed + i), (1, 2)) for i in (1, 2))
    bias = R(_comps([(H, m, kk) for m, kk in zip(ms, ks)], seed + 3), (2, 3))

    def fn(q, k, v, b):
        b = b.unsqueeze(1) if b.dim() == 4 else b
        return sdpa(_t(q), _t(k), _t(v), attn_mask=None if causal else b, is_causal=causal)

    _check(fn, fn, q, k, v, bias, bk=bk)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@few(5)
@given(ns=lengths(max_len=4), seed=seeds, mask=st.sampled_from([None, "dense", "ragged"]), causal=st.booleans())
def test_static_l(bk, ns, seed, mask, causal):
    """L static: q ``(B, j0, H, L, D)`` attends inside each packed row (dim -2 not ragged), with
    a dense ``(H, L, L)`` mask or a multi_jagged ``(B, j0, 1, L, L)`` one."""
    L = 3
    causal = causal and mask is None
    q, k, v = (R(_comps([(n, L, H, D) for n in ns], seed + i), (1,)) for i in range(3))
    args = [q, k, v]
    if mask == "dense":
        args.append(torch.randn(H, L, L, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    elif mask == "ragged":
        args.append(R(_comps([(n, 1, L, L) for n in ns], seed + 3), (1,)))

    def fn(q, k, v, m=None):
        return sdpa(_t(q), _t(k), _t(v), attn_mask=m, is_causal=causal)

    _check(fn, fn, *args, bk=bk)


# ----------------------------------------------------------------------------- q, k, v of one structure
def _qkv(ns, seed, dtype=torch.float64, requires_grad=False, h=H, d=D):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        x = mj.nested_tensor([torch.randn(n, h, d, generator=g, dtype=dtype) for n in ns], ragged_dims=(1,),
                             requires_grad=requires_grad)
        out.append(x)
    return out


# ----------------------------------------------------------------------------- low precision
def _err_bound_case(dtype, seed, mask):
    ns, ms = (5, 0, 7, 3), (4, 6, 7, 0)
    g = torch.Generator().manual_seed(seed)
    q64 = [torch.randn(n, H, 8, generator=g, dtype=torch.float64) for n in ns]
    k64 = [torch.randn(m, H, 8, generator=g, dtype=torch.float64) for m in ms]
    v64 = [torch.randn(m, H, 8, generator=g, dtype=torch.float64) for m in ms]
    m64 = [torch.randn(1, n, m, generator=g, dtype=torch.float64) for n, m in zip(ns, ms)] if mask else None
    # inputs rounded to the low dtype once: the float64 reference sees the same numbers
    rnd = lambda cs: [c.to(dtype).to(torch.float64) for c in cs]  # noqa: E731
    return rnd(q64), rnd(k64), rnd(v64), None if m64 is None else rnd(m64)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", [False, True])
def test_low_precision_error_bound(bk, dtype, mask):
    """|ours − ref64| ≤ 2·|dense SDPA in dtype − ref64| + atol, forward and input gradients (the
    bound flash-attn's tests use), per sample with zero-length samples."""
    atol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    qs, ks, vs, ms = _err_bound_case(dtype, 0, mask)
    cot = [torch.randn(H, q.shape[0], 8, dtype=torch.float64) for q in qs]

    def dense(dt, i):
        leaves = [c[i].to(dt).requires_grad_() for c in (qs, ks, vs)]
        m = None if ms is None else ms[i].to(dt)
        o = sdpa(*[_t(x) for x in leaves], attn_mask=m)
        gs = torch.autograd.grad(o, leaves, cot[i].to(dt)) if o.numel() else [torch.zeros_like(x) for x in leaves]
        return [o.double(), *[x.double() for x in gs]]

    leaves = [mj.nested_tensor([c.to(dtype) for c in cs], ragged_dims=(1,), requires_grad=True) for cs in (qs, ks, vs)]
    mt = None if ms is None else mj.nested_tensor([c.to(dtype) for c in ms], ragged_dims=(2, 3))
    with _using(bk):
        out = sdpa(*[_t(x) for x in leaves], attn_mask=mt)
        assert out.dtype == dtype
        loss = sum((o * c.to(dtype)).sum() for o, c in zip(out.unbind(), cot))
        grads = torch.autograd.grad(loss, leaves)
    ours = [out.unbind(), *[g.unbind() for g in grads]]
    for i in range(len(qs)):
        ref, low = dense(torch.float64, i), dense(dtype, i)
        for what, o, r, lo in zip(("out", "dq", "dk", "dv"), [x[i].double() for x in ours], ref, low):
            if r.numel() == 0:
                continue
            err, base = (o - r).abs().max().item(), (lo - r).abs().max().item()
            assert err <= 2 * base + atol, f"sample {i} {what}: error {err:.3g} > 2·{base:.3g} + {atol}"


# ----------------------------------------------------------------------------- GPU backends
def _triton_usable() -> str:
    """Why the triton backend cannot be tested here ("" when it can): on CPU it needs
    ``TRITON_INTERPRET=1`` in the environment before triton is imported."""
    if not _TRITON_MODULE.exists():
        return "torch_multijagged/compile/triton_attention.py is absent"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA and TRITON_INTERPRET is not 1"
    return ""


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


# ----------------------------------------------------------------------------- no leakage
def _run_all(bk, qs, ks, vs, ms, causal=False):
    """Outputs and gradients (of q, k, v, mask leaves) per sample, under backend ``bk``."""
    dev, dt = _LEAK_DEVICE.get(bk, ("cpu", torch.float32))
    leaves = [mj.nested_tensor([c.to(dev, dt) for c in cs], ragged_dims=(1,), requires_grad=True)
              for cs in (qs, ks, vs)]
    m = None
    if ms is not None:
        leaves.append(mj.nested_tensor([c.to(dev, dt) for c in ms], ragged_dims=(1, 2), requires_grad=True))
        m = leaves[-1].unsqueeze(1)
    with _using(bk):
        out = sdpa(*[_t(x) for x in leaves[:3]], attn_mask=m, is_causal=causal)
        loss = sum((o * (torch.arange(o.shape[-1], device=dev) + 0.5)).sum() for o in out.unbind())
        grads = torch.autograd.grad(loss, leaves)
    return [out.unbind(), *[g.unbind() for g in grads]]


_LEAK_DEVICE = {"triton": (_device(), torch.float32), "flash": ("cuda", torch.float16)}
LEAK_BACKENDS = CPU_BACKENDS + (
    pytest.param("triton", marks=pytest.mark.skipif(bool(_triton_usable()), reason=_triton_usable() or "-")),
    pytest.param("flash", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
)


@pytest.mark.parametrize("bk", LEAK_BACKENDS)
@pytest.mark.parametrize("what", ["q", "k", "v", "mask", "causal"])
@few(5)
@given(nm=length_pairs(max_len=5, min_batch=2), seed=seeds, j=st.integers(0, 10))
def test_no_leakage(bk, what, nm, seed, j):
    """Perturbing sample j's q / k / v / mask leaves every other sample's outputs and gradients
    bit-identical (``torch.equal``): nothing is computed across samples."""
    if bk == "flash" and what == "mask":
        pytest.skip("the flash backend takes no mask")
    ns, ms = nm
    j %= len(ns)
    g = torch.Generator().manual_seed(seed)
    qs = [torch.randn(n, H, D, generator=g, dtype=torch.float32) for n in ns]
    ks = [torch.randn(m, H, D, generator=g, dtype=torch.float32) for m in ms]
    vs = [torch.randn(m, H, D, generator=g, dtype=torch.float32) for m in ms]
    with_mask = what == "mask"
    mk = [torch.randn(n, m, generator=g) for n, m in zip(ns, ms)] if with_mask else None
    causal = what == "causal"
    if causal:
        ks, vs = [torch.randn(n, H, D, generator=g) for n in ns], [torch.randn(n, H, D, generator=g) for n in ns]
    before = _run_all(bk, qs, ks, vs, mk, causal)
    target = {"q": qs, "k": ks, "v": vs, "mask": mk, "causal": qs}[what]
    target[j] = target[j] * 3.0 + 1.0
    if causal:
        ks[j], vs[j] = ks[j] - 1.0, vs[j] * -2.0
    after = _run_all(bk, qs, ks, vs, mk, causal)
    for i in range(len(ns)):
        if i == j:
            continue
        for name, a, b in zip(("out", "dq", "dk", "dv", "dmask"), before, after):
            assert bit_equal(a[i], b[i]), f"perturbing sample {j}'s {what} changed sample {i}'s {name}"


# ----------------------------------------------------------------------------- errors
def _mj(ns, tail, dtype=torch.float32, rd=(1,)):
    return mj.nested_tensor([torch.randn(n, *tail, dtype=dtype) for n in ns], ragged_dims=rd)


def _bad_inputs():
    q = _t(_mj([3, 0, 2], (H, D)))
    k = _t(_mj([3, 0, 2], (H, D)))
    yield "batch", (q, _t(_mj([3, 0], (H, D))), _t(_mj([3, 0], (H, D)))), {}
    yield "heads", (q, _t(_mj([3, 0, 2], (H + 1, D))), _t(_mj([3, 0, 2], (H + 1, D)))), {}
    yield "kv extents", (q, _t(_mj([3, 0, 2], (H, D))), _t(_mj([1, 2, 2], (H, D)))), {}
    yield "D", (q, _t(_mj([3, 0, 2], (H, D + 1))), k), {}
    # a dense q attends over ragged keys (test_sdpa_dense_queries_over_ragged_keys): of the batch's size or 1
    yield "dense q of another batch size", (torch.randn(2, H, 3, D), k, k), {}
    yield "dense q of another rank", (torch.randn(3, 3, D), k, k), {}
    yield "dense k", (q, torch.randn(3, H, 3, D), k), {}
    yield "kv static sizes", (q, k, _t(_mj([3, 0, 2], (H + 1, D)))), {}
    static_l = _mj([3, 0, 2], (H, D))  # (B, j, H, D): dim -2 static, while q's is ragged
    yield "ragged vs static L", (q, static_l, static_l), {}
    yield "rank", (q, _t(_mj([3, 0, 2], (2, H, D))), k), {}
    yield "mask and causal", (q, k, k), {"attn_mask": torch.zeros(1), "is_causal": True}
    # masks of the wrong structure
    pair = mj.nested_tensor([torch.zeros(1, n, n) for n in (3, 0, 2)], ragged_dims=(2, 3))
    other = mj.nested_tensor([torch.zeros(1, n, n) for n in (2, 1, 2)], ragged_dims=(2, 3))
    yield "mask other extents", (q, k, k), {"attn_mask": other}
    yield "mask ragged dims", (q, k, k), {"attn_mask": mj.nested_tensor([torch.zeros(n, 1, n) for n in (3, 0, 2)],
                                                                         ragged_dims=(1, 3))}
    yield "mask one ragged dim", (q, k, k), {"attn_mask": mj.nested_tensor([torch.zeros(1, n, 4) for n in (3, 0, 2)],
                                                                            ragged_dims=(2,))}
    yield "mask static size", (q, k, k), {"attn_mask": mj.nested_tensor([torch.zeros(H + 1, n, n) for n in (3, 0, 2)],
                                                                         ragged_dims=(2, 3))}
    yield "mask rank", (q, k, k), {"attn_mask": pair.squeeze(1)}
    yield "dense mask over ragged dim", (q, k, k), {"attn_mask": torch.zeros(1, 1, 3, 3)}
    yield "dense mask batch", (q, k, k), {"attn_mask": torch.zeros(2, 1, 1, 1)}
    yield "mask dtype", (q, k, k), {"attn_mask": pair.to(torch.float64)}


@pytest.mark.parametrize("case", list(_bad_inputs()), ids=lambda c: c[0] if isinstance(c, tuple) else str(c))
def test_bad_input_raises_naming_the_op(case):
    _, args, kw = case
    with pytest.raises((StructureError, RuntimeError, ValueError), match="scaled_dot_product_attention"):
        sdpa(*args, **kw)


# ----------------------------------------------------------------------------- autograd
def test_double_backward_raises():
    q, k, v = _qkv([3, 0, 2], 0, requires_grad=True)
    out = sdpa(_t(q), _t(k), _t(v))
    (gq,) = torch.autograd.grad(out.values().pow(2).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="scaled_dot_product_attention.*double backward"):
        torch.autograd.grad(gq.values().sum(), (q, k, v))


def test_values_sum_backward_after_transposes_regression():
    """``x.unflatten(-1, (2, 8)).transpose(1, 2).transpose(1, 2).flatten(-2).values().sum()
    .backward()`` used to fail in C++ reshape (bridge.py)."""
    x = mj.nested_tensor([torch.randn(3, 16), torch.randn(0, 16), torch.randn(5, 16)], requires_grad=True)
    y = x.unflatten(-1, (2, 8)).transpose(1, 2).transpose(1, 2).flatten(-2)
    y.values().sum().backward()
    assert torch.equal(x.grad.values(), torch.ones(8, 16))
    # and through attention, as a user's model uses it
    x.grad = None
    q = x.unflatten(-1, (2, 8)).transpose(1, 2)
    sdpa(q, q, q).transpose(1, 2).flatten(-2).values().sum().backward()
    assert x.grad.shape[1] == x.shape[1] and bool(torch.isfinite(x.grad.values()).all())


# ----------------------------------------------------------------------------- compile
class _Attn(torch.nn.Module):
    def __init__(self, e=8, h=2, bias=False):
        super().__init__()
        self.h, self.bias = h, bias
        self.qkv, self.o = torch.nn.Linear(e, 3 * e), torch.nn.Linear(e, e)
        self.left, self.right = torch.nn.Linear(e, 4), torch.nn.Linear(e, 4)
        self.pb = torch.nn.Linear(4, h)

    def forward(self, x):
        q, k, v = (_t(t.unflatten(-1, (self.h, -1))) for t in self.qkv(x).chunk(3, -1))
        mask = None
        if self.bias:
            pair = self.left(x).unsqueeze(-2) + self.right(x).unsqueeze(-3)  # (B, j, j, 4)
            mask = self.pb(pair).permute(0, 3, 1, 2)
        a = sdpa(q, k, v, attn_mask=mask, is_causal=not self.bias)
        return x + self.o(_t(a).flatten(-2))


# Inductor once (with the bias, the bigger graph): it costs ~20 s of compile time here
@pytest.mark.parametrize("bias, compiler", [(False, "aot_eager"), (True, "aot_eager"), (True, "inductor")])
def test_compile_fullgraph_one_graph_changing_lengths(bias, compiler):
    """fullgraph forward + backward equal eager, one graph over six batches of changing lengths,
    with is_causal or with a pair bias made from the input (so it shares q's nested int)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Attn(bias=bias)
    counter = CompileCounterWithBackend(compiler)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    # (a batch whose longest sample has 1 token recompiles once: 0/1 specialisation of the max
    # length, in the layout's compile machinery, not in attention; the lengths avoid it)
    for lens in ([3, 5, 1, 2], [4, 0, 6, 2], [2, 2, 2, 2], [7, 2, 0, 3], [2, 6, 3, 5], [1, 0, 9, 1]):
        comps = [torch.randn(n, 8) for n in lens]
        xe, xc = (mj.nested_tensor(comps, requires_grad=True) for _ in range(2))
        ye, yc = model(xe), compiled(xc)
        assert torch.equal(ye.sizes(), yc.sizes())
        torch.testing.assert_close(yc.values(), ye.values(), rtol=1e-5, atol=1e-5)
        ge = torch.autograd.grad((ye * ye).sum(), [xe, *model.parameters()], allow_unused=True)
        gc = torch.autograd.grad((yc * yc).sum(), [xc, *model.parameters()], allow_unused=True)
        torch.testing.assert_close(gc[0].values(), ge[0].values(), rtol=1e-5, atol=1e-5)
        for a, b in zip(gc[1:], ge[1:]):
            if a is None or b is None:
                assert a is None and b is None
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    assert counter.frame_count == 1, "new lengths at a fixed batch size must not recompile"
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- triton / CUDA
def _backend_vs_reference(name, device, dtype, mask, causal, gqa=False, tol=1e-5):
    """Forward and gradients of backend ``name`` against the float64 per-sample dense reference."""
    ns, ms = [5, 0, 9, 2, 1], [5, 0, 9, 2, 1] if causal else [3, 4, 9, 0, 6]
    g = torch.Generator().manual_seed(0)
    hk = 1 if gqa else H
    qs = [torch.randn(n, H, 16, generator=g, dtype=torch.float64) for n in ns]
    ks = [torch.randn(m, hk, 16, generator=g, dtype=torch.float64) for m in ms]
    vs = [torch.randn(m, hk, 16, generator=g, dtype=torch.float64) for m in ms]
    bs = [torch.randn(H, n, m, generator=g, dtype=torch.float64) for n, m in zip(ns, ms)] if mask else None
    leaves = [mj.nested_tensor([c.to(dtype=dtype, device=device) for c in cs], ragged_dims=(1,), requires_grad=True)
              for cs in (qs, ks, vs)]
    bt = None
    if mask:
        bt = mj.nested_tensor([c.to(dtype=dtype, device=device) for c in bs], ragged_dims=(2, 3), requires_grad=True)
    with backend(name):
        out = sdpa(*[_t(x) for x in leaves], attn_mask=bt, is_causal=causal, enable_gqa=gqa)
        grads = torch.autograd.grad(out.values().sum(), leaves + ([bt] if mask else []))
    for i in range(len(ns)):
        ref_leaves = [c[i].clone().requires_grad_() for c in (qs, ks, vs)] + ([bs[i].clone().requires_grad_()] if mask else [])
        o = sdpa(*[_t(x) for x in ref_leaves[:3]], attn_mask=ref_leaves[3] if mask else None, is_causal=causal,
                 enable_gqa=gqa)
        rg = torch.autograd.grad(o.sum(), ref_leaves, allow_unused=True) if o.numel() else [None] * len(ref_leaves)
        torch.testing.assert_close(out.unbind()[i].cpu().double(), o.detach(), rtol=tol, atol=tol)
        for gm, gr, lf in zip(grads, rg, ref_leaves):
            gr = torch.zeros_like(lf) if gr is None else gr
            torch.testing.assert_close(gm.unbind()[i].cpu().double(), gr, rtol=tol, atol=tol)


@pytest.mark.skipif(bool(_triton_usable()), reason=_triton_usable() or "triton usable")
@pytest.mark.parametrize("mask, causal, gqa", [(False, False, False), (True, False, False), (False, True, True)])
def test_triton_backend(mask, causal, gqa):
    _backend_vs_reference("triton", _device(), torch.float32, mask, causal, gqa, tol=2e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("causal", [False, True])
def test_flash_backend_cuda(causal):
    _backend_vs_reference("flash", "cuda", torch.float16, False, causal, tol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_backend_cuda(causal):
    pytest.importorskip("flash_attn")
    _backend_vs_reference("flash_attn", "cuda", torch.float16, False, causal, tol=2e-2)


@pytest.mark.parametrize("bk", ["bucketed", "loop"])
def test_backends_agree_with_reference_backend(bk):
    """The CPU backends against ``backend("reference")`` (the oracle twin) on one batch."""
    _backend_vs_reference(bk, "cpu", torch.float64, True, False, tol=1e-10)
    _backend_vs_reference(bk, "cpu", torch.float64, False, True, gqa=True, tol=1e-10)


# ----------------------------------------------------------------------------- found by planted bugs
@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_sample_does_not_leak(bk, bad):
    """A non-finite key/value in one sample stays in that sample. Padded positions of a bucket
    read some other sample's rows; unless they are zeroed, ``0 · inf`` (a masked probability times
    a value) or ``inf + -inf`` (a score plus the padding mask) turns a neighbour's output to nan."""
    g = torch.Generator().manual_seed(0)
    ns = (6, 2, 5, 3)  # sample 0 is first in the packed rows: padded positions read its rows
    comps = [[torch.randn(n, H, D, generator=g, dtype=torch.float64) for n in ns] for _ in range(3)]
    comps[1][0][0] = bad
    comps[2][0][0] = bad
    q, k, v = (mj.nested_tensor(c) for c in comps)
    with _using(bk):
        out = sdpa(_t(q), _t(k), _t(v))
    for i in range(1, len(ns)):
        want = _t(sdpa(_t(comps[0][i]), _t(comps[1][i]), _t(comps[2][i])))
        torch.testing.assert_close(_t(out).unbind()[i], want)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
def test_default_scale_uses_the_query_head_size(bk):
    """``scale=None`` is ``1/sqrt(E)`` of q and k, not of v (whose head size may differ)."""
    g = torch.Generator().manual_seed(1)
    ns = (3, 0, 4)
    qs = [torch.randn(n, H, 4, generator=g, dtype=torch.float64) for n in ns]
    ks = [torch.randn(n, H, 4, generator=g, dtype=torch.float64) for n in ns]
    vs = [torch.randn(n, H, 7, generator=g, dtype=torch.float64) for n in ns]
    with _using(bk):
        out = sdpa(*(_t(mj.nested_tensor(c)) for c in (qs, ks, vs)))
    for i, n in enumerate(ns):
        if n:
            torch.testing.assert_close(_t(out).unbind()[i], _t(sdpa(_t(qs[i]), _t(ks[i]), _t(vs[i]))))



@pytest.mark.parametrize("kind", ["key padding bool", "key padding float", "query padding bool"])
def test_padding_masks_broadcast_over_the_other_ragged_dim(kind):
    """A mask ragged over only the key dim, ``(B, 1, 1, j0)`` (NaViT's key padding), or only the
    query dim, ``(B, 1, j0, 1)``: broadcast over the other dim as dense SDPA broadcasts it, per
    sample, with gradients."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in (3, 5, 0, 4)]
    x = mj.nested_tensor(comps, requires_grad=True)

    def parts(t, batch):  # q and the mask for a sample (batch=False) or the batch
        q = t.unflatten(-1, (2, 4)).transpose(-3, -2)
        keep = t[..., 0] > -0.5 if "key" in kind else t[..., 1] > 0
        mask = keep[..., None, None, :] if "key" in kind else keep[..., None, :, None]
        if not batch:
            mask = mask[0] if mask.dim() == 4 else mask
        if "float" in kind:
            mask = torch.where(mask, 0.0, -1e9).to(torch.float64)
        return q, mask

    q, m = parts(x, True)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = []
    for c in leaves:
        qc, mc = parts(c, False)
        refs.append(F.scaled_dot_product_attention(qc, qc, qc, attn_mask=mc))
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r, equal_nan=True)
    if "query" in kind:
        return  # rows with no visible key are nan in dense SDPA: no gradient to compare
    got, = torch.autograd.grad((out * out).sum(), x)
    for a, w in zip(got.unbind(), torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)):
        torch.testing.assert_close(a, w)


def test_key_padding_mask_in_cross_attention():
    """Queries and keys of different lengths: a key-padding mask ``(B, 1, 1, j_k)`` broadcasts over
    each sample's queries."""
    g = torch.Generator().manual_seed(1)
    qs = [torch.randn(n, 2, 4, generator=g, dtype=torch.float64) for n in (2, 4, 1)]
    ks = [torch.randn(n, 2, 4, generator=g, dtype=torch.float64) for n in (5, 3, 3)]
    q = mj.nested_tensor(qs).transpose(1, 2)
    k = mj.nested_tensor(ks).transpose(1, 2)
    keep = mj.nested_tensor([torch.arange(n) % 3 != 1 for n in (5, 3, 3)])[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, k, attn_mask=keep)
    for a, qi, ki, n in zip(out.unbind(), qs, ks, (5, 3, 3)):
        m = (torch.arange(n) % 3 != 1)[None, None, :]
        ref = F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), ki.transpose(0, 1), attn_mask=m)
        torch.testing.assert_close(a, ref)
