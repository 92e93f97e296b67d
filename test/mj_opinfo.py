"""A ``multi_jagged`` OpInfo database, in the style of
``torch.testing._internal.opinfo.definitions.nested``.

``torch.jagged``'s database (``njt_op_db``) covers the ops of one ragged dim; this one covers what
that layout cannot express: several ragged dims (pairs ``(B, j0, j0, C)``, rectangular
``(B, j0, j1, C)``, a static dim before the ragged one ``(B, S, j0, C)``, three ragged dims),
zero-length samples, and the op families built on them — pair broadcasts and reductions over ragged
dims, softmax over a ragged dim, contractions (``matmul``, ``einsum``, triangle multiplication),
attention with a multi_jagged bias, convolution and pooling of images of different sizes, and
indexing and order statistics along ragged dims.

Every entry is an ``OpInfo`` whose ``op`` is the batched call as a user writes it and whose
``ref`` is the per-sample reference: each multi_jagged operand of a sample is replaced by one
component (``MJSampleInput.components``, the dense tensors the batch was built from — never a
value computed by the package) and the plain dense function runs on it. ``test_mj_opinfo.py``
turns the database into device-generic tests.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import torch_multijagged as mj

__all__ = ["mj_op_db", "MJSampleInput", "per_sample_reference"]


class MJSampleInput(SampleInput):
    """A sample whose multi_jagged operands are listed with the dense components they were built
    from: ``components[k][i]`` is sample ``i`` of the k-th multi_jagged operand (in the order
    they appear in ``(input, *args)``)."""

    __slots__ = ["components"]

    def __init__(self, input, *, args=(), kwargs=None, components=(), name=""):
        super().__init__(input, args=args, kwargs=kwargs, name=name)
        self.components = components


# ----------------------------------------------------------------------------- structures
# Per-sample lengths, each with a zero-length sample and without one (ops that need at least one
# element per sample use the latter).
WITH_EMPTY = (3, 0, 2)
NONEMPTY = (2, 4, 1)


def _leaves(shapes: Sequence[Sequence[int]], device, dtype, requires_grad, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in shapes:
        t = torch.randn(*s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
        out.append(t.requires_grad_(requires_grad))
    return out


def _batch(comps: list[torch.Tensor]):
    """The multi_jagged batch of ``comps``, differentiable with respect to them."""
    return mj.as_nested_tensor(comps)


def _structure(kind: str, ns: Sequence[int], c: int = 3, s: int = 2, ms: Sequence[int] = (2, 1, 3)):
    """Component shapes of a structure: ``seq`` (j0, C), ``pair`` (j0, j0, C), ``rect`` (j0, j1, C),
    ``lead`` (S, j0, C), ``cube`` (j0, j1, j2, C), ``image`` (C, j0, j1)."""
    return {
        "seq": [(n, c) for n in ns],
        "pair": [(n, n, c) for n in ns],
        "rect": [(n, m, c) for n, m in zip(ns, ms)],
        "lead": [(s, n, c) for n in ns],
        "cube": [(n, m, m, c) for n, m in zip(ns, ms)],
        "image": [(c, n + 2, m + 3) for n, m in zip(ns, ms)],
    }[kind]


def _sample_func(structures: Sequence[str], n_inputs: int = 1, allow_empty: bool = True,
                 extra: Callable | None = None):
    """``sample_inputs_func`` for ops on ``n_inputs`` multi_jagged operands of one structure each;
    ``extra(device, dtype, requires_grad)`` gives dense trailing args (a weight)."""

    def sample_inputs(op_info, device, dtype, requires_grad, **kwargs):
        lengths = [NONEMPTY] + ([WITH_EMPTY] if allow_empty else [])
        for kind in structures:
            for li, ns in enumerate(lengths):
                comps = [_leaves(_structure(kind, ns), device, dtype, requires_grad, seed=17 * li + k)
                         for k in range(n_inputs)]
                batches = [_batch(cs) for cs in comps]
                args = tuple(batches[1:]) + (tuple(extra(device, dtype, requires_grad)) if extra else ())
                yield MJSampleInput(batches[0], args=args, components=comps,
                                    name=f"{kind}, lengths {ns}")

    return sample_inputs


def per_sample_reference(dense: Callable):
    """``ref`` of an entry: ``dense`` on each sample's components (dense args passed as they
    are); returns one output per sample."""

    def ref(sample: MJSampleInput):
        mj_args = [sample.input] + [a for a in sample.args if isinstance(a, mj.MultiJaggedTensor)]
        dense_args = [a for a in sample.args if not isinstance(a, mj.MultiJaggedTensor)]
        assert len(mj_args) == len(sample.components)
        batch = len(sample.components[0])
        return [dense(*[cs[i] for cs in sample.components], *dense_args, **sample.kwargs) for i in range(batch)]

    return ref


def _entry(name: str, op: Callable, dense: Callable, structures: Sequence[str], *, n_inputs: int = 1,
           allow_empty: bool = True, extra: Callable | None = None, dtypes=(torch.float32, torch.float64),
           supports_autograd: bool = True) -> OpInfo:
    return OpInfo(
        name,
        op=op,
        ref=per_sample_reference(dense),
        dtypes=dtypes,
        sample_inputs_func=_sample_func(structures, n_inputs, allow_empty, extra),
        supports_autograd=supports_autograd,
        supports_out=False,
    )


def _weight(*shape):
    def extra(device, dtype, requires_grad):
        g = torch.Generator().manual_seed(99)
        return (torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
                .requires_grad_(requires_grad),)

    return extra


def _conv_weight(device, dtype, requires_grad):
    return _weight(4, 3, 3, 3)(device, dtype, requires_grad) + _weight(4)(device, dtype, requires_grad)


def _softmax_over(dim):
    return lambda t: torch.softmax(t, dim)


# ----------------------------------------------------------------------------- the database
mj_op_db: list[OpInfo] = [
    # pair broadcasts: ragged dims created by broadcasting
    _entry("pair_broadcast_add", lambda x: x.unsqueeze(-2) + x.unsqueeze(-3),
           lambda c: c.unsqueeze(-2) + c.unsqueeze(-3), ["seq"]),
    _entry("outer_product_rect", lambda x, y: x.unsqueeze(-2) * y.unsqueeze(-3),
           lambda a, b: a.unsqueeze(-2) * b.unsqueeze(-3), ["seq"], n_inputs=2),
    # reductions over ragged dims (and a static dim of several ragged ones)
    _entry("sum_ragged_dim", lambda x: x.sum(2), lambda c: c.sum(1), ["pair", "rect", "cube"]),
    _entry("mean_ragged_dim", lambda x: x.mean(1), lambda c: c.mean(0), ["pair", "rect"], allow_empty=False),
    _entry("mean_static_dim_of_pair", lambda x: x.mean(-1), lambda c: c.mean(-1), ["pair", "cube"]),
    _entry("sum_all_ragged_dims", lambda x: x.sum((1, 2)), lambda c: c.sum((0, 1)), ["pair", "rect"]),
    _entry("amax_ragged_dim", lambda x: x.amax(2), lambda c: c.amax(1), ["pair", "rect"], allow_empty=False),
    _entry("logsumexp_ragged_dim", lambda x: torch.logsumexp(x, 2), lambda c: torch.logsumexp(c, 1),
           ["pair", "rect"]),
    _entry("softmax_ragged_dim", _softmax_over(2), _softmax_over(1), ["pair", "rect", "lead"]),
    _entry("log_softmax_ragged_dim_of_seq", lambda x: torch.log_softmax(x, 1), lambda c: torch.log_softmax(c, 0),
           ["seq"]),
    _entry("cumsum_ragged_dim", lambda x: torch.cumsum(x, 1), lambda c: torch.cumsum(c, 0), ["seq", "pair"]),
    # feature transforms keep ragged dims
    _entry("layer_norm_pair", lambda x, w: F.layer_norm(x, (3,), w), lambda c, w: F.layer_norm(c, (3,), w),
           ["pair", "rect", "cube"], extra=_weight(3)),
    _entry("linear_pair", lambda x, w: F.linear(x, w), lambda c, w: F.linear(c, w), ["pair", "lead", "cube"],
           extra=_weight(5, 3)),
    # contractions
    _entry("matmul_scores", lambda q, k: q @ k.transpose(-2, -1), lambda q, k: q @ k.transpose(-2, -1), ["lead"],
           n_inputs=2),
    _entry("matmul_pair_values", lambda x: torch.matmul((x.unsqueeze(-2) * x.unsqueeze(-3)).sum(-1), x),
           lambda c: (c.unsqueeze(-2) * c.unsqueeze(-3)).sum(-1) @ c, ["seq"]),
    _entry("einsum_pair_values", lambda x: torch.einsum("bijc,bjc->bic", x.unsqueeze(-2) * x.unsqueeze(-3), x),
           lambda c: torch.einsum("ijc,jc->ic", c.unsqueeze(-2) * c.unsqueeze(-3), c), ["seq"]),
    _entry("einsum_scores", lambda x, y: torch.einsum("bic,bjc->bij", x, y),
           lambda a, b: torch.einsum("ic,jc->ij", a, b), ["seq"], n_inputs=2),
    _entry("triangle_multiplication_outgoing", lambda a, b: torch.einsum("bikc,bjkc->bijc", a, b),
           lambda a, b: torch.einsum("ikc,jkc->ijc", a, b), ["pair"], n_inputs=2),
    _entry("triangle_multiplication_incoming", lambda a, b: torch.einsum("bkic,bkjc->bijc", a, b),
           lambda a, b: torch.einsum("kic,kjc->ijc", a, b), ["pair"], n_inputs=2),
    # attention with a multi_jagged bias: q, k, v (B, H, j0, D), bias (B, H, j0, j0)
    _entry("sdpa_with_pair_bias",
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=(q @ k.transpose(-2, -1)).tanh()),
           lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=(q @ k.transpose(-2, -1)).tanh()),
           ["lead"], n_inputs=3, allow_empty=False),
    # images of different sizes (B, C, j0, j1)
    _entry("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1),
           lambda c, w, b: F.conv2d(c[None], w, b, padding=1)[0], ["image"], extra=_conv_weight),
    _entry("conv2d_strided", lambda x, w, b: F.conv2d(x, w, b, stride=2),
           lambda c, w, b: F.conv2d(c[None], w, b, stride=2)[0], ["image"], extra=_conv_weight,
           allow_empty=False),  # a 2×4 image is smaller than the strided window: dense raises
    _entry("max_pool2d", lambda x: F.max_pool2d(x, 2, ceil_mode=True),
           lambda c: F.max_pool2d(c[None], 2, ceil_mode=True)[0], ["image"]),
    _entry("avg_pool2d", lambda x: F.avg_pool2d(x, 3, stride=1, padding=1),
           lambda c: F.avg_pool2d(c[None], 3, stride=1, padding=1)[0], ["image"]),
    _entry("group_norm", lambda x: F.group_norm(x, 1), lambda c: F.group_norm(c[None], 1)[0], ["image"]),
    # indexing and order statistics along ragged dims
    _entry("select_first", lambda x: x[:, 0], lambda c: c[0], ["seq", "pair"], allow_empty=False),
    _entry("narrow_ragged", lambda x: x.narrow(1, 0, 1), lambda c: c.narrow(0, 0, 1), ["seq", "pair"],
           allow_empty=False),
    _entry("flip_ragged", lambda x: x.flip(1), lambda c: c.flip(0), ["seq", "pair", "rect"]),
    _entry("roll_ragged", lambda x: x.roll(1, 1), lambda c: c.roll(1, 0), ["seq"], allow_empty=False),
    _entry("sort_ragged", lambda x: torch.sort(x, 1).values, lambda c: torch.sort(c, 0).values, ["seq", "pair"]),
    _entry("topk_ragged", lambda x: torch.topk(x, 1, 1).values, lambda c: torch.topk(c, 1, 0).values,
           ["seq", "pair"], allow_empty=False),
    _entry("slice_tail", lambda x: x[:, 1:], lambda c: c[1:], ["seq"]),
    _entry("cat_ragged", lambda x: torch.cat([x, 2 * x], 1), lambda c: torch.cat([c, 2 * c], 0), ["seq", "rect"]),
]

OPS = {op.name: op for op in mj_op_db}

