"""Error types.

``StructureError`` is raised when operands' structures do not fit together (different ragged
extents, batch sizes, or an op over the batch dim that the layout cannot express). It is both a
``ValueError`` (a user mistake) and a ``RuntimeError`` (what ``torch.jagged``
raises for the same mistakes, so code written against NJT keeps catching it).
"""

__all__ = ["StructureError", "TRACED_EXTENTS", "STATIC_TRACED", "op_label"]


class StructureError(ValueError, RuntimeError):
    r"""Operands' structures do not fit together.

    Raised when operands differ in their per-sample sizes along a ragged dim or in their batch
    sizes, or when an op over the batch dim asks for what the layout cannot express. It is both a
    :class:`ValueError` (a user mistake) and a :class:`RuntimeError` (what ``torch.jagged`` raises
    for the same mistakes, so code written against it keeps catching it). Operands whose ragged
    dims have equal per-sample sizes combine, even when their nested ints differ.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> a = mj.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)])
        >>> b = mj.nested_tensor([torch.ones(3, 3), torch.ones(1, 3)])
        >>> a + b  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        torch_multijagged.errors.StructureError: add(): ... ragged dim 1 has different per-sample sizes
        >>> issubclass(mj.StructureError, ValueError), issubclass(mj.StructureError, RuntimeError)
        (True, True)
    """


#: Appended to errors about ragged extents that differ while tracing: there, extents combine only
#: when provably one nested int, and eagerly equal sizes combine.
TRACED_EXTENTS = (
    "under torch.compile, tensors built apart keep their own nested ints even when their lengths are "
    "equal, and only one nested int combines with itself; build one on the other's offsets "
    "(mj.nested_tensor_from_jagged(values, x.offsets())) or from the other (x.new_zeros(x.shape) + ..., "
    "a linear projection of it), outside or inside the compiled function"
)

STATIC_TRACED = (
    " (eagerly a static size that is every sample's size of the ragged dim broadcasts as that dim; under "
    "torch.compile the sizes are symbols and it does not: build the tensor with that dim ragged, "
    "mj.as_nested_tensor(samples, ragged_dims=...))"
)


def op_label(func) -> str:
    """The name an error message gives an op: ``mul_`` for ``torch.Tensor.mul_`` and for
    ``aten.mul_.Tensor`` alike."""
    return getattr(func, "__name__", str(func)).split(".")[0]
