"""The machinery of ``op_coverage.py``: operands (multi_jagged batches and their per-sample
components), cases and the per-sample check (values, shapes, dtypes, gradients of every leaf),
the spec registry (``SPECS``, filled by the ``_op_specs_*`` modules) and the helpers specs are
written with."""

from __future__ import annotations

import math
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

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
    """A dense per-sample operand ``(B, …)``: sample i of the reference sees ``t[i]``. ``grad``:
    whether it is a leaf whose gradient is compared (not for inputs the op cannot differentiate,
    such as random samples)."""

    def __init__(self, t: torch.Tensor, grad: bool = True):
        self.t = t
        self.grad = grad


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
            g = grad and t.is_floating_point() and (not isinstance(a, PS) or a.grad)
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
