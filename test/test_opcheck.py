"""Every ``multijagged::`` custom op under ``torch.library.opcheck``: its schema, its autograd
registration, its fake impl and its AOT dispatch with dynamic shapes, one test per op and check.

``SAMPLES`` gives each op's representative inputs (plain tensors: a dense tensor is a multi_jagged
tensor with no ragged dims, NOTE [ Why custom ops ] in ``compile/library.py``; packed rows with
offsets for the packed kernels), with a zero-length sample where the op takes segments.
``test_every_op_is_checked`` imports every module of the package and fails for a registered op
without an entry: a new op gets one here.

The Triton ops run where the kernels can: on CUDA, else in Triton's interpreter on CPU tensors
(conftest sets ``TRITON_INTERPRET=1``). Two checks cannot pass for a principled reason and are
expected failures, each asserted to fail for that reason and no other (``EXPECTED_FAILURES``):

* the fake-tensor and AOT-dispatch checks of a Triton op in the interpreter: a ``triton_op``'s
  fake impl is its launcher, and ``wrap_triton`` hands the interpreter's kernel back instead of
  recording the launch, so the interpreter runs on fake tensors (it reads their data);
* the AOT-dispatch check of a backward op without a derivative of its own: it differentiates
  the op, and a double backward through attention or the fused LayerNorm raises by design (as
  for dense SDPA's fused kernels; NOTE [ Double backward ] in ``compile/library.py``). The op
  itself is traced in its forward op's check.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import traceback

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch_multijagged  # noqa: E402
from torch.testing._internal.optests.generate_tests import OpCheckError  # noqa: E402
from torch_multijagged.kernels import reference as ref  # noqa: E402

# every module: the Triton ops register when their module is first imported
for _m in pkgutil.walk_packages(torch_multijagged.__path__, torch_multijagged.__name__ + "."):
    importlib.import_module(_m.name)

mj = torch.ops.multijagged
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
TRITON_DEVICE = "cuda" if CUDA else "cpu"


def _x(*shape, grad=True, dtype=torch.float64, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)


def _t(*shape, grad=True):
    """A float32 tensor where the Triton kernels run."""
    return _x(*shape, grad=grad, dtype=torch.float32, device=TRITON_DEVICE)


def _cu(lengths, device="cpu"):
    return F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(device)


def _attention():
    lq, lk = [3, 0, 2], [2, 3, 0]  # a zero-length query segment and a zero-length key segment
    blocks = [a * b for a, b in zip(lq, lk)]
    q, k, v = _x(5, 2, 3), _x(5, 1, 3), _x(5, 1, 4)  # GQA: 2 query heads on 1 key head
    return q, k, v, _cu(lq), _cu(lk), _x(sum(blocks), 2), _cu(blocks)[:-1]


def _varlen_attention():
    q, k, v, cq, ck, bias, start = _attention()
    return [(q, k, v, cq, ck, 3, 3, bias, start, None, False, 0.5, 0.0),
            (q, k, v, cq, ck, 3, 3, None, None, torch.tensor([7]), True, 0.5, 0.3)]


def _varlen_attention_backward():
    q, k, v, cq, ck, bias, start = _attention()
    out, lse = mj.varlen_attention(q, k, v, cq, ck, 3, 3, bias, start, None, False, 0.5, 0.0)
    return [(_x(*out.shape), q, k, v, out.detach(), lse, cq, ck, 3, 3, bias, start, None, False, 0.5, 0.0, True)]


def _dense_attention():
    return _x(2, 4, 3, 5), _x(2, 2, 6, 5), _x(2, 2, 6, 4), _x(1, 4, 3, 6)  # q, k, v (GQA heads at -3), mask


def _sdpa():
    q, k, v, m = _dense_attention()
    return [(q, k, v, m, None, False, 0.4, 0.0), (q, k, v, None, torch.tensor([5]), True, 0.4, 0.2)]


def _sdpa_backward():
    q, k, v, m = _dense_attention()
    out, lse = mj.sdpa(q, k, v, m, None, False, 0.4, 0.0)
    return [(_x(*out.shape), q, k, v, m, None, out.detach(), lse, False, 0.4, 0.0, True)]


def _pairs(device="cpu"):
    """Packed square pairs of sizes 3, 0, 2: offsets, lengths, rows."""
    n = torch.tensor([3, 0, 2])
    off = F.pad((n * n).cumsum(0), (1, 0))
    return off.to(device), n.to(device), int(off[-1])


def _pair_matmul_packed():
    off, n, rows = _pairs()
    return [(_x(rows, 4), _x(rows, 4), off, n, False, True), (_x(rows, 4), _x(rows, 4), off, n, True, False)]


def _pair_matmul_triton():
    off, n, rows = _pairs(TRITON_DEVICE)
    return [(_t(rows, 4), _t(rows, 4), off, n, 3, False, True)]


_CONV_W = (4, 1, 3, 3)  # 4 output channels, 2 groups of 1 input channel, 3 × 3
_SIZES = [[4, 5], [3, 3], [0, 2]]  # per-sample image sizes, one empty image
_ROWS = 29  # Σ h·w


def _spatial_conv_rows():
    sizes = torch.tensor(_SIZES)
    return [(_x(_ROWS, 2), sizes, _x(*_CONV_W), _x(4), [1, 1, 1, 1], [1, 1], 2),
            (_x(_ROWS, 2), sizes, _x(3, 2, 2, 3), None, [1, 0, 2, 2], [1, 2], 1)]


def _spatial_conv_rows_param_grads():
    sizes = torch.tensor(_SIZES)
    return [(_x(_ROWS, 4), _x(_ROWS, 2), sizes, _x(*_CONV_W), [1, 1, 1, 1], [1, 1], 2, True, True)]


def _segments():
    """Values (9, 3) and an unsorted index into 4 segments, segment 1 empty."""
    return _t(9, 3), torch.tensor([0, 2, 2, 3, 0, 0, 3, 2, 0], device=TRITON_DEVICE)


def _segment_reduce_triton():
    v, index = _segments()
    kinds = (("sum", 0.0), ("mean", float("nan")), ("amax", -5.0), ("amin", 5.0), ("logsumexp", float("-inf")))
    return [(v, index, 4, kind, empty) for kind, empty in kinds]


def _segment_softmax_backward_triton():
    v, index = _segments()
    return [(_t(9, 3), mj.segment_softmax_triton(v.detach(), index, 4, log), index, 4, log) for log in (False, True)]


def _pair_rows():
    """Row maps of the rectangular pair (B, j_n, j_m) with n = (2, 0, 3), m = (1, 2, 2)."""
    ns, ms = torch.tensor([2, 0, 3]), torch.tensor([1, 2, 2])
    sizes, off = torch.stack([ns, ms], 1), _cu(ns * ms)
    rows = int(off[-1])
    li = ref.row_map(off, sizes, rows, (0,), _cu(ns)).to(TRITON_DEVICE)
    ri = ref.row_map(off, sizes, rows, (1,), _cu(ms)).to(TRITON_DEVICE)
    return _t(5, 4), _t(5, 4), li, ri, rows


def _pair_combine_triton_backward():
    left, right, li, ri, rows = _pair_rows()
    return [(_t(rows, 4), left, right, li, ri, "mul", True, True), (_t(rows, 4), left, right, li, ri, "sub", True, False)]


def _pair_add_layer_norm_triton():
    left, right, li, ri, _ = _pair_rows()
    return [(left, right, li, ri, _t(4), _t(4), 1e-5), (left, right, li, ri, None, None, 1e-5)]


def _pair_add_layer_norm_triton_backward():
    left, right, li, ri, rows = _pair_rows()
    w, b = _t(4), _t(4)
    _, mean, rstd = mj.pair_add_layer_norm_triton(left, right, li, ri, w, b, 1e-5)
    return [(_t(rows, 4), left, right, li, ri, w, b, mean, rstd, True, True, True, True)]


def _padded():
    """Offsets, per-sample extents (B, 2) and rows of a rectangular partition with an empty sample."""
    sizes = torch.tensor([[2, 3], [0, 2], [3, 1]])
    off = _cu(sizes.prod(1))
    return off.to(TRITON_DEVICE), sizes.to(TRITON_DEVICE), int(off[-1])


def _to_padded_triton():
    off, sizes, rows = _padded()
    return [(_t(rows, 4), off, sizes, [3, 4], -1.0)]  # an envelope wider than the largest sample


def _from_padded_triton():
    off, sizes, rows = _padded()
    return [(_t(3, 3, 3, 4), off, sizes, rows)]


# op name: () -> list of argument tuples
SAMPLES = {
    # compile/library.py
    "linear": lambda: [(_x(3, 4, 5), _x(2, 5), _x(2)), (_x(3, 4, 5), _x(2, 5), None)],
    "linear_param_grads": lambda: [(_x(3, 4, 2), _x(3, 4, 5), True, True), (_x(3, 4, 2), _x(3, 4, 5), False, True)],
    "unbind": lambda: [(_x(3, 4),)],
    "pack_like": lambda: [([_x(4), None, _x(4)], _x(3, 4, grad=False))],
    "to_padded": lambda: [(_x(2, 3), 0.0, [2, 5]), (_x(2, 3), 1.5, None)],
    "from_padded_like": lambda: [(_x(2, 5), _x(2, 3, grad=False))],
    "reduce": lambda: [(_x(3, 4), "sum", [1], False), (_x(3, 4), "mean", [0], True), (_x(3, 4), "amax", [1], False),
                       (_x(3, 4), "amin", [-1], True), (_x(3, 4), "prod", [0, 1], False),
                       (_x(3, 4), "logsumexp", None, False)],
    "reduce_backward": lambda: [(_x(3), _x(3, 4), _x(3), kind, [1], False) for kind in ("sum", "mean", "logsumexp")],
    # compile/shift.py
    "shift": lambda: [(_x(3, 5, 2), 1, 2, -1.0), (_x(3, 5, 2), 1, -7, 0.5)],
    # compile/pair_mm.py
    "pair_matmul": lambda: [(_x(2, 3, 3, 4), _x(2, 3, 3, 4), False, True), (_x(2, 3, 3, 4), _x(2, 3, 3, 4), True, False)],
    "pair_matmul_packed": _pair_matmul_packed,
    # compile/attention.py
    "sdpa": _sdpa,
    "sdpa_backward": _sdpa_backward,
    "varlen_attention": _varlen_attention,
    "varlen_attention_backward": _varlen_attention_backward,
    # compile/spatial.py
    "spatial_conv": lambda: [(_x(2, 2, 5, 6), _x(*_CONV_W), _x(4), [1, 1, 1, 1], [1, 1], 2),
                             (_x(2, 2, 7), _x(3, 2, 2), None, [1, 0], [1], 1)],
    "spatial_conv_param_grads": lambda: [(_x(2, 4, 5, 6), _x(2, 2, 5, 6), _x(*_CONV_W), [1, 1, 1, 1], [1, 1], 2, True,
                                          True)],
    "spatial_conv_rows": _spatial_conv_rows,
    "spatial_conv_rows_param_grads": _spatial_conv_rows_param_grads,
    # compile/triton_pair_mm.py
    "pair_matmul_triton": _pair_matmul_triton,
    # compile/triton_segment.py
    "segment_reduce_triton": _segment_reduce_triton,
    "segment_softmax_triton": lambda: [(*_segments(), 4, log) for log in (False, True)],
    "segment_softmax_backward_triton": _segment_softmax_backward_triton,
    # compile/triton_attention.py
    "varlen_attention_triton": lambda: [_triton_attention()[0]],
    "varlen_attention_triton_backward": lambda: [_triton_attention()[1]],
    # compile/triton_pair.py
    "pair_combine_triton": lambda: [(*_pair_rows()[:4], op) for op in ("add", "sub", "mul")],
    "pair_combine_triton_backward": _pair_combine_triton_backward,
    "pair_add_layer_norm_triton": _pair_add_layer_norm_triton,
    "pair_add_layer_norm_triton_backward": _pair_add_layer_norm_triton_backward,
    "to_padded_triton": _to_padded_triton,
    "from_padded_triton": _from_padded_triton,
}


def _triton_attention():
    """(forward args, backward args) of the Triton attention ops: float32, causal, with a bias."""
    lq, lk = [3, 0, 5], [4, 2, 5]
    blocks = [a * b for a, b in zip(lq, lk)]
    q, k, v = _t(8, 2, 8), _t(11, 1, 8), _t(11, 1, 8)
    cq, ck = _cu(lq, TRITON_DEVICE), _cu(lk, TRITON_DEVICE)
    bias, start = _t(sum(blocks), 2), _cu(blocks, TRITON_DEVICE)[:-1]
    fwd = (q, k, v, cq, ck, 5, 5, bias, start, True, 0.4)
    out, lse = mj.varlen_attention_triton(*fwd)
    bwd = (_t(*out.shape), q, k, v, out.detach(), lse, cq, ck, 5, 5, bias, start, True, 0.4, True)
    return fwd, bwd


TRITON_OPS = {name for name in SAMPLES if name.endswith(("_triton", "_triton_backward"))}
# backward ops whose own derivative raises NotImplementedError by design
NO_DOUBLE_BACKWARD = {"sdpa_backward", "varlen_attention_backward", "varlen_attention_triton_backward",
                      "pair_add_layer_norm_triton_backward"}


def _in_interpreter(err: BaseException) -> bool:
    """Whether the failure was raised from inside Triton's interpreter."""
    while err is not None:
        if any("triton/runtime/interpreter" in f.filename.replace(os.sep, "/")
               for f in traceback.extract_tb(err.__traceback__)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _double_backward_raises(err: BaseException) -> bool:
    return "double backward is not supported" in str(err)


def _expected_failure(name: str, check: str):
    """(reason, predicate on the OpCheckError) where the check cannot pass, else None."""
    if name in NO_DOUBLE_BACKWARD and check == "test_aot_dispatch_dynamic":
        return ("differentiates a backward op whose double backward raises NotImplementedError by design (as dense "
                "SDPA's fused kernels); the op is traced in its forward op's check", _double_backward_raises)
    if name in TRITON_OPS and not CUDA and check in ("test_faketensor", "test_aot_dispatch_dynamic"):
        return ("the Triton interpreter runs the kernel on fake tensors: a triton_op's fake impl is its launcher, "
                "and wrap_triton returns the interpreted kernel instead of recording the launch (passes on CUDA)",
                _in_interpreter)
    return None


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck(name, check):
    op = getattr(mj, name).default
    samples = SAMPLES[name]()
    expected = _expected_failure(name, check)
    if expected is None:
        for args in samples:
            torch.library.opcheck(op, args, test_utils=(check,))
        return
    reason, because = expected
    with pytest.raises(OpCheckError) as err:
        for args in samples:
            torch.library.opcheck(op, args, test_utils=(check,))
    assert because(err.value), f"{name}: {check} failed for another reason than expected ({reason})"
    pytest.xfail(reason)


def test_every_op_is_checked():
    """The ops checked are exactly the ``multijagged::`` ops the package registers (every module
    imported, above): a new op needs an entry in ``SAMPLES``."""
    registered = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("multijagged::")}
    assert registered == set(SAMPLES)
