"""The eager values path: hot ops computed on the packed values under torch's own autograd.

NOTE [ Eager values path ]

The general mechanism (NOTE [ Subclass mechanism ] in ``tensor.py``) runs every op's aten
derivative on wrappers, so each op costs a trip through the C++ autograd layer and
``__torch_dispatch__`` in the forward, and its derivative formula costs several more in the
backward — all Python. For the ops that dominate models (elementwise arithmetic, ``linear``,
``layer_norm``, ``softmax``, scans, broadcasting into a pair, reductions, ``unsqueeze``,
``chunk``/``split``/``unbind``, ``flatten``/``unflatten`` of static dims; ``matmul`` / ``einsum``
products in ``fastpath_products.py``, the autograd API in ``autograd_api.py``), eager
``__torch_function__`` computes the result here instead, directly on the packed values, so
that torch's C++ autograd records *dense* ops (``index_select`` for a broadcast, ``index_add``
for a segment sum): their backward runs with no Python at all.

Each result still is an ordinary differentiable wrapper, so that everything else — the slow path,
``torch.compile``'d functions, user ``autograd.Function``s, ``y.backward()`` — sees a wrapper with
a ``grad_fn``: the result is made the differentiable output of ``v`` (``bridge.adopt``: one autograd node whose
backward hands the gradient to ``v``), and it *remembers* ``v`` (``_vgraph``). The next fast op reads ``v`` instead
of the wrapper, so chains of fast ops form one dense graph and the wrappers' nodes are never run
unless something else consumed the wrapper. Correctness rests on three rules:

* ``v`` is only reused while its version counter is unchanged. An in-place write into the wrapper
  (through any path) shares that counter, so afterwards the wrapper is read through
  ``values_of`` again, whose graph includes the write.
* Every gradient of a fast result reaches ``v``: through the dense graph of fast consumers, or
  through the wrapper's node. So the gradient *with respect to the result* is the gradient with
  respect to ``v``: ``torch.autograd.grad(..., inputs=y)``, ``backward(inputs=[y])``,
  ``y.retain_grad()``/``y.grad`` and ``y.register_hook`` are answered on ``v`` (``autograd_api.py``). A leaf or a slow-path
  tensor read through ``values_of`` remembers that ``v`` too, but not as its own (other paths
  reach the wrapper directly), so the autograd API leaves it alone.
* Eager only: under ``torch.compile``, a dispatch mode or a functorch transform the general
  mechanism runs (``enabled()``), and so it does for anything a fast op does not handle
  (``NotImplemented``).
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .. import pieces as _pieces
from ..bridge import _Adopt
from ..errors import StructureError
from ..tensor import MultiJaggedTensor, _ValuesOf
from ..writes import WRITE_CLOCK, chain_root, check_not_written_through_alias, written_since
from .attention import sdpa as _att
from .elementwise import pointwise as _pw
from .nn import ragged as _scans
from .reductions import reduce as _red
from . import _along
from .shape import leading as _leading, views as _views
from .shape.reshape import _unflat_sizes
from ._common import static_dims

__all__ = ["FAST", "enabled"]

MJT = MultiJaggedTensor
aten = torch.ops.aten
FAST: dict[Any, Callable[..., Any]] = {}

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_dispatch_stack = torch._C._len_torch_dispatch_stack
_functorch = torch._C._are_functorch_transforms_active
_DisableTF = torch._C.DisableTorchFunctionSubclass


def enabled() -> bool:
    return not (_is_compiling() or _dispatch_stack() or _functorch())


# The values path runs only where ``enabled()``: no functorch transform is active, so
# ``Function.apply``'s Python layer (default-argument binding for ``setup_context``-style
# functions, functorch's unwrapping) has nothing to do; its C++ ``apply`` is called directly
# (≈ 1.5 µs of the ≈ 6 µs an autograd node costs, per op).
_apply_values_of = torch._C._FunctionBase.__dict__["apply"].__get__(None, _ValuesOf)
_apply_adopt = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Adopt)


# --------------------------------------------------------------------------- values in and out
# ``_version``: an in-place op on the wrapper bumps the wrapper's counter (the handler's write into
# the values runs below autograd, where the values' counter is not bumped); a write into the
# values (``x.values().add_()``) bumps the values' counter.
_requires_grad, _version = _pieces.wrapper_requires_grad, _pieces.wrapper_version


def values(x: MJT) -> torch.Tensor:
    """``x``'s packed values carrying ``x``'s gradient (see the NOTE)."""
    hit = x.__dict__.get("_vgraph")
    if hit is not None and hit[0]._version == hit[1] and _version(x) == hit[3] and _requires_grad(x):
        if hit[4] == WRITE_CLOCK[0]:
            return hit[0]  # (a wrapper detached in place no longer requires grad: read it plainly)
        if not written_since(hit[0], hit[4]):
            x.__dict__["_vgraph"] = (*hit[:4], WRITE_CLOCK[0])  # no write reached it: now known
            return hit[0]
    v = x._values
    if not _grad_enabled():
        return v
    if hit is not None or WRITE_CLOCK[0]:
        check_not_written_through_alias(x, "values")  # NOTE [ Writes into shared values ] in writes.py
    if not _requires_grad(x):
        # a wrapper that does not require grad never lends its values' graph (an alias made
        # under no_grad of a fast result shares that result's graph-carrying values)
        return v.detach() if v.requires_grad else v
    v = _apply_values_of(x)
    x.__dict__["_vgraph"] = (v, v._version, False, _version(x), WRITE_CLOCK[0])
    return v


def _standin(x: MJT) -> MJT:
    """``x`` for a handler that reads ``._values``: the same tensor when no gradient is involved."""
    v = values(x)
    return x if v is x._values else MJT(v, x._partition, x._ragged_dims)


def result(v: torch.Tensor, partition, ragged_dims) -> MJT:
    """The wrapper of fast-op output values ``v`` (see the NOTE)."""
    return _finish(MJT(v, partition, ragged_dims))


def _finish(out):
    """A handler's output (computed on values under autograd) as a fast-op result: made the
    differentiable output of its values, remembering them (see the NOTE)."""
    if isinstance(out, MJT):
        v = out._values
        if v.requires_grad and _grad_enabled():
            y = _apply_adopt(v, [out])
            y.__dict__["_vgraph"] = (v, v._version, True, _version(y), WRITE_CLOCK[0])
            return y
    return out


def _view_of(out: MJT, input: MJT) -> MJT:
    """``out``, a view of ``input``'s values made here, remembered as such: a write into it bumps
    ``input``'s own version counter, which the view does not share (NOTE [ Writes into shared
    values ] in writes.py: a backward of the general mechanism that saved ``input`` raises). Not
    for a copy made where dense torch gives a view (a slice along a ragged dim, NOTE [ Slices of
    ragged dims write through ] in shape/views.py): its views must not keep it alive."""
    if not (_views._REORDER_COPIES and _views._registered(input)[1] is not None):
        # the first tensor of a chain of such views is held, as a dense view holds its base; the
        # views in between only weakly (``y = y.unsqueeze(-1).squeeze(-1)`` in a loop must not
        # keep, and walk on each write, every view made before)
        root = chain_root(input, MJT)
        out.__dict__["_view_root"] = root
        out.__dict__["_view_of"] = input if root is input else weakref.ref(input)
    return out


def own_values(x) -> torch.Tensor | None:
    """``v`` when ``x`` is a fast-op result whose gradients all reach ``v`` (else None)."""
    if not isinstance(x, MJT):
        return None
    hit = x.__dict__.get("_vgraph")
    if hit is None or not hit[2] or hit[0]._version != hit[1] or _version(x) != hit[3] or written_since(hit[0], hit[4]):
        return None
    return hit[0]


def _trailing(x: MJT) -> int:
    """Static dims after the last ragged dim: where a dense operand or a row-wise op may reach."""
    return len(x._size) - 1 - x._ragged_dims[-1] if x._ragged_dims else len(x._size) - 1


def _values_dim(x: MJT, d: int) -> int:
    """The dim of ``x``'s values that its static dim ``d`` is: values are (rows, static dims…)."""
    return static_dims(len(x._size), x._ragged_dims).index(d) + 1


def _scalar(a) -> bool:
    return isinstance(a, (int, float, bool, complex))


# --------------------------------------------------------------------------- elementwise
def _unary(func):
    def impl(x, *args, **kwargs):
        if not isinstance(x, MJT) or "out" in kwargs:
            return NotImplemented
        if kwargs.get("inplace"):
            if _rewritable(x, args):
                rest = dict(kwargs, inplace=False)
                return _pieces.rewrite(lambda p: func(p, *args, **rest), x)
            return NotImplemented
        for a in args:
            if isinstance(a, torch.Tensor):
                return NotImplemented
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                return NotImplemented
        if "_pieces" in x.__dict__ and _pieces.holds_pieces(x):
            return _pieces.map_pieces(lambda p: func(p, *args, **kwargs), x)
        return result(func(values(x), *args, **kwargs), x._partition, x._ragged_dims)

    return impl


def _piecewise_operand(t) -> bool:
    """Whether ``t``, beside a tensor holding per-sample pieces, applies to each piece as it is: a
    Python scalar or a 0-dim tensor (``scores * self.scale``)."""
    return _scalar(t) or (isinstance(t, torch.Tensor) and t.dim() == 0)


def _dense_ok(t: torch.Tensor, like: MJT) -> bool:
    return t.dim() <= _trailing(like)


def _rows_of_dense(t, aten_op, kwargs) -> bool:
    """Whether a dense operand that spans the batch or sits at ragged dims goes through the values
    path as rows (``pointwise.dense_operand_rows``): when it requires grad, so that its gradient
    is differentiable again."""
    return aten_op is not None and not kwargs and isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()


def _binary(func, aten_op=None, reverse: bool = False):
    """``func(a, b)``; ``reverse``: the dunder's operands are swapped by Python (``__rsub__``)."""

    def impl(a, b, *args, **kwargs):
        if args or "out" in kwargs:
            return NotImplemented
        if isinstance(a, MJT):
            like = a
            if isinstance(b, MJT):
                if b._partition is not a._partition or b._ragged_dims != a._ragged_dims or len(b._size) != len(a._size):
                    if aten_op is None or kwargs:
                        return NotImplemented
                    # broadcasting into new ragged dims (a pair from singles): gathered with
                    # the cached row maps, under autograd here
                    return _finish(_pw.broadcast_values(aten_op, a, b, values(a), values(b)))
                if ("_pieces" in a.__dict__ or "_pieces" in b.__dict__) and (_pieces.holds_pieces(a) or _pieces.holds_pieces(b)):
                    # piece by piece, the other operand's images read as views of its rows
                    # (``scores + bias``: NOTE [ Attention scores held per sample ])
                    return _pieces.zip_pieces(lambda p, q: func(p, q, **kwargs), a, b)
                return result(func(values(a), values(b), **kwargs), a._partition, a._ragged_dims)
            if _scalar(b) or (isinstance(b, torch.Tensor) and _dense_ok(b, a)):
                if "_pieces" in a.__dict__ and _piecewise_operand(b) and _pieces.holds_pieces(a):
                    return _pieces.map_pieces(lambda p: func(p, b, **kwargs), a)
                return result(func(values(a), b, **kwargs), like._partition, like._ragged_dims)
            if _rows_of_dense(b, aten_op, kwargs):
                vb = _pw.dense_operand_rows(aten_op, a, b, (a, b))
                if vb is not None:
                    return result(func(values(a), vb), a._partition, a._ragged_dims)
            return NotImplemented
        if isinstance(b, MJT) and (_scalar(a) or (isinstance(a, torch.Tensor) and _dense_ok(a, b))):
            if "_pieces" in b.__dict__ and _piecewise_operand(a) and _pieces.holds_pieces(b):
                return _pieces.map_pieces(lambda q: func(a, q, **kwargs), b)
            return result(func(a, values(b), **kwargs), b._partition, b._ragged_dims)
        if isinstance(b, MJT) and _rows_of_dense(a, aten_op, kwargs):
            va = _pw.dense_operand_rows(aten_op, b, a, (a, b))
            if va is not None:
                return result(func(va, values(b)), b._partition, b._ragged_dims)
        return NotImplemented

    return impl


_UNARY = (
    "abs neg exp expm1 log log1p log2 sqrt rsqrt sin cos tan tanh sigmoid relu square reciprocal "
    "erf sign floor ceil round trunc sinh cosh asinh atanh asin acos atan exp2 logit nan_to_num clamp clip "
    "clamp_min clamp_max"
).split()
_F_UNARY = "silu gelu relu relu6 elu selu celu leaky_relu hardtanh hardswish hardsigmoid mish softplus tanh sigmoid dropout".split()

for _name in _UNARY:
    for _owner in (torch, torch.Tensor):
        _f = getattr(_owner, _name, None)
        if _f is not None:
            FAST[_f] = _unary(_f)
for _name in _F_UNARY:
    _f = getattr(F, _name)
    FAST[_f] = _unary(_f)


def _masked_fill(input, mask, value):
    """``masked_fill`` of a tensor holding per-sample pieces by a mask of its structure, with a
    Python scalar: piece by piece (a causal mask on attention scores held per sample, NOTE
    [ Attention scores held per sample ]); everything else takes its route."""
    if not (isinstance(input, MJT) and isinstance(mask, MJT) and _scalar(value) and "_pieces" in input.__dict__):
        return NotImplemented
    if (mask._partition is not input._partition or mask._ragged_dims != input._ragged_dims
            or mask._size != input._size or mask.dtype != torch.bool or not _pieces.holds_pieces(input)):
        return NotImplemented
    return _pieces.zip_pieces(lambda p, m: p.masked_fill(m, value), input, mask)


FAST[torch.masked_fill] = FAST[torch.Tensor.masked_fill] = _masked_fill


def _filled_like(fill: int):
    """``ones_like`` / ``zeros_like`` (``dtype`` at most) of a tensor holding per-sample pieces:
    new packed values of its structure, without packing its own (a causal mask built from the
    scores it masks)."""

    def impl(input, *args, **kwargs):
        if args or not isinstance(input, MJT) or set(kwargs) - {"dtype"} or "_pieces" not in input.__dict__:
            return NotImplemented
        if not _pieces.holds_pieces(input):
            return NotImplemented
        dtype = kwargs.get("dtype") or input.dtype
        rows, c = input._partition.rows, input._size[1]
        lead = _pieces.lead_major(input)  # the values the holder reports, as dense's preserve_format
        v = torch.full((c, rows) if lead else (rows, c), fill, dtype=dtype, device=input.device)
        return MJT(v.T if lead else v, input._partition, input._ragged_dims)

    return impl


FAST[torch.ones_like] = _filled_like(1)
FAST[torch.zeros_like] = _filled_like(0)


def _rewritable(x: MJT, args) -> bool:
    """Whether an in-place elementwise op with ``args`` rewrites ``x``'s per-image pieces."""
    return ("_pieces" in x.__dict__ and x.dtype.is_floating_point and _pieces.holds_pieces(x)
            and _pieces.rewritable_here(x) and not any(isinstance(a, torch.Tensor) for a in args))


def _unary_(func):
    """An in-place method (``relu_``) of a floating tensor holding per-image pieces: new pieces (NOTE
    [ Per-image pieces ] in ``pieces.py``); everything else takes the general path's in-place write
    (which keeps the dtype, or refuses, as dense)."""

    def impl(x, *args, **kwargs):
        if not isinstance(x, MJT) or kwargs or not _rewritable(x, args):
            return NotImplemented
        return _pieces.rewrite(lambda p: func(p, *args), x)

    return impl


def _binary_(func):
    """An in-place arithmetic op (``out += identity``) of a tensor holding per-image pieces, with
    another of the same partition holding pieces or a Python scalar: new pieces (NOTE [ Per-image
    pieces ]); everything else takes the general path's in-place write."""

    def impl(a, b, *args, **kwargs):
        if (args or "out" in kwargs or not isinstance(a, MJT) or "_pieces" not in a.__dict__ or not _pieces.holds_pieces(a)
                or not _pieces.rewritable_here(a)):
            return NotImplemented
        if _scalar(b) and a.dtype.is_floating_point and not isinstance(b, complex):
            return _pieces.rewrite(lambda p: func(p, b, **kwargs), a)
        if (isinstance(b, MJT) and b._partition is a._partition and b._ragged_dims == a._ragged_dims
                and len(b._size) == len(a._size) and b.dtype == a.dtype and _pieces.holds_pieces(b)):
            return _pieces.rewrite_with(lambda p, q: func(p, q, **kwargs), a, b)
        return NotImplemented

    return impl


for _name, _f in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div)):
    FAST[getattr(torch.Tensor, _name + "_")] = _binary_(_f)
    FAST[getattr(torch.Tensor, f"__i{'truediv' if _name == 'div' else _name}__")] = _binary_(_f)


for _name in ("relu", "sigmoid", "tanh", "clamp", "clamp_min", "clamp_max", "neg", "abs", "exp"):
    for _owner in (torch, torch.Tensor):
        _f = getattr(_owner, _name, None)
        _g = getattr(_owner, _name + "_", None)
        if _f is not None and _g is not None:
            FAST[_g] = _unary_(_f)

_BINARY = {
    "add": aten.add.Tensor,
    "sub": aten.sub.Tensor,
    "mul": aten.mul.Tensor,
    "div": aten.div.Tensor,
    "maximum": aten.maximum.default,
    "minimum": aten.minimum.default,
    # aten's derivative of ``other`` is ``zeros_like(other)``, which the general path cannot
    # build at nested-int sizes: on the values it is dense torch's own
    "copysign": aten.copysign.Tensor,
    "atan2": aten.atan2.default,
}
for _name, _op in _BINARY.items():
    for _owner in (torch, torch.Tensor):
        _f = getattr(_owner, _name)
        FAST[_f] = _binary(_f, _op)
for _dunder, _op, _f in [
    ("__add__", aten.add.Tensor, operator.add),
    ("__sub__", aten.sub.Tensor, operator.sub),
    ("__mul__", aten.mul.Tensor, operator.mul),
    ("__truediv__", aten.div.Tensor, operator.truediv),
    ("__pow__", aten.pow.Tensor_Tensor, operator.pow),
]:
    FAST[getattr(torch.Tensor, _dunder)] = _binary(_f, _op)
for _dunder, _f in [
    ("__radd__", lambda a, b: b + a),
    ("__rsub__", lambda a, b: b - a),
    ("__rmul__", lambda a, b: b * a),
    # dense ``Tensor.__rtruediv__`` (``__rdiv__``) is ``self.reciprocal() * other``: its rounding, and
    # its dtype (an integer self gives the default float dtype, which a 0-dim other does not promote)
    ("__rtruediv__", lambda a, b: a.reciprocal() * b),
    ("__rpow__", lambda a, b: b ** a),
]:
    FAST[getattr(torch.Tensor, _dunder)] = _binary(_f, None)
FAST[torch.pow] = FAST[torch.Tensor.pow] = _binary(torch.pow, aten.pow.Tensor_Tensor)


# --------------------------------------------------------------------------- row-wise nn ops
def _linear(input, weight, bias=None):
    if (
        not isinstance(input, MJT)
        or isinstance(weight, MJT)
        or isinstance(bias, MJT)
        or (input._ragged_dims and input._ragged_dims[-1] == len(input._size) - 1)
    ):
        return NotImplemented
    return result(F.linear(values(input), weight, bias), input._partition, input._ragged_dims)


FAST[F.linear] = FAST[torch._C._nn.linear] = _linear


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not isinstance(input, MJT) or isinstance(weight, MJT) or isinstance(bias, MJT):
        return NotImplemented
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > _trailing(input):
        return NotImplemented
    return result(F.layer_norm(values(input), shape, weight, bias, eps), input._partition, input._ragged_dims)


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    if not isinstance(input, MJT) or isinstance(weight, MJT):
        return NotImplemented
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > _trailing(input):
        return NotImplemented
    return result(F.rms_norm(values(input), shape, weight, eps), input._partition, input._ragged_dims)


FAST[F.layer_norm] = _layer_norm
FAST[F.rms_norm] = _rms_norm


def _softmax_fn(log: bool):
    aten_op = aten._log_softmax.default if log else aten._softmax.default
    dense = torch.log_softmax if log else torch.softmax

    def impl(input, dim=None, *args, dtype=None, _stacklevel=None, **kwargs):
        # F.softmax(input, dim, _stacklevel, dtype) (by keyword through handle_torch_function);
        # Tensor.softmax(dim, dtype)
        if not isinstance(input, MJT) or not isinstance(dim, int) or kwargs or len(args) > 2:
            return NotImplemented
        if args and isinstance(args[-1], torch.dtype):
            dtype = args[-1]
        n = len(input._size)
        if not -n <= dim < n:
            return NotImplemented
        d = dim % n
        if d == 0:
            return NotImplemented
        if "_pieces" in input.__dict__ and _pieces.holds_pieces(input):
            return _pieces.map_pieces(lambda p: dense(p, d, dtype=dtype), input)
        v = values(input)
        if dtype is not None:
            v = v.to(dtype)
        if d in input._ragged_dims or _along.ragged_after(input, d):
            if not v.is_floating_point():
                return NotImplemented
            x = input if v is input._values else MJT(v, input._partition, input._ragged_dims)
            if v.requires_grad and _grad_enabled():
                if d not in input._ragged_dims:
                    return NotImplemented  # a static dim that ragged dims follow: per sample, on the general path
                if _along.eager(input) and not _along.padded_form(x, d, v, False):
                    # sample by sample, aten's kernels write into the packed buffers both ways
                    return result(_red.SoftmaxAlong.apply(v, input, d, log), input._partition, input._ragged_dims)
            return _finish(_red._softmax_default(aten_op, x, d, False))
        vd = _values_dim(input, d)
        return result(dense(v, vd), input._partition, input._ragged_dims)

    return impl


FAST[F.softmax] = FAST[torch.softmax] = FAST[torch.Tensor.softmax] = _softmax_fn(False)
FAST[F.log_softmax] = FAST[torch.log_softmax] = FAST[torch.Tensor.log_softmax] = _softmax_fn(True)


# --------------------------------------------------------------------------- structure
def _unsqueeze(input, dim):
    if not isinstance(input, MJT) or not isinstance(dim, int):
        return NotImplemented
    vd, ragged = _views.unsqueeze_plan(input, dim)
    return _view_of(result(values(input).unsqueeze(vd), input._partition, ragged), input)


FAST[torch.unsqueeze] = FAST[torch.Tensor.unsqueeze] = _unsqueeze


def _transpose(input, dim0, dim1):
    if not isinstance(input, MJT) or not isinstance(dim0, int) or not isinstance(dim1, int):
        return NotImplemented
    n = len(input._size)
    if not (-n <= dim0 < n and -n <= dim1 < n) or dim0 % n == 0 or dim1 % n == 0:
        return NotImplemented  # the batch dim: routes (nn.MultiheadAttention's batch-second token) or errors
    if dim0 % n == dim1 % n:
        # the handler returns the input's values object: a result must own its values (the NOTE)
        return NotImplemented
    return _view_of(_finish(_views.transpose_int(aten.transpose.int, _standin(input), dim0, dim1)), input)


def _permute(input, *dims):
    if not isinstance(input, MJT):
        return NotImplemented
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    if not dims or not all(isinstance(d, int) for d in dims) or dims[0] != 0:
        return NotImplemented
    if [d % len(input._size) for d in dims] == list(range(len(input._size))):
        return NotImplemented  # the identity: see _transpose
    return _view_of(_finish(_views.permute_default(aten.permute.default, _standin(input), list(dims))), input)


def _view(input, *size):
    # reshape / flatten / unflatten reach this after their checks (ops/shape/reshape.py)
    if not isinstance(input, MJT):
        return NotImplemented
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    if not size or isinstance(size[0], torch.dtype):
        return NotImplemented
    try:
        out = _views.view_default(aten.view.default, _standin(input), list(size))
    except StructureError:
        return NotImplemented  # maybe a merge / split of ragged dims: its route (ops/shape/flatten.py)
    return _view_of(_finish(out), input)


def _split_fast(method: str):
    """``chunk`` / ``split`` along a static dim: the dense op on the values, each piece a result.
    Its backward is dense ``split``'s (one ``cat``, zeros for unused pieces), with no Python. The
    pieces are multi-output views as dense's: an in-place write into one raises while it needs
    gradients (``_split_piece`` below). Arguments dense torch would refuse take the general route,
    which raises in dense's words with the user's dim."""

    def impl(input, *args, **kwargs):
        # Tensor.chunk(chunks, dim) / Tensor.split(split_size, dim) / torch.split(tensor,
        # split_size_or_sections, dim): positional, or ``dim`` by keyword
        if not isinstance(input, MJT) or len(args) not in (1, 2) or (kwargs and set(kwargs) != {"dim"}):
            return NotImplemented
        arg = args[0]
        dim = args[1] if len(args) == 2 else kwargs.get("dim", 0)
        span = None if len(args) == 2 and kwargs else _static_span(input, dim, dim)
        if span is None:
            return NotImplemented
        d = span[0]
        if type(arg) is int:
            if arg <= 0:
                return NotImplemented
        elif method == "split" and isinstance(arg, (list, tuple)) and all(type(a) is int and a >= 0 for a in arg):
            if sum(arg) != input._size[d]:
                return NotImplemented
        else:
            return NotImplemented
        pieces = getattr(_piece_values(input), method)(arg, _values_dim(input, d))
        return _pieces_of(input, pieces, input._ragged_dims)

    return impl


FAST[torch.chunk] = FAST[torch.Tensor.chunk] = _split_fast("chunk")


def _unbind(input, dim=0):
    """``unbind`` of a static dim (packed projections: ``q, k, v = qkv.unbind(2)``): dense
    ``unbind`` of the values, each piece a result, marked as ``split``'s (multi-output views).
    The batch dim (the samples) and ragged dims take the general route."""
    span = _static_span(input, dim, dim)
    if span is None:
        return NotImplemented
    d = span[0]
    ragged = tuple(r - 1 if r > d else r for r in input._ragged_dims)
    return _pieces_of(input, _piece_values(input).unbind(_values_dim(input, d)), ragged)


def _piece_values(input: MJT) -> torch.Tensor:
    """The values ``split`` / ``chunk`` / ``unbind`` cut: under no_grad, of an input that records
    gradients, still its graph-carrying values (the pieces are views of them made in no_grad
    mode, as dense's are)."""
    if not _grad_enabled() and _requires_grad(input):
        with torch.enable_grad():
            return values(input)
    return values(input)


def _pieces_of(input: MJT, pieces, ragged) -> tuple:
    """The pieces as results, views of ``input``, each marked as a multi-output view with the grad
    mode it was made in (``writes.refuse_split_piece_write``: dense's refusals of writes into them)."""
    out = tuple(_view_of(result(p, input._partition, ragged), input) for p in pieces)
    made = "no_grad" if not _grad_enabled() and _requires_grad(input) else True
    for y in out:
        y.__dict__["_split_piece"] = made
    return out


FAST[torch.unbind] = FAST[torch.Tensor.unbind] = _unbind
FAST[torch.split] = FAST[torch.Tensor.split] = _split_fast("split")


def _static_span(input, first, last):
    """``(first, last)`` as dims of ``input`` when both are ints, in range, ``0 < first ≤ last`` and
    every dim from one to the other is static; else None (the general route: its checks and errors)."""
    if not isinstance(input, MJT) or type(first) is not int or type(last) is not int:
        return None
    n = len(input._size)
    if not (-n <= first < n and -n <= last < n):
        return None
    s, e = first % n, last % n
    if s == 0 or s > e or any(s <= r <= e for r in input._ragged_dims):
        return None
    return s, e


def _unflatten(input, dim=None, sizes=None):
    span = _static_span(input, dim, dim)
    if span is None:
        return NotImplemented
    d = span[0]
    new = _unflat_sizes(input._size[d], sizes)
    if new is None:
        return NotImplemented  # sizes that do not hold the dim, two -1s…: the route (dense torch's checks)
    v = values(input).unflatten(_values_dim(input, d), new)
    k = len(new) - 1
    return _view_of(result(v, input._partition, tuple(r + k if r > d else r for r in input._ragged_dims)), input)


def _flatten(input, start_dim=0, end_dim=-1):
    span = _static_span(input, start_dim, end_dim)
    if span is None or span[0] == span[1]:
        return NotImplemented  # a no-op flatten returns its input (a result must own its values)
    s, e = span
    v = values(input).flatten(_values_dim(input, s), _values_dim(input, e))
    out = result(v, input._partition, tuple(r - (e - s) if r > e else r for r in input._ragged_dims))
    return out if v._base is None else _view_of(out, input)  # flatten copies what no strides hold


FAST[torch.unflatten] = FAST[torch.Tensor.unflatten] = _unflatten
FAST[torch.flatten] = FAST[torch.Tensor.flatten] = _flatten


FAST[torch.transpose] = FAST[torch.Tensor.transpose] = _transpose
FAST[torch.permute] = FAST[torch.Tensor.permute] = _permute
FAST[torch.Tensor.view] = _view


def _spatial_of_pieces(x: MJT, dims) -> bool:
    """``dims`` are exactly the two spatial dims of a ``(B, C, j0, j1)`` image batch."""
    return (len(dims) == 2 and len(x._size) == 4 and all(type(d) is int and -4 <= d < 4 for d in dims)
            and {d % 4 for d in dims} == {2, 3})


def _reduction(kind: str, aten_op):
    extreme = kind in ("amax", "amin")
    def impl(input, dim=None, keepdim=False, *, dtype=None, out=None):
        # amax / amin: dense's errors for ``dtype=``; every dim (``dim=()``): the route's empty rule
        if (not isinstance(input, MJT) or out is not None or not isinstance(keepdim, bool)
                or (extreme and (dtype is not None or dim is None))):
            return NotImplemented
        if ("_pieces" in input.__dict__ and dim is not None and not isinstance(dim, int) and _spatial_of_pieces(input, dim)
                and input.dtype.is_floating_point and not extreme and _pieces.holds_pieces(input)):
            # global pooling of images held one by one: each image's own reduction, as the loop
            return _pieces.reduce_images(kind, input, keepdim, dtype)
        if (dim is None and not keepdim and not extreme and "_pieces" in input.__dict__
                and input.dtype.is_floating_point and _pieces.holds_pieces(input)):
            return _pieces.reduce_all(kind, input, dtype)  # each sample's own, as the loop (no packing)
        if ("_pieces" in input.__dict__ and dim in (1, -3, (1,), (-3,), [1], [-3]) and len(input._size) == 4
                and not extreme and input.dtype.is_floating_point and _pieces.holds_pieces(input)):
            return _channel_reduction(kind, input, keepdim, dtype)
        v = values(input)
        if not (v.is_floating_point() or (v.is_complex() and not extreme)):
            return NotImplemented  # integer promotion rules live in the general path
        if dim is None:
            return NotImplemented if keepdim else v.sum(dtype=dtype) if kind == "sum" else v.mean(dtype=dtype)
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if not dims or not all(isinstance(d, int) for d in dims):
            return NotImplemented
        plan = _red.plan_cached(aten_op, input, dims)
        if extreme and not _red.extreme_on_values(plan, input, v, kind):
            return NotImplemented
        return _finish(_red._reduce(aten_op, input, dims, keepdim, kind, dtype, values=v, plan=plan))

    return impl


def _channel_reduction(kind: str, x: MJT, keepdim: bool, dtype) -> MJT:
    """``x.sum(1)`` / ``x.mean(1)`` of images held as pieces (attention weights averaged over
    heads): each image's own, without packing ``x``; kept as pieces with ``keepdim``."""
    fn = torch.sum if kind == "sum" else torch.mean
    if keepdim:
        return _pieces.map_pieces(lambda p: fn(p, 1, keepdim=True, dtype=dtype), x, channels=1)
    rows = [fn(p[0], 0, dtype=dtype).reshape(-1) for p in _pieces.split(x) if p is not None]
    out_dtype = rows[0].dtype if rows else (dtype or x.dtype)
    v = torch.cat(rows) if rows else torch.empty(0, dtype=out_dtype, device=x.device)
    return result(v, x._partition, (1, 2))


FAST[torch.sum] = FAST[torch.Tensor.sum] = _reduction("sum", aten.sum.dim_IntList)
FAST[torch.mean] = FAST[torch.Tensor.mean] = _reduction("mean", aten.mean.dim)
FAST[torch.amax] = FAST[torch.Tensor.amax] = _reduction("amax", aten.amax.default)
FAST[torch.amin] = FAST[torch.Tensor.amin] = _reduction("amin", aten.amin.default)


def _scan(op: str):
    def impl(input, dim, *, dtype=None):
        n = len(input._size) if isinstance(input, MJT) else 0
        if type(dim) is not int or not -n <= dim < n or dim % n == 0 or not _along.eager(input):
            return NotImplemented  # the route: its errors, the traced scans
        return result(_scans.scan_values(op, input, dim % n, dtype, values(input)), input._partition, input._ragged_dims)
    return impl


FAST[torch.cumsum] = FAST[torch.Tensor.cumsum] = _scan("cumsum")
FAST[torch.cumprod] = FAST[torch.Tensor.cumprod] = _scan("cumprod")


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if not (isinstance(query, MJT) and isinstance(key, MJT) and isinstance(value, MJT)):
        return NotImplemented
    if len(query._size) - 2 not in query._ragged_dims:
        return NotImplemented  # attention inside packed rows: the general path's dense kernel
    q, k, v, mask, seed, causal, scale, p = _att._scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, values_path=True
    )
    sk = _standin(k) if k is not q else None
    sv = _standin(v) if v is not k else None
    sq = _standin(q)
    sk = sq if sk is None else sk
    sv = sk if sv is None else sv
    sm = _standin(mask) if isinstance(mask, MJT) else mask
    out, _ = _att.sdpa_default(torch.ops.multijagged.sdpa.default, sq, sk, sv, sm, seed, causal, scale, p,
                               need_lse=False, differentiable=True)
    return _finish(out)


FAST[F.scaled_dot_product_attention] = _sdpa


# --------------------------------------------------------------------------- metadata
# Read by every module (``x.shape[-1]``) and by dynamo's guards on each call of a compiled
# function (``x.size()[1] != 1``): answered from the stored logical size.
def _size(self, dim=None):
    if not isinstance(self, MJT):
        return NotImplemented
    if dim is None:
        return torch.Size(self._size)
    if not isinstance(dim, int):
        return NotImplemented  # a dim name: the general path raises as dense torch does
    n = len(self._size)
    if not -n <= dim < n:
        return NotImplemented
    s = self._size[dim]
    if type(s) is not int:  # a ragged size: NOTE [ Recurrent layers given the other time layout ]
        _leading.refuse_recurrent_batch_read(self)
    return s


def _shape(self):
    return torch.Size(self._size) if isinstance(self, MJT) else NotImplemented


def _dim(self):
    return len(self._size) if isinstance(self, MJT) else NotImplemented


FAST[torch.Tensor.size] = _size
FAST[torch.Tensor.shape.__get__] = _shape
FAST[torch.Tensor.dim] = FAST[torch.Tensor.ndim.__get__] = FAST[torch.Tensor.ndimension] = _dim
