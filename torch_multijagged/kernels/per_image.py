"""Windowed ops image by image on views of the packed pixel rows.

NOTE [ Convolutions image by image ]

The canvas (NOTE [ Canvas ] in ``canvas.py``) runs one dense op for the whole batch, which wins
when images are small: a per-image loop pays a few dense calls per image and layer, and the
canvas pays one. For larger images the calls are cheap beside the arithmetic, and the canvas
costs what the loop does not: the copy of every image onto it and back, the zeroing of its
gutters, its empty pixels, and (in backward) the same again for the gradient. Measured (1 thread,
fp32, 16 images, 32 → 32 channels, 3×3 conv, forward and backward): sides 32–128 took 188 ms on
the canvas against 118 ms per image; sides 112–128, 431 ms against 275 ms (the per-sample loop
over NCHW images: 118 and 250 ms).

Here the dense op runs on each image as the user's loop would: on the image's pixel rows
``(hᵢ·wᵢ, C)`` viewed as a channels-last ``(1, C, hᵢ, wᵢ)`` image (a ``split`` of the packed rows,
no copy), or on the images the previous op left as pieces. The result holds its images as
pieces too, packed into rows only when something reads them (NOTE [ Per-image pieces ] in
``pieces.py``). Everything is dense autograd on the pieces, so every order of gradients works.

The rule (``per_image_applies``): an average of at least ``PIXELS_PER_IMAGE`` pixels per image
and at least ``MIN_CHANNELS`` input channels; an input that already holds pieces goes image by
image whatever its size. Measured (fp32, forward and backward, canvas time
over per-image time, 1 thread): 32 input channels, B = 16: 0.91 at 150 px per image, 0.88–1.00
at 300–600 px, 1.05 at 1,150 px, 1.15 at 2,300 px, 1.21 at 5,800 px, 1.38 at 8,900 px (2 threads:
0.81 at 580 px, 1.04 at 1,270 px, 1.51 at 4,700 px); B = 64: 0.42 at 34 px, 0.82 at 560 px,
1.06 at 1,250 px. With 3 input channels the canvas's backward is oneDNN's own, and the two paths
are within ±13 % of each other from 1,300 to 9,000 px (either way), so thin inputs stay on the
canvas. Taking them image by image so that the pieces start one layer earlier was measured too
(the benchmarks' CNN, B = 4, one thread, × the loop): with GroupNorm 0.90–0.93 against 0.90–0.93
on the canvas, with BatchNorm (which reads the packed values) 0.90–1.03 against 0.98–1.03.

This module is pure torch on host sizes; it knows nothing of the subclass.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["PIXELS_PER_IMAGE", "MIN_CHANNELS", "per_image_applies", "pack_images"]

PIXELS_PER_IMAGE = 1024
MIN_CHANNELS = 16


def per_image_applies(sizes: Tensor, channels: int) -> bool:
    """``sizes (B, 2)``: host image sizes; ``channels``: input channels. Whether the per-image
    path is the faster one (at least one pixel in all)."""
    b = sizes.shape[0]
    # SYNC: none — host sizes
    return (b > 0 and sizes.shape[1] == 2 and channels >= MIN_CHANNELS
            and int(sizes.prod(1).sum()) >= max(1, PIXELS_PER_IMAGE * b))


def pack_images(images, rows: int, channels: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Pixel rows ``(P, C)`` of images ``(1, C, hᵢ, wᵢ)`` (``None``: no pixel), image after image,
    row-major: one copy per image, recording no graph."""
    out = torch.empty((rows, channels), dtype=dtype, device=device)
    o = 0
    with torch.no_grad():
        for p in images:
            if p is None:
                continue
            h, w = p.shape[2], p.shape[3]
            out[o:o + h * w].view(h, w, channels).copy_(p[0].permute(1, 2, 0))
            o += h * w
    return out
