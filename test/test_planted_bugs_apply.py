"""Every planted bug of ``planted_bugs.py`` still applies: its line occurs exactly once in its file
(a refactor that moves or rewrites the line would otherwise leave the bug silently unmeasured)."""

import importlib.util
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def _bugs():
    spec = importlib.util.spec_from_file_location("planted_bugs", HERE / "planted_bugs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("planted_bugs", mod)
    spec.loader.exec_module(mod)
    return mod


PB = _bugs()


@pytest.mark.parametrize("bug", PB.BUGS, ids=lambda b: b.name)
def test_planted_bug_applies(bug):
    src = (PB.PKG / bug.file).read_text()
    assert src.count(bug.old) == 1, f"{bug.file}: {src.count(bug.old)} matches of the planted line"
    for t in bug.tests:
        assert (HERE / t).exists(), t
