"""Recurrent layers over a ragged dim: ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` on ``(B, j0, C)``.

NOTE [ Recurrent layers on packed sequences ]

A recurrent layer over variable-length sequences is what ``torch.nn.utils.rnn.PackedSequence``
exists for: the rows of every step ``t`` of the sequences longer than ``t``, longest first, so
that step ``t`` is one batched cell call over ``batch_sizes[t]`` rows. A multi_jagged batch
``(B, j0, C)`` (or its sequence-first token ``(j0, B, C)``, ``x.transpose(0, 1)``, for
``batch_first=False``) is that input with its rows in sample order. So ``torch.lstm`` /
``torch.gru`` / ``torch.rnn_tanh`` / ``torch.rnn_relu`` — what the modules call — are routed
here: the rows are gathered into time-major order (an ``index_select``), the packed overload of
the same function runs (every layer, direction, ``proj_size``, dropout, as the module asked),
and its output rows go back to sample order, so the output has the input's structure and
``h_n`` / ``c_n`` are per sample, as running the module on each sample alone gives (the order of
samples in ``h_n`` is the batch's). The time-major order is a derived map of the partition
(sorted by decreasing length, stable), with the host ``batch_sizes`` it needs.

A sample of length 0 (which the dense layer refuses) gives an empty output and its initial
state as ``h_n`` / ``c_n``: the packed call takes the others, and their final states are written
into a copy of ``hx``. Eager only: ``batch_sizes`` are host sizes (under ``torch.compile`` a
graph break, NOTE [ Eager-only routes ] in ``_common.py``; dynamo refuses the recurrent modules
themselves, whatever their input). Where the dense layer runs oneDNN, a dense call per group of
equal lengths replaces the packed overload when it pays (NOTE [ Recurrent layers sample by
sample ]). A layer given the other time layout (``batch_first`` not matching) raises the layout
error (NOTE [ Recurrent layers given the other time layout ] in ops/shape/leading.py).

``pack_padded_sequence(x, lengths, batch_first=True)`` of a batch (aten's
``_pack_padded_sequence``, routed) packs each sample's first ``lengths[i]`` rows, as dense packs
a padded batch (``_pack_padded``).
"""

from __future__ import annotations

import contextlib

import torch

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import Partition
from .._common import MJT, describe, eager_route
from .._routing import route
from ..shape.leading import BatchMoved, token_op

__all__: list[str] = []

_WHY = "{op}(): a recurrent layer over a multi_jagged batch runs on packed sequences built from host lengths"


def _time_major(p: Partition) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, batch_sizes, order)``: the packed rows in time-major order (index into the values),
    the host ``batch_sizes`` and the non-empty samples longest first."""

    def compute(p: Partition):
        lengths = p.extents[0].host_lengths()
        order = torch.sort(lengths, descending=True, stable=True).indices
        order = order[lengths[order] > 0]
        n = lengths[order]
        longest = int(n[0]) if len(n) else 0
        batch_sizes = (n.unsqueeze(0) > torch.arange(longest).unsqueeze(1)).sum(1)
        starts = (lengths.cumsum(0) - lengths)[order]  # from the host lengths: no device read
        t = torch.arange(longest).repeat_interleave(batch_sizes)
        k = torch.arange(len(t)) - torch.repeat_interleave(batch_sizes.cumsum(0) - batch_sizes, batch_sizes)
        rows = (starts[k] + t).to(p.offsets.device)
        return rows, batch_sizes, order.to(p.offsets.device)

    return p.derived("rnn_time_major", compute)  # built outside inference mode (NOTE [ Derived maps ])


def _lstm_autocast_dtype(name: str, v: torch.Tensor, states, params):
    """The dtype dense ``torch.lstm`` on one sample computes in under CPU autocast, or None.

    Dense ``torch.lstm`` on a CPU tensor without projections runs oneDNN's ``mkldnn_rnn_layer``,
    which CPU autocast lists in lower precision: output, ``h_n`` and ``c_n`` come back in the
    autocast dtype. The packed overload that runs here has no oneDNN path and no autocast entry
    (float32 out), so cast to that dtype ourselves, as the per-sample reference does."""
    if name != "lstm" or v.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return None
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return None
    if len(states) == 2 and states[0].shape[-1] != states[1].shape[-1]:  # proj_size: no oneDNN path
        return None
    if v.dtype not in (torch.float32, torch.bfloat16) or any(p.device.type != "cpu" for p in params):
        return None
    return torch.get_autocast_dtype("cpu")


def _groups(p: Partition):
    """``(groups, order, row_inv)``: the non-empty samples grouped by length, one dense call per
    group — per group its length, its samples (host list, device index), its rows (device index,
    sample-major) and its first row (host); ``order``, the samples in the order the groups give
    them (device), and ``row_inv``, the permutation of the groups' rows back to sample order —
    each None where it is the identity."""

    def compute(p: Partition):
        lengths = p.extents[0].host_lengths()
        dev = p.offsets.device
        starts = (lengths.cumsum(0) - lengths).tolist()
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(lengths.tolist()):
            if n:
                by_len.setdefault(n, []).append(i)
        groups, order, rows_all = [], [], []
        for n, members in by_len.items():  # in the order of each length's first sample
            rows = torch.cat([torch.arange(starts[i], starts[i] + n) for i in members])
            groups.append((n, members, torch.tensor(members, device=dev), rows.to(dev), starts[members[0]]))
            order += members
            rows_all.append(rows)
        identity = order == list(range(len(starts)))
        in_order = order == sorted(order)  # the rows too (an empty sample has none)
        row_inv = None if in_order else torch.argsort(torch.cat(rows_all)).to(dev)
        return groups, None if identity else torch.tensor(order, dtype=torch.int64, device=dev), row_inv

    return p.derived("rnn_groups", compute)  # built outside inference mode (NOTE [ Derived maps ])


# NOTE [ Recurrent layers sample by sample ]
#
# Where the dense layer runs oneDNN (``mkldnn_rnn_layer``: an LSTM without projections, float32 or
# under CPU autocast, on the CPU), a dense call per sample (per group of equal lengths, one call
# for the group) beats the packed overload, which runs one cell per time step over the samples
# still running and has no oneDNN path. Each call is the per-sample reference itself. The choice
# is ``_per_sample_pays`` (measured: docs/design.md, recurrent layers); ``per_sample`` forces it.
_PER_SAMPLE: bool | None = None


@contextlib.contextmanager
def per_sample(enabled: bool | None):
    """Within the block, recurrent layers run one dense call per group of equal-length samples
    (``True``), the packed overload (``False``), or as the cost rule picks (``None``)."""
    global _PER_SAMPLE
    old, _PER_SAMPLE = _PER_SAMPLE, enabled
    try:
        yield
    finally:
        _PER_SAMPLE = old


def _onednn_lstm(name: str, v: torch.Tensor, states, params) -> bool:
    """Whether dense ``torch.lstm`` on one sample runs oneDNN (as aten's ``use_mkldnn``)."""
    if name != "lstm" or v.device.type != "cpu" or any(p.device.type != "cpu" for p in params):
        return False
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if len(states) == 2 and states[0].shape[-1] != states[1].shape[-1]:  # proj_size: no oneDNN path
        return False
    return v.dtype == torch.float32 or (torch.is_autocast_enabled("cpu") and v.dtype == torch.bfloat16)


def _per_sample_pays(name: str, p: Partition, v: torch.Tensor, states, params, bidirectional: bool) -> bool:
    """Whether one dense call per group of equal lengths beats the packed overload (NOTE
    [ Recurrent layers sample by sample ]), from host sizes. Measured on the CPU (1 thread, LSTM
    of 40 inputs, hidden 64 and 256, B = 1–256, lengths 10–500; docs/design.md): with autograd the
    groups win (the packed overload's backward runs a cell's derivative per step: even at B = 1,
    up to 25× faster);
    without it they win only while few calls replace many steps: in units of a packed step, a call
    costs about 8 and a row ``k`` more than on the packed path (``k`` grows with the cell's size)."""
    if _PER_SAMPLE is not None:
        return _PER_SAMPLE
    if not _onednn_lstm(name, v, states, params):
        return False
    if torch.is_grad_enabled() and (v.requires_grad or any(t.requires_grad for t in (*states, *params))):
        return True
    groups, _, _ = _groups(p)
    hidden = states[1].shape[-1]
    dirs = 2 if bidirectional else 1
    layers = states[0].shape[0] // dirs
    flops = 4 * hidden * ((v.shape[-1] + hidden) + (layers - 1) * (dirs * hidden + hidden)) / layers  # per row, layer
    k = 1.6e-6 * flops + 0.034
    return 8 * len(groups) + k * p.rows < int(p.extents[0].max)


def _by_groups(func, p: Partition, v: torch.Tensor, states, tuple_hx: bool, args):
    """``(values, finals)``: the dense layer once per group of equal-length samples, batch-first,
    outputs and final states in sample order; an empty sample's final states are its initial ones."""
    groups, order, row_inv = _groups(p)
    outs, finals = [], [[] for _ in states]
    for n, members, index, rows, start in groups:
        if len(members) == 1:  # views: no copy in, and gradients flow back through them
            xi, hi = v.narrow(0, start, n).unsqueeze(0), [h.narrow(1, members[0], 1) for h in states]
        else:
            xi, hi = v.index_select(0, rows).view(len(members), n, v.shape[1]), [h.index_select(1, index) for h in states]
        out = func(xi, hi if tuple_hx else hi[0], *args, True)
        outs.append(out[0].reshape(len(members) * n, out[0].shape[-1]))
        for acc, f in zip(finals, out[1:]):
            acc.append(f)
    values = torch.cat(outs) if len(outs) > 1 else outs[0]
    if row_inv is not None:
        values = values.index_select(0, row_inv)
    done = []
    for h, acc in zip(states, finals):
        f = torch.cat(acc, 1) if len(acc) > 1 else acc[0]
        # in the dtype the layer returned (autocast may lower it), as the dense layer's h_n / c_n
        done.append(f if order is None else h.to(f.dtype).index_copy(1, order, f))
    return values, done


def _as_batch_first(op: str, input, batch_first: bool):
    """The batch-first multi_jagged tensor of ``input``, or None (not ours)."""
    if isinstance(input, BatchMoved) and input._perm == (1, 0, 2) and not batch_first:
        return input._mjt
    if isinstance(input, MJT) and batch_first:
        x = input
    elif isinstance(input, MJT):
        raise StructureError(
            f"{op}(): with batch_first=False the input is sequence-first (T, B, C); a multi_jagged batch "
            f"{describe(input)} is batch-first: pass x.transpose(0, 1), or build the layer with batch_first=True"
        )
    else:
        return None
    if x.dim() != 3 or x._ragged_dims != (1,):
        raise StructureError(f"{op}(): expected a batch of sequences (B, j0, C), got {describe(x)}")
    return x


def _recurrent(name: str):
    func = getattr(torch, name)

    @eager_route(_WHY)
    def run(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        x = _as_batch_first(name, input, batch_first)
        if x is None:
            return NotImplemented
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        v = values_of(x)
        if x._partition.rows and _per_sample_pays(name, x._partition, v, states, params, bidirectional):
            # NOTE [ Recurrent layers sample by sample ]: the dense calls, autocast included
            values, finals = _by_groups(func, x._partition, v, states, isinstance(hx, (list, tuple)),
                                        (params, has_biases, num_layers, dropout, train, bidirectional))
            y = wrap_values(values, x._partition, (1,))
            return (y.transpose(0, 1) if isinstance(input, BatchMoved) else y, *finals)
        rows, batch_sizes, order = _time_major(x._partition)
        cast = _lstm_autocast_dtype(name, v, states, params)
        if cast is not None:
            v = v.to(cast)
            states = [h.to(cast) for h in states]
            params = [p.to(cast) for p in params]
        if len(order):
            packed_hx = [h.index_select(1, order) for h in states]
            with torch.autocast("cpu", enabled=False) if cast is not None else contextlib.nullcontext():
                out = func(v.index_select(0, rows), batch_sizes, packed_hx if isinstance(hx, (list, tuple)) else packed_hx[0],
                           params, has_biases, num_layers, dropout, train, bidirectional)
            data, finals = out[0], out[1:]
            values = data.new_empty((v.shape[0], data.shape[1])).index_copy(0, rows, data)
            # in the dtype the layer returned (autocast may lower it), as the dense layer's h_n / c_n
            finals = [h.to(f.dtype).index_copy(1, order, f) for h, f in zip(states, finals)]
        else:  # every sample empty: no step runs
            width = states[0].shape[-1] * (2 if bidirectional else 1)
            values = v.new_zeros((0, width)) + v.sum() * 0  # empty, on v's graph
            finals = [h.clone() for h in states]
        y = wrap_values(values, x._partition, (1,))
        if isinstance(input, BatchMoved):
            y = y.transpose(0, 1)
        return (y, *finals)

    run.__name__ = name
    return run


for _name in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
    _fn = _recurrent(_name)
    route(getattr(torch, _name))(_fn)
    token_op(getattr(torch, _name))(_fn)



# ----------------------------------------------------------------------------- pack_padded_sequence
def _pack_padded(input, lengths, batch_first):
    """``pack_padded_sequence(x, lengths, batch_first=True)`` of a batch ``(B, j0, *)`` (its
    sequence-first token with ``batch_first=False``): each sample's first ``lengths[i]`` rows,
    time-major, as dense packs a padded batch — the ``(data, batch_sizes)`` of aten's
    ``_pack_padded_sequence``, ``data`` an ``index_select`` of the packed rows (differentiable).
    Dense's checks on ``lengths`` (one per sample, positive, decreasing: ``enforce_sorted=False``
    sorts the batch first), and ``lengths[i]`` at most sample i's own length (there is no
    padding to read past it)."""
    # messages name the function the user called (``pack_padded_sequence(x, …)``, not ``name(): ``,
    # which NOTE [ Error names ] would rename after the aten op)
    if isinstance(input, BatchMoved):
        if input._perm[:2] != (1, 0) or batch_first:
            raise StructureError(
                f"pack_padded_sequence(x, lengths, batch_first=True): the input is batch-first (B, T, *); "
                f"{describe(input._mjt)}.transpose(0, 1) is sequence-first: pass the multi_jagged batch itself, or batch_first=False"
            )
        x = input._mjt
    elif isinstance(input, MJT):
        if not batch_first:
            raise StructureError(
                f"pack_padded_sequence(x, lengths, batch_first=False): the input is sequence-first (T, B, *); a multi_jagged "
                f"batch {describe(input)} is batch-first: pass batch_first=True, or x.transpose(0, 1)"
            )
        x = input
    else:
        return NotImplemented
    if x._ragged_dims != (1,):
        raise StructureError(
            f"pack_padded_sequence(x, lengths): expected a batch of sequences (B, j0, *) whose only ragged dim is 1, got {describe(x)}"
        )
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.device.type != "cpu" or lengths.dtype != torch.int64:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {describe(lengths)} {lengths!r}")
    b = x._partition.batch
    if lengths.shape[0] != b:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {lengths.shape[0]} (batch_size={b})")
    if b == 0 or x._values.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    if int(lengths[-1]) <= 0:  # SYNC: none — lengths are a CPU tensor (as dense requires)
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0")
    if bool((lengths[1:] > lengths[:-1]).any()):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can pass "
            "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this requirement if you do not "
            "need ONNX exportability."
        )
    own = x._partition.extents[0].host_lengths()
    over = (lengths > own).nonzero().flatten()
    if over.numel():  # (the batch may have been sorted by then: the sample is named by its lengths)
        i = int(over[0])
        raise ValueError(
            f"pack_padded_sequence(x, lengths): a length of {int(lengths[i])} for a sample of length {int(own[i])} in "
            f"{describe(x)}: a multi_jagged batch holds no padding to pack past a sample's end"
        )
    steps = int(lengths[0])
    batch_sizes = (lengths.unsqueeze(0) > torch.arange(steps).unsqueeze(1)).sum(1)
    t = torch.arange(steps).repeat_interleave(batch_sizes)
    k = torch.arange(t.shape[0]) - torch.repeat_interleave(batch_sizes.cumsum(0) - batch_sizes, batch_sizes)
    rows = ((own.cumsum(0) - own)[k] + t).to(x._values.device)  # from the host lengths: no device read
    return values_of(x).index_select(0, rows), batch_sizes


route(torch._pack_padded_sequence)(_pack_padded)
token_op(torch._pack_padded_sequence)(_pack_padded)
