"""Reductions over static and ragged dims: the aten handlers and ``multijagged::reduce``
(``reduce.py``, NOTE [ Reducing ragged dims ]) and the routes that send ``sum``/``mean``/``var``/
``norm``/``max``… there (``routes.py``)."""

from . import reduce, routes  # noqa: F401  (register)
