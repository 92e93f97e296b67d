"""Triton kernels for attention over short packed segments (NOTE [ Varlen attention contract ]
in ``kernels/attention.py``; ``attention_reference`` / ``attention_reference_backward`` are the
twins and the test oracle).

One launch serves the whole batch. The forward is flash attention with an online softmax, one
program per ``(query block, segment, query head)``; the backward recomputes the probabilities
from the saved ``lse``, one program per ``(key block, segment, kv head)`` that owns its ``dk``/
``dv`` rows (it loops over every query head of its GQA group, so no atomics there) and adds its
share of ``dq`` and ``dbias`` with fp32 atomics (several key blocks touch one query row; several
segments and heads may share one bias block). Tuned for segments of at most ~256 keys (a few key
blocks per program) and head sizes up to 128; longer segments are computed right, just slowly.

No dropout: the dispatcher sends dropout to the bucketed path. Triton is imported guarded so the
package imports without it; the launchers raise then.
"""

from __future__ import annotations

import math

import torch

from ._triton import tl, triton, jit as _jit, require_triton as _require_triton, launch as _launch  # noqa: F401

__all__ = ["attention_triton", "attention_triton_backward"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_HEAD = 128


# ----------------------------------------------------------------------------- kernels
@_jit
def _dot(a, b, IEEE: tl.constexpr):
    # float32 inputs: full precision (the oracle's); tf32 would cost ~1e-3 relative error
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@_jit
def _fwd_kernel(
    Q, K, V, Bias, BiasStart, CuQ, CuK, Out, Lse,
    # strides
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sb_t, sb_h,
    so_t, so_h, so_d, sl_t, sl_h,
    # sizes
    D, DV, scale,
    # meta-parameters
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_PER_HEAD: tl.constexpr, CAUSAL: tl.constexpr,
    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid_m = tl.program_id(0)
    seg = tl.program_id(1)
    h = tl.program_id(2)
    q0 = tl.load(CuQ + seg)
    lq = (tl.load(CuQ + seg + 1) - q0).to(tl.int32)
    k0 = tl.load(CuK + seg)
    lk = (tl.load(CuK + seg + 1) - k0).to(tl.int32)
    start_m = pid_m * BLOCK_M
    if start_m >= lq:  # the grid is sized by max_q; shorter segments have idle programs
        return
    hk = h // GROUP
    # NOTE: 64-bit scalar bases, 32-bit offsets inside the segment (the launcher checks they fit):
    # 64-bit per-element pointer tiles cost twice the registers and spilled
    q_base = Q + q0 * sq_t + h * sq_h
    k_base = K + k0 * sk_t + hk * sk_h
    v_base = V + k0 * sv_t + hk * sv_h
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < lq
    q = tl.load(q_base + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    if HAS_BIAS:
        b_base = Bias + tl.load(BiasStart + seg) * sb_t + (h * BIAS_PER_HEAD) * sb_h
    # scores in the log2 domain: exp2 is the native instruction
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    hi = lk
    if CAUSAL:  # top-left: keys past the block's last query are invisible to all of it
        hi = tl.minimum(lk, start_m + BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        kn = start_n + offs_n
        n_ok = kn < lk
        kt = tl.load(k_base + kn[None, :] * sk_t + offs_d[:, None] * sk_d,
                     mask=n_ok[None, :] & (offs_d < D)[:, None], other=0.0)
        s = _dot(q, kt, IEEE) * qk_scale
        if HAS_BIAS:
            bias = tl.load(b_base + (offs_m[:, None] * lk + kn[None, :]) * sb_t,
                           mask=m_ok[:, None] & n_ok[None, :], other=0.0)
            s += bias.to(tl.float32) * 1.4426950408889634
        vis = n_ok[None, :]
        if CAUSAL:
            vis = vis & (kn[None, :] <= offs_m[:, None])
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with nothing visible yet keeps m = -inf; shift by 0 there so that no -inf - -inf
        # (nan) appears: its p and alpha are exp2(-inf) = 0
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(v_base + kn[:, None] * sv_t + offs_dv[None, :] * sv_d,
                     mask=n_ok[:, None] & (offs_dv < DV)[None, :], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(vb.dtype), vb, IEEE)
        m_i = m_new
    live = l_i > 0.0  # a row with no visible key: zero output, lse = -inf
    out = tl.where(live[:, None], acc / tl.where(live, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(live, (m_i + tl.math.log2(tl.where(live, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(Out + q0 * so_t + h * so_h + offs_m[:, None] * so_t + offs_dv[None, :] * so_d,
             out.to(Out.dtype.element_ty), mask=m_ok[:, None] & (offs_dv < DV)[None, :])
    tl.store(Lse + q0 * sl_t + h * sl_h + offs_m * sl_t, lse, mask=m_ok)


@_jit
def _delta_kernel(
    O, DO, Delta, T,
    # strides
    so_t, so_h, so_d, sg_t, sg_h, sg_d, sd_t, sd_h,
    # sizes
    DV,
    # meta-parameters
    BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """``delta = rowsum(dO · O)`` in fp32: the softmax backward's per-row term."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    offs = tl.arange(0, BLOCK_DV)
    mask = (rows < T)[:, None] & (offs < DV)[None, :]
    o = tl.load(O + rows[:, None] * so_t + h * so_h + offs[None, :] * so_d, mask=mask, other=0.0)
    g = tl.load(DO + rows[:, None] * sg_t + h * sg_h + offs[None, :] * sg_d, mask=mask, other=0.0)
    d = tl.sum(o.to(tl.float32) * g.to(tl.float32), 1)
    tl.store(Delta + rows * sd_t + h * sd_h, d, mask=rows < T)


@_jit
def _bwd_kernel(
    Q, K, V, Bias, BiasStart, CuQ, CuK, DO, Lse, Delta, DQ, DK, DV, DBias,
    # strides (DQ, Delta and DBias are contiguous fp32 buffers made by the launcher)
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sb_t, sb_h,
    sg_t, sg_h, sg_d, sl_t, sl_h, sdl_t, sdq_t, sdq_h, sdk_t, sdk_h, sdv_t, sdv_h, sdb_t, sdb_h,
    # sizes
    D, DVN, scale,
    # meta-parameters
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_PER_HEAD: tl.constexpr, NEED_DBIAS: tl.constexpr,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    pid_n = tl.program_id(0)
    seg = tl.program_id(1)
    hk = tl.program_id(2)
    q0 = tl.load(CuQ + seg)
    lq = (tl.load(CuQ + seg + 1) - q0).to(tl.int32)
    k0 = tl.load(CuK + seg)
    lk = (tl.load(CuK + seg + 1) - k0).to(tl.int32)
    start_n = pid_n * BLOCK_N
    if start_n >= lk:
        return
    # 64-bit scalar bases, 32-bit offsets inside the segment, as in the forward
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = offs_n < lk
    d_ok = offs_d < D
    dv_ok = offs_dv < DVN
    kb = tl.load(K + k0 * sk_t + hk * sk_h + offs_n[:, None] * sk_t + offs_d[None, :] * sk_d,
                 mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    vb = tl.load(V + k0 * sv_t + hk * sv_h + offs_n[:, None] * sv_t + offs_dv[None, :] * sv_d,
                 mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    if HAS_BIAS:
        b0 = tl.load(BiasStart + seg)
    lo = 0
    if CAUSAL:  # queries before this key block see none of it
        lo = (start_n // BLOCK_M) * BLOCK_M
    for start_m in range(lo, lq, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < lq
        vis = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            vis = vis & (offs_n[None, :] <= offs_m[:, None])
        if HAS_BIAS:
            b_off = offs_m[:, None] * lk + offs_n[None, :]
        if NEED_DBIAS and not BIAS_PER_HEAD:
            ds_sum = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for g in range(GROUP):
            h = hk * GROUP + g
            q = tl.load(Q + q0 * sq_t + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
                        mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            do = tl.load(DO + q0 * sg_t + h * sg_h + offs_m[:, None] * sg_t + offs_dv[None, :] * sg_d,
                         mask=m_ok[:, None] & dv_ok[None, :], other=0.0)
            lse = tl.load(Lse + q0 * sl_t + h * sl_h + offs_m * sl_t, mask=m_ok, other=float("inf"))
            # a row with no visible key may carry lse = -inf: +inf gives it p = 0 without nan
            lse = tl.where(lse == float("-inf"), float("inf"), lse)
            delta = tl.load(Delta + q0 * sdl_t + h + offs_m * sdl_t, mask=m_ok, other=0.0)
            s = _dot(q, tl.trans(kb), IEEE) * scale
            if HAS_BIAS:
                bias = tl.load(Bias + b0 * sb_t + (h * BIAS_PER_HEAD) * sb_h + b_off * sb_t, mask=vis, other=0.0)
                s += bias.to(tl.float32)
            p = tl.where(vis, tl.exp(s - lse[:, None]), 0.0)
            dv += _dot(tl.trans(p.to(do.dtype)), do, IEEE)
            dp = _dot(do, tl.trans(vb), IEEE)
            ds = p * (dp - delta[:, None])
            dk += _dot(tl.trans(ds.to(q.dtype)), q, IEEE)
            dq = _dot(ds.to(kb.dtype), kb, IEEE) * scale
            tl.atomic_add(DQ + q0 * sdq_t + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :], dq,
                          mask=m_ok[:, None] & d_ok[None, :])
            if NEED_DBIAS:
                if BIAS_PER_HEAD:
                    tl.atomic_add(DBias + b0 * sdb_t + h * sdb_h + b_off * sdb_t, ds, mask=vis)
                else:
                    ds_sum += ds
        if NEED_DBIAS and not BIAS_PER_HEAD:
            tl.atomic_add(DBias + b0 * sdb_t + b_off * sdb_t, ds_sum, mask=vis)
    dk = dk * scale
    tl.store(DK + k0 * sdk_t + hk * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & d_ok[None, :])
    tl.store(DV + k0 * sdv_t + hk * sdv_h + offs_n[:, None] * sdv_t + offs_dv[None, :], dv.to(DV.dtype.element_ty),
             mask=n_ok[:, None] & dv_ok[None, :])


# ----------------------------------------------------------------------------- launchers

def _pow2(n: int) -> int:
    # tl.dot wants every block dim >= 16; padded columns are masked
    return max(16, triton.next_power_of_2(int(n)))


def _check(op, q, k, v, cu_q, cu_k, bias, bias_start, keep, dropout_p):
    if keep is not None or dropout_p:
        raise ValueError(f"{op}(): expected no dropout (keep=None, dropout_p=0), got dropout_p={dropout_p}")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{op}(): expected q, k, v of shape (T, H, D), got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}(): expected q, k, v of one dtype among {_DTYPES}, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    hq, hk = q.shape[1], k.shape[1]
    if hk == 0 or hq % hk or v.shape[1] != hk or k.shape[0] != v.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"{op}(): expected k, v of shape (Tk, Hk, D|Dv) with Hq % Hk == 0 and q's D, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[2] > _MAX_HEAD or v.shape[2] > _MAX_HEAD:
        raise ValueError(f"{op}(): expected head sizes <= {_MAX_HEAD}, got {q.shape[2]} and {v.shape[2]}")
    if cu_q.dim() != 1 or cu_q.shape != cu_k.shape or cu_q.shape[0] < 1:
        raise ValueError(f"{op}(): expected cu_q, cu_k of one shape (N+1,), got {tuple(cu_q.shape)}, "
                         f"{tuple(cu_k.shape)}")
    if (bias is None) != (bias_start is None):
        raise ValueError(f"{op}(): expected bias and bias_start together, got only one of them")
    if bias is not None:
        if bias.dim() != 2 or bias.shape[1] not in (1, hq) or bias_start.shape != (cu_q.shape[0] - 1,):
            raise ValueError(f"{op}(): expected bias (Tb, 1 or Hq={hq}) and bias_start (N,), got "
                             f"{tuple(bias.shape)} and {tuple(bias_start.shape)}")
        if not bias.is_floating_point():
            raise TypeError(f"{op}(): expected a floating-point bias, got {bias.dtype}")


# Tile tables: (BLOCK_M, BLOCK_N, num_warps) by (half or float32, head size <= 64 or <= 128). No GPU
# timed them yet; they are the largest tiles that compile for sm_90 (ptxas, with bias, causal and
# dbias on) without register spills, e.g. 246 registers / no stack for the half forward at D = 64,
# where (64, 64, 4 warps) spilled 280 bytes. Float32 runs its dots in full precision (FMA, not tf32),
# which needs smaller tiles; the float32 backward still spills (64 bytes at D = 64, 8 at D = 128).
_FWD_TILES = {(True, 64): (64, 64, 8), (True, 128): (64, 64, 8), (False, 64): (64, 32, 8), (False, 128): (64, 32, 8)}
_BWD_TILES = {(True, 64): (32, 64, 8), (True, 128): (16, 64, 8), (False, 64): (32, 32, 8), (False, 128): (16, 16, 8)}


def _tiles(table, d, dtype):
    return table[(dtype != torch.float32, 64 if d <= 64 else 128)]


def _check_offsets(op, max_q, max_k, q_like, k_like, bias):
    """The kernels index inside a segment with 32-bit offsets (NOTE in ``_fwd_kernel``)."""
    def span(t, rows):
        return rows * t.stride(0) + sum(n * s for n, s in zip(t.shape[1:], t.stride()[1:]))

    ext = [span(t, max_q) for t in q_like] + [span(t, max_k) for t in k_like]
    if bias is not None:
        ext.append(span(bias, max_q * max_k))
    if max(ext) >= 2**31:
        raise ValueError(f"{op}(): expected segments whose rows span < 2**31 elements, got max_q={max_q}, "
                         f"max_k={max_k} with row strides {[t.stride(0) for t in (*q_like, *k_like)]}")


def attention_triton(q, k, v, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None, causal=False, scale=None,
                     *, keep=None, dropout_p=0.0, block_m=None, block_n=None):
    """The forward of NOTE [ Varlen attention contract ] in one launch: ``(out, lse)``, ``out
    (Tq, Hq, Dv)`` in q's dtype, ``lse (Tq, Hq)`` float32 (-inf where a query sees no key).
    ``max_q``/``max_k`` must bound the segment lengths (they size the grid). ``block_m``/``block_n``
    override the tile (tests use small tiles to cover several blocks per segment)."""
    op = "attention_triton"
    _require_triton(op)
    _check(op, q, k, v, cu_q, cu_k, bias, bias_start, keep, dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    tq, hq, d = q.shape
    dv = v.shape[-1]
    n = cu_q.shape[0] - 1
    out = q.new_zeros(tq, hq, dv)
    lse = torch.full((tq, hq), float("-inf"), dtype=torch.float32, device=q.device)
    if n == 0 or max_q == 0 or max_k == 0 or hq == 0:
        return out, lse  # no query sees a key: zero rows, as the contract asks
    _check_offsets(op, max_q, max_k, (q, out, lse.unsqueeze(-1)), (k, v), bias)
    bm, bn, warps = _tiles(_FWD_TILES, max(d, dv), q.dtype)
    bm, bn = block_m or bm, block_n or bn
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    has_bias = bias is not None
    bias_t = bias if has_bias else q  # a dummy pointer the kernel never reads
    bstart = bias_start.contiguous() if has_bias else cu_q
    sb = bias.stride() if has_bias else (0, 0)
    grid = (triton.cdiv(max_q, bm), n, hq)
    _launch(
        _fwd_kernel, grid,
        q, k, v, bias_t, bstart, cu_q, cu_k, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *sb, *out.stride(), *lse.stride(),
        d, dv, scale,
        GROUP=hq // k.shape[1], HAS_BIAS=has_bias, BIAS_PER_HEAD=int(has_bias and bias.shape[1] == hq and hq > 1),
        CAUSAL=bool(causal), IEEE=q.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv), num_warps=warps,
    )
    return out, lse


def attention_triton_backward(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None,
                              causal=False, scale=None, need_dbias=False, *, keep=None, dropout_p=0.0,
                              block_m=None, block_n=None):
    """``(dq, dk, dv, dbias)`` of ``attention_triton`` (dbias None unless ``need_dbias``; summed over
    the segments that share a block and over heads when ``Hb = 1``). ``lse`` is the forward's."""
    op = "attention_triton_backward"
    _require_triton(op)
    _check(op, q, k, v, cu_q, cu_k, bias, bias_start, keep, dropout_p)
    if need_dbias and bias is None:
        raise ValueError(f"{op}(): expected a bias when need_dbias=True, got None")
    want = (q.shape[0], q.shape[1], v.shape[2])
    if tuple(grad.shape) != want or tuple(out.shape) != want or tuple(lse.shape) != want[:2]:
        raise ValueError(f"{op}(): expected grad and out of shape {want} and lse of shape {want[:2]}, got "
                         f"{tuple(grad.shape)}, {tuple(out.shape)} and {tuple(lse.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    tq, hq, d = q.shape
    tk, hk, dv = v.shape
    n = cu_q.shape[0] - 1
    # fp32 accumulators: dq and dbias take atomic adds from several programs
    dq = torch.zeros(tq, hq, d, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dvv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    dbias = torch.zeros(bias.shape, dtype=torch.float32, device=q.device) if need_dbias else None
    if n == 0 or max_q == 0 or max_k == 0 or hq == 0 or tq == 0:
        return dq.to(q.dtype), dk, dvv, None if dbias is None else dbias.to(bias.dtype)
    delta = torch.empty(tq, hq, dtype=torch.float32, device=q.device)
    _launch(
        _delta_kernel, (triton.cdiv(tq, 64), hq),
        out, grad, delta, tq, *out.stride(), *grad.stride(), *delta.stride(), dv,
        BLOCK_T=64, BLOCK_DV=_pow2(dv),
    )
    _check_offsets(op, max_q, max_k, (q, grad, dq, lse.unsqueeze(-1)), (k, v, dk), bias)
    bm, bn, warps = _tiles(_BWD_TILES, max(d, dv), q.dtype)
    bm, bn = block_m or bm, block_n or bn
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    has_bias = bias is not None
    bias_t = bias if has_bias else q
    bstart = bias_start.contiguous() if has_bias else cu_q
    sb = bias.stride() if has_bias else (0, 0)
    dbias_t = dbias if need_dbias else dq
    sdb = dbias.stride() if need_dbias else (0, 0)
    grid = (triton.cdiv(max_k, bn), n, hk)
    _launch(
        _bwd_kernel, grid,
        q, k, v, bias_t, bstart, cu_q, cu_k, grad, lse, delta, dq, dk, dvv, dbias_t,
        *q.stride(), *k.stride(), *v.stride(), *sb, *grad.stride(), *lse.stride(), delta.stride(0),
        dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1), dvv.stride(0), dvv.stride(1), *sdb,
        d, dv, scale,
        GROUP=hq // hk, HAS_BIAS=has_bias, BIAS_PER_HEAD=int(has_bias and bias.shape[1] == hq and hq > 1),
        NEED_DBIAS=bool(need_dbias), CAUSAL=bool(causal), IEEE=q.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv), num_warps=warps,
    )
    return dq.to(q.dtype), dk, dvv, None if dbias is None else dbias.to(bias.dtype)
