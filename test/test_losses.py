"""Elementwise losses (ops/nn/losses.py) against the per-sample reference: ``reduction="none"`` per
sample, ``"sum"``/``"mean"`` over every existing element (dense torch on the concatenated
samples), gradients of input, target and the weights, every layout, a zero-length sample."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import torch_multijagged as mj

from _reference import LAYOUTS, build, components, grid, seeds, structures

LOSSES = {
    "mse": lambda x, y: F.mse_loss(x, y, reduction=RED),
    "smooth_l1": lambda x, y: F.smooth_l1_loss(x, y, reduction=RED, beta=0.7),
    "smooth_l1_beta0": lambda x, y: F.smooth_l1_loss(x, y, reduction=RED, beta=0.0),
    "huber": lambda x, y: F.huber_loss(x, y, reduction=RED, delta=0.6),
    "bce_logits": lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid(), reduction=RED),
    "bce_logits_pos_weight": lambda x, y: F.binary_cross_entropy_with_logits(
        x, y.sigmoid(), reduction=RED, pos_weight=PW),
    "l1": lambda x, y: F.l1_loss(x, y, reduction=RED),
    "soft_margin": lambda x, y: F.soft_margin_loss(x, torch.sign(y).detach(), reduction=RED),  # no target gradient
    "bce": lambda x, y: F.binary_cross_entropy(x.sigmoid(), y.sigmoid(), reduction=RED),
    "bce_weight": lambda x, y: F.binary_cross_entropy(x.sigmoid(), y.sigmoid(), weight=y.abs().detach(), reduction=RED),
    "hinge_embedding": lambda x, y: F.hinge_embedding_loss(x, torch.sign(y), margin=0.7, reduction=RED),
    "margin_ranking": lambda x, y: F.margin_ranking_loss(x, y, torch.sign(x - 0.3 * y), margin=0.2, reduction=RED),
    "poisson_nll": lambda x, y: F.poisson_nll_loss(x, y.abs(), reduction=RED),
    "poisson_nll_full": lambda x, y: F.poisson_nll_loss(x.abs() + 0.1, 3 * y.abs(), log_input=False, full=True, reduction=RED),
    "gaussian_nll": lambda x, y: F.gaussian_nll_loss(x, y, y.abs() + 0.3, reduction=RED),
    "gaussian_nll_full": lambda x, y: F.gaussian_nll_loss(x, y, y.abs() * 1e-3, full=True, eps=1e-3, reduction=RED),
    # over the last dim: per sample an (N, D) / (N, C) input, the loss per position
    "cosine_embedding": lambda x, y: F.cosine_embedding_loss(x, y, torch.sign(x.sum(-1)), margin=0.1, reduction=RED),
    "triplet_margin": lambda x, y: F.triplet_margin_loss(x, y, 0.5 * x - y, margin=0.5, reduction=RED),
    "triplet_margin_swap": lambda x, y: F.triplet_margin_loss(x, y, y - x, p=1, swap=True, reduction=RED),
    "triplet_distance": lambda x, y: F.triplet_margin_with_distance_loss(
        x, y, 0.5 * x - y, distance_function=lambda a, b: (a - b).abs().sum(-1), reduction=RED),
    "multilabel_soft_margin": lambda x, y: F.multilabel_soft_margin_loss(x, (y > 0).double(), reduction=RED),
    "multi_margin": lambda x, y: F.multi_margin_loss(x, y.argmax(-1), margin=0.8, reduction=RED),
    "multi_margin_p2_weight": lambda x, y: F.multi_margin_loss(x, y.argmax(-1), p=2, weight=PW, reduction=RED),
    "multilabel_margin": lambda x, y: F.multilabel_margin_loss(
        x, torch.where(torch.arange(x.shape[-1]) < 2, y.argsort(-1), -1), reduction=RED),
}
# losses over the last dim (their sum / mean reference flattens all other dims)
LAST_DIM = {"bce_logits_pos_weight", "cosine_embedding", "triplet_margin", "triplet_margin_swap", "triplet_distance",
            "multilabel_soft_margin", "multi_margin", "multi_margin_p2_weight", "multilabel_margin"}
# dense torch leaves these losses' reduced output uninitialized when the input has no element
EMPTY_UNINITIALIZED = {"multi_margin", "multi_margin_p2_weight", "multilabel_margin"}
RED = "mean"
PW = None


def _flat(t):
    return t.reshape(-1)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("loss", LOSSES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_loss_matches_per_sample(layout, loss, reduction):
    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        global RED, PW
        RED = reduction
        xc, yc = components(s.shapes, seed), components(s.shapes, seed + 1)
        x, xl = build(xc, s.ragged_dims, requires_grad=True)
        y, yl = build(yc, s.ragged_dims, requires_grad=True)
        pw = torch.rand(s.shapes[0][-1], dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5
        PW = pw
        out = LOSSES[loss](x, y)
        rx = [c.detach().clone().requires_grad_() for c in xc]
        ry = [c.detach().clone().requires_grad_() for c in yc]
        if reduction == "none":
            if loss in LAST_DIM and "pos_weight" not in loss:  # dense torch takes (N, C) only: the sample's positions as N
                ref = [LOSSES[loss](a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])).reshape(a.shape[:-1]) for a, b in zip(rx, ry)]
            else:
                ref = [LOSSES[loss](a, b) for a, b in zip(rx, ry)]
            outs = out.unbind()
            assert len(outs) == len(ref)
            for o, r in zip(outs, ref):
                torch.testing.assert_close(o, r)
            cot = [torch.rand_like(r) for r in ref]
            got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cot)), [*xl, *yl], allow_unused=True)
            want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(ref, cot)), [*rx, *ry], allow_unused=True)
        else:
            RED = reduction
            ref = LOSSES[loss](torch.cat([_flat(a) for a in rx]), torch.cat([_flat(b) for b in ry])) if loss not in LAST_DIM else \
                LOSSES[loss](torch.cat([a.reshape(-1, a.shape[-1]) for a in rx]), torch.cat([b.reshape(-1, b.shape[-1]) for b in ry]))
            assert not isinstance(out, mj.MultiJaggedTensor) and out.dim() == 0
            if loss in EMPTY_UNINITIALIZED and not sum(a.numel() for a in rx):
                # dense multi_margin / multilabel_margin return uninitialized memory for an empty input;
                # ours follows the other losses: 0 for a sum, nan for a mean over no element
                ref = torch.where(torch.tensor(True), torch.tensor(0.0 if reduction == "sum" else float("nan"), dtype=ref.dtype), ref)
            torch.testing.assert_close(out, ref, equal_nan=True)
            got = torch.autograd.grad(out, [*xl, *yl], allow_unused=True)
            want = torch.autograd.grad(ref, [*rx, *ry], allow_unused=True)
        for g, w in zip(got, want):
            if w is None:
                assert g is None or not g.abs().sum()
            else:
                torch.testing.assert_close(g, w, equal_nan=True)

    check()


def test_losses_golden():
    x = mj.nested_tensor([torch.tensor([[1.0, 2.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 4.0], [5.0, 6.0]])])
    y = mj.nested_tensor([torch.tensor([[0.0, 0.0]]), torch.zeros(0, 2), torch.tensor([[3.0, 3.0], [3.0, 3.0]])])
    # squared differences 1, 4 | 0, 1, 4, 9: sum 19 over 6 existing elements
    assert F.mse_loss(x, y, reduction="sum").item() == 19.0
    assert F.mse_loss(x, y).item() == pytest.approx(19 / 6)
    assert [c.tolist() for c in F.mse_loss(x, y, reduction="none").unbind()] == [[[1.0, 4.0]], [], [[0.0, 1.0], [4.0, 9.0]]]
    # huber, delta 1: |d| = 1, 2 | 0, 1, 2, 3 → 0.5·d² below 1, d - 0.5 above: 0.5, 1.5 | 0, 0.5, 1.5, 2.5
    assert F.huber_loss(x, y, reduction="sum").item() == pytest.approx(6.5)


@pytest.mark.parametrize("loss", sorted(EMPTY_UNINITIALIZED))
def test_last_dim_loss_of_only_empty_samples(loss):
    """A batch whose samples have no position: a sum of no element is 0 and a mean is nan (as for
    ``mse_loss``), where dense torch returns uninitialized memory for these losses."""
    global RED, PW
    x = mj.nested_tensor([torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, 3, dtype=torch.float64)], requires_grad=True)
    y = mj.nested_tensor([torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, 3, dtype=torch.float64)])
    PW = torch.ones(3, dtype=torch.float64)
    try:
        for RED, want in (("sum", 0.0), ("mean", float("nan"))):
            out = LOSSES[loss](x, y)
            torch.testing.assert_close(out, torch.tensor(want, dtype=torch.float64), equal_nan=True)
            (g,) = torch.autograd.grad(out, x)
            assert g.values().numel() == 0
    finally:
        RED, PW = "mean", None


def test_loss_double_backward_and_compile():
    x = mj.nested_tensor([torch.randn(3, 4, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)], requires_grad=True)
    y = mj.nested_tensor([torch.randn(3, 4, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)])
    (g,) = torch.autograd.grad(F.smooth_l1_loss(x, y, beta=0.5), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.values().pow(2).sum(), x)
    xv = x.values().detach().requires_grad_()
    (gd,) = torch.autograd.grad(F.smooth_l1_loss(xv, y.values(), beta=0.5), xv, create_graph=True)
    (ggd,) = torch.autograd.grad(gd.pow(2).sum(), xv)
    torch.testing.assert_close(gg.values(), ggd)

    y = (x.detach() * 1.3 + 0.2).sin()  # x's nested int: operands combine in a graph only then

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(a, b):
        return F.mse_loss(a, b) + F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction="sum")

    got = f(x, y)
    want = F.mse_loss(x.values(), y.values()) + F.binary_cross_entropy_with_logits(x.values(), y.values().sigmoid(), reduction="sum")
    torch.testing.assert_close(got, want)


def test_loss_bad_reduction_raises():
    x = mj.nested_tensor([torch.randn(2, 3)])
    with pytest.raises(ValueError, match="mse_loss\\(\\): expected reduction"):
        F.mse_loss(x, x, reduction="avg")


# ----------------------------------------------------------------------------- class losses
# The class dim is dim 1 (NOTE [ Class dim of cross_entropy ] in ops/nn/losses.py): the inputs here
# are the layout's tensors with their channel dim moved to dim 1, e.g. (B, j0, C) → (B, C, j0).
IGNORE = 1  # a class index that also occurs as a real class, so that ignoring it matters


def _class_case(s, seed, probs=False):
    """``(x, xl, t, tc, tl)``: input (B, C, …) made from leaves ``xl`` of the layout's shape (its
    channel dim moved to dim 1: ``_mv``), and targets — class indices ``tc`` of shape (…), or
    class probabilities made from leaves ``tl`` of the layout's shape."""
    xc = components(s.shapes, seed)
    c = s.shapes[0][-1]
    x, xl = build(xc, s.ragged_dims, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 7)
    if probs:
        tc = [torch.rand(a.shape, generator=g, dtype=torch.float64).softmax(-1) for a in xc]
        t, tl = build(tc, s.ragged_dims, requires_grad=True)
        return x.movedim(-1, 1), xl, t.movedim(-1, 1), tc, tl
    tc = [torch.randint(0, c, a.shape[:-1], generator=g) for a in xc]
    return x.movedim(-1, 1), xl, mj.nested_tensor(tc, ragged_dims=s.ragged_dims), tc, []


def _mv(comps):
    """Components with their channel dim first (the class dim of a component)."""
    return [a.movedim(-1, 0).contiguous() for a in comps]  # dense nll_loss2d backward needs it


def _leaves(comps):
    return [a.detach().clone().requires_grad_() for a in comps]


def _cat_positions(comps, class_first=True):
    """Every sample's positions side by side: (1, C, ΣP) for inputs, (1, ΣP) for indices."""
    if class_first:
        return torch.cat([a.reshape(a.shape[0], -1) for a in comps], 1).unsqueeze(0)
    return torch.cat([a.reshape(-1) for a in comps]).unsqueeze(0)


CLASS_LOSSES = {
    "ce": lambda x, t, **kw: F.cross_entropy(x, t, **kw),
    "ce_weight": lambda x, t, **kw: F.cross_entropy(x, t, weight=WEIGHT[: x.shape[1]], **kw),
    "ce_ignore": lambda x, t, **kw: F.cross_entropy(x, t, ignore_index=IGNORE, **kw),
    "ce_smooth": lambda x, t, **kw: F.cross_entropy(x, t, label_smoothing=0.3, **kw),
    "ce_all": lambda x, t, **kw: F.cross_entropy(x, t, weight=WEIGHT[: x.shape[1]], ignore_index=IGNORE, label_smoothing=0.2, **kw),
    "nll": lambda x, t, **kw: F.nll_loss(x, t, **kw),
    "nll_weight_ignore": lambda x, t, **kw: F.nll_loss(x, t, weight=WEIGHT[: x.shape[1]], ignore_index=IGNORE, **kw),
}
WEIGHT = torch.tensor([0.5, 2.0, 1.5, 0.25], dtype=torch.float64)


def _grads_match(got_out, want_out, got_in, want_in):
    got = torch.autograd.grad(got_out, got_in, allow_unused=True)
    want = torch.autograd.grad(want_out, want_in, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.abs().sum()
        else:
            torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("loss", CLASS_LOSSES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_class_loss_matches_per_sample(layout, loss, reduction):
    """cross_entropy / nll_loss with class indices: 'none' per sample (dense torch on
    (1, C, …)), 'sum'/'mean' as dense torch on every sample's positions side by side."""
    fn = CLASS_LOSSES[loss]

    @grid
    @given(structures(layout, max_c=4), seeds)
    def check(s, seed):
        x, xl, t, tc, _ = _class_case(s, seed)
        out = fn(x, t, reduction=reduction)
        rx = _leaves(xl)
        if reduction == "none":
            ref = [fn(a.unsqueeze(0), b.unsqueeze(0), reduction="none")[0] for a, b in zip(_mv(rx), tc)]
            outs = out.unbind()
            assert len(outs) == len(ref) and out.dtype == ref[0].dtype
            for o, r in zip(outs, ref):
                torch.testing.assert_close(o, r)
            cot = [torch.rand_like(r) for r in ref]
            _grads_match(sum((o * k).sum() for o, k in zip(outs, cot)), sum((r * k).sum() for r, k in zip(ref, cot)), xl, rx)
        else:
            ref = fn(_cat_positions(_mv(rx)), _cat_positions(tc, False), reduction=reduction)
            assert not isinstance(out, mj.MultiJaggedTensor) and out.dim() == 0 and out.dtype == ref.dtype
            torch.testing.assert_close(out, ref, equal_nan=True)
            if not ref.isnan():
                _grads_match(out, ref, xl, rx)

    check()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.25}, {"weight": True}], ids=["plain", "smooth", "weight"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_cross_entropy_probabilities_matches_per_sample(layout, kw, reduction):
    """Class-probability targets of the input's structure; gradients reach input and target."""

    @grid
    @given(structures(layout, max_c=4), seeds)
    def check(s, seed):
        x, xl, t, tc, tl = _class_case(s, seed, probs=True)
        args = dict(kw)
        if args.get("weight"):
            args["weight"] = WEIGHT[: x.shape[1]]
        out = F.cross_entropy(x, t, reduction=reduction, **args)
        rx, rt = _leaves(xl), _leaves(tl)
        if reduction == "none":
            ref = [F.cross_entropy(a.unsqueeze(0), b.unsqueeze(0), reduction="none", **args)[0] for a, b in zip(_mv(rx), _mv(rt))]
            for o, r in zip(out.unbind(), ref):
                torch.testing.assert_close(o, r)
            cot = [torch.rand_like(r) for r in ref]
            _grads_match(sum((o * k).sum() for o, k in zip(out.unbind(), cot)), sum((r * k).sum() for r, k in zip(ref, cot)),
                         [*xl, *tl], [*rx, *rt])
        else:
            ref = F.cross_entropy(_cat_positions(_mv(rx)), _cat_positions(_mv(rt)), reduction=reduction, **args)
            torch.testing.assert_close(out, ref, equal_nan=True)
            if not ref.isnan():
                _grads_match(out, ref, [*xl, *tl], [*rx, *rt])

    check()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_kl_div_matches_per_sample(layout, log_target, reduction):
    """kl_div both ways; 'batchmean' divides the sum by input.size(0) = B as dense torch does."""

    @grid
    @given(structures(layout), seeds)
    def check(s, seed):
        xc, yc = components(s.shapes, seed), components(s.shapes, seed + 1)
        if not log_target:
            yc = [b.sigmoid() for b in yc]  # probabilities: xlogy's derivative in the target is finite
        x, xl = build(xc, s.ragged_dims, requires_grad=True)
        y, yl = build(yc, s.ragged_dims, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dense torch's (and our) warning about 'mean'
            out = F.kl_div(x, y, reduction=reduction, log_target=log_target)
            rx = [a.detach().clone().requires_grad_() for a in xc]
            ry = [b.detach().clone().requires_grad_() for b in yc]
            if reduction == "none":
                ref = [F.kl_div(a, b, reduction="none", log_target=log_target) for a, b in zip(rx, ry)]
                for o, r in zip(out.unbind(), ref):
                    torch.testing.assert_close(o, r)
                cot = [torch.rand_like(r) for r in ref]
                _grads_match(sum((o * k).sum() for o, k in zip(out.unbind(), cot)),
                             sum((r * k).sum() for r, k in zip(ref, cot)), [*xl, *yl], [*rx, *ry])
                return
            flat = F.kl_div(torch.cat([a.reshape(-1) for a in rx]), torch.cat([b.reshape(-1) for b in ry]),
                            reduction="sum" if reduction == "batchmean" else reduction, log_target=log_target)
            ref = flat / len(rx) if reduction == "batchmean" else flat
        torch.testing.assert_close(out, ref, equal_nan=True)
        if not ref.isnan():
            _grads_match(out, ref, [*xl, *yl], [*rx, *ry])

    check()


def _tokens():
    """Token logits (B, j0, C) with a zero-length sample, targets (B, j0) with one ignored."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(n, 4, generator=g, dtype=torch.float64) for n in (3, 0, 2)]
    ts = [torch.tensor([0, 3, -100]), torch.zeros(0, dtype=torch.long), torch.tensor([2, 1])]
    return xs, ts


def test_cross_entropy_token_logits_need_transpose():
    """(B, j0, C) logits: dim 1 is ragged and cannot be the class dim — a clear error naming
    the fix, never a silent reinterpretation; the transposed call equals dense torch on the
    concatenated tokens (T, C)."""
    xs, ts = _tokens()
    x = mj.nested_tensor(xs, requires_grad=True)
    t = mj.nested_tensor(ts)
    with pytest.raises(ValueError, match=r"cross_entropy\(\): expected the class dim .* pass logits.transpose\(1, 2\)"):
        F.cross_entropy(x, t)
    with pytest.raises(ValueError, match=r"nll_loss\(\): expected the class dim"):
        F.nll_loss(x, t)
    torch.testing.assert_close(F.cross_entropy(x.transpose(1, 2), t), F.cross_entropy(torch.cat(xs), torch.cat(ts)))
    torch.testing.assert_close(F.cross_entropy(x.transpose(1, 2), t), F.cross_entropy(x.values(), t.values()))


def test_class_loss_errors():
    xs, ts = _tokens()
    x = mj.nested_tensor(xs).transpose(1, 2)
    t = mj.nested_tensor(ts)
    with pytest.raises(TypeError, match=r"cross_entropy\(\): expected target to be a multi_jagged tensor"):
        F.cross_entropy(x, torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"cross_entropy\(\): expected target of shape"):
        F.cross_entropy(x, t.unsqueeze(-1))
    with pytest.raises(RuntimeError, match=r"weight tensor should be defined"):
        F.cross_entropy(x, t, weight=torch.ones(3, dtype=torch.float64))
    with pytest.raises(IndexError, match=r"out of bounds"):  # dense torch's own error (the packed values' call)
        F.cross_entropy(x, t + 5)
    with pytest.raises(RuntimeError, match=r"label_smoothing must be between"):
        F.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"cross_entropy\(\): expected reduction"):
        F.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match=r"kl_div\(\): expected reduction"):
        F.kl_div(x, x, reduction="avg")
    with pytest.raises(RuntimeError, match=r"Expected floating point type for target"):
        F.cross_entropy(x, (x > 0).long())
    with pytest.raises(ValueError, match=r"expected target of shape"):
        F.cross_entropy(x, x[:, :3])


def test_cross_entropy_golden_and_per_sample_mean():
    """Token mean vs per-sample mean (README, Losses): a 1-token sample with loss log 2 and a
    2-token sample (one more token ignored) with loss ≈ 0 per token."""
    x = mj.nested_tensor([torch.tensor([[0.0, 0.0]]), torch.zeros(0, 2), torch.tensor([[0.0, 30.0]] * 3)]).transpose(1, 2)
    t = mj.nested_tensor([torch.tensor([0]), torch.zeros(0, dtype=torch.long), torch.tensor([1, 1, -100])])
    ln2 = torch.tensor(2.0).log()
    # token losses: log 2 | — | log(1 + e^-30) ≈ 0, ≈ 0, ignored (0)
    per_token = F.cross_entropy(x, t, reduction="none")
    torch.testing.assert_close(per_token.values(), torch.stack([ln2, torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0)]))
    torch.testing.assert_close(F.cross_entropy(x, t, reduction="sum"), ln2)
    torch.testing.assert_close(F.cross_entropy(x, t), ln2 / 3)  # = (log 2 + 0 + 0) / 3 counted tokens
    # per-sample mean over counted tokens: [log 2 / 1, 0/0 (no tokens), 0 / 2]; mean over non-empty samples
    counted = (t != -100).to(per_token.dtype)
    per_sample = per_token.sum(1) / counted.sum(1)
    assert per_sample[1].isnan()
    torch.testing.assert_close(per_sample[[0, 2]].mean(), ln2 / 2)  # = (log 2 + 0) / 2 samples, not / 3 tokens


def test_mse_loss_dense_target_broadcast_per_sample():
    """A dense (B, 1, C) target broadcasts over each sample's tokens, as dense torch broadcasts
    it against (1, n, C) per sample; a dense (C,) target over everything."""
    xs, _ = _tokens()
    x = mj.nested_tensor(xs, requires_grad=True)
    yb = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)
    for y, per in [(yb, lambda i: yb[i]), (yb[0, 0], lambda i: yb[0, 0])]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dense torch warns about broadcasting targets
            got = F.mse_loss(x, y, reduction="none")
            for i, (o, a) in enumerate(zip(got.unbind(), xs)):
                torch.testing.assert_close(o, F.mse_loss(a, per(i).expand_as(a), reduction="none"))
            ref = F.mse_loss(torch.cat(xs), torch.cat([per(i).expand_as(a) for i, a in enumerate(xs)]), reduction="sum")
        torch.testing.assert_close(F.mse_loss(x, y, reduction="sum"), ref)
        (g,) = torch.autograd.grad(F.mse_loss(x, y, reduction="sum"), yb)
        (gr,) = torch.autograd.grad(ref, yb)
        torch.testing.assert_close(g, gr)


def test_class_losses_no_grad_and_inference_mode():
    xs, ts = _tokens()
    x = mj.nested_tensor(xs).transpose(1, 2)
    t = mj.nested_tensor(ts)
    p = mj.nested_tensor([a.softmax(-1) for a in xs]).transpose(1, 2)
    want = [F.cross_entropy(x, t, label_smoothing=0.1), F.nll_loss(x, t, reduction="sum"),
            F.cross_entropy(x, p), F.kl_div(x, p, reduction="batchmean")]
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            got = [F.cross_entropy(x, t, label_smoothing=0.1), F.nll_loss(x, t, reduction="sum"),
                   F.cross_entropy(x, p), F.kl_div(x, p, reduction="batchmean")]
            none = F.cross_entropy(x, t, reduction="none")
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b.detach())
        assert [c.shape for c in none.unbind()] == [(3,), (0,), (2,)]


def test_class_losses_double_backward():
    """Second derivatives of cross_entropy (label smoothing, weights), nll_loss and kl_div
    against dense torch on the concatenated tokens."""
    xs, ts = _tokens()
    w = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)
    cases = [
        lambda a, b, p: F.cross_entropy(a, b, weight=w, label_smoothing=0.2),
        lambda a, b, p: F.nll_loss(a.log_softmax(1), b, reduction="sum"),
        lambda a, b, p: F.cross_entropy(a, p),
        lambda a, b, p: F.kl_div(a.log_softmax(1), p, reduction="sum"),
    ]
    for fn in cases:
        x = mj.nested_tensor(xs, requires_grad=True)
        t, p = mj.nested_tensor(ts), mj.nested_tensor([a.cos().softmax(-1) for a in xs])
        (g,) = torch.autograd.grad(fn(x.transpose(1, 2), t, p.transpose(1, 2)), x, create_graph=True)
        (gg,) = torch.autograd.grad((g.values() * g.values().detach().sin()).sum(), x)
        xv = torch.cat(xs).requires_grad_()
        (gd,) = torch.autograd.grad(fn(xv, torch.cat(ts), p.values()), xv, create_graph=True)
        (ggd,) = torch.autograd.grad((gd * gd.detach().sin()).sum(), xv)
        torch.testing.assert_close(g.values(), gd)
        torch.testing.assert_close(gg.values(), ggd)


def test_class_losses_compile():
    xs, ts = _tokens()
    x = mj.nested_tensor(xs, requires_grad=True)
    # on x's offsets, so that it has x's nested int: under tracing structures match by identity
    t = mj.from_packed(torch.cat(ts), x.offsets(), x.sizes(), ragged_dims=(1,))
    w = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(a, b):
        logits = a.transpose(1, 2)
        return (F.cross_entropy(logits, b, weight=w, label_smoothing=0.1) + F.nll_loss(logits.log_softmax(1), b, reduction="sum")
                + F.kl_div(a.log_softmax(-1), a.detach().cos().softmax(-1), reduction="batchmean"))

    got = f(x, t)
    xv = torch.cat(xs).requires_grad_()
    tv = torch.cat(ts)
    want = (F.cross_entropy(xv, tv, weight=w, label_smoothing=0.1) + F.nll_loss(xv.log_softmax(1), tv, reduction="sum")
            + F.kl_div(xv.log_softmax(-1), xv.detach().cos().softmax(-1), reduction="sum") / 3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x)[0].values(), torch.autograd.grad(want, xv)[0])


def _graph_names(out):
    seen, todo, names = set(), [out.grad_fn], set()
    while todo:
        n = todo.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        names.add(type(n).__name__)
        todo.extend(f for f, _ in n.next_functions)
    return names


def _seg_case(dtype, probs=False, ignore=-100):
    """Segmentation logits (B, K, j0, j1) with an empty image, targets (B, j0, j1) (a few
    ignored) or class probabilities (B, K, j0, j1)."""
    g = torch.Generator().manual_seed(5)
    sides = [(3, 5), (0, 4), (6, 2), (4, 4)]
    xs = [torch.randn(5, h, w, generator=g).to(dtype) for h, w in sides]
    if probs:
        ts = [torch.randn(5, h, w, generator=g).softmax(0).to(dtype) for h, w in sides]
    else:
        ts = [torch.randint(0, 5, (h, w), generator=g).masked_fill(torch.rand(h, w, generator=g) < 0.2, ignore) for h, w in sides]
    return xs, ts


CLASS_KW = [{}, {"weight": True}, {"ignore_index": 2}, {"label_smoothing": 0.2},
            {"weight": True, "ignore_index": 2, "label_smoothing": 0.3}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("kw", range(len(CLASS_KW)))
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_class_losses_are_one_dense_call_on_packed_values(dtype, reduction, kw, probs):
    """Segmentation logits (B, K, j0, j1): cross_entropy (and nll_loss) is dense torch's own
    call on the packed values (NOTE [ Class losses on the packed values ]): one NllLoss node in
    the graph, each image's 'none' loss dense torch's on that image, 'sum'/'mean' dense torch's
    over the concatenated pixels (the weighted mean divides by the weights of every counted
    pixel of the batch), gradients of input and probabilities, float32/float64/bfloat16."""
    args = dict(CLASS_KW[kw])
    if probs and args.pop("ignore_index", None) is not None:
        args["ignore_index"] = -100  # dense torch refuses ignore_index >= 0 with probabilities
    if args.get("weight"):
        args["weight"] = torch.tensor([0.5, 2.0, 1.5, 0.25, 1.0], dtype=dtype)
    xs, ts = _seg_case(dtype, probs, args.get("ignore_index", -100))
    x = mj.nested_tensor(xs, ragged_dims=(2, 3), requires_grad=True)
    t = mj.nested_tensor(ts, ragged_dims=(2, 3) if probs else (1, 2), requires_grad=probs)
    rx = [a.detach().clone().requires_grad_() for a in xs]
    rt = [a.detach().clone().requires_grad_() for a in ts] if probs else ts
    leaves, ref_leaves = ([x, t], [*rx, *rt]) if probs else ([x], rx)
    out = F.cross_entropy(x, t, reduction=reduction, **args)
    assert _graph_names(out) & {"NllLossBackward0", "NllLoss2DBackward0", "NllLossNdBackward0"} or probs
    assert "GatherBackward0" not in _graph_names(out)
    if reduction == "none":
        ref = [F.cross_entropy(a[None], b[None], reduction="none", **args)[0] for a, b in zip(rx, rt)]
        assert out.dtype == dtype and out.ragged_dims == (1, 2)
        for o, r in zip(out.unbind(), ref):
            torch.testing.assert_close(o, r)
        cot = [torch.rand(r.shape, dtype=dtype) for r in ref]
        got = torch.autograd.grad(sum((o * k).sum() for o, k in zip(out.unbind(), cot)), leaves)
        want = torch.autograd.grad(sum((r * k).sum() for r, k in zip(ref, cot)), ref_leaves)
        want_x = torch.cat([g.flatten(1).t() for g in want[:len(rx)]])
        torch.testing.assert_close(_rows(got[0]), want_x, **_grad_tol(dtype))
    else:
        cat = torch.cat([a.flatten(1) for a in rx], 1)[None]
        cat_t = torch.cat([b.flatten(1) for b in rt], 1)[None] if probs else torch.cat([b.flatten() for b in rt])[None]
        ref = F.cross_entropy(cat, cat_t, reduction=reduction, **args)
        assert out.dtype == ref.dtype == dtype
        torch.testing.assert_close(out, ref)
        got = torch.autograd.grad(out, leaves)
        want = torch.autograd.grad(ref, ref_leaves)
        torch.testing.assert_close(_rows(got[0]), torch.cat([g.flatten(1).t() for g in want[:len(rx)]]), **_grad_tol(dtype))
        if probs:
            torch.testing.assert_close(_rows(got[1]), torch.cat([g.flatten(1).t() for g in want[len(rx):]]),
                                       **_grad_tol(dtype))


def _grad_tol(dtype):
    """bfloat16 gradients: dense torch's kernels for (N, K) and (1, K, h, w) round differently."""
    return {"atol": 4e-3, "rtol": 4e-2} if dtype == torch.bfloat16 else {}


def _rows(g):
    """A (B, K, j0, j1) gradient as pixel rows (P, K), image after image."""
    return torch.cat([a.flatten(1).t() for a in g.unbind()])


def test_class_losses_take_the_dense_call_for_token_logits():
    """Token logits ``x.transpose(1, 2)`` and nll_loss: one dense call on the packed tokens, equal
    to dense torch on the concatenated tokens, in the forward and the gradient."""
    xs, ts = _tokens()
    x = mj.nested_tensor(xs, requires_grad=True)
    t = mj.nested_tensor(ts)
    w = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.float64)
    xv = torch.cat(xs).requires_grad_()
    for fn in (lambda a, b: F.cross_entropy(a, b, weight=w, label_smoothing=0.1),
               lambda a, b: F.nll_loss(a, b, weight=w)):
        out = fn(x.transpose(1, 2), t)
        assert "NllLossBackward0" in _graph_names(out) and "GatherBackward0" not in _graph_names(out)
        want = fn(xv, torch.cat(ts))
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(torch.autograd.grad(out, x)[0].values(), torch.autograd.grad(want, xv)[0])


def test_losses_under_autocast_are_float32():
    """Dense autocast (CPU, bfloat16) runs losses in float32 (its fp32 list); so do ours, on
    bfloat16 inputs produced by an autocast linear, with gradients to the float32 weights."""
    xs, ts = _tokens()
    x = mj.nested_tensor([a.float() for a in xs])
    t = mj.nested_tensor(ts)
    lin = torch.nn.Linear(4, 4)
    cases = {
        "ce": lambda a, b: F.cross_entropy(a.transpose(-1, -2) if a.dim() == 3 else a, b),
        "nll": lambda a, b: F.nll_loss(a.transpose(-1, -2) if a.dim() == 3 else a, b, reduction="sum"),
        "mse": lambda a, b: F.mse_loss(a, a.detach().cos()),
        "l1": lambda a, b: F.l1_loss(a, a.detach().cos(), reduction="sum"),
        "smooth_l1": lambda a, b: F.smooth_l1_loss(a, a.detach().cos()),
        "huber": lambda a, b: F.huber_loss(a, a.detach().cos()),
        "bce": lambda a, b: F.binary_cross_entropy_with_logits(a, a.detach().sigmoid()),
        "kl": lambda a, b: F.kl_div(a, a.detach().softmax(-1), reduction="batchmean"),
    }
    for name, fn in cases.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = lin(x)
            assert h.dtype == torch.bfloat16
            out = fn(h, t)
            hd = lin(torch.cat([a.float() for a in xs]))
            ref = fn(hd, torch.cat(ts)) if name != "kl" else fn(hd, None) * hd.shape[0] / len(xs)
        assert out.dtype == ref.dtype == torch.float32, name
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
        (g,) = torch.autograd.grad(out, lin.weight)
        (gr,) = torch.autograd.grad(ref, lin.weight)
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, gr, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("form", ["sequence-first token", "batch-first"])
def test_ctc_loss_per_sample_log_probs_and_ragged_targets(reduction, form):
    """Log-probabilities ``(B, j0, C)`` — or their token ``x.transpose(0, 1)``, as speech models
    call it — and targets ``(B, j1)``, against the padded dense call and against each sample's own
    (unbatched) loss; gradients of every log-probability."""
    g = torch.Generator().manual_seed(0)
    steps, labels = (6, 4, 7, 3), (2, 1, 3, 0)
    leaves = [torch.randn(t, 5, dtype=torch.float64, generator=g).log_softmax(-1).requires_grad_() for t in steps]
    targets = [torch.randint(1, 5, (s,), generator=g) for s in labels]
    x = mj.as_nested_tensor(leaves)
    y = torch.nested.nested_tensor(targets, layout=mj.multi_jagged)
    il, tl = torch.tensor(steps), torch.tensor(labels)
    got = F.ctc_loss(x.transpose(0, 1) if form.startswith("sequence") else x, y, il, tl, reduction=reduction, zero_infinity=True)
    padded = torch.nn.utils.rnn.pad_sequence(leaves)  # (T, N, C)
    want = F.ctc_loss(padded, torch.cat(targets), il, tl, reduction=reduction, zero_infinity=True)
    torch.testing.assert_close(got, want)
    each = torch.stack([F.ctc_loss(lp, t, n, m, reduction="sum", zero_infinity=True) for lp, t, n, m in zip(leaves, targets, il, tl)])
    if reduction != "mean":  # each sample's own loss (the mean divides by target lengths, one of them 0)
        torch.testing.assert_close(got, each if reduction == "none" else each.sum())
    for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(want.sum(), leaves)):
        torch.testing.assert_close(a, b)
    with pytest.raises(mj.StructureError, match=r"\(B, j0, C\)"):
        F.ctc_loss(mj.as_nested_tensor([torch.randn(2, n) for n in (3, 1)], ragged_dims=(2,)), y, il[:2], tl[:2])


def test_ctc_loss_lengths_read_each_samples_own_labels_and_steps():
    """Each sample reads the first ``target_lengths[i]`` of its *own* labels and the first
    ``input_lengths[i]`` of its own steps, as its own dense call does; a length past what the
    sample has raises, naming it (the concatenated targets would read the next sample's labels,
    the padded log-probabilities the padding). No sample's loss depends on another's labels."""
    g = torch.Generator().manual_seed(1)
    steps = (9, 8, 0, 12)
    leaves = [torch.randn(t, 6, dtype=torch.float64, generator=g).log_softmax(-1).requires_grad_() for t in steps]
    labels = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 1]), torch.tensor([], dtype=torch.int64), torch.tensor([2, 2])]
    x, y = mj.as_nested_tensor(leaves), mj.nested_tensor(labels)
    for il, tl in [((9, 8, 0, 12), (2, 3, 0, 2)), ((7, 8, 0, 5), (3, 1, 0, 0)), ((9, 6, 0, 12), (0, 2, 0, 1))]:
        got = F.ctc_loss(x.transpose(0, 1), y, torch.tensor(il), torch.tensor(tl), reduction="none", zero_infinity=True)
        # a sample without steps or labels: probability 1, loss 0 (its dense call refuses an empty input)
        each = torch.stack([F.ctc_loss(lp, t[:m], (n,), (m,), reduction="none", zero_infinity=True) if n
                            else lp.sum() * 0 for lp, t, n, m in zip(leaves, labels, il, tl)])
        torch.testing.assert_close(got, each)
        for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(each.sum(), leaves)):
            torch.testing.assert_close(a, b)
        # another sample's labels changed: this sample's loss is unchanged
        other = mj.nested_tensor([labels[0], labels[1] % 5 + 1, labels[2], labels[3]])
        again = F.ctc_loss(x.transpose(0, 1), other, torch.tensor(il), torch.tensor(tl), reduction="none", zero_infinity=True)
        assert torch.equal(again[[0, 2, 3]], got[[0, 2, 3]])
    with pytest.raises(RuntimeError, match=r"target_lengths\[1\] = 4 exceeds sample 1's number of labels, 3"):
        F.ctc_loss(x.transpose(0, 1), y, torch.tensor(steps), torch.tensor([2, 4, 0, 1]))
    with pytest.raises(RuntimeError, match=r"input_lengths\[0\] = 10 exceeds sample 0's length, 9"):
        F.ctc_loss(x, y, (10, 8, 0, 12), (3, 3, 0, 2))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_class_index_dtypes_as_dense(dtype):
    """Class indices of a dtype dense refuses raise dense's error; uint8 works as dense."""
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)]).transpose(1, 2)
    t = mj.nested_tensor([torch.tensor([0, 1, 2]), torch.tensor([1, 0])]).to(dtype)
    if dtype == torch.uint8:
        want = F.cross_entropy(torch.cat([c.T for c in x.unbind()]), torch.tensor([0, 1, 2, 1, 0]))
        torch.testing.assert_close(F.cross_entropy(x, t), want)
    else:
        with pytest.raises(RuntimeError, match="expected target dtype"):
            F.cross_entropy(x, t)


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits"])
def test_elementwise_losses_take_dense_dtypes_and_refusals(name):
    """The elementwise losses computed by routes give dense's result dtype for every pair of input
    and target dtypes, and raise where dense's kernel refuses (an integer or complex ``mse_loss``,
    an integer target of ``binary_cross_entropy_with_logits``) instead of promoting; values per
    sample."""
    f = getattr(F, name)
    dtypes = [torch.int64, torch.float32, torch.float64, torch.float16, torch.complex64, torch.bool]
    g = torch.Generator().manual_seed(0)
    for a in dtypes:
        for b in dtypes:
            xs = [(torch.randn(n, 4, generator=g) * 3).to(a) for n in (3, 0, 2)]
            ts = [(torch.rand(n, 4, generator=g) * 2).to(b) for n in (3, 0, 2)]
            try:
                want = [f(u, v, reduction="none") for u, v in zip(xs, ts)]
            except (RuntimeError, NotImplementedError) as e:
                with pytest.raises(type(e)):
                    f(mj.nested_tensor(xs), mj.nested_tensor(ts), reduction="none")
                continue
            out = f(mj.nested_tensor(xs), mj.nested_tensor(ts), reduction="none")
            for o, w in zip(out.unbind(), want):
                assert o.dtype == w.dtype, (a, b)
                # (a float16 operand: dense rounds its steps in it, the route in the result's dtype)
                tol = 1e-2 if torch.float16 in (a, b, w.dtype) else 1e-5
                torch.testing.assert_close(o, w, rtol=tol, atol=tol)
