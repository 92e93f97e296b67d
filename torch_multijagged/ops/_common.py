"""Shared helpers for handlers: dim bookkeeping, wrapping, error text. Partitions and their
cached index maps live in ``structure.py`` (NOTE [ Derived maps ])."""

from __future__ import annotations

import functools
import math

import torch
from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_callback

from ..structure import Partition, RaggedExtent
from ..tensor import MultiJaggedTensor

__all__ = [
    "canonical_dims",
    "eager_route",
    "MJT",
    "static_dims",
    "values_dim",
    "canonical_dim",
    "wrap",
]

MJT = MultiJaggedTensor


@functools.lru_cache(maxsize=None)
def static_dims(ndim: int, ragged_dims: tuple[int, ...]) -> tuple[int, ...]:
    """Logical dims (≥ 1) that are static, in order; values dim of the k-th is k + 1."""
    return tuple(d for d in range(1, ndim) if d not in ragged_dims)


def values_dim(x: MJT, d: int) -> int:
    """Values dim of static logical dim ``d`` (already canonical and not ragged)."""
    return static_dims(len(x._size), x._ragged_dims).index(d) + 1


def canonical_dim(op: str, ndim: int, d: int) -> int:
    if not -ndim <= d < ndim:
        raise IndexError(f"{op}(): dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {d})")
    return d + ndim if d < 0 else d


def canonical_dims(op: str, ndim: int, dims) -> list[int]:
    """Canonical, increasing dims of a dim list; a dim named twice raises, in dense torch's words."""
    seen: set[int] = set()
    for d in dims:
        c = canonical_dim(op, ndim, d)
        if c in seen:
            raise RuntimeError(f"dim {c} appears multiple times in the list of dims")
        seen.add(c)
    return sorted(seen)


def wrap(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]) -> MJT:
    return MultiJaggedTensor(values, partition, ragged_dims)


def sample_rows(p: Partition) -> tuple[list[tuple[int, ...]], list[int]]:
    """``(sizes, counts)``: each sample's ragged sizes and packed rows, as Python ints (NOTE
    [ Derived maps ], key ``"sample_rows"``)."""
    def compute(p: Partition):
        # SYNC: none — host sizes
        sizes = [tuple(ns) for ns in p.host_sizes().tolist()]
        return sizes, [math.prod(ns) for ns in sizes]

    return p.derived("sample_rows", compute)


def equal_sizes(x: MultiJaggedTensor, n: int) -> RaggedExtent:
    """An extent of size ``n`` in each of ``x``'s samples (a static size made ragged)."""
    b = x._partition.batch
    return RaggedExtent.from_lengths(torch.full((b,), n, dtype=torch.int64), x._partition.offsets.device)


def component_rows(c: torch.Tensor, ragged: list[int]) -> torch.Tensor:
    """A sample's tensor (no batch dim) as packed rows: its ragged dims ``ragged`` (its own dims)
    first, row-major, then its static dims in order — how the values of a batch hold it."""
    order = list(ragged) + [d for d in range(c.dim()) if d not in ragged]
    return c.permute(order).reshape(-1, *[c.shape[d] for d in order[len(ragged):]])


def same_partition(a: Partition, b: Partition) -> bool:
    return a.same_as(b)


def describe(x) -> str:
    if isinstance(x, MJT):
        return "(" + ", ".join(str(s) for s in x._size) + ")"
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    return repr(x)


def _any_traced(args, kwargs) -> bool:
    from ..structure import _is_traced

    for a in (*args, *kwargs.values()):
        t = a._values if isinstance(a, MultiJaggedTensor) else a
        if isinstance(t, torch.Tensor) and _is_traced(t):
            return True
    return False


def eager_route(reason: str, traceable=None):
    """Decorator for a route that builds new ragged extents from host sizes (NOTE [ Eager-only
    routes ]): eagerly it is the route itself; under ``torch.compile`` a call for which
    ``traceable(*args, **kwargs)`` is not true is a graph break, and with ``fullgraph=True`` an
    error quoting ``reason`` (``{op}`` in it: the op, the route's first argument when a string,
    else the route's name)."""

    def deco(fn):
        def eager(*args, **kwargs):
            if _any_traced(args, kwargs):
                # dynamo runs the op on fake tensors: refuse, and it breaks the graph here
                op = args[0] if args and isinstance(args[0], str) else getattr(fn, "__name__", "op").strip("_")
                raise NotImplementedError(reason.format(op=op))
            return fn(*args, **kwargs)

        # A frame dynamo compiles in the eager fallback calls this disabled: a graph break, then
        # eager. Made on first use under compile (dynamo is loaded by then), not at import:
        # ``torch.compiler.disable`` imports dynamo, and with it ``torch.distributed.nn``.
        disabled: list = []

        def run_disabled(*args, **kwargs):
            if not disabled:
                disabled.append(torch.compiler.disable(eager, reason=reason))
            return disabled[0](*args, **kwargs)

        @functools.wraps(fn)
        def routed(*args, **kwargs):
            if torch.compiler.is_compiling():
                if traceable is not None and traceable(*args, **kwargs):
                    return fn(*args, **kwargs)
                return run_disabled(*args, **kwargs)
            if _dynamo_callback() is not None:  # the eager fallback of a graph break (see the NOTE)
                return run_disabled(*args, **kwargs)
            return fn(*args, **kwargs)

        return routed

    return deco


# NOTE [ Eager-only routes ]
#
# An op whose output has per-sample sizes no existing extent holds (a strided window, a resize, a
# flatten of two ragged dims) needs those sizes on the host to build the new extent and its shape
# carriers; inside a traced region they are symbolic. Such routes are decorated with
# ``eager_route``. Dynamo meets them in two ways: it runs the torch function on fake tensors to
# record it as a graph node (the route refuses, raising NotImplementedError, and dynamo breaks the
# graph there), and, in the eager fallback at that break, it compiles the frames this package
# runs (the route calls a ``torch.compiler.disable``d function: another break, then plain eager).
# Where the route itself runs untraced in that fallback (dynamo's frame callback set, nothing
# compiling), it also calls the disabled function: else dynamo would compile every frame the route
# calls, its per-sample dense ops with each sample's sizes as guards, a recompile per new length.
# The regions around the op still compile; ``fullgraph=True`` reports the reason. Frames compiled
# in that fallback must not compare two symbolic nested ints: dynamo cannot name the guard
# (``structure.same_extent`` compares traced extents by identity).


def autocast_lower(*ts):
    """Under autocast, the cast that dense autocast gives its lower-precision ops (``matmul``,
    ``linear``, ``bmm``, ``einsum``'s products, ``scaled_dot_product_attention``): float32 / float16 /
    bfloat16 tensors to the autocast dtype of their device, float64 and other tensors kept.
    Autocast does not reach the computations behind these ops here: the ``multijagged::`` ops
    are not on its list, and a contraction by broadcasting is a mul and a sum. Callers check
    ``torch.is_autocast_enabled(device_type)`` first."""
    dt = torch.get_autocast_dtype(next(t for t in ts if isinstance(t, torch.Tensor)).device.type)
    return tuple(
        t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t for t in ts
    )


def autocast_float32(*ts):
    """Under autocast, the cast of dense autocast's float32 list (``prod``, ``cdist``, reflection and
    replication pads, …): float16 / bfloat16 tensors to float32, others kept. Callers check
    ``torch.is_autocast_enabled(device_type)`` first."""
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) else t
                 for t in ts)
