"""Differentiable crossings between a MultiJaggedTensor and its packed values.

``values_of(x)`` is ``x.values()``; ``wrap_values(values, partition, ragged_dims)`` is the
zero-copy view behind ``from_packed``. Gradients cross unchanged: the packed values *are* the
elements, with no padding. These two crossings are the subclass's own (``tensor.py``, which
``values()`` needs); this module adds the ones built on them: adopting a wrapper built around
values that carry a graph, relabelling nested ints (``assume_relabel`` under tracing, NOTE
[ Traced operands built apart ]), and ``wrap_values_like``.

NOTE [ Differentiable backward of the bridge ]

Each crossing's backward is the opposite crossing, called through its autograd function when the
incoming gradient carries a graph (``create_graph=True``), so that second-order gradients flow
through the bridge too. Building the wrapper directly there would cut the graph: the gradient
would come back with ``requires_grad=False`` and a double backward would silently see zero.
Without a graph the plain construction is used (first-order backward stays as cheap as before).
An undefined incoming gradient stays undefined: autograd would materialise it as
``at::zeros(sizes)``, which cannot take nested-int sizes (NOTE [ Undefined gradients ] in
``compile/library.py``).
"""

from __future__ import annotations

import torch

from .structure import Partition, RaggedExtent, partition_for
from .tensor import MultiJaggedTensor, _graph, _ValuesOf, values_of, wrap_values

__all__ = ["values_of", "wrap_values", "wrap_values_like", "relabel", "assume_relabel", "expand_ragged",
           "static_as_ragged", "ragged_as_static", "dense_as_ragged"]


class _Adopt(torch.autograd.Function):
    """``box[0]``, a wrapper already built around ``values``, made the differentiable output of
    ``values`` (``wrap_values`` without building a second wrapper; the eager values path)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, box: list):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        return box[0]

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):  # type: ignore[override]
        if grad is None:
            return None, None
        return (_ValuesOf.apply(grad) if _graph(grad) else grad._values), None


def adopt(x: MultiJaggedTensor) -> MultiJaggedTensor:
    """``x`` (whose values carry an autograd graph, its wrapper none) as a differentiable output
    of its values: the same object, with a ``grad_fn`` whose backward hands the gradient to the
    values."""
    return _Adopt.apply(x._values, [x])


class _Relabel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: MultiJaggedTensor, partition: Partition):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.partition = x._partition
        return MultiJaggedTensor(x._values.detach(), partition, x._ragged_dims)  # as ``_WrapValues``

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):  # type: ignore[override]
        if grad is None:
            return None, None
        if _graph(grad):
            return _Relabel.apply(grad, ctx.partition), None
        return MultiJaggedTensor(grad._values, ctx.partition, grad._ragged_dims), None


def relabel(x: MultiJaggedTensor, partition: Partition) -> MultiJaggedTensor:
    """``x`` with the nested ints of an equal-sized ``partition``; differentiable (gradients
    return with x's own nested ints, as the autograd engine checks)."""
    return _Relabel.apply(x, partition)


# NOTE [ Traced operands built apart ]
#
# Eagerly, tensors built apart from equal lengths combine: their extents are compared by their
# host lengths and the operands relabelled onto one (NOTE [ Equal sizes, different nested ints ]
# in ops/_routing.py). Under tracing there are no lengths to compare: each input's offsets are a
# tensor of their own, with a nested int of their own, and only one nested int provably combines
# with itself. Where an op *needs* its operands' extents equal (an elementwise op at the same
# dim, SDPA's keys and values), eager raises unless the lengths agree; so the traced call
# assumes they agree and checks it when the compiled code runs: the carriers' sizes (batch,
# total, max, sum of squares) become guards, which a new batch with other sizes fails (a
# recompile, whose trace then raises as eager), and the offsets themselves are compared by an
# ``_assert_async`` in the graph, which raises as eager would for lengths that agree in those
# three sums but not one by one. Where an op does not need them equal (cross attention's queries
# and keys, a ``cat`` along the ragged dim), nothing is assumed: assuming would turn a valid
# call into a runtime error.
def assume_relabel(x: MultiJaggedTensor, partition: Partition, pairs, op: str) -> MultiJaggedTensor:
    """Under tracing, ``x`` relabelled onto ``partition`` (``relabel``), assuming each
    ``(theirs, ours)`` pair of extents in ``pairs`` holds equal sizes and checking it when the
    compiled code runs (NOTE [ Traced operands built apart ])."""
    msg = (f"{op}(): operands built apart combine only where their ragged sizes are equal, and the "
           f"compiled call got different ones")
    for a, b in pairs:
        for u, v in ((a.batch, b.batch), (a.total, b.total), (a.max, b.max), (a.sum_sq, b.sum_sq)):
            torch._check(u == v, lambda: msg)
        torch._assert_async((a.offsets == b.offsets).all(), msg)
    torch._check(x._values.shape[0] == partition.rows, lambda: msg)
    return relabel(x, partition)


def expand_ragged(x: MultiJaggedTensor, partition: Partition) -> MultiJaggedTensor:
    """``x`` broadcast to ``partition`` (same ragged dims), whose every size is, per sample, x's
    or x's is 1 (``broadcast_extent``); differentiable, to any order (a gather of the values,
    whose backward sums the rows a size-1 row was read into)."""
    index = partition.broadcast_map(x._partition, tuple(range(partition.nragged)))
    return wrap_values(values_of(x).index_select(0, index), partition, x._ragged_dims)


def _static_vdim(x: MultiJaggedTensor, d: int) -> int:
    """Values dim of ``x``'s static logical dim ``d``."""
    return sum(1 for e in range(1, d) if e not in x._ragged_dims) + 1


def static_as_ragged(x: MultiJaggedTensor, d: int, extent: RaggedExtent) -> MultiJaggedTensor:
    """``x`` with static dim ``d`` made a ragged dim of ``extent``, whose size is ``x``'s size there in
    every sample (NOTE [ Static sizes equal to a ragged dim ] in ops/_routing.py): the same elements
    with that dim moved into the packed rows (then put in row-major order of the ragged dims where
    ``d`` is not the last of them); differentiable, to any order."""
    v = values_of(x)
    vd = _static_vdim(x, d)
    rows = v.movedim(vd, 1)
    rows = rows.reshape(v.shape[0] * v.shape[vd], *rows.shape[2:])
    dims = (*x._ragged_dims, d)
    grown = partition_for([*x._partition.extents, extent])
    order = tuple(sorted(range(len(dims)), key=dims.__getitem__))
    if order == tuple(range(len(dims))):
        return wrap_values(rows, grown, dims)
    index, out = grown.reorder_rows(order)
    return wrap_values(rows.index_select(0, index), out, tuple(sorted(dims)))


def dense_as_ragged(t: torch.Tensor, batch: int, ndim: int, extents: dict) -> MultiJaggedTensor:
    """A dense operand ``t`` beside multi_jagged ones of ``ndim`` logical dims and ``batch`` samples
    (right-aligned to them, as broadcasting aligns it: ``(B or 1, …)`` of that rank, or fewer dims
    and no batch dim) made multi_jagged with ragged dims ``extents`` (logical dim → extent), whose
    size there is ``t``'s in every sample (NOTE [ Static sizes equal to a ragged dim ] in
    ops/_routing.py): each sample's elements are ``t``'s (its batch slice, where it has one), in
    row-major order of the ragged dims; differentiable, to any order (its gradient comes back in
    ``t``'s own shape)."""
    t = t.reshape((1,) * (ndim - t.dim()) + tuple(t.shape))
    t = t.expand(batch, *t.shape[1:])
    dims = tuple(sorted(extents))
    rest = tuple(d for d in range(1, ndim) if d not in extents)
    rows = t.permute(0, *dims, *rest)
    partition = partition_for([extents[d] for d in dims])
    return wrap_values(rows.reshape(partition.rows, *rows.shape[1 + len(dims):]), partition, dims)


def ragged_as_static(x: MultiJaggedTensor, d: int, size: int) -> torch.Tensor:
    """``x`` with ragged dim ``d``, of size ``size`` in every sample, made a static dim of that size
    (the inverse of ``static_as_ragged``): a dense ``(B, …)`` tensor where ``d`` was its only ragged
    dim; differentiable, to any order."""
    k = x._ragged_dims.index(d)
    p, v = x._partition, values_of(x)
    kept = tuple(r for r in x._ragged_dims if r != d)
    if not kept:
        return v.reshape(p.batch, size, *v.shape[1:]).movedim(1, d)
    if k != p.nragged - 1:  # d's coordinate last in the row order, then folded into the values
        index, _ = p.reorder_rows((*(i for i in range(p.nragged) if i != k), k))
        v = v.index_select(0, index)
    sub = partition_for([e for i, e in enumerate(p.extents) if i != k])
    vd = sum(1 for e in range(1, d) if e not in kept) + 1
    return wrap_values(v.reshape(sub.rows, size, *v.shape[1:]).movedim(1, vd), sub, kept)


def wrap_values_like(values: torch.Tensor, like: MultiJaggedTensor) -> MultiJaggedTensor:
    """``values`` (same row count as ``like``) with ``like``'s structure; differentiable."""
    if values.shape[0] != like._values.shape[0]:
        raise ValueError(
            f"wrap_values_like(): expected {like._values.shape[0]} packed rows, got {values.shape[0]}"
        )
    return wrap_values(values, like._partition, like._ragged_dims)
