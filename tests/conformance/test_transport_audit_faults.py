"""Audit of the process mesh's transport and flow control (python-api §9, §10).

Each test here failed on the code as audited (a helper's fresh-eyes audit): it proves one
fault, fixed since. Transports are real
``ZmqTransport``s on 127.0.0.1 with a fake node each (a ``Link`` that records what it is told
and an ``Infra`` the test runs), as ``tests/unit/test_zmq_transport_flow.py`` builds them;
the outbox tests run an ``Outbox`` over the in-process transport with a hand-run
infrastructure queue. Every wait is bounded.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable

import pytest
import zmq

from tests.unit.test_outbox import _Jobs, _Receiver, _send
from tests.unit.test_zmq_transport_flow import (
    WAIT,
    _counter,
    _meshed,
    _on_thread,
    _OnceNoPipeFor,
    _raw_sender,
)
from zlink.errors import Unavailable, ZLinkError
from zlink.mesh import wire
from zlink.mesh.outbox import Outbox, Room, estimated_size
from zlink.mesh.transport import Channel, InProcessTransport
from zlink.mesh.zmq_transport import _HEADER, VERSION, MeshEndpoint, _Kind, identity

pytestmark = pytest.mark.timeout(60)


class _NodeLink(_Receiver):
    """What a node's router does with what its transport tells of its peers (``MeshRouter``:
    ``writable`` and ``peer_down`` go to its outbox)."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__()
        self._outbox = outbox

    def peer_down(self, peer: str) -> None:
        self._outbox.peer_down(peer)

    def writable(self, peer: str) -> None:
        self._outbox.writable(peer)


def _poll(check: Callable[[], bool], wait: float = WAIT) -> bool:
    """Wait (bounded) for another thread's progress (no event to wait on)."""
    end = time.monotonic() + wait
    while not check() and time.monotonic() < end:
        time.sleep(0.005)
    return check()


# -- 1. a forged HELLO wedges the transport thread -------------------------------------------
def test_a_hello_naming_an_incarnation_past_64_bits_does_not_stop_the_transport(nodes):
    """python-api §10: garbage never stops a thread. ``_on_hello`` accepts any ``int``
    incarnation; ``_meet`` makes a CONNECTING record of it; every turn's ``_greet`` then packs
    it into the ``!Q`` header (``_probe``), ``struct.error`` escapes (only ``ZMQError`` is
    caught), the turn is abandoned before ``_flush``, and so is every later turn: nothing this
    node hands over is ever sent again, and the bogus record never times out."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b").attach()
    _meshed(a, b)
    assert a.transport.send("a", "b", Channel.DATA, b"before")
    b.infra.run_until(lambda: b"before" in b.link.seen("data", "a"), "b takes 'before'")
    huge = 2**64
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("ghost", f"#{huge}"), a)
        dead = MeshEndpoint("tcp://127.0.0.1:9", "tcp://127.0.0.1:9", "tcp://127.0.0.1:9", "x")
        hello = json.dumps({"node": "ghost", "incarnation": huge, "mesh": "main",
                            "endpoint": dead.encode()}).encode()  # fmt: skip
        send(_HEADER.pack(VERSION, _Kind.HELLO, 0, 0, 0), hello)
        # a bad frame now (no store gives such an incarnation); before the fix, a record
        assert _poll(lambda: counted.get("bad_frames", 0) >= 1), counted
        assert "ghost" not in a.transport.peers(connecting=True)
    finally:
        ctx.destroy(linger=0)
    assert a.transport.send("a", "b", Channel.DATA, b"after")
    assert a.transport.send("a", "b", Channel.COMPLETION, b"reply after")
    b.infra.run_until(
        lambda: (
            b"after" in b.link.seen("data", "a")
            and b"reply after" in b.link.seen("completion", "a")
        ),
        f"b takes what a sent after the forged HELLO (a's transport_errors: "
        f"{counted.get('transport_errors', 0)}, bad_frames: {counted.get('bad_frames', 0)})",
    )


def test_a_phase_of_the_turn_that_raises_skips_none_of_the_others(nodes):
    """The second half of fault 1: a turn's phase that raises (there, the greeting) must not
    keep the flush, pings and sweep of that turn, and every later one, from running."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b").attach()
    _meshed(a, b)

    def greet() -> None:
        raise struct.error("int too large to convert")

    a.transport._greet = greet  # type: ignore[method-assign]
    a.transport._wake()
    assert _poll(lambda: counted.get("transport_errors", 0) >= 1), counted
    assert a.transport.send("a", "b", Channel.DATA, b"after")
    b.infra.run_until(lambda: b"after" in b.link.seen("data", "a"), "b takes 'after'")


# -- 2. credit zeroed in a flush whose earlier run finds no pipe is lost ----------------------
def test_credit_owed_in_a_flush_whose_reply_found_no_pipe_is_not_lost(nodes):
    """``_flush`` takes the credit owed to ``b`` (zeroes ``credit_due``, sets ``acked``) before
    it sends anything; a reply to ``b`` in the same flush finds no pipe and takes ``b`` down;
    ``_send_credit`` then returns early (``b`` not UP) without keeping the CREDIT. Nothing is
    owed any more when ``b`` is met again: ``b``'s window never comes back."""
    a = nodes("a", data_limit=1024, ping_interval=30.0).attach()  # (credit step 256: owed,
    b = nodes("b", data_limit=1).attach()  # sent at a's ping: the test plays that ping)
    _meshed(a, b)
    t = a.transport
    assert b.transport.send("b", "a", Channel.DATA, b"x0")
    a.infra.run_until(lambda: a.link.seen("data", "b") == [b"x0"], "a takes x0")
    assert _poll(lambda: t._peers["b"].inc.credit_due == 1)
    assert not b.transport.send("b", "a", Channel.DATA, b"x1")  # b is at its window of 1
    outs = t._outs
    once = _OnceNoPipeFor(outs[Channel.COMPLETION], t._peers["b"].ident, _Kind.COMPLETION)

    def ping_then_reply() -> None:  # what a's ping (credit owed) and a reply do, one turn
        outs[Channel.COMPLETION] = once
        t._ping()
        t.send("a", "b", Channel.COMPLETION, b"reply")

    _on_thread(t, ping_then_reply)
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "the reply found no pipe")
    assert once.fired
    b.infra.run_until(lambda: b"reply" in b.link.seen("completion", "a"), "reply sent again")
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again (b pings)")
    b.infra.run_until(
        lambda: bool(b.link.seen("writable", "a")),
        f"b gets its credit back (b in flight: {b.transport._peers['a'].in_flight}; "
        f"a owes: {t._peers['b'].inc.credit_due})",
    )


# -- 3. an oversized frame kept from a not-yet-listed incarnation is never credited ---------
def test_an_oversized_frame_kept_for_a_peer_the_store_has_not_listed_is_credited(nodes):
    """``_on_frame`` keeps a stranger's frames with oversized bodies emptied (counted); when
    the store lists it, ``_replay_strangers`` -> ``_fresh`` drops the empty body and credits
    only bodies still over the limit: the emptied one is never credited, and the sender sits
    at its window for good (the DOWN-record path was fixed, this one was not)."""
    counted, count = _counter()
    a = nodes("a", max_frame_bytes=1000, count=count).attach()
    b = nodes("b", data_limit=1).attach()
    _meshed(a, b)
    b.transport.reincarnate("b", 2, [a.member()], lambda: None)
    b.infra.run_until(lambda: len(b.link.seen("up", "a")) == 2, "b#2 up at its end")
    assert b.transport._peers["a"].max_frame == 0  # a never greeted b#2: b#2 does not know
    assert b.transport.send("b", "a", Channel.DATA, b"x" * 1500)  # over a's 1000, under 2x
    assert _poll(lambda: counted.get("oversized_frames", 0) >= 1)
    b.incarnation = 2
    a.transport.learn([b.member()])  # the store lists b#2
    a.infra.run_until(
        lambda: bool(a.link.seen("up", "b")) and len(a.link.seen("up", "b")) >= 2, "a meets b#2"
    )
    ok = _poll(lambda: b.transport._peers["a"].in_flight == 0, wait=5.0)
    assert ok, (
        f"b#2 still has {b.transport._peers['a'].in_flight} frame(s) in flight to a; "
        f"send now: {b.transport.send('b', 'a', Channel.DATA, b'small')}"
    )


# -- 4. outbox: a node's stop strands callers waiting for room -------------------------------
def test_abandon_lets_every_caller_waiting_for_room_go():
    """``Outbox.abandon`` (a node's stop) fails what is queued and gives its bytes back, but
    lets waiters go only for peers with DATA *held* for the transport (``peer_down``): a
    caller waiting behind bytes still queued (a flush not run yet) is never called, nor
    withdrawn; an accepted send waiting there has no timer and is never counted."""
    transport = InProcessTransport()
    ours, theirs = _Jobs(), _Jobs()
    transport.attach("b", _Receiver(), theirs)
    transport.attach("a", _Receiver(), ours)
    failures: list[ZLinkError] = []
    limit = 2 * estimated_size(_send(0))
    outbox = Outbox("a", transport, ours, lambda _p, _e, error: failures.append(error), limit)
    ours.run()
    theirs.run()
    assert outbox.put_if_room("b", _send(1)) and outbox.put_if_room("b", _send(2))
    called: list[str] = []
    assert outbox.wait_room("b", lambda: called.append("go"), "room-1") is Room.WAITS
    outbox.abandon(Unavailable("node a shut down"))  # (on the infrastructure thread)
    ours.run()
    assert len(failures) == 2 and outbox.pending() == 0
    assert "b" not in outbox._bytes  # the queue's bytes are back: there is room now
    assert called == ["go"], f"the waiter was never let go (still waiting: {outbox.waiting('b')})"


# -- 5. unacknowledged() iterates the transport thread's deques from another thread ----------
def test_unacknowledged_may_be_asked_from_another_thread_while_replies_flow(nodes):
    """``unacknowledged`` (asked by a stopping node, ``Node._send_out``, with no guard around
    it) runs ``_Outgoing.kept``, a Python-level generator over ``completion.unacked``, on the
    caller's thread while the transport thread appends to that deque (``_keep``) and pops it
    (``acknowledged``): ``RuntimeError: deque mutated during iteration`` escapes to the
    caller, which aborts the node's shutdown half way. (The switch interval is shortened only
    to make the interleaving, which happens at the default too, quick to find.)"""
    import sys

    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    stop = threading.Event()

    def replies() -> None:  # a node's replies to b, handed over from other threads
        i = 0
        while not stop.is_set():
            try:
                a.transport.send("a", "b", Channel.COMPLETION, b"r%d" % i)
            except Unavailable:
                return
            i += 1
            if i % 512 == 0:
                time.sleep(0.001)

    def b_takes() -> None:  # b's infrastructure thread: takes them (and acknowledges)
        while not stop.is_set():
            with b.infra._cond:
                b.infra._cond.wait_for(lambda: bool(b.infra.queue) or stop.is_set(), 0.05)
                batch, b.infra.queue[:] = list(b.infra.queue), []
            for fn, args in batch:
                fn(*args)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=replies), threading.Thread(target=b_takes)]
    for thread in threads:
        thread.start()
    error: BaseException | None = None
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                a.transport.unacknowledged()
            except RuntimeError as exc:
                error = exc
                break
    finally:
        sys.setswitchinterval(old)
        stop.set()
        for thread in threads:
            thread.join(WAIT)
    assert error is None, f"unacknowledged() raised on the caller's thread: {error!r}"


# -- 6. in-process transport: a node that registers again keeps its outbox blocked ------------
def test_a_node_registered_again_in_process_still_sends_to_a_peer_that_had_refused_it():
    """``InProcessTransport.reincarnate`` detaches and re-attaches the node: its flows go
    (the refused one's ``blocked`` with them), its peers hear ``peer_down``, but the node
    itself hears nothing about its peers (the ZeroMQ transport's ``_rebirth`` takes every
    peer down, so the node's ``Outbox.peer_down`` fails what it held). The outbox keeps the
    DATA the old flow refused, waiting for a ``writable`` that no flow owes any more, and
    everything later for that peer queues behind it: nothing reaches the peer again, and
    nothing is counted."""
    transport = InProcessTransport(data_limit=1)
    ours, theirs = _Jobs(), _Jobs()
    receiver = _Receiver()
    transport.attach("b", receiver, theirs)
    failures: list[ZLinkError] = []
    outbox = Outbox("a", transport, ours, lambda _p, _e, error: failures.append(error),
                    limit=1 << 20)  # fmt: skip
    transport.attach("a", _NodeLink(outbox), ours)
    ours.run()
    theirs.run()
    transport.pause("b", "a")  # b is full: it takes none of a's DATA for now
    outbox.put("b", _send(1))
    ours.run()  # the transport takes it (held for the pause)
    outbox.put("b", _send(2))
    ours.run()  # refused (the window of 1 is full): the outbox holds it
    assert outbox.pending() == 1
    transport.reincarnate("a", 2, [], lambda: None)  # a fenced itself and registered again
    ours.run()
    theirs.run()
    outbox.put("b", _send(3))  # a serves again; b takes a's DATA again (a new flow)
    for _ in range(5):
        ours.run()
        theirs.run()
    got = [wire.decode(f) for f in receiver.frames]
    assert _send(3) in got or failures, (
        f"nothing reached b and nothing failed: {outbox.pending()} envelope(s) stuck in a's "
        f"outbox behind a refused frame (b got {len(got)})"
    )


# -- 7. a batch of DATA for another incarnation counts one drop, not one per body -------------
def test_each_body_of_a_frame_for_another_incarnation_is_counted(nodes):
    """``_on_frame`` counts ``frames_wrong_incarnation`` once per ZeroMQ message for a frame
    whose header names another incarnation of this node, though a DATA message carries up to
    256 bodies (``_BATCH_BODIES``), each a message its sender counts when its session ends;
    the branch for a record that is down counts ``len(bodies)``. The two ends disagree."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("b", "#1"), a)
        send(_HEADER.pack(VERSION, _Kind.DATA, 99, 1, 7), b"one", b"two", b"three")
        assert _poll(lambda: counted.get("frames_wrong_incarnation", 0) >= 1)  # (one count)
    finally:
        ctx.destroy(linger=0)
    assert counted.get("frames_wrong_incarnation") == 3, counted
