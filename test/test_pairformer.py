"""A Pairformer pair stack (AlphaFold 3's trunk) written the usual OpenFold way — no masks, no
offsets, no padding in user code — run unchanged on ``z: (B, j0, j0, C)`` multi_jagged pairs.

Every module below is plain dense PyTorch; it runs once on the multi_jagged batch and once per
sample on that sample's dense ``(1, N, N, C)`` tensor (a batch of one, in float64). Outputs,
the gradient of the input pair and the gradient of every parameter (``torch.autograd.grad`` over
all of them; the reference's parameter gradients are summed over samples by construction) must
agree. Each structure holds a zero-length sample unless it is a B = 1 case.

Pieces: triangle multiplicative update (outgoing / incoming; ``einsum`` with ``...``, ``einsum``
with a batch letter, ``matmul`` on channel-first permutes), triangle attention (starting node;
ending node = the same on ``z.transpose(-2, -3)``) through ``F.scaled_dot_product_attention``
with a pair bias ``(B, 1, H, j0, j0)``, single attention with pair bias (AF3 AttentionPairBias,
bias ``(B, H, j0, j0)``), the pair transition (SwiGLU / ReLU) and the whole block with
residuals, eager (grad, ``no_grad``, ``inference_mode``), compiled (``fullgraph=True``, one
graph across lengths) and second order for the triangle multiplication.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj
from _reference import few, seeds
from _structures import lengths, packed_args

DT = torch.float64
CZ, CS, HID, H, D = 5, 4, 4, 2, 3  # pair channels, single channels, tri-mult hidden, heads, head dim
PAIR = (1, 2)
SINGLE = (1,)

# B = 3 with a zero-length sample, B = 4 with one, B = 1 (non-empty), B = 2 all non-empty
LENS = [(3, 0, 2), (1, 4, 0, 2), (3,), (2, 3)]


# ----------------------------------------------------------------------------- modules (dense code)
def _outgoing(a, b, contraction):
    """``x[i, j] = Σ_k a[i, k] * b[j, k]`` per channel."""
    if contraction == "einsum":
        return torch.einsum("...ikc,...jkc->...ijc", a, b)
    if contraction == "einsum_b":
        return torch.einsum("bikc,bjkc->bijc", a, b)
    # OpenFold's matmul form: channel-first (B, C, i, k) @ (B, C, k, j), then channels last
    return (a.permute(0, 3, 1, 2) @ b.permute(0, 3, 2, 1)).permute(0, 2, 3, 1)


def _incoming(a, b, contraction):
    """``x[i, j] = Σ_k a[k, i] * b[k, j]`` per channel."""
    if contraction == "einsum":
        return torch.einsum("...kic,...kjc->...ijc", a, b)
    if contraction == "einsum_b":
        return torch.einsum("bkic,bkjc->bijc", a, b)
    return (a.permute(0, 3, 2, 1) @ b.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class TriangleMultiplication(nn.Module):
    """AF3 Algorithm 12 / 13: LayerNorm in, gated projections to ``a, b`` (``chunk(2, -1)``), the
    contraction over the third node, LayerNorm out, output projection gated by ``z``."""

    def __init__(self, c=CZ, hidden=HID, outgoing=True, contraction="einsum"):
        super().__init__()
        self.outgoing, self.contraction = outgoing, contraction
        self.ln_in, self.ln_out = nn.LayerNorm(c, dtype=DT), nn.LayerNorm(hidden, dtype=DT)
        self.p_in, self.g_in = nn.Linear(c, 2 * hidden, dtype=DT), nn.Linear(c, 2 * hidden, dtype=DT)
        self.p_out, self.g_out = nn.Linear(hidden, c, dtype=DT), nn.Linear(c, c, dtype=DT)

    def forward(self, z):
        z = self.ln_in(z)
        a, b = (torch.sigmoid(self.g_in(z)) * self.p_in(z)).chunk(2, dim=-1)
        x = (_outgoing if self.outgoing else _incoming)(a, b, self.contraction)
        return torch.sigmoid(self.g_out(z)) * self.p_out(self.ln_out(x))


class TriangleAttention(nn.Module):
    """OpenFold's triangle attention: each row of the pair attends along its columns with a
    pair bias shared by the rows; the ending node is the same on the transposed pair."""

    def __init__(self, c=CZ, heads=H, d=D, starting=True):
        super().__init__()
        self.starting, self.heads, self.d = starting, heads, d
        self.ln = nn.LayerNorm(c, dtype=DT)
        self.q, self.k, self.v = (nn.Linear(c, heads * d, bias=False, dtype=DT) for _ in range(3))
        self.b = nn.Linear(c, heads, bias=False, dtype=DT)
        self.g, self.o = nn.Linear(c, heads * d, dtype=DT), nn.Linear(heads * d, c, dtype=DT)

    def forward(self, z):
        if not self.starting:
            z = z.transpose(-2, -3)
        z = self.ln(z)
        # (B, I, J, H*d) -> (B, I, H, J, d): rows are a batch dim, J is the sequence
        q, k, v = (p(z).unflatten(-1, (self.heads, self.d)).transpose(-2, -3) for p in (self.q, self.k, self.v))
        bias = self.b(z).permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, H, J, J), broadcast over rows
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        o = o.transpose(-2, -3).flatten(-2)  # (B, I, J, H*d)
        o = self.o(torch.sigmoid(self.g(z)) * o)
        return o.transpose(-2, -3) if not self.starting else o


class AttentionPairBias(nn.Module):
    """AF3 Algorithm 24 without conditioning: singles attend with a bias projected from the pair."""

    def __init__(self, cs=CS, cz=CZ, heads=H, d=D):
        super().__init__()
        self.heads, self.d = heads, d
        self.ln_s, self.ln_z = nn.LayerNorm(cs, dtype=DT), nn.LayerNorm(cz, dtype=DT)
        self.q = nn.Linear(cs, heads * d, dtype=DT)
        self.k, self.v = nn.Linear(cs, heads * d, bias=False, dtype=DT), nn.Linear(cs, heads * d, bias=False, dtype=DT)
        self.b = nn.Linear(cz, heads, bias=False, dtype=DT)
        self.g = nn.Linear(cs, heads * d, bias=False, dtype=DT)
        self.o = nn.Linear(heads * d, cs, dtype=DT)

    def forward(self, s, z):
        a = self.ln_s(s)
        q, k, v = (p(a).unflatten(-1, (self.heads, self.d)).transpose(-2, -3) for p in (self.q, self.k, self.v))
        bias = self.b(self.ln_z(z)).permute(0, 3, 1, 2)  # (B, H, N, N)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(-2, -3).flatten(-2)
        return self.o(torch.sigmoid(self.g(a)) * o)


class Transition(nn.Module):
    """AF3 Algorithm 11 (SwiGLU) or the AF2 / OpenFold ReLU transition, ×4 hidden."""

    def __init__(self, c=CZ, n=4, act="swiglu"):
        super().__init__()
        self.act = act
        self.ln = nn.LayerNorm(c, dtype=DT)
        self.up = nn.Linear(c, (2 if act == "swiglu" else 1) * n * c, dtype=DT)
        self.down = nn.Linear(n * c, c, dtype=DT)

    def forward(self, z):
        h = self.up(self.ln(z))
        if self.act == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.relu(h)
        return self.down(h)


class PairformerBlock(nn.Module):
    """One Pairformer block: the pair stack with residuals, then (with singles) the single update
    with pair bias and the single transition."""

    def __init__(self, contraction="einsum"):
        super().__init__()
        self.tri_out = TriangleMultiplication(outgoing=True, contraction=contraction)
        self.tri_in = TriangleMultiplication(outgoing=False, contraction=contraction)
        self.att_start, self.att_end = TriangleAttention(starting=True), TriangleAttention(starting=False)
        self.transition = Transition(CZ)
        self.apb, self.s_transition = AttentionPairBias(), Transition(CS)

    def forward(self, z, s=None):
        z = z + self.tri_out(z)
        z = z + self.tri_in(z)
        z = z + self.att_start(z)
        z = z + self.att_end(z)
        z = z + self.transition(z)
        if s is None:
            return z
        s = s + self.apb(s, z)
        s = s + self.s_transition(s)
        return z, s


def _init(module: nn.Module, seed: int) -> nn.Module:
    """Random parameters (biases and LayerNorm affines included, so no gradient is trivially
    zero), deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("weight") and p.dim() == 1:  # LayerNorm scale near 1
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) / max(p.shape[-1], 1) ** 0.5)
    return module


# ----------------------------------------------------------------------------- inputs and the check
def _pair_comps(ns, seed, c=CZ):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, n, c, generator=g, dtype=DT) for n in ns]


def _single_comps(ns, seed, c=CS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=DT) for n in ns]


def _inputs(kind, ns, seed):
    """``[(comps, ragged_dims), …]``: the module's arguments, per sample."""
    if kind in ("apb", "block_s"):
        return [(_pair_comps(ns, seed), PAIR), (_single_comps(ns, seed + 1), SINGLE)][:: -1 if kind == "apb" else 1]
    if kind == "s_transition":
        return [(_single_comps(ns, seed), SINGLE)]
    return [(_pair_comps(ns, seed), PAIR)]


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _reference(module, inputs):
    """Per sample: the module on sample i's dense tensors as a batch of one. Returns the leaves
    (one list per argument) and the outputs (one list per output)."""
    leaves = [[c.detach().clone().requires_grad_() for c in comps] for comps, _ in inputs]
    batch = len(inputs[0][0])
    per_sample = [_as_tuple(module(*[arg[i].unsqueeze(0) for arg in leaves])) for i in range(batch)]
    outs = [[o[k][0] for o in per_sample] for k in range(len(per_sample[0]))] if per_sample else []
    return leaves, outs


def _cotangents(outs, seed):
    g = torch.Generator().manual_seed(seed + 12345)
    return [[torch.randn(o.shape, generator=g, dtype=o.dtype) for o in out] for out in outs]


def check_per_sample(module, inputs, seed=0, grad=True):
    """``module`` on multi_jagged arguments vs the per-sample dense reference: every output
    sample, and (``grad``) the gradients of every input and every parameter for one random
    cotangent, through ``torch.autograd.grad`` over all of them at once."""
    xs = [mj.nested_tensor(comps, ragged_dims=rd, requires_grad=grad) for comps, rd in inputs]
    out = _as_tuple(module(*xs))
    ref_leaves, ref_outs = _reference(module, inputs)
    for k, (o, r) in enumerate(zip(out, ref_outs)):
        assert isinstance(o, mj.MultiJaggedTensor), f"output {k}: expected multi_jagged, got {type(o).__name__}"
        assert o.layout is mj.multi_jagged and o.dtype == DT
        # the output keeps the nested int of an input with its ragged dims (no new extent)
        same = [x for x in xs if x.ragged_dims == o.ragged_dims]
        assert any(all(o.shape[d] is x.shape[d] for d in o.ragged_dims) for x in same), (o.shape, [x.shape for x in xs])
        got = o.unbind()
        assert len(got) == len(r)
        for i, (a, e) in enumerate(zip(got, r)):
            torch.testing.assert_close(a, e, msg=lambda m, k=k, i=i: f"output {k}, sample {i}: {m}")
    if not grad:
        return out
    params = [p for p in module.parameters() if p.requires_grad]
    cot = _cotangents(ref_outs, seed)
    loss = sum((a * c).sum() for o, cs in zip(out, cot) for a, c in zip(o.unbind(), cs))
    ref_loss = sum((e * c).sum() for r, cs in zip(ref_outs, cot) for e, c in zip(r, cs))
    grads = torch.autograd.grad(loss, [*xs, *params], allow_unused=True)
    ref_grads = torch.autograd.grad(ref_loss, [c for arg in ref_leaves for c in arg] + params, allow_unused=True)
    flat = iter(ref_grads)
    for k, (gx, arg) in enumerate(zip(grads[: len(xs)], ref_leaves)):
        assert isinstance(gx, mj.MultiJaggedTensor), f"grad of input {k}: expected multi_jagged, got {gx!r}"
        for i, (a, leaf) in enumerate(zip(gx.unbind(), arg)):
            e = next(flat)
            e = torch.zeros_like(leaf) if e is None else e
            torch.testing.assert_close(a, e, msg=lambda m, k=k, i=i: f"grad of input {k}, sample {i}: {m}")
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    for name, a, e in zip(names, grads[len(xs):], flat):
        if a is None and e is None:  # unused by this module (the block without singles)
            continue
        z = torch.zeros_like(e if e is not None else a)
        torch.testing.assert_close(z if a is None else a, z if e is None else e, msg=lambda m, name=name: f"grad of {name}: {m}")
    return out


TRI_MULT = [
    pytest.param(outgoing, contraction, id=f"{'out' if outgoing else 'in'}-{contraction}")
    for outgoing in (True, False)
    for contraction in ("einsum", "einsum_b", "matmul")
]

# every piece, by kind (``_inputs`` makes its arguments)
MODULES = {
    "tri_mult_out": lambda: TriangleMultiplication(outgoing=True),
    "tri_mult_in": lambda: TriangleMultiplication(outgoing=False),
    "tri_att_start": lambda: TriangleAttention(starting=True),
    "tri_att_end": lambda: TriangleAttention(starting=False),
    "apb": AttentionPairBias,
    "transition": lambda: Transition(CZ),
    "s_transition": lambda: Transition(CS),
    "block": PairformerBlock,
    "block_s": PairformerBlock,
}


# ----------------------------------------------------------------------------- triangle multiplication
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("outgoing, contraction", TRI_MULT)
def test_triangle_multiplication(outgoing, contraction, lens):
    m = _init(TriangleMultiplication(outgoing=outgoing, contraction=contraction), 1)
    check_per_sample(m, _inputs("tri_mult", lens, 2), seed=3)


@pytest.mark.parametrize("outgoing, contraction", TRI_MULT)
def test_triangle_contraction_alone(outgoing, contraction):
    """The bare contraction on two separately built pairs (equal lengths, different nested ints),
    against the per-sample dense einsum; both operands get gradients."""
    ns = (3, 0, 4, 1)
    ca, cb = _pair_comps(ns, 4, 2), _pair_comps(ns, 5, 2)
    a = mj.nested_tensor(ca, ragged_dims=PAIR, requires_grad=True)
    b = mj.nested_tensor(cb, ragged_dims=PAIR, requires_grad=True)
    f = _outgoing if outgoing else _incoming
    out = f(a, b, contraction)
    assert isinstance(out, mj.MultiJaggedTensor) and out.ragged_dims == PAIR and out.shape[-1] == 2
    eq = "ikc,jkc->ijc" if outgoing else "kic,kjc->ijc"
    ra, rb = [c.clone().requires_grad_() for c in ca], [c.clone().requires_grad_() for c in cb]
    ref = [torch.einsum(eq, x, y) for x, y in zip(ra, rb)]
    for o, r in zip(out.unbind(), ref):
        torch.testing.assert_close(o, r)
    cot = _cotangents([ref], 0)[0]
    ga, gb = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), [a, b])
    rg = torch.autograd.grad(sum((r * c).sum() for r, c in zip(ref, cot)), [*ra, *rb])
    for got, exp in zip([*ga.unbind(), *gb.unbind()], rg):
        torch.testing.assert_close(got, exp)


# ----------------------------------------------------------------------------- attention and transition
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("starting", [True, False], ids=["starting", "ending"])
def test_triangle_attention(starting, lens):
    m = _init(TriangleAttention(starting=starting), 1)
    check_per_sample(m, _inputs("tri_att", lens, 2), seed=3)


@pytest.mark.parametrize("lens", LENS)
def test_attention_pair_bias(lens):
    """Singles ``(B, j0, C_s)`` and the pair ``(B, j0, j0, C_z)`` built separately (equal lengths,
    different nested ints); both get gradients."""
    m = _init(AttentionPairBias(), 1)
    out = check_per_sample(m, _inputs("apb", lens, 2), seed=3)
    assert out[0].ragged_dims == SINGLE


@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("act", ["swiglu", "relu"])
def test_pair_transition(act, lens):
    m = _init(Transition(CZ, act=act), 1)
    check_per_sample(m, _inputs("transition", lens, 2), seed=3)


# ----------------------------------------------------------------------------- the block
@pytest.mark.parametrize("lens", LENS)
@pytest.mark.parametrize("contraction", ["einsum", "matmul"])
def test_block_forward_backward(contraction, lens):
    m = _init(PairformerBlock(contraction), 1)
    check_per_sample(m, _inputs("block", lens, 2), seed=3)


@pytest.mark.parametrize("lens", LENS[:2])
def test_block_with_singles(lens):
    m = _init(PairformerBlock(), 1)
    check_per_sample(m, _inputs("block_s", lens, 2), seed=3)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_block_without_autograd(mode):
    m = _init(PairformerBlock(), 1)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        out = check_per_sample(m, _inputs("block_s", LENS[1], 2), grad=False)
    assert not any(o.requires_grad for o in out)


@pytest.mark.parametrize("lens", [(0,), (0, 0), (1,), (1, 0, 1)])
@pytest.mark.parametrize("kind", ["tri_mult_out", "tri_mult_in", "block_s"])
def test_degenerate_batches(kind, lens):
    """Every sample empty (no packed rows at all), 1 × 1 pairs (a contraction over one k)."""
    make = MODULES[kind]
    check_per_sample(_init(make(), 1), _inputs(kind, lens, 2), seed=3)


# ----------------------------------------------------------------------------- random structures
@pytest.mark.parametrize("kind", list(MODULES))
@few(4)
@given(ns=lengths(max_len=5), seed=seeds)
def test_random_lengths(kind, ns, seed):
    """Random lengths (a zero-length sample in most batches, sometimes B = 1) for every piece."""
    make = MODULES[kind]
    check_per_sample(_init(make(), seed), _inputs(kind, ns, seed + 1), seed=seed)


@pytest.mark.parametrize("kind", ["tri_mult_out", "tri_mult_in", "tri_att_start", "tri_att_end", "apb", "block_s"])
@pytest.mark.parametrize("change", ["values", "length"])
def test_no_leakage_between_samples(kind, change):
    """Changing sample 1 (its values, or its length) leaves every other sample's output and
    input gradient unchanged — bit for bit when only values change (the same code runs on the
    same shapes), to rounding when a length changes (kernels may group samples by length)."""
    make = MODULES[kind]
    m = _init(make(), 5)
    ns = (3, 2, 0, 4)
    ns2 = ns if change == "values" else (3, 5, 0, 4)
    base = _inputs(kind, ns, 6)
    other = _inputs(kind, ns2, 6)
    changed = []
    for (c1, rd), (c2, _) in zip(base, other):
        c2 = [c1[0], c2[1] + 1.0 if change == "values" else c2[1], *c1[2:]]
        changed.append((c2, rd))

    def run(inputs):
        xs = [mj.nested_tensor(c, ragged_dims=rd, requires_grad=True) for c, rd in inputs]
        out = _as_tuple(m(*xs))
        # Σ o²: each sample's cotangent (2·o) is its own output, unchanged for untouched samples
        loss = sum((o * o).sum() for y in out for o in y.unbind())
        grads = torch.autograd.grad(loss, xs)
        return [y.unbind() for y in out], [g.unbind() for g in grads]

    (o1, g1), (o2, g2) = run(base), run(changed)
    same = torch.equal if change == "values" else (lambda a, b: torch.allclose(a, b, rtol=1e-10, atol=1e-12))
    for i in (0, 2, 3):
        for k in range(len(o1)):
            assert same(o1[k][i], o2[k][i]), f"output {k} of sample {i} changed"
        for k in range(len(g1)):
            assert same(g1[k][i], g2[k][i]), f"grad of input {k}, sample {i} changed"
    if change == "values":
        assert not torch.equal(o1[0][1], o2[0][1])


# ----------------------------------------------------------------------------- compile
@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pair_on_extent_of(s, z):
    """``z`` relabelled onto the singles' nested int: an eager binary op between tensors of equal
    per-sample sizes gives the first operand's nested int (here an all-zero pair made from ``s``),
    while inside a compiled region extents compare by identity only. In a trunk the pair is made
    from the singles (``z = a.unsqueeze(-2) + b.unsqueeze(-3) + …``) and shares it anyway."""
    return (s[..., :1].unsqueeze(-2) * s[..., :1].unsqueeze(-3)).detach() * 0 + z


def test_block_compiles_once_across_lengths(fresh_dynamo):
    """``torch.compile(fullgraph=True)`` of the block (pair and singles on one nested int), two
    batches of the same B with different lengths (a zero-length sample in the second): one graph,
    outputs and the gradients of the pair, the singles and every parameter equal eager."""
    m = _init(PairformerBlock(), 1)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    params = list(m.parameters())
    for k, ns in enumerate([(3, 2, 4), (5, 0, 2)]):
        (zc, _), (sc, _) = _inputs("block_s", ns, 10 + k)

        def run(f):
            s = mj.nested_tensor(sc, ragged_dims=SINGLE, requires_grad=True)
            z = _pair_on_extent_of(s, mj.nested_tensor(zc, ragged_dims=PAIR, requires_grad=True))
            assert z.shape[1] is s.shape[1]
            out = f(z, s)
            loss = sum((y * y).sum() for y in out)
            return out, torch.autograd.grad(loss, [z, s, *params])

        (out_c, g_c), (out_e, g_e) = run(compiled), run(m)
        for a, b in zip(out_c, out_e):
            assert torch.equal(a.sizes(), b.sizes())
            torch.testing.assert_close(a.values(), b.values())
        for a, b in zip(g_c, g_e):
            a, b = (t.values() if isinstance(t, mj.MultiJaggedTensor) else t for t in (a, b))
            torch.testing.assert_close(a, b)
    assert counter.frame_count == 1, "new lengths at a fixed batch size must not recompile"


def test_compiled_pair_bias_on_separately_built_singles_and_pair(fresh_dynamo):
    """Singles and a pair built by separate constructor calls (equal lengths, other nested ints)
    combine in a compiled region as eagerly: the pair bias is the attention mask, assumed on the
    singles' extents and checked when the graph runs (docs/design.md §Limits); a pair of other
    lengths raises there."""
    m = _init(AttentionPairBias(), 1)
    (sc, _), (zc, _) = _inputs("apb", (3, 2, 4), 10)
    s, z = mj.nested_tensor(sc, ragged_dims=SINGLE), mj.nested_tensor(zc, ragged_dims=PAIR)
    want = m(s, z)  # eager: equal lengths suffice
    got = torch.compile(m, backend="aot_eager", fullgraph=True)(s, z)
    for a, b in zip(got.unbind(), want.unbind()):
        torch.testing.assert_close(a, b)
    (_, _), (zo, _) = _inputs("apb", (4, 2, 3), 11)
    with pytest.raises(Exception, match="operands built apart combine only where their ragged sizes are equal"):
        torch.compile(m, backend="aot_eager", fullgraph=True)(s, mj.nested_tensor(zo, ragged_dims=PAIR))


# ----------------------------------------------------------------------------- second order
SECOND_ORDER_LENS = (2, 0, 3)


@pytest.mark.parametrize("outgoing", [True, False], ids=["out", "in"])
@pytest.mark.parametrize("contraction", ["einsum", "matmul"])
def test_triangle_multiplication_gradgradcheck(outgoing, contraction):
    """``gradgradcheck`` in float64 of the bare contraction and of the module (w.r.t. the packed
    pair values and one projection weight), on a tiny batch with a zero-length sample."""
    f = _outgoing if outgoing else _incoming
    ca, cb = _pair_comps(SECOND_ORDER_LENS, 7, 2), _pair_comps(SECOND_ORDER_LENS, 8, 2)
    (va, off, sizes), (vb, _, _) = packed_args(ca, PAIR), packed_args(cb, PAIR)

    def bare(va, vb):
        return f(mj.from_packed(va, off, sizes, PAIR), mj.from_packed(vb, off, sizes, PAIR), contraction).values()

    args = (va.requires_grad_(), vb.requires_grad_())
    assert torch.autograd.gradcheck(bare, args)
    assert torch.autograd.gradgradcheck(bare, args, fast_mode=True)

    m = _init(TriangleMultiplication(c=2, hidden=2, outgoing=outgoing, contraction=contraction), 9)
    vz, off, sizes = packed_args(_pair_comps(SECOND_ORDER_LENS, 10, 2), PAIR)

    def module(vz, w):
        params = {**dict(m.named_parameters()), "p_in.weight": w}
        z = mj.from_packed(vz, off, sizes, PAIR)
        return torch.func.functional_call(m, params, (z,)).values()

    args = (vz.requires_grad_(), m.p_in.weight.detach().clone().requires_grad_())
    assert torch.autograd.gradgradcheck(module, args, fast_mode=True)


@pytest.mark.parametrize("outgoing", [True, False], ids=["out", "in"])
def test_triangle_multiplication_grad_of_grad(outgoing):
    """Grad of a gradient penalty ``‖∂L/∂z‖²`` w.r.t. z and every parameter equals the per-sample
    reference's (summed over samples)."""
    m = _init(TriangleMultiplication(outgoing=outgoing), 11)
    comps = _pair_comps((3, 0, 2, 1), 12)
    params = list(m.parameters())

    z = mj.nested_tensor(comps, ragged_dims=PAIR, requires_grad=True)
    out = m(z)
    (gz,) = torch.autograd.grad((out * out).sum(), z, create_graph=True)
    got = torch.autograd.grad((gz * gz).sum(), [z, *params], allow_unused=True)

    leaves = [c.clone().requires_grad_() for c in comps]
    penalty = 0
    for leaf in leaves:
        o = m(leaf.unsqueeze(0))
        (g,) = torch.autograd.grad((o * o).sum(), leaf, create_graph=True)
        penalty = penalty + (g * g).sum()
    exp = torch.autograd.grad(penalty, [*leaves, *params], allow_unused=True)
    for a, e in zip(got[0].unbind(), exp[: len(leaves)]):
        torch.testing.assert_close(a, e)
    for (name, _), a, e in zip(m.named_parameters(), got[1:], exp[len(leaves):]):
        torch.testing.assert_close(a, e, msg=lambda msg, name=name: f"{name}: {msg}")
