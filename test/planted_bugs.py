"""Measure what the suite catches: plant plausible one-line bugs, one at a time, and run tests.

Not a test module (pytest collects ``test_*.py`` only). Each entry of the table (``planted_bugs_a.py``,
``planted_bugs_b.py``, ``planted_bugs_c.py``, ``planted_bugs_d.py``; a new one goes at the end of the last) is a one-line change a
reviewer could plausibly miss — an off-by-one, a dropped cast, a wrong tie rule, a swapped
order — in a handler, an index map or a backward formula. For each, the package and its tests are
copied to a scratch directory, the line is changed there, and pytest runs on the copy
(``PYTHONPATH`` puts it first) with ``-x``: a bug is *caught* when some test fails.

    python test/planted_bugs.py            # every planted bug, a table at the end
    python test/planted_bugs.py -k amax    # those whose name contains "amax"
    python test/planted_bugs.py --full     # run the whole suite per bug (slow), not the subset
    python test/planted_bugs.py --rev HEAD~3   # measure an earlier revision's suite

Each bug names the test files most likely to catch it; ``--full`` removes that hint, which
only matters for a bug the subset misses.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

# the table (its four parts) and its entry type, beside this file
from planted_bug_types import Bug
from planted_bugs_a import BUGS_A
from planted_bugs_b import BUGS_B
from planted_bugs_c import BUGS_C
from planted_bugs_d import BUGS_D

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "torch_multijagged"

BUGS: list[Bug] = BUGS_A + BUGS_B + BUGS_C + BUGS_D


def _tree(dest: pathlib.Path, rev: str | None) -> None:
    """The package, its tests and pyproject.toml from the working tree or a git revision."""
    dest.mkdir()
    if rev is None:
        for part in ("torch_multijagged", "test"):
            shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        shutil.copy(ROOT / "pyproject.toml", dest)
        return
    archive = subprocess.run(["git", "archive", rev, "torch_multijagged", "test", "pyproject.toml"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run(bug: Bug, full: bool, rev: str | None) -> tuple[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp) / "tree"
        _tree(tree, rev)
        target = tree / "torch_multijagged" / bug.file
        src = target.read_text()
        if src.count(bug.old) != 1:
            return f"stale ({src.count(bug.old)} matches)", 0.0
        target.write_text(src.replace(bug.old, bug.new))
        env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("HYPOTHESIS_PROFILE", "default")
        tests = ["test"] if full else [f"test/{t}" for t in bug.tests if (tree / "test" / t).exists()]
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        # exit code 1: a test failed; 0: all passed; anything else (collection error…) also fails CI
        return ("caught" if r.returncode != 0 else "MISSED"), dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only bugs whose name contains this")
    ap.add_argument("--full", action="store_true", help="run the whole suite for each bug")
    ap.add_argument("--rev", default=None, help="plant into this git revision instead of the working tree")
    args = ap.parse_args()
    rows = []
    for bug in BUGS:
        if args.k not in bug.name:
            continue
        verdict, dt = run(bug, args.full, args.rev)
        rows.append((bug.name, verdict, dt))
        print(f"{verdict:>8}  {dt:6.1f}s  {bug.name}", flush=True)
    caught = sum(v == "caught" for _, v, _ in rows)
    print(f"\ncaught {caught} of {len(rows)} planted bugs")


if __name__ == "__main__":
    main()
