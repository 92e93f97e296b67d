"""Op coverage against DanLing's NestedTensor operator list (``benchmarks/op_coverage.py``): no
operator gives a silent wrong answer, no case of the script is broken, and the number of
operators that run per-sample correctly (values and gradients) does not drop below its floor.
One test, so that the table is built once per run (it takes a few seconds)."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The pass count when the floor was last raised: raise it with the count when ops are added.
PASS_FLOOR = 380  # raise it when coverage grows


BENCH = os.path.join(ROOT, "benchmarks")


def _load():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)  # the script imports _op_cases and the _op_specs_* modules as siblings
    spec = importlib.util.spec_from_file_location("bench_op_coverage", os.path.join(BENCH, "op_coverage.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_op_coverage():
    cov = _load()
    table = cov.build_table()
    names = cov.load_ops()
    assert [r.op for r in table] == names and len(set(names)) == len(names)
    wrong = {r.op: r.detail for r in table if r.status == "wrong"}
    assert not wrong, f"silent wrong answers: {wrong}"
    broken = {r.op: r.detail for r in table if r.status == "error"}
    assert not broken, f"cases that fail in their own reference or inputs: {broken}"
    assert all(r.detail for r in table if r.status == "n/a"), "an n/a operator without its reason"
    s = cov.summary(table)
    assert s["pass"] >= PASS_FLOOR, f"{s['pass']} operators pass, fewer than the floor {PASS_FLOOR}: {s}"
