"""Modules on a batch without samples (B = 0), as dense torch runs them on a ``(0, …)`` batch: an
empty result of the right structure and dtype, on the graph of the inputs (a backward runs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_multijagged as mj

DT = torch.float64


def _empty(static, ragged_dims, requires_grad=True) -> mj.MultiJaggedTensor:
    values = torch.zeros((0, *static), dtype=DT, requires_grad=requires_grad)
    off = torch.zeros(1, dtype=torch.int64)
    return mj.from_packed(values, off, torch.zeros(0, len(ragged_dims), dtype=torch.int64), ragged_dims)


def _backward_runs(out, x):
    (g,) = torch.autograd.grad((out.values() if mj.is_nested(out) else out).sum(), x, allow_unused=True)
    assert g is None or g.numel() == 0


def test_group_norm_of_no_images_and_no_signals():
    for static, rd in [((3,), (2, 3)), ((3,), (2,))]:  # (0, 3, j0, j1) images, (0, 3, j0) signals
        x = _empty(static, rd)
        gn = torch.nn.GroupNorm(3, 3).double()
        out = gn(x)
        assert out.shape[0] == 0 and out._ragged_dims == rd and out.dtype == DT
        _backward_runs(out, x)


def test_attention_weights_of_dense_queries_over_no_memory():
    """DETR-style dense queries ``(0, L, E)`` over an empty multi_jagged memory: the output and the
    weights ``(0, [H,] L, j)`` as dense's ``(0, L, E)`` and ``(0, [H,] L, S)``."""
    mem = _empty((8,), (1,))
    q = torch.zeros(0, 3, 8, dtype=DT, requires_grad=True)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    for average, shape in ((True, (0, 3)), (False, (0, 2, 3))):
        out, w = mha(q, mem, mem, average_attn_weights=average)
        assert out.shape == (0, 3, 8) and tuple(w.shape[:-1]) == shape and w._ragged_dims == (len(shape),)
        (g,) = torch.autograd.grad(out.sum() + w.values().sum(), q)
        assert g.shape == q.shape


def test_pooling_the_static_last_dim_of_no_tokens():
    x = _empty((6,), (1,))
    for out in (F.avg_pool1d(x, 2), F.max_pool1d(x, 2), F.lp_pool1d(x, 2, 2)):
        assert out.shape[0] == 0 and out._values.shape == (0, 3)
    out, idx = F.max_pool1d(x, 2, return_indices=True)
    assert out._values.shape == idx._values.shape == (0, 3) and idx.dtype == torch.int64
    _backward_runs(F.avg_pool1d(x, 2), x)


def test_mode_along_one_of_two_ragged_dims_of_no_samples():
    # the structure median gives: the other ragged dim kept, the reduced one dropped (or kept as 1)
    x = _empty((2,), (1, 2), requires_grad=False)
    for d in (1, 2):
        for keepdim in (False, True):
            v, i = x.mode(d, keepdim=keepdim)
            m = x.median(d, keepdim=keepdim).values
            assert v.shape[0] == 0 and v._ragged_dims == m._ragged_dims and v.dim() == m.dim()
            assert v.values().shape == m.values().shape and i.values().shape == m.values().shape
            assert v.dtype == DT and i.dtype == torch.int64
