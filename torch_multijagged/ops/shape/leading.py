"""Static dims in front of the batch dim: the packed-qkv idiom.

NOTE [ Batch-moved tokens ]

ViT code splits a fused projection with ``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)``
and ``q, k, v = qkv.unbind(0)`` (or ``qkv[0]``), and stacks with ``torch.stack([a, b], 0)``:
for a moment a static dim stands before the batch dim. This layout keeps the batch at dim 0 by
construction, so a ``permute`` / ``movedim`` that moves the batch away from dim 0, and a
``stack`` along dim 0, return a ``BatchMoved`` token: the batch-first multi_jagged tensor and
the permutation, with the logical shape and no data of its own. It supports what the idiom
needs: its metadata, indexing its leading static dim (``unbind(0)``, ``x[i]``, ``select(0, i)``),
which gives batch-first multi_jagged tensors again (a ``select`` of a static dim and a
batch-first ``permute``: views, gradients of every order), and permuting it back. Sequence-first
code (``(N, B, C)``, ``x.transpose(0, 1)``: the ``BatchSecond`` token of NOTE [ Batch-second
tokens ], a subclass) also runs the ops that do not care where the batch is: elementwise ops
between tokens of one permutation (dense operands that broadcast over the unmoved trailing dims,
numbers), ops on an unmoved last dim (``linear``, ``layer_norm``, ``dropout``, activations,
``softmax``), and reductions, whose dims are mapped through the permutation — each runs on the
batch-first tensor and the result is permuted alike (``(N, B, C).mean(0)`` is the dense
``(B, C)``). Any other op raises, naming it. Under ``torch.compile`` the token is a traceable
wrapper subclass around the batch-first tensor, so these idioms (and ``nn.MultiheadAttention``)
trace into one graph; a token may not cross the compiled function's boundary (an input or an
output), where it would be rebuilt outside the autograd graph: that is a graph break with a
message, and ``fullgraph=True`` raises it.
"""

from __future__ import annotations

import sys

import torch
from torch.fx.experimental.symbolic_shapes import is_nested_int

from ...errors import StructureError
from .._common import MJT, canonical_dim, canonical_dims, describe
from .._routing import assume_joined, route

__all__ = ["BatchMoved", "token_op", "batch_transpose"]

aten = torch.ops.aten


def _settle(mjt: MJT, perm: tuple[int, ...]):
    """``mjt.permute(perm)``: a multi_jagged tensor when the batch comes first, else a token."""
    if perm[0] == 0:
        return mjt if perm == tuple(range(len(perm))) else mjt.permute(perm)
    return BatchMoved(mjt, perm)


class BatchMoved(torch.Tensor):
    """A multi_jagged tensor whose batch dim is not at dim 0 (NOTE [ Batch-moved tokens ]):
    dim ``i`` of the token is dim ``perm[i]`` of the batch-first tensor ``_mjt``."""

    _mjt: MJT
    _perm: tuple[int, ...]

    @staticmethod
    def __new__(cls, mjt: MJT, perm: tuple[int, ...]):
        size = [mjt._size[p] for p in perm]
        stride = [mjt._strides[p] for p in perm]
        r = torch.Tensor._make_wrapper_subclass(
            cls, size, stride, 0, torch.contiguous_format, mjt.dtype, torch.strided, mjt.device, False, False,
            "sizes", False, False, storage_size=0,
        )
        r._mjt, r._perm = mjt, tuple(perm)
        r._size, r._strides = tuple(size), tuple(stride)
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"BatchMoved(permute({self._mjt!r}, {self._perm}))"

    # A traceable wrapper subclass: inside a compiled function dynamo and AOT trace through the
    # token to the batch-first tensor it holds. Only across the region's boundary is a token
    # rebuilt from its inner tensor (``__tensor_unflatten__``), and there it would come back outside
    # the autograd graph — a gradient silently lost — so it is refused.
    def __tensor_flatten__(self):
        return ["_mjt"], self._perm

    @classmethod
    def __tensor_unflatten__(cls, inner, perm, outer_size, outer_stride):
        from torch._dynamo.exc import unimplemented

        unimplemented(
            gb_type="multi_jagged batch-moved token at a compiled region's boundary",
            context=f"permutation {perm}",
            explanation=f"a multi_jagged tensor whose batch dim is not at dim 0 (dims permuted {perm}) cannot be an input or an "
            "output of a torch.compile'd function; permute the batch back to dim 0 inside the function (for "
            "sequence-first code, x.transpose(0, 1)) (layout torch.multi_jagged)",
            hints=["permute the batch dim back to dim 0 inside the compiled function"],
        )

    # ------------------------------------------------------------------ what the token supports
    def _select0(self, index: int):
        s = self._perm[0]
        if s not in self._mjt._ragged_dims:  # a ragged leading dim checks per sample
            n = self._size[0]
            if not -n <= index < n:
                raise IndexError(f"index {index} is out of bounds for dimension 0 with size {n}")
        picked = self._mjt.select(s, index)
        return _settle(picked, tuple(p - (p > s) for p in self._perm[1:]))

    def _permute(self, perm):
        perm = [canonical_dim("permute", len(self._perm), d) for d in perm]
        if sorted(perm) != list(range(len(self._perm))):
            raise RuntimeError(f"permute(): dims {tuple(perm)} are not a permutation of {len(self._perm)} dims")
        return _settle(self._mjt, tuple(self._perm[d] for d in perm))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self = args[0] if args else None
        handled = _TOKEN_OPS.get(func)
        if handled is not None and (isinstance(self, BatchMoved) or func in _REGISTERED):
            out = handled(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func in _FORWARDED:
            out = _forward(func, args, kwargs)
            if out is not NotImplemented:
                return out
        if is_metadata(func):
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            if func is torch.Tensor.size and type(out) is torch.SymInt:  # a ragged size
                refuse_recurrent_batch_read(self)
            return out
        perm = next((t._perm for t in _tokens(list(args) + list(kwargs.values()))), None)
        raise NotImplementedError(
            f"{getattr(func, '__name__', func)}(): a multi_jagged tensor whose batch dim is not at dim 0 (dims "
            f"permuted {perm}) supports indexing its leading dim, permuting the batch back to dim 0, elementwise "
            "ops, last-dim ops (linear, layer_norm, dropout, softmax(-1)) and reductions; permute the batch back "
            "first for other ops (layout torch.multi_jagged)"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return token_dispatch(func, args, "batch-moved", "BatchMoved")


# NOTE [ Recurrent layers given the other time layout ]
#
# ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` read their batch size as ``input.size(0 if batch_first else
# 1)`` and build their zero state with it (or check a given one against it) before ``torch.lstm``
# (routed in ops/nn/rnn.py, whose error says what to pass) sees the input. Given a batch-first
# multi_jagged batch ``(B, j0, C)`` with ``batch_first=False``, or its sequence-first token
# ``x.transpose(0, 1)`` with ``batch_first=True``, that read is the time dim's nested int, and
# torch fails on it with an internal message ("SymIntArrayRef expected to contain only concrete
# integers"). So a ragged size read through ``size(dim)`` — a multi_jagged tensor's (the values
# path's ``Tensor.size``) or a token's — looks at its caller, and from one of those forwards raises
# the layout error instead: a few frames walked only where a ragged size is read by ``size``,
# nothing on any other call.
_RECURRENT_FORWARDS = (torch.nn.RNN.forward.__code__, torch.nn.LSTM.forward.__code__, torch.nn.GRU.forward.__code__)


def refuse_recurrent_batch_read(x) -> None:
    """Raise the layout error where a recurrent layer's forward reads its batch size from ``x``'s
    ragged dim (NOTE [ Recurrent layers given the other time layout ])."""
    frame = sys._getframe(1)
    for _ in range(5):
        frame = frame.f_back
        if frame is None:
            return
        # by identity: code that dynamo generates may hold unhashable constants (a slice, a
        # dict), and a code object hashes its constants
        code = frame.f_code
        if any(code is c for c in _RECURRENT_FORWARDS):
            break
    else:
        return
    layer = type(frame.f_locals.get("self")).__name__  # no "name(): " prefix: the user called the module
    if isinstance(x, BatchMoved):
        raise StructureError(
            f"{layer}(batch_first=True) takes a batch-first input (B, T, C); {describe(x._mjt)}.transpose(0, 1) is "
            "sequence-first: pass the multi_jagged batch itself, or build the layer with batch_first=False"
        )
    raise StructureError(
        f"{layer}(batch_first=False) takes a sequence-first input (T, B, C); a multi_jagged batch {describe(x)} is "
        "batch-first: pass x.transpose(0, 1), or build the layer with batch_first=True"
    )


def is_metadata(func) -> bool:
    """A metadata query or attribute read a token answers itself (``dim``, ``size``, ``x.dtype``)."""
    name = getattr(func, "__name__", "")
    return name == "__get__" or func in _METADATA or name.startswith(("is_", "_is_"))


def token_dispatch(func, args, kind: str, cls_name: str):
    """A token's ``__torch_dispatch__``: metadata from its stored sizes; it has no data."""
    meta = _DISPATCH_METADATA.get(func)
    if meta is not None:
        return meta(args[0])
    raise NotImplementedError(f"{func}: a {kind} multi_jagged token has no data of its own (see {cls_name})")


def _unbind(t: BatchMoved, dim=0):
    if canonical_dim("unbind", len(t._perm), dim) != 0:
        return NotImplemented
    if t._perm[0] in t._mjt._ragged_dims:
        raise NotImplementedError(
            "unbind(0): the leading dim is ragged (each sample has its own length); index it with x[i] "
            "(per sample) or permute the batch back to dim 0"
        )
    # one unbind of the static dim: its backward stacks the gradients once, where a select per
    # piece would scatter each into a zero gradient of the whole and add them up
    s = t._perm[0]
    perm = tuple(p - (p > s) for p in t._perm[1:])
    return tuple(_settle(piece, perm) for piece in t._mjt.unbind(s))


def _getitem(t: BatchMoved, index):
    if isinstance(index, int) and not isinstance(index, bool):
        return t._select0(index)
    if isinstance(index, tuple) and index and isinstance(index[0], int) and not isinstance(index[0], bool):
        return t._select0(index[0])[index[1:]] if len(index) > 1 else t._select0(index[0])
    items = index if isinstance(index, tuple) else (index,)
    if items and isinstance(items[0], slice) and all(isinstance(i, slice) and i == slice(None) for i in items[1:]):
        # a slice of the leading dim (t[1:], t[:-1] of sequence-first tokens): of the mapped dim
        s = t._perm[0]
        if s == 0:
            return NotImplemented
        return _settle(t._mjt[(slice(None),) * s + (items[0],)], t._perm)
    return NotImplemented


def _select(t: BatchMoved, dim, index):
    if canonical_dim("select", len(t._perm), dim) != 0:
        return NotImplemented
    return t._select0(index)


def _permute(t: BatchMoved, *dims):
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)) else dims
    return t._permute(list(dims))


def _transpose(t: BatchMoved, dim0, dim1):
    n = len(t._perm)
    a, b = canonical_dim("transpose", n, dim0), canonical_dim("transpose", n, dim1)
    perm = list(range(n))
    perm[a], perm[b] = perm[b], perm[a]
    return t._permute(perm)


def _movedim_order(op: str, n: int, source, destination) -> list[int]:
    """The permutation ``movedim(source, destination)`` makes of ``n`` dims."""
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [canonical_dim(op, n, d) for d in src]
    dst = [canonical_dim(op, n, d) for d in dst]
    order = [None] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(n) if d not in src)
    return [o if o is not None else next(rest) for o in order]


def _movedim(t: BatchMoved, source, destination):
    return t._permute(_movedim_order("movedim", len(t._perm), source, destination))


def _cat(tensors, dim=0, *, out=None):
    """``torch.cat`` of tokens of one permutation and dense tensors in the token's dim order
    (sequence-first ``cat([cls, t], 0)``: a dense ``(1, B, C)`` token prepended to each sample): the
    batch-first ``cat`` along the mapped dim, each dense operand permuted alike."""
    if out is not None or not isinstance(tensors, (list, tuple)) or not tensors:
        return NotImplemented
    tokens = [t for t in tensors if isinstance(t, BatchMoved)]
    if not tokens:
        return NotImplemented
    perm = tokens[0]._perm
    n = len(perm)
    if any(t._perm != perm for t in tokens) or any(isinstance(t, MJT) for t in tensors):
        return NotImplemented
    md = perm[canonical_dim("cat", n, dim)]
    if md == 0:
        return NotImplemented  # along the batch dim: the error names cat
    back = tuple(sorted(range(n), key=lambda i: perm[i]))  # token dims in batch-first order
    parts = []
    for t in tensors:
        if isinstance(t, BatchMoved):
            parts.append(t._mjt)
        elif isinstance(t, torch.Tensor) and t.dim() == n:
            parts.append(t.permute(back))
        else:
            return NotImplemented
    return _rewrap(torch.cat(parts, md), perm)


# ----------------------------------------------------------------------------- ops that forward
_REGISTERED: set = {torch.cat, torch.concat, torch.concatenate}


def token_op(*funcs):
    """Decorator: ``fn(*args, **kwargs)`` handles ``funcs`` called with a batch-moved token
    (``nn.MultiheadAttention``'s forward takes sequence-first tokens: ``attention/mha.py``)."""
    def wrapper(fn):
        for f in funcs:
            _TOKEN_OPS[f] = fn
            _REGISTERED.add(f)
        return fn

    return wrapper


def _tokens(args) -> list:
    out = []
    for a in args:
        if isinstance(a, BatchMoved):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, BatchMoved)]
    return out


def _trailing_fixed(perm) -> int:
    """How many trailing dims the permutation leaves in place."""
    n = 0
    for i in range(len(perm) - 1, -1, -1):
        if perm[i] != i:
            break
        n += 1
    return n


def _unwrap_arg(a, fixed: int, perm=None):
    if isinstance(a, BatchMoved):
        return a._mjt
    if isinstance(a, (list, tuple)):
        return type(a)(_unwrap_arg(t, fixed, perm) for t in a)
    if isinstance(a, torch.Tensor) and not isinstance(a, MJT) and a.dim() > fixed:
        if perm is not None and a.dim() <= len(perm):
            # dense broadcasting against the token (trailing dims aligned), laid out batch-first:
            # (B, C) against a (T, B, C) token is (B, 1, C) against the (B, T, C) tensor
            full = a.reshape((1,) * (len(perm) - a.dim()) + tuple(a.shape))
            inverse = sorted(range(len(perm)), key=lambda i: perm[i])
            return full.permute(inverse)
        raise NotImplementedError(
            f"a dense operand of {a.dim()} dims with a batch-moved multi_jagged token: only dense operands that "
            f"broadcast over its {fixed} unmoved trailing dims (layout torch.multi_jagged)"
        )
    return a


def _rewrap(out, perm):
    if isinstance(out, MJT) and out.dim() == len(perm):
        return _settle(out, perm)
    if isinstance(out, tuple) and not isinstance(out, torch.Size):
        return type(out)(*(_rewrap(o, perm) for o in out)) if hasattr(out, "_fields") else tuple(_rewrap(o, perm) for o in out)
    return out


def _forward(func, args, kwargs):
    """``func`` on the batch-first tensors, the result permuted alike (NOTE [ Batch-moved tokens ])."""
    tokens = _tokens(list(args) + list(kwargs.values()))
    perm = tokens[0]._perm
    if any(t._perm != perm for t in tokens):
        raise NotImplementedError(
            f"{getattr(func, '__name__', func)}(): batch-moved multi_jagged tokens of different permutations"
        )
    kind = _FORWARDED[func]
    n = len(perm)
    if kind == "last" and perm[-1] != n - 1:
        return NotImplemented
    if kind == "reduce":
        return _reduce(func, tokens[0], *args[1:], **kwargs)
    if kind == "dim":
        args, kwargs = _map_dim(func, perm, args, kwargs)
    if kind == "dim1":
        return _dim_op(func, tokens[0], args, kwargs)
    if kind == "dims":
        return _dims_op(func, tokens[0], args, kwargs)
    # parameters of a last-dim op (a linear's weight) are not operands broadcast against the token
    fixed = n if kind == "last" else _trailing_fixed(perm)
    mapped = perm if kind == "elementwise" else None
    out = func(*_unwrap_arg(list(args), fixed, mapped), **{k: _unwrap_arg(v, fixed, mapped) for k, v in kwargs.items()})
    return _rewrap(out, perm)


def _dims_op(func, t: "BatchMoved", args, kwargs):
    """An op over a list of dims that keeps the shape (``flip(dims)``, ``roll(shifts, dims)``) of a
    token: over the mapped dims of the batch-first tensor, rewrapped in the token's order. Without
    dims (``roll`` of the flattened tensor) or over the batch dim: refused."""
    at = _DIMS_AT[func]
    if at == 1 and len(args) > 2:
        args = (args[0], list(args[1:]))  # ``t.flip(0, 2)``
    dims = kwargs["dims"] if "dims" in kwargs else (args[at] if len(args) > at else None)
    if dims is None:
        return NotImplemented
    name = getattr(func, "__name__", "op")
    n = len(t._perm)
    single = isinstance(dims, int)
    mapped = [t._perm[canonical_dim(name, n, d)] for d in ([dims] if single else dims)]
    if 0 in mapped:
        return NotImplemented  # over the batch dim: the error names the op
    mapped = mapped[0] if single else mapped
    if "dims" in kwargs or len(args) <= at:
        kwargs = {**kwargs, "dims": mapped}
    else:
        args = (*args[:at], mapped, *args[at + 1:])
    return _rewrap(func(t._mjt, *args[1:], **kwargs), t._perm)


def _dim_op(func, t: "BatchMoved", args, kwargs):
    """An op over one dim (``max(dim)``, ``cumsum``, ``norm(p, dim)``, ``std``…) of a token: over the
    mapped dim of the batch-first tensor; the result's dims follow the token's (the dim removed,
    or kept in place). Without a dim (a reduction over every element) the batch-first tensor's own."""
    name = getattr(func, "__name__", "op")
    n = len(t._perm)
    at = _DIM_AT[func]
    if "dim" in kwargs:
        dim = kwargs["dim"]
    else:
        dim = args[at] if len(args) > at else None
    if dim is None and func in _LAST_BY_DEFAULT:
        dim = -1
    elif dim is None and func in _FIRST_BY_DEFAULT:
        dim = 0
    if dim is None:
        if func in _NEEDS_DIM:
            return NotImplemented
        return func(t._mjt, *args[1:], **kwargs)
    if not isinstance(dim, int):
        return NotImplemented
    d = canonical_dim(name, n, dim)
    md = t._perm[d]
    if "dim" in kwargs or len(args) <= at:
        kwargs = {**kwargs, "dim": md}
    else:
        args = (*args[:at], md, *args[at + 1:])
    out = func(t._mjt, *args[1:], **kwargs)
    kept = tuple(p - (p > md) for i, p in enumerate(t._perm) if i != d)

    def back(o):
        if not isinstance(o, torch.Tensor):
            return o
        perm = t._perm if o.dim() == n else kept
        if isinstance(o, MJT):
            return _rewrap(o, perm)
        return o.permute(perm) if perm != tuple(range(len(perm))) else o

    if isinstance(out, tuple):
        return type(out)([back(o) for o in out])
    return back(out)


def _map_dim(func, perm, args, kwargs):
    """``softmax``-like ops: the ``dim`` argument (second positional or keyword) mapped to the
    batch-first tensor's dim."""
    n = len(perm)
    if "dim" in kwargs:
        kwargs = {**kwargs, "dim": perm[canonical_dim(func.__name__, n, kwargs["dim"])]}
    elif len(args) > 1 and isinstance(args[1], int):
        args = (args[0], perm[canonical_dim(func.__name__, n, args[1])], *args[2:])
    return args, kwargs


def _reduce(func, t: "BatchMoved", dim=None, keepdim=False, *rest, **kwargs):
    """A reduction over token dims ``dim``: over the mapped dims of the batch-first tensor; the
    kept dims keep their order."""
    name = getattr(func, "__name__", "reduce")
    n = len(t._perm)
    if dim is None:
        return func(t._mjt, *rest, **kwargs)
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = canonical_dims(name, n, dims)
    out = func(t._mjt, [t._perm[d] for d in dims], keepdim, *rest, **kwargs)
    if keepdim:  # every dim stays: the result back in the token's order, dense (ragged dims gone) too
        if isinstance(out, torch.Tensor) and not isinstance(out, MJT):
            return out.permute(t._perm) if t._perm != tuple(range(n)) else out
        return _rewrap(out, t._perm)
    gone = {t._perm[d] for d in dims}
    kept = [p for i, p in enumerate(t._perm) if i not in dims]
    remap = {p: p - sum(g < p for g in gone) for p in kept}
    perm = tuple(remap[p] for p in kept)
    if isinstance(out, torch.Tensor) and not isinstance(out, MJT):
        return out.permute(perm) if perm != tuple(range(len(perm))) else out
    return _rewrap(out, perm)


F = torch.nn.functional
_ELEMENTWISE = [
    torch.add, torch.sub, torch.mul, torch.div, torch.Tensor.add, torch.Tensor.sub, torch.Tensor.mul, torch.Tensor.div,
    torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.__sub__, torch.Tensor.__rsub__, torch.Tensor.__mul__,
    torch.Tensor.__rmul__, torch.Tensor.__truediv__, torch.Tensor.__rtruediv__, torch.Tensor.__neg__, torch.Tensor.__pow__,
    torch.relu, torch.tanh, torch.sigmoid, torch.exp, torch.sqrt, torch.rsqrt, torch.Tensor.relu, torch.Tensor.tanh,
    torch.Tensor.sigmoid, torch.Tensor.exp, torch.Tensor.sqrt, torch.Tensor.rsqrt, torch.Tensor.pow, torch.pow,
    torch.Tensor.clone, torch.clone, torch.Tensor.detach, torch.Tensor.contiguous, torch.Tensor.to, torch.Tensor.float,
    torch.Tensor.double, torch.Tensor.half, torch.Tensor.bfloat16, torch.where, torch.Tensor.masked_fill,
    F.relu, F.gelu, F.silu, F.elu, F.leaky_relu, F.sigmoid, F.tanh, F.dropout, F.mish, F.hardswish,
]
T = torch.Tensor
# comparisons, logical ops and more elementwise math, as torch functions and tensor methods
_MORE_ELEMENTWISE = [
    torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne, T.gt, T.lt, T.ge, T.le, T.eq, T.ne, T.__gt__, T.__lt__,
    T.__ge__, T.__le__, T.__eq__, T.__ne__, T.__and__, T.__or__, T.__invert__, T.__rpow__, torch.logical_not,
    T.logical_not, torch.abs, T.abs, torch.log, T.log, torch.clamp, T.clamp, torch.maximum, torch.minimum,
    T.bool, T.long, T.int, T.type, torch.masked_fill, torch.nan_to_num, T.nan_to_num, torch.erf, F.softplus,
]
# elementwise math without a dim, as torch functions and tensor methods
_UNARY = ["sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "log1p", "log2", "log10", "exp2", "expm1",
          "reciprocal", "square", "neg", "floor", "ceil", "round", "trunc", "frac", "sign", "erfc", "clamp_min",
          "clamp_max", "atan2", "hypot", "fmod", "remainder", "lerp", "addcmul", "addcdiv", "isnan", "isinf",
          "isfinite", "logical_and", "logical_or"]
_MORE_ELEMENTWISE += [f for n in _UNARY for f in (getattr(torch, n, None), getattr(T, n, None)) if f is not None]
_LAST = [F.linear, F.layer_norm, F.rms_norm, F.glu]
_DIM = [F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax]
_REDUCE = [torch.sum, torch.mean, torch.amax, torch.amin, torch.Tensor.sum, torch.Tensor.mean, torch.Tensor.amax,
           torch.Tensor.amin]
# ops over one dim, by the position of their ``dim`` argument; those that need one
_DIM_AT = {
    **dict.fromkeys([torch.max, torch.Tensor.max, torch.min, torch.Tensor.min, torch.argmax, torch.Tensor.argmax,
                     torch.argmin, torch.Tensor.argmin, torch.cumsum, torch.Tensor.cumsum, torch.cumprod,
                     torch.Tensor.cumprod, torch.logsumexp, torch.Tensor.logsumexp, torch.prod, torch.Tensor.prod,
                     torch.std, torch.Tensor.std, torch.var, torch.Tensor.var, torch.median, torch.Tensor.median,
                     torch.all, torch.Tensor.all, torch.any, torch.Tensor.any, torch.cummax, torch.Tensor.cummax,
                     torch.cummin, torch.Tensor.cummin], 1),
    **dict.fromkeys([torch.norm, torch.Tensor.norm, torch.linalg.vector_norm], 2),
    **dict.fromkeys([torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort], 1),
    **dict.fromkeys([torch.topk, torch.Tensor.topk, torch.kthvalue, torch.Tensor.kthvalue], 2),
    **dict.fromkeys([torch.chunk, torch.Tensor.chunk, torch.split, torch.Tensor.split], 2),
    **dict.fromkeys([torch.squeeze, torch.Tensor.squeeze], 1),
}
# ops over one dim whose dim defaults to the first (``qkv.chunk(3)``)
_FIRST_BY_DEFAULT = {torch.chunk, torch.Tensor.chunk, torch.split, torch.Tensor.split}
# ops over one dim whose dim defaults to the last
_LAST_BY_DEFAULT = {torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort, torch.topk, torch.Tensor.topk,
                    torch.kthvalue, torch.Tensor.kthvalue}
# ops over a list of dims, by its position (none: not a leading-dim op)
_DIMS_AT = {torch.flip: 1, torch.Tensor.flip: 1, torch.roll: 2, torch.Tensor.roll: 2}
_NEEDS_DIM = {torch.squeeze, torch.Tensor.squeeze,
              torch.argmax, torch.Tensor.argmax, torch.argmin, torch.Tensor.argmin, torch.cumsum, torch.Tensor.cumsum,
              torch.cumprod, torch.Tensor.cumprod, torch.logsumexp, torch.Tensor.logsumexp, torch.cummax,
              torch.Tensor.cummax, torch.cummin, torch.Tensor.cummin}
_FORWARDED = {**dict.fromkeys(_ELEMENTWISE + _MORE_ELEMENTWISE, "elementwise"), **dict.fromkeys(_LAST, "last"),
              **dict.fromkeys(_DIM, "dim"), **dict.fromkeys(_REDUCE, "reduce"), **dict.fromkeys(_DIM_AT, "dim1"),
              **dict.fromkeys(_DIMS_AT, "dims")}

def _index_select(input, dim, index):
    """``index_select`` along the token's batch dim: samples picked from the batch-first tensor
    (``pack_padded_sequence(x.transpose(0, 1), lengths, enforce_sorted=False)`` sorts them)."""
    if not isinstance(input, BatchMoved) or not isinstance(dim, int):
        return NotImplemented
    d = canonical_dim("index_select", len(input._perm), dim)
    if input._perm[d] != 0:
        return NotImplemented
    return _settle(input._mjt.index_select(0, index), input._perm)


def _unsqueeze(input, dim):
    """A new size-1 dim of a token: the batch-first tensor's last (a view), placed at ``dim``."""
    if not isinstance(input, BatchMoved) or not isinstance(dim, int):
        return NotImplemented
    n = len(input._perm)
    d = canonical_dim("unsqueeze", n + 1, dim)
    return BatchMoved(input._mjt.unsqueeze(-1), (*input._perm[:d], n, *input._perm[d:]))


def _reshape_ones(input, *shape):
    """``reshape`` / ``view`` of a token that only inserts size-1 dims (einops' ``'… -> l b h n 1'``):
    one ``unsqueeze`` each; any other shape is refused as for every other op."""
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)) else shape
    if not isinstance(input, BatchMoved):
        return NotImplemented
    have, out, k = input._size, input, 0
    for i, s in enumerate(shape):
        if k < len(have) and (s is have[k] or s == have[k] or (s == -1 and not is_nested_int(have[k]))):
            k += 1
        elif isinstance(s, int) and s == 1:
            out = _unsqueeze(out, i)
        else:
            return NotImplemented
    return out if k == len(have) else NotImplemented


_TOKEN_OPS = {
    torch.unsqueeze: _unsqueeze, torch.Tensor.unsqueeze: _unsqueeze,
    torch.reshape: _reshape_ones, torch.Tensor.reshape: _reshape_ones, torch.Tensor.view: _reshape_ones,
    torch.cat: _cat, torch.concat: _cat, torch.concatenate: _cat,
    torch.index_select: _index_select, torch.Tensor.index_select: _index_select,
    torch.unbind: _unbind, torch.Tensor.unbind: _unbind,
    torch.Tensor.__getitem__: _getitem,
    torch.select: _select, torch.Tensor.select: _select,
    torch.permute: _permute, torch.Tensor.permute: _permute,
    torch.transpose: _transpose, torch.Tensor.transpose: _transpose, torch.swapaxes: _transpose,
    torch.Tensor.swapaxes: _transpose, torch.swapdims: _transpose, torch.Tensor.swapdims: _transpose,
    torch.movedim: _movedim, torch.Tensor.movedim: _movedim, torch.moveaxis: _movedim, torch.Tensor.moveaxis: _movedim,
}

_METADATA = {torch.Tensor.dim, torch.Tensor.size, torch.Tensor.ndimension, torch.Tensor.is_floating_point,
             torch.Tensor.is_complex, torch.Tensor.__hash__, torch.Tensor.__len__, torch.Tensor.storage_offset,
             torch.Tensor.stride, torch.Tensor.is_contiguous, torch.Tensor.untyped_storage,
             torch.Tensor.element_size, torch.Tensor.get_device}

_DISPATCH_METADATA = {
    aten.sym_size.default: lambda x: x._size,
    aten.dim.default: lambda x: len(x._size),
    aten.sym_stride.default: lambda x: x._strides,
    aten.sym_numel.default: lambda x: x._mjt._values.numel(),
    aten.numel.default: lambda x: x._mjt._values.numel(),
    aten.sym_storage_offset.default: lambda x: 0,
    aten.is_contiguous.default: lambda x: False,
    aten.sym_is_contiguous.default: lambda x: False,
}


# ----------------------------------------------------------------------------- routes that make tokens
@route(torch.permute, torch.Tensor.permute, sequence="dims")
def _permute_mjt(input, *dims):
    if not isinstance(input, MJT):
        return NotImplemented
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)) else dims
    perm = tuple(canonical_dim("permute", input.dim(), d) for d in dims)
    if not perm or perm[0] == 0 or sorted(perm) != list(range(input.dim())):
        return NotImplemented  # batch first (or a bad permutation): the op table's handler
    return _settle(input, perm)


def batch_transpose(input: MJT, dim0: int, dim1: int):
    """``transpose`` that moves the batch dim: the permutation's token."""
    perm = list(range(input.dim()))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return _settle(input, tuple(perm))


@route(torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def _movedim_mjt(input, source, destination):
    if not isinstance(input, MJT):
        return NotImplemented
    return input.permute(_movedim_order("movedim", input.dim(), source, destination))


@route(torch.stack)
def _stack(tensors, dim=0, *, out=None):
    if out is not None or not isinstance(tensors, (list, tuple)) or not tensors or not isinstance(tensors[0], MJT):
        return NotImplemented
    if canonical_dim("stack", tensors[0].dim() + 1, dim) != 0:
        joined = assume_joined("stack", tensors, tensors[0], None)
        if any(a is not b for a, b in zip(joined, tensors)):
            return torch.stack(joined, dim)
        return NotImplemented  # static dims: the op table's handler
    stacked = torch.stack(list(tensors), 1)  # (B, K, …)
    perm = (1, 0) + tuple(range(2, stacked.dim()))
    return _settle(stacked, perm)
