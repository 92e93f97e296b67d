"""Frames of this package are traced as part of a user's frame, never compiled on their own.

NOTE [ Own frames under torch.compile ]

Dynamo meets this package's code in two ways. Inside a compiled function, a call on a
multi_jagged tensor reaches ``__torch_function__``, which dynamo inlines into the user's graph —
that is how the layout compiles. After a graph break, though, dynamo's frame hook also sees the
package's own functions being called from the eager remainder and tries to compile each as a
top-level frame (a resumed ``__new__``, a values-path entry): frames that were never meant to be
graphs of their own, on which dynamo 2.13 fails with internal errors (``'dict' object has no
attribute 'node'`` reading ``x.__dict__``) instead of falling back. ``skip_frames`` marks every
code object of the package with ``torch._dynamo.eval_frame.skip_code``: such a frame then runs
eagerly, as the break intended, while inlining from user frames is unaffected (it is decided by
dynamo's trace rules, not by the frame hook). Measured: ``torch.compile`` of an unmodified
``nn.TransformerEncoderLayer`` on a multi_jagged batch, when it graph-broke inside
``nn.MultiheadAttention`` (before the batch-moved token was traceable), went from an
``InternalTorchDynamoError`` to the eager result. The
marking runs once, the first time dynamo meets a multi_jagged tensor (``__tensor_flatten__``,
when dynamo is loaded): importing dynamo at package import would cost 0.6 s and load
``torch.distributed.nn``. One gap remains: after a graph break *inside* an inlined package
function (an eager-only route), dynamo resumes that function in a new code object that no mark
covers, so code reached from routes reads ``x.__dict__`` only once ``torch.compiler.is_compiling()``
is known to be False (``values_of`` in ``tensor.py``).
"""

from __future__ import annotations

import sys
import types

__all__ = ["skip_frames", "skipped"]

skipped = False


def _codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _functions(module: types.ModuleType):
    for v in vars(module).values():
        if isinstance(v, types.FunctionType) and v.__module__ == module.__name__:
            yield v
        elif isinstance(v, type) and v.__module__ == module.__name__:
            for a in vars(v).values():
                f = getattr(a, "__func__", a)
                if isinstance(f, property):
                    yield from (g for g in (f.fget, f.fset) if g is not None)
                elif isinstance(f, types.FunctionType):
                    yield f


def skip_frames(package: str) -> int:
    """Mark the code of every loaded module of ``package``; returns how many code objects."""
    global skipped
    skipped = True
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # a torch without dynamo: nothing compiles frames
        return 0
    n = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for fn in _functions(module):
            for code in _codes(fn.__code__):
                skip_code(code)
                n += 1
    return n
