"""README's ``zlink.connect`` block runs as written against a node serving the Bingo sample
(only the endpoint is the test's own: a free port on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import io
import pathlib

import zlink
from zlink.samples.bingo.spots import app

ROOT = pathlib.Path(__file__).resolve().parents[2]
_FENCE = "## Clients from other processes (`zlink.connect`)"


def _block() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\n", readme.index(_FENCE)) + len("```python\n")
    return readme[start : readme.index("```\n", start)]


def test_the_client_block_in_readme_runs_against_a_bingo_node() -> None:
    block = _block()
    assert 'zlink.connect("tcp://127.0.0.1:7101"' in block
    config = zlink.NodeConfig(node_id="readme", listen="tcp://127.0.0.1:0", workers=2)
    with zlink.Node(app, config) as node:
        assert node.address is not None
        code = block.replace("tcp://127.0.0.1:7101", node.address)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert out.getvalue().split() == ["room-1", "0", "False"]
