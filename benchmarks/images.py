"""Variable-size images, forward + backward, float32 on CPU: a small CNN and a NaViT-style ViT on a
batch of B = 16 images of different sizes, padded + re-masking vs a per-sample loop vs ours,
interleaved in one process.

Models (``_image_modules.py``; one module object, one set of weights for every method):

* ``cnn``   — three blocks of 3×3 conv (padding 1, no bias) + norm + ReLU, channels 3→32→32→32, a
              3×3 stride-2 conv (padding 1) to 64, global average pooling ``x.mean((-2, -1))``, a
              linear head (10 classes). The norm is ``BatchNorm2d`` in training mode (default) or
              ``GroupNorm(8, C)`` (``--norm group``).
* ``navit`` — patchify ``Conv2d(3, 64, kernel_size=p, stride=p)`` (p = 16) → ``(B, 64, h, w)`` →
              tokens ``x.flatten(2).transpose(1, 2)`` ``(B, h·w, 64)``; two pre-norm encoder layers
              (4 heads, q/k/v ``(B, H, L, d)`` by ``.unflatten(-1, (H, d)).transpose(1, 2)``,
              ``F.scaled_dot_product_attention``, MLP ×4 with GELU), a final LayerNorm, mean over
              tokens, a linear head. Image i gives ⌊Hᵢ/p⌋·⌊Wᵢ/p⌋ tokens, as dense conv does.

Loss: cross-entropy of the logits ``(B, 10)`` against fixed labels, mean over the batch. The norms'
weights and biases are drawn around (1, 0), as after training: at their init (1, 0) the padded
gutter stays zero through norm + ReLU and a baseline that forgot to re-mask would pass by luck.

Methods (inputs prepared once per regime, outside the timed step):

* ``padded`` — ``(B, 3, H_max, W_max)`` zero-padded and a {0, 1} mask ``(B, 1, H_max, W_max)``;
               after every conv + norm + ReLU block the activations are multiplied by the mask
               (the 3×3 convs spill valid pixels into the gutter, the norm's shift makes it
               nonzero); batch norm takes its statistics over valid pixels only (a masked batch
               norm); the stride-2 conv's mask is the mask at even pixels; global pooling divides
               by each image's valid pixel count. NaViT: padded patches are masked out of attention
               (boolean ``attn_mask`` on keys) and of the mean over tokens.
* ``loop``   — per image, a batch of one ``(1, 3, Hᵢ, Wᵢ)``. Batch norm over one image at a time
               would normalise with that image's statistics, a different function, so with
               BatchNorm the loop goes layer by layer over the list of images and the norm first
               sums every image's per-channel statistics (``MaskedBatchNorm2d`` on a list); with
               ``--norm group`` (statistics per image) and for NaViT (LayerNorm per token) it is
               the module called on each image alone. Either way every method computes the same
               function: per image, the dense module, with batch-norm statistics over the valid
               pixels of the whole batch.
* ``ours``   — ``torch.nested.nested_tensor(images, layout=multi_jagged)`` ``(B, 3, j0, j1)``
               through the same module, no mask. A method that raises is reported as
               ``n/a (error)`` and not timed.

Before timing, each method's loss and parameter gradients are checked against a float64 per-sample
reference: a loss off by more than 1e-5 relative, or a parameter gradient off by more than 1e-1 of
its largest entry (or of 1e-3 × the largest entry of all gradients), aborts the run
(``--keep-going``: report it, do not time that method); a gradient off by more than 1e-2 is flagged
``ACCURACY`` and timed (float32 rounding through three batch norms over ~10⁵ pixels reaches ~1e-3
on some batches; a wrong function such as a missing re-mask is O(1)).

    python benchmarks/images.py                          # cnn + navit, 3 regimes, 8 steps, 1 thread: ~3 min
    python benchmarks/images.py --quick                  # 3 steps: ~1.5 min
    python benchmarks/images.py --scale 0.25 --steps 2   # sides × 0.25 (and p × 0.25): a smoke run
    python benchmarks/images.py --model cnn --norm group --regime skewed --json out.json --plot out.png
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

try:
    from . import _harness as h
    from ._image_modules import NaViT, SmallCNN
except ImportError:  # run as a script: python benchmarks/images.py
    import _harness as h
    from _image_modules import NaViT, SmallCNN

from torch_multijagged import multi_jagged

B = 16
CLASSES = 10
PATCH = 16
LOSS_RTOL = 1e-5
# Gradients, relative to each gradient's largest entry (or to GRAD_FLOOR × the largest entry of all
# gradients). In float32, three batch norms over ~10⁵ pixels leave some batches' early-layer gradients
# with ~1e-3 relative rounding error (padded and loop alike, while their float64 paths agree to 1e-13),
# and torch's CPU batch_norm on channels-last (N, C) input is ~100× less accurate than on (1, C, N):
# above GRAD_WARN is flagged and still timed; above GRAD_ABORT it is another function (a missing
# re-mask is O(1)).
GRAD_WARN = 1e-2
GRAD_ABORT = 1e-1
GRAD_FLOOR = 1e-3
GOALS = {"ours/loop": 1.0, "packing efficiency": 0.8, "peak/loop": 1.2}
MODELS = ("cnn", "navit")
METHODS = ("padded", "loop", "ours")


class Mismatch(Exception):
    """A method's loss or gradients disagree with the float64 reference."""


# --- regimes and batches ------------------------------------------------------------------------


def regime_sizes(seed: int = 0, scale: float = 1.0, min_side: int = 1, b: int = B) -> dict[str, list[tuple[int, int]]]:
    """(H, W) per image and regime, heights and widths drawn independently; endpoints forced so that
    each regime spans its range and H_max = W_max is the same for every seed. ``scale`` multiplies
    every side (rounded, at least ``min_side``)."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int, k: int) -> list[tuple[int, int]]:
        return [tuple(s) for s in torch.randint(lo, hi + 1, (k, 2), generator=g).tolist()]

    sizes = {
        "near-uniform": [(128, 112), (112, 128)] + draw(112, 128, b - 2),
        "moderate": [(128, 32), (32, 128)] + draw(32, 128, b - 2),
        "skewed": [(128, 128)] + draw(32, 56, b - 1),
    }
    return {k: [(max(min_side, round(a * scale)), max(min_side, round(b * scale))) for a, b in v]
            for k, v in sizes.items()}


def rho(sizes: list[tuple[int, int]]) -> float:
    """ΣHᵢWᵢ / (B·H_max·W_max): the share of the padded envelope that is image."""
    hm, wm = max(s[0] for s in sizes), max(s[1] for s in sizes)
    return sum(a * b for a, b in sizes) / (len(sizes) * hm * wm)


@dataclass
class Batch:
    images: list[torch.Tensor]  # (3, Hᵢ, Wᵢ)
    labels: torch.Tensor  # (B,)
    sizes: list[tuple[int, int]]


def make_batch(sizes: list[tuple[int, int]], seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, a, b, generator=g) for a, b in sizes]
    return Batch(images, torch.randint(0, CLASSES, (len(sizes),), generator=g), sizes)


# --- methods ------------------------------------------------------------------------------------


@dataclass
class Method:
    name: str
    prepare: Callable[[Batch], Any]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]


def prepare_padded(batch: Batch) -> dict:
    hm, wm = max(s[0] for s in batch.sizes), max(s[1] for s in batch.sizes)
    x = batch.images[0].new_zeros(len(batch.images), 3, hm, wm)
    mask = x.new_zeros(len(batch.images), 1, hm, wm)
    for i, (img, (a, b)) in enumerate(zip(batch.images, batch.sizes)):
        x[i, :, :a, :b] = img
        mask[i, :, :a, :b] = 1
    return {"x": x, "mask": mask, "labels": batch.labels}


def loss_padded(model, st: dict) -> torch.Tensor:
    return F.cross_entropy(model(st["x"], st["mask"]), st["labels"])


def prepare_loop(batch: Batch) -> dict:
    return {"x": [img.unsqueeze(0) for img in batch.images], "labels": batch.labels}


def loop_logits(model, xs: list) -> torch.Tensor:
    # Batch norm in training mode needs the whole batch's statistics: layer by layer over the list.
    if isinstance(model, SmallCNN) and model.norm_kind == "batch":
        return model(xs)
    return torch.cat([model(x) for x in xs])


def loss_loop(model, st: dict) -> torch.Tensor:
    return F.cross_entropy(loop_logits(model, st["x"]), st["labels"])


def prepare_ours(batch: Batch) -> dict:
    return {"x": torch.nested.nested_tensor(batch.images, layout=multi_jagged), "labels": batch.labels}


def loss_ours(model, st: dict) -> torch.Tensor:
    return F.cross_entropy(model(st["x"]), st["labels"])


ALL_METHODS = {m.name: m for m in (Method("padded", prepare_padded, loss_padded),
                                   Method("loop", prepare_loop, loss_loop),
                                   Method("ours", prepare_ours, loss_ours))}


def make_model(name: str, norm: str, patch: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = SmallCNN(norm=norm, classes=CLASSES) if name == "cnn" else NaViT(patch=patch, classes=CLASSES)
    # Norms as after training, not at their init (weight 1, bias 0): with a zero shift the padded
    # gutter stays zero through norm + ReLU, and a baseline that forgot to re-mask would pass.
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.GroupNorm, torch.nn.LayerNorm)):
                mod.weight.normal_(1.0, 0.2)
                mod.bias.normal_(0.0, 0.2)
    return model.train()


# --- reference and checks -----------------------------------------------------------------------


def clear_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def step(model, method: Method, state: Any) -> torch.Tensor:
    clear_grads(model)
    loss = method.loss(model, state)
    loss.backward()
    return loss


def reference(model, batch: Batch, make: Callable[[], torch.nn.Module]) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients in float64, per sample (the loop's path, dense ops only)."""
    ref = make().double()
    ref.load_state_dict(model.state_dict())
    st = {"x": [img.double().unsqueeze(0) for img in batch.images], "labels": batch.labels}
    loss = loss_loop(ref, st)
    loss.backward()
    return loss.item(), {k: p.grad for k, p in ref.named_parameters()}


def compare_grads(model, ref_grads: dict) -> tuple[float, list[str]]:
    """(largest relative error over the parameters, problems (abort), warnings (flag))."""
    floor = GRAD_FLOOR * max(r.abs().max().item() for r in ref_grads.values())
    worst, problems, warnings = 0.0, [], []
    for k, p in model.named_parameters():
        r = ref_grads[k]
        if p.grad is None:
            problems.append(f"grad of {k} is None")
            continue
        err = (p.grad.to(r.dtype) - r).abs().max().item() / max(r.abs().max().item(), floor, 1e-30)
        worst = max(worst, err) if err == err else float("nan")
        if not err <= GRAD_ABORT:
            problems.append(f"grad of {k}: max |diff| / max |ref| = {err:.1e} > {GRAD_ABORT}")
        elif err > GRAD_WARN:
            warnings.append(f"grad of {k}: max |diff| / max |ref| = {err:.1e} > {GRAD_WARN} (float32 rounding?)")
    return worst, problems, warnings


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def check(model, method: Method, state, ref_loss: float, ref_grads: dict) -> tuple[Optional[float], Optional[float], list[str]]:
    """(loss, largest relative gradient error, problems (abort), warnings); loss is None when the
    method cannot run the model (problems: [reason, traceback])."""
    try:
        loss = step(model, method, state).item()
    except Exception as e:  # reported, not timed
        return None, None, [f"n/a ({short_error(e)})", traceback.format_exc()], []
    problems = []
    rel = abs(loss - ref_loss) / abs(ref_loss)
    if not rel <= LOSS_RTOL:
        problems.append(f"loss {loss:.8g} vs float64 reference {ref_loss:.8g}: relative error {rel:.1e} > {LOSS_RTOL}")
    grad_err, grad_problems, warnings = compare_grads(model, ref_grads)
    return loss, grad_err, problems + grad_problems, warnings


# --- one model and regime -----------------------------------------------------------------------


def run_regime(model_name: str, regime: str, sizes, model, make, methods: list[Method], args, seed: int) -> dict:
    batch = make_batch(sizes, seed)
    ref_loss, ref_grads = reference(model, batch, make)
    states, losses, grad_errs, notes, runnable, errors = {}, {}, {}, [], [], {}
    for m in methods:
        try:
            states[m.name] = m.prepare(batch)
        except Exception as e:
            notes.append(f"{m.name}: n/a (prepare: {short_error(e)})")
            errors[m.name] = traceback.format_exc()
            continue
        loss, grad_errs[m.name], problems, warnings = check(model, m, states[m.name], ref_loss, ref_grads)
        notes += [f"{m.name}: ACCURACY {w}" for w in warnings]
        losses[m.name] = loss
        if loss is None:
            notes.append(f"{m.name}: {problems[0]}")
            errors[m.name] = problems[1]
            continue
        if problems:
            text = f"{model_name} {regime}: {m.name} disagrees with the float64 reference:\n  " + "\n  ".join(problems)
            if not args.keep_going:
                raise Mismatch(text)
            notes += [f"{m.name}: MISMATCH {p} (not timed)" for p in problems]
            continue
        runnable.append(m)
    finite = [v for v in losses.values() if v is not None]
    spread = (max(finite) - min(finite)) / abs(ref_loss) if finite else None
    if spread is not None and spread > LOSS_RTOL:
        notes.append(f"MISMATCH: the methods' losses spread {spread:.1e} (relative) > {LOSS_RTOL}")

    fns = {m.name: (lambda m=m: step(model, m, states[m.name])) for m in runnable}
    samples = h.time_rounds(fns, rounds=args.steps, warmup=args.warmup, clock=args.clock_fn,
                            desc=f"{model_name} {regime}") if fns else {}
    peak = {}
    for m in runnable:
        clear_grads(model)
        peak[m.name], _ = h.peak_live_bytes(lambda m=m: m.loss(model, states[m.name]).backward())

    if model_name == "navit":  # tokens, not pixels, are what padding costs the transformer
        p = model.patch
        r_used = rho([(a // p, b // p) for a, b in sizes])
    else:
        r_used = rho(sizes)
    res = h.method_figures({m.name: samples[m.name] for m in runnable}, peak, r_used)
    for m in runnable:
        res[m.name].update(loss=losses[m.name], grad_err=grad_errs[m.name])
    return {"sizes": sizes, "B": len(sizes), "pixels": sum(a * b for a, b in sizes),
            "envelope": [max(s[0] for s in sizes), max(s[1] for s in sizes)],
            "rho_pixels": rho(sizes), "rho": r_used, "rho_kind": "tokens" if model_name == "navit" else "pixels",
            "reference_loss": ref_loss, "loss_spread": spread, "methods": res, "notes": notes, "errors": errors}


def print_regime(model_name: str, regime: str, r: dict, names: list[str]) -> None:
    hm, wm = r["envelope"]
    sides = [s for hw in r["sizes"] for s in hw]
    what = (f"ρ_tokens={r['rho']:.3f} (ρ_pixels={r['rho_pixels']:.3f})" if r["rho_kind"] == "tokens"
            else f"ρ={r['rho']:.3f}")
    print(f"\n{model_name} / {regime}: B={r['B']}, sides {min(sides)}–{max(sides)}, envelope {hm}×{wm}, "
          f"ΣHW={r['pixels']}  {what}  (1/ρ = {1 / r['rho']:.2f}×)")
    print(h.method_table(r, names, "ρ", extra=(["grad err"], lambda m: [f"{m['grad_err']:.0e}"])))
    spread = "n/a" if r["loss_spread"] is None else f"{r['loss_spread']:.1e}"
    print(f"  losses' max relative disagreement: {spread}")
    for note in r["notes"]:
        print("  " + note)


# --- goals, main --------------------------------------------------------------------------------


def goal_lines(results: dict) -> list[str]:
    def verdict(v, goal, le=False) -> str:
        return "n/a" if v is None else ("ok" if (v <= goal if le else v >= goal) else "MISS")

    def get(r, key):
        return r["methods"].get("ours", {}).get(key)

    cells = [(f"{mn} {rg}", r) for mn, regs in results.items() for rg, r in regs.items()]
    out = []
    g = GOALS["ours/loop"]
    out.append("ours ≥ the per-sample loop: " + ", ".join(
        f"{k} {h.fmt(get(r, 'speedup_vs_loop'), 2)}× {verdict(get(r, 'speedup_vs_loop'), g)}" for k, r in cells))
    g = GOALS["packing efficiency"]
    parts = [f"{k} {h.fmt(get(r, 'packing_efficiency'), 2)} {verdict(get(r, 'packing_efficiency'), g)}"
             for k, r in cells if k.split()[1] in ("moderate", "skewed")]
    if parts:
        out.append(f"packing efficiency ≥ {g} (moderate, skewed): " + ", ".join(parts))
    g = GOALS["peak/loop"]
    out.append(f"peak memory ≤ {g}× the loop's: " + ", ".join(
        f"{k} {h.fmt(get(r, 'peak_vs_loop'), 2)} {verdict(get(r, 'peak_vs_loop'), g, le=True)}" for k, r in cells))
    return out


def main(argv: Optional[list[str]] = None) -> dict:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--model", "--models", dest="models", default=",".join(MODELS),
                   help="comma-separated subset of " + ", ".join(MODELS))
    p.add_argument("--norm", choices=("batch", "group"), default="batch",
                   help="the CNN's norm: BatchNorm2d in training mode (default) or GroupNorm(8, C)")
    p.add_argument("--steps", type=int, help="timed steps per method and regime (default 8, --quick 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds before timing (default 2)")
    p.add_argument("--regime", "--regimes", dest="regimes", default=",".join(regime_sizes()),
                   help="comma-separated subset of " + ", ".join(regime_sizes()))
    p.add_argument("--methods", help="comma-separated subset and order of " + ",".join(METHODS))
    p.add_argument("--batch", type=int, default=B, help=f"images per batch, at least 2 (default {B})")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every image side and the patch size by this (rounded; 0.25: a quick run)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: with the main thread's CPU time as the clock, the "
                        "least noisy on shared cores; more threads switch the clock to wall time)")
    p.add_argument("--clock", choices=("cpu", "process", "wall"),
                   help="CPU time of the main thread (default with 1 thread), CPU time of all the process's "
                        "threads, or wall time (default otherwise)")
    p.add_argument("--keep-going", action="store_true",
                   help="on a disagreement with the reference, report it and skip timing that method "
                        "instead of aborting")
    p.add_argument("--default-malloc", action="store_true", help="leave glibc's mmap/trim thresholds alone")
    p.add_argument("--plot", metavar="PNG", help="also plot speedup and peak memory per model and regime (matplotlib)")
    p.add_argument("--traceback", action="store_true", help="print the traceback of a method that raised")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ("cpu" if torch.get_num_threads() == 1 else "wall")
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        p.error("--clock cpu measures the main thread only: use it with one thread")
    args.clock_fn = {"cpu": time.thread_time_ns, "process": time.process_time_ns, "wall": time.perf_counter_ns}[args.clock]
    args.steps = args.steps or (3 if args.quick else 8)
    if args.batch < 2:
        p.error(f"--batch must be at least 2, got {args.batch}")
    if not args.scale > 0:
        p.error(f"--scale must be positive, got {args.scale}")
    patch = max(1, round(PATCH * args.scale))
    malloc_note = None if args.default_malloc else h.retain_freed_memory()

    order = [n.strip() for n in (args.methods or ",".join(METHODS)).split(",") if n.strip()]
    for n in order:
        if n not in ALL_METHODS:
            p.error(f"unknown method {n!r}; choose from {', '.join(METHODS)}")
    methods = [ALL_METHODS[n] for n in order]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    all_sizes = regime_sizes(scale=args.scale, min_side=patch, b=args.batch)
    wanted = [r.strip() for r in args.regimes.split(",") if r.strip()]
    for r in wanted:
        if r not in all_sizes:
            p.error(f"unknown regime {r!r}; choose from {', '.join(all_sizes)}")
    load0 = h.environment()["loadavg_1min"]

    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    try:
        for mn in models:
            make = lambda mn=mn: make_model(mn, args.norm, patch)  # noqa: E731
            model = make()
            results[mn] = {}
            for r in wanted:
                idx = list(all_sizes).index(r)
                results[mn][r] = run_regime(mn, r, all_sizes[r], model, make, methods, args, seed=100 + idx)
    except Mismatch as e:
        print(f"ABORTED: {e}\n(the numbers would compare different functions; --keep-going reports and skips instead)",
              file=sys.stderr)
        raise SystemExit(2)
    wall = time.perf_counter() - t0

    env = h.environment()
    clock_name = {"cpu": "CPU time of the main thread", "process": "CPU time of the process (all threads)",
                  "wall": "wall time"}[args.clock]
    print(f"Variable-size images (B={args.batch}), eager forward + cross-entropy + backward, float32 CPU; median {clock_name} "
          f"of {args.steps} interleaved steps ({args.warmup} warmup rounds); scale {args.scale:g}")
    print(f"cnn: 3×(3×3 conv + {'BatchNorm2d' if args.norm == 'batch' else 'GroupNorm(8)'} + ReLU) 3→32→32→32, 3×3 "
          f"stride-2 conv →64, global mean, linear; navit: patch {patch} → D=64, 2 pre-norm layers × 4 heads, "
          f"mean over tokens, linear")
    print("×padded / ×loop: that method's time / this method's per round (median); ×padded·ρ: packing efficiency "
          "(ρ = ΣHᵢWᵢ / (B·H_max·W_max); for navit over patches); peak MiB: max live CPU tensor bytes within one "
          "forward + backward (weights and inputs excluded); Δloss, grad err: vs the float64 per-sample reference (grad err: largest over the parameters of max |Δgrad| / max |grad|)")
    names = [m.name for m in methods]
    for mn, regs in results.items():
        for r, res in regs.items():
            print_regime(mn, r, res, names)
            if args.traceback:
                for n, tb in res["errors"].items():
                    print(f"--- {n} traceback:\n{tb}")
    lines = goal_lines(results)
    h.print_footer(lines, env, malloc_note, load0, wall, mode=", eager")
    payload = {
        "benchmark": "images",
        "config": {"B": args.batch, "norm": args.norm, "patch": patch, "scale": args.scale, "steps": args.steps,
                   "warmup": args.warmup, "threads": torch.get_num_threads(), "clock": args.clock,
                   "malloc": malloc_note, "wall_s": wall, "loss": "cross_entropy(logits, labels), mean over B"},
        "results": results,
        "goals": lines,
    }
    h.write_json(args.json, payload)
    if args.plot:
        flat = {f"{mn}\n{r}": res for mn, regs in results.items() for r, res in regs.items()}
        why = h.plot_regimes(args.plot, flat, names, f"images B={args.batch}, torch {env['torch']}, "
                             f"{torch.get_num_threads()} threads, scale {args.scale:g}", rho_key="rho", rho_label="ρ")
        print(why or f"plot written to {args.plot}")
    return payload


if __name__ == "__main__":
    main()
