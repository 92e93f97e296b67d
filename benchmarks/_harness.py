"""Shared benchmark harness.

Every benchmark times several *methods* on the same inputs, interleaved in one process
(A B C A B C …) so that machine noise hits all methods alike, and reports medians and ratios.
Absolute times from these machines are only meaningful next to the floor they are compared with.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

__all__ = [
    "optional_import",
    "set_one_thread",
    "retain_freed_memory",
    "parser",
    "time_interleaved",
    "time_rounds",
    "paired_ratios",
    "peak_live_bytes",
    "stderr_fd_silenced",
    "median",
    "quartiles",
    "ratio",
    "method_figures",
    "fmt",
    "format_table",
    "environment",
    "write_json",
    "print_footer",
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


def retain_freed_memory() -> Optional[str]:
    """Make glibc malloc serve large blocks from its heap and keep freed memory there.

    By default glibc gives every block above a dynamic threshold (128 KiB to 32 MiB) its own
    ``mmap`` and returns it on free, so the next allocation of that size pays fresh page faults;
    whether it does depends on what ran before (the threshold adapts to earlier frees). Interleaved
    methods then tax each other: a padded step after a packed one took up to 1.7× its solo time.
    Raising the mmap and trim thresholds makes every method's step cost what it costs when run
    alone in a loop. Returns a description for the report, or None where this is not glibc.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    if mallopt(M_MMAP_THRESHOLD, 1 << 30) != 1 or mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1) != 1:
        return None
    return "glibc malloc: mmap threshold 1 GiB, trim threshold 2 GiB (freed memory stays in the heap)"


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer samples: a smoke run, noisier numbers")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    return p


def case_parser(description: str) -> argparse.ArgumentParser:
    """``parser`` with the options of the per-case benchmarks (one row per op and size, ours
    against a per-sample loop): ``--only`` a substring of the case names, ``--rounds`` (0: the
    benchmark's default)."""
    p = parser(description)
    p.add_argument("--only", default="", help="run the cases whose name holds this substring")
    p.add_argument("--rounds", type=int, default=0)
    return p


def print_cases(header: Sequence[str], rows: list, started: float, malloc_note: Optional[str]) -> None:
    """The per-case benchmarks' table of ``rows``, then the run's time, torch, clock and malloc."""
    print()
    print(format_table(list(header), rows))
    print(f"\n{time.time() - started:.0f} s, torch {torch.__version__}, 1 thread, thread CPU time; "
          f"{malloc_note or 'default malloc'}")


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    calls: int = 200,
    samples: int = 25,
    warmup: int = 3,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, list[float]]:
    """Nanoseconds per call for each method: ``samples`` samples, each the mean of a batch of
    ``calls`` back-to-back calls. Methods alternate between samples (A B C A B C …), so a slow
    phase of the machine lands on all of them. The first ``warmup`` rounds are discarded.

    The Python loop and call costs (~0.05 µs per call) are included, equally for every method.
    ``clock`` is wall time by default; ``time.thread_time_ns`` counts only the CPU time of the
    calling thread, which excludes time the thread spent descheduled by other jobs — an honest
    step time only when all the work runs on that thread (one intra-op thread, CPU autograd).
    """
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
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


@contextlib.contextmanager
def stderr_fd_silenced():
    """Silence file descriptor 2 (C++ code such as kineto writes there, bypassing sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def time_rounds(fns: Mapping[str, Callable[[], Any]], rounds: int, warmup: int, clock=time.perf_counter_ns, desc: str = "",
                calls: int = 1) -> dict[str, list[float]]:
    """``time_interleaved`` one round at a time (``calls`` calls per sample, the first ``warmup``
    rounds discarded), under a tqdm progress bar when tqdm is installed."""
    tq = optional_import("tqdm")
    bar = tq.tqdm(total=warmup + rounds, desc=desc, leave=False, file=sys.stderr) if tq else None
    out: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(warmup + rounds):
        got = time_interleaved(fns, calls=calls, samples=1, warmup=0, clock=clock)
        if r >= warmup:
            for n, v in got.items():
                out[n].extend(v)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return out


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """``num[k] / den[k]`` per interleaving round. The two methods of a round ran back to back, so
    a slow phase of the machine cancels better than in a ratio of medians; report the median."""
    return [a / b for a, b in zip(num, den) if b > 0]


def peak_live_bytes(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(peak, fn()) where peak is the maximum, over the call, of CPU tensor bytes allocated during
    the call and still live, i.e. the high-water mark above what was live when it started.

    CPU has no allocator statistics like ``torch.cuda.max_memory_allocated``, and ``tracemalloc``
    does not see torch's allocations, so this replays the allocation and free events that
    ``torch.profiler`` records with ``profile_memory=True`` (every CPU storage allocation/free,
    in time order). torch's default CPU allocator does not cache blocks, so live bytes are what the
    process holds for tensors. Tensors alive before the call (weights, inputs, old gradients) are
    not counted, and freeing one of them during the call lowers the running total: clear
    gradients *before* the call to count the new ones in full.
    """
    from torch.profiler import ProfilerActivity, profile

    with stderr_fd_silenced():  # kineto prints profiler_start/stop lines on fd 2
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]" and e.device_type().name == "CPU"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, out


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


def method_figures(samples: Mapping[str, Sequence[float]], peaks: Mapping[str, int], rho: float) -> dict[str, dict]:
    """Per method, from its step times (ns, interleaved rounds) and peak bytes: median ms and
    IQR, paired speedups over ``padded`` and ``loop`` (when they ran), packing efficiency
    (speedup over padded × ``rho``) and peak over the loop's."""
    pad, loop = samples.get("padded"), samples.get("loop")
    out = {}
    for name, s in samples.items():
        q25, med, q75 = quartiles(s)
        speedup = median(paired_ratios(pad, s)) if pad else None
        out[name] = {
            "ms_per_step": med / 1e6,
            "ms_iqr": [q25 / 1e6, q75 / 1e6],
            "speedup_vs_padded": speedup,
            "speedup_vs_loop": median(paired_ratios(loop, s)) if loop else None,
            "packing_efficiency": None if speedup is None else speedup * rho,
            "peak_bytes": peaks[name],
            "peak_vs_loop": ratio(peaks[name], peaks.get("loop")),
            "samples_ns": s,
        }
    return out


def method_table(r: Mapping[str, Any], names: Sequence[str], rho_label: str, extra=None) -> str:
    """The per-method table of a result with ``method_figures`` entries and a float64
    ``reference_loss``: time, ratios, peak memory and loss per method ("n/a" for one that did
    not run); ``extra = (headers, fn)`` appends the columns ``fn(method_entry)``."""
    headers = ["method", "ms/step", "IQR", "×padded", "×loop", f"×padded·{rho_label}", "peak MiB", "peak/loop",
               "loss", "Δloss rel", *(extra[0] if extra else ())]
    rows = []
    for n in names:
        m = r["methods"].get(n)
        if m is None:
            rows.append([n] + ["n/a"] * (len(headers) - 1))
            continue
        rows.append([
            n, fmt(m["ms_per_step"], 1), f"{m['ms_iqr'][0]:.1f}–{m['ms_iqr'][1]:.1f}",
            fmt(m["speedup_vs_padded"], 2), fmt(m["speedup_vs_loop"], 2), fmt(m["packing_efficiency"], 2),
            fmt(m["peak_bytes"] / 2**20, 1), fmt(m["peak_vs_loop"], 2), f"{m['loss']:.8g}",
            f"{(m['loss'] - r['reference_loss']) / abs(r['reference_loss']):+.1e}", *(extra[1](m) if extra else ()),
        ])
    return format_table(headers, rows)


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


def plot_regimes(path: str, results: dict, method_names: Sequence[str], title: str, rho_key: str = "rho_pair",
                 rho_label: str = "ρ_pair") -> Optional[str]:
    """Two bar charts per length regime — speedup over padded (with the 1/ρ ceiling) and
    peak live memory — from ``results[regime]["methods"][name]`` (``speedup_vs_padded``,
    ``peak_bytes``) and ``results[regime][rho_key]``. A reason string when it cannot plot."""
    plt = optional_import("matplotlib.pyplot")
    if plt is None:
        return "matplotlib not installed (pip install -e '.[bench]'); --plot skipped"
    regimes = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(method_names)
    for k, n in enumerate(method_names):
        xs = [i + (k - (len(method_names) - 1) / 2) * width for i in range(len(regimes))]
        sp = [results[r]["methods"].get(n, {}).get("speedup_vs_padded") or 0.0 for r in regimes]
        mem = [(results[r]["methods"].get(n, {}).get("peak_bytes") or 0) / 2**20 for r in regimes]
        ax1.bar(xs, sp, width, label=n)
        ax2.bar(xs, mem, width, label=n)
    for i, r in enumerate(regimes):  # the ceiling of what removing pair padding can buy
        ax1.hlines(1 / results[r][rho_key], i - 0.45, i + 0.45, colors="k", linestyles="--",
                   label=f"1/{rho_label}" if i == 0 else None)
    for ax, ylabel in ((ax1, "speedup vs padded (median of paired rounds)"), (ax2, "peak live MiB in a step")):
        ax.set_xticks(range(len(regimes)))
        ax.set_xticklabels([f"{r}\n{rho_label}={results[r][rho_key]:.2f}" for r in regimes])
        ax.set_ylabel(ylabel)
    ax1.axhline(1.0, color="grey", lw=0.5)
    ax1.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


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


def print_footer(goals: Sequence[str], env: Mapping[str, Any], malloc_note: Optional[str], load0, wall: float,
                 mode: str = "", what: str = "s") -> None:
    """The goals (reported, never asserted) and one line of environment: torch, threads, ``mode``
    (e.g. ``", eager"``), malloc, the load average before → after, the git revision, the time."""
    print("\nGoals (reported, not asserted):" if len(goals) != 1 else "\nGoal (reported, not asserted):")
    for line in goals:
        print("  " + line)
    print(f"\ntorch {env['torch']}, {torch.get_num_threads()} thread(s){mode}; {malloc_note or 'default malloc'}; "
          f"load avg {fmt(load0, 2)} → {fmt(env['loadavg_1min'], 2)}; git {env['git']}; {wall:.0f} {what}")
