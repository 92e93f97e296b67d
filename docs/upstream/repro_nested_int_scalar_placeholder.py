"""A nested int given where an op takes a number is read as ``7777777``.

``torch.ones(2) * j`` with ``j`` a nested int (a ragged size, ``x.shape[1]`` of a torch.jagged
tensor) returns ``7777777``: the argument parser turns a ``SymInt`` in a tensor-or-number slot
into a scalar tensor holding a placeholder that only a tracer is meant to read, and eager mode
reads it. ``torch.full``, ``fill_`` and ``clamp`` refuse the same nested int. Model code divides
by a size read from a shape (``x.sum(1) / x.shape[1]``), so the answer is silently wrong. Fixed
when the product raises (or is each sample's own size, which a dense tensor cannot hold).
"""
import torch
from _repro import case, control, report

nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged)
j = nt.shape[1]

control("a plain int", lambda: torch.ones(2) * 3)


def number_from_nested_int():
    out = torch.ones(2) * j
    return f"ones(2) * {j} = {out.tolist()}"


case("a nested int as a number operand", number_from_nested_int, "7777777")
report()
