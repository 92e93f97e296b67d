"""The ``bucketed`` and ``loop`` CPU paths of varlen attention (NOTE [ Varlen attention contract ],
``kernels/attention.py``, which re-exports them): segments padded within buckets of similar
length, one dense call per bucket (``buckets="loop"``: one per segment, on views; ``attention_loop``
in ``attention.py`` asks for it)."""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .attention_common import (
    NEG_INF, _compute_dtype, _dense_backward, _dense_forward, _expand_heads, _grad_buffers, _host_lengths,
    _reduce_heads, _scale, score_offsets, segment_softmax_into,
)
from .reference import _is_traced, building

__all__ = ["attention_bucketed", "attention_bucketed_backward", "bucket_plan"]


# ----------------------------------------------------------------------------- gathers
class _Bucket:
    """Index maps of a group of segments padded to ``(Lm, Sm)``.

    Gathers use ``index_select`` on flat row lists (much cheaper than advanced indexing on the
    CPU); padded positions read row 0 and are then zeroed in place for keys and values (a
    non-finite value in another sample must not reach this one through ``0 · inf``). Padded
    query rows are computed and dropped; in the backward they are zeroed and given ``lse = +inf``,
    so that their probabilities are exactly 0: with row 0's ``lse`` (another segment's) they could
    overflow to ``inf``, and ``inf · 0`` (their zero output gradient) put NaN into the keys' and
    values' gradients (``attention_bucketed_backward``)."""

    __slots__ = ("segs", "qvalid", "kvalid", "lm", "sm", "lq", "lk", "qflat", "kflat", "qsel", "qdst",
                 "ksel", "kdst", "kpad", "qpad", "single", "padmask", "qscratch", "cu", "blocks", "gathers")

    def __init__(self, segs, cu_q, cu_k, lq, lk, lm, sm, single=None):
        self.segs, self.lm, self.sm, self.lq, self.lk = segs, lm, sm, lq, lk
        self.padmask = None  # the key-padding mask, made on first use
        self.qscratch = None  # query rows with padded positions sent to a scratch row
        self.blocks = None  # (bias_start, first, inverse): the distinct bias blocks (``bias_blocks``)
        self.gathers = None  # (bias_start, …): the bias gather's index maps (``bias_gather``)
        # one segment (``single`` = its first q and k rows): its rows are slices of the packed
        # buffers (views, no gather); the index maps are built only if a bias needs them
        self.single = single
        self.cu = (cu_q, cu_k)
        self.qvalid = None
        if single is None:
            self._maps()

    def _maps(self):
        if self.qvalid is not None:
            return
        with building():  # kept for the batch's later calls (NOTE [ Derived maps ] in structure.py)
            self._build_maps()

    def _build_maps(self):
        cu_q, cu_k = self.cu
        dev = cu_q.device
        a = torch.arange(self.lm, device=dev)
        b = torch.arange(self.sm, device=dev)
        self.qvalid = a < self.lq[:, None]
        self.kvalid = b < self.lk[:, None]
        qrow = torch.where(self.qvalid, cu_q[self.segs][:, None] + a, 0)
        krow = torch.where(self.kvalid, cu_k[self.segs][:, None] + b, 0)
        self.qflat, self.kflat = qrow.reshape(-1), krow.reshape(-1)
        self.qsel = self.qvalid.reshape(-1).nonzero().flatten()
        self.ksel = self.kvalid.reshape(-1).nonzero().flatten()
        self.qdst, self.kdst = self.qflat[self.qsel], self.kflat[self.ksel]
        self.kpad = (~self.kvalid).reshape(-1).nonzero().flatten()
        self.qpad = (~self.qvalid).reshape(-1).nonzero().flatten()

    def gather_q(self, x, zero: bool = False, fill=None):
        """``x (Tq, H, D)`` → ``(n, H, Lm, D)``; ``zero``: zeros at padded queries (the output
        gradient, so that padded rows add nothing to dk and dv); ``fill``: that value there instead."""
        if self.single is not None:
            return x[self.single[0]: self.single[0] + self.lm].transpose(0, 1).unsqueeze(0)
        n = self.qvalid.shape[0]
        g = x.index_select(0, self.qflat)
        if (zero or fill is not None) and self.qpad.numel():
            g.index_fill_(0, self.qpad, 0 if fill is None else fill)
        return g.view(n, self.lm, *x.shape[1:]).transpose(1, 2)

    def gather_k(self, x):
        """``x (Tk, H, D)`` → ``(n, H, Sm, D)``, zeros at padded keys."""
        if self.single is not None:
            return x[self.single[1]: self.single[1] + self.sm].transpose(0, 1).unsqueeze(0)
        n = self.kvalid.shape[0]
        g = x.index_select(0, self.kflat)
        if self.kpad.numel():
            g.index_fill_(0, self.kpad, 0)
        return g.view(n, self.sm, *x.shape[1:]).transpose(1, 2)

    def _rows(self, g, sel):
        """``g (n, H, L, D)`` → its valid rows ``(nv, H, D)`` in bucket order."""
        g = g.transpose(1, 2)
        flat = g.reshape(g.shape[0] * g.shape[1], *g.shape[2:])
        return flat if sel.shape[0] == flat.shape[0] else flat.index_select(0, sel)

    def scatter_q(self, out, g):
        """Write query-shaped ``g (n, H, Lm, D)`` to the rows of ``out``, which has one scratch row
        at the end for the padded positions (one copy instead of a select and a copy)."""
        if self.single is not None:
            out[self.single[0]: self.single[0] + self.lm] = g[0].transpose(0, 1)
            return
        if self.qscratch is None:
            with building():
                self.qscratch = torch.where(self.qvalid.reshape(-1), self.qflat, out.shape[0] - 1)
        g = g.transpose(1, 2)
        rows = g.reshape(g.shape[0] * g.shape[1], *g.shape[2:])
        out.index_copy_(0, self.qscratch, rows if rows.dtype == out.dtype else rows.to(out.dtype))

    def add_q(self, out, g):
        if self.single is not None:
            out[self.single[0]: self.single[0] + self.lm] += g[0].transpose(0, 1).to(out.dtype)
            return
        out.index_add_(0, self.qdst, self._rows(g, self.qsel).to(out.dtype))

    def add_k(self, out, g):
        if self.single is not None:
            out[self.single[1]: self.single[1] + self.sm] += g[0].transpose(0, 1).to(out.dtype)
            return
        out.index_add_(0, self.kdst, self._rows(g, self.ksel).to(out.dtype))

    def bias_index(self, bias_start):
        """``(n, Lm, Sm)`` bias rows and the mask of real (query, key) pairs."""
        self._maps()
        pair = self.qvalid[:, :, None] & self.kvalid[:, None, :]
        a = torch.arange(self.lm, device=pair.device)[None, :, None]
        b = torch.arange(self.sm, device=pair.device)[None, None, :]
        idx = bias_start[self.segs][:, None, None] + a * self.lk[:, None, None] + b
        return torch.where(pair, idx, 0), pair

    def bias(self, bias, bias_start, dtype):
        """The additive mask ``(n, Hb, Lm, Sm)`` in ``dtype``: the user's bias at real pairs, -inf at
        padded keys. None when there is neither a bias nor padding."""
        if bias is None:
            if self.single is not None:
                return None  # no padding
            if self.padmask is None:
                if not self.kpad.numel():
                    return None
                with building():
                    m = torch.zeros(self.kvalid.shape, dtype=dtype, device=self.kvalid.device)
                    self.padmask = m.masked_fill(~self.kvalid, NEG_INF)[:, None, None, :]
            return self.padmask.to(dtype)
        _, inverse = self.bias_blocks(bias_start)
        flat, kpad, shape, shared, _, _ = self.bias_gather(bias_start)
        # gathered as (blocks, Lm, Sm, H) and masked there, contiguously; the kernels read the
        # (blocks, H, Lm, Sm) view with its strides
        g = bias.index_select(0, flat).view(*shape, bias.shape[1])
        if kpad is not None:
            g.masked_fill_(kpad, NEG_INF)
        g = g.to(dtype).permute(0, 3, 1, 2)
        return g.index_select(0, inverse) if shared else g

    def bias_gather(self, bias_start):
        """``(flat, kpad, shape, shared, dst, pos)``: the flat bias rows of each distinct block's
        ``(Lm, Sm)`` scores, the ``(blocks, 1, Sm, 1)`` mask of padded keys (None without padding),
        the blocks' ``(n, Lm, Sm)``, whether segments share blocks, and for the gradient's scatter
        the bias rows of the real (query, key) pairs and their flat positions in the blocks
        (``pos`` None: every position is real); cached per ``bias_start`` (a batch's layers and
        each call's backward share it)."""
        if self.gathers is None or self.gathers[0] is not bias_start:
            first, inverse = self.bias_blocks(bias_start)
            with building():
                idx, pair = self.bias_index(bias_start)
                shared = first.shape[0] != inverse.shape[0]
                idx = idx.index_select(0, first) if shared else idx
                pair = pair.index_select(0, first) if shared else pair
                kvalid = self.kvalid.index_select(0, first) if shared else self.kvalid
                kpad = None if bool(kvalid.all()) else ~kvalid[:, None, :, None]
                flat_pair = pair.reshape(-1)
                pos = None if bool(flat_pair.all()) else flat_pair.nonzero().flatten()
                dst = idx.reshape(-1) if pos is None else idx.reshape(-1).index_select(0, pos)
            self.gathers = (bias_start, idx.reshape(-1), kpad, tuple(idx.shape), shared, dst, pos)
        return self.gathers[1:]

    def bias_blocks(self, bias_start):
        """``(first, inverse)``: a bias shared by several segments (the rows of a pair attending
        along their columns all read their sample's block) is gathered once per distinct block —
        ``first`` a segment of each, ``inverse`` every segment's block — and its gradient summed
        per block before the scatter, instead of gathered and scattered element by element for
        every segment (measured: most of triangle attention's CPU backward)."""
        if self.blocks is None or self.blocks[0] is not bias_start:
            # SYNC: CPU path (this backend's device); one unique per bucket
            # a block is its start and the segment's (Lq, Lk): the rows it covers
            with building():
                starts = torch.stack([bias_start.index_select(0, self.segs), self.lq, self.lk], 1)
                uniq, inverse = torch.unique(starts, dim=0, return_inverse=True)
                first = torch.zeros(uniq.shape[0], dtype=torch.int64, device=starts.device).scatter_(
                    0, inverse, torch.arange(starts.shape[0], device=starts.device)
                )
            self.blocks = (bias_start, first, inverse)
        return self.blocks[1], self.blocks[2]

    def keep(self, keep, cs):
        idx, pair = self.bias_index(cs)  # same layout, offsets cs
        g = keep[idx.reshape(-1)].reshape(*idx.shape, keep.shape[1]).permute(0, 3, 1, 2)
        return g & pair[:, None]


# ----------------------------------------------------------------------------- bucket plan
def bucket_plan(lq: torch.Tensor, lk: torch.Tensor, slack: float = 0.15, floor: int = 4096) -> list[torch.Tensor]:
    """Group segments (host lengths) into buckets padded to their largest member.

    Segments are sorted by (Lk, Lq) descending and added to the current bucket while the padded
    area ``n · Lm · Sm`` stays within ``(1 + slack) · Σ Lq·Lk + floor`` (``floor``: score entries
    a bucket may waste to save a call). Segments with no query or no key are left out (their
    rows are zero). Returns one index tensor of segments per bucket."""
    live = ((lq > 0) & (lk > 0)).nonzero().flatten()
    if live.numel() == 0:
        return []
    key = lk[live] * (int(lq.max()) + 1) + lq[live]
    order = live[torch.argsort(key, descending=True, stable=True)]
    lq_l, lk_l = lq[order].tolist(), lk[order].tolist()
    buckets, start = [], 0
    lm, sm, area = lq_l[0], lk_l[0], 0
    for i, (a, b) in enumerate(zip(lq_l, lk_l)):
        nlm, nsm = max(lm, a), max(sm, b)
        narea = area + a * b
        if i > start and (i - start + 1) * nlm * nsm > (1.0 + slack) * narea + floor:
            buckets.append(order[start:i])
            start, lm, sm, area = i, a, b, a * b
        else:
            lm, sm, area = nlm, nsm, narea
    buckets.append(order[start:])
    return buckets


# Bucket index maps by the identity of (cu_q, cu_k): a model's layers share one batch's segment
# offsets (cached on its partition), so the plan and its gathers' index lists are built once per
# batch, not once per layer and direction.
_BUCKET_CACHE = WeakIdKeyDictionary()


def _buckets(cu_q, cu_k, buckets, slack, floor) -> tuple[list["_Bucket"], bool]:
    """The buckets' index maps, and whether they cover every query row (no segment with
    queries but no keys, whose rows must be zeros). ``buckets``: None (``bucket_plan``),
    ``"loop"`` (one per segment) or an explicit list (not cached)."""
    key = (id(cu_k), slack, floor, buckets) if buckets is None or buckets == "loop" else None
    per = None
    if key is not None and not _is_traced(cu_q):
        per = _BUCKET_CACHE.setdefault(cu_q, {})
        hit = per.get(key)
        if hit is not None and hit[0] is cu_k:
            return hit[1]
    with building():
        result = _build_buckets(cu_q, cu_k, buckets, slack, floor)
    if per is not None:
        per[key] = (cu_k, result)
    return result


def _build_buckets(cu_q, cu_k, buckets, slack, floor) -> tuple[list["_Bucket"], bool]:
    lq_h, lk_h = _host_lengths(cu_q), _host_lengths(cu_k)
    lq_d, lk_d = cu_q.diff(), cu_k.diff()
    out = []
    if buckets == "loop":
        live = ((lq_h > 0) & (lk_h > 0)).nonzero().flatten().tolist()
        cq, ck = cu_q.cpu().tolist(), cu_k.cpu().tolist()
        for i in live:
            segs = torch.tensor([i], device=cu_q.device)
            out.append(_Bucket(segs, cu_q, cu_k, lq_d[segs], lk_d[segs], int(lq_h[i]), int(lk_h[i]), (cq[i], ck[i])))
        covered = int(lq_h[live].sum()) if live else 0
    else:
        if buckets is None:
            buckets = bucket_plan(lq_h, lk_h, slack, floor)
        covered = 0
        for segs in buckets:
            host = segs.cpu()
            covered += int(lq_h[host].sum())
            segs = segs.to(cu_q.device)
            single = (int(cu_q[segs[0]]), int(cu_k[segs[0]])) if segs.shape[0] == 1 else None
            out.append(_Bucket(segs, cu_q, cu_k, lq_d[segs], lk_d[segs], int(lq_h[host].max()), int(lk_h[host].max()),
                               single))
    return out, covered == int(lq_h.sum())


# ----------------------------------------------------------------------------- entry points
def attention_bucketed(q, k, v, cu_q, cu_k, bias=None, bias_start=None, keep=None, causal=False,
                       scale=None, dropout_p=0.0, *, buckets=None, slack=0.15, floor=4096, need_lse=True,
                       fused=True):
    """Forward by length buckets (NOTE [ Varlen attention contract ]); ``buckets`` overrides the plan.
    ``need_lse=False`` (no backward will run) leaves ``lse`` uninitialised; ``fused=False`` uses
    the padded math formula instead of torch's fused CPU kernel (the oracle's path)."""
    scale = _scale(q, scale)
    hq = q.shape[1]
    plan, covered = _buckets(cu_q, cu_k, buckets, slack, floor)
    t = q.shape[0]
    # one scratch row at the end takes the buckets' padded positions (``scatter_q``); rows that no
    # bucket writes (queries of segments without keys) must be zeros
    out = (q.new_empty if covered else q.new_zeros)(t + 1, hq, v.shape[-1])
    lse_dtype = _compute_dtype(q.dtype)
    if need_lse:
        lse = torch.empty((t + 1, hq), dtype=lse_dtype, device=q.device)
        if not covered:
            lse.fill_(NEG_INF)
    else:
        lse = torch.empty((t + 1, hq), dtype=lse_dtype, device=q.device)
    cs = score_offsets(cu_q, cu_k) if keep is not None else None
    # no backward will read lse: a segment of its own goes straight from the packed rows into its
    # output rows where the unfused product takes it (NOTE [ Short segments without the row
    # log-sum-exp ] in attention_common.py)
    lean = not need_lse and fused and keep is None and bias is None and k.shape[1] == hq and v.shape[1] == hq
    for bk in plan:
        if lean and bk.single is not None:
            a, ka = bk.single
            if segment_softmax_into(out[a:a + bk.lm], q[a:a + bk.lm], k[ka:ka + bk.sm], v[ka:ka + bk.sm], causal,
                                    scale):
                continue
        qb = bk.gather_q(q)
        kb = bk.gather_k(k)
        vb = kb if v is k else bk.gather_k(v)
        kb, vb = _expand_heads(kb, hq), _expand_heads(vb, hq)
        bias_b = bk.bias(bias, bias_start, q.dtype)
        keep_b = bk.keep(keep, cs) if keep is not None else None
        ob, lb = _dense_forward(qb, kb, vb, bias_b, keep_b, causal, scale, dropout_p, fused, need_lse)
        bk.scatter_q(out, ob)
        if need_lse:
            bk.scatter_q(lse.unsqueeze(-1), lb.unsqueeze(-1))
    return out[:t], lse[:t]


def attention_bucketed_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias=None, bias_start=None, keep=None,
                                causal=False, scale=None, dropout_p=0.0, need_dbias=False, *, buckets=None,
                                slack=0.15, floor=4096, fused=True):
    scale = _scale(q, scale)
    hq, hk = q.shape[1], k.shape[1]
    dq, dk, dv, dbias = _grad_buffers(q, k, v, bias, need_dbias)
    cs = score_offsets(cu_q, cu_k) if keep is not None else None
    for bk in _buckets(cu_q, cu_k, buckets, slack, floor)[0]:
        # padded query rows: zero q, out and grad, lse +inf (probabilities exactly 0; see _Bucket)
        qb = bk.gather_q(q, zero=True)
        kb = bk.gather_k(k)
        vb = kb if v is k else bk.gather_k(v)
        kb, vb = _expand_heads(kb, hq), _expand_heads(vb, hq)
        gb = bk.gather_q(grad, zero=True)
        ob = bk.gather_q(out, zero=True)
        lb = bk.gather_q(lse.unsqueeze(-1), fill=float("inf")).squeeze(-1)
        bias_b = bk.bias(bias, bias_start, q.dtype)
        keep_b = bk.keep(keep, cs) if keep is not None else None
        gq, gk, gv, ds = _dense_backward(gb, qb, kb, vb, ob, lb, bias_b, keep_b, causal, scale, dropout_p, need_dbias,
                                         fused)
        bk.add_q(dq, gq)
        bk.add_k(dk, _reduce_heads(gk, hk))
        bk.add_k(dv, _reduce_heads(gv, hk))
        if need_dbias:
            first, inverse = bk.bias_blocks(bias_start)
            *_, shared, dst, pos = bk.bias_gather(bias_start)
            if shared:  # segments sharing a block: sum per block first
                # as a product with the (blocks × segments) one-hot: a GEMM, not a scatter
                onehot = torch.nn.functional.one_hot(inverse, first.shape[0]).t().to(ds.dtype)
                ds = (onehot @ ds.reshape(ds.shape[0], -1)).view(first.shape[0], *ds.shape[1:])
            ds = ds.permute(0, 2, 3, 1)  # (blocks, Lm, Sm, Hq)
            if bias.shape[1] == 1:
                ds = ds.sum(-1, keepdim=True)
            ds = ds.reshape(-1, ds.shape[-1])
            dbias.index_add_(0, dst, ds if pos is None else ds.index_select(0, pos))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None if dbias is None else dbias.to(bias.dtype)
