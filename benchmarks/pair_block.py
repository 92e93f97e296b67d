"""Single–pair–single block (DanLing paper, Eq. 1), eager forward + backward, float32 on CPU:
padded vs explicit packing vs DanLing ``NestedTensor`` vs ours, interleaved in one process.

The block, per sample i with singles X_i of shape (N_i, C):

    P_i[a, b] = left(X_i[a]) + right(X_i[b])           left, right: Linear(C -> Cp)
    P~_i      = P_i + SwiGLU(LN(P_i))                   SwiGLU(z) = W_down(silu(W_gate z) * W_up z),
                                                        hidden 4·Cp, no biases; LN over Cp, affine
    X~_i[a]   = X_i[a] + g(1/N_i · Σ_b P~_i[a, b])      g: Linear(Cp -> C)

The loss is the paper's Eq. 5 (square pairs, S = 1): both outputs, per-sample weights,

    L = Σ_i α_i ‖X~_i‖²_F / (C · ΣN)  +  Σ_i β_i ‖P~_i‖²_F / (Cp · ΣN²),
    α_i = 1 + i/B,   β_i = 1.5 − i/(2B),   i = 0 … B−1.

Only valid cells enter it, so padding cannot leak. One step = clear the gradients, forward, loss,
backward; the gradients are those of the shared parameters (one ``PairBlock`` module, one set of
weights, used by every method); the singles are input data (no gradient).

Methods, all from the same per-sample tensors and the same weights:

* ``padded``   — dense envelope (B, N_max, C) and masks: the pair is (B, N_max, N_max, Cp); the
                 column mean masks padded columns and divides by the true N_i; the loss masks cells.
* ``explicit`` — hand-written packing: packed (ΣN, C) rows, pair rows gathered with precomputed
                 (ΣN²,) row/column index tensors, the column mean by ``index_add`` over the row
                 index times 1/N_i, the loss with per-row / per-cell segment weights.
* ``danling``  — DanLing's ``NestedTensor`` (``pip install danling``), the same model code as ours.
* ``ours``     — ``torch_multijagged.nested_tensor``: ``PairBlock.forward`` below, which is the
                 paper's Figure 3 verbatim; public API only, no offsets in model code.

Batch preparation (padding + masks; packing + index tensors; building the nested tensor) happens
once per regime, outside the timed step, for every method: ours caches its pair index maps on the
input's structure, so explicit packing gets its index tensors precomputed too. ``--prep-in-step``
moves each method's preparation into the timed step instead (a fresh batch every step).

Before timing, each method's loss and parameter gradients are checked against a float64
per-sample reference (a plain loop over samples): loss within 1e-5 relative, every gradient within
1e-4 of its largest entry; the spread of the methods' losses must also be within 1e-5.

Peak memory: the high-water mark of CPU tensor bytes allocated during one forward + backward and
still live (gradients cleared beforehand, so the new ones count), replayed from torch.profiler's
memory events (``_harness.peak_live_bytes``); weights and prepared inputs are not included.

    python benchmarks/pair_block.py                  # default: C=96, Cp=32, stated lengths; < 2 min
    python benchmarks/pair_block.py --full           # the paper's widths C=384, Cp=128
    python benchmarks/pair_block.py [--steps N] [--json PATH] [--plot PNG] [--profile REGIME]
    python benchmarks/pair_block.py --compile        # torch.compile'd padded / explicit / ours over a
                                                     # trace of changing lengths (_pair_block_compile.py)
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from . import _harness as h
    from . import _pair_block_compile as compiled_mode
except ImportError:  # run as a script: python benchmarks/pair_block.py
    import _harness as h
    import _pair_block_compile as compiled_mode

import torch_multijagged as mj

B = 8
LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4
GOALS = {"ours/explicit": 1.05, "ours vs padded (near-uniform)": 1.0, "danling/ours (moderate)": 1.3}


# --- the block ----------------------------------------------------------------------------------


class PairBlock(nn.Module):
    """Eq. 1 of the paper. ``forward`` is written for nested tensors (ours, DanLing) exactly as a
    user writes it; the padded and packed baselines call the same submodules from their own code."""

    def __init__(self, c: int, cp: int, expansion: int = 4):
        super().__init__()
        self.left = nn.Linear(c, cp)
        self.right = nn.Linear(c, cp)
        self.norm = nn.LayerNorm(cp)
        self.gate = nn.Linear(cp, expansion * cp, bias=False)
        self.up = nn.Linear(cp, expansion * cp, bias=False)
        self.down = nn.Linear(expansion * cp, cp, bias=False)
        self.reduce = nn.Linear(cp, c)

    def transition(self, pair):
        z = self.norm(pair)
        return self.down(F.silu(self.gate(z)) * self.up(z))

    def forward(self, x):
        pair = self.left(x).unsqueeze(-2) + self.right(x).unsqueeze(-3)
        pair = pair + self.transition(pair)
        single = x + self.reduce(pair.mean(dim=-2))
        return single, pair


def sample_weights(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.arange(b, dtype=torch.float64)
    return 1 + i / b, 1.5 - i / (2 * b)


@dataclass
class Batch:
    """One regime's inputs, shared by every method."""

    comps: list[torch.Tensor]  # B tensors (N_i, C)
    lengths: list[int]
    c: int
    cp: int

    @property
    def n_single(self) -> int:
        return sum(self.lengths)

    @property
    def n_pair(self) -> int:
        return sum(n * n for n in self.lengths)

    def loss_weights(self, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(α_i / (C ΣN), β_i / (Cp ΣN²)): Eq. 5's per-sample weights with its normalisers folded in."""
        alpha, beta = sample_weights(len(self.lengths))
        return ((alpha / (self.c * self.n_single)).to(dtype), (beta / (self.cp * self.n_pair)).to(dtype))


# --- methods: prepare (untimed unless --prep-in-step) and forward + loss (timed) ----------------


@dataclass
class Method:
    name: str
    prepare: Callable[[Batch], Any]
    loss: Callable[[PairBlock, Any], torch.Tensor]


def prepare_padded(batch: Batch) -> dict:
    x = torch.nn.utils.rnn.pad_sequence(batch.comps, batch_first=True)  # (B, N_max, C), zeros
    n = torch.tensor(batch.lengths)
    mask = (torch.arange(x.shape[1])[None, :] < n[:, None]).to(x.dtype)  # (B, N_max)
    a, b = batch.loss_weights()
    return {
        "x": x,
        "mask": mask,
        "col_mask": mask[:, None, :, None],  # (B, 1, N_max, 1): valid columns b
        "pair_mask": mask[:, :, None] * mask[:, None, :],  # (B, N_max, N_max)
        "inv_n": (1.0 / n.clamp(min=1).to(x.dtype))[:, None, None],  # (B, 1, 1)
        "a": a,
        "b": b,
    }


def loss_padded(block: PairBlock, s: dict) -> torch.Tensor:
    x = s["x"]
    pair = block.left(x).unsqueeze(2) + block.right(x).unsqueeze(1)  # (B, N_max, N_max, Cp)
    pair = pair + block.transition(pair)
    mean = (pair * s["col_mask"]).sum(dim=2) * s["inv_n"]  # true column mean over N_i
    single = x + block.reduce(mean)
    ls = ((single * single).sum(-1) * s["mask"]).sum(1)  # (B,)
    lp = ((pair * pair).sum(-1) * s["pair_mask"]).sum((1, 2))  # (B,)
    return ls @ s["a"] + lp @ s["b"]


def prepare_explicit(batch: Batch) -> dict:
    x = torch.cat(batch.comps)  # (ΣN, C)
    n = torch.tensor(batch.lengths)
    starts = torch.cumsum(n, 0) - n
    row_sample = torch.repeat_interleave(torch.arange(len(n)), n)  # (ΣN,)
    row_n = n[row_sample]
    # pair cell (i, a, b), row-major per sample: a = row of the cell's single, b = its column
    cell_row = torch.repeat_interleave(torch.arange(x.shape[0]), row_n)  # (ΣN²,) global row of a
    cell_sample = row_sample[cell_row]
    cell_rank = torch.arange(cell_row.shape[0]) - torch.repeat_interleave(torch.cumsum(row_n, 0) - row_n, row_n)
    cell_col = starts[cell_sample] + cell_rank  # global row of b
    a, b = batch.loss_weights()
    return {
        "x": x,
        "row": cell_row,
        "col": cell_col,
        "inv_n": (1.0 / row_n.to(x.dtype))[:, None],  # (ΣN, 1)
        "w_single": a[row_sample],  # (ΣN,)
        "w_pair": b[cell_sample],  # (ΣN²,)
    }


def loss_explicit(block: PairBlock, s: dict) -> torch.Tensor:
    x = s["x"]
    pair = block.left(x)[s["row"]] + block.right(x)[s["col"]]  # (ΣN², Cp)
    pair = pair + block.transition(pair)
    mean = torch.zeros(x.shape[0], pair.shape[1], dtype=pair.dtype).index_add(0, s["row"], pair) * s["inv_n"]
    single = x + block.reduce(mean)
    return (single * single).sum(-1) @ s["w_single"] + (pair * pair).sum(-1) @ s["w_pair"]


def loss_nested(block: PairBlock, s: dict) -> torch.Tensor:
    """Ours and DanLing: the block as written, the loss from reductions over all ragged dims."""
    single, pair = block(s["x"])
    return (single * single).sum(dim=(1, 2)) @ s["a"] + (pair * pair).sum(dim=(1, 2, 3)) @ s["b"]


def prepare_ours(batch: Batch) -> dict:
    a, b = batch.loss_weights()
    return {"x": mj.nested_tensor(batch.comps), "a": a, "b": b}


def danling_nested_tensor() -> tuple[Optional[type], str]:
    mod = h.optional_import("danling.tensors")
    if mod is None or not hasattr(mod, "NestedTensor"):
        return None, "danling not installed (pip install danling)"
    return mod.NestedTensor, ""


def make_methods() -> tuple[list[Method], list[str]]:
    notes = []
    methods = [Method("padded", prepare_padded, loss_padded), Method("explicit", prepare_explicit, loss_explicit)]
    NT, why = danling_nested_tensor()
    if NT is None:
        notes.append(f"danling: n/a ({why})")
    else:

        def prepare_danling(batch: Batch, NT=NT) -> dict:
            a, b = batch.loss_weights()
            return {"x": NT(batch.comps), "a": a, "b": b}

        methods.append(Method("danling", prepare_danling, loss_nested))
    methods.append(Method("ours", prepare_ours, loss_nested))
    return methods, notes


# --- reference and checks -----------------------------------------------------------------------


def reference(block: PairBlock, batch: Batch) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients in float64, one sample at a time (the oracle)."""
    ref = PairBlock(batch.c, batch.cp).double()
    ref.load_state_dict(block.state_dict())
    a, b = batch.loss_weights(torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    for i, xi in enumerate(batch.comps):
        xi = xi.double()
        pair = ref.left(xi)[:, None, :] + ref.right(xi)[None, :, :]  # (N, N, Cp)
        pair = pair + ref.transition(pair)
        single = xi + ref.reduce(pair.mean(dim=1))
        loss = loss + a[i] * (single * single).sum() + b[i] * (pair * pair).sum()
    loss.backward()
    return loss.item(), {k: p.grad for k, p in ref.named_parameters()}


def clear_grads(block: PairBlock) -> None:
    for p in block.parameters():
        p.grad = None


def step(block: PairBlock, method: Method, state: Any) -> torch.Tensor:
    clear_grads(block)
    loss = method.loss(block, state)
    loss.backward()
    return loss


def check(block: PairBlock, method: Method, state: Any, ref_loss: float, ref_grads: dict) -> tuple[Optional[float], list[str]]:
    """(loss, problems); loss is None when the method cannot run the block."""
    try:
        loss = step(block, method, state).item()
    except Exception as e:  # a method that cannot run the block is reported, not timed
        msg = str(e).splitlines()[0][:100] if str(e) else ""
        return None, [f"n/a ({type(e).__name__}: {msg})"]
    problems = []
    rel = abs(loss - ref_loss) / abs(ref_loss)
    if not rel <= LOSS_RTOL:
        problems.append(f"loss {loss:.8g} vs float64 reference {ref_loss:.8g}: relative error {rel:.1e} > {LOSS_RTOL}")
    for k, p in block.named_parameters():
        r = ref_grads[k]
        if p.grad is None:
            problems.append(f"grad of {k} is None")
            continue
        err = (p.grad.double() - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
        if not err <= GRAD_TOL:
            problems.append(f"grad of {k}: max |diff| / max |ref| = {err:.1e} > {GRAD_TOL}")
    return loss, problems


# --- regimes ------------------------------------------------------------------------------------


# ``--lengths-scale``: every length is multiplied by this (rounded, at least 1), e.g. 0.5 runs the
# regimes at half length; set by ``main`` before any batch is drawn (the compiled mode reads it too).
LENGTHS_SCALE = 1.0


def regime_lengths(seed: int = 0) -> dict[str, list[int]]:
    """B = 8 lengths per regime; endpoints forced so that each regime spans its stated range."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int, k: int) -> list[int]:
        return torch.randint(lo, hi + 1, (k,), generator=g).tolist()

    regimes = {
        "near-uniform": [58, 64] + draw(58, 64, B - 2),
        "moderate": [16, 64] + draw(16, 64, B - 2),
        "skewed": [96] + draw(8, 20, B - 1),
    }
    if LENGTHS_SCALE != 1.0:
        regimes = {k: [max(1, round(n * LENGTHS_SCALE)) for n in v] for k, v in regimes.items()}
    return regimes


def occupancy(lengths: list[int], power: int) -> float:
    return sum(n**power for n in lengths) / (len(lengths) * max(lengths) ** power)


# --- one regime ---------------------------------------------------------------------------------


def run_regime(name: str, lengths: list[int], block: PairBlock, c: int, cp: int, methods: list[Method],
               args, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = Batch([torch.randn(n, c, generator=g) for n in lengths], lengths, c, cp)
    ref_loss, ref_grads = reference(block, batch)

    states, losses, notes, runnable = {}, {}, [], []
    for m in methods:
        try:
            states[m.name] = m.prepare(batch)
        except Exception as e:
            notes.append(f"{m.name}: n/a (prepare: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        loss, problems = check(block, m, states[m.name], ref_loss, ref_grads)
        losses[m.name] = loss
        if loss is None:
            notes.append(f"{m.name}: {problems[0]}")
            continue
        notes += [f"{m.name}: MISMATCH {p}" for p in problems]
        runnable.append(m)
    finite = [v for v in losses.values() if v is not None]
    spread = (max(finite) - min(finite)) / abs(ref_loss) if finite else None
    if spread is not None and spread > LOSS_RTOL:
        notes.append(f"MISMATCH: the methods' losses spread {spread:.1e} (relative) > {LOSS_RTOL}")

    if args.prep_in_step:
        fns = {m.name: (lambda m=m: step(block, m, m.prepare(batch))) for m in runnable}
    else:
        fns = {m.name: (lambda m=m: step(block, m, states[m.name])) for m in runnable}
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    samples_ns = h.time_interleaved(fns, calls=1, samples=args.steps, warmup=args.warmup, clock=clock)

    peak = {}
    for m in runnable:
        clear_grads(block)
        st = m.prepare(batch) if args.prep_in_step else states[m.name]
        peak[m.name], _ = h.peak_live_bytes(lambda m=m, st=st: m.loss(block, st).backward())

    rho_pair = occupancy(lengths, 2)
    res: dict[str, dict] = {}
    pad, exp = samples_ns.get("padded"), samples_ns.get("explicit")
    for m in runnable:
        s = samples_ns[m.name]
        q25, med, q75 = h.quartiles(s)
        speedup = h.median(h.paired_ratios(pad, s)) if pad else None
        res[m.name] = {
            "ms_per_step": med / 1e6,
            "ms_iqr": [q25 / 1e6, q75 / 1e6],
            "speedup_vs_padded": speedup,
            "packing_efficiency": None if speedup is None else speedup * rho_pair,
            "time_vs_explicit": h.median(h.paired_ratios(s, exp)) if exp else None,
            "peak_bytes": peak[m.name],
            "loss": losses[m.name],
            "samples_ns": s,
        }
    danling_over_ours = None
    if "danling" in samples_ns and "ours" in samples_ns:
        danling_over_ours = h.median(h.paired_ratios(samples_ns["danling"], samples_ns["ours"]))
    return {
        "lengths": lengths,
        "sum_n": batch.n_single,
        "sum_n2": batch.n_pair,
        "rho_single": occupancy(lengths, 1),
        "rho_pair": rho_pair,
        "reference_loss": ref_loss,
        "loss_spread": spread,
        "danling_over_ours": danling_over_ours,
        "methods": res,
        "notes": notes,
        "_batch": batch,
        "_states": states,
    }


def print_regime(name: str, r: dict, method_names: list[str]) -> None:
    print(f"\n{name}: lengths {r['lengths']}  ΣN={r['sum_n']}  ΣN²={r['sum_n2']}  "
          f"ρ_single={r['rho_single']:.3f}  ρ_pair={r['rho_pair']:.3f}  (1/ρ_pair = {1 / r['rho_pair']:.2f}×)")
    headers = ["method", "ms/step", "IQR", "×padded", "×padded·ρ_pair", "time/explicit", "peak MB", "loss", "Δloss rel"]
    rows = []
    for n in method_names:
        m = r["methods"].get(n)
        if m is None:
            rows.append([n] + ["n/a"] * (len(headers) - 1))
            continue
        rows.append([
            n, h.fmt(m["ms_per_step"], 1), f"{m['ms_iqr'][0]:.1f}–{m['ms_iqr'][1]:.1f}",
            h.fmt(m["speedup_vs_padded"], 2), h.fmt(m["packing_efficiency"], 2), h.fmt(m["time_vs_explicit"], 3),
            h.fmt(m["peak_bytes"] / 2**20, 1), f"{m['loss']:.8g}",
            f"{(m['loss'] - r['reference_loss']) / abs(r['reference_loss']):+.1e}",
        ])
    print(h.format_table(headers, rows))
    for note in r["notes"]:
        print("  " + note)


def goal_lines(results: dict) -> list[str]:
    def verdict(ok: Optional[bool]) -> str:
        return "n/a" if ok is None else ("ok" if ok else "MISS")

    out = []
    ratios = {k: r["methods"].get("ours", {}).get("time_vs_explicit") for k, r in results.items()}
    parts = [f"{k} {h.fmt(v, 3)} {verdict(None if v is None else v <= GOALS['ours/explicit'])}" for k, v in ratios.items()]
    out.append(f"ours/explicit time ≤ {GOALS['ours/explicit']}: " + ", ".join(parts))
    if "near-uniform" in results:
        v = results["near-uniform"]["methods"].get("ours", {}).get("speedup_vs_padded")
        out.append(f"ours ≥ {GOALS['ours vs padded (near-uniform)']}× padded in near-uniform: {h.fmt(v, 2)}× "
                   + verdict(None if v is None else v >= GOALS["ours vs padded (near-uniform)"]))
    if "moderate" in results:
        v = results["moderate"]["danling_over_ours"]
        out.append(f"ours ≥ {GOALS['danling/ours (moderate)']}× faster than DanLing in moderate: {h.fmt(v, 2)}× "
                   + verdict(None if v is None else v >= GOALS["danling/ours (moderate)"]))
    return out


FLOOR_LENGTHS = [2, 3] * (B // 2)
FLOOR_DESC = "lengths 2–3, C=8, Cp=4"
FLOOR_REPS = 50


def host_floor(methods: list[Method]) -> tuple[dict[str, float], dict[str, float]]:
    """ms per step at a size where the arithmetic is negligible: each method's fixed host cost
    (Python, dispatch, wrapper construction, autograd bookkeeping) per step, ``(prepared,
    fresh)``: with the batch prepared once, and with a new batch prepared inside every step (as
    a training loop does: new nested ints, new index maps), both timed in one interleaved loop."""
    g = torch.Generator().manual_seed(7)
    block = PairBlock(8, 4)
    batch = Batch([torch.randn(n, 8, generator=g) for n in FLOOR_LENGTHS], FLOOR_LENGTHS, 8, 4)
    states = {}
    for m in methods:
        try:
            states[m.name] = m.prepare(batch)
            step(block, m, states[m.name])
        except Exception:
            states.pop(m.name, None)
    best, fresh = dict.fromkeys(states, math.inf), dict.fromkeys(states, math.inf)
    for _ in range(FLOOR_REPS):
        for m in methods:
            if m.name in states:
                t = time.thread_time_ns()
                step(block, m, states[m.name])
                best[m.name] = min(best[m.name], (time.thread_time_ns() - t) / 1e6)
                t = time.thread_time_ns()
                step(block, m, m.prepare(batch))
                fresh[m.name] = min(fresh[m.name], (time.thread_time_ns() - t) / 1e6)
    return best, fresh


# --- profile and plot ---------------------------------------------------------------------------


def _shapes(shapes) -> str:
    """Input shapes of a profiled op, empty entries dropped: ``[18511, 512]`` etc."""
    return " ".join(str(list(sh)) for sh in shapes or [] if isinstance(sh, (list, tuple)) and sh)


def profile_methods(block: PairBlock, methods: dict[str, tuple[Method, Any]], steps: int = 9, top: int = 20) -> None:
    """Where ours spends time that explicit packing does not: self CPU time per step of every op
    (torch.profiler), both methods side by side, sorted by the difference; then cProfile of ours.
    Each round profiles one step of each method in turn (interleaved); an op's figure is its minimum
    over rounds — the profiler reads wall time, and on a shared machine the least-disturbed round is
    the most faithful (the median per op swung by 2× between runs here). Ops run on our subclass appear twice (the subclass call, then the op on the packed
    values); self time counts each microsecond once."""
    from torch.profiler import ProfilerActivity, profile

    rounds: dict[str, list[dict[str, tuple[float, int]]]] = {n: [] for n in methods}
    for name, (m, state) in methods.items():
        step(block, m, state)  # warm caches
    for _ in range(steps):
        for name, (m, state) in methods.items():
            with h.stderr_fd_silenced():
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    step(block, m, state)
            rounds[name].append({f"{e.key} {_shapes(e.input_shapes)}".rstrip(): (e.self_cpu_time_total / 1e3, e.count)
                                 for e in prof.key_averages(group_by_input_shape=True)})
    per_op: dict[str, dict[str, tuple[float, float]]] = {}
    totals = {}
    for name, rs in rounds.items():
        keys_n = set().union(*rs)
        per_op[name] = {k: (min(r.get(k, (0.0, 0))[0] for r in rs), h.median([r.get(k, (0.0, 0))[1] for r in rs]))
                        for k in keys_n}
        totals[name] = min(sum(v[0] for v in r.values()) for r in rs)
    names = list(methods)
    keys = set().union(*(d.keys() for d in per_op.values()))

    def delta(k: str) -> float:
        return per_op.get("ours", {}).get(k, (0.0, 0))[0] - per_op.get("explicit", {}).get(k, (0.0, 0))[0]

    rows = []
    for k in sorted(keys, key=lambda k: -abs(delta(k)))[:top]:
        cells = []
        for n in names:
            ms, cnt = per_op[n].get(k, (0.0, 0))
            cells += [f"{ms:.2f}", f"{cnt:g}"]
        rows.append([k[:80]] + cells + [f"{delta(k):+.2f}"])
    rows.append(["(all ops)"] + sum(([f"{totals[n]:.2f}", ""] for n in names), []) + [
        f"{totals.get('ours', 0) - totals.get('explicit', 0):+.2f}"])
    headers = ["op and input shapes (self CPU per step)"] + sum(([f"{n} ms", "calls"] for n in names), []) + ["ours−explicit ms"]
    print(f"\ntorch.profiler, {steps} interleaved rounds, min over rounds of self CPU ms per step, "
          f"top {top} by |ours − explicit|:")
    print(h.format_table(headers, rows))
    if "ours" in methods:
        m, state = methods["ours"]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            step(block, m, state)
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
        print(f"cProfile, ours, {steps} steps (profiler inflates Python time), top {top} by tottime:")
        print(buf.getvalue())


def plot(path: str, results: dict, method_names: list[str], title: str) -> Optional[str]:
    return h.plot_regimes(path, results, method_names, title)


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="the paper's widths: C=384, Cp=128")
    p.add_argument("--c", type=int, help="single width (default 96, 384 with --full)")
    p.add_argument("--cp", type=int, help="pair width (default 32, 128 with --full)")
    p.add_argument("--steps", type=int, help="timed steps per method and regime (default 25, --quick 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds before timing (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: on a shared machine a second thread that "
                        "waits for a busy core distorts every ratio)")
    p.add_argument("--clock", choices=("cpu", "wall"),
                   help="step time: CPU time of the main thread (default with 1 thread: excludes time "
                        "descheduled by other jobs) or wall time (default with more threads)")
    p.add_argument("--regimes", default="near-uniform,moderate,skewed", help="comma-separated subset")
    p.add_argument("--lengths-scale", type=float, default=1.0,
                   help="multiply every regime's lengths by this (e.g. 0.5: half length; default 1)")
    p.add_argument("--methods",
                   help="comma-separated subset, in the order of each interleaving round (default "
                        "padded,explicit,danling,ours; with --compile " + compiled_mode.DEFAULT_VARIANTS + ")")
    p.add_argument("--default-malloc", action="store_true",
                   help="leave glibc's mmap/trim thresholds alone (then methods tax each other with page faults)")
    p.add_argument("--prep-in-step", action="store_true", help="time each method's batch preparation too")
    p.add_argument("--plot", metavar="PNG", help="also plot speedup and peak memory per regime (matplotlib)")
    p.add_argument("--profile", metavar="REGIME", help="after the tables, profile 9 interleaved steps of explicit and ours on REGIME")
    p.add_argument("--compile", action="store_true",
                   help="compiled mode instead: torch.compile'd padded (dynamic=None and True), explicit and "
                        "ours, plus ours eager, over a trace of batches with changing lengths (~5 min)")
    p.add_argument("--batches", type=int, help="with --compile: batches per regime's trace (default 12, --quick 8)")
    args = p.parse_args()
    if args.lengths_scale <= 0:
        p.error("--lengths-scale must be positive")
    global LENGTHS_SCALE
    LENGTHS_SCALE = args.lengths_scale
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu measures the main thread only: use it with --threads 1")
    c = args.c or (384 if args.full else 96)
    cp = args.cp or (128 if args.full else 32)
    args.steps = args.steps or (5 if args.quick else 25)
    malloc_note = None if args.default_malloc else h.retain_freed_memory()
    warnings.filterwarnings("ignore", module="danling")  # its non-leaf .grad warnings, once per op
    if args.compile:
        return compiled_mode.main(args, p, sys.modules[__name__], c, cp, malloc_note)
    if args.batches is not None:
        p.error("--batches needs --compile")

    torch.manual_seed(0)
    block = PairBlock(c, cp)
    methods, setup_notes = make_methods()
    order = [n.strip() for n in (args.methods or "padded,explicit,danling,ours").split(",") if n.strip()]
    methods = sorted((m for m in methods if m.name in order), key=lambda m: order.index(m.name))
    names = [m.name for m in methods]
    all_lengths = regime_lengths()
    wanted = [r.strip() for r in args.regimes.split(",") if r.strip()]
    load0 = h.environment()["loadavg_1min"]

    t0 = time.perf_counter()
    results = {}
    for regime in wanted:
        if regime not in all_lengths:
            p.error(f"unknown regime {regime!r}; choose from {', '.join(all_lengths)}")
        seed = 100 + list(all_lengths).index(regime)  # the same batch whichever regimes are run
        results[regime] = run_regime(regime, all_lengths[regime], block, c, cp, methods, args, seed=seed)
    wall = time.perf_counter() - t0

    floor, floor_fresh = host_floor(methods)
    env = h.environment()
    clock_name = "CPU time of the main thread" if args.clock == "cpu" else "wall time"
    print(f"Single–pair–single block, eager forward + backward, B={B}, C={c}, Cp={cp}, SwiGLU ×4, float32 CPU; "
          f"median {clock_name} of {args.steps} interleaved steps per method ({args.warmup} warmup rounds)"
          + ("; batch preparation inside the timed step" if args.prep_in_step else ""))
    print("×padded: padded time / method time per round (median); ×padded·ρ_pair: packing efficiency; "
          "time/explicit: method / explicit per round (median);")
    print("peak MB: max live CPU tensor bytes allocated within one forward + backward (torch.profiler memory "
          "events; weights and inputs excluded); loss: Eq. 5, Δ vs float64 per-sample reference")
    for n in setup_notes:
        print(n)
    for regime, r in results.items():
        print_regime(regime, r, names)
    print(f"\nHost cost of one step with negligible arithmetic ({FLOOR_DESC}), min over {FLOOR_REPS} steps: "
          + ", ".join(f"{n} {v:.2f} ms" for n, v in floor.items())
          + "; with a new batch prepared in every step: " + ", ".join(f"{n} {v:.2f} ms" for n, v in floor_fresh.items()))
    h.print_footer(goal_lines(results), env, malloc_note, load0, wall, mode=", eager")

    payload_results = {k: {kk: vv for kk, vv in r.items() if not kk.startswith("_")} for k, r in results.items()}
    h.write_json(args.json, {
        "benchmark": "pair_block",
        "config": {"B": B, "C": c, "Cp": cp, "expansion": 4, "steps": args.steps, "warmup": args.warmup,
                   "prep_in_step": args.prep_in_step, "threads": torch.get_num_threads(),
                   "clock": args.clock, "malloc": malloc_note,
                   "loss": "Eq. 5: sum_i a_i |X~_i|^2/(C sum N) + sum_i b_i |P~_i|^2/(Cp sum N^2)",
                   "peak_memory": "max live CPU tensor bytes within fwd+bwd, torch.profiler memory events"},
        "results": payload_results,
        "host_floor_ms": floor,
        "host_floor_fresh_batch_ms": floor_fresh,
        "goals": goal_lines(results),
        "notes": setup_notes,
    })
    if args.plot:
        why = plot(args.plot, results, names, f"pair block B={B} C={c} Cp={cp}, torch {env['torch']}, "
                   f"{torch.get_num_threads()} threads")
        print(why or f"plot written to {args.plot}")
    if args.profile:
        r = results[args.profile]
        profile_methods(block, {m.name: (m, r["_states"][m.name]) for m in methods
                                if m.name in ("explicit", "ours") and m.name in r["_states"]})


if __name__ == "__main__":
    main()
