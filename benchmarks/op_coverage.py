"""Op coverage against DanLing's NestedTensor: which of its operators run per-sample correctly here.

``benchmarks/danling_ops.txt`` lists the operators that DanLing's ``NestedTensor`` has handlers
for (its ``__torch_function__`` and ``__torch_dispatch__`` registries, one name per operator; the
file's header says how the names were counted). For each one this script calls the op on
multi_jagged float64 inputs the way a user would — ``torch.foo(x)``, ``x.foo()``, ``F.foo(x)``, or
``torch.ops.aten.foo`` for an aten-internal op — and compares the result with the per-sample
reference: unbind the batch, apply the dense op to each sample. Inputs: a ``(B, j0, C)`` batch with
a zero-length sample wherever the dense op accepts an empty extent, square pairs ``(B, j0, j0, C)``
where the op makes sense on them, and the shapes an op needs (channels-first ``(B, C, j0)``
signals, ``(B, C, j0, j1)`` images, matrices).

Each operator is classified:

* ``pass``: every case equals the per-sample reference (values, shapes, dtypes) and, for
  differentiable float ops, the gradients of every leaf for a random cotangent;
* ``wrong``: a case runs but differs from the reference — a silent wrong answer, a defect;
* ``raises``: a case raises (the first error is shown);
* ``n/a``: meaningless per sample on this build (the reason is shown); never counted as a pass.

Random ops (``rand_like``, ``bernoulli``, dropout with ``0 < p < 1``) cannot equal a reference;
their cases check per-sample shapes, dtypes and that every value lies in the op's support (for
dropout: each element is 0 or ``x / (1 - p)``), and a deterministic setting (``p = 0``, eval)
where there is one.

``python benchmarks/op_coverage.py`` prints the table and the summary (``--failing`` prints only
the rows that do not pass; ``--op NAME`` runs some ops, with the failing case's traceback).
``test/test_op_coverage.py`` asserts that no op is ``wrong`` and that the pass count stays at
or above its floor.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

import torch_multijagged as mj

aten = torch.ops.aten
DT = torch.float64
OPS_FILE = Path(__file__).with_name("danling_ops.txt")
MJT = mj.MultiJaggedTensor

LENS = (3, 0, 2, 4)  # (B, j0, ·): one zero-length sample
LENS_NZ = (3, 1, 2, 4)  # where the dense op refuses an empty extent
PAIR_LENS = (3, 0, 2)
HW = ((3, 4), (2, 2), (4, 3))  # ragged images (h, w)
HW_EVEN = ((4, 4), (2, 6), (6, 2))


def load_ops(path: Path = OPS_FILE) -> list[str]:
    """The operator names of ``danling_ops.txt`` (``#`` comments and blank lines skipped)."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


# ----------------------------------------------------------------------------- operands
class R:
    """A ragged operand: components packed with ``mj.as_nested_tensor``; a float one is built
    from fresh leaves whose gradients are compared."""

    def __init__(self, comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...], grad: bool = True):
        self.comps = [c.detach() for c in comps]
        self.ragged_dims = tuple(ragged_dims)
        self.grad = grad

    def const(self) -> "R":
        """The same operand, never differentiated (a loss target)."""
        return R(self.comps, self.ragged_dims, grad=False)


class PS:
    """A dense per-sample operand ``(B, …)``: sample i of the reference sees ``t[i]``."""

    def __init__(self, t: torch.Tensor):
        self.t = t


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _vals(shape, seed: int, dtype=DT, dom: Optional[Callable] = None) -> torch.Tensor:
    g = _gen(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g, dtype=torch.float64) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=g, dtype=dtype)
    t = torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2
    if dom is not None:
        t = DOMAINS[dom](t)
    return t.to(dtype)


DOMAINS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "unit": lambda t: torch.tanh(t) * 0.9,  # (-1, 1)
    "pos": lambda t: t.abs() + 0.5,  # > 0
    "ge1": lambda t: t.abs() + 1.1,  # > 1
    "prob": lambda t: torch.sigmoid(t) * 0.9 + 0.05,  # (0, 1)
    "nz": lambda t: torch.sign(t) * (t.abs() + 0.5),  # away from 0
    "sign": lambda t: torch.where(t > 0, 1.0, -1.0).to(t.dtype),  # ±1
    "bin": lambda t: (t > 0).to(t.dtype),  # {0, 1}
}


def comps(shapes, seed=0, dtype=DT, dom=None) -> list[torch.Tensor]:
    return [_vals(s, seed * 101 + i, dtype, dom) for i, s in enumerate(shapes)]


def seq(c=3, lens=LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, j0, c)``."""
    return R(comps([(n, c) for n in lens], seed, dtype, dom), (1,))


def seq4(s=2, c=3, lens=LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, j0, s, c)``."""
    return R(comps([(n, s, c) for n in lens], seed, dtype, dom), (1,))


def vec(lens=LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, j0)``."""
    return R(comps([(n,) for n in lens], seed, dtype, dom), (1,))


def pair(c=2, lens=PAIR_LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, j0, j0, c)``."""
    return R(comps([(n, n, c) for n in lens], seed, dtype, dom), (1, 2))


def sq(lens=PAIR_LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, j0, j0)``: one square matrix per sample."""
    return R(comps([(n, n) for n in lens], seed, dtype, dom), (1, 2))


def chans(c=2, lens=LENS, seed=0, dtype=DT, dom=None) -> R:
    """``(B, c, j0)``: a channels-first signal."""
    return R(comps([(c, n) for n in lens], seed, dtype, dom), (2,))


def img(c=2, hw=HW, seed=0, dtype=DT, dom=None) -> R:
    """``(B, c, j0, j1)``: ragged images."""
    return R(comps([(c, h, w) for h, w in hw], seed, dtype, dom), (2, 3))


def vol(c=1, dhw=((2, 3, 2), (3, 2, 2)), seed=0, dtype=DT, dom=None) -> R:
    """``(B, c, j0, j1, j2)``: ragged volumes."""
    return R(comps([(c, *s) for s in dhw], seed, dtype, dom), (2, 3, 4))


def mats(k=3, lens=LENS, seed=0, kind="gen") -> R:
    """``(B, j0, k, k)``: a batch of small matrices per sample — ``gen`` well conditioned,
    ``sym`` symmetric, ``spd`` symmetric positive definite."""
    return R([_matrix(m, kind) for m in comps([(n, k, k) for n in lens], seed)], (1,))


def sqm(lens=PAIR_LENS, seed=0, kind="gen") -> R:
    """``(B, j0, j0)`` of the same kinds as ``mats``: one ragged square matrix per sample."""
    return R([_matrix(m, kind) for m in comps([(n, n) for n in lens], seed)], (1, 2))


def _matrix(m: torch.Tensor, kind: str) -> torch.Tensor:
    eye = torch.eye(m.shape[-1], dtype=m.dtype)
    if kind == "sym":
        return (m + m.transpose(-1, -2)) / 2
    if kind == "spd":
        return m @ m.transpose(-1, -2) + eye
    return m + 3 * eye


def dense(*shape, seed=7, dtype=DT, dom=None) -> torch.Tensor:
    return _vals(shape, seed, dtype, dom)


def idx_like(r: R, high: Callable[[torch.Tensor], int], shape: Callable[[torch.Tensor], tuple], seed=3) -> R:
    """Integer components, one per component of ``r``, in ``[0, high(c))``."""
    out = []
    for i, c in enumerate(r.comps):
        hi = high(c)
        s = shape(c)
        g = _gen(seed * 31 + i)
        out.append(torch.randint(0, max(hi, 1), s, generator=g) if hi > 0 else torch.zeros(s, dtype=torch.int64))
    return R(out, r.ragged_dims)


def like(r: R, seed=1, dtype=None, dom=None) -> R:
    """Another ragged operand with ``r``'s component shapes (built separately: own nested ints)."""
    return R(comps([c.shape for c in r.comps], seed, dtype or r.comps[0].dtype, dom), r.ragged_dims)


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One call of an op. ``fn(*operands)`` on multi_jagged operands; the reference is
    ``ref(*sample_i operands)`` per sample (default ``fn``), or with ``whole`` a function of the
    components (lists) that gives the batch's result at once (full reductions, ``numel``, losses
    with a reduction). ``check(out, samples)`` replaces the comparison for random ops."""

    fn: Callable
    args: tuple
    ref: Optional[Callable] = None
    whole: Optional[Callable] = None
    grad: bool = True
    check: Optional[Callable] = None
    tol: float = 1e-7
    label: str = ""
    share: bool = False  # float ragged operands after the first take its nested ints (aten-internal ops)


@dataclass
class NA:
    reason: str


@dataclass
class Row:
    op: str
    status: str  # pass / wrong / raises / n/a / error (a broken case in this script)
    detail: str = ""
    cases: int = 0
    tb: str = field(default="", repr=False)


class PerSample:
    """A ``whole`` reference that needs the whole batch but gives one result per sample (batch
    statistics): compared as a per-sample reference."""

    def __init__(self, parts):
        self.parts = list(parts)


class Wrong(Exception):
    pass


class SpecError(Exception):
    pass


def _flat(o) -> list:
    if isinstance(o, (tuple, list)):
        return [x for e in o for x in _flat(e)]
    return [o]


def _close(a, b, what: str, tol: float) -> None:
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or isinstance(a, MJT):
            raise Wrong(f"{what}: expected a dense tensor, got {type(a).__name__}")
        if tuple(a.shape) != tuple(b.shape):
            raise Wrong(f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise Wrong(f"{what}: dtype {a.dtype} != {b.dtype}")
        try:
            torch.testing.assert_close(a.detach(), b.detach(), rtol=tol, atol=tol, equal_nan=True)
        except AssertionError as e:
            raise Wrong(f"{what}: {str(e).splitlines()[0]} {str(e).splitlines()[-1] if len(str(e).splitlines()) > 1 else ''}")
        return
    if b is None:
        if a is not None:
            raise Wrong(f"{what}: expected None, got {type(a).__name__}")
        return
    if isinstance(b, float):
        if not isinstance(a, (int, float)) or not (a == b or abs(a - b) <= tol * (1 + abs(b)) or (math.isnan(a) and math.isnan(b))):
            raise Wrong(f"{what}: {a!r} != {b!r}")
        return
    if a != b or type(a) is not type(b):
        raise Wrong(f"{what}: {a!r} != {b!r}")


def _prepare(case: Case):
    """Operands for the call, leaves on both sides, and per-sample / whole accessors."""
    grad = case.grad
    mj_args, mj_leaves, ref_leaves, parts, wholes = [], [], [], [], []
    batch = None
    for a in case.args:
        if isinstance(a, R):
            g = grad and a.grad and a.comps[0].is_floating_point()
            leaves = [c.clone().requires_grad_(g) for c in a.comps]
            rl = [c.clone().requires_grad_(g) for c in a.comps]
            mj_args.append(mj.as_nested_tensor(leaves, ragged_dims=a.ragged_dims))
            if g:
                mj_leaves += leaves
                ref_leaves += rl
            parts.append(lambda i, rl=rl: rl[i])
            wholes.append(rl)
            batch = len(rl) if batch is None else batch
        elif isinstance(a, (PS, torch.Tensor)):
            t = a.t if isinstance(a, PS) else a
            g = grad and t.is_floating_point()
            ml, rl = t.clone().requires_grad_(g), t.clone().requires_grad_(g)
            mj_args.append(ml)
            if g:
                mj_leaves.append(ml)
                ref_leaves.append(rl)
            parts.append((lambda i, rl=rl: rl[i]) if isinstance(a, PS) else (lambda i, rl=rl: rl))
            wholes.append(rl)
        else:
            mj_args.append(a)
            parts.append(lambda i, a=a: a)
            wholes.append(a)
    if batch is None:
        raise SpecError("a case needs a ragged operand")
    if case.share:
        # aten-internal ops (backward formulas) are called by autograd with operands that share
        # one structure; ``torch.ops`` calls are never relabelled onto each other
        first = next(a for a in mj_args if isinstance(a, MJT))
        mj_args = [torch.zeros_like(first, dtype=a.dtype) + a if isinstance(a, MJT) and a is not first and a.is_floating_point() else a for a in mj_args]
    return mj_args, mj_leaves, ref_leaves, parts, wholes, batch


def _pieces(out, expected_per_sample, batch, tol, whole: bool):
    """Compare; returns ``[(got_tensor_or_component_list, expected list)]`` of float pieces for
    the gradient check."""
    got = _flat(out)
    pieces = []
    if whole:
        exp = _flat(expected_per_sample)
        if len(got) != len(exp):
            raise Wrong(f"{len(got)} outputs, expected {len(exp)}")
        for k, (a, b) in enumerate(zip(got, exp)):
            if isinstance(a, MJT):
                raise Wrong(f"output {k}: expected a dense result, got a multi_jagged tensor")
            _close(a, b, f"output {k}", tol)
            if isinstance(b, torch.Tensor) and b.is_floating_point() and b.requires_grad:
                pieces.append(([a], [b]))
        return pieces
    exp = [_flat(e) for e in expected_per_sample]
    for i, e in enumerate(exp):
        if len(e) != len(got):
            raise Wrong(f"{len(got)} outputs, the reference of sample {i} has {len(e)}")
    for k, a in enumerate(got):
        col = [e[k] for e in exp]
        if isinstance(a, MJT):
            if a.layout is not mj.multi_jagged:
                raise Wrong(f"output {k}: layout {a.layout}")
            parts = list(a.unbind())
            if len(parts) != batch:
                raise Wrong(f"output {k}: {len(parts)} components for B = {batch}")
            for i, (p, b) in enumerate(zip(parts, col)):
                _close(p, b, f"output {k}, sample {i}", tol)
            if col and isinstance(col[0], torch.Tensor) and col[0].is_floating_point():
                pieces.append((parts, col))
        elif isinstance(a, torch.Tensor):
            if not all(isinstance(b, torch.Tensor) for b in col):
                raise Wrong(f"output {k}: a tensor where the reference gives {type(col[0]).__name__}")
            shapes = {tuple(b.shape) for b in col}
            if len(shapes) > 1:
                raise Wrong(f"output {k}: a dense tensor, but the samples' results have shapes {sorted(shapes)}")
            st = torch.stack(col)
            _close(a, st, f"output {k}", tol)
            if st.is_floating_point():
                pieces.append(([a], [st]))
        else:
            for i, b in enumerate(col):
                _close(a, b, f"output {k}, sample {i}", tol)
    return pieces


def _grads(pieces, mj_leaves, ref_leaves, tol, seed=0):
    gen = _gen(seed)
    loss_mj, loss_ref = 0, 0
    for got, exp in pieces:
        for a, b in zip(got, exp):
            if not (isinstance(b, torch.Tensor) and b.requires_grad and b.grad_fn is not None):
                continue
            cot = torch.randn(b.shape, generator=gen, dtype=b.dtype)
            loss_ref = loss_ref + (b * cot).sum()
            loss_mj = loss_mj + (a * cot).sum()
    if not isinstance(loss_ref, torch.Tensor) or not ref_leaves:
        return
    try:
        g_ref = torch.autograd.grad(loss_ref, ref_leaves, allow_unused=True)
    except RuntimeError:  # the dense op has no derivative here: nothing to compare
        return
    if not isinstance(loss_mj, torch.Tensor) or loss_mj.grad_fn is None:
        if any(g is not None and g.abs().sum() > 0 for g in g_ref):
            raise Wrong("no gradient reaches the inputs")
        return
    try:
        g_mj = torch.autograd.grad(loss_mj, mj_leaves, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        raise _Raised(f"backward: {type(e).__name__}: {_msg(e)}") from e
    for k, (a, b, leaf) in enumerate(zip(g_mj, g_ref, ref_leaves)):
        z = torch.zeros_like(leaf)
        _close(z if a is None else a, z if b is None else b, f"grad of leaf {k}", tol)


class _Raised(Exception):
    pass


def _msg(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:160] if s else ""


def run_case(case: Case) -> tuple[str, str, str]:
    """``(status, detail, traceback)`` of one case."""
    try:
        mj_args, mj_leaves, ref_leaves, parts, wholes, batch = _prepare(case)
    except Exception as e:  # noqa: BLE001
        return "error", f"inputs: {type(e).__name__}: {_msg(e)}", traceback.format_exc()
    try:
        out = case.fn(*mj_args)
    except Exception as e:  # noqa: BLE001
        return "raises", f"{type(e).__name__}: {_msg(e)}", traceback.format_exc()
    try:
        if case.check is not None:
            case.check(out, [[p(i) for p in parts] for i in range(batch)])
            return "pass", "", ""
        ref = case.ref or case.fn
        if case.whole is not None:
            expected = case.whole(*wholes)
        else:
            expected = [ref(*[p(i) for p in parts]) for i in range(batch)]
    except Wrong as e:
        return "wrong", str(e), traceback.format_exc()
    except Exception as e:  # noqa: BLE001
        return "error", f"reference: {type(e).__name__}: {_msg(e)}", traceback.format_exc()
    whole = case.whole is not None
    if isinstance(expected, PerSample):
        expected, whole = expected.parts, False
    try:
        pieces = _pieces(out, expected, batch, case.tol, whole)
        if case.grad:
            _grads(pieces, mj_leaves, ref_leaves, case.tol)
    except Wrong as e:
        return "wrong", str(e), traceback.format_exc()
    except _Raised as e:
        return "raises", str(e), traceback.format_exc()
    except Exception as e:  # noqa: BLE001
        return "raises", f"comparing: {type(e).__name__}: {_msg(e)}", traceback.format_exc()
    return "pass", "", ""


_RANK = {"wrong": 0, "error": 1, "raises": 2, "pass": 3}


def run_op(name: str) -> Row:
    spec = SPECS.get(name)
    if spec is None:
        return Row(name, "error", "no spec in op_coverage.py")
    if isinstance(spec, NA):
        return Row(name, "n/a", spec.reason)
    try:
        cases = spec()
    except Exception as e:  # noqa: BLE001
        return Row(name, "error", f"building cases: {type(e).__name__}: {_msg(e)}", 0, traceback.format_exc())
    if isinstance(cases, Case):
        cases = [cases]
    worst = ("pass", "", "")
    for k, case in enumerate(cases):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            st, detail, tb = run_case(case)
        if _RANK[st] < _RANK[worst[0]]:
            label = case.label or f"case {k}"
            worst = (st, f"[{label}] {detail}", tb)
    return Row(name, worst[0], worst[1], len(cases), worst[2])


def build_table(names: Optional[Sequence[str]] = None) -> list[Row]:
    """One ``Row`` per operator of ``danling_ops.txt`` (or of ``names``)."""
    return [run_op(n) for n in (load_ops() if names is None else names)]


def summary(rows: Sequence[Row]) -> dict[str, int]:
    out = dict.fromkeys(("pass", "wrong", "raises", "n/a", "error"), 0)
    for r in rows:
        out[r.status] += 1
    return out


# ----------------------------------------------------------------------------- helpers for specs
def pd(d: int) -> int:
    """The per-sample dim of batched dim ``d``."""
    return d - 1 if d > 0 else d


def pds(ds) -> tuple:
    return tuple(pd(d) for d in ds)


def batched(f: Callable) -> Callable:
    """Reference for an op whose dense form needs a batch dim: run it on the sample as a batch
    of one. Tuples of tensor outputs are unbatched too."""

    def ref(c, *a, **k):
        out = f(c.unsqueeze(0), *a, **k)
        if isinstance(out, tuple):
            return tuple(o.squeeze(0) if isinstance(o, torch.Tensor) else o for o in out)
        return out.squeeze(0)

    return ref


def method(name: str) -> Callable:
    return lambda x, *a, **k: getattr(x, name)(*a, **k)


def cat_all(cs) -> torch.Tensor:
    """Every element of every component, in order (the reference of a full reduction)."""
    return torch.cat([c.reshape(-1) for c in cs])


def inplace(name: str, *a, **k) -> Callable:
    """``x.clone().name(*a)``: an in-place method on a non-leaf copy (returns the copy)."""

    def f(x, *rest):
        y = x.clone()
        getattr(y, name)(*a, *rest, **k)
        return y

    return f


def inplace_fn(fn: Callable, *a, **k) -> Callable:
    """``fn(y, *a)`` on ``y = x.clone()`` for an in-place function; returns ``y``."""

    def f(x, *rest):
        y = x.clone()
        fn(y, *a, *rest, **k)
        return y

    return f


# random ops: support checks
def check_random(support: Callable[[torch.Tensor, list], bool], dtype=None, what: str = "") -> Callable:
    """``out`` is multi_jagged with sample i of the shape of the first operand's sample i, of
    ``dtype`` (default: the operand's), each value inside the support."""

    def check(out, samples):
        if not isinstance(out, MJT):
            raise Wrong(f"expected a multi_jagged result, got {type(out).__name__}")
        parts = out.unbind()
        if len(parts) != len(samples):
            raise Wrong(f"{len(parts)} components for B = {len(samples)}")
        for i, (p, s) in enumerate(zip(parts, samples)):
            x = s[0]
            if tuple(p.shape) != tuple(x.shape):
                raise Wrong(f"sample {i}: shape {tuple(p.shape)} != {tuple(x.shape)}")
            want = dtype or x.dtype
            if p.dtype != want:
                raise Wrong(f"sample {i}: dtype {p.dtype} != {want}")
            if p.numel() and not bool(support(p.detach(), s)):
                raise Wrong(f"sample {i}: values outside {what or 'the support'}")

    return check


def dropout_support(p: float) -> Callable:
    scale = 1.0 / (1.0 - p)

    def ok(o, s):
        x = s[0].detach()
        return bool(((o == 0) | torch.isclose(o, x * scale)).all())

    return ok


# ----------------------------------------------------------------------------- specs
SPECS: dict[str, Any] = {}


def spec(*names: str):
    def wrapper(fn):
        for n in names:
            SPECS[n] = lambda fn=fn, n=n: fn(n)
        return fn

    return wrapper


def na(reason: str, *names: str) -> None:
    for n in names:
        SPECS[n] = NA(reason)


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


# --- reductions --------------------------------------------------------------------------------
_RED = {
    # name: (call(x, dim, keepdim) or None, accepts a tuple of dims, empty extent ok, differentiable, full reduction)
    "sum": (True, True, True, True), "mean": (True, True, True, True), "nansum": (True, True, True, True),
    "nanmean": (True, True, True, True), "prod": (False, True, True, True), "amax": (True, False, True, True),
    "amin": (True, False, True, True), "logsumexp": (True, True, True, False), "var": (True, True, True, True),
    "std": (True, True, True, True), "all": (True, True, False, True), "any": (True, True, False, True),
    "count_nonzero": (True, True, False, True),
}


@spec(*_RED)
def _reduction(name):
    tup, empty_ok, grad, full = _RED[name]
    f = getattr(torch, name)
    dt = torch.bool if name in ("all", "any") else DT
    lens = LENS if empty_ok else LENS_NZ
    x = seq(dtype=dt, lens=lens)
    kw = lambda d: {"dim": d}  # noqa: E731
    cases = [
        Case(lambda a: f(a, **kw(-1)), (x,), ref=lambda c: f(c, **kw(-1)), grad=grad, label="static dim"),
        Case(lambda a: f(a, **kw(1)), (x,), ref=lambda c: f(c, **kw(0)), grad=grad, label="ragged dim"),
    ]
    if name != "count_nonzero":
        cases.append(Case(lambda a: f(a, 1, keepdim=True), (x,), ref=lambda c: f(c, 0, keepdim=True), grad=grad, label="ragged dim, keepdim"))
    if tup:
        p = pair(dtype=dt, lens=PAIR_LENS if empty_ok else (3, 1, 2))
        cases.append(Case(lambda a: f(a, **kw((1, 2))), (p,), ref=lambda c: f(c, **kw((0, 1))), grad=grad, label="pair, both ragged dims"))
        cases.append(Case(lambda a: f(a, **kw(2)), (p,), ref=lambda c: f(c, **kw(1)), grad=grad, label="pair, one ragged dim"))
    if full:
        cases.append(Case(lambda a: f(a), (x,), whole=lambda cs: f(cat_all(cs)), grad=grad, label="full reduction"))
    return cases


@spec("max", "min")
def _max_min(name):
    f = getattr(torch, name)
    x = seq(lens=LENS_NZ)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: tuple(f(c, -1)), label="dim=-1"),
        Case(lambda a: f(a, 1), (x,), ref=lambda c: tuple(f(c, 0)), label="ragged dim"),
        Case(lambda a: a.max() if name == "max" else a.min(), (seq(),), whole=lambda cs: f(cat_all(cs)), label="full"),
        Case(lambda a, b: f(a, b), (seq(), like(seq())), label="binary"),
    ]


@spec("argmax", "argmin")
def _argmax(name):
    f = getattr(torch, name)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: f(c, -1), label="dim=-1"),
        Case(lambda a: f(a, 1), (seq(lens=LENS_NZ),), ref=lambda c: f(c, 0), label="ragged dim"),
        Case(lambda a: f(a, 2, keepdim=True), (pair(lens=(3, 1, 2)),), ref=lambda c: f(c, 1, keepdim=True), label="pair"),
    ]


@spec("aminmax")
def _aminmax(name):
    return [
        Case(lambda a: tuple(torch.aminmax(a, dim=-1)), (seq(),), ref=lambda c: tuple(torch.aminmax(c, dim=-1))),
        Case(lambda a: tuple(torch.aminmax(a, dim=1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.aminmax(c, dim=0)), label="ragged dim"),
        Case(lambda a: tuple(torch.aminmax(a)), (seq(),), whole=lambda cs: tuple(torch.aminmax(cat_all(cs))), label="full"),
    ]


@spec("var_mean")
def _var_mean(name):
    return [
        Case(lambda a: torch.var_mean(a, dim=-1), (seq(),), ref=lambda c: torch.var_mean(c, dim=-1)),
        Case(lambda a: torch.var_mean(a, dim=1), (seq(),), ref=lambda c: torch.var_mean(c, dim=0), label="ragged dim"),
        Case(lambda a: torch.var_mean(a), (seq(),), whole=lambda cs: torch.var_mean(cat_all(cs)), label="full"),
    ]


@spec("median", "nanmedian", "mode")
def _median(name):
    f = getattr(torch, name)
    cases = [
        Case(lambda a: tuple(f(a, -1)), (seq(),), ref=lambda c: tuple(f(c, -1)), label="dim=-1"),
        Case(lambda a: tuple(f(a, 1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(f(c, 0)), label="ragged dim"),
    ]
    if name != "mode":
        cases.append(Case(lambda a: f(a), (seq(),), whole=lambda cs: f(cat_all(cs)), label="full"))
    return cases


@spec("kthvalue")
def _kthvalue(name):
    return [
        Case(lambda a: tuple(torch.kthvalue(a, 2, -1)), (seq(),), ref=lambda c: tuple(torch.kthvalue(c, 2, -1)), label="dim=-1"),
        Case(lambda a: tuple(torch.kthvalue(a, 1, 1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.kthvalue(c, 1, 0)), label="ragged dim"),
    ]


@spec("quantile", "nanquantile")
def _quantile(name):
    f = getattr(torch, name)
    return [
        Case(lambda a: f(a, 0.3, dim=-1), (seq(),), ref=lambda c: f(c, 0.3, dim=-1), label="dim=-1"),
        Case(lambda a: f(a, 0.3, dim=1), (seq(lens=LENS_NZ),), ref=lambda c: f(c, 0.3, dim=0), label="ragged dim"),
        Case(lambda a: f(a, 0.3), (seq(),), whole=lambda cs: f(cat_all(cs), 0.3), label="full"),
    ]


@spec("linalg_vector_norm", "linalg_norm")
def _norms(name):
    f = torch.linalg.vector_norm if name == "linalg_vector_norm" else torch.linalg.norm
    return [
        Case(lambda a: f(a, dim=-1), (seq(),), ref=lambda c: f(c, dim=-1), label="dim=-1"),
        Case(lambda a: f(a, dim=1), (seq(),), ref=lambda c: f(c, dim=0), label="ragged dim"),
        Case(lambda a: f(a, 3.0, dim=(1, 2)) if name == "linalg_vector_norm" else f(a, "fro", dim=(1, 2)), (pair(),), ref=lambda c: f(c, 3.0, dim=(0, 1)) if name == "linalg_vector_norm" else f(c, "fro", dim=(0, 1)), label="pair"),
    ]


@spec("dist")
def _dist(name):
    x = seq()
    return [Case(lambda a, b: torch.dist(a, b), (x, like(x)), whole=lambda a, b: torch.dist(cat_all(a), cat_all(b))), Case(lambda a, b: torch.dist(a, b, 1.0), (x, like(x)), whole=lambda a, b: torch.dist(cat_all(a), cat_all(b), 1.0), label="p = 1")]


@spec("numel")
def _numel(name):
    return [Case(lambda a: a.numel(), (seq(),), whole=lambda cs: sum(c.numel() for c in cs), grad=False), Case(torch.numel, (pair(),), whole=lambda cs: sum(c.numel() for c in cs), grad=False)]


@spec("equal", "allclose")
def _equal(name):
    f = getattr(torch, name)
    x = seq()
    return [
        Case(f, (x, x), whole=lambda a, b: all(f(p, q) for p, q in zip(a, b)), grad=False, label="same values"),
        Case(f, (x, like(x)), whole=lambda a, b: all(f(p, q) for p, q in zip(a, b)), grad=False, label="different values"),
    ]


# --- scans and order ---------------------------------------------------------------------------
@spec("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
def _scans(name):
    f = getattr(torch, name)
    t = (lambda o: tuple(o)) if name in ("cummax", "cummin") else (lambda o: o)
    return [
        Case(lambda a: t(f(a, -1)), (seq(),), ref=lambda c: t(f(c, -1)), label="dim=-1"),
        Case(lambda a: t(f(a, 1)), (seq(),), ref=lambda c: t(f(c, 0)), label="ragged dim"),
        Case(lambda a: t(f(a, 2)), (pair(),), ref=lambda c: t(f(c, 1)), label="pair, second ragged dim"),
    ]


@spec("sort", "argsort")
def _sort(name):
    f = getattr(torch, name)
    t = (lambda o: tuple(o)) if name == "sort" else (lambda o: o)
    return [
        Case(lambda a: t(f(a, -1)), (seq(),), ref=lambda c: t(f(c, -1)), label="dim=-1"),
        Case(lambda a: t(f(a, 1, descending=True)), (seq(),), ref=lambda c: t(f(c, 0, descending=True)), label="ragged dim"),
        Case(lambda a: t(f(a, dim=2, stable=True)), (pair(),), ref=lambda c: t(f(c, dim=1, stable=True)), label="pair"),
    ]


@spec("topk")
def _topk(name):
    return [
        Case(lambda a: tuple(torch.topk(a, 2, -1)), (seq(),), ref=lambda c: tuple(torch.topk(c, 2, -1)), label="dim=-1"),
        Case(lambda a: tuple(torch.topk(a, 1, 1, largest=False)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.topk(c, 1, 0, largest=False)), label="ragged dim"),
    ]


# --- softmax family ----------------------------------------------------------------------------
@spec("softmax", "log_softmax", "softmin")
def _softmax(name):
    f = getattr(F, name)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: f(c, -1), label="dim=-1"),
        Case(lambda a: f(a, 1), (seq(),), ref=lambda c: f(c, 0), label="ragged dim"),
        Case(lambda a: f(a, -2), (pair(),), ref=lambda c: f(c, -2), label="pair, ragged dim"),
        Case(lambda a: getattr(a, name)(-1) if name != "softmin" else F.softmin(a, -1), (pair(),), ref=lambda c: f(c, -1), label="method"),
    ]


@spec("gumbel_softmax")
def _gumbel(name):
    def soft(o, s):
        return bool(((o >= 0) & (o <= 1)).all() and torch.allclose(o.sum(-1), torch.ones((), dtype=o.dtype)))

    def hard(o, s):
        return bool(((o == 0) | (o == 1)).all() and (o.sum(-1) == 1).all())

    return [
        Case(lambda a: F.gumbel_softmax(a, tau=0.5, dim=-1), (seq(),), check=check_random(soft), grad=False, label="soft"),
        Case(lambda a: F.gumbel_softmax(a, hard=True, dim=-1), (seq(),), check=check_random(hard), grad=False, label="hard"),
    ]


# --- shape --------------------------------------------------------------------------------------
@spec("chunk", "split")
def _chunk(name):
    if name == "chunk":
        return [Case(lambda a: torch.chunk(a, 2, -1), (seq(c=4),), ref=lambda c: torch.chunk(c, 2, -1)), Case(lambda a: a.chunk(3, dim=-1), (pair(c=3),), ref=lambda c: c.chunk(3, -1))]
    return [
        Case(lambda a: torch.split(a, 1, -1), (seq(),), ref=lambda c: torch.split(c, 1, -1)),
        Case(lambda a: a.split([1, 2], dim=-1), (pair(c=3),), ref=lambda c: c.split([1, 2], -1)),
    ]


@spec("unbind")
def _unbind(name):
    return [
        Case(lambda a: a.unbind(), (seq(),), whole=lambda cs: tuple(cs), label="batch dim"),
        Case(lambda a: torch.unbind(a, -1), (seq(),), ref=lambda c: torch.unbind(c, -1), label="static dim"),
    ]


@spec("flatten")
def _flatten(name):
    return [
        Case(lambda a: a.flatten(-2), (seq4(),), ref=lambda c: c.flatten(-2), label="static dims"),
        Case(lambda a: torch.flatten(a, 1, 2), (pair(),), ref=lambda c: torch.flatten(c, 0, 1), label="both ragged dims of a pair"),
        Case(lambda a: a.flatten(1, 2), (seq4(),), ref=lambda c: c.flatten(0, 1), label="ragged with static"),
    ]


@spec("unflatten")
def _unflatten(name):
    return [Case(lambda a: a.unflatten(-1, (2, 3)), (seq(c=6),), ref=lambda c: c.unflatten(-1, (2, 3))), Case(lambda a: torch.unflatten(a, 3, (2, -1)), (pair(c=4),), ref=lambda c: torch.unflatten(c, 2, (2, -1)))]


@spec("reshape", "view", "view_copy")
def _reshape(name):
    if name == "view_copy":
        f = lambda a, shape: torch.view_copy(a, shape)  # noqa: E731
    else:
        f = lambda a, shape: getattr(a, name)(shape)  # noqa: E731
    return [
        Case(lambda a: f(a, (a.shape[0], a.shape[1], 2, 3)), (seq(c=6),), ref=lambda c: f(c, (c.shape[0], 2, 3)), label="split the static dim"),
        Case(lambda a: f(a, (a.shape[0], a.shape[1], 6)), (seq4(),), ref=lambda c: f(c, (c.shape[0], 6)), label="merge static dims"),
        Case(lambda a: f(a, (a.shape[0], -1, 6)), (seq4(),), ref=lambda c: f(c, (-1, 6)), label="-1 for the ragged dim"),
    ]


@spec("squeeze")
def _squeeze(name):
    return [
        Case(lambda a: a.squeeze(2), (seq4(s=1),), ref=lambda c: c.squeeze(1)),
        Case(lambda a: torch.squeeze(a, -1), (pair(c=1),), ref=lambda c: c.squeeze(-1)),
    ]


@spec("unsqueeze")
def _unsqueeze(name):
    return [Case(lambda a: a.unsqueeze(-1), (seq(),), ref=lambda c: c.unsqueeze(-1)), Case(lambda a: torch.unsqueeze(a, 2), (seq(),), ref=lambda c: c.unsqueeze(1)), Case(lambda a: a.unsqueeze(1), (pair(),), ref=lambda c: c.unsqueeze(0))]


@spec("permute")
def _permute(name):
    return [
        Case(lambda a: a.permute(0, 3, 1, 2), (seq4(),), ref=lambda c: c.permute(2, 0, 1)),
        Case(lambda a: torch.permute(a, (0, 2, 1, 3)), (pair(),), ref=lambda c: c.permute(1, 0, 2), label="swap ragged dims"),
    ]


@spec("transpose", "swapaxes", "swapdims")
def _transpose(name):
    return [
        Case(lambda a: getattr(torch, name)(a, 1, 2), (seq(),), ref=lambda c: getattr(torch, name)(c, 0, 1), label="ragged <-> static"),
        Case(lambda a: getattr(a, name)(1, 2), (pair(),), ref=lambda c: getattr(c, name)(0, 1), label="pair"),
        Case(lambda a: getattr(a, name)(-1, -2), (seq4(),), ref=lambda c: getattr(c, name)(-1, -2), label="static dims"),
    ]


@spec("movedim", "moveaxis")
def _movedim(name):
    f = getattr(torch, name)
    return [Case(lambda a: f(a, -1, 1), (seq(),), ref=lambda c: f(c, -1, 0)), Case(lambda a: getattr(a, name)(3, 1), (pair(),), ref=lambda c: f(c, 2, 0))]


@spec("expand")
def _expand(name):
    return [
        Case(lambda a: a.unsqueeze(2).expand(-1, -1, 4, -1), (seq(),), ref=lambda c: c.unsqueeze(1).expand(-1, 4, -1)),
        Case(lambda a: a.expand(a.shape[0], a.shape[1], 3), (seq(c=1),), ref=lambda c: c.expand(c.shape[0], 3)),
    ]


@spec("flip")
def _flip(name):
    return [Case(lambda a: torch.flip(a, (1,)), (seq(),), ref=lambda c: torch.flip(c, (0,)), label="ragged dim"), Case(lambda a: a.flip(-1), (seq(),), ref=lambda c: c.flip(-1)), Case(lambda a: a.flip(1, 2), (pair(),), ref=lambda c: c.flip(0, 1), label="pair")]


@spec("roll")
def _roll(name):
    return [Case(lambda a: torch.roll(a, 1, 1), (seq(),), ref=lambda c: torch.roll(c, 1, 0), label="ragged dim"), Case(lambda a: a.roll(-1, -1), (seq(),), ref=lambda c: c.roll(-1, -1))]


@spec("rot90")
def _rot90(name):
    return [Case(lambda a: torch.rot90(a, 1, (2, 3)), (seq4(),), ref=lambda c: torch.rot90(c, 1, (1, 2)), label="static dims"), Case(lambda a: a.rot90(1, (1, 2)), (pair(),), ref=lambda c: c.rot90(1, (0, 1)), label="ragged dims")]


@spec("tril", "triu")
def _tri(name):
    f = getattr(torch, name)
    return [Case(lambda a: f(a), (sq(),), ref=f, label="ragged square"), Case(lambda a: getattr(a, name)(1), (mats(),), ref=lambda c: f(c, 1), label="static matrices")]


@spec("diagonal")
def _diagonal(name):
    return [
        Case(lambda a: a.diagonal(dim1=1, dim2=2), (pair(),), ref=lambda c: c.diagonal(dim1=0, dim2=1), label="ragged dims"),
        Case(lambda a: torch.diagonal(a, 0, -2, -1), (mats(),), ref=lambda c: torch.diagonal(c, 0, -2, -1), label="static dims"),
    ]


@spec("diag")
def _diag(name):
    return [Case(torch.diag, (vec(),), label="vector -> matrix"), Case(torch.diag, (sq(),), label="matrix -> diagonal")]


@spec("diagflat")
def _diagflat(name):
    return [Case(torch.diagflat, (vec(),))]


@spec("trace")
def _trace(name):
    return [Case(torch.trace, (sq(),)), Case(method("trace"), (sqm(),), ref=torch.trace)]


@spec("stack", "cat", "concat", "concatenate")
def _join(name):
    f = getattr(torch, name)
    x = seq()
    if name == "stack":
        return [Case(lambda a, b: f([a, b], -1), (x, like(x)), ref=lambda a, b: f([a, b], -1)), Case(lambda a, b: f([a, b], 2), (x, like(x)), ref=lambda a, b: f([a, b], 1)), Case(lambda a, b: f((a, b), 1), (pair(), like(pair())), ref=lambda a, b: f((a, b), 0), label="before the ragged dims")]
    return [
        Case(lambda a, b: f([a, b], -1), (x, like(x)), ref=lambda a, b: f([a, b], -1), label="static dim"),
        Case(lambda a, b: f([a, b], 1), (x, like(x)), ref=lambda a, b: f([a, b], 0), label="ragged dim"),
        Case(lambda a, b: f([a, b], dim=-1), (pair(), like(pair())), ref=lambda a, b: f([a, b], -1), label="pair"),
    ]


@spec("broadcast_tensors")
def _broadcast_tensors(name):
    x = seq()
    return [Case(lambda a, b: torch.broadcast_tensors(a, b), (x, dense(3)), ref=lambda a, b: torch.broadcast_tensors(a, b)), Case(lambda a, b: torch.broadcast_tensors(a, b), (x, like(x)), ref=lambda a, b: torch.broadcast_tensors(a, b))]


@spec("repeat_interleave")
def _repeat_interleave(name):
    return [Case(lambda a: a.repeat_interleave(2, dim=-1), (seq(),), ref=lambda c: c.repeat_interleave(2, dim=-1)), Case(lambda a: torch.repeat_interleave(a, 2, dim=1), (seq(),), ref=lambda c: torch.repeat_interleave(c, 2, dim=0), label="ragged dim")]


@spec("take")
def _take(name):
    x = seq()
    return [Case(torch.take, (x, idx_like(x, lambda c: c.numel(), lambda c: (c.shape[0],))))]


@spec("take_along_dim")
def _take_along_dim(name):
    x = seq()
    return [
        Case(lambda a, i: torch.take_along_dim(a, i, -1), (x, idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))), ref=lambda a, i: torch.take_along_dim(a, i, -1)),
        Case(lambda a, i: torch.take_along_dim(a, i, 1), (x, idx_like(x, lambda c: c.shape[0], lambda c: c.shape)), ref=lambda a, i: torch.take_along_dim(a, i, 0), label="ragged dim"),
    ]


@spec("gather")
def _gather(name):
    x = seq()
    return [
        Case(lambda a, i: a.gather(-1, i), (x, idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))), ref=lambda a, i: a.gather(-1, i)),
        Case(lambda a, i: torch.gather(a, 1, i), (x, idx_like(x, lambda c: c.shape[0], lambda c: c.shape)), ref=lambda a, i: torch.gather(a, 0, i), label="ragged dim"),
    ]


@spec("scatter", "scatter_add", "scatter_reduce")
def _scatter(name):
    x = seq()
    i = idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))
    src = R(comps([(c.shape[0], 2) for c in x.comps], 5), (1,))
    f = {"scatter": torch.scatter, "scatter_add": torch.scatter_add, "scatter_reduce": lambda a, d, i, s: torch.scatter_reduce(a, d, i, s, "amax")}[name]
    cases = [Case(lambda a, i, s: f(a, -1, i, s), (x, i, src), ref=lambda a, i, s: f(a, -1, i, s), label="static dim")]
    iy = idx_like(x, lambda c: c.shape[0], lambda c: c.shape, seed=9)
    cases.append(Case(lambda a, i, s: f(a, 1, i, s), (x, iy, like(x, 6)), ref=lambda a, i, s: f(a, 0, i, s), label="ragged dim"))
    if name == "scatter":
        cases.append(Case(lambda a, i: a.scatter(-1, i, 0.5), (x, i), ref=lambda a, i: a.scatter(-1, i, 0.5), label="value"))
    return cases


@spec("index_select")
def _index_select(name):
    ix = torch.tensor([2, 0, 2])
    return [Case(lambda a: torch.index_select(a, -1, ix), (seq(),), ref=lambda c: torch.index_select(c, -1, ix)), Case(lambda a: a.index_select(3, ix[:2].clamp(max=1)), (pair(),), ref=lambda c: c.index_select(2, ix[:2].clamp(max=1)))]


@spec("index_add", "index_copy")
def _index_add(name):
    ix = torch.tensor([2, 0])
    x = seq()
    src = R(comps([(c.shape[0], 2) for c in x.comps], 5), (1,))
    f = getattr(torch, name)
    return [Case(lambda a, s: f(a, -1, ix, s), (x, src), ref=lambda a, s: f(a, -1, ix, s))]


@spec("index_put")
def _index_put(name):
    x = seq()
    m = like(x, 5, dtype=torch.bool)
    v = torch.tensor(0.5, dtype=DT)
    return [
        Case(lambda a, b: torch.index_put(a, (b,), v), (x, m), ref=lambda a, b: torch.index_put(a, (b,), v), label="boolean mask"),
        Case(lambda a, b: a.index_put((b,), v, accumulate=True), (x, m), ref=lambda a, b: a.index_put((b,), v, accumulate=True), label="accumulate"),
    ]


@spec("masked_select")
def _masked_select(name):
    x = seq()
    return [Case(torch.masked_select, (x, like(x, 5, dtype=torch.bool)))]


@spec("nonzero")
def _nonzero(name):
    return [Case(torch.nonzero, (seq(dtype=torch.int64),), grad=False), Case(method("nonzero"), (pair(dtype=torch.bool),), ref=torch.nonzero, grad=False)]


@spec("isin")
def _isin(name):
    te = torch.tensor([0, 2, -3])
    return [Case(lambda a: torch.isin(a, te), (seq(dtype=torch.int64),), ref=lambda c: torch.isin(c, te)), Case(lambda a: torch.isin(a, 2), (seq(dtype=torch.int64),), ref=lambda c: torch.isin(c, 2), label="scalar")]


@spec("searchsorted", "bucketize")
def _search(name):
    bounds = torch.tensor([-1.0, 0.0, 0.5, 1.5], dtype=DT)
    if name == "bucketize":
        return [Case(lambda a: torch.bucketize(a, bounds), (seq(),), ref=lambda c: torch.bucketize(c, bounds)), Case(lambda a: torch.bucketize(a, bounds, right=True), (pair(),), ref=lambda c: torch.bucketize(c, bounds, right=True))]
    sorted_seq = R([c.sort().values for c in vec(seed=4).comps], (1,))
    return [
        Case(lambda a: torch.searchsorted(bounds, a), (seq(),), ref=lambda c: torch.searchsorted(bounds, c), label="dense boundaries"),
        Case(lambda s, v: torch.searchsorted(s, v), (sorted_seq, vec(seed=5)), label="ragged boundaries per sample"),
    ]


@spec("constant_pad_nd", "pad")
def _pad(name):
    f = (lambda a, p, v=0.5: torch.constant_pad_nd(a, p, v)) if name == "constant_pad_nd" else (lambda a, p, v=0.5: F.pad(a, p, value=v))
    cases = [
        Case(lambda a: f(a, (1, 2)), (seq(),), ref=lambda c: f(c, (1, 2)), label="static dim"),
        Case(lambda a: f(a, (0, 0, 1, 2)), (seq(),), ref=lambda c: f(c, (0, 0, 1, 2)), label="ragged dim"),
    ]
    if name == "pad":
        cases.append(Case(lambda a: F.pad(a, (1, 1), mode="reflect"), (chans(lens=(3, 2, 4)),), ref=lambda c: F.pad(c, (1, 1), mode="reflect"), label="reflect along the ragged dim"))
        cases.append(Case(lambda a: F.pad(a, (1, 1, 1, 1), mode="replicate"), (img(),), ref=lambda c: F.pad(c, (1, 1, 1, 1), mode="replicate"), label="replicate, image"))
    return cases


@spec("one_hot")
def _one_hot(name):
    x = vec(dtype=torch.int64)
    x = R([c.abs() % 4 for c in x.comps], (1,))
    return [Case(lambda a: F.one_hot(a, 4), (x,), ref=lambda c: F.one_hot(c, 4))]


# --- nn ------------------------------------------------------------------------------------------
@spec("linear")
def _linear(name):
    w, b = dense(4, 3, seed=1), dense(4, seed=2)
    return [Case(F.linear, (seq(), w, b)), Case(F.linear, (pair(c=3), w)), Case(lambda a, w: a @ w.t(), (seq(), w), ref=lambda a, w: a @ w.t(), label="x @ w.T")]


@spec("bilinear")
def _bilinear(name):
    x = seq()
    w, b = dense(4, 3, 2, seed=1), dense(4, seed=2)
    return [Case(F.bilinear, (x, R(comps([(c.shape[0], 2) for c in x.comps], 3), (1,)), w, b))]


@spec("layer_norm", "rms_norm")
def _layer_norm(name):
    f = getattr(F, name)
    w = dense(3, seed=1)
    cases = [Case(lambda a, w: f(a, (3,), w), (seq(), w), ref=lambda a, w: f(a, (3,), w)), Case(lambda a: f(a, (2,)), (pair(),), ref=lambda c: f(c, (2,)), label="pair")]
    if name == "layer_norm":
        cases.append(Case(lambda a, w, b: F.layer_norm(a, (3,), w, b), (seq(), w, dense(3, seed=2)), ref=lambda a, w, b: F.layer_norm(a, (3,), w, b), label="bias"))
    return cases


@spec("group_norm")
def _group_norm(name):
    w, b = dense(4, seed=1), dense(4, seed=2)
    return [Case(lambda a, w, b: F.group_norm(a, 2, w, b), (chans(c=4, lens=LENS_NZ), w, b), ref=batched(lambda a, w, b: F.group_norm(a, 2, w, b))), Case(lambda a: F.group_norm(a, 1), (img(),), ref=batched(lambda a: F.group_norm(a, 1)), label="image")]


@spec("instance_norm")
def _instance_norm(name):
    return [Case(F.instance_norm, (chans(lens=(3, 2, 4)),), ref=batched(F.instance_norm)), Case(lambda a, w, b: F.instance_norm(a, weight=w, bias=b), (img(), dense(2, seed=1), dense(2, seed=2)), ref=batched(lambda a, w, b: F.instance_norm(a, weight=w, bias=b)), label="image")]


@spec("batch_norm")
def _batch_norm(name):
    rm, rv = dense(2, seed=3), dense(2, seed=4, dom="pos")
    w, b = dense(2, seed=1), dense(2, seed=2)

    def train_whole(xs, w, b):  # statistics over every position of every sample
        allpos = torch.cat([x.reshape(2, -1) for x in xs], 1)
        mean, var = allpos.mean(1), allpos.var(1, unbiased=False)
        shape = (2,) + (1,) * (xs[0].dim() - 1)
        return tuple((x - mean.view(shape)) / torch.sqrt(var.view(shape) + 1e-5) * w.view(shape) + b.view(shape) for x in xs)

    return [
        Case(lambda a, w, b: F.batch_norm(a, rm.clone(), rv.clone(), w, b, training=False), (chans(), w, b), ref=batched(lambda a, w, b: F.batch_norm(a, rm.clone(), rv.clone(), w, b, training=False)), label="eval"),
        Case(lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), (chans(), w, b), whole=lambda xs, w, b: PerSample(train_whole(xs, w, b)), label="training, over every sample"),
        Case(lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), (img(), w, b), whole=lambda xs, w, b: PerSample(train_whole(xs, w, b)), label="training, images"),
    ]


@spec("local_response_norm")
def _lrn(name):
    return [Case(lambda a: F.local_response_norm(a, 2), (chans(c=4),), ref=batched(lambda a: F.local_response_norm(a, 2))), Case(lambda a: F.local_response_norm(a, 3), (img(c=3),), ref=batched(lambda a: F.local_response_norm(a, 3)), label="image")]


@spec("normalize")
def _normalize(name):
    return [Case(lambda a: F.normalize(a, dim=-1), (seq(),), ref=lambda c: F.normalize(c, dim=-1)), Case(lambda a: F.normalize(a, dim=1), (seq(),), ref=lambda c: F.normalize(c, dim=0), label="ragged dim"), Case(lambda a: F.normalize(a, p=1, dim=-1), (pair(),), ref=lambda c: F.normalize(c, p=1, dim=-1))]


@spec("embedding")
def _embedding(name):
    w = dense(5, 3, seed=1)
    ix = R([c.abs() % 5 for c in vec(dtype=torch.int64).comps], (1,))
    return [Case(F.embedding, (ix, w)), Case(lambda i, w: F.embedding(i, w, padding_idx=0), (ix, w), ref=lambda i, w: F.embedding(i, w, padding_idx=0), label="padding_idx")]


@spec("embedding_bag")
def _embedding_bag(name):
    w = dense(5, 3, seed=1)
    ix = R([c.abs() % 5 for c in vec(dtype=torch.int64).comps], (1,))
    return [Case(lambda i, w: F.embedding_bag(i, w, mode="mean"), (ix, w), ref=lambda i, w: _bag(i, w, "mean")), Case(lambda i, w: F.embedding_bag(i, w, mode="sum"), (ix, w), ref=lambda i, w: _bag(i, w, "sum"), label="sum")]


def _bag(i, w, mode):
    """One bag per sample (an empty one gives zeros)."""
    return F.embedding_bag(i, w, torch.zeros(1, dtype=torch.int64), mode=mode)[0]


@spec("interpolate")
def _interpolate(name):
    return [
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), (chans(lens=(3, 2, 4)),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="nearest")), label="1-d nearest"),
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="linear"), (chans(lens=(3, 2, 4)),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="linear")), label="1-d linear"),
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), (img(),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear")), label="bilinear"),
    ]


@spec("grid_sample")
def _grid_sample(name):
    x = img()
    grid = R(comps([(n, 3, 2) for n in (2, 0, 3)], 4, dom="unit"), (1,))
    return [Case(lambda a, g: F.grid_sample(a, g, align_corners=False), (x, grid), ref=lambda a, g: F.grid_sample(a.unsqueeze(0), g.unsqueeze(0), align_corners=False).squeeze(0))]


@spec("pixel_shuffle", "pixel_unshuffle")
def _pixel(name):
    f = getattr(F, name)
    x = img(c=4) if name == "pixel_shuffle" else img(hw=HW_EVEN)
    return [Case(lambda a: f(a, 2), (x,), ref=lambda c: f(c, 2))]


@spec("channel_shuffle")
def _channel_shuffle(name):
    return [Case(lambda a: F.channel_shuffle(a, 2), (chans(c=4),), ref=batched(lambda a: F.channel_shuffle(a, 2))), Case(lambda a: F.channel_shuffle(a, 2), (img(c=4),), ref=batched(lambda a: F.channel_shuffle(a, 2)), label="image")]


@spec("unfold")
def _unfold(name):
    return [Case(lambda a: F.unfold(a, 2), (img(),), ref=batched(lambda a: F.unfold(a, 2))), Case(lambda a: F.unfold(a, 2, padding=1, stride=2), (img(),), ref=batched(lambda a: F.unfold(a, 2, padding=1, stride=2)), label="padding, stride")]


@spec("fold")
def _fold(name):
    # one output size for the batch: the samples have equal lengths
    x = chans(c=8, lens=(4, 4, 4))
    return [Case(lambda a: F.fold(a, (3, 3), 2), (x,), ref=batched(lambda a: F.fold(a, (3, 3), 2)))]


# convolutions and pools
@spec("conv1d", "conv_transpose1d")
def _conv1d(name):
    f = getattr(F, name)
    w = dense(3, 2, 3, seed=1) if name == "conv1d" else dense(2, 3, 3, seed=1)  # 2 channels in, 3 out
    b = dense(3, seed=2)
    return [Case(lambda a, w, b: f(a, w, b, padding=1), (chans(lens=(3, 2, 4)), w, b), ref=batched(lambda a, w, b: f(a, w, b, padding=1)))] + (
        [Case(lambda a, w: f(a, w, stride=2), (chans(lens=(3, 4, 5)), w), ref=batched(lambda a, w: f(a, w, stride=2)), label="stride 2")] if name == "conv1d" else []
    )


@spec("conv2d", "conv_transpose2d")
def _conv2d(name):
    f = getattr(F, name)
    w = dense(3, 2, 3, 3, seed=1) if name == "conv2d" else dense(2, 3, 3, 3, seed=1)
    b = dense(3, seed=2)
    return [Case(lambda a, w, b: f(a, w, b, padding=1), (img(), w, b), ref=batched(lambda a, w, b: f(a, w, b, padding=1)))]


@spec("conv3d", "conv_transpose3d")
def _conv3d(name):
    f = getattr(F, name)
    w = dense(1, 2, 3, 3, 3, seed=1)
    return [Case(lambda a, w: f(a, w, padding=1), (vol(), w), ref=batched(lambda a, w: f(a, w, padding=1)))]


_POOLS = {
    "avg_pool1d": (lambda a: F.avg_pool1d(a, 2), "1"), "avg_pool2d": (lambda a: F.avg_pool2d(a, 2), "2"),
    "avg_pool3d": (lambda a: F.avg_pool3d(a, 2), "3"), "max_pool1d": (lambda a: F.max_pool1d(a, 2), "1"),
    "max_pool2d": (lambda a: F.max_pool2d(a, 2, 1), "2"), "max_pool3d": (lambda a: F.max_pool3d(a, 2), "3"),
    "max_pool1d_with_indices": (lambda a: F.max_pool1d(a, 2, return_indices=True), "1"),
    "max_pool2d_with_indices": (lambda a: F.max_pool2d(a, 2, return_indices=True), "2"),
    "max_pool3d_with_indices": (lambda a: F.max_pool3d(a, 2, return_indices=True), "3"),
    "adaptive_avg_pool1d": (lambda a: F.adaptive_avg_pool1d(a, 2), "1"), "adaptive_avg_pool2d": (lambda a: F.adaptive_avg_pool2d(a, 2), "2"),
    "adaptive_avg_pool3d": (lambda a: F.adaptive_avg_pool3d(a, 2), "3"), "adaptive_max_pool1d": (lambda a: F.adaptive_max_pool1d(a, 2), "1"),
    "adaptive_max_pool2d": (lambda a: F.adaptive_max_pool2d(a, 2), "2"), "adaptive_max_pool3d": (lambda a: F.adaptive_max_pool3d(a, 2), "3"),
    "adaptive_max_pool1d_with_indices": (lambda a: F.adaptive_max_pool1d(a, 2, return_indices=True), "1"),
    "adaptive_max_pool2d_with_indices": (lambda a: F.adaptive_max_pool2d(a, 2, return_indices=True), "2"),
    "adaptive_max_pool3d_with_indices": (lambda a: F.adaptive_max_pool3d(a, 2, return_indices=True), "3"),
    "lp_pool1d": (lambda a: F.lp_pool1d(a, 2, 2), "1"), "lp_pool2d": (lambda a: F.lp_pool2d(a, 2, 2), "2"),
    "lp_pool3d": (lambda a: F.lp_pool3d(a, 2, 2), "3"),
}


def _spatial(rank: str, even: bool = False) -> R:
    if rank == "1":
        return chans(lens=(4, 2, 6) if even else (3, 2, 5))
    if rank == "2":
        return img(hw=HW_EVEN if even else ((3, 4), (2, 2), (5, 3)))
    return vol(dhw=((2, 4, 2), (4, 2, 2)))


@spec(*_POOLS)
def _pool(name):
    f, rank = _POOLS[name]
    t = (lambda o: tuple(o) if isinstance(o, tuple) else o)
    return [Case(lambda a: t(f(a)), (_spatial(rank),), ref=batched(f))]


@spec("fractional_max_pool2d", "fractional_max_pool2d_with_indices", "fractional_max_pool3d", "fractional_max_pool3d_with_indices")
def _fractional(name):
    three = "3d" in name
    f = F.fractional_max_pool3d if three else F.fractional_max_pool2d
    ri = "with_indices" in name
    x = vol(dhw=((4, 4, 4), (6, 4, 4))) if three else img(hw=HW_EVEN)
    samples = PS(torch.rand(len(x.comps), x.comps[0].shape[0], 3 if three else 2, generator=_gen(2), dtype=DT))
    call = lambda a, s: f(a, 2, output_ratio=0.5, return_indices=ri, _random_samples=s)  # noqa: E731
    ref = lambda a, s: batched(lambda aa: f(aa, 2, output_ratio=0.5, return_indices=ri, _random_samples=s.unsqueeze(0)))(a)  # noqa: E731
    return [Case(lambda a, s: (tuple(call(a, s)) if ri else call(a, s)), (x, samples), ref=ref, grad=True)]


@spec("max_unpool1d", "max_unpool2d", "max_unpool3d")
def _unpool(name):
    rank = name[-2]
    pool = {"1": F.max_pool1d, "2": F.max_pool2d, "3": F.max_pool3d}[rank]
    unpool = getattr(F, name)

    def f(a):
        y, i = pool(a, 2, return_indices=True)
        return unpool(y, i, 2)

    return [Case(f, (_spatial(rank, even=True),), ref=batched(f))]


# --- losses ------------------------------------------------------------------------------------
def _loss_cases(f: Callable, make_args: Callable[[], tuple], elementwise: bool = True, **kw) -> list[Case]:
    """``reduction='none'`` per sample (elementwise losses), ``'sum'`` and ``'mean'`` over the whole
    batch (dense torch's reduction of the concatenated samples)."""
    args = make_args()

    def flat(*parts):  # the samples concatenated along their first dim: one dense call
        return tuple(torch.cat(p, 0) if isinstance(p, list) else p for p in parts)

    cases = []
    if elementwise:
        cases.append(Case(lambda *a: f(*a, reduction="none", **kw), args, ref=lambda *a: f(*a, reduction="none", **kw), label="none"))
    cases.append(Case(lambda *a: f(*a, reduction="sum", **kw), args, whole=lambda *a: f(*flat(*a), reduction="sum", **kw), label="sum"))
    cases.append(Case(lambda *a: f(*a, reduction="mean", **kw), args, whole=lambda *a: f(*flat(*a), reduction="mean", **kw), label="mean"))
    return cases


_ELEMENTWISE_LOSSES = {
    "l1_loss": (F.l1_loss, None, None, {}), "mse_loss": (F.mse_loss, None, None, {}),
    "smooth_l1_loss": (F.smooth_l1_loss, None, None, {"beta": 0.5}), "huber_loss": (F.huber_loss, None, None, {"delta": 0.5}),
    "soft_margin_loss": (F.soft_margin_loss, None, "sign", {}), "binary_cross_entropy": (F.binary_cross_entropy, "prob", "prob", {}),
    "binary_cross_entropy_with_logits": (F.binary_cross_entropy_with_logits, None, "prob", {}),
    "kl_div": (F.kl_div, None, "prob", {}), "poisson_nll_loss": (F.poisson_nll_loss, None, "pos", {}),
    "hinge_embedding_loss": (F.hinge_embedding_loss, None, "sign", {}),
}


@spec(*_ELEMENTWISE_LOSSES)
def _elementwise_loss(name):
    f, dx, dy, kw = _ELEMENTWISE_LOSSES[name]

    def make():
        x = seq(dom=dx)
        return (x, like(x, 3, dom=dy).const())

    cases = _loss_cases(f, make, **kw)
    if name == "kl_div":
        cases.append(Case(lambda a, b: F.kl_div(a, b, reduction="batchmean"), make(), whole=lambda a, b: sum(F.kl_div(p, q, reduction="sum") for p, q in zip(a, b)) / len(a), label="batchmean"))
    return cases


@spec("gaussian_nll_loss")
def _gaussian_nll(name):
    def make():
        x = seq()
        return (x, like(x, 3).const(), like(x, 4, dom="pos"))

    return _loss_cases(F.gaussian_nll_loss, make)


@spec("margin_ranking_loss")
def _margin_ranking(name):
    def make():
        x = vec()
        return (x, like(x, 3), like(x, 4, dom="sign").const())

    return _loss_cases(lambda a, b, y, **k: F.margin_ranking_loss(a, b, y, margin=0.2, **k), make)


@spec("cosine_embedding_loss")
def _cosine_embedding(name):
    def make():
        x = seq()
        return (x, like(x, 3), vec(seed=4, dom="sign").const())

    return _loss_cases(F.cosine_embedding_loss, make)


@spec("triplet_margin_loss", "triplet_margin_with_distance_loss")
def _triplet(name):
    f = F.triplet_margin_loss if name == "triplet_margin_loss" else (lambda a, p, n, **k: F.triplet_margin_with_distance_loss(a, p, n, distance_function=lambda u, v: (u - v).abs().sum(-1), **k))

    def make():
        x = seq()
        return (x, like(x, 3), like(x, 4))

    return _loss_cases(f, make)


@spec("multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "cross_entropy", "nll_loss")
def _class_losses(name):
    c = 4

    def make():
        x = seq(c=c, lens=(3, 0, 2, 4))
        if name == "multilabel_margin_loss":
            y = R([torch.where(torch.arange(c) < 2, (torch.arange(c) + i) % c, -1).expand(n, c).clone() for i, n in enumerate(LENS)], (1,))
        elif name == "multilabel_soft_margin_loss":
            y = like(x, 3, dom="bin").const()
        else:
            y = R([t.abs() % c for t in vec(seed=3, dtype=torch.int64).comps], (1,))
        return (x, y)

    f = {
        "multi_margin_loss": F.multi_margin_loss, "multilabel_margin_loss": F.multilabel_margin_loss,
        "multilabel_soft_margin_loss": F.multilabel_soft_margin_loss, "cross_entropy": F.cross_entropy,
        "nll_loss": lambda a, t, **k: F.nll_loss(F.log_softmax(a, 1), t, **k),
    }[name]
    if name in ("cross_entropy", "nll_loss"):
        # the class dim is dim 1, as in dense torch: a (B, j0, C) batch goes in as (B, C, j0)
        g = lambda a, t, **k: f(a.transpose(1, 2), t, **k)  # noqa: E731
        cases = [Case(lambda a, t: g(a, t, reduction="none"), make(), ref=lambda a, t: f(a, t, reduction="none"), label="none")]
        cases.append(Case(lambda a, t: g(a, t, reduction="sum"), make(), whole=lambda a, t: f(torch.cat(a), torch.cat(t), reduction="sum"), label="sum"))
        cases.append(Case(lambda a, t: g(a, t, reduction="mean"), make(), whole=lambda a, t: f(torch.cat(a), torch.cat(t), reduction="mean"), label="mean"))
        return cases
    return _loss_cases(f, make)


@spec("ctc_loss")
def _ctc(name):
    lp = R([torch.log_softmax(t, -1) for t in comps([(n, 4) for n in (5, 4, 6)], 2)], (1,))
    tg = R([torch.tensor(t) for t in ([1, 2], [3], [1, 1, 2])], (1,))
    il, tl = torch.tensor([5, 4, 6]), torch.tensor([2, 1, 3])

    def f(a, t):
        return F.ctc_loss(a, t, il, tl, reduction="sum")

    return [Case(f, (lp, tg), whole=lambda a, t: sum(F.ctc_loss(p, q, int(n), int(m), reduction="sum") for p, q, n, m in zip(a, t, il, tl)))]


# --- linear algebra ------------------------------------------------------------------------------
_LINALG = {
    "det": (torch.det, "gen"), "linalg_det": (torch.linalg.det, "gen"), "inverse": (torch.inverse, "gen"),
    "linalg_inv": (torch.linalg.inv, "gen"), "linalg_cholesky": (torch.linalg.cholesky, "spd"),
    "matrix_exp": (torch.matrix_exp, "gen"), "matrix_power": (lambda a: torch.matrix_power(a, 3), "gen"),
    "linalg_matrix_power": (lambda a: torch.linalg.matrix_power(a, 2), "gen"),
    "linalg_eigh": (lambda a: tuple(torch.linalg.eigh(a)), "sym"), "linalg_qr": (lambda a: tuple(torch.linalg.qr(a)), "gen"),
    "linalg_svd": (lambda a: tuple(torch.linalg.svd(a)), "gen"),
    "_linalg_eigh": (lambda a: tuple(aten._linalg_eigh.default(a)), "sym"), "_linalg_svd": (lambda a: tuple(aten._linalg_svd.default(a)), "gen"),
}


@spec(*_LINALG)
def _linalg(name):
    f, kind = _LINALG[name]
    return [Case(f, (mats(kind=kind),), tol=1e-6, label="static matrices"), Case(f, (sqm(kind=kind),), tol=1e-6, label="ragged square matrices")]


@spec("linalg_solve", "_linalg_solve_ex")
def _solve(name):
    f = torch.linalg.solve if name == "linalg_solve" else (lambda a, b: tuple(aten._linalg_solve_ex.default(a, b)))
    a = mats()
    b = R(comps([(n, 3) for n in LENS], 4), (1,))
    a2 = sqm()
    b2 = R(comps([(n, 2) for n in PAIR_LENS], 5), (1,))
    b = R([c.unsqueeze(-1) for c in b.comps], (1,))
    return [Case(f, (a, b), tol=1e-6, label="static matrices"), Case(f, (a2, b2), tol=1e-6, label="ragged square matrices")]


@spec("_linalg_check_errors")
def _check_errors(name):
    info = R([torch.zeros(n, dtype=torch.int32) for n in LENS], (1,))
    return [Case(lambda i: aten._linalg_check_errors.default(i, "linalg.inv", is_matrix=False), (info,), whole=lambda i: None, grad=False)]


@spec("mm", "matmul")
def _mm(name):
    w = dense(3, 4, seed=1)
    f = getattr(torch, name)
    cases = [Case(f, (seq(), w), label="ragged @ dense")]
    if name == "matmul":
        x = seq()
        cases.append(Case(lambda a, b: a @ b.transpose(1, 2), (x, like(x)), ref=lambda a, b: a @ b.transpose(0, 1), label="ragged @ ragged -> pair"))
        cases.append(Case(lambda a, w: a @ w, (pair(c=3), w), ref=lambda a, w: a @ w, label="pair @ dense"))
    else:
        x = seq()
        cases.append(Case(lambda a, b: torch.mm(a.transpose(1, 2), b), (x, like(x)), ref=lambda a, b: torch.mm(a.t(), b), label="contract the ragged dim"))
    return cases


@spec("bmm", "baddbmm")
def _bmm(name):
    x = seq()
    w = PS(dense(4, 3, 2, seed=1))  # one (C, D) matrix per sample
    if name == "bmm":
        return [Case(torch.bmm, (x, w), ref=lambda a, w: a @ w, label="ragged @ per-sample dense"), Case(lambda a, b: torch.bmm(a, b.transpose(1, 2)), (x, like(x)), ref=lambda a, b: a @ b.t(), label="ragged @ ragged")]
    m = R(comps([(n, 2) for n in LENS], 5), (1,))
    return [Case(lambda i, a, w: torch.baddbmm(i, a, w, beta=0.5, alpha=2.0), (m, x, w), ref=lambda i, a, w: 0.5 * i + 2.0 * (a @ w))]


@spec("addmm")
def _addmm(name):
    w, b = dense(3, 4, seed=1), dense(4, seed=2)
    return [Case(torch.addmm, (b, seq(), w), ref=torch.addmm)]


@spec("addr")
def _addr(name):
    v = dense(4, seed=2)
    x = vec()
    m = R(comps([(n, 4) for n in LENS], 5), (1,))
    return [Case(torch.addr, (m, x, v))]


@spec("mv")
def _mv(name):
    return [Case(torch.mv, (seq(), dense(3, seed=1)), label="ragged matrix, dense vector"), Case(method("mv"), (sqm(), vec(lens=PAIR_LENS)), ref=torch.mv, label="ragged square matrix, ragged vector")]


@spec("dot", "vdot", "inner")
def _dot(name):
    f = getattr(torch, name)
    x = vec()
    cases = [Case(f, (x, like(x)), label="per-sample vectors")]
    if name == "inner":
        cases.append(Case(f, (seq(), dense(3, seed=1)), label="(B, j0, C) with (C,)"))
    return cases


@spec("outer", "ger")
def _outer(name):
    f = getattr(torch, name)
    return [Case(f, (vec(), dense(4, seed=1)), label="ragged x dense"), Case(f, (vec(), vec(seed=1)), label="ragged x ragged")]


@spec("einsum")
def _einsum(name):
    w = dense(3, 4, seed=1)
    x = seq()
    return [
        Case(lambda a, w: torch.einsum("bnc,cd->bnd", a, w), (x, w), ref=lambda a, w: torch.einsum("nc,cd->nd", a, w)),
        Case(lambda a, b: torch.einsum("bic,bjc->bij", a, b), (x, like(x)), ref=lambda a, b: torch.einsum("ic,jc->ij", a, b), label="pair"),
        Case(lambda a: torch.einsum("bijc->bc", a), (pair(),), ref=lambda a: torch.einsum("ijc->c", a), label="reduce a pair"),
    ]


@spec("pdist")
def _pdist(name):
    return [Case(F.pdist, (seq(lens=(3, 1, 2, 4)),))]


@spec("pairwise_distance")
def _pairwise(name):
    x = seq()
    return [Case(F.pairwise_distance, (x, like(x))), Case(F.pairwise_distance, (x, dense(3)), label="dense operand")]


@spec("grouped_mm")
def _grouped_mm(name):
    # one (K, N) matrix per sample, rows of the samples packed: float32, strides of 16 bytes
    x = seq(c=4, lens=(3, 0, 2, 4), dtype=torch.float32)
    w = PS(dense(4, 4, 4, seed=1, dtype=torch.float32))
    return [Case(lambda a, w: F.grouped_mm(a, w), (x, w), ref=lambda a, w: a @ w, tol=1e-5)]


@spec("scaled_mm")
def _scaled_mm(name):
    x = seq(c=16, lens=(16, 0, 32))
    x = R([c.to(torch.float8_e4m3fn) for c in x.comps], (1,))
    w = dense(16, 16, seed=1).to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.tensor(1.0)

    def f(a, w):
        return F.scaled_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32)

    return [Case(f, (x, w), grad=False, tol=1e-5)]


@spec("scaled_grouped_mm")
def _scaled_grouped_mm(name):
    x = seq(c=16, lens=(16, 0, 32))
    x = R([c.to(torch.float8_e4m3fn) for c in x.comps], (1,))
    w = PS(dense(3, 16, 16, seed=1).to(torch.float8_e4m3fn).transpose(-1, -2).contiguous().transpose(-1, -2))
    one = torch.tensor(1.0)

    def f(a, w):
        return F.scaled_grouped_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32)

    return [Case(f, (x, w), ref=lambda a, w: F.scaled_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32), grad=False, tol=1e-5)]


# --- attention, recurrent --------------------------------------------------------------------------
def _heads(lens=LENS, h=2, d=3, seed=0) -> R:
    return R(comps([(h, n, d) for n in lens], seed), (2,))


@spec("scaled_dot_product_attention")
def _sdpa(name):
    f = F.scaled_dot_product_attention
    q = _heads()
    return [
        Case(f, (q, like(q, 1), like(q, 2))),
        Case(lambda a, b, c: f(a, b, c, is_causal=True), (q, like(q, 1), like(q, 2)), label="causal"),
        Case(lambda a, b, c: f(a, b, c), (q, _heads(lens=(2, 3, 0, 1), seed=1), _heads(lens=(2, 3, 0, 1), seed=2)), ref=lambda a, b, c: f(a, b, c), label="cross attention"),
    ]


@spec("flex_attention")
def _flex(name):
    from torch.nn.attention.flex_attention import flex_attention

    q = _heads(lens=(3, 1, 2, 4))
    # torch's flex_attention has no backward on the CPU: forward only
    return [Case(flex_attention, (q, like(q, 1), like(q, 2)), ref=lambda a, b, c: flex_attention(a[None], b[None], c[None])[0], grad=False)]


def _mha_module(e=4, h=2):
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(e, h, batch_first=True, dtype=DT)


@spec("multi_head_attention_forward")
def _mha(name):
    m = _mha_module()
    f = lambda x: m(x, x, x, need_weights=False)[0]  # noqa: E731
    return [Case(f, (seq(c=4),), ref=batched(f))]


@spec("_native_multi_head_attention")
def _native_mha(name):
    m = _mha_module()

    def f(x):
        return aten._native_multi_head_attention.default(x, x, x, 4, 2, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, need_weights=False)[0]

    return [Case(f, (seq(c=4),), ref=batched(f), grad=False)]


@spec("_transformer_encoder_layer_fwd")
def _encoder_layer(name):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True, dtype=DT).eval()

    def f(x):
        with torch.no_grad():
            return layer(x)

    return [Case(f, (seq(c=4),), ref=batched(f), grad=False)]


_RNN = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "rnn_tanh": torch.nn.RNN, "rnn_relu": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="relu", **k)}


@spec(*_RNN)
def _rnn(name):
    torch.manual_seed(0)
    m = _RNN[name](3, 4, batch_first=True, dtype=DT)
    return [Case(lambda x: m(x)[0], (seq(lens=(3, 1, 2, 4)),), ref=batched(lambda x: m(x)[0]))]


# --- the rest --------------------------------------------------------------------------------------
@spec("affine_grid")
def _affine_grid(name):
    # one affine matrix per token of a ragged batch of tokens, each on a 3 x 3 grid
    th = R(comps([(n, 2, 3) for n in LENS], 1), (1,))
    return [Case(lambda t: F.affine_grid(t, [t.shape[1], 1, 3, 3], align_corners=False), (th,), ref=lambda t: F.affine_grid(t, [t.shape[0], 1, 3, 3], align_corners=False))]


na("a CUDA-only kernel: torch has no CPU implementation, so there is no per-sample reference on this build", "_flash_attention_forward")


# ----------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--failing", action="store_true", help="print only the rows that do not pass")
    ap.add_argument("--op", action="append", help="run only these ops (repeatable); prints tracebacks")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = build_table(args.op)
    took = time.perf_counter() - t0
    width = max(len(r.op) for r in rows)
    order = {"wrong": 0, "error": 1, "raises": 2, "n/a": 3, "pass": 4}
    shown = [r for r in rows if not (args.failing and r.status == "pass")]
    print(f"{'op':<{width}}  {'status':<6}  cases  detail")
    for r in sorted(shown, key=lambda r: (order[r.status], r.op)):
        print(f"{r.op:<{width}}  {r.status:<6}  {r.cases:>5}  {r.detail}")
        if args.op and r.tb:
            print(r.tb)
    s = summary(rows)
    wrong = [r.op for r in rows if r.status == "wrong"]
    print()
    print(f"{len(rows)} DanLing operators: {s['pass']} pass, {s['wrong']} wrong, {s['raises']} raise, {s['n/a']} n/a" + (f", {s['error']} broken cases" if s["error"] else "") + f"  ({took:.1f} s)")
    if wrong:
        print("WRONG (silent wrong answers): " + ", ".join(wrong))
    return 1 if wrong or s["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
