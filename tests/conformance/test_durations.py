"""Durations (python-api §9 "Durations"): every ``timeout``/``interval``/``deadline`` argument is
a finite number of seconds within ``1e-3 .. 1e7`` (or ``None`` where documented); anything else
is ``InvalidArgument`` at the call site, and the infrastructure thread never dies of a user value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, warns_unended
from zlink import executor as ex
from zlink.testing import ManualClock

BAD = [float("inf"), float("-inf"), float("nan"), 1e12, 1e7 * 1.001, 9e-4, 0, -1, True, "1"]
GOOD = [1e-3, 1, 2.5, 1e7]


class Hold(zlink.Request[str], type_name="t.du.hold"):
    pass


class Note(zlink.Message, type_name="t.du.note"):
    pass


class TryWorker(zlink.Request[str], type_name="t.du.worker"):
    seconds: Any


class TryTimer(zlink.Request[str], type_name="t.du.timer"):
    interval: Any = 1.0
    first_delay: Any = None


def build_app(release: threading.Event) -> zlink.App:
    app = zlink.App("durations")

    @app.user_spot("t.du.box")
    class Box(zlink.UserSpot):
        @zlink.handler
        def hold(self, req: Hold) -> str:
            assert release.wait(WAIT)
            return "released"

        @zlink.handler
        def note(self, msg: Note) -> None:
            pass

        @zlink.handler
        async def try_worker(self, req: TryWorker) -> str:
            try:
                call = self.context.workers.io(len, "x").timeout(req.seconds)
            except zlink.ZLinkError as exc:
                return type(exc).__name__
            assert await call == 1
            return "ok"

        @zlink.handler
        def try_timer(self, req: TryTimer) -> str:
            try:
                handle = self.context.timers.register(
                    "beat", req.interval, first_delay=req.first_delay
                )
            except zlink.ZLinkError as exc:
                return type(exc).__name__
            handle.cancel()
            return "ok"

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            pass

    return app


@pytest.fixture
def release() -> threading.Event:
    return threading.Event()


@pytest.fixture
def node(make_node: Callable[..., zlink.Node], release: threading.Event) -> zlink.Node:
    node = make_node(build_app(release))
    node.client().spots.get_or_create("box", "t.du.box").wait(WAIT)
    return node


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_call_timeout_outside_the_range_is_invalid_argument(node: zlink.Node, bad: Any):
    """python-api §9: ``.timeout(s)`` of requests, creates and worker calls."""
    client = node.client()
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_spot("box", Hold()).timeout(bad)
    with pytest.raises(zlink.InvalidArgument):
        client.spots.get_or_create("other", "t.du.box").timeout(bad)
    with pytest.raises(zlink.InvalidArgument):
        client.actors.create("t.du.nobody").timeout(bad)
    assert client.request_to_spot("box", TryWorker(seconds=bad)).wait(WAIT) == "InvalidArgument"


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_blocking_wait_outside_the_range_is_invalid_argument_and_submits_nothing(
    node: zlink.Node, release: threading.Event, bad: Any
):
    """python-api §9: ``wait(timeout)`` takes ``None`` (no limit) or a duration in range."""
    client = node.client()
    call = client.request_to_spot("box", Hold())
    with pytest.raises(zlink.InvalidArgument):
        call.wait(bad)
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot("box", Note()).wait(bad)
    with pytest.raises(zlink.InvalidArgument):
        client.send_many_to_spot("box", [Note(), Note()]).wait(bad)
    assert node.status().owners[0].app_items == 0  # nothing was submitted
    release.set()
    assert call.wait(WAIT) == "released"  # the refused terminal was not spent


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_timer_interval_or_first_delay_outside_the_range_is_invalid_argument(
    node: zlink.Node, bad: Any
):
    """python-api §9: a timer's interval, and its first delay (which may also be 0)."""
    client = node.client()
    assert client.request_to_spot("box", TryTimer(interval=bad)).wait(WAIT) == "InvalidArgument"
    expected = "ok" if type(bad) is int and bad == 0 else "InvalidArgument"
    assert client.request_to_spot("box", TryTimer(first_delay=bad)).wait(WAIT) == expected


@pytest.mark.parametrize("good", GOOD, ids=repr)
def test_the_bounds_of_the_range_are_accepted(node: zlink.Node, good: float):
    client = node.client()
    assert client.request_to_spot("box", TryWorker(seconds=good)).wait(WAIT) == "ok"
    assert client.request_to_spot("box", TryTimer(interval=good)).wait(WAIT) == "ok"
    assert client.request_to_spot("box", TryTimer(first_delay=good)).wait(WAIT) == "ok"
    assert client.request_to_spot("box", TryTimer(first_delay=0)).wait(WAIT) == "ok"
    with warns_unended():  # built, never sent
        client.request_to_spot("box", TryTimer()).timeout(good)
    client.send_to_spot("box", Note()).wait(good)
    assert node.wait_idle(good if good >= 1 else WAIT)


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_node_durations_outside_the_range_are_invalid_argument_and_change_nothing(
    node: zlink.Node, bad: Any
):
    """python-api §9: ``shutdown``, ``wait_idle``, ``drain`` and ``relocate_spot`` validate
    their timeout before doing anything: a refused ``shutdown`` leaves the node running."""
    with pytest.raises(zlink.InvalidArgument):
        node.shutdown(bad)
    with pytest.raises(zlink.InvalidArgument):
        node.wait_idle(bad)
    with pytest.raises(zlink.InvalidArgument):
        node.drain(bad)
    with pytest.raises(zlink.InvalidArgument):
        node.relocate_spot("box", "node-2", bad)
    assert "running" in repr(node)
    node.client().send_to_spot("box", Note()).submit()  # still serving
    assert node.wait_idle(WAIT)
    node.shutdown(None)  # None: the configured shutdown timeout
    assert "stopped" in repr(node)


def test_the_infrastructure_thread_survives_a_failing_task_counts_it_and_still_fires_deadlines(
    node: zlink.Node, clock: ManualClock, release: threading.Event
):
    """python-api §9: the infrastructure thread never dies; each failure is counted once."""
    infra = node._runtime.infra

    def boom() -> None:
        raise RuntimeError("a failing infrastructure task")

    infra.submit(boom)
    infra.call_later(0.5, boom)  # a deadline callback that fails
    clock.advance(0.5)
    assert infra.wait_quiet(WAIT)
    pending = node.client().request_to_spot("box", Hold()).timeout(1).future()
    clock.advance(1)  # a later deadline still fires
    with pytest.raises(zlink.DeadlineExceeded):
        pending.result(WAIT)
    release.set()
    assert node.counters().get("infra_task_errors") == 2
    status = node.status()
    assert status.infrastructure_alive is True
    assert status.counters.get("infra_task_errors") == 2


class _RealGapClock(ManualClock):
    """A manual clock whose ``real_wait`` is the gap to the deadline, as a real clock's is: a
    far deadline asks the thread to sleep longer than any lock wait can (``OverflowError``)."""

    def real_wait(self, deadline: float) -> float | None:
        return max(0.0, deadline - self.now())


def test_the_infrastructure_thread_survives_a_deadline_too_far_for_a_thread_wait():
    """python-api §9: a deadline no lock can wait for (1e12 s) never stops the thread."""
    clock = _RealGapClock()
    errors: list[str] = []
    infra = ex.InfraExecutor(clock, on_error=errors.append)
    infra.start()
    try:
        infra.call_later(1e12, lambda: None)
        infra.call_later(1e300, lambda: None)
        ran, fired = threading.Event(), threading.Event()
        infra.submit(ran.set)
        assert ran.wait(WAIT)
        infra.call_later(1.0, fired.set)
        clock.advance(1.0)
        assert fired.wait(WAIT)
        assert infra.alive
        assert errors == []  # a far deadline is not even a failure
    finally:
        infra.stop(WAIT)
    assert not infra.alive


def test_a_non_finite_deadline_is_refused_by_the_heap_itself():
    """Defence in depth under python-api §9: nothing the heap cannot order gets into it (the
    kernel imports nothing of zlink, so this internal check is a ``ValueError``)."""
    infra = ex.InfraExecutor(ManualClock())
    for bad in (float("inf"), float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="finite"):
            infra.call_at(bad, lambda: None)
        with pytest.raises(ValueError, match="finite"):
            infra.call_later(bad, lambda: None)


def test_status_shows_whether_the_infrastructure_thread_is_alive(node: zlink.Node):
    assert node.status().infrastructure_alive is True
    node._runtime.infra.stop(WAIT)  # as if it had died: status must say so
    assert node.status().infrastructure_alive is False
