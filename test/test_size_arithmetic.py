"""Arithmetic with a ragged size (``x / x.shape[1]``: each sample by its own size), and operands
given by keyword (``torch.add(x, other=y)``), against each sample's dense call."""

import operator

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

from _reference import R, per_sample_check
from _structures import comps_for

F64 = torch.float64

SEQ_SHAPES = [(3, 4), (0, 4), (5, 4), (1, 4)]
PAIR_SHAPES = [(3, 3, 2), (0, 0, 2), (2, 2, 2)]

# (name, op on (tensor, size), op on (size, tensor) where Python reverses it)
OPS = {
    "truediv": (lambda x, n: x / n),
    "mul": (lambda x, n: x * n),
    "rmul": (lambda x, n: n * x),
    "add": (lambda x, n: x + n),
    "rsub": (lambda x, n: n - x),
    "sub": (lambda x, n: x - n),
    "pow": (lambda x, n: x ** n),
    "rtruediv": (lambda x, n: n / (x.abs() + 1)),
    "floordiv": (lambda x, n: x // n),
    "mod": (lambda x, n: x % n),
    "torch.div": (lambda x, n: torch.div(x, n)),
    "div kw": (lambda x, n: x.div(other=n)),
    "multiple": (lambda x, n: x / (2 * n)),
}


@pytest.mark.parametrize("name", list(OPS))
def test_a_ragged_size_is_each_samples_own(name):
    op = OPS[name]
    grad = name not in ("floordiv", "mod")
    comps = comps_for(SEQ_SHAPES, 3, low=0.5, high=1.5)
    per_sample_check(lambda x: op(x, x.shape[1]), R(comps, (1,)), ref=lambda c: op(c, c.shape[0]), grad=grad)
    pairs = comps_for(PAIR_SHAPES, 4, low=0.5, high=1.5)
    per_sample_check(lambda p: op(p, p.shape[2]), R(pairs, (1, 2)), ref=lambda c: op(c, c.shape[1]), grad=grad)


def test_a_mean_written_as_a_sum_over_a_ragged_depth():
    """alphafold3-pytorch's OuterProductMean: ``einsum('b s i d, b s j e -> b i j d e') / msa.shape[1]``
    with a ragged MSA depth ``s``: each sample divided by its own depth."""
    msas = comps_for([(2, 3, 2), (4, 2, 2), (1, 0, 2), (3, 1, 2)], 5)
    per_sample_check(
        lambda m: torch.einsum("bsid,bsje->bijde", m, m) / m.shape[1],
        R(msas, (1, 2)),
        ref=lambda c: torch.einsum("sid,sje->ijde", c, c) / c.shape[0],
        new_ragged=True,  # the pair (i, j) is new ragged dims over the msa's second extent
    )


def test_in_place_and_no_leakage():
    comps = comps_for(SEQ_SHAPES, 6)
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    y = x.clone()
    y /= x.shape[1]
    y.mul_(x.shape[1] * 3)
    for a, c in zip(y.unbind(), comps):
        torch.testing.assert_close(a, c / c.shape[0] * (c.shape[0] * 3))
    changed = [c.clone() for c in comps]
    changed[2] = torch.randn(7, 4, dtype=F64)  # another length for sample 2 only
    z = mj.nested_tensor(changed, ragged_dims=(1,))
    for i in (0, 1, 3):
        torch.testing.assert_close((z * z.shape[1]).unbind()[i], (x * x.shape[1]).unbind()[i])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", [operator.mul, operator.truediv, operator.add, operator.floordiv])
def test_result_dtypes_are_a_numbers(dtype, op):
    if dtype is torch.bool and op is operator.floordiv:
        pytest.skip("dense torch refuses floor division of bool")
    comps = [torch.ones(2, 3, dtype=dtype), torch.ones(4, 3, dtype=dtype)]
    x = mj.nested_tensor(comps, ragged_dims=(1,))
    out = op(x, x.shape[1])
    for a, c in zip(out.unbind(), comps):
        want = op(c, c.shape[0])
        assert a.dtype == want.dtype
        torch.testing.assert_close(a, want)


def test_a_size_of_another_batch_raises():
    x = mj.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
    other = mj.nested_tensor([torch.ones(2, 3), torch.ones(4, 3), torch.ones(1, 3)])
    with pytest.raises(mj.StructureError, match="batch of 3"):
        x / other.shape[1]


def test_operands_by_keyword_take_the_general_path():
    """The values path takes its operands positionally; a call naming them falls back to the
    general path instead of failing to bind."""
    comps = comps_for(SEQ_SHAPES, 7)
    w = torch.randn(5, 4, dtype=F64)
    cases = [
        (lambda x: torch.add(x, other=x, alpha=2), lambda c: torch.add(c, other=c, alpha=2)),
        (lambda x: torch.mul(input=x, other=x), lambda c: c * c),
        (lambda x: x.pow(exponent=2), lambda c: c.pow(2)),
        (lambda x: torch.sub(x, other=1, alpha=2), lambda c: c - 2),
        (lambda x: F.linear(input=x, weight=w), lambda c: F.linear(c, w)),
        (lambda x: F.softmax(input=x, dim=-1), lambda c: F.softmax(c, -1)),
        (lambda x: torch.sigmoid(input=x), torch.sigmoid),
    ]
    for fn, ref in cases:
        per_sample_check(fn, R(comps, (1,)), ref=ref)



def test_a_ragged_size_under_torch_compile():
    """Compiled, ``x / x.shape[1]`` (and multiples, ``x / (2 * n)``) reads each sample's own size
    from the offsets in the graph; torch traced the size's placeholder value (7777777) before."""
    comps = comps_for(SEQ_SHAPES, 6, low=0.5, high=1.5)
    forms = [
        (lambda x: x / x.shape[1], lambda c: c / c.shape[0]),
        (lambda x: x * x.size(1), lambda c: c * c.shape[0]),
        (lambda x: x / (2 * x.shape[1]), lambda c: c / (2 * c.shape[0])),
        (lambda x: x.shape[1] * x, lambda c: c.shape[0] * c),
    ]
    for f, ref in forms:
        cf = torch.compile(f, backend="aot_eager", fullgraph=True)
        out = cf(mj.nested_tensor(comps))
        for got, c in zip(out.unbind(), comps):
            torch.testing.assert_close(got, ref(c))



def test_a_static_size_made_dynamic_under_torch_compile_is_a_number():
    """``x + x.size(2)`` compiled with the static dim dynamic (``dynamic=True``, or after a call
    with another static size): a plain number, as eagerly (it recursed in the size route). A
    ragged size times such a size raises there rather than read torch's placeholder."""
    f = torch.compile(lambda x: x + x.size(2) + x.stride(1) + x.shape[1], backend="aot_eager")
    for c in (4, 6, 5):
        comps = [torch.randn(n, c, dtype=torch.float64) for n in (2, 0, 7)]
        out = f(mj.nested_tensor(comps))
        for got, t in zip(out.unbind(), comps):
            torch.testing.assert_close(got, t + 2 * c + t.shape[0])
    h = torch.compile(lambda x: x + x.stride(1) * x.shape[1], backend="aot_eager", dynamic=True)
    with pytest.raises(Exception, match="combines a ragged size|unsupported operand"):
        h(mj.nested_tensor([torch.randn(n, 6) for n in (2, 3)]))
    g = torch.compile(lambda x: x - x.size(-1), backend="aot_eager", dynamic=True)
    comps = [torch.randn(n, 6, dtype=torch.float64) for n in (3, 1)]
    for got, t in zip(g(mj.nested_tensor(comps)).unbind(), comps):
        torch.testing.assert_close(got, t - 6)

COMPARISONS = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "torch.eq": torch.eq, "torch.ne": torch.ne, "torch.lt": torch.lt, "torch.greater_equal": torch.greater_equal,
}


@pytest.mark.parametrize("name", list(COMPARISONS))
def test_comparisons_with_a_ragged_size_are_per_sample_masks(name):
    """``pos + 1 == n`` (the last position of each sample), ``pos < n // 2`` and the reversed
    forms compare each sample with its own size — a mask, never Python's identity answer
    (``False``), whatever operand comes first; so ``x * (pos + 1 != n)`` zeroes each last row."""
    op = COMPARISONS[name]
    lengths = (5, 2, 0, 8, 1)
    x = mj.nested_tensor([torch.randn(n, 3) for n in lengths])
    pos, n = mj.position_ids(x), x.shape[1]
    for size, k in ((n, 1), (n // 2, 2), (2 * n, None)):
        each = [n_i // k if k == 2 else 2 * n_i if k is None else n_i for n_i in lengths]
        for a, b, flip in ((pos + 1, size, False), (size, pos, True)):
            if flip and name.startswith("torch."):
                continue  # torch functions take the tensor first
            got = op(a, b)
            assert isinstance(got, mj.MultiJaggedTensor), type(got)
            for g, p, s in zip(got.unbind(), pos.unbind(), each):
                want = op(torch.tensor(s), p) if flip else op(p + 1, torch.tensor(s))
                assert g.dtype == want.dtype and torch.equal(g, want)
    kept = x * (pos + 1 != n).unsqueeze(-1)
    for k_i, c in zip(kept.unbind(), x.unbind()):
        assert torch.equal(k_i[:-1], c[:-1]) and not bool(k_i[-1:].any())
