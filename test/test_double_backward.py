"""Second-order autograd (``create_graph=True``): right, or a clear error — never a wrong number.

``gradgradcheck`` in float64 on packed values (``mj.from_packed`` in, ``.values()`` out, both
through the differentiable values bridge) for every family of ops with a backward; each input
structure holds a zero-length sample. Golden cases write the arithmetic out. Where second order
is refused by design, the test checks that it raises a clear error.

NOTE on the structures: a reduction over an *empty* extent has no finite derivative in dense
torch either (mean → nan, amax → the lowest float, logsumexp → -inf), so cases for those kinds
reduce dims whose segments are all non-empty while the batch still holds a zero-length sample
(a ``(0, m)`` sample has no rows at all once its ``j1`` is reduced).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from _structures import comps_for, packed_args

D = torch.float64
FAST = True  # gradgradcheck by random projections: the full Jacobians took minutes

SEQ = comps_for([(2, 3), (0, 3), (3, 3)], 0)  # (B, j0, C)
SEQ_FULL = comps_for([(2, 3), (4, 3), (3, 3)], 1)  # no extent < 2: dense-result reductions, var
SQ = comps_for([(2, 2, 2), (0, 0, 2), (3, 3, 2)], 2)  # (B, j0, j0, C)
RECT = comps_for([(2, 3, 2), (0, 2, 2), (1, 1, 2), (3, 2, 2)], 3)  # (B, j0, j1, C)
LEAD = comps_for([(2, 2, 3), (2, 0, 3), (2, 3, 3)], 4)  # (B, S, j0, C)
SEQ2 = comps_for([(2, 2, 3), (0, 2, 3), (3, 2, 3)], 5)  # (B, j0, S, C)
STRUCTS = {
    "seq": (SEQ, (1,)),
    "seq_full": (SEQ_FULL, (1,)),
    "sq": (SQ, (1, 2)),
    "rect": (RECT, (1, 2)),
    "lead": (LEAD, (2,)),
    "seq2": (SEQ2, (1,)),
}


def _out(t):
    return t.values() if isinstance(t, mj.MultiJaggedTensor) else t


def gradgrad(fn, struct: str, *extra: torch.Tensor, n_mjt: int = 1, shift: float = 0.0) -> bool:
    """gradgradcheck of ``fn(*mjts, *extra)`` w.r.t. the packed values of ``n_mjt`` tensors of
    one structure (independent values) and the dense ``extra`` tensors. Warnings are errors: a
    ``multijagged::`` op without an autograd kernel only warns and returns no gradient."""
    comps, rd = STRUCTS[struct]
    vs = []
    for i in range(n_mjt):
        c = comps if i == 0 else comps_for([tuple(t.shape) for t in comps], 100 + i)
        v, off, sizes = packed_args(c, rd)
        vs.append((v + shift).requires_grad_())

    def f(*args):
        xs = [mj.from_packed(v, off, sizes, rd) for v in args[:n_mjt]]
        return _out(fn(*xs, *args[n_mjt:]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return torch.autograd.gradgradcheck(f, (*vs, *extra), fast_mode=FAST)


def _p(*shape, seed=7):
    return comps_for([shape], seed)[0].requires_grad_()


# ----------------------------------------------------------------------------- golden
def test_double_backward_golden_sum_over_ragged_dim():
    """x = one sample [[1], [2]] (ragged dim 1), s = Σ x = 3, loss = s²: g_i = 2s = 6 for both
    elements; Σ g² = 2·(2s)² = 8s², d/dx_i = 16s = 48 for both."""
    leaf = torch.tensor([[1.0], [2.0]], dtype=D, requires_grad=True)
    x = mj.as_nested_tensor([leaf], ragged_dims=(1,))
    (g,) = torch.autograd.grad((x.sum(dim=1) ** 2).sum(), leaf, create_graph=True)
    torch.testing.assert_close(g, torch.tensor([[6.0], [6.0]], dtype=D))
    (gg,) = torch.autograd.grad((g**2).sum(), leaf)
    torch.testing.assert_close(gg, torch.tensor([[48.0], [48.0]], dtype=D))  # = 16 · (1 + 2)


@pytest.mark.parametrize("kind", ["mean", "amax", "max"])
def test_double_backward_golden_other_reductions(kind):
    """Samples [[1], [3]] and [[2]]: mean m = [2, 2]; loss = Σ m²; g = 2m/n → [2, 2 | 4];
    Σ g² = Σ_i n_i (2m_i/n_i)² = 2 m_0² + 4 m_1², d/dx = 4 m_0 · ½ = 4 for sample 0 and
    8 m_1 = 16 for sample 1. amax/max: m = [3, 2], g = [0, 6 | 4], Σ g² = 4·3² + 4·2²,
    d/dx = [0, 24 | 16] (the max element only)."""
    leaves = [torch.tensor([[1.0], [3.0]], dtype=D, requires_grad=True), torch.tensor([[2.0]], dtype=D, requires_grad=True)]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    m = {"mean": lambda: x.mean(1), "amax": lambda: x.amax(1), "max": lambda: x.max(1).values}[kind]()
    g = torch.autograd.grad((m**2).sum(), leaves, create_graph=True)
    gg = torch.autograd.grad(sum((t**2).sum() for t in g), leaves)
    want = ([[4.0], [4.0]], [[16.0]]) if kind == "mean" else ([[0.0], [24.0]], [[16.0]])
    for a, w in zip(gg, want):
        torch.testing.assert_close(a, torch.tensor(w, dtype=D))


def test_linear_grad_has_graph_under_create_graph():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3), (1, 3)], 5), ragged_dims=(1,), requires_grad=True)
    w = _p(4, 3)
    (gx, gw) = torch.autograd.grad((F.linear(x, w) ** 2).sum(), (x, w), create_graph=True)
    assert gx.requires_grad and gw.requires_grad


def test_no_missing_autograd_kernel_warning():
    """torch's fallback for an op without an autograd kernel warns and returns no gradient."""
    leaf = torch.tensor([[1.0], [2.0]], dtype=D, requires_grad=True)
    x = mj.as_nested_tensor([leaf, leaf[:0]], ragged_dims=(1,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for y in (x.sum(1), x.mean(1), x.amax(1), x.logsumexp(1), F.linear(x, torch.ones(2, 1, dtype=D))):
            (g,) = torch.autograd.grad((y**2).sum(), leaf, create_graph=True)
            torch.autograd.grad(g.sum(), leaf)


@pytest.mark.parametrize("name", [n for n in dir(torch.ops.multijagged) if not n.startswith("_") and n != "name"])
def test_every_multijagged_op_has_autograd(name):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"multijagged::{name}", "Autograd"), name


# ----------------------------------------------------------------------------- pointwise
UNARY = {
    "abs": torch.abs,
    "pow_abs": lambda x: x.abs().pow(1.5),
    "sgn": lambda x: torch.sgn(x) * x,
    "neg": torch.neg,
    "exp": torch.exp,
    "log": lambda x: (x * x + 1).log(),
    "sqrt": lambda x: (x * x + 1).sqrt(),
    "rsqrt": lambda x: (x * x + 1).rsqrt(),
    "reciprocal": lambda x: (x * x + 1).reciprocal(),
    "pow3": lambda x: x**3,
    "rpow": lambda x: 2.0**x,
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "softplus": F.softplus,
    "elu": F.elu,
    "leaky_relu": F.leaky_relu,
    "mish": F.mish,
    "softsign": F.softsign,
    "hardtanh": F.hardtanh,
    "clamp": lambda x: x.clamp(-0.5, 0.5) * x,
    "erf": torch.erf,
    "i0e": torch.special.i0e,  # aten's derivatives record sgn (signs.py)
    "i1e": torch.special.i1e,
}


@pytest.mark.parametrize("name", UNARY)
def test_gradgrad_unary(name):
    assert gradgrad(UNARY[name], "seq")


@pytest.mark.parametrize("fn", [torch.special.i0e, torch.special.i1e], ids=lambda f: f.__name__)
def test_second_derivative_of_bessel_functions_at_zero_is_dense_s(fn):
    """At x = 0 (aten's special case for i1e's slope, 1 / x in the branch it drops), the first and
    second derivatives are dense torch's: finite, not 0 · inf = NaN."""
    comps = [torch.tensor([[0.0, 0.5], [0.0, -1.0]], dtype=D), torch.zeros(1, 2, dtype=D)]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves)
    g = torch.autograd.grad(fn(x).values().sum(), leaves, create_graph=True)
    gg = torch.autograd.grad(sum(t.sum() for t in g), leaves)
    dense = [c.clone().requires_grad_() for c in comps]
    dg = torch.autograd.grad(sum(fn(c).sum() for c in dense), dense, create_graph=True)
    dgg = torch.autograd.grad(sum(t.sum() for t in dg), dense)
    for a, b in zip((*g, *gg), (*dg, *dgg)):
        torch.testing.assert_close(a, b)


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b * b + 1),
    "pow": lambda a, b: torch.pow(a * a + 0.5, b),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "atan2": torch.atan2,
    "where": lambda a, b: torch.where(a > 0, a * b, b),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "hypot": lambda a, b: torch.hypot(a, b + 3),
}


@pytest.mark.parametrize("name", BINARY)
def test_gradgrad_binary(name):
    assert gradgrad(BINARY[name], "sq", n_mjt=2)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("square_pair", lambda x: x.unsqueeze(-2) * x.unsqueeze(-3)),
        ("square_pair_sum", lambda x: (x.unsqueeze(-2) + x.unsqueeze(-3)).tanh()),
        ("pair_mean", lambda h: (h.unsqueeze(-2) + h.unsqueeze(-3)).mean(-2) ** 2),
        ("pair_sum_row", lambda h: (h.unsqueeze(-2) * h.unsqueeze(-3)).sum(1) ** 2),
    ],
)
def test_gradgrad_broadcast_into_pair(name, fn):
    assert gradgrad(fn, "seq")


def test_gradgrad_rectangular_pair():
    assert gradgrad(lambda x, y: (x.unsqueeze(-2) * y.unsqueeze(-3)).sin(), "seq", n_mjt=2)


def test_gradgrad_dense_constant_operand():
    w = comps_for([(3,)], 6)[0]
    assert gradgrad(lambda x: (x * w).tanh() + x * x * w, "lead")


@pytest.mark.parametrize("fn", ["x * w", "x - x.mean(1, keepdim=True)", "x.unsqueeze(-2) * w"])
def test_gradgrad_dense_operand_requiring_grad(fn):
    """A dense operand requiring grad broadcast over ragged dims, differentiated twice: the eager
    values path (NOTE [ Eager values path ]) records the broadcast as dense ops on the values."""
    f = {
        "x * w": lambda x, w: (x * w).tanh(),
        "x - x.mean(1, keepdim=True)": lambda x, w: (x - x.mean(1, keepdim=True)) * w,
        "x.unsqueeze(-2) * w": lambda x, w: (x.unsqueeze(-2) * w).sin(),
    }[fn]
    shape = (3, 3) if fn == "x.unsqueeze(-2) * w" else (3,)
    assert gradgrad(f, "lead", _p(*shape))


# (structure, fn, the dense operand's shape or None): a dense operand with the batch dim, or
# size 1 at the ragged dims — statistics over the ragged dims (keepdim) broadcast back, the
# normalisation / variance patterns — that requires grad
_BATCH_SPANNING = {
    "x - x.mean(1, keepdim=True)": ("seq", lambda x: (x - x.mean(1, keepdim=True)) ** 3, None),
    "x / x.sum(1, keepdim=True)": ("seq", lambda x: (x / x.sum(1, keepdim=True)).tanh(), None),
    "x * x.amax(2, keepdim=True)": ("lead", lambda x: (x * x.amax(2, keepdim=True)).sin(), None),
    "x * w, w (B, 1, C)": ("seq", lambda x, w: (x * w).tanh(), (3, 1, 3)),
    "w - x, w (B, 1, C)": ("seq", lambda x, w: (w - x) ** 3, (3, 1, 3)),
    "x / w, w (B, 1, 1)": ("seq", lambda x, w: (x / (w * w + 1)).sin(), (3, 1, 1)),
    "x + w, w (1, 1, 1, C)": ("rect", lambda x, w: ((x + w) ** 2).tanh(), (1, 1, 1, 2)),
    "x ** w, w (B, 1, C)": ("seq", lambda x, w: (x * x + 0.5) ** w, (3, 1, 3)),
    "torch.pow(x, m)": ("seq", lambda x: torch.pow(x * x + 0.5, x.mean(1, keepdim=True)), None),
    "atan2(x, w), w (B, 1, C)": ("seq", lambda x, w: torch.atan2(x, w), (3, 1, 3)),
}


@pytest.mark.parametrize("case", list(_BATCH_SPANNING))
def test_gradgrad_dense_operand_spanning_the_batch(case):
    """A dense operand with a batch dim (or size-1 dims at the ragged dims) broadcast over the
    ragged dims, requiring grad, differentiated twice: the eager values path broadcasts it as
    rows (``pointwise.dense_operand_rows``), so that its gradient is differentiable again."""
    struct, fn, shape = _BATCH_SPANNING[case]
    assert gradgrad(fn, struct) if shape is None else gradgrad(fn, struct, _p(*shape))


@pytest.mark.parametrize("op", ["sub", "rsub", "div", "rdiv", "mul", "maximum"])
def test_dense_operand_spanning_the_batch_matches_each_sample(op):
    """The rows path of a dense ``(B, 1, C)`` operand requiring grad, on either side: values and
    gradients of both operands as dense on each sample with its own row of the operand."""
    f = {"sub": lambda a, b: a - b, "rsub": lambda a, b: b - a, "div": lambda a, b: a / b,
         "rdiv": lambda a, b: b / a, "mul": lambda a, b: a * b, "maximum": torch.maximum}[op]
    comps = [c.detach().abs() + 0.5 for c in STRUCTS["seq"][0]]
    x = mj.nested_tensor(comps).requires_grad_()
    w = (comps_for([(3, 1, 3)], 9)[0].abs() + 0.5).requires_grad_()
    out = f(x, w)
    cot = [torch.randn(c.shape, dtype=D) for c in comps]
    gx, gw = torch.autograd.grad(out, (x, w), mj.nested_tensor(cot))
    leaves = [c.clone().requires_grad_() for c in comps]
    refs = [f(c, w[i]) for i, c in enumerate(leaves)]
    want = torch.autograd.grad(refs, [*leaves, w], cot)
    for i, (o, r) in enumerate(zip(out.unbind(), refs)):
        torch.testing.assert_close(o, r, msg=lambda m: f"sample {i}: {m}")
        torch.testing.assert_close(gx.unbind()[i], want[i], msg=lambda m: f"grad of sample {i}: {m}")
    torch.testing.assert_close(gw, want[-1])


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    "known limitation off the eager values path: a dense operand *requiring grad* broadcast over "
    "ragged dims gets its first-order gradient from the autograd engine's sum_to (a sum over the "
    "ragged dims); that sum's own derivative expands a dense tensor to nested-int sizes, which "
    "aten refuses"))
def test_gradgrad_dense_operand_requiring_grad_known_limitation():
    assert gradgrad(lambda x, w: torch.hypot(x, w), "lead", _p(3))


def test_dense_operand_double_backward_raises_a_clear_error():
    """The known limitation above says what it is when the user's autograd call holds a
    multi_jagged tensor, instead of aten's bare "concrete integers" error; first order works."""
    x = mj.nested_tensor(comps_for([(3, 4), (0, 4), (2, 4)], 7)).requires_grad_()
    w = torch.randn(4, dtype=x.dtype, requires_grad=True)
    gx, gw = torch.autograd.grad(torch.hypot(x, w).values().pow(2).sum(), (x, w), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward .* dense operand"):
        torch.autograd.grad(gw.sum() + gx.values().sum(), (x, w))


@pytest.mark.parametrize("struct", ["seq", "lead", "sq"])
def test_gradgrad_glu_along_a_static_dim(struct):
    """aten's ``glu_backward`` derivative asks for concrete sizes: under autograd ``glu`` along a
    static dim is composed (``ops/indexing/slicing.py``)."""
    assert gradgrad(lambda x: F.glu(torch.cat([x, x.sin()], -1), -1), struct)


SIGN_GG = {
    "abs_flip_static": lambda x: (x - x.flip(-1)).abs(),
    "abs_flip_dim1": lambda x: (x + x.flip(1 if isinstance(x, mj.MultiJaggedTensor) else 0)).abs(),
    "abs_roll": lambda x: (x - x.roll(1, -1)).abs(),
    "abs_index": lambda x: (x - x[..., [2, 1, 0]]).abs(),
    "l1_loss": lambda x: F.l1_loss(x, x.flip(-1) * 0.5, reduction="none"),
}


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("struct", ["seq", "lead"])
@pytest.mark.parametrize("name", SIGN_GG)
def test_second_order_through_zero_derivatives_matches_dense(name, struct, scaled):
    """``sgn``'s derivative is aten's zero tensor (no storage); under a double backward it reaches
    the packed values of a gradient (NOTE [ Zero tensors never become values ]): second-order
    gradients as dense per sample (the process crashed on a null read)."""
    fn = (lambda t: SIGN_GG[name](t) * t) if scaled else SIGN_GG[name]
    comps = [c.clone().requires_grad_() for c in STRUCTS[struct][0]]
    want = []
    for c in comps:
        (g,) = torch.autograd.grad(fn(c).sum(), c, create_graph=True)
        (gg,) = torch.autograd.grad((g * g).sum(), c)
        want.append(gg)
    x = mj.as_nested_tensor(comps)
    gs = torch.autograd.grad(fn(x).sum(), comps, create_graph=True)
    got = torch.autograd.grad(sum((g * g).sum() for g in gs), comps, allow_unused=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(torch.zeros_like(b) if a is None else a, b)


def test_zero_tensor_values_are_materialised():
    x = mj.nested_tensor(comps_for([(2, 3), (0, 3)], 9))
    z = mj.MultiJaggedTensor(torch._efficientzerotensor(x.values().shape, dtype=D), x._partition, x._ragged_dims)
    assert not z.values()._is_zerotensor()
    torch.testing.assert_close((z + x).values(), x.values())


# ----------------------------------------------------------------------------- nn
def test_gradgrad_linear_bridge():
    assert gradgrad(lambda x, w, b: F.linear(x, w, b) ** 2, "seq", _p(4, 3), _p(4))


@pytest.mark.parametrize("params", ["weight_bias", "weight", "bias"])
def test_gradgrad_linear_custom_op(params):
    """``multijagged::linear`` (the path under torch.compile) and ``linear_param_grads``."""
    lin = torch.ops.multijagged.linear
    if params == "weight_bias":
        assert gradgrad(lambda x, w, b: lin(x, w, b) ** 2, "seq", _p(4, 3), _p(4))
    elif params == "weight":
        assert gradgrad(lambda x, w: lin(x, w, None) ** 2, "lead", _p(2, 3))
    else:
        w = comps_for([(4, 3)], 8)[0]
        assert gradgrad(lambda x, b: lin(x, w, b) ** 2, "seq", _p(4))


def test_gradgrad_linear_param_grads_bias_only():
    """The weight input is constant: linear_param_grads(grad, x, weight=False, bias=True)."""
    x = mj.nested_tensor(SEQ, ragged_dims=(1,), requires_grad=True)
    w = comps_for([(4, 3)], 9)[0]
    b = _p(4)
    y = torch.ops.multijagged.linear(x, w, b)
    (gb,) = torch.autograd.grad((y**2).sum(), b, create_graph=True)
    # gb = Σ_rows 2y, d/db of Σ gb² = 2·gb·(2·rows); rows = 5
    (ggb,) = torch.autograd.grad((gb**2).sum(), b)
    torch.testing.assert_close(ggb, 2 * gb.detach() * 2 * 5)


@pytest.mark.parametrize("struct", ["seq", "lead"])
def test_gradgrad_layer_norm(struct):
    c = 3
    assert gradgrad(lambda x, w, b: F.layer_norm(x, (c,), w, b) ** 2, struct, _p(c), _p(c, seed=8))


def test_gradgrad_layer_norm_two_static_dims():
    assert gradgrad(lambda x: F.layer_norm(x, (2, 3)) ** 2, "seq2")


def test_gradgrad_rms_norm():
    assert gradgrad(lambda x, w: F.rms_norm(x, (3,), w) ** 2, "seq", _p(3))


@pytest.mark.parametrize(
    "name,struct,fn",
    [
        ("softmax_static", "seq", lambda x: x.softmax(-1)),
        ("log_softmax_static", "lead", lambda x: x.log_softmax(1)),
        ("softmax_ragged", "seq", lambda x: x.softmax(1)),
        ("softmax_row", "sq", lambda x: x.softmax(-2)),
        ("softmax_col", "rect", lambda x: x.softmax(1)),
        ("log_softmax_ragged", "rect", lambda x: x.log_softmax(2)),
    ],
)
def test_gradgrad_softmax(name, struct, fn):
    assert gradgrad(lambda x: fn(x) ** 2, struct)


def test_gradgrad_attention():
    """softmax(q kᵀ) v on (B, j0, C), all three from one input (matmul between multi_jagged
    tensors, a ragged softmax and the pair back to singles)."""
    assert gradgrad(lambda x: torch.softmax(x @ x.transpose(1, 2), -1) @ x, "seq")


def test_gradgrad_matmul_two_inputs():
    assert gradgrad(lambda a, b: (a @ b.transpose(1, 2)).tanh() @ b, "seq", n_mjt=2)


# ----------------------------------------------------------------------------- reductions
REDUCTIONS = {
    # ragged dim → multi_jagged result (segments non-empty: reducing j1 of a rect pair)
    "sum_ragged": ("rect", lambda x: x.sum(2) ** 2),
    "mean_ragged": ("rect", lambda x: x.mean(2) ** 2),
    "amax_ragged": ("rect", lambda x: x.amax(2) ** 2),
    "amin_ragged": ("rect", lambda x: x.amin(2) ** 2),
    "max_ragged": ("rect", lambda x: x.max(2).values ** 2),
    "prod_ragged": ("rect", lambda x: x.prod(2) ** 2),
    "logsumexp_ragged": ("rect", lambda x: x.logsumexp(2) ** 2),
    "var_ragged": ("sq", lambda x: x.var(1)),
    "std_ragged": ("sq", lambda x: x.std(-2)),
    "std_keepdim": ("seq_full", lambda x: x.std(1, keepdim=True)),
    "std_static_and_ragged": ("seq2", lambda x: x.std((1, 2))),
    "norm_ragged": ("sq", lambda x: x.norm(dim=1)),
    "vector_norm3": ("sq", lambda x: torch.linalg.vector_norm(x, 3, dim=2)),
    # dense results (every ragged dim reduced)
    "sum_dense": ("seq", lambda x: x.sum(1) ** 2),
    "prod_dense": ("seq", lambda x: x.prod(1) ** 2),
    "mean_dense": ("seq_full", lambda x: x.mean(1) ** 2),
    "amax_dense": ("seq_full", lambda x: x.amax(1) ** 2),
    "amin_dense": ("seq_full", lambda x: x.amin((1,)) ** 2),
    "logsumexp_dense": ("seq_full", lambda x: x.logsumexp(1) ** 2),
    "var_dense": ("seq_full", lambda x: x.var(1)),
    "std_dense": ("seq_full", lambda x: x.std(1)),
    "std_empty_sample": ("seq", lambda x: x.std(1)),  # nan for the empty sample, as dense
    "norm_dense": ("seq_full", lambda x: x.norm(dim=1)),
    "sum_all_mixed": ("rect", lambda x: x.sum((1, 3)) ** 2),
    # static dims
    "sum_static": ("seq", lambda x: x.sum(-1) ** 2),
    "mean_static": ("lead", lambda x: x.mean(1) ** 2),
    "amax_static": ("seq", lambda x: x.amax(-1) ** 2),
    "prod_static": ("seq", lambda x: x.prod(-1) ** 2),
    "logsumexp_static": ("seq", lambda x: x.logsumexp(-1) ** 2),
    "var_static": ("seq", lambda x: x.var(-1)),
    "std_static": ("lead", lambda x: x.std(1)),
    "norm_static": ("seq", lambda x: x.norm(dim=-1)),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_gradgrad_reduction(name):
    struct, fn = REDUCTIONS[name]
    assert gradgrad(fn, struct)


def test_gradgrad_prod_without_zeros_third_order():
    """prod's double backward w.r.t. x is exact without zeros; check a third derivative against
    the per-sample dense one."""
    comps = [torch.tensor([[1.5, 2.0], [0.5, -3.0]], dtype=D), torch.zeros(0, 2, dtype=D), torch.tensor([[2.0, 1.25]], dtype=D)]
    leaves = [c.clone().requires_grad_() for c in comps]
    ref = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))

    def third(outs, ins):
        g = torch.autograd.grad(sum((o**2).sum() for o in outs), ins, create_graph=True)
        gg = torch.autograd.grad(sum((t**2).sum() for t in g), ins, create_graph=True)
        return torch.autograd.grad(sum((t**3).sum() for t in gg), ins)

    got = third([x.prod(1)], leaves)
    want = third([c.prod(0) for c in ref], ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_prod_double_backward_with_zero_raises():
    comps = [torch.tensor([[0.0, 2.0], [1.5, 3.0]], dtype=D), torch.tensor([[2.0, 1.0]], dtype=D)]
    leaves = [c.clone().requires_grad_() for c in comps]
    x = mj.as_nested_tensor(leaves, ragged_dims=(1,))
    g = torch.autograd.grad((x.prod(1) ** 2).sum(), leaves, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"prod\(\): double backward .* zeros"):
        torch.autograd.grad(sum((t**2).sum() for t in g), leaves)


# ----------------------------------------------------------------------------- structure ops
STRUCTURE = {
    "transpose_ragged": ("rect", lambda x: (x * x).transpose(1, 2)),
    "transpose_square": ("sq", lambda x: (x + x.transpose(1, 2)) ** 2),
    "permute": ("rect", lambda x: (x * x).permute(0, 3, 2, 1)),
    "unsqueeze_expand": ("seq", lambda x: (x * x).unsqueeze(-1).expand(-1, -1, -1, 2)),
    "view": ("lead", lambda x: (x * x).transpose(1, 2).reshape(x.shape[0], x.shape[2], 6)),
    "narrow": ("seq", lambda x: (x * x).narrow(-1, 1, 2)),
    "cat": ("seq", lambda x: torch.cat([x * x, x.sin()], -1)),
    "stack": ("seq", lambda x: torch.stack([x * x, x.sin()], 2)),
    "chunk": ("seq", lambda x: sum(c * c for c in (x * x).chunk(2, -1)[:1])),
    "squeeze": ("seq", lambda x: (x * x).unsqueeze(-1).squeeze(-1)),
}


@pytest.mark.parametrize("name", STRUCTURE)
def test_gradgrad_structure(name):
    struct, fn = STRUCTURE[name]
    assert gradgrad(fn, struct)


def test_gradgrad_to_padded_tensor():
    assert gradgrad(lambda x: torch.nested.to_padded_tensor(x * x, 0.0), "rect")


def test_gradgrad_from_padded():
    lengths = torch.tensor([2, 0, 3])
    padded = comps_for([(3, 3, 2)], 10)[0].requires_grad_()
    assert torch.autograd.gradgradcheck(lambda p: (mj.from_padded(p * p, lengths) ** 2).values(), (padded,))


def test_gradgrad_unbind_and_as_nested_tensor():
    comps = [c.clone().requires_grad_() for c in SEQ]

    def f(*cs):
        x = mj.as_nested_tensor(list(cs), ragged_dims=(1,))
        y = (x.unsqueeze(-2) * x.unsqueeze(-3)).sum(2)
        return tuple(t**2 for t in y.unbind())

    assert torch.autograd.gradgradcheck(f, tuple(comps))


def test_gradgrad_getitem():
    assert gradgrad(lambda x: torch.cat([(x * x)[0].flatten(), (x.sin())[2].flatten()]), "seq")


def test_gradgrad_relabel_equal_sizes():
    """Two tensors built separately with equal lengths (different nested ints) are relabelled
    onto one extent; the relabelling's backward must carry the graph too."""
    assert gradgrad(lambda a, b: (a * b).tanh(), "seq", n_mjt=2)


# ----------------------------------------------------------------------------- packed-level ops
# Handlers call these below autograd; a direct call differentiates to any order all the same.
def test_gradgrad_pair_matmul_packed():
    n = torch.tensor([3, 0, 2, 1])
    off = F.pad((n * n).cumsum(0), (1, 0))
    x, y = (torch.randn(int(off[-1]), 2, dtype=D, requires_grad=True) for _ in range(2))
    for tx, ty in ((False, False), (False, True), (True, False), (True, True)):
        def f(a, b, tx=tx, ty=ty):
            return torch.ops.multijagged.pair_matmul_packed(a, b, off, n, tx, ty)

        assert torch.autograd.gradcheck(f, (x, y))
        assert torch.autograd.gradgradcheck(f, (x, y), fast_mode=FAST)


@pytest.mark.parametrize("geometry", [((4, 1, 3, 3), [1, 1, 1, 1], [1, 1], 2), ((3, 2, 2, 3), [1, 0, 2, 2], [1, 2], 1)],
                         ids=["groups", "asymmetric_dilated"])
def test_gradgrad_spatial_conv_rows(geometry):
    shape, padding, dilation, groups = geometry
    sizes = torch.tensor([[4, 5], [3, 3], [0, 2]])  # pixel rows of three images, one empty
    rows = torch.randn(29, 2, dtype=D, requires_grad=True)
    w = torch.randn(*shape, dtype=D, requires_grad=True)
    b = torch.randn(shape[0], dtype=D, requires_grad=True)
    grad = torch.randn(29, shape[0], dtype=D, requires_grad=True)
    ops = torch.ops.multijagged

    def conv(r, w, b):
        return ops.spatial_conv_rows(r, sizes, w, b, padding, dilation, groups)

    assert torch.autograd.gradcheck(conv, (rows, w, b))
    assert torch.autograd.gradgradcheck(conv, (rows, w, b), fast_mode=FAST)
    for need_w, need_b in ((True, True), (True, False), (False, True)):
        def param_grads(g, r, need_w=need_w, need_b=need_b):
            gw, gb = ops.spatial_conv_rows_param_grads(g, r, sizes, w.detach(), padding, dilation, groups, need_w,
                                                       need_b)
            return tuple(t for t, need in ((gw, need_w), (gb, need_b)) if need)

        assert torch.autograd.gradcheck(param_grads, (grad, rows))
        assert torch.autograd.gradgradcheck(param_grads, (grad, rows), fast_mode=FAST)


COMPLEX_CASES = {
    "x @ W": ("seq", lambda x, w: x @ w),
    "linear + bias": ("seq", lambda x, w: F.linear(x, w.mT, w[0])),
    "prod_ragged": ("rect", lambda x, w: x.prod(2) * w[0, 0]),
    "prod_static": ("seq", lambda x, w: x.prod(-1) * w[0, 0]),
    "norm_ragged": ("seq_full", lambda x, w: x.norm(dim=1) * w[0, 0]),
}


@pytest.mark.parametrize("name", COMPLEX_CASES)
def test_complex_gradcheck_and_gradgradcheck(name):
    """complex128 values: gradcheck and gradgradcheck (torch's complex checks test the conjugate
    Wirtinger derivative: a formula missing a ``conj`` fails them) on packed values and a dense
    complex weight."""
    struct, fn = COMPLEX_CASES[name]
    comps, rd = STRUCTS[struct]
    v, off, sizes = packed_args(comps, rd)
    g = torch.Generator().manual_seed(0)
    v = torch.complex(v, torch.randn(v.shape, generator=g, dtype=D)).requires_grad_()
    w = torch.randn(v.shape[-1], 2, generator=g, dtype=torch.complex128, requires_grad=True)

    def f(v, w):
        return _out(fn(mj.from_packed(v, off, sizes, rd), w))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.autograd.gradcheck(f, (v, w))
        assert torch.autograd.gradgradcheck(f, (v, w), fast_mode=FAST)
