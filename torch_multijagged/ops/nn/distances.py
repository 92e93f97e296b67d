"""Distances between the rows of each sample: ``torch.cdist`` (two batches, or a batch and a dense
operand: each sample's ``(j0, j1)`` matrix), ``F.pdist`` (each sample's pairs ``i < j``, a new
extent) and ``F.cosine_similarity`` over any dim (dense torch's formula: each input over its
clamped 2-norm).

NOTE [ Distances sample by sample ]

``torch.cdist(x1, x2)`` is dense ``cdist`` on each sample: ``x1`` of sample shape ``(*b1, n, C)``
and ``x2`` of ``(*b2, m, C)`` give ``(*broadcast(b1, b2), n, m)``. Its structure is the broadcast
of ``x1.unsqueeze(-2)`` with ``x2.unsqueeze(-3)`` without the last dim (NOTE [ Broadcasting over
ragged dims ]): ``(B, j0, C)`` with ``(B, j1, C)`` is the pair ``(B, j0, j1)``, with itself the
square ``(B, j0, j0)``, ``(B, j0, j1, C)`` with itself ``(B, j0, j1, j1)``. A dense operand with
the batch's number of dims is per sample (``(B, M, C)``, or ``(1, M, C)`` for every sample); one
with fewer is every sample's, broadcast as dense ``cdist`` broadcasts (a codebook ``(M, C)``).

Eagerly dense ``cdist`` itself runs on each sample's tensors — views of the packed rows as
``unbind`` gives them — and the results are concatenated into the output's rows: its values,
its choice of the matmul form (p = 2 over more than 25 rows, or ``compute_mode``), its
derivatives of every order (second order in the matmul form only; elsewhere, and for an empty
sample, its ``NotImplementedError``), its tie rules (p = inf gives every coordinate tied for the
largest difference the full sign) and its dtype errors (float16 on the CPU) are dense's bit for
bit. A sample's result stored in another dim order (a batch on the right, ``(B, M, j1)``) passes
back a contiguous gradient, as dense autograd hands it (``_ContiguousGrad``). Samples whose
operands have one shape (lengths that repeat in a large batch of small sets) are stacked into
one batched call where that is exact and faster (``_units``): dense ``cdist`` computes each pair
of rows, and each row's gradient, alone in its direct form, so a batch gives every sample the
bits of its own call — not in the matmul form (batched matmuls may round otherwise), nor where
dims broadcast within a sample (the reduction of the broadcast gradient), nor off the CPU. The
rule (``RULE``) weighs the calls saved against a batched call's cost, measured (docs/design.md,
"Distances sample by sample"). Traced (``torch.compile``: no host sizes) the norm of the pairs of
differences runs instead, with dense's p = inf tie rule and dtype errors; its rounding for p = 2
is not the matmul form's.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...kernels.reference import storage_perm
from ...structure import Partition, _is_traced, mapped_extent, partition_for
from .._common import MJT, autocast_float32, describe, eager_route, sample_rows
from .._routing import route
from ..elementwise.pointwise import _out_structure
from .losses import _involved

__all__: list[str] = []


_MODES = {"use_mm_for_euclid_dist_if_necessary": 0, "use_mm_for_euclid_dist": 1, "donot_use_mm_for_euclid_dist": 2}
# ``torch.cdist``'s own call after its checks (its Python wrapper costs more than the kernel on a
# small sample): the mode as the binding takes it, None for the default
_ATEN_MODE = {"use_mm_for_euclid_dist_if_necessary": None, "use_mm_for_euclid_dist": 1, "donot_use_mm_for_euclid_dist": 2}
_cdist_vf = torch._C._VariableFunctions.cdist


@route(torch.cdist)
def _cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """``‖x1[i] - x2[j]‖_p`` for every pair of rows of each sample, as dense ``cdist`` on each
    sample (NOTE [ Distances sample by sample ]): ``(B, j0, C)`` with ``(B, j1, C)`` is ``(B, j0,
    j1)``; batch dims before the rows broadcast per sample (``(B, j0, j1, C)`` with itself is
    ``(B, j0, j1, j1)``), and a dense operand is per sample with the batch's dims (``(B, M, C)``)
    or shared with fewer (a codebook ``(M, C)``)."""
    if not _involved(x1, x2):
        return NotImplemented
    if torch.is_autocast_enabled(x1.device.type):
        x1, x2 = autocast_float32(x1, x2)  # on dense autocast's float32 list
    _cdist_operands(x1, x2)
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    if compute_mode not in _MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    if _eager_operands(x1, x2):  # (traced, the output structure is the broadcast's own: no host read here)
        partition, out_dims = _out_structure("cdist", (x1.unsqueeze(-2), x2.unsqueeze(-3)))[:2]
        if partition.batch:
            return _cdist_by_sample(x1, x2, float(p), compute_mode, partition, out_dims)
    _traced_dtypes(x1, x2)
    if p != math.inf:  # (inline, as one expression: a graph break inside it starts from the operands)
        return torch.linalg.vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1)
    return _inf_norm_of_differences(x1.unsqueeze(-2) - x2.unsqueeze(-3))


_SPELT = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double"}


def _traced_dtypes(x1, x2) -> None:
    """Dense ``cdist``'s dtype rules, for the traced form (the norm of the pairs of differences,
    which Inductor fuses; dense torch's matmul form for p = 2 rounds otherwise)."""
    for name, t in (("X1", x1), ("X2", x2)):
        if not t.dtype.is_floating_point:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: "
                               f"{_SPELT.get(t.dtype, str(t.dtype).replace('torch.', '').capitalize())}")
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"expected scalar type {_SPELT.get(x1.dtype)} but found {_SPELT.get(x2.dtype)}")
    if x1.device.type == "cpu" and x1.dtype in (torch.float16, torch.bfloat16):
        raise NotImplementedError(f'"cdist" not implemented for \'{_SPELT[x1.dtype]}\'')


def _inf_norm_of_differences(diff):
    """The p = inf norm over the last dim with dense ``cdist``'s gradient rule: the full sign of the
    difference to every coordinate that ties for the largest (the norm's own would share it)."""
    size = diff.abs()
    dist = size.amax(-1).detach()
    # each coordinate at the largest size carries its own difference (finite ones: ``t - t``
    # is then exactly 0, the value stays ``dist``)
    tied = torch.where((size == dist.unsqueeze(-1)) & size.isfinite(), size, 0.0).sum(-1)
    return dist + (tied - tied.detach())


def _cdist_operands(x1, x2) -> None:
    """``x1`` and ``x2`` checked: row vectors along a static last dim, at least 2-d per sample, a
    dense operand no wider than the batch, one batch size and one number of columns."""
    # public metadata only (dim, shape, ragged_dims): read under torch.compile, where the
    # wrapper's private fields are not
    nd = (x1 if isinstance(x1, MJT) else x2).dim()
    for t in (x1, x2):
        if isinstance(t, MJT):
            if t.dim() < 3 or t._ragged_dims[-1] == t.dim() - 1:
                raise StructureError(
                    f"cdist(): expected batches of row vectors (B, …, j0, C) (a static last dim), got {describe(t)}"
                )
        elif t.dim() < 2 or t.dim() > nd:
            raise StructureError(f"cdist(): expected a dense operand of 2 to {nd} dims (the batch's or fewer), got "
                                 f"{describe(t)} with {describe(x1 if t is x2 else x2)}")
    batch = (x1 if isinstance(x1, MJT) else x2).shape[0]
    for t in (x1, x2):
        if not isinstance(t, MJT) and t.dim() == nd and t.shape[0] not in (1, batch):
            raise StructureError(f"cdist(): a dense operand {describe(t)} with the batch's dims needs size {batch} "
                                 f"or 1 along the batch dim")
    c1, c2 = (t.shape[-1] for t in (x1, x2))
    if c1 != c2:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {c1} X2: {c2}")


def _eager_operands(*ts) -> bool:
    """Real values with host sizes: not under ``torch.compile``, no traced operand."""
    return not torch.compiler.is_compiling() and not any(_is_traced(t._values if isinstance(t, MJT) else t)
                                                         for t in ts)


class _Operand:
    """One operand of ``cdist`` per sample: ``kind`` ``"rows"`` (a batch's packed rows), ``"dense"``
    (a dense ``(B, …)``: sample i's slice) or ``"shared"`` (one dense tensor for every sample)."""

    __slots__ = ("kind", "t", "batch", "sizes", "counts", "static", "to_logical", "identity")

    def __init__(self, t, batch: int, nd: int):
        self.t, self.batch = t, batch
        if isinstance(t, MJT):
            self.kind = "rows"
            self.sizes, self.counts = sample_rows(t._partition)
            self.static = tuple(t._values.shape[1:])
            _, self.to_logical = storage_perm(nd, t._ragged_dims)
            self.identity = self.to_logical == sorted(self.to_logical)
        elif t.dim() == nd and t.shape[0] == batch and batch > 1:
            self.kind = "dense"
        else:
            self.kind = "shared"
            self.t = t[0] if t.dim() == nd else t

    def shapes(self) -> list:
        """Each sample's shape (its tensor as ``unbind`` gives it)."""
        if self.kind != "rows":
            return [tuple(self.t.shape[1:] if self.kind == "dense" else self.t.shape)] * self.batch
        static, to_logical = self.static, self.to_logical
        if self.identity:
            return [ns + static for ns in self.sizes]
        return [tuple((*ns, *static)[k] for k in to_logical) for ns in self.sizes]

    def samples(self) -> list:
        """Each sample's tensor: views of the packed rows, a dense slice, or the shared tensor."""
        if self.kind == "shared":
            return [self.t] * self.batch
        if self.kind == "dense":
            return list(self.t.unbind(0))
        pieces = values_of(self.t).split(self.counts, 0)
        if self.identity:
            if len(self.sizes[0]) == 1:
                return list(pieces)  # one ragged dim, first: a sample's rows are its tensor
            return [c.view(*ns, *self.static) for c, ns in zip(pieces, self.sizes)]
        return [c.view(*ns, *self.static).permute(self.to_logical) for c, ns in zip(pieces, self.sizes)]


def _cdist_by_sample(x1, x2, p: float, compute_mode: str, partition: Partition, out_dims: tuple[int, ...]):
    """Dense ``cdist`` on each sample's operands, the results packed into the rows of
    ``partition`` (ragged dims ``out_dims``): sample by sample, or samples of one shape stacked
    into one batched call where that is exact and measured faster (``_units``)."""
    batch = partition.batch
    nd = len((x1 if isinstance(x1, MJT) else x2)._size)
    o1 = _Operand(x1, batch, nd)
    o2 = o1 if x2 is x1 else _Operand(x2, batch, nd)
    to_storage, _ = storage_perm(nd, out_dims)
    identity = to_storage == sorted(to_storage)
    r = len(out_dims)
    mode = _ATEN_MODE[compute_mode]
    s1 = o1.samples()
    s2 = s1 if o2 is o1 else o2.samples()
    units = _units(o1, o2, p, compute_mode, partition)
    if units is None:
        rows = [_as_rows(_cdist_vf(a, b, p, mode), identity, to_storage, r) for a, b in zip(s1, s2)]
    else:
        rows = [None] * batch
        lead = [k + 1 for k in to_storage]
        for samples, batched in units:
            if not batched:
                i = samples[0]
                rows[i] = _as_rows(_cdist_vf(s1[i], s2[i], p, mode), identity, to_storage, r)
                continue
            a = o1.t if o1.kind == "shared" else torch.stack([s1[i] for i in samples])
            b = a if o2 is o1 else o2.t if o2.kind == "shared" else torch.stack([s2[i] for i in samples])
            d = _cdist_vf(a, b, p, mode)
            if not identity:
                d = contiguous_grad(d).permute(0, *lead)
            # each sample's rows, in the samples' order: a view where the storage order is the
            # result's (a pair: (g, n, n) → (g, n · n))
            rows_of = d.reshape(d.shape[0], math.prod(d.shape[1:r + 1]), *d.shape[r + 1:]).unbind(0)
            for i, rows_i in zip(samples, rows_of):
                rows[i] = rows_i
    return wrap_values(rows[0] if batch == 1 else torch.cat(rows, 0), partition, out_dims)


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward hands on a contiguous gradient. A sample's result stored in
    another dim order (``permute``, then ``reshape`` into packed rows) would otherwise get a
    permuted gradient, and dense ``cdist``'s matmul form differentiates through ``matmul``, which
    rounds by its operands' layout (BLAS picks its kernel by the transposes): so its backward sees
    the layout it sees when called on the sample alone. Any order (``contiguous`` is
    differentiable)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return None if grad is None else grad.contiguous()


contiguous_grad = _ContiguousGrad.apply


def _as_rows(d: torch.Tensor, identity: bool, to_storage: list, r: int) -> torch.Tensor:
    """A sample's result as its packed rows: its ``r`` ragged dims first, flattened."""
    if not identity:
        d = contiguous_grad(d).permute(to_storage)
    elif r == 1:
        return d  # one ragged dim, first: the result is its rows
    return d.reshape(math.prod(d.shape[:r]), *d.shape[r:])  # a row count: a static size may be 0


# The rule for stacking samples of one shape into one batched call (NOTE [ Distances sample by
# sample ]; fitted on the CPU with one thread, docs/design.md), in units of one per-sample call:
# stack when ``samples − singles − group_call · groups > fixed_calls`` — a call per sample
# against a call per group (a batched call, its stacks and its views cost ``group_call`` sample
# calls) and one per sample left alone, and the plan's fixed cost.
RULE = {"group_call": 1.7, "fixed_calls": 1}
_FORCED: Optional[str] = None


@contextlib.contextmanager
def cdist_path(path: Optional[str]) -> Iterator[None]:
    """Force how ``cdist`` runs eagerly inside the block (tests, benchmarks): ``"per_sample"``
    (one dense call per sample), ``"per_shape"`` (samples of one shape batched wherever that is
    exact, on any device) or None (the rule)."""
    global _FORCED
    old, _FORCED = _FORCED, path
    try:
        yield
    finally:
        _FORCED = old


def _units(o1: _Operand, o2: _Operand, p: float, compute_mode: str, partition: Partition) -> Optional[list]:
    """``[(samples, batched), …]``: the samples stacked into one call each (``batched``) or run
    alone, or None where every sample runs alone: where no two samples can share a call, where
    the rule prefers the per-sample calls, or off the CPU (another device's kernels may pick
    their algorithm by the whole tensor's size). Cached on the output partition (NOTE [ Derived
    maps ], key ``("cdist_units", …)``), with the operands' partitions."""
    if _FORCED == "per_sample" or (_FORCED is None and partition.offsets.device.type != "cpu"):
        return None
    mode = _MODES[compute_mode]
    desc = tuple((o.kind, o.t._ragged_dims, o.static) if o.kind == "rows" else (o.kind, tuple(o.t.shape))
                 for o in (o1, o2))
    key = ("cdist_units", desc, o1 is o2, p == 2.0, mode, _FORCED)
    parts = tuple(o.t._partition if o.kind == "rows" else None for o in (o1, o2))
    hit = partition.cache.get(key)
    if hit is not None and hit[0] is parts[0] and hit[1] is parts[1]:
        return hit[2]
    units = _build_units(o1, o2, p == 2.0, mode)
    partition.cache[key] = (parts[0], parts[1], units)
    return units


def _build_units(o1: _Operand, o2: _Operand, p2: bool, mode: int) -> Optional[list]:
    batch = o1.batch
    shapes1 = o1.shapes()
    shapes2 = shapes1 if o2 is o1 else o2.shapes()
    units: list = []
    unit_of: dict = {}
    for i in range(batch):
        a, b = shapes1[i], shapes2[i]
        lead = a[:-2]
        n, m = a[-2], b[-2]
        # alone: dims that broadcast within the sample; dense's matmul form (p = 2 over more than
        # 25 rows, or always with ``use_mm_for_euclid_dist``: batched, its matmuls may round
        # otherwise); an empty sample
        if (lead != b[:-2] or (p2 and (mode == 1 or (mode == 0 and (n > 25 or m > 25))))
                or not (n and m and a[-1] and math.prod(lead))):
            units.append([i])
            continue
        u = unit_of.get((a, b))
        if u is None:
            u = unit_of[(a, b)] = len(units)
            units.append([])
        units[u].append(i)
    groups = sum(len(u) > 1 for u in units)
    singles = len(units) - groups
    if not groups or (_FORCED is None and batch - singles - RULE["group_call"] * groups <= RULE["fixed_calls"]):
        return None
    return [(tuple(u), len(u) > 1) for u in units]


@route(F.pdist, torch.pdist)
def _pdist(input, p=2.0):
    """Each sample's ``pdist``: the distances of its rows' pairs ``i < j`` in row-major order, a
    ``(B, j)`` batch of ``nᵢ(nᵢ − 1)/2`` each (a new extent, eager only) — the upper triangle of the
    sample's ``cdist``, whose gradient dense torch's ``pdist`` also has."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() != 3 or input._ragged_dims != (1,):
        raise StructureError(f"pdist(): expected a batch of row vectors (B, j0, C), got {describe(input)}")
    return _pdist_rows(input, float(p))


@eager_route("{op}(): each sample's number of pairs is a new ragged size, built from host lengths")
def _pdist_rows(x: MJT, p: float):
    e = x._partition.extents[0]
    pairs = mapped_extent(e, ("pdist",), lambda n: n * (n - 1) // 2)
    # (B, j0, j0): row-major (i, j) per sample; the direct formula of dense pdist, never the
    # matmul form's (which rounds a distance relative to the points' norms)
    full = torch.cdist(x, x, p=p, compute_mode="donot_use_mm_for_euclid_dist")
    _, coords = full._partition.row_coords()
    upper = (coords[:, 0] < coords[:, 1]).nonzero().squeeze(1)
    return wrap_values(values_of(full).index_select(0, upper), partition_for((pairs,)), (1,))


@route(F.cosine_similarity, torch.cosine_similarity)
def _cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Dense torch's formula: each input divided by its 2-norm over ``dim``, the norm clamped below
    at ``eps`` without a gradient through the clamp, then the product summed over ``dim``."""
    if not _involved(x1, x2):
        return NotImplemented
    common = torch.promote_types(x1.dtype, x2.dtype)
    if not common.is_floating_point:  # as dense torch: a complex pair would give a complex "similarity"
        raise RuntimeError(f"expected common dtype to be floating point, yet common dtype is {str(common).replace('torch.', '')}")

    def unit(t):
        n = torch.linalg.vector_norm(t, 2, dim, keepdim=True)
        return t / (n + (n.clamp_min(eps) - n).detach())

    return (unit(x1) * unit(x2)).sum(dim)
