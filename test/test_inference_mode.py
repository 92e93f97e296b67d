"""A structure used under ``torch.inference_mode()`` first, then with autograd.

Index maps, sub-partitions, reduction plans and canvas placements are built once per structure
and cached on it (NOTE [ Derived maps ] in structure.py). A map first built under inference mode
would be an inference tensor, which a later op that records autograd cannot save for backward:
dense torch carries no state between calls, so the same code must not fail here either
(``structure.building``). Each chain runs on a batch under inference mode, then with gradients on
the very same batch; values and gradients must equal those of a batch never seen under inference
mode, and the inference-mode outputs are inference tensors, as dense torch's are.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

from _reference import assert_close

DT = torch.float64


def _singles(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 4, generator=g, dtype=DT) for n in (3, 0, 2, 5)]


def _images(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, w, generator=g, dtype=DT) for h, w in ((4, 5), (3, 3), (6, 2))]


def _pair(x, w):
    h = x @ w
    return h.unsqueeze(-2) + h.unsqueeze(-3)


def _attention(x, w):
    q = (x @ w).unflatten(-1, (2, 2)).transpose(1, 2)  # (B, H, j0, D)
    return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).flatten(-2).sum((1, 2))


def _attention_pair_bias(x, w):
    h = x @ w
    q = h.unflatten(-1, (2, 2)).transpose(1, 2)  # (B, H, j0, D)
    bias = _pair(x, w)[..., :2].permute(0, 3, 1, 2)  # (B, H, j0, j0)
    return F.scaled_dot_product_attention(q, q, q, attn_mask=bias).transpose(1, 2).flatten(-2).sum((1, 2))


def _pair_matmul(x, w):
    p = _pair(x, w)
    return torch.einsum("bijc,bjkc->bikc", p, p).sum((1, 2, 3))


CHAINS = {
    # name: (components, f(batch, weight) -> multi_jagged or dense result)
    "pair broadcast, mean and sums": (_singles, lambda x, w: _pair(x, w).mean(-2).sum((1, 2)) + _pair(x, w).sum((1, 2, 3))),
    "softmax over a ragged dim": (_singles, lambda x, w: (torch.softmax(x @ w, dim=1) * (x @ w)).sum((1, 2))),
    "pair softmax and transpose": (_singles, lambda x, w: torch.softmax(_pair(x, w).transpose(1, 2), dim=2).sum((1, 2, 3))),
    "padded": (_singles, lambda x, w: torch.nested.to_padded_tensor(x @ w, 0.0).sum((1, 2))),
    "sum keepdim and broadcast back": (_singles, lambda x, w: ((x @ w) - (x @ w).mean(1, keepdim=True)).pow(2).sum((1, 2))),
    "conv, group norm, pooling": (
        _images,
        lambda x, w: F.group_norm(F.conv2d(x, w, padding=1), 1).relu().mean((-2, -1)).sum(1),
    ),
    "attention": (_singles, _attention),
    "attention with a pair bias": (_singles, _attention_pair_bias),
    "pair matmul": (_singles, _pair_matmul),
}


def _weight(name):
    g = torch.Generator().manual_seed(1)
    shape = (3, 2, 3, 3) if name.startswith("conv") else (4, 4)
    return torch.randn(*shape, generator=g, dtype=DT)


@pytest.mark.parametrize("name", list(CHAINS))
def test_maps_built_under_inference_mode_serve_autograd(name):
    make, f = CHAINS[name]
    comps = make()
    x = mj.nested_tensor(comps)
    with torch.inference_mode():
        out = f(x, _weight(name))
    assert (out.values() if isinstance(out, mj.MultiJaggedTensor) else out).is_inference()

    w = _weight(name).requires_grad_()
    y = f(x, w)  # the same batch: its maps were built under inference mode
    (gw,) = torch.autograd.grad(y.sum(), w)

    w_ref = _weight(name).requires_grad_()
    y_ref = f(mj.nested_tensor(comps), w_ref)  # a batch never seen under inference mode
    (gw_ref,) = torch.autograd.grad(y_ref.sum(), w_ref)
    assert_close(y, y_ref)
    assert_close(gw, gw_ref)
    assert_close(out, y_ref.detach())



@pytest.mark.parametrize("name", ["sdpa", "triangle einsum", "pair", "linear"])
def test_a_batch_made_under_inference_mode_then_cloned_trains(name):
    """``x = xi.clone().requires_grad_()`` of a batch built under ``inference_mode`` (torch's advice
    for training on inference tensors): its structure (offsets, lengths) is no inference tensor,
    so ops that save it for backward run, values and gradients as each sample's."""
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(n, 2, 4, generator=g) for n in (3, 0, 5)]
    with torch.inference_mode():
        xi = torch.nested.nested_tensor(ts, layout=mj.multi_jagged)
    x = xi.clone().requires_grad_()
    assert not x.offsets().is_inference() and not x._partition.extents[0].host_lengths().is_inference()
    w = torch.randn(8, 8, generator=g)
    f = {"sdpa": lambda t: F.scaled_dot_product_attention(*(t.transpose(-3, -2),) * 3),
         "triangle einsum": lambda t: torch.einsum("...ikc,...jkc->...ijc", *(t.flatten(-2).unsqueeze(-2)
                                                                           * t.flatten(-2).unsqueeze(-3),) * 2),
         "pair": lambda t: t.flatten(-2).unsqueeze(-2) + t.flatten(-2).unsqueeze(-3),
         "linear": lambda t: t.flatten(-2) @ w}[name]
    out = f(x)
    leaves = [t.clone().requires_grad_() for t in ts]
    refs = [f(t[None])[0] for t in leaves]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    (gx,) = torch.autograd.grad(out.sum(), x)
    for a, b in zip(gx.unbind(), torch.autograd.grad(sum(r.sum() for r in refs), leaves)):
        torch.testing.assert_close(a, b)
