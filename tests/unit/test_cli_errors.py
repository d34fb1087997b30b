"""A user's mistakes on the command line end with one ``Error:`` line and a non-zero exit,
never a traceback (issue "Running ZLink as a service"); ``--version``; options from
``ZLINK_*`` environment variables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.unit.test_cli import ROOT
from zlink.cli import cli

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "no_colon_here"], "Error: expected MODULE:ATTR, got 'no_colon_here'"),
        (["run", "nosuch_module_zz:app"], "Error: cannot import 'nosuch_module_zz'"),
        (["run", "tests.procs.app:nothing"], "has no attribute 'nothing'"),
        (["run", "tests.procs.app:app", "--factory"], "is a zlink.App, not a factory"),
        (["run", "tests.procs.app:make_app"], "it is a factory; add --factory"),
        (["run", "tests.procs.app:make_app_unannotated"], "it is a factory; add --factory"),
        (["run", "tests.procs.app:Bump"], "is a class (Bump), not a zlink.App or a main()"),
        (["run", "examples.counter:main", "--admin", "127.0.0.1:0"], "needs a zlink.App"),
        # a service probe: node options for a main() were ignored in silence (--keys too)
        (["run", "examples.counter:main", "--keys", "/nonexistent"], "--keys configures a"),
        (["run", "examples.counter:main", "--listen", "tcp://127.0.0.1:0"], "--listen config"),
        (["run", "examples.counter:main", "--store", "sqlite:///x.db"], "--store configures"),
        (["run", "examples.counter:main", "--nodes", "2"], "--nodes configures"),
        # a service probe: a lease of 0.01 s was taken, and the node fenced itself for good
        (
            ["run", "tests.procs.app:app", "--listen", "tcp://127.0.0.1:0", "--lease", "0.01"],
            "lease_seconds",
        ),
        # a drain's time is checked when the node starts, not when it stops
        (["run", "tests.procs.app:app", "--drain-timeout", "nan"], "--drain-timeout"),
        (["run", "tests.procs.app:app", "--drain-timeout", "0"], "--drain-timeout"),
        (["run", "tests.procs.app:app", "--drain-timeout", "5", "--no-drain"], "--no-drain"),
        (["run", "tests.procs.app:app", "--drain-timeout", "5", "--nodes", "2"], "--nodes"),
        (["run", "examples.counter:main", "--drain-timeout", "5"], "--drain-timeout config"),
        (["run", "tests.procs.app:app", "--shutdown-timeout", "inf"], "--shutdown-timeout"),
        (["run", "tests.procs.app:app", "--shutdown-timeout", "0"], "--shutdown-timeout"),
        (["run", "examples.counter:main", "--shutdown-timeout", "5"], "--shutdown-timeout conf"),
        # a service probe: a network address advertised without keys, from a loopback listen
        (
            [
                "run",
                "tests.procs.app:app",
                "--listen",
                "tcp://127.0.0.1:0",
                "--advertise",
                "10.1.2.3",
            ],
            "Error: invalid setting: advertise '10.1.2.3'",  # (no pydantic "Value error,")
        ),
        (["run", "tests.procs.app:app", "--workers", "0"], "Error: invalid setting: workers:"),
        (["run", "tests.procs.app:app", "--store", "sqlite:///x.db"], "Error: a Location Store"),
    ],
)
def test_a_mistake_is_one_error_line_and_exit_1(args: list[str], says: str) -> None:
    result = runner.invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert says in result.output
    assert "Traceback" not in result.output and "pydantic" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_factory_annotated_as_one_is_refused_before_it_is_called() -> None:
    """A service probe: a factory run without ``--factory`` ran (as a ``main()``, whatever it
    does on the way) before it was refused. Its return annotation says what it is."""
    from tests.procs import app

    app.FACTORY_CALLS.clear()
    result = runner.invoke(cli, ["run", "tests.procs.app:make_app"])
    assert result.exit_code == 1 and "add --factory" in result.output
    assert app.FACTORY_CALLS == []


def test_a_log_level_that_is_not_one_is_a_usage_error() -> None:
    result = runner.invoke(cli, ["run", "tests.procs.app:app", "--log-level", "LOUD"])
    assert result.exit_code == 2
    assert "'LOUD' is not one of" in result.output and "Traceback" not in result.output


def test_options_come_from_zlink_environment_variables() -> None:
    result = runner.invoke(cli, ["run", "tests.procs.app:app"], env={"ZLINK_WORKERS": "0"})
    assert result.exit_code == 1 and "invalid setting: workers" in result.output


def test_version_flag() -> None:
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == "zlink 0.1.0"


def test_a_port_in_use_is_one_error_line_and_its_traceback_only_at_debug() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--listen",
                f"tcp://127.0.0.1:{port}"]  # fmt: skip
        plain = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
        debug = subprocess.run([*args, "--log-level", "debug"], cwd=ROOT, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines()[-1].startswith("Error: the address is in use")
    assert "Traceback" not in plain.stderr
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_log_format_json_writes_one_json_object_per_line() -> None:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "zlink", "run", "examples.counter:main", "--log-format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["message"].startswith("node demo started") for r in records)


def test_log_format_json_writes_python_warnings_as_json_too(tmp_path) -> None:
    """Found by an audit: with ``--log-format json`` a Python warning (README: a call never
    given a terminal warns) went to stderr as two lines of plain text among the JSON ones,
    which breaks a collector that reads one JSON object per line."""
    import json

    (tmp_path / "warn_app.py").write_text(
        "import warnings\n"
        "def main() -> None:  # (as a call never given a terminal warns: at its collection)\n"
        "    warnings.warn('a call was never given a terminal', RuntimeWarning)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "zlink", "run", "warn_app:main", "--log-format", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not JSON: {line!r}\n{done.stderr}") from None
    assert any("never given a terminal" in r["message"] for r in records), done.stderr
