"""Ops over the static trailing dims of every packed row, and over every element of the batch.

NOTE [ Ops on the trailing dims ]

An op that reads and writes only dims after the last ragged dim acts on each packed row on its
own, so on the packed values ``(T, *static)`` it is the dense op on each sample: the FFT family
(``torch.fft.fft`` / ``ifft`` / ``rfft`` / ``irfft`` / ``hfft`` / ``ihfft`` along one static dim,
``fftn`` / ``ifftn`` / ``rfftn`` / ``irfftn`` / ``fft2`` / … over static dims), the complex views
``view_as_complex`` / ``view_as_real`` (LLaMA's rotary embedding multiplies pairs of features
as complex numbers), and ``diag_embed`` into two new last dims (of a ragged last dim: a square pair). Each runs once on the values
with the dense op's own derivative (the values bridge) and keeps the structure. Along a ragged dim each sample has its own length: the transform runs per sample
(one dense call each, the results packed back into the input's structure), for the transforms
whose length along the ragged dim is the sample's own (``fft`` / ``ifft`` / ``fftn`` / ``ifftn``
/ ``fft2`` / ``ifft2``, and ``rfftn`` / ``irfftn`` / … whose halved last dim is static: FNet's
``fftn(x, dim=(1, 2)).real``); the others would need a new ragged size and raise, naming the dim.

Ops over *every* element of the batch, as dense torch flattens its input: ``unique`` (sorted,
with ``return_inverse`` shaped as the input and ``return_counts``) and ``histc``: the dense op on
the values, whose multiset of elements is the batch's.
"""

from __future__ import annotations

import torch

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from .._common import MJT, canonical_dim, component_rows, describe, static_dims
from .._routing import route
from .._table import register_multi_jagged_func
from ..shape.views import mark_copy_of
from .._common import wrap

__all__: list[str] = []

aten = torch.ops.aten


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


# The transforms that keep every transformed dim's length (a ragged dim may be among them), and,
# for the real-input / real-output ones, the last transformed dim, whose length changes.
_LENGTH_KEEPING = {"fft.fft", "fft.ifft", "fft.fftn", "fft.ifftn", "fft.fft2", "fft.ifft2"}
_LAST_CHANGES = {"fft.rfftn", "fft.irfftn", "fft.rfft2", "fft.irfft2"}


def _ragged_fft(name: str, x: MJT, dims: list[int], sizes) -> bool:
    """Whether the transform over ``dims`` (canonical) runs per sample along a ragged dim: one of
    them is ragged, with no size given for it, and every length that changes is a static dim's."""
    ragged = [d for d in dims if d in x._ragged_dims]
    if not ragged or 0 in dims:
        return False
    if name not in _LENGTH_KEEPING and not (name in _LAST_CHANGES and dims[-1] not in x._ragged_dims):
        raise StructureError(
            f"{name}(): along ragged dim {ragged[0]} of {describe(x)}: each sample's output length would be a new ragged "
            "size; the transforms along a ragged dim are fft / ifft / fftn / ifftn / fft2 / ifft2, and rfftn / irfftn "
            "/ rfft2 / irfft2 whose last dim is static"
        )
    if sizes is not None and any(sizes[dims.index(d)] not in (None, -1) for d in ragged):
        raise StructureError(
            f"{name}(): a length for ragged dim {ragged[0]} of {describe(x)} would make it static; leave it None (each "
            "sample's own length)"
        )
    return True


def _per_sample(name: str, x: MJT, call) -> MJT:
    """``call`` on each sample (a dense component), the results packed back into ``x``'s ragged
    structure: the dims ``call`` transforms may change static sizes only. Differentiable."""
    comps = x.unbind()
    rag = [d - 1 for d in x._ragged_dims]
    rows = []
    for i, c in enumerate(comps):
        try:
            o = call(c)
        except RuntimeError as err:
            raise RuntimeError(f"{name}(): sample {i} of {describe(x)} (size {tuple(c.shape)}): {err}") from None
        rows.append(component_rows(o, rag))
    if not rows:  # B = 0: the static sizes from a sample of length one
        ones = torch.ones([1 if d in rag else n for d, n in enumerate(x.shape[1:])], dtype=x.dtype, device=x.device)
        v = values_of(x)
        anchor = (v.real if v.is_complex() else v).sum() * 0
        rows.append(component_rows(call(ones), rag)[:0] + anchor)
    return wrap_values(torch.cat(rows), x._partition, x._ragged_dims)


def _fft_1d(fn):
    name = "fft." + fn.__name__.removeprefix("fft_")

    def routed(input, n=None, dim=-1, norm=None, *, out=None):
        if not isinstance(input, MJT) or out is not None:
            return NotImplemented
        d = canonical_dim(name, input.dim(), dim)
        if _ragged_fft(name, input, [d], None if n is None else [n]):
            return _per_sample(name, input, lambda c: fn(c, None, d - 1, norm))
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
        canon = [canonical_dim(name, input.dim(), d) for d in dims]
        if _ragged_fft(name, input, canon, None if s is None else list(s)):
            return _per_sample(name, input, lambda c: fn(c, s, [d - 1 for d in canon], norm))
        vds = [_static_value_dim(name, input, d) for d in dims]
        return wrap_values(_rows(lambda v: fn(v, s, vds, norm), values_of(input), vds), input._partition, input._ragged_dims)

    return routed


for _f in (torch.fft.fft, torch.fft.ifft, torch.fft.rfft, torch.fft.irfft, torch.fft.hfft, torch.fft.ihfft):
    route(_f)(_fft_1d(_f))
for _f in (torch.fft.fftn, torch.fft.ifftn, torch.fft.rfftn, torch.fft.irfftn):
    route(_f)(_fft_nd(_f))
for _f in (torch.fft.fft2, torch.fft.ifft2, torch.fft.rfft2, torch.fft.irfft2):
    route(_f)(_fft_nd(_f, (-2, -1)))
# the Hermitian n-d transforms: along static dims, and raising as ``hfft`` along a ragged one
for _f in (torch.fft.hfftn, torch.fft.ihfftn):
    route(_f)(_fft_nd(_f))
for _f in (torch.fft.hfft2, torch.fft.ihfft2):
    route(_f)(_fft_nd(_f, (-2, -1)))


def _fftshift(name: str, inverse: bool):
    def routed(input, dim=None):
        """``fft.fftshift`` / ``ifftshift`` over static dims: ``roll`` by half of each (dense's
        shifts). Over every dim, or a ragged one (a shift per sample), it raises."""
        if not isinstance(input, MJT):
            return NotImplemented
        if dim is None:
            raise StructureError(f"{name}(): over every dim of {describe(input)}, the batch and ragged dims too; give dim")
        dims = [canonical_dim(name, input.dim(), d) for d in ([dim] if isinstance(dim, int) else dim)]
        ragged = [d for d in dims if d == 0 or d in input._ragged_dims]
        if ragged:
            raise StructureError(f"{name}(): along dim {ragged[0]} of {describe(input)}, the batch or a ragged dim (a shift "
                                 "per sample), for layout torch.multi_jagged: shift static dims, or roll each sample")
        shifts = [(input.shape[d] + 1) // 2 if inverse else input.shape[d] // 2 for d in dims]
        return torch.roll(input, shifts, dims)

    return routed


route(torch.fft.fftshift)(_fftshift("fft.fftshift", False))
route(torch.fft.ifftshift)(_fftshift("fft.ifftshift", True))


@route(torch.view_as_complex)
def _view_as_complex(input):
    if not isinstance(input, MJT):
        return NotImplemented
    if input.dim() - 1 in input._ragged_dims or input.shape[-1] != 2:
        raise RuntimeError(f"view_as_complex(): Tensor must have a last dimension of size 2, got {describe(input)}")
    return wrap_values(torch.view_as_complex(values_of(input)), input._partition, input._ragged_dims)


def view_dtype(input: MJT, dtype: torch.dtype) -> MJT:
    """``x.view(dtype)``: the values reinterpreted, as dense; between dtypes of other element sizes
    the last dim, which must then be static, is rescaled (dense's checks and errors)."""
    if input.dtype.itemsize != dtype.itemsize and input.dim() - 1 in input._ragged_dims:
        raise RuntimeError(f"view(): to a dtype of another element size, the last dim must be static, got "
                           f"{describe(input)} (its last dim is ragged)")
    return wrap_values(values_of(input).view(dtype), input._partition, input._ragged_dims)


@route(torch.view_as_real)
def _view_as_real(input):
    if not isinstance(input, MJT):
        return NotImplemented
    return wrap_values(torch.view_as_real(values_of(input)), input._partition, input._ragged_dims)


@route(torch.conj, torch.Tensor.conj)
def _conj(input):
    """``x.conj()``: the conjugated values (materialized: the wrapper carries no conjugate bit, so
    ``resolve_conj`` has nothing to resolve); a real tensor is returned as it is, as dense. Dense
    gives a view, so the copy is registered as one (NOTE [ Reordered ragged dims are copies ] in
    ops/shape/views.py): a write into it raises rather than miss ``x``."""
    if not isinstance(input, MJT):
        return NotImplemented
    if not input.is_complex():
        return input
    out = wrap_values(torch.conj_physical(values_of(input)), input._partition, input._ragged_dims)
    return mark_copy_of(out, "a conjugate (x.conj())", input)


@register_multi_jagged_func(aten._conj.default, "self: mjt")
def _conj_dispatch(func, input):
    """``_conj`` as autograd's complex formulas call it (``grad * other.conj()``): materialized, as
    ``conj`` above; a real tensor is returned as it is."""
    if not input.is_complex():
        return input
    return wrap(torch.conj_physical(input._values), input._partition, input._ragged_dims)


@route(torch.resolve_conj, torch.Tensor.resolve_conj, torch.resolve_neg, torch.Tensor.resolve_neg)
def _resolved(input):
    return input if isinstance(input, MJT) else NotImplemented


@register_multi_jagged_func([aten.view_as_real.default, aten.view_as_complex.default], "self: mjt")
def _complex_views(func, input):
    """``x.real`` / ``x.imag`` (``view_as_real`` and a select of the new last dim) and their
    derivatives, on the wrapper: views of the values with one more or one less trailing dim."""
    if func is aten.view_as_complex.default and (input.dim() - 1 in input._ragged_dims or input.shape[-1] != 2):
        raise RuntimeError(f"view_as_complex(): Tensor must have a last dimension of size 2, got {describe(input)}")
    return wrap(func(input._values), input._partition, input._ragged_dims)


@route(torch.diag_embed, torch.Tensor.diag_embed)
def _diag_embed(input, offset=0, dim1=-2, dim2=-1):
    if not isinstance(input, MJT):
        return NotImplemented
    n = input.dim() + 1
    d1, d2 = canonical_dim("diag_embed", n, dim1), canonical_dim("diag_embed", n, dim2)
    if sorted((d1, d2)) != [n - 2, n - 1] or (input.dim() - 1 in input._ragged_dims and offset != 0):
        raise StructureError(
            f"diag_embed(): of {describe(input)}, only into two new last dims (dim1, dim2 = -2, -1), and from a "
            "ragged last dim only onto the main diagonal (offset=0)"
        )
    if input.dim() - 1 in input._ragged_dims:
        # a ragged last dim: each sample's (…, n, n) with the values on the diagonal, a square pair
        # made by broadcasting each position against the others
        pos = torch.ones_like(input, dtype=torch.int64).cumsum(-1)
        zero = torch.zeros((), dtype=input.dtype, device=input.device)  # a bool batch stays bool
        return torch.where(pos.unsqueeze(-1) == pos.unsqueeze(-2), input.unsqueeze(-1), zero)
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
