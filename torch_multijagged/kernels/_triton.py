"""What every Triton kernel module shares: the guarded import (the package imports without
triton; the launchers raise then), ``jit``, the launch through ``torch.library.wrap_triton``, and
an error naming the op when triton is missing."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the package must import without triton
    triton = tl = None

__all__ = ["triton", "tl", "jit", "launch", "require_triton", "numel"]


def jit(fn):
    # annotations are strings (``from __future__ import annotations``), which triton reads as
    # constexpr markers; without triton the kernels stay plain functions nobody calls
    return triton.jit(fn) if triton is not None else fn


def require_triton(op: str) -> None:
    if triton is None:
        raise RuntimeError(f"{op}(): expected the triton package to be installed, got none")


def launch(kernel, grid, *args, **meta) -> None:
    # inside a triton_op (eager) wrap_triton hands back the kernel itself; under tracing it records
    # the launch for Inductor; under TRITON_INTERPRET=1 it is the interpreted kernel
    import torch

    torch.library.wrap_triton(kernel)[grid](*args, **meta)


def numel(shape) -> int:
    n = 1
    for s in shape:
        n = n * s
    return n
