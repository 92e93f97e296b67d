"""Per-op host overhead, eager, one thread: µs per call of small feature ops on a tiny batch.

B = 8 samples with lengths 1..8, C = 16, so the arithmetic is negligible and the time is the
Python/dispatch cost of each layout. ``dense`` runs the op on the packed ``(ΣN, C)`` buffer and is
the floor; the figure of merit is ours' overhead above that floor relative to ``torch.jagged``'s:

    ratio = (ours - dense) / (jagged - dense)        goal: <= 0.25 for every op

Every method's output is checked against dense before it is timed.

    python benchmarks/overhead.py [--quick] [--json PATH] [--profile OP]
"""

from __future__ import annotations

import cProfile
import pstats
import contextlib
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/overhead.py
    import _harness as h

import torch_multijagged as mj

B, C = 8, 16
LENGTHS = list(range(1, B + 1))
GOAL = 0.25
ATOL = 1e-5


def make_ops(weight: torch.Tensor, bias: torch.Tensor) -> dict[str, Callable[[Any], Any]]:
    return {
        "add": lambda x: x + x,
        "sin": torch.sin,
        "linear": lambda x: F.linear(x, weight, bias),
        "layer_norm": lambda x: F.layer_norm(x, (C,)),
        "softmax": lambda x: x.softmax(-1),
    }


def make_methods(comps: list[torch.Tensor], grad: bool = False) -> dict[str, tuple[Any, Callable[[Any], torch.Tensor], Optional[type]]]:
    """name -> (input, packed values of an output, the type an output must have); with ``grad``
    the inputs are leaves that require grad."""
    methods: dict[str, tuple[Any, Callable[[Any], torch.Tensor], Optional[type]]] = {
        "dense": (torch.cat(comps).requires_grad_(grad), lambda y: y, None),
        "torch.jagged": (
            torch.nested.nested_tensor(comps, layout=torch.jagged, requires_grad=grad),
            lambda y: y.values(),
            type(torch.nested.nested_tensor(comps[:1], layout=torch.jagged)),
        ),
    }
    danling = h.optional_import("danling.tensors") or h.optional_import("danling.tensor")
    if danling is not None and hasattr(danling, "NestedTensor"):
        NT = danling.NestedTensor
        if not grad:  # with autograd, its constructor records a graph that the first backward frees
            methods["danling"] = (NT(comps), lambda y: y.concat, NT)
    methods["ours"] = (mj.nested_tensor(comps, requires_grad=grad), lambda y: y.values() if grad else y._values,
                       mj.MultiJaggedTensor)
    return methods


def check(op: Callable, x: Any, packed: Callable, kind: Optional[type], ref: torch.Tensor) -> Optional[str]:
    """None when ``op(x)`` agrees with the dense reference, else the reason it cannot be timed."""
    try:
        y = op(x)
    except Exception as e:  # a method that cannot run an op is reported, not timed
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    if kind is not None and not isinstance(y, kind):
        return f"returned {type(y).__name__}, not {kind.__name__}"
    v = packed(y)
    if v.shape != ref.shape:
        return f"wrong packed shape {tuple(v.shape)}, expected {tuple(ref.shape)}"
    if not torch.allclose(v, ref, atol=ATOL, rtol=0):
        return f"wrong values (max |diff| {(v - ref).abs().max().item():.2e} > {ATOL})"
    return None


def profile_ours(op_name: str, ops: dict, x: Any, calls: int = 20000, top: int = 15) -> None:
    op = ops[op_name]
    with torch.no_grad():
        for _ in range(200):
            op(x)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            op(x)
        prof.disable()
    print(f"\ncProfile of ours {op_name!r}, {calls} calls (times are for all calls; profiler inflates them):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def paired_ratios(samples_ns: dict[str, list[float]]) -> list[float]:
    """The ratio per interleaving round: dense, jagged and ours of one round ran back to back, so
    a slow phase of the machine cancels better than in a ratio of medians."""
    if not {"dense", "torch.jagged", "ours"} <= samples_ns.keys():
        return []
    d, j, o = samples_ns["dense"], samples_ns["torch.jagged"], samples_ns["ours"]
    return [(oi - di) / (ji - di) for di, ji, oi in zip(d, j, o) if ji > di]


def measure_op(op: Callable, methods: dict, notes: list[str], op_name: str, grad: bool = False, params=(),
               **timing) -> dict:
    """Check every method against dense, then time the ones that agree, interleaved. With
    ``grad`` a call is forward + ``sum`` of the packed output + ``torch.autograd.grad`` over the
    input and ``params`` (the op's parameters)."""
    ref = op(methods["dense"][0])
    runnable = {}
    for name, (x, packed, kind) in methods.items():
        reason = check(op, x, packed, kind, ref)
        if reason is None:
            if grad:
                leaves = [x, *params]
                step = lambda op=op, leaves=leaves, packed=packed: torch.autograd.grad(  # noqa: E731
                    packed(op(leaves[0])).sum(), leaves)
                try:
                    step()
                except Exception as e:  # a layout whose backward fails is reported, not timed
                    notes.append(f"{op_name} / {name}: n/a (backward: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
                    continue
                runnable[name] = step
            else:
                runnable[name] = lambda op=op, x=x: op(x)
        else:
            notes.append(f"{op_name} / {name}: n/a ({reason})")
    samples_ns = h.time_interleaved(runnable, **timing)
    us = {n: h.median(s) / 1e3 for n, s in samples_ns.items()}
    over = {n: us[n] - us["dense"] for n in ("torch.jagged", "ours") if n in us and "dense" in us}
    q25, r, q75 = h.quartiles(paired_ratios(samples_ns)) if "ours" in over and "torch.jagged" in over else (None,) * 3
    return {
        "us_per_call": us,
        "overhead_us": over,
        "ratio": r,  # median of per-round ratios
        "ratio_iqr": [q25, q75],
        "ratio_of_medians": h.ratio(over.get("ours"), over.get("torch.jagged")),
        "samples_ns": samples_ns,
    }


def table_row(op_name: str, res: dict, names: list[str]) -> list[str]:
    r, (q25, q75) = res["ratio"], res["ratio_iqr"]
    verdict = "n/a" if r is None else ("ok" if r <= GOAL else "MISS")
    iqr = "n/a" if r is None else f"{q25:.2f}–{q75:.2f}"
    over = res["overhead_us"]
    return ([op_name] + [h.fmt(res["us_per_call"].get(n)) for n in names]
            + [h.fmt(over.get("torch.jagged")), h.fmt(over.get("ours")), h.fmt(r, 2), iqr, verdict])


def main() -> None:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--profile", metavar="OP", help="after the table, cProfile 20000 calls of OP on ours")
    p.add_argument("--grad", action="store_true",
                   help="autograd on: input, weight and bias require grad; a call is forward + sum + autograd.grad")
    args = p.parse_args()
    threads = h.set_one_thread()
    calls, samples, warmup = (100, 9, 2) if args.quick else (200, 41, 3)

    g = torch.Generator().manual_seed(0)
    comps = [torch.randn(n, C, generator=g) for n in LENGTHS]
    weight, bias = torch.randn(C, C, generator=g), torch.randn(C, generator=g)
    weight.requires_grad_(args.grad)
    bias.requires_grad_(args.grad)
    ops = make_ops(weight, bias)
    methods = make_methods(comps, args.grad)
    names = list(methods)
    if "danling" not in methods:
        print("danling: not timed with --grad (its constructor's graph is freed by the first backward)" if args.grad
              else "danling: not installed, skipped (pip install danling)")

    t_start = time.perf_counter()
    results, notes = {}, []
    with contextlib.nullcontext() if args.grad else torch.no_grad():
        for op_name, op in ops.items():
            params = (weight, bias) if args.grad and op_name == "linear" else ()
            results[op_name] = measure_op(op, methods, notes, op_name, grad=args.grad, params=params, calls=calls,
                                          samples=samples, warmup=warmup)
    rows = [table_row(op_name, res, names) for op_name, res in results.items()]

    headers = (["op"] + [f"{n} µs" for n in names]
               + ["jagged−dense", "ours−dense", "ratio", "ratio IQR", f"≤{GOAL}"])
    print(f"Host overhead per call (median of {samples} samples × {calls} calls, interleaved)")
    print(h.format_table(headers, rows))
    for n in notes:
        print(n)
    misses = [r[0] for r in rows if r[-1] == "MISS"]
    print(f"ratio = (ours − dense) / (jagged − dense), median over rounds; goal ≤ {GOAL}: "
          + (f"missed for {', '.join(misses)}" if misses else "met for every op"))
    env = h.environment()
    print(f"torch {env['torch']}, {threads} thread, eager, {'autograd on (forward + backward)' if args.grad else 'no_grad'}, B={B}, lengths {LENGTHS[0]}..{LENGTHS[-1]}, "
          f"C={C}, float32; load avg {h.fmt(env['loadavg_1min'], 2)}; git {env['git']}; "
          f"timing {time.perf_counter() - t_start:.1f} s")

    h.write_json(args.json, {
        "benchmark": "overhead",
        "config": {"B": B, "C": C, "lengths": LENGTHS, "calls": calls, "samples": samples, "goal": GOAL,
                   "grad": args.grad},
        "results": results,
        "notes": notes,
    })
    if args.profile:
        profile_ours(args.profile, ops, methods["ours"][0])


if __name__ == "__main__":
    main()
