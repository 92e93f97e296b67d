"""Per-sample matrix products whose row, column or contracted dims may be ragged, on packed values
(pure torch): attention scores ``q @ kᵀ`` ``(B, H, j0, D) @ (B, H, D, j0)`` → ``(B, H, j0, j0)``,
``attn @ v`` contracting the ragged dim, and every gradient of them.

NOTE [ Ragged matmul contract ]

Each operand is stored packed, ``(T, *lead, *static)``: its two matrix dims carry *labels* whose
per-sample sizes ``dims`` gives — a label is either static (an int) or ragged (a tuple of B
lengths). The ragged labels of an operand are its packed rows (row-major, in the operand's
logical order), then come the ``lead`` dims (batched, every operand's), then its static labels
(logical order): sample b of ``x`` with labels ``(r, c)`` is the ``(*lead, r_b, c_b)`` matrix

    x[start_b : start_b + rows_b].view(*ragged sizes_b, *lead, *static sizes).permute(to logical)

(``rows_b`` the product of its ragged sizes, 1 when it has none: a dense ``(B, *lead, r, c)``
operand is the case without ragged labels). ``ragged_matmul(x, y, spec)`` computes, per sample,
``X' @ Y'`` with ``X' = Xᵀ`` when ``tx`` (``Y'`` alike), stored with the output's labels, which
are ``X'``'s rows and ``Y'``'s columns; ``X'``'s columns and ``Y'``'s rows carry one label (the
contracted one). Its gradients are products of the same kind (``_RaggedMM.backward``), so it
differentiates to any order.

NOTE [ Ragged matmul plans ]

Exact work is ``Σ_b lead · m_b k_b n_b`` multiply-adds. A per-sample loop of dense matmuls on
``as_strided`` views of the packed values does exactly that work and writes each result in place
(``out=`` where the output's storage order is ``(lead, m, n)``, else through a permuted view), but
pays a call per sample (≈ 5 µs on the CPU); one batched matmul over zero-padded blocks pays one
call per *group* of samples (≈ 30 µs: two row gathers, the masks, the matmul, the write-back with
``index_copy_``) but multiplies the padding too and moves every block element through an index.
The plan (``_plan``, cached per lengths) sorts the samples by work and splits them into
consecutive groups by dynamic programming over the distinct size triples (at most
``_MAX_ATOMS`` runs of them), each sample either alone (a *single*) or in a group, minimising
the cost model below (``_costs``); a group of one sample runs as a single. The contracted
label's padding is zeroed in both operands' blocks (zero times a sample's own infinity would be
NaN); the padded rows and columns of a group's result are never read back. The constants were
measured on the CPU with one thread (docs/design.md §18, "Matmul between multi_jagged tensors"):
tiny samples share groups, samples of a few thousand multiply-adds or more run alone. On other
devices the same rule with cheaper arithmetic prefers fewer, larger groups (unmeasured).

NOTE [ Lead-major products ]

A product with lead dims whose result has two ragged dims — attention scores ``q @ kᵀ`` of
``(B, H, j0, D)`` operands, ``(B, H, j0, j0)`` — would store each sample's ``(n, n)`` blocks with
the heads innermost (values ``(T, H)``), so every sample's ``(H, n, n)`` result went in through a
transposing copy, and the next consumers (the softmax along the last ragged dim, ``attn @ v``)
copied it back to read it. Its values are made lead-major instead: ``(H, T)`` in memory, seen as
``(T, H)`` (strides ``(1, T)``), where each sample's head block is an ``(n, n)`` matrix of unit
stride that the product writes itself (one intra-op thread: aten's strided ``out=`` runs the batch
serially, so with more the batched product is copied in, as a block) and that ``attn @ v`` reads
as it lies (a group of short samples gathers its rows along the buffer's own last dim,
``_gather_rows``). The dense ops along a ragged dim keep the order (``dense_along._new_rows``),
and elementwise ops keep their input's. The cost model still prices a single's pair operand as
copied first (plans are cached by sizes, not strides). The written-out chain ``softmax(q @ kᵀ · s) @ v`` (H = 12,
D = 64, B = 32 of 50–197 tokens, one thread, against the per-sample chain): 1.73× → 1.42× forward,
1.63× → 1.33× with backward (docs/design.md §18). Where every sample runs alone and the blocks
are large, the eager values path holds the scores per sample instead (NOTE [ Attention scores
held per sample ] in ``ops/contractions/sample_mm.py``); this layout is the rest's.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Optional

import torch

from .reference import built_outside_inference_mode, lead_major

__all__ = ["ragged_matmul", "force_plan"]

# Cost model of NOTE [ Ragged matmul plans ], in ns (CPU, one thread; docs/design.md §18). Operands with
# lead dims cost more per call (``bmm``) and per element (their blocks are reordered).
_SINGLE_NS = (4_500.0, 6_500.0)  # a sample's views and its matmul call (no lead dims, lead dims)
_GROUP_NS = (30_000.0, 48_000.0)  # a group's gathers, masks, batched matmul call and write-back
_CALL_NS = {torch.bfloat16: 17_000.0, torch.float16: 16_000.0}  # a matmul call's own cost beyond that
_MAC_NS = {torch.float32: 0.014, torch.float64: 0.023, torch.bfloat16: 0.03, torch.float16: 0.04,
           torch.complex64: 0.045, torch.complex128: 0.085}  # per multiply-add
_MAC_OTHER_NS = 0.3  # integer matmuls (no BLAS)
# Per 4-byte element moved (an element of 8 bytes costs twice as much):
_COPY_NS = 0.9  # of a single's operand without a unit stride (copied first), or of a permuted result
_CELL_NS = (0.35, 1.2)  # of a group's padded blocks and result (no lead dims, lead dims)
_CACHED_BYTES = 800_000  # beyond so many bytes a group's blocks leave the cache: each further element costs
_SPILL = (2.0, 3.0)  # this many times more
_MAX_ATOMS = 64  # the dynamic programme runs over at most this many runs of sizes
_FORCED: Optional[str] = None  # "loop" / "padded" (tests and benchmarks force one); None: the cost rule


@contextlib.contextmanager
def force_plan(strategy: Optional[str]):
    """Plan every product as ``"loop"`` (one matmul per sample), ``"padded"`` (one group of every
    sample) or ``None`` (the cost rule) inside the block; for tests and benchmarks."""
    global _FORCED
    old, _FORCED = _FORCED, strategy
    try:
        yield
    finally:
        _FORCED = old


def _size(dims: dict, label: str, b: int) -> int:
    s = dims[label]
    return s[b] if isinstance(s, tuple) else s


def _side(labels: tuple[str, str], dims: dict, lead: tuple[int, ...]):
    """``(ragged labels, static labels, to_logical)`` of an operand stored with ``labels``."""
    ragged = [lab for lab in labels if isinstance(dims[lab], tuple)]
    static = [lab for lab in labels if not isinstance(dims[lab], tuple)]
    nr, nl = len(ragged), len(lead)
    pos = {lab: i for i, lab in enumerate(ragged)}
    pos.update({lab: nr + nl + i for i, lab in enumerate(static)})
    return ragged, static, (*range(nr, nr + nl), pos[labels[0]], pos[labels[1]])


def _inverse(perm) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


class _Plan:
    """What one product needs (NOTE [ Ragged matmul plans ]): per operand and the output ``(ragged
    labels, static labels, to_logical)``; whether some sample's result is all zeros (an empty
    contracted dim); the singles as ``(dims, lead, ((sample, start rows), …))``; the groups'
    gathers; and, per triple of strides, the singles' ``as_strided`` views."""

    __slots__ = ("sides", "zero", "singles", "groups", "out_rows", "out_contiguous", "tx", "ty", "views")


def _rows(side, dims, b) -> int:
    return math.prod(dims[lab][b] for lab in side[0])


def _group_index(side, dims, members, starts, padded, k: str):
    """``(rows, kpad, valid)`` of one operand of a group: ``rows`` the packed row of every cell of
    the group's ``(g, *padded ragged sizes)`` blocks (a valid row of the sample for padding
    cells), ``kpad`` marks the padding along the contracted label ``k`` and ``valid`` the cells
    that exist (None: every cell)."""
    ragged = side[0]
    g = len(members)
    start = torch.tensor([starts[b] for b in members], dtype=torch.int64)
    if not ragged:
        return start, None, None
    ones = [1] * len(ragged)
    shape = [g] + [padded[lab] for lab in ragged]
    row = start.view(-1, *ones).expand(shape).clone()
    valid = torch.ones(shape, dtype=torch.bool)
    kpad = None
    stride = torch.ones(g, dtype=torch.int64)
    for i in reversed(range(len(ragged))):
        view = [1] * (len(ragged) + 1)
        view[i + 1] = -1
        coord = torch.arange(padded[ragged[i]]).view(view)
        n = torch.tensor([dims[ragged[i]][b] for b in members], dtype=torch.int64)
        ok = coord < n.view(-1, *ones)
        valid &= ok
        row += coord * stride.view(-1, *ones)
        if ragged[i] == k and not bool(ok.all()):
            kpad = (~ok).expand(shape).reshape(-1)
        stride = stride * n
    if bool(valid.all()):
        return row.reshape(-1), kpad, None
    row = torch.where(valid, row, start.view(-1, *ones))
    return row.reshape(-1), kpad, valid.reshape(-1)


def _atoms(active, sizes, work):
    """The active samples in increasing order of work, as runs of one size triple (at most
    ``_MAX_ATOMS`` runs: neighbours merged pairwise until so)."""
    atoms: list[list[int]] = []
    for b in sorted(active, key=lambda b: (work(sizes[b]), sizes[b])):
        if atoms and sizes[atoms[-1][0]] == sizes[b]:
            atoms[-1].append(b)
        else:
            atoms.append([b])
    while len(atoms) > _MAX_ATOMS:
        atoms = [atoms[i] + (atoms[i + 1] if i + 1 < len(atoms) else []) for i in range(0, len(atoms), 2)]
    return atoms


def _split(atoms, sizes, single, group) -> list:
    """``[(kind, samples), …]``: the split of NOTE [ Ragged matmul plans ] (dynamic programme over
    the atoms; ``kind`` "single" runs each sample alone, "group" pads the samples together).
    ``single(sizes)`` is a sample's cost alone, ``group(members, padded sizes)`` a group's."""
    n_atoms = len(atoms)
    best = [0.0] + [math.inf] * n_atoms
    choice: list = [None] * (n_atoms + 1)
    for e in range(1, n_atoms + 1):
        best[e] = best[e - 1] + sum(single(sizes[b]) for b in atoms[e - 1])
        choice[e] = (e - 1, "single")
        pad = (0, 0, 0)
        members = 0
        for s in range(e - 1, -1, -1):
            for b in atoms[s]:
                pad = tuple(max(p, q) for p, q in zip(pad, sizes[b]))
            members += len(atoms[s])
            c = best[s] + group(members, pad)
            if c < best[e]:
                best[e], choice[e] = c, (s, "group")
    cuts = []
    e = n_atoms
    while e > 0:
        s, kind = choice[e]
        cuts.append((kind, [b for a in atoms[s:e] for b in a]))
        e = s
    return cuts[::-1]


def _costs(sides, lead, tx: bool, ty: bool, macs, dtype: torch.dtype, device_type: str):
    """``(single, group)`` of ``_split``: the cost model of NOTE [ Ragged matmul plans ]
    for one product, sizes given as ``(m, k, n)``."""
    lead_n, led = math.prod(lead), int(bool(lead))
    mac = _MAC_NS.get(dtype, _MAC_OTHER_NS) * (1.0 if device_type == "cpu" else 0.01)
    item = torch.empty((), dtype=dtype).element_size()
    copy_ns, cell_ns, cached = _COPY_NS * item / 4, _CELL_NS[led] * item / 4, _CACHED_BYTES // item
    call = _CALL_NS.get(dtype, 0.0)
    # a single's operand with two ragged dims and lead dims has no unit stride (a pair stored
    # channel-last) and is copied first; a result whose storage order is not (lead, m, n) is
    # written through a permuted view
    copies = [len(side[0]) == 2 and bool(lead) for side in sides[:2]] + [list(sides[2][2]) != sorted(sides[2][2])]

    def cells(sz):
        m, k, n = sz
        return (lead_n * m * k, lead_n * k * n, lead_n * m * n)

    def single(sz):
        return _SINGLE_NS[led] + call + macs(sz) * mac + sum(c for c, f in zip(cells(sz), copies) if f) * copy_ns

    def group(members, sz):
        total = members * sum(cells(sz))
        spill = max(total - cached, 0) * (_SPILL[led] - 1.0)
        return _GROUP_NS[led] + call + members * macs(sz) * mac + (total + spill) * cell_ns

    return single, group


@functools.lru_cache(maxsize=32)
@built_outside_inference_mode
def _plan(spec, strategy: Optional[str], device_type: str, dtype: torch.dtype) -> _Plan:
    """The plan of one product (host ints and CPU index tensors about the size of the groups'
    blocks; few are kept)."""
    sx, sy, so, tx, ty, dims_t, lead = spec
    dims = dict(dims_t)
    b_count = next((len(s) for s in dims.values() if isinstance(s, tuple)), 0)
    sides = [_side(s, dims, lead) for s in (sx, sy, so)]
    k = sx[0] if tx else sx[1]
    m_lab, n_lab = so
    labels = (m_lab, k, n_lab)
    starts = []
    for side in sides:
        st, acc = [], 0
        for b in range(b_count):
            st.append(acc)
            acc += _rows(side, dims, b)
        starts.append(st)
    lead_n = math.prod(lead)
    sizes = {b: tuple(_size(dims, lab, b) for lab in labels) for b in range(b_count)}
    active = [b for b in range(b_count) if sizes[b][0] * sizes[b][2] * lead_n and sizes[b][1]]
    plan = _Plan()
    plan.sides, plan.tx, plan.ty = sides, tx, ty
    plan.zero = any(sizes[b][0] * sizes[b][2] * lead_n and not sizes[b][1] for b in range(b_count))
    plan.out_rows = sum(_rows(sides[2], dims, b) for b in range(b_count))
    plan.out_contiguous = list(sides[2][2]) == sorted(sides[2][2])
    plan.views = {}

    def macs(sz):
        return lead_n * sz[0] * sz[1] * sz[2]

    atoms = _atoms(active, sizes, macs)
    if strategy == "loop":
        cuts = [("single", a) for a in atoms]
    elif strategy == "padded":
        cuts = [("group", [b for a in atoms for b in a])] if atoms else []
    else:
        cuts = _split(atoms, sizes, *_costs(sides, lead, tx, ty, macs, dtype, device_type))
    singles: list = []
    groups: list = []
    for kind, members in cuts:
        if kind == "single" or len(members) == 1:
            singles += [(b, tuple(starts[i][b] for i in range(3))) for b in members]
            continue
        members = sorted(members)  # storage order: the gathers and the write-back read and write in order
        padded = {lab: max(_size(dims, lab, b) for b in members) for lab in labels}
        gx = _group_index(sides[0], dims, members, starts[0], padded, k)
        gy = _group_index(sides[1], dims, members, starts[1], padded, k)
        rows, _, valid = _group_index(sides[2], dims, members, starts[2], padded, k)
        dst = rows if valid is None else rows[valid]
        pos = None if valid is None else torch.nonzero(valid).view(-1)
        shapes = tuple((len(members), *(padded[lab] for lab in side[0]), *lead, *(dims[lab] for lab in side[1]))
                       for side in sides)
        groups.append((gx[0], gx[1], gy[0], gy[1], dst, pos, shapes))
    plan.singles = (dims, lead, tuple(singles))
    plan.groups = tuple(groups)
    return plan


def _strided(side, dims, lead, b: int, start: int, vstride, transpose: bool):
    """``(size, stride, offset)`` of sample ``b``'s logical ``(*lead, r, c)`` matrix (its last two
    dims swapped when ``transpose``) in values of strides ``vstride``, relative to their offset."""
    ragged, static, perm = side
    shape = [dims[lab][b] for lab in ragged] + list(lead) + [dims[lab] for lab in static]
    strides = list(vstride[1:])
    acc = vstride[0]
    for lab in reversed(ragged):
        strides.insert(0, acc)
        acc *= dims[lab][b]
    size = [shape[p] for p in perm]
    stride = [strides[p] for p in perm]
    if transpose:
        size[-1], size[-2] = size[-2], size[-1]
        stride[-1], stride[-2] = stride[-2], stride[-1]
    return tuple(size), tuple(stride), start * vstride[0]


def _blas(view) -> bool:
    """Whether a ``(size, stride, offset)`` matrix view has a unit stride (BLAS reads it as it is;
    CPU ``bmm`` handles one without, element by element, at 2-3x the cost of copying it first)."""
    size, stride, _ = view
    return stride[-1] == 1 or stride[-2] == 1 or size[-1] == 1 or size[-2] == 1


def _views(plan: _Plan, xs, ys, os_):
    """The singles' ``(X' view, Y' view, output view)`` for values of strides ``xs``, ``ys``,
    ``os_``, with whether either operand view must be copied first (``_blas``)."""
    key = (xs, ys, os_)
    hit = plan.views.get(key)
    if hit is None:
        dims, lead, singles = plan.singles
        sx, sy, so = plan.sides
        views = []
        for b, (ax, ay, ao) in singles:
            vx, vy = _strided(sx, dims, lead, b, ax, xs, plan.tx), _strided(sy, dims, lead, b, ay, ys, plan.ty)
            views.append((vx, vy, _strided(so, dims, lead, b, ao, os_, False), not (_blas(vx) and _blas(vy))))
        hit = plan.views[key] = tuple(views)
    return hit


def _compute(x: torch.Tensor, y: torch.Tensor, spec, out_static) -> torch.Tensor:
    plan = _plan(spec, _FORCED, x.device.type, x.dtype)
    (_, _, px), (_, _, py), (_, _, po) = plan.sides
    empty = x.numel() == 0 or y.numel() == 0
    nlead = len(spec[6])
    new = x.new_zeros if plan.zero or empty else x.new_empty
    heads_first = not plan.out_contiguous and nlead and len(out_static) == nlead and len(plan.sides[2][0]) > 1
    if heads_first:
        # NOTE [ Lead-major products ]: ``(*lead, T)`` in memory, values ``(T, *lead)``
        out = new((*out_static, plan.out_rows)).permute(nlead, *range(nlead))
    else:
        out = new((plan.out_rows, *out_static))
    if empty:
        return out
    mm = torch.mm if nlead == 0 else torch.bmm if nlead == 1 else torch.matmul
    xo, yo = x.storage_offset(), y.storage_offset()
    # a permuted result view is written by the product itself where BLAS can (a unit stride:
    # lead-major blocks) and one thread runs it (aten's strided ``out=`` runs the batch serially)
    direct = plan.out_contiguous or (heads_first and torch.get_num_threads() == 1)
    for (sa, ta, oa), (sb, tb, ob), (so_, to_, oo), copy in _views(plan, x.stride(), y.stride(), out.stride()):
        a, b = x.as_strided(sa, ta, xo + oa), y.as_strided(sb, tb, yo + ob)
        if copy:
            a = a if _blas((sa, ta, oa)) else a.contiguous()
            b = b if _blas((sb, tb, ob)) else b.contiguous()
        if direct:
            mm(a, b, out=out.as_strided(so_, to_, oo))
        else:
            out.as_strided(so_, to_, oo).copy_(mm(a, b))
    dev = x.device
    for ix, kx, iy, ky, dst, pos, (shx, shy, _) in plan.groups:
        a = _gather_rows(x, ix.to(dev))
        if kx is not None:
            a.masked_fill_(kx.to(dev).view(-1, *[1] * (a.dim() - 1)), 0)
        b = _gather_rows(y, iy.to(dev))
        if ky is not None:
            b.masked_fill_(ky.to(dev).view(-1, *[1] * (b.dim() - 1)), 0)
        a = a.view(shx).permute(0, *(p + 1 for p in px))
        b = b.view(shy).permute(0, *(p + 1 for p in py))
        r = torch.matmul(a.mT if plan.tx else a, b.mT if plan.ty else b)
        r = r.permute(0, *(p + 1 for p in _inverse(po))).reshape(-1, *out_static)
        if pos is not None:
            r = r.index_select(0, pos.to(dev))
        out.index_copy_(0, dst.to(dev), r)
    return out


def _gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t.index_select(0, index)``. The rows of lead-major values lie T apart: they are gathered
    along the lead-major buffer's own last dim (the result lead-major too: a group's block view
    splits only its rows)."""
    if not lead_major(t):
        return t.index_select(0, index)
    last = t.dim() - 1
    return t.permute(*range(1, t.dim()), 0).index_select(last, index).permute(last, *range(last))


def _conj(t: torch.Tensor) -> torch.Tensor:
    return torch.conj_physical(t) if t.is_complex() else t


def _out_static(spec) -> tuple[int, ...]:
    so, dims_t, lead = spec[2], spec[5], spec[6]
    dims = dict(dims_t)
    return (*lead, *(dims[lab] for lab in so if not isinstance(dims[lab], tuple)))


class _RaggedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, spec):  # type: ignore[override]
        ctx.set_materialize_grads(False)
        ctx.spec = spec
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, y if ctx.needs_input_grad[0] else None)
        return _compute(x, y, spec, _out_static(spec))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if grad is None:
            return None, None, None
        x, y = ctx.saved_tensors
        sx, sy, so, tx, ty, dims_t, lead = ctx.spec
        dx = dy = None

        def mm(a, b, sa, sb, s_out, ta, tb):
            return ragged_matmul(a, b, (sa, sb, s_out, ta, tb, dims_t, lead))

        if ctx.needs_input_grad[0]:
            yc = _conj(y)
            dx = mm(grad, yc, so, sy, sx, False, not ty) if not tx else mm(yc, grad, sy, so, sx, ty, True)
        if ctx.needs_input_grad[1]:
            xc = _conj(x)
            dy = mm(xc, grad, sx, so, sy, not tx, False) if not ty else mm(grad, xc, so, sx, sy, True, tx)
        return dx, dy, None


_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _RaggedMM)  # without Function.apply's Python layer


def ragged_matmul(x: torch.Tensor, y: torch.Tensor, spec) -> torch.Tensor:
    """NOTE [ Ragged matmul contract ]: ``spec = (sx, sy, so, tx, ty, dims, lead)`` with ``sx``,
    ``sy``, ``so`` the operands' and the output's ``(row, column)`` labels, ``dims`` a tuple of
    ``(label, size)`` pairs (an int, or a tuple of B lengths) and ``lead`` the batched static
    sizes. Differentiable to any order (its backward is itself)."""
    if not (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)):
        return _compute(x, y, spec, _out_static(spec))
    if torch._C._are_functorch_transforms_active():
        return _RaggedMM.apply(x, y, spec)
    return _apply(x, y, spec)
