"""torch_multijagged: a multi-ragged layout for ``torch.nested``.

``import torch_multijagged`` registers the layout ``multi_jagged`` (also ``torch.multi_jagged``)
and teaches ``torch.nested.nested_tensor`` / ``as_nested_tensor`` / ``to_padded_tensor`` about
it. README.md lists the public API.
"""

from .errors import StructureError
from .layout import multi_jagged
from .tensor import MultiJaggedTensor, install_op_table as _install_op_table
from . import ops  # fills the op table
from .ops import fastpath as _fastpath

# The subclass's dispatch entry points find the op table here (NOTE [ Handler lookup ] in tensor.py).
_install_op_table(
    dispatch=ops.dispatch,
    routes=ops.ROUTES,
    unify=ops.unify_call,
    sized=ops.SIZED,
    guard_write=ops.guard_write,
    reorder_copies=ops.reorder_copies,
    writeback_target=ops.writeback_target,
    write_through=ops.write_through,
    fast=_fastpath.FAST,
    fast_enabled=_fastpath.enabled,
)
from .constructors import (
    as_nested_tensor,
    from_jagged,
    from_mask,
    from_packed,
    from_padded,
    is_nested,
    nested_tensor,
    occupancy,
    to_jagged,
    to_padded_tensor,
)
from .jagged_views import narrow, nested_tensor_from_jagged
from .torch_nested import _install
from . import _testing
from . import distributed  # noqa: F401  (collectives of multi_jagged batches; loads nothing torch has not)
from .packing import (
    block_diagonal_mask,
    collate,
    first_fit_decreasing,
    packed_position_ids,
    padding_rate,
    position_ids,
    segment_ids,
)

_install()
_testing.install()  # torch.testing.assert_close learns the layout

__all__ = [
    "multi_jagged",
    "MultiJaggedTensor",
    "StructureError",
    "nested_tensor",
    "as_nested_tensor",
    "from_packed",
    "from_padded",
    "from_jagged",
    "from_mask",
    "to_jagged",
    "to_padded_tensor",
    "occupancy",
    "nested_tensor_from_jagged",
    "narrow",
    "is_nested",
    # packing
    "first_fit_decreasing",
    "position_ids",
    "packed_position_ids",
    "segment_ids",
    "block_diagonal_mask",
    "padding_rate",
    "collate",
]

__version__ = "0.1.0"
