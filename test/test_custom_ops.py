"""Every ``multijagged::`` op passes ``torch.library.opcheck`` on its dense definition (schema,
fake impl, autograd registration, AOT dispatch) — compile/library.py."""

import pytest
import torch

import torch_multijagged  # noqa: F401  (defines the ops)

mj = torch.ops.multijagged


def _x(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


CASES = {
    "linear": lambda: (mj.linear.default, (_x(3, 4, 5), _x(2, 5), _x(2))),
    "linear_no_bias": lambda: (mj.linear.default, (_x(3, 4, 5), _x(2, 5), None)),
    "linear_param_grads": lambda: (mj.linear_param_grads.default, (_x(3, 4, 2, grad=False), _x(3, 4, 5, grad=False), True, True)),
    "unbind": lambda: (mj.unbind.default, (_x(3, 4),)),
    "pack_like": lambda: (mj.pack_like.default, ([_x(4), None, _x(4)], _x(3, 4, grad=False))),
    "to_padded": lambda: (mj.to_padded.default, (_x(2, 3), 0.0, [2, 5])),
    "from_padded_like": lambda: (mj.from_padded_like.default, (_x(2, 5), _x(2, 3, grad=False))),
    "reduce_sum": lambda: (mj.reduce.default, (_x(3, 4), "sum", [1], False)),
    "reduce_mean_keepdim": lambda: (mj.reduce.default, (_x(3, 4), "mean", [0], True)),
    "reduce_amax": lambda: (mj.reduce.default, (_x(3, 4), "amax", [1], False)),
    "reduce_prod": lambda: (mj.reduce.default, (_x(3, 4), "prod", [0, 1], False)),
    "reduce_logsumexp": lambda: (mj.reduce.default, (_x(3, 4), "logsumexp", None, False)),
    "reduce_backward": lambda: (
        mj.reduce_backward.default,
        (_x(3, grad=False), _x(3, 4, grad=False), _x(3, grad=False), "sum", [1], False),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name):
    op, args = CASES[name]()
    torch.library.opcheck(op, args)
