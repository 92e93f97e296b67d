"""Pairformer block (AlphaFold 3's trunk) on ragged pairs, forward + backward, float32 on CPU:
padded + masks (OpenFold style) vs a per-sample loop vs DanLing ``NestedTensor`` vs ours,
interleaved in one process, eager and (``--compile``) under ``torch.compile``.

The block (``_pairformer_modules.PairformerBlock``, AF3 Algorithm 17), per sample i with singles
s_i (N_i, C_s) and pair z_i (N_i, N_i, C_z):

    z += TriMulOut(z);  z += TriMulIn(z)          einsum("...ikc,...jkc->...ijc") / ("...kic,...kjc->...ijc")
    z += TriAttStart(z); z += TriAttEnd(z)         SDPA on q/k/v (B, N, H, N, d), pair bias (B, 1, H, N, N)
    z += Transition(z)                             SwiGLU ×4
    s += AttentionPairBias(s, z); s += Transition(s)   bias (B, H, N, N) from the pair

Loss (valid cells only, per-sample weights as in pair_block.py's Eq. 5):

    L = Σ_i α_i ‖s_i‖² / (C_s · ΣN)  +  Σ_i β_i ‖z_i‖² / (C_z · ΣN²),   α_i = 1 + i/B,  β_i = 1.5 − i/(2B)

Methods, one module (one set of weights), the same per-sample inputs:

* ``padded`` — (B, N_max, N_max, C_z) and (B, N_max, C_s) with OpenFold's masks: triangle
               multiplication masks a and b before the einsum; triangle attention and the single
               attention add a −1e9 key-padding bias to the pair bias; the loss masks cells.
* ``loop``   — the same module on each sample alone, ``(1, N_i, N_i, C_z)``, no masks.
* ``danling``— DanLing's ``NestedTensor`` through the same module (skipped when not installed).
* ``ours``   — the same module on ``torch.nested.nested_tensor(pairs, layout=multi_jagged)``
               ``(B, j0, j0, C_z)`` and singles ``(B, j0, C_s)`` that share the pair's nested int
               (``mj.from_packed(values, z.offsets(1), lengths)``), no masks.

Before timing every method's loss and parameter gradients are checked against a float64 per-sample
reference (loss 1e-5 relative, each gradient 1e-4 of its largest entry or of 1e-3 × the largest
entry of all gradients, whichever is larger); a method that raises or
disagrees is reported and not timed.

    python benchmarks/pairformer.py                    # C_z = 32, 4 regimes, eager: ~70 s (9 min when the 2 cores are shared under load)
    python benchmarks/pairformer.py --af3              # C_z = 128, hidden 128, C_s = 384 (AF3 widths)
    python benchmarks/pairformer.py --compile          # + torch.compile'd padded and ours (cold compiles)
    python benchmarks/pairformer.py [--steps N] [--regime moderate,skewed] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

try:
    from . import _harness as h
    from ._pairformer_modules import PairformerBlock
except ImportError:  # run as a script: python benchmarks/pairformer.py
    import _harness as h
    from _pairformer_modules import PairformerBlock

import torch_multijagged as mj
from torch_multijagged import multi_jagged

LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4  # of the gradient's largest entry, or of GRAD_FLOOR × the largest of all gradients
GRAD_FLOOR = 1e-3
GOALS = {"ours/loop": 1.1, "ours/padded near-uniform": 1.0, "packing efficiency": 0.95, "peak/loop": 1.2,
         "compiled/eager": 1.2}


@dataclass(frozen=True)
class Config:
    c_s: int
    c_z: int
    c_hidden_mul: int
    c_hidden_att: int  # per head
    heads_pair: int
    heads_single: int

    @classmethod
    def default(cls) -> "Config":  # CPU size: C_z = 32, hidden 32, 4 heads (head dim 8)
        return cls(c_s=32, c_z=32, c_hidden_mul=32, c_hidden_att=8, heads_pair=4, heads_single=4)

    @classmethod
    def af3(cls) -> "Config":  # AF3 widths: C_z = 128, tri-mult hidden 128, 4 heads × 32; C_s = 384, 16 heads
        return cls(c_s=384, c_z=128, c_hidden_mul=128, c_hidden_att=32, heads_pair=4, heads_single=16)

    def block(self) -> PairformerBlock:
        return PairformerBlock(self.c_s, self.c_z, self.c_hidden_mul, self.c_hidden_att, self.heads_pair, self.heads_single)


# --- regimes and batches ------------------------------------------------------------------------


def regime_lengths(seed: int = 0) -> dict[str, list[int]]:
    """Lengths per regime; endpoints forced so that each regime spans its stated range (and N_max
    is the same for every seed)."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int, k: int) -> list[int]:
        return torch.randint(lo, hi + 1, (k,), generator=g).tolist()

    return {
        "near-uniform": [40, 48] + draw(40, 48, 2),  # B = 4
        "moderate": [12, 48] + draw(12, 48, 2),
        "skewed": [64] + draw(8, 14, 3),
        "short-B32": [4, 24] + draw(4, 24, 30),  # B = 32 short samples: the loop's Python cost dominates
    }


def rho_pair(lengths: list[int]) -> float:
    return sum(n * n for n in lengths) / (len(lengths) * max(lengths) ** 2)


@dataclass
class Batch:
    singles: list[torch.Tensor]  # (N_i, C_s)
    pairs: list[torch.Tensor]  # (N_i, N_i, C_z)
    lengths: list[int]
    cfg: Config

    def loss_weights(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        b = len(self.lengths)
        i = torch.arange(b, dtype=torch.float64)
        sn, sn2 = sum(self.lengths), sum(n * n for n in self.lengths)
        return ((1 + i / b) / (self.cfg.c_s * sn)).to(dtype), ((1.5 - i / (2 * b)) / (self.cfg.c_z * sn2)).to(dtype)


def make_batch(lengths: list[int], cfg: Config, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    singles = [torch.randn(n, cfg.c_s, generator=g) for n in lengths]
    pairs = [torch.randn(n, n, cfg.c_z, generator=g) for n in lengths]
    return Batch(singles, pairs, lengths, cfg)


# --- methods ------------------------------------------------------------------------------------


@dataclass
class Method:
    name: str
    prepare: Callable[[Batch], Any]
    loss: Callable[[PairformerBlock, Any], torch.Tensor]


def prepare_padded(batch: Batch) -> dict:
    s = torch.nn.utils.rnn.pad_sequence(batch.singles, batch_first=True)  # (B, N_max, C_s)
    n_max = s.shape[1]
    z = s.new_zeros(len(batch.lengths), n_max, n_max, batch.cfg.c_z)
    for i, (zi, n) in enumerate(zip(batch.pairs, batch.lengths)):
        z[i, :n, :n] = zi
    n = torch.tensor(batch.lengths)
    mask = (torch.arange(n_max)[None, :] < n[:, None]).to(s.dtype)  # (B, N_max)
    a, b = batch.loss_weights()
    return {"s": s, "z": z, "mask": mask, "pair_mask": mask[:, :, None] * mask[:, None, :], "a": a, "b": b}


def loss_padded(block: PairformerBlock, st: dict) -> torch.Tensor:
    s, z = block(st["s"], st["z"], st["mask"], st["pair_mask"])
    ls = ((s * s).sum(-1) * st["mask"]).sum(1)  # (B,)
    lz = ((z * z).sum(-1) * st["pair_mask"]).sum((1, 2))  # (B,)
    return ls @ st["a"] + lz @ st["b"]


def prepare_loop(batch: Batch) -> dict:
    a, b = batch.loss_weights()
    return {"s": [x.unsqueeze(0) for x in batch.singles], "z": [x.unsqueeze(0) for x in batch.pairs], "a": a, "b": b}


def loss_loop(block: PairformerBlock, st: dict) -> torch.Tensor:
    total = 0
    for i, (si, zi) in enumerate(zip(st["s"], st["z"])):
        s, z = block(si, zi)
        total = total + st["a"][i] * (s * s).sum() + st["b"][i] * (z * z).sum()
    return total


def prepare_ours(batch: Batch) -> dict:
    z = torch.nested.nested_tensor(batch.pairs, layout=multi_jagged)  # (B, j0, j0, C_z)
    lengths = torch.tensor(batch.lengths)
    # The singles on the pair's nested int: (B, j0, C_s) with the offsets of z's ragged dim.
    s = mj.from_packed(torch.cat(batch.singles), z.offsets(1), lengths)
    a, b = batch.loss_weights()
    return {"s": s, "z": z, "a": a, "b": b}


def loss_nested(block: PairformerBlock, st: dict) -> torch.Tensor:
    s, z = block(st["s"], st["z"])
    return (s * s).sum(dim=(1, 2)) @ st["a"] + (z * z).sum(dim=(1, 2, 3)) @ st["b"]


def make_methods() -> tuple[list[Method], list[str]]:
    notes = []
    methods = [Method("padded", prepare_padded, loss_padded), Method("loop", prepare_loop, loss_loop)]
    dl = h.optional_import("danling.tensors")
    if dl is None or not hasattr(dl, "NestedTensor"):
        notes.append("danling: n/a (danling not installed: pip install danling)")
    else:
        def prepare_danling(batch: Batch, NT=dl.NestedTensor) -> dict:
            a, b = batch.loss_weights()
            return {"s": NT(batch.singles), "z": NT(batch.pairs), "a": a, "b": b}

        methods.append(Method("danling", prepare_danling, loss_nested))
    methods.append(Method("ours", prepare_ours, loss_nested))
    return methods, notes


# --- reference and checks -----------------------------------------------------------------------


def clear_grads(block: PairformerBlock) -> None:
    for p in block.parameters():
        p.grad = None


def step(block: PairformerBlock, method: Method, state: Any) -> torch.Tensor:
    clear_grads(block)
    loss = method.loss(block, state)
    loss.backward()
    return loss


def reference(block: PairformerBlock, batch: Batch) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients in float64, one sample at a time (the oracle)."""
    ref = batch.cfg.block().double()
    ref.load_state_dict(block.state_dict())
    st = prepare_loop(batch)
    st = {"s": [x.double() for x in st["s"]], "z": [x.double() for x in st["z"]],
          **dict(zip("ab", batch.loss_weights(torch.float64)))}
    loss = loss_loop(ref, st)
    loss.backward()
    return loss.item(), {k: p.grad for k, p in ref.named_parameters()}


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def check(block, method: Method, state, ref_loss: float, ref_grads: dict) -> tuple[Optional[float], list[str]]:
    """(loss, problems); loss is None when the method cannot run the block."""
    try:
        loss = step(block, method, state).item()
    except Exception as e:  # reported, not timed
        return None, [f"n/a ({short_error(e)})", traceback.format_exc()]
    problems = []
    rel = abs(loss - ref_loss) / abs(ref_loss)
    if not rel <= LOSS_RTOL:
        problems.append(f"loss {loss:.8g} vs float64 reference {ref_loss:.8g}: relative error {rel:.1e} > {LOSS_RTOL}")
    # A gradient that is zero in exact arithmetic (the LayerNorm bias feeding only an attention
    # bias: softmax ignores a shift per head) is rounding noise; compare_grads scales by the
    # largest gradient too.
    return loss, problems + compare_grads(block, ref_grads, "ref")


# --- one regime, eager --------------------------------------------------------------------------


def run_regime(name: str, lengths: list[int], block, cfg: Config, methods: list[Method], args, seed: int) -> dict:
    batch = make_batch(lengths, cfg, seed)
    ref_loss, ref_grads = reference(block, batch)
    states, losses, notes, runnable, errors = {}, {}, [], [], {}
    for m in methods:
        try:
            states[m.name] = m.prepare(batch)
        except Exception as e:
            notes.append(f"{m.name}: n/a (prepare: {short_error(e)})")
            continue
        loss, problems = check(block, m, states[m.name], ref_loss, ref_grads)
        losses[m.name] = loss
        if loss is None:
            notes.append(f"{m.name}: {problems[0]}")
            errors[m.name] = problems[1]
            continue
        notes += [f"{m.name}: MISMATCH {p}" for p in problems]
        runnable.append(m)
    finite = [v for v in losses.values() if v is not None]
    spread = (max(finite) - min(finite)) / abs(ref_loss) if finite else None
    if spread is not None and spread > LOSS_RTOL:
        notes.append(f"MISMATCH: the methods' losses spread {spread:.1e} (relative) > {LOSS_RTOL}")

    fns = {m.name: (lambda m=m: step(block, m, states[m.name])) for m in runnable}
    samples = h.time_rounds(fns, rounds=args.steps, warmup=args.warmup, clock=args.clock_fn, desc=name)
    peak = {}
    for m in runnable:
        clear_grads(block)
        peak[m.name], _ = h.peak_live_bytes(lambda m=m: m.loss(block, states[m.name]).backward())

    rp = rho_pair(lengths)
    res = h.method_figures({m.name: samples[m.name] for m in runnable}, peak, rp)
    for m in runnable:
        res[m.name]["loss"] = losses[m.name]
    return {"lengths": lengths, "B": len(lengths), "sum_n": sum(lengths), "sum_n2": sum(n * n for n in lengths),
            "rho_pair": rp, "reference_loss": ref_loss, "loss_spread": spread, "methods": res, "notes": notes,
            "errors": errors}


def print_regime(name: str, r: dict, names: list[str]) -> None:
    print(f"\n{name}: B={r['B']} lengths {r['lengths']}  ΣN={r['sum_n']}  ΣN²={r['sum_n2']}  "
          f"ρ_pair={r['rho_pair']:.3f}  (1/ρ_pair = {1 / r['rho_pair']:.2f}×)")
    print(h.method_table(r, names, "ρ_pair"))
    for note in r["notes"]:
        print("  " + note)


# --- compiled mode ------------------------------------------------------------------------------

COMPILED_VARIANTS = ("padded", "ours", "ours-eager")
TRACE_BATCHES = 3  # batch 0 (timed, steady state) and two more with changing lengths (recompile count)


def _counters() -> tuple[int, int]:
    c = torch._dynamo.utils.counters
    return c["frames"]["total"], c["stats"]["unique_graphs"]


def _root_cause(e: BaseException) -> str:
    inner = e
    while inner.__cause__ is not None:
        inner = inner.__cause__
    return short_error(e) if inner is e else f"{type(e).__name__} <- {short_error(inner)}"


def run_compiled(name: str, regime_index: int, block, cfg: Config, methods: dict[str, Method], args) -> dict:
    """Per regime: fresh dynamo and Inductor caches; compiled padded (``torch.compile(fn)``,
    defaults) and compiled ours (``fullgraph=True``) on batch 0, its first step's wall time being
    the compile; then steady-state steps of batch 0 interleaved with ours eager; then batches 1, 2
    (same regime, other lengths, same N_max) once each to count graphs."""
    batches = [make_batch(regime_lengths(seed=1 + k)[name] if k else regime_lengths()[name], cfg,
                          100 + regime_index + 1000 * k) for k in range(TRACE_BATCHES)]
    base = {"padded": methods["padded"], "ours": methods["ours"], "ours-eager": methods["ours"]}
    states = {v: [base[v].prepare(b) for b in batches] for v in COMPILED_VARIANTS}
    eager_loss, eager_grads = {}, {}
    for v in ("padded", "ours"):
        eager_loss[v] = step(block, base[v], states[v][0]).item()
        eager_grads[v] = {k: p.grad.clone() for k, p in block.named_parameters()}
    out = {v: {"compile_s": None, "graphs": 0, "failed": None, "loss_rel_vs_eager": None, "later_s": []}
           for v in COMPILED_VARIANTS}
    fns: dict[str, Callable] = {}
    torch._dynamo.reset()
    with torch._inductor.utils.fresh_cache():
        for v in COMPILED_VARIANTS:
            m = base[v]

            def fn(state, m=m):
                return m.loss(block, state)

            fn.__code__ = fn.__code__.replace(co_name=f"{v.replace('-', '_')}_loss")
            if v == "ours-eager":
                fns[v] = fn
                continue
            fns[v] = torch.compile(fn, fullgraph=(v == "ours"))
            g0 = _counters()[1]
            t0 = time.perf_counter()
            try:
                clear_grads(block)
                loss = fns[v](states[v][0])
                loss.backward()
            except Exception as e:  # reported, not worked around
                out[v]["failed"] = _root_cause(e)
                out[v]["failed_detail"] = traceback.format_exc()[-4000:]
                continue
            out[v]["compile_s"] = time.perf_counter() - t0
            out[v]["graphs"] += _counters()[1] - g0
            out[v]["loss_rel_vs_eager"] = (loss.item() - eager_loss[v]) / abs(eager_loss[v])
            out[v]["problems"] = compare_grads(block, eager_grads[v], "eager")
        live = [v for v in COMPILED_VARIANTS if out[v]["failed"] is None]
        timed = {v: (lambda v=v: (clear_grads(block), fns[v](states[v][0]).backward())) for v in live}
        samples = h.time_rounds(timed, rounds=args.steps, warmup=args.warmup, clock=args.clock_fn, desc=f"{name} compiled")
        for k in range(1, TRACE_BATCHES):  # other lengths: does the variant recompile?
            for v in live:
                if v == "ours-eager" or out[v]["failed"] is not None:
                    continue
                g0 = _counters()[1]
                t0 = time.perf_counter()
                try:
                    clear_grads(block)
                    fns[v](states[v][k]).backward()
                except Exception as e:
                    out[v]["failed"] = f"batch {k}: {_root_cause(e)}"
                    continue
                out[v]["later_s"].append(time.perf_counter() - t0)
                out[v]["graphs"] += _counters()[1] - g0
    torch._dynamo.reset()
    eager = samples.get("ours-eager")
    for v in live:
        s = samples[v]
        q25, med, q75 = h.quartiles(s)
        out[v].update({
            "ms_per_step": med / 1e6, "ms_iqr": [q25 / 1e6, q75 / 1e6],
            "speedup_vs_ours_eager": h.median(h.paired_ratios(eager, s)) if eager else None,
            "speedup_vs_padded_compiled": (h.median(h.paired_ratios(samples["padded"], s))
                                           if "padded" in samples else None),
            "samples_ns": s,
        })
    return {"lengths": [b.lengths for b in batches], "variants": out}


def compare_grads(block, ref_grads: dict, what: str) -> list[str]:
    """Each parameter gradient within GRAD_TOL of its largest entry (or of GRAD_FLOOR × the
    largest entry of all gradients) of ``ref_grads``."""
    floor = GRAD_FLOOR * max(r.abs().max().item() for r in ref_grads.values())
    problems = []
    for k, p in block.named_parameters():
        r = ref_grads[k]
        if p.grad is None:
            problems.append(f"grad of {k} is None")
            continue
        err = (p.grad.to(r.dtype) - r).abs().max().item() / max(r.abs().max().item(), floor, 1e-30)
        if not err <= GRAD_TOL:
            problems.append(f"grad of {k}: max |diff| / max |{what}| = {err:.1e} > {GRAD_TOL}")
    return problems


def print_compiled(name: str, r: dict) -> None:
    print(f"\n{name} (compiled): batch 0 {r['lengths'][0]}; graphs counted over {len(r['lengths'])} batches "
          f"with changing lengths, same N_max")
    headers = ["variant", "compile s", "ms/step", "IQR", "×ours-eager", "×padded-compiled", "graphs",
               "later batches s", "loss vs eager"]
    rows = []
    for v, m in r["variants"].items():
        if "ms_per_step" not in m:
            rows.append([v] + ["n/a"] * (len(headers) - 1))
            continue
        rows.append([
            v, h.fmt(m["compile_s"], 1, "-"), h.fmt(m["ms_per_step"], 1), f"{m['ms_iqr'][0]:.1f}–{m['ms_iqr'][1]:.1f}",
            h.fmt(m["speedup_vs_ours_eager"], 2), h.fmt(m["speedup_vs_padded_compiled"], 2),
            "-" if v == "ours-eager" else m["graphs"],
            ", ".join(f"{x:.1f}" for x in m["later_s"]) or "-",
            "-" if m["loss_rel_vs_eager"] is None else f"{m['loss_rel_vs_eager']:+.1e}",
        ])
    print(h.format_table(headers, rows))
    for v, m in r["variants"].items():
        if m["failed"]:
            print(f"  {v}: failed: {m['failed']}")
        for prob in m.get("problems", []):
            print(f"  {v}: MISMATCH {prob}")


# --- goals, plot, main --------------------------------------------------------------------------


def goal_lines(results: dict, compiled: dict) -> list[str]:
    def verdict(v, goal, le=False) -> str:
        return "n/a" if v is None else ("ok" if (v <= goal if le else v >= goal) else "MISS")

    def get(r, method, key):
        return r["methods"].get(method, {}).get(key)

    out = []
    g = GOALS["ours/loop"]
    out.append(f"ours ≥ {g}× the per-sample loop: " + ", ".join(
        f"{k} {h.fmt(get(r, 'ours', 'speedup_vs_loop'), 2)}× {verdict(get(r, 'ours', 'speedup_vs_loop'), g)}"
        for k, r in results.items()))
    if "near-uniform" in results:
        v = get(results["near-uniform"], "ours", "speedup_vs_padded")
        out.append(f"ours ≥ {GOALS['ours/padded near-uniform']}× padded in near-uniform: {h.fmt(v, 2)}× "
                   f"{verdict(v, GOALS['ours/padded near-uniform'])}")
    g = GOALS["packing efficiency"]
    parts = [f"{k} {h.fmt(get(r, 'ours', 'packing_efficiency'), 2)} {verdict(get(r, 'ours', 'packing_efficiency'), g)}"
             for k, r in results.items() if k in ("moderate", "skewed")]
    if parts:
        out.append(f"packing efficiency ≥ {g} (moderate, skewed): " + ", ".join(parts))
    g = GOALS["peak/loop"]
    out.append(f"peak memory ≤ {g}× the loop's: " + ", ".join(
        f"{k} {h.fmt(get(r, 'ours', 'peak_vs_loop'), 2)} {verdict(get(r, 'ours', 'peak_vs_loop'), g, le=True)}"
        for k, r in results.items()))
    if compiled:
        g = GOALS["compiled/eager"]
        out.append(f"ours compiled ≥ {g}× ours eager: " + ", ".join(
            f"{k} {h.fmt(r['variants']['ours'].get('speedup_vs_ours_eager'), 2)}× "
            f"{verdict(r['variants']['ours'].get('speedup_vs_ours_eager'), g)}" for k, r in compiled.items()))
        out.append("one graph for ours over changing lengths: " + ", ".join(
            f"{k} {r['variants']['ours']['graphs']} "
            f"{'ok' if r['variants']['ours']['graphs'] == 1 and not r['variants']['ours']['failed'] else 'MISS'}"
            for k, r in compiled.items()))
    return out


def plot(path: str, results: dict, names: list[str], title: str) -> Optional[str]:
    return h.plot_regimes(path, results, names, title)


def main() -> None:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--af3", action="store_true", help="AF3 widths: C_z = 128, hidden 128, 4 heads × 32; C_s = 384")
    p.add_argument("--steps", type=int, help="timed steps per method and regime (default 10, --quick 4)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds before timing (default 2)")
    p.add_argument("--regime", "--regimes", dest="regimes", default=",".join(regime_lengths()),
                   help="comma-separated subset of " + ", ".join(regime_lengths()))
    p.add_argument("--methods", help="comma-separated subset and order of padded,loop,danling,ours")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, i.e. OMP_NUM_THREADS)")
    p.add_argument("--clock", choices=("cpu", "process", "wall"),
                   help="CPU time of the main thread (default with 1 thread), CPU time of all the process's "
                        "threads (excludes time descheduled by other jobs, includes OpenMP spin-waits), or "
                        "wall time (default otherwise)")
    p.add_argument("--compile", action="store_true",
                   help="also torch.compile padded and ours (Inductor, cold caches per regime; minutes)")
    p.add_argument("--default-malloc", action="store_true", help="leave glibc's mmap/trim thresholds alone")
    p.add_argument("--plot", metavar="PNG", help="also plot speedup and peak memory per regime (matplotlib)")
    p.add_argument("--traceback", action="store_true", help="print the traceback of a method that raised")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.clock = args.clock or ("cpu" if torch.get_num_threads() == 1 else "wall")
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        p.error("--clock cpu measures the main thread only: use it with one thread")
    args.clock_fn = {"cpu": time.thread_time_ns, "process": time.process_time_ns, "wall": time.perf_counter_ns}[args.clock]
    args.steps = args.steps or (4 if args.quick else 10)
    cfg = Config.af3() if args.af3 else Config.default()
    malloc_note = None if args.default_malloc else h.retain_freed_memory()
    warnings.filterwarnings("ignore", module="danling")

    torch.manual_seed(0)
    block = cfg.block()
    methods, setup_notes = make_methods()
    order = [n.strip() for n in (args.methods or "padded,loop,danling,ours").split(",") if n.strip()]
    methods = sorted((m for m in methods if m.name in order), key=lambda m: order.index(m.name))
    names = [m.name for m in methods]
    all_lengths = regime_lengths()
    wanted = [r.strip() for r in args.regimes.split(",") if r.strip()]
    for r in wanted:
        if r not in all_lengths:
            p.error(f"unknown regime {r!r}; choose from {', '.join(all_lengths)}")
    if args.compile and not {"padded", "ours"} <= set(names):
        p.error("--compile needs the methods padded and ours")
    load0 = h.environment()["loadavg_1min"]

    t0 = time.perf_counter()
    results, compiled = {}, {}
    for r in wanted:
        idx = list(all_lengths).index(r)
        results[r] = run_regime(r, all_lengths[r], block, cfg, methods, args, seed=100 + idx)
    wall_eager = time.perf_counter() - t0
    if args.compile:
        by_name = {m.name: m for m in methods}
        for r in wanted:
            compiled[r] = run_compiled(r, list(all_lengths).index(r), block, cfg, by_name, args)
    wall = time.perf_counter() - t0

    env = h.environment()
    clock_name = {"cpu": "CPU time of the main thread", "process": "CPU time of the process (all threads)",
                  "wall": "wall time"}[args.clock]
    print(f"Pairformer block (tri-mult out/in, tri-attn start/end, pair transition, single attention with pair "
          f"bias, single transition), eager forward + backward, float32 CPU; C_z={cfg.c_z}, tri-mult hidden "
          f"{cfg.c_hidden_mul}, {cfg.heads_pair} pair heads × {cfg.c_hidden_att}, C_s={cfg.c_s}, "
          f"{cfg.heads_single} single heads; median {clock_name} of {args.steps} interleaved steps "
          f"({args.warmup} warmup rounds)")
    print("×padded / ×loop: that method's time / this method's per round (median); ×padded·ρ_pair: packing "
          "efficiency; peak MiB: max live CPU tensor bytes within one forward + backward (torch.profiler memory "
          "events; weights and inputs excluded); Δloss: vs the float64 per-sample reference")
    for n in setup_notes:
        print(n)
    for r, res in results.items():
        print_regime(r, res, names)
        if args.traceback:
            for n, tb in res["errors"].items():
                print(f"--- {n} traceback:\n{tb}")
    if compiled:
        print(f"\ntorch.compile (Inductor defaults) of forward + loss, backward through AOTAutograd; padded "
              f"torch.compile(fn), ours torch.compile(fn, fullgraph=True); compile s = wall time of the first step "
              f"(fresh caches); ms/step: {clock_name}, steady state, interleaved with ours eager")
        for r, res in compiled.items():
            print_compiled(r, res)
    lines = goal_lines(results, compiled)
    h.print_footer(lines, env, malloc_note, load0, wall, mode=", eager" + (" + compiled" if compiled else ""))
    h.write_json(args.json, {
        "benchmark": "pairformer",
        "config": {**cfg.__dict__, "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads(),
                   "clock": args.clock, "malloc": malloc_note, "eager_wall_s": wall_eager,
                   "loss": "sum_i a_i |s_i|^2/(C_s sum N) + sum_i b_i |z_i|^2/(C_z sum N^2)"},
        "results": results,
        "compiled": compiled,
        "goals": lines,
        "notes": setup_notes,
    })
    if args.plot:
        why = plot(args.plot, results, names, f"Pairformer block C_z={cfg.c_z}, torch {env['torch']}, "
                   f"{torch.get_num_threads()} threads")
        print(why or f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
