"""Windowed ops image by image (or signal by signal) on views of the packed rows: the rules that
choose it over the canvas, and the per-sample adaptive pooling.

NOTE [ Convolutions image by image ]

The canvas (NOTE [ Canvas ] in ``canvas.py``) runs one dense op for the whole batch, which wins
when images are small: a per-image loop pays a few dense calls per image and layer, and the
canvas pays one. For larger images the calls are cheap beside the arithmetic, and the canvas
costs what the loop does not: the copy of every image onto it and back, the zeroing of its
gutters, its empty pixels, and (in backward) the same again for the gradient. Measured (1 thread,
fp32, 16 images, 32 → 32 channels, 3×3 conv, forward and backward): sides 32–128 took 188 ms on
the canvas against 118 ms per image; sides 112–128, 431 ms against 275 ms (the per-sample loop
over NCHW images: 118 and 250 ms).

Here the dense op runs on each image as the user's loop would, and on the image format the loop
has: a contiguous (channels-first) ``(1, C, hᵢ, wᵢ)`` image — the images the previous op left as
pieces, or a copy of the image's pixel rows ``(hᵢ·wᵢ, C)`` (a channels-last view, copied once; the
ops after it keep the format). oneDNN's channels-last kernels are faster than its planar ones on
some CPUs and slower on others: on one (an earlier machine, one thread, a 120×120 image, 32 → 32 channels)
forward 2.4 vs 3.8 ms, input gradient 2.1 vs 4.5, weight gradient 2.3 vs 3.9; on another (AMD
EPYC, one thread, the 16 images of 112–128 px a side of ``benchmarks/images.py``) forward 48 vs
53 ms, input gradient 47 vs 54, weight gradient 126 vs 68. The loop's own format is the one
that is never slower than the loop — from ``CHANNELS_FIRST_FROM`` (32) channels: with 16, the
channels-last kernels were the faster ones on that CPU too (forward + backward 5–25 % faster;
a 16-channel CNN ran 1.0–1.15× the loop channels last, 0.87–0.95× contiguous), so an image of
fewer channels keeps its format (group norm, whose channels-last kernel is the slow one, always
copies). The result holds its images as pieces too, packed into rows
only when something reads them (NOTE [ Per-image pieces ] in ``pieces.py``). Everything is dense
autograd on the pieces, so every order of gradients works.

The rule (``per_image_applies``, on the host sizes): an average of at least ``PIXELS_PER_IMAGE``
pixels per image and at least ``MIN_CHANNELS`` input channels; an input that already holds
pieces goes on image by image down to ``HELD_PIXELS_PER_IMAGE`` pixels per image on average (its
pieces need no split, and packing them costs a copy), and below that to the canvas, whose batching
wins on small images even after the copy (the measurements below) — a network that shrinks its
images (strided convs, pooling) batches its small layers. Measured (fp32, forward and backward, canvas time
over per-image time, 1 thread): 32 input channels, B = 16: 0.91 at 150 px per image, 0.88–1.00
at 300–600 px, 1.05 at 1,150 px, 1.15 at 2,300 px, 1.21 at 5,800 px, 1.38 at 8,900 px (2 threads:
0.81 at 580 px, 1.04 at 1,270 px, 1.51 at 4,700 px); B = 64: 0.42 at 34 px, 0.82 at 560 px,
1.06 at 1,250 px. With 3 input channels the canvas's backward is oneDNN's own, and the two paths
are within ±13 % of each other from 1,300 to 9,000 px (either way). What decides a thin input's
conv (``thin_per_image_applies``) is what follows it: taking it image by image makes its output
pieces, and every later op then goes image by image while the images stay large. So it goes image
by image where its output images would on their own (≥ ``CHANNELS_FIRST_FROM`` output channels,
≥ ``PIXELS_PER_IMAGE`` output pixels per image), on contiguous images as the loop's, whose output
is then the contiguous pieces the next ops run on; else it stays on the canvas. The canvas there
cost a gather of its output into pixel rows and a copy of each image's rows into a contiguous
image (and in backward a ``cat`` of the pieces' gradients and a scatter onto a zeroed canvas):
``benchmarks/images.py``'s BatchNorm CNN (3 → 32, B = 4, interleaved in one process) ran 0.90–0.93×
the loop with the canvas, 0.94–1.02× image by image. A first rule that took every thin input image by image
cost the networks that shrink their images at once: ResNet-18 on images of 32–64 px
(``benchmarks/backbone.py``, 2 threads; its 7×7 stride-2 stem's outputs are ~600 px) fell from
1.8× the loop to 1.0×, the NaViT patch embedding (16×16 stride 16) from 2.2–2.3× to 1.8–2.0×; under
this rule both keep the canvas. A 3 → 16 conv keeps it too (16 output channels: each image's
format is kept there, and image by image it measured 0.97–0.98× against 1.00–1.03× the loop on a
3 → 16 → 16 → 32 CNN with eval-mode batch norm).

NOTE [ Pooling image by image ]

2-d max and average pooling on the canvas copy every image onto it and the outputs back (and
the gradients the same way), around a pooling kernel that costs less than those copies. Image
by image, the dense pool reads each image's channels-last view of the rows, its output is
channels last, so the output rows are views of it, concatenated once; the gradient comes back
as views of rows too, in the format aten's pooling backward computes in without a transposing
copy (so never through ``out[0]``, whose backward builds a contiguous gradient). Each image
costs its dense calls (about ``POOL_CALL_NS`` forward and backward), the canvas a fixed cost and
copies per pixel and channel (``pool_per_image_applies``). Measured (1 thread, fp32, forward and
backward of ``avg_pool2d(x, 2)`` with a loss, ms, per image | canvas | the per-sample loop):
B = 4, 32 channels, sides 16–48: 0.60 | 1.07 | 0.49; B = 8, 16 channels, sides 16–64: 0.98 | 1.52 |
1.04 (``max_pool2d``: 0.96 | 1.28 | 1.28); B = 4, 64 channels, sides 64–160: 5.1 | 7.6 | 10.6;
B = 32, 3 channels, sides 32–64: 2.3 | 3.2 | 2.4; the canvas kept: B = 64, 16 channels, sides
8–24: 2.6 | 2.3 | 3.9; B = 1,024, 8 channels, sides 4–8: 29 | 2.4 | 49.

NOTE [ Convolutions of signals sample by sample ]

A 1-d convolution of signals ``(B, C, j0)`` on the canvas is one oneDNN call on a channels-last
signal, with the canvas copies around it; few or long signals run faster as the dense conv of
each: one input channel (waveforms) on the contiguous ``(1, 1, n)`` view of its rows, the
outputs concatenated along the length and transposed into rows once; several as a 2-d conv of
the channels-last ``(1, C, 1, n)`` view (oneDNN's 1-d conv of a channels-last view returns a
contiguous output and is slower), whose channels-last output rows are views. The rule
(``signals_per_sample_applies``): the samples' calls (``SIGNAL_CALL_NS`` each) against the
canvas's fixed cost and its copies, which grow with the multiply-adds. Measured (1 thread, fp32,
forward and backward with a loss, ms, per sample | canvas | the loop): 1 → 32 channels, kernel
10, stride 5 (wav2vec2's first layer), 4 waveforms of 1,600–4,000: 0.95 | 1.24 | 0.48; 32 → 32,
kernel 3, stride 2, B = 4 of 320–800: 1.03 | 1.80 | 0.78; 64 → 64, kernel 5, B = 8 of 100–300:
2.3 | 3.3 | 1.7; the canvas kept: 32 → 32, B = 32 of 20–80: 2.0 | 1.5 | 2.2; 16 → 16, kernel 3,
B = 128 of 10–40: 5.6 | 1.6 | 7.8. What remains at B = 4 is the transposition of a waveform
conv's output into rows (and of its gradient back) and the op's fixed cost.

NOTE [ Adaptive pooling sample by sample ]

Adaptive pooling to a fixed size gives every sample the same dense output, so the dense kernel
runs on each sample (a view of its rows, or its piece) and the outputs are concatenated
(``adaptive_pool_each``): the loop's own calls (aten's channels-last kernels, whose sums may
round differently from its contiguous ones in the last bit), its indices, its NaN rule.
The alternative, every (pixel, window) pair gathered and summed at once, copies each pixel's
channels into every window that may hold it (up to ``(⌈o/n⌉ + 1)`` per axis, 4 in 2-d for
images larger than the output) and scatters as much back in backward: measured (1 thread,
fp32, forward and backward of ``adaptive_avg_pool2d(x, 7)`` and a loss, × the loop) 12× for 4
images of sides 64–160 with 64 channels, 4.8× for 32 of sides 16–64, 2.5× for 256 of sides
8–32; sample by sample 0.98×, 0.58× and 0.47× (0.99× for 4 images of sides 16–48, where the
pairs took 3.2×; ``adaptive_max_pool2d`` 0.68×, 0.41×, 0.40× against 46×, 20×, 6.8×). The pairs
stay for an average over many tiny images with few channels (``adaptive_each_applies``: about
``PAIR_NS`` + ``PAIR_CHANNEL_NS`` · C ns per pair against ``CALL_NS`` per sample; 256 images of
sides 4–10 with 4 channels: pairs 4.1 ms, sample by sample 5.4 ms); the maximum's pairs (three
scatters) never won. Signals ``(B, C,
j0)``: there the gather reads every window at the width of the longest sample's
(``⌈max n / o⌉ + 1`` rows), which is no blow-up for lengths alike, so they go sample by sample
where the samples' calls cost less than the gather (``adaptive_signals_each_applies``: long or
skewed samples, wide channels).

A pooled view of channels-last pixel rows is channels last, and aten's CPU backward of the
average pool, handed a gradient in another memory format (the expanded gradient of a ``sum``,
the contiguous one of a ``flatten``), converts the whole input-sized gradient through a
transposing copy: 7 ms instead of 0.4 ms for one 64-channel 150×130 image. The max pool's
backward of a contiguous image does the same with an expanded gradient. So
``adaptive_pool_each``'s output hands its gradient back in the stride order of the samples'
outputs (``_GradInOrder``: a copy of the small pooled gradient at most).

This module is pure torch on host sizes; it knows nothing of the subclass.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

__all__ = ["PIXELS_PER_IMAGE", "MIN_CHANNELS", "HELD_PIXELS_PER_IMAGE", "CHANNELS_FIRST_FROM", "as_image", "per_image_applies", "thin_per_image_applies", "pack_images", "pool_per_image_applies",
           "signals_per_sample_applies", "adaptive_each_applies", "adaptive_signals_each_applies", "adaptive_pool_each"]

PIXELS_PER_IMAGE = 1024
MIN_CHANNELS = 16
HELD_PIXELS_PER_IMAGE = 256
# the format image-by-image convs and batch norms run on: contiguous (channels first), as a user's
# loop has its images, from this many channels; below it each image keeps its format (NOTE
# [ Convolutions image by image ]). Group norm always runs on contiguous images.
CHANNELS_FIRST_FROM = 32


def as_image(p: Tensor, always: bool = False) -> Tensor:
    """``p (1, C, h, w)`` in the format image-by-image ops run on: contiguous from
    ``CHANNELS_FIRST_FROM`` channels (or ``always``), else as it is."""
    return p.contiguous() if always or p.shape[1] >= CHANNELS_FIRST_FROM else p


def per_image_applies(sizes: list, channels: int, held: bool = False) -> bool:
    """``sizes``: host ``(hᵢ, wᵢ)`` per image; ``channels``: input channels; ``held``: the input
    holds pieces. Whether the per-image conv is the faster one (at least one pixel in all)."""
    b = len(sizes)
    px = sum(h * w for h, w in sizes)
    if held:
        return b > 0 and px >= max(1, HELD_PIXELS_PER_IMAGE * b)
    return b > 0 and channels >= MIN_CHANNELS and px >= max(1, PIXELS_PER_IMAGE * b)


def thin_per_image_applies(channels: int, out_channels: int, out_sizes: list) -> bool:
    """A conv of a thin input (fewer than ``MIN_CHANNELS`` channels: colours) goes image by image
    when its output images would on their own, in the loop's contiguous format (NOTE
    [ Convolutions image by image ]); ``out_sizes``: host ``(h', w')`` per image."""
    return channels < MIN_CHANNELS and out_channels >= CHANNELS_FIRST_FROM and per_image_applies(out_sizes,
                                                                                               out_channels)


def pack_images(images, rows: int, channels: int, dtype: torch.dtype, device: torch.device,
                lead_major: bool = False) -> Tensor:
    """Pixel rows ``(P, C)`` of images ``(1, C, hᵢ, wᵢ)`` (``None``: no pixel), image after image,
    row-major: one copy per image, recording no graph. ``lead_major``: in a ``(C, P)`` buffer
    (NOTE [ Lead-major products ] in ``ragged_mm.py``; attention scores held per sample)."""
    out = (torch.empty((channels, rows), dtype=dtype, device=device).T if lead_major
           else torch.empty((rows, channels), dtype=dtype, device=device))
    o = 0
    with torch.no_grad():
        for p in images:
            if p is None:
                continue
            h, w = p.shape[2], p.shape[3]
            out[o:o + h * w].view(h, w, channels).copy_(p[0].permute(1, 2, 0))
            o += h * w
    return out


# NOTE [ Pooling image by image ]
POOL_CALL_NS = 35_000.0
POOL_CANVAS_NS = 500_000.0
POOL_PIXEL_NS = 28.0
POOL_CHANNEL_NS = 2.5


def pool_per_image_applies(sizes: list, channels: int) -> bool:
    """``sizes``: host ``(hᵢ, wᵢ)`` per image. Whether 2-d max / average pooling runs image by image:
    the images' dense calls against the canvas's fixed cost and copies."""
    pixels = sum(h * w for h, w in sizes)
    return len(sizes) * POOL_CALL_NS < POOL_CANVAS_NS + pixels * (POOL_PIXEL_NS + POOL_CHANNEL_NS * channels)


# NOTE [ Convolutions of signals sample by sample ]
SIGNAL_CALL_NS = 40_000.0
SIGNAL_CANVAS_NS = 500_000.0
SIGNAL_MAC_NS = 0.05


def signals_per_sample_applies(lengths: list, macs_per_position: int) -> bool:
    """``lengths``: host length per signal; ``macs_per_position``: the conv's multiply-adds per
    output position (``C_in · C_out · k / groups``). Whether a 1-d conv runs signal by signal."""
    return len(lengths) * SIGNAL_CALL_NS < SIGNAL_CANVAS_NS + sum(lengths) * macs_per_position * SIGNAL_MAC_NS


# NOTE [ Adaptive pooling sample by sample ]
PAIR_NS = 25.0
PAIR_CHANNEL_NS = 4.0
PAIRS_NS = 500_000.0
CALL_NS = 25_000.0


def adaptive_each_applies(samples: int, pairs: int, channels: int) -> bool:
    """Whether adaptive average pooling runs sample by sample: ``pairs`` (pixel, window) pairs of
    ``channels`` each against ``samples`` samples' dense calls."""
    return pairs * (PAIR_NS + PAIR_CHANNEL_NS * channels) + PAIRS_NS >= samples * CALL_NS


EACH_NS = 400_000.0
SIGNAL_EACH_NS = 30_000.0
SIGNAL_VALUE_NS = 8.0
GATHER_NS = 400_000.0


def adaptive_signals_each_applies(samples: int, elements: int, rows: int, channels: int, average: bool) -> bool:
    """Whether adaptive pooling of signals ``(B, C, j0)`` runs sample by sample: ``elements``
    positions of ``channels`` each against the gather of ``rows`` window rows."""
    each = EACH_NS + samples * SIGNAL_EACH_NS + elements * channels * SIGNAL_VALUE_NS
    gather = GATHER_NS + rows * ((40.0 + 4.0 * channels) if average else (200.0 + 10.0 * channels))
    return each < gather


class _GradInOrder(torch.autograd.Function):
    """The identity, whose backward hands the gradient on in the stride order ``order``
    (outermost first): the memory format aten's pooling backward computes in without a
    transposing copy of its input-sized gradient."""

    @staticmethod
    def forward(ctx, t: Tensor, order: tuple[int, ...]):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.order = order
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if g is None:
            return None, None
        order = ctx.order
        inverse = sorted(range(len(order)), key=order.__getitem__)
        return g.permute(order).contiguous().permute(inverse), None


def _stride_order(t: Tensor) -> tuple[int, ...]:
    """Dim 0 first, then ``t``'s other dims from the largest stride to the smallest."""
    return (0, *sorted(range(1, t.dim()), key=lambda d: -t.stride(d)))


def adaptive_pool_each(parts: list[Optional[Tensor]], fn: Callable, shape: tuple[int, ...], fill: float,
                       dtype: torch.dtype, device: torch.device, indices: bool = False,
                       anchor: Optional[Callable[[], Tensor]] = None):
    """``fn`` (a dense pooling to a fixed size) on each sample's dense input ``parts[i]`` (``None``:
    a sample without elements, whose output is ``fill`` and whose index 0), each output viewed
    as ``shape``; returns ``(B, *shape)`` (and the indices ``(B, *shape)`` int64 with ``indices``,
    where ``fn`` returns ``(out, index)``). Where no sample reaches ``fn``, the output is still
    on the graph of ``anchor()`` (the values) when that requires grad."""
    outs: list[Optional[Tensor]] = []
    idxs: list[Optional[Tensor]] = []
    for p in parts:
        if p is None:
            outs.append(None)
            idxs.append(None)
            continue
        r = fn(p)
        if indices:
            r, j = r
            idxs.append(j.reshape(1, *shape))
        # a reshape to the same shape would hand the gradient back with dim 0 restrided, which
        # aten's channels-last test rejects (it does not skip dims of size 1)
        outs.append(r if r.shape == (1, *shape) else r.reshape(1, *shape))
    live = [r for r in outs if r is not None]
    if live:
        dtype = live[0].dtype
    blank = torch.full((1, *shape), fill, dtype=dtype, device=device)
    out = torch.cat([blank if r is None else r for r in outs]) if outs else blank[:0]
    if live and out.requires_grad:
        out = _GradInOrder.apply(out, _stride_order(live[0]))
    elif not live and anchor is not None:
        a = anchor()
        if a.requires_grad:
            out = out + a.sum() * 0
    if not indices:
        return out
    zero = torch.zeros((1, *shape), dtype=torch.int64, device=device)
    return out, torch.cat([zero if j is None else j for j in idxs]) if idxs else zero[:0]
