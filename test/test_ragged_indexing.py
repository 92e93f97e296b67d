"""Indexing and joins along ragged dims, per sample (NOTE [ Indexing along ragged dims ]):
``x[:, i]``, slices, ``narrow``, ``index_select``, ``gather`` / ``scatter`` /
``take_along_dim``, ``flip``, ``roll``, ``cat``, ``F.pad``, ``repeat`` / ``tile`` — against the
per-sample reference (each sample's dense op along dim ``d - 1``), with gradients of every leaf,
zero-length samples, B = 0, three ragged dims, every dtype, and the dense error where dense
raises, naming the sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import ALL_LAYOUTS, DTYPES, SEQ, SQUARE, RECT3_MID, build, few, grid, seeds, structures
from _structures import assert_samples_and_grads

F64 = torch.float64


def _outputs(out, batch: int) -> list:
    if isinstance(out, mj.MultiJaggedTensor):
        return list(out.unbind())
    assert isinstance(out, torch.Tensor) and out.shape[0] == batch, f"expected a dense (B, …) output, got {out!r}"
    return list(out)


def check(fn, ref, comps, ragged_dims, grad: bool = True):
    """``fn(x)`` per sample equals ``ref(component)`` (shape, dtype, values); with ``grad``, the
    gradients of every component leaf agree under a random cotangent. Where ``ref`` raises for
    some sample, ``fn`` raises the same type, naming that sample."""
    grad = grad and len(comps) > 0 and comps[0].is_floating_point()
    x, leaves = build(comps, ragged_dims, requires_grad=grad)
    ref_leaves = [c.detach().clone().requires_grad_(grad) for c in comps]
    expected = []
    for i, c in enumerate(ref_leaves):
        try:
            expected.append(ref(c))
        except Exception as e:  # dense raises for this sample: so must we, naming it
            with pytest.raises(type(e), match=rf"sample {i}\b"):
                fn(x)
            return None
    out = fn(x)
    got = _outputs(out, len(comps))
    assert len(got) == len(expected)
    for i, (o, e) in enumerate(zip(got, expected)):
        assert tuple(o.shape) == tuple(e.shape), f"sample {i}: shape {tuple(o.shape)} != {tuple(e.shape)}"
        assert o.dtype == e.dtype, f"sample {i}: dtype {o.dtype} != {e.dtype}"
        torch.testing.assert_close(o, e, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"sample {i}: {m}")
    if grad and any(e.requires_grad for e in expected):
        gen = torch.Generator().manual_seed(0)
        cot = [torch.randn(e.shape, generator=gen, dtype=e.dtype) for e in expected]
        g1 = torch.autograd.grad(sum((o * c).sum() for o, c in zip(got, cot)), leaves, allow_unused=True)
        g2 = torch.autograd.grad(sum((e * c).sum() for e, c in zip(expected, cot)), ref_leaves, allow_unused=True)
        for i, (a, b, leaf) in enumerate(zip(g1, g2, ref_leaves)):
            a = torch.zeros_like(leaf) if a is None else a
            b = torch.zeros_like(leaf) if b is None else b
            torch.testing.assert_close(a, b, msg=lambda m: f"grad of sample {i}: {m}")
    return out


def _at(d: int, item, ndim: int):
    """``item`` at logical dim d: a full index tuple for the batch (``x[:, :, item]``) and the
    same for a component (``c[:, item]``)."""
    return (slice(None),) * d + (item,), (slice(None),) * (d - 1) + (item,)


# ----------------------------------------------------------------------------- the grid
def _cases(d: int, x_ndim: int, lengths: list[int]):
    """(name, fn on the batch, ref on a component) for ragged dim d; ``lengths`` along it."""
    c = d - 1
    short = min(lengths, default=0)
    last = x_ndim - 1
    cases = {}
    for name, it in (("0", 0), ("-1", -1), ("1", 1), ("shortest-1", short - 1 if short else 0)):
        bi, ci = _at(d, it, x_ndim)
        cases[f"x[{name}]"] = (lambda x, bi=bi: x[bi], lambda t, ci=ci: t[ci])
        cases[f"select({name})"] = (lambda x, it=it: x.select(d, it), lambda t, it=it: t.select(c, it))
    for sl in (slice(1, None), slice(None, 2), slice(-2, None), slice(None, None, 2), slice(1, -1), slice(0, 1), slice(5, None),
               slice(-9, 9, 3)):
        bi, ci = _at(d, sl, x_ndim)
        cases[f"slice{(sl.start, sl.stop, sl.step)}"] = (lambda x, bi=bi: x[bi], lambda t, ci=ci: t[ci])
    for name, start, length in (("0,shortest", 0, short), ("-1,1", -1, 1), ("1,shortest-1", 1, max(short - 1, 0))):
        cases[f"narrow({name})"] = (lambda x, s=start, n=length: x.narrow(d, s, n), lambda t, s=start, n=length: t.narrow(c, s, n))
    idx = torch.tensor([0, short - 1, 0] if short else [], dtype=torch.int64)
    cases["index_select"] = (lambda x: x.index_select(d, idx), lambda t: t.index_select(c, idx))
    cases["flip"] = (lambda x: x.flip(d), lambda t: t.flip(c))
    cases["flip+static"] = (lambda x: x.flip([d, last]) if last != d else x.flip(d), lambda t: t.flip([c, last - 1]) if last != d else t.flip(c))
    cases["roll(1)"] = (lambda x: x.roll(1, d), lambda t: t.roll(1, c))
    cases["roll(-3)+static"] = (lambda x: x.roll((-3, 1), (d, last)) if last != d else x.roll(-3, d),
                               lambda t: t.roll((-3, 1), (c, last - 1)) if last != d else t.roll(-3, c))
    reps = [1] * x_ndim
    reps[d] = 2
    reps2 = list(reps)
    if last != d:
        reps2[last] = 3
    cases["repeat"] = (lambda x: x.repeat(reps), lambda t: t.repeat(reps[1:]))
    cases["repeat+static"] = (lambda x: x.repeat(*reps2), lambda t: t.repeat(reps2[1:]))
    cases["tile"] = (lambda x: x.tile(reps2[1:]), lambda t: t.tile(reps2[1:]))
    cases["cat(x,x)"] = (lambda x: torch.cat([x, x], d), lambda t: torch.cat([t, t], c))
    cases["cat(x,x[1:])"] = (lambda x: torch.cat([x, x[_at(d, slice(1, None), x_ndim)[0]]], d),
                             lambda t: torch.cat([t, t[_at(d, slice(1, None), x_ndim)[1]]], c))
    pad = [0, 0] * (x_ndim - 1 - d)
    for mode, lr in (("constant", (1, 2)), ("constant", (-1, 1)), ("reflect", (1, 1)), ("replicate", (2, 0)), ("circular", (1, 1))):
        pp = pad + list(lr)
        # each sample padded as a batch of one (the ranks a mode takes are a batch's)
        cases[f"pad{lr}-{mode}"] = (lambda x, pp=pp, m=mode: F.pad(x, pp, mode=m), lambda t, pp=pp, m=mode: F.pad(t[None], pp, mode=m)[0])
    return cases


_NAMES = list(_cases(1, 3, [2, 3]))


@pytest.mark.parametrize("case", _NAMES)
@given(data=st.data(), s=st.sampled_from(ALL_LAYOUTS).flatmap(lambda lay: structures(lay, min_batch=0)), seed=seeds)
@grid
def test_per_sample(case, data, s, seed):
    """Every op of the grid, on every layout and each of its ragged dims, in float64 with gradients."""
    comps = s.components(seed)
    d = data.draw(st.sampled_from(s.ragged_dims))
    k = s.ragged_dims.index(d)
    lengths = [sz[k] for sz in s.sizes]
    fn, ref = _cases(d, len(s.shapes.template) + 1, lengths)[case]
    check(fn, ref, comps, s.ragged_dims)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["x[0]", "slice(1, None, None)", "flip", "cat(x,x)", "pad(1, 2)-constant",
                                  "repeat", "index_select", "roll(1)"])
@given(s=structures(SEQ, min_batch=0), seed=seeds)
@grid
def test_dtypes(dtype, case, s, seed):
    comps = s.components(seed, dtype=dtype)
    fn, ref = _cases(1, 3, [sz[0] for sz in s.sizes])[case]
    check(fn, ref, comps, s.ragged_dims)


# ----------------------------------------------------------------------------- gather / scatter
@st.composite
def _gather_case(draw, layout=SEQ):
    s = draw(structures(layout, min_batch=1))
    d = draw(st.sampled_from(s.ragged_dims))
    k = s.ragged_dims.index(d)
    seed = draw(seeds)
    g = torch.Generator().manual_seed(seed)
    index = []
    for shape, sz in zip(s.shapes, s.sizes):
        n = sz[k]
        m = draw(st.integers(0, 3)) if n else 0
        ishape = list(shape)
        ishape[d - 1] = m
        index.append(torch.randint(0, max(n, 1), ishape, generator=g))
    return s, d, seed, index


@given(case=st.sampled_from([SEQ, SQUARE, RECT3_MID]).flatmap(_gather_case))
@few(12)
def test_gather_with_a_multi_jagged_index(case):
    """``gather`` along a ragged dim with an index of any extent there: the index's shape."""
    s, d, seed, index = case
    idx = mj.nested_tensor(index, ragged_dims=s.ragged_dims)
    comps = s.components(seed)
    it = iter(index)
    out = check(lambda x: x.gather(d, idx), lambda t: t.gather(d - 1, next(it)), comps, s.ragged_dims)
    assert torch.equal(out.sizes(), idx.sizes())  # the index's structure (its nested ints, or x's where equal)
    it = iter(index)
    check(lambda x: torch.take_along_dim(x, idx, d), lambda t: torch.take_along_dim(t, next(it), d - 1), comps, s.ragged_dims)


@given(s=structures(SEQ, min_batch=1), seed=seeds)
@few(12)
def test_scatter_and_scatter_add_per_sample(s, seed):
    g = torch.Generator().manual_seed(seed)
    perms = [torch.stack([torch.randperm(n, generator=g) for _ in range(c.shape[1])], 1) if n else torch.zeros(0, c.shape[1], dtype=torch.int64)
             for n, c in ((sz[0], c) for sz, c in zip(s.sizes, s.components(seed)))]
    index = mj.nested_tensor(perms, ragged_dims=(1,))
    srcs = [torch.randn(p.shape, generator=g, dtype=F64) for p in perms]
    src = mj.nested_tensor(srcs, ragged_dims=(1,))
    for name in ("scatter", "scatter_add"):
        it = iter(zip(perms, srcs))
        check(lambda x: getattr(x, name)(1, index, src), lambda t: getattr(t, name)(0, *next(it)), s.components(seed), (1,))


def test_gather_dense_index_and_errors():
    comps = [torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), torch.tensor([[7.0, 8.0]])]
    x = mj.nested_tensor(comps)
    idx = torch.tensor([[[2, 0], [1, 1]], [[0, 0], [0, 0]]])  # (B, m=2, C)
    assert x.gather(1, idx).tolist() == [[[5.0, 2.0], [3.0, 4.0]], [[7.0, 8.0], [7.0, 8.0]]]  # = comp[idx[j, c], c]
    with pytest.raises(RuntimeError, match="sample 1"):
        x.gather(1, torch.tensor([[[2, 0]], [[1, 0]]]))  # sample 1 has one row
    with pytest.raises(IndexError, match="sample 1"):
        x.index_select(1, torch.tensor([0, 2]))


@pytest.mark.parametrize("call", [
    lambda x, i, s: x.scatter(1, i, s),
    lambda x, i, s: x.scatter_add(1, i, s),
    lambda x, i, s: x.scatter_reduce(1, i, s, "sum"),
    lambda x, i, s: x.clone().scatter_add_(1, i, s),
], ids=["scatter", "scatter_add", "scatter_reduce", "scatter_add_"])
def test_scatter_src_of_other_lengths_refuses(call):
    """A src whose samples' lengths differ from the index's, with the same packed rows in total,
    would read its neighbours' rows: it raises, as gather and index_add do."""
    x = mj.nested_tensor([torch.zeros(3, 1), torch.zeros(3, 1)])
    index = mj.nested_tensor([torch.zeros(3, 1, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64)])
    src = mj.nested_tensor([torch.tensor([[1.0], [2.0]]), torch.tensor([[10.0], [20.0], [40.0]])])
    with pytest.raises(mj.StructureError, match="src with the shape of index"):
        call(x, index, src)
    same = mj.nested_tensor([torch.ones(3, 1), torch.ones(2, 1)])  # equal lengths, another nested int
    assert [c.tolist() for c in x.scatter_add(1, index, same).unbind()] == [[[3.0], [0.0], [0.0]], [[2.0], [0.0], [0.0]]]


# ----------------------------------------------------------------------------- structure rule
def test_structure_rule_golden():
    x = mj.nested_tensor([torch.arange(6.0).view(3, 2), torch.arange(2.0).view(1, 2), torch.zeros(0, 2)])
    assert x[:, 1:].shape[1] == x[:, 1:].shape[1]  # one slice rule on one extent: one nested int
    assert x.flip(1).shape[1] == x.shape[1] and x.roll(1, 1).shape[1] == x.shape[1]  # sizes kept: the same one
    assert x[:, 1:].sizes().tolist() == [[2], [0], [0]]  # = max(n - 1, 0)
    assert x[:, ::2].sizes().tolist() == [[2], [1], [0]]  # = ceil(n / 2)
    assert [c.tolist() for c in x[:, -2:].unbind()] == [[[2.0, 3.0], [4.0, 5.0]], [[0.0, 1.0]], []]
    with pytest.raises(IndexError, match="sample 2"):
        x[:, 0]  # sample 2 is empty
    two = mj.nested_tensor([torch.arange(6.0).view(3, 2), torch.arange(4.0).view(2, 2)])
    pair = two.unsqueeze(-2) + two.unsqueeze(-3)  # (B, j0, j0, 2)
    col = pair[:, :, 0]  # column 0 of each sample: (B, j0, 2) with the singles' nested int
    assert col.shape[1] == two.shape[1] and [c.tolist() for c in col.unbind()][1] == [[0.0, 2.0], [2.0, 4.0]]  # = x_a + x_0
    head = two[:, 0]  # every ragged dim gone: dense (B, C)
    assert type(head) is torch.Tensor and head.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    n = two.narrow(1, -2, 2)  # a size fixed by the arguments: static, hence dense here
    assert type(n) is torch.Tensor and n.tolist() == [[[2.0, 3.0], [4.0, 5.0]], [[0.0, 1.0], [2.0, 3.0]]]
    p2 = two.unsqueeze(-2) + two.unsqueeze(-3)
    q = p2.narrow(2, 0, 1)  # (B, j0, 1, 2): dim 2 static, dim 1 ragged
    assert isinstance(q, mj.MultiJaggedTensor) and q.ragged_dims == (1,) and q.shape[2] == 1
    assert [c.shape for c in q.unbind()] == [torch.Size([3, 1, 2]), torch.Size([2, 1, 2])]


def test_prepend_class_token():
    """``torch.cat([cls.expand(B, 1, C), x], 1)`` and the ``(1, 1, C)`` form: per sample."""
    comps = [torch.randn(3, 4, dtype=F64), torch.randn(0, 4, dtype=F64), torch.randn(2, 4, dtype=F64)]
    cls = torch.randn(1, 1, 4, dtype=F64, requires_grad=True)
    x, leaves = build(comps, (1,), requires_grad=True)
    for out in (torch.cat([cls.expand(3, 1, 4), x], dim=1), torch.cat([cls, x], 1), torch.cat([x, cls], 1)):
        first = out.unbind()
        assert [c.shape[0] for c in first] in ([4, 1, 3],)
    y = torch.cat([cls.expand(3, 1, 4), x], dim=1)
    for c, t in zip(y.unbind(), comps):
        torch.testing.assert_close(c, torch.cat([cls[0], t]))
    y.values().sum().backward()
    torch.testing.assert_close(cls.grad, torch.full((1, 1, 4), 3.0, dtype=F64))  # = one copy per sample
    assert all(torch.equal(leaf.grad, torch.ones_like(leaf)) for leaf in leaves)
    pooled = y[:, 0]  # the class token back: dense (B, C)
    torch.testing.assert_close(pooled, cls[0].expand(3, 4))


# ----------------------------------------------------------------------------- properties
@pytest.mark.parametrize("case", ["slice(1, None, None)", "flip", "cat(x,x[1:])", "pad(1, 2)-constant", "roll(1)", "x[-1]"])
@given(s=structures(SEQ, min_batch=2), seed=seeds, j=st.integers(0, 10))
@grid
def test_no_leakage(case, s, seed, j):
    """Changing sample j changes no output of another sample."""
    comps = s.components(seed)
    j = j % len(comps)
    other = list(comps)
    other[j] = comps[j] + 1.0
    fn, _ = _cases(1, 3, [sz[0] for sz in s.sizes])[case]
    try:
        a = _outputs(fn(mj.nested_tensor(comps)), len(comps))
    except (IndexError, RuntimeError):
        return  # a sample the op refuses (checked in test_per_sample)
    b = _outputs(fn(mj.nested_tensor(other)), len(comps))
    for i in range(len(comps)):
        if i != j:
            assert torch.equal(a[i], b[i]), f"sample {i} changed when sample {j} did"


@pytest.mark.parametrize("case", ["slice(1, None, None)", "cat(x,x)", "pad(1, 2)-constant", "x[-1]", "roll(1)", "repeat", "narrow(-1,1)"])
def test_second_order(case):
    comps = [torch.randn(3, 2, dtype=F64), torch.randn(2, 2, dtype=F64), torch.randn(4, 2, dtype=F64)]
    fn, _ = _cases(1, 3, [3, 2, 4])[case]

    def f(*leaves):
        out = fn(mj.as_nested_tensor(list(leaves)))
        return out.values() if isinstance(out, mj.MultiJaggedTensor) else out

    assert torch.autograd.gradgradcheck(f, tuple(c.requires_grad_() for c in comps))


def test_inference_mode():
    comps = [torch.randn(3, 2), torch.randn(1, 2)]
    x = mj.nested_tensor(comps)
    with torch.inference_mode():
        y = torch.cat([x[:, 1:], x.flip(1)], 1)
    for c, t in zip(y.unbind(), comps):
        assert torch.equal(c, torch.cat([t[1:], t.flip(0)]))


def test_compiled_slice_is_a_graph_break():
    """A slice makes a new extent from host sizes: under torch.compile a graph break (the
    regions around it compile), with fullgraph an error naming the op."""
    def f(x):
        return (x[:, 1:] * 2).sum(1)

    comps = [torch.randn(3, 2), torch.randn(2, 2)]
    x = mj.nested_tensor(comps)
    torch.testing.assert_close(torch.compile(f, backend="aot_eager")(x), f(x))
    with pytest.raises(Exception, match="slice"):  # a new function: the one above has its cache entry
        torch.compile(lambda x: (x[:, 1:] * 2).sum(1), backend="aot_eager", fullgraph=True)(mj.nested_tensor(comps))


WHOLE_SLICES = {
    "[:, 0:]": lambda x: x[:, 0:],
    "[..., 0:, :]": lambda x: x[..., 0:, :],
    "[:, ::1]": lambda x: x[:, ::1],
    "[0:, 0::1]": lambda x: x[0:, 0::1],
}


@pytest.mark.parametrize("index", WHOLE_SLICES)
def test_whole_slice_along_a_ragged_dim_keeps_the_extent_and_compiles(index):
    """``0:`` / ``::1`` take every index of every sample (``k[..., mem_len:, :]`` with
    ``mem_len = 0``, as x-transformers writes its cache): the same extent, per sample the dense
    slice, gradients included, and under torch.compile(fullgraph=True) one graph over changing
    lengths (a slice that changes sizes is a graph break, above)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    f = lambda x: WHOLE_SLICES[index](x) * 2  # noqa: E731
    cc = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cc, fullgraph=True)
    for ns in ([3, 0, 4], [2, 5, 1], [4, 4, 2]):
        comps = [torch.randn(n, 2, dtype=F64, requires_grad=True) for n in ns]
        x = mj.as_nested_tensor(comps)
        for fn in (f, cf):
            out = fn(x)
            assert out.shape[1] == x.shape[1]  # x's own nested int
            got = list(out.unbind())
            refs = [c * 2 for c in comps]  # a whole slice of each sample is the sample
            for a, r in zip(got, refs):
                torch.testing.assert_close(a, r)
            g1 = torch.autograd.grad(sum((a ** 2).sum() for a in got), comps)
            g2 = torch.autograd.grad(sum((r ** 2).sum() for r in refs), comps)
            for a, b in zip(g1, g2):
                torch.testing.assert_close(a, b)
    assert cc.frame_count == 1
    torch._dynamo.reset()


def test_compiled_ops_without_a_new_extent_are_one_graph():
    """``x[:, i]``, ``narrow``, ``index_select``, ``flip``, ``roll``, ``gather`` / ``scatter`` (with
    an index of an existing extent) make no new extent: under
    torch.compile(fullgraph=True) one graph serves changing lengths, gradients included; a sample
    too short fails in the graph (an assert: the message cannot name the sample)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    idx = torch.tensor([0, 0])

    def f(x):
        pooled = x[:, 0] + x[:, -1] + x.narrow(1, 0, 1).sum(1) + x.index_select(1, idx).sum(1)
        order = x[..., :1].argsort(1, descending=True).expand(-1, -1, 2)  # (B, j0, 2), x's extent
        return pooled.unsqueeze(1) * x.flip(1).roll(1, 1) + x.gather(1, order) + x.scatter(1, order, x * 2)

    cc = CompileCounterWithBackend("aot_eager")
    cf = torch.compile(f, backend=cc, fullgraph=True)
    for ns in ([3, 1, 4], [2, 5, 1], [4, 4, 2]):
        comps = [torch.randn(n, 2, dtype=F64) for n in ns]
        x1, x2 = (mj.nested_tensor(comps, requires_grad=True) for _ in range(2))
        out, ref = cf(x1), f(x2)
        torch.testing.assert_close(out.values(), ref.values())
        (g1,), (g2,) = torch.autograd.grad(out.values().sum(), [x1]), torch.autograd.grad(ref.values().sum(), [x2])
        torch.testing.assert_close(g1.values(), g2.values())
    assert cc.frame_count == 1
    with pytest.raises(RuntimeError, match="out of bounds"):
        cf(mj.nested_tensor([torch.randn(n, 2, dtype=F64) for n in (2, 0, 3)]))
    torch._dynamo.reset()


def test_from_mask_keeps_each_samples_masked_positions_in_order():
    dense = torch.arange(12.0, dtype=F64).view(2, 3, 2).requires_grad_()
    keep = torch.tensor([[True, False, True], [False, False, False]])
    x = mj.from_mask(dense, keep)
    assert x.sizes().tolist() == [[2], [0]]  # = keep.sum(1)
    assert [c.tolist() for c in x.unbind()] == [[[0.0, 1.0], [4.0, 5.0]], []]  # = dense[0, [0, 2]], dense[1, []]
    (g,) = torch.autograd.grad(x.values().sum(), dense)
    assert torch.equal(g, keep.unsqueeze(-1).expand(2, 3, 2).to(F64))  # = 1 where kept
    with pytest.raises(TypeError, match="bool"):
        mj.from_mask(dense, keep.long())
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        mj.from_mask(dense, keep[:, :2])


@pytest.mark.parametrize("n", [0, 1, 2, 4])
@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT3_MID], ids=lambda l: l.name)
@given(data=st.data(), seed=seeds)
@few(8)
def test_diff_along_each_ragged_dim(layout, n, data, seed):
    # per sample x[1:] - x[:-1] along the dim, n times; an empty or short sample gives an empty one
    s = data.draw(structures(layout, min_batch=0))
    comps = s.components(seed)
    for d in s.ragged_dims:
        check(lambda x: torch.diff(x, n=n, dim=d), lambda c: torch.diff(c, n=n, dim=d - 1), comps, s.ragged_dims)
        check(lambda x: x.diff(n, d), lambda c: c.diff(n, d - 1), comps, s.ragged_dims)


def test_diff_along_a_ragged_dim_leaves_other_samples_alone():
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(k, 3, generator=g, dtype=F64) for k in (4, 0, 3)]
    base = torch.diff(mj.nested_tensor(comps), dim=1).unbind()
    comps[2] = comps[2] * 10
    changed = torch.diff(mj.nested_tensor(comps), dim=1).unbind()
    assert torch.equal(base[0], changed[0]) and torch.equal(base[1], changed[1])


@pytest.mark.parametrize("dim", [1, 2])
def test_diff_of_order_zero_is_a_new_tensor(dim):
    """``diff(n=0)`` returns a copy, as dense: a write into it leaves the input as it was."""
    x = mj.nested_tensor([torch.arange(2.0 * k).view(k, 2) for k in (3, 0, 5)])
    before = [c.clone() for c in x.unbind()]
    d = x.diff(n=0, dim=dim)
    assert d is not x
    d.zero_()
    assert all(torch.equal(a, b) for a, b in zip(x.unbind(), before))


def test_diff_along_a_ragged_dim_errors():
    x = mj.nested_tensor([torch.randn(3, 2), torch.randn(1, 2)])
    with pytest.raises(RuntimeError, match="order must be non-negative but got -1"):
        torch.diff(x, n=-1, dim=1)
    for a, c in zip(torch.diff(x, dim=1, prepend=x).unbind(), x.unbind()):  # joined per sample, as dense
        torch.testing.assert_close(a, torch.diff(c, dim=0, prepend=c))


@pytest.mark.parametrize("layout", [SEQ, SQUARE, RECT3_MID], ids=lambda l: l.name)
@given(data=st.data(), seed=seeds, size=st.integers(1, 3), step=st.integers(1, 3))
@few(8)
def test_unfold_along_each_ragged_dim(layout, data, seed, size, step):
    """``x.unfold(d, size, step)`` per sample: ``(n - size) // step + 1`` windows along the dim,
    their elements in a new last dim; a sample shorter than the window (an empty one) raises as
    dense torch does, naming it."""
    s = data.draw(structures(layout, min_batch=0))
    comps = s.components(seed)
    for d in s.ragged_dims:
        check(lambda x: x.unfold(d, size, step), lambda c: c.unfold(d - 1, size, step), comps, s.ragged_dims)


@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=3), pair=st.booleans(),
       size=st.integers(1, 3), step=st.integers(1, 3), seed=seeds)
@few(10)
def test_unfold_along_a_ragged_dim_long_enough_samples(lengths, pair, size, step, seed):
    # every sample holds the window: the values path, not the error
    g = torch.Generator().manual_seed(seed)
    ns = [size + n for n in lengths]
    comps = [torch.randn(*((n, n) if pair else (n,)), 2, generator=g, dtype=F64) for n in ns]
    for d in ((1, 2) if pair else (1,)):
        check(lambda x: x.unfold(d, size, step), lambda c: c.unfold(d - 1, size, step), comps,
              (1, 2) if pair else (1,))


def test_unfold_along_a_ragged_dim_second_order_no_leakage_and_errors():
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=F64, requires_grad=True) for n in (4, 2, 5)]
    x = mj.as_nested_tensor(comps)
    y = x.unfold(1, 2, 1)
    refs = [c.unfold(0, 2, 1) for c in comps]
    g1 = torch.autograd.grad(sum((a ** 3).sum() for a in y.unbind()), comps, create_graph=True)
    r1 = torch.autograd.grad(sum((a ** 3).sum() for a in refs), comps, create_graph=True)
    g2 = torch.autograd.grad(sum((a * a).sum() for a in g1), comps)
    r2 = torch.autograd.grad(sum((a * a).sum() for a in r1), comps)
    for a, b in zip(g1 + g2, r1 + r2):
        torch.testing.assert_close(a, b)
    assert x.unfold(1, 2, 1).shape[1] == y.shape[1]  # one nested int per rule
    changed = [c.detach() * (10 if i == 2 else 1) for i, c in enumerate(comps)]
    other = mj.nested_tensor(changed).unfold(1, 2, 1).unbind()
    assert all(torch.equal(a.detach(), b) for a, b in zip(y.unbind()[:2], other[:2]))
    with pytest.raises(RuntimeError, match=r"step is 0 but must be > 0"):
        x.unfold(1, 2, 0)
    with pytest.raises(RuntimeError, match=r"size is -1 but must be >= 0"):
        x.unfold(1, -1, 1)
    with pytest.raises(RuntimeError, match=r"maximum size for tensor at dimension 1 is 2 but size is 3 in sample 1"):
        x.unfold(1, 3, 1)
    with pytest.raises(NotImplementedError, match=r"size 0"):
        x.unfold(1, 0, 1)


def test_take_with_per_sample_indices():
    """``torch.take`` per sample: each sample's indices into its own elements (row-major, negative
    from the end), the result shaped as the index; gradients scatter back per sample."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 2, dtype=torch.float64, generator=g, requires_grad=True) for n in (3, 0, 4)]
    idx = [torch.tensor([5, 0, -1]), torch.zeros(0, dtype=torch.int64), torch.tensor([7, -8, 2, 2, 1])]
    x = mj.as_nested_tensor(comps)
    index = torch.nested.nested_tensor(idx, layout=mj.multi_jagged)
    assert_samples_and_grads(torch.take(x, index), [torch.take(c, i) for c, i in zip(comps, idx)], comps)
    bad = torch.nested.nested_tensor([torch.tensor([6]), torch.zeros(0, dtype=torch.int64), torch.tensor([0])],
                                     layout=mj.multi_jagged)
    with pytest.raises(IndexError, match="sample 0 of 6 elements"):
        torch.take(x, bad)
    with pytest.raises(NotImplementedError, match="multi_jagged index"):
        torch.take(x, torch.tensor([0]))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_along_the_ragged_dim_message_passing(reduce, include_self):
    """Message passing over a batch of graphs: node states ``(B, j_nodes, C)``, one message per edge
    ``(B, j_edges, C)`` and each edge's target node; every sample's messages reduce into its own
    nodes, as ``scatter_reduce`` on that sample alone (gradients of nodes and messages)."""
    g = torch.Generator().manual_seed(0)
    nodes_n, edges_n, c = (4, 0, 3, 2), (6, 0, 0, 5), 3
    nodes = [torch.rand(n, c, dtype=torch.float64, generator=g).requires_grad_() for n in nodes_n]
    msgs = [torch.rand(e, c, dtype=torch.float64, generator=g).requires_grad_() for e in edges_n]
    targets = [torch.randint(0, max(n, 1), (e,), generator=g) for n, e in zip(nodes_n, edges_n)]
    x = mj.as_nested_tensor(nodes)
    m = mj.as_nested_tensor(msgs)
    idx = torch.nested.nested_tensor(targets, layout=mj.multi_jagged).unsqueeze(-1).expand(-1, -1, c)
    out = x.scatter_reduce(1, idx, m, reduce, include_self=include_self)
    refs = [n.scatter_reduce(0, t.unsqueeze(-1).expand(-1, c), e, reduce, include_self=include_self)
            for n, t, e in zip(nodes, targets, msgs)]
    assert_samples_and_grads(out, refs, nodes + msgs)


@pytest.mark.parametrize("layout", ["seq", "static_lead"])
def test_repeat_interleave_along_the_ragged_dim(layout):
    """A length regulator (each phoneme held for its duration: per-position counts, zeros
    included) and a scalar repeat, against each sample's own ``repeat_interleave``; gradients."""
    g = torch.Generator().manual_seed(0)
    ns = (3, 0, 4)
    if layout == "seq":
        comps = [torch.randn(n, 2, dtype=torch.float64, generator=g).requires_grad_() for n in ns]
        rd, d = (1,), 1
    else:
        comps = [torch.randn(2, n, 3, dtype=torch.float64, generator=g).requires_grad_() for n in ns]
        rd, d = (2,), 2
    durations = [torch.randint(0, 3, (n,), generator=g) for n in ns]
    x = mj.as_nested_tensor(comps, ragged_dims=rd)
    # the durations on the batch's own extent (its offsets): one count per position of each sample
    dur = mj.nested_tensor_from_jagged(torch.cat(durations), x.offsets(d))
    for reps, per in ((2, [2] * len(ns)), (None, durations)):
        if reps is None:
            out = x.repeat_interleave(dur, dim=d)
        else:
            out = torch.repeat_interleave(x, reps, dim=d)
        assert_samples_and_grads(out, [c.repeat_interleave(r, dim=d - 1) for c, r in zip(comps, per)], comps)


def test_repeat_interleave_other_forms_and_errors():
    x = torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(1, 3)], layout=mj.multi_jagged)
    torch.testing.assert_close(x.repeat_interleave(2, dim=2).values(), x.values().repeat_interleave(2, dim=1))
    torch.testing.assert_close(x.repeat_interleave(2), x.values().reshape(-1).repeat_interleave(2))  # flattened, as dense
    a, b = torch.repeat_interleave(x, 3, dim=1), torch.repeat_interleave(x, 3, dim=1)
    assert a.shape[1] is b.shape[1]  # one size rule, one nested int: the results combine
    with pytest.raises(ValueError, match="one count per position"):
        x.repeat_interleave(torch.tensor([1, 2]), dim=1)
    with pytest.raises(RuntimeError, match="negative"):
        x.repeat_interleave(-1, dim=1)
    pair = mj.as_nested_tensor([torch.rand(2, 2), torch.rand(1, 1)], ragged_dims=(1, 2))
    with pytest.raises(NotImplementedError, match="several"):
        pair.repeat_interleave(2, dim=1)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_of_counts_alone_gives_each_sample_its_segment_ids(dtype):
    """``torch.repeat_interleave(counts)`` of a ``(B, j)`` integer batch: each sample's positions,
    each repeated its count, as dense per sample (an empty sample, zero counts); other ranks and
    negative counts raise as dense."""
    counts = [torch.tensor(c, dtype=dtype) for c in ([2, 0, 1], [], [3, 1], [0])]
    out = torch.repeat_interleave(torch.nested.nested_tensor(counts, layout=mj.multi_jagged))
    for a, c in zip(out.unbind(), counts):
        want = torch.repeat_interleave(c)
        assert a.dtype == want.dtype and torch.equal(a, want)
    with pytest.raises(RuntimeError, match="1D vector"):
        torch.repeat_interleave(mj.nested_tensor([torch.ones(2, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long)]))
    with pytest.raises(RuntimeError, match="negative"):
        torch.repeat_interleave(mj.nested_tensor([torch.tensor([-1, 2]), torch.tensor([1])]))


def test_gather_along_a_ragged_dim_with_a_static_number_of_positions():
    """k nearest neighbours (EGNN): ``d.gather(2, idx)`` / ``take_along_dim`` / ``scatter`` with the
    indices ``topk`` gives ``(B, j0, k)`` over a pair ``(B, j0, j0)`` (and over pair features
    ``(B, j0, j0, F)``) — per sample, with gradients; an index past a sample's end raises."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (3, 5, 2)]
    c = mj.nested_tensor(comps, requires_grad=True)
    d = ((c.unsqueeze(2) - c.unsqueeze(1)) ** 2).sum(-1)
    _, idx = d.topk(2, dim=-1, largest=False)
    f = c.unsqueeze(2) * c.unsqueeze(1)
    near = d.gather(2, idx)
    feats = f.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, 3))
    along = torch.take_along_dim(d, idx, 2)
    zeroed = d.scatter(2, idx, torch.zeros_like(near))
    leaves = [t.clone().requires_grad_() for t in comps]
    refs = []
    for t in leaves:
        dd = ((t[:, None] - t[None]) ** 2).sum(-1)
        _, ii = dd.topk(2, -1, largest=False)
        refs.append((dd.gather(1, ii), (t[:, None] * t[None]).gather(1, ii.unsqueeze(-1).expand(-1, -1, 3)),
                     dd.scatter(1, ii, torch.zeros(ii.shape, dtype=dd.dtype))))
    for i, (a, b, e, z) in enumerate(zip(near.unbind(), feats.unbind(), along.unbind(), zeroed.unbind())):
        torch.testing.assert_close(a, refs[i][0])
        torch.testing.assert_close(e, refs[i][0])
        torch.testing.assert_close(b, refs[i][1])
        torch.testing.assert_close(z, refs[i][2])
    loss = (near * near).sum() + (feats * feats).sum() + (zeroed * zeroed).sum()
    got, = torch.autograd.grad(loss, c)
    want = torch.autograd.grad(sum((r[0] ** 2).sum() + (r[1] ** 2).sum() + (r[2] ** 2).sum() for r in refs), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)
    rows = d.gather(1, idx.transpose(1, 2))  # along the first ragged dim: (B, 2, j0), stride n per row
    for a, t, i in zip(rows.unbind(), d.unbind(), idx.unbind()):
        torch.testing.assert_close(a, t.gather(0, i.T))
    bad = mj.nested_tensor([torch.full((n, 1), 2) for n in (3, 5, 2)])  # sample 2 has 2 columns
    with pytest.raises(RuntimeError, match="out of bounds"):
        d.gather(2, bad)


def test_diff_with_prepend_along_a_ragged_dim():
    """``torch.diff(p, prepend=p[:, :1] - 1, dim=-1)`` (transformers' packed-sequence detection from
    position ids): the pieces joined per sample first, as dense, with gradients."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in (3, 1, 0, 4)]
    x = mj.nested_tensor(comps, requires_grad=True)
    y = torch.diff(x, dim=1, prepend=x[:, :1] * 2, append=x[:, -1:] + 1)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [torch.diff(c, dim=0, prepend=c[:1] * 2, append=c[-1:] + 1) for c in leaves]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    got, = torch.autograd.grad((y * y).sum(), x)
    for a, w in zip(got.unbind(), torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)):
        torch.testing.assert_close(a, w)
    pos = mj.position_ids(x)
    assert [t.tolist() for t in torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1).unbind()] == [[1] * n for n in (3, 1, 0, 4)]


def test_slices_bounded_by_a_ragged_size():
    """``y[..., :n]`` and ``y.narrow(-1, 0, n)`` with ``n`` another tensor's ragged size of the same
    batch (a causal conv's output trimmed to its input's length, Mamba): each sample's own bound,
    and the result carries that nested int; ``x[:, :x.shape[1]]`` keeps every row."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(4, n, generator=g, dtype=torch.float64) for n in (3, 5, 2)]
    x = mj.nested_tensor(comps, requires_grad=True)
    conv = torch.nn.Conv1d(4, 4, 4, padding=3).double()
    y = conv(x)
    n = x.shape[-1]
    z, z2 = y[..., :n], y.narrow(-1, 0, n)
    assert bool(z.shape[-1] == n) and bool(z2.shape[-1] == n)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [conv(c[None])[0][..., :c.shape[-1]] for c in leaves]
    for a, b, r in zip(z.unbind(), z2.unbind(), refs):
        torch.testing.assert_close(a, r)
        torch.testing.assert_close(b, r)
    got, = torch.autograd.grad(((z + x) ** 2).sum(), x)  # one nested int: adds to x directly
    want = torch.autograd.grad(sum(((r + c) ** 2).sum() for r, c in zip(refs, leaves)), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)
    for a, c in zip(x[..., 1:n].unbind(), comps):
        torch.testing.assert_close(a, c[..., 1:])
    with pytest.raises(RuntimeError, match="exceeds"):
        x.narrow(-1, 0, y.shape[-1])  # longer than every sample
    with pytest.raises(TypeError, match="ragged size of the same batch"):
        x[..., :mj.nested_tensor([torch.randn(2)]).shape[1]]


# ----------------------------------------------------------------------------- arguments as torch names them
KEYWORD_CALLS = {  # name: (batched call, per-sample call), keywords as torch names them (NOTE [ Route arguments ])
    "flip(dims=)": (lambda x: torch.flip(x, dims=(1,)), lambda c: torch.flip(c, dims=(0,))),
    "x.flip(dims=)": (lambda x: x.flip(dims=[1, 2]), lambda c: c.flip(dims=[0, 1])),
    "x.reshape(shape=)": (lambda x: x.reshape(shape=(x.shape[0], x.shape[1], 6)), lambda c: c.reshape(shape=(c.shape[0], 6))),
    "torch.reshape(shape=)": (lambda x: torch.reshape(x, shape=(x.shape[0], x.shape[1], 6)), lambda c: c.reshape(c.shape[0], 6)),
    "x.view(size=)": (lambda x: x.view(size=(x.shape[0], x.shape[1], 6)), lambda c: c.view(size=(c.shape[0], 6))),
    "x.permute(dims=)": (lambda x: x.permute(dims=(0, 1, 3, 2)), lambda c: c.permute(dims=(0, 2, 1))),
    "torch.tile(dims=)": (lambda x: torch.tile(x, dims=(1, 2)), lambda c: torch.tile(c, dims=(1, 2))),
    "x.repeat(repeats=)": (lambda x: x.repeat(repeats=(1, 2, 1, 1)), lambda c: c.repeat(repeats=(2, 1, 1))),
    "index_fill(value=)": (lambda x: torch.index_fill(x, 2, torch.tensor([1]), value=-1.0),
                           lambda c: torch.index_fill(c, 1, torch.tensor([1]), value=-1.0)),
    "x.index_fill(value=) ragged": (lambda x: x.index_fill(1, torch.tensor([0]), value=-1.0),
                                    lambda c: c.index_fill(0, torch.tensor([0]), value=-1.0)),
}


@pytest.mark.parametrize("dtype", [F64, torch.int64])
@pytest.mark.parametrize("name", KEYWORD_CALLS)
def test_routes_take_keywords_as_torch_names_them(name, dtype):
    fn, ref = KEYWORD_CALLS[name]
    g = torch.Generator().manual_seed(0)
    lengths = (2, 0, 3) if "ragged" not in name else (2, 1, 3)  # index 0 along the ragged dim: in range
    comps = [(torch.randn(n, 3, 2, generator=g, dtype=F64) * 10).to(dtype) for n in lengths]
    check(fn, ref, comps, (1,))


def test_route_keywords_given_twice_raise_as_dense():
    x = mj.nested_tensor([torch.zeros(2, 3), torch.zeros(1, 3)])
    with pytest.raises(TypeError, match="multiple values for argument 'dims'"):
        x.flip(1, dims=(1,))
    with pytest.raises(TypeError, match="multiple values for argument 'dims'"):
        torch.zeros(2, 3).flip(1, dims=(1,))


# ----------------------------------------------------------------------------- take_along_dim's indices wrap
@pytest.mark.parametrize("dtype", [F64, torch.int64, torch.complex128])
def test_take_along_dim_takes_indices_modulo_each_samples_size_as_dense(dtype):
    """Dense ``take_along_dim`` takes indices modulo the size (``-1`` the last, ``n`` the first);
    along a ragged dim each sample's own size; ``gather`` refuses them, as dense."""
    g = torch.Generator().manual_seed(0)
    comps = [(torch.randn(n, 3, generator=g, dtype=F64) * 10).to(dtype) for n in (2, 0, 3)]
    along = [torch.tensor([[-1, 0, 3]]), torch.zeros(0, 3, dtype=torch.int64), torch.tensor([[-3, 5, -7], [2, -2, 0]])]
    idx = mj.nested_tensor(along)
    it = iter(along)
    check(lambda x: torch.take_along_dim(x, idx, 1), lambda c: torch.take_along_dim(c, next(it), 0), comps, (1,))
    static = [torch.tensor([[-1], [4]]), torch.zeros(0, 1, dtype=torch.int64), torch.tensor([[-3], [5], [0]])]
    sidx = mj.nested_tensor(static)
    it = iter(static)
    check(lambda x: x.take_along_dim(sidx, 2), lambda c: c.take_along_dim(next(it), 1), comps, (1,))
    dense = torch.tensor([[[-1, 2, -3]], [[0, 0, 0]], [[-2, 4, 1]]])  # (B, 1, C) along the ragged dim
    nonempty = [c for c in comps if c.shape[0]] + [comps[0]]
    dense2 = torch.stack([dense[0], dense[2], dense[0]])
    it = iter(dense2)
    check(lambda x: torch.take_along_dim(x, dense2, 1), lambda c: torch.take_along_dim(c, next(it), 0), nonempty, (1,))
    with pytest.raises(RuntimeError, match="out of bounds.*sample 0"):
        torch.gather(mj.nested_tensor(comps), 1, idx)


@pytest.mark.parametrize("shape", [lambda n: (2,), lambda n: (n, 3)], ids=["1d", "2d"])
def test_take_along_dim_without_dim_flattens_each_sample_as_dense(shape):
    """Without ``dim`` dense gathers from the input flattened by the indices flattened: each
    sample's indices address its own elements, and its result is one dim (the indices' dims
    flattened into one ragged dim); gradients scatter back per sample; a negative index raises,
    as ``gather``."""
    g = torch.Generator().manual_seed(0)
    lengths = (3, 1, 0, 5)
    comps = [torch.randn(n, 4, dtype=torch.float64, generator=g, requires_grad=True) for n in lengths]
    idx = [torch.randint(0, max(4 * n, 1), shape(n), generator=g) if n else torch.zeros((0,) + shape(n)[1:], dtype=torch.int64)
           for n in lengths]
    out = torch.take_along_dim(mj.as_nested_tensor(comps), mj.nested_tensor(idx))
    assert out.dim() == 2
    assert_samples_and_grads(out, [torch.take_along_dim(c, i) for c, i in zip(comps, idx)], comps)
    with pytest.raises(RuntimeError, match="index -1 is out of bounds"):
        torch.take_along_dim(mj.as_nested_tensor(comps), mj.nested_tensor([torch.tensor([-1])] * len(lengths)))


def test_take_along_dim_of_an_empty_sample_with_indices_raises():
    x = mj.nested_tensor([torch.zeros(2, 3), torch.zeros(0, 3)])
    idx = mj.nested_tensor([torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 3, dtype=torch.int64)])
    with pytest.raises(RuntimeError, match="sample 1"):
        torch.take_along_dim(x, idx, 1)


# ----------------------------------------------------------------------------- diff of bool
@pytest.mark.parametrize("n", [1, 2, 3])
def test_diff_of_bool_along_a_ragged_dim_is_xor_as_dense(n):
    g = torch.Generator().manual_seed(0)
    comps = [torch.rand(k, 2, generator=g) > 0.5 for k in (4, 0, 1, 3)]
    check(lambda x: torch.diff(x, n=n, dim=1), lambda c: torch.diff(c, n=n, dim=0), comps, (1,))
    check(lambda x: x.diff(n, 1, prepend=x), lambda c: c.diff(n, 0, prepend=c), comps, (1,))


# ----------------------------------------------------------------------------- index_* into a dense self
@pytest.mark.parametrize("call", [
    lambda d, i, s: d.index_add(0, i, s),
    lambda d, i, s: torch.index_copy(d, 0, i, s),
    lambda d, i, s: d.index_fill(0, i, 1.0),
    lambda d, i, s: d.index_add_(0, i, s),
    lambda d, i, s: d.index_copy_(0, i, s),
    lambda d, i, s: d.index_fill_(0, i, 1.0),
], ids=["index_add", "index_copy", "index_fill", "index_add_", "index_copy_", "index_fill_"])
def test_index_updates_of_a_dense_self_by_a_multi_jagged_index_say_what_is_supported(call):
    idx = mj.nested_tensor([torch.tensor([0, 1]), torch.tensor([2])])
    src = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
    with pytest.raises(NotImplementedError, match=r"multi_jagged index .* into a dense self \(4, 3\).*supported: a multi_jagged self"
                       r".*scatter"):
        call(torch.zeros(4, 3), idx, src)
