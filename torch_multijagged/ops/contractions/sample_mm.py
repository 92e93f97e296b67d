"""Products of NOTE [ Matmul between multi_jagged tensors ] run sample by sample on dense
matrices, where attention scores are held per sample (eager values path).

NOTE [ Attention scores held per sample ]

Attention scores ``q @ kᵀ`` of ``(B, H, j0, D)`` operands are ``(B, H, j0, j1)``: an image batch
whose channels are the heads. Stored in packed values, each sample's ``(H, n, m)`` block lies
either with the heads innermost (values ``(T, H)``) or, lead-major, with its heads ``T`` apart
(NOTE [ Lead-major products ] in ``kernels/ragged_mm.py``). Neither is a dense ``(H, n, m)``
tensor, and the ops a written-out attention applies next are dense per sample: aten's softmax
copies such a block in and its result out, in both directions, and a product into a strided
``out=`` is slower than into a contiguous result. A per-sample loop pays none of that; on the
written-out chain ``softmax(q @ kᵀ · s) @ v`` at lengths 8–200 the packed form cost 1.3–1.9× the
loop (H = 4, D = 16, one thread), while the same dense calls run op by op over the samples, each
on its sample's own contiguous block, cost the loop's time (0.92–1.06×).

So where the product's plan runs every sample alone (``_plan``: no group of short samples, none
empty), the scores are *held per sample*, as images are (NOTE [ Per-image pieces ] in
``pieces.py``): each sample's product is one dense ``bmm`` into its own ``(1, H, n, m)`` piece.
What images' pieces do then applies to them unchanged: elementwise ops with a scalar or a 0-dim
tensor (``· s``) or with a tensor of their structure (``+ bias``, read as views of its rows),
``dropout``, ``softmax`` along any non-batch dim, a ``masked_fill`` by a mask of their structure,
a full ``sum()`` / ``mean()`` and one over the heads run piece by piece; a product whose
operand holds pieces (``attn @ v``, and ``einsum`` forms of it) reads them as they are, sample by
sample; anything else reads the values, packed once on first read, lead-major as the packed path makes them (``(T, H)``
values of an ``(H, T)`` buffer: what those ops expect, and contiguous as torch.jagged reports it,
as the per-sample scores are). The autograd graph is the loop's own dense graph:
per-sample ``bmm``, ``softmax`` and ``mul`` nodes, with the operands' values split once (one node;
its backward concatenates the per-sample gradients).

Where samples are short the plan groups them (one batched product over zero-padded blocks beats a
call per sample) and the packed path stays.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ... import pieces as _pieces
from ...kernels import ragged_mm as _kmm
from ...structure import partition_for
from .._common import MJT

__all__ = ["sample_product"]


# Scores are held per sample when their blocks average at least this many elements (``H·n·m``):
# smaller blocks stay in cache, where the packed path's copies cost less than a call per sample
# and op (CPU, one thread; the written-out chain and ``nn.MultiheadAttention`` at 40–48 tokens,
# H = 4: level or slower held, at 8–200 tokens faster).
HELD_CELLS = 16_384


def _matrices(t: MJT, labels, transpose: bool, dims: dict, lead: tuple, batch: int, values_of: Callable) -> list:
    """Each sample's ``(*lead, r, c)`` matrix of operand ``t`` stored with ``labels`` (its last two
    dims swapped when ``transpose``), carrying ``t``'s gradient: its pieces when it holds them,
    else views of its values (split once)."""
    if _pieces.holds_pieces(t):
        mats = [None if p is None else p[0] for p in _pieces.split(t)]
    else:
        ragged, static, perm = _kmm._side(labels, dims, lead)
        rag_sizes = [[dims[lab][b] for lab in ragged] for b in range(batch)]
        static_sizes = [dims[lab] for lab in static]
        chunks = values_of(t).split([math.prod(s) for s in rag_sizes])
        mats = [c.view(*s, *lead, *static_sizes).permute(perm) for c, s in zip(chunks, rag_sizes)]
    return [None if m is None else m.transpose(-1, -2) for m in mats] if transpose else mats


def _image_shaped(spec, ragged_dims: tuple[int, ...]) -> bool:
    """Whether the product's output is ``(B, H, j, j')``: one lead dim, both matrix dims ragged."""
    return len(spec[6]) == 1 and ragged_dims == (2, 3)


def sample_product(x: MJT, y: MJT, spec, extents, ragged_dims: tuple[int, ...], dtype: torch.dtype,
                   device: torch.device, values_of: Callable, result: Callable) -> Optional[MJT]:
    """The product ``(x, y, spec)`` of ``product_spec`` sample by sample (see the NOTE), when an
    operand holds per-sample pieces or the output would be attention scores and the plan runs
    every sample with a non-empty result alone; else None (nothing read). Eager values path only;
    ``values_of`` and ``result`` are that path's."""
    sx, sy, so, tx, ty, dims_t, lead = spec
    if not extents or len(lead) != 1 or device.type != "cpu":
        return None
    makes = _image_shaped(spec, ragged_dims) and (dtype.is_floating_point or dtype.is_complex)
    reads = _pieces.holds_pieces(x) or _pieces.holds_pieces(y)
    if not (makes or reads):
        return None
    dims = dict(dims_t)
    batch = x._partition.batch
    rows, cols = ((s if isinstance(s, tuple) else (s,) * batch) for s in (dims[so[0]], dims[so[1]]))
    cells = [m * n for m, n in zip(rows, cols)]
    live = [b for b in range(batch) if cells[b]]
    if not live or (not reads and sum(cells) * lead[0] < HELD_CELLS * len(live)):
        return None  # small blocks: the packed path's copies are cheap, a call per sample is not (see the NOTE)
    plan = _kmm._plan(spec, _kmm._FORCED, device.type, dtype)
    if plan.groups or plan.zero or len(plan.singles[2]) != len(live):
        return None
    xs = _matrices(x, sx, tx, dims, lead, batch, values_of)
    ys = _matrices(y, sy, ty, dims, lead, batch, values_of)
    outs: list = [None] * batch
    for b in live:
        outs[b] = torch.bmm(xs[b], ys[b])
    partition = partition_for(extents)
    if makes:
        held = [None if o is None else o.unsqueeze(0) for o in outs]
        return _pieces.from_pieces(held, partition, ragged_dims, lead[0], dtype, device, lead_major=True)
    ragged, static, perm = _kmm._side(so, dims, lead)
    back = _kmm._inverse(perm)
    static_sizes = [dims[lab] for lab in static]
    packed = [outs[b].permute(back).reshape(-1, *lead, *static_sizes) for b in live]
    return result(torch.cat(packed), partition, ragged_dims)
