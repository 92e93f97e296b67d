"""Scattering a multi_jagged batch into a dense tensor (NOTE [ Scattering a batch into a dense tensor ]
in ``ops/indexing/scatter.py``): ``dense.scatter / scatter_add / scatter_reduce (dim, index, src)``
and their in-place forms with a multi_jagged index, against dense torch on each sample
(``self[i].scatter…(dim - 1, index[i], src[i])``), with gradients to ``self`` and ``src``, a
zero-length sample, the no-leakage property and dense torch's errors; and the reverse,
``dense.gather(dim, index)``, a multi_jagged result of the index's structure."""

from __future__ import annotations

import pytest
import torch

import torch_multijagged as mj

F64 = torch.float64
LENGTHS = (3, 0, 5, 1)


def _case(layout, seed=0):
    """(self (B, …) dense, index components, src components, dim): tokens into per-sample bins,
    rows with a static dim into bins along dim 1, and along a static dim with the ragged dim kept."""
    g = torch.Generator().manual_seed(seed)
    B = len(LENGTHS)
    if layout == "tokens":
        idx = [torch.randint(0, 6, (n,), generator=g) for n in LENGTHS]
        src = [torch.randn(n, dtype=F64, generator=g) for n in LENGTHS]
        return torch.randn(B, 6, dtype=F64, generator=g), idx, src, 1
    if layout == "rows":
        idx = [torch.randint(0, 4, (n, 3), generator=g) for n in LENGTHS]
        src = [torch.randn(n, 3, dtype=F64, generator=g) for n in LENGTHS]
        return torch.randn(B, 4, 5, dtype=F64, generator=g), idx, src, 1
    # along the static dim 2; the ragged dim 1 is a coordinate (self has room for the longest)
    idx = [torch.randint(0, 7, (n, 2), generator=g) for n in LENGTHS]
    src = [torch.randn(n, 2, dtype=F64, generator=g) for n in LENGTHS]
    return torch.randn(B, 6, 7, dtype=F64, generator=g), idx, src, 2


OPS = {
    "scatter_add": lambda s, d, i, x: s.scatter_add(d, i, x),
    "scatter": lambda s, d, i, x: s.scatter(d, i, x),
    "scatter_value": lambda s, d, i, x: s.scatter(d, i, 2.5),
    "scatter_reduce_sum": lambda s, d, i, x: s.scatter_reduce(d, i, x, "sum"),
    "scatter_reduce_amax": lambda s, d, i, x: s.scatter_reduce(d, i, x, "amax", include_self=False),
    "scatter_reduce_mean": lambda s, d, i, x: s.scatter_reduce(d, i, x, "mean"),
    "torch.scatter_add": lambda s, d, i, x: torch.scatter_add(s, d, i, x),
}


@pytest.mark.parametrize("src_kind", ["multi_jagged", "dense"])
@pytest.mark.parametrize("layout", ["tokens", "rows", "static dim"])
@pytest.mark.parametrize("op", OPS)
def test_scatter_into_a_dense_tensor_per_sample(op, layout, src_kind):
    base, idx, src, d = _case(layout)
    f = OPS[op]
    index = mj.nested_tensor(idx)
    leaf = base.clone().requires_grad_()
    if src_kind == "multi_jagged":
        s = mj.nested_tensor(src, requires_grad=True)
    else:  # a dense (B, …) source as large as every sample's index
        pad = torch.zeros(len(src), max(LENGTHS), *src[0].shape[1:], dtype=F64)
        for k, c in enumerate(src):
            pad[k, : c.shape[0]] = c
        s = pad.requires_grad_()
    out = f(leaf, d, index, s)
    assert type(out) is torch.Tensor and out.shape == base.shape
    leaves = [base[i].clone().requires_grad_() for i in range(len(LENGTHS))]
    srcs = [c.clone().requires_grad_() for c in src]
    refs = [f(b, d - 1, i, (c if src_kind == "multi_jagged" else s[k, : c.shape[0]].detach().clone().requires_grad_()))
            for k, (b, i, c) in enumerate(zip(leaves, idx, srcs))]
    torch.testing.assert_close(out, torch.stack(refs))
    w = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    g_self, g_src = torch.autograd.grad((out * w).sum(), [leaf, s], allow_unused=True)
    want = torch.autograd.grad(sum((r * w[k]).sum() for k, r in enumerate(refs)), leaves + srcs, allow_unused=True)
    want_self, want_src = want[: len(leaves)], want[len(leaves):]
    torch.testing.assert_close(g_self, torch.stack([torch.zeros_like(b) if g is None else g
                                                     for b, g in zip(leaves, want_self)]))
    if src_kind == "multi_jagged" and op != "scatter_value":
        for a, b, c in zip(g_src.unbind(), want_src, srcs):
            torch.testing.assert_close(a, torch.zeros_like(c) if b is None else b)


def test_in_place_scatter_into_a_dense_tensor_counts_each_samples_tokens():
    """``counts.scatter_add_(1, experts, ones)``: each sample's tokens per expert (a mixture of
    experts' load), in place, as dense per sample; another sample's experts leave a row unchanged."""
    experts = mj.nested_tensor([torch.tensor([0, 2, 2]), torch.tensor([], dtype=torch.int64), torch.tensor([1, 3])])
    counts = torch.zeros(3, 4)
    ret = counts.scatter_add_(1, experts, torch.ones_like(experts, dtype=torch.float32))
    assert ret is counts
    assert counts.tolist() == [[1, 0, 2, 0], [0, 0, 0, 0], [0, 1, 0, 1]]  # = sample 0: experts 0, 2, 2
    other = mj.nested_tensor([torch.tensor([0, 2, 2]), torch.tensor([], dtype=torch.int64), torch.tensor([0, 0])])
    again = torch.zeros(3, 4).scatter_add_(1, other, torch.ones_like(other, dtype=torch.float32))
    assert torch.equal(again[:2], counts[:2]) and again[2].tolist() == [2, 0, 0, 0]
    # through a view that autograd records: the gradient of the written values reaches self's leaf
    base = torch.zeros(3, 4, requires_grad=True)
    y = base * 1
    y.scatter_(1, experts, 7.0)
    (g,) = torch.autograd.grad(y.sum(), base)
    assert g.tolist() == [[0, 1, 0, 1], [1, 1, 1, 1], [1, 0, 1, 0]]  # = 0 where overwritten


def test_scatter_into_a_dense_tensor_errors_as_dense():
    idx = mj.nested_tensor([torch.tensor([0, 5]), torch.tensor([1])])
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.zeros(2, 4).scatter_add(1, idx, torch.ones_like(idx, dtype=torch.float32))
    long = mj.nested_tensor([torch.zeros(3, 2, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int64)])
    with pytest.raises(RuntimeError, match="no larger than self"):
        torch.zeros(2, 2, 4).scatter(2, long, 1.0)  # a sample's 3 rows where self has 2
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        torch.zeros(2, 4, 1).scatter(1, idx, 1.0)
    with pytest.raises(mj.StructureError, match="batch dim"):
        torch.zeros(2, 4).scatter(0, idx, 1.0)
    with pytest.raises(mj.StructureError, match="shape of index"):
        ok = mj.nested_tensor([torch.tensor([0, 3]), torch.tensor([1])])
        torch.zeros(2, 4).scatter_add(1, ok, mj.nested_tensor([torch.ones(1), torch.ones(2)]))


def test_scatter_into_a_dense_tensor_under_compile_breaks_the_graph_and_runs_eagerly():
    """The host checks make it a graph break under ``torch.compile``: the eager result, not an error."""
    idx = mj.nested_tensor([torch.tensor([0, 2, 2]), torch.tensor([1])])

    @torch.compile(backend="eager")
    def counts(i):
        return torch.zeros(2, 4).scatter_add(1, i, torch.ones_like(i, dtype=torch.float32)) * 2

    assert counts(idx).tolist() == [[2, 0, 4, 0], [0, 2, 0, 0]]


@pytest.mark.parametrize("layout", ["tokens", "rows", "static dim"])
def test_gather_from_a_dense_tensor_per_sample(layout):
    """``dense.gather(dim, index)`` with a multi_jagged index: each sample's dense gather, a
    multi_jagged result with the index's nested ints; gradients to the dense input."""
    base, idx, _, d = _case(layout)
    index = mj.nested_tensor(idx)
    leaf = base.clone().requires_grad_()
    out = torch.gather(leaf, d, index)
    assert isinstance(out, mj.MultiJaggedTensor) and out.shape[1] == index.shape[1]
    refs = [base[i].gather(d - 1, c) for i, c in enumerate(idx)]
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)
    w = [torch.randn(r.shape, dtype=F64, generator=torch.Generator().manual_seed(k)) for k, r in enumerate(refs)]
    (got,) = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), w)), leaf)
    leaves = [base[i].clone().requires_grad_() for i in range(len(idx))]
    want = torch.autograd.grad(sum((b.gather(d - 1, c) * wi).sum() for b, c, wi in zip(leaves, idx, w)), leaves,
                               allow_unused=True)
    torch.testing.assert_close(got, torch.stack([torch.zeros_like(b) if g is None else g for b, g in zip(leaves, want)]))


def test_gather_of_a_buffer_by_position_ids_as_roberta_embeds():
    """RoBERTa's ``token_type_ids.expand(B, -1).gather(1, position_ids)`` on a ragged batch."""
    x = mj.nested_tensor([torch.randn(n, 4) for n in (3, 1, 5, 0)])
    buffer = torch.arange(10).expand(4, -1)
    out = torch.gather(buffer, 1, mj.position_ids(x))
    assert [t.tolist() for t in out.unbind()] == [[0, 1, 2], [0], [0, 1, 2, 3, 4], []]
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(torch.arange(4).expand(4, -1), 1, mj.position_ids(x))  # position 4 where input has 4
    with pytest.raises(RuntimeError, match="no larger than input"):  # a sample of 5 rows where input has 3
        torch.gather(torch.zeros(4, 3, 10, dtype=torch.int64), 2, mj.position_ids(x).unsqueeze(-1))
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(torch.arange(10).expand(4, -1), 1, mj.position_ids(x) + 6)
