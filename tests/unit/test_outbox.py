"""The outbox's byte account (python-api §9): a one-way message made here is queued in one take
of the outbox lock when there is room, and never overtakes a caller that waits for room; the
bytes the transport took come back once per flush."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from zlink.errors import InvalidArgument, ZLinkError
from zlink.mesh import wire
from zlink.mesh.outbox import Outbox, Room, estimated_size
from zlink.mesh.transport import Channel, InProcessTransport


class _Receiver:
    """The receiving node's side of the in-process transport: the frames it was handed."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def received(self, peer: str, channel: Channel, data: bytes) -> None:
        self.frames.append(data)

    def peer_up(self, peer: str) -> None:
        pass

    def peer_down(self, peer: str) -> None:
        pass

    def writable(self, peer: str) -> None:
        pass


class _Jobs:
    """An infrastructure thread run by hand: jobs wait here until ``run`` (deterministic)."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.queue.append((fn, args))

    def run(self) -> None:
        while self.queue:
            fn, args = self.queue.pop(0)
            fn(*args)


def _send(n: int) -> wire.SendEnvelope:
    return wire.SendEnvelope(
        "spot", "room-1", "t.o.bump", f'{{"n":{n}}}', None, "a", "a", "a", 0, False, None, None
    )


def _outbox(limit: int) -> tuple[Outbox, _Jobs, _Jobs, _Receiver, list[ZLinkError]]:
    transport = InProcessTransport()
    receiver, theirs, ours = _Receiver(), _Jobs(), _Jobs()
    transport.attach("b", receiver, theirs)
    transport.attach("a", _Receiver(), ours)
    failures: list[ZLinkError] = []
    outbox = Outbox("a", transport, ours, lambda _p, _e, error: failures.append(error), limit)
    ours.run()
    theirs.run()  # (the peer_up notices)
    return outbox, ours, theirs, receiver, failures


def test_a_send_with_room_is_queued_counted_and_its_bytes_come_back_after_the_flush() -> None:
    outbox, ours, theirs, receiver, failures = _outbox(limit=1 << 20)
    assert outbox.put_if_room("b", _send(1)) and outbox.put_if_room("b", _send(2))
    assert outbox._bytes["b"] == 2 * estimated_size(_send(1))
    assert len(ours.queue) == 1  # one flush scheduled for both
    ours.run()
    assert "b" not in outbox._bytes and not outbox._taken  # given back, once, at the flush end
    theirs.run()
    assert [wire.decode(f) for f in receiver.frames] == [_send(1), _send(2)]
    assert failures == []


def test_no_room_queues_nothing_and_a_waiter_is_never_overtaken() -> None:
    one = estimated_size(_send(1))
    outbox, ours, _theirs, _receiver, _failures = _outbox(limit=one)
    assert outbox.put_if_room("b", _send(1))  # fills the account to the limit
    assert not outbox.put_if_room("b", _send(2))  # no room: refused, nothing queued
    assert outbox._bytes["b"] == one and len(outbox._queue) == 1
    went: list[str] = []
    assert outbox.wait_room("b", lambda: went.append("waiter")) is Room.WAITS
    ours.run()  # the first goes out; its bytes come back; the waiter is let go first
    assert went == ["waiter"]
    outbox._going["b"] = 1  # (a waiter let go whose put has not happened yet)
    assert not outbox.put_if_room("b", _send(3))  # it still comes first
    del outbox._going["b"]
    assert outbox.put_if_room("b", _send(3))


def test_the_in_process_transport_bounds_data_in_flight_in_bytes_too() -> None:
    """python-api §9 (the same rule as ZmqTransport): frames and bytes in flight per pair are
    both bounded; a frame larger than the byte bound goes alone."""
    transport = InProcessTransport(data_limit=100, data_bytes=1000)
    receiver, theirs, ours = _Receiver(), _Jobs(), _Jobs()
    transport.attach("b", receiver, theirs)
    transport.attach("a", _Receiver(), ours)
    assert transport.send("a", "b", Channel.DATA, b"x" * 600)
    assert not transport.send("a", "b", Channel.DATA, b"y" * 600)
    theirs.run()
    assert transport.send("a", "b", Channel.DATA, b"B" * 5000)  # alone: nothing in flight
    assert not transport.send("a", "b", Channel.DATA, b"z")
    theirs.run()
    assert receiver.frames == [b"x" * 600, b"B" * 5000]
    assert transport.send("a", "b", Channel.DATA, b"z")


def test_the_in_process_transport_hands_a_burst_over_in_one_task_in_order() -> None:
    """Frames sent while none is being taken wait behind one delivery task on the receiver's
    infrastructure thread; a frame whose handling raises ends that task (the thread counts
    it), and the frames behind it go next, ahead of any sent since, with credit exact."""
    transport = InProcessTransport(data_limit=100)

    class _Faulty(_Receiver):
        def received(self, peer: str, channel: Channel, data: bytes) -> None:
            super().received(peer, channel, data)
            if data == b"2":
                raise RuntimeError("a fault of the node's intake")

    receiver, theirs, ours = _Faulty(), _Jobs(), _Jobs()
    transport.attach("b", receiver, theirs)
    transport.attach("a", _Receiver(), ours)
    theirs.run()
    for n in range(1, 5):
        assert transport.send("a", "b", Channel.DATA, str(n).encode())
    assert len(theirs.queue) == 1  # one task for the burst
    fn, args = theirs.queue.pop(0)
    with pytest.raises(RuntimeError):
        fn(*args)
    assert receiver.frames == [b"1", b"2"]
    assert transport.send("a", "b", Channel.DATA, b"5")
    theirs.run()
    assert receiver.frames == [b"1", b"2", b"3", b"4", b"5"]
    assert transport._flows[("a", "b")].in_flight == 0
    assert transport._flows[("a", "b")].in_flight_bytes == 0


class _Interrupted(BaseException):
    """What no ``except Exception`` stops (as ``KeyboardInterrupt`` would be)."""


def test_a_flush_that_something_escapes_leaves_the_rest_queued_and_scheduled() -> None:
    outbox, ours, theirs, receiver, failures = _outbox(limit=1 << 20)
    sends = outbox._transport.send
    calls = [0]

    def send_once_interrupted(*args: Any) -> bool:
        calls[0] += 1
        if calls[0] == 2:
            raise _Interrupted
        return sends(*args)

    outbox._transport.send = send_once_interrupted  # type: ignore[method-assign]
    for n in range(4):
        assert outbox.put_if_room("b", _send(n))
    fn, args = ours.queue.pop(0)
    try:
        fn(*args)
    except _Interrupted:
        pass
    else:  # pragma: no cover - the test's own premise
        raise AssertionError("the flush was not interrupted")
    assert [f for f, _ in ours.queue] == [outbox._flush]  # scheduled again, not wedged
    ours.run()
    theirs.run()
    assert [wire.decode(f) for f in receiver.frames] == [_send(0), _send(2), _send(3)]
    assert [type(e).__name__ for e in failures] == ["Unavailable"]  # the one interrupted
    assert "b" not in outbox._bytes  # its bytes came back too
    assert outbox.put_if_room("b", _send(4))
    ours.run()
    theirs.run()
    assert wire.decode(receiver.frames[-1]) == _send(4)


def test_a_batch_counts_its_messages_in_the_byte_account() -> None:
    """python-api §9: the outbox is bounded in bytes; a batch of 100 messages is not counted
    as one small envelope."""
    one = _send(1)
    batch = wire.BatchEnvelope(
        "spot", "room-1", ("t.o.bump",) * 100, (one.payload,) * 100, "a", "a", "a", 0
    )
    assert estimated_size(batch) > 10 * estimated_size(one)  # (it was counted as 600 bytes)


def test_a_fail_fast_put_is_held_only_behind_calls_for_its_own_target() -> None:
    """python-api §9: a caller that may not wait is refused while a call for its target waits
    or is being let go (it would overtake it), not for another target's waiters; a waiter
    withdrawn or let go no longer holds its target."""
    one = estimated_size(_send(1))
    outbox, ours, _theirs, _receiver, _failures = _outbox(limit=one)
    outbox.submit_limit = 100 * one
    assert outbox.put_if_room("b", _send(1))  # at the wait limit now
    hot: list[str] = []

    def go() -> None:
        hot.append("let go")
        assert not outbox.put_if_room("b", _send(9), False, "room-1")  # still its turn
        outbox.put("b", _send(2))

    assert outbox.wait_room("b", go, "room-1") is Room.WAITS
    assert not outbox.has_room("b", True)  # a caller that may wait: behind everyone
    assert not outbox.put_if_room("b", _send(3), False, "room-1")  # its own target waits
    why = outbox.refusal("b", "room-1")  # the refused caller's error says which it was
    assert "1 call(s) for 'room-1' wait for room" in why and "is full" not in why
    assert outbox.put_if_room("b", _send(4), False, "room-2")  # another target's: it passes
    assert not outbox.put_if_room("b", _send(5), False)  # no target named: behind everyone
    ours.run()  # room again: the waiter is let go, and puts
    assert hot == ["let go"] and not outbox._targets and not outbox._target_of
    assert outbox.put_if_room("b", _send(6), False, "room-1")
    other: list[str] = []
    outbox.limit = 0  # nobody is let go
    withdrawn = lambda: other.append("never")  # noqa: E731
    assert outbox.wait_room("b", withdrawn, "room-3") is Room.WAITS
    assert not outbox.put_if_room("b", _send(7), False, "room-3")
    assert outbox.cancel_wait("b", withdrawn)
    assert outbox.put_if_room("b", _send(8), False, "room-3") and other == []
    outbox.submit_limit = 0  # over the fail-fast limit: full, whatever waits
    assert outbox.refusal("b", "room-3").startswith("is full (")


def _fence(origin: str, mark: int = 0) -> wire.FenceEnvelope:
    return wire.FenceEnvelope("room-1", origin, "a", 1, mark)


def test_every_fence_put_is_announced_with_a_mark_of_its_own() -> None:
    """python-api §9 (``MeshRouter._crossing``): a route fence put on DATA gets a new
    mark for this hop (one from an earlier hop is replaced) and a ``DataAheadEnvelope``
    with it on COMPLETION, which a paused DATA flow does not hold."""
    outbox, ours, theirs, receiver, _failures = _outbox(limit=1 << 20)
    outbox._transport.pause("b", "a")  # (the receiver holds what comes on DATA)
    outbox.put("b", _fence("b"))
    outbox.put("b", _fence("c", mark=5))  # relayed on, marked before
    ours.run()
    theirs.run()
    notices = [wire.decode(f) for f in receiver.frames]
    assert [type(n) for n in notices] == [wire.DataAheadEnvelope] * 2  # DATA held, not these
    first, second = notices
    assert isinstance(first, wire.DataAheadEnvelope) and (first.via, first.first_origin) == (
        "a",
        "b",
    )
    assert isinstance(second, wire.DataAheadEnvelope) and second.first_origin == "c"
    assert second.mark == first.mark + 1 and first.mark > 0
    outbox._transport.resume("b", "a")
    theirs.run()
    fences = [wire.decode(f) for f in receiver.frames[2:]]
    assert [f.mark for f in fences if isinstance(f, wire.FenceEnvelope)] == [
        first.mark,
        second.mark,
    ]


def test_a_fence_behind_callers_waiting_for_room_is_announced_as_it_is_put() -> None:
    """A fence that waits in the line of callers waiting for room goes, and is announced,
    once they are let go: the calls before it are queued ahead of it (per-sender order)."""
    one = estimated_size(_send(1))
    outbox, ours, theirs, receiver, _failures = _outbox(limit=one)
    assert outbox.put_if_room("b", _send(1))
    went: list[str] = []

    def waiter() -> None:
        went.append("waiter")
        outbox.put("b", _send(2))

    assert outbox.wait_room("b", waiter) is Room.WAITS
    outbox.put_behind_waiters("b", _fence("a"))
    assert outbox.waiting("b") == 2  # the caller, then the fence
    ours.run()
    theirs.run()
    kinds = [type(wire.decode(f)).__name__ for f in receiver.frames]
    assert went == ["waiter"]
    assert kinds == ["SendEnvelope", "SendEnvelope", "FenceEnvelope", "DataAheadEnvelope"]


def test_an_announced_envelope_that_fails_as_it_leaves_takes_its_notice_with_it() -> None:
    """Found by review: a fence (or a move's envelope) the transport refused (a frame over
    the peer's limit) still had its notice sent, which lifted the receiver's pause for a
    whole request timeout, waiting for what would never come. The failure is counted as
    before; the notice, right behind it, is not sent."""
    outbox, ours, theirs, receiver, failures = _outbox(limit=1 << 20)
    real = outbox._transport.send

    def refuse_data(sender: str, peer: str, channel: Channel, data: bytes) -> bool:
        if channel is Channel.DATA:
            raise InvalidArgument("a frame over this peer's limit")
        return real(sender, peer, channel, data)

    outbox._transport.send = refuse_data  # type: ignore[method-assign]
    outbox.put("b", _fence("c"))
    outbox.put("b", wire.RouteEnvelope("room-1", "c", 1, 1))  # (COMPLETION still goes)
    ours.run()
    theirs.run()
    assert [type(wire.decode(f)) for f in receiver.frames] == [wire.RouteEnvelope]
    assert len(failures) == 1 and outbox.pending() == 0 and not outbox._unsent
