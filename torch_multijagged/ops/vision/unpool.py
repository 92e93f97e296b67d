"""``max_unpool1d/2d/3d`` of images, signals and volumes with ragged spatial dims: each image's
pooled values scattered back to the flat positions its ``max_pool(…, return_indices=True)`` found,
on an output plane of dense torch's default size (or of the sizes ``output_size`` names by nested
ints)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import extent_of, mapped_extent, partition_for
from .._common import MJT, describe, eager_route, equal_sizes
from .._routing import route
from .conv import _WHY, _tuple
from .resample import _static_side, ragged_side_as_static, static_side_as_ragged


def _unpool(op: str, nspatial: int, input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """``max_unpool1d/2d/3d``: each image's pooled values written back at the flat positions its
    ``max_pool(…, return_indices=True)`` found, on a plane of dense torch's default size
    ``(n − 1)·s − 2p + k`` per side (a new extent per side, shared by every unpool of the same
    rule); zeros elsewhere. A scatter of the pixel rows, differentiable."""
    if not isinstance(input, MJT):
        return NotImplemented
    if not isinstance(indices, MJT) or indices._ragged_dims != input._ragged_dims or not indices._partition.same_as(input._partition):
        raise StructureError(f"{op}(): expected indices with the structure of {describe(input)}, got {describe(indices)}")
    side = _static_side(input) if nspatial == 2 else None
    if side is not None:  # images of one height or width: that side as a ragged one of equal sizes (as interpolate)
        x, i = static_side_as_ragged([input, indices], side)
        if output_size is not None and len(output_size) >= 2 and not isinstance(output_size[side - 4], torch.SymInt):
            output_size = list(output_size)  # its static size there, every image's: an extent of that size
            named = equal_sizes(input, int(output_size[side - 4]))  # (alive while its nested int is read)
            output_size[side - 4] = named.nested_int
        return ragged_side_as_static(_unpool(op, nspatial, x, i, kernel_size, stride, padding, output_size), side)
    if input.dim() != nspatial + 2 or input._ragged_dims != tuple(range(2, nspatial + 2)):
        raise StructureError(f"{op}(): expected (B, C, {', '.join(['j'] * nspatial)}) with every spatial dim ragged, got {describe(input)}")
    return _unpool_rows(op, input, indices, _tuple(op, kernel_size, nspatial, "kernel_size"),
                        _tuple(op, kernel_size if stride is None else stride, nspatial, "stride"),
                        _tuple(op, padding, nspatial, "padding"), output_size)


def _unpool_extents(op: str, input: MJT, k, s, p, output_size):
    """Each spatial side's output extent: dense torch's default ``(n − 1)·s − 2p + k`` (a mapped
    extent), or the extents ``output_size`` names by their nested ints (``output_size=x.shape`` of
    the pooled tensor's input: the result then has that tensor's nested ints), each image's size
    within dense torch's range of the default ± stride."""
    default = [
        mapped_extent(e, ("unpool", k[a], s[a], p[a]), lambda n, a=a: torch.where(n > 0, (n - 1) * s[a] - 2 * p[a] + k[a], 0))
        for a, e in enumerate(input._partition.extents)
    ]
    if output_size is None:
        return tuple(default)
    sizes = list(output_size)[-len(default):]
    chosen = [extent_of(z) for z in sizes]
    if len(sizes) != len(default) or any(c is None for c in chosen):
        raise NotImplementedError(
            f"{op}(): output_size {tuple(output_size)} with a multi_jagged input: give each spatial size as a batch's "
            "nested int (output_size=x.shape of the tensor that was pooled), or leave the default (layout torch.multi_jagged)"
        )
    for a, (c, d) in enumerate(zip(chosen, default)):
        want, base = c.host_lengths(), d.host_lengths()
        bad = (base > 0) & ((want < base - s[a]) | (want > base + s[a]))
        if want.shape != base.shape or bool(bad.any()):
            raise ValueError(f"{op}(): invalid output_size {tuple(output_size)}: a side must be within the default ± stride in each image")
    return tuple(chosen)


@eager_route(_WHY)
def _unpool_rows(op: str, input: MJT, indices: MJT, k, s, p, output_size=None) -> MJT:
    extents = _unpool_extents(op, input, k, s, p, output_size)
    out_p = partition_for(extents)
    v = values_of(input)  # (rows, C): one row per pooled pixel
    sample = input._partition.row_sample()
    target = indices._values + out_p.offsets[sample].unsqueeze(1)
    plane = out_p.offsets.diff()[sample].unsqueeze(1)
    if bool(((indices._values < 0) | (indices._values >= plane)).any()):
        raise RuntimeError(f"{op}(): Found an invalid max index (outside its image's output plane) in {describe(indices)}")
    out = v.new_zeros((int(out_p.rows), v.shape[1])).scatter(0, target, v)
    return wrap_values(out, out_p, input._ragged_dims)


@route(F.max_unpool2d)
def _max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _unpool("max_unpool2d", 2, input, indices, kernel_size, stride, padding, output_size)


@route(F.max_unpool3d)
def _max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _unpool("max_unpool3d", 3, input, indices, kernel_size, stride, padding, output_size)


@route(F.max_unpool1d)
def _max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _unpool("max_unpool1d", 1, input, indices, kernel_size, stride, padding, output_size)
