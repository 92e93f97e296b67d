"""Structural kernels: pure-torch references (``reference.py``); Triton twins land beside them.
Plain tensors in and out; this package never imports the subclass (CONTRIBUTING.md, Layering)."""

from . import reference  # noqa: F401
