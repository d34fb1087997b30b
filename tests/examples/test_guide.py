"""The user guide is made of tested files (issue "Running ZLink as a service": "each code block
is a tested file").

Two markers, each an HTML comment on the line right before a fenced block in
``docs/guide/*.md`` (blank lines between are allowed):

* ``<!-- source: PATH -->`` or ``<!-- source: PATH#NAME -->`` before every ```` ```python ````
  block. The block is exactly the file at PATH (from the repository root), or exactly its
  region NAME: the lines between ``# [start:NAME]`` and ``# [end:NAME]`` (any indentation),
  without the marker lines of other regions, dedented, without blank lines at either end.
  A ``python`` block with no source marker fails.
* ``<!-- output: MODULE -->`` before a ```` ```console ```` block whose first line is
  ``$ python3 -m MODULE``: the rest of the block is exactly what that program prints on
  stdout. Every module under ``examples/guide/`` has one such block, and each is run here
  (``sys.executable -m MODULE`` from the repository root), so every example runs and prints
  what the guide says it prints.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"
EXAMPLES = ROOT / "examples" / "guide"

_SOURCE = re.compile(r"<!-- source: (?P<path>[^\s#]+)(?:#(?P<region>[\w-]+))? -->")
_OUTPUT = re.compile(r"<!-- output: (?P<module>[\w.]+) -->")
_MARKER = re.compile(r"^\s*# \[(?P<kind>start|end):(?P<name>[\w-]+)\]\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block of a guide page: its language, text, and the comment line before it."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str  # the HTML comment right before the fence, or ""

    @property
    def where(self) -> str:
        return f"docs/guide/{self.page}:{self.line}"


def _blocks(page: pathlib.Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"docs/guide/{page.name}:{i + 1}: a fence that never closes"
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = lines[before].strip() if before >= 0 else ""
        marker = marker if marker.startswith("<!--") else ""
        text = "".join(line + "\n" for line in lines[start + 1 : end])
        found.append(Block(page.name, start + 1, fence.group(1), text, marker))
        i = end + 1
    return found


def _pages() -> list[pathlib.Path]:
    return sorted(GUIDE.glob("*.md"))


def _all_blocks() -> list[Block]:
    return [block for page in _pages() for block in _blocks(page)]


def region(path: pathlib.Path, name: str) -> str:
    """The region ``name`` of ``path`` (see the module docstring)."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if _is_marker(line, "start", name)]
    ends = [i for i, line in enumerate(lines) if _is_marker(line, "end", name)]
    assert len(starts) == 1 and len(ends) == 1, f"{path}: region {name!r} needs one start, one end"
    assert starts[0] < ends[0], f"{path}: region {name!r} ends before it starts"
    body = [line for line in lines[starts[0] + 1 : ends[0]] if not _MARKER.match(line)]
    text = textwrap.dedent("".join(line + "\n" for line in body))
    return text.strip("\n") + "\n"


def _is_marker(line: str, kind: str, name: str) -> bool:
    m = _MARKER.match(line)
    return m is not None and m.group("kind") == kind and m.group("name") == name


def _modules() -> list[str]:
    return sorted(f"examples.guide.{p.stem}" for p in EXAMPLES.glob("*.py") if p.stem != "__init__")


def test_the_guide_has_its_pages_and_python_blocks() -> None:
    names = {p.name for p in _pages()}
    assert {"README.md", "concepts.md", "tutorial.md", "cli.md", "mesh.md", "errors.md"} <= names
    assert sum(b.lang == "python" for b in _all_blocks()) >= 10


@pytest.mark.parametrize(
    "block", [b for b in _all_blocks() if b.lang == "python"], ids=lambda b: b.where
)
def test_every_python_block_is_a_file_or_a_region_of_one(block: Block) -> None:
    source = _SOURCE.fullmatch(block.marker)
    assert source is not None, f"{block.where}: a python block needs <!-- source: PATH#NAME -->"
    path = ROOT / source.group("path")
    assert path.is_file(), f"{block.where}: no file {source.group('path')}"
    name = source.group("region")
    expected = path.read_text() if name is None else region(path, name)
    assert block.text == expected, f"{block.where} differs from {source.group(0)}"


def test_every_region_in_the_examples_is_balanced() -> None:
    for path in sorted(EXAMPLES.glob("*.py")):
        opened: list[str] = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = _MARKER.match(line)
            if m is None:
                continue
            if m.group("kind") == "start":
                assert m.group("name") not in opened, f"{path.name}:{number}: opened twice"
                opened.append(m.group("name"))
            else:
                assert m.group("name") in opened, f"{path.name}:{number}: ends an unopened region"
                opened.remove(m.group("name"))
        assert not opened, f"{path.name}: regions never ended: {opened}"


def _output_blocks() -> dict[str, list[Block]]:
    out: dict[str, list[Block]] = {}
    for block in _all_blocks():
        m = _OUTPUT.fullmatch(block.marker)
        if m is not None:
            out.setdefault(m.group("module"), []).append(block)
    return out


def test_every_output_block_names_an_example_of_the_guide() -> None:
    unknown = set(_output_blocks()) - set(_modules())
    assert not unknown, f"output blocks for modules that are not examples/guide/*.py: {unknown}"


@pytest.mark.parametrize("module", _modules())
def test_every_example_runs_and_prints_what_the_guide_shows(module: str) -> None:
    shown = _output_blocks().get(module)
    assert shown, f"no <!-- output: {module} --> block in docs/guide/ shows what {module} prints"
    done = subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    for block in shown:
        assert block.lang == "console", f"{block.where}: an output block is ```console"
        command, _, printed = block.text.partition("\n")
        assert command == f"$ python3 -m {module}", f"{block.where}: starts with {command!r}"
        assert done.stdout == printed, f"{block.where} is not what {module} prints"
