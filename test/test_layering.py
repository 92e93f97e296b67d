"""The package's layering (CONTRIBUTING.md, Layering): no import cycle anywhere in the package,
function-local imports included; the core modules — structure, serialization, writes, tensor, bridge,
constructors — import without the op table (ops/) or the op library (compile/), and the op table
reaches the subclass only through ``tensor.install_op_table`` (NOTE [ Handler lookup ]); routes
only route (NOTE [ Routes ], NOTE [ Bridged computations ])."""

import ast
import pathlib
import subprocess
import sys
import textwrap

import torch_multijagged as mj
from torch_multijagged import ops, tensor

PKG = pathlib.Path(mj.__file__).parent
CORE = ["ragged_sizes.py", "structure.py", "serialization.py", "writes.py", "tensor.py", "wrappers.py", "bridge.py", "constructors.py", "jagged_views.py", "torch_nested.py", "layout.py", "errors.py", "packing.py"]


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


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module → the package modules it imports, from every ``import`` / ``from`` statement of
    every module under ``root``, those inside functions included. ``from pkg import name`` is an
    edge to ``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``)."""
    modules = {_module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:  # import a.b.c names module a.b when c is an attribute
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def _describe(graph: dict[str, set[str]], cycle: list[str]) -> str:
    inside = set(cycle)
    arrows = [f"{a} -> {b}" for a in cycle for b in sorted(graph[a] & inside)]
    return f"{len(cycle)} modules: " + "; ".join(arrows)


def test_no_import_cycle_in_the_package():
    """Arrows point down only (kernels ← compile ← core ← ops ← the package's ``__init__``); a
    function-local import counts, since deferring an import hides a cycle without removing it."""
    graph = import_graph(PKG)
    assert [_describe(graph, c) for c in import_cycles(graph)] == []


# Layers from the bottom; an import may only point to its own layer or one below it.
_LAYERS = {"kernels": 0, "compile": 1, "ops": 3}
_TOOLBOX = {"packing", "distributed", "_testing"}  # built on the constructors, beside ops/


def _layer(module: str) -> float:
    parts = module.split(".")
    if len(parts) == 1:
        return 4  # the package's __init__: the face
    if parts[1] in _TOOLBOX:
        return 2.5
    return _LAYERS.get(parts[1], 2)  # else the core


def test_imports_point_down_the_layers():
    """kernels ← compile ← core ← ops ← the package face (CONTRIBUTING.md, Layering)."""
    graph = import_graph(PKG)
    up = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if _layer(b) > _layer(a)]
    assert up == []


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_cycle_check_finds_a_function_local_cycle(tmp_path):
    """The check is not vacuous: a cycle closed by an import inside a function, one through a
    package ``__init__``, and one through ``from . import name`` are each reported with their files."""
    pkg = tmp_path / "pkg"
    _write(pkg, {
        "__init__.py": "from . import ops\n",
        "tensor.py": "def f():\n    from .constructors import make\n    return make\n",
        "constructors.py": "from .tensor import f\nmake = 1\n",
        "ops/__init__.py": "from . import views\ndef register(): pass\n",
        "ops/views.py": "from . import register\n",
        "kernels/a.py": "from . import b\n",
        "kernels/b.py": "import pkg.kernels.a\n",
        "kernels/__init__.py": "",
        "clean.py": "from .tensor import f\n",
    })
    graph = import_graph(pkg)
    assert import_cycles(graph) == [
        ["pkg.constructors", "pkg.tensor"],
        ["pkg.kernels.a", "pkg.kernels.b"],
        ["pkg.ops", "pkg.ops.views"],
    ]
    assert _describe(graph, ["pkg.constructors", "pkg.tensor"]) == (
        "2 modules: pkg.constructors -> pkg.tensor; pkg.tensor -> pkg.constructors"
    )


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
    assert tensor._ROUTES is ops._routing.ROUTES
    assert tensor._unify is ops._routing.unify_call
    assert tensor._guard_write is ops.shape.views.guard_write
    assert tensor._reorder_copies is ops.shape.views._REORDER_COPIES
    # nothing in ops/ writes into the tensor module
    for path in (PKG / "ops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    assert not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and "tensor" in t.value.id), (
                        f"{path.name}:{node.lineno} assigns {t.value.id}.{t.attr}"
                    )


# Modules that hold routes only (NOTE [ Routes ]); a family's other modules mix routes with handlers.
ROUTE_MODULES = ["_routing.py", "shape/reshape.py", "shape/regroup.py", "indexing/getitem.py", "reductions/routes.py",
                 "contractions/einsum.py", "elementwise/signs.py"]


def test_routes_never_touch_packed_values():
    """Route modules check and forward; computations on the packed values live in
    ``ops/bridged.py`` (the values bridge) or in handlers."""
    bad = []
    for name in ROUTE_MODULES:
        for node in ast.walk(ast.parse((PKG / "ops" / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_values":
                bad.append(f"{name}:{node.lineno} ._values")
            if isinstance(node, ast.Name) and node.id in ("values_of", "wrap_values", "wrap_values_like"):
                bad.append(f"{name}:{node.lineno} {node.id}")
    assert bad == []
