"""Published library code, unchanged, on multi_jagged batches against the same code on each
sample: ``einops`` (``rearrange`` / ``reduce`` / ``repeat`` / ``einsum`` and its layers), with
gradients. Skipped when the library is not installed (it is in the ``test`` extra)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

einops = pytest.importorskip("einops")
from einops.layers.torch import Rearrange, Reduce  # noqa: E402

F64 = torch.float64
H = 2


def _leaves(ns=(3, 1, 4), c=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=F64, requires_grad=True) for n in ns]


def _check(batched, per_sample, leaves):
    """``batched(x)`` per sample equals ``per_sample(component)``, values and leaf gradients."""
    x = mj.as_nested_tensor(leaves)
    out = batched(x)
    got = list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out)
    refs = [per_sample(c) for c in leaves]
    for a, r in zip(got, refs):
        torch.testing.assert_close(a, r, equal_nan=True)  # the mean of an empty sample is nan, as dense
    g1 = torch.autograd.grad(sum((a ** 2).sum() for a in got), leaves)
    g2 = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, equal_nan=True)


CASES = {
    "rearrange heads": (lambda x: einops.rearrange(x, "b n (h d) -> b h n d", h=H),
                        lambda c: einops.rearrange(c, "n (h d) -> h n d", h=H)),
    "rearrange packed qkv + sdpa": (
        lambda x: einops.rearrange(
            F.scaled_dot_product_attention(*einops.rearrange(x, "b n (three h d) -> three b h n d", three=3, h=H).unbind(0)),
            "b h n d -> b n (h d)"),
        lambda c: einops.rearrange(
            F.scaled_dot_product_attention(*einops.rearrange(c, "n (three h d) -> three h n d", three=3, h=H).unbind(0)),
            "h n d -> n (h d)")),
    "reduce mean": (lambda x: einops.reduce(x, "b n c -> b c", "mean"), lambda c: einops.reduce(c, "n c -> c", "mean")),
    "reduce max": (lambda x: einops.reduce(x, "b n c -> b c", "max"), lambda c: einops.reduce(c, "n c -> c", "max")),
    "repeat": (lambda x: einops.repeat(x, "b n c -> b n c k", k=2), lambda c: einops.repeat(c, "n c -> n c k", k=2)),
    "einsum pair": (lambda x: einops.einsum(x, x, "b i c, b j c -> b i j"), lambda c: einops.einsum(c, c, "i c, j c -> i j")),
    "layers": (lambda x: torch.nn.Sequential(Rearrange("b n (h d) -> b n h d", h=H), Reduce("b n h d -> b n d", "sum"))(x),
               lambda c: torch.nn.Sequential(Rearrange("n (h d) -> n h d", h=H), Reduce("n h d -> n d", "sum"))(c)),
}


@pytest.mark.parametrize("case", CASES)
def test_einops_per_sample(case):
    batched, per_sample = CASES[case]
    # a zero-length sample, except where the dense op refuses one (max over nothing)
    _check(batched, per_sample, _leaves(ns=(3, 1, 4) if case == "reduce max" else (3, 0, 4)))
