"""Ops on the static trailing dims of each packed row and over every element of the batch (NOTE
[ Ops on the trailing dims ] in ``ops/elementwise/trailing.py``): the FFT family, complex views,
``diag_embed``, ``unique``, ``histc`` — against the dense op on each sample (or on the
concatenated samples), with gradients to every element and a zero-length sample."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from _reference import R, SEQ, empty_batch, SQUARE, STATIC_LEAD, components, few, per_sample_check, seeds, structures
from _structures import lengths

F64 = torch.float64
FFT_1D = {
    "fft": lambda x, d: torch.fft.fft(x, dim=d).abs(),
    "ifft": lambda x, d: torch.fft.ifft(x, dim=d).abs(),
    "rfft": lambda x, d: torch.view_as_real(torch.fft.rfft(x, dim=d, norm="ortho")),
    "irfft": lambda x, d: torch.fft.irfft(torch.fft.rfft(x, dim=d), n=x.shape[d], dim=d),
    "hfft": lambda x, d: torch.fft.hfft(x, n=4, dim=d),
    "ihfft": lambda x, d: torch.fft.ihfft(x, dim=d).abs(),
}


def _empty_safe(fn):
    """``fn`` on a component; for an empty one (dense FFTs raise inside MKL on zero rows) the
    output of a one-long component cut back to zero along the empty dims."""
    def ref(c):
        if c.numel():
            return fn(c)
        empty = [d for d, n in enumerate(c.shape) if n == 0]
        out = fn(torch.ones([1 if n == 0 else n for n in c.shape], dtype=c.dtype))
        for d in empty:
            out = out.narrow(d, 0, 0)
        return out
    return ref


@pytest.mark.parametrize("name", sorted(FFT_1D))
@few(6)
@given(s=structures(SEQ, min_c=2, max_c=5) | structures(SQUARE, min_c=2, max_c=5) | structures(STATIC_LEAD, min_c=2, max_c=4),
       seed=seeds)
def test_fft_along_a_static_dim_per_sample(name, s, seed):
    fn = FFT_1D[name]
    per_sample_check(lambda x: fn(x, -1), R(s.components(seed), s.ragged_dims), ref=_empty_safe(lambda c: fn(c, -1)), seed=seed)


@few(6)
@given(structures(STATIC_LEAD, min_c=2, max_c=4, min_s=2), seeds)
def test_fftn_over_static_dims_around_a_ragged_one(s, seed):
    # (B, S, j0, C): the static dims 1 and 3, on each side of the ragged dim
    per_sample_check(lambda x: torch.fft.fftn(x, dim=(1, 3)).abs(), R(s.components(seed), s.ragged_dims),
                     ref=_empty_safe(lambda c: torch.fft.fftn(c, dim=(0, 2)).abs()), seed=seed)


@pytest.mark.parametrize("name", sorted(FFT_1D))
@pytest.mark.parametrize("comps", [
    [torch.rand(0, 0, 5, dtype=F64)],  # every sample empty: no packed row
    [torch.rand(3, 0, 4, dtype=F64), torch.rand(2, 0, 4, dtype=F64)],  # rows, but an empty static dim
], ids=["no_row", "empty_static_dim"])
def test_fft_of_a_batch_without_elements_keeps_shape_and_dtype(name, comps):
    # MKL refuses to transform no element; the result still has each sample's shape and dense's
    # dtype (a real irfft of complex rows stays real), and a zero gradient reaches the input
    fn = FFT_1D[name]
    per_sample_check(lambda x: fn(x, -1), R(comps, (1, 2) if comps[0].shape[0] == 0 else (1,)),
                     ref=_empty_safe(lambda c: fn(c, -1)), seed=0)


FFT_RAGGED = {  # (batched call, per-sample call on a component): transforms whose ragged lengths stay
    "fft": (lambda x: torch.fft.fft(x, dim=1).abs(), lambda c: torch.fft.fft(c, dim=0).abs()),
    "ifft": (lambda x: torch.fft.ifft(x, dim=1, norm="ortho").imag, lambda c: torch.fft.ifft(c, dim=0, norm="ortho").imag),
    "fftn": (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, lambda c: torch.fft.fftn(c, dim=(0, 1)).real),  # FNet
    "fft2 pair": (lambda x: torch.fft.fft2(x, dim=(1, 2)).abs(), lambda c: torch.fft.fft2(c, dim=(0, 1)).abs()),
    "fftn lead": (lambda x: torch.fft.fftn(x, dim=(2, 3)).real, lambda c: torch.fft.fftn(c, dim=(1, 2)).real),  # (B, S, j0, C)
    "rfftn": (lambda x: torch.view_as_real(torch.fft.rfftn(x, dim=(1, -1))),
              lambda c: torch.view_as_real(torch.fft.rfftn(c, dim=(0, -1)))),
    "irfftn": (lambda x: torch.fft.irfftn(torch.fft.fft(x, dim=-1), s=(-1, 4), dim=(1, -1)),
               lambda c: torch.fft.irfftn(torch.fft.fft(c, dim=-1), s=(-1, 4), dim=(0, -1))),
}


@pytest.mark.parametrize("name", sorted(FFT_RAGGED))
@few(6)
@given(ns=st.lists(st.integers(1, 5), min_size=1, max_size=4), c=st.integers(1, 3), seed=seeds)
def test_fft_along_a_ragged_dim_per_sample(name, ns, c, seed):
    # each sample's own length (dense torch refuses an empty one, so the samples are not empty)
    fn, ref = FFT_RAGGED[name]
    g = torch.Generator().manual_seed(seed)
    kind = name.split()[-1]
    lead = {"pair": (), "lead": (2,)}.get(kind, ())
    comps = [torch.randn(*lead, *((n, n) if kind == "pair" else (n,)), c, generator=g, dtype=F64) for n in ns]
    per_sample_check(fn, R(comps, {"pair": (1, 2), "lead": (2,)}.get(kind, (1,))), ref=ref, seed=seed)


@pytest.mark.parametrize("name", ["hfft2", "hfftn", "ihfft2", "ihfftn"])
def test_hermitian_nd_ffts_over_static_dims_and_their_refusal(name):
    """``fft.hfft2`` / ``hfftn`` / ``ihfft2`` / ``ihfftn`` over the static dims of ``(B, j0, H, W)``
    are the dense transform per sample, gradients included; along a ragged dim they raise as
    ``hfft`` does (each sample's output length would be a new ragged size)."""
    f = getattr(torch.fft, name)
    real = name.startswith("i")
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 6, 5, dtype=F64 if real else torch.complex128, generator=g).requires_grad_() for n in (7, 3)]
    kw = {} if name.endswith("2") else dict(dim=(-2, -1))
    out = f(mj.as_nested_tensor(comps), **kw)
    refs = [f(c, **kw) for c in comps]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    got = torch.autograd.grad(sum((a.abs() ** 2).sum() for a in out.unbind()), comps)
    want = torch.autograd.grad(sum((r.abs() ** 2).sum() for r in refs), comps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    x = mj.nested_tensor([torch.randn(6, n, dtype=F64 if real else torch.complex128) for n in (7, 6)])
    with pytest.raises(StructureError, match="ragged dim 2.*new ragged size"):
        f(x, dim=(-2, -1))


@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
def test_fftshift_over_static_dims_per_sample(name):
    """``fft.fftshift`` / ``ifftshift`` over static dims roll each sample by dense's half sizes
    (odd sizes tell the two apart), gradients included; without dims, or over a ragged one (a shift
    per sample), they raise."""
    f = getattr(torch.fft, name)
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, 5, dtype=F64, generator=g, requires_grad=True) for n in (3, 0, 2)]
    x = mj.as_nested_tensor(comps)
    for dims in ((-2, -1), -1, 2):
        out = f(x, dim=dims)
        ref_dims = tuple(d - 1 if d > 0 else d for d in (dims if isinstance(dims, tuple) else (dims,)))
        for a, c in zip(out.unbind(), comps):
            assert torch.equal(a, f(c, dim=ref_dims))
    gx = torch.autograd.grad((f(x, dim=-1) * x).sum(), comps)
    want = torch.autograd.grad(sum((f(c, dim=-1) * c).sum() for c in comps), comps)
    for a, b in zip(gx, want):
        torch.testing.assert_close(a, b)
    for bad in (dict(), dict(dim=1), dict(dim=0)):
        with pytest.raises(StructureError, match=name):
            f(x, **bad)


def test_fft_along_a_ragged_dim_refusals():
    x = torch.nested.nested_tensor([torch.rand(3, 2), torch.rand(1, 2)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match=r"fft.rfft\(\).*ragged dim 1.*new ragged size"):
        torch.fft.rfft(x, dim=1)
    with pytest.raises(StructureError, match=r"fft.rfftn\(\).*ragged dim 1"):
        torch.fft.rfftn(x, dim=(2, 1))  # the halved dim would be the ragged one
    with pytest.raises(StructureError, match="would make it static"):
        torch.fft.fft(x, n=4, dim=1)
    with pytest.raises(StructureError, match="give dim"):
        torch.fft.fftn(x)
    empty = torch.nested.nested_tensor([torch.rand(3, 2), torch.rand(0, 2)], layout=mj.multi_jagged)
    with pytest.raises(RuntimeError, match=r"sample 1 of \(2, j\d+, 2\)"):
        torch.fft.fft(empty, dim=1)  # as dense torch refuses the empty sample
    none = empty_batch((0, 3), (1,), dtype=F64, requires_grad=True)  # B = 0: shape and dtype from a probe
    out = torch.fft.rfftn(none, dim=(1, 2))
    assert out.shape[0] == 0 and out.shape[2] == 2 and out.dtype == torch.complex128


@few(8)
@given(structures(SEQ, min_c=1, max_c=3) | structures(SQUARE, min_c=1, max_c=3), seeds)
def test_real_and_imag_of_complex_values(s, seed):
    comps = [torch.complex(c, c.flip(-1) if c.numel() else c) for c in s.components(seed)]
    for f in (lambda t: t.real, lambda t: t.imag * 2, lambda t: torch.real(t).sin(), lambda t: torch.view_as_real(t)):
        per_sample_check(f, R(comps, s.ragged_dims), seed=seed)


@few(8)
@given(structures(SEQ, min_c=1, max_c=3), seeds)
def test_rotary_embedding_through_complex_views(s, seed):
    """LLaMA's reference rotary embedding: pairs of features as complex numbers times per-position
    rotations (one per sample and position, a multi_jagged complex tensor)."""
    g = torch.Generator().manual_seed(seed)
    comps = s.components(seed)
    comps = [torch.cat([c, c], -1) for c in comps]  # an even feature count
    angles = [torch.rand(c.shape[0], c.shape[1] // 2, dtype=F64, generator=g) for c in comps]
    rot = mj.as_nested_tensor([torch.polar(torch.ones_like(a), a) for a in angles])

    def ours(x):
        return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rot).flatten(-2)

    refs = [torch.view_as_real(torch.view_as_complex(c.unflatten(-1, (-1, 2))) * torch.polar(torch.ones_like(a), a)).flatten(-2)
            for c, a in zip(comps, angles)]
    leaves = [c.clone().requires_grad_() for c in comps]
    out = ours(mj.as_nested_tensor(leaves))
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    got = torch.autograd.grad((out * out).sum(), leaves)
    want = torch.autograd.grad(sum((r * r).sum() for r in
                                   [torch.view_as_real(torch.view_as_complex(c.unflatten(-1, (-1, 2))) *
                                                       torch.polar(torch.ones_like(a), a)).flatten(-2)
                                    for c, a in zip(leaves, angles)]), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@few(8)
@given(structures(SEQ, min_c=1, max_c=3) | structures(SQUARE, min_c=1, max_c=3), seeds, st.integers(-1, 1))
def test_diag_embed_of_the_last_dim(s, seed, offset):
    per_sample_check(lambda x: torch.diag_embed(x, offset), R(s.components(seed), s.ragged_dims),
                     ref=lambda c: torch.diag_embed(c, offset), seed=seed)


@few(8)
@given(lengths(), seeds, st.integers(1, 2))
def test_diag_embed_of_a_ragged_last_dim_is_a_square_pair(ns, seed, c):
    """``torch.diag_embed`` of ``(B, C, j)`` (or ``(B, j)``): each sample's ``(…, n, n)`` with the
    values on the diagonal, a square pair, with gradients."""
    shapes = [(c, n) for n in ns] if c > 1 else [(n,) for n in ns]
    x = R(components(shapes, seed), (2,) if c > 1 else (1,))
    out = per_sample_check(torch.diag_embed, x, ref=torch.diag_embed, seed=seed)
    assert out.shape[-1] is out.shape[-2]


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.float16, torch.complex64])
def test_diag_embed_of_a_ragged_last_dim_keeps_the_dtype(dtype):
    """A bool mask's ``diag_embed`` is each sample's bool identity-like mask (``~eye`` excludes
    self-edges), not an integer one; every dtype stays as dense's."""
    g = torch.Generator().manual_seed(0)
    comps = [(torch.rand(n, generator=g) * 4).to(dtype) for n in (3, 0, 2)]
    out = torch.diag_embed(torch.nested.nested_tensor(comps, layout=mj.multi_jagged))
    for a, c in zip(out.unbind(), comps):
        want = torch.diag_embed(c)
        assert a.dtype == want.dtype and torch.equal(a, want)
        if dtype == torch.bool:
            assert torch.equal(~a, ~want)


def test_diag_embed_elsewhere_raises():
    x = torch.nested.nested_tensor([torch.rand(3, 2), torch.rand(1, 2)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match="only into two new last dims"):
        torch.diag_embed(x, 0, 1, 2)
    s = torch.nested.nested_tensor([torch.rand(3), torch.rand(1)], layout=mj.multi_jagged)
    with pytest.raises(StructureError, match="main diagonal"):
        torch.diag_embed(s, 1)  # a ragged last dim onto another diagonal: a new size per sample


def test_unique_and_histc_over_every_element():
    comps = [torch.tensor([[3, 1], [1, 2]]), torch.zeros(0, 2, dtype=torch.int64), torch.tensor([[2, 5]])]
    x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged)
    flat = torch.cat([c.reshape(-1) for c in comps])
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    want = torch.unique(flat, return_inverse=True, return_counts=True)
    assert torch.equal(values, want[0]) and torch.equal(counts, want[2])
    assert isinstance(inverse, mj.MultiJaggedTensor)
    for i, c in zip(inverse.unbind(), comps):
        assert torch.equal(values[i], c)  # each element's place among the unique values
    assert torch.equal(x.unique(), torch.unique(flat))
    assert torch.equal(torch.histc(x.double(), 4, 0, 6), torch.histc(flat.double(), 4, 0, 6))
    with pytest.raises(NotImplementedError, match="unique"):
        torch.unique(x, dim=1)


@pytest.mark.parametrize("make", ["polar", "complex"])
def test_llama_rotary_embedding_from_positions_with_gradients(make):
    """Meta's LLaMA rotary embedding as written: rotations ``polar(1, position · θ)`` built from each
    sample's positions (``mj.position_ids``) with a learned ``θ``, broadcast over the heads, times
    the features as complex pairs; values and the gradients of the input and of ``θ`` per sample
    (the complex product's backward conjugates each factor), a zero-length sample included."""
    g = torch.Generator().manual_seed(3)
    comps = [torch.randn(n, 2, 8, dtype=F64, generator=g) for n in (3, 0, 5)]
    theta0 = torch.randn(4, dtype=F64, generator=g)

    def rotations(pos, theta):
        a = pos.unsqueeze(-1) * theta
        return torch.polar(torch.ones_like(a), a) if make == "polar" else torch.complex(a.cos(), a.sin())

    def rope(x, rot):  # x (…, H, 8), rot (…, 4)
        return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (4, 2))) * rot.unsqueeze(-2)).flatten(-2)

    x = mj.nested_tensor(comps, requires_grad=True)
    theta = theta0.clone().requires_grad_()
    out = rope(x, rotations(mj.position_ids(x).to(F64), theta))
    w = [torch.randn(c.shape, dtype=F64, generator=g) for c in comps]
    got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), w)), [x, theta])
    leaves = [c.clone().requires_grad_() for c in comps]
    th = theta0.clone().requires_grad_()
    refs = [rope(c, rotations(torch.arange(c.shape[0], dtype=F64), th)) for c in leaves]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, w)), leaves + [th])
    for a, b in zip(got[0].unbind(), want[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got[1], want[-1])


def test_conj_of_complex_samples_with_gradients():
    """``x.conj()`` per sample (materialized: ``resolve_conj`` returns it as it is), gradients to
    the complex input; a real tensor's ``conj()`` is itself, as dense."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=torch.complex128) for n in (2, 0, 4)]
    x = mj.nested_tensor(comps, requires_grad=True)
    y = x.conj()
    assert y.resolve_conj() is y
    leaves = [c.clone().requires_grad_() for c in comps]
    for a, c in zip(y.unbind(), leaves):
        torch.testing.assert_close(a, c.conj())
    got, = torch.autograd.grad((y * y * 1j).real.sum(), x)
    want = torch.autograd.grad(sum((c.conj() * c.conj() * 1j).real.sum() for c in leaves), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)
    r = mj.nested_tensor([torch.randn(2, 2)])
    assert r.conj() is r


def test_writes_into_a_conjugate_refuse():
    # dense x.conj() is a view: a write through it changes x; here it is a copy, whose writes
    # would be lost, so they raise, and reading it after x was written raises too
    x = mj.nested_tensor([torch.tensor([1 + 2j, 3 - 1j]), torch.zeros(0, dtype=torch.complex64), torch.tensor([5j])])
    for write in (lambda y: y.mul_(2), lambda y: y.imag.zero_(), lambda y: y.copy_(y * 2)):
        with pytest.raises(NotImplementedError, match=r"conjugate \(x.conj\(\)\)"):
            write(x.conj())
    assert x.unbind()[0].tolist() == [1 + 2j, 3 - 1j]
    y = x.conj()
    assert [t.tolist() for t in y.unbind()] == [[1 - 2j, 3 + 1j], [], [-5j]]
    x.mul_(2)
    with pytest.raises(NotImplementedError, match="before that tensor was written"):
        y.sum(dim=1)
