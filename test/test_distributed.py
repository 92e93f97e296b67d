"""torch.distributed with multi_jagged batches: the collectives of ``torch_multijagged.distributed``
and ``DistributedDataParallel`` training, on two CPU processes over gloo.

Two worker processes are spawned once for the module (``_Pool``) and join one process group; each
test sends them the name of a ``_case_*`` function, which both run, and fails with the worker's
traceback if either raises. Every rank can rebuild every rank's samples from seeds, so each case
checks against the per-sample reference: the concatenation of all ranks' samples. A hung
collective fails the test after ``_TIMEOUT`` seconds (and gloo's own timeout ends the workers).
"""

from __future__ import annotations

import datetime
import os
import queue
import sys
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_multijagged as mj
from torch_multijagged import distributed as mjd
from _reference import RECT, RECT3_MID, SEQ, SQUARE, STATIC_LEAD, Structure, build

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)

WORLD = 2
_TIMEOUT = 60.0  # per case, generous for a loaded CI machine; a case takes well under a second

# Per-rank lengths: a zero-length sample on rank 0, different batch sizes.
LENGTHS = {0: ((3, 2), (0, 1), (2, 3)), 1: ((1, 4), (4, 0))}
EMPTY_ON_1 = {0: ((2, 1), (0, 3)), 1: ()}  # rank 1 holds B = 0


# ----------------------------------------------------------------------------- worker pool
def _serve(rank: int, init: str, jobs, results) -> None:
    torch.set_num_threads(1)
    light = "torch.distributed.nn" not in sys.modules  # importing the package did not load it
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=_TIMEOUT))
    results.put((rank, "ready", light))
    while True:
        name = jobs.get()
        if name is None:
            break
        try:
            globals()[name](rank)
            results.put((rank, name, None))
        except BaseException:  # noqa: BLE001 — report everything to the test
            results.put((rank, name, traceback.format_exc()))
    dist.destroy_process_group()
    results.close()
    results.join_thread()
    # Everything is delivered; skip the interpreter's teardown (about 4 s of torch's atexit work).
    os._exit(0)


class _Pool:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.closed = False
        self.tmp = tempfile.TemporaryDirectory()
        init = "file://" + os.path.join(self.tmp.name, "store")
        self.jobs = [ctx.Queue() for _ in range(WORLD)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_serve, args=(r, init, self.jobs[r], self.results), daemon=True) for r in range(WORLD)]
        for p in self.procs:
            p.start()
        self.light = all(msg[2] for msg in self._collect("ready", 120.0).values())

    def _collect(self, name: str, timeout: float) -> dict:
        out = {}
        while len(out) < WORLD:
            try:
                rank, got, payload = self.results.get(timeout=timeout)
            except queue.Empty:
                self.close()
                pytest.fail(f"{name}: no answer from ranks {sorted(set(range(WORLD)) - set(out))} within {timeout} s (hung collective?)")
            assert got == name, (got, name)
            out[rank] = (rank, got, payload)
        return out

    def run(self, name: str) -> None:
        if self.closed:
            pytest.fail("the workers were stopped after an earlier case hung")
        for q in self.jobs:
            q.put(name)
        errors = [f"rank {r}:\n{p}" for r, (_, _, p) in sorted(self._collect(name, _TIMEOUT).items()) if p]
        if errors:
            pytest.fail("\n".join(errors))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        self.tmp.cleanup()


@pytest.fixture(scope="module")
def pool():
    p = _Pool()
    yield p
    p.close()


# ----------------------------------------------------------------------------- helpers
def _structure(layout, lengths, dtype):
    return Structure(layout, lengths, 2, 3, dtype)


def _comps(layout, lengths_by_rank, rank, dtype):
    c = _structure(layout, lengths_by_rank[rank], dtype).components(seed=100 + rank)
    if dtype.is_complex:  # components() draws reals; give the imaginary part values too
        g = torch.Generator().manual_seed(7 + rank)
        for t in c:
            t.imag = torch.randn(t.shape, generator=g, dtype=t.real.dtype)
    return c


def _union(layout, lengths_by_rank, dtype):
    return [c for r in range(WORLD) for c in _comps(layout, lengths_by_rank, r, dtype)]


def _check_samples(out, expected, dtype, ragged_dims):
    assert isinstance(out, mj.MultiJaggedTensor), type(out)
    assert out.dtype == dtype and out.ragged_dims == ragged_dims, (out.dtype, out.ragged_dims)
    got = out.unbind()
    assert len(got) == len(expected), (len(got), len(expected))
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"sample {i}: {a} vs {b}"


CASES = [
    (SEQ, torch.float32),
    (SQUARE, torch.float64),
    (RECT, torch.bfloat16),
    (STATIC_LEAD, torch.int64),
    (RECT3_MID, torch.float16),
    (SEQ, torch.bool),
    (SQUARE, torch.int32),
    (SEQ, torch.complex64),
]


# ----------------------------------------------------------------------------- cases (run on every rank)
def _case_all_gather(rank):
    for lengths in (LENGTHS, EMPTY_ON_1):
        for layout, dtype in CASES:
            x, _ = build(_comps(layout, lengths, rank, dtype), layout.ragged_dims)
            out = mjd.all_gather(x)
            _check_samples(out, _union(layout, lengths, dtype), dtype, layout.ragged_dims)
            if layout is SQUARE:  # both pair dims keep one nested int
                assert out.shape[1] == out.shape[2], out.shape
    # Non-contiguous values (a transpose of static dims), and under inference_mode / no_grad.
    comps = _comps(STATIC_LEAD, LENGTHS, rank, torch.float32)
    x = build(comps, STATIC_LEAD.ragged_dims)[0].transpose(1, 3)  # (B, C, j0, S)
    expected = [c.transpose(0, 2) for c in _union(STATIC_LEAD, LENGTHS, torch.float32)]
    _check_samples(mjd.all_gather(x), expected, torch.float32, (2,))
    with torch.inference_mode():
        x = build(comps, STATIC_LEAD.ragged_dims)[0]
        _check_samples(mjd.all_gather(x), _union(STATIC_LEAD, LENGTHS, torch.float32), torch.float32, (2,))
    x = build(comps, STATIC_LEAD.ragged_dims, requires_grad=True)[0]
    with torch.no_grad():
        out = mjd.all_gather(x)
        assert not out.requires_grad
        _check_samples(out, _union(STATIC_LEAD, LENGTHS, torch.float32), torch.float32, (2,))


def _case_all_gather_empty_everywhere(rank):
    x, _ = build(_comps(SQUARE, {0: (), 1: ()}, rank, torch.float32), SQUARE.ragged_dims)
    out = mjd.all_gather(x)
    assert out.shape[0] == 0 and out.dtype == torch.float32 and out.values().shape == (0, 3)


def _case_all_gather_grad(rank):
    # loss_q = (q + 1) * Σ y², so the gradient reaching each sample is 2 x Σ_q (q + 1) = 6 x on
    # two ranks, whichever rank it came from. Rank 1 holds B = 0 with no grad (it still has to
    # run backward: the backward of all_gather is a collective).
    comps = _comps(SEQ, EMPTY_ON_1, rank, torch.float64)
    x, leaves = build(comps, SEQ.ragged_dims, requires_grad=True)
    y = mjd.all_gather(x)
    assert y.requires_grad
    _check_samples(y.detach(), _union(SEQ, EMPTY_ON_1, torch.float64), torch.float64, (1,))
    loss = (y * y).sum() * (rank + 1)
    loss.backward()
    for leaf, c in zip(leaves, comps):
        torch.testing.assert_close(leaf.grad, 6 * c, rtol=0, atol=1e-12)
    with torch.no_grad():
        assert not mjd.all_gather(x).requires_grad


def _case_gather(rank):
    for dst in (0, 1):
        for layout, dtype in CASES[:3]:
            x, _ = build(_comps(layout, LENGTHS, rank, dtype), layout.ragged_dims)
            out = mjd.gather(x, dst=dst)
            if rank == dst:
                _check_samples(out, _union(layout, LENGTHS, dtype), dtype, layout.ragged_dims)
            else:
                assert out is None


def _case_broadcast(rank):
    for src in (0, 1):
        for layout, dtype in CASES:
            comps = _comps(layout, LENGTHS, src, dtype)
            x = build(comps, layout.ragged_dims)[0] if rank == src else None
            out = mjd.broadcast(x, src=src)
            _check_samples(out, comps, dtype, layout.ragged_dims)
    # B = 0 from the source
    x = build(_comps(SQUARE, EMPTY_ON_1, 1, torch.float32), SQUARE.ragged_dims)[0] if rank == 1 else None
    assert mjd.broadcast(x, src=1).shape[0] == 0


def _case_scatter(rank):
    union = {0: LENGTHS[0] + LENGTHS[1], 1: ()}
    for layout, dtype in CASES:
        comps = _comps(layout, union, 0, dtype)  # five samples, one of zero length
        x = build(comps, layout.ragged_dims)[0] if rank == 0 else None
        out = mjd.scatter(x, src=0)  # default split: 3 + 2
        _check_samples(out, comps[:3] if rank == 0 else comps[3:], dtype, layout.ragged_dims)
        out = mjd.scatter(x, src=0, split_sizes=[0, 5])  # rank 0 gets B = 0
        _check_samples(out, [] if rank == 0 else comps, dtype, layout.ragged_dims)


def _case_errors_raise_on_every_rank(rank):
    # A mismatch or a bad input on one rank makes every rank raise instead of hanging.
    c = 3 if rank == 0 else 4
    x = mj.nested_tensor([torch.zeros(2, c), torch.zeros(0, c)], ragged_dims=(1,))
    with pytest.raises(ValueError, match=r"all_gather\(\): expected the same dtype, ragged dims and static sizes"):
        mjd.all_gather(x)
    bad = torch.zeros(2, 3) if rank == 1 else mj.nested_tensor([torch.zeros(2, 3)], ragged_dims=(1,))
    with pytest.raises(TypeError if rank == 1 else ValueError, match=r"all_gather\(\)"):
        mjd.all_gather(bad)
    x = mj.nested_tensor([torch.zeros(2, 3)] * 3, ragged_dims=(1,)) if rank == 0 else None
    with pytest.raises(ValueError, match=r"scatter\(\): (expected split_sizes|the input on the source rank 0)"):
        mjd.scatter(x, src=0, split_sizes=[1, 1])
    with pytest.raises(TypeError if rank == 0 else ValueError, match=r"broadcast\(\)"):
        mjd.broadcast(torch.zeros(3) if rank == 0 else None, src=0)
    # The group still works afterwards.
    y = mjd.all_gather(mj.nested_tensor([torch.full((rank + 1, 2), float(rank))], ragged_dims=(1,)))
    assert [t.shape[0] for t in y.unbind()] == [1, 2]


# ----------------------------------------------------------------------------- DDP
class _PairModel(torch.nn.Module):
    """Linear + layer_norm on singles, broadcast into a pair, a pair transform, mean back."""

    def __init__(self, c: int = 3, h: int = 4, unused: bool = False) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(c, h)
        self.pair = torch.nn.Linear(h, h)
        self.out = torch.nn.Linear(h, 2)
        self.unused = torch.nn.Linear(2, 2) if unused else None

    def forward(self, x):  # x: (B, j0, C)
        s = torch.nn.functional.layer_norm(self.inp(x), (self.inp.out_features,))
        pair = torch.relu(self.pair(s.unsqueeze(-2) + s.unsqueeze(-3)))  # (B, j0, j0, H)
        return self.out(pair.mean(dim=-2) + s)  # (B, j0, 2)


def _per_sample_loss_mean(out):
    # Σ over each sample's elements (0 for an empty sample), then the mean over samples: every
    # rank holds the same number of samples, so DDP's average of the ranks' gradients is the
    # gradient of this loss on the union of the samples.
    return (out * out).sum(dim=(1, 2)).mean()


def _ddp_check(rank, **ddp_kwargs):
    lengths = {0: (3, 0, 2), 1: (1, 4, 2)}
    batches = [
        [torch.randn(n, 3, generator=torch.Generator().manual_seed(1000 * step + 10 * r + i), dtype=torch.float64) for i, n in enumerate(lengths[r])]
        for step in range(3)
        for r in (rank,)
    ]
    union = [
        [torch.randn(n, 3, generator=torch.Generator().manual_seed(1000 * step + 10 * r + i), dtype=torch.float64) for r in range(WORLD) for i, n in enumerate(lengths[r])]
        for step in range(3)
    ]
    torch.manual_seed(0)
    unused = ddp_kwargs.get("find_unused_parameters", False)
    ref = _PairModel(unused=unused).double()
    model = _PairModel(unused=unused).double()
    model.load_state_dict(ref.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        x = mj.nested_tensor(batches[step], ragged_dims=(1,))
        out = ddp(x)  # a multi_jagged output passes through DDP's output handling
        assert isinstance(out, mj.MultiJaggedTensor)
        _per_sample_loss_mean(out).backward()
        ref_opt.zero_grad()
        _per_sample_loss_mean(ref(mj.nested_tensor(union[step], ragged_dims=(1,)))).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            if q.grad is None:
                assert p.grad is None or not p.grad.any(), name
                continue
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"step {step} grad {name}: {m}")
        opt.step()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def _case_ddp(rank):
    _ddp_check(rank)


def _case_ddp_find_unused_parameters(rank):
    # DDP walks the (multi_jagged) output for tensors and passes it through its _DDPSink.
    _ddp_check(rank, find_unused_parameters=True)


def _case_ddp_static_graph(rank):
    _ddp_check(rank, static_graph=True)


# ----------------------------------------------------------------------------- tests
def test_import_does_not_load_distributed_nn(pool):
    assert pool.light


def test_all_gather_per_rank_batches_and_lengths(pool):
    pool.run("_case_all_gather")


def test_all_gather_empty_on_every_rank(pool):
    pool.run("_case_all_gather_empty_everywhere")


def test_all_gather_gradient_is_sum_over_ranks(pool):
    pool.run("_case_all_gather_grad")


def test_gather_to_each_rank(pool):
    pool.run("_case_gather")


def test_broadcast_from_each_rank(pool):
    pool.run("_case_broadcast")


def test_scatter_default_and_explicit_splits(pool):
    pool.run("_case_scatter")


def test_errors_raise_on_every_rank(pool):
    pool.run("_case_errors_raise_on_every_rank")


def test_ddp_gradients_match_single_process(pool):
    pool.run("_case_ddp")


def test_ddp_find_unused_parameters(pool):
    pool.run("_case_ddp_find_unused_parameters")


def test_ddp_static_graph(pool):
    pool.run("_case_ddp_static_graph")
