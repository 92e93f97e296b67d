"""Op coverage against DanLing's NestedTensor: which of its operators run per-sample correctly here.

``benchmarks/danling_ops.txt`` lists the operators that DanLing's ``NestedTensor`` has handlers
for (its ``__torch_function__`` and ``__torch_dispatch__`` registries, one name per operator; the
file's header says how the names were counted). For each one this script calls the op on
multi_jagged float64 inputs the way a user would — ``torch.foo(x)``, ``x.foo()``, ``F.foo(x)``, or
``torch.ops.aten.foo`` for an aten-internal op — and compares the result with the per-sample
reference: unbind the batch, apply the dense op to each sample. Inputs: a ``(B, j0, C)`` batch with
a zero-length sample wherever the dense op accepts an empty extent, square pairs ``(B, j0, j0, C)``
where the op makes sense on them, and the shapes an op needs (channels-first ``(B, C, j0)``
signals, ``(B, C, j0, j1)`` images, matrices).

Each operator is classified:

* ``pass``: every case equals the per-sample reference (values, shapes, dtypes) and, for
  differentiable float ops, the gradients of every leaf for a random cotangent;
* ``wrong``: a case runs but differs from the reference — a silent wrong answer, a defect;
* ``raises``: a case raises (the first error is shown);
* ``n/a``: meaningless per sample on this build (the reason is shown); never counted as a pass.

Random ops (``rand_like``, ``bernoulli``, dropout with ``0 < p < 1``) cannot equal a reference;
their cases check per-sample shapes, dtypes and that every value lies in the op's support (for
dropout: each element is 0 or ``x / (1 - p)``), and a deterministic setting (``p = 0``, eval)
where there is one.

``python benchmarks/op_coverage.py`` prints the table and the summary (``--failing`` prints only
the rows that do not pass; ``--op NAME`` runs some ops, with the failing case's traceback).
``test/test_op_coverage.py`` asserts that no op is ``wrong`` and that the pass count stays at
or above its floor.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import torch

try:
    from . import _op_specs_elementwise, _op_specs_nn, _op_specs_reductions  # noqa: F401  (they fill SPECS)
    from ._op_cases import SPECS, Row, build_table, load_ops, run_op, summary
except ImportError:  # run as a script: python benchmarks/op_coverage.py
    import _op_specs_elementwise  # noqa: F401
    import _op_specs_nn  # noqa: F401
    import _op_specs_reductions  # noqa: F401
    from _op_cases import SPECS, Row, build_table, load_ops, run_op, summary

__all__ = ["SPECS", "Row", "build_table", "load_ops", "run_op", "summary", "main"]


# ----------------------------------------------------------------------------- main
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--failing", action="store_true", help="print only the rows that do not pass")
    ap.add_argument("--op", action="append", help="run only these ops (repeatable); prints tracebacks")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = build_table(args.op)
    took = time.perf_counter() - t0
    width = max(len(r.op) for r in rows)
    order = {"wrong": 0, "error": 1, "raises": 2, "n/a": 3, "pass": 4}
    shown = [r for r in rows if not (args.failing and r.status == "pass")]
    print(f"{'op':<{width}}  {'status':<6}  cases  detail")
    for r in sorted(shown, key=lambda r: (order[r.status], r.op)):
        print(f"{r.op:<{width}}  {r.status:<6}  {r.cases:>5}  {r.detail}")
        if args.op and r.tb:
            print(r.tb)
    s = summary(rows)
    wrong = [r.op for r in rows if r.status == "wrong"]
    print()
    print(f"{len(rows)} DanLing operators: {s['pass']} pass, {s['wrong']} wrong, {s['raises']} raise, {s['n/a']} n/a" + (f", {s['error']} broken cases" if s["error"] else "") + f"  ({took:.1f} s)")
    if wrong:
        print("WRONG (silent wrong answers): " + ", ".join(wrong))
    return 1 if wrong or s["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
