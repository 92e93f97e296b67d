"""Attention: ``F.scaled_dot_product_attention`` over ragged dims (``sdpa.py``, NOTE [ Attention
over ragged dims ]) and ``nn.MultiheadAttention`` (``mha.py``, NOTE [ Batch-second tokens ]).

``backend(name)`` forces one CPU/GPU backend for the calls inside it; ``BACKENDS`` names them."""

from . import sdpa, mha  # noqa: F401  (register)
from .sdpa import BACKENDS, backend

__all__ = ["backend", "BACKENDS"]
