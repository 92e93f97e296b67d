"""``copy.deepcopy`` of a ragged tensor keeps the original's nested int beside new offsets.

``Tensor.__deepcopy__`` clones (the clone's sizes are the original's, so ``j0``) and deep-copies
the inner tensors (new offsets, whose own nested int is a new ``j1``). The copy then disagrees
with itself: a view rebuilt from its own ``values()`` / ``offsets()`` has shape ``(B, j1, C)``
and cannot be combined with the copy ``(B, j0, C)``, while the same works on the original.
"""
import copy

import torch
from _repro import case, control, report
from _toys import jagged

x = jagged(2, 3)


def rebuilt_from_own_offsets(t):
    def run():
        view = torch.nested.nested_tensor_from_jagged(t.values(), t.offsets())
        view + t
    return run


control("the original", rebuilt_from_own_offsets(x))
case("the deep copy", rebuilt_from_own_offsets(copy.deepcopy(x)), "cannot call binary pointwise function")
report()
