"""Broadcasting that creates ragged axes (ops/elementwise/pointwise.py, NOTE [ Broadcasting over ragged dims ]).

``(B, j0, 1, C) ∘ (B, 1, j0, C)`` → square pair, ``(B, j0, 1, C) ∘ (B, 1, j1, C)`` →
rectangular pair, for every pointwise binary op, against the per-sample reference (forward and
gradients), gradcheck on packed values, golden cases and structural errors.
"""

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import multi_jagged

from _reference import PS, R, assert_close, components, few, per_sample_check, seeds
from _structures import comps_for, length_pairs, lengths, packed_args

FEW = few(12)  # 12 examples under the default profile, scaled by HYPOTHESIS_PROFILE


def _row(t):  # (B, j0, 1, C) / (n, 1, C): negative dims mean the same on both sides
    return t.unsqueeze(-2)


def _col(t):
    return t.unsqueeze(-3)


# Each op takes (row, col) operands; divisors / bases kept away from 0 so gradients are finite.
OPS = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "rdiv": lambda a, b: (a.abs() + 0.5) / b.abs().add(0.5),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": lambda a, b: a.round() == b.round(),
    "ne": lambda a, b: a.round() != b.round(),
    "where": lambda a, b: torch.where(a > b, a, b * 2),
    "where_scalar": lambda a, b: torch.where(a > b, a * b, 0.0),
    "atan2": torch.atan2,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
}


# ----------------------------------------------------------------------------- square / rect
@pytest.mark.parametrize("op", OPS, ids=str)
def test_square_pair_from_one_tensor(op):
    """``x.unsqueeze(-2) ∘ x.unsqueeze(-3)``: one operand, both pair dims carry its ``j0``."""

    @FEW
    @given(lengths(), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        f = OPS[op]
        per_sample_check(lambda x: f(_row(x), _col(x)), R(comps_for([(n, c) for n in ns], seed), (1,)))

    check()


@pytest.mark.parametrize("op", OPS, ids=str)
def test_square_pair_from_two_tensors(op):
    """Two separately built singles with equal lengths (different nested ints)."""

    @FEW
    @given(lengths(), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        f = OPS[op]
        xs = comps_for([(n, c) for n in ns], seed)
        ys = comps_for([(n, c) for n in ns], seed + 1)
        per_sample_check(lambda x, y: f(_row(x), _col(y)), R(xs, (1,)), R(ys, (1,)))

    check()


@pytest.mark.parametrize("op", OPS, ids=str)
def test_rectangular_pair(op):
    """x from lengths n_i, y from m_i: ``(B, j0, 1, C) ∘ (B, 1, j1, C)`` → ``(B, j0, j1, C)``."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        f = OPS[op]
        xs = comps_for([(n, c) for n in ns], seed)
        ys = comps_for([(m, c) for m in ms], seed + 1)
        out = per_sample_check(lambda x, y: f(_row(x), _col(y)), R(xs, (1,)), R(ys, (1,)))
        assert out.sizes().tolist() == [[n, m] for n, m in zip(ns, ms)]

    check()


@pytest.mark.parametrize("op", ["add", "mul", "where"])
def test_rectangular_pair_col_first(op):
    """Operand order does not matter: ``(B, 1, j1, C) ∘ (B, j0, 1, C)``."""

    @FEW
    @given(length_pairs(), seeds)
    def check(nm, seed):
        ns, ms = nm
        f = OPS[op]
        per_sample_check(
            lambda y, x: f(_col(y), _row(x)),
            R(comps_for([(m, 2) for m in ms], seed), (1,)),
            R(comps_for([(n, 2) for n in ns], seed + 1), (1,)),
        )

    check()


def test_pair_nested_ints():
    """The pair reuses its operands' nested ints: square ``(B, j0, j0, C)`` with x's ``j0``,
    rectangular ``(B, j0, j1, C)`` with x's and y's."""
    x = mj.nested_tensor([torch.randn(n, 3) for n in (2, 0, 3)], ragged_dims=(1,))
    y = mj.nested_tensor([torch.randn(m, 3) for m in (1, 4, 0)], ragged_dims=(1,))
    sq = _row(x) * _col(x)
    assert sq.layout is multi_jagged
    assert sq.shape == (3, x.shape[1], x.shape[1], 3)
    assert sq.ragged_dims == (1, 2)
    assert sq.sizes().tolist() == [[2, 2], [0, 0], [3, 3]]
    rect = _row(x) * _col(y)
    assert rect.shape == (3, x.shape[1], y.shape[1], 3)
    assert rect.shape[1] != rect.shape[2]
    assert rect.sizes().tolist() == [[2, 1], [0, 4], [3, 0]]
    assert rect.values().shape == (2 * 1 + 0 + 0, 3)  # = Σ n_i m_i rows


# ----------------------------------------------------------------------------- other tails
TAILS = {"no_C": (), "C": (3,), "C1xC2": (2, 3)}


@pytest.mark.parametrize("tail", TAILS, ids=str)
@pytest.mark.parametrize("op", ["add", "mul", "maximum", "gt", "where"])
def test_pair_other_static_tails(tail, op):
    """Static tails ``()`` and ``(C1, C2)``: row at logical dim 2, column at dim 1 (the
    component's dims 1 and 0)."""

    @FEW
    @given(length_pairs(), seeds)
    def check(nm, seed):
        ns, ms = nm
        t = TAILS[tail]
        f = OPS[op]
        per_sample_check(
            lambda x, y: f(x.unsqueeze(2), y.unsqueeze(1)),
            R(comps_for([(n, *t) for n in ns], seed), (1,)),
            R(comps_for([(m, *t) for m in ms], seed + 1), (1,)),
            ref=lambda a, b: f(a.unsqueeze(1), b.unsqueeze(0)),
        )

    check()


@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum", "le", "where"])
def test_non_leading_ragged_dims(op):
    """``(B, S, j0, 1, C) ∘ (B, S, 1, j0, C)`` → ``(B, S, j0, j0, C)``, x built from components
    ``(S, n_i, C)`` with ``ragged_dims=(2,)``; also rectangular with y from ``(S, m_i, C)``."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, s, seed):
        ns, ms = nm
        f = OPS[op]
        xs = comps_for([(s, n, 2) for n in ns], seed)
        ys = comps_for([(s, m, 2) for m in ms], seed + 1)
        sq = per_sample_check(lambda x: f(_row(x), _col(x)), R(xs, (2,)))
        assert sq.ragged_dims == (2, 3)
        rect = per_sample_check(lambda x, y: f(_row(x), _col(y)), R(xs, (2,)), R(ys, (2,)))
        assert rect.ragged_dims == (2, 3)

    check()


# ----------------------------------------------------------------------------- dense operands
DENSE3 = {
    "addcmul": lambda a, b, d: torch.addcmul(a, b, d, value=0.5),  # row + 0.5 · col · d
    "addcmul_dense_self": lambda a, b, d: torch.addcmul(d, a, b),  # d + row · col
    "lerp_tensor_weight": lambda a, b, d: torch.lerp(a, b, d),
    "where_dense_other": lambda a, b, d: torch.where(a > b, a, d),
    "chain": lambda a, b, d: (a * d) + b,  # row·d stays a row, then the pair
}


@pytest.mark.parametrize("op", DENSE3, ids=str)
@pytest.mark.parametrize("dshape", ["(C,)", "(1, 1, C)", "()"])
def test_pair_with_dense_static_operand(op, dshape):
    """A dense operand broadcasting over the static dims joins the row/column broadcast."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        d = comps_for([{"(C,)": (c,), "(1, 1, C)": (1, 1, c), "()": ()}[dshape]], seed + 7)[0]
        f = DENSE3[op]
        per_sample_check(
            lambda x, y, w: f(_row(x), _col(y), w),
            R(comps_for([(n, c) for n in ns], seed), (1,)),
            R(comps_for([(m, c) for m in ms], seed + 1), (1,)),
            d,
        )

    check()


@pytest.mark.parametrize("op", DENSE3, ids=str)
def test_pair_with_dense_per_sample_operand(op):
    """A dense ``(B, 1, 1, C)`` operand applies per sample (sample i sees ``d[i]``)."""

    @FEW
    @given(length_pairs(), st.integers(1, 3), seeds)
    def check(nm, c, seed):
        ns, ms = nm
        d = comps_for([(len(ns), 1, 1, c)], seed + 7)[0]
        f = DENSE3[op]
        per_sample_check(
            lambda x, y, w: f(_row(x), _col(y), w),
            R(comps_for([(n, c) for n in ns], seed), (1,)),
            R(comps_for([(m, c) for m in ms], seed + 1), (1,)),
            PS(d),
        )

    check()


def test_pair_plus_dense_after_creation():
    """Binary ops on an existing pair with a ``(C,)`` and a ``(B, 1, 1, C)`` operand."""

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        c = 3
        bias = comps_for([(c,)], seed + 3)[0]
        scale = comps_for([(len(ns), 1, 1, c)], seed + 4)[0]
        per_sample_check(
            lambda x, b, s: (_row(x) + _col(x)) * s + b,
            R(comps_for([(n, c) for n in ns], seed), (1,)),
            bias,
            PS(scale),
        )

    check()


# ----------------------------------------------------------------------------- masks
def _mask_comps(ns, seed):
    """Float 0/1 components (per_sample_check makes every ragged operand a grad leaf); the
    test turns them into a bool mask with ``> 0.5`` on both sides."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, generator=g, dtype=torch.float64) > 0.3).to(torch.float64) for n in ns]


MASK_USES = {
    "masked_fill": lambda p, pm: p.masked_fill(~pm.unsqueeze(-1), -1.5),
    "where_tensor": lambda p, pm: torch.where(pm.unsqueeze(-1), p, p * 0.25),
    "where_scalar": lambda p, pm: torch.where(pm.unsqueeze(-1), p, 0.0),
    "mul_mask": lambda p, pm: p * pm.unsqueeze(-1).to(p.dtype),
}


@pytest.mark.parametrize("use", MASK_USES, ids=str)
def test_pair_mask(use):
    """``m.unsqueeze(-1) & m.unsqueeze(-2)`` is a ``(B, j0, j0)`` mask usable on the pair."""

    @FEW
    @given(lengths(), seeds)
    def check(ns, seed):
        f = MASK_USES[use]

        def fn(x, m):
            m = m > 0.5
            pm = m.unsqueeze(-1) & m.unsqueeze(-2)
            return f(_row(x) + _col(x), pm)

        per_sample_check(fn, R(comps_for([(n, 2) for n in ns], seed), (1,)), R(_mask_comps(ns, seed), (1,)))

    check()


def test_pair_mask_golden():
    x = mj.nested_tensor([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0])], ragged_dims=(1,))
    m = mj.nested_tensor([torch.tensor([True, False, True]), torch.tensor([True])], ragged_dims=(1,))
    pm = m.unsqueeze(-1) & m.unsqueeze(-2)
    assert pm.shape == (2, m.shape[1], m.shape[1])
    out = (x.unsqueeze(-1) * x.unsqueeze(-2)).masked_fill(~pm, 0.0)
    expected = [
        [[1.0, 0.0, 3.0], [0.0, 0.0, 0.0], [3.0, 0.0, 9.0]],  # = [[1·1, -, 1·3], [-, -, -], [3·1, -, 3·3]]
        [[16.0]],  # = [[4·4]]
    ]
    for o, e in zip(out.unbind(), expected):
        torch.testing.assert_close(o, torch.tensor(e), rtol=0, atol=0)


# ----------------------------------------------------------------------------- golden
def test_square_pair_golden():
    x = mj.nested_tensor([torch.tensor([1.0, 2.0]), torch.zeros(0), torch.tensor([5.0])], ragged_dims=(1,))
    cases = {
        "add": (
            x.unsqueeze(-1) + x.unsqueeze(-2),
            [[[2.0, 3.0], [3.0, 4.0]], torch.zeros(0, 0), [[10.0]]],  # = [[1+1, 1+2], [2+1, 2+2]], [], [[5+5]]
        ),
        "sub": (
            x.unsqueeze(-1) - x.unsqueeze(-2),
            [[[0.0, -1.0], [1.0, 0.0]], torch.zeros(0, 0), [[0.0]]],  # = [[1-1, 1-2], [2-1, 2-2]], [], [[5-5]]
        ),
        "pow": (
            x.unsqueeze(-1) ** x.unsqueeze(-2),
            [[[1.0, 1.0], [2.0, 4.0]], torch.zeros(0, 0), [[3125.0]]],  # = [[1^1, 1^2], [2^1, 2^2]], [], [[5^5]]
        ),
    }
    for name, (out, expected) in cases.items():
        assert out.shape == (3, x.shape[1], x.shape[1])
        for o, e in zip(out.unbind(), expected):
            torch.testing.assert_close(o, torch.as_tensor(e), rtol=0, atol=0, msg=name)


def test_rectangular_pair_golden():
    x = mj.nested_tensor([torch.tensor([[1.0], [2.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    y = mj.nested_tensor([torch.tensor([[3.0], [4.0], [5.0]]), torch.tensor([[7.0]])], ragged_dims=(1,))
    out = x.unsqueeze(-2) * y.unsqueeze(-3)
    assert out.shape == (2, x.shape[1], y.shape[1], 1)
    expected = [
        [[[3.0], [4.0], [5.0]], [[6.0], [8.0], [10.0]]],  # = [[1·3, 1·4, 1·5], [2·3, 2·4, 2·5]]
        torch.zeros(0, 1, 1),  # (0, 1) pair: no cells
    ]
    for o, e in zip(out.unbind(), expected):
        torch.testing.assert_close(o, torch.as_tensor(e), rtol=0, atol=0)
    mx = torch.maximum(x.unsqueeze(-2) * 3, y.unsqueeze(-3))
    torch.testing.assert_close(
        mx.unbind()[0][..., 0],
        torch.tensor([[3.0, 4.0, 5.0], [6.0, 6.0, 6.0]]),  # = [[max(3,3), max(3,4), max(3,5)], [max(6,3), max(6,4), max(6,5)]]
        rtol=0,
        atol=0,
    )


def test_square_pair_grad_golden():
    """d/dx Σ_{a,b} x_a · x_b = 2 Σ_b x_b for every a."""
    leaves = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([4.0], requires_grad=True)]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    (x.unsqueeze(-1) * x.unsqueeze(-2)).sum().backward()
    torch.testing.assert_close(leaves[0].grad, torch.tensor([6.0, 6.0]))  # = 2·(1+2)
    torch.testing.assert_close(leaves[1].grad, torch.tensor([8.0]))  # = 2·4


# ----------------------------------------------------------------------------- gradcheck
def test_gradcheck_square_pair():
    comps = comps_for([(2, 2), (0, 2), (3, 2)], 0)
    v, off, sizes = packed_args(comps, (1,))

    def f(v):
        x = mj.from_packed(v, off, sizes, (1,))
        return (_row(x) * _col(x) + torch.maximum(_row(x), _col(x))).values()

    assert torch.autograd.gradcheck(f, (v.requires_grad_(),))


def test_gradcheck_rectangular_pair():
    xs = comps_for([(2, 2), (0, 2), (3, 2), (1, 2)], 1)
    ys = comps_for([(3, 2), (2, 2), (0, 2), (1, 2)], 2)
    vx, ox, sx = packed_args(xs, (1,))
    vy, oy, sy = packed_args(ys, (1,))

    def f(vx, vy):
        x = mj.from_packed(vx, ox, sx, (1,))
        y = mj.from_packed(vy, oy, sy, (1,))
        return (_row(x) / (_col(y).abs() + 1) - _col(y) ** 2).values()

    assert torch.autograd.gradcheck(f, (vx.requires_grad_(), vy.requires_grad_()))


def test_gradcheck_non_leading_pair_with_dense():
    xs = comps_for([(2, 2, 3), (2, 0, 3), (2, 3, 3)], 3)
    v, off, sizes = packed_args(xs, (2,))
    w = comps_for([(3,)], 4)[0].requires_grad_()

    def f(v, w):
        x = mj.from_packed(v, off, sizes, (2,))
        return torch.addcmul(_row(x), _col(x), w).values()

    assert torch.autograd.gradcheck(f, (v.requires_grad_(), w))


# ----------------------------------------------------------------------------- errors
def _nt(shapes, ragged_dims, seed=0):
    return mj.nested_tensor(comps_for(shapes, seed), ragged_dims=ragged_dims)


ERR_OPS = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum, "div": torch.div}


@pytest.mark.parametrize("op", ERR_OPS, ids=str)
def test_square_vs_rectangular_equal_cell_counts_raise(op):
    """Square (2,2,C),(3,3,C) and rectangular (1,4,C),(1,9,C) pack 4 and 9 rows per sample."""
    sq = _nt([(2, 2, 3), (3, 3, 3)], (1, 2))
    rect = _nt([(1, 4, 3), (1, 9, 3)], (1, 2), seed=1)
    assert sq.offsets().tolist() == rect.offsets().tolist()  # the trap: same packing
    with pytest.raises(ValueError, match=rf"^{op}\b.*\(\):.*different per-sample sizes"):
        ERR_OPS[op](sq, rect)
    with pytest.raises(ValueError, match=rf"^{op}\b"):
        ERR_OPS[op](rect, sq)


@pytest.mark.parametrize("op", ERR_OPS, ids=str)
def test_2x6_vs_3x4_raise(op):
    a = _nt([(2, 6, 3), (1, 1, 3)], (1, 2))
    b = _nt([(3, 4, 3), (1, 1, 3)], (1, 2), seed=1)
    assert a.values().shape == b.values().shape
    with pytest.raises(ValueError, match=rf"^{op}\b.*\(2, j\d+, j\d+, 3\) and \(2, j\d+, j\d+, 3\)"):
        ERR_OPS[op](a, b)


@pytest.mark.parametrize("op", ERR_OPS, ids=str)
def test_singles_of_different_lengths_raise(op):
    """Singles with different lengths (same total) never combine, nor do their rows, columns
    or pairs."""
    f = ERR_OPS[op]
    x = _nt([(2, 3), (3, 3)], (1,))
    y = _nt([(3, 3), (2, 3)], (1,), seed=1)
    cases = {
        "x ∘ y": lambda: f(x, y),
        "row(x) ∘ row(y)": lambda: f(_row(x), _row(y)),
        "col(x) ∘ col(y)": lambda: f(_col(x), _col(y)),
        "pair(x) ∘ col(y)": lambda: f(_row(x) + _col(x), _col(y)),
        "pair(x) ∘ row(y)": lambda: f(_row(x) + _col(x), _row(y)),
        "pair(x) ∘ pair(y)": lambda: f(_row(x) + _col(x), _row(y) + _col(y)),
        "rect ∘ rect.T": lambda: f(_row(x) * _col(y), (_row(x) * _col(y)).transpose(1, 2)),
    }
    for name, call in cases.items():
        with pytest.raises(ValueError, match=rf"^{op}\b"):
            call()
            pytest.fail(name)


def test_broadcast_errors_name_op_and_shapes():
    x = _nt([(2, 3), (3, 3)], (1,))
    y = _nt([(3, 3), (2, 3)], (1,), seed=1)
    with pytest.raises(ValueError) as info:
        torch.where(_row(x) > 0, _row(y), 1.0)
    msg = str(info.value)
    assert msg.startswith("where"), msg
    assert "(2, j" in msg and "1, 3)" in msg, msg


def test_batch_mismatch_and_dense_on_ragged_dim_raise():
    x = _nt([(2, 3), (3, 3)], (1,))
    z = _nt([(2, 3), (3, 3), (1, 3)], (1,))
    with pytest.raises(ValueError, match=r"^add\b.*batch"):
        _row(x) + _col(z)
    with pytest.raises(ValueError, match=r"^add\b.*ragged dim 1"):
        _row(x) + torch.ones(4, 1, 3)  # a dense size 4 along the ragged dim
    with pytest.raises(ValueError, match=r"^add\b.*batch dim"):
        _row(x) + torch.ones(3, 1, 1, 3)  # dense batch dim 3 ≠ B = 2
    # (4, 3) right-aligns with the static dims (1, 3): a legal static broadcast
    out = _row(x) + torch.ones(4, 3)
    assert [tuple(o.shape) for o in out.unbind()] == [(2, 4, 3), (3, 4, 3)]


def test_rect_plus_square_of_one_side_raises_unless_equal():
    """A rectangular pair and the square pair of its row operand combine only when n == m."""
    x = _nt([(2, 3), (0, 3)], (1,))
    y = _nt([(3, 3), (1, 3)], (1,), seed=1)
    rect = _row(x) * _col(y)
    with pytest.raises(ValueError, match=r"^add\b"):
        rect + (_row(x) + _col(x))
    y2 = _nt([(2, 3), (0, 3)], (1,), seed=2)  # same lengths as x: fine
    out = _row(x) * _col(y2) + (_row(x) + _col(x))
    for o, a, b in zip(out.unbind(), x.unbind(), y2.unbind()):
        assert_close(o, a.unsqueeze(1) * b.unsqueeze(0) + (a.unsqueeze(1) + a.unsqueeze(0)))


def test_broadcast_tensors_per_sample():
    """``torch.broadcast_tensors``: each operand broadcast to the common shape (a dense static
    operand, a dense per-sample one, a pair from two singles), gradients summed back."""

    @few(8)
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        x = R(comps_for([(n, 1, 2) for n in ns], seed), (1,))
        d = comps_for([(3, 2)], seed + 1)[0]
        per_sample_check(lambda a, b: torch.broadcast_tensors(a, b)[0], x, d, ref=lambda a, b: torch.broadcast_tensors(a, b)[0])
        per_sample_check(lambda a, b: torch.broadcast_tensors(a, b)[1], x, d, ref=lambda a, b: torch.broadcast_tensors(a, b)[1])
        y = R(comps_for([(n, 2) for n in ns], seed + 2), (1,))
        out = per_sample_check(lambda a, b: torch.broadcast_tensors(a.unsqueeze(2), b.unsqueeze(1))[1], y, y,
                               ref=lambda a, b: torch.broadcast_tensors(a.unsqueeze(1), b.unsqueeze(0))[1], share=True)
        assert out.ragged_dims == (1, 2)

    check()


def test_dense_expand_as_a_multi_jagged_tensor_per_sample():
    """``gate.expand_as(x)`` (ECA's ``(B, C, 1, 1)`` gate over images ``(B, C, j0, j1)``), a dense
    static operand expanded to sequences, and a multi_jagged ``expand_as`` of its own structure:
    each sample's slice broadcast to that sample's shape, gradients summed back; a shape that
    does not broadcast raises as dense."""

    @few(8)
    @given(lengths(max_batch=3), seeds)
    def check(ns, seed):
        img = R(comps_for([(3, n, n + 1) for n in ns], seed), (2, 3))
        gate = PS(comps_for([(len(ns), 3, 1, 1)], seed + 1)[0])
        per_sample_check(lambda g, x: g.expand_as(x), gate, img)
        seq = R(comps_for([(n, 4) for n in ns], seed + 2), (1,))
        per_sample_check(lambda d, x: d.expand_as(x), comps_for([(1, 4)], seed + 3)[0], seq)
        per_sample_check(lambda x: x.sum(1, keepdim=True).expand_as(x), seq, ref=lambda c: c.sum(0, keepdim=True).expand_as(c))
        # an image's mean over its height, expanded back over that height (the other ragged dim)
        per_sample_check(lambda x: x.mean(2, keepdim=True).expand_as(x), img, ref=lambda c: c.mean(1, keepdim=True).expand_as(c))
        per_sample_check(lambda x: x.amax(3, keepdim=True).expand(-1, -1, -1, x.shape[3]), img,
                         ref=lambda c: c.amax(2, keepdim=True).expand(-1, -1, c.shape[2]))

    check()
    x = mj.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    with pytest.raises(RuntimeError, match=r"expand_as\(\): the tensor of shape \(2, 3\) cannot be expanded"):
        torch.ones(2, 3).expand_as(x)
    with pytest.raises(RuntimeError, match="cannot be expanded"):
        torch.ones(2, 1, 1, 4).expand_as(x)  # more dims than x
    # to a ragged size of a batch of another sample count
    img = mj.nested_tensor([torch.ones(2, 3, 4), torch.ones(2, 1, 2)])
    other = mj.nested_tensor([torch.ones(2, 3, 4), torch.ones(2, 1, 2), torch.ones(2, 2, 2)])
    with pytest.raises(mj.StructureError, match="cannot expand dim 2"):
        img.sum(2, keepdim=True).expand(-1, -1, other.shape[2], -1)


@pytest.mark.parametrize("case", ["first row", "last row", "image column", "product"])
def test_ragged_dims_of_size_one_per_sample_broadcast(case):
    """``x - x[:, :1]``: a ragged dim whose every sample has size 1 (or 0 where the other has 0)
    broadcasts against the other's sizes, per sample as dense, with gradients; sizes that do not
    broadcast raise."""
    g = torch.Generator().manual_seed(0)
    if case == "image column":
        comps = [torch.randn(2, h, w, generator=g, dtype=torch.float64) for h, w in ((3, 4), (5, 2), (1, 3))]
        f = lambda t, batch: t[:, :, :1] + t if batch else t[:, :1] + t  # noqa: E731
    else:
        comps = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (3, 5, 1, 0)]
        sel = {"first row": slice(None, 1), "last row": slice(-1, None), "product": slice(0, 1)}[case]
        if case == "product":
            f = lambda t, batch: t * (t[:, sel] if batch else t[sel])  # noqa: E731
        else:
            f = lambda t, batch: t - (t[:, sel] if batch else t[sel])  # noqa: E731
    x = mj.nested_tensor(comps, requires_grad=True)
    y = f(x, True)
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [f(c, False) for c in leaves]
    for a, r in zip(y.unbind(), refs):
        torch.testing.assert_close(a, r)
    got, = torch.autograd.grad((y * y).sum(), x)
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves)
    for a, w in zip(got.unbind(), want):
        torch.testing.assert_close(a, w)
    if case == "first row":
        with pytest.raises(mj.StructureError, match="different per-sample sizes"):
            x[:, :2] + x
        e = x[:, :1].expand_as(x)  # the same broadcast, as expand_as
        for a, c in zip(e.unbind(), leaves):
            torch.testing.assert_close(a, c[:1].expand_as(c))


_MIXED_OPS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "sub with alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "pow": lambda a, b: a.abs() ** b,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, b, a),
    "atan2": torch.atan2,
    "maximum": torch.maximum,
    "in-place add": lambda a, b: (b * 1).add_(a) if _wider(b, a) else (a * 1).add_(b),
}


def _wider(b, a) -> bool:
    return all(x >= y for x, y in zip(b.shape, a.shape)) if not mj.is_nested(b) else bool(
        (b.sizes() >= a.sizes()).all())


@pytest.mark.parametrize("op", list(_MIXED_OPS))
@pytest.mark.parametrize("case", ["tokens", "tokens reversed", "image rows", "image both"])
def test_ragged_dims_of_size_one_in_some_samples_broadcast(op, case):
    """Two operands whose ragged sizes are equal in some samples and 1 in one of them in the
    others (``F.pad(x[:, :-1], (0, 0, 1, 0)) + x`` with an empty sample) combine per sample as
    dense: the size-1 operand's row 0 where it has size 1, its own rows elsewhere. The values
    read its row 0 everywhere before, and the gradients of the size-1 operand failed in
    autograd's shape check for the functions the values path does not take."""
    f = _MIXED_OPS[op]
    if case.startswith("tokens"):
        na, nb = (3, 1, 0, 2, 1), (3, 2, 0, 2, 1)
        if case == "tokens reversed":
            na, nb = nb, na
        a = R(components([(n, 2) for n in na], 1), (1,))
        b = R(components([(n, 2) for n in nb], 2), (1,))
    else:
        ha, wa = ((3, 1, 2), (4, 2, 0)) if case == "image rows" else ((1, 2, 2), (4, 1, 3))
        hb, wb = ((3, 2, 2), (4, 2, 0)) if case == "image rows" else ((3, 2, 2), (4, 3, 3))
        a = R(components([(2, h, w) for h, w in zip(ha, wa)], 1), (2, 3))
        b = R(components([(2, h, w) for h, w in zip(hb, wb)], 2), (2, 3))
    per_sample_check(f, a, b, new_ragged=True)
    per_sample_check(f, b, a, new_ragged=True)


def test_shifted_tokens_with_an_empty_sample():
    """The shift ``F.pad(x[:, :-1], (0, 0, 1, 0))`` gives an empty sample one row: adding it to
    ``x`` broadcasts that row over the empty sample's none, and leaves the others' rows alone
    (second-order gradients too); no sample reads another's rows."""
    F = torch.nn.functional
    shift = lambda t, batch: (F.pad(t[:, :-1], (0, 0, 1, 0)) if batch else F.pad(t[:-1], (0, 0, 1, 0))) + t  # noqa: E731
    comps = components([(n, 3) for n in (3, 0, 4, 1)], 0)
    per_sample_check(lambda x: shift(x, True), R(comps, (1,)), ref=lambda c: shift(c, False))
    x = mj.nested_tensor(comps, requires_grad=True)
    y = shift(x, True)
    g, = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    gg, = torch.autograd.grad((g * g).sum(), x)
    leaves = [c.clone().requires_grad_() for c in comps]
    ys = [shift(c, False) for c in leaves]
    gs = torch.autograd.grad(sum((t * t).sum() for t in ys), leaves, create_graph=True)
    ggs = torch.autograd.grad(sum((t * t).sum() for t in gs), leaves)
    for a, w in zip(gg.unbind(), ggs):
        assert_close(a, w)
    # no leakage: changing sample 2 leaves the others unchanged
    other = [c.clone() for c in comps]
    other[2] = other[2] + 5
    z = shift(mj.nested_tensor(other), True)
    for i in (0, 1, 3):
        assert_close(z.unbind()[i], y.unbind()[i].detach())


def test_size_one_in_some_samples_self_of_an_in_place_op_raises():
    a = mj.nested_tensor([torch.ones(3, 2), torch.ones(1, 2)])
    b = mj.nested_tensor([torch.ones(3, 2), torch.ones(2, 2)])
    with pytest.raises(mj.StructureError, match="cannot change the structure of self"):
        a.add_(b)


# ----------------------------------------------------------------------------- static sizes equal to a ragged dim
# ``torch.nested.nested_tensor`` of one sample, or of samples of one length, makes a dim static
# where the sizes agree: ``(1, j0, n, C)``. NOTE [ Static sizes equal to a ragged dim ].
_UNIFORM = {  # name: (static operand's component shapes and ragged dims, ragged operand's)
    "one pair": ([(6, 6, 2)], (1,), (1, 2)),
    "equal pairs": ([(4, 4, 2)] * 3, (1,), (1, 2)),
    "an empty pair": ([(0, 0, 2)], (1,), (1, 2)),
    "static before ragged": ([(5, n, 2) for n in (3, 0, 4)], (2,), (1, 2)),
    "static last": ([(n, 3, 3) for n in (3, 3)], (1,), (1, 3)),
}
_UNIFORM_OPS = {k: OPS[k] for k in ("add", "sub", "mul", "div", "where", "lt", "lerp")}


@pytest.mark.parametrize("op", list(_UNIFORM_OPS))
@pytest.mark.parametrize("case", list(_UNIFORM))
def test_static_size_equal_to_every_ragged_size_broadcasts_as_it(op, case):
    """Eagerly, a static dim whose size is every sample's size of the other operand's ragged dim
    combines with it as dense does per sample (either operand first), the result ragged there;
    gradients reach both operands in their own shapes."""
    f = _UNIFORM_OPS[op]
    shapes, sd, rd = _UNIFORM[case]
    s, r = R(components(shapes, 0), sd), R(components(shapes, 1), rd)
    # the static operand first: the result carries its nested ints (and makes its static dim ragged)
    assert per_sample_check(f, s, r, new_ragged=True).ragged_dims == rd
    assert per_sample_check(f, r, s).ragged_dims == rd


def test_static_size_equal_to_a_ragged_dim_keeps_one_nested_int_and_dtypes():
    """A square pair stays one nested int; double backward; the dtypes dense takes."""
    z = mj.as_nested_tensor([torch.randn(3, 3, 2, dtype=torch.float64)])  # (1, j0, 3, 2)
    x = torch.einsum("bikc,bjkc->bijc", z, z)  # (1, j0, j0, 2)
    assert (z * x).shape == x.shape and (z * x).shape[2] is z.shape[1]
    zp, xp = (packed_args(list(t.unbind()), rd) for t, rd in ((z, (1,)), (x, (1, 2))))

    def f(zv, xv):
        a, b = mj.from_packed(zv, *zp[1:], (1,)), mj.from_packed(xv, *xp[1:], (1, 2))
        return (a * b * a + b).values()

    assert torch.autograd.gradgradcheck(f, (zp[0].requires_grad_(), xp[0].requires_grad_()), fast_mode=True)
    for dtype in (torch.int64, torch.float16, torch.bool):
        a, b = x.to(dtype), z.to(dtype)
        out = a | b if dtype is torch.bool else a + b
        want = a.unbind()[0] | b.unbind()[0] if dtype is torch.bool else a.unbind()[0] + b.unbind()[0]
        assert out.dtype == dtype and out.ragged_dims == (1, 2)
        assert torch.equal(out.unbind()[0], want)


def test_static_size_equal_to_a_ragged_dim_in_place():
    """The written self keeps its shape: a ragged self reads the static operand as ragged; a static
    self reads the other's ragged dim as static (values and gradients as dense), as a dense operand
    where that was its only ragged dim (Boltz's triangle attention ``a += b``)."""
    zc = components([(4, 4, 2)] * 2, 0)
    z = mj.as_nested_tensor(zc)  # (2, j0, 4, 2)
    x = torch.einsum("bikc,bjkc->bijc", z, z)  # (2, j0, j0, 2)
    xc = list(x.unbind())
    for self_, other, sc, oc in ((x, z, xc, zc), (z, x, zc, xc)):
        leaf, w = other.clone().requires_grad_(), self_.clone().requires_grad_()
        y = w.clone()
        y.mul_(leaf)
        assert y.shape == self_.shape
        gw, gl = torch.autograd.grad((y * y).sum(), (w, leaf))
        ws = [c.clone().requires_grad_() for c in sc]
        ls = [c.clone().requires_grad_() for c in oc]
        ys = [a * b for a, b in zip(ws, ls)]
        want = torch.autograd.grad(sum((t * t).sum() for t in ys), ws + ls)
        for got, exp in zip([*gw.unbind(), *gl.unbind(), *y.unbind()], [*want, *ys]):
            assert_close(got, exp)
    bias, a = components([(1, 2, 3, 3)] * 2, 2), components([(3, 2, 3, 3)] * 2, 3)

    def add_(s, b):
        s = s * 1.0
        s += b
        return s

    # (B, j, 2, 3, 3) += (B, 1, 2, j, 3), every length 3
    per_sample_check(add_, R(a, (1,)), R(bias, (3,)), ref=lambda s, b: s + b)
    # the bias made from self: one partition at another dim
    x = mj.as_nested_tensor(a)
    b = x.transpose(1, 3)[:, :1] * 2.0
    y = x.clone()
    y += b
    assert y.shape == x.shape and torch.equal(y.unbind()[0], a[0] + b.unbind()[0])
    assert torch.equal((x + b).unbind()[1], a[1] + b.unbind()[1])


def test_static_size_not_every_ragged_size_raises():
    z = mj.as_nested_tensor([torch.randn(4, 4, 2), torch.randn(5, 4, 2)])  # (2, j0, 4, 2)
    x = mj.as_nested_tensor([torch.randn(4, 4, 2), torch.randn(5, 5, 2)], ragged_dims=(1, 2))
    with pytest.raises(mj.StructureError, match="dim 2 is ragged in one operand and static of size 4"):
        x * z


def test_static_size_equal_to_a_ragged_dim_raises_under_compile():
    """Under torch.compile the sizes are symbols: the operands do not combine, and the error says
    what eager does and what to write instead."""
    z = mj.as_nested_tensor([torch.randn(3, 3, 2)])
    x = torch.einsum("bikc,bjkc->bijc", z, z)
    f = torch.compile(lambda a, b: a * b, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="under torch.compile the sizes are symbols"):
        f(x, z)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_per_sample(indexing):
    """``torch.meshgrid`` of multi_jagged vectors ``(B, jᵢ)``: per sample, dense meshgrid of the
    samples' vectors (one ragged dim per operand, the first two swapped for ``"xy"``), the list
    form too, gradients of every operand; a dense operand is refused."""
    g = torch.Generator().manual_seed(0)
    vs = [[torch.randn(n, dtype=torch.float64, generator=g) for n in ns] for ns in ((3, 0, 2), (1, 2, 4), (2, 2, 1))]
    for k in (1, 2, 3):
        for i in range(k):
            def fn(*ts, i=i):
                return torch.meshgrid(*ts, indexing=indexing)[i]

            per_sample_check(fn, *(R(v, (1,)) for v in vs[:k]))
    a, b = (mj.nested_tensor(v) for v in vs[:2])
    listed = torch.meshgrid([a, b], indexing=indexing)
    for got, want in zip(listed, torch.meshgrid(a, b, indexing=indexing)):
        assert all(torch.equal(x, y) for x, y in zip(got.unbind(), want.unbind()))
    with pytest.raises(NotImplementedError, match=r"meshgrid\(\): expected multi_jagged operands of 1-D samples"):
        torch.meshgrid(a, torch.ones(3, dtype=torch.float64), indexing=indexing)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.meshgrid(a, b.float(), indexing=indexing)


@pytest.mark.parametrize("other_shape", [(1, 2), (2, 3), (3,), (2, 1, 2), ()])
def test_kron_with_a_dense_other_per_sample(other_shape):
    """``torch.kron(x, w)`` of a multi_jagged ``x`` and a dense ``w``: per sample, dense kron
    (a ragged dim times a static one is a new ragged size), gradients of both, the dtypes dense
    kron promotes to; a multi_jagged ``other`` is refused."""
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 4, dtype=torch.float64, generator=g) for n in (3, 0, 5)]
    w = torch.randn(other_shape, dtype=torch.float64, generator=g)
    per_sample_check(torch.kron, R(xs, (1,)), w, new_ragged=True)
    ints = mj.nested_tensor([t.round().int() for t in xs])
    out = torch.kron(ints, torch.ones(other_shape, dtype=torch.int64))
    assert out.dtype == torch.int64
    x = mj.nested_tensor(xs)
    with pytest.raises(NotImplementedError, match=r"kron\(\): .* not supported for layout torch.multi_jagged"):
        torch.kron(w, x)


def test_kron_of_several_ragged_dims_raises_clearly():
    p = mj.nested_tensor([torch.randn(2, 2), torch.randn(3, 3)], ragged_dims=(1, 2))
    with pytest.raises(NotImplementedError, match="several ragged dims"):
        torch.kron(p, torch.ones(2, 3))
