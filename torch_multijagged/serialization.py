"""How a ``MultiJaggedTensor`` is saved and rebuilt: the checks ``torch.load`` runs on a file's
parts, and the copies of structure that ``copy.deepcopy`` makes. Plain tensors and partitions
only; the subclass (``tensor.py``) builds on this module.

NOTE [ Serialized form ]

``torch.save`` / ``pickle`` / ``copy.copy`` reduce a MultiJaggedTensor to
``_rebuild_from_type_v2(_rebuild, MultiJaggedTensor, args, state)`` with
``args = (values, offsets, extent_offsets, ragged_dims, requires_grad)``: plain tensors, a tuple
of R plain tensors (one per ragged dim; a square pair lists the same tensor twice, and pickle's
memo keeps that identity, hence one nested int), a tuple of ints and a bool. So the default
``torch.load(weights_only=True)`` needs only ``_rebuild`` and the class allowlisted (done at
import, below the class); no other global of this package is ever named by a file. ``_rebuild``
validates everything it is given with host checks before building (``partition_from_file``),
and ``__setstate__`` refuses state that would overwrite the structure.
``state`` carries user attributes only: internal and cached keys (``_size``, ``_strides``, torch's
``_sym_sizes_capsule``…) are never written.
"""

from __future__ import annotations

import copy

import torch

from .structure import Partition, RaggedExtent, offsets_problem, register_partition

__all__ = ["partition_from_file", "load_error", "user_state", "is_internal_attr", "INTERNAL_ATTRS", "copy_partition"]


# Attributes set by ``__new__``; with torch's size/stride caches (``_sym_*``) they are the wrapper's
# internal state, rebuilt from ``_rebuild``'s arguments and never serialized.
INTERNAL_ATTRS = frozenset({"_values", "_partition", "_ragged_dims", "_size", "_strides", "_vgraph", "_retained", "_split_piece",
                            "_pieces", "_own_pieces", "_retained_pieces", "_retains_grad", "_storage_ptr", "_view_of", "_view_root", "_alias_bumps", "_storage"})


def is_internal_attr(name: str, value) -> bool:
    return (
        name in INTERNAL_ATTRS
        or name.startswith(("_sym_", "_ext"))
        or type(value).__name__ == "PyCapsule"
    )


def user_state(t: torch.Tensor) -> dict:
    """The attributes a user set on ``t`` (dense tensors serialize and deep-copy these too)."""
    return {k: v for k, v in t.__dict__.items() if not is_internal_attr(k, v)}


def load_error(msg: str) -> ValueError:
    return ValueError(f"torch.load(): invalid multi_jagged tensor in file: {msg}")


def _check_parts(values, offsets, extent_offsets, ragged_dims, requires_grad, wrapper: type) -> None:
    """Types, dtypes, shapes and devices of ``_rebuild``'s arguments (no data read)."""
    if not isinstance(values, torch.Tensor) or isinstance(values, wrapper) or values.is_nested or values.dim() < 1:
        raise load_error(f"expected values to be a dense tensor with a packed dim 0, got {type(values).__name__}")
    if not isinstance(requires_grad, bool):
        raise load_error(f"expected requires_grad to be a bool, got {type(requires_grad).__name__}")
    if requires_grad and not (values.is_floating_point() or values.is_complex()):
        raise load_error(f"requires_grad=True needs a floating point or complex dtype, got {values.dtype}")
    if not isinstance(ragged_dims, tuple) or not all(type(d) is int for d in ragged_dims):
        raise load_error(f"expected ragged_dims to be a tuple of ints, got {ragged_dims!r}")
    ndim = len(ragged_dims) + values.dim()
    if not ragged_dims or list(ragged_dims) != sorted(set(ragged_dims)) or ragged_dims[0] < 1 or ragged_dims[-1] >= ndim:
        raise load_error(f"expected ragged_dims to be increasing logical dims in [1, {ndim - 1}], got {ragged_dims}")
    if not isinstance(extent_offsets, tuple) or len(extent_offsets) != len(ragged_dims):
        raise load_error(f"expected one offsets tensor per ragged dim {ragged_dims}, got {type(extent_offsets).__name__}")
    named = [("offsets", offsets)] + [(f"offsets of ragged dim {d}", e) for d, e in zip(ragged_dims, extent_offsets)]
    for name, t in named:
        if not isinstance(t, torch.Tensor) or isinstance(t, wrapper) or t.is_nested:
            raise load_error(f"expected {name} to be a tensor, got {type(t).__name__}")
        if t.dtype != torch.int64 or t.dim() != 1 or t.shape[0] != offsets.shape[0] or t.shape[0] < 1:
            raise load_error(
                f"expected {name} to be a 1-D int64 tensor of B + 1 = {offsets.shape[0]} >= 1 entries, "
                f"got {t.dtype} of shape {tuple(t.shape)}"
            )
        if t.device != values.device:
            raise load_error(f"expected {name} on the values' device {values.device}, got {t.device}")


def partition_from_file(values, offsets, extent_offsets, ragged_dims, requires_grad, wrapper: type) -> Partition:
    """The partition of a saved tensor (``tensor._rebuild``'s arguments; NOTE [ Serialized form ])
    after host checks that every part agrees: a tampered or corrupted file raises ValueError
    instead of giving a tensor whose ops disagree with each other. ``wrapper`` is the subclass,
    which no part may be."""
    if isinstance(extent_offsets, tuple):
        # Files from older versions pickled RaggedExtent objects (loadable with weights_only=False).
        extent_offsets = tuple(e.offsets if isinstance(e, RaggedExtent) else e for e in extent_offsets)
    _check_parts(values, offsets, extent_offsets, ragged_dims, requires_grad, wrapper)
    # Each distinct extent once: the identity of its offsets is its nested int (a square pair
    # names one tensor twice, and pickle's memo keeps that).
    unique: dict[int, RaggedExtent] = {}
    for d, e in zip(ragged_dims, extent_offsets):
        if id(e) not in unique:
            # SYNC: loading reads the offsets on the host, once, to check and size the structure.
            host = e.detach().cpu()
            if host[0] != 0 or (host.diff() < 0).any():
                raise load_error(f"offsets of ragged dim {d} must start at 0 and be non-decreasing, got {host.tolist()}")
            unique[id(e)] = RaggedExtent.from_lengths(host.diff(), values.device, offsets=e)
    extents = [unique[id(e)] for e in extent_offsets]
    counts = torch.stack([e.host_lengths() for e in extents], 1).prod(1)
    rows = values.shape[0]
    # SYNC: loading reads the row offsets on the host, once.
    problem = offsets_problem("offsets", offsets.detach().cpu(), rows, counts)
    if problem:
        raise load_error(f"{problem} (the row offsets, the ragged extents and the values' rows must agree)")
    if len(extents) == 1 and offsets is extent_offsets[0]:
        partition = Partition(extents, offsets, extents[0].total)
    else:
        partition = Partition(extents, offsets, rows)
    return register_partition(partition)


def copy_partition(p: Partition, memo: dict) -> Partition:
    """``p`` with deep-copied offsets (new nested ints); extents shared between dims stay shared.
    Host lengths and shape carriers describe sizes only and are reused."""
    moved: dict[int, RaggedExtent] = {}
    extents = []
    for e in p.extents:
        if id(e) not in moved:
            host = None if e._host_lengths is None else e._host_lengths.clone()
            off = copy.deepcopy(e.offsets, memo)
            moved[id(e)] = RaggedExtent(off, e.sum_carrier, e.max_carrier, e.sq_carrier, host)
        extents.append(moved[id(e)])
    # For one ragged dim the row offsets are the extent's offsets: ``memo`` maps them to the same copy.
    return Partition(extents, copy.deepcopy(p.offsets, memo), p.rows)
