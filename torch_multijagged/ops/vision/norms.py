"""Normalisation and adaptive pooling over ragged spatial dims: ``batch_norm``, ``instance_norm``,
``group_norm`` and ``adaptive_{avg,max}_pool{2,3}d`` of channels-first images ``(B, C, j0, j1)``,
signals ``(B, C, j0)`` and their variants (square ``(B, C, j0, j0)``, one static side
``(B, C, 32, j0)``).

NOTE [ Norms and adaptive pooling over ragged spatial dims ]

The input is channels first: logical dim 1 is a static channel dim and every ragged dim is a
spatial dim after it, so the packed values are ``(P, C, *static spatial)`` — one packed row per
pixel of the ragged sides (``(ΣHᵢWᵢ, C)`` for ``(B, C, j0, j1)``; ``(ΣWᵢ, C, 32)`` for
``(B, C, 32, j0)``). Per sample, every op equals the dense op on that image:

* ``batch_norm``: statistics per channel over the valid pixels of the whole batch. On the
  values, dim 0 (pixel rows) is ``batch_norm``'s batch and dim 1 its channel, so
  ``F.batch_norm(values, …)`` is exactly it — running statistics included (the unbiased
  variance counts the valid pixels) — under the dense op's own autograd (every order). Images
  held as pieces, or large enough for the convolutions to go image by image, are normalised
  image by image with the batch's statistics, pieces out (NOTE [ Batch norm image by image ] in
  ``kernels/norms.py``).
* ``instance_norm`` / ``group_norm``: statistics per (sample, channel) / (sample, group), as
  segment sums over each sample's packed rows (``index_add`` by the row's sample) and a gather
  back; differentiable to any order by torch's autograd on the values. ``instance_norm``'s
  running statistics (``track_running_stats``) follow the batched dense op: they move by
  ``momentum`` towards the *average over samples* of the per-sample means and unbiased
  variances (each sample's variance with its own pixel count), samples without pixels left out
  (dense ``batch_norm`` of an empty input leaves them unchanged, as here when no sample has
  pixels). A sample of exactly one pixel raises in training, naming it, as the dense op does.
* ``adaptive_{avg,max}_pool{2,3}d`` to a fixed size ``(h, w)``: a *dense* ``(B, C, h, w)``
  result (every sample pooled to the same size) with PyTorch's windows
  ``[⌊i·n/h⌋, ⌈(i+1)·n/h⌉)``. The dense kernel runs on each sample — a view of its rows, or its
  piece — and the outputs are concatenated (NOTE [ Adaptive pooling sample by sample ] in
  ``kernels/per_image.py``): the first maximum of a window (row-major scan order) takes the
  whole gradient, its last NaN wins, and indices are dense's (the flat index ``h·W + w`` into the
  sample's image). Only an average over many tiny images with few channels scatters instead each
  pixel into the (at most ``⌈h/n⌉ + 1`` per axis) windows that hold it, by ``index_add``
  (``adaptive_each_applies``). A sample with no pixels pools to NaN (average: the mean of
  nothing, as ``mean`` over an empty extent) and to ``-inf`` with index 0 (maximum: the identity
  of max); dense torch raises for an empty image.
  ``output_size`` entries of ``None`` keep a static side and raise for a ragged one. An output
  of size 1 on every side (global pooling) of the average is the routed ``mean`` (it compiles);
  other sizes build their window maps on the host from the partition's host sizes (no device
  sync) and run eagerly only, as the 1-d pooling of ``ops/nn/ragged.py``.

Eager only, except the norms and global average pooling: under ``torch.compile`` the other pools
and instance norm with running statistics are a graph break (``fullgraph=True``: an error naming
the op; NOTE [ Eager-only routes ] in ``_common.py``): their window maps and the running update
(which counts the samples with pixels) are built from host sizes. Batch norm traces as
``F.batch_norm`` of the packed values (except for images of one size whose dim 1 is the ragged
one), group norm and instance norm as their segment statistics (``_normalise``; instance norm's
one-pixel check made when the graph runs); their image-by-image forms, and group norm's
per-sample native kernel, need the host sizes and are eager's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import pieces
from ...bridge import values_of, wrap_values, wrap_values_like
from ...errors import StructureError
from .. import bridged
from .._common import MJT, describe, eager_route, sample_rows, static_dims, wrap
from .._routing import _dense, _needs_grad, route

from ...kernels import norms as _kernels  # noqa: E402
from ...kernels import per_image as pim  # noqa: E402
from ...kernels import reference as ref  # noqa: E402
from ...kernels.norms import batch_norm_images, batch_norm_train, group_norm_rows, segment_norm  # noqa: E402
from .conv import as_spatial, channels_first  # noqa: E402

__all__ = ["group_norm", "spatial_layout"]


# ----------------------------------------------------------------------------- checks
def spatial_layout(x: MJT) -> bool:
    """Channels first with every ragged dim spatial: dim 1 static, ragged dims after it."""
    return len(x._size) >= 3 and 1 not in x._ragged_dims


def _require_channels_first(op: str, x: MJT) -> None:
    if not spatial_layout(x):
        raise ValueError(
            f"{op}(): expected a channels-first input (B, C, *spatial) with a static channel dim 1 and ragged "
            f"spatial dims, got {describe(x)} with ragged dims {x._ragged_dims} for layout torch.multi_jagged; "
            "move the channels to dim 1 first (a (B, j0, j1, C) image: x.permute(0, 3, 1, 2))"
        )


def _check_param(op: str, name: str, t, c: int) -> None:
    if t is not None and (not _dense(t) or t.dim() != 1 or t.shape[0] != c):
        got = describe(t) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{op}(): expected {name} of shape ({c},) (the channel count of the input), got {got}")


_WHY = (
    "{op}(): over ragged spatial dims this builds per-sample maps or partitions on the host, which torch.compile "
    "cannot trace for layout torch.multi_jagged: a graph break"
)
_WHY_POOL = _WHY + " (global average pooling, a mean, compiles)"


def _declined(input, *args, **kwargs) -> bool:
    """A call the route declines (a dense input: ``NotImplemented``) is no graph break."""
    return not isinstance(input, MJT)


def _values(x: MJT) -> torch.Tensor:
    return values_of(x) if _needs_grad(x) else x._values


def _finish(x: MJT, v: torch.Tensor) -> MJT:
    return wrap_values_like(v, x) if v.requires_grad else wrap(v, x._partition, x._ragged_dims)


# ----------------------------------------------------------------------------- batch_norm
def _norm_input(op: str, input: MJT, weight, bias, running_mean, running_var):
    """``(input, C)`` of a batch / instance norm: channels first (images of one size, whose dim 1
    ``nested_tensor`` calls ragged, read as channels), parameters of shape ``(C,)``."""
    if input._ragged_dims == (1,) and input.dim() in (3, 4):
        input = as_spatial(op, input, input.dim() - 2)
    _require_channels_first(op, input)
    c = input.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        _check_param(op, name, t, c)
    return input, c


def _batch_norm_traceable(input, *args, **kwargs) -> bool:
    """Batch norm traces on the packed values (no host sizes), except for a batch of images of one
    size whose dim 1 ``nested_tensor`` called ragged (``as_spatial`` moves it, eagerly)."""
    return not (isinstance(input, MJT) and input._ragged_dims == (1,) and input.dim() in (3, 4))


@route(F.batch_norm)
@eager_route(_WHY, traceable=_batch_norm_traceable)
def _batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Channel statistics over the valid pixels of the batch: ``F.batch_norm`` on the packed
    values ``(P, C, *static)`` (NOTE [ Norms and adaptive pooling over ragged spatial dims ])."""
    if not isinstance(input, MJT):
        return NotImplemented
    op = "batch_norm"
    input, c = _norm_input(op, input, weight, bias, running_mean, running_var)
    if _image_by_image(input) and input.is_floating_point():
        out = _batch_norm_images(input, c, running_mean, running_var, weight, bias, training, momentum, eps)
        if out is not None:
            return out
    return _finish(input, _batch_norm_values(_values(input), running_mean, running_var, weight, bias, training,
                                             momentum, eps))


def _image_by_image(input: MJT) -> bool:
    """Whether a norm of images ``(B, C, j0, j1)`` goes image by image: they are held as pieces, or
    large enough for the convolutions around the norm to go image by image (NOTE [ Per-image
    pieces ]). Never traced: the rule reads host sizes."""
    if input._ragged_dims != (2, 3) or len(input._size) != 4 or torch.compiler.is_compiling():
        return False
    return pim.per_image_applies(pieces.image_sizes(input._partition), max(input._size[1], pim.MIN_CHANNELS),
                                 pieces.holds_pieces(input))


def _batch_norm_images(x: MJT, c: int, running_mean, running_var, weight, bias, training, momentum, eps):
    """Batch norm of images image by image, pieces out, each contiguous (NOTE [ Batch norm image by
    image ] in kernels/norms.py); None where the packed path decides (no pixel, or one pixel in
    training: dense's error)."""
    ps = pieces.split(x)
    live = [p for p in ps if p is not None]
    n = sum(p.shape[2] * p.shape[3] for p in live)
    if not live or (training and n <= 1):
        return None
    if not training:  # the running statistics: dense batch norm of each image, as the loop
        return pieces.map_pieces(
            lambda p: F.batch_norm(pim.as_image(p), running_mean, running_var, weight, bias, False, momentum, eps), x)
    xs = [pim.as_image(_float(p)) for p in live]  # a view of pixel rows: copied to the loop's format
    cast = lambda t: t if t is None else t.to(xs[0].dtype)  # noqa: E731
    outs, mean, var = batch_norm_images(xs, cast(weight), cast(bias), eps)
    _update_running_bn(n, mean, var, running_mean, running_var, momentum)
    it = iter(outs)
    full = [None if p is None else next(it).to(p.dtype) for p in ps]
    return pieces.from_pieces(full, x._partition, x._ragged_dims, c, x.dtype, x.device)


def _batch_norm_values(v, running_mean, running_var, weight, bias, training, momentum, eps):
    """``F.batch_norm`` of the packed values ``(P, C, *static)``; in training, statistics by
    cascade sums (NOTE [ Batch norm over packed pixels ] in kernels/norms.py)."""
    n = v.numel() // v.shape[1] if v.dim() > 1 else 0
    if not training or n <= 1 or not v.is_floating_point():
        return F.batch_norm(v, running_mean, running_var, weight, bias, training, momentum, eps)
    x = _float(v)
    cast = lambda t: t if t is None else t.to(x.dtype)  # noqa: E731
    out, mean, var = batch_norm_train(x, cast(weight), cast(bias), eps)
    _update_running_bn(n, mean, var, running_mean, running_var, momentum)
    return out.to(v.dtype)


def _update_running_bn(n: int, mean, var, running_mean, running_var, momentum) -> None:
    """Running statistics as dense ``batch_norm`` moves them: the unbiased variance, over the same
    ``n`` pixels."""
    if running_mean is None and running_var is None:
        return
    with torch.no_grad():
        m = 0.1 if momentum is None else momentum
        if running_mean is not None:
            running_mean.mul_(1 - m).add_(mean.to(running_mean.dtype), alpha=m)
        if running_var is not None:
            running_var.mul_(1 - m).add_((var * (n / (n - 1))).to(running_var.dtype), alpha=m)


# ----------------------------------------------------------------------------- instance / group norm
def _float(v: torch.Tensor) -> torch.Tensor:
    """Reduced-precision values computed in float32, as the dense CPU kernels accumulate."""
    return v.float() if v.dtype in (torch.float16, torch.bfloat16) else v


def _normalise(x: MJT, v3: torch.Tensor, channels: int, weight, bias, eps: float):
    """``(out, mean, biased var)``: ``v3 (P, G, m)`` normalised per sample and group over the
    sample's packed rows and m, then scaled and shifted per channel (one autograd node that saves
    the input only: NOTE [ Group norm over packed pixels ] in ``kernels/norms.py``). A sample
    without rows divides by 1 (its statistics are 0 and reach no output)."""
    p = x._partition
    cnt = (p.offsets.diff() * v3.shape[2]).clamp_min(1).to(v3.dtype).unsqueeze(1)
    cast = (lambda t: t if t is None or t.dtype == v3.dtype else t.to(v3.dtype))
    return segment_norm(v3, p.row_sample(), p.batch, cnt, channels, cast(weight), cast(bias), eps)


def _pixels_per_sample(x: MJT, v: torch.Tensor, device: bool = False) -> torch.Tensor:
    """(B,) count of pixels (rows × static spatial) per sample: on the host, or with ``device`` on
    the values' device (no host sizes: traced code)."""
    s = math.prod(v.shape[2:])
    p = x._partition
    if not p.nragged:
        return torch.zeros(p.batch, dtype=torch.int64, device=v.device if device else "cpu")
    # SYNC: none — host sizes, or the device's own
    return (p.device_sizes() if device else p.host_sizes()).prod(1) * s


def _instance_norm_traceable(input, running_mean=None, running_var=None, *args, **kwargs) -> bool:
    """Instance norm traces where it keeps no running statistics (their update counts the samples
    with pixels on the host): its statistics are the segment ones of group norm."""
    return not isinstance(input, MJT) or (running_mean is None and running_var is None)


@route(torch.batch_norm)
def _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    """``torch.batch_norm`` (``F.batch_norm``'s own call, its arguments in aten's order)."""
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


@route(F.instance_norm)
@eager_route(_WHY, traceable=_instance_norm_traceable)
def _instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                   momentum=0.1, eps=1e-5):
    if not isinstance(input, MJT):
        return NotImplemented
    op = "instance_norm"
    input, c = _norm_input(op, input, weight, bias, running_mean, running_var)
    if not input.is_floating_point():  # dense torch's own dtype check (its kernels take floats only)
        F.instance_norm(torch.zeros((1, c, 2), dtype=input.dtype, device=input.device))
    if not use_input_stats:
        # the running statistics normalise every pixel alike: batch_norm in eval mode on the values
        if running_mean is None or running_var is None:
            raise ValueError(f"{op}(): expected running_mean and running_var when use_input_stats=False")
        return _batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    v = _values(input)
    if torch.compiler.is_compiling():
        # dense torch's check, made when the graph runs (the pixel counts are not on the host)
        one = _pixels_per_sample(input, v, device=True) == 1
        torch._assert_async(~one.any(), f"{op}(): expected more than 1 spatial element when training")
    else:
        pixels = _pixels_per_sample(input, v)
        if bool((pixels == 1).any()):
            i = int((pixels == 1).nonzero()[0, 0])
            raise ValueError(f"{op}(): expected more than 1 spatial element when training, got sample {i} with 1 pixel")
    w = _float(v)
    out, mean, var = _normalise(input, w.reshape(w.shape[0], c, math.prod(w.shape[2:])), c, weight, bias, eps)
    if running_mean is not None or running_var is not None:
        _update_running(input, pixels, mean, var, running_mean, running_var, momentum)
    return _finish(input, out.view(w.shape).to(v.dtype))


def _update_running(x: MJT, pixels, mean, var, running_mean, running_var, momentum) -> None:
    """Running statistics as the batched dense ``instance_norm``: towards the average over the
    samples with pixels of each one's mean and unbiased variance."""
    keep = (pixels > 0).to(x._values.device)
    k = int((pixels > 0).sum())  # SYNC: none — host sizes
    if k == 0:
        return
    n = pixels.to(device=mean.device, dtype=mean.dtype).unsqueeze(1)
    with torch.no_grad():
        w = keep.to(mean.dtype).unsqueeze(1) / k
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_((mean * w).sum(0).to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = torch.where(n > 1, var * n / (n - 1).clamp_min(1), torch.full_like(var, float("nan")))
            unbiased = torch.where(keep.unsqueeze(1), unbiased, torch.zeros_like(unbiased))
            running_var.mul_(1 - momentum).add_((unbiased * w).sum(0).to(running_var.dtype), alpha=momentum)


@eager_route(_WHY, traceable=lambda *args, **kwargs: True)
def group_norm(input: MJT, num_groups: int, weight, bias, eps) -> MJT:
    """``group_norm`` of a channels-first ``(B, C, *spatial)`` input with ragged spatial dims:
    per sample and group over the group's channels and the sample's pixels (the route in
    the ``group_norm`` route below sends this case here)."""
    op = "group_norm"
    c = input.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise ValueError(f"{op}(): expected the number of channels ({c}) to be divisible by num_groups, got {num_groups}")
    _check_param(op, "weight", weight, c)
    _check_param(op, "bias", bias, c)
    if not input.is_floating_point():  # dense torch's own dtype check (its kernels take floats only)
        F.group_norm(torch.zeros((1, c, 2), dtype=input.dtype, device=input.device), num_groups)
    if _image_by_image(input):
        # images held one by one, or large enough for the convolutions to go image by image
        # (NOTE [ Per-image pieces ]): aten's kernel on each image, as the loop, pieces out
        return pieces.map_pieces(lambda p: _group_norm_image(p, num_groups, weight, bias, eps), input)
    v = _values(input)
    # dense F.group_norm's own check, over the whole batch (rows × group channels × static spatial)
    if input._partition.rows * (c // num_groups) * math.prod(v.shape[2:]) == 1:
        raise ValueError(f"{op}(): expected more than 1 value per group when training, got input size {describe(input)}")
    w = _float(v)
    if not torch.compiler.is_compiling() and w.dim() == 2 and input._partition.batch \
            and input._partition.rows >= _kernels.ROWS_PER_SAMPLE_NATIVE * input._partition.batch:
        cast = (lambda t: t if t is None or t.dtype == w.dtype else t.to(w.dtype))
        lengths = _pixels_per_sample(input, v).tolist()
        return _finish(input, group_norm_rows(w, lengths, num_groups, cast(weight), cast(bias), eps).to(v.dtype))
    out, _, _ = _normalise(input, w.reshape(w.shape[0], num_groups, c // num_groups * math.prod(w.shape[2:])), c, weight,
                           bias, eps)
    return _finish(input, out.view(w.shape).to(v.dtype))


def _group_norm_image(p: torch.Tensor, groups: int, weight, bias, eps: float) -> torch.Tensor:
    """``group_norm`` of one ``(1, C, h, w)`` image, in float32 for 16-bit inputs as the packed
    path computes it, in the contiguous (channels-first) format a user's image has: aten's
    channels-last group norm is slower, its backward 2–4× (0.7–0.9 ms against 0.2–0.4 ms for
    32 × 128 × 128, fp32, 2 threads), and the convolutions after it keep the format they are
    given. A view of pixel rows (the first image-by-image op of a network) is copied once here."""
    w = pim.as_image(_float(p), always=True)
    cast = (lambda t: t if t is None or t.dtype == w.dtype else t.to(w.dtype))
    return F.group_norm(w, groups, cast(weight), cast(bias), eps).to(p.dtype)


# ----------------------------------------------------------------------------- adaptive pooling
def _output_size(op: str, x: MJT, output_size, nsp: int, keep_ragged: bool = False) -> tuple:
    """The output sizes, ``None`` (the input's) resolved for static dims; for ragged dims kept as
    ``None`` with ``keep_ragged`` (``_keeping_ragged``), else refused."""
    sizes = (output_size,) * nsp if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(sizes) != nsp:
        raise ValueError(f"{op}(): expected output_size of {nsp} ints, got {output_size}")
    out: list = []
    for k, o in enumerate(sizes):
        d = len(x._size) - nsp + k
        if o is None:
            if d in x._ragged_dims:
                if keep_ragged:
                    out.append(None)
                    continue
                raise ValueError(
                    f"{op}(): expected an int output size for ragged dim {d} of {describe(x)} (None keeps the "
                    "input size, which differs per sample), got None"
                )
            o = x.shape[d]
        if int(o) < 0:
            raise ValueError(f"{op}(): expected output_size >= 0, got {output_size}")
        out.append(int(o))
    return tuple(out)


class _Pixels:
    """Every pixel of a channels-first input as a row of ``pv (N, C')`` (leading dims folded into
    C'), with its sample ``b``, coordinate per spatial axis and the sample's extent per axis
    (device), and the extents on the host (for window counts)."""

    def __init__(self, x: MJT, nsp: int):
        n = len(x._size)
        rd = x._ragged_dims
        stat = static_dims(n, rd)
        spatial = range(n - nsp, n)
        lead_vd = [stat.index(d) + 1 for d in range(1, n - nsp)]
        sp_static = [d for d in spatial if d not in rd]
        v = _values(x)
        self.dtype = v.dtype
        rows = v.shape[0]
        s = math.prod(x.shape[d] for d in sp_static)
        self.lead = tuple(x.shape[d] for d in range(1, n - nsp))
        # (P, *static spatial, *lead) → one row per pixel
        self.pv = v.permute(0, *[stat.index(d) + 1 for d in sp_static], *lead_vd).reshape(rows * s, math.prod(self.lead))
        p = x._partition
        sample, coords = p.row_coords()
        dev = v.device
        t = torch.arange(s, device=dev)
        self.b = sample.repeat_interleave(s) if s != 1 else sample
        self.coord, self.ext, self.host_ext = [], [], []
        inner = s
        host = p.host_sizes()  # SYNC: none — host sizes
        for d in spatial:
            if d in rd:
                k = rd.index(d)
                c = coords[:, k].repeat_interleave(s) if s != 1 else coords[:, k]
                self.coord.append(c)
                self.ext.append(p.device_sizes()[:, k])
                self.host_ext.append(host[:, k])
            else:
                size = x.shape[d]
                if s == 0:  # a static spatial dim of size 0: no pixels at all
                    self.coord.append(t)
                else:
                    inner //= size
                    self.coord.append(((t // inner) % size).repeat(rows))
                self.ext.append(torch.full((p.batch,), size, dtype=torch.int64, device=dev))
                self.host_ext.append(torch.full((p.batch,), size, dtype=torch.int64))
        self.batch = p.batch


def _sample_inputs(x: MJT, nsp: int, sizes: tuple[int, ...], average: bool):
    """Each sample's input to the dense adaptive pool — ``(N, C, *spatial)``, a view of its rows or
    its piece; ``None`` for a sample without pixels — unless the (pixel, window) pairs are the
    cheaper path for an average (NOTE [ Adaptive pooling sample by sample ] in
    ``kernels/per_image.py``): then ``None``."""
    n = len(x._size)
    lead = tuple(x.shape[1:n - nsp])
    channels = math.prod(lead)
    p = x._partition
    if pieces.holds_pieces(x):
        return pieces.split(x)
    if channels == 0:
        return [None] * p.batch  # every output empty (dense max pooling refuses 0 channels)
    rd = x._ragged_dims
    ragged_sizes, _ = sample_rows(p)  # SYNC: none — host sizes
    ext = [[ns[rd.index(d)] if d in rd else int(x.shape[d]) for d in range(n - nsp, n)] for ns in ragged_sizes]
    pixels = [math.prod(e) for e in ext]
    if average:
        pairs = sum(pixels)
        for a, o in enumerate(sizes):
            least = min((e[a] for e in ext if e[a]), default=0)
            pairs *= min(o, -(-o // least) + 1) if least else 1
        if not pim.adaptive_each_applies(p.batch, pairs, channels):
            return None
    if rd == (2, 3) and n == 4:
        return pieces.split(x)  # views (1, C, h, w) of the pixel rows
    comps = ref.unpack_components(_values(x), p.host_sizes(), rd)
    shape = lambda c: c.unsqueeze(0) if len(lead) == 1 else c if len(lead) == 2 else c.flatten(0, len(lead) - 2)  # noqa: E731
    return [shape(c) if k else None for c, k in zip(comps, pixels)]


def _candidates(px: _Pixels, sizes: tuple[int, ...]):
    """``(pix (M,), win (M,), nwin)``: for every pixel and every window that may hold it, the pixel
    row and the window's row in ``(B·Πsizes + 1)`` (the last one collects the candidates that are
    not in a window)."""
    nwin = px.batch * math.prod(sizes)
    n = px.pv.shape[0]
    dev = px.pv.device
    win = px.b.unsqueeze(1)
    ok = torch.ones(n, 1, dtype=torch.bool, device=dev)
    for c, e, he, o in zip(px.coord, px.ext, px.host_ext, sizes):
        ne = e.index_select(0, px.b)
        nz = he[he > 0]
        k = min(o, -(-o // int(nz.min())) + 1) if nz.numel() else 1  # SYNC: none — host sizes
        first = torch.div(c * o, ne.clamp_min(1), rounding_mode="floor")
        i = first.unsqueeze(1) + torch.arange(k, device=dev)  # (N, k) window index along this axis
        inside = (i < o) & (i * ne.unsqueeze(1) < (c.unsqueeze(1) + 1) * o)
        win = (win.unsqueeze(-1) * o + i.view(n, *([1] * (win.dim() - 1)), k)).flatten(1)
        ok = (ok.unsqueeze(-1) & inside.view(n, *([1] * (ok.dim() - 1)), k)).flatten(1)
    kk = win.shape[1]
    win = torch.where(ok, win, torch.full_like(win, nwin)).reshape(-1)
    pix = torch.arange(n, device=dev).repeat_interleave(kk)
    return pix, win, nwin


def _window_area(px: _Pixels, sizes: tuple[int, ...]) -> torch.Tensor:
    """(B·Πsizes,) pixel count of every window (0 for a sample without pixels)."""
    area = None
    for e, o in zip(px.ext, sizes):
        i = torch.arange(o, device=e.device)
        n = e.unsqueeze(1)
        length = -torch.div(-(i + 1) * n, o, rounding_mode="floor") - torch.div(i * n, o, rounding_mode="floor")
        area = length if area is None else (area.unsqueeze(-1) * length.view(length.shape[0], *([1] * (area.dim() - 1)), o))
    return area.reshape(-1)


def _dense_out(px: _Pixels, t: torch.Tensor, sizes) -> torch.Tensor:
    """Window rows ``(B·Πsizes, C')`` as dense ``(B, *lead, *sizes)``."""
    nsp = len(sizes)
    t = t.reshape(px.batch, *sizes, *px.lead)
    return t.permute(0, *range(nsp + 1, nsp + 1 + len(px.lead)), *range(1, nsp + 1))


def _adaptive_avg(x: MJT, sizes) -> torch.Tensor:
    px = _Pixels(x, len(sizes))
    pix, win, nwin = _candidates(px, sizes)
    pv = _float(px.pv)
    total = pv.new_zeros(nwin + 1, pv.shape[1]).index_add(0, win, pv.index_select(0, pix))[:nwin]
    out = total / _window_area(px, sizes).to(pv.dtype).unsqueeze(1)
    return _dense_out(px, out.to(px.dtype), sizes)


def _keeping_ragged(op: str, x: MJT, sizes: tuple, kind: str):
    """Adaptive pooling whose output size is ``None`` (the input's) at ragged spatial dims
    (``nn.AdaptiveAvgPool2d((1, None))``: a text line's height pooled, its width kept): a window
    of one along those dims, so the pooling runs along the other, static, dims alone, one dim
    after another (windows are products of per-dim windows; the average's count too), each by a
    gather of its windows' members. The ragged dims keep their nested ints."""
    n = len(x._size)
    out = x
    for k, o in enumerate(sizes):
        d = n - len(sizes) + k
        if o is None:
            continue
        if d in x._ragged_dims and o == 1:
            # a ragged side pooled to 1 (images of any height, each text line's height pooled, its
            # width kept): the whole extent of each sample; the max's gradient to its first maximum
            lengths = x._partition.extents[x._ragged_dims.index(d)].host_lengths()
            if bool((lengths == 0).any()):
                i = int((lengths == 0).nonzero()[0, 0])
                raise RuntimeError(f"{op}(): Expected input to have non-zero size for non-batch dimensions, but sample "
                                   f"{i} of {describe(x)} is empty along dimension {d}")
            out = out.mean(d, keepdim=True) if kind == "avg" else out.max(d, keepdim=True).values
            continue
        if d in x._ragged_dims:
            raise NotImplementedError(
                f"{op}(): pooling ragged dim {d} of {describe(x)} to {o} beside a ragged dim kept by None is not "
                "supported for layout torch.multi_jagged"
            )
        size = x._size[d]
        start = [(i * size) // o for i in range(o)]
        stop = [-((-(i + 1) * size) // o) for i in range(o)]
        width = max([b - a for a, b in zip(start, stop)] + [1])
        members = torch.tensor([[min(a + j, max(b - 1, a)) for j in range(width)] for a, b in zip(start, stop)],
                               dtype=torch.int64, device=x.device)
        real = torch.tensor([[j < b - a for j in range(width)] for a, b in zip(start, stop)], device=x.device)
        rows = out.movedim(d, -1).index_select(-1, members.reshape(-1)).unflatten(-1, (o, width))
        if kind == "avg":
            low = rows.dtype in (torch.float16, torch.bfloat16)
            w = rows.float() if low else rows
            count = torch.tensor([max(b - a, 0) for a, b in zip(start, stop)], dtype=w.dtype, device=x.device)
            pooled = torch.where(real, w, torch.zeros((), dtype=w.dtype, device=x.device)).sum(-1) / count
            pooled = pooled.to(rows.dtype) if low else pooled
        else:  # max: the first maximum of a window takes the gradient (amax would share it among
            # ties), a NaN propagates, as dense; a window's repeated last member changes nothing
            pooled = rows.max(-1).values
        out = pooled.movedim(-1, d)
    return out


def _pool_kind(op: str, x: MJT, nsp: int) -> str:
    """``"spatial"`` (every ragged dim a spatial one, the dims before them static) or
    ``"rows"`` (no ragged spatial dim: every packed row pools on its own)."""
    n = len(x._size)
    spatial = set(range(n - nsp, n))
    if n >= nsp + 2 and all(d in spatial for d in x._ragged_dims):
        return "spatial"
    if not any(d in spatial for d in x._ragged_dims) and x._values.dim() in (nsp + 1, nsp + 2):
        return "rows"
    raise NotImplementedError(
        f"{op}(): expected channels-first components (C, {', '.join('DHW'[3 - nsp:])}) whose ragged dims are "
        f"spatial, or static spatial dims, got {describe(x)} with ragged dims {x._ragged_dims} for layout "
        "torch.multi_jagged"
    )


def _probe(fn, x: MJT, nsp: int, sizes):
    # dense torch's own dtype check, on a one-pixel probe
    fn(torch.zeros((1,) * (nsp + 1), dtype=x.dtype, device=x.device), sizes)


def _adaptive_avg_route(fn, nsp: int):
    op = fn.__name__

    def routed(input, output_size):
        if not isinstance(input, MJT):
            return NotImplemented
        kind = _pool_kind(op, input, nsp)
        sizes = _output_size(op, input, output_size, nsp, keep_ragged=True)
        _probe(fn, input, nsp, tuple(1 if o is None else o for o in sizes))
        if None in sizes:
            return _keeping_ragged(op, input, sizes, "avg")
        n = len(input._size)
        if kind == "rows":
            return _finish(input, fn(_values(input), sizes))
        if all(o == 1 for o in sizes):
            # global pooling: the routed mean over the spatial dims (dense (B, C, 1, 1); compiles)
            return input.mean(tuple(range(n - nsp, n)), keepdim=True)
        parts = _sample_inputs(input, nsp, sizes, True)
        if parts is not None:
            # sample by sample (NOTE [ Adaptive pooling sample by sample ] in kernels/per_image.py)
            return pim.adaptive_pool_each(parts, lambda p: fn(p, sizes), (*input.shape[1:n - nsp], *sizes),
                                          float("nan"), input.dtype, input.device, anchor=lambda: _values(input))
        return _adaptive_avg(input, sizes)

    def traceable(input, output_size) -> bool:
        """Global pooling of ragged spatial dims (a mean) stays in the graph; so do calls that
        the route declines or refuses (its own error, raised while tracing)."""
        if not isinstance(input, MJT):
            return True
        try:
            return _pool_kind(op, input, nsp) == "spatial" and all(o == 1 for o in _output_size(op, input, output_size, nsp))
        except (ValueError, NotImplementedError):
            return True

    routed.__name__ = op
    return eager_route(_WHY_POOL, traceable=traceable)(routed)


def _adaptive_max_route(fn, nsp: int, always_indices: bool):
    op = f"adaptive_max_pool{nsp}d"

    def routed(input, output_size, return_indices=False):
        if not isinstance(input, MJT):
            return NotImplemented
        kind = _pool_kind(op, input, nsp)
        sizes = _output_size(op, input, output_size, nsp, keep_ragged=True)
        _probe(fn, input, nsp, tuple(1 if o is None else o for o in sizes))
        if None in sizes:
            if return_indices or always_indices:
                raise NotImplementedError(f"{op}(): return_indices with None output sizes at ragged dims of "
                                          f"{describe(input)} is not supported for layout torch.multi_jagged")
            return _keeping_ragged(op, input, sizes, "max")
        if kind == "rows":
            v = _values(input)
            out, idx = fn(v, sizes)
            out, idx = _finish(input, out), wrap(idx, input._partition, input._ragged_dims)
        else:  # sample by sample (NOTE [ Adaptive pooling sample by sample ] in kernels/per_image.py)
            out, idx = pim.adaptive_pool_each(_sample_inputs(input, nsp, sizes, False), lambda p: fn(p, sizes),
                                              (*input.shape[1:len(input._size) - nsp], *sizes), float("-inf"),
                                              input.dtype, input.device, indices=True, anchor=lambda: _values(input))
        return (out, idx) if return_indices or always_indices else out

    routed.__name__ = op
    return eager_route(_WHY_POOL, traceable=_declined)(routed)


route(F.adaptive_avg_pool2d)(_adaptive_avg_route(torch._C._nn.adaptive_avg_pool2d, 2))
route(F.adaptive_max_pool2d, F._adaptive_max_pool2d)(_adaptive_max_route(torch._C._nn.adaptive_max_pool2d, 2, False))
route(F.adaptive_max_pool2d_with_indices)(_adaptive_max_route(torch._C._nn.adaptive_max_pool2d, 2, True))
route(F.adaptive_avg_pool3d)(_adaptive_avg_route(torch._C._nn.adaptive_avg_pool3d, 3))
route(F.adaptive_max_pool3d, F._adaptive_max_pool3d)(_adaptive_max_route(torch._C._nn.adaptive_max_pool3d, 3, False))
route(F.adaptive_max_pool3d_with_indices)(_adaptive_max_route(torch._C._nn.adaptive_max_pool3d, 3, True))


@route(torch.instance_norm)
def _torch_instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                         cudnn_enabled=True):
    """``torch.instance_norm`` (``F.instance_norm``'s own call, its arguments in aten's order)."""
    return _instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def _channels_at_dim_1(x: MJT, weight) -> bool:
    """Whether ``x``'s only ragged dim, dim 1, is a channel dim: one size in every sample (images of
    one size), unless a weight sized as dim 2 and not as dim 1 says the components are ``(n, C, *)``
    (host lengths; eager)."""
    if torch.compiler.is_compiling():
        return False
    host = x._partition.extents[0].host_lengths()
    if host.numel() and not bool((host == host[0]).all()):
        return False
    n = int(host[0]) if host.numel() else None
    return weight is None or weight.numel() == n or weight.numel() != x.shape[2]


@route(F.group_norm)
def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Channels first: a dim 1 of one size in every sample is the channel dim (images of one size);
    a dim 1 that truly varies (or a weight of dim 2's size) makes components ``(n, C, *)``, whose dim
    0 is the dense call's batch (``torch.jagged``'s convention), on the values
    (``bridged.group_norm``): its decomposition would reshape across the ragged dim."""
    if not isinstance(input, MJT):
        return NotImplemented
    if input._ragged_dims == (1,) and input.dim() >= 3 and _channels_at_dim_1(input, weight):
        # images (or signals) of one size, whose dim 1 ``nested_tensor`` calls ragged: dim 1 is the
        # channel dim of every sample's dense call, as for batch and instance norm
        input = as_spatial("group_norm", input, input.dim() - 2)
    if input._ragged_dims and 1 not in input._ragged_dims and len(input._size) >= 3:
        # channels first with ragged spatial dims (B, C, j0, j1)
        return group_norm(input, num_groups, weight, bias, eps)
    if input._ragged_dims != (1,):
        raise ValueError(
            f"group_norm(): expected components (n, C, *) with only dim 1 ragged, got ragged dims "
            f"{input._ragged_dims} for layout torch.multi_jagged"
        )
    return bridged.group_norm(input, num_groups, weight, bias, eps)


# ----------------------------------------------------------------------------- composites over routed ops
# Python composites of ``torch.nn.functional`` that a multi_jagged input would run with its
# routes switched off (the composite is itself a torch function): written again here, dense
# torch's formula over the routed ops.
def _lp_pool_route(nsp: int):
    """``F.lp_pool{nsp}d``: dense torch's formula over the routed average pool of as many
    spatial dims, whatever the rank (``lp_pool1d`` of ``(B, S, C, j0)`` pools ``j0`` alone)."""
    avg = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]

    def routed(input, norm_type, kernel_size, stride=None, ceil_mode=False):
        if not isinstance(input, MJT) or input.dim() not in (nsp + 2, nsp + 3):
            return NotImplemented
        if isinstance(kernel_size, int):
            window = kernel_size ** nsp
        else:
            window = math.prod(kernel_size)
        out = avg(input.pow(norm_type), kernel_size, stride, 0, ceil_mode)
        return (torch.sign(out) * F.relu(torch.abs(out))).mul(window).pow(1.0 / norm_type)

    routed.__name__ = f"lp_pool{nsp}d"
    return routed


route(F.lp_pool1d)(_lp_pool_route(1))
route(F.lp_pool2d)(_lp_pool_route(2))
route(F.lp_pool3d)(_lp_pool_route(3))


@route(torch.group_norm)
def _torch_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """``torch.group_norm`` (``F.group_norm``'s own call, with cuDNN's flag)."""
    return _group_norm(input, num_groups, weight, bias, eps)


@route(F.local_response_norm)
def _local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """A window over the channels (dim 1, static) of each pixel: on the packed pixel rows
    ``(T, C, …)`` it is the dense op with the rows as its batch."""
    if not isinstance(input, MJT):
        return NotImplemented
    input = channels_first("local_response_norm", input)
    if input.dim() < 3 or 1 in input._ragged_dims:
        raise StructureError(f"local_response_norm(): expected (B, C, *spatial) with a static channel dim 1, got {describe(input)}")
    v = values_of(input)
    flat = v.dim() == 2  # (T, C): the dense op wants a spatial dim
    out = F.local_response_norm(v.unsqueeze(-1) if flat else v, size, alpha, beta, k)
    return wrap_values(out.squeeze(-1) if flat else out, input._partition, input._ragged_dims)
