"""Images held as per-image pieces between image-by-image ops (NOTE [ Per-image pieces ] in
``torch_multijagged/pieces.py``): a CNN chain — conv, group norm, activations, a residual add, a
strided conv, global pooling — against the dense ops on each image alone, with gradients to every
input and parameter, an image without pixels, second order, the autograd API on a tensor that
holds pieces, in-place writes, serialization, no leakage, dtypes and ``torch.compile``."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import torch_multijagged as mj
from torch_multijagged import pieces
from torch_multijagged.kernels import per_image

from _reference import few, seeds

F64 = torch.float64
C = 4


def _every_image_by_image(mp: pytest.MonkeyPatch) -> None:
    # the rule's thresholds are for speed; here every image goes image by image, so that small,
    # fast examples exercise the pieces
    mp.setattr(per_image, "PIXELS_PER_IMAGE", 0)
    mp.setattr(per_image, "HELD_PIXELS_PER_IMAGE", 0)
    mp.setattr(per_image, "MIN_CHANNELS", 0)
    mp.setattr(per_image, "CHANNELS_FIRST_FROM", 0)


@pytest.fixture
def small_images_go_image_by_image(monkeypatch):
    _every_image_by_image(monkeypatch)


def _params(seed=3, c=C, dtype=F64):
    g = torch.Generator().manual_seed(seed)

    def p(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(dtype).requires_grad_()

    return {"w1": p(c, c, 3, 3), "b1": p(c), "gw": p(c), "gb": p(c), "w2": p(2 * c, c, 3, 3), "b2": p(2 * c)}


def cnn(x, P, seen=None):
    """conv → group norm → ReLU → residual add → strided conv → tanh → global mean: works on a
    batch and on one ``(1, C, h, w)`` image alike. ``seen`` records which results held pieces."""
    y = F.conv2d(x, P["w1"], P["b1"], padding=1)
    z = F.relu(F.group_norm(y, 2, P["gw"], P["gb"], eps=0.1))
    r = z + y * 0.5
    d = torch.tanh(F.conv2d(r, P["w2"], P["b2"], stride=2, padding=1))
    if seen is not None:
        seen.extend(pieces.holds_pieces(t) for t in (y, z, r, d))
    return d.mean((-2, -1))


def _images(sizes, seed, c=C, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(c, h, w, generator=g, dtype=F64).to(dtype) for h, w in sizes]


def _batch(comps, grad=True):
    return torch.nested.nested_tensor([c.detach() for c in comps], layout=mj.multi_jagged, requires_grad=grad)


# both sides vary across the batch (an extra image unlike the first), so both spatial dims are
# ragged; often an image without pixels
image_sizes = st.lists(st.tuples(st.integers(1, 7), st.integers(1, 7)), min_size=1, max_size=3).map(
    lambda s: s + [(s[0][0] + 1, s[0][1] + 2)]).flatmap(lambda s: st.sampled_from([s, s + [(0, 3)], [(5, 0)] + s]))


def _per_image_check(fn, ref, comps, params, rtol=1e-7, atol=1e-7):
    """``fn`` on the batch of ``comps`` against ``ref`` on each image alone, ``(1, C, h, w)`` in.
    An image without pixels, which the dense ops refuse, gives an empty output (or NaN: a global
    mean of nothing, as dense). Then the gradients of a random cotangent per image reach the
    batch and every parameter as the reference's reach each image and the parameters."""
    x = _batch(comps)
    out = fn(x)
    outs = list(out.unbind())
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    refs = [ref(t[None])[0] if t.numel() else None for t in leaves]
    assert len(outs) == len(refs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        if r is None:
            assert o.numel() == 0 or bool(torch.isnan(o).all()), f"image {i} has no pixel: {o}"
        else:
            torch.testing.assert_close(o, r, rtol=rtol, atol=atol, msg=lambda m: f"image {i}: {m}")
    g = torch.Generator().manual_seed(1)
    cots = [None if r is None else torch.randn(r.shape, generator=g, dtype=F64).to(r.dtype) for r in refs]
    got = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots) if c is not None), [x, *params])
    want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cots) if c is not None), [*leaves, *params],
                               allow_unused=True, materialize_grads=True)
    for i, (a, b) in enumerate(zip(got[0].unbind(), want[: len(leaves)])):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"grad of image {i}: {m}")
    for k, (a, b) in enumerate(zip(got[1:], want[len(leaves):])):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"grad of parameter {k}: {m}")
    return out


def _check_cnn(comps, P, rtol=1e-7, atol=1e-7):
    seen: list[bool] = []
    out = _per_image_check(lambda t: cnn(t, P, seen), lambda t: cnn(t, P), comps, list(P.values()), rtol, atol)
    assert all(seen), f"every intermediate holds pieces: {seen}"
    assert not isinstance(out, mj.MultiJaggedTensor) and out.shape == (len(comps), P["w2"].shape[0])


@few(8)
@given(sizes=image_sizes, seed=seeds)
def test_cnn_chain_per_image_with_gradients(sizes, seed):
    with pytest.MonkeyPatch.context() as mp:
        _every_image_by_image(mp)
        _check_cnn(_images(sizes, seed), _params(seed % 7))


def test_cnn_chain_at_the_rule_s_default_thresholds():
    # large enough for the default rule (≥ 1,024 pixels per image on average, ≥ 16 channels)
    sizes = [(40, 40), (0, 7), (36, 45), (38, 34)]
    assert per_image.per_image_applies(sizes, 16)
    _check_cnn(_images(sizes, 0, c=16), _params(0, c=16), rtol=1e-6, atol=1e-6)


def test_pieces_of_images_made_small_go_back_to_the_canvas():
    """Images held as pieces go on image by image while they are not small; a strided conv that
    makes them small (below ``HELD_PIXELS_PER_IMAGE`` on average) runs on the canvas, its result
    packed, as the same conv of pixel rows would: a network that shrinks its images batches its
    small layers. The chain equals the dense ops on each image, with gradients."""
    sizes = [(40, 40), (0, 9), (36, 44), (38, 35)]
    assert per_image.per_image_applies(sizes, 16)
    P = _params(4, c=16)
    seen: list[bool] = []

    def net(t, record=False):
        def rec(u):
            if record:  # before the next op reads it (reading the values packs the pieces)
                seen.append(pieces.holds_pieces(u))
            return u

        a = rec(F.relu(F.conv2d(t, P["w1"], padding=1)))  # images of ~1,100 px on average: image by image
        b = rec(F.conv2d(a, P["w1"], stride=2, padding=1))  # to ~280 px
        c = rec(F.conv2d(torch.tanh(b), P["w1"], stride=2, padding=1))  # from ~280 px, held: image by image
        d = rec(F.conv2d(c, P["w1"], padding=1))  # from ~70 px: the canvas
        return d.mean((-2, -1))

    _per_image_check(lambda t: net(t, True), net, _images(sizes, 2, c=16), [P["w1"]], rtol=1e-6, atol=1e-6)
    assert seen == [True, True, True, False], seen


@pytest.mark.parametrize("case", ["large output", "strided to small", "16 channels out", "small images"])
def test_thin_input_conv_goes_image_by_image_when_its_output_does(case):
    """A conv of a thin input (3 channels: colours) goes image by image, on contiguous images, when
    its output images would on their own in the loop's format (``thin_per_image_applies``:
    ≥ ``CHANNELS_FIRST_FROM`` output channels, large output images); its result then holds
    contiguous pieces. Otherwise it runs on the canvas. Either way the result and every gradient
    are the dense conv's on each image."""
    sizes = [(20, 18), (0, 5), (16, 21)] if case == "small images" else [(40, 40), (0, 7), (36, 45), (38, 34)]
    c_out = 16 if case == "16 channels out" else 32
    stride = 4 if case == "strided to small" else 1
    g = torch.Generator().manual_seed(5)
    w = torch.randn(c_out, 3, 3, 3, generator=g, dtype=F64).requires_grad_()
    b = torch.randn(c_out, generator=g, dtype=F64).requires_grad_()
    seen = []

    def net(t, record=False):
        y = F.conv2d(t, w, b, stride=stride, padding=1)
        if record:
            seen.append(pieces.holds_pieces(y))
            seen.extend(p.is_contiguous() for p in pieces.split(y) if p is not None)
        return torch.tanh(y).mean((-2, -1))

    _per_image_check(lambda t: net(t, True), net, _images(sizes, 3, c=3), [w, b], rtol=1e-6, atol=1e-6)
    held = case == "large output"
    assert seen[0] == held and (not held or all(seen[1:])), seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dtypes_as_the_dense_ops(small_images_go_image_by_image, dtype):
    comps = _images([(5, 6), (0, 2), (7, 3)], 0, dtype=dtype)
    P = _params(1, dtype=dtype)
    out = cnn(_batch(comps), P)
    assert out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for i in (0, 2):
        torch.testing.assert_close(out[i], cnn(comps[i].unsqueeze(0), P)[0], **tol)


def test_second_order_gradients(small_images_go_image_by_image):
    comps = _images([(4, 5), (0, 2), (3, 3)], 2)
    P = _params(2)
    x = _batch(comps)
    leaves = [c.detach().clone().requires_grad_() for c in comps]

    def first(t):
        y = torch.tanh(F.group_norm(F.conv2d(t, P["w1"], padding=1), 2, P["gw"], P["gb"], eps=0.1))
        return (y * y).sum() if not isinstance(y, mj.MultiJaggedTensor) else (y * y).sum()

    gx, = torch.autograd.grad(first(x), [x], create_graph=True)
    g2 = torch.autograd.grad((gx * gx).sum(), [x, P["w1"], P["gw"]])
    refs = [torch.autograd.grad(first(c.unsqueeze(0)), [c], create_graph=True)[0] for c in leaves if c.numel()]
    live = [c for c in leaves if c.numel()]
    want = torch.autograd.grad(sum((r * r).sum() for r in refs), [*live, P["w1"], P["gw"]])
    for a, r in zip([t for t in gx.unbind() if t.numel()], refs):
        torch.testing.assert_close(a, r)
    for a, b in zip([t for t in g2[0].unbind() if t.numel()], want[: len(live)]):
        torch.testing.assert_close(a, b)
    for a, b in zip(g2[1:], want[len(live):]):
        torch.testing.assert_close(a, b)


def test_autograd_api_on_a_tensor_holding_pieces(small_images_go_image_by_image):
    comps = _images([(4, 5), (0, 2), (3, 3)], 3)
    P = _params(3)
    x = _batch(comps)

    def loss_of(t):
        # consumers reading the pieces (relu, a product, the global mean) and the values
        if isinstance(t, mj.MultiJaggedTensor):
            return F.relu(t).mean((2, 3)).sum() + (t * t).sum() + t.values().sum()
        return F.relu(t).mean((2, 3)).sum() + (t * t).sum() + t.sum()

    refs = []
    for c in comps:
        if not c.numel():
            refs.append(torch.zeros(C, *c.shape[1:], dtype=F64))
            continue
        yi = F.conv2d(c.unsqueeze(0), P["w1"], P["b1"], padding=1).detach().requires_grad_()
        refs.append(torch.autograd.grad(loss_of(yi), [yi])[0][0])

    y = F.conv2d(x, P["w1"], P["b1"], padding=1)
    assert pieces.holds_pieces(y)
    gy, = torch.autograd.grad(loss_of(y), [y])
    y = F.conv2d(x, P["w1"], P["b1"], padding=1)
    y.retain_grad()
    hooked = []
    y.register_hook(lambda g: hooked.append(g))
    loss_of(y).backward()
    assert len(hooked) == 1, "the hook ran once"
    for got in (gy, y.grad, hooked[0]):
        assert isinstance(got, mj.MultiJaggedTensor)
        for a, b in zip(got.unbind(), refs):
            torch.testing.assert_close(a, b)


def test_in_place_write_is_seen_by_later_ops(small_images_go_image_by_image):
    comps = _images([(4, 5), (3, 3)], 4)
    P = _params(4)
    with torch.no_grad():
        y = F.conv2d(_batch(comps, grad=False), P["w1"], padding=1)
        assert pieces.holds_pieces(y)
        y.mul_(-2.0)  # new pieces
        assert pieces.holds_pieces(y)
        y.values().add_(0.5)  # a write through the values: packed first, the pieces gone
        assert not pieces.holds_pieces(y)
        out = F.relu(y)
    for o, c in zip(out.unbind(), comps):
        torch.testing.assert_close(o[None], F.relu(-2.0 * F.conv2d(c[None], P["w1"], padding=1) + 0.5))
    # with autograd: the written tensor's gradient still reaches the input, through either write
    for write in (lambda t: t.add_(1.0), lambda t: t.clamp_(min=-0.5).add_(1.5)):
        x = _batch(comps)
        y = F.conv2d(x, P["w1"], padding=1)
        write(y)
        gx, = torch.autograd.grad(F.relu(y).sum(), [x])
        for g, c in zip(gx.unbind(), comps):
            ci = c.clone().requires_grad_()
            yi = F.conv2d(ci[None], P["w1"], padding=1)
            ref, = torch.autograd.grad(F.relu(write(yi.clone())).sum(), [ci])
            torch.testing.assert_close(g, ref)


def test_read_values_serialise_and_copy(small_images_go_image_by_image):
    comps = _images([(4, 5), (0, 2), (3, 3)], 5)
    P = _params(5)
    with torch.no_grad():
        y = F.relu(F.conv2d(_batch(comps, grad=False), P["w1"], P["b1"], padding=1))
    refs = [F.relu(F.conv2d(c[None], P["w1"], P["b1"], padding=1))[0] if c.numel() else None for c in comps]
    assert pieces.holds_pieces(y)
    _ = (y.shape, y.offsets(), y.ragged_dims)  # metadata reads do not pack
    assert pieces.holds_pieces(y)
    buf = io.BytesIO()
    torch.save(y, buf)
    buf.seek(0)
    for t in (torch.load(buf), copy.deepcopy(y), y):
        for o, r in zip(t.unbind(), refs):
            if r is not None:
                torch.testing.assert_close(o, r)
            else:
                assert o.numel() == 0
    v = y.values()
    assert v.shape == (sum(c.shape[1] * c.shape[2] for c in comps), C) and not pieces.holds_pieces(y)
    torch.testing.assert_close(v, torch.cat([r.permute(1, 2, 0).reshape(-1, C) for r in refs if r is not None]))


def test_no_leakage_between_images(small_images_go_image_by_image):
    comps = _images([(4, 5), (3, 6), (5, 3)], 6)
    P = _params(6)
    other = [c.clone() for c in comps]
    other[1] = other[1] * 3 + 1
    with torch.no_grad():
        a, b = cnn(_batch(comps, grad=False), P), cnn(_batch(other, grad=False), P)
    torch.testing.assert_close(a[[0, 2]], b[[0, 2]], rtol=0, atol=0)
    assert not torch.allclose(a[1], b[1])


def test_compiled_code_reads_the_packed_values(small_images_go_image_by_image):
    comps = _images([(4, 5), (3, 3)], 7)
    P = _params(7)
    x = _batch(comps)
    z = torch.sin(F.conv2d(x, P["w1"], padding=1))
    assert pieces.holds_pieces(z)
    compiled = torch.compile(lambda t: (t * 2).sum((2, 3)), backend="aot_eager")
    torch.testing.assert_close(compiled(z), (z.detach() * 2).sum((2, 3)))


# ----------------------------------------------------------------------------- batch norm
def _pixels(img):
    return img.flatten(1).t()  # (h·w, C)


def _bn_over_pixels(images, rm, rv, w, b, training, momentum=0.1):
    """Dense batch norm over the concatenated pixels of ``images`` ``(C, h, w)``, split back."""
    out = F.batch_norm(torch.cat([_pixels(i) for i in images]), rm, rv, w, b, training, momentum)
    return [o.t().reshape(i.shape) for o, i in zip(out.split([i.shape[1] * i.shape[2] for i in images]), images)]


@pytest.mark.parametrize("from_rows", [True, False], ids=["rows", "pieces"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_batch_norm_image_by_image_is_dense_over_all_pixels(small_images_go_image_by_image, from_rows, training,
                                                            affine):
    """Batch norm of images held as pieces (a conv's) or large enough to go image by image reads
    each image as held and gives contiguous pieces: the batch's statistics over every pixel, as
    dense batch norm over the concatenated pixels, with the gradients of every input, the running
    statistics moved as dense moves them, and an image without pixels."""
    comps = _images([(4, 5), (0, 3), (3, 3), (2, 6)], 11)
    P = _params(11)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(C, generator=g, dtype=F64).requires_grad_() if affine else None
    b = torch.randn(C, generator=g, dtype=F64).requires_grad_() if affine else None
    rm, rv = torch.randn(C, generator=g, dtype=F64), torch.rand(C, generator=g, dtype=F64) + 0.5
    rm_ref, rv_ref = rm.clone(), rv.clone()
    x = _batch(comps)
    src = x if from_rows else F.conv2d(x, P["w1"], padding=1)
    y = F.batch_norm(src, rm, rv, w, b, training, 0.3)
    assert pieces.holds_pieces(y)
    parts = pieces.split(y)
    assert parts[1] is None and all(t.is_contiguous() for t in parts if t is not None)
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    live = [i for i, c in enumerate(comps) if c.numel()]
    srcs = [leaves[i] if from_rows else F.conv2d(leaves[i][None], P["w1"], padding=1)[0] for i in live]
    refs = _bn_over_pixels(srcs, rm_ref, rv_ref, w, b, training, 0.3)
    outs = y.unbind()
    for i, r in zip(live, refs):
        torch.testing.assert_close(outs[i], r, msg=lambda m: f"image {i}: {m}")
    assert outs[1].numel() == 0
    torch.testing.assert_close(rm, rm_ref)
    torch.testing.assert_close(rv, rv_ref)
    cots = [torch.randn(r.shape, generator=g, dtype=F64) for r in refs]
    params = [p for p in (w, b) if p is not None] + ([] if from_rows else [P["w1"]])
    got = torch.autograd.grad(sum((outs[i] * c).sum() for i, c in zip(live, cots)), [x, *params])
    want = torch.autograd.grad(sum((r * c).sum() for r, c in zip(refs, cots)), [*(leaves[i] for i in live), *params])
    for i, a in zip(live, want):
        torch.testing.assert_close(got[0].unbind()[i], a, msg=lambda m: f"grad of image {i}: {m}")
    for k, (a, c) in enumerate(zip(got[1:], want[len(live):])):
        torch.testing.assert_close(a, c, msg=lambda m: f"grad of parameter {k}: {m}")
    if training:  # a loss of one image: the others' gradients come through the batch's statistics
        y = F.batch_norm(src if from_rows else F.conv2d(x, P["w1"], padding=1), None, None, w, b, True)
        refs = _bn_over_pixels([leaves[i] if from_rows else F.conv2d(leaves[i][None], P["w1"], padding=1)[0]
                                for i in live], None, None, w, b, True)
        got = torch.autograd.grad((y.unbind()[0] * cots[0]).sum(), [x])[0]
        want = torch.autograd.grad((refs[0] * cots[0]).sum(), [leaves[i] for i in live])
        for i, a in zip(live, want):
            assert a.abs().max() > 0
            torch.testing.assert_close(got.unbind()[i], a, msg=lambda m: f"grad of image {i}, one image's loss: {m}")


def test_few_channels_keep_each_image_s_format(small_images_go_image_by_image, monkeypatch):
    """Below ``CHANNELS_FIRST_FROM`` channels, convolutions and batch norm image by image keep
    each image's format (channels-last views of pixel rows stay channels last: oneDNN's
    channels-last kernels are the faster ones there); group norm always runs on contiguous images.
    The results are the dense ops' on each image either way."""
    monkeypatch.setattr(per_image, "CHANNELS_FIRST_FROM", C + 1)
    comps = _images([(4, 5), (0, 3), (3, 3)], 8)
    P = _params(8)
    x = _batch(comps, grad=False)
    y = F.conv2d(x, P["w1"], padding=1)
    z = F.batch_norm(x, None, None, training=True)
    g = F.group_norm(x, 2)
    for t, contiguous in ((y, False), (z, False), (g, True)):
        parts = [p for p in pieces.split(t) if p is not None]
        assert all(p.is_contiguous() == contiguous for p in parts)
    for i in (0, 2):
        torch.testing.assert_close(y.unbind()[i], F.conv2d(comps[i][None], P["w1"], padding=1)[0])
    refs = _bn_over_pixels([comps[0], comps[2]], None, None, None, None, True)
    for i, r in zip((0, 2), refs):
        torch.testing.assert_close(z.unbind()[i], r)
    monkeypatch.setattr(per_image, "CHANNELS_FIRST_FROM", C)
    assert all(p.is_contiguous() for p in pieces.split(F.conv2d(x, P["w1"], padding=1)) if p is not None)


@pytest.mark.parametrize("create_graph", [False, True], ids=["first_order", "recorded"])
def test_batch_norm_images_kernel_gradient_of_images_without_one(create_graph):
    """The kernel with an output no loss reads (its gradient None): that image's gradient still
    comes through the batch's statistics, in both forms of the backward."""
    from torch_multijagged.kernels.norms import batch_norm_images

    g = torch.Generator().manual_seed(6)
    imgs = [torch.randn(1, C, h, w, generator=g, dtype=F64).requires_grad_() for h, w in [(3, 4), (2, 5), (4, 4)]]
    w, b = torch.rand(C, generator=g, dtype=F64) + 0.5, torch.randn(C, generator=g, dtype=F64)
    outs, _, _ = batch_norm_images(imgs, w, b, 1e-5)
    cot = torch.randn(outs[1].shape, generator=g, dtype=F64)
    got = torch.autograd.grad((outs[1] * cot).sum(), imgs, create_graph=create_graph)
    refs = _bn_over_pixels([i[0] for i in imgs], None, None, w, b, True)
    want = torch.autograd.grad((refs[1] * cot[0]).sum(), imgs)
    for k, (a, r) in enumerate(zip(got, want)):
        assert r.abs().max() > 0
        torch.testing.assert_close(a, r, msg=lambda m: f"image {k}: {m}")


@pytest.mark.parametrize("from_rows", [True, False], ids=["rows", "pieces"])
def test_batch_norm_image_by_image_second_order(small_images_go_image_by_image, from_rows):
    """Second-order gradients of batch norm image by image (its backward's differentiable form),
    with an image whose output the loss leaves out: its gradient still flows through the batch's
    statistics."""
    comps = _images([(3, 2), (0, 2), (2, 2), (1, 3)], 5)
    P = _params(5)
    w1 = P["w1"]
    g = torch.Generator().manual_seed(4)
    w = torch.randn(C, generator=g, dtype=F64).requires_grad_()
    b = torch.randn(C, generator=g, dtype=F64).requires_grad_()
    live = [i for i, c in enumerate(comps) if c.numel()]

    def ours(*t):
        x = mj.as_nested_tensor(list(t[:-3]), ragged_dims=(2, 3))
        src = x if from_rows else F.conv2d(x, t[-1], padding=1)
        y = F.batch_norm(src, None, None, t[-3], t[-2], True)
        assert pieces.holds_pieces(y)
        return (torch.tanh(y).unbind()[0] * 1.5).sum((1, 2)) + torch.sin(y.unbind()[2]).sum((1, 2))

    leaves = [c.detach().clone().requires_grad_() for c in comps]
    torch.autograd.gradgradcheck(ours, (*leaves, w, b, w1))

    def ref(*t):
        srcs = [t[i] if from_rows else F.conv2d(t[i][None], t[-1], padding=1)[0] for i in live]
        ys = _bn_over_pixels(srcs, None, None, t[-3], t[-2], True)
        return (torch.tanh(ys[0]) * 1.5).sum((1, 2)) + torch.sin(ys[1]).sum((1, 2))

    args = (*leaves, w, b, w1)
    cot = torch.randn(ours(*args).shape, generator=g, dtype=F64)
    gs = torch.autograd.grad((ours(*args) * cot).sum(), args, create_graph=True, allow_unused=True)
    rs = torch.autograd.grad((ref(*args) * cot).sum(), args, create_graph=True, allow_unused=True)
    want = [torch.zeros_like(a) if r is None else r for a, r in zip(args, rs)]
    gs = [torch.zeros_like(a) if r is None else r for a, r in zip(args, gs)]
    for k, (a, r) in enumerate(zip(gs, want)):
        torch.testing.assert_close(a, r, msg=lambda m: f"grad {k}: {m}")
    g2 = torch.autograd.grad(sum((a * a).sum() for a in gs if a.requires_grad), args, allow_unused=True)
    r2 = torch.autograd.grad(sum((r * r).sum() for r in want if r.requires_grad), args, allow_unused=True)
    for k, (a, r) in enumerate(zip(g2, r2)):
        z = torch.zeros_like(args[k])
        torch.testing.assert_close(z if a is None else a, z if r is None else r, msg=lambda m: f"grad² {k}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_norm_image_by_image_dtypes(small_images_go_image_by_image, dtype):
    """16-bit images are normalised in float32 (as the packed path) and come out in their dtype;
    float32 within rounding of the float64 computation."""
    comps = _images([(5, 6), (0, 2), (7, 3)], 0)
    w, b = torch.rand(C, dtype=F64) + 0.5, torch.randn(C, dtype=F64)
    x = _batch([c.to(dtype) for c in comps], grad=False)
    y = F.batch_norm(x, None, None, w.to(dtype), b.to(dtype), True)
    assert y.dtype == dtype and pieces.holds_pieces(y)
    refs = _bn_over_pixels([comps[0], comps[2]], None, None, w, b, True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for i, r in zip((0, 2), refs):
        torch.testing.assert_close(y.unbind()[i].double(), r, **tol)


def test_batch_norm_image_by_image_refuses_what_dense_refuses(small_images_go_image_by_image):
    one = _batch([torch.randn(C, 1, 1, dtype=F64), torch.zeros(C, 0, 2, dtype=F64)])
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(one, None, None, training=True)
    y = F.batch_norm(one, torch.zeros(C, dtype=F64), torch.ones(C, dtype=F64), training=False)  # eval: fine
    torch.testing.assert_close(y.unbind()[0], one.unbind()[0].detach() / (1 + 1e-5) ** 0.5)
    with pytest.raises(RuntimeError, match="running_mean must be defined"):
        F.batch_norm(_batch(_images([(3, 3)], 0)), None, None, training=False)


def test_batch_norm_cnn_image_by_image_equals_the_packed_path():
    """A BatchNorm CNN (conv → batch norm → ReLU, twice, a strided conv, global mean) on large
    images, image by image at the default thresholds, gives what the packed path gives (every
    op over packed rows and the canvas), forward and gradients."""
    sizes = [(40, 38), (0, 5), (37, 41), (44, 35)]
    assert per_image.per_image_applies(sizes, 16)
    comps = _images(sizes, 3, c=3)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                              torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3, stride=2, padding=1)).double()

    def run():
        for m in net:
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
        x = _batch(comps)
        y = net(x)
        held = pieces.holds_pieces(y)
        out = y.mean((-2, -1))
        grads = torch.autograd.grad((out * torch.arange(8.0, dtype=F64)).sum(), [x, *net.parameters()])
        return held, out, grads, [m.running_var.clone() for m in net if isinstance(m, torch.nn.BatchNorm2d)]

    held, out, grads, rvs = run()
    assert held
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(per_image, "PIXELS_PER_IMAGE", 10**9)
        held_p, out_p, grads_p, rvs_p = run()
    assert not held_p
    torch.testing.assert_close(out, out_p, equal_nan=True)  # the image without pixels: the mean of nothing
    for k, (a, b) in enumerate(zip(grads, grads_p)):
        torch.testing.assert_close(a, b, msg=lambda m: f"grad {k}: {m}")
    for a, b in zip(rvs, rvs_p):
        torch.testing.assert_close(a, b)


def test_packed_gradient_reaches_contiguous_pieces_contiguous(small_images_go_image_by_image):
    """A gradient read from packed rows is handed to contiguous pieces as contiguous images (an
    elementwise backward mixing a channels-last gradient with a contiguous saved input is several
    times slower), to channels-last pieces as it is, and an expanded one (a global mean's) is not
    materialised."""
    comps = _images([(4, 5), (0, 2), (3, 3)], 1)
    grad = _batch(comps, grad=False)
    got = pieces._grads_as(grad, [True, False])
    assert got[0].is_contiguous() and torch.equal(got[0], grad.unbind()[0][None])
    assert not got[1].is_contiguous() and got[1].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got[1], grad.unbind()[2][None])
    expanded = torch.ones(1, C, 1, 1, dtype=F64).expand(1, C, 4, 5)
    held = pieces.from_pieces([expanded, None, torch.ones(1, C, 3, 3, dtype=F64)], grad._partition, grad._ragged_dims,
                              C, F64, grad.device)
    got = pieces._grads_as(held, [True, True])
    assert got[0].stride() == expanded.stride() and got[0].data_ptr() == expanded.data_ptr()


@pytest.mark.parametrize("pool", [
    lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True),
    lambda t: F.max_pool2d(t, 2),
    lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
    lambda t: F.avg_pool2d(t, 2, ceil_mode=True, divisor_override=3),
], ids=["max_3_2_1_ceil", "max_2", "avg_exclude_pad", "avg_divisor"])
def test_pooling_between_image_by_image_ops(small_images_go_image_by_image, pool):
    comps = _images([(6, 7), (0, 3), (5, 4), (8, 5)], 8)
    P = _params(8)

    def f(t, seen=None):
        y = F.relu(F.conv2d(t, P["w1"], P["b1"], padding=1))
        z = pool(y)
        if seen is not None:
            seen.extend(pieces.holds_pieces(a) for a in (y, z))
        return F.conv2d(z, P["w2"], padding=1)

    seen: list[bool] = []
    _per_image_check(lambda t: f(t, seen), f, comps, [P["w1"], P["w2"]])
    assert seen and all(seen)


def test_unet_with_a_skip_connection_at_default_thresholds():
    """A small U-Net as written for dense images: GroupNorm blocks, max pooling, bilinear
    upsampling to the skip's own sizes (``size=a.shape[-2:]``), a channel ``cat`` with the skip, a
    1×1 head — per image, with gradients to the input and the first conv."""
    torch.manual_seed(0)
    c = 16

    class UNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            nn = torch.nn
            self.e1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(4, c), nn.ReLU())
            self.e2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.GroupNorm(4, 2 * c), nn.ReLU())
            self.d1 = nn.Sequential(nn.Conv2d(3 * c, c, 3, padding=1), nn.GroupNorm(4, c), nn.ReLU())
            self.out = nn.Conv2d(c, 2, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(F.max_pool2d(a, 2))
            u = F.interpolate(b, size=a.shape[-2:], mode="bilinear", align_corners=False)
            return self.out(self.d1(torch.cat([a, u], 1)))

    net = UNet().double()
    _per_image_check(net, net, _images([(40, 36), (33, 45), (0, 4), (38, 29)], 9, c=3), [net.e1[0].weight, net.d1[0].weight])


@pytest.mark.parametrize("form", ["F.relu(inplace=True)", "Tensor.relu_", "torch.relu_", "F.silu(inplace=True)"])
def test_in_place_activation_keeps_the_pieces(small_images_go_image_by_image, form):
    """``nn.ReLU(inplace=True)`` as torchvision-style code writes it: the tensor keeps holding
    pieces (new ones), returns itself, bumps its version, and its history is rebased as an
    in-place op's; a conv that saved the tensor before the write still differentiates against
    the old values."""
    act = {"F.relu(inplace=True)": lambda t: F.relu(t, inplace=True), "Tensor.relu_": lambda t: t.relu_(),
           "torch.relu_": torch.relu_, "F.silu(inplace=True)": lambda t: F.silu(t, inplace=True)}[form]
    dense_act = F.silu if "silu" in form else F.relu
    comps = _images([(5, 6), (0, 3), (4, 7)], 10)
    P = _params(10)

    def f(t, inplace):
        y = F.conv2d(t, P["w1"], padding=1)
        z = F.conv2d(y, P["w2"], padding=1)  # saves y before the write
        if inplace:
            v0 = y._version
            y2 = act(y)
            assert y2 is y and y._version > v0 and pieces.holds_pieces(y)
        else:
            y2 = dense_act(y)
        return torch.cat([y2, z[:, :C]], 1).mean((2, 3)) if isinstance(y2, mj.MultiJaggedTensor) else \
            torch.cat([y2, z[:, :C]], 1).mean((2, 3))

    _per_image_check(lambda t: f(t, True), lambda t: f(t, False), comps, [P["w1"], P["w2"]])
    with torch.no_grad():
        y = F.conv2d(_batch(comps, grad=False), P["w1"], padding=1)
        ref = dense_act(F.conv2d(_batch(comps, grad=False), P["w1"], padding=1).values())  # (reading y's values would pack it)
        act(y)
        assert pieces.holds_pieces(y)
        torch.testing.assert_close(y.values(), ref)
    with torch.no_grad():
        leaf = F.conv2d(_batch(comps, grad=False), P["w1"], padding=1)
    leaf.requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        act(leaf)


def test_in_place_residual_add_keeps_the_pieces(small_images_go_image_by_image):
    """torchvision's ``out += identity`` then ``relu(inplace=True)``, and ``mul_`` by a scalar, on
    tensors holding pieces: new pieces, the values and gradients of the out-of-place block; a
    tensor added to itself; another dtype takes the general in-place path (dense's cast)."""
    comps = _images([(5, 6), (0, 3), (4, 7)], 11)
    P = _params(11)

    def block(t, inplace):
        idn = F.conv2d(t, P["w1"], padding=1)
        out = F.group_norm(F.conv2d(idn, P["w1"], padding=1), 2, P["gw"], P["gb"])
        if inplace:
            out += idn
            out.mul_(0.5)
            out.add_(out)
            assert pieces.holds_pieces(out)
            out = F.relu(out, inplace=True)
        else:
            out = F.relu(((out + idn) * 0.5) * 2)
        return out.mean((2, 3))

    _per_image_check(lambda t: block(t, True), lambda t: block(t, False), comps, [P["w1"], P["gw"]])
    with torch.no_grad():
        y = F.conv2d(_batch(comps, grad=False), P["w1"], padding=1).float()
        y64 = F.conv2d(_batch(comps, grad=False), P["w1"], padding=1)
        ref = (y.values().double() + y64.values()).float()
        y += y64
        assert y.dtype == torch.float32
        torch.testing.assert_close(y.values(), ref)


def test_channel_cat_of_images_holding_pieces(small_images_go_image_by_image):
    """``torch.cat([a, u, x], 1)`` (a U-Net skip, a DenseNet block) where some operands hold
    pieces and others pixel rows: each image's own cat, pieces out; values and gradients to every
    operand's source, an image without pixels."""
    comps = _images([(6, 5), (0, 3), (3, 7)], 12)
    P = _params(12)

    def f(t):
        a = F.relu(F.conv2d(t, P["w1"], P["b1"], padding=1))
        u = F.interpolate(F.max_pool2d(a, 2, ceil_mode=True), size=a.shape[-2:])
        c = torch.cat([a, u, t], 1)
        if isinstance(c, mj.MultiJaggedTensor):
            # u: interpolate of pieces goes image by image (NOTE [ Resampling image by image ]); t: pixel rows
            assert pieces.holds_pieces(a) and pieces.holds_pieces(u) and not pieces.holds_pieces(t) and pieces.holds_pieces(c)
        return F.conv2d(c, torch.cat([P["w2"], P["w2"], P["w2"]], 1), padding=1)

    _per_image_check(f, f, comps, [P["w1"], P["w2"]])


@pytest.mark.parametrize("largest_last", [True, False])
def test_in_size_order_calls_by_size_and_returns_in_image_order(largest_last):
    """The per-image calls run by image size (which sets the order of their backwards, and so
    the backward's peak memory); the results stay in image order."""
    parts = [torch.zeros(1, 2, h, w) for h, w in [(4, 4), (1, 1), (9, 2), (2, 3)]] + [None]
    calls: list[int] = []

    def fn(i):
        calls.append(i)
        return None if parts[i] is None else parts[i] + i

    out = pieces.in_size_order(fn, parts, largest_last=largest_last)
    by_size = [4, 1, 3, 0, 2]  # increasing numel, the image without pixels first
    assert calls == (by_size if largest_last else by_size[::-1])
    assert out[4] is None and all(bool((o == i).all()) for i, o in enumerate(out[:4]))


def test_backward_runs_the_largest_image_s_convolution_first(small_images_go_image_by_image):
    """A convolution's per-image backwards start with the largest image, an elementwise op's with
    the smallest (``pieces.in_size_order``): the order in which the backward calls aten's
    ``convolution_backward`` and ``threshold_backward`` (ReLU's), read from the images' sizes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes = [(3, 4), (9, 8), (0, 2), (5, 5)]
    seen: list[tuple[str, tuple[int, int]]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.convolution_backward.default, torch.ops.aten.threshold_backward.default):
                seen.append((func.__name__, tuple(args[0].shape[-2:])))
            return func(*args, **(kwargs or {}))

    x = _batch(_images(sizes, 2))
    y = F.relu(F.conv2d(x, _params(2)["w1"], padding=1))
    loss = y.mean((-2, -1)).sum()
    with Record():
        loss.backward()
    assert [hw for f, hw in seen if f.startswith("threshold")] == [(3, 4), (5, 5), (9, 8)]
    assert [hw for f, hw in seen if f.startswith("convolution")] == [(9, 8), (5, 5), (3, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_global_mean_of_pieces_is_aten_mean_bit_for_bit(small_images_go_image_by_image, dtype):
    """``mean`` over both spatial dims of a tensor holding pieces is aten's ``mean`` of each image
    bit for bit (float32 / float64 take the sum over the pixel count, which is what aten's CPU
    mean computes), and its gradient is dense's."""
    comps = _images([(7, 5), (0, 3), (16, 13)], 4, dtype=dtype)
    P = _params(4, dtype=dtype)
    x = _batch(comps)
    y = F.conv2d(x, P["w1"], padding=1)
    assert pieces.holds_pieces(y)
    out = y.mean((-2, -1))
    g = torch.randn(out.shape, dtype=F64).to(dtype)
    (gx,) = torch.autograd.grad(out, x, g)
    parts = pieces.split(y)
    # bfloat16: the loop's convolution backward may take another oneDNN kernel than the pieces'
    # (a few ulps apart on gradients near zero, CPU-dependent)
    tol = (dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12) if dtype == F64
           else dict(rtol=1.6e-2, atol=2e-4))
    for i in (0, 2):
        assert torch.equal(out[i], parts[i].detach().mean((-2, -1))[0]), i  # aten's mean of the same image
        leaf = comps[i].detach().clone().requires_grad_()
        ref = F.conv2d(leaf[None], P["w1"], padding=1).mean((-2, -1))[0]
        torch.testing.assert_close(out[i], ref, **tol)
        (gref,) = torch.autograd.grad(ref, leaf, g[i])
        torch.testing.assert_close(gx.unbind()[i], gref, **tol)


@pytest.mark.parametrize("from_rows", [True, False], ids=["rows", "pieces"])
def test_group_norm_image_by_image_runs_on_channels_first_images(small_images_go_image_by_image, from_rows):
    """Group norm image by image hands aten each image in the contiguous (channels-first) format a
    user's loop has, whether it reads views of pixel rows (channels last) or a conv's pieces
    (contiguous): its pieces come out contiguous, with the bits of dense group norm on each
    contiguous image, forward and backward (aten's channels-last kernel is another, slower one)."""
    comps = _images([(9, 7), (0, 3), (6, 11)], 5, dtype=torch.float32)
    P = _params(5, dtype=torch.float32)
    x = _batch(comps)
    src = x if from_rows else F.conv2d(x, P["w1"], padding=1)
    assert pieces.holds_pieces(src) != from_rows
    images = [None if p is None else p.detach() for p in pieces.split(src)]
    # views of pixel rows are channels last; a conv's pieces contiguous (it ran on contiguous images)
    assert images[0] is not None and images[0].is_contiguous() != from_rows
    y = F.group_norm(src, 2, P["gw"], P["gb"])
    assert pieces.holds_pieces(y)
    parts = pieces.split(y)
    assert parts[1] is None and all(p.is_contiguous() for p in parts if p is not None)
    g = torch.randn(y.values().shape, generator=torch.Generator().manual_seed(1))
    gs, gw = torch.autograd.grad(y.values(), (src, P["gw"]), g)
    gg = iter(torch.split(g, [c.shape[1] * c.shape[2] for c in comps]))
    gw_ref = torch.zeros_like(P["gw"])
    for i, img in enumerate(images):
        gi = next(gg)
        if img is None:
            continue
        leaf = img.contiguous().requires_grad_()
        ref = F.group_norm(leaf, 2, P["gw"], P["gb"])
        assert torch.equal(parts[i], ref.detach()), i
        gl, gwi = torch.autograd.grad(ref, (leaf, P["gw"]), gi.view(*img.shape[2:], -1).permute(2, 0, 1)[None])
        assert torch.equal(gs.unbind()[i], gl[0]), i
        gw_ref += gwi
    torch.testing.assert_close(gw, gw_ref)


@pytest.mark.parametrize("unused", [False, True], ids=["all_images", "an_image_unused"])
def test_group_norm_of_pixel_rows_image_by_image_second_order(small_images_go_image_by_image, unused):
    """Group norm reading pixel rows image by image (each image's view copied to a contiguous
    image): first and second order gradients as the loop's, including an image whose output the
    loss does not use (its rows' gradient is zero, not another image's)."""
    comps = _images([(4, 5), (0, 2), (3, 3), (2, 6)], 7)
    P = _params(7)
    x = _batch(comps)
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    skip = 2 if unused else -1

    def loss(ys):
        return sum((torch.tanh(y) ** 2).sum() for i, y in enumerate(ys) if y.numel() and i != skip)

    def gn(t):
        return F.group_norm(t, 2, P["gw"], P["gb"], eps=0.1)

    y = gn(x)
    assert pieces.holds_pieces(y)
    gx, = torch.autograd.grad(loss(y.unbind()), [x], create_graph=True)
    g2 = torch.autograd.grad((gx * gx).sum((1, 2, 3)).sum(), [x, P["gw"]])
    live = [i for i, c in enumerate(leaves) if c.numel()]
    refs = {i: torch.zeros_like(leaves[i]) if i == skip else torch.autograd.grad(
        loss([gn(leaves[i][None])[0] if k == i else leaves[k].new_zeros(0) for k in range(len(comps))]), [leaves[i]],
        create_graph=True)[0] for i in live}
    want = torch.autograd.grad(sum((refs[i] * refs[i]).sum() for i in live if refs[i].requires_grad),
                               [*(leaves[i] for i in live), P["gw"]], allow_unused=True)
    for i in live:
        torch.testing.assert_close(gx.unbind()[i], refs[i])
    if unused:
        assert not gx.unbind()[2].any()
    for i, w in zip(live, want):
        torch.testing.assert_close(g2[0].unbind()[i], torch.zeros_like(leaves[i]) if w is None else w)
    torch.testing.assert_close(g2[1], want[-1])
