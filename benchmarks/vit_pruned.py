"""Token-pruned ViT inference at CPU scale, float32: padded SDPA + key-padding mask vs ours (the
kept tokens packed into a multi_jagged batch), images/s, interleaved in one process.

The dispatch-aware ragged attention paper's pipeline: a ViT with patch 16 on 224² images (196
patches + CLS), width 384, 6 heads (D = 64), depth 4, MLP ratio 4, pre-norm blocks. Per image, a
token score — a fixed random projection of the patch embedding (position embedding included) —
keeps the top-k patches, the keep ratio drawn per image uniformly in 30–90 % (seeded), plus CLS;
then the blocks, the final norm and a 1000-way head on CLS. Inference under ``torch.no_grad()``;
the timed step is the whole pipeline, images to logits (patch embedding, scoring, selection,
pad or pack, blocks, head). Both methods run the same ``Block`` modules with the same code:

    qkv = self.qkv(x).unflatten(-1, (3, H, D))             # (B, N, 3, H, D)
    q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))   # (B, H, N, D)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    x = x + self.proj(o.transpose(1, 2).flatten(-2))

* ``padded`` — the kept tokens (in score order) padded to the largest count: ``(B, k_max + 1, C)``,
               a bool key-padding mask ``(B, 1, 1, k_max + 1)``; linears, norms and MLP run on the
               padded rows too (that is the cost of padding).
* ``ours``   — the kept tokens (in image order) selected with a bool mask into packed
               ``(Σ(k_i + 1), C)`` rows, ``torch_multijagged.from_packed`` → ``(B, j0, C)``, the same
               blocks with ``mask=None``; CLS is row ``offsets[i]`` of the values.

Before timing, both methods' logits are compared with a per-image reference (each image's kept
tokens alone through the blocks, no mask, float64): max |diff| ≤ 1e-4 · max |logit| + 1e-5.

    python benchmarks/vit_pruned.py                # B = 32 images, 10 rounds: ~2 min
    python benchmarks/vit_pruned.py --quick        # B = 8, 3 rounds
    python benchmarks/vit_pruned.py [--batch N] [--rounds N] [--threads N] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/vit_pruned.py
    import _harness as h

import torch_multijagged as mj

IMG, PATCH, WIDTH, HEADS, DEPTH, MLP, CLASSES = 224, 16, 384, 6, 4, 4, 1000
KEEP = (0.3, 0.9)
GOAL = 1.5  # ours images/s ≥ GOAL × padded's


class Block(nn.Module):
    """Pre-norm ViT block; ``forward`` serves a padded batch (with a mask) and ours (without)."""

    def __init__(self, c: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(c, eps=1e-6)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.norm2 = nn.LayerNorm(c, eps=1e-6)
        self.fc1 = nn.Linear(c, mlp * c)
        self.fc2 = nn.Linear(mlp * c, c)

    def attention(self, x, mask=None):
        c = x.shape[-1]
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, c // self.heads))  # (B, N, 3, H, D)
        q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))  # (B, H, N, D) each
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(o.transpose(1, 2).flatten(-2))

    def forward(self, x, mask=None):
        x = x + self.attention(self.norm1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class PrunedViT(nn.Module):
    def __init__(self):
        super().__init__()
        n = (IMG // PATCH) ** 2
        self.patch = nn.Conv2d(3, WIDTH, PATCH, PATCH)
        self.cls = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, WIDTH) * 0.02)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS, MLP) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH, eps=1e-6)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.register_buffer("score_dir", torch.randn(WIDTH) / WIDTH**0.5)

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, 196, C) with positions, CLS (B, 1, C) with its position)."""
        t = self.patch(images).flatten(2).transpose(1, 2) + self.pos[:, 1:]
        return t, (self.cls + self.pos[:, :1]).expand(t.shape[0], 1, -1)

    def scores(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens @ self.score_dir  # (B, 196)

    def classify(self, cls_out: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(cls_out))


# --- methods: images -> logits (timed whole) ----------------------------------------------------


def forward_padded(model: PrunedViT, images: torch.Tensor, keep: torch.Tensor, k_max: int) -> torch.Tensor:
    """``keep``: (B,) kept patch counts; ``k_max``: their max (a host int, as a data loader knows it)."""
    tokens, cls = model.embed(images)
    order = model.scores(tokens).argsort(dim=1, descending=True)[:, :k_max]  # best k_max, score order
    kept = tokens.gather(1, order[:, :, None].expand(-1, -1, tokens.shape[-1]))
    x = torch.cat([cls, kept], 1)  # (B, k_max + 1, C)
    mask = (torch.arange(k_max + 1)[None, :] <= keep[:, None])[:, None, None, :]  # CLS + k_i valid keys
    for blk in model.blocks:
        x = blk(x, mask)
    return model.classify(x[:, 0])


def keep_mask(model: PrunedViT, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(B, 197) bool: CLS and each image's top-``keep[i]`` patches, in image order."""
    order = model.scores(tokens).argsort(dim=1, descending=True)
    rank_kept = torch.arange(tokens.shape[1])[None, :] < keep[:, None]  # (B, 196) in score order
    m = torch.zeros_like(rank_kept).scatter_(1, order, rank_kept)
    return torch.cat([torch.ones_like(m[:, :1]), m], 1)


def forward_ours(model: PrunedViT, images: torch.Tensor, keep: torch.Tensor, k_max: int) -> torch.Tensor:
    tokens, cls = model.embed(images)
    m = keep_mask(model, tokens, keep)
    packed = torch.cat([cls, tokens], 1)[m]  # (Σ(k_i + 1), C), CLS first in each image
    sizes = keep + 1
    offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    x = mj.from_packed(packed, offsets, sizes)  # (B, j0, C)
    for blk in model.blocks:
        x = blk(x)
    return model.classify(x.values()[x.offsets()[:-1]])  # CLS rows


def reference(model: PrunedViT, images: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per image, float64: its kept tokens alone through the blocks, no mask."""
    ref = PrunedViT().double()
    ref.load_state_dict(model.state_dict())
    tokens, cls = ref.embed(images.double())
    m = keep_mask(ref, tokens, keep)
    full = torch.cat([cls, tokens], 1)
    out = []
    for i in range(images.shape[0]):
        x = full[i, m[i]][None]
        for blk in ref.blocks:
            x = blk(x)
        out.append(ref.classify(x[:, 0]))
    return torch.cat(out)


# --- timing and report --------------------------------------------------------------------------


def short(e: BaseException, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def plot(path: str, res: dict, title: str) -> Optional[str]:
    plt = h.optional_import("matplotlib.pyplot")
    if plt is None:
        return "matplotlib not installed (pip install -e '.[bench]'); --plot skipped"
    names = list(res["methods"])
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.bar(names, [res["methods"][n]["images_per_s"] for n in names])
    ax.set_ylabel("images / s (median)")
    for i, n in enumerate(names):
        r = res["methods"][n]["x_padded"]
        ax.annotate(f"{r:.2f}× padded", (i, res["methods"][n]["images_per_s"]), ha="center", va="bottom", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def main() -> None:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, help="images per batch (default 32, --quick 8)")
    p.add_argument("--rounds", type=int, help="timed rounds (default 10, --quick 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--clock", choices=("cpu", "wall"), help="default: wall with > 1 thread, main-thread CPU time with 1")
    p.add_argument("--plot", metavar="PNG", help="also plot images/s (matplotlib)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu measures the main thread only: use it with --threads 1")
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    b = args.batch or (8 if args.quick else 32)
    rounds = args.rounds or (3 if args.quick else 10)
    malloc_note = h.retain_freed_memory()

    torch.manual_seed(0)
    model = PrunedViT().eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randn(b, 3, IMG, IMG, generator=g)
    n_patches = (IMG // PATCH) ** 2
    ratio = KEEP[0] + (KEEP[1] - KEEP[0]) * torch.rand(b, generator=g)
    keep = (ratio * n_patches).round().long()  # (B,) kept patches per image
    k_max = int(keep.max())
    lengths = (keep + 1).tolist()
    rho_tokens = sum(lengths) / (b * max(lengths))
    rho_attn = sum(n * n for n in lengths) / (b * max(lengths) ** 2)
    methods = {"padded": forward_padded, "ours": forward_ours}

    with torch.no_grad():
        ref = reference(model, images, keep)
        fns, notes, errs = {}, [], {}
        for name, f in methods.items():
            try:
                out = f(model, images, keep, k_max)
            except Exception as e:
                notes.append(f"{name}: n/a ({short(e)})")
                continue
            err = float((out.double() - ref).abs().max())
            errs[name] = err
            tol = 1e-4 * float(ref.abs().max()) + 1e-5
            if not err <= tol:
                notes.append(f"{name}: MISMATCH max |logits - ref| = {err:.1e} > {tol:.1e}; not timed")
                continue
            fns[name] = lambda f=f: f(model, images, keep, k_max)
        load0 = h.environment()["loadavg_1min"]
        t0 = time.perf_counter()
        samples = h.time_rounds(fns, rounds, args.warmup, clock, desc=f"ViT B={b}")
        wall = time.perf_counter() - t0

    pad = samples.get("padded")
    res = {"B": b, "keep": keep.tolist(), "tokens_per_image": lengths, "rho_tokens": rho_tokens, "rho_attn": rho_attn,
           "methods": {}, "errors": errs, "notes": notes}
    for n, s in samples.items():
        q25, med, q75 = h.quartiles(s)
        res["methods"][n] = {"ms": med / 1e6, "ms_iqr": [q25 / 1e6, q75 / 1e6], "images_per_s": b / (med / 1e9),
                             "x_padded": h.median(h.paired_ratios(pad, s)) if pad else None, "samples_ns": s}

    env = h.environment()
    print(f"Token-pruned ViT inference: patch {PATCH}, {IMG}², width {WIDTH}, {HEADS} heads, depth {DEPTH}, MLP ×{MLP}, "
          f"keep {KEEP[0]:.0%}–{KEEP[1]:.0%} of {n_patches} patches per image + CLS; float32 CPU, torch.no_grad(); "
          f"images → logits, median {args.clock} time of {rounds} interleaved rounds ({args.warmup} warmup)")
    print(f"B={b}: tokens per image {min(lengths)}–{max(lengths)} (Σ {sum(lengths)}), ρ_tokens={rho_tokens:.3f}, "
          f"ρ_attn={rho_attn:.3f}")
    rows = []
    for n in methods:
        m = res["methods"].get(n)
        if m is None:
            rows.append([n] + ["n/a"] * 5)
            continue
        rows.append([n, h.fmt(m["ms"], 1), f"{m['ms_iqr'][0]:.1f}–{m['ms_iqr'][1]:.1f}", h.fmt(m["images_per_s"], 1),
                     h.fmt(m["x_padded"], 2), f"{errs[n]:.1e}"])
    print(h.format_table(["method", "ms/batch", "IQR", "images/s", "×padded", "max |Δlogit|"], rows))
    for note in notes:
        print("  " + note)
    v = res["methods"].get("ours", {}).get("x_padded")
    goal = f"ours ≥ {GOAL}× padded (images/s): {h.fmt(v, 2)}× " + ("n/a" if v is None else ("ok" if v >= GOAL else "MISS"))
    h.print_footer([goal], env, malloc_note, load0, wall, what="s timing")
    h.write_json(args.json, {
        "benchmark": "vit_pruned",
        "config": {"img": IMG, "patch": PATCH, "width": WIDTH, "heads": HEADS, "depth": DEPTH, "mlp": MLP,
                   "keep": KEEP, "B": b, "rounds": rounds, "warmup": args.warmup, "threads": torch.get_num_threads(),
                   "clock": args.clock, "malloc": malloc_note},
        "results": res, "goal": goal,
    })
    if args.plot:
        why = plot(args.plot, res, f"pruned ViT B={b}, torch {env['torch']}, {torch.get_num_threads()} threads")
        print(why or f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
