"""unbind / x[i]: views without gradients (as torch.jagged), differentiable otherwise."""

import torch

import torch_multijagged as mj


def test_unbind_without_grad_returns_views():
    comps = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(1, 3)]
    x = mj.nested_tensor(comps)
    parts = x.unbind()
    assert all(p._base is not None for p in parts)
    parts[0].zero_()  # a view: writes through to the packed values
    assert torch.equal(x.values()[:2], torch.zeros(2, 3))
    assert torch.equal(x[2], comps[2])


def test_unbind_with_grad_is_differentiable():
    comps = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(1, 3)]
    x = mj.nested_tensor(comps, requires_grad=True)
    a, b, c = x.unbind()
    (a.sum() * 2 + (c * c).sum() + x[0][1].sum()).backward()
    # d/da = 2 (+1 on row 1 from x[0][1]); d/dc = 2c; the empty sample has no elements
    expected = torch.cat([torch.full((2, 3), 2.0) + torch.tensor([[0.0], [1.0]]), 2 * comps[2]])
    torch.testing.assert_close(x.grad.values(), expected)


def test_tolist_is_each_samples_lists():
    """``x.tolist()``: one nested list per sample, its own lengths (dense ``tolist`` of each
    component), for every structure, an empty sample, integers, and B = 0."""
    from hypothesis import given

    from _reference import ALL_LAYOUTS, few, seeds, structures
    from hypothesis import strategies as st

    @few(10)
    @given(st.sampled_from(ALL_LAYOUTS).flatmap(lambda lay: structures(lay, min_batch=0)), seeds)
    def check(s, seed):
        comps = s.components(seed)
        x = mj.nested_tensor(comps, ragged_dims=s.layout.ragged_dims) if comps else None
        if x is None:
            return
        assert x.tolist() == [c.tolist() for c in comps]
        assert x.long().tolist() == [c.long().tolist() for c in comps]
        assert x.requires_grad_().tolist() == [c.tolist() for c in comps]

    check()
    assert mj.nested_tensor([torch.ones(2, 3)])[:0].tolist() == []
