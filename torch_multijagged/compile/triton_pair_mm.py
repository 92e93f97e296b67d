"""``multijagged::pair_matmul_triton``: the Triton kernel of ``kernels/pair_mm_triton.py`` (NOTE
[ Pair matmul kernel ]) as a ``torch.library.triton_op``, so that ``torch.compile`` sees the
launch (Inductor schedules it; no graph break).

Imported lazily by the dispatcher ``pair_matmul_values`` (``compile/pair_mm.py``) the first time
it picks the kernel: registering a triton_op imports triton, which the CPU path never needs.

The differentiable op models use is ``multijagged::pair_matmul`` one level up, whose backward is
two more ``pair_matmul`` calls (each reaching this op again), so gradients of any order run the
kernel. A direct call differentiates too: its formula (``compile/pair_mm.py``'s, with the same
offsets and lengths) is two more calls of this op. The fake impl is the launcher itself run on
fake tensors (it only allocates the output with ``empty_like``; ``wrap_triton`` records the
launch). Under ``TRITON_INTERPRET=1`` the op runs eagerly on CPU tensors, but not under fake
tensors: the interpreter would read their data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import pair_mm_triton as kt
from .library import _no_zero_fill

__all__ = ["pair_matmul_triton"]


@torch.library.triton_op("multijagged::pair_matmul_triton", mutates_args=())
def pair_matmul_triton(x: Tensor, y: Tensor, offsets: Tensor, lengths: Tensor, max_n: int, tx: bool,
                       ty: bool) -> Tensor:
    return kt.pair_matmul_triton(x, y, offsets, lengths, max_n, tx, ty)


def _setup(ctx, inputs, output):
    x, y, offsets, lengths, max_n, tx, ty = inputs
    _no_zero_fill(ctx)
    ctx.args = (max_n, tx, ty)
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, y if ctx.needs_input_grad[0] else None, offsets,
                          lengths)


def _backward(ctx, grad):
    if grad is None:
        return (None,) * 7
    x, y, offsets, lengths = ctx.saved_tensors
    max_n, tx, ty = ctx.args

    def mm(a, b, ta, tb):
        return torch.ops.multijagged.pair_matmul_triton(a, b, offsets, lengths, max_n, ta, tb)

    dx = dy = None
    if ctx.needs_input_grad[0]:
        dx = mm(grad, y, False, not ty) if not tx else mm(y, grad, ty, True)
    if ctx.needs_input_grad[1]:
        dy = mm(x, grad, not tx, False) if not ty else mm(grad, x, True, tx)
    return dx, dy, None, None, None, None, None


pair_matmul_triton.register_autograd(_backward, setup_context=_setup)
