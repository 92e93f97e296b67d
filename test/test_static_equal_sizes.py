"""Static sizes equal to a ragged dim's size in every sample (NOTE [ Static sizes equal to a ragged dim ]
in ops/_routing.py): dense operands, ``clamp`` bounds, ``copy_`` sources and ``cat`` operands of that
size, against the per-sample reference (values, gradients, a zero-length sample)."""

import pytest
import torch

import torch_multijagged as mj

from _reference import PS, R, assert_close, components, per_sample_check

DTYPES = (torch.float32, torch.float64)

# name: (component shapes, ragged dims of the multi_jagged operand); every ragged size is the same
# in every sample, so a dense operand of that size is each sample's own shape
_CASES = {
    "one pair, one ragged dim": ([(4, 4, 3)], (1,)),
    "equal pairs, one ragged dim": ([(3, 3, 2)] * 3, (1,)),
    "equal pairs, square": ([(3, 3, 2)] * 2, (1, 2)),
    "an empty pair": ([(0, 0, 2)], (1,)),
    "ragged last": ([(2, 3)] * 2, (2,)),
}


def _dense_forms(shapes, dtype):
    """The dense operand as ``(B, …)`` (per sample), ``(1, …)`` and without a batch dim (shared)."""
    g = torch.Generator().manual_seed(7)
    b, s = len(shapes), shapes[0]
    return {
        "per sample": PS(torch.randn(b, *s, generator=g, dtype=dtype)),
        "batch of one": torch.randn(1, *s, generator=g, dtype=dtype),
        "no batch dim": torch.randn(*s, generator=g, dtype=dtype),
    }


_OPS = {
    "add": lambda z, t: z + t,
    "radd": lambda z, t: t + z,
    "mul": torch.mul,
    "where": lambda z, t: torch.where(z > 0, z, t),
    "clamp min": lambda z, t: torch.clamp(z, min=t),
    "clamp max": lambda z, t: z.clamp(max=t),
    "clamp both": lambda z, t: torch.clamp(z, t - 0.5, t + 0.5),
    "copy_": lambda z, t: (z * 1.0).copy_(t) * z,
    "add_": lambda z, t: (z * 1.0).add_(t),
    "cat last": lambda z, t: torch.cat([z, t], -1),
    "cat dense first": lambda z, t: torch.cat([t, z * 2.0], -1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", ["per sample", "batch of one", "no batch dim"])
@pytest.mark.parametrize("op", list(_OPS))
@pytest.mark.parametrize("case", list(_CASES))
def test_dense_operand_of_every_ragged_size(case, op, form, dtype):
    """A dense operand whose size along a ragged dim is every sample's size there combines as each
    sample's dense op, the result ragged where the multi_jagged operand is; gradients reach both."""
    shapes, rd = _CASES[case]
    t = _dense_forms(shapes, dtype)[form]
    if op.startswith("cat") and rd[-1] == len(shapes[0]):
        pytest.skip("cat along the ragged dim itself: joins.py's rule (sizes add)")
    f = _OPS[op]
    ref = (lambda z, t: f(z, t[0])) if form == "batch of one" else f
    out = per_sample_check(f, R(components(shapes, 0, dtype), rd), t, ref=ref)
    assert out.ragged_dims == rd and out.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cat_along_a_static_dim_with_a_dense_operand(dtype):
    """``cat`` along a static dim, the dense operand's other sizes every sample's ragged ones."""
    shapes = [(3, 3, 2)] * 2
    t = torch.randn(2, 3, 5, 2, dtype=dtype)
    per_sample_check(lambda z, d: torch.cat([z, d], -2), R(components(shapes, 1, dtype), (1,)), PS(t))
    per_sample_check(lambda z, d: torch.cat([d, z], -2), R(components(shapes, 1, dtype), (1,)), PS(t))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multi_jagged_bound_copy_and_cat_with_a_static_size(dtype):
    """The multi_jagged forms: a ``clamp`` bound given by keyword, ``copy_``'s source and ``cat``'s
    operands, one static where the other is ragged with that size in every sample."""
    static, square = components([(3, 3, 2)] * 2, 0, dtype), components([(3, 3, 2)] * 2, 1, dtype)
    for a, b in ((R(static, (1,)), R(square, (1, 2))), (R(square, (1, 2)), R(static, (1,)))):
        per_sample_check(lambda x, y: torch.clamp(x, min=y), a, b, new_ragged=True)
        per_sample_check(lambda x, y: x.clamp(max=y * 0.5), a, b, new_ragged=True)
        per_sample_check(lambda x, y: torch.cat([x, y], -1), a, b, new_ragged=True)
        per_sample_check(lambda x, y: (x * 1.0).copy_(y) + x, a, b, new_ragged=True)


def _incoming_einsum(a, b):  # Boltz's TriangleMultiplicationIncoming
    return torch.einsum("bkic,bkjc->bijc", a, b)


def _incoming_matmul(a, b):  # OpenFold's: permute_final_dims(a, (2, 1, 0)) @ permute_final_dims(b, (2, 0, 1))
    return torch.matmul(a.permute(0, 3, 2, 1), b.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class _TriangleIncoming(torch.nn.Module):
    """The incoming triangle multiplicative update as Boltz / OpenFold write it for a padded batch,
    without the mask."""

    def __init__(self, c, contract, dtype):
        super().__init__()
        kw = {"dtype": dtype}
        self.norm_in, self.norm_out = torch.nn.LayerNorm(c, **kw), torch.nn.LayerNorm(c, **kw)
        self.p_in, self.g_in = torch.nn.Linear(c, 2 * c, **kw), torch.nn.Linear(c, 2 * c, **kw)
        self.p_out, self.g_out = torch.nn.Linear(c, c, **kw), torch.nn.Linear(c, c, **kw)
        self.contract = contract

    def forward(self, x):
        x = self.norm_in(x)
        x_in = x
        x = self.p_in(x) * self.g_in(x).sigmoid()
        a, b = torch.chunk(x, 2, dim=-1)
        x = self.contract(a, b)
        return x_in + self.p_out(self.norm_out(x)) * self.g_out(x_in).sigmoid()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("contract", [_incoming_einsum, _incoming_matmul], ids=["einsum", "matmul"])
@pytest.mark.parametrize("lengths", [(5,), (4, 4), (0,), (3, 3, 3)], ids=str)
def test_triangle_incoming_at_equal_lengths(lengths, contract, dtype):
    """A batch of pairs of one length built by ``torch.nested.nested_tensor`` is ``(B, j0, n, C)``;
    the incoming update contracts its one ragged dim into a dense ``(B, n, n, C)``, which then
    combines with the pair as each sample's dense tensors do; gradients of the pair and the
    weights; changing one sample leaves the others unchanged."""
    torch.manual_seed(0)
    c = 4
    m = _TriangleIncoming(c, contract, dtype)
    comps = [torch.randn(n, n, c, dtype=dtype) for n in lengths]
    z = torch.nested.nested_tensor(comps, layout=mj.multi_jagged).requires_grad_()
    assert z.ragged_dims == (1,)
    out = m(z)
    assert out.shape[1] is z.shape[1] and out.ragged_dims == (1,)
    params = list(m.parameters())
    cot = [torch.randn_like(t) for t in comps]
    got = torch.autograd.grad(sum((o * g).sum() for o, g in zip(out.unbind(), cot)), [z, *params])
    leaves = [t.clone().requires_grad_() for t in comps]
    want_out = [m(t.unsqueeze(0)).squeeze(0) for t in leaves]
    want = torch.autograd.grad(sum((o * g).sum() for o, g in zip(want_out, cot)), [*leaves, *params])
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    for o, w in zip(out.unbind(), want_out):
        assert_close(o, w.detach(), "output", **tol)
    for gz, w in zip(got[0].unbind(), want[: len(comps)]):
        assert_close(gz, w, "grad of the pair", **tol)
    for gp, w in zip(got[1:], want[len(comps):]):
        assert_close(gp, w, "grad of a weight", **tol)
    if len(lengths) > 1:  # no leakage: another sample 1 leaves sample 0 as it was
        other = [comps[0], *(t + 1.0 for t in comps[1:])]
        again = m(torch.nested.nested_tensor(other, layout=mj.multi_jagged))
        assert torch.equal(again.unbind()[0], out.unbind()[0])


def test_dense_operand_of_another_size_raises():
    z = mj.as_nested_tensor([torch.randn(4, 4, 2), torch.randn(3, 4, 2)])  # (2, j0, 4, 2)
    with pytest.raises(mj.StructureError, match="a dense operand has size 4 along ragged dim 1"):
        z + torch.randn(2, 4, 4, 2)
    with pytest.raises(mj.StructureError, match="a dense operand has size 4 along ragged dim 1"):
        torch.clamp(z, min=torch.randn(4, 4, 2))
    with pytest.raises(mj.StructureError, match="a dense operand has size 4 along ragged dim 1"):
        z.clone().copy_(torch.randn(2, 4, 4, 2))
    with pytest.raises(TypeError, match="expected all tensors to be multi_jagged"):
        torch.cat([z, torch.randn(2, 4, 4, 2)], -1)


def test_dense_operand_of_every_ragged_size_raises_under_compile():
    """Under torch.compile the sizes are symbols: the error says what eager does and what to write."""
    z = mj.as_nested_tensor([torch.randn(3, 3, 2)])
    t = torch.randn(1, 3, 3, 2)
    for fn in (lambda a, b: a * b, lambda a, b: torch.clamp(a, min=b), lambda a, b: a.clone().copy_(b)):
        f = torch.compile(fn, backend="eager", fullgraph=True)
        with pytest.raises(Exception, match="under torch.compile the sizes are symbols"):
            f(z, t)


@pytest.mark.parametrize("op", ["add_", "mul_", "copy_", "iadd"])
@pytest.mark.parametrize("shape", [(3, 2), (1, 3, 2)])
def test_in_place_op_on_a_dense_self_of_the_ragged_size_raises(op, shape):
    # dense refuses to write a (2, 3, 2) result into a (3, 2) self; the dense self is never
    # made multi_jagged behind the caller's back (a write into that copy would be lost)
    x = mj.nested_tensor([torch.ones(3, 2), 2 * torch.ones(3, 2)])
    t = torch.zeros(shape)
    with pytest.raises((RuntimeError, TypeError)):
        if op == "iadd":
            t += x
        else:
            getattr(t, op)(x)
    assert type(t) is torch.Tensor and not t.any()


@pytest.mark.parametrize("lengths", [(3, 3), (4,), (1, 1), (2, 3), (0, 0)])
def test_bmm_of_graphs_of_one_size(lengths):
    # an adjacency of graphs of one size n is (B, j0, n): bmm (as @) reads its static n as the
    # features' ragged dim (it raised; with n = 1 its backward failed)
    g = torch.Generator().manual_seed(0)
    a = [torch.rand(n, n, dtype=torch.float64, generator=g) for n in lengths]
    x = [torch.randn(n, 4, dtype=torch.float64, generator=g) for n in lengths]
    rd = (1,) if len(set(lengths)) == 1 else (1, 2)
    per_sample_check(torch.bmm, R(a, rd), R(x, (1,)), ref=torch.mm, new_ragged=True)
    per_sample_check(torch.matmul, R(a, rd), R(x, (1,)), new_ragged=True)


@pytest.mark.parametrize("lengths", [(3, 3), (4,), (0,)])
def test_diffpool_of_graphs_of_one_size(lengths):
    # Sᵀ A S: (Sᵀ A) is a dense (B, K, n) that contracts S's ragged dim, of size n in every sample
    # (it raised); the other order too, (B, K, j0) @ a dense (B, n, C)
    g = torch.Generator().manual_seed(0)
    a = [torch.rand(n, n, dtype=torch.float64, generator=g) for n in lengths]
    s = [torch.rand(n, 2, dtype=torch.float64, generator=g) for n in lengths]
    per_sample_check(lambda x, y: (y.transpose(-1, -2) @ x) @ y, R(a, (1,)), R(s, (1,)), dense_out=True)
    c = PS(torch.randn(len(lengths), lengths[0], 3, dtype=torch.float64, generator=g))
    per_sample_check(lambda y, w: y.transpose(-1, -2) @ w, R(s, (1,)), c, dense_out=True)


def test_bmm_of_a_dense_operand_contracting_a_ragged_dim_of_its_size():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 5, dtype=torch.float64, generator=g) for _ in range(3)]  # every j0 == 4
    s = PS(torch.randn(3, 2, 4, dtype=torch.float64, generator=g))
    per_sample_check(lambda w, x: torch.bmm(w, x), s, R(xs, (1,)), ref=torch.mm, dense_out=True)
    per_sample_check(lambda x, w: torch.bmm(x.transpose(1, 2), w.transpose(1, 2)), R(xs, (1,)), s,
                     ref=lambda x, w: torch.mm(x.t(), w.t()), dense_out=True)
    with pytest.raises(RuntimeError, match="bmm"):
        torch.bmm(torch.randn(2, 2, 4), mj.nested_tensor([torch.randn(n, 5) for n in (4, 3)]))
