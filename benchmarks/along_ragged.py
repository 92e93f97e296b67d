"""Ops along a ragged dim against the per-sample loop, eager, one thread: softmax / log_softmax
(sequences, pairs, attention scores), the scans ``cumsum`` / ``cumprod`` / ``logcumsumexp`` /
``cummax`` along a ragged and a static dim.

For every case the loop is the dense op on each sample's tensor (a list of dense tensors made
once, outside the timing; no packing of its results), forward alone and forward + backward
(``autograd.grad`` of every input). Methods alternate within each round (loop, ours, loop, …)
and the table shows the median over rounds of ours / loop (thread CPU time; glibc keeps freed
memory, ``_harness.retain_freed_memory``): below 1 is faster than the loop. ``/packed`` divides by
the loop followed by one ``cat`` of its results (its gradients), the packed buffer ours returns. Outputs are checked against the loop before timing (equal, or within 1e-5 for gradients).

    python benchmarks/along_ragged.py [--quick] [--json PATH] [--only SUBSTRING]
"""

from __future__ import annotations

import time
from typing import Any

import torch

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/along_ragged.py
    import _harness as h

import torch_multijagged as mj

# CPU time of the calling thread: all the work runs on it (one intra-op thread, CPU autograd), and
# it leaves out the time other jobs on a shared machine hold the core
CLOCK = time.thread_time_ns


def _lengths(kind: str, b: int, g: torch.Generator) -> list[int]:
    if kind == "8-1000":
        return torch.randint(8, 1001, (b,), generator=g).tolist()
    if kind == "8-200":
        return torch.randint(8, 201, (b,), generator=g).tolist()
    if kind == "5-60":
        return torch.randint(5, 61, (b,), generator=g).tolist()
    if kind == "1-63":
        return torch.randint(1, 64, (b,), generator=g).tolist()
    if kind == "skewed":  # one long sample, the rest short
        return [1000] + torch.randint(8, 41, (b - 1,), generator=g).tolist()
    raise ValueError(kind)


def _cases(quick: bool):
    """(name, component shapes' builder, ragged dims, batched op, per-sample op)."""
    sm = [("softmax", lambda t, d: t.softmax(d)), ("log_softmax", lambda t, d: torch.log_softmax(t, d))]
    scans = [("cumsum", lambda t, d: t.cumsum(d)), ("cumprod", lambda t, d: t.cumprod(d)),
             ("logcumsumexp", lambda t, d: t.logcumsumexp(d)), ("cummax", lambda t, d: t.cummax(d).values)]
    seq = [(32, "8-1000"), (4, "8-1000"), (32, "skewed"), (32, "8-200")] if not quick else [(32, "8-1000"), (4, "8-1000")]
    for b, lk in seq:
        for name, op in sm + scans:
            yield f"{name}(1) seq B={b} n={lk} C=64", b, lk, (lambda n: (n, 64)), (1,), 1, op
        if not quick:
            for name, op in scans[:1] + scans[3:]:
                yield f"{name}(2) seq B={b} n={lk} C=64 (static)", b, lk, (lambda n: (n, 64)), (1,), 2, op
    yield "softmax(1) seq B=256 n=1-63 C=16", 256, "1-63", (lambda n: (n, 16)), (1,), 1, sm[0][1]
    yield "cumsum(1) seq B=256 n=1-63 C=16", 256, "1-63", (lambda n: (n, 16)), (1,), 1, scans[0][1]
    for b in (8, 32):
        yield f"softmax(1) pair B={b} n=5-60 C=16", b, "5-60", (lambda n: (n, n, 16)), (1, 2), 1, sm[0][1]
        yield f"softmax(2) pair B={b} n=5-60 C=16", b, "5-60", (lambda n: (n, n, 16)), (1, 2), 2, sm[0][1]
        yield f"log_softmax(2) pair B={b} n=5-60 C=16", b, "5-60", (lambda n: (n, n, 16)), (1, 2), 2, sm[1][1]
        yield f"softmax(-1) scores B={b} H=4 n=5-60", b, "5-60", (lambda n: (4, n, n)), (2, 3), 3, sm[0][1]


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    # within 1e-5: the same script also measures earlier revisions, whose results were not dense's bits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def run_case(b, lk, shape, rd, d, op, rounds: int, backward: bool, g) -> dict[str, Any]:
    comps = [torch.randn(*shape(n), generator=g) for n in _lengths(lk, b, g)]
    x = mj.nested_tensor(comps, ragged_dims=rd, requires_grad=backward)
    leaves = [c.clone().requires_grad_(backward) for c in comps]
    grads = [torch.randn(c.shape, generator=g) for c in comps]
    gx = mj.nested_tensor(grads, ragged_dims=rd)

    def loop():
        outs = [op(c, d - 1) for c in leaves]
        return torch.autograd.grad(outs, leaves, grads) if backward else outs

    def loop_packed():  # the loop's results (its gradients) packed into one buffer, as ours are
        return torch.cat([o.reshape(-1) for o in loop()])

    def ours():
        out = op(x, d)
        return torch.autograd.grad(out, x, gx) if backward else out

    for o, e in zip((ours()[0] if backward else ours()).unbind(), loop()):
        _check(o, e)
    ctx = torch.no_grad() if not backward else torch.enable_grad()
    with ctx:
        t = h.time_interleaved({"loop": loop, "loop_packed": loop_packed, "ours": ours}, calls=1, samples=rounds, warmup=2,
                               clock=CLOCK)
    return {"loop_ms": h.median(t["loop"]) / 1e6, "ours_ms": h.median(t["ours"]) / 1e6,
            "ratio": h.median(h.paired_ratios(t["ours"], t["loop"])),
            "ratio_packed": h.median(h.paired_ratios(t["ours"], t["loop_packed"]))}


def main() -> None:
    p = h.case_parser(__doc__.splitlines()[0])
    p.add_argument("--default-malloc", action="store_true", help="keep glibc's default mmap threshold")
    a = p.parse_args()
    h.set_one_thread()
    malloc_note = None if a.default_malloc else h.retain_freed_memory()
    rounds = a.rounds or (7 if a.quick else 21)
    t0 = time.time()
    rows, results = [], {}
    for name, b, lk, shape, rd, d, op in _cases(a.quick):
        if a.only not in name:
            continue
        g = torch.Generator().manual_seed(0)
        fwd = run_case(b, lk, shape, rd, d, op, rounds, False, g)
        bwd = run_case(b, lk, shape, rd, d, op, rounds, True, g)
        results[name] = {"forward": fwd, "forward_backward": bwd}
        rows.append([name, h.fmt(fwd["loop_ms"], 3), h.fmt(fwd["ratio"], 2), h.fmt(fwd["ratio_packed"], 2),
                     h.fmt(bwd["loop_ms"], 3), h.fmt(bwd["ratio"], 2), h.fmt(bwd["ratio_packed"], 2)])
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
    h.print_cases(["case", "loop fwd ms", "/loop", "/packed", "loop fwd+bwd ms", "/loop", "/packed"], rows, t0, malloc_note)
    h.write_json(a.json, {"results": results, "environment": h.environment()})


if __name__ == "__main__":
    main()
