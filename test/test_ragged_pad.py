"""``F.pad`` along ragged dims (ops/indexing/joins.py): every mode on signals and images, circular
padding that crops one side, pads of one batch in every mode (its cached rows), dense's errors
naming the sample, and a zero pair for the batch dim — per sample, with gradients."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj

from _structures import assert_samples_and_grads
from test_ragged_indexing import check

F64 = torch.float64


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 1), (2, 1), (0, 2), (1, 2, 2, 1)], ids=str)
def test_pad_modes_on_signals_and_images(mode, pad):
    """Every mode, every sample long enough for it: signals (B, C, j0) and images (B, C, j0, j1)."""
    g = torch.Generator().manual_seed(len(pad) + pad[0])
    if len(pad) == 2:
        comps, ragged = [torch.randn(2, n, generator=g, dtype=F64) for n in (3, 4, 5)], (2,)
    else:
        comps, ragged = [torch.randn(2, h, w, generator=g, dtype=F64) for h, w in ((3, 4), (5, 3), (4, 4))], (2, 3)
    check(lambda x: F.pad(x, pad, mode=mode), lambda t: F.pad(t, pad, mode=mode), comps, ragged)


@pytest.mark.parametrize("pad", [(-1, 1), (1, -1), (-1, 2), (2, -1), (-2, 1, 1, -1)], ids=str)
def test_circular_pad_that_crops_one_side_wraps_what_is_left(pad):
    """Dense circular padding crops first (a negative pad) and wraps around the cropped length;
    the wrap read the uncropped sample before. Static dims follow the same rule."""
    g = torch.Generator().manual_seed(len(pad) + pad[0])
    if len(pad) == 2:
        sizes, ragged = [(2, n) for n in (3, 4, 5)], (2,)
    else:
        sizes, ragged = [(2, h, w) for h, w in ((3, 4), (5, 3), (4, 4))], (2, 3)
    comps = [torch.randn(*s, generator=g, dtype=F64) for s in sizes]
    check(lambda x: F.pad(x, pad, mode="circular"), lambda t: F.pad(t[None], pad, mode="circular")[0], comps, ragged)
    statics = [torch.randn(n, 5, generator=g, dtype=F64) for n in (3, 0, 2)]  # the padded dim static
    check(lambda x: F.pad(x, pad[:2], mode="circular"), lambda t: F.pad(t[None], pad[:2], mode="circular")[0], statics, (1,))
    if len(pad) == 2 and min(pad) == -1:
        # a sample cropped to nothing with something to wrap around: dense reads outside the
        # tensor there (a torch bug); ours raises, naming it, rather than read the next sample
        short = mj.nested_tensor([torch.randn(2, 1, dtype=F64), torch.randn(2, 4, dtype=F64)], ragged_dims=(2,))
        with pytest.raises(RuntimeError, match="sample 0"):
            F.pad(short, pad, mode="circular")
    if len(pad) == 2 and max(pad) == 2:
        # cropped to 1 and wrapped by 2: dense raises (an overlap error; with autograd it returns
        # values read twice); ours raises, naming the sample
        short = mj.nested_tensor([torch.randn(2, 5, dtype=F64), torch.randn(2, 2, dtype=F64)], ragged_dims=(2,))
        with pytest.raises(RuntimeError, match="sample 1 .* to 1 and wraps around it by more"):
            F.pad(short, pad, mode="circular")


def test_pads_of_one_batch_in_every_mode_and_size_read_their_own_rows():
    """The rows a pad along a ragged dim reads are cached per structure, mode and pads: one batch
    padded in turn in every mode, with other pads, and again, gives each call dense's result."""
    g = torch.Generator().manual_seed(3)
    comps = [torch.randn(2, n, generator=g, dtype=F64) for n in (3, 5, 4)]
    x = mj.nested_tensor(comps, ragged_dims=(2,))
    for _ in range(2):
        for mode in ("constant", "reflect", "replicate", "circular"):
            for pad in ((1, 2), (2, 1), (-1, 2)):
                if mode == "reflect" and pad == (-1, 2):
                    continue  # (dense refuses a reflection that crops and pads past the rest)
                out = F.pad(x, pad, mode=mode)
                for a, c in zip(out.unbind(), comps):
                    assert torch.equal(a, F.pad(c, pad, mode=mode)), (mode, pad)


def test_pad_errors_are_dense_errors_naming_the_sample():
    x = mj.nested_tensor([torch.randn(3, 4), torch.randn(3, 1)], ragged_dims=(2,))
    with pytest.raises(RuntimeError, match="sample 1"):
        F.pad(x, (1, 1), mode="reflect")  # reflect padding must be below each sample's size
    assert torch.equal(x.flip(0).unbind()[0], x.unbind()[1])  # the samples in reverse order


def test_constant_pad_with_a_zero_pair_for_the_batch_dim():
    """``F.pad(x, [0, 0, 0, 1, 0, 0])`` (MobileBERT's trigram input): the last pair is the batch
    dim's, ``(0, 0)`` as dense accepts; each sample padded by the rest."""
    comps = [torch.randn(n, 3, dtype=torch.float64) for n in (4, 1, 0)]
    x = mj.nested_tensor(comps)
    y = F.pad(x, [0, 0, 0, 1, 0, 0], value=2.0)
    for a, c in zip(y.unbind(), comps):
        torch.testing.assert_close(a, F.pad(c, [0, 0, 0, 1], value=2.0))
    with pytest.raises(NotImplementedError, match="batch dim"):
        F.pad(x, [0, 0, 0, 1, 1, 0])


_PAD_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.complex64]


@pytest.mark.parametrize("dtype", _PAD_DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 1), (0, 2, 1, 0)], ids=str)
def test_pad_dtypes_are_dense(pad, mode, dtype):
    """Every dtype as dense torch per sample: its values, or its own error where its kernel
    refuses the dtype (reflection padding of bool), along ragged and static dims, with a
    zero-size sample riding along for the pads that keep it empty."""
    g = torch.Generator().manual_seed(3)
    if len(pad) == 4:  # images: both dims ragged, or the width static
        shapes, raggeds = [(2, 2, 4), (2, 3, 4), (2, 4, 4)], ((2, 3), (2,))
    else:  # signals (B, C, j0), and tokens (B, j0, C) padded along their static dim
        shapes, raggeds = [(2, 4), (2, 3), (2, 5)], ((2,),)
    cases = [([(torch.randn(*sz, generator=g) * 5).to(dtype) for sz in shapes], rd) for rd in raggeds]
    if len(pad) == 2:
        lengths = (2, 0, 4) if mode == "constant" else (2, 1, 4)  # dense pads no empty dim but with constants
        cases.append(([(torch.randn(n, 3, generator=g) * 5).to(dtype) for n in lengths], (1,)))
    for comps, ragged in cases:
        x = mj.nested_tensor(comps, ragged_dims=ragged)
        try:
            want = [F.pad(c, pad, mode=mode) for c in comps]
        except Exception as e:
            with pytest.raises(type(e), match=re.escape(str(e).split("(): ")[-1][:30])):
                F.pad(x, pad, mode=mode)
            continue
        for a, w in zip(F.pad(x, pad, mode=mode).unbind(), want):
            assert a.dtype == w.dtype and torch.equal(a, w), (mode, pad, ragged)


@pytest.mark.parametrize("pad", [(0, 0, 0, "L-T"), (0, 0, "L-T", 0), (1, 2, 0, "L-T")], ids=["after", "before", "both dims"])
def test_pad_each_sample_to_a_length(pad):
    """``F.pad(x, (0, 0, 0, L - T))`` with ``T = x.shape[1]`` (collate code padding every sample to
    a fixed length): the pad amount is a ragged size, each sample padded by its own (it raised
    converting it to an int); dense per sample, values and gradients, an empty sample included; a
    length some sample exceeds raises naming it."""
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(n, 4, generator=g, requires_grad=True) for n in (3, 1, 0, 5)]
    x = mj.as_nested_tensor(leaves)
    T = x.shape[1]
    y = F.pad(x, [6 - T if p == "L-T" else p for p in pad], value=-1.0)
    refs = [F.pad(c, [6 - c.shape[0] if p == "L-T" else p for p in pad], value=-1.0) for c in leaves]
    assert_samples_and_grads(y, refs, leaves)
    with pytest.raises(ValueError, match="negative in sample 3"):
        F.pad(x, (0, 0, 0, 4 - T))
