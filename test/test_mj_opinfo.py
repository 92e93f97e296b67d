"""Device-generic OpInfo tests of the ``multi_jagged`` database (``mj_opinfo.py``), in PyTorch's
conventions: ``common_utils.TestCase``, ``@ops`` and ``instantiate_device_type_tests``, so the same
tests run on CUDA where one exists (and are not generated where none does).

For every entry, dtype and sample: the output equals the per-sample reference, sample by sample;
in float64 the gradients of every input (multi_jagged components and dense weights) equal the
reference's; and no sample's output depends on another sample's values (no leakage)."""

from __future__ import annotations

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_multijagged as mj
from mj_opinfo import MJSampleInput, mj_op_db

GRAD_OPS = [op for op in mj_op_db if op.supports_autograd]


def _outputs(out) -> list[torch.Tensor]:
    """One tensor per sample: a multi_jagged result unbound, a dense ``(B, …)`` one split."""
    return list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out.unbind(0))


def _inputs(sample: MJSampleInput) -> list[torch.Tensor]:
    """Every leaf a gradient must reach: the components, then the dense weights."""
    dense = [a for a in sample.args if isinstance(a, torch.Tensor) and not isinstance(a, mj.MultiJaggedTensor)]
    return [c for cs in sample.components for c in cs] + [w for w in dense if w.requires_grad]


def _run(op, sample, components=None):
    """The op on batches built here from the components: OpInfo builds samples under
    ``no_grad``, so the sample's own batches carry no graph back to the components."""
    batches = [mj.as_nested_tensor(list(cs)) for cs in (components or sample.components)]
    dense = [a for a in sample.args if not isinstance(a, mj.MultiJaggedTensor)]
    return op(*batches, *dense, **sample.kwargs)


class TestMultiJaggedOpInfo(TestCase):
    @ops(mj_op_db, allowed_dtypes=(torch.float32, torch.float64))
    def test_matches_per_sample_reference(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            with self.subTest(sample=sample.name):
                got = _outputs(_run(op, sample))
                want = op.ref(sample)
                self.assertEqual(len(got), len(want))
                for i, (a, b) in enumerate(zip(got, want)):
                    self.assertEqual(a, b, msg=f"sample {i}")

    @ops(GRAD_OPS, allowed_dtypes=(torch.float64,))
    def test_gradients_reach_every_input(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype, requires_grad=True):
            with self.subTest(sample=sample.name):
                leaves = _inputs(sample)
                got, want = _outputs(_run(op, sample)), op.ref(sample)
                g = torch.Generator().manual_seed(5)
                weights = [torch.randn(w.shape, generator=g, dtype=dtype).to(device) for w in want]
                loss_got = sum((a * w).sum() for a, w in zip(got, weights))
                loss_want = sum((b * w).sum() for b, w in zip(want, weights))
                g1 = torch.autograd.grad(loss_got, leaves, allow_unused=True)
                g2 = torch.autograd.grad(loss_want, leaves, allow_unused=True)
                for k, (a, b) in enumerate(zip(g1, g2)):
                    a = torch.zeros_like(leaves[k]) if a is None else a
                    b = torch.zeros_like(leaves[k]) if b is None else b
                    self.assertEqual(a, b, msg=f"gradient of input {k}")

    @ops(mj_op_db, allowed_dtypes=(torch.float64,))
    def test_no_leakage_between_samples(self, device, dtype, op):
        """Changing sample 0 of every multi_jagged operand leaves the other samples' outputs
        bit for bit unchanged."""
        for sample in op.sample_inputs(device, dtype):
            with self.subTest(sample=sample.name):
                before = _outputs(_run(op, sample))
                comps = [[c.detach().clone() for c in cs] for cs in sample.components]
                for cs in comps:
                    cs[0].mul_(-3.0).add_(1.0)
                after = _outputs(_run(op, sample, comps))
                for i in range(1, len(before)):
                    self.assertEqual(before[i], after[i], atol=0, rtol=0, msg=f"sample {i}")


instantiate_device_type_tests(TestMultiJaggedOpInfo, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    run_tests()
