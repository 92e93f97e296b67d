"""``x[i]``, ``x[:, ..., k]``, ``select``, ``unbind`` and ``tolist``: routes that express Python
indexing with the ops that have handlers (``select``, ``slice``, ``unsqueeze`` of static dims;
``slicing.py`` along ragged dims, per sample) and give the per-sample components."""

from __future__ import annotations

import warnings

import torch

from ... import constructors
from ...errors import StructureError
from .. import bridged
from .._common import MJT, canonical_dim, describe
from .._routing import _needs_grad, route
from .._table import dispatch as _dispatch
from .along import ragged_dim
from .gather import mask_index, rows_by_index, table_lookup
from .pairwise import pairwise_index
from .scatter import assign_index, table_rows_by_index
from .slicing import positions_ragged, select_ragged, slice_ragged
from ..shape.views import mark_view_copy

mj = torch.ops.multijagged


def _components(input):
    """The B components: views of the packed values when no gradient is needed (aten's
    ``unbind``, as torch.jagged); with autograd recording, eagerly, views of the differentiable
    packed values (``bridged.samples``); traced or under a dispatch mode, ``multijagged::unbind``
    (copies, whose backward packs the component gradients back)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return tuple(mj.unbind.default(input))
    if _needs_grad(input):
        return bridged.samples(input)
    return _dispatch(torch.ops.aten.unbind.int, (input, 0), {})


def _component(input, index: int):
    """Sample ``index`` (in range) of ``input``: with autograd recording (eagerly), a view of its
    rows of the differentiable packed values (``bridged.sample``); else ``_components``'s."""
    if torch.compiler.is_compiling() or not _needs_grad(input) or torch._C._len_torch_dispatch_stack():
        return _components(input)[index]
    return bridged.sample(input, index)


class _UnbindStatic(torch.autograd.Function):
    """``unbind`` of a static dim whose backward stacks the pieces' gradients with zeros for those
    no one used (``q, k, v = qkv.unflatten(-1, (3, E)).unbind(-2)`` with ``v`` unused). aten's
    backward makes those zeros by expanding a dense scalar to the pieces' sizes, which fails on
    nested ints."""

    @staticmethod
    def forward(ctx, input, dim):
        ctx.set_materialize_grads(False)
        ctx.dim, ctx.base = dim, input.detach()  # (no copy: the sizes of a missing gradient)
        return input.unbind(dim)

    @staticmethod
    def backward(ctx, *grads):
        if all(g is None for g in grads):
            return None, None
        pieces = [torch.zeros_like(ctx.base.select(ctx.dim, i)) if g is None else g for i, g in enumerate(grads)]
        return torch.stack(pieces, ctx.dim), None


@route(torch.unbind, torch.Tensor.unbind)
def _unbind(input, dim=0):
    if not isinstance(input, MJT):
        return NotImplemented
    d = canonical_dim("unbind", input.dim(), dim) if dim != 0 else 0
    if d == 0:
        return _components(input)
    if d not in input._ragged_dims and _needs_grad(input):
        if torch.compiler.is_compiling():
            # traced: split's pieces (whose backward compiles with pieces unused), each squeezed
            return tuple(p.squeeze(d) for p in input.split(1, d))
        return _UnbindStatic.apply(input, d)
    return NotImplemented


@route(torch.Tensor.tolist)
def _tolist(input):
    """Nested Python lists, one per sample (each its component's ``tolist()``): the lists dense
    ``tolist`` gives, with each sample's own lengths."""
    if not isinstance(input, MJT):
        return NotImplemented
    return [c.tolist() for c in _dispatch(torch.ops.aten.unbind.int, (input.detach(), 0), {})]


def _int_tensor(i) -> bool:
    return (isinstance(i, torch.Tensor) and not isinstance(i, MJT) and i.dim() == 0 and not i.is_floating_point()
            and not i.is_complex() and i.dtype != torch.bool)


def _as_int(i):
    if _int_tensor(i):
        return int(i)  # SYNC: as dense indexing reads a 0-d index
    if isinstance(i, slice) and any(_int_tensor(b) for b in (i.start, i.stop, i.step)):
        return slice(*(int(b) if _int_tensor(b) else b for b in (i.start, i.stop, i.step)))
    return i


def _uint8_as_masks(index):
    """``index`` with every uint8 tensor read as a mask, as dense indexing reads one (deprecated
    there, with this warning): not as sample or element numbers."""
    def mask(i):
        if isinstance(i, torch.Tensor) and i.dtype == torch.uint8:
            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                          UserWarning, stacklevel=4)
            return i.bool()
        return i

    return tuple(mask(i) for i in index) if isinstance(index, tuple) else mask(index)


@route(torch.Tensor.__getitem__)
def _getitem(input, index):
    if isinstance(input, MJT):
        index = _uint8_as_masks(index)
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if isinstance(index, bool):  # a 0-d mask (a new leading dim), as dense reads it: not a sample number
        index = torch.tensor(index)
    if (not isinstance(input, MJT) and isinstance(index, tuple) and index and isinstance(index[0], MJT)
            and not any(isinstance(i, (torch.Tensor, list)) for i in index[1:])):
        # ``table[idx, 0]``, ``table[idx, :, 1:]``: basic indices after the rows index the rows' own
        # dims, as ``table[:, 0][idx]`` (dense indexing's result: the index's dims, then the rest)
        input, index = (input[(slice(None), *index[1:])] if len(index) > 1 else input), index[0]
    if not isinstance(input, MJT) and isinstance(index, MJT):
        return table_lookup(input, index)
    if (not isinstance(input, MJT) and isinstance(index, tuple) and len(index) >= 2 and isinstance(index[1], MJT)
            and isinstance(index[0], torch.Tensor) and not isinstance(index[0], MJT)
            and all(isinstance(i, slice) and _whole(i) for i in index[2:])):
        return table_rows_by_index(input, index[0], index[1])  # table[arange(B)[:, None, None], idx]
    if isinstance(input, MJT):
        # a 0-d integer tensor is an int wherever it appears (an index, a slice bound), as in dense
        # indexing: x[t] selects a sample, x[:, :t] slices each sample
        index = tuple(_as_int(i) for i in index) if isinstance(index, tuple) else _as_int(index)
    if isinstance(input, MJT) and isinstance(index, int):
        b = input._partition.batch
        if not -b <= index < b:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {b}")
        return _component(input, index)
    if isinstance(input, MJT) and isinstance(index, MJT) and index.dtype == torch.bool:
        return mask_index(input, index)  # x[x > 0], x[keep] of whole rows: dense, as dense torch's
    if (isinstance(input, MJT) and isinstance(index, tuple) and len(index) >= 2 and isinstance(index[1], MJT)
            and isinstance(index[0], torch.Tensor) and not isinstance(index[0], MJT)
            and all(isinstance(i, slice) and _whole(i) for i in index[2:])):
        return rows_by_index(input, index[0], index[1])  # x[arange(B)[:, None], keep]: rows per sample
    if isinstance(input, MJT) and _advanced(index) is not None:
        # samples by index or mask
        return constructors.select_batch(input, _advanced(index, input._partition.batch))
    if isinstance(input, MJT) and isinstance(index, (tuple, slice, type(Ellipsis), type(None))):
        return _getitem_static(input, index if isinstance(index, tuple) else (index,))
    return NotImplemented


@route(torch.Tensor.__setitem__)
def _setitem(input, index, value):
    """``x[index] = value`` with an index that ``x[index]`` reads, from a slice of the batch dim
    (``x[:, 1:] = v``, ``x[..., :2] = 0``, ``x[:, [0, 1]] = v``, ``x[:2, 0] = v``) or from samples
    selected by index or mask (``x[mask] = v``, ``x[[0, 1], 1:] = v``, ``x[b] = batch``); a sample
    (``x[i] = v``) and integer index tensors alone (``x[b, k] = v``) go to torch's
    ``__setitem__`` (``select`` / ``index_put_``, which have handlers)."""
    if isinstance(input, MJT):
        index = _uint8_as_masks(index)
    items = index if isinstance(index, tuple) else (index,)
    if isinstance(input, MJT) and any(_int_tensor(i) for i in items):
        # a 0-d integer index is the int it holds, as ``x[index]`` reads it
        items = tuple(_as_int(i) for i in items)
        index = items if isinstance(index, tuple) else items[0]
    plain = all(i is None or i is Ellipsis or isinstance(i, slice) or type(i) is int or _index_tensor(i) is not None
                or (isinstance(i, MJT) and not (i.is_floating_point() or i.is_complex()))  # ``x[b, keep] = v``
                for i in items)
    if not isinstance(input, MJT) or not plain or not items:
        return NotImplemented
    if (isinstance(value, torch.Tensor) and value.dtype != input.dtype
            and any(isinstance(i, (torch.Tensor, list)) for i in items)):
        # an advanced index writes with ``index_put_``, which casts nothing
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{_dtype_name(input.dtype)} for the destination and {_dtype_name(value.dtype)} for the source.")
    lead = next((i for i in items if i is not None), slice(None))
    if _advanced(lead) is not None or (_index_tensor(lead) is not None and any(isinstance(i, MJT) for i in items)):
        # samples by index or mask: integer index tensors alone (``x[b, k] = v``) are ``index_put_``'s
        # (no sync, compiles); a mask, a slice or int after them, or a multi_jagged value read the
        # selection as ``x[index]`` does
        plain = all(_index_tensor(i) is not None for i in items) and not isinstance(value, MJT)
        mask = (isinstance(lead, torch.Tensor) and lead.dtype == torch.bool) or (
            isinstance(lead, list) and all(isinstance(i, bool) for i in lead))
        if plain and not mask:
            return NotImplemented
        return assign_index(input, index, value, _getitem)
    if not (lead is Ellipsis or isinstance(lead, slice)):
        return NotImplemented  # a sample (``x[i] = v``): ``select`` and ``copy_``
    return assign_index(input, index, value, _getitem)


def _dtype_name(dtype: torch.dtype) -> str:
    """The dtype as torch's messages spell it (``Double``, ``Float``, ``Long``, ``ComplexFloat``)."""
    return {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}.get(dtype, str(dtype))


def _advanced(it, size=None, dim: int = 0) -> torch.Tensor | None:
    """A 1-D index of a dim as an integer tensor (a list of ints, an integer tensor, a boolean
    mask: its positions), or None for anything else. ``size``: the indexed dim's (dim ``dim``), to
    which a mask's length must be equal, as dense indexing requires (a nested int where the dim is
    ragged: a mask cannot cover it)."""
    if isinstance(it, list) and all(isinstance(i, (int, bool)) for i in it):
        it = torch.tensor(it, dtype=None if it else torch.int64)  # ``x[[]]``: no position, as dense
    if isinstance(it, torch.Tensor) and not isinstance(it, MJT) and it.dim() == 1:
        if it.dtype == torch.bool:
            if size is not None and (type(size) is not int or it.shape[0] != size):
                raise IndexError(
                    f"The shape of the mask [{it.shape[0]}] at index {dim} does not match the shape of the "
                    f"indexed tensor [{size}] at index {dim}"
                )
            return it.nonzero().reshape(-1)
        if not it.is_floating_point() and not it.is_complex():
            return it.to(torch.int64)
    return None


def _index_tensor(it) -> torch.Tensor | None:
    """``_advanced``, and also integer index tensors (or nested lists) of several dims."""
    a = _advanced(it)
    if a is not None:
        return a
    if isinstance(it, list) and it and all(isinstance(i, list) for i in it):
        try:
            it = torch.tensor(it)
        except (TypeError, ValueError):
            return None
    if (isinstance(it, torch.Tensor) and not isinstance(it, MJT) and it.dim() > 1 and not it.is_floating_point()
            and not it.is_complex() and it.dtype != torch.bool):
        return it.to(torch.int64)
    return None


def _whole(it: slice) -> bool:
    """``:``, ``0:``, ``::1``: every index of the dim, in every sample — no new extent, so it
    also traces (``k[..., mem_len:, :]`` with ``mem_len = 0``, a cache slice of x-transformers)."""
    return (it.start is None or (type(it.start) is int and it.start == 0)) and it.stop is None and (
        it.step is None or (type(it.step) is int and it.step == 1))


def _getitem_static(input, items):
    """``x[:, 0]``, ``x[:, 1:]``, ``x[..., 1:3]``, ``x[:, None]``: a full slice over the batch dim,
    basic indexing of any other dim — per sample along ragged dims (NOTE [ Indexing along ragged
    dims ]) — as the ops that express it (``select``, ``slice``, ``unsqueeze``). Python's own
    indexing would compare slice bounds with the nested ints ("relation is indeterminate")."""
    if items and isinstance(items[0], int) and not isinstance(items[0], bool):
        return _getitem(input, items[0])[items[1:]]  # a sample, then dense indexing
    along = _one_ragged_index(input, items)
    if along is not None:  # ``x[:, 0]``, ``x[:, 1:]``: the loop below, without its checks
        d, it = along
        k = input._ragged_dims.index(d)
        if type(it) is int:
            return select_ragged("select", input, d, k, it)
        return slice_ragged("slice", input, d, k, it.start, it.stop, 1 if it.step is None else it.step)
    slices = _static_slices(input, items)
    if slices is not None:  # ``qkv[..., :c]``, ``x[:, :, 1:]``: the loop below, without its checks
        for d, it in slices:
            input = torch.ops.aten.slice.Tensor(input, d, *it.indices(input._size[d]))
        return input
    split = _index_run_then_basic(_expand_ellipsis(input, items) if _leading_ellipsis(items) else items)
    if split is not None:
        head, lead, rest = split
        return _getitem_static(input, head)[(slice(None),) * lead + rest]
    paired = _static_pairs(input, items)
    if paired is not None:
        return paired
    lifted = _batch_index_for(input, items)
    if lifted is not None:
        items = lifted
    if items and _index_tensor(items[0]) is not None and any(_index_tensor(i) is not None for i in items[1:]):
        # several index tensors: they pair up (dense indexing's rule), x[b, k][j] = x[b[j]][k[j]]
        items = _expand_ellipsis(input, items)
        for d, it in enumerate(i for i in items if i is not None):  # a mask's length, as dense indexing checks
            _advanced(it, input._size[d] if d < len(input._size) else None, d)
        return pairwise_index(input, items, _index_tensor)
    if items and (_advanced(items[0]) is not None or (isinstance(items[0], slice) and not _whole(items[0]))):
        # samples first (a sub-batch), then the other dims
        first = items[0]
        if isinstance(first, slice):
            start, stop, step = first.indices(input._partition.batch)
            if step <= 0:
                raise ValueError("step must be greater than zero")  # dense slicing's words
            if step == 1:
                picked = input.narrow(0, start, max(stop - start, 0))
            else:  # a gather of the samples' rows where dense gives a view: it writes through
                picked = constructors.select_batch(input, torch.tensor(range(start, stop, step), dtype=torch.int64))
                picked = mark_view_copy(picked, input, (first,), "a strided slice of the batch dim")
        else:
            picked = constructors.select_batch(input, _advanced(first, input._partition.batch))
        return picked[(slice(None),) + tuple(items[1:])] if len(items) > 1 else picked
    items = _expand_ellipsis(input, items)
    out, d = input, 0
    for pos, it in enumerate(items):
        if not isinstance(out, MJT):
            # no ragged dim is left (x[:, 0, 1] of (B, j0, C, D)): the rest is dense indexing
            return out[(slice(None),) * d + tuple(items[pos:])]
        if it is None:
            out, d = out.unsqueeze(d), d + 1
        elif isinstance(it, slice) and _whole(it):
            d += 1
        elif d > 0 and _advanced(it) is not None and sum(_advanced(i) is not None for i in items) == 1:
            # one index list or tensor: the dim keeps its place (dense torch's rule for a single
            # advanced index), each sample's entries at those positions
            idx = _advanced(it, out._size[d], d)
            if d in out._ragged_dims and bool((idx < 0).any()):
                # negative positions count from each sample's own end
                out, d = positions_ragged("index", out, d, out._ragged_dims.index(d), idx), d + 1
                continue
            if d not in out._ragged_dims:
                idx = torch.where(idx < 0, idx + int(out.shape[d]), idx)
            out, d = out.index_select(d, idx.to(out.device)), d + 1
        elif isinstance(it, bool) or not isinstance(it, (int, slice)):
            return NotImplemented
        elif d == 0:
            op = "select" if isinstance(it, int) else "slice"
            raise StructureError(
                f"{op}(): expected a full slice ':' over the batch dim of {describe(out)}, got {it!r} "
                "(select samples with x[i] or unbind())"
            )
        elif d in out._ragged_dims:
            k = out._ragged_dims.index(d)
            if isinstance(it, int):
                out = select_ragged("select", out, d, k, it)
            else:
                out, d = slice_ragged("slice", out, d, k, it.start, it.stop, 1 if it.step is None else it.step), d + 1
        elif isinstance(it, int):
            out = out.select(d, it)
        else:
            start, stop, step = it.indices(out.shape[d])
            out, d = torch.ops.aten.slice.Tensor(out, d, start, stop, step), d + 1
    return out


def _static_slices(input, items: tuple):
    """``[(dim, slice)]`` of the partial slices when ``items`` are slices alone (and at most one
    Ellipsis), the batch dim's whole and every partial one on a static dim with int bounds —
    the commonest indexing (a packed projection split, ``x[..., 1:]``), which ``_getitem_static``'s
    loop would reach after checks that cost several times the slice itself; None otherwise."""
    ndim, at = len(input._size), None
    for k, it in enumerate(items):
        if it is Ellipsis and at is None:
            at = k
        elif type(it) is not slice:
            return None
    if at is not None:
        items = items[:at] + (slice(None),) * (ndim - len(items) + 1) + items[at + 1:]
    if not items or len(items) > ndim or not _whole(items[0]):
        return None
    out = []
    for d, it in enumerate(items):
        if _whole(it):
            continue
        if d in input._ragged_dims or any(b is not None and type(b) is not int for b in (it.start, it.stop, it.step)):
            return None
        if it.step is not None and it.step < 0:
            raise ValueError("step must be greater than zero")  # dense indexing's error
        out.append((d, it))
    return out


def _one_ragged_index(input, items: tuple):
    """``(d, index)`` when ``items`` are whole slices but one int or slice with int bounds at a
    ragged dim ``d`` (``x[:, 0]``, ``x[:, 1:]``, ``x[:, :, -1]`` of a pair): the commonest indexing
    along a ragged dim, which ``_getitem_static``'s loop reaches after checks that cost more than
    the op; None otherwise."""
    if len(items) < 2 or len(items) > len(input._size) or type(items[0]) is not slice or not _whole(items[0]):
        return None
    hit = None
    for d, it in enumerate(items[1:], 1):
        if type(it) is slice and _whole(it):
            continue
        if hit is not None or d not in input._ragged_dims:
            return None
        if type(it) is int or (type(it) is slice and all(b is None or type(b) is int for b in (it.start, it.stop, it.step))):
            hit = (d, it)
        else:
            return None
    return hit


def _leading_ellipsis(items: tuple) -> bool:
    """Whether an Ellipsis stands before the first index tensor of ``items`` (``x[..., a, b, 1]``)."""
    for it in items:
        if it is Ellipsis:
            return True
        if _index_tensor(it) is not None:
            return False
    return False


def _index_run_then_basic(items: tuple):
    """``(head, lead, rest)`` for ``x[:, a, b, 1]``, ``x[:, a, b, 1:3]``, ``x[:, idx2d, None]``:
    index tensors on adjacent dims (several, or one of several dims) after whole slices only, then
    basic indices (ints, slices, ``None``, an Ellipsis), not all whole slices. Dense indexing
    places the index's broadcast dims where the index tensors stand and applies the basic indices
    to the dims after them (its integers are selects), so ``x[head][(:,) * lead + rest]`` is the
    same: ``head`` the items up to the index tensors, ``lead`` the result's dims before ``rest``'s.
    None for anything else."""
    adv = [k for k, it in enumerate(items) if _index_tensor(it) is not None]
    if not adv or adv[0] == 0 or adv != list(range(adv[0], adv[-1] + 1)):
        return None
    if not all(isinstance(it, slice) and _whole(it) for it in items[:adv[0]]):
        return None
    rest = tuple(items[adv[-1] + 1:])
    if not rest or all(isinstance(it, slice) and _whole(it) for it in rest):
        return None
    if not all(it is None or it is Ellipsis or isinstance(it, slice) or (isinstance(it, int) and not isinstance(it, bool))
               for it in rest):
        return None
    idx = [_index_tensor(items[k]) for k in adv]
    if len(idx) == 1 and idx[0].dim() == 1:
        return None  # one 1-d index keeps its own path (per-sample negative positions)
    try:
        shape = torch.broadcast_shapes(*(i.shape for i in idx))
    except RuntimeError:
        return None  # pairwise_index raises dense's message
    return tuple(items[:adv[-1] + 1]), adv[0] + len(shape), rest


def _index_run(input, items: tuple):
    """``(items, adv, idx)`` where ``items`` (no ``None``; an Ellipsis expanded) hold index tensors
    ``idx`` at the adjacent positions ``adv`` — several, or one of several dims — with only whole
    slices after them: the forms whose index dims stand where the index tensors do. None for
    anything else (one 1-d index keeps its own path: per-sample negative positions)."""
    if not items or any(i is None for i in items):
        return None
    items = _expand_ellipsis(input, items)
    adv = [k for k, it in enumerate(items) if _index_tensor(it) is not None]
    if not adv or adv != list(range(adv[0], adv[-1] + 1)):
        return None
    if not all(isinstance(it, slice) and _whole(it) for it in items[adv[-1] + 1:]):
        return None  # (dims after the index tensors are not the index's: pairwise_index's own rule)
    idx = [_index_tensor(items[k]) for k in adv]
    if len(idx) == 1 and idx[0].dim() == 1:
        return None
    return items, adv, idx


def _batch_index_for(input, items: tuple) -> tuple | None:
    """``x[:, a, b]`` (index tensors on adjacent dims after the whole batch, ``_index_run``) or
    ``x[:, idx2d]``: as dense indexing places their broadcast dims where they stand, after the
    batch dim, the same as ``x[arange(B)[:, None…], a, b]`` — the batch index leading, which
    ``pairwise_index`` takes. None for anything else."""
    run = _index_run(input, items) if items and isinstance(items[0], slice) and _whole(items[0]) else None
    if run is None:
        return None
    items, adv, idx = run
    try:
        shape = torch.broadcast_shapes(*(i.shape for i in idx))
    except RuntimeError:
        return None  # pairwise_index raises dense's message
    b = input._partition.batch
    batch = torch.arange(b, device=input.device).view(b, *([1] * len(shape)))
    return (batch, *items[1:adv[0]], *(i.unsqueeze(0) for i in idx), *items[adv[-1] + 1:])


def _static_pairs(input, items: tuple):
    """``x[..., a, b]`` (or one index tensor of several dims, ``x[..., idx2d]``): index tensors on
    adjacent static dims after every ragged dim (``_index_run``), the other dims whole. Each row
    pairs them up as dense indexing does (their broadcast dims in their place): one index into
    those dims flattened (``a · size_b + b``), whose dims unflatten back. None for anything else."""
    run = _index_run(input, items)
    if run is None:
        return None
    items, adv, idx = run
    if adv[0] <= max(input._ragged_dims, default=0) or not all(
            isinstance(it, slice) and _whole(it) for it in items[:adv[0]]):
        return None
    try:
        idx = list(torch.broadcast_tensors(*idx))
    except RuntimeError:
        return None  # pairwise_index raises dense's message
    flat = None
    for k, i in zip(adv, idx):
        size = int(input._size[k])
        if bool(((i < -size) | (i >= size)).any()):  # SYNC: one read of a device index (dense indexing checks its bounds too)
            raise IndexError(f"index {int(i[(i < -size) | (i >= size)][0])} is out of bounds for dimension {k} with size {size}")
        i = torch.where(i < 0, i + size, i)
        flat = i if flat is None else flat * size + i
    assert flat is not None
    merged = input.flatten(adv[0], adv[-1]) if len(adv) > 1 else input
    picked = merged.index_select(adv[0], flat.reshape(-1).to(input.device))
    return picked.unflatten(adv[0], tuple(flat.shape)) if flat.dim() != 1 else picked


def _expand_ellipsis(input, items: tuple) -> tuple:
    if any(isinstance(i, type(Ellipsis)) for i in items):
        at = next(k for k, i in enumerate(items) if isinstance(i, type(Ellipsis)))
        real = sum(1 for i in items if i is not None and not isinstance(i, type(Ellipsis)))
        items = items[:at] + (slice(None),) * (input.dim() - real) + items[at + 1:]
    return items


@route(torch.select, torch.Tensor.select)
def _select(input, dim, index):
    if not isinstance(input, MJT) or not isinstance(dim, int):
        return NotImplemented
    if canonical_dim("select", input.dim(), dim) == 0:
        return _getitem(input, index)
    hit = ragged_dim("select", input, dim)
    if hit is None:
        return NotImplemented  # a static dim: the op table's handler
    return select_ragged("select", input, *hit, index)

