"""Triton kernel for the per-sample matrix products of square ragged pairs, channels batched
(NOTE [ Pair matmul contract ] in ``kernels/pair_mm.py``; ``pair_matmul_naive`` is the test
oracle, ``pair_matmul_reference`` the CPU path).

NOTE [ Pair matmul kernel ]

One launch serves the whole batch. Program ``(t, b, cb)`` computes the output tile
``rows i ∈ [I, I + BLOCK_I) × columns j ∈ [J, J + BLOCK_J)`` of sample ``b`` for the channels
``[cb·BLOCK_C, (cb + 1)·BLOCK_C)``; ``t`` enumerates the ``⌈max_n/BLOCK_I⌉ × ⌈max_n/BLOCK_J⌉``
tiles of the largest sample, and a program whose tile starts at or past ``n_b`` returns at once
(the grid is sized by ``max_n``, as the varlen attention kernel's is by ``max_q``).

Channels are the packed rows' stride-1 dim, so a program loads ``(BLOCK_C, BLOCK_I, BLOCK_K)``
and ``(BLOCK_C, BLOCK_K, BLOCK_J)`` tiles — contiguous along the channels, so the loads
coalesce — and multiplies them with one *batched* ``tl.dot`` (batch = channels), accumulating in
float32 over ``k`` blocks; ``tl.dot`` wants every dim ≥ 16, so the tiles are ≥ 16 and masked.
Transposes cost nothing: ``X'[i, k]`` is row ``i·n + k`` (or ``k·n + i`` when ``tx``) of the
sample, i.e. the two strides swap. float32 multiplies in full precision
(``input_precision="ieee"``, as the attention kernels): tf32 would cost ~1e-3 relative error.
Rows and channels past ``n_b``/``C`` are masked, so the output (allocated with ``empty``, the
only buffer: O(Σ n_b² · C), never ``B · max_n²``) gets every row written exactly once; no
atomics, deterministic.

Offsets inside a sample are 32-bit (a 64-bit scalar base per sample): the launcher rejects
``max_n² · C ≥ 2³¹`` when it can tell without a guard (always in eager mode). Tiles are not
tuned on a GPU (none was available; ``_TILES`` says what bounds them). Triton is imported
guarded so that the package imports without it; the launcher raises then.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton, jit as _jit, require_triton as _require_triton, launch as _launch  # noqa: F401

__all__ = ["pair_matmul_triton", "DTYPES"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_GRID_Z = 65535  # CUDA's limit on grid dims 1 and 2 (samples, channel blocks)
# (BLOCK_I, BLOCK_J, BLOCK_K, BLOCK_C, num_warps) by dtype. No GPU timed them; they compile for
# sm_90 (ptxas, every tx/ty) without register spills: half 238-255 registers (tensor-core
# mma.sync), float32 (FMA, full precision) 120-154 registers and 64 KiB of shared memory, where its
# 32 × 32 tiles spilled at 4 and 8 warps. Each 3-d pointer tile costs 2 registers per element
# per thread, which is what bounds the tiles.
_TILES = {True: (32, 32, 16, 16, 8), False: (16, 16, 16, 16, 4)}


# ----------------------------------------------------------------------------- kernel
@_jit
def _pair_mm_kernel(
    X, Y, Out, Offsets, Lengths,
    # sizes
    C, TILES_J,
    # meta-parameters
    TX: tl.constexpr, TY: tl.constexpr, IEEE: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_t = tl.program_id(0)
    b = tl.program_id(1)
    pid_c = tl.program_id(2)
    n = tl.load(Lengths + b).to(tl.int32)
    start_i = (pid_t // TILES_J) * BLOCK_I
    start_j = (pid_t % TILES_J) * BLOCK_J
    if (start_i >= n) | (start_j >= n):  # the grid is sized by max_n; shorter samples idle here
        return
    # 64-bit scalar base (the sample's first packed row), 32-bit offsets inside the sample
    base = tl.load(Offsets + b).to(tl.int64) * C
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_i = start_i + tl.arange(0, BLOCK_I)
    offs_j = start_j + tl.arange(0, BLOCK_J)
    offs_k0 = tl.arange(0, BLOCK_K)
    c_ok = (offs_c < C)[:, None, None]
    i_ok = (offs_i < n)[None, :, None]
    j_ok = (offs_j < n)[None, None, :]
    row = n * C  # elements per matrix row of the sample
    # X'[i, k] is the sample's row i·n + k, or k·n + i when transposed: only the strides swap
    if TX:
        sx_i = C
        sx_k = row
    else:
        sx_i = row
        sx_k = C
    if TY:
        sy_k = C
        sy_j = row
    else:
        sy_k = row
        sy_j = C
    x_ptr = X + base + offs_c[:, None, None] + offs_i[None, :, None] * sx_i
    y_ptr = Y + base + offs_c[:, None, None] + offs_j[None, None, :] * sy_j
    acc = tl.zeros((BLOCK_C, BLOCK_I, BLOCK_J), tl.float32)
    for start_k in range(0, n, BLOCK_K):
        offs_k = start_k + offs_k0
        k_ok = offs_k < n
        a = tl.load(x_ptr + offs_k[None, None, :] * sx_k, mask=c_ok & i_ok & k_ok[None, None, :], other=0.0)
        bb = tl.load(y_ptr + offs_k[None, :, None] * sy_k, mask=c_ok & k_ok[None, :, None] & j_ok, other=0.0)
        if IEEE:
            acc = tl.dot(a, bb, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, bb, acc)
    out_ptr = Out + base + offs_c[:, None, None] + offs_i[None, :, None] * row + offs_j[None, None, :] * C
    tl.store(out_ptr, acc.to(Out.dtype.element_ty), mask=c_ok & i_ok & j_ok)


# ----------------------------------------------------------------------------- launcher
def _check(op, x, y, offsets, lengths):
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"{op}(): expected x and y of one shape (T, C), got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype not in DTYPES or y.dtype != x.dtype:
        raise TypeError(f"{op}(): expected x and y of one dtype among {DTYPES}, got {x.dtype} and {y.dtype}")
    if lengths.dim() != 1 or offsets.shape != (lengths.shape[0] + 1,):
        raise ValueError(f"{op}(): expected lengths (B,) and offsets (B + 1,), got {tuple(lengths.shape)} and "
                         f"{tuple(offsets.shape)}")
    if offsets.dtype not in (torch.int32, torch.int64) or lengths.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}(): expected integer offsets and lengths, got {offsets.dtype} and {lengths.dtype}")


def pair_matmul_triton(x, y, offsets, lengths, max_n, tx=False, ty=False, *, tiles=None):
    """NOTE [ Pair matmul contract ] in one launch: ``(T, C)`` in x's dtype. ``max_n`` must bound
    the lengths (it sizes the grid). ``tiles = (BLOCK_I, BLOCK_J, BLOCK_K, BLOCK_C, num_warps)``
    overrides the tile (each block ≥ 16, a power of two)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    op = "pair_matmul_triton"
    _require_triton(op)
    _check(op, x, y, offsets, lengths)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    c = x.shape[1]
    # traced with a symbolic max_n: checked only where no guard is needed (eager: always)
    if statically_known_true(max_n * max_n * c >= 2**31):
        raise ValueError(f"{op}(): expected samples whose n² · C < 2**31 elements, got max_n={max_n}, C={c}")
    bi, bj, bk, bc, warps = tiles or _TILES[x.dtype != torch.float32]
    b = lengths.shape[0]
    tiles_j = triton.cdiv(max_n, bj)
    blocks_c = triton.cdiv(c, bc)
    if statically_known_true(b > _MAX_GRID_Z) or statically_known_true(blocks_c > _MAX_GRID_Z):
        raise ValueError(f"{op}(): expected at most {_MAX_GRID_Z} samples and {_MAX_GRID_Z * bc} channels, "
                         f"got {b} and {c}")
    grid = (triton.cdiv(max_n, bi) * tiles_j, b, blocks_c)
    _launch(
        _pair_mm_kernel, grid,
        x, y, out, offsets.contiguous(), lengths.contiguous(),
        c, tiles_j,
        TX=bool(tx), TY=bool(ty), IEEE=x.dtype == torch.float32, BLOCK_I=bi, BLOCK_J=bj, BLOCK_K=bk, BLOCK_C=bc,
        num_warps=warps,
    )
    return out
