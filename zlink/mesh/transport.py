"""The transport seam: bytes between the nodes of one mesh, and the in-process transport.

A transport moves encoded envelopes (``zlink.mesh.wire``) between nodes on two channels per
pair of nodes (execution-model §4, §16; python-api §10):

* ``Channel.DATA``: calls, sends, creates, route fences, relocation chunks and control. Its
  per-peer order is the per-sender order the router relies on; a receiver that is full stops
  taking DATA from that peer (``pause``) while everything else keeps flowing.
* ``Channel.COMPLETION``: replies, route hints, fences coming back, drop notices and a
  move's answers to its source. Never paused, so a paused peer never holds a reply back.

Guarantees / assumes:
* ``send`` never blocks and never runs user code; it is called only from the sending node's
  infrastructure thread (the node's ``Outbox`` owns that hop), never under a runtime lock.
* Flow control (python-api §9): a transport carries a bounded number of DATA frames from one
  node to another at a time (sent, not yet taken by the receiver; a paused receiver takes
  none). Past it, ``send`` returns ``False`` and takes nothing: the sender keeps the frame (in
  its own byte-bounded queue) and is told ``writable(peer)`` when the transport has room
  again. So a receiver that pauses a peer makes that peer's senders wait at the source.
* Delivery runs on the receiving node's infrastructure thread (``NodeLink.received``), which
  never waits on application work (§1, §14).
* Peer events: a node is told ``peer_up`` for every node reachable when it attaches and for
  every node that attaches later, and ``peer_down`` when one detaches. Reachability is a
  connection fact, not membership: the Location Store is the membership table.
* ``InProcessTransport._lock`` guards its node table, pause and flow state; under it only a
  node's ``submit`` (a non-blocking append to an infrastructure queue) is called, never a
  callback.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeVar

from ..errors import Unavailable


class Channel(Enum):
    """Which connection of a pair of nodes an envelope travels on."""

    DATA = "data"
    COMPLETION = "completion"


class NodeLink(Protocol):
    """What a node gives its transport: where bytes and peer events go."""

    def received(self, peer: str, channel: Channel, data: bytes) -> None:
        """Bytes from ``peer`` (on this node's infrastructure thread)."""
        ...

    def peer_up(self, peer: str) -> None:
        """``peer`` is reachable (on this node's infrastructure thread)."""
        ...

    def peer_down(self, peer: str) -> None:
        """``peer`` went away: what it owed this node will not come (infrastructure thread)."""
        ...

    def writable(self, peer: str) -> None:
        """The transport takes DATA for ``peer`` again after a ``send`` returned ``False``
        (infrastructure thread)."""
        ...

    # Optional (looked up with getattr): ``data_lost(peer: str, bodies: list[bytes],
    # maybe_arrived: bool)``, DATA for ``peer`` its session ended with (it restarted, left,
    # or stayed away): never sent, or (``maybe_arrived``) sent and never acknowledged
    # (infrastructure thread).


class Transport(Protocol):
    """Carries envelopes between the nodes of one mesh (see the module docstring)."""

    def endpoint(self, node_id: str) -> str:
        """Where peers reach ``node_id`` (registered in the Location Store); binds what a
        network transport listens on."""
        ...

    def attach(
        self, node_id: str, link: NodeLink, submit: Callable[..., None], incarnation: int = 0
    ) -> None:
        """Make ``node_id`` (at ``incarnation``, from the store) reachable; ``submit(fn,
        *args)`` runs on its infrastructure thread."""
        ...

    def learn(self, members: list[tuple[str, int, str]]) -> None:
        """The store's members (node id, incarnation, endpoint): a network transport connects
        to the ones it does not know (any thread, never blocks)."""
        ...

    def detach(self, node_id: str) -> None: ...

    # Optional (looked up with getattr, so a transport written before it still works):
    # ``said_goodbye(peer: str, incarnation: int | None) -> bool``, whether that incarnation
    # of ``peer`` left cleanly (it said goodbye), not by a dropped connection; asked when the
    # store declares it down, so that a clean stop is not logged as a crash.

    def reincarnate(
        self, node_id: str, incarnation: int, members: list[tuple[str, int, str]],
        then: Callable[[], None],
    ) -> None:  # fmt: skip
        """``node_id`` registered again as ``incarnation`` (it fenced itself): it meets
        ``members`` anew, what is sent to its old incarnation is dropped, and ``then`` runs
        on its infrastructure thread once its peers are reachable again (never blocks)."""
        ...

    def send(self, sender: str, peer: str, channel: Channel, data: bytes) -> bool:
        """Hand ``data`` to ``peer`` without blocking; ``Unavailable`` if it is not reachable.
        ``False`` (nothing taken) when DATA to ``peer`` is at its limit: ``writable`` follows.
        COMPLETION is always taken."""
        ...

    def reachable(self, peer: str) -> bool:
        """Whether ``peer`` is attached now (a connection fact, not membership)."""
        ...

    def unacknowledged(self) -> int:
        """DATA sent to reachable peers that they have not acknowledged yet (a node's stop
        waits for none to be left, python-api §9)."""
        ...

    def frame_limit(self, peer: str) -> int | None:
        """The largest frame ``peer`` takes, when it is less than the wire's limit and known
        (a call larger is refused where it is made); else ``None``."""
        ...

    def peers(self, connecting: bool = False) -> list[str]:
        """The nodes reachable now, sorted (``connecting``: also those met and still
        connecting, which take what is sent to them once they are up)."""
        ...

    def pause(self, node_id: str, peer: str) -> None:
        """``node_id`` stops taking DATA from ``peer`` (it is full); COMPLETION still flows."""
        ...

    def resume(self, node_id: str, peer: str) -> None:
        """``node_id`` takes DATA from ``peer`` again, first what waited, in order."""
        ...


@dataclass(eq=False)
class _Attached:
    link: NodeLink
    submit: Callable[..., None]
    incarnation: int = 0


def data_room(frames: int, size: int, more: int, frames_limit: int, bytes_limit: int) -> bool:
    """Whether a DATA frame of ``more`` bytes may go to a peer that has ``frames`` frames of
    ``size`` bytes in flight: under both limits, and always when nothing is in flight (a frame
    larger than the byte limit goes alone). The credit rule of both transports (python-api §9)."""
    return frames == 0 or (frames < frames_limit and size + more <= bytes_limit)


def data_resumed(frames: int, size: int, frames_limit: int, bytes_limit: int) -> bool:
    """Whether a sender refused by ``data_room`` is told ``writable`` again: once its frames
    and bytes in flight are both down to half their limits."""
    return frames <= frames_limit // 2 and size <= bytes_limit // 2


GOODBYES_KEPT = 1024  # clean leaves (and incarnations met) remembered; the oldest go first

_K = TypeVar("_K")
_V = TypeVar("_V")


def keep_latest(store: dict[_K, _V], key: _K, value: _V) -> None:
    """Put ``key`` last in the insertion-ordered ``store``, dropping the oldest entry past
    ``GOODBYES_KEPT``: the bounded memories of who left and which incarnation was met."""
    store.pop(key, None)
    store[key] = value
    if len(store) > GOODBYES_KEPT:
        del store[next(iter(store))]


def remember_goodbye(goodbyes: dict[tuple[str, int], None], node_id: str, incarnation: int) -> None:
    """Note that ``node_id`` at ``incarnation`` left cleanly (``said_goodbye`` reads it; a
    later incarnation has a key of its own)."""
    keep_latest(goodbyes, (node_id, incarnation), None)


@dataclass(eq=False)
class _Flow:
    """DATA from one node to another: frames in flight, and what a pause holds back."""

    in_flight: int = 0  # sent and not yet taken by the receiver (held ones included)
    in_flight_bytes: int = 0  # their bytes
    blocked: bool = False  # a send was refused: the sender waits for ``writable``
    paused: bool = False
    held: deque[bytes] = field(default_factory=deque)
    pending: list[bytes] | None = None  # handed over, one delivery task scheduled for them


class InProcessTransport:
    """The embedded transport: bytes handed to the target node's infrastructure thread.

    The boundary is real: only bytes cross it, so nothing relies on sharing Python objects
    between nodes, and a network transport (``ZmqTransport``) can replace it. ``data_limit``
    DATA frames, and ``data_bytes`` bytes of them (one frame always), may be in flight from
    one node to another (``data_room``): what a paused receiver holds is bounded by both.
    """

    def __init__(self, data_limit: int = 1024, data_bytes: int = 16 * 1024 * 1024) -> None:
        if data_limit < 1 or data_bytes < 1:
            raise ValueError("data_limit and data_bytes are at least 1")
        self._bytes_limit = data_bytes
        self._lock = threading.Lock()
        self._nodes: dict[str, _Attached] = {}
        self._flows: dict[tuple[str, str], _Flow] = {}  # (sender, receiver) -> its DATA flow
        self._limit = data_limit
        self._goodbyes: dict[tuple[str, int], None] = {}  # (node, incarnation) that left
        self._latest: dict[str, int] = {}  # each node's latest incarnation attached
        self.sent = 0
        self.dropped = 0  # DATA in flight to or from nodes that detached

    def endpoint(self, node_id: str) -> str:
        return f"inproc://{node_id}"

    def learn(self, members: list[tuple[str, int, str]]) -> None:
        """Nothing to do: every node of this process is attached here."""

    def attach(
        self, node_id: str, link: NodeLink, submit: Callable[..., None], incarnation: int = 0
    ) -> None:
        with self._lock:
            others = list(self._nodes.items())
            self._nodes[node_id] = _Attached(link, submit, incarnation)
            self._latest[node_id] = incarnation
        for peer, other in others:
            other.submit(other.link.peer_up, node_id)
            submit(link.peer_up, peer)

    def leaving(self, node_id: str) -> None:
        """``node_id`` is about to leave cleanly (its node's stop, before it leaves the store):
        what ``said_goodbye`` tells its peers. A ``detach`` alone is a dropped link."""
        with self._lock:
            attached = self._nodes.get(node_id)
            if attached is not None:
                remember_goodbye(self._goodbyes, node_id, attached.incarnation)

    def said_goodbye(self, peer: str, incarnation: int | None) -> bool:
        """Whether ``peer`` at ``incarnation`` said goodbye (``None``: its latest attachment)."""
        with self._lock:
            if incarnation is None:
                incarnation = self._latest.get(peer)
            return (peer, incarnation) in self._goodbyes

    def detach(self, node_id: str) -> None:
        """``node_id`` goes (or comes back as a new incarnation, ``reincarnate``): DATA held
        for a pause between it and a peer dies with it, and its sender is told what it
        carried (``NodeLink.data_lost``, as the ZeroMQ transport tells what a session ended
        with): before, a node that fenced itself lost the sends a peer had paused, with its
        senders told they were accepted and nothing counted."""
        lost: list[tuple[_Attached, str, list[bytes]]] = []
        with self._lock:
            gone = self._nodes.pop(node_id, None)
            others = list(self._nodes.values())
            for key in [k for k in self._flows if node_id in k]:  # its DATA dies with it
                held = self._flows.pop(key).held
                self.dropped += len(held)
                sender, receiver = key
                origin = gone if sender == node_id else self._nodes.get(sender)
                if held and origin is not None:
                    lost.append((origin, receiver, list(held)))
        for origin, receiver, bodies in lost:
            tell = getattr(origin.link, "data_lost", None)  # (optional: NodeLink)
            if tell is not None:
                origin.submit(tell, receiver, bodies, False)
        if gone is not None:
            for other in others:
                other.submit(other.link.peer_down, node_id)

    def reincarnate(
        self, node_id: str, incarnation: int, members: list[tuple[str, int, str]],
        then: Callable[[], None],
    ) -> None:  # fmt: skip
        """Peers see ``node_id`` leave and come back (what was in flight to it is dropped),
        and it sees each of them go down and come up again, as the ZeroMQ transport's nodes
        do: a transport audit found its outbox waiting for good for a ``writable`` that the
        flow it had, gone with the old incarnation, owed it."""
        with self._lock:
            attached = self._nodes.get(node_id)
            peers = [peer for peer in self._nodes if peer != node_id]
        if attached is not None:
            self.detach(node_id)
            for peer in peers:
                attached.submit(attached.link.peer_down, peer)
            self.attach(node_id, attached.link, attached.submit, incarnation)
            attached.submit(then)

    def unacknowledged(self) -> int:
        """Always 0: a frame handed over is in its receiver's infrastructure queue."""
        return 0

    def frame_limit(self, peer: str) -> int | None:
        """``None``: nodes in one process take what the wire carries."""
        return None

    def reachable(self, peer: str) -> bool:
        return peer in self._nodes

    def peers(self, connecting: bool = False) -> list[str]:
        with self._lock:  # (attached is up: nothing here connects)
            return sorted(self._nodes)

    def send(self, sender: str, peer: str, channel: Channel, data: bytes) -> bool:
        with self._lock:  # ordered with attach, detach, pause and resume
            target = self._nodes.get(peer)
            if target is None:
                raise Unavailable(f"node {peer!r} is not reachable")
            if channel is not Channel.DATA:
                self.sent += 1
                target.submit(target.link.received, sender, channel, data)
                return True
            flow = self._flows.get((sender, peer))
            if flow is None:
                flow = self._flows[(sender, peer)] = _Flow()
            if not data_room(flow.in_flight, flow.in_flight_bytes, len(data), self._limit,
                             self._bytes_limit):  # fmt: skip
                flow.blocked = True
                return False
            self.sent += 1
            flow.in_flight += 1
            flow.in_flight_bytes += len(data)
            if flow.paused:  # kept in order until resumed
                flow.held.append(data)
            else:
                self._hand(flow, target, peer, sender, [data])
            return True

    def _hand(
        self, flow: _Flow, target: _Attached, receiver: str, sender: str, frames: list[bytes]
    ) -> None:
        """(Under ``_lock``.) Queue ``frames`` for delivery, behind what is queued: one task
        on the receiver's infrastructure thread takes every frame queued by the time it
        runs (a submit, and a take of this lock, per burst rather than per frame)."""
        if flow.pending is None:
            flow.pending = frames
            target.submit(self._deliver, flow, target, receiver, sender)
        else:
            flow.pending.extend(frames)

    def _deliver(self, flow: _Flow, target: _Attached, receiver: str, sender: str) -> None:
        """(The receiver's infrastructure thread.) Hand the queued DATA frames over, in
        order; once taken, the sender may send more, and is told so if it was waiting."""
        with self._lock:
            frames, flow.pending = flow.pending or [], None
        taken = size = 0
        try:
            for data in frames:
                taken += 1
                size += len(data)
                target.link.received(sender, Channel.DATA, data)
        finally:
            with self._lock:
                rest = frames[taken:]  # a fault escaped (counted by the infrastructure
                if rest and flow.pending is not None:  # thread): the rest go first, next
                    flow.pending[:0] = rest  # (a task for what came since is scheduled)
                elif rest:
                    self._hand(flow, target, receiver, sender, rest)
                flow.in_flight -= taken
                flow.in_flight_bytes -= size
                wake = flow.blocked and data_resumed(
                    flow.in_flight, flow.in_flight_bytes, self._limit, self._bytes_limit
                )
                origin = self._nodes.get(sender) if wake else None
                if wake:
                    flow.blocked = False
                if origin is not None:
                    origin.submit(origin.link.writable, receiver)

    def pause(self, node_id: str, peer: str) -> None:
        with self._lock:
            if node_id in self._nodes:
                flow = self._flows.get((peer, node_id))
                if flow is None:
                    flow = self._flows[(peer, node_id)] = _Flow()
                flow.paused = True

    def resume(self, node_id: str, peer: str) -> None:
        with self._lock:  # what waited goes first, before anything sent after the resume
            target = self._nodes.get(node_id)
            flow = self._flows.get((peer, node_id))
            if target is None or flow is None or not flow.paused:
                return
            flow.paused = False
            if flow.held:
                self._hand(flow, target, node_id, peer, list(flow.held))
                flow.held.clear()

    def paused(self, node_id: str, peer: str) -> bool:
        """Whether ``node_id`` has paused DATA from ``peer`` (status, tests)."""
        flow = self._flows.get((peer, node_id))
        return flow is not None and flow.paused
