"""``_make_wrapper_subclass`` calls back into Python for every nested int in the sizes.

Nested ints are ``torch.SymInt``s over a *Python* node (``torch.nested._internal.nested_int.
NestedIntNode``). Building a wrapper whose sizes hold one calls the node's ``is_int`` /
``maybe_as_int`` / ``clone`` from C++ (via pybind) on every construction. A layout whose every op
result is a new wrapper pays this per op: measured on 2 CPU cores, ~6.3 us per wrapper with a
nested-int size against ~1.7 us with plain ints. The check below counts the calls (timings
are printed, never asserted); it is fixed when a construction makes none.
"""
import collections
import time

import torch
from _repro import case, report
from torch.nested._internal.nested_int import NestedIntNode


class Subclass(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def make(size, stride):
    return torch.Tensor._make_wrapper_subclass(Subclass, size, stride, dtype=torch.float32, storage_size=0,
                                               dispatch_sizes_strides_policy="strides")


j = torch.SymInt(NestedIntNode(0, 1))
NESTED = ((4, j, 16), (16 * j, 16, 1))
PLAIN = ((4, 7, 16), (112, 16, 1))


def python_calls_per_construction():
    calls = collections.Counter()
    methods = [m for m in vars(NestedIntNode) if callable(getattr(NestedIntNode, m)) and not m.startswith("__")]
    saved = {m: getattr(NestedIntNode, m) for m in methods}

    def counting(name, fn):
        def f(self, *args):
            calls[name] += 1
            return fn(self, *args)
        return f

    try:
        for m, fn in saved.items():
            setattr(NestedIntNode, m, counting(m, fn))
        make(*NESTED)
    finally:
        for m, fn in saved.items():
            setattr(NestedIntNode, m, fn)
    return f"Python NestedIntNode calls per construction: {dict(calls)}" if calls else None


for label, (size, stride) in (("nested-int size", NESTED), ("plain ints", PLAIN)):
    for _ in range(500):
        make(size, stride)
    t = time.perf_counter()
    for _ in range(5000):
        make(size, stride)
    print(f"time per _make_wrapper_subclass, {label}: {(time.perf_counter() - t) / 5000 * 1e6:.1f} us (not asserted)")
case("_make_wrapper_subclass with a nested-int size", python_calls_per_construction, "Python NestedIntNode calls")
report()
