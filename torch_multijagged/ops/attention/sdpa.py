"""Scaled dot-product attention on multi_jagged tensors.

NOTE [ Attention over ragged dims ]

``F.scaled_dot_product_attention(q, k, v)`` attends along dim -2 of q (L) and of k/v (S); every
dim before it is a batch dim. On this layout the batch dims may themselves be ragged:

* ``q (B, H, j0, D)`` — the ``torch.jagged`` convention, from ``(B, j0, H, D).transpose(1, 2)``;
* ``q (B, j0, H, j1, D)`` — the rows of a pair attending along their columns (triangle
  attention), with a bias ``(B, 1, H, j1, j1)`` shared by every row;
* ``q (B, j0, H, L, D)`` with L static — attention inside each packed row;
* a dense ``q (B, H, L, D)`` against ``k / v (B, H, j0, D)`` — each sample's L queries over its
  own keys (DETR's object queries, Perceiver's latents, pooling by a learned query): the queries
  are viewed as a batch of L rows per sample, attend as ragged queries do, and the result is
  dense ``(B, H, L, Dv)``; dense keys and values under ragged queries are viewed alike.

When L is ragged it is the *last* ragged dim, so in the packed values each (sample, ragged batch
coordinates) owns consecutive rows: a *segment*. q's values ``(Tq, *heads, D)`` are then exactly
flash-attn's varlen layout, with ``cu_seqlens`` the segments' prefix sums (``segments``), and
k/v's segments pair up one to one with q's (same batch extents, their own S extent: cross
attention). The heads are the static batch dims, flattened. A mask becomes an additive bias in
the score layout, addressed per segment (``_bias``), so a bias shared by the rows of a pair is
never copied per row. The route checks the structure and normalises the mask; the handler of
``multijagged::sdpa`` runs ``multijagged::varlen_attention`` (compile/attention.py), whose
kernel picks a backend (NOTE [ Attention backends ]).

Semantics are dense SDPA's per sample: a query with no visible key (a sample with no keys, or a
fully masked row) gives a zero output row; ``is_causal`` is top-left aligned; ``attn_mask`` and
``is_causal`` together raise, as dense.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import constructors
from ...bridge import dense_as_ragged, ragged_as_static, static_as_ragged, values_of
from ...compile import attention as cattn
from ...compile.attention import BACKENDS, backend  # noqa: F401  (public: re-exported)
from ...errors import TRACED_EXTENTS, StructureError
from ...kernels import attention as kattn
from ...structure import _is_traced, building, partition_for, same_extent
from .._table import register_multi_jagged_func
from .._common import MJT, autocast_lower, describe, static_dims, wrap
from .._routing import _call, _needs_grad, _uniform, assume_unified, route

__all__ = ["backend", "BACKENDS", "segments", "dense_as_rows"]

mj = torch.ops.multijagged
_OP = "scaled_dot_product_attention"


# ----------------------------------------------------------------------------- segments
def segments(x: MJT):
    """``(cu, seg_sample)`` of ``x`` attending along its last ragged dim: ``cu (N+1,)`` the
    segments' row offsets (flash-attn's ``cu_seqlens``), ``seg_sample (N,)`` each segment's sample
    (``Partition.segments``, cached on the partition)."""
    return x._partition.segments()


# ----------------------------------------------------------------------------- route
def _traced_hint(a: MJT, b: MJT) -> str:
    """Why two traced tensors' extents may not combine (``TRACED_EXTENTS``), else nothing."""
    traced = any(_is_traced(t._partition.offsets) for t in (a, b))
    return f" ({TRACED_EXTENTS})" if traced else ""


def _err(msg: str):
    return StructureError(f"{_OP}(): {msg} for layout torch.multi_jagged")


def _check(query, key, value, attn_mask, is_causal, enable_gqa):
    """The structural checks of NOTE [ Attention over ragged dims ]; returns whether L is ragged."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, MJT):
            raise _err(f"expected {name} to be a multi_jagged tensor like the others, got {type(t).__name__} {describe(t)}")
    qs, ks, vs = query._size, key._size, value._size
    n = len(qs)
    if len(ks) != n or len(vs) != n or n < 3:
        raise _err(f"expected query, key and value of one rank ≥ 3, got {describe(query)}, {describe(key)}, {describe(value)}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if n - 1 in t._ragged_dims:
            raise _err(f"expected the last dim of {name} (the embedding) to be static, got {describe(t)}")
    if qs[-1] != ks[-1]:
        raise _err(f"expected query and key of one embedding size, got {qs[-1]} and {ks[-1]}")
    if not query._partition.batch == key._partition.batch == value._partition.batch:
        # cross attention compares no extent of q with k's: the batch sizes must be checked alone
        raise _err(f"expected query, key and value of one batch size, got {describe(query)}, {describe(key)} and "
                   f"{describe(value)}")
    if key._ragged_dims != value._ragged_dims or not all(
        same_extent(a, b) for a, b in zip(key._partition.extents, value._partition.extents)
    ):
        raise _err(f"expected key and value on the same ragged extents, got {describe(key)} and {describe(value)}"
                   + _traced_hint(key, value))
    if any(ks[d] != vs[d] for d in static_dims(n, key._ragged_dims) if d < n - 1):
        raise _err(f"expected key and value with equal sizes but the last, got {describe(key)} and {describe(value)}")
    ragged_l = n - 2 in query._ragged_dims
    if ragged_l != (n - 2 in key._ragged_dims):
        raise _err(f"expected dim -2 ragged in both query and key or in neither, got {describe(query)} and {describe(key)}")
    qb = query._ragged_dims[:-1] if ragged_l else query._ragged_dims
    kb = key._ragged_dims[:-1] if ragged_l else key._ragged_dims
    if qb != kb or not all(same_extent(a, b) for a, b in zip(query._partition.extents, key._partition.extents[: len(kb)])):
        raise _err(f"expected query and key with the same batch dims (ragged ones on the same extents), got "
                   f"{describe(query)} and {describe(key)}" + _traced_hint(query, key))
    if not ragged_l and not query._partition.same_as(key._partition):
        raise _err(f"expected query and key on the same ragged extents, got {describe(query)} and {describe(key)}"
                   + _traced_hint(query, key))
    for d in static_dims(n, query._ragged_dims):
        if d >= n - 2:
            continue
        hq, hk = qs[d], ks[d]
        if hq == hk:
            continue
        if enable_gqa and d == n - 3 and hk and hq % hk == 0:
            continue
        hint = "" if d != n - 3 else " (enable_gqa=True admits fewer key heads dividing the query heads)"
        raise _err(f"expected query and key with equal batch dims, got sizes {hq} and {hk} at dim {d}{hint}")
    if attn_mask is not None and is_causal:
        raise RuntimeError(f"{_OP}(): Explicit attn_mask should not be set when is_causal=True")
    return ragged_l


def _mask_sizes_as_scores(mask, query, key, ragged_l):
    """``mask`` with each dim that has one size in every sample where the scores have another kind
    of dim made the scores' kind, eagerly (NOTE [ Static sizes equal to a ragged dim ] in
    ops/_routing.py), as elementwise ops take such operands: a pair bias of equal-length samples,
    which inference makes ``(B, j0, n, C)`` (a cropped batch, B = 1), beside scores ragged only along
    the other pair dim; a dense mask of one length beside an equal-length batch."""
    n = len(query._size)
    scores = dict(zip(query._ragged_dims, query._partition.extents))
    if ragged_l:
        scores[n - 1] = key._partition.extents[-1]
    if isinstance(mask, MJT):
        if len(mask._size) != n or mask._partition.batch != query._partition.batch:
            return mask
        for d, e in zip(mask._ragged_dims, mask._partition.extents):
            size = query._size[d] if d < n - 1 else key._size[-2]
            if d not in scores and isinstance(size, int) and _uniform(e, size):
                mask = ragged_as_static(mask, d, size)
                if not isinstance(mask, MJT):
                    break
        if isinstance(mask, MJT):
            for d, e in scores.items():
                if d not in mask._ragged_dims and mask._size[d] != 1 and _uniform(e, mask._size[d]):
                    own = next((f for f in mask._partition.extents if same_extent(f, e)), e)
                    mask = static_as_ragged(mask, d, own)
        if isinstance(mask, MJT):
            return mask
    if mask.dim() > n or (mask.dim() == n and mask.shape[0] not in (1, query._partition.batch)):
        return mask
    shift = n - mask.dim()
    dims = {d: e for d, e in scores.items() if d >= shift and mask.shape[d - shift] != 1}
    if dims and all(_uniform(e, mask.shape[d - shift]) for d, e in dims.items()):
        return dense_as_ragged(mask, query._partition.batch, n, dims)
    return mask


def _float_mask(mask, dtype):
    if mask.dtype == torch.bool:
        # dense SDPA's convention: True takes part in attention
        return torch.zeros_like(mask, dtype=dtype).masked_fill(mask.logical_not(), float("-inf"))
    if mask.dtype != dtype:
        raise RuntimeError(
            f"{_OP}(): Expected attn_mask dtype to be bool or float or to match query dtype, got attn_mask.dtype: "
            f"{mask.dtype} and query.dtype: {dtype}"
        )
    return mask


def _check_mask(mask, query, key, ragged_l):
    """Sizes of an attention mask against the scores ``(B, *batch, L, S)`` (NOTE above)."""
    n = len(query._size)
    scores = (*query._size[:-1], key._size[-2])
    if isinstance(mask, MJT):
        if len(mask._size) != n:
            raise _err(f"expected a multi_jagged attn_mask of rank {n} (the scores {tuple(scores)}), got {describe(mask)}")
        qext = dict(zip(query._ragged_dims, query._partition.extents))
        if ragged_l:
            qext[n - 1] = key._partition.extents[-1]
        for d, e in zip(mask._ragged_dims, mask._partition.extents):
            if d not in qext or not same_extent(e, qext[d]):
                hint = ""
                if d in qext and _is_traced(e.offsets):
                    hint = (". Under torch.compile, tensors built by separate constructor calls have different nested "
                            "ints even for equal lengths: build one from the other (e.g. the pair from the singles), or "
                            "give both one extent with mj.from_packed(values, x.offsets(dim), lengths) before the "
                            "compiled call")
                raise _err(f"expected attn_mask's ragged dims to be those of the scores {tuple(scores)}, got "
                           f"{describe(mask)} (dim {d}){hint}")
        if ragged_l and not {n - 2, n - 1} <= set(mask._ragged_dims):
            raise _err(f"expected attn_mask ragged over both query and key dims of the scores {tuple(scores)}, got "
                       f"{describe(mask)}")
        for d in range(1, n):
            if d in mask._ragged_dims:
                continue
            if mask._size[d] != 1 and (d in qext or mask._size[d] != scores[d]):
                raise _err(f"expected attn_mask {describe(mask)} to broadcast to the scores {tuple(scores)} (dim {d})")
        return
    # a dense mask broadcasts over the ragged dims (size 1 there) and the batch
    shape = (1,) * (n - mask.dim()) + tuple(mask.shape)
    if mask.dim() > n or any(
        s != 1 and (d in query._ragged_dims or (d == n - 1 and ragged_l) or s != scores[d])
        for d, s in enumerate(shape)
        if d > 0
    ) or shape[0] not in (1, scores[0]):
        raise _err(f"expected a dense attn_mask that broadcasts to the scores {tuple(scores)} with size 1 at the "
                   f"ragged dims, got {tuple(mask.shape)}")


def _mask_over_both(mask: MJT, query: MJT, key: MJT) -> MJT:
    """A mask ragged over only the key dim (a key-padding mask ``(B, 1, 1, j0)``) or only the
    query dim, size 1 along the other, broadcast to both as dense broadcasting does: combined
    with a size-1 tensor ragged along the missing dim (``(B, 1, j0, 1)``)."""
    n = len(query._size)
    rd = set(mask._ragged_dims)
    if len(mask._size) != n or not rd or not rd < {n - 2, n - 1}:
        return mask
    missing = ({n - 2, n - 1} - rd).pop()
    if mask._size[missing] != 1:
        return mask  # _check_mask names the mismatch
    src = query if missing == n - 2 else key  # ragged at -2: the queries, or the keys
    one = src[(slice(None),) + (slice(0, 1),) * (n - 3) + (slice(None), slice(0, 1))]  # (B, 1…, j, 1)
    if missing == n - 1:
        one = one.transpose(-1, -2)
    if mask.dtype == torch.bool:
        return mask & torch.ones_like(one, dtype=torch.bool)
    return mask + torch.zeros_like(one, dtype=mask.dtype)


def dense_as_rows(op: str, dense: torch.Tensor, like: MJT, what: str = "query", other: str = "keys"):
    """A dense ``(B, *heads, L, E)`` operand (or a batch of one, shared) beside a multi_jagged
    ``like (B, *heads, j, E)``: the operand as a multi_jagged ``(B, *heads, jL, E)`` of L rows
    per sample (a view where its layout allows), and the function that turns a result of that
    structure back into a dense ``(B, *heads, L, …)`` (NOTE above). ``what`` / ``other`` name
    the two roles in messages: dense queries beside keys, or dense keys beside queries."""
    n = len(like._size)
    if like._ragged_dims != (n - 2,):
        raise StructureError(f"{op}(): a dense {what} {tuple(dense.shape)} goes with {other} whose only ragged dim is "
                             f"dim -2, got {describe(like)} for layout torch.multi_jagged")
    b = like._partition.batch
    if dense.dim() != n or dense.shape[0] not in (1, b):
        raise StructureError(f"{op}(): expected a dense {what} of rank {n} and batch size {b} (or 1) like the {other} "
                             f"{describe(like)}, got {tuple(dense.shape)} for layout torch.multi_jagged")
    dense = dense.expand(b, *dense.shape[1:])
    length = dense.shape[-2]
    rows = dense.movedim(-2, 1).reshape(b * length, *dense.shape[1:-2], dense.shape[-1])
    offsets = torch.arange(b + 1, device=rows.device) * length
    as_rows = constructors.from_packed(rows, offsets, torch.full((b,), length, dtype=torch.int64), (n - 2,))

    def back(out: MJT) -> torch.Tensor:
        v = values_of(out)  # (B·L, *heads, …)
        return v.reshape(b, length, *v.shape[1:]).movedim(1, n - 2)

    return as_rows, back


def _dense_queries(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Dense queries against multi_jagged keys and values: through the ragged-query path, a dense
    ``(B, *heads, L, Ev)`` back."""
    if attn_mask is not None:
        raise _err(f"a dense query {tuple(query.shape)} with attn_mask is not supported (keys {describe(key)})")
    q, back = dense_as_rows(_OP, query, key)
    return back(F.scaled_dot_product_attention(q, key, value, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                               enable_gqa=enable_gqa))


@route(F.scaled_dot_product_attention)
def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                  enable_gqa=False, *, values_path=False):
    """``values_path``: return the checked arguments of ``multijagged::sdpa`` instead of calling
    it (the eager values path calls the handler itself, NOTE [ Eager values path ])."""
    if not any(isinstance(t, MJT) for t in (query, key, value, attn_mask)):
        return NotImplemented
    if not isinstance(query, MJT) and isinstance(key, MJT) and isinstance(value, MJT) and not values_path:
        return _dense_queries(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if isinstance(query, MJT) and not isinstance(key, MJT) and not isinstance(value, MJT) and not values_path:
        # ragged queries over dense keys and values (each sample's tokens reading a fixed memory,
        # Perceiver's decoder): the keys as S rows per sample
        s_len = key.shape[-2]
        key, _ = dense_as_rows(_OP, key, query, "key", "queries")
        value, _ = dense_as_rows(_OP, value, query, "value", "queries")
        if (isinstance(attn_mask, torch.Tensor) and not isinstance(attn_mask, MJT) and attn_mask.dim()
                and attn_mask.shape[-1] == s_len != 1 and attn_mask.dim() <= len(query._size)):
            # a dense mask over the S keys (a padded context's ``(B, 1, 1, S)``): its key dim is
            # the keys' rows, S in every sample
            n = len(query._size)
            attn_mask = dense_as_ragged(attn_mask, query._partition.batch, n, {n - 1: key._partition.extents[-1]})
    query, key, value = _broadcast_batch_dims(query, key, value)
    if all(isinstance(t, MJT) for t in (query, key, value)) and len(query._size) == len(key._size) >= 3:
        # traced operands built apart (torch's transformer tutorial builds q, k and v apart):
        # the keys' batch dims are the queries', the values' every dim the keys' (NOTE [ Traced
        # operands built apart ] in bridge.py); eagerly equal lengths were relabelled already
        n = len(key._size)
        key = assume_unified(query, key, _OP, dims=range(1, n - 2))
        value = assume_unified(key, value, _OP)
        if isinstance(attn_mask, MJT) and len(attn_mask._size) == n:
            # a mask's key dim is the keys' (a key-padding mask built apart), its query dim the
            # queries', its batch dims theirs
            attn_mask = assume_unified(key, attn_mask, _OP, dims=(n - 2,), shift=-1)
            attn_mask = assume_unified(query, attn_mask, _OP, dims=range(1, n - 1))
    if torch.is_autocast_enabled(query.device.type):
        query, key, value, attn_mask = autocast_lower(query, key, value, attn_mask)  # as dense SDPA's autocast
    ragged_l = _check(query, key, value, attn_mask, is_causal, enable_gqa)
    if attn_mask is not None and not torch.compiler.is_compiling():
        attn_mask = _mask_sizes_as_scores(attn_mask, query, key, ragged_l)
    if ragged_l and isinstance(attn_mask, MJT):
        attn_mask = _mask_over_both(attn_mask, query, key)
    mask = None
    if attn_mask is not None:
        _check_mask(attn_mask, query, key, ragged_l)
        mask = _float_mask(attn_mask, query.dtype)
    seed = None
    if dropout_p > 0:
        # drawn from the default generator: torch.manual_seed makes runs reproducible
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    # an empty head dim scores 0 whatever the scale (dense torch's 1/√0 multiplies nothing)
    scale = (1.0 / math.sqrt(query._size[-1]) if query._size[-1] else 1.0) if scale is None else float(scale)
    args = (query, key, value, mask, seed, bool(is_causal), scale, float(dropout_p))
    if values_path:
        return args
    if not (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or _needs_grad(*args[:4])):
        return sdpa_default(mj.sdpa.default, *args, need_lse=False)[0]
    return _call(mj.sdpa.default, *args)[0]


# ----------------------------------------------------------------------------- handlers
def _broadcast_batch_dims(query, key, value):
    """A static dim before the last two of size 1 in some operands and ``H`` in others (one key
    head shared by every query head, timm's MobileNetV4 multi-query attention) expanded to ``H``,
    as dense SDPA broadcasts its batch dims."""
    ts = (query, key, value)
    if not all(isinstance(t, MJT) for t in ts) or not query.dim() == key.dim() == value.dim():
        return ts
    n = query.dim()
    sizes = list(query._size)
    grow = False
    for d in range(1, n - 2):
        if any(d in t._ragged_dims for t in ts):
            continue
        got = {t._size[d] for t in ts}
        if len(got) == 2 and 1 in got:
            sizes[d] = max(got)
            grow = True
    if not grow:
        return ts
    return tuple(t.expand([t._size[d] if d in t._ragged_dims or d >= n - 2 else sizes[d] for d in range(n)]) for t in ts)


def _traced(t: torch.Tensor) -> bool:
    return torch.compiler.is_compiling() or _is_traced(t)


def _heads(x: MJT) -> tuple[int, ...]:
    """Sizes of the static batch dims (the heads), in storage order."""
    n = len(x._size)
    return tuple(x._size[d] for d in static_dims(n, x._ragged_dims) if d < n - 1)


def _flat(x: MJT) -> torch.Tensor:
    """``(T, H, D)``: the values with the static batch dims flattened into one head dim."""
    v = x._values
    h = 1
    for s in v.shape[1:-1]:
        h *= s
    return v.reshape(v.shape[0], h, v.shape[-1])


def _bias(mask, q: MJT, k: MJT, cu_q, cu_k, seg_sample):
    """``(bias (Tb, Hb), bias_start (N,), restore)`` for a float mask (dense or multi_jagged):
    ``restore(dbias)`` maps a gradient in that layout back to the mask's own shape."""
    n = len(q._size)
    qh = _heads(q)
    hq = math.prod(qh)
    qstat = [d for d in static_dims(n, q._ragged_dims) if d < n - 1]
    if isinstance(mask, MJT):
        mv = mask._values
        mstat = static_dims(n, mask._ragged_dims)
        # mask static dims: q's head dims keep their size (1 or q's); dims ragged in q drop (size 1)
        sel = [i + 1 for i, d in enumerate(mstat) if d in qstat]
        hv = mv.reshape(mv.shape[0], *[mv.shape[i] for i in sel])  # the dropped dims have size 1
        ones = all(s == 1 for s in hv.shape[1:])
        if ones:
            bias = hv.reshape(mv.shape[0], 1)
        else:
            bias = hv.expand(mv.shape[0], *qh).reshape(mv.shape[0], hq)
        start = _block_starts(mask, q, cu_q, cu_k, seg_sample)
        mshape, hshape = mv.shape, hv.shape

        def restore(db):
            db = db.reshape(db.shape[0], *((1,) * len(qh) if ones else qh)).sum_to_size(hshape)
            return wrap(db.reshape(mshape), mask._partition, mask._ragged_dims)

        return bias, start, restore
    # dense: one value per (sample, head); materialised over each sample's score block
    shape = (1,) * (n - mask.dim()) + tuple(mask.shape)
    m = mask.reshape(shape)
    per = m.reshape(shape[0], *[shape[d] for d in qstat]).expand(q._partition.batch, *[shape[d] for d in qstat])
    ones = all(shape[d] == 1 for d in qstat)
    per = per.reshape(per.shape[0], 1) if ones else per.expand(per.shape[0], *qh).reshape(per.shape[0], hq)
    # one block per segment, in segment order (the score layout)
    rows = kattn.score_offsets(cu_q, cu_k)
    row_seg = torch.searchsorted(rows, torch.arange(_score_rows(q, k, rows), device=rows.device), right=True) - 1
    bias = per[seg_sample[row_seg]]
    mask_shape = tuple(mask.shape)
    bsz = per.shape[0]

    def restore(db):
        per_grad = torch.zeros(bsz, db.shape[1], dtype=db.dtype, device=db.device).index_add_(0, seg_sample[row_seg], db)
        g = per_grad.reshape(bsz, *((1,) * len(qh) if ones else qh))
        full = g.reshape(bsz, *[qh[qstat.index(d)] if (d in qstat and not ones) else 1 for d in range(1, n)])
        return full.sum_to_size(shape).reshape(mask_shape)

    return bias, rows[:-1], restore


def _dense_mask_rows(mask: torch.Tensor, q: MJT) -> torch.Tensor:
    """A dense mask (size 1 at ``q``'s ragged dims, checked) laid out as ``q``'s values: the
    rows dim first (1, or each row's sample's slice of a mask with a batch dim), then the static
    dims, so that it broadcasts against the values whatever its rank."""
    n = len(q._size)
    m = mask.reshape((1,) * (n - mask.dim()) + tuple(mask.shape))
    m = m.squeeze(tuple(q._ragged_dims))  # (B or 1, static dims)
    if m.shape[0] != 1:
        m = m.index_select(0, q._partition.row_sample())
    return m


def _dense_mask_grad(dm: torch.Tensor, mask: torch.Tensor, q: MJT) -> torch.Tensor:
    """The gradient ``dm`` of ``_dense_mask_rows(mask, q)`` as a gradient of ``mask``."""
    n = len(q._size)
    shape = (1,) * (n - mask.dim()) + tuple(mask.shape)
    if dm.shape[0] != 1 or shape[0] != 1:  # rows → their samples
        dm = dm.new_zeros(q._partition.batch, *dm.shape[1:]).index_add_(0, q._partition.row_sample(), dm)
    for d in sorted(q._ragged_dims):
        dm = dm.unsqueeze(d)
    return dm.sum_to_size(shape).reshape(mask.shape)


def _score_rows(q: MJT, k: MJT, rows) -> int:
    # SYNC: the number of score entries sizes a dense mask's bias (dense masks only)
    return int(rows[-1])


def _block_starts(mask: MJT, q: MJT, cu_q, cu_k, seg_sample):
    """For every segment of q, the first row of its score block in ``mask``'s values; cached on
    the mask's partition for these segments, so that a batch's layers (and each call's backward)
    pass the very same tensor and the kernels' per-bias maps keyed by it are built once."""
    if _traced(cu_q):
        return _compute_block_starts(mask, q, cu_q, cu_k, seg_sample)
    key = ("block_starts", q._ragged_dims, mask._ragged_dims)
    cache = mask._partition.cache
    hit = cache.get(key)
    if hit is not None and hit[0] is cu_q and hit[1] is cu_k:
        return hit[2]
    with building():
        start = _compute_block_starts(mask, q, cu_q, cu_k, seg_sample)
    cache[key] = (cu_q, cu_k, start)  # one entry per key: the latest segments
    return start


def _compute_block_starts(mask: MJT, q: MJT, cu_q, cu_k, seg_sample):
    lq, lk = cu_q.diff(), cu_k.diff()
    qb = q._ragged_dims[:-1]
    kept = tuple(i for i, d in enumerate(qb) if d in mask._ragged_dims)
    if len(kept) == len(qb):
        # the mask has every batch ragged dim: its rows are the score layout itself
        return kattn.score_offsets(cu_q, cu_k)[:-1]
    if not kept:
        return mask._partition.offsets[seg_sample]
    # a mask over some of the batch ragged dims: map each segment (a row of q's batch sub-partition)
    # to the row of the mask's batch sub-partition, whose block has Lq_i·Lk_i rows
    p = q._partition
    idx, msub = partition_for(p.extents[:-1]).map_to_sub(tuple(kept))
    local = idx - msub.offsets[seg_sample]
    return mask._partition.offsets[seg_sample] + local * lq * lk


@register_multi_jagged_func(mj.sdpa.default, "q: mjt, k: mjt, v: mjt, mask: any?, seed: any?, causal: any, scale: any, dropout_p: any")
def sdpa_default(func, q, k, v, mask=None, seed=None, causal=False, scale=1.0, dropout_p=0.0, *, need_lse=True,
                 differentiable=False):
    """``need_lse=False``: the route's direct call when no backward will run (the row
    log-sum-exp is then left unwritten). ``differentiable``: called above autograd by the eager
    values path, so the packed kernel runs under ``multijagged::varlen_attention``'s autograd
    formula (``varlen_attention_eager``: the op's formula without the dispatcher)."""
    n = len(q._size)
    if n - 2 not in q._ragged_dims:
        mv = None if mask is None else (mask._values if isinstance(mask, MJT) else _dense_mask_rows(mask, q))
        out, lse = cattn.sdpa_dense(q._values, k._values, v._values, mv, seed, causal, scale, dropout_p)
        return wrap(out, q._partition, q._ragged_dims), lse
    cu_q, seg_sample = segments(q)
    cu_k, _ = segments(k)
    bias = start = None
    if mask is not None:
        bias, start, _ = _bias(mask, q, k, cu_q, cu_k, seg_sample)
    qv = _flat(q)
    kv = qv if k is q else _flat(k)
    vv = kv if v is k else _flat(v)
    args = (qv, kv, vv, cu_q, cu_k, q._partition.extents[-1].max, k._partition.extents[-1].max, bias, start, seed,
            causal, scale, dropout_p)
    if _traced(qv):
        out, lse = mj.varlen_attention(*args)
    elif differentiable and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qv, kv, vv, bias)):
        out, lse = cattn.varlen_attention_eager(*args, need_lse=need_lse)  # the op's formula, no dispatcher
    else:
        # Below autograd already (this is the handler of multijagged::sdpa, whose formula calls
        # the backward op), or above it with no gradient to record (the values path under
        # no_grad or on tensors that need none): call the kernel without a trip through the
        # dispatcher, and skip the row log-sum-exp when no backward will read it.
        out, lse = cattn.varlen_attention_impl(*args, need_lse=need_lse)
    out = out.reshape(out.shape[0], *q._values.shape[1:-1], out.shape[-1])
    return wrap(out, q._partition, q._ragged_dims), lse


@register_multi_jagged_func(
    mj.sdpa_backward.default,
    "grad: mjt, q: mjt, k: mjt, v: mjt, mask: any?, seed: any?, out: mjt, lse: t, causal: any, scale: any, "
    "dropout_p: any, mask_grad: any",
)
def sdpa_backward_default(func, grad, q, k, v, mask, seed, out, lse, causal, scale, dropout_p, mask_grad):
    n = len(q._size)
    empty = q._values.new_empty(0)
    if n - 2 not in q._ragged_dims:
        mv = None if mask is None else (mask._values if isinstance(mask, MJT) else _dense_mask_rows(mask, q))
        dq, dk, dv, dm = cattn.sdpa_backward_dense(grad._values, q._values, k._values, v._values, mv, seed,
                                                   out._values, lse, causal, scale, dropout_p, mask_grad)
        if mask_grad and isinstance(mask, MJT):
            dm = wrap(dm, mask._partition, mask._ragged_dims)
        elif mask_grad and mask is not None:
            dm = _dense_mask_grad(dm.sum_to_size(mv.shape), mask, q)
        return (wrap(dq, q._partition, q._ragged_dims), wrap(dk, k._partition, k._ragged_dims),
                wrap(dv, v._partition, v._ragged_dims), dm if mask_grad else empty)
    cu_q, seg_sample = segments(q)
    cu_k, _ = segments(k)
    bias = start = restore = None
    if mask is not None:
        bias, start, restore = _bias(mask, q, k, cu_q, cu_k, seg_sample)
    op = mj.varlen_attention_backward if _traced(q._values) else cattn.varlen_attention_backward_impl
    dq, dk, dv, db = op(
        _flat(grad), _flat(q), _flat(k), _flat(v), _flat(out), lse, cu_q, cu_k, q._partition.extents[-1].max,
        k._partition.extents[-1].max, bias, start, seed, causal, scale, dropout_p, bool(mask_grad and mask is not None),
    )
    dm = restore(db) if mask_grad and mask is not None else empty
    return (wrap(dq.reshape(q._values.shape), q._partition, q._ragged_dims),
            wrap(dk.reshape(k._values.shape), k._partition, k._ragged_dims),
            wrap(dv.reshape(v._values.shape), v._partition, v._ragged_dims), dm)
