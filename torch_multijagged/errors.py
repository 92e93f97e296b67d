"""Error types.

``StructureError`` is raised when operands' structures do not fit together (different ragged
extents, batch sizes, or an op over the batch dim that the layout cannot express). It is both a
``ValueError`` (a user mistake) and a ``RuntimeError`` (what ``torch.jagged``
raises for the same mistakes, so code written against NJT keeps catching it).
"""

__all__ = ["StructureError"]


class StructureError(ValueError, RuntimeError):
    pass
