"""The varlen and packing toolbox (torch_multijagged/packing.py): first-fit-decreasing packing,
position / segment ids, the block-diagonal mask and its no-leakage invariant, padding rates and
the ``DataLoader`` ``collate_fn``. References are per sample (``torch.arange(n)``, attention over
one sample alone); nothing here asks the package for an expected value."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from _reference import few

ffd = mj.first_fit_decreasing


# ----------------------------------------------------------------------------- FFD: golden cases
@pytest.mark.parametrize(
    "lengths, budget, expected",
    [
        # order (-len, idx): 7(#2) 5(#0) 4(#5) 3(#1) 2(#3) 0(#4)
        # 7→new b0 (room 1); 5→new b1 (3); 4→new b2 (4); 3→b1 (0); 2→b2 (2); 0→b0
        ([5, 3, 7, 2, 0, 4], 8, [[2, 4], [0, 1], [5, 3]]),
        # ties by index: 4(#0) 4(#1) 4(#2) → b0 = 4+4 = 8, b1 = 4
        ([4, 4, 4], 8, [[0, 1], [2]]),
        # exactly the budget fills a bin: 8 | 8 ; 0-length #2 goes to the first bin
        ([8, 8, 0], 8, [[0, 2], [1]]),
        # all zero: one bin holds them all; empty input: no bins
        ([0, 0], 3, [[0, 1]]),
        ([], 3, []),
        # 6(#1) → b0 (4 left); 5(#3) → b1 (5); 3(#0) → b0 (1); 3(#2) → b1 (2); 1(#4) → b0 (0)
        ([3, 6, 3, 5, 1], 10, [[1, 0, 4], [3, 2]]),
    ],
)
def test_ffd_golden(lengths, budget, expected):
    assert ffd(lengths, budget) == expected
    assert ffd(torch.tensor(lengths, dtype=torch.int64), budget) == expected


def test_ffd_over_length_error_names_sample_length_budget():
    with pytest.raises(ValueError, match=r"sample 1 has length 9, over the budget of 8"):
        ffd([3, 9, 2], 8)


def test_ffd_split_golden():
    # 20 = 8 + 8 + 4 (pieces of #0); items 8(#0) 8(#0) 4(#0) 3(#1): b0 = 8, b1 = 8, b2 = 4 + 3
    assert ffd([20, 3], 8, over_length="split") == [[0], [0], [0, 1]]
    # 16 = 8 + 8, no remainder
    assert ffd([16], 8, over_length="split") == [[0], [0]]


def test_ffd_truncate_golden():
    # #0 counts as 8 tokens (a bin of its own); 3(#1) + 5(#2) = 8 share one
    assert ffd([20, 3, 5], 8, over_length="truncate") == [[0], [2, 1]]


@pytest.mark.parametrize(
    "args, kwargs, exc, msg",
    [
        (([1, 2], 0), {}, ValueError, "positive int"),
        (([1, 2], 2.5), {}, TypeError, "positive int"),
        (([1, 2], True), {}, TypeError, "positive int"),
        (([1, -2], 4), {}, ValueError, "non-negative"),
        (([1.5], 4), {}, TypeError, "sequence of ints"),
        ((torch.tensor([1.0]), 4), {}, TypeError, "integer dtype"),
        ((torch.tensor([[1]]), 4), {}, ValueError, "1-D"),
        (([1], 4), {"over_length": "drop"}, ValueError, "over_length"),
    ],
)
def test_ffd_errors(args, kwargs, exc, msg):
    with pytest.raises(exc, match=r"first_fit_decreasing\(\): .*" + msg):
        ffd(*args, **kwargs)


# ----------------------------------------------------------------------------- FFD: properties
budgets = st.integers(1, 40)


@st.composite
def lengths_and_budget(draw, over: bool = False):
    budget = draw(budgets)
    hi = 3 * budget if over else budget
    lengths = draw(st.lists(st.integers(0, hi), max_size=30))
    return lengths, budget


def _load(bins, lengths):
    return [sum(lengths[i] for i in b) for b in bins]


@given(lengths_and_budget())
def test_ffd_properties(case):
    lengths, budget = case
    bins = ffd(lengths, budget)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(lengths)))  # every sample exactly once
    assert all(load <= budget for load in _load(bins, lengths))  # no bin over budget
    assert all(b for b in bins)  # no empty bin
    assert ffd(lengths, budget) == bins  # deterministic
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rank = {i: r for r, i in enumerate(order)}
    for b in bins:  # within a bin, placement order is the (-len, idx) order
        assert [rank[i] for i in b] == sorted(rank[i] for i in b)
    # first fit: when sample i went to bin b, every earlier bin lacked room for it
    where = {i: k for k, b in enumerate(bins) for i in b}
    for i in range(len(lengths)):
        for k in range(where[i]):
            load_then = sum(lengths[j] for j in bins[k] if rank[j] < rank[i])
            assert load_then + lengths[i] > budget
    # consequence of first fit: at most one bin is at most half full
    assert sum(2 * load <= budget for load in _load(bins, lengths)) <= 1 or sum(lengths) == 0


@given(lengths_and_budget(over=True))
def test_ffd_split_properties(case):
    lengths, budget = case
    bins = ffd(lengths, budget, over_length="split")
    seen = [0] * len(lengths)
    loads = []
    for b in bins:
        load = 0
        for i in b:  # the k-th occurrence in bin order is piece k
            load += min(budget, lengths[i] - seen[i] * budget)
            seen[i] += 1
        loads.append(load)
    assert all(0 <= load <= budget for load in loads)
    assert seen == [max(1, -(-n // budget)) for n in lengths]  # ceil(n / budget) pieces (≥ 1)
    assert sum(loads) == sum(lengths)  # every token placed once
    assert mj.padding_rate(lengths, bins=bins, budget=budget) == pytest.approx(
        0.0 if not bins else 1 - sum(lengths) / (len(bins) * budget)
    )


@given(lengths_and_budget(over=True))
def test_ffd_truncate_properties(case):
    lengths, budget = case
    bins = ffd(lengths, budget, over_length="truncate")
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(min(lengths[i], budget) for i in b) <= budget for b in bins)
    for b in bins:
        if any(lengths[i] >= budget for i in b):
            assert all(lengths[i] == 0 for i in b[1:])  # a full (truncated) sample fills its bin


# ----------------------------------------------------------------------------- ids and mask
def test_ids_golden():
    lengths = [3, 0, 2]
    assert mj.packed_position_ids(lengths=lengths).tolist() == [0, 1, 2, 0, 1]  # 0..2 | — | 0..1
    assert mj.segment_ids(lengths=lengths).tolist() == [0, 0, 0, 2, 2]  # sample 1 has no rows
    mask = mj.block_diagonal_mask(lengths=lengths)
    assert mask.dtype == torch.bool and mask.tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 0, 1, 1],
    ]
    off = torch.tensor([0, 3, 3, 5])
    assert mj.packed_position_ids(offsets=off).tolist() == [0, 1, 2, 0, 1]
    assert mj.segment_ids(offsets=off).tolist() == [0, 0, 0, 2, 2]
    assert mj.packed_position_ids(lengths=[]).tolist() == []
    assert mj.position_ids(lengths=[]).shape[0] == 0  # B = 0
    assert mj.block_diagonal_mask(lengths=[]).shape == (0, 0)


lengths_lists = st.lists(st.integers(0, 7), min_size=1, max_size=8)


@given(lengths_lists)
def test_position_ids_restart_at_zero_per_sample(lengths):
    comps = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    for source in ({"x": x}, {"lengths": lengths}, {"lengths": torch.tensor(lengths)}, {"offsets": x.offsets()}):
        p = mj.position_ids(**source)
        assert isinstance(p, mj.MultiJaggedTensor) and p.dtype == torch.int64 and p.dim() == 2
        for got, n in zip(p.unbind(), lengths, strict=True):
            torch.testing.assert_close(got, torch.arange(n), rtol=0, atol=0)
        torch.testing.assert_close(mj.packed_position_ids(**source), p.values(), rtol=0, atol=0)
        seg = mj.segment_ids(**source)
        ref = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(lengths)])
        torch.testing.assert_close(seg, ref, rtol=0, atol=0)
    # from x: shares x's nested int, so it composes with x (x + position, per sample)
    p = mj.position_ids(x)
    assert p.shape[1] is x.shape[1] or p.shape[1] == x.shape[1]
    y = x + p.unsqueeze(-1).to(x.dtype)
    for got, c in zip(y.unbind(), comps):
        torch.testing.assert_close(got, c + torch.arange(c.shape[0], dtype=c.dtype).unsqueeze(-1))


def test_position_ids_along_second_ragged_dim():
    # (B, j0, j1): positions along dim 2 follow j1's extents [4, 0, 2]
    comps = [torch.randn(2, 4), torch.randn(3, 0), torch.randn(0, 2)]
    x = mj.nested_tensor(comps, ragged_dims=(1, 2))
    p = mj.position_ids(x, dim=2)
    assert p.shape[1] == x.shape[2]
    assert [t.tolist() for t in p.unbind()] == [[0, 1, 2, 3], [], [0, 1]]
    assert [t.tolist() for t in mj.position_ids(x, dim=1).unbind()] == [[0, 1], [0, 1, 2], []]


@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        ({}, TypeError, "exactly one"),
        ({"lengths": [1], "offsets": torch.tensor([0, 1])}, TypeError, "exactly one"),
        ({"x": torch.ones(3)}, TypeError, "multi_jagged"),
        ({"offsets": torch.tensor([1, 2])}, ValueError, "starting at 0"),
        ({"offsets": torch.tensor([0, 2, 1])}, ValueError, "non-decreasing"),
        ({"offsets": torch.tensor([0, 2], dtype=torch.int32)}, TypeError, "int64"),
        ({"lengths": [2, -1]}, ValueError, "non-negative"),
    ],
)
def test_ids_errors(kwargs, exc, msg):
    with pytest.raises(exc, match=r"position_ids\(\): .*" + msg):
        mj.position_ids(**kwargs)


def test_ids_error_dim_not_ragged():
    x = mj.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
    with pytest.raises(ValueError, match=r"segment_ids\(\): expected dim to be a ragged dim"):
        mj.segment_ids(x, dim=2)


def _sdpa(q, k, v, mask=None):
    """Dense SDPA on (H, T, D)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.integers(0, 2**31 - 1))
@few(15)
def test_block_diagonal_mask_no_leakage(lengths, seed):
    """Masked dense attention over the packed sequence equals attention over each sample alone;
    perturbing another sample leaves a sample's outputs and gradients bit-identical."""
    g = torch.Generator().manual_seed(seed)
    t, h, d = sum(lengths), 2, 4
    mask = mj.block_diagonal_mask(lengths=lengths)
    q, k, v = (torch.randn(h, t, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = _sdpa(q, k, v, mask)
    bounds = mj.packed_position_ids(lengths=lengths).eq(0).nonzero().flatten().tolist()
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0).tolist()
    for s, n in zip(starts, lengths):
        if n == 0:
            continue
        sl = slice(s, s + n)
        ref = _sdpa(q[:, sl], k[:, sl], v[:, sl])
        torch.testing.assert_close(out[:, sl], ref)
        assert s in bounds  # position ids restart where the sample starts
    # perturbation: change every sample but the first non-empty one
    nonempty = [i for i, n in enumerate(lengths) if n]
    if not nonempty or len(nonempty) == len(lengths) == 1:
        return
    i = nonempty[0]
    sl = slice(starts[i], starts[i] + lengths[i])
    keep = torch.zeros(t, dtype=torch.bool)
    keep[sl] = True

    def outputs_and_grads(qq, kk, vv):
        qq, kk, vv = (z.detach().requires_grad_() for z in (qq, kk, vv))
        o = _sdpa(qq, kk, vv, mask)
        gq, gk, gv = torch.autograd.grad(o[:, sl].sum(), (qq, kk, vv))
        return o[:, sl], gq[:, sl], gk[:, sl], gv[:, sl]

    noise = lambda z: torch.where(keep[None, :, None], z, z + 10 * torch.randn(z.shape, generator=g, dtype=z.dtype))  # noqa: E731
    a = outputs_and_grads(q, k, v)
    b = outputs_and_grads(noise(q), noise(k), noise(v))
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_unmasked_attention_leaks():
    """The mask is load-bearing: without it, a sample's output depends on its neighbour."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    alone = _sdpa(q[:, :3], k[:, :3], v[:, :3])
    assert not torch.allclose(_sdpa(q, k, v)[:, :3], alone)
    torch.testing.assert_close(_sdpa(q, k, v, mj.block_diagonal_mask(lengths=[3, 2]))[:, :3], alone)


# ----------------------------------------------------------------------------- padding rate
def test_padding_rate_golden():
    # padded: 1 - (3 + 0 + 2 + 3) / (4 · 3) = 1 - 8/12
    assert mj.padding_rate([3, 0, 2, 3]) == pytest.approx(1 - 8 / 12)
    x = mj.nested_tensor([torch.ones(3, 2), torch.ones(0, 2), torch.ones(2, 2), torch.ones(3, 2)])
    assert mj.padding_rate(x) == pytest.approx(1 - 8 / 12) == pytest.approx(1 - x.occupancy())
    assert mj.padding_rate([]) == 0.0 and mj.padding_rate([0, 0]) == 0.0
    # packed: bins [[2, 4], [0, 1], [5, 3]] of 8 hold 7+0, 5+3, 4+2 = 21 tokens: 1 - 21/24
    lengths = [5, 3, 7, 2, 0, 4]
    assert mj.padding_rate(lengths, bins=ffd(lengths, 8), budget=8) == pytest.approx(1 - 21 / 24)
    # padded to the longest (7): 1 - 21 / (6 · 7) = 0.5
    assert mj.padding_rate(lengths) == pytest.approx(0.5)
    # truncate: 20 counts as 8; bins [[0], [2, 1]]: 1 - (8 + 8) / 16 = 0
    assert mj.padding_rate([20, 3, 5], bins=ffd([20, 3, 5], 8, over_length="truncate"), budget=8) == 0.0
    assert mj.padding_rate([1], bins=[], budget=4) == 0.0


def test_padding_rate_errors():
    with pytest.raises(ValueError, match=r"padding_rate\(\): bin 0 holds 9 tokens, over the budget of 8"):
        mj.padding_rate([5, 4], bins=[[0, 1]], budget=8)
    with pytest.raises(ValueError, match=r"padding_rate\(\): bin 0 names sample 2"):
        mj.padding_rate([5, 4], bins=[[2]], budget=8)
    with pytest.raises(TypeError, match=r"padding_rate\(\): budget= needs bins="):
        mj.padding_rate([5, 4], budget=8)
    x = mj.nested_tensor([torch.ones(3, 2)])
    with pytest.raises(TypeError, match=r"padding_rate\(\): expected lengths with bins="):
        mj.padding_rate(x, bins=[[0]], budget=8)


# ----------------------------------------------------------------------------- collate
class _Dicts(torch.utils.data.Dataset):
    def __init__(self, lengths):
        g = torch.Generator().manual_seed(0)
        self.items = [
            {"tokens": torch.randn(n, 4, generator=g), "ids": torch.arange(n), "label": torch.tensor(i % 2), "name": f"s{i}"}
            for i, n in enumerate(lengths)
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_collate_with_dataloader():
    lengths = [3, 0, 5, 2, 2, 2, 4]
    ds = _Dicts(lengths)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=mj.collate)
    batches = list(loader)
    assert len(batches) == 3  # 3 + 3 + 1
    for bi, batch in enumerate(batches):
        items = ds.items[3 * bi : 3 * bi + 3]
        assert set(batch) == {"tokens", "ids", "label", "name"}
        for key in ("tokens", "ids"):
            t = batch[key]
            assert isinstance(t, mj.MultiJaggedTensor) and t.ragged_dims == (1,)  # even [2, 2, 2]
            for got, item in zip(t.unbind(), items, strict=True):
                torch.testing.assert_close(got, item[key], rtol=0, atol=0)
        torch.testing.assert_close(batch["label"], torch.stack([it["label"] for it in items]))
        assert batch["name"] == [it["name"] for it in items]
        # position ids of the batch restart per sample and line up with its tokens
        assert [p.tolist() for p in mj.position_ids(batch["tokens"]).unbind()] == [list(range(len(it["ids"]))) for it in items]


def test_collate_fields_of_equal_lengths_share_a_nested_int():
    """Fields of equal lengths in every sample share one nested int, so they combine under
    torch.compile as eagerly (a per-token loss of tokens against their labels); a field of other
    lengths keeps its own."""
    g = torch.Generator().manual_seed(0)
    items = [{"tokens": torch.randn(n, 4, generator=g), "labels": torch.randint(0, 3, (n,), generator=g),
              "keep": torch.rand(n, generator=g) > 0.3, "chars": torch.randn(n + 1, 2, generator=g)} for n in (3, 0, 5)]
    batch = mj.collate(items)
    assert batch["tokens"].shape[1] is batch["labels"].shape[1] is batch["keep"].shape[1]
    assert batch["chars"].shape[1] != batch["tokens"].shape[1]
    for key in items[0]:
        for got, item in zip(batch[key].unbind(), items, strict=True):
            torch.testing.assert_close(got, item[key], rtol=0, atol=0)
    w = torch.randn(4, 3, dtype=torch.float32)

    def loss(tokens, labels, keep):
        return torch.where(keep, F.cross_entropy((tokens @ w).transpose(1, 2), labels, reduction="none"), 0.0)

    got = torch.compile(loss, backend="aot_eager", fullgraph=True)(batch["tokens"], batch["labels"], batch["keep"])
    for g_, it in zip(got.unbind(), items, strict=True):
        ref = torch.where(it["keep"], F.cross_entropy(it["tokens"] @ w, it["labels"], reduction="none"), 0.0)
        torch.testing.assert_close(g_, ref)


def test_collate_tensors():
    b = mj.collate([torch.ones(2, 3), torch.zeros(2, 3)])  # equal lengths stay multi_jagged
    assert isinstance(b, mj.MultiJaggedTensor) and b.sizes().flatten().tolist() == [2, 2]
    b = mj.collate([torch.ones(0), torch.ones(4)])
    assert b.sizes().flatten().tolist() == [0, 4]


@pytest.mark.parametrize(
    "samples, exc, msg",
    [
        ([], ValueError, "at least one sample"),
        ([{"a": torch.ones(2)}, {"b": torch.ones(2)}], ValueError, "keys"),
        ([{"a": torch.ones(2)}, {"a": torch.ones(2, 1)}], ValueError, "field 'a'.*rank"),
        ([{"a": torch.ones(2, 3)}, {"a": torch.ones(2, 4)}], ValueError, "field 'a'.*dim 0"),
        ([{"a": torch.ones(2)}, {"a": torch.ones(2, dtype=torch.int64)}], ValueError, "field 'a'.*dtype"),
        ([{"a": torch.ones(2)}, {"a": "x"}], TypeError, "field 'a'.*mix"),
        ([{"a": torch.ones(2)}, torch.ones(2)], TypeError, "dict"),
        ([torch.ones(2), [1, 2]], TypeError, "tensor"),
        ([torch.ones(2), torch.ones(2, 2)], ValueError, "rank"),
        ([(torch.ones(2),)], TypeError, "tensors or dicts"),
    ],
)
def test_collate_errors(samples, exc, msg):
    with pytest.raises(exc, match=r"collate\(\): .*" + msg):
        mj.collate(samples)
