"""Which implementation a structural op runs: its Triton kernel or its pure-torch reference.

The rule is one predicate, ``use_triton(t)``: Triton on CUDA tensors when triton is importable,
the reference elsewhere. ``triton_kernels(True)`` forces the Triton kernels (tests run them on CPU
tensors under ``TRITON_INTERPRET=1``); ``triton_kernels(False)`` forces the references (to compare
the two on a GPU). The choice is read when an op is called, or traced under ``torch.compile``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from typing import Iterator, Optional

import torch

__all__ = ["use_triton", "triton_kernels", "has_triton"]

_FORCED: Optional[bool] = None


@functools.lru_cache(maxsize=None)
def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(t: torch.Tensor) -> bool:
    """Whether a structural op on ``t`` runs its Triton kernel."""
    if _FORCED is not None:
        return _FORCED
    return t.is_cuda and has_triton()


@contextlib.contextmanager
def triton_kernels(enabled: bool = True) -> Iterator[None]:
    """Force the Triton kernels on (or off) for the structural ops inside the block."""
    global _FORCED
    if enabled and not has_triton():
        raise RuntimeError("triton_kernels(True): triton is not installed")
    prev, _FORCED = _FORCED, bool(enabled)
    try:
        yield
    finally:
        _FORCED = prev
