"""Vision: convolution, transposed convolution, pooling and ``unfold`` over ragged spatial dims
(``conv.py``, on a canvas: NOTE [ Canvas ] in ``kernels/canvas.py``), batch / instance / group
norm and adaptive pooling (``norms.py``), ``interpolate`` / ``pixel_shuffle`` (``resample.py``), ``max_unpool``
(``unpool.py``)."""

from . import conv, norms, resample, unpool  # noqa: F401  (register)
