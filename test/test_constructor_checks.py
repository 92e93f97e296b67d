"""What the constructors check (constructors.py): host checks that run whatever ``validate=``
says, ``ragged_dims`` and ``lengths`` that must be integers, the exact bounds of ``from_padded``,
and zero-size static dims through the padded conversions. What loading checks is in
test_serialization.py."""

import pytest
import torch

import torch_multijagged as mj

from _reference import assert_close, build
from test_constructors import expected_padded


# ----------------------------------------------------------------------------- from_packed
# Host checks that run whatever validate= says: the sizes are on the host already.
HOST_CHECKS = {
    "negative size": (torch.zeros(0, 2), [[-1]], (1,), "sizes must be non-negative"),
    "negative size pair": (torch.zeros(1, 2), [[-1, -1]], (1, 2), "sizes must be non-negative"),
    "rows vs sizes": (torch.zeros(5, 2), [[3], [0], [1]], (1,), "4 packed rows.*values have 5"),  # 3 + 0 + 1
    "rows vs pair sizes": (torch.zeros(7, 1), [[2, 3], [1, 2]], (1, 2), "8 packed rows.*values have 7"),  # 2·3 + 1·2
}
DEVICES = [
    "cpu",
    # offsets whose data cannot be read for free: what validate=False skips (meta stands in for
    # an accelerator on a CPU-only machine)
    "meta",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("case", HOST_CHECKS, ids=str)
def test_from_packed_host_checks_run_without_validate(case, validate, device):
    values, sizes, rd, msg = HOST_CHECKS[case]
    sizes = torch.tensor(sizes)
    # offsets that agree with the (wrong) sizes: only the sizes / the row count can tell
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.prod(1).cumsum(0)])
    with pytest.raises(ValueError, match=f"^from_packed\\(\\): .*({msg}|offsets must end)"):
        mj.from_packed(values.to(device), offsets.to(device), sizes, ragged_dims=rd, validate=validate)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_from_packed_device_offsets_are_checked_only_when_validating():
    # sizes and row count agree; only the device offsets are wrong (rows per sample [2, 1, 2])
    v, sizes = torch.zeros(5, 2, device="cuda"), torch.tensor([3, 0, 2])
    bad = torch.tensor([0, 2, 3, 5], device="cuda")
    mj.from_packed(v, bad, sizes)  # validate=False: no device sync, the offsets are trusted
    with pytest.raises(ValueError, match="from_packed.*offsets disagree with sizes"):
        mj.from_packed(v, bad, sizes, validate=True)


def test_from_packed_offsets_on_meta_skip_the_data_checks_only():
    # no data to read on the meta device: the offsets checks cannot run, the host checks still do
    v = torch.zeros(5, 2, device="meta")
    x = mj.from_packed(v, torch.zeros(4, dtype=torch.int64, device="meta"), torch.tensor([3, 0, 2]))
    assert x.sizes().tolist() == [[3], [0], [2]]
    with pytest.raises(ValueError, match="from_packed.*packed rows"):
        mj.from_packed(v, torch.zeros(4, dtype=torch.int64, device="meta"), torch.tensor([3, 0, 1]))


def test_from_packed_rejects_nested_inputs():
    x = mj.nested_tensor([torch.zeros(3, 2), torch.zeros(2, 2)])
    off, sizes = torch.tensor([0, 3, 5]), torch.tensor([3, 2])
    with pytest.raises(TypeError, match="from_packed.*values.*multi_jagged"):
        mj.from_packed(x, off, sizes)
    with pytest.raises(TypeError, match="from_packed.*values.*nested"):
        mj.from_packed(torch.nested.nested_tensor([torch.zeros(3, 2)], layout=torch.jagged), off, sizes)
    ok = mj.from_packed(x.values(), off, sizes)  # what the user meant
    assert [c.shape for c in ok.unbind()] == [(3, 2), (2, 2)]


# ----------------------------------------------------------------------------- ragged_dims
def _ctors(rd):
    """Each constructor with ``ragged_dims=rd`` on the batch [(3, 2), (0, 2)] (or its padded form)."""
    comps = [torch.arange(6.0).reshape(3, 2), torch.zeros(0, 2)]
    return {
        "nested_tensor": lambda: mj.nested_tensor(comps, ragged_dims=rd),
        "as_nested_tensor": lambda: mj.as_nested_tensor(comps, ragged_dims=rd),
        "from_packed": lambda: mj.from_packed(comps[0], torch.tensor([0, 3, 3]), torch.tensor([3, 0]), ragged_dims=rd),
        "from_padded": lambda: mj.from_padded(torch.stack([comps[0], torch.ones(3, 2)]), torch.tensor([3, 0]), ragged_dims=rd),
    }


@pytest.mark.parametrize("ctor", list(_ctors(1)), ids=str)
def test_bare_int_ragged_dims_is_one_dim(ctor):
    # as torch's dim= arguments: an int is the one-element tuple
    x, y = _ctors(1)[ctor](), _ctors((1,))[ctor]()
    assert x.ragged_dims == y.ragged_dims == (1,)
    assert [c.tolist() for c in x.unbind()] == [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], []]


@pytest.mark.parametrize("bad", [1.5, (1.5,), (1.0,), (True,), True, "1", (1, 2.0), torch.tensor([1])], ids=repr)
@pytest.mark.parametrize("ctor", list(_ctors(1)), ids=str)
def test_non_integer_ragged_dims_raise(ctor, bad):
    # 1.5 must not silently become dim 1
    with pytest.raises(TypeError, match=rf"^{ctor}\(\): expected ragged_dims"):
        _ctors(bad)[ctor]()




# ----------------------------------------------------------------------------- from_padded
@pytest.mark.parametrize("lengths", [torch.tensor([1.5, 2.0]), [1.5, 2.0], torch.tensor([2.0, 1.0]), torch.tensor([True, False])],
                         ids=["float", "float list", "integral floats", "bool"])
def test_from_padded_lengths_must_be_integers(lengths):
    # 1.5 must not silently become 1
    with pytest.raises(TypeError, match="^from_padded\\(\\): expected lengths of an integer dtype"):
        mj.from_padded(torch.zeros(2, 3, 4), lengths)


# (padded component shape, ragged dims): every ragged dim of the four layouts and of three ragged dims
EXACT = {
    "seq": ((4, 2), (1,)),
    "square": ((4, 4, 2), (1, 2)),
    "rect": ((4, 5, 2), (1, 2)),
    "static_lead": ((3, 4, 2), (2,)),
    "three ragged": ((3, 4, 2, 2), (1, 2, 3)),
}


@pytest.mark.parametrize("case", EXACT, ids=str)
def test_from_padded_length_check_is_exact(case):
    shape, rd = EXACT[case]
    padded = torch.randn(3, *shape, dtype=torch.float64, requires_grad=True)
    for k, d in enumerate(rd):
        full = padded.shape[d]
        lengths = torch.tensor([[1] * len(rd), [0] * len(rd), [2] * len(rd)])
        lengths[2, k] = full  # a sample that fills dim d exactly: accepted
        x = mj.from_padded(padded, lengths, ragged_dims=rd)
        for i, c in enumerate(x.unbind()):
            idx = [slice(None)] * (len(shape))
            for j, e in enumerate(rd):
                idx[e - 1] = slice(0, int(lengths[i, j]))
            assert_close(c, padded[i][tuple(idx)], f"{case} dim {d} sample {i}")  # the valid region of sample i
        (g,) = torch.autograd.grad(x.values().sum(), padded)
        assert g.sum().item() == sum(c.numel() for c in x.unbind())  # ones in the valid region, zeros elsewhere
        lengths[2, k] = full + 1  # one past the padded size: rejected
        with pytest.raises(ValueError, match=rf"^from_padded\(\): lengths along dim {d} must lie in \[0, {full}\]"):
            mj.from_padded(padded, lengths, ragged_dims=rd)


# Zero-size static dims: (component shapes, ragged dims). reshape(-1, …) is ambiguous on 0 elements.
ZERO_STATIC = {
    "(B, j0, 0)": ([(3, 0), (0, 0), (2, 0)], (1,)),
    "(B, j0, 0, 2)": ([(3, 0, 2), (0, 0, 2), (2, 0, 2)], (1,)),
    "(B, 0, j0)": ([(0, 3), (0, 0), (0, 1)], (2,)),
    "(B, j0, j0, 0)": ([(2, 2, 0), (0, 0, 0), (1, 1, 0)], (1, 2)),
    "(B, j0, j1, 0)": ([(2, 3, 0), (0, 1, 0), (1, 0, 0)], (1, 2)),
}


@pytest.mark.parametrize("case", ZERO_STATIC, ids=str)
def test_zero_size_static_dim_padded_round_trip(case):
    shapes, rd = ZERO_STATIC[case]
    comps = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    x, leaves = build(comps, rd, requires_grad=True)
    out = torch.nested.to_padded_tensor(x, 3.0)
    assert_close(out, expected_padded(comps, 3.0), "to_padded_tensor")
    grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)  # raised in backward
    for g, c in zip(grads, comps):
        assert g is None or g.shape == c.shape
    padded = expected_padded(comps, 0.0).requires_grad_()
    lengths = torch.tensor([[s[d - 1] for d in rd] for s in shapes])
    y = mj.from_padded(padded, lengths, ragged_dims=rd)  # raised in forward
    assert y.ragged_dims == rd and [tuple(c.shape) for c in y.unbind()] == shapes
    (gp,) = torch.autograd.grad(y.values().sum(), padded, allow_unused=True)
    assert gp is None or gp.shape == padded.shape
    back = torch.nested.to_padded_tensor(y, 0.0)
    assert_close(back, padded.detach(), "to_padded_tensor(from_padded(p))")


def test_components_of_mixed_dtypes_raise_a_runtime_error_as_torch_jagged():
    comps = [torch.zeros(2), torch.zeros(3, dtype=torch.float64)]
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.nested.nested_tensor(comps, layout=torch.jagged)
    for make in (mj.nested_tensor, mj.as_nested_tensor):
        with pytest.raises(RuntimeError, match="one dtype and device"):
            make(comps)


def test_take_along_dim_takes_int64_indices_only():
    x = mj.nested_tensor([torch.randn(3, 2), torch.randn(2, 2)])
    i32 = mj.nested_tensor([torch.zeros(3, 2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)])
    with pytest.raises(RuntimeError, match="dtype of indices should be Long but got Int$"):
        torch.take_along_dim(x, i32, 1)
    assert torch.take_along_dim(x, i32.long(), 1).shape[0] == 2
