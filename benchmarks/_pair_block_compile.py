"""``pair_block.py --compile``: the single–pair–single block under ``torch.compile`` (Inductor, CPU).

Per regime, a trace of ``--batches`` batches (B = 8, default 12) whose lengths change from batch to
batch but stay in the regime: the eager benchmark's length generator (``regime_lengths``) with
seeds 1, 2, …, so the endpoints it forces stay — every batch of a regime has the same N_max, and
padded's envelope has one shape. Every method sees every batch once, in the same order, with the
same weights; methods run interleaved per batch (round k: batch k through every method).

Variants (all from ``pair_block``'s methods, unchanged):

* ``padded``      padded, ``torch.compile(fn)`` — defaults: static first, automatic dynamic on a
                  shape change (none here: N_max is fixed per regime);
* ``padded-dyn``  padded, ``torch.compile(fn, dynamic=True)`` — a user who knows lengths vary;
* ``explicit``    explicit packing, ``torch.compile(fn)`` (ΣN, ΣN² change: static, then dynamic);
* ``ours``        ours, ``torch.compile(fn)``;
* ``ours-eager``  ours, eager, for the compiled-vs-eager ratio.

``fn(state)`` is the forward and the loss (``method.loss(block, state)``); ``loss.backward()``
runs outside it, through AOTAutograd's compiled backward. Each variant gets its own code object, so
its dynamo cache, guards and automatic-dynamic state are its own. Dynamo is reset and Inductor's
caches (on disk and in memory) are fresh for each regime, so every regime pays a cold compile, as a
new process on a new machine would; a throwaway compile first pays the one-time costs (imports,
worker pool, C++ prefix header) so that they do not land on the first variant.

Graphs: dynamo's ``unique_graphs`` counter, read around each variant's step (variants run one at a
time, so an increase belongs to that variant); a step compiled when dynamo converted a frame
(``frames.total`` rose). Steady-state rounds: rounds in which no variant compiled. A variant that
raises is reported as ``failed: <reason>`` and dropped for the rest of the regime.

Clocks: steady-state times use ``--clock`` (default: CPU time of the main thread, one intra-op
thread; Inductor's CPU kernels then run on that thread too). Full-trace times use wall time: Inductor
compiles C++ in worker processes, which a thread clock would not see.

Correctness: round 0 (the first batch) compares each compiled variant's loss with the same method's
eager loss (within 1e-5 relative) and its parameter gradients (within 1e-4 of the largest entry).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/pair_block.py --compile
    import _harness as h

DEFAULT_VARIANTS = "padded,padded-dyn,explicit,ours,ours-eager"
# variant -> (pair_block method, compiled?, torch.compile's dynamic=)
VARIANTS: dict[str, tuple[str, bool, Optional[bool]]] = {
    "padded": ("padded", True, None),
    "padded-dyn": ("padded", True, True),
    "explicit": ("explicit", True, None),
    "ours": ("ours", True, None),
    "ours-eager": ("ours", False, None),
}
# goal: ours compiled at least this many times as fast as the variant (variant time / ours time)
GOALS = {"ours-eager": 1.2, "explicit": 1.0}
GOAL_REGIMES = ("moderate", "skewed")
TRACE_SEED = 1  # batch k of a trace: regime_lengths(seed=TRACE_SEED + k); the eager benchmark uses seed 0


def _mode(variant: str) -> str:
    _, compiled, dynamic = VARIANTS[variant]
    return f"compiled, dynamic={dynamic}" if compiled else "eager"


def _counters() -> tuple[int, int]:
    """(frames dynamo converted, unique graphs installed) so far, process-wide."""
    c = torch._dynamo.utils.counters
    return c["frames"]["total"], c["stats"]["unique_graphs"]


def short_reason(e: BaseException, limit: int = 200) -> str:
    """``Outer: inner: message``: the innermost cause names what failed, the outer what raised."""
    chain = [e]
    while chain[-1].__cause__ is not None and len(chain) < 6:
        chain.append(chain[-1].__cause__)
    inner = chain[-1]
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    msg = lines[0] if lines else ""
    head = type(e).__name__ if inner is e else f"{type(e).__name__} <- {type(inner).__name__}"
    out = f"{head}: {msg}"
    return out if len(out) <= limit else out[: limit - 1] + "…"


def forward_fn(block, method, label: str) -> Callable[[Any], torch.Tensor]:
    """``state -> loss``, with a code object of its own (named after the variant)."""

    def fn(state):
        return method.loss(block, state)

    fn.__code__ = fn.__code__.replace(co_name=f"{label.replace('-', '_')}_forward_and_loss")
    return fn


@dataclass
class Record:
    """One variant's trace in one regime."""

    name: str
    wall_ns: list[Optional[int]] = field(default_factory=list)  # None: not run (failed earlier)
    clock_ns: list[Optional[int]] = field(default_factory=list)
    compiled_in: list[int] = field(default_factory=list)  # rounds in which it compiled
    graphs: int = 0
    failed: Optional[str] = None
    failed_detail: Optional[str] = None
    failed_round: Optional[int] = None
    loss_rel: Optional[float] = None  # round 0 vs the same method in eager
    problems: list[str] = field(default_factory=list)


def trace_batches(pb, regime: str, n: int, c: int, cp: int, regime_index: int) -> list:
    out = []
    for k in range(n):
        lengths = pb.regime_lengths(seed=TRACE_SEED + k)[regime]
        g = torch.Generator().manual_seed(10_000 + 1000 * regime_index + k)
        out.append(pb.Batch([torch.randn(m, c, generator=g) for m in lengths], lengths, c, cp))
    return out


def warm_inductor() -> None:
    """A throwaway compile (forward and backward): imports, the worker pool and Inductor's C++
    prefix header are paid here, not by whichever variant compiles first."""
    w = torch.randn(4, 4, requires_grad=True)
    f = torch.compile(lambda x: (torch.nn.functional.silu(x @ w) * x).sum())
    f(torch.randn(3, 4)).backward()


def run_regime(pb, name: str, batches: list, block, variants: list[str], clock) -> dict:
    methods = {m.name: m for m in pb.make_methods()[0]}
    # eager loss and gradients of each method on batch 0: the compiled variants' check
    eager: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    for mname in {VARIANTS[v][0] for v in variants}:
        loss = pb.step(block, methods[mname], methods[mname].prepare(batches[0])).item()
        eager[mname] = (loss, {k: p.grad.clone() for k, p in block.named_parameters()})
    # preparation for every batch, untimed (ours builds its index maps in the step: each batch is
    # seen once, so its caches are cold — the same for ours eager and ours compiled)
    states = {v: [methods[VARIANTS[v][0]].prepare(b) for b in batches] for v in variants}

    torch._dynamo.reset()
    recs = {v: Record(v) for v in variants}
    with torch._inductor.utils.fresh_cache():
        warm_inductor()
        fns = {}
        for v in variants:
            mname, compiled, dynamic = VARIANTS[v]
            fn = forward_fn(block, methods[mname], v)
            fns[v] = torch.compile(fn, dynamic=dynamic) if compiled else fn
        t_regime = time.perf_counter()
        for k in range(len(batches)):
            for v in variants:
                r = recs[v]
                if r.failed is not None:
                    r.wall_ns.append(None)
                    r.clock_ns.append(None)
                    continue
                f0, g0 = _counters()
                pb.clear_grads(block)
                w0, c0 = time.perf_counter_ns(), clock()
                try:
                    loss = fns[v](states[v][k])
                    loss.backward()
                except Exception as e:  # reported, not worked around
                    r.failed, r.failed_detail, r.failed_round = short_reason(e), str(e)[:4000], k
                    r.compiled_in.append(k)
                    r.wall_ns.append(None)
                    r.clock_ns.append(None)
                    continue
                c1, w1 = clock(), time.perf_counter_ns()
                f1, g1 = _counters()
                r.wall_ns.append(w1 - w0)
                r.clock_ns.append(c1 - c0)
                r.graphs += g1 - g0
                if f1 > f0 or g1 > g0:
                    r.compiled_in.append(k)
                if k == 0 and VARIANTS[v][1]:
                    check_against_eager(r, loss.item(), block, *eager[VARIANTS[v][0]])
        wall_regime = time.perf_counter() - t_regime
    torch._dynamo.reset()
    return summarize(name, batches, recs, variants, wall_regime)


def check_against_eager(r: Record, loss: float, block, eager_loss: float, eager_grads: dict) -> None:
    r.loss_rel = (loss - eager_loss) / abs(eager_loss)
    if not abs(r.loss_rel) <= 1e-5:
        r.problems.append(f"MISMATCH loss {loss:.8g} vs eager {eager_loss:.8g} (relative {r.loss_rel:+.1e})")
    for k, p in block.named_parameters():
        ref = eager_grads[k]
        if p.grad is None:
            r.problems.append(f"MISMATCH grad of {k} is None")
            continue
        err = (p.grad - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        if not err <= 1e-4:
            r.problems.append(f"MISMATCH grad of {k}: max |diff| / max |eager| = {err:.1e}")


def summarize(name: str, batches: list, recs: dict[str, Record], variants: list[str], wall: float) -> dict:
    n = len(batches)
    compiling = sorted({k for r in recs.values() for k in r.compiled_in})
    steady = [k for k in range(n) if k not in compiling]
    ours = recs.get("ours")
    out: dict[str, Any] = {}
    for v in variants:
        r = recs[v]
        st = [r.clock_ns[k] for k in steady if r.clock_ns[k] is not None]
        full = [x for x in r.wall_ns if x is not None]
        q25, med, q75 = h.quartiles(st)
        vs_ours = None
        if ours is not None and ours.failed is None and st:
            pairs = [(r.clock_ns[k], ours.clock_ns[k]) for k in steady
                     if r.clock_ns[k] is not None and ours.clock_ns[k] is not None]
            vs_ours = h.median(h.paired_ratios([a for a, _ in pairs], [b for _, b in pairs])) if pairs else None
        out[v] = {
            "mode": _mode(v),
            "graphs": r.graphs,
            "recompiles": max(r.graphs - 1, 0),
            "compiled_in_rounds": r.compiled_in,
            "compile_rounds_wall_s": sum(r.wall_ns[k] or 0 for k in r.compiled_in if k < len(r.wall_ns)) / 1e9,
            "failed": r.failed,
            "failed_round": r.failed_round,
            "failed_detail": r.failed_detail,
            "steady_ms": med / 1e6 if st else None,
            "steady_iqr_ms": [q25 / 1e6, q75 / 1e6] if st else None,
            "time_vs_ours_compiled": vs_ours,
            "full_median_ms": h.median(full) / 1e6 if full else None,
            "full_total_s": sum(full) / 1e9 if full else None,
            "loss_rel_vs_eager": r.loss_rel,
            "problems": r.problems,
            "wall_ns": r.wall_ns,
            "clock_ns": r.clock_ns,
        }
    lengths = [b.lengths for b in batches]
    return {
        "lengths": lengths,
        "n_max": sorted({max(ls) for ls in lengths}),
        "sum_n": [b.n_single for b in batches],
        "sum_n2": [b.n_pair for b in batches],
        "rho_pair": [sum(m * m for m in ls) / (len(ls) * max(ls) ** 2) for ls in lengths],
        "compile_rounds": compiling,
        "steady_rounds": steady,
        "wall_s": wall,
        "variants": out,
    }


def _span(xs, digits: int = 0) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f}–{hi:.{digits}f}"


def print_regime(name: str, r: dict) -> None:
    print(f"\n{name}: {len(r['lengths'])} batches, N_max {_span(r['n_max'])}, ΣN {_span(r['sum_n'])}, "
          f"ΣN² {_span(r['sum_n2'])}, ρ_pair {_span(r['rho_pair'], 3)}; steady-state rounds "
          f"{len(r['steady_rounds'])} of {len(r['lengths'])} (compiles in rounds "
          f"{', '.join(map(str, r['compile_rounds'])) or 'none'}); {r['wall_s']:.0f} s")
    headers = ["variant", "mode", "graphs", "compiled in", "compile-round s", "steady ms", "IQR",
               "time/ours", "full median ms", "full total s", "loss vs eager"]
    rows = []
    for v, m in r["variants"].items():
        rows.append([
            v, m["mode"], m["graphs"], ",".join(map(str, m["compiled_in_rounds"])) or "-",
            h.fmt(m["compile_rounds_wall_s"], 1) if m["compiled_in_rounds"] else "-",
            h.fmt(m["steady_ms"], 1), "n/a" if m["steady_iqr_ms"] is None else
            f"{m['steady_iqr_ms'][0]:.1f}–{m['steady_iqr_ms'][1]:.1f}",
            h.fmt(m["time_vs_ours_compiled"], 2), h.fmt(m["full_median_ms"], 1), h.fmt(m["full_total_s"], 1),
            "-" if m["loss_rel_vs_eager"] is None else f"{m['loss_rel_vs_eager']:+.1e}",
        ])
    print(h.format_table(headers, rows))
    for v, m in r["variants"].items():
        if m["failed"]:
            print(f"  {v}: failed in round {m['failed_round']}: {m['failed']}")
        for p in m["problems"]:
            print(f"  {v}: {p}")


def goal_lines(results: dict) -> list[str]:
    def verdict(v: Optional[float], goal: float) -> str:
        return "n/a" if v is None else ("ok" if v >= goal else "MISS")

    out = []
    for variant, goal in GOALS.items():
        key = f"ours compiled ≥ {goal}× as fast as {variant if variant == 'ours-eager' else variant + ' compiled'}"
        parts = []
        for reg in GOAL_REGIMES:
            if reg in results:
                v = results[reg]["variants"].get(variant, {}).get("time_vs_ours_compiled")
                parts.append(f"{reg} {h.fmt(v, 2)}× {verdict(v, goal)}")
        out.append(f"{key} (steady, {variant} time / ours time): " + (", ".join(parts) or "n/a"))
    parts = []
    for reg, r in results.items():
        m = r["variants"].get("ours")
        ok = m is not None and m["failed"] is None and m["graphs"] == 1
        parts.append(f"{reg} {'n/a' if m is None else m['graphs']} {'ok' if ok else 'MISS'}")
    out.append("exactly one graph for ours: " + ", ".join(parts))
    return out


def main(args, parser, pb, c: int, cp: int, malloc_note: Optional[str]) -> None:
    """The ``--compile`` run; ``pb`` is the ``pair_block`` module (its block, methods, regimes)."""
    for opt in ("prep_in_step", "plot", "profile"):
        if getattr(args, opt):
            parser.error(f"--{opt.replace('_', '-')} is not supported with --compile")
    variants = [v.strip() for v in (args.methods or DEFAULT_VARIANTS).split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"with --compile, --methods takes {', '.join(VARIANTS)} (got {', '.join(unknown)})")
    n_batches = args.batches or (8 if args.quick else 12)
    if n_batches < 2:
        parser.error("--batches must be at least 2")
    all_lengths = pb.regime_lengths()
    wanted = [r.strip() for r in args.regimes.split(",") if r.strip()]
    for reg in wanted:
        if reg not in all_lengths:
            parser.error(f"unknown regime {reg!r}; choose from {', '.join(all_lengths)}")
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    clock_name = "CPU time of the main thread" if args.clock == "cpu" else "wall time"
    load0 = h.environment()["loadavg_1min"]

    torch.manual_seed(0)
    block = pb.PairBlock(c, cp)
    t0 = time.perf_counter()
    results = {}
    for reg in wanted:
        batches = trace_batches(pb, reg, n_batches, c, cp, list(all_lengths).index(reg))
        results[reg] = run_regime(pb, reg, batches, block, variants, clock)
    wall = time.perf_counter() - t0

    env = h.environment()
    print(f"Single–pair–single block, torch.compile (Inductor, default mode) of forward + loss, backward "
          f"through AOTAutograd; B={pb.B}, C={c}, Cp={cp}, SwiGLU ×4, float32 CPU; per regime a trace of "
          f"{n_batches} batches with changing lengths, variants interleaved per batch, each batch once")
    print(f"steady ms: median {clock_name} over steady-state rounds (no variant compiled); time/ours: variant / "
          f"ours compiled per steady round (median; ours-eager's value is the compiled speedup);")
    print("full median / total: wall time over all rounds, compilation included (Inductor compiles in worker "
          "processes); compile-round s: wall time of the rounds in which it compiled;")
    print("graphs: dynamo unique graphs (recompiles = graphs − 1); fresh Inductor caches and dynamo state per regime; "
          "loss vs eager: round 0, relative to the same method eager")
    for reg, r in results.items():
        print_regime(reg, r)
    lines = goal_lines(results)
    h.print_footer(lines, env, malloc_note, load0, wall)
    h.write_json(args.json, {
        "benchmark": "pair_block --compile",
        "config": {"B": pb.B, "C": c, "Cp": cp, "expansion": 4, "batches": n_batches, "trace_seed": TRACE_SEED,
                   "variants": {v: _mode(v) for v in variants}, "threads": torch.get_num_threads(),
                   "steady_clock": args.clock, "full_trace_clock": "wall", "malloc": malloc_note},
        "results": results,
        "goals": lines,
    })
