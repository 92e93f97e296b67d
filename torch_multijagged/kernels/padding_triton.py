"""Triton kernels for jagged ↔ padded conversion (``kernels/reference.py``'s ``to_padded_rows`` /
``from_padded_rows`` are the twins and the test oracle).

NOTE [ Padded cells and packed rows ]

Values ``(T, *F)`` hold the cells of a partition with R ragged dims: sample i's rows start at
``o_i`` and row ``o_i + Σ_k a_k Π_{l>k} n_{i,l}`` holds ragged coordinate ``(a_1..a_R)``
(row-major; NOTE [ Packed-row partition ] in ``structure.py``). The padded tensor
``(B, M_1..M_R, *F)`` holds the same coordinate at flat cell ``c = ((i·M_1 + a_1)·M_2 + a_2)…``.

Both kernels walk the padded *cells*, one program per block of cells × block of features:

* decode ``c`` into ``(i, a_1..a_R)`` with R divisions by the scalar ``M_k`` (innermost first);
* the cell is real iff ``a_k < n_{i,k}`` for every k (``n`` from the (B, R) sizes; a sample with
  a zero extent has no real cell, and ``M_k`` may exceed every ``n_{i,k}``, as ``output_size``
  asks);
* its row is ``o_i + (((a_1·n_{i,2} + a_2)·n_{i,3} + a_3)…)`` (Horner over the same sum).

No row → sample search (``searchsorted``) is needed in either direction. ``to_padded`` writes
every cell once (the row's value or the padding): one pass, no separate fill. ``from_padded``
reads the real cells and writes each row exactly once (every row is the image of one real cell),
so its output needs no initialisation; pad cells cost an index computation only. Each is the
other's backward (with padding 0). R ≤ 4 (the maxes travel as scalar arguments); the launchers
refuse more and the dispatcher (``compile/triton_pair.py``) falls back to the reference.

Triton is imported guarded so the package imports without it; the launchers raise then.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton, jit as _jit, require_triton as _require_triton, launch as _launch, numel as _numel  # noqa: F401

__all__ = ["to_padded_triton", "from_padded_triton", "MAX_RAGGED", "DTYPES"]

MAX_RAGGED = 4
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@_jit
def _padded_kernel(
    Values, Padded, Offsets, Sizes, Pad,
    cells, F, M1, M2, M3, M4,
    # strides: values (row, feature), padded (cell, feature), sizes (sample, ragged dim)
    sv_t, sv_f, sp_c, sp_f, ss_b, ss_r,
    padding,
    R: tl.constexpr, TO_PADDED: tl.constexpr, PAD_FROM_PTR: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_F: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    c_ok = c < cells
    f_ok = f < F
    # decode the cell, innermost ragged dim first (NOTE [ Padded cells and packed rows ])
    rest = c
    a1 = c * 0
    a2 = a1
    a3 = a1
    a4 = a1
    if R >= 4:
        a4 = rest % M4
        rest = rest // M4
    if R >= 3:
        a3 = rest % M3
        rest = rest // M3
    if R >= 2:
        a2 = rest % M2
        rest = rest // M2
    if R >= 1:
        a1 = rest % M1
        rest = rest // M1
    i = tl.where(c_ok, rest, 0)
    ok = c_ok
    local = c * 0
    if R >= 1:
        n1 = tl.load(Sizes + i * ss_b, mask=c_ok, other=0)
        ok = ok & (a1 < n1)
        local = a1
    if R >= 2:
        n2 = tl.load(Sizes + i * ss_b + ss_r, mask=c_ok, other=0)
        ok = ok & (a2 < n2)
        local = local * n2 + a2
    if R >= 3:
        n3 = tl.load(Sizes + i * ss_b + 2 * ss_r, mask=c_ok, other=0)
        ok = ok & (a3 < n3)
        local = local * n3 + a3
    if R >= 4:
        n4 = tl.load(Sizes + i * ss_b + 3 * ss_r, mask=c_ok, other=0)
        ok = ok & (a4 < n4)
        local = local * n4 + a4
    row = tl.load(Offsets + i, mask=ok, other=0) + local
    v_ptr = Values + row[:, None] * sv_t + f[None, :] * sv_f
    p_ptr = Padded + c[:, None] * sp_c + f[None, :] * sp_f
    real = ok[:, None] & f_ok[None, :]
    if TO_PADDED:
        v = tl.load(v_ptr, mask=real, other=0.0)
        if PAD_FROM_PTR:  # float64: a Python float argument would travel as float32
            pad = tl.load(Pad)
        else:
            pad = padding
        v = tl.where(real, v, pad)
        tl.store(p_ptr, v.to(Padded.dtype.element_ty), mask=c_ok[:, None] & f_ok[None, :])
    else:
        v = tl.load(p_ptr, mask=real, other=0.0)
        tl.store(v_ptr, v, mask=real)


# ----------------------------------------------------------------------------- launchers


def _blocks(f: int) -> tuple[int, int]:
    # features along the fast axis (coalesced rows), ~2K elements per program
    bf = min(128, triton.next_power_of_2(max(int(f), 1)))
    return max(1, 2048 // bf), bf


def _check(op, t, offsets, sizes, r):
    if t.dtype not in DTYPES:
        raise TypeError(f"{op}(): expected values of a dtype among {DTYPES}, got {t.dtype}")
    if offsets.dim() != 1 or sizes.dim() != 2 or sizes.shape[0] != offsets.shape[0] - 1:
        raise ValueError(f"{op}(): expected offsets (B+1,) and sizes (B, R), got {tuple(offsets.shape)} and "
                         f"{tuple(sizes.shape)}")
    if r > MAX_RAGGED:
        raise ValueError(f"{op}(): expected at most {MAX_RAGGED} ragged dims, got {r}")


def _run(values2, padded2, offsets, sizes, maxes, padding, to_padded, cells):
    r = len(maxes)
    f = values2.shape[1]
    if cells == 0 or f == 0:
        return
    pad_ptr = values2.new_full((1,), padding) if to_padded and values2.dtype == torch.float64 else offsets
    ms = [int(m) if not isinstance(m, torch.SymInt) else m for m in maxes] + [1] * (MAX_RAGGED - r)
    bc, bf = _blocks(f)
    grid = (triton.cdiv(cells, bc), triton.cdiv(f, bf))
    _launch(
        _padded_kernel, grid,
        values2, padded2, offsets, sizes, pad_ptr,
        cells, f, *ms,
        values2.stride(0), values2.stride(1), padded2.stride(0), padded2.stride(1), sizes.stride(0), sizes.stride(1),
        float(padding),
        R=r, TO_PADDED=to_padded, PAD_FROM_PTR=to_padded and values2.dtype == torch.float64,
        BLOCK_C=bc, BLOCK_F=bf,
    )


def to_padded_triton(values: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, maxes, padding: float):
    """``(B, *maxes, *F)`` padded copy of ``values`` ``(T, *F)``: the cells of a partition with
    row offsets ``offsets`` (B+1,) and per-sample extents ``sizes`` (B, R); ``maxes[k]`` must be
    at least every ``sizes[:, k]``. Cells outside a sample's extents hold ``padding``."""
    op = "to_padded_triton"
    _require_triton(op)
    r = len(maxes)
    _check(op, values, offsets, sizes, r)
    b = offsets.shape[0] - 1
    static = values.shape[1:]
    f = _numel(static)
    out = values.new_empty((b, *maxes, *static))
    cells = _numel((b, *maxes))
    _run(values.reshape(values.shape[0], f), out.view(cells, f), offsets.contiguous(), sizes, maxes, padding, True,
         cells)
    return out


def from_padded_triton(padded: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, rows):
    """``(rows, *F)`` packed rows of ``padded`` ``(B, M_1..M_R, *F)`` (R = ``sizes.shape[1]``): the
    inverse of ``to_padded_triton``; pad cells are not read."""
    op = "from_padded_triton"
    _require_triton(op)
    r = sizes.shape[1] if sizes.dim() == 2 else -1
    _check(op, padded, offsets, sizes, r)
    if padded.dim() < 1 + r or padded.shape[0] != offsets.shape[0] - 1:
        raise ValueError(f"{op}(): expected padded of shape (B={offsets.shape[0] - 1}, M_1..M_{r}, *F), got "
                         f"{tuple(padded.shape)}")
    maxes = padded.shape[1:1 + r]
    static = padded.shape[1 + r:]
    f = _numel(static)
    cells = _numel(padded.shape[:1 + r])
    out = padded.new_empty((rows, *static))
    _run(out.view(rows, f), padded.reshape(cells, f), offsets.contiguous(), sizes, maxes, 0.0, False, cells)
    return out
