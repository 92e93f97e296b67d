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

NOTE [ Constructors under torch.compile ]

A constructor that takes its structure from tensor data (``from_padded``'s lengths, ``from_mask``'s
mask, the offsets of ``from_packed`` and ``nested_tensor_from_jagged``, ``narrow``'s windows) makes
new extents from host sizes: their nested int, and shape carriers sized Σn, max n and Σn² (NOTE
[ Ragged extents and nested ints ] in structure.py). Inside a compiled region those sizes are
data-dependent, and tracing the constructor did not fail cleanly: dynamo broke the graph at each
host check, compiled the constructor's remainders as frames of their own, and a wrapper made in
one of them held a nested int minted in dynamo's graph, which AOTAutograd cannot trace (``s… is
not tracked with proxy``). ``eager_constructor`` makes such a call a graph break instead, at the
call: the constructor runs eagerly on the real tensors — the same batch, extents and autograd
graph as outside compile — and the code after it compiles in a frame that takes the batch as an
input, which serves new lengths without recompiling (docs/design.md §5). ``fullgraph=True``
refuses with the reason, which names the constructor and the way out: build the batch outside the
compiled function and pass it in. ``torch.jagged``'s ``nested_tensor_from_jagged`` does compile
into one graph: dynamo records it as one view op, whose nested int is minted when the op runs on
fake offsets, and an NJT keeps no max-size or Σn² carriers. Here both would be new in the graph —
a nested int (which docs/design.md §1 keeps out of graphs) and carriers of unbacked
(data-dependent) sizes — so the constructors stay eager. ``torch.jagged``'s ``narrow(...)`` and
``masked_select`` are graph breaks too.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, TypeVar

__all__ = ["skip_frames", "skipped", "eager_constructor", "skip_code_now"]

_F = TypeVar("_F", bound=Callable[..., Any])

# Code marked by ``skip_code_now(..., recursive=True)``, which ``skip_frames`` leaves as it is.
_recursive: set = set()

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
                if code in _recursive:
                    continue  # skipped with every frame it calls (``skip_code_now``): keep that
                skip_code(code)
                n += 1
    return n


def eager_constructor(name: str) -> Callable[[_F], _F]:
    """Decorator for a constructor that reads its structure from tensor data (NOTE [ Constructors
    under torch.compile ]): eagerly the constructor itself, unchanged; called inside a compiled
    region, a graph break at the call, the constructor then running eagerly; with
    ``fullgraph=True`` an error naming ``name`` and the workaround."""
    reason = (
        f"{name}() reads the per-sample sizes of a new multi_jagged batch from tensor data, which a "
        f"compiled region does not have: under torch.compile it runs eagerly (a graph break). With "
        f"fullgraph=True, build the batch outside the compiled function and pass it in"
    )

    def deco(fn: _F) -> _F:
        # What ``torch.compiler.disable`` does, without importing dynamo at package import (it
        # loads ``torch.distributed.nn``, 0.6 s): dynamo reads these two attributes where it would
        # inline a call (it breaks the graph there, quoting the reason), and the code's frame
        # strategy — skip this frame and every frame it calls — keeps the frame hook from
        # compiling the constructor's own frames when the eager remainder calls it.
        fn._torchdynamo_disable = True  # type: ignore[attr-defined]
        fn._torchdynamo_disable_msg = reason  # type: ignore[attr-defined]
        skip_code_now(fn.__code__, recursive=True)
        return fn

    return deco


def skip_code_now(code: types.CodeType, recursive: bool = False) -> None:
    """``skip_code`` (the frame hook runs ``code``'s frames eagerly; with ``recursive``, every
    frame they call too) through dynamo's C extension, which torch loads anyway: no import of
    dynamo."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # a torch without dynamo: nothing compiles frames
        return
    if recursive:
        _recursive.add(code)
    below = _FrameAction.SKIP if recursive else _FrameAction.DEFAULT
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, below))
