"""Per-sender order across a move, for calls that wait for room when the seal comes
(kotlin-spot-interface relocation: "Nothing accepted is lost or run twice", per-sender order;
python-api §9, §11).

A call from another node that finds the Spot's lane full waits for room there (a
``RoomWaiter``). The seal ends those waits and routes each again, to be parked for the move.
A later call of the same sender that the node takes meanwhile (on its infrastructure thread)
must be parked behind them, never ahead: the hook below holds the sealing thread between
ending the waits and routing the first of them, and lets the later call in.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import zlink
from tests.conformance.test_relocation import Add, Total, build_app
from tests.conftest import WAIT
from zlink.executor import RoomWaiter
from zlink.testing import LocalCluster, run_until_idle

LATER_GRACE = 1.0  # seconds the hook gives the later call to be parked first (it must not be)


def _parked(rt: Any, spot_id: str) -> int:
    out = rt.relocator._out_ids.get(spot_id)
    return 0 if out is None else len(out.parked)


def test_a_call_taken_while_a_seal_ends_the_waits_for_room_is_parked_behind_them() -> None:
    with LocalCluster(build_app(), nodes=3, workers=2, app_lane_items=4) as cluster:
        n1, n2, n3 = cluster.nodes
        n1.client().spots.get_or_create("room", "t.rl.room").wait(WAIT)
        run_until_idle(n1, WAIT)  # the activation's last turn settles first
        rt1 = n1._runtime
        act = rt1.spots["room"]
        assert act.gate._flag.acquire(False)  # hold the gate: nothing of the room runs
        local, remote = n1.client(), n2.client()
        for _ in range(4):  # the lane is full
            local.send_to_spot("room", Add()).submit()
        for seq in range(3):  # node-2's calls wait for room on node-1, in order
            remote.send_to_spot("room", Add(sender=2, seq=seq)).wait(WAIT)
        lanes = act.owner.lanes
        deadline = time.monotonic() + WAIT
        while len(lanes.app_waiters or ()) < 3:
            assert time.monotonic() < deadline, "node-2's calls never waited for room"
            time.sleep(0.005)
        first: RoomWaiter = lanes.app_waiters[0]  # type: ignore[index]
        notify = first.notify
        later_sent = threading.Event()

        def hooked(verdict: Any) -> None:
            # the seal ended the waits; before the first is routed again, node-2's next call
            # reaches node-1 (its infrastructure thread diverts it for the move)
            before = _parked(rt1, "room")
            send = threading.Thread(  # (node-2's own thread: this one holds node-1's locks)
                target=lambda: remote.send_to_spot("room", Add(sender=2, seq=3)).wait(WAIT)
            )
            send.start()
            send.join(WAIT)
            later_sent.set()
            until = time.monotonic() + LATER_GRACE
            while _parked(rt1, "room") == before and time.monotonic() < until:
                time.sleep(0.005)
            notify(verdict)

        first.notify = hooked
        moving = rt1.relocator.start(act, "node-3")
        assert later_sent.is_set()
        rt1.pool.submit(act.gate._run)  # the barrier turn runs; the room moves
        moving.wait(WAIT)
        cluster.wait_idle(WAIT)
        room = n3._runtime.spots["room"].instance
        assert room.seen["2"] == [0, 1, 2, 3]
        assert room.disorder == 0
        assert room.total == 8


def test_calls_that_meet_a_move_wait_for_room_once_as_many_as_a_lane_holds_are_parked() -> None:
    """A probe: calls that met a sealed Spot were parked without any bound, each ``wait()``
    returning at once (107,718 in half a second); at the commit the target's infrastructure
    thread re-admitted them for seconds, missed its lease renewal, fenced itself and dropped
    them all. The park holds what the Spot's lane holds; past it a caller waits for room,
    first come first served (python-api §9: ``wait()`` blocks until admitted), ``submit()`` is
    refused, and what was accepted is handled once, in order, after the move."""
    with LocalCluster(build_app(), nodes=2, workers=2, app_lane_items=4) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("room", "t.rl.room").wait(WAIT)
        run_until_idle(n1, WAIT)
        rt1 = n1._runtime
        act = rt1.spots["room"]
        assert act.gate._flag.acquire(False)  # hold the gate: the barrier cannot run yet
        moving = rt1.relocator.start(act, "node-2")
        local = n1.client()
        assert _taken_before_a_wait(local, sender=1) == 4  # as many as the lane holds
        with pytest.raises(zlink.ResourceExhausted):
            local.send_to_spot("room", Add(sender=1, seq=99)).submit()
        late = local.send_to_spot("room", Add(sender=1, seq=4)).future()  # waits, in order
        assert not late.done()
        rt1.pool.submit(act.gate._run)  # the barrier turn runs; the room moves
        moving.wait(WAIT)
        late.result(WAIT)  # admitted once the move went on
        cluster.wait_idle(WAIT)
        room = n2._runtime.spots["room"].instance
        assert room.seen["1"] == [0, 1, 2, 3, 4]
        assert room.disorder == 0
        for node in cluster.nodes:
            counters = node.counters()
            assert not counters.get("self_fenced")
            assert not [k for k, v in counters.items() if v and "sends_dropped" in k], counters


def _taken_before_a_wait(client: Any, sender: int) -> int:
    """How many sends of ``sender`` (seq 0, 1, ...) to "room" are taken, each ``wait()``
    returning at once, before one waits past 50 ms (``DeadlineExceeded``: nothing of it was
    queued). Bounded: unbounded parking took all 1,000."""
    for seq in range(1_000):
        try:
            client.send_to_spot("room", Add(sender=sender, seq=seq)).wait(0.05)
        except zlink.DeadlineExceeded:
            return seq
    return 1_000


def _moving_room(cluster: LocalCluster, target: str) -> tuple[Any, Any, Any]:
    """node-1's room, its gate held (the barrier cannot run yet), its move to ``target`` begun:
    (runtime, act, the move's completion)."""
    n1 = cluster.nodes[0]
    n1.client().spots.get_or_create("room", "t.rl.room").wait(WAIT)
    run_until_idle(n1, WAIT)
    rt1 = n1._runtime
    act = rt1.spots["room"]
    assert act.gate._flag.acquire(False)
    return rt1, act, rt1.relocator.start(act, target)


def test_a_batch_to_a_moving_spot_is_parked_whole_or_waits_whole() -> None:
    """A review of the bounded park: a batch to a moving Spot went message by message, so one
    past the park's room was refused after the first ones were parked ("nothing was queued",
    yet they ran). A batch is all or none (python-api §8): it waits for the move as one."""
    with LocalCluster(build_app(), nodes=2, workers=2, app_lane_items=4) as cluster:
        n1, n2 = cluster.nodes
        rt1, act, moving = _moving_room(cluster, "node-2")
        client = n1.client()
        for seq in range(2):
            client.send_to_spot("room", Add(sender=9, seq=seq)).submit()
        with pytest.raises(zlink.ResourceExhausted):  # no room for all four: none is parked
            client.send_many_to_spot("room", [Add(sender=1, seq=s) for s in range(4)]).submit()
        waits = client.send_many_to_spot("room", [Add(sender=2, seq=s) for s in range(4)])
        waiting = waits.future()
        assert not waiting.done()
        rt1.pool.submit(act.gate._run)
        moving.wait(WAIT)
        waiting.result(WAIT)
        cluster.wait_idle(WAIT)
        room = n2._runtime.spots["room"].instance
        assert room.seen.get("1") is None
        assert room.seen["2"] == [0, 1, 2, 3] and room.seen["9"] == [0, 1]


def test_callers_waiting_for_a_move_are_bounded_like_waiters_for_room() -> None:
    """A review: nothing capped the callers waiting for a move (python-api §9: waiters are
    bounded per target, ``ResourceExhausted`` past them); 20,000 futures piled up."""
    with LocalCluster(build_app(), nodes=2, workers=2, app_lane_items=4,
                      admission_waiters=8) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        rt1, act, moving = _moving_room(cluster, "node-2")
        client = n1.client()
        futures = [client.send_to_spot("room", Add(sender=1, seq=s)).future() for s in range(12)]
        with pytest.raises(zlink.ResourceExhausted):
            client.send_to_spot("room", Add(sender=1, seq=12)).future()
        rt1.pool.submit(act.gate._run)
        moving.wait(WAIT)
        for future in futures:
            future.result(WAIT)
        cluster.wait_idle(WAIT)
        assert n2._runtime.spots["room"].instance.seen["1"] == list(range(12))


def test_a_peer_request_that_gives_up_waiting_for_a_move_leaves_no_backlog() -> None:
    """A review: a request from another node that waited for a move and passed its deadline
    kept one item of that node's backlog for good; 256 of them paused the node forever."""
    with LocalCluster(build_app(), nodes=3, workers=2, app_lane_items=4) as cluster:
        n1, n2, _ = cluster.nodes
        rt1, act, moving = _moving_room(cluster, "node-3")
        for seq in range(4):
            n1.client().send_to_spot("room", Add(sender=1, seq=seq)).submit()  # the park is full
        with pytest.raises(zlink.DeadlineExceeded):
            n2.client().request_to_spot("room", Total()).timeout(0.3).wait(WAIT)
        rt1.pool.submit(act.gate._run)
        moving.wait(WAIT)
        cluster.wait_idle(WAIT)
        assert rt1.router.backlog() == {}


class Poke(zlink.Message, type_name="t.ro.poke"):
    pass


class Note(zlink.Message, type_name="t.ro.note"):
    pass


def _self_wait_app(go: threading.Event, result: dict[str, Any], done: threading.Event) -> Any:
    app = zlink.App("self-wait")

    @app.user_spot("t.ro.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        @zlink.handler
        async def poke(self, msg: Poke) -> None:
            assert go.wait(WAIT)
            try:
                await self.context.outbound.send_to_spot(self.context.spot_id, Note())
                result["outcome"] = "admitted"
            except zlink.ZLinkError as exc:
                result["outcome"] = type(exc).__name__
            done.set()

        @zlink.handler
        def note(self, msg: Note) -> None:
            pass

    return app


def test_a_handler_that_awaits_a_send_to_its_own_moving_spot_is_refused_at_once() -> None:
    """A review: with the park full, a handler of the moving Spot awaiting a send to its own
    Spot kept its turn, which the move's barrier needs, until the admission deadline (30 s).
    As for a Spot that is not moving, such a wait is ``InvalidOperation`` at once (§9)."""
    go, done = threading.Event(), threading.Event()
    result: dict[str, Any] = {}
    with LocalCluster(_self_wait_app(go, result, done), nodes=2, workers=2,
                      app_lane_items=4) as cluster:  # fmt: skip
        n1, _ = cluster.nodes
        client = n1.client()
        client.spots.get_or_create("room", "t.ro.room").wait(WAIT)
        run_until_idle(n1, WAIT)
        rt1 = n1._runtime
        act = rt1.spots["room"]
        client.send_to_spot("room", Poke()).submit()  # it runs, and keeps the gate
        deadline = time.monotonic() + WAIT
        while act.gate.running is None:
            assert time.monotonic() < deadline, "the poke never ran"
            time.sleep(0.005)
        moving = rt1.relocator.start(act, "node-2")
        for _ in range(4):
            client.send_to_spot("room", Note()).submit()  # the park is full
        go.set()
        assert done.wait(WAIT), "the handler's await was not refused at once"
        assert result["outcome"] == "InvalidOperation"
        moving.wait(WAIT)


RESTORING, RESTORE_GO = threading.Event(), threading.Event()
RESTORE_FAILS: list[bool] = []  # non-empty: every restore fails, once let go


class _SlowRestore(zlink.JsonStateAdapter):
    """Holds the target's restore turn until ``RESTORE_GO``: the Spot stays arriving there."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORING.set()
        assert RESTORE_GO.wait(WAIT)
        if RESTORE_FAILS:
            raise RuntimeError("cannot restore")
        super().restore(instance, data)


def _slow_restore_app() -> zlink.App:
    from tests.conformance.test_relocation import Room

    app = build_app()
    slow = zlink.Relocation.preserve_state(_SlowRestore)
    app.user_spot("t.ro.slow", relocation=slow)(type("R9", (Room,), {}))
    return app


def _arriving_on_node_2(cluster: LocalCluster) -> tuple[Any, Any]:
    """node-1's room moving to node-2, held in its restore there: (node-1's runtime, the
    move's completion)."""
    n1 = cluster.nodes[0]
    n1.client().spots.get_or_create("room", "t.ro.slow").wait(WAIT)
    run_until_idle(n1, WAIT)
    rt1 = n1._runtime
    moving = rt1.relocator.start(rt1.spots["room"], "node-2")
    assert RESTORING.wait(WAIT)
    return rt1, moving


@pytest.fixture
def _arrival_held() -> Any:
    RESTORING.clear()
    RESTORE_GO.clear()
    RESTORE_FAILS.clear()
    yield
    RESTORE_GO.set()


@pytest.mark.usefixtures("_arrival_held")
def test_calls_made_where_a_spot_arrives_are_bounded_like_the_source_park() -> None:
    """The target side of the bounded park: calls made on the target node while a Spot
    arrives there (restore and commit under way) were kept without bound, each ``wait()``
    returning at once. They are kept up to what the Spot's lane holds; past it a caller
    waits for the Spot to open, in order (python-api §9), ``submit()`` and a batch that does
    not fit are refused whole (§8), and what was accepted runs once, in order."""
    with LocalCluster(_slow_restore_app(), nodes=2, workers=2, app_lane_items=4) as cluster:
        _, moving = _arriving_on_node_2(cluster)
        local = cluster.nodes[1].client()
        assert _taken_before_a_wait(local, sender=2) == 4  # as many as the lane holds
        with pytest.raises(zlink.ResourceExhausted):
            local.send_to_spot("room", Add(sender=2, seq=99)).submit()
        with pytest.raises(zlink.ResourceExhausted):  # whole: none of it is kept
            local.send_many_to_spot("room", [Add(sender=3, seq=s) for s in range(2)]).submit()
        late = local.send_to_spot("room", Add(sender=2, seq=4)).future()  # waits, in order
        batch = local.send_many_to_spot("room", [Add(sender=4, seq=s) for s in range(3)])
        batch_waits = batch.future()
        asked = local.request_to_spot("room", Total()).timeout(WAIT).future()
        assert not late.done() and not batch_waits.done() and not asked.done()
        RESTORE_GO.set()
        moving.wait(WAIT)
        late.result(WAIT)
        batch_waits.result(WAIT)
        assert asked.result(WAIT) == 8  # behind every send that waited before it
        cluster.wait_idle(WAIT)
        room = cluster.nodes[1]._runtime.spots["room"].instance
        assert room.seen["2"] == [0, 1, 2, 3, 4]
        assert room.seen["4"] == [0, 1, 2] and "3" not in room.seen
        assert room.disorder == 0
        for node in cluster.nodes:
            counters = node.counters()
            assert not [k for k, v in counters.items() if v and "dropped" in k], counters


@pytest.mark.usefixtures("_arrival_held")
def test_calls_waiting_for_an_arrival_that_fails_go_to_the_source_in_order() -> None:
    """The move is aborted (its restore fails past its retries, python-api §11): the calls
    kept on the target and those that waited there go to the source, which serves again,
    in their order, each wait or request with its own outcome; nothing is lost."""
    with LocalCluster(_slow_restore_app(), nodes=2, workers=2, app_lane_items=4) as cluster:
        rt1, moving = _arriving_on_node_2(cluster)
        local = cluster.nodes[1].client()
        for seq in range(4):
            local.send_to_spot("room", Add(sender=2, seq=seq)).wait(WAIT)
        late = local.send_to_spot("room", Add(sender=2, seq=4)).future()
        batch = local.send_many_to_spot("room", [Add(sender=4, seq=s) for s in range(3)]).future()
        asked = local.request_to_spot("room", Total()).timeout(WAIT).future()
        assert not late.done() and not batch.done() and not asked.done()
        RESTORE_FAILS.append(True)
        RESTORE_GO.set()
        with pytest.raises(zlink.StateIncompatible):
            moving.wait(WAIT)
        late.result(WAIT)
        batch.result(WAIT)
        assert asked.result(WAIT) == 8
        cluster.wait_idle(WAIT)
        room = rt1.spots["room"].instance  # served on the source again
        assert room.seen["2"] == [0, 1, 2, 3, 4]
        assert room.seen["4"] == [0, 1, 2]
        assert room.disorder == 0
        for node in cluster.nodes:
            counters = node.counters()
            assert not [k for k, v in counters.items() if v and "dropped" in k], counters


class Text(zlink.Message, type_name="t.ro.text"):
    text: str


def _text_app() -> zlink.App:
    from tests.conformance.test_relocation import Room

    app = zlink.App("text")

    @app.user_spot("t.ro.texts", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Texts(Room):
        @zlink.handler
        def text(self, msg: Text) -> None:
            self.total += 1

    return app


def test_a_move_counts_what_it_parks_in_bytes_as_they_travel() -> None:
    """The park's byte bound counted payload characters: a text beyond ASCII takes more
    bytes than characters on the wire (UTF-8), so a park could hold twice the lane's bytes."""
    with LocalCluster(_text_app(), nodes=2, workers=2, app_lane_bytes=3_000) as cluster:
        n1 = cluster.nodes[0]
        client = n1.client()
        client.spots.get_or_create("room", "t.ro.texts").wait(WAIT)
        run_until_idle(n1, WAIT)
        rt1 = n1._runtime
        act = rt1.spots["room"]
        assert act.gate._flag.acquire(False)  # hold the gate: the barrier cannot run yet
        moving = rt1.relocator.start(act, "node-2")
        wide = "é" * 1_000  # 1,000 characters, 2,000 bytes
        client.send_to_spot("room", Text(text=wide)).wait(WAIT)  # the first always parks
        with pytest.raises(zlink.DeadlineExceeded):  # 4,000 bytes: past the lane's 3,000
            client.send_to_spot("room", Text(text=wide)).wait(0.05)
        rt1.pool.submit(act.gate._run)
        moving.wait(WAIT)
        cluster.wait_idle(WAIT)
        assert cluster.nodes[1]._runtime.spots["room"].instance.total == 1


def test_a_call_that_meets_a_move_end_and_the_next_begin_is_kept_for_the_next() -> None:
    """CI on 3.13t: a sender found the room sealed, the relocator found no move (the move
    had just ended), and by the state's next look the room was sealed again by the next
    move: the send failed with ``Unavailable`` ("sealed"), 2 runs in 30 of the 100-moves
    stress. A call that meets a seal again looks again: it is kept for the next move."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        rt1, act, first = _moving_room(cluster, "node-2")  # sealed, at its barrier
        relocator = rt1.relocator
        divert = relocator.divert
        moves: list[Any] = []

        def between_moves(*args: Any, **kwargs: Any) -> bool:
            if not moves:  # the first move ends, the next begins: this look saw the gap
                assert relocator.withdraw("room", first, zlink.DeadlineExceeded("test"))
                moves.append(relocator.start(act, "node-2"))
                return False
            return bool(divert(*args, **kwargs))

        relocator.divert = between_moves
        n1.client().send_to_spot("room", Add(sender=1, seq=0)).submit()  # kept, not refused
        relocator.divert = divert
        rt1.pool.submit(act.gate._run)  # the barrier turn runs; the room moves
        moves[0].wait(WAIT)
        cluster.wait_idle(WAIT)
        assert n2._runtime.spots["room"].instance.seen["1"] == [0]
