"""Status (§13, §16 "A slow status subscriber does not reduce message processing speed")."""

from __future__ import annotations

import threading
import time

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


def test_a_status_built_for_subscribers_never_holds_up_the_infrastructure_thread(
    make_node, clock: ManualClock, monkeypatch
):
    """Found by a probe: the node built each subscriber's status on its infrastructure
    thread (about 20 us per Spot): with 40,000 Spots deadlines fired 0.9 s late, and a mesh
    node's lease renewals came so late that it fenced itself (§13: observation takes the
    progress right of neither domain). The test holds a build: a request's deadline still
    fires meanwhile."""
    node = make_node(build_app(), status_interval=1.0)
    client = node.client()
    client.spots.get_or_create("b", "t.ss.box").wait(WAIT)
    building, go = threading.Event(), threading.Event()
    real = zlink.Node.status

    def held(self: zlink.Node) -> zlink.NodeStatus:
        if threading.current_thread().name.startswith("zlink-status"):
            building.set()
            assert go.wait(WAIT)
        return real(self)

    monkeypatch.setattr(zlink.Node, "status", held)
    got: list[zlink.NodeStatus] = []
    node.subscribe_status(got.append)
    node.wait_idle(WAIT)  # (the activation's turn has let the gate go)
    gate = node._runtime.spots["b"].gate
    assert gate._flag.acquire(False)  # the request waits in the queue, for its deadline
    try:
        clock.advance(1.0)
        assert building.wait(WAIT)
        asked = client.request_to_spot("b", Count()).timeout(2.0).future()
        clock.advance(2.0)
        with pytest.raises(zlink.DeadlineExceeded):
            asked.result(WAIT)
    finally:
        go.set()
        gate._flag.release()
    assert node.wait_idle(WAIT)
    deadline = time.monotonic() + WAIT
    while not got:  # (delivered on the subscription's own thread)
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_closed_subscription_costs_nothing_more(make_node, clock: ManualClock):
    """Found by a probe: a closed subscription stayed with the node, which went on building
    a status for it every interval."""
    node = make_node(build_app(), status_interval=1.0)
    sub = node.subscribe_status(lambda _s: None)
    clock.advance(1.0)
    assert node.wait_idle(WAIT)
    publisher = node._publisher
    assert publisher is not None and publisher.built == 1
    sub.close()
    for _ in range(3):
        clock.advance(1.0)
        assert node.wait_idle(WAIT)
    assert publisher.built == 1
    node.subscribe_status(lambda _s: None)  # a new one starts the ticks again
    clock.advance(1.0)
    assert node.wait_idle(WAIT)
    assert publisher.built == 2


def test_the_infrastructure_backlog_counts_tasks_waiting_not_deadlines(make_node):
    """Found by a probe: ``infrastructure_backlog`` (``zlink_infrastructure_backlog``, "tasks
    waiting for the infrastructure thread") counted every live deadline too: 2,000 requests
    parked with their timeouts read as a backlog of 2,000 on an idle thread. Deadlines are a
    figure of their own."""
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("b", "t.ss.box").wait(WAIT)
    node.wait_idle(WAIT)  # (the activation's turn has let the gate go)
    gate = node._runtime.spots["b"].gate
    assert gate._flag.acquire(False)
    try:
        asked = [client.request_to_spot("b", Count()).timeout(30).future() for _ in range(200)]
        assert node.wait_idle(WAIT, busy=1)
        status = node.status()
        assert status.infrastructure_backlog == 0
        assert status.infrastructure_deadlines >= 200
        assert not any(f.done() for f in asked)
    finally:
        gate._flag.release()
