"""Arithmetic and comparisons with a ragged size: ``x / x.shape[1]``, ``pos == n - 1``, each sample
by its own size.

NOTE [ Ragged sizes as numbers ]

Model code divides by a size it read from the shape: ``outer / msa.shape[1]`` (a mean over an
axis written as a sum and a division), ``x * x.shape[-1] ** -0.5``. A ragged size is a nested int,
one per sample; torch hands a nested int given where an op takes a number to the op as the
placeholder ``7777777`` (the value its argument parser puts in a ``SymInt`` it expects a tracer to
read), a silently wrong answer. Between a multi_jagged tensor and a ragged size of its batch (or
a multiple of one, ``2 * n``), the arithmetic ops here use each sample's own size: the size
becomes a dense ``(B, 1, …, 1)`` operand of the tensor's rank, which applies per sample
(NOTE [ Broadcasting over ragged dims ]), in the dtype a Python int would give
(``torch.result_type(x, 1)``), so the result's dtype is the one dense torch gives for a number.
Comparisons (``==``, ``<``, ``torch.eq``, …) go the same way: a mask per sample, where Python
would otherwise answer ``pos == n`` by identity (``False``).
A nested int of another batch raises. A dense tensor combined with a nested int never reaches
this package (``x.sum(1) / x.shape[1]``, where ``x.sum(1)`` is dense): torch's placeholder
stands; ``x.mean(1)`` is what to write.
"""

from __future__ import annotations

import torch

from ...errors import StructureError
from ...structure import sizes_of
from .._common import MJT, describe
from .._routing import route

_NAMES = ("add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "subtract",
          "multiply", "divide", "rsub",
          # comparisons (``pos + 1 == n``: the last position of every sample)
          "eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal")
_DUNDERS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "div", "eq", "ne", "lt", "le", "gt", "ge")


def _functions():
    for name in _NAMES:
        for owner in (torch, torch.Tensor):
            for f in (getattr(owner, name, None), getattr(owner, name + "_", None) if owner is torch.Tensor else None):
                if f is not None:
                    yield f
    for name in _DUNDERS:
        for form in ("__{}__", "__r{}__", "__i{}__"):
            f = getattr(torch.Tensor, form.format(name), None)
            if f is not None:
                yield f


def _per_sample(size, like: MJT, op) -> torch.Tensor:
    sizes = sizes_of(size)
    if sizes is None:
        raise TypeError(f"{op}(): the nested int {size} is not a ragged size this package can read per sample")
    batch = like._partition.batch
    if sizes.shape[0] != batch:
        raise StructureError(f"{op}(): the ragged size {size} is of a batch of {sizes.shape[0]}, not of {describe(like)}")
    dtype = torch.result_type(like, 1)
    return sizes.to(device=like.device, dtype=dtype).reshape(batch, *([1] * (like.dim() - 1)))


def _traced_per_sample(size, like: MJT, op) -> torch.Tensor:
    """``_per_sample`` while tracing, where a ragged size is a symbol like any size: one that is
    provably one of ``like``'s own ragged sizes is read from its offsets in the graph (without
    this, torch traced the size's placeholder value into it). Other symbols are torch's."""
    for k, d in enumerate(like._ragged_dims):
        factor = 1 if size is like._size[d] else _multiple(size, like._size[d])
        if factor is not None:
            n = like._partition.extents[k].offsets.diff() * factor
            return n.to(torch.result_type(like, 1)).reshape(like._partition.batch, *([1] * (like.dim() - 1)))
    return size


def _involves_ragged(size, like: MJT) -> bool:
    """Whether the traced ``size`` is an expression in one of ``like``'s ragged sizes."""
    mine = set()
    for d in like._ragged_dims:
        s = like._size[d]
        if isinstance(s, torch.SymInt):
            mine |= s.node.expr.free_symbols
    expr = getattr(size.node, "expr", None)
    return expr is None or bool(expr.free_symbols & mine)


def _multiple(size, ragged) -> "int | None":
    """``k`` where the symbolic ``size`` is provably ``k`` times the symbolic ``ragged`` (``2 * n``)."""
    if not (isinstance(size, torch.SymInt) and isinstance(ragged, torch.SymInt)):
        return None
    ratio = size.node.expr / ragged.node.expr
    return int(ratio) if ratio.is_Integer and ratio > 0 else None


def _route(func):
    op = getattr(func, "__name__", str(func))

    def routed(*args, **kwargs):
        like = next((a for a in args if isinstance(a, MJT)), None)
        if like is None or not any(isinstance(a, torch.SymInt) for a in (*args, *kwargs.values())):
            return NotImplemented
        per_sample = _traced_per_sample if torch.compiler.is_compiling() else _per_sample
        new_args = tuple(per_sample(a, like, op) if isinstance(a, torch.SymInt) else a for a in args)
        new_kwargs = {k: per_sample(v, like, op) if isinstance(v, torch.SymInt) else v for k, v in kwargs.items()}
        if all(a is b for a, b in zip(new_args, args)) and all(new_kwargs[k] is v for k, v in kwargs.items()):
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.SymInt) and _involves_ragged(a, like):
                    raise TypeError(f"{op}(): the traced size {a} combines a ragged size of {describe(like)} with "
                                    "another symbol (a dynamic static size): only a ragged size and its int "
                                    "multiples are read per sample under torch.compile")
            return NotImplemented  # traced sizes of static dims (``x + x.size(2)``, dynamic): plain numbers
        return func(*new_args, **new_kwargs)

    return routed


for _f in set(_functions()):
    route(_f)(_route(_f))
