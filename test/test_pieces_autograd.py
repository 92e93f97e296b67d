"""Consumers reading a result's per-image pieces directly (NOTE [ Pieces read directly ] in
``torch_multijagged/pieces.py``): the backward of an image-by-image chain is the loop's dense
graph alone, and the gradient with respect to such a result — asked through
``torch.autograd.grad``, ``retain_grad``/``grad``, ``register_hook`` or ``grad_fn``, before or after
its pieces were read, after they were packed, after an in-place write — is the per-image
reference's, with an image without pixels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_multijagged as mj
from torch_multijagged import pieces

from test_pieces import C, F64, _batch, _every_image_by_image, _images, _params

SIZES = [(4, 5), (0, 2), (3, 3)]


@pytest.fixture(autouse=True)
def _small_images_go_image_by_image(monkeypatch):
    _every_image_by_image(monkeypatch)


def _conv(x, P):
    return F.conv2d(x, P["w1"], P["b1"], padding=1)


def _loss(t):
    """Consumers of ``t`` that read its pieces (relu, a product, the global mean): on the batch or
    on one ``(1, C, h, w)`` image."""
    return F.relu(t).mean((2, 3)).sum() + (t * t.tanh()).sum()


def _reference(comps, P, loss=_loss):
    """Per image: the gradient of ``loss`` with respect to the conv's output (zeros for an image
    without pixels, whose conv output is empty)."""
    refs = []
    for c in comps:
        if not c.numel():
            refs.append(torch.zeros(C, *c.shape[1:], dtype=F64))
            continue
        yi = _conv(c.unsqueeze(0), P).detach().requires_grad_()
        refs.append(torch.autograd.grad(loss(yi), [yi])[0][0])
    return refs


def _assert_gradient(got, refs):
    assert isinstance(got, mj.MultiJaggedTensor)
    for i, (a, b) in enumerate(zip(got.unbind(), refs)):
        torch.testing.assert_close(a, b, msg=lambda m: f"image {i}: {m}")


def _python_nodes(root) -> set[str]:
    """Names of the Python autograd nodes reachable from ``root``."""
    seen, names, stack = set(), set(), [root]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if fn.name().startswith("_"):
            names.add(fn.name())
        stack.extend(f for f, _ in fn.next_functions)
    return names


def test_an_image_by_image_chain_records_only_dense_nodes():
    P = _params(3)
    x = _batch(_images(SIZES, 3))
    y = F.relu(F.group_norm(_conv(x, P), 2, P["gw"], P["gb"]))
    z = torch.tanh(_conv(y, {"w1": P["w1"], "b1": P["b1"]}))
    assert all(pieces.holds_pieces(t) for t in (y, z))
    loss = z.mean((2, 3)).sum()
    nodes = _python_nodes(loss.grad_fn)
    assert not nodes & {"_PiecesOfBackward", "_AdoptPiecesBackward"}, nodes
    # the input x (a leaf read from its values) is still reached
    gx, = torch.autograd.grad(loss, [x])
    assert gx.shape[0] == x.shape[0]


@pytest.mark.parametrize("api", ["grad", "retain_grad", "hook"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_gradient_with_respect_to_a_result_read_directly(api, when):
    comps = _images(SIZES, 4)
    P = _params(4)
    refs = _reference(comps, P)
    y = _conv(_batch(comps), P)
    assert pieces.holds_pieces(y)
    hooked = []
    if when == "after":
        loss = _loss(y)  # consumers read the pieces first
    if api == "retain_grad":
        y.retain_grad()
        assert y.retains_grad
    elif api == "hook":
        y.register_hook(lambda g: hooked.append(g))
    if when == "before":
        loss = _loss(y)
    if api == "grad":
        got, = torch.autograd.grad(loss, [y])
    else:
        loss.backward()
        if api == "hook":
            assert len(hooked) == 1, "the hook ran once"
        got = y.grad if api == "retain_grad" else hooked[0]
    _assert_gradient(got, refs)


def test_a_hook_registered_before_use_replaces_the_gradient():
    comps = _images(SIZES, 5)
    P = _params(5)
    x = _batch(comps)
    y = _conv(x, P)
    y.register_hook(lambda g: g * 2)
    gx, = torch.autograd.grad(_loss(y), [x])
    y2 = _conv(x, P)
    gx2, = torch.autograd.grad(2 * _loss(y2), [x])
    for a, b in zip(gx.unbind(), gx2.unbind()):
        torch.testing.assert_close(a, b)


def test_a_hook_registered_after_use_cannot_replace_the_gradient():
    comps = _images(SIZES, 6)
    P = _params(6)
    y = _conv(_batch(comps), P)
    loss = _loss(y)
    y.register_hook(lambda g: g)  # handing the same gradient back replaces nothing
    y.register_hook(lambda g: None)
    loss.backward(retain_graph=True)
    handle = y.register_hook(lambda g: g * 2)
    with pytest.raises(RuntimeError, match="register the hook before the tensor is used"):
        loss.backward(retain_graph=True)
    handle.remove()
    loss.backward()


def test_grad_fn_of_a_result_read_directly_is_a_node_that_runs():
    comps = _images(SIZES, 7)
    P = _params(7)
    y = _conv(_batch(comps), P)
    loss = _loss(y)
    ran = []
    torch.autograd.graph.register_multi_grad_hook([y], lambda grads: ran.append(grads[0]))
    assert y.grad_fn is not None
    loss.backward()
    assert len(ran) == 1
    _assert_gradient(ran[0], _reference(comps, P))


def test_packing_after_a_direct_read_keeps_every_gradient():
    comps = _images(SIZES, 8)
    P = _params(8)

    def loss(t):
        # relu reads the pieces; ``values()`` then packs them, and the product reads the values
        if isinstance(t, mj.MultiJaggedTensor):
            r = F.relu(t).mean((2, 3)).sum()
            return r + (t.values() * 3).sum()
        return F.relu(t).mean((2, 3)).sum() + (t * 3).sum()

    refs = _reference(comps, P, loss)
    y = _conv(_batch(comps), P)
    got, = torch.autograd.grad(loss(y), [y])
    assert not pieces.holds_pieces(y), "the values were packed"
    for a, b in zip(got.unbind(), refs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("used", ["one image", "none"])
def test_unused_images_and_unused_results(used):
    comps = _images([(4, 5), (3, 3), (2, 6)], 9)
    P = _params(9)
    y = _conv(_batch(comps), P)
    other = _conv(_batch(comps), P)
    if used == "one image":
        loss = F.relu(y).mean((2, 3))[1].sum() + (other * 1).mean((2, 3)).sum()
        got, = torch.autograd.grad(loss, [y])
        yi = _conv(comps[1].unsqueeze(0), P).detach().requires_grad_()
        want = torch.autograd.grad(F.relu(yi).mean((2, 3)).sum(), [yi])[0][0]
        parts = got.unbind()
        torch.testing.assert_close(parts[1], want)
        for i in (0, 2):
            assert torch.equal(parts[i], torch.zeros_like(parts[i])), "an image no op used has a zero gradient"
        return
    F.relu(y)  # read directly, then left out of the loss
    loss = (other * 1).mean((2, 3)).sum()
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        torch.autograd.grad(loss, [y, other], retain_graph=True)
    gy, go = torch.autograd.grad(loss, [y, other], allow_unused=True, retain_graph=True)
    assert gy is None and isinstance(go, mj.MultiJaggedTensor)
    gy, _ = torch.autograd.grad(loss, [y, other], materialize_grads=True)
    assert all(torch.equal(a, torch.zeros_like(a)) for a in gy.unbind())


@pytest.mark.parametrize("write", ["new pieces", "through the values"])
def test_in_place_write_after_a_direct_read_starts_a_new_gradient(write):
    sizes = SIZES
    comps = _images(sizes, 10)
    P = _params(10)
    y = _conv(_batch(comps), P)
    a = F.relu(y).mean((2, 3)).sum()  # reads the pieces of y before the write
    if write == "new pieces":
        y.mul_(3)  # y's history rebased onto new pieces
        again = lambda t: 3 * t  # noqa: E731
    else:
        # an operand without pieces: the general path writes the packed values
        y.add_(mj.nested_tensor([torch.ones(C, h, w, dtype=F64) for h, w in sizes]))
        again = lambda t: t + 1  # noqa: E731
    b = (y * y).mean((2, 3)).sum()
    got, = torch.autograd.grad(a + b, [y])
    # the gradient with respect to y's latest version: b's only
    refs = []
    for c in comps:
        if not c.numel():
            refs.append(torch.zeros(C, *c.shape[1:], dtype=F64))
            continue
        yi = again(_conv(c.unsqueeze(0), P)).detach().requires_grad_()
        refs.append(torch.autograd.grad((yi * yi).mean((2, 3)).sum(), [yi])[0][0])
    for i, (g, r) in enumerate(zip(got.unbind(), refs)):
        torch.testing.assert_close(g, r, msg=lambda m: f"image {i}: {m}")


def test_gradient_from_pieces_without_one_is_zero_there():
    comps = _images([(4, 5), (0, 2), (3, 3), (2, 2)], 12)
    P = _params(12)
    y = _conv(_batch(comps), P)
    F.relu(y)  # a direct read
    live = pieces.read_directly(y)
    assert live is not None and len(live) == 3
    g = [torch.full_like(p, 2.0) for p in live]
    got = pieces.gradient_from(y, live, [g[0], None, g[2]])
    parts = got.unbind()
    assert torch.equal(parts[0], g[0][0]) and parts[1].numel() == 0 and torch.equal(parts[3], g[2][0])
    assert torch.equal(parts[2], torch.zeros_like(parts[2]))
    assert pieces.gradient_from(y, live, [None, None, None]) is None


def test_second_order_through_a_direct_read():
    comps = _images(SIZES, 11)
    P = _params(11)
    x = _batch(comps)
    y = _conv(x, P)
    gy, = torch.autograd.grad(_loss(y), [y], create_graph=True)
    g2 = torch.autograd.grad((gy * gy).sum(), [x, P["w1"]])
    leaves = [c.detach().clone().requires_grad_() for c in comps]
    total = 0
    for c in leaves:
        if not c.numel():
            continue
        yi = _conv(c.unsqueeze(0), P)
        gi, = torch.autograd.grad(_loss(yi), [yi], create_graph=True)
        total = total + (gi * gi).sum()
    want = torch.autograd.grad(total, [*leaves, P["w1"]], allow_unused=True, materialize_grads=True)
    for a, b in zip(g2[0].unbind(), want[:-1]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(g2[1], want[-1])


def _module_patterns_net():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()).to(F64)
    return net, torch.nn.Linear(8, 5).to(F64)


@pytest.mark.parametrize("pattern", ["checkpoint", "full backward hook", "hook from a forward hook"])
def test_module_patterns_on_images_read_directly(pattern):
    """What model code does around image-by-image results: activation checkpointing, a module's
    full backward hook replacing its input gradient, and a tensor hook registered on a module's
    output from a forward hook (Grad-CAM); parameter gradients and the hooked gradient against the
    loop's."""
    net, head = _module_patterns_net()
    imgs = _images([(5, 6), (4, 7), (6, 3)], 13, c=3)
    seen = []
    if pattern == "full backward hook":
        net[3].register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))
    elif pattern == "hook from a forward hook":
        def on_output(module, inputs, out):
            out.register_hook(lambda g: seen.append(g) or g * 3)  # a forward hook returning None

        net[2].register_forward_hook(on_output)

    def run(fwd, xs):
        for p in [*net.parameters(), *head.parameters()]:
            p.grad = None
        sum(head(fwd(x).mean((2, 3))).square().sum() for x in xs).backward()
        return [p.grad.clone() for p in [*net.parameters(), *head.parameters()]]

    fwd = (lambda x: torch.utils.checkpoint.checkpoint(net, x, use_reentrant=False)) if pattern == "checkpoint" else net
    got = run(fwd, [_batch(imgs, grad=False)])
    hooked = list(seen)
    seen.clear()
    want = run(net, [i.unsqueeze(0) for i in imgs])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    if pattern == "hook from a forward hook":
        assert len(hooked) == 1 and len(seen) == len(imgs)
        for a, b in zip(hooked[0].unbind(), seen[::-1]):  # the loop's backward runs its last image first
            torch.testing.assert_close(a, b[0])


def test_retained_gradient_survives_a_later_write():
    comps = _images(SIZES, 14)
    P = _params(14)
    y = _conv(_batch(comps), P)
    loss = _loss(y)  # a direct read
    y.retain_grad()
    loss.backward()
    want = y.grad
    y.detach().mul_(1.0)  # a write through an alias of y: its record ends
    assert y.grad_fn is not None  # asks the record, which the write ended
    got = y.grad  # still the gradient retained by the backward
    for a, b in zip(got.unbind(), want.unbind()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("consumers", ["read the pieces", "read the values"])
def test_backward_with_inputs_a_result_held_as_pieces(consumers):
    """``loss.backward(inputs=[y])``: ``y.grad`` is the per-image reference's gradient (twice:
    accumulated), whether the consumers read ``y``'s pieces directly or its packed values."""
    comps = _images(SIZES, 15)
    P = _params(15)
    if consumers == "read the pieces":
        loss_of = _loss
    else:
        def loss_of(t):
            v = t.values() if isinstance(t, mj.MultiJaggedTensor) else t[0].permute(1, 2, 0).reshape(-1, C)
            return (v * v.tanh()).sum()
    refs = _reference(comps, P, loss_of)
    y = _conv(_batch(comps), P)
    loss = loss_of(y)
    loss.backward(inputs=[y], retain_graph=True)
    loss.backward(inputs=[y])
    assert P["w1"].grad is None
    for i, (a, b) in enumerate(zip(y.grad.unbind(), refs)):
        torch.testing.assert_close(a, 2 * b, msg=lambda m: f"image {i}: {m}")


def test_gradient_edge_and_grad_reset_of_a_result_read_directly():
    comps = _images(SIZES, 16)
    P = _params(16)
    y = _conv(_batch(comps), P)
    loss = _loss(y)  # a direct read
    with pytest.raises(RuntimeError, match="no single GradientEdge"):
        torch.autograd.graph.get_gradient_edge(y)
    loss.backward(inputs=[y])
    assert y.grad is not None
    y.grad = None
    assert y.grad is None
    ones = y.detach() * 0 + 1
    y.grad = ones
    for a in y.grad.unbind():
        assert torch.equal(a, torch.ones_like(a))


def test_grad_of_a_values_path_result_and_a_result_read_directly_together():
    comps = _images(SIZES, 17)
    P = _params(17)
    x = _batch(comps)
    xv = x * 2  # a values-path result (its values carry its gradient)
    y = _conv(xv, P)  # pieces, read directly by the loss
    loss = _loss(y)
    gxv, gy = torch.autograd.grad(loss, [xv, y], retain_graph=True)
    (gy_alone,) = torch.autograd.grad(loss, [y], retain_graph=True)
    (gxv_alone,) = torch.autograd.grad(loss, [xv], retain_graph=True)
    for a, b in zip(gy.unbind(), gy_alone.unbind()):
        torch.testing.assert_close(a, b)
    for a, b in zip(gxv.unbind(), gxv_alone.unbind()):
        torch.testing.assert_close(a, b)
    # against the loop: d loss / d (2 x) per image
    for c, g in zip(comps, gxv.unbind()):
        if not c.numel():
            continue
        xi = (2 * c).unsqueeze(0).requires_grad_()
        (want,) = torch.autograd.grad(_loss(_conv(xi, P)), [xi])
        torch.testing.assert_close(g, want[0])
    with pytest.raises(NotImplementedError, match="is_grads_batched"):
        torch.autograd.grad(loss, [y], torch.ones(2), is_grads_batched=True)
