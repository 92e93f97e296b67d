"""Elementwise ops: the pointwise fallback and its broadcasting over ragged dims
(``pointwise.py``, NOTE [ Broadcasting over ragged dims ]; eagerly, large samples sample by sample:
``per_sample.py``), copies / fills / ``*_like`` / dtype
conversions (``factory.py``), the ``abs`` / ``sgn`` / ``softsign`` routes (``signs.py``), and ops on
the static trailing dims or every element — FFTs, complex views, ``unique``, ``histc``
(``trailing.py``, NOTE [ Ops on the trailing dims ]), and the list ops of optimizers
(``_foreach_*``, ``_fused_adam_``: ``foreach.py``)."""

from . import pointwise, factory, signs, sizes, trailing, foreach  # noqa: F401  (register)
