"""PyTorch's own ``torch.jagged`` OpInfo samples, run with the layout switched to multi_jagged.

``torch.testing._internal.opinfo.definitions.nested.njt_op_db`` holds, for every op that
``torch.jagged`` supports, sample inputs made of NJTs and a per-sample reference (``op.ref``,
mostly ``unbind`` + the dense op). For each sample this module

1. runs the op on the NJT sample and judges it against ``op.ref`` (is ``torch.jagged`` right?);
2. converts every NJT in the sample to multi_jagged with the same components (an NJT with holes
   is compacted; a transposed one keeps its ragged dim where it is), runs the op, and judges it
   against the same reference;
3. with ``backward=True``, also compares the gradients of every input that requires grad with
   the reference's gradients, for a fixed weighting of the outputs.

``python test/njt_opinfo.py`` prints the parity table (per op family and per op);
``test_njt_opinfo.py`` turns it into tests: every sample ``torch.jagged`` gets right, we get right.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import zlib
from collections import defaultdict

import torch
from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
from torch.testing._internal.opinfo.definitions.nested import njt_op_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_multijagged as mj
from torch_multijagged import MultiJaggedTensor

DTYPE = torch.float32  # what torch's NJT OpInfo tests run on CPU
OPS = {op.full_name: op for op in njt_op_db if op.supports_njt}
# torch.jagged's own backward of these segfaults on torch 2.13 (the process dies inside autograd),
# so its samples are not run for torch.jagged and count as torch.jagged failures.
NJT_CRASHES = {("split_with_sizes", True)}


def family(op) -> str:
    if isinstance(op, UnaryUfuncInfo):
        return "elementwise unary"
    if isinstance(op, BinaryUfuncInfo):
        return "elementwise binary"
    if isinstance(op, ReductionOpInfo) or op.full_name in ("max.reduction_with_dim", "min.reduction_with_dim"):
        return "reduction"
    return "other"


@dataclasses.dataclass
class Outcome:
    name: str
    njt_ok: bool
    ours_ok: bool
    njt_error: str = ""
    ours_error: str = ""
    applicable: bool = True  # False: the reference reads an NJT's holes, which ours cannot hold


def _is_njt(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, MultiJaggedTensor) and t.is_nested


def _compact(t):
    if _is_njt(t) and t._lengths is not None:
        c = torch.nested.as_nested_tensor(list(t.detach().unbind()), layout=torch.jagged)
        return c.requires_grad_(t.requires_grad)
    return t


def to_ours(t):
    """The multi_jagged twin of an NJT (a new leaf with the NJT's components and ``requires_grad``)."""
    if not _is_njt(t):
        return t
    src = t.detach()
    if src._lengths is not None:  # holes: compact to the same components
        src = torch.nested.as_nested_tensor(list(src.unbind()), layout=torch.jagged)
        if t._ragged_idx != 1:
            raise AssertionError("holes with a transposed ragged dim")
    out = mj.from_jagged(src.contiguous() if t._ragged_idx == 1 else src).detach()
    return out.requires_grad_(t.requires_grad)


def _flat(x) -> list:
    """Outputs as a list of ('nested', [components]) / ('dense', tensor) / ('other', value)."""
    if isinstance(x, (list, tuple)):
        return [e for item in x for e in _flat(item)]
    if isinstance(x, MultiJaggedTensor) or (isinstance(x, torch.Tensor) and x.is_nested):
        return [("nested", list(x.unbind()))]
    if isinstance(x, torch.Tensor):
        return [("dense", x)]
    return [("other", x)]


def _close(a, b, loose=False) -> None:
    # Gradients of a dense operand broadcast over every element are sums of thousands of float32
    # terms, in another order than the per-sample reference's: allow for that rounding.
    tol = {"rtol": 1e-4, "atol": 1e-4} if loose and a.dtype == torch.float32 else {}
    torch.testing.assert_close(a, b, equal_nan=True, check_stride=False, **tol)


def compare(actual, expected, loose=False) -> None:
    fa, fe = _flat(actual), _flat(expected)
    if len(fa) != len(fe):
        raise AssertionError(f"{len(fa)} outputs, expected {len(fe)}")
    for (ka, va), (ke, ve) in zip(fa, fe):
        if ka == "nested" or ke == "nested":
            ca = va if ka == "nested" else list(va.unbind())
            ce = ve if ke == "nested" else list(ve.unbind())
            if len(ca) != len(ce):
                raise AssertionError(f"batch {len(ca)}, expected {len(ce)}")
            if ka != ke:
                raise AssertionError(f"{ka} output, expected {ke}")
            for x, y in zip(ca, ce):
                _close(x, y, loose)
        elif ka == "dense":
            if ke != "dense":
                raise AssertionError(f"tensor output, expected {type(ve).__name__}")
            _close(va, ve, loose)
        else:
            if va != ve:
                raise AssertionError(f"{va!r} != {ve!r}")


def _weights(like: torch.Tensor, k: int) -> torch.Tensor:
    n = like.numel()
    w = torch.sin(torch.arange(n, dtype=torch.float64) * 0.37 + k).to(like.dtype)
    return w.reshape(like.shape)


def _loss(out):
    """A fixed weighting of every floating output element, the same for every layout."""
    total, k = None, 0
    for kind, v in _flat(out):
        parts = v if kind == "nested" else ([v] if kind == "dense" else [])
        for p in parts:
            k += 1
            if not (p.is_floating_point() and p.requires_grad):
                continue
            term = (p * _weights(p.detach(), k)).sum()
            total = term if total is None else total + term
    return total


def _grad_inputs(sample) -> list:
    leaves, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def _grads(out, inputs) -> list:
    loss = _loss(out)
    if loss is None:
        return [None] * len(inputs)
    gs = torch.autograd.grad(loss, inputs, allow_unused=True)
    return list(gs)


def _compare_grads(ours, ref) -> None:
    for g, r in zip(ours, ref):
        if r is None or g is None:
            if (r is None) != (g is None):
                # an unused input: treat None and zeros alike
                z = r if g is None else g
                comps = list(z.unbind()) if _flat(z)[0][0] == "nested" else [z]
                if any(c.abs().sum() != 0 for c in comps):
                    raise AssertionError("gradient missing")
            continue
        compare(g, r, loose=True)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def samples(op, requires_grad: bool, seed: int = 0):
    torch.manual_seed(seed)
    return list(op.sample_inputs(device="cpu", dtype=DTYPE, requires_grad=requires_grad))


def run_op(op, backward: bool = False, seed: int = 0, lazy: bool = False, at_most: int | None = None) -> list[Outcome]:
    """Judge ``torch.jagged`` and ours on every sample of ``op``; with ``lazy``, judge
    ``torch.jagged`` only on the samples we get wrong (``njt_ok`` is then True for the others).
    ``at_most``: every k-th sample only, from an offset that depends on the op's name (so that
    across ops every kind of sample is still run)."""
    try:
        ss = samples(op, requires_grad=backward, seed=seed)
    except Exception as e:  # the op has no NJT samples for this mode
        return [Outcome("<samples>", False, False, _short(e), "")]
    if at_most is not None and len(ss) > at_most:
        k = math.ceil(len(ss) / at_most)
        ss = ss[zlib.crc32(op.full_name.encode()) % k :: k]
    outcomes = []
    for s in ss:
        name = s.name
        # the reference (and its gradients) from the NJT sample
        try:
            ref = op.ref(op, s)
            ref_g = _grads(ref, _grad_inputs(s)) if backward else None
        except Exception as e:
            outcomes.append(Outcome(name, False, False, "ref: " + _short(e), ""))
            continue
        holes = any(_is_njt(t) and t._lengths is not None for t in tree_flatten((s.input, s.args, s.kwargs))[0])
        if holes:  # does the reference read the holes? (e.g. a full reduction over values())
            try:
                s_c = _fresh(s)
                s_c.input, s_c.args, s_c.kwargs = tree_map(_compact, (s.input, s.args, s.kwargs))
                compare(op.ref(op, s_c), ref)
            except Exception:
                outcomes.append(Outcome(name, False, False, "reference reads holes", "", applicable=False))
                continue
        ours_ok, ours_err = _judge_ours(op, s, ref, ref_g, backward)
        njt_ok, njt_err = True, ""
        if not (lazy and ours_ok):
            njt_ok, njt_err = _judge_njt(op, s, ref, ref_g, backward)
        outcomes.append(Outcome(name, njt_ok, ours_ok, njt_err, ours_err))
    return outcomes


def _judge_njt(op, s, ref, ref_g, backward):
    try:
        if (op.full_name, backward) in NJT_CRASHES:
            raise RuntimeError("torch.jagged crashes on this op (segfault), not run")
        s_njt = _fresh(s)
        out = op.op(s_njt.input, *s_njt.args, **s_njt.kwargs)
        compare(out, ref)
        if backward:
            _compare_grads(_grads(out, _grad_inputs(s_njt)), ref_g)
    except Exception as e:
        return False, _short(e)
    return True, ""


def _judge_ours(op, s, ref, ref_g, backward):
    try:
        s_ours = tree_map(to_ours, (s.input, s.args, s.kwargs))
        inp, args, kwargs = s_ours
        out = op.op(inp, *args, **kwargs)
        compare(out, ref)
        if backward:
            ins = [t for t in tree_flatten(s_ours)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            _compare_grads(_grads(out, ins), ref_g)
    except Exception as e:
        return False, _short(e)
    return True, ""


def _fresh(s):
    """The NJT sample again with new leaves of the same values (its graph stays separate from ref's)."""

    def clone(t):
        if isinstance(t, torch.Tensor):
            c = t.detach().clone().requires_grad_(t.requires_grad)
            if hasattr(t, "_batch_dim"):
                c._batch_dim = t._batch_dim
            return c
        return t

    new = dataclasses.replace(s) if dataclasses.is_dataclass(s) else None
    if new is None:
        import copy

        new = copy.copy(s)
    new.input, new.args, new.kwargs = tree_map(clone, (s.input, s.args, s.kwargs))
    return new


def score(names=None, backward=False, verbose=False):
    rows = {}
    for name, op in sorted(OPS.items()):
        if names and name not in names:
            continue
        if backward and not op.supports_autograd:
            continue
        if verbose:
            print(name, file=sys.stderr, flush=True)
        rows[name] = run_op(op, backward=backward)
    fam = defaultdict(lambda: [0, 0, 0])  # njt right, ours right among them, ours-only
    for name, outs in rows.items():
        f = fam[family(OPS[name])]
        for o in outs:
            f[0] += o.njt_ok
            f[1] += o.njt_ok and o.ours_ok
            f[2] += o.ours_ok and not o.njt_ok
    return rows, fam


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ops", nargs="*")
    p.add_argument("--backward", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    rows, fam = score(a.ops, a.backward, a.verbose)
    mode = "backward" if a.backward else "forward"
    print(f"NJT OpInfo samples ({mode}, {DTYPE}): samples torch.jagged gets right, and how many of those we get right")
    print(f"{'family':22} {'jagged ok':>9} {'ours ok':>8} {'parity':>7} {'ours only':>9}")
    tot = [0, 0, 0]
    for k in sorted(fam):
        n, m, x = fam[k]
        tot = [tot[0] + n, tot[1] + m, tot[2] + x]
        print(f"{k:22} {n:9d} {m:8d} {100 * m / max(n, 1):6.1f}% {x:9d}")
    print(f"{'all':22} {tot[0]:9d} {tot[1]:8d} {100 * tot[1] / max(tot[0], 1):6.1f}% {tot[2]:9d}")
    for name, outs in rows.items():
        miss = [o for o in outs if o.njt_ok and not o.ours_ok]
        extra = [o for o in outs if o.ours_ok and not o.njt_ok]
        if miss or (a.verbose and extra):
            print(f"\n{name}: {len(miss)} missed, {len(extra)} only ours")
            for o in miss:
                print(f"  MISS {o.name}: {o.ours_error}")
            if a.verbose:
                for o in extra:
                    print(f"  ONLY {o.name}: jagged {o.njt_error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
