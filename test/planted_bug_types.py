"""The entry type of the planted-bug table (``planted_bugs.py``) and the test-file groups its
entries share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    file: str  # relative to the package
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # test files (relative to test/) to run


_FAST = ("test_fastpath.py", "test_pointwise.py", "test_double_backward.py", "test_gradients_reach_leaves.py",
         "test_nn.py", "test_ragged_reductions.py", "test_broadcast.py")
_ATT = ("test_attention_kernels.py", "test_attention.py", "test_attention_dropout.py", "test_attention_modules.py", "test_varlen_accessors.py")
