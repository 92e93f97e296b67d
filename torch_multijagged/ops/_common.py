"""Shared helpers for handlers: dim bookkeeping, wrapping, error text. Partitions and their
cached index maps live in ``structure.py`` (NOTE [ Derived maps ])."""

from __future__ import annotations

import functools

import torch

from ..structure import Partition
from ..tensor import MultiJaggedTensor

__all__ = [
    "MJT",
    "static_dims",
    "values_dim",
    "canonical_dim",
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


def same_partition(a: Partition, b: Partition) -> bool:
    return a.same_as(b)


def describe(x) -> str:
    if isinstance(x, MJT):
        return "(" + ", ".join(str(s) for s in x._size) + ")"
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    return repr(x)
