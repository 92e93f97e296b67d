"""The route registry: ``__torch_function__`` routes, the mechanism every family's routes use.

NOTE [ Routes ]

Composite ops whose decomposition would reshape across ragged dims, or whose aten derivative
cannot handle ragged sizes, are sent to ops that reach ``__torch_dispatch__`` intact. A route only
*routes*: it checks its arguments and forwards them to other torch functions (``multijagged::``
and aten ops) or, eagerly, to a computation on the packed values in ``bridged.py`` (NOTE
[ Bridged computations ]); it never touches packed values itself. Returning ``NotImplemented``
falls back to the ordinary call. ``@route(torch.fn, torch.Tensor.fn)`` files a route; each family
keeps its routes next to its handlers (CONTRIBUTING.md, "Where does X live").

This module also holds what routes share: operand unification (NOTE [ Equal sizes, different
nested ints ]), ``_call`` (a ``multijagged::`` op without torch.library's autograd wrapper when
nothing needs a gradient), and the routes of the autograd API itself.

See NOTE [ Subclass mechanism ] in ``tensor.py``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from ..bridge import assume_relabel, dense_as_ragged, expand_ragged, ragged_as_static, relabel, static_as_ragged
from ..compile import library  # noqa: F401  (defines the multijagged:: ops that routes call)
from ..errors import StructureError
from ..structure import (_factors, _is_traced, broadcast_extent, extent_of, flat_extent, mapped_from, partition_for,
                         same_extent)
from ._common import MJT, canonical_dim
from ._table import dispatch as _dispatch

mj = torch.ops.multijagged

ROUTES: dict[Any, Callable[..., Any]] = {}


def route(*funcs, sequence: str | None = None):
    """Decorator: ``fn`` is the route of every torch function in ``funcs`` (NOTE [ Routes ]).

    ``sequence``: the keyword under which torch also takes the sequence that ``fn`` takes as
    ``*args`` (``x.flip(dims=[1])``, ``x.view(size=…)``). NOTE [ Route arguments ]."""

    def wrapper(fn):
        fn = _keywords_as_torch(fn, getattr(funcs[0], "__name__", "op").strip("_"), sequence)
        for f in funcs:
            ROUTES[f] = fn
        return fn

    return wrapper


# NOTE [ Route arguments ]
#
# A route is called with the arguments the user gave the torch function, keywords as torch names
# them. Two kinds of keyword reach a route that its own parameters may not name, and would make
# it fail with Python's "unexpected keyword argument", naming the route instead of the op:
#
# * the sequence a method also takes as ``*args`` (``x.flip(1, 2)`` and ``x.flip(dims=(1, 2))``,
#   ``x.view(3, 4)`` and ``x.view(size=(3, 4))``): ``route(…, sequence="dims")`` passes it to
#   the route as its single positional sequence, as torch binds it (both given: dense's
#   "multiple values" ``TypeError``);
# * ``out=``, which this layout does not take (pointwise ops refuse it in the op table): a route
#   without an ``out`` parameter refuses it with the same ``NotImplementedError``.
#
# A route taking ``**kwargs`` sees every keyword and answers for them itself.
def _keywords_as_torch(fn, name: str, sequence: str | None):
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn
    takes_out = any(p.name == "out" for p in params)
    if takes_out and sequence is None:
        return fn

    @functools.wraps(fn)
    def routed(*args, **kwargs):
        if not kwargs:  # the common call: one call level more
            return fn(*args)
        if not takes_out and kwargs.get("out") is not None:
            raise NotImplementedError(f"{name}(): out= variants are not supported for layout torch.multi_jagged")
        if not takes_out:
            kwargs.pop("out", None)
        if sequence is not None and sequence in kwargs:
            if len(args) > 1:
                raise TypeError(f"{name}() got multiple values for argument '{sequence}'")
            args = (*args, kwargs.pop(sequence))
        return fn(*args, **kwargs)

    return routed



def in_place_route(name: str, dense_self: bool = False):
    """The route of ``x.<op>_(…)`` (``name``) as ``x.copy_(x.<op>(…))``: the out-of-place op takes
    every form (along ragged dims per sample, dense or multi_jagged indices), and ``copy_`` writes
    it in place with gradients, as the dense in-place op. ``dense_self``: a dense ``x`` too (a
    multi_jagged operand brought the call here), where the out-of-place op takes one."""
    out_of_place = getattr(torch.Tensor, name[:-1])

    def routed(input, *args, **kwargs):
        if not (isinstance(input, MJT) or (dense_self and isinstance(input, torch.Tensor))):
            return NotImplemented
        # the op reads a clone when autograd records: what it saves must not be the tensor written
        src = input.clone() if torch.is_grad_enabled() and input.requires_grad else input
        return input.copy_(castable(out_of_place(src, *args, **kwargs), input.dtype))

    return routed

def castable(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``result``, whose dtype an in-place op or ``out=`` of ``dtype`` may take (dense's rule: no
    float into an integer, no complex into a real, nothing but bool into a bool); else dense's error."""
    if not torch.can_cast(result.dtype, dtype):
        raise RuntimeError(f"result type {_scalar_name(result.dtype)} can't be cast to the desired output type "
                           f"{_scalar_name(dtype)}")
    return result


def _scalar_name(dtype: torch.dtype) -> str:
    """The name torch's messages give a dtype (``Float``, ``Long``, ``ComplexFloat``)."""
    return torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1].removesuffix("Tensor")


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


def unify_shape(x: MJT, shape) -> MJT:
    """``x`` relabelled onto the nested ints of a ``view`` / ``reshape`` ``shape`` that are not
    ``x``'s own but have the per-sample sizes of one of its extents (NOTE [ Equal sizes, different
    nested ints ]: ``y.reshape(B, N, C)`` with ``N = x.shape[1]`` and ``y`` built apart from ``x``'s
    lengths), so the result has the shape asked for; ``x`` itself where nothing is relabelled, where
    an extent of ``x`` could take several of them, and under tracing (identity alone there)."""
    own = [x._size[d] for d in x._ragged_dims]
    named = [s for s in shape if isinstance(s, torch.SymInt) and not any(s is n for n in own)]
    if not named or torch.compiler.is_compiling() or _is_traced(x._partition.offsets):
        return x
    extents = x._partition.extents
    wanted = [e for e in (extent_of(s) for s in named) if e is not None and all(e is not f for f in extents)
              and not _derived_from(e, extents)]
    # an extent the shape also names by its own nested int keeps it (a square pair's two dims
    # named apart: relabelling both would make the other name foreign in turn)
    kept = {id(e) for d, e in zip(x._ragged_dims, extents) if any(s is x._size[d] for s in shape)}
    swap = {}
    for w in wanted:
        fits = [e for e in extents if id(e) not in swap and id(e) not in kept and same_extent(e, w)]
        if len({id(e) for e in fits}) == 1:
            swap[id(fits[0])] = w
    if not swap:
        swap = _product_swap(extents, wanted, kept)
    if not swap:
        return x
    return relabel(x, partition_for([swap.get(id(e), e) for e in extents]))


def _derived_from(w, extents) -> bool:
    """Whether the named extent ``w`` is a factor of one of ``extents`` (``H`` of the flattened
    ``H * W``), mapped from one (``n // 2``) or one's source (``n`` of ``n // 2``): the shape then
    unflattens or regroups ``x``'s dims, and sizes that happen to be equal (images one pixel high,
    samples all empty) are no relabelling."""
    return (any(w is f for e in extents for f in _factors(e)) or mapped_from(w, extents)
            or any(mapped_from(e, [w]) for e in extents))


def _product_swap(extents, wanted: list, kept: set) -> dict:
    """Relabellings of ``x``'s extents (``unify_shape``) where the shape flattens or unflattens
    them: ``x``'s dims onto the factors of a named nested int flattened from dims of equal sizes
    (``x.view_as(y.flatten(2))``), or ``x``'s flattened dim onto the flattening of named nested
    ints of its factors' sizes, in order (``x.flatten(2).view_as(y)``)."""
    swap: dict = {}
    for w in wanted:
        fs = _factors(w)
        if len(fs) < 2:
            continue
        pick: dict = {}  # id(factor) -> (an extent of x, the factor); a square pair's one factor once
        for f in fs:
            if id(f) not in pick:
                taken = [p[0] for p in pick.values()]
                e = next((e for e in extents if id(e) not in kept and id(e) not in swap and same_extent(e, f)
                          and all(e is not t for t in taken)), None)
                if e is None:
                    break
                pick[id(f)] = (e, f)
        else:
            swap.update((id(e), f) for e, f in pick.values())
    for e in extents:
        fs = _factors(e)
        if len(fs) < 2 or id(e) in kept or id(e) in swap:
            continue
        for i in range(len(wanted) - len(fs) + 1):
            run = wanted[i:i + len(fs)]
            if all(same_extent(f, w) for f, w in zip(fs, run)):
                swap[id(e)] = flat_extent(partition_for(run))
                break
    return {k: v for k, v in swap.items() if all(e is not v for e in extents)}


# Functions whose tensor arguments are held by identity (see the NOTE above).
_HELD = {torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward}
# Functions that read only the other operand's shape, whose nested ints the result takes, as
# ``x.view(y.shape)`` does (``unify_shape``): the other operand is not relabelled onto ``x``.
_SHAPE_OF_OTHER = {torch.Tensor.view_as, torch.Tensor.reshape_as}
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
    elif func in _SHAPE_OF_OTHER:
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
    if func in _INDEX_ALIGNED:
        args, kwargs = _assume_index_aligned(func, args, kwargs or {})
    policy = relabel_policy(func)
    if policy == NEVER:
        if func in _HELD and kwargs:
            kwargs = _unify_cotangents(func, args, kwargs)
        return args, kwargs
    keep_first = policy == INPLACE
    sized = func in SIZED
    if kwargs and any(isinstance(v, MJT) or (sized and _dense(v) and _reaches_ragged(args, v))
                      or (isinstance(v, (list, tuple)) and v and isinstance(v[0], MJT))
                      for k, v in kwargs.items() if k != "out"):
        names = [k for k in kwargs if k != "out"]
        unified = unify_extents((*args, *(kwargs[k] for k in names)), keep_first)
        if sized:  # ``torch.clamp(x, min=t)``
            unified = static_sizes_as_ragged(unified, keep_first)
        if func in _ALIGNED or func in _MASK_ALIGNED:
            unified = _assume_aligned(func, unified)
        kwargs = {**kwargs, **dict(zip(names, unified[len(args):]))}
        return unified[: len(args)], kwargs
    if len(args) > 1 or (args and isinstance(args[0], (list, tuple)) and len(args[0]) > 1):
        # a single list argument too: ``torch.cat([x, y], dim=-1)`` has no second positional one
        args = unify_extents(args, keep_first)
        if func in SIZED:
            args = static_sizes_as_ragged(args, keep_first)
        if func in _BROADCASTING and _needs_grad(*args):
            args = _expand_broadcasts(args, keep_first)
        if func in _ALIGNED or func in _MASK_ALIGNED:
            args = _assume_aligned(func, args)
    return args, kwargs


# an index that must have its input's ragged sizes at every dim but the one it indexes along, and
# a source that must have the index's (position of the index, of the dim, of the source or None,
# the index's keyword name)
_INDEX_ALIGNED = {torch.gather: (2, 1, None, "index"), torch.Tensor.gather: (2, 1, None, "index"),
                  torch.take_along_dim: (1, 2, None, "indices"), torch.Tensor.take_along_dim: (1, 2, None, "indices")}
_INDEX_ALIGNED.update(dict.fromkeys((
    torch.scatter, torch.Tensor.scatter, torch.Tensor.scatter_, torch.scatter_add, torch.Tensor.scatter_add,
    torch.Tensor.scatter_add_, torch.scatter_reduce, torch.Tensor.scatter_reduce, torch.Tensor.scatter_reduce_),
    (2, 1, 3, "index")))


def _assume_index_aligned(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Under tracing, the index of ``gather`` / ``take_along_dim`` / ``scatter*`` relabelled onto
    its input's extents at every ragged dim but the indexed one, and a ``scatter``'s source onto
    the index's (``assume_unified``, NOTE [ Traced operands built apart ] in bridge.py: an index
    built apart from its input with equal lengths, as class labels are); eagerly, and where the
    input is dense, unchanged (eager relabels equal sizes)."""
    pos, dim_pos, src_pos, name = _INDEX_ALIGNED[func]
    x = args[0] if args else kwargs.get("input")
    index = args[pos] if len(args) > pos else kwargs.get(name)
    dim = args[dim_pos] if len(args) > dim_pos else kwargs.get("dim")
    if not (isinstance(x, MJT) and isinstance(index, MJT) and type(dim) is int and -len(x._size) <= dim < len(x._size)):
        return args, kwargs
    if not (torch.compiler.is_compiling() or _is_traced(x._partition.offsets)):
        return args, kwargs
    op = getattr(func, "__name__", "gather")
    index = assume_unified(x, index, op, dims={d for d in x._ragged_dims if d != dim % len(x._size)})
    args, kwargs = _replaced(args, kwargs, pos, name, index)
    src = None if src_pos is None else args[src_pos] if len(args) > src_pos else kwargs.get("src")
    if isinstance(src, MJT):
        args, kwargs = _replaced(args, kwargs, src_pos, "src", assume_unified(index, src, op))
    return args, kwargs


def _replaced(args: tuple, kwargs: dict, pos: int, name: str, value) -> tuple[tuple, dict]:
    if len(args) > pos:
        return (*args[:pos], value, *args[pos + 1:]), kwargs
    return args, {**kwargs, name: value}


def _assume_aligned(func, args: tuple) -> tuple:
    """Under tracing, the operands of an op that needs their ragged dims equal (``_ALIGNED``)
    relabelled onto the first's extents (``assume_unified``, NOTE [ Traced operands built apart ]
    in bridge.py); ``args`` unchanged eagerly."""
    ms = [i for i, a in enumerate(args[:2] if func in _MASK_ALIGNED else args) if isinstance(a, MJT)]
    if len(ms) < 2:
        return args
    first = args[ms[0]]
    if not (torch.compiler.is_compiling() or _is_traced(first._partition.offsets)):
        return args
    name = getattr(func, "__name__", str(func))
    out = list(args)
    for i in ms[1:]:
        # a class index target (B, d1, …) beside its input (B, C, d1, …): dims one apart
        shift = 1 if func in _CLASS_TARGET and i == 1 and len(args[i]._size) == len(first._size) - 1 else 0
        out[i] = assume_unified(first, args[i], name, shift=shift)
    return tuple(out)


# NOTE [ Ragged dims of size 1 in some samples ]
#
# Two operands' ragged dim may broadcast per sample: equal sizes in some samples, size 1 in one
# of them in the others (``F.pad(x[:, :-1], (0, 0, 1, 0)) + x`` where a sample is empty: the pad
# gives it one row). The pointwise handler reads the size-1 operand's row 0 there and its own rows
# elsewhere (``Partition.broadcast_map``). Its values are right; its gradient is not reachable:
# autograd checks each input's gradient against the input's shape, nested ints included, and
# cannot reduce the output's ``(B, j1, C)`` to the operand's ``(B, j0, C)`` (it sums only over dims
# of size 1). So for the elementwise functions below, an operand that needs a gradient is first
# broadcast to the output's sizes by a differentiable gather (``expand_ragged``), whose backward
# sums what each row was read into.
def _elementwise_functions(names: str, dunders: str) -> set:
    """``torch.<name>``, ``Tensor.<name>`` and ``Tensor.<name>_`` for each of ``names``, and
    ``Tensor.__<d>__`` / ``__r<d>__`` / ``__i<d>__`` for each of ``dunders`` (those that exist)."""
    out = set()
    for name in names.split():
        for owner, suffixes in ((torch, ("",)), (torch.Tensor, ("", "_"))):
            out.update(f for f in (getattr(owner, name + suffix, None) for suffix in suffixes) if f is not None)
    for name in dunders.split():
        out.update(f for f in (getattr(torch.Tensor, form.format(name), None) for form in ("__{}__", "__r{}__", "__i{}__"))
                   if f is not None)
    return out


_BROADCASTING: set = _elementwise_functions(
    "add sub subtract mul multiply div divide true_divide remainder fmod pow float_power atan2 arctan2 hypot "
    "copysign ldexp logaddexp logaddexp2 xlogy maximum minimum fmax fmin where lerp addcmul addcdiv clamp clip "
    "polar complex rsub",
    "add sub mul truediv div pow mod floordiv",
) | {torch.special.xlogy}

# The functions whose multi_jagged operands must agree at each ragged dim they share (eager raises
# for other lengths): elementwise ones, comparisons, masks, and the losses pairing an input with
# its target. Under tracing they assume it (NOTE [ Traced operands built apart ] in bridge.py).
# (``masked_scatter`` is not one: its source is read in order, whatever its lengths; only its mask
# is aligned with ``self``, ``_MASK_ALIGNED``.)
_ALIGNED: set = _BROADCASTING | _elementwise_functions(
    "eq ne lt le gt ge greater greater_equal less less_equal not_equal isclose logical_and logical_or "
    "logical_xor bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift masked_fill "
    "nextafter igamma igammac heaviside gcd lcm floor_divide fmod",
    "eq ne lt le gt ge and or xor lshift rshift",
) | {getattr(torch.nn.functional, name) for name in (
    "mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits "
    "kl_div poisson_nll_loss gaussian_nll_loss soft_margin_loss cross_entropy nll_loss"
).split()}
_CLASS_TARGET = {torch.nn.functional.cross_entropy, torch.nn.functional.nll_loss}
_MASK_ALIGNED: set = _elementwise_functions("masked_scatter", "")
# The functions whose static sizes equal to a ragged dim broadcast as it (NOTE [ Static sizes equal
# to a ragged dim ]): the aligned ones, and ``copy_``, whose ``src`` broadcasts to ``self``.
SIZED: set = (_ALIGNED - _CLASS_TARGET) | {torch.Tensor.copy_}


def _expand_broadcasts(args: tuple, keep_first: bool) -> tuple:
    """``args`` with each multi_jagged operand that needs a gradient and whose ragged dims are of
    size 1 in some samples broadcast to the output's (NOTE [ Ragged dims of size 1 in some
    samples ]); unchanged where the operands' ragged dims differ or do not broadcast (the op
    decides, or raises)."""
    ms = [a for a in args if isinstance(a, MJT)]
    if len(ms) < 2 or all(m._partition is ms[0]._partition for m in ms):
        return args
    dims, ndim = ms[0]._ragged_dims, len(ms[0]._size)
    if not dims or any(m._ragged_dims != dims or len(m._size) != ndim for m in ms):
        return args
    wide = list(ms[0]._partition.extents)
    for m in ms[1:]:
        for k, e in enumerate(m._partition.extents):
            if not same_extent(wide[k], e):
                w = broadcast_extent(wide[k], e)
                if w is None:
                    return args
                wide[k] = w
    owner = next((m for m in ms if all(same_extent(w, e) for w, e in zip(wide, m._partition.extents))), None)
    partition = owner._partition if owner is not None else partition_for(wide)
    out = list(args)
    for i, a in enumerate(args):
        if (isinstance(a, MJT) and a._partition is not partition and not (keep_first and i == 0) and _needs_grad(a)
                and not all(same_extent(w, e) for w, e in zip(wide, a._partition.extents))):
            out[i] = expand_ragged(a, partition)
    return tuple(out)


# NOTE [ Static sizes equal to a ragged dim ]
#
# A batch of one sample, or of samples of one length, built by ``torch.nested.nested_tensor`` has a
# static dim wherever the samples' sizes agree: a pair ``(n, n, C)`` becomes ``(1, j0, n, C)``. The
# first contraction gives ``(1, j0, j0, C)``, and every sample would combine the two as dense
# tensors of one shape. So eagerly, where one operand of an elementwise function (``_ALIGNED``) is
# ragged at a dim and another is static there of a size s ≠ 1 that is every sample's size of the
# ragged one, the static dim broadcasts as that ragged dim: the operand is first made ragged there
# (``static_as_ragged``, differentiable: its gradient comes back in its own static shape), and the
# result keeps the ragged dim and its nested int. The one exception is the written ``self`` of an
# in-place op, which must keep its shape as dense torch's does: if it is the static one, the other
# operands' ragged dim becomes static instead (``ragged_as_static``; an operand with no ragged dim
# left becomes a dense ``(B, …)`` tensor, which applies per sample). A dense operand is read the same
# way: one of size s at such a dim (``(B or 1, n, n, C)`` or ``(n, n, C)``, the output of a
# contraction over the pair's one ragged dim: OpenFold's incoming triangle update at equal lengths)
# is first made multi_jagged there (``dense_as_ragged``, differentiable), each sample reading its
# batch slice. Beside the elementwise functions, ``copy_``'s source and the operands of ``cat``
# along another dim take this too (``SIZED``; ``cat``'s route). torch.jagged has one ragged dim whose
# nested int never equals an int, so it raises for all of these. Under tracing the sizes are
# symbols, and a guard on every sample's length would recompile per batch: there the operands do
# not combine, and the op raises a ``StructureError`` that says so.
def _uniform(e, s: int) -> bool:
    """Whether every sample's size of the eager extent ``e`` is ``s`` (from the shape carriers: no
    tensor op)."""
    return not _is_traced(e.offsets) and e.max == s and e.total == s * e.batch


def static_sizes_as_ragged(args: tuple, keep_first: bool, skip: int | None = None) -> tuple:
    """``args`` with each multi_jagged operand's static dim made ragged where another operand is
    ragged there with that size in every sample, or, for an in-place op whose ``self`` is the
    static one, the others' ragged dim made static; a dense operand made multi_jagged at such dims
    (NOTE [ Static sizes equal to a ragged dim ]). ``skip``: a dim left alone (``cat``'s)."""
    if keep_first and args and _dense(args[0]):
        # an in-place op writes into its dense ``self`` as it is: an operand ragged only where every
        # sample has ``self``'s size there reads as that dense tensor (openfold3's ``x *= g`` of a
        # pair of one protein); else refused as before, as dense refuses
        return _ragged_as_dense_self(args)
    if any(_dense(a) for a in args):
        args = _dense_sizes_as_ragged(args, skip)
    ms = [a for a in args if isinstance(a, MJT)]
    if len(ms) < 2:
        return args
    rd = ms[0]._ragged_dims
    for m in ms:
        if m._ragged_dims != rd:
            break
    else:  # the common call (operands of one layout): nothing to look at
        return args
    if torch.compiler.is_compiling():
        return args
    ndim = len(ms[0]._size)
    if any(len(m._size) != ndim or m._partition.batch != ms[0]._partition.batch for m in ms):
        return args
    out = list(args)
    for d in sorted({d for m in ms for d in m._ragged_dims} - {skip}):
        owner = next((m for m in out if isinstance(m, MJT) and d in m._ragged_dims), None)
        stat = [i for i, a in enumerate(out) if isinstance(a, MJT) and d not in a._ragged_dims and a._size[d] != 1]
        if owner is None or not stat:  # (its one ragged operand made dense at an earlier dim)
            continue
        e = owner._partition.extents[owner._ragged_dims.index(d)]
        if not all(_uniform(e, out[i]._size[d]) for i in stat) or len({out[i]._size[d] for i in stat}) > 1:
            continue
        if keep_first and stat[0] == 0:  # (an operand left with no ragged dim is dense: (B, …))
            for i in [i for i, a in enumerate(out) if isinstance(a, MJT) and d in a._ragged_dims]:
                out[i] = ragged_as_static(out[i], d, out[0]._size[d])
        else:
            for i in stat:  # a square pair stays one nested int: the operand's own equal extent first
                own = next((f for f in out[i]._partition.extents if same_extent(f, e)), e)
                out[i] = static_as_ragged(out[i], d, own)
    return tuple(out)


def _ragged_as_dense_self(args: tuple) -> tuple:
    """``args`` with each multi_jagged operand of ``args[0]``'s rank whose every ragged dim has
    ``args[0]``'s size there in every sample made dense (``ragged_as_static``), eagerly."""
    self = args[0]
    if torch.compiler.is_compiling():
        return args
    out = list(args)
    for i, a in enumerate(args[1:], 1):
        if not isinstance(a, MJT) or len(a._size) != self.dim() or a._partition.batch != self.shape[0]:
            continue
        dims = list(zip(a._ragged_dims, a._partition.extents))
        if all(_uniform(e, self.shape[d]) for d, e in dims):
            for d, _ in sorted(dims, reverse=True):
                a = ragged_as_static(a, d, self.shape[d])
            out[i] = a
    return tuple(out)


def _reaches_ragged(args: tuple, t: torch.Tensor) -> bool:
    """Whether the dense ``t`` has a size other than 1 along a ragged dim of the first multi_jagged
    operand in ``args`` (aligned as broadcasting aligns it)."""
    m = next((a for a in args if isinstance(a, MJT)), None)
    if m is None:
        return False
    shift = len(m._size) - t.dim()
    return any(d >= shift and t.shape[d - shift] != 1 for d in m._ragged_dims)


def _dense_sizes_as_ragged(args: tuple, skip: int | None) -> tuple:
    """``args`` with each dense operand that has a size other than 1 along a multi_jagged operand's
    ragged dim, that size every sample's there, made multi_jagged at those dims (``dense_as_ragged``),
    eagerly; unchanged otherwise (the op decides, or raises)."""
    ms = [a for a in args if isinstance(a, MJT)]
    if not ms or torch.compiler.is_compiling():
        return args
    ndim, batch = len(ms[0]._size), ms[0]._partition.batch
    if any(len(m._size) != ndim or m._partition.batch != batch for m in ms):
        return args
    owned = {}  # ragged dim -> the first operand's extent there
    for m in ms:
        for d, e in zip(m._ragged_dims, m._partition.extents):
            if d != skip:
                owned.setdefault(d, e)
    out = list(args)
    for i, t in enumerate(args):
        if not _dense(t) or t.dim() > ndim or (t.dim() == ndim and t.shape[0] not in (1, batch)):
            continue
        shift = ndim - t.dim()
        dims = {d: e for d, e in owned.items() if d >= shift and t.shape[d - shift] != 1}
        if dims and all(_uniform(e, t.shape[d - shift]) for d, e in dims.items()):
            out[i] = dense_as_ragged(t, batch, ndim, dims)
    return tuple(out)


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


def assume_unified(first: MJT, other: MJT, op: str, dims=None, shift: int = 0) -> MJT:
    """Under tracing, ``other`` relabelled onto ``first``'s extents at the same logical dims (those
    in ``dims``, else every shared one; ``other``'s dim d meets ``first``'s ``d + shift``: a class
    index target beside its ``(B, C, …)`` input) that are not provably one nested int, the equal
    sizes this needs checked when the compiled code runs (``assume_relabel``, NOTE [ Traced
    operands built apart ] in bridge.py); ``other`` itself eagerly, where the two share a batch
    size that differs, or where nothing differs. Only for operands whose extents an op needs
    equal: eager raises for other lengths there."""
    if not (torch.compiler.is_compiling() or _is_traced(other._partition.offsets)):
        return other
    if first._partition is other._partition or first._partition.batch != other._partition.batch:
        return other
    swap, pairs = {}, []
    for d, e in zip(other._ragged_dims, other._partition.extents):
        fd = d + shift
        if fd in first._ragged_dims and (dims is None or fd in dims):
            k = first._partition.extents[first._ragged_dims.index(fd)]
            if k is not e and id(e) not in swap and not same_extent(k, e):
                swap[id(e)] = k
                pairs.append((k, e))
    if not swap:
        return other
    extents = [swap.get(id(e), e) for e in other._partition.extents]
    # the first operand's own partition where the two are alike: a traced partition of distinct
    # extents cannot be built anew (its row count has no carrier, ``_rows_of_product``)
    same = len(extents) == len(first._partition.extents) and all(a is b for a, b in zip(extents, first._partition.extents))
    return assume_relabel(other, first._partition if same else partition_for(extents), pairs, op)


def assume_joined(op: str, tensors, first: MJT, d) -> list:
    """Under tracing, the multi_jagged ``tensors`` of a join along dim ``d`` (None: a new dim)
    relabelled onto ``first``'s extents at its every other ragged dim, where they must agree
    (eager raises for other lengths): tensors built apart keep nested ints of their own there, so
    the traced call assumes the sizes equal and checks them when it runs (NOTE [ Traced operands
    built apart ] in bridge.py); ``tensors`` as a list, the same tensors, eagerly."""
    dims = tuple(r for r in first._ragged_dims if r != d)
    if not dims:
        return list(tensors)
    return [assume_unified(first, t, op, dims) if isinstance(t, MJT) and t is not first else t for t in tensors]


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


def _static_dim(op: str, input, dim) -> int:
    d = canonical_dim(op, input.dim(), dim)
    if d == 0 or d in input._ragged_dims:
        raise StructureError(f"{op}(): expected a static dim of a multi_jagged tensor, got dim {dim} (batch or ragged)")
    return d


_CONCRETE_SIZES = "SymIntArrayRef expected to contain only concrete integers"


# NOTE [ The autograd API runs the engine with routes on ]
#
# ``loss.backward()`` on a dense loss never reaches ``__torch_function__``: the engine runs with
# the subclass's ``__torch_function__`` on, so whatever runs during backward (hooks, Python
# backward formulas, and ``torch.utils.checkpoint``'s recomputation of the forward) takes our
# routes as the forward did. A multi_jagged argument of the autograd API (``autograd.grad(loss,
# x)``, ``backward(inputs=[x])``, ``y.backward(g)``) brings the call here, and calling the function
# the default way (under ``DisableTorchFunctionSubclass``) would run the whole engine with the
# routes off: a checkpointed ``F.linear`` would then decompose below the routes (a view across the
# batch dim, which raises) or save other tensors than the forward did, which non-reentrant
# checkpointing refuses. So the function is called skipping only its own ``__torch_function__``
# check (``redispatch_function``: the one check it makes on its tensor arguments), and the engine
# runs as it does for ``loss.backward()``.
def _autograd_entry(fn):
    """``torch.autograd.grad`` / ``backward`` with a multi_jagged argument, run with the routes on
    (NOTE [ The autograd API runs the engine with routes on ]), unchanged except that aten's bare
    "concrete integers" error — raised inside the C++ engine, where no handler can intercept the
    op — becomes a ``NotImplementedError`` (a ``RuntimeError``) that says what causes it (README,
    Gradients)."""
    name = fn.__name__
    types = (MJT,)

    def routed(*args, **kwargs):
        try:
            return torch.overrides.redispatch_function(fn, types, args, kwargs)
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
