"""Contractions: ``linear`` / ``matmul`` (``matmul.py``), ``einsum`` (``einsum.py``), and
contractions over a ragged dim of square pairs, ``multijagged::pair_matmul`` (``pair_mm.py``,
NOTE [ Contracting a ragged dim ])."""

from . import pair_mm, matmul, einsum  # noqa: F401  (register)
