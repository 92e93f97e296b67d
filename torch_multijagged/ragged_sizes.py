"""The nodes behind ragged sizes (nested ints) read from a multi_jagged tensor's shape.

``x.shape[1]`` of a batch is a nested int whose node is ``_RaggedSizeNode``: torch.jagged's node,
with a clear error where code asks for its one value, and answers where a size has a per-sample
meaning (``_RaggedSizeNode``'s docstring; NOTE [ Comparing ragged sizes ]). The answers need the
extents behind the nodes, which ``structure.py`` owns and hands in once, at its import
(``EXTENTS``): this module imports nothing of the package, so the structure module can build
nodes without an import cycle.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

import torch
from torch.fx.experimental._constant_symnode import ConstantIntNode
from torch.nested._internal.nested_int import NestedIntNode, _eq as _torch_eq, _ge as _torch_ge

__all__: list = []


class _Extents:
    """What a size node asks of the extents behind nested ints, filled in by ``structure.py``:
    ``node_extent(node)`` the eager extent of a node (or None), ``quotient(e, f)`` the extent of
    ``e``'s sizes divided by ``f``'s where ``e`` was flattened from ``f``, ``mapped_extent(e, key,
    lengths_of)`` and ``product_extent(a, b)`` the extent of two nodes' dims flattened."""

    node_extent: Callable[[Any], Any] = staticmethod(lambda node: None)
    quotient: Callable[[Any, Any], Any] = staticmethod(lambda e, f: None)
    mapped_extent: Callable[..., Any] = staticmethod(lambda e, key, lengths_of: e)
    product_extent: Callable[[Any, Any], Any] = staticmethod(lambda a, b: None)


EXTENTS = _Extents()


_NO_VALUE = (
    "a ragged dim's size differs per sample and has no single value. Build tensors of the batch's "
    "shape from the batch itself (x.new_zeros(x.shape), torch.ones_like(x), x.new_full(x.shape, v)); "
    "each sample's positions are mj.position_ids(x); the sizes are x.sizes() or x.offsets()"
)


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# frames that only relay a comparison to the node (NOTE [ Comparing ragged sizes ])
_RELAYS = frozenset(os.path.join(_TORCH_DIR, *p) for p in (("__init__.py",), ("fx", "experimental", "sym_node.py"),
                                                            ("fx", "experimental", "_constant_symnode.py")))


def _asked_by_torch() -> bool:
    """Whether the comparison being answered was asked by torch's code or this package's (its
    invariant then answers where the samples differ), not by a user's (NOTE [ Comparing ragged
    sizes ])."""
    f = sys._getframe(1)
    here = os.path.abspath(__file__)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if name != here and name not in _RELAYS:
            return name.startswith((_TORCH_DIR, _PACKAGE_DIR))
        f = f.f_back
    return True


class _RaggedSizeNode(NestedIntNode):
    """``torch.jagged``'s nested-int node, with a clear error where code asks for its one value.

    ``int(x.shape[1])``, ``range(n)``, ``torch.arange(n)``, ``float(n)`` and arithmetic such as
    ``n // 2`` treat a size as one number; torch's node answers with an ``AttributeError`` about a
    missing method. A ragged dim has no one size, so ours raises a ``TypeError`` that says so and
    names what to write instead. What has a per-sample meaning is answered: the product of two
    ragged sizes of one batch (the nested int of the two dims flattened, ``_product_extent``),
    floor division by a positive int (each size divided, a mapped extent), the remainder by a
    positive int where every sample gives the same one (an int), adding or subtracting
    0 (Hugging Face's cache length 0 plus the sequence length), a size minus itself (0), ``abs``,
    and an order comparison
    (``n <= max_len``, ``min(n, k)``, ``q_len > 1``, two ragged sizes) with the answer every sample
    gives (NOTE [ Comparing ragged sizes ]). Everything else (equality, products with ints,
    hashing, tracing) is the base class's."""

    def _no_value(self, use: str):
        raise TypeError(f"{use} with the nested int {self}: {_NO_VALUE}")

    def _eager_only(self, use: str):
        raise TypeError(f"{use} with the nested int {self} under torch.compile: each sample's result is a new ragged "
                        "size, made from the sizes on the host, which a compiled region does not have; compute it "
                        "eagerly, or per sample from x.sizes()")

    def _one_value(self) -> Optional[int]:
        """The size every sample has, where they all have one (a batch of one sample, or of equal
        sizes: what each sample's own code would read there), else None (NOTE [ Comparing ragged
        sizes ]: the same rule as a comparison every sample answers alike)."""
        sizes = _node_sizes(self)
        return None if sizes is None or not sizes.numel() else _common(sizes)

    def int_(self):
        v = self._one_value()
        if v is None:
            self._no_value("int(), range() or an index")
        return v

    def guard_int(self, file, line):
        v = self._one_value()
        if v is None:
            self._no_value("an int argument (torch.arange(n), a dense tensor's size or slice)")
        return v

    def guard_float(self, file, line):
        self._no_value("float()")

    def sym_float(self):
        # a comparison with a float (``num_msa > max_num_msa`` with ``inf``) promotes the size to a
        # float first: a node that answers order comparisons only (NOTE [ Comparing ragged sizes ])
        return _RaggedAsFloat(self)

    def _arith(self, other):
        self._no_value("arithmetic other than a product with an int, adding or subtracting an int, floor division or "
                       "a remainder by a positive int, or a difference every sample shares")

    truediv = int_truediv = pow = pow_by_natural = _arith

    def mod(self, other):
        # ``H % p`` (timm's ``PatchEmbed`` checks ``H % p == 0``; Swin pads where ``H % 2 == 1``): a
        # remainder is no size of any dim, so it is an int — the one every sample gives — and code
        # that branches on it takes each sample's own branch; remainders that differ raise
        e = EXTENTS.node_extent(self)
        if e is not None and torch.compiler.is_compiling():
            self._eager_only("n % k")
        if not other.is_constant() or other.constant_int() <= 0 or e is None:
            self._arith(other)
        k = other.constant_int()
        rem = torch.remainder(_node_sizes(self), k)  # (a multiple's too: ``(2 * n) % 2``)
        common = _common(rem) if rem.numel() else 0
        if common is not None:
            return ConstantIntNode(common)
        raise ValueError(f"{self} % {k} differs per sample (remainders {rem.tolist()} of sizes "
                         f"{_node_sizes(self).tolist()}): code that branches on it would treat samples differently; "
                         f"{_NO_VALUE}")

    def add(self, other):
        if other.is_constant() and other.constant_int() == 0:
            return self  # ``n + 0``, ``0 + n`` and ``n - 0``: each sample's own size
        if not other.is_constant():
            self._arith(other)
        return self._shifted(1, other.constant_int())

    def sub(self, other):
        if other.is_constant():
            return self.add(_IntBesideRagged(-other.constant_int()))
        if isinstance(other, _RaggedSizeNode) and self.coeff == other.coeff and _equal_sizes(self, other):
            # ``n - n`` (Hugging Face's ``kv_length + kv_offset - mask.shape[-1]`` for a mask of the
            # tokens' lengths): every sample's difference is 0, the int 0
            return ConstantIntNode(0)
        if isinstance(other, _RaggedSizeNode):
            # ``n - m`` of two batches' sizes (a U-Net's ``skip.size(2) - up.size(2)`` before
            # ``F.pad``): an int where every sample's difference is one (as ``n % k``), so code that
            # pads or crops by it does to each sample what it does alone; differences that differ raise
            if torch.compiler.is_compiling():
                self._eager_only("n - m")
            a, b = _node_sizes(self), _node_sizes(other)
            if a is not None and b is not None and a.shape == b.shape:
                diff = a - b
                common = _common(diff) if diff.numel() else 0
                if common is not None:
                    return ConstantIntNode(common)
                raise TypeError(
                    f"{self} - {other} differs per sample (differences {diff.tolist()} of sizes {a.tolist()} and "
                    f"{b.tolist()}): code that pads or crops by it would treat samples differently; resize to the "
                    f"other batch's sizes instead (F.interpolate(x, size=other.shape[-2:])); {_NO_VALUE}"
                )
        self._arith(other)

    # NOTE [ Ragged sizes plus an int ]
    #
    # ``n + k``, ``n - k`` and ``k - n`` for an int ``k`` have a meaning per sample: each sample's
    # size plus or minus ``k`` (ToMe's ``(t - protected) // 2`` and ``t1 - r``, a class token's
    # ``n + 1``, the padding ``max_len - n``). The answer is the nested int of a mapped extent
    # (``structure.mapped_extent``) keyed as the op that makes those sizes from ``n``'s extent, so
    # both name one nested int: ``n - k`` as the slice ``x[:, k:]`` (``("slice", k, None, 1)``),
    # ``n + k`` as ``F.pad`` of ``k`` rows before (``("pad", k, 0)``), ``k - n`` by its own rule
    # (``("rsub", k)``); a size rule that gives ``n``'s sizes back gives ``n`` (``(n - 1) + 1``).
    # A ragged size holds sizes, so a sample whose value would be negative (``n - 1`` with an empty
    # sample) raises, naming it: dense code would get a negative int there, which a shape refuses
    # and a slice reads from the end — no clamping to 0 could stand for both. A multiple of a
    # ragged size (``2 * n + 1``) and a traced nested int (torch's, under ``torch.compile``) keep
    # torch's refusal.
    def _shifted(self, sign: int, k: int):
        """``sign * n + k`` per sample (``sign`` 1: ``n + k``, -1: ``k - n``): NOTE [ Ragged sizes
        plus an int ]."""
        e = EXTENTS.node_extent(self)
        if e is not None and torch.compiler.is_compiling():
            self._eager_only(f"{k} - n" if sign < 0 else f"n {'+' if k >= 0 else '-'} {abs(k)}")
        if self.coeff != 1 or e is None:
            if sign < 0:
                self._no_value("negation")
            self._arith(_IntBesideRagged(k))
        sizes = e.host_lengths()
        values = sizes * sign + k
        negative = (values < 0).nonzero() if sign < 0 or k < 0 else values[:0]  # (n + k ≥ 0: no test)
        if negative.numel():
            i = int(negative[0, 0])
            what = f"{self} {'+' if k >= 0 else '-'} {abs(k)}" if sign > 0 else f"{k} - {self}"
            raise ValueError(f"{what} is negative in sample {i} (size {int(sizes[i])}, giving {int(values[i])}): a "
                             f"ragged size holds no negative value (sizes {sizes.tolist()}); {_NO_VALUE}")
        key = ("rsub", k) if sign < 0 else ("slice", -k, None, 1) if k < 0 else ("pad", k, 0)
        return EXTENTS.mapped_extent(e, key, lambda n: n * sign + k).nested_int.node

    def abs(self):
        return self

    def wrap_int(self, num: int):
        # the int beside a ragged size in ``1 / n``, ``6 // n``, ``2 ** n``: torch's constant node
        # has no such methods (an AttributeError), ours refuses as this node's arithmetic does
        return _IntBesideRagged(num)

    # NOTE [ Comparing ragged sizes ]
    #
    # torch's node decides an order comparison only where its invariant does (every nested int is
    # at least 2: ``n >= 1`` is True, ``n < 2`` False) and raises "relation is indeterminate"
    # otherwise, which model code meets in ``assert n <= max_len``, ``min(n, window)``, ``if k_len >
    # q_len`` and slices of a dense table by a ragged size. Python needs one bool there; the sizes
    # give one when every sample answers alike (each sample would take the same branch alone), so
    # an eager size of ours is compared per sample first and the common answer returned — also
    # where torch's invariant would answer otherwise: with one token per sample ``q_len > 1`` (the
    # decoding test of Hugging Face's attention) is False. Where the samples answer differently,
    # torch's invariant answers if it can — ``torch.jagged``'s rule, which code written for it relies
    # on (Hugging Face's ``is_causal = q_len > 1`` with a one-token sample; the autograd engine asks
    # ``n > 1`` of a batch holding an empty sample) — else the comparison raises, naming itself.
    # A size this package derives (``n - 1``, ``n // 2``, a slice's or a strided window's: an
    # extent with a source) has no such rule to honour, and is often 0 or 1, where the invariant
    # is false: ``min(r, (t - 1) // 2)`` (ToMe) would take r rows of a sample holding fewer. So a
    # comparison of a derived size that the samples answer differently raises — unless torch's
    # own code asked it: the caller is found past the frames that only relay it to the node
    # (``SymInt``'s operators, ``sym_node``'s magic methods, the constant node's reflection), and a
    # caller in torch or in this package is torch's code (a C++ caller shows as the torch frame
    # that entered C++). Traced nested ints are torch's alone. The answer is a ``_DecidedBool``
    # either way.
    def _order(self, name: str, other, rule):
        mine = _node_sizes(self)
        theirs = other.constant_int() if other.is_constant() else _node_sizes(other)
        symbol = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[name]
        split = None
        if mine is not None and mine.numel() == 0:
            # no sample to answer (B = 0): torch's rule where it decides, whose answers agree with
            # one another (``n > n`` False, as with samples); else every sample's, vacuously True
            # (``assert n <= max_len`` holds for an empty batch)
            try:
                return _DecidedBool(rule(self, other))
            except ValueError:
                return _DecidedBool(True)
        if mine is not None and theirs is not None and not (isinstance(theirs, torch.Tensor) and theirs.shape != mine.shape):
            held = getattr(torch, name)(mine, theirs)
            answer = _alike(held)
            if answer is not None:
                return _DecidedBool(answer)
            split = f"{self} {symbol} {other} holds for some samples and not others (sizes {mine.tolist()})"
            if (_derived(self) or _derived(other)) and not _asked_by_torch():
                raise ValueError(f"{split}: code that branches on it would treat samples differently; {_NO_VALUE}")
        try:
            return _DecidedBool(rule(self, other))
        except ValueError:
            pass
        if split is None:
            raise ValueError(f"{self} {symbol} {other}: the relation is indeterminate ({_NO_VALUE})")
        raise ValueError(f"{split}: code that branches on it would treat samples differently; {_NO_VALUE}")

    def eq(self, other):
        # torch's answer (one nested int equals itself only), as a node torch's C++ can query
        return _DecidedBool(_torch_eq(self, other))

    def ne(self, other):
        return _DecidedBool(not _torch_eq(self, other))

    def ge(self, other):
        return self._order("ge", other, lambda a, b: _torch_ge(a, b))

    def gt(self, other):
        return self._order("gt", other, lambda a, b: not _torch_ge(b, a))

    def le(self, other):
        return self._order("le", other, lambda a, b: _torch_ge(b, a))

    def lt(self, other):
        return self._order("lt", other, lambda a, b: not _torch_ge(a, b))

    def floordiv(self, other):
        # ``H // s`` (a stride's output grid): each sample's size floor-divided, a mapped extent
        # (the same nested int for ``H // 1``, one nested int per divisor)
        e = EXTENTS.node_extent(self)
        if e is not None and torch.compiler.is_compiling():
            self._eager_only("n // k")
        if isinstance(other, NestedIntNode) and e is not None:
            # ``(H * W) // W`` (einops recovering an axis from a flattened one): the other factors
            rest = EXTENTS.quotient(e, EXTENTS.node_extent(other)) if self.coeff == 1 and other.coeff == 1 else None
            if rest is None:
                self._arith(other)
            return rest.nested_int.node
        if not other.is_constant() or other.constant_int() <= 0 or e is None:
            self._arith(other)
        k = other.constant_int()
        if self.coeff != 1:
            # ``(3 * n) // 4`` (MAE's ``int(L * (1 - mask_ratio))`` written with ints): each sample's
            # multiple floor-divided, a mapped extent of ``n``
            c = self.coeff
            out = EXTENTS.mapped_extent(e, ("scaled_floordiv", c, k), lambda n: torch.div(n * c, k, rounding_mode="floor"))
            return out.nested_int.node
        # ``n // k`` for k > 1 is its own size even where it equals ``n`` (every sample empty): a view
        # to ``(n // k, k)`` reads it as a factor of ``n``
        out = EXTENTS.mapped_extent(e, ("floordiv", k), lambda n: torch.div(n, k, rounding_mode="floor"), k > 1)
        if out is not e:
            out.cache.setdefault(("floordiv_of",), (e, k))  # read back by ``floordiv_of``
        return out.nested_int.node

    int_floordiv = floordiv
    sym_min = sym_max = _arith

    def neg(self):
        self._no_value("negation")

    def mul(self, other):
        if other.is_constant():
            c = other.constant_int()
            if c == 0:
                return ConstantIntNode(0)  # every sample's size times 0
            if c == 1:
                return self  # ``1 * n`` is ``n`` itself (einops' ``prod`` of a packed shape), the same nested int
            if c < 0:
                self._no_value("a product with a negative int")  # as negation: no size is negative
            return _RaggedSizeNode(self.t_id, self.coeff * c)
        flat = EXTENTS.product_extent(self, other)
        if flat is not None:
            return _RaggedSizeNode(flat.nested_int.node.t_id, self.coeff * other.coeff)
        return super().mul(other)


class _DecidedBool:
    """A comparison of ragged sizes decided per sample (NOTE [ Comparing ragged sizes ]), as a
    constant bool node. Not torch's own constant (``_get_constant_bool_symnode``, a C++ node):
    torch's C++ wraps what a Python node returns and asks it the bool-node protocol by name, which
    the C++ node does not answer (a dense slice ``t[:, :n]`` compares before it reads the bound)."""

    __slots__ = ("val",)

    def __init__(self, val: bool) -> None:
        self.val = val

    def _answer(self, *args) -> bool:
        return self.val

    bool_ = guard_bool = expect_true = statically_known_true = guard_or_false = guard_or_true = _answer
    constant_bool = maybe_as_bool = guard_size_oblivious = _answer

    def is_constant(self) -> bool:
        return True

    def is_bool(self) -> bool:
        return True

    def has_hint(self) -> bool:
        return True

    def is_int(self) -> bool:
        return False

    is_float = is_nested_int = is_symbolic = is_int

    def clone(self) -> "_DecidedBool":
        return self

    def wrap_bool(self, val: bool) -> "_DecidedBool":
        return _DecidedBool(val)

    def sym_not(self) -> "_DecidedBool":
        return _DecidedBool(not self.val)

    def sym_and(self, other) -> "_DecidedBool":
        return _DecidedBool(self.val and bool(other.bool_()))

    def sym_or(self, other) -> "_DecidedBool":
        return _DecidedBool(self.val or bool(other.bool_()))

    def str(self) -> str:
        return str(self.val)

    __str__ = __repr__ = _graph_repr = str


def _alike(held: torch.Tensor) -> Optional[bool]:
    """The answer every sample gives to a comparison (NOTE [ Comparing ragged sizes ]), or None
    where they differ."""
    if bool(held.all()) or not bool(held.any()):
        return bool(held.all())
    return None


class _FloatBesideRagged:
    """A float on the other side of a comparison with a ragged size (``_RaggedAsFloat``)."""

    __slots__ = ("val",)

    def __init__(self, val: float) -> None:
        self.val = val

    def is_constant(self) -> bool:
        return True

    def _refuse(self, other, *args):
        # a reflected op (``1.0 / n``, ``2.0 * n``) asks the float's node, with the size's as ``other``
        if isinstance(other, _RaggedAsFloat):
            other._refuse()
        raise TypeError(f"float arithmetic of {self.val} with {other}: {_NO_VALUE}")

    add = sub = mul = truediv = float_truediv = pow = float_pow = mod = floordiv = int_floordiv = _refuse
    sym_min = sym_max = _refuse


class _RaggedAsFloat:
    """A ragged size promoted to a float for a comparison with one (``n > math.inf``): order
    comparisons are answered per sample as the size's own are; anything else raises the size's
    error (a float has no per-sample meaning here)."""

    __slots__ = ("size",)

    def __init__(self, size: "_RaggedSizeNode") -> None:
        self.size = size

    def _order(self, name: str, other) -> _DecidedBool:
        mine = _node_sizes(self.size)
        theirs = getattr(other, "val", None)
        if mine is None or not isinstance(theirs, (int, float)):
            self._refuse()
        answer = _alike(getattr(torch, name)(mine.to(torch.float64), float(theirs)))
        if answer is None:
            symbol = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[name]
            raise ValueError(f"{self.size} {symbol} {theirs} holds for some samples and not others (sizes "
                             f"{mine.tolist()}): code that branches on it would treat samples differently; {_NO_VALUE}")
        return _DecidedBool(answer)

    def ge(self, other):
        return self._order("ge", other)

    def gt(self, other):
        return self._order("gt", other)

    def le(self, other):
        return self._order("le", other)

    def lt(self, other):
        return self._order("lt", other)

    def _refuse(self, *args):
        self.size._no_value("float arithmetic or float()")

    add = sub = mul = truediv = float_truediv = pow = float_pow = mod = floordiv = int_floordiv = _refuse
    neg = sym_min = sym_max = eq = ne = guard_float = float_ = sym_int = ceil = floor = round = trunc = _refuse

    def wrap_float(self, val: float) -> _FloatBesideRagged:
        return _FloatBesideRagged(val)

    def wrap_int(self, val: int) -> _FloatBesideRagged:
        return _FloatBesideRagged(val)

    def is_constant(self) -> bool:
        return False

    def is_float(self) -> bool:
        return True

    def is_int(self) -> bool:
        return False

    is_bool = is_nested_int = is_int

    def is_symbolic(self) -> bool:
        return False

    def has_hint(self) -> bool:
        return False

    def str(self) -> str:
        return f"float({self.size})"

    __str__ = __repr__ = _graph_repr = str


class _IntBesideRagged(ConstantIntNode):
    """An int on the other side of a ragged size's arithmetic (``_RaggedSizeNode.wrap_int``)."""

    def _refuse(self, other, op: str = "arithmetic"):
        if isinstance(other, _RaggedSizeNode):
            # ``25 // (x * y)`` (einops recovering an unnamed axis: name it, ``b=B``), ``1 / n``, ``2 ** n``
            raise TypeError(f"{op} of the int {self.val} by the nested int {other} (an int over a ragged size: no "
                            f"per-sample size; where a library infers an axis this way, give its size, e.g. einops' "
                            f"b=B): {_NO_VALUE}")
        raise TypeError(f"arithmetic of {self} with {other}: {_NO_VALUE}")

    def truediv(self, other):
        self._refuse(other, "division")

    def floordiv(self, other):
        self._refuse(other, "floor division")

    def mod(self, other):
        self._refuse(other, "remainder")

    def pow(self, other):
        self._refuse(other, "power")

    int_truediv = truediv
    int_floordiv = floordiv
    pow_by_natural = pow
    sym_min = sym_max = _refuse

    def sub(self, other):
        if isinstance(other, _RaggedSizeNode):
            return other._shifted(-1, self.val)  # ``k - n``: NOTE [ Ragged sizes plus an int ]
        return super().sub(other)


def _common(values: torch.Tensor) -> Optional[int]:
    """The one value of a non-empty host int tensor whose entries all equal it, else None."""
    first = int(values[0])
    return first if bool((values == first).all()) else None


def _equal_sizes(a, b) -> bool:
    """Whether two eager nested-int nodes of ours hold the same size in every sample (one nested
    int, or equal per-sample sizes: equal lengths built apart)."""
    if a.t_id == b.t_id:
        return True
    sa, sb = _node_sizes(a), _node_sizes(b)
    return sa is not None and sb is not None and sa.shape == sb.shape and bool(torch.equal(sa, sb))


def _derived(node) -> bool:
    """Whether an eager nested-int node of ours names a size this package derived from another
    (shifted, divided, a slice's or a window's: its extent records a source), not one a batch
    was built with (NOTE [ Comparing ragged sizes ])."""
    e = EXTENTS.node_extent(node) if isinstance(node, NestedIntNode) else None
    return e is not None and ("source",) in e.cache


def _node_sizes(node) -> "Optional[torch.Tensor]":
    """Each sample's value of an eager nested-int node of ours, (B,) on the host, else None."""
    e = EXTENTS.node_extent(node)
    if e is None or torch.compiler.is_compiling():
        return None
    return e.host_lengths() * node.coeff
