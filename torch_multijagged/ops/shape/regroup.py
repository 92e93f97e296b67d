"""``reshape`` / ``view`` that regroup static elements into or out of a ragged dim, per sample as
dense torch's: ``(B, j0, 6).reshape(B, -1, 3)`` (each sample ``(n, 6) → (2n, 3)``).

NOTE [ Regrouping across a ragged dim ]

``check_view_shape`` (``views.py``) keeps every ragged dim whole and regroups static dims only
between them. A size of plain ints with one ``-1`` that it refuses asks each sample for dense
torch's reshape of its elements in row-major order, the ``-1`` inferred per sample: the result has
one ragged dim, at the ``-1``, with a new nested int (a new extent; eager only, a graph break
under ``torch.compile``). Two forms:

* **A view.** The ``-1`` at the last ragged dim ``d``, the sizes before it ``x``'s own, static
  sizes after it: the ragged dim merged with the static dims after it, then split into a ragged
  part and the new static sizes (``flatten_ragged_static`` and ``unflatten_ragged_static`` in
  ``flatten.py``, NOTE [ Flattening ragged dims ]) — a view of the packed rows where the merge is
  one, and dense's per-sample divisibility check on the split.
* **A copy.** Any other such size (the ragged dim moved, ``(n, 6) → (3, 2n)``; a static dim
  before it merged in, ``(3, n, 4) → (2n, 6)``; several ragged dims into one,
  ``(n, m) → (2, nm/2)``): the packed rows would be reordered per sample, so it is dense
  ``reshape`` on each sample, packed again — a Python loop over the samples (not fast, correct for
  every structure, gradients through the packing). ``reshape`` does that; ``view`` raises, since
  the packed layout cannot hold the result without a copy.

A sample whose elements the static sizes do not divide raises dense torch's error, naming the
sample. Sizes holding nested ints, or none or several ``-1``, are not regroupings: the existing
paths (and their errors) keep them.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from ... import constructors
from ...errors import StructureError
from .._common import MJT, describe, eager_route
from .flatten import flatten_ragged_static, unflatten_ragged_static
from .views import mark_copy_of

_WHY = ("{op}(): regrouping static elements across a ragged dim needs the per-sample sizes on the host (a new "
        "ragged extent), which torch.compile cannot trace for layout torch.multi_jagged: a graph break")


def regroup_plan(op: str, x: MJT, size: tuple) -> Optional[Callable[[], MJT]]:
    """A thunk computing ``x.view(size)`` / ``x.reshape(size)`` (``op``) as a regrouping across a
    ragged dim (NOTE [ Regrouping across a ragged dim ]), or None where ``size`` is not one (the
    ordinary path then takes it, or raises its own error)."""
    if torch.compiler.is_compiling() or len(size) < 2 or not all(type(s) is int for s in size):
        return None
    holes = [i for i in range(1, len(size)) if size[i] == -1]
    if len(holes) != 1 or size[0] not in (-1, x._partition.batch) or any(s < -1 for s in size):
        return None
    i = holes[0]
    rd = x._ragged_dims
    if len(rd) == 1:
        d = rd[0]
        before, after = x._size[1:d], x._size[d + 1:]
        if math.prod(before) == math.prod(size[1:i]) and math.prod(after) == math.prod(size[i + 1:]):
            return None  # the ragged dim kept whole, static dims regrouped around it: an ordinary view
        if i == d and tuple(size[1:d]) == tuple(before):
            return lambda: _merge_then_split(op, x, d, tuple(size[d + 1:]))
    if op == "view":
        raise StructureError(
            f"view(): cannot view {describe(x)} as {tuple(size)}: each sample's elements would be regrouped across its "
            "ragged dims into an order the packed values of layout torch.multi_jagged do not hold without a copy; "
            "use .reshape(...) instead")
    return lambda: _per_sample(op, x, tuple(size), i)


@eager_route(_WHY)
def _merge_then_split(op: str, x: MJT, d: int, sizes: tuple) -> MJT:
    """The last ragged dim ``d`` merged with the static dims after it, then split into a ragged
    part and ``sizes`` (none: the merge alone)."""
    y = flatten_ragged_static(op, x, d, x.dim() - 1) if d < x.dim() - 1 else x
    return unflatten_ragged_static(op, y, d, (-1, *sizes)) if sizes else y


@eager_route(_WHY)
def _per_sample(op: str, x: MJT, size: tuple, i: int) -> MJT:
    """Dense ``reshape`` of each sample to ``size[1:]``, packed with one ragged dim ``i``."""
    shape = size[1:]
    parts = []
    for k, sample in enumerate(x.unbind()):
        try:
            parts.append(sample.reshape(shape))
        except RuntimeError as e:
            raise RuntimeError(f"{op}(): cannot {op} sample {k} of {describe(x)} to {shape}: {e}") from None
    if parts:
        # dense reshape of a contiguous sample is a view: a write into this copy would be lost
        return mark_copy_of(constructors.as_nested_tensor(parts, ragged_dims=(i,)),
                            f"a {op} regrouping elements across a ragged dim", base=x)
    statics = [s for j, s in enumerate(shape) if j != i - 1]
    empty = torch.zeros(0, *statics, dtype=x.dtype, device=x.device)
    host = torch.zeros(0, 1, dtype=torch.int64)
    return constructors.from_packed(empty, torch.zeros(1, dtype=torch.int64), host, (i,))
