"""The in-process transport hands DATA over in bounded steps (issue "Backpressure": faults
under load).

A probe of moves under load (3 nodes in one process, saturated senders) saw one delivery task
on a node's infrastructure thread take 1.5-1.9 s: every frame queued from a peer went over in
one task, however many. The node's lease renewal, queued behind it, came too late, and the
node fenced itself and dropped what it held (a lease is 3 s by default; python-api §10
"Failure"). A delivery now takes at most ``_DELIVER_FRAMES`` frames or ``_DELIVER_SECONDS``,
and what is left goes on in a task of its own, behind what was queued meanwhile, in order."""

from __future__ import annotations

from collections import deque
from typing import Any

from zlink.mesh import transport as transport_module
from zlink.mesh.transport import Channel, InProcessTransport


class _Link:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def received(self, sender: str, channel: Channel, data: bytes) -> None:
        self.log.append(data)

    def peer_up(self, peer: str) -> None: ...
    def peer_down(self, peer: str) -> None: ...
    def writable(self, peer: str) -> None: ...


def _pair() -> tuple[InProcessTransport, deque[tuple[Any, tuple[Any, ...]]], list[Any]]:
    """Nodes ``a`` and ``b``; ``b``'s infrastructure tasks wait in a queue, run by the test."""
    transport = InProcessTransport(data_limit=100_000, data_bytes=1 << 30)
    tasks: deque[tuple[Any, tuple[Any, ...]]] = deque()
    log: list[Any] = []
    transport.attach("a", _Link([]), lambda fn, *args: fn(*args))  # type: ignore[arg-type]
    transport.attach("b", _Link(log), lambda fn, *args: tasks.append((fn, args)))  # type: ignore[arg-type]
    tasks.clear()  # (peer_up)
    return transport, tasks, log


def test_a_burst_goes_over_in_bounded_steps_in_order_with_other_work_between() -> None:
    transport, tasks, log = _pair()
    count = 5 * transport_module._DELIVER_FRAMES + 3
    for n in range(count):
        assert transport.send("a", "b", Channel.DATA, b"%d" % n)
    assert len(tasks) == 1  # one task for the burst
    tasks.append((log.append, (b"timer",)))  # e.g. a lease renewal, queued behind it
    fn, args = tasks.popleft()
    fn(*args)
    assert len(log) == transport_module._DELIVER_FRAMES
    assert transport.send("a", "b", Channel.DATA, b"late")  # queued behind the rest
    steps = 0
    while tasks:
        fn, args = tasks.popleft()
        fn(*args)
        steps += 1
        assert steps < 100
    frames = [d for d in log if d != b"timer"]
    assert frames == [b"%d" % n for n in range(count)] + [b"late"]
    assert log.index(b"timer") == transport_module._DELIVER_FRAMES  # not behind the burst


def test_a_slow_receiver_gives_the_thread_back_after_the_time_budget(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    transport, tasks, log = _pair()
    now = [0.0]
    monkeypatch.setattr(transport_module, "_now", lambda: now[0])
    link = _Link(log)

    def slow(sender: str, channel: Channel, data: bytes) -> None:
        now[0] += transport_module._DELIVER_SECONDS / 2  # each frame takes half the budget
        link.received(sender, channel, data)

    transport._nodes["b"].link.received = slow  # type: ignore[method-assign]
    for n in range(10):
        transport.send("a", "b", Channel.DATA, b"%d" % n)
    fn, args = tasks.popleft()
    fn(*args)
    assert len(log) == 2 and len(tasks) == 1  # its budget spent: the rest in a task of its own
    while tasks:
        fn, args = tasks.popleft()
        fn(*args)
    assert log == [b"%d" % n for n in range(10)]
