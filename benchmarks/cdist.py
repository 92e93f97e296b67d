"""``torch.cdist`` of a multi_jagged batch of point sets against the per-sample loop, eager, one
thread: each sample's distances to itself ``(B, j0, j0)``, for p = 2, 1 and inf.

The loop is dense ``torch.cdist`` on each sample's tensor (a list made once, outside the timing; no
packing of its results), forward alone and forward + backward (``autograd.grad`` of every input).
Methods alternate within each round (loop, ours, loop, …); the table shows min(ours) / min(loop)
over the rounds (thread CPU time): below 1 is faster than the loop. ``/packed`` divides by the
loop followed by one ``cat`` of its results (its gradients), the packed buffer ours returns. Outputs are checked against
the loop before timing (forward values, loosely: the script also measures earlier revisions).

    python benchmarks/cdist.py [--quick] [--json PATH] [--only SUBSTRING]
"""

from __future__ import annotations

import time
from typing import Any

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/cdist.py
    import _harness as h

import torch_multijagged as mj

CLOCK = time.thread_time_ns
CASES = [(32, 16, 200), (8, 500, 1000), (256, 1, 32)]  # (B, shortest, longest sample)


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    # loose: dense torch's matmul form for p = 2 (more than 25 rows) leaves ~1e-3 on the diagonal,
    # where the norm of the differences gives 0 (earlier revisions)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-2)


def run_case(b: int, lo: int, hi: int, p: float, rounds: int, backward: bool, g) -> dict[str, Any]:
    comps = [torch.randn(n, 3, generator=g) for n in torch.randint(lo, hi + 1, (b,), generator=g).tolist()]
    x = mj.nested_tensor(comps, requires_grad=backward)
    leaves = [c.clone().requires_grad_(backward) for c in comps]
    grads = [torch.randn(c.shape[0], c.shape[0], generator=g) for c in comps]
    gx = torch.zeros_like(torch.cdist(x, x, p).detach())  # the cotangent, with the output's nested ints
    gx.values().copy_(torch.cat([t.reshape(-1) for t in grads]).view_as(gx.values()))

    def loop():
        outs = [torch.cdist(c, c, p) for c in leaves]
        return torch.autograd.grad(outs, leaves, grads) if backward else outs

    def loop_packed():  # the loop's results (its gradients) packed into one buffer, as ours are
        return torch.cat([o.reshape(-1) for o in loop()])

    def ours():
        out = torch.cdist(x, x, p)
        return torch.autograd.grad(out, x, gx) if backward else out

    if not backward:
        for o, e in zip(ours().unbind(), loop()):
            _check(o, e)
    ctx = torch.no_grad() if not backward else torch.enable_grad()
    with ctx:
        t = h.time_interleaved({"loop": loop, "loop_packed": loop_packed, "ours": ours}, calls=1, samples=rounds,
                               warmup=2, clock=CLOCK)
    return {"loop_ms": min(t["loop"]) / 1e6, "ours_ms": min(t["ours"]) / 1e6, "ratio": min(t["ours"]) / min(t["loop"]),
            "ratio_packed": min(t["ours"]) / min(t["loop_packed"])}


def main() -> None:
    p = h.case_parser(__doc__.splitlines()[0])
    a = p.parse_args()
    h.set_one_thread()
    note = h.retain_freed_memory()
    rounds = a.rounds or (5 if a.quick else 11)
    t0 = time.time()
    rows, results = [], {}
    for b, lo, hi in CASES:
        for pv in (2.0, 1.0, float("inf")):
            name = f"cdist p={pv:g} B={b} n={lo}-{hi} C=3"
            if a.only not in name:
                continue
            g = torch.Generator().manual_seed(0)
            fwd = run_case(b, lo, hi, pv, rounds, False, g)
            bwd = run_case(b, lo, hi, pv, rounds, True, g)
            results[name] = {"forward": fwd, "forward_backward": bwd}
            rows.append([name, h.fmt(fwd["loop_ms"], 3), h.fmt(fwd["ratio"], 2), h.fmt(fwd["ratio_packed"], 2),
                         h.fmt(bwd["loop_ms"], 3), h.fmt(bwd["ratio"], 2), h.fmt(bwd["ratio_packed"], 2)])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    h.print_cases(["case", "loop fwd ms", "/loop", "/packed", "loop fwd+bwd ms", "/loop", "/packed"], rows, t0, note)
    h.write_json(a.json, {"results": results, "environment": h.environment()})


if __name__ == "__main__":
    main()
