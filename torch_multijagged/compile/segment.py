"""Segment reductions and segment softmax: the one place that picks the Triton kernel or the
pure-torch reference (``kernel_choice.use_triton``). Handlers call these, never the kernels.

The signatures are the references' (``kernels/reference.py``). The Triton ops (NOTE [ Segment
kernels ]) take floating-point values (float16/bfloat16/float32/float64) with an int64 index
and the kinds ``sum``/``mean``/``amax``/``amin``/``logsumexp``; integer and bool values and
``prod`` stay on the reference on every device. This module does not import triton: the ops
are registered (``compile/triton_segment.py``) the first time one is picked.
"""

from __future__ import annotations

import torch

from ..kernels import reference as ref
from .kernel_choice import use_triton

__all__ = ["segment_reduce", "segment_softmax", "segment_softmax_backward"]

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_KINDS = ("sum", "mean", "amax", "amin", "logsumexp")


def _triton(values: torch.Tensor, index: torch.Tensor) -> bool:
    return values.dtype in _FLOAT and index.dtype == torch.int64 and values.dim() >= 1 and use_triton(values)


def _ops():
    from . import triton_segment  # noqa: F401  (registers the ops; imports triton)

    return torch.ops.multijagged


def segment_reduce(values: torch.Tensor, index: torch.Tensor, out_rows, reduce: str, empty=0) -> torch.Tensor:
    """``ref.segment_reduce`` or its Triton twin."""
    # one segment (a reduction over the batch): torch's own reduction spreads the rows over the
    # device; the kernel would walk them in one program per feature block
    one = isinstance(out_rows, int) and out_rows == 1
    if reduce in _KINDS and not one and _triton(values, index):
        return _ops().segment_reduce_triton(values, index, out_rows, reduce, float(empty))
    return ref.segment_reduce(values, index, out_rows, reduce, empty)


def segment_softmax(values: torch.Tensor, index: torch.Tensor, out_rows, log: bool = False) -> torch.Tensor:
    """``ref.segment_softmax`` or its Triton twin."""
    if _triton(values, index):
        return _ops().segment_softmax_triton(values, index, out_rows, bool(log))
    return ref.segment_softmax(values, index, out_rows, log=log)


def segment_softmax_backward(grad: torch.Tensor, out: torch.Tensor, index: torch.Tensor, out_rows,
                             log: bool = False) -> torch.Tensor:
    """``ref.segment_softmax_backward`` or its Triton twin."""
    if grad.dtype == out.dtype and grad.shape == out.shape and _triton(out, index):
        return _ops().segment_softmax_backward_triton(grad, out, index, out_rows, bool(log))
    return ref.segment_softmax_backward(grad, out, index, out_rows, log=log)
