"""Every public function, class and method is documented in PyTorch's docstring format, and its
examples run.

The public API is what ``torch_multijagged`` exports (``__all__``) and the public members that
``MultiJaggedTensor`` defines itself (``values``, ``offsets``, ``ragged_dims``…, overrides of
``torch.Tensor``'s included). Each has a docstring with an ``Example::`` section of doctest lines,
which the standard ``doctest`` module runs here, one test per public name, with ELLIPSIS and
NORMALIZE_WHITESPACE. An example starts from empty globals, so it imports what it uses, as a
reader copying it would. Nested ints are numbered by the process (``j0``, ``j7``…): examples
print ``x.dim()``, ``x.ragged_dims`` or per-sample shapes, or match ``j...``.

Functions and methods also list every argument under ``Args:`` / ``Keyword args:`` (``name (type): …``) and,
unless they return ``None``, have a ``Returns:`` section. A new public name without these fails.
"""

import doctest
import inspect
import re

import pytest
import torch

import torch_multijagged as mj

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _public() -> dict[str, object]:
    names = {name: getattr(mj, name) for name in mj.__all__}
    for name, member in vars(mj.MultiJaggedTensor).items():
        if not name.startswith("_"):
            names[f"MultiJaggedTensor.{name}"] = member
    return names


PUBLIC = _public()


def _documented(obj):
    """The object whose ``__doc__`` documents ``obj``: a property's getter, an instance's class
    (the layout is an enum member), else ``obj`` itself."""
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return type(obj)
    return obj


def _doctest(name: str) -> doctest.DocTest:
    tests = doctest.DocTestFinder(recurse=False).find(_documented(PUBLIC[name]), name, globs={})
    assert len(tests) == 1, f"{name}: no docstring"
    return tests[0]


def test_public_names_are_found():
    assert len(mj.__all__) == len(set(mj.__all__))
    assert {"nested_tensor", "MultiJaggedTensor.values", "MultiJaggedTensor.ragged_dims"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_docstring_format(name):
    target = _documented(PUBLIC[name])
    doc = inspect.cleandoc(target.__doc__ or "")
    assert doc, f"{name}: no docstring"
    summary = doc.splitlines()[0]
    assert summary.strip() and (len(doc.splitlines()) == 1 or not doc.splitlines()[1].strip()), (
        f"{name}: the docstring opens with a one-line summary and a blank line"
    )
    assert re.search(r"^Example::$", doc, re.MULTILINE), f"{name}: no 'Example::' section"
    assert _doctest(name).examples, f"{name}: its 'Example::' section has no '>>>' lines"
    if isinstance(PUBLIC[name], property) or not inspect.isroutine(target):
        return  # attributes and classes: no arguments, no return value
    params = [p for p in inspect.signature(target).parameters.values() if p.name not in ("self", "cls")]
    if params:
        assert re.search(r"^(Args|Keyword args):$", doc, re.MULTILINE), f"{name}: no 'Args:' section"
    for p in params:
        assert re.search(rf"^\s+{p.name} \(.+\): ", doc, re.MULTILINE), (
            f"{name}: argument {p.name!r} is not documented as '{p.name} (type): description'"
        )
    if inspect.signature(target).return_annotation not in ("None", None):
        assert re.search(r"^Returns:$", doc, re.MULTILINE), f"{name}: no 'Returns:' section"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_docstring_examples_run(name):
    test = _doctest(name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    with torch.random.fork_rng():
        result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
