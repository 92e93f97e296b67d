"""Linear algebra of the matrices a multi_jagged tensor holds: ``torch.linalg`` on ``(B, j0, n, n)``
(a matrix per row) and on square pairs ``(B, j0, j0)`` (a matrix per sample).

NOTE [ Matrices in a batch ]

``torch.linalg`` functions act on the last two dims (the *matrix* dims; ``svdvals`` and the rest
likewise) and treat every dim before them as a batch dim. So:

* **Static matrix dims** (``(B, j0, n, n)``, ``(B, j0, j1, n, k)``): every packed row holds whole
  matrices, and the function on the packed values ``(T, n, n)`` is the function on each sample —
  one call, its own derivative (every order), outputs with the input's partition and ragged
  dims (``det`` ``(B, j0)``, ``eigh`` ``((B, j0, n), (B, j0, n, n))``). A second operand
  (``solve``'s ``B``, ``cholesky_solve``'s factor) is multi_jagged of the same structure, or a
  dense tensor of at most the matrix dims (broadcast to every matrix).
* **Ragged matrix dims** (a square pair ``(B, j0, j0)``: one ``nᵢ × nᵢ`` matrix per sample): the
  function runs on each sample's matrix (a view) and the results are packed back — a pair's
  output ``(nᵢ, nᵢ)`` into the input's partition, a vector's ``(nᵢ,)`` onto the pair's extent
  (``(B, j0)``), a scalar into a dense ``(B,)``. A Python loop over samples: correct for any
  sizes (a ``0 × 0`` matrix too, as dense), not fast for many small samples.

* **One matrix per sample with a ragged dim** (``(B, j0, C)``, ``(B, C, j0)``, ``(B, j0, j1)``):
  the function on each sample's matrix; an output with one shape for every sample is stacked
  (``svdvals`` of ``(nᵢ, C)`` with ``nᵢ ≥ C``: ``(B, C)``), others make a new batch (``qr``'s
  ``Q``, ``pinv``).

Anything else (a ragged dim among the matrix dims with other dims before them) raises, naming
the function. Eager only: the values bridge and the loop are not traced
(under ``torch.compile`` a graph break, NOTE [ Eager-only routes ] in ``_common.py``).
"""

from __future__ import annotations

import torch

from ...bridge import values_of, wrap_values
from ...errors import StructureError
from ...structure import partition_for
from .._common import MJT, autocast_lower, canonical_dim, describe, eager_route, static_dims
from .._routing import route

__all__: list[str] = []

aten = torch.ops.aten

_WHY = "{op}(): linear algebra of a multi_jagged tensor runs eagerly (on the packed values, or per sample)"

# function → how many of its leading positional arguments are matrices (the rest pass through)
_MATRIX_ARGS = {
    torch.linalg.inv: 1, torch.inverse: 1, torch.linalg.inv_ex: 1,
    torch.linalg.det: 1, torch.det: 1, torch.logdet: 1, torch.linalg.slogdet: 1, torch.slogdet: 1,
    torch.linalg.cholesky: 1, torch.linalg.cholesky_ex: 1,
    torch.linalg.eigh: 1, torch.linalg.eigvalsh: 1, torch.linalg.eig: 1, torch.linalg.eigvals: 1,
    torch.linalg.qr: 1, torch.linalg.svd: 1, torch.linalg.svdvals: 1, torch.svd: 1,
    torch.linalg.matrix_exp: 1, torch.matrix_exp: 1, torch.linalg.matrix_power: 1, torch.matrix_power: 1,
    torch.linalg.pinv: 1, torch.pinverse: 1, torch.linalg.matrix_norm: 1, torch.linalg.matrix_rank: 1,
    torch.linalg.cond: 1, torch.linalg.lu_factor: 1, torch.linalg.lu: 1,
    torch.linalg.solve: 2, torch.linalg.solve_ex: 2, torch.linalg.lstsq: 2,
    # the aten ops behind them, when called directly (``torch.ops.aten._linalg_eigh(a)``)
    aten._linalg_eigh.default: 1, aten._linalg_svd.default: 1, aten._linalg_solve_ex.default: 2, torch.cholesky_solve: 2, torch.linalg.solve_triangular: 2,
}
# Tensor methods that are the same functions
_METHODS = {
    torch.Tensor.inverse: torch.inverse, torch.Tensor.det: torch.det, torch.Tensor.logdet: torch.logdet,
    torch.Tensor.slogdet: torch.slogdet, torch.Tensor.svd: torch.svd, torch.Tensor.matrix_exp: torch.matrix_exp,
    torch.Tensor.matrix_power: torch.matrix_power, torch.Tensor.pinverse: torch.pinverse,
    torch.Tensor.cholesky_solve: torch.cholesky_solve,
}


def _kind(op: str, x: MJT) -> str:
    """``"rows"`` (the matrix dims are static), ``"samples"`` (they are a square pair's two ragged
    dims) or a StructureError."""
    n = x.dim()
    if n < 3:
        raise StructureError(f"{op}(): expected matrices in the last two dims, got {describe(x)}")
    matrix = {n - 2, n - 1}
    ragged = set(x._ragged_dims)
    if not ragged & matrix:
        return "rows"
    if x._ragged_dims == (1, 2) and n == 3 and x._partition.extents[0] is x._partition.extents[1]:
        return "samples"
    if n == 3:
        return "matrices"  # one matrix per sample, of its own shape
    raise StructureError(
        f"{op}(): the matrix dims (the last two) of {describe(x)} must be static, or be a square pair's two ragged "
        "dims (B, j0, j0)"
    )


def _structures_match(a: MJT, b: MJT) -> bool:
    return a._partition.same_as(b._partition) and a._ragged_dims == b._ragged_dims


# ``solve``'s right-hand side ``B`` is a batch of vectors when ``B.shape == A.shape[:-1]``:
# a rule on sizes, which a dense ``B`` shared by samples of different sizes meets for some only
_VECTOR_RULE = {torch.linalg.solve, torch.linalg.solve_ex, aten._linalg_solve_ex.default}


def _dense_rhs(func, x: MJT, b: torch.Tensor) -> torch.Tensor:
    """A dense matrix ``b`` shared by every matrix of ``x`` as the values-level operand: expanded
    over the rows, so that it is read as a matrix there too. Where dense torch would read it as a
    batch of vectors for some sample (``x (B, j0, n, n)``, ``b (m, n)`` with a sample of ``m``
    matrices), the samples would disagree: that raises."""
    n = x.shape[-1]
    if x.dim() == 4 and b.shape[-1] == n:
        sizes = (x._partition.extents[0].host_lengths().tolist() if 1 in x._ragged_dims else [int(x.shape[1])])
        if b.shape[0] in sizes:
            raise NotImplementedError(
                f"{func.__name__}(): a dense right-hand side of shape {tuple(b.shape)} with {describe(x)}: dense torch reads "
                f"it as a batch of vectors for a sample of {b.shape[0]} matrices and as a matrix for the others; pass it "
                "as a multi_jagged tensor, or unsqueeze it to a batch of one (layout torch.multi_jagged)"
            )
    return b.expand(x._values.shape[0], *b.shape)


def _on_rows(func, x: MJT, matrices, rest, kwargs):
    args = []
    for m in matrices:
        if isinstance(m, MJT):
            if not _structures_match(m, x):
                raise StructureError(f"{func.__name__}(): operands {describe(x)} and {describe(m)} differ in structure")
            args.append(values_of(m))
        elif isinstance(m, torch.Tensor) and m.dim() > 2:
            raise StructureError(
                f"{func.__name__}(): a dense operand {tuple(m.shape)} with {describe(x)}: only the matrix dims (at most 2 dims)"
            )
        elif isinstance(m, torch.Tensor) and m.dim() == 2 and func in _VECTOR_RULE and args:
            args.append(_dense_rhs(func, x, m))
        else:
            args.append(m)
    out = func(*args, *rest, **kwargs)
    rows = x._values.shape[0]
    # an output with a matrix or vector per row; ``lstsq``'s driver-dependent empty fields stay as they are
    return _pack(out, lambda t: wrap_values(t, x._partition, x._ragged_dims) if t.dim() and t.shape[0] == rows else t)


def _same_lengths(a, b) -> bool:
    """One extent, or two of equal per-sample sizes (built separately: the unifying of equal sizes
    that torch functions get does not run for an aten op called directly)."""
    return a is b or (a.batch == b.batch and torch.equal(a.host_lengths(), b.host_lengths()))


def _on_samples(func, x: MJT, matrices, rest, kwargs):
    for m in matrices:
        if isinstance(m, MJT) and m is not x and not _same_lengths(m._partition.extents[0], x._partition.extents[0]):
            raise StructureError(f"{func.__name__}(): operands {describe(x)} and {describe(m)} differ in structure")
    per_sample = _per_sample(func, x, matrices, rest, kwargs)
    lengths = x._partition.extents[0].host_lengths().tolist()
    if not per_sample:  # B = 0: what the function makes of a 0 × 0 matrix tells each output's form
        empty = [torch.zeros(0, 0, dtype=m.dtype, device=m.device) if isinstance(m, MJT) else m for m in matrices]
        probe = func(*empty, *rest, **kwargs)
        return _pack(probe, lambda t: _assemble(x, [], [], t))
    if isinstance(per_sample[0], torch.Tensor):
        return _assemble(x, per_sample, lengths, per_sample[0])
    fields = list(zip(*per_sample))
    return type(per_sample[0])([_assemble(x, list(f), lengths, f[0]) if isinstance(f[0], torch.Tensor) else f[0] for f in fields])


def _per_sample(func, x: MJT, matrices, rest, kwargs) -> list:
    """``func`` on each sample's matrices (multi_jagged operands unbound, dense ones shared)."""
    unbound = [m.unbind() if isinstance(m, MJT) else None for m in matrices]
    return [func(*[u[i] if u is not None else m for u, m in zip(unbound, matrices)], *rest, **kwargs)
            for i in range(x._partition.batch)]


def _per_matrix(func, x: MJT, matrices, rest, kwargs):
    """One matrix per sample with a ragged dim among its two (``(B, j0, C)``, ``(B, C, j0)``,
    ``(B, j0, j1)``): the function on each sample's matrix; each output stacked when every sample
    gives one shape, else a new batch of them (``qr``'s ``Q`` is ``(nᵢ, C)``)."""
    for m in matrices:
        if isinstance(m, MJT) and m._partition.batch != x._partition.batch:
            raise StructureError(f"{func.__name__}(): operands {describe(x)} and {describe(m)} differ in batch size")
    per_sample = _per_sample(func, x, matrices, rest, kwargs)
    if not per_sample:
        raise NotImplementedError(f"{func.__name__}(): of an empty batch {describe(x)} with ragged matrix dims")

    def join(parts):
        if all(p.shape == parts[0].shape for p in parts):
            return torch.stack(parts)
        from ...constructors import as_nested_tensor

        return as_nested_tensor(parts)

    if isinstance(per_sample[0], torch.Tensor):
        return join(per_sample)
    fields = list(zip(*per_sample))
    return type(per_sample[0])([join(list(f)) if isinstance(f[0], torch.Tensor) else f[0] for f in fields])


def _assemble(x: MJT, parts, lengths, like: torch.Tensor):
    """Per-sample outputs packed back: ``(nᵢ, nᵢ, …)`` into the pair's partition, ``(nᵢ, …)`` onto
    its extent, anything else stacked into a dense ``(B, …)``; ``like`` shows the form when ``parts``
    is empty."""
    if not parts:  # B = 0; ``like`` is the output for a 0 × 0 matrix
        if like.dim() >= 2:
            return wrap_values(like.new_zeros((0, *like.shape[2:])), x._partition, (1, 2))
        if like.dim() == 1:
            return wrap_values(like.new_zeros((0,)), partition_for((x._partition.extents[0],)), (1,))
        return like.new_zeros((0,))
    if all(p.dim() >= 2 and tuple(p.shape[:2]) == (n, n) for p, n in zip(parts, lengths)):
        return wrap_values(torch.cat([p.reshape(n * n, *p.shape[2:]) for p, n in zip(parts, lengths)]), x._partition, (1, 2))
    if all(p.dim() >= 1 and p.shape[0] == n for p, n in zip(parts, lengths)):
        return wrap_values(torch.cat(parts), partition_for((x._partition.extents[0],)), (1,))
    return torch.stack(parts)


def _pack(out, wrap):
    if isinstance(out, torch.Tensor):
        return wrap(out)
    return type(out)([wrap(o) if isinstance(o, torch.Tensor) else o for o in out])


def _linalg(func):
    k = _MATRIX_ARGS[func]

    @eager_route(_WHY)
    def routed(*args, **kwargs):
        matrices, rest = list(args[:k]), args[k:]
        x = next((m for m in matrices if isinstance(m, MJT)), None)
        if func is torch.linalg.matrix_norm and x is not None and ("dim" in kwargs or len(rest) > 1):
            dim = kwargs.get("dim", rest[1] if len(rest) > 1 else None)
            if dim is not None and sorted(canonical_dim(func.__name__, x.dim(), d) for d in dim) == [x.dim() - 2, x.dim() - 1]:
                # the matrix dims named: the default, in either order
                if list(dim)[0] != -2 and canonical_dim(func.__name__, x.dim(), list(dim)[0]) == x.dim() - 1:
                    x_t = x.transpose(-1, -2)
                    matrices = [x_t if m is x else m for m in matrices]
                    x = x_t
                # keepdim after a positional dim stays keepdim: by keyword, with dim left out
                kwargs = {k: v for k, v in kwargs.items() if k != "dim"} | dict(zip(("keepdim",), rest[2:]))
                rest = rest[:1]
            else:
                return NotImplemented  # (a matrix norm over other dims: the norm routes)
        if x is None or "out" in kwargs:
            return NotImplemented
        kind = _kind(func.__name__, x)
        if kind == "rows":
            return _on_rows(func, x, matrices, rest, kwargs)
        if kind == "matrices":
            return _per_matrix(func, x, matrices, rest, kwargs)
        return _on_samples(func, x, matrices, rest, kwargs)

    routed.__name__ = func.__name__
    return routed


@route(aten._linalg_check_errors.default)
def _check_errors(info, api_name, *, is_matrix):
    """The error check ``linalg`` functions run on their ``info`` output: on the packed values (one
    info per matrix, the batch's matrices in order)."""
    if not isinstance(info, MJT):
        return NotImplemented
    return aten._linalg_check_errors.default(info._values, api_name, is_matrix=is_matrix)


for _f in _MATRIX_ARGS:
    route(_f)(_linalg(_f))
for _m, _f in _METHODS.items():
    route(_m)(_linalg(_f))


@route(torch.linalg.cross)
def _cross(input, other, *, dim=-1, out=None):
    """``linalg.cross`` along a static dim of size 3: the packed rows' vectors."""
    if out is not None or not (isinstance(input, MJT) and isinstance(other, MJT)):
        return NotImplemented
    if not _structures_match(input, other) or input.shape[1:] != other.shape[1:]:
        raise StructureError(f"linalg.cross(): operands {describe(input)} and {describe(other)} differ in structure")
    d = canonical_dim("linalg.cross", input.dim(), dim)
    if d == 0 or d in input._ragged_dims:
        raise StructureError(f"linalg.cross(): expected a static dim of {describe(input)}, got dim {dim}")
    vd = static_dims(input.dim(), input._ragged_dims).index(d) + 1
    return wrap_values(torch.linalg.cross(values_of(input), values_of(other), dim=vd), input._partition, input._ragged_dims)


@route(torch.cross, torch.Tensor.cross)
def _cross_legacy(input, other, dim=None, *, out=None):
    """``torch.cross``: ``linalg.cross`` along ``dim``; without one, dense's deprecated default,
    the first dim of size 3, where that is a static dim no ragged dim precedes (a ragged dim
    before it would be the first of size 3 in the samples of that length)."""
    if dim is None and isinstance(input, MJT):
        first = next((d for d in range(1, input.dim()) if d in input._ragged_dims or input.shape[d] == 3), None)
        if first is None or first in input._ragged_dims:
            raise StructureError(
                f"cross(): without dim, the first dim of size 3 of {describe(input)} "
                + ("is none" if first is None else "may be a ragged dim in some samples")
                + "; pass dim= (or use torch.linalg.cross)")
        dim = first
    return _cross(input, other, dim=-1 if dim is None else dim, out=out)


@route(torch.linalg.vecdot)
def _vecdot(x, y, *, dim=-1, out=None):
    """``linalg.vecdot`` as the product ``x̄ · y`` summed over ``dim``, ragged or static: aten's
    composite would reach the same sum, but its derivative expands the gradient to the operands'
    sizes, nested ints included, which needs concrete sizes."""
    if out is not None or not (isinstance(x, MJT) or isinstance(y, MJT)):
        return NotImplemented
    if torch.is_autocast_enabled(x.device.type) and not x.is_complex():
        x, y = autocast_lower(x, y)  # dense's real vecdot is a matmul, which autocast lowers
    if not (x.is_floating_point() or x.is_complex()):
        raise RuntimeError(f"linalg.vecdot(): expected a floating point or complex tensor as input, got {x.dtype}")
    if x.dtype != y.dtype:
        raise RuntimeError(f"linalg.vecdot(): expected x and y to have the same dtype, but found {x.dtype} and {y.dtype}")
    return ((x.conj() if x.is_complex() else x) * y).sum(dim)
