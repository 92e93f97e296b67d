"""torch.jagged: the backward of ``split_with_sizes`` along a static dim segfaults.

``torch.split_with_sizes(njt, [2, 4], dim=-1)`` works forward; its ``AutogradNestedTensor``
formula is ``_nested_split_with_sizes_backward(grads, split_sizes, dim,
at::native::get_nested_tensor_impl(self)->get_nested_sizes(), …)``, which takes an NJT (a Python
subclass) for a C++ ``NestedTensorImpl``: usually SIGSEGV, sometimes a garbage error ("Rank
cannot be negative but got -6917…"). Run here in a child process. (``torch.split(njt, 3, -1)``
with both pieces used works: ``split`` has no such formula.)
"""
import signal
import subprocess
import sys

from _repro import case, report

CHILD = """
import torch
torch.manual_seed(0)
x = torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(3, 6)], layout=torch.jagged, requires_grad=True)
a, b = torch.split_with_sizes(x, [2, 4], dim=-1)
(a.values().sum() + b.values().sum()).backward()
assert torch.equal(x.grad.values(), torch.ones(5, 6)), x.grad.values()
print("backward ok")
"""


def backward_in_child():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=False)
    if p.returncode == 0:
        return None
    if p.returncode < 0:
        return f"backward failed in the child: killed by {signal.Signals(-p.returncode).name}"
    return f"backward failed in the child: exit {p.returncode}, {(p.stderr.strip().splitlines() or [''])[-1]}"


case("split_with_sizes(njt, [2, 4], -1) backward", backward_in_child, "backward failed in the child")
report()
