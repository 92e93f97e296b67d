"""Training utilities on multi_jagged batches: autocast (CPU bfloat16), activation checkpointing,
torch.func, optimizer steps — each against the per-sample dense reference run the same way."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import torch_multijagged as mj


def _comps(c=4, lengths=(3, 0, 2, 5), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=dtype) for n in lengths]


# ----------------------------------------------------------------------------- autocast
AUTOCAST_OPS = {
    "linear": lambda m, x: m["lin"](x),
    "matmul_dense": lambda m, x: x @ m["w"],
    "matmul_pair": lambda m, x: m["lin"](x) @ x.transpose(-1, -2),
    "softmax_bf16": lambda m, x: F.softmax(m["lin"](x), -1),
    "softmax_ragged": lambda m, x: F.softmax(m["lin"](x), -2),
    "log_softmax": lambda m, x: F.log_softmax(m["lin"](x), -1),
    "layer_norm_bf16": lambda m, x: F.layer_norm(m["lin"](x), (4,), m["ln_w"], m["ln_b"]),
    "layer_norm_fp32": lambda m, x: F.layer_norm(x, (4,), m["ln_w"], m["ln_b"]),
    "mlp_loss": lambda m, x: F.mse_loss(F.gelu(m["lin"](x)) @ m["w"], x.detach(), reduction="sum"),
    "sdpa": lambda m, x: F.scaled_dot_product_attention(*(x.unflatten(-1, (2, 2)).transpose(-2, -3),) * 3) * m["w"].sum(),
    "einsum_scores": lambda m, x: torch.einsum("...id,...jd->...ij", x, m["lin"](x)),
    "einsum_pair_contraction": lambda m, x: torch.einsum(
        "...ikc,...jkc->...ijc", *(x.unsqueeze(-2) * m["lin"](x).unsqueeze(-3),) * 2),
    "prod_fp32": lambda m, x: m["lin"](x).prod(-1),
    "cdist_fp32": lambda m, x: torch.cdist(m["lin"](x), m["lin"](x)),
}


def _params():
    torch.manual_seed(0)
    return {"lin": torch.nn.Linear(4, 4), "w": torch.nn.Parameter(torch.randn(4, 4)),
            "ln_w": torch.nn.Parameter(torch.rand(4) + 0.5), "ln_b": torch.nn.Parameter(torch.randn(4))}


def _leaves(m):
    return [m["lin"].weight, m["lin"].bias, m["w"], m["ln_w"], m["ln_b"]]


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("op", AUTOCAST_OPS, ids=str)
def test_autocast_dtypes_match_dense_per_sample(op, grad):
    """Under torch.autocast("cpu", bfloat16) each op's result dtype is dense autocast's on each
    sample, values agree, and gradients reach the float32 parameters (in float32)."""
    fn, m = AUTOCAST_OPS[op], _params()
    xs = _comps()
    x = mj.nested_tensor(xs, requires_grad=grad)
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(m, x)
        ref = [fn(m, a.clone().requires_grad_(grad)) for a in xs]
    if isinstance(out, mj.MultiJaggedTensor):
        assert out.dtype == ref[0].dtype, (out.dtype, ref[0].dtype)
        for o, r in zip(out.unbind(), ref):
            torch.testing.assert_close(o, r, rtol=2e-2, atol=2e-2)
        total, want = out.float().sum(), sum(r.float().sum() for r in ref)
    else:
        assert out.dtype == ref[0].dtype
        total, want = out, sum(ref)
        torch.testing.assert_close(total, want, rtol=2e-2, atol=2e-2)
    if not grad:
        return
    used = [p for p in _leaves(m) if p.requires_grad]
    got = torch.autograd.grad(total, used, allow_unused=True)
    exp = torch.autograd.grad(want, used, allow_unused=True)
    for g, e in zip(got, exp):
        assert (g is None) == (e is None)
        if e is not None:
            assert g.dtype == torch.float32
            torch.testing.assert_close(g, e, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "constant"])
def test_autocast_pads_take_dense_autocast_dtypes(mode):
    """Reflection and replication pads are on dense autocast's float32 list (a bfloat16 input
    comes back float32); a constant pad keeps its input's dtype."""
    xs = [c.T.bfloat16() for c in _comps(lengths=(3, 2, 5))]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.pad(mj.nested_tensor(xs), (1, 1), mode=mode)
        refs = [F.pad(c, (1, 1), mode=mode) for c in xs]
    assert out.dtype == refs[0].dtype == (torch.bfloat16 if mode == "constant" else torch.float32)
    for o, r in zip(out.unbind(), refs):
        torch.testing.assert_close(o, r)


# ----------------------------------------------------------------------------- checkpoint
class PairBlock(torch.nn.Module):
    """Linear → layer_norm → gelu → pair broadcast (B, j0, j0, C) → mean back to (B, j0, C)."""

    def __init__(self, c=4):
        super().__init__()
        self.lin = torch.nn.Linear(c, c)
        self.ln = torch.nn.LayerNorm(c)
        self.out = torch.nn.Linear(c, c)

    def forward(self, x):
        h = F.gelu(self.ln(self.lin(x)))
        pair = h.unsqueeze(-2) + h.unsqueeze(-3)
        return self.out(pair.mean(-2)) + x


@pytest.mark.parametrize("inference", [False, True], ids=["train", "no_grad"])
def test_checkpoint_pair_block_matches_plain_run(inference):
    """torch.utils.checkpoint (use_reentrant=False) around a block taking and returning
    multi_jagged tensors: the output and every parameter and input gradient equal the plain
    run's, and both equal the per-sample dense reference."""
    torch.manual_seed(0)
    block = PairBlock().double()
    xs = _comps(dtype=torch.float64)
    leaves = [a.clone().requires_grad_() for a in xs]
    x = mj.as_nested_tensor(leaves)
    if inference:
        with torch.no_grad():
            torch.testing.assert_close(checkpoint(block, x, use_reentrant=False).values(), block(x).values())
        return
    plain = block(x)
    g_plain = torch.autograd.grad(plain.values().sin().sum(), [*block.parameters(), *leaves])
    ck = checkpoint(block, x, use_reentrant=False)
    assert isinstance(ck, mj.MultiJaggedTensor) and ck.shape == plain.shape
    torch.testing.assert_close(ck.values(), plain.values())
    g_ck = torch.autograd.grad(ck.values().sin().sum(), [*block.parameters(), *leaves])
    for a, b in zip(g_ck, g_plain):
        torch.testing.assert_close(a, b)
    ref_leaves = [a.clone().requires_grad_() for a in xs]
    ref = [block(a.unsqueeze(0))[0] for a in ref_leaves]
    for o, r in zip(ck.unbind(), ref):
        torch.testing.assert_close(o, r)
    g_ref = torch.autograd.grad(sum(r.sin().sum() for r in ref), [*block.parameters(), *ref_leaves])
    for a, b in zip(g_ck, g_ref):
        torch.testing.assert_close(a, b)


# A function of a multi_jagged leaf checkpointed; "pair" goes through a square pair (B, j0, j0, C)
CK_FNS = {
    "mlp": lambda lin, t: F.gelu(lin(t)).sin(),
    "pair": lambda lin, t: (lin(t).unsqueeze(1) + t.unsqueeze(2)).tanh().mean(2),
}
# which of (x, lin.weight, lin.bias) each call asks a gradient of
CK_ASKED = {
    "grad": (True, False, False),
    "grad_params": (True, True, True),
    "backward_inputs": (True, False, False),
    "grad_outputs": (True, True, True),
    "tensor_backward": (True, True, False),
    "second_order": (True, True, True),
}


@pytest.mark.parametrize("call", list(CK_ASKED))
@pytest.mark.parametrize("fn", list(CK_FNS))
def test_checkpoint_autograd_api_with_batch_arguments(fn, call):
    """torch.utils.checkpoint (use_reentrant=False) of a function of a multi_jagged leaf x, its
    gradients asked for by the autograd API with a batch among its arguments
    (``autograd.grad(loss, x)``, ``autograd.grad(loss, [x, *params])``, ``backward(inputs=[x])``,
    ``grad_outputs`` / ``y.backward(g)`` with a cotangent built apart, second order): the forward's
    recomputation during backward takes the routes as the forward did (NOTE [ The autograd API
    runs the engine with routes on ] in ops/_routing.py), and the gradients of x and of the
    parameters equal dense checkpointing sample by sample; a parameter left out of ``inputs``
    gets none, as in dense."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).double()
    params = [lin.weight, lin.bias]
    xs = _comps(dtype=torch.float64)
    x = mj.nested_tensor(xs, requires_grad=True)
    out = checkpoint(lambda t: CK_FNS[fn](lin, t), x, use_reentrant=False)
    g = torch.Generator().manual_seed(1)
    cots = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out.unbind()]
    cot = mj.nested_tensor(cots)  # built apart: a nested int of its own
    if call == "grad":
        got = [*torch.autograd.grad(out.sin().sum(), x), None, None]
    elif call == "grad_params":
        got = list(torch.autograd.grad(out.sin().sum(), [x, *params]))
    elif call == "backward_inputs":
        out.sin().sum().backward(inputs=[x])
        got = [x.grad, lin.weight.grad, lin.bias.grad]
    elif call == "grad_outputs":
        got = list(torch.autograd.grad(out, [x, *params], grad_outputs=cot))
    elif call == "tensor_backward":
        out.backward(cot, inputs=[x, lin.weight])
        got = [x.grad, lin.weight.grad, lin.bias.grad]
    else:
        gx, gw = torch.autograd.grad(out.sin().sum(), [x, lin.weight], create_graph=True)
        got = list(torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), [x, *params]))

    leaves = [a.clone().requires_grad_() for a in xs]
    refs = [checkpoint(lambda t: CK_FNS[fn](lin, t), a.unsqueeze(0), use_reentrant=False)[0] for a in leaves]
    if call in ("grad_outputs", "tensor_backward"):
        loss = sum((r * c).sum() for r, c in zip(refs, cots))
    else:
        loss = sum(r.sin().sum() for r in refs)
    if call == "second_order":
        first = torch.autograd.grad(loss, [*leaves, lin.weight], create_graph=True)
        loss = sum(q.pow(2).sum() for q in first)
    want = torch.autograd.grad(loss, [*leaves, *params])

    assert isinstance(got[0], mj.MultiJaggedTensor) and got[0].shape == x.shape
    for a, b in zip(got[0].unbind(), want[: len(xs)]):
        torch.testing.assert_close(a, b)
    for asked, a, b in zip(CK_ASKED[call][1:], got[1:], want[len(xs):]):
        if asked:
            torch.testing.assert_close(a, b)
        else:
            assert a is None


@pytest.mark.parametrize("fn", list(CK_FNS))
def test_checkpoint_reentrant_batch_input(fn):
    """use_reentrant=True around a function of a multi_jagged leaf: ``loss.backward()`` fills x's
    and the parameters' ``.grad`` as dense checkpointing does per sample; ``autograd.grad`` and
    ``backward(inputs=…)`` raise dense's error (reentrant checkpointing does not take them)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).double()
    xs = _comps(dtype=torch.float64)
    x = mj.nested_tensor(xs, requires_grad=True)
    out = checkpoint(lambda t: CK_FNS[fn](lin, t), x, use_reentrant=True)
    with pytest.raises(RuntimeError, match="incompatible with .grad"):
        torch.autograd.grad(out.sin().sum(), x, retain_graph=True)
    out.sin().sum().backward()
    got = [*x.grad.unbind(), lin.weight.grad, lin.bias.grad]
    lin.zero_grad(set_to_none=True)
    leaves = [a.clone().requires_grad_() for a in xs]
    refs = [checkpoint(lambda t: CK_FNS[fn](lin, t), a.unsqueeze(0), use_reentrant=True)[0] for a in leaves]
    sum(r.sin().sum() for r in refs).backward()
    want = [*(a.grad for a in leaves), lin.weight.grad, lin.bias.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- torch.func
def test_vmap_over_batch_dim_matches_per_sample():
    """torch.func.vmap over dim 0 runs each op's batching rule on the whole multi_jagged batch
    (no per-sample loop); results equal the function applied per sample."""
    xs = _comps()
    x = mj.nested_tensor(xs)
    for fn in (lambda a: (a * 2 + 1).sum(-1), lambda a: a.softmax(0), lambda a: a.sin().mean(-1), lambda a: torch.relu(a) - a):
        out = torch.func.vmap(fn)(x)
        assert isinstance(out, mj.MultiJaggedTensor)
        for o, a in zip(out.unbind(), xs):
            torch.testing.assert_close(o, fn(a))


def test_vmap_unsupported_raises_naming_op_and_layout():
    """Where an op's batching rule needs an op we have no handler for (fft), or vmaps
    over a dim other than the batch dim, the error names the op and the layout (torch.jagged
    instead falls back to a per-sample loop / raises for in_dims != 0)."""
    x = mj.nested_tensor(_comps())
    with pytest.raises(NotImplementedError, match=r"_fft_r2c\(\): not supported for layout torch.multi_jagged"):
        torch.func.vmap(lambda a: torch.fft.fft(a))(x)
    with pytest.raises(ValueError, match=r"batch dim"):
        torch.func.vmap(lambda a: a * 2, in_dims=1)(x)


def test_forward_mode_ad_refused_clearly():
    """Forward-mode AD is not supported (torch.jagged has none either): ``make_dual`` raises saying
    so and naming reverse mode, rather than the op table's generic refusal."""
    x = mj.nested_tensor(_comps())
    fwad = torch.autograd.forward_ad
    with fwad.dual_level():
        with pytest.raises(NotImplementedError, match=r"forward-mode AD .* not supported.*reverse mode"):
            fwad.make_dual(x, torch.ones_like(x))
        w = fwad.make_dual(torch.randn(3, 4), torch.randn(3, 4))  # a dense dual beside a batch: its tangent
        with pytest.raises(NotImplementedError, match=r"linear\(\): forward-mode AD"):  # would be dropped
            torch.nn.functional.linear(x, w)
        assert mj.is_nested(x * 2)  # no dual among the operands: runs
    t = mj.nested_tensor(_comps())
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        torch.func.jvp(lambda a: a.sin(), (x,), (t,))


def test_func_grad_unsupported_like_torch_jagged():
    """torch.func.grad through a multi_jagged tensor fails in the autograd engine (it asks for
    concrete sizes of a gradient with nested-int sizes), exactly as with torch.jagged: use
    torch.autograd.grad (README, Training)."""
    xs = _comps()
    w = torch.randn(4)
    for layout in (torch.jagged, mj.multi_jagged):
        x = torch.nested.nested_tensor(xs, layout=layout)
        with pytest.raises(RuntimeError, match="concrete integers"):
            torch.func.grad(lambda v: (x * v).sum())(w)
    x = mj.nested_tensor(xs)
    wr = w.clone().requires_grad_()
    (g,) = torch.autograd.grad((x * wr).sum(), wr)
    torch.testing.assert_close(g, torch.cat(xs).sum(0))


# ----------------------------------------------------------------------------- optimizers
def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)).double()


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_optimizer_steps_match_per_sample_loop(opt):
    """Steps on the batched loss (token-mean cross-entropy over a multi_jagged batch) give the
    parameters of the same model stepped on the per-sample dense loop whose loss is
    Σᵢ (sum of sample i's token losses) / (tokens in the batch) — the same number."""
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)}[opt]
    batched, looped = _model(), _model()
    ob, ol = make(batched.parameters()), make(looped.parameters())
    for step in range(3):
        xs = _comps(lengths=(3, 0, 2, 5), seed=step, dtype=torch.float64)
        g = torch.Generator().manual_seed(100 + step)
        ts = [torch.randint(0, 3, (a.shape[0],), generator=g) for a in xs]
        x, t = mj.nested_tensor(xs), mj.nested_tensor(ts)
        ob.zero_grad()
        F.cross_entropy(batched(x).transpose(1, 2), t).backward()
        ob.step()
        ol.zero_grad()
        n_tokens = sum(a.shape[0] for a in xs)
        sum(F.cross_entropy(looped(a), b, reduction="sum") for a, b in zip(xs, ts)).div(n_tokens).backward()
        ol.step()
    for a, b in zip(batched.parameters(), looped.parameters()):
        torch.testing.assert_close(a, b)


def test_autocast_linear_loss_compiled():
    """autocast inside a compiled function (fullgraph): the linear runs in bfloat16, the loss in
    float32, and the gradients equal eager's."""
    xs = _comps()
    x = mj.nested_tensor(xs, requires_grad=True)
    lin = torch.nn.Linear(4, 4)

    def f(a):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(a)
            return F.mse_loss(h, a.detach()), h.dtype

    got, hdt = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    want, _ = f(x)
    assert hdt == torch.bfloat16 and got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, lin.weight)[0], torch.autograd.grad(want, lin.weight)[0])


_OPTIMIZERS = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=0.05, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1, amsgrad=True, **k),
    "rmsprop": lambda p, **k: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, **k),
    "nadam": lambda p, **k: torch.optim.NAdam(p, lr=0.05, **k),
}
_FUSED = ("sgd", "adam", "adamw", "adagrad")  # the optimizers with a fused CPU kernel


@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("opt", list(_OPTIMIZERS))
def test_foreach_and_fused_optimizers_on_multi_jagged_parameters(opt, impl):
    """A multi_jagged parameter (per-sample embeddings) beside dense ones, stepped by the
    ``foreach`` and ``fused`` implementations (CUDA's defaults), with ``clip_grad_norm_``'s foreach
    form: each sample's parameter moves as a dense parameter stepped with ``foreach=False``."""
    if impl == "fused" and opt not in _FUSED:
        pytest.skip("no fused kernel")
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (2, 0, 4)]
    w0 = torch.randn(3, 3, generator=g, dtype=torch.float64)
    p = torch.nn.Parameter(mj.nested_tensor(comps))
    w = torch.nn.Parameter(w0.clone())
    ref = [torch.nn.Parameter(c.clone()) for c in comps]
    wr = torch.nn.Parameter(w0.clone())
    ours = _OPTIMIZERS[opt]([p, w], **{impl: True})
    dense = _OPTIMIZERS[opt]([*ref, wr], foreach=False)
    for step in range(3):
        ours.zero_grad()
        dense.zero_grad()
        ((p @ w).sin() ** 2).sum().backward()
        sum(((c @ wr).sin() ** 2).sum() for c in ref).backward()
        torch.nn.utils.clip_grad_norm_([p, w], 1.0, foreach=True)
        torch.nn.utils.clip_grad_norm_([*ref, wr], 1.0, foreach=False)
        ours.step()
        dense.step()
    assert isinstance(p.data, mj.MultiJaggedTensor)
    for a, b in zip(p.unbind(), ref):
        torch.testing.assert_close(a, b.detach())
    torch.testing.assert_close(w.detach(), wr.detach())


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_a_parameter_stepped_by_list_ops_is_read_and_differentiated_after(impl):
    """After a ``foreach`` / ``fused`` step, ops on the multi_jagged parameter read its new values
    (its own write, not one through an alias), with gradients; a list op writing it between a
    forward that saved it and the backward makes the backward raise, as dense torch's version
    check does (an EMA or optimizer step there would otherwise give a silently wrong gradient)."""
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 0, 5)]
    p = torch.nn.Parameter(mj.nested_tensor(comps))
    opt = torch.optim.Adam([p], lr=0.1, **{impl: True})
    (p * p).sum().backward()
    opt.step()
    moved = [c.detach() for c in p.unbind()]
    for f, ref in [(torch.tanh, torch.tanh), (lambda t: t * t, lambda t: t * t),
                   (lambda t: F.layer_norm(t, (4,)), lambda t: F.layer_norm(t, (4,)))]:
        out = f(p)
        for a, c in zip(out.unbind(), moved):
            torch.testing.assert_close(a, ref(c))
        grad, = torch.autograd.grad(out.sum(), p)
        for a, c in zip(grad.unbind(), moved):
            leaf = c.clone().requires_grad_()
            torch.testing.assert_close(a, torch.autograd.grad(ref(leaf).sum(), leaf)[0])
    torch.testing.assert_close(p.values(), torch.cat(moved))
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    loss = (p @ w).pow(2).sum()  # saves p for w's gradient
    with torch.no_grad():
        torch._foreach_add_([p], 1.0)
    with pytest.raises(Exception, match="modified in place|modified by an inplace"):
        loss.backward()


def test_foreach_op_of_mismatched_structures_raises():
    a = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
    b = mj.nested_tensor([torch.ones(1, 3), torch.ones(2, 3)])
    with pytest.raises(mj.StructureError, match="list position 0"):
        torch._foreach_add_([a], [b])
    with pytest.raises(mj.StructureError, match="only one-number tensors"):
        torch._foreach_add_([a], [torch.ones(3, 3)])


@pytest.mark.parametrize("opt", ["adam_amsgrad", "adamw_amsgrad", "adamax"])
def test_single_tensor_steps_writing_with_out_on_multi_jagged_parameters(opt):
    """The single-tensor steps (the CPU default) of ``amsgrad`` and Adamax write
    ``torch.maximum(a, b, out=a)`` into the parameter's state: each sample moves as a dense
    parameter does."""
    make = {"adam_amsgrad": lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True, foreach=False),
            "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.05, amsgrad=True, foreach=False),
            "adamax": lambda p: torch.optim.Adamax(p, lr=0.05, foreach=False)}[opt]
    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (2, 0, 4)]
    p = torch.nn.Parameter(mj.nested_tensor(comps))
    ref = [torch.nn.Parameter(c.clone()) for c in comps]
    ours, dense = make([p]), make(ref)
    for step in range(3):
        ours.zero_grad()
        dense.zero_grad()
        (p.sin() ** 2 * (step + 1)).sum().backward()
        sum((c.sin() ** 2 * (step + 1)).sum() for c in ref).backward()
        ours.step()
        dense.step()
    for a, b in zip(p.unbind(), ref):
        torch.testing.assert_close(a, b.detach())


def test_grad_scaler_unscales_multi_jagged_gradients():
    """``GradScaler``'s unscale (a list op over the gradients) on a multi_jagged parameter, an
    inf among them skipping the step, as for a dense parameter."""
    comps = [torch.randn(n, 3, dtype=torch.float32) for n in (2, 0, 4)]
    for poison in (False, True):
        p = torch.nn.Parameter(mj.nested_tensor(comps))
        ref = [torch.nn.Parameter(c.clone()) for c in comps]
        ours, dense = torch.optim.SGD([p], lr=0.1), torch.optim.SGD(ref, lr=0.1)
        scalers = [torch.amp.GradScaler("cpu", init_scale=8.0) for _ in range(2)]
        bad = float("inf") if poison else 1.0
        scalers[0].scale((p * p).sum() * bad).backward()
        scalers[1].scale(sum((c * c).sum() for c in ref) * bad).backward()
        scalers[0].step(ours)
        scalers[1].step(dense)
        for a, b in zip(p.unbind(), ref):
            torch.testing.assert_close(a, b.detach())
        assert scalers[0]._found_inf_per_device(ours) == scalers[1]._found_inf_per_device(dense)


def test_adafactor_refuses_a_ragged_dim_among_the_last_two():
    """Adafactor divides by the last two dims' sizes as numbers: a ragged one would make its step
    silently wrong (torch reads a nested int as a placeholder there), so the step raises; a
    parameter whose last two dims are static steps as one dense parameter of its packed rows (its
    norm and element count are the batch's: it is one parameter)."""
    p = torch.nn.Parameter(mj.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)]))
    (p * p).sum().backward()
    with pytest.raises(NotImplementedError, match="Adafactor"):
        torch.optim.Adafactor([p], lr=0.01).step()
    comps = [torch.randn(n, 3, 4, dtype=torch.float64) for n in (2, 0, 3)]
    q = torch.nn.Parameter(mj.nested_tensor(comps))
    ref = torch.nn.Parameter(torch.cat(comps))
    ours, dense = torch.optim.Adafactor([q], lr=0.01), torch.optim.Adafactor([ref], lr=0.01)
    for _ in range(2):
        ours.zero_grad()
        dense.zero_grad()
        (q.sin() ** 2).sum().backward()
        (ref.sin() ** 2).sum().backward()
        ours.step()
        dense.step()
    torch.testing.assert_close(q.values(), ref.detach())
