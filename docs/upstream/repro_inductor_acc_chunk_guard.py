"""Inductor (CPU) recompiles a reduction over a dynamic dim when its length crosses 4096.

Inductor's C++ code generation picks an accumulation helper for float sums longer than its
4096-element chunk (``need_use_acc_helper`` in ``codegen/cpp.py``) by *evaluating* the symbolic
reduction length against 4096, which installs a guard (``2 <= v.size()[0] <= 4096``). A
ragged layout's packed row count (Σ nᵢ, or Σ nᵢ² for a pair) is such a dim, so a batch stream
whose rows cross 4096 compiles twice. ``aot_eager`` does not (the guard is Inductor's). Fixed
when both sizes run on one graph.
"""
import torch
import torch._inductor.config
from _repro import case, report
from torch._dynamo.testing import CompileCounterWithBackend

torch._inductor.config.compile_threads = 1  # no worker pool: faster for one tiny kernel


def one_graph_across_4096():
    counter = CompileCounterWithBackend("inductor")
    f = torch.compile(lambda v: v.sum(0), backend=counter, dynamic=True)
    for rows in (100, 5000):
        v = torch.randn(rows, 8)
        torch.testing.assert_close(f(v), v.sum(0), rtol=1e-4, atol=1e-3)
    if counter.frame_count != 1:
        reasons = [str(r).split("  #")[0] for rs in torch._dynamo.utils.guard_failures.values() for r in rs]
        return f"{counter.frame_count} graphs for row counts 100 and 5000; guard failures: {reasons}"


case("inductor sum over a dynamic dim of 100, then 5000 rows", one_graph_across_4096, "4096")
report()
