"""``ZmqTransport`` between two transports of this process: credit, order, pause and shutdown.

Each transport gets a fake node: a ``Link`` that records what it is told and an ``Infra`` that
keeps what the transport submits until the test runs it (the test thread is both nodes'
infrastructure thread), so which callback runs when is the test's choice. Every wait is bounded
and waits on a condition, never on time alone.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import zlink.mesh.zmq_transport as zmq_transport
from zlink.errors import InvalidArgument, Unavailable
from zlink.mesh.transport import Channel
from zlink.mesh.zmq_transport import (
    _HEADER,
    VERSION,
    MeshEndpoint,
    ZmqTransport,
    _Kind,
    identity,
)

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


class Infra:
    """A node's infrastructure queue, run by the test (``run_until``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.queue: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            self.queue.append((fn, args))
            self._cond.notify_all()

    def wait_queued(self, check: Callable[[list[Any]], bool], what: str) -> None:
        """Wait, running nothing, until ``check(queued functions)`` holds."""
        with self._cond:
            ok = self._cond.wait_for(lambda: check([fn for fn, _ in self.queue]), WAIT)
        assert ok, f"not queued within {WAIT} s: {what}"

    def run_until(self, check: Callable[[], bool], what: str) -> None:
        """Run what is submitted, in order, until ``check()`` holds."""
        end = time.monotonic() + WAIT
        while not check():
            with self._cond:
                left = end - time.monotonic()
                if left <= 0 or not self._cond.wait_for(lambda: bool(self.queue), left):
                    break
                fn, args = self.queue.pop(0)
            fn(*args)
        assert check(), f"not within {WAIT} s: {what}"


class Link:
    """A node as its transport sees it: what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.on_data: Callable[[str, bytes], None] = lambda peer, data: None

    def received(self, peer: str, channel: Channel, data: bytes) -> None:
        self.events.append((channel.value, peer, data))
        if channel is Channel.DATA:
            self.on_data(peer, data)

    def peer_up(self, peer: str) -> None:
        self.events.append(("up", peer, None))

    def peer_down(self, peer: str) -> None:
        self.events.append(("down", peer, None))

    def writable(self, peer: str) -> None:
        self.events.append(("writable", peer, None))

    def seen(self, kind: str, peer: str | None = None) -> list[Any]:
        return [d for k, p, d in self.events if k == kind and peer in (None, p)]


class Node:
    """One transport with its fake node."""

    def __init__(self, node_id: str, incarnation: int = 1, **options: Any) -> None:
        options.setdefault("connect_timeout", 30.0)
        self.node_id, self.incarnation = node_id, incarnation
        self.transport = ZmqTransport("tcp://127.0.0.1:0", **options)
        self.endpoint = self.transport.endpoint(node_id)
        self.link, self.infra = Link(), Infra()
        self.attached = False

    def attach(self) -> Node:
        self.transport.attach(self.node_id, self.link, self.infra.submit, self.incarnation)
        self.attached = True
        return self

    def member(self) -> tuple[str, int, str]:
        return (self.node_id, self.incarnation, self.endpoint)

    def up(self, peer: str) -> None:
        self.infra.run_until(lambda: bool(self.link.seen("up", peer)), f"{peer} up")

    def stop(self) -> None:
        self.transport.detach(self.node_id)


@pytest.fixture
def nodes() -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(node_id: str, incarnation: int = 1, **options: Any) -> Node:
        node = Node(node_id, incarnation, **options)
        made.append(node)
        return node

    yield make
    for node in made:
        node.stop()


def _as_an_older_peer(node: Node) -> None:
    """``node`` hears no ``max_frame`` in greetings, as a node of the version before it was
    sent: it sends frames its peer will drop (the receiving side of that is under test)."""
    real = node.transport._on_hello

    def without_limit(ident: bytes, body: bytes) -> None:
        hello = json.loads(body)
        hello.pop("max_frame", None)
        real(ident, json.dumps(hello).encode())

    node.transport._on_hello = without_limit  # type: ignore[method-assign]


def _meshed(a: Node, b: Node) -> None:
    """``b`` learns ``a`` from the store and greets it; ``a`` connects back."""
    b.transport.learn([a.member()])
    a.up(b.node_id)
    b.up(a.node_id)


def test_credit_for_data_taken_while_the_receiver_connects_back_is_not_lost(nodes):
    """``b`` is up as soon as its HELLOs reach ``a``; ``a`` is still connecting back when
    ``b``'s DATA arrives, and takes it. The credit it owes must reach ``b`` once ``a`` is up:
    dropped, ``b``'s in-flight count never comes down and it waits for ``writable`` forever."""
    a = nodes("a", data_limit=2).attach()
    b = nodes("b", data_limit=2).attach()
    probe = a.transport._probe
    gate, cond, probes = threading.Event(), threading.Condition(), [0]

    def held_probe(peer: Any, channel: Channel) -> bool:
        """``a``'s HELLOs do not go through until the test opens the gate."""
        with cond:
            probes[0] += 1
            cond.notify_all()
        return gate.is_set() and probe(peer, channel)

    a.transport._probe = held_probe  # type: ignore[method-assign]
    b.transport.learn([a.member()])
    b.up("a")
    assert b.transport.send("b", "a", Channel.DATA, b"d1")
    assert b.transport.send("b", "a", Channel.DATA, b"d2")
    assert not b.transport.send("b", "a", Channel.DATA, b"d3")  # at its limit: writable owed
    a.infra.run_until(lambda: len(a.link.seen("data")) == 2, "a takes both")
    with cond:  # two more rounds of a's loop: its flush ran after the credit was owed
        seen = probes[0]
        assert cond.wait_for(lambda: probes[0] >= seen + 4, WAIT)
    assert not a.link.seen("up")  # a was connecting all along
    gate.set()
    a.up("b")
    b.infra.run_until(lambda: bool(b.link.seen("writable", "a")), "b may send again")


def test_replies_handed_over_before_goodbye_arrive_before_it(nodes, caplog):
    """Replies (COMPLETION) handed over before ``detach`` leave in the same flush as its BYE,
    on the same pipe: they must arrive first. Sent after it, the peer has already taken the
    node down and drops them: its callers fail with ``Unavailable`` though the answers came.

    (Failed once under CI's load on 3.13t, b seeing only ``down``; the counters and the
    transports' INFO log, which says why a peer went down, are kept for the next time.)"""
    caplog.set_level(logging.INFO, logger="zlink.mesh.zmq")
    a_counted, a_count = _counter()
    b_counted, b_count = _counter()
    a = nodes("a", count=a_count).attach()
    b = nodes("b", count=b_count).attach()
    _meshed(a, b)
    flush = a.transport._flush
    entered, release = threading.Event(), threading.Event()

    def held_flush() -> None:
        entered.set()
        assert release.wait(WAIT)
        flush()

    waking = threading.Event()
    wake = a.transport._wake

    def watched_wake() -> None:
        wake()
        waking.set()

    a.transport._flush = held_flush  # type: ignore[method-assign]
    assert entered.wait(WAIT)  # a's thread waits in its next flush
    a.transport._wake = watched_wake  # type: ignore[method-assign]
    for i in range(10):
        assert a.transport.send("a", "b", Channel.COMPLETION, b"reply %d" % i)
    stopper = threading.Thread(target=a.stop)
    stopper.start()
    assert waking.wait(WAIT)  # the goodbye is handed over too: all in one flush
    release.set()
    stopper.join(WAIT)
    assert not stopper.is_alive()
    b.infra.run_until(lambda: bool(b.link.seen("down", "a")), "b sees a go")
    kinds = [k for k, _, _ in b.link.events if k in ("completion", "down")]
    assert kinds == ["completion"] * 10 + ["down"], (a_counted, b_counted, b.link.events)


def test_replies_still_on_one_pipe_arrive_before_down_when_the_other_pipes_goodbye_came_first(
    nodes,
):
    """The goodbye goes on each pipe, after what was sent on it; the pipes are two
    connections, read in either order. ``b`` had read ``a``'s goodbye on DATA, not yet the
    replies and the goodbye on COMPLETION, when a ping of its own found no pipe to ``a`` (it
    had closed its sockets): ``b`` took ``a`` down then, and the replies came after it (met
    again, as from a peer that never said goodbye), so a caller could be failed though its
    answer came. (How the goodbye test above failed once under CI's load, b seeing only
    ``down``.) A peer whose goodbye came on one pipe is down once it comes on the other, or a
    moment after a send to it found no pipe, not at once."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    tb = b.transport
    read, gate = tb._read_peer, threading.Event()

    def held_read(channel: Channel, sock: Any) -> None:
        if channel is Channel.COMPLETION and not gate.is_set():
            return  # (b reads COMPLETION later: the other connection lags)
        read(channel, sock)

    tb._read_peer = held_read  # type: ignore[method-assign]
    for i in range(10):
        assert a.transport.send("a", "b", Channel.COMPLETION, b"reply %d" % i)
    a.stop()  # replies, then the goodbye on each pipe; then its sockets close
    end = time.monotonic() + WAIT
    peer = tb._peers["a"]
    while Channel.DATA not in peer.byes and time.monotonic() < end:
        _on_thread(tb, lambda: None)
    assert peer.byes == {Channel.DATA}
    tried = threading.Event()
    real_send = tb._send

    def watched_send(*args: Any) -> bool:
        sent = real_send(*args)
        if not sent:
            tried.set()
        return sent

    tb._send = watched_send  # type: ignore[method-assign]
    while not tried.is_set() and time.monotonic() < end:
        _on_thread(tb, tb._ping)  # until a ping of b's finds no pipe to a
    assert tried.is_set()
    gate.set()
    tb._wake()
    b.infra.run_until(lambda: bool(b.link.seen("down", "a")), "b sees a go")
    b.infra.run_until(lambda: len(b.link.seen("completion", "a")) == 10, "every reply")
    kinds = [k for k, _, _ in b.link.events if k in ("completion", "down", "up")]
    assert kinds == ["up"] + ["completion"] * 10 + ["down"]


def test_a_peer_whose_goodbye_never_comes_on_its_other_pipe_is_down_a_moment_later(nodes):
    """The test above, with ``a``'s goodbye on COMPLETION never read: once a send found no
    pipe to ``a``, ``b`` waits ``_leave_grace`` for it (five pings), then takes ``a`` down."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    tb = b.transport
    read = tb._read_peer
    tb._read_peer = lambda channel, sock: (  # type: ignore[method-assign]
        None if channel is Channel.COMPLETION else read(channel, sock)
    )
    a.stop()
    b.infra.run_until(lambda: bool(b.link.seen("down", "a")), "b takes a down")
    assert tb._peers.get("a") is None


class _WatchedLock:
    """A lock that says when someone had to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.contended = threading.Event()

    def __enter__(self) -> _WatchedLock:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_detach_never_closes_the_wake_up_socket_under_a_sender():
    """Other threads (the infrastructure thread's sends, credits) may still wake the transport
    thread while ``detach`` runs. The wake-up socket is theirs under ``_wake_lock``: closing
    it meanwhile (ZeroMQ sockets are not thread-safe) may crash the process in libzmq."""
    transport = ZmqTransport("tcp://127.0.0.1:0")
    transport.endpoint("n1")
    real = transport._wake_w
    inside, release, closed_inside = threading.Event(), threading.Event(), []

    class SlowSocket:
        """The wake-up socket, with a send that takes its time."""

        def send(self, data: bytes, flags: int = 0) -> None:
            inside.set()
            assert release.wait(WAIT)
            closed_inside.append(real.closed)
            real.send(data, flags)

        def close(self, linger: int | None = None) -> None:
            real.close(linger)

    lock = _WatchedLock()
    transport._wake_lock = lock  # type: ignore[assignment]
    transport._wake_w = SlowSocket()  # type: ignore[assignment]
    sender = threading.Thread(target=transport.send_client, args=(b"c1", b"reply"))
    sender.start()
    assert inside.wait(WAIT)
    stopper = threading.Thread(target=transport.detach, args=("n1",))
    stopper.start()
    for _ in range(int(WAIT / 0.01)):  # detach waits for the sender, or it is done
        if lock.contended.wait(0.01) or not stopper.is_alive():
            break
    assert not real.closed
    release.set()
    sender.join(WAIT)
    stopper.join(WAIT)
    assert not sender.is_alive() and not stopper.is_alive()
    assert closed_inside == [False]
    assert real.closed
    transport.send_client(b"c1", b"late")  # after detach: nothing to wake, and no error
    transport._wake_now()


def test_a_pause_meant_for_an_old_incarnation_does_not_hold_the_new_one(nodes):
    """``b`` restarts (incarnation 2) while ``a``'s node still takes DATA of the first one and
    pauses ``b`` for it (as the router does at its backlog limit), before it hears that ``b``
    went down. On ``peer_down`` the node forgets that pause and will never resume it: the
    transport must not keep it on the new incarnation, whose DATA would be held forever."""
    a = nodes("a").attach()
    b1 = nodes("b").attach()
    _meshed(a, b1)
    paused: list[str] = []

    def like_the_router(peer: str, data: bytes) -> None:
        if data == b"old":
            paused.append(peer)
            a.transport.pause("a", peer)

    a.link.on_data = like_the_router
    assert b1.transport.send("b", "a", Channel.DATA, b"old")
    a.infra.wait_queued(lambda fns: len(fns) == 1, "the old DATA waits for a's node")
    b2 = nodes("b", incarnation=2).attach()
    a.transport.learn([b2.member()])  # the store lists b's new incarnation
    a.infra.wait_queued(lambda fns: a.link.peer_up in fns, "a meets b again")
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a's node hears all that")
    assert paused == ["b"] and a.link.seen("down", "b")
    b2.up("a")
    assert b2.transport.send("b", "a", Channel.DATA, b"new")
    a.infra.run_until(lambda: b"new" in a.link.seen("data", "b"), "a takes b's new DATA")


def test_a_member_with_an_endpoint_zeromq_refuses_does_not_stop_the_others(nodes):
    """A record in the store (or a HELLO) whose endpoints parse but cannot be connected to is
    skipped like any unreachable member: the members after it are still met at once."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    bad = ("x", 1, "tcp://127.0.0.1:1 data=nowhere completion=nowhere token=t")
    a.transport.learn([bad, b.member()])
    a.up("b")
    b.up("a")
    assert a.transport.peers() == ["b"]


def _on_thread(transport: ZmqTransport, fn: Callable[[], None]) -> None:
    """Run ``fn`` once on ``transport``'s own thread, then meet the members it learned."""
    done = threading.Event()
    take = transport._take_learned

    def once() -> None:
        first = not done.is_set()
        if first:
            fn()
        take()
        if first:
            done.set()

    transport._take_learned = once  # type: ignore[method-assign]
    transport._wake()
    assert done.wait(WAIT)


def test_a_peer_dropped_while_its_pipes_were_up_is_met_again(nodes):
    """``a`` takes ``b`` down while ``b``'s pipes are still there (as after a failure found
    on one of the two, or a connect timeout with one HELLO through), and ``_release``
    disconnects them. When the store lists ``b`` again, ``a`` connects to the same endpoints
    and must get through: a disconnected pipe that lingers under ``b``'s routing id (until the
    out socket handles ZeroMQ's commands) refused every new connection to them."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    _on_thread(a.transport, lambda: a.transport._down(a.transport._peers["b"], "test"))
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a drops b")
    _on_thread(a.transport, lambda: a.transport.learn([b.member()]))  # the store lists b
    # a connects to b again: what it sends meanwhile leaves the moment it is up
    assert a.transport.send("a", "b", Channel.DATA, b"again")
    assert a.transport.send("a", "b", Channel.COMPLETION, b"reply")
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again")
    b.infra.run_until(lambda: b"again" in b.link.seen("data", "a"), "b takes a's DATA")
    b.infra.run_until(lambda: b"reply" in b.link.seen("completion", "a"), "and its reply")


class _LingeringPipe:
    """An out socket whose pipe to ``ident``, once disconnected, stays writable and leads
    nowhere until ``gone`` is set: libzmq's, with ``IMMEDIATE``, until the socket handles the
    command that ends it (which the test cannot time). Everything else is the real socket."""

    def __init__(self, sock: Any, ident: bytes, gone: threading.Event) -> None:
        self._sock, self._ident, self._gone = sock, ident, gone
        self.disconnected = False
        self.swallowed: list[list[bytes]] = []

    def disconnect(self, endpoint: str) -> None:
        self._sock.disconnect(endpoint)
        self.disconnected = True

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        if self.disconnected and frames[0] == self._ident and not self._gone.is_set():
            self.swallowed.append(frames)
            return
        self._sock.send_multipart(frames, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_peer_met_again_is_greeted_only_on_its_new_connection(nodes):
    """``a`` takes ``b`` down and the store lists ``b`` again before ``a``'s out sockets have
    ended the pipes of the old connections, which bear ``b``'s routing id. ``a`` must not
    greet ``b`` through them: its HELLOs, and what it sent next, were lost there, and ``a``
    took ``b`` for up; once those pipes ended, before the new ones came, a send found none and
    took ``b`` down again, failing calls to a peer that had come back with ``Unavailable``."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    gone = threading.Event()
    pipes: list[_LingeringPipe] = []

    def drop_b() -> None:
        outs = a.transport._outs
        for channel, sock in outs.items():
            pipes.append(_LingeringPipe(sock, a.transport._peers["b"].ident, gone))
            outs[channel] = pipes[-1]  # type: ignore[assignment]
        a.transport._down(a.transport._peers["b"], "test")

    _on_thread(a.transport, drop_b)
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a drops b")

    def meet_b_and_send() -> None:  # all before a's thread greets b
        a.transport.learn([b.member()])  # the store lists b
        ZmqTransport._take_learned(a.transport)
        assert a.transport.send("a", "b", Channel.DATA, b"again")
        assert a.transport.send("a", "b", Channel.COMPLETION, b"reply")

    _on_thread(a.transport, meet_b_and_send)
    _on_thread(a.transport, lambda: None)  # a's thread went once through greeting and sending
    assert a.transport.peers() == []  # still connecting: not up on the strength of old pipes
    assert all(p.disconnected for p in pipes)
    gone.set()
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again")
    b.infra.run_until(lambda: b"again" in b.link.seen("data", "a"), "b takes a's DATA")
    b.infra.run_until(lambda: b"reply" in b.link.seen("completion", "a"), "and its reply")
    assert len(a.link.seen("down", "b")) == 1
    for pipe in pipes:  # the old pipes took nothing but probes
        assert {frames[1][1] for frames in pipe.swallowed} <= {_Kind.PING}


def test_a_peer_taken_down_that_still_sends_is_met_again_and_loses_nothing(nodes):
    """There is no session between peers: ``a`` takes ``b`` down (a failed ping, say) and
    ``b``, never told, keeps sending. What it sends must be taken and credited on a new
    meeting, not dropped: dropped, its credit was gone too and ``b`` sat at its limit for
    good, its calls waiting for their deadlines."""
    a = nodes("a", data_limit=2).attach()
    b = nodes("b", data_limit=2).attach()
    _meshed(a, b)
    _on_thread(a.transport, lambda: a.transport._down(a.transport._peers["b"], "test"))
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a drops b")
    assert b.transport.reachable("a")  # b never heard
    assert b.transport.send("b", "a", Channel.DATA, b"one")
    assert b.transport.send("b", "a", Channel.DATA, b"two")
    assert not b.transport.send("b", "a", Channel.DATA, b"three")  # at its limit of 2
    a.infra.run_until(
        lambda: a.link.seen("data", "b") == [b"one", b"two"] and bool(a.link.seen("up", "b")),
        "a takes b's DATA and meets b again",
    )
    b.infra.run_until(lambda: bool(b.link.seen("writable", "a")), "b gets its credit back")
    assert b.transport.send("b", "a", Channel.DATA, b"three")
    a.infra.run_until(lambda: b"three" in a.link.seen("data", "b"), "and goes on")
    assert a.transport.send("a", "b", Channel.COMPLETION, b"reply")  # a reaches b again
    b.infra.run_until(lambda: b"reply" in b.link.seen("completion", "a"), "b hears a")


def test_a_detached_transport_refuses_sends_as_unreachable(nodes):
    """As the in-process transport does: after ``detach`` nothing is taken that nobody would
    ever send."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    a.transport.detach("a")
    with pytest.raises(Unavailable):
        a.transport.send("a", "b", Channel.DATA, b"late")


def test_an_oversized_frame_in_a_batch_drops_only_itself_and_is_credited(nodes):
    """A receiver with a smaller ``max_frame_bytes`` than its sender drops the frames over
    it, counted, and takes the others of the same message; the dropped ones are credited so
    the sender does not wait for them."""
    counted: dict[str, int] = {}

    def count(name: str, n: int = 1) -> None:
        counted[name] = counted.get(name, 0) + n

    a = nodes("a", data_limit=4, max_frame_bytes=1024, count=count).attach()
    b = nodes("b", data_limit=4).attach()
    _as_an_older_peer(b)  # (one that a's limit is not told to: it sends, a drops)
    _meshed(a, b)
    hold = threading.Event()  # keep b's transport thread from flushing until all are queued
    flush = b.transport._flush

    def held() -> None:
        hold.wait(WAIT)
        flush()

    b.transport._flush = held  # type: ignore[method-assign]
    for data in (b"small-1", b"x" * 2000, b"small-2", b"small-3"):
        assert b.transport.send("b", "a", Channel.DATA, data)
    assert not b.transport.send("b", "a", Channel.DATA, b"small-4")  # at its limit of 4
    hold.set()
    a.infra.run_until(
        lambda: a.link.seen("data", "b") == [b"small-1", b"small-2", b"small-3"], "the rest"
    )
    assert counted.get("oversized_frames") == 1
    b.infra.run_until(lambda: bool(b.link.seen("writable", "a")), "credit for all four")


def test_a_node_remembers_one_old_incarnation_of_a_peer_not_all_of_them(nodes):
    """Each restart of a peer is a new incarnation; a long-lived node keeps the one before
    the current (to count its late frames), not one entry per restart forever."""
    from zlink.mesh.zmq_transport import MeshEndpoint

    a = nodes("a").attach()
    b = nodes("b").attach()
    endpoint = MeshEndpoint.parse(b.endpoint)

    def restarts() -> None:
        for incarnation in range(1, 8):
            a.transport._meet("b", incarnation, endpoint)

    _on_thread(a.transport, restarts)
    kept = [p.incarnation for p in a.transport._by_ident.values() if p.node_id == "b"]
    assert sorted(kept) == [6, 7]


def test_data_in_flight_is_bounded_in_bytes_and_a_large_frame_still_goes_alone(nodes):
    """python-api §9: the credit counts bytes as well as frames, so a receiver that pauses its
    peer holds at most ``data_bytes`` of it (or one frame larger than that); the credit the
    receiver returns names the bytes it took, and the sender may send again."""
    a = nodes("a", data_limit=100, data_bytes=1000).attach()
    b = nodes("b", data_limit=100, data_bytes=1000).attach()
    _meshed(a, b)
    assert b.transport.send("b", "a", Channel.DATA, b"x" * 400)
    assert b.transport.send("b", "a", Channel.DATA, b"y" * 400)
    assert not b.transport.send("b", "a", Channel.DATA, b"z" * 400)  # 1,200 > 1,000 bytes
    assert not b.transport.send("b", "a", Channel.DATA, b"tiny" * 51)  # 1,004 > 1,000
    a.infra.run_until(lambda: len(a.link.seen("data", "b")) == 2, "a takes both")

    def writable_after(n: int, what: str) -> None:
        b.infra.run_until(lambda: len(b.link.seen("writable", "a")) > n, what)

    writable_after(0, "the bytes credited back")
    big = b"B" * 5000  # larger than the byte limit: it goes alone, once nothing is in flight
    if not b.transport.send("b", "a", Channel.DATA, big):
        # the two frames came as two messages, credited one by one: the first credit made b
        # writable with the second still in flight; its credit makes b writable again
        writable_after(1, "the second frame credited back")
        assert b.transport.send("b", "a", Channel.DATA, big)
    assert not b.transport.send("b", "a", Channel.DATA, b"after")
    seen = len(b.link.seen("writable", "a"))
    a.infra.run_until(lambda: a.link.seen("data", "b")[-1:] == [big], "the large frame")
    writable_after(seen, "credited again")
    assert b.transport.send("b", "a", Channel.DATA, b"after")


class _Swallow:
    """An out socket whose pipe to ``ident`` takes frames of ``kind`` and loses them, as a
    connection that drops loses what its pipe and its kernel buffers held. Everything else is
    the real socket."""

    def __init__(self, sock: Any, ident: bytes, kind: _Kind = _Kind.DATA) -> None:
        self._sock, self._ident, self._kind = sock, ident, kind
        self.swallowed: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        if frames[0] == self._ident and frames[1][1] == self._kind:
            self.swallowed.append(frames)
            return
        self._sock.send_multipart(frames, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _drop_and_meet_again(a: Node, b: Node) -> None:
    """``a`` takes ``b`` down (its connection dropped) and, the store listing ``b`` still,
    meets it again."""
    _on_thread(a.transport, lambda: a.transport._down(a.transport._peers[b.node_id], "test"))
    a.infra.run_until(lambda: bool(a.link.seen("down", b.node_id)), "a drops b")
    a.transport.learn([b.member()])
    a.infra.run_until(lambda: len(a.link.seen("up", b.node_id)) == 2, "a meets b again")


@pytest.mark.parametrize("channel", [Channel.DATA, Channel.COMPLETION])
def test_what_a_dropped_connection_lost_is_sent_again_when_the_peer_is_met_again(nodes, channel):
    """python-api §9: what a node accepted for a peer is handled there or counted as dropped.
    A ZeroMQ connection that drops (a heartbeat timeout: the peer froze, the network went)
    loses what its pipe held, and the peer, alive, is met again: what ``a`` sent and ``b``
    never acknowledged is sent again on the new connection, first, once, in order; DATA
    (calls, sends) and COMPLETION (replies, hints, fences) alike (a lost reply used to leave
    its caller to its deadline)."""
    counted, count = _counter()
    kind = _Kind.DATA if channel is Channel.DATA else _Kind.COMPLETION
    a = nodes("a", count=count).attach()
    b = nodes("b").attach()
    _meshed(a, b)
    outs = a.transport._outs
    real = outs[channel]
    lossy = _Swallow(real, a.transport._peers["b"].ident, kind)

    def swap(sock: Any) -> Callable[[], None]:
        def run() -> None:
            outs[channel] = sock

        return run

    _on_thread(a.transport, swap(lossy))
    assert a.transport.send("a", "b", channel, b"one")
    assert a.transport.send("a", "b", channel, b"two")
    _on_thread(a.transport, lambda: None)  # the turn that runs this sends both, after it
    _on_thread(a.transport, swap(real))
    assert [body for f in lossy.swallowed for body in f[2:]] == [b"one", b"two"]
    _drop_and_meet_again(a, b)
    assert a.transport.send("a", "b", channel, b"three")
    b.infra.run_until(lambda: len(b.link.seen(channel.value, "a")) >= 3, "b takes all three")
    assert b.link.seen(channel.value, "a") == [b"one", b"two", b"three"]
    assert counted.get(f"{channel.value}_resent") == 2
    peer = a.transport._peers["b"]
    end = time.monotonic() + WAIT
    while peer.out.kept() and time.monotonic() < end:  # b acknowledges at its next ping
        time.sleep(0.005)  # (a's transport thread takes it: no event to wait on)
    assert peer.out.kept() == 0


def test_data_resent_that_had_arrived_is_dropped_as_a_duplicate(nodes):
    """What arrived but was not acknowledged yet when the connection dropped is sent again
    too; the receiver knows it by its sequence number and drops the copy (counted), so it is
    handled once, and credits it, so the sender's window is not lost."""
    counted, count = _counter()
    a = nodes("a", data_limit=8).attach()
    b = nodes("b", data_limit=8, count=count).attach()
    _meshed(a, b)
    assert a.transport.send("a", "b", Channel.DATA, b"one")
    b.infra.run_until(lambda: b.link.seen("data", "a") == [b"one"], "b takes one")
    _drop_and_meet_again(a, b)
    assert a.transport.send("a", "b", Channel.DATA, b"two")
    b.infra.run_until(lambda: b"two" in b.link.seen("data", "a"), "b takes two")
    assert b.link.seen("data", "a") == [b"one", b"two"]
    assert counted.get("data_duplicates") == 1
    peer = a.transport._peers["b"]
    end = time.monotonic() + WAIT
    while (peer.in_flight or peer.out.kept()) and time.monotonic() < end:  # b's credit
        time.sleep(0.005)  # (a's transport thread takes it: no event to wait on)
    assert peer.in_flight == 0 and not peer.out.kept()  # credited and acknowledged
    for i in range(8):  # the window is whole again: 8 frames in flight at most
        assert a.transport.send("a", "b", Channel.DATA, b"more-%d" % i)
    b.infra.run_until(lambda: len(b.link.seen("data", "a")) == 10, "b takes the rest")


def test_data_held_when_a_peer_says_goodbye_is_still_delivered_before_it_goes(nodes):
    """python-api §9: what a node accepted for a peer is handled there or counted. A node
    that stops gracefully may have sent DATA that its peer holds (it paused that node, being
    full). The peer takes it, in order, and only then takes the node down: dropped, sends the
    node had accepted were lost, counted at the peer only (``frames_dropped_peer_down``)."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    b.transport.pause("b", "a")
    for i in range(5):
        assert a.transport.send("a", "b", Channel.DATA, b"held %d" % i)
    held = b.transport._peers["a"].held
    end = time.monotonic() + WAIT
    while len(held) < 5 and time.monotonic() < end:  # b's transport thread reads them
        time.sleep(0.005)  # (no event to wait on)
    assert len(held) == 5
    a.stop()
    b.infra.run_until(lambda: bool(b.link.seen("down", "a")), "b sees a go")
    kinds = [k for k, _, _ in b.link.events if k in ("data", "down")]
    assert kinds == ["data"] * 5 + ["down"]
    assert b.link.seen("data", "a") == [b"held %d" % i for i in range(5)]


def _raw_sender(ctx: zmq.Context[Any], routing_id: bytes, node: Node) -> Callable[..., None]:
    """A bare ROUTER that sends to ``node``'s DATA in socket as ``routing_id``: what it
    returns sends one message, once the handshake lets it."""
    endpoint = MeshEndpoint.parse(node.endpoint)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint.data)
    target = identity(node.node_id, "@" + endpoint.token)

    def send(*frames: bytes) -> None:
        for _ in range(int(WAIT / 0.005)):
            try:
                sock.send_multipart([target, *frames])
                return
            except zmq.ZMQError:
                time.sleep(0.005)  # the handshake is not done yet
        raise AssertionError(f"could not reach {node.node_id}")

    return send


def test_a_greeting_naming_a_newer_incarnation_does_not_take_a_live_peer_down(nodes):
    """A fresh-eyes probe: one HELLO on a peer port, claiming to be ``b`` restarted (a newer
    incarnation, dead endpoints), made ``a`` take the live ``b`` down, and ``a``'s calls to
    it failed for seconds. Whether a node is a member, and at which incarnation, is the
    store's word (python-api §10), never a connection's: ``a`` meets the newer incarnation
    only once the store lists it."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b").attach()
    _meshed(a, b)
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("b", "#1000"), a)
        dead = MeshEndpoint("tcp://127.0.0.1:9", "tcp://127.0.0.1:9", "tcp://127.0.0.1:9", "x")
        hello = json.dumps({"node": "b", "incarnation": 1000, "mesh": "main",
                            "endpoint": dead.encode()}).encode()  # fmt: skip
        send(_HEADER.pack(VERSION, _Kind.HELLO, 0, 0, 0), hello)
        end = time.monotonic() + WAIT
        while not counted.get("hellos_unlisted") and time.monotonic() < end:
            time.sleep(0.005)  # a's transport thread reads it (no event to wait on)
        assert counted.get("hellos_unlisted") == 1
    finally:
        ctx.destroy(linger=0)
    assert not a.link.seen("down", "b") and a.transport.peers() == ["b"]
    assert a.transport.send("a", "b", Channel.DATA, b"still there")
    b.infra.run_until(lambda: b"still there" in b.link.seen("data", "a"), "b takes it")


@pytest.mark.parametrize("limit", [1, 1024])
def test_credit_owed_to_a_peer_taken_down_reaches_it_when_it_is_met_again(nodes, limit):
    """A review's finding: ``a`` takes ``b`` down while ``b``'s DATA waits for ``a``'s
    infrastructure thread; ``b`` never hears. The credit for it was owed on ``a``'s old
    record, lost when ``b`` was met again on a new one: ``b`` sat at its window for good.
    Credit is owed to the incarnation now, whichever record of it is up."""
    a = nodes("a", data_limit=limit).attach()
    b = nodes("b", data_limit=limit).attach()
    _meshed(a, b)
    n = 0
    while b.transport.send("b", "a", Channel.DATA, b"x%d" % n):
        n += 1
    assert n == limit
    a.infra.wait_queued(
        lambda fns: any(getattr(f, "__name__", "") == "_deliver" for f in fns), "b's DATA in"
    )
    _on_thread(a.transport, lambda: a.transport._down(a.transport._peers["b"], "test"))
    a.infra.run_until(
        lambda: len(a.link.seen("data", "b")) == n and bool(a.link.seen("up", "b")),
        "a takes b's DATA, drops b, and meets it again (b keeps pinging)",
    )
    b.infra.run_until(lambda: bool(b.link.seen("writable", "a")), "b gets its credit back")
    assert b.transport.send("b", "a", Channel.DATA, b"more")
    a.infra.run_until(lambda: b"more" in a.link.seen("data", "b"), "and goes on")


def test_what_a_restarted_peer_sends_before_the_store_lists_it_is_kept_for_then(nodes):
    """A review's finding: a node ignores the HELLO of a peer's newer incarnation until the
    store lists it, but that incarnation is up at its end and sends at once; past 64 frames
    what it sent was dropped (counted at the receiver only) and its credit never came back.
    Kept up to a DATA window now, and handed on in order when the store lists it."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b").attach()
    _meshed(a, b)
    b.transport.reincarnate("b", 2, [a.member()], lambda: None)
    b.infra.run_until(lambda: len(b.link.seen("up", "a")) == 2, "b#2 up at its end")
    for i in range(100):  # a frame each (a flush per send), as under light load
        assert b.transport.send("b", "a", Channel.DATA, b"m%d" % i)
        assert b.transport.send("b", "a", Channel.COMPLETION, b"r%d" % i)
        _on_thread(b.transport, lambda: None)
    end = time.monotonic() + WAIT
    while counted.get("hellos_unlisted", 0) < 1 and time.monotonic() < end:
        time.sleep(0.005)  # a's transport thread reads them (no event to wait on)
    b.incarnation = 2
    a.transport.learn([b.member()])  # the store lists b#2
    a.infra.run_until(
        lambda: len(a.link.seen("data", "b")) == 100 and len(a.link.seen("completion", "b")) == 100,
        "a takes all of it",
    )
    assert a.link.seen("data", "b") == [b"m%d" % i for i in range(100)]
    assert "frames_from_strangers" not in counted
    peer = b.transport._peers["a"]
    end = time.monotonic() + WAIT
    while (peer.in_flight or peer.out.kept()) and time.monotonic() < end:
        b.infra.run_until(lambda: True, "nothing")
        time.sleep(0.005)  # a's credit and acknowledgement (no event to wait on)
    assert peer.in_flight == 0 and not peer.out.kept()


def test_data_waiting_for_a_peer_still_connecting_is_counted_when_the_node_stops(nodes):
    """A review's finding: DATA taken for a peer that never came up (``waiting``) was neither
    waited for by a stopping node nor counted: lost without a trace (python-api §9)."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    dead = "tcp://127.0.0.1:%d data=tcp://127.0.0.1:%d completion=tcp://127.0.0.1:%d token=t"
    a.transport.learn([("b", 1, dead % tuple(ports))])  # listed, and nobody answers there
    end = time.monotonic() + WAIT
    while not a.transport.reachable("b") and time.monotonic() < end:
        time.sleep(0.005)
    for i in range(5):
        assert a.transport.send("a", "b", Channel.DATA, b"d%d" % i)
    assert a.transport.unacknowledged() == 5  # a stopping node waits for these
    a.stop()
    assert counted.get("data_unacknowledged_at_stop") == 5


# -- a second review's findings: each failed before its fix --------------------------------
def _credited(node: Node, peer: str) -> None:
    """Wait (bounded) until ``node`` has nothing in flight to ``peer``: its credit came back."""
    record = node.transport._peers[peer]
    end = time.monotonic() + WAIT
    while node.transport._peers[peer].in_flight and time.monotonic() < end:
        time.sleep(0.005)  # the transport threads' progress: no event to wait on
    assert node.transport._peers[peer].in_flight == 0, record


class _OnceNoPipeFor:
    """EHOSTUNREACH once for one kind to ``ident`` (as a pipe that just ended), then real."""

    def __init__(self, sock: Any, ident: bytes, kind: _Kind) -> None:
        self._sock, self._ident, self._kind, self.fired = sock, ident, kind, False

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        if not self.fired and frames[0] == self._ident and frames[1][1] == self._kind:
            self.fired = True
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        self._sock.send_multipart(frames, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _counter() -> tuple[dict[str, int], Callable[..., None]]:
    """A counter function for a transport (``count=``) and what it counted (any thread)."""
    counted: dict[str, int] = {}
    lock = threading.Lock()

    def count(name: str, n: int = 1) -> None:
        with lock:
            counted[name] = counted.get(name, 0) + n

    return counted, count


def test_credit_whose_frame_found_no_pipe_is_sent_again(nodes):
    """a zeroes credit_due in _flush, then the CREDIT finds no pipe: a takes b down, b
    never hears (its pipes to a are fine), and the credit is never sent again."""
    a = nodes("a", data_limit=1).attach()
    b = nodes("b", data_limit=1).attach()
    _meshed(a, b)
    t = a.transport
    outs = t._outs
    once = _OnceNoPipeFor(outs[Channel.COMPLETION], t._peers["b"].ident, _Kind.CREDIT)
    _on_thread(t, lambda: outs.__setitem__(Channel.COMPLETION, once))
    assert b.transport.send("b", "a", Channel.DATA, b"x0")
    a.infra.run_until(lambda: a.link.seen("data", "b") == [b"x0"], "a takes x0")
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a's CREDIT found no pipe")
    assert once.fired
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again (b pings)")
    _credited(b, "a")
    assert b.transport.send("b", "a", Channel.DATA, b"x1"), "b stuck at its window for good"


def test_credit_lost_in_a_dropped_connection_is_sent_again(nodes):
    """The same with the CREDIT lost in transit (a connection that drops loses what its
    pipe held): credit is a difference, sent once, so it is kept and sent again like a reply
    when the connection is met again; b, which did not go down, was stuck for good."""
    a = nodes("a", data_limit=1).attach()
    b = nodes("b", data_limit=1).attach()
    _meshed(a, b)
    lossy, restore = _credits_lost(a, "b")
    assert b.transport.send("b", "a", Channel.DATA, b"x0")
    a.infra.run_until(lambda: a.link.seen("data", "b") == [b"x0"], "a takes x0")
    end = time.monotonic() + WAIT
    while not lossy.swallowed and time.monotonic() < end:
        time.sleep(0.005)
    restore()
    _drop_and_meet_again(a, b)  # the connection that lost it drops; a meets b again
    _credited(b, "a")
    assert b.transport.send("b", "a", Channel.DATA, b"x1"), "b stuck at its window for good"


def _credits_lost(node: Node, peer: str) -> tuple[_Swallow, Callable[[], None]]:
    """``node``'s CREDITs to ``peer`` are lost in transit (swallowed on its COMPLETION pipe)
    until ``restore`` (returned with the swallower) puts the real pipe back."""
    t = node.transport
    outs = t._outs
    real = outs[Channel.COMPLETION]
    lossy = _Swallow(real, t._peers[peer].ident, _Kind.CREDIT)
    _on_thread(t, lambda: outs.__setitem__(Channel.COMPLETION, lossy))
    return lossy, lambda: _on_thread(t, lambda: outs.__setitem__(Channel.COMPLETION, real))


class _Blackhole:
    """Everything to ``ident`` is lost while ``on`` (a one-way outage the sender never sees)."""

    def __init__(self, sock: Any, ident: bytes) -> None:
        self._sock, self._ident, self.on = sock, ident, True

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        if self.on and frames[0] == self._ident:
            return
        self._sock.send_multipart(frames, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_session_ended_on_one_side_only_starts_over_on_both(nodes, monkeypatch, caplog):
    """b takes a down and hears nothing from a for _SESSION_LINGER (a frozen, or a one-way
    outage): b ends its session with a#1. a's session with b#1 lives on (taken = 3). When b
    meets a#1 again it numbers from 1: a drops b's next replies and DATA as duplicates."""
    monkeypatch.setattr(zmq_transport, "_SESSION_LINGER", 0.3)
    caplog.set_level(logging.INFO, logger="zlink.mesh.zmq")  # (why a peer went down: it
    counted, count = _counter()  # failed once in the full suite, its text lost)
    b_counted, b_count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b", count=b_count).attach()
    _meshed(a, b)
    for i in range(3):
        assert b.transport.send("b", "a", Channel.DATA, b"d%d" % i)
        assert b.transport.send("b", "a", Channel.COMPLETION, b"c%d" % i)
    a.infra.run_until(
        lambda: len(a.link.seen("data", "b")) == 3 and len(a.link.seen("completion", "b")) == 3,
        "a takes them",
    )
    ta, tb = a.transport, b.transport
    holes = {}

    def marked_then_blackhole() -> None:
        """(a's thread.) A last frame on each pipe, then nothing more reaches b: once b has
        read both, it has read all a sent. (Without them, a ping a sent just before, read by
        b after it took a down, made b meet a again at once: its session never ended, and
        the test failed once in the full suite under load.)"""
        assert ta.send("a", "b", Channel.DATA, b"last")
        assert ta.send("a", "b", Channel.COMPLETION, b"last")
        ta._flush()
        for ch, sock in list(ta._outs.items()):
            holes[ch] = _Blackhole(sock, ta._peers["b"].ident)
            ta._outs[ch] = holes[ch]

    _on_thread(ta, marked_then_blackhole)
    b.infra.run_until(
        lambda: b"last" in b.link.seen("data", "a") and b"last" in b.link.seen("completion", "a"),
        "b reads the last of what a sent",
    )
    _on_thread(tb, lambda: tb._down(tb._peers["a"], "test: a froze"))
    end = time.monotonic() + WAIT
    while ("a", 1) in tb._outgoing and time.monotonic() < end:
        time.sleep(0.01)
    assert ("a", 1) not in tb._outgoing, "b ended its session with a#1"
    assert ta._peers["b"].inc.taken == 3  # a's lives on
    for h in holes.values():
        h.on = False  # a thaws; its pings reach b, which meets a#1 again
    b.infra.run_until(lambda: len(b.link.seen("up", "a")) == 2, "b meets a again")
    assert tb.send("b", "a", Channel.COMPLETION, b"reply after")
    assert tb.send("b", "a", Channel.DATA, b"data after")
    a.infra.run_until(
        lambda: (
            b"reply after" in a.link.seen("completion", "b")
            and b"data after" in a.link.seen("data", "b")
        ),
        "a takes both: b's new session is numbered from 1 again at a too",
    )
    assert counted.get("sessions_started_over") == 1, (counted, b_counted)


def test_what_was_handed_over_for_a_record_that_went_down_goes_before_later_sends(nodes):
    """d1 is handed over while b's record P1 is up; P1 goes down (a ping finds no pipe)
    before a flush takes d1; b is met again (P2, connecting) and d2 is handed over to P2
    (waiting). The flush redirects d1 to P2.waiting *behind* d2: b takes d2, then d1."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    t = a.transport

    def run() -> None:
        assert t.send("a", "b", Channel.DATA, b"d1")  # P1 up: into _outq
        t._down(t._peers["b"], "test: a ping found no pipe")
        t.learn([b.member()])
        zmq_transport.ZmqTransport._take_learned(t)  # P2 met (a frame of b's would do the same)
        assert t._peers["b"].state is zmq_transport._State.CONNECTING
        assert t.send("a", "b", Channel.DATA, b"d2")  # P2 connecting: waits

    _on_thread(t, run)
    b.infra.run_until(lambda: len(b.link.seen("data", "a")) >= 2, "b takes both")
    assert b.link.seen("data", "a") == [b"d1", b"d2"]


def test_what_a_stopping_node_took_is_acknowledged_before_its_goodbye(nodes):
    """b takes a's reply and DATA, then stops (graceful) before its next ping's CREDIT: its
    BYE acknowledges nothing, so a ends the session counting both as frames_dropped_peer_down
    though b handled them."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    b = nodes("b", ping_interval=2.0).attach()
    _meshed(a, b)
    time.sleep(0.1)
    assert a.transport.send("a", "b", Channel.COMPLETION, b"reply")
    assert a.transport.send("a", "b", Channel.DATA, b"data")
    b.infra.run_until(
        lambda: (
            b.link.seen("completion", "a") == [b"reply"] and b.link.seen("data", "a") == [b"data"]
        ),
        "b handles both",
    )
    b.stop()
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a hears b's goodbye")
    assert "frames_dropped_peer_down" not in counted


def test_an_oversized_frame_from_a_peer_taken_down_is_credited(nodes):
    """a took b down; b, never told, sends a frame over a's max_frame_bytes: _on_frame
    credits it only if b's record is not DOWN, then revives b; _fresh drops the emptied
    body uncredited. b sits at its window for good."""
    counted, count = _counter()
    a = nodes("a", data_limit=1, max_frame_bytes=1000, count=count).attach()
    b = nodes("b", data_limit=1).attach()
    _as_an_older_peer(b)  # (one that a's limit is not told to: it sends, a drops)
    _meshed(a, b)
    _on_thread(a.transport, lambda: a.transport._down(a.transport._peers["b"], "test"))
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a drops b")
    assert b.transport.send("b", "a", Channel.DATA, b"x" * 1500)  # b sends what a drops
    a.infra.run_until(
        lambda: bool(a.link.seen("up", "b")) and counted.get("oversized_frames"), "a meets b again"
    )
    _credited(b, "a")
    assert b.transport.send("b", "a", Channel.DATA, b"small"), "b stuck at its window for good"


# -- a third review's findings: each failed before its fix ---------------------------------


def _poll(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for another thread's progress: no event to wait on."""
    end = time.monotonic() + WAIT
    while not check() and time.monotonic() < end:
        time.sleep(0.005)
    assert check(), f"not within {WAIT} s: {what}"


def test_the_goodbye_credit_is_not_counted_as_a_message_left_unacknowledged(nodes):
    """A stopping node's last CREDIT (numbered: it carries credit) is never acknowledged (the
    goodbye follows); it was counted as ``data_unacknowledged_at_stop``, though no message was."""
    counted_a, count_a = _counter()
    a = nodes("a", ping_interval=5.0, count=count_a).attach()
    b = nodes("b", ping_interval=5.0).attach()
    _meshed(a, b)
    assert b.transport.send("b", "a", Channel.DATA, b"x")
    a.infra.run_until(lambda: a.link.seen("data", "b") == [b"x"], "a takes it")
    a.stop()
    assert "data_unacknowledged_at_stop" not in counted_a


def test_two_credits_kept_in_a_row_are_sent_again_each_on_its_own(nodes):
    """Two numbered CREDITs lost with a connection were sent again as one message, which the
    receiver refuses (a CREDIT has one body): the credit was lost and the sender stuck."""
    a = nodes("a", data_limit=2).attach()
    b = nodes("b", data_limit=2).attach()
    _meshed(a, b)
    lossy, restore = _credits_lost(a, "b")
    for i in range(2):  # two CREDITs (a step of one), both lost with the connection
        assert b.transport.send("b", "a", Channel.DATA, b"x%d" % i)
        a.infra.run_until(lambda i=i: len(a.link.seen("data", "b")) == i + 1, "a takes it")
        _poll(lambda i=i: len(lossy.swallowed) >= i + 1, "its CREDIT went")
    restore()
    _drop_and_meet_again(a, b)
    _credited(b, "a")


def test_data_is_credited_once_when_both_ends_drop_and_meet_again(nodes):
    """Both ends drop with a CREDIT lost: the receiver sent its kept CREDIT again *and*
    credited the sender's copy of the same DATA, which then went past its window."""
    a = nodes("a", data_limit=4, ping_interval=30.0).attach()
    b = nodes("b", data_limit=4, ping_interval=30.0).attach()
    _meshed(a, b)
    ta, tb = a.transport, b.transport
    real = tb._outs[Channel.COMPLETION]
    lossy = _Swallow(real, tb._peers["a"].ident, _Kind.CREDIT)
    _on_thread(tb, lambda: tb._outs.__setitem__(Channel.COMPLETION, lossy))
    assert ta.send("a", "b", Channel.DATA, b"d0")
    b.infra.run_until(lambda: b.link.seen("data", "a") == [b"d0"], "b takes d0")
    _poll(lambda: bool(lossy.swallowed), "b's CREDIT for d0 lost with the connection")
    _on_thread(tb, lambda: tb._outs.__setitem__(Channel.COMPLETION, real))
    _on_thread(tb, lambda: tb._down(tb._peers["a"], "test: connection dropped"))
    b.infra.run_until(lambda: bool(b.link.seen("down", "a")), "b drops a")

    def run() -> None:
        ta._down(ta._peers["b"], "test: connection dropped")
        ta.learn([b.member()])
        ZmqTransport._take_learned(ta)
        for i in range(1, 4):
            assert ta.send("a", "b", Channel.DATA, b"d%d" % i)

    _on_thread(ta, run)
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again")
    peer = ta._peers["b"]
    _poll(lambda: tb._incoming[("a", 1)].taken == 4 and peer.in_flight <= 3, "d0 credited")
    lowest, end = peer.in_flight, time.monotonic() + 0.3
    while time.monotonic() < end:  # (b's infrastructure holds d1..d3: nothing else credits)
        lowest = min(lowest, peer.in_flight)
        time.sleep(0.005)
    assert lowest == 3  # d1..d3, not yet taken at b: d0 was credited once, not twice
    b.infra.run_until(lambda: len(b.link.seen("data", "a")) == 4, "b takes d1..d3")
    _poll(lambda: peer.in_flight == 0, "every one credited")


def test_what_is_handed_over_during_a_flush_that_takes_its_peer_down_comes_after(nodes):
    """Two reviews' findings. A flush holds DATA d1, 256 replies that find no pipe (the peer
    goes down), then DATA d2, and another thread hands over d3 meanwhile. d2 was numbered
    before d1 (the first review), then d3 before d2 (the third), and the peer, met again,
    took them in that order: per-sender order broken. A flush numbers everything it holds,
    in the order it was handed over, before it sends anything."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    t = a.transport
    outs = t._outs
    real = outs[Channel.COMPLETION]

    class NoPipeAndASenderMeanwhile:
        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            if frames[1][1] == _Kind.COMPLETION:
                with t._lock:  # another thread hands d3 over during this flush
                    t._outq.append((t._peers["b"], _Kind.DATA, b"d3"))
                raise zmq.ZMQError(zmq.EHOSTUNREACH)
            real.send_multipart(frames, flags)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    def run() -> None:
        peer = t._peers["b"]
        outs[Channel.COMPLETION] = NoPipeAndASenderMeanwhile()  # type: ignore[assignment]
        t._outq.append((peer, _Kind.DATA, b"d1"))
        for i in range(256):
            t._outq.append((peer, _Kind.COMPLETION, b"c%d" % i))
        t._outq.append((peer, _Kind.DATA, b"d2"))
        t._flush()
        outs[Channel.COMPLETION] = real

    _on_thread(t, run)
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "a drops b")
    a.transport.learn([b.member()])
    a.infra.run_until(lambda: len(a.link.seen("up", "b")) == 2, "a meets b again")
    b.infra.run_until(lambda: len(b.link.seen("data", "a")) >= 3, "b takes all three")
    assert b.link.seen("data", "a") == [b"d1", b"d2", b"d3"]


def test_a_reply_sent_again_whose_acknowledgement_was_lost_is_acknowledged(nodes):
    """``b``'s acknowledgement of a reply is lost with the connection; ``a`` sends the reply
    again, ``b`` drops the copy but owed nothing: ``a`` kept the reply for good, and a
    stopping ``a`` waited out its timeout for it. The copy makes the acknowledgement owed."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    _meshed(a, b)
    tb = b.transport
    real = tb._outs[Channel.COMPLETION]
    lossy = _Swallow(real, tb._peers["a"].ident, _Kind.CREDIT)
    _on_thread(tb, lambda: tb._outs.__setitem__(Channel.COMPLETION, lossy))
    assert a.transport.send("a", "b", Channel.COMPLETION, b"reply")
    b.infra.run_until(lambda: b.link.seen("completion", "a") == [b"reply"], "b takes it")
    _poll(lambda: bool(lossy.swallowed), "b's acknowledgement, lost")
    _on_thread(tb, lambda: tb._outs.__setitem__(Channel.COMPLETION, real))
    _drop_and_meet_again(a, b)  # a sends the reply again; b drops the copy
    _poll(lambda: a.transport.unacknowledged() == 0, "b acknowledges it")
    assert b.link.seen("completion", "a") == [b"reply"]


def test_a_peer_of_another_wire_version_is_logged_once_and_its_frames_counted(nodes, caplog):
    """A node of another wire version (a mesh upgraded halfway) was only counted as
    ``bad_frames``: nothing said why the mesh did not work. It is logged, once per sender."""
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("old", "#1"), a)
        with caplog.at_level(logging.WARNING, logger="zlink.mesh.zmq"):
            for _ in range(2):
                send(struct.pack("!BBQ", 2, 2, 0), b"{}")  # a version 2 header
            _poll(lambda: counted.get("bad_frames", 0) >= 2, "both frames counted")
    finally:
        ctx.destroy(linger=0)
    said = [r for r in caplog.records if "speaks mesh wire version 2" in r.getMessage()]
    assert len(said) == 1


# -- a growth probe's findings: each failed before its fix -----------------------------------
def test_a_peer_restarted_after_it_was_taken_down_leaves_one_record_and_no_bodies(nodes):
    """A peer declared down (its record gone from the live table) that comes back as a new
    incarnation: the node keeps one record back, as for a restart it saw, not one per
    restart; and a session that ended lets go of the bodies it kept (counted as dropped):
    the probe saw five dead records holding 10 MB of DATA already counted as dropped."""
    a = nodes("a").attach()
    b = nodes("b").attach()
    endpoint = MeshEndpoint.parse(b.endpoint)

    def restarts() -> None:
        for incarnation in range(1, 8):
            peer = a.transport._meet("b", incarnation, endpoint)
            assert peer is not None
            assert a.transport._keep(peer, (b"x" * 1000,), _Kind.DATA)
            a.transport._down(peer, "test: declared down")

    _on_thread(a.transport, restarts)
    records = [p for p in a.transport._by_ident.values() if p.node_id == "b"]
    assert sorted(p.incarnation for p in records) == [6, 7]
    ended = [p for p in records if ("b", p.incarnation) not in a.transport._outgoing]
    assert [p.incarnation for p in ended] == [6]
    assert not ended[0].out.data.unacked  # counted as dropped, and let go


def test_data_a_session_ended_with_goes_to_the_node_to_count(nodes):
    """What a node accepted for a peer is handled there or counted with a reason (python-api
    §9). DATA its session with a peer ended with (the peer restarted) was counted only as
    ``frames_dropped_peer_down``, among the mesh's own frames, so no one could tell lost
    messages from a credit; its bodies now go to the node (``data_lost``), which counts the
    one-way messages among them as sends dropped: those handed to a pipe as maybe arrived,
    those kept while the peer was down (never sent) as not."""
    lost: list[tuple[str, list[bytes], bool]] = []
    counted, count = _counter()
    a = nodes("a", count=count).attach()
    a.link.data_lost = lambda peer, bodies, maybe: lost.append((peer, bodies, maybe))  # type: ignore[attr-defined]
    b = nodes("b").attach()
    endpoint = MeshEndpoint.parse(b.endpoint)

    def restart() -> None:
        peer = a.transport._meet("b", 1, endpoint)
        assert peer is not None
        first = a.transport._keep(peer, (b"one", b"two"), _Kind.DATA)
        assert first
        peer.out.sent_through = first  # "one" was handed to a pipe; "two" never left
        assert a.transport._keep(peer, (b"reply",), _Kind.COMPLETION)
        a.transport._down(peer, "test: declared down")
        again = a.transport._meet("b", 2, endpoint)  # a new incarnation: the old session ends
        assert again is not None
        a.transport._down(again, "test: declared down")

    _on_thread(a.transport, restart)
    a.infra.run_until(lambda: len(lost) == 2, "a's node hears what was lost")
    assert lost == [("b", [b"one"], True), ("b", [b"two"], False)]  # sent: it may have arrived
    assert counted.get("frames_dropped_peer_down") == 1  # the reply


def test_a_peer_gone_for_good_is_forgotten_once_its_session_ends(nodes, monkeypatch):
    """A node id never seen again (a pod replaced under a new name): once its session ended
    (``_SESSION_LINGER`` after it went down), nothing of it is left in the transport."""
    monkeypatch.setattr(zmq_transport, "_SESSION_LINGER", 0.05)
    a = nodes("a").attach()
    b = nodes("b").attach()
    a.transport.learn([a.member(), b.member()])  # the store lists both
    _meshed(a, b)
    ta = a.transport
    _on_thread(ta, lambda: ta._down(ta._peers["b"], "test: declared down"))
    b.stop()
    end = time.monotonic() + WAIT
    while time.monotonic() < end and ("b", 1) in ta._outgoing:
        time.sleep(0.01)  # the transport thread's sweep: no event to wait on
    a.transport.learn([a.member()])  # and then only a: b's lease lapsed
    _on_thread(ta, lambda: ta._sweep(time.monotonic()))  # (one more sweep after the end)
    assert [p.node_id for p in ta._by_ident.values()] == []
    assert "b" not in ta._listed
    assert ("b", 1) not in ta._incoming


def test_kept_bodies_hold_their_own_size_not_the_encoders_buffer(nodes):
    """orjson's output keeps the 4 KiB buffer it was written in: a session that keeps small
    bodies for a peer that is down (for up to 30 s) held 4 KiB each (a growth probe's side
    finding). What it keeps then is compacted, as the outbox does; a peer that is up has its
    credit window to bound it."""
    import tracemalloc

    from zlink.messaging import codec

    a = nodes("a").attach()
    b = nodes("b").attach()
    endpoint = MeshEndpoint.parse(b.endpoint)
    grown: list[int] = []

    def keep() -> None:
        peer = a.transport._meet("b", 1, endpoint)
        assert peer is not None
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(200):
                assert a.transport._keep(peer, (codec.dumps({"n": i, "text": "x" * 100}),),
                                         _Kind.DATA, compact=True)  # fmt: skip
            grown.append(tracemalloc.get_traced_memory()[0] - before)
        finally:
            tracemalloc.stop()

    _on_thread(a.transport, keep)
    assert grown[0] < 200 * 600, grown  # ~200 B each, with the deque's share: not 4 KiB


def test_a_peer_says_the_largest_frame_it_takes_and_a_larger_one_is_refused_at_the_source(nodes):
    """A service probe: a peer with a lower ``max_frame_bytes`` dropped a larger frame
    unread, counted only there. Its greeting now says its limit, and the sender refuses a
    larger frame (``InvalidArgument``: nothing sent) instead of sending it to be lost."""
    a = nodes("a", max_frame_bytes=1000).attach()
    b = nodes("b").attach()
    _meshed(a, b)
    _poll(lambda: b.transport.frame_limit("a") == 1000, "a's greeting reaches b")
    with pytest.raises(InvalidArgument, match="more than node 'a' takes"):
        b.transport.send("b", "a", Channel.DATA, b"x" * 1500)
    assert b.transport.send("b", "a", Channel.DATA, b"small")
    a.infra.run_until(lambda: a.link.seen("data", "b") == [b"small"], "a takes the small one")


def test_a_peer_met_only_by_its_greeting_that_leaves_said_goodbye(nodes):
    """A second review's finding: ``a`` met ``b`` through ``b``'s HELLO only (the store never
    showed ``b`` to ``a``), so asked with no incarnation ``a`` looked in the store's listing,
    found nothing, and logged ``b``'s clean stop as a crash."""
    a = nodes("a").attach()
    b = nodes("b", incarnation=4).attach()
    _meshed(a, b)  # b learned a from the store; a never did
    assert not a.transport.said_goodbye("b", None)
    b.stop()
    a.infra.run_until(lambda: bool(a.link.seen("down", "b")), "b is down at a")
    assert a.transport.said_goodbye("b", None) and a.transport.said_goodbye("b", 4)
    assert not a.transport.said_goodbye("b", 3)  # an older incarnation said nothing
