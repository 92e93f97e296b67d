"""Ops along a ragged dim run by dense torch's own kernels (NOTE [ Dense ops along a ragged dim ] in
kernels/dense_along.py): ``softmax`` / ``log_softmax`` and their backward, ``cumsum`` / ``cumprod`` /
``logcumsumexp`` (and ``cummax`` / ``cummin``, which run per segment with the order statistics,
checked alike). In both forms (sample by sample, padded envelope) every
sample's result is the dense op's on that sample, bit for bit: values and dtypes in every dtype
dense takes, gradients (the scans' to within dense's own rounding where its formula divides or
exponentiates), second order, infinities and NaNs, zero-length samples and B = 0, no leakage.
Also: the rule that picks the form, ``logsumexp`` in float16 / bfloat16 as dense torch rounds it,
and the traced formulations that ``torch.compile`` keeps."""

import contextlib

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj
from torch_multijagged.kernels import dense_along as da

from _reference import assert_close, general_path
from _structures import bit_equal

INF, NAN = float("inf"), float("nan")
LENGTHS = (20, 0, 33, 1, 5)  # a zero-length sample, a sample of one, samples both sides of a vector's width
# name -> (ragged dims, component shape of length n): ragged dims leading, a static dim before
# them (attention scores, the last dim ragged), a rectangular pair
LAYOUTS = {
    "seq": ((1,), lambda n: (n, 5)),
    "pair": ((1, 2), lambda n: (n, n, 3)),
    "rect": ((1, 2), lambda n: (n, n // 2 + 1, 2)),
    "scores": ((2, 3), lambda n: (2, n, n)),
    "channels": ((2,), lambda n: (3, n)),
}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@contextlib.contextmanager
def form(name: str):
    """Force the padded form (where the op allows it) or the per-sample one."""
    prev = da.PADDED_BELOW
    da.PADDED_BELOW = 10**9 if name == "padded" else 0
    try:
        yield
    finally:
        da.PADDED_BELOW = prev


def _comps(layout: str, dtype, seed: int = 0, special: bool = False, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    shape = LAYOUTS[layout][1]
    out = []
    for n in lengths:
        s = shape(n)
        if dtype.is_floating_point or dtype.is_complex:
            t = (torch.randn(s, generator=g, dtype=torch.float64) * 2).to(dtype)
            if special and t.numel() > 8:
                f = t.view(-1)
                f[1], f[3], f[6] = INF, 0.0, -INF
                if t.numel() > 20:
                    f[17] = NAN
        elif dtype == torch.bool:
            t = torch.rand(s, generator=g) > 0.5
        else:
            t = torch.randint(0 if dtype == torch.uint8 else -3, 4, s, generator=g).to(dtype)
        out.append(t)
    return out


def _cases():
    """(layout, logical dim) of every ragged dim and one static dim of each layout."""
    for name, (rd, shape) in LAYOUTS.items():
        ndim = len(shape(2)) + 1
        for d in range(1, ndim):
            yield name, d


CASES = list(_cases())


def _outs(out):
    return out if isinstance(out, tuple) else (out,)


def _bits(a, b) -> bool:
    if a.is_complex() and b.is_complex():  # complex NaNs compared by their parts' bits
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    return bit_equal(a, b)


def _check_bits(got, comps, ref, what):
    for i, c in enumerate(comps):
        for o, e in zip(_outs(got), _outs(ref(c))):
            assert _bits(o.unbind()[i], e), f"{what}: sample {i}"


# ----------------------------------------------------------------------------- softmax
SOFTMAX = {"softmax": lambda t, d: t.softmax(d), "log_softmax": lambda t, d: torch.log_softmax(t, d),
           "nn.Softmax": lambda t, d: torch.nn.Softmax(d)(t)}


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("name", list(SOFTMAX))
@pytest.mark.parametrize("layout,d", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_softmax_bit_equal_per_sample(layout, d, name, which):
    """Values, in every float dtype, with infinities and NaNs in some rows; gradients bit-equal on
    the values path and on the general path (its handlers' backward), in float32 and float64."""
    f = SOFTMAX[name]
    rd = LAYOUTS[layout][0]
    with form(which):
        for dtype in FLOATS:
            for special in (False, True):
                comps = _comps(layout, dtype, special=special)
                with torch.no_grad():
                    _check_bits(f(mj.nested_tensor(comps, ragged_dims=rd), d), comps, lambda c: f(c, d - 1),
                                f"{dtype} values")
        for dtype in (torch.float32, torch.float64):
            comps = _comps(layout, dtype, seed=1)
            g = _comps(layout, dtype, seed=2)
            for path in (contextlib.nullcontext, general_path):
                with path():
                    x = mj.nested_tensor(comps, ragged_dims=rd, requires_grad=True)
                    gx, = torch.autograd.grad(f(x, d), x, mj.nested_tensor(g, ragged_dims=rd))
                for i, (c, gi) in enumerate(zip(comps, g)):
                    c = c.clone().requires_grad_()
                    want, = torch.autograd.grad(f(c, d - 1), c, gi)
                    assert bit_equal(gx.unbind()[i], want), f"{dtype} {path.__name__} gradient: sample {i}"


def _second_order(fn, ref, comps, rd, seed=0, **tol):
    """⟨d/dx ⟨fn(x), c⟩, w⟩ differentiated again, against the same through ``ref`` per sample."""
    leaves = [c.clone().requires_grad_() for c in comps]
    refl = [c.clone().requires_grad_() for c in comps]
    out = fn(mj.as_nested_tensor(leaves, ragged_dims=rd))
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c in comps]
    w = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c in comps]
    exp = [ref(c) for c in refl]
    gm = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out.unbind(), cot)), leaves, create_graph=True)
    gr = torch.autograd.grad(sum((e * c).sum() for e, c in zip(exp, cot)), refl, create_graph=True)
    lm = sum((a * b).sum() for a, b in zip(gm, w))
    lr = sum((a * b).sum() for a, b in zip(gr, w))
    # a gradient that does not depend on x (a linear op) has second derivative 0 on either side
    ggm = torch.autograd.grad(lm, leaves, allow_unused=True) if lm.requires_grad else [None] * len(comps)
    ggr = torch.autograd.grad(lr, refl, allow_unused=True) if lr.requires_grad else [None] * len(comps)
    for k, (a, b, c) in enumerate(zip(ggm, ggr, comps)):
        z = torch.zeros_like(c)
        assert_close(z if a is None else a, z if b is None else b, f"second derivative of sample {k}", **tol)


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("layout,d", [("seq", 1), ("pair", 1), ("pair", 2), ("scores", 3)])
def test_softmax_second_order(layout, d, which):
    rd = LAYOUTS[layout][0]
    comps = _comps(layout, torch.float64, lengths=(4, 0, 6, 1))
    with form(which):
        for f in (SOFTMAX["softmax"], SOFTMAX["log_softmax"]):
            for path in (contextlib.nullcontext, general_path):
                with path():
                    _second_order(lambda x: f(x, d), lambda c: f(c, d - 1), comps, rd)


def test_softmax_of_attention_scores_is_right_where_an_out_kernel_writes_wrong():
    """Scores ``(B, H, j0, j0)`` lie ragged dims first in the values, so a sample's result is a
    permuted view of the packed result: aten's ``_softmax.out`` writes such a view wrong, and the
    per-sample form packs these results instead (a permuted ``out=`` would fail this)."""
    comps = _comps("scores", torch.float32)
    with form("sample"), torch.no_grad():
        _check_bits(mj.nested_tensor(comps, ragged_dims=(2, 3)).softmax(-1), comps, lambda c: c.softmax(-1), "scores")


# ----------------------------------------------------------------------------- scans
def _cum(name, dtype=None):
    fn = getattr(torch, name)
    if name in ("cummax", "cummin"):
        return lambda t, d: tuple(fn(t, d))
    if name == "logcumsumexp":
        return fn
    return lambda t, d: fn(t, d, dtype=dtype)


SCANS = ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"]
INTS = [torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("name", SCANS)
@pytest.mark.parametrize("layout,d", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_scan_values_bit_equal_per_sample(layout, d, name, which):
    """Every dtype dense takes (integers and bool accumulate in int64 for cumsum / cumprod, as
    dense; complex for the sums and products), ``dtype=``, infinities, zeros and NaNs; along a
    static dim the values' own dim."""
    rd = LAYOUTS[layout][0]
    dtypes = FLOATS + ([torch.complex64] if name in ("cumsum", "cumprod", "logcumsumexp") else [])
    dtypes += INTS if name != "logcumsumexp" else []
    with form(which), torch.no_grad():
        for dtype in dtypes:
            for special in (False, True):
                comps = _comps(layout, dtype, special=special)
                f = _cum(name)
                _check_bits(f(mj.nested_tensor(comps, ragged_dims=rd), d), comps, lambda c: f(c, d - 1),
                            f"{dtype} values")
        if name in ("cumsum", "cumprod"):
            comps = _comps(layout, torch.int32)
            f = _cum(name, torch.float64)
            _check_bits(f(mj.nested_tensor(comps, ragged_dims=rd), d), comps, lambda c: f(c, d - 1), "dtype=")


def _scan_grads(layout, d, name, dtype, special, path=contextlib.nullcontext):
    rd = LAYOUTS[layout][0]
    comps = _comps(layout, dtype, seed=3, special=special)
    g = _comps(layout, dtype, seed=4)
    f = _cum(name)
    with path():
        x = mj.nested_tensor(comps, ragged_dims=rd, requires_grad=True)
        gx, = torch.autograd.grad(_outs(f(x, d))[0], x, mj.nested_tensor(g, ragged_dims=rd))
    for i, (c, gi) in enumerate(zip(comps, g)):
        c = c.clone().requires_grad_()
        want, = torch.autograd.grad(_outs(f(c, d - 1))[0], c, gi)
        yield i, gx.unbind()[i], want


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("name", SCANS)
@pytest.mark.parametrize("layout,d", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_scan_gradients_as_dense(layout, d, name, which):
    """Dense torch's own derivative, also beside infinities and zeros (``cumprod``'s gradient at an
    infinite element is dense's nan, a sample of one passes the gradient through): bit-equal for
    the sums and the running max / min, to dense's rounding where its formula divides (``cumprod``)
    or exponentiates (``logcumsumexp``; its elementwise kernels round a vector's tail apart), with
    dense's NaNs and infinities."""
    exact = name in ("cumsum", "cummax", "cummin")
    with form(which):
        for dtype in (torch.float32, torch.float64):
            for special in (False, True):
                for i, got, want in _scan_grads(layout, d, name, dtype, special):
                    if exact:
                        assert bit_equal(got, want), f"{dtype} gradient: sample {i}"
                    else:
                        assert torch.equal(got.isnan(), want.isnan()), f"{dtype} gradient's NaNs: sample {i}"
                        tol = 1e-5 if dtype == torch.float32 else 1e-12
                        assert_close(got, want, f"{dtype} gradient: sample {i}", rtol=tol, atol=tol)


@pytest.mark.parametrize("which", ["sample", "padded"])
def test_cumprod_gradient_at_infinities_and_single_cells_is_dense(which):
    """An infinite or NaN element takes dense's nan gradient; a segment of one cell takes the
    gradient itself (dense returns it unchanged for a dim of size 1, also at an infinity), in an
    envelope whose other segments are longer."""
    comps = [torch.tensor([2.0, INF, 3.0, 0.5]), torch.tensor([INF]), torch.tensor([NAN]), torch.tensor([1.5]),
             torch.zeros(0), torch.tensor([2.0, NAN, 3.0, 0.5]), torch.tensor([0.0, 2.0, 0.0])]
    with form(which):
        x = mj.nested_tensor(comps, requires_grad=True)
        g, = torch.autograd.grad(x.cumprod(1).values().sum(), x)
    for i, c in enumerate(comps):
        c = c.clone().requires_grad_()
        want, = torch.autograd.grad(c.cumprod(0).sum(), c)
        assert bit_equal(g.unbind()[i], want), f"sample {i}: {g.unbind()[i]} vs {want}"


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp", "cummax"])
@pytest.mark.parametrize("layout,d", [("seq", 1), ("pair", 1), ("pair", 2), ("scores", 3), ("seq", 2)])
def test_scan_second_order(layout, d, name, which):
    rd = LAYOUTS[layout][0]
    comps = _comps(layout, torch.float64, seed=5, lengths=(4, 0, 5, 1))
    comps[0].view(-1)[2] = 0.0  # a zero: cumprod's second-order formula
    f = _cum(name)
    with form(which):
        _second_order(lambda x: _outs(f(x, d))[0], lambda c: _outs(f(c, d - 1))[0], comps, rd)


@pytest.mark.parametrize("which", ["sample", "padded"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp", "cummax"])
def test_no_leakage(op, which):
    """Changing one sample leaves every other sample's result and gradient bit-identical."""
    for layout, d in [("seq", 1), ("pair", 1), ("scores", 3)]:
        rd = LAYOUTS[layout][0]
        comps = _comps(layout, torch.float32)
        f = SOFTMAX.get(op) or _cum(op)
        with form(which):
            res = []
            for k in (1.0, 3.0):
                cs = [c.clone() for c in comps]
                cs[2] = cs[2] * k - 1
                x = mj.nested_tensor(cs, ragged_dims=rd, requires_grad=True)
                out = _outs(f(x, d))[0]
                res.append((out.detach(), torch.autograd.grad((out * out).sum(), x)[0]))
        for i in (0, 3, 4):
            assert bit_equal(res[0][0].unbind()[i], res[1][0].unbind()[i]), f"{layout}: sample {i}'s value"
            assert bit_equal(res[0][1].unbind()[i], res[1][1].unbind()[i]), f"{layout}: sample {i}'s gradient"


@pytest.mark.parametrize("which", ["sample", "padded"])
def test_empty_batch_and_empty_samples(which):
    """B = 0 and a batch whose samples are all empty: dense's dtypes and static shapes."""
    with form(which):
        for lengths in ((), (0, 0)):
            comps = [torch.zeros(n, 3, dtype=torch.int32) for n in lengths]
            x = mj.nested_tensor(comps) if comps else mj.nested_tensor([torch.zeros(0, 3, dtype=torch.int32)])[:0]
            out = x.cumsum(1)
            assert out.dtype == torch.int64 and out.values().shape == (0, 3)
            v, i = x.float().cummax(1)
            assert v.dtype == torch.float32 and i.dtype == torch.int64 and v.values().shape == (0, 3)
            assert x.float().softmax(1).values().shape == (0, 3)


def test_bfloat16_cumsum_rounds_as_dense():
    """A long bfloat16 scan accumulates in float32 as dense torch does (a log-step scan in the
    input's dtype drifted to 3.6 times dense's error at n = 4096)."""
    s = torch.rand(4096, 2, generator=torch.Generator().manual_seed(0))
    x = mj.nested_tensor([s.bfloat16(), s[:5].bfloat16()])
    for d in (1, 2):
        for o, c in zip(x.cumsum(d).unbind(), (s.bfloat16(), s[:5].bfloat16())):
            assert bit_equal(o, c.cumsum(d - 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_logsumexp_low_precision_rounds_as_dense(dtype):
    """``x - max`` and ``exp`` in the input's dtype, the sum in float32 rounded once, ``log`` and
    ``+ max`` in the input's dtype: dense torch's steps, so its result bit for bit."""
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        comps = [(torch.randn(n, 8, generator=g) * 3).to(dtype) for n in (5, 17, 64, 300, 1, 0)]
        x = mj.nested_tensor(comps)
        out = x.logsumexp(1)
        for i, c in enumerate(comps):
            assert bit_equal(out[i], c.logsumexp(0)), f"sample {i}"


# ----------------------------------------------------------------------------- the rule
def test_rule_picks_padded_for_many_short_samples_and_samples_otherwise():
    """Few elements per sample: the padded form; many, or one sample: sample by sample. A softmax
    along the last dim or one followed by another ragged dim stays per sample whatever the sizes
    (its kernels' rounding there depends on the lengths, ``same_lines``); the scans compute every
    line alike and take either form."""
    spy = []
    real = {k: getattr(da, k) for k in ("padded", "by_sample")}

    def counting(k):
        def f(*a, **kw):
            spy.append(k)
            return real[k](*a, **kw)
        return f

    short = mj.nested_tensor([torch.randn(n, 4) for n in range(1, 40)])
    long = mj.nested_tensor([torch.randn(n, 64) for n in (300, 500)])
    one = mj.nested_tensor([torch.randn(3, 4)])
    scores = mj.nested_tensor([torch.randn(2, n, n) for n in range(1, 20)], ragged_dims=(2, 3))
    softmax, cumsum = (lambda t, d: t.softmax(d)), (lambda t, d: t.cumsum(d))
    # (cummax / cummin run the dense op per segment of ops/reductions/segment_ops.py, its own rule)
    table = [(short, 1, softmax, "padded"), (short, 1, cumsum, "padded"),
             (long, 1, softmax, "by_sample"), (long, 1, cumsum, "by_sample"),
             (one, 1, softmax, "by_sample"), (one, 1, cumsum, "by_sample"),
             (scores, 3, softmax, "by_sample"), (scores, 2, softmax, "by_sample"),
             (scores, 3, cumsum, "padded")]
    try:
        for k in real:
            setattr(da, k, counting(k))
        for x, d, fn, want in table:
            spy.clear()
            with torch.no_grad():
                fn(x, d)
            assert spy == [want], (tuple(x.shape), d, spy)
    finally:
        for k, f in real.items():
            setattr(da, k, f)


# ----------------------------------------------------------------------------- traced
@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_softmax_and_scans_keep_one_graph(_fresh_dynamo):
    """Under ``torch.compile`` the segment formulations run (no host sizes): values and gradients
    as eager, new lengths at a fixed B reuse the graph; ``logcumsumexp``'s gradient beside
    infinities is dense's formula there too."""
    counter = CompileCounterWithBackend("aot_eager")

    def fn(x):
        return x.softmax(1) + x.log_softmax(1) + x.cumsum(1) + x.cumprod(1) + x.logcumsumexp(1)

    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for lengths in [(3, 0, 5), (1, 4, 2), (6, 6, 2)]:
        comps = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]
        if lengths[0] == 6:
            comps[0][2, 1] = INF
        x = mj.nested_tensor(comps, requires_grad=True)
        y = mj.nested_tensor(comps, requires_grad=True)
        a, b = compiled(x), fn(y)
        assert_close(a.values(), b.values(), "compiled values")
        ga, = torch.autograd.grad(a.values().sum(), x)
        gb, = torch.autograd.grad(b.values().sum(), y)
        assert_close(ga.values(), gb.values(), "compiled gradient")
    assert counter.frame_count == 1
