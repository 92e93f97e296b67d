"""``torch.nested``'s builders of views of dense tensors, for the ``multi_jagged`` layout:
``nested_tensor_from_jagged`` (values with offsets or lengths along a jagged dim) and ``narrow``
(a window per sample of a dense tensor), with ``torch.jagged``'s signatures."""

from __future__ import annotations

from typing import Optional

import torch

from ._frames import eager_constructor
from .constructors import _check_dense, _exclusive_cumsum_host, _host_ints, from_packed, from_padded
from .layout import multi_jagged
from .tensor import MultiJaggedTensor

__all__ = ["nested_tensor_from_jagged", "narrow"]


def _jagged_dim(op: str, jagged_dim, ndim: int) -> int:
    jd = 1 if jagged_dim is None else jagged_dim
    if not isinstance(jd, int) or isinstance(jd, bool) or not 1 <= jd <= ndim:
        raise ValueError(f"{op}(): expected jagged_dim in [1, {ndim}] for values of {ndim} dims, got {jagged_dim!r}")
    return jd


@eager_constructor("nested_tensor_from_jagged")  # NOTE [ Constructors under torch.compile ] in _frames.py
def nested_tensor_from_jagged(
    values: torch.Tensor,
    offsets: Optional[torch.Tensor] = None,
    lengths: Optional[torch.Tensor] = None,
    jagged_dim: Optional[int] = None,
    min_seqlen=None,
    max_seqlen=None,
) -> MultiJaggedTensor:
    r"""Constructs a multi_jagged tensor from jagged components, as ``torch.nested.nested_tensor_from_jagged``.

    The counterpart of ``torch.nested.nested_tensor_from_jagged`` for layout ``multi_jagged``,
    taking the same arguments: sample ``i`` is ``values`` rows ``offsets[i] .. offsets[i + 1]``
    along dim ``jagged_dim - 1``, which becomes logical ragged dim ``jagged_dim``. The result is
    a view of ``values`` when the offsets cover them (start at 0, end at their extent) and
    ``lengths`` is ``None``; otherwise (``lengths`` given: sample ``i`` is rows
    ``offsets[i] .. offsets[i] + lengths[i]``, leaving holes) a compact copy, since this layout
    stores no holes. Differentiable w.r.t. ``values``.

    Args:
        values (Tensor): the packed values; dim ``jagged_dim - 1`` holds the samples' rows.
        offsets (Tensor, optional): ``(B+1,)`` integer offsets of the samples along that dim.
            Default: ``None``: the samples follow one another, ``lengths`` long.
        lengths (Tensor, optional): ``(B,)`` integer lengths of the samples, for offsets that
            leave holes, or alone. Default: ``None`` (each sample runs to the next offset).
        jagged_dim (int, optional): the logical ragged dim, at least 1. Default: ``None`` (1).
        min_seqlen (int, optional): accepted for compatibility and unused: the extents are known
            exactly. Default: ``None``.
        max_seqlen (int, optional): accepted for compatibility and unused. Default: ``None``.

    Returns:
        MultiJaggedTensor: ``(B, …)`` with one ragged dim, ``jagged_dim``.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> values = torch.arange(12.).view(6, 2)
        >>> x = mj.nested_tensor_from_jagged(values, torch.tensor([0, 2, 3, 6]))
        >>> [t.shape for t in x.unbind()]
        [torch.Size([2, 2]), torch.Size([1, 2]), torch.Size([3, 2])]
        >>> y = mj.nested_tensor_from_jagged(values, torch.tensor([0, 3, 6]), lengths=torch.tensor([1, 2]))
        >>> y[0], y[1]
        (tensor([[0., 1.]]), tensor([[6., 7.],
                [8., 9.]]))
    """
    op = "nested_tensor_from_jagged"
    if not isinstance(values, torch.Tensor) or values.dim() < 1:
        raise TypeError(f"{op}(): expected values to be a tensor of at least 1 dim, got {type(values).__name__}")
    _check_dense(op, "values", values)
    jd = _jagged_dim(op, jagged_dim, values.dim())
    if offsets is None:  # lengths alone: the samples one after another, as torch.nested's
        if lengths is None:
            raise RuntimeError(f"{op}(): At least one of offsets or lengths is required.")
        if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
            raise ValueError(f"{op}(): expected lengths to be a 1-D tensor, got {getattr(lengths, 'shape', lengths)}")
        offsets = _exclusive_cumsum_host(_host_ints(op, "lengths", lengths)).to(values.device)
        lengths = None
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError(f"{op}(): expected offsets to be a 1-D tensor of B + 1 >= 1 entries, got {getattr(offsets, 'shape', offsets)}")
    packed = values.movedim(jd - 1, 0)
    host_off = _host_ints(op, "offsets", offsets)
    if lengths is None:
        host_len = host_off.diff()
        if host_off[0] == 0 and host_off[-1] == packed.shape[0] and (host_len >= 0).all():
            off = offsets if offsets.dtype == torch.int64 and offsets.device == values.device else host_off.to(values.device)
            return from_packed(packed, off, host_len, (jd,))
        starts = host_off[:-1]
    else:
        host_len = _host_ints(op, "lengths", lengths).flatten()
        starts = host_off[: host_len.shape[0]]
        if host_len.shape[0] != host_off.shape[0] - 1:
            raise ValueError(f"{op}(): expected lengths of shape ({host_off.shape[0] - 1},), got {tuple(lengths.shape)}")
    if (host_len < 0).any() or (starts < 0).any() or (host_len.numel() and (starts + host_len).max() > packed.shape[0]):
        raise ValueError(
            f"{op}(): every sample must lie within the {packed.shape[0]} rows of values along dim {jd - 1}, got offsets "
            f"{host_off.tolist()} and lengths {host_len.tolist()}"
        )
    # Holes (or offsets that do not cover the values): gather the samples' rows into a compact copy.
    index = _rows_of_samples(starts, host_len).to(values.device)
    new_off = _exclusive_cumsum_host(host_len).to(values.device)
    return from_packed(packed.index_select(0, index), new_off, host_len, (jd,))


def _rows_of_samples(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Host ``(Σ lengths,)``: rows ``starts[i] .. starts[i] + lengths[i]`` for every sample, in order."""
    b = lengths.shape[0]
    sample = torch.repeat_interleave(torch.arange(b), lengths)
    begin = _exclusive_cumsum_host(lengths)[:-1]
    return starts[sample] + torch.arange(sample.shape[0]) - begin[sample]


@eager_constructor("narrow")  # NOTE [ Constructors under torch.compile ] in _frames.py
def narrow(tensor: torch.Tensor, dim: int, start, length, layout=multi_jagged) -> MultiJaggedTensor:
    r"""Narrows each sample of a dense tensor ``(B, …)`` to its own window along a dim.

    Sample ``i`` is ``tensor[i]`` narrowed along (its) dim ``dim - 1`` to
    ``start[i] .. start[i] + length[i]``, and ``dim`` becomes a ragged dim.
    ``torch.nested.narrow(tensor, dim, start, length, layout=torch.multi_jagged)`` calls this.
    ``torch.jagged`` makes a non-contiguous view of ``tensor`` (and supports only ``dim=1``);
    this layout stores no holes, so the result is a compact copy, differentiable w.r.t.
    ``tensor``, for any ``dim >= 1``.

    Args:
        tensor (Tensor): the dense ``(B, …)`` tensor, of at least 2 dims.
        dim (int): the dim to narrow, at least 1 (dim 0 is the batch).
        start (int or Tensor): the first index of each sample's window: an int, or a ``(B,)``
            or ``(1,)`` integer tensor.
        length (int or Tensor): the length of each sample's window, in the same forms.
        layout (:class:`torch.layout`, optional): must be ``torch.multi_jagged``.
            Default: ``torch.multi_jagged``.

    Returns:
        MultiJaggedTensor: a copy of the windows, ragged along ``dim``.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> t = torch.arange(8.).view(2, 4)
        >>> x = mj.narrow(t, 1, torch.tensor([0, 1]), torch.tensor([2, 3]))
        >>> x[0], x[1]
        (tensor([0., 1.]), tensor([5., 6., 7.]))
        >>> y = torch.nested.narrow(t, 1, 1, 2, layout=torch.multi_jagged)
        >>> y.ragged_dims, [s.tolist() for s in y.unbind()]
        ((1,), [[1.0, 2.0], [5.0, 6.0]])
    """
    op = "narrow"
    if layout is not multi_jagged:
        raise ValueError(f"{op}(): expected layout=torch.multi_jagged, got {layout}")
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
        raise TypeError(f"{op}(): expected a dense tensor of at least 2 dims (B, …), got {getattr(tensor, 'shape', type(tensor))}")
    _check_dense(op, "tensor", tensor)
    if not isinstance(dim, int) or not 1 <= (dim + tensor.dim() if dim < 0 else dim) < tensor.dim():
        raise ValueError(f"{op}(): expected dim in [1, {tensor.dim() - 1}] (dim 0 is the batch), got {dim}")
    d = dim + tensor.dim() if dim < 0 else dim
    b, n = tensor.shape[0], tensor.shape[d]

    def per_sample(what, v):
        if not isinstance(v, (int, torch.Tensor)) or isinstance(v, bool):
            raise TypeError(f"{op}(): expected {what} to be an int or an integer tensor, got {type(v).__name__}")
        t = _host_ints(op, what, v) if isinstance(v, torch.Tensor) else torch.tensor([v])
        t = t.flatten()
        if t.shape[0] not in (1, b):
            raise ValueError(f"{op}(): expected {what} of shape ({b},) or (1,), got {tuple(t.shape)}")
        return t.expand(b).contiguous()

    starts, lengths = per_sample("start", start), per_sample("length", length)
    if b and ((starts < 0).any() or (lengths < 0).any() or (starts + lengths > n).any()):
        raise ValueError(
            f"{op}(): expected 0 <= start and start + length <= {n} (the size of dim {d}), got start "
            f"{starts.tolist()} and length {lengths.tolist()}"
        )
    # (B, max length) source index along dim d, clamped where a sample is shorter (cut off by from_padded)
    width = int(lengths.max()) if b else 0
    index = (starts.unsqueeze(1) + torch.arange(width)).clamp_max(max(n - 1, 0)).to(tensor.device)
    shape = [b] + [1] * (tensor.dim() - 1)
    shape[d] = width
    full = list(tensor.shape)
    full[d] = width
    window = tensor.gather(d, index.view(shape).expand(full))
    return from_padded(window, lengths, (d,))
