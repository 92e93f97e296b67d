"""Contractions run as the dense op sample by sample (NOTE [ Contractions sample by sample ]) and
``einsum`` forms that are a per-sample matmul in another subscript order (``matmul_form``):
triangle attention's ``(B, j0, H, j0, d) @ (B, j0, H, d, j0)``, the outer-product mean, attention
with the heads between the rows — against the per-sample reference, values and the gradients of
every leaf, float32 and float64, a zero-length sample, second order; the broadcast product is
never taken on these paths (a spy), and the cost rule keeps it for tiny samples."""

from __future__ import annotations

import contextlib

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.ops.contractions import einsum as ein, matmul as mm, sample_einsum as se

from _reference import general_path

H, D, S = 2, 3, 2


def _einsum(eq):
    lhs, out = eq.split("->")
    per = eq if "..." in eq else ",".join(t[1:] if t[0] == "b" else t for t in lhs.split(",")) + "->" + out[1:]
    return (lambda *xs: torch.einsum(eq, *xs)), (lambda *xs: torch.einsum(per, *xs))


# name: (operands as (component shape of n, ragged dims) or a dense shape, batched call, per-sample call)
CASES = {
    "matmul ragged lead q @ kT": ([(lambda n: (n, H, n, D), (1, 3)), (lambda n: (n, H, n, D), (1, 3))],
                                  lambda q, k: q @ k.transpose(-1, -2), lambda q, k: q @ k.transpose(-1, -2)),
    "matmul ragged lead attn @ v": ([(lambda n: (n, H, n, n), (1, 3, 4)), (lambda n: (n, H, n, D), (1, 3))],
                                    lambda a, v: torch.matmul(a, v), lambda a, v: torch.matmul(a, v)),
    "outer mean ...bac,...dae->...bdce": ([(lambda n: (n, S, 2), (1,)), (lambda n: (n, S, 3), (1,))],
                                          *_einsum("...bac,...dae->...bdce")),
    "outer mean bsic,bsjd->bijcd": ([(lambda n: (S, n, 2), (2,)), (lambda n: (S, n, 3), (2,))],
                                    *_einsum("bsic,bsjd->bijcd")),
    "pair weighted bhij,bhsjd->bhsid": ([(lambda n: (H, n, n), (2, 3)), (lambda n: (H, S, n, D), (3,))],
                                        *_einsum("bhij,bhsjd->bhsid")),
    "dense operand bic,bjd,cd->bij": ([(lambda n: (n, 2), (1,)), (lambda n: (n, 3), (1,)), (2, 3)],
                                      *_einsum("bic,bjd,cd->bij")),
    "dense result bijc,bijc->bc": ([(lambda n: (n, n, 2), (1, 2)), (lambda n: (n, n, 2), (1, 2))],
                                   *_einsum("bijc,bijc->bc")),
    # a per-sample matmul in another subscript order (the heads between the rows)
    "scores bihd,bjhd->bhij": ([(lambda n: (n, H, D), (1,)), (lambda n: (n, H, D), (1,))], *_einsum("bihd,bjhd->bhij")),
    "attention out bhij,bjhd->bihd": ([(lambda n: (H, n, n), (2, 3)), (lambda n: (n, H, D), (1,))],
                                      *_einsum("bhij,bjhd->bihd")),
    "scores out last bihd,bjhd->bijh": ([(lambda n: (n, H, D), (1,)), (lambda n: (n, H, D), (1,))],
                                        *_einsum("bihd,bjhd->bijh")),
    "contract rows bjhc,bjhd->bhcd": ([(lambda n: (n, H, 2), (1,)), (lambda n: (n, H, D), (1,))],
                                      *_einsum("bjhc,bjhd->bhcd")),
    # a static size-1 dim broadcast against another size, as dense einsum broadcasts it
    "msa weighted ...hqk,...hkc->...qhc": ([(lambda n: (1, H, n, n), (3, 4)), (lambda n: (S, H, n, D), (3,))],
                                           *_einsum("...hqk,...hkc->...qhc")),
    "msa weighted, ones on the right": ([(lambda n: (S, H, n, n), (3, 4)), (lambda n: (1, H, n, D), (3,))],
                                        *_einsum("...hqk,...hkc->...qhc")),
}


@pytest.fixture
def per_sample_only(monkeypatch):
    """Every contraction sample by sample (the cost rule off), the broadcast product a failure."""
    monkeypatch.setattr(se, "_PER_SAMPLE_ELEMENTS", 0)

    def refuse(*args, **kwargs):
        raise AssertionError("the broadcast product was taken")

    monkeypatch.setattr(ein, "_broadcast_einsum", refuse)
    monkeypatch.setattr(mm, "broadcast_matmul", refuse)


def _operands(specs, lens, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    ops, leaves, per = [], [], []
    for spec in specs:
        if callable(spec[0]):
            shape, ragged = spec
            comps = [torch.randn(shape(n), generator=g, dtype=dtype).requires_grad_() for n in lens]
            ops.append(mj.as_nested_tensor(comps, ragged_dims=ragged))
            leaves += comps
            per.append(comps)
        else:
            t = torch.randn(spec, generator=g, dtype=dtype).requires_grad_()
            ops.append(t)
            leaves.append(t)
            per.append([t] * len(lens))
    return ops, leaves, per


def _check(case, lens, dtype):
    specs, batched, per_sample = CASES[case]
    ops, leaves, per = _operands(specs, lens, dtype)
    out = batched(*ops)
    refs = [per_sample(*xs) for xs in zip(*per)]
    got = list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out)
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for i, (a, r) in enumerate(zip(got, refs)):
        assert a.shape == r.shape and a.dtype == r.dtype, f"sample {i}: {a.shape} {a.dtype} != {r.shape} {r.dtype}"
        torch.testing.assert_close(a, r, **tol, msg=lambda m: f"sample {i}: {m}")
    g = torch.Generator().manual_seed(1)
    cot = [torch.randn(r.shape, generator=g, dtype=dtype) for r in refs]
    g1 = torch.autograd.grad(sum((a * c).sum() for a, c in zip(got, cot)), leaves)
    g2 = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cot)), leaves)
    for k, (a, r) in enumerate(zip(g1, g2)):
        torch.testing.assert_close(a, r, **tol, msg=lambda m: f"leaf {k}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_per_sample_contraction(per_sample_only, case, dtype):
    _check(case, (4, 0, 3, 1), dtype)


@pytest.mark.parametrize("case", ["matmul ragged lead q @ kT", "outer mean ...bac,...dae->...bdce",
                                  "pair weighted bhij,bhsjd->bhsid", "msa weighted ...hqk,...hkc->...qhc"])
def test_large_samples_take_the_per_sample_path(monkeypatch, case):
    """At sizes where the broadcast product is large, the cost rule picks the samples."""
    def refuse(*args, **kwargs):
        raise AssertionError("the broadcast product was taken")

    monkeypatch.setattr(ein, "_broadcast_einsum", refuse)
    monkeypatch.setattr(mm, "broadcast_matmul", refuse)
    _check(case, (60, 0, 50), torch.float32)


def test_tiny_samples_keep_the_broadcast_product(monkeypatch):
    called = []
    broadcast = mm.broadcast_matmul
    monkeypatch.setattr(mm, "broadcast_matmul", lambda *a: called.append(1) or broadcast(*a))
    _check("matmul ragged lead q @ kT", (2, 0, 3), torch.float64)
    assert called


@pytest.mark.parametrize("case", ["matmul ragged lead q @ kT", "outer mean bsic,bsjd->bijcd",
                                  "scores bihd,bjhd->bhij", "dense result bijc,bijc->bc",
                                  "msa weighted ...hqk,...hkc->...qhc"])
def test_second_order(per_sample_only, case):
    specs, batched, _ = CASES[case]
    lens = (2, 0, 3)
    _, leaves, _ = _operands(specs, lens, torch.float64)

    def f(*flat):
        it = iter(flat)
        ops = [mj.as_nested_tensor([next(it) for _ in lens], ragged_dims=s[1]) if callable(s[0]) else next(it)
               for s in specs]
        out = batched(*ops)
        return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

    assert torch.autograd.gradgradcheck(f, tuple(leaves))


def test_empty_batch_and_no_leakage(per_sample_only):
    specs, batched, _ = CASES["outer mean bsic,bsjd->bijcd"]
    ops, _, per = _operands(specs, (3, 2, 4), torch.float64)
    other = [list(p) for p in per]
    other[0][1] = (other[0][1] + 1).detach()
    a = batched(*ops).unbind()
    b = batched(*[mj.as_nested_tensor(p, ragged_dims=s[1]) for p, s in zip(other, specs)]).unbind()
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and not torch.equal(a[1], b[1])


@pytest.mark.parametrize("case", ["scores bihd,bjhd->bhij", "attention out bhij,bjhd->bihd", "scores out last bihd,bjhd->bijh",
                                  "contract rows bjhc,bjhd->bhcd"])
@pytest.mark.parametrize("general", [False, True])
def test_heads_between_rows_take_the_per_sample_matmul(monkeypatch, case, general):
    """``einsum`` forms that are a per-sample matmul of permuted operands run as one (``matmul_form``),
    on the eager values path and on the general path alike."""
    from torch_multijagged.kernels import ragged_mm as kmm

    called = []
    ragged_matmul = kmm.ragged_matmul
    monkeypatch.setattr(kmm, "ragged_matmul", lambda *a: called.append(1) or ragged_matmul(*a))
    with general_path() if general else contextlib.nullcontext():
        _check(case, (5, 0, 3), torch.float64)
    assert called
