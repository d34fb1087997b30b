"""Faults a review of the stop, drain and Channel fixes found, each reproduced first: a
peer's one-way message a stop discards at its gate is counted at its origin too; a Spot whose
commit the store refuses while the node stops still gets its on_closing; a move begun after the
stop withdrew the moves is refused; a Channel's lanes and gate show in the node's status."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster

BLOCKING, GO = threading.Event(), threading.Event()
RAN: list[int] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    BLOCKING.clear()
    GO.clear()
    RAN.clear()
    yield
    GO.set()


class RBlock(zlink.Message, type_name="t.rt.block"):
    pass


class RWork(zlink.Message, type_name="t.rt.work"):
    n: int


class RPing(zlink.Request[str], type_name="t.rt.ping"):
    pass


class RLobby(zlink.EntrySpot):
    pass


class RPlayer(zlink.Actor):
    @zlink.handler
    def block(self, msg: RBlock) -> None:
        BLOCKING.set()
        assert GO.wait(WAIT)

    @zlink.handler
    def work(self, msg: RWork) -> None:
        RAN.append(msg.n)

    @zlink.handler
    def ping(self, req: RPing) -> str:
        return "pong"


def actor_app() -> zlink.App:
    app = zlink.App("review-t-actors")
    app.entry_spot("t.rt.lobby", actor="t.rt.player")(RLobby)
    app.actor("t.rt.player")(RPlayer)
    return app


def _queued(node: Any, owner: str, n: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        row = next((o for o in node.status().owners if o.owner == owner), None)
        if row is not None and row.app_items >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{owner} never queued {n}")


def test_sends_from_a_peer_to_an_actor_discarded_at_the_targets_stop_are_told_to_the_origin():
    """python-api §9 (dropped: counted at both ends). 79f17d7 tells the origin only in
    ``discard_jobs``; a queued one-way message a gate takes after ``stop_admission`` fails
    ``Discarded`` in ``SendJob.invoke`` and ``Runtime.finish_message`` counts it
    (``messages_discarded_at_shutdown``) without ``router.tell_dropped``: an Actor's
    queue (no ``on_closing`` drains it) is the plain case."""
    with LocalCluster(actor_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1, c2 = n1.client(), n2.client()
        c2.actors.create("t.rt.player", actor_id="p1").wait(WAIT)
        assert c1.request_to_actor("p1", RPing()).wait(WAIT) == "pong"  # n1 routes to n2
        c2.send_to_actor("p1", RBlock()).submit()
        assert BLOCKING.wait(WAIT)
        for n in range(5):
            c1.send_to_actor("p1", RWork(n=n)).wait(WAIT)
        _queued(n2, "p1", 5)
        stopper = threading.Thread(target=lambda: n2.shutdown(WAIT))
        stopper.start()
        deadline = time.monotonic() + WAIT
        while not n2._runtime.stopping and time.monotonic() < deadline:
            time.sleep(0.002)
        GO.set()
        stopper.join(2 * WAIT)
        n1.wait_idle(WAIT)
        here = n2.counters()
        assert RAN == []
        assert here.get("messages_discarded_at_shutdown") == 5, here

        def told() -> int:
            there = n1.counters()
            return sum(v for k, v in there.items() if k.startswith("remote_sends_dropped"))

        until(lambda: told() == 5, "node-1 told of its 5 sends dropped at node-2's stop")


# -- a move whose commit the store refuses after the stop's wait for it -------------------------

CLOSED_LOG: list[str] = []


class RAdd(zlink.Message, type_name="t.rt.add"):
    pass


class RTotal(zlink.Request[int], type_name="t.rt.total"):
    pass


def moving_app() -> zlink.App:
    app = zlink.App("review-t-moves")

    @app.user_spot("t.rt.mroom", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class MRoom(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.total = 0

        @zlink.handler
        def add(self, msg: RAdd) -> None:
            self.total += 1

        @zlink.handler
        def get(self, req: RTotal) -> int:
            return self.total

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSED_LOG.append(f"{closing.reason.name} on {self.context.spot_ref.node_rid}")

    return app


def test_a_spot_whose_commit_the_store_refuses_after_the_stops_wait_gets_on_closing():
    """python-api §7/§11: every Spot of a node that stops gets on_closing(HOST_SHUTDOWN) once.
    ``Node._end_moves`` waits for a committing move half the graceful time at most; then
    ``Closing.close_all`` skips the Spot (``relocator.moving``). A store that then refuses the
    commit (NOT_MADE: the Spot is still node-1's) has ``_committed`` reopen it here
    (``_reopen(after_relay=True)``): READY again on a node past its close_all, so its
    on_closing never runs (and what it queues is discarded unrun)."""
    CLOSED_LOG.clear()
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, _n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rt.mroom").wait(WAIT)
        c1.send_to_spot("room", RAdd()).submit()
        assert c1.request_to_spot("room", RTotal()).wait(WAIT) == 1
        store = cluster.store
        real = store.transfer
        in_transfer, let_transfer = threading.Event(), threading.Event()

        def refused_transfer(*args: Any) -> Any:
            in_transfer.set()
            assert let_transfer.wait(WAIT)
            raise RuntimeError("the store refused the write")  # not made: still node-1's

        store.transfer = refused_transfer
        mover = threading.Thread(
            target=lambda: _outcome(lambda: n1.relocate_spot("room", "node-2", WAIT))
        )
        mover.start()
        assert in_transfer.wait(WAIT)  # the commit is under way: not withdrawn by the stop
        rt = n1._runtime
        real_close_all, closed_all = rt.close_all, threading.Event()

        def close_all(budget: float) -> None:
            real_close_all(budget)
            closed_all.set()

        rt.close_all = close_all
        stopper = threading.Thread(target=lambda: n1.shutdown(2.0))  # waits ~0.9 s for it
        stopper.start()
        assert closed_all.wait(WAIT)  # past _end_moves and close_all, which left the Spot
        let_transfer.set()
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        store.transfer = real
        assert CLOSED_LOG == ["HOST_SHUTDOWN on node-1"], CLOSED_LOG


def _outcome(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test reads it
        return exc
    return None


# -- a Channel's gate and lanes in node.status() -------------------------------------------------


class RNote(zlink.Message, type_name="t.rt.note"):
    n: int


def test_a_channels_lanes_and_gate_are_in_node_status(make_node):
    """e1afaf5 gives a Channel a gate and bounded lanes (they fill, refuse, make callers wait,
    and a turn can hold the gate across an await), and ``type_statuses`` now counts it, but
    ``Runtime.owner_statuses`` still lists Spots, timers and Actors only: a Channel whose
    gate is stuck, with records queued behind it, is invisible in ``node.status().owners``
    (``/status``, ``zlink inspect``)."""
    entered = threading.Event()
    app = zlink.App("review-t-channel-status")

    @app.channel("t.rt.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def note(self, msg: RNote) -> None:
            if msg.n == 0:
                entered.set()
                assert GO.wait(WAIT)

    node = make_node(app)
    client = node.client()
    for n in range(4):
        client.send("t.rt.api", RNote(n=n)).submit()
    assert entered.wait(WAIT)
    try:
        row = next((o for o in node.status().owners if o.owner == "t.rt.api"), None)
        assert row is not None, [o.owner for o in node.status().owners]
        assert row.gate_busy and row.app_items >= 3, row
    finally:
        GO.set()


# -- a move begun after the stop withdrew the moves ------------------------------------------------

from tests.conftest import held_at  # noqa: E402
from zlink.mesh import wire  # noqa: E402


def test_a_move_begun_after_the_stop_withdrew_the_moves_does_not_skip_on_closing():
    """79f17d7: ``Node._end_moves`` withdraws the moves leaving the node once
    (``withdraw_all``), and ``Closing.close_all`` then skips every Spot still moving. Nothing
    refuses a move begun in between (``relocate_spot`` from another thread, a drain's late
    pass): ``Outbound.start`` seals the Spot, ``close_all`` skips it, and the stop ends
    with the Spot sealed here, its on_closing never run (python-api §7, §11: a stopping node
    runs on_closing(HOST_SHUTDOWN) for its Spots; a move it cannot finish is withdrawn)."""
    CLOSED_LOG.clear()
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rt.mroom").wait(WAIT)
        assert c1.request_to_spot("room", RTotal()).wait(WAIT) == 0
        _at_target, let_go = held_at(n2, wire.RelocEnvelope)  # the move stays under way
        relocator = n1._relocator
        real = relocator.withdraw_all
        moves: list[BaseException | None] = []
        movers: list[threading.Thread] = []

        def withdraw_all(error: Any) -> Any:
            out = real(error)
            mover = threading.Thread(
                target=lambda: moves.append(
                    _outcome(lambda: n1.relocate_spot("room", "node-2", 1.0))
                )
            )
            mover.start()  # an application thread asks for a move as the stop goes on
            movers.append(mover)
            deadline = time.monotonic() + WAIT
            while not relocator.leaving("room") and not moves and time.monotonic() < deadline:
                time.sleep(0.002)
            return out

        relocator.withdraw_all = withdraw_all
        n1.shutdown(3.0)
        let_go()
        for mover in movers:
            mover.join(2 * WAIT)
        left = n1._runtime.spots.get("room")
        assert CLOSED_LOG == ["HOST_SHUTDOWN on node-1"], (
            CLOSED_LOG,
            moves,
            None if left is None else left.state,
        )  # (on the reviewed code: [], the mover told DeadlineExceeded, the Spot left SEALED)
