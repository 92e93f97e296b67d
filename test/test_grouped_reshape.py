"""One ``reshape`` that splits or merges several groups of dims at once (a ViT patchify of images
sharing a height or a width, whose shared side is static; ``(B, 4 * n, 24)`` of ``(B, n, 4, 8, 3)``):
the dims paired as dense ``view`` pairs them and reshaped one group at a time — each sample's dense
reshape, values and gradients, and a raise where a sample's sizes do not pair."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj


_GROUPED = {
    "patchify, one static side": (lambda: [torch.randn(3, 32, w, dtype=torch.float64) for w in (40, 96, 8)], None,
                                  lambda t, B: t.reshape(B, 3, 4, 8, t.shape[3] // 8, 8)),
    "einops patchify, one static side": (lambda: [torch.randn(3, 32, w, dtype=torch.float64) for w in (40, 96, 8)], None,
                                         "b c (h p1) (w p2) -> b (h w) (p1 p2 c)"),
    "einops patchify, one static width": (lambda: [torch.randn(3, h, 16, dtype=torch.float64) for h in (8, 24, 0)], None,
                                          "b c (h p1) (w p2) -> b (h w) (p1 p2 c)"),
    "two merges": (lambda: [torch.randn(n, 4, 8, 3, dtype=torch.float64) for n in (2, 5, 0)], None,
                   lambda t, B: t.reshape(B, 4 * t.shape[1], 24)),
    "merge across a static lead": (lambda: [torch.randn(1, 8, n, 64, dtype=torch.float64) for n in (2, 5, 1)], (3,),
                                   lambda t, B: t.reshape(B, 8 * t.shape[3], 64)),
    "a merge and a static regroup": (lambda: [torch.randn(n, 4, 8, 3, dtype=torch.float64) for n in (2, 5, 0)], None,
                                     lambda t, B: t.reshape(B, 4 * t.shape[1], 12, 2)),
}


@pytest.mark.parametrize("name", list(_GROUPED))
def test_a_reshape_splitting_or_merging_several_groups_at_once(name):
    """One ``reshape`` that splits (or merges) a static and a ragged dim at once — the ViT patchify
    of images sharing a height or a width, whose shared side ``nested_tensor`` leaves static — runs
    one group at a time: each sample's dense reshape, values and gradients."""
    einops = pytest.importorskip("einops")
    make, rd, f = _GROUPED[name]
    comps = [c.requires_grad_() for c in make()]
    x = mj.as_nested_tensor(comps) if rd is None else mj.as_nested_tensor(comps, ragged_dims=rd)
    if isinstance(f, str):
        pattern = f
        f = lambda t, B: einops.rearrange(t, pattern, p1=8, p2=8)  # noqa: E731
    out = f(x, x.shape[0])
    refs = [f(c[None], 1)[0] for c in comps]
    for a, r in zip(out.unbind(), refs):
        assert torch.equal(a, r)
    ga = torch.autograd.grad((out * out).sum(), comps)
    gb = torch.autograd.grad(sum((r * r).sum() for r in refs), comps)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", ["merge to another multiple", "merge to a multiple of 8", "split to a wrong width"])
def test_a_reshape_of_several_groups_checks_each_samples_sizes(case):
    """Groups pair only where each sample holds as many elements on both sides: a merge named
    ``2 * n`` of ``(n, 4)`` raises as dense does for every sample, never a silently other shape."""
    xs = [torch.randn(n, 4, 8, 3) for n in (2, 5)]
    x = mj.nested_tensor(xs)
    B, n = x.shape[0], x.shape[1]
    ims = mj.nested_tensor([torch.randn(3, 16, w) for w in (8, 24)])
    f = {"merge to another multiple": lambda: x.reshape(B, 2 * n, 24),
         "merge to a multiple of 8": lambda: x.reshape(B, 8 * n, 24),
         "split to a wrong width": lambda: ims.reshape(B, 3, 2, 8, 2 * ims.shape[3], 4)}[case]
    with pytest.raises(RuntimeError):
        f()
