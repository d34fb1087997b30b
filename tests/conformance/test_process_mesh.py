"""A mesh of OS processes over ZeroMQ with a SQLite Location Store (python-api §10;
execution-model §4, §13, §14, §16).

Every node here is a real process (``tests/procs/node_main.py``) on 127.0.0.1, started with
``subprocess`` and stopped by the test (killed if it must be), sharing one SQLite file. The test
process drives them with JSON commands and reads the store itself. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.procs.harness import CommandFailed, NodeProcess, mesh, start
from zlink.mesh.sqlite_store import SqliteLocationStore
from zlink.mesh.zmq_transport import VERSION, MeshEndpoint, identity

pytestmark = pytest.mark.timeout(120)


def _until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Ask ``check`` again (each ask a round trip to a process) until it is truthy."""
    end = time.monotonic() + timeout
    for _ in range(10_000):
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            break
        time.sleep(0.02)  # polling another process: there is no event to wait on
    raise AssertionError(f"not within {timeout} s: {what}")


def _store(tmp_path: Path) -> SqliteLocationStore:
    return SqliteLocationStore(tmp_path / "mesh.db")


def _owner(tmp_path: Path, spot: str) -> str:
    store = _store(tmp_path)
    try:
        found = store.lookup(spot)
        assert found is not None
        return found.owner_node
    finally:
        store.close()


def _meshed(nodes: dict[str, NodeProcess]) -> None:
    ids = sorted(nodes)
    for node in nodes.values():
        others = [i for i in ids if i != node.node_id]
        _until(lambda n=node, o=others: n.ask("peers") == o, f"{node.node_id} sees {others}")


def test_creation_is_placed_once_across_processes(tmp_path: Path) -> None:
    """§14: a Spot asked for on three processes at once is created once, on one node, and all
    three agree on its generation (the store's fenced reserve decides)."""
    spots = [f"room-{i}" for i in range(30)]
    with mesh(tmp_path, ["n1", "n2", "n3"]) as nodes:
        _meshed(nodes)
        for node in nodes.values():  # all three ask at once
            node.send_line({"id": 10_000, "op": "create_many", "spots": spots, "type": "mp.room"})
        answers = {}
        for node in nodes.values():
            reply = node.wait_answer(10_000, timeout=60)
            assert reply["ok"], reply
            answers[node.node_id] = reply["value"]
        for i, spot in enumerate(spots):
            created = [n for n in answers if answers[n][i][0]]
            generations = {answers[n][i][1] for n in answers}
            assert len(created) <= 1, (spot, created)
            assert len(generations) == 1, (spot, generations)
        store = _store(tmp_path)
        try:
            owners = {s: store.lookup(s).owner_node for s in spots}  # type: ignore[union-attr]
        finally:
            store.close()
        assert set(owners.values()) <= {"n1", "n2", "n3"}


def test_sends_and_requests_cross_processes_exactly_once_in_order(tmp_path: Path) -> None:
    """Sends from two other processes reach a Spot exactly once, each sender in order."""
    with mesh(tmp_path, ["n1", "n2", "n3"]) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="r", type="mp.room")
        nodes["n2"].ask("send", spot="r", sender="from-n2", count=3000)
        nodes["n3"].ask("send", spot="r", sender="from-n3", count=3000)
        _until(lambda: nodes["n2"].ask("total", spot="r") == 6000, "all 6000 handled")
        log = nodes["n3"].ask("log", spot="r")
        assert log == {"from-n2": list(range(3000)), "from-n3": list(range(3000))}


def test_a_room_moved_50_times_across_processes_under_4_senders(tmp_path: Path) -> None:
    """Relocation between processes, unchanged: 50 moves while 4 sender threads of another
    process wait()-send numbered messages; every message handled exactly once, per-sender
    order kept (kotlin-spot-interface, relocation; §4)."""
    ids = ["n1", "n2", "n3"]
    with mesh(tmp_path, ids) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="room", type="mp.room")
        nodes["n3"].ask("pump", name="p", spot="room", senders=4, count=400)
        moves = 0
        for i in range(50):
            here = _owner(tmp_path, "room")
            there = ids[(ids.index(here) + 1 + i % 2) % 3]
            nodes[here].ask("relocate", spot="room", to=there, move_timeout=10)
            moves += 1
        pumped = nodes["n3"].ask("pump_wait", name="p", timeout=70)
        assert pumped == {"sent": 1600, "errors": [], "done": True}
        _until(lambda: nodes["n2"].ask("total", spot="room") == 1600, "all 1600 handled")
        log = nodes["n2"].ask("log", spot="room")
        assert sorted(log) == [f"n3-p-{i}" for i in range(4)]
        late = {s: q for s, q in log.items() if q != list(range(400))}
        if late:  # what each node counted, to tell which path the late ones took
            counted = {n: nodes[n].ask("counters") for n in ids}
            raise AssertionError(f"per-sender order broken: {late}; counters: {counted}")
        assert moves == 50


def test_a_room_s_subscriptions_move_with_it_between_processes(tmp_path: Path) -> None:
    """A Spot's Logical Multicast subscriptions cross in its relocation envelope (wire
    ``RelocObject.topics``; test_relocation_subscriptions.py): after a move to another process,
    events published in that process reach it, and the source lists it no more; an event
    published in the source's process reaches it too, once (test_mesh_multicast.py)."""
    with mesh(tmp_path, ["n1", "n2"]) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="room", type="mp.room")
        assert nodes["n1"].ask("follow", spot="room", topic="news") is True
        nodes["n1"].ask("publish", topic="news", text="before")
        _until(lambda: nodes["n1"].ask("heard", spot="room") == ["n1:news:before"], "heard")
        nodes["n1"].ask("relocate", spot="room", to="n2", move_timeout=10)
        assert nodes["n1"].ask("subscribed", spot="room") == []
        assert nodes["n2"].ask("subscribed", spot="room") == ["news"]
        nodes["n2"].ask("publish", topic="news", text="after")
        _until(
            lambda: nodes["n2"].ask("heard", spot="room") == ["n1:news:before", "n2:news:after"],
            "the event published on n2 heard there",
        )
        nodes["n1"].ask("publish", topic="news", text="across")  # Logical Multicast crosses
        _until(
            lambda: nodes["n2"].ask("heard", spot="room")[-1:] == ["n2:news:across"],
            "the event published on n1 heard on n2",
        )
        assert len(nodes["n2"].ask("heard", spot="room")) == 3


def test_a_reply_arrives_over_completion_while_data_from_that_peer_is_paused(
    tmp_path: Path,
) -> None:
    """§4, §16 with real connections: n2 awaits a reply from n1 while n2 pauses application
    DATA from n1 (n1 floods a Spot of n2 that is stuck); the reply still reaches n2, over
    COMPLETION, and n2 keeps n1's DATA paused meanwhile."""
    with mesh(tmp_path, ["n1", "n2"], workers=2, peer_backlog=4, lane_items=4) as nodes:
        _meshed(nodes)
        n1, n2 = nodes["n1"], nodes["n2"]
        n1.ask("create", spot="held", type="mp.gate")
        n2.ask("create", spot="stuck", type="mp.gate")
        n2.send_line({"id": 20_000, "op": "hold", "spot": "held", "timeout": 60})
        _until(lambda: n1.ask("busy") == 1, "the held request runs on n1")
        n1.ask("send_gate", spot="stuck", count=40)  # 1 runs, 4 in the lane, 4 wait, pause
        _until(lambda: n2.ask("paused", peer="n1"), "n2 paused DATA from n1")
        seen = n2.ask("status_peers")  # node.status() and zlink status show it
        assert seen == {"address": n2.address, "peers": ["n1"], "paused": ["n1"]}
        n1.ask("release", which="hold")
        answer = n2.wait_answer(20_000, timeout=20)
        assert answer == {"id": 20_000, "ok": True, "value": "released"}
        assert n2.ask("paused", peer="n1")  # the reply came while DATA stayed paused
        n2.ask("release")
        _until(lambda: not n2.ask("paused", peer="n1"), "n2 resumed n1 once it drained")


def test_a_node_that_goes_away_fails_its_pending_calls_at_once(tmp_path: Path) -> None:
    """python-api §10: calls in flight to a node that went away complete with ``Unavailable``
    at once, not at their deadline (30 s here)."""
    with mesh(tmp_path, ["n1", "n2"]) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="held", type="mp.gate")
        nodes["n2"].send_line({"id": 30_000, "op": "hold", "spot": "held", "timeout": 30})
        _until(lambda: nodes["n1"].ask("busy") == 1, "the request runs on n1")
        killed = time.monotonic()
        nodes["n1"].kill()
        answer = nodes["n2"].wait_answer(30_000, timeout=20)
        assert time.monotonic() - killed < 5.0
        assert not answer["ok"] and answer["error"].startswith("Unavailable"), answer
        assert nodes["n2"].ask("counters")["calls_failed_peer_down"] == 1


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="freezes a process with SIGSTOP")
def test_what_a_dropped_connection_lost_reaches_the_peer_when_it_is_met_again(
    tmp_path: Path,
) -> None:
    """python-api §9: a message accepted for another node is handled there or counted as
    dropped. n1 freezes (SIGSTOP) while n2 sends it 300 messages of ~10 KB, more than the
    loopback buffers take: n2's connection to it drops with what its pipe held (its pipe
    fills, or the ZMTP heartbeat times out after 1 s), and n2 refuses the sends after that
    (``Unavailable``). n1's lease (10 s) still holds, it is met again, and every message n2
    accepted is handled once, in order: what n1 had not acknowledged was sent again."""
    with mesh(tmp_path, ["n1", "n2"], lease=10) as nodes:
        _meshed(nodes)
        n1, n2 = nodes["n1"], nodes["n2"]
        n1.ask("create", spot="r", type="mp.room")
        n2.ask("send", spot="r", sender="first", count=10)  # n2 knows where r lives
        _until(lambda: n2.ask("total", spot="r") == 10, "the first 10 handled")
        sender = "s" * 5000
        os.kill(n1.proc.pid, signal.SIGSTOP)
        try:
            sent = n2.ask("send", spot="r", sender=sender, count=300, until_refused=True)
            _until(lambda: n2.ask("counters").get("peers_lost", 0) >= 1, "n2 loses n1", 10)
        finally:
            os.kill(n1.proc.pid, signal.SIGCONT)
        assert sent > 0
        _until(lambda: n2.ask("peers") == ["n1"], "n2 meets n1 again")
        _until(lambda: n2.ask("total", spot="r") == 10 + sent, f"all {sent} accepted handled")
        assert n2.ask("log", spot="r") == {"first": list(range(10)), sender: list(range(sent))}
        assert n2.ask("counters").get("frames_dropped_peer_down", 0) == 0


def test_a_graceful_stop_sends_what_it_accepted_for_a_paused_peer_before_it_goes(
    tmp_path: Path,
) -> None:
    """python-api §9: a message a node accepted for another node is handled there or counted
    as dropped. n2's only worker is held, so its room's lane fills and it pauses n1; n1 has
    accepted 3,000 sends for the room, most of them still in its outbox, when it is told to
    stop. Its graceful stop waits (within its shutdown timeout) until they are out and
    acknowledged, so once n2 runs again every one is handled, in order; before, they were
    dropped with the outbox, counted nowhere."""
    with mesh(tmp_path, ["n1"]) as nodes, mesh(tmp_path, ["n2"], workers=1, lane_items=8,
                                                  peer_backlog=4) as more:  # fmt: skip
        nodes.update(more)
        _meshed(nodes)
        n1, n2 = nodes["n1"], nodes["n2"]
        n2.ask("create", spot="r", type="mp.room")
        n2.ask("create", spot="g", type="mp.gate")
        n1.ask("send", spot="r", sender="first", count=10)
        _until(lambda: n1.ask("total", spot="r") == 10, "n1 knows where r lives")
        n2.ask("hold_one", spot="g")  # n2's one worker waits for "release"
        _until(lambda: n2.ask("busy") == 1, "n2's worker is held")
        sent = n1.ask("send", spot="r", sender="s", count=3000, until_refused=True)
        assert sent > 1024 + 8  # more than the DATA window and the lane: the outbox holds some
        n1.send_line({"op": "stop"})
        n2.ask("release")
        n1.proc.wait(30)
        _until(lambda: n2.ask("total", spot="r") == 10 + sent, f"all {sent} handled")
        assert n2.ask("log", spot="r") == {"first": list(range(10)), "s": list(range(sent))}


def test_a_new_peer_is_accepted_and_served_while_every_worker_is_blocked(
    tmp_path: Path,
) -> None:
    """§16: accepting a peer is infrastructure work: with both workers of n1 held, a node
    that starts now is greeted and its calls are taken (credited, not stalled); they are
    handled once a worker is free."""
    with mesh(tmp_path, ["n1", "n2"], workers=2) as nodes:
        _meshed(nodes)
        n1 = nodes["n1"]
        for spot in ("g1", "g2", "room"):
            n1.ask("create", spot=spot, type="mp.gate" if spot != "room" else "mp.room")
        n1.ask("hold_one", spot="g1")
        n1.ask("hold_one", spot="g2")
        _until(lambda: n1.ask("busy") == 2, "both workers of n1 held")
        n3 = start(tmp_path, "n3")
        try:
            _until(lambda: "n3" in n1.ask("peers"), "n1 accepted n3 while its workers are held")
            n3.ask("send", spot="room", sender="n3", count=500)
            _until(lambda: n3.ask("counters").get("peers_connected", 0) >= 2, "n3 is up with both")
            assert n1.ask("busy") == 2
            n1.ask("release")
            assert n3.ask("total", spot="room") == 500
        finally:
            n3.stop()
            n3.kill()


def test_bad_frames_on_the_mesh_sockets_are_counted_and_never_stop_the_node(
    tmp_path: Path,
) -> None:
    """Garbage, a truncated header, an unknown version or kind, a frame for another
    incarnation, an oversized frame, a HELLO of another mesh or that does not parse, and a
    greeted sender's envelope that does not decode: each dropped and counted; n1 serves on."""
    with mesh(tmp_path, ["n1", "n2"], max_frame=65536) as nodes:
        _meshed(nodes)
        n1, n2 = nodes["n1"], nodes["n2"]
        n1.ask("create", spot="room", type="mp.room")
        store = _store(tmp_path)
        try:
            record = next(r for r in store.nodes() if r.node_id == "n1")
        finally:
            store.close()
        endpoint = MeshEndpoint.parse(record.endpoint)
        target = identity("n1", "@" + endpoint.token)
        header = struct.Struct("!BBQQQ")  # version, kind, incarnation, number, session
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.ROUTING_ID, identity("evil", "#1"))
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint.data)

            def send(*frames: bytes) -> None:
                for _ in range(1000):
                    try:
                        sock.send_multipart([target, *frames], zmq.NOBLOCK)
                        return
                    except zmq.ZMQError:
                        time.sleep(0.005)  # the handshake is not done yet
                raise AssertionError("could not reach n1")

            send(b"garbage")  # one frame, no header
            send(b"\x01\x02", b"truncated header")
            send(header.pack(9, 2, 0, 1, 7), b"unknown version")
            send(header.pack(VERSION, 77, 0, 0, 7), b"unknown kind")
            send(header.pack(VERSION, 1, 0, 0, 7), b"{not json")  # a HELLO that does not parse
            _until(lambda: n1.ask("counters").get("bad_frames", 0) >= 5, "5 bad frames")
            send(header.pack(VERSION, 2, record.incarnation + 5, 1, 7), b"for another incarnation")
            _until(
                lambda: n1.ask("counters").get("frames_wrong_incarnation", 0) >= 1,
                "the frame for another incarnation",
            )
            send(header.pack(VERSION, 2, 0, 1, 7), b"x" * 100_000)  # over max_frame_bytes (64 KiB)
            _until(lambda: n1.ask("counters").get("oversized_frames", 0) >= 1, "oversized")
            other = (
                b'{"node": "evil", "incarnation": 1, "mesh": "other", "endpoint": '
                + f'"{record.endpoint}"'.encode()
                + b"}"
            )
            send(header.pack(VERSION, 1, 0, 0, 7), other)
            _until(lambda: n1.ask("counters").get("peers_refused", 0) >= 1, "other mesh")
            hello = other.replace(b'"other"', b'"main"')
            send(header.pack(VERSION, 1, 0, 0, 7), hello)  # greeted now (its endpoint is n1's own)
            send(header.pack(VERSION, 2, 0, 2, 7), b'{"v": 99, "kind": "send"}')  # unknown version
            send(header.pack(VERSION, 2, 0, 3, 7), b'{"v": 2, "kind": "sen')  # truncated envelope
            _until(lambda: n1.ask("counters").get("bad_envelopes", 0) >= 2, "bad envelopes")
        finally:
            ctx.destroy(linger=0)
        n2.ask("send", spot="room", sender="n2", count=10)
        _until(lambda: n2.ask("total", spot="room") == 10, "n1 still serves")


def test_a_stopped_node_says_goodbye_and_its_peers_see_it_go(tmp_path: Path) -> None:
    """A node's graceful stop tells its peers at once (BYE): they drop it from their peers
    and a new call to it fails with ``Unavailable``, never waits for a deadline."""
    with mesh(tmp_path, ["n1", "n2"]) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="room", type="mp.room")
        nodes["n1"].stop()
        _until(lambda: nodes["n2"].ask("peers") == [], "n2 saw n1 leave")
        with pytest.raises(CommandFailed, match="NotFound"):
            nodes["n2"].ask("total", spot="room")


def test_an_instance_spot_is_cold_activated_once_across_processes(tmp_path: Path) -> None:
    """execution-model §14: three processes call one Instance Spot at once; one node
    activates it and every call reaches that one."""
    with mesh(tmp_path, ["n1", "n2", "n3"]) as nodes:
        _meshed(nodes)
        for n, node in enumerate(nodes.values()):
            node.send_line({"id": 40_000 + n, "op": "where", "spot": "counter-1"})
        answers = [node.wait_answer(40_000 + n, timeout=30) for n, node in
                   enumerate(nodes.values())]  # fmt: skip
        assert all(a["ok"] for a in answers), answers
        assert len({a["value"] for a in answers}) == 1
        assert answers[0]["value"] == _owner(tmp_path, "counter-1")


def test_batches_cross_processes_all_or_none_in_order(tmp_path: Path) -> None:
    with mesh(tmp_path, ["n1", "n2"]) as nodes:
        _meshed(nodes)
        nodes["n1"].ask("create", spot="room", type="mp.room")
        nodes["n2"].ask("batch", spot="room", sender="b", count=1000, size=50)
        assert nodes["n2"].ask("log", spot="room") == {"b": list(range(1000))}


def test_an_actor_joins_a_spot_in_another_process_and_moves_there(tmp_path: Path) -> None:
    """A cross-node Join between processes: the Actor, made in n1's lobby, joins a room of
    n2 and moves there with its state (execution-model §5)."""
    with mesh(tmp_path, ["n1", "n2"]) as nodes:
        _meshed(nodes)
        nodes["n2"].ask("create", spot="room", type="mp.room")
        actor = nodes["n1"].ask("player")
        assert _owner(tmp_path, actor) == "n1"
        nodes["n1"].ask("enter", actor=actor, room="room")
        _until(lambda: _owner(tmp_path, actor) == "n2", "the actor moved to n2")
        assert nodes["n1"].ask("player_where", actor=actor) == "n2:room:['room']"


def test_drain_moves_a_process_s_spots_to_the_others(tmp_path: Path) -> None:
    """``node.drain()`` between processes: every room moves to a member, keeps its state,
    and calls made after the drain reach it where it went."""
    rooms = [f"room-{i}" for i in range(6)]
    with mesh(tmp_path, ["n1", "n2", "n3"]) as nodes:
        _meshed(nodes)
        for room in rooms:
            nodes["n1"].ask("create", spot=room, type="mp.room")
            nodes["n2"].ask("send", spot=room, sender="before", count=10)
        _until(lambda: all(nodes["n2"].ask("total", spot=r) == 10 for r in rooms), "sends handled")
        drained = nodes["n1"].ask("drain")
        assert sorted(drained["moved"]) == rooms
        assert list(drained["stayed"]) == ["mp.lobby@n1"]  # an Entry Spot never moves
        assert {_owner(tmp_path, r) for r in rooms} == {"n2", "n3"}
        for room in rooms:
            nodes["n3"].ask("send", spot=room, sender="after", count=5)
        _until(lambda: all(nodes["n3"].ask("total", spot=r) == 15 for r in rooms), "all handled")
        assert nodes["n2"].ask("log", spot=rooms[0]) == {
            "before": list(range(10)),
            "after": list(range(5)),
        }
