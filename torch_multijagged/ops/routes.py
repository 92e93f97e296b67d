"""``__torch_function__`` routes: composite ops whose decomposition would reshape across ragged
dims, or whose aten derivative cannot handle ragged sizes, are sent to ops that reach
``__torch_dispatch__`` intact. A route only *routes*: it calls other torch functions and never
touches packed values. Returning ``NotImplemented`` falls back to the ordinary call.

See NOTE [ Subclass mechanism ] in ``tensor.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..compile import library  # noqa: F401
from ..errors import StructureError
from . import dispatch as _dispatch
from ._common import MJT, canonical_dim

mj = torch.ops.multijagged

ROUTES: dict[Any, Callable[..., Any]] = {}


def route(*funcs):
    def wrapper(fn):
        for f in funcs:
            ROUTES[f] = fn
        return fn

    return wrapper


def unify_extents(args: tuple) -> tuple:
    """NOTE [ Equal sizes, different nested ints ]

    Two tensors built separately from equal lengths have different nested ints (as in
    torch.jagged), yet DESIGN.md §4 lets them combine. The autograd engine, however, checks each
    gradient's shape against its input's, nested ints included: ``(B, j1, C)`` may not receive a
    ``(B, j0, C)`` gradient. So before an op sees them, operands are relabelled onto the first
    operand's extent *at the same logical dim* with a differentiable, zero-copy ``relabel``
    whose backward restores their own. Extents at different dims are left alone: ``x (B, j0, 1)
    * y (B, 1, j1)`` stays rectangular ``(B, j0, j1)`` even when the lengths are equal. Tensors
    inside a list argument (``cat``, ``stack``) are unified too. Eager only: under tracing
    extents are compared by identity."""
    first = None
    out = None
    for i, a in enumerate(args):
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], MJT):
            inner = unify_extents(tuple(a) if first is None else (first, *a))
            inner = inner if first is None else inner[1:]
            if any(x is not y for x, y in zip(inner, a)):
                out = list(args) if out is None else out
                out[i] = type(a)(inner)
            first = first if first is not None else a[0]
            continue
        if not isinstance(a, MJT):
            continue
        if first is None:
            first = a
            continue
        if a._partition is first._partition:
            continue
        mapping = _relabel_map(first, a)
        if mapping is None:
            continue
        if out is None:
            out = list(args)
        from ..bridge import relabel

        out[i] = relabel(a, mapping)
    return args if out is None else tuple(out)


def _relabel_map(first: MJT, other: MJT):
    """``other``'s partition with each extent replaced by ``first``'s extent at the same logical
    dim when the two are equal-sized but not identical (None when nothing changes)."""
    from ..structure import same_extent
    from ._common import partition_for

    swap = {}
    for d, e in zip(other._ragged_dims, other._partition.extents):
        if d in first._ragged_dims:
            k = first._partition.extents[first._ragged_dims.index(d)]
            if k is not e and id(e) not in swap and same_extent(k, e):
                swap[id(e)] = k
    if not swap:
        return None
    return partition_for([swap.get(id(e), e) for e in other._partition.extents])


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, MJT)


def _needs_grad(*args) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _call(op, *args):
    """Call a ``multijagged::`` op, skipping torch.library's Python autograd wrapper when no
    argument needs a gradient (it was half of ``linear``'s eager overhead). Under dynamo the
    plain call is traced: the wrapper costs nothing in a compiled graph."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or _needs_grad(*args)
    ):
        return op(*args)
    # Below autograd, with no dispatch mode active, the dispatcher would only forward the call to
    # MultiJaggedTensor.__torch_dispatch__: go to the op table directly.
    return _dispatch(op, args, {})


@route(F.linear, torch._C._nn.linear)
def _linear(input, weight, bias=None):
    if isinstance(input, MJT) and _dense(weight) and (bias is None or _dense(bias)):
        if torch.compiler.is_compiling() or not _needs_grad(input, weight, bias):
            return _call(mj.linear.default, input, weight, bias)
        # Eagerly, with gradients, the values bridge lets the dense linear run under torch's own (C++) autograd:
        # cheaper than torch.library's Python autograd wrapper, on the op that dominates models.
        # Dynamo cannot trace the bridge (it reads the subclass's attributes), hence the op above.
        from ..bridge import values_of, wrap_values_like

        return wrap_values_like(F.linear(values_of(input), weight, bias), input)
    return NotImplemented


@route(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul(input, other, *, out=None):
    if out is not None or input.dim() < 3 or other.dim() < 2:
        return NotImplemented
    if isinstance(input, MJT) and _dense(other) and other.dim() == 2:
        return _call(mj.linear.default, input, other.t(), None)
    if isinstance(input, MJT) and isinstance(other, MJT) and input.dim() == other.dim():
        # Batched matmul whose row, column or contracted dims may be ragged (attention:
        # (B, j0, C) @ (B, C, j0) → (B, j0, j0); (B, j0, j0) @ (B, j0, C) → (B, j0, C)), as the
        # broadcast product summed over the contracted dim. Eagerly this materialises
        # (…, n, k, m); compiled, Inductor fuses the gather, product and sum.
        return (input.unsqueeze(-1) * other.unsqueeze(-3)).sum(-2)
    return NotImplemented


def _touches_ragged(input, dim) -> list[int] | None:
    """Canonical dims when a reduction of ``input`` over ``dim`` involves a ragged or the batch
    dim (so aten's derivative cannot run on it), else None."""
    if not isinstance(input, MJT):
        return None
    if dim is None:
        return list(range(input.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(input.dim()))
    canon = sorted({canonical_dim("reduce", input.dim(), d) for d in dims})
    if 0 in canon or any(d in input._ragged_dims for d in canon):
        return canon
    return None


def _reduce(input, kind, dims, keepdim):
    return _call(mj.reduce.default, input, kind, dims, keepdim)


def _reduction_route(kind: str):
    def routed(input, dim=None, keepdim=False, *, dtype=None):
        dims = _touches_ragged(input, dim)
        if dims is None:
            return NotImplemented
        if dtype is not None:
            input = input.to(dtype)
        return _reduce(input, kind, None if dim is None else dims, keepdim)

    return routed


route(torch.sum, torch.Tensor.sum)(_reduction_route("sum"))
route(torch.mean, torch.Tensor.mean)(_reduction_route("mean"))
route(torch.prod, torch.Tensor.prod)(_reduction_route("prod"))
route(torch.logsumexp, torch.Tensor.logsumexp)(_reduction_route("logsumexp"))
route(torch.amax, torch.Tensor.amax)(_reduction_route("amax"))
route(torch.amin, torch.Tensor.amin)(_reduction_route("amin"))


def _max_min(is_max: bool):
    kind = "amax" if is_max else "amin"

    def routed(input, dim=None, keepdim=False, *args, **kwargs):
        if not isinstance(input, MJT) or not isinstance(dim, int) or args or kwargs:
            return NotImplemented
        if _touches_ragged(input, dim) is None:
            return NotImplemented
        # values through the routed reduction (differentiable; ties share the gradient as for
        # amax), indices from the aten overload (not differentiable)
        values = _reduce(input, kind, [dim], keepdim)
        indices = (torch.argmax if is_max else torch.argmin)(input.detach(), dim, keepdim)
        return torch.return_types.max((values, indices)) if is_max else torch.return_types.min((values, indices))

    return routed


route(torch.max, torch.Tensor.max)(_max_min(True))
route(torch.min, torch.Tensor.min)(_max_min(False))


class _NanIfUsed(torch.autograd.Function):
    """nan forward; backward nan where the incoming gradient is non-zero, else 0."""

    @staticmethod
    def forward(ctx, t):  # type: ignore[override]
        return torch.full_like(t, float("nan"))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return torch.where(grad != 0, torch.full_like(grad, float("nan")), torch.zeros_like(grad))


def _safe_root(t, p=2):
    """``t ** (1/p)`` whose gradient is 0 (not nan) where t == 0, as dense std / norm backward
    give; nan stays nan."""
    zero = t == 0
    safe = torch.where(zero, torch.ones_like(t), t)
    return torch.where(zero, torch.zeros_like(t), safe.sqrt() if p == 2 else safe.pow(1.0 / p))


def _var_std(sqrt: bool):
    def routed(input, dim=None, *args, correction=None, keepdim=False, unbiased=None):
        # torch.var(x, dim, unbiased, keepdim) and torch.var(x, dim, *, correction, keepdim)
        if args:
            if isinstance(args[0], bool) and unbiased is None and len(args) <= 2:
                unbiased = args[0]
                keepdim = args[1] if len(args) > 1 else keepdim
            else:
                return NotImplemented
        dims = _touches_ragged(input, dim)
        if dims is None:
            return NotImplemented
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        # A composite of routed ops: its gradient needs no formula of its own.
        d = None if dim is None else dims
        centred = input - _reduce(input, "mean", d, True)
        denom = _reduce(torch.ones_like(input).detach(), "sum", d, keepdim) - correction
        ok = denom > 0
        # Where n - correction <= 0 the result is nan, as dense torch gives; so is its gradient
        # when the result is used, and 0 when it is not (dense torch then never runs its
        # backward). A plain division would put 0/0 into every sample's gradient.
        total = _reduce(centred * centred, "sum", d, keepdim)
        var = torch.where(ok, total / torch.where(ok, denom, torch.ones_like(denom)), _NanIfUsed.apply(total))
        return _safe_root(var) if sqrt else var

    return routed


route(torch.var, torch.Tensor.var)(_var_std(False))
route(torch.std, torch.Tensor.std)(_var_std(True))


@route(torch.linalg.vector_norm)
def _vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None):
    dims = _touches_ragged(input, dim)
    if dims is None:
        return NotImplemented
    if dtype is not None:
        input = input.to(dtype)
    d = None if dim is None else dims
    a = input.abs()
    if ord == float("inf"):
        return _reduce(a, "amax", d, keepdim)
    if ord == -float("inf"):
        return _reduce(a, "amin", d, keepdim)
    if ord == 0:
        return _reduce((a != 0).to(a.dtype), "sum", d, keepdim)
    if ord == 1:
        return _reduce(a, "sum", d, keepdim)
    if ord == 2:
        return _safe_root(_reduce(input * input, "sum", d, keepdim))
    return _safe_root(_reduce(a.pow(ord), "sum", d, keepdim), ord)


@route(torch.norm, torch.Tensor.norm)
def _norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    if p == "fro":
        p = 2
    if not isinstance(p, (int, float)):
        return NotImplemented
    return _vector_norm(input, p, dim, keepdim, dtype=dtype)


def _components(input):
    """The B components: views of the packed values when no gradient is needed (aten's
    ``unbind``, as torch.jagged); otherwise ``multijagged::unbind`` (copies), whose backward packs
    the component gradients back — aten's would ``stack`` components of different shapes."""
    if torch.compiler.is_compiling() or _needs_grad(input) or torch._C._len_torch_dispatch_stack():
        return tuple(mj.unbind.default(input))
    return _dispatch(torch.ops.aten.unbind.int, (input, 0), {})


@route(torch.unbind, torch.Tensor.unbind)
def _unbind(input, dim=0):
    if isinstance(input, MJT) and dim == 0:
        return _components(input)
    return NotImplemented


@route(torch.Tensor.__getitem__)
def _getitem(input, index):
    if isinstance(input, MJT) and isinstance(index, int):
        b = input._partition.batch
        if not -b <= index < b:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {b}")
        return _components(input)[index]
    return NotImplemented


@route(torch.select, torch.Tensor.select)
def _select(input, dim, index):
    if isinstance(input, MJT) and isinstance(dim, int) and canonical_dim("select", input.dim(), dim) == 0:
        return _getitem(input, index)
    return NotImplemented


@route(F.group_norm)
def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Per component ``(n, C, *rest)``: dim 0 of the component is group_norm's batch, so on the
    packed values ``(T, C, *rest)`` it is exactly ``group_norm`` — valid when the only ragged dim
    is dim 1."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input._ragged_dims != (1,):
        raise ValueError(
            f"group_norm(): expected components (n, C, *) with only dim 1 ragged, got ragged dims "
            f"{input._ragged_dims} for layout torch.multi_jagged"
        )
    from ..bridge import values_of, wrap_values_like

    return wrap_values_like(F.group_norm(values_of(input), num_groups, weight, bias, eps), input)


def _static_dim(op: str, input, dim) -> int:
    d = canonical_dim(op, input.dim(), dim)
    if d == 0 or d in input._ragged_dims:
        raise StructureError(f"{op}(): expected a static dim of a multi_jagged tensor, got dim {dim} (batch or ragged)")
    return d


@route(torch.narrow, torch.Tensor.narrow)
def _narrow(input, dim, start, length):
    if isinstance(input, MJT):
        _static_dim("narrow", input, dim)
    return NotImplemented


@route(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(input, dim=None):
    """``squeeze()`` drops static size-1 dims only; aten's backward for it would unsqueeze every
    size-1 dim, the batch dim (B = 1) included, so name the dims."""
    if not isinstance(input, MJT) or dim is not None:
        return NotImplemented
    dims = [d for d in range(1, input.dim()) if d not in input._ragged_dims and input.shape[d] == 1]
    return torch.squeeze(input, dims) if dims else input.view(input.shape)


@route(torch.reshape, torch.Tensor.reshape)
def _reshape(input, *shape):
    """``reshape`` = ``view``, after a copy when the static dims cannot be viewed; aten's
    composite would multiply nested ints to check the element count."""
    if not isinstance(input, MJT):
        return NotImplemented
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)) else shape
    try:
        return input.view(shape)
    except RuntimeError:  # not viewable with these strides: copy, as reshape does
        return input.contiguous().view(shape)


@route(torch.flatten, torch.Tensor.flatten)
def _flatten(input, start_dim=0, end_dim=-1):
    if not isinstance(input, MJT):
        return NotImplemented
    start = canonical_dim("flatten", input.dim(), start_dim)
    end = canonical_dim("flatten", input.dim(), end_dim)
    if start == end:
        return input
    if start == 0 or any(start <= d <= end for d in input._ragged_dims):
        raise StructureError(f"flatten(): only static dims of a multi_jagged tensor can be flattened, got dims {start}..{end}")
    size = 1
    for d in range(start, end + 1):
        size *= input.shape[d]
    return _reshape(input, (*input.shape[:start], size, *input.shape[end + 1:]))


def _split_route(chunks: bool):
    def routed(input, split_size_or_sections, dim=0):
        """``split`` / ``chunk`` of a static dim as ``narrow`` views, so that each piece has its own
        backward (aten's ``split_backward`` builds zeros of nested-int sizes for unused pieces)."""
        if not isinstance(input, MJT):
            return NotImplemented
        _static_dim("chunk" if chunks else "split", input, dim)
        n = input.shape[dim]
        if chunks:
            step = -(-n // split_size_or_sections)
            sizes = [min(step, n - i) for i in range(0, n, step)] if n else [0]
        elif isinstance(split_size_or_sections, int):
            sizes = [min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)] or [0]
        else:
            sizes = list(split_size_or_sections)
        out, start = [], 0
        for size in sizes:
            out.append(input.narrow(dim, start, size))
            start += size
        return tuple(out)

    return routed


route(torch.split, torch.Tensor.split)(_split_route(False))
route(torch.chunk, torch.Tensor.chunk)(_split_route(True))


@route(torch.einsum)
def _einsum(equation, *operands):
    """``einsum`` that contracts static dims only: every multi_jagged operand carries the same
    batch and ragged subscripts (and structure), which the output keeps in order; the packed rows
    stand in for them, so the contraction runs on the values."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    mjts = [o for o in operands if isinstance(o, MJT)]
    if not mjts:
        return NotImplemented
    from ..bridge import values_of, wrap_values
    from ._common import same_partition

    lhs, _, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not out or "." in equation or len(terms) != len(operands):
        raise NotImplementedError(
            f"einsum(): layout torch.multi_jagged needs an explicit '->' output and no ellipsis, got {equation!r}"
        )
    ref = mjts[0]
    ragged_letters = None
    for term, op in zip(terms, operands):
        if isinstance(op, MJT):
            letters = term[0] + "".join(term[d] for d in op._ragged_dims)
            if ragged_letters is None:
                ragged_letters = letters
            if letters != ragged_letters or op._ragged_dims != ref._ragged_dims or not same_partition(op._partition, ref._partition):
                raise ValueError(f"einsum(): multi_jagged operands must share batch and ragged subscripts and structure in {equation!r}")
    dense_terms = [t for t, o in zip(terms, operands) if not isinstance(o, MJT)]
    if any(c in t for t in dense_terms for c in ragged_letters):
        raise NotImplementedError(f"einsum(): dense operands cannot index the batch or ragged dims in {equation!r}")
    positions = [out.find(c) for c in ragged_letters]
    if -1 in positions or positions != sorted(positions) or positions[0] != 0:
        raise NotImplementedError(f"einsum(): the output must keep the batch and ragged subscripts in order in {equation!r}")
    row = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in equation)

    def packed(term):
        return row + "".join(c for c in term if c not in ragged_letters)

    values = torch.einsum(
        ",".join(packed(t) if isinstance(o, MJT) else t for t, o in zip(terms, operands)) + "->" + packed(out),
        *[values_of(o) if isinstance(o, MJT) else o for o in operands],
    )
    return wrap_values(values, ref._partition, tuple(positions[1:]))
