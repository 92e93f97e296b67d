"""repr, serialization and the tensor-level conversions (tensor.py, ops/elementwise/factory.py)."""

import copy
import io
import pickle

import pytest
import torch
from expecttest import TestCase
from hypothesis import given

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor, multi_jagged

from _reference import ALL_LAYOUTS, assert_close, build, components, normalize_nested_ints, seeds, structures


def _pair():
    return mj.nested_tensor([torch.zeros(2, 2, 3), torch.zeros(0, 0, 3), torch.zeros(1, 1, 3)])


def _rect():
    return mj.nested_tensor([torch.zeros(2, 3, 1), torch.zeros(0, 4, 1)])


class TestRepr(TestCase):
    def test_sequence(self):
        x = mj.nested_tensor([torch.zeros(3, 4), torch.zeros(0, 4)])
        self.assertExpectedInline(
            normalize_nested_ints(repr(x)),
            """MultiJaggedTensor(shape=(2, j0, 4), ragged_dims=(1,), sizes=[[3], [0]], dtype=torch.float32, device=cpu)""",
        )

    def test_square_pair_prints_one_nested_int(self):
        self.assertExpectedInline(
            normalize_nested_ints(repr(_pair())),
            """MultiJaggedTensor(shape=(3, j0, j0, 3), ragged_dims=(1, 2), sizes=[[2, 2], [0, 0], [1, 1]], dtype=torch.float32, device=cpu)""",
        )

    def test_rectangular_pair(self):
        # the exact extents (0, 4) are shown, not (0, 0)
        self.assertExpectedInline(
            normalize_nested_ints(repr(_rect())),
            """MultiJaggedTensor(shape=(2, j0, j1, 1), ragged_dims=(1, 2), sizes=[[2, 3], [0, 4]], dtype=torch.float32, device=cpu)""",
        )

    def test_static_leading_dim_and_grad(self):
        x = mj.nested_tensor([torch.zeros(5, 2, 3), torch.zeros(5, 0, 3)], requires_grad=True)
        self.assertExpectedInline(
            normalize_nested_ints(repr(x)),
            """MultiJaggedTensor(shape=(2, 5, j0, 3), ragged_dims=(2,), sizes=[[2], [0]], dtype=torch.float32, device=cpu, requires_grad=True)""",
        )
        assert "grad_fn=" in repr(x * 2)

    def test_shape_str(self):
        self.assertExpectedInline(normalize_nested_ints(str(_pair().shape)), """torch.Size([3, j0, j0, 3])""")
        self.assertExpectedInline(normalize_nested_ints(str(_rect().shape)), """torch.Size([2, j0, j1, 1])""")


# ----------------------------------------------------------------------------- round trips
def _save_load(x, weights_only=False):
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only)


ROUNDTRIPS = {
    # torch.load's default since torch 2.6: only allowlisted globals (NOTE [ Serialized form ])
    "torch.load weights_only": lambda x: _save_load(x, weights_only=True),
    "torch.load full": _save_load,
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
    "deepcopy": copy.deepcopy,
}


def _assert_same(y, x):
    assert isinstance(y, MultiJaggedTensor) and y.layout is multi_jagged
    assert y.ragged_dims == x.ragged_dims
    assert torch.equal(y.sizes(), x.sizes())
    assert torch.equal(y.offsets(), x.offsets())
    assert_close(y.values(), x.values(), "values")
    assert y.dtype == x.dtype and y.requires_grad == x.requires_grad
    for a, b in zip(y.unbind(), x.unbind()):
        assert_close(a, b, "component")
    # extent sharing survives: a square pair keeps one nested int for both dims
    for d in x.ragged_dims:
        for e in x.ragged_dims:
            assert (y.shape[d] == y.shape[e]) == (x.shape[d] == x.shape[e])


@pytest.mark.parametrize("how", ROUNDTRIPS, ids=str)
@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=str)
def test_roundtrip(layout, how):
    @given(structures(layout), seeds)
    def check(s, seed):
        comps = components(s.shapes, seed)
        x, _ = build(comps, s.ragged_dims)
        y = ROUNDTRIPS[how](x)
        _assert_same(y, x)
        for i, (a, c) in enumerate(zip(y.unbind(), comps)):
            assert_close(a, c, f"sample {i}")  # against the components themselves, not x

    check()


@pytest.mark.parametrize("how", ROUNDTRIPS, ids=str)
def test_roundtrip_leaf_with_grad_and_batch_zero(how):
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)], requires_grad=True)
    y = ROUNDTRIPS[how](x)
    _assert_same(y, x)
    assert y.is_leaf
    (y * 2).sum().backward()
    assert [g.tolist() for g in y.grad.unbind()] == [[[2.0] * 3] * 2, []]  # d(2y)/dy = 2
    z = mj.from_packed(torch.zeros(0, 2, 3), torch.zeros(1, dtype=torch.int64), torch.zeros(0, 2, dtype=torch.int64),
                       ragged_dims=(1, 2))
    _assert_same(ROUNDTRIPS[how](z), z)


# Every kind of metadata read. Reading the shape once cached PyCapsules (torch's
# ``_sym_sizes_capsule``) in the wrapper's ``__dict__``, which ``__reduce_ex__`` then pickled.
METADATA = {
    "shape": lambda x: x.shape,
    "size": lambda x: x.size(),
    "size(d)": lambda x: [x.size(d) for d in range(x.dim())],
    "stride": lambda x: x.stride(),
    "dim": lambda x: x.dim(),
    "numel": lambda x: x.numel(),
    "repr": repr,
    "sizes": lambda x: x.sizes(),
    "offsets": lambda x: x.offsets(),
    "values": lambda x: x.values(),
    "layout": lambda x: x.layout,
    "is_contiguous": lambda x: x.is_contiguous(),
}
_EACH = tuple(METADATA.values())
METADATA["all"] = lambda x: [f(x) for f in _EACH]

# The four layouts with a zero-length sample, and B = 0 of each (from_packed with offsets [0]).
CASES = {
    "seq": ([(3, 4), (0, 4), (2, 4)], (1,)),  # (B, j0, C)
    "square": ([(2, 2, 3), (0, 0, 3), (1, 1, 3)], (1, 2)),  # (B, j0, j0, C)
    "rect": ([(2, 3, 3), (0, 4, 3), (1, 0, 3)], (1, 2)),  # (B, j0, j1, C)
    "static_lead": ([(5, 2, 3), (5, 0, 3), (5, 1, 3)], (2,)),  # (B, S, j0, C)
}


def _cases():
    out = {}
    for name, (shapes, rd) in CASES.items():
        comps = [torch.randn(*s, dtype=torch.float64) for s in shapes]
        out[name] = (mj.nested_tensor(comps, ragged_dims=rd, requires_grad=True), comps)
        static = [n for d, n in enumerate(shapes[0]) if d + 1 not in rd]
        empty = mj.from_packed(torch.zeros(0, *static, dtype=torch.float64), torch.zeros(1, dtype=torch.int64),
                               torch.zeros(0, len(rd), dtype=torch.int64), ragged_dims=rd).requires_grad_()
        out[name + " B=0"] = (empty, [])
    return out


@pytest.mark.parametrize("how", ROUNDTRIPS, ids=str)
@pytest.mark.parametrize("access", METADATA, ids=str)
def test_roundtrip_after_metadata_access(access, how):
    for name, (x, comps) in _cases().items():
        METADATA[access](x)
        y = ROUNDTRIPS[how](x)
        _assert_same(y, x)
        assert y.requires_grad and y.is_leaf, name
        assert len(y.unbind()) == len(comps)
        for i, (a, c) in enumerate(zip(y.unbind(), comps)):
            assert_close(a, c, f"{name} sample {i}")
        # the copy is itself readable and saveable again, and gradients reach it
        METADATA["all"](y)
        _assert_same(ROUNDTRIPS[how](y), x)
        if comps:
            cots = [torch.randn_like(c) for c in comps]
            (g,) = torch.autograd.grad(sum((a * k).sum() for a, k in zip(y.unbind(), cots)), y)
            for i, (gi, k) in enumerate(zip(g.unbind(), cots)):
                assert_close(gi, k, f"{name} grad of sample {i}")  # d(Σ y·k)/dy = k


def test_user_attributes_survive_and_internal_caches_do_not():
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)])
    x.shape, x.stride()  # noqa: B018  (fills torch's size/stride caches)
    x.tag = "pair-state"
    for how, fn in ROUNDTRIPS.items():
        y = fn(x)
        assert y.tag == "pair-state", how
        assert not [k for k in y.__dict__ if "capsule" in k], how
    _, (_, _, _, state) = x.__reduce_ex__(2)
    assert state == {"tag": "pair-state"}


# ----------------------------------------------------------------------------- weights_only
def test_weights_only_state_dict_and_module_buffers():
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(0, 4), torch.randn(2, 4)])
    pair = x.unsqueeze(-2) * x.unsqueeze(-3)  # (B, j0, j0, 4) carrying x's nested int
    m = torch.nn.Module()
    m.lin = torch.nn.Linear(4, 2)
    m.register_buffer("x", x)
    m.register_buffer("pair", pair)
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "step": 7}, buf)
    buf.seek(0)
    ck = torch.load(buf)  # torch's default: weights_only=True
    sd = ck["model"]
    assert ck["step"] == 7 and torch.equal(sd["lin.weight"], m.lin.weight)
    _assert_same(sd["x"], x)
    _assert_same(sd["pair"], pair)
    for a, c in zip(sd["pair"].unbind(), x.unbind()):
        assert_close(a, c.unsqueeze(-2) * c.unsqueeze(-3), "pair")
    # tensors saved together keep their shared extent: the pair's j0 is the loaded x's j0
    assert sd["pair"].shape[1] == sd["pair"].shape[2] == sd["x"].shape[1]
    assert sd["x"].shape[1] != x.shape[1]  # new offsets, new nested int (as torch.jagged)
    out = sd["pair"].sum(dim=2) + sd["x"]  # structures line up after loading
    for o, c in zip(out.unbind(), x.unbind()):
        assert_close(o, (c.unsqueeze(-2) * c.unsqueeze(-3)).sum(1) + c, "pair.sum(2) + x")
    # documented limitation: load_state_dict compares shapes, and the nested ints differ; set the
    # buffers instead
    with pytest.raises(RuntimeError, match="size mismatch"):
        m.load_state_dict(sd)
    m.x, m.pair = sd["x"], sd["pair"]
    assert m.state_dict()["pair"].shape[1] == sd["x"].shape[1]


def _side_effect(*args):
    raise AssertionError("weights_only=True ran an arbitrary global")


class _Unsafe:
    def __reduce__(self):
        return (_side_effect, ())


def test_weights_only_stays_safe():
    # only the rebuild function and the class are allowlisted, nothing else of the package
    from torch_multijagged import tensor as tensor_module

    ours = {g for g in torch.serialization.get_safe_globals() if getattr(g, "__module__", "").startswith("torch_multijagged")}
    assert ours == {tensor_module._rebuild, MultiJaggedTensor}
    buf = io.BytesIO()
    torch.save({"x": mj.nested_tensor([torch.ones(1, 2)]), "evil": _Unsafe()}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="_side_effect"):
        torch.load(buf, weights_only=True)


# ----------------------------------------------------------------------------- tampered files
class _Forged:
    """Pickles as a MultiJaggedTensor with the given ``_rebuild`` arguments and state, the way an
    edited file would."""

    def __init__(self, args, state=None):
        self.args, self.state = args, state or {}

    def __reduce_ex__(self, proto):
        from torch_multijagged import tensor as tensor_module

        return (torch._tensor._rebuild_from_type_v2, (tensor_module._rebuild, MultiJaggedTensor, self.args, self.state))


def _args(x):
    _, (_, _, args, _) = x.__reduce_ex__(2)
    return list(args)


def _seq():  # (3, j0, 2): sizes [3, 0, 2], 5 rows, offsets [0, 3, 3, 5]
    return mj.nested_tensor([torch.randn(3, 2), torch.randn(0, 2), torch.randn(2, 2)])


def _rect_pair():  # (2, j0, j1, 1): sizes [[2, 3], [1, 2]], 8 rows, offsets [0, 6, 8]
    return mj.nested_tensor([torch.randn(2, 3, 1), torch.randn(1, 2, 1)])


def _sq_pair():  # (2, j0, j0, 1): sizes [[2, 2], [1, 1]], 5 rows, offsets [0, 4, 5]
    return mj.nested_tensor([torch.randn(2, 2, 1), torch.randn(1, 1, 1)])


def _edit(make, **edits):
    """``make()``'s arguments with some replaced: values, offsets, extents, ragged_dims, requires_grad."""
    def forge():
        a = _args(make())
        names = ["values", "offsets", "extents", "ragged_dims", "requires_grad"]
        for k, v in edits.items():
            i = names.index(k)
            a[i] = v(a[i]) if callable(v) else v
        return _Forged(tuple(a))
    return forge


T = torch.tensor
TAMPERED = {
    # row offsets edited to disagree with the extents' sizes (the values' row count unchanged)
    "pair offsets vs sizes": _edit(_rect_pair, offsets=T([0, 5, 8])),  # 5 ≠ 2·3
    "square offsets vs sizes": _edit(_sq_pair, offsets=T([0, 3, 5])),  # 3 ≠ 2·2
    # an extent edited: its sizes no longer multiply to the row offsets
    "extent vs offsets": _edit(_rect_pair, extents=lambda e: (e[0], T([0, 2, 4]))),  # (2, 2), (1, 2): 4 + 2 ≠ 6 + 2
    "square extent split": _edit(_sq_pair, extents=lambda e: (e[0], T([0, 2, 3]))),  # same sizes, no longer one extent: still consistent?
    "seq offsets past values": _edit(_seq, offsets=T([0, 3, 3, 6]), extents=lambda e: (T([0, 3, 3, 6]),)),
    "seq offsets decreasing": _edit(_seq, offsets=T([0, 3, 2, 5]), extents=lambda e: (T([0, 3, 2, 5]),)),
    "seq offsets not at 0": _edit(_seq, offsets=T([1, 3, 3, 5]), extents=lambda e: (T([1, 3, 3, 5]),)),
    "seq extent vs offsets": _edit(_seq, extents=(T([0, 2, 2, 5]),)),  # sizes [2, 0, 3] vs rows [3, 0, 2]
    "values rows dropped": _edit(_seq, values=lambda v: v[:4].clone()),
    "values rows added": _edit(_rect_pair, values=lambda v: torch.cat([v, v[:1]])),
    "extent batch differs": _edit(_rect_pair, extents=lambda e: (e[0], T([0, 3, 5, 5]))),
    "offsets float": _edit(_seq, offsets=T([0.0, 3, 3, 5]), extents=lambda e: (T([0.0, 3, 3, 5]),)),
    "offsets 2-D": _edit(_seq, offsets=T([[0, 3], [3, 5]])),
    "offsets empty": _edit(_seq, offsets=T([], dtype=torch.int64), extents=lambda e: (T([], dtype=torch.int64),)),
    "ragged_dims 0": _edit(_seq, ragged_dims=(0,)),
    "ragged_dims past the end": _edit(_seq, ragged_dims=(3,)),
    "ragged_dims unsorted": _edit(_rect_pair, ragged_dims=(2, 1)),
    "ragged_dims count": _edit(_rect_pair, ragged_dims=(1,)),
    "ragged_dims float": _edit(_seq, ragged_dims=(1.0,)),
    "ragged_dims list": _edit(_seq, ragged_dims=[1]),
    "extents not a tuple": _edit(_seq, extents=lambda e: list(e)),
    "extent not a tensor": _edit(_seq, extents=((0, 3, 3, 5),)),
    "values 0-dim": _edit(_seq, values=T(1.0)),
    "values not a tensor": _edit(_seq, values=(1.0, 2.0)),
    "requires_grad int": _edit(_seq, requires_grad=1),
    "requires_grad on ints": _edit(_seq, values=lambda v: v.long(), requires_grad=True),
}
# not tampering: two equal-sized extents stored separately are a rectangular pair (j0, j1)
del TAMPERED["square extent split"]

TAMPERED_STATE = {
    "state replaces values": {"_values": torch.zeros(7, 2)},
    "state replaces partition": {"_partition": None},
    "state shadows offsets()": {"offsets": torch.tensor([0, 1, 2, 3])},
    "state shadows sizes()": {"sizes": torch.tensor([1, 1, 1])},
    "state not a dict": [1, 2],
}

LOADS = {
    "weights_only": lambda o: _save_load(o, weights_only=True),
    "full": _save_load,
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
}


@pytest.mark.parametrize("load", LOADS, ids=str)
def test_forged_file_of_a_valid_tensor_loads(load):
    # the forger itself is sound: unedited arguments load (so the tampered cases test the checks)
    for make in (_seq, _rect_pair, _sq_pair):
        x = make()
        y = LOADS[load](_Forged(tuple(_args(x))))
        _assert_same(y, x)
    a = _args(_sq_pair())
    y = LOADS[load](_Forged((a[0], a[1], (a[2][0], a[2][0].clone()), a[3], a[4])))
    assert y.shape[1] != y.shape[2]  # two extents stored separately: a rectangular pair


@pytest.mark.parametrize("load", LOADS, ids=str)
@pytest.mark.parametrize("case", TAMPERED, ids=str)
def test_tampered_file_raises(case, load):
    with pytest.raises(ValueError, match=r"^torch\.load\(\): invalid multi_jagged tensor in file: "):
        LOADS[load](TAMPERED[case]())


class _ForgedSubclass:
    """A plain tensor rebuilt by another allowlisted function and turned into the class."""

    def __reduce_ex__(self, proto):
        inner = (torch.zeros(3), torch.float32, "cpu", False)
        return (torch._tensor._rebuild_from_type_v2,
                (torch._utils._rebuild_device_tensor_from_cpu_tensor, MultiJaggedTensor, inner, {}))


@pytest.mark.parametrize("load", LOADS, ids=str)
def test_class_with_another_rebuild_function_raises(load):
    with pytest.raises(ValueError, match="not built by its own rebuild function"):
        LOADS[load](_ForgedSubclass())


@pytest.mark.parametrize("load", LOADS, ids=str)
@pytest.mark.parametrize("case", TAMPERED_STATE, ids=str)
def test_tampered_state_raises(case, load):
    forged = _Forged(tuple(_args(_seq())), TAMPERED_STATE[case])
    with pytest.raises(ValueError, match=r"^torch\.load\(\): "):
        LOADS[load](forged)


def test_tampered_offsets_are_caught_before_ops_disagree():
    # a tampered file: offsets edited to disagree with sizes used to load, and then unbind, sum
    # and to_padded_tensor gave three different answers
    x = _rect_pair()
    a = _args(x)
    a[1] = torch.tensor([0, 5, 8])
    with pytest.raises(ValueError, match="offsets disagree with sizes"):
        _save_load(_Forged(tuple(a)))


# ----------------------------------------------------------------------------- deepcopy
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_deepcopy_has_its_own_nested_ints(case):
    x, comps = _cases()[case]
    x.shape  # noqa: B018
    y = copy.deepcopy(x)
    _assert_same(y, x)
    assert y.offsets() is not x.offsets() and y.values().data_ptr() != x.values().data_ptr()
    for d in x.ragged_dims:
        assert y.shape[d] != x.shape[d]  # new offsets, so new nested ints…
    # …and the copy's shape agrees with its own structure: structure-creating ops agree with it
    assert y.unsqueeze(-1).shape[: y.dim()] == y.shape
    assert torch.nn.functional.linear(y, torch.ones(2, y.shape[-1], dtype=y.dtype)).shape[:-1] == y.shape[:-1]
    # gradients reach the copy through every kind of op (values() used to fail: "invalid gradient")
    cots = [torch.randn_like(c) for c in comps]
    for name, f in {
        "values": lambda t: t.values(),
        "unbind": lambda t: torch.cat([c.flatten() for c in t.unbind()]),
        "linear": lambda t: torch.nn.functional.linear(t, torch.eye(t.shape[-1], dtype=t.dtype)).values(),
        "reduce": lambda t: t.sum(dim=t.ragged_dims[-1]),
    }.items():
        (g,) = torch.autograd.grad(f(y).sum(), y)
        for i, (gi, c) in enumerate(zip(g.unbind(), comps)):
            assert_close(gi, torch.ones_like(c), f"{name}: grad of sample {i}")  # d(Σ y)/dy = 1
    (g,) = torch.autograd.grad(sum((a * k).sum() for a, k in zip(y.unbind(), cots)), y)
    for i, (gi, k) in enumerate(zip(g.unbind(), cots)):
        assert_close(gi, k, f"grad of sample {i}")
    y.sum().backward()
    assert x.grad is None and y.grad is not None


def test_deepcopy_square_pair_keeps_one_nested_int_and_sharing():
    x = mj.nested_tensor([torch.randn(3, 2), torch.randn(0, 2), torch.randn(1, 2)])
    pair = x.unsqueeze(-2) + x.unsqueeze(-3)  # carries x's j0 on both dims
    x2, pair2 = copy.deepcopy((x, pair))
    assert pair2.shape[1] == pair2.shape[2] == x2.shape[1] != x.shape[1]
    out = pair2.sum(dim=2) + x2  # the copies still combine as the originals did
    for o, c in zip(out.unbind(), x.unbind()):
        assert_close(o, (c.unsqueeze(-2) + c.unsqueeze(-3)).sum(1) + c, "pair.sum(2) + x")


def test_deepcopy_of_a_non_leaf_raises_as_dense():
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)], requires_grad=True)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)  # dense torch
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


def test_deepcopy_copies_grad_and_attributes():
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)], requires_grad=True)
    (x * 3).sum().backward()
    x.note = ["a"]
    y = copy.deepcopy(x)
    assert y.grad is not None and y.grad.shape == y.shape  # the grad follows the copy's nested int
    assert [g.tolist() for g in y.grad.unbind()] == [[[3.0] * 3] * 2, []]  # d(3x)/dx = 3
    assert y.note == ["a"] and y.note is not x.note
    (y * 2).sum().backward()  # accumulates onto the copied grad
    assert [g.tolist() for g in y.grad.unbind()] == [[[5.0] * 3] * 2, []]  # = 3 + 2
    assert [g.tolist() for g in x.grad.unbind()] == [[[3.0] * 3] * 2, []]


def test_deepcopy_is_independent():
    x = mj.nested_tensor([torch.ones(2, 3), torch.zeros(0, 3)])
    y = copy.deepcopy(x)
    y.fill_(5.0)
    assert x.unbind()[0].tolist() == [[1.0] * 3] * 2


# ----------------------------------------------------------------------------- conversions
def test_to_dtype_and_device():
    x = mj.nested_tensor([torch.tensor([[1.5, 2.5]]), torch.zeros(0, 2)], requires_grad=True)
    y = x.to(torch.float64)
    assert isinstance(y, MultiJaggedTensor) and y.dtype == torch.float64 and y.values().dtype == torch.float64
    assert y.shape == x.shape and y.shape[1] == x.shape[1]  # same device: same nested int
    assert [c.tolist() for c in y.unbind()] == [[[1.5, 2.5]], []]
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and [g.tolist() for g in x.grad.unbind()] == [[[1.0, 1.0]], []]
    z = x.to(torch.int64)
    assert [c.tolist() for c in z.unbind()] == [[[1, 2]], []]  # = trunc(1.5), trunc(2.5)
    assert x.to("cpu").device.type == "cpu" and x.to("cpu").shape == x.shape
    assert x.double().dtype == torch.float64 and x.half().dtype == torch.float16


def test_clone_detach_contiguous_requires_grad():
    x = _pair()
    c = x.clone()
    assert isinstance(c, MultiJaggedTensor) and c.shape == x.shape and c.shape[1] == x.shape[1]
    assert c.values().data_ptr() != x.values().data_ptr()
    c.fill_(1.0)
    assert x.values().abs().sum() == 0  # clone does not alias
    assert x.is_contiguous() and x.contiguous().shape == x.shape
    y = x.requires_grad_()
    assert y is x and x.requires_grad and x.is_leaf
    d = (x * 3).detach()
    assert isinstance(d, MultiJaggedTensor) and not d.requires_grad and d.shape == x.shape
    (x * 3).sum().backward()
    assert [g.tolist() for g in x.grad.unbind()][0] == [[[3.0] * 3] * 2] * 2  # d(3x)/dx = 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_to_another_device_and_back():
    x = _pair()
    y = x.to("cuda")
    assert y.device.type == "cuda" and y.offsets().device.type == "cuda"
    assert torch.equal(y.sizes(), x.sizes()) and y.ragged_dims == x.ragged_dims
    assert y.shape[1] == y.shape[2]  # extent sharing survives the move
    z = y.cpu()
    for a, b in zip(z.unbind(), x.unbind()):
        assert torch.equal(a, b)
