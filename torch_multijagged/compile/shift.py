"""``multijagged::shift``: the one primitive behind scans along any dim (``ops/nn/ragged.py``).

NOTE [ Scans by shifting ]

``shift(x, dim, s, fill)`` moves every element ``s`` positions along ``dim`` (towards higher
coordinates for ``s > 0``) and writes ``fill`` where nothing arrives: ``out[a] = x[a - s]`` when
``0 <= a - s < n`` else ``fill``. Along a ragged dim ``n`` is each sample's own extent, so nothing
crosses a sample (or a row of a pair): it is a per-segment shift with no padding. A scan is then
Hillis–Steele's ⌈log₂ n⌉ rounds, ``y = y ∘ shift(y, 2^t, identity)``, written with pointwise ops
on wrappers, so autograd differentiates it to any order (``cumprod`` with zeros included: every
step is a product, nothing divides) and it traces under ``torch.compile``.

The op is linear in ``x`` (``fill`` is a constant), and its adjoint is the opposite shift filled
with 0, which is its autograd formula — and hence also the formula's own derivative.
"""

from __future__ import annotations

import torch

from .library import LIB

__all__: list[str] = []

LIB.define("shift(Tensor x, int dim, int shift, float fill) -> Tensor")


def _shift_dense(x: torch.Tensor, dim: int, shift: int, fill: float) -> torch.Tensor:
    n = x.shape[dim]
    s = min(abs(shift), n)
    if s == 0:
        return x.clone()
    pad = x.new_full((*x.shape[:dim], s, *x.shape[dim + 1:]), fill)
    if shift > 0:
        return torch.cat([pad, x.narrow(dim, 0, n - s)], dim)
    return torch.cat([x.narrow(dim, s, n - s), pad], dim)


LIB.impl("shift", _shift_dense, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::shift", _shift_dense, lib=LIB)


def _shift_setup(ctx, inputs, output):
    _, dim, shift, _ = inputs
    ctx.set_materialize_grads(False)  # NOTE [ Undefined gradients ] in library.py
    ctx.args = (dim, shift)


def _shift_backward(ctx, grad):
    if grad is None:
        return None, None, None, None
    dim, shift = ctx.args
    return torch.ops.multijagged.shift(grad, dim, -shift, 0.0), None, None, None


torch.library.register_autograd("multijagged::shift", _shift_backward, setup_context=_shift_setup, lib=LIB)
