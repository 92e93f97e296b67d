"""The rows of a pair folded into the batch (NOTE [ Rows as samples ]): ``z.reshape(-1, n, C)`` of
``(B, n, n, C)`` is a batch of ``Σ nᵢ`` sequences, and ``reshape(B, n, n, C)`` brings it back —
triangle attention's ``pack_one`` / ``repeat(bias, 'b ... -> (b r) ...')`` / ``unpack``, per
sample, with gradients of every leaf and a zero-length sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import pack, rearrange, repeat, unpack

import torch_multijagged as mj
from torch_multijagged.errors import StructureError

from _reference import R, per_sample_check
from _structures import comps_for

F64 = torch.float64
SQUARE = [(3, 3, 4), (0, 0, 4), (2, 2, 4), (1, 1, 4)]
RECT = [(3, 2, 4), (0, 5, 4), (2, 1, 4)]


def test_merge_is_the_rows_and_splits_back():
    comps = comps_for(SQUARE, 1)
    z = mj.nested_tensor(comps, ragged_dims=(1, 2))
    rows = z.reshape(-1, z.shape[2], 4)
    assert rows.shape[0] == sum(c.shape[0] for c in comps) and rows.ragged_dims == (1,)
    want = [row for c in comps for row in c.unbind(0)]
    assert len(rows.unbind()) == len(want) and all(torch.equal(a, b) for a, b in zip(rows.unbind(), want))
    assert rows.values().data_ptr() == z.values().data_ptr()  # zero-copy
    for back in (rows.reshape(z.shape[0], z.shape[1], rows.shape[1], 4), rows.view(-1, z.shape[1], z.shape[2], 4),
                 rows.unflatten(0, (z.shape[0], z.shape[1]))):
        assert back.shape == z.shape  # the pair's own nested ints
        assert all(torch.equal(a, b) for a, b in zip(back.unbind(), comps))
    flat = z.flatten(0, 1)
    assert flat.shape == rows.shape  # one merged extent for one pair: the same nested ints


@pytest.mark.parametrize("shapes", [SQUARE, RECT], ids=["square", "rect"])
def test_an_op_along_each_row_per_sample(shapes):
    comps = comps_for(shapes, 2)

    def fn(z):
        rows = z.reshape(-1, z.shape[2], z.shape[3])
        out = rows.softmax(1) * rows.sum(1, keepdim=True)  # over each row's columns
        return out.reshape(z.shape[0], z.shape[1], out.shape[1], out.shape[2])

    per_sample_check(fn, R(comps, (1, 2)), ref=lambda c: c.softmax(1) * c.sum(1, keepdim=True))


def test_no_leakage_between_samples():
    comps = comps_for(SQUARE, 3)
    fn = lambda z: unpack(pack([z], "* n d")[0].cumsum(1), pack([z], "* n d")[1], "* n d")[0]  # noqa: E731
    base = fn(mj.nested_tensor(comps, ragged_dims=(1, 2)))
    changed = [c.clone() for c in comps]
    changed[2] = torch.randn(5, 5, 4, dtype=F64)
    other = fn(mj.nested_tensor(changed, ragged_dims=(1, 2)))
    for i in (0, 1, 3):
        torch.testing.assert_close(other.unbind()[i], base.unbind()[i])


def _triangle_attention(z, w_bias, heads):
    """alphafold3-pytorch's TriangleAttention (starting node) written with einops, no mask."""
    bias = rearrange(z @ w_bias, "... i j h -> ... h i j")
    bias = repeat(bias, "b ... -> (b r) ...", r=z.shape[1])
    rows, ps = pack([z], "* n d")
    q = rearrange(rows, "b n (h d) -> b h n d", h=heads)
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    return unpack(rearrange(out, "b h n d -> b n (h d)"), ps, "* n d")[0]


def test_triangle_attention_per_sample_with_gradients():
    comps = comps_for(SQUARE, 4)
    w = torch.randn(4, 2, dtype=F64)
    per_sample_check(lambda z, w: _triangle_attention(z, w, 2), R(comps, (1, 2)), w,
                     ref=lambda c, w: _triangle_attention(c.unsqueeze(0), w, 2)[0] if c.shape[0] else c * 0)


def test_a_merge_that_is_not_one_raises_or_stays():
    z = mj.nested_tensor(comps_for(SQUARE, 5), ragged_dims=(1, 2))
    other = mj.nested_tensor(comps_for([(2, 2, 4), (0, 0, 4), (3, 3, 4), (1, 1, 4)], 7), ragged_dims=(1, 2))
    with pytest.raises(mj.StructureError):
        z.reshape(-1, other.shape[2], 4)  # another batch's ragged size (other lengths)
    rows = z.reshape(-1, z.shape[2], 4)
    twin = mj.nested_tensor(comps_for(SQUARE, 7), ragged_dims=(1, 2))  # built apart, equal lengths: as z's own
    assert torch.equal(z.reshape(-1, twin.shape[2], 4).values(), rows.values())
    with pytest.raises(mj.StructureError):
        rows.reshape(z.shape[0], other.shape[1], rows.shape[1], 4)
    x = mj.nested_tensor(comps_for([(3, 4), (2, 4)], 6))
    assert type(x.reshape(-1, 4)) is not mj.MultiJaggedTensor  # no ragged dim left: the flattened batch


def test_folding_rows_while_splitting_heads_says_how():
    """``reshape(B * n, n, H, D)`` folds the rows and splits the features at once: refused for any
    batch size alike, with the two-step spelling that works."""
    for lens in [(2, 1), (3, 0, 5), (4,)]:
        z = mj.nested_tensor([torch.randn(n, n, 8) for n in lens], ragged_dims=(1, 2))
        B, N, N2, C = z.shape
        if B == 2:
            continue  # B equals the first head factor: the request reads as another view
        with pytest.raises(StructureError, match=r"fold the rows of dim 1 into the batch.*unflatten"):
            z.reshape(B * N, N2, 2, 4)
        two = z.reshape(B * N, N2, C).unflatten(-1, (2, 4))
        ref = [row.reshape(row.shape[0], 2, 4) for zi in z.unbind() for row in zi]
        assert all(torch.equal(a, b) for a, b in zip(two.unbind(), ref))
