"""The batch as per-sample components and as a padded envelope: the handlers of
``multijagged::unbind``, ``pack_like``, ``to_padded`` and ``from_padded_like`` (``compile/library.py``)
when given multi_jagged tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import constructors
from ...compile import library  # noqa: F401  (defines the ops)
from ...compile.kernel_choice import use_triton
from ...kernels import reference as ref
from .._table import register_multi_jagged_func
from .._common import MJT, wrap
from .._routing import route

mj = torch.ops.multijagged


@register_multi_jagged_func(mj.unbind.default, "x: mjt")
def unbind_default(func, x):
    # SYNC: none — host sizes are cached on the extents.
    return [c.clone() for c in ref.unpack_components(x._values, x._partition.host_sizes(), x._ragged_dims)]


@register_multi_jagged_func(mj.pack_like.default, "components: any, like: mjt")
def pack_like_default(func, components, like):
    host = like._partition.host_sizes()
    if len(components) != like._partition.batch:
        raise ValueError(f"pack_like(): expected {like._partition.batch} components, got {len(components)}")
    empty = like._values.new_zeros((0, *like._values.shape[1:]))
    comps = []
    for c, ns in zip(components, host.tolist()):  # SYNC: none — host sizes
        if c is None:
            rows = 1
            for n in ns:
                rows *= n
            comps.append(empty.new_zeros((rows, *empty.shape[1:])))
        else:
            s = c.permute(ref.storage_perm(len(like._size), like._ragged_dims)[0])
            rows = 1
            for n in ns:
                rows *= n
            comps.append(s.reshape(rows, *s.shape[len(ns):]))
    values = torch.cat(comps, 0) if comps else empty
    return wrap(values, like._partition, like._ragged_dims)


def _padded_positions(x: MJT, maxes: list[int]) -> torch.Tensor:
    """Flat position in the padded ``(B, *maxes)`` ragged envelope of every packed row (cached
    on the partition, NOTE [ Derived maps ])."""

    def compute(p):
        sample, coords = p.row_coords()
        pos = sample
        for k, m in enumerate(maxes):
            pos = pos * m + coords[:, k]
        return pos

    return x._partition.derived(("padded_pos", tuple(maxes)), compute)


def _envelope(x: MJT, output_size):
    """Padded ragged extents: each extent's max (from its carrier), or ``output_size``."""
    maxes = [e.max for e in x._partition.extents]
    if output_size is not None:
        if len(output_size) != len(x._size):
            raise ValueError(f"to_padded_tensor(): expected output_size of length {len(x._size)}, got {list(output_size)}")
        want = [output_size[d] for d in x._ragged_dims]
        for m, w, d in zip(maxes, want, x._ragged_dims):
            if w < m:
                raise ValueError(f"to_padded_tensor(): output_size[{d}] = {w} is smaller than the longest extent {m}")
        for d in range(1, len(x._size)):
            if d not in x._ragged_dims and output_size[d] < x._size[d]:  # a static dim: padded, never cut
                raise ValueError(f"to_padded_tensor(): output_size[{d}] = {output_size[d]} is smaller than dim {d}'s "
                                 f"size {x._size[d]}")
        maxes = want
    return maxes


@register_multi_jagged_func(mj.to_padded.default, "x: mjt, padding: any, output_size: any?")
def to_padded_default(func, x, padding, output_size=None):
    p = x._partition
    maxes = _envelope(x, output_size)
    static = x._values.shape[1:]
    if x._ragged_dims and use_triton(x._values):
        # one pass writing every cell, no row map (NOTE [ Padded cells and packed rows ])
        from ...compile.triton_pair import to_padded_rows

        out = to_padded_rows(x._values, p.offsets, p.device_sizes(), maxes, padding)
    else:
        cells = p.batch
        for m in maxes:
            cells = cells * m
        flat = x._values.new_full((cells, *static), padding)
        flat = flat.index_copy(0, _padded_positions(x, maxes), x._values)
        out = flat.reshape(p.batch, *maxes, *static)
    # storage order (B, ragged…, static…) → logical order
    _, to_logical = ref.storage_perm(len(x._size), x._ragged_dims)
    out = out.permute(0, *[d + 1 for d in to_logical])
    if output_size is not None:
        pads = []
        for d in reversed(range(1, len(x._size))):
            pads += [0, output_size[d] - out.shape[d]]
        if output_size[0] != p.batch:
            raise ValueError(f"to_padded_tensor(): output_size[0] must equal the batch size {p.batch}")
        out = F.pad(out, pads, value=padding)
    return out.contiguous()


@register_multi_jagged_func(mj.from_padded_like.default, "padded: t, like: mjt")
def from_padded_like_default(func, padded, like):
    p = like._partition
    maxes = [padded.shape[d] for d in like._ragged_dims]
    to_storage, _ = ref.storage_perm(len(like._size), like._ragged_dims)
    stor = padded.permute(0, *[d + 1 for d in to_storage])
    static = stor.shape[1 + len(maxes):]
    expected = tuple(like._values.shape[1:])
    if tuple(static) != expected:
        stor = stor[(slice(None),) * (1 + len(maxes)) + tuple(slice(0, s) for s in expected)]
    if like._ragged_dims and use_triton(stor):
        from ...compile.triton_pair import from_padded_rows

        return wrap(from_padded_rows(stor, p.offsets, p.device_sizes(), p.rows), p, like._ragged_dims)
    # flatten, not reshape(-1, …): with a zero-size static dim, -1 is ambiguous (0 elements).
    flat = stor.flatten(0, len(maxes))
    return wrap(flat.index_select(0, _padded_positions(like, maxes)), p, like._ragged_dims)


@route(torch.Tensor.to_padded_tensor)
def _to_padded_tensor(input, padding, output_size=None):
    """The method form of ``torch.nested.to_padded_tensor``."""
    if not isinstance(input, MJT):
        return NotImplemented
    return constructors.to_padded_tensor(input, padding, output_size)
