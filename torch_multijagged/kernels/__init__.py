"""Structural kernels: pure-torch references (``reference.py``); Triton twins land beside them.
Plain tensors in and out; this package never imports the subclass (DESIGN.md §5)."""

from . import reference  # noqa: F401
