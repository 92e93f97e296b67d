"""nn ops: norms and dropout over static trailing dims (``norms.py``), nn and scan ops over ragged
dims — ``layer_norm`` over a ragged shape, ``cumsum``, ``normalize``, 1-d pooling (``ragged.py``),
losses (``losses.py``), distances between each sample's rows (``distances.py``) and recurrent
layers on packed sequences (``rnn.py``)."""

from . import ragged, norms, losses, distances, rnn  # noqa: F401  (register)
