"""Faults an operator's probe found running ZLink as a service (``zlink run``, ``zlink mesh``,
``/metrics``): each test fails on the code as it was found and passes once the fault is fixed.
Real subprocesses on 127.0.0.1, every wait bounded, every process stopped."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import zlink
from tests.procs import harness
from tests.procs.app import app as mp_app
from tests.unit.test_cli import as_a_service

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> int | None:
    """The HTTP status of ``/health`` on the admin port, or None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _zlink_mesh(store: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "zlink", "mesh", "--store", store, "--json"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------
def test_zlink_run_with_stdout_closed_serves_instead_of_crashing_with_a_traceback() -> None:
    """A service manager (or ``zlink run ... >&-``) may start the node with fd 1 closed:
    Python then has ``sys.stdout = None``. typer's echo skips the lines, but
    ``sys.stdout.flush()`` after the ``serving`` line (zlink/cli/__init__.py, ``run``) raised
    ``AttributeError: 'NoneType' object has no attribute 'flush'``: a rich traceback on stderr,
    the node stopped at once and the command exited 1, never serving. Expected: it serves
    (``/health`` 200) and stops on SIGTERM with status 0, no traceback."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--workers", "1",
         "--admin", f"127.0.0.1:{port}"],
        cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    try:
        served = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            served = _health(port)
            if served is not None:
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err[-1500:]
        assert served == 200, f"never served (exit {proc.returncode}): {err[-1500:]}"
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


# ------------------------------------------------------------------------------------------
def test_zlink_mesh_does_not_count_a_dead_incarnations_rows_as_the_restarted_nodes(
    tmp_path: Path,
) -> None:
    """A node killed (``kill -9``) and restarted with the same id (systemd ``Restart=``, a
    StatefulSet) registers a new incarnation; the Spots its dead incarnation owned stay in the
    store, to be re-homed on their next call. ``zlink mesh`` groups the store's rows by node
    id only (``owned()``: ``GROUP BY owner_node``, zlink/mesh/sqlite_store.py:322, and the same
    in location.py:347 and redis_store.py:498), so it lists the new incarnation as ``live``,
    owning the dead one's Spots, and never shows them as ``lease lapsed``: the state cli.md
    says marks rows a dead node left. Expected: the live node owns none of them, and the rows
    of the dead incarnation are listed apart, not as ``live``."""
    store = harness.store_url(tmp_path)
    first = harness.start(tmp_path, "n1", lease=0.5, workers=1)
    again = None
    try:
        for i in range(3):
            first.ask("create", spot=f"room-{i}", type="mp.room")
        first.kill()  # its incarnation's rows stay in the store
        again = harness.start(tmp_path, "n1", lease=0.5, workers=1)  # same id, new incarnation
        rows = _zlink_mesh(store)
        live = [r for r in rows if r["state"] == "live"]
        assert [r["node_id"] for r in live] == ["n1"], rows
        # the new incarnation has made none of the rooms; they are the dead one's
        assert live[0]["owned"] == 0, rows
        assert sum(int(r["owned"]) for r in rows if r["state"] != "live") == 3, rows  # type: ignore[call-overload]
    finally:
        for proc in (first, again):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
                proc.kill()


# ------------------------------------------------------------------------------------------
def test_metrics_say_how_many_peers_a_node_reaches(tmp_path: Path) -> None:
    """``zlink status`` shows a node's peers and the peers whose DATA it paused (its own
    backpressure), but ``/metrics`` (zlink/admin.py, ``_NodeCollector.collect``) exports
    neither: a Prometheus alert cannot tell a node that lost its peers (a partition, a
    crashed neighbour) or one that holds a peer back. Expected: a gauge of the peers a node
    reaches (and of those paused), here 1 on each of two node processes' worth of mesh."""
    from prometheus_client import CollectorRegistry, generate_latest

    from zlink.admin import _NodeCollector

    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    nodes = []
    try:
        for name in ("p1", "p2"):
            config = zlink.NodeConfig(node_id=name, workers=1, listen="tcp://127.0.0.1:0",
                                      store=store)  # fmt: skip
            nodes.append(zlink.Node(mp_app, config).start())
        deadline = time.monotonic() + 10
        while nodes[0].peers() != ["p2"]:
            assert time.monotonic() < deadline, nodes[0].peers()
            time.sleep(0.02)
        assert nodes[0].status().peers == ["p2"]  # what ``zlink status`` shows
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_NodeCollector(nodes[0]))
        text = generate_latest(registry).decode()
        gauges = re.findall(r"^(zlink_\w*peer\w*)\{[^}]*\} (\S+)$", text, re.M)
        assert "1.0" in [v for _, v in gauges], (
            "no metric of the peers the node reaches: "
            + ", ".join(sorted({n for n, _ in gauges}) or ["none"])
        )
    finally:
        for node in reversed(nodes):
            node.shutdown(5.0)


# ------------------------------------------------------------------------------------------
class _Fail(zlink.Message, type_name="opprobe.fail"):
    pass


_failing_app = zlink.App("opprobe-fail")


@_failing_app.user_spot("opprobe.failing")
class _Failing(zlink.UserSpot):
    @zlink.handler
    def fail(self, msg: _Fail) -> None:
        raise RuntimeError("a one-way handler that fails")


def _events(node: zlink.Node) -> dict[str, float]:
    from prometheus_client import CollectorRegistry, generate_latest

    from zlink.admin import _NodeCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_NodeCollector(node))
    text = generate_latest(registry).decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^zlink_events_total\{[^}]*name="(\w+)"[^}]*\} (\S+)$', text, re.M)
    }


def test_fault_counters_are_served_at_zero_before_their_first_event() -> None:
    """``zlink_events_total{name=...}`` has a series only once its counter is non-zero
    (``_NodeCollector.collect`` serves ``status().counters``, which holds only what was
    counted). A Prometheus counter whose series appears at its first value hides that first
    increase: ``increase(zlink_events_total{name="handler_errors"}[5m])`` (or ``rate``) is 0
    for the scrape where the series appears, whatever the count, so an alert on the first
    burst of failures or drops never fires (the Prometheus docs: initialise counters at 0).
    Expected: the fault counters (here ``handler_errors``) are served at 0 from the start."""
    node = zlink.Node(_failing_app, zlink.NodeConfig(workers=1)).start()
    try:
        before = _events(node)
        client = node.client()
        client.spots.get_or_create("f", "opprobe.failing").wait(5)
        client.send_to_spot("f", _Fail()).wait(5)
        deadline = time.monotonic() + 5
        while node.counters().get("handler_errors", 0) < 1:
            assert time.monotonic() < deadline, node.counters()
            time.sleep(0.01)
        assert _events(node).get("handler_errors") == 1.0
        assert before.get("handler_errors") == 0.0, (
            f"no handler_errors series before the first failure; served: {sorted(before)}"
        )
    finally:
        node.shutdown(5.0)


# ------------------------------------------------------------------------------------------
def test_scraping_a_large_node_does_not_spend_its_time_describing_it() -> None:
    """cli.md: the admin endpoint "serves read-only HTTP on its own threads (looking never
    slows the node)". But every ``/metrics`` (and ``/status``) request built a whole
    ``node.status()`` at once (zlink/admin.py, ``_NodeCollector.collect`` and ``_answer``),
    unpaced and uncached, up to 16 at a time, under the same GIL as the workers. Measured by
    the probe on this VM: a node of 20,000 Spots served 7,954 requests/s alone, and with one
    scrape a second its worst round trip went from 2.9 ms to 181 ms; with two scrapers in a
    loop, 8,605/s fell to 58/s (2,000 Spots, one scraper in a loop: 13,934/s to 304/s).
    Now a description that took t seconds to build serves every request for the next 9t
    (about a tenth of the node's time at most). Here each build takes 1 s of a manual clock
    (as a large node's does), and ten scrapes in that time build it once."""
    from zlink.admin import AdminServer
    from zlink.testing import ManualClock

    clock = ManualClock(0.0)
    node = zlink.Node(mp_app, zlink.NodeConfig(workers=1)).start()
    server = None
    builds: list[float] = []
    try:
        real_status = node.status

        def slow_status() -> object:
            builds.append(clock.now())
            clock.advance(1.0)  # a build of a large node: 1 s
            return real_status()

        node.status = slow_status  # type: ignore[method-assign]
        server = AdminServer(node, "127.0.0.1", 0, clock=clock.now).start()
        base = f"http://127.0.0.1:{server.address[1]}"

        def scrape(path: str) -> None:
            with urllib.request.urlopen(base + path, timeout=10) as reply:
                assert reply.status == 200
                reply.read()

        for path in ("/metrics", "/status") * 5:  # a scraper in a loop, two kinds of look
            scrape(path)
        assert builds == [0.0], f"built {len(builds)} times for 10 scrapes"
        clock.advance(8.9)  # 9.9 s after the build began: still fresh (a tenth of the time)
        scrape("/metrics")
        assert builds == [0.0]
        clock.advance(0.2)  # 1 s of building, then 9 s served: described afresh now
        scrape("/metrics")
        assert builds == [0.0, 10.1]
        with urllib.request.urlopen(base + "/health", timeout=10) as reply:
            assert json.loads(reply.read())["ok"]
        assert builds == [0.0, 10.1]  # (/health is answered afresh, without a description)
    finally:
        if server is not None:
            server.stop()
        node.shutdown(10.0)


# ------------------------------------------------------------------------------------------
def test_the_cli_guides_option_table_lists_every_zlink_run_option() -> None:
    """README "Running it as a service" sends the operator to the table in
    docs/guide/cli.md for every ``zlink run`` option and its ``ZLINK_*`` variable, but the
    table has no ``--store-retention`` / ``ZLINK_STORE_RETENTION`` (a week by default, at
    least 60: how long a dead node's rows stay in a shared store), which ``zlink run``
    takes."""
    import typer

    from zlink.cli import cli

    run = typer.main.get_command(cli).commands["run"]  # type: ignore[attr-defined]
    hidden = {"stop_with_stdin", "summary_file", "ready_file"}
    options = {
        p.opts[0]: p.envvar
        for p in run.params
        if p.param_type_name == "option" and p.name not in hidden
    }
    table = (ROOT / "docs" / "guide" / "cli.md").read_text()
    listed = set(re.findall(r"^\| `(--[a-z-]+)", table, re.M))
    missing = {opt: env for opt, env in options.items() if opt not in listed}
    assert missing == {}, f"zlink run options the cli.md table does not list: {missing}"


# ------------------------------------------------------------------------------------------
def test_a_node_started_under_nohup_is_not_stopped_by_the_hangup_it_ignores() -> None:
    """``nohup zlink run APP &`` (or any launcher that sets SIGHUP to SIG_IGN) asks that the
    hangup of the terminal leave the process alone. ``zlink run`` installs its stop handler
    for SIGHUP unconditionally (zlink/cli/__init__.py, ``_STOP_SIGNALS`` and the
    ``signal.signal`` loop in ``run``), replacing the inherited SIG_IGN: the probe's node,
    started by ``nohup``, drained and stopped at the SIGHUP a logout sends. Expected: a
    SIGHUP the process was started ignoring stays ignored (SIGINT and SIGTERM still stop it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--workers", "1"],
        cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # as nohup does
    )  # fmt: skip
    lines, reader = _reader(proc)
    try:
        _expect(lines, "serving", 30)
        proc.send_signal(signal.SIGHUP)
        stopped_by_hangup = _seen(lines, "drained:", 2.0)  # the stop says so at once
        assert not stopped_by_hangup, "the SIGHUP it was started ignoring stopped the node"
        proc.send_signal(signal.SIGTERM)  # (which still stops it, as ever)
        _expect(lines, "stopped:", 30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


def _reader(
    proc: subprocess.Popen[str], which: str = "stdout"
) -> tuple[queue.Queue[str], threading.Thread]:
    """The lines of ``proc``'s ``which`` stream as they come ("" at its end)."""
    out: queue.Queue[str] = queue.Queue()
    stream = getattr(proc, which)

    def pump() -> None:
        for line in stream:
            out.put(line)
        out.put("")

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return out, thread


def _seen(lines: queue.Queue[str], text: str, timeout: float) -> bool:
    """Whether a line holding ``text`` comes within ``timeout`` seconds (False at the end)."""
    end = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            return False
        if not line:
            return False
        if text in line:
            return True


def _expect(lines: queue.Queue[str], text: str, timeout: float) -> None:
    assert _seen(lines, text, timeout), f"no {text!r} within {timeout} s"


# ------------------------------------------------------------------------------------------
def serving_main() -> None:
    """A ``main()`` that makes its own node and serves until interrupted (``zlink run
    tests.conformance.test_operator_probe_faults:serving_main``)."""
    with zlink.Node(mp_app, zlink.NodeConfig(node_id="main-1", workers=1)):
        print("main serving", flush=True)
        while not threading.Event().wait(0.2):  # (a wait with no timeout is not woken by a
            pass  # signal another thread received, on 3.13t: cli.md says so)


def _serving_main_process(**popen: Any) -> subprocess.Popen[str]:
    """``zlink run`` of ``serving_main``, once it said it serves (killed if it never does)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run",
         "tests.conformance.test_operator_probe_faults:serving_main"],
        cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while "main serving" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, "main() did not serve"
            line = proc.stdout.readline()
    except BaseException:
        proc.kill()
        proc.communicate(timeout=10)
        raise
    return proc


def test_sigterm_ends_a_main_target_as_sigint_does_with_its_nodes_stopped() -> None:
    """``zlink run MODULE:main`` "just calls" the function (cli.md). Ctrl-C then raises
    KeyboardInterrupt in it: its ``with zlink.Node(...)`` blocks exit, the node stops (says
    goodbye, leaves the store) and the command exits 130. But a supervisor stops services
    with SIGTERM, and for a ``main()`` target ``zlink run`` installs nothing for it
    (``_run_callable`` in zlink/cli/__init__.py; the stop handlers are set only for an App):
    the process dies at once by the signal, its nodes never stop (no goodbye, no unregister:
    peers wait a lease to re-home its Spots; what was queued is lost uncounted). Expected:
    SIGTERM ends a ``main()`` the way SIGINT does, its nodes stopped on the way out."""
    proc = _serving_main_process()
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != -signal.SIGTERM, "killed by SIGTERM, its node never stopped"
        assert "node main-1 stopped" in err, err[-1500:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


# ------------------------------------------------------------------------------------------
def test_a_store_password_is_never_printed_nor_put_on_a_child_command_line(
    redis_server: object,
) -> None:
    """An operator keeps the Redis store's password out of ``ps`` by giving the URL in
    ``ZLINK_STORE`` (``redis://:PASSWORD@HOST:PORT/DB``). The store itself redacts it from
    its messages (``the location store redis://127.0.0.1:PORT/0 failed: ...``), but:
    ``zlink run`` prints ``node N listening on ... (redis://:PASSWORD@...)`` (zlink/cli/
    __init__.py, ``run``: ``config.store`` as given) to stdout, i.e. the journal;
    ``zlink mesh`` titles its table ``mesh in redis://:PASSWORD@...``; and ``--nodes`` puts
    it on every node process's command line (``_child_args``: ``--store URL``), readable by
    every user in ``ps``/``/proc/PID/cmdline``. Expected: never printed, and handed to the
    node processes some other way (their environment, as ``ZLINK_STORE`` was)."""
    import redis

    from zlink import cli as zcli

    secret = "s3cret-Pw-0p"
    port = redis_server.port  # type: ignore[attr-defined]
    admin = redis.Redis(host="127.0.0.1", port=port)
    admin.config_set("requirepass", secret)
    admin.close()
    url = f"redis://:{secret}@127.0.0.1:{port}/0"
    leaks: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--workers", "1",
         "--listen", "tcp://127.0.0.1:0"],
        cwd=ROOT, env=dict(ENV, ZLINK_STORE=url), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _reader(proc)
    said: list[str] = []
    try:
        end = time.monotonic() + 30
        while not any("serving" in line for line in said):
            assert time.monotonic() < end, said
            line = lines.get(timeout=max(0.0, end - time.monotonic()))
            assert line, f"it ended: {said}"
            said.append(line)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        assert proc.stdout is not None
        proc.stdout.close()
    while not lines.empty():
        said.append(lines.get_nowait())
    leaks += [f"zlink run said: {line.strip()}" for line in said if secret in line]
    looked = subprocess.run(
        [sys.executable, "-m", "zlink", "mesh", "--store", url],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert looked.returncode == 0, looked.stderr
    leaks += [f"zlink mesh said: {line.strip()}" for line in looked.stdout.splitlines()
              if secret in line]  # fmt: skip
    child = zcli._child_args("tests.procs.app:app", False, "n-1", "tcp://127.0.0.1:0", url,
                             "main", False, None, 1, None, "info", "text", None, False)  # fmt: skip
    if any(secret in arg for arg in child):
        leaks.append(f"a --nodes child's command line: {' '.join(child[2:12])} ...")
    assert leaks == [], "the store's password:\n" + "\n".join(leaks)


# ------------------------------------------------------------------------------------------
def test_a_start_refused_for_its_admin_port_leaves_the_running_node_of_that_id_alone(
    tmp_path: Path,
) -> None:
    """A second ``zlink run`` with a running node's id (a unit started twice, a manual test
    run with the service's settings) whose ``--admin`` port is taken ends with ``Error: the
    admin endpoint cannot bind ...`` and status 1: one of the "mistakes" cli.md lists, which
    should change nothing. But the admin endpoint is bound only after the node started
    (zlink/cli/__init__.py, ``run``: ``AdminServer(...)`` after ``_started``), and the start
    registered the id in the store as a new incarnation: the running node's next renewal is
    refused, it fences itself and drops every Spot and Actor it held (the probe saw a Spot's
    state lost: 5 handled, then 0 after the failed start), then registers again. Expected:
    the admin address is bound (or found taken) before the node registers, so the running
    node is never fenced by a start that failed."""
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    common = [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--node-id", "dup",
              "--listen", "tcp://127.0.0.1:0", "--store", store, "--workers", "1",
              "--lease", "1"]  # fmt: skip
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = subprocess.Popen(
        common, cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err_lines, reader = _reader(first, "stderr")
    try:
        _expect(err_lines, "started with", 30)
        (before,) = _zlink_mesh(store)
        second = subprocess.run(
            [*common, "--admin", f"127.0.0.1:{taken.getsockname()[1]}"],
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1 and "cannot bind" in second.stderr, second.stderr
        fenced = _seen(err_lines, "fenced itself", 3.0)  # three of its leases
        assert not fenced, "the running node fenced itself after a start that failed"
        (after,) = _zlink_mesh(store)
        assert after["incarnation"] == before["incarnation"]
    finally:
        taken.close()
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
        try:
            first.wait(30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait(10)
        reader.join(10)
        assert first.stderr is not None
        first.stderr.close()


def test_a_hangup_right_after_sigterm_does_not_cut_a_main_targets_stop_short() -> None:
    """A review of the fix above: the first SIGTERM raised in ``main()``, and a SIGHUP right
    after it (systemd's ``SendSIGHUP=yes``) raised again inside its ``with zlink.Node``
    block's stop, cutting it short: no goodbye, no leaving the store. It is ignored now."""
    proc = _serving_main_process(preexec_fn=as_a_service)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=30)
        # (pending together, the two are handled SIGHUP first: either one ends it)
        assert proc.returncode in (128 + signal.SIGTERM, 128 + signal.SIGHUP), err[-1500:]
        assert "node main-1 stopped" in err and "release unlocked" not in err, err[-1500:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
