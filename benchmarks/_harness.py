"""Shared benchmark harness (STYLE.md habit 10, DESIGN.md §7).

Every benchmark times several *methods* on the same inputs, interleaved in one process
(A B C A B C …) so that machine noise hits all methods alike, and reports medians and ratios.
Absolute times from these machines are only meaningful next to the floor they are compared with.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

__all__ = [
    "optional_import",
    "set_one_thread",
    "parser",
    "time_interleaved",
    "median",
    "quartiles",
    "ratio",
    "fmt",
    "format_table",
    "environment",
    "write_json",
]


def optional_import(name: str):
    """The module ``name``, or ``None`` when it (or one of its imports) is missing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def set_one_thread() -> int:
    """Pin intra-op parallelism to one thread: host overhead, not parallel speedup, is measured."""
    torch.set_num_threads(1)
    return torch.get_num_threads()


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer samples: a smoke run, noisier numbers")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    return p


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    calls: int = 200,
    samples: int = 25,
    warmup: int = 3,
) -> dict[str, list[float]]:
    """Nanoseconds per call for each method: ``samples`` samples, each the mean of a batch of
    ``calls`` back-to-back calls. Methods alternate between samples (A B C A B C …), so a slow
    phase of the machine lands on all of them. The first ``warmup`` rounds are discarded.

    The Python loop and call costs (~0.05 µs per call) are included, equally for every method.
    """
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    clock = time.perf_counter_ns
    for rnd in range(warmup + samples):
        for name in names:
            fn = fns[name]
            t0 = clock()
            for _ in range(calls):
                fn()
            dt = clock() - t0
            if rnd >= warmup:
                out[name].append(dt / calls)
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """(q25, median, q75); with noisy machines the spread says how far to trust a median."""
    if len(xs) < 2:
        m = median(xs)
        return m, m, m
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` when either is missing or ``b`` is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def fmt(x: Optional[float], digits: int = 1, missing: str = "n/a") -> str:
    return missing if x is None else f"{x:.{digits}f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def _git_revision() -> Optional[str]:
    """``git describe --always --dirty`` of the checkout, so results can be tied to the code."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict[str, Any]:
    return {
        "git": _git_revision(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def write_json(path: Optional[str], payload: Mapping[str, Any]) -> None:
    """Write ``payload`` plus the environment to ``path`` (no-op when ``path`` is None)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"environment": environment(), **payload}, f, indent=2, sort_keys=False)
        f.write("\n")
