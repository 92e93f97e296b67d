"""Varlen self-attention forward in the pruned-ViT regime, float32 on CPU: padded SDPA + key-padding
mask vs a per-sample SDPA loop vs ``torch.jagged`` SDPA vs ours, interleaved in one process.

The regime of the dispatch-aware ragged attention paper: H = 12 heads, D = 64, per-sample lengths
uniform in 50–197 (the tokens a pruned ViT-B/16 keeps of 196 + CLS), B = 64 and B = 512, forward
only under ``torch.no_grad()``. Every method gets the same q, k, v, prepared once outside the
timed call:

* ``padded``  — dense envelope ``(B, H, N_max, D)`` (a ``transpose(1, 2)`` view of
                ``(B, N_max, H, D)``, as a model's head split gives) and a bool key-padding mask
                ``(B, 1, 1, N_max)``; one ``F.scaled_dot_product_attention`` call.
* ``loop``    — one dense SDPA call per sample on ``(1, H, N_i, D)`` views of the packed
                ``(ΣN, H, D)`` buffers; the outputs stay a list (no concatenation: the loop's best case).
* ``jagged``  — ``torch.jagged``: ``(B, j, H, D)`` NJTs sharing one offsets tensor,
                ``.transpose(1, 2)`` → ``(B, H, j, D)``, one SDPA call (its CPU path is the math
                fallback: ~50 s per call at B = 512, so by default it is timed only for B ≤ 128).
* ``ours``    — ``torch_multijagged.nested_tensor(q_comps)`` with components ``(N_i, H, D)`` (k and v
                share q's structure via ``from_packed``), ``.transpose(1, 2)`` → ``(B, H, j0, D)``,
                one SDPA call: whatever backend the dispatcher picks.
* ``ours-<backend>`` — ours with the backend forced (``--backends``, default the CPU candidates
                ``loop,bucketed``), when ``torch_multijagged.ops.attention`` offers a way to force
                one (``backend(name)``, probed at run time; skipped otherwise).

Before timing, every method's per-sample output is compared with a float64 per-sample reference
(max |diff| ≤ 1e-4; the values are O(1)); a method that raises is ``n/a (reason)`` and not timed.

Also the host-overhead case: B = 8, lengths 1–16, H = 2, D = 16 — the arithmetic is negligible, so
each method's time is its fixed cost; ours against one dense SDPA call on ``(8, 2, 16, 16)``
(one intra-op thread and the main thread's CPU time, as ``overhead.py`` measures).

    python benchmarks/attention.py                 # B = 64 and 512: a few minutes
    python benchmarks/attention.py --quick         # B = 16 and 64, fewer rounds: a smoke run
    python benchmarks/attention.py [--batch 64,512] [--rounds N] [--threads N] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/attention.py
    import _harness as h

import torch_multijagged as mj

H, D = 12, 64
LENGTHS = (50, 197)
TINY = {"B": 8, "lengths": (1, 16), "H": 2, "D": 16}
ATOL = 1e-4
JAGGED_MAX_B = 128  # torch.jagged's CPU math fallback costs ~50 s per call at B = 512
GOALS = {
    "ours ×padded at the largest B": 2.1,
    "ours ×loop at the largest B": 1.15,
    "ours ×loop at the smallest B": 1.0,
    "tiny: ours / one dense call": 2.0,
}


# --- inputs -------------------------------------------------------------------------------------


@dataclass
class Case:
    lengths: list[int]
    q: list[torch.Tensor]  # B components (N_i, H, D)
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def rho_attn(self) -> float:
        return sum(n * n for n in self.lengths) / (len(self.lengths) * max(self.lengths) ** 2)

    @property
    def rho_tokens(self) -> float:
        return sum(self.lengths) / (len(self.lengths) * max(self.lengths))


def make_case(b: int, lo: int, hi: int, heads: int, dim: int, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (b,), generator=g).tolist()

    def comps():
        return [torch.randn(n, heads, dim, generator=g) for n in lengths]

    return Case(lengths, comps(), comps(), comps())


def reference(case: Case) -> list[torch.Tensor]:
    """Per-sample float64 dense SDPA: ``(N_i, H, D)`` each."""
    out = []
    for q, k, v in zip(case.q, case.k, case.v):
        qt, kt, vt = (t.double().transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qt, kt, vt).transpose(0, 1))
    return out


# --- methods: prepare (untimed) / run (timed) / per-sample outputs (for the check) --------------


@dataclass
class Method:
    name: str
    prepare: Callable[[Case], Any]
    run: Callable[[Any], Any]
    unpack: Callable[[Any, Any, Case], list[torch.Tensor]]  # (state, output, case) -> [(N_i, H, D)]
    context: Callable[[], Any] = contextlib.nullcontext  # e.g. forcing an attention backend


def _offsets(lengths: list[int]) -> torch.Tensor:
    n = torch.tensor(lengths, dtype=torch.int64)
    return torch.cat([n.new_zeros(1), n.cumsum(0)])


def prepare_padded(case: Case) -> dict:
    pad = torch.nn.utils.rnn.pad_sequence
    n = torch.tensor(case.lengths)
    mask = (torch.arange(max(case.lengths))[None, :] < n[:, None])[:, None, None, :]  # True = attend
    return {t: pad(getattr(case, t), batch_first=True).transpose(1, 2) for t in "qkv"} | {"mask": mask}


def run_padded(s: dict) -> torch.Tensor:
    return F.scaled_dot_product_attention(s["q"], s["k"], s["v"], attn_mask=s["mask"])


def unpack_padded(s, out, case) -> list[torch.Tensor]:
    return [out[i, :, :n].transpose(0, 1) for i, n in enumerate(case.lengths)]


def prepare_loop(case: Case) -> list[tuple[torch.Tensor, ...]]:
    off = _offsets(case.lengths).tolist()
    packed = {t: torch.cat(getattr(case, t)) for t in "qkv"}
    return [tuple(packed[t][a:b].transpose(0, 1).unsqueeze(0) for t in "qkv") for a, b in zip(off[:-1], off[1:])]


def run_loop(views) -> list[torch.Tensor]:
    return [F.scaled_dot_product_attention(q, k, v) for q, k, v in views]


def unpack_loop(s, out, case) -> list[torch.Tensor]:
    return [o[0].transpose(0, 1) for o in out]


def prepare_jagged(case: Case) -> dict:
    off = _offsets(case.lengths)
    return {t: torch.nested.nested_tensor_from_jagged(torch.cat(getattr(case, t)), off).transpose(1, 2) for t in "qkv"}


def run_nested(s: dict):
    return F.scaled_dot_product_attention(s["q"], s["k"], s["v"])


def unpack_nested(s, out, case) -> list[torch.Tensor]:
    return list(out.transpose(1, 2).unbind())


def prepare_ours(case: Case) -> dict:
    q = mj.nested_tensor(case.q)  # (B, j0, H, D)
    k, v = (mj.from_packed(torch.cat(getattr(case, t)), q.offsets(), q.sizes()) for t in "kv")  # q's structure
    return {"q": q.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2)}


def backend_forcing() -> tuple[Optional[Callable[[str], Any]], list[str], str]:
    """(context manager factory, backend names, note): how ``ops/attention/sdpa.py`` lets a caller force
    a backend, probed by name; (None, [], why) when it does not."""
    mod = h.optional_import("torch_multijagged.ops.attention")
    if mod is None:
        return None, [], "torch_multijagged.ops.attention not importable"
    cm = next((getattr(mod, n) for n in ("backend", "force_backend", "use_backend", "sdpa_backend")
               if callable(getattr(mod, n, None))), None)
    if cm is None:
        return None, [], "ops.attention offers no backend context manager (backend/force_backend/use_backend)"
    names = next((getattr(mod, n) for n in ("BACKENDS", "CPU_BACKENDS", "backends", "available_backends")
                  if getattr(mod, n, None) is not None), None)
    if callable(names):
        names = names()
    if isinstance(names, dict):
        names = list(names)
    names = [str(n) for n in (names or ("loop", "bucketed"))]
    return cm, names, ""


def make_methods(args) -> tuple[list[Method], list[str]]:
    notes = []
    methods = [
        Method("padded", prepare_padded, run_padded, unpack_padded),
        Method("loop", prepare_loop, run_loop, unpack_loop),
        Method("jagged", prepare_jagged, run_nested, unpack_nested),
        Method("ours", prepare_ours, run_nested, unpack_nested),
    ]
    cm, names, why = backend_forcing()
    if cm is None:
        notes.append(f"ours-<backend>: skipped ({why})")
    elif args.backends != "all":
        wanted = [n.strip() for n in args.backends.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            notes.append(f"ours-<backend>: unknown backend(s) {unknown} skipped; available: {names}")
        names = [n for n in wanted if n in names]
    for n in names:
        methods.append(Method(f"ours-{n}", prepare_ours, run_nested, unpack_nested, context=lambda n=n: cm(n)))
    return methods, notes


# --- timing -------------------------------------------------------------------------------------


def short(e: BaseException, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def check_and_prepare(methods: list[Method], case: Case, ref: list[torch.Tensor], skip: dict[str, str]):
    """{name: zero-argument timed call} for the methods that run and agree; notes and errors."""
    fns, notes, errs = {}, [], {}
    for m in methods:
        if m.name in skip:
            notes.append(f"{m.name}: n/a ({skip[m.name]})")
            continue
        try:
            with torch.no_grad(), m.context():
                state = m.prepare(case)
                out = m.run(state)
            outs = m.unpack(state, out, case)
        except Exception as e:  # a method that cannot run is reported, not timed
            notes.append(f"{m.name}: n/a ({short(e)})")
            continue
        err = max((float((o.double() - r).abs().max()) for o, r in zip(outs, ref) if r.numel()), default=0.0)
        errs[m.name] = err
        if not err <= ATOL:
            notes.append(f"{m.name}: MISMATCH max |out - ref| = {err:.1e} > {ATOL}; not timed")
            continue

        def call(m=m, state=state):
            with torch.no_grad(), m.context():
                return m.run(state)

        fns[m.name] = call
    return fns, notes, errs


def run_batch(b: int, methods: list[Method], args, clock) -> dict:
    case = make_case(b, *LENGTHS, H, D, seed=1000 + b)
    ref = reference(case)
    skip = {}
    if b > args.jagged_max_b:
        skip["jagged"] = f"skipped at B > {args.jagged_max_b}: CPU math fallback, ~50 s per call at B = 512"
    fns, notes, errs = check_and_prepare(methods, case, ref, skip)
    rounds = args.rounds or (3 if args.quick else (15 if b <= 128 else 5))
    samples = h.time_rounds(fns, rounds, args.warmup, clock, desc=f"B={b}")
    res = {}
    pad, loop = samples.get("padded"), samples.get("loop")
    for n, s in samples.items():
        q25, med, q75 = h.quartiles(s)
        res[n] = {
            "ms": med / 1e6, "ms_iqr": [q25 / 1e6, q75 / 1e6],
            "x_padded": h.median(h.paired_ratios(pad, s)) if pad else None,
            "x_loop": h.median(h.paired_ratios(loop, s)) if loop else None,
            "max_err": errs.get(n), "samples_ns": s,
        }
    return {"B": b, "lengths": case.lengths, "sum_n": sum(case.lengths), "n_max": max(case.lengths),
            "rho_tokens": case.rho_tokens, "rho_attn": case.rho_attn, "rounds": rounds,
            "methods": res, "errors": errs, "notes": notes}


def run_tiny(methods: list[Method], args) -> dict:
    """Host overhead: lengths 1–16 at H = 2, D = 16; ``dense`` is one SDPA call on (8, 2, 16, 16).
    One intra-op thread and the main thread's CPU time, as in ``overhead.py``: with more threads a
    microsecond-scale call mostly measures waking the thread pool, and under load that swung 10×."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_tiny(methods, args, time.thread_time_ns)
    finally:
        torch.set_num_threads(threads)


def _run_tiny(methods: list[Method], args, clock) -> dict:
    b, (lo, hi), heads, dim = TINY["B"], TINY["lengths"], TINY["H"], TINY["D"]
    case = make_case(b, lo, hi, heads, dim, seed=7)
    ref = reference(case)
    dense = torch.randn(b, heads, hi, dim, generator=torch.Generator().manual_seed(8))
    fns, notes, errs = check_and_prepare(methods, case, ref, {})

    def dense_call():
        with torch.no_grad():
            return F.scaled_dot_product_attention(dense, dense, dense)

    fns = {"dense": dense_call, **fns}
    rounds = args.rounds or (5 if args.quick else 15)
    samples = h.time_rounds(fns, rounds, args.warmup, clock, desc="tiny", calls=10 if args.quick else 20)
    res = {}
    for n, s in samples.items():
        q25, med, q75 = h.quartiles(s)
        res[n] = {"us": med / 1e3, "us_iqr": [q25 / 1e3, q75 / 1e3],
                  "x_dense_time": h.median(h.paired_ratios(s, samples["dense"])), "max_err": errs.get(n)}
    return {"B": b, "lengths": case.lengths, "H": heads, "D": dim, "methods": res, "notes": notes}


# --- report -------------------------------------------------------------------------------------


def print_batch(r: dict, names: list[str]) -> None:
    print(f"\nB={r['B']}: ΣN={r['sum_n']}  N_max={r['n_max']}  ρ_tokens={r['rho_tokens']:.3f}  "
          f"ρ_attn=ΣN²/(B·N_max²)={r['rho_attn']:.3f}  (1/ρ_attn = {1 / r['rho_attn']:.2f}×)  {r['rounds']} rounds")
    headers = ["method", "ms", "IQR", "×padded", "×loop", "max err"]
    rows = []
    for n in names:
        m = r["methods"].get(n)
        if m is None:
            rows.append([n] + ["n/a"] * (len(headers) - 1))
            continue
        rows.append([n, h.fmt(m["ms"], 1), f"{m['ms_iqr'][0]:.1f}–{m['ms_iqr'][1]:.1f}", h.fmt(m["x_padded"], 2),
                     h.fmt(m["x_loop"], 2), f"{m['max_err']:.1e}"])
    print(h.format_table(headers, rows))
    for note in r["notes"]:
        print("  " + note)


def print_tiny(r: dict) -> None:
    print(f"\nHost overhead: B={r['B']}, lengths {r['lengths']}, H={r['H']}, D={r['D']}; "
          f"dense = one SDPA call on ({r['B']}, {r['H']}, {TINY['lengths'][1]}, {r['D']}); "
          "1 thread, main-thread CPU time")
    rows = [[n, h.fmt(m["us"], 1), f"{m['us_iqr'][0]:.1f}–{m['us_iqr'][1]:.1f}", h.fmt(m["x_dense_time"], 2)]
            for n, m in r["methods"].items()]
    print(h.format_table(["method", "µs/call", "IQR", "time / dense"], rows))
    for note in r["notes"]:
        print("  " + note)


def goal_lines(batches: list[dict], tiny: Optional[dict]) -> list[str]:
    def verdict(v, goal, higher=True):
        if v is None:
            return "n/a"
        return "ok" if (v >= goal if higher else v <= goal) else "MISS"

    out = []
    if batches:
        big, small = batches[-1], batches[0]
        for label, r, key, goal in (
            ("ours ×padded at the largest B", big, "x_padded", GOALS["ours ×padded at the largest B"]),
            ("ours ×loop at the largest B", big, "x_loop", GOALS["ours ×loop at the largest B"]),
            ("ours ×loop at the smallest B", small, "x_loop", GOALS["ours ×loop at the smallest B"]),
        ):
            v = r["methods"].get("ours", {}).get(key)
            out.append(f"{label} (B={r['B']}) ≥ {goal}: {h.fmt(v, 2)} {verdict(v, goal)}")
    if tiny is not None:
        v = tiny["methods"].get("ours", {}).get("x_dense_time")
        goal = GOALS["tiny: ours / one dense call"]
        out.append(f"tiny: ours time / one dense SDPA call ≤ {goal}: {h.fmt(v, 2)} {verdict(v, goal, higher=False)}")
    return out


def plot(path: str, batches: list[dict], names: list[str], title: str) -> Optional[str]:
    plt = h.optional_import("matplotlib.pyplot")
    if plt is None:
        return "matplotlib not installed (pip install -e '.[bench]'); --plot skipped"
    names = [n for n in names if any(n in r["methods"] for r in batches)]  # drop methods that never ran
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(names), 1)
    for k, n in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(batches))]
        ax.bar(xs, [r["methods"].get(n, {}).get("x_padded") or 0.0 for r in batches], width, label=n)
    for i, r in enumerate(batches):  # what removing all padding could buy in the attention itself
        ax.hlines(1 / r["rho_attn"], i - 0.45, i + 0.45, colors="k", linestyles="--", label="1/ρ_attn" if i == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([f"B={r['B']}\nρ_attn={r['rho_attn']:.2f}" for r in batches])
    ax.set_ylabel("speedup vs padded + mask (median of paired rounds)")
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def main() -> None:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", help="comma-separated batch sizes (default 64,512; --quick 16,64)")
    p.add_argument("--rounds", type=int, help="timed rounds per batch size (default 15 for B ≤ 128, else 5; --quick 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--clock", choices=("cpu", "wall"), help="default: wall with > 1 thread, main-thread CPU time with 1")
    p.add_argument("--methods", help="comma-separated subset and order of a round (default: all)")
    p.add_argument("--jagged-max-b", type=int, default=JAGGED_MAX_B,
                   help=f"time torch.jagged only up to this B (default {JAGGED_MAX_B}: it is ~20× slower than padded)")
    p.add_argument("--backends", default="loop,bucketed",
                   help="ours-<backend> rows: comma-separated backends to force, or 'all' (default loop,bucketed: "
                        "the CPU candidates; 'reference' is the oracle, the others need CUDA)")
    p.add_argument("--no-tiny", action="store_true", help="skip the host-overhead case (1 thread, CPU clock)")
    p.add_argument("--plot", metavar="PNG", help="also plot the speedups vs padded (matplotlib)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu measures the main thread only: use it with --threads 1")
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    torch.manual_seed(0)
    malloc_note = h.retain_freed_memory()
    bs = [int(x) for x in (args.batch or ("16,64" if args.quick else "64,512")).split(",")]
    methods, setup_notes = make_methods(args)
    if args.methods:
        order = [n.strip() for n in args.methods.split(",") if n.strip()]
        methods = sorted((m for m in methods if m.name in order), key=lambda m: order.index(m.name))
    names = [m.name for m in methods]
    load0 = h.environment()["loadavg_1min"]

    t0 = time.perf_counter()
    batches = [run_batch(b, methods, args, clock) for b in sorted(bs)]
    tiny = None if args.no_tiny else run_tiny(methods, args)
    wall = time.perf_counter() - t0

    env = h.environment()
    print(f"Self-attention forward, H={H}, D={D}, lengths uniform in {LENGTHS[0]}–{LENGTHS[1]}, float32 CPU, "
          f"torch.no_grad(); median {args.clock} time per call over interleaved rounds ({args.warmup} warmup)")
    print("×padded / ×loop: that method's time / this method's time per round (median): > 1 is faster; "
          "max err: vs float64 per-sample reference")
    for n in setup_notes:
        print(n)
    for r in batches:
        print_batch(r, names)
    if tiny is not None:
        print_tiny(tiny)
    goals = goal_lines(batches, tiny)
    h.print_footer(goals, env, malloc_note, load0, wall)
    h.write_json(args.json, {
        "benchmark": "attention",
        "config": {"H": H, "D": D, "lengths": LENGTHS, "batch": bs, "threads": torch.get_num_threads(),
                   "clock": args.clock, "warmup": args.warmup, "malloc": malloc_note, "tiny": TINY},
        "results": batches, "tiny": tiny, "goals": goals, "notes": setup_notes,
    })
    if args.plot:
        why = plot(args.plot, batches, names, f"attention H={H} D={D}, torch {env['torch']}, "
                   f"{torch.get_num_threads()} threads")
        print(why or f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
