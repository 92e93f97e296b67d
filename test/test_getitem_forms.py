"""Indexing forms as dense indexing reads them: basic indices after paired index tensors
(``x[:, a, b, 1]``), a Python bool as a 0-d mask (``x[True]``), and an assignment naming one
position twice — per sample, values and every gradient, reading and writing."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as tmj
from torch_multijagged.errors import StructureError

from test_getitem import _batch_of


_AFTER_PAIRS = {
    "x[:, a, b, 1]": (slice(None), [0, 1], [1, 0], 1),
    "x[:, a, b, 1:]": (slice(None), [0, 1], [2, 0], slice(1, None)),
    "x[:, a, b, None]": (slice(None), [1, 0], [1, 0], None),
    "x[:, idx2d, 1]": (slice(None), [[0, 1], [1, 0]], 1),
    "x[:, :, a, b, None]": (slice(None), slice(None), [0, 1], [1, 3], None),
    "x[:, a, b, ..., ::2]": (slice(None), [0, 1], [1, 0], Ellipsis, slice(None, None, 2)),
    "x[..., a, b, None]": (Ellipsis, [0, 2], [1, 3], None),
    "x[..., idx2d, 1:]": (Ellipsis, [[0, 2], [1, 0]], slice(1, None)),
}


@pytest.mark.parametrize("name", list(_AFTER_PAIRS))
def test_basic_indices_after_paired_index_tensors_as_dense(name):
    """``x[:, a, b, 1]``, ``x[:, a, b, 1:]``, ``x[:, idx2d, None]``: dense indexing places the
    paired index's dims where the index tensors stand and applies the basic indices after them to
    the dims after those (its integers are selects): per sample, reading (values and every
    gradient) and writing, a sample too short for the index raising."""
    g = torch.Generator().manual_seed(0)
    key = tuple(torch.tensor(i) if isinstance(i, list) else i for i in _AFTER_PAIRS[name])
    reads_ragged = key[0] is not Ellipsis and isinstance(key[1], torch.Tensor)  # an empty sample would be out of bounds
    lengths = (3, 2, 4) if reads_ragged else (3, 0, 2, 4)
    comps = [torch.randn(n, 3, 4, dtype=torch.float64, generator=g).requires_grad_() for n in lengths]
    x = tmj.as_nested_tensor(comps)
    got = x[key]
    per = key if key[0] is Ellipsis else key[1:]
    refs = [c[per] for c in comps]
    outs = got.unbind() if isinstance(got, tmj.MultiJaggedTensor) else list(got)
    for a, r in zip(outs, refs):
        assert a.shape == r.shape and torch.equal(a, r)
    w = [torch.randn(r.shape, dtype=torch.float64, generator=g) for r in refs]
    cot = tmj.nested_tensor(w) if isinstance(got, tmj.MultiJaggedTensor) else torch.stack(w)
    for p, q in zip(torch.autograd.grad(got, comps, cot), torch.autograd.grad(refs, comps, w)):
        torch.testing.assert_close(p, q)
    y = x.detach().clone()
    y[key] = 7.0
    for a, c in zip(y.unbind(), comps):
        c = c.detach().clone()
        c[per] = 7.0
        assert torch.equal(a, c)
    if reads_ragged:  # a sample too short for the index raises
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            tmj.nested_tensor([torch.randn(n, 3, 4) for n in (3, 1)])[key]


@pytest.mark.parametrize("index", ["paired", "static pair", "list"])
def test_index_assignment_to_one_position_twice_as_dense(index):
    """``x[:, a, b] = v`` naming one position twice: the last write stands and every row of ``v``
    gets its gradient, as dense ``__setitem__`` (``index_put``) gives them; so does ``x``'s own."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 3, 4, dtype=torch.float64, generator=g).requires_grad_() for n in (3, 2, 4)]
    a, b = torch.tensor([0, 0]), torch.tensor([1, 1])
    key = {"paired": (slice(None), a, b), "static pair": (Ellipsis, b, a), "list": (slice(None), [0, 0])}[index]
    v = torch.randn({"paired": (2, 4), "static pair": (2,), "list": (2, 3, 4)}[index], dtype=torch.float64,
                    generator=g).requires_grad_()
    y = tmj.as_nested_tensor(xs) * 1
    y[key] = v
    refs = []
    for t in xs:
        r = t * 1
        r[key if key[0] is Ellipsis else key[1:]] = v
        refs.append(r)
    for got, r in zip(y.unbind(), refs):
        assert torch.equal(got, r)
    w = [torch.randn(r.shape, dtype=torch.float64, generator=g) for r in refs]
    got = torch.autograd.grad(y, [v, *xs], tmj.nested_tensor(w))
    want = torch.autograd.grad(refs, [v, *xs], w)
    for p, q in zip(got, want):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("index", [True, False, (True,), (False,)], ids=str)
def test_a_python_bool_is_a_mask_not_a_sample_number(index):
    """``x[True]`` is a 0-d mask in dense indexing (a new leading dim of size 1 or 0), which a
    batch cannot have before its batch dim: it raises, as ``x[torch.tensor(True)]`` does, and
    never reads sample 1 or 0 (``True`` is an ``int`` to Python)."""
    _, x = _batch_of((3, 0, 5))
    with pytest.raises(StructureError, match="before the batch dim"):
        x[index]
    with pytest.raises(StructureError, match="before the batch dim"):
        x[torch.tensor(True)]


@pytest.mark.parametrize("key", ["paired", "list", "mask", "slice"])
def test_assignment_through_an_advanced_index_casts_nothing(key):
    """``x[:, a, b] = v`` with ``v`` of another dtype raises dense ``index_put_``'s error (an
    advanced index casts nothing); a Python number, or a slice (``copy_``), casts as dense does."""
    x = tmj.nested_tensor([torch.randn(n, 3, 4, dtype=torch.float64) for n in (3, 2)])
    a, b = torch.tensor([0, 1]), torch.tensor([1, 0])
    index = {"paired": (slice(None), a, b), "list": (slice(None), [0, 1]),
             "mask": (slice(None), slice(None), torch.tensor([True, False, True])), "slice": (slice(None), slice(1, None))}[key]
    value = torch.ones(1)
    y = x.clone()
    if key == "slice":
        y[index] = value
        assert y.dtype == torch.float64 and bool((y[index] == 1).all())
    else:
        with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match, got Double "
                                               "for the destination and Float for the source"):
            y[index] = value
    y[index] = 2.0
    for got, c in zip(y.unbind(), x.unbind()):
        c = c.clone()
        c[index[1:]] = 2.0
        assert torch.equal(got, c)


@pytest.mark.parametrize("index", [(Ellipsis, slice(None, 4)), (slice(None), slice(None), slice(1, None)),
                                   (slice(None), Ellipsis, slice(1, 2), slice(None)), (Ellipsis, slice(-3, None, 2))],
                         ids=["...,:4", ":,:,1:", ":,...,1:2,:", "...,-3::2"])
def test_slices_of_static_dims_per_sample_with_gradients(index):
    """Slices of static dims alone (a packed projection split, ``x[..., 1:]``): each sample's own
    slice, gradients, a zero-length sample; a negative step raises dense's error."""
    comps = [torch.randn(n, 3, 8, dtype=torch.float64) for n in (2, 0, 3)]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = tmj.as_nested_tensor(leaves)
    y = x[index]
    per = index[1:] if index[0] is not Ellipsis else index
    cot = [torch.randn(c[per].shape, dtype=torch.float64) for c in comps]
    got = torch.autograd.grad([(a * g).sum() for a, g in zip(y.unbind(), cot)], leaves)
    for a, c, g, gc in zip(y.unbind(), comps, got, cot):
        torch.testing.assert_close(a, c[per])
        want = torch.zeros_like(c)
        want[per] = gc
        torch.testing.assert_close(g, want)
    with pytest.raises(ValueError, match="step must be greater than zero"):
        x[..., ::-1]
