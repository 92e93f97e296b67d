"""``multijagged::segment_reduce_triton``, ``segment_softmax_triton`` and
``segment_softmax_backward_triton``: the Triton kernels of ``kernels/segment_triton.py`` (NOTE
[ Segment kernels ]) as ``torch.library.triton_op`` ops, so that ``torch.compile`` sees the
launches (Inductor schedules them; no graph break).

Imported lazily by the dispatcher (``compile/segment.py``) the first time it picks a kernel:
registering a triton_op imports triton (~0.5 s), which the CPU path never needs.

Every op has an autograd formula written with differentiable ops (these ops, ``index_select``
and pointwise math), so a direct call differentiates to any order:

* ``segment_reduce_triton``: the output gradient gathered to the input rows (``g = grad[index]``)
  times the local derivative: 1 (sum), 1/n (mean), ``hit / Σ hit`` (amax/amin: ties share the
  gradient evenly, as dense ``amax``), ``exp(x - result)`` (logsumexp); ``empty`` and the index
  get none;
* ``segment_softmax_triton``: ``segment_softmax_backward_triton``;
* ``segment_softmax_backward_triton`` (``gi = y·(g - Σ g·y)``; log: ``g - exp(y)·Σ g``):
  ``dg = y·(gg - Σ gg·y)`` (itself), ``dy = gg·(g - Σ g·y) - g·Σ gg·y``; log: ``dg = gg - Σ gg·exp(y)``,
  ``dy = -gg·exp(y)·Σ g`` (Σ over the segment, gathered back to the rows).

Under ``TRITON_INTERPRET=1`` the ops run eagerly on CPU tensors (``wrap_triton`` hands back the
interpreted kernel), but not under fake tensors: the interpreter would read their data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import segment_triton as kt
from .library import _no_zero_fill

__all__ = ["segment_reduce_triton", "segment_softmax_triton", "segment_softmax_backward_triton"]

mj = torch.ops.multijagged


@torch.library.triton_op("multijagged::segment_reduce_triton", mutates_args=())
def segment_reduce_triton(values: Tensor, index: Tensor, out_rows: int, reduce: str, empty: float) -> Tensor:
    return kt.segment_reduce_triton(values, index, out_rows, reduce, empty)


@torch.library.triton_op("multijagged::segment_softmax_triton", mutates_args=())
def segment_softmax_triton(values: Tensor, index: Tensor, out_rows: int, log: bool) -> Tensor:
    return kt.segment_softmax_triton(values, index, out_rows, log)


@torch.library.triton_op("multijagged::segment_softmax_backward_triton", mutates_args=())
def segment_softmax_backward_triton(grad: Tensor, out: Tensor, index: Tensor, out_rows: int, log: bool) -> Tensor:
    return kt.segment_softmax_backward_triton(grad, out, index, out_rows, log)


def _rows_sum(t: Tensor, index: Tensor, out_rows) -> Tensor:
    """Σ of ``t`` over each row's segment, gathered back to the rows (differentiable)."""
    return mj.segment_reduce_triton(t, index, out_rows, "sum", 0.0).index_select(0, index)


def _bcast(n: Tensor, like: Tensor) -> Tensor:
    return n.reshape(-1, *([1] * (like.dim() - 1)))


# ----------------------------------------------------------------------------- segment_reduce
def _reduce_setup(ctx, inputs, output):
    values, index, out_rows, reduce, _empty = inputs
    _no_zero_fill(ctx)
    local = reduce in ("amax", "amin", "logsumexp")
    ctx.save_for_backward(values if local else None, index, output if local else None)
    ctx.args = (out_rows, reduce)


def _reduce_backward(ctx, grad):
    if grad is None or not ctx.needs_input_grad[0]:
        return None, None, None, None, None
    values, index, out = ctx.saved_tensors
    out_rows, reduce = ctx.args
    g = grad.index_select(0, index)
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        ones = index.new_ones(index.shape, dtype=grad.dtype)
        n = torch.zeros(out_rows, dtype=grad.dtype, device=grad.device).index_add(0, index, ones)
        gi = g / _bcast(n.index_select(0, index), g)
    elif reduce in ("amax", "amin"):
        hit = (values == out.index_select(0, index)).to(values.dtype)
        gi = g * hit / _rows_sum(hit, index, out_rows)
    elif reduce == "logsumexp":
        gi = g * (values - out.index_select(0, index)).exp()
    else:  # the kernel rejected it in forward already
        raise ValueError(f"segment_reduce_triton(): expected reduce in {kt.KINDS}, got {reduce!r}")
    return gi, None, None, None, None


segment_reduce_triton.register_autograd(_reduce_backward, setup_context=_reduce_setup)


# ----------------------------------------------------------------------------- segment_softmax
def _softmax_setup(ctx, inputs, output):
    _values, index, out_rows, log = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(index, output)
    ctx.args = (out_rows, log)


def _softmax_backward(ctx, grad):
    if grad is None or not ctx.needs_input_grad[0]:
        return None, None, None, None
    index, out = ctx.saved_tensors
    out_rows, log = ctx.args
    return mj.segment_softmax_backward_triton(grad, out, index, out_rows, log), None, None, None


segment_softmax_triton.register_autograd(_softmax_backward, setup_context=_softmax_setup)


def _softmax_bwd_setup(ctx, inputs, output):
    grad, out, index, out_rows, log = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, out, index)
    ctx.args = (out_rows, log)


def _softmax_double_backward(ctx, gg):
    if gg is None:
        return None, None, None, None, None
    g, y, index = ctx.saved_tensors
    rows, log = ctx.args
    need_g, need_y = ctx.needs_input_grad[:2]
    dg = dy = None
    if log:
        ey = y.exp()
        if need_g:
            dg = gg - _rows_sum(gg * ey, index, rows)
        if need_y:
            dy = -gg * ey * _rows_sum(g, index, rows)
    else:
        if need_g:
            dg = mj.segment_softmax_backward_triton(gg, y, index, rows, False)
        if need_y:
            dy = gg * (g - _rows_sum(g * y, index, rows)) - g * _rows_sum(gg * y, index, rows)
    return dg, dy, None, None, None


segment_softmax_backward_triton.register_autograd(_softmax_double_backward, setup_context=_softmax_bwd_setup)
