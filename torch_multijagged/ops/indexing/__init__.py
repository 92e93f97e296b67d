"""Indexing: ``x[i]`` / ``x[:, ..., k]`` / ``select`` / ``unbind`` (``getitem.py``), and indices on
packed rows — ``masked_select``, ``index_put``, ``bmm`` with a dense per-sample operand
(``gather.py``, NOTE [ Indices on packed rows ]), ``embedding`` and ``embedding_bag``
(``embedding.py``); several index tensors pairing up (``pairwise.py``); ``scatter`` / ``gather``
along static and ragged dims (``scatter.py``, NOTE [ Scatter and gather ]); ``index_add`` /
``index_copy`` / ``index_fill`` / ``index_reduce`` with dense or per-sample indices and ``bincount``
per sample (``index_updates.py``, NOTE [ Index updates with per-sample indices ]); ``flip``, ``roll``,
``rot90`` and ``diff`` along ragged dims (``order.py``)."""

from . import along, slicing, order, joins, getitem, gather, embedding, scatter, index_updates  # noqa: F401  (register)
