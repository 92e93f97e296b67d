"""Op coverage specs: reductions, scans and order statistics, the softmax family, shape ops
(``op_coverage.py``; each ``@spec`` registers the cases of the DanLing operators it names)."""

from __future__ import annotations


import torch
import torch.nn.functional as F

try:
    from ._op_cases import (
        Case, DT, LENS, LENS_NZ, PAIR_LENS, R, cat_all, chans, check_random, comps, dense, idx_like,
        img, like, mats, method, pair, seq, seq4, spec, sq, sqm, vec,
    )
except ImportError:  # run as a script: python benchmarks/op_coverage.py
    from _op_cases import (
        Case, DT, LENS, LENS_NZ, PAIR_LENS, R, cat_all, chans, check_random, comps, dense, idx_like,
        img, like, mats, method, pair, seq, seq4, spec, sq, sqm, vec,
    )

aten = torch.ops.aten

# --- reductions --------------------------------------------------------------------------------
_RED = {
    # name: (call(x, dim, keepdim) or None, accepts a tuple of dims, empty extent ok, differentiable, full reduction)
    "sum": (True, True, True, True), "mean": (True, True, True, True), "nansum": (True, True, True, True),
    "nanmean": (True, True, True, True), "prod": (False, True, True, True), "amax": (True, False, True, True),
    "amin": (True, False, True, True), "logsumexp": (True, True, True, False), "var": (True, True, True, True),
    "std": (True, True, True, True), "all": (True, True, False, True), "any": (True, True, False, True),
    "count_nonzero": (True, True, False, True),
}


@spec(*_RED)
def _reduction(name):
    tup, empty_ok, grad, full = _RED[name]
    f = getattr(torch, name)
    dt = torch.bool if name in ("all", "any") else DT
    lens = LENS if empty_ok else LENS_NZ
    x = seq(dtype=dt, lens=lens)
    kw = lambda d: {"dim": d}  # noqa: E731
    cases = [
        Case(lambda a: f(a, **kw(-1)), (x,), ref=lambda c: f(c, **kw(-1)), grad=grad, label="static dim"),
        Case(lambda a: f(a, **kw(1)), (x,), ref=lambda c: f(c, **kw(0)), grad=grad, label="ragged dim"),
    ]
    if name != "count_nonzero":
        cases.append(Case(lambda a: f(a, 1, keepdim=True), (x,), ref=lambda c: f(c, 0, keepdim=True), grad=grad, label="ragged dim, keepdim"))
    if tup:
        p = pair(dtype=dt, lens=PAIR_LENS if empty_ok else (3, 1, 2))
        cases.append(Case(lambda a: f(a, **kw((1, 2))), (p,), ref=lambda c: f(c, **kw((0, 1))), grad=grad, label="pair, both ragged dims"))
        cases.append(Case(lambda a: f(a, **kw(2)), (p,), ref=lambda c: f(c, **kw(1)), grad=grad, label="pair, one ragged dim"))
    if full:
        cases.append(Case(lambda a: f(a), (x,), whole=lambda cs: f(cat_all(cs)), grad=grad, label="full reduction"))
    return cases


@spec("max", "min")
def _max_min(name):
    f = getattr(torch, name)
    x = seq(lens=LENS_NZ)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: tuple(f(c, -1)), label="dim=-1"),
        Case(lambda a: f(a, 1), (x,), ref=lambda c: tuple(f(c, 0)), label="ragged dim"),
        Case(lambda a: a.max() if name == "max" else a.min(), (seq(),), whole=lambda cs: f(cat_all(cs)), label="full"),
        Case(lambda a, b: f(a, b), (seq(), like(seq())), label="binary"),
    ]


@spec("argmax", "argmin")
def _argmax(name):
    f = getattr(torch, name)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: f(c, -1), label="dim=-1"),
        Case(lambda a: f(a, 1), (seq(lens=LENS_NZ),), ref=lambda c: f(c, 0), label="ragged dim"),
        Case(lambda a: f(a, 2, keepdim=True), (pair(lens=(3, 1, 2)),), ref=lambda c: f(c, 1, keepdim=True), label="pair"),
    ]


@spec("aminmax")
def _aminmax(name):
    return [
        Case(lambda a: tuple(torch.aminmax(a, dim=-1)), (seq(),), ref=lambda c: tuple(torch.aminmax(c, dim=-1))),
        Case(lambda a: tuple(torch.aminmax(a, dim=1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.aminmax(c, dim=0)), label="ragged dim"),
        Case(lambda a: tuple(torch.aminmax(a)), (seq(),), whole=lambda cs: tuple(torch.aminmax(cat_all(cs))), label="full"),
    ]


@spec("var_mean")
def _var_mean(name):
    return [
        Case(lambda a: torch.var_mean(a, dim=-1), (seq(),), ref=lambda c: torch.var_mean(c, dim=-1)),
        Case(lambda a: torch.var_mean(a, dim=1), (seq(),), ref=lambda c: torch.var_mean(c, dim=0), label="ragged dim"),
        Case(lambda a: torch.var_mean(a), (seq(),), whole=lambda cs: torch.var_mean(cat_all(cs)), label="full"),
    ]


@spec("median", "nanmedian", "mode")
def _median(name):
    f = getattr(torch, name)
    cases = [
        Case(lambda a: tuple(f(a, -1)), (seq(),), ref=lambda c: tuple(f(c, -1)), label="dim=-1"),
        Case(lambda a: tuple(f(a, 1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(f(c, 0)), label="ragged dim"),
    ]
    if name != "mode":
        cases.append(Case(lambda a: f(a), (seq(),), whole=lambda cs: f(cat_all(cs)), label="full"))
    return cases


@spec("kthvalue")
def _kthvalue(name):
    return [
        Case(lambda a: tuple(torch.kthvalue(a, 2, -1)), (seq(),), ref=lambda c: tuple(torch.kthvalue(c, 2, -1)), label="dim=-1"),
        Case(lambda a: tuple(torch.kthvalue(a, 1, 1)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.kthvalue(c, 1, 0)), label="ragged dim"),
    ]


@spec("quantile", "nanquantile")
def _quantile(name):
    f = getattr(torch, name)
    return [
        # dense quantile refuses an empty tensor whatever the dim: no zero-length sample here
        Case(lambda a: f(a, 0.3, dim=-1), (seq(lens=LENS_NZ),), ref=lambda c: f(c, 0.3, dim=-1), label="dim=-1"),
        Case(lambda a: f(a, 0.3, dim=1), (seq(lens=LENS_NZ),), ref=lambda c: f(c, 0.3, dim=0), label="ragged dim"),
        Case(lambda a: f(a, 0.3), (seq(),), whole=lambda cs: f(cat_all(cs), 0.3), label="full"),
    ]


@spec("linalg_vector_norm", "linalg_norm")
def _norms(name):
    f = torch.linalg.vector_norm if name == "linalg_vector_norm" else torch.linalg.norm
    return [
        Case(lambda a: f(a, dim=-1), (seq(),), ref=lambda c: f(c, dim=-1), label="dim=-1"),
        Case(lambda a: f(a, dim=1), (seq(),), ref=lambda c: f(c, dim=0), label="ragged dim"),
        Case(lambda a: f(a, 3.0, dim=(1, 2)) if name == "linalg_vector_norm" else f(a, "fro", dim=(1, 2)), (pair(),), ref=lambda c: f(c, 3.0, dim=(0, 1)) if name == "linalg_vector_norm" else f(c, "fro", dim=(0, 1)), label="pair"),
    ]


@spec("dist")
def _dist(name):
    x = seq()
    return [Case(lambda a, b: torch.dist(a, b), (x, like(x)), whole=lambda a, b: torch.dist(cat_all(a), cat_all(b))), Case(lambda a, b: torch.dist(a, b, 1.0), (x, like(x)), whole=lambda a, b: torch.dist(cat_all(a), cat_all(b), 1.0), label="p = 1")]


@spec("numel")
def _numel(name):
    return [Case(lambda a: a.numel(), (seq(),), whole=lambda cs: sum(c.numel() for c in cs), grad=False), Case(torch.numel, (pair(),), whole=lambda cs: sum(c.numel() for c in cs), grad=False)]


@spec("equal", "allclose")
def _equal(name):
    f = getattr(torch, name)
    x = seq()
    return [
        Case(f, (x, x), whole=lambda a, b: all(f(p, q) for p, q in zip(a, b)), grad=False, label="same values"),
        Case(f, (x, like(x)), whole=lambda a, b: all(f(p, q) for p, q in zip(a, b)), grad=False, label="different values"),
    ]


# --- scans and order ---------------------------------------------------------------------------
@spec("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
def _scans(name):
    f = getattr(torch, name)
    t = (lambda o: tuple(o)) if name in ("cummax", "cummin") else (lambda o: o)
    return [
        Case(lambda a: t(f(a, -1)), (seq(),), ref=lambda c: t(f(c, -1)), label="dim=-1"),
        Case(lambda a: t(f(a, 1)), (seq(),), ref=lambda c: t(f(c, 0)), label="ragged dim"),
        Case(lambda a: t(f(a, 2)), (pair(),), ref=lambda c: t(f(c, 1)), label="pair, second ragged dim"),
    ]


@spec("sort", "argsort")
def _sort(name):
    f = getattr(torch, name)
    t = (lambda o: tuple(o)) if name == "sort" else (lambda o: o)
    return [
        Case(lambda a: t(f(a, -1)), (seq(),), ref=lambda c: t(f(c, -1)), label="dim=-1"),
        Case(lambda a: t(f(a, 1, descending=True)), (seq(),), ref=lambda c: t(f(c, 0, descending=True)), label="ragged dim"),
        Case(lambda a: t(f(a, dim=2, stable=True)), (pair(),), ref=lambda c: t(f(c, dim=1, stable=True)), label="pair"),
    ]


@spec("topk")
def _topk(name):
    return [
        Case(lambda a: tuple(torch.topk(a, 2, -1)), (seq(),), ref=lambda c: tuple(torch.topk(c, 2, -1)), label="dim=-1"),
        Case(lambda a: tuple(torch.topk(a, 1, 1, largest=False)), (seq(lens=LENS_NZ),), ref=lambda c: tuple(torch.topk(c, 1, 0, largest=False)), label="ragged dim"),
    ]


# --- softmax family ----------------------------------------------------------------------------
@spec("softmax", "log_softmax", "softmin")
def _softmax(name):
    f = getattr(F, name)
    return [
        Case(lambda a: f(a, -1), (seq(),), ref=lambda c: f(c, -1), label="dim=-1"),
        Case(lambda a: f(a, 1), (seq(),), ref=lambda c: f(c, 0), label="ragged dim"),
        Case(lambda a: f(a, -2), (pair(),), ref=lambda c: f(c, -2), label="pair, ragged dim"),
        Case(lambda a: getattr(a, name)(-1) if name != "softmin" else F.softmin(a, -1), (pair(),), ref=lambda c: f(c, -1), label="method"),
    ]


@spec("gumbel_softmax")
def _gumbel(name):
    def soft(o, s):
        return bool(((o >= 0) & (o <= 1)).all() and torch.allclose(o.sum(-1), torch.ones((), dtype=o.dtype)))

    def hard(o, s):
        return bool(((o == 0) | (o == 1)).all() and (o.sum(-1) == 1).all())

    return [
        Case(lambda a: F.gumbel_softmax(a, tau=0.5, dim=-1), (seq(),), check=check_random(soft), grad=False, label="soft"),
        Case(lambda a: F.gumbel_softmax(a, hard=True, dim=-1), (seq(),), check=check_random(hard), grad=False, label="hard"),
    ]


# --- shape --------------------------------------------------------------------------------------
@spec("chunk", "split")
def _chunk(name):
    if name == "chunk":
        return [Case(lambda a: torch.chunk(a, 2, -1), (seq(c=4),), ref=lambda c: torch.chunk(c, 2, -1)), Case(lambda a: a.chunk(3, dim=-1), (pair(c=3),), ref=lambda c: c.chunk(3, -1))]
    return [
        Case(lambda a: torch.split(a, 1, -1), (seq(),), ref=lambda c: torch.split(c, 1, -1)),
        Case(lambda a: a.split([1, 2], dim=-1), (pair(c=3),), ref=lambda c: c.split([1, 2], -1)),
    ]


@spec("unbind")
def _unbind(name):
    return [
        Case(lambda a: a.unbind(), (seq(),), whole=lambda cs: tuple(cs), label="batch dim"),
        Case(lambda a: torch.unbind(a, -1), (seq(),), ref=lambda c: torch.unbind(c, -1), label="static dim"),
    ]


@spec("flatten")
def _flatten(name):
    return [
        Case(lambda a: a.flatten(-2), (seq4(),), ref=lambda c: c.flatten(-2), label="static dims"),
        Case(lambda a: torch.flatten(a, 1, 2), (pair(),), ref=lambda c: torch.flatten(c, 0, 1), label="both ragged dims of a pair"),
        Case(lambda a: a.flatten(1, 2), (seq4(),), ref=lambda c: c.flatten(0, 1), label="ragged with static"),
    ]


@spec("unflatten")
def _unflatten(name):
    return [Case(lambda a: a.unflatten(-1, (2, 3)), (seq(c=6),), ref=lambda c: c.unflatten(-1, (2, 3))), Case(lambda a: torch.unflatten(a, 3, (2, -1)), (pair(c=4),), ref=lambda c: torch.unflatten(c, 2, (2, -1)))]


@spec("reshape", "view", "view_copy")
def _reshape(name):
    if name == "view_copy":
        f = lambda a, shape: torch.view_copy(a, shape)  # noqa: E731
    else:
        f = lambda a, shape: getattr(a, name)(shape)  # noqa: E731
    return [
        Case(lambda a: f(a, (a.shape[0], a.shape[1], 2, 3)), (seq(c=6),), ref=lambda c: f(c, (c.shape[0], 2, 3)), label="split the static dim"),
        Case(lambda a: f(a, (a.shape[0], a.shape[1], 6)), (seq4(),), ref=lambda c: f(c, (c.shape[0], 6)), label="merge static dims"),
        Case(lambda a: f(a, (a.shape[0], -1, 6)), (seq4(),), ref=lambda c: f(c, (-1, 6)), label="-1 for the ragged dim"),
    ]


@spec("squeeze")
def _squeeze(name):
    return [
        Case(lambda a: a.squeeze(2), (seq4(s=1),), ref=lambda c: c.squeeze(1)),
        Case(lambda a: torch.squeeze(a, -1), (pair(c=1),), ref=lambda c: c.squeeze(-1)),
    ]


@spec("unsqueeze")
def _unsqueeze(name):
    return [Case(lambda a: a.unsqueeze(-1), (seq(),), ref=lambda c: c.unsqueeze(-1)), Case(lambda a: torch.unsqueeze(a, 2), (seq(),), ref=lambda c: c.unsqueeze(1)), Case(lambda a: a.unsqueeze(1), (pair(),), ref=lambda c: c.unsqueeze(0))]


@spec("permute")
def _permute(name):
    return [
        Case(lambda a: a.permute(0, 3, 1, 2), (seq4(),), ref=lambda c: c.permute(2, 0, 1)),
        Case(lambda a: torch.permute(a, (0, 2, 1, 3)), (pair(),), ref=lambda c: c.permute(1, 0, 2), label="swap ragged dims"),
    ]


@spec("transpose", "swapaxes", "swapdims")
def _transpose(name):
    return [
        Case(lambda a: getattr(torch, name)(a, 1, 2), (seq(),), ref=lambda c: getattr(torch, name)(c, 0, 1), label="ragged <-> static"),
        Case(lambda a: getattr(a, name)(1, 2), (pair(),), ref=lambda c: getattr(c, name)(0, 1), label="pair"),
        Case(lambda a: getattr(a, name)(-1, -2), (seq4(),), ref=lambda c: getattr(c, name)(-1, -2), label="static dims"),
    ]


@spec("movedim", "moveaxis")
def _movedim(name):
    f = getattr(torch, name)
    return [Case(lambda a: f(a, -1, 1), (seq(),), ref=lambda c: f(c, -1, 0)), Case(lambda a: getattr(a, name)(3, 1), (pair(),), ref=lambda c: f(c, 2, 0))]


@spec("expand")
def _expand(name):
    return [
        Case(lambda a: a.unsqueeze(2).expand(-1, -1, 4, -1), (seq(),), ref=lambda c: c.unsqueeze(1).expand(-1, 4, -1)),
        Case(lambda a: a.expand(a.shape[0], a.shape[1], 3), (seq(c=1),), ref=lambda c: c.expand(c.shape[0], 3)),
    ]


@spec("flip")
def _flip(name):
    return [Case(lambda a: torch.flip(a, (1,)), (seq(),), ref=lambda c: torch.flip(c, (0,)), label="ragged dim"), Case(lambda a: a.flip(-1), (seq(),), ref=lambda c: c.flip(-1)), Case(lambda a: a.flip(1, 2), (pair(),), ref=lambda c: c.flip(0, 1), label="pair")]


@spec("roll")
def _roll(name):
    return [Case(lambda a: torch.roll(a, 1, 1), (seq(),), ref=lambda c: torch.roll(c, 1, 0), label="ragged dim"), Case(lambda a: a.roll(-1, -1), (seq(),), ref=lambda c: c.roll(-1, -1))]


@spec("rot90")
def _rot90(name):
    return [Case(lambda a: torch.rot90(a, 1, (2, 3)), (seq4(),), ref=lambda c: torch.rot90(c, 1, (1, 2)), label="static dims"), Case(lambda a: a.rot90(1, (1, 2)), (pair(),), ref=lambda c: c.rot90(1, (0, 1)), label="ragged dims")]


@spec("tril", "triu")
def _tri(name):
    f = getattr(torch, name)
    return [Case(lambda a: f(a), (sq(),), ref=f, label="ragged square"), Case(lambda a: getattr(a, name)(1), (mats(),), ref=lambda c: f(c, 1), label="static matrices")]


@spec("diagonal")
def _diagonal(name):
    return [
        Case(lambda a: a.diagonal(dim1=1, dim2=2), (pair(),), ref=lambda c: c.diagonal(dim1=0, dim2=1), label="ragged dims"),
        Case(lambda a: torch.diagonal(a, 0, -2, -1), (mats(),), ref=lambda c: torch.diagonal(c, 0, -2, -1), label="static dims"),
    ]


@spec("diag")
def _diag(name):
    return [Case(torch.diag, (vec(),), label="vector -> matrix"), Case(torch.diag, (sq(),), label="matrix -> diagonal")]


@spec("diagflat")
def _diagflat(name):
    return [Case(torch.diagflat, (vec(),))]


@spec("trace")
def _trace(name):
    return [Case(torch.trace, (sq(),)), Case(method("trace"), (sqm(),), ref=torch.trace)]


@spec("stack", "cat", "concat", "concatenate")
def _join(name):
    f = getattr(torch, name)
    x = seq()
    if name == "stack":
        return [Case(lambda a, b: f([a, b], -1), (x, like(x)), ref=lambda a, b: f([a, b], -1)), Case(lambda a, b: f([a, b], 2), (x, like(x)), ref=lambda a, b: f([a, b], 1)), Case(lambda a, b: f((a, b), 1), (pair(), like(pair())), ref=lambda a, b: f((a, b), 0), label="before the ragged dims")]
    return [
        Case(lambda a, b: f([a, b], -1), (x, like(x)), ref=lambda a, b: f([a, b], -1), label="static dim"),
        Case(lambda a, b: f([a, b], 1), (x, like(x)), ref=lambda a, b: f([a, b], 0), label="ragged dim"),
        Case(lambda a, b: f([a, b], dim=-1), (pair(), like(pair())), ref=lambda a, b: f([a, b], -1), label="pair"),
    ]


@spec("broadcast_tensors")
def _broadcast_tensors(name):
    x = seq()
    return [Case(lambda a, b: torch.broadcast_tensors(a, b), (x, dense(3)), ref=lambda a, b: torch.broadcast_tensors(a, b)), Case(lambda a, b: torch.broadcast_tensors(a, b), (x, like(x)), ref=lambda a, b: torch.broadcast_tensors(a, b))]


@spec("repeat_interleave")
def _repeat_interleave(name):
    return [Case(lambda a: a.repeat_interleave(2, dim=-1), (seq(),), ref=lambda c: c.repeat_interleave(2, dim=-1)), Case(lambda a: torch.repeat_interleave(a, 2, dim=1), (seq(),), ref=lambda c: torch.repeat_interleave(c, 2, dim=0), label="ragged dim")]


@spec("take")
def _take(name):
    x = seq()
    return [Case(torch.take, (x, idx_like(x, lambda c: c.numel(), lambda c: (c.shape[0],))))]


@spec("take_along_dim")
def _take_along_dim(name):
    x = seq()
    return [
        Case(lambda a, i: torch.take_along_dim(a, i, -1), (x, idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))), ref=lambda a, i: torch.take_along_dim(a, i, -1)),
        Case(lambda a, i: torch.take_along_dim(a, i, 1), (x, idx_like(x, lambda c: c.shape[0], lambda c: c.shape)), ref=lambda a, i: torch.take_along_dim(a, i, 0), label="ragged dim"),
    ]


@spec("gather")
def _gather(name):
    x = seq()
    return [
        Case(lambda a, i: a.gather(-1, i), (x, idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))), ref=lambda a, i: a.gather(-1, i)),
        Case(lambda a, i: torch.gather(a, 1, i), (x, idx_like(x, lambda c: c.shape[0], lambda c: c.shape)), ref=lambda a, i: torch.gather(a, 0, i), label="ragged dim"),
    ]


@spec("scatter", "scatter_add", "scatter_reduce")
def _scatter(name):
    x = seq()
    i = idx_like(x, lambda c: 3, lambda c: (c.shape[0], 2))
    src = R(comps([(c.shape[0], 2) for c in x.comps], 5), (1,))
    f = {"scatter": torch.scatter, "scatter_add": torch.scatter_add, "scatter_reduce": lambda a, d, i, s: torch.scatter_reduce(a, d, i, s, "amax")}[name]
    cases = [Case(lambda a, i, s: f(a, -1, i, s), (x, i, src), ref=lambda a, i, s: f(a, -1, i, s), label="static dim")]
    iy = idx_like(x, lambda c: c.shape[0], lambda c: c.shape, seed=9)
    cases.append(Case(lambda a, i, s: f(a, 1, i, s), (x, iy, like(x, 6)), ref=lambda a, i, s: f(a, 0, i, s), label="ragged dim"))
    if name == "scatter":
        cases.append(Case(lambda a, i: a.scatter(-1, i, 0.5), (x, i), ref=lambda a, i: a.scatter(-1, i, 0.5), label="value"))
    return cases


@spec("index_select")
def _index_select(name):
    ix = torch.tensor([2, 0, 2])
    return [Case(lambda a: torch.index_select(a, -1, ix), (seq(),), ref=lambda c: torch.index_select(c, -1, ix)), Case(lambda a: a.index_select(3, ix[:2].clamp(max=1)), (pair(),), ref=lambda c: c.index_select(2, ix[:2].clamp(max=1)))]


@spec("index_add", "index_copy")
def _index_add(name):
    ix = torch.tensor([2, 0])
    x = seq()
    src = R(comps([(c.shape[0], 2) for c in x.comps], 5), (1,))
    f = getattr(torch, name)
    return [Case(lambda a, s: f(a, -1, ix, s), (x, src), ref=lambda a, s: f(a, -1, ix, s))]


@spec("index_put")
def _index_put(name):
    x = seq()
    m = like(x, 5, dtype=torch.bool)
    v = torch.tensor(0.5, dtype=DT)
    return [
        Case(lambda a, b: torch.index_put(a, (b,), v), (x, m), ref=lambda a, b: torch.index_put(a, (b,), v), label="boolean mask"),
        Case(lambda a, b: a.index_put((b,), v, accumulate=True), (x, m), ref=lambda a, b: a.index_put((b,), v, accumulate=True), label="accumulate"),
    ]


@spec("masked_select")
def _masked_select(name):
    x = seq()
    return [Case(torch.masked_select, (x, like(x, 5, dtype=torch.bool)))]


@spec("nonzero")
def _nonzero(name):
    return [Case(torch.nonzero, (seq(dtype=torch.int64),), grad=False), Case(method("nonzero"), (pair(dtype=torch.bool),), ref=torch.nonzero, grad=False)]


@spec("isin")
def _isin(name):
    te = torch.tensor([0, 2, -3])
    return [Case(lambda a: torch.isin(a, te), (seq(dtype=torch.int64),), ref=lambda c: torch.isin(c, te)), Case(lambda a: torch.isin(a, 2), (seq(dtype=torch.int64),), ref=lambda c: torch.isin(c, 2), label="scalar")]


@spec("searchsorted", "bucketize")
def _search(name):
    bounds = torch.tensor([-1.0, 0.0, 0.5, 1.5], dtype=DT)
    if name == "bucketize":
        return [Case(lambda a: torch.bucketize(a, bounds), (seq(),), ref=lambda c: torch.bucketize(c, bounds)), Case(lambda a: torch.bucketize(a, bounds, right=True), (pair(),), ref=lambda c: torch.bucketize(c, bounds, right=True))]
    sorted_seq = R([c.sort().values for c in vec(seed=4).comps], (1,))
    return [
        Case(lambda a: torch.searchsorted(bounds, a), (seq(),), ref=lambda c: torch.searchsorted(bounds, c), label="dense boundaries"),
        Case(lambda s, v: torch.searchsorted(s, v), (sorted_seq, vec(seed=5)), label="ragged boundaries per sample"),
    ]


@spec("constant_pad_nd", "pad")
def _pad(name):
    f = (lambda a, p, v=0.5: torch.constant_pad_nd(a, p, v)) if name == "constant_pad_nd" else (lambda a, p, v=0.5: F.pad(a, p, value=v))
    cases = [
        Case(lambda a: f(a, (1, 2)), (seq(),), ref=lambda c: f(c, (1, 2)), label="static dim"),
        Case(lambda a: f(a, (0, 0, 1, 2)), (seq(),), ref=lambda c: f(c, (0, 0, 1, 2)), label="ragged dim"),
    ]
    if name == "pad":
        cases.append(Case(lambda a: F.pad(a, (1, 1), mode="reflect"), (chans(lens=(3, 2, 4)),), ref=lambda c: F.pad(c, (1, 1), mode="reflect"), label="reflect along the ragged dim"))
        cases.append(Case(lambda a: F.pad(a, (1, 1, 1, 1), mode="replicate"), (img(),), ref=lambda c: F.pad(c, (1, 1, 1, 1), mode="replicate"), label="replicate, image"))
    return cases


@spec("one_hot")
def _one_hot(name):
    x = vec(dtype=torch.int64)
    x = R([c.abs() % 4 for c in x.comps], (1,))
    return [Case(lambda a: F.one_hot(a, 4), (x,), ref=lambda c: F.one_hot(c, 4))]
