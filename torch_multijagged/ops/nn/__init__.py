"""nn ops: norms and dropout over static trailing dims (``norms.py``), nn and scan ops over ragged
dims — ``layer_norm`` over a ragged shape, ``cumsum``, ``normalize``, 1-d pooling (``ragged.py``),
and losses (``losses.py``)."""

from . import ragged, norms, losses  # noqa: F401  (register)
