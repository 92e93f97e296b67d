"""``multijagged::spatial_conv``: a convolution over ragged spatial dims that keeps every size
(stride 1, ``padding_l + padding_r = dilation·(kernel − 1)`` per axis: the ``"same"`` convs of a
CNN), traceable by ``torch.compile``.

Eagerly, ``ops/vision/conv.py`` computes every windowed op with dense autograd on the packed values
(NOTE [ Canvas ] in ``kernels/canvas.py``). Inside a compiled region the canvas cannot be planned
from symbolic sizes, so the size-keeping convolution is one op at two levels, as the other
structural ops:

* ``spatial_conv(x, weight, bias, padding, dilation, groups)`` takes a multi_jagged
  ``(B, C, j0[, j1])`` and returns ``(B, C_out, j0[, j1])`` with the same partition. Its autograd
  formula is written with ``spatial_conv`` itself (the input gradient of a size-keeping stride-1
  conv is a size-keeping conv with the flipped, transposed kernel and mirrored padding) and
  ``spatial_conv_param_grads``.
* ``spatial_conv_rows`` / ``spatial_conv_rows_param_grads`` run on pixel rows ``(P, C)`` and the
  ``(B, S)`` sizes. They are opaque to the compiler (fake impls give the shapes), so at run time
  they plan the canvas from the sizes (a host read: free on the CPU, one sync per call on a GPU)
  and call the dense conv and ``aten.convolution_backward`` on it.

``padding`` lists ``(left, right)`` per spatial axis: ``[l₀, r₀, l₁, r₁]``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import canvas as cv
from ..kernels.reference import built_outside_inference_mode
from .library import LIB, _no_zero_fill

__all__ = ["keeps_sizes"]

mj = torch.ops.multijagged

LIB.define("spatial_conv(Tensor x, Tensor weight, Tensor? bias, int[] padding, int[] dilation, int groups) -> Tensor")
LIB.define(
    "spatial_conv_param_grads(Tensor grad, Tensor x, Tensor weight, int[] padding, int[] dilation, int groups, "
    "bool need_weight, bool need_bias) -> (Tensor, Tensor)"
)
LIB.define(
    "spatial_conv_rows(Tensor rows, Tensor sizes, Tensor weight, Tensor? bias, int[] padding, int[] dilation, "
    "int groups) -> Tensor"
)
LIB.define(
    "spatial_conv_rows_param_grads(Tensor grad, Tensor rows, Tensor sizes, Tensor weight, int[] padding, "
    "int[] dilation, int groups, bool need_weight, bool need_bias) -> (Tensor, Tensor)"
)


def keeps_sizes(kernel, stride, pads, dilation) -> bool:
    """Whether a conv of this geometry maps every size to itself."""
    return all(s == 1 and pl + pr == d * (k - 1) for k, s, (pl, pr), d in zip(kernel, stride, pads, dilation))


def _windows(weight: Tensor, padding, dilation) -> tuple:
    k = weight.shape[2:]
    return tuple(cv.Window(int(k[a]), 1, padding[2 * a], padding[2 * a + 1], dilation[a]) for a in range(len(k)))


_CONV = {1: F.conv1d, 2: F.conv2d}


# --------------------------------------------------------------------------- dense (and fake) impls
def _conv_dense(x: Tensor, weight: Tensor, bias, padding, dilation, groups) -> Tensor:
    """A dense ``(B, C, *spatial)`` tensor: pad (possibly asymmetrically) and convolve."""
    pad = []
    for a in reversed(range(weight.dim() - 2)):
        pad += [padding[2 * a], padding[2 * a + 1]]
    return _CONV[weight.dim() - 2](F.pad(x, pad), weight, bias, 1, 0, dilation, groups)


def _param_grads_dense(grad, x, weight, padding, dilation, groups, need_weight, need_bias):
    pad = []
    for a in reversed(range(weight.dim() - 2)):
        pad += [padding[2 * a], padding[2 * a + 1]]
    s = weight.dim() - 2
    _, gw, gb = torch.ops.aten.convolution_backward(
        grad, F.pad(x, pad), weight, [weight.shape[0]] if need_bias else None, [1] * s, [0] * s, list(dilation),
        False, [0] * s, groups, [False, need_weight, need_bias],
    )
    return gw if need_weight else weight.new_empty(0), gb if need_bias else weight.new_empty(0)


LIB.impl("spatial_conv", _conv_dense, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::spatial_conv", _conv_dense, lib=LIB)
LIB.impl("spatial_conv_param_grads", _param_grads_dense, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::spatial_conv_param_grads", _param_grads_dense, lib=LIB)


# --------------------------------------------------------------------------- packed impls
@functools.lru_cache(maxsize=16)
@built_outside_inference_mode
def _plan(sizes: tuple, windows: tuple, device: str) -> cv.CanvasPlan:
    host = torch.tensor(sizes, dtype=torch.int64).view(-1, len(windows))
    return cv.plan_canvas(host, windows, torch.device(device))


def _plan_of(sizes: Tensor, windows: tuple, device) -> cv.CanvasPlan:
    # SYNC: the canvas is planned on the host (free for CPU tensors; one read per call on a GPU).
    return _plan(tuple(sizes.cpu().reshape(-1).tolist()), windows, str(device))


def _rows(rows: Tensor, sizes: Tensor, weight: Tensor, bias, padding, dilation, groups) -> Tensor:
    windows = _windows(weight, padding, dilation)
    plan = _plan_of(sizes, windows, rows.device)
    pad = tuple(padding[2 * a] for a in range(len(windows)))
    out = _CONV[len(windows)](cv.to_canvas(rows, plan), weight, bias, 1, pad, list(dilation), groups)
    return cv.from_canvas(out, plan)


def _rows_fake(rows, sizes, weight, bias, padding, dilation, groups):
    return rows.new_empty(rows.shape[0], weight.shape[0])


def _rows_param_grads(grad, rows, sizes, weight, padding, dilation, groups, need_weight, need_bias):
    windows = _windows(weight, padding, dilation)
    plan = _plan_of(sizes, windows, rows.device)
    s = len(windows)
    g = cv.to_out_canvas(grad, plan)
    pad = [padding[2 * a] for a in range(s)]
    _, gw, gb = torch.ops.aten.convolution_backward(
        g, cv.to_canvas(rows, plan), weight, [weight.shape[0]] if need_bias else None, [1] * s, pad, list(dilation),
        False, [0] * s, groups, [False, need_weight, need_bias],
    )
    # contiguous, as the fake says: from a channels-last canvas aten's weight gradient is channels
    # last, and Inductor checks the strides a custom op returns against its fake's
    return gw.contiguous() if need_weight else weight.new_empty(0), gb if need_bias else weight.new_empty(0)


def _rows_param_grads_fake(grad, rows, sizes, weight, padding, dilation, groups, need_weight, need_bias):
    return (weight.new_empty(weight.shape) if need_weight else weight.new_empty(0),
            weight.new_empty(weight.shape[0]) if need_bias else weight.new_empty(0))


LIB.impl("spatial_conv_rows", _rows, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::spatial_conv_rows", _rows_fake, lib=LIB)
LIB.impl("spatial_conv_rows_param_grads", _rows_param_grads, "CompositeExplicitAutograd")
torch.library.register_fake("multijagged::spatial_conv_rows_param_grads", _rows_param_grads_fake, lib=LIB)


# --------------------------------------------------------------------------- autograd
def _transposed_kernel(weight: Tensor, groups: int) -> Tensor:
    """The kernel of the input gradient: per group, in/out channels swapped, spatially flipped."""
    co, ci = weight.shape[:2]
    k = weight.shape[2:]
    w = weight.reshape(groups, co // groups, ci, *k).transpose(1, 2).reshape(ci * groups, co // groups, *k)
    return w.flip(list(range(2, weight.dim())))


def _setup(ctx, inputs, output):
    x, weight, bias, padding, dilation, groups = inputs
    _no_zero_fill(ctx)
    ctx.geometry = (list(padding), list(dilation), groups, bias is not None)
    ctx.save_for_backward(x, weight)


def _backward(ctx, grad):
    if grad is None:
        return None, None, None, None, None, None
    x, weight = ctx.saved_tensors
    padding, dilation, groups, has_bias = ctx.geometry
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:
        mirrored = [padding[i ^ 1] for i in range(len(padding))]  # (l, r) -> (r, l)
        gx = mj.spatial_conv(grad, _transposed_kernel(weight, groups), None, mirrored, dilation, groups)
    need_w = ctx.needs_input_grad[1]
    need_b = has_bias and ctx.needs_input_grad[2]
    if need_w or need_b:
        gw, gb = mj.spatial_conv_param_grads(grad, x if need_w else x.detach(), weight.detach(), padding, dilation,
                                             groups, need_w, need_b)
    return gx, gw if need_w else None, gb if need_b else None, None, None, None


torch.library.register_autograd("multijagged::spatial_conv", _backward, setup_context=_setup, lib=LIB)


def _param_grads_setup(ctx, inputs, output):
    grad, x, weight, padding, dilation, groups, need_weight, need_bias = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, x, weight)
    ctx.geometry = (list(padding), list(dilation), groups, need_weight, need_bias)


def _param_grads_backward(ctx, ggw, ggb):
    """gw = Σ grad ⊗ x over the taps and gb = Σ grad: bilinear, so d/dgrad is the conv of x with
    ggw (plus ggb per channel), and d/dx the input gradient of a conv of kernel ggw."""
    grad, x, weight = ctx.saved_tensors
    padding, dilation, groups, need_weight, need_bias = ctx.geometry
    ggw = ggw if need_weight else None  # the output not asked for is an empty placeholder
    ggb = ggb if need_bias else None
    d_grad = d_x = None
    if ctx.needs_input_grad[0]:
        if ggw is not None:
            d_grad = mj.spatial_conv(x, ggw, ggb, padding, dilation, groups)
        elif ggb is not None:
            d_grad = torch.zeros_like(grad) + ggb.view(-1, *([1] * (grad.dim() - 2)))
    if ctx.needs_input_grad[1] and ggw is not None:
        mirrored = [padding[i ^ 1] for i in range(len(padding))]
        d_x = mj.spatial_conv(grad, _transposed_kernel(ggw, groups), None, mirrored, dilation, groups)
    return d_grad, d_x, None, None, None, None, None, None


torch.library.register_autograd(
    "multijagged::spatial_conv_param_grads", _param_grads_backward, setup_context=_param_grads_setup, lib=LIB
)


# The row-level ops have the same formulas on pixel rows ``(P, C)`` (channels last), so that a
# direct call differentiates to any order too (the handlers of ``spatial_conv`` call them below
# autograd).
def _rows_setup(ctx, inputs, output):
    rows, sizes, weight, bias, padding, dilation, groups = inputs
    _no_zero_fill(ctx)
    ctx.geometry = (list(padding), list(dilation), groups, bias is not None)
    ctx.save_for_backward(rows, sizes, weight)


def _rows_backward(ctx, grad):
    if grad is None:
        return (None,) * 7
    rows, sizes, weight = ctx.saved_tensors
    padding, dilation, groups, has_bias = ctx.geometry
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:
        mirrored = [padding[i ^ 1] for i in range(len(padding))]
        gx = mj.spatial_conv_rows(grad, sizes, _transposed_kernel(weight, groups), None, mirrored, dilation, groups)
    need_w = ctx.needs_input_grad[2]
    need_b = has_bias and ctx.needs_input_grad[3]
    if need_w or need_b:
        gw, gb = mj.spatial_conv_rows_param_grads(grad, rows if need_w else rows.detach(), sizes, weight.detach(),
                                                  padding, dilation, groups, need_w, need_b)
    return gx, None, gw if need_w else None, gb if need_b else None, None, None, None


torch.library.register_autograd("multijagged::spatial_conv_rows", _rows_backward, setup_context=_rows_setup, lib=LIB)


def _rows_param_grads_setup(ctx, inputs, output):
    grad, rows, sizes, weight, padding, dilation, groups, need_weight, need_bias = inputs
    _no_zero_fill(ctx)
    ctx.save_for_backward(grad, rows, sizes)
    ctx.geometry = (list(padding), list(dilation), groups, need_weight, need_bias)


def _rows_param_grads_backward(ctx, ggw, ggb):
    grad, rows, sizes = ctx.saved_tensors
    padding, dilation, groups, need_weight, need_bias = ctx.geometry
    ggw = ggw if need_weight else None  # the output not asked for is an empty placeholder
    ggb = ggb if need_bias else None
    d_grad = d_rows = None
    if ctx.needs_input_grad[0]:
        if ggw is not None:
            d_grad = mj.spatial_conv_rows(rows, sizes, ggw, ggb, padding, dilation, groups)
        elif ggb is not None:
            d_grad = torch.zeros_like(grad) + ggb
    if ctx.needs_input_grad[1] and ggw is not None:
        mirrored = [padding[i ^ 1] for i in range(len(padding))]
        d_rows = mj.spatial_conv_rows(grad, sizes, _transposed_kernel(ggw, groups), None, mirrored, dilation, groups)
    return d_grad, d_rows, None, None, None, None, None, None, None


torch.library.register_autograd(
    "multijagged::spatial_conv_rows_param_grads", _rows_param_grads_backward, setup_context=_rows_param_grads_setup,
    lib=LIB,
)
