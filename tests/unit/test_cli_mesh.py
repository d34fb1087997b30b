"""``zlink run --listen/--store``, ``zlink run --nodes K`` and ``zlink mesh`` (python-api §10):
real subprocesses on 127.0.0.1, each stopped by the test."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.unit.test_cli import ROOT, _lines, _until, past_the_repeat_window
from zlink.cli import cli

pytestmark = pytest.mark.timeout(90)


def _mesh(store: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "zlink", "mesh", "--store", store, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _stop(proc: subprocess.Popen[str], reader: object) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    reader.join(10)  # type: ignore[attr-defined]
    assert proc.stdout is not None
    proc.stdout.close()


def test_a_node_process_listens_registers_in_the_store_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--node-id", "solo",
         "--listen", "tcp://127.0.0.1:0", "--store", store, "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        seen = _until(lines, "listening on tcp://127.0.0.1:", 30)
        address = seen[-1].split("listening on ")[1].split()[0]
        (row,) = _mesh(store)
        assert row["node_id"] == "solo" and row["address"] == address
        assert int(row["incarnation"]) >= 1 and 0 < float(row["lease_left"]) <= 3.0  # type: ignore[arg-type]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert _mesh(store) == []  # it unregistered on its way out
    finally:
        _stop(proc, reader)


def test_a_summary_file_it_cannot_write_changes_nothing_a_node_says(tmp_path: Path) -> None:
    """A review's finding: a ``--nodes`` child that could not write its stop summary (its
    parent's folder gone) printed a traceback instead of its own ``stopped:`` line and
    exited 1. Its parent only says it "said nothing"; the child stops as it always did."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--node-id", "s",
         "--listen", "tcp://127.0.0.1:0", "--store", f"sqlite:///{tmp_path / 'mesh.db'}",
         "--workers", "1", "--summary-file", str(tmp_path / "gone" / "1.json")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        _until(lines, "serving", 30)
        proc.send_signal(signal.SIGTERM)
        seen = _until(lines, "stopped: ", 30)
        assert not any("Traceback" in line for line in seen)
        assert proc.wait(timeout=30) == 0
    finally:
        _stop(proc, reader)


def test_run_nodes_starts_a_mesh_of_processes_and_stops_them_all(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--nodes", "3",
         "--node-id", "w", "--store", store, "--workers", "1", "--lease", "1.5"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        for _ in range(3):
            _until(lines, "listening on", 45)
        rows = _mesh(store)
        assert sorted(str(r["node_id"]) for r in rows) == ["w-1", "w-2", "w-3"]
        assert all(0 < float(r["lease_left"]) <= 1.5 for r in rows)  # type: ignore[arg-type]
        proc.send_signal(signal.SIGTERM)
        seen = _until(lines, "all nodes stopped", 45)
        own = [line.strip() for line in seen if line.startswith("stopped: ")]
        # each node says what its stop did (its Entry Spot stayed: no drain), and whose line
        # it is (a probe could not tell them apart), then the sum
        assert sorted(own) == [
            f"stopped: 0 Spots moved, 1 stayed; 0 messages discarded (node w-{n})"
            for n in (1, 2, 3)
        ], own
        stopping = [line.strip() for line in seen if line.startswith("stopping: ")]
        assert sorted(stopping) == [
            "stopping: refusing new work, finishing running turns (SIGINT or SIGTERM again exits"
            f" at once) (node w-{n})"
            for n in (1, 2, 3)
        ], stopping
        summed = "all nodes stopped: 0 Spots moved, 3 stayed; 0 messages discarded"
        assert seen[-1].strip() == summed
        assert proc.wait(timeout=30) == 0
        assert _mesh(store) == []
    finally:
        _stop(proc, reader)


@pytest.mark.timeout(90)
def test_run_nodes_names_a_node_killed_exits_as_a_shell_would_and_removes_its_store() -> None:
    """A service probe: with a child killed by SIGKILL the parent exited 9 (not 137) and said
    only "1 of 3 nodes said nothing"; the temporary store folder was never removed."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--nodes", "2",
         "--node-id", "k", "--workers", "1", "--lease", "1.5"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        store_line = _until(lines, "Location Store: ", 45)[-1]
        folder = Path(store_line.split("sqlite:///", 1)[1].strip()).parent
        for _ in range(2):
            _until(lines, "listening on", 45)
        children = psutil.Process(proc.pid).children()
        victim = next(c for c in children if "k-2" in c.cmdline())
        victim.kill()  # SIGKILL: it says nothing
        seen = _until(lines, "all nodes stopped", 45)
        assert "said nothing: k-2" in seen[-1], seen[-1]
        # and, at once, which one ended and how (a second probe: only "said nothing" was
        # said, at the very end)
        assert any("node k-2" in line and "was ended by SIGKILL" in line for line in seen), seen
        assert not any("handshake" in line for line in seen), seen  # a kill is no key mismatch
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL
        assert not folder.exists()
    finally:
        _stop(proc, reader)


@pytest.mark.timeout(90)
def test_run_nodes_says_started_only_once_every_node_serves(tmp_path: Path) -> None:
    """A service probe: "2 node processes started" was printed as soon as they were spawned,
    also when one then failed (here its port is taken): the parent names the one that
    failed, stops the others, and exits with its status."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--nodes", "2",
             "--node-id", "f", "--workers", "1", "--listen", f"tcp://127.0.0.1:{port}",
             "--store", f"sqlite:///{tmp_path / 'mesh.db'}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        lines, reader = _lines(proc)
        try:
            seen = _until(lines, "all nodes stopped", 60)
            text = "".join(seen)
            assert "node processes serving" not in text, text
            # f-1's port is taken; f-2's, the next one, may be too on a busy machine: the
            # parent names the first that failed either way
            assert re.search(r"f-[12] exited with status 1 before it served", text), text
            assert proc.wait(timeout=30) == 1
        finally:
            _stop(proc, reader)


def test_mesh_looks_at_a_store_and_never_makes_one(tmp_path: Path) -> None:
    """A service probe: ``zlink mesh`` on a typo'd path made an empty store there and listed
    an empty mesh; on "memory" it listed the empty store of its own process."""
    missing = tmp_path / "typo.db"
    result = CliRunner().invoke(cli, ["mesh", "--store", f"sqlite:///{missing}"])
    assert result.exit_code == 1 and "no Location Store" in result.output
    assert not missing.exists()
    result = CliRunner().invoke(cli, ["mesh", "--store", "memory"])
    assert result.exit_code == 1 and "one process" in result.output


def test_a_non_loopback_listen_needs_keys_or_insecure() -> None:
    """python-api §10: refused before anything binds; nothing here binds a non-loopback
    address."""
    result = CliRunner().invoke(
        cli, ["run", "tests.procs.app:app", "--listen", "tcp://10.1.2.3:7000"]
    )
    assert result.exit_code != 0
    assert "not a loopback address" in str(result.exception) + result.output


def test_a_lease_that_is_not_a_duration_is_refused() -> None:
    result = CliRunner().invoke(
        cli, ["run", "tests.procs.app:app", "--listen", "tcp://127.0.0.1:0", "--lease", "0"]
    )
    assert result.exit_code != 0
    assert "lease_seconds" in str(result.exception) + result.output


def test_a_bad_store_url_is_refused() -> None:
    result = CliRunner().invoke(
        cli, ["run", "tests.procs.app:app", "--listen", "tcp://127.0.0.1:0", "--store", "ftp://x"]
    )
    assert result.exit_code != 0
    assert "sqlite" in str(result.exception) + result.output


def test_bingo_play_on_node_processes_prints_its_summary() -> None:
    result = CliRunner().invoke(
        cli, ["bingo", "play", "--nodes", "3", "--processes", "--rooms", "3", "--players", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "Bingo on node processes" in result.output and "3 / 12" in result.output


def test_run_nodes_leaves_no_node_behind_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A --nodes parent killed outright (SIGKILL: no handler runs) must not leave its node
    processes serving: each watches the pipe from its parent and stops when it closes."""
    import psutil

    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--nodes", "2",
         "--node-id", "k", "--store", store, "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    children: list[psutil.Process] = []
    try:
        for _ in range(2):
            _until(lines, "listening on", 45)
        children = psutil.Process(proc.pid).children()
        assert len(children) == 2
        proc.kill()
        proc.wait(10)
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], alive
        assert _mesh(store) == []  # they stopped gracefully: unregistered
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        _stop(proc, reader)


class _Child:
    """What ``_until_serving`` reads of a child process."""

    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_until_serving_says_how_the_start_went(tmp_path: Path, monkeypatch) -> None:
    """A review's findings: a run whose nodes never served exited 0, a signal during the
    wait printed "serving", and a node that served and then ended was not noticed."""
    import threading

    from zlink import cli as cli_module

    stop = threading.Event()
    until = cli_module._until_serving
    (tmp_path / "1.ready").touch()
    (tmp_path / "2.ready").touch()
    assert until([_Child(), _Child()], tmp_path, stop, "n-") == cli_module._Start(True)
    ended = until([_Child(), _Child(-9)], tmp_path, stop, "n-")
    assert ended.error == "node n-2 was ended by SIGKILL (status 137) as the others started"
    assert ended.status == 137 and not ended.serving
    (tmp_path / "2.ready").unlink()
    early = until([_Child(), _Child(0)], tmp_path, stop, "n-")
    assert early.error == "node n-2 exited with status 0 before it served" and early.status == 1
    monkeypatch.setattr(cli_module, "_SERVING_WITHIN", 0.0)
    late = until([_Child(), _Child()], tmp_path, stop, "n-")
    assert late.error == "n-2 did not serve within 0 s" and late.status == 1
    stop.set()
    assert until([_Child(), _Child()], tmp_path, stop, "n-") == cli_module._Start(False)


def test_mesh_lists_what_a_node_whose_lease_lapsed_still_owns(tmp_path: Path) -> None:
    """A service probe: once a dead node's lease lapsed, ``zlink mesh`` dropped its row
    though it still owned 5 Spots (re-homed only on their next call): an operator could not
    see them. Such an owner is listed, its lease lapsed."""
    from zlink.mesh.sqlite_store import SqliteLocationStore
    from zlink.testing import ManualClock

    path = tmp_path / "mesh.db"
    with SqliteLocationStore(path, ManualClock()) as store:  # leases long past, by the wall
        store.join_mesh("main")
        gone = store.register_node("gone", "inproc://gone", 1.0).incarnation
        for spot in ("a", "b"):
            store.reserve(spot, "spot", "game.room", "gone", gone)
    rows = _mesh(f"sqlite:///{path}")
    assert [(r["node_id"], r["owned"], r["state"]) for r in rows] == [("gone", 2, "lease lapsed")]


@pytest.mark.timeout(60)
def test_a_second_signal_during_a_nodes_stop_leaves_no_folder_and_no_node(tmp_path: Path) -> None:
    """``zlink run --nodes K`` made its Location Store's folder and a folder for its nodes'
    stop summaries; a second SIGTERM while the nodes stopped killed them and exited at once,
    skipping the removal: two folders left in the temporary directory per such stop."""
    import os

    import psutil

    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.unit.slow_stop_app:app", "--nodes", "2",
         "--node-id", "s", "--workers", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    lines, reader = _lines(proc)
    children: list[psutil.Process] = []
    try:
        _until(lines, "2 node processes serving", 45)
        children = psutil.Process(proc.pid).children()
        assert len(children) == 2
        assert sorted(p.name.split("-")[1] for p in temp.iterdir()) == ["mesh", "nodes"]
        proc.send_signal(signal.SIGTERM)
        _until(lines, "stopping:", 15)  # a node's stop waits for its held worker call
        past_the_repeat_window()
        proc.send_signal(signal.SIGTERM)  # again: at once
        assert proc.wait(10) == 128 + signal.SIGTERM
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], alive
        assert list(temp.iterdir()) == [], "left behind by the run"
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        _stop(proc, reader)


@pytest.mark.timeout(60)
def test_each_nodes_admin_line_names_its_node(tmp_path: Path) -> None:
    """``zlink run --nodes 2 --admin 127.0.0.1:0``: each node process serves an admin port of
    its own and says where, and the operator could not tell which line was which node's."""
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "tests.procs.app:app", "--nodes", "2",
         "--node-id", "a", "--store", store, "--workers", "1", "--admin", "127.0.0.1:0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, reader = _lines(proc)
    try:
        seen = _until(lines, "2 node processes serving", 45)
        said = [line.split() for line in seen if line.startswith("admin on ")]
        assert len(said) == 2, seen
        named = {}
        for words in said:
            assert words[3:5] == ["(node", words[4]] and words[4].endswith(")"), words
            named[words[4].rstrip(")")] = words[2].removeprefix("http://")
        assert sorted(named) == ["a-1", "a-2"], said
        for node_id, address in named.items():  # each line names the node it serves
            done = subprocess.run(
                [sys.executable, "-m", "zlink", "status", "--json", "--admin", address],
                cwd=ROOT, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["node_id"] == node_id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        _stop(proc, reader)


def test_mesh_reads_lease_left_on_the_stores_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's probe (by reading): ``zlink mesh`` took "lease left" as the lease's end
    less this machine's ``time.time()``, but a Redis store's leases are on the server's clock
    (``TIME``): the column was off by any skew between the two machines. It asks the store's
    own clock now (``LocationStore.now``); here a store whose clock is far from the wall's."""
    from zlink.mesh import stores
    from zlink.mesh.location import InMemoryLocationStore
    from zlink.testing import ManualClock

    clock = ManualClock(1000.0)
    store = InMemoryLocationStore(clock)
    store.register_node("n1", "tcp://127.0.0.1:1", 3.0)
    monkeypatch.setattr(stores, "open_store", lambda url, existing=False: store)
    result = CliRunner().invoke(cli, ["mesh", "--store", "sqlite:///unused.db", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["lease_left"] == 3.0, row


def test_the_redis_stores_clock_is_the_servers(redis_server: Any) -> None:
    from zlink.mesh.redis_store import RedisLocationStore

    with RedisLocationStore(redis_server.url) as store:
        before = time.time()
        now = store.now()
        assert before - 1.0 <= now <= time.time() + 1.0  # (one machine: the same clock)
