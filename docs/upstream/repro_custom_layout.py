"""A third-party layout cannot be a ``torch.layout``.

``torch.layout`` is a closed C type (no constructor, no subclassing), and the places that
branch on the layout list torch's own: ``torch.nested.nested_tensor(..., layout=)`` /
``as_nested_tensor`` / ``narrow`` / ``to_padded_tensor`` accept ``torch.strided`` and
``torch.jagged`` only, and ``torch.testing.assert_close`` compares the layouts its
``TensorLikePair`` knows. A layout package must return a stand-in object from a Python
``layout`` property and wrap those functions. Fixed when a new ``torch.layout`` can be made.
"""
import torch
from _repro import case, report


def new_layout():
    try:
        torch.layout()
    except TypeError:
        pass
    else:
        return None
    try:
        type("ragged_layout", (torch.layout,), {})
    except TypeError as e:
        return f"torch.layout cannot be instantiated or subclassed: {e}"
    return None


case("a new torch.layout", new_layout, "cannot be instantiated or subclassed")
report()
