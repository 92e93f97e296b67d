"""Shared test helpers: random structures for the four layouts and the per-sample reference.

The oracle for every op is the *per-sample reference*: unbind the batch, apply the
plain dense op to each component, compare. Nothing here calls the package to compute an
expected value; the package is only ever the thing under test.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from hypothesis import settings, strategies as st

import torch_multijagged as mj
from torch_multijagged import multi_jagged, tensor as _tensor

DTYPE = torch.float64
#: every dtype the suite draws values for (every dtype torch supports for some op)
DTYPES = (torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """A logical layout; ``shape(n, m, s, c, k)`` is a component (``k`` only for three ragged
    dims of distinct extents; it defaults to ``m``)."""

    name: str
    ragged_dims: tuple[int, ...]

    def shape(self, n: int, m: int, s: int, c: int, k: Optional[int] = None) -> tuple[int, ...]:
        k = m if k is None else k
        return {
            "seq": (n, c),  # (B, j0, C)
            "square": (n, n, c),  # (B, j0, j0, C)
            "rect": (n, m, c),  # (B, j0, j1, C)
            "static_lead": (s, n, c),  # (B, S, j0, C)
            "cube": (n, n, n, c),  # (B, j0, j0, j0, C): three ragged dims, one nested int
            "rect3": (n, m, k, c),  # (B, j0, j1, j2, C): three ragged dims, three nested ints
            "rect3_mid": (n, s, m, k, c),  # (B, j0, S, j1, j2, C): a static dim between ragged ones
        }[self.name]

    def extents(self, n: int, m: int, k: Optional[int] = None) -> tuple[int, ...]:
        """Per-sample extents of the ragged dims, i.e. one row of ``x.sizes()``."""
        k = m if k is None else k
        return {
            "seq": (n,),
            "square": (n, n),
            "rect": (n, m),
            "static_lead": (n,),
            "cube": (n, n, n),
            "rect3": (n, m, k),
            "rect3_mid": (n, m, k),
        }[self.name]

    @property
    def free(self) -> int:
        """How many independent per-sample extents the layout has (``n``; ``n, m``; ``n, m, k``)."""
        return {"rect": 2, "rect3": 3, "rect3_mid": 3}.get(self.name, 1)

    @property
    def width(self) -> int:
        """Entries per sample in ``Structure.lengths``: ``(n, m)``, or ``(n, m, k)`` for the
        three-ragged layouts."""
        return 3 if len(self.ragged_dims) == 3 else 2

    def __str__(self) -> str:
        return self.name


SEQ = Layout("seq", (1,))
SQUARE = Layout("square", (1, 2))
RECT = Layout("rect", (1, 2))
STATIC_LEAD = Layout("static_lead", (2,))
CUBE = Layout("cube", (1, 2, 3))
RECT3 = Layout("rect3", (1, 2, 3))
RECT3_MID = Layout("rect3_mid", (1, 3, 4))
LAYOUTS = (SEQ, SQUARE, RECT, STATIC_LEAD)  # the four layouts of the README
LAYOUTS3 = (CUBE, RECT3, RECT3_MID)  # three ragged dims
ALL_LAYOUTS = LAYOUTS + LAYOUTS3


class Shapes(list):
    """Component shapes; ``template`` is the shape of a zero-extent component, so that an empty
    batch (B = 0) still knows its static dims."""

    template: Optional[tuple[int, ...]] = None


class Comps(list):
    """Components; ``template`` / ``dtype`` describe a component even when the list is empty
    (B = 0), so that ``build`` can make the empty batch with ``from_packed``."""

    template: Optional[tuple[int, ...]] = None
    dtype: Optional[torch.dtype] = None


@dataclass(frozen=True)
class Structure:
    layout: Layout
    lengths: tuple[tuple[int, ...], ...]  # (n_i, m_i) per sample, (n_i, m_i, k_i) for 3 ragged dims
    s: int
    c: int
    dtype: torch.dtype = DTYPE

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def shapes(self) -> Shapes:
        out = Shapes(self.layout.shape(e[0], e[1], self.s, self.c, *e[2:]) for e in self.lengths)
        out.template = self.layout.shape(0, 0, self.s, self.c, 0)
        return out

    @property
    def sizes(self) -> list[tuple[int, ...]]:
        return [self.layout.extents(*e) for e in self.lengths]

    @property
    def ragged_dims(self) -> tuple[int, ...]:
        return self.layout.ragged_dims

    def components(self, seed: int, **kw) -> "Comps":
        """Random components of this structure in its dtype (``components``)."""
        kw.setdefault("dtype", self.dtype)
        return components(self.shapes, seed, **kw)


# ----------------------------------------------------------------------------- strategies
def batch_sizes(min_batch: int = 0, max_batch: int = 4):
    """B with weights 1 : 2 : 3 : 4 : 4 … for B = 0, 1, 2, 3, 4 …: an empty batch is a regular
    but rare case, and most batches hold three or more samples (two of them non-empty)."""
    pool = [b for b in range(min_batch, max_batch + 1) for _ in range(min(b + 1, 4))]
    # The typical case first: hypothesis draws (and shrinks towards) the first element early and
    # often, and with ~8 examples per test, those early examples are a good part of the run.
    pool.sort(key=lambda b: (b < 2, b == 0, abs(b - 3)))
    return st.sampled_from(pool)


def _chance(percent: int, simplest: bool):
    """True with ``percent`` % probability; ``simplest`` is the value of hypothesis's simplest
    (first-drawn, shrink-target) example."""
    if simplest:
        return st.integers(0, 99).map(lambda v: v < percent)
    return st.integers(0, 99).map(lambda v: v >= 100 - percent)


@st.composite
def extent_rows(draw, b: int, width: int = 1, free: Optional[int] = None, max_len: int = 4):
    """``b`` rows of ``width`` per-sample extents: non-empty (in ``[1, max_len]``) except for a
    zero-length sample, which is present in 90 % of batches of three or more and in half of the
    batches of one or two (so that B = 1 is not always empty). The zero goes on one of the first
    ``free`` columns (the extents the layout uses), so ``(0, 3)`` and ``(3, 0)`` both occur."""
    free = width if free is None else free
    rows = [list(draw(st.lists(st.integers(1, max_len), min_size=width, max_size=width))) for _ in range(b)]
    # simplest example: B = 3 with one zero-length sample; B = 1 or 2: no zero (so not all empty)
    if b and draw(_chance(90, True) if b >= 3 else _chance(50, False)):
        z = draw(st.integers(0, b - 1))
        rows[z][draw(st.integers(0, free - 1))] = 0
    return [tuple(r) for r in rows]


@st.composite
def structures(
    draw,
    layout: Layout,
    max_batch: int = 4,
    max_len: int = 4,
    min_c: int = 1,
    max_c: int = 3,
    min_batch: int = 1,
    dtypes: Sequence[torch.dtype] = (DTYPE,),
    min_s: int = 1,
    max_s: int = 3,
):
    """A random structure of ``layout``: usually several non-empty samples and one zero-length
    one, sometimes B = 1. ``min_batch=0`` adds B = 0 (about 1 draw in 14):
    ``components(s.shapes, …)`` then returns an empty list that remembers the component shape,
    and ``build`` / ``R`` / ``per_sample_check`` make it with ``from_packed`` (``empty_batch``);
    a test that builds its tensors itself must handle it before opting in.

    For the rectangular layouts the zero is drawn on any ragged dim, so that ``(0, 3)`` and
    ``(3, 0)`` both occur. ``dtypes``: the structure's ``dtype`` is drawn from them."""
    b = draw(batch_sizes(min_batch, max_batch))
    rows = draw(extent_rows(b, layout.width, layout.free, max_len))
    s = draw(st.integers(min_s, max_s))
    c = draw(st.integers(min_c, max_c))
    dtype = draw(st.sampled_from(tuple(dtypes)))
    return Structure(layout, tuple(rows), s, c, dtype)


def any_structure(layouts: Sequence[Layout] = LAYOUTS, **kw):
    return st.sampled_from(tuple(layouts)).flatmap(lambda lay: structures(lay, **kw))


seeds = st.integers(0, 2**31 - 1)


def scaled(n: int) -> int:
    """``n`` examples under the default profile (25), proportionally more or fewer under the
    others: ``thorough`` (300) runs 12 × as many, ``quick`` (5) a fifth (at least 2)."""
    return max(2, round(n * settings.default.max_examples / 25))


def few(n: int = 10):
    """Settings for a slow test: ``scaled(n)`` examples, so that every profile reaches it."""
    return settings(max_examples=scaled(n))


def grid(test):
    """Settings for a test that is one cell of an (op × layout) grid: a third of the profile's
    examples per cell (8 by default, 100 thorough), so that the whole grid stays fast."""
    return settings(max_examples=max(5, settings.default.max_examples // 3))(test)


# ----------------------------------------------------------------------------- values
def random_values(shape: Sequence[int], gen: torch.Generator, dtype=DTYPE, low: float = -2.0, high: float = 2.0, ties: bool = False):
    """Random values of ``dtype`` in ``[low, high]``: bools fair coins; integers uniform on
    ``[ceil(low), floor(high)]`` (small, so zeros and ties are common; ``[0, 1]`` if empty);
    floats uniform, drawn in float64 and rounded to ``dtype`` (with ``ties``: multiples of 0.5,
    so that equal values — the gradient tie rule of ``amax`` — occur)."""
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen, dtype=torch.float64) < 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        lo, hi = math.ceil(low), math.floor(high)
        if hi < lo:
            lo, hi = 0, 1
        return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
    v = torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low
    if ties:
        v = (v * 2).round() / 2
    return v.to(dtype)


def components(shapes: Sequence[Sequence[int]], seed: int, dtype=DTYPE, low: float = -2.0, high: float = 2.0, ties: bool = False):
    """Random dense components (``random_values``); deterministic in ``seed``. The result
    remembers ``shapes.template`` and ``dtype``, so that ``build`` handles B = 0."""
    g = torch.Generator().manual_seed(seed)
    out = Comps(random_values(s, g, dtype, low, high, ties) for s in shapes)
    out.template = getattr(shapes, "template", None)
    out.dtype = dtype
    return out


def empty_batch(component_shape: Sequence[int], ragged_dims: tuple[int, ...], dtype=DTYPE, requires_grad: bool = False):
    """A multi_jagged tensor with B = 0 whose components would have the shape
    ``component_shape`` (ragged extents ignored): a list cannot express B = 0, so this goes
    through ``mj.from_packed`` with offsets ``[0]``."""
    rc = {d - 1 for d in ragged_dims}
    static = [e for d, e in enumerate(component_shape) if d not in rc]
    values = torch.zeros((0, *static), dtype=dtype, requires_grad=requires_grad and dtype.is_floating_point)
    return mj.from_packed(values, torch.zeros(1, dtype=torch.int64), torch.zeros(0, len(ragged_dims), dtype=torch.int64), ragged_dims=ragged_dims)


def build(comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...], requires_grad: bool = False):
    """``(x, leaves)``: a multi_jagged tensor made by ``mj.as_nested_tensor`` from fresh leaves
    holding copies of ``comps`` (gradients of ``x`` reach ``leaves``). An empty ``comps`` made
    by ``components`` (B = 0) becomes ``empty_batch`` with no leaves."""
    if len(comps) == 0:
        template = getattr(comps, "template", None)
        if template is None:
            raise ValueError("build(): B = 0 needs components made by components(structure.shapes, …)")
        return empty_batch(template, ragged_dims, getattr(comps, "dtype", None) or DTYPE), []
    leaves = [c.detach().clone().requires_grad_(requires_grad and c.is_floating_point()) for c in comps]
    return mj.as_nested_tensor(leaves, ragged_dims=ragged_dims), leaves


# ----------------------------------------------------------------------------- nested ints
def normalize_nested_ints(text: str) -> str:
    """Renumber nested ints ``j<k>`` in order of first appearance (the global counter varies)."""
    seen: dict[str, str] = {}

    def sub(m):
        return seen.setdefault(m.group(0), f"j{len(seen)}")

    return re.sub(r"\bj\d+\b", sub, text)


def is_nested_int(s) -> bool:
    from torch.fx.experimental.symbolic_shapes import is_nested_int as _is

    return _is(s)


# ----------------------------------------------------------------------------- reference
class R:
    """A ragged operand: a list of components, packed with ``mj.as_nested_tensor``."""

    def __init__(self, comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...]):
        self.comps = comps if isinstance(comps, Comps) else list(comps)  # Comps: B = 0 works
        self.ragged_dims = tuple(ragged_dims)


class PS:
    """A dense per-sample operand ``(B, …)``: sample i of the reference sees ``t[i]``."""

    def __init__(self, t: torch.Tensor):
        self.t = t


def _zeros_if_none(g, like):
    return torch.zeros_like(like) if g is None else g


def assert_close(actual, expected, what: str = "", rtol=1e-7, atol=1e-7):
    assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual).__name__}"
    assert not isinstance(actual, mj.MultiJaggedTensor), f"{what}: expected a dense tensor"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _probe(a):
    """Sample "−1" of an operand for B = 0: a zero-extent component, or row 0 of an empty
    per-sample operand's shape."""
    if isinstance(a, R):
        return torch.zeros(a.comps.template, dtype=a.comps.dtype)
    if isinstance(a, PS):
        return torch.zeros(a.t.shape[1:], dtype=a.t.dtype)
    return a


def _check_empty_batch(out, ref, args, dense_out: bool):
    """B = 0: the result has B = 0, and where the dense op accepts a zero-extent component, the
    dtype (and for a dense result the shape) that it gives."""
    try:
        like = ref(*[_probe(a) for a in args])
    except Exception:  # the dense op refuses an empty extent (amax…): only B is checked
        like = None
    if dense_out:
        assert not isinstance(out, mj.MultiJaggedTensor), f"expected a dense output, got {out!r}"
        assert out.shape[0] == 0, f"B = 0: dense output of shape {tuple(out.shape)}"
        if like is not None:
            assert tuple(out.shape[1:]) == tuple(like.shape), f"B = 0: shape {tuple(out.shape)} != (0, *{tuple(like.shape)})"
    else:
        assert isinstance(out, mj.MultiJaggedTensor), f"expected a multi_jagged output, got {type(out).__name__}"
        assert out.shape[0] == 0 and out.unbind() == (), f"B = 0: output of shape {out.shape}"
        if like is not None:
            assert out.dim() == like.dim() + 1, f"B = 0: output rank {out.dim()} != 1 + {like.dim()}"
    if like is not None:
        assert out.dtype == like.dtype, f"B = 0: dtype {out.dtype} != {like.dtype}"


def per_sample_check(
    fn: Callable[..., Any],
    *args: Any,
    ref: Optional[Callable[..., Any]] = None,
    grad: bool = True,
    dense_out: bool = False,
    rtol: float = 1e-7,
    atol: float = 1e-7,
    seed: int = 0,
    share: bool = False,
    new_ragged: bool = False,
):
    """Check ``fn`` on multi_jagged operands against ``ref`` (default ``fn``) per sample.

    ``args``: ``R`` (ragged, built with ``as_nested_tensor`` from fresh leaves), ``PS`` (dense
    ``(B, …)`` operand sliced per sample for the reference), dense tensors (shared; a floating
    one is a leaf whose gradient is compared too) or anything else (passed through).

    * multi_jagged output: ``out.unbind()[i]`` must equal ``ref(*sample_i_args)`` (shape, dtype,
      values), and where ``out`` has the ragged dims of a ragged input, it has that input's
      nested ints;
    * ``dense_out``: ``out`` is a dense ``(B, …)`` tensor equal to ``stack(ref per sample)``.

    ``share``: every ragged operand after the first is re-expressed with the first one's nested
    ints (``zeros_like(x0) + x``) instead of only having equal sizes. ``new_ragged``: the output's
    ragged sizes are new ones (a slice, a half), so it need not keep an input's nested ints.

    With ``grad``, a random cotangent is pulled back through both sides and the gradients of
    every component and every dense operand must agree. Returns ``out``."""
    ref = ref or fn
    ragged = [a for a in args if isinstance(a, R)]
    batch = len(ragged[0].comps)
    mj_args, ref_leaves, mj_leaves, mj_inputs = [], [], [], []
    ref_parts: list[Callable[[int], Any]] = []
    for a in args:
        if isinstance(a, R):
            x, leaves = build(a.comps, a.ragged_dims, requires_grad=grad)
            if share and mj_inputs:
                x = torch.zeros_like(mj_inputs[0]) + x
                assert all(x.shape[d] == mj_inputs[0].shape[d] for d in x.ragged_dims)
            mj_inputs.append(x)
            rl = [c.detach().clone().requires_grad_(grad and c.is_floating_point()) for c in a.comps]
            mj_args.append(x)
            if a.comps and not a.comps[0].is_floating_point():  # a mask or indices: no gradient
                ref_parts.append(lambda i, rl=rl: rl[i])
                continue
            mj_leaves += leaves
            ref_leaves += rl
            ref_parts.append(lambda i, rl=rl: rl[i])
        elif isinstance(a, (PS, torch.Tensor)):
            t = a.t if isinstance(a, PS) else a
            g = grad and t.is_floating_point()
            ml, rl = t.detach().clone().requires_grad_(g), t.detach().clone().requires_grad_(g)
            mj_args.append(ml)
            mj_leaves.append(ml)
            ref_leaves.append(rl)
            ref_parts.append((lambda i, rl=rl: rl[i]) if isinstance(a, PS) else (lambda i, rl=rl: rl))
        else:
            mj_args.append(a)
            ref_parts.append(lambda i, a=a: a)

    out = fn(*mj_args)
    expected = [ref(*[p(i) for p in ref_parts]) for i in range(batch)]
    if batch == 0:
        _check_empty_batch(out, ref, args, dense_out)
        return out

    if dense_out:
        assert not isinstance(out, mj.MultiJaggedTensor), f"expected a dense output, got {out!r}"
        exp = torch.stack(expected) if expected else None
        if exp is not None:
            assert_close(out, exp, "dense output", rtol, atol)
        got = [out]
        cot_exp = [torch.randn(exp.shape, generator=torch.Generator().manual_seed(seed), dtype=exp.dtype)] if exp is not None else []
        exp_list = [exp] if exp is not None else []
    else:
        assert isinstance(out, mj.MultiJaggedTensor), f"expected a multi_jagged output, got {type(out).__name__}"
        assert out.layout is multi_jagged
        got = list(out.unbind())
        assert len(got) == batch, f"unbind gave {len(got)} components for B = {batch}"
        for i, (o, e) in enumerate(zip(got, expected)):
            assert_close(o, e, f"sample {i}", rtol, atol)
        # the output keeps the nested ints of an input with its ragged dims
        same = [x for x in mj_inputs if x.ragged_dims == out.ragged_dims]
        if same and not new_ragged:
            assert any(all(out.shape[d] == x.shape[d] for d in out.ragged_dims) for x in same), (
                f"output shape {out.shape} has none of the inputs' nested ints {[x.shape for x in same]}"
            )
        gen = torch.Generator().manual_seed(seed)
        cot_exp = [torch.randn(e.shape, generator=gen, dtype=e.dtype) if e.is_floating_point() else None for e in expected]
        exp_list = expected

    if not grad or not any(e.is_floating_point() and e.requires_grad for e in exp_list):
        return out
    loss_mj = sum((o * c).sum() for o, c in zip(got, cot_exp) if c is not None)
    loss_ref = sum((e * c).sum() for e, c in zip(exp_list, cot_exp) if c is not None)
    g_mj = torch.autograd.grad(loss_mj, mj_leaves, allow_unused=True)
    g_ref = torch.autograd.grad(loss_ref, ref_leaves, allow_unused=True)
    for k, (gm, gr, leaf) in enumerate(zip(g_mj, g_ref, ref_leaves)):
        assert_close(_zeros_if_none(gm, leaf), _zeros_if_none(gr, leaf), f"grad of input leaf {k}", rtol, atol)
    return out


def complex_grad_check(fn: Callable[..., Any], *args: Any, ref: Optional[Callable[..., Any]] = None, seed: int = 0,
                       second_order: bool = False, rtol: float = 1e-7, atol: float = 1e-7):
    """``per_sample_check`` for complex operands (which it does not differentiate): ``R`` ragged
    operands and dense tensors (shared leaves), a multi_jagged output compared per sample, then
    the gradients of every leaf of the real loss ``Re Σ out · c`` (complex cotangents ``c``) —
    where a formula misses torch's conjugation (the conjugate Wirtinger derivative) the
    imaginary parts come back negated. ``second_order``: the gradients are pulled back once more
    (``Re Σ grad · c'``) and must agree too. Returns ``out``."""
    ref = ref or fn
    gen = torch.Generator().manual_seed(seed)
    mj_args, mj_leaves, ref_leaves, ref_parts = [], [], [], []
    for a in args:
        if isinstance(a, R):
            ml = [c.detach().clone().requires_grad_() for c in a.comps]
            rl = [c.detach().clone().requires_grad_() for c in a.comps]
            mj_args.append(mj.as_nested_tensor(ml, ragged_dims=a.ragged_dims))
            mj_leaves += ml
            ref_leaves += rl
            ref_parts.append(lambda i, rl=rl: rl[i])
        else:
            ml, rl = a.detach().clone().requires_grad_(), a.detach().clone().requires_grad_()
            mj_args.append(ml)
            mj_leaves.append(ml)
            ref_leaves.append(rl)
            ref_parts.append(lambda i, rl=rl: rl)
    batch = len(next(a for a in args if isinstance(a, R)).comps)
    out = fn(*mj_args)
    got = list(out.unbind())
    expected = [ref(*[p(i) for p in ref_parts]) for i in range(batch)]
    for i, (o, e) in enumerate(zip(got, expected)):
        assert_close(o, e, f"sample {i}", rtol, atol)
    cots = [torch.randn(e.shape, generator=gen, dtype=e.dtype) for e in expected]

    def pull(outs, exps, cs, create_graph):
        lm = sum((o * c).sum().real for o, c in zip(outs, cs))
        lr = sum((e * c).sum().real for e, c in zip(exps, cs))
        gm = torch.autograd.grad(lm, mj_leaves, allow_unused=True, create_graph=create_graph)
        gr = torch.autograd.grad(lr, ref_leaves, allow_unused=True, create_graph=create_graph)
        gm = [_zeros_if_none(g, leaf) for g, leaf in zip(gm, ref_leaves)]
        gr = [_zeros_if_none(g, leaf) for g, leaf in zip(gr, ref_leaves)]
        for k, (a, b) in enumerate(zip(gm, gr)):
            assert_close(a, b, f"{'second-order ' if not create_graph and second_order else ''}grad of leaf {k}",
                         rtol, atol)
        return gm, gr

    gm, gr = pull(got, expected, cots, second_order)
    if second_order:
        # only the gradients that depend on the leaves in turn (a linear map's does not on its own input)
        keep = [k for k, g in enumerate(gr) if g.requires_grad]
        assert all(gm[k].requires_grad for k in keep), "a gradient has no graph where dense's has one"
        pull([gm[k] for k in keep], [gr[k] for k in keep],
             [torch.randn(gr[k].shape, generator=gen, dtype=gr[k].dtype) for k in keep], False)
    return out


@contextlib.contextmanager
def general_path():
    """Every op takes the general mechanism (routes, handlers), not the eager values path
    (``bool()`` is False: the subclass's ``_fast_enabled`` check)."""
    prev = _tensor._fast_enabled
    _tensor._fast_enabled = bool
    try:
        yield
    finally:
        _tensor._fast_enabled = prev
