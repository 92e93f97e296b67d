"""A binary op that broadcasts two multi_jagged operands into new ragged dims, sample by sample.

NOTE [ Broadcasting into new ragged dims per sample ]

The values path (``pointwise.broadcast_values``) computes ``(B, j0, 1, C) * (B, 1, j0, C)`` by
gathering each operand onto the output's rows (an ``index_select`` of a ``(T_out, C)`` tensor per
operand) and combining the two: three full passes over the output plus two fresh tensors of its
size, and in the backward the gathers' ``index_add`` over the materialised gradients. For a pair
from singles the output has Σ n² rows against the operands' Σ n, so that dominates: a dense loop
computes ``a_i[:, None] * b_i[None]`` in one pass, and dense autograd un-broadcasts its gradient
with a reduction over the expanded dim.

Eagerly on the CPU, when the samples are large enough to pay the per-sample calls, the op runs
that loop: each operand's sample is a view of its packed values (a ``split`` by per-sample rows,
viewed as the sample's ragged sizes then its static dims — storage order, with a size-1 dim where
the output is ragged and the operand is not, and the operand's own size-1 static dims there
dropped), the op is dense torch's under autograd (so any binary op, any dtype, and gradients
exactly dense's), and the per-sample results, flattened to ``(rows_i, *static)`` in the output's
row-major order, are concatenated into the output's values. Pointwise ops do not depend on the
order of dims, so storage order (ragged dims first) gives the same elements as the logical one,
for layouts with static dims before the ragged ones (``(B, S, j0, C)``) too.

The rule (``pays``): output rows per sample times the static size at least ``MIN_ELEMENTS``
(measured on one CPU thread: below it the calls per sample cost more than the gathers' passes),
every operand's values on the CPU (a GPU runs the gathers, or the Triton pair kernel, in a few
launches where this takes several per sample) and some operand lacking an output ragged dim.
Traced code never gets here (the eager values path is eager only), so the gathers stay the traced
form.
"""

from __future__ import annotations

import torch

from .._common import MJT, sample_rows, static_dims

__all__ = ["pays", "broadcast_per_sample"]

# Output elements per sample (mean) from which the loop beats the gathers, forward and backward
# (one CPU thread, float32, a pair from singles with C = 32: the gathers win at ~10k elements per
# sample, the loop from ~25k on, by 1.4× forward and backward at ~44k).
MIN_ELEMENTS = 16384


def pays(a: MJT, b: MJT, va: torch.Tensor, vb: torch.Tensor, partition, out_dims, out_static) -> bool:
    """Whether ``broadcast_per_sample`` computes ``a ∘ b`` (NOTE [ Broadcasting into new ragged
    dims per sample ])."""
    static = 1
    for d in out_static:
        static *= a._size[d] if b._size[d] == 1 else b._size[d]
    # mean output rows per sample × static size first: the cheap test that small samples fail
    if partition.batch == 0 or partition.rows * static < MIN_ELEMENTS * partition.batch:
        return False
    if a._ragged_dims == out_dims and b._ragged_dims == out_dims:
        return False
    return va.device.type == "cpu" and vb.device.type == "cpu"


def _samples(m: MJT, v: torch.Tensor, out_dims, out_static) -> list[torch.Tensor]:
    """Each sample of ``m`` (values ``v``) as a dense view in the output's storage order: its ragged
    sizes, 1 where the output is ragged and ``m`` is not, then the static dims the output keeps."""
    m_static = static_dims(len(m._size), m._ragged_dims)
    static = [v.shape[i + 1] for i, d in enumerate(m_static) if d in out_static]
    where = [m._ragged_dims.index(d) if d in m._ragged_dims else None for d in out_dims]
    sizes, rows = sample_rows(m._partition)
    return [
        part.view([1 if k is None else ns[k] for k in where] + static) if part.is_contiguous()
        else part.reshape([1 if k is None else ns[k] for k in where] + static)
        for part, ns in zip(v.split(rows), sizes)
    ]


def broadcast_per_sample(func, a: MJT, b: MJT, va: torch.Tensor, vb: torch.Tensor, partition, out_dims, out_static):
    """The values of ``func(a, b)`` on ``partition``'s rows, computed sample by sample with dense
    ``func`` on views of ``va`` and ``vb`` (standing for a's and b's values)."""
    sizes, rows = sample_rows(partition)
    r = len(out_dims)
    pairs = zip(_samples(a, va, out_dims, out_static), _samples(b, vb, out_dims, out_static))
    out_op = getattr(func.overloadpacket, "out", None)
    if out_op is not None and not (torch.is_grad_enabled() and (va.requires_grad or vb.requires_grad)):
        # No graph to record: each sample written straight into the output (one pass, where the
        # concatenation below takes two).
        x, y = next(pairs)
        first = func(x, y)
        out = first.new_empty(sum(rows), *first.shape[r:])
        parts = out.split(rows)
        parts[0].view_as(first).copy_(first)
        static = list(first.shape[r:])
        for (x, y), part, ns in zip(pairs, parts[1:], sizes[1:]):
            out_op(x, y, out=part.view(list(ns) + static))
        return out
    outs = []
    for (x, y), n in zip(pairs, rows):
        o = func(x, y)
        outs.append(o.reshape(n, *o.shape[r:]))
    return torch.cat(outs)
