"""Pointwise ops (ops/elementwise/pointwise.py) against the per-sample reference, on all four layouts."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import LAYOUTS, PS, R, RECT, SQUARE, STATIC_LEAD, components, grid, per_sample_check, seeds, structures

layouts = pytest.mark.parametrize("layout", LAYOUTS, ids=str)

UNARY = {
    "sin": torch.sin,
    "exp": torch.exp,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "abs": torch.abs,
    "neg": lambda t: -t,
    "clamp": lambda t: torch.clamp(t, -0.5, 0.7),
    "clamp_min": lambda t: t.clamp(min=0.1),
    "sqrt_of_square": lambda t: (t * t + 1).sqrt(),
    "leaky_relu": lambda t: F.leaky_relu(t, 0.1),
    "softplus": F.softplus,
    "square": torch.square,
    "rsub_scalar": lambda t: 1.5 - t,
}


@pytest.mark.parametrize("op", UNARY, ids=str)
@layouts
def test_unary(layout, op):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        per_sample_check(UNARY[op], R(components(s.shapes, seed), s.ragged_dims))

    check()


BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5),
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "atan2": torch.atan2,
    "gt": torch.gt,
    "lt": torch.lt,
    "ge": torch.ge,
    "le": torch.le,
    "eq": lambda a, b: a == b.round(),
    "ne": lambda a, b: a != b.round(),
}


@pytest.mark.parametrize("op", BINARY, ids=str)
@layouts
def test_binary_same_structure(layout, op):
    """Two multi_jagged tensors built independently from equal sizes (different nested ints)."""

    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        a = components(s.shapes, seed)
        b = components(s.shapes, seed + 1)
        if op in ("eq", "ne"):
            a = [t.round() for t in a]  # make equality actually occur
        per_sample_check(BINARY[op], R(a, s.ragged_dims), R(b, s.ragged_dims))

    check()


@layouts
def test_binary_shared_nested_int(layout):
    """An operand derived from x (``rand_like``) has x's nested ints, and the result keeps them."""

    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = mj.nested_tensor(components(s.shapes, seed), ragged_dims=s.ragged_dims)
        y = torch.rand_like(x)
        assert y.shape == x.shape
        z = x * y + y
        assert z.shape == x.shape
        for zi, xi, yi in zip(z.unbind(), x.unbind(), y.unbind()):
            torch.testing.assert_close(zi, xi * yi + yi)

    check()


def _dense_operands(s, seed):
    """Dense operands that broadcast over the static dims of ``s``'s layout (size 1 at the
    ragged dims), keyed by a readable name."""
    g = torch.Generator().manual_seed(seed)
    c = s.c

    def r(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1

    ops = {"(C,)": r(c), "(1, C)": r(1, c), "0-dim": r(())}
    if s.layout is STATIC_LEAD:
        ops["(S, 1, C)"] = r(s.s, 1, c)
        ops["(S, 1, 1)"] = r(s.s, 1, 1)
    if s.layout in (SQUARE, RECT):
        ops["(1, 1, C)"] = r(1, 1, c)
    return ops


DENSE_BINARY = {
    "add": torch.add,
    "radd": lambda a, b: b + a,
    "sub": torch.sub,
    "rsub": lambda a, b: b - a,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "rdiv": lambda a, b: b / (a.abs() + 0.5),
    "maximum": torch.maximum,
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "gt": torch.gt,
}


@pytest.mark.parametrize("op", DENSE_BINARY, ids=str)
@layouts
def test_binary_with_dense_operand(layout, op):
    @grid
    @given(structures(layout), seeds, st.data())
    def check(s, seed, data):
        operands = _dense_operands(s, seed)
        name = data.draw(st.sampled_from(sorted(operands)), label="dense operand")
        per_sample_check(DENSE_BINARY[op], R(components(s.shapes, seed), s.ragged_dims), operands[name])

    check()


@pytest.mark.parametrize("scalar", [2, -0.5, 3.0], ids=str)
@layouts
def test_binary_with_python_scalar(layout, scalar):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        per_sample_check(lambda t: t * scalar + scalar, x)
        per_sample_check(lambda t: scalar - t / (1 + abs(scalar)), x)
        per_sample_check(lambda t: t ** 2 + 2 ** t, x)

    check()


@layouts
def test_per_sample_dense_operand(layout):
    """A dense ``(B, 1…, C)`` operand: sample i sees row i (size 1 at every non-batch dim but C)."""

    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        ndim = len(s.shapes[0]) + 1
        w = torch.randn(s.batch, *([1] * (ndim - 2)), s.c, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        per_sample_check(torch.mul, x, PS(w))
        per_sample_check(lambda a, b: b - a, x, PS(w))

    check()


def test_per_sample_dense_operand_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[5.0, 6.0]])])
    w = torch.tensor([[[10.0, 20.0]], [[30.0, 40.0]], [[50.0, 60.0]]])  # (B, 1, C)
    assert [c.tolist() for c in (x + w).unbind()] == [
        [[11.0, 22.0], [13.0, 24.0]],  # = [1+10, 2+20], [3+10, 4+20]
        [],  # = empty sample
        [[55.0, 66.0]],  # = [5+50, 6+60]
    ]


TERNARY = {
    "where": lambda a, b, c: torch.where(a > c, a, b),
    "where_scalar": lambda a, b, c: torch.where(b > 0, a, 0.25),
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c, value=0.5),
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c.abs() + 0.5, value=-2.0),
    "lerp_scalar": lambda a, b, c: torch.lerp(a, b, 0.3),
    "lerp_tensor": lambda a, b, c: torch.lerp(a, b, c),
    "clamp_tensor": lambda a, b, c: torch.clamp(a, min=torch.minimum(b, c), max=torch.maximum(b, c)),
    "clamp_tensor_positional": lambda a, b, c: torch.clamp(a, torch.minimum(b, c), torch.maximum(b, c)),
}

@pytest.mark.parametrize(
    "op, share",
    [(op, True) for op in TERNARY]
    + [(op, False) for op in TERNARY],
    ids=lambda v: v if isinstance(v, str) else ("shared_nested_ints" if v else "equal_sizes"),
)
@layouts
def test_ternary(layout, op, share):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        args = [R(components(s.shapes, seed + k), s.ragged_dims) for k in range(3)]
        per_sample_check(TERNARY[op], *args, share=share)

    check()


@layouts
def test_ternary_mixed_dense(layout):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        x = R(components(s.shapes, seed), s.ragged_dims)
        y = R(components(s.shapes, seed + 1), s.ragged_dims)
        w = torch.rand(s.c, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        per_sample_check(lambda a, b, t: torch.lerp(a, b, t), x, y, w)
        per_sample_check(lambda a, b, t: torch.addcmul(a, b, t), x, y, w)
        per_sample_check(lambda a, t: torch.where(a > t, a, t), x, w)

    check()


INPLACE = {
    "add_": lambda a, b: (a * 1).add_(b),
    "mul_": lambda a, b: (a * 1).mul_(b),
    "sub_": lambda a, b: (a * 1).sub_(b, alpha=2.0),
    "div_": lambda a, b: (a * 1).div_(b.abs() + 0.5),
    "clamp_": lambda a, b: (a * 1).clamp_(-0.5, 0.5) + b,
    "relu_": lambda a, b: F.relu(a * b, inplace=True),
    "addcmul_": lambda a, b: (a * 1).addcmul_(b, b, value=0.5),
}


@pytest.mark.parametrize("op", INPLACE, ids=str)
@layouts
def test_inplace(layout, op):
    @grid
    @given(structures(layout), seeds, st.booleans())
    def check(s, seed, dense):
        x = R(components(s.shapes, seed), s.ragged_dims)
        other = (torch.rand(s.c, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) if dense
                 else R(components(s.shapes, seed + 1), s.ragged_dims))
        if op == "addcmul_" and dense:
            return  # addcmul_(t, t) with a dense (C,) is the same broadcast as mul_
        per_sample_check(INPLACE[op], x, other)

    check()


def test_inplace_returns_self_and_mutates_values():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 4.0], [5.0, 6.0]])])
    y = torch.ones_like(x)
    ptr = x.values().data_ptr()
    assert x.add_(y) is x
    assert x.mul_(torch.tensor([2.0, 10.0])) is x
    assert x.clamp_(max=50.0) is x
    assert x.values().data_ptr() == ptr
    assert [c.tolist() for c in x.unbind()] == [
        [[4.0, 30.0]],  # = [(1+1)·2, (2+1)·10]
        [],
        [[8.0, 50.0], [12.0, 50.0]],  # = [(3+1)·2, min((4+1)·10, 50)], [(5+1)·2, min((6+1)·10, 50)]
    ]


def test_binary_golden():
    a = mj.nested_tensor([torch.tensor([[1.0, 2.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 4.0], [5.0, 6.0]])])
    b = mj.nested_tensor([torch.tensor([[3.0, 4.0]]), torch.zeros(0, 2), torch.tensor([[1.0, 1.0], [2.0, 2.0]])])
    assert [c.tolist() for c in (a + b).unbind()] == [
        [[4.0, 6.0]],  # = [1+3, 2+4]
        [],
        [[4.0, 5.0], [7.0, 8.0]],  # = [3+1, 4+1], [5+2, 6+2]
    ]
    assert [c.tolist() for c in (a * b - 1).unbind()] == [
        [[2.0, 7.0]],  # = [1·3-1, 2·4-1]
        [],
        [[2.0, 3.0], [9.0, 11.0]],  # = [3·1-1, 4·1-1], [5·2-1, 6·2-1]
    ]
    assert [c.tolist() for c in (a > b).unbind()] == [[[False, False]], [], [[True, True], [True, True]]]


def test_square_pair_golden():
    # sample 0: a 2×2 pair with C = 1; sample 1: empty
    p = mj.nested_tensor([torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]]), torch.zeros(0, 0, 1)])
    q = torch.where(p > 2.0, p * 10, -p)
    assert [c[..., 0].tolist() for c in q.unbind()] == [[[-1.0, -2.0], [30.0, 40.0]], []]  # = [-1, -2], [3·10, 4·10]
    assert q.shape[1] == q.shape[2] == p.shape[1]


def test_output_dtype_promotion():
    x = mj.nested_tensor([torch.ones(2, 3, dtype=torch.float32), torch.ones(0, 3, dtype=torch.float32)])
    assert (x + torch.ones(3, dtype=torch.float64)).dtype == torch.float64
    assert (x > 0).dtype == torch.bool
    i = mj.nested_tensor([torch.ones(2, 3, dtype=torch.int64), torch.ones(0, 3, dtype=torch.int64)])
    assert (i + 0.5).dtype == torch.float32
    assert (i * 2).dtype == torch.int64
    assert [c.tolist() for c in (i * 2).unbind()] == [[[2, 2, 2]] * 2, []]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["gelu", "sigmoid", "mul", "where"])
def test_lower_precision(op, dtype):
    """Same dtype in, same dtype out, equal to the per-sample op in that dtype."""
    shapes = [(3, 2, 4), (0, 5, 4), (2, 2, 4)]
    a, b = components(shapes, 0, dtype=dtype), components(shapes, 1, dtype=dtype)
    fn = {
        "gelu": lambda x, y: F.gelu(x),
        "sigmoid": lambda x, y: torch.sigmoid(x) + y,
        "mul": lambda x, y: x * y * 0.5,
        "where": lambda x, y: torch.where(x > y, x, y),
    }[op]
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    out = per_sample_check(fn, R(a, (1, 2)), R(b, (1, 2)), rtol=tol, atol=tol)
    assert out.dtype == dtype


def test_results_not_castable_into_self_or_out_raise_as_dense():
    # dense's rule for in-place ops and out=: no float result into an integer or bool tensor
    x = mj.nested_tensor([torch.tensor([[3, -2], [5, 1]], dtype=torch.int32), torch.zeros(0, 2, dtype=torch.int32)])
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Int"):
        x.copysign_(-1.5)
    assert x.unbind()[0].tolist() == [[3, -2], [5, 1]]
    b = mj.nested_tensor([torch.tensor([True, False])])
    with pytest.raises(RuntimeError, match="desired output type Bool"):
        b.copysign_(torch.tensor(-1.0))
    a = mj.nested_tensor([torch.tensor([[0.4, -1.7]]), torch.zeros(0, 2)])
    for dtype in (torch.int32, torch.bool):
        out = mj.nested_tensor([torch.zeros(1, 2, dtype=dtype), torch.zeros(0, 2, dtype=dtype)])
        for op in (torch.maximum, torch.minimum, torch.fmax, torch.fmin):
            with pytest.raises(RuntimeError, match="can't be cast"):
                op(a, torch.zeros_like(a), out=out)
    out = mj.nested_tensor([torch.zeros(1, 2, dtype=torch.float64), torch.zeros(0, 2, dtype=torch.float64)])
    torch.maximum(a, torch.zeros_like(a), out=out)  # a wider out takes it, as dense
    assert out.unbind()[0].tolist() == [[pytest.approx(0.4), 0.0]]


def test_in_place_forms_with_gradients_and_values():
    # sgn_ / nextafter_ ran aten's in-place derivatives, whose zeros need concrete sizes; rrelu
    # (inplace=True) and renorm_ had no form
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(n, 4, dtype=torch.float64, generator=g) for n in (3, 0, 5)]
    b = [torch.randn(n, 4, dtype=torch.float64, generator=g) for n in (3, 0, 5)]
    writes = [(lambda y, o: y.sgn_(), lambda y, o: y.sgn_()),
              (lambda y, o: y.nextafter_(o), lambda y, o: y.nextafter_(o)),
              (lambda y, o: y.renorm_(2, 2, 1.0), lambda y, o: y.renorm_(2, 1, 1.0))]  # (batched, per sample)
    for write, dense in writes:
        ref_out, ref_grads = [], []
        for ai, bi in zip(a, b):
            ai, bi = ai.clone().requires_grad_(), bi.clone().requires_grad_()
            y = ai * 1
            dense(y, bi)
            ref_out.append(y.detach())
            ref_grads.append(torch.autograd.grad((y * y).sum(), [ai, bi], allow_unused=True, materialize_grads=True))
        x = mj.nested_tensor(a).requires_grad_()
        o = mj.nested_tensor(b).requires_grad_()
        y = x * 1
        write(y, o)
        gx, go = torch.autograd.grad((y * y).sum(dim=(1, 2)).sum(), [x, o], allow_unused=True, materialize_grads=True)
        for k, (out, r) in enumerate(zip(y.unbind(), ref_out)):
            torch.testing.assert_close(out, r)
            torch.testing.assert_close(gx.unbind()[k], ref_grads[k][0])
            torch.testing.assert_close(go.unbind()[k], ref_grads[k][1])
    for module in (lambda t: F.rrelu(t, training=False, inplace=True), torch.nn.RReLU(inplace=True).eval()):
        x = mj.nested_tensor(a)
        assert module(x) is x
        for got, ai in zip(x.unbind(), a):
            torch.testing.assert_close(got, F.rrelu(ai, training=False))
