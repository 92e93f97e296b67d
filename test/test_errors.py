"""Bad inputs raise typed errors that name the op."""

import re

import math

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj


def _z(*shape):
    return torch.zeros(*shape)


def _pairs(*shapes):
    return mj.nested_tensor([_z(*s) for s in shapes], ragged_dims=(1, 2))


def _seqs(*lengths, c=3):
    return mj.nested_tensor([_z(n, c) for n in lengths], ragged_dims=(1,))


# Pairs of operands that pack to the same number of rows (or are otherwise plausible) but whose
# structures differ: elementwise ops must compare extents, not row counts.
MISMATCHED = {
    "rect (2,6) vs (3,4)": lambda: (_pairs((2, 6, 3)), _pairs((3, 4, 3))),  # 12 rows each
    "square (4,4) vs rect (2,8)": lambda: (_pairs((4, 4, 3)), _pairs((2, 8, 3))),  # 16 rows each
    "square [2,3] vs [3,2]": lambda: (_pairs((2, 2, 3), (3, 3, 3)), _pairs((3, 3, 3), (2, 2, 3))),  # 13 rows each
    "rect B=2 (2,6),(1,1) vs (3,4),(1,1)": lambda: (_pairs((2, 6, 3), (1, 1, 3)), _pairs((3, 4, 3), (1, 1, 3))),
    "rect (0,3) vs (0,7)": lambda: (_pairs((0, 3, 3), (1, 1, 3)), _pairs((0, 7, 3), (1, 1, 3))),  # 1 row each
    "seq [3,1] vs [1,3]": lambda: (_seqs(3, 1), _seqs(1, 3)),  # 4 rows each
    "seq [2,0] vs [0,2]": lambda: (_seqs(2, 0), _seqs(0, 2)),
    "static_lead [2,1] vs [1,2]": lambda: tuple(
        mj.nested_tensor([_z(2, n, 3) for n in ns], ragged_dims=(2,)) for ns in ((2, 1), (1, 2))
    ),
}

BINARY_OPS = {
    "add": (torch.add, "add"),
    "mul": (torch.mul, "mul"),
    "sub": (lambda a, b: a - b, "sub"),
    "maximum": (torch.maximum, "maximum"),
    "where": (lambda a, b: torch.where(a > 0, a, b), "where"),
    "masked_fill": (lambda a, b: a.masked_fill(b > 0, 1.0), "masked_fill"),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.5), "lerp"),
}


@pytest.mark.parametrize("op", BINARY_OPS, ids=str)
@pytest.mark.parametrize("case", MISMATCHED, ids=str)
def test_mismatched_structures_do_not_combine(case, op):
    a, b = MISMATCHED[case]()
    fn, name = BINARY_OPS[op]
    with pytest.raises(ValueError, match=rf"^{name}[\w.]*\(\): .*shapes .*j\d+.* and .*j\d+"):
        fn(a, b)


@pytest.mark.parametrize("case", MISMATCHED, ids=str)
def test_mismatched_structures_in_place_and_copy(case):
    a, b = MISMATCHED[case]()
    with pytest.raises(ValueError, match=r"^add_"):
        a.add_(b)
    with pytest.raises(ValueError, match=r"^copy_"):
        a.copy_(b)


def test_mismatched_structure_message_says_what_differs():
    a, b = _seqs(3, 1), _seqs(1, 3)
    with pytest.raises(ValueError, match="per-sample sizes"):
        a + b


def test_mismatched_batch():
    a, b = _seqs(2, 1), _seqs(2, 1, 0)
    with pytest.raises(ValueError, match=r"^add[\w.]*\(\): .*batch"):
        a + b
    with pytest.raises(ValueError, match=r"^mul[\w.]*\(\): .*batch"):
        a * torch.ones(3, 1, 3)  # a dense per-sample operand for B = 3, not 2


def test_dense_operand_along_a_ragged_dim():
    with pytest.raises(ValueError, match=r"^add[\w.]*\(\): .*ragged dim 1"):
        _seqs(2, 1) + torch.ones(5, 3)  # size 5 at the ragged dim


def test_rank_mismatch_between_multi_jagged_operands():
    with pytest.raises(ValueError, match=r"^add[\w.]*\(\): .*number of dims"):
        _seqs(2, 1) + mj.nested_tensor([_z(2, 3, 1), _z(1, 3, 1)], ragged_dims=(1,))


def test_dense_operand_with_more_dims():
    with pytest.raises(ValueError, match=r"^add[\w.]*\(\): .*more dims"):
        _seqs(2, 1) + torch.ones(2, 1, 1, 3)


def test_in_place_on_a_dense_self_with_a_multi_jagged_operand():
    with pytest.raises(ValueError, match=r"^add_"):
        torch.ones(3).add_(_seqs(2, 1))


def test_in_place_op_cannot_change_the_structure_of_self():
    x = _seqs(2, 1).unsqueeze(2)  # (B, j0, 1, C)
    pair = torch.zeros_like(x) + torch.zeros_like(x).transpose(1, 2)  # (B, j0, j0, C)
    assert pair.shape[1] == pair.shape[2] == x.shape[1]
    with pytest.raises(ValueError, match=r"^add_[\w.]*\(\): .*in-place"):
        x.add_(pair)


# ----------------------------------------------------------------------------- constructors
CONSTRUCTOR_ERRORS = {
    "offsets int32": (lambda: mj.from_packed(_z(5, 2), torch.tensor([0, 3, 3, 5], dtype=torch.int32), torch.tensor([3, 0, 2])),
                      TypeError, "from_packed.*offsets"),
    "offsets float": (lambda: mj.from_packed(_z(5, 2), torch.tensor([0.0, 3, 3, 5]), torch.tensor([3, 0, 2])),
                      TypeError, "from_packed.*offsets"),
    "offsets not at 0": (lambda: mj.from_packed(_z(5, 2), torch.tensor([1, 3, 3, 5]), torch.tensor([3, 0, 2]), validate=True),
                         ValueError, "from_packed.*offsets"),
    "offsets past T": (lambda: mj.from_packed(_z(5, 2), torch.tensor([0, 3, 3, 6]), torch.tensor([3, 0, 3]), validate=True),
                       ValueError, "from_packed.*offsets"),
    "negative sizes": (lambda: mj.from_packed(_z(0, 2), torch.tensor([0, 0]), torch.tensor([-1]), validate=True),
                       ValueError, "from_packed.*sizes"),
    "empty list": (lambda: mj.nested_tensor([]), ValueError, "nested_tensor"),
    "not tensors": (lambda: mj.as_nested_tensor([_z(2, 3), "x"]), TypeError, "as_nested_tensor"),
    "mixed dtypes": (lambda: mj.nested_tensor([_z(2, 3), _z(1, 3).double()]), RuntimeError, "nested_tensor.*dtype"),
    "0-dim components": (lambda: mj.nested_tensor([torch.tensor(1.0), torch.tensor(2.0)]), ValueError, "nested_tensor"),
    "from_padded lengths": (lambda: mj.from_padded(_z(2, 3, 4), torch.tensor([[1, 1]]), ragged_dims=(1, 2)),
                            ValueError, "from_padded.*lengths"),
    "to_padded output_size too small": (lambda: torch.nested.to_padded_tensor(_seqs(3, 1), 0.0, output_size=(2, 2, 3)),
                                        ValueError, "to_padded_tensor.*output_size"),
    # host checks run without validate=True (the sizes are on the host already)
    "negative sizes without validate": (lambda: mj.from_packed(_z(0, 2), torch.tensor([0, 0]), torch.tensor([-1])),
                                        ValueError, r"^from_packed\(\): sizes must be non-negative"),
    "rows vs sizes without validate": (lambda: mj.from_packed(torch.zeros(5, 2, device="meta"), torch.zeros(4, dtype=torch.int64, device="meta"),
                                                              torch.tensor([3, 0, 1])),
                                       ValueError, r"^from_packed\(\): sizes describe 4 packed rows"),
    "multi_jagged values": (lambda: mj.from_packed(_seqs(3, 2), torch.tensor([0, 3, 5]), torch.tensor([3, 2])),
                            TypeError, r"^from_packed\(\): expected values to be a dense tensor, got a multi_jagged"),
    "str component": (lambda: mj.nested_tensor([_z(2, 3), "ab"]), TypeError, r"^nested_tensor\(\): expected a list of tensors"),
    "str component (torch.nested)": (lambda: torch.nested.nested_tensor([_z(2, 3), "ab"], layout=mj.multi_jagged),
                                     TypeError, r"^nested_tensor\(\): expected a list of tensors"),
    "multi_jagged component": (lambda: mj.nested_tensor([_z(2, 3), _seqs(1)]),
                               TypeError, r"^nested_tensor\(\): expected each component to be a dense tensor, got a multi_jagged"),
    "multi_jagged component (as_)": (lambda: mj.as_nested_tensor([_seqs(1)]),
                                     TypeError, r"^as_nested_tensor\(\): expected each component to be a dense tensor, got a multi_jagged"),
    "jagged component": (lambda: mj.nested_tensor([torch.nested.nested_tensor([_z(2, 3)], layout=torch.jagged)]),
                         TypeError, r"^nested_tensor\(\): expected each component to be a dense tensor, got a nested"),
    "ragged_dims float": (lambda: mj.from_packed(_z(5, 2), torch.tensor([0, 3, 5]), torch.tensor([3, 2]), ragged_dims=(1.5,)),
                          TypeError, r"^from_packed\(\): expected ragged_dims to hold ints"),
    "ragged_dims bare float": (lambda: mj.nested_tensor([_z(2, 3)], ragged_dims=1.5),
                               TypeError, r"^nested_tensor\(\): expected ragged_dims to be an int or a sequence of ints"),
    "lengths float": (lambda: mj.from_padded(_z(2, 3, 4), torch.tensor([1.5, 2.0])),
                      TypeError, r"^from_padded\(\): expected lengths of an integer dtype"),
    "lengths on meta": (lambda: mj.from_padded(_z(2, 3, 4), torch.tensor([1, 2], device="meta")),
                        ValueError, r"^from_padded\(\): expected lengths with data .*meta"),
    "sizes on meta": (lambda: mj.from_packed(_z(5, 2), torch.tensor([0, 3, 5]), torch.tensor([3, 2], device="meta")),
                      ValueError, r"^from_packed\(\): expected sizes with data .*meta"),
    "from_padded multi_jagged": (lambda: mj.from_padded(_seqs(2, 1), torch.tensor([1, 1])),
                                 TypeError, r"^from_padded\(\): expected padded to be a dense tensor"),
}


@pytest.mark.parametrize("case", CONSTRUCTOR_ERRORS, ids=str)
def test_constructor_errors(case):
    fn, exc, pattern = CONSTRUCTOR_ERRORS[case]
    with pytest.raises(exc, match=pattern):
        fn()


# ----------------------------------------------------------------------------- unsupported ops
UNSUPPORTED = {
    # several q along a pair's ragged dim: a leading q dim before a batch that keeps a ragged dim
    "quantile": lambda x: torch.quantile(x.unsqueeze(2) + x.unsqueeze(1), torch.tensor([0.2, 0.5]), dim=1),
    "msort": lambda x: torch.msort(x),  # sorts along the batch dim
    "roll": lambda x: torch.roll(x, 1),  # the flattened tensor
}


@pytest.mark.parametrize("op", UNSUPPORTED, ids=str)
def test_unsupported_ops_raise_not_implemented(op):
    with pytest.raises(NotImplementedError, match=rf"{op}.*multi_jagged"):
        UNSUPPORTED[op](_seqs(2, 0, 1))


def test_out_variants_are_rejected():
    x = _seqs(2, 1)
    with pytest.raises((NotImplementedError, RuntimeError), match="multi_jagged|out"):
        torch.sin(x, out=torch.zeros_like(x))


OUT_CALLS = {  # routed ops and aten out= overloads without a handler: one clear error, naming the op
    "sum": lambda x, o: torch.sum(x, 1, out=o),
    "mean": lambda x, o: torch.mean(x, 1, out=o),
    "amax": lambda x, o: torch.amax(x, 1, out=o),
    "amin": lambda x, o: torch.amin(x, 1, out=o),
    "logsumexp": lambda x, o: torch.logsumexp(x, 1, out=o),
    "std": lambda x, o: torch.std(x, 1, out=o),
    "var": lambda x, o: torch.var(x, 1, out=o),
    "nansum": lambda x, o: torch.nansum(x, 1, out=o),
    "nanmean": lambda x, o: torch.nanmean(x, 1, out=o),
    "prod": lambda x, o: torch.prod(x, 1, out=o),
    "diff": lambda x, o: torch.diff(x, dim=1, out=o),
    "abs": lambda x, o: torch.abs(x, out=o),
    "sgn": lambda x, o: torch.sgn(x, out=o),
    "vector_norm": lambda x, o: torch.linalg.vector_norm(x, dim=1, out=o),
    "max": lambda x, o: torch.max(x, 1, out=(o, o.long())),
    "cumsum": lambda x, o: torch.cumsum(x, 1, out=o),
    "sum dense out": lambda x, o: torch.sum(x, 1, out=torch.empty(0)),
}


@pytest.mark.parametrize("op", OUT_CALLS)
def test_out_variants_of_routed_ops_are_rejected_clearly(op):
    x = _seqs(2, 0, 1)
    name = op.split()[0].replace("vector_norm", "linalg_vector_norm")
    with pytest.raises(NotImplementedError, match=rf"^{name}\(\): out= variants are not supported for layout torch.multi_jagged"):
        OUT_CALLS[op](x, x.detach().clone())


BATCH_DIM = {
    "sum": lambda x: x.sum(0),
    "mean": lambda x: x.mean(0),
    "amax": lambda x: x.amax(0),
    "softmax": lambda x: x.softmax(0),
}


@pytest.mark.parametrize("op", BATCH_DIM, ids=str)
def test_reducing_the_batch_dim_alone_is_rejected(op):
    with pytest.raises((NotImplementedError, ValueError), match="batch"):
        BATCH_DIM[op](_seqs(2, 0, 1))


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reducing_the_batch_dim_error_names_the_op(op):
    with pytest.raises(NotImplementedError, match=rf"^{op}"):
        BATCH_DIM[op](_seqs(2, 0, 1))


def test_dim_out_of_range():
    x = _seqs(2, 1)
    with pytest.raises(IndexError):
        x.sum(5)
    with pytest.raises(IndexError):
        x[2]
    with pytest.raises(IndexError):
        x[-3]


DUPLICATE_DIMS = {
    # name: f(tensor, a dim list naming one dim twice, as (d, -k) or (d, d))
    "sum": lambda t, d: t.sum(d),
    "mean": lambda t, d: t.mean(d),
    "amax": lambda t, d: torch.amax(t, d),
    "var": lambda t, d: t.var(d),
    "std": lambda t, d: t.std(d),
    "logsumexp": lambda t, d: torch.logsumexp(t, d),
    "norm": lambda t, d: t.norm(dim=d),
    "normalize": lambda t, d: F.normalize(t, dim=d),
    "squeeze": lambda t, d: t.squeeze(d),
    "sum over the moved batch": lambda t, d: t.transpose(0, 1).sum(d),
}


@pytest.mark.parametrize("name", list(DUPLICATE_DIMS))
@pytest.mark.parametrize("dims", [(1, 1), (1, -3), (3, 3), (2, -2)])
def test_a_dim_named_twice_raises_as_dense(name, dims):
    # (B, j0, 1, C): a ragged dim, a static size-1 dim, a static dim; dense raises for each
    x = mj.nested_tensor([torch.randn(n, 1, 3) for n in (2, 3)])
    dense = torch.randn(2, 3, 1, 3)
    with pytest.raises(RuntimeError) as want:
        DUPLICATE_DIMS[name](dense, dims)
    with pytest.raises(RuntimeError, match=re.escape(str(want.value))):
        DUPLICATE_DIMS[name](x, dims)


def test_group_norm_and_linear_errors_name_the_op():
    with pytest.raises(ValueError, match="group_norm"):
        F.group_norm(_pairs((2, 3, 4), (1, 0, 4)), 2)
    with pytest.raises(ValueError, match="to_jagged"):
        _pairs((2, 3, 4), (1, 0, 4)).to_jagged()


def test_errors_mention_both_shapes():
    a, b = _pairs((2, 6, 3)), _pairs((3, 4, 3))
    with pytest.raises(ValueError) as info:
        a + b
    shapes = re.findall(r"\(1, j\d+, j\d+, 3\)", str(info.value))
    assert len(shapes) == 2, str(info.value)


_ONE_VALUE_USES = {
    "int": lambda n: int(n),
    "range": lambda n: range(n),
    "index": lambda n: [0, 1, 2][n],
    "float": lambda n: float(n),
    "arange": lambda n: torch.arange(n),
    "arange_start": lambda n: torch.arange(1, n),
    "power": lambda n: n**0.5,
    "mod by a ragged size": lambda n: n % n,  # (n % 2 is the remainder every sample gives, or raises)
    "floordiv by a negative": lambda n: n // -2,  # (n // 2 is each sample's size halved)
    "floordiv by a ragged size": lambda n: n // n,
    "truediv": lambda n: n / 2,
    "neg": lambda n: -n,
    "sym_max": lambda n: torch.sym_max(n, 3),
    "int over it": lambda n: 1 / n,
    "int floordiv by it": lambda n: 6 // n,
    "int mod it": lambda n: 6 % n,
    "int to its power": lambda n: 2**n,
    "times a negative int": lambda n: n * -2,
    "plus another ragged size": lambda n: n + n,
}


@pytest.mark.parametrize("use", sorted(_ONE_VALUE_USES))
@pytest.mark.parametrize("which", ["sequence", "joined", "scaled"])
def test_a_ragged_size_used_as_one_number_says_what_to_write(use, which):
    # int(x.shape[1]), torch.arange(n), n % 2: a ragged dim's size has no single value. torch's
    # own node raises an AttributeError about a missing method; ours names the ways to write it.
    x = mj.nested_tensor([torch.randn(n, 4) for n in (2, 0, 3)])
    n = {"sequence": x.shape[1], "joined": torch.cat([x, x], 1).shape[1], "scaled": 3 * x.shape[1]}[which]
    assert isinstance(n, torch.SymInt) and n != x.shape[1] or which == "sequence"
    with pytest.raises(TypeError, match=r"no single value.*mj\.position_ids\(x\)"):
        _ONE_VALUE_USES[use](n)


@pytest.mark.parametrize("use", ["n + 1", "n - 1", "1 + n", "4 - n"])
def test_a_multiple_of_a_ragged_size_plus_an_int_says_what_to_write(use):
    """``n ± k`` is each sample's size ± k (test_size_shifts.py); of a multiple (``3 * n + 1``) it
    still has no single value."""
    n = 3 * mj.nested_tensor([torch.randn(k, 4) for k in (2, 0, 3)]).shape[1]
    with pytest.raises(TypeError, match=r"no single value.*mj\.position_ids\(x\)"):
        eval(use, {"n": n})


def test_a_ragged_size_keeps_its_comparisons_products_and_njt_identity():
    x = mj.nested_tensor([torch.randn(n, 4) for n in (2, 0, 3)])
    n = x.shape[1]
    assert 2 * n == n * 2 and n * 2 != n and n == x.shape[1] and n >= 2 and not (n == 3)
    assert str(n * 4) == f"4*{n}" and hash(n) == hash(x.shape[1])
    assert x.new_zeros(x.shape).shape == x.shape  # sizes still build tensors from the batch
    # a torch.jagged tensor on the same offsets has the same nested int, both ways
    njt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(5, 4)], layout=torch.jagged)
    assert mj.from_jagged(njt).shape[1] == njt.shape[1]
    assert mj.to_jagged(x).shape[1] == n


def test_a_ragged_size_plus_zero_and_abs_are_itself():
    """``past + n`` with no past (Hugging Face's cache length 0) and ``abs(n)``: each sample's own
    size, the same nested int (a batch's shape built from it is the batch's)."""
    x = mj.nested_tensor([torch.randn(n, 4) for n in (2, 0, 3)])
    n = x.shape[1]
    for m in (0 + n, n + 0, n - 0, abs(n)):
        assert m == n and x.new_zeros(2 * 0 + 3, m, 4).shape == x.shape
    # times 0: every sample's 0, a plain int (a dense dim of that size)
    assert type(n * 0) is int and n * 0 == 0 == 0 * n and torch.zeros(n * 0, 4).shape == (0, 4)
    # a size minus itself (Hugging Face's ``kv_length + kv_offset - mask.shape[-1]``): every sample's
    # 0, also for equal lengths built apart; other sizes still raise
    same = mj.nested_tensor([torch.randn(k, 1) for k in (2, 0, 3)]).shape[1]
    assert type(n - n) is int and n - n == 0 and (n + 0) - same == 0 and (2 * n) - (2 * n) == 0
    with pytest.raises(TypeError, match="differs per sample"):
        n - mj.nested_tensor([torch.randn(k, 1) for k in (3, 0, 2)]).shape[1]


@pytest.mark.parametrize("lengths, expected", [
    ((2, 0, 3), {"n <= 64": True, "n < 4": True, "n > 3": False, "min(n, 64) == n": True, "max(n, 64) == 64": True,
                 "n > m": False, "m >= n": True, "pe_rows": 4}),
    ((5, 6, 7), {"n <= 64": True, "n < 4": False, "n > 3": True, "min(n, 64) == n": True, "max(n, 64) == 64": True,
                 "n > m": False, "m >= n": True, "pe_rows": 4}),
])
def test_a_comparison_every_sample_answers_alike_is_that_answer(lengths, expected):
    """NOTE [ Comparing ragged sizes ]: ``assert n <= max_len``, ``min(n, window)``, ``k_len >
    q_len`` — each sample's answer when all agree (what each would do alone); a dense table cut
    by a ragged size every sample reaches past is the whole table, as each sample's cut is."""
    x = mj.nested_tensor([torch.randn(k, 4) for k in lengths])
    y = mj.nested_tensor([torch.randn(k + 1, 4) for k in lengths])
    n, m = x.shape[1], y.shape[1]
    got = {"n <= 64": n <= 64, "n < 4": n < 4, "n > 3": n > 3, "min(n, 64) == n": min(n, 64) == n,
           "max(n, 64) == 64": max(n, 64) == 64, "n > m": n > m, "m >= n": m >= n,
           "pe_rows": torch.zeros(1, 4, 2)[:, :n].shape[1] if min(lengths) >= 4 else 4}
    assert got == expected
    for k in lengths:  # the per-sample answers the batch's stand for
        assert (k <= 64, k < 4, k > 3) == (expected["n <= 64"], expected["n < 4"], expected["n > 3"])


def test_a_comparison_every_sample_answers_alike_overrides_torchs_rule():
    """With one token per sample, ``q_len > 1`` (the decoding test of Hugging Face's attention) is
    False, as each sample alone answers, though torch's rule says a nested int is at least 2;
    where the samples differ, torch's rule still answers what it can (``n >= 1`` with an empty
    sample). Equality stays torch's, answered as a node torch's C++ can query (a dense cut from a
    ragged start raises the package's error, not an AttributeError)."""
    one = mj.nested_tensor([torch.randn(1, 4), torch.randn(1, 4)]).shape[1]
    assert (one > 1, one < 2, one >= 2, min(one, 1) is one) == (False, True, False, True)
    some_empty = mj.nested_tensor([torch.randn(k, 4) for k in (2, 0, 5)]).shape[1]
    assert some_empty >= 1 and some_empty >= 0 and not (some_empty == 3) and some_empty != 3
    with pytest.raises(TypeError, match="no single value"):
        torch.randn(2, 8)[:, some_empty:]


def test_a_comparison_with_a_float_is_each_samples_alike():
    """``num_msa > max_num_msa`` with ``max_num_msa = math.inf`` (alphafold3-pytorch's MSA module
    default): a float bound compares per sample as an int does; float arithmetic still raises."""
    x = mj.nested_tensor([torch.randn(k, 2) for k in (3, 0, 5)])
    n = x.shape[1]
    assert (n > math.inf, n < math.inf, n <= 5.0, n >= 0.0, math.inf > n) == (False, True, True, True, True)
    with pytest.raises(ValueError, match=r"j\d+ > 2.5 holds for some samples and not others"):
        _ = n > 2.5
    with pytest.raises(TypeError, match="no single value"):
        _ = n * 0.5


@pytest.mark.parametrize("use", [
    lambda n: 1.0 / n, lambda n: 2.0 * n, lambda n: 1.0 - n, lambda n: 1.5 + n, lambda n: 2.0 ** n,
    lambda n: n / 2.0, lambda n: n * 1.0,
])
def test_float_arithmetic_with_a_ragged_size_raises_naming_it(use):
    """``scale = 1.0 / x.shape[1]``: a float on either side of a ragged size raises the package's
    error (the float first reached its node, which had no arithmetic: an ``AttributeError``)."""
    n = mj.nested_tensor([torch.randn(k, 2) for k in (3, 1, 5)]).shape[1]
    with pytest.raises(TypeError, match=r"float arithmetic.*j\d+.*no single value"):
        use(n)


def test_a_comparison_samples_answer_differently_raises_naming_it():
    x = mj.nested_tensor([torch.randn(k, 4) for k in (2, 0, 5)])
    n = x.shape[1]
    for use in (lambda: n < 3, lambda: 3 > n, lambda: min(n, 3), lambda: bool(n >= 4)):
        with pytest.raises(ValueError, match=r"holds for some samples and not others \(sizes \[2, 0, 5\]\)"):
            use()
    with pytest.raises(ValueError, match="holds for some samples and not others"):  # a cut that differs per sample
        torch.zeros(1, 4, 2)[:, :n]


@pytest.mark.parametrize("classes, num_classes, message", [
    ([[3, 0], [1, 2, 2]], 3, "smaller than num_classes"),
    ([[0, 0], [-1, 2]], 3, "non-negative"),
    ([[0, 0], [-1, 2]], -1, "non-negative"),
])
def test_one_hot_out_of_range_raises_as_dense(classes, num_classes, message):
    """aten's one_hot skips its range checks for nested-int sizes: a class out of range would be
    an all-zero row. Dense torch raises; so does each sample's dense call here."""
    x = mj.nested_tensor([torch.tensor(c) for c in classes])
    with pytest.raises(RuntimeError, match=message):
        F.one_hot(torch.tensor(sum(classes, [])), num_classes)  # the dense check mirrored
    with pytest.raises(RuntimeError, match=message):
        F.one_hot(x, num_classes)
    ok = mj.nested_tensor([torch.tensor([1, 0]), torch.tensor([], dtype=torch.int64), torch.tensor([2])])
    assert [t.tolist() for t in F.one_hot(ok, 3).unbind()] == [F.one_hot(c, 3).tolist() for c in ok.unbind()]
    assert F.one_hot(ok).shape[-1] == 3  # num_classes=-1: the batch's largest class + 1, as torch.jagged


_PW = torch.rand(3, dtype=torch.float64)
DENSE_REFUSES = {
    "cumsum_bool_in_place": lambda t, d: t.bool().cumsum_(d),
    "cumprod_bool_in_place": lambda t, d: t.bool().cumprod_(d),
    "cumsum_in_place_other_dtype": lambda t, d: t.clone().cumsum_(d, dtype=torch.float32),
    "trapezoid_bool_ragged": lambda t, d: torch.trapezoid(t.bool(), dim=d),
    "trapezoid_bool_static": lambda t, d: torch.trapezoid(t.bool(), dim=-1),
    "cumulative_trapezoid_bool_ragged": lambda t, d: torch.cumulative_trapezoid(t.bool(), dim=d),
    "cumulative_trapezoid_bool_static": lambda t, d: torch.cumulative_trapezoid(t.bool(), dim=-1),
    "nansum_complex": lambda t, d: torch.nansum(t.to(torch.complex128)),
    "nansum_complex_dim": lambda t, d: torch.nansum(t.to(torch.complex128), d),
    "bce_logits_pos_weight_requiring_grad": lambda t, d: F.binary_cross_entropy_with_logits(
        t, t.sigmoid().detach(), pos_weight=_PW.clone().requires_grad_()),
    "bce_logits_weight_requiring_grad": lambda t, d: F.binary_cross_entropy_with_logits(
        t, t.sigmoid().detach(), weight=_PW.clone().requires_grad_()),
}


@pytest.mark.parametrize("name", DENSE_REFUSES)
def test_ops_refuse_what_dense_refuses(name):
    """Where dense torch refuses every sample (a dtype its kernel lacks, an input its derivative
    does not cover), ours refuses with dense's exception type, instead of an answer dense never gives."""
    comps = [torch.randn(n, 3, dtype=torch.float64) for n in (3, 1, 2)]
    f = DENSE_REFUSES[name]
    with pytest.raises((RuntimeError, NotImplementedError)) as dense:
        f(comps[0], 0)
    with pytest.raises(type(dense.value)):
        f(mj.nested_tensor(comps), 1)


def test_a_torch_jagged_tensor_beside_a_multi_jagged_one_names_the_mix():
    """``x + njt`` (code migrating between the layouts) says the layouts do not mix and how to
    convert, instead of reading the torch.jagged tensor as a dense operand."""
    comps = [torch.randn(2, 3), torch.randn(4, 3)]
    x = mj.nested_tensor(comps)
    njt = torch.nested.nested_tensor(comps, layout=torch.jagged)
    for f in (lambda: x + njt, lambda: torch.mul(x, njt), lambda: torch.cat([x, njt], -1)):
        with pytest.raises((mj.StructureError, TypeError), match="torch.jagged"):
            f()
    torch.testing.assert_close((x + mj.from_jagged(njt)).values(), 2 * x.values())


def test_comparisons_of_a_ragged_size_of_an_empty_batch_agree_with_one_another():
    """B = 0: no sample answers, so torch's rule decides where it can (``n > n`` and ``n < n`` are
    False, ``n >= 1`` True, as with samples) and the rest hold vacuously (``assert n <= max_len``):
    code branching on ``k_len > q_len`` takes the branch it takes with samples of one length."""
    x = mj.from_padded(torch.zeros(0, 3, 8), torch.zeros(0, 1, dtype=torch.long))
    n = x.shape[1]
    assert not (n > n) and not (n < n) and n >= n and n <= n and n >= 1 and not (n < 1)
    assert n <= 64
