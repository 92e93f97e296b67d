"""Ops that PyTorch's NJT OpInfo samples found missing (``njt_opinfo.py``), and what a
``torch.jagged`` user meets around them: full reductions, fills, multi-output elementwise ops,
``logsigmoid``/``glu``, ``detach`` under ``inference_mode`` and the names errors give.

Each is checked against the per-sample (or, for a flat index, the packed-values) reference with
a zero-length sample, gradients where the dense op has them, and under ``inference_mode``.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged import StructureError

from _reference import LAYOUTS, R, components, per_sample_check

D = torch.float64


def _comps(layout, seed=0, dtype=D, ties=False):
    ns, ms = (3, 0, 2), (2, 1, 0)
    return components([layout.shape(n, m, 2, 4) for n, m in zip(ns, ms)], seed, dtype=dtype, ties=ties)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_fill_out_of_place_matches_per_sample(layout):
    comps = _comps(layout)
    per_sample_check(lambda x: torch.fill(x, 2.5), R(comps, layout.ragged_dims), grad=False)
    value = torch.tensor(-1.5, dtype=D)
    per_sample_check(lambda x, v: torch.fill(x, v), R(comps, layout.ragged_dims), value)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_frexp_returns_two_multi_jagged_tensors(layout):
    comps = _comps(layout)
    for k in range(2):
        per_sample_check(lambda x, k=k: torch.frexp(x)[k], R(comps, layout.ragged_dims), grad=False)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("fn", ["argmax", "argmin", "max", "min"])
def test_full_reduction_without_dim(layout, fn):
    """``argmax(x)``: a flat index into the packed values laid out as torch.jagged's
    ``values()`` (the ragged rows at dim r − 1 for one ragged dim r); ``max(x)``: a 0-dim value
    whose gradient goes to the extreme element (shared among ties, as dense ``max()``)."""
    comps = _comps(layout, ties=fn in ("max", "min"))
    x = mj.nested_tensor(comps, ragged_dims=layout.ragged_dims, requires_grad=True)
    out = getattr(torch, fn)(x)
    flat = torch.cat([c.reshape(-1) for c in comps])
    if fn.startswith("arg"):
        v = x.values().detach()  # torch.jagged's layout: the rows at dim r - 1 for one ragged dim r
        assert out.dim() == 0 and v.reshape(-1)[out] == getattr(flat, fn[3:])()
        assert out == getattr(torch, fn)(v)
        kept = getattr(torch, fn)(x, keepdim=True)  # every dim of size 1, as dense torch's
        assert kept.shape == (1,) * x.dim() and kept.reshape(()) == out
        return
    leaves = [c.clone().requires_grad_() for c in comps]
    expected = getattr(torch, fn)(torch.cat([c.reshape(-1) for c in leaves]))
    torch.testing.assert_close(out, expected)
    (g,) = torch.autograd.grad(out, x)
    ref = torch.autograd.grad(expected, leaves)
    for a, b in zip(g.unbind(), ref):
        torch.testing.assert_close(a, b)


def test_full_max_of_an_empty_tensor_raises_as_dense():
    x = mj.nested_tensor([torch.zeros(0, 2)])
    with pytest.raises(RuntimeError):
        torch.max(x)
    with pytest.raises(RuntimeError):
        torch.max(torch.zeros(0, 2))


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_logsigmoid_and_glu_match_per_sample(layout):
    comps = _comps(layout)
    per_sample_check(F.logsigmoid, R(comps, layout.ragged_dims))
    per_sample_check(lambda x: F.glu(x, -1), R(_comps(layout, seed=1), layout.ragged_dims))
    # along a ragged dim: each sample's halves (a new ragged size), every size even as dense asks
    d = layout.ragged_dims[0]
    even = [c.narrow(d - 1, 0, c.shape[d - 1] // 2 * 2) for c in comps]
    per_sample_check(lambda x: F.glu(x, d), R(even, layout.ragged_dims), ref=lambda c: F.glu(c, d - 1), new_ragged=True)
    odd = [c for c in comps if c.shape[d - 1] % 2]
    if odd:
        with pytest.raises(RuntimeError, match=r"glu\(\): Halving dimension must be even"):
            F.glu(mj.nested_tensor(comps, ragged_dims=layout.ragged_dims), d)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_detach_and_ops_under_inference_mode_on_a_tensor_made_outside(mode):
    """torch.jagged raises "Cannot set version_counter for inference tensor" on ``detach``."""
    comps = [torch.randn(3, 4, dtype=D), torch.randn(0, 4, dtype=D), torch.randn(2, 4, dtype=D)]
    x = mj.nested_tensor(comps, requires_grad=True)
    with mode():
        d = x.detach()
        outs = [F.logsigmoid(d), F.glu(d), (d.unsqueeze(-2) + d.unsqueeze(-3)).mean(-2), F.layer_norm(x, (4,))]
    refs = [F.logsigmoid, F.glu, lambda c: (c.unsqueeze(-2) + c.unsqueeze(-3)).mean(-2), lambda c: F.layer_norm(c, (4,))]
    for out, ref in zip(outs, refs):
        assert not out.requires_grad
        for a, c in zip(out.unbind(), comps):
            torch.testing.assert_close(a, ref(c))


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e
    raise AssertionError("expected an error")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda x: x.sum(5), "sum"),
        (lambda x: torch.sum(x, 5), "sum"),
        (lambda x: x.softmax(0), "softmax"),
        (lambda x: F.softmax(x, 0), "softmax"),
        (lambda x: torch.logsumexp(x, 0), "logsumexp"),
        (lambda x: x + torch.randn(3, 3, 4), "add"),
        (lambda x: F.scaled_dot_product_attention(x, x, x.unsqueeze(-1)), "scaled_dot_product_attention"),
    ],
)
def test_errors_name_the_function_the_user_called(call, name):
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    e = _error(lambda: call(x))
    assert str(e).startswith(f"{name}(): "), str(e)


def test_error_types_follow_torch_jagged():
    """Where torch.jagged raises RuntimeError (or IndexError) for a mistake, so do we (our
    StructureError is both a RuntimeError and a ValueError)."""
    cs = [torch.randn(3, 4), torch.randn(2, 4)]
    x = mj.nested_tensor(cs)
    n = torch.nested.nested_tensor(cs, layout=torch.jagged)
    for call in (lambda t: t.sum(5), lambda t: t.mean(0), lambda t: t.view(3, 4), lambda t: t + torch.randn(3, 3, 4), lambda t: t.softmax(0)):
        expected, got = _error(lambda: call(n)), _error(lambda: call(x))
        assert isinstance(got, type(expected)) or isinstance(got, RuntimeError) and isinstance(expected, RuntimeError), (expected, got)


def test_renamed_error_keeps_its_type_and_names_the_aten_op():
    # nuclear_norm over a ragged and a static dim reaches aten's _linalg_svd, which has no handler
    x = mj.as_nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    e = _error(lambda: torch.nuclear_norm(x))
    assert type(e) is NotImplementedError, type(e)
    assert str(e).startswith("nuclear_norm(): ") and str(e).endswith("(in _linalg_svd)"), str(e)


@pytest.mark.parametrize("nd", [1, 2])
def test_conv_over_static_trailing_dims_matches_per_sample(nd):
    """torch.jagged's ``convolution`` runs the conv on the values (rows as the conv's batch);
    ours does the same, with gradients to input, weight and bias (torch.jagged has no backward)."""
    fn = (F.conv1d, F.conv2d)[nd - 1]
    spatial = (5,) * nd
    comps = components([(n, 3, *spatial) for n in (3, 0, 2)], 0)
    w = torch.randn(4, 3, *(3,) * nd, dtype=D)
    b = torch.randn(4, dtype=D)
    per_sample_check(lambda x, w, b: fn(x, w, b, padding=1, stride=2), R(comps, (1,)), w, b)
    x = mj.nested_tensor(comps)
    with torch.inference_mode():
        out = fn(x, w, b, padding=1, stride=2)
    for a, c in zip(out.unbind(), comps):
        torch.testing.assert_close(a, fn(c, w, b, padding=1, stride=2))


def test_conv_module_and_a_ragged_conv_dim_is_refused():
    m = torch.nn.Conv1d(3, 2, 3, padding=1).double()
    comps = components([(n, 3, 5) for n in (3, 0, 2)], 1)
    x = mj.nested_tensor(comps)
    for a, c in zip(m(x).unbind(), comps):
        torch.testing.assert_close(a, m(c))
    with pytest.raises(StructureError, match=r"conv1d\(\): expected components \(n, C, L\)"):
        m(x.transpose(1, 2))


def test_metadata_queries_as_torch_jagged():
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(0, 4)])
    assert x.is_same_size(x * 2) and not x.is_same_size(torch.randn(2, 3, 4))
    assert torch._is_all_true(x > -100) and not torch._is_any_true(x > 100)
    assert x.is_pinned() is False


def test_torch_testing_assert_close_compares_structure_and_values():
    cs = [torch.randn(3, 4), torch.randn(0, 4), torch.randn(2, 4)]
    a = mj.nested_tensor(cs)
    torch.testing.assert_close(a, mj.nested_tensor([c.clone() for c in cs]))  # other nested ints
    torch.testing.assert_close(a, a * (1 + 1e-8))
    bad = {
        "not close": mj.nested_tensor([c + 1 for c in cs]),
        "per-sample extents": mj.nested_tensor([torch.randn(2, 4), torch.randn(1, 4), torch.randn(2, 4)]),
        "layout": torch.randn(3, 3, 4),
        "dtype": a.double(),
        "ragged dims": mj.nested_tensor([torch.randn(4, 3), torch.randn(4, 0), torch.randn(4, 2)]),
    }
    for what, other in bad.items():
        with pytest.raises(AssertionError, match=what):
            torch.testing.assert_close(a, other)


def test_lengths_is_none_as_for_a_jagged_tensor_without_holes():
    cs = [torch.randn(3, 4), torch.randn(0, 4)]
    assert mj.nested_tensor(cs).lengths() is None
    assert torch.nested.nested_tensor(cs, layout=torch.jagged).lengths() is None


def test_torch_jagged_private_metadata_reads_as_there():
    """``_ragged_idx``, ``_lengths``, ``_max_seqlen``, ``_min_seqlen`` (read by PyTorch's own nested
    tests and by user code) equal torch.jagged's for one ragged dim; with several they are absent."""
    cs = [torch.randn(3, 4), torch.randn(0, 4), torch.randn(5, 4)]
    x, n = mj.nested_tensor(cs), torch.nested.nested_tensor(cs, layout=torch.jagged)
    for a in ("_ragged_idx", "_lengths", "_max_seqlen", "_min_seqlen"):
        assert getattr(x, a) == getattr(n, a), a
    assert (x._get_max_seqlen(), x._get_min_seqlen()) == (n._get_max_seqlen(), n._get_min_seqlen()) == (5, 0)
    assert x.transpose(1, 2)._ragged_idx == n.transpose(1, 2)._ragged_idx == 2
    pair = x.unsqueeze(-2) + x.unsqueeze(-3)
    assert not hasattr(pair, "_ragged_idx") and not hasattr(pair, "_max_seqlen")
