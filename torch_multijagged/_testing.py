"""``torch.testing.assert_close`` for layout ``multi_jagged``.

torch.testing lists the layouts it compares (``torch.strided``, ``torch.jagged``, the sparse ones)
in ``TensorLikePair``; a layout registered beside ``torch.jagged`` belongs in that list. Two
multi_jagged tensors are close when they have the same ragged dims, static sizes and per-sample
extents (not necessarily the same nested ints: a reference built separately has its own) and
their packed values are close under the caller's options. ``torch.jagged`` compares only
``values()``; checking the extents too means two batches that merely pack to the same rows are
not "close". A multi_jagged tensor against a dense one is a layout mismatch, as for
``torch.jagged``. If torch's private comparison class changes shape, nothing is installed and
``assert_close`` raises its own "Unsupported tensor layout" error.
"""

from __future__ import annotations

import torch

from .tensor import MultiJaggedTensor

_INSTALLED = False


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    try:
        from torch.testing._comparison import TensorLikePair
    except ImportError:  # pragma: no cover - a torch without the private module
        return
    check, compare = getattr(TensorLikePair, "_check_supported", None), getattr(TensorLikePair, "compare", None)
    if check is None or compare is None or not hasattr(TensorLikePair, "_fail"):
        return  # pragma: no cover

    def _check_supported(self, tensor, *, id):
        if isinstance(tensor, MultiJaggedTensor):
            return None
        return check(self, tensor, id=id)

    def _compare(self):
        actual, expected = self.actual, self.expected
        a_mj, e_mj = isinstance(actual, MultiJaggedTensor), isinstance(expected, MultiJaggedTensor)
        if not (a_mj or e_mj):
            return compare(self)
        if a_mj != e_mj:
            self._fail(
                AssertionError,
                f"The values for attribute 'layout' do not match: {actual.layout} != {expected.layout}.",
            )
        problem = _structure_mismatch(actual, expected)
        if problem:
            self._fail(AssertionError, f"The multi_jagged structures do not match: {problem}.")
        self.actual, self.expected = actual._values, expected._values
        try:
            return compare(self)
        finally:
            self.actual, self.expected = actual, expected

    TensorLikePair._check_supported = _check_supported
    TensorLikePair.compare = _compare
    _INSTALLED = True


def _structure_mismatch(a: MultiJaggedTensor, b: MultiJaggedTensor) -> str:
    if a._ragged_dims != b._ragged_dims:
        return f"ragged dims {a._ragged_dims} != {b._ragged_dims}"
    if a._partition.batch != b._partition.batch:
        return f"batch sizes {a._partition.batch} != {b._partition.batch}"
    sa, sb = a._values.shape[1:], b._values.shape[1:]
    if sa != sb:
        return f"static sizes {tuple(sa)} != {tuple(sb)}"
    if a._partition is not b._partition and not torch.equal(a.sizes(), b.sizes()):
        return f"per-sample extents {a.sizes().tolist()} != {b.sizes().tolist()}"
    return ""
