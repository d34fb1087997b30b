"""Node leases, self-fencing, failure detection and re-homing between real node processes
(python-api §10 "Failure"; issue "Node leases, failure detection and a Redis Location Store"),
and a move caught mid-flight by a death (issue 14, python-api §11).

Node processes on 127.0.0.1 share a SQLite store, with a lease of 0.5 s. Every wait is bounded
and waits on a condition (polled), never on a fixed sleep; every process is stopped after.
Each Spot of the ``mp.audited`` type logs its activations and handled messages (node,
incarnation, generation, wall time) to an audit file, which shows that no Spot was ever
active on two nodes at once.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs.harness import CommandFailed, NodeProcess, mesh, start
from zlink.errors import Unavailable
from zlink.mesh.sqlite_store import SqliteLocationStore

LEASE = 0.5
pytestmark = pytest.mark.timeout(120)


def _until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``check`` until it is truthy (bounded); its value."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)  # polling a condition in another process: nothing to wait on


@pytest.fixture
def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "audit.db"
    monkeypatch.setenv("ZLINK_TEST_AUDIT", str(path))
    return path


def _check_audit(path: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Per Spot, its incarnations in the order they served ((node, incarnation, generation));
    fails if two of them were ever active at once (their intervals overlap) or a generation
    came back."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT spot, node, incarnation, generation, at FROM audit").fetchall()
    spans: dict[str, dict[tuple[str, int, int], list[float]]] = {}
    for spot, node, incarnation, generation, at in rows:
        span = spans.setdefault(spot, {}).setdefault((node, incarnation, generation), [at, at])
        span[0], span[1] = min(span[0], at), max(span[1], at)
    order: dict[str, list[tuple[str, int, int]]] = {}
    for spot, lives in spans.items():
        ranked = sorted(lives.items(), key=lambda item: item[1][0])
        for (who, (_, end)), (later, (begin, _)) in itertools.pairwise(ranked):
            assert end < begin, f"{spot}: {who} and {later} were active at once"
        generations = [who[2] for who, _ in ranked]
        assert generations == sorted(set(generations)), f"{spot}: generations {generations}"
        order[spot] = [who for who, _ in ranked]
    return order


def _owner(tmp_path: Path, spot: str) -> tuple[str, int, bool]:
    with SqliteLocationStore(tmp_path / "mesh.db") as store:
        found = store.lookup(spot)
        assert found is not None
        return found.owner_node, found.owner_incarnation, found.owner_live


def _lapsed(tmp_path: Path, node: str) -> bool:
    with SqliteLocationStore(tmp_path / "mesh.db") as store:
        return all(r.node_id != node for r in store.nodes())


@pytest.fixture
def pair(tmp_path: Path, audit: Path) -> Iterator[dict[str, NodeProcess]]:
    with mesh(tmp_path, ["n1", "n2"], lease=LEASE) as nodes:
        _until(lambda: all(n.ask("peers") for n in nodes.values()), "the nodes meet")
        yield nodes


def test_kill_9_ends_each_call_once_after_the_lease_and_rehomes_its_spots(
    tmp_path: Path, audit: Path, pair: dict[str, NodeProcess]
) -> None:
    """``kill -9`` of a node holding Spots with calls outstanding: each call ends exactly
    once, promptly after the lease (not at its 30 s deadline); its Spots are re-homed with new
    generations; no Spot was ever active on two nodes at once."""
    n1, n2 = pair["n1"], pair["n2"]
    rooms = [f"room-{i}" for i in range(5)]
    for room in rooms:
        n1.ask("create", spot=room, type="mp.audited")
    before = {room: n2.ask("gen", spot=room) for room in rooms}  # served by n1, via n2
    assert {tuple(v[:2]) for v in before.values()} == {("n1", n1.ask("incarnation"))}
    n1.ask("create", spot="held", type="mp.gate")
    n2.send_line({"id": 50_000, "op": "hold", "spot": "held", "timeout": 30})
    _until(lambda: n1.ask("busy") == 1, "the held request runs on n1")
    killed = time.monotonic()
    n1.kill()
    answer = n2.wait_answer(50_000, timeout=20)
    took = time.monotonic() - killed
    assert not answer["ok"] and answer["error"].startswith("Unavailable"), answer
    assert took < 3 * LEASE + 1.0, took  # after the lease, long before the deadline
    counters = n2.ask("counters")
    assert counters["calls_failed_peer_down"] == 1  # once, and only it
    assert counters["peers_declared_down"] >= 1
    after = {room: n2.ask("gen", spot=room) for room in rooms}
    for room in rooms:
        node, _incarnation, generation = after[room]
        assert node == "n2" and generation > before[room][2], (room, before[room], after[room])
    assert n2.ask("counters")["spots_rehomed"] == len(rooms)
    order = _check_audit(audit)
    for room in rooms:
        assert [who[0] for who in order[room]] == ["n1", "n2"]
    with pytest.raises(CommandFailed, match="InvalidOperation"):  # the old incarnation's ref
        n2.ask("close_ref", ref=[rooms[0], before[rooms[0]][2], "n1"])


def test_a_stopped_node_fences_itself_and_its_writes_are_refused(
    tmp_path: Path, audit: Path, pair: dict[str, NodeProcess]
) -> None:
    """``SIGSTOP`` a node past its lease, then ``SIGCONT``: meanwhile its Spot was re-homed;
    woken, it has fenced itself (it serves none of its old Spots), registered again as a new
    incarnation, and the store refuses every write of its old incarnation."""
    n1, n2 = pair["n1"], pair["n2"]
    n1.ask("create", spot="room", type="mp.audited")
    first = n2.ask("gen", spot="room")
    old_incarnation = n1.ask("incarnation")
    assert first[:2] == ["n1", old_incarnation]
    os.kill(n1.proc.pid, signal.SIGSTOP)
    try:
        _until(lambda: _lapsed(tmp_path, "n1"), "n1's lease lapses in the store")
        _until(lambda: n2.ask("counters").get("peers_declared_down"), "n2 declares n1 down")
        moved = n2.ask("gen", spot="room")
        assert moved[0] == "n2" and moved[2] > first[2]
    finally:
        os.kill(n1.proc.pid, signal.SIGCONT)
    _until(lambda: n1.ask("counters").get("self_fenced") == 1, "n1 fences itself")
    new_incarnation = _until(
        lambda: (i := n1.ask("incarnation")) != old_incarnation and i, "n1 registers again"
    )
    assert new_incarnation > old_incarnation
    assert not n1.ask("owns", spot="room")
    with SqliteLocationStore(tmp_path / "mesh.db") as store:
        with pytest.raises(Unavailable, match="stale owner: 'n1'"):
            store.release("room", "n1", old_incarnation, 1)
        with pytest.raises(Unavailable, match="holds no lease"):
            store.reserve("room-x", "spot", "mp.audited", "n1", old_incarnation)
    assert _owner(tmp_path, "room")[:2] == ("n2", n2.ask("incarnation"))
    # calls from n1 go to the room's new home now
    assert n1.ask("gen", spot="room")[:2] == ["n2", n2.ask("incarnation")]
    order = _check_audit(audit)
    assert [who[0] for who in order["room"]] == ["n1", "n2"]


def test_a_node_restarted_with_the_same_id_is_a_new_incarnation(
    tmp_path: Path, audit: Path, pair: dict[str, NodeProcess]
) -> None:
    """Restart a node with the same id: it is a new incarnation; the Spots of the old one are
    re-homed on their next call, each with a new generation, and nothing reaches the old
    incarnation's Spots any more."""
    n1, n2 = pair["n1"], pair["n2"]
    n1.ask("create", spot="room", type="mp.audited")
    first = n2.ask("gen", spot="room")
    old = n1.ask("incarnation")
    n1.kill()
    again = start(tmp_path, "n1", lease=LEASE)
    try:
        assert again.ask("incarnation") > old
        _until(lambda: "n1" in n2.ask("peers"), "n2 meets the new n1")
        _until(lambda: n2.ask("counters").get("peers_declared_down"), "the old n1 is down")
        served = n2.ask("gen", spot="room")
        assert served[2] > first[2]
        assert served[:2] in (["n2", n2.ask("incarnation")], ["n1", again.ask("incarnation")])
        _check_audit(audit)
    finally:
        again.stop()


def test_kill_9_of_a_relocation_target_mid_move_ends_the_move_and_the_spot_serves_on(
    tmp_path: Path, audit: Path, pair: dict[str, NodeProcess]
) -> None:
    """Issue 14, python-api §11: ``kill -9`` of the target while it restores a Spot moving to
    it. The source's ``relocate_spot`` ends about a lease later (not at its 30 s deadline)
    with ``Unavailable``; the Spot still serves on the source with its queue intact: what was
    queued before the move and what was parked during it, each once."""
    n1, n2 = pair["n1"], pair["n2"]
    n1.ask("create", spot="moving", type="mp.held_move")
    n1.ask("send", spot="moving", sender="a", count=20)
    n2.ask("send", spot="moving", sender="b", count=20)  # relayed to n1
    _until(lambda: n1.ask("total", spot="moving") == 40, "the first messages are handled")
    n1.send_line({"id": 60_000, "op": "relocate", "spot": "moving", "to": "n2",
                  "move_timeout": 30})  # fmt: skip
    _until(lambda: n2.ask("restoring"), "n2 restores the Spot, and waits there")
    n1.ask("send", spot="moving", sender="c", count=10)  # parked at the seal on n1
    killed = time.monotonic()
    n2.kill()
    answer = n1.wait_answer(60_000, timeout=20)
    took = time.monotonic() - killed
    assert not answer["ok"] and answer["error"].startswith("Unavailable"), answer
    assert took < 3 * LEASE + 1.0, took  # after the lease, long before the deadline
    assert n1.ask("owns", spot="moving")
    log = n1.ask("log", spot="moving")
    assert log == {"a": list(range(20)), "b": list(range(20)), "c": list(range(10))}
    assert _owner(tmp_path, "moving")[:2] == ("n1", n1.ask("incarnation"))
    counters = n1.ask("counters")
    assert counters["peers_declared_down"] >= 1 and counters.get("relocated_out", 0) == 0
