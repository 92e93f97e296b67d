"""``__torch_function__`` routes of the shape family: ``reshape`` / ``flatten`` / ``unflatten``,
the ``split`` family and ``einsum`` (see ``routes.py`` for what a route may do).

Errors name the op the user called (``reshape()``, not the ``view()`` it routes to); piece sizes
of the ``split`` family and the sizes of ``unflatten`` come from dense torch itself, run on a
meta tensor of the static sizes, so edge cases (size 0, more chunks than elements, uneven
pieces, ``-1``) and their errors are exactly dense torch's.
"""

from __future__ import annotations

import torch

from .. import constructors
from ..errors import StructureError
from . import bridged
from ._common import MJT, canonical_dim, describe, same_partition
from .pair_mm import pair_product
from .routes import _needs_grad, _static_dim, route
from .views import check_view_shape, square_extent
from . import ragged_flatten


# ----------------------------------------------------------------------------- reshape family
def _normalize_shape(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def reshape_as(op: str, input: MJT, shape) -> MJT:
    """``reshape`` = ``view``, after a copy when the static dims cannot be viewed with their
    strides; aten's composite would multiply nested ints to check the element count. The shape
    is checked first, so that a bad one is reported under ``op``'s name."""
    check_view_shape(op, input, shape)
    traced = ragged_flatten.traced_static_view(op, input, shape)
    if traced is not NotImplemented:
        return traced
    if torch.compiler.is_compiling():
        # A failed view cannot be caught while tracing: copy unless the tensor is contiguous,
        # where every regrouping of static dims is a view (NOTE [ Contiguity as torch.jagged
        # reports it ] in views.py).
        return (input if input.is_contiguous() else input.contiguous()).view(shape)
    try:
        return input.view(shape)
    except StructureError:
        raise
    except RuntimeError:  # not viewable with these strides: copy, as reshape does
        return input.contiguous().view(shape)


@route(torch.reshape, torch.Tensor.reshape)
def _reshape(input, *shape):
    if not isinstance(input, MJT):
        return NotImplemented
    plan = ragged_flatten.view_plan("reshape", input, _normalize_shape(shape))  # merging / splitting ragged dims
    return plan() if plan is not None else reshape_as("reshape", input, _normalize_shape(shape))


@route(torch.flatten, torch.Tensor.flatten)
def _flatten(input, start_dim=0, end_dim=-1):
    if not isinstance(input, MJT):
        return NotImplemented
    start = canonical_dim("flatten", input.dim(), start_dim)
    end = canonical_dim("flatten", input.dim(), end_dim)
    if start > end:
        raise ValueError(f"flatten(): expected start_dim <= end_dim, got {start_dim} and {end_dim}")
    if start == end:
        return input
    if start > 0 and all(d in input._ragged_dims for d in range(start, end + 1)):
        return ragged_flatten.flatten_ragged("flatten", input, start, end)  # NOTE [ Flattening ragged dims ]
    if start == 0 or any(start <= d <= end for d in input._ragged_dims):
        raise StructureError(
            f"flatten(): only static dims or consecutive ragged dims of a multi_jagged tensor can be flattened, "
            f"got dims {start}..{end} of {describe(input)}"
        )
    size = 1
    for d in range(start, end + 1):
        size *= input.shape[d]
    return reshape_as("flatten", input, (*input.shape[:start], size, *input.shape[end + 1:]))


@route(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(input, dim, sizes):
    """``unflatten`` of a static dim (``-1`` inferred as dense torch does); a ragged dim splits
    only back into the ragged dims it was flattened from (NOTE [ Flattening ragged dims ]), the
    batch dim not at all."""
    if not isinstance(input, MJT):
        return NotImplemented
    if isinstance(dim, int) and canonical_dim("unflatten", input.dim(), dim) in input._ragged_dims:
        return ragged_flatten.unflatten_ragged("unflatten", input, canonical_dim("unflatten", input.dim(), dim), sizes)
    d = _static_dim("unflatten", input, dim)
    # dense torch's own checks and -1 inference (its errors name the dim the user gave)
    new = _probe(input, d).unflatten(dim, sizes).shape[d : d + len(sizes)]
    return reshape_as("unflatten", input, (*input.shape[:d], *new, *input.shape[d + 1:]))


# ----------------------------------------------------------------------------- split family
def _probe(input: MJT, d: int) -> torch.Tensor:
    """A meta tensor with ``input``'s static sizes (1 for the batch and ragged dims) whose only
    non-zero stride is 1 at dim ``d``: a piece's storage offset is where it starts along ``d``."""
    shape = [1 if i == 0 or i in input._ragged_dims else s for i, s in enumerate(input.shape)]
    return torch.empty_strided(shape, [1 if i == d else 0 for i in range(len(shape))], device="meta")


class _SplitStatic(torch.autograd.Function):
    """Consecutive pieces of a multi_jagged tensor along static dim ``d`` whose backward writes the
    gradient once: ``cat`` of the pieces' gradients (zeros for unused pieces, made like the piece).
    Each piece as its own ``narrow`` would instead zero-fill a full-size buffer per piece and sum
    them (``SliceBackward``), which cost a third of a SwiGLU step. Like dense ``split``'s, the
    pieces are views that may not be modified in place."""

    @staticmethod
    def forward(ctx, input, d, bounds):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        ctx.save_for_backward(input.detach())  # its structure only
        ctx.d, ctx.bounds = d, bounds
        return tuple(input.narrow(d, s, n) for s, n in bounds)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        if all(g is None for g in grads):
            return None, None, None
        (x,) = ctx.saved_tensors
        d = ctx.d
        full = [torch.zeros_like(x.narrow(d, s, n)) if g is None else g for g, (s, n) in zip(grads, ctx.bounds)]
        return torch.cat(full, d), None, None


def _batch_pieces(input: MJT, dense_split) -> tuple:
    """Sub-batches along the batch dim (``constructors.split_batch``: views of the values with new
    nested ints, as ``torch.jagged``'s ``chunk`` on dim 0). ``dense_split(probe)`` is the dense op
    on a meta tensor ``(B, 1)`` (2-D, as ``vsplit`` requires): its pieces' sizes and offsets are
    the sub-batches'."""
    bounds = tuple((p.storage_offset(), p.shape[0]) for p in dense_split(torch.empty(input.shape[0], 1, device="meta")))
    return constructors.split_batch(input, bounds)


def _split_pieces(op: str, input: MJT, dim: int, dense_split) -> tuple:
    """Pieces of ``input`` along static ``dim``. ``dense_split(probe)`` is the dense op on a meta
    tensor of the dim's size: its pieces' sizes and offsets are the pieces' (tensor_split's can
    overlap or be empty). Eagerly with gradients, consecutive pieces go through ``_SplitStatic``
    (one ``cat`` in backward); otherwise each is a ``narrow`` view with its own backward (aten's
    ``split_backward`` would build zeros of nested-int sizes for unused pieces)."""
    if canonical_dim(op, input.dim(), dim) == 0:
        return _batch_pieces(input, dense_split)
    d = _static_dim(op, input, dim)
    bounds = tuple((p.storage_offset(), p.shape[d]) for p in dense_split(_probe(input, d)))
    consecutive = all(s == sum(n for _, n in bounds[:i]) for i, (s, _) in enumerate(bounds))
    if (consecutive and sum(n for _, n in bounds) == input.shape[d] and _needs_grad(input)
            and not torch.compiler.is_compiling()):
        return _SplitStatic.apply(input, d, bounds)
    return tuple(input.narrow(d, s, n) for s, n in bounds)


def _dim_arg(args, kwargs, index: int):
    if "dim" in kwargs:
        return kwargs["dim"]
    return args[index] if len(args) > index else 0


def _split_route(op: str, method: str):
    def routed(input, *args, **kwargs):
        if not isinstance(input, MJT):
            return NotImplemented
        dim = _dim_arg(args, kwargs, 1)
        rest = {k: v for k, v in kwargs.items() if k != "dim"}
        return _split_pieces(op, input, dim, lambda t: getattr(t, method)(*args[:1], **rest, dim=dim))

    return routed


route(torch.split, torch.Tensor.split)(_split_route("split", "split"))
route(torch.chunk, torch.Tensor.chunk)(_split_route("chunk", "chunk"))
route(torch.split_with_sizes, torch.Tensor.split_with_sizes)(_split_route("split_with_sizes", "split_with_sizes"))
route(torch.unsafe_split, torch.Tensor.unsafe_split)(_split_route("unsafe_split", "unsafe_split"))
route(torch.unsafe_chunk, torch.Tensor.unsafe_chunk)(_split_route("unsafe_chunk", "unsafe_chunk"))
route(torch.tensor_split, torch.Tensor.tensor_split)(_split_route("tensor_split", "tensor_split"))


@route(torch.narrow, torch.Tensor.narrow)
def _narrow(input, dim, start, length):
    """``narrow`` of the batch dim: a sub-batch (``constructors.narrow_batch``); of a static dim:
    aten's ``narrow`` (a ``slice`` of the values); of a ragged dim: an error."""
    if not isinstance(input, MJT):
        return NotImplemented
    if canonical_dim("narrow", input.dim(), dim) == 0:
        return constructors.narrow_batch(input, start, length)
    _static_dim("narrow", input, dim)
    return NotImplemented


@route(torch.Tensor.to_padded_tensor)
def _to_padded_tensor(input, padding, output_size=None):
    """The method form of ``torch.nested.to_padded_tensor``."""
    if not isinstance(input, MJT):
        return NotImplemented
    return constructors.to_padded_tensor(input, padding, output_size)


def _xsplit_route(op: str, pick_dim):
    """``hsplit`` / ``vsplit`` / ``dsplit``: ``tensor_split`` along a fixed dim."""

    def routed(input, sections):
        if not isinstance(input, MJT):
            return NotImplemented
        d = pick_dim(input.dim())
        if d:
            _static_dim(op, input, d)

        def dense(t):
            return getattr(torch, op)(t, sections)  # dense torch's dim choice and checks

        return _split_pieces(op, input, d, dense)

    return routed


route(torch.hsplit, torch.Tensor.hsplit)(_xsplit_route("hsplit", lambda n: 1 if n > 1 else 0))
route(torch.vsplit, torch.Tensor.vsplit)(_xsplit_route("vsplit", lambda n: 0))
route(torch.dsplit, torch.Tensor.dsplit)(_xsplit_route("dsplit", lambda n: 2))


# ----------------------------------------------------------------------------- einsum
_LAYOUT = "layout torch.multi_jagged"


def _diagonals(op: MJT, term: str, equation: str):
    """``(op, term)`` with every subscript repeated on two ragged dims replaced by the diagonal
    (``biic`` on a square pair → ``bic``, via ``torch.diagonal``)."""
    for d1 in op._ragged_dims:
        c = term[d1]
        d2 = next((d for d in op._ragged_dims if d > d1 and term[d] == c), None)
        if d2 is None:
            continue
        square_extent("einsum", op, d1, d2, f" (subscript {c!r} on ragged dims {d1} and {d2} of {equation!r})")
        # diagonal removes both dims and appends the diagonal; move it back to d1
        op = torch.diagonal(op, 0, d1, d2).movedim(-1, d1)
        term = term[:d2] + term[d2 + 1:]
        return _diagonals(op, term, equation)
    for d in range(1, op.dim()):
        c = term[d]
        if d not in op._ragged_dims and any(term[r] == c for r in op._ragged_dims):
            raise NotImplementedError(
                f"einsum(): subscript {c!r} labels both a ragged and a static dim of {describe(op)} in "
                f"{equation!r}, which {_LAYOUT} cannot express"
            )
    if term[0] in term[1:]:
        raise NotImplementedError(f"einsum(): the batch subscript {term[0]!r} labels another dim too in {equation!r}")
    return op, term


def _explicit(equation: str, operands) -> tuple[list[str], str]:
    """``(terms, out)`` of ``equation`` with one subscript per dim: every ``...`` replaced by
    letters the equation does not use (right-aligned across operands, as broadcasting), and an
    implicit output made explicit as dense torch does (the ellipsis dims, then the subscripts
    that appear once, in alphabetical order)."""
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum(): expected {len(terms)} operands for {equation!r}, got {len(operands)}")
    free = [c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in equation]
    widths = [o.dim() - (len(t) - 3) if "..." in t else 0 for t, o in zip(terms, operands)]
    ell = free[: max(widths, default=0)][::-1]
    if any(w < 0 for w in widths) or len(ell) < max(widths, default=0):
        raise ValueError(f"einsum(): an ellipsis covers more dims than operand has in {equation!r}")
    terms = [t.replace("...", "".join(ell[len(ell) - w:])) for t, w in zip(terms, widths)]
    for k, (term, o) in enumerate(zip(terms, operands)):
        if len(term) != o.dim() or not term.isalpha():
            raise ValueError(
                f"einsum(): the number of subscripts in the equation ({len(term)}) does not match the number "
                f"of dimensions ({o.dim()}) for operand {k} in {equation!r}"
            )
    if not arrow:
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1 and c not in ell)
        out = "".join(ell) + "".join(once)
    else:
        out = out.replace("...", "".join(ell))
        if not out.isalpha() and out:
            raise ValueError(f"einsum(): invalid output subscripts {out!r} in {equation!r}")
    return terms, out


@route(torch.einsum)
def _einsum(equation, *operands):
    """``einsum`` that contracts static dims only: every multi_jagged operand carries the same
    batch and ragged subscripts (and structure), which the output keeps in order; the packed rows
    stand in for them, so the contraction runs on the values. A subscript repeated on the two
    ragged dims of a square pair takes its diagonal first (``bii->bi``)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not any(isinstance(o, MJT) for o in operands):
        return NotImplemented
    terms, out = _explicit(equation, operands)
    if len(set(out)) != len(out):
        raise ValueError(f"einsum(): expected each output subscript once, got {out!r} in {equation!r}")
    operands, terms = list(operands), list(terms)
    product = pair_product(terms, operands, out)  # NOTE [ Contracting a ragged dim ]
    if product is not None:
        return product
    for k, o in enumerate(operands):
        if isinstance(o, MJT):
            operands[k], terms[k] = _diagonals(o, terms[k], equation)
    mjts = [o for o in operands if isinstance(o, MJT)]
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
        raise NotImplementedError(
            f"einsum(): the output must keep the batch and ragged subscripts in order in {equation!r} "
            f"({_LAYOUT} contracts static dims only; use transpose to reorder ragged dims)"
        )
    row = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in equation)

    def packed(term):
        return row + "".join(c for c in term if c not in ragged_letters)

    packed_eq = ",".join(packed(t) if isinstance(o, MJT) else t for t, o in zip(terms, operands)) + "->" + packed(out)
    return bridged.einsum(packed_eq, operands, ref._partition, tuple(positions[1:]))
