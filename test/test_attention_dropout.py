"""Attention dropout on multi_jagged batches: seeded runs reproduce, the keep rate and the
expectation match ``p``, ``p → 1`` stays finite, and a fixed seed passes gradcheck — on every CPU
backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from test_attention import CPU_BACKENDS, D, H, _qkv, _t, _using

sdpa = F.scaled_dot_product_attention


@pytest.mark.parametrize("bk", CPU_BACKENDS)
def test_dropout_seeded_runs_reproducible(bk):
    q, k, v = _qkv([4, 0, 6, 2], 0, requires_grad=True)
    runs = []
    with _using(bk):
        for s in (7, 7, 8):
            torch.manual_seed(s)
            out = sdpa(_t(q), _t(k), _t(v), dropout_p=0.4)
            grads = torch.autograd.grad((out.values() ** 2).sum(), (q, k, v))
            runs.append((out.values(), *[g.values() for g in grads]))
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1])), "same seed: identical outputs and grads"
    assert not torch.equal(runs[0][0], runs[2][0]), "another seed: another keep mask"
    nodrop = sdpa(_t(q), _t(k), _t(v)).values()
    assert not torch.equal(runs[0][0], nodrop)


@pytest.mark.parametrize("bk", CPU_BACKENDS)
def test_dropout_keep_rate_and_expectation(bk):
    """With one key per sample and v = 1 every output entry is ``keep / (1 - p)``: the fraction
    of zeros estimates p (binomial, ~900 draws). Averaged over seeds, dropout is unbiased."""
    p = 0.3
    ns = [40, 0, 50, 60]
    q = mj.nested_tensor([torch.randn(n, H, D) for n in ns], ragged_dims=(1,))
    k = mj.nested_tensor([torch.randn(1, H, D) for _ in ns], ragged_dims=(1,))
    v = mj.nested_tensor([torch.ones(1, H, D) for _ in ns], ragged_dims=(1,))
    with _using(bk):
        torch.manual_seed(0)
        out = sdpa(_t(q), _t(k), _t(v), dropout_p=p).values()
    vals = out[..., 0]  # (T, H): one draw per (query, head)
    kept = torch.isclose(vals, torch.tensor(1 / (1 - p), dtype=vals.dtype))
    assert bool((kept | (vals == 0)).all()), "every entry is 0 or 1 / (1 - p)"
    frac = 1 - kept.double().mean().item()
    assert abs(frac - p) < 0.06, f"dropped fraction {frac:.3f} vs p = {p}"
    # unbiased: E[out] = out without dropout (general q/k/v), up to the Monte-Carlo error
    q, k, v = _qkv([5, 0, 3], 1)
    ref = sdpa(_t(q), _t(k), _t(v)).values()
    with _using(bk):
        draws = []
        for s in range(100):
            torch.manual_seed(s)
            draws.append(sdpa(_t(q), _t(k), _t(v), dropout_p=0.2).values())
    draws = torch.stack(draws)
    # every entry within 5 standard errors of the no-dropout value
    assert bool(((draws.mean(0) - ref).abs() <= 5 * draws.std(0) / 10 + 1e-6).all())


@pytest.mark.parametrize("bk", CPU_BACKENDS)
@pytest.mark.parametrize("p", [0.999, 1.0])
def test_dropout_p_to_one_is_finite(bk, p):
    """p → 1 keeps outputs and gradients finite; p = 1 gives zeros, as dense SDPA (F.dropout)."""
    q, k, v = _qkv([3, 0, 4], 2, requires_grad=True)
    with _using(bk):
        torch.manual_seed(0)
        out = sdpa(_t(q), _t(k), _t(v), dropout_p=p)
        grads = torch.autograd.grad(out.values().sum(), (q, k, v))
    assert bool(torch.isfinite(out.values()).all())
    assert all(bool(torch.isfinite(g.values()).all()) for g in grads)
    if p == 1.0:
        dense = sdpa(_t(q.unbind()[0]), _t(k.unbind()[0]), _t(v.unbind()[0]), dropout_p=1.0)
        assert torch.equal(dense, torch.zeros_like(dense))
        assert torch.equal(out.values(), torch.zeros_like(out.values()))


@pytest.mark.parametrize("bk", ["reference", "loop", "bucketed"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_dropout_gradcheck_fixed_seed(bk, with_mask):
    """Under a fixed seed the keep mask is a function of the seed, so the op is a smooth function
    of q, k, v (and a float mask): gradcheck in float64."""
    ns, ms = [3, 0, 2], [2, 3, 0]
    sizes_q, sizes_k = torch.tensor(ns), torch.tensor(ms)
    off = lambda s: torch.cat([torch.zeros(1, dtype=torch.int64), s.cumsum(0)])  # noqa: E731
    g = torch.Generator().manual_seed(0)
    qv = torch.randn(sum(ns), H, D, generator=g, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(sum(ms), H, D, generator=g, dtype=torch.float64, requires_grad=True)
    vv = torch.randn(sum(ms), H, D, generator=g, dtype=torch.float64, requires_grad=True)
    mv = torch.randn(sum(n * m for n, m in zip(ns, ms)), generator=g, dtype=torch.float64, requires_grad=True)
    msizes = torch.tensor([[n, m] for n, m in zip(ns, ms)])
    moff = off(torch.tensor([n * m for n, m in zip(ns, ms)]))

    def f(qv, kv, vv, mv):
        q = mj.from_packed(qv, off(sizes_q), sizes_q, (1,))
        k = mj.from_packed(kv, off(sizes_k), sizes_k, (1,))
        v = mj.from_packed(vv, off(sizes_k), sizes_k, (1,))
        m = mj.from_packed(mv, moff, msizes, (1, 2)).unsqueeze(1) if with_mask else None
        with _using(bk):
            torch.manual_seed(1234)
            return sdpa(_t(q), _t(k), _t(v), attn_mask=m, dropout_p=0.3).values()

    with _using(bk):
        assert torch.autograd.gradcheck(f, (qv, kv, vv, mv), atol=1e-6, fast_mode=True)
