"""Ragged extents and packed-row partitions: the metadata behind a MultiJaggedTensor.

NOTE [ Ragged extents and nested ints ]

A *ragged extent* is the vector ``n = (n_0, …, n_{B-1})`` of per-sample sizes of one ragged dim.
It is stored as its exclusive prefix sum ``offsets = [0, n_0, n_0+n_1, …]`` ((B+1,) int64, on
the values' device), and that tensor *is* the extent's identity: the nested int that appears in
the logical shape (``j0``) is keyed on the tensor object in ``torch.jagged``'s registry, exactly as
``torch.jagged`` keys its nested int on its offsets (``_RaggedSizeNode`` in ``ragged_sizes.py``: its node,
with a clear error where code asks a ragged size for one value). A sequence ``(B, j0, C)`` therefore has the
same ``j0`` as the NJT with the same offsets, and a square pair built from it carries that same
extent on both pair dims, so reducing one pair dim gives back singles that add to the originals.

Each extent also carries three *shape carriers*: empty CPU tensors of shape ``(Σn, 0)``,
``(max n, 0)`` and ``(Σn², 0)``. Their dim 0 is the only place a size that depends on the
lengths lives. Under ``torch.compile`` they are inputs whose dim 0 is a backed dynamic symbol, so
building a square pair (Σn² rows) or padding (max n) inside a compiled region needs no
``.item()`` and creates no new nested int (docs/design.md §1). They are computed once, when an extent
is created from host lengths, and are shared by every tensor derived from it.

NOTE [ Packed-row partition ]

A *partition* describes how the packed rows of ``values`` (dim 0) split into samples and ragged
coordinates: the extents of the R ragged dims in storage order, the (B+1,) row offsets
(``o_{i+1} - o_i = Π_k n_{i,k}``), and the number of rows T. Row ``o_i + Σ_k a_k Π_{l>k} n_{i,l}``
holds ragged coordinate ``(a_1..a_R)`` of sample i (row-major). For R = 1 the row offsets are the
extent's offsets (the same tensor object). The partition is independent of where the ragged dims
sit among the static dims and of the static sizes, so ``linear``, ``unsqueeze`` of a static dim or
a reduction over static dims reuse it — and with it the index maps cached on it.

NOTE [ Derived maps ]

Everything computed from a partition alone — index maps, a device copy of its sizes, related
partitions — is cached on it, in ``Partition.cache``, one entry per key, computed once and shared
by every tensor with that partition: ops that keep the structure pass the partition object on,
so a map built for one op serves the next (and ``partition_for`` gives tensors made by the same
structural move the same partition object). The entries and their keys:

====================================  ===========================================================
key                                   value (method that builds it)
====================================  ===========================================================
``"sizes"``                           (B, R) int64 per-sample extents on the device (``device_sizes``)
``"row_sample"``                      (T,) sample of every packed row (``row_sample``)
``"row_coords"``                      ((T,) sample, (T, R) ragged coordinates) (``row_coords``)
``("sub", keep)``                     the partition of the ragged dims ``keep`` alone (``map_to_sub``,
                                      ``note_sub``)
``("map", keep)``                     ``(index, sub)``: every row's row in that partition (``map_to_sub``)
``("reorder", order)``                ``(index, partition)`` with ragged dims in ``order`` (``reorder_rows``)
``"segments"``                        ``(cu, seg_sample)`` along the last ragged dim (``segments``)
``("size_stride", rd, shape, st)``    a wrapper's logical (size, stride) (``logical_size_stride``)
``("wrapper", rd, shape, st, …)``     (size, stride, C++ stride, template) of eager wrappers of values of this
                                      shape, strides, dtype, device, class and inference mode (wrappers.py:
                                      ``_built``, NOTE [ Building a wrapper ]; ``("pieces_wrapper", …)``:
                                      pieces.py's wrappers without values)
``("padded_pos", maxes)``             flat padded position of every row (ops/shape/padded.py, ``derived``)
``("envelope", k, right)``            ``((pos, segment, cell), segments, max n)``: every row's cell in the
                                      envelope of the segments along ragged dim k, left- or
                                      right-aligned (ops/_along.py)
``("length_one", k)``                 (T,) bool: the row's segment along ragged dim k has one cell
                                      (ops/_along.py)
``("diagonal_rows", full, off, a, b)`` each row's diagonal cell in ``full``, over its ragged dims ``a``, ``b``
                                      of one extent (ops/shape/views.py)
``("all_nan_median", k, dtype)``      per length along ragged dim k: dense ``nanmedian``'s index in a
                                      column that is all nan (ops/reductions/order.py)
``("segment_blocks", k)``             host plan of the segments along ragged dim k: per sample its rows and
                                      ``(outer, n, inner)`` (ops/reductions/segment_ops.py)
``("segment_groups", k)``             the rows regrouped by length along ragged dim k and back
                                      (``kernels/along.py``: ``length_order``; segment_ops.py)
``("row_counts", b, red, dtype, dev)`` rows reduced into each output row of a reduction (``mean``'s
                                      divisor; ops/reductions/reduce.py ``_Plan.count``)
``("reduce_plan", ndim, rd, dims)``   a reduction's plan over ``dims`` (reduce.py ``plan_cached``,
                                      eager values path)
``("broadcast", rd, rd_q, …)``        ``(q, structure)``: the output structure of a binary op with
                                      an operand of partition ``q``, the last one met
                                      (ops/elementwise/pointwise.py)
``("block_starts", rd_q, rd)``        ``(cu_q, cu_k, start)``: the first row of each attention
                                      segment's score block in a mask of this partition, for the
                                      latest segments (ops/attention/sdpa.py)
``("index_rows", rd_x, rd, k)``       ``(p, plan)``: per row of an index of this partition, its sample and
                                      the packed row, size and row stride along ragged dim k of a
                                      tensor of partition ``p``, the latest ``p`` met (``gather`` /
                                      ``scatter`` along a ragged dim; ops/indexing/slicing.py)
``"rnn_time_major"``                  ``(rows, batch_sizes, order)``: a ``PackedSequence``'s
                                      time-major rows, host batch sizes and sample order
                                      (ops/nn/rnn.py)
``"sample_rows"``                     ``(sizes, rows)``: each sample's ragged sizes and packed rows as Python
                                      ints (ops/_common.py: ``sample_rows``)
``("cdist_units", …)``                ``(p1, p2, units)``: ``cdist``'s samples stacked into one call, for
                                      operands of partitions ``p1``, ``p2``, the last ones met, on the
                                      output's partition (ops/nn/distances.py)
``("one_ragged_side_out", op, …)``    (B, 2) output sizes of a conv of a batch with one ragged spatial
                                      dim, per window rule and static size (ops/vision/conv.py)
``("window_out_sizes", rules)``       ``[h', w']`` per image of a windowed op of these size rules over two
                                      ragged spatial dims, as host ints (ops/vision/conv.py: image by image)
``"rnn_groups"``                      the non-empty samples grouped by length, each group's rows, and
                                      the permutations back to sample order (ops/nn/rnn.py)
``("canvas", s, windows, rd, static)`` the canvas plan of a windowed op over ``s`` spatial dims
                                      (``kernels/canvas.py``: ``plan_canvas``; ops/vision/conv.py,
                                      ``max_pool1d`` in ops/nn/ragged.py)
``("canvas_sizes", s, windows, rd, static)`` (B, s) spatial sizes and output sizes of that op
                                      (ops/vision/conv.py: ``_plan``)
``("keep_along", p, rd, key)``        the rows of a tensor of partition ``p`` that an op along a ragged dim reads,
                                      its fill mask and gradient blocks (ops/indexing/along.py: ``keep_along``)
``("drop_along", k, key)``            the rows ``x[:, i]`` reads along ragged dim k (``drop_along``)
``("cat_blocks", key)``               a ``cat``'s blocks of its operands' rows along the first ragged dim
                                      (ops/indexing/joins.py; ``("cat_rows", k, key)``: the rows of its
                                      operands joined along ragged dim k, as a map)
``("pad_blocks", p, lo, hi)``         a constant pad's blocks of fill and of the rows of ``p`` (joins.py)
``("pad_checked", rd, …)``            a pad of these arguments passed dense's checks on every sample (joins.py)
====================================  ===========================================================

``derived(key, compute)`` is the one get-or-compute: ``compute(partition)`` runs on the first
request of ``key``, outside ``torch.inference_mode`` (``building()``; every builder of a cached
map runs in it): a map first built as an inference tensor could not be saved for backward by the
next op that records autograd on the same structure. The named methods are its common entries;
the hot ones (called per op) inline the dict lookup to save a call. Op-specific maps use ``derived`` with a key listed above. Values
are never None (None reads as "not computed"). A key holding symbolic sizes (while tracing) cannot
be hashed: ``derived`` then computes without caching — traced partitions are rebuilt per trace
anyway. The canonical partition of given extents is cached the same way on its first extent
(``RaggedExtent.cache``, key ``("partition", *ids of the extents)``): ``partition_for``; the
extent also keeps its nested int and, per packed-row size, the batch stride ``nested_int · row``
of a wrapper (key ``("batch_stride", row)``), so a new wrapper does no nested-int arithmetic,
the extents mapped from it by a size rule (``("mapped", key)``, ``mapped_extent``) and, on a
mapped extent, a weak reference to the extent it was mapped from (``("source",)``).

This module builds maps with the pure-torch formulas of ``kernels/reference.py`` and knows
nothing of the subclass or the op table.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.nested._internal import nested_tensor as _njt
from torch.nested._internal.nested_int import NestedIntNode

from .kernels import reference as ref
from .kernels.along import packed_rows
from .ragged_sizes import EXTENTS, _RaggedSizeNode, _node_sizes

__all__ = ["RaggedExtent", "Partition", "same_extent", "broadcast_extent", "partition_for", "register_partition", "mapped_extent", "flat_extent"]


def _quotient(e: "RaggedExtent", f: "Optional[RaggedExtent]") -> "Optional[RaggedExtent]":
    """The extent of ``e``'s sizes divided by ``f``'s where ``e`` was flattened from ``f`` and
    other extents (the flat extent of the others), else None."""
    factors = list(_factors(e))
    if f is None or len(factors) < 2 or not any(g is f for g in factors):
        return None
    factors.pop(next(i for i, g in enumerate(factors) if g is f))
    return factors[0] if len(factors) == 1 else flat_extent(partition_for(factors))


def _node_extent(node) -> "Optional[RaggedExtent]":
    return _EXTENT_OF_TID.get(node.t_id) if isinstance(node, NestedIntNode) else None


def _product_extent(a, b) -> "Optional[RaggedExtent]":
    """The extent of two eager ragged dims flattened into one (``H * W`` of an image batch's
    sizes): the flat extent of their canonical partition, so ``x.view(B, C, H * W)`` names the
    nested int that ``x.flatten(2)`` has. None where either is not an eager extent of ours."""
    ea, eb = _node_extent(a), _node_extent(b)
    if ea is None or eb is None or ea.batch != eb.batch or torch.compiler.is_compiling():
        return None
    return flat_extent(partition_for(_factors(ea) + _factors(eb)))


def _factors(e: RaggedExtent) -> tuple:
    """The extents that ``e`` was flattened from (``H * W * D``), or ``(e,)``."""
    p = partition_for([e]).cache.get(("unflat",))
    return p.extents if p is not None else (e,)


def floordiv_of(e: RaggedExtent) -> "Optional[tuple[RaggedExtent, int]]":
    """``(parent, k)`` when ``e`` is the extent of ``parent``'s sizes floor-divided by ``k`` (a
    ragged size's ``n // k``), else None."""
    return e.cache.get(("floordiv_of",))


def same_product(size, extents: Sequence[RaggedExtent]) -> bool:
    """Whether the eager nested int ``size`` is the product of ``extents`` in some order (``W * H``
    where the dims are ``(H, W)``): the same per-sample sizes, though another nested int."""
    node = size.node if isinstance(size, torch.SymInt) else None
    e = _node_extent(node) if node is not None and getattr(node, "coeff", None) == 1 else None
    return e is not None and sorted(map(id, _factors(e))) == sorted(map(id, extents))


def _eager_nested_int(offsets: torch.Tensor) -> torch.SymInt:
    """The nested int of eager ``offsets``: ``torch.jagged``'s own when it has one (an NJT built on
    them), else a new one, drawn from its counter and entered in its registry so that an NJT on
    the same offsets has the same ``j``."""
    ni = _njt._tensor_symint_registry.get(offsets)
    if ni is None:
        ni = torch.SymInt(_RaggedSizeNode(_njt._tensor_id_counter, 1))
        _njt._tensor_id_counter += 1
        _njt._tensor_symint_registry[offsets] = ni
    return ni


def _mark_dynamic0(t: torch.Tensor) -> torch.Tensor:
    # Unguarded dynamism hint read by dynamo's builder (NJT does the same for its values).
    t._dynamo_propagated_dynamic_indices = {0}  # type: ignore[attr-defined]
    return t


def _carrier(n) -> torch.Tensor:
    return _mark_dynamic0(torch.empty(n, 0))


def _exclusive_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    out = lengths.new_zeros(lengths.shape[0] + 1)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


# The eager extent of each nested int it has handed out (keyed by the nested-int node's id, the
# extent held weakly: the extent keeps its node alive, so the id cannot be reused while the entry
# lives). ``extent_of`` reads it: a size given as a batch's nested int (``output_size=x.shape``)
# names that batch's extent.
class _WeakTable:
    """A key → object table holding its objects weakly, without the collector's callbacks that
    a ``WeakValueDictionary`` runs to drop dead entries: dynamo reads these tables while it traces
    the package's frames after a graph break, and an entry dropped meanwhile failed its trace
    ("dictionary changed size during iteration"). Dead entries are purged as the table grows."""

    __slots__ = ("_refs", "_purge_at")

    def __init__(self) -> None:
        self._refs: dict = {}
        self._purge_at = 64

    def get(self, key):
        ref = self._refs.get(key)
        return None if ref is None else ref()

    def __setitem__(self, key, value) -> None:
        if len(self._refs) >= self._purge_at:
            self._refs = {k: r for k, r in self._refs.items() if r() is not None}
            self._purge_at = max(64, 2 * len(self._refs))
        self._refs[key] = weakref.ref(value)


_EXTENT_OF_NODE = _WeakTable()  # id(nested int's node) → its extent


# The same by the nested int's id (``t_id``), which its multiples (``2 * j0``) share.
_EXTENT_OF_TID = _WeakTable()


def extent_of(size) -> "Optional[RaggedExtent]":
    """The eager extent whose nested int ``size`` is, or None (a plain int, a traced nested int,
    or one this package did not make)."""
    if not isinstance(size, torch.SymInt):
        return None
    e = _EXTENT_OF_NODE.get(id(size.node))
    if e is None or e._nested_int is None or e._nested_int.node is not size.node:
        return None
    return e


def sizes_of(size) -> "Optional[torch.Tensor]":
    """Each sample's value of the eager nested int ``size`` (a ragged size, or a multiple of one:
    ``2 * x.shape[1]``) as a ``(B,)`` int64 host tensor; None for anything else (a plain int, a
    traced nested int, one this package did not make)."""
    return _node_sizes(size.node) if isinstance(size, torch.SymInt) else None


class RaggedExtent:
    """Per-sample sizes of one ragged dim; see NOTE [ Ragged extents and nested ints ]."""

    __slots__ = ("offsets", "sum_carrier", "max_carrier", "sq_carrier", "_host_lengths", "_nested_int", "cache",
                 "__weakref__")

    def __init__(
        self,
        offsets: torch.Tensor,
        sum_carrier: torch.Tensor,
        max_carrier: torch.Tensor,
        sq_carrier: torch.Tensor,
        host_lengths: Optional[torch.Tensor] = None,
    ) -> None:
        self.offsets = offsets
        self.sum_carrier = sum_carrier
        self.max_carrier = max_carrier
        self.sq_carrier = sq_carrier
        self._host_lengths = host_lengths
        self._nested_int = None
        # Partitions whose first ragged dim has this extent, keyed by ("partition", *ids of the
        # extents) (``partition_for``; NOTE [ Derived maps ]).
        self.cache: dict[Any, Any] = {}

    @staticmethod
    def from_lengths(
        lengths: torch.Tensor, device: torch.device, offsets: Optional[torch.Tensor] = None
    ) -> "RaggedExtent":
        """``lengths``: (B,) int64 on the CPU. ``offsets`` reuses an existing prefix-sum tensor
        (and so its nested int) when the caller has one. Built outside ``inference_mode``
        (``building``): a batch made under it and cloned for training saves its offsets for
        backward."""
        with building():
            lengths = lengths.to(dtype=torch.int64)
            if lengths.is_inference():
                lengths = lengths.clone()
            if offsets is None:
                offsets = _exclusive_cumsum(lengths).to(device)
        b = lengths.shape[0]
        # SYNC: none — ``lengths`` is a host tensor; these three ints size the shape carriers.
        if b <= 64:  # a few Python ints cost less than four reductions and three ``item``s
            ns = lengths.tolist()
            total, mx, sq = sum(ns), max(ns, default=0), sum(n * n for n in ns)
        else:
            total, mx, sq = int(lengths.sum()), int(lengths.max()), int((lengths * lengths).sum())
        return RaggedExtent(offsets, _carrier(total), _carrier(mx), _carrier(sq), lengths)

    @staticmethod
    def from_offsets(offsets: torch.Tensor) -> "RaggedExtent":
        # SYNC: the host copy of the lengths is needed to size the carriers; this runs once per
        # new extent (a constructor), never per op.
        lengths = offsets.diff().cpu() if offsets.shape[0] > 1 else offsets.new_zeros(0, device="cpu")
        return RaggedExtent.from_lengths(lengths, offsets.device, offsets=offsets)

    @property
    def nested_int(self):
        ni = self._nested_int
        if ni is None:
            # Eager offsets keep their nested int for life (the registry's entry), so it is kept
            # here too: the registry's weak-dict lookup was ≈ 7 µs of every new wrapper shape.
            # Fake and functional offsets (subclasses) ask their own memo while tracing (coeff
            # must always be 1: the memo keeps the first coeff it sees for a tensor).
            if type(self.offsets) is torch.Tensor and not torch.compiler.is_compiling():
                ni = self._nested_int = _eager_nested_int(self.offsets)
                _EXTENT_OF_NODE[id(ni.node)] = self
                _EXTENT_OF_TID[ni.node.t_id] = self
            else:
                ni = _njt.get_tensor_symint(self.offsets, coeff=1)
        return ni

    def batch_stride(self, row: int):
        """``nested_int · row``: the batch stride of a wrapper with this one ragged dim and packed
        rows of ``row`` elements, kept per ``row`` with the nested int (a product of nested ints
        is a new node each time)."""
        if self._nested_int is None:
            return self.nested_int * row
        key = ("batch_stride", row)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._nested_int * row
        return hit

    @property
    def batch(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def total(self):
        return self.sum_carrier.shape[0]

    @property
    def max(self):
        return self.max_carrier.shape[0]

    @property
    def sum_sq(self):
        return self.sq_carrier.shape[0]

    def lengths(self) -> torch.Tensor:
        """(B,) int64 on the values' device (no sync); on the CPU, the host lengths themselves
        (read-only: callers never write into it)."""
        h = self._host_lengths
        if h is not None and type(self.offsets) is torch.Tensor and self.offsets.is_cpu:
            return h
        return self.offsets.diff()

    def host_lengths(self) -> torch.Tensor:
        """(B,) int64 on the CPU, for Python-side decisions (splits in ``unbind``, repr)."""
        if self._host_lengths is None:
            # SYNC: only reached for extents rebuilt from device tensors (e.g. the outputs of a
            # compiled graph); the result is cached on the extent.
            with building():
                self._host_lengths = self.offsets.diff().cpu()
        return self._host_lengths

    def to(self, device: torch.device) -> "RaggedExtent":
        return RaggedExtent(
            self.offsets.to(device),
            self.sum_carrier,
            self.max_carrier,
            self.sq_carrier,
            self._host_lengths,
        )


_is_traced = ref._is_traced
building = ref.building


def same_extent(a: RaggedExtent, b: RaggedExtent) -> bool:
    """Same nested int, or (eagerly) equal per-sample sizes.

    Two extents built independently from equal lengths are different nested ints, as in NJT; we
    still treat them as compatible in eager mode, comparing the host copies (no device sync)."""
    if a is b or a.offsets is b.offsets:
        return True
    if torch.compiler.is_compiling() or _is_traced(a.offsets) or _is_traced(b.offsets):
        # Traced extents are equal only when provably so (one symbol): asking ``==`` of two
        # symbolic nested ints would install a guard between sources dynamo cannot name (frames
        # dynamo compiles after a graph break, NOTE [ Eager-only routes ] in ops/_common.py).
        return bool(statically_known_true(a.nested_int == b.nested_int))
    if a.nested_int == b.nested_int:
        return True
    ha, hb = a.host_lengths(), b.host_lengths()
    return ha.shape == hb.shape and bool(torch.equal(ha, hb))


class Partition:
    """How packed rows split into samples and ragged coordinates; see NOTE [ Packed-row partition ]."""

    __slots__ = ("extents", "offsets", "rows", "cache")

    def __init__(self, extents: Sequence[RaggedExtent], offsets: torch.Tensor, rows) -> None:
        self.extents = tuple(extents)
        self.offsets = offsets
        self.rows = rows
        # Derived maps: read and written through ``derived`` and the methods of NOTE [ Derived maps ].
        self.cache: dict[Any, Any] = {}

    @staticmethod
    def from_extents(extents: Sequence[RaggedExtent]) -> "Partition":
        """The partition whose ragged dims have ``extents`` (storage order), with row offsets
        computed on the device (no sync) and the row count from the carriers where possible."""
        extents = tuple(extents)
        if len(extents) == 1:
            return Partition(extents, extents[0].offsets, extents[0].total)
        with building():  # (as ``RaggedExtent.from_lengths``)
            counts = extents[0].lengths()
            for e in extents[1:]:
                counts = counts * e.lengths()
            offsets = _exclusive_cumsum(counts)
        return Partition(extents, offsets, _rows_of_product(extents))

    @property
    def batch(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def nragged(self) -> int:
        return len(self.extents)

    def host_sizes(self) -> torch.Tensor:
        """(B, R) int64 per-sample extents, on the CPU."""
        if not self.extents:
            return torch.zeros(self.batch, 0, dtype=torch.int64)
        return torch.stack([e.host_lengths() for e in self.extents], dim=1)

    def sizes(self) -> torch.Tensor:
        """(B, R) int64 per-sample extents, on the values' device (no sync)."""
        return torch.stack([e.lengths() for e in self.extents], dim=1)

    def to(self, device: torch.device) -> "Partition":
        """This partition on ``device``: new offsets, hence new nested ints (as ``torch.jagged``);
        extent sharing (one nested int for both dims of a square pair) is kept."""
        moved: dict[int, RaggedExtent] = {}
        extents = []
        for e in self.extents:
            if id(e) not in moved:
                moved[id(e)] = e.to(device)
            extents.append(moved[id(e)])
        if len(extents) == 1 and self.offsets is self.extents[0].offsets:
            offsets = extents[0].offsets
        else:
            offsets = self.offsets.to(device)
        return Partition(extents, offsets, self.rows)

    def same_as(self, other: "Partition") -> bool:
        if self is other:
            return True
        return len(self.extents) == len(other.extents) and all(
            same_extent(a, b) for a, b in zip(self.extents, other.extents)
        )

    # ------------------------------------------------------------ derived maps (NOTE [ Derived maps ])
    def derived(self, key, compute):
        """The cached value of ``key``, computing ``compute(self)`` on the first request."""
        try:
            hit = self.cache.get(key)
        except TypeError:  # a key holding symbolic sizes (tracing, not hot): do not cache
            return compute(self)
        if hit is None:
            with building():
                hit = self.cache[key] = compute(self)
        return hit

    def device_sizes(self) -> torch.Tensor:
        """``sizes()`` (the (B, R) per-sample extents on the device), cached."""
        s = self.cache.get("sizes")
        if s is None:
            with building():
                s = self.cache["sizes"] = self.sizes()
        return s

    def row_sample(self) -> torch.Tensor:
        """(T,) sample of every packed row (cached)."""
        s = self.cache.get("row_sample")
        if s is None:
            with building():
                s = self.cache["row_sample"] = ref.row_sample(self.offsets, self.rows)
        return s

    def row_coords(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sample (T,), coords (T, R))``: every packed row's sample and ragged coordinates (cached)."""
        return self.derived("row_coords", _row_coords)

    def broadcast_map(self, src: "Partition", keep: tuple[int, ...]) -> torch.Tensor:
        """For every row, the row of ``src`` that broadcasting reads there: ``src``'s ragged dims
        are this partition's dims ``keep``, each of this one's size or 1 in each sample
        (``broadcast_extent``); a dim of size 1 is read at coordinate 0 in the samples where it
        has size 1, and at the row's own coordinate in the others. Cached (one ``src`` per ``keep``)."""
        key = ("broadcast", keep)
        hit = self.cache.get(key)
        if hit is not None and hit[0] is src:
            return hit[1]
        with building():
            sample, coords = self.row_coords()
            sizes = src.device_sizes()
            mine = torch.where(sizes[sample] == 1, 0, coords[:, list(keep)])
            index = packed_rows(src.offsets, sizes, sample, mine)
        self.cache[key] = (src, index)
        return index

    def map_to_sub(self, keep: tuple[int, ...]) -> tuple[torch.Tensor, "Partition"]:
        """``(index, sub)``: the partition ``sub`` keeping ragged dims ``keep`` and, for every row,
        its row in ``sub`` (``kernels.reference.row_map``). ``keep = ()`` maps rows to samples
        (one row per sample). Cached; ``sub`` is the one ``note_sub`` recorded, if any."""
        hit = self.cache.get(("map", keep))
        if hit is not None:
            return hit
        with building():
            return self._build_map(keep)

    def _build_map(self, keep: tuple[int, ...]) -> tuple[torch.Tensor, "Partition"]:
        sub = self.cache.get(("sub", keep))
        if sub is None:
            sub = partition_for([self.extents[k] for k in keep]) if keep else _batch_partition(self)
            self.cache[("sub", keep)] = sub
        if keep == tuple(range(self.nragged)):
            index = torch.arange(self.rows, device=self.offsets.device)
        elif not keep:
            index = self.row_sample()
        elif list(keep) == sorted(set(keep)) and not _is_traced(self.offsets):
            index = _row_map_by_segments(self, keep, sub)
        else:
            index = ref.row_map(self.offsets, self.device_sizes(), self.rows, keep, sub.offsets)
        hit = self.cache[("map", keep)] = (index, sub)
        return hit

    def note_sub(self, keep: tuple[int, ...], sub: "Partition") -> None:
        """Record that ``sub`` (an operand's partition) is this partition restricted to ragged
        dims ``keep``, so that a reduction back over the dropped dims returns ``sub`` itself (no
        new nested int, docs/design.md §1). A partition already recorded stays."""
        self.cache.setdefault(("sub", keep), sub)

    def reorder_rows(self, order: tuple[int, ...]) -> tuple[torch.Tensor, "Partition"]:
        """``(index, out)``: the partition ``out`` whose k-th ragged dim is this one's
        ``order[k]``, and for every row of ``out`` the row of this partition it gathers (cached)."""
        key = ("reorder", order)
        hit = self.cache.get(key)
        if hit is None:
            with building():
                out = partition_for([self.extents[k] for k in order])
                index = ref.row_reorder(out.offsets, out.device_sizes(), out.rows, order, self.offsets)
                hit = self.cache[key] = (index, out)
        return hit

    def segments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cu, seg_sample)`` along the last ragged dim: every (sample, coordinates of the other
        ragged dims) owns consecutive rows, a *segment*; ``cu (N+1,)`` are the segments' row
        offsets (flash-attn's ``cu_seqlens``), ``seg_sample (N,)`` each segment's sample (cached)."""
        return self.derived("segments", _segments)

    def logical_size_stride(self, values: torch.Tensor, ragged_dims: tuple[int, ...]):
        """The logical ``(size, stride, stored_stride)`` of a wrapper of ``values`` with this
        partition, cached: every op builds one, and computing the nested ints (a weak-dict lookup
        each) dominated the construction cost. Strides of ragged dims are the packed row stride
        (plain ints; nested ints cannot be multiplied together). ``stored_stride`` is the stride
        with plain ints only, which the wrapper's C++ fields hold (NOTE [ Building a wrapper ] in
        wrappers.py)."""
        key = ("size_stride", ragged_dims, values.shape[1:], values.stride())
        try:
            hit = self.cache.get(key)
        except TypeError:  # symbolic sizes while tracing are unhashable; tracing is not hot
            size, stride = _size_stride(self, values, ragged_dims)
            return size, stride, stride
        if hit is None:
            size, stride = _size_stride(self, values, ragged_dims)
            stored = tuple(values.stride()[0] if isinstance(s, torch.SymInt) else s for s in stride) if values.dim() else stride
            hit = self.cache[key] = (size, stride, stored)
        return hit


def broadcast_extent(a: RaggedExtent, b: RaggedExtent) -> Optional[RaggedExtent]:
    """The extent two operands' differing extents of one ragged dim broadcast to, when every
    sample's sizes broadcast as dense sizes do — equal, or one of them 1 (``x[:, :1] + x``; the
    one row an empty sample gets from ``F.pad``) — and the broadcast sizes are one operand's
    (that extent); else None. Eager only: it compares host sizes."""
    if _is_traced(a.offsets) or _is_traced(b.offsets) or a.batch != b.batch:
        return None
    la, lb = a.host_lengths(), b.host_lengths()
    if not bool(((la == lb) | (la == 1) | (lb == 1)).all()):
        return None
    wide = torch.where(la == 1, lb, la)
    return b if torch.equal(wide, lb) else a if torch.equal(wide, la) else None


def partition_for(extents: Sequence[RaggedExtent]) -> Partition:
    """The canonical partition of ``extents``, cached on the first extent so that tensors
    created by the same structural move share it (and its derived maps)."""
    extents = tuple(extents)
    key = ("partition",) + tuple(id(e) for e in extents)
    cache = extents[0].cache
    hit = cache.get(key)
    # The cached partition holds its extents, so their ids cannot have been reused.
    if hit is not None and all(a is b for a, b in zip(hit.extents, extents)):
        return hit
    with building():
        p = cache[key] = Partition.from_extents(extents)
    return p


def mapped_extent(e: RaggedExtent, key, lengths_of, distinct: bool = False) -> RaggedExtent:
    """The extent whose per-sample sizes are ``lengths_of(e.host_lengths())`` (a (B,) int64 host
    tensor), cached on ``e`` under ``("mapped", key)``: ``key`` names the size map (e.g. a
    strided window's ``(kernel, stride, padding, dilation)``), so two ops that map the same extent
    by the same rule give one nested int (a strided conv and a pooling of the same geometry can be
    added). A map that keeps every size returns ``e`` itself, and one that gives back the sizes of
    an extent ``e`` was mapped from returns that extent (``_source_with``: ``cat([x[:, :1],
    x[:, 1:]], 1)`` has ``x``'s nested int) — unless ``distinct``: a size that is another
    quantity whatever the sizes (``n // k`` of a batch whose samples are all empty). Eager only (host
    lengths)."""
    k = ("mapped", key)
    hit = e.cache.get(k)
    if hit is None:
        with building():
            host = e.host_lengths()
            out = lengths_of(host).to(torch.int64)
            hit = None if distinct else e if torch.equal(out, host) else _source_with(e, out)
            if hit is None:
                hit = RaggedExtent.from_lengths(out, e.offsets.device)
                hit.cache[("source",)] = weakref.ref(e)
        e.cache[k] = hit
    return hit


def _source_with(e: RaggedExtent, lengths: torch.Tensor) -> Optional[RaggedExtent]:
    """The nearest of the (at most 16) extents that ``e`` was mapped from, through the weak
    ``("source",)`` links of ``mapped_extent`` while their tensors live, whose sizes are
    ``lengths``; else None. Totals (the carriers' ints) are compared before host lengths."""
    link, total = e.cache.get(("source",)), int(lengths.sum())
    for _ in range(16):  # a long chain (a cache grown by cats) is not walked whole
        src = link() if link is not None else None
        if src is None or (src.total == total and torch.equal(src.host_lengths(), lengths)):
            return src
        link = src.cache.get(("source",))
    return None


def mapped_from(e: RaggedExtent, extents: Sequence[RaggedExtent]) -> bool:
    """Whether ``e`` was mapped (``mapped_extent``, through at most 16 live links) from one of
    ``extents``: ``n - 1`` or ``n // 2`` of a batch's ``n``."""
    for _ in range(16):
        link = e.cache.get(("source",))
        e = link() if link is not None else None
        if e is None or any(e is f for f in extents):
            return e is not None
    return False


def flat_extent(p: Partition) -> RaggedExtent:
    """The extent of ``p``'s ragged dims flattened into one (per-sample size Π_k n_k, offsets the
    partition's row offsets, so rows keep their order), cached on ``p``; its partition remembers
    ``p`` (``("unflat",)``) so that unflattening back gives ``p`` and its nested ints."""
    def compute(p: Partition) -> RaggedExtent:
        if p.nragged == 1:
            return p.extents[0]
        prod = p.extents[0].host_lengths()
        for e in p.extents[1:]:
            prod = prod * e.host_lengths()
        e = RaggedExtent.from_lengths(prod, p.offsets.device, offsets=p.offsets)
        partition_for([e]).cache[("unflat",)] = p
        return e

    return p.derived(("flat",), compute)


def register_partition(p: Partition) -> Partition:
    """Make ``p`` the canonical partition of its extents (constructors call this, so that a
    structural move back to these extents returns ``p`` itself)."""
    if p.extents:
        p.extents[0].cache[("partition",) + tuple(id(e) for e in p.extents)] = p
    return p


def _batch_partition(p: Partition) -> Partition:
    """One row per sample: what remains when every ragged dim is reduced."""
    off = torch.arange(p.batch + 1, device=p.offsets.device, dtype=torch.int64)
    return Partition((), off, p.batch)


def _row_coords(p: Partition):
    return ref.row_coords(p.offsets, p.device_sizes(), p.rows)


def _row_map_by_segments(p: Partition, keep: tuple[int, ...], sub: Partition) -> torch.Tensor:
    """``ref.row_map`` (every row's row in the sub-partition keeping ragged dims ``keep``,
    increasing), built eagerly from the segments along the last ragged dim (``segments``): rows
    of one segment differ only in the last coordinate, so the map is a per-segment value spread
    over the segment's rows (``repeat_interleave``), plus the last coordinate where ``keep``
    holds the last dim. The per-segment values are the map of the partition without the last
    dim (a recursion on Σ rows/n, cached there). The traced form stays ``ref.row_map`` (NOTE
    [ Index maps under Inductor ]); this one costs two passes over the rows instead of about ten
    ops of them, which is most of what a new pair structure costs on the host."""
    r = p.nragged
    cu, seg_sample = p.segments()
    seg_len = cu.diff()
    last = keep[-1] == r - 1
    if not last and keep == tuple(range(r - 1)):
        # the sub-partition is the prefix itself: segment k maps to row k
        return torch.repeat_interleave(seg_len, output_size=p.rows)
    prefix = partition_for(p.extents[:-1])
    pidx, psub = prefix.map_to_sub(keep[:-1] if last else keep)
    if not last:
        return torch.repeat_interleave(pidx, seg_len, output_size=p.rows)
    # the segment's first row maps to sub row  o'_i + rank · n_last  (rank: its row in the
    # kept prefix dims, within the sample; 0 where only the last dim is kept), and row j of the
    # segment to that plus j
    start = sub.offsets.index_select(0, seg_sample)
    if len(keep) > 1:
        n_last = p.extents[-1].lengths().index_select(0, seg_sample)
        start = start + (pidx - psub.offsets.index_select(0, seg_sample)) * n_last
    shift = cu[:-1] - start
    return torch.arange(p.rows, device=cu.device) - torch.repeat_interleave(shift, seg_len, output_size=p.rows)


def _segments(p: Partition):
    if p.nragged == 1:
        return p.offsets, torch.arange(p.batch, device=p.offsets.device)
    sample = partition_for(p.extents[:-1]).row_sample()
    return _exclusive_cumsum(p.extents[-1].lengths()[sample]), sample


def _size_stride(p: Partition, values: torch.Tensor, ragged_dims: tuple[int, ...]):
    ndim = len(ragged_dims) + values.dim()
    size = [p.batch]
    vstride = values.stride()
    row = vstride[0] if values.dim() else 1
    stride = [row]
    k = s = 1
    for d in range(1, ndim):
        if k - 1 < len(ragged_dims) and ragged_dims[k - 1] == d:
            size.append(p.extents[k - 1].nested_int)
            stride.append(row)
            k += 1
        else:
            size.append(values.shape[s])
            stride.append(vstride[s])
            s += 1
    if len(ragged_dims) == 1:
        # As torch.jagged reports it: the batch stride is the ragged size times the packed-row
        # stride (``4*j0`` for a contiguous (B, j0, 4)). With several ragged dims it would be a
        # product of nested ints, which they do not support; it stays the packed-row stride.
        stride[0] = p.extents[0].batch_stride(row)
    return tuple(size), tuple(stride)


def _rows_of_product(extents: tuple[RaggedExtent, ...]):
    """Σ_i Π_k n_{i,k}: from a carrier for the square case, else from the host lengths."""
    if len(extents) == 2 and same_extent(extents[0], extents[1]):
        return extents[0].sum_sq
    if any(_is_traced(e.offsets) for e in extents):
        raise NotImplementedError(
            "multi_jagged: a new partition of distinct ragged extents "
            f"({len(extents)} dims) inside a traced region (its row count needs host sizes): reordering the ragged "
            "dims of a rectangular batch ((B, j0, j1).transpose(1, 2)) or combining rectangular extents anew runs "
            "eagerly only; without fullgraph it is a graph break, or build that tensor outside the compiled region"
        )
    prod = extents[0].host_lengths()
    for e in extents[1:]:
        prod = prod * e.host_lengths()
    # SYNC: none — host lengths.
    return int(prod.sum()) if prod.numel() else 0


# ----------------------------------------------------------------------------- factories
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


def _known_extent(offsets: torch.Tensor, lengths: torch.Tensor) -> "Optional[RaggedExtent]":
    """The eager extent already made on ``offsets`` (the same tensor object) with these host
    ``lengths``, or None."""
    if type(offsets) is not torch.Tensor:
        return None
    ni = _njt._tensor_symint_registry.get(offsets)
    e = None if ni is None else extent_of(ni)
    if e is None or e.offsets is not offsets or e._host_lengths is None:
        return None
    return e if torch.equal(e._host_lengths, lengths) else None


def partition_from_sizes(host_sizes: torch.Tensor, device, offsets: Optional[torch.Tensor] = None) -> Partition:
    """The registered partition of per-sample ``host_sizes`` (B, R); dims with equal sizes share
    one extent (one nested int). With one ragged dim, ``offsets`` (if given) become the extent's
    offsets, so that a ``torch.jagged`` tensor's nested int carries over."""
    if offsets is not None and host_sizes.shape[1] == 1:
        known = _known_extent(offsets, host_sizes[:, 0])
        if known is not None:
            # offsets of a live batch (``from_packed(v, x.offsets(), x.sizes())``): its extent and
            # canonical partition, so that the two combine without relabelling
            return partition_for([known])
    extents = _extents_for(host_sizes, device, offsets)
    if len(extents) == 1:
        p = Partition(extents, extents[0].offsets, extents[0].total)
    else:
        p = Partition.from_extents(extents)
        if offsets is not None:
            p = Partition(p.extents, offsets, p.rows)
    return register_partition(p)


def offsets_problem(name: str, off: torch.Tensor, rows: int, counts: torch.Tensor) -> Optional[str]:
    """What is wrong with host offsets ``off`` (B+1,) of ``rows`` packed rows whose samples hold
    ``counts`` (B,) rows each, or None."""
    if off[0] != 0:
        return f"{name} must start at 0, got {name}[0] = {int(off[0])}"
    if (off.diff() < 0).any():
        return f"{name} must be non-decreasing, got {off.tolist()}"
    if off[-1] != rows:
        return f"{name} must end at the packed row count {rows}, got {name}[-1] = {int(off[-1])}"
    if not torch.equal(off.diff(), counts):
        return f"{name} disagree with sizes: rows per sample {off.diff().tolist()} vs product of sizes {counts.tolist()}"
    return None


# The extent arithmetic the size nodes answer with (ragged_sizes.py, which imports nothing of ours).
EXTENTS.node_extent = _node_extent
EXTENTS.quotient = _quotient
EXTENTS.mapped_extent = mapped_extent
EXTENTS.product_extent = _product_extent
