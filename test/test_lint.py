"""Lint and type checks, as tests, so that the README's test command (what CI runs) covers them:
``ruff check`` of the repository and ``mypy`` of the public API, each with its configuration in
pyproject.toml (``[tool.ruff]``, ``[tool.mypy]``). Both are pinned in the ``test`` extra.

Run them alone with ``python -m ruff check .`` and ``python -m mypy``; ``ruff check --fix .``
fixes what it can.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(tool: str, *args: str) -> None:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: it is pinned in the test extra (pip install -e '.[test]')")
    r = subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{tool} {' '.join(args)} found problems:\n{r.stdout}{r.stderr}"


def test_ruff():
    _run("ruff", "check", "--no-cache", ".")


def test_mypy():
    _run("mypy")
