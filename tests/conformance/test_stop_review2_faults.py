"""Faults a second review of the stop's move handling found, each reproduced first: a Spot
whose move ended unresolved gets no on_closing on its source; a PER_ACTOR Spot's members follow
a shell the stop let commit; the stop waits for the close a moving Spot gets as its move ends;
a signaled move asked for as the stop withdraws the moves is refused."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import zlink
from tests.conformance.test_stop_review_faults import CLOSED_LOG, moving_app
from tests.conformance.test_stop_review_faults import RAdd as UAdd
from tests.conformance.test_stop_review_faults import RTotal as UTotal
from tests.conftest import WAIT
from zlink.testing import LocalCluster


class UEnter(zlink.Message, type_name="t.ru.enter"):
    room: str


class UMark(zlink.Message, type_name="t.ru.mark"):
    n: int


class UMarks(zlink.Request[list[int]], type_name="t.ru.marks"):
    pass


class UWhere(zlink.Request[str], type_name="t.ru.where"):
    pass


JOINED = threading.Semaphore(0)


class UHall(zlink.UserSpot):
    def on_closing(self, closing: zlink.SpotClosingContext) -> None:
        CLOSED_LOG.append(f"{closing.reason.name} on {self.context.spot_ref.node_rid}")


class ULobby(zlink.EntrySpot):
    pass


class UPlayer(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.marks: list[int] = []

    @zlink.handler
    def enter(self, msg: UEnter) -> None:
        self.context.join(msg.room).defer()

    @zlink.handler
    def mark(self, msg: UMark) -> None:
        self.marks.append(msg.n)

    @zlink.handler
    def get_marks(self, req: UMarks) -> list[int]:
        return self.marks

    @zlink.handler
    def where(self, req: UWhere) -> str:
        return f"{self.context._rt.node_id}:{self.context.spot_id}"

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        JOINED.release()


def hall_app() -> zlink.App:
    app = zlink.App("review-u")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.ru.hall", mode=zlink.ExecutionMode.PER_ACTOR)(UHall)
    app.entry_spot("t.ru.lobby", actor="t.ru.player")(ULobby)
    app.actor("t.ru.player", relocation=state)(UPlayer)
    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    CLOSED_LOG.clear()
    while JOINED.acquire(blocking=False):
        pass


def _spy_withdraw_all(node: Any) -> threading.Event:
    """An event set once the stop's ``withdraw_all`` returned (the code under test runs as
    it is)."""
    relocator = node._relocator
    real = relocator.withdraw_all
    done = threading.Event()

    def withdraw_all(error: Any) -> Any:
        out = real(error)
        done.set()
        return out

    relocator.withdraw_all = withdraw_all
    return done


def _outcome(fn: Any, out: list[Any]) -> None:
    try:
        out.append(fn())
    except BaseException as exc:  # noqa: BLE001
        out.append(exc)


def test_per_actor_members_follow_a_shell_whose_commit_the_stop_waited_for():
    """A PER_ACTOR Spot's shell move is past its point of no return as the node stops
    (withdraw_all leaves it to the store's answer; _end_moves waits for it). The store
    commits: the shell is node-2's. Its member Actors must follow (source.py: "the shell's
    move is never rolled back"; each member then moves on its own). 4d7f0d4's
    ``Outbound.stopping`` refuses their seal: each member stays on the stopping node-1
    and is discarded with it, its state lost, the Spot on node-2 without its members."""
    with LocalCluster(hall_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("hall", "t.ru.hall").wait(WAIT)
        pid = c1.actors.create("t.ru.player").wait(WAIT).actor_id
        c1.send_to_actor(pid, UEnter(room="hall")).submit()
        assert JOINED.acquire(timeout=WAIT)
        c1.send_to_actor(pid, UMark(n=7)).wait(WAIT)
        assert c1.request_to_actor(pid, UMarks()).wait(WAIT) == [7]
        store = cluster.store
        real = store.transfer
        in_transfer, let_transfer = threading.Event(), threading.Event()

        def slow_transfer(name: str, *args: Any) -> Any:
            if name == "hall":
                in_transfer.set()
                assert let_transfer.wait(WAIT)
            return real(name, *args)

        store.transfer = slow_transfer
        moved: list[Any] = []
        mover = threading.Thread(
            target=_outcome, args=(lambda: n1.relocate_spot("hall", "node-2", WAIT), moved)
        )
        mover.start()
        assert in_transfer.wait(WAIT)  # the shell's commit is under way
        withdrawn = _spy_withdraw_all(n1)
        stopper = threading.Thread(target=lambda: n1.shutdown(4.0))
        stopper.start()
        assert withdrawn.wait(WAIT)
        let_transfer.set()  # the store commits the shell to node-2
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        store.transfer = real
        row = store.lookup(pid)
        assert row is not None and row.owner_node == "node-2", (moved, row)
        assert n2.client().request_to_actor(pid, UMarks()).wait(WAIT) == [7], moved


# -- a close close_all leaves to a move's end is not waited for -----------------------------------


def test_the_stop_waits_for_the_close_a_moving_spot_gets_once_its_move_ends():
    """close_all leaves a Spot whose commit is under way to ``after_move``; wait_moves
    returns once the move's ``done`` is set, but the close itself (``_close_at_stop``) only
    then goes to the infrastructure thread's queue, and nothing of the stop waits for that
    queue (``_settle`` waits for the pool and workers only). The infrastructure thread busy
    a moment longer (other envelopes ahead in its queue; here half a second at most, cut short
    once the stop reached ``discard_queued``; the stop's graceful time has > 1 s left) and
    the close comes after the stop discarded what was queued and shut the pool: on_closing
    never runs (python-api §7/§11)."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, _n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rt.mroom").wait(WAIT)
        assert c1.request_to_spot("room", UTotal()).wait(WAIT) == 0
        store = cluster.store
        real = store.transfer
        in_transfer, let_transfer = threading.Event(), threading.Event()

        def refused_transfer(*args: Any) -> Any:
            in_transfer.set()
            assert let_transfer.wait(WAIT)
            raise RuntimeError("the store refused the write")  # not made: still node-1's

        store.transfer = refused_transfer
        moved: list[Any] = []
        mover = threading.Thread(
            target=_outcome, args=(lambda: n1.relocate_spot("room", "node-2", WAIT), moved)
        )
        mover.start()
        assert in_transfer.wait(WAIT)
        out = next(iter(n1._relocator._out.values()))
        rt = n1._runtime
        real_discard = rt.discard_queued
        discarding = threading.Event()

        def discard_queued() -> int:
            discarding.set()
            return real_discard()

        rt.discard_queued = discard_queued

        def busy() -> None:  # other infrastructure work queued ahead of the close: half a
            discarding.wait(0.5)  # second at most, well inside the stop's graceful time

        out.done.add_callback(lambda _v, _e: n1._infra.submit(busy))
        real_close_all = rt.close_all
        closed_all = threading.Event()

        def close_all(budget: float) -> None:
            real_close_all(budget)
            closed_all.set()

        rt.close_all = close_all
        stopper = threading.Thread(target=lambda: n1.shutdown(3.0))
        stopper.start()
        assert closed_all.wait(WAIT)  # the Spot was left to its move's end
        let_transfer.set()  # the store refuses: the Spot stays here, READY
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        store.transfer = real
        assert CLOSED_LOG == ["HOST_SHUTDOWN on node-1"], (CLOSED_LOG, moved)


# -- a commit the store cannot answer for as the node stops ---------------------------------------


def test_a_spot_whose_commit_the_store_made_unconfirmed_gets_no_on_closing_on_its_source():
    """The store makes the commit's write, then fails to confirm it, and cannot say either
    (``_settle_write``: UNKNOWN). Stopping, ``_committed`` asks no more and ends the move
    (``_finish``), the Spot still SEALED here. Before 4d7f0d4 close_all skipped it (the
    commit decides: an audit found on_closing run on the source of a move the commit then
    completed); now close_all's ``after_move`` closes it: on_closing(HOST_SHUTDOWN) runs on
    node-1 while the store gives the Spot to node-2, which opens it (``source_down``:
    the store says it committed) and runs it on."""
    with LocalCluster(moving_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rt.mroom").wait(WAIT)
        c1.send_to_spot("room", UAdd()).wait(WAIT)
        assert c1.request_to_spot("room", UTotal()).wait(WAIT) == 1
        store = cluster.store
        real_transfer, real_lookup = store.transfer, store.lookup
        in_transfer, let_transfer = threading.Event(), threading.Event()
        blind = threading.Event()

        def made_unconfirmed(*args: Any) -> Any:
            in_transfer.set()
            assert let_transfer.wait(WAIT)
            real_transfer(*args)  # made ...
            blind.set()
            raise ConnectionError("the store's connection dropped")  # ... not confirmed

        def lookup(name: str) -> Any:
            if blind.is_set() and name == "room" and not settled.is_set():
                settled.set()
                raise ConnectionError("the store cannot say")
            return real_lookup(name)

        settled = threading.Event()
        store.transfer, store.lookup = made_unconfirmed, lookup
        moved: list[Any] = []
        mover = threading.Thread(
            target=_outcome, args=(lambda: n1.relocate_spot("room", "node-2", WAIT), moved)
        )
        mover.start()
        assert in_transfer.wait(WAIT)
        rt = n1._runtime
        real_close_all = rt.close_all
        closed_all = threading.Event()

        def close_all(budget: float) -> None:
            real_close_all(budget)
            closed_all.set()

        rt.close_all = close_all
        stopper = threading.Thread(target=lambda: n1.shutdown(3.0))
        stopper.start()
        assert closed_all.wait(WAIT)  # the Spot was left to its commit
        let_transfer.set()
        mover.join(2 * WAIT)
        stopper.join(2 * WAIT)
        store.transfer, store.lookup = real_transfer, real_lookup
        row = store.lookup("room")
        assert row is not None and row.owner_node == "node-2", row  # the write stands
        deadline = time.monotonic() + WAIT
        while "room" not in n2._runtime.spots and time.monotonic() < deadline:
            time.sleep(0.01)
        assert CLOSED_LOG == [], (CLOSED_LOG, moved, "room" in n2._runtime.spots)


# -- an APPLICATION_SIGNALED move asked for as the stop withdraws the moves -----------------------


def signaled_app() -> zlink.App:
    app = zlink.App("review-u-signaled")

    @app.user_spot(
        "t.ru.table",
        relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter),
        relocation_coordination=zlink.RelocationCoordination.APPLICATION_SIGNALED,
    )
    class Table(zlink.UserSpot):
        @zlink.handler
        def get(self, req: UTotal) -> int:
            return 0

    return app


def test_a_signaled_move_asked_for_as_the_stop_withdraws_the_moves_is_refused():
    """``Outbound.start`` reads ``stopping`` with no lock; an APPLICATION_SIGNALED move is
    then only recorded in ``_wanted`` (``_begin``), which does not look again: one asked for
    just as ``withdraw_all`` runs (which empties ``_wanted`` once) stays wanted through the
    stop, and its caller, told nothing, waits for its whole timeout (its deadline on the
    infrastructure heap was dropped by the stop) instead of hearing ``Unavailable``."""
    with LocalCluster(signaled_app(), nodes=2, workers=2) as cluster:
        n1, _n2 = cluster.nodes
        c1 = n1.client()
        c1.spots.get_or_create("table", "t.ru.table").wait(WAIT)
        assert c1.request_to_spot("table", UTotal()).wait(WAIT) == 0
        relocator = n1._relocator
        transport = relocator.router.transport
        real_reachable = transport.reachable
        withdrawn = _spy_withdraw_all(n1)
        stoppers: list[threading.Thread] = []

        def reachable(peer: str) -> bool:  # (between start's check and _begin)
            if not stoppers:
                stopper = threading.Thread(target=lambda: n1.shutdown(3.0))
                stoppers.append(stopper)
                stopper.start()
                assert withdrawn.wait(WAIT)
            return real_reachable(peer)

        transport.reachable = reachable
        moved: list[Any] = []
        began = time.monotonic()
        mover = threading.Thread(
            target=_outcome, args=(lambda: n1.relocate_spot("table", "node-2", 4.0), moved)
        )
        mover.start()
        mover.join(2 * WAIT)
        took = time.monotonic() - began
        for stopper in stoppers:
            stopper.join(2 * WAIT)
        transport.reachable = real_reachable
        assert relocator._wanted == {}, relocator._wanted
        assert isinstance(moved[0], zlink.Unavailable) and took < 3.5, (moved, took)
