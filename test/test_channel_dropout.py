"""``F.dropout1d`` / ``dropout2d`` / ``dropout3d`` on signals, images and volumes with ragged spatial
dims: each channel of each sample is dropped whole or kept scaled by ``1 / (1 - p)`` (every
pixel of it alike), its gradient is the same mask, ``p = 0`` and eval mode are the identity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

F64 = torch.float64
CASES = {
    F.dropout1d: [(3, 4), (3, 0), (3, 6)],
    F.dropout2d: [(3, 4, 5), (3, 0, 2), (3, 2, 3)],
    F.dropout3d: [(2, 2, 3, 2), (2, 1, 1, 1), (2, 3, 2, 2)],
}


@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
@pytest.mark.parametrize("p", [0.3, 0.5, 1.0])
def test_channels_dropped_whole_per_sample(fn, p):
    torch.manual_seed(0)
    comps = [torch.rand(*s, dtype=F64) + 0.5 for s in CASES[fn]]  # no zeros of their own
    ragged = tuple(range(2, len(CASES[fn][0]) + 1))
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves, ragged_dims=ragged)
    out = fn(x, p, True)
    grads = torch.autograd.grad(out.sum(), leaves)
    kept = []
    for o, c, g in zip(out.unbind(), comps, grads):
        for ch in range(c.shape[0]):
            if c[ch].numel() == 0:
                continue
            dropped = bool((o[ch] == 0).all())
            assert dropped or torch.allclose(o[ch], c[ch] / (1 - p)), "a channel is dropped whole or scaled whole"
            torch.testing.assert_close(g[ch], torch.full_like(c[ch], 0.0 if dropped else 1 / (1 - p)))
            kept.append(not dropped)
    if p == 1.0:
        assert not any(kept)
    elif p == 0.5:
        assert any(kept) and not all(kept)  # 12 channels, both outcomes: p(all one way) < 1e-3


@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_channel_dropout_identity_cases_and_errors(fn):
    comps = [torch.rand(*s, dtype=F64) for s in CASES[fn]]
    x = mj.as_nested_tensor(comps, ragged_dims=tuple(range(2, len(CASES[fn][0]) + 1)))
    assert fn(x, 0.5, False) is x and fn(x, 0.0, True) is x
    y = x.clone()
    assert fn(y, 1.0, True, inplace=True) is y and all(bool((c == 0).all()) for c in y.unbind())
    with pytest.raises(ValueError, match="between 0 and 1"):
        fn(x, 1.5, True)
    pairs = torch.nested.nested_tensor([torch.randn(2, 2, 3), torch.randn(1, 1, 3)], layout=mj.multi_jagged)
    with pytest.raises(ValueError, match="channel dim"):
        F.dropout2d(pairs, 0.5, True)


@pytest.mark.parametrize("p", [0.5, 1.0])
def test_dropout1d_of_tokens_drops_each_sample_s_rows_whole(p):
    """``(B, j0, C)``: a sample ``(n, C)`` is dense dropout1d's unbatched input of n channels, so
    each row (token) is dropped whole or kept scaled, its gradient the same mask; eval mode and
    ``nn.Dropout1d().eval()`` are the identity."""
    torch.manual_seed(1)
    comps = [torch.rand(n, 3, dtype=F64) + 0.5 for n in (6, 0, 7)]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    assert F.dropout1d(x, p, False) is x and torch.nn.Dropout1d(p).eval()(x) is x
    out = F.dropout1d(x, p, True)
    grads = torch.autograd.grad(out.sum(), leaves)
    kept = []
    for o, c, g in zip(out.unbind(), comps, grads):
        dropped = (o == 0).all(1)
        torch.testing.assert_close(o[~dropped], c[~dropped] / (1 - p) if p < 1 else c[~dropped])
        torch.testing.assert_close(g, (~dropped).to(F64)[:, None].expand_as(c) / (1 - p if p < 1 else 1))
        kept += (~dropped).tolist()
    assert not any(kept) if p == 1.0 else (any(kept) and not all(kept))
