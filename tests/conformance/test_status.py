"""Status (§13, §16 "A slow status subscriber does not reduce message processing speed")."""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import ManualClock


class Hit(zlink.Message, type_name="t.ss.hit"):
    pass


class Count(zlink.Request[int], type_name="t.ss.count"):
    pass


class Tock(zlink.Message, type_name="t.ss.tock"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("status")

    @app.user_spot("t.ss.box")
    class Box(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.n = 0

        @zlink.handler
        def hit(self, msg: Hit) -> None:
            self.n += 1

        @zlink.handler
        def count(self, req: Count) -> int:
            return self.n

        @zlink.handler
        def tock(self, msg: Tock) -> None:
            self.context.timers.register("t", 5.0)

        @zlink.timer_handler("t")
        def on_t(self, tick: zlink.TimerTick) -> None:
            pass

    return app


def test_status_shows_lanes_gate_timers_workers_and_counters(make_node):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("b", "t.ss.box").wait(WAIT)
    client.send_to_spot("b", Tock()).submit()
    node.wait_idle(WAIT)
    gate = node._runtime.spots["b"].gate
    assert gate._flag.acquire(False)  # hold the gate so the queue is visible
    for _ in range(3):
        client.send_to_spot("b", Hit()).submit()
    status = node.status()
    gate._flag.release()
    box = next(o for o in status.owners if o.owner == "b")
    assert (box.kind, box.type, box.state) == ("spot", "t.ss.box", "ready")
    assert box.app_items == 3 and box.app_bytes == 3 * (2 + 256) and box.gate_busy
    assert box.timers == ["t"]
    assert status.workers == 2 and status.spots == 1
    assert isinstance(status, zlink.NodeStatus)
    assert status.model_dump_json()  # a pydantic model: JSON for the command line and admin


def test_a_slow_status_subscriber_does_not_slow_message_processing_and_is_never_cut_off(
    make_node, clock: ManualClock
):
    node = make_node(build_app(), status_interval=1.0)
    client = node.client()
    client.spots.get_or_create("b", "t.ss.box").wait(WAIT)
    stuck, caught, got = threading.Event(), threading.Event(), []
    target = [float("inf")]

    def slow(status: zlink.NodeStatus) -> None:
        got.append(status.at)
        if status.at >= target[0]:
            caught.set()
        assert stuck.wait(WAIT)  # the subscriber blocks on its first status

    sub = node.subscribe_status(slow, capacity=2)
    for _ in range(20):  # 20 publications while the subscriber is stuck
        clock.advance(1.0)
        node.wait_idle(WAIT)  # the infrastructure stays quiet: publishing never blocks
    for _ in range(1000):  # and messages are processed as usual meanwhile
        client.send_to_spot("b", Hit()).submit()
    assert client.request_to_spot("b", Count()).wait(WAIT) == 1000
    assert sub.pending <= sub.capacity + 1  # bounded: two slots plus the latest of one source
    assert sub.coalesced >= 17
    target[0] = clock.now()
    stuck.set()
    assert caught.wait(WAIT)  # it catches up with the latest status of its source...
    assert len(got) <= 1 + sub.capacity + 1  # ...without being handed all 20


def test_bad_subscriptions_are_invalid_argument(make_node):
    node = make_node(build_app())
    with pytest.raises(zlink.InvalidArgument):
        node.subscribe_status(print, capacity=0)
    with pytest.raises(zlink.InvalidArgument):
        node.subscribe_status("not callable")  # type: ignore[arg-type]


def test_status_shows_each_timer_interval_next_due_sequence_and_late_ticks(make_node, clock):
    """Issue "Running ZLink as a service": ``zlink inspect timers`` shows each timer's
    interval, when its next tick is due, its sequence and its late ticks (node.status())."""
    import zlink as zl

    app = zl.App("status-timers")
    ticked = threading.Event()

    @app.user_spot("t.st.clock")
    class Clock(zl.UserSpot):
        def on_initialize(self) -> None:
            self.context.timers.register("beat", 2.0)

        @zl.timer_handler("beat")
        def beat(self, tick: object) -> None:
            ticked.set()

    node = make_node(app)
    node.client().spots.get_or_create("c", "t.st.clock").wait(5)
    clock.advance(2.0)
    assert ticked.wait(5)
    node.wait_idle(5)
    (owner,) = [o for o in node.status().owners if o.owner.startswith("c")]
    (timer,) = owner.timer_details
    assert (timer.name, timer.interval, timer.sequence, timer.late_ticks) == ("beat", 2.0, 1, 0)
    assert 0.0 < timer.next_due_in <= 2.0
    import datetime

    status = node.status()  # wall-clock times, ISO 8601 in UTC
    now = datetime.datetime.fromisoformat(status.time)
    started = datetime.datetime.fromisoformat(status.started)
    assert now.tzinfo is not None and started <= now
