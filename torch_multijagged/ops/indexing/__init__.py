"""Indexing: ``x[i]`` / ``x[:, ..., k]`` / ``select`` / ``unbind`` (``getitem.py``), and indices on
packed rows — ``embedding``, ``embedding_bag``, ``masked_select``, ``index_put``, ``bmm`` with a
dense per-sample operand (``gather.py``, NOTE [ Indices on packed rows ])."""

from . import getitem, gather  # noqa: F401  (register)
