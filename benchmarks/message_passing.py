"""Message passing over a batch of graphs against the per-sample loop, eager, one thread:
``gather`` of each edge's source node, ``scatter_add`` / ``scatter_reduce`` (sum, amax, mean) of
the messages into their target nodes along the ragged dim, with the index expanded over the
features (``dst.unsqueeze(-1).expand(-1, -1, C)``, as message-passing code writes it) or made
contiguous, and ``index_add`` with a per-sample index (PyG's ``out.index_add(0, dst, msg)``).

Nodes ``(B, j0, C)``, four edges per node ``(B, j1, C)``, C = 32, float32. The loop is the dense
op on each sample's tensors (lists made once, outside the timing), forward alone and forward +
backward (``autograd.grad`` of the nodes and the messages). Methods alternate within each round
and the table shows the median over rounds of ours / loop (thread CPU time): below 1 is faster
than the loop. Outputs are checked against the loop before timing.

    python benchmarks/message_passing.py [--quick] [--json PATH] [--only SUBSTRING]
"""

from __future__ import annotations

import time
from typing import Any

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/message_passing.py
    import _harness as h

import torch_multijagged as mj

CLOCK = time.thread_time_ns
C = 32
REGIMES = [(32, 16, 200), (8, 500, 1000), (256, 1, 32)]


def _ops():
    """(name, batched op, per-sample op, whether the index is contiguous): each takes nodes,
    edge targets (expanded over C unless contiguous) and messages."""
    yield "gather", lambda x, i, m: x.gather(1, i), lambda x, i, m: x.gather(0, i), False
    yield "gather (contiguous index)", lambda x, i, m: x.gather(1, i), lambda x, i, m: x.gather(0, i), True
    yield "scatter_add", lambda x, i, m: x.scatter_add(1, i, m), lambda x, i, m: x.scatter_add(0, i, m), False
    for red in ("sum", "amax", "mean"):
        yield (f"scatter_reduce {red}", lambda x, i, m, r=red: x.scatter_reduce(1, i, m, r, include_self=False),
               lambda x, i, m, r=red: x.scatter_reduce(0, i, m, r, include_self=False), False)
    yield "scatter_reduce amax (contiguous index)", (lambda x, i, m: x.scatter_reduce(1, i, m, "amax", include_self=False)), \
        (lambda x, i, m: x.scatter_reduce(0, i, m, "amax", include_self=False)), True
    yield "index_add (B, j) index", lambda x, i, m: x.index_add(1, i, m), lambda x, i, m: x.index_add(0, i, m), None


def run_case(b, lo, hi, op, ref, contiguous, rounds: int, backward: bool, g) -> dict[str, Any]:
    lens = torch.randint(lo, hi + 1, (b,), generator=g).tolist()
    nodes = [torch.randn(n, C, generator=g) for n in lens]
    dst = [torch.randint(0, n, (4 * n,), generator=g) for n in lens]
    msgs = [torch.randn(4 * n, C, generator=g) for n in lens]
    if contiguous is None:  # a 1-d index per sample
        idx_l, idx = dst, mj.nested_tensor(dst)
    else:
        idx_l = [t.unsqueeze(-1).expand(-1, C) for t in dst]
        idx = mj.nested_tensor(dst).unsqueeze(-1).expand(-1, -1, C)
        if contiguous:
            idx_l = [t.contiguous() for t in idx_l]
            idx = mj.nested_tensor(idx_l)
    x = mj.nested_tensor(nodes, requires_grad=backward)
    m = mj.nested_tensor(msgs, requires_grad=backward)
    xl = [t.clone().requires_grad_(backward) for t in nodes]
    ml = [t.clone().requires_grad_(backward) for t in msgs]

    def loop():
        outs = [ref(a, i, s) for a, i, s in zip(xl, idx_l, ml)]
        if not backward:
            return outs
        return torch.autograd.grad(outs, xl + ml, [torch.ones_like(o) for o in outs], allow_unused=True)

    def ours():
        out = op(x, idx, m)
        if not backward:
            return out
        return torch.autograd.grad(out, [x, m], torch.ones_like(out), allow_unused=True)

    got, want = ours(), loop()
    if not backward:
        for a, e in zip(got.unbind(), want):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    ctx = torch.no_grad() if not backward else torch.enable_grad()
    with ctx:
        t = h.time_interleaved({"loop": loop, "ours": ours}, calls=1, samples=rounds, warmup=2, clock=CLOCK)
    return {"loop_ms": h.median(t["loop"]) / 1e6, "ours_ms": h.median(t["ours"]) / 1e6,
            "ratio": h.median(h.paired_ratios(t["ours"], t["loop"]))}


def main() -> None:
    p = h.case_parser(__doc__.splitlines()[0])
    a = p.parse_args()
    h.set_one_thread()
    malloc_note = h.retain_freed_memory()
    rounds = a.rounds or (5 if a.quick else 15)
    t0 = time.time()
    rows, results = [], {}
    for b, lo, hi in REGIMES[:2] if a.quick else REGIMES:
        for name, op, ref, contiguous in _ops():
            case = f"{name} B={b} n={lo}-{hi}"
            if a.only not in case:
                continue
            g = torch.Generator().manual_seed(0)
            try:
                fwd = run_case(b, lo, hi, op, ref, contiguous, rounds, False, g)
                bwd = run_case(b, lo, hi, op, ref, contiguous, rounds, True, g)
            except (NotImplementedError, RuntimeError) as e:  # (an earlier revision without the op)
                print(f"{case}: raises {type(e).__name__}", flush=True)
                continue
            results[case] = {"forward": fwd, "forward_backward": bwd}
            rows.append([case, h.fmt(fwd["loop_ms"], 3), h.fmt(fwd["ratio"], 2), h.fmt(bwd["loop_ms"], 3), h.fmt(bwd["ratio"], 2)])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    h.print_cases(["case", "loop fwd ms", "/loop", "loop fwd+bwd ms", "/loop"], rows, t0, malloc_note)
    h.write_json(a.json, {"results": results, "environment": h.environment()})


if __name__ == "__main__":
    main()
