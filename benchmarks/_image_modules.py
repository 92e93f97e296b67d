"""Modules for ``benchmarks/images.py``: a small CNN and a NaViT-style ViT, each written once as a
plain ``nn.Module`` that runs unchanged on

* a multi_jagged batch ``(B, 3, j0, j1)`` (ours) or a dense ``(1, 3, H, W)`` image: no mask;
* a zero-padded batch ``(B, 3, H_max, W_max)`` with a {0, 1} pixel mask ``(B, 1, H_max, W_max)``:
  the padded baseline, re-masked after every layer so that it computes exactly what the others do;
* (CNN only) a list of ``(1, 3, Hᵢ, Wᵢ)`` images: the per-sample loop, layer by layer, so that
  batch norm can take its statistics over every image's pixels (see ``MaskedBatchNorm2d``).

Every path computes the same function of the same weights: per image, the dense module on that
image alone, except that batch norm's statistics (in training mode) are over the valid pixels of
the whole batch, as dense ``batch_norm`` over a batch of equal-size images would take them.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

Images = Union[torch.Tensor, list]  # a tensor (dense, padded or multi_jagged) or a list of (1, C, H, W)


def each(fn: Callable[[torch.Tensor], torch.Tensor], x: Images) -> Images:
    """``fn`` on every image of a list (the per-sample loop), or on the batch tensor."""
    return [fn(xi) for xi in x] if isinstance(x, list) else fn(x)


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose training-mode statistics are over valid pixels only.

    * tensor, no mask: ``nn.BatchNorm2d`` itself (dense, or ours on ``(B, C, j0, j1)``);
    * tensor and mask ``(B, 1, H, W)``: mean and biased variance over the pixels where the mask is
      1 (the padded baseline; padded pixels come out as garbage, for the caller to re-mask);
    * list of ``(1, C, Hᵢ, Wᵢ)``: the per-channel sums of every image first, then each image
      normalised with the batch's statistics (the per-sample loop: batch norm over one image at a
      time would use that image's statistics, a different function).

    Running statistics are updated as dense ``batch_norm`` updates them over the same pixels
    (unbiased variance, ``momentum``), so every method leaves the module in the same state.
    """

    def forward(self, x: Images, mask: Optional[torch.Tensor] = None) -> Images:
        if not isinstance(x, list) and mask is None:
            return super().forward(x)
        if not (self.training or self.running_mean is None):  # eval: running stats, per pixel
            return each(lambda t: self._affine(t, self.running_mean, self.running_var), x)
        # Sums of x and x² (one pass each over the pixels, as torch's own CPU kernel for
        # channels-last input does), then one multiply-add per pixel: the cheapest exact masked
        # batch norm, so that the baselines pay for the masking and not for a slow norm.
        if isinstance(x, list):
            n = sum(t.shape[0] * t.shape[2] * t.shape[3] for t in x)
            mean = sum(t.sum((0, 2, 3)) for t in x) / n
            var = sum((t * t).sum((0, 2, 3)) for t in x) / n - mean * mean
        else:
            n = mask.sum()
            xm = x * mask
            mean = xm.sum((0, 2, 3)) / n
            var = (xm * x).sum((0, 2, 3)) / n - mean * mean
        self._update_running(mean, var, n)
        return each(lambda t: self._affine(t, mean, var), x)

    def _affine(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(var + self.eps)
        if self.affine:
            scale = scale * self.weight
        shift = -mean * scale if not self.affine else self.bias - mean * scale
        return torch.addcmul(shift[:, None, None], x, scale[:, None, None])

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n) -> None:
        if not self.track_running_stats or self.running_mean is None:
            return
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            self.running_mean.lerp_(mean.detach(), m)
            self.running_var.lerp_(var.detach() * (n / (n - 1)), m)


class MaskedGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` (statistics per image and group, so the per-sample loop is the module on
    each image alone); with a mask ``(B, 1, H, W)``, statistics over the valid pixels only."""

    def forward(self, x: Images, mask: Optional[torch.Tensor] = None) -> Images:
        if isinstance(x, list) or mask is None:
            return each(super().forward, x)
        b, c, hh, ww = x.shape
        g = self.num_groups
        xg = x.reshape(b, g, c // g, hh, ww)
        m = mask.reshape(b, 1, 1, hh, ww)
        n = m.sum((2, 3, 4)) * (c // g)  # (B, 1): valid pixels × channels per group
        mean = (xg * m).sum((2, 3, 4)) / n
        d = (xg - mean[..., None, None, None]) * m
        var = (d * d).sum((2, 3, 4)) / n
        y = (d * torch.rsqrt(var + self.eps)[..., None, None, None]).reshape(b, c, hh, ww)
        if self.affine:
            y = y * self.weight[:, None, None] + self.bias[:, None, None]
        return y


class ConvBlock(nn.Module):
    """3×3 conv (padding 1, no bias: the norm's shift replaces it) + norm + ReLU."""

    def __init__(self, cin: int, cout: int, norm: str, groups: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.norm = MaskedBatchNorm2d(cout) if norm == "batch" else MaskedGroupNorm(min(groups, cout), cout)

    def forward(self, x: Images, mask: Optional[torch.Tensor] = None) -> Images:
        x = each(F.relu, self.norm(each(self.conv, x), mask))
        # Padded baseline: the conv spilled valid pixels into the gutter and the norm's shift made
        # it nonzero; zero it again so the next 3×3 conv sees what it sees on the image alone.
        return x if mask is None else x * mask


class SmallCNN(nn.Module):
    """Three conv + norm + ReLU blocks, a 3×3 stride-2 conv, global average pooling, a linear head."""

    def __init__(self, channels=(3, 32, 32, 32, 64), classes: int = 10, norm: str = "batch"):
        super().__init__()
        if norm not in ("batch", "group"):
            raise ValueError(f"SmallCNN: expected norm 'batch' or 'group', got {norm!r}")
        c = channels
        self.norm_kind = norm
        self.blocks = nn.ModuleList(ConvBlock(c[i], c[i + 1], norm) for i in range(3))
        self.down = nn.Conv2d(c[3], c[4], 3, stride=2, padding=1)
        self.head = nn.Linear(c[4], classes)

    def forward(self, x: Images, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, mask)
        x = each(self.down, x)
        if mask is not None:
            # Output o of the stride-2 conv is valid iff 2·o < Hᵢ: the mask at the even pixels.
            mask = mask[..., ::2, ::2]
            pooled = (x * mask).sum((-2, -1)) / mask.sum((-2, -1))
        elif isinstance(x, list):
            pooled = torch.cat([xi.mean((-2, -1)) for xi in x])
        else:
            pooled = x.mean((-2, -1))  # (B, C): dense, or the mean over each image's pixels
        return self.head(pooled)


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer with ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int, mlp: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp * dim)
        self.fc2 = nn.Linear(mlp * dim, dim)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, H, L, d)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(a.transpose(1, 2).flatten(-2))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class NaViT(nn.Module):
    """Patchify (``Conv2d(3, D, p, stride=p)``), the patch grid flattened into tokens, pre-norm
    encoder layers, a final LayerNorm, mean pooling over tokens, a linear head. No position
    embedding (NaViT's factorised ones are a per-token add, the same cost for every method)."""

    def __init__(self, patch: int = 16, dim: int = 64, heads: int = 4, depth: int = 2, classes: int = 10):
        super().__init__()
        self.patch = patch
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)  # (B, h·w, D)
        attn_mask = tokens = None
        if mask is not None:
            # Patch (a, b) lies inside image i iff its last pixel does: ((a+1)p − 1, (b+1)p − 1).
            p = self.patch
            tokens = mask[:, 0, p - 1::p, p - 1::p].flatten(1)  # (B, h_max·w_max), {0, 1}
            attn_mask = tokens.bool()[:, None, None, :]  # padded keys out of every query's softmax
        for layer in self.layers:
            x = layer(x, attn_mask)
        x = self.norm(x)
        pooled = x.mean(1) if tokens is None else (x * tokens[..., None]).sum(1) / tokens.sum(1, keepdim=True)
        return self.head(pooled)
