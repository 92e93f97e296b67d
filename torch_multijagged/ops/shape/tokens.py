"""Flattening the batch dim into the rows, and back: ``x.view(-1, C)`` … ``y.view(x.shape)``.

NOTE [ Flattening the batch dim ]

Model code flattens a ``(B, L, C)`` batch into ``(B·L, C)`` rows around ops that take a matrix
and views the result back: GPT-2's ``Conv1D`` (``addmm(b, x.view(-1, C), W).view(size_out)``),
OPT's feed-forward (``reshape(-1, C)`` … ``.view(shape)``), a language model's loss
(``cross_entropy(logits.view(-1, V), labels.view(-1))``). For a multi_jagged ``x`` the natural
meaning, and dense torch's on a batch without padding, is the samples' elements concatenated in
order: ``torch.cat([xi.reshape(-1) for xi in x.unbind()]).view(shape)``. When the ragged dims
follow the batch dim (``(B, j0, C)``, ``(B, j0, j1, C)``), the packed values are already in that
order and the result is a view of them (``view`` / ``reshape`` / ``flatten(0, k)`` / ``ravel``);
otherwise ``view`` refuses as dense torch's does for a tensor its strides cannot view, and
``reshape`` copies sample by sample.

A request flattens the batch dim exactly when it cannot keep it: no nested int in the shape,
``-1`` first and every later size given (a shape that keeps the batch dim names each ragged dim
by its nested int or ``-1``, so the two never overlap). The later sizes must divide the elements
after the last ragged dim, so that no row of the result straddles two samples; otherwise the
request raises, as one that names the batch dim differently does (``x.view(B, -1)``: a row per
sample would be ragged).

The result is dense: every op takes it as a dense tensor. To let ``y.view(x.shape)`` turn it back
into a batch, it is a ``FlatBatch``, a dense subclass that remembers the partition it came from;
any op on it returns a ``FlatBatch`` again (an alias, no copy), and ``view`` / ``reshape`` /
``view_as`` / ``reshape_as`` / ``unflatten(0, …)`` to a shape that holds the batch's nested ints
(``(B, j0, …, *static)``, ``B`` or ``-1`` first, the ragged sizes as the batch had them) give a
multi_jagged tensor over its elements, with gradients both ways. A shape with nested ints of
another batch raises. A shape that starts with the batch size B is read sample by sample, where
dense torch would split the concatenated samples evenly, a silent mix of samples: on rows that are
still the batch's, in order, ``(B, -1, …)`` names the one ragged dim by ``-1``, as the batch's own ``view``
does, and gives the batch back (``loss.view(B, -1).sum(1)`` after a loss over flattened tokens);
on the samples' elements in order (a ``FlatBatch`` that is ``_ordered``: the flattening, then ops
that keep its shape, its rows or its order), ``(B, -1, *static)`` is each sample's own elements, a
view (``_view_by_sample``), and any other ``(B, …)`` raises; a ``FlatBatch`` whose elements moved
is viewed as dense. ``torch.save`` stores a ``FlatBatch`` as a plain tensor. A compiled region
cannot make one (fake tensors do not become subclasses): the flatten and each op on the
``FlatBatch`` are graph breaks, run eagerly (NOTE [ Eager-only routes ] in ``_common.py``).
"""

from __future__ import annotations

import copy
import math

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ...bridge import relabel, values_of, wrap_values
from ...constructors import as_nested_tensor, from_packed
from ...errors import StructureError, op_label
from ...structure import Partition
from ...writes import NO_GRAD_VIEW_WRITE
from .._common import MJT, describe, eager_route, sample_rows
from .views import _mark_reorder_copy, _rows_size, _writes_self, guard_dense_write

__all__ = ["FlatBatch", "flat_request", "flatten_batch"]

_DisableTF = torch._C.DisableTorchFunctionSubclass


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        return tuple(shape[0])
    return tuple(shape)


def _tail(x: MJT) -> int:
    """Elements per row after the last ragged dim."""
    n = 1
    for s in x._size[max(x._ragged_dims) + 1:]:
        n *= s
    return n


def flat_request(x: MJT, shape) -> bool:
    """Whether ``shape`` flattens the batch dim of ``x`` (the NOTE's rule): no nested int after
    the first size, which is ``-1`` or the product of the batch size and the ragged sizes (einops'
    ``'b n d -> (b n) d'`` computes ``B * n``), every later size given."""
    if not shape or not (shape[0] == -1 if type(shape[0]) is int else _rows_size(x, shape[0])):
        return False
    return all((isinstance(s, int) and s >= 0) or (isinstance(s, torch.SymInt) and not is_nested_int(s)) for s in shape[1:])


def _check_rows(op: str, x: MJT, shape) -> None:
    inner = 1
    for s in shape[1:]:
        inner *= s
    tail = _tail(x)
    if inner == 0 or tail % inner:
        what = f"view {describe(x)} as" if op == "view" else f"{op} {describe(x)} to"
        raise StructureError(
            f"{op}(): cannot {what} {tuple(shape)}: flattening the batch dim, the sizes after the "
            f"first must divide the {tail} elements after the last ragged dim (a row would hold elements of "
            "two samples)"
        )


_WHY = (
    "{op}(): flattening the batch dim of a multi_jagged tensor makes a FlatBatch (NOTE [ Flattening the batch "
    "dim ] in ops/shape/tokens.py), a tensor subclass that a compiled region cannot create"
)


@eager_route(_WHY)
def flatten_batch(op: str, x: MJT, shape) -> "FlatBatch":
    """``x`` with its batch and ragged dims flattened into the first dim of ``shape`` (``-1``); see
    the NOTE. ``op`` is ``view`` (no copy, or dense torch's error) or a copying op's name."""
    shape = (-1, *shape[1:]) if _rows_size(x, shape[0]) else tuple(shape)
    _check_rows(op, x, shape)
    k = len(x._ragged_dims)
    if x._ragged_dims == tuple(range(1, k + 1)) or x._partition.batch == 0:  # values in the samples' order
        v = values_of(x)
        flat = v.view(shape) if op == "view" else v.reshape(shape)
    elif op == "view":
        raise RuntimeError(
            f"view(): cannot view {describe(x)} as {shape}: its elements are not stored in the samples' order "
            "(a dim precedes a ragged dim); use .reshape(...) instead"
        )
    else:
        whole = torch.cat([t.reshape(-1) for t in x.unbind()])
        if whole.numel():
            # a copy where dense reshape gives a view: writes into it refuse. ``whole`` is registered,
            # the base of every view of the result (``x.reshape(-1, C)[:, :1]``), which keeps it alive
            _mark_reorder_copy(whole, "the batch dim flattened where the elements are not stored in the samples' "
                               "order", base=x)
        flat = whole.view(shape)
    out = FlatBatch._mark(flat, x._partition, tuple(x._size[d] for d in x._ragged_dims), ordered=True)
    if not torch.is_grad_enabled() and x.requires_grad:
        out._no_grad_view = True  # (``_refuse_no_grad_view_write``)
    return out


class FlatBatch(torch.Tensor):
    r"""A dense tensor holding a multi_jagged batch with its batch dim flattened into its rows
    (``x.view(-1, C)``, ``x.reshape(-1)``, ``x.flatten(0, 1)``): every op takes it as the dense
    tensor it is, and ``view`` / ``reshape`` / ``view_as`` / ``reshape_as`` / ``unflatten(0, …)`` to
    a shape holding the batch's nested ints turn it (or any tensor computed from it) back into a
    multi_jagged tensor. See NOTE [ Flattening the batch dim ] in ``ops/shape/tokens.py``."""

    _batch: tuple  # (partition, the ragged sizes as nested ints, in the batch's order)
    _ordered: bool  # its elements are the samples' elements in order (``_view_by_sample``)
    _no_grad_view = False  # a view made under no_grad of a batch that records gradients

    @classmethod
    def _mark(cls, t: torch.Tensor, partition: Partition, nested: tuple, ordered: bool = False) -> "FlatBatch":
        with _DisableTF():
            out = t.as_subclass(cls)
        out._batch = (partition, nested)
        out._ordered = ordered
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():
            # dynamo inlines this: a graph break, and the op runs eagerly (FakeTensors cannot be
            # made FlatBatches); made on first use, as eager routes' (NOTE [ Eager-only routes ])
            if not _EAGER:
                _EAGER.append(torch.compiler.disable(_torch_function, reason=_WHY_OPS))
            return _EAGER[0](func, types, args, kwargs or {})
        return _torch_function(func, types, args, kwargs or {})

    def __deepcopy__(self, memo):
        with _DisableTF():
            plain = copy.deepcopy(self.as_subclass(torch.Tensor), memo)
        return FlatBatch._mark(plain, *self._batch, ordered=self._ordered)


_WHY_OPS = (
    "ops on a FlatBatch (a multi_jagged batch with its batch dim flattened, NOTE [ Flattening the batch dim ] in "
    "ops/shape/tokens.py) run eagerly: a compiled region cannot make FlatBatch results"
)
_AS_PLAIN = {torch.Tensor.__reduce_ex__, torch.Tensor.__repr__, torch.Tensor.__format__}
_EAGER: list = []


def _torch_function(func, types, args, kwargs):
    guard_dense_write(func, args, kwargs)
    _refuse_no_grad_view_write(func, args, kwargs)
    batch = _batch_of(args, kwargs)
    restore = _RESTORE.get(func)
    if restore is not None:
        out = restore(batch, *args, **kwargs)
        if out is not NotImplemented:
            return out
    if any(t is not torch.Tensor and not issubclass(t, FlatBatch) for t in types):
        return NotImplemented  # another subclass (a multi_jagged operand) decides
    if func in _AS_PLAIN:  # saved and printed as the plain tensor it is
        with _DisableTF():
            return func(args[0].as_subclass(torch.Tensor), *args[1:], **kwargs)
    with _DisableTF():
        try:
            out = func(*args, **kwargs)
        except RuntimeError as e:
            if "was created inside a custom Function" not in str(e):
                raise
            name = op_label(func)
            raise RuntimeError(
                f"{name}(): cannot write in place into the batch flattened into rows (x.view(-1, C), x.flatten(0, 1)) "
                "while gradients are recorded: the rows are a view of the batch's values that autograd cannot "
                "rebase. Write into the batch itself (x.mul_(2), x.masked_fill_(mask, 0) with a multi_jagged mask), "
                "or compute out of place (rows = rows * 2)"
            ) from None
    if getattr(func, "__name__", None) == "__get__" and getattr(func, "__self__", None) not in _VIEW_ATTRS:
        return out  # attributes (``_base``, ``grad``) as they are; ``.T``, ``.mT``, ``.real`` … are results
    out = _mark_all(out, batch, _keeps_order(func, args, kwargs, out, batch[0]))
    if getattr(func, "__name__", "") != "detach" and any(f._no_grad_view for f in _flat_operands(args, kwargs)):
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, FlatBatch):
                with _DisableTF():
                    o._no_grad_view = o._is_view()  # a view of such a view (its pieces, ``narrow(input=…)``)
    return out


def _refuse_no_grad_view_write(func, args, kwargs) -> None:
    """Dense torch's refusal of an in-place write in grad mode into a view made under no_grad of a
    tensor that requires grad: the rows of such a batch are a view of values that carry no
    gradient, so the write would reach the batch without autograd (its gradient would miss it)."""
    if not torch.is_grad_enabled():
        return
    out = kwargs.get("out") if kwargs else None
    targets = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if t is not None]
    if args and (_writes_self(func) or (kwargs and kwargs.get("inplace") is True)):
        targets.append(args[0])
    if any(getattr(t, "_no_grad_view", False) for t in targets):
        raise RuntimeError(f"{getattr(func, '__name__', func)}(): {NO_GRAD_VIEW_WRITE}")


_VIEW_ATTRS = tuple(getattr(torch._C.TensorBase, name) for name in ("T", "mT", "H", "mH", "real", "imag"))
# NOTE [ Elements in order ]: a FlatBatch holds the samples' elements in order (``_ordered``) from
# the flattening on, through ops that keep its order under another shape whose rows each lie inside
# one of its rows (``_VIEWS``: rows merged across samples would let a later op along them move
# elements between samples) or keep its dim 0 (elementwise ops, a linear map or a reduction of each
# row, a loss per element or per row),
# and only while every FlatBatch operand holds them so. An op that moves elements along dim 0 —
# one that always may (``_MOVES``), one given dim 0 (``_ALONG``: its dims, or by default its last,
# which is dim 0 of a vector), an index that does not keep dim 0 whole, a matrix product of which
# the FlatBatch is not the left matrix, a pad of dim 0 — drops the mark: ``view(B, -1)`` of the
# result is then dense's view.
_MOVES = frozenset(("t", "t_", "flipud", "msort", "rot90", "masked_scatter", "masked_scatter_", "put", "put_",
                    "repeat", "tile", "expand", "expand_as", "broadcast_to", "repeat_interleave", "unique",
                    "unique_consecutive", "nonzero", "masked_select", "take", "embedding", "embedding_bag", "einsum",
                    "tensordot", "kron", "outer", "cartesian_prod", "fftn", "ifftn", "fft2", "ifft2", "rfftn", "irfftn",
                    "rfft2", "irfft2", "fftshift", "ifftshift", "trapz", "diff", "unfold", "fold", "combinations"))
_ALONG = frozenset(("flip", "roll", "sort", "argsort", "topk", "kthvalue", "gather", "index_select", "scatter",
                    "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "index_put",
                    "index_put_", "index_copy", "index_copy_", "index_add", "index_add_", "index_fill", "index_fill_",
                    "take_along_dim", "transpose", "transpose_", "swapaxes", "swapdims", "movedim", "moveaxis",
                    "permute", "fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "cummax", "cummin", "narrow",
                    "split", "chunk", "unbind", "tensor_split", "select", "stack"))
_PRODUCTS = frozenset(("matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "linear", "addmm", "baddbmm", "mv", "dot",
                       "inner", "vdot", "chain_matmul", "multi_dot"))
# functions that keep the elements' order under another shape
_VIEWS = frozenset(("view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "ravel", "contiguous", "clone",
                    "detach", "to", "float", "double", "half", "bfloat16", "type", "type_as"))


def _flat_operands(args, kwargs) -> list:
    out = []
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, FlatBatch):
                out.append(t)
    return out


def _dims_given(name: str, args, kwargs, ndim: int) -> list:
    """The dims an ``_ALONG`` op is given (ints among its other arguments and its dim keywords),
    or its default: the last dim (all of them for ``roll`` without dims, ``permute`` / ``rot90``
    by their lists)."""
    if type(kwargs.get("dim")) is int:
        return [kwargs["dim"]]
    found = []
    for v in (*args[1:], *(kwargs.get(k) for k in ("dim", "dims", "dim0", "dim1", "axis", "source", "destination"))):
        for e in (v if isinstance(v, (list, tuple)) else (v,)):
            if type(e) is int:
                found.append(e)
    if name == "roll" and "dims" not in kwargs and len(args) < 3:
        return [0]  # rolled as a flat vector
    if name in ("topk", "kthvalue", "narrow", "split", "chunk", "tensor_split", "index_fill", "index_fill_"):
        found = found[1:] if name in ("topk", "kthvalue", "split", "chunk", "tensor_split") else found[:1]
    return found or [-1]


def _within_rows(out: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether each row (along dim 0) of ``out``, ``a``'s elements under another shape, lies inside
    one row of ``a``."""
    if not out.shape[0] or not a.dim() or not a.shape[0]:
        return True
    old_row, new_row = a.numel() // a.shape[0], out.numel() // out.shape[0]
    return bool(new_row) and old_row % new_row == 0


def _keeps_order(func, args, kwargs, out, partition: Partition) -> bool:
    """Whether ``out`` holds the samples' elements in order (NOTE [ Elements in order ])."""
    name = getattr(func, "__name__", "")
    flats = _flat_operands(args, kwargs)
    if not flats or not all(f._ordered for f in flats) or name in _MOVES or name == "__get__" or name.startswith("fft_"):
        return False
    a = flats[0]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        if len({o.shape for o in out}) != 1 or name in ("split", "chunk", "unbind", "tensor_split"):
            return False  # pieces of several shapes: not one reading
        out = out[0]  # ``max(-1)``, ``sort(-1)``: values and indices alike
    if not isinstance(out, torch.Tensor):
        return False
    if name in _VIEWS:
        # the order kept, and each new row inside one old row (so inside one sample), or a vector:
        # rows that span samples would let a later op along them move elements between samples
        return out.numel() == a.numel() and (out.dim() <= 1 or _within_rows(out, a))
    if not (out.dim() and a.dim() and out.shape[0] == a.shape[0]):
        return False
    if name in _ALONG:
        return all(d % a.dim() != 0 for d in _dims_given(name, args, kwargs, a.dim()))
    if name == "__getitem__":
        i = args[1] if len(args) > 1 else None
        first = i[0] if isinstance(i, tuple) and i else i
        return first == slice(None) or (first is Ellipsis and isinstance(i, tuple) and len(i) < a.dim())
    if name in _PRODUCTS:
        left = args[1] if name in ("addmm", "baddbmm") and len(args) > 1 else (args[0] if args else kwargs.get("input"))
        return left is a and a.dim() >= 2
    if name == "pad" and len(args) > 1 and isinstance(args[1], (list, tuple)):
        return len(args[1]) < 2 * a.dim()  # the pad does not reach dim 0
    return True


def _batch_of(args, kwargs) -> tuple:
    for a in (*args, *kwargs.values()):
        if isinstance(a, FlatBatch):
            return a._batch
        if isinstance(a, (list, tuple)):  # torch.cat([y, z]), torch.stack(…)
            for b in a:
                if isinstance(b, FlatBatch):
                    return b._batch
    raise AssertionError("FlatBatch.__torch_function__ without a FlatBatch argument")


def _mark_all(out, batch, ordered: bool = False):
    if isinstance(out, torch.Tensor) and not isinstance(out, (FlatBatch, MJT)):
        return FlatBatch._mark(out, *batch, ordered=ordered)
    if isinstance(out, (tuple, list)) and any(isinstance(o, torch.Tensor) for o in out):
        marked = [_mark_all(o, batch, ordered) for o in out]
        return type(out)(*marked) if hasattr(out, "_fields") else type(out)(marked)  # (named tuples: ``sort``'s)
    return out


def _restore(op: str, batch, y: torch.Tensor, shape) -> MJT | object:
    """``y`` viewed as the multi_jagged ``shape`` (the NOTE), or ``NotImplemented`` when ``shape``
    is a dense view. A shape that starts with the batch size is read as the batch's own: on a
    ``y`` whose rows are still the batch's, ``(B, -1, …)`` names the one ragged dim by ``-1`` (as
    the batch's ``view`` does); on the samples' elements in order, ``(B, -1, *static)`` views each
    sample's elements (``_view_by_sample``); other ``(B, …)`` raise — dense torch would split the
    concatenated samples evenly, not by sample (``loss.view(B, -1).sum(1)``)."""
    shape = tuple(shape)
    partition, nested = batch
    if not any(is_nested_int(s) for s in shape):
        b = partition.batch
        if not shape or is_nested_int(shape[0]) or shape[0] != b or b < 2 or y.dim() == 0:
            return NotImplemented
        ordered = isinstance(y, FlatBatch) and y._ordered
        if (ordered and y.shape[0] == partition.rows and len(nested) == 1 and len(shape) >= 2 and shape[1] == -1
                and y.numel() == partition.rows * math.prod(shape[2:])):
            shape = (b, nested[0], *shape[2:])  # the rows are the batch's: -1 names its ragged dim
        elif ordered:
            return _view_by_sample(op, partition, nested, y, shape)
        elif y.shape[0] != partition.rows:
            return NotImplemented  # no longer the samples' elements in order: dense's view
        else:
            raise StructureError(
                f"{op}(): cannot {op} a tensor flattened from a multi_jagged batch {tuple(y.shape)} to {shape}: its "
                f"rows are the {b} samples concatenated, which {shape} would split evenly, not by sample; give the "
                f"ragged sizes ({', '.join(str(n) for n in nested)}), or -1 for the one ragged dim"
            )
    k = len(nested)
    at = [i for i, s in enumerate(shape) if is_nested_int(s)]
    if (len(at) == k and at != list(range(1, k + 1)) and shape[0] in (partition.batch, -1)
            and all(shape[i] == n for i, n in zip(at, nested))):
        # static dims before a ragged one (heads (B, H, j0, D)): the flattened rows hold each
        # sample's elements in its own order, as ``flatten_batch`` copied them
        return _restore_by_sample(op, partition, y, shape, tuple(at))
    want = f"({partition.batch} or -1, {', '.join(str(n) for n in nested)}, *static sizes)"
    if (
        len(shape) < k + 1
        or is_nested_int(shape[0])
        or shape[0] not in (partition.batch, -1)
        or not all(s is n or (is_nested_int(s) and s == n) for s, n in zip(shape[1:k + 1], nested))
        or any(is_nested_int(s) for s in shape[k + 1:])
    ):
        raise StructureError(
            f"{op}(): cannot {op} a tensor flattened from a multi_jagged batch to {shape}: expected {want}"
        )
    with _DisableTF():
        plain = y.as_subclass(torch.Tensor)
        rows = int(partition.rows)
        try:
            values = plain.view(rows, *shape[k + 1:]) if op == "view" else plain.reshape(rows, *shape[k + 1:])
        except RuntimeError as e:
            raise RuntimeError(
                f"{op}(): cannot {op} a tensor of {plain.numel()} elements ({tuple(plain.shape)}) to {shape}, a "
                f"batch of {rows} rows: {e}"
            ) from None
    return wrap_values(values, partition, tuple(range(1, k + 1)))


def _view_by_sample(op: str, partition: Partition, nested: tuple, y: "FlatBatch", shape: tuple) -> MJT | object:
    """``y``, the samples' elements in order (``k`` per row of the batch), viewed as ``(B, -1,
    *static)`` sample by sample, as the batch's own ``view(B, -1)`` reads it
    (``per_element.view(B, -1).mean(1)`` after a loss over ``x.view(-1)``): the ``-1`` is each
    sample's own size, a ragged dim, a view of ``y``. Where every sample has as many elements, dense
    torch's even split is that (``NotImplemented``); any other ``(B, …)`` raises — an even split
    would mix samples."""
    _, counts = sample_rows(partition)
    rows = sum(counts)
    if rows == 0 or y.numel() % rows or len(set(counts)) == 1:
        return NotImplemented
    k = y.numel() // rows
    rest = shape[1:]
    known = math.prod(rest[1:])
    elems = [n * k for n in counts]
    if not rest or rest[0] != -1 or any(s_ == -1 for s_ in rest[1:]) or known == 0 or any(e % known for e in elems):
        raise StructureError(
            f"{op}(): cannot {op} a tensor flattened from a multi_jagged batch {tuple(y.shape)} to {shape}: its "
            f"elements are the {partition.batch} samples concatenated ({', '.join(map(str, elems))} elements), which "
            f"{shape} would split evenly, not by sample; give -1 right after the batch size, each sample's own "
            f"size, or view it back with the batch's shape first (the ragged sizes {', '.join(map(str, nested))})"
        )
    lengths = torch.tensor([e // known for e in elems], dtype=torch.int64)
    with _DisableTF():
        plain = y.as_subclass(torch.Tensor)
        values = plain.view(-1, *rest[1:]) if op == "view" else plain.reshape(-1, *rest[1:])
    offsets = torch.zeros(partition.batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    out = from_packed(values, offsets.to(values.device), lengths.to(values.device))
    if len(nested) == 1 and lengths.tolist() == counts:
        out = relabel(out, partition)  # the batch's own ragged dim: its nested int
    return out


def _restore_by_sample(op: str, partition: Partition, y: torch.Tensor, shape: tuple, ragged_dims: tuple) -> MJT:
    """``y``, the elements of each sample in the samples' order, as the multi_jagged ``shape`` whose
    ragged dims ``ragged_dims`` are ``partition``'s (a copy, differentiable)."""
    shapes = [tuple(ns[ragged_dims.index(d)] if d in ragged_dims else shape[d] for d in range(1, len(shape)))
              for ns in partition.host_sizes().tolist()]  # SYNC: none — host sizes
    counts = [math.prod(sh) for sh in shapes]
    flat = y.as_subclass(torch.Tensor) if isinstance(y, FlatBatch) else y
    if flat.numel() != sum(counts):
        raise RuntimeError(f"{op}(): cannot {op} a tensor of {flat.numel()} elements to {shape}, a batch of "
                           f"{sum(counts)} elements")
    pieces = [p.view(sh) for p, sh in zip(flat.reshape(-1).split(counts), shapes)]
    return relabel(as_nested_tensor(pieces, ragged_dims=ragged_dims), partition)


def _restore_shape(op: str):
    def restore(batch, y, *shape):
        return _restore(op, batch, y, _shape_arg(shape))

    return restore


def _restore_as(op: str):
    def restore(batch, y, other):
        if not isinstance(y, FlatBatch) or not isinstance(other, torch.Tensor):
            return NotImplemented
        return _restore(op, batch, y, other.shape)

    return restore


def _restore_unflatten(batch, y, dim, sizes):
    if not isinstance(y, FlatBatch) or dim not in (0, -y.dim()) or y.dim() == 0:
        return NotImplemented
    return _restore("unflatten", batch, y, (*sizes, *y.shape[1:]))


def _restore_reshape_fn(batch, y, shape):
    if not isinstance(y, FlatBatch):
        return NotImplemented
    return _restore("reshape", batch, y, _shape_arg((shape,)))


_RESTORE = {
    torch.Tensor.view: _restore_shape("view"),
    torch.Tensor.reshape: _restore_shape("reshape"),
    torch.reshape: _restore_reshape_fn,
    torch.Tensor.view_as: _restore_as("view"),
    torch.Tensor.reshape_as: _restore_as("reshape"),
    torch.Tensor.unflatten: _restore_unflatten,
    torch.unflatten: _restore_unflatten,
}
