"""Ops over the static trailing dims of every packed row, and over every element of the batch.

NOTE [ Ops on the trailing dims ]

An op that reads and writes only dims after the last ragged dim acts on each packed row on its
own, so on the packed values ``(T, *static)`` it is the dense op on each sample: the FFT family
(``torch.fft.fft`` / ``ifft`` / ``rfft`` / ``irfft`` / ``hfft`` / ``ihfft`` along one static dim,
``fftn`` / ``ifftn`` / ``rfftn`` / ``irfftn`` / ``fft2`` / … over static dims), the complex views
``view_as_complex`` / ``view_as_real`` (LLaMA's rotary embedding multiplies pairs of features
as complex numbers), and ``diag_embed`` into two new last dims. Each runs once on the values
with the dense op's own derivative (the values bridge) and keeps the structure. An FFT along a
ragged dim (a per-sample length) raises, naming the dim.

Ops over *every* element of the batch, as dense torch flattens its input: ``unique`` (sorted,
with ``return_inverse`` shaped as the input and ``return_counts``) and ``histc``: the dense op on
the values, whose multiset of elements is the batch's.
"""

from __future__ import annotations

import torch

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from .._common import MJT, canonical_dim, describe, static_dims
from .._routing import route

__all__: list[str] = []


def _static_value_dim(op: str, x: MJT, dim: int) -> int:
    d = canonical_dim(op, x.dim(), dim)
    if d == 0 or d in x._ragged_dims:
        raise StructureError(
            f"{op}(): expected a static dim of {describe(x)}, got dim {dim} (the batch dim, or a ragged dim: each "
            "sample has its own length there)"
        )
    return static_dims(x.dim(), x._ragged_dims).index(d) + 1


def _rows(fn, v: torch.Tensor, dims) -> torch.Tensor:
    """``fn(v)`` on the packed rows, transforming the value dims ``dims``. With no element (MKL's
    FFT refuses a zero-size batch, which dense torch meets only when a sample is empty), ``fn`` runs
    on ones of one element along each empty dim that is not transformed, cut back to zero there,
    still on ``v``'s graph; an empty transformed dim raises as dense does."""
    if v.numel():
        return fn(v)
    cut = [d for d, n in enumerate(v.shape) if n == 0 and d not in dims]
    probe = fn(torch.ones([1 if d in cut else n for d, n in enumerate(v.shape)], dtype=v.dtype, device=v.device))
    for d in cut:
        probe = probe.narrow(d, 0, 0)
    anchor = v.real if v.is_complex() else v  # a real result of a complex input stays real
    return probe + anchor.sum() * 0


def _fft_1d(fn):
    name = "fft." + fn.__name__.removeprefix("fft_")

    def routed(input, n=None, dim=-1, norm=None, *, out=None):
        if not isinstance(input, MJT) or out is not None:
            return NotImplemented
        vd = _static_value_dim(name, input, dim)
        return wrap_values(_rows(lambda v: fn(v, n, vd, norm), values_of(input), (vd,)), input._partition, input._ragged_dims)

    return routed


def _fft_nd(fn, default_dim=None):
    name = "fft." + fn.__name__.removeprefix("fft_")

    def routed(input, s=None, dim=default_dim, norm=None, *, out=None):
        if not isinstance(input, MJT) or out is not None:
            return NotImplemented
        if dim is None:
            if s is None:
                raise StructureError(f"{name}(): over every dim of {describe(input)}, the batch and ragged dims too; give dim")
            dim = list(range(-len(s), 0))
        dims = [dim] if isinstance(dim, int) else list(dim)
        vds = [_static_value_dim(name, input, d) for d in dims]
        return wrap_values(_rows(lambda v: fn(v, s, vds, norm), values_of(input), vds), input._partition, input._ragged_dims)

    return routed


for _f in (torch.fft.fft, torch.fft.ifft, torch.fft.rfft, torch.fft.irfft, torch.fft.hfft, torch.fft.ihfft):
    route(_f)(_fft_1d(_f))
for _f in (torch.fft.fftn, torch.fft.ifftn, torch.fft.rfftn, torch.fft.irfftn):
    route(_f)(_fft_nd(_f))
for _f in (torch.fft.fft2, torch.fft.ifft2, torch.fft.rfft2, torch.fft.irfft2):
    route(_f)(_fft_nd(_f, (-2, -1)))


@route(torch.view_as_complex)
def _view_as_complex(input):
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() - 1 in input._ragged_dims or input.shape[-1] != 2:
        raise RuntimeError(f"view_as_complex(): Tensor must have a last dimension of size 2, got {describe(input)}")
    return wrap_values(torch.view_as_complex(values_of(input)), input._partition, input._ragged_dims)


@route(torch.view_as_real)
def _view_as_real(input):
    if not isinstance(input, MJT):
        return NotImplemented
    return wrap_values(torch.view_as_real(values_of(input)), input._partition, input._ragged_dims)


@route(torch.diag_embed, torch.Tensor.diag_embed)
def _diag_embed(input, offset=0, dim1=-2, dim2=-1):
    if not isinstance(input, MJT):
        return NotImplemented
    n = input.dim() + 1
    d1, d2 = canonical_dim("diag_embed", n, dim1), canonical_dim("diag_embed", n, dim2)
    if sorted((d1, d2)) != [n - 2, n - 1] or input.dim() - 1 in input._ragged_dims:
        raise StructureError(
            f"diag_embed(): of {describe(input)}, only from a static last dim into two new last dims (dim1, dim2 = -2, -1)"
        )
    return wrap_values(torch.diag_embed(values_of(input), offset, d1 - n, d2 - n), input._partition, input._ragged_dims)


@route(torch.unique, torch.Tensor.unique)
def _unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    if not isinstance(input, MJT):
        return NotImplemented
    if dim is not None:
        raise NotImplementedError(f"unique(dim={dim}) of {describe(input)} for layout torch.multi_jagged (unique(): every element)")
    v = input._values
    out = torch.unique(v, sorted=sorted, return_inverse=return_inverse, return_counts=return_counts)
    if not return_inverse:
        return out
    values, inverse, *counts = out
    return (values, MJT(inverse.reshape(v.shape), input._partition, input._ragged_dims), *counts)


@route(torch.histc, torch.Tensor.histc)
def _histc(input, bins=100, min=0, max=0, *, out=None):
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    return torch.histc(input._values, bins, min, max)
