"""Ragged index maps (``kernels/reference.py``): every form of row -> sample (eager searchsorted,
eager repeat_interleave, traced compare-sum, traced binary search) against a brute-force
enumeration, on random partitions with zero-length samples, B = 0 and B = 1, 1-3 ragged dims;
and under Inductor: no ``searchsorted`` fallback in the compiled pair block, one graph over
changing lengths (NOTE [ Index maps under Inductor ])."""

import itertools
import random

import pytest
import torch
import torch.nn as nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental.proxy_tensor import make_fx

import torch_multijagged as mj
from torch_multijagged.kernels import reference as ref


def _partition(sizes: list[list[int]], r: int):
    """(offsets (B+1,), sizes (B, R), rows) of the row-major partition with per-sample extents."""
    b = len(sizes)
    counts = [1] * b
    for i, ns in enumerate(sizes):
        for n in ns:
            counts[i] *= n
    offsets = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int64)
    return offsets, torch.tensor(sizes, dtype=torch.int64).reshape(b, r), sum(counts)


def _brute(sizes: list[list[int]]):
    """Per row: (sample, coordinates), enumerated sample by sample, row-major."""
    out = []
    for i, ns in enumerate(sizes):
        out += [(i, c) for c in itertools.product(*(range(n) for n in ns))]
    return out


def _random_sizes(rng: random.Random, b: int, r: int) -> list[list[int]]:
    sizes = [[rng.randint(0, 4) for _ in range(r)] for _ in range(b)]
    if b > 1:
        sizes[rng.randrange(b)][rng.randrange(r)] = 0  # a zero-length sample
    return sizes


CASES = [(b, r, seed) for b in (0, 1, 2, 5, 33, 70) for r in (1, 2, 3) for seed in range(3)]


def _traced(fn, *args):
    """``fn`` traced with fake tensors (the traced formulas), replayed on real ones."""
    return make_fx(fn, tracing_mode="fake")(*args)(*args)


@pytest.mark.parametrize("b,r,seed", CASES)
def test_row_sample_every_form_equals_enumeration(b, r, seed, monkeypatch):
    sizes = _random_sizes(random.Random(seed), b, r)
    offsets, _, rows = _partition(sizes, r)
    want = torch.tensor([s for s, _ in _brute(sizes)], dtype=torch.int64)
    old = torch.searchsorted(offsets, torch.arange(rows), right=True) - 1  # the former formula
    assert torch.equal(old, want)
    assert torch.equal(ref.row_sample(offsets, rows), want)
    monkeypatch.setattr(ref, "_REPEAT_MIN_ROWS", 0)  # eager repeat_interleave at every size
    assert torch.equal(ref.row_sample(offsets, rows), want)
    for sum_max_b in (10**6, -1):  # traced: compare-sum, then binary search, at every B
        monkeypatch.setattr(ref, "_SUM_MAX_B", sum_max_b)
        assert torch.equal(_traced(lambda o: ref.row_sample(o, rows), offsets), want)


@pytest.mark.parametrize("b,r,seed", CASES)
def test_row_coords_map_reorder_equal_enumeration_eager_and_traced(b, r, seed, monkeypatch):
    rng = random.Random(100 + seed)
    sizes = _random_sizes(rng, b, r)
    offsets, sz, rows = _partition(sizes, r)
    want_sample = torch.tensor([i for i, _ in _brute(sizes)], dtype=torch.int64)
    want_coords = torch.tensor([c for _, c in _brute(sizes)], dtype=torch.int64).reshape(rows, r)
    keep = tuple(sorted(rng.sample(range(r), rng.randint(1, r))))
    sub_offsets, _, _ = _partition([[ns[k] for k in keep] for ns in sizes], len(keep))
    sub_rows = {(i, c): k for k, (i, c) in enumerate(_brute([[ns[k] for k in keep] for ns in sizes]))}
    want_map = torch.tensor([sub_rows[(i, tuple(c[k] for k in keep))] for i, c in _brute(sizes)], dtype=torch.int64)
    order = tuple(rng.sample(range(r), r))
    # the output's k-th ragged dim is the source's dim order[k]: source sizes from the output's
    src_sizes = [[0] * r for _ in sizes]
    for i, ns in enumerate(sizes):
        for k, j in enumerate(order):
            src_sizes[i][j] = ns[k]
    src_offsets, _, _ = _partition(src_sizes, r)
    src_rows = {(i, c): k for k, (i, c) in enumerate(_brute(src_sizes))}

    def reorder_want():
        out = []
        for i, c in _brute(sizes):
            src = [0] * r
            for k, j in enumerate(order):
                src[j] = c[k]
            out.append(src_rows[(i, tuple(src))])
        return torch.tensor(out, dtype=torch.int64)

    def maps(o, s, so, ro):
        sample, coords = ref.row_coords(o, s, rows)
        return sample, coords, ref.row_map(o, s, rows, keep, so), ref.row_reorder(o, s, rows, order, ro)

    for sum_max_b in (32, -1):
        monkeypatch.setattr(ref, "_SUM_MAX_B", sum_max_b)
        for got in (maps(offsets, sz, sub_offsets, src_offsets), _traced(maps, offsets, sz, sub_offsets, src_offsets)):
            assert torch.equal(got[0], want_sample)
            assert torch.equal(got[1], want_coords)
            assert torch.equal(got[2], want_map)
            assert torch.equal(got[3], reorder_want())


def test_dynamic_batch_guards_on_a_bucket_not_on_its_value():
    # B = 40 and 45 share the bucket (32, 256]: one graph once B is dynamic; B = 3 is another
    fn = lambda x: (x.unsqueeze(-2) * x.unsqueeze(-3)).sum(dim=(1, 2, 3))  # noqa: E731
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    torch._dynamo.reset()
    for b in (40, 41, 45):
        comps = [torch.randn(n % 4, 2) for n in range(b)]  # zero-length samples included
        x = mj.nested_tensor(comps)
        want = torch.stack([(c[:, None] * c[None, :]).sum() for c in comps])
        torch.testing.assert_close(compiled(x), want)
    assert counter.frame_count == 2  # B static, then dynamic: as for dense tensors


def test_dynamic_batch_takes_two_samples():
    # the compare-sum map's ``offsets[1:B]`` asked whether B - 1 is 1: B = 2 (a last short batch)
    # recompiled after B had become dynamic
    fn = lambda x: (x.relu() + x).sum(1)  # noqa: E731
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    torch._dynamo.reset()
    for lengths in ((3, 0, 5), (2, 3, 4, 5), (5, 1), (4, 0, 2, 2, 1)):
        comps = [torch.randn(n, 4) for n in lengths]
        torch.testing.assert_close(compiled(mj.nested_tensor(comps)), torch.stack([(c.relu() + c).sum(0) for c in comps]))
    assert counter.frame_count == 2
    torch._dynamo.reset()


class _Pair(nn.Module):
    def __init__(self, c=6, cp=4):
        super().__init__()
        self.left, self.right, self.ln, self.g = nn.Linear(c, cp), nn.Linear(c, cp), nn.LayerNorm(cp), nn.Linear(cp, c)

    def forward(self, x):
        pair = self.ln(self.left(x).unsqueeze(-2) + self.right(x).unsqueeze(-3))
        return x + self.g(pair.mean(dim=-2)), pair


def _lengths(b, count, seed):
    rng = random.Random(seed)
    out = [[rng.randint(1, 7) for _ in range(b)] for _ in range(count)]
    out[1][0] = 0  # a zero-length sample
    return out


@pytest.fixture
def _fresh_inductor_cache():
    # the code must be generated here, not served from a cache filled by another formula
    with torch._inductor.utils.fresh_cache():
        yield


@pytest.mark.parametrize("b", [4, 40])  # compare-sum (B <= 32) and binary search
def test_compiled_pair_block_has_no_searchsorted_and_one_graph(b, _fresh_inductor_cache):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Pair()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    codes = []
    for k, lengths in enumerate(_lengths(b, 4, seed=b)):
        comps = [torch.randn(n, 6) for n in lengths]
        x_eager, x_comp = mj.nested_tensor(comps, requires_grad=True), mj.nested_tensor(comps, requires_grad=True)

        def step(x, m):
            single, pair = m(x)
            loss = (single * single).sum() + (pair * pair).sum()
            loss.backward()
            return loss

        want = step(x_eager, model)
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        if k == 0:
            got, codes = run_and_get_code(step, x_comp, compiled)
        else:
            got = step(x_comp, compiled)
        torch.testing.assert_close(got, want)
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(x_comp.grad.values(), x_eager.grad.values(), rtol=1e-3, atol=1e-4)
        model.zero_grad()
    assert len(codes) == 2  # forward and backward
    for code in codes:
        assert "searchsorted" not in code and "repeat_interleave" not in code
    assert counter.frame_count == 1  # zero recompiles over changing lengths
    torch._dynamo.reset()


def test_compiled_roll_along_a_ragged_dim_under_autograd(_fresh_inductor_cache):
    # Inductor's fused roll map evaluated the remainder by a zero size (lanes of no row) and its
    # integer-division check raised
    torch._dynamo.reset()
    comps = [torch.randn(n, 4) for n in (1, 4, 0, 2)]
    x = mj.nested_tensor(comps, requires_grad=True)
    out = torch.compile(lambda t: t.roll(1, 1), backend="inductor", fullgraph=True)(x)
    for a, c in zip(out.unbind(), comps):
        torch.testing.assert_close(a, c.roll(1, 0))
    (g,) = torch.autograd.grad((out * out).sum(dim=(1, 2)).sum(), x)
    for a, c in zip(g.unbind(), comps):
        torch.testing.assert_close(a, 2 * c)
    torch._dynamo.reset()
