"""The transport seam: bytes between the nodes of one mesh, and the in-process transport.

A transport moves encoded envelopes (``zlink.mesh.wire``) between nodes on two channels per
pair of nodes (execution-model §4, §16; python-api §10):

* ``Channel.DATA``: calls, sends, creates, route fences, relocation chunks and control. Its
  per-peer order is the per-sender order the router relies on; a receiver that is full stops
  taking DATA from that peer (``pause``) while everything else keeps flowing.
* ``Channel.COMPLETION``: replies, route hints and fences coming back. Never paused, so a
  paused peer never holds a reply back.

Guarantees / assumes:
* ``send`` never blocks and never runs user code; it is called only from the sending node's
  infrastructure thread (the node's ``Outbox`` owns that hop), never under a runtime lock.
* Delivery runs on the receiving node's infrastructure thread (``NodeLink.received``), which
  never waits on application work (§1, §14).
* Peer events: a node is told ``peer_up`` for every node reachable when it attaches and for
  every node that attaches later, and ``peer_down`` when one detaches. Reachability is a
  connection fact, not membership: the Location Store is the membership table.
* ``InProcessTransport._lock`` guards its node table and pause state; under it only a target's
  ``submit`` (a non-blocking append to an infrastructure queue) is called, never a callback.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

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


class Transport(Protocol):
    """Carries envelopes between the nodes of one mesh (see the module docstring)."""

    def attach(self, node_id: str, link: NodeLink, submit: Callable[..., None]) -> None:
        """Make ``node_id`` reachable; ``submit(fn, *args)`` runs on its infrastructure thread."""
        ...

    def detach(self, node_id: str) -> None: ...

    def send(self, sender: str, peer: str, channel: Channel, data: bytes) -> None:
        """Hand ``data`` to ``peer`` without blocking; ``Unavailable`` if it is not reachable."""
        ...

    def reachable(self, peer: str) -> bool:
        """Whether ``peer`` is attached now (a connection fact, not membership)."""
        ...

    def peers(self) -> list[str]:
        """The nodes reachable now, sorted."""
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
    paused: dict[str, deque[bytes]] = field(default_factory=dict)  # peer -> DATA held back


class InProcessTransport:
    """The embedded transport: bytes handed to the target node's infrastructure thread.

    The boundary is real: only bytes cross it, so nothing relies on sharing Python objects
    between nodes, and a network transport (``ZmqTransport``) can replace it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Attached] = {}
        self.sent = 0
        self.dropped = 0  # held-back DATA of nodes that detached

    def attach(self, node_id: str, link: NodeLink, submit: Callable[..., None]) -> None:
        with self._lock:
            others = list(self._nodes.items())
            self._nodes[node_id] = _Attached(link, submit)
        for peer, other in others:
            other.submit(other.link.peer_up, node_id)
            submit(link.peer_up, peer)

    def detach(self, node_id: str) -> None:
        with self._lock:
            gone = self._nodes.pop(node_id, None)
            others = list(self._nodes.values())
            for other in others:  # DATA held back from it dies with it, counted
                self.dropped += len(other.paused.pop(node_id, ()))
        if gone is not None:
            for other in others:
                other.submit(other.link.peer_down, node_id)

    def reachable(self, peer: str) -> bool:
        return peer in self._nodes

    def peers(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def send(self, sender: str, peer: str, channel: Channel, data: bytes) -> None:
        with self._lock:  # ordered with attach, detach, pause and resume
            target = self._nodes.get(peer)
            if target is None:
                raise Unavailable(f"node {peer!r} is not reachable")
            self.sent += 1
            held = target.paused.get(sender) if channel is Channel.DATA else None
            if held is not None:  # paused: kept in order until resumed
                held.append(data)
            else:
                target.submit(target.link.received, sender, channel, data)

    def pause(self, node_id: str, peer: str) -> None:
        with self._lock:
            target = self._nodes.get(node_id)
            if target is not None:
                target.paused.setdefault(peer, deque())

    def resume(self, node_id: str, peer: str) -> None:
        with self._lock:  # what waited goes first, before anything sent after the resume
            target = self._nodes.get(node_id)
            held = None if target is None else target.paused.pop(peer, None)
            if target is not None and held:
                for data in held:
                    target.submit(target.link.received, peer, Channel.DATA, data)
