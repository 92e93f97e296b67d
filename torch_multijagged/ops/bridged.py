"""Computations on the packed values under torch's own autograd (the values bridge).

NOTE [ Bridged computations ]

Some ops run best — or only — as the dense op on the packed ``(T, *static)`` values, with the
dense op's own C++ derivative (every order) instead of the wrapper-level formula: ``linear``
with gradients (torch.library's Python autograd wrapper cost as much as the op on small inputs),
``layer_norm`` / ``rms_norm`` with gradients (NOTE [ Norms under double backward ] in nn.py),
``group_norm`` (its decomposition reshapes across the ragged dim), ``einsum`` over static
dims (the packed rows stand in for the batch and ragged subscripts) and ``einsum`` sample by
sample on views of the packed rows (NOTE [ Contractions sample by sample ]). Each function here crosses
to the values with ``bridge.values_of``, runs the dense op and crosses back with
``bridge.wrap_values``; gradients cross unchanged (NOTE [ Differentiable backward of the bridge ]).

Routes (``contractions/matmul.py``, ``contractions/einsum.py``, ``nn/norms.py``, ``vision/``) decide *whether* a call comes here and
check its structure; these functions only compute. Dynamo cannot trace the bridge (it reads the
subclass's attributes), so the routes of ``linear`` and the norms take it eagerly only.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from ..bridge import values_of, wrap_values, wrap_values_like
from ..kernels import ragged_mm as kmm, reference as ref
from ..kernels.dense_along import pack_rows
from ..structure import Partition, partition_for
from ..errors import StructureError
from ._common import MJT, describe, sample_rows, wrap

__all__ = ["linear", "layer_norm", "rms_norm", "group_norm", "einsum", "conv", "sample", "samples", "ragged_matmul",
           "sample_einsum", "class_loss"]


def samples(input: MJT) -> tuple[torch.Tensor, ...]:
    """``unbind()`` with autograd recording: views of the differentiable packed values split by
    sample. One backward (``split``'s) packs the component gradients back, and a write into a
    component raises as dense ``unbind``'s does (a view of a function that returns several): a copy
    (``multijagged::unbind``) would let the write vanish, and aten's ``unbind`` backward would
    ``stack`` components of different shapes."""
    return tuple(ref.unpack_components(values_of(input), input._partition.host_sizes(), input._ragged_dims))


def sample(input: MJT, index: int) -> torch.Tensor:
    """``x[index]`` with autograd recording: a view of one sample's rows of the differentiable
    packed values. Its gradient reaches ``input``; a write into it raises (a view made inside a
    custom Function) — a copy let ``y[0][1] = 5`` vanish, where dense ``y[0]`` writes through."""
    sizes = input._partition.host_sizes()  # SYNC: none — host sizes
    counts = sizes.prod(dim=1) if sizes.shape[1] else torch.ones(sizes.shape[0], dtype=torch.int64)
    start, count = int(counts[:index].sum()), int(counts[index])
    rows = values_of(input).narrow(0, start, count)
    _, to_logical = ref.storage_perm(input.dim(), input._ragged_dims)
    return rows.reshape(*sizes[index].tolist(), *rows.shape[1:]).permute(to_logical)


def linear(input: MJT, weight: torch.Tensor, bias: torch.Tensor | None) -> MJT:
    return wrap_values_like(F.linear(values_of(input), weight, bias), input)


def scatter_into_static(name: str, input: MJT, src, vd: int, args, kwargs) -> MJT:
    """``slice_scatter`` / ``select_scatter`` (``name``) of ``src`` into ``input``'s values dim
    ``vd`` (a static dim): ``src`` of ``input``'s structure, or one dense ``src`` broadcast to every
    row's slice."""
    if isinstance(src, MJT):
        if src._ragged_dims != input._ragged_dims or not src._partition.same_as(input._partition):
            raise StructureError(f"{name}(): expected src of {describe(input)}'s structure, got {describe(src)}")
        sv = values_of(src)
    else:
        take = torch.ops.aten.slice.Tensor if name == "slice_scatter" else torch.ops.aten.select.int
        sv = src.broadcast_to(take(input._values, vd, *args, **kwargs).shape)
    return wrap_values(getattr(torch, name)(values_of(input), sv, vd, *args, **kwargs), input._partition,
                       input._ragged_dims)


def layer_norm(input: MJT, normalized_shape, weight, bias, eps) -> MJT:
    return wrap_values_like(F.layer_norm(values_of(input), normalized_shape, weight, bias, eps), input)


def rms_norm(input: MJT, normalized_shape, weight, eps) -> MJT:
    return wrap_values_like(F.rms_norm(values_of(input), normalized_shape, weight, eps), input)


def group_norm(input: MJT, num_groups: int, weight, bias, eps) -> MJT:
    """Components ``(n, C, *rest)`` with only dim 1 ragged: dim 0 of a component is group_norm's
    batch, so on the packed values ``(T, C, *rest)`` it is exactly ``group_norm``."""
    return wrap_values_like(F.group_norm(values_of(input), num_groups, weight, bias, eps), input)


def conv(fn, input: MJT, *args, **kwargs) -> MJT:
    """``conv1d``/``2d``/``3d`` of components ``(n, C, *spatial)``, only dim 1 ragged: dim 0 of a
    component is the conv's batch, so on the packed values ``(T, C, *spatial)`` it is exactly
    the dense conv (as torch.jagged's ``convolution`` handler does)."""
    return wrap_values_like(fn(values_of(input), *args, **kwargs), input)


def einsum(equation: str, operands, partition: Partition, ragged_dims: tuple[int, ...]) -> MJT:
    """``torch.einsum(equation, …)`` with every multi_jagged operand replaced by its packed values
    (``equation`` already names their packed row by one subscript); the result has ``partition``
    and ``ragged_dims``."""
    values = torch.einsum(equation, *[values_of(o) if isinstance(o, MJT) else o for o in operands])
    return wrap_values(values, partition, ragged_dims)


def ragged_matmul(a: MJT, b: MJT, spec, extents, ragged_dims: tuple[int, ...]):
    """The per-sample product of ``kernels/ragged_mm.py`` (NOTE [ Ragged matmul contract ]; the
    operands and ``spec`` from ``contractions/ragged_mm.py``'s ``product_spec``) on the packed
    values, wrapped with the output's ragged dims of ``extents`` — or, with none, the dense
    ``(B, …, m, n)`` result itself."""
    grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    va, vb = (values_of(a), values_of(b)) if grad else (a._values, b._values)
    out = kmm.ragged_matmul(va, vb, spec)
    return wrap_values(out, partition_for(extents), ragged_dims) if extents else out


def sample_einsum(equation: str, operands: list, extents: list, ragged_dims: tuple[int, ...]):
    """NOTE [ Contractions sample by sample ]: dense ``einsum(equation, …)`` on each sample's
    operands (views of the packed rows in storage order; a dense operand whole), the results
    packed into the rows of the output, whose ragged dims ``ragged_dims`` have ``extents`` (none:
    a dense ``(B, …)`` result, the samples stacked)."""
    batch = next(o for o in operands if isinstance(o, MJT))._partition.batch
    grad = torch.is_grad_enabled() and any(o.requires_grad for o in operands)
    per_operand = []
    for o in operands:
        if not isinstance(o, MJT):
            per_operand.append([o] * batch)
            continue
        sizes, counts = sample_rows(o._partition)
        v = values_of(o) if grad else o._values
        static = v.shape[1:]
        pieces = v.split(counts, 0)
        if len(o._ragged_dims) == 1:
            per_operand.append(pieces)  # a sample's rows are its tensor
        else:
            per_operand.append([p.view(*ns, *static) for p, ns in zip(pieces, sizes)])
    results = [torch.einsum(equation, *xs) for xs in zip(*per_operand)]
    if not extents:
        return torch.stack(results)
    if len(ragged_dims) == 1:
        values = results[0].contiguous() if batch == 1 else torch.cat(results)
    else:
        values = pack_rows(len(ragged_dims), results)
    return wrap_values(values, partition_for(extents), ragged_dims)


def class_loss(fn, input: MJT, target: MJT, **kwargs):
    """``fn`` (``F.cross_entropy`` or ``F.nll_loss``) of a ``(B, C, …)`` input, class dim static,
    on the packed values: they are ``(T, C, *rest)``, dense torch's ``(N, C, d…)`` with the rows as
    its batch, and the target's — class indices ``(T, *rest)`` or probabilities of the input's
    shape — hold the same rows in the same order (NOTE [ Class losses on the packed values ] in
    nn/losses.py). ``reduction="none"`` gives the loss with the target's structure (indices) or
    the input's without dim 1 (probabilities)."""
    grad = torch.is_grad_enabled()
    x = values_of(input) if grad and input.requires_grad else input._values
    if target.dtype.is_floating_point:
        t = values_of(target) if grad and target.requires_grad else target._values
        like = input
    else:
        t = target._values  # int64 or uint8 as dense takes them; other dtypes raise dense's error
        like = target
    out = fn(x, t, **kwargs)
    if kwargs["reduction"] != "none":
        return out
    ragged_dims = tuple(d - 1 for d in input._ragged_dims)
    return (wrap_values if out.requires_grad else wrap)(out, like._partition, ragged_dims)
