"""``node.drain()``: relocate everything that can move away, then stop admission
(python-api "node.drain()"; kotlin-spot-interface relocation paragraphs; §14)."""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Add(zlink.Message, type_name="t.dr.add"):
    pass


class Total(zlink.Request[int], type_name="t.dr.total"):
    pass


class Block(zlink.Message, type_name="t.dr.block"):
    pass


class Slow(zlink.Request[str], type_name="t.dr.slow"):
    pass


BLOCKING, GO = threading.Event(), threading.Event()


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0

    @zlink.handler
    def block(self, msg: Block) -> None:
        BLOCKING.set()
        assert GO.wait(WAIT)

    @zlink.handler
    def add(self, msg: Add) -> None:
        self.total += 1

    @zlink.handler
    def slow(self, req: Slow) -> str:
        BLOCKING.set()
        assert GO.wait(WAIT)
        return "done"

    @zlink.handler
    def get(self, req: Total) -> int:
        return self.total


def build_app() -> zlink.App:
    app = zlink.App("drain")
    app.user_spot("t.dr.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))(
        Room
    )
    app.user_spot("t.dr.fixed", relocation=zlink.Relocation.disabled())(type("F", (Room,), {}))
    return app


def test_drain_moves_every_movable_spot_round_robin_and_says_why_the_rest_stayed(
    clock: ManualClock,
):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        c1 = n1.client()
        rooms = [f"room-{i}" for i in range(4)]
        for room in rooms:
            c1.spots.get_or_create(room, "t.dr.room").wait(WAIT)
            c1.send_to_spot(room, Add()).submit()
        c1.spots.get_or_create("fixed", "t.dr.fixed").wait(WAIT)
        c3 = n3.client()
        assert c3.request_to_spot("room-0", Total()).wait(WAIT) == 1  # node-3 routes to node-1

        result = n1.drain(timeout=WAIT)

        assert result.moved == rooms
        assert set(result.stayed) == {"fixed"}
        assert "disabled" in result.stayed["fixed"]
        owners = [cluster.store.lookup(room).owner_node for room in rooms]
        assert owners == ["node-2", "node-3", "node-2", "node-3"]
        for room in rooms:  # state kept; node-3's old route relays through the drained node
            assert c3.request_to_spot(room, Total()).wait(WAIT) == 1
        with pytest.raises(zlink.Unavailable):  # admission on the drained node is stopped
            c1.send_to_spot("room-1", Add()).submit()
        with pytest.raises(zlink.Unavailable):
            c1.spots.get_or_create("new", "t.dr.room").wait(WAIT)
        assert n2.client().request_to_spot("fixed", Total()).wait(WAIT) == 0  # stayed, serves


def test_drain_with_the_store_down_moves_nothing_and_says_why(clock: ManualClock, monkeypatch):
    """A service probe: SIGINT to a node whose Redis store was down crashed ``zlink run`` with
    a 355-line traceback from the drain's look at the members. No move can commit without the
    store: every Spot stays, with the reason, and the stop goes on."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        n1, _n2 = cluster.nodes
        n1.client().spots.get_or_create("room", "t.dr.room").wait(WAIT)

        def down() -> list[object]:
            raise zlink.Unavailable("the location store redis://127.0.0.1:1/0 failed: refused")

        monkeypatch.setattr(cluster.store, "nodes", down)
        result = n1.drain(timeout=WAIT)
        assert result.moved == []
        assert "location store" in result.stayed["room"]


def test_drain_without_other_nodes_moves_nothing_and_stops_admission(make_node):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("room", "t.dr.room").wait(WAIT)
    result = node.drain(timeout=WAIT)
    assert result.moved == [] and result.stayed == {"room": "no other node to move to"}
    with pytest.raises(zlink.Unavailable):
        client.send_to_spot("room", Add()).submit()


def test_timers_tick_no_more_once_the_node_drains(make_node, clock):
    """Issue "Running ZLink as a service": timers stop before the drain (a draining node
    refuses the calls its handlers make, so ticks there only fail); their periods stay owed
    and go with a Spot that moves."""
    import threading

    import zlink as zl

    app = zl.App("drain-timers")
    ticks: list[int] = []
    ticked = threading.Event()

    @app.user_spot("t.dt.clock")
    class Clock(zl.UserSpot):
        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0)

        @zl.timer_handler("beat")
        def beat(self, tick: zl.TimerTick) -> None:
            ticks.append(tick.sequence)
            ticked.set()

    node = make_node(app)
    node.client().spots.get_or_create("c", "t.dt.clock").wait(5)
    clock.advance(1.0)
    assert ticked.wait(5)
    node.wait_idle(5)
    assert ticks == [1]
    result = node.drain(timeout=5)
    assert result.stayed and not result.moved  # one node: nowhere to move to
    for _ in range(3):
        clock.advance(1.0)
        node.wait_idle(5)
    assert ticks == [1]  # nothing ran while it drained


def test_a_drained_node_says_it_is_draining_not_shutting_down(make_node):
    """Issue 15 review: every call made on a drained node (send, request, batch, create) is
    refused with an ``Unavailable`` that names the drain, so an operator is not told the node
    is stopping when it only drains; after ``shutdown()`` it says "shutting down"."""
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("room", "t.dr.room").wait(WAIT)
    node.drain(timeout=WAIT)
    calls = {
        "send": lambda: client.send_to_spot("room", Add()).submit(),
        "send with an option": lambda: (
            client.send_to_spot("room", Add()).metadata("k", "v").submit()
        ),
        "request": lambda: client.request_to_spot("room", Total()).wait(WAIT),
        "batch": lambda: client.send_many_to_spot("room", [Add(), Add()]).submit(),
        "get_or_create": lambda: client.spots.get_or_create("new", "t.dr.room").wait(WAIT),
        "create": lambda: client.spots.create("t.dr.room").wait(WAIT),
    }
    for what, call in calls.items():
        with pytest.raises(zlink.Unavailable) as refused:
            call()
        assert str(refused.value).startswith("node node-1 is draining: "), what
        assert "shutting down" not in str(refused.value), what
    node.shutdown(WAIT)
    for call in calls.values():
        with pytest.raises(zlink.Unavailable, match="node node-1 is shutting down"):
            call()


def test_a_fenced_node_says_it_fenced_itself_for_a_batch_too(make_node):
    """A node that fenced itself (lease not renewed) refuses with that reason on every path;
    the batch path used to report its drain flag as "shutting down"."""
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("room", "t.dr.room").wait(WAIT)
    rt = node._runtime
    rt.fenced, rt.draining = True, True  # what the membership's fencing sets (node._MeshEvents)
    try:
        for call in (
            lambda: client.send_to_spot("room", Add()).submit(),
            lambda: client.send_many_to_spot("room", [Add()]).submit(),
            lambda: client.spots.get_or_create("new", "t.dr.room").wait(WAIT),
        ):
            with pytest.raises(zlink.Unavailable, match="fenced itself"):
                call()
    finally:
        rt.fenced, rt.draining = False, False


def test_drain_waits_for_a_move_already_under_way_instead_of_leaving_the_spot_behind():
    """A fresh-eyes probe: ``zlink run`` on SIGTERM drains, then shuts down. A Spot whose move
    was under way (sealed, waiting for its barrier) was reported as "stayed" (not ready), and
    the shutdown then closed it: its state and queue were lost, though the move would have
    finished a moment later. Drain now waits for that move, within its own timeout."""
    BLOCKING.clear()
    GO.clear()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.dr.room").wait(WAIT)
        for _ in range(3):
            c1.send_to_spot("room", Add()).submit()
        c1.send_to_spot("room", Block()).submit()
        assert BLOCKING.wait(WAIT)
        for _ in range(20):  # queued behind the running turn: they move with the room
            c1.send_to_spot("room", Add()).submit()
        moved: list[BaseException | None] = []
        mover = threading.Thread(
            target=lambda: moved.append(_outcome(lambda: n1.relocate_spot("room", "node-2", WAIT)))
        )
        mover.start()
        assert _until(lambda: "room" in n1._relocator._out_ids)  # sealed, at its barrier
        drained: list[zlink.DrainResult] = []
        drainer = threading.Thread(target=lambda: drained.append(n1.drain(WAIT)))
        drainer.start()
        GO.set()
        drainer.join(WAIT)
        mover.join(WAIT)
        assert moved == [None]
        assert drained[0].moved == ["room"] and drained[0].stayed == {}
        n1.shutdown(WAIT)
        assert n2.client().request_to_spot("room", Total()).wait(WAIT) == 23


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        return exc
    return None


def _until(check):  # type: ignore[no-untyped-def]
    done = threading.Event()
    for _ in range(2000):  # another thread's progress: bounded polling
        if check():
            return True
        done.wait(0.005)
    return False


def test_a_drain_never_moves_a_spot_onto_a_node_that_is_draining_itself():
    """A probe (a rolling stop: SIGTERM to two nodes 50 ms apart): the second node's drain
    moved Spots onto the first, which was draining too and then closed them at its shutdown:
    their state was lost, though a third node was there, and both drains said "0 stayed".
    A node refuses moves to it once it drains (``Unavailable``), and a drain tries the
    Spot's move on the next node (as Orleans never places on a silo that shuts down)."""
    BLOCKING.clear()
    GO.clear()
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        c1, c2 = n1.client(), n2.client()
        c1.spots.get_or_create("held", "t.dr.room").wait(WAIT)
        c1.send_to_spot("held", Block()).submit()  # node-1's drain waits for its barrier
        assert BLOCKING.wait(WAIT)
        rooms = ["room-a", "room-b", "room-c", "room-d"]
        for room in rooms:
            c2.spots.get_or_create(room, "t.dr.room").wait(WAIT)
            c2.send_to_spot(room, Add()).submit()
        drained1: list[zlink.DrainResult] = []
        first = threading.Thread(target=lambda: drained1.append(n1.drain(WAIT)))
        first.start()
        try:
            assert _until(lambda: n1._runtime.draining)  # node-1 drains, and is held there
            result = n2.drain(WAIT)
        finally:
            GO.set()
            first.join(WAIT)
        assert result.moved == rooms and result.stayed == {}
        assert {cluster.store.lookup(room).owner_node for room in rooms} == {"node-3"}
        assert drained1[0].moved == ["held"]
        n1.shutdown(WAIT)
        n2.shutdown(WAIT)
        c3 = n3.client()
        for room in rooms:  # every state kept
            assert c3.request_to_spot(room, Total()).wait(WAIT) == 1


def test_a_request_a_drained_node_relays_is_answered_through_its_shutdown():
    """Found by a probe: ``drain()`` then ``shutdown()`` is the graceful stop (docs/guide
    mesh.md), yet a request the drained node relayed to the room's new node, still running
    there, failed ``Unavailable`` ("node-1 shut down") at its caller on a healthy node, its
    handler having run; the reply, come back to the stopped relay, was counted
    undeliverable (a caller that retries on ``Unavailable`` runs it twice). A graceful stop
    now waits, within its time, for the answers to the requests it took from peers, and
    sends them on; and a request relayed by a stale route keeps its reply route since (its
    reply goes straight to its caller's node, told where it is awaited), so the drained
    node's stop has nothing of it to wait for."""
    BLOCKING.clear()
    GO.clear()
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1 = cluster.nodes[0]
        n1.client().spots.get_or_create("a", "t.dr.room").wait(WAIT)
        for node in cluster.nodes[1:]:  # every other node's route: node-1
            assert node.client().request_to_spot("a", Total()).wait(WAIT) == 0
        assert n1.drain(timeout=WAIT).moved == ["a"]
        owner = cluster.store.lookup("a").owner_node
        caller = next(n for n in cluster.nodes[1:] if n.node_id != owner)
        asked = caller.client().request_to_spot("a", Slow()).timeout(WAIT).future()
        assert BLOCKING.wait(WAIT)  # relayed by node-1, running on the owner
        stopped = threading.Event()
        stopper = threading.Thread(target=lambda: (n1.shutdown(WAIT), stopped.set()))
        stopper.start()
        stopper.join(WAIT)  # (it keeps no part of the relayed request: no wait for it)
        assert stopped.is_set()
        GO.set()
        assert asked.result(WAIT) == "done"
        assert caller.counters().get("relayed_replies_rebound", 0) >= 1  # (the relay's notice
        # and the taker's: the relay's is passed over when it comes second)
        assert not n1.counters().get("calls_failed_at_shutdown")
        assert not any(n.counters().get("replies_undeliverable") for n in cluster.nodes)
