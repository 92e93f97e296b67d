"""PyTorch's own ``torch.jagged`` OpInfo samples with the layout switched (``njt_opinfo.py``).

Every sample that ``torch.jagged`` gets right — its output (and, for ``backward``, the gradients
of every input that requires grad) equal to the OpInfo's per-sample reference — we must get
right too. Samples we get right are not run on ``torch.jagged`` (it is only consulted to excuse
a miss), so a test here fails exactly when we miss a sample that ``torch.jagged`` passes.
``python test/njt_opinfo.py [--backward] [-v]`` prints the parity table and what only we pass.

By default an op with many samples (the binary ufuncs have 91 each) runs every k-th of them, at
most ``AT_MOST``, from an offset that varies with the op, so that every kind of sample still runs
for some ops; ``NJT_OPINFO=all`` runs every sample of every op (about 5 minutes on one core).
"""

import os

import pytest

import njt_opinfo as N

AT_MOST = None if os.environ.get("NJT_OPINFO") == "all" else 24

FORWARD = sorted(N.OPS)
BACKWARD = sorted(name for name, op in N.OPS.items() if op.supports_autograd)


def _misses(name, backward):
    outs = N.run_op(N.OPS[name], backward=backward, lazy=True, at_most=AT_MOST)
    return [f"{o.name}: {o.ours_error}" for o in outs if o.applicable and o.njt_ok and not o.ours_ok]


@pytest.mark.parametrize("name", FORWARD)
def test_forward_matches_where_jagged_does(name):
    assert _misses(name, backward=False) == []


@pytest.mark.parametrize("name", BACKWARD)
def test_backward_matches_where_jagged_does(name):
    assert _misses(name, backward=True) == []


def test_harness_catches_a_wrong_op(monkeypatch):
    """A sample we get wrong (sin computed as cos) while torch.jagged is right is a miss."""
    import torch

    real = torch.Tensor.sin
    from torch_multijagged import MultiJaggedTensor

    def bad(x):
        return torch.cos(x) if isinstance(x, MultiJaggedTensor) else real(x)

    op = N.OPS["sin"]
    monkeypatch.setattr(op, "op", bad)
    outs = N.run_op(op, lazy=True)
    assert outs and all(o.njt_ok and not o.ours_ok for o in outs)
