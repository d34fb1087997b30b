"""Faults a fresh-eyes audit found in how a node ends (drain, shutdown; python-api §7-§11),
each reproduced first: a stop never closes a Spot whose move's commit decides where it lives
(it withdraws the moves it can, refuses arrivals still restoring, and waits for the rest), a
drain moves or reports a Spot made as its moves begin, and one-way messages a stop discards
are counted at both ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, held_at

LOG: list[str] = []
BLOCKING, GO = threading.Event(), threading.Event()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    LOG.clear()
    BLOCKING.clear()
    GO.clear()
    yield
    GO.set()


class Enter(zlink.Message, type_name="t.as.enter"):
    room: str


class Where(zlink.Request[str], type_name="t.as.where"):
    pass


class Block(zlink.Message, type_name="t.as.block"):
    pass


JOINED = threading.Event()


# -- a move under way when the node stops ---------------------------------------------------------

from zlink.mesh import wire  # noqa: E402
from zlink.testing import LocalCluster  # noqa: E402


class Add(zlink.Message, type_name="t.as.add"):
    pass


class Total(zlink.Request[int], type_name="t.as.total"):
    pass


def moving_app() -> zlink.App:
    app = zlink.App("audit-stop-moves")

    @app.user_spot("t.as.mroom", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class MRoom(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.total = 0

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.total += 1

        @zlink.handler
        def get(self, req: Total) -> int:
            return self.total

        @zlink.handler
        def block(self, msg: Block) -> None:
            BLOCKING.set()
            assert GO.wait(WAIT)

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            LOG.append(f"on_closing {closing.reason.name} on {self.context.spot_ref.node_rid}")

    return app


def _outcome(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        return exc
    return None


def test_on_closing_never_runs_on_the_source_of_a_move_whose_commit_is_under_way():
    """python-api §11: "No continuation ever runs ... on the source after the move's commit".
    A node's shutdown that begins while the store commits a move of one of its Spots (the
    commit cannot be withdrawn any more) ran on_closing(HOST_SHUTDOWN) on the source, while
    the Spot, with its state, lives on on the target: the application's cleanup ran for a
    Spot that goes on serving elsewhere (e.g. it told its players the room was gone)."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.as.mroom").wait(WAIT)
        for _ in range(3):
            c1.send_to_spot("room", Add()).submit()
        assert c1.request_to_spot("room", Total()).wait(WAIT) == 3
        store = cluster.store
        real = store.transfer
        in_transfer, let_transfer = threading.Event(), threading.Event()

        def slow_transfer(*args: Any) -> Any:
            in_transfer.set()
            assert let_transfer.wait(WAIT)
            return real(*args)

        store.transfer = slow_transfer  # the store is slow to answer the commit
        moved: list[BaseException | None] = []
        mover = threading.Thread(
            target=lambda: moved.append(_outcome(lambda: n1.relocate_spot("room", "node-2", WAIT)))
        )
        mover.start()
        assert in_transfer.wait(WAIT)  # past the point of no return: the commit is asked
        stopper = threading.Thread(target=lambda: n1.shutdown(WAIT))
        stopper.start()
        deadline = time.monotonic() + 1.0
        while not LOG and time.monotonic() < deadline:
            time.sleep(0.002)
        let_transfer.set()
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        store.transfer = real
        owner = store.lookup("room")
        assert owner is not None and owner.owner_node == "node-2", owner  # it moved
        assert n2.client().request_to_spot("room", Total()).wait(WAIT) == 3  # it lives on
        assert LOG == [], f"on_closing ran on the source of a committed move: {LOG}, {moved}"


def test_a_spot_created_while_the_drain_begins_its_moves_is_moved_or_reported():
    """``drain()`` says it refuses calls "from the moment drain() begins" (``not_serving``),
    but the runtime admits creates until after it began every move (``rt.draining`` is set
    only after the loop of ``relocator.start``): one created while the moves begin is
    neither moved nor in ``stayed``, and the shutdown that follows closes it with its state:
    the DrainResult says "0 stayed" while a Spot stayed. It is moved or reported now."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1 = cluster.nodes[0]
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.as.mroom").wait(WAIT)
        relocator = n1._relocator
        real = relocator.start
        made: list[BaseException | None] = []

        def start(*args: Any) -> Any:  # a create another thread makes while moves begin
            if not made:
                made.append(_outcome(
                    lambda: c1.spots.get_or_create("late", "t.as.mroom").wait(WAIT)
                ))  # fmt: skip
            return real(*args)

        relocator.start = start
        assert n1.not_serving() is None
        result = n1.drain(WAIT)
        relocator.start = real
        assert made == [None]  # taken while the moves began
        assert "late" in result.moved or "late" in result.stayed, result
        assert "late" not in n1._runtime.spots or "late" in result.stayed, result


RESTORING, RESTORE = threading.Event(), threading.Event()


class _SlowState(zlink.JsonStateAdapter):
    """Restores as JSON does, once the test lets it (``RESTORE``)."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORING.set()
        assert RESTORE.wait(WAIT)
        super().restore(instance, data)


def slow_restore_app() -> zlink.App:
    app = zlink.App("audit-stop-restore")

    @app.user_spot("t.as.sroom", relocation=zlink.Relocation.preserve_state(_SlowState))
    class SRoom(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.total = 0

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.total += 1

        @zlink.handler
        def get(self, req: Total) -> int:
            return self.total

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            LOG.append(f"on_closing {closing.reason.name} on {self.context.spot_ref.node_rid}")

    return app


def test_a_move_restoring_on_a_node_whose_shutdown_begins_is_refused_and_serves_on():
    """Found by an audit: node-2's stop took a Spot that was restoring there as its own (its
    close_all sealed it CLOSING, on_closing held till it opened), node-1 then committed the
    move, and the room closed with node-2, its state gone, the move reported done. A node
    that stops takes no move (``refuse_arrivals``): one restoring as the stop begins is
    refused, and the Spot serves on on its source with its state (python-api §8, §11)."""
    RESTORING.clear()
    RESTORE.clear()
    with LocalCluster(slow_restore_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.as.sroom").wait(WAIT)
        for _ in range(3):
            c1.send_to_spot("room", Add()).submit()
        assert c1.request_to_spot("room", Total()).wait(WAIT) == 3
        moved: list[BaseException | None] = []
        mover = threading.Thread(
            target=lambda: moved.append(_outcome(lambda: n1.relocate_spot("room", "node-2", WAIT)))
        )
        mover.start()
        stopper = threading.Thread(target=lambda: n2.shutdown(WAIT))
        try:
            assert RESTORING.wait(WAIT)  # node-2 restores it now
            stopper.start()
            deadline = time.monotonic() + WAIT
            while n2._relocator.refusing is None and time.monotonic() < deadline:
                time.sleep(0.002)  # (the stop refuses arrivals first)
        finally:
            RESTORE.set()
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        assert isinstance(moved[0], zlink.Unavailable), moved
        assert c1.request_to_spot("room", Total()).wait(WAIT) == 3  # it serves on node-1
        assert LOG == [], LOG  # no on_closing anywhere: the copy on node-2 never was the Spot
        assert cluster.store.lookup("room").owner_node == "node-1"


def test_a_move_restored_before_the_targets_stop_lands_and_closes_with_it_once():
    """The other side: a move whose target had restored it before its stop began is past its
    point of no return (the source commits on that word): the stop waits for it to land and
    then closes it with the rest, ``on_closing`` once, on the node it lives on, after it
    opened there (an audit found the stop seal the arriving copy CLOSING before it was the
    Spot's)."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.as.mroom").wait(WAIT)
        at, go = held_at(n1, wire.RelocDoneEnvelope)  # node-2 restored; node-1 holds its word
        moved: list[BaseException | None] = []
        mover = threading.Thread(
            target=lambda: moved.append(_outcome(lambda: n1.relocate_spot("room", "node-2", WAIT)))
        )
        mover.start()
        assert at.wait(WAIT)
        stopper = threading.Thread(target=lambda: n2.shutdown(WAIT))
        stopper.start()
        copy = n2._runtime.spots["room"]
        deadline = time.monotonic() + 0.5
        while n2._relocator.refusing is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert copy.state.name == "SEALED"  # the stop waits for it: not closed as it arrives
        go()
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        assert moved == [None]
        assert LOG == ["on_closing HOST_SHUTDOWN on node-2"], LOG


class Ask(zlink.Message, type_name="t.as.ask"):
    pass


class Slow(zlink.Request[str], type_name="t.as.slow"):
    pass


def per_actor_app() -> zlink.App:
    app = zlink.App("audit-stop-per-actor")

    @app.entry_spot("t.as.plobby", actor="t.as.pplayer")
    class PLobby(zlink.EntrySpot):
        pass

    @app.user_spot(
        "t.as.proom", mode=zlink.ExecutionMode.PER_ACTOR, relocation=zlink.Relocation.recreate()
    )
    class PRoom(zlink.UserSpot):
        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            LOG.append(f"room on_closing {closing.reason.name}")

    @app.user_spot("t.as.slow")
    class SlowSpot(zlink.UserSpot):
        @zlink.handler
        def slow(self, req: Slow) -> str:
            BLOCKING.set()
            assert GO.wait(WAIT)
            return "late"

    @app.actor("t.as.pplayer")
    class PPlayer(zlink.Actor):
        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_id

        @zlink.handler
        async def ask(self, msg: Ask) -> None:
            try:
                out = await self.context.outbound.request_to_spot("slow", Slow())
                LOG.append(f"player resumed with {out}")
            except zlink.ZLinkError as exc:
                LOG.append(f"player resumed with {type(exc).__name__}")

        def on_join_completed(self, done: zlink.ActorJoinCompletion) -> None:
            JOINED.set()

    return app


def test_no_member_continuation_of_a_per_actor_room_resumes_after_its_on_closing_at_shutdown():
    """python-api §11 / kotlin-spot-interface: on_closing runs at the all-lane barrier,
    "including all coroutine continuations"; no continuation runs after it. A PER_ACTOR room's
    member awaiting a request when the node stops resumed after the room's on_closing."""
    JOINED.clear()
    node = zlink.Node(per_actor_app(), zlink.NodeConfig(workers=3)).start()
    try:
        client = node.client()
        client.spots.get_or_create("room", "t.as.proom").wait(WAIT)
        client.spots.get_or_create("slow", "t.as.slow").wait(WAIT)
        pid = client.actors.create("t.as.pplayer").wait(WAIT).actor_id
        client.send_to_actor(pid, Enter(room="room")).submit()
        assert JOINED.wait(WAIT)
        assert client.request_to_actor(pid, Where()).wait(WAIT).startswith("room")
        client.send_to_actor(pid, Ask()).submit()
        assert BLOCKING.wait(WAIT)  # the member awaits the slow Spot's reply
        stopper = threading.Thread(target=lambda: node.shutdown(WAIT))
        stopper.start()
        deadline = time.monotonic() + 1.0  # (an on_closing that does not wait comes in ms)
        while not LOG and time.monotonic() < deadline:
            time.sleep(0.002)
        GO.set()
        stopper.join(2 * WAIT)
        assert "room on_closing HOST_SHUTDOWN" in LOG, LOG
        closing_at = LOG.index("room on_closing HOST_SHUTDOWN")
        assert not LOG[closing_at + 1 :], f"a member continuation ran after on_closing: {LOG}"
    finally:
        GO.set()
        node.shutdown(WAIT)


def test_sends_from_a_peer_discarded_at_the_targets_shutdown_are_counted_at_both_ends():
    """python-api §9: "a message admitted at the source is either handled at the target, or
    counted as dropped, with its reason, at both ends". One-way messages node-1 sent to a Spot
    of node-2, queued there when node-2 stops, are discarded (messages_discarded_at_shutdown on
    node-2) and node-1 is never told: it counts nothing."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1, c2 = n1.client(), n2.client()
        c2.spots.get_or_create("room", "t.as.mroom").wait(WAIT)
        assert c1.request_to_spot("room", Total()).wait(WAIT) == 0  # node-1 routes to node-2
        c2.send_to_spot("room", Block()).submit()
        assert BLOCKING.wait(WAIT)
        for _ in range(5):  # admitted at node-1, handed to node-2, queued behind the block
            c1.send_to_spot("room", Add()).wait(WAIT)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # until node-2 queued them
            room = next((o for o in n2.status().owners if o.owner == "room"), None)
            if room is not None and room.app_items >= 5:
                break
            time.sleep(0.005)
        stopper = threading.Thread(target=lambda: n2.shutdown(WAIT))
        stopper.start()
        while not n2._runtime.stopping and time.monotonic() < deadline:
            time.sleep(0.002)
        GO.set()
        stopper.join(2 * WAIT)
        n1.wait_idle(WAIT)
        here = n2.counters()
        there = n1.counters()
        print("n2", here, "n1", there)
        assert here.get("messages_discarded_at_shutdown") == 5, here
        told = sum(v for k, v in there.items() if k.startswith("remote_sends_dropped"))
        assert told == 5, f"node-1 was not told of its 5 sends dropped at node-2's stop: {there}"
