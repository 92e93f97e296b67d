"""The batch dim merged with the static dims after it: ``(B, H, j0, D)`` seen as ``(B·H, j0, D)``.

NOTE [ Batch-merged tokens ]

Attention written before ``scaled_dot_product_attention`` took 4-D inputs folds the heads into the
batch around ``bmm``: ``q.view(-1, N, D)`` / ``reshape(B * H, -1, D)`` on ``(B, H, N, D)``,
``torch.bmm(q, k.transpose(1, 2))``, ``baddbmm`` with an ALiBi bias, the scores viewed back to
``(B, H, N, N)`` for the mask and the softmax (DeBERTa-v2, Bloom, fairseq-style encoders). On a
multi_jagged tensor the merged dim would be a batch of ``B·H`` samples whose lengths repeat each
sample's ``H`` times: a new partition, and a copy of the values in that order both ways. Nothing
in this code needs the merged batch itself — every op between the merge and the split acts on
the ``B·H`` slices one at a time, the same as on ``(B, H, …)`` with a batch-first tensor — so a
merge returns a ``BatchMerged`` token instead: the batch-first tensor ``(B, K, …)`` and the logical
shape ``(B·K, …)``, with no data of its own (as NOTE [ Batch-moved tokens ] in ``leading.py`` does
for a batch moved behind a static dim).

The token runs, on the batch-first tensor with token dim ``d ≥ 1`` read as dim ``d + 1``:
``bmm`` / ``matmul`` / ``baddbmm`` / ``scaled_dot_product_attention`` between tokens of one merge
(and with dense matrices on the right of ``matmul``), ``transpose`` / ``permute`` / ``unsqueeze`` / ``squeeze`` that leave dim 0 alone,
elementwise ops (with numbers, tokens of one merge, and dense operands that broadcast over the
merged dim: a leading size of 1 or of ``B·K``), last-dim ops, ``softmax``-like ops and reductions
over dims other than 0 — and views: to another ``(B·K, …)`` shape (a token again) or back to
``(B, K, …)`` / ``(-1, K, …)`` / ``(B, …)`` with ``K`` regrouped / ``unflatten(0, (B, K))`` (the
batch-first tensor). Ops along the
merged dim raise, naming the op. A dense result of the batch-first tensor (a reduction over every
ragged dim) comes back with its first two dims flattened, as dense torch's.

Tokens are not in the autograd graph: gradients flow through the tensors they hold, so a merge
and a split are free views both ways. Under ``torch.compile`` the token is a traceable wrapper
subclass around the batch-first tensor, refused at a compiled region's boundary as a batch-moved
token is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ...errors import StructureError
from .._common import MJT, canonical_dim, canonical_dims, describe
from .tokens import _shape_arg
from .leading import _DIM, _ELEMENTWISE, _LAST, _MORE_ELEMENTWISE, _REDUCE, is_metadata, token_dispatch

__all__ = ["BatchMerged", "merge_request", "merge_batch", "flatten_merge"]

aten = torch.ops.aten


def _same(a, b) -> bool:
    """Whether sizes ``a`` and ``b`` are one ragged size: the same nested int, or while tracing the
    same symbol (compared without a guard)."""
    if a is b:
        return True
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        if is_nested_int(a) or is_nested_int(b):
            return is_nested_int(a) and is_nested_int(b) and bool(a == b)
        return a.node.expr == b.node.expr
    return False


def merge_request(x: MJT, shape: tuple) -> bool:
    """Whether ``shape`` merges ``x``'s batch dim with the static dim after it: ``x`` is ``(B, K,
    …)`` with dim 1 static and ``shape[0]`` is ``B·K``, or ``-1`` standing for it: then no other
    size is ``-1``, the later sizes hold ``x``'s ragged sizes in order, and their static sizes hold
    the static elements of one ``(B·K)`` slice."""
    if len(shape) < 2 or x.dim() < 3 or 1 in x._ragged_dims or not x._ragged_dims:
        return False
    first, rest = shape[0], shape[1:]
    if not isinstance(first, int):
        return False
    b, k = x._size[0], x._size[1]
    if b and first > 0 and first % b == 0 and first != b:
        # dim 0 cannot be the batch: B·f with f dividing dim 1 (B·K, or B·H of a dim 1 of H·D:
        # guided-diffusion's ``qkv.reshape(B * H, 3 * ch, L)``); the batch-first view decides (and raises)
        return True
    if b == 0 and first == 0:
        # no samples: ``B·f`` is 0 whatever f; a merge where the sizes after the first hold 1/f of
        # a sample's static elements, f > 1 dividing dim 1 (einops' ``(b h) n d`` of an empty batch)
        f = _empty_batch_factor(x, rest)
        return f is not None and f > 1
    if first != -1 or k == 0 or any(isinstance(s, int) and s == -1 for s in rest):
        return False
    statics = _statics_after(x, rest)
    return statics is not None and math.prod(statics) * k == _own_statics(x)


def _statics_after(x: MJT, rest: tuple):
    """The static sizes of ``rest`` (the sizes after a merged batch dim), where it holds ``x``'s
    ragged sizes in order and plain ints otherwise; else None."""
    ragged = [x._size[d] for d in x._ragged_dims]
    placed = [s for s in rest if any(_same(s, r) for r in ragged)]
    if len(placed) != len(ragged) or not all(_same(a, r) for a, r in zip(placed, ragged)):
        return None
    statics = [s for s in rest if not any(_same(s, r) for r in ragged)]
    return statics if all(isinstance(s, int) for s in statics) else None


def _own_statics(x: MJT) -> int:
    return math.prod(x._size[d] for d in range(1, x.dim()) if d not in x._ragged_dims)


def _empty_batch_factor(x: MJT, rest: tuple):
    """``f`` of a batch merged as ``B·f`` into sizes ``rest`` that hold ``1/f`` of a sample's static
    elements, with ``f`` dividing dim 1; else None."""
    statics = None if any(isinstance(s, int) and s == -1 for s in rest) else _statics_after(x, rest)
    if statics is None:
        return None
    own, held = _own_statics(x), math.prod(statics)
    if held == 0 or own % held or x._size[1] % (own // held):
        return None
    return own // held


def merge_batch(op: str, x: MJT, shape: tuple) -> "BatchMerged":
    """``x`` (``(B, K, …)``) viewed as ``shape`` (``(B·f, …)``, ``-1`` for ``B·K``): the token of
    ``x.view(B, f, *shape[1:])`` (``f`` may split dim 1: ``K = f·K'``)."""
    b = x._size[0]
    k = x._size[1] if shape[0] == -1 else shape[0] // b if b else _empty_batch_factor(x, tuple(shape[1:]))
    inner_shape = (b, k, *shape[1:])
    inner = None
    if len(x._ragged_dims) == 1 and sum(1 for s in shape[1:] if isinstance(s, int) and s == -1) == 1:
        # a -1 that can stand for the one ragged dim names it (``reshape(B * H, D, -1)`` of ``(B, H·D,
        # j0)``), so that equal lengths stay a batch too (a -1 alone reads them as one number)
        named = tuple(x._size[x._ragged_dims[0]] if isinstance(s, int) and s == -1 else s for s in inner_shape)
        try:
            inner = x.reshape(named) if op != "view" else x.view(named)
        except StructureError:
            pass
    try:
        if inner is None:
            inner = x.reshape(inner_shape) if op != "view" else x.view(inner_shape)
    except StructureError as e:
        what = f"view {describe(x)} as" if op == "view" else f"{op} {describe(x)} to"
        raise StructureError(
            f"{op}(): cannot {what} {tuple(shape)}: merging the batch dim with dim 1 ({b}·{k}), the sizes after the "
            f"first must be a view of dims 2… ({e})"
        ) from None
    if not isinstance(inner, MJT):  # every ragged size one number (a batch of one, equal lengths): dense
        return inner.flatten(0, 1)
    return inner.squeeze(1) if k == 1 else BatchMerged(inner)  # (B·1, …) is the batch itself


def flatten_merge(x: MJT, end: int):
    """``x.flatten(0, end)`` with dims ``1..end`` static (before the first ragged dim): the token
    over ``(B, Π sizes[1..end], …)``."""
    k = math.prod(x._size[1:end + 1])
    inner = x if end == 1 else x.flatten(1, end)
    return inner.squeeze(1) if k == 1 else BatchMerged(inner)


class BatchMerged(torch.Tensor):
    """A multi_jagged tensor ``(B, K, …)`` seen as ``(B·K, …)`` (NOTE [ Batch-merged tokens ])."""

    _mjt: MJT

    @staticmethod
    def __new__(cls, mjt: MJT):
        size = (mjt._size[0] * mjt._size[1], *mjt._size[2:])
        stride = (mjt._strides[1], *mjt._strides[2:])
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, stride, 0, torch.contiguous_format, mjt.dtype, torch.strided, mjt.device, False, False,
            "sizes", False, False, storage_size=0,
        )
        r._mjt = mjt
        r._size, r._strides = tuple(size), tuple(stride)
        return r

    @property
    def _k(self) -> int:
        return self._mjt._size[1]

    def __repr__(self) -> str:  # type: ignore[override]
        return f"BatchMerged(flatten({self._mjt!r}, 0, 1))"

    def __tensor_flatten__(self):
        return ["_mjt"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="multi_jagged batch-merged token at a compiled region's boundary",
            context=str(tuple(outer_size)),
            explanation="a multi_jagged tensor whose batch dim is merged with a static dim (x.view(-1, N, D) of "
            "(B, H, N, D)) cannot be an input or an output of a torch.compile'd function; view it back to "
            "(B, H, ...) inside the function (layout torch.multi_jagged)",
            hints=["view the merged dim back to (B, H, ...) inside the compiled function"],
        )

    def _dim(self, op: str, d: int, ndim: int | None = None) -> int:
        """The batch-first tensor's dim for token dim ``d`` (not the merged dim 0)."""
        d = canonical_dim(op, len(self._size) if ndim is None else ndim, d)
        if d == 0:
            raise _along_merged(op, self)
        return d + 1

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SIZE and not torch.compiler.is_compiling():
            return _SIZE[func](*args, **kwargs)  # the stored nested ints themselves (``x.shape[1] is j0``)
        handled = _OPS.get(func)
        if handled is not None:
            out = handled(*args, **kwargs)
            if out is not NotImplemented:
                return out
        kind = _FORWARDED.get(func)
        if kind is not None:
            out = _forward(func, kind, args, kwargs)
            if out is not NotImplemented:
                return out
        if is_metadata(func):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        raise NotImplementedError(
            f"{getattr(func, '__name__', func)}(): a multi_jagged tensor whose batch dim is merged with a static dim (a (B·H, …) view of "
            "(B, H, …)) supports bmm / matmul / baddbmm / sdpa, views back to (B, H, …), transposes of the other dims, "
            "elementwise ops, softmax and reductions over the other dims; view it back to (B, H, …) first for other "
            "ops (layout torch.multi_jagged)"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return token_dispatch(func, args, "batch-merged", "BatchMerged")


def _along_merged(op: str, t: BatchMerged) -> NotImplementedError:
    return NotImplementedError(
        f"{op}(): along dim 0 of a multi_jagged tensor whose batch dim is merged with a static dim "
        f"({tuple(t._size)}, a view of {describe(t._mjt)}): view it back to the batch-first shape first "
        "(layout torch.multi_jagged)"
    )


# ----------------------------------------------------------------------------- operands and results
def _inner(a, t: BatchMerged, op: str):
    """An operand of an op on token ``t`` as an operand of the batch-first op."""
    if isinstance(a, BatchMerged):
        if a._mjt._size[:2] != t._mjt._size[:2]:
            raise RuntimeError(f"{op}(): batch-merged multi_jagged tensors of different merges "
                               f"({describe(a._mjt)} and {describe(t._mjt)})")
        return a._mjt
    if isinstance(a, (list, tuple)):
        return type(a)(_inner(e, t, op) for e in a)
    if isinstance(a, MJT):
        raise NotImplementedError(
            f"{op}(): a multi_jagged tensor with a batch-merged one (a (B·H, …) view of (B, H, …)); view the merged "
            "tensor back to (B, H, …) first (layout torch.multi_jagged)"
        )
    if isinstance(a, torch.Tensor) and a.dim() == t.dim():
        if a.shape[0] == 1:
            return a.squeeze(0)
        if a.shape[0] == t._size[0]:
            return a.unflatten(0, (t._mjt._size[0], t._k))
        raise RuntimeError(f"{op}(): a dense operand of size {tuple(a.shape)} does not broadcast with "
                           f"{tuple(t._size)} at dim 0")
    return a


def _outer(out):
    """A result of the batch-first op as the token-side result."""
    if isinstance(out, MJT):
        if out.dim() >= 3 and 1 not in out._ragged_dims and out._ragged_dims:
            return BatchMerged(out)
        return out
    if isinstance(out, torch.Tensor) and not isinstance(out, BatchMerged) and out.dim() >= 2:
        return out.flatten(0, 1)
    if isinstance(out, tuple) and not isinstance(out, torch.Size):
        items = [_outer(o) for o in out]
        if hasattr(out, "n_fields"):  # a torch.return_types structseq (``max(dim)``'s values, indices)
            return type(out)(items)
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    return out


def _first_token(args, kwargs) -> BatchMerged:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, BatchMerged):
            return a
        if isinstance(a, (list, tuple)):
            for e in a:
                if isinstance(e, BatchMerged):
                    return e
    raise AssertionError("no batch-merged token among the operands")


def _forward(func, kind: str, args, kwargs):
    t = _first_token(args, kwargs)
    op = getattr(func, "__name__", str(func))
    if kind == "reduce":
        return _reduce(func, op, *args, **kwargs)
    if kind == "dim" or kind == "dim2":  # the dim is the second argument, or the third (``norm(p, dim)``)
        at = 1 if kind == "dim" else 2
        if kwargs.get("dim") is not None:
            kwargs = {**kwargs, "dim": _dims(t, op, kwargs["dim"])}
        elif len(args) > at and isinstance(args[at], (int, list, tuple)):
            args = (*args[:at], _dims(t, op, args[at]), *args[at + 1:])
    if kind == "last":  # parameters (a linear's weight) are not operands broadcast against the token
        args = (_inner(args[0], t, op), *args[1:])
        return _outer(func(*args, **kwargs))
    args = [_inner(a, t, op) for a in args]
    kwargs = {k: _inner(v, t, op) for k, v in kwargs.items()}
    if kind == "inplace":  # into the batch-first tensor the token reads
        if not isinstance(args[0], MJT):
            return NotImplemented
        func(*args, **kwargs)
        return t
    return _outer(func(*args, **kwargs))


def _split_like(op: str):
    def impl(t, size, dim=0):
        """``split`` / ``chunk`` along a dim other than the merged one (guided-diffusion's
        ``qkv.reshape(B * H, 3 * ch, L).split(ch, dim=1)``): the batch-first tensor's pieces, each
        merged again."""
        if not isinstance(t, BatchMerged):
            return NotImplemented
        return _outer(getattr(torch.Tensor, op)(t._mjt, size, t._dim(op, dim)))

    return impl


def _dims(t: BatchMerged, op: str, dim):
    """A dim argument (an int or a list of them) mapped to the batch-first tensor's dims."""
    return t._dim(op, dim) if isinstance(dim, int) else [t._dim(op, d) for d in dim]


def _reduce(func, op, t, dim=None, keepdim=False, *rest, **kwargs):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    if dim is None:
        return func(t._mjt, *rest, **kwargs)
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = canonical_dims(op, t.dim(), dims)
    if 0 in dims:
        raise _along_merged(op, t)
    return _outer(func(t._mjt, [d + 1 for d in dims], keepdim, *rest, **kwargs))


# ----------------------------------------------------------------------------- the token's own ops
def _split_request(t: BatchMerged, shape: tuple) -> bool:
    """Whether ``shape`` splits the merged dim back into ``(B, K)`` (either may be ``-1``)."""
    if len(shape) < 2 or any(is_nested_int(s) for s in shape[:2]):
        return False
    b, k = t._mjt._size[0], t._k
    if (shape[0], shape[1]) in ((b, k), (-1, k), (b, -1)):
        if -1 in (shape[0], shape[1]) and len(shape) != t._mjt.dim():
            return False  # ``(B, -1, L)`` of ``(B·K, C, L)``: the -1 holds K·C, the batch-first view's
        return b * k != 0 or (shape[0], shape[1]) == (b, k)
    return False


def _view_like(op: str):
    def impl(t, *shape):
        if not isinstance(t, BatchMerged):
            return NotImplemented
        shape = _shape_arg(shape)
        method = "reshape" if op == "reshape" else "view"
        b, k = t._mjt._size[0], t._k
        if _split_request(t, shape):
            return getattr(t._mjt, method)((b, k, *shape[2:]))
        if len(shape) > 2 and shape[0] == b and b * k != b:
            # the batch, then K regrouped (``(B, 2, 3, …)`` after ``flatten(0, 2)``): the batch-first view
            return getattr(t._mjt, method)((b, *shape[1:]))
        if shape and shape[0] in (t._size[0], -1) and not is_nested_int(shape[0]):
            if shape[0] == -1 and (any(isinstance(s, int) and s == -1 for s in shape[1:]) or t._size[0] == 0):
                raise RuntimeError(f"{op}(): cannot infer the merged dim of {tuple(t._size)} from {shape}")
            inner = getattr(t._mjt, method)((b, k, *shape[1:]))
            if inner.dim() < 3 or 1 in inner._ragged_dims:
                raise StructureError(f"{op}(): cannot view {tuple(t._size)} as {shape}")
            return BatchMerged(inner)
        raise StructureError(
            f"{op}(): cannot view {tuple(t._size)} (a (B·K, …) view of {describe(t._mjt)}) as {shape}: dim 0 must stay "
            f"the merged {b}·{k} = {t._size[0]} (or -1), or split back into ({b}, {k}, …)"
        )

    return impl


def _unflatten(t, dim, sizes):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    if canonical_dim("unflatten", t.dim(), dim) != 0:
        return BatchMerged(t._mjt.unflatten(t._dim("unflatten", dim), sizes))
    sizes = tuple(sizes)
    if len(sizes) == 2 and _split_request(t, sizes + tuple(t._size[1:])):
        return t._mjt
    raise StructureError(f"unflatten(): dim 0 of {tuple(t._size)} splits back into ({t._mjt._size[0]}, {t._k}) only, "
                         f"got {sizes}")


def _flatten(t, start_dim=0, end_dim=-1):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    n = t.dim()
    start, end = canonical_dim("flatten", n, start_dim), canonical_dim("flatten", n, end_dim)
    if start == 0 and end > 0:
        raise _along_merged("flatten", t)
    if start >= end:
        return t
    return _outer(t._mjt.flatten(start + 1, end + 1))


def _transpose(t, dim0, dim1):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    return BatchMerged(t._mjt.transpose(t._dim("transpose", dim0), t._dim("transpose", dim1)))


def _permute(t, *dims):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    dims = _shape_arg(dims)
    n = t.dim()
    perm = [canonical_dim("permute", n, d) for d in dims]
    if sorted(perm) != list(range(n)):
        raise RuntimeError(f"permute(): dims {tuple(dims)} are not a permutation of {n} dims")
    if perm[0] != 0:
        raise _along_merged("permute", t)
    return BatchMerged(t._mjt.permute(0, 1, *(d + 1 for d in perm[1:])))


def _unsqueeze(t, dim):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    return BatchMerged(t._mjt.unsqueeze(t._dim("unsqueeze", dim, t.dim() + 1)))


def _squeeze(t, dim=None):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    if dim is None:
        dims = [d for d in range(1, t.dim()) if not is_nested_int(t._size[d]) and t._size[d] == 1]
    else:
        dims = [t._dim("squeeze", d) - 1 for d in ([dim] if isinstance(dim, int) else dim)]
    inner = t._mjt
    for d in sorted(dims, reverse=True):
        if not is_nested_int(t._size[d]) and t._size[d] == 1:
            inner = inner.squeeze(d + 1)
    return BatchMerged(inner)


def _matmul_operands(op: str, a, b):
    if isinstance(a, BatchMerged):
        t = a
    elif isinstance(b, BatchMerged):
        t = b
    else:
        return None
    if isinstance(a, BatchMerged) and isinstance(b, BatchMerged):
        return _inner(a, t, op), _inner(b, t, op)
    if isinstance(a, BatchMerged) and isinstance(b, torch.Tensor) and not isinstance(b, MJT) and b.dim() <= 2:
        return a._mjt, b  # a dense matrix (or vector) applied to every slice
    if op == "bmm":
        raise RuntimeError(f"bmm(): expected two batch-merged multi_jagged tensors of one merge, got "
                           f"{describe(a)} and {describe(b)}")
    raise NotImplementedError(f"{op}(): a batch-merged multi_jagged tensor with {describe(b if t is a else a)}; "
                              "only tokens of one merge or a dense matrix on the right (layout torch.multi_jagged)")


def _matmul(op: str):
    def impl(a, b, *, out=None):
        if out is not None:
            return NotImplemented
        pair = _matmul_operands(op, a, b)
        if pair is None:
            return NotImplemented
        if op == "bmm" and (a.dim() != 3 or b.dim() != 3):
            raise RuntimeError(f"bmm(): batch1 and batch2 must be 3-D tensors, got {a.dim()}-D and {b.dim()}-D")
        return _outer(torch.matmul(*pair))

    return impl


def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    if out is not None:
        return NotImplemented
    pair = _matmul_operands("baddbmm", batch1, batch2)
    if pair is None:
        return NotImplemented
    t = batch1 if isinstance(batch1, BatchMerged) else batch2
    prod = torch.matmul(*pair)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:  # dense baddbmm ignores input then (NaN and inf in it do not propagate)
        out_ = prod
    else:
        base = _inner(input, t, "baddbmm")
        out_ = prod + (base * beta if beta != 1 else base)
    return _outer(out_)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` of ``(B·H, N, D)`` tokens: the attention of the
    batch-first ``(B, H, N, D)`` tensors (each ``(b, h)`` slice on its own, as dense)."""
    if not all(isinstance(t, BatchMerged) for t in (query, key, value)):
        return NotImplemented
    q = query
    mask = None if attn_mask is None else _inner(attn_mask, q, "scaled_dot_product_attention")
    out = F.scaled_dot_product_attention(q._mjt, _inner(key, q, "scaled_dot_product_attention"),
                                         _inner(value, q, "scaled_dot_product_attention"), attn_mask=mask,
                                         dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return _outer(out)


def _einsum(equation, *operands):
    """``torch.einsum`` with batch-merged tokens (``'bid,bjd->bij'`` on ``(B·H, j0, D)``, as einops
    writes attention after ``'b n (h d) -> (b h) n d'``): the merged subscript ``b`` reads as two,
    the batch and ``K``, on the batch-first tensors, and a result that keeps it first is a token
    again."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or "..." in equation:
        return NotImplemented
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(operands):
        return NotImplemented
    if not arrow:  # the implicit output: the subscripts used once, in order
        letters = [c for c in lhs if c.isalpha()]
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    tokens = [o for o in operands if isinstance(o, BatchMerged)]
    t = tokens[0]
    merged = {sub[0] for sub, o in zip(inputs, operands) if isinstance(o, BatchMerged) and sub}
    if len(merged) != 1:
        raise NotImplementedError(
            f"einsum(): batch-merged multi_jagged operands must share the subscript of their merged dim, got {equation!r}"
        )
    m = merged.pop()
    if m in out and out[0] != m:
        raise _along_merged("einsum", t)
    k = next(c for c in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in eq)
    b, kk = t._mjt._size[0], t._k
    subs, args = [], []
    for sub, o in zip(inputs, operands):
        if isinstance(o, BatchMerged):
            if o._mjt._size[:2] != t._mjt._size[:2]:
                raise RuntimeError(f"einsum(): batch-merged multi_jagged tensors of different merges "
                                   f"({describe(o._mjt)} and {describe(t._mjt)})")
            subs.append(m + k + sub[1:])
            args.append(o._mjt)
        elif isinstance(o, torch.Tensor) and m in sub:
            at = sub.index(m)
            if o.shape[at] != t._size[0]:
                raise RuntimeError(f"einsum(): subscript {m!r} has size {t._size[0]} (a batch-merged dim) and "
                                   f"{o.shape[at]} in a dense operand")
            subs.append(sub[:at] + m + k + sub[at + 1:])
            args.append(o.unflatten(at, (b, kk)))
        else:
            subs.append(sub)
            args.append(o)
    new_out = (m + k + out[1:]) if out[:1] == m else out
    return _outer(torch.einsum(",".join(subs) + "->" + new_out, *args))


def _cat(tensors, dim=0, *, out=None):
    """``torch.cat`` of tokens of one merge along a dim other than the merged one (its batch-first
    dim ``dim + 1``); a single token along dim 0 (``einops.pack`` of one tensor) is a copy of it."""
    tensors = list(tensors)
    if out is not None or not tensors or not all(isinstance(t, BatchMerged) for t in tensors):
        return NotImplemented
    t = tensors[0]
    d = canonical_dim("cat", t.dim(), dim)
    if d == 0:
        if len(tensors) == 1:
            return BatchMerged(t._mjt.clone())
        raise _along_merged("cat", t)
    return _outer(torch.cat([_inner(a, t, "cat") for a in tensors], d + 1))


def _normalize(t, p=2.0, dim=1, eps=1e-12, out=None):
    """``F.normalize`` over a dim other than the merged one (Perceiver's inverted cross attention
    normalises the scores over the latents)."""
    if not isinstance(t, BatchMerged) or out is not None:
        return NotImplemented
    return _outer(F.normalize(t._mjt, p, t._dim("normalize", dim), eps))


def _like(factory):
    """``torch.zeros_like(t)`` & co. of a token: the factory on the batch-first tensor, a token
    again (``nn.MultiheadAttention`` turns a bool mask into a float one with ``zeros_like``)."""
    def impl(t, *args, **kwargs):
        return BatchMerged(factory(t._mjt, *args, **kwargs)) if isinstance(t, BatchMerged) else NotImplemented

    return impl


def _type_as(t, other):
    if not isinstance(t, BatchMerged):
        return NotImplemented
    return BatchMerged(t._mjt.type_as(other._mjt if isinstance(other, BatchMerged) else other))


_OPS = {
    torch.Tensor.view: _view_like("view"), torch.Tensor.reshape: _view_like("reshape"),
    torch.reshape: _view_like("reshape"),
    torch.Tensor.unflatten: _unflatten, torch.unflatten: _unflatten,
    torch.Tensor.flatten: _flatten, torch.flatten: _flatten,
    torch.Tensor.transpose: _transpose, torch.transpose: _transpose, torch.swapaxes: _transpose,
    torch.Tensor.swapaxes: _transpose, torch.swapdims: _transpose, torch.Tensor.swapdims: _transpose,
    torch.Tensor.permute: _permute, torch.permute: _permute,
    torch.Tensor.unsqueeze: _unsqueeze, torch.unsqueeze: _unsqueeze,
    torch.Tensor.squeeze: _squeeze, torch.squeeze: _squeeze,
    torch.bmm: _matmul("bmm"), torch.Tensor.bmm: _matmul("bmm"),
    torch.matmul: _matmul("matmul"), torch.Tensor.matmul: _matmul("matmul"),
    torch.Tensor.__matmul__: _matmul("matmul"),
    torch.Tensor.__rmatmul__: lambda a, b: _matmul("matmul")(b, a),
    torch.baddbmm: _baddbmm, torch.Tensor.baddbmm: _baddbmm,
    torch.Tensor.type_as: _type_as,
    F.scaled_dot_product_attention: _sdpa,
    torch.einsum: _einsum,
    F.normalize: _normalize,
    **{f: _like(f) for f in (torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
                             torch.randn_like)},
    torch.cat: _cat, torch.concat: _cat, torch.concatenate: _cat,
    torch.Tensor.numel: lambda t: t._mjt.numel(), torch.numel: lambda t: t._mjt.numel(),
    **{f: _split_like(f.__name__) for f in (torch.split, torch.Tensor.split, torch.chunk, torch.Tensor.chunk,
                                            torch.Tensor.split_with_sizes, torch.split_with_sizes)},
}
_SIZE = {
    torch.Tensor.size: lambda t, dim=None: torch.Size(t._size) if dim is None else t._size[canonical_dim("size", len(t._size), dim)],
    torch.Tensor.shape.__get__: lambda t: torch.Size(t._size),
}
T = torch.Tensor
_FORWARDED = {**dict.fromkeys(_ELEMENTWISE + _MORE_ELEMENTWISE, "elementwise"), **dict.fromkeys(_LAST, "last"),
              **dict.fromkeys(_DIM + [torch.cumsum, T.cumsum, torch.cumprod, T.cumprod, torch.logcumsumexp,
                                      T.logcumsumexp, torch.max, T.max, torch.min, T.min, torch.argmax, T.argmax,
                                      torch.argmin, T.argmin], "dim"),
              **dict.fromkeys([torch.norm, T.norm, torch.linalg.vector_norm], "dim2"),
              **dict.fromkeys(_REDUCE + [torch.logsumexp, T.logsumexp], "reduce"),
              **dict.fromkeys([torch.Tensor.masked_fill_, torch.Tensor.div_, torch.Tensor.mul_, torch.Tensor.add_,
                               torch.Tensor.sub_, torch.Tensor.clamp_], "inplace")}
