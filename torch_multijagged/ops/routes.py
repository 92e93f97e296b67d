"""``__torch_function__`` routes: composite ops whose decomposition would reshape across ragged
dims, or whose aten derivative cannot handle ragged sizes, are sent to ops that reach
``__torch_dispatch__`` intact. A route only *routes*: it checks its arguments and forwards them
to other torch functions (``multijagged::`` and aten ops) or, eagerly, to a computation on the
packed values in ``bridged.py`` (NOTE [ Bridged computations ]); it never touches packed values
itself. Returning ``NotImplemented`` falls back to the ordinary call.

See NOTE [ Subclass mechanism ] in ``tensor.py``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..bridge import relabel
from ..compile import library  # noqa: F401
from ..errors import StructureError
from ..structure import _is_traced, partition_for, same_extent
from . import bridged
from .pair_mm import pair_product
from . import dispatch as _dispatch
from ._common import MJT, canonical_dim, describe

mj = torch.ops.multijagged

ROUTES: dict[Any, Callable[..., Any]] = {}


def route(*funcs):
    def wrapper(fn):
        for f in funcs:
            ROUTES[f] = fn
        return fn

    return wrapper


def unify_extents(args: tuple, keep_first: bool = False) -> tuple:
    """NOTE [ Equal sizes, different nested ints ]

    Two tensors built separately from equal lengths have different nested ints (as in
    torch.jagged), yet this layout lets them combine (README, Compatibility). The autograd engine, however, checks each
    gradient's shape against its input's, nested ints included: ``(B, j1, C)`` may not receive a
    ``(B, j0, C)`` gradient. So before an op sees them, operands are relabelled onto the first
    operand's extent *at the same logical dim* with a differentiable, zero-copy ``relabel``
    whose backward restores their own. Extents at different dims are left alone: ``x (B, j0, 1)
    * y (B, 1, j1)`` stays rectangular ``(B, j0, j1)`` even when the lengths are equal. Tensors
    inside a list argument (``cat``, ``stack``) are unified too. Eager only: under tracing
    extents are compared by identity.

    The rule: a relabelled operand is a *new* tensor standing in for the user's, so relabelling
    is only right where the op merely *reads* its operands to compute a new tensor. It never
    replaces a tensor that is held by identity (``relabel_policy``):

    * the autograd API (``torch.autograd.grad`` / ``backward``, ``Tensor.backward``): its
      ``inputs`` are the leaves whose gradients are asked for — a relabelled stand-in is not in
      the graph, so its gradient would be ``None`` (and ``.grad`` would land on the stand-in).
      Only its cotangents (``grad_outputs``, ``gradient``) are relabelled, pairwise onto their
      outputs (``_unify_cotangents``);
    * the written argument of an in-place op (``self`` of ``add_``, the first list of a
      ``_foreach_*_``) and ``out=``: the write must reach the user's tensor;
    * ``torch.ops`` calls (``multijagged::*``, ``aten::*``): these are made by our routes (whose
      operands were unified at the user's call) and by backward formulas, whose tensor arguments
      are structure templates — ``reduce_backward(grad (B, j1, C), x (B, j0, j1, C), …)`` must
      not turn ``x`` into ``(B, j1, j1, C)`` when the lengths agree.

    Everything else relabels: the op reads the stand-in, whose gradient flows back to the
    user's tensor. Attribute setters too: ``x.grad = g`` (torch checks the size, nested ints
    included) stores a stand-in for ``g`` that shares its values, so in-place updates reach both.
    """
    first = None
    out = None
    for i, a in enumerate(args):
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], MJT):
            if not (keep_first and i == 0):
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
        out[i] = relabel(a, mapping)
    return args if out is None else tuple(out)


# Functions whose tensor arguments are held by identity (see the NOTE above).
_HELD = {torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward}
NEVER, OPERANDS, INPLACE = 0, 1, 2
_POLICY: dict = {}


def relabel_policy(func) -> int:
    """``NEVER``, ``OPERANDS`` (relabel every operand after the first) or ``INPLACE`` (also
    keep the written first argument as it is); cached per function."""
    try:
        hit = _POLICY.get(func)
        held = func in _HELD
    except TypeError:  # an unhashable callable: decide every time
        hit, held = None, False
    if hit is not None:
        return hit
    name = getattr(func, "__name__", "")
    if held or isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        policy = NEVER
    elif name.endswith("_") and not name.endswith("__"):
        policy = INPLACE
    else:
        policy = OPERANDS
    try:
        _POLICY[func] = policy
    except TypeError:
        pass
    return policy


_COTANGENT = {torch.autograd.grad: "grad_outputs", torch.autograd.backward: "grad_tensors", torch.Tensor.backward: "gradient"}


def _unify_cotangents(func, args: tuple, kwargs: dict) -> dict:
    """The autograd API's cotangents (``grad_outputs``, ``gradient``) relabelled pairwise onto
    their outputs, which the engine requires to match in shape, nested ints included; the
    ``inputs`` stay the user's tensors."""
    name = _COTANGENT[func]
    grads = kwargs.get(name)
    if grads is None or not args:
        return kwargs
    single = isinstance(grads, torch.Tensor)
    outs = (args[0],) if isinstance(args[0], torch.Tensor) else tuple(args[0])
    gs = (grads,) if single else tuple(grads)
    new = tuple(unify_extents((o, g))[1] if isinstance(o, MJT) and isinstance(g, MJT) else g for o, g in zip(outs, gs))
    new = new + gs[len(new):]
    if all(a is b for a, b in zip(new, gs)):
        return kwargs
    return {**kwargs, name: new[0] if single else new}


def unify_call(func, args: tuple, kwargs: dict | None):
    """``(args, kwargs)`` of a ``__torch_function__`` call with operands unified as the NOTE
    [ Equal sizes, different nested ints ] allows; ``out=`` is never relabelled."""
    policy = relabel_policy(func)
    if policy == NEVER:
        if func in _HELD and kwargs:
            kwargs = _unify_cotangents(func, args, kwargs)
        return args, kwargs
    keep_first = policy == INPLACE
    if kwargs and any(isinstance(v, MJT) or (isinstance(v, (list, tuple)) and v and isinstance(v[0], MJT))
                      for k, v in kwargs.items() if k != "out"):
        names = [k for k in kwargs if k != "out"]
        unified = unify_extents((*args, *(kwargs[k] for k in names)), keep_first)
        kwargs = {**kwargs, **dict(zip(names, unified[len(args):]))}
        return unified[: len(args)], kwargs
    if len(args) > 1:
        args = unify_extents(args, keep_first)
    return args, kwargs


def _relabel_map(first: MJT, other: MJT):
    """``other``'s partition with each extent replaced by ``first``'s extent at the same logical
    dim when the two are equal-sized but not identical (None when nothing changes)."""
    if torch.compiler.is_compiling() or _is_traced(other._partition.offsets):
        # Traced extents are one extent only when provably one nested int: nothing to relabel.
        return None
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


def _autocast_lower(*ts):
    """Under autocast, the cast that dense autocast gives matmul and linear (its lower-precision
    list: float32/float16/bfloat16 tensors to the autocast dtype, float64 kept). Autocast does not
    reach the computations below: the ``multijagged::`` ops are not on its list and the broadcast
    product of ``_matmul`` is a mul and a sum."""
    dt = torch.get_autocast_dtype(next(t for t in ts if isinstance(t, torch.Tensor)).device.type)
    return tuple(
        t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t for t in ts
    )


@route(F.linear, torch._C._nn.linear)
def _linear(input, weight, bias=None):
    if isinstance(input, MJT) and _dense(weight) and (bias is None or _dense(bias)):
        if torch.is_autocast_enabled(input.device.type):
            input, weight, bias = _autocast_lower(input, weight, bias)
        if torch.compiler.is_compiling() or not _needs_grad(input, weight, bias):
            return _call(mj.linear.default, input, weight, bias)
        # Eagerly, with gradients, the values bridge lets the dense linear run under torch's own (C++) autograd:
        # cheaper than torch.library's Python autograd wrapper, on the op that dominates models.
        # Dynamo cannot trace the bridge (it reads the subclass's attributes), hence the op above.
        return bridged.linear(input, weight, bias)
    return NotImplemented


@route(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul(input, other, *, out=None):
    if out is not None or input.dim() < 3 or other.dim() < 2:
        return NotImplemented
    if torch.is_autocast_enabled(input.device.type):
        input, other = _autocast_lower(input, other)
    if isinstance(input, MJT) and _dense(other) and other.dim() == 2:
        return _call(mj.linear.default, input, other.t(), None)
    if isinstance(input, MJT) != isinstance(other, MJT) and input.dim() == other.dim():
        # A dense per-sample operand (B, …): bmm's handler (ops/indexing.py, NOTE [ Batched matmul
        # with a dense per-sample operand ]); a dense batch of 1 broadcasts, as in dense matmul.
        if input.dim() > 3:
            mjt = input if isinstance(input, MJT) else other
            raise NotImplementedError(
                f"matmul(): {describe(input)} @ {describe(other)}: a dense per-sample operand of more than 3 dims "
                f"is not supported for layout torch.multi_jagged (batched matmul takes (B, j, D) @ (B, D, E) and "
                f"(B, F, E) @ (B, E, j)); got a multi_jagged operand with ragged dims {mjt._ragged_dims}"
            )
        b = (input if isinstance(input, MJT) else other)._partition.batch
        if _dense(input) and input.shape[0] == 1 and b != 1:
            input = input.expand(b, -1, -1)
        if _dense(other) and other.shape[0] == 1 and b != 1:
            other = other.expand(b, -1, -1)
        return torch.bmm(input, other)
    if isinstance(input, MJT) and isinstance(other, MJT) and input.dim() == other.dim():
        # Square pairs contracting a ragged dim: per-sample products (NOTE [ Contracting a ragged
        # dim ] in ops/pair_mm.py)
        lead = "abcdefgh"[: input.dim() - 2]
        product = pair_product([lead + "ik", lead + "kj"], [input, other], lead + "ij")
        if product is not None:
            return product
        # Batched matmul whose row, column or contracted dims may be ragged (attention:
        # (B, j0, C) @ (B, C, j0) → (B, j0, j0); (B, j0, j0) @ (B, j0, C) → (B, j0, C)), as the
        # broadcast product summed over the contracted dim. Eagerly this materialises
        # (…, n, k, m); compiled, Inductor fuses the gather, product and sum.
        return (input.unsqueeze(-1) * other.unsqueeze(-3)).sum(-2)
    return NotImplemented


def _reduced_dims(input, dim) -> list[int]:
    """Canonical, sorted dims of a reduction of ``input`` over ``dim`` (every dim for None / ())."""
    if dim is None:
        return list(range(input.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(input.dim()))
    return sorted({canonical_dim("reduce", input.dim(), d) for d in dims})


def _touches_ragged(input, dim) -> list[int] | None:
    """Canonical dims when a reduction of ``input`` over ``dim`` involves a ragged or the batch
    dim (so aten's derivative cannot run on it), else None."""
    if not isinstance(input, MJT):
        return None
    canon = _reduced_dims(input, dim)
    if 0 in canon or any(d in input._ragged_dims for d in canon):
        return canon
    return None


def _reduce(input, kind, dims, keepdim):
    return _call(mj.reduce.default, input, kind, dims, keepdim)


def _reduction_route(kind: str, static_too: bool = False):
    """``static_too``: route reductions over static dims as well (``prod``: aten's
    ``prod_backward`` builds tensors of the input's nested-int sizes; ``amax``: below)."""

    def routed(input, dim=None, keepdim=False, *, dtype=None):
        if static_too and isinstance(input, MJT):
            dims = _reduced_dims(input, dim)
        else:
            dims = _touches_ragged(input, dim)
        if dims is None:
            return NotImplemented
        if dtype is not None:
            input = input.to(dtype)
        out = _reduce(input, kind, None if dim is None else dims, keepdim)
        # reduce() accumulates integers in int64 (as dense torch without dtype=); an explicit
        # integer dtype= wraps as dense torch does, which the cast reproduces exactly (sums and
        # products agree modulo 2^bits)
        return out if dtype is None or out.dtype == dtype else out.to(dtype)

    return routed


route(torch.sum, torch.Tensor.sum)(_reduction_route("sum"))
route(torch.mean, torch.Tensor.mean)(_reduction_route("mean"))
route(torch.prod, torch.Tensor.prod)(_reduction_route("prod", static_too=True))
route(torch.logsumexp, torch.Tensor.logsumexp)(_reduction_route("logsumexp"))
# amax/amin over static dims too: aten's amax_backward views a gradient whose values may be an
# expanded (stride-0) buffer, which the view handler refuses
route(torch.amax, torch.Tensor.amax)(_reduction_route("amax", static_too=True))
route(torch.amin, torch.Tensor.amin)(_reduction_route("amin", static_too=True))


def _max_min(is_max: bool):
    kind = "amax" if is_max else "amin"

    def routed(input, dim=None, keepdim=False, *args, **kwargs):
        if not isinstance(input, MJT) or not isinstance(dim, int) or args or kwargs:
            return NotImplemented
        if _touches_ragged(input, dim) is None:
            return NotImplemented  # static dim: aten.max.dim, whose backward scatters to the index
        src = input.detach()
        indices = (torch.argmax if is_max else torch.argmin)(src if src.dtype != torch.bool else src.to(torch.uint8), dim, keepdim)
        values = _reduce(src if _needs_grad(input) else input, kind, [dim], keepdim)
        if _needs_grad(input):
            values = _selected(input, values, indices, dim, keepdim)
        return torch.return_types.max((values, indices)) if is_max else torch.return_types.min((values, indices))

    return routed


def _selected(input, values, indices, dim, keepdim):
    """``values`` (max/min over ``dim``, detached) made differentiable as dense ``max(dim)`` is:
    the whole gradient goes to the element at ``indices`` (``amax`` would share it among ties).
    The picked element is summed out of a one-hot mask, which is exact (x + 0 = x); an empty
    extent picks nothing (sum 0) and keeps the amax rule's value."""
    hit = torch.zeros_like(input, dtype=torch.bool).scatter(dim, indices if keepdim else indices.unsqueeze(dim), True)
    picked = _reduce(torch.where(hit, input, torch.zeros_like(input)), "sum", [dim], keepdim)
    p = picked.detach()
    return torch.where((p == values) | p.isnan(), picked, values)


route(torch.max, torch.Tensor.max)(_max_min(True))
route(torch.min, torch.Tensor.min)(_max_min(False))


class _NanIfUsed(torch.autograd.Function):
    """``t / 0`` forward (inf, or nan where t is 0 or nan: dense var's value when
    n - correction <= 0); backward nan where the incoming gradient is non-zero, else 0."""

    @staticmethod
    def forward(ctx, t):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        return t / torch.zeros_like(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None
        return torch.where(grad != 0, torch.full_like(grad, float("nan")), torch.zeros_like(grad))


def _safe_root(t, p=2):
    """``t ** (1/p)`` whose gradient is 0 (not nan) where t == 0, as dense std / norm backward
    give; nan stays nan."""
    zero = t == 0
    safe = torch.where(zero, torch.ones_like(t), t)
    return torch.where(zero, torch.zeros_like(t), safe.sqrt() if p == 2 else safe.pow(1.0 / p))


def _var_std(sqrt: bool):
    def routed(input, dim=None, *args, correction=None, keepdim=False, unbiased=None):
        # torch.var(x, dim, unbiased, keepdim), torch.var(x, dim, *, correction, keepdim) and
        # x.var(unbiased)
        if not isinstance(input, MJT):
            return NotImplemented
        if isinstance(dim, bool) and not args:
            dim, unbiased = None, dim
        if args:
            if isinstance(args[0], bool) and unbiased is None and len(args) <= 2:
                unbiased = args[0]
                keepdim = args[1] if len(args) > 1 else keepdim
            else:
                return NotImplemented
        if not (input.dtype.is_floating_point or input.dtype.is_complex):
            raise RuntimeError(f"{'std' if sqrt else 'var'}(): std and var only support floating point and complex dtypes")
        # Static dims too: aten's var/std have no handler, and this composite of routed ops is
        # correct over any dims (its gradient needs no formula of its own).
        dims = _reduced_dims(input, dim)
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        d = None if dim is None else dims
        # The mean gathered back to the input's rows rather than broadcast: a dense (B, 1, …)
        # mean would broadcast over the batch, and the double backward of that broadcast expands
        # a dense tensor to nested-int sizes (NOTE [ Double backward ] in compile/library.py).
        mean = _reduce(input, "mean", d, True)
        centred = input - _call(mj.reduce_backward.default, mean, input.detach(), mean.detach(), "sum", d, True)
        denom = _reduce(torch.ones_like(input).detach(), "sum", d, keepdim) - correction
        ok = denom > 0
        # Where n - correction <= 0 the result is Σ/0 (inf, nan for no spread), as dense torch gives; its gradient is nan
        # when the result is used, and 0 when it is not (dense torch then never runs its
        # backward). A plain division would put 0/0 into every sample's gradient.
        total = _reduce(centred * centred, "sum", d, keepdim)
        var = torch.where(ok, total / torch.where(ok, denom, torch.ones_like(denom)), _NanIfUsed.apply(total))
        if not sqrt:
            return var
        # Where var is nan (n <= correction) std is that nan itself: the root's derivative there
        # (nan) would reach a double backward as 0 · nan for a sample with no elements.
        return torch.where(ok, _safe_root(torch.where(ok, var, torch.ones_like(var))), var)

    return routed


route(torch.var, torch.Tensor.var)(_var_std(False))
route(torch.std, torch.Tensor.std)(_var_std(True))


@route(torch.linalg.vector_norm)
def _vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None):
    """Over any dims (static ones too: aten's ``linalg_vector_norm`` has no handler).

    NOTE [ Norm of an empty extent ]: dense torch raises for the ±inf and negative norms of an
    empty vector (no identity). Per sample we define them instead of failing the batch: an empty
    extent has norm 0 for every ``ord >= 0`` and for ``inf`` (the largest of no magnitudes,
    which are all >= 0), and ``inf`` for ``-inf`` and ``ord < 0`` (the smallest of no magnitudes;
    the limit ``(Σ∅ |x|^p)^(1/p) = 0^(1/p)``)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        got = str(input.dtype).replace("torch.", "").capitalize()
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {got}")
    dims = _reduced_dims(input, dim)
    if dtype is not None:
        input = input.to(dtype)
    d = None if dim is None else dims
    a = input.abs()
    if ord == float("inf"):
        # amax over an empty extent is the dtype's lowest value; the norm is 0 there
        return _reduce(a, "amax", d, keepdim).clamp_min(0)
    if ord == -float("inf"):
        m = _reduce(a, "amin", d, keepdim)
        empty = _reduce(torch.ones_like(a, dtype=torch.bool).detach(), "sum", d, keepdim) == 0
        return torch.where(empty, torch.full_like(m, float("inf")).detach(), m)
    if ord == 0:
        return _reduce((a != 0).to(a.dtype), "sum", d, keepdim)
    if ord == 1:
        return _reduce(a, "sum", d, keepdim)
    if ord == 2:
        return _safe_root(_reduce(input * input, "sum", d, keepdim))
    if ord < 0:
        return _reduce(a.pow(ord), "sum", d, keepdim).pow(1.0 / ord)  # Σ = 0 (empty) → inf
    return _safe_root(_reduce(a.pow(ord), "sum", d, keepdim), ord)


@route(torch.norm, torch.Tensor.norm)
def _norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if p == "fro":
        p = 2
    if not isinstance(p, (int, float)) or out is not None:
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
    if isinstance(input, MJT) and isinstance(index, (tuple, slice, type(Ellipsis), type(None))):
        return _getitem_static(input, index if isinstance(index, tuple) else (index,))
    return NotImplemented


def _getitem_static(input, items):
    """``x[:, :, 0]``, ``x[..., 1:3]``, ``x[:, None]``: full slices over the batch and ragged dims
    and basic indexing of static dims, as the ops that express it (``select``, ``slice``,
    ``unsqueeze``). Python's own indexing would compare slice bounds with the nested ints
    ("relation is indeterminate")."""
    if items and isinstance(items[0], int) and not isinstance(items[0], bool):
        return _getitem(input, items[0])[items[1:]]  # a sample, then dense indexing
    if any(isinstance(i, type(Ellipsis)) for i in items):
        at = next(k for k, i in enumerate(items) if isinstance(i, type(Ellipsis)))
        real = sum(1 for i in items if i is not None and not isinstance(i, type(Ellipsis)))
        items = items[:at] + (slice(None),) * (input.dim() - real) + items[at + 1:]
    out, d = input, 0
    for it in items:
        if it is None:
            out, d = out.unsqueeze(d), d + 1
        elif isinstance(it, slice) and it == slice(None):
            d += 1
        elif d == 0 or d in out._ragged_dims:
            op = "select" if isinstance(it, int) else "slice"
            raise StructureError(
                f"{op}(): expected a static dim of {describe(out)}, got dim {d} (batch or ragged); index it "
                "with a full slice ':' (select samples with x[i] or unbind())"
            )
        elif isinstance(it, bool) or not isinstance(it, (int, slice)):
            return NotImplemented
        elif isinstance(it, int):
            out = out.select(d, it)
        else:
            start, stop, step = it.indices(out.shape[d])
            out, d = torch.ops.aten.slice.Tensor(out, d, start, stop, step), d + 1
    return out


@route(torch.select, torch.Tensor.select)
def _select(input, dim, index):
    if isinstance(input, MJT) and isinstance(dim, int) and canonical_dim("select", input.dim(), dim) == 0:
        return _getitem(input, index)
    return NotImplemented


@route(F.group_norm)
def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """To the values (``bridged.group_norm``) when the only ragged dim is dim 1: its decomposition
    would reshape across the ragged dim."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input._ragged_dims and 1 not in input._ragged_dims and len(input._size) >= 3:
        from . import image_nn  # channels first with ragged spatial dims (B, C, j0, j1)

        return image_nn.group_norm(input, num_groups, weight, bias, eps)
    if input._ragged_dims != (1,):
        raise ValueError(
            f"group_norm(): expected components (n, C, *) with only dim 1 ragged, got ragged dims "
            f"{input._ragged_dims} for layout torch.multi_jagged"
        )
    return bridged.group_norm(input, num_groups, weight, bias, eps)


def _conv_route(fn, nspatial: int):
    name = fn.__name__

    def routed(input, weight, bias=None, *args, **kwargs):
        """To the values (``bridged.conv``) when components are ``(n, C, *spatial)`` with only dim
        1 ragged; aten's conv asks for concrete sizes, which a ragged dim has not."""
        if not isinstance(input, MJT) or isinstance(weight, MJT) or isinstance(bias, MJT):
            return NotImplemented
        if nspatial < 3 and len(input._size) == nspatial + 2 and (input._ragged_dims == (1,) or max(input._ragged_dims) >= 2):
            from . import spatial  # ragged spatial dims: one dense conv over a canvas of the images

            return spatial.conv(name, nspatial, input, weight, bias, *args, **kwargs)
        if input._ragged_dims != (1,) or len(input._size) != nspatial + 3:
            raise StructureError(
                f"{name}(): expected components (n, C, {', '.join('L' * nspatial)}) with only dim 1 ragged "
                f"(the conv's batch), got {describe(input)} with ragged dims {input._ragged_dims} for "
                "layout torch.multi_jagged; conv1d and conv2d also take ragged spatial dims (B, C, j0[, j1])"
            )
        return bridged.conv(fn, input, weight, bias, *args, **kwargs)

    return routed


for _fn, _n in ((F.conv1d, 1), (F.conv2d, 2), (F.conv3d, 3)):
    route(_fn)(_conv_route(_fn, _n))


def _static_dim(op: str, input, dim) -> int:
    d = canonical_dim(op, input.dim(), dim)
    if d == 0 or d in input._ragged_dims:
        raise StructureError(f"{op}(): expected a static dim of a multi_jagged tensor, got dim {dim} (batch or ragged)")
    return d


@route(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(input, dim=None):
    """``squeeze()`` drops static size-1 dims only; aten's backward for it would unsqueeze every
    size-1 dim, the batch dim (B = 1) included, so name the dims."""
    if not isinstance(input, MJT) or dim is not None:
        return NotImplemented
    dims = [d for d in range(1, input.dim()) if d not in input._ragged_dims and input.shape[d] == 1]
    return torch.squeeze(input, dims) if dims else input.view(input.shape)


class _AbsReal(torch.autograd.Function):
    """``abs`` with the derivative ``grad · sgn(x)`` taken on a detached x. aten's formula
    records ``x.sgn()``, whose own derivative (``sgn_backward``, reached under
    ``create_graph=True``) builds a zero tensor from the input's concrete sizes, which a
    multi_jagged tensor does not have. sgn is piecewise constant, so detaching it loses nothing."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        ctx.save_for_backward(x)
        return x.abs()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None
        (x,) = ctx.saved_tensors
        return grad * x.detach().sgn()


class _SgnReal(torch.autograd.Function):
    """``sgn`` of a real tensor: derivative 0 (see ``_AbsReal`` for why not aten's formula)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        return x.sgn()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return None if grad is None else torch.zeros_like(grad)


def _sgn_route(fn):
    def routed(input):
        if (
            not isinstance(input, MJT)
            or not input.dtype.is_floating_point
            or torch.compiler.is_compiling()
            or not _needs_grad(input)
        ):
            return NotImplemented
        return fn.apply(input)

    return routed


route(torch.abs, torch.Tensor.abs, torch.absolute, torch.Tensor.absolute)(_sgn_route(_AbsReal))
route(torch.sgn, torch.Tensor.sgn)(_sgn_route(_SgnReal))


@route(F.softsign)
def _softsign(input):
    # F.softsign's body would call abs with the router off (aten's formula, see _AbsReal)
    return input / (input.abs() + 1) if isinstance(input, MJT) else NotImplemented


_CONCRETE_SIZES = "SymIntArrayRef expected to contain only concrete integers"


def _autograd_entry(fn):
    """``torch.autograd.grad`` / ``backward`` with a multi_jagged argument, unchanged except that
    aten's bare "concrete integers" error — raised inside the C++ engine, where no handler can
    intercept the op — becomes a ``NotImplementedError`` (a ``RuntimeError``) that says what
    causes it (README, Gradients)."""
    name = fn.__name__

    def routed(*args, **kwargs):
        try:
            with torch._C.DisableTorchFunctionSubclass():
                return fn(*args, **kwargs)
        except RuntimeError as e:
            if _CONCRETE_SIZES not in str(e):
                raise
            raise NotImplementedError(
                f"{name}(): the autograd engine asked for concrete sizes of a gradient whose shape holds "
                "nested ints (layout torch.multi_jagged). The known cause is a double backward "
                "(create_graph=True) through a dense operand that requires grad and broadcasts over ragged "
                "dims, such as x * w with w of shape (C,) or x - x.mean(1, keepdim=True): the engine "
                "un-broadcasts its gradient with a sum whose own derivative expands a dense tensor to "
                "nested-int sizes. This is not supported."
            ) from e

    return routed


route(torch.autograd.grad)(_autograd_entry(torch.autograd.grad))
route(torch.autograd.backward)(_autograd_entry(torch.autograd.backward))
route(torch.Tensor.backward)(_autograd_entry(torch.Tensor.backward))


# The shape family (reshape / flatten / unflatten, split, einsum) registers its routes here.
from . import shape_routes  # noqa: E402,F401


@route(torch.Tensor.numel, torch.numel, torch.Tensor.nelement)
def _numel(input):
    """The packed element count (no padding is stored): rows × the static sizes. The wrapper's
    C++ numel would multiply nested ints."""
    if not isinstance(input, MJT):
        return NotImplemented
    n = input._partition.rows
    for d, s in enumerate(input._size):
        if d and d not in input._ragged_dims:
            n = n * s
    return n
