"""torch_multijagged: a multi-ragged layout for ``torch.nested``.

``import torch_multijagged`` registers the layout ``multi_jagged`` (also ``torch.multi_jagged``)
and teaches ``torch.nested.nested_tensor`` / ``as_nested_tensor`` / ``to_padded_tensor`` about
it. README.md lists the public API.
"""

from .errors import StructureError
from .layout import multi_jagged
from .tensor import MultiJaggedTensor
from . import ops  # noqa: F401  (fills the op table)
from .constructors import (
    as_nested_tensor,
    from_jagged,
    from_packed,
    from_padded,
    nested_tensor,
    occupancy,
    to_jagged,
    to_padded_tensor,
)
from .constructors import _install

_install()

__all__ = [
    "multi_jagged",
    "MultiJaggedTensor",
    "StructureError",
    "nested_tensor",
    "as_nested_tensor",
    "from_packed",
    "from_padded",
    "from_jagged",
    "to_jagged",
    "to_padded_tensor",
    "occupancy",
]

__version__ = "0.1.0"
