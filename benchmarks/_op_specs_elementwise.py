"""Op coverage specs: unary and binary elementwise ops, factories and copies, dropout, aten
backward ops (``op_coverage.py``; each ``@spec`` registers the cases of the DanLing operators it
names)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

try:
    from ._op_cases import (
        Case, DT, MJT, R, Wrong, _close, chans, check_random, dense, dropout_support, img,
        inplace, inplace_fn, like, method, pair, seq, spec, vec, vol,
    )
except ImportError:  # run as a script: python benchmarks/op_coverage.py
    from _op_cases import (
        Case, DT, MJT, R, Wrong, _close, chans, check_random, dense, dropout_support, img,
        inplace, inplace_fn, like, method, pair, seq, spec, vec, vol,
    )

aten = torch.ops.aten

# --- unary elementwise ------------------------------------------------------------------------
_UNARY = {
    # name: (domain, differentiable)
    "abs": (None, True), "acos": ("unit", True), "acosh": ("ge1", True), "asin": ("unit", True),
    "asinh": (None, True), "atan": (None, True), "atanh": ("unit", True), "ceil": (None, True),
    "cos": (None, True), "cosh": (None, True), "digamma": ("pos", True), "erf": (None, True),
    "erfc": (None, True), "erfinv": ("unit", True), "exp": (None, True), "exp2": (None, True),
    "expm1": (None, True), "floor": (None, True), "frac": (None, True), "lgamma": ("pos", True),
    "log": ("pos", True), "log10": ("pos", True), "log1p": ("pos", True), "log2": ("pos", True),
    "logit": ("prob", True), "neg": (None, True), "positive": (None, True), "reciprocal": ("nz", True),
    "round": (None, True), "rsqrt": ("pos", True), "sgn": (None, True), "sigmoid": (None, True),
    "sign": (None, True), "sin": (None, True), "sinh": (None, True), "sqrt": ("pos", True),
    "square": (None, True), "tan": ("unit", True), "tanh": (None, True), "trunc": (None, True),
    "relu": (None, True), "isfinite": (None, False), "isinf": (None, False), "isnan": (None, False),
    "logical_not": (None, False),
}


@spec(*_UNARY)
def _unary(name):
    dom, grad = _UNARY[name]
    fn = getattr(torch, name)
    cases = [Case(fn, (seq(dom=dom),), grad=grad, label="torch.%s(seq)" % name)]
    if hasattr(torch.Tensor, name):
        cases.append(Case(method(name), (pair(dom=dom),), ref=fn, grad=grad, label="pair.%s()" % name))
    return cases


@spec("nan_to_num")
def _nan_to_num(name):
    def with_specials(r):
        cs = [c.clone() for c in r.comps]
        cs[0][0, 0], cs[0][1, 1], cs[0][2, 2] = float("nan"), float("inf"), -float("inf")
        return R(cs, r.ragged_dims)

    return [
        Case(lambda x: torch.nan_to_num(x, nan=0.5, posinf=9.0), (with_specials(seq()),), ref=lambda c: torch.nan_to_num(c, nan=0.5, posinf=9.0)),
        Case(lambda x: x.nan_to_num(), (pair(),), ref=torch.nan_to_num),
    ]


@spec("bitwise_not")
def _bitwise_not(name):
    return [Case(torch.bitwise_not, (seq(dtype=torch.int64),)), Case(method("bitwise_not"), (pair(dtype=torch.bool),), ref=torch.bitwise_not)]


# activations in torch.nn.functional
_ACT = {
    "relu6": {}, "elu": {"alpha": 0.7}, "selu": {}, "celu": {"alpha": 0.7}, "gelu": {}, "silu": {},
    "mish": {}, "hardtanh": {"min_val": -0.5, "max_val": 0.8}, "hardswish": {}, "hardsigmoid": {},
    "leaky_relu": {"negative_slope": 0.2}, "softplus": {"beta": 2.0}, "softshrink": {"lambd": 0.3},
    "hardshrink": {"lambd": 0.3}, "tanhshrink": {}, "softsign": {},
}


@spec(*_ACT)
def _act(name):
    f, kw = getattr(F, name), _ACT[name]
    fn = lambda x: f(x, **kw)  # noqa: E731
    cases = [Case(fn, (seq(),), label=f"F.{name}(seq)"), Case(fn, (pair(),), label=f"F.{name}(pair)")]
    if name == "gelu":
        cases.append(Case(lambda x: F.gelu(x, approximate="tanh"), (seq(),), label="tanh approximation"))
    return cases


@spec("log_sigmoid")
def _log_sigmoid(name):
    return [Case(F.logsigmoid, (seq(),)), Case(F.logsigmoid, (pair(),))]


@spec("rrelu")
def _rrelu(name):
    lo, hi = 0.1, 0.3

    def support(o, s):
        x = s[0].detach()
        neg = x < 0
        r = torch.where(neg, o / torch.where(neg, x, 1.0), 1.0)
        return bool(((~neg) & (o == x) | neg & (r >= lo - 1e-12) & (r <= hi + 1e-12)).all())

    return [
        Case(lambda x: F.rrelu(x, lo, hi, training=False), (seq(),), label="eval"),
        Case(lambda x: F.rrelu(x, lo, hi, training=True), (seq(),), check=check_random(support), grad=False, label="training (random slopes)"),
    ]


_INPLACE_ACT = {
    "relu_": lambda y: y.relu_(), "sigmoid_": lambda y: y.sigmoid_(), "tanh_": lambda y: y.tanh_(),
    "silu_": lambda y: F.silu(y, inplace=True), "selu_": lambda y: F.selu(y, inplace=True),
    "celu_": lambda y: F.celu(y, 0.7, inplace=True), "elu_": lambda y: F.elu(y, 0.7, inplace=True),
    "hardsigmoid_": lambda y: F.hardsigmoid(y, inplace=True), "hardswish_": lambda y: F.hardswish(y, inplace=True),
    "hardtanh_": lambda y: F.hardtanh(y, -0.5, 0.8, inplace=True),
    "leaky_relu_": lambda y: F.leaky_relu(y, 0.2, inplace=True),
}


@spec(*_INPLACE_ACT)
def _inplace_act(name):
    f = inplace_fn(_INPLACE_ACT[name])
    return [Case(f, (seq(),)), Case(f, (pair(),))]


# --- binary elementwise -----------------------------------------------------------------------
_BINARY = {
    # name: (domain of x, domain of y, differentiable, scalar)
    "add": (None, None, True, 0.7), "sub": (None, None, True, 0.7), "mul": (None, None, True, 0.7),
    "div": (None, "nz", True, 0.7), "true_divide": (None, "nz", True, 0.7), "pow": ("pos", None, True, 1.5),
    "fmod": (None, "nz", True, 0.7), "remainder": (None, "nz", True, 0.7), "floor_divide": (None, "nz", False, 0.7),
    "atan2": (None, None, True, None), "hypot": (None, None, True, None), "maximum": (None, None, True, None),
    "minimum": (None, None, True, None), "logaddexp": (None, None, True, None), "logaddexp2": (None, None, True, None),
    "nextafter": (None, None, False, None), "eq": (None, None, False, 0.5), "ne": (None, None, False, 0.5),
    "lt": (None, None, False, 0.5), "le": (None, None, False, 0.5), "gt": (None, None, False, 0.5),
    "ge": (None, None, False, 0.5), "logical_and": (None, None, False, None), "logical_or": (None, None, False, None),
    "logical_xor": (None, None, False, None),
}


@spec(*_BINARY)
def _binary(name):
    dx, dy, grad, scalar = _BINARY[name]
    f = getattr(torch, name)
    x = seq(dom=dx)
    cases = [
        Case(f, (x, like(x, dom=dy)), grad=grad, label=f"torch.{name}(seq, seq)"),
        Case(method(name), (x, dense(3, dom=dy)), ref=f, grad=grad, label=f"seq.{name}(dense (C,))"),
        Case(lambda a, b: f(a.unsqueeze(2), b.unsqueeze(1)), (x, like(x, dom=dy)), ref=lambda a, b: f(a.unsqueeze(1), b.unsqueeze(0)), grad=grad, label="broadcast into a pair"),
    ]
    if scalar is not None:
        cases.append(Case(lambda a: f(a, scalar), (pair(dom=dx),), grad=grad, label=f"torch.{name}(pair, scalar)"))
    return cases


_INT_BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift")


@spec(*_INT_BINARY)
def _int_binary(name):
    f = getattr(torch, name)
    x = seq(dtype=torch.int64)
    y = R([c.abs() % 3 for c in like(x).comps], (1,)) if "shift" in name else like(x)
    cases = [Case(f, (x, y), label=f"torch.{name}(seq, seq)"), Case(lambda a: f(a, 2), (pair(dtype=torch.int64),), label="pair, scalar")]
    if "shift" not in name:
        cases.append(Case(method(name), (seq(dtype=torch.bool), like(seq(dtype=torch.bool))), ref=f, label="bool"))
    return cases


_INPLACE_BINARY = {
    "add_": ("add_", None, None), "sub_": ("sub_", None, None), "mul_": ("mul_", None, None),
    "div_": ("div_", None, "nz"), "pow_": ("pow_", "pos", None), "fmod_": ("fmod_", None, "nz"),
    "remainder_": ("remainder_", None, "nz"), "floor_divide_": ("floor_divide_", None, "nz"),
}


@spec(*_INPLACE_BINARY)
def _inplace_binary(name):
    m, dx, dy = _INPLACE_BINARY[name]
    x = seq(dom=dx)
    grad = name != "floor_divide_"
    return [
        Case(inplace(m), (x, like(x, dom=dy)), grad=grad, label=f"seq.{m}(seq)"),
        Case(inplace(m), (x, dense(3, dom=dy)), grad=grad, label=f"seq.{m}(dense (C,))"),
        Case(inplace(m, 1.5), (pair(dom=dx),), grad=grad, label=f"pair.{m}(scalar)"),
    ]


@spec("bitwise_and_", "bitwise_or_", "bitwise_xor_")
def _inplace_bitwise(name):
    x = seq(dtype=torch.int64)
    return [Case(inplace(name), (x, like(x))), Case(inplace(name, 3), (pair(dtype=torch.int64),))]


@spec("addcmul", "addcdiv")
def _addc(name):
    f = getattr(torch, name)
    x = seq()
    d = "nz" if name == "addcdiv" else None
    return [
        Case(lambda a, b, c: f(a, b, c, value=0.5), (x, like(x, 1), like(x, 2, dom=d)), ref=lambda a, b, c: f(a, b, c, value=0.5)),
        Case(lambda a, b, c: f(a, b, c), (x, dense(3), like(x, 2, dom=d))),
    ]


@spec("lerp")
def _lerp(name):
    x = seq()
    return [
        Case(lambda a, b: torch.lerp(a, b, 0.3), (x, like(x))),
        Case(torch.lerp, (x, like(x), like(x, 2, dom="prob")), label="tensor weight"),
    ]


@spec("where")
def _where(name):
    x = seq()
    cond = like(x, 5, dtype=torch.bool)
    return [
        Case(torch.where, (cond, x, like(x)), label="where(mask, seq, seq)"),
        Case(lambda m, a: torch.where(m, a, 0.0), (cond, x), label="where(mask, seq, 0.0)"),
        Case(lambda m, a, b: torch.where(m, a, b), (cond, x, dense(3)), label="dense operand"),
    ]


@spec("clamp")
def _clamp(name):
    x = seq()
    return [
        Case(lambda a: torch.clamp(a, -0.5, 0.8), (x,)),
        Case(lambda a, lo, hi: a.clamp(lo, hi), (x, like(x, 1, dom="unit"), dense(3, dom="pos")), ref=lambda a, lo, hi: a.clamp(lo, hi), label="tensor bounds"),
        Case(lambda a: a.clamp(max=0.3), (pair(),), ref=lambda a: a.clamp(max=0.3)),
    ]


@spec("clamp_min", "clamp_max")
def _clamp_one(name):
    x = seq()
    return [Case(lambda a: getattr(torch, name)(a, 0.2), (x,)), Case(method(name), (x, like(x)), ref=getattr(torch, name), label="tensor bound")]


@spec("masked_fill")
def _masked_fill(name):
    x = seq()
    m = like(x, 5, dtype=torch.bool)
    return [
        Case(lambda a, b: a.masked_fill(b, 0.5), (x, m), ref=lambda a, b: a.masked_fill(b, 0.5)),
        Case(lambda a, b: a.masked_fill(b, -1.0), (pair(), like(pair(), 4, dtype=torch.bool)), ref=lambda a, b: a.masked_fill(b, -1.0)),
        Case(lambda a, b: a.masked_fill(b.unsqueeze(-1), 0.0), (x, vec(seed=2, dtype=torch.bool)), ref=lambda a, b: a.masked_fill(b.unsqueeze(-1), 0.0), label="broadcast mask"),
    ]


@spec("masked_scatter")
def _masked_scatter(name):
    x = seq()
    return [Case(lambda a, m, s: a.masked_scatter(m, s), (x, like(x, 5, dtype=torch.bool), like(x, 2)), ref=lambda a, m, s: a.masked_scatter(m, s))]


# --- factories, copies -------------------------------------------------------------------------
@spec("clone", "detach", "alias")
def _copies(name):
    fn = {"clone": torch.clone, "detach": torch.detach, "alias": aten.alias.default}[name]
    return [Case(fn, (seq(),), grad=name != "detach"), Case(fn, (pair(),), grad=name != "detach")]


@spec("_to_copy")
def _to_copy(name):
    return [
        Case(lambda x: x.to(torch.float32), (seq(),)),
        Case(lambda x: aten._to_copy.default(x, dtype=torch.float32), (pair(),)),
        Case(lambda x: x.to(torch.int64), (seq(),), grad=False),
    ]


@spec("copy_")
def _copy_(name):
    x = seq()
    return [Case(inplace("copy_"), (x, like(x)), label="seq.copy_(seq)"), Case(inplace("copy_"), (x, dense(3)), label="copy_(dense broadcast)")]


@spec("fill_", "zero_")
def _fill(name):
    f = inplace("fill_", 0.5) if name == "fill_" else inplace("zero_")
    return [Case(f, (seq(),)), Case(f, (pair(),))]


@spec("full_like", "ones_like", "zeros_like")
def _likes(name):
    if name == "full_like":
        f = lambda x: torch.full_like(x, 2.5)  # noqa: E731
    else:
        f = getattr(torch, name)
    g = (lambda x: torch.full_like(x, 3, dtype=torch.int64)) if name == "full_like" else (lambda x: getattr(torch, name)(x, dtype=torch.int64))
    return [Case(f, (seq(),), grad=False), Case(f, (pair(),), grad=False), Case(g, (seq(),), grad=False, label="dtype=int64")]


@spec("empty_like")
def _empty_like(name):
    return [Case(torch.empty_like, (seq(),), check=check_random(lambda o, s: True), grad=False), Case(torch.empty_like, (pair(),), check=check_random(lambda o, s: True), grad=False)]


@spec("rand_like", "randn_like", "randint_like", "normal_", "uniform_", "bernoulli", "bernoulli_")
def _random(name):
    f, sup, dt = {
        "rand_like": (torch.rand_like, lambda o, s: ((o >= 0) & (o < 1)).all(), None),
        "randn_like": (torch.randn_like, lambda o, s: torch.isfinite(o).all(), None),
        "randint_like": (lambda x: torch.randint_like(x, 5), lambda o, s: ((o >= 0) & (o < 5) & (o == o.round())).all(), None),
        "normal_": (inplace("normal_", 1.0, 0.5), lambda o, s: torch.isfinite(o).all(), None),
        "uniform_": (inplace("uniform_", -1.0, 1.0), lambda o, s: ((o >= -1) & (o < 1)).all(), None),
        "bernoulli": (torch.bernoulli, lambda o, s: ((o == 0) | (o == 1)).all(), None),
        "bernoulli_": (inplace("bernoulli_", 0.3), lambda o, s: ((o == 0) | (o == 1)).all(), None),
    }[name]
    dom = "prob" if name == "bernoulli" else None
    cases = [Case(f, (seq(dom=dom),), check=check_random(sup, dt), grad=False), Case(f, (pair(dom=dom),), check=check_random(sup, dt), grad=False)]
    if name == "bernoulli":
        cases.append(Case(torch.bernoulli, (seq(dom="bin"),), grad=False, label="p in {0, 1}: deterministic"))
    return cases


# --- dropout ----------------------------------------------------------------------------------
@spec("dropout", "dropout_", "feature_dropout", "dropout1d", "dropout2d", "dropout3d")
def _dropout(name):
    p = 0.5
    f = {
        "dropout": lambda x, p=p, t=True: F.dropout(x, p, t),
        "dropout_": lambda x, p=p, t=True: F.dropout(x.clone(), p, t, inplace=True),
        "feature_dropout": lambda x, p=p, t=True: aten.feature_dropout.default(x, p, t),
        "dropout1d": lambda x, p=p, t=True: F.dropout1d(x, p, t),
        "dropout2d": lambda x, p=p, t=True: F.dropout2d(x, p, t),
        "dropout3d": lambda x, p=p, t=True: F.dropout3d(x, p, t),
    }[name]
    x = {"dropout": seq(), "dropout_": seq(), "feature_dropout": chans(), "dropout1d": chans(), "dropout2d": img(), "dropout3d": vol()}[name]
    return [
        Case(f, (x,), check=check_random(dropout_support(p)), grad=False, label="p = 0.5 (support)"),
        Case(lambda a: f(a, 0.0), (x,), ref=lambda a: a.clone(), label="p = 0"),
        Case(lambda a: f(a, p, False), (x,), ref=lambda a: a.clone(), label="eval"),
    ]


@spec("alpha_dropout", "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_")
def _alpha_dropout(name):
    g = {
        "alpha_dropout": lambda x, p, t: F.alpha_dropout(x, p, t),
        "alpha_dropout_": lambda x, p, t: F.alpha_dropout(x.clone(), p, t, inplace=True),
        "feature_alpha_dropout": lambda x, p, t: F.feature_alpha_dropout(x, p, t),
        "feature_alpha_dropout_": lambda x, p, t: F.feature_alpha_dropout(x.clone(), p, t, inplace=True),
    }[name]
    x = chans() if "feature" in name else seq()

    def support(o, s):  # alpha dropout: kept elements a*x + b, dropped ones a*α' + b, one (a, b)
        p, alpha = 0.5, -1.7580993408473766
        a = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
        b = -a * alpha * p
        xx = s[0].detach()
        return bool((torch.isclose(o, a * xx + b) | torch.isclose(o, torch.full_like(o, a * alpha + b))).all())

    return [
        Case(lambda a: g(a, 0.5, True), (x,), check=check_random(support), grad=False, label="p = 0.5 (support)"),
        Case(lambda a: g(a, 0.5, False), (x,), ref=lambda a: a.clone(), label="eval"),
    ]


@spec("native_dropout")
def _native_dropout(name):
    def check(out, samples):
        o, m = out
        if not isinstance(o, MJT) or not isinstance(m, MJT):
            raise Wrong("expected multi_jagged (output, mask)")
        for i, (a, b, s) in enumerate(zip(o.unbind(), m.unbind(), samples)):
            x = s[0].detach()
            if a.shape != x.shape or b.shape != x.shape or b.dtype != torch.bool:
                raise Wrong(f"sample {i}: shapes {a.shape}, {b.shape} / mask dtype {b.dtype}")
            if not torch.allclose(a, x * b * 2.0):
                raise Wrong(f"sample {i}: output != x * mask / (1 - p)")

    def eval_ref(c):  # dense torch returns a mask of the input's dtype for an empty input; a batch has one mask dtype
        out, mask = aten.native_dropout.default(c, 0.5, False)
        return out, mask.bool()

    return [Case(lambda x: aten.native_dropout.default(x, 0.5, True), (seq(),), check=check, grad=False), Case(lambda x: aten.native_dropout.default(x, 0.5, False), (seq(),), ref=eval_ref, label="eval")]


@spec("native_dropout_backward")
def _native_dropout_backward(name):
    x = seq()
    return [Case(lambda g, m: aten.native_dropout_backward.default(g, m, 2.0), (x, like(x, 5, dtype=torch.bool)), share=True)]


# --- backward ops (aten) ----------------------------------------------------------------------
_BACKWARD = {
    "gelu_backward": lambda g, x: aten.gelu_backward.default(g, x),
    "hardsigmoid_backward": lambda g, x: aten.hardsigmoid_backward.default(g, x),
    "hardswish_backward": lambda g, x: aten.hardswish_backward.default(g, x),
    "leaky_relu_backward": lambda g, x: aten.leaky_relu_backward.default(g, x, 0.2, False),
    "mish_backward": lambda g, x: aten.mish_backward.default(g, x),
    "sigmoid_backward": lambda g, y: aten.sigmoid_backward.default(g, y),
    "silu_backward": lambda g, x: aten.silu_backward.default(g, x),
    "tanh_backward": lambda g, y: aten.tanh_backward.default(g, y),
    "threshold_backward": lambda g, x: aten.threshold_backward.default(g, x, 0.1),
}


@spec(*_BACKWARD)
def _backward(name):
    x = seq()
    return [Case(_BACKWARD[name], (like(x, 4), x), share=True), Case(_BACKWARD[name], (like(pair(), 4), pair()), share=True)]


@spec("_softmax", "_log_softmax")
def _softmax_internal(name):
    op = getattr(aten, name).default
    return [Case(lambda x: op(x, -1, False), (seq(),)), Case(lambda x: op(x, 1, False), (seq(),), ref=lambda c: op(c, 0, False), label="ragged dim")]


@spec("_softmax_backward_data", "_log_softmax_backward_data")
def _softmax_backward_internal(name):
    op = getattr(aten, name).default
    fwd = aten._softmax.default if name == "_softmax_backward_data" else aten._log_softmax.default
    x = seq()
    return [
        Case(lambda g, a: op(g, fwd(a, -1, False), -1, DT), (like(x, 4), x), ref=lambda g, a: op(g, fwd(a, -1, False), -1, DT), share=True),
        Case(lambda g, a: op(g, fwd(a, 1, False), 1, DT), (like(x, 4), x), ref=lambda g, a: op(g, fwd(a, 0, False), 0, DT), label="ragged dim", share=True),
    ]


@spec("native_layer_norm")
def _native_layer_norm(name):
    w, b = dense(3, seed=1), dense(3, seed=2)
    f = lambda x, w, b: aten.native_layer_norm.default(x, [3], w, b, 1e-5)  # noqa: E731
    return [Case(f, (seq(), w, b))]


@spec("native_layer_norm_backward")
def _native_layer_norm_backward(name):
    w, b = dense(3, seed=1), dense(3, seed=2)

    def f(g, x, w, b):
        _, mean, rstd = aten.native_layer_norm.default(x, [3], w, b, 1e-5)
        return aten.native_layer_norm_backward.default(g, x, [3], mean, rstd, w, b, [True, True, True])

    def ref(g, x, w, b):
        _, mean, rstd = aten.native_layer_norm.default(x, [3], w, b, 1e-5)
        gi, gw, gb = aten.native_layer_norm_backward.default(g, x, [3], mean, rstd, w, b, [True, True, True])
        return gi, gw, gb

    # the weight and bias gradients sum over every sample: compare them as a whole
    def whole(gs, xs, w, b):
        parts = [ref(g, x, w, b) for g, x in zip(gs, xs)]
        return [None, sum(p[1] for p in parts), sum(p[2] for p in parts)]

    def check(out, samples):
        gi, gw, gb = out
        for i, (a, s) in enumerate(zip(gi.unbind(), samples)):
            _close(a, ref(*s)[0], f"grad_input sample {i}", 1e-7)
        exp = whole([s[0] for s in samples], [s[1] for s in samples], samples[0][2], samples[0][3])
        _close(gw, exp[1], "grad_weight", 1e-7)
        _close(gb, exp[2], "grad_bias", 1e-7)

    x = seq()
    return [Case(f, (like(x, 4), x, w, b), check=check, grad=False, share=True)]
