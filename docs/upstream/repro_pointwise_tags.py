"""Elementwise aten ops without ``torch.Tag.pointwise``.

A layout implements every elementwise op at once by checking ``torch.Tag.pointwise in
func.tags``. These elementwise overloads lack the tag, although their siblings carry it
(``rsub.Scalar``, ``threshold_backward``, ``sigmoid_backward``, ``gelu_backward`` are tagged):
``x // 2`` and ``F.hardswish`` reach them. (Conversely ``aten.equal`` is tagged pointwise
although it returns a bool.)
"""
import torch
from _repro import case, report

aten = torch.ops.aten
UNTAGGED = [
    aten.floor_divide.default, aten.floor_divide.Scalar, aten.floor_divide_.Tensor, aten.floor_divide_.Scalar,
    aten.hardswish.default, aten.hardswish_.default, aten.rsub.Tensor,
    aten.leaky_relu_backward.default, aten.hardtanh_backward.default, aten.elu_backward.default,
    aten.softplus_backward.default, aten.hardsigmoid_backward.default, aten.hardswish_backward.default,
    aten.mish_backward.default, aten.softshrink_backward.default, aten.hardshrink_backward.default,
    aten._masked_scale.default, aten.log_sigmoid_backward.default,
]


def all_tagged():
    missing = [str(op) for op in UNTAGGED if torch.Tag.pointwise not in op.tags]
    if missing:
        return f"untagged: {', '.join(missing)}"


case("pointwise tag on elementwise overloads", all_tagged, "untagged")
report()
