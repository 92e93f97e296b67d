"""Op coverage specs: nn modules and functionals, losses, linear algebra, attention and recurrent
layers, the rest (``op_coverage.py``; each ``@spec`` registers the cases of the DanLing
operators it names)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

try:
    from ._op_cases import (
        Case, DT, HW_EVEN, LENS, LENS_NZ, PAIR_LENS, PS, PerSample, R, _gen, batched, chans, comps,
        dense, img, like, mats, method, na, pair, seq, spec, sqm, vec, vol,
    )
except ImportError:  # run as a script: python benchmarks/op_coverage.py
    from _op_cases import (
        Case, DT, HW_EVEN, LENS, LENS_NZ, PAIR_LENS, PS, PerSample, R, _gen, batched, chans, comps,
        dense, img, like, mats, method, na, pair, seq, spec, sqm, vec, vol,
    )

aten = torch.ops.aten

# --- nn ------------------------------------------------------------------------------------------
@spec("linear")
def _linear(name):
    w, b = dense(4, 3, seed=1), dense(4, seed=2)
    return [Case(F.linear, (seq(), w, b)), Case(F.linear, (pair(c=3), w)), Case(lambda a, w: a @ w.t(), (seq(), w), ref=lambda a, w: a @ w.t(), label="x @ w.T")]


@spec("bilinear")
def _bilinear(name):
    x = seq()
    w, b = dense(4, 3, 2, seed=1), dense(4, seed=2)
    return [Case(F.bilinear, (x, R(comps([(c.shape[0], 2) for c in x.comps], 3), (1,)), w, b))]


@spec("layer_norm", "rms_norm")
def _layer_norm(name):
    f = getattr(F, name)
    w = dense(3, seed=1)
    cases = [Case(lambda a, w: f(a, (3,), w), (seq(), w), ref=lambda a, w: f(a, (3,), w)), Case(lambda a: f(a, (2,)), (pair(),), ref=lambda c: f(c, (2,)), label="pair")]
    if name == "layer_norm":
        cases.append(Case(lambda a, w, b: F.layer_norm(a, (3,), w, b), (seq(), w, dense(3, seed=2)), ref=lambda a, w, b: F.layer_norm(a, (3,), w, b), label="bias"))
    return cases


@spec("group_norm")
def _group_norm(name):
    w, b = dense(4, seed=1), dense(4, seed=2)
    return [Case(lambda a, w, b: F.group_norm(a, 2, w, b), (chans(c=4, lens=LENS_NZ), w, b), ref=batched(lambda a, w, b: F.group_norm(a, 2, w, b))), Case(lambda a: F.group_norm(a, 1), (img(),), ref=batched(lambda a: F.group_norm(a, 1)), label="image")]


@spec("instance_norm")
def _instance_norm(name):
    return [Case(F.instance_norm, (chans(lens=(3, 2, 4)),), ref=batched(F.instance_norm)), Case(lambda a, w, b: F.instance_norm(a, weight=w, bias=b), (img(), dense(2, seed=1), dense(2, seed=2)), ref=batched(lambda a, w, b: F.instance_norm(a, weight=w, bias=b)), label="image")]


@spec("batch_norm")
def _batch_norm(name):
    rm, rv = dense(2, seed=3), dense(2, seed=4, dom="pos")
    w, b = dense(2, seed=1), dense(2, seed=2)

    def train_whole(xs, w, b):  # statistics over every position of every sample
        allpos = torch.cat([x.reshape(2, -1) for x in xs], 1)
        mean, var = allpos.mean(1), allpos.var(1, unbiased=False)
        shape = (2,) + (1,) * (xs[0].dim() - 1)
        return tuple((x - mean.view(shape)) / torch.sqrt(var.view(shape) + 1e-5) * w.view(shape) + b.view(shape) for x in xs)

    return [
        Case(lambda a, w, b: F.batch_norm(a, rm.clone(), rv.clone(), w, b, training=False), (chans(), w, b), ref=batched(lambda a, w, b: F.batch_norm(a, rm.clone(), rv.clone(), w, b, training=False)), label="eval"),
        Case(lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), (chans(), w, b), whole=lambda xs, w, b: PerSample(train_whole(xs, w, b)), label="training, over every sample"),
        Case(lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), (img(), w, b), whole=lambda xs, w, b: PerSample(train_whole(xs, w, b)), label="training, images"),
    ]


@spec("local_response_norm")
def _lrn(name):
    return [Case(lambda a: F.local_response_norm(a, 2), (chans(c=4),), ref=batched(lambda a: F.local_response_norm(a, 2))), Case(lambda a: F.local_response_norm(a, 3), (img(c=3),), ref=batched(lambda a: F.local_response_norm(a, 3)), label="image")]


@spec("normalize")
def _normalize(name):
    return [Case(lambda a: F.normalize(a, dim=-1), (seq(),), ref=lambda c: F.normalize(c, dim=-1)), Case(lambda a: F.normalize(a, dim=1), (seq(),), ref=lambda c: F.normalize(c, dim=0), label="ragged dim"), Case(lambda a: F.normalize(a, p=1, dim=-1), (pair(),), ref=lambda c: F.normalize(c, p=1, dim=-1))]


@spec("embedding")
def _embedding(name):
    w = dense(5, 3, seed=1)
    ix = R([c.abs() % 5 for c in vec(dtype=torch.int64).comps], (1,))
    return [Case(F.embedding, (ix, w)), Case(lambda i, w: F.embedding(i, w, padding_idx=0), (ix, w), ref=lambda i, w: F.embedding(i, w, padding_idx=0), label="padding_idx")]


@spec("embedding_bag")
def _embedding_bag(name):
    w = dense(5, 3, seed=1)
    ix = R([c.abs() % 5 for c in vec(dtype=torch.int64).comps], (1,))
    return [Case(lambda i, w: F.embedding_bag(i, w, mode="mean"), (ix, w), ref=lambda i, w: _bag(i, w, "mean")), Case(lambda i, w: F.embedding_bag(i, w, mode="sum"), (ix, w), ref=lambda i, w: _bag(i, w, "sum"), label="sum")]


def _bag(i, w, mode):
    """One bag per sample (an empty one gives zeros)."""
    return F.embedding_bag(i, w, torch.zeros(1, dtype=torch.int64), mode=mode)[0]


@spec("interpolate")
def _interpolate(name):
    return [
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), (chans(lens=(3, 2, 4)),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="nearest")), label="1-d nearest"),
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="linear"), (chans(lens=(3, 2, 4)),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="linear")), label="1-d linear"),
        Case(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), (img(),), ref=batched(lambda a: F.interpolate(a, scale_factor=2, mode="bilinear")), label="bilinear"),
    ]


@spec("grid_sample")
def _grid_sample(name):
    x = img()
    grid = R(comps([(n, 3, 2) for n in (2, 0, 3)], 4, dom="unit"), (1,))
    return [Case(lambda a, g: F.grid_sample(a, g, align_corners=False), (x, grid), ref=lambda a, g: F.grid_sample(a.unsqueeze(0), g.unsqueeze(0), align_corners=False).squeeze(0))]


@spec("pixel_shuffle", "pixel_unshuffle")
def _pixel(name):
    f = getattr(F, name)
    x = img(c=4) if name == "pixel_shuffle" else img(hw=HW_EVEN)
    return [Case(lambda a: f(a, 2), (x,), ref=lambda c: f(c, 2))]


@spec("channel_shuffle")
def _channel_shuffle(name):
    return [Case(lambda a: F.channel_shuffle(a, 2), (chans(c=4),), ref=batched(lambda a: F.channel_shuffle(a, 2))), Case(lambda a: F.channel_shuffle(a, 2), (img(c=4),), ref=batched(lambda a: F.channel_shuffle(a, 2)), label="image")]


@spec("unfold")
def _unfold(name):
    return [Case(lambda a: F.unfold(a, 2), (img(),), ref=batched(lambda a: F.unfold(a, 2))), Case(lambda a: F.unfold(a, 2, padding=1, stride=2), (img(),), ref=batched(lambda a: F.unfold(a, 2, padding=1, stride=2)), label="padding, stride")]


@spec("fold")
def _fold(name):
    # one output size for the batch: the samples have equal lengths
    x = chans(c=8, lens=(4, 4, 4))
    return [Case(lambda a: F.fold(a, (3, 3), 2), (x,), ref=batched(lambda a: F.fold(a, (3, 3), 2)))]


# convolutions and pools
@spec("conv1d", "conv_transpose1d")
def _conv1d(name):
    f = getattr(F, name)
    w = dense(3, 2, 3, seed=1) if name == "conv1d" else dense(2, 3, 3, seed=1)  # 2 channels in, 3 out
    b = dense(3, seed=2)
    return [Case(lambda a, w, b: f(a, w, b, padding=1), (chans(lens=(3, 2, 4)), w, b), ref=batched(lambda a, w, b: f(a, w, b, padding=1)))] + (
        [Case(lambda a, w: f(a, w, stride=2), (chans(lens=(3, 4, 5)), w), ref=batched(lambda a, w: f(a, w, stride=2)), label="stride 2")] if name == "conv1d" else []
    )


@spec("conv2d", "conv_transpose2d")
def _conv2d(name):
    f = getattr(F, name)
    w = dense(3, 2, 3, 3, seed=1) if name == "conv2d" else dense(2, 3, 3, 3, seed=1)
    b = dense(3, seed=2)
    return [Case(lambda a, w, b: f(a, w, b, padding=1), (img(), w, b), ref=batched(lambda a, w, b: f(a, w, b, padding=1)))]


@spec("conv3d", "conv_transpose3d")
def _conv3d(name):
    f = getattr(F, name)
    w = dense(2, 1, 3, 3, 3, seed=1) if name == "conv3d" else dense(1, 2, 3, 3, 3, seed=1)  # (out, in) / (in, out)
    return [Case(lambda a, w: f(a, w, padding=1), (vol(), w), ref=batched(lambda a, w: f(a, w, padding=1)))]


_POOLS = {
    "avg_pool1d": (lambda a: F.avg_pool1d(a, 2), "1"), "avg_pool2d": (lambda a: F.avg_pool2d(a, 2), "2"),
    "avg_pool3d": (lambda a: F.avg_pool3d(a, 2), "3"), "max_pool1d": (lambda a: F.max_pool1d(a, 2), "1"),
    "max_pool2d": (lambda a: F.max_pool2d(a, 2, 1), "2"), "max_pool3d": (lambda a: F.max_pool3d(a, 2), "3"),
    "max_pool1d_with_indices": (lambda a: F.max_pool1d(a, 2, return_indices=True), "1"),
    "max_pool2d_with_indices": (lambda a: F.max_pool2d(a, 2, return_indices=True), "2"),
    "max_pool3d_with_indices": (lambda a: F.max_pool3d(a, 2, return_indices=True), "3"),
    "adaptive_avg_pool1d": (lambda a: F.adaptive_avg_pool1d(a, 2), "1"), "adaptive_avg_pool2d": (lambda a: F.adaptive_avg_pool2d(a, 2), "2"),
    "adaptive_avg_pool3d": (lambda a: F.adaptive_avg_pool3d(a, 2), "3"), "adaptive_max_pool1d": (lambda a: F.adaptive_max_pool1d(a, 2), "1"),
    "adaptive_max_pool2d": (lambda a: F.adaptive_max_pool2d(a, 2), "2"), "adaptive_max_pool3d": (lambda a: F.adaptive_max_pool3d(a, 2), "3"),
    "adaptive_max_pool1d_with_indices": (lambda a: F.adaptive_max_pool1d(a, 2, return_indices=True), "1"),
    "adaptive_max_pool2d_with_indices": (lambda a: F.adaptive_max_pool2d(a, 2, return_indices=True), "2"),
    "adaptive_max_pool3d_with_indices": (lambda a: F.adaptive_max_pool3d(a, 2, return_indices=True), "3"),
    "lp_pool1d": (lambda a: F.lp_pool1d(a, 2, 2), "1"), "lp_pool2d": (lambda a: F.lp_pool2d(a, 2, 2), "2"),
    "lp_pool3d": (lambda a: F.lp_pool3d(a, 2, 2), "3"),
}


def _spatial(rank: str, even: bool = False) -> R:
    if rank == "1":
        return chans(lens=(4, 2, 6) if even else (3, 2, 5))
    if rank == "2":
        return img(hw=HW_EVEN if even else ((3, 4), (2, 2), (5, 3)))
    return vol(dhw=((2, 4, 2), (4, 2, 2)))


@spec(*_POOLS)
def _pool(name):
    f, rank = _POOLS[name]
    t = (lambda o: tuple(o) if isinstance(o, tuple) else o)
    return [Case(lambda a: t(f(a)), (_spatial(rank),), ref=batched(f))]


@spec("fractional_max_pool2d", "fractional_max_pool2d_with_indices", "fractional_max_pool3d", "fractional_max_pool3d_with_indices")
def _fractional(name):
    three = "3d" in name
    f = F.fractional_max_pool3d if three else F.fractional_max_pool2d
    ri = "with_indices" in name
    x = vol(dhw=((4, 4, 4), (6, 4, 4))) if three else img(hw=HW_EVEN)
    samples = PS(torch.rand(len(x.comps), x.comps[0].shape[0], 3 if three else 2, generator=_gen(2), dtype=DT), grad=False)
    ratio = 0.5 if three else (0.5, 0.5)  # (dense fractional_max_pool2d takes len() of the ratio)
    call = lambda a, s: f(a, 2, output_ratio=ratio, return_indices=ri, _random_samples=s)  # noqa: E731
    ref = lambda a, s: batched(lambda aa: f(aa, 2, output_ratio=ratio, return_indices=ri, _random_samples=s.unsqueeze(0)))(a)  # noqa: E731
    return [Case(lambda a, s: (tuple(call(a, s)) if ri else call(a, s)), (x, samples), ref=ref, grad=True)]


@spec("max_unpool1d", "max_unpool2d", "max_unpool3d")
def _unpool(name):
    rank = name[-2]
    pool = {"1": F.max_pool1d, "2": F.max_pool2d, "3": F.max_pool3d}[rank]
    unpool = getattr(F, name)

    def f(a):
        y, i = pool(a, 2, return_indices=True)
        return unpool(y, i, 2)

    return [Case(f, (_spatial(rank, even=True),), ref=batched(f))]


# --- losses ------------------------------------------------------------------------------------
def _loss_cases(f: Callable, make_args: Callable[[], tuple], elementwise: bool = True, **kw) -> list[Case]:
    """``reduction='none'`` per sample (elementwise losses), ``'sum'`` and ``'mean'`` over the whole
    batch (dense torch's reduction of the concatenated samples)."""
    args = make_args()

    def flat(*parts):  # the samples concatenated along their first dim: one dense call
        return tuple(torch.cat(p, 0) if isinstance(p, list) else p for p in parts)

    cases = []
    if elementwise:
        cases.append(Case(lambda *a: f(*a, reduction="none", **kw), args, ref=lambda *a: f(*a, reduction="none", **kw), label="none"))
    cases.append(Case(lambda *a: f(*a, reduction="sum", **kw), args, whole=lambda *a: f(*flat(*a), reduction="sum", **kw), label="sum"))
    cases.append(Case(lambda *a: f(*a, reduction="mean", **kw), args, whole=lambda *a: f(*flat(*a), reduction="mean", **kw), label="mean"))
    return cases


_ELEMENTWISE_LOSSES = {
    "l1_loss": (F.l1_loss, None, None, {}), "mse_loss": (F.mse_loss, None, None, {}),
    "smooth_l1_loss": (F.smooth_l1_loss, None, None, {"beta": 0.5}), "huber_loss": (F.huber_loss, None, None, {"delta": 0.5}),
    "soft_margin_loss": (F.soft_margin_loss, None, "sign", {}), "binary_cross_entropy": (F.binary_cross_entropy, "prob", "prob", {}),
    "binary_cross_entropy_with_logits": (F.binary_cross_entropy_with_logits, None, "prob", {}),
    "kl_div": (F.kl_div, None, "prob", {}), "poisson_nll_loss": (F.poisson_nll_loss, None, "pos", {}),
    "hinge_embedding_loss": (F.hinge_embedding_loss, None, "sign", {}),
}


@spec(*_ELEMENTWISE_LOSSES)
def _elementwise_loss(name):
    f, dx, dy, kw = _ELEMENTWISE_LOSSES[name]

    def make():
        x = seq(dom=dx)
        return (x, like(x, 3, dom=dy).const())

    cases = _loss_cases(f, make, **kw)
    if name == "kl_div":
        cases.append(Case(lambda a, b: F.kl_div(a, b, reduction="batchmean"), make(), whole=lambda a, b: sum(F.kl_div(p, q, reduction="sum") for p, q in zip(a, b)) / len(a), label="batchmean"))
    return cases


@spec("gaussian_nll_loss")
def _gaussian_nll(name):
    def make():
        x = seq()
        return (x, like(x, 3).const(), like(x, 4, dom="pos"))

    return _loss_cases(F.gaussian_nll_loss, make)


@spec("margin_ranking_loss")
def _margin_ranking(name):
    def make():
        x = vec()
        return (x, like(x, 3), like(x, 4, dom="sign").const())

    return _loss_cases(lambda a, b, y, **k: F.margin_ranking_loss(a, b, y, margin=0.2, **k), make)


@spec("cosine_embedding_loss")
def _cosine_embedding(name):
    def make():
        x = seq()
        return (x, like(x, 3), vec(seed=4, dom="sign").const())

    return _loss_cases(F.cosine_embedding_loss, make)


@spec("triplet_margin_loss", "triplet_margin_with_distance_loss")
def _triplet(name):
    f = F.triplet_margin_loss if name == "triplet_margin_loss" else (lambda a, p, n, **k: F.triplet_margin_with_distance_loss(a, p, n, distance_function=lambda u, v: (u - v).abs().sum(-1), **k))

    def make():
        x = seq()
        return (x, like(x, 3), like(x, 4))

    return _loss_cases(f, make)


@spec("multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "cross_entropy", "nll_loss")
def _class_losses(name):
    c = 4

    def make():
        x = seq(c=c, lens=(3, 0, 2, 4))
        if name == "multilabel_margin_loss":
            y = R([torch.where(torch.arange(c) < 2, (torch.arange(c) + i) % c, -1).expand(n, c).clone() for i, n in enumerate(LENS)], (1,))
        elif name == "multilabel_soft_margin_loss":
            y = like(x, 3, dom="bin").const()
        else:
            y = R([t.abs() % c for t in vec(seed=3, dtype=torch.int64).comps], (1,))
        return (x, y)

    f = {
        "multi_margin_loss": F.multi_margin_loss, "multilabel_margin_loss": F.multilabel_margin_loss,
        "multilabel_soft_margin_loss": F.multilabel_soft_margin_loss, "cross_entropy": F.cross_entropy,
        "nll_loss": lambda a, t, **k: F.nll_loss(F.log_softmax(a, 1), t, **k),
    }[name]
    if name in ("cross_entropy", "nll_loss"):
        # the class dim is dim 1, as in dense torch: a (B, j0, C) batch goes in as (B, C, j0)
        g = lambda a, t, **k: f(a.transpose(1, 2), t, **k)  # noqa: E731
        cases = [Case(lambda a, t: g(a, t, reduction="none"), make(), ref=lambda a, t: f(a, t, reduction="none"), label="none")]
        cases.append(Case(lambda a, t: g(a, t, reduction="sum"), make(), whole=lambda a, t: f(torch.cat(a), torch.cat(t), reduction="sum"), label="sum"))
        cases.append(Case(lambda a, t: g(a, t, reduction="mean"), make(), whole=lambda a, t: f(torch.cat(a), torch.cat(t), reduction="mean"), label="mean"))
        return cases
    return _loss_cases(f, make)


@spec("ctc_loss")
def _ctc(name):
    lp = R([torch.log_softmax(t, -1) for t in comps([(n, 4) for n in (5, 4, 6)], 2)], (1,))
    tg = R([torch.tensor(t) for t in ([1, 2], [3], [1, 1, 2])], (1,))
    il, tl = torch.tensor([5, 4, 6]), torch.tensor([2, 1, 3])

    def f(a, t):
        return F.ctc_loss(a, t, il, tl, reduction="sum")

    return [Case(f, (lp, tg), whole=lambda a, t: sum(F.ctc_loss(p, q, n, m, reduction="sum") for p, q, n, m in zip(a, t, il, tl)))]


# --- linear algebra ------------------------------------------------------------------------------
_LINALG = {
    "det": (torch.det, "gen"), "linalg_det": (torch.linalg.det, "gen"), "inverse": (torch.inverse, "gen"),
    "linalg_inv": (torch.linalg.inv, "gen"), "linalg_cholesky": (torch.linalg.cholesky, "spd"),
    "matrix_exp": (torch.matrix_exp, "gen"), "matrix_power": (lambda a: torch.matrix_power(a, 3), "gen"),
    "linalg_matrix_power": (lambda a: torch.linalg.matrix_power(a, 2), "gen"),
    "linalg_eigh": (lambda a: tuple(torch.linalg.eigh(a)), "sym"), "linalg_qr": (lambda a: tuple(torch.linalg.qr(a)), "gen"),
    "linalg_svd": (lambda a: tuple(torch.linalg.svd(a)), "gen"),
    "_linalg_eigh": (lambda a: tuple(aten._linalg_eigh.default(a)), "sym"), "_linalg_svd": (lambda a: tuple(aten._linalg_svd.default(a)), "gen"),
}


@spec(*_LINALG)
def _linalg(name):
    f, kind = _LINALG[name]
    return [Case(f, (mats(kind=kind),), tol=1e-6, label="static matrices"), Case(f, (sqm(kind=kind),), tol=1e-6, label="ragged square matrices")]


@spec("linalg_solve", "_linalg_solve_ex")
def _solve(name):
    f = torch.linalg.solve if name == "linalg_solve" else (lambda a, b: tuple(aten._linalg_solve_ex.default(a, b)))
    a = mats()
    b = R(comps([(n, 3) for n in LENS], 4), (1,))
    a2 = sqm()
    b2 = R(comps([(n, 2) for n in PAIR_LENS], 5), (1,))
    b = R([c.unsqueeze(-1) for c in b.comps], (1,))
    return [Case(f, (a, b), tol=1e-6, label="static matrices"), Case(f, (a2, b2), tol=1e-6, label="ragged square matrices")]


@spec("_linalg_check_errors")
def _check_errors(name):
    info = R([torch.zeros(n, dtype=torch.int32) for n in LENS], (1,))
    return [Case(lambda i: aten._linalg_check_errors.default(i, "linalg.inv", is_matrix=False), (info,), whole=lambda i: None, grad=False)]


@spec("mm", "matmul")
def _mm(name):
    w = dense(3, 4, seed=1)
    f = getattr(torch, name)
    cases = [Case(f, (seq(), w), label="ragged @ dense")]
    if name == "matmul":
        x = seq()
        cases.append(Case(lambda a, b: a @ b.transpose(1, 2), (x, like(x)), ref=lambda a, b: a @ b.transpose(0, 1), label="ragged @ ragged -> pair"))
        cases.append(Case(lambda a, w: a @ w, (pair(c=3), w), ref=lambda a, w: a @ w, label="pair @ dense"))
    else:
        x = seq()
        cases.append(Case(lambda a, b: torch.mm(a.transpose(1, 2), b), (x, like(x)), ref=lambda a, b: torch.mm(a.t(), b), label="contract the ragged dim"))
    return cases


@spec("bmm", "baddbmm")
def _bmm(name):
    x = seq()
    w = PS(dense(4, 3, 2, seed=1))  # one (C, D) matrix per sample
    if name == "bmm":
        return [Case(torch.bmm, (x, w), ref=lambda a, w: a @ w, label="ragged @ per-sample dense"), Case(lambda a, b: torch.bmm(a, b.transpose(1, 2)), (x, like(x)), ref=lambda a, b: a @ b.t(), label="ragged @ ragged")]
    m = R(comps([(n, 2) for n in LENS], 5), (1,))
    return [Case(lambda i, a, w: torch.baddbmm(i, a, w, beta=0.5, alpha=2.0), (m, x, w), ref=lambda i, a, w: 0.5 * i + 2.0 * (a @ w))]


@spec("addmm")
def _addmm(name):
    w, b = dense(3, 4, seed=1), dense(4, seed=2)
    return [Case(torch.addmm, (b, seq(), w), ref=torch.addmm)]


@spec("addr")
def _addr(name):
    v = dense(4, seed=2)
    x = vec()
    m = R(comps([(n, 4) for n in LENS], 5), (1,))
    return [Case(torch.addr, (m, x, v))]


@spec("mv")
def _mv(name):
    return [Case(torch.mv, (seq(), dense(3, seed=1)), label="ragged matrix, dense vector"), Case(method("mv"), (sqm(), vec(lens=PAIR_LENS)), ref=torch.mv, label="ragged square matrix, ragged vector")]


@spec("dot", "vdot", "inner")
def _dot(name):
    f = getattr(torch, name)
    x = vec()
    cases = [Case(f, (x, like(x)), label="per-sample vectors")]
    if name == "inner":
        cases.append(Case(f, (seq(), dense(3, seed=1)), label="(B, j0, C) with (C,)"))
    return cases


@spec("outer", "ger")
def _outer(name):
    f = getattr(torch, name)
    return [Case(f, (vec(), dense(4, seed=1)), label="ragged x dense"), Case(f, (vec(), vec(seed=1)), label="ragged x ragged")]


@spec("einsum")
def _einsum(name):
    w = dense(3, 4, seed=1)
    x = seq()
    return [
        Case(lambda a, w: torch.einsum("bnc,cd->bnd", a, w), (x, w), ref=lambda a, w: torch.einsum("nc,cd->nd", a, w)),
        Case(lambda a, b: torch.einsum("bic,bjc->bij", a, b), (x, like(x)), ref=lambda a, b: torch.einsum("ic,jc->ij", a, b), label="pair"),
        Case(lambda a: torch.einsum("bijc->bc", a), (pair(),), ref=lambda a: torch.einsum("ijc->c", a), label="reduce a pair"),
    ]


@spec("pdist")
def _pdist(name):
    return [Case(F.pdist, (seq(lens=(3, 1, 2, 4)),))]


@spec("pairwise_distance")
def _pairwise(name):
    x = seq()
    return [Case(F.pairwise_distance, (x, like(x))), Case(F.pairwise_distance, (x, dense(3)), label="dense operand")]


@spec("grouped_mm")
def _grouped_mm(name):
    # one (K, N) matrix per sample, rows of the samples packed: float32, strides of 16 bytes
    x = seq(c=4, lens=(3, 0, 2, 4), dtype=torch.float32)
    w = PS(dense(4, 4, 4, seed=1, dtype=torch.float32))
    return [Case(lambda a, w: F.grouped_mm(a, w), (x, w), ref=lambda a, w: a @ w, tol=1e-5)]


@spec("scaled_mm")
def _scaled_mm(name):
    x = seq(c=16, lens=(16, 0, 32))
    x = R([c.to(torch.float8_e4m3fn) for c in x.comps], (1,))
    w = dense(16, 16, seed=1).to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.tensor(1.0)

    def f(a, w):
        return F.scaled_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32)

    return [Case(f, (x, w), grad=False, tol=1e-5)]


@spec("scaled_grouped_mm")
def _scaled_grouped_mm(name):
    x = seq(c=16, lens=(16, 0, 32))
    x = R([c.to(torch.float8_e4m3fn) for c in x.comps], (1,))
    w = PS(dense(3, 16, 16, seed=1).to(torch.float8_e4m3fn).transpose(-1, -2).contiguous().transpose(-1, -2))
    one = torch.tensor(1.0)

    def f(a, w):
        return F.scaled_grouped_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32)

    return [Case(f, (x, w), ref=lambda a, w: F.scaled_mm(a, w, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise, output_dtype=torch.float32), grad=False, tol=1e-5)]


# --- attention, recurrent --------------------------------------------------------------------------
def _heads(lens=LENS, h=2, d=3, seed=0) -> R:
    return R(comps([(h, n, d) for n in lens], seed), (2,))


@spec("scaled_dot_product_attention")
def _sdpa(name):
    f = F.scaled_dot_product_attention
    q = _heads()
    return [
        Case(f, (q, like(q, 1), like(q, 2))),
        Case(lambda a, b, c: f(a, b, c, is_causal=True), (q, like(q, 1), like(q, 2)), label="causal"),
        Case(lambda a, b, c: f(a, b, c), (q, _heads(lens=(2, 3, 0, 1), seed=1), _heads(lens=(2, 3, 0, 1), seed=2)), ref=lambda a, b, c: f(a, b, c), label="cross attention"),
    ]


@spec("flex_attention")
def _flex(name):
    from torch.nn.attention.flex_attention import flex_attention

    q = _heads(lens=(3, 1, 2, 4))
    # torch's flex_attention has no backward on the CPU: forward only
    return [Case(flex_attention, (q, like(q, 1), like(q, 2)), ref=lambda a, b, c: flex_attention(a[None], b[None], c[None])[0], grad=False)]


def _mha_module(e=4, h=2):
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(e, h, batch_first=True, dtype=DT)


@spec("multi_head_attention_forward")
def _mha(name):
    m = _mha_module()
    f = lambda x: m(x, x, x, need_weights=False)[0]  # noqa: E731
    return [Case(f, (seq(c=4),), ref=batched(f))]


@spec("_native_multi_head_attention")
def _native_mha(name):
    m = _mha_module()

    def f(x):
        return aten._native_multi_head_attention.default(x, x, x, 4, 2, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, need_weights=False)[0]

    return [Case(f, (seq(c=4),), ref=batched(f), grad=False)]


@spec("_transformer_encoder_layer_fwd")
def _encoder_layer(name):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True, dtype=DT).eval()

    def f(x):
        with torch.no_grad():
            return layer(x)

    return [Case(f, (seq(c=4),), ref=batched(f), grad=False)]


_RNN = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "rnn_tanh": torch.nn.RNN, "rnn_relu": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="relu", **k)}


@spec(*_RNN)
def _rnn(name):
    torch.manual_seed(0)
    m = _RNN[name](3, 4, batch_first=True, dtype=DT)
    return [Case(lambda x: m(x)[0], (seq(lens=(3, 1, 2, 4)),), ref=batched(lambda x: m(x)[0]))]


# --- the rest --------------------------------------------------------------------------------------
@spec("affine_grid")
def _affine_grid(name):
    # one affine matrix per token of a ragged batch of tokens, each on a 3 x 3 grid (dense
    # affine_grid refuses N = 0: no empty sample)
    th = R(comps([(n, 2, 3) for n in LENS_NZ], 1), (1,))
    return [Case(lambda t: F.affine_grid(t, [t.shape[1], 1, 3, 3], align_corners=False), (th,), ref=lambda t: F.affine_grid(t, [t.shape[0], 1, 3, 3], align_corners=False))]


na("a CUDA-only kernel: torch has no CPU implementation, so there is no per-sample reference on this build", "_flash_attention_forward")
