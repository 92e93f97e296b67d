"""Constructors and conversions (the public API of README.md, "Use") and the ``torch.nested`` integration."""

from __future__ import annotations

import functools
import operator
from typing import Any, Optional, Sequence

import torch

from ._frames import eager_constructor
from .bridge import values_of, wrap_values
from .kernels import reference as ref
from .structure import Partition, RaggedExtent, _is_traced, offsets_problem, partition_from_sizes, register_partition
from .tensor import MultiJaggedTensor

__all__ = [
    "nested_tensor",
    "as_nested_tensor",
    "from_packed",
    "from_padded",
    "from_jagged",
    "to_jagged",
    "to_padded_tensor",
    "occupancy",
    "from_mask",
    "is_nested",
]

mj = torch.ops.multijagged


# ----------------------------------------------------------------------------- structure
def _ragged_dims_tuple(op: str, ragged_dims) -> tuple[int, ...]:
    """``ragged_dims`` as a tuple of ints. A bare int is one dim (as torch's ``dim=`` arguments
    accept); entries must be integers: ``1.5`` or ``True`` is a mistake, not dim 1."""
    if isinstance(ragged_dims, (bool, float, str, bytes, torch.Tensor)):
        raise TypeError(f"{op}(): expected ragged_dims to be an int or a sequence of ints, got {ragged_dims!r}")
    if not isinstance(ragged_dims, Sequence):
        try:
            return (operator.index(ragged_dims),)
        except TypeError:
            raise TypeError(
                f"{op}(): expected ragged_dims to be an int or a sequence of ints, got {type(ragged_dims).__name__}"
            ) from None
    out = []
    for d in ragged_dims:
        if isinstance(d, (bool, float)) or isinstance(d, torch.Tensor) and d.is_floating_point():
            raise TypeError(f"{op}(): expected ragged_dims to hold ints, got {ragged_dims!r}")
        try:
            out.append(operator.index(d))
        except TypeError:
            raise TypeError(f"{op}(): expected ragged_dims to hold ints, got {ragged_dims!r}") from None
    return tuple(out)


def _check_ragged_dims(op: str, ragged_dims, ndim: int) -> tuple[int, ...]:
    rd = _ragged_dims_tuple(op, ragged_dims)
    if not rd or list(rd) != sorted(set(rd)) or rd[0] < 1 or rd[-1] >= ndim:
        raise ValueError(
            f"{op}(): expected ragged_dims to be increasing logical dims in [1, {ndim - 1}], got {rd}"
        )
    return rd


def _check_dense(op: str, what: str, t) -> None:
    """``t`` is a plain (strided) tensor: a multi_jagged or torch.jagged one is a mistake here."""
    if isinstance(t, MultiJaggedTensor):
        raise TypeError(f"{op}(): expected {what} to be a dense tensor, got a multi_jagged tensor")
    if isinstance(t, torch.Tensor) and t.is_nested:
        raise TypeError(f"{op}(): expected {what} to be a dense tensor, got a nested tensor of layout {t.layout}")


def _host_ints(op: str, what: str, t: torch.Tensor) -> torch.Tensor:
    """An integer tensor of sizes/lengths, copied to the CPU as int64; floats are not truncated."""
    _check_dense(op, what, t)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{op}(): expected {what} of an integer dtype, got {t.dtype}")
    if t.device.type == "meta":
        raise ValueError(f"{op}(): expected {what} with data (they size the structure), got a tensor on the meta device")
    # SYNC: a host copy of the sizes, once per constructed tensor (Python-side decisions).
    return t.detach().to("cpu", torch.int64)


def _infer(op: str, tensors: Sequence[torch.Tensor], ragged_dims) -> tuple[tuple[int, ...], torch.Tensor]:
    """Ragged dims (logical) and (B, R) host sizes for a list of components."""
    if len(tensors) == 0:
        raise ValueError(f"{op}(): cannot infer the structure of an empty list; use from_packed for B = 0")
    first = tensors[0]
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}(): expected a list of tensors, got {type(t).__name__}")
        _check_dense(op, "each component", t)
        if t.dim() != first.dim():
            raise ValueError(f"{op}(): expected components of equal rank, got {first.dim()} and {t.dim()}")
        if t.dtype != first.dtype or t.device != first.device:
            # a RuntimeError, as torch.jagged's ("all tensors in list must have the same dtype")
            raise RuntimeError(f"{op}(): expected components of one dtype and device, got {t.dtype}/{t.device} and "
                               f"{first.dtype}/{first.device}")
    if first.dim() == 0:
        raise ValueError(f"{op}(): cannot build a multi_jagged tensor from 0-dim components")
    # plain Python on the shapes: a handful of tensor ops on a (B, rank) table cost more for the
    # batch sizes a model sees than comparing B tuples
    shapes = [tuple(t.shape) for t in tensors]
    s0 = shapes[0]
    varying = [d + 1 for d in range(len(s0)) if any(s[d] != s0[d] for s in shapes)]
    if ragged_dims is None:
        ragged_dims = tuple(varying) or (1,)
    else:
        ragged_dims = _check_ragged_dims(op, ragged_dims, first.dim() + 1)
    bad = [d for d in varying if d not in ragged_dims]
    if bad:
        raise ValueError(f"{op}(): dims {bad} differ across components but are not in ragged_dims={ragged_dims}")
    sizes = torch.tensor([[s[d - 1] for d in ragged_dims] for s in shapes], dtype=torch.int64)
    return ragged_dims, sizes.reshape(len(shapes), len(ragged_dims))


class _FromComponents(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partition, ragged_dims, *components):
        ctx.set_materialize_grads(False)  # zeros of nested-int sizes cannot be made
        ctx.count = len(components)
        values = ref.pack_components(components, ragged_dims)
        return MultiJaggedTensor(values, partition, ragged_dims)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return (None, None) + (None,) * ctx.count
        # Through the differentiable bridge under create_graph=True (NOTE [ Differentiable
        # backward of the bridge ]): the split / reshape / permute below are plain autograd ops.
        values = values_of(grad) if torch.is_grad_enabled() and grad.requires_grad else grad._values
        comps = ref.unpack_components(values, grad._partition.host_sizes(), grad._ragged_dims)
        return (None, None, *comps)


def _as_component(op: str, t) -> torch.Tensor:
    """A component given as a tensor or as (nested lists of) numbers, as torch.nested accepts."""
    if isinstance(t, torch.Tensor):
        return t
    if isinstance(t, (str, bytes)):
        raise TypeError(f"{op}(): expected a list of tensors (or nested lists of numbers), got {type(t).__name__}")
    try:
        return torch.as_tensor(t)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{op}(): expected a list of tensors (or nested lists of numbers), got {type(t).__name__}: {e}") from None


def as_nested_tensor(
    tensors: Sequence[torch.Tensor],
    *,
    ragged_dims: Optional[Sequence[int]] = None,
    dtype: Optional[torch.dtype] = None,
    device=None,
) -> MultiJaggedTensor:
    r"""Packs a list of tensors into a multi_jagged tensor ``(B, …)``, differentiable w.r.t. them.

    Sample ``i`` is ``tensors[i]``. As :func:`nested_tensor`, but the result is not a new leaf:
    gradients flow back to ``tensors``. As ``torch.nested.as_nested_tensor``: a dense tensor
    ``(B, N, …)`` gives ``B`` samples ``(N, …)`` ragged along dim 1, a view of its storage where it is
    contiguous; a multi_jagged tensor is returned as it is (or converted to ``dtype`` /
    ``device``).
    ``torch.nested.as_nested_tensor(tensors, layout=torch.multi_jagged)`` calls this.

    Args:
        tensors (list of Tensor, or Tensor): the ``B >= 1`` components, of one rank, dtype and
            device; or a dense ``(B, N, …)`` tensor, or a multi_jagged tensor.

    Keyword args:
        ragged_dims (int or sequence of ints, optional): the logical ragged dims, increasing in
            ``[1, rank]`` (dim ``d`` of a component is logical dim ``d + 1``). Every dim whose
            size differs across the components must be one; a dim whose sizes happen to agree
            may be one too. Default: the dims that differ, or ``(1,)`` when none does.
        dtype (:class:`torch.dtype`, optional): the dtype of the result, converted to
            differentiably. Default: the components'.
        device (:class:`torch.device`, optional): the device of the result. Default: the
            components'.

    Returns:
        MultiJaggedTensor: the batch of ``len(tensors)`` samples.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> a = torch.ones(2, 3, requires_grad=True)
        >>> b = torch.ones(1, 3, requires_grad=True)
        >>> x = mj.as_nested_tensor([a, b])
        >>> [t.shape for t in x.unbind()]
        [torch.Size([2, 3]), torch.Size([1, 3])]
        >>> (2 * x).sum().backward()
        >>> b.grad
        tensor([[2., 2., 2.]])
    """
    if isinstance(tensors, MultiJaggedTensor):
        # as torch.nested's: the tensor itself (or converted to ``dtype`` / ``device``)
        if ragged_dims is not None and _ragged_dims_tuple("as_nested_tensor", ragged_dims) != tensors._ragged_dims:
            raise ValueError(f"as_nested_tensor(): ragged_dims {tuple(ragged_dims)} differ from the tensor's "
                             f"{tensors._ragged_dims}")
        return tensors.to(device=device, dtype=dtype)
    if isinstance(tensors, torch.Tensor) and not tensors.is_nested:
        return _view_of_dense("as_nested_tensor", tensors, ragged_dims, dtype, device)
    tensors = list(tensors)
    ragged_dims, sizes = _infer("as_nested_tensor", tensors, ragged_dims)
    if dtype is not None or device is not None:
        tensors = [t.to(dtype=dtype, device=device) for t in tensors]
    partition = partition_from_sizes(sizes, tensors[0].device)
    return _FromComponents.apply(partition, ragged_dims, *tensors)


def _view_of_dense(op: str, t: torch.Tensor, ragged_dims, dtype, device) -> MultiJaggedTensor:
    """``(B, N, …)`` as a batch of ``B`` samples ``(N, …)`` with dim 1 ragged, viewing ``t``'s
    storage where ``t`` is contiguous (and no conversion asked), as ``torch.jagged``'s
    ``as_nested_tensor`` of a tensor."""
    if t.dim() < 2:
        raise RuntimeError(f"{op}(): Expected tensor argument to have dim() > 1")
    if ragged_dims is not None and _ragged_dims_tuple(op, ragged_dims) != (1,):
        raise ValueError(f"{op}(): a dense tensor's samples are ragged along dim 1 only, got ragged_dims {ragged_dims}")
    values = t.contiguous().flatten(0, 1).to(device=device, dtype=dtype)
    b, n = t.shape[:2]
    return from_packed(values, torch.arange(b + 1, device=values.device) * n, torch.full((b,), n, dtype=torch.int64), (1,))


def nested_tensor(
    tensors: Sequence[torch.Tensor],
    *,
    ragged_dims: Optional[Sequence[int]] = None,
    dtype: Optional[torch.dtype] = None,
    device=None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> MultiJaggedTensor:
    r"""Constructs a multi_jagged tensor ``(B, …)`` with no autograd history from a list of tensors.

    Sample ``i`` is a copy of ``tensors[i]``. The components share one rank, dtype and device and
    may differ in size along any of their dims, which become the ragged dims.
    ``torch.nested.nested_tensor(tensors, layout=torch.multi_jagged)`` calls this; see
    :func:`as_nested_tensor` for a result differentiable w.r.t. ``tensors``.

    Args:
        tensors (list of Tensor): the ``B >= 1`` components; nested lists of numbers are
            accepted too, as ``torch.nested.nested_tensor`` accepts them.

    Keyword args:
        ragged_dims (int or sequence of ints, optional): the logical ragged dims, increasing in
            ``[1, rank]`` (dim ``d`` of a component is logical dim ``d + 1``). Every dim whose
            size differs across the components must be one; a dim whose sizes happen to agree
            may be one too. Default: the dims that differ, or ``(1,)`` when none does.
        dtype (:class:`torch.dtype`, optional): the dtype of the result. Default: the
            components'.
        device (:class:`torch.device`, optional): the device of the result. Default: the
            components'.
        requires_grad (bool, optional): whether autograd records operations on the result.
            Default: ``False``.
        pin_memory (bool, optional): whether the packed values are allocated in pinned memory.
            Default: ``False``.

    Returns:
        MultiJaggedTensor: a leaf batch of ``len(tensors)`` samples.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
        >>> x.dim(), x.ragged_dims
        (3, (1,))
        >>> [t.shape for t in x.unbind()]
        [torch.Size([2, 3]), torch.Size([1, 3])]
        >>> pairs = mj.nested_tensor([torch.ones(2, 2, 4), torch.ones(3, 3, 4)])
        >>> pairs.ragged_dims, pairs.sizes().tolist()
        ((1, 2), [[2, 2], [3, 3]])
        >>> y = mj.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)], ragged_dims=(1, 2))
        >>> y.ragged_dims
        (1, 2)
    """
    tensors = [_as_component("nested_tensor", t) for t in tensors]
    ragged_dims, sizes = _infer("nested_tensor", tensors, ragged_dims)
    with torch.no_grad():
        values = ref.pack_components(tensors, ragged_dims)  # under no_grad: no history to detach
        values = values.to(dtype=dtype, device=device)
    if pin_memory:
        values = values.pin_memory()
    partition = partition_from_sizes(sizes, values.device)
    return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)


@eager_constructor("from_packed")  # NOTE [ Constructors under torch.compile ] in _frames.py
def from_packed(
    values: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    ragged_dims: Sequence[int] | int = (1,),
    *,
    validate: bool = False,
) -> MultiJaggedTensor:
    r"""Views packed values ``(T, *static)`` as a multi_jagged tensor, without a copy.

    Sample ``i`` is packed rows ``offsets[i] .. offsets[i + 1]`` of ``values``: its ragged dims
    flattened row-major over its ragged coordinates, of sizes ``sizes[i]``. Host checks always
    run: types, shapes, ``sizes >= 0``, ``Σ_i Π_k sizes[i, k] == T``, and — when ``offsets`` are
    on the CPU, where reading them costs no device sync — that the offsets start at 0, increase,
    end at ``T`` and agree with ``sizes``. For one ragged dim the nested int is keyed on
    ``offsets`` itself. Differentiable w.r.t. ``values``.

    Args:
        values (Tensor): the packed ``(T, *static)`` values, rows first. ``x.values()`` of a batch
            whose one ragged dim ``r`` is not dim 1 (``(B, S, j0, C)``) is torch.jagged's layout,
            ``(S, T, C)``: pass ``x.values().movedim(r - 1, 0)``.
        offsets (Tensor): ``(B+1,)`` int64 row offsets, on the values' device.
        sizes (Tensor): ``(B, R)`` (or ``(B,)`` for ``R = 1``) int64 per-sample extents of
            ``ragged_dims``.
        ragged_dims (int or sequence of ints, optional): the ``R`` logical ragged dims,
            increasing; an int is one dim. Default: ``(1,)``.

    Keyword args:
        validate (bool, optional): run the offsets checks on any device (a device sync).
            Default: ``False``.

    Returns:
        MultiJaggedTensor: a ``(B, …)`` view of ``values``.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> values = torch.arange(10.).view(5, 2)
        >>> x = mj.from_packed(values, torch.tensor([0, 3, 5]), torch.tensor([3, 2]))
        >>> [t.shape for t in x.unbind()]
        [torch.Size([3, 2]), torch.Size([2, 2])]
        >>> x[1]
        tensor([[6., 7.],
                [8., 9.]])
        >>> x.values().data_ptr() == values.data_ptr()
        True
        >>> sizes = torch.tensor([[2, 2], [1, 1]])  # a 2 x 2 and a 1 x 1 pair
        >>> pairs = mj.from_packed(torch.ones(5, 4), torch.tensor([0, 4, 5]), sizes, (1, 2))
        >>> pairs.dim(), pairs.ragged_dims
        (4, (1, 2))
    """
    op = "from_packed"
    _check_dense(op, "values", values)
    if not isinstance(values, torch.Tensor) or values.dim() < 1:
        raise TypeError(f"{op}(): expected values to be a tensor with a packed dim 0, got {type(values).__name__}")
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise TypeError(f"{op}(): expected offsets to be a 1-D tensor, got {getattr(offsets, 'shape', type(offsets))}")
    _check_dense(op, "offsets", offsets)
    if offsets.dtype != torch.int64:
        raise TypeError(f"{op}(): expected offsets of dtype torch.int64, got {offsets.dtype}")
    if offsets.device != values.device:
        raise ValueError(f"{op}(): expected offsets on the values' device {values.device}, got {offsets.device}")
    if not isinstance(sizes, torch.Tensor) or sizes.dtype != torch.int64:
        raise TypeError(f"{op}(): expected sizes to be an int64 tensor, got {getattr(sizes, 'dtype', type(sizes))}")
    rd = _ragged_dims_tuple(op, ragged_dims)
    ragged_dims = _check_ragged_dims(op, rd, len(rd) + values.dim())
    host = _host_ints(op, "sizes", sizes)
    if host.dim() == 1:
        host = host.unsqueeze(1)
    b = offsets.shape[0] - 1
    if b < 0:
        raise ValueError(f"{op}(): expected at least one offset (B + 1 >= 1), got none")
    if host.dim() != 2 or host.shape != (b, len(ragged_dims)):
        raise ValueError(f"{op}(): expected sizes of shape ({b}, {len(ragged_dims)}) for {b + 1} offsets, got {tuple(sizes.shape)}")
    _check_sizes(op, host)
    traced = _is_traced(values) or _is_traced(offsets)
    if not traced and offsets.device.type != "meta" and (validate or offsets.device.type == "cpu"):
        _check_offsets(op, offsets, values.shape[0], host.prod(1))
    if not traced:
        _check_rows(op, host, values.shape[0])
    partition = partition_from_sizes(host, values.device, offsets)
    return wrap_values(values, partition, ragged_dims)


def _check_sizes(op: str, host: torch.Tensor) -> None:
    if (host < 0).any():
        raise ValueError(f"{op}(): sizes must be non-negative, got {host.tolist()}")


def _check_rows(op: str, host: torch.Tensor, rows: int) -> None:
    total = int(host.prod(1).sum()) if host.numel() else 0  # SYNC: none — host sizes
    if total != rows:
        raise ValueError(
            f"{op}(): sizes describe {total} packed rows (the sum over samples of the product of "
            f"sizes), but values have {rows} rows"
        )


def _check_offsets(op: str, offsets: torch.Tensor, rows: int, counts: torch.Tensor) -> None:
    # SYNC: none for CPU offsets; for others the caller asked for validation.
    problem = offsets_problem("offsets", offsets.detach().cpu(), rows, counts)
    if problem:
        raise ValueError(f"{op}(): {problem}")


@eager_constructor("from_padded")  # NOTE [ Constructors under torch.compile ] in _frames.py
def from_padded(
    padded: torch.Tensor, lengths: torch.Tensor, ragged_dims: Sequence[int] | int = (1,)
) -> MultiJaggedTensor:
    r"""Cuts the valid region out of a padded tensor ``(B, max…)`` as a multi_jagged tensor.

    Sample ``i`` is ``padded[i]`` cut to its first ``lengths[i, k]`` entries along each ragged dim
    ``ragged_dims[k]``; the padding is dropped. The inverse of :func:`to_padded_tensor`.
    Differentiable w.r.t. ``padded``.

    Args:
        padded (Tensor): the dense ``(B, max…)`` tensor.
        lengths (Tensor): ``(B,)`` or ``(B, R)`` integers (or a nested list of them) with
            ``0 <= lengths[:, k] <= padded.shape[ragged_dims[k]]``.
        ragged_dims (int or sequence of ints, optional): the ``R`` logical ragged dims,
            increasing; an int is one dim. Default: ``(1,)``.

    Returns:
        MultiJaggedTensor: the valid region, shaped as ``padded`` but ragged along
        ``ragged_dims``.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.from_padded(torch.arange(6.).view(2, 3), torch.tensor([3, 1]))
        >>> x[0], x[1]
        (tensor([0., 1., 2.]), tensor([3.]))
        >>> images = mj.from_padded(torch.ones(2, 3, 4, 4), torch.tensor([[4, 2], [3, 4]]), (2, 3))
        >>> [t.shape for t in images.unbind()]
        [torch.Size([3, 4, 2]), torch.Size([3, 3, 4])]
    """
    op = "from_padded"
    if not isinstance(padded, torch.Tensor):
        raise TypeError(f"{op}(): expected padded to be a tensor, got {type(padded).__name__}")
    _check_dense(op, "padded", padded)
    ragged_dims = _check_ragged_dims(op, ragged_dims, padded.dim())
    if not isinstance(lengths, torch.Tensor):  # a list; an empty one (B = 0) has no dtype of its own
        lengths = torch.as_tensor(lengths, dtype=torch.int64 if len(lengths) == 0 else None)
    host = _host_ints(op, "lengths", lengths)
    if host.dim() == 1:
        host = host.unsqueeze(1)
    if host.shape != (padded.shape[0], len(ragged_dims)):
        raise ValueError(f"{op}(): expected lengths of shape ({padded.shape[0]}, {len(ragged_dims)}), got {tuple(host.shape)}")
    for k, d in enumerate(ragged_dims):
        col = host[:, k]
        if col.numel() and (bool((col > padded.shape[d]).any()) or bool((col < 0).any())):
            raise ValueError(f"{op}(): lengths along dim {d} must lie in [0, {padded.shape[d]}], got {col.tolist()}")
    partition = partition_from_sizes(host, padded.device)
    static = [s for d, s in enumerate(padded.shape) if d and d not in ragged_dims]
    # A structure-only template: no memory behind its values.
    like = MultiJaggedTensor(padded.new_zeros(()).expand(partition.rows, *static), partition, ragged_dims)
    return mj.from_padded_like(padded, like)


@eager_constructor("from_mask")  # NOTE [ Constructors under torch.compile ] in _frames.py
def from_mask(dense: torch.Tensor, mask: torch.Tensor) -> MultiJaggedTensor:
    r"""Keeps the positions of a dense tensor ``(B, N, …)`` where a mask is True, as ``(B, j, …)``.

    Sample ``i`` is ``dense[i][mask[i]]``, in order: a per-sample keep mask (the tokens kept
    after pruning, the valid tokens of an attention mask that is not a prefix).
    ``mask.sum(1)`` are the lengths. Differentiable w.r.t. ``dense``.

    Args:
        dense (Tensor): the dense ``(B, N, …)`` tensor.
        mask (Tensor): the ``(B, N)`` bool mask.

    Returns:
        MultiJaggedTensor: ``(B, j, …)``, ragged along dim 1.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> dense = torch.arange(8.).view(2, 4)
        >>> mask = torch.tensor([[True, False, True, False], [False, False, False, True]])
        >>> x = mj.from_mask(dense, mask)
        >>> x[0], x[1]
        (tensor([0., 2.]), tensor([7.]))
    """
    op = "from_mask"
    if not isinstance(dense, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise TypeError(f"{op}(): expected tensors, got {type(dense).__name__} and {type(mask).__name__}")
    _check_dense(op, "dense", dense)
    _check_dense(op, "mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{op}(): expected a bool mask, got {mask.dtype}")
    if dense.dim() < 2 or mask.shape != dense.shape[:2]:
        raise ValueError(f"{op}(): expected dense (B, N, …) and mask (B, N), got {tuple(dense.shape)} and {tuple(mask.shape)}")
    lengths = mask.sum(1).cpu().unsqueeze(1)  # SYNC: the new lengths size the structure
    partition = partition_from_sizes(lengths, dense.device)
    rows = dense[mask.to(dense.device)]  # row-major over (b, n): each sample's kept rows, in order
    return wrap_values(rows, partition, (1,))


def to_padded_tensor(x: MultiJaggedTensor, padding: float = 0.0, output_size=None) -> torch.Tensor:
    r"""Pads a multi_jagged tensor into a dense tensor ``(B, max…)``.

    Each ragged dim becomes its max size over the samples (or ``output_size``'s entry), and the
    cells outside a sample's valid region hold ``padding``. ``torch.nested.to_padded_tensor`` and
    ``x.to_padded_tensor`` call this for a multi_jagged ``x``. Differentiable w.r.t. ``x``.

    Args:
        x (MultiJaggedTensor): the batch to pad.
        padding (float, optional): the value of the padding cells. Default: ``0.0``.
        output_size (sequence of ints, optional): the size of the result, of length ``x.dim()``:
            ``output_size[0]`` is ``B``, every other entry at least its dim's (max) size.
            Default: ``None`` (the envelope).

    Returns:
        Tensor: the dense ``(B, max…)`` tensor.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(2), torch.ones(1)])
        >>> mj.to_padded_tensor(x, -1.0)
        tensor([[ 1.,  1.],
                [ 1., -1.]])
        >>> torch.nested.to_padded_tensor(x, 0.0, output_size=(2, 3))
        tensor([[1., 1., 0.],
                [1., 0., 0.]])
    """
    return mj.to_padded(x, float(padding), None if output_size is None else list(output_size))


def from_jagged(njt: torch.Tensor) -> MultiJaggedTensor:
    r"""Converts a ``torch.jagged`` nested tensor to multi_jagged, sharing its values and offsets.

    The result keeps ``njt``'s ragged dim and its nested int, so its shape equals ``njt``'s.
    The inverse of :func:`to_jagged`. Differentiable w.r.t. ``njt``.

    Args:
        njt (Tensor): a contiguous ``torch.jagged`` nested tensor (``njt.lengths()`` is
            ``None``; call ``.contiguous()`` first otherwise).

    Returns:
        MultiJaggedTensor: a view of ``njt``'s values with one ragged dim.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> njt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=torch.jagged)
        >>> x = mj.from_jagged(njt)
        >>> x.ragged_dims, x.shape == njt.shape
        ((1,), True)
        >>> x.values().data_ptr() == njt.values().data_ptr()
        True
    """
    if not (isinstance(njt, torch.Tensor) and njt.is_nested and njt.layout == torch.jagged):
        raise TypeError(f"from_jagged(): expected a torch.jagged nested tensor, got {type(njt).__name__}")
    jagged: Any = njt  # a NestedTensor: lengths(), offsets(), _ragged_idx are not in torch.Tensor's stubs
    if jagged.lengths() is not None:
        raise ValueError("from_jagged(): expected a contiguous torch.jagged tensor (lengths=None); call .contiguous() first")
    r = jagged._ragged_idx
    values = njt.values().movedim(r - 1, 0)
    offsets = jagged.offsets()
    off = offsets.detach().cpu()  # SYNC: once per conversion
    # torch.jagged does not check its offsets against its values (nested_tensor_from_jagged takes
    # them as given): rows no sample owns would be counted by whole-tensor ops
    problem = offsets_problem("offsets", off, values.shape[0], off.diff())
    if problem:
        raise ValueError(f"from_jagged(): the torch.jagged tensor's {problem}")
    host = off.diff().unsqueeze(1)
    partition = partition_from_sizes(host, values.device, offsets)
    return wrap_values(values, partition, (r,))


def to_jagged(x: MultiJaggedTensor) -> torch.Tensor:
    r"""Converts a multi_jagged tensor to a ``torch.jagged`` nested tensor, sharing values and offsets.

    ``torch.jagged`` holds one ragged dim: a tensor with several raises ``ValueError``. The
    result has the same shape (the same nested int). Same as ``x.to_jagged()``; the inverse of
    :func:`from_jagged`. Differentiable w.r.t. ``x``.

    Args:
        x (MultiJaggedTensor): a multi_jagged tensor with one ragged dim.

    Returns:
        Tensor: a ``torch.jagged`` nested tensor of the same shape.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
        >>> njt = mj.to_jagged(x)
        >>> njt.layout, njt.shape == x.shape
        (torch.jagged, True)
        >>> [t.shape for t in njt.unbind()]
        [torch.Size([2, 3]), torch.Size([1, 3])]
    """
    return x.to_jagged()


# ----------------------------------------------------------------------------- batch pieces
def _sub_partition(p: Partition, start: int, length: int) -> Partition:
    """Samples ``start .. start + length`` of ``p``: new offsets, hence new nested ints (as
    ``torch.jagged``'s ``chunk`` gives), with extent sharing kept (a square pair stays square).
    All of ``p``'s samples are ``p`` itself: ``x[0:B]`` has ``x``'s shape, nested ints included."""
    if start == 0 and length == p.batch:
        return p
    moved: dict[int, RaggedExtent] = {}
    extents = []
    for e in p.extents:
        if id(e) not in moved:
            moved[id(e)] = RaggedExtent.from_lengths(e.host_lengths()[start : start + length].clone(), p.offsets.device)
        extents.append(moved[id(e)])
    return register_partition(Partition.from_extents(extents))


def split_batch(x: MultiJaggedTensor, bounds: Sequence[tuple[int, int]]) -> tuple[MultiJaggedTensor, ...]:
    """Sub-batches ``(start, length)`` of ``x`` along the batch dim, consecutive and covering it
    (the ``split`` family and ``narrow`` on dim 0). Each piece is a view of ``x``'s values (one
    ``split`` of the packed rows, so backward is one ``cat``), with its own offsets and nested
    ints. Differentiable. Eager only: new nested ints cannot be minted in a compiled graph."""
    p = x._partition
    if any(_is_traced(e.offsets) for e in p.extents):
        raise NotImplementedError(
            "split(): splitting the batch dim of a multi_jagged tensor inside torch.compile is not supported "
            "(each piece needs new nested ints); split the batch before the compiled region"
        )
    # SYNC: none — host sizes; the packed rows of each piece.
    rows = p.host_sizes().prod(1) if p.batch else torch.zeros(0, dtype=torch.int64)
    row_bounds = _exclusive_cumsum_host(rows)
    lengths = [int(row_bounds[s + n] - row_bounds[s]) for s, n in bounds]
    first = int(row_bounds[bounds[0][0]]) if bounds else 0
    values = values_of(x)
    if first or sum(lengths) != values.shape[0]:
        values = values.narrow(0, first, sum(lengths))
    pieces = values.split(lengths) if len(bounds) != 1 else (values,)
    return tuple(wrap_values(v, _sub_partition(p, s, n), x._ragged_dims) for v, (s, n) in zip(pieces, bounds))


def select_batch(x: MultiJaggedTensor, index: torch.Tensor) -> MultiJaggedTensor:
    """``x[index]`` / ``x.index_select(0, index)``: the samples ``index`` (a 1-D integer tensor,
    negative entries from the end, repeats allowed), in that order — a gather of their packed
    rows (differentiable: a scatter-add back), with new offsets and so new nested ints, extent
    sharing kept. Eager only, as ``split_batch``."""
    p = x._partition
    if any(_is_traced(e.offsets) for e in p.extents):
        raise NotImplementedError(
            "index(): selecting samples of a multi_jagged tensor inside torch.compile is not supported (the "
            "selection needs new nested ints); select before the compiled region"
        )
    b = p.batch
    idx = index.to("cpu", torch.int64).reshape(-1)  # SYNC: the sample indices, once per selection
    bad = (idx < -b) | (idx >= b)
    if bool(bad.any()):
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for dimension 0 with size {b}")
    idx = torch.where(idx < 0, idx + b, idx)
    moved: dict[int, RaggedExtent] = {}
    extents = []
    for e in p.extents:
        if id(e) not in moved:
            moved[id(e)] = RaggedExtent.from_lengths(e.host_lengths()[idx].clone(), p.offsets.device)
        extents.append(moved[id(e)])
    sub = register_partition(Partition.from_extents(extents))
    rows = p.host_sizes().prod(1) if b else torch.zeros(0, dtype=torch.int64)
    starts = _exclusive_cumsum_host(rows)[:-1]
    counts = rows[idx]
    # every selected sample's rows: its start spread over its rows, plus the rank within it
    first = torch.repeat_interleave(starts[idx], counts)
    rank = torch.arange(int(counts.sum())) - torch.repeat_interleave(_exclusive_cumsum_host(counts)[:-1], counts)
    rows_index = (first + rank).to(p.offsets.device)
    return wrap_values(values_of(x).index_select(0, rows_index), sub, x._ragged_dims)


def cat_batch(tensors: Sequence[MultiJaggedTensor]) -> MultiJaggedTensor:
    """``torch.cat(tensors, 0)``: the batches' samples one after another — their packed values
    concatenated, new offsets and so new nested ints. The batches must have one layout: the same
    ragged dims, static sizes and device, as dense ``cat`` needs equal sizes on every other dim.
    Two ragged dims share one nested int in the result where they share one in every batch with
    samples (square pairs stay square; a rectangular batch and one whose samples happen to be
    square, or an empty one, give a rectangular batch). Differentiable; eager only."""
    first = tensors[0]
    p0 = first._partition

    def sharing(t):
        ids = [id(e) for e in t._partition.extents]
        return tuple(ids.index(i) for i in ids)

    for t in tensors[1:]:
        if (not isinstance(t, MultiJaggedTensor) or t._ragged_dims != first._ragged_dims or t.dim() != first.dim()
                or t._values.shape[1:] != first._values.shape[1:]):
            raise RuntimeError(
                f"cat(): along the batch dim, expected multi_jagged tensors of one layout (ragged dims, static sizes), "
                f"got {tuple(first.shape)} and {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
        if t.device != first.device:
            raise RuntimeError(f"cat(): expected all tensors on one device, got {first.device} and {t.device}")
    if any(_is_traced(e.offsets) for t in tensors for e in t._partition.extents):
        raise NotImplementedError(
            "cat(): joining batches of a multi_jagged tensor inside torch.compile is not supported (the result needs "
            "new nested ints); join them before the compiled region"
        )
    if len(tensors) == 1:  # a copy of one batch: its own shape, nested ints included, as dense cat's
        return wrap_values(torch.cat([values_of(first)]), p0, first._ragged_dims)
    live = [sharing(t) for t in tensors if t._partition.batch] or [sharing(first)]
    moved: dict[tuple, RaggedExtent] = {}
    extents = []
    for k in range(len(p0.extents)):
        key = tuple(s[k] for s in live)  # the dims sharing dim k's extent in every batch
        if key not in moved:
            lengths = torch.cat([t._partition.extents[k].host_lengths() for t in tensors])
            moved[key] = RaggedExtent.from_lengths(lengths, p0.offsets.device)
        extents.append(moved[key])
    part = register_partition(Partition.from_extents(extents))
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])  # as dense cat, over any number
    return wrap_values(torch.cat([values_of(t).to(dtype) for t in tensors]), part, first._ragged_dims)


def _exclusive_cumsum_host(n: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(n.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(n, 0, out=out[1:])
    return out


def narrow_batch(x: MultiJaggedTensor, start, length) -> MultiJaggedTensor:
    """``x.narrow(0, start, length)``: samples ``start .. start + length`` as a view of ``x``'s
    values (``split_batch``); ``start`` may be negative, as dense ``narrow`` allows."""
    # dense torch's own checks and negative-start rule, on a meta tensor of the batch size
    probe = torch.empty(x._partition.batch, device="meta").narrow(0, start, length)
    return split_batch(x, [(int(probe.storage_offset()), probe.shape[0])])[0]


def is_nested(x) -> bool:
    r"""Returns whether ``x`` is a nested tensor of any layout.

    True for ``torch.jagged``, ``torch.strided`` nested and ``multi_jagged`` tensors. Use it where
    ``torch.jagged`` code branches on ``x.is_nested``, which is False for this layout
    (docs/design.md, "``is_nested``": True would make torch.compile, ``autograd.grad`` with
    ``grad_outputs``, ``nn.MultiheadAttention`` and DataLoader workers treat the tensor as a C++
    nested tensor).

    Args:
        x (object): any object.

    Returns:
        bool: whether ``x`` is a nested tensor.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
        >>> x.is_nested, mj.is_nested(x)
        (False, True)
        >>> mj.is_nested(torch.nested.nested_tensor([torch.ones(2), torch.ones(1)], layout=torch.jagged))
        True
        >>> mj.is_nested(torch.ones(2, 3))
        False
    """
    return isinstance(x, MultiJaggedTensor) or (isinstance(x, torch.Tensor) and x.is_nested)


def occupancy(x: MultiJaggedTensor) -> float:
    r"""Returns the valid fraction of the padded envelope ``(B, max…)`` of a multi_jagged tensor.

    ρ = (valid cells) / (B · Π max extents); the padding rate is ``1 - ρ``. Same as
    ``x.occupancy()``.

    Args:
        x (MultiJaggedTensor): the batch.

    Returns:
        float: ρ, in ``[0, 1]``; 1.0 when the envelope is empty.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(4, 3), torch.ones(2, 3)])
        >>> mj.occupancy(x)
        0.75
        >>> s = mj.nested_tensor([torch.ones(2, 8), torch.ones(4, 8)])
        >>> mj.occupancy(s.unsqueeze(-2) + s.unsqueeze(-3))  # 2·2 + 4·4 cells of 2·4·4
        0.625
    """
    return x.occupancy()
