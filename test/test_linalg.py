"""Linear algebra of the matrices a batch holds (NOTE [ Matrices in a batch ] in
``ops/contractions/linalg.py``): ``torch.linalg`` on static matrix dims ``(B, j0, n, n)`` and on
square pairs ``(B, j0, j0)``, against the function on each sample: every output, gradients to
every input, second order, a zero-length sample, an empty batch and the structure errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import StructureError
from _reference import R, complex_grad_check, few, per_sample_check, seeds

F64 = torch.float64


def _matrix(n: int, kind: str, g: torch.Generator, lead=()) -> torch.Tensor:
    a = torch.randn(*lead, n, n, dtype=F64, generator=g)
    eye = torch.eye(n, dtype=F64)
    if kind == "spd":
        return a @ a.transpose(-1, -2) + n * eye
    if kind == "sym":
        return (a + a.transpose(-1, -2)) / 2 + torch.diag(torch.arange(n, dtype=F64) * 3)  # distinct eigenvalues
    if kind == "tri":
        return torch.tril(a) + 2 * n * eye
    return a + 2 * n * eye


def _ragged_rows(lengths, n, kind, seed):
    g = torch.Generator().manual_seed(seed)
    return [_matrix(n, kind, g, (m,)) for m in lengths]


def _tuple(out):
    return tuple(out) if isinstance(out, tuple) else out


FUNCTIONS = {  # name: (function on one matrix or a batch of them, kind, has a gradient)
    "inv": (torch.linalg.inv, "gen", True),
    "inverse method": (lambda a: a.inverse(), "gen", True),
    "det": (torch.linalg.det, "gen", True),
    "logdet": (torch.logdet, "spd", True),
    "slogdet": (lambda a: _tuple(torch.linalg.slogdet(a)), "gen", True),
    "cholesky": (torch.linalg.cholesky, "spd", True),
    "eigh": (lambda a: _tuple(torch.linalg.eigh(a)), "sym", True),
    "eigvalsh": (torch.linalg.eigvalsh, "sym", True),
    "qr": (lambda a: _tuple(torch.linalg.qr(a)), "gen", True),
    "svd": (lambda a: _tuple(torch.linalg.svd(a)), "sym", True),
    "svdvals": (torch.linalg.svdvals, "gen", True),
    "matrix_exp": (torch.linalg.matrix_exp, "gen", True),
    "matrix_power 3": (lambda a: torch.linalg.matrix_power(a, 3), "gen", True),
    "matrix_power -1": (lambda a: torch.matrix_power(a, -1), "gen", True),
    "pinv": (torch.linalg.pinv, "gen", True),
    "matrix_norm nuc": (lambda a: torch.linalg.matrix_norm(a, "nuc"), "gen", True),
    "matrix_rank": (torch.linalg.matrix_rank, "gen", False),
    "cond": (torch.linalg.cond, "gen", True),
    "lu_factor": (lambda a: _tuple(torch.linalg.lu_factor(a)), "gen", False),
    "inv_ex": (lambda a: _tuple(torch.linalg.inv_ex(a)), "gen", False),
    "lstsq": (lambda a: torch.linalg.lstsq(a, a.sin()).solution, "gen", True),
    "aten _linalg_eigh": (lambda a: tuple(torch.ops.aten._linalg_eigh.default(a)), "sym", True),
    "aten _linalg_svd": (lambda a: tuple(torch.ops.aten._linalg_svd.default(a)), "sym", True),
    "aten _linalg_solve_ex": (lambda a: torch.ops.aten._linalg_solve_ex.default(a, a.cos())[0], "gen", True),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@few(4)
@given(lengths=st.lists(st.integers(0, 3), min_size=1, max_size=3), n=st.integers(1, 3), seed=seeds)
def test_static_matrices_per_sample(name, lengths, n, seed):
    fn, kind, grad = FUNCTIONS[name]
    comps = _ragged_rows(lengths, n, kind, seed)
    probe = fn(comps[0])
    for k in range(len(probe)) if isinstance(probe, tuple) else [None]:  # each output on its own
        one = fn if k is None else (lambda a, k=k: fn(a)[k])
        per_sample_check(one, R(comps, (1,)), grad=grad and (k is None or probe[k].is_floating_point()), seed=seed,
                         rtol=1e-6, atol=1e-8)


def _square_pairs(lengths, kind, seed):
    g = torch.Generator().manual_seed(seed)
    return [_matrix(m, kind, g) for m in lengths]


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@few(4)
@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=3), seed=seeds)
def test_square_pairs_per_sample(name, lengths, seed):
    fn, kind, grad = FUNCTIONS[name]
    comps = _square_pairs(lengths, kind, seed)
    x = mj.as_nested_tensor([c.clone().requires_grad_(grad) for c in comps], ragged_dims=(1, 2))
    out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    refs = [fn(c) for c in comps]
    refs = [r if isinstance(r, tuple) else (r,) for r in refs]
    for k, o in enumerate(outs):
        got = o.unbind() if isinstance(o, mj.MultiJaggedTensor) else list(o)
        for a, r in zip(got, refs):
            torch.testing.assert_close(a, r[k], rtol=1e-6, atol=1e-8)
    if isinstance(outs[0], mj.MultiJaggedTensor) and outs[0].dim() == 3:
        assert outs[0].shape[1] is x.shape[1] and outs[0].shape[2] is x.shape[2]  # the input's nested ints


def test_square_pairs_gradients_and_second_order():
    g = torch.Generator().manual_seed(0)
    comps = [_matrix(n, "gen", g).requires_grad_() for n in (3, 0, 2)]
    x = mj.as_nested_tensor(comps, ragged_dims=(1, 2))
    y, d = torch.linalg.inv(x), torch.linalg.det(x)
    loss = (y * y).sum() + (d * d).sum()
    ref = sum((torch.linalg.inv(c) ** 2).sum() + torch.linalg.det(c) ** 2 for c in comps)
    got = torch.autograd.grad(loss, comps, create_graph=True)
    want = torch.autograd.grad(ref, comps, create_graph=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    g2 = torch.autograd.grad(sum((t * t).sum() for t in got), comps)
    h2 = torch.autograd.grad(sum((t * t).sum() for t in want), comps)
    for a, b in zip(g2, h2):
        torch.testing.assert_close(a, b)
    assert type(d) is torch.Tensor and d.shape == (3,)  # a scalar per sample: dense (B,)
    ev = torch.linalg.eigvalsh(x @ x.transpose(1, 2))
    assert ev.shape[1] is x.shape[1]  # a vector per sample rides on the pair's extent


@few(8)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3), st.integers(1, 3), seeds, st.booleans())
def test_solve_two_operands(lengths, n, seed, vector):
    a = _ragged_rows(lengths, n, "gen", seed)
    g = torch.Generator().manual_seed(seed + 1)
    b = [torch.randn(m, n, *(() if vector else (2,)), dtype=F64, generator=g) for m in lengths]
    per_sample_check(torch.linalg.solve, R(a, (1,)), R(b, (1,)), seed=seed, rtol=1e-6, atol=1e-8)
    tri = _ragged_rows(lengths, n, "tri", seed)
    if not vector:
        per_sample_check(lambda p, q: torch.linalg.solve_triangular(p, q, upper=False), R(tri, (1,)), R(b, (1,)), seed=seed,
                         rtol=1e-6, atol=1e-8)
    rhs = torch.randn(n, 2, dtype=F64, generator=g)  # a dense right-hand side shared by every matrix
    if n == 2 and n in lengths:  # dense torch reads (2, 2) as vectors for a sample of 2 matrices only
        with pytest.raises(NotImplementedError, match="batch of vectors"):
            torch.linalg.solve(mj.as_nested_tensor(a), rhs)
    else:
        per_sample_check(torch.linalg.solve, R(a, (1,)), rhs, seed=seed, rtol=1e-6, atol=1e-8)



def test_solve_dense_right_hand_side_as_many_as_the_batch_matrices():
    # three matrices in all, (3, 3) on the right: each sample (1 and 2 matrices) reads it as a
    # matrix, as dense torch does; the packed values (3 matrices) must not read it as vectors
    a = _ragged_rows([1, 2], 3, "gen", 0)
    rhs = torch.randn(3, 3, dtype=F64)
    per_sample_check(torch.linalg.solve, R(a, (1,)), rhs, seed=0, rtol=1e-6, atol=1e-8)


@few(6)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=3), seeds)
def test_cross_of_static_vectors(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    a = [torch.randn(m, 2, 3, dtype=F64, generator=g) for m in lengths]
    b = [torch.randn(m, 2, 3, dtype=F64, generator=g) for m in lengths]
    per_sample_check(lambda x, y: torch.linalg.cross(x, y), R(a, (1,)), R(b, (1,)), share=True, seed=seed)
    per_sample_check(lambda x, y: torch.linalg.cross(x.transpose(-1, -2), y.transpose(-1, -2), dim=-2),
                     R(a, (1,)), R(b, (1,)), share=True, seed=seed)


def test_torch_cross_as_linalg_cross():
    # torch.cross / Tensor.cross take the dim positionally and, without it, dense's deprecated
    # default: the first dim of size 3, where no ragged dim (of size 3 in some samples) precedes it
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(m, 3, dtype=F64, generator=g) for m in (3, 0, 2)]
    b = [torch.randn(m, 3, dtype=F64, generator=g) for m in (3, 0, 2)]
    per_sample_check(lambda x, y: torch.cross(x, y, -1), R(a, (1,)), R(b, (1,)), share=True, seed=0)
    per_sample_check(lambda x, y: x.cross(y, dim=-1), R(a, (1,)), R(b, (1,)), share=True, seed=0)
    c = [t.t().contiguous() for t in a]  # (3, m): dim 1 is the first of size 3 in every sample
    d = [t.t().contiguous() for t in b]
    with pytest.warns(UserWarning, match="dim"):
        per_sample_check(lambda x, y: torch.cross(x, y), R(c, (2,)), R(d, (2,)), share=True, seed=0)
    with pytest.raises(StructureError, match="pass dim="):
        torch.cross(mj.nested_tensor(a), mj.nested_tensor(b))


def test_linalg_check_errors_on_the_packed_infos():
    ok = mj.as_nested_tensor([torch.zeros(2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)])
    assert torch.ops.aten._linalg_check_errors.default(ok, "linalg.inv", is_matrix=False) is None
    bad = mj.as_nested_tensor([torch.zeros(2, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)])
    with pytest.raises(RuntimeError, match="linalg.inv"):
        torch.ops.aten._linalg_check_errors.default(bad, "linalg.inv", is_matrix=False)


def test_lstsq_fields_of_the_default_driver():
    comps = _ragged_rows([2, 0, 1], 3, "gen", 0)
    out = torch.linalg.lstsq(mj.as_nested_tensor(comps), mj.as_nested_tensor(comps))
    for k, f in enumerate(out):
        refs = [torch.linalg.lstsq(c, c)[k] for c in comps]
        if isinstance(f, mj.MultiJaggedTensor):
            for a, r in zip(f.unbind(), refs):
                torch.testing.assert_close(a, r)
        else:  # a field the driver leaves empty stays empty, as dense
            assert f.numel() == 0 and all(r.numel() == 0 for r in refs)


def test_empty_batch_of_square_pairs():
    x = mj.from_packed(torch.zeros(0, dtype=F64), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 2, dtype=torch.int64),
                       ragged_dims=(1, 2))
    assert torch.linalg.det(x).shape == (0,)
    assert torch.linalg.inv(x).shape[0] == 0


def test_structure_errors():
    rect = mj.as_nested_tensor([torch.randn(2, 3), torch.randn(1, 2)], ragged_dims=(1, 2))
    with pytest.raises(RuntimeError, match="square"):  # per sample, as dense: not square matrices
        torch.linalg.inv(rect)
    seq = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)], layout=mj.multi_jagged)
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.det(seq)
    heads = mj.nested_tensor([torch.randn(2, 3, 3), torch.randn(1, 3, 3)]).transpose(1, 2)  # (B, 3, j0, 3)
    with pytest.raises(StructureError, match="matrix dims"):
        torch.linalg.det(heads)
    a = mj.as_nested_tensor([torch.eye(2).expand(n, 2, 2) for n in (1, 2)])
    b = mj.as_nested_tensor([torch.ones(n, 2) for n in (2, 1)])
    with pytest.raises(StructureError, match="differ in structure"):
        torch.linalg.solve(a, b)


RECT_FUNCTIONS = {  # name: function of one (n, C) or (C, n) matrix
    "qr": lambda a: _tuple(torch.linalg.qr(a)),
    "svdvals": torch.linalg.svdvals,
    "svd reduced": lambda a: _tuple(torch.linalg.svd(a, full_matrices=False))[1],
    "pinv": torch.linalg.pinv,
    "matrix_norm": torch.linalg.matrix_norm,
    "matrix_norm ord 1": lambda a: torch.linalg.matrix_norm(a, ord=1),
    "matrix_norm dims named": lambda a: torch.linalg.matrix_norm(a, dim=(-2, -1) if a.dim() == 2 else (1, 2)),
    "matrix_norm dims swapped": lambda a: torch.linalg.matrix_norm(a, ord=1, dim=(-1, -2) if a.dim() == 2 else (2, 1)),
    # positional: keepdim after a positional dim stays keepdim
    "matrix_norm positional": lambda a: torch.linalg.matrix_norm(a, "fro", (-2, -1), True),
    "matrix_norm positional swapped": lambda a: torch.linalg.matrix_norm(a, 1, (-1, -2), True),
    "matrix_norm positional no keepdim": lambda a: torch.linalg.matrix_norm(a, "fro", (-2, -1), False),
}


@pytest.mark.parametrize("name", sorted(RECT_FUNCTIONS))
@pytest.mark.parametrize("transposed", [False, True])
def test_one_rectangular_matrix_per_sample(name, transposed):
    """``(B, j0, C)`` (or its transpose): one ``nᵢ × C`` matrix per sample, the function on each;
    outputs of one shape stacked, others a new batch; gradients to every sample."""
    f = RECT_FUNCTIONS[name]
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=F64) for n in (5, 4, 0, 3)]
    if transposed:
        comps = [c.T.contiguous() for c in comps]
    x = mj.nested_tensor(comps, requires_grad=True)
    out = f(x)
    leaves = [c.clone().requires_grad_() for c in comps]
    ref = [f(c) for c in leaves]
    outs = out if isinstance(out, tuple) else (out,)
    refs = list(zip(*ref)) if isinstance(ref[0], tuple) else [ref]
    total = 0
    for o, r in zip(outs, refs):
        parts = o.unbind() if isinstance(o, mj.MultiJaggedTensor) else list(o)
        for a, b in zip(parts, r):
            torch.testing.assert_close(a, b)
        total = total + (o * o).sum() if not isinstance(o, mj.MultiJaggedTensor) else total + (o * o).sum()
    gx, = torch.autograd.grad(total, x)
    rtotal = sum((b * b).sum() for r in refs for b in r)
    # a norm of an empty matrix is a constant 0 in dense (no gradient: zeros)
    for a, b, c in zip(gx.unbind(), torch.autograd.grad(rtotal, leaves, allow_unused=True), comps):
        torch.testing.assert_close(a, torch.zeros_like(c) if b is None else b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
def test_vecdot_along_a_ragged_or_static_dim(dtype):
    """``linalg.vecdot`` per sample along the ragged dim (a dense ``(B, C)``) or a static one,
    gradients of both operands included (complex ones through ``complex_grad_check``)."""
    ns = (3, 0, 5)
    g = torch.Generator().manual_seed(0)
    xs, ys = ([torch.randn(n, 3, dtype=dtype, generator=g) for n in ns] for _ in range(2))
    for dim in (1, 2, -1):
        ref = lambda a, b, d=dim: torch.linalg.vecdot(a, b, dim=d - 1 if d > 0 else d)  # noqa: E731
        fn = lambda a, b, d=dim: torch.linalg.vecdot(a, b, dim=d)  # noqa: E731
        if dtype.is_complex:
            complex_grad_check(fn, R(xs, (1,)), R(ys, (1,)), ref=ref)
        else:
            tol = 1e-5 if dtype == torch.float32 else 1e-7
            per_sample_check(fn, R(xs, (1,)), R(ys, (1,)), ref=ref, dense_out=dim == 1, share=True, rtol=tol, atol=tol)
    x = mj.nested_tensor(xs)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.vecdot(x, x.to(torch.complex64 if dtype.is_complex else torch.float16), dim=1)
    ints = mj.nested_tensor([torch.ones(2, 3, dtype=torch.long)])
    with pytest.raises(RuntimeError, match="floating point or complex"):
        torch.linalg.vecdot(ints, ints, dim=1)


@pytest.mark.parametrize("spelling,ord", [("linalg.norm", o) for o in ("nuc", 2, -2, float("inf"), 1)] + [("norm", "nuc")])
def test_matrix_norms_through_norm_over_static_dims(ord, spelling):
    """``torch.linalg.norm(x, ord, dim=(-2, -1))`` and ``torch.norm(x, "nuc", dim=…)`` over the static
    matrix dims of ``(B, j0, 3, 4)``: each sample's matrices' norms, as ``matrix_norm``, with
    gradients (an empty sample included)."""
    g = torch.Generator().manual_seed(0)
    cs = [torch.randn(n, 3, 4, dtype=torch.float64, generator=g, requires_grad=True) for n in (2, 0, 3)]
    f = (lambda t: torch.linalg.norm(t, ord, dim=(-2, -1))) if spelling == "linalg.norm" else \
        (lambda t: torch.norm(t, "nuc", dim=(-2, -1)))
    out = f(mj.as_nested_tensor(cs))
    refs = [f(c) for c in cs]
    for a, r in zip(out.unbind(), refs):
        torch.testing.assert_close(a, r)
    got = torch.autograd.grad(sum(a.sum() for a in out.unbind()), cs)
    want = torch.autograd.grad(sum(r.sum() for r in refs), cs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
