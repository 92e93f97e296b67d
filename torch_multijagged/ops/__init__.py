"""The op table and the routes of ``multi_jagged`` tensors, one family per subpackage.

Three mechanisms carry every op (NOTE [ Subclass mechanism ] in ``tensor.py``), each in one
module here:

* ``_table.py`` — the aten op table (NOTE [ Op table ]): one handler per aten overload, which
  ``MultiJaggedTensor.__torch_dispatch__`` calls through ``dispatch``;
* ``_routing.py`` — the ``__torch_function__`` routes (NOTE [ Routes ]) of composite ops that
  must not decompose, and operand unification (NOTE [ Equal sizes, different nested ints ]);
* ``fastpath.py`` — the eager values path (NOTE [ Eager values path ]): hot ops computed on the
  packed values under torch's own autograd; ``autograd_api.py`` answers the autograd API
  (``autograd.grad(…, inputs=y)``, hooks, ``.grad``) of its results on their values, entries of the
  same table; ``bridged.py`` holds the computations that routes send to the values.

The families register handlers and routes into the first two on import. Each family's handlers,
routes and values-path entries live in its subpackage (CONTRIBUTING.md, "Where does X live"):
``elementwise``, ``shape``, ``indexing``, ``reductions``, ``contractions``, ``nn``,
``attention``, ``vision``. Imports point down only: families import the mechanisms, never this
package's ``__init__``; the mechanisms import no family (``fastpath.py`` excepted, which sits on
top of the families whose computations it reuses).
"""

from __future__ import annotations

from ._table import MULTI_JAGGED_OPS, dispatch, op_name, register_multi_jagged_func
from ._routing import ROUTES, SIZED, unify_call
from . import elementwise, shape, indexing, reductions, contractions, nn, attention, vision  # noqa: F401  (register)
from . import fastpath
from . import fastpath_products  # noqa: F401  (registers its values-path entries)
from . import autograd_api  # noqa: F401  (registers its values-path entries)
from .shape import views

__all__ = ["register_multi_jagged_func", "dispatch", "MULTI_JAGGED_OPS", "op_name", "ROUTES", "unify_call", "SIZED", "fastpath", "views"]

# The entry points the subclass needs (``tensor.install_op_table``; NOTE [ Handler lookup ] in
# tensor.py), named once for the package's ``__init__``.
guard_write = views.guard_write
reorder_copies = views._REORDER_COPIES
writeback_target = views.writeback_target
write_through = views.write_through
