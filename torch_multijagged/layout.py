"""The ``multi_jagged`` layout object.

``torch.layout`` is a C type that cannot be extended, so the layout is an ``enum.Enum`` member
(dynamo accepts enum constants). ``MultiJaggedTensor.layout`` returns it; the C-level
``prim.layout`` still answers ``torch.jagged`` because torch internals need a real layout.
"""

import enum

__all__ = ["multi_jagged"]


class _MultiJaggedLayout(enum.Enum):
    r"""The ``multi_jagged`` layout: a batch of dense tensors whose sizes differ in several dims.

    Pass it as ``layout=`` to ``torch.nested.nested_tensor``, ``as_nested_tensor`` and ``narrow``
    (``import torch_multijagged`` teaches them the layout and makes it ``torch.multi_jagged``
    too); ``x.layout`` of a multi_jagged tensor returns it. The samples share one rank and may
    differ in size along any number of dims, stored packed without padding. It is an
    :class:`enum.Enum` member rather than a :class:`torch.layout`, a C type that cannot be
    extended.

    Example::

        >>> import torch, torch_multijagged as mj
        >>> x = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=mj.multi_jagged)
        >>> x.layout
        torch.multi_jagged
        >>> torch.multi_jagged is mj.multi_jagged
        True
        >>> [t.shape for t in x.unbind()]
        [torch.Size([2, 3]), torch.Size([1, 3])]
    """

    multi_jagged = "multi_jagged"

    def __repr__(self) -> str:
        return "torch.multi_jagged"

    __str__ = __repr__


multi_jagged = _MultiJaggedLayout.multi_jagged
