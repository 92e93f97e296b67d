"""Wrappers built from a cached template (NOTE [ Building a wrapper ] in wrappers.py): every wrapper
of one structure after the first is a shallow copy of a plain template tensor holding its nested
ints. Each copy must still be a tensor of its own: its own version counter, no view of another, an
empty storage of its own (``torch.compile`` treats inputs that share one as aliases), an inference
tensor exactly when built under ``inference_mode``, and the same shape, strides and gradients as a
wrapper built from scratch."""

from __future__ import annotations

import io

import pytest
import torch

import torch_multijagged as mj
from torch_multijagged.tensor import MultiJaggedTensor

from _reference import assert_close

DT = torch.float64
_DisableTF = torch._C.DisableTorchFunctionSubclass


def _comps(lengths=(3, 0, 2, 1), c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, dtype=DT, generator=g) for n in lengths]


def _own_version(t: torch.Tensor) -> int:
    with _DisableTF():
        return t._version


def _pairs(x):
    """Two fast results of one structure (the second of a structure makes its template)."""
    return x.unsqueeze(-2) + x.unsqueeze(-3), x.unsqueeze(-2) * x.unsqueeze(-3)


def _templated(partition, ragged_dims) -> bool:
    return any(k[0] == "wrapper" and k[1] == ragged_dims and v[3] is not None
               for k, v in partition.cache.items() if isinstance(k, tuple) and k)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_wrappers_of_one_structure_are_separate_tensors(grad):
    x = mj.nested_tensor(_comps(), requires_grad=grad)
    a, b = _pairs(x)
    c, d = a * 2, b * 2
    assert _templated(a._partition, a._ragged_dims)
    for t in (a, b, c, d):
        with _DisableTF():
            assert not t._is_view() and t._base is None
    ts = (a, b, c, d)  # a and b are built from scratch (b gives the template), c and d are copies of it
    for i, t in enumerate(ts):
        before = [_own_version(u) for u in ts]
        with torch.no_grad():
            t.add_(1)  # bumps t's counter only
        after = [_own_version(u) for u in ts]
        assert after[i] > before[i] and after[:i] + after[i + 1:] == before[:i] + before[i + 1:], (i, before, after)
    storages = [t.untyped_storage() for t in ts]
    assert len({s._cdata for s in storages}) == 4 and all(s.nbytes() == 0 for s in storages)
    assert a.untyped_storage() is storages[0]  # one per wrapper, stable


def test_templated_wrappers_match_wrappers_built_from_scratch():
    comps = _comps()
    x = mj.nested_tensor(comps)
    first, second = _pairs(x)
    second = second * 1  # a copy of the template
    from torch_multijagged.wrappers import _new_wrapper

    size, stride, stored = second._partition.logical_size_stride(second._values, second._ragged_dims)
    with _DisableTF():
        fresh = _new_wrapper(MultiJaggedTensor, size, stored, second.dtype, second.device, False)
    for got in (first, second):
        assert got.shape == first.shape and got.stride() == first.stride()
        with _DisableTF():
            assert got.shape == fresh.shape and got.dim() == fresh.dim()
            assert got.dtype == fresh.dtype and got.device == fresh.device and got.layout == fresh.layout
            assert torch._C._dispatch_keys(got) == torch._C._dispatch_keys(fresh)
    for i, xi in enumerate(comps):
        assert_close(second.unbind()[i], xi[:, None] * xi[None, :])


def test_leaves_of_one_structure_from_a_template_collect_their_own_gradients():
    comps = _comps()
    x = mj.nested_tensor(comps)
    part = x._partition
    y, z = (MultiJaggedTensor(x._values.clone(), part, x._ragged_dims, requires_grad=True) for _ in range(2))
    assert y.is_leaf and z.is_leaf and y.requires_grad and z.requires_grad
    gy, gz = torch.autograd.grad(((y * 2) + (z * 3)).sum((1, 2)).sum(), (y, z))
    for i, xi in enumerate(comps):
        assert_close(gy.unbind()[i], torch.full_like(xi, 2.0))
        assert_close(gz.unbind()[i], torch.full_like(xi, 3.0))


def test_inference_mode_templates_stay_apart():
    """A template made under ``inference_mode`` makes inference tensors; wrappers of the same
    structure outside it keep a version counter, and reading them after a write is not stale."""
    comps = _comps()
    x = mj.nested_tensor(comps)
    with torch.inference_mode():
        a, b = _pairs(x)
        assert a.is_inference() and b.is_inference()
    w = torch.tensor(2.0, dtype=DT, requires_grad=True)
    a, b = _pairs(x)
    assert not a.is_inference() and not b.is_inference()
    c = b * w
    c.add_(1)  # a write the values path must see
    (gw,) = torch.autograd.grad((c * c).sum((1, 2, 3)).sum(), w)
    ref = sum((2 * (2 * (xi[:, None] * xi[None, :]) + 1) * (xi[:, None] * xi[None, :])).sum() for xi in comps)
    assert_close(gw, ref)
    with torch.inference_mode():
        assert _pairs(x)[1].is_inference()


def test_two_templated_inputs_to_a_compiled_function():
    """Inputs of one structure sharing a C++ storage would be fakeified as aliases."""
    comps = _comps((3, 2, 4))
    x = mj.nested_tensor(comps)
    a, b = _pairs(x)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(p, q):
        return (p * q + q).sin()

    out = f(a, b)
    for i, xi in enumerate(comps):
        pi, qi = xi[:, None] + xi[None, :], xi[:, None] * xi[None, :]
        assert_close(out.unbind()[i], (pi * qi + qi).sin())


def test_save_and_load_after_asking_for_the_storage():
    x = mj.nested_tensor(_comps())
    a, b = _pairs(x)
    b.untyped_storage()
    b.shape, b.stride()
    buf = io.BytesIO()
    torch.save(b, buf)
    buf.seek(0)
    got = torch.load(buf)
    assert "_storage" not in got.__dict__
    for u, v in zip(got.unbind(), b.unbind()):
        assert torch.equal(u, v)
