"""Elementwise ops: the pointwise fallback and its broadcasting over ragged dims
(``pointwise.py``, NOTE [ Broadcasting over ragged dims ]), copies / fills / ``*_like`` / dtype
conversions (``factory.py``), and the ``abs`` / ``sgn`` / ``softsign`` routes (``signs.py``)."""

from . import pointwise, factory, signs  # noqa: F401  (register)
