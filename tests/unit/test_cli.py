"""The command line: typer's CliRunner in process, and a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

import zlink
from zlink import _native
from zlink.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAIT_LINES = 10.0  # real seconds to wait for a line of a subprocess's output
runner = CliRunner()


def test_version_names_the_interpreter():
    result = runner.invoke(cli, ["version"])
    assert result.exit_code == 0
    assert "zlink 0.1.0 on Python" in result.output
    assert ("modules compiled" in result.output) == bool(_native.compiled_modules())


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
    from zlink.samples.bingo.spots import MAX_PLAYERS

    too_many = runner.invoke(cli, ["bingo", "play", "--players", str(MAX_PLAYERS + 1)])
    assert too_many.exit_code == 2 and "Traceback" not in too_many.output  # (was a traceback)
    assert "100" in too_many.output  # the CLI's bound is the room's
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


def as_a_service() -> None:
    """(``preexec_fn``) Start a node process with SIGHUP and SIGINT at their defaults, as a
    terminal or a service manager starts one: a test run under ``nohup``, or as a shell's
    background job, hands its processes those signals ignored, and ``zlink run`` keeps an
    inherited SIG_IGN (CI under ``nohup`` saw a SIGHUP test's node ignore its SIGHUP)."""
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def past_the_repeat_window() -> None:
    """Let ``zlink run``'s repeat window pass, so the next stop signal of the same kind is an
    operator's second one, not the first again (``cli._REPEAT_WINDOW``: GNU ``timeout``
    signals the process and its group at once). A protocol's time, not a wait for an event."""
    from zlink import cli as cli_module

    threading.Event().wait(cli_module._REPEAT_WINDOW + 0.05)


def _lines(proc: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """The process's output, line by line, read on a thread of its own ("" at the end)."""
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)
        out.put("")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return out, reader


def _end(proc: subprocess.Popen[str], reader: threading.Thread) -> None:
    """Stop ``proc`` if it still runs (also when the test failed), and its output reader."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    reader.join(WAIT_LINES)  # it ends at the end of the output
    assert proc.stdout is not None
    proc.stdout.close()


def _until(lines: queue.Queue[str], text: str, timeout: float) -> list[str]:
    """The lines up to the first that holds ``text``; fails after ``timeout`` or at the end."""
    end = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {text!r} within {timeout} s: {seen}") from None
        if not line:
            raise AssertionError(f"the output ended before {text!r}: {seen}")
        seen.append(line)
        if text in line:
            return seen


@pytest.mark.timeout(60)
def test_a_stop_signal_during_a_slow_start_stops_the_node_within_its_shutdown_time():
    """Found by an audit of the service side: an Entry Spot whose ``on_initialize`` waits on a
    dependency held the start for ``request_timeout`` (30 s), and a SIGTERM meanwhile was acted
    on only after that, and the stop after it: ~36 s from the signal to the exit, past a
    Kubernetes grace period, with nothing said. The start gives up at once and the node stops
    within its shutdown time (``--shutdown-timeout 2`` here, for the turn that never ends;
    10 s by default)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.unit.hung_start_app:app", "--workers", "1",
         "--shutdown-timeout", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "initializing", 30)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # (SIGINT and SIGHUP take the same way)
        seen = _until(lines, "stopping while the node starts", 5)  # at once, not in 30 s
        seen += _until(lines, "stopped before the node finished starting", 15)
        assert proc.wait(timeout=5) == 0, seen
        assert time.monotonic() - began < 5  # its 2 s, not the default 10 s
    finally:
        _end(proc, reader)


@pytest.mark.timeout(60)
def test_run_stops_gracefully_on_sigint_and_at_once_on_a_second_one():
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.unit.slow_stop_app:app", "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "holding a worker call", 30)  # its worker call outlives any stop
        proc.send_signal(signal.SIGINT)
        _until(lines, "stopping:", 5)  # the graceful stop began: it waits for the call
        assert proc.poll() is None
        past_the_repeat_window()
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        # at once, not after the stop (which would take 9 s: shutdown_timeout's nine tenths)
        assert proc.wait(timeout=3) == 128 + signal.SIGINT
        assert time.monotonic() - began < 3
        rest = []
        while (line := lines.get(timeout=WAIT_LINES)) != "":
            rest.append(line)
        assert not any(line.startswith("stopped") for line in rest), rest
    finally:
        _end(proc, reader)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_signal", ["SIGTERM", "SIGHUP"])
def test_a_stop_without_a_drain_counts_the_spots_that_stayed(stop_signal: str):
    """Issue 15 review: the stop's summary line accounts for every Spot. Without a drain none
    moves, so each one the node holds (here the counter's Entry Spot) stayed, and says so.
    SIGHUP stops it the same way (a service probe: it killed the node with no goodbye)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "examples.counter:app", "--no-drain",
         "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "SIGINT or SIGTERM stops it", 30)
        proc.send_signal(getattr(signal, stop_signal))
        seen = _until(lines, "stopped:", 30)
        assert proc.wait(timeout=30) == 0
        assert not any(line.startswith("drained:") for line in seen), seen
        assert seen[-1].strip() == "stopped: 0 Spots moved, 1 stayed; 0 messages discarded"
    finally:
        _end(proc, reader)


def test_bingo_says_when_it_is_overloaded_and_fails_on_handler_errors(monkeypatch):
    """Issue "Running ZLink as a service": a p50 far past the draw interval is called
    overloaded, and handler errors make the command fail, instead of a summary in silence."""
    from zlink.samples.bingo import play as play_module

    def slow_play(rooms, players, **_options):  # type: ignore[no-untyped-def]
        return play_module.Summary(
            rooms=rooms, players=players, games=rooms, winners={}, marks=0, messages=0,
            p50_ms=3000.0, p99_ms=9000.0, seconds=1.0, workers=2,
            counters={"handler_errors": 7},
        )  # fmt: skip

    monkeypatch.setattr(play_module, "play", slow_play)
    result = runner.invoke(cli, ["bingo", "play", "--rooms", "2", "--players", "3"])
    assert result.exit_code == 1
    assert "overloaded: a mark takes 3,000 ms (p50) after its draw" in result.output
    assert "7 handler errors" in result.output


@pytest.mark.timeout(60)
def test_health_and_metrics_answer_while_the_node_stops():
    """A service probe: ``zlink run`` stopped its admin server before the node's shutdown,
    so ``/health`` refused connections instead of saying 503 "stopping" (cli.md), and the
    node's counters of what the stop dropped were nowhere. The admin endpoint now stops
    last."""
    import urllib.error
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.unit.slow_stop_app:app", "--workers", "1",
         "--admin", "127.0.0.1:0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        seen = _until(lines, "SIGINT or SIGTERM stops it", 30)
        base = next(line for line in seen if line.startswith("admin on ")).split()[2]
        if not any("holding a worker call" in line for line in seen):
            _until(lines, "holding a worker call", 30)  # its worker call holds the stop up
        proc.send_signal(signal.SIGINT)
        _until(lines, "stopping:", 5)
        why = ""
        end = time.monotonic() + 10
        while why != "stopping":  # (draining first, for as long as the drain takes)
            assert time.monotonic() < end, f"/health said {why!r} throughout"
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}/health", timeout=10)
            assert refused.value.code == 503
            why = json.loads(refused.value.read().decode())["why"]
            assert why == "stopping" or why.startswith("draining"), why
            time.sleep(0.02)  # polling another process: nothing to wait on
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as metrics:
            assert metrics.status == 200
        past_the_repeat_window()
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)  # (the held worker call: not waited for)
        proc.wait(timeout=10)
        assert time.monotonic() - began < 5  # at once, not after the stop's 9 s
    finally:
        _end(proc, reader)


def test_the_stop_summary_counts_sends_dropped_and_unacknowledged_too():
    """A service probe: a node that gave up on 290 sends for a frozen peer printed "0
    messages discarded", the counters that said so (``sends_dropped_*``) gone with the
    process. The summary names every kind of loss a stop can leave, by reason."""
    from zlink.cli import _stop_summary
    from zlink.status import losses as stop_losses

    counters = {
        "messages_discarded_at_shutdown": 1018, "sends_dropped_unavailable": 1000,
        "sends_dropped_not_found": 274, "data_unacknowledged_at_stop": 200,
        "handler_errors": 3, "messages_discarded_spot_closed": 0,
    }  # fmt: skip
    losses = stop_losses(counters)
    assert losses == {
        "discarded": {"at_shutdown": 1018},
        "dropped": {"unavailable": 1000, "not_found": 274},
        "unacknowledged": {"at_stop": 200},
    }
    assert _stop_summary(0, 1, losses) == (
        "0 Spots moved, 1 stayed; 1018 messages discarded (at_shutdown 1018);"
        " 1274 sends dropped (not_found 274, unavailable 1000);"
        " 200 sent and never acknowledged (may have arrived)"
    )
    assert _stop_summary(0, 1, stop_losses({})) == "0 Spots moved, 1 stayed; 0 messages discarded"


def test_the_stop_summary_says_what_handlers_the_stop_cut_off():
    """An operator's probe: turns (and worker calls) still running at the stop's deadline were
    counted (``turns_abandoned_at_shutdown``; their callers failed), but the summary said "0
    messages discarded" only. They are said, and go into a --nodes child's summary file."""
    from zlink.cli import _stop_losses, _stop_summary

    counters = {"turns_abandoned_at_shutdown": 2, "worker_calls_abandoned_at_shutdown": 1}
    lost = _stop_losses(counters)
    assert lost == {"abandoned": {"turns": 2, "worker calls": 1}}
    assert _stop_summary(0, 1, lost) == (
        "0 Spots moved, 1 stayed; 0 messages discarded;"
        " 2 turns, 1 worker calls abandoned at the stop's deadline"
    )
    assert _stop_losses({"turns_abandoned_at_shutdown": 0}) == {}


def test_a_node_alone_refuses_what_configures_a_mesh_of_processes():
    """An operator's probe: ``--keys``, ``--lease`` and ``--mesh`` without ``--listen`` were
    taken and did nothing (``--advertise`` was refused); so they are too, at the start."""
    for args, name in (
        (["--lease", "2"], "lease_seconds= (--lease)"),
        (["--mesh", "blue"], "mesh= (--mesh)"),
        (["--keys", "/nonexistent-keys"], "keys= (--keys)"),
    ):
        result = CliRunner().invoke(cli, ["run", "tests.procs.app:app", *args])
        assert result.exit_code == 1, (args, result.output)
        assert f"{name} configures a node of a mesh" in result.output, result.output
        assert "it needs listen=" in result.output, result.output
    result = CliRunner().invoke(cli, ["run", "tests.procs.app:app", "--lease", "2", "--mesh", "b"])
    assert "lease_seconds= (--lease) and mesh= (--mesh) configure a" in result.output
    with pytest.raises(zlink.InvalidArgument, match="lease_seconds"):
        zlink.Node(zlink.App("alone"), zlink.NodeConfig(lease_seconds=2.0))


def test_a_drains_summary_says_why_spots_stayed_commonest_first():
    """Found by an audit: ``drained: 0 Spots moved, 21 stayed`` never said why (there: Spots
    registered without a relocation policy). The commonest reasons come first, at most three."""
    from zlink.cli import _why_stayed

    assert _why_stayed({}) == ""
    stayed = {f"r{i}": "'t.room' is registered with Relocation.disabled()" for i in range(3)}
    stayed |= {"lobby": "it closed: gone", "a": "x", "b": "y"}
    assert _why_stayed(stayed) == (
        " (3: 't.room' is registered with Relocation.disabled(); 1: it closed: gone; 1: x; ...)"
    )


def test_a_sigterm_and_a_hangup_together_stop_gracefully():
    """A review: systemd's ``SendSIGHUP=yes`` sends SIGHUP right after SIGTERM; pending
    together, Python handles them in signal-number order (SIGHUP first), and the SIGTERM was
    then taken for an operator's second signal: exit at once, the stop unfinished."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "examples.counter:app", "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "SIGINT or SIGTERM stops it", 30)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGHUP)
        seen = _until(lines, "stopped:", 30)
        assert proc.wait(timeout=30) == 0, seen
        assert not any("again: exiting now" in line for line in seen), seen
    finally:
        _end(proc, reader)


def test_a_hangup_during_a_stop_does_not_cut_it_short():
    """A review: systemd's ``SendSIGHUP=yes`` sends SIGHUP right after SIGTERM (a terminal
    that closes sends one too), and ``zlink run`` took it for a second stop signal: it exited
    at once, the stop unfinished (no goodbye, what was queued uncounted). A SIGHUP during the
    stop changes nothing now; a second SIGTERM still exits at once. Signals arrive in the
    order sent: had the SIGHUP been acted on, the status would be 129, not 143."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.unit.slow_stop_app:app", "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "holding a worker call", 30)  # its worker call holds the stop up
        proc.send_signal(signal.SIGTERM)
        _until(lines, "stopping:", 5)
        proc.send_signal(signal.SIGHUP)  # (systemd's SendSIGHUP, right after)
        past_the_repeat_window()
        proc.send_signal(signal.SIGTERM)  # an operator's second: at once
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        _end(proc, reader)


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU coreutils' timeout")
def test_the_first_stop_signal_again_at_once_is_the_same_request(tmp_path: pathlib.Path):
    """A docs probe: GNU ``timeout`` (without ``--foreground``) sends SIGTERM to the process
    and then to its process group, so ``zlink run`` got two at once and took the second for
    an operator's: "exiting now, the stop unfinished", no drain, exit 143 (4 runs in 6 there,
    about 1 in 4 here: the two often come as one). The same signal again within
    ``_REPEAT_WINDOW`` is the first one's request: the stop goes on gracefully, exit 0. (The
    rule itself, deterministically: the next test.)"""
    proc = subprocess.Popen(
        ["timeout", "60", sys.executable, "-m", "zlink", "run", "examples.counter:app",
         "--workers", "1", "--listen", "tcp://127.0.0.1:0",
         "--store", f"sqlite:///{tmp_path / 'mesh.db'}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=as_a_service, start_new_session=True,  # (a group of their own)
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "SIGINT or SIGTERM stops it", 30)
        proc.send_signal(signal.SIGTERM)  # to ``timeout``: it signals the node, then the group
        seen = _until(lines, "stopped:", 30)
        assert proc.wait(timeout=30) == 0
        assert not any("again: exiting now" in line for line in seen), seen
    finally:
        with contextlib.suppress(ProcessLookupError):  # the node too, not only ``timeout``
            os.killpg(proc.pid, signal.SIGKILL)  # (its group: the session started here)
        _end(proc, reader)


def test_a_repeat_of_the_first_stop_signal_counts_only_after_the_window(monkeypatch):
    """The rule behind the test above, on a manual clock: the first signal again within
    ``_REPEAT_WINDOW`` changes nothing; after it, or another insisting signal at any time, is
    an operator's second (exit at once, 128 + its number)."""
    from zlink import cli as cli_module

    now = [100.0]
    exits: list[int] = []
    monkeypatch.setattr(cli_module.time, "monotonic", lambda: now[0])

    def exit_now(code: int) -> None:
        exits.append(code)

    monkeypatch.setattr(cli_module.os, "_exit", exit_now)
    monkeypatch.setattr(cli_module.os, "write", lambda _fd, data: len(data))
    stop = cli_module._Stop()
    cli_module._on_stop_signal(stop, signal.SIGTERM, None)
    assert stop.is_set() and exits == []
    now[0] += cli_module._REPEAT_WINDOW / 2
    cli_module._on_stop_signal(stop, signal.SIGTERM, None)  # the same request again
    assert exits == []
    cli_module._on_stop_signal(stop, signal.SIGINT, None)  # another one: insisting
    assert exits == [128 + signal.SIGINT]
    now[0] += cli_module._REPEAT_WINDOW
    cli_module._on_stop_signal(stop, signal.SIGTERM, None)  # the first, but later: insisting
    assert exits == [128 + signal.SIGINT, 128 + signal.SIGTERM]
