"""Measure what the suite catches: plant plausible one-line bugs, one at a time, and run tests.

Not a test module (pytest collects ``test_*.py`` only). Each entry below is a one-line change a
reviewer could plausibly miss — an off-by-one, a dropped cast, a wrong tie rule, a swapped
order — in a handler, an index map or a backward formula. For each, the package and its tests are
copied to a scratch directory, the line is changed there, and pytest runs on the copy
(``PYTHONPATH`` puts it first) with ``-x``: a bug is *caught* when some test fails.

    python test/planted_bugs.py            # every planted bug, a table at the end
    python test/planted_bugs.py -k amax    # those whose name contains "amax"
    python test/planted_bugs.py --full     # run the whole suite per bug (slow), not the subset
    python test/planted_bugs.py --rev HEAD~3   # measure an earlier revision's suite

Each bug names the test files most likely to catch it; ``--full`` removes that hint, which
only matters for a bug the subset misses.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "torch_multijagged"


@dataclass(frozen=True)
class Bug:
    name: str
    file: str  # relative to the package
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # test files (relative to test/) to run


_FAST = ("test_fastpath.py", "test_pointwise.py", "test_double_backward.py", "test_gradients_reach_leaves.py",
         "test_nn.py", "test_ragged_reductions.py", "test_broadcast.py")
_ATT = ("test_attention_kernels.py", "test_attention.py", "test_attention_modules.py", "test_varlen_accessors.py")

BUGS = [
    # ------------------------------------------------------------------ handlers, index maps, backward formulas
    Bug("from_padded length check off by one", "constructors.py",
        "(col > padded.shape[d]).any()", "(col > padded.shape[d] + 1).any()", ("test_constructor_checks.py", "test_constructors.py", "test_errors.py")),
    Bug("masked_fill drops the dtype cast", "ops/elementwise/factory.py",
        "return pointwise(aten.where.self, mask, value.to(inp.dtype), inp)",
        "return pointwise(aten.where.self, mask, value, inp)", ("test_op_chains.py", "test_pointwise.py")),
    Bug("amax gradient: ties each take the whole gradient", "ops/reductions/reduce.py",
        "gi = g * hit / _to_rows(plan, _forward_k(plan, x, hit, \"sum\"))", "gi = g * hit",
        ("test_ragged_reductions.py", "test_reductions_static.py", "test_reduction_grads.py")),
    Bug("row_map visits kept dims in the wrong order", "kernels/reference.py",
        "for k in reversed(keep):", "for k in keep:", ("test_index_maps.py", "test_structure.py")),
    Bug("dense reduce_backward(mean) forgets 1/n", "compile/library.py",
        "return (grad / n).expand_as(x).clone()", "return grad.expand_as(x).clone()",
        ("test_opcheck.py", "test_reduction_grads.py", "test_ragged_reductions.py")),
    # ------------------------------------------------------------------ more of the same kind
    Bug("amax over an empty extent gives the highest value", "ops/reductions/reduce.py",
        "return info.min if kind == \"amax\" else info.max", "return info.max if kind == \"amax\" else info.min",
        ("test_ragged_reductions.py",)),
    Bug("mean counts rows, not static elements", "ops/reductions/reduce.py",
        "n *= v.shape[vd]", "n *= 1", ("test_ragged_reductions.py", "test_reductions_static.py")),
    Bug("logsumexp forgets to add back the max", "ops/reductions/reduce.py",
        "\"sum\").log() + m", "\"sum\").log()", ("test_ragged_reductions.py",)),
    Bug("prod gradient with one zero is zero", "ops/reductions/reduce.py",
        "only_me = torch.where(zero, nonzero_prod, torch.zeros_like(v))",
        "only_me = torch.zeros_like(v)", ("test_ragged_reductions.py",)),
    Bug("to_padded ignores the padding value", "ops/shape/padded.py",
        "flat = x._values.new_full((cells, *static), padding)",
        "flat = x._values.new_zeros((cells, *static))", ("test_constructors.py",)),
    Bug("square-pair row count from (Σn)² instead of Σn²", "structure.py",
        "total, mx, sq = sum(ns), max(ns, default=0), sum(n * n for n in ns)",
        "total, mx, sq = sum(ns), max(ns, default=0), sum(ns) ** 2",
        ("test_broadcast.py", "test_constructors.py")),
    Bug("row_map stride ignores the inner extent", "kernels/reference.py",
        "stride = n if stride is None else stride * n", "stride = n", ("test_index_maps.py", "test_structure.py")),
    Bug("eager row map: a segment's rank not scaled by the last extent", "structure.py",
        "start = start + (pidx - psub.offsets.index_select(0, seg_sample)) * n_last",
        "start = start + (pidx - psub.offsets.index_select(0, seg_sample))",
        ("test_structure.py", "test_broadcast.py", "test_ragged_reductions.py")),
    Bug("eager row map: kept last dim read as dropped", "structure.py",
        "    last = keep[-1] == r - 1\n", "    last = keep[-1] == r\n",
        ("test_structure.py", "test_broadcast.py", "test_ragged_reductions.py")),
    Bug("eager row map: the prefix shortcut taken for part of the prefix", "structure.py",
        "if not last and keep == tuple(range(r - 1)):", "if not last:",
        ("test_structure.py", "test_broadcast.py", "test_ragged_reductions.py")),
    Bug("binary call with equal-sized structures not relabelled", "tensor.py",
        "(isinstance(a, MultiJaggedTensor) and a._partition is b._partition)",
        "(isinstance(a, MultiJaggedTensor) and a._partition.batch == b._partition.batch)",
        ("test_double_backward.py", "test_gradients_reach_leaves.py", "test_broadcast.py", "test_njt_parity.py")),
    Bug("chunk's piece size floored instead of ceiled", "ops/shape/reshape.py",
        "size = -(-n // arg)  # dense chunk", "size = max(n // arg, 1)  # dense chunk",
        ("test_njt_shape_parity.py", "test_fastpath.py")),
    Bug("an expanded gradient reaches a view's backward outside the values path", "ops/shape/views.py",
        "    if torch._C._current_autograd_node() is not None and not ref._is_traced(values):",
        "    if False:", ("test_fastpath.py",)),
    Bug("unflatten's -1 inferred as the whole dim", "ops/shape/reshape.py",
        "return tuple(n // known if s == -1 else s for s in sizes)", "return tuple(n if s == -1 else s for s in sizes)",
        ("test_njt_shape_parity.py",)),
    Bug("a view's ragged size compared by identity only", "ops/shape/views.py",
        "    return a is b or a == b", "    return a is b",
        ("test_njt_shape_parity.py", "test_flatten_ragged.py", "test_njt_parity.py", "test_batch_moved.py")),
    Bug("argmax picks the last of tied maxima", "ops/reductions/reduce.py",
        "k_out = ref.segment_reduce(first, plan.index, plan.rows, \"amin\", empty=0)",
        "k_out = ref.segment_reduce(torch.where(hit, pos, torch.full_like(pos, -1)), plan.index, plan.rows, \"amax\", empty=0)",
        ("test_reduction_grads.py", "test_ragged_reductions.py")),
    # ------------------------------------------------------------------ unification, serialization, checks
    Bug("integer sum accumulates in the input dtype", "ops/reductions/reduce.py",
        "        return v.to(torch.int64)\n", "        return v\n", ("test_reduction_dtypes.py", "test_op_chains.py")),
    Bug("logsumexp of integers in float64, not the default dtype", "ops/reductions/reduce.py",
        "        return v.to(torch.get_default_dtype())", "        return v.double()",
        ("test_reduction_dtypes.py", "test_op_chains.py")),
    Bug("autograd.grad's inputs relabelled again", "ops/_routing.py",
        "    if held or isinstance(func, (torch._ops.OpOverload", "    if isinstance(func, (torch._ops.OpOverload",
        ("test_gradients_reach_leaves.py",)),
    Bug("double backward of a reduction ignores the local derivative", "compile/library.py",
        "d_grad = mj.reduce(gg * local, \"sum\", dim, keepdim)", "d_grad = mj.reduce(gg, \"sum\", dim, keepdim)",
        ("test_double_backward.py",)),
    Bug("row offsets not checked against sizes", "structure.py",
        "    if not torch.equal(off.diff(), counts):", "    if False:",
        ("test_serialization.py", "test_constructor_checks.py", "test_constructors.py")),
    # ------------------------------------------------------------------ attention
    Bug("causal mask hides the diagonal too", "kernels/attention_common.py",
        "hide = torch.ones(lm, sm, dtype=torch.bool, device=s.device).triu(1)",
        "hide = torch.ones(lm, sm, dtype=torch.bool, device=s.device).triu(0)", _ATT),
    Bug("padded queries' output gradient not zeroed", "kernels/attention_bucketed.py",
        "gb = bk.gather_q(grad, zero=True)", "gb = bk.gather_q(grad)", _ATT),
    Bug("padded keys not zeroed (0 · inf leaks across samples)", "kernels/attention_bucketed.py",
        "            g.index_fill_(0, self.kpad, 0)", "            pass", _ATT),
    Bug("GQA repeats kv heads instead of interleaving", "kernels/attention_common.py",
        "return x if r == 1 else x.repeat_interleave(r, dim=1)", "return x if r == 1 else x.repeat(1, r, 1, 1)", _ATT),
    Bug("bias gradient over broadcast heads takes head 0 only", "kernels/attention_bucketed.py",
        "ds = ds.sum(-1, keepdim=True)", "ds = ds[..., :1]", _ATT),
    Bug("bucket plan drops a bucket's last segment", "kernels/attention_bucketed.py",
        "buckets.append(order[start:i])", "buckets.append(order[start:i - 1])", _ATT),
    Bug("a bias shared by rows read as per-row blocks", "ops/attention/sdpa.py",
        "if len(kept) == len(qb):", "if len(kept) >= 0:", _ATT),
    Bug("default scale from the value's head size", "ops/attention/sdpa.py",
        "scale = 1.0 / math.sqrt(query._size[-1]) if scale is None else float(scale)",
        "scale = 1.0 / math.sqrt(value._size[-1]) if scale is None else float(scale)", _ATT),
    Bug("MHA with key is value: k/v projection takes the query's bias", "ops/attention/mha.py",
        "kp, vp = F.linear(k, w[e:], None if b is None else b[e:]).unflatten(-1, (2, e)).unbind(-2)",
        "kp, vp = F.linear(k, w[e:], None if b is None else b[:2 * e]).unflatten(-1, (2, e)).unbind(-2)", _ATT),
    # ------------------------------------------------------------------ the eager values path
    Bug("values path lets a dense operand reach one dim too far", "ops/fastpath.py",
        "return t.dim() <= _trailing(like)", "return t.dim() <= _trailing(like) + 1", _FAST),
    Bug("values path: a leaf's values answer autograd.grad for the leaf", "ops/fastpath.py",
        'x.__dict__["_vgraph"] = (v, v._version, False, _version(x))',
        'x.__dict__["_vgraph"] = (v, v._version, True, _version(x))', _FAST),
    Bug("values path: a static dim's values dim is its logical dim", "ops/fastpath.py",
        "return static_dims(len(x._size), x._ragged_dims).index(d) + 1",
        "return static_dims(len(x._size), x._ragged_dims).index(d)", _FAST),
    Bug("values path: a no-grad alias lends its values' graph", "ops/fastpath.py",
        "return v.detach() if v.requires_grad else v", "return v", _FAST),
    Bug("values path: reductions drop keepdim", "ops/fastpath.py",
        "return _finish(_red._reduce(aten_op, input, dims, keepdim, kind, dtype, values=v, plan=plan))",
        "return _finish(_red._reduce(aten_op, input, dims, False, kind, dtype, values=v, plan=plan))", _FAST),
    Bug("values path: dense-first operands swapped", "ops/fastpath.py",
        "return result(func(a, values(b), **kwargs), b._partition, b._ragged_dims)",
        "return result(func(values(b), a, **kwargs), b._partition, b._ragged_dims)", _FAST),
    Bug("values path: autograd.grad asks the wrapper of an intermediate, not its values", "ops/fastpath.py",
        "owned = [own_values(t) for t in ins]", "owned = [None for t in ins]", _FAST),
    # ------------------------------------------------------------------ torch.jagged parity
    Bug("flat argmax indexes the packed rows, not torch.jagged's values() layout", "ops/reductions/reduce.py",
        "return x._values.movedim(0, x._ragged_dims[0] - 1) if len(x._ragged_dims) == 1 else x._values",
        "return x._values", ("test_njt_gaps.py", "test_njt_opinfo.py")),
    Bug("scan shift reads across a sample boundary", "ops/nn/ragged.py",
        "ok = (src >= 0) & (src < sizes[sample, k])", "ok = src < sizes[sample, k]", ("test_ragged_nn.py",)),
    Bug("negative ragged index counts from the previous sample", "ops/indexing/gather.py",
        "a = _check_in_range(op, idx[d], n[..., k], f\"ragged dim {d}\")",
        "a = idx[d]", ("test_indexing_ops.py",)),
    Bug("conv accepts a ragged conv dim", "ops/vision/conv.py",
        "if input._ragged_dims != (1,) or len(input._size) != nspatial + 3:",
        "if len(input._size) != nspatial + 3:", ("test_njt_gaps.py",)),
    Bug("errors keep the aten name", "tensor.py",
        "    e.args = (f\"{name}(): {msg[m.end():]}{note}\",) + e.args[1:]", "    return", ("test_njt_gaps.py",)),
    Bug("assert_close ignores per-sample extents", "_testing.py",
        "if a._partition is not b._partition and not torch.equal(a.sizes(), b.sizes()):", "if False:", ("test_njt_gaps.py",)),
    # ------------------------------------------------------------------ the Pairformer
    Bug("pair_matmul backward: dX forgets Y's transpose", "compile/pair_mm.py",
        "dx = mm(grad, y, False, not ty) if not tx", "dx = mm(grad, y, False, ty) if not tx",
        ("test_pair_matmul.py",)),
    Bug("bucketed pair_matmul leaves padded cells unzeroed", "kernels/pair_mm.py",
        "    if pad is not None:\n        out.masked_fill_", "    if False:\n        out.masked_fill_", ("test_pair_matmul.py",)),
    Bug("bucketed pair_matmul: padded runs start uninitialised", "kernels/pair_mm.py",
        "out = (x.new_zeros if padded else x.new_empty)(", "out = x.new_empty(", ("test_pair_matmul.py",)),
    Bug("bucketed pair_matmul: a padded run written back from the wrong corner", "kernels/pair_mm.py",
        "copy_(r[k:k + m, :, :n, :n].permute(0, 2, 3, 1))", "copy_(r[k:k + m, :, size - n:, size - n:].permute(0, 2, 3, 1))",
        ("test_pair_matmul.py",)),
    Bug("bucketed pair_matmul: runs merge samples of different lengths", "kernels/pair_mm.py",
        "if runs and runs[-1][2] == b - 1 and runs[-1][3] == lengths[b]:", "if runs and runs[-1][2] == b - 1:",
        ("test_pair_matmul.py",)),
    Bug("einsum: a's transpose flag read from the wrong ragged subscript", "ops/contractions/pair_mm.py",
        "res = (mm or mj.pair_matmul)(a, b, ra[0] == k, rb[1] == k)", "res = (mm or mj.pair_matmul)(a, b, ra[1] == k, rb[1] == k)",
        ("test_pair_matmul.py",)),
    Bug("attention blocks: bias gradient of one row, not summed over the run", "kernels/attention_blocks.py",
        "dacc += ds.sum(0)  # (Hq, Lq, Lk)", "dacc += ds[0]  # (Hq, Lq, Lk)",
        ("test_attention_kernels.py", "test_pairformer.py")),
    Bug("shared bias blocks keyed by start only", "kernels/attention_bucketed.py",
        "starts = torch.stack([bias_start.index_select(0, self.segs), self.lq, self.lk], 1)",
        "starts = torch.stack([bias_start.index_select(0, self.segs), self.lq * 0, self.lk * 0], 1)",
        ("test_attention_kernels.py",)),
    # ------------------------------------------------------------------ images
    Bug("canvas gutter ignores the left padding", "kernels/canvas.py",
        "        return max(self.pad_l, r)", "        return r", ("test_spatial.py",)),
    Bug("avg pooling divisor: count_include_pad inverted", "kernels/canvas.py",
        "        if count_include_pad:\n            div = div * (hi - lo)", "        if not count_include_pad:\n            div = div * (hi - lo)",
        ("test_spatial.py",)),
    Bug("weight gradient taps shifted the wrong way", "kernels/canvas.py",
        "offs = [margin + sum((t * d - p) * w", "offs = [margin + sum((p - t * d) * w", ("test_spatial.py",)),
    Bug("size rule forgets the stride (two windows share a nested int)", "kernels/canvas.py",
        "        return (\"floor\", a, self.stride)", "        return (\"floor\", a)", ("test_spatial.py",)),
    Bug("batch norm backward drops the mean of the gradient", "kernels/norms.py",
        "gx = torch.addcmul(torch.addcmul((-scale * gb / n).view(shape)", "gx = torch.addcmul(torch.addcmul((0 * gb).view(shape)",
        ("test_image_norms.py",)),
    Bug("batch norm's fast backward keeps a statistic off by 0.1 %", "kernels/norms.py",
        "ctx.save_for_backward(x, weight, mean, invstd.view(-1))",
        "ctx.save_for_backward(x, weight, mean, invstd.view(-1) * 1.001)", ("test_image_norms.py",)),
    Bug("segment norm's fast backward centres on a stale mean", "kernels/norms.py",
        "xhat = (x - mean.index_select(0, sample).unsqueeze(2)).mul_(r)",
        "xhat = (x - 1.001 * mean.index_select(0, sample).unsqueeze(2)).mul_(r)", ("test_image_norms.py",)),
    Bug("canvas blocks: an image's rows one canvas row too wide apart", "kernels/canvas.py",
        "return buf.as_strided((h, w, buf.shape[1]), (width * s0, s0, s1)",
        "return buf.as_strided((h, w, buf.shape[1]), ((width + 1) * s0, s0, s1)", ("test_canvas_paths.py",)),
    Bug("per-image group norm drops the affine weight", "kernels/norms.py",
        "permute(0, 3, 1, 2), weight, bias, 1, c, n, groups, eps)",
        "permute(0, 3, 1, 2), None, bias, 1, c, n, groups, eps)", ("test_canvas_paths.py",)),
    Bug("attention blocks: output left unfilled where a segment has queries but no keys", "kernels/attention_blocks.py",
        "covered = sum(m * lq for _, m, lq, _ in runs) == q.shape[0]", "covered = True", _ATT),
    Bug("eager sdpa skips the differentiable op when only the values path asks", "ops/attention/sdpa.py",
        "elif differentiable and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qv, kv, vv, bias)):",
        "elif False:", _ATT + _FAST),
    Bug("bucketed attention: a gathered bias leaves padded keys unmasked", "kernels/attention_bucketed.py",
        "        if kpad is not None:\n            g.masked_fill_(kpad, NEG_INF)", "        if False:\n            g.masked_fill_(kpad, NEG_INF)",
        _ATT),
    Bug("bucketed attention: bias gradient scattered from the blocks' first positions", "kernels/attention_bucketed.py",
        "dbias.index_add_(0, dst, ds if pos is None else ds.index_select(0, pos))",
        "dbias.index_add_(0, dst, ds[: dst.shape[0]])", _ATT),
    Bug("per-image conv reads an image's rows transposed", "pieces.py",
        "out.append(None if h * w == 0 else r.view(1, h, w, c).permute(0, 3, 1, 2))",
        "out.append(None if h * w == 0 else r.view(1, w, h, c).permute(0, 3, 2, 1))",
        ("test_canvas_paths.py", "test_pieces.py")),
    Bug("per-image conv path ignores the dilation", "ops/vision/conv.py",
        "F.conv2d(p, weight, bias, stride, padding, dilation, groups)",
        "F.conv2d(p, weight, bias, stride, padding, 1, groups)", ("test_canvas_paths.py",)),
    Bug("pieces: packing puts every image at the first rows", "kernels/per_image.py",
        "            o += h * w\n    return out", "            o += 0\n    return out", ("test_pieces.py",)),
    Bug("pieces: consumers read the pieces past the wrapper (hooks and grads of it miss them)", "pieces.py",
        "        it = iter(_PiecesOf.apply(x, [p for p in pieces if p is not None]))",
        "        it = iter([p for p in pieces if p is not None])", ("test_pieces.py",)),
    Bug("unfold of a static width: patches column-major within a row", "ops/vision/conv.py",
        "v = v.movedim(2, 1).reshape(-1, v.shape[1])", "v = v.reshape(-1, v.shape[1])", ("test_spatial.py",)),
    Bug("interpolate to another batch's sizes: resizing an empty image is not refused", "ops/vision/resample.py",
        "bad = ((host_in == 0).any(1) != (host_out == 0).any(1)).nonzero()", "bad = host_in[:0].nonzero()",
        ("test_resample.py",)),
    Bug("istft ignores the waveforms' lengths", "ops/nn/ragged.py",
        "parts.append(torch.istft(s, length=n, **kw))", "parts.append(torch.istft(s, **kw)[:n])", ("test_ragged_nn.py",)),
    Bug("pieces: max pooling per image drops ceil_mode", "ops/vision/conv.py",
        "lambda t: F.max_pool2d(t, k, s, p, d, bool(ceil_mode))", "lambda t: F.max_pool2d(t, k, s, p, d, False)",
        ("test_pieces.py",)),
    Bug("pieces: an in-place activation writes into the old pieces", "ops/fastpath.py",
        "rest = dict(kwargs, inplace=False)", "rest = dict(kwargs)", ("test_pieces.py",)),
    Bug("pieces: an in-place add reads the tensor itself for the other operand", "pieces.py",
        "fn(p, q) for p, q in zip(split(x), split(other))", "fn(p, q) for p, q in zip(split(x), split(x))",
        ("test_pieces.py",)),
    Bug("pieces: a channel cat counts the first operand's channels only", "ops/indexing/joins.py",
        "c = sum(t._size[1] for t in tensors)", "c = first._size[1]", ("test_pieces.py",)),
    Bug("pieces: group norm per image ignores eps", "ops/vision/norms.py",
        "return F.group_norm(w, groups, cast(weight), cast(bias), eps).to(p.dtype)",
        "return F.group_norm(w, groups, cast(weight), cast(bias)).to(p.dtype)", ("test_pieces.py",)),
    Bug("pieces: the mean of an image without pixels is 0", "pieces.py",
        '0.0 if kind == "sum" else float("nan")', "0.0", ("test_pieces.py",)),
    Bug("group norm's fast backward halves the projection on x-hat", "kernels/norms.py",
        "gx = gp.sub_(xhat.mul_(b.index_select(0, sample).unsqueeze(2))).mul_(r)",
        "gx = gp.sub_(xhat.mul_(b.index_select(0, sample).unsqueeze(2) * 0.5)).mul_(r)", ("test_image_norms.py",)),
    Bug("group norm's double backward forgets the weight", "kernels/norms.py",
        "gp = grad if weight is None else (grad.view(per_channel) * _per_channel(weight, g)).view(p, g, k)\n            a = x",
        "gp = grad\n            a = x", ("test_image_norms.py",)),
    Bug("pixel rows of a static spatial dim in the wrong order", "ops/vision/conv.py",
        "        pix = pix * sz[s, a] + comp[a]", "        pix = pix + comp[a] * sz[s, a]", ("test_spatial.py",)),
    # ------------------------------------------------------------------ order statistics along ragged dims
    Bug("sort not stable by segment", "kernels/along.py",
        "_, by_segment = torch.sort(seg, dim=0, stable=True)", "_, by_segment = torch.sort(seg, dim=0)",
        ("test_order_stats.py",)),
    Bug("nanmedian counts NaNs", "ops/reductions/order.py",
        "        m = length - nans\n", "        m = length\n", ("test_order_stats.py",)),
    Bug("cummax tie rule >= becomes >", "ops/reductions/order.py",
        "(v >= ev) if is_max", "(v > ev) if is_max", ("test_order_stats.py",)),
    Bug("topk k check off by one (k = n + 1 passes)", "ops/reductions/order.py",
        "lambda n: (n < kk) |", "lambda n: (n < kk - 1) |", ("test_order_stats.py",)),
    Bug("cummax/cummin: an earlier NaN keeps the index from a later NaN", "ops/reductions/order.py",
        "later_wins = nan | (~en & ((v >= ev) if is_max else (v <= ev)))",
        "later_wins = ~en & (nan | ((v >= ev) if is_max else (v <= ev)))", ("test_order_stats.py",)),
    Bug("median picks the upper median", "ops/reductions/order.py",
        'torch.where(nans > 0, length - nans, torch.div(length - 1, 2, rounding_mode="floor"))',
        'torch.where(nans > 0, length - nans, torch.div(length, 2, rounding_mode="floor"))', ("test_order_stats.py",)),
    # ------------------------------------------------------------------ indexing and joins along ragged dims
    Bug("slice start not clamped at the sample's end", "kernels/along.py",
        "        return torch.minimum(b.clamp_min(0), n)", "        return b.clamp_min(0)", ("test_ragged_indexing.py",)),
    Bug("flip reads one past the sample's end", "ops/indexing/slicing.py",
        "a[:, k] = nk - 1 - a[:, k]", "a[:, k] = nk - a[:, k]", ("test_ragged_indexing.py",)),
    Bug("select: a negative index counts from the longest sample", "ops/indexing/slicing.py",
        "return n + index if index < 0 else torch.full_like(n, index)",
        "return n.max() + index if index < 0 else torch.full_like(n, index)", ("test_ragged_indexing.py",)),
    Bug("cat: the second piece starts at the first's offset, not after it", "ops/indexing/joins.py",
        "        start = start + n\n", "        start = start\n", ("test_ragged_indexing.py",)),
    Bug("reflect padding mirrors about the edge cell's outer side", "ops/indexing/joins.py",
        "return torch.where(r >= n, 2 * (n - 1) - r, r), None", "return torch.where(r >= n, 2 * n - 1 - r, r), None",
        ("test_ragged_indexing.py",)),
    Bug("gather's index range not checked per sample", "ops/indexing/slicing.py",
        "    if bool(bad.any()):", "    if False:", ("test_ragged_indexing.py", "test_reduction_grads.py")),
    # ------------------------------------------------------------------ contractions and batch-moved tokens
    Bug("einsum by broadcasting sums only the last contracted subscript", "ops/contractions/einsum.py",
        "product = product.sum(dim=list(range(len(out), len(order))))", "product = product.sum(dim=len(order) - 1)",
        ("test_contractions.py",)),
    Bug("einsum by broadcasting aligns operands in their own order", "ops/contractions/einsum.py",
        "perm = sorted(range(len(t)), key=lambda i: order.index(t[i]))", "perm = list(range(len(t)))",
        ("test_contractions.py",)),
    Bug("token index: remaining dims not renumbered", "ops/shape/leading.py",
        "return _settle(picked, tuple(p - (p > s) for p in self._perm[1:]))", "return _settle(picked, tuple(self._perm[1:]))",
        ("test_batch_moved.py",)),
    Bug("token reduction: kept dims not renumbered", "ops/shape/leading.py",
        "remap = {p: p - sum(g < p for g in gone) for p in kept}", "remap = {p: p for p in kept}",
        ("test_batch_moved.py",)),
    Bug("per-sample results packed without moving their ragged dims first", "ops/_common.py",
        "    order = list(ragged) + [d for d in range(c.dim()) if d not in ragged]", "    order = list(range(c.dim()))",
        ("test_trailing_ops.py",)),
    Bug("FFT along a ragged dim: the component's dim read one off", "ops/elementwise/trailing.py",
        "fn(c, s, [d - 1 for d in canon], norm)", "fn(c, s, [d for d in canon if d < c.dim()] or [-1], norm)",
        ("test_trailing_ops.py",)),
    Bug("per-volume conv pads the axes in the wrong order", "ops/vision/conv.py",
        "F.conv3d(F.pad(v, [a for pr in reversed(pads) for a in pr])", "F.conv3d(F.pad(v, [a for pr in pads for a in pr])",
        ("test_spatial.py",)),
    Bug("per-volume outputs packed with the spatial axes reversed", "ops/vision/conv.py",
        "outs.append(out[0].permute(1, 2, 3, 0).reshape(-1, out.shape[1]))",
        "outs.append(out[0].permute(3, 2, 1, 0).reshape(-1, out.shape[1]))", ("test_spatial.py",)),
    Bug("solve's dense right-hand side passed unexpanded to the packed matrices", "ops/contractions/linalg.py",
        "    return b.expand(x._values.shape[0], *b.shape)", "    return b", ("test_linalg.py",)),
    Bug("selected samples gather only their first row", "constructors.py",
        "    rows_index = (first + rank).to(p.offsets.device)", "    rows_index = (first + 0 * rank).to(p.offsets.device)",
        ("test_getitem.py",)),
    Bug("a negative feature index not wrapped", "ops/indexing/getitem.py",
        "                idx = torch.where(idx < 0, idx + int(out.shape[d]), idx)", "                idx = idx.abs()",
        ("test_getitem.py",)),
    Bug("batch-merged token: a dim read one off", "ops/shape/merged.py",
        "        return d + 1\n", "        return d\n", ("test_batch_merged.py",)),
    Bug("batch-merged dense operand split (K, B) for (B, K)", "ops/shape/merged.py",
        "return a.unflatten(0, (t._mjt._size[0], t._k))", "return a.unflatten(0, (t._k, t._mjt._size[0])).transpose(0, 1)",
        ("test_batch_merged.py",)),
    Bug("baddbmm adds input when beta is 0", "ops/shape/merged.py",
        "    if beta == 0:  # dense", "    if False:  # dense", ("test_batch_merged.py",)),
    Bug("batch merge accepts a -1 that is not B·K", "ops/shape/merged.py",
        "    return math.prod(statics) * k == math.prod(own)", "    return True", ("test_batch_merged.py",)),
    Bug("values-path split along the last values dim", "ops/fastpath.py",
        "pieces = getattr(values(input), method)(arg, _values_dim(input, d))",
        "pieces = getattr(values(input), method)(arg, -1)",
        ("test_structure_copies_splits.py",)),
    Bug("values-path unflatten leaves later ragged dims where they were", "ops/fastpath.py",
        "tuple(r + k if r > d else r for r in input._ragged_dims)", "input._ragged_dims",
        ("test_structure_copies_splits.py",)),
    Bug("values-path flatten shifts later ragged dims by one too many", "ops/fastpath.py",
        "tuple(r - (e - s) if r > e else r for r in input._ragged_dims)",
        "tuple(r - (e - s + 1) if r > e else r for r in input._ragged_dims)",
        ("test_structure_copies_splits.py",)),
    Bug("values-path flatten span admits a ragged dim at its ends", "ops/fastpath.py",
        "any(s <= r <= e for r in input._ragged_dims)", "any(s < r < e for r in input._ragged_dims)",
        ("test_structure_copies_splits.py", "test_flatten_ragged.py")),
    Bug("values-path pair product swaps the transpose flags", "ops/fastpath.py",
        "_pm.pair_matmul_on_values(a._partition, values(a), values(b), tx, ty)",
        "_pm.pair_matmul_on_values(a._partition, values(a), values(b), ty, tx)", ("test_pair_matmul.py",)),
    Bug("pair product skips a needed output permute", "ops/contractions/pair_mm.py",
        "return res if order == list(range(len(order))) else res.permute(order)", "return res",
        ("test_pair_matmul.py",)),
    Bug("values-path split pieces not marked as multi-output views", "ops/fastpath.py",
        'y.__dict__["_split_piece"] = True', "pass",
        ("test_structure_copies_splits.py",)),
    Bug("batch flatten lets a row straddle two samples", "ops/shape/tokens.py",
        "if inner == 0 or tail % inner:", "if inner == 0:", ("test_flatten_batch.py",)),
    Bug("batch flatten reads a static-lead batch in storage order", "ops/shape/tokens.py",
        "if x._ragged_dims == tuple(range(1, k + 1)) or x._partition.batch == 0:", "if True:", ("test_flatten_batch.py",)),
    Bug("FlatBatch restores with another batch's nested ints", "ops/shape/tokens.py",
        "s is n or (is_nested_int(s) and s == n)", "is_nested_int(s)", ("test_flatten_batch.py",)),
    Bug("FlatBatch results lose the batch they came from", "ops/shape/tokens.py",
        "return _mark_all(out, batch)", "return out", ("test_flatten_batch.py",)),
    Bug("recurrent layer's final states left in length order", "ops/nn/rnn.py",
        "finals = [h.index_copy(1, order, f) for h, f in zip(states, finals)]",
        "finals = [h.index_copy(1, order.sort().values, f) for h, f in zip(states, finals)]", ("test_rnn.py",)),
    Bug("recurrent layer's time-major rows shifted by one step", "ops/nn/rnn.py",
        "rows = (starts[k] + t).to(p.offsets.device)", "rows = (starts[k] + t.clamp(max=0)).to(p.offsets.device)",
        ("test_rnn.py",)),
    Bug("per-sample linalg packs each matrix transposed", "ops/contractions/linalg.py",
        "torch.cat([p.reshape(n * n, *p.shape[2:]) for p, n in zip(parts, lengths)])",
        "torch.cat([p.transpose(0, 1).reshape(n * n, *p.shape[2:]) for p, n in zip(parts, lengths)])", ("test_linalg.py",)),
    Bug("linalg takes a rectangular pair for square matrices", "ops/contractions/linalg.py",
        "if x._ragged_dims == (1, 2) and n == 3 and x._partition.extents[0] is x._partition.extents[1]:",
        "if x._ragged_dims == (1, 2) and n == 3:", ("test_linalg.py",)),
    Bug("linalg rows path pairs operands of different structures", "ops/contractions/linalg.py",
        "if not _structures_match(m, x):", "if False:", ("test_linalg.py",)),
    Bug("channel dropout draws one mask for the whole batch", "ops/nn/norms.py",
        "shape = (input.shape[0], input.shape[1], *([1] * (ndim - 2)))", "shape = (1,)", ("test_channel_dropout.py",)),
    Bug("ctc loss drops the last target label", "ops/nn/losses.py",
        "        targets = targets.values()\n", "        targets = targets.values()[:-1]\n", ("test_losses.py",)),
    Bug("nanquantile ranks over the NaNs too", "ops/reductions/order.py",
        "ranks = (qt * (length - nans - 1)).clamp_min(0)", "ranks = (qt * (length - 1)).clamp_min(0)", ("test_quantile.py",)),
    Bug("quantile's midpoint weighs as linear", "ops/reductions/order.py",
        'weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below',
        "weights = ranks - below", ("test_quantile.py",)),
    Bug("quantile's lower rounds up", "ops/reductions/order.py",
        "        ranks = ranks.floor()\n", "        ranks = ranks.ceil()\n", ("test_quantile.py",)),
    Bug("take reads every sample from the first one's start", "ops/indexing/scatter.py",
        "picked = flat[torch.where(iv < 0, iv + n, iv) + starts[sample]]", "picked = flat[torch.where(iv < 0, iv + n, iv)]",
        ("test_ragged_indexing.py",)),
    Bug("take wraps negative indices by the whole batch", "ops/indexing/scatter.py",
        "picked = flat[torch.where(iv < 0, iv + n, iv) + starts[sample]]",
        "picked = flat[torch.where(iv < 0, iv + flat.shape[0], iv) + starts[sample]]", ("test_ragged_indexing.py",)),
    Bug("local_response_norm windows the last dim instead of the channels", "ops/vision/norms.py",
        "out = F.local_response_norm(v.unsqueeze(-1) if flat else v, size, alpha, beta, k)",
        "out = F.local_response_norm(v.unsqueeze(1) if flat else v.transpose(1, -1), size, alpha, beta, k)",
        ("test_image_norms.py",)),
    Bug("FFT along a static dim takes the values dim one off", "ops/elementwise/trailing.py",
        "return static_dims(x.dim(), x._ragged_dims).index(d) + 1", "return static_dims(x.dim(), x._ragged_dims).index(d)",
        ("test_trailing_ops.py",)),
    Bug("unique's inverse keeps the values' flat shape", "ops/elementwise/trailing.py",
        "return (values, MJT(inverse.reshape(v.shape), input._partition, input._ragged_dims), *counts)",
        "return (values, inverse, *counts)", ("test_trailing_ops.py",)),
    Bug("scatter_reduce along a ragged dim ignores include_self", "ops/indexing/slicing.py",
        "out = v.scatter_reduce(0, rows, s.to(v.dtype), add, include_self=include_self)",
        "out = v.scatter_reduce(0, rows, s.to(v.dtype), add)", ("test_ragged_indexing.py",)),
    Bug("repeat_interleave's new lengths count every sample's repeats into the first", "ops/indexing/joins.py",
        "0, x._partition.row_sample().cpu(), counts.cpu())", "0, torch.zeros_like(x._partition.row_sample()).cpu(), counts.cpu())",
        ("test_ragged_indexing.py",)),
    Bug("searchsorted with per-sample boundaries lets a value land in the padding", "ops/elementwise/pointwise.py",
        "        found = torch.minimum(found, n.unsqueeze(1).to(found.dtype)).reshape(padded.shape)\n",
        "        found = found.reshape(padded.shape)\n", ("test_ragged_indexing.py",)),
    Bug("pdist keeps the diagonal pairs", "ops/nn/distances.py",
        "upper = (coords[:, 0] < coords[:, 1]).nonzero().squeeze(1)", "upper = (coords[:, 0] <= coords[:, 1]).nonzero().squeeze(1)",
        ("test_distances_windows.py",)),
    Bug("FlatBatch splits its rows evenly on view(B, -1)", "ops/shape/tokens.py",
        "if len(nested) == 1 and len(shape) >= 2 and shape[1] == -1:", "if False:", ("test_flatten_batch.py",)),
    Bug("stft packs each spectrogram frequency-major", "ops/nn/ragged.py",
        "parts.append(torch.stft(w, **kw).transpose(0, 1))  # (frames, F, …)",
        "parts.append(torch.stft(w, **kw).reshape(-1, torch.stft(w, **kw).shape[0]))", ("test_ragged_nn.py",)),
    Bug("max_unpool writes every image from the batch's first row", "ops/vision/conv.py",
        "target = indices._values + out_p.offsets[sample].unsqueeze(1)", "target = indices._values + 0 * out_p.offsets[sample].unsqueeze(1)",
        ("test_spatial.py",)),
    Bug("grid_sample packs each output channel-major", "ops/vision/resample.py",
        "    perm = front + [d for d in range(3) if d not in front]\n", "    perm = [0, 1, 2]\n", ("test_resample.py",)),
    Bug("max_unpool to given sizes skips the default ± stride check", "ops/vision/conv.py",
        "bad = (base > 0) & ((want < base - s[a]) | (want > base + s[a]))", "bad = want < 0", ("test_spatial.py",)),
    Bug("fold gives every image the first one's size", "ops/vision/resample.py",
        "hs = extents[0].host_lengths().tolist() if extents else [int(sizes[0])] * x.shape[0]",
        "hs = [int(extents[0].host_lengths()[0])] * x.shape[0] if extents else [int(sizes[0])] * x.shape[0]",
        ("test_resample.py",)),
    Bug("FlatBatch marks attributes (an endless chain of aliases)", "ops/shape/tokens.py",
        'if getattr(func, "__name__", None) == "__get__":', "if False:", ("test_flatten_batch.py",)),
    Bug("unique_consecutive runs cross sample boundaries", "ops/indexing/gather.py",
        "keep = rows == p.offsets[sample]  # a sample's first row starts a run", "keep = rows == 0",
        ("test_indexing_ops.py",)),
    Bug("dense queries read back in the wrong order", "ops/attention/sdpa.py",
        "return v.reshape(b, length, *v.shape[1:]).movedim(1, n - 2)", "return v.reshape(b, *v.shape[1:-1], length, v.shape[-1])",
        ("test_attention_dense_sides.py", "test_attention_modules.py")),
    Bug("matmul with a dense operand forgets size-1 broadcasting", "ops/contractions/matmul.py",
        "ones = [d for d in range(1, len(lead)) if dense.shape[d] == 1 and mjt._size[d] != 1]", "ones = []",
        ("test_matmul.py",)),
    Bug("scaled_grouped_mm gives every sample the first matrix", "ops/contractions/matmul.py",
        "outs = [torch._scaled_mm_v2(r, mat_b[i], scale_a", "outs = [torch._scaled_mm_v2(r, mat_b[0], scale_a",
        ("test_matmul.py",)),
    Bug("unfold along a ragged dim forgets the step", "ops/indexing/slicing.py",
        "a[:, k] = a[:, k] * step + t", "a[:, k] = a[:, k] + t", ("test_ragged_indexing.py",)),
    Bug("a row mask indexes elements of the wrong rows (no reordering for a static lead)", "ops/indexing/gather.py",
        "return out if _ragged_lead(x) else out[_logical_order(x, mask._values)]\n\n\n@register",
        "return out\n\n\n@register", ("test_indexing_ops.py",)),
    Bug("one-row segment sum promotes integers", "kernels/reference.py",
        "out = values.sum(0, keepdim=True, dtype=values.dtype)", "out = values.sum(0, keepdim=True)",
        ("test_reduction_dtypes.py",)),
    Bug("index assignment writes the selection's values in reverse order", "ops/indexing/scatter.py",
        "at[flat] = torch.arange(flat.numel(), device=v.device)", "at[flat] = torch.arange(flat.numel(), device=v.device).flip(0)",
        ("test_getitem.py",)),
    Bug("index assignment ignores the value's gradient", "ops/indexing/scatter.py",
        "src_flat = (src.values() if isinstance(src, MJT) else src).reshape(-1)",
        "src_flat = (src.values() if isinstance(src, MJT) else src).reshape(-1).detach()", ("test_getitem.py",)),
    Bug("a product of ragged sizes forgets the second factor", "structure.py",
        "return flat_extent(partition_for(_factors(ea) + _factors(eb)))", "return flat_extent(partition_for(_factors(ea)))",
        ("test_flatten_ragged.py",)),
    Bug("floor division of a ragged size rounds up", "structure.py",
        'lambda n: torch.div(n, k, rounding_mode="floor")', 'lambda n: -torch.div(-n, k, rounding_mode="floor")',
        ("test_flatten_ragged.py",)),
    Bug("a dense expand_as keeps the dense shape", "ops/elementwise/pointwise.py",
        "    mask = torch.zeros_like(other, dtype=torch.bool).detach()\n    try:",
        "    mask = torch.zeros_like(other, dtype=torch.bool).detach()[..., :1]\n    try:", ("test_broadcast.py",)),
    Bug("SDPA broadcasts a single head to the wrong dim", "ops/attention/sdpa.py",
        "if len(got) == 2 and 1 in got:", "if len(got) == 2 and 1 in got and d > 1:", ("test_attention.py",)),
]


def _tree(dest: pathlib.Path, rev: str | None) -> None:
    """The package, its tests and pyproject.toml from the working tree or a git revision."""
    dest.mkdir()
    if rev is None:
        for part in ("torch_multijagged", "test"):
            shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        shutil.copy(ROOT / "pyproject.toml", dest)
        return
    archive = subprocess.run(["git", "archive", rev, "torch_multijagged", "test", "pyproject.toml"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run(bug: Bug, full: bool, rev: str | None) -> tuple[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "tree"
        _tree(tree, rev)
        target = tree / "torch_multijagged" / bug.file
        src = target.read_text()
        if src.count(bug.old) != 1:
            return f"stale ({src.count(bug.old)} matches)", 0.0
        target.write_text(src.replace(bug.old, bug.new))
        env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("HYPOTHESIS_PROFILE", "default")
        tests = ["test"] if full else [f"test/{t}" for t in bug.tests if (tree / "test" / t).exists()]
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        # exit code 1: a test failed; 0: all passed; anything else (collection error…) also fails CI
        return ("caught" if r.returncode != 0 else "MISSED"), dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only bugs whose name contains this")
    ap.add_argument("--full", action="store_true", help="run the whole suite for each bug")
    ap.add_argument("--rev", default=None, help="plant into this git revision instead of the working tree")
    args = ap.parse_args()
    rows = []
    for bug in BUGS:
        if args.k not in bug.name:
            continue
        verdict, dt = run(bug, args.full, args.rev)
        rows.append((bug.name, verdict, dt))
        print(f"{verdict:>8}  {dt:6.1f}s  {bug.name}", flush=True)
    caught = sum(v == "caught" for _, v, _ in rows)
    print(f"\ncaught {caught} of {len(rows)} planted bugs")


if __name__ == "__main__":
    main()
