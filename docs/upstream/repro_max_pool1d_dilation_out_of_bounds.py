"""``max_pool1d`` returns an index outside the input when a dilated, padded window misses it.

``F.max_pool1d(x, kernel_size=2, stride=1, padding=1, dilation=2, return_indices=True)`` on an
input of length 1: the only window reads positions -1 and 1, both padding, so it returns -inf
and index 1 — outside ``[0, 1)``. The backward then scatters the gradient to that index, out of
bounds (heap corruption was seen in a double backward); not run here. Fixed when every index
lies inside the input (or the call raises).
"""
import torch
import torch.nn.functional as F
from _repro import case, report


def indices_in_bounds():
    for n, k, s, p, d in ((1, 2, 1, 1, 2), (2, 2, 1, 1, 3)):
        x = torch.randn(1, 1, n, dtype=torch.float64)
        try:
            out, idx = F.max_pool1d(x, k, s, p, d, return_indices=True)
        except RuntimeError:
            continue  # refusing the window is fine too
        if int(idx.max()) >= n or int(idx.min()) < 0:
            return f"length {n}, kernel {k}, padding {p}, dilation {d}: value {out.flatten().tolist()}, index {idx.flatten().tolist()}"


case("max_pool1d indices of windows that miss the input", indices_in_bounds, "index")
report()
