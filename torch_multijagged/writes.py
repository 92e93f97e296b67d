"""In-place writes into packed values that several tensors share (NOTE below).

Write tracking for the subclass of ``tensor.py``, which takes it as an argument where a type test
is needed (this module sits below it). ``__torch_dispatch__`` bumps the written tensors' values
after a dispatched write; ``__torch_function__`` and the eager values path refuse a tensor whose
values were written through an alias.
"""

from __future__ import annotations

import bisect
import weakref
from typing import Optional

import torch

from .errors import op_label

__all__ = ["written_args", "check_not_written_through_alias", "refuse_split_piece_write", "refuse_untracked_view_write",
           "record_write", "stamp_write", "written_since", "chain_root"]


# NOTE [ Writes into shared values ]
#
# An in-place op on a wrapper runs below autograd: its handler writes the packed values, and
# autograd bumps the wrapper's version counter, not the values'. The eager values path (NOTE
# [ Eager values path ] in ops/fastpath.py) keeps dense values in autograd graphs, which made two
# silent wrong gradients:
#
# * values a fast op saved for its backward (``y = q.sin()`` saves ``q``'s values) could be
#   overwritten (``q.mul_(2)``) unnoticed, where dense torch raises "modified by an inplace
#   operation" in backward. So after a dispatched write the written wrappers' values get their
#   counter bumped, as a dense write bumps its tensor's: the same backward now raises.
# * a view made on the values path (``transpose``, ``permute``, ``unsqueeze``, ``view``: a wrapper
#   whose values are a dense view of another wrapper's values) is not an autograd view of that
#   wrapper. A write through one of the two changes the other's values while the other's autograd
#   history stays as it was (dense torch rebases a view's base, and a base's views, on such a
#   write), so the other's gradient would miss the write. The other is recognised by its
#   remembered values (``_vgraph``: the values tensor, its version, the wrapper's version) — the
#   values changed, its own counter did not — and its next use with autograd recording raises
#   (``check_not_written_through_alias``) instead; so does a write into it, which would otherwise
#   bump its own counter and hide the alias's write (writing both gave a wrong gradient). Writing
#   through the view and using only the view
#   afterwards (OpenFold's ``q = lin(x).view(...).transpose(-2, -3); q /= c``) is unaffected: the
#   view's own history holds the write. A view made by the general mechanism (a slice; under
#   ``torch.compile`` every view but one) is an autograd view of its base, and writes through it
#   are differentiated as in dense torch (``test/test_structure_copies_splits.py``).
#
# Both are eager only (``_eager``): compiled code and dispatch modes never see the values path.
# The exception under ``torch.compile`` is a view / reshape of static dims of a tensor that needs
# gradients, which the trace takes on the values (``traced_static_view`` in ops/shape/flatten.py):
# it marks both tensors (``_traced_alias``) and a write into either is refused in the trace.

_METADATA_WRITES = {"detach_", "requires_grad_"}
_WRITTEN: dict = {}  # func -> (positions, keyword names) of the tensor arguments it writes


def written_args(func):
    """``(positions, keyword names)`` of the tensor arguments that ``func`` writes (cached)."""
    hit = _WRITTEN.get(func)
    if hit is None:
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable or schema.name.split("::")[-1] in _METADATA_WRITES:
            hit = ((), ())
        else:
            args = schema.arguments
            w = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
            hit = (tuple(i for i in w if not args[i].kwarg_only), tuple(args[i].name for i in w if args[i].kwarg_only))
        _WRITTEN[func] = hit
    return hit


def _eager() -> bool:
    return not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active())


def _targets(args, kwargs, pos, names, cls: type) -> list:
    """The tensors of type ``cls`` (the subclass) an op writes."""
    out: list = []
    for t in [args[i] for i in pos if i < len(args)] + [kwargs[n] for n in names if n in kwargs]:
        out.extend(x for x in (t if isinstance(t, (list, tuple)) else (t,)) if isinstance(x, cls))
    return out


def _refuse_traced_alias_write(func, targets) -> None:
    for x in targets:
        with torch._C.DisableTorchFunctionSubclass():
            base, marked = x, False
            while base is not None and not marked:  # x, or the base x is an autograd view of
                marked, base = "_traced_alias" in base.__dict__, base._base
            if not marked:
                continue
            needs_grad, shape = x.requires_grad, tuple(x.shape)
        if needs_grad:
            name = op_label(func)
            raise NotImplementedError(
                f"{name}(): under torch.compile, writing in place into a multi_jagged tensor of shape "
                f"{shape} that shares its values with a view / reshape of static dims (or is one) "
                "is not supported with autograd recording: the write would not reach the other's gradient. "
                "Clone before writing, or write outside the compiled region"
            )


# dense autograd's refusal of a write in grad mode into a view made in no_grad mode
NO_GRAD_VIEW_WRITE = (
    "A view was created in no_grad mode and is being modified inplace with grad mode enabled. Given that this use "
    "case is ambiguous and error-prone, it is forbidden. You can clarify your code by moving both the view and the "
    "inplace either both inside the no_grad block (if you don't want the inplace to be tracked) or both outside (if "
    "you want the inplace to be tracked)."
)


def _writes_grad_value(x, args, kwargs) -> bool:
    """Whether a write into ``x`` takes a tensor (other than ``x``) that requires grad."""
    return any(isinstance(a, torch.Tensor) and a is not x and a.requires_grad for a in (*args, *(kwargs or {}).values()))


def refuse_untracked_view_write(func, targets, args=(), kwargs=None) -> None:
    """A write of a value that requires grad into a view made on the values path (``transpose``,
    ``unsqueeze``, ``view``: a wrapper autograd does not know as a view) of a batch that does not:
    dense torch rebases the batch's history onto the write; here the batch would keep none and the
    value's gradient would be lost, so it raises, naming what works."""
    if not torch.is_grad_enabled():
        return
    for x in targets:
        root = x.__dict__.get("_view_root")
        if root is None or root is x:
            continue
        with torch._C.DisableTorchFunctionSubclass():
            if root.requires_grad or not _writes_grad_value(x, args, kwargs):
                continue
        name = op_label(func)
        raise NotImplementedError(
            f"{name}(): writing a value that requires grad in place into a view of a multi_jagged batch that does "
            "not is not supported (the batch would not record the write's gradient): write into the batch itself "
            "(x.mul_(w)), make it require grad first, or compute out of place"
        )


def refuse_split_piece_write(func, targets, args=(), kwargs=None) -> None:
    """Dense ``split``/``chunk``/``unbind`` pieces are views made by one function that returns several, and
    autograd refuses an in-place write into one in grad mode while the piece or the written value
    requires grad (it could not rebase the others' history), and a write in grad mode into one made
    in no_grad mode of a tensor that requires grad. The values path's pieces (``_split_fast``,
    ``_unbind`` in ops/fastpath.py) are marked and refused the same way, in dense's words."""
    if not torch.is_grad_enabled():
        return
    for x in targets:
        made = x.__dict__.get("_split_piece")
        if not made:
            continue
        name = op_label(func)
        if made == "no_grad":
            raise RuntimeError(f"{name}(): {NO_GRAD_VIEW_WRITE}")
        with torch._C.DisableTorchFunctionSubclass():
            needs_grad = x.requires_grad or _writes_grad_value(x, args, kwargs)
        if needs_grad:
            raise RuntimeError(
                f"{name}(): a piece of split / chunk / unbind is a view and is being modified inplace. This view is "
                "the output of a function that returns multiple views. Such functions do not allow the "
                "output views to be modified inplace. You should replace the inplace operation by an "
                "out-of-place one."
            )


# Dispatched writes stamp the storage they write (``stamp_write``): a view made by a handler (a
# select of a static dim, ``y.unflatten(…)[..., 0]``) has values whose version counter is not shared
# with its base's values (handlers run below autograd, where dense views get counters of their
# own), so a write through it left the counters of other wrappers on that storage unchanged and
# their gradients missed it. ``_vgraph`` records the write clock when it was made; a storage
# stamped after that was written since (one compare while nothing was written).
# A tensor written itself (directly or through an autograd view) bumps its own version once per
# write, so it is stale when its storage saw more writes since than its version counts: a write
# through an alias came on top of its own (``t = y[..., :2]; t.mul_(2); t.unsqueeze(-1).mul_(3)``
# leaves ``y``'s history without the second write).
WRITE_CLOCK = [0]  # dispatched writes into multi_jagged values so far
_WRITTEN_AT: dict[int, list] = {}  # storage pointer → WRITE_CLOCK at each of its last writes
_STAMPS_KEPT = 1 << 14  # a long run's stamps are dropped past this many storages (bounded memory)
_WRITES_KEPT = 16  # per storage: the last writes (a tensor written more often since is not told stale)


def _storage_ptr(v: torch.Tensor) -> int:
    try:
        return v.untyped_storage().data_ptr() if v.numel() else 0
    except (RuntimeError, NotImplementedError):  # fake / functional tensors
        return 0


def stamp_write(values: torch.Tensor) -> None:
    """Record a dispatched write into ``values``' storage (see above)."""
    WRITE_CLOCK[0] += 1
    ptr = _storage_ptr(values)
    if ptr:
        if len(_WRITTEN_AT) >= _STAMPS_KEPT:
            _WRITTEN_AT.clear()
        stamps = _WRITTEN_AT.setdefault(ptr, [])
        stamps.append(WRITE_CLOCK[0])
        if len(stamps) > _WRITES_KEPT:
            del stamps[0]


def _bump_values(x) -> None:
    if not x._values.is_inference():
        torch.autograd.graph.increment_version(x._values)


# A view made on the values path (marked ``_view_of`` by ops/fastpath.py) shares its values with
# the wrapper it was taken of, but not that wrapper's version counter. The general mechanism's
# aten formulas save *wrappers* (``log_softmax``'s and ``amax``'s outputs, ``logsumexp``'s input,
# the output of ``multijagged::sdpa``) and check their counters in backward: a write through such
# a view left them unchanged, and the backward read the written values (a silently wrong gradient;
# NaN for ``amax``). So the write also bumps the counters of the wrappers the written tensor is a
# values-path view of, transitively (``_bump_viewed``): that backward raises, as dense torch's
# shared counter makes it. Such a bump is no write of theirs, which their autograd history would
# hold: it is recorded on the wrapper's autograd root (every wrapper sharing the counter reaches it
# through ``_base``), and the staleness test (``_stale_own``) does not count it as their own.
ALIAS_BUMPS = [0]  # such bumps so far: while 0, ``_stale_own`` looks for none
_ALIAS_KEPT = 1024  # per root: the clocks of its last such bumps


def _root(x):
    with torch._C.DisableTorchFunctionSubclass():
        base = x._base
    return x if base is None else base


def _bump_viewed(x, cls: type) -> None:
    """Bump the wrapper counters of the wrappers ``x`` (or an autograd base of ``x``) is a
    values-path view of, transitively, recording each bump on the bumped wrapper's root; the
    values of their autograd bases (made below autograd: counters of their own) are bumped too."""
    todo, seen = [(x, False)], set()  # (wrapper, whether to bump its autograd bases' values)
    while todo:
        w, bases = todo.pop()
        first = True
        while isinstance(w, cls):  # w, then its autograd base
            if bases and not first:
                _bump_values(w)
            first = False
            src = w.__dict__.get("_view_of")
            if isinstance(src, weakref.ref):  # a view in between; once gone, on to the chain's first
                src = src()
                if src is None:
                    src = w.__dict__.get("_view_root")
            if src is not None and id(src) not in seen:
                seen.add(id(src))
                with torch._C.DisableTorchFunctionSubclass():
                    live = not src.is_inference()
                    if live:
                        torch.autograd.graph.increment_version(src)
                if live:
                    clocks = _root(src).__dict__.setdefault("_alias_bumps", [])
                    clocks.append(WRITE_CLOCK[0])
                    if len(clocks) > _ALIAS_KEPT:
                        del clocks[0]
                    ALIAS_BUMPS[0] += 1
                todo.append((src, True))  # (its own values share the written values' counter)
            with torch._C.DisableTorchFunctionSubclass():
                w = w._base


def _alias_bumps_since(x, clock: int) -> int:
    """How many of ``x``'s counter bumps since ``clock`` were ``_bump_viewed``'s (not writes)."""
    clocks = _root(x).__dict__.get("_alias_bumps")  # increasing
    return 0 if not clocks else len(clocks) - bisect.bisect_right(clocks, clock)


def record_write(x, cls: type) -> None:
    """After a dispatched write into ``x`` (of type ``cls``, the subclass): its values' counter
    bumped (the handler wrote them below autograd, where it is not) and its storage stamped. A
    handler's view has values whose counter is not its base's (made below autograd): the bases'
    values are bumped too, so a backward that saved them raises, as dense torch's shared counter
    makes it. So are the wrappers ``x`` is a values-path view of (``_bump_viewed``, above). A
    write through ``y.data`` (or a view of it) is none autograd sees, as in dense torch: only its
    own counter moves."""
    _bump_values(x)
    if _through_data(x, cls):
        return
    stamp_write(x._values)
    _bump_viewed(x, cls)
    with torch._C.DisableTorchFunctionSubclass():
        base = x._base
    while isinstance(base, cls):
        _bump_values(base)
        with torch._C.DisableTorchFunctionSubclass():
            base = base._base


def chain_root(x, cls: type):
    """The first tensor of ``x``'s chain of views (``x`` of type ``cls``, the subclass):
    values-path views (``_view_root``) and autograd views (``_base``) alike, as dense torch's views
    all name their one base."""
    while True:
        root = x.__dict__.get("_view_root")
        if root is not None:
            return root
        with torch._C.DisableTorchFunctionSubclass():
            base = x._base
        if not isinstance(base, cls):
            return x
        x = base


def _through_data(x, cls: type) -> bool:
    """Whether ``x`` is a tensor's ``.data`` (marked ``_data_alias``) or a view of one."""
    return "_data_alias" in chain_root(x, cls).__dict__


def writes_since(v: torch.Tensor, clock: int) -> int:
    """How many dispatched writes stamped ``v``'s storage after ``clock``."""
    if clock == WRITE_CLOCK[0]:
        return 0
    stamps = _WRITTEN_AT.get(_storage_ptr(v))
    return 0 if not stamps else sum(1 for c in stamps if c > clock)


def written_since(v: torch.Tensor, clock: int) -> bool:
    """Whether a dispatched write stamped ``v``'s storage after ``clock``."""
    return writes_since(v, clock) > 0


def _stale_own(x) -> bool:
    hit = x.__dict__.get("_vgraph")
    if hit is None:
        return False
    with torch._C.DisableTorchFunctionSubclass():
        if not x.requires_grad:
            return False
        own = x._version - hit[3]  # its own writes since (each stamped once)
        if ALIAS_BUMPS[0]:
            own -= _alias_bumps_since(x, hit[4])  # not writes: bumps for a view's write (above)
        return (own == 0 and hit[0]._version != hit[1]) or writes_since(hit[0], hit[4]) > own


def _stale(x) -> bool:
    """Whether ``x``'s values were written through an alias since it remembered them — or those of
    a tensor ``x`` is an autograd view of (``y.view(…)[..., 0]`` after ``y`` was written: the
    view's gradient flows through its base's history)."""
    if _stale_own(x):
        return True
    if not WRITE_CLOCK[0]:
        return False  # nothing was ever written: no base can be stale
    with torch._C.DisableTorchFunctionSubclass():
        base = x._base
    while base is not None:
        if _stale_own(base):
            return True
        with torch._C.DisableTorchFunctionSubclass():
            base = base._base
    return False


def _written_through_alias(args, cls: type) -> Optional[torch.Tensor]:
    """An argument (or a tensor in a list argument) of type ``cls`` (the subclass) whose values
    were written through an alias."""
    for a in args:
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, cls) and ("_vgraph" in x.__dict__ or WRITE_CLOCK[0]) and _stale(x):
                return x
    return None


def _differentiable(result) -> bool:
    """Whether an op's result carries a gradient (metadata reads, ``detach``… do not)."""
    for r in (result if isinstance(result, (list, tuple)) else (result,)):
        if isinstance(r, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                if r.requires_grad:
                    return True
    return False


def check_not_written_through_alias(x: torch.Tensor, op) -> None:
    """Raise if ``x``'s values were written through another wrapper sharing them since ``x``
    last remembered them (NOTE [ Writes into shared values ]); only with autograd recording."""
    if not _stale(x):
        return
    with torch._C.DisableTorchFunctionSubclass():
        shape = tuple(x.shape)
    name = op if isinstance(op, str) else getattr(op, "__name__", str(op)).split(".")[0]
    raise NotImplementedError(
        f"{name}(): the values of a multi_jagged tensor of shape {shape} were written in place through "
        "another tensor that shares them (a view made by transpose / permute / unsqueeze / view, or its "
        "base), which autograd does not connect to it: its gradient would miss the write. Write to the "
        "tensor itself, or clone the view before writing to it (v = v.clone())"
    )
