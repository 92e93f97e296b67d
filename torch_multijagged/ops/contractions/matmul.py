"""``linear`` and ``matmul`` / ``@`` on multi_jagged operands: the routes that pick the
contraction, and the handlers of ``multijagged::linear`` (and its parameter gradients); ``mm``,
``mv``, ``outer``, ``dot``, ``inner`` and ``addmm`` / ``addmv`` / ``addr`` / ``baddbmm`` per sample, as routes
to ``matmul``, ``bmm`` and broadcast products.

``linear`` and ``x @ W`` with a dense 2-D ``W`` act on the packed rows (``multijagged::linear``;
eagerly with gradients, the values bridge: NOTE [ Bridged computations ]). ``matmul`` with a dense
per-sample operand goes to ``bmm``'s handler (``indexing/gather.py``, NOTE [ Batched matmul with
a dense per-sample operand ]), or to ``einsum`` with more batch dims; between square pairs that contract a ragged dim, to
``multijagged::pair_matmul`` (``pair_mm.py``, NOTE [ Contracting a ragged dim ]); between other
multi_jagged tensors whose ragged dims are matrix dims, eagerly, to per-sample products of the
packed values (``ragged_mm.py``, NOTE [ Matmul between multi_jagged tensors ]); with a ragged lead
dim, eagerly, as dense ``matmul`` per sample (``sample_einsum.py``, NOTE [ Contractions sample by
sample ]); otherwise (and traced) as the broadcast product summed over the contracted dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bridge import ragged_as_static, values_of, wrap_values
from ...compile import library
from .. import bridged
from .._common import MJT, autocast_lower, describe, wrap
from .._routing import _call, _dense, _needs_grad, _uniform, route
from .._table import register_multi_jagged_func
from .pair_mm import pair_product
from .ragged_mm import matmul_spec
from .sample_einsum import sample_spec

mj = torch.ops.multijagged


@route(F.linear, torch._C._nn.linear)
def _linear(input, weight, bias=None):
    if isinstance(input, MJT) and _dense(weight) and (bias is None or _dense(bias)):
        if torch.is_autocast_enabled(input.device.type):
            input, weight, bias = autocast_lower(input, weight, bias)
        if torch.compiler.is_compiling() or not _needs_grad(input, weight, bias):
            return _call(mj.linear.default, input, weight, bias)
        # Eagerly, with gradients, the values bridge lets the dense linear run under torch's own (C++) autograd:
        # cheaper than torch.library's Python autograd wrapper, on the op that dominates models.
        # Dynamo cannot trace the bridge (it reads the subclass's attributes), hence the op above.
        # The bridge runs F.linear on the packed values, which would contract whatever static dim
        # is last there: the handler's check first.
        _check_linear_input(input, weight)
        return bridged.linear(input, weight, bias)
    return NotImplemented


@route(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul(input, other, *, out=None):
    if out is not None and (isinstance(input, MJT) or isinstance(other, MJT)):
        # (dense's composite matmul would reach a view of the batch, with an error about that)
        raise NotImplementedError("matmul(): out= variants are not supported for layout torch.multi_jagged")
    if out is None and (_is_vector(input) or _is_vector(other)):
        return _vector_matmul(input, other)
    if out is None and isinstance(input, MJT) and _dense(other) and other.dim() == 1:
        # (B, …, n, k) @ (k,): dense matmul's rule for a vector (a column, then dropped)
        return torch.matmul(input, other.unsqueeze(-1)).squeeze(-1)
    if out is None and isinstance(other, MJT) and _dense(input) and input.dim() == 1:
        # (k,) @ (B, …, k, n) = (B, …, n, k) @ (k,)
        return torch.matmul(other.transpose(-1, -2), input)
    if out is None and isinstance(other, MJT) and _dense(input) and input.dim() == 2 and other.dim() >= 3:
        d = other.dim() - 2
        if d in other._ragged_dims:
            # the contracted dim ragged: every sample's size there must be the matrix's k, and then
            # it is that static size (NOTE [ Static sizes equal to a ragged dim ] in ops/_routing.py)
            e = other._partition.extents[other._ragged_dims.index(d)]
            if torch.compiler.is_compiling() or not _uniform(e, input.shape[1]):
                raise RuntimeError(
                    f"matmul(): a dense ({input.shape[0]}, {input.shape[1]}) matrix times {describe(other)} contracts its "
                    f"ragged dim {d}, whose size must be {input.shape[1]} in every sample (sizes "
                    f"{e.host_lengths().tolist() if not torch.compiler.is_compiling() else 'traced'})")
            other = ragged_as_static(other, d, input.shape[1])
            if not isinstance(other, MJT):
                return torch.matmul(input, other)
        # (m, k) @ (B, …, k, n) = ((B, …, n, k) @ (k, m))ᵀ: a linear map of other's rows
        return torch.matmul(other.transpose(-1, -2), input.transpose(0, 1)).transpose(-1, -2)
    if out is not None or input.dim() < 3 or other.dim() < 2:
        return NotImplemented
    if torch.is_autocast_enabled(input.device.type):
        input, other = autocast_lower(input, other)
    if isinstance(input, MJT) and _dense(other) and other.dim() == 2:
        return _call(mj.linear.default, input, other.t(), None)
    # a dense operand with fewer dims, (B, H, j, D) @ (H, D, E): dense matmul broadcasts the
    # missing leading dims, a dense batch of 1 below
    if isinstance(input, MJT) and _dense(other) and 2 < other.dim() < input.dim():
        other = other.reshape((1,) * (input.dim() - other.dim()) + tuple(other.shape))
    if isinstance(other, MJT) and _dense(input) and 2 < input.dim() < other.dim():
        input = input.reshape((1,) * (other.dim() - input.dim()) + tuple(input.shape))
    if isinstance(input, MJT) != isinstance(other, MJT) and input.dim() == other.dim():
        # A dense per-sample operand (B, …): bmm's handler (ops/indexing/gather.py, NOTE [ Batched matmul
        # with a dense per-sample operand ]); a dense batch of 1 broadcasts, as in dense matmul.
        b = (input if isinstance(input, MJT) else other)._partition.batch
        if input.dim() > 3:
            # (B, H, L, D) @ (B, H, D, j): per sample and head, as einsum, which takes a dense operand
            # with the batch subscript (a dense batch of 1 broadcasts)
            if _dense(input) and input.shape[0] == 1 and b != 1:
                input = input.expand(b, *input.shape[1:])
            if _dense(other) and other.shape[0] == 1 and b != 1:
                other = other.expand(b, *other.shape[1:])
            lead = "abcdefgh"[: input.dim() - 2]
            mjt, dense = (input, other) if isinstance(input, MJT) else (other, input)
            # a dense size 1 against the multi_jagged operand's dim broadcasts: drop that letter
            ones = [d for d in range(1, len(lead)) if dense.shape[d] == 1 and mjt._size[d] != 1]
            dense_lead = "".join(c for d, c in enumerate(lead) if d not in ones)
            dense = dense.squeeze(ones) if ones else dense
            if mjt is input:
                return torch.einsum(f"{lead}ik,{dense_lead}kj->{lead}ij", mjt, dense)
            return torch.einsum(f"{dense_lead}ik,{lead}kj->{lead}ij", dense, mjt)
        if _dense(input) and input.shape[0] == 1 and b != 1:
            input = input.expand(b, -1, -1)
        if _dense(other) and other.shape[0] == 1 and b != 1:
            other = other.expand(b, -1, -1)
        # the contracted dim ragged in the multi_jagged operand and of the dense one's size in every
        # sample (DiffPool's Sᵀ A S of graphs of one size): that static size (NOTE [ Static sizes
        # equal to a ragged dim ] in ops/_routing.py)
        mjt, d, k = (other, 1, input.shape[2]) if isinstance(other, MJT) else (input, 2, other.shape[1])
        if d in mjt._ragged_dims and not torch.compiler.is_compiling():
            e = mjt._partition.extents[mjt._ragged_dims.index(d)]
            if _uniform(e, k):
                mjt = ragged_as_static(mjt, d, k)
                input, other = (input, mjt) if d == 1 else (mjt, other)
                if not isinstance(mjt, MJT):
                    return torch.bmm(input, other)
        return torch.bmm(input, other)
    if isinstance(input, MJT) and isinstance(other, MJT) and input.dim() == other.dim():
        # Square pairs contracting a ragged dim: per-sample products (NOTE [ Contracting a ragged
        # dim ] in ops/contractions/pair_mm.py)
        lead = "abcdefgh"[: input.dim() - 2]
        product = pair_product([lead + "ik", lead + "kj"], [input, other], lead + "ij")
        if product is not None:
            return product
        # Batched matmul whose row, column or contracted dims may be ragged (attention:
        # (B, j0, C) @ (B, C, j0) → (B, j0, j0); (B, j0, j0) @ (B, j0, C) → (B, j0, C)): eagerly,
        # per-sample products of the packed values (NOTE [ Ragged matmul contract ] in
        # kernels/ragged_mm.py); traced, the broadcast product summed over the contracted dim,
        # which Inductor fuses (eagerly it would materialise (…, n, k, m)).
        if input.dtype != other.dtype:  # dense matmul promotes nothing (a broadcast product would)
            raise RuntimeError(f"matmul(): expected m1 and m2 to have the same dtype, but got: {input.dtype} != {other.dtype}")
        plan = matmul_spec(input, other)
        if plan is not None:
            return bridged.ragged_matmul(*plan)
        # a ragged lead dim (triangle attention's (B, j0, H, j0, d) @ (B, j0, H, d, j0)): eagerly, dense
        # matmul sample by sample where the broadcast product would be large (NOTE [ Contractions sample
        # by sample ] in ops/contractions/sample_einsum.py)
        spec = sample_spec([lead + "ik", lead + "kj"], [input, other], lead + "ij")
        if spec is not None:
            return bridged.sample_einsum(spec[0], [input, other], *spec[1:])
        return broadcast_matmul(input, other)
    return NotImplemented


def _is_vector(t) -> bool:
    """A multi_jagged tensor of 1-D samples ``(B, j0)``."""
    return isinstance(t, MJT) and t.dim() == 2


# NOTE [ Matmul with a multi_jagged vector ]
# A multi_jagged ``(B, j0)`` holds one vector per sample, and ``matmul`` applies dense matmul's
# vector rule per sample: two vectors are a dot product (one scalar per sample: a dense ``(B,)``,
# as ``torch.dot`` gives it); a vector on the left is a row ``(1, n)`` and on the right a column
# ``(n, 1)``, whose added dim the result drops. The row or column takes leading dims of size 1 up
# to the other operand's batch dims, so that the matrix-matrix product broadcasts them as dense
# matmul does, ``(H, n, n) @ (n,) → (H, n)``. A vector's only dim is ragged and contracted, which a
# dense operand, of one size for every sample, cannot match: that is an error.
def _vector_matmul(input, other):
    """``input @ other`` where a multi_jagged operand has 1-D samples (NOTE [ Matmul with a
    multi_jagged vector ])."""
    if not (isinstance(input, MJT) and isinstance(other, MJT)):
        raise RuntimeError(f"matmul(): the 1-D samples of {describe(input if _is_vector(input) else other)} contract "
                           f"their ragged dim, which a dense operand {describe(other if _is_vector(input) else input)} "
                           "cannot match (layout torch.multi_jagged)")
    a, b = _per_sample_dim(input), _per_sample_dim(other)
    if a == 1 and b == 1:
        return _dot_product("matmul", input, other, conj=False)
    if b == 1:
        column = other.unsqueeze(-1)
        for _ in range(a - 2):
            column = column.unsqueeze(1)
        return torch.matmul(input, column).squeeze(-1)
    row = input.unsqueeze(-2)
    for _ in range(b - 2):
        row = row.unsqueeze(1)
    return torch.matmul(row, other).squeeze(-2)


def broadcast_matmul(input: MJT, other: MJT) -> MJT:
    """``input @ other`` as the broadcast product summed over the contracted dim, in the operands'
    dtype as dense matmul gives it (an integer sum would accumulate into int64); bool has no
    matmul kernel, as in dense torch."""
    if input.dtype == torch.bool:
        raise RuntimeError('matmul(): "bmm" not implemented for \'Bool\'')
    return (input.unsqueeze(-1) * other.unsqueeze(-3)).sum(-2, dtype=input.dtype)


def _tensorwise(op: str, x: MJT, scales) -> None:
    """A multi_jagged operand of a scaled (fp8) matmul takes one scale for the whole batch: the
    packed rows are then one matrix (row- or block-wise scales would be multi_jagged too)."""
    if len(x._size) != 3 or x._ragged_dims != (1,):
        raise NotImplementedError(f"{op}(): expected a multi_jagged mat_a (B, j0, K), got {describe(x)}")
    if any(s.numel() != 1 for s in scales):
        raise NotImplementedError(f"{op}(): only tensor-wise scales (one per operand) are supported for a multi_jagged "
                                  f"mat_a {describe(x)} (layout torch.multi_jagged)")


@route(torch._scaled_mm_v2)
def _scaled_mm(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None, output_dtype=None,
               contraction_dim=(), use_fast_accum=False):
    """``F.scaled_mm(x, w, …)`` of fp8 rows ``(B, j0, K)`` and a dense ``(K, N)`` with tensor-wise
    scales: the dense op on the packed rows, the batch's structure kept."""
    if not isinstance(mat_a, MJT) or isinstance(mat_b, MJT):
        return NotImplemented
    _tensorwise("scaled_mm", mat_a, scale_a)
    rows = values_of(mat_a) if _needs_grad(mat_a) else mat_a._values
    out = torch._scaled_mm_v2(rows, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, output_dtype,
                              contraction_dim, use_fast_accum)
    return wrap_values(out, mat_a._partition, mat_a._ragged_dims)


@route(torch._scaled_mm)
def _scaled_mm_legacy(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """The older ``torch._scaled_mm(x, w, scale_a, scale_b, …)`` (torchao's and Transformer Engine's
    calls): as ``F.scaled_mm``, the dense op on the packed rows with tensor-wise scales."""
    if not isinstance(self, MJT) or isinstance(mat2, MJT):
        return NotImplemented
    _tensorwise("_scaled_mm", self, (scale_a,))
    rows = values_of(self) if _needs_grad(self) else self._values
    out = torch._scaled_mm(rows, mat2, scale_a, scale_b, bias=bias, scale_result=scale_result, out_dtype=out_dtype,
                           use_fast_accum=use_fast_accum)
    return wrap_values(out, self._partition, self._ragged_dims)


@route(torch._scaled_grouped_mm_v2)
def _scaled_grouped_mm(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, offs=None, bias=None,
                       output_dtype=None, contraction_dim=(), use_fast_accum=False):
    """``F.scaled_grouped_mm(x, w, …)`` of fp8 rows ``(B, j0, K)`` and one ``(K, N)`` per sample
    ``(B, K, N)``: the samples are the groups (as ``grouped_mm``), each sample's rows times its own
    matrix with tensor-wise scales, one dense ``scaled_mm`` per sample."""
    if not isinstance(mat_a, MJT) or isinstance(mat_b, MJT):
        return NotImplemented
    _tensorwise("scaled_grouped_mm", mat_a, scale_a)
    if offs is not None:
        raise RuntimeError(f"scaled_grouped_mm(): the groups of {describe(mat_a)} are its samples; offs must be None")
    b = mat_a._partition.batch
    if mat_b.dim() != 3 or mat_b.shape[0] != b:
        raise RuntimeError(f"scaled_grouped_mm(): expected a dense (B, K, N) mat_b with B = {b} for {describe(mat_a)}, "
                           f"got {tuple(mat_b.shape)}")
    if any(s.numel() != 1 for s in scale_b):
        raise NotImplementedError("scaled_grouped_mm(): only tensor-wise scales are supported for layout torch.multi_jagged")
    rows = values_of(mat_a) if _needs_grad(mat_a) else mat_a._values
    # SYNC: none — host offsets of the batch's extent
    counts = mat_a._partition.extents[0].host_lengths().tolist()
    outs = [torch._scaled_mm_v2(r, mat_b[i], scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                output_dtype, contraction_dim, use_fast_accum)
            for i, r in enumerate(rows.split(counts))]
    out = torch.cat(outs) if outs else rows.new_zeros(0, mat_b.shape[-1], dtype=output_dtype or torch.bfloat16)
    return wrap_values(out, mat_a._partition, mat_a._ragged_dims)


def _check_linear_input(x: MJT, weight: torch.Tensor) -> None:
    """``linear`` contracts the last dim of each sample: it must be static (a ragged last dim is
    not a packed-values dim) and match ``weight``."""
    v = x._values
    if v.dim() < 2 or x._ragged_dims[-1] == len(x._size) - 1 or v.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear(): expected the last dim of input to be static and equal to weight.shape[-1] = "
            f"{weight.shape[-1]}, got input shape {tuple(x.shape)}"
        )


@register_multi_jagged_func(mj.linear.default, "x: mjt, weight: t, bias: t?")
def linear_default(func, x, weight, bias=None):
    _check_linear_input(x, weight)
    return wrap(F.linear(x._values, weight, bias), x._partition, x._ragged_dims)


@register_multi_jagged_func(mj.linear_param_grads.default, "grad: mjt, x: mjt, weight: any, bias: any")
def linear_param_grads_default(func, grad, x, weight, bias):
    return library._linear_param_grads_dense(grad._values, x._values, weight, bias)


# ----------------------------------------------------------------------------- mm, mv, outer, dot and their add* forms
# Each is the dense op per sample: ``torch.mm(x, W)`` on ``(B, j0, C)`` is ``x_b @ W`` for every
# sample (dense mm on the batched 3-D tensor would refuse it). They route to ``matmul`` and to
# broadcast products, whose routes and handlers already hold every structure and gradient.
def _per_sample_dim(t) -> int:
    return t.dim() - 1 if isinstance(t, MJT) else t.dim()


def _check_dims(op: str, want: tuple[int, ...], *ts) -> None:
    got = tuple(_per_sample_dim(t) for t in ts)
    if got != want:
        raise RuntimeError(
            f"{op}(): expected operands of {', '.join(f'{d}-D' for d in want)} per sample (a multi_jagged tensor's "
            f"samples have one dim fewer than it), got {' and '.join(describe(t) for t in ts)}"
        )


def _involves(*ts) -> bool:
    return any(isinstance(t, MJT) for t in ts)


def _scaled_sum(op: str, input, product, beta, alpha):
    """``beta * input + alpha * product`` as dense ``addmm`` / ``addmv`` / ``addr`` / ``baddbmm``
    compute it: ``input`` ignored for ``beta == 0`` (its nan and inf do not propagate); in the
    operands' dtype — for integers ``addr`` refuses a float ``beta`` / ``alpha`` (dense's message)
    and the others truncate it to an int, as dense casts it; bool reads them as bools (``or`` of
    ``and``s); float16 / bfloat16 in float32, rounded once."""
    dtype = product.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        for name, v in (("beta", beta), ("alpha", alpha)):
            if op == "addr" and (isinstance(v, float) or (isinstance(v, torch.Tensor) and v.is_floating_point())):
                raise RuntimeError(f"For integral input tensors, argument {name} must not be a floating point number.")
        beta, alpha = int(beta), int(alpha)
        if dtype == torch.bool:
            product = product if alpha else product.logical_and(False)
            return product if not beta else product.logical_or(input)
    low = dtype if dtype in (torch.float16, torch.bfloat16) else None
    if low is not None and (alpha != 1 or beta not in (0, 1)):
        product, input = product.float(), input.float()
    if alpha != 1:
        product = product * alpha
    out = product if beta == 0 else (input if beta == 1 else input * beta) + product
    _input_broadcasts_to(op, out, product)
    return out.to(low) if low is not None and out.dtype != low else out


def _input_broadcasts_to(op: str, out, product) -> None:
    """Dense ``addmm`` / ``baddbmm`` … expand ``input`` to the product's shape, never the product to
    ``input``'s: a sample whose product is smaller than its ``input`` (a length 1 where ``input``
    has more) raises, as that sample's dense call does."""
    if not isinstance(out, MJT) or not isinstance(product, MJT) or out._partition is product._partition:
        return
    mine, theirs = out._partition.host_sizes(), product._partition.host_sizes()
    if out._ragged_dims != product._ragged_dims or not torch.equal(mine, theirs):
        bad = int((mine != theirs).any(1).nonzero()[0, 0]) if mine.shape == theirs.shape else 0
        raise RuntimeError(f"{op}(): the expanded size of the input must match the product's: sample {bad} of the "
                           f"product has sizes {theirs[bad].tolist()} along its ragged dims where the input has "
                           f"{mine[bad].tolist()} (product {describe(product)}, result {describe(out)})")


@route(torch.mm, torch.Tensor.mm)
def _mm(input, mat2, *, out=None):
    if out is not None or not _involves(input, mat2):
        return NotImplemented
    _check_dims("mm", (2, 2), input, mat2)
    return torch.matmul(input, mat2)


@route(torch.linalg.multi_dot)
def _multi_dot(tensors, *, out=None):
    """``linalg.multi_dot`` per sample: each sample's chain of matrix products, a first operand of
    one dim per sample a row vector and a last one a column vector (dense's rule), a dense operand
    the same for every sample; the products from left to right (dense picks the cheapest order,
    which differs in rounding only)."""
    if out is not None or not isinstance(tensors, (list, tuple)) or not _involves(*tensors):
        return NotImplemented
    return _chain("multi_dot", list(tensors))


@route(torch.chain_matmul)
def _chain_matmul(*matrices, out=None):
    """Deprecated ``chain_matmul``: ``multi_dot`` of matrices only (dense's message for a vector)."""
    if out is not None or not _involves(*matrices):
        return NotImplemented
    for t in matrices:
        if _per_sample_dim(t) != 2:
            raise RuntimeError(f"Tensor dimension is {_per_sample_dim(t)}, expected 2 instead.")
    return _chain("chain_matmul", list(matrices))


def _chain(op: str, ts: list):
    if len(ts) < 2:
        raise RuntimeError(f"{op}(): expected at least 2 tensors but got {len(ts)}")
    dims = [_per_sample_dim(t) for t in ts]
    if dims[0] not in (1, 2):
        raise RuntimeError(f"{op}(): the first tensor must be 1D or 2D but got {dims[0]}D per sample ({describe(ts[0])})")
    if dims[-1] not in (1, 2):
        raise RuntimeError(f"{op}(): the last tensor must be 1D or 2D but got {dims[-1]}D per sample ({describe(ts[-1])})")
    for i, d in enumerate(dims[1:-1], 1):
        if d != 2:
            raise RuntimeError(f"{op}(): tensor {i} must be 2D but got {d}D per sample ({describe(ts[i])})")
    for i, t in enumerate(ts[1:], 1):
        if t.dtype != ts[0].dtype:
            raise RuntimeError(f"{op}(): all tensors must have be the same dtype but tensor 0 is {ts[0].dtype} and "
                               f"tensor {i} {t.dtype}")
    row, col = dims[0] == 1, dims[-1] == 1
    ts = [ts[0].unsqueeze(-2) if row else ts[0], *ts[1:-1], ts[-1].unsqueeze(-1) if col else ts[-1]]
    out = ts[0]
    for t in ts[1:]:
        out = torch.matmul(out, t)
    if col:
        out = out.squeeze(-1)
    return out.squeeze(-1 if col else -2) if row else out


@route(torch.mv, torch.Tensor.mv)
def _mv(input, vec, *, out=None):
    if out is not None or not _involves(input, vec):
        return NotImplemented
    _check_dims("mv", (2, 1), input, vec)
    return torch.matmul(input, vec.unsqueeze(-1)).squeeze(-1)


@route(torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger)
def _outer(input, vec2, *, out=None):
    if out is not None or not _involves(input, vec2):
        return NotImplemented
    _check_dims("outer", (1, 1), input, vec2)
    return input.unsqueeze(-1) * vec2.unsqueeze(-2)


def _dot_product(op: str, input, other, conj: bool):
    _check_dims(op, (1, 1), input, other)
    if input.dtype != other.dtype:
        raise RuntimeError(f"{op}(): expected both vectors to have the same dtype, but found {input.dtype} and {other.dtype}")
    if input.dtype == torch.bool:
        raise RuntimeError(f"{op}(): \"dot\" not implemented for 'Bool'")
    # in the operands' dtype, as dense dot gives it (an integer sum would accumulate into int64)
    return ((input.conj() if conj and input.is_complex() else input) * other).sum(-1, dtype=input.dtype)


@route(torch.dot, torch.Tensor.dot)
def _dot(input, other, *, out=None):
    if out is not None or not _involves(input, other):
        return NotImplemented
    return _dot_product("dot", input, other, conj=False)


@route(torch.vdot, torch.Tensor.vdot)
def _vdot(input, other, *, out=None):
    if out is not None or not _involves(input, other):
        return NotImplemented
    return _dot_product("vdot", input, other, conj=True)


@route(torch.inner, torch.Tensor.inner)
def _inner(input, other, *, out=None):
    """``Σ_k a[…, k] b[…, k]`` per sample: a dense 1-D ``other`` or two samples of one dim each
    sum a product; a dense 2-D ``other`` or two 2-D samples are a matmul with ``otherᵀ``."""
    if out is not None or not _involves(input, other):
        return NotImplemented
    a, b = _per_sample_dim(input), _per_sample_dim(other)
    if b == 1 and (a == 1 or not isinstance(other, MJT)):
        return (input * other).sum(-1)
    if a == 2 and b == 2:
        return torch.matmul(input, other.transpose(-1, -2))
    raise NotImplementedError(
        f"inner(): {describe(input)} and {describe(other)} are not supported for layout torch.multi_jagged "
        "(supported: a dense 1-D or 2-D other, or samples of one or two dims each)"
    )


@route(torch.addmm, torch.Tensor.addmm)
def _addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves(input, mat1, mat2):
        return NotImplemented
    return _scaled_sum("addmm", input, _mm(mat1, mat2), beta, alpha)


@route(torch.addmv, torch.Tensor.addmv)
def _addmv(input, mat, vec, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves(input, mat, vec):
        return NotImplemented
    return _scaled_sum("addmv", input, _mv(mat, vec), beta, alpha)


@route(torch.addr, torch.Tensor.addr)
def _addr(input, vec1, vec2, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves(input, vec1, vec2):
        return NotImplemented
    return _scaled_sum("addr", input, _outer(vec1, vec2), beta, alpha)


@route(torch.baddbmm, torch.Tensor.baddbmm)
def _baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    if out is not None or not _involves(input, batch1, batch2):
        return NotImplemented
    return _scaled_sum("baddbmm", input, torch.bmm(batch1, batch2), beta, alpha)


@route(F.bilinear, torch.bilinear)
def _bilinear(input1, input2, weight, bias=None):
    """``x1ᵀ A_o x2 + b_o`` per position: ``x1`` times ``A`` as one matmul with a dense
    ``(in1, out · in2)`` matrix, then the product with ``x2`` summed over ``in2`` (aten's
    ``_trilinear`` flattens the leading dims, ragged ones included)."""
    if not _involves(input1, input2) or isinstance(weight, MJT) or isinstance(bias, MJT):
        return NotImplemented
    ts = [("input1", input1), ("input2", input2), ("weight", weight)] + ([("bias", bias)] if bias is not None else [])
    if any(t.dtype != input1.dtype for _, t in ts):  # dense's check and words
        names = {torch.float32: "float", torch.float64: "double", torch.float16: "half", torch.bfloat16: "bfloat16"}
        raise RuntimeError("All tensors must have the same dtype, got " + ", ".join(
            f"{n}: {names.get(t.dtype, str(t.dtype).replace('torch.', ''))}" for n, t in ts))
    if not (isinstance(input1, MJT) and isinstance(input2, MJT)) or input1._partition is not input2._partition:
        _same_positions("bilinear", input1, input2)
    o, i1, i2 = weight.shape
    t = torch.matmul(input1, weight.permute(1, 0, 2).reshape(i1, o * i2)).unflatten(-1, (o, i2))
    out = (t * input2.unsqueeze(-2)).sum(-1, dtype=t.dtype)  # an integer sum keeps its dtype, as dense's
    return out if bias is None else out + bias


def _same_positions(op: str, a, b) -> None:
    """Dense ``bilinear`` pairs ``input1``'s and ``input2``'s positions one to one (no broadcasting):
    their sizes before the feature dim must agree in every sample."""
    if not (isinstance(a, MJT) and isinstance(b, MJT)) or a.dim() != b.dim() or a._ragged_dims != b._ragged_dims:
        raise RuntimeError(f"{op}(): input batch dimensions do not match: got {describe(a)} and {describe(b)}")
    sa, sb = a._partition.host_sizes(), b._partition.host_sizes()
    statics = [d for d in range(1, a.dim() - 1) if d not in a._ragged_dims]
    if not torch.equal(sa, sb) or any(a.shape[d] != b.shape[d] for d in statics):
        raise RuntimeError(f"{op}(): input batch dimensions do not match: got {describe(a)} and {describe(b)}"
                           + ("" if torch.equal(sa, sb) else f" (sizes {sa.tolist()} and {sb.tolist()})"))
