"""Matmul between multi_jagged tensors that creates or contracts ragged dims, eager, one thread:
ours' time over a per-sample loop's (``unbind``, the dense op per sample, ``cat``), methods
interleaved in one process (min over repeats), forward and forward + backward.

Forms: ``x @ x.mT`` (B, j0, 64); ``q @ k.mT`` and ``attn @ v`` with 4 heads of 16;
``einsum("bic,bjc->bij")``; ``nn.MultiheadAttention`` with ``need_weights=True`` (64 wide, 4
heads); the chain ``softmax(q @ k.mT · s) @ v`` written out. Regimes: B ∈ {4, 32} × lengths (uniform 8–200, near-uniform 40–48, short 2–16, skewed
one of 200 and the rest 8–14).

``--sample-forms`` runs instead the forms of NOTE [ Contractions sample by sample ] and the
``einsum`` forms in matmul's shape of permuted operands, at the sizes of the models that write them
(B = 8, lengths 7–40, and B = 4, lengths 64–128; 4 heads of 8): triangle attention's ``q @ kᵀ``
and ``attn @ v`` on a pair ``(B, j0, H, j0, d)``, the outer-product mean (MSA depth 4 and 16, 8
channels), attention with the heads between the rows (``bihd,bjhd->bhij``, ``bhij,bjhd->bihd``)
and pair-weighted averaging (``bhij,bhsjd->bhsid``).

    python benchmarks/ragged_matmul.py [--quick] [--backward] [--plans] [--sample-forms] [--only FORM] [--json PATH]

``--plans`` adds ours with every product forced to one matmul per sample (``ours-loop``) and to
one zero-padded group (``ours-padded``): the two ends of the cost rule (NOTE [ Ragged matmul
plans ]). Times are the minimum over the interleaved repeats (7, ``--quick`` 3).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

import torch_multijagged as mj

try:
    from torch_multijagged.kernels import ragged_mm as kmm
except ImportError:  # an older checkout, for before/after figures
    kmm = None

try:
    from . import _harness as h
except ImportError:  # run as a script: python benchmarks/ragged_matmul.py
    import _harness as h


def _lengths(regime: str, b: int, g: torch.Generator) -> list[int]:
    if regime == "uniform 8-200":
        return torch.randint(8, 200, (b,), generator=g).tolist()
    if regime == "near-uniform 40-48":
        return torch.randint(40, 49, (b,), generator=g).tolist()
    if regime == "short 2-16":
        return torch.randint(2, 17, (b,), generator=g).tolist()
    if regime in ("7-40", "64-128"):
        low, high = map(int, regime.split("-"))
        return torch.randint(low, high + 1, (b,), generator=g).tolist()
    return [200] + torch.randint(8, 15, (b - 1,), generator=g).tolist()


def _time(fns: dict, repeats: int) -> dict:
    best = {k: float("inf") for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.thread_time()  # this thread's CPU time: other processes on the machine do not count
            f()
            best[k] = min(best[k], time.thread_time() - t)
    return best


def _cases(lens, g, backward: bool):
    c, h, d = 64, 4, 16
    x = mj.nested_tensor([torch.randn(n, c, generator=g) for n in lens], requires_grad=backward)
    q = mj.nested_tensor([torch.randn(h, n, d, generator=g) for n in lens], ragged_dims=(2,), requires_grad=backward)
    k = mj.nested_tensor([torch.randn(h, n, d, generator=g) for n in lens], ragged_dims=(2,), requires_grad=backward)
    v = mj.nested_tensor([torch.randn(h, n, d, generator=g) for n in lens], ragged_dims=(2,), requires_grad=backward)
    k, v = ((t + 0 * q).detach().requires_grad_(backward) for t in (k, v))  # one nested int, leaves
    attn = torch.softmax(q @ k.transpose(-1, -2), -1).detach().requires_grad_(backward)
    mha = torch.nn.MultiheadAttention(c, h, batch_first=True)
    return {
        "x @ x.mT": ((x,), lambda x: x @ x.transpose(1, 2), lambda s: s @ s.T),
        "q @ k.mT (4-D)": ((q, k), lambda q, k: q @ k.transpose(-1, -2), lambda q, k: q @ k.transpose(-1, -2)),
        "einsum bic,bjc->bij": ((x,), lambda x: torch.einsum("bic,bjc->bij", x, x), lambda s: s @ s.T),
        "attn @ v (4-D)": ((attn, v), lambda a, v: a @ v, lambda a, v: a @ v),
        "MHA need_weights": ((x,), lambda x: mha(x, x, x)[0], lambda s: mha(s, s, s)[0]),
        "softmax(q k.mT) v": ((q, k, v), _chain, _chain),
    }


def _chain(q, k, v):
    """Attention written out, as eager model code has it."""
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


def _sample_cases(lens, g, backward: bool):
    h, d, c = 4, 8, 8

    def batch(shape, ragged):
        return mj.nested_tensor([torch.randn(shape(n), generator=g) for n in lens], ragged_dims=ragged)

    def share(x, *others):  # one structure (a model projects q, k, v from one tensor): leaves of x's extents
        return [(t + 0 * x).detach().requires_grad_(backward) for t in (x, *others)]

    q, k = share(batch(lambda n: (n, h, n, d), (1, 3)), batch(lambda n: (n, h, n, d), (1, 3)))
    attn = torch.softmax(q @ k.transpose(-1, -2), -1).detach().requires_grad_(backward)
    rows_q, rows_k = share(batch(lambda n: (n, h, d), (1,)), batch(lambda n: (n, h, d), (1,)))
    scores = torch.einsum("bihd,bjhd->bhij", rows_q, rows_k).softmax(-1).detach().requires_grad_(backward)
    msa = {s: share(batch(lambda n, s=s: (n, s, c), (1,)), batch(lambda n, s=s: (n, s, c), (1,))) for s in (4, 16)}
    vs = batch(lambda n: (h, 4, n, d), (3,)).detach().requires_grad_(backward)
    opm = "...bac,...dae->...bdce"

    def ein(eq):
        per = ",".join(t[1:] for t in eq.split("->")[0].split(",")) + "->" + eq.split("->")[1][1:]
        return (lambda *xs: torch.einsum(eq, *xs)), (lambda *xs: torch.einsum(per, *xs))

    return {
        "pair q @ k.mT": ((q, k), lambda q, k: q @ k.transpose(-1, -2), lambda q, k: q @ k.transpose(-1, -2)),
        "pair attn @ v": ((attn, k), lambda a, v: a @ v, lambda a, v: a @ v),
        "outer mean S=4": ((*msa[4],), lambda a, b: torch.einsum(opm, a, b), lambda a, b: torch.einsum(opm, a, b)),
        "outer mean S=16": ((*msa[16],), lambda a, b: torch.einsum(opm, a, b), lambda a, b: torch.einsum(opm, a, b)),
        "bihd,bjhd->bhij": ((rows_q, rows_k), *ein("bihd,bjhd->bhij")),
        "bhij,bjhd->bihd": ((scores, rows_k), *ein("bhij,bjhd->bihd")),
        "bhij,bhsjd->bhsid": ((scores, vs), *ein("bhij,bhsjd->bhsid")),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--sample-forms", action="store_true", help="the forms run sample by sample, at model sizes")
    ap.add_argument("--only", default="", help="only the forms whose name contains this")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    rows = []
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    repeats = 3 if args.quick else 7
    plans = {"ours": None}
    if args.plans and kmm is not None:
        plans.update({"ours-loop": "loop", "ours-padded": "padded"})
    print(f"{'form':22s} {'B':>3s} {'lengths':20s} {'loop ms':>8s} " + " ".join(f"{p:>12s}" for p in plans))
    if args.sample_forms:
        regimes = [(8, "7-40"), (4, "64-128")]
    else:
        regimes = [(b, r) for b in (4, 32) for r in ("uniform 8-200", "near-uniform 40-48", "short 2-16", "skewed 200 + 8-14")]
    for b, regime in regimes:
        lens = _lengths(regime, b, g)
        cases = _sample_cases if args.sample_forms else _cases
        for name, (inputs, ours, per) in cases(lens, g, args.backward).items():
            if args.only and args.only not in name:
                continue

            def loop(inputs=inputs, per=per):
                out = torch.cat([per(*s).reshape(-1) for s in zip(*(t.unbind() for t in inputs))])
                if args.backward:
                    out.sum().backward()
                return out

            def run(strategy, inputs=inputs, ours=ours):
                ctx = kmm.force_plan(strategy) if kmm is not None else contextlib.nullcontext()
                with ctx:
                    out = ours(*inputs)
                    if args.backward:
                        out.sum().backward()
                return out

            fns = {"per-sample": loop}
            fns.update({p: (lambda s=s: run(s)) for p, s in plans.items()})
            t = _time(fns, repeats)
            rows.append({"form": name, "B": b, "lengths": regime, "loop_ms": t["per-sample"] * 1e3,
                         **{f"{p}_x_loop": t[p] / t["per-sample"] for p in plans}})
            print(f"{name:22s} {b:3d} {regime:20s} {t['per-sample'] * 1e3:8.2f} "
                  + " ".join(f"{t[p] / t['per-sample']:12.2f}" for p in plans), flush=True)

    h.write_json(args.json, {"backward": args.backward, "rows": rows})


if __name__ == "__main__":
    main()
