"""Routes of the reductions: ``sum``/``mean``/``prod``/``logsumexp``/``amax``/``amin`` over ragged
(and some static) dims, ``max``/``min`` with indices, ``var``/``std``, ``vector_norm``/``norm``.
Each forwards to ``multijagged::reduce`` (handled in ``reduce.py``, NOTE [ Reducing ragged dims ])
so that the derivative is the layout's own, not aten's, which divides by nested ints. Composites
of these: ``linalg.norm`` (vector and Frobenius), ``dist``, ``nansum`` / ``nanmean``,
``count_nonzero``, ``aminmax``, ``var_mean`` / ``std_mean``, ``trapezoid`` /
``cumulative_trapezoid`` along a ragged dim."""

from __future__ import annotations

import torch

from .._common import MJT, autocast_float32, canonical_dims
from .._routing import _call, _needs_grad, in_place_route, route

mj = torch.ops.multijagged


def _reduced_dims(input, dim) -> list[int]:
    """Canonical, sorted dims of a reduction of ``input`` over ``dim`` (every dim for None / ())."""
    if dim is None:
        return list(range(input.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(input.dim()))
    return canonical_dims("reduce", input.dim(), dims)


def _touches_ragged(input, dim) -> list[int] | None:
    """Canonical dims when a reduction of ``input`` over ``dim`` involves a ragged or the batch
    dim (so aten's derivative cannot run on it), else None."""
    if not isinstance(input, MJT):
        return None
    canon = _reduced_dims(input, dim)
    if 0 in canon or any(d in input._ragged_dims for d in canon):
        return canon
    return None


def _abs_square(t):
    """``|t|²``, real: ``t * t`` is not for a complex t (dense var / norm are real and sum the
    squared magnitudes); its gradient ``2t`` is conj(2t)'s conjugate, as dense's."""
    return (t * t.conj()).real if t.is_complex() else t * t


def _reduce(input, kind, dims, keepdim):
    return _call(mj.reduce.default, input, kind, dims, keepdim)


def _reduction_route(kind: str, static_too=False):
    """``static_too``: route reductions over static dims as well (``prod``: aten's
    ``prod_backward`` builds tensors of the input's nested-int sizes; ``amax``: below), or a
    predicate of the input saying when to."""

    def routed(input, dim=None, keepdim=False, *, dtype=None):
        if isinstance(input, MJT) and (static_too(input) if callable(static_too) else static_too):
            dims = _reduced_dims(input, dim)
        else:
            dims = _touches_ragged(input, dim)
        if dims is None:
            return NotImplemented
        if kind == "prod" and dtype is None and torch.is_autocast_enabled(input.device.type):
            (input,) = autocast_float32(input)  # on dense autocast's float32 list
        if dtype is not None:
            input = input.to(dtype)
        out = _reduce(input, kind, None if dim is None else dims, keepdim)
        # reduce() accumulates integers in int64 (as dense torch without dtype=); an explicit
        # integer dtype= wraps as dense torch does, which the cast reproduces exactly (sums and
        # products agree modulo 2^bits)
        return out if dtype is None or out.dtype == dtype else out.to(dtype)

    return routed


route(torch.sum, torch.Tensor.sum)(_reduction_route("sum"))
# mean over static dims of a tensor with several ragged dims too: aten's mean_backward divides by
# the ratio of numels, a product of nested ints that fake tensors cannot form (under torch.compile
# the attention weights of nn.MultiheadAttention, a (B, H, j0, j0) mean over heads)
route(torch.mean, torch.Tensor.mean)(_reduction_route("mean", static_too=lambda x: len(x._ragged_dims) > 1))
route(torch.prod, torch.Tensor.prod)(_reduction_route("prod", static_too=True))
route(torch.logsumexp, torch.Tensor.logsumexp)(_reduction_route("logsumexp"))
# amax/amin over static dims too: aten's amax_backward views a gradient whose values may be an
# expanded (stride-0) buffer, which the view handler refuses
route(torch.amax, torch.Tensor.amax)(_reduction_route("amax", static_too=True))
route(torch.amin, torch.Tensor.amin)(_reduction_route("amin", static_too=True))


def _max_min(is_max: bool):
    kind = "amax" if is_max else "amin"

    def routed(input, dim=None, keepdim=False, *args, **kwargs):
        if not isinstance(input, MJT) or not isinstance(dim, int) or args or kwargs:
            return NotImplemented
        if _touches_ragged(input, dim) is None:
            return NotImplemented  # static dim: aten.max.dim, whose backward scatters to the index
        src = input.detach()
        indices = (torch.argmax if is_max else torch.argmin)(src if src.dtype != torch.bool else src.to(torch.uint8), dim, keepdim)
        values = _reduce(src if _needs_grad(input) else input, kind, [dim], keepdim)
        if _needs_grad(input):
            values = _selected(input, values, indices, dim, keepdim)
        return torch.return_types.max((values, indices)) if is_max else torch.return_types.min((values, indices))

    return routed


def _selected(input, values, indices, dim, keepdim):
    """``values`` (max/min over ``dim``, detached) made differentiable as dense ``max(dim)`` is:
    the whole gradient goes to the element at ``indices`` (``amax`` would share it among ties).
    The picked element is summed out of a one-hot mask, which is exact (x + 0 = x); an empty
    extent picks nothing (sum 0) and keeps the amax rule's value."""
    # aten's scatter (NOTE [ Scatter and gather ]): an empty extent's index 0 selects nothing
    hit = torch.ops.aten.scatter.value(torch.zeros_like(input, dtype=torch.bool), dim, indices if keepdim else indices.unsqueeze(dim), True)
    picked = _reduce(torch.where(hit, input, torch.zeros_like(input)), "sum", [dim], keepdim)
    p = picked.detach()
    return torch.where((p == values) | p.isnan(), picked, values)


route(torch.max, torch.Tensor.max)(_max_min(True))
route(torch.min, torch.Tensor.min)(_max_min(False))


class _NanWhere(torch.autograd.Function):
    """``t / 0`` forward (inf, or nan where t is 0 or nan: dense var's value when
    n - correction <= 0), read only where ``degenerate`` holds; backward nan there — whatever the
    incoming gradient, zero included, as dense var's ``2 / (n - correction) · g · (x - mean)`` is
    ``inf · 0`` — and 0 elsewhere. An output that is never used gets no backward at all (no
    gradient, as dense torch)."""

    @staticmethod
    def forward(ctx, t, degenerate):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        ctx.save_for_backward(degenerate)
        return t / torch.zeros_like(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None
        (degenerate,) = ctx.saved_tensors
        return torch.where(degenerate, torch.full_like(grad, float("nan")), torch.zeros_like(grad)), None


def _safe_root(t, p=2):
    """``t ** (1/p)`` whose gradient is 0 (not nan) where t == 0, as dense std / norm backward
    give; nan stays nan."""
    zero = t == 0
    safe = torch.where(zero, torch.ones_like(t), t)
    return torch.where(zero, torch.zeros_like(t), safe.sqrt() if p == 2 else safe.pow(1.0 / p))


def _var_std(sqrt: bool):
    def routed(input, dim=None, *args, correction=None, keepdim=False, unbiased=None):
        # torch.var(x, dim, unbiased, keepdim), torch.var(x, dim, *, correction, keepdim) and
        # x.var(unbiased)
        if not isinstance(input, MJT):
            return NotImplemented
        if isinstance(dim, bool) and not args:
            dim, unbiased = None, dim
        if args:
            if isinstance(args[0], bool) and unbiased is None and len(args) <= 2:
                unbiased = args[0]
                keepdim = args[1] if len(args) > 1 else keepdim
            else:
                return NotImplemented
        if not (input.dtype.is_floating_point or input.dtype.is_complex):
            raise RuntimeError(f"{'std' if sqrt else 'var'}(): std and var only support floating point and complex dtypes")
        low = _low_precision(input)  # NOTE [ Norms and moments in float32 ]
        if low is not None:
            return routed(input.float(), dim, correction=correction, keepdim=keepdim, unbiased=unbiased).to(low)
        # Static dims too: aten's var/std have no handler, and this composite of routed ops is
        # correct over any dims (its gradient needs no formula of its own).
        dims = _reduced_dims(input, dim)
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        d = None if dim is None else dims
        # The mean gathered back to the input's rows rather than broadcast: a dense (B, 1, …)
        # mean would broadcast over the batch, and the double backward of that broadcast expands
        # a dense tensor to nested-int sizes (NOTE [ Double backward ] in compile/library.py).
        mean = _reduce(input, "mean", d, True)
        centred = input - _call(mj.reduce_backward.default, mean, input.detach(), mean.detach(), "sum", d, True)
        real = torch.empty((), dtype=input.dtype).real.dtype  # var / std of complex values are real
        denom = _reduce(torch.ones_like(input, dtype=real).detach(), "sum", d, keepdim) - correction
        ok = denom > 0
        # Where n - correction <= 0 the result is Σ/0 (inf, nan for no spread), as dense torch gives, and so
        # is its gradient: nan whenever the backward runs, 0 when the result is never used (dense
        # torch then never runs its backward). A plain division would put 0/0 into every sample's
        # gradient.
        total = _reduce(_abs_square(centred), "sum", d, keepdim)
        var = torch.where(ok, total / torch.where(ok, denom, torch.ones_like(denom)), _NanWhere.apply(total, ~ok))
        if not sqrt:
            return var
        # Where var is nan (n <= correction) std is that nan itself: the root's derivative there
        # (nan) would reach a double backward as 0 · nan for a sample with no elements.
        return torch.where(ok, _safe_root(torch.where(ok, var, torch.ones_like(var))), var)

    return routed


route(torch.var, torch.Tensor.var)(_var_std(False))
route(torch.std, torch.Tensor.std)(_var_std(True))


@route(torch.linalg.vector_norm)
def _vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None):
    """Over any dims (static ones too: aten's ``linalg_vector_norm`` has no handler).

    NOTE [ Norm of an empty extent ]: dense torch raises for the ±inf and negative norms of an
    empty vector (no identity). Per sample we define them instead of failing the batch: an empty
    extent has norm 0 for every ``ord >= 0`` and for ``inf`` (the largest of no magnitudes,
    which are all >= 0), and ``inf`` for ``-inf`` and ``ord < 0`` (the smallest of no magnitudes;
    the limit ``(Σ∅ |x|^p)^(1/p) = 0^(1/p)``)."""
    if not isinstance(input, MJT):
        return NotImplemented
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        got = str(input.dtype).replace("torch.", "").capitalize()
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {got}")
    dims = _reduced_dims(input, dim)
    if dtype is not None:
        if input.dtype.is_complex and not dtype.is_complex:
            raise RuntimeError(f"linalg.vector_norm: dtype should be complex for complex inputs, but got {_name(dtype)}")
        if torch.promote_types(input.dtype, dtype) != dtype:
            raise RuntimeError(
                f"linalg.vector_norm: the dtype of the input ({_name(input.dtype)}) should be convertible without "
                f"narrowing to the specified dtype ({_name(dtype)})"
            )
        input = input.to(dtype)
    low = _low_precision(input)
    if low is not None:
        return _vector_norm(input.float(), ord, dim, keepdim).to(low)
    d = None if dim is None else dims
    a = input.abs()
    if ord == float("inf"):
        # amax over an empty extent is the dtype's lowest value; the norm is 0 there
        return _reduce(a, "amax", d, keepdim).clamp_min(0)
    if ord == -float("inf"):
        m = _reduce(a, "amin", d, keepdim)
        empty = _reduce(torch.ones_like(a, dtype=torch.bool).detach(), "sum", d, keepdim) == 0
        return torch.where(empty, torch.full_like(m, float("inf")).detach(), m)
    if ord == 0:
        # the count of nonzeros; differentiable with a zero gradient, as dense (``a · 0`` where
        # ``a`` is 0, so that an inf or a NaN elsewhere gives no NaN)
        return _reduce(torch.where(a != 0, torch.ones((), dtype=a.dtype), a * 0), "sum", d, keepdim)
    if ord == 1:
        return _reduce(a, "sum", d, keepdim)
    if ord == 2:
        return _safe_root(_reduce(_abs_square(input), "sum", d, keepdim))
    if ord < 0:
        return _reduce(_abs_pow(a, ord), "sum", d, keepdim).pow(1.0 / ord)  # Σ = 0 (empty) → inf
    return _safe_root(_reduce(_abs_pow(a, ord), "sum", d, keepdim), ord)


def _name(dtype: torch.dtype) -> str:
    """``Float`` for ``torch.float32``: how dense torch's messages spell a dtype."""
    spelt = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double",
             torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
    return spelt.get(dtype, str(dtype).replace("torch.", "").capitalize())


def _low_precision(input) -> torch.dtype | None:
    """``input``'s dtype where it is float16 / bfloat16, else None.

    NOTE [ Norms and moments in float32 ]: dense torch computes the norms and ``var`` / ``std`` of
    float16 / bfloat16 in float32 (its opmath type) and rounds the result once. These routes are
    composites of several routed ops (squares, sums, a mean subtracted, a root), and each
    rounding back to the low dtype in between overflows (a sum of squares of 200s) or loses the
    value (``200.5`` is not a bfloat16, so a centred ``[200, 201]`` is ``[0, 1]``). So a low
    precision input is cast to float32, the whole composite runs there, and the result is cast
    back; float32 / float64 take no cast."""
    return input.dtype if input.dtype in (torch.float16, torch.bfloat16) else None


def _abs_pow(a, p):
    """``a ** p`` of magnitudes ``a >= 0``, with no gradient where ``a`` is 0: for ``p < 1`` the
    derivative ``p · 0^(p - 1)`` is inf there, and times ``abs``'s 0 it would be NaN; dense norm
    backward gives those entries 0."""
    if p >= 1:
        return a.pow(p)
    zero = a == 0
    at_zero = torch.full((), 0.0 if p > 0 else float("inf"), dtype=a.dtype)
    return torch.where(zero, at_zero, torch.where(zero, torch.ones((), dtype=a.dtype), a).pow(p))


@route(torch.norm, torch.Tensor.norm)
def _norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if p == "fro":
        p = 2
    if p == "nuc" and isinstance(input, MJT) and out is None and isinstance(dim, (list, tuple)) and len(dim) == 2:
        return torch.linalg.matrix_norm(input, "nuc", dim, keepdim, dtype=dtype)  # each sample's matrices
    if not isinstance(p, (int, float)) or out is not None:
        return NotImplemented
    return _vector_norm(input, p, dim, keepdim, dtype=dtype)


@route(torch.linalg.norm)
def _linalg_norm(input, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """Vector norms (``dim`` one dim, or ``dim=None`` with ``ord=None``: the flattened tensor), the
    Frobenius norm over two dims, and the other matrix norms over two dims (``matrix_norm``'s)."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    if dims is not None and len(dims) == 2 and ord in (None, "fro"):
        return _vector_norm(input, 2, dims, keepdim, dtype=dtype)
    if (dims is None and ord is None) or (dims is not None and len(dims) == 1 and not isinstance(ord, str)):
        return _vector_norm(input, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
    if dims is not None and len(dims) == 2:  # the other matrix norms: each sample's matrices, as dense
        return torch.linalg.matrix_norm(input, ord, dims, keepdim, dtype=dtype)
    raise NotImplementedError(
        f"linalg.norm(): ord={ord!r} over dims {dim} is not supported for layout torch.multi_jagged "
        "(vector norms over one dim and the Frobenius norm over two are)"
    )


@route(torch.dist, torch.Tensor.dist)
def _dist(input, other, p=2):
    """``‖input - other‖_p`` over every element, as dense torch: one scalar for the batch."""
    if not (isinstance(input, MJT) or isinstance(other, MJT)):
        return NotImplemented
    return _vector_norm(input - other, p)


class _NanZeroed(torch.autograd.Function):
    """``input`` with nan as 0, whose backward multiplies by the mask of the other elements as
    dense ``nansum``'s does (``where``'s backward selects): an infinite incoming gradient gives
    nan at the nan elements (``inf · 0``), so ``nanmean`` over elements that are all nan has the
    nan gradient of dense ``nansum / 0``."""

    @staticmethod
    def forward(ctx, input):  # type: ignore[override]
        ctx.set_materialize_grads(False)  # no zeros of nested-int sizes (see bridge.py)
        nan = torch.isnan(input)
        ctx.save_for_backward(~nan)
        return torch.where(nan, torch.zeros_like(input), input)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None
        (keep,) = ctx.saved_tensors
        return grad * keep


def _nan_zeroed(input):
    if not input.is_floating_point():
        return input
    return _NanZeroed.apply(input) if input.requires_grad else torch.where(torch.isnan(input), torch.zeros_like(input), input)


@route(torch.nansum, torch.Tensor.nansum)
def _nansum(input, dim=None, keepdim=False, *, dtype=None):
    """``sum`` with nan counted as 0, over any dims (aten's ``nansum`` has no handler); complex on
    CPU refused, as dense's."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input.is_complex() and input.device.type == "cpu":
        raise RuntimeError("nansum(): complex inputs are not supported on CPU (as dense torch's nansum)")
    return torch.sum(_nan_zeroed(input), dim, keepdim, dtype=dtype) if dim is not None else torch.sum(_nan_zeroed(input), dtype=dtype)


@route(torch.nanmean, torch.Tensor.nanmean)
def _nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """dense torch's ``nansum / (number of non-nan elements)``."""
    if not isinstance(input, MJT):
        return NotImplemented
    if not input.is_floating_point():
        raise RuntimeError(f"nanmean(): expected input to have floating point or complex dtype but got {input.dtype}")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError("nanmean(): could not infer output dtype. Optional dtype must be either a floating point or "
                           f"complex dtype. Got: {str(dtype).removeprefix('torch.').capitalize()}")
    # the count as an integer, as dense: the quotient keeps the sum's dtype (``dtype=`` or the input's)
    return _nansum(input, dim, keepdim, dtype=dtype) / _nansum(~torch.isnan(input), dim, keepdim)


@route(torch.count_nonzero, torch.Tensor.count_nonzero)
def _count_nonzero(input, dim=None):
    if not isinstance(input, MJT):
        return NotImplemented
    nz = input != 0
    return nz.sum() if dim is None else nz.sum(dim)


@route(torch.aminmax, torch.Tensor.aminmax)
def _aminmax(input, *, dim=None, keepdim=False):
    if not isinstance(input, MJT):
        return NotImplemented
    if dim is None:
        return torch.return_types.aminmax((torch.amin(input), torch.amax(input)))
    return torch.return_types.aminmax((torch.amin(input, dim, keepdim), torch.amax(input, dim, keepdim)))


def _moments(sqrt: bool):
    spread = _var_std(sqrt)

    def routed(input, dim=None, *args, correction=None, keepdim=False, unbiased=None):
        """``(var, mean)`` / ``(std, mean)``: the ``var`` / ``std`` route (with its arguments)
        and ``mean`` over the same dims."""
        if not isinstance(input, MJT):
            return NotImplemented
        s = spread(input, dim, *args, correction=correction, keepdim=keepdim, unbiased=unbiased)
        if s is NotImplemented:
            return NotImplemented
        if isinstance(dim, bool):  # var_mean(x, unbiased)
            dim = None
        if args and len(args) > 1:
            keepdim = args[1]
        m = torch.mean(input) if dim is None else torch.mean(input, dim, keepdim)
        if dim is None and keepdim:
            m = m.reshape([1] * input.dim())
        return s, m

    return routed


route(torch.var_mean)(_moments(False))
route(torch.std_mean)(_moments(True))


def _trapezoids(name: str, input, x, dx, dim, static: bool = True):
    """The trapezoids' areas along ``dim`` of ``input`` (``(y[1:] + y[:-1]) · dx / 2`` per sample,
    one fewer along that dim; dense ``cumulative_trapezoid``'s terms), or None where dense's own
    decomposition serves: sample points ``x`` given, the batch dim, a non-empty static dim unless
    ``static`` (dense ``trapezoid``'s; of an empty one it builds zeros of the nested-int sizes, and
    dense ``cumulative_trapezoid`` reaches no handler)."""
    if not isinstance(input, MJT):
        return None
    d = canonical_dims(name, input.dim(), [dim])[0]
    if x is not None:
        # sample points of y's own shape (per sample, along a ragged dim too): dense's terms
        # ``x.diff() · (y[1:] + y[:-1]) / 2`` in its order; other forms take dense's path
        if not (isinstance(x, MJT) and d in input._ragged_dims and x._ragged_dims == input._ragged_dims
                and x._partition.same_as(input._partition) and x.shape[1:] == input.shape[1:]):
            return None
        if input.dtype == torch.bool:
            raise RuntimeError(f"{name}: received a bool input for `y`, but bool is not supported")
        head = (slice(None),) * d
        return x.diff(dim=d) * (input[head + (slice(1, None),)] + input[head + (slice(None, -1),)]), d, 2.0
    if d == 0 or (d not in input._ragged_dims and not static and input._size[d] != 0):
        return None
    if input.dtype == torch.bool:
        raise RuntimeError(f"{name}: received a bool input for `y`, but bool is not supported")
    head = (slice(None),) * d
    spacing = 1.0 if dx is None else dx
    return (input[head + (slice(1, None),)] + input[head + (slice(None, -1),)]) * (spacing / 2), d, None


@route(torch.trapezoid, torch.trapz)
def _trapezoid(y, x=None, *, dx=None, dim=-1):
    """The trapezoidal rule along a ragged dim, per sample (an empty or one-point sample: 0), as
    the sum of the trapezoids; uniform spacing ``dx``, or sample points ``x`` of ``y``'s shape. Along a static dim, dense torch's
    decomposition (its rounding), unless the dim is empty (0, as dense's)."""
    areas = _trapezoids("trapezoid", y, x, dx, dim, static=False)
    if areas is None:
        return NotImplemented
    total = areas[0].sum(areas[1])
    return total if areas[2] is None else total / areas[2]


@route(torch.cumulative_trapezoid)
def _cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """Running trapezoidal rule along any dim but the batch dim, per sample: one fewer point
    along it."""
    areas = _trapezoids("cumulative_trapezoid", y, x, dx, dim, static=True)
    if areas is None:
        return NotImplemented
    return (areas[0] if areas[2] is None else areas[0] / areas[2]).cumsum(areas[1])


route(torch.Tensor.renorm_)(in_place_route("renorm_"))


@route(torch.renorm, torch.Tensor.renorm)
def _renorm(input, p, dim, maxnorm, *, out=None):
    """Each sample's sub-tensors along ``dim`` (a static or a ragged dim) scaled to a ``p``-norm of
    at most ``maxnorm``, as dense ``renorm`` does per sample: the norm over every other dim of the
    sample (ragged ones included) and dense's factor ``maxnorm / (norm + 1e-7)`` where the norm
    exceeds ``maxnorm``. A trailing size-1 dim makes the reduced dims never empty (a sub-tensor of
    one element, ``(B, j0)`` along ``j0``). Half precision takes the norm and factor in float32, as
    dense's. The ``inf`` norm of a sample's empty sub-tensor is 0 (NOTE [ Norm of an empty
    extent ]) where dense raises. The batch dim is no per-sample dim: it raises."""
    if not isinstance(input, MJT) or out is not None:
        return NotImplemented
    if input.dim() < 3:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {input.dim() - 1} dimensions")
    if p <= 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    d = canonical_dims("renorm", input.dim(), [dim])[0]
    if d == 0:
        raise NotImplementedError(
            "renorm(): along the batch dim of a multi_jagged tensor a sub-tensor is a whole sample, which no "
            "per-sample renorm gives for layout torch.multi_jagged; renorm along a dim of the samples"
        )
    low = input.dtype in (torch.float16, torch.bfloat16)
    y = input.unsqueeze(-1)
    others = [e for e in range(1, y.dim()) if e != d]
    norm = torch.linalg.vector_norm(y, p, others, keepdim=True, dtype=torch.float32 if low else None).squeeze(-1)
    factor = torch.where(norm > maxnorm, maxnorm / (norm + 1e-7), torch.ones_like(norm))
    return input * (factor.to(input.dtype) if low else factor)
