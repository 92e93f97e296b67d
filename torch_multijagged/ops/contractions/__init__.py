"""Contractions: ``linear`` / ``matmul`` (``matmul.py``), ``einsum`` (``einsum.py``), and
contractions over a ragged dim of square pairs, ``multijagged::pair_matmul`` (``pair_mm.py``,
NOTE [ Contracting a ragged dim ]), and linear algebra of the matrices a batch holds
(``linalg.py``, NOTE [ Matrices in a batch ]); contractions no packed-values form takes run
eagerly sample by sample (``sample_einsum.py``, NOTE [ Contractions sample by sample ])."""

from . import pair_mm, matmul, einsum, linalg  # noqa: F401  (register)
