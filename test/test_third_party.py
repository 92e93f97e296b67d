"""Published model-library code, unchanged, on multi_jagged batches against the same code on each
sample (a batch of one): outputs, and the gradients of every input and every parameter
(``torch.autograd.grad``; the reference's parameter gradients are summed over samples), in
float64 (``module.double()``):

* ``einops`` — ``rearrange`` / ``reduce`` / ``repeat`` / ``einsum`` and its layers;
* ``transformers`` (Hugging Face) — ViT, DINOv2, GPT-2 and OPT blocks on tokens ``(B, j0, C)``, a ConvNeXt
  stage and a ResNet backbone on images ``(B, C, j0, j1)`` of different sizes, BLIP-2's Q-Former and
  DETR's decoder layer with dense queries over each sample's own tokens;
* ``x-transformers`` — its ``Attention``, ``FeedForward`` and ``Encoder``;
* ``openfold3`` (OpenFold's AlphaFold 3 reproduction) — the pair stack on square pairs
  ``(B, j0, j0, C)``: triangle multiplication outgoing / incoming, triangle attention from the
  starting / ending node, the SwiGLU pair transition and ``PairFormerBlock``.

Every library is pinned in the ``test`` extra; its tests are skipped where it is not installed.
Each batch holds a zero-length sample where the dense module accepts one; where the dense module
refuses an empty sample (``view(..., -1)`` of zero elements, in ViT / DINOv2 / OpenFold attention)
the batch still holds one, whose output must be empty. ``torch.compile`` (``aot_eager``, lengths
dynamic through the nested ints, ``fullgraph=True``) runs one module per library over three length
vectors in one graph. What cannot run is ``xfail(strict=True)`` with its reason.

Not here: ``timm`` and ``vit-pytorch`` import ``torchvision``, whose registry build (compiled
against CUDA torch) does not load beside the CPU torch; Boltz pins ``numpy<2`` and
``einops==0.8.0``, Protenix pins its torch version, and the ``alphafold3-pytorch`` wheels are
either empty or need RDKit, Lightning, torch-geometric and gradio on import.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

import torch_multijagged as mj

einops = pytest.importorskip("einops")
from einops.layers.torch import Rearrange, Reduce  # noqa: E402

F64 = torch.float64
H = 2
# for libraries that take their attention softmax in float32 (``softmax(..., dtype=torch.float32)``)
SOFTMAX_F32 = dict(rtol=1e-5, atol=1e-6)


def _leaves(ns=(3, 1, 4), c=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=F64, requires_grad=True) for n in ns]


def _check(batched, per_sample, leaves):
    """``batched(x)`` per sample equals ``per_sample(component)``, values and leaf gradients."""
    x = mj.as_nested_tensor(leaves)
    out = batched(x)
    got = list(out.unbind()) if isinstance(out, mj.MultiJaggedTensor) else list(out)
    refs = [per_sample(c) for c in leaves]
    for a, r in zip(got, refs):
        torch.testing.assert_close(a, r, equal_nan=True)  # the mean of an empty sample is nan, as dense
    g1 = torch.autograd.grad(sum((a ** 2).sum() for a in got), leaves)
    g2 = torch.autograd.grad(sum((r ** 2).sum() for r in refs), leaves)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, equal_nan=True)


CASES = {
    "rearrange heads": (lambda x: einops.rearrange(x, "b n (h d) -> b h n d", h=H),
                        lambda c: einops.rearrange(c, "n (h d) -> h n d", h=H)),
    "rearrange packed qkv + sdpa": (
        lambda x: einops.rearrange(
            F.scaled_dot_product_attention(*einops.rearrange(x, "b n (three h d) -> three b h n d", three=3, h=H).unbind(0)),
            "b h n d -> b n (h d)"),
        lambda c: einops.rearrange(
            F.scaled_dot_product_attention(*einops.rearrange(c, "n (three h d) -> three h n d", three=3, h=H).unbind(0)),
            "h n d -> n (h d)")),
    "reduce mean": (lambda x: einops.reduce(x, "b n c -> b c", "mean"), lambda c: einops.reduce(c, "n c -> c", "mean")),
    "reduce max": (lambda x: einops.reduce(x, "b n c -> b c", "max"), lambda c: einops.reduce(c, "n c -> c", "max")),
    "repeat": (lambda x: einops.repeat(x, "b n c -> b n c k", k=2), lambda c: einops.repeat(c, "n c -> n c k", k=2)),
    "einsum pair": (lambda x: einops.einsum(x, x, "b i c, b j c -> b i j"), lambda c: einops.einsum(c, c, "i c, j c -> i j")),
    "layers": (lambda x: torch.nn.Sequential(Rearrange("b n (h d) -> b n h d", h=H), Reduce("b n h d -> b n d", "sum"))(x),
               lambda c: torch.nn.Sequential(Rearrange("n (h d) -> n h d", h=H), Reduce("n h d -> n d", "sum"))(c)),
}


@pytest.mark.parametrize("case", CASES)
def test_einops_per_sample(case):
    batched, per_sample = CASES[case]
    # a zero-length sample, except where the dense op refuses one (max over nothing)
    _check(batched, per_sample, _leaves(ns=(3, 1, 4) if case == "reduce max" else (3, 0, 4)))


# ----------------------------------------------------------------------------- model libraries
def _tokens(ns, c=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, generator=g, dtype=F64, requires_grad=True) for n in ns]


def _pairs(ns, c=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, n, c, generator=g, dtype=F64, requires_grad=True) for n in ns]


def _images(sizes, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(c, h, w, generator=g, dtype=F64, requires_grad=True) for h, w in sizes]


def _outputs(out):
    """The tensors a module returned, as a tuple (``ModelOutput`` and tuples alike)."""
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(o for o in (out.values() if isinstance(out, dict) else out) if isinstance(o, torch.Tensor))


def _samples(t):
    return list(t.unbind()) if isinstance(t, mj.MultiJaggedTensor) else list(t.unbind(0))


def _run_module(module, call, inputs, *, dense_refuses_empty=False, batched_call=None, tol=None):
    """``call(module, *batch)`` against ``call(module, *sample)`` for every sample (each input
    with a batch dim of one), outputs and the gradients of the inputs and of every parameter.

    ``inputs``: one list of per-sample leaves per argument. With ``dense_refuses_empty``, a
    sample of zero length has no reference (the dense module raises on it): its outputs must be
    empty. ``batched_call`` (a compiled ``call``) replaces ``call`` on the batch."""
    tol = tol or {}
    batch = [mj.as_nested_tensor(leaves) for leaves in inputs]
    got = [_samples(o) for o in _outputs((batched_call or call)(module, *batch))]
    refs = []
    for i in range(len(inputs[0])):
        sample = [leaves[i] for leaves in inputs]
        if dense_refuses_empty and sample[0].numel() == 0:
            refs.append(None)
            continue
        refs.append([o[0] for o in _outputs(call(module, *(t.unsqueeze(0) for t in sample)))])
    assert len(got) == len(next(r for r in refs if r is not None)), "as many outputs as the dense module"
    for i, ref in enumerate(refs):
        for k, per_output in enumerate(got):
            if ref is None:
                assert per_output[i].numel() == 0, "the output of an empty sample must be empty"
            else:
                torch.testing.assert_close(per_output[i], ref[k], **tol)
    wrt = [leaf for leaves in inputs for leaf in leaves] + [p for p in module.parameters() if p.requires_grad]
    g_batch = torch.autograd.grad(sum((a ** 2).sum() for o in got for a in o), wrt, allow_unused=True)
    g_ref = torch.autograd.grad(sum((a ** 2).sum() for r in refs if r is not None for a in r), wrt, allow_unused=True)
    for t, a, b in zip(wrt, g_batch, g_ref):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        torch.testing.assert_close(a, b, **tol)


@pytest.fixture(autouse=True)
def _no_warnings_and_fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch._dynamo.reset()


def _compiled_one_graph(module, call, make_inputs, lengths, **kw):
    """``call`` under ``torch.compile(fullgraph=True, backend="aot_eager")`` on batches of the
    given lengths, each against the eager per-sample reference: one graph for all of them."""
    cc = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(call, backend=cc, fullgraph=True)
    for ns in lengths:
        _run_module(module, call, make_inputs(ns), batched_call=compiled, **kw)
    assert cc.frame_count == 1, f"{cc.frame_count} graphs"


LENGTHS = ((3, 1, 4), (2, 5, 1), (4, 4, 2))  # new lengths at a fixed batch size: one graph


def test_einops_compiled_packed_qkv_attention_one_graph():
    batched, per_sample = CASES["rearrange packed qkv + sdpa"]
    # einops registers its torch backend on first use, and dynamo guards on that registry's size:
    # run once eagerly so that the count below sees only what new lengths do (alone, the test
    # recompiled on that guard)
    _check(batched, per_sample, _leaves(ns=LENGTHS[0]))
    cc = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(batched, backend=cc, fullgraph=True)
    for ns in LENGTHS:
        _check(compiled, per_sample, _leaves(ns=ns))
    assert cc.frame_count == 1


# ----------------------------------------------------------------------------- transformers
def _hf():
    return pytest.importorskip("transformers")


def _vit_layer(attn):
    _hf()
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTLayer

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, attn_implementation=attn)
    return ViTLayer(cfg).double().eval()


def _call(m, *xs):
    return m(*xs)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_vit_layer(attn):
    """Pre-norm block: ``LayerNorm``, q / k / v ``view(*shape[:-1], -1, d)``, the library's
    attention (SDPA, or its eager matmul + float32 softmax), MLP, residuals."""
    _run_module(_vit_layer(attn), _call, [_tokens((3, 0, 4))], dense_refuses_empty=True,
                tol=SOFTMAX_F32 if attn == "eager" else None)


def test_transformers_dinov2_layer_layer_scale_swiglu():
    _hf()
    from transformers import Dinov2Config
    from transformers.models.dinov2.modeling_dinov2 import Dinov2Layer

    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=8, num_attention_heads=2, mlp_ratio=2, layerscale_value=0.5, use_swiglu_ffn=True,
                       attn_implementation="sdpa")
    _run_module(Dinov2Layer(cfg).double().eval(), _call, [_tokens((3, 0, 4))], dense_refuses_empty=True)


@pytest.mark.parametrize("mask", [False, True], ids=["default", "tokenizer_mask"])
def test_transformers_llama_model_called_the_default_way(mask):
    """A whole ``LlamaModel(inputs_embeds=x, position_ids=mj.position_ids(x))``, called as users
    call it: ``use_cache`` on, so its cache length (0) is added to the sequence length and its
    empty key cache ``torch.tensor([])`` is joined to the keys (dense torch skips a 1-d empty
    tensor in ``cat``); or given the all-ones ``attention_mask`` a tokenizer or collator returns
    for unpadded tokens (``torch.ones_like(position_ids)``), whose preparation subtracts the mask's
    length from the keys' (``n - n``, each sample's 0)."""
    _hf()
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=10, attn_implementation="sdpa")
    model = LlamaModel(cfg).double().eval()

    def call(m, x):
        pos = mj.position_ids(x) if isinstance(x, mj.MultiJaggedTensor) else torch.arange(x.shape[1])[None]
        kw = dict(attention_mask=torch.ones_like(pos), use_cache=False) if mask else {}
        return m(inputs_embeds=x, position_ids=pos, **kw).last_hidden_state

    _run_module(model, call, [_tokens((3, 1, 4))])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_gpt2_block_conv1d(attn):
    """GPT-2's block: its ``Conv1D`` projections flatten the batch into rows and view them back
    (``addmm(b, x.view(-1, C), W).view(size_out)``), q / k / v ``split`` and head views, causal
    attention, the MLP. The dense block refuses an empty sample (``view(..., -1, d)``)."""
    _hf()
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=8, n_head=2, resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0, attn_implementation=attn)
    _run_module(GPT2Block(cfg, layer_idx=0).double().eval(), _call, [_tokens((3, 0, 4))], dense_refuses_empty=True,
                tol=SOFTMAX_F32 if attn == "eager" else None)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_opt_decoder_layer(attn):
    """OPT's decoder layer: its feed-forward runs on ``reshape(-1, C)`` rows and views the sum
    with the residual back to the batch's shape."""
    _hf()
    from transformers import OPTConfig
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    torch.manual_seed(0)
    cfg = OPTConfig(hidden_size=8, num_attention_heads=2, ffn_dim=16, dropout=0.0, attention_dropout=0.0,
                    attn_implementation=attn)
    _run_module(OPTDecoderLayer(cfg, layer_idx=0).double().eval(), lambda m, x: m(x, attention_mask=None),
                [_tokens((3, 0, 4))], dense_refuses_empty=True, tol=SOFTMAX_F32 if attn == "eager" else None)


def _deberta_call(m, x):
    # the encoder's mask: (B, N) ones → (B, 1, N, N), as DebertaV2Encoder.get_attention_mask builds it
    mask = torch.ones_like(x[..., 0])
    ext = mask.unsqueeze(1).unsqueeze(2)
    return m(x, attention_mask=ext * ext.squeeze(-2).unsqueeze(-1))


def test_transformers_deberta_v2_layer_heads_folded_into_the_batch():
    """DeBERTa-v2's attention folds the heads into the batch (``view(-1, N, D)`` of ``(B, H, N,
    D)``), runs ``bmm`` on ``(B·H, N, D)`` and views the scores back to ``(B, H, N, N)`` for its
    boolean mask; the dense layer refuses an empty sample (``view(-1, 0, D)``)."""
    _hf()
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Layer

    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=8, num_attention_heads=2, intermediate_size=16, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    _run_module(DebertaV2Layer(cfg).double().eval(), _deberta_call, [_tokens((3, 0, 4))], dense_refuses_empty=True)


def test_transformers_deberta_v2_layer_compiled_one_graph():
    """The heads folded into the batch trace: one graph over new lengths, forward and backward."""
    _hf()
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Layer

    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=8, num_attention_heads=2, intermediate_size=16, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    _compiled_one_graph(DebertaV2Layer(cfg).double().eval(), _deberta_call, lambda ns: [_tokens(ns)], LENGTHS)


def _bloom_call(m, x):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones_like(x[..., 0]), m.num_heads, x.dtype)  # (B·H, 1, N)
    return m(x, alibi=alibi, attention_mask=None)


def test_transformers_bloom_block_alibi_baddbmm():
    """Bloom's block: ALiBi from the mask's ``cumsum`` reshaped to ``(B·H, 1, N)``, ``baddbmm`` of
    the folded heads, the scores viewed back to ``(B, H, N, N)`` for a float32 softmax."""
    _hf()
    from transformers import BloomConfig
    from transformers.models.bloom.modeling_bloom import BloomBlock

    torch.manual_seed(0)
    cfg = BloomConfig(hidden_size=8, n_head=2, attn_implementation="eager")
    _run_module(BloomBlock(cfg, layer_idx=0).double().eval(), _bloom_call, [_tokens((3, 0, 4))],
                dense_refuses_empty=True, tol=SOFTMAX_F32)


def test_transformers_xglm_decoder_layer_bart_style_attention():
    """The BART-family attention (XGLM here; MVP, TrOCR, SpeechT5 are the same code):
    ``reshape(B * H, -1, D)``, ``bmm``, a size check against ``(B * H, N, N)``, ``bmm`` again."""
    _hf()
    from transformers import XGLMConfig
    from transformers.models.xglm.modeling_xglm import XGLMDecoderLayer

    torch.manual_seed(0)
    cfg = XGLMConfig(d_model=8, attention_heads=2, ffn_dim=16, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0)
    _run_module(XGLMDecoderLayer(cfg, layer_idx=0).double().eval(), lambda m, x: m(x, attention_mask=None),
                [_tokens((3, 0, 4))], dense_refuses_empty=True)


def test_transformers_fnet_layer_fourier_mixing():
    """FNet mixes tokens with ``torch.fft.fftn(x, dim=(1, 2)).real``: a 2-d DFT over each
    sample's own length and the features."""
    _hf()
    from transformers import FNetConfig
    from transformers.models.fnet.modeling_fnet import FNetLayer

    torch.manual_seed(0)
    cfg = FNetConfig(hidden_size=8, intermediate_size=16, hidden_dropout_prob=0.0)
    _run_module(FNetLayer(cfg).double().eval(), _call, [_tokens((3, 1, 4))])


def _run_dense_queries(module, call, n_queries=5, lengths=(4, 1, 6), c=8, tol=None):
    """``call(module, queries, memory)`` with dense queries ``(B, L, C)`` over multi_jagged memory
    ``(B, j0, C)`` (cross attention) against the same call per sample; outputs, and gradients of
    the queries, the memory and every parameter."""
    tol = tol or {}
    g = torch.Generator().manual_seed(1)
    q = torch.randn(len(lengths), n_queries, c, generator=g, dtype=F64, requires_grad=True)
    mem = _tokens(lengths, c=c)
    out = _outputs(call(module, q, mj.as_nested_tensor(mem)))[0]
    assert type(out) is torch.Tensor and out.shape[:2] == q.shape[:2]
    refs = [_outputs(call(module, q[i:i + 1], m.unsqueeze(0)))[0][0] for i, m in enumerate(mem)]
    for a, r in zip(out, refs):
        torch.testing.assert_close(a, r, **tol)
    wrt = [q, *mem, *[p for p in module.parameters() if p.requires_grad]]
    got = torch.autograd.grad((out ** 2).sum(), wrt, allow_unused=True)
    exp = torch.autograd.grad(sum((r ** 2).sum() for r in refs), wrt, allow_unused=True)
    for t, a, b in zip(wrt, got, exp):
        torch.testing.assert_close(torch.zeros_like(t) if a is None else a, torch.zeros_like(t) if b is None else b, **tol)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_blip2_qformer_layer_queries_over_ragged_image_tokens(attn):
    """BLIP-2's Q-Former: learned queries ``(B, L, C)`` self-attend, then cross-attend to each
    sample's own encoder tokens ``(B, j0, C)`` (eager: ``matmul`` of dense queries with ragged
    keys, a float32 softmax over each sample's keys)."""
    _hf()
    from transformers import Blip2QFormerConfig
    from transformers.models.blip_2.modeling_blip_2 import Blip2QFormerLayer

    torch.manual_seed(0)
    cfg = Blip2QFormerConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, encoder_hidden_size=8,
                             cross_attention_frequency=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             attn_implementation=attn)
    _run_dense_queries(Blip2QFormerLayer(cfg, 0).double().eval(),
                       lambda m, q, e: m(q, encoder_hidden_states=e, query_length=q.shape[1]),
                       tol=SOFTMAX_F32 if attn == "eager" else None)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_detr_decoder_layer_object_queries_over_ragged_features(attn):
    """DETR's decoder layer: object queries self-attend, then cross-attend to each image's own
    flattened feature map."""
    _hf()
    from transformers import DetrConfig
    from transformers.models.detr.modeling_detr import DetrDecoderLayer

    torch.manual_seed(0)
    cfg = DetrConfig(d_model=8, decoder_attention_heads=2, decoder_ffn_dim=16, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0, attn_implementation=attn)
    _run_dense_queries(DetrDecoderLayer(cfg).double().eval(), lambda m, q, e: m(q, encoder_hidden_states=e),
                       tol=SOFTMAX_F32 if attn == "eager" else None)


def test_transformers_convbert_layer_span_convolution():
    """ConvBERT's mixed attention: a separable conv over the sequence (``transpose`` to channels
    first), a dynamic kernel per position from ``nn.Unfold`` of ``(B, C, j0, 1)`` (each position's
    window, zero outside the sample), its softmax, and the attention heads beside it."""
    _hf()
    from transformers import ConvBertConfig
    from transformers.models.convbert.modeling_convbert import ConvBertLayer

    torch.manual_seed(0)
    cfg = ConvBertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, head_ratio=2, conv_kernel_size=3,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, embedding_size=8)
    _run_module(ConvBertLayer(cfg).double().eval(), _call, [_tokens((5, 0, 3))], dense_refuses_empty=True)


def test_transformers_convnext_stage_on_images_of_different_sizes():
    """Downsampling (channels-first ``LayerNorm``, stride-2 conv) then two ConvNeXt layers
    (7×7 depthwise conv, permutes, ``LayerNorm``, MLP, layer scale): ``(B, 3, j0, j1)`` in."""
    _hf()
    from transformers import ConvNextConfig
    from transformers.models.convnext.modeling_convnext import ConvNextStage

    torch.manual_seed(0)
    cfg = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], layer_scale_init_value=0.5)
    stage = ConvNextStage(cfg, in_channels=3, out_channels=8, depth=2).double()
    _run_module(stage, _call, [_images(((8, 12), (4, 4), (12, 7)))])


def test_transformers_resnet_backbone_pooled():
    """The whole backbone (stem conv + max pool, bottleneck stages, batch norm in eval mode,
    adaptive average pooling): each image at its own size to a dense ``(B, C, 1, 1)``."""
    _hf()
    from transformers import ResNetConfig
    from transformers.models.resnet.modeling_resnet import ResNetModel

    torch.manual_seed(0)
    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck")
    model = ResNetModel(cfg).double().eval()
    _run_module(model, lambda m, x: m(x).pooler_output, [_images(((32, 40), (16, 16), (24, 35)))])


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    "ViTEmbeddings.interpolate_pos_encoding resamples a dense table of positions to one size for the "
    "batch (interpolate to (height // patch, width // patch)): with images of different sizes that "
    "size is ragged, which torch's C++ refuses for a dense tensor before any Python hook runs"))
def test_transformers_vit_model_interpolated_positions_on_images_of_different_sizes():
    _hf()
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=16,
                    patch_size=4, attn_implementation="sdpa")
    model = ViTModel(cfg, add_pooling_layer=False).double().eval()
    _run_module(model, lambda m, x: m(x, interpolate_pos_encoding=True).last_hidden_state,
                [_images(((16, 16), (8, 12), (12, 8)))])


def test_transformers_vit_layer_compiled_one_graph():
    _compiled_one_graph(_vit_layer("sdpa"), _call, lambda ns: [_tokens(ns)], LENGTHS)


# ----------------------------------------------------------------------------- x-transformers
def _xt():
    return pytest.importorskip("x_transformers")


def _xt_encoder(**kw):
    _xt()
    from x_transformers import Encoder

    torch.manual_seed(0)
    return Encoder(dim=8, depth=2, heads=2, attn_dim_head=4, **kw).double()


def test_x_transformers_attention():
    _xt()
    from x_transformers.x_transformers import Attention

    torch.manual_seed(0)
    _run_module(Attention(8, heads=2, dim_head=4).double(), _call, [_tokens((3, 0, 4))], tol=SOFTMAX_F32)


def test_x_transformers_feedforward_glu():
    _xt()
    from x_transformers.x_transformers import FeedForward

    torch.manual_seed(0)
    _run_module(FeedForward(8, mult=2, glu=True).double(), _call, [_tokens((3, 0, 4))])


_XT_VARIANTS = {
    "default": {},
    "rmsnorm, glu, flash": dict(use_rmsnorm=True, ff_glu=True, attn_flash=True),
    # GRU gating of the residual: rearrange(x, 'b n d -> (b n) d') into nn.GRUCell, then reshape_as
    "gate_residual": dict(gate_residual=True),
    "macaron, sandwich norm, qk norm": dict(macaron=True, sandwich_norm=True, attn_qk_norm=True),
}


@pytest.mark.parametrize("variant", sorted(_XT_VARIANTS))
def test_x_transformers_encoder(variant):
    _run_module(_xt_encoder(**_XT_VARIANTS[variant]), _call, [_tokens((3, 0, 4))], tol=SOFTMAX_F32)


@pytest.mark.xfail(strict=True, raises=TypeError, reason=(
    "rotary positions are arange(x.shape[1] + mem_len + offset): arithmetic on a ragged size, "
    "which has no single value (a TypeError that says so)"))
def test_x_transformers_encoder_rotary():
    _xt()
    from x_transformers import Encoder

    torch.manual_seed(0)
    model = Encoder(dim=16, depth=1, heads=2, attn_dim_head=64, rotary_pos_emb=True).double()
    _run_module(model, _call, [_tokens((3, 1, 4), c=16)], tol=SOFTMAX_F32)


def test_x_transformers_cross_attender_dense_queries_over_ragged_context():
    _xt()
    from x_transformers import CrossAttender

    torch.manual_seed(0)
    _run_dense_queries(CrossAttender(dim=16, depth=1, heads=2).double(), lambda m, q, c: m(q, context=c), c=16,
                       tol=SOFTMAX_F32)


def test_x_transformers_encoder_compiled_one_graph():
    """Its cache slice ``k[..., mem_len:, :]`` (``mem_len = 0``) along the ragged dim traces."""
    _compiled_one_graph(_xt_encoder(), _call, lambda ns: [_tokens(ns)], LENGTHS, tol=SOFTMAX_F32)


# ----------------------------------------------------------------------------- openfold3 (AF3 pair stack)
CZ, CS = 6, 4


def _of3():
    return pytest.importorskip("openfold3")


def _tri_mul(direction):
    _of3()
    from openfold3.core.model.layers.triangular_multiplicative_update import (
        TriangleMultiplicationIncoming,
        TriangleMultiplicationOutgoing,
    )

    torch.manual_seed(0)
    cls = TriangleMultiplicationOutgoing if direction == "outgoing" else TriangleMultiplicationIncoming
    return cls(CZ, 4).double()


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_openfold3_triangle_multiplication(direction):
    """``mask=None`` (every pair valid; the module makes ``z.new_ones(z.shape[:-1])``), on the
    batch and on each sample."""
    _run_module(_tri_mul(direction), _call, [_pairs((3, 0, 2, 4))])


@pytest.mark.parametrize("node", ["starting", "ending"])
def test_openfold3_triangle_attention(node):
    """``mask=None``; the ending node transposes the pair (``x.transpose(-2, -3)``) around the
    same attention: q / k / v ``view(shape[:-1] + (H, -1))``, ``q /= sqrt(c)`` in place, biases
    ``(B, j0, 1, 1, j0)`` and ``(B, 1, H, j0, j0)`` added in place to the logits."""
    _of3()
    from openfold3.core.model.layers.triangular_attention import TriangleAttention, TriangleAttentionEndingNode

    torch.manual_seed(0)
    cls = TriangleAttention if node == "starting" else TriangleAttentionEndingNode
    _run_module(cls(CZ, 3, 2).double(), _call, [_pairs((3, 0, 2, 4))], dense_refuses_empty=True)


def test_openfold3_pair_transition():
    _of3()
    from openfold3.core.model.layers.transition import SwiGLUTransition

    torch.manual_seed(0)
    _run_module(SwiGLUTransition(CZ, 2).double(), _call, [_pairs((3, 0, 2, 4))])


def _pairformer_block():
    _of3()
    from openfold3.core.model.latent.pairformer import PairFormerBlock

    torch.manual_seed(0)
    return PairFormerBlock(c_s=CS, c_z=CZ, c_hidden_pair_bias=3, no_heads_pair_bias=2, c_hidden_mul=4,
                           c_hidden_pair_att=3, no_heads_pair=2, transition_type="swiglu", transition_n=2,
                           pair_dropout=0.0, fuse_projection_weights=False, inf=1e9).double()


def _block_call(m, s, z):
    # every token and pair valid: the masks are ones of the singles' and the pairs' shapes
    return m(s, z, single_mask=s.new_ones(s.shape[:-1]), pair_mask=z.new_ones(z.shape[:-1]))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_openfold3_pairformer_block(mode):
    """Singles ``(B, j0, CS)`` and pairs ``(B, j1, j1, CZ)`` of the same lengths: triangle
    updates, triangle attention both ways, pair transition, single attention with pair bias,
    single transition. In training mode its row / column dropout (rate 0 here, so the result is
    defined) builds ``z.new_ones([B, 1, j1, CZ])``, a mask shared along a ragged dim."""
    block = _pairformer_block().train(mode == "train")
    ns = (3, 0, 2, 4)
    _run_module(block, _block_call, [_tokens(ns, c=CS, seed=1), _pairs(ns, c=CZ, seed=2)], dense_refuses_empty=True)


def test_openfold3_triangle_multiplication_compiled_one_graph():
    _compiled_one_graph(_tri_mul("outgoing"), _call, lambda ns: [_pairs(ns)], LENGTHS)


@pytest.mark.xfail(strict=True, reason=(
    "under torch.compile, OpenFold's in-place q /= sqrt(c_hidden) on q: (B, j0, H, j0, C) — a view "
    "whose ragged dims are not adjacent, with autograd recording — fails while dynamo runs it on "
    "fake tensors: torch multiplies the view's two symbolic ragged sizes, whose hints are nested "
    "ints (ValueError: unsupported: NestedIntNode, from NestedIntNode.mul)"))
def test_openfold3_triangle_attention_compiled():
    _of3()
    from openfold3.core.model.layers.triangular_attention import TriangleAttention

    torch.manual_seed(0)
    _compiled_one_graph(TriangleAttention(CZ, 3, 2).double(), _call, lambda ns: [_pairs(ns)], LENGTHS)


def _whole_model(name, attn):
    _hf()
    import transformers as T

    torch.manual_seed(0)
    if name == "bert":
        cfg = T.BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, num_hidden_layers=2,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, vocab_size=20,
                           attn_implementation=attn)
        return T.BertModel(cfg, add_pooling_layer=False).double().eval()
    if name == "llama":
        cfg = T.LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                            num_hidden_layers=2, vocab_size=20, attn_implementation=attn)
        return T.LlamaModel(cfg).double().eval()
    cfg = T.GPT2Config(n_embd=8, n_head=2, n_layer=2, vocab_size=20, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                       bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    return T.GPT2Model(cfg).double().eval()


@pytest.mark.parametrize("name,attn", [("bert", "sdpa"), ("bert", "eager"), ("llama", "sdpa"), ("gpt2", "sdpa")])
def test_transformers_whole_models_on_ragged_embeddings(name, attn):
    """Whole ``BertModel`` / ``LlamaModel`` / ``GPT2Model``, unmodified, on ragged ``inputs_embeds`` with
    each sample's ``position_ids`` (``mj.position_ids``) and no attention mask: the library detects
    packed sequences from the position ids (``torch.diff`` with ``prepend`` along the ragged dim),
    builds rotary / learned positions, runs causal or bidirectional SDPA per sample; outputs and the
    gradients of the embeddings and of every parameter as each sample alone."""
    model = _whole_model(name, attn)

    def call(m, x):
        pos = mj.position_ids(x) if isinstance(x, mj.MultiJaggedTensor) else torch.arange(x.shape[1])[None]
        kw = {"token_type_ids": pos * 0} if name == "bert" else {"use_cache": False}
        return m(inputs_embeds=x, position_ids=pos, **kw).last_hidden_state

    _run_module(model, call, [_tokens((3, 1, 5))], tol=SOFTMAX_F32 if attn == "eager" else None)
