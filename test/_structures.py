"""Helpers for the broadcast / ragged-reduction / structure-op tests.

Complements ``_reference.py`` (whose ``per_sample_check`` is the main oracle): length strategies
for singles that broadcast into pairs, an empty-aware dense reference for reductions, bitwise
comparison for the no-leakage property and ``from_packed`` inputs for ``gradcheck``. Nothing here
calls the package to compute an expected value.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from hypothesis import strategies as st

import torch_multijagged as mj
from _reference import batch_sizes, extent_rows, random_values

DTYPE = torch.float64


# ----------------------------------------------------------------------------- strategies
@st.composite
def lengths(draw, max_batch: int = 4, max_len: int = 4, batch: int | None = None, min_batch: int = 1):
    """Per-sample lengths: mostly non-empty, with a zero-length sample in most batches
    (``_reference.extent_rows``). ``min_batch=0`` admits B = 0 (build it with
    ``_reference.empty_batch``: a list cannot express it)."""
    b = batch if batch is not None else draw(batch_sizes(min_batch, max_batch))
    return tuple(r[0] for r in draw(extent_rows(b, 1, 1, max_len)))


@st.composite
def length_pairs(draw, max_batch: int = 4, max_len: int = 4, min_batch: int = 1):
    """``(ns, ms)`` for a rectangular pair; a zero on either side, so ``(0, m)`` and ``(n, 0)``
    both occur; ``ns != ms`` is likely but not forced."""
    b = draw(batch_sizes(min_batch, max_batch))
    rows = draw(extent_rows(b, 2, 2, max_len))
    return tuple(r[0] for r in rows), tuple(r[1] for r in rows)


@st.composite
def length_triples(draw, max_batch: int = 4, max_len: int = 3, min_batch: int = 1):
    """``(ns, ms, ks)`` for three ragged dims; a zero on any of them."""
    b = draw(batch_sizes(min_batch, max_batch))
    rows = draw(extent_rows(b, 3, 3, max_len))
    return tuple(tuple(r[k] for r in rows) for k in range(3))


def randn(shape, gen: torch.Generator, dtype=DTYPE, low=-2.0, high=2.0) -> torch.Tensor:
    """Random values of ``dtype`` (``_reference.random_values``: bools, small ints, floats)."""
    return random_values(shape, gen, dtype, low, high)


def comps_for(shapes: Sequence[Sequence[int]], seed: int, **kw) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [randn(s, g, **kw) for s in shapes]


# ----------------------------------------------------------------------------- references
_FILL = {
    "amax": lambda dt: torch.finfo(dt).min,
    "amin": lambda dt: torch.finfo(dt).max,
    "argmax": lambda dt: 0,
    "argmin": lambda dt: 0,
}


def rect_pair(ns: Sequence[int], ms: Sequence[int], seed: int, c: int = 2):
    """``(x, y, x.unsqueeze(-2) * y.unsqueeze(-3))``: singles of lengths ``ns`` and ``ms`` (built
    separately, so with their own nested ints) and the rectangular pair ``(B, j_x, j_y, c)``."""
    x = mj.nested_tensor(comps_for([(n, c) for n in ns], seed), ragged_dims=(1,))
    y = mj.nested_tensor(comps_for([(m, c) for m in ms], seed + 1), ragged_dims=(1,))
    return x, y, x.unsqueeze(-2) * y.unsqueeze(-3)


def empty_aware(fn: Callable, kind: str, dims: Sequence[int]) -> Callable:
    """Dense reference ``fn`` for a component, except that a reduction of kind ``amax`` /
    ``amin`` / ``argmax`` / ``argmin`` over an empty extent (which dense torch refuses) gives
    the torch.jagged value: finfo.min / finfo.max / 0. Other kinds follow dense torch as is
    (sum 0, mean nan, prod 1, logsumexp -inf, any False, all True, norm 0)."""
    if kind not in _FILL:
        return fn

    def ref(c: torch.Tensor):
        zero = [d for d in dims if c.shape[d] == 0]
        if not zero:
            return fn(c)
        probe = list(c.shape)
        for d in zero:
            probe[d] = 1
        like = fn(torch.zeros(probe, dtype=c.dtype))
        return torch.full(like.shape, _FILL[kind](c.dtype), dtype=like.dtype)

    return ref


def per_sample_outputs(out) -> list[torch.Tensor]:
    """Sample i's output: a component of a multi_jagged output or row i of a dense one."""
    if isinstance(out, mj.MultiJaggedTensor):
        return list(out.unbind())
    return list(out.unbind(0))


def assert_samples_and_grads(out, refs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor], **tol) -> None:
    """``out`` (multi_jagged, or dense ``(B, …)``) equals ``refs`` sample by sample, and the
    gradients of ``Σ out²`` and ``Σ refs²`` with respect to every leaf agree (a leaf neither side
    reaches: zeros on both)."""
    got = per_sample_outputs(out)
    assert len(got) == len(refs)
    for a, b in zip(got, refs):
        torch.testing.assert_close(a, b, **tol)
    ga = torch.autograd.grad((out * out).sum(), leaves, allow_unused=True)
    gb = torch.autograd.grad(sum((r * r).sum() for r in refs), leaves, allow_unused=True)
    for a, b, t in zip(ga, gb, leaves):
        torch.testing.assert_close(a if a is not None else torch.zeros_like(t), b if b is not None else torch.zeros_like(t), **tol)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Shape, dtype and every bit equal (NaN == NaN of the same payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
    return torch.equal(a, b)


def packed_args(comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...]):
    """``(values, offsets, sizes)`` for ``mj.from_packed`` computed by hand (storage order:
    ragged component dims first, row-major, then the static dims) — independent of the
    package's packing code."""
    rc = [d - 1 for d in ragged_dims]
    rows, sizes = [], []
    for c in comps:
        static = [d for d in range(c.dim()) if d not in rc]
        p = c.permute(*rc, *static)
        n = 1
        for d in rc:
            n *= c.shape[d]
        rows.append(p.reshape(n, *[c.shape[d] for d in static]))
        sizes.append([c.shape[d] for d in rc])
    counts = [r.shape[0] for r in rows]
    offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int64)
    return torch.cat(rows).clone(), offsets, torch.tensor(sizes, dtype=torch.int64).reshape(len(comps), len(rc))


def dense_forward_check(fn: Callable, ref: Callable, comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...]):
    """Forward-only check of a dense ``(B, …)`` output against ``stack(ref per component)``,
    for integer / bool outputs (``_reference.per_sample_check(dense_out=True)`` draws a float
    cotangent of the output's dtype, which fails for them)."""
    from _reference import assert_close

    out = fn(mj.nested_tensor(list(comps), ragged_dims=ragged_dims))
    assert not isinstance(out, mj.MultiJaggedTensor), f"expected a dense output, got {out!r}"
    assert_close(out, torch.stack([ref(c) for c in comps]), "dense output", rtol=0, atol=0)
    return out


def per_sample_check_any_ints(
    fn: Callable, ref: Callable, comps: Sequence[torch.Tensor], ragged_dims: tuple[int, ...], seed: int = 0, grad: bool = True
):
    """Like ``_reference.per_sample_check`` for one ragged operand, for ops that legitimately
    move nested ints between dims (a rectangular pair's transpose is ``(B, j1, j0, C)``):
    components and gradients are compared, nested ints are left to the caller. Returns
    ``(x, out)``."""
    from _reference import assert_close, build

    x, leaves = build(comps, ragged_dims, requires_grad=True)
    ref_leaves = [c.detach().clone().requires_grad_() for c in comps]
    out = fn(x)
    assert isinstance(out, mj.MultiJaggedTensor), f"expected a multi_jagged output, got {type(out).__name__}"
    got = list(out.unbind())
    expected = [ref(c) for c in ref_leaves]
    assert len(got) == len(expected)
    for i, (o, e) in enumerate(zip(got, expected)):
        assert_close(o, e, f"sample {i}")
    if not grad or not expected:  # B = 0: nothing to differentiate
        return x, out
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(e.shape, generator=gen, dtype=e.dtype) for e in expected]
    g_mj = torch.autograd.grad(sum((o * c).sum() for o, c in zip(got, cot)), leaves, allow_unused=True)
    g_ref = torch.autograd.grad(sum((e * c).sum() for e, c in zip(expected, cot)), ref_leaves, allow_unused=True)
    for k, (a, b, leaf) in enumerate(zip(g_mj, g_ref, comps)):
        z = torch.zeros_like(leaf)
        assert_close(z if a is None else a, z if b is None else b, f"grad of sample {k}")
    return x, out
