"""``offsets(dim)``, ``cu_seqlens()`` and ``max_seqlen()``: what users pass to varlen kernels they
call themselves (flash-attn's ``flash_attn_varlen_func``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as tmj
from torch_multijagged.kernels import attention as kattn


def _exclusive(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


@pytest.mark.parametrize("lens", [(3, 0, 5), (1,), (0, 0), (4, 2, 2, 7)])
def test_sequence_accessors(lens):
    x = tmj.nested_tensor([torch.randn(n, 2, 4) for n in lens])
    assert x.cu_seqlens().dtype == torch.int32
    assert torch.equal(x.cu_seqlens(torch.int64), _exclusive(lens))
    assert torch.equal(x.offsets(1), _exclusive(lens)) and x.offsets(1) is x.offsets()
    assert x.max_seqlen() == max(lens)
    xt = x.transpose(1, 2)  # (B, H, j0, D): the same sequences
    assert torch.equal(xt.cu_seqlens(), x.cu_seqlens()) and xt.max_seqlen() == max(lens)
    assert torch.equal(xt.offsets(-2), _exclusive(lens))


def test_pair_rows_are_sequences():
    lens = (3, 0, 2)
    p = tmj.nested_tensor([torch.randn(n, n, 4) for n in lens])
    want = _exclusive([n for n in lens for _ in range(n)])
    assert torch.equal(p.cu_seqlens(torch.int64), want)
    assert p.max_seqlen() == 3
    assert p.offsets(1) is p.offsets(2)  # one nested int for both pair dims


def test_rect_pair_columns_are_sequences():
    a, b = (2, 1, 3), (4, 0, 2)
    x = tmj.nested_tensor([torch.randn(n, 1) for n in a])
    y = tmj.nested_tensor([torch.randn(m, 1) for m in b])
    r = x.unsqueeze(2) + y.unsqueeze(1)  # (B, j0, j1, 1)
    assert torch.equal(r.cu_seqlens(torch.int64), _exclusive([m for n, m in zip(a, b) for _ in range(n)]))
    assert r.max_seqlen() == 4


def test_bad_dims():
    x = tmj.nested_tensor([torch.randn(3, 2)])
    with pytest.raises(ValueError, match="expected a ragged dim"):
        x.offsets(2)


def test_cu_seqlens_drive_a_varlen_kernel():
    """The packed values with cu_seqlens are exactly a varlen kernel's input."""
    lens = (3, 0, 5)
    x = tmj.nested_tensor([torch.randn(n, 2, 4, dtype=torch.float64) for n in lens])
    cu = x.cu_seqlens(torch.int64)
    out, _ = kattn.attention_reference(x.values(), x.values(), x.values(), cu, cu)
    q = x.transpose(1, 2)
    want = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).values()
    torch.testing.assert_close(out, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_cu_seqlens_drive_flash_attn_cuda():
    flash_attn = pytest.importorskip("flash_attn")
    lens = (3, 0, 5)
    x = tmj.nested_tensor([torch.randn(n, 2, 64, dtype=torch.float16) for n in lens]).to("cuda")
    v = x.values()
    out = flash_attn.flash_attn_varlen_func(v, v, v, x.cu_seqlens(), x.cu_seqlens(), x.max_seqlen(), x.max_seqlen())
    q = x.transpose(1, 2)
    want = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).values()
    torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3)
