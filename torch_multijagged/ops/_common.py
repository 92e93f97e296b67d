"""Shared helpers for handlers: dim bookkeeping, cached partitions and row maps."""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from ..kernels import reference as ref
from ..structure import Partition, RaggedExtent
from ..tensor import MultiJaggedTensor

__all__ = [
    "MJT",
    "static_dims",
    "values_dim",
    "canonical_dim",
    "partition_for",
    "device_sizes",
    "map_to_sub",
    "row_sample",
    "wrap",
]

MJT = MultiJaggedTensor


@functools.lru_cache(maxsize=None)
def static_dims(ndim: int, ragged_dims: tuple[int, ...]) -> tuple[int, ...]:
    """Logical dims (≥ 1) that are static, in order; values dim of the k-th is k + 1."""
    return tuple(d for d in range(1, ndim) if d not in ragged_dims)


def values_dim(x: MJT, d: int) -> int:
    """Values dim of static logical dim ``d`` (already canonical and not ragged)."""
    return static_dims(len(x._size), x._ragged_dims).index(d) + 1


def canonical_dim(op: str, ndim: int, d: int) -> int:
    if not -ndim <= d < ndim:
        raise IndexError(f"{op}(): dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {d})")
    return d + ndim if d < 0 else d


def wrap(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]) -> MJT:
    return MultiJaggedTensor(values, partition, ragged_dims)


def partition_for(extents: Sequence[RaggedExtent]) -> Partition:
    """The canonical partition of ``extents``, cached on the first extent so that tensors
    created by the same structural move share it (and its index maps)."""
    extents = tuple(extents)
    head = extents[0]
    key = ("partition",) + tuple(id(e) for e in extents)
    hit = head.cache.get(key)
    # The cached partition holds its extents, so their ids cannot have been reused.
    if hit is not None and all(a is b for a, b in zip(hit.extents, extents)):
        return hit
    p = Partition.from_extents(extents)
    head.cache[key] = p
    return p


def register_partition(p: Partition) -> Partition:
    """Make ``p`` the canonical partition of its extents (constructors call this)."""
    if p.extents:
        p.extents[0].cache[("partition",) + tuple(id(e) for e in p.extents)] = p
    return p


def device_sizes(p: Partition) -> torch.Tensor:
    s = p.cache.get("sizes")
    if s is None:
        s = p.cache["sizes"] = p.sizes()
    return s


def row_sample(p: Partition) -> torch.Tensor:
    """(T,) sample of every packed row of ``p`` (cached)."""
    s = p.cache.get("row_sample")
    if s is None:
        s = p.cache["row_sample"] = ref.row_sample(p.offsets, p.rows)
    return s


def _batch_partition(p: Partition) -> Partition:
    """One row per sample: what remains when every ragged dim is reduced."""
    b = p.batch
    off = torch.arange(b + 1, device=p.offsets.device, dtype=torch.int64)
    return Partition((), off, b)


def map_to_sub(p: Partition, keep: tuple[int, ...]) -> tuple[torch.Tensor, Partition]:
    """``(index, sub)``: the partition ``sub`` keeping ragged dims ``keep`` of ``p`` and, for
    every row of ``p``, its row in ``sub`` (see ``kernels.reference.row_map``). Cached on ``p``."""
    key = ("map", keep)
    hit = p.cache.get(key)
    if hit is not None:
        return hit
    sub = p.cache.get(("sub", keep))
    if sub is None:
        sub = partition_for([p.extents[k] for k in keep]) if keep else _batch_partition(p)
        p.cache[("sub", keep)] = sub
    if keep == tuple(range(p.nragged)):
        index = torch.arange(p.rows, device=p.offsets.device)
    elif not keep:
        index = row_sample(p)
    else:
        index = ref.row_map(p.offsets, device_sizes(p), p.rows, keep, sub.offsets)
    p.cache[key] = (index, sub)
    return index, sub


def note_sub(p: Partition, keep: tuple[int, ...], sub: Partition) -> None:
    """Record that ``sub`` (an operand's partition) is ``p`` restricted to ``keep``, so that a
    reduction back over the dropped dims returns tensors with ``sub`` itself."""
    p.cache.setdefault(("sub", keep), sub)


def same_partition(a: Partition, b: Partition) -> bool:
    return a.same_as(b)


def describe(x) -> str:
    if isinstance(x, MJT):
        return "(" + ", ".join(str(s) for s in x._size) + ")"
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    return repr(x)
