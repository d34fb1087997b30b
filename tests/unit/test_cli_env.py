"""Every ``zlink run`` option can come from a ``ZLINK_<OPTION>`` environment variable, and
``zlink run --nodes K`` gives its node processes what they need and not what would break them:
they do not inherit ``ZLINK_NODES`` (each would start K more) nor a fixed ``ZLINK_ADMIN`` port
(they would clash on it), and they log as the parent was told to (issue 15 review)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tests.unit.test_cli import ROOT, _lines, _until
from tests.unit.test_cli_mesh import _mesh, _stop
from zlink import cli as zcli
from zlink.cli import cli

RUN = typer.main.get_command(cli).commands["run"]  # type: ignore[attr-defined]
INTERNAL = {"stop_with_stdin", "summary_file", "ready_file"}  # hidden: set by a --nodes parent


def _parse(args: list[str]) -> dict[str, object]:
    """The values ``zlink run`` would get, parsed as click does (environment included)."""
    with RUN.make_context("run", args) as ctx:
        return dict(ctx.params)


def test_every_run_option_has_a_zlink_environment_variable() -> None:
    options = [p for p in RUN.params if p.param_type_name == "option" and p.name not in INTERNAL]
    assert options
    missing = {p.name: p.envvar for p in options if p.envvar != f"ZLINK_{p.name.upper()}"}
    assert missing == {}, f"options without their ZLINK_<OPTION>: {missing}"


def test_the_options_that_lacked_one_read_their_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = _parse(["tests.procs.app:app"])
    assert defaults["factory"] is False and defaults["insecure"] is False
    assert defaults["admin_allow_remote"] is False and defaults["drain"] is True
    assert defaults["nodes"] is None
    for name, value in {"ZLINK_FACTORY": "1", "ZLINK_ADMIN_ALLOW_REMOTE": "true",
                        "ZLINK_INSECURE": "yes", "ZLINK_NODES": "3",
                        "ZLINK_DRAIN": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    got = _parse(["tests.procs.app:app"])
    assert got["factory"] is True and got["insecure"] is True
    assert got["admin_allow_remote"] is True and got["drain"] is False
    assert got["nodes"] == 3
    assert _parse(["tests.procs.app:app", "--nodes", "2", "--drain"])["nodes"] == 2  # flags win


def test_node_processes_do_not_inherit_zlink_nodes_nor_a_fixed_admin_port() -> None:
    env = {"PATH": "/bin", "ZLINK_NODES": "3", "ZLINK_ADMIN": "127.0.0.1:9100",
           "ZLINK_LOG_LEVEL": "debug"}  # fmt: skip
    child = zcli._child_env(env)
    assert child == {"PATH": "/bin", "ZLINK_LOG_LEVEL": "debug"}
    assert env["ZLINK_NODES"] == "3"  # the parent's own environment is left as it was


def test_node_processes_get_the_log_format_and_level_and_an_admin_on_port_0() -> None:
    def args(**over: object) -> list[str]:
        given: dict[str, object] = dict(
            target="m:app", factory=False, node_id="n-2", address="tcp://127.0.0.1:0",
            store="sqlite:///x.db", mesh="main", insecure=False, keys=None, workers=None,
            lease=None, log_level="warning", log_format="json", admin=None,
            admin_allow_remote=False,
        )  # fmt: skip
        given.update(over)
        return zcli._child_args(**given)  # type: ignore[arg-type]

    plain = args()
    assert plain[plain.index("--log-format") + 1] == "json"
    assert plain[plain.index("--log-level") + 1] == "warning"
    assert "--admin" not in plain
    served = args(admin="127.0.0.1:0", admin_allow_remote=True)
    assert served[served.index("--admin") + 1] == "127.0.0.1:0"
    assert "--admin-allow-remote" in served
    assert "--admin" not in args(admin="127.0.0.1:9100")  # K nodes cannot share one port
    # a flag is passed both ways: the parent's --no-factory beats a ZLINK_FACTORY=1 that the
    # child inherits
    assert "--no-factory" in plain and "--no-insecure" in plain
    assert "--factory" in args(factory=True) and "--insecure" in args(insecure=True)
    assert "--shutdown-timeout" not in plain  # (each child's own default, as the parent's)
    timed = args(shutdown_timeout=2.5)
    assert timed[timed.index("--shutdown-timeout") + 1] == "2.5"


@pytest.mark.timeout(90)
def test_zlink_nodes_from_the_environment_starts_k_nodes_only(tmp_path: Path) -> None:
    """A real ``ZLINK_NODES=2 zlink run`` with a fixed ``ZLINK_ADMIN`` port (held by this test,
    so a node that tried it would fail) and ``--log-format json``: exactly two nodes serve, they
    log JSON, and SIGTERM stops them all."""
    import os

    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "ZLINK_NODES": "2", "ZLINK_ADMIN": f"127.0.0.1:{port}"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--node-id", "e",
             "--store", store, "--workers", "1", "--log-format", "json"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        lines, reader = _lines(proc)
        try:
            seen = _until(lines, "listening on", 45)
            seen += _until(lines, "listening on", 45)
            assert sorted(str(r["node_id"]) for r in _mesh(store)) == ["e-1", "e-2"]
            proc.send_signal(signal.SIGTERM)
            seen += _until(lines, "all nodes stopped", 45)
            assert proc.wait(timeout=30) == 0
        finally:
            _stop(proc, reader)
    records = [json.loads(line) for line in seen if line.startswith("{")]
    started = sorted(r["message"].split()[1] for r in records
                     if " started with " in r["message"])  # fmt: skip
    assert started == ["e-1", "e-2"], seen
    assert not any("admin on" in line or "in use" in line for line in seen), seen
    assert any(f"127.0.0.1:{port}" in line and "not served" in line for line in seen), seen
