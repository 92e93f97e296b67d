"""``torch.layer_norm`` / ``torch.group_norm`` / ``torch.instance_norm`` / ``torch.batch_norm`` /
``torch.binary_cross_entropy_with_logits`` — the aten-order calls that ``F.*`` makes, which model
code (and torch.jagged code) also calls directly — give ``F.*``'s results on multi_jagged inputs,
values and gradients of every leaf, each checked against the dense op per sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

F64 = torch.float64


def _leaves(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=F64, generator=g, requires_grad=True) for s in shapes]


def _check(out, refs, leaves):
    got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else [out]
    refs = refs if isinstance(out, mj.MultiJaggedTensor) else [refs]
    for a, b in zip(got, refs):
        torch.testing.assert_close(a, b)
    ws = [torch.randn(r.shape, dtype=F64, generator=torch.Generator().manual_seed(i)) for i, r in enumerate(refs)]
    ga = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, ws)), leaves)
    gb = torch.autograd.grad(sum((b * w).sum() for b, w in zip(refs, ws)), leaves)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


def test_torch_layer_norm_over_a_ragged_dim():
    xs = _leaves([(3, 5), (1, 5), (4, 5)], 0)
    x = mj.as_nested_tensor(xs)
    _check(torch.layer_norm(x, x.shape[1:]), [F.layer_norm(c, c.shape) for c in xs], xs)
    w = torch.randn(5, dtype=F64, requires_grad=True)
    _check(torch.layer_norm(x, (5,), w, None, 1e-5, False), [F.layer_norm(c, (5,), w) for c in xs], [*xs, w])


@pytest.mark.parametrize("op", ["group_norm", "instance_norm", "batch_norm"])
def test_torch_channel_norms_of_signals(op):
    xs = _leaves([(4, 3), (4, 2), (4, 5)], 1)  # (B, C, j0)
    x = mj.as_nested_tensor(xs, ragged_dims=(2,))
    w, b = (torch.randn(4, dtype=F64, requires_grad=True) for _ in range(2))
    if op == "group_norm":
        out = torch.group_norm(x, 2, w, b, 1e-5, True)
        refs = [F.group_norm(c[None], 2, w, b)[0] for c in xs]
    elif op == "instance_norm":
        out = torch.instance_norm(x, w, b, None, None, True, 0.1, 1e-5, False)
        refs = [F.instance_norm(c[None], weight=w, bias=b)[0] for c in xs]
    else:  # evaluation statistics: per sample, as dense
        rm, rv = torch.randn(4, dtype=F64), torch.rand(4, dtype=F64) + 0.5
        out = torch.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, False)
        refs = [F.batch_norm(c[None], rm, rv, w, b)[0] for c in xs]
    _check(out, refs, [*xs, w, b])


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_torch_bce_with_logits(reduction):
    xs = _leaves([(3, 4), (0, 4), (2, 4)], 2)
    ts = [torch.rand(c.shape, dtype=F64) for c in xs]
    x, t = mj.as_nested_tensor(xs), mj.nested_tensor(ts)
    out = torch.binary_cross_entropy_with_logits(x, t, None, None, reduction)
    per = [F.binary_cross_entropy_with_logits(c, d, reduction="none") for c, d in zip(xs, ts)]
    if reduction == 0:
        _check(out, per, xs)
    else:
        total = sum(p.sum() for p in per)
        _check(out, total / sum(p.numel() for p in per) if reduction == 1 else total, xs)
