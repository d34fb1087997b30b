"""Node-to-node envelopes: what crosses the boundary, and the in-process transport.

An envelope is JSON bytes (``zlink.messaging.codec``), as it would be on a wire: the in-process
transport encodes and decodes every one, so nothing relies on sharing Python objects between
nodes and a network transport can replace it. Delivery runs on the receiving node's
infrastructure thread (execution-model §1, §14): it never waits on application work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import Unavailable
from ..messaging import codec

Receiver = Callable[[dict[str, Any]], None]


class Transport(Protocol):
    """Carries envelopes between the nodes of one mesh."""

    def attach(self, node_id: str, receive: Receiver, submit: Callable[..., None]) -> None: ...

    def detach(self, node_id: str) -> None: ...

    def send(self, node_id: str, envelope: dict[str, Any]) -> None: ...

    def nodes(self) -> list[str]: ...


class InProcessTransport:
    """The embedded transport: JSON bytes handed to the target node's infrastructure thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[Receiver, Callable[..., None]]] = {}
        self.sent = 0

    def attach(self, node_id: str, receive: Receiver, submit: Callable[..., None]) -> None:
        """Make ``node_id`` reachable: ``submit(fn, arg)`` runs on its infrastructure thread."""
        with self._lock:
            self._nodes[node_id] = (receive, submit)

    def detach(self, node_id: str) -> None:
        with self._lock:
            self._nodes.pop(node_id, None)

    def nodes(self) -> list[str]:
        """The node ids reachable now, sorted."""
        with self._lock:
            return sorted(self._nodes)

    def send(self, node_id: str, envelope: dict[str, Any]) -> None:
        """Deliver ``envelope`` to ``node_id``; ``Unavailable`` if it is not reachable."""
        target = self._nodes.get(node_id)
        if target is None:
            raise Unavailable(f"node {node_id!r} is not reachable")
        data = codec.dumps(envelope)  # the boundary is real: bytes, as on a wire
        receive, submit = target
        self.sent += 1
        submit(lambda: receive(codec.loads(data)))
