"""Every fault and every discard is counted once, in ``node.counters()``, under a name that
says what it was (issue "Backpressure, and the faults found under load, bad input and
shutdown", item 10):

* a lifecycle callback that raises: ``lifecycle_errors_<callback>`` (``constructor``,
  ``on_create``, ``on_initialize``, ``on_create_actor``, ``on_closing``, ...), logged once;
* an ``on_closing`` cancelled at its deadline: ``closing_overdue``;
* a lifecycle step that never ran (shutdown): ``lifecycle_skipped_<step>``, never an error;
* a message that never ran: ``messages_discarded_at_shutdown``, ``_spot_closed`` or
  ``_not_created`` (a batch counts each of its messages).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import ManualClock


class Block(zlink.Message, type_name="t.fc.block"):
    pass


class Note(zlink.Message, type_name="t.fc.note"):
    pass


class Ask(zlink.Request[str], type_name="t.fc.ask"):
    pass


class Enter(zlink.Message, type_name="t.fc.enter"):
    room: str


class Probe:
    """What the app's callbacks wait on and report to; the test always releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.joined = threading.Event()
        self.seen: list[str] = []

    def hold(self) -> None:
        self.started.set()
        assert self.release.wait(WAIT)


@pytest.fixture
def probe() -> Iterator[Probe]:
    p = Probe()
    yield p
    p.release.set()  # also on failure: no thread of the test stays blocked


def build_app(probe: Probe, fail: str = "") -> zlink.App:
    app = zlink.App("fault-counters")

    @app.user_spot("t.fc.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            if fail == "constructor":
                raise RuntimeError("constructor fails")

        def on_create(self, request: zlink.Message | None) -> None:
            if fail == "on_create":
                raise RuntimeError("on_create fails")

        def on_initialize(self) -> None:
            if fail == "on_initialize":
                raise RuntimeError("on_initialize fails")

        async def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            if fail == "on_closing":
                raise RuntimeError("on_closing fails")
            if fail == "slow_closing":
                try:
                    await self.context.workers.io(probe.hold)
                except zlink.Cancelled:
                    probe.seen.append("cancelled")
                    probe.cancelled.set()
                    raise

        def on_actor_join(self, actor_id: str, request: zlink.Message | None) -> Any:
            if fail == "on_actor_join":
                raise RuntimeError("on_actor_join fails")
            return 42 if fail == "on_actor_join_result" else zlink.ActorJoinResult()

        @zlink.handler
        def block(self, msg: Block) -> None:
            probe.hold()

        @zlink.handler
        def note(self, msg: Note) -> None:
            probe.seen.append("note")

        @zlink.handler
        def ask(self, req: Ask) -> str:
            return "answer"

    @app.instance_spot("t.fc.inst")
    class Inst(zlink.InstanceSpot):
        def on_initialize(self) -> None:
            probe.hold()
            raise RuntimeError("on_initialize fails")

        @zlink.handler
        def note(self, msg: Note) -> None:
            probe.seen.append("note")

        @zlink.handler
        def ask(self, req: Ask) -> str:
            return "answer"

    @app.entry_spot("t.fc.lobby", actor="t.fc.player")
    class Lobby(zlink.EntrySpot):
        def on_create_actor(self, actor: zlink.Actor, request: zlink.Message | None) -> Any:
            if fail == "on_create_actor":
                raise RuntimeError("on_create_actor fails")
            if fail == "on_create_actor_result":
                return 42  # not an ActorCreateResponse
            return None

    @app.actor("t.fc.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            if fail == "actor_constructor":
                raise RuntimeError("constructor fails")

        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            probe.seen.append(type(completion.error).__name__)
            probe.joined.set()

    return app


def _faults(node: zlink.Node) -> dict[str, int]:
    """The counters of faults and discards (what these tests are about)."""
    words = ("error", "skipped", "discarded", "overdue")
    return {k: v for k, v in node.counters().items() if any(w in k for w in words)}


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("step", ["constructor", "on_create", "on_initialize"])
def test_a_spot_lifecycle_callback_that_raises_is_logged_and_counted_once_by_name(
    make_node, probe: Probe, caplog: pytest.LogCaptureFixture, step: str
):
    node = make_node(build_app(probe, fail=step))
    with pytest.raises(zlink.HandlerError):
        node.client().spots.create("t.fc.room").wait(WAIT)
    assert node.wait_idle(WAIT)
    assert _faults(node) == {f"lifecycle_errors_{step}": 1}
    assert len(_errors_logged(caplog)) == 1


@pytest.mark.parametrize(
    ("fail", "counter", "error"),
    [
        ("on_create_actor", "lifecycle_errors_on_create_actor", zlink.HandlerError),
        ("on_create_actor_result", "lifecycle_errors_on_create_actor", zlink.InvalidArgument),
        ("actor_constructor", "lifecycle_errors_constructor", zlink.HandlerError),
    ],
)
def test_an_on_create_actor_that_fails_is_logged_and_counted_once_by_name(
    make_node, probe: Probe, caplog: pytest.LogCaptureFixture, fail: str, counter: str,
    error: type[zlink.ZLinkError],
):  # fmt: skip
    node = make_node(build_app(probe, fail=fail))
    with pytest.raises(error):
        node.client().actors.create("t.fc.player").wait(WAIT)
    assert node.wait_idle(WAIT)
    assert _faults(node) == {counter: 1}
    assert len(_errors_logged(caplog)) == 1


@pytest.mark.parametrize(
    ("fail", "error"),
    [("on_actor_join", "HandlerError"), ("on_actor_join_result", "InvalidArgument")],
)
def test_an_on_actor_join_that_fails_is_logged_and_counted_once_by_name(
    make_node, probe: Probe, caplog: pytest.LogCaptureFixture, fail: str, error: str
):
    node = make_node(build_app(probe, fail=fail))
    client = node.client()
    client.spots.get_or_create("r", "t.fc.room").wait(WAIT)
    actor_id = client.actors.create("t.fc.player").wait(WAIT).actor_id
    client.send_to_actor(actor_id, Enter(room="r")).submit()
    assert probe.joined.wait(WAIT)
    assert node.wait_idle(WAIT)
    assert probe.seen == [error]  # the Actor is told, and stays where it was
    assert _faults(node) == {"lifecycle_errors_on_actor_join": 1}
    assert len(_errors_logged(caplog)) == 1


def test_an_on_closing_that_raises_is_a_lifecycle_error_not_a_handler_error(make_node, probe):
    node = make_node(build_app(probe, fail="on_closing"))
    client = node.client()
    ref = client.spots.create("t.fc.room").wait(WAIT).spot_ref
    assert client.spots.close(ref)
    assert node.wait_idle(WAIT)
    assert _faults(node) == {"lifecycle_errors_on_closing": 1}


def test_an_on_closing_cancelled_at_its_deadline_is_counted_as_overdue_not_as_an_error(
    make_node, probe: Probe, clock: ManualClock
):
    node = make_node(build_app(probe, fail="slow_closing"), closing_timeout=3.0)
    client = node.client()
    ref = client.spots.create("t.fc.room").wait(WAIT).spot_ref
    assert client.spots.close(ref)
    assert probe.started.wait(WAIT)  # on_closing awaits its worker call
    assert node._pool.wait_idle(WAIT)  # and its turn is suspended on it (the gate is done)
    clock.advance(3.0)
    assert probe.cancelled.wait(WAIT)
    probe.release.set()  # the worker call ends; its result is dropped
    assert node.wait_idle(WAIT)
    assert probe.seen == ["cancelled"]
    assert _faults(node) == {"closing_overdue": 1}


def _queue_behind_a_blocked_gate(node: zlink.Node, probe: Probe) -> list[Any]:
    """Spot "a" runs ``Block`` (its worker held by the probe); 3 sends, a request and a batch
    of 3 queue behind it. Returns the request's future."""
    client = node.client()
    client.spots.get_or_create("a", "t.fc.room").wait(WAIT)
    client.send_to_spot("a", Block()).submit()
    assert probe.started.wait(WAIT)
    for _ in range(3):
        client.send_to_spot("a", Note()).submit()
    asked = client.request_to_spot("a", Ask()).timeout(60).future()
    client.send_many_to_spot("a", [Note(), Note(), Note()]).submit()
    return [asked]


def test_lifecycle_steps_and_messages_that_never_ran_at_shutdown_are_skipped_not_errors(
    clock: ManualClock, probe: Probe
):
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=1), clock=clock).start()
    try:
        (asked,) = _queue_behind_a_blocked_gate(node, probe)
        client = node.client()
        created = client.spots.get_or_create("b", "t.fc.room").timeout(60).future()  # queued
        actor = client.actors.create("t.fc.player").timeout(60).future()  # queued
        node.shutdown(timeout=0.2)  # the only worker stays held: nothing queued runs
        assert _faults(node) == {
            "messages_discarded_at_shutdown": 7,  # 3 sends, 1 request, a batch of 3
            "lifecycle_skipped_activation": 1,  # "b"
            "lifecycle_skipped_on_create_actor": 1,
            "lifecycle_skipped_on_closing": 3,  # "a", "b" and the Entry Spot
        }
        for future in (asked, created, actor):
            with pytest.raises(zlink.Unavailable):
                future.result(WAIT)
        assert probe.seen == []
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


def test_messages_that_meet_a_stopping_node_on_the_gate_are_counted_as_discarded_once(
    clock: ManualClock, probe: Probe
):
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=1), clock=clock).start()
    stopper = threading.Thread(target=node.shutdown, kwargs={"timeout": WAIT})
    try:
        (asked,) = _queue_behind_a_blocked_gate(node, probe)
        stopper.start()
        assert node._runtime.stopped_admission.wait(WAIT)
        probe.release.set()  # the gate goes on: what it takes now never runs its handler
        stopper.join(WAIT)
        assert not stopper.is_alive()
        assert _faults(node) == {"messages_discarded_at_shutdown": 7}
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)
        assert probe.seen == []
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


def test_messages_queued_for_a_spot_that_closes_are_counted_as_discarded(make_node, probe):
    node = make_node(build_app(probe))
    (asked,) = _queue_behind_a_blocked_gate(node, probe)
    ref = node._runtime.spots["a"].ref
    assert node.client().spots.close(ref)  # on_closing runs before anything queued
    probe.release.set()
    assert node.wait_idle(WAIT)
    with pytest.raises(zlink.NotFound):
        asked.result(WAIT)
    assert _faults(node) == {"messages_discarded_spot_closed": 7}
    assert probe.seen == []


def test_messages_queued_for_a_spot_that_fails_to_activate_are_counted_as_discarded(
    make_node, probe: Probe
):
    node = make_node(build_app(probe))
    client = node.client()
    asked = [client.request_to_spot("i", Ask()).instance_spot().timeout(60).future()]
    assert probe.started.wait(WAIT)  # on_initialize holds the activation
    client.send_to_spot("i", Note()).instance_spot().submit()
    client.send_to_spot("i", Note()).instance_spot().submit()
    asked.append(client.request_to_spot("i", Ask()).instance_spot().timeout(60).future())
    probe.release.set()  # on_initialize raises now
    for future in asked:  # as the create failed: a HandlerError (errors.md)
        with pytest.raises(zlink.HandlerError, match="on_initialize fails"):
            future.result(WAIT)
    assert node.wait_idle(WAIT)
    assert _faults(node) == {
        "lifecycle_errors_on_initialize": 1,
        "messages_discarded_not_created": 4,
    }
    assert probe.seen == []


# -- a Yield continuation still queued at shutdown (a finding of the shutdown work) ----------
class _Ask(zlink.Request[str], type_name="t.fc.yask"):
    pass


class _Answer(zlink.Request[str], type_name="t.fc.yanswer"):
    pass


class _Hold(zlink.Message, type_name="t.fc.yhold"):
    pass


def test_a_yield_continuation_still_queued_at_shutdown_is_closed_failed_and_counted(
    clock: ManualClock,
):
    started, release, finals = threading.Event(), threading.Event(), []
    answering = threading.Event()
    app = zlink.App("continuations")

    @app.user_spot("t.fc.asker")
    class Asker(zlink.UserSpot):
        @zlink.handler
        async def ask(self, req: _Ask) -> str:
            try:
                await self.context.outbound.request_to_spot("b", _Answer()).yield_()
                return "resumed"
            finally:
                finals.append("finally")

        @zlink.handler
        def hold(self, msg: _Hold) -> None:
            started.set()
            assert release.wait(WAIT)

    @app.user_spot("t.fc.answerer")
    class Answerer(zlink.UserSpot):
        @zlink.handler
        def answer(self, req: _Answer) -> str:
            answering.set()
            assert started.wait(WAIT)  # answers once "a"'s gate is held by hold()
            return "x"

    node = zlink.Node(app, zlink.NodeConfig(workers=2), clock=clock).start()
    try:
        client = node.client()
        client.spots.get_or_create("a", "t.fc.asker").wait(WAIT)
        client.spots.get_or_create("b", "t.fc.answerer").wait(WAIT)
        asked = client.request_to_spot("a", _Ask()).future()
        assert answering.wait(WAIT)  # ask() is suspended in its Yield; b waits for hold()
        client.send_to_spot("a", _Hold()).submit()
        assert started.wait(WAIT)
        assert node.wait_idle(WAIT, busy=1)  # b answered: ask()'s continuation waits in line
        node.shutdown(timeout=0.3)  # hold() keeps the gate: the continuation never runs
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)
        assert finals == ["finally"]  # its coroutine was closed
        assert node.counters()["continuations_discarded_at_shutdown"] == 1
    finally:
        release.set()
        node.shutdown(timeout=WAIT)


def test_a_call_whose_deadline_passes_is_counted_once_as_timed_out(
    make_node, probe, clock: ManualClock
):
    """Found by a probe: no counter said a request had timed out; one that expired while
    it waited for room was counted nowhere at all. ``calls_timed_out``: requests and
    creates whose deadline failed them, once each (a reply that comes later is a late
    reply as well, which says something else: its handler ran for nobody)."""
    node = make_node(build_app(probe), app_lane_items=2)
    client = node.client()
    client.spots.get_or_create("a", "t.fc.room").wait(WAIT)
    client.send_to_spot("a", Block()).submit()
    assert probe.started.wait(WAIT)
    queued = client.request_to_spot("a", Ask()).timeout(2.0).future()  # in the lane (the
    # running Block holds the other place until it ends)
    waiting = client.request_to_spot("a", Ask()).timeout(2.0).future()  # waits for room
    assert node.wait_idle(WAIT, busy=1)
    clock.advance(2.0)
    for f in (queued, waiting):
        with pytest.raises(zlink.DeadlineExceeded):
            f.result(WAIT)
    probe.release.set()
    assert node.wait_idle(WAIT)
    counters = node.counters()
    assert counters.get("calls_timed_out") == 2
    assert counters.get("late_replies") == 1  # the queued one ran, for nobody
