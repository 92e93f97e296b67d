"""The outcome protocol of the repro scripts beside this file (their subclasses: ``_toys.py``).

Outcome protocol (``test/test_upstream_repros.py`` relies on it):

* exit 0, last line ``FIXED``: every case of the limitation now works;
* exit 1, lines ``PERSISTS <case>: <observed>``: the limitation is there, as documented;
* exit 2, ``REPRO BROKEN``: a control case (which must work on any torch) failed;
* exit 3, ``CHANGED <case>``: a case fails, but not with the documented failure — look at it.
"""

from __future__ import annotations

import sys
import traceback

_failures: list[tuple[str, str]] = []
_changed: list[tuple[str, str]] = []


def _observed(e: BaseException) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:300]}"


def case(name: str, fn, expect: str) -> None:
    """Run ``fn``; a failure whose ``"Type: message"`` contains ``expect`` is the documented
    limitation; any other failure is a change worth a look. ``fn`` may also return a string:
    the failure observed without an exception (a wrong value, an extra call)."""
    try:
        observed = fn()
    except Exception as e:  # noqa: BLE001 - the point is to observe it
        observed = _observed(e)
    if observed is None:
        print(f"ok {name}")
        return
    (_failures if expect in observed else _changed).append((name, observed))


def control(name: str, fn) -> None:
    """A case that must work on any torch: if it fails, the repro itself is broken."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        print(f"REPRO BROKEN: control case {name!r} failed")
        sys.exit(2)
    print(f"ok (control) {name}")


def report() -> None:
    for name, observed in _changed:
        print(f"CHANGED {name}: {observed}")
    for name, observed in _failures:
        print(f"PERSISTS {name}: {observed}")
    if _changed:
        sys.exit(3)
    if _failures:
        sys.exit(1)
    print("FIXED")
    sys.exit(0)
