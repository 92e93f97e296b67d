"""Constructors and conversions (DESIGN.md §2) and the ``torch.nested`` integration."""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from .bridge import values_of, wrap_values
from .kernels import reference as ref
from .layout import multi_jagged
from .ops import _common
from .structure import Partition, RaggedExtent
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
]

mj = torch.ops.multijagged


# ----------------------------------------------------------------------------- structure
def _extents_for(host_sizes: torch.Tensor, device, offsets_for_single: Optional[torch.Tensor] = None):
    """One extent per ragged dim; dims with equal per-sample sizes share one (one nested int)."""
    extents: list[RaggedExtent] = []
    r = host_sizes.shape[1]
    for k in range(r):
        col = host_sizes[:, k].contiguous()
        for j in range(k):
            if torch.equal(host_sizes[:, j], col):
                extents.append(extents[j])
                break
        else:
            off = offsets_for_single if r == 1 else None
            extents.append(RaggedExtent.from_lengths(col, device, offsets=off))
    return extents


def _partition(host_sizes: torch.Tensor, device, offsets: Optional[torch.Tensor] = None) -> Partition:
    extents = _extents_for(host_sizes, device, offsets)
    if len(extents) == 1:
        p = Partition(extents, extents[0].offsets, extents[0].total)
    else:
        p = Partition.from_extents(extents)
        if offsets is not None:
            p = Partition(p.extents, offsets, p.rows)
    return _common.register_partition(p)


def _check_ragged_dims(op: str, ragged_dims: Sequence[int], ndim: int) -> tuple[int, ...]:
    rd = tuple(int(d) for d in ragged_dims)
    if not rd or list(rd) != sorted(set(rd)) or rd[0] < 1 or rd[-1] >= ndim:
        raise ValueError(
            f"{op}(): expected ragged_dims to be increasing logical dims in [1, {ndim - 1}], got {tuple(ragged_dims)}"
        )
    return rd


def _infer(op: str, tensors: Sequence[torch.Tensor], ragged_dims) -> tuple[tuple[int, ...], torch.Tensor]:
    """Ragged dims (logical) and (B, R) host sizes for a list of components."""
    if len(tensors) == 0:
        raise ValueError(f"{op}(): cannot infer the structure of an empty list; use from_packed for B = 0")
    first = tensors[0]
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}(): expected a list of tensors, got {type(t).__name__}")
        if t.dim() != first.dim():
            raise ValueError(f"{op}(): expected components of equal rank, got {first.dim()} and {t.dim()}")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}(): expected components of one dtype and device, got {t.dtype}/{t.device} and {first.dtype}/{first.device}")
    if first.dim() == 0:
        raise ValueError(f"{op}(): cannot build a multi_jagged tensor from 0-dim components")
    shapes = torch.tensor([list(t.shape) for t in tensors], dtype=torch.int64)
    if ragged_dims is None:
        varying = (shapes != shapes[0]).any(0).nonzero().flatten().tolist()
        ragged_dims = tuple(d + 1 for d in varying) or (1,)
    else:
        ragged_dims = _check_ragged_dims(op, ragged_dims, first.dim() + 1)
    static = [d for d in range(first.dim()) if d + 1 not in ragged_dims]
    if static and (shapes[:, static] != shapes[0, static]).any():
        bad = [d + 1 for d in static if (shapes[:, d] != shapes[0, d]).any()]
        raise ValueError(f"{op}(): dims {bad} differ across components but are not in ragged_dims={ragged_dims}")
    return ragged_dims, shapes[:, [d - 1 for d in ragged_dims]].contiguous()


class _FromComponents(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partition, ragged_dims, *components):  # type: ignore[override]
        values = ref.pack_components(components, ragged_dims)
        return MultiJaggedTensor(values, partition, ragged_dims)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        comps = ref.unpack_components(grad._values, grad._partition.host_sizes(), grad._ragged_dims)
        return (None, None, *comps)


def as_nested_tensor(
    tensors: Sequence[torch.Tensor],
    *,
    ragged_dims: Optional[Sequence[int]] = None,
    dtype: Optional[torch.dtype] = None,
    device=None,
) -> MultiJaggedTensor:
    """Pack ``tensors`` into a ``(B, …)`` multi_jagged tensor, differentiable w.r.t. them."""
    tensors = list(tensors)
    ragged_dims, sizes = _infer("as_nested_tensor", tensors, ragged_dims)
    if dtype is not None or device is not None:
        tensors = [t.to(dtype=dtype, device=device) for t in tensors]
    partition = _partition(sizes, tensors[0].device)
    return _FromComponents.apply(partition, ragged_dims, *tensors)


def nested_tensor(
    tensors: Sequence[torch.Tensor],
    *,
    ragged_dims: Optional[Sequence[int]] = None,
    dtype: Optional[torch.dtype] = None,
    device=None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> MultiJaggedTensor:
    """A new leaf ``(B, …)`` multi_jagged tensor holding a copy of ``tensors``."""
    tensors = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in tensors]
    ragged_dims, sizes = _infer("nested_tensor", tensors, ragged_dims)
    with torch.no_grad():
        values = ref.pack_components([t.detach() for t in tensors], ragged_dims)
        values = values.to(dtype=dtype, device=device)
    if pin_memory:
        values = values.pin_memory()
    partition = _partition(sizes, values.device)
    return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)


def from_packed(
    values: torch.Tensor,
    offsets: torch.Tensor,
    sizes: torch.Tensor,
    ragged_dims: Sequence[int] = (1,),
    *,
    validate: bool = False,
) -> MultiJaggedTensor:
    """Zero-copy view of packed ``values`` ``(T, *static)`` as a multi_jagged tensor.

    ``offsets``: (B+1,) int64 row offsets on the values' device; ``sizes``: (B, R) (or (B,) for
    R = 1) int64 per-sample extents of ``ragged_dims``. Cheap checks always run; with
    ``validate=True`` the data-dependent ones too (offsets start at 0, increase, end at T, and
    agree with ``sizes``). For one ragged dim the nested int is keyed on ``offsets`` itself."""
    op = "from_packed"
    if not isinstance(values, torch.Tensor) or values.dim() < 1:
        raise TypeError(f"{op}(): expected values to be a tensor with a packed dim 0, got {type(values).__name__}")
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise TypeError(f"{op}(): expected offsets to be a 1-D tensor, got {getattr(offsets, 'shape', type(offsets))}")
    if offsets.dtype != torch.int64:
        raise TypeError(f"{op}(): expected offsets of dtype torch.int64, got {offsets.dtype}")
    if offsets.device != values.device:
        raise ValueError(f"{op}(): expected offsets on the values' device {values.device}, got {offsets.device}")
    if not isinstance(sizes, torch.Tensor) or sizes.dtype != torch.int64:
        raise TypeError(f"{op}(): expected sizes to be an int64 tensor, got {getattr(sizes, 'dtype', type(sizes))}")
    ragged_dims = _check_ragged_dims(op, ragged_dims, len(tuple(ragged_dims)) + values.dim())
    # SYNC: a host copy of the sizes, once per constructed tensor (Python-side decisions).
    host = sizes.detach().cpu()
    if host.dim() == 1:
        host = host.unsqueeze(1)
    b = offsets.shape[0] - 1
    if host.dim() != 2 or host.shape != (b, len(ragged_dims)):
        raise ValueError(f"{op}(): expected sizes of shape ({b}, {len(ragged_dims)}) for {b + 1} offsets, got {tuple(sizes.shape)}")
    if b < 0:
        raise ValueError(f"{op}(): expected at least one offset (B + 1 >= 1), got none")
    if validate:
        _validate_offsets(op, offsets, host, values.shape[0])
    partition = _partition(host, values.device, offsets)
    return wrap_values(values, partition, ragged_dims)


def _validate_offsets(op: str, offsets: torch.Tensor, host: torch.Tensor, rows: int) -> None:
    # SYNC: validation reads the offsets on the host, by request.
    off = offsets.detach().cpu()
    if (host < 0).any():
        raise ValueError(f"{op}(): sizes must be non-negative, got {host.tolist()}")
    if off[0] != 0:
        raise ValueError(f"{op}(): offsets must start at 0, got offsets[0] = {int(off[0])}")
    if (off.diff() < 0).any():
        raise ValueError(f"{op}(): offsets must be non-decreasing, got {off.tolist()}")
    if off[-1] != rows:
        raise ValueError(f"{op}(): offsets must end at the packed row count {rows}, got offsets[-1] = {int(off[-1])}")
    counts = host.prod(1)
    if not torch.equal(off.diff(), counts):
        raise ValueError(
            f"{op}(): offsets disagree with sizes: rows per sample {off.diff().tolist()} vs product of sizes {counts.tolist()}"
        )


def from_padded(
    padded: torch.Tensor, lengths: torch.Tensor, ragged_dims: Sequence[int] = (1,)
) -> MultiJaggedTensor:
    """The valid region of a padded ``(B, max…)`` tensor; ``lengths``: (B,) or (B, R). Differentiable."""
    op = "from_padded"
    ragged_dims = _check_ragged_dims(op, ragged_dims, padded.dim())
    # SYNC: a host copy of the lengths, once per constructed tensor.
    host = torch.as_tensor(lengths).detach().to("cpu", torch.int64)
    if host.dim() == 1:
        host = host.unsqueeze(1)
    if host.shape != (padded.shape[0], len(ragged_dims)):
        raise ValueError(f"{op}(): expected lengths of shape ({padded.shape[0]}, {len(ragged_dims)}), got {tuple(host.shape)}")
    for k, d in enumerate(ragged_dims):
        if host.numel() and (host[:, k].max() > padded.shape[d] or host[:, k].min() < 0):
            raise ValueError(f"{op}(): lengths along dim {d} must lie in [0, {padded.shape[d]}], got {host[:, k].tolist()}")
    partition = _partition(host, padded.device)
    static = [s for d, s in enumerate(padded.shape) if d and d not in ragged_dims]
    # A structure-only template: no memory behind its values.
    like = MultiJaggedTensor(padded.new_zeros(()).expand(partition.rows, *static), partition, ragged_dims)
    return mj.from_padded_like(padded, like)


def to_padded_tensor(x: MultiJaggedTensor, padding: float = 0.0, output_size=None) -> torch.Tensor:
    """Dense envelope ``(B, max…)`` with ``padding`` outside the valid region. Differentiable."""
    return mj.to_padded(x, float(padding), None if output_size is None else list(output_size))


def from_jagged(njt: torch.Tensor) -> MultiJaggedTensor:
    """A ``torch.jagged`` tensor as multi_jagged, sharing its values and offsets (and so its
    nested int). Differentiable."""
    if not (isinstance(njt, torch.Tensor) and njt.is_nested and njt.layout == torch.jagged):
        raise TypeError(f"from_jagged(): expected a torch.jagged nested tensor, got {type(njt).__name__}")
    if njt.lengths() is not None:
        raise ValueError("from_jagged(): expected a contiguous torch.jagged tensor (lengths=None); call .contiguous() first")
    r = njt._ragged_idx
    values = njt.values().movedim(r - 1, 0)
    offsets = njt.offsets()
    host = offsets.diff().cpu().unsqueeze(1)  # SYNC: once per conversion
    partition = _partition(host, values.device, offsets)
    return wrap_values(values, partition, (r,))


def to_jagged(x: MultiJaggedTensor) -> torch.Tensor:
    """As ``torch.jagged`` (one ragged dim only), sharing values and offsets. Differentiable."""
    if len(x._ragged_dims) != 1:
        raise ValueError(f"to_jagged(): torch.jagged holds one ragged dim, got ragged dims {x._ragged_dims}")
    r = x._ragged_dims[0]
    values = values_of(x).movedim(0, r - 1)
    return torch.nested.nested_tensor_from_jagged(values, x._partition.offsets, jagged_dim=r)


def occupancy(x: MultiJaggedTensor) -> float:
    """ρ = (valid cells) / (B · Π max extents): the valid fraction of the padded envelope."""
    p = x._partition
    envelope = p.batch
    for e in p.extents:
        envelope *= int(e.max)
    return 1.0 if envelope == 0 else int(p.rows) / envelope


# ----------------------------------------------------------------------------- torch.nested
_ORIGINAL: dict[str, object] = {}


def _install() -> None:
    """Teach ``torch.nested`` the ``multi_jagged`` layout; other layouts are untouched."""
    if _ORIGINAL:
        return
    tn = torch.nested
    for name in ("nested_tensor", "as_nested_tensor", "to_padded_tensor"):
        _ORIGINAL[name] = getattr(tn, name)

    @functools.wraps(_ORIGINAL["nested_tensor"])
    def nested_tensor_(tensor_list, *, dtype=None, layout=None, device=None, requires_grad=False, pin_memory=False):
        if layout is multi_jagged:
            return nested_tensor(tensor_list, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)
        return _ORIGINAL["nested_tensor"](
            tensor_list, dtype=dtype, layout=layout, device=device, requires_grad=requires_grad, pin_memory=pin_memory
        )

    @functools.wraps(_ORIGINAL["as_nested_tensor"])
    def as_nested_tensor_(ts, dtype=None, device=None, layout=None):
        if layout is multi_jagged:
            return as_nested_tensor(ts, dtype=dtype, device=device)
        return _ORIGINAL["as_nested_tensor"](ts, dtype=dtype, device=device, layout=layout)

    @functools.wraps(_ORIGINAL["to_padded_tensor"])
    def to_padded_tensor_(input, padding, output_size=None, out=None):
        if isinstance(input, MultiJaggedTensor):
            if out is not None:
                raise NotImplementedError("to_padded_tensor(): out= is not supported for layout torch.multi_jagged")
            return to_padded_tensor(input, padding, output_size)
        if out is None:
            return _ORIGINAL["to_padded_tensor"](input, padding, output_size)
        return _ORIGINAL["to_padded_tensor"](input, padding, output_size, out=out)

    tn.nested_tensor = nested_tensor_
    tn.as_nested_tensor = as_nested_tensor_
    tn.to_padded_tensor = to_padded_tensor_
    torch.multi_jagged = multi_jagged  # type: ignore[attr-defined]
