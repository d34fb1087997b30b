"""README's "A taste" is a file that runs (issue "Running ZLink as a service": docs that stand
alone): the block in README.md is ``examples/taste.py``, and running it prints 2."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_taste_in_readme_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## A taste\n\n```python\n") + len("## A taste\n\n```python\n")
    block = readme[start : readme.index("```\n", start)]
    assert block == (ROOT / "examples" / "taste.py").read_text()


def test_the_taste_runs_and_prints_two() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.taste"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
