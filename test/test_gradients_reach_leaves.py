"""Every leaf gets its gradient (NOTE [ Equal sizes, different nested ints ] in ops/_routing.py).

Operands with equal per-sample sizes combine whether they share a nested int or were built
separately (README "Compatibility": "the result carries the first operand's nested int, and each
operand's gradient its own"). ``__torch_function__`` relabels the later operands onto the first
one's extent for the op — and must never replace a tensor held by identity: the ``inputs`` of
``torch.autograd.grad``, the template argument of a backward formula (``reduce_backward``), the
target of an in-place op. For every binary pointwise op and every broadcast (elementwise, singles
→ square pair, rectangular pair, pair ∘ single, a dense per-sample operand, a mask), with
operands built separately with equal lengths *and* sharing a nested int,
``torch.autograd.grad(loss, every_leaf)`` gives every leaf a gradient equal to the per-sample
dense one, also through ``nn.Linear`` on each side, and ``loss.backward()`` fills every ``.grad``.

The loss reduces the output over everything, over its first ragged dim or over its last, so
that the reduction's backward (whose template argument once got relabelled) is exercised.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import assert_close, few, seeds
from _structures import comps_for, length_pairs, lengths

DT = torch.float64

# (a, b) → out, both dense (per sample) and multi_jagged; divisors and bases kept away from 0
OPS = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b * 2),
    "atan2": torch.atan2,
    "pow": lambda a, b: torch.pow(a.abs() + 0.5, b),
    "hypot": lambda a, b: torch.hypot(a, b + 3),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "copysign": torch.copysign,  # zero derivative in b: dense gives zeros, not None
    "nextafter": torch.nextafter,
}


def _row(t):
    return t.unsqueeze(-2)


def _col(t):
    return t.unsqueeze(-3)


# broadcast kind → (x, y, d) → out; x, y are (B, j, C) singles (per sample (n, C)), d a dense
# (B, 1, 1, C) operand (per sample (1, 1, C)). The same function serves both sides.
KINDS = {
    "elementwise": lambda f, x, y, d: f(x, y),
    "square": lambda f, x, y, d: f(_row(x), _col(y)),  # singles → pair
    "pair_vs_row": lambda f, x, y, d: f(_row(x) * _col(x), _row(y)),  # (B, j, j, C) ∘ (B, j', 1, C)
    "col_vs_pair": lambda f, x, y, d: f(_col(y), _row(x) + _col(x)),  # first operand a column
    "dense_per_sample": lambda f, x, y, d: f(_row(x), _col(y) * d),
    "mask": lambda f, x, y, d: torch.where(y > 0, f(x, y), x * 0.5),  # y's mask on x's values
}

# loss over the output: everything, its first ragged dim or its last one
def _loss(out, how: str, ragged_first: int, ragged_last: int):
    if how == "all":
        return (out * out).sum()
    d = ragged_first if how == "first_ragged" else ragged_last
    return (out.sum(d) ** 2).sum()


def _ragged_span(kind: str) -> tuple[int, int]:
    """(first, last) ragged dim of the output of ``kind`` (dims of the batched tensor)."""
    return (1, 1) if kind in ("elementwise", "mask") else (1, 2)


def _make(ns, ms, c, seed, share: bool, linear: bool):
    xs = comps_for([(n, c) for n in ns], seed)
    ys = comps_for([(m, c) for m in ms], seed + 1)
    d = comps_for([(len(ns), 1, 1, c)], seed + 2)[0]
    x = mj.nested_tensor(xs, ragged_dims=(1,)).requires_grad_()
    if share:
        # y shares x's nested int: its packed values under x's offsets
        y = mj.from_packed(torch.cat(ys) if ys else torch.zeros(0, c, dtype=DT), x.offsets(), x.sizes(), ragged_dims=(1,))
        y = y.detach().requires_grad_()
        assert y.shape[1] == x.shape[1]
    else:
        y = mj.nested_tensor(ys, ragged_dims=(1,)).requires_grad_()
    lins = None
    if linear:
        g = torch.Generator().manual_seed(seed + 3)
        lins = [torch.nn.Linear(c, c, dtype=DT) for _ in range(2)]
        with torch.no_grad():
            for lin in lins:
                for p in lin.parameters():
                    p.copy_(torch.rand(p.shape, generator=g, dtype=DT) * 2 - 1)
    return xs, ys, d, x, y, lins


def _params(lins):
    return [p for lin in lins for p in lin.parameters()] if lins else []


def _forward(f, kind, x, y, d, lins):
    if lins:
        x, y = lins[0](x), lins[1](y)
    return KINDS[kind](f, x, y, d)


def _reference_grads(f, kind, how, xs, ys, d, lins):
    """Per-sample dense gradients of Σ_i loss(sample i) w.r.t. components of x and y, d and the
    Linear parameters."""
    rx = [t.detach().clone().requires_grad_() for t in xs]
    ry = [t.detach().clone().requires_grad_() for t in ys]
    rd = d.detach().clone().requires_grad_()
    first, last = _ragged_span(kind)
    total = rd.sum() * 0
    for i, (a, b) in enumerate(zip(rx, ry)):
        out = _forward(f, kind, a, b, rd[i], lins)
        total = total + _loss(out, how, first - 1, last - 1)
    leaves = rx + ry + [rd] + _params(lins)
    return torch.autograd.grad(total, leaves, allow_unused=True), len(rx)


def _compare(got_x, got_y, got_d, got_params, ref, n, what):
    ref_x, ref_y, ref_d, ref_params = ref[:n], ref[n : 2 * n], ref[2 * n], ref[2 * n + 1 :]
    assert got_x is not None and got_y is not None, f"{what}: a multi_jagged leaf got no gradient"
    for i, (g, r) in enumerate(zip(got_x.unbind(), ref_x)):
        assert_close(g, r, f"{what}: grad x sample {i}")
    for i, (g, r) in enumerate(zip(got_y.unbind(), ref_y)):
        assert_close(g, r, f"{what}: grad y sample {i}")
    if ref_d is not None:
        assert got_d is not None, f"{what}: the dense operand got no gradient"
        assert_close(got_d, ref_d, f"{what}: grad d")
    for k, (g, r) in enumerate(zip(got_params, ref_params)):
        assert g is not None, f"{what}: Linear parameter {k} got no gradient"
        assert_close(g, r, f"{what}: grad Linear parameter {k}")


def _check(op, kind, ns, ms, c, seed, share, linear, how, backward=False):
    f = OPS[op]
    xs, ys, d, x, y, lins = _make(ns, ms, c, seed, share, linear)
    dl = d.detach().clone().requires_grad_()
    out = _forward(f, kind, x, y, dl, lins)
    first, last = _ragged_span(kind)
    loss = _loss(out, how, first, last)
    ref, n = _reference_grads(f, kind, how, xs, ys, d, lins)
    what = f"{op}/{kind}/{'shared' if share else 'separate'}/{how}"
    if backward:
        loss.backward()
        got = (x.grad, y.grad, dl.grad, [p.grad for p in _params(lins)])
    else:
        # every leaf at once, multi_jagged ones first (the inputs tuple that lost y's gradient)
        g = torch.autograd.grad(loss, [x, y, dl, *_params(lins)], allow_unused=True)
        got = (g[0], g[1], g[2], list(g[3:]))
    if kind != "dense_per_sample" and got[2] is None:
        got = (got[0], got[1], torch.zeros_like(d), got[3])  # d unused: dense gives None too
        ref = (*ref[: 2 * n], torch.zeros_like(d) if ref[2 * n] is None else ref[2 * n], *ref[2 * n + 1 :])
    _compare(*got, ref, n, what)
    # README: each operand's gradient carries its own nested int
    assert got[0].shape == x.shape and got[1].shape == y.shape, what
    return out, x, y


@pytest.mark.parametrize("share", [False, True], ids=["separate", "shared"])
@pytest.mark.parametrize("kind", KINDS, ids=str)
@pytest.mark.parametrize("op", OPS, ids=str)
def test_grad_reaches_every_leaf(op, kind, share):
    """``torch.autograd.grad(loss, (x, y, d))``: no ``None``, equal to the dense gradients."""

    @few(3)
    @given(lengths(max_batch=3), st.integers(1, 3), seeds, st.sampled_from(["all", "first_ragged", "last_ragged"]))
    def check(ns, c, seed, how):
        out, x, y = _check(op, kind, ns, ns, c, seed, share, False, how)
        if kind == "elementwise":  # README: the result carries the first operand's nested int
            assert out.shape[1] == x.shape[1]

    check()


@pytest.mark.parametrize("kind", ["square", "pair_vs_row", "col_vs_pair"])
@pytest.mark.parametrize("op", ["add", "mul", "where", "div"])
def test_grad_reaches_every_leaf_rect(op, kind):
    """A rectangular pair from lengths that differ (or, by chance, agree)."""

    @few(3)
    @given(length_pairs(max_batch=3), st.integers(1, 3), seeds, st.sampled_from(["all", "first_ragged", "last_ragged"]))
    def check(nm, c, seed, how):
        ns, ms = nm
        if kind != "square":
            ms = ns  # pair ∘ single needs the single's extent on the pair
        _check(op, kind, ns, ms, c, seed, False, False, how)

    check()


@pytest.mark.parametrize("share", [False, True], ids=["separate", "shared"])
@pytest.mark.parametrize("kind", KINDS, ids=str)
@pytest.mark.parametrize("op", ["add", "mul", "where", "atan2"])
def test_grad_reaches_linear_parameters(op, kind, share):
    """``lin1(x) ∘ lin2(y)``: both layers' weights and biases get their gradients."""

    @few(3)
    @given(lengths(max_batch=3), st.integers(1, 3), seeds, st.sampled_from(["all", "first_ragged", "last_ragged"]))
    def check(ns, c, seed, how):
        _check(op, kind, ns, ns, c, seed, share, True, how)

    check()


@pytest.mark.parametrize("how", ["all", "first_ragged", "last_ragged"])
@pytest.mark.parametrize("share", [False, True], ids=["separate", "shared"])
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_backward_fills_every_grad(kind, share, how):
    """``loss.backward()`` fills ``.grad`` of x, y, the dense operand and both Linear layers."""

    @few(3)
    @given(lengths(max_batch=3), st.integers(1, 3), seeds)
    def check(ns, c, seed):
        _check("mul", kind, ns, ns, c, seed, share, True, how, backward=True)

    check()


# ----------------------------------------------------------------------------- golden cases
def _separate_equal_lengths():
    x = mj.nested_tensor([torch.tensor([[1.0], [2.0]]), torch.zeros(0, 1)], ragged_dims=(1,)).requires_grad_()
    y = mj.nested_tensor([torch.tensor([[3.0], [4.0]]), torch.zeros(0, 1)], ragged_dims=(1,)).requires_grad_()
    assert x.shape[1] != y.shape[1]  # equal lengths, different nested ints
    return x, y


def test_autograd_grad_inputs_tuple_golden():
    """The reported case: ``grad(loss, (x, y))`` gave None for y."""
    x, y = _separate_equal_lengths()
    gx, gy = torch.autograd.grad((x * y).sum(), (x, y))
    assert gy is not None
    assert gx.shape == x.shape and gy.shape == y.shape  # each its own nested int
    torch.testing.assert_close(gx.unbind()[0], torch.tensor([[3.0], [4.0]]))  # = y
    torch.testing.assert_close(gy.unbind()[0], torch.tensor([[1.0], [2.0]]))  # = x


def test_backward_inputs_and_grad_setter_golden():
    """``backward(inputs=[x, y])`` accumulates into x and y themselves; ``x.grad = g`` with g of
    another nested int stores g's values under x's nested int (torch checks the size)."""
    x, y = _separate_equal_lengths()
    (x * y).sum().backward(inputs=[x, y])
    torch.testing.assert_close(y.grad.unbind()[0], torch.tensor([[1.0], [2.0]]))  # = x
    torch.testing.assert_close(x.grad.unbind()[0], torch.tensor([[3.0], [4.0]]))  # = y
    g = mj.nested_tensor([torch.ones(2, 1), torch.zeros(0, 1)], ragged_dims=(1,))
    x.grad = g
    assert x.grad.shape == x.shape
    x.grad.mul_(2)  # an optimizer's in-place update reaches g's values
    torch.testing.assert_close(g.unbind()[0], torch.full((2, 1), 2.0))


def test_rect_pair_reduced_over_first_dim_golden():
    """``z = x.unsqueeze(-2) + y.unsqueeze(-3)`` with x, y of equal lengths: reducing dim 1 gives
    y's structure; its backward once received x relabelled onto y's extent and raised."""
    x, y = _separate_equal_lengths()
    z = x.unsqueeze(-2) * y.unsqueeze(-3)  # (B, j_x, j_y, 1): z[a, b] = x_a · y_b
    assert z.shape[1] == x.shape[1] and z.shape[2] == y.shape[1]
    s = z.sum(1)  # Σ_a x_a y_b = (1 + 2) · y_b
    assert s.shape == y.shape
    gx, gy = torch.autograd.grad((s * s).sum(), (x, y))
    # loss = Σ_b (3 y_b)² ⇒ d/dy_b = 18 y_b; d/dx_a = Σ_b 2 (Σx) y_b² = 2·3·(9 + 16) = 150
    torch.testing.assert_close(gy.unbind()[0], torch.tensor([[54.0], [72.0]]))  # = 18·[3, 4]
    torch.testing.assert_close(gx.unbind()[0], torch.tensor([[150.0], [150.0]]))


def test_in_place_target_is_not_relabelled():
    """``x.add_(y)`` (equal lengths, other nested int) writes into x itself."""
    x = mj.nested_tensor([torch.tensor([[1.0], [2.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    y = mj.nested_tensor([torch.tensor([[3.0], [4.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    x.add_(y)
    torch.testing.assert_close(x.unbind()[0], torch.tensor([[4.0], [6.0]]))  # = [1+3, 2+4]


def test_cotangent_of_other_nested_int_and_hooks():
    """A cotangent built separately with equal lengths is accepted (relabelled onto its output,
    never the inputs); hooks and ``retain_grad`` on an operand see its own gradient."""
    x, y = _separate_equal_lengths()
    seen = []
    y.register_hook(lambda g: seen.append(g.shape))
    h = y * 1.0
    h.retain_grad()
    out = x * h
    cot = mj.nested_tensor([torch.tensor([[1.0], [10.0]]), torch.zeros(0, 1)], ragged_dims=(1,))
    (gx,) = torch.autograd.grad(out, (x,), grad_outputs=(cot,), retain_graph=True)
    torch.testing.assert_close(gx.unbind()[0], torch.tensor([[3.0], [40.0]]))  # = cot · y
    out.backward(cot)
    assert seen == [y.shape]  # the hook saw y's own nested int
    assert h.grad.shape == h.shape
    torch.testing.assert_close(y.grad.unbind()[0], torch.tensor([[1.0], [20.0]]))  # = cot · x


@pytest.mark.parametrize("op", ["cat", "concat", "concatenate", "stack"])
@pytest.mark.parametrize("dim", [1, -1])
def test_list_operand_with_dim_keyword(op, dim):
    """``torch.cat([x, y], dim=…)`` (the list the only positional argument) relabels ``y`` as
    ``torch.cat([x, y], …)`` does: square pairs built separately with equal lengths, every leaf's
    gradient equal to the dense one."""
    f = getattr(torch, op)
    ns = (3, 0, 2)
    xs = comps_for([(n, n, 2) for n in ns], 0)
    ys = comps_for([(n, n, 2) for n in ns], 1)
    lx = [t.clone().requires_grad_() for t in xs]
    ly = [t.clone().requires_grad_() for t in ys]
    x, y = mj.as_nested_tensor(lx, ragged_dims=(1, 2)), mj.as_nested_tensor(ly, ragged_dims=(1, 2))
    out = f([x, y], dim=dim)
    d = dim - 1 if dim > 0 else dim
    ref = [f([a, b], dim=d) for a, b in zip(xs, ys)]
    for i, (o, r) in enumerate(zip(out.unbind(), ref)):
        assert_close(o, r, f"sample {i}")
    got = torch.autograd.grad((out * out).sum(), lx + ly)
    rx, ry = [t.clone().requires_grad_() for t in xs], [t.clone().requires_grad_() for t in ys]
    want = torch.autograd.grad(sum((f([a, b], dim=d) ** 2).sum() for a, b in zip(rx, ry)), rx + ry)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"grad of leaf {k}")


def test_multi_grad_hook_receives_every_gradient():
    """``torch.autograd.graph.register_multi_grad_hook`` (mode "all") hands the hook each
    tensor's gradient — leaf and non-leaf batches beside dense tensors — as their ``.grad`` / a
    plain hook gets it. A values-path result's wrapper-level node never runs (the ops that read
    it read its values), so the hook waited for too few gradients and passed ``None``."""
    comps = [torch.randn(3, 4, dtype=torch.float64), torch.randn(0, 4, dtype=torch.float64),
             torch.randn(2, 4, dtype=torch.float64)]
    x = mj.nested_tensor(comps, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = x * 3
    got, plain = [], []
    torch.autograd.graph.register_multi_grad_hook((x, w, y), lambda gs: got.append(gs))
    y.register_hook(lambda g: plain.append(g))
    (y * w).sum().backward()
    gx, gw, gy = got[0]
    for a, b in zip(gx.unbind(), x.grad.unbind()):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(gw, w.grad)
    for a, b, c in zip(gy.unbind(), plain[0].unbind(), comps):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, w.detach().expand_as(c))


@pytest.mark.parametrize("op", ["copysign", "nextafter"])
@pytest.mark.parametrize("wshape", [(3,), (1, 3), (2, 1, 3)])
def test_dense_operand_broadcast_over_ragged_dims_with_a_zero_derivative_other(op, wshape):
    """``copysign(w, x)`` / ``nextafter(w, x)``, ``w`` dense with an explicit size-1 dim broadcast
    over the ragged dim: ``w``'s gradient and ``x``'s (zeros, as dense's) per sample; and with
    only ``x`` requiring grad the result still requires grad, as dense's."""
    f = getattr(torch, op)
    shapes = [(2, n, 3) for n in (3, 0, 2)] if len(wshape) == 3 else [(n, 3) for n in (3, 0, 2)]
    comps = [c.requires_grad_() for c in comps_for(shapes, 5)]
    w = comps_for([wshape], 6)[0].requires_grad_()
    x = mj.as_nested_tensor(comps)
    out = f(w, x)
    for a, c in zip(out.unbind(), comps):
        assert torch.equal(a, f(w, c))
    got = torch.autograd.grad((out * out).values().sum(), [w, *comps])
    want = torch.autograd.grad(sum((f(w, c) ** 2).sum() for c in comps), [w, *comps])
    for a, b in zip(got, want):
        assert_close(a, b, op)
    only_x = f(w.detach(), x)
    assert only_x.requires_grad
    for g in torch.autograd.grad(only_x.values().sum(), comps):
        assert not g.any()


@pytest.mark.parametrize("kind", ["tokens", "pair", "images"])
def test_accumulated_leaf_gradient_keeps_the_leafs_layout(kind):
    # AccumulateGrad keeps a gradient whose strides agree with the leaf's (the gradient layout
    # contract): a leaf of contiguous packed values is dense per sample, so its gradient keeps the
    # packed layout across accumulations rather than being copied into torch.jagged's
    # contiguous order (a transposing copy for channels-last images, which every later
    # accumulation then read strided).
    g = torch.Generator().manual_seed(3)
    if kind == "tokens":
        comps, rd = [torch.randn(n, 3, generator=g, dtype=DT) for n in (4, 0, 6)], (1,)
    elif kind == "pair":
        comps, rd = [torch.randn(n, n, 3, generator=g, dtype=DT) for n in (4, 0, 6)], (1, 2)
    else:
        comps, rd = [torch.randn(3, h, w, generator=g, dtype=DT) for h, w in ((4, 5), (0, 3), (6, 2))], (2, 3)
    x = mj.nested_tensor(comps, ragged_dims=rd).requires_grad_()
    for _ in range(2):
        (x * x).sum().backward()
    assert x.grad._values.stride() == x._values.stride()
    for gi, ci in zip(x.grad.unbind(), comps):
        assert_close(gi, 4 * ci)
