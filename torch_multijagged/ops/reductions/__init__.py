"""Reductions over static and ragged dims: the aten handlers and ``multijagged::reduce``
(``reduce.py``, NOTE [ Reducing ragged dims ]) and the routes that send ``sum``/``mean``/``var``/
``norm``/``max``… there (``routes.py``), and order statistics — ``sort``, ``topk``, ``kthvalue``,
``median``, ``cummax`` — per sample (``order.py``, NOTE [ Order statistics along ragged dims ];
eagerly the dense op on each segment, ``segment_ops.py``, NOTE [ Dense ops on segments ])."""

from . import reduce, routes, order  # noqa: F401  (register)
