"""The PyTorch core limitations the package works around, each held by its repro.

Every script in ``docs/upstream/`` (``repro_<name>.py``, table in ``docs/upstream/README.md``)
shows one limitation on plain torch and reports it by exit status (protocol in
``docs/upstream/_repro.py``): 0 and ``FIXED`` when it is gone, 1 and ``PERSISTS`` while it
persists. Each runs here in a subprocess of its own (some kill their process: a segfault is
observed in a child), as a strict xfail that accepts only the documented failure: a torch
release that fixes a limitation makes its test XPASS, which fails the suite — then remove the
workaround named in the README row, and the row. A repro that breaks (a control case fails) or
whose failure changes shape fails outright.
"""

import pathlib
import re
import subprocess
import sys

import pytest

UPSTREAM = pathlib.Path(__file__).resolve().parent.parent / "docs" / "upstream"

# repro name -> (reason, timeout in s)
REPROS = {
    "is_nested": ("a Python subclass reporting is_nested=True breaks dynamo and the autograd API", 120),
    "wrapper_nested_int_callbacks": ("_make_wrapper_subclass calls Python NestedIntNode methods per nested int", 120),
    "factories_nested_ints": ("factories (torch.ones(x.shape), torch.arange(j)) cannot take nested ints", 120),
    "engine_unbroadcast_double_backward": (
        "double backward through the engine's sum_to of a dense operand expands a dense tensor to nested-int sizes", 120),
    "func_grad_subclass": ("torch.func.grad hides __torch_function__ and breaks torch.jagged's formulas", 120),
    "captured_nested_int": ("a nested int closed over from outside a compiled function cannot be proxied", 120),
    "inductor_acc_chunk_guard": ("Inductor's CPU accumulation-chunk choice guards the reduction length at 4096", 300),
    "njt_split_with_sizes_backward_segfault": ("torch.jagged's split_with_sizes backward segfaults", 180),
    "undefined_output_grad_zeros": (
        "an unused autograd.Function / compiled-region output is materialised as at::zeros(nested-int sizes)", 120),
    "mean_two_nested_ints": ("mean's derivative records numel, a product of two nested ints", 120),
    "nested_int_arithmetic": ("nested ints have no product with each other, no add, no sym_max", 120),
    "derivatives_need_sizes": ("aten derivative formulas build tensors from sizes (split, abs, layer_norm)", 120),
    "dynamo_tensor_dict": ("dynamo raises an internal error on t.__dict__ of a traceable subclass", 120),
    "dynamo_subclass_getattr": ("dynamo cannot read attributes of a subclass that defines __getattr__", 120),
    "pointwise_tags": ("elementwise aten overloads lack torch.Tag.pointwise", 120),
    "deepcopy_nested_int": ("deepcopy of a ragged tensor keeps the old nested int beside new offsets", 120),
    "custom_layout": ("torch.layout cannot be extended by a third-party layout", 120),
    "max_pool1d_dilation_out_of_bounds": ("max_pool1d returns an out-of-bounds index for a window missing the input", 120),
    "upsample_nearest_same_size": ("nearest interpolation kernels disagree when the scale keeps the size", 120),
    "nested_int_scalar_placeholder": ("a nested int given as a number operand is read as the placeholder 7777777", 120),
    "fused_cpu_attention_last_stride": ("the fused CPU attention kernel ignores the head dim's stride", 120),
}


class LimitationPersists(Exception):
    """The repro reported its limitation, as documented (the expected xfail)."""


def _run(name: str, timeout: int) -> None:
    script = UPSTREAM / f"repro_{name}.py"
    p = subprocess.run([sys.executable, str(script)], cwd=UPSTREAM, capture_output=True, text=True, timeout=timeout,
                       check=False)
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines and lines[-1] == "FIXED":
        return  # the limitation is gone: the strict xfail turns this into a failure (XPASS)
    if p.returncode == 1 and any(line.startswith("PERSISTS ") for line in lines):
        raise LimitationPersists("\n".join(line for line in lines if line.startswith("PERSISTS ")))
    raise AssertionError(
        f"repro_{name}.py is broken or its failure changed (exit {p.returncode}):\n{p.stdout}\n{p.stderr[-3000:]}"
    )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, raises=LimitationPersists, reason=reason))
        for name, (reason, _) in REPROS.items()
    ],
)
def test_upstream_limitation(name):
    _run(name, REPROS[name][1])


def test_every_repro_has_a_test_and_a_readme_row():
    scripts = {p.stem.removeprefix("repro_") for p in UPSTREAM.glob("repro_*.py")}
    assert scripts == set(REPROS)
    readme = (UPSTREAM / "README.md").read_text()
    listed = set(re.findall(r"\(repro_(\w+)\.py\)", readme))
    assert listed == set(REPROS), f"README rows without a repro: {listed - set(REPROS)}; repros without a row: {set(REPROS) - listed}"
