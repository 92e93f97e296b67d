"""Every ``python`` code block of README.md and docs/semantics.md runs as written.

Each block runs on its own, in a fresh namespace: a block is what a reader copies, so it imports
what it needs and builds on no other block. Blocks fenced with another language are not run:
``bash`` for shell commands, ``text`` for illustrative code or output that is not meant to run.
A fence with no language is an error (``test_every_fence_names_its_language``), so that a Python
block cannot opt out of being run by accident.

Test ids name the file, the block's index in it and the section heading above it
(``README-2-attention``); a failing block's traceback points at the Markdown file's own lines.
The files are found from this file's location, not the working directory. A block that starts
a process group runs in a fresh interpreter with a time limit: process-group teardown belongs to
the process (gloo joins its threads), and a hang must fail the test, not stall the suite.
"""

import dataclasses
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "semantics.md"]

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([^`\s]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: pathlib.Path
    index: int  # among the file's python blocks
    line: int  # 1-based line of the block's first source line
    heading: str
    lang: str
    source: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:40]
        return f"{self.path.stem}-{self.index}-{slug}"


def fenced_blocks(path: pathlib.Path) -> list[Block]:
    """Every fenced code block of a Markdown file, with the heading it sits under."""
    blocks, heading, n_python = [], "top", 0
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            if lines[i].startswith("#"):
                heading = lines[i].lstrip("#").strip()
            i += 1
            continue
        indent, ticks, lang = m.groups()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: unclosed code fence")
        index = n_python if lang == "python" else -1
        n_python += lang == "python"
        blocks.append(Block(path, index, i + 2, heading, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for p in DOCS for b in fenced_blocks(p)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]


@pytest.fixture
def _no_process_group():
    """A block that starts a process group and fails before ending it must not leak it."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_runs(block, _no_process_group):
    # Pad with newlines so that line numbers in a traceback are the Markdown file's.
    source = "\n" * (block.line - 1) + block.source
    if "init_process_group" in block.source:
        run = subprocess.run([sys.executable, "-c", source + "\nprint('block finished')\n"], capture_output=True,
                             text=True, timeout=300)
        # gloo's threads can abort the interpreter at exit, after the block has run to its end
        # ("terminate called without an active exception", SIGABRT, under load): torch's teardown
        teardown = (run.returncode == -6 and "block finished" in run.stdout
                    and run.stderr.strip() == "terminate called without an active exception")
        assert run.returncode == 0 or teardown, run.stderr[-3000:]
        return
    code = compile(source, str(block.path), "exec")
    exec(code, {"__name__": f"__{block.path.stem}_block_{block.index}__"})


def test_every_fence_names_its_language():
    unnamed = [f"{b.path.name}:{b.line - 1}" for b in ALL_BLOCKS if not b.lang]
    assert not unnamed, f"code fences without a language (use python, bash or text): {unnamed}"


def test_blocks_are_found():
    # Guards the extractor: a parsing slip must not leave the parametrized test with nothing to run.
    counts = {p.name: sum(b.path == p for b in PYTHON_BLOCKS) for p in DOCS}
    assert counts["README.md"] >= 8, counts
    assert counts["semantics.md"] >= 1, counts
