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
*routed* in ``__torch_function__`` to ops that reach dispatch intact (``ops/routes.py``); the
router never computes anything itself. ``docs/design.md`` records what was tried and measured.

The logical size holds one nested int per ragged dim (NOTE [ Ragged extents and nested ints ]).
Strides are plain ints (nested ints cannot be multiplied together) and carry no meaning beyond
the static dims; code must use ``values`` for memory layout.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib


import torch

from .layout import multi_jagged
from .structure import Partition, RaggedExtent, _is_traced

__all__ = ["MultiJaggedTensor"]

aten = torch.ops.aten


def _outer_size_stride(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]):
    """Logical (size, stride), cached on the partition: every op builds one, and computing the
    nested ints (a weak-dict lookup each) dominated the construction cost."""
    key = (ragged_dims, values.shape[1:], values.stride())
    try:
        hit = partition.cache.get(key)
    except TypeError:  # symbolic sizes while tracing are unhashable; tracing is not hot
        return _compute_size_stride(values, partition, ragged_dims)
    if hit is None:
        hit = partition.cache[key] = _compute_size_stride(values, partition, ragged_dims)
    return hit


def _compute_size_stride(values: torch.Tensor, partition: Partition, ragged_dims: tuple[int, ...]):
    ndim = len(ragged_dims) + values.dim()
    size = [partition.batch]
    vstride = values.stride()
    row = vstride[0] if values.dim() else 1
    stride = [row]
    k = s = 1
    for d in range(1, ndim):
        if k - 1 < len(ragged_dims) and ragged_dims[k - 1] == d:
            size.append(partition.extents[k - 1].nested_int)
            stride.append(row)
            k += 1
        else:
            size.append(values.shape[s])
            stride.append(vstride[s])
            s += 1
    return tuple(size), tuple(stride)


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _rebuild(values, offsets, extents, ragged_dims, requires_grad):
    # serialization entry point (module level so that pickle can find it)
    partition = Partition(extents, offsets, values.shape[0])
    return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)


class MultiJaggedTensor(torch.Tensor):
    """A batch of B dense tensors of common rank whose extents may differ in several dims.

    Logical shape e.g. ``(B, j0, j0, C)``; storage: ``values`` ``(T, *static)`` with the ragged
    dims flattened into packed rows (row-major over the sample's ragged coordinates), split by
    ``offsets`` ``(B+1,)``. See DESIGN.md §3 and NOTE [ Packed-row partition ].
    """

    _values: torch.Tensor
    _partition: Partition
    _ragged_dims: tuple[int, ...]

    @staticmethod
    def __new__(
        cls,
        values: torch.Tensor,
        partition: Partition,
        ragged_dims: tuple[int, ...],
        *,
        requires_grad: bool = False,
    ):
        size, stride = _outer_size_stride(values, partition, ragged_dims)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            size,
            stride,
            0,
            torch.contiguous_format,
            values.dtype,
            torch.strided,
            values.device,
            False,
            requires_grad,
            "sizes",
            False,
            False,
            # The wrapper owns no storage; a size computed from nested-int sizes would fail.
            storage_size=0,
        )
        r._values = values
        r._partition = partition
        r._ragged_dims = ragged_dims
        r._size = size
        r._strides = stride
        return r

    # ------------------------------------------------------------------ public accessors
    @property
    def layout(self):  # type: ignore[override]
        return multi_jagged

    @property
    def ragged_dims(self) -> tuple[int, ...]:
        return self._ragged_dims

    def values(self) -> torch.Tensor:  # type: ignore[override]
        """Packed ``(T, *static)`` buffer; differentiable (gradients flow back to ``self``)."""
        from .bridge import values_of

        return values_of(self)

    def offsets(self) -> torch.Tensor:
        """``(B+1,)`` int64 sample offsets into the packed rows."""
        return self._partition.offsets

    def sizes(self) -> torch.Tensor:
        """``(B, R)`` int64 per-sample extents of the ragged dims, on the CPU."""
        return self._partition.host_sizes()

    def occupancy(self) -> float:
        """Valid fraction ρ of the padded envelope ``(B, max…)``; padding rate is ``1 - ρ``."""
        from .constructors import occupancy

        return occupancy(self)

    def to_jagged(self) -> torch.Tensor:
        from .constructors import to_jagged

        return to_jagged(self)

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
        # SymInt sizes are not picklable; rebuild from the plain tensors.
        p = self._partition
        extents = [
            RaggedExtent(e.offsets, e.sum_carrier, e.max_carrier, e.sq_carrier, e._host_lengths)
            for e in p.extents
        ]
        # Keep the extent sharing of a square pair (one nested int for both dims).
        for i, e in enumerate(p.extents):
            for j in range(i):
                if p.extents[j] is e:
                    extents[i] = extents[j]
        if len(extents) == 1 and p.offsets is p.extents[0].offsets:
            offsets = extents[0].offsets
        else:
            offsets = p.offsets
        state = dict(torch._utils._get_obj_state(self))
        for k in ("_size", "_values", "_partition", "_ragged_dims"):
            state.pop(k, None)
        args = (self._values, offsets, tuple(extents), self._ragged_dims, self.requires_grad)
        return (torch._tensor._rebuild_from_type_v2, (_rebuild, type(self), args, state))

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
        self._values._dynamo_propagated_dynamic_indices = {0}
        uniq, index = self._unique_extents()
        p = self._partition
        names = ["_values", "_offsets"]
        is_offsets = []
        for i, e in enumerate(uniq):
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
            return {"offsets": e.offsets, "sum": e.sum_carrier, "max": e.max_carrier, "sq": e.sq_carrier}[kind]
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
                # Reuse the traced nested int instead of minting a new one (DESIGN.md §6). Only
                # for fake inners: at runtime outer_size is not meaningful.
                off.nested_int_memo = outer_size[ragged_dims[index.index(i)]]
            uniq.append(
                RaggedExtent(off, inner[f"_ext{i}_sum"], inner[f"_ext{i}_max"], inner[f"_ext{i}_sq"])
            )
        extents = tuple(uniq[i] for i in index)
        partition = Partition(extents, offsets, values.shape[0])
        return MultiJaggedTensor(values, partition, ragged_dims, requires_grad=requires_grad)

    def _stable_hash_for_caching(self) -> str:
        # Cache key for compiled-graph caches: the structure (not the data) and the package's own
        # source, since the traced graph is made by our handlers — an edited handler must not be
        # served a graph compiled from the old one.
        _, ctx = self.__tensor_flatten__()
        return repr((ctx, self.dtype, self._values.shape[1:], _source_digest()))

    # ------------------------------------------------------------------ dispatch
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if len(args) > 1:
            args = _unify(args)
        if kwargs and len(args) and any(isinstance(v, MultiJaggedTensor) for v in kwargs.values()):
            names = list(kwargs)
            unified = _unify((*args, *kwargs.values()))
            args, kwargs = unified[: len(args)], dict(zip(names, unified[len(args) :]))
        route = _ROUTES.get(func)
        if route is not None:
            result = route(*args, **(kwargs or {}))
            if result is not NotImplemented:
                return result
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


# Bound by ``ops/__init__.py`` once the op table exists (ops/ imports this module, not the
# reverse, so the layering of DESIGN.md §5 holds).
_ROUTES: dict = {}
_dispatch = None
_unify = None
