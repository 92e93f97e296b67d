"""A ragged size plus or minus an int (``n - 1``, ``(t - 1) // 2``, ``k - n``): each sample's size
shifted, a new ragged size that shapes, slices and expands take (NOTE [ Ragged sizes plus an int ]
in ragged_sizes.py), against each sample's dense code."""

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

from _reference import R, per_sample_check
from _structures import assert_samples_and_grads, comps_for

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: {}}


def _shapes(t):
    return [tuple(c.shape) for c in t.unbind()]


def test_a_shifted_size_is_each_samples_size_shifted():
    lengths = (3, 5, 0, 6)
    x = mj.nested_tensor(comps_for([(k, 4) for k in lengths], 0))
    n = x.shape[1]
    cases = {
        "n + 2": (lambda: n + 2, lambda k: k + 2),
        "2 + n": (lambda: 2 + n, lambda k: 2 + k),
        "n - -1": (lambda: n - -1, lambda k: k + 1),
        "7 - n": (lambda: 7 - n, lambda k: 7 - k),
        "(n + 3) // 2 - 1": (lambda: (n + 3) // 2 - 1, lambda k: (k + 3) // 2 - 1),
    }
    for name, (size, per_sample) in cases.items():
        out = x.new_zeros(4, size(), 3)
        assert _shapes(out) == [(per_sample(k), 3) for k in lengths], name
        assert out.shape[1] == size(), name  # one nested int per rule and extent
    one_row = mj.nested_tensor(comps_for([(k, 4) for k in (3, 5, 1, 6)], 1))
    m = one_row.shape[1]
    assert _shapes(one_row.new_zeros(4, m - 1, 2)) == [(k - 1, 2) for k in (3, 5, 1, 6)]
    assert _shapes(one_row.new_ones(4, (m - 1) // 2, 2)) == [((k - 1) // 2, 2) for k in (3, 5, 1, 6)]


def test_a_shifted_size_names_the_nested_int_of_the_op_that_shifts():
    """``n - k`` is the nested int of ``x[:, k:]``, ``n + k`` that of ``F.pad`` by ``k`` rows before,
    and a rule that gives the sizes back gives ``n`` itself."""
    x = mj.nested_tensor(comps_for([(k, 4) for k in (3, 5, 1)], 2))
    n = x.shape[1]
    assert x[:, 1:].shape[1] == n - 1 and n - 1 == x[:, 1:].shape[1]
    assert F.pad(x, (0, 0, 2, 0)).shape[1] == n + 2
    assert (n - 1) + 1 == n and (n + 4) - 4 == n and n - 0 == n and 0 + n == n
    # the slice's own size minus an int: the slice of the slice
    assert x[:, 1:][:, 1:].shape[1] != n  # (another extent)
    assert x.new_zeros(3, n - 1, 4).shape == x[:, 1:].shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_slices_and_expands_by_a_shifted_size(dtype):
    comps = comps_for([(3, 4), (5, 4), (1, 4), (6, 4)], 3, dtype=dtype)
    forms = [
        (lambda x: x[:, : x.shape[1] - 1], lambda c: c[: c.shape[0] - 1]),
        (lambda x: x[:, 1 : x.shape[1] + 1], lambda c: c[1 : c.shape[0] + 1]),
        (lambda x: x[:, (x.shape[1] - 1) // 2 :], lambda c: c[(c.shape[0] - 1) // 2 :]),
        (lambda x: x[:, 1:, :1].expand(x.shape[0], x.shape[1] - 1, 4), lambda c: c[1:, :1].expand(c.shape[0] - 1, 4)),
        (lambda x: x[:, 1:] * x.new_ones(x.shape[0], x.shape[1] - 1, 4), lambda c: c[1:] * c.new_ones(c.shape[0] - 1, 4)),
    ]
    for fn, ref in forms:
        per_sample_check(fn, R(comps, (1,)), ref=ref, new_ragged=True, **TOL[dtype])


def test_a_negative_shifted_size_raises_naming_the_sample():
    """A ragged size holds sizes: where a sample's would be negative the arithmetic raises (dense
    code gets a negative int there, which a shape refuses) — never a size clamped to 0."""
    x = mj.nested_tensor(comps_for([(k, 4) for k in (3, 0, 2)], 4))
    n = x.shape[1]
    with pytest.raises(ValueError, match=r"j\d+ - 1 is negative in sample 1 \(size 0, giving -1\).*sizes \[3, 0, 2\]"):
        _ = n - 1
    with pytest.raises(ValueError, match=r"2 - j\d+ is negative in sample 0 \(size 3, giving -1\)"):
        _ = 2 - n
    with pytest.raises(ValueError, match="is negative in sample 1"):
        x.new_zeros(3, n - 1, 4)
    assert _shapes(x.new_zeros(3, 3 - n, 1)) == [(0, 1), (3, 1), (1, 1)]  # 3 - n holds in every sample


def test_a_size_shifted_from_another_batch_is_refused_by_new_zeros():
    x = mj.nested_tensor(comps_for([(k, 4) for k in (3, 4)], 5))
    other = mj.nested_tensor(comps_for([(k, 4) for k in (2, 6)], 6))
    with pytest.raises(NotImplementedError, match="sizes mapped from them"):
        x.new_zeros(2, other.shape[1] - 1, 4)


def _merge(x, r):
    """ToMe's bipartite soft matching and merge as written for dense ``(B, N, C)`` tokens (its
    ``(t - protected) // 2`` bound, ``t1 - r`` kept tokens, gathers and a scatter-reduce)."""
    t = x.shape[1]
    r = min(r, (t - 1) // 2)
    metric = x / x.norm(dim=-1, keepdim=True)
    a, b = metric[..., ::2, :], metric[..., 1::2, :]
    scores = a @ b.transpose(-1, -2)
    node_max, node_idx = scores.max(dim=-1)
    edge_idx = node_max.argsort(dim=-1, descending=True)[..., None]
    unm_idx = edge_idx[..., r:, :]
    src_idx = edge_idx[..., :r, :]
    dst_idx = node_idx[..., None].gather(dim=-2, index=src_idx)
    src, dst = x[..., ::2, :], x[..., 1::2, :]
    n, t1, c = src.shape
    unm = src.gather(dim=-2, index=unm_idx.expand(n, t1 - r, c))
    src = src.gather(dim=-2, index=src_idx.expand(n, r, c))
    dst = dst.scatter_reduce(-2, dst_idx.expand(n, r, c), src, reduce="sum")
    return torch.cat([unm, dst], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_merging_written_for_dense_tokens(dtype):
    comps = comps_for([(3, 4), (5, 4), (8, 4), (4, 4)], 7, dtype=dtype)
    out = per_sample_check(lambda x: _merge(x, 1), R(comps, (1,)), ref=lambda c: _merge(c.unsqueeze(0), 1)[0],
                           new_ragged=True, **TOL[dtype])
    # no leakage: another sample 2 (values and length) leaves the others' merges as they were
    changed = list(comps)
    changed[2] = comps_for([(6, 4)], 8, dtype=dtype)[0]
    again = _merge(mj.nested_tensor(changed), 1)
    for i in (0, 1, 3):
        torch.testing.assert_close(again.unbind()[i], out.unbind()[i])


def test_merging_more_than_some_sample_allows_raises():
    """``min(r, (t - 1) // 2)`` that differs per sample: each sample alone would merge a different
    number of tokens — the comparison raises, naming it."""
    x = mj.nested_tensor(comps_for([(3, 4), (7, 4)], 9))
    with pytest.raises(ValueError, match="holds for some samples and not others"):
        _merge(x, 3)


def test_a_shifted_size_under_torch_compile_raises_saying_so():
    torch._dynamo.reset()
    x = mj.nested_tensor(comps_for([(3, 4), (5, 4)], 10))
    for f in (lambda y: y.new_zeros(2, y.shape[1] - 1, 4), lambda y: y[:, : y.shape[1] - 1] * 2):
        with pytest.raises(Exception, match=r"n - 1 with the nested int j\d+ under torch.compile"):
            torch.compile(f, backend="aot_eager", fullgraph=True)(x)


def test_a_derived_size_the_samples_compare_differently_raises():
    # n - 1 of lengths (3, 5, 1) is (2, 4, 0): min(2, n - 1) has no one answer (sample 2 holds no
    # row); torch's invariant (a nested int is at least 2) would say 2 and take rows sample 2 lacks
    x = mj.nested_tensor([torch.randn(k, 4) for k in (3, 5, 1)])
    n = x.shape[1]
    for use in (lambda: min(2, n - 1), lambda: bool(n - 1 > 0), lambda: (n - 1) // 2 < 1, lambda: max(x[:, 1:].shape[1], 2)):
        with pytest.raises(ValueError, match="holds for some samples and not others"):
            use()
    assert min(5, n - 1) is not None and (n - 1 >= 0)  # every sample alike: answered
    assert n > 1  # a size the batch was built with keeps torch.jagged's rule (Hugging Face's q_len > 1)
    # torch's own code still gets the invariant: under a dispatch mode aten's derivatives run on the
    # wrappers, and the engine compares the sliced sizes (2, 4, 0) with 1 in a double backward
    from torch.utils.flop_counter import FlopCounterMode

    x = mj.nested_tensor([torch.randn(k, 6, dtype=torch.float64) for k in (3, 5, 1)]).requires_grad_()
    y = x[:, 1:]
    with FlopCounterMode(display=False):
        z = y.unsqueeze(-2) * y.unsqueeze(-3)
        p, _ = torch.split((z * z).unflatten(-1, (6, 1)), [2, 4], dim=-2)
        (g,) = torch.autograd.grad(p.flatten(-2).values().pow(3).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.values().pow(2).sum(), x)
    assert [tuple(t.shape) for t in gg.unbind()] == [(3, 6), (5, 6), (1, 6)]


def test_a_remainder_every_sample_gives_is_that_int():
    """``H % p`` is the int every sample gives (timm's ``PatchEmbed`` asserts ``H % p == 0``; Swin's
    patch merging pads by ``H % 2``): each sample then takes its own branch; remainders that differ
    raise, naming them."""
    g = torch.Generator().manual_seed(0)
    ims = [torch.randn(5, 7, 3, generator=g, dtype=torch.float64) for _ in range(2)]
    ims[1] = torch.randn(3, 9, 3, generator=g, dtype=torch.float64)
    x = mj.nested_tensor(ims, ragged_dims=(1, 2))  # (B, H, W, C), odd sides
    B, H, W, C = x.shape
    assert H % 2 == 1 and W % 2 == 1 and type(H % 2) is int and H % 1 == 0
    # Swin's PatchMerging, as written for a dense (B, H, W, C) batch
    if (H % 2 == 1) or (W % 2 == 1):
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
    merged = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    for a, im in zip(merged.unbind(), ims):
        p = F.pad(im, (0, 0, 0, im.shape[1] % 2, 0, im.shape[0] % 2))
        assert torch.equal(a, torch.cat([p[0::2, 0::2], p[1::2, 0::2], p[0::2, 1::2], p[1::2, 1::2]], -1))
    even = mj.nested_tensor([torch.randn(3, 32, 48), torch.randn(3, 64, 16)], ragged_dims=(2, 3))
    _, _, He, We = even.shape
    assert He % 16 == 0 and (16 - We % 16) % 16 == 0
    with pytest.raises(ValueError, match=r"% 5 differs per sample \(remainders \[2, 4\]"):
        He % 5
    with pytest.raises(TypeError):
        He % We  # a ragged divisor has no per-sample meaning here
    assert even[:0].shape[2] % 4 == 0  # no sample: 0


def test_a_difference_of_two_batches_sizes_every_sample_gives_is_that_int():
    """``skip.size(2) - up.size(2)`` before ``F.pad`` (milesial's U-Net ``Up``: odd sides make the
    upsampled map one pixel short): the int every sample's difference is, so the pad does to each
    sample what it does alone, values and gradients; differences that differ raise, naming them
    and the resize that works."""
    up_conv = torch.nn.ConvTranspose2d(3, 3, 2, stride=2).double()

    def up_block(skip):
        up = up_conv(F.max_pool2d(skip, 2))
        dy, dx = skip.size(2) - up.size(2), skip.size(3) - up.size(3)
        up = F.pad(up, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return torch.cat([up, skip], dim=1)

    g = torch.Generator().manual_seed(0)
    for sides in ([(13, 9), (9, 5), (5, 21)], [(12, 8), (8, 4)]):
        leaves = [torch.randn(3, h, w, dtype=torch.float64, generator=g, requires_grad=True) for h, w in sides]
        x = mj.as_nested_tensor(leaves)
        out = up_block(x)
        refs = [up_block(c[None])[0] for c in leaves]
        assert_samples_and_grads(out, refs, leaves)
    mixed = mj.nested_tensor([torch.randn(3, 13, 9), torch.randn(3, 8, 4)], ragged_dims=(2, 3))
    with pytest.raises(TypeError, match=r"differs per sample \(differences \[1, 0\].*F.interpolate"):
        up_block(mixed.double())
    assert mixed[:0].shape[2] - F.max_pool2d(mixed, 2)[:0].shape[2] == 0  # no sample: 0


def test_a_multiple_of_a_ragged_size_floor_divided_is_each_samples():
    """``(3 * L) // 4`` (MAE's kept length with a 0.25 mask ratio, in ints): each sample's multiple
    floor-divided, a ragged size slices take."""
    xs = [torch.randn(n, 4) for n in (4, 9, 0, 1)]
    x = mj.nested_tensor(xs)
    L = x.shape[1]
    keep = (3 * L) // 4
    kept = x[:, :keep]
    for a, c in zip(kept.unbind(), xs):
        assert torch.equal(a, c[: (3 * c.shape[0]) // 4])
    assert bool((3 * L) // 4 == keep)  # one nested int per rule
    with pytest.raises(TypeError, match="differs per sample"):
        L - L // 4  # two ragged sizes whose difference is no one int


@pytest.mark.parametrize("lens", [(17,), (5, 5, 5)])
def test_a_size_every_sample_has_is_that_number(lens):
    """A batch of one sample, or of equal sizes: ``int(n)``, ``range(n)``, ``torch.arange(n)`` and a
    dense table sliced by ``n`` (ViT's ``pos_embedding[:, :(n + 1)]``) read the size each sample's
    own code reads; sizes that differ raise, naming the ragged size."""
    xs = [torch.randn(n, 4) for n in lens]
    x = mj.nested_tensor(xs, ragged_dims=(1,))
    n = x.shape[1]
    assert int(n) == lens[0] and list(range(n)) == list(range(lens[0])) and torch.equal(torch.arange(n), torch.arange(lens[0]))
    pos = torch.randn(1, 20, 4)
    out = torch.cat([torch.zeros(len(lens), 1, 4), x], 1) + pos[:, :(n + 1)]
    for a, c in zip(out.unbind(), xs):
        assert torch.equal(a, torch.cat([torch.zeros(1, 4), c]) + pos[0, : lens[0] + 1])
    ragged = mj.nested_tensor([torch.randn(k, 4) for k in (2, 3)]).shape[1]
    with pytest.raises(TypeError, match="no single value"):
        int(ragged)
    with pytest.raises(TypeError, match="no single value"):
        pos[:, :ragged]


def test_the_remainder_of_a_multiple_of_a_ragged_size():
    x = mj.nested_tensor([torch.randn(n, 4) for n in (3, 5)])
    n = x.shape[1]
    assert (2 * n) % 2 == 0 and (2 * n) % 4 == 2
    with pytest.raises(ValueError, match="differs per sample"):
        (2 * n) % 3
