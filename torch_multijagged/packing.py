"""The varlen and packing toolbox: bin packing, position / segment ids, the block-diagonal mask,
padding rates and a ``DataLoader`` ``collate_fn``.

Everything here is data-pipeline code built on the public constructors (``nested_tensor``,
``from_packed``); it knows nothing of the op table. Bin packing runs on the host (it is
preprocessing, done once per batch or offline), the id and mask builders are vectorised.

NOTE [ Packing correctness ]: a packed sequence is correct only when (a) attention stays inside
each sample — a block-diagonal mask ``seg[q] == seg[k]`` or varlen boundaries (``offsets``) —
and (b) position ids restart at 0 for each sample. ``segment_ids`` / ``block_diagonal_mask`` give
(a), ``position_ids`` gives (b).
"""

from __future__ import annotations

import operator
from typing import Any, Mapping, Optional, Sequence, cast

import torch

from .constructors import from_packed, nested_tensor
from .tensor import MultiJaggedTensor

__all__ = [
    "first_fit_decreasing",
    "position_ids",
    "packed_position_ids",
    "segment_ids",
    "block_diagonal_mask",
    "padding_rate",
    "collate",
]

_OVER_LENGTH = ("error", "split", "truncate")


# ----------------------------------------------------------------------------- lengths
def _host_lengths(op: str, lengths) -> torch.Tensor:
    """``lengths`` (a sequence of ints or a 1-D integer tensor) as a host int64 tensor."""
    if isinstance(lengths, MultiJaggedTensor):
        raise TypeError(f"{op}(): expected lengths to be a sequence of ints or a 1-D integer tensor, got a multi_jagged tensor")
    if isinstance(lengths, torch.Tensor):
        if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
            raise TypeError(f"{op}(): expected lengths of an integer dtype, got {lengths.dtype}")
        # SYNC: packing decisions are host-side preprocessing; one copy of the lengths.
        host = lengths.detach().to("cpu", torch.int64)
    else:
        try:
            host = torch.tensor([operator.index(n) for n in lengths], dtype=torch.int64)
        except TypeError:
            raise TypeError(f"{op}(): expected lengths to be a sequence of ints, got {lengths!r}") from None
    if host.dim() != 1:
        raise ValueError(f"{op}(): expected lengths to be 1-D, got shape {tuple(host.shape)}")
    if (host < 0).any():
        raise ValueError(f"{op}(): expected non-negative lengths, got {host.tolist()}")
    return host


def _check_budget(op: str, budget) -> int:
    if isinstance(budget, bool):
        raise TypeError(f"{op}(): expected budget to be a positive int, got {budget!r}")
    try:
        b = operator.index(budget)
    except TypeError:
        raise TypeError(f"{op}(): expected budget to be a positive int, got {budget!r}") from None
    if b <= 0:
        raise ValueError(f"{op}(): expected budget to be a positive int, got {b}")
    return b


def _source(op: str, x, lengths, offsets, dim: int):
    """(host lengths (B,), device offsets (B+1,) or None, device) of exactly one of ``x`` (a
    multi_jagged tensor, ragged along ``dim``), ``lengths`` or ``offsets``."""
    given = [a is not None for a in (x, lengths, offsets)]
    if sum(given) != 1:
        raise TypeError(f"{op}(): expected exactly one of x, lengths= or offsets=, got {sum(given)}")
    if x is not None:
        if not isinstance(x, MultiJaggedTensor):
            raise TypeError(f"{op}(): expected x to be a multi_jagged tensor, got {type(x).__name__}; pass lengths= for plain lengths")
        if dim not in x.ragged_dims:
            raise ValueError(f"{op}(): expected dim to be a ragged dim of x {x.ragged_dims}, got {dim}")
        k = x.ragged_dims.index(dim)
        # The dim's own offsets: a tensor built on them shares x's nested int for this dim.
        off = x.offsets(dim)
        return x.sizes()[:, k].contiguous(), off, off.device
    if lengths is not None:
        host = _host_lengths(op, lengths)
        device = lengths.device if isinstance(lengths, torch.Tensor) else torch.device("cpu")
        return host, None, device
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.dtype != torch.int64 or offsets.numel() < 1:
        raise TypeError(f"{op}(): expected offsets to be a 1-D int64 tensor of B + 1 >= 1 entries, got {getattr(offsets, 'shape', type(offsets))}")
    # SYNC: the host lengths size the result (once per call; preprocessing).
    host_off = offsets.detach().cpu()
    if host_off[0] != 0 or (host_off.diff() < 0).any():
        raise ValueError(f"{op}(): expected offsets starting at 0 and non-decreasing, got {host_off.tolist()}")
    return host_off.diff(), offsets, offsets.device


# ----------------------------------------------------------------------------- bin packing
def first_fit_decreasing(lengths, budget: int, *, over_length: str = "error") -> list[list[int]]:
    r"""Packs samples of the given lengths into bins of at most ``budget`` tokens, first-fit-decreasing.

    Samples are taken longest first (ties by increasing index, so the result is deterministic)
    and each goes into the first bin with room; a new bin opens only when none has room.
    Zero-length samples go into the first bin (an empty input gives ``[]``). Runs on the host:
    packing is preprocessing.

    ``over_length`` says what happens to a sample longer than ``budget``:

    * ``"error"`` (default): ``ValueError`` naming the sample index, its length and the budget;
    * ``"truncate"``: the sample is placed as if it had ``budget`` tokens (a bin of its own); the
      caller keeps its first ``budget`` tokens;
    * ``"split"``: the sample is cut into pieces of ``budget`` tokens and a remainder; its index
      appears once per piece, and the k-th occurrence (in bin order) is piece k, rows
      ``[k·budget, min((k+1)·budget, n))`` — full pieces sort first and fill bins of their own,
      so the remainder always lands in a later bin.

    Args:
        lengths (sequence of ints or Tensor): the ``(B,)`` non-negative sample lengths.
        budget (int): the capacity of a bin in tokens, positive.

    Keyword args:
        over_length (str, optional): ``"error"``, ``"truncate"`` or ``"split"``, as above.
            Default: ``"error"``.

    Returns:
        list of lists of ints: the bins in opening order, each the sample indices it holds in
        placement order.

    Example::

        >>> import torch_multijagged as mj
        >>> mj.first_fit_decreasing([5, 3, 7, 2, 0, 4], 8)
        [[2, 4], [0, 1], [5, 3]]
        >>> mj.first_fit_decreasing([10, 3], 4, over_length="split")
        [[0], [0], [1], [0]]
        >>> mj.first_fit_decreasing([10, 3], 4, over_length="truncate")
        [[0], [1]]
    """
    op = "first_fit_decreasing"
    host = _host_lengths(op, lengths)
    budget = _check_budget(op, budget)
    if over_length not in _OVER_LENGTH:
        raise ValueError(f"{op}(): expected over_length to be one of {_OVER_LENGTH}, got {over_length!r}")
    # SYNC: none — host lengths; packing is host-side preprocessing.
    items: list[tuple[int, int]] = []  # (size, sample index), one per piece
    for i, n in enumerate(host.tolist()):
        if n <= budget:
            items.append((n, i))
        elif over_length == "error":
            raise ValueError(
                f"{op}(): sample {i} has length {n}, over the budget of {budget} tokens; "
                f"pass over_length='split' or 'truncate' to place it"
            )
        elif over_length == "truncate":
            items.append((budget, i))
        else:
            full, rest = divmod(n, budget)
            items.extend([(budget, i)] * full)
            if rest:
                items.append((rest, i))
    # Stable sort: equal sizes keep index order, and a split sample's pieces keep piece order.
    items.sort(key=lambda it: -it[0])
    bins: list[list[int]] = []
    room: list[int] = []
    for size, i in items:
        for b, r in enumerate(room):
            if size <= r:
                bins[b].append(i)
                room[b] -= size
                break
        else:
            bins.append([i])
            room.append(budget - size)
    return bins


# ----------------------------------------------------------------------------- ids and mask
def packed_position_ids(x=None, *, lengths=None, offsets=None, dim: int = 1) -> torch.Tensor:
    r"""Returns the positions of the packed rows, restarting at 0 for every sample.

    For lengths ``[3, 0, 2]`` it is ``[0, 1, 2, 0, 1]``: the packed form of
    :func:`position_ids`. Give exactly one of a multi_jagged ``x`` (positions along its ragged
    ``dim``), ``lengths`` or ``offsets``.

    Args:
        x (MultiJaggedTensor, optional): a batch ragged along ``dim``. Default: ``None``.

    Keyword args:
        lengths (sequence of ints or Tensor, optional): ``(B,)`` non-negative sample lengths.
            Default: ``None``.
        offsets (Tensor, optional): ``(B+1,)`` int64 sample offsets, starting at 0 and
            non-decreasing. Default: ``None``.
        dim (int, optional): the ragged dim of ``x`` to read. Default: ``1``.

    Returns:
        Tensor: ``(T,)`` int64 positions, ``T`` the total length, on the device of ``x`` /
        ``lengths`` / ``offsets`` (the CPU for a list of lengths).

    Example::

        >>> import torch, torch_multijagged as mj
        >>> mj.packed_position_ids(lengths=[3, 0, 2])
        tensor([0, 1, 2, 0, 1])
        >>> mj.packed_position_ids(offsets=torch.tensor([0, 1, 4]))
        tensor([0, 0, 1, 2])
        >>> mj.packed_position_ids(mj.nested_tensor([torch.ones(2, 8), torch.ones(3, 8)]))
        tensor([0, 1, 0, 1, 2])
    """
    host, off, device = _source("packed_position_ids", x, lengths, offsets, dim)
    return _positions(host, off, device)


def _positions(host: torch.Tensor, off: Optional[torch.Tensor], device) -> torch.Tensor:
    total = int(host.sum())  # SYNC: none — host lengths
    starts = (off[:-1] if off is not None else (host.cumsum(0) - host).to(device)).to(device)
    # arange(T) minus each row's sample start; output_size avoids a device sync.
    return torch.arange(total, device=device) - starts.repeat_interleave(host.to(device), output_size=total)


def position_ids(x=None, *, lengths=None, offsets=None, dim: int = 1) -> MultiJaggedTensor:
    r"""Returns the per-sample positions ``0 … nᵢ-1`` as a multi_jagged ``(B, j)`` int64 tensor.

    From a multi_jagged ``x`` of shape ``(B, …, j, …)`` (``j`` at ``dim``) the result shares
    ``x``'s nested int for ``j``, so it adds to / indexes alongside ``x``'s ragged dim; from
    ``offsets`` it shares the nested int keyed on those offsets; from ``lengths`` it gets a new
    one. Give exactly one of the three. ``.values()`` is the packed form
    (:func:`packed_position_ids`).

    Args:
        x (MultiJaggedTensor, optional): a batch ragged along ``dim``. Default: ``None``.

    Keyword args:
        lengths (sequence of ints or Tensor, optional): ``(B,)`` non-negative sample lengths.
            Default: ``None``.
        offsets (Tensor, optional): ``(B+1,)`` int64 sample offsets, starting at 0 and
            non-decreasing. Default: ``None``.
        dim (int, optional): the ragged dim of ``x`` to read. Default: ``1``.

    Returns:
        MultiJaggedTensor: ``(B, j)`` int64 positions.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = mj.nested_tensor([torch.ones(3, 4), torch.ones(1, 4)])
        >>> pos = mj.position_ids(x)
        >>> pos.shape == x.shape[:2], pos.values()
        (True, tensor([0, 1, 2, 0]))
        >>> [p.tolist() for p in mj.position_ids(lengths=[2, 0, 3]).unbind()]
        [[0, 1], [], [0, 1, 2]]
    """
    if torch.compiler.is_compiling() and isinstance(x, MultiJaggedTensor) and lengths is None and offsets is None:
        # traced (no host sizes to read): each sample's running count along the dim, made from
        # the batch's own shape, so one graph serves new lengths (dynamo reads no attribute of x)
        return cast(MultiJaggedTensor, x.new_ones((x.shape[0], x.shape[dim]), dtype=torch.int64).cumsum(1) - 1)
    host, off, device = _source("position_ids", x, lengths, offsets, dim)
    values = _positions(host, off, device)
    if off is None:
        off = torch.cat([host.new_zeros(1), host.cumsum(0)]).to(device)
    return from_packed(values, off, host)


def segment_ids(x=None, *, lengths=None, offsets=None, dim: int = 1) -> torch.Tensor:
    r"""Returns the sample index of every packed row.

    Lengths ``[3, 0, 2]`` give ``[0, 0, 0, 2, 2]``. Give exactly one of a multi_jagged ``x``
    (rows along its ragged ``dim``), ``lengths`` or ``offsets``, as for
    :func:`packed_position_ids`.

    Args:
        x (MultiJaggedTensor, optional): a batch ragged along ``dim``. Default: ``None``.

    Keyword args:
        lengths (sequence of ints or Tensor, optional): ``(B,)`` non-negative sample lengths.
            Default: ``None``.
        offsets (Tensor, optional): ``(B+1,)`` int64 sample offsets, starting at 0 and
            non-decreasing. Default: ``None``.
        dim (int, optional): the ragged dim of ``x`` to read. Default: ``1``.

    Returns:
        Tensor: ``(T,)`` int64 sample indices, ``T`` the total length.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> mj.segment_ids(lengths=[3, 0, 2])
        tensor([0, 0, 0, 2, 2])
        >>> mj.segment_ids(offsets=torch.tensor([0, 1, 4]))
        tensor([0, 1, 1, 1])
    """
    host, _, device = _source("segment_ids", x, lengths, offsets, dim)
    total = int(host.sum())  # SYNC: none — host lengths
    return torch.arange(host.shape[0], device=device).repeat_interleave(host.to(device), output_size=total)


def block_diagonal_mask(x=None, *, lengths=None, offsets=None, dim: int = 1) -> torch.Tensor:
    r"""Returns the block-diagonal attention mask of a packed sequence.

    ``mask[q, k]`` is True iff rows ``q`` and ``k`` belong to the same sample
    (``seg[q] == seg[k]`` with ``seg`` from :func:`segment_ids`). For code that needs an
    explicit mask (dense SDPA's ``attn_mask``); it is O(T²) memory, so prefer varlen boundaries
    where available. A zero-length sample has no rows and so no block. Give exactly one of a
    multi_jagged ``x``, ``lengths`` or ``offsets``, as for :func:`packed_position_ids`.

    Args:
        x (MultiJaggedTensor, optional): a batch ragged along ``dim``. Default: ``None``.

    Keyword args:
        lengths (sequence of ints or Tensor, optional): ``(B,)`` non-negative sample lengths.
            Default: ``None``.
        offsets (Tensor, optional): ``(B+1,)`` int64 sample offsets, starting at 0 and
            non-decreasing. Default: ``None``.
        dim (int, optional): the ragged dim of ``x`` to read. Default: ``1``.

    Returns:
        Tensor: the dense ``(T, T)`` bool mask, ``T`` the total length.

    Example::

        >>> import torch_multijagged as mj
        >>> mj.block_diagonal_mask(lengths=[2, 0, 1])
        tensor([[ True,  True, False],
                [ True,  True, False],
                [False, False,  True]])
    """
    seg = segment_ids(x, lengths=lengths, offsets=offsets, dim=dim)
    return seg.unsqueeze(1) == seg.unsqueeze(0)


# ----------------------------------------------------------------------------- padding rate
def padding_rate(x, *, bins: Optional[Sequence[Sequence[int]]] = None, budget: Optional[int] = None) -> float:
    r"""Returns the fraction of padding tokens, padded to the longest sample or packed into bins.

    * ``padding_rate(x)`` for a multi_jagged ``x`` or ``lengths``: padding each sample to the
      longest, ``1 − occupancy`` (lengths: ``1 − Σnᵢ / (B · max nᵢ)``; 0.0 when there is no
      envelope, e.g. B = 0 or all lengths 0).
    * ``padding_rate(lengths, bins=bins, budget=L)``: after packing into ``bins`` of ``L`` tokens
      (as :func:`first_fit_decreasing` returns), ``1 − tokens / (len(bins) · L)``. A sample index
      that occurs several times counts as consecutive pieces (``over_length="split"``), one
      occurrence of an over-length sample as its first ``L`` tokens (``"truncate"``). A bin over
      ``L`` raises ``ValueError``.

    Args:
        x (MultiJaggedTensor or sequence of ints or Tensor): a batch, or the ``(B,)`` sample
            lengths.

    Keyword args:
        bins (list of lists of ints, optional): the sample indices of each bin (lengths only).
            Default: ``None`` (padding to the longest).
        budget (int, optional): the capacity of a bin in tokens; required with ``bins``.
            Default: ``None``.

    Returns:
        float: the padding fraction, in ``[0, 1]``.

    Example::

        >>> import torch_multijagged as mj
        >>> lengths = [5, 3, 7, 2, 0, 4]
        >>> mj.padding_rate(lengths)  # 1 - 21 / (6 · 7)
        0.5
        >>> bins = mj.first_fit_decreasing(lengths, 8)
        >>> mj.padding_rate(lengths, bins=bins, budget=8)  # 1 - 21 / (3 · 8)
        0.125
    """
    op = "padding_rate"
    if isinstance(x, MultiJaggedTensor):
        if bins is not None:
            raise TypeError(f"{op}(): expected lengths with bins=, got a multi_jagged tensor (pass x.sizes()[:, 0])")
        return 1.0 - x.occupancy()
    host = _host_lengths(op, x)
    if bins is None:
        if budget is not None:
            raise TypeError(f"{op}(): budget= needs bins=")
        envelope = host.shape[0] * int(host.max()) if host.numel() else 0
        return 0.0 if envelope == 0 else 1.0 - int(host.sum()) / envelope
    budget = _check_budget(op, budget)
    n = host.tolist()
    seen = [0] * len(n)
    tokens = 0
    for b, sample_ids in enumerate(bins):
        in_bin = 0
        for i in sample_ids:
            if not 0 <= i < len(n):
                raise ValueError(f"{op}(): bin {b} names sample {i}, but there are {len(n)} samples")
            in_bin += max(0, min(budget, n[i] - seen[i] * budget))
            seen[i] += 1
        if in_bin > budget:
            raise ValueError(f"{op}(): bin {b} holds {in_bin} tokens, over the budget of {budget}")
        tokens += in_bin
    return 0.0 if not bins else 1.0 - tokens / (len(bins) * budget)


# ----------------------------------------------------------------------------- collate
def _collate_tensors(op: str, name: str, ts: Sequence[torch.Tensor], shared: Optional[dict] = None):
    """One field's batch. ``shared`` maps the lengths (and device) of the fields collated so far
    to their batch: a field of the same lengths is built on that batch's offsets, so the fields of
    one sample (tokens, labels, a mask) share a nested int and combine under ``torch.compile``
    too (NOTE [ Traced operands built apart ] in bridge.py)."""
    head = f"{op}(): field {name!r}: " if name else f"{op}(): "
    ranks = {t.dim() for t in ts}
    if len(ranks) != 1:
        raise ValueError(f"{head}expected tensors of one rank, got ranks {sorted(ranks)}")
    if ranks == {0}:
        return torch.stack(list(ts))  # scalars (labels): no ragged dim to keep
    first = ts[0]
    for i, t in enumerate(ts):
        if t.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"{head}expected samples to vary only along dim 0, got shapes "
                f"{tuple(first.shape)} (sample 0) and {tuple(t.shape)} (sample {i})"
            )
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{head}expected one dtype and device, got {first.dtype}/{first.device} and {t.dtype}/{t.device} (sample {i})")
    # ragged_dims=(1,) always: a batch whose lengths happen to agree keeps the ragged schema.
    key = (tuple(t.shape[0] for t in ts), first.device)
    like = None if shared is None else shared.get(key)
    if like is not None:
        return from_packed(torch.cat(list(ts)), like.offsets(), like.sizes())
    out = nested_tensor(list(ts), ragged_dims=(1,))
    if shared is not None:
        shared[key] = out
    return out


def collate(samples: Sequence[Any]):
    r"""Collates a list of samples into multi_jagged batches: a ``DataLoader`` ``collate_fn``.

    * tensors ``(nᵢ, …)`` (varying along dim 0, other dims equal) → one ``(B, j, …)``
      multi_jagged tensor, ragged along dim 1 even when every length agrees (a stable schema);
      0-dim tensors (labels) are stacked to a dense ``(B,)``;
    * dicts with the same keys → a dict of the above per key; a key whose values are not tensors
      (strings, ids) gives the list of its values. Fields of equal lengths in every sample share
      one nested int (``batch["tokens"].shape[1] == batch["labels"].shape[1]``).

    Mismatched keys, ranks, trailing dims, dtypes or a mix of tensors and non-tensors in one field
    raise ``ValueError`` / ``TypeError`` naming the field.

    Args:
        samples (sequence of Tensor or of dicts): the ``B >= 1`` samples of the batch.

    Returns:
        MultiJaggedTensor or Tensor or dict: the batch, of the samples' kind.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> samples = [{"tokens": torch.ones(3, 4), "label": torch.tensor(1), "name": "a"},
        ...            {"tokens": torch.ones(1, 4), "label": torch.tensor(0), "name": "b"}]
        >>> batch = mj.collate(samples)
        >>> batch["tokens"].ragged_dims, batch["tokens"].sizes().tolist()
        ((1,), [[3], [1]])
        >>> batch["label"], batch["name"]
        (tensor([1, 0]), ['a', 'b'])
        >>> loader = torch.utils.data.DataLoader(samples, batch_size=2, collate_fn=mj.collate)
        >>> [t.shape for t in next(iter(loader))["tokens"].unbind()]
        [torch.Size([3, 4]), torch.Size([1, 4])]
    """
    op = "collate"
    samples = list(samples)
    if not samples:
        raise ValueError(f"{op}(): expected at least one sample, got an empty batch")
    first = samples[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(s, torch.Tensor) for s in samples):
            raise TypeError(f"{op}(): expected every sample to be a tensor, got {sorted({type(s).__name__ for s in samples})}")
        return _collate_tensors(op, "", samples)
    if isinstance(first, Mapping):
        keys = list(first.keys())
        for i, s in enumerate(samples):
            if not isinstance(s, Mapping):
                raise TypeError(f"{op}(): expected every sample to be a dict, got {type(s).__name__} (sample {i})")
            if set(s.keys()) != set(keys):
                raise ValueError(f"{op}(): expected every sample to have keys {sorted(map(str, keys))}, got {sorted(map(str, s.keys()))} (sample {i})")
        out: dict = {}
        shared: dict = {}
        for k in keys:
            vals = [s[k] for s in samples]
            is_t = [isinstance(v, torch.Tensor) for v in vals]
            if all(is_t):
                out[k] = _collate_tensors(op, k, vals, shared)
            elif any(is_t):
                raise TypeError(f"{op}(): field {k!r}: expected a tensor in every sample or in none, got a mix")
            else:
                out[k] = vals
        return out
    raise TypeError(f"{op}(): expected samples to be tensors or dicts of tensors, got {type(first).__name__}")
