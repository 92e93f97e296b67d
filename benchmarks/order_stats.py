"""Order statistics along a ragged dim against a per-sample loop, eager, one thread.

``x.op(1)`` on a ``(B, j0, C)`` float32 batch against ``[s.op(0) for s in x.unbind()]`` (the
components unbound once, outside the timing) for ``sort``, ``sort(stable=True)``, ``topk``,
``kthvalue``, ``median``, ``nanmedian``, ``quantile``, ``cummax`` and ``nonzero`` over batches
from four long samples to a thousand short ones. Methods are interleaved in one process (A B A B
…) and timed in thread CPU time (one intra-op thread does all the work; time the process spends
descheduled by other jobs is left out); the table shows the median over rounds of the per-round
ratio ours / loop (below 1: ours is faster) and the loop's median time. Every method's output is
compared with the loop's (values and indices) before it is timed; a difference is shown in the
last column.

    python benchmarks/order_stats.py [--quick] [--json PATH] [--grad] [--paths per_sample,per_length,index_map]

``--paths`` adds a column per forced path of NOTE [ Dense ops on segments ]
(``ops/reductions/segment_ops.py``; ``index_map`` is the traced path run eagerly); ``--grad``
times forward + backward of a weighted sum (the loop's gradients reach its components).
"""

from __future__ import annotations

import contextlib
import time

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/order_stats.py
    import _harness as h

import torch_multijagged as mj

segment_ops = h.optional_import("torch_multijagged.ops.reductions.segment_ops")

CONFIGS = {  # name: (lengths(generator), C)
    "B4 8-1000 C64": (lambda g: torch.randint(8, 1001, (4,), generator=g), 64),
    "B4 skewed C64": (lambda g: torch.tensor([1000, 8, 8, 8]), 64),
    "B32 8-1000 C64": (lambda g: torch.randint(8, 1001, (32,), generator=g), 64),
    "B32 100-999 C64": (lambda g: torch.randint(100, 1000, (32,), generator=g), 64),
    "B32 skewed C64": (lambda g: torch.tensor([1000] + [8] * 31), 64),
    "B32 8-64 C16": (lambda g: torch.randint(8, 65, (32,), generator=g), 16),
    "B32 8-1000 C1": (lambda g: torch.randint(8, 1001, (32,), generator=g), 1),
    "B256 1-63 C16": (lambda g: torch.randint(1, 64, (256,), generator=g), 16),
    "B1024 1-15 C8": (lambda g: torch.randint(1, 16, (1024,), generator=g), 8),
}

OPS = {  # name: (op along dim d, the shortest length it takes)
    "sort": (lambda t, d: torch.sort(t, d), 0),
    "sort stable": (lambda t, d: torch.sort(t, stable=True, dim=d), 0),
    "topk(1)": (lambda t, d: torch.topk(t, 1, d), 1),
    "topk(8)": (lambda t, d: torch.topk(t, 8, d), 8),
    "kthvalue(3)": (lambda t, d: torch.kthvalue(t, 3, d), 3),
    "median": (lambda t, d: torch.median(t, d), 1),
    "nanmedian": (lambda t, d: torch.nanmedian(t, d), 1),
    "quantile(.3)": (lambda t, d: (torch.quantile(t, 0.3, d),), 1),
    "cummax": (lambda t, d: torch.cummax(t, d), 0),
    "nonzero": (lambda t, d: (torch.nonzero(t > 0),), 0),
}


def _path(name):
    if name == "ours" or segment_ops is None:
        return contextlib.nullcontext()
    return segment_ops.segment_path(name)


def _outputs(out) -> list[list[torch.Tensor]]:
    """Per output (values, indices), per sample."""
    res = []
    for o in out:
        res.append(list(o.unbind()) if isinstance(o, mj.MultiJaggedTensor) else list(o.unbind(0)))
    return res


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def main() -> None:
    ap = h.parser(__doc__.split("\n\n")[0])
    ap.add_argument("--grad", action="store_true", help="forward + backward")
    ap.add_argument("--paths", default="", help="comma-separated forced paths to add (per_sample, per_length, index_map)")
    ap.add_argument("--configs", default="", help="comma-separated config names (default: all)")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    args = ap.parse_args()
    h.set_one_thread()
    load0 = h.environment()["loadavg_1min"]
    t0 = time.perf_counter()
    paths = [p for p in args.paths.split(",") if p]
    methods = ["ours", *paths]
    configs = [c for c in CONFIGS if not args.configs or c in args.configs.split(",")]
    ops = [o for o in OPS if not args.ops or o in args.ops.split(",")]
    rows, results = [], {}
    for cname in configs:
        lengths, c = CONFIGS[cname]
        g = torch.Generator().manual_seed(0)
        ns = lengths(g).tolist()
        comps = [torch.randn(n, c, generator=g) if c > 1 else torch.randn(n, generator=g) for n in ns]
        for oname in ops:
            f, need = OPS[oname]
            if min(ns) < need or (args.grad and oname == "nonzero"):
                continue
            x = mj.nested_tensor(comps, requires_grad=args.grad)
            parts = [t.detach().requires_grad_(args.grad) for t in x.unbind()]
            ws = [torch.randn_like(t) for t in comps]

            def loop(f=f, parts=parts):
                outs = [f(t, 0) for t in parts]
                if args.grad:
                    torch.autograd.grad(sum((o[0] * w[: o[0].shape[0]]).sum() for o, w in zip(outs, ws)), parts)
                return outs

            def ours(m, f=f, x=x):
                with _path(m):
                    out = f(x, 1)
                if args.grad:
                    v = _outputs(out)[0]
                    torch.autograd.grad(sum((o * w[: o.shape[0]]).sum() for o, w in zip(v, ws)), x)
                return out

            ref = loop()
            fns = {"loop": loop}
            differs = []
            for m in methods:
                got = _outputs(ours(m))
                for j, per in enumerate(got):
                    if not all(_same(a.detach(), r[j].detach()) for a, r in zip(per, ref)):
                        differs.append(f"{m}: {'values' if j == 0 else 'indices'} differ")
                fns[m] = lambda m=m: ours(m)
            # calls per sample: at least ~4 ms of loop time per sample
            t = time.thread_time()
            loop()
            once = time.thread_time() - t
            calls = max(1, int(0.004 / max(once, 1e-6)))
            rounds = 5 if args.quick else 15
            # thread CPU time: one intra-op thread does all the work, and time descheduled by other
            # jobs on a shared machine is left out (wall time swung 3x between rounds)
            samples = h.time_interleaved(fns, calls=calls, samples=rounds, warmup=2, clock=time.thread_time_ns)
            loop_ms = h.median(samples["loop"]) / 1e6
            ratios = {m: h.median(h.paired_ratios(samples[m], samples["loop"])) for m in methods}
            results[f"{cname} | {oname}"] = {"loop_ms": loop_ms, **ratios}
            results[f"{cname} | {oname}"]["differs"] = differs
            rows.append([cname, oname, f"{loop_ms:.3f}", *(f"{ratios[m]:.2f}" for m in methods), "; ".join(differs)])
            print(f"{cname:16s} {oname:13s} loop {loop_ms:9.3f} ms  " + "  ".join(f"{m} {ratios[m]:.2f}" for m in methods)
                  + ("  " + "; ".join(differs) if differs else ""), flush=True)
    print()
    print(h.format_table(["batch", "op", "loop ms", *(f"{m} / loop" for m in methods), "outputs"], rows))
    env = h.environment()
    h.write_json(args.json, {"results": results, "environment": env, "grad": args.grad})
    h.print_footer(["ours / loop <= 1 at B in {4, 32}, lengths 8-1000"], env, None, load0, time.perf_counter() - t0,
                   mode=", eager" + (", forward + backward" if args.grad else ", forward"))


if __name__ == "__main__":
    main()
