"""The infrastructure thread hosting a transport's I/O (``InfraExecutor.host``).

A node whose transport owns sockets has its infrastructure thread poll them between its tasks,
instead of a thread of the transport's own: a frame in, and a frame out, then cross no thread
hand-off of their own (issue "A mesh of OS processes", the round-trip numbers). These tests
check what that must not break: a task submitted, a deadline due and a jump of the injected
clock all end the I/O's wait; the I/O gets a turn after every batch; an I/O that says it is
finished, or that raises, never stops the thread. ``PipeIO`` is a real I/O: a pipe and
``select``. The last tests run two real ``ZmqTransport`` hosted by two executors.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from zlink.executor import InfraExecutor, MonotonicClock
from zlink.mesh.transport import Channel
from zlink.mesh.zmq_transport import ZmqTransport
from zlink.testing import ManualClock

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


class PipeIO:
    """I/O over a pipe: ``turn`` waits on it with ``select``; ``wake`` writes one byte."""

    def __init__(self, turns_left: int | None = None, fail_once: bool = False) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self.timeouts: list[float | None] = []  # every turn's timeout, in order
        self.threads: set[int] = set()
        self.turned = threading.Condition()
        self._turns_left = turns_left
        self._fail_once = fail_once

    def turn(self, timeout: float | None) -> bool:
        with self.turned:
            self.timeouts.append(timeout)
            self.threads.add(threading.get_ident())
            self.turned.notify_all()
        if self._fail_once:
            self._fail_once = False
            raise OSError("the I/O failed once")
        select.select([self._r], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            os.read(self._r, 4096)
        if self._turns_left is not None:
            self._turns_left -= 1
            return self._turns_left > 0
        return True

    def wake(self) -> None:
        os.write(self._w, b"!")

    def wait_turns(self, n: int) -> None:
        with self.turned:
            assert self.turned.wait_for(lambda: len(self.timeouts) >= n, WAIT), self.timeouts

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


@pytest.fixture
def infra() -> Iterator[InfraExecutor]:
    executor = InfraExecutor(MonotonicClock())
    executor.start()
    yield executor
    executor.stop(WAIT)


@pytest.fixture
def hosted(infra: InfraExecutor) -> Iterator[PipeIO]:
    """A ``PipeIO`` hosted by ``infra``, waiting in its first turn."""
    io = PipeIO()
    try:
        infra.host(io)
        io.wait_turns(1)
        yield io
    finally:
        infra.stop(WAIT)
        io.close()


def _ran(infra: InfraExecutor, fn: Any = None, *args: Any) -> threading.Event:
    done = threading.Event()

    def task() -> None:
        if fn is not None:
            fn(*args)
        done.set()

    infra.submit(task)
    return done


def test_a_submit_ends_the_hosted_wait_and_the_task_runs_on_the_same_thread(infra, hosted):
    assert hosted.timeouts[0] is None  # no deadline: only a wake-up ends this wait
    seen: list[int] = []
    assert _ran(infra, lambda: seen.append(threading.get_ident())).wait(WAIT)
    assert seen and hosted.threads == {seen[0]}  # one thread does both
    assert infra.hosting


def test_the_io_gets_a_turn_with_no_wait_after_each_batch(infra, hosted):
    assert _ran(infra).wait(WAIT)
    hosted.wait_turns(3)  # the turn after the batch, then the next wait
    assert 0.0 in hosted.timeouts[1:]


def test_a_deadline_bounds_the_hosted_wait(infra, hosted):
    done = threading.Event()
    infra.call_later(0.05, done.set)  # the new head of the heap wakes the I/O's wait
    assert done.wait(WAIT)
    assert any(t is not None and t <= 0.05 for t in hosted.timeouts)


def test_a_jump_of_the_manual_clock_ends_the_hosted_wait():
    clock = ManualClock()
    infra = InfraExecutor(clock)
    infra.start()
    io = PipeIO()
    try:
        done = threading.Event()
        infra.call_later(5.0, done.set)  # before hosting: no wake-up of the I/O is owed for it
        infra.host(io)
        io.wait_turns(1)
        assert io.timeouts[-1] is None  # a manual clock: only a jump, or a task, ends the wait
        clock.advance(5.0)
        assert done.wait(WAIT)
    finally:
        infra.stop(WAIT)
        io.close()


def test_stop_ends_the_hosted_wait():
    infra = InfraExecutor(MonotonicClock())
    infra.start()
    io = PipeIO()
    try:
        infra.host(io)
        io.wait_turns(1)
        infra.stop(WAIT)
        assert not infra.alive
    finally:
        io.close()


def test_a_task_the_turn_submits_runs_without_a_wake_up_of_its_own(infra, hosted):
    wakes: list[int] = []
    real_wake = hosted.wake

    def wake() -> None:
        wakes.append(threading.get_ident())
        real_wake()

    hosted.wake = wake  # type: ignore[method-assign]
    done = threading.Event()
    infra.submit(lambda: infra.submit(done.set))  # submitted on the thread itself
    assert done.wait(WAIT)
    assert threading.get_ident() in wakes  # the test's submit woke it
    assert all(ident == threading.get_ident() for ident in wakes)  # it never woke itself


def test_an_io_that_is_finished_is_hosted_no_more_and_tasks_still_run(infra):
    io = PipeIO(turns_left=1)
    try:
        infra.host(io)
        io.wait_turns(1)
        assert _ran(infra).wait(WAIT)
        end = time.monotonic() + WAIT
        while infra.hosting and time.monotonic() < end:
            assert _ran(infra).wait(WAIT)
        assert not infra.hosting
        turns = len(io.timeouts)
        assert _ran(infra).wait(WAIT)  # the condition's wait again: no turn of the I/O
        assert len(io.timeouts) == turns
        infra.host(PipeIO())  # and another may be hosted (then stopped with the thread)
    finally:
        infra.stop(WAIT)
        io.close()


def test_an_io_that_raises_is_counted_and_the_thread_goes_on(infra):
    io = PipeIO(fail_once=True)
    try:
        infra.host(io)
        io.wait_turns(2)  # it raised once, then waited again
        assert infra.task_errors == 1
        assert _ran(infra).wait(WAIT)
        assert infra.alive and infra.hosting
    finally:
        infra.stop(WAIT)
        io.close()


def test_one_io_at_a_time(infra, hosted):
    with pytest.raises(RuntimeError):
        infra.host(PipeIO())


# -- two ZmqTransports, each hosted by its own infrastructure executor ---------------------------
class _Link:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.events: list[tuple[str, str, Any, int]] = []

    def _add(self, kind: str, peer: str, data: Any) -> None:
        with self.cond:
            self.events.append((kind, peer, data, threading.get_ident()))
            self.cond.notify_all()

    def received(self, peer: str, channel: Channel, data: bytes) -> None:
        self._add(channel.value, peer, data)

    def peer_up(self, peer: str) -> None:
        self._add("up", peer, None)

    def peer_down(self, peer: str) -> None:
        self._add("down", peer, None)

    def writable(self, peer: str) -> None:
        self._add("writable", peer, None)

    def wait_for(self, kind: str, n: int = 1) -> list[Any]:
        def found() -> list[Any]:
            return [e for e in self.events if e[0] == kind]

        with self.cond:
            assert self.cond.wait_for(lambda: len(found()) >= n, WAIT), (kind, self.events)
            return found()


class _HostedNode:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.infra = InfraExecutor(MonotonicClock(), name=f"infra-{node_id}")
        self.infra.start()
        # pings every 30 s: nothing but a wake-up, or the turn after a batch, sends a frame
        self.transport = ZmqTransport("tcp://127.0.0.1:0", connect_timeout=30.0, ping_interval=30.0)
        self.endpoint = self.transport.endpoint(node_id)
        self.link = _Link()
        self.transport.attach(node_id, self.link, self.infra.submit, 1, host=self.infra)

    def infra_ident(self) -> int:
        got: list[int] = []
        assert _ran(self.infra, lambda: got.append(threading.get_ident())).wait(WAIT)
        return got[0]

    def stop(self) -> None:
        self.transport.detach(self.node_id)
        self.infra.stop(WAIT)


@pytest.fixture
def pair() -> Iterator[tuple[_HostedNode, _HostedNode]]:
    a, b = _HostedNode("a"), _HostedNode("b")
    try:
        b.transport.learn([("a", 1, a.endpoint)])
        a.link.wait_for("up")
        b.link.wait_for("up")
        yield a, b
    finally:
        for node in (b, a):
            if node.infra.alive:
                node.stop()


def test_hosted_transports_carry_both_channels_with_no_thread_of_their_own(pair):
    a, b = pair
    names = {t.name for t in threading.enumerate()}
    assert not any(name.startswith("zlink-transport") for name in names)
    assert a.transport.send("a", "b", Channel.DATA, b"d1")
    b.transport.send("b", "a", Channel.COMPLETION, b"c1")
    got = b.link.wait_for("data")
    assert got[0][2] == b"d1" and got[0][3] == b.infra_ident()  # handed on by the host
    assert a.link.wait_for("completion")[0][2] == b"c1"


def test_a_send_from_the_host_thread_itself_leaves_after_its_batch(pair):
    a, b = pair  # (it sends itself no wake-up: the turn after the batch sends it)
    a.infra.submit(a.transport.send, "a", "b", Channel.DATA, b"from-infra")
    assert b.link.wait_for("data")[0][2] == b"from-infra"


def test_detach_says_goodbye_through_the_host(pair):
    a, b = pair
    a.stop()
    assert b.link.wait_for("down")[0][1] == "a"


def test_detach_after_the_host_stopped_still_says_goodbye(pair):
    a, b = pair
    a.infra.stop(WAIT)  # (a node stops its transport first; this one did not)
    a.transport.detach("a")  # its last turn runs here: nothing else turns it now
    assert b.link.wait_for("down")[0][1] == "a"


def test_detach_on_the_host_thread_is_its_last_turn(pair):
    a, b = pair
    a.infra.submit(a.transport.detach, "a")
    assert b.link.wait_for("down")[0][1] == "a"
    end = time.monotonic() + WAIT
    while a.infra.hosting and time.monotonic() < end:
        assert _ran(a.infra).wait(WAIT)
    assert not a.infra.hosting and a.infra.task_errors == 0


def test_a_detach_that_gives_up_waiting_leaves_the_sockets_to_the_last_turn(pair):
    a, b = pair
    a.transport._detach_wait = 0.05
    release = threading.Event()
    busy = threading.Event()

    def long_task() -> None:  # a task the host is still running when detach asks
        busy.set()
        release.wait(WAIT)

    a.infra.submit(long_task)
    assert busy.wait(WAIT)
    a.transport.detach("a")  # gives up after 0.05 s: it must not close what the host turns
    release.set()
    assert b.link.wait_for("down")[0][1] == "a"  # the host's last turn said goodbye
    end = time.monotonic() + WAIT
    while a.infra.hosting and time.monotonic() < end:
        assert _ran(a.infra).wait(WAIT)
    assert not a.infra.hosting and a.infra.task_errors == 0
