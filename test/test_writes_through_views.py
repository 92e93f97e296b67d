"""Writes through views against a saved backward, and padded rows in attention's backward.

1. A write through a view made on the eager values path (unsqueeze / transpose / view / flatten /
   unflatten …) of a wrapper that a general-path aten formula saved for backward (the output of
   log_softmax / logsumexp / amax / multijagged::sdpa, an input of logsumexp / atan2) bumps that
   wrapper's version counter, so the backward raises as dense torch's "modified by an inplace
   operation" instead of reading the written values.
2. The bucketed attention backend's backward gives padded query rows probability 0 (q, out zero,
   lse +inf): another segment's row read there would overflow, and inf · 0 would put NaN into the
   keys' and values' gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged.ops.attention.sdpa import backend

DT = torch.float64
# Our raise: autograd's own RuntimeError when the saved tensor is a dense values tensor, or, when
# it is a wrapper, the NotImplementedError that aten.size raises while autograd formats that
# same error (ops/shape/metadata.py: "… autograd reporting that a tensor needed for the
# gradient was modified in place").
RAISES = (RuntimeError, NotImplementedError)
WORDS = "modified by an inplace operation|modified in place"


def _comps(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, dtype=DT, generator=g) for s in shapes]


SEQ = [(3, 4), (5, 4), (1, 4)]
PAIR = [(3, 3, 4), (2, 2, 4), (1, 1, 4)]
ROWS = [(3, 2, 4), (5, 2, 4)]  # (B, j, L=2, D): attention inside packed rows (the general path)

# An op whose backward saves a tensor, then a view of its output written in place:
# name -> (sample shapes, ragged dims, batched program, the same program on one dense sample).
# Both programs return the loss.


def _saved_input(x):  # logsumexp saves its input: written through a view of it
    y = x * 1.0
    z = y.logsumexp(-1)
    y.unsqueeze(-1).mul_(2.0)
    return z.sum()


def _w(view):
    def prog(x):
        v = view(x)
        v.mul_(2.0)
        return v.sum()
    return prog


def _sdpa_rows_dense(view):
    # one sample (n, L, D) as a batch of one, (1, n, L, D): dense SDPA's fused CPU kernel, whose
    # backward reads its output as ours does (on a 3-d tensor dense takes the math path, which
    # saves no output and differentiates the write)
    return _w(lambda c: view(F.scaled_dot_product_attention(*[c.unsqueeze(0)] * 3)[0]))


PROGRAMS = {
    "log_softmax(-1).unsqueeze": (SEQ, (1,), _w(lambda x: F.log_softmax(x, -1).unsqueeze(-1)),
                                  _w(lambda c: F.log_softmax(c, -1).unsqueeze(-1))),
    "log_softmax(-1).transpose": (SEQ, (1,), _w(lambda x: F.log_softmax(x, -1).transpose(1, 2)),
                                  _w(lambda c: F.log_softmax(c, -1).transpose(0, 1))),
    "log_softmax(-1).unflatten": (SEQ, (1,), _w(lambda x: F.log_softmax(x, -1).unflatten(-1, (2, 2))),
                                  _w(lambda c: F.log_softmax(c, -1).unflatten(-1, (2, 2)))),
    "log_softmax(-1).view": (SEQ, (1,), _w(lambda x: F.log_softmax(x, -1).view(x.shape[0], x.shape[1], 2, 2)),
                             _w(lambda c: F.log_softmax(c, -1).view(c.shape[0], 2, 2))),
    "F.softmax(-1).unsqueeze": (SEQ, (1,), _w(lambda x: F.softmax(x, -1).unsqueeze(-1)),
                                _w(lambda c: F.softmax(c, -1).unsqueeze(-1))),
    "logsumexp(-1).unsqueeze": (SEQ, (1,), _w(lambda x: x.logsumexp(-1).unsqueeze(-1)),
                                _w(lambda c: c.logsumexp(-1).unsqueeze(-1))),
    "amax(1) of a pair .unsqueeze": (PAIR, (1, 2), _w(lambda x: x.amax(1).unsqueeze(-1)),
                                     _w(lambda c: c.amax(0).unsqueeze(-1))),
    "amax(2) of a pair .transpose": (PAIR, (1, 2), _w(lambda x: x.amax(2).transpose(1, 2)),
                                     _w(lambda c: c.amax(1).transpose(0, 1))),
    "sdpa inside rows .flatten": (ROWS, (1,), _w(lambda x: F.scaled_dot_product_attention(x, x, x).flatten(-2, -1)),
                                  _sdpa_rows_dense(lambda o: o.flatten(-2, -1))),
    "sdpa inside rows .unsqueeze": (ROWS, (1,), _w(lambda x: F.scaled_dot_product_attention(x, x, x).unsqueeze(-1)),
                                    _sdpa_rows_dense(lambda o: o.unsqueeze(-1))),
    "log_softmax .unsqueeze.transpose": (SEQ, (1,),
                                         _w(lambda x: F.log_softmax(x, -1).unsqueeze(-1).transpose(-1, -2)),
                                         _w(lambda c: F.log_softmax(c, -1).unsqueeze(-1).transpose(-1, -2))),
    "log_softmax .unsqueeze then a slice": (SEQ, (1,), _w(lambda x: F.log_softmax(x, -1).unsqueeze(-1)[..., :1]),
                                            _w(lambda c: F.log_softmax(c, -1).unsqueeze(-1)[..., :1])),
    "x*1 saved by logsumexp, .unsqueeze": (SEQ, (1,), _saved_input, _saved_input),
}


@pytest.mark.parametrize("name", list(PROGRAMS), ids=str)
def test_write_through_a_view_of_a_saved_output_raises_as_dense(name):
    shapes, ragged, prog, dense = PROGRAMS[name]
    comps = _comps(shapes)
    for c in comps:  # the per-sample dense reference raises
        leaf = c.clone().requires_grad_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(dense(leaf), leaf)
    x = mj.nested_tensor(comps, ragged_dims=ragged, requires_grad=True)
    with pytest.raises(RAISES, match=WORDS):
        torch.autograd.grad(prog(x), x)


@pytest.mark.parametrize("log", [True, False])
def test_softmax_along_a_ragged_dim_saves_nothing_a_write_reaches(log):
    """Along a ragged dim the values path's softmax saves no tensor that a write through a view of
    its output reaches: the gradient is that of the written function (dense torch raises)."""
    comps = _comps(SEQ) + [torch.zeros(0, 4, dtype=DT)]  # and an empty sample
    f = F.log_softmax if log else F.softmax
    x = mj.nested_tensor(comps, requires_grad=True)
    v = f(x, 1).unsqueeze(-1)
    v.mul_(2.0)
    grad = torch.autograd.grad(v.sin().sum(), x)[0]
    for g, c in zip(grad.unbind(), comps):
        c = c.clone().requires_grad_()
        want = torch.autograd.grad((2 * f(c, 0)).unsqueeze(-1).sin().sum(), c)[0]
        torch.testing.assert_close(g, want)


def test_write_under_no_grad_through_a_view_of_a_saved_output_raises_as_dense():
    comps = _comps(SEQ)

    def prog(x):
        v = F.log_softmax(x, -1).unsqueeze(-1)
        with torch.no_grad():
            v.mul_(2.0)
        return v.sum()

    for c in comps:
        leaf = c.clone().requires_grad_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(prog(leaf), leaf)
    x = mj.nested_tensor(comps, requires_grad=True)
    with pytest.raises(RAISES, match=WORDS):
        torch.autograd.grad(prog(x), x)


def _same_grads_as_dense(prog, shapes):
    comps = _comps(shapes, 3)
    x = mj.nested_tensor(comps, requires_grad=True)
    g = torch.autograd.grad(prog(x), x)[0]
    for c, gi in zip(comps, g.unbind()):
        leaf = c.clone().requires_grad_()
        torch.testing.assert_close(gi, torch.autograd.grad(prog(leaf), leaf)[0])


def test_write_through_views_of_an_unsaved_output_keeps_dense_gradients():
    """No saved tensor: the write is differentiated, as dense (the bump must not raise)."""
    def prog(x):
        y = torch.cat([x, x], -1)  # the general path; its backward saves no tensor
        v = y.unsqueeze(-1)
        v.mul_(2.0)
        w = v.transpose(-1, -2)
        w.add_(1.0)
        return (w * w).sum()

    _same_grads_as_dense(prog, SEQ)


def test_write_through_a_view_then_using_the_base_still_raises():
    """The base's history misses the write (NOTE [ Writes into shared values ]): its next use
    raises; the counter bump made for saved backwards must not count as a write of its own."""
    for take_slice in (False, True):
        x = mj.nested_tensor(_comps(SEQ), requires_grad=True)
        y = torch.cat([x, x], -1)
        s = y[..., :2] if take_slice else y
        y.unsqueeze(-1).mul_(2.0)
        with pytest.raises(NotImplementedError, match="written in place through another tensor"):
            s.sin()


def test_many_writes_through_a_view_keep_the_base_and_its_slices_stale():
    """The bumps made for saved backwards are recorded as such: however many writes went through
    the view, the base (and a slice of it taken before) still refuses its next use."""
    x = mj.nested_tensor(_comps(SEQ), requires_grad=True)
    y = torch.cat([x, x], -1)
    s = y[..., :2]
    s.sin()  # s remembers its values
    v = y.unsqueeze(-1)
    for _ in range(40):
        v.mul_(1.5)
    for t in (y, s):
        with pytest.raises(NotImplementedError, match="written in place through another tensor"):
            t.sin()
    torch.testing.assert_close(v.squeeze(-1), y.detach() * 1.0)  # (no grad needed to read them)


# ----------------------------------------------------------------------------- padded rows in the backward
_A = torch.tensor([[[2., 0, -46, -14], [23, 7, -14, -8], [8, -12, -2, -4]],
                   [[-50, 42, -91, -18], [4, 1, 26, 27], [-33, -19, 4, -13]]], dtype=DT)


@pytest.mark.parametrize("name", [None, "bucketed", "reference", "loop", "blocks"], ids=str)
def test_attention_rows_of_a_pair_large_scores_finite_gradients(name):
    comps = [_A, torch.zeros(1, 4, 4, dtype=DT)]
    x = mj.nested_tensor(comps, ragged_dims=(1, 2), requires_grad=True)
    with backend(name):
        out = F.scaled_dot_product_attention(x, x, x)
        g = torch.autograd.grad((out * out).sum(), x)[0]
    for c, gi in zip(comps, g.unbind()):
        leaf = c.clone().requires_grad_()
        o = F.scaled_dot_product_attention(leaf, leaf, leaf)
        torch.testing.assert_close(gi, torch.autograd.grad((o * o).sum(), leaf)[0])


@pytest.mark.parametrize("name", [None, "bucketed", "reference"], ids=str)
@pytest.mark.parametrize("seed", range(6))
def test_attention_large_score_range_matches_dense(name, seed):
    """Queries, keys, values of their own (cross structure of equal sizes), rows of different
    lengths: a padded query row with another segment's q and lse overflowed."""
    g = torch.Generator().manual_seed(seed)
    sizes = [2, 1, 3]
    shapes = [(n, n + i % 2, 4) for i, n in enumerate(sizes)]
    cq, ck = ([torch.randn(*s, dtype=DT, generator=g) * 30 for s in shapes] for _ in range(2))
    cv = [torch.randn(*s, dtype=DT, generator=g) for s in shapes]
    q, k, v = (mj.nested_tensor(cs, ragged_dims=(1, 2), requires_grad=True) for cs in (cq, ck, cv))
    with backend(name):
        out = F.scaled_dot_product_attention(q, k, v)
        grads = torch.autograd.grad((out * out).sum(), (q, k, v))
    for i in range(len(sizes)):
        leaves = [t[i].clone().requires_grad_() for t in (cq, ck, cv)]
        o = F.scaled_dot_product_attention(*leaves)
        for got, want in zip(grads, torch.autograd.grad((o * o).sum(), leaves)):
            torch.testing.assert_close(got.unbind()[i], want)


@pytest.mark.parametrize("name", [None, "bucketed", "reference"], ids=str)
def test_attention_non_finite_sample_does_not_leak_through_padded_queries(name):
    """The first packed row (another sample's) is what padded query rows read: an inf there must
    not reach the other samples' gradients (as zeroed padded keys already guarantee forward)."""
    comps = _comps([(2, 3, 4), (1, 4, 4), (2, 2, 4)], 5)
    comps[0][0, 0, 0] = float("inf")
    x = mj.nested_tensor(comps, ragged_dims=(1, 2), requires_grad=True)
    with backend(name):
        out = F.scaled_dot_product_attention(x, x, x)
        g = torch.autograd.grad(out.sum(), x)[0]
    for c, gi in list(zip(comps, g.unbind()))[1:]:
        leaf = c.clone().requires_grad_()
        want = torch.autograd.grad(F.scaled_dot_product_attention(leaf, leaf, leaf).sum(), leaf)[0]
        torch.testing.assert_close(gi, want)


def test_a_chain_of_views_keeps_only_its_first_tensor():
    """``y = y.unsqueeze(-1).squeeze(-1)`` in a loop: each view holds the chain's first tensor, as
    a dense view holds its base, not every view made before (which each write would walk)."""
    import gc
    import weakref

    x = mj.nested_tensor(_comps(SEQ))
    y, made = x.clone(), []
    for _ in range(20):
        u = y.unsqueeze(-1)
        y = u.squeeze(-1)
        made.append(weakref.ref(u))
        del u
        y.mul_(1.0)
    gc.collect()
    assert sum(r() is not None for r in made) <= 1
    z = F.log_softmax(x.requires_grad_(), -1)
    v = z.unsqueeze(-1).transpose(1, 2).unsqueeze(1).squeeze(1)  # views in between are temporaries
    v.mul_(2.0)
    with pytest.raises(RAISES, match=WORDS):
        torch.autograd.grad(v.sum(), x)


S = [torch.tensor([[0.5, 1.0]], dtype=torch.float64), torch.tensor([[2.0, -1.0], [0.1, 0.2]], dtype=torch.float64)]
DETACHED_WRITES = {
    "saved output, detach": lambda a: (lambda y: (y.detach().zero_(), y)[1])(a.exp()),
    "saved input, detach": lambda a: (lambda x: (lambda y: (x.detach().mul_(2), y)[1])(x.sin()))(a * 1),
    "saved output, detach then select": lambda a: (lambda y: (y.detach()[..., 0].zero_(), y)[1])(a.exp()),
    "saved output, detach then slice": lambda a: (lambda y: (y.detach()[:, :1].zero_(), y)[1])(a.exp()),
    "saved output, detach then unsqueeze": lambda a: (lambda y: (y.detach().unsqueeze(-1).zero_(), y)[1])(a.exp()),
    "saved output, detach then values": lambda a: (lambda y: (y.detach().values().zero_(), y)[1])(a.exp()),
    "saved output, detach then copy_": lambda a: (lambda y: (y.detach().copy_(y.detach() * 0), y)[1])(a.exp()),
    "saved output, alias": lambda a: (lambda y: (torch.ops.aten.alias(y).zero_(), y)[1])(a.exp()),
}


@pytest.mark.parametrize("name", DETACHED_WRITES)
def test_a_write_through_a_detached_alias_of_a_saved_tensor_raises_as_dense(name):
    """``x.detach()`` shares ``x``'s storage and version counter (the packed values' too): a write
    through it into a tensor a backward saved makes that backward raise, as dense torch's does,
    instead of returning the gradient of the written values."""
    a = mj.nested_tensor(S).requires_grad_()
    y = DETACHED_WRITES[name](a)
    # autograd's own error, or the package's for a write it sees through the packed values
    with pytest.raises((RuntimeError, NotImplementedError),
                       match="modified by an inplace operation|written in place through another tensor"):
        torch.autograd.grad(y.sum(1).sum(), a)
    dense = torch.tensor([[2.0, -1.0], [0.1, 0.2]], dtype=torch.float64, requires_grad=True)
    if "values" not in name and "slice" not in name:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(DETACHED_WRITES[name](dense.unsqueeze(0)).sum(1).sum(), dense)


def test_a_write_into_a_tensor_whose_detached_alias_was_saved_raises_as_dense():
    """``d = x.detach(); z = w * d; x.mul_(2)``: the product saved ``d``, which shares ``x``'s counter."""
    x = mj.nested_tensor(S)
    w = torch.ones(2, dtype=torch.float64, requires_grad=True)
    z = x.detach() * w
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(z.sum(1).sum(), w)


@pytest.mark.parametrize("write", [
    lambda t: t.data.mul_(2),
    lambda t: t.data[..., :2].mul_(2),
    lambda t: t.data.transpose(-1, -2).mul_(2),
    lambda t: t.data.copy_(t.data * 2),
], ids=["data", "slice of data", "transpose of data", "copy into data"])
def test_a_write_through_data_is_no_write_autograd_sees(write):
    """``x.data`` shares the storage, not the version counter, as in dense torch: a write through
    it (or a view of it) after ``x`` was saved for backward is not refused, the backward reads the
    written values, and ``x`` is not stale for later ops (its ``_version`` unchanged); ``x.data``
    needs no gradient. Per sample as dense, with an empty sample."""
    comps = _comps([(3, 4), (0, 4), (1, 4)])
    x = torch.nested.nested_tensor(comps, layout=mj.multi_jagged).requires_grad_()
    assert not x.data.requires_grad and x.data._values.data_ptr() == x._values.data_ptr()
    z = (x * x).sum()
    write(x)
    z.backward()
    (x * 3).sum().backward()
    assert x._version == 0
    for c, got in zip(comps, x.grad.unbind()):
        c = c.clone().requires_grad_()
        zz = (c * c).sum()
        write(c)
        zz.backward()
        (c * 3).sum().backward()
        torch.testing.assert_close(got, c.grad)
    for c, now in zip(comps, x.detach().unbind()):
        torch.testing.assert_close(now[..., :2], 2 * c[..., :2])


def test_assigning_data_replaces_the_values_as_dense():
    """``p.data = new`` (an old-style update) makes ``p`` hold ``new``'s values, unseen by autograd:
    ``p`` stays the same leaf with its ``requires_grad`` and ``grad``, and its next gradient reads
    the new values. A value of another structure, dtype or kind raises instead of being dropped."""
    cs = [torch.randn(2, 3, dtype=DT), torch.randn(4, 3, dtype=DT), torch.randn(0, 3, dtype=DT)]
    p = torch.nn.Parameter(mj.nested_tensor(cs))
    (p * 2).sum().backward()
    grad = p.grad
    y = p * 1.0  # a values-path result that remembered p's values
    p.data = mj.nested_tensor([5 * c for c in cs])
    assert p.requires_grad and p.is_leaf and p.grad is grad
    for a, c in zip(p.unbind(), cs):
        assert torch.equal(a, 5 * c)
    (p * p).sum().backward()
    for g, c in zip(p.grad.unbind(), cs):
        torch.testing.assert_close(g, 2 + 10 * c)
    for a, c in zip(y.unbind(), cs):  # an earlier result keeps what it computed
        assert torch.equal(a, c)
    for bad in (torch.zeros(6, 3, dtype=DT), mj.nested_tensor([c.float() for c in cs]),
                mj.nested_tensor([cs[1], cs[0], cs[2]])):
        with pytest.raises(RuntimeError, match="same samples, dtype, device and strides"):
            p.data = bad


@pytest.mark.parametrize("view", ["transpose", "unsqueeze", "view"])
def test_writing_a_grad_value_into_a_view_of_a_batch_without_grad_raises(view):
    """Dense rebases the batch's history onto a write of a value that requires grad through a view
    (``x.transpose(1, 2).mul_(w)``); the batch's values-path views are no autograd views, so the
    batch kept no history and ``w``'s gradient was silently lost. It raises, naming what works; a
    plain write, one under no_grad, and the write into the batch itself go through."""
    w = torch.tensor(2.0, requires_grad=True)
    make = {"transpose": lambda t: t.transpose(1, 2), "unsqueeze": lambda t: t.unsqueeze(-1),
            "view": lambda t: t.view(t.shape)}[view]
    x = torch.nested.nested_tensor([torch.ones(n, 4) for n in (2, 0, 1)], layout=mj.multi_jagged)
    with pytest.raises(NotImplementedError, match="write into the batch itself"):
        make(x).mul_(w)
    make(x).mul_(3)
    with torch.no_grad():
        make(x).mul_(w)
    x.mul_(w)  # the batch itself records it
    assert torch.autograd.grad(x.sum(), w)[0].item() == 6.0 * 12  # 12 elements of 1 · 3 · 2

