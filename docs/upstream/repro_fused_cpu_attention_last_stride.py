"""torch's fused CPU attention kernel reads the head dim as contiguous whatever its stride.

``aten._scaled_dot_product_flash_attention_for_cpu`` on a query whose last dim has stride 2
(``q[..., ::2]``) reads the elements as if the stride were 1: the output is not attention over
the elements the view shows. ``F.scaled_dot_product_attention`` makes the last dim contiguous
before calling it, so only direct callers of the aten op (a ragged layout's padded buckets) see
it. Fixed when the kernel honours the stride (or refuses the input).
"""
import torch
import torch.nn.functional as F
from _repro import case, control, report

q = (torch.arange(16.0).view(1, 1, 2, 8) * 0.1)[..., ::2]  # last-dim stride 2
want = F.scaled_dot_product_attention(q.contiguous(), q.contiguous(), q.contiguous())

control("the public function", lambda: torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q), want))


def strided_last_dim():
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, False)[0]
    if not torch.allclose(out, want):
        return f"wrong output: max error {(out - want).abs().max().item():.3g} for a stride-2 head dim"


case("a strided head dim", strided_last_dim, "wrong output")
report()
