"""``multijagged::sdpa`` and its backward: scaled dot-product attention as one op.

``F.scaled_dot_product_attention`` is routed here (``ops/attention/sdpa.py``) with its arguments
checked and normalised: ``mask`` is None or an additive float tensor of q's dtype, ``seed`` is
None or a one-element int64 tensor that fixes the dropout keep mask (so the op is a function of
its inputs: the backward regenerates the same mask, and compiled graphs stay functional). The
dense kernel below defines the op for plain tensors (``(…, L, D)``, heads at dim -3 for
``enable_gqa``); for multi_jagged tensors the handler in ``ops/attention/sdpa.py`` runs one of the
backends of NOTE [ Varlen attention contract ] (``kernels/attention.py``).

``lse`` (the row log-sum-exp, saved for the backward) is not differentiable. The backward op has
no derivative of its own: like dense SDPA's fused kernels, a double backward through attention
raises rather than returning a number nobody checked (NOTE [ Double backward ] in library.py).
"""

from __future__ import annotations

import math

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..kernels import attention as kattn
from . import kernel_choice
from .library import LIB, _no_zero_fill

__all__ = ["dense_keep", "sdpa_dense", "sdpa_backward_dense"]

LIB.define(
    "sdpa(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? seed, bool causal, float scale, float dropout_p)"
    " -> (Tensor, Tensor)"
)
LIB.define(
    "sdpa_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? seed, Tensor out, Tensor lse,"
    " bool causal, float scale, float dropout_p, bool mask_grad) -> (Tensor, Tensor, Tensor, Tensor)"
)


def dense_keep(seed, shape, dropout_p: float, device) -> torch.Tensor:
    """The dropout keep mask drawn from ``seed`` (a one-element int64 tensor): the same mask for
    the same seed on every call, forward and backward."""
    # SYNC: one host read of the seed, inside the op (the op is opaque to tracing).
    gen = torch.Generator(device=device).manual_seed(int(seed.reshape(-1)[0]))
    return torch.rand(shape, generator=gen, device=device) >= dropout_p


def _as4d(q, k, v, mask, keep):
    """``(…, L, D)`` tensors as ``(N, H, L, D)`` with H the dim -3 (GQA heads), N the rest."""
    def flat(t):
        if t.dim() == 3:
            return t.unsqueeze(0)
        return t.flatten(0, -4)  # (not reshape(-1, …): ambiguous for 0 elements)

    lead = q.shape[:-3] if q.dim() > 3 else ()
    ms = None if mask is None else flat(mask.expand(*q.shape[:-1], k.shape[-2]))
    return flat(q), flat(k), flat(v), ms, None if keep is None else flat(keep), lead


def sdpa_dense(q, k, v, mask=None, seed=None, causal=False, scale=1.0, dropout_p=0.0):
    keep = None
    if seed is not None and dropout_p > 0:
        keep = dense_keep(seed, (*q.shape[:-1], k.shape[-2]), dropout_p, q.device)
    hq = q.shape[-3] if q.dim() >= 3 else 1
    q4, k4, v4, m4, keep4, lead = _as4d(q, k, v, mask, keep)
    k4, v4 = kattn._expand_heads(k4, hq), kattn._expand_heads(v4, hq)
    out, lse = kattn._math_forward(q4, k4, v4, m4, keep4, causal, scale, dropout_p)
    return out.reshape(*q.shape[:-1], v.shape[-1]), lse.reshape(q.shape[:-1])


def sdpa_backward_dense(grad, q, k, v, mask, seed, out, lse, causal, scale, dropout_p, mask_grad):
    keep = None
    if seed is not None and dropout_p > 0:
        keep = dense_keep(seed, (*q.shape[:-1], k.shape[-2]), dropout_p, q.device)
    hq, hk = q.shape[-3], k.shape[-3]
    q4, k4, v4, m4, keep4, _ = _as4d(q, k, v, mask, keep)
    g4, _, o4, _, _, _ = _as4d(grad, k, out, None, None)
    lse4 = lse.reshape(-1, *lse.shape[-2:]) if lse.dim() >= 2 else lse.reshape(1, 1, -1)
    k4e, v4e = kattn._expand_heads(k4, hq), kattn._expand_heads(v4, hq)
    dq, dk, dv, ds = kattn._math_backward(g4, q4, k4e, v4e, o4, lse4, m4, keep4, causal, scale, dropout_p)
    dk, dv = kattn._reduce_heads(dk, hk), kattn._reduce_heads(dv, hk)
    dmask = q.new_empty(0)
    if mask_grad and mask is not None:
        full = ds.reshape(*q.shape[:-1], k.shape[-2]).to(mask.dtype)
        dmask = full.sum_to_size(mask.shape)
    return dq.reshape(q.shape).to(q.dtype), dk.reshape(k.shape).to(k.dtype), dv.reshape(v.shape).to(v.dtype), dmask


def _sdpa_fake(q, k, v, mask=None, seed=None, causal=False, scale=1.0, dropout_p=0.0):
    lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=lse_dtype)


def _sdpa_backward_fake(grad, q, k, v, mask, seed, out, lse, causal, scale, dropout_p, mask_grad):
    dmask = torch.empty_like(mask) if mask_grad and mask is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dmask


LIB.impl("sdpa", sdpa_dense, "CompositeExplicitAutograd")
LIB.impl("sdpa_backward", sdpa_backward_dense, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::sdpa", _sdpa_fake, lib=LIB)
torch.library.register_fake("multijagged::sdpa_backward", _sdpa_backward_fake, lib=LIB)

mj = torch.ops.multijagged


def _sdpa_setup(ctx, inputs, output):
    q, k, v, mask, seed, causal, scale, dropout_p = inputs
    out, lse = output
    _no_zero_fill(ctx)
    ctx.mark_non_differentiable(lse)
    # the backward's own inputs are not differentiated again (it raises): detach what it reads
    ctx.save_for_backward(q.detach(), k.detach(), v.detach(), None if mask is None else mask.detach(), seed,
                          out.detach(), lse)
    ctx.args = (causal, scale, dropout_p)


def _sdpa_backward(ctx, grad, _grad_lse):
    if grad is None:
        return None, None, None, None, None, None, None, None
    q, k, v, mask, seed, out, lse = ctx.saved_tensors
    need_mask = mask is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dmask = mj.sdpa_backward(grad, q, k, v, mask, seed, out, lse, *ctx.args, need_mask)
    n = ctx.needs_input_grad
    return (dq if n[0] else None, dk if n[1] else None, dv if n[2] else None, dmask if need_mask else None,
            None, None, None, None)


torch.library.register_autograd("multijagged::sdpa", _sdpa_backward, setup_context=_sdpa_setup, lib=LIB)


def _sdpa_backward_setup(ctx, inputs, output):
    _no_zero_fill(ctx)
    ctx.count = len(inputs)


def _sdpa_double_backward(ctx, *grads):
    if all(g is None for g in grads):
        return (None,) * ctx.count
    raise NotImplementedError(
        "scaled_dot_product_attention(): double backward is not supported for layout torch.multi_jagged "
        "(as for dense SDPA's fused kernels)"
    )


torch.library.register_autograd(
    "multijagged::sdpa_backward", _sdpa_double_backward, setup_context=_sdpa_backward_setup, lib=LIB
)


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d) if d else 1.0  # an empty head dim scores 0 whatever the scale


# --------------------------------------------------------------------------- packed level
# NOTE [ Attention backends ]
#
# ``varlen_attention`` is the contract of kernels/attention.py as an op on packed buffers; its
# kernel picks a backend per call (``choose_backend``), and the backward op picks the same one
# (the choice depends only on the inputs). Under ``torch.compile`` the op is opaque (fake impl
# below): the CPU backends may read the lengths on the host inside it.
#
# * CPU: ``bucketed`` (segments sorted by length, padded within buckets of similar length, one
#   fused CPU kernel call per bucket), or ``loop`` (one fused call per segment, on views) for a
#   single segment or for ≤ 4096 segments whose mean work Lq·Lk·H·D is ≥ 1.5·10⁶ (``LOOP_*``).
#   docs/design.md §8 has the measurements behind this rule. ``blocks`` (one dense call per run
#   of equal consecutive segments, on views, bias broadcast over the run) when such runs are at
#   least ``BLOCKS_MIN_RUN`` segments long on average and there is no dropout: the rows of a
#   pair in triangle attention (docs/design.md §18). A forward that no backward will read runs
#   short float32 segments alone (``loop``, one-segment runs of ``blocks``) unfused (NOTE [ Short
#   segments without the row log-sum-exp ] in kernels/attention_common.py).
# * CUDA: ``flash`` — torch's own ``_flash_attention_forward`` with ``cu_seqlens`` (as
#   torch.jagged) — for float16/bfloat16 without bias or dropout and one head size ≤ 256;
#   ``flash_attn`` instead when the flash-attn package is installed; else ``triton`` (one launch
#   for the whole batch, bias supported) when every segment has ≤ 256 keys and there is no
#   dropout; else ``bucketed``.
# * ``backend(name)`` forces one (tests call every backend directly; benchmarks compare them).

LIB.define(
    "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_q, Tensor cu_k, SymInt max_q, SymInt max_k,"
    " Tensor? bias, Tensor? bias_start, Tensor? seed, bool causal, float scale, float dropout_p) -> (Tensor, Tensor)"
)
LIB.define(
    "varlen_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_q,"
    " Tensor cu_k, SymInt max_q, SymInt max_k, Tensor? bias, Tensor? bias_start, Tensor? seed, bool causal,"
    " float scale, float dropout_p, bool bias_grad) -> (Tensor, Tensor, Tensor, Tensor)"
)

BACKENDS = ("reference", "loop", "bucketed", "blocks", "triton", "flash", "flash_attn")
_FORCED: list = [None]


class backend:
    """Context manager forcing one attention backend (``BACKENDS``) for the calls inside it."""

    def __init__(self, name):
        if name is not None and name not in BACKENDS:
            raise ValueError(f"backend(): expected one of {BACKENDS} or None, got {name!r}")
        self.name = name

    def __enter__(self):
        self.prev, _FORCED[0] = _FORCED[0], self.name
        return self

    def __exit__(self, *exc):
        _FORCED[0] = self.prev


def _has_flash_attn() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


# CPU rule: one fused call per segment (views, no gathers) once a segment's work Lq·Lk·H·D is
# large enough that the per-call cost is amortised and bucketing's gathers and padding cost more
# than they save; buckets otherwise, and always for many segments (their lengths then group
# tightly). Measured in docs/design.md §8.
LOOP_MIN_WORK = 1_500_000
LOOP_MAX_SEGMENTS = 4096


def choose_backend(q, k, v, cu_q, cu_k, max_k, bias, dropout_p: float) -> str:
    """The backend for one call (NOTE [ Attention backends ])."""
    forced = _FORCED[0]
    if forced is not None:
        return forced
    fits_triton = dropout_p == 0 and max_k <= 256 and q.shape[-1] <= 128 and v.shape[-1] <= 128
    if kernel_choice._FORCED is not None and q.dtype in (torch.float16, torch.bfloat16, torch.float32):
        # ``triton_kernels(True/False)`` forces the structural kernels, attention's included
        if kernel_choice._FORCED and fits_triton:
            return "triton"
        if not kernel_choice._FORCED and q.device.type == "cuda":
            return "bucketed"
    if q.device.type == "cuda":
        one_head = q.shape[-1] == v.shape[-1] and q.shape[-1] <= 256
        if bias is None and dropout_p == 0 and q.dtype in (torch.float16, torch.bfloat16) and one_head:
            return "flash_attn" if _has_flash_attn() else "flash"
        if fits_triton and _has_triton():
            return "triton"
        return "bucketed"
    n = cu_q.shape[0] - 1
    if n <= 1:
        return "loop"
    if dropout_p == 0 and _runs(cu_q, cu_k) * BLOCKS_MIN_RUN <= n:
        return "blocks"
    if n > LOOP_MAX_SEGMENTS:
        return "bucketed"
    hit = _CHOICE.get(cu_q)
    if hit is not None and hit[0] is cu_k:
        pairs = hit[1]
    else:
        # SYNC: none on the CPU (the lengths are host tensors there); cached per batch
        pairs = float((cu_q.diff() * cu_k.diff()).sum()) / n
        _CHOICE[cu_q] = (cu_k, pairs)
    return "loop" if pairs * q.shape[1] * q.shape[-1] >= LOOP_MIN_WORK else "bucketed"


# mean Lq·Lk per segment, by the identity of (cu_q, cu_k): the layers of a model share a batch's
_CHOICE = WeakIdKeyDictionary()  # segment offsets (cached on its partition)

# ``blocks`` when runs of equal consecutive segments are this long on average (triangle
# attention: a run is a sample's n rows); docs/design.md §18 has the measurements.
BLOCKS_MIN_RUN = 4
_RUNS = WeakIdKeyDictionary()


def _runs(cu_q, cu_k) -> int:
    """Number of runs of equal consecutive segments (NOTE [ Attention by blocks of equal
    segments ] in kernels/attention.py), cached by the identity of (cu_q, cu_k)."""
    hit = _RUNS.get(cu_q)
    if hit is not None and hit[0] is cu_k:
        return hit[1]
    n = len(kattn.block_runs(cu_q, cu_k))
    _RUNS[cu_q] = (cu_k, n)
    return n


def _keep(seed, cu_q, cu_k, hq, dropout_p, device):
    if seed is None or dropout_p == 0:
        return None
    # SYNC: the score layout's size, inside the op (the dropout path only)
    ts = int(kattn.score_offsets(cu_q, cu_k)[-1])
    return dense_keep(seed, (ts, hq), dropout_p, device)


def _expand_kv_heads(k, v, hq):
    r = hq // k.shape[1]
    return (k, v) if r == 1 else (k.repeat_interleave(r, 1), v.repeat_interleave(r, 1))


def varlen_attention_impl(q, k, v, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None, seed=None,
                          causal=False, scale=1.0, dropout_p=0.0, need_lse=True):
    """The kernel of ``varlen_attention``; ``need_lse=False`` (eager calls that will run no
    backward) lets the CPU paths skip writing ``lse``."""
    name = choose_backend(q, k, v, cu_q, cu_k, max_k, bias, dropout_p)
    hq = q.shape[1]
    if name in ("flash", "flash_attn"):
        if bias is not None or dropout_p:
            raise ValueError(f"varlen_attention(): backend {name!r} takes no bias and no dropout")
        k, v = _expand_kv_heads(k, v, hq)
        if q.shape[0] == 0:
            return q.new_zeros(0, hq, v.shape[-1]), q.new_zeros(0, hq, dtype=torch.float32)
        if name == "flash_attn":
            from flash_attn import flash_attn_varlen_func

            out, lse, _ = flash_attn_varlen_func(
                q, k, v, cu_q.int(), cu_k.int(), max_q, max_k, 0.0, softmax_scale=scale, causal=causal,
                return_attn_probs=True,
            )
        else:
            out, lse, *_ = torch.ops.aten._flash_attention_forward(
                q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
            )
        return out, lse.t().contiguous()  # flash's varlen lse is (H, Tq)
    if name == "triton":
        if dropout_p:
            raise ValueError("varlen_attention(): backend 'triton' takes no dropout")
        from . import triton_attention  # noqa: F401  (registers multijagged::varlen_attention_triton)

        return torch.ops.multijagged.varlen_attention_triton(q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start,
                                                             causal, scale)
    keep = _keep(seed, cu_q, cu_k, hq, dropout_p, q.device)
    if name == "reference":
        return kattn.attention_reference(q, k, v, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p)
    fn = {"loop": kattn.attention_loop, "blocks": kattn.attention_blocks}.get(name, kattn.attention_bucketed)
    return fn(q, k, v, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p, need_lse=need_lse)


def varlen_attention_backward_impl(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None,
                                   seed=None, causal=False, scale=1.0, dropout_p=0.0, bias_grad=False):
    name = choose_backend(q, k, v, cu_q, cu_k, max_k, bias, dropout_p)
    hq, hk = q.shape[1], k.shape[1]
    empty = q.new_empty(0)
    if name in ("flash", "flash_attn"):
        ke, ve = _expand_kv_heads(k, v, hq)
        if name == "flash_attn":
            from flash_attn.flash_attn_interface import _flash_attn_varlen_backward

            dq, dk, dv = torch.empty_like(q), torch.empty_like(ke), torch.empty_like(ve)
            _flash_attn_varlen_backward(grad.contiguous(), q, ke, ve, out, lse.t().contiguous(), dq, dk, dv,
                                        cu_q.int(), cu_k.int(), max_q, max_k, 0.0, scale, causal, -1, -1, 0.0, None,
                                        False, None)
        else:
            rng = torch.zeros(2, dtype=torch.int64, device=q.device)
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                grad.contiguous(), q, ke, ve, out, lse.t().contiguous(), cu_q, cu_k, max_q, max_k, 0.0, causal, rng,
                empty, scale=scale,
            )
        return dq, kattn._reduce_heads(dk.transpose(0, 1), hk).transpose(0, 1) if hk != hq else dk, (
            kattn._reduce_heads(dv.transpose(0, 1), hk).transpose(0, 1) if hk != hq else dv), empty
    if name == "triton":
        from . import triton_attention  # noqa: F401

        dq, dk, dv, db = torch.ops.multijagged.varlen_attention_triton_backward(
            grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias, bias_start, causal, scale, bias_grad
        )
        return dq, dk, dv, db if bias_grad else empty
    keep = _keep(seed, cu_q, cu_k, hq, dropout_p, q.device)
    fn = {"reference": kattn.attention_reference_backward, "loop": kattn.attention_loop_backward,
          "bucketed": kattn.attention_bucketed_backward, "blocks": kattn.attention_blocks_backward}[name]
    dq, dk, dv, db = fn(grad, q, k, v, out, lse, cu_q, cu_k, bias, bias_start, keep, causal, scale, dropout_p,
                        bias_grad)
    return dq, dk, dv, empty if db is None else db


def _varlen_fake(q, k, v, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None, seed=None, causal=False,
                 scale=1.0, dropout_p=0.0):
    lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16, torch.float32) else q.dtype
    return q.new_empty((q.shape[0], q.shape[1], v.shape[-1])), q.new_empty(q.shape[:2], dtype=lse_dtype)


def _varlen_backward_fake(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias=None, bias_start=None, seed=None,
                          causal=False, scale=1.0, dropout_p=0.0, bias_grad=False):
    db = torch.empty_like(bias) if bias_grad and bias is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), db


LIB.impl("varlen_attention", varlen_attention_impl, "CompositeExplicitAutograd")
LIB.impl("varlen_attention_backward", varlen_attention_backward_impl, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::varlen_attention", _varlen_fake, lib=LIB)
torch.library.register_fake("multijagged::varlen_attention_backward", _varlen_backward_fake, lib=LIB)


def _varlen_setup(ctx, inputs, output, kept=()):
    """``kept``: tensors saved after the op's own ten (the eager formula's probabilities)."""
    q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, seed, causal, scale, dropout_p = inputs
    _no_zero_fill(ctx)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q.detach(), k.detach(), v.detach(), output[0].detach(), output[1], cu_q, cu_k,
                          None if bias is None else bias.detach(), bias_start, seed, *kept)
    ctx.args = (max_q, max_k, causal, scale, dropout_p)


def _varlen_backward(ctx, grad, _grad_lse, lse_now=None):
    """``lse_now``: the forward's ``lse`` when it was not written then."""
    if grad is None:
        return (None,) * 13
    q, k, v, out, lse, cu_q, cu_k, bias, bias_start, seed = ctx.saved_tensors[:10]
    lse = lse if lse_now is None else lse_now
    max_q, max_k, causal, scale, dropout_p = ctx.args
    need_bias = bias is not None and ctx.needs_input_grad[7]
    dq, dk, dv, db = mj.varlen_attention_backward(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, bias,
                                                  bias_start, seed, causal, scale, dropout_p, need_bias)
    n = ctx.needs_input_grad
    return (dq if n[0] else None, dk if n[1] else None, dv if n[2] else None, None, None, None, None,
            db if need_bias else None, None, None, None, None, None)


torch.library.register_autograd("multijagged::varlen_attention", _varlen_backward, setup_context=_varlen_setup,
                                lib=LIB)

torch.library.register_autograd(
    "multijagged::varlen_attention_backward", _sdpa_double_backward, setup_context=_sdpa_backward_setup, lib=LIB
)


# the most probabilities (score entries × heads) the eager formula keeps for the backward
# (NOTE [ Keeping the probabilities ] in kernels/attention_blocks.py): 256 MiB in float32
KEEP_PROBS_MAX = 1 << 26


def keeps_probs(q, k, v, cu_q, cu_k, max_k, bias, needs_bias_grad: bool, dropout_p: float) -> bool:
    """Whether the eager formula keeps the probabilities for its backward: the ``blocks``
    backend with a bias that needs a gradient (dense SDPA's math path, which a per-sample loop
    takes then, keeps them too), float32 or float64, up to ``KEEP_PROBS_MAX`` entries."""
    if bias is None or not needs_bias_grad or dropout_p or q.dtype not in (torch.float32, torch.float64):
        return False
    if choose_backend(q, k, v, cu_q, cu_k, max_k, bias, dropout_p) != "blocks":
        return False
    # SYNC: none (the CPU's lengths are host tensors)
    return int((cu_q.diff() * cu_k.diff()).sum()) * q.shape[1] <= KEEP_PROBS_MAX


class _VarlenAttention(torch.autograd.Function):
    """``varlen_attention`` with its formula, for the eager values path (NOTE [ Eager values
    path ] in ops/fastpath.py: no dispatch mode, functorch transform or trace is active there),
    without the op's trip through the dispatcher and ``torch.library``'s autograd layer, whose
    argument binding alone costs ≈ 20 µs a call. Traced code and everything else call the op.
    It keeps the probabilities where ``keeps_probs`` says so, saved as the op's tensors are (freed
    by the backward that reads them); its ``lse`` output is then written only when ``need_lse``,
    and a backward that records a graph (second order) recomputes it."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, seed, causal, scale, dropout_p,  # type: ignore[override]
                need_lse=True):
        args = (q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, seed, causal, scale, dropout_p)
        probs = None
        if keeps_probs(q, k, v, cu_q, cu_k, max_k, bias, ctx.needs_input_grad[7], dropout_p):
            probs = []
            out, lse = kattn.attention_blocks(q, k, v, cu_q, cu_k, bias, bias_start, None, causal, scale,
                                              need_lse=need_lse, probs=probs)
        else:
            need_lse = True
            out, lse = varlen_attention_impl(*args)
        ctx.kept, ctx.lse_written = probs is not None, need_lse
        _varlen_setup(ctx, args, (out, lse), probs or ())
        return out, lse

    @staticmethod
    def backward(ctx, grad, grad_lse):  # type: ignore[override]
        if grad is not None and ctx.kept and not torch.is_grad_enabled():
            q, k, v, out, lse, cu_q, cu_k, bias, bias_start, _, *probs = ctx.saved_tensors
            _, _, causal, scale, _ = ctx.args
            n = ctx.needs_input_grad
            dq, dk, dv, db = kattn.attention_blocks_backward(grad, q, k, v, out, lse, cu_q, cu_k, bias, bias_start,
                                                             None, causal, scale, 0.0, True, probs=probs)
            return (dq if n[0] else None, dk if n[1] else None, dv if n[2] else None, None, None, None, None, db,
                    None, None, None, None, None, None)
        lse = None
        if grad is not None and not ctx.lse_written:  # a backward recording a graph reads lse
            q, k, v, _, _, cu_q, cu_k, bias, bias_start, seed = ctx.saved_tensors[:10]
            max_q, max_k, causal, scale, dropout_p = ctx.args
            with torch.no_grad():
                lse = varlen_attention_impl(q, k, v, cu_q, cu_k, max_q, max_k, bias, bias_start, seed, causal, scale,
                                            dropout_p)[1]
        return *_varlen_backward(ctx, grad, grad_lse, lse), None


def varlen_attention_eager(*args, need_lse: bool = True):
    """``mj.varlen_attention(*args)`` for the eager values path (``_VarlenAttention``);
    ``need_lse=False``: its caller reads no ``lse``."""
    return _VarlenAttention.apply(*args, need_lse)
