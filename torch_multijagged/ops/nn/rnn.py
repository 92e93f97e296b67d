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
themselves, whatever their input).
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
        rows, batch_sizes, order = _time_major(x._partition)
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        v = values_of(x)
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
