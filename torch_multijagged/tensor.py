"""``MultiJaggedTensor``: a traceable wrapper subclass with several ragged dims.

NOTE [ Subclass mechanism ]

``MultiJaggedTensor`` is a plain wrapper subclass (``_make_wrapper_subclass``) *without* the
``NestedTensor`` dispatch key. Autograd sees the wrapper: every op runs its aten derivative
formula on wrappers, and every wrapper op — forward and backward — lands in
``__torch_dispatch__``, where a handler from the op table (``ops/``) does the work on the packed
``values``. Structure-changing ops (broadcast into a pair, reductions over ragged dims) are
ordinary aten ops here (``add``, ``sum.dim_IntList``, ``expand``), so the autograd engine's own
un-broadcasting (``sum_to_size``) and re-broadcasting (``expand``) are segment sums and gathers.

Why not subclass NJT's ``NestedTensor``: dynamo requires that for the ``NestedTensor`` key, and
NJT's code assumes a single ``_ragged_idx``. Why not the key at all: without it there is no
``CompositeImplicitAutogradNestedTensor`` kernel, so composite ops whose decomposition reshapes
across the ragged dims (``linear``, ``matmul``, ``mean`` over a ragged dim, ``group_norm``) are
*routed* in ``__torch_function__`` to ops that reach dispatch intact (``ops/_routing.py``) or to
a computation on the packed values (``ops/bridged.py``); a route never computes anything itself.
``docs/design.md`` records what was tried and measured.

The logical size holds one nested int per ragged dim (NOTE [ Ragged extents and nested ints ]).
Strides and contiguity are what ``torch.jagged`` reports for the same logical tensor: the values'
strides read with the packed dim at the first ragged dim's place, and for one ragged dim the batch
stride ``row·j0`` (NOTE [ Contiguity as torch.jagged reports it ] in ops/shape/views.py); with several
ragged dims the batch stride is the packed-row stride, since nested ints cannot be multiplied
together. ``is_nested`` stays False (docs/design.md §14; ``torch_multijagged.is_nested``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import pathlib
import re
import sys
import weakref
from typing import Optional

import torch
import torch.autograd.forward_ad as _fwad
from torch.utils.weak import WeakTensorKeyDictionary

from . import _frames
from .errors import StructureError, op_label
from .layout import multi_jagged
from .kernels.per_image import pack_images
from .serialization import INTERNAL_ATTRS, copy_partition, partition_from_file, user_state
from .structure import Partition, RaggedExtent, _is_traced
from .wrappers import _built, _new_wrapper
from .writes import (
    _differentiable, _eager, _refuse_traced_alias_write, _targets, _written_through_alias,
    WRITE_CLOCK, check_not_written_through_alias, record_write, refuse_split_piece_write,
    refuse_untracked_view_write, written_args,
)

__all__ = ["MultiJaggedTensor"]

aten = torch.ops.aten


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _rebuild(values, offsets, extent_offsets, ragged_dims, requires_grad):
    """Serialization entry point (module level so that pickle can name it; NOTE [ Serialized
    form ] in ``serialization.py``)."""
    partition = partition_from_file(values, offsets, extent_offsets, ragged_dims, requires_grad, MultiJaggedTensor)
    return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)


# NOTE [ Extents across a compiled region ]
#
# A compiled function returns its outputs through ``__tensor_unflatten__``, which rebuilds their
# extents from the inner tensors. When an output's offsets are an input's offsets (the same
# tensor object, so the same nested int), the input's extent is reused rather than a new one
# made: the caches on an extent (the partition a flattened dim came from, the extents that size
# rules mapped it to) then survive the region, and ``t.flatten(2)`` → compiled block →
# ``unflatten`` works as it does eagerly. ``__tensor_flatten__`` (where dynamo meets an input)
# records each real offsets tensor's extent, both held weakly (a table, not an attribute on the
# tensor, which ``torch.save`` would try to pickle).

_EXTENT_OF: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def _known_extent(offsets: torch.Tensor, carriers) -> Optional[RaggedExtent]:
    ref = _EXTENT_OF.get(offsets) if type(offsets) is torch.Tensor else None
    e = ref() if ref is not None else None
    if e is None or e.offsets is not offsets:
        return None
    if (e.total, e.max, e.sum_sq) != tuple(c.shape[0] for c in carriers):
        return None
    return e


_DisableTF = torch._C.DisableTorchFunctionSubclass
_inference_mode = torch.is_inference_mode_enabled


class _PackOnRead:
    """``_values`` of a wrapper that holds per-image pieces instead (NOTE [ Per-image pieces ] in
    ``pieces.py``): packed on first read, stored, and the pieces forgotten. A non-data
    descriptor, so a wrapper with values reads them from its ``__dict__`` at no extra cost."""

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        rec = obj.__dict__.pop("_pieces", None)
        if rec is None:
            raise AttributeError("'MultiJaggedTensor' object has no attribute '_values'")
        with _DisableTF():
            dtype, device, inference = obj.dtype, obj.device, obj.is_inference()
        # the layout the wrapper reports (channels of unit stride, or lead-major: a (C, P) buffer);
        # values of a normal wrapper read under inference_mode must not be inference tensors
        lead_major = obj._strides[1] != 1
        with contextlib.nullcontext() if inference else torch.inference_mode(False):
            v = pack_images(rec[0], obj._partition.rows, obj._size[1], dtype, device, lead_major)
        obj.__dict__["_values"] = v
        return v


class MultiJaggedTensor(torch.Tensor):
    r"""A batch of ``B`` dense tensors of common rank whose extents may differ in several dims.

    The logical shape holds one nested int per ragged dim, e.g. ``(B, j0, j0, C)`` for square
    pairs. Storage: ``values`` ``(T, *static)`` with the ragged dims flattened into packed rows
    (row-major over the sample's ragged coordinates), split by ``offsets`` ``(B+1,)``; see NOTE
    [ Packed-row partition ] in structure.py. Every op equals the dense op applied per sample.
    ``x.is_nested`` is False: use :func:`torch_multijagged.is_nested`.

    Built by the constructors (:func:`torch_multijagged.nested_tensor`, ``as_nested_tensor``,
    ``from_packed``, ``from_padded``, ``from_mask``, ``from_jagged``, or
    ``torch.nested.nested_tensor(..., layout=torch.multi_jagged)``) rather than called directly.

    Args:
        values (Tensor): the packed ``(T, *static)`` values.
        partition (Partition): the packed-row partition of the batch (internal: the
            constructors build it).
        ragged_dims (tuple of ints): the logical ragged dims, increasing, each at least 1.

    Keyword args:
        requires_grad (bool, optional): whether autograd records operations on the result.
            Default: ``False``.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
        >>> isinstance(x, mj.MultiJaggedTensor), x.dim(), x.ragged_dims
        (True, 3, (1,))
        >>> x.shape  # doctest: +ELLIPSIS
        torch.Size([2, j..., 3])
        >>> [t.shape for t in x.unbind()]
        [torch.Size([2, 3]), torch.Size([1, 3])]
    """

    # ``_values`` shadows Tensor._values() (sparse), a method in torch's stubs; the class attribute is
    # read only when an instance holds no values (per-image pieces instead)
    _values: torch.Tensor = _PackOnRead()  # type: ignore[assignment]
    _partition: Partition
    _ragged_dims: tuple[int, ...]
    _size: tuple
    _strides: tuple

    @staticmethod
    def __new__(cls, values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...], *,
                requires_grad: bool = False):
        if values._is_zerotensor():  # NOTE [ Zero tensors never become values ]
            values = torch.zeros(values.shape, dtype=values.dtype, device=values.device)
        if _eager():  # NOTE [ Building a wrapper ] in wrappers.py
            key = ("wrapper", ragged_dims, values.shape[1:], values.stride(), values.dtype, values.device, cls,
                   _inference_mode())
            r, size, stride = _built(cls, partition, key, lambda: partition.logical_size_stride(values, ragged_dims),
                                     values.dtype, values.device, requires_grad)
        else:
            size, stride, stored = partition.logical_size_stride(values, ragged_dims)
            with _DisableTF():
                r = _new_wrapper(cls, size, stored, values.dtype, values.device, requires_grad)
        r._values = values
        r._partition = partition
        r._ragged_dims = ragged_dims
        r._size = size
        r._strides = stride
        return r

    # ------------------------------------------------------------------ public accessors
    @property
    def layout(self):  # type: ignore[override]
        r"""The layout of the tensor: :data:`torch_multijagged.multi_jagged`.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
            >>> x.layout
            torch.multi_jagged
            >>> x.layout is torch.multi_jagged
            True
        """
        return multi_jagged

    @property
    def ragged_dims(self) -> tuple[int, ...]:
        r"""The logical dims whose sizes may differ per sample, increasing (a tuple of ints).

        Every other dim but the batch dim 0 is static: one size for all samples. The shape
        holds a nested int at each ragged dim.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> s = mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)])
            >>> s.ragged_dims
            (1,)
            >>> pair = s.unsqueeze(-2) + s.unsqueeze(-3)
            >>> pair.ragged_dims
            (1, 2)
            >>> [t.shape for t in pair.unbind()]
            [torch.Size([2, 2, 8]), torch.Size([3, 3, 8])]
        """
        return self._ragged_dims

    def values(self) -> torch.Tensor:
        r"""Returns the packed values ``(T, *static)``, differentiably.

        The ragged dims are flattened into packed rows (row-major over each sample's ragged
        coordinates), sample after sample; ``offsets()`` splits them by sample. A view of the
        storage, not a copy; gradients flow back to ``self``. With one ragged dim ``r > 1`` the
        rows sit at dim ``r - 1``, as ``torch.jagged``'s ``values()`` (``(B, H, j0, D)`` gives
        ``(H, T, D)``), so ``nested_tensor_from_jagged(x.values(), x.offsets(), jagged_dim=r)``
        rebuilds ``x``.

        Returns:
            Tensor: the ``(T, *static)`` packed values, ``T`` the number of packed rows (at dim
            ``r - 1`` for one ragged dim ``r``).

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.arange(6.).view(3, 2), torch.arange(2.).view(1, 2)])
            >>> x.values()
            tensor([[0., 1.],
                    [2., 3.],
                    [4., 5.],
                    [0., 1.]])
        """
        _check_fresh(self, "values")
        v = values_of(self)
        rd = self._ragged_dims
        return v.movedim(0, rd[0] - 1) if len(rd) == 1 and rd[0] > 1 else v

    def offsets(self, dim: int | None = None) -> torch.Tensor:
        r"""Returns the offsets of the samples in the packed rows, or of one ragged dim's sizes.

        Without ``dim``: sample ``i`` is packed rows ``offsets[i] .. offsets[i + 1]`` of
        ``values()``. With ``dim``: the exclusive prefix sum of that ragged dim's per-sample
        sizes, the tensor its nested int is keyed on (as ``torch.jagged``'s ``offsets()``). For
        one ragged dim the two agree.

        Args:
            dim (int, optional): a ragged dim (negative counts from the end). Default: ``None``
                (the sample offsets).

        Returns:
            Tensor: ``(B+1,)`` int64, on the values' device.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> s = mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)])
            >>> s.offsets()
            tensor([0, 2, 5])
            >>> pair = s.unsqueeze(-2) + s.unsqueeze(-3)
            >>> pair.offsets(), pair.offsets(dim=2)
            (tensor([ 0,  4, 13]), tensor([0, 2, 5]))
        """
        if dim is None:
            return self._partition.offsets
        return self._partition.extents[self._ragged_index("offsets", dim)].offsets

    def _ragged_index(self, op: str, dim: int) -> int:
        d = dim + len(self._size) if dim < 0 else dim
        if d not in self._ragged_dims:
            raise ValueError(f"{op}(): expected a ragged dim {self._ragged_dims}, got {dim}")
        return self._ragged_dims.index(d)

    def cu_seqlens(self, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        r"""Returns the sequence boundaries for calling varlen attention kernels yourself.

        Flash-attn's ``cu_seqlens``: attention runs along the last ragged dim, and every
        (sample, coordinates of the other ragged dims) is one sequence of consecutive packed
        rows. For ``(B, j0, C)`` or ``(B, H, j0, D)`` this is ``offsets()``; for a pair
        ``(B, j0, j0, C)`` each row of each sample is a sequence. Raises ``ValueError`` for a
        tensor without a ragged dim.

        Args:
            dtype (:class:`torch.dtype`, optional): the dtype of the result. Default:
                ``torch.int32``, as flash-attn requires.

        Returns:
            Tensor: ``(S+1,)`` boundaries of the ``S`` sequences in the packed rows.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> s = mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)])
            >>> s.cu_seqlens()
            tensor([0, 2, 5], dtype=torch.int32)
            >>> pair = s.unsqueeze(-2) + s.unsqueeze(-3)
            >>> pair.cu_seqlens(torch.int64)
            tensor([ 0,  2,  4,  7, 10, 13])
        """
        if not self._ragged_dims:
            raise ValueError("cu_seqlens(): expected a tensor with a ragged dim")
        return self._partition.segments()[0].to(dtype)

    def max_seqlen(self) -> int:
        r"""Returns the length of the longest sequence of ``cu_seqlens()``.

        The max size of the last ragged dim over the samples, known on the host (no device
        sync). Raises ``ValueError`` for a tensor without a ragged dim.

        Returns:
            int: the max per-sample size of the last ragged dim.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8), torch.ones(0, 8)])
            >>> x.max_seqlen()
            3
        """
        if not self._ragged_dims:
            raise ValueError("max_seqlen(): expected a tensor with a ragged dim")
        return self._partition.extents[-1].max

    def lengths(self) -> None:
        r"""Returns ``None``, as ``torch.jagged``'s ``lengths()`` of a tensor without holes.

        This layout stores no holes: every sample is all of its packed rows. The per-sample
        extents are ``sizes()``.

        Returns:
            None

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
            >>> x.lengths() is None
            True
        """
        return None

    # torch.jagged's private metadata, which its own tests and some user code read. Defined for
    # one ragged dim, as there; with several, the attribute does not exist.
    @property
    def _ragged_idx(self) -> int:
        return self._only_ragged("_ragged_idx")

    @property
    def _lengths(self) -> None:
        return None

    @property
    def _max_seqlen(self) -> int:
        self._only_ragged("_max_seqlen")
        return self.max_seqlen()

    @property
    def _min_seqlen(self) -> int:
        self._only_ragged("_min_seqlen")
        sizes = self.sizes()  # SYNC: host copy of the lengths (cached; none for CPU tensors)
        return int(sizes.min()) if sizes.numel() else 0

    def _get_max_seqlen(self) -> int:
        """``_max_seqlen``, as ``torch.jagged``'s method reads it (code written for that layout calls it)."""
        return self._max_seqlen

    def _get_min_seqlen(self) -> int:
        """``_min_seqlen``, as ``torch.jagged``'s method reads it."""
        return self._min_seqlen

    def _only_ragged(self, name: str) -> int:
        if len(self._ragged_dims) != 1:
            raise AttributeError(f"{name}: defined for one ragged dim, got ragged dims {self._ragged_dims}")
        return self._ragged_dims[0]

    def sizes(self) -> torch.Tensor:
        r"""Returns the per-sample sizes of the ragged dims.

        Column ``k`` holds the sizes of ragged dim ``ragged_dims[k]``. Kept on the host, so
        reading it costs no device sync.

        Returns:
            Tensor: ``(B, R)`` int64 on the CPU, ``R`` the number of ragged dims.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(3, 2, 4), torch.ones(1, 5, 4)])
            >>> x.ragged_dims
            (1, 2)
            >>> x.sizes()
            tensor([[3, 2],
                    [1, 5]])
        """
        return self._partition.host_sizes()

    def occupancy(self) -> float:
        r"""Returns the valid fraction of the padded envelope ``(B, max…)``.

        ρ = (valid cells) / (B · Π max extents), counting cells of the ragged dims only; the
        padding rate is ``1 - ρ``. 1.0 when the envelope is empty (``B = 0`` or a max of 0).

        Returns:
            float: ρ, in ``[0, 1]``.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(4, 3), torch.ones(2, 3)])
            >>> x.occupancy()
            0.75
        """
        p = self._partition
        envelope = p.batch
        for e in p.extents:
            envelope *= int(e.max)
        return 1.0 if envelope == 0 else int(p.rows) / envelope

    def to_jagged(self) -> torch.Tensor:
        r"""Converts to a ``torch.jagged`` nested tensor, sharing values and offsets.

        ``torch.jagged`` holds one ragged dim: a tensor with several raises ``ValueError``. The
        result has the same shape (the same nested int) and is differentiable w.r.t. ``self``.

        Returns:
            Tensor: a ``torch.jagged`` nested tensor of the same shape.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
            >>> njt = x.to_jagged()
            >>> njt.layout, njt.shape == x.shape
            (torch.jagged, True)
            >>> [t.shape for t in njt.unbind()]
            [torch.Size([2, 3]), torch.Size([1, 3])]
        """
        if len(self._ragged_dims) != 1:
            raise ValueError(f"to_jagged(): torch.jagged holds one ragged dim, got ragged dims {self._ragged_dims}")
        r = self._ragged_dims[0]
        values = values_of(self).movedim(0, r - 1)
        return torch.nested.nested_tensor_from_jagged(values, self._partition.offsets, jagged_dim=r)

    # ------------------------------------------------------------------ repr / serialization
    def __repr__(self) -> str:  # type: ignore[override]
        shape = ", ".join(str(s) for s in self._size)
        # Under tracing there is no data to show; reading it would mint unbacked symbols (AOT's
        # debug logging formats its inputs' reprs).
        traced = any(_is_traced(e.offsets) and e._host_lengths is None for e in self._partition.extents)
        sizes = "<traced>" if traced else self._partition.host_sizes().tolist()
        grad = f", grad_fn={self.grad_fn}" if self.grad_fn else (
            ", requires_grad=True" if self.requires_grad else ""
        )
        return (
            f"MultiJaggedTensor(shape=({shape}), ragged_dims={self._ragged_dims}, "
            f"sizes={sizes}, dtype={self.dtype}, device={self.device}{grad})"
        )

    def __reduce_ex__(self, proto):
        # NOTE [ Serialized form ]. SymInt sizes are not picklable; rebuild from plain tensors.
        _check_fresh(self, "save")
        p = self._partition
        values = self._values.detach() if self._values.requires_grad else self._values
        args = (values, p.offsets, tuple(e.offsets for e in p.extents), self._ragged_dims, self.requires_grad)
        return (torch._tensor._rebuild_from_type_v2, (_rebuild, type(self), args, user_state(self)))

    def __setstate__(self, state):
        # Called by ``_rebuild_from_type_v2`` after ``_rebuild`` with the file's ``state``: user
        # attributes only. Internal keys written by older versions (``_strides``) are dropped; a key
        # that would shadow the structure (``_values``, ``offsets``…) means a tampered file.
        if "_partition" not in self.__dict__:
            # A file may pair the class with another allowlisted rebuild function (a plain tensor
            # turned into this class by ``as_subclass``): no structure at all.
            raise ValueError("torch.load(): invalid multi_jagged tensor in file: not built by its own rebuild function")
        if isinstance(state, tuple) and len(state) == 2:
            state = state[0]
        if not state:
            return
        if not isinstance(state, dict):
            raise ValueError(f"torch.load(): expected a dict of attributes for a MultiJaggedTensor, got {type(state).__name__}")
        for k, v in state.items():
            if not isinstance(k, str):
                raise ValueError(f"torch.load(): expected attribute names, got {k!r}")
            if k in ("_size", "_strides") or k.startswith("_sym_"):
                continue
            if k in INTERNAL_ATTRS or hasattr(type(self), k):
                raise ValueError(
                    f"torch.load(): a MultiJaggedTensor's saved attributes may not replace its structure, got {k!r}"
                )
            setattr(self, k, v)

    def untyped_storage(self) -> torch.UntypedStorage:
        r"""The wrapper's storage: empty, and its own (the elements live in :meth:`values`).

        Two multi_jagged tensors never share a storage, even where one's values are a view of
        the other's: aliasing is a property of their values.

        Example::

            >>> import torch, torch_multijagged as mj
            >>> x = mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)])
            >>> y = x + 1
            >>> x.untyped_storage().nbytes(), y.untyped_storage() is x.untyped_storage()
            (0, False)
            >>> y.values().untyped_storage().nbytes()
            160

        Returns:
            An empty ``torch.UntypedStorage`` on the tensor's device.
        """
        # Wrappers built from one template share the template's C++ storage (NOTE [ Building a
        # wrapper ] in wrappers.py); a fake-tensor converter that found two inputs on one storage
        # would make one a view of the other.
        s = self.__dict__.get("_storage")
        if s is None:
            with _DisableTF():
                device = self.device
            s = self.__dict__["_storage"] = torch.UntypedStorage(0, device=device)
        return s

    def __deepcopy__(self, memo):
        # torch's default copies ``__dict__`` (new offsets) but keeps the clone's size (the old
        # nested ints): the copy's shape and structure disagreed. Copy the structure as a whole:
        # new values and offsets, hence new nested ints, extent sharing kept.
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                "protocol at the moment."
            )
        if id(self) in memo:
            return memo[id(self)]
        _check_fresh(self, "deepcopy")
        with torch.no_grad():
            # deepcopy through ``memo``: storages shared with other copied objects stay shared.
            values = copy.deepcopy(self._values.detach(), memo)
            partition = copy_partition(self._partition, memo)
            new = MultiJaggedTensor(values, partition, self._ragged_dims, requires_grad=self.requires_grad)
            grad = self.grad
            if grad is not None:
                if isinstance(grad, MultiJaggedTensor) and grad._partition.same_as(self._partition):
                    grad = MultiJaggedTensor(copy.deepcopy(grad._values.detach(), memo), partition, grad._ragged_dims)
                else:
                    grad = copy.deepcopy(grad, memo)
                new.grad = grad
        for k, v in user_state(self).items():
            setattr(new, k, copy.deepcopy(v, memo))
        memo[id(self)] = new
        return new

    # ------------------------------------------------------------------ compile protocol
    def _unique_extents(self) -> tuple[list[RaggedExtent], tuple[int, ...]]:
        uniq: list[RaggedExtent] = []
        index = []
        for e in self._partition.extents:
            for i, u in enumerate(uniq):
                if u is e:
                    index.append(i)
                    break
            else:
                index.append(len(uniq))
                uniq.append(e)
        return uniq, tuple(index)

    def __tensor_flatten__(self):
        # Packed rows are data-dependent: keep dim 0 dynamic under dynamo (an unguarded hint, as
        # torch.jagged sets on its values). Set here, where dynamo meets an input, rather than
        # on every construction.
        self._values._dynamo_propagated_dynamic_indices = {0}  # type: ignore[attr-defined]  # not in torch's stubs
        if not _frames.skipped and "torch._dynamo.eval_frame" in sys.modules:
            _frames.skip_frames("torch_multijagged")  # NOTE [ Own frames under torch.compile ]
        uniq, index = self._unique_extents()
        p = self._partition
        names = ["_values", "_offsets"]
        is_offsets = []
        for i, e in enumerate(uniq):
            if type(e.offsets) is torch.Tensor:
                _EXTENT_OF[e.offsets] = weakref.ref(e)  # NOTE [ Extents across a compiled region ]
            is_offsets.append(e.offsets is p.offsets)
            if not is_offsets[-1]:
                names.append(f"_ext{i}_offsets")
            names += [f"_ext{i}_sum", f"_ext{i}_max", f"_ext{i}_sq"]
        ctx = (self._ragged_dims, index, tuple(is_offsets), self.requires_grad)
        return names, ctx

    @property
    def _offsets(self) -> torch.Tensor:
        return self._partition.offsets

    def __getattr__(self, name: str):
        # Inner tensors named by __tensor_flatten__: ``_ext{i}_{offsets,sum,max,sq}``.
        if name.startswith("_ext"):
            i, kind = name[4:].split("_", 1)
            e = self._unique_extents()[0][int(i)]
            t = {"offsets": e.offsets, "sum": e.sum_carrier, "max": e.max_carrier, "sq": e.sq_carrier}[kind]
            # read on every call of a compiled function (its guards and inputs): keep it
            self.__dict__[name] = t
            return t
        raise AttributeError(name)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        from torch._subclasses.fake_tensor import FakeTensor

        ragged_dims, index, is_offsets, requires_grad = ctx
        values, offsets = inner["_values"], inner["_offsets"]
        uniq = []
        for i, is_off in enumerate(is_offsets):
            off = offsets if is_off else inner[f"_ext{i}_offsets"]
            if isinstance(off, FakeTensor):
                # Reuse the traced nested int instead of minting a new one (docs/design.md §1). Only
                # for fake inners: at runtime outer_size is not meaningful.
                off.nested_int_memo = outer_size[ragged_dims[index.index(i)]]
            carriers = inner[f"_ext{i}_sum"], inner[f"_ext{i}_max"], inner[f"_ext{i}_sq"]
            uniq.append(_known_extent(off, carriers) or RaggedExtent(off, *carriers))
        extents = tuple(uniq[i] for i in index)
        partition = Partition(extents, offsets, values.shape[0])
        return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)

    def _stable_hash_for_caching(self) -> str:
        # Cache key for compiled-graph caches: the structure (not the data) and the package's own
        # source, since the traced graph is made by our handlers — an edited handler must not be
        # served a graph compiled from the old one.
        # The batch size too: a graph compiled while B was static must not be served to another B
        # (the offsets' length is not part of ctx).
        _, ctx = self.__tensor_flatten__()
        return repr((ctx, self._partition.batch, self.dtype, self._values.shape[1:], _source_digest()))

    # ------------------------------------------------------------------ dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if _fwad._current_level >= 0:  # a dual level is open: a dense dual operand's tangent would be dropped
            _refuse_duals(func, args, kwargs)
        try:
            if _reorder_copies:  # a copy of a ragged slice lives: it may be written through
                target = _writeback_target(func, args, kwargs)
                if target is not None:  # NOTE [ Slices of ragged dims write through ] in ops/shape/views.py
                    return _write_through(target, lambda: cls._torch_function(func, types, args, kwargs))
            if kwargs and ("axis" in kwargs or "keepdims" in kwargs):
                kwargs = _numpy_names(kwargs)
            # The commonest call first, inline (a call level is ≈ 0.2 µs of a ≈ 10 µs op): a
            # values-path op whose operands need no relabelling, without keywords or with plain
            # ones (``dim=``, ``keepdim=``, ``dtype=``: no tensor a relabel could concern).
            fast = _FAST.get(func)
            if (fast is not None and (not kwargs or _plain_kwargs(kwargs))
                    and (len(args) < 2 or _nothing_to_unify(args, func)) and _fast_enabled()):
                result = _call_fast(fast, args, kwargs) if kwargs else fast(*args)
                if result is not NotImplemented:
                    return result
                fast = None  # tried
            return cls._torch_function(func, types, args, kwargs, fast)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            if "must override the setup_context staticmethod" in str(e):
                raise NotImplementedError(_TRANSFORMS) from None  # our autograd.Functions under torch.func
            # Errors name the op the user called (NOTE [ Error names ])
            _rename(e, func)
            raise

    @classmethod
    def _torch_function(cls, func, types, args, kwargs, fast=None):
        if types and any(t is _NJT for t in types):
            _refuse_mixed_layouts(func)
        if ((kwargs and not _plain_kwargs(kwargs)) or (len(args) > 1 and not _nothing_to_unify(args, func))
                or (args and type(args[0]) in (list, tuple))):
            # Operands with equal sizes but other nested ints (a list's too: ``torch.dstack([a,
            # b])``) are relabelled onto the first's, except where a tensor is held by identity
            # (NOTE [ Equal sizes, different nested ints ] in ops/_routing.py).
            args, kwargs = _unify(func, args, kwargs)
        if fast is not None and _fast_enabled():
            # NOTE [ Eager values path ] in ops/fastpath.py
            result = _call_fast(fast, args, kwargs or {})
            if result is not NotImplemented:
                return result
        # NOTE [ Writes into shared values ] in writes.py (the values path checks in its own reads)
        stale = _written_through_alias(args, MultiJaggedTensor) if torch.is_grad_enabled() else None
        route = _ROUTES.get(func)
        result = NotImplemented
        if route is not None:
            result = route(*args, **(kwargs or {}))
        if result is NotImplemented:
            result = torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
        if stale is not None and _differentiable(result):
            check_not_written_through_alias(stale, func)
        return result

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]  # as torch's NestedTensor
        kwargs = kwargs or {}
        # In-place writes into a copy made by reordering ragged dims would be lost (NOTE
        # [ Reordered ragged dims are copies ] in ops/shape/views.py).
        if _reorder_copies:  # only while such a copy is alive: no call per op otherwise
            _guard_write(func, args, kwargs)
        pos, names = written_args(func)
        if not (pos or names):
            return _dispatch(func, args, kwargs)
        # NOTE [ Writes into shared values ] in writes.py
        targets = _targets(args, kwargs, pos, names, MultiJaggedTensor)
        if not _eager():
            _refuse_traced_alias_write(func, targets)
            return _dispatch(func, args, kwargs)
        refuse_split_piece_write(func, targets, args, kwargs)
        refuse_untracked_view_write(func, targets, args, kwargs)
        if torch.is_grad_enabled():
            for x in targets:  # its values were written through an alias since: a write would hide that
                check_not_written_through_alias(x, func)
        out = _dispatch(func, args, kwargs)
        for x in targets:
            record_write(x, MultiJaggedTensor)
        return out


# NOTE [ Error names ]
#
# Handlers run on aten overloads, and their errors say so (``sum.dim_IntList(): …``,
# ``_softmax(): …``); a user called ``x.sum(5)`` or ``F.softmax``. ``__torch_function__`` knows the
# user's function, so an error whose message starts with another op's ``name(): `` is renamed on
# its way out, keeping its type and traceback and naming the aten op at the end (``torch.ops``
# calls are left alone: they are the op's own name). Routes calling
# torch functions re-enter ``__torch_function__``; the outermost call renames last, so the user's
# own function is named.
_AUTOGRAD_ENTRIES = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward)
_OP_PREFIX = re.compile(r"^([A-Za-z_][\w.]*)\(\): ")


_NJT = torch.nested._internal.nested_tensor.NestedTensor


def _refuse_mixed_layouts(func) -> None:
    """An op given a ``torch.jagged`` tensor beside a multi_jagged one (code migrating between the
    layouts) says so: each layout would read the other's tensor as a dense one."""
    name = op_label(func)
    # (not a TypeError: Python reads one from ``x + njt`` as NotImplemented and asks ``njt`` next)
    raise StructureError(f"{name}(): a torch.jagged tensor beside a multi_jagged one: the layouts do not mix; convert "
                         "it with mj.from_jagged(njt) (which keeps its nested int), or x.to_jagged() the other way")


_FORWARD_AD = ("forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported for layout "
               "torch.multi_jagged, as for torch.jagged: differentiate in reverse mode (torch.autograd.grad)")
_TRANSFORMS = ("torch.func transforms other than vmap over the batch dim (jvp, jacfwd, jacrev, grad) are not "
               "supported for layout torch.multi_jagged, as for torch.jagged: differentiate with torch.autograd.grad")


def _refuse_duals(func, args, kwargs) -> None:
    """Raise where a dense dual tensor (forward-mode AD) meets a multi_jagged one: its tangent
    would not reach the result (``torch.jagged`` raises there too)."""
    for a in (*args, *(kwargs or {}).values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and not isinstance(t, MultiJaggedTensor) \
                    and _fwad.unpack_dual(t).tangent is not None:
                raise NotImplementedError(f"{getattr(func, '__name__', func)}(): {_FORWARD_AD}")


def _rename(e: BaseException, func) -> None:
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or func in _AUTOGRAD_ENTRIES:
        # ``torch.ops`` calls (ours, from our own functions) already name the op; an error from a
        # backward names the op whose derivative failed, which says more than "grad()"
        return
    name = getattr(func, "__name__", None)
    if not name or name.startswith("__") or not e.args or not isinstance(e.args[0], str):
        return
    msg = e.args[0]
    m = _OP_PREFIX.match(msg)
    if m is None or m.group(1) == name:
        return
    inner = m.group(1)
    note = "" if inner.split(".")[0].lstrip("_") in (name, f"{name}_") or "(in " in msg else f" (in {inner})"
    e.args = (f"{name}(): {msg[m.end():]}{note}",) + e.args[1:]


# ----------------------------------------------------------------------------- values crossings
# NOTE [ Differentiable backward of the bridge ] in ``bridge.py``.


def _graph(grad: torch.Tensor) -> bool:
    # In backward, grad mode is on only under create_graph=True.
    return torch.is_grad_enabled() and grad.requires_grad


# NOTE [ Zero tensors never become values ]
#
# Dense autograd's formulas return ``at::_efficientzerotensor`` where a derivative is known to be
# zero (``sgn``'s, reached by the double backward of ``abs`` or ``l1_loss``): a tensor with the
# ZeroTensor dispatch key and no storage. A dense zero tensor passed to an op beside a wrapper is
# harmless (the ZeroTensor key sits above Python and answers, or materialises it, before
# ``__torch_dispatch__``), but one that crosses into a wrapper as its packed values (a gradient
# through the bridge, an op on the values that returns one) would reach aten's kernels from inside
# the handlers, below that key, as a null pointer. The wrapper's constructor materialises it: the
# one place every wrapper's values pass, at the cost of one flag read per wrapper.


def _resolved(values: torch.Tensor) -> torch.Tensor:
    """``values`` without a lazy conjugate / negative bit, as a wrapper must hold them: handlers run
    below the Conjugate and Negative dispatch keys, where pointwise ops ignore the bits (a complex
    gradient crossing into a wrapper as ``grad.conj()``'s view would be read unconjugated). Dense
    autograd's complex formulas make such views; real values never carry the bits (no copy)."""
    if values.is_conj() or values.is_neg():
        return values.resolve_conj().resolve_neg()
    return values


class _ValuesOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: MultiJaggedTensor):
        ctx.set_materialize_grads(False)
        ctx.partition, ctx.ragged_dims = x._partition, x._ragged_dims
        return x._values.view_as(x._values)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if grad is None:
            return None
        if 0 in grad.stride() and grad.numel() > 1:
            # An expanded gradient (``values().sum()``'s) would reach aten's view/reshape
            # backward formulas, which reshape in C++ and fail on a non-viewable wrapper with
            # nested-int sizes: materialise it.
            grad = grad.contiguous()
        grad = _resolved(grad)
        if _graph(grad):
            return _WrapValues.apply(grad, ctx.partition, ctx.ragged_dims)
        return MultiJaggedTensor(grad, ctx.partition, ctx.ragged_dims)


class _WrapValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: torch.Tensor, partition: Partition, ragged_dims):
        ctx.set_materialize_grads(False)
        # ``detach``, not a view: a view made here (the forward runs in no-grad mode) of values
        # that require grad could not be read under autograd once an in-place op on the wrapper
        # wrote it ("a view was created in no_grad mode … modified inplace"); the wrapper's own
        # node carries the gradient, and ``detach`` keeps the storage and version counter.
        return MultiJaggedTensor(_resolved(values).detach(), partition, ragged_dims)

    @staticmethod
    def backward(ctx, grad: MultiJaggedTensor):
        if grad is None:
            return None, None, None
        return (_ValuesOf.apply(grad) if _graph(grad) else grad._values), None, None


def values_of(x: MultiJaggedTensor) -> torch.Tensor:
    """Packed ``(T, *static)`` values of ``x``; differentiable."""
    # _eager() first: dynamo fails reading x.__dict__ (NOTE [ Own frames under torch.compile ])
    if torch.is_grad_enabled() and _eager() and ("_vgraph" in x.__dict__ or WRITE_CLOCK[0]):
        check_not_written_through_alias(x, "values")  # NOTE [ Writes into shared values ] in writes.py
    return _ValuesOf.apply(x)


def wrap_values(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]) -> MultiJaggedTensor:
    """A MultiJaggedTensor viewing ``values``; differentiable w.r.t. ``values``."""
    return _WrapValues.apply(values, partition, ragged_dims)


# ``torch.load(weights_only=True)`` (torch's default) may name these two globals and no other of
# this package; NOTE [ Serialized form ].
torch.serialization.add_safe_globals([_rebuild, MultiJaggedTensor])


# NOTE [ Handler lookup ]
#
# The two dispatch entry points above look up per op, in these module globals: for
# ``__torch_function__`` the eager values path (``ops/fastpath.py``: ``FAST`` and its
# ``enabled`` predicate), the routes (``ops/_routing.py``: ``ROUTES``, and ``unify_call`` for
# operands with equal sizes but other nested ints), and for ``__torch_dispatch__`` the op table's ``dispatch``
# (``ops/_table.py``) with the write guard for reordered copies (``ops/shape/views.py``). This module
# sits below ``ops/`` (ops/ imports it, never the reverse: CONTRIBUTING.md, Layering), so the op
# table is handed in once, by the package's ``__init__.py`` calling ``install_op_table`` after it
# has imported ``ops``. Plain globals, not a lookup through a registry object: these are the
# hottest lines of the package, and a global costs one dict read per call.


def _no_op_table(func, args, kwargs):
    raise RuntimeError(
        f"{func}: the multi_jagged op table is not installed (import torch_multijagged, whose __init__ "
        "installs it; NOTE [ Handler lookup ] in torch_multijagged/tensor.py)"
    )


def _nothing_to_unify(args, func=None) -> bool:
    """True for a binary call ``(a, b)`` with no second structure to relabel: ``b`` is no list
    and no multi_jagged tensor, or has ``a``'s very partition and no static size of one operand
    (other than 1) where the other is ragged (the same partition at other dims: NOTE [ Static sizes
    equal to a ragged dim ] in ops/_routing.py). Most arithmetic is such a call; skipping the
    relabel policy and operand scan saves ≈ 0.5 µs of its ≈ 10 µs. Also True for a call whose
    first argument is no list and whose others are plain values (``x.transpose(1, 2)``,
    ``x.permute([0, 2, 1])``): there is no second tensor (≈ 5 µs of a ≈ 20 µs view)."""
    if len(args) != 2 or type(args[1]) in (list, tuple):
        return len(args) > 1 and type(args[0]) not in (list, tuple) and _plain_values(args[1:])
    a, b = args
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return False
    if not isinstance(b, MultiJaggedTensor):
        if func in _SIZED and isinstance(b, torch.Tensor) and isinstance(a, MultiJaggedTensor):
            # a dense size along a ragged dim may be that dim's size in every sample (the same NOTE)
            shift = len(a._size) - b.dim()
            for d in a._ragged_dims:
                if d >= shift and b.shape[d - shift] != 1:
                    return False
        return True
    if not isinstance(a, MultiJaggedTensor) or a._partition is not b._partition:
        return False
    ra, rb = a._ragged_dims, b._ragged_dims
    if ra == rb or len(a._size) != len(b._size):
        return True
    return all(d in rb or b._size[d] == 1 for d in ra) and all(d in ra or a._size[d] == 1 for d in rb)


# keyword values no relabel concerns: ``unify_call`` changes only tensors (and lists of them)
_PLAIN = frozenset((type(None), bool, int, float, str, torch.dtype, torch.device, torch.memory_format, torch.layout))


def _plain_kwargs(kwargs: dict) -> bool:
    """Whether every keyword value is a plain value or a sequence of ints (``dim=(1, 2)``)."""
    return _plain_values(kwargs.values())


def _plain_values(values) -> bool:
    """Whether every value is a plain value or a sequence of ints."""
    for v in values:
        t = type(v)
        if t not in _PLAIN and not ((t is tuple or t is list or t is torch.Size) and all(type(e) is int for e in v)):
            return False
    return True


def _numpy_names(kwargs: dict) -> dict:
    """``axis=`` / ``keepdims=`` as ``dim=`` / ``keepdim=``: torch's argument parser takes numpy's
    names for them (``torch.sum(t, axis=1)``), the routes and the values path torch's."""
    out = dict(kwargs)
    for alias, name in (("axis", "dim"), ("keepdims", "keepdim")):
        if alias in out and name not in out:
            out[name] = out.pop(alias)
    return out


def _call_fast(fast, args, kwargs: dict):
    """``fast(*args, **kwargs)``, NotImplemented where the call's binding failed before the body
    ran: an operand given by keyword (``torch.add(x, other=y)``, ``F.linear(input=x,
    weight=w)``), or a keyword the values path does not take (``x.sum(axis=1)``), which the
    general path binds as torch does."""
    try:
        return fast(*args, **kwargs)
    except TypeError as e:
        if e.__traceback__ is None or e.__traceback__.tb_next is not None:
            raise
        return NotImplemented


def _unify_nothing(func, args, kwargs):
    return args, kwargs


_ROUTES: dict = {}
_SIZED: frozenset = frozenset()  # functions whose dense operand may have a ragged dim's size (``SIZED`` in ops/_routing.py)
_FAST: dict = {}
_fast_enabled = bool
_dispatch = _no_op_table
_unify = _unify_nothing
_guard_write = _no_op_table
_reorder_copies: dict = {}  # the live registry of copies made where dense torch gives views (views')


def _no_writeback(func, args, kwargs):
    return None


def _check_fresh(x, read: str) -> None:
    """A read of the elements that does not pass ``__torch_function__`` (``read`` names it): a stale
    slice copy (NOTE [ Slices of ragged dims write through ] in ops/shape/views.py) refuses it as it
    refuses an op, instead of handing out values that miss a later write into its base."""
    if _reorder_copies:
        _writeback_target(read, (x,), None)


def _run_it(target, run):
    return run()


_writeback_target = _no_writeback
_write_through = _run_it


def install_op_table(*, dispatch, routes: dict, unify, guard_write, reorder_copies: dict, fast: Optional[dict] = None,
                     fast_enabled=None, writeback_target=None, write_through=None, sized=frozenset()) -> None:
    """Bind the op table's entry points (NOTE [ Handler lookup ]); called once by the package's
    ``__init__.py``. ``routes`` and ``reorder_copies`` are the live dicts, not copies."""
    global _ROUTES, _dispatch, _unify, _guard_write, _reorder_copies, _FAST, _fast_enabled
    global _writeback_target, _write_through, _SIZED
    _SIZED = frozenset(sized)
    if fast is not None:
        _FAST, _fast_enabled = fast, fast_enabled
    if writeback_target is not None:
        _writeback_target, _write_through = writeback_target, write_through
    _ROUTES, _dispatch, _unify = routes, dispatch, unify
    _guard_write, _reorder_copies = guard_write, reorder_copies
