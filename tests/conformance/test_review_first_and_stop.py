"""Review of 5be44df (a move clears the first record in the store's ``transfer``) and 195ab2d
(``Inbound.settle_at_stop``): each test here failed on the code as reviewed (python-api §9: a
call handled at its target or counted dropped, never both; a request answered once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, hold_transfer
from zlink.testing import LocalCluster

WHERE_RAN: list[str] = []
MARKS: list[str] = []
DONE: list[Any] = []
ENTERING, ENTER_GO = threading.Event(), threading.Event()
SLOW_CLOSE, CLOSE_GO = threading.Event(), threading.Event()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    for seen in (WHERE_RAN, MARKS, DONE):
        seen.clear()
    for event in (ENTERING, ENTER_GO, SLOW_CLOSE, CLOSE_GO):
        event.clear()
    yield
    ENTER_GO.set()
    CLOSE_GO.set()


def _until(check: Callable[[], bool], what: str, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def _node(context: Any) -> str:
    return str(context._rt.node_id)  # type: ignore[attr-defined]


class Enter(zlink.Message, type_name="t.rfs.enter"):
    room: str
    hold: bool = False


class Mark(zlink.Message, type_name="t.rfs.mark"):
    pass


class Where(zlink.Request[str], type_name="t.rfs.where"):
    pass


class Hall(zlink.UserSpot):
    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        return zlink.ActorJoinResult()

    def on_closing(self, closing: Any) -> None:
        if SLOW_CLOSE.is_set():  # an on_closing that outlasts the stop's graceful part
            CLOSE_GO.wait(WAIT)


class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.n = 0

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()
        if msg.hold:  # what is sent meanwhile is queued behind this turn: it moves
            ENTERING.set()
            assert ENTER_GO.wait(WAIT)

    @zlink.handler
    def mark(self, msg: Mark) -> None:
        MARKS.append(_node(self.context))

    @zlink.handler
    def where(self, msg: Where) -> str:
        WHERE_RAN.append(_node(self.context))
        return _node(self.context)

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        DONE.append(completion)


def build_app() -> zlink.App:
    app = zlink.App("review-first-and-stop")
    keep = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.rfs.hall", relocation=keep)(Hall)
    app.entry_spot("t.rfs.lobby", actor="t.rfs.player")(type("Lobby", (zlink.EntrySpot,), {}))
    app.actor("t.rfs.player", relocation=keep)(Player)
    return app


def _kept_at(node: zlink.Node) -> int:
    relocator = node._runtime.relocator  # type: ignore[attr-defined]
    with relocator._lock:
        return sum(len(inc.kept) for inc in relocator._in.values())


def _queued_at(node: zlink.Node) -> int:
    relocator = node._runtime.relocator  # type: ignore[attr-defined]
    with relocator._lock:
        return sum(1 for inc in relocator._in.values() if inc.restored)


def _told(counters: dict[str, int]) -> int:
    return sum(v for k, v in counters.items() if k.startswith("remote_sends_dropped"))


# -- F1: settle_at_stop asks the store about the SHELL of an Actor's move (a cross-node Join) --


def _join_then_target_stops(
    before: Callable[[Any, str], Any],
    after: Callable[[Any, str], Any],
    check: Callable[[zlink.Node, Any], None],
    hall_stays: str,
) -> None:
    """An Actor on node-1 joins "hall" on node-2 (a cross-node Join: the Actor moves, its
    Spot is node-2's). node-2 restores it; node-1's commit (``transfer`` of the Actor) waits
    in the store. ``before(c1, pid)`` runs while the Actor's Enter turn still runs (so what
    it sends is queued and moves), ``after(c1, pid)`` once the commit waits (node-1 relays
    it). node-2 stops, its hall's row still its own at ``settle_at_stop`` (``hall_stays``:
    its close's release fails in the store, or its ``on_closing`` is slow); then the commit
    is let go: node-2 left the store, it is refused, and node-1 serves its originals."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        store = cluster.store
        c1 = n1.client()
        n2.client().spots.get_or_create("hall", "t.rfs.hall").wait(WAIT)
        pid = c1.actors.create("t.rfs.player").wait(WAIT).actor_id
        entered, go = hold_transfer(store, pid)
        real_release = store.release

        def release(spot_id: str, *rest: Any) -> Any:
            # the store fails node-2's close of the hall at its stop
            if spot_id == "hall" and hall_stays == "release fails":
                raise zlink.Unavailable("the store failed this release")
            return real_release(spot_id, *rest)

        store.release = release  # type: ignore[method-assign]
        results: list[Any] = []
        if hall_stays == "slow on_closing":
            SLOW_CLOSE.set()
        try:
            c1.send_to_actor(pid, Enter(room="hall", hold=True)).submit()
            assert ENTERING.wait(WAIT)
            results.append(before(c1, pid))
            ENTER_GO.set()
            assert entered.wait(WAIT), "the commit was not reached"
            results.append(after(c1, pid))
            n2.shutdown(3.0)
        finally:
            go.set()
            CLOSE_GO.set()
        _until(lambda: bool(DONE), "the Join completed")
        n1.wait_idle(WAIT)
        check(n1, results)


HALL_STAYS = pytest.mark.parametrize("hall_stays", ["release fails", "slow on_closing"])


@HALL_STAYS
def test_a_request_relayed_for_a_joining_actor_is_not_answered_by_its_stopping_target(
    hall_stays: str,
) -> None:
    """195ab2d asks the store, at node-2's stop, about ``inc.spot`` of each uncommitted
    arrival: for an Actor's move (a cross-node Join, a PER_ACTOR member) that is the SHELL,
    which node-2 owns, so ``ours_at_stop`` is set though the Actor's row is still node-1's.
    The request node-1 relayed is then answered ``Unavailable`` by node-2 while node-1 keeps
    and runs its original once the store refuses the commit."""

    def after(c1: Any, pid: str) -> Any:
        where = c1.request_to_actor(pid, Where()).future()
        return where

    def check(_n1: zlink.Node, results: list[Any]) -> None:
        _until(lambda: WHERE_RAN == ["node-1"], f"node-1 ran its original: {WHERE_RAN}")
        try:
            answer: Any = results[1].result(WAIT)
        except zlink.ZLinkError as exc:
            answer = exc
        assert answer == "node-1", (
            f"the request ran on {WHERE_RAN} but its caller was answered {answer!r}"
        )

    _join_then_target_stops(lambda c1, pid: None, after, check, hall_stays)


@HALL_STAYS
def test_a_send_queued_for_a_joining_actor_is_not_told_dropped_by_its_stopping_target(
    hall_stays: str,
) -> None:
    """The moved-queue side of the same fault: a one-way message queued behind the Actor's
    Enter turn moves with it; at node-2's stop ``uncommitted(pid)`` is ``False`` (the shell
    is node-2's), so the discard counts it dropped at both ends (node-1 told) while node-1,
    the commit refused, runs the original it kept: handled and counted dropped."""

    def before(c1: Any, pid: str) -> Any:
        return c1.send_to_actor(pid, Mark()).wait(WAIT)

    def check(n1: zlink.Node, _results: list[Any]) -> None:
        _until(lambda: MARKS == ["node-1"], f"node-1 ran its original: {MARKS}")
        n1.wait_idle(WAIT)
        dropped = {k: v for k, v in n1.counters().items() if "dropped" in k}
        assert _told(n1.counters()) == 0, (
            f"node-1 handled the message and was told it was dropped: {dropped}"
        )

    _join_then_target_stops(before, lambda c1, pid: None, check, hall_stays)
