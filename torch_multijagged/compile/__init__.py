"""torch.library ops (``multijagged::…``) with fake impls and autograd formulas; see
NOTE [ Why custom ops ] in ``library.py``."""

from . import library  # noqa: F401
