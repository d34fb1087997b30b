"""Envelopes leaving one node: queued in order, encoded and sent on its infrastructure thread.

Guarantees / assumes:
* ``put`` never blocks and never touches the transport: it appends to one FIFO under
  ``_lock`` (a leaf: nothing is taken under it) and, if no flush is scheduled, schedules one on
  the node's infrastructure thread. So code holding a runtime lock may ``put`` (the order of
  its puts is the order on the wire), and the transport is only ever called by that one
  thread, never under a runtime lock (issue "The runtime, composed", item 4).
* One FIFO for every peer, flushed by one thread: envelopes to one peer leave in ``put`` order
  (the per-connection order the router's fences rely on).
* An envelope that cannot be encoded (``WireError``) or sent (``Unavailable``) is handed to
  ``failed`` with the error, on the infrastructure thread: the router completes the call it
  carried, if any, and counts it. Nothing is dropped silently.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from ..errors import Unavailable, ZLinkError
from . import wire
from .transport import Channel, Transport

_log = logging.getLogger("zlink.mesh")
_COMPLETION = (wire.ReplyEnvelope, wire.RouteEnvelope, wire.FencedEnvelope)

Failed = Callable[[str, wire.Envelope, ZLinkError], None]


def channel_of(envelope: wire.Envelope) -> Channel:
    """Replies, route hints and returning fences travel on COMPLETION; the rest on DATA."""
    return Channel.COMPLETION if isinstance(envelope, _COMPLETION) else Channel.DATA


class Outbox:
    """One node's outgoing envelopes (see the module docstring)."""

    def __init__(
        self, node_id: str, transport: Transport, submit: Callable[..., None], failed: Failed
    ) -> None:
        self._node_id = node_id
        self._transport = transport
        self._submit = submit
        self._failed = failed
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, wire.Envelope]] = deque()
        self._scheduled = False

    def put(self, peer: str, envelope: wire.Envelope) -> None:
        """Queue ``envelope`` for ``peer`` (any thread, any lock held). Never blocks."""
        with self._lock:
            self._queue.append((peer, envelope))
            if self._scheduled:
                return
            self._scheduled = True
        self._submit(self._flush)

    def _flush(self) -> None:
        """On the infrastructure thread: encode and send everything queued, in order. Nothing
        an envelope's failure does (its ``failed`` callback included) stops the others."""
        while True:
            with self._lock:
                if not self._queue:
                    self._scheduled = False
                    return
                batch, self._queue = self._queue, deque()
            for peer, envelope in batch:
                self._send_one(peer, envelope)

    def _send_one(self, peer: str, envelope: wire.Envelope) -> None:
        try:
            data = wire.encode(envelope)
            self._transport.send(self._node_id, peer, channel_of(envelope), data)
            return
        except (wire.WireError, Unavailable) as exc:
            error: ZLinkError = exc
        except Exception as exc:  # noqa: BLE001 - a transport fault fails this one only
            error = Unavailable(f"transport failed: {exc!r}")
        try:
            self._failed(peer, envelope, error)
        except Exception:  # noqa: BLE001 - the flush goes on; the fault is logged
            _log.exception("handling an undeliverable envelope for %s failed", peer)
