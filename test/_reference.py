"""Shared test helpers: random structures for the four layouts and the per-sample reference.

The oracle for every op is the *per-sample reference* (DESIGN.md §4): unbind the batch, apply the
plain dense op to each component, compare. Nothing here calls the package to compute an
expected value; the package is only ever the thing under test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from hypothesis import settings, strategies as st

import torch_multijagged as mj
from torch_multijagged import multi_jagged

DTYPE = torch.float64


# ----------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """One of the four logical layouts of the issue; ``shape(n, m, s, c)`` is a component."""

    name: str
    ragged_dims: tuple[int, ...]

    def shape(self, n: int, m: int, s: int, c: int) -> tuple[int, ...]:
        return {
            "seq": (n, c),  # (B, j0, C)
            "square": (n, n, c),  # (B, j0, j0, C)
            "rect": (n, m, c),  # (B, j0, j1, C)
            "static_lead": (s, n, c),  # (B, S, j0, C)
        }[self.name]

    def extents(self, n: int, m: int) -> tuple[int, ...]:
        """Per-sample extents of the ragged dims, i.e. one row of ``x.sizes()``."""
        return {"seq": (n,), "square": (n, n), "rect": (n, m), "static_lead": (n,)}[self.name]

    def __str__(self) -> str:
        return self.name


SEQ = Layout("seq", (1,))
SQUARE = Layout("square", (1, 2))
RECT = Layout("rect", (1, 2))
STATIC_LEAD = Layout("static_lead", (2,))
LAYOUTS = (SEQ, SQUARE, RECT, STATIC_LEAD)


@dataclass(frozen=True)
class Structure:
    layout: Layout
    lengths: tuple[tuple[int, int], ...]  # (n_i, m_i) per sample; m only used by "rect"
    s: int
    c: int

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [self.layout.shape(n, m, self.s, self.c) for n, m in self.lengths]

    @property
    def sizes(self) -> list[tuple[int, ...]]:
        return [self.layout.extents(n, m) for n, m in self.lengths]

    @property
    def ragged_dims(self) -> tuple[int, ...]:
        return self.layout.ragged_dims


@st.composite
def structures(draw, layout: Layout, max_batch: int = 4, max_len: int = 4, min_c: int = 1, max_c: int = 3):
    """A random structure of ``layout`` with at least one zero-length sample (STYLE.md habit 9).

    For the rectangular pair the zero is drawn on either ragged dim, so that ``(0, 3)`` and
    ``(3, 0)`` both occur."""
    b = draw(st.integers(1, max_batch))
    ns = draw(st.lists(st.integers(0, max_len), min_size=b, max_size=b))
    ms = draw(st.lists(st.integers(0, max_len), min_size=b, max_size=b))
    zero = draw(st.integers(0, b - 1))
    if layout is RECT and draw(st.booleans()):
        ms[zero] = 0
    else:
        ns[zero] = 0
    s = draw(st.integers(1, 3))
    c = draw(st.integers(min_c, max_c))
    return Structure(layout, tuple(zip(ns, ms)), s, c)


def any_structure(**kw):
    return st.sampled_from(LAYOUTS).flatmap(lambda lay: structures(lay, **kw))


seeds = st.integers(0, 2**31 - 1)


def grid(test):
    """Settings for a test that is one cell of an (op × layout) grid: a third of the profile's
    examples per cell (8 by default), so that the whole grid stays fast."""
    return settings(max_examples=max(5, settings.default.max_examples // 3))(test)


def components(shapes: Sequence[Sequence[int]], seed: int, dtype=DTYPE, low: float = -2.0, high: float = 2.0):
    """Random dense components; deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(*s, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype) for s in shapes]


def build(comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...], requires_grad: bool = False):
    """``(x, leaves)``: a multi_jagged tensor made by ``mj.as_nested_tensor`` from fresh leaves
    holding copies of ``comps`` (gradients of ``x`` reach ``leaves``)."""
    leaves = [c.detach().clone().requires_grad_(requires_grad) for c in comps]
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
        self.comps = list(comps)
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
    ints (``zeros_like(x0) + x``) instead of only having equal sizes.

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
            rl = [c.detach().clone().requires_grad_(grad) for c in a.comps]
            mj_args.append(x)
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
        if same:
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
