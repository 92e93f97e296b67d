"""``multijagged::pair_matmul_triton``: the Triton kernel of ``kernels/pair_mm_triton.py`` (NOTE
[ Pair matmul kernel ]) as a ``torch.library.triton_op``, so that ``torch.compile`` sees the
launch (Inductor schedules it; no graph break).

Imported lazily by the dispatcher ``pair_matmul_values`` (``compile/pair_mm.py``) the first time
it picks the kernel: registering a triton_op imports triton, which the CPU path never needs.

No autograd formula here: the differentiable op is ``multijagged::pair_matmul`` one level up,
whose backward is two more ``pair_matmul`` calls (each reaching this op again), so gradients of
any order run the kernel. The fake impl is the launcher itself run on fake tensors (it only
allocates the output with ``empty_like``; ``wrap_triton`` records the launch). Under
``TRITON_INTERPRET=1`` the op runs eagerly on CPU tensors, but not under fake tensors: the
interpreter would read their data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import pair_mm_triton as kt

__all__ = ["pair_matmul_triton"]


@torch.library.triton_op("multijagged::pair_matmul_triton", mutates_args=())
def pair_matmul_triton(x: Tensor, y: Tensor, offsets: Tensor, lengths: Tensor, max_n: int, tx: bool,
                       ty: bool) -> Tensor:
    return kt.pair_matmul_triton(x, y, offsets, lengths, max_n, tx, ty)
