"""The package's layering (CONTRIBUTING.md, Layering): the core modules — structure, tensor,
bridge, constructors — import without the op table (ops/) or the op library (compile/), and the
op table reaches the subclass only through ``tensor.install_op_table`` (NOTE [ Handler lookup ]);
routes only route (NOTE [ Bridged computations ])."""

import ast
import pathlib
import subprocess
import sys
import textwrap

import torch_multijagged as mj
from torch_multijagged import ops, tensor

PKG = pathlib.Path(mj.__file__).parent
CORE = ["structure.py", "tensor.py", "bridge.py", "constructors.py", "layout.py", "errors.py", "packing.py"]


def _imported_modules(path: pathlib.Path):
    """Every module named by an import statement in ``path``, function-local imports included,
    as (level, dotted name)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or ""
            if node.module is None:  # from . import ops
                for alias in node.names:
                    yield node.level, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name


def test_core_modules_never_import_the_op_table():
    bad = []
    for name in CORE:
        for level, mod in _imported_modules(PKG / name):
            top = mod.split(".")[0]
            if (level == 1 and top in ("ops", "compile")) or mod.startswith(("torch_multijagged.ops", "torch_multijagged.compile")):
                bad.append(f"{name}: {'.' * level}{mod}")
    assert bad == []


def test_core_imports_in_a_fresh_process_without_ops():
    """With the package's __init__ left out (a bare package module), the constructors, the
    subclass and the bridge import and build tensors without loading ops/ or compile/; an op then
    says that the op table is not installed."""
    script = textwrap.dedent(
        f"""
        import sys, types
        pkg = types.ModuleType("torch_multijagged")
        pkg.__path__ = [{str(PKG)!r}]
        sys.modules["torch_multijagged"] = pkg
        import torch
        import torch_multijagged.constructors as c, torch_multijagged.bridge, torch_multijagged.tensor
        loaded = sorted(m for m in sys.modules if m.startswith(("torch_multijagged.ops", "torch_multijagged.compile")))
        assert loaded == [], loaded
        x = c.nested_tensor([torch.ones(2, 3), torch.ones(0, 3)])
        assert x._partition.segments()[0].tolist() == [0, 2, 2]
        try:
            x + x
        except RuntimeError as e:
            assert "op table is not installed" in str(e), e
        else:
            raise AssertionError("an op ran without the op table")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_package_installs_the_op_table_once():
    assert tensor._dispatch is ops.dispatch
    assert tensor._ROUTES is ops.routes.ROUTES
    assert tensor._unify is ops.routes.unify_call
    assert tensor._guard_write is ops.views.guard_write
    assert tensor._reorder_copies is ops.views._REORDER_COPIES
    # nothing in ops/ writes into the tensor module
    for path in (PKG / "ops").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    assert not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and "tensor" in t.value.id), (
                        f"{path.name}:{node.lineno} assigns {t.value.id}.{t.attr}"
                    )


def test_routes_never_touch_packed_values():
    """``routes.py`` and ``shape_routes.py`` check and forward; computations on the packed values
    live in ``ops/bridged.py`` (the values bridge) or in handlers."""
    bad = []
    for name in ("routes.py", "shape_routes.py"):
        for node in ast.walk(ast.parse((PKG / "ops" / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_values":
                bad.append(f"{name}:{node.lineno} ._values")
            if isinstance(node, ast.Name) and node.id in ("values_of", "wrap_values", "wrap_values_like"):
                bad.append(f"{name}:{node.lineno} {node.id}")
    assert bad == []
