"""The ``multi_jagged`` layout object.

``torch.layout`` is a C type that cannot be extended, so the layout is an ``enum.Enum`` member
(dynamo accepts enum constants). ``MultiJaggedTensor.layout`` returns it; the C-level
``prim.layout`` still answers ``torch.jagged`` because torch internals need a real layout.
"""

import enum

__all__ = ["multi_jagged"]


class _MultiJaggedLayout(enum.Enum):
    multi_jagged = "multi_jagged"

    def __repr__(self) -> str:
        return "torch.multi_jagged"

    __str__ = __repr__


multi_jagged = _MultiJaggedLayout.multi_jagged
