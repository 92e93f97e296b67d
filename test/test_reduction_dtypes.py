"""Result dtypes of reductions (ops/reductions/reduce.py, ops/reductions/routes.py): every reduction over static,
ragged, mixed and all ragged dims, for every dtype, equals the dense op per sample — values
*and dtype* (integer and bool sums and products accumulate in int64; ``any``/``all`` give bool,
uint8 for uint8; ``logsumexp`` of integers gives the default float dtype; bool ``amax`` works).
Also the norm of an empty extent (NOTE [ Norm of an empty extent ] in ops/reductions/routes.py),
and complex and float16 / bfloat16 inputs of the norms and moments and of the ops built on them
(``F.normalize``, ``F.cosine_similarity``): real norms of complex inputs, float32 accumulation of
low-precision ones (NOTE [ Norms and moments in float32 ]), gradients included.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj

from _reference import CUBE, LAYOUTS, SEQ, build, components, few, seeds, structures

ALL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
       torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NOT_BOOL = tuple(d for d in ALL if d != torch.bool)

# dims (negative: the same dims of the batch and of a component) per layout: static only,
# one ragged dim, ragged + static, every ragged dim (a dense result)
DIMS = {
    "seq": [(-1,), (-2,), (-2, -1)],
    "square": [(-1,), (-3,), (-2,), (-2, -1), (-3, -2)],
    "rect": [(-1,), (-3,), (-3, -1), (-3, -2), (-3, -2, -1)],
    "static_lead": [(-3,), (-1,), (-2,), (-3, -2)],
    "cube": [(-1,), (-3,), (-4, -2), (-4, -3, -2)],
}
RAGGED = {"seq": {-2}, "square": {-3, -2}, "rect": {-3, -2}, "static_lead": {-2}, "cube": {-4, -3, -2}}
LAYOUT = {str(lay): lay for lay in (*LAYOUTS, CUBE)}

# name -> (fn(t, dims, keepdim), empty-extent rule, dtypes, takes several dims)
REDUCTIONS = {
    "sum": (lambda t, d, k: t.sum(d, keepdim=k), None, ALL, True),
    "torch.sum": (lambda t, d, k: torch.sum(t, d, keepdim=k), None, ALL, True),
    "sum_dtype_int32": (lambda t, d, k: t.sum(d, keepdim=k, dtype=torch.int32), None, ALL, True),
    "sum_dtype_float64": (lambda t, d, k: t.sum(d, keepdim=k, dtype=torch.float64), None, ALL, True),
    "prod": (lambda t, d, k: t.prod(d[0], keepdim=k), None, ALL, False),
    "prod_dtype_int16": (lambda t, d, k: torch.prod(t, d[0], keepdim=k, dtype=torch.int16), None, ALL, False),
    "mean": (lambda t, d, k: t.mean(d, keepdim=k), None, FLOATS, True),
    "mean_dtype_float64": (lambda t, d, k: t.mean(d, keepdim=k, dtype=torch.float64), None, ALL, True),
    "amax": (lambda t, d, k: t.amax(d, keepdim=k), "lowest", ALL, True),
    "amin": (lambda t, d, k: torch.amin(t, d, keepdim=k), "highest", ALL, True),
    "max.values": (lambda t, d, k: t.max(d[0], keepdim=k).values, "lowest", ALL, False),
    "max.indices": (lambda t, d, k: t.max(d[0], keepdim=k).indices, "zero", ALL, False),
    "min.values": (lambda t, d, k: torch.min(t, d[0], keepdim=k).values, "highest", ALL, False),
    "min.indices": (lambda t, d, k: t.min(d[0], keepdim=k).indices, "zero", ALL, False),
    "argmax": (lambda t, d, k: t.argmax(d[0], keepdim=k), "zero", NOT_BOOL, False),
    "argmin": (lambda t, d, k: torch.argmin(t, d[0], keepdim=k), "zero", NOT_BOOL, False),
    "any": (lambda t, d, k: t.any(d, keepdim=k), None, ALL, True),
    "all": (lambda t, d, k: torch.all(t, d, keepdim=k), None, ALL, True),
    "logsumexp": (lambda t, d, k: torch.logsumexp(t, d, keepdim=k), None, ALL, True),
    "var": (lambda t, d, k: t.var(d, keepdim=k), None, FLOATS, True),
    "std_c0": (lambda t, d, k: torch.std(t, d, correction=0, keepdim=k), None, FLOATS, True),
    "vector_norm": (lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k), None, FLOATS, True),
    "vector_norm_inf": (lambda t, d, k: torch.linalg.vector_norm(t, math.inf, d, keepdim=k), "zero", FLOATS, True),
    "norm_1": (lambda t, d, k: t.norm(1, d, keepdim=k), None, FLOATS, True),
}


def _lowest(dt):
    return False if dt == torch.bool else (torch.finfo(dt) if dt.is_floating_point else torch.iinfo(dt)).min


def _highest(dt):
    return True if dt == torch.bool else (torch.finfo(dt) if dt.is_floating_point else torch.iinfo(dt)).max


_FILL = {"lowest": _lowest, "highest": _highest, "zero": lambda dt: 0, "inf": lambda dt: math.inf}


def empty_rule(fn, rule, dims):
    """Dense ``fn`` on a component, except over an empty extent where dense torch refuses (no
    identity): the README's rule (dtype's lowest / highest value, index 0, inf-norm 0)."""

    def ref(c):
        canon = {d % c.dim() for d in dims}
        if rule is None or not any(c.shape[d] == 0 for d in canon):
            return fn(c)
        like = fn(torch.zeros([1 if d in canon and n == 0 else n for d, n in enumerate(c.shape)], dtype=c.dtype))
        return torch.full(like.shape, _FILL[rule](like.dtype), dtype=like.dtype)

    return ref


def _tol(dtype):
    return {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}.get(dtype, 1e-9)


def check_per_sample(fn, ref, s, seed, dense: bool):
    """``fn(x)`` against ``ref`` per component: values and dtype; for B = 0, rank and dtype as
    the dense op gives on a component of extents 1."""
    comps = components(s.shapes, seed, dtype=s.dtype)
    x, _ = build(comps, s.ragged_dims)
    out = fn(x)
    assert isinstance(out, mj.MultiJaggedTensor) != dense, f"expected a {'dense' if dense else 'multi_jagged'} result"
    if s.batch == 0:
        like = ref(torch.ones(s.layout.shape(1, 1, s.s, s.c, 1), dtype=s.dtype))
        assert out.dtype == like.dtype, f"B = 0: dtype {out.dtype} != {like.dtype}"
        assert out.shape[0] == 0 and out.dim() == like.dim() + 1
        if dense:
            assert tuple(out.shape[1:]) == tuple(like.shape)
        return
    got = list(out.unbind()) if not dense else list(out.unbind(0))
    assert len(got) == s.batch
    for i, (o, c) in enumerate(zip(got, comps)):
        e = ref(c)
        assert o.dtype == e.dtype, f"sample {i}: dtype {o.dtype} != {e.dtype}"
        tol = _tol(e.dtype)
        torch.testing.assert_close(o, e, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"sample {i}: {m}")


def _cases():
    for name, (_, _, _, multi) in REDUCTIONS.items():
        for layout, dims_list in DIMS.items():
            for dims in dims_list:
                if multi or len(dims) == 1:
                    yield pytest.param(name, layout, dims, id=f"{name}-{layout}-{dims}")


@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
@pytest.mark.parametrize("name,layout,dims", list(_cases()))
def test_reduction_dtype_per_sample(name, layout, dims, keepdim):
    """Values and result dtype equal the dense op per sample for every dtype the dense op takes
    (bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)."""
    fn, rule, dtypes, _ = REDUCTIONS[name]
    lay = LAYOUT[layout]
    dense = RAGGED[layout] <= set(dims)

    @few(6)
    @given(structures(lay, max_batch=3, max_len=3, dtypes=dtypes), seeds)
    def check(s, seed):
        ref = empty_rule(lambda t: fn(t, dims, keepdim), rule, dims)
        check_per_sample(lambda t: fn(t, dims, keepdim), ref, s, seed, dense)

    check()


# ----------------------------------------------------------------------------- golden
def test_bool_sum_counts_golden():
    mask = mj.nested_tensor([torch.tensor([[True], [True], [True]]), torch.tensor([[False]]), torch.zeros(0, 1, dtype=torch.bool)])
    c = mask.sum(dim=1)
    assert c.dtype == torch.int64
    assert c.tolist() == [[3], [0], [0]]  # = [1+1+1], [0], [empty]
    assert mask.sum().dtype == torch.int64 and mask.sum().item() == 3
    assert mask.sum(-1).dtype == torch.int64  # over a static dim too
    assert [t.tolist() for t in mask.sum(-1).unbind()] == [[1, 1, 1], [0], []]


def test_int32_sum_does_not_wrap_golden():
    big = 2**30
    x = mj.nested_tensor([torch.full((3, 1), big, dtype=torch.int32), torch.ones(0, 1, dtype=torch.int32)])
    s = x.sum(1)
    assert s.dtype == torch.int64 and s.tolist() == [[3 * big], [0]]  # = 3·2³⁰ (int32 would wrap to -2³⁰)
    assert x.sum(1, dtype=torch.int32).tolist() == [[-(2**30)], [0]]  # dtype=int32 wraps as dense torch
    assert torch.full((3, 1), big, dtype=torch.int32).sum(0, dtype=torch.int32).tolist() == [-(2**30)]
    p = mj.nested_tensor([torch.tensor([[2], [3]], dtype=torch.int8), torch.ones(0, 1, dtype=torch.int8)]).prod(1)
    assert p.dtype == torch.int64 and p.tolist() == [[6], [1]]  # = 2·3, empty → 1


def test_bool_prod_and_extremes_golden():
    b = mj.nested_tensor([torch.tensor([True, False, True]), torch.tensor([True]), torch.zeros(0, dtype=torch.bool)])
    assert b.prod(1).dtype == torch.int64 and b.prod(1).tolist() == [0, 1, 1]  # = 1·0·1, 1, empty → 1
    assert b.amax(1).tolist() == [True, True, False]  # = any, any, empty → False (lowest bool)
    assert b.amin(1).tolist() == [False, True, True]  # = all, all, empty → True (highest bool)
    v, i = b.max(1)
    assert v.dtype == torch.bool and v.tolist() == [True, True, False] and i.tolist() == [0, 0, 0]
    v, i = b.min(dim=1)
    assert v.tolist() == [False, True, True] and i.tolist() == [1, 0, 0]
    with pytest.raises(RuntimeError, match="bool"):
        b.argmax(1)  # as dense torch
    with pytest.raises(RuntimeError, match="bool"):
        torch.tensor([True]).argmax(0)


def test_any_all_dtypes_golden():
    u = mj.nested_tensor([torch.tensor([0, 3], dtype=torch.uint8), torch.zeros(0, dtype=torch.uint8)])
    assert u.any(1).dtype == torch.uint8 and u.any(1).tolist() == [1, 0]  # uint8 stays uint8, as dense
    f = mj.nested_tensor([torch.tensor([0.0, 2.5]), torch.zeros(0)])
    assert f.all(1).dtype == torch.bool and f.all(1).tolist() == [False, True]  # = 0≠0 and …, empty → True


@pytest.mark.parametrize("dims", [-1, 1, (1, 2)], ids=["static", "ragged", "both"])
@pytest.mark.parametrize("src", [torch.bool, torch.uint8, torch.int32])
def test_mean_with_dtype_of_bool_and_integers_golden(src, dims):
    """``mean(dtype=float64)`` of bool/integer input divides by the count in float64: the count
    was once made in the input's dtype, so a bool count of 3 became True = 1 (mean 1.0 for 1/3)."""
    rows = [torch.tensor([[1, 0, 0], [0, 1, 0]]), torch.tensor([[1, 0, 0]]), torch.zeros(0, 3, dtype=torch.int64)]
    comps = [r.to(src) for r in rows]
    x = mj.nested_tensor(comps)
    out = x.mean(dims, dtype=torch.float64)
    sample_dims = tuple(d - 1 if d > 0 else d for d in ((dims,) if isinstance(dims, int) else dims))
    got = out.unbind() if isinstance(out, mj.MultiJaggedTensor) else out.unbind(0)
    for o, c in zip(got, comps):
        torch.testing.assert_close(o, c.mean(sample_dims, dtype=torch.float64), equal_nan=True)
    torch.testing.assert_close(x.mean(-1, dtype=torch.float64).unbind()[0], torch.tensor([1 / 3, 1 / 3], dtype=torch.float64))


def test_logsumexp_of_integers_golden():
    x = mj.nested_tensor([torch.tensor([0, 0], dtype=torch.int32), torch.zeros(0, dtype=torch.int32)])
    out = torch.logsumexp(x, 1)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out, torch.tensor([math.log(2.0), -math.inf]))  # = log(e⁰+e⁰), log 0


@pytest.mark.parametrize("op", ["mean(1)", "mean(-1)", "var(1)", "std(-1)", "vector_norm(1)", "norm(-1)"])
def test_float_only_reductions_raise_for_integers_like_dense(op):
    fn = {
        "mean(1)": lambda t: t.mean(1 if isinstance(t, mj.MultiJaggedTensor) else 0),
        "mean(-1)": lambda t: t.mean(-1),
        "var(1)": lambda t: t.var(1 if isinstance(t, mj.MultiJaggedTensor) else 0),
        "std(-1)": lambda t: t.std(-1),
        "vector_norm(1)": lambda t: torch.linalg.vector_norm(t, dim=1 if isinstance(t, mj.MultiJaggedTensor) else 0),
        "norm(-1)": lambda t: t.norm(dim=-1),
    }[op]
    comps = [torch.ones(3, 2, dtype=torch.int64), torch.ones(0, 2, dtype=torch.int64)]
    with pytest.raises(RuntimeError) as dense:
        fn(comps[0])
    with pytest.raises(RuntimeError) as ours:
        fn(mj.nested_tensor(comps))
    assert type(ours.value) is type(dense.value)


# ----------------------------------------------------------------------------- norms of empty extents
def test_inf_norm_of_empty_extent_is_zero_golden():
    x = mj.nested_tensor([torch.tensor([[3.0, -4.0], [-5.0, 1.0]]), torch.zeros(0, 2)], ragged_dims=(1,))
    for out in (torch.linalg.vector_norm(x, math.inf, 1), x.norm(math.inf, 1), torch.norm(x, p=math.inf, dim=1)):
        assert out.tolist() == [[5.0, 4.0], [0.0, 0.0]]  # = [max(|3|,|-5|), max(|-4|,|1|)], empty → 0
    assert torch.linalg.vector_norm(x, math.inf, (1, 2)).tolist() == [5.0, 0.0]


def test_negative_norms_of_empty_extent_are_inf_golden():
    x = mj.nested_tensor([torch.tensor([[3.0, -4.0], [-5.0, 2.0]]), torch.zeros(0, 2)], ragged_dims=(1,))
    assert torch.linalg.vector_norm(x, -math.inf, 1).tolist() == [[3.0, 2.0], [math.inf, math.inf]]  # = min |x|; empty → inf
    m1 = torch.linalg.vector_norm(x, -1, 1)
    torch.testing.assert_close(m1[0], torch.tensor([1 / (1 / 3 + 1 / 5), 1 / (1 / 4 + 1 / 2)]))  # = (Σ|x|⁻¹)⁻¹
    assert m1[1].tolist() == [math.inf, math.inf]  # = (Σ∅)^(1/p) = 0⁻¹


def test_inf_norm_over_empty_extent_never_negative():
    @few(10)
    @given(structures(SEQ, dtypes=FLOATS), seeds, st.sampled_from([math.inf, 2, 1, 0.5]))
    def check(s, seed, ord):
        x, _ = build(components(s.shapes, seed, dtype=s.dtype), s.ragged_dims)
        out = torch.linalg.vector_norm(x, ord, 1)
        assert bool((out >= 0).all())
        for o, n in zip(out.unbind(0), [e[0] for e in s.sizes]):
            if n == 0:
                assert bool((o == 0).all())

    check()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.float64])
def test_sum_dtype_into_one_output_row_keeps_the_asked_dtype(dtype):
    """A reduction whose output has one packed row (a pair with lengths (1, 0) reduced over a
    pair dim) sums the rows with a plain ``sum``, which alone would promote integers to int64."""
    comps = [torch.randn(n, n, 3, generator=torch.Generator().manual_seed(n)) * 3 for n in (1, 0)]
    x = mj.nested_tensor(comps)
    for d in (1, 2):
        out = x.sum(d, dtype=dtype)
        assert out.dtype == dtype
        for o, c in zip(out.unbind(), comps):
            torch.testing.assert_close(o, c.sum(d - 1, dtype=dtype))
        assert x.to(dtype).sum(d).dtype == (torch.int64 if not dtype.is_floating_point else dtype)


# ----------------------------------------------------------------------------- complex and low-precision inputs
def _check_with_grads(fn, ref, comps, ragged_dims, seed, dense: bool, tol: float, grad_ref=None):
    """``fn`` on a batch of ``comps`` against ``ref`` per component: values and dtype, and the
    gradient of every component (complex ones too, which ``build`` leaves without: the real loss
    ``Σ re(out · cotangent)`` pulled back through both sides). ``grad_ref``: the reference the
    gradients are taken from (default ``ref``), cast to the components' dtype."""
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    out = fn(mj.as_nested_tensor(leaves, ragged_dims=ragged_dims))
    assert isinstance(out, mj.MultiJaggedTensor) != dense, f"expected a {'dense' if dense else 'multi_jagged'} result"
    got = list(out.unbind(0)) if dense else list(out.unbind())
    for i, (o, c) in enumerate(zip(got, comps)):
        e = ref(c)
        assert o.dtype == e.dtype, f"sample {i}: dtype {o.dtype} != {e.dtype}"
        torch.testing.assert_close(o, e, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"sample {i}: {m}")
    gref = grad_ref or ref
    refs = [c.detach().clone().requires_grad_() for c in comps]
    want = [gref(c) for c in refs]
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for w in want]
    def pulled(outs, cotangents, inputs):  # None where nothing reaches (the empty extents' norms of a reference)
        loss = sum(torch.real(o * c.to(o.dtype)).sum() for o, c in zip(outs, cotangents))
        return torch.autograd.grad(loss, inputs, allow_unused=True) if loss.requires_grad else [None] * len(inputs)

    g_mj, g_ref = pulled(got, cots, leaves), pulled(want, cots, refs)
    for i, (gm, gr, c) in enumerate(zip(g_mj, g_ref, comps)):
        gm = torch.zeros_like(c) if gm is None else gm
        gr = torch.zeros_like(c) if gr is None else gr.to(c.dtype)
        torch.testing.assert_close(gm, gr, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"grad of sample {i}: {m}")


def _with_zeros(c: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``c`` with about a fifth of its entries exactly 0 (norm derivatives at 0, ``ord=0``)."""
    return torch.where(torch.rand(c.shape, generator=gen) < 0.2, torch.zeros((), dtype=c.dtype), c)


# name -> (fn(t, dims, keepdim), dense reference, empty-extent rule, takes several dims ("pair": two)).
# Dense torch refuses the ±inf and negative norms of an empty extent: NOTE [ Norm of an empty
# extent ] gives 0 for inf and inf for -inf and ord < 0.
COMPLEX_NORMS = {
    **{f"vector_norm_{o}": ((lambda o: lambda t, d, k: torch.linalg.vector_norm(t, o, d, keepdim=k))(o), None,
                            "inf" if o < 0 else "zero" if o == math.inf else None, True)
       for o in (0, 1, 2, math.inf, -math.inf, 0.5, 3, -1, -0.5)},
    "linalg.norm": (lambda t, d, k: torch.linalg.norm(t, None, d[0], keepdim=k), None, None, False),
    "linalg.norm_pair": (lambda t, d, k: torch.linalg.norm(t, dim=d, keepdim=k), None, None, "pair"),
    "linalg.norm_fro": (lambda t, d, k: torch.linalg.norm(t, "fro", d, keepdim=k), None, None, "pair"),
    "Tensor.norm": (lambda t, d, k: t.norm(dim=d, keepdim=k), lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k), None, True),
    "torch.norm_p2": (lambda t, d, k: torch.norm(t, p=2, dim=d, keepdim=k), lambda t, d, k: torch.linalg.vector_norm(t, 2, d, keepdim=k), None, True),
    "var": (lambda t, d, k: t.var(d, keepdim=k), None, None, True),
    "std_c0": (lambda t, d, k: torch.std(t, d, correction=0, keepdim=k), None, None, True),
}


def _dims_for(layout: str, multi) -> list:
    return [d for d in DIMS[layout] if (len(d) == 2 if multi == "pair" else multi or len(d) == 1)]


@pytest.mark.parametrize("layout", list(DIMS), ids=str)
@pytest.mark.parametrize("name", list(COMPLEX_NORMS))
def test_complex_norms_and_moments_are_real_per_sample(name, layout):
    """Norms of complex inputs are real, of the magnitudes ``|x|`` (``x * x`` squares the phase
    too), and so are ``var`` / ``std`` (``Σ |x - mean|²``), for every ord, over static, ragged and
    several dims; values, real dtype and complex gradients equal dense per sample."""
    fn, ref_fn, rule, multi = COMPLEX_NORMS[name]
    ref_fn = ref_fn or fn
    cells = _dims_for(layout, multi)
    if not cells:
        pytest.skip(f"no dims of {layout} for {name}")
    dense_of = RAGGED[layout]

    @few(4)
    @given(structures(LAYOUT[layout], max_batch=3, max_len=3, dtypes=(torch.float64, torch.float32)), seeds,
           st.sampled_from(cells), st.booleans())
    def check(s, seed, dims, keepdim):
        gen = torch.Generator().manual_seed(seed)
        comps = [_with_zeros(torch.complex(c, torch.rand(c.shape, generator=gen, dtype=c.dtype) * 4 - 2), gen)
                 for c in s.components(seed)]
        ref = empty_rule(lambda c: ref_fn(c, dims, keepdim), rule, dims)
        _check_with_grads(lambda t: fn(t, dims, keepdim), ref, comps, s.ragged_dims, seed, dense_of <= set(dims), _tol(s.dtype))

    check()


def test_complex_norm_golden():
    comps = [torch.tensor([[3 + 4j, 1j]]), torch.tensor([[1 + 0j, 2j], [0j, 1 + 1j]])]
    x = mj.nested_tensor(comps)
    out = torch.linalg.vector_norm(x, dim=-1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.unbind()[0], torch.tensor([math.sqrt(26)]))  # = √(|3+4i|² + |i|²)
    torch.testing.assert_close(torch.linalg.vector_norm(x, dim=1), torch.tensor([[5.0, 1.0], [1.0, math.sqrt(6)]]))
    # = Σ|x - mean|² / n per column: sample 1's (1, 0) about 0.5 and (2i, 1 + i) about 0.5 + 1.5i
    torch.testing.assert_close(x.var(1, correction=0), torch.tensor([[0.0, 0.0], [0.25, 0.5]]))
    with pytest.raises(RuntimeError, match="dtype should be complex"):
        torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)  # as dense torch (it would drop the imaginary part)
    assert torch.linalg.vector_norm(x, dim=-1, dtype=torch.complex128).dtype == torch.float64


# name -> (fn(t, dims, keepdim), takes several dims, reduces)
LOW_PRECISION = {
    **{f"vector_norm_{o}": ((lambda o: lambda t, d, k: torch.linalg.vector_norm(t, o, d, keepdim=k))(o), True, True)
       for o in (2, 3, 0.5, 1)},
    "Tensor.norm": (lambda t, d, k: t.norm(2, d, keepdim=k), True, True),  # p="fro" over 3 dims: a matrix norm
    "var": (lambda t, d, k: t.var(d, keepdim=k), True, True),
    "std": (lambda t, d, k: torch.std(t, d, keepdim=k), True, True),
    "var_c0": (lambda t, d, k: torch.var(t, d, correction=0, keepdim=k), True, True),
    "var_mean.var": (lambda t, d, k: torch.var_mean(t, d, keepdim=k)[0], True, True),
    "var_mean.mean": (lambda t, d, k: torch.var_mean(t, d, keepdim=k)[1], True, True),
    "std_mean.std": (lambda t, d, k: torch.std_mean(t, d, correction=0, keepdim=k)[0], True, True),
    "normalize": (lambda t, d, k: F.normalize(t, dim=d), True, False),
    "normalize_p3": (lambda t, d, k: F.normalize(t, 3.0, d[0]), False, False),
    "cosine_similarity": (lambda t, d, k: F.cosine_similarity(t, t.abs() + 1, d[0]), False, True),
}

# (low, high) of the values: float16 squares overflow (a sum of two squares of 200s is past
# 65504); bfloat16 values near 200 are one apart, so a mean rounded to bfloat16 ruins the spread
_RANGE = {torch.float16: (150.0, 300.0), torch.bfloat16: (198.0, 203.0)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["seq", "square", "cube"], ids=str)
@pytest.mark.parametrize("name", list(LOW_PRECISION))
def test_low_precision_norms_and_moments_accumulate_in_float32(name, layout, dtype):
    """float16 / bfloat16 norms, moments, ``F.normalize`` and ``F.cosine_similarity`` compute in
    float32 and round once, as dense torch (its opmath type): values and dtype equal dense per
    sample within half-precision tolerance where every intermediate rounded to the input's dtype
    overflows (float16) or loses the spread (bfloat16). Gradients are compared with dense torch
    on float32 copies: dense's own half backward rounds ``x - mean`` to the half dtype."""
    fn, multi, reduces = LOW_PRECISION[name]
    cells = [d for d in DIMS[layout] if multi or len(d) == 1]

    @few(4)
    @given(structures(LAYOUT[layout], max_batch=3, max_len=3, dtypes=(dtype,)), seeds,
           st.sampled_from(cells), st.booleans())
    def check(s, seed, dims, keepdim):
        low, high = _RANGE[s.dtype]
        comps = [c * torch.where(torch.rand(c.shape, generator=torch.Generator().manual_seed(seed)) < 0.3, -1.0, 1.0).to(s.dtype)
                 if s.dtype == torch.float16 else c for c in s.components(seed, low=low, high=high, ties=True)]
        _check_with_grads(lambda t: fn(t, dims, keepdim), lambda c: fn(c, dims, keepdim), comps, s.ragged_dims, seed,
                          reduces and RAGGED[layout] <= set(dims), _tol(s.dtype),
                          grad_ref=lambda c: fn(c.float(), dims, keepdim))

    check()


def test_low_precision_golden():
    x = mj.nested_tensor([torch.full((2, 3), 200.0, dtype=torch.float16)])
    assert x.norm(dim=-1).dtype == torch.float16
    assert x.norm(dim=-1).unbind()[0].tolist() == [346.5, 346.5]  # = 200·√3 in float16 (Σx² = 120000 > 65504)
    torch.testing.assert_close(F.normalize(x, dim=-1).unbind()[0], torch.full((2, 3), 0.5771, dtype=torch.float16))
    torch.testing.assert_close(F.cosine_similarity(x, x, 1), torch.full((1, 3), 1.0, dtype=torch.float16), rtol=2e-3, atol=2e-3)
    b = mj.nested_tensor([torch.tensor([[200.0, 201.0]], dtype=torch.bfloat16)])
    assert b.var(-1).unbind()[0].tolist() == [0.5]  # = ((−0.5)² + 0.5²) / 1 (a bfloat16 mean 200.5 rounds to 200)


@pytest.mark.parametrize("dim", [1, 2, (1, 2)])
@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16, torch.float64])
def test_nanmean_result_has_the_dtype_asked(dim, dtype):
    # the count divided in the input's dtype made float16 / bfloat16 results float32
    samples = [torch.tensor([[1.0, float("nan")], [2.0, 3.0]]), torch.zeros(0, 2), torch.tensor([[4.0, 5.0]])]
    x = torch.nested.nested_tensor(samples, layout=mj.multi_jagged)
    d = tuple(k - 1 for k in dim) if isinstance(dim, tuple) else dim - 1
    out = torch.nanmean(x, dim, dtype=dtype)
    got = out.unbind() if mj.is_nested(out) else list(out)
    for a, s in zip(got, samples):
        torch.testing.assert_close(a, torch.nanmean(s, d, dtype=dtype), equal_nan=True)
    with pytest.raises(RuntimeError, match="Optional dtype must be either a floating point"):
        torch.nanmean(x, dim, dtype=torch.int64)


@pytest.mark.parametrize("data, autocast", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
def test_reductions_along_a_ragged_dim_under_another_autocast_dtype(data, autocast):
    # each sample's dense reduction runs; joining them under autocast's "promote" policy raised
    samples = [torch.randn(n, 3).to(data) for n in (4, 1, 0, 2)]
    x = torch.nested.nested_tensor(samples, layout=mj.multi_jagged)
    with torch.autocast("cpu", dtype=autocast):
        for f in (lambda t, d: torch.amax(t, d), lambda t, d: t.max(d).values):
            got = f(x, 1)
            for a, s in zip(got, samples):
                if len(s):
                    assert a.dtype == data and torch.equal(a, f(s, 0))
        got = torch.logsumexp(x, 1)
        assert got.dtype == data
        torch.testing.assert_close(got[0], torch.logsumexp(samples[0], 0))


def test_matmul_out_is_refused_clearly():
    x = torch.nested.nested_tensor([torch.randn(n, 3) for n in (3, 0, 2)], layout=mj.multi_jagged)
    with pytest.raises(NotImplementedError, match=r"matmul\(\): out= variants are not supported"):
        torch.matmul(x, torch.randn(3, 3), out=torch.nested.nested_tensor([torch.randn(n, 3) for n in (3, 0, 2)],
                                                                          layout=mj.multi_jagged))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_prod_over_a_static_dim_is_dense_own(dtype):
    # dense's CPU prod of half values rounds as it goes; accumulating in float32 differed by ulps
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(n, 8, generator=g) * 3).to(dtype) for n in (7, 0, 300)]
    x = torch.nested.nested_tensor(samples, layout=mj.multi_jagged)
    for a, s in zip(x.prod(-1).unbind(), samples):
        assert torch.equal(a, s.prod(-1))
