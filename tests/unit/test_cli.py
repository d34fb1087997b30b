"""The command line: typer's CliRunner in process, and a real subprocess."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from typer.testing import CliRunner

from zlink.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_version_names_the_interpreter():
    result = runner.invoke(cli, ["version"])
    assert result.exit_code == 0
    assert "zlink 0.1.0 on Python" in result.output


def test_bingo_play_prints_a_summary():
    result = runner.invoke(cli, ["bingo", "play", "--rooms", "2", "--players", "3"])
    assert result.exit_code == 0, result.output
    assert "games finished" in result.output and "p50" in result.output


def test_bingo_play_on_several_nodes_moves_rooms_while_they_play():
    result = runner.invoke(cli, ["bingo", "play", "--rooms", "2", "--players", "3", "--nodes", "2"])
    assert result.exit_code == 0, result.output
    assert "nodes / room moves" in result.output and "games finished" in result.output


def test_bad_options_are_refused_with_a_clear_message():
    assert runner.invoke(cli, ["bingo", "play", "--rooms", "0"]).exit_code == 2
    result = runner.invoke(cli, ["bingo", "play", "--nodes", "0"])
    assert result.exit_code == 2 and "nodes" in result.output
    result = runner.invoke(cli, ["run", "no_colon_here"])
    assert result.exit_code != 0


def test_run_calls_a_callable_target():
    result = runner.invoke(cli, ["run", "examples.counter:main"])
    assert result.exit_code == 0, result.output
    assert "node shut down cleanly" in result.output


def test_the_real_command_plays_bingo_in_a_subprocess():
    done = subprocess.run(
        [sys.executable, "-m", "zlink", "bingo", "play", "--rooms", "2", "--players", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "games finished" in done.stdout
