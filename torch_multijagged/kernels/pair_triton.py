"""Triton kernels for pair broadcast: ``out[r] = left[li[r]] ∘ right[ri[r]]`` over packed pair
cells, and the same sum fused with the LayerNorm that usually follows it
(``kernels/reference.py``'s ``pair_combine`` / ``pair_add_layer_norm`` are the twins and the test
oracle).

NOTE [ Pair broadcast kernels ]

A pair ``(B, j0, j1, C)`` built from singles ``(B, j0, C)`` and ``(B, j1, C)`` has one packed row
per cell ``(i, a, b)``; the row maps ``li``/``ri`` ((T,) int64, ``kernels/reference.row_map``
cached by ``ops/_common.map_to_sub``) give the single rows that cell reads. So the broadcast is a
gather-gather-combine, and the kernels do exactly that in one pass, one program per block of
rows × block of features (``left``/``right`` flattened to ``(L, F)``/``(R, F)``, any strides):
the unfused path materialises both gathers first (three passes over ``T·F`` elements, two of
them written). Half inputs combine in float32 and round once, as torch's pointwise ops do.

The backward is the gather's adjoint: ``grad_left = Σ_{r: li[r] = l} grad[r]`` (times
``right[ri[r]]`` for mul), ``grad_right`` likewise over ``ri`` (negated for sub). ``li`` is sorted
for the usual left operand but ``ri`` strides across the pair, so both are scattered with atomic
adds into float32 (float64 for float64) accumulators, cast at the end.

The fused LayerNorm normalises ``x = left[li] + right[ri]`` over the last dim ``C``, with the
operands viewed as ``(L, S, C)`` (``S`` the product of the static dims in between; the output
row ``n = t·S + s``). ``x`` is rounded to the inputs' dtype before the statistics, as the unfused
add would round it, and is never stored: the backward recomputes it from ``left``, ``right`` and
the saved ``mean``/``rstd``, then scatters ``dx`` to both operands as above. ``dweight``/``dbias``
are summed per program into a ``(programs, C)`` buffer (no contended atomics) and reduced by torch.

Triton is imported guarded so the package imports without it; the launchers raise then.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton, jit as _jit, require_triton as _require_triton, launch as _launch, numel as _numel  # noqa: F401

__all__ = ["pair_combine_triton", "pair_combine_triton_backward", "pair_add_layer_norm_triton",
           "pair_add_layer_norm_triton_backward", "OPS", "DTYPES", "MAX_LN_WIDTH"]

OPS = ("add", "sub", "mul")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_LN_WIDTH = 8192  # one row of the fused LayerNorm is one block
_LN_PROGRAMS = 1024  # cap on the backward's programs (each loops over row tiles)


# ----------------------------------------------------------------------------- kernels
@_jit
def _pair_fwd_kernel(
    Left, Right, Li, Ri, Out, T, F,
    sl_t, sl_f, sr_t, sr_f, so_t, so_f,
    OP: tl.constexpr, WIDE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    t_ok = t < T
    m = t_ok[:, None] & (f < F)[None, :]
    li = tl.load(Li + t, mask=t_ok, other=0)
    ri = tl.load(Ri + t, mask=t_ok, other=0)
    a = tl.load(Left + li[:, None] * sl_t + f[None, :] * sl_f, mask=m, other=0.0)
    b = tl.load(Right + ri[:, None] * sr_t + f[None, :] * sr_f, mask=m, other=0.0)
    if not WIDE:  # half and float32 combine in float32 (torch's opmath), rounding once
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if OP == 0:
        o = a + b
    elif OP == 1:
        o = a - b
    else:
        o = a * b
    tl.store(Out + t[:, None] * so_t + f[None, :] * so_f, o.to(Out.dtype.element_ty), mask=m)


@_jit
def _pair_bwd_kernel(
    Grad, Left, Right, Li, Ri, GL, GR, T, F,
    sg_t, sg_f, sl_t, sl_f, sr_t, sr_f,
    OP: tl.constexpr, NEED_L: tl.constexpr, NEED_R: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    t_ok = t < T
    m = t_ok[:, None] & (f < F)[None, :]
    li = tl.load(Li + t, mask=t_ok, other=0)
    ri = tl.load(Ri + t, mask=t_ok, other=0)
    acc = GL.dtype.element_ty
    g = tl.load(Grad + t[:, None] * sg_t + f[None, :] * sg_f, mask=m, other=0.0).to(acc)
    if NEED_L:
        gl = g
        if OP == 2:
            gl = g * tl.load(Right + ri[:, None] * sr_t + f[None, :] * sr_f, mask=m, other=0.0).to(acc)
        # accumulators are contiguous (rows, F)
        tl.atomic_add(GL + li[:, None] * F + f[None, :], gl, mask=m, sem="relaxed")
    if NEED_R:
        if OP == 0:
            gr = g
        elif OP == 1:
            gr = -g
        else:
            gr = g * tl.load(Left + li[:, None] * sl_t + f[None, :] * sl_f, mask=m, other=0.0).to(acc)
        tl.atomic_add(GR + ri[:, None] * F + f[None, :], gr, mask=m, sem="relaxed")


@_jit
def _load_sum(Left, Right, Li, Ri, n, n_ok, c, m, S, sl_t, sl_s, sl_c, sr_t, sr_s, sr_c,
              ROUND: tl.constexpr, ACC: tl.constexpr):
    """Row ``n = t·S + s`` of ``left[li] + right[ri]`` in ``ACC``, rounded to ``ROUND`` first
    (the dtype the unfused add would produce); zero outside ``m``."""
    t = n // S
    s = n - t * S
    li = tl.load(Li + t, mask=n_ok, other=0)
    ri = tl.load(Ri + t, mask=n_ok, other=0)
    a = tl.load(Left + li[:, None] * sl_t + s[:, None] * sl_s + c[None, :] * sl_c, mask=m, other=0.0)
    b = tl.load(Right + ri[:, None] * sr_t + s[:, None] * sr_s + c[None, :] * sr_c, mask=m, other=0.0)
    x = (a.to(ACC) + b.to(ACC)).to(ROUND).to(ACC)
    return tl.where(m, x, 0.0), li, ri, s


@_jit
def _pair_ln_fwd_kernel(
    Left, Right, Li, Ri, W, B, Out, Mean, Rstd, N, S, C,
    sl_t, sl_s, sl_c, sr_t, sr_s, sr_c, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_C)
    n_ok = n < N
    c_ok = c < C
    m = n_ok[:, None] & c_ok[None, :]
    acc = Mean.dtype.element_ty
    x, li, ri, s = _load_sum(Left, Right, Li, Ri, n, n_ok, c, m, S, sl_t, sl_s, sl_c, sr_t, sr_s, sr_c,
                             Left.dtype.element_ty, acc)
    mean = tl.sum(x, 1) / C
    xc = tl.where(m, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / C + eps)
    y = xc * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + c, mask=c_ok, other=0.0).to(acc)[None, :]
    if HAS_B:
        y = y + tl.load(B + c, mask=c_ok, other=0.0).to(acc)[None, :]
    tl.store(Out + n[:, None] * C + c[None, :], y.to(Out.dtype.element_ty), mask=m)
    tl.store(Mean + n, mean, mask=n_ok)
    tl.store(Rstd + n, rstd, mask=n_ok)


@_jit
def _pair_ln_bwd_kernel(
    Grad, Left, Right, Li, Ri, W, Mean, Rstd, GL, GR, DW, DB, N, S, C, tiles, tiles_per_prog,
    sg_n, sg_c, sl_t, sl_s, sl_c, sr_t, sr_s, sr_c,
    HAS_W: tl.constexpr, NEED_X: tl.constexpr, NEED_L: tl.constexpr, NEED_R: tl.constexpr,
    NEED_WB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    c = tl.arange(0, BLOCK_C)
    c_ok = c < C
    acc = Mean.dtype.element_ty
    if HAS_W:
        w = tl.load(W + c, mask=c_ok, other=0.0).to(acc)
    dw = tl.zeros((BLOCK_C,), acc)
    db = tl.zeros((BLOCK_C,), acc)
    for k in range(tiles_per_prog):
        tile = pid + k * nprog
        n = tile.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = (n < N) & (tile < tiles)
        m = n_ok[:, None] & c_ok[None, :]
        x, li, ri, s = _load_sum(Left, Right, Li, Ri, n, n_ok, c, m, S, sl_t, sl_s, sl_c, sr_t, sr_s, sr_c,
                                 Left.dtype.element_ty, acc)
        mean = tl.load(Mean + n, mask=n_ok, other=0.0)
        rstd = tl.load(Rstd + n, mask=n_ok, other=0.0)
        xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = tl.load(Grad + n[:, None] * sg_n + c[None, :] * sg_c, mask=m, other=0.0).to(acc)
        if NEED_WB:
            dw += tl.sum(g * xhat, 0)
            db += tl.sum(g, 0)
        if NEED_X:
            wg = g
            if HAS_W:
                wg = g * w[None, :]
            c1 = tl.sum(xhat * wg, 1) / C
            c2 = tl.sum(wg, 1) / C
            dx = tl.where(m, (wg - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None], 0.0)
            # accumulators are contiguous (rows, S, C)
            if NEED_L:
                tl.atomic_add(GL + (li[:, None] * S + s[:, None]) * C + c[None, :], dx, mask=m, sem="relaxed")
            if NEED_R:
                tl.atomic_add(GR + (ri[:, None] * S + s[:, None]) * C + c[None, :], dx, mask=m, sem="relaxed")
    if NEED_WB:
        tl.store(DW + pid * C + c, dw, mask=c_ok)
        tl.store(DB + pid * C + c, db, mask=c_ok)


# ----------------------------------------------------------------------------- launchers


def _blocks(f) -> tuple[int, int]:
    # features along the fast axis (coalesced rows), ~2K elements per program
    bf = min(128, triton.next_power_of_2(max(int(f), 1)))
    return max(1, 2048 // bf), bf


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(op, left, right, li, ri):
    if left.dtype not in DTYPES or right.dtype != left.dtype:
        raise TypeError(f"{op}(): expected left and right of one dtype among {DTYPES}, got {left.dtype} and "
                        f"{right.dtype}")
    if left.dim() < 1 or left.shape[1:] != right.shape[1:]:
        raise ValueError(f"{op}(): expected left (L, *F) and right (R, *F) with one F, got {tuple(left.shape)} and "
                         f"{tuple(right.shape)}")
    if li.dim() != 1 or ri.shape != li.shape or li.dtype != torch.int64 or ri.dtype != torch.int64:
        raise ValueError(f"{op}(): expected li and ri int64 of one shape (T,), got {li.dtype} {tuple(li.shape)} "
                         f"and {ri.dtype} {tuple(ri.shape)}")


def _flat(x, f):
    return x.reshape(x.shape[0], f)


def pair_combine_triton(left, right, li, ri, op: str):
    """``left[li] ∘ right[ri]`` (``op`` in ``OPS``): ``(T, *F)`` in the operands' dtype."""
    name = "pair_combine_triton"
    _require_triton(name)
    _check(name, left, right, li, ri)
    if op not in OPS:
        raise ValueError(f"{name}(): expected op in {OPS}, got {op!r}")
    static = left.shape[1:]
    f, t = _numel(static), li.shape[0]
    out = left.new_empty((t, *static))
    if t == 0 or f == 0:
        return out
    l2, r2, o2 = _flat(left, f), _flat(right, f), out.view(t, f)
    bt, bf = _blocks(f)
    _launch(
        _pair_fwd_kernel, (triton.cdiv(t, bt), triton.cdiv(f, bf)),
        l2, r2, li, ri, o2, t, f, *l2.stride(), *r2.stride(), *o2.stride(),
        OP=OPS.index(op), WIDE=left.dtype == torch.float64, BLOCK_T=bt, BLOCK_F=bf,
    )
    return out


def pair_combine_triton_backward(grad, left, right, li, ri, op: str, need_left: bool = True,
                                 need_right: bool = True):
    """``(grad_left, grad_right)`` of ``pair_combine_triton``; None for the one not asked for."""
    name = "pair_combine_triton_backward"
    _require_triton(name)
    _check(name, left, right, li, ri)
    static = left.shape[1:]
    f, t = _numel(static), li.shape[0]
    if tuple(grad.shape) != (t, *static):
        raise ValueError(f"{name}(): expected grad of shape {(t, *static)}, got {tuple(grad.shape)}")
    acc = _acc_dtype(left.dtype)
    gl = torch.zeros((left.shape[0], f), dtype=acc, device=left.device) if need_left else None
    gr = torch.zeros((right.shape[0], f), dtype=acc, device=right.device) if need_right else None
    if t and f and (need_left or need_right):
        l2, r2, g2 = _flat(left, f), _flat(right, f), _flat(grad, f)
        bt, bf = _blocks(f)
        _launch(
            _pair_bwd_kernel, (triton.cdiv(t, bt), triton.cdiv(f, bf)),
            g2, l2, r2, li, ri, gl if need_left else gr, gr if need_right else gl, t, f,
            *g2.stride(), *l2.stride(), *r2.stride(),
            OP=OPS.index(op), NEED_L=need_left, NEED_R=need_right, BLOCK_T=bt, BLOCK_F=bf,
        )
    gl = None if gl is None else gl.to(left.dtype).view(left.shape)
    gr = None if gr is None else gr.to(right.dtype).view(right.shape)
    return gl, gr


def _ln_views(name, left, right, weight, bias):
    if left.dim() < 2:
        raise ValueError(f"{name}(): expected left and right of shape (L, *S, C), got {tuple(left.shape)}")
    c = left.shape[-1]
    if not 1 <= c <= MAX_LN_WIDTH:
        raise ValueError(f"{name}(): expected a last dim of size 1..{MAX_LN_WIDTH}, got {c}")
    for p, pn in ((weight, "weight"), (bias, "bias")):
        if p is not None and tuple(p.shape) != (c,):
            raise ValueError(f"{name}(): expected {pn} of shape ({c},), got {tuple(p.shape)}")
    s = _numel(left.shape[1:-1])
    return left.reshape(left.shape[0], s, c), right.reshape(right.shape[0], s, c), s, c


def _ln_blocks(c) -> tuple[int, int]:
    bc = triton.next_power_of_2(int(c))
    return max(1, min(64, 4096 // bc)), bc


def pair_add_layer_norm_triton(left, right, li, ri, weight=None, bias=None, eps: float = 1e-5):
    """``layer_norm(left[li] + right[ri])`` over the last dim: ``(out, mean, rstd)``, ``out``
    ``(T, *S, C)`` in the operands' dtype, ``mean``/``rstd`` ``(T·S,)`` in float32 (float64 for
    float64 operands), saved for the backward."""
    name = "pair_add_layer_norm_triton"
    _require_triton(name)
    _check(name, left, right, li, ri)
    l3, r3, s, c = _ln_views(name, left, right, weight, bias)
    t = li.shape[0]
    n = t * s
    acc = _acc_dtype(left.dtype)
    out = left.new_empty((t, *left.shape[1:]))
    mean = torch.empty(n, dtype=acc, device=left.device)
    rstd = torch.empty(n, dtype=acc, device=left.device)
    if n:
        bn, bc = _ln_blocks(c)
        _launch(
            _pair_ln_fwd_kernel, (triton.cdiv(n, bn),),
            l3, r3, li, ri, l3 if weight is None else weight, l3 if bias is None else bias, out, mean, rstd,
            n, s, c, *l3.stride(), *r3.stride(), float(eps),
            HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_N=bn, BLOCK_C=bc,
        )
    return out, mean, rstd


def pair_add_layer_norm_triton_backward(grad, left, right, li, ri, weight, mean, rstd, need_left=True,
                                        need_right=True, need_weight=True, need_bias=True):
    """``(grad_left, grad_right, grad_weight, grad_bias)`` of ``pair_add_layer_norm_triton``; None
    for those not asked for. ``grad_bias`` comes in the accumulator dtype (the bias itself is not
    an argument; the op casts it)."""
    name = "pair_add_layer_norm_triton_backward"
    _require_triton(name)
    _check(name, left, right, li, ri)
    l3, r3, s, c = _ln_views(name, left, right, weight, None)
    t = li.shape[0]
    n = t * s
    if tuple(grad.shape) != (t, *left.shape[1:]):
        raise ValueError(f"{name}(): expected grad of shape {(t, *left.shape[1:])}, got {tuple(grad.shape)}")
    acc = _acc_dtype(left.dtype)
    need_weight = need_weight and weight is not None
    need_wb = need_weight or need_bias
    dev = left.device
    gl = torch.zeros((left.shape[0], s, c), dtype=acc, device=dev) if need_left else None
    gr = torch.zeros((right.shape[0], s, c), dtype=acc, device=dev) if need_right else None
    dw = db = None
    if n and (need_left or need_right or need_wb):
        bn, bc = _ln_blocks(c)
        tiles = triton.cdiv(n, bn)
        progs = min(tiles, _LN_PROGRAMS)
        part_w = torch.empty((progs, c), dtype=acc, device=dev) if need_wb else mean
        part_b = torch.empty((progs, c), dtype=acc, device=dev) if need_wb else mean
        g2 = grad.reshape(n, c)
        dummy = mean
        _launch(
            _pair_ln_bwd_kernel, (progs,),
            g2, l3, r3, li, ri, dummy if weight is None else weight, mean, rstd,
            dummy if gl is None else gl, dummy if gr is None else gr, part_w, part_b,
            n, s, c, tiles, triton.cdiv(tiles, progs), *g2.stride(), *l3.stride(), *r3.stride(),
            HAS_W=weight is not None, NEED_X=need_left or need_right, NEED_L=need_left, NEED_R=need_right,
            NEED_WB=need_wb, BLOCK_N=bn, BLOCK_C=bc,
        )
        if need_weight:
            dw = part_w.sum(0).to(weight.dtype)
        if need_bias:
            db = part_b.sum(0)  # the op casts it to bias's dtype
    elif need_wb:
        dw = torch.zeros(c, dtype=weight.dtype, device=dev) if need_weight else None
        db = torch.zeros(c, dtype=acc, device=dev) if need_bias else None
    gl = None if gl is None else gl.to(left.dtype).view(left.shape)
    gr = None if gr is None else gr.to(right.dtype).view(right.shape)
    return gl, gr, dw, db
