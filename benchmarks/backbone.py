"""An unmodified classifier backbone on images of different sizes: ours against the per-image loop.

The backbone is transformers' ``ResNetModel`` (ResNet-18: basic blocks, depths 2-2-2-2, random
init, batch norm in eval mode so that every image's output is a function of that image alone),
built from ``nn`` modules and run as published. Ours: the batch ``(B, 3, j0, j1)`` in one call.
The loop: the model on each ``(1, 3, Hᵢ, Wᵢ)`` image, as a user without a ragged layout writes
it. Forward to the pooled features, a squared-sum loss, backward. Before timing, both methods'
features and parameter gradients are checked in float64 against each other (they compute the
same function); then float32 steps are timed, interleaved.

    python benchmarks/backbone.py [--quick] [--threads N] [--batch B] [--json PATH]
"""

from __future__ import annotations

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/backbone.py
    import _harness as h

import torch_multijagged as mj


def make_model():
    transformers = h.optional_import("transformers")
    if transformers is None:
        raise SystemExit("backbone.py needs transformers (it is in the package's test extra)")
    cfg = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                    layer_type="basic")
    return transformers.ResNetModel(cfg).eval()


def sizes_for(batch: int, lo: int, hi: int, seed: int = 1) -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(seed)
    return [(int(torch.randint(lo, hi + 1, (1,), generator=g)), int(torch.randint(lo, hi + 1, (1,), generator=g)))
            for _ in range(batch)]


def loop_step(model, imgs):
    out = torch.cat([model(i[None]).pooler_output.flatten(1) for i in imgs])
    out.square().sum().backward()
    return out


def ours_step(model, batch):
    out = model(batch).pooler_output.flatten(1)
    out.square().sum().backward()
    return out


def check(model, imgs) -> float:
    """Largest relative difference of features and parameter gradients, float64."""
    m64 = model.double()
    imgs64 = [i.double() for i in imgs]
    m64.zero_grad(set_to_none=True)
    a = loop_step(m64, imgs64)
    ga = [p.grad.clone() for p in m64.parameters()]
    m64.zero_grad(set_to_none=True)
    b = ours_step(m64, mj.nested_tensor(imgs64))
    gb = [p.grad.clone() for p in m64.parameters()]
    model.float()
    a, b = a.detach(), b.detach()
    worst = float((a - b).abs().max() / a.abs().max())
    for x, y in zip(ga, gb):
        worst = max(worst, float((x - y).abs().max() / x.abs().max().clamp_min(1e-30)))
    return worst


def main(argv=None) -> dict:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sides", default="32,64", help="smallest and largest image side (default 32,64)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lo, hi = (int(s) for s in args.sides.split(","))
    model = make_model()
    g = torch.Generator().manual_seed(2)
    imgs = [torch.randn(3, hh, ww, generator=g) for hh, ww in sizes_for(args.batch, lo, hi)]
    err = check(model, imgs)
    if err > 1e-9:
        raise SystemExit(f"backbone.py: ours and the loop disagree in float64 (relative {err:.1e})")
    batch = mj.nested_tensor(imgs)

    def run(step, x):
        model.zero_grad(set_to_none=True)
        step(model, x)

    fns = {"loop": lambda: run(loop_step, imgs), "ours": lambda: run(ours_step, batch)}
    rounds = 3 if args.quick else 8
    t = h.time_rounds(fns, rounds=rounds, warmup=1, desc="backbone")
    ms = {k: h.median(v) / 1e6 for k, v in t.items()}
    speed = h.median(h.paired_ratios(t["loop"], t["ours"]))
    peak = {}
    for k, f in fns.items():
        model.zero_grad(set_to_none=True)  # gradients count in full (``peak_live_bytes``)
        peak[k] = h.peak_live_bytes(f)[0] / 2**20
    print(f"ResNet-18 (transformers ResNetModel, eval-mode batch norm), B={args.batch}, sides {lo}–{hi}, "
          f"forward + backward, {args.threads} thread(s); float64 check: max relative difference {err:.1e}; "
          "peak MiB: live CPU tensor bytes within one step (weights and inputs excluded)")
    print(h.format_table(["method", "ms/step", "×loop", "peak MiB", "peak/loop"],
                         [["loop", f"{ms['loop']:.1f}", "1.00", f"{peak['loop']:.1f}", "1.00"],
                          ["ours", f"{ms['ours']:.1f}", f"{speed:.2f}", f"{peak['ours']:.1f}",
                           f"{peak['ours'] / peak['loop']:.2f}"]]))
    result = {"ms": ms, "ours_vs_loop": speed, "peak_mib": peak, "check": err, "threads": args.threads,
              "batch": args.batch, "sides": [lo, hi]}
    h.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
