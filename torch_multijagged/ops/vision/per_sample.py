"""Windowed ops over ragged spatial dims run as the dense op on each sample, where that measured
faster than one dense op over a canvas (NOTE [ Canvas ] in ``kernels/canvas.py``): 2-d
convolutions of large images (NOTE [ Convolutions image by image ] in ``kernels/per_image.py``,
their results held as pieces: NOTE [ Per-image pieces ] in ``pieces.py``), 2-d max and average
pooling (NOTE [ Pooling image by image ]) and 1-d convolutions of signals (NOTE [ Convolutions of
signals sample by sample ]). Each sample's input is a view of its packed rows (channels last)
or its piece; the dense op's outputs on such views are channels last, so the packed output rows
are views of them too, concatenated once. Dense autograd throughout: every order of gradients.

Also the size helpers the canvas path shares: each sample's spatial sizes, the output partition
of a windowed op (``mapped_extent`` by the window's size rule) and the per-image output sizes,
cached on the partition.
"""

from __future__ import annotations

import torch

from ... import pieces
from ...bridge import values_of, wrap_values
from ...kernels import canvas as cv
from ...kernels import per_image as pim
from ...structure import mapped_extent, partition_for
from .._common import MJT, sample_rows, wrap
from .._routing import _needs_grad

__all__ = ["spatial_sizes", "mapped_partition", "window_out_sizes", "sample_lengths", "conv_per_image", "pool_pieces",
           "pool_per_image", "conv1d_per_sample"]


def spatial_sizes(x: MJT, nspatial: int) -> torch.Tensor:
    """(B, S) host spatial sizes."""
    b = x._partition.batch
    cols = []
    for d in range(2, 2 + nspatial):
        if d in x._ragged_dims:
            cols.append(x._partition.extents[x._ragged_dims.index(d)].host_lengths())
        else:
            cols.append(torch.full((b,), int(x.shape[d]), dtype=torch.int64))
    return torch.stack(cols, 1) if cols else torch.zeros(b, 0, dtype=torch.int64)


def mapped_partition(x: MJT, windows):
    """The partition of a windowed op's output: each ragged spatial dim gets the extent its
    window's rule maps it to (``mapped_extent``)."""
    p = x._partition
    extents = []
    for k, d in enumerate(x._ragged_dims):
        w = windows[d - 2]
        ext = p.extents[k]
        extents.append(mapped_extent(ext, w.rule(), lambda n, w=w: torch.where(n == 0, n, w.out_len(n).clamp(min=0))))
    return p if all(a is b for a, b in zip(extents, p.extents)) else partition_for(extents)


def window_out_sizes(op: str, x: MJT, windows) -> list:
    """Each sample's output sizes ``[h', w']`` (``[n']`` for a signal) under ``windows``, for
    values that are the pixel rows (every spatial dim ragged): host ints, cached on the partition
    by the windows' size rules. Raises where dense torch does, naming the sample (a failure is
    not cached)."""
    return x._partition.derived(("window_out_sizes", tuple(w.rule() for w in windows)),
                                lambda q: cv.output_sizes(op, spatial_sizes(x, len(windows)), windows).tolist())


def sample_lengths(x: MJT) -> list:
    """Each sample's packed rows (host ints)."""
    return sample_rows(x._partition)[1]


def _packed(x: MJT, outs: list, channels: int, windows, grad: bool) -> MJT:
    """The output tensor of per-sample pixel rows ``outs`` (the input's graph kept where there is
    none: no sample has an output)."""
    if outs:
        res = torch.cat(outs)
    else:
        v = values_of(x) if grad else x._values
        res = v.new_zeros(0, channels) + (v.sum() * 0 if grad else 0)
    part = mapped_partition(x, windows)
    return wrap_values(res, part, x._ragged_dims) if grad or res.requires_grad else wrap(res, part, x._ragged_dims)


# ----------------------------------------------------------------------------- 2-d images
def conv_per_image(op: str, x: MJT, windows, weight, bias, stride, padding, dilation, groups) -> MJT:
    """The conv image by image; the result holds its images as pieces (NOTE [ Per-image pieces ]
    in ``pieces.py``), read by the next image-by-image op without packing."""
    hw = window_out_sizes(op, x, windows)
    ps = pieces.split(x)
    # a thin input (``thin_per_image_applies``): the loop's contiguous images in, so that the
    # output is contiguous too
    planar = x._size[1] < pim.MIN_CHANNELS
    outs = pieces.in_size_order(lambda i: None if ps[i] is None or hw[i][0] * hw[i][1] == 0
                               else cv.onednn_safe_conv(pim.as_image(ps[i], planar), weight, bias, stride, padding,
                                                        dilation, groups),
                                ps, largest_last=True)
    live = [o for o in outs if o is not None]
    if not live:
        raise ValueError(f"{op}(): expected an image with output pixels")
    part = mapped_partition(x, windows)
    return pieces.from_pieces(outs, part, x._ragged_dims, weight.shape[0], live[0].dtype, live[0].device)


def pool_pieces(op: str, x: MJT, windows, fn) -> MJT:
    """``fn`` (a dense 2-d pooling) on each piece of images held as pieces, pieces out."""
    hw = window_out_sizes(op, x, windows)  # raises for an image whose output would be empty
    ps = pieces.split(x)
    outs = pieces.in_size_order(lambda i: None if ps[i] is None or hw[i][0] * hw[i][1] == 0 else fn(ps[i]), ps,
                                largest_last=True)
    return pieces.from_pieces(outs, mapped_partition(x, windows), x._ragged_dims, x._size[1], x.dtype, x.device)


def pool_per_image(op: str, x: MJT, windows, fn, indices: bool):
    """``fn`` (a dense 2-d pooling) on each image's view of the pixel rows, the outputs packed as
    pixel rows (with ``indices``, ``fn`` returns ``(out, flat index within the image)``, packed
    alike); an empty image, or one whose output is empty, has no output row (NOTE [ Pooling
    image by image ] in ``kernels/per_image.py``)."""
    hw = window_out_sizes(op, x, windows)
    grad = _needs_grad(x)
    c = x._size[1]
    outs, idxs = [], []
    for img, (h, w) in zip(pieces.split(x), hw):
        if img is None or h * w == 0:
            continue
        out = fn(img)
        if indices:
            out, idx = out
            idxs.append(idx.permute(0, 2, 3, 1).reshape(-1, c))
        # a view (the pooled view is channels last), whose gradient stays channels last (``out[0]``
        # would hand back a contiguous one, which aten's pooling backward transposes)
        outs.append(out.permute(0, 2, 3, 1).reshape(-1, c))
    out = _packed(x, outs, c, windows, grad)
    if not indices:
        return out
    idx = torch.cat(idxs) if idxs else torch.zeros(0, c, dtype=torch.int64, device=x.device)
    return out, wrap(idx, out._partition, x._ragged_dims)


# ----------------------------------------------------------------------------- 1-d signals
def conv1d_per_sample(op: str, x: MJT, windows, weight, bias, stride: int, padding: int, dilation: int,
                      groups: int) -> MJT:
    """``conv1d`` of each signal ``(B, C, j0)`` on its rows (NOTE [ Convolutions of signals sample by
    sample ] in ``kernels/per_image.py``): one input channel, on the contiguous ``(1, 1, n)`` view
    (the outputs concatenated along the length and transposed into rows once); more, as a 2-d
    conv of the channels-last ``(1, C, 1, n)`` view, whose channels-last output is a view of its
    rows."""
    lengths = sample_lengths(x)
    outs_n = window_out_sizes(op, x, windows)
    grad = _needs_grad(x)
    v = values_of(x) if grad else x._values
    c = v.shape[1]
    outs = []
    if c == 1:
        for r, n, (m,) in zip(v.split(lengths), lengths, outs_n):
            if n and m:
                outs.append(cv.onednn_safe_conv(r.view(1, 1, n), weight, bias, (stride,), (padding,), (dilation,), groups))
        outs = [torch.cat(outs, 2)[0].t().contiguous()] if outs else []
    else:
        w2 = weight.unsqueeze(2)
        for r, n, (m,) in zip(v.split(lengths), lengths, outs_n):
            if n and m:
                o = cv.onednn_safe_conv(r.view(1, 1, n, c).permute(0, 3, 1, 2), w2, bias, (1, stride), (0, padding),
                                        (1, dilation), groups)
                outs.append(o.permute(0, 2, 3, 1).reshape(-1, o.shape[1]))
    return _packed(x, outs, weight.shape[0], windows, grad)
