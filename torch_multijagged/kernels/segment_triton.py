"""Triton kernels for segment reductions and segment softmax over packed rows.

NOTE [ Segment kernels ]

The twins are ``segment_reduce`` / ``segment_softmax`` / ``segment_softmax_backward`` in
``kernels/reference.py``: ``values (T, *F)``, ``index (T,)`` int64 naming each row's output row
(segment) in ``[0, out_rows)``. ``index`` is arbitrary: reducing a pair's last ragged dim gives
consecutive runs, reducing its first gives interleaved ones. So every launcher first builds a CSR
plan: ``perm`` = a stable argsort of ``index`` (the member rows of each segment, in row order)
and ``starts`` = ``searchsorted(index[perm], arange(out_rows + 1))`` (segment s owns
``perm[starts[s]:starts[s+1]]``). Both are plain torch ops with static shapes, so the launchers
trace under fake tensors (``torch.compile``) and never read data on the host. An index outside
``[0, out_rows)`` is ignored by the reductions (the reference raises) and leaves its softmax row
unwritten: callers pass maps, not user data.

One program per (segment, block of ``BLOCK_F`` flattened feature columns) loops over the
segment's member rows ``BLOCK_T`` at a time; no atomics, so results are deterministic and
``amax``/``amin`` exact (ties included). Accumulators are float32 (float64 for float64 input);
results are written once in the input dtype. Empty segments are not written: the launcher fills
the output with ``empty`` first (exact in every dtype, which a float32 kernel argument is not).

* reductions ``sum``, ``mean``, ``amax``, ``amin``, ``logsumexp`` (one pass: an online max with
  the running sum rescaled; an infinite max is taken as 0, as the handler's two-pass formula
  does, so ``+inf`` gives ``+inf`` and an all ``-inf`` segment ``-inf``). ``amax``/``amin``
  propagate NaN explicitly (``tl.max`` need not). ``prod`` and integer / bool dtypes stay on the
  reference (the dispatcher in ``compile/segment.py`` decides).
* softmax / log_softmax: pass 1 the online max and sum, pass 2 writes every member row. The max
  is taken as 0 only when it is ``-inf`` (an all ``-inf`` segment then gives NaN, as dense
  softmax does; ``+inf`` gives NaN too).
* softmax backward: pass 1 ``Σ g·y`` (``Σ g`` for log_softmax), pass 2 writes
  ``y·(g - Σ g·y)`` (``g - exp(y)·Σ g``).

Tiles are not tuned on a GPU (none was available; every kernel, dtype and kind compiles for
sm_90 with ptxas, no register spills: 72 registers for the float64 logsumexp, 116 for the float64
softmax backward): ``BLOCK_F`` = the feature width rounded up to a power of two in [16, 128],
``BLOCK_T`` = 2048 / ``BLOCK_F`` rows clamped to [8, 64], 4 warps. A segment is one program's
serial loop, so few long segments run on few programs (the dispatcher sends a single segment, a
reduction over the batch, to torch's own reduction). The plan (one sort) is rebuilt per launch,
not shared between a softmax's forward and backward. Triton is imported guarded so that the
package imports without it; the launchers raise then.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton, jit as _jit, require_triton as _require_triton, launch as _launch  # noqa: F401

__all__ = ["KINDS", "DTYPES", "segment_reduce_triton", "segment_softmax_triton", "segment_softmax_backward_triton"]

KINDS = ("sum", "mean", "amax", "amin", "logsumexp")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_KIND_ID = {k: i for i, k in enumerate(KINDS)}
_MAX_GRID_Y = 65535  # CUDA's limit on grid dim 1 (the feature blocks)


# ----------------------------------------------------------------------------- kernels
@_jit
def _tile(X, Perm, i, end, offs_f, f_ok, F, other, ACC: tl.constexpr, BLOCK_T: tl.constexpr):
    """Member rows ``perm[i : min(i + BLOCK_T, end)]`` of X as a (BLOCK_T, BLOCK_F) ACC tile
    (``other`` outside), their row ids and the tile's mask."""
    offs_t = i + tl.arange(0, BLOCK_T)
    t_ok = offs_t < end
    rows = tl.load(Perm + offs_t, mask=t_ok, other=0)
    ok = t_ok[:, None] & f_ok[None, :]
    ptr = rows[:, None] * F + offs_f[None, :]
    x = tl.load(X + ptr, mask=ok, other=other).to(ACC)
    return x, ptr, ok


@_jit
def _reduce_kernel(
    X, Perm, Starts, Out,
    # sizes
    F,
    # meta-parameters
    KIND: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    start = tl.load(Starts + r)
    end = tl.load(Starts + r + 1)
    # KIND: 0 sum, 1 mean, 2 amax, 3 amin, 4 logsumexp (the order of KINDS)
    if KIND == 2:
        other = float("-inf")
    elif KIND == 3:
        other = float("inf")
    elif KIND == 4:
        other = float("-inf")
    else:
        other = 0.0
    acc = tl.full([BLOCK_F], other, ACC)  # the sum, or the running extreme
    s = tl.zeros([BLOCK_F], ACC)  # logsumexp: Σ exp(x - safe max)
    nan = tl.zeros([BLOCK_F], tl.int32)
    for i in range(start, end, BLOCK_T):
        x, _, _ = _tile(X, Perm, i, end, offs_f, f_ok, F, other, ACC, BLOCK_T)
        if KIND <= 1:
            acc += tl.sum(x, 0)
        elif KIND == 2:
            acc = tl.maximum(acc, tl.max(x, 0))
            nan = nan | tl.max((x != x).to(tl.int32), 0)
        elif KIND == 3:
            acc = tl.minimum(acc, tl.min(x, 0))
            nan = nan | tl.max((x != x).to(tl.int32), 0)
        else:
            m_new = tl.maximum(acc, tl.max(x, 0))
            safe_old = tl.where(tl.abs(acc) == float("inf"), 0.0, acc)
            safe_new = tl.where(tl.abs(m_new) == float("inf"), 0.0, m_new)
            s = s * tl.exp(safe_old - safe_new) + tl.sum(tl.exp(x - safe_new[None, :]), 0)
            acc = m_new
    if KIND == 1:
        acc = acc / (end - start).to(ACC)
    elif KIND == 4:
        acc = tl.log(s) + tl.where(tl.abs(acc) == float("inf"), 0.0, acc)
    elif KIND >= 2:
        acc = tl.where(nan > 0, float("nan"), acc)
    tl.store(Out + r * F + offs_f, acc.to(Out.dtype.element_ty), mask=f_ok & (end > start))


@_jit
def _softmax_kernel(
    X, Perm, Starts, Out,
    # sizes
    F,
    # meta-parameters
    LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    start = tl.load(Starts + r)
    end = tl.load(Starts + r + 1)
    m = tl.full([BLOCK_F], float("-inf"), ACC)
    s = tl.zeros([BLOCK_F], ACC)
    for i in range(start, end, BLOCK_T):
        x, _, _ = _tile(X, Perm, i, end, offs_f, f_ok, F, float("-inf"), ACC, BLOCK_T)
        m_new = tl.maximum(m, tl.max(x, 0))
        # a max of -inf (nothing seen yet, or all -inf) is taken as 0 so exp sees no -inf - -inf
        safe_old = tl.where(m == float("-inf"), 0.0, m)
        safe_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(safe_old - safe_new) + tl.sum(tl.exp(x - safe_new[None, :]), 0)
        m = m_new
    m = tl.where(m == float("-inf"), 0.0, m)
    log_s = tl.log(s)
    for i in range(start, end, BLOCK_T):
        x, ptr, ok = _tile(X, Perm, i, end, offs_f, f_ok, F, 0.0, ACC, BLOCK_T)
        z = x - m[None, :]
        if LOG:
            y = z - log_s[None, :]
        else:
            y = tl.exp(z) / s[None, :]
        tl.store(Out + ptr, y.to(Out.dtype.element_ty), mask=ok)


@_jit
def _softmax_bwd_kernel(
    G, Y, Perm, Starts, Out,
    # sizes
    F,
    # meta-parameters
    LOG: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    start = tl.load(Starts + r)
    end = tl.load(Starts + r + 1)
    acc = tl.zeros([BLOCK_F], ACC)
    for i in range(start, end, BLOCK_T):
        g, _, _ = _tile(G, Perm, i, end, offs_f, f_ok, F, 0.0, ACC, BLOCK_T)
        if LOG:
            acc += tl.sum(g, 0)
        else:
            y, _, _ = _tile(Y, Perm, i, end, offs_f, f_ok, F, 0.0, ACC, BLOCK_T)
            acc += tl.sum(g * y, 0)
    for i in range(start, end, BLOCK_T):
        g, ptr, ok = _tile(G, Perm, i, end, offs_f, f_ok, F, 0.0, ACC, BLOCK_T)
        y, _, _ = _tile(Y, Perm, i, end, offs_f, f_ok, F, 0.0, ACC, BLOCK_T)
        if LOG:
            gi = g - tl.exp(y) * acc[None, :]
        else:
            gi = y * (g - acc[None, :])
        tl.store(Out + ptr, gi.to(Out.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- launchers


def _check(op, values, index, out_rows):
    if values.dtype not in DTYPES:
        raise TypeError(f"{op}(): expected values of a dtype among {DTYPES}, got {values.dtype}")
    if values.dim() < 1 or index.dim() != 1 or index.shape[0] != values.shape[0]:
        raise ValueError(f"{op}(): expected values (T, *F) and index (T,), got {tuple(values.shape)} and "
                         f"{tuple(index.shape)}")
    if index.dtype != torch.int64:
        raise TypeError(f"{op}(): expected an int64 index, got {index.dtype}")
    if out_rows < 0:
        raise ValueError(f"{op}(): expected out_rows >= 0, got {out_rows}")


def _plan(index, out_rows):
    """``(perm, starts)``: NOTE [ Segment kernels ]."""
    sorted_index, perm = torch.sort(index, stable=True)
    bounds = torch.arange(out_rows + 1, device=index.device, dtype=index.dtype)
    return perm, torch.searchsorted(sorted_index, bounds)


def _tiles(width, block_t, block_f):
    bf = block_f or min(128, max(16, triton.next_power_of_2(max(int(width), 1))))
    bt = block_t or min(64, max(8, 2048 // bf))
    return bt, bf


def _flat(t):
    """``(T, *F)`` as a contiguous ``(T, F)`` (an explicit F: reshape(T, -1) is ambiguous at T = 0)."""
    width = 1
    for n in t.shape[1:]:
        width *= n
    return t.contiguous().reshape(t.shape[0], width), width


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _grid(op, out_rows, width, bf):
    blocks = triton.cdiv(width, bf)
    if blocks > _MAX_GRID_Y:
        raise ValueError(f"{op}(): expected at most {_MAX_GRID_Y * bf} feature elements per row, got {width}")
    return (out_rows, blocks)


def segment_reduce_triton(values, index, out_rows, reduce, empty=0.0, *, block_t=None, block_f=None):
    """``segment_reduce`` (reference twin) for ``reduce`` in ``KINDS``: ``(out_rows, *F)`` in
    values' dtype; segments without rows hold ``empty``."""
    op = "segment_reduce_triton"
    _require_triton(op)
    _check(op, values, index, out_rows)
    if reduce not in _KIND_ID:
        raise ValueError(f"{op}(): expected reduce in {KINDS}, got {reduce!r}")
    x, width = _flat(values)
    out = values.new_full((out_rows, width), empty)
    if out_rows == 0 or width == 0:
        return out.reshape(out_rows, *values.shape[1:])
    perm, starts = _plan(index, out_rows)
    bt, bf = _tiles(width, block_t, block_f)
    _launch(_reduce_kernel, _grid(op, out_rows, width, bf), x, perm, starts, out, width,
            KIND=_KIND_ID[reduce], ACC=_acc(values.dtype), BLOCK_T=bt, BLOCK_F=bf)
    return out.reshape(out_rows, *values.shape[1:])


def segment_softmax_triton(values, index, out_rows, log=False, *, block_t=None, block_f=None):
    """``segment_softmax`` (reference twin): softmax (``log``: log_softmax) of the rows sharing a
    segment, ``(T, *F)`` in values' dtype."""
    op = "segment_softmax_triton"
    _require_triton(op)
    _check(op, values, index, out_rows)
    x, width = _flat(values)
    out = torch.empty_like(x)
    if out_rows == 0 or width == 0 or x.shape[0] == 0:
        return out.reshape(values.shape)
    perm, starts = _plan(index, out_rows)
    bt, bf = _tiles(width, block_t, block_f)
    _launch(_softmax_kernel, _grid(op, out_rows, width, bf), x, perm, starts, out, width,
            LOG=bool(log), ACC=_acc(values.dtype), BLOCK_T=bt, BLOCK_F=bf)
    return out.reshape(values.shape)


def segment_softmax_backward_triton(grad, out, index, out_rows, log=False, *, block_t=None, block_f=None):
    """``segment_softmax_backward`` (reference twin): the input gradient of softmax (``log``:
    log_softmax) from the output gradient ``grad`` and the output ``out``, both ``(T, *F)``."""
    op = "segment_softmax_backward_triton"
    _require_triton(op)
    _check(op, out, index, out_rows)
    if grad.shape != out.shape or grad.dtype != out.dtype:
        raise ValueError(f"{op}(): expected grad and out of one shape and dtype, got {tuple(grad.shape)} "
                         f"{grad.dtype} and {tuple(out.shape)} {out.dtype}")
    g, width = _flat(grad)
    y, _ = _flat(out)
    gi = torch.empty_like(y)
    if out_rows == 0 or width == 0 or y.shape[0] == 0:
        return gi.reshape(out.shape)
    perm, starts = _plan(index, out_rows)
    bt, bf = _tiles(width, block_t, block_f)
    _launch(_softmax_bwd_kernel, _grid(op, out_rows, width, bf), g, y, perm, starts, gi, width,
            LOG=bool(log), ACC=_acc(out.dtype), BLOCK_T=bt, BLOCK_F=bf)
    return gi.reshape(out.shape)
