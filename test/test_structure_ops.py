"""Structure ops (ops/shape/views.py, routes for split/chunk/einsum): transpose / permute of ragged
dims, unsqueeze / squeeze, flatten / unflatten / view / reshape of static dims, narrow / slicing
/ select of static dims, cat / stack, chunk / split, einsum over static dims — per-sample
reference with gradients, nested-int bookkeeping, gradcheck, golden cases and errors."""

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import R, RECT, SEQ, SQUARE, STATIC_LEAD, Shapes, assert_close, components, few, per_sample_check, seeds, structures
from _structures import rect_pair, comps_for, length_pairs, lengths, packed_args, per_sample_check_any_ints

FEW = few(10)  # 10 examples under the default profile, scaled by HYPOTHESIS_PROFILE
LAYOUT = {"seq": SEQ, "square": SQUARE, "rect": RECT, "static_lead": STATIC_LEAD}


def _pair_structs(draw_rect: bool):
    return structures(RECT if draw_rect else SQUARE, max_batch=3, max_len=4)


# ----------------------------------------------------------------------------- transpose / permute
# (fn on the multi_jagged tensor, fn on a component); logical dim d is component dim d - 1.
PAIR_PERMS = {
    "transpose(1,2)": (lambda t: t.transpose(1, 2), lambda c: c.transpose(0, 1)),
    "transpose(-2,-3)": (lambda t: t.transpose(-2, -3), lambda c: c.transpose(-2, -3)),
    "permute(0,2,1,3)": (lambda t: t.permute(0, 2, 1, 3), lambda c: c.permute(1, 0, 2)),
    "permute(0,3,1,2)": (lambda t: t.permute(0, 3, 1, 2), lambda c: c.permute(2, 0, 1)),
    "permute(0,3,2,1)": (lambda t: t.permute(0, 3, 2, 1), lambda c: c.permute(2, 1, 0)),
    "permute(0,1,3,2)": (lambda t: t.permute(0, 1, 3, 2), lambda c: c.permute(0, 2, 1)),
    "movedim(-1,1)": (lambda t: t.movedim(-1, 1), lambda c: c.movedim(-1, 0)),
    "transpose_twice": (lambda t: t.transpose(1, 2).transpose(1, 2), lambda c: c),
    "transpose_then_add": (lambda t: t.transpose(1, 2) * 2 + 1, lambda c: c.transpose(0, 1) * 2 + 1),
}


@pytest.mark.parametrize("rect", [False, True], ids=["square", "rect"])
@pytest.mark.parametrize("op", PAIR_PERMS, ids=str)
def test_pair_permutations(op, rect):
    """A pair's transpose of its ragged dims is the per-sample transpose (square and
    rectangular), also when a static dim moves between or before them."""
    f, ref = PAIR_PERMS[op]

    @FEW
    @given(_pair_structs(rect), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x, out = per_sample_check_any_ints(f, ref, comps, s.ragged_dims, seed)
        # the ragged dims keep their nested ints, in their new places: follow marker sizes
        # 5 and 7 (≠ C ≤ 3) through the dense op to see where each goes
        marker = ref(torch.empty(5, 7, s.c)).shape
        expected = [x.shape[1] if m == 5 else x.shape[2] if m == 7 else m for m in marker]
        assert out.shape == (x.shape[0], *expected)

    check()


def test_rect_transpose_swaps_nested_ints():
    @FEW
    @given(length_pairs(), seeds)
    def check(nm, seed):
        ns, ms = nm
        x, y, rect = rect_pair(ns, ms, seed)  # (B, j_x, j_y, 2)
        t = rect.transpose(1, 2)
        assert t.shape == (len(ns), rect.shape[2], rect.shape[1], 2)
        if ns != ms:  # equal lengths: see test_rect_from_equal_lengths_keeps_each_sides_nested_int
            assert t.shape == (len(ns), y.shape[1], x.shape[1], 2)
        assert t.sizes().tolist() == [[m, n] for n, m in zip(ns, ms)]
        # reducing the transposed pair's last ragged dim gives y's structure back
        back = t.sum(-2)
        if ns != ms:
            assert back.shape == y.shape
        for o, xi, yi in zip((back + y).unbind(), x.unbind(), y.unbind()):
            assert_close(o, (xi.unsqueeze(-2) * yi.unsqueeze(-3)).transpose(0, 1).sum(-2) + yi)
        # a transposed rect combines with the pair built the other way round
        other = y.unsqueeze(-2) - x.unsqueeze(-3)  # (B, j_y, j_x, C)
        for o, xi, yi in zip((t + other).unbind(), x.unbind(), y.unbind()):
            assert_close(o, (xi.unsqueeze(1) * yi.unsqueeze(0)).transpose(0, 1) + (yi.unsqueeze(1) - xi.unsqueeze(0)))

    check()


def test_square_transpose_adds_to_itself():
    """``pair + pair.transpose(1, 2)`` (symmetrisation, as in triangle updates)."""

    @FEW
    @given(structures(SQUARE, max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(lambda p: p + p.transpose(1, 2), R(components(s.shapes, seed), s.ragged_dims),
                         ref=lambda c: c + c.transpose(0, 1))

    check()


SINGLE_PERMS = {
    "seq.transpose(1,2)": ("seq", lambda t: t.transpose(1, 2), lambda c: c.transpose(0, 1)),
    "seq.mT": ("seq", lambda t: t.mT, lambda c: c.mT),
    "static_lead.transpose(1,2)": ("static_lead", lambda t: t.transpose(1, 2), lambda c: c.transpose(0, 1)),
    "static_lead.permute(0,3,2,1)": ("static_lead", lambda t: t.permute(0, 3, 2, 1), lambda c: c.permute(2, 1, 0)),
    "static_lead.transpose(1,3)": ("static_lead", lambda t: t.transpose(1, 3), lambda c: c.transpose(0, 2)),
}


@pytest.mark.parametrize("op", SINGLE_PERMS, ids=str)
def test_single_ragged_dim_permutations(op):
    layout, f, ref = SINGLE_PERMS[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3), seeds)
    def check(s, seed):
        x, out = per_sample_check_any_ints(f, ref, components(s.shapes, seed), s.ragged_dims, seed)
        assert x.shape[s.ragged_dims[0]] in tuple(out.shape)  # the nested int moved, unchanged

    check()


def test_transpose_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.zeros(0, 2)], ragged_dims=(1, 2))
    t = x.transpose(1, 2)
    assert t.sizes().tolist() == [[3, 2], [2, 0]]
    torch.testing.assert_close(t.unbind()[0], torch.tensor([[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]))  # = rows ↔ columns
    assert t.unbind()[1].shape == (2, 0)
    torch.testing.assert_close(t.values(), torch.tensor([1.0, 4.0, 2.0, 5.0, 3.0, 6.0]))  # packed row-major over (3, 2)


def test_permute_errors():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    # moving the batch dim gives a token (test_batch_moved.py); ops it does not take name the batch dim
    with pytest.raises(NotImplementedError, match="batch dim"):
        torch.flip(x.transpose(0, 1), [1])
    with pytest.raises(NotImplementedError, match="batch dim"):
        x.unsqueeze(-1).transpose(0, 1).roll(1, 1)
    with pytest.raises(NotImplementedError, match="batch dim"):
        x.transpose(0, 1).roll(1)  # the flattened tensor
    with pytest.raises(ValueError, match="permute"):
        x.permute(0, 1, 1)


def test_gradcheck_pair_transpose():
    for comps in (comps_for([(2, 2, 2), (0, 0, 2), (3, 3, 2)], 0), comps_for([(2, 3, 2), (0, 2, 2), (3, 0, 2), (1, 2, 2)], 1)):
        v, off, sizes = packed_args(comps, (1, 2))

        def f(v):
            p = mj.from_packed(v, off, sizes, (1, 2))
            return (p.transpose(1, 2) * p.transpose(1, 2).sum(-1, keepdim=True)).values()

        assert torch.autograd.gradcheck(f, (v.requires_grad_(),))


def test_gradcheck_square_symmetrise():
    comps = comps_for([(2, 2, 2), (0, 0, 2), (3, 3, 2)], 2)
    v, off, sizes = packed_args(comps, (1, 2))
    assert torch.autograd.gradcheck(lambda v: (lambda p: (p + p.transpose(1, 2)).values())(mj.from_packed(v, off, sizes, (1, 2))),
                                    (v.requires_grad_(),))


# ----------------------------------------------------------------------------- unsqueeze / squeeze
UNSQ = {
    "seq.unsqueeze(1)": ("seq", lambda t: t.unsqueeze(1), lambda c: c.unsqueeze(0)),
    "seq.unsqueeze(2)": ("seq", lambda t: t.unsqueeze(2), lambda c: c.unsqueeze(1)),
    "seq.unsqueeze(-1)": ("seq", lambda t: t.unsqueeze(-1), lambda c: c.unsqueeze(-1)),
    "seq.unsqueeze.squeeze(1)": ("seq", lambda t: t.unsqueeze(1).squeeze(1), lambda c: c),
    # squeeze() drops every static size-1 dim (C too when C = 1), never the ragged one or the
    # batch dim (B = 1 is covered by test_squeeze_all_grad)
    "seq.squeeze()": ("seq", lambda t: t.unsqueeze(1).unsqueeze(-1).squeeze(), lambda c: c[:, 0] if c.shape[1] == 1 else c),
    "square.unsqueeze(2)": ("square", lambda t: t.unsqueeze(2), lambda c: c.unsqueeze(1)),
    "square.unsqueeze(-1).squeeze(-1)": ("square", lambda t: t.unsqueeze(-1).squeeze(-1), lambda c: c),
    "square.squeeze(dims)": ("square", lambda t: t.unsqueeze(3).unsqueeze(1).squeeze((1, 4)), lambda c: c),
    "static_lead.unsqueeze(3)": ("static_lead", lambda t: t.unsqueeze(3), lambda c: c.unsqueeze(2)),
    "static_lead.squeeze(1)": ("static_lead", lambda t: t.narrow(1, 0, 1).squeeze(1), lambda c: c.narrow(0, 0, 1).squeeze(0)),
}


@pytest.mark.parametrize("op", UNSQ, ids=str)
def test_unsqueeze_squeeze(op):
    layout, f, ref = UNSQ[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3), seeds)
    def check(s, seed):
        x, out = per_sample_check_any_ints(f, ref, components(s.shapes, seed), s.ragged_dims, seed, grad=op != "seq.squeeze()")
        for d in s.ragged_dims:  # every nested int of x is still there
            assert x.shape[d] in tuple(out.shape)

    check()


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_all_grad(batch):
    comps = comps_for([(2, 1)] * batch, 3)
    per_sample_check_any_ints(lambda t: t.unsqueeze(2).squeeze(), lambda c: c[:, 0], comps, (1,))


def test_squeeze_unsqueeze_errors():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    with pytest.raises(ValueError, match=r"^squeeze\(\).*ragged dim 1"):
        x.squeeze(1)
    with pytest.raises(ValueError, match=r"^squeeze\(\).*batch"):
        x.squeeze(0)
    with pytest.raises(ValueError, match=r"^unsqueeze\(\).*batch"):
        x.unsqueeze(0)
    assert x.squeeze(2).shape == x.shape  # size 3: no-op, as dense


# ----------------------------------------------------------------------------- view family
VIEWS = {
    # square pair with a (2, 3) tail: (B, j0, j0, 2, 3)
    "flatten(-2)": (lambda t: t.flatten(-2), lambda c: c.flatten(-2)),
    "unflatten": (lambda t: t.flatten(-2).unflatten(-1, (3, 2)), lambda c: c.flatten(-2).unflatten(-1, (3, 2))),
    "view(...,-1)": (lambda t: t.view(*t.shape[:3], -1), lambda c: c.view(*c.shape[:2], 6)),
    "view(...,6,1)": (lambda t: t.view(t.shape[0], t.shape[1], t.shape[2], 6, 1), lambda c: c.view(c.shape[0], c.shape[1], 6, 1)),
    "reshape(...,3,2)": (lambda t: t.reshape(*t.shape[:3], 3, 2), lambda c: c.reshape(*c.shape[:2], 3, 2)),
    "transpose.contiguous.view": (lambda t: t.transpose(-1, -2).contiguous().view(*t.shape[:3], 6),
                                  lambda c: c.transpose(-1, -2).reshape(*c.shape[:2], 6)),
}


@pytest.mark.parametrize("op", VIEWS, ids=str)
def test_view_family_on_pair(op):
    f, ref = VIEWS[op]

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        out = per_sample_check(f, R(comps_for([(n, n, 2, 3) for n in ns], seed), (1, 2)), ref=ref, seed=seed)
        assert out.ragged_dims == (1, 2)

    check()


@pytest.mark.parametrize("how", ["reshape", "flatten"])
@pytest.mark.parametrize("shapes", [[(0, 2, 3), (3, 2, 3)], [(0, 0, 2, 3), (2, 2, 2, 3)]], ids=["seq", "square"])
def test_reshape_non_contiguous(how, shapes):
    comps = comps_for(shapes, 0)
    x = mj.nested_tensor(comps)
    q = x.transpose(-1, -2)
    out = q.flatten(-2) if how == "flatten" else q.reshape(*x.shape[:-2], 6)
    for o, c in zip(out.unbind(), comps):
        assert_close(o, c.transpose(-1, -2).flatten(-2))


def test_flatten_static_dims_before_a_ragged_dim():
    """(B, S1, S2, j0, C).flatten(1, 2) → (B, S1·S2, j0, C); and unflatten back."""

    @FEW
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        comps = comps_for([(2, 3, n, 2) for n in ns], seed)
        out = per_sample_check(lambda t: t.flatten(1, 2), R(comps, (3,)), ref=lambda c: c.flatten(0, 1), seed=seed)
        assert out.ragged_dims == (2,)
        per_sample_check(lambda t: t.flatten(1, 2).unflatten(1, (3, 2)), R(comps, (3,)),
                         ref=lambda c: c.flatten(0, 1).unflatten(0, (3, 2)), seed=seed)

    check()


def test_view_errors():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    s = mj.nested_tensor(comps_for([(2, 4, n, 3) for n in (2, 0)], 0), ragged_dims=(3,))
    # a static dim folded into the ragged one after it: each sample's elements regrouped (a copy, as
    # dense flatten's of a tensor it cannot view)
    assert [tuple(c.shape) for c in s.flatten(2, 3).unbind()] == [(2, 8, 3), (2, 0, 3)]
    assert all(torch.equal(a, c.flatten(1, 2)) for a, c in zip(s.flatten(2, 3).unbind(), s.unbind()))
    with pytest.raises(ValueError, match=r"^view\(\).*regroup between ragged dims"):
        s.view(s.shape[0], 2, s.shape[3], 12)  # 4 moved across the ragged dim
    with pytest.raises(ValueError, match=r"^view\(\)"):
        x.view(x.shape[0], x.shape[1], 4)  # 3 ≠ 4 elements per row


# ----------------------------------------------------------------------------- narrow / slice / select
SLICES = {
    "[...,1:3]": (lambda t: t[..., 1:3], lambda c: c[..., 1:3]),
    "[...,::2]": (lambda t: t[..., ::2], lambda c: c[..., ::2]),
    "[...,-2:]": (lambda t: t[..., -2:], lambda c: c[..., -2:]),
    "narrow(-1,1,2)": (lambda t: t.narrow(-1, 1, 2), lambda c: c.narrow(-1, 1, 2)),
    "select(-1,0)": (lambda t: t.select(-1, 0), lambda c: c.select(-1, 0)),
    "[...,2]": (lambda t: t[..., 2], lambda c: c[..., 2]),
    "[...,-1]": (lambda t: t[..., -1], lambda c: c[..., -1]),
    "slice_combine": (lambda t: t[..., 1:3] * 2 + t[..., :2], lambda c: c[..., 1:3] * 2 + c[..., :2]),
}


@pytest.mark.parametrize("layout", ["seq", "square", "rect", "static_lead"])
@pytest.mark.parametrize("op", SLICES, ids=str)
def test_slicing_static_dims(op, layout):
    f, ref = SLICES[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3, min_c=3, max_c=4), seeds)
    def check(s, seed):
        per_sample_check(f, R(components(s.shapes, seed), s.ragged_dims), ref=ref, seed=seed)

    check()


STATIC_LEAD_OPS = {
    "select(1,0)": (lambda t: t.select(1, 0), lambda c: c.select(0, 0)),
    "[:,-1]": (lambda t: t[:, -1], lambda c: c[-1]),
    "narrow(1,1,1)": (lambda t: t.narrow(1, 1, 1), lambda c: c.narrow(0, 1, 1)),
}


@pytest.mark.parametrize("op", STATIC_LEAD_OPS, ids=str)
def test_slicing_static_dim_before_ragged(op):
    """(B, S, j0, C): select / narrow the leading static dim."""
    f, ref = STATIC_LEAD_OPS[op]

    @FEW
    @given(structures(STATIC_LEAD, max_batch=3), st.integers(2, 3), seeds)
    def check(s, s_size, seed):
        shapes = Shapes((s_size, *sh[1:]) for sh in s.shapes)
        shapes.template = (s_size, *s.shapes.template[1:])  # B = 0
        per_sample_check(f, R(components(shapes, seed), s.ragged_dims), ref=ref, seed=seed)

    check()


def test_slicing_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.zeros(0, 3), torch.tensor([[7.0, 8.0, 9.0]])],
                         ragged_dims=(1,))
    cases = {
        "x[..., 1:3]": (x[..., 1:3], [[[2.0, 3.0], [5.0, 6.0]], torch.zeros(0, 2), [[8.0, 9.0]]]),
        "x[..., 0]": (x[..., 0], [[1.0, 4.0], torch.zeros(0), [7.0]]),
        "x[..., ::2]": (x[..., ::2], [[[1.0, 3.0], [4.0, 6.0]], torch.zeros(0, 2), [[7.0, 9.0]]]),
    }
    for name, (out, expected) in cases.items():
        assert out.shape[1] == x.shape[1], name
        for o, e in zip(out.unbind(), expected):
            torch.testing.assert_close(o, torch.as_tensor(e), msg=name)


def test_indexing_ragged_dims_is_per_sample():
    """Along a ragged dim, slicing clamps per sample and an index a sample lacks raises naming it
    (test_ragged_indexing.py has the rest)."""
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    assert [tuple(c.shape) for c in x[:, 1:].unbind()] == [(1, 3), (0, 3)]
    with pytest.raises(IndexError, match=r"^select\(\).*sample 1"):
        x.select(1, 0)
    with pytest.raises(RuntimeError, match=r"^narrow\(\).*sample 1"):
        x.narrow(1, 0, 1)


# ----------------------------------------------------------------------------- cat / stack
JOIN = {
    "cat(-1)": (lambda a, b: torch.cat([a, b], -1), lambda a, b: torch.cat([a, b], -1)),
    "cat(-1,3)": (lambda a, b: torch.cat([a, b * 2, a], dim=-1), lambda a, b: torch.cat([a, b * 2, a], dim=-1)),
    "stack(-1)": (lambda a, b: torch.stack([a, b], -1), lambda a, b: torch.stack([a, b], -1)),
    "stack(-2)": (lambda a, b: torch.stack([a, b], -2), lambda a, b: torch.stack([a, b], -2)),
}


@pytest.mark.parametrize("layout", ["seq", "square", "rect", "static_lead"])
@pytest.mark.parametrize("op", JOIN, ids=str)
def test_cat_stack(op, layout):
    """Operands of one structure (the second derived from the first: same nested ints)."""
    f, ref = JOIN[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(lambda x: f(x, torch.tanh(x) * 3), R(components(s.shapes, seed), s.ragged_dims),
                         ref=lambda c: ref(c, torch.tanh(c) * 3), seed=seed)

    check()


@pytest.mark.parametrize("layout", ["seq", "square", "rect", "static_lead"])
@pytest.mark.parametrize("op", JOIN, ids=str)
def test_cat_stack_forward_two_tensors(op, layout):
    """Two tensors built separately with the same extents (different nested ints): forward."""
    f, ref = JOIN[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(f, R(components(s.shapes, seed), s.ragged_dims), R(components(s.shapes, seed + 1), s.ragged_dims),
                         ref=ref, grad=False)

    check()


@pytest.mark.parametrize("op", ["cat(-1)", "stack(-1)"])
def test_cat_stack_backward_two_tensors(op):
    f, ref = JOIN[op]
    comps = [comps_for([(2, 3), (0, 3)], 0), comps_for([(2, 3), (0, 3)], 1)]
    per_sample_check(f, R(comps[0], (1,)), R(comps[1], (1,)), ref=ref)


def test_cat_stack_derived_and_before_ragged():
    """Operands derived from one tensor; stack at dim 1 puts a static dim before the ragged one."""

    @FEW
    @given(structures(SQUARE, max_batch=3), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        out = per_sample_check(lambda p: torch.stack([p, p.sin(), p.transpose(1, 2)], 1), R(comps, s.ragged_dims),
                               ref=lambda c: torch.stack([c, c.sin(), c.transpose(0, 1)], 0), seed=seed)
        assert out.ragged_dims == (2, 3)
        per_sample_check(lambda p: torch.cat([p, p.transpose(1, 2)], 3), R(comps, s.ragged_dims),
                         ref=lambda c: torch.cat([c, c.transpose(0, 1)], 2), seed=seed)

    check()


def test_cat_skips_a_one_dim_empty_tensor_as_dense():
    """Dense torch's legacy rule: a ``(0,)`` tensor joins anything, skipped (a cache grown from
    ``torch.tensor([])``); the result is a new tensor with the batch's gradient."""
    leaves = [torch.randn(n, 2, 3, dtype=torch.float64, requires_grad=True) for n in (2, 0, 3)]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    empty = torch.tensor([], dtype=torch.float64)
    for dim in (1, -1, -2):
        out = torch.cat([empty, x], dim)
        assert out is not x
        for o, c in zip(out.unbind(), leaves):
            torch.testing.assert_close(o, torch.cat([empty, c], dim - 1 if dim > 0 else dim))
    two = torch.cat([empty, x, empty, x], -1)
    for o, c in zip(two.unbind(), leaves):
        torch.testing.assert_close(o, torch.cat([c, c], -1))
    grads = torch.autograd.grad(two.sum() + torch.cat([empty, x], 1).sum(), leaves)
    for g in grads:
        torch.testing.assert_close(g, torch.full_like(g, 3.0))


def test_cat_stack_golden():
    a = mj.nested_tensor([torch.tensor([[1.0], [2.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    b = mj.nested_tensor([torch.tensor([[3.0], [4.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    c = torch.cat([a, b], -1)
    torch.testing.assert_close(c.unbind()[0], torch.tensor([[1.0, 3.0], [2.0, 4.0]]))  # = [[a0, b0], [a1, b1]]
    st_ = torch.stack([a, b], 1)
    assert st_.shape == (2, 2, a.shape[1], 1)
    torch.testing.assert_close(st_.unbind()[0], torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]]))  # = [a, b]
    assert st_.unbind()[1].shape == (2, 0, 1)


def test_cat_stack_errors():
    a = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    other = mj.nested_tensor(comps_for([(0, 3), (2, 3)], 1), ragged_dims=(1,))  # same total, other lengths
    with pytest.raises(ValueError, match=r"^cat\(\).*one structure"):
        torch.cat([a, other], -1)
    assert torch.stack([a, a], 0).shape[:2] == (2, 2)  # a batch-moved token (test_batch_moved.py)
    with pytest.raises(TypeError, match=r"^cat\(\)"):
        torch.cat([a, torch.ones(2, 2, 3)], -1)


def test_stack_error_names_stack():
    a = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    other = mj.nested_tensor(comps_for([(0, 3), (2, 3)], 1), ragged_dims=(1,))
    with pytest.raises(ValueError, match=r"^stack\(\)"):
        torch.stack([a, other], -1)


# ----------------------------------------------------------------------------- chunk / split
SPLITS = {
    "chunk(2,-1)": (lambda t: t.chunk(2, -1), lambda c: c.chunk(2, -1)),
    "chunk(3,-1)": (lambda t: torch.chunk(t, 3, -1), lambda c: torch.chunk(c, 3, -1)),
    "split(1,-1)": (lambda t: t.split(1, -1), lambda c: c.split(1, -1)),
    "split([1,3],-1)": (lambda t: torch.split(t, [1, 3], -1), lambda c: torch.split(c, [1, 3], -1)),
}


@pytest.mark.parametrize("layout", ["seq", "square", "static_lead"])
@pytest.mark.parametrize("op", SPLITS, ids=str)
def test_chunk_split(op, layout):
    """Every piece per sample; gradients with only one piece used (the others get none)."""
    f, ref = SPLITS[op]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3, min_c=4, max_c=4), seeds, st.integers(0, 3))
    def check(s, seed, k):
        comps = components(s.shapes, seed)
        pieces = f(mj.nested_tensor(comps, ragged_dims=s.ragged_dims))
        ref_pieces = [ref(c) for c in comps]
        assert len(pieces) == len(ref_pieces[0])
        for j, p in enumerate(pieces):
            for i, comp in enumerate(p.unbind()):
                assert_close(comp, ref_pieces[i][j], f"piece {j} sample {i}")
        k = k % len(pieces)
        per_sample_check(lambda t: f(t)[k], R(comps, s.ragged_dims), ref=lambda c: ref(c)[k], seed=seed)

    check()


def test_chunk_split_all_pieces_grad():
    """Using every piece (with different weights) gives the dense gradient."""

    @FEW
    @given(structures(SQUARE, max_batch=3, min_c=3, max_c=3), seeds)
    def check(s, seed):
        def f(t):
            a, b, c = t.chunk(3, -1)
            return a * 1 + b * 2 + c * 3

        per_sample_check(f, R(components(s.shapes, seed), s.ragged_dims), seed=seed)

    check()


@pytest.mark.parametrize("how", ["split", "chunk"])
def test_split_ragged_dim_raises_value_error(how):
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    with pytest.raises(ValueError, match=how):
        getattr(x, how)(1, 1)


# ----------------------------------------------------------------------------- einsum
EINSUM = {
    "bijc,cd->bijd": ("square", lambda c: (c, 2), "ijc,cd->ijd"),
    "bijc,c->bij": ("rect", lambda c: (c,), "ijc,c->ij"),
    "bic,cd->bid": ("seq", lambda c: (c, 3), "ic,cd->id"),
}


@pytest.mark.parametrize("eq", ["bijc,cd->bijd", "bijc,c->bij", "bic,cd->bid"])
def test_einsum_with_dense(eq):
    layout, wshape, ref_eq = EINSUM[eq]

    @FEW
    @given(structures(LAYOUT[layout], max_batch=3), seeds)
    def check(s, seed):
        w = comps_for([wshape(s.c)], seed + 5)[0]
        per_sample_check(lambda x, w: torch.einsum(eq, x, w), R(components(s.shapes, seed), s.ragged_dims), w,
                         ref=lambda c, w: torch.einsum(ref_eq, c, w), seed=seed)

    check()


def test_einsum_static_lead_contracts_s_and_c():
    @FEW
    @given(structures(STATIC_LEAD, max_batch=3), seeds)
    def check(s, seed):
        w = comps_for([(s.s, s.c)], seed + 5)[0]
        per_sample_check(lambda x, w: torch.einsum("bsic,sc->bi", x, w), R(components(s.shapes, seed), s.ragged_dims), w,
                         ref=lambda c, w: torch.einsum("sic,sc->i", c, w), seed=seed)

    check()


MJ_EINSUM = {
    "bijc,bijc->bij": "ijc,ijc->ij",
    "bijc,bijd->bijcd": "ijc,ijd->ijcd",
    "bijc,bijc->bijc": "ijc,ijc->ijc",
}


@pytest.mark.parametrize("eq", MJ_EINSUM, ids=str)
def test_einsum_two_multi_jagged(eq):
    """Two pairs of one structure (built separately): the cell-wise contraction of static dims."""

    @FEW
    @given(structures(RECT, max_batch=3), seeds)
    def check(s, seed):
        per_sample_check(lambda a, b: torch.einsum(eq, a, b), R(components(s.shapes, seed), s.ragged_dims),
                         R(components(s.shapes, seed + 1), s.ragged_dims), ref=lambda a, b: torch.einsum(MJ_EINSUM[eq], a, b),
                         seed=seed)

    check()


def test_einsum_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2)], ragged_dims=(1,))
    w = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    out = torch.einsum("bic,cd->bid", x, w)
    assert out.shape == (2, x.shape[1], 3)
    torch.testing.assert_close(out.unbind()[0], torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 7.0]]))  # = [x0, x1, x0+x1] per row
    dot = torch.einsum("bic,bic->bi", x, x)
    torch.testing.assert_close(dot.unbind()[0], torch.tensor([5.0, 25.0]))  # = [1²+2², 3²+4²]


def test_einsum_errors():
    p = mj.nested_tensor(comps_for([(2, 2, 3), (0, 0, 3)], 0), ragged_dims=(1, 2))
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 0), ragged_dims=(1,))
    # valid per sample, by broadcasting (test_contractions.py): sum over j, outer product over k
    out = torch.einsum("bijc,bkc->bikc", p, x)
    for o, pc, xc in zip(out.unbind(), p.unbind(), x.unbind()):
        torch.testing.assert_close(o, torch.einsum("ijc,kc->ikc", pc, xc))
    with pytest.raises(NotImplementedError, match=r"^einsum\(\)"):
        torch.einsum("bic,id->bid", x, torch.ones(2, 2))  # a dense operand indexes the ragged dim
    with pytest.raises(ValueError, match=r"^einsum\(\)"):
        torch.einsum("....c,cd->...d", x, torch.ones(3, 2))  # malformed ellipsis
    for o, pc in zip(torch.einsum("bijc->bjic", p).unbind(), p.unbind()):  # a per-sample transpose
        torch.testing.assert_close(o, pc.transpose(0, 1))


def test_gradcheck_structure_ops():
    comps = comps_for([(2, 2, 4), (0, 0, 4), (3, 3, 4)], 7)
    v, off, sizes = packed_args(comps, (1, 2))
    w = comps_for([(2, 3)], 8)[0].requires_grad_()

    def f(v, w):
        p = mj.from_packed(v, off, sizes, (1, 2))
        a, b = p.chunk(2, -1)
        q = torch.cat([torch.einsum("bijc,cd->bijd", a, w), b[..., :1].unsqueeze(-1).squeeze(-1)], -1)
        return torch.stack([q, q.transpose(1, 2)], -1).flatten(-2).values()

    assert torch.autograd.gradcheck(f, (v.requires_grad_(), w))


@pytest.mark.parametrize("op", ["hstack", "column_stack", "vstack", "row_stack", "dstack", "concatenate"])
def test_stack_shorthands_join_as_cat(op):
    """``hstack`` / ``column_stack`` (cat along dim 1: each sample's rows), ``vstack`` /
    ``row_stack`` (dim 0: the samples of both batches), ``dstack`` (dim 2, after ``atleast_3d``)
    and ``torch.concatenate(..., axis=)``, with gradients; two batches built apart from equal
    lengths join as one (their nested ints are unified, so the backward's shapes check)."""
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in (3, 0, 2)]
    b = [torch.randn(n, 2, generator=g, dtype=torch.float64) for n in ((1, 4, 2) if op != "dstack" else (3, 0, 2))]
    join = {"hstack": lambda t: torch.hstack(t), "column_stack": lambda t: torch.column_stack(t),
            "vstack": lambda t: torch.vstack(t), "row_stack": lambda t: torch.row_stack(t),
            "dstack": lambda t: torch.dstack(t), "concatenate": lambda t: torch.concatenate(t, axis=1)}[op]
    la = [t.clone().requires_grad_() for t in a]
    lb = [t.clone().requires_grad_() for t in b]
    out = join([mj.as_nested_tensor(la), mj.as_nested_tensor(lb)])
    if op in ("vstack", "row_stack"):
        want = [*a, *b]
    else:
        want = [torch.cat([x, y], 1 if op == "dstack" else 0) for x, y in zip(a, b)]
    assert len(out.unbind()) == len(want)
    for o, w in zip(out.unbind(), want):
        torch.testing.assert_close(o, w)
    grads = torch.autograd.grad((out * out).sum(), la + lb)
    for gr, t in zip(grads, a + b):
        torch.testing.assert_close(gr, 2 * t)
    pair = mj.as_nested_tensor([torch.ones(n, n, 2) for n in (2, 1)], ragged_dims=(1, 2))
    assert [t.shape for t in torch.dstack([pair, pair]).unbind()] == [torch.Size([2, 4, 2]), torch.Size([1, 2, 2])]


# ----------------------------------------------------------------------------- extents put back together
@pytest.mark.parametrize("case", ["head and rest", "prefix token", "middle cut", "pad back"])
def test_joins_that_give_back_a_source_extent_keep_its_nested_int(case):
    """A cat (or pad) along a ragged dim whose per-sample sizes are those of the extent its pieces
    were sliced from has that extent's nested int: timm's ``cat([x[:, :, :1], rope(x[:, :, 1:])], 2)``
    reshaped with ``N = x.shape[2]``. Values and gradients are dense torch's per sample."""
    F = torch.nn.functional
    fs = {
        "head and rest": (lambda t: torch.cat([t[:, :, :1], t[:, :, 1:] * 2.0], 2),
                          lambda c: torch.cat([c[:, :1], c[:, 1:] * 2.0], 1)),
        "prefix token": (lambda t: torch.cat([torch.ones(t.shape[0], 2, 1, 3, dtype=t.dtype), t[:, :, 1:]], 2),
                         lambda c: torch.cat([torch.ones(2, 1, 3, dtype=c.dtype), c[:, 1:]], 1)),
        "middle cut": (lambda t: torch.cat([t[:, :, :2], t[:, :, 2:]], 2), lambda c: torch.cat([c[:, :2], c[:, 2:]], 1)),
        "pad back": (lambda t: F.pad(t[:, :, 1:], (0, 0, 1, 0)), lambda c: F.pad(c[:, 1:], (0, 0, 1, 0))),
    }
    f, ref = fs[case]
    lens = (3, 5, 2) if case == "middle cut" else (3, 1, 4)
    comps = components([(2, n, 3) for n in lens], 0)
    out = per_sample_check(f, R(comps, (2,)), ref=ref)
    x = mj.as_nested_tensor(comps, ragged_dims=(2,))
    assert f(x).shape[2] is x.shape[2]
    assert f(x).transpose(1, 2).reshape(3, x.shape[2], 6).shape[1] is x.shape[2]
    assert out.ragged_dims == (2,)
    assert torch.cat([x[:, :, :1], x[:, :, :1]], 2).shape[2] is not x.shape[2]  # other sizes: a new extent


def test_view_and_reshape_take_an_equal_sized_nested_int():
    """A nested int of a tensor built apart from the same lengths names the ragged dim in ``view`` /
    ``reshape`` (as binary ops combine such tensors): the result has the shape asked for, and
    gradients come back with the input's own nested ints. Other lengths still raise."""
    comps = components([(n, 4, 2) for n in (3, 0, 5)], 0)
    twin = mj.as_nested_tensor([torch.zeros(n, 1) for n in (3, 0, 5)])
    n = twin.shape[1]
    for op in ("view", "reshape"):
        out = per_sample_check(lambda t: getattr(t * 1.0, op)(3, n, 8), R(comps, (1,)), ref=lambda c: c.reshape(-1, 8),
                               new_ragged=True)
        assert out.shape[1] is n
        x = mj.as_nested_tensor(comps).requires_grad_()
        g, = torch.autograd.grad(getattr(x * 1.0, op)(3, n, 8).sum(), x)
        assert g.shape == x.shape and g.shape[1] is x.shape[1]
    assert mj.as_nested_tensor(comps).transpose(1, 2).reshape(3, 4, n, 2).shape[2] is n
    other = mj.as_nested_tensor([torch.zeros(n, 1) for n in (3, 1, 4)])
    with pytest.raises(mj.StructureError, match="not a ragged size"):
        mj.as_nested_tensor(comps).reshape(3, other.shape[1], 8)


@pytest.mark.parametrize("op", ["view", "reshape"])
def test_a_square_pair_s_dims_named_apart_raise_clearly(op):
    """``p.view(B, k, p.shape[2], C)`` with ``k`` another nested int of ``p``'s lengths names one
    extent two ways: a clear error (relabelling both dims would make the other name foreign in
    turn, without end)."""
    lens = (2, 3)
    p = mj.as_nested_tensor([torch.randn(n, n, 2) for n in lens], ragged_dims=(1, 2))
    k = mj.as_nested_tensor([torch.zeros(n) for n in lens]).shape[1]
    with pytest.raises(mj.StructureError, match="not a ragged size"):
        getattr(p, op)(2, k, p.shape[2], 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", ["view_as", "reshape_as"])
def test_view_as_a_tensor_built_apart_takes_its_shape(op, dtype):
    """``x.view_as(y)`` / ``x.reshape_as(y)`` with ``y`` built apart from the same lengths is
    ``x.view(y.shape)``, as dense per sample: the result has ``y``'s shape, nested ints included,
    also where the view flattens or unflattens ragged dims (an image batch's ``(H, W)`` and its
    ``H·W`` tokens, a pair's ``n × n``); gradients come back in ``x``'s own shape."""
    images = [(3, 4), (0, 2), (2, 5)]
    chans = components([(2, h, w) for h, w in images], 0, dtype)
    pairs = components([(n, n, 4) for n in (3, 0, 2)], 2, dtype)
    cases = [  # (x's components and ragged dims, y's, x's transform, its per-sample reference)
        (R(chans, (2, 3)), R(components([(2, h, w) for h, w in images], 3, dtype), (2, 3)),
         lambda t: t.flatten(2), lambda c: c.flatten(1)),
        (R(chans, (2, 3)), R(chans, (2, 3)), lambda t: t.flatten(2) * 2.0, lambda c: c.flatten(1) * 2.0),
        (R(components([(n, 4) for n in (3, 0, 2)], 4, dtype), (1,)), R(components([(n, 2, 2) for n in (3, 0, 2)], 5, dtype), (1,)),
         lambda t: t * 2.0, lambda c: c * 2.0),
        (R(pairs, (1, 2)), R(components([(n, n, 2, 2) for n in (3, 0, 2)], 6, dtype), (1, 2)),
         lambda t: t * 2.0, lambda c: c * 2.0),
        (R(pairs, (1, 2)), R(components([(n, n, 4) for n in (3, 0, 2)], 7, dtype), (1, 2)),
         lambda t: t.flatten(1, 2), lambda c: c.flatten(0, 1)),
    ]
    for rx, ry, pre, pre_ref in cases:
        def fn(x, y):
            out = getattr(pre(x), op)(y)
            assert out.shape == y.shape and all(out.shape[d] is y.shape[d] for d in y.ragged_dims)
            return out

        per_sample_check(fn, rx, ry, ref=lambda c, d: getattr(pre_ref(c), op)(d), new_ragged=True)


@pytest.mark.parametrize("grad", [True, False])
def test_slice_and_select_scatter_along_a_static_dim(grad):
    """``torch.slice_scatter`` / ``select_scatter`` along a static dim (what a functionalised write
    through ``x[..., :2]`` becomes): each sample's dense op, with ``src`` of the batch's structure or
    one dense ``src`` for every row; gradients of every leaf; along a ragged dim they raise."""
    g = torch.Generator().manual_seed(0)
    cs = [torch.randn(n, 4, dtype=torch.float64, generator=g).requires_grad_(grad) for n in (3, 0, 2)]
    ss = [torch.randn(n, 2, dtype=torch.float64, generator=g).requires_grad_(grad) for n in (3, 0, 2)]
    x = mj.as_nested_tensor(cs)
    src = mj.as_nested_tensor(ss) + 0 * x[..., :2]  # x's nested int
    cases = [
        (torch.slice_scatter(x, src, 2, 0, 2), [torch.slice_scatter(c, s, 1, 0, 2) for c, s in zip(cs, ss)]),
        (torch.slice_scatter(x, src, -1, 1, 4, 2), [torch.slice_scatter(c, s, 1, 1, 4, 2) for c, s in zip(cs, ss)]),
        (torch.select_scatter(x, src[..., 0], 2, 1), [torch.select_scatter(c, s[:, 0], 1, 1) for c, s in zip(cs, ss)]),
    ]
    for out, refs in cases:
        for a, r in zip(out.unbind(), refs):
            torch.testing.assert_close(a, r)
        if grad:
            got = torch.autograd.grad((out * out).sum(), cs + ss, retain_graph=True)
            want = torch.autograd.grad(sum((r * r).sum() for r in refs), cs + ss, retain_graph=True)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)
    row = torch.tensor([5.0, 6.0], dtype=torch.float64)
    out = torch.slice_scatter(x, row, 2, 0, 2)
    for a, c in zip(out.unbind(), cs):
        torch.testing.assert_close(a, torch.slice_scatter(c, row.expand(c.shape[0], 2), 1, 0, 2))
    out = torch.select_scatter(x, torch.tensor(7.0, dtype=torch.float64), 2, 1)
    for a, c in zip(out.unbind(), cs):
        torch.testing.assert_close(a, torch.select_scatter(c, torch.full((c.shape[0],), 7.0, dtype=torch.float64), 1, 1))
    with pytest.raises(mj.StructureError, match="static dim"):
        torch.slice_scatter(x, src, 1, 0, 2)
    other = mj.nested_tensor([torch.randn(n, 2, dtype=torch.float64) for n in (1, 1, 1)])
    with pytest.raises(mj.StructureError, match="structure"):
        torch.slice_scatter(x, other, 2, 0, 2)
