"""Envelopes leaving one node: queued in order, encoded and sent on its infrastructure thread.

Guarantees / assumes:
* ``put`` never blocks and never touches the transport: it appends to one FIFO under
  ``_lock`` (a leaf: nothing is taken under it) and, if no flush is scheduled, schedules one on
  the node's infrastructure thread. So code holding a runtime lock may ``put`` (the order of
  its puts is the order on the wire), and the transport is only ever called by that one
  thread, never under a runtime lock (issue "The runtime, composed", item 4).
* One FIFO for every peer, flushed by one thread: envelopes to one peer leave in ``put`` order
  (the per-connection order the router's fences rely on). When the transport takes no more
  DATA for a peer (``send`` returned ``False``), that peer's DATA waits here, in order, until
  the transport says ``writable``; other peers and COMPLETION traffic go on.
* Bounded in bytes, per peer (python-api §9): DATA queued for a peer counts its estimated
  size until the transport takes it. A caller that may wait asks ``wait_room`` before it puts
  application DATA: while the peer is over ``limit`` or anyone waits before it, it waits,
  first come first served, and is called back (on the infrastructure thread) when there is
  room. A caller that may not wait (``send.submit()``) is refused only past ``submit_limit``,
  or while a call for its own target waits (it must not overtake it: per-sender order is per
  target; it may pass the waiters of other targets): a burst of fail-fast sends has room to
  spare, while waiting callers stop early, which lets this node's infrastructure thread,
  which drains this queue, run (under the GIL a sender runs whole switch intervals).
  Infrastructure traffic (replies, fences, relocation, relays) is never refused.
* A route fence, a move's chunk, payload and abort go on DATA, behind what was queued for
  their peer before them (the per-sender order a fence proves; the calls a move's source
  relayed before its abort), and each is announced there at once, on COMPLETION
  (``DataAheadEnvelope``, paired with it by its ``mark``): if the peer paused this node and
  waits for it (``MeshRouter._crossing``), it takes this node's DATA up to it, since what
  waits there may wait for it (a Spot arriving there opens once that node's own fences are
  back; a move arrives with its payload). What it takes so is what this queue held for it
  when that envelope came (its calls at most ``submit_limit`` bytes; relays, which are never
  refused, as many as came) and the transport's window.
* An envelope that cannot be encoded (``WireError``) or sent (``Unavailable``) is handed to
  ``failed`` with the error, on the infrastructure thread: the router completes the call it
  carried, if any, and counts it. Nothing is dropped silently.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import typing
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from enum import Enum

from ..errors import Unavailable, ZLinkError
from . import wire
from .transport import Channel, Transport

_log = logging.getLogger("zlink.mesh")
# A move's answers from its target to its source travel here too: the source may have paused
# the target (calls from it wait for room there, often for this very move), and a move that
# waited for that pause to lift waited for itself (python-api §9: "replies and other
# infrastructure traffic keep flowing"). Their order against DATA does not matter: a call the
# target sent the old way is kept in order by the target's fence (``MeshRouter``), not by them.
_COMPLETION = (
    wire.ReplyEnvelope, wire.RouteEnvelope, wire.FencedEnvelope, wire.DroppedEnvelope,
    wire.RelayedEnvelope,
    wire.RelocDoneEnvelope, wire.RelocOpenedEnvelope, wire.RelocCommitEnvelope,
    wire.DataAheadEnvelope,
)  # fmt: skip

Announced = (
    wire.FenceEnvelope | wire.RelocChunkEnvelope | wire.RelocEnvelope | wire.RelocAbortEnvelope
)
"""What is announced as it is put on DATA (``DataAheadEnvelope``), with a mark of its own."""
ANNOUNCED: frozenset[type[wire.Envelope]] = frozenset(typing.get_args(Announced))
_AHEAD = wire.DataAheadEnvelope


def _mark(envelope: wire.Envelope) -> int:
    """The mark of an announced envelope or of a notice."""
    return typing.cast(Announced | wire.DataAheadEnvelope, envelope).mark


Failed = Callable[[str, wire.Envelope, ZLinkError], None]
Go = Callable[[], object]
"""A caller waiting for room: called (infrastructure thread) when it may put."""


def channel_of(envelope: wire.Envelope) -> Channel:
    """Replies, route hints, returning fences, drop notices, a move's answers to its source
    and its commit travel on COMPLETION; the rest on DATA. A commit that waited behind
    application DATA its target had paused kept the target from opening, and so kept what
    the target held for it, until the pause ended. It may pass calls the source relayed
    before it: the target takes those in behind what it kept, in their order, once open.
    A move's payload and its abort stay on DATA: an abort must come after the calls the
    source relayed (the target drops its copies of those)."""
    return Channel.COMPLETION if isinstance(envelope, _COMPLETION) else Channel.DATA


def _compact(data: bytes) -> bytes:
    """``data`` in a buffer of its own size, to be held: orjson's output keeps the buffer it
    was written in (4,096 bytes for a 250-byte frame, by tracemalloc)."""
    return memoryview(data).tobytes()


def estimated_size(envelope: wire.Envelope) -> int:
    """About how much memory ``envelope`` holds while it waits here: its text fields, ~600
    bytes for the objects around them (the dataclass, its strings, the queue entry), and its
    encoded frame while the transport takes no more (the same text again, ~300 bytes more)."""
    if isinstance(envelope, wire.SendEnvelope | wire.RequestEnvelope):
        text = len(envelope.payload) + len(envelope.target) + len(envelope.message_type)
        return 2 * text + 900
    if isinstance(envelope, wire.BatchEnvelope):
        text = sum(map(len, envelope.payloads)) + sum(map(len, envelope.message_types))
        return 2 * (text + len(envelope.target)) + 900 + 100 * len(envelope.payloads)
    if isinstance(envelope, wire.RelocChunkEnvelope):
        return 2 * len(envelope.chunk) + 900
    return 900


class Room(Enum):
    """What ``Outbox.wait_room`` found for a caller that may wait."""

    NOW = "now"  # room now: it goes
    WAITS = "waits"  # it waits for room, in line
    FULL = "full"  # as many calls for its target wait already: refused, nothing kept


class Outbox:
    """One node's outgoing envelopes (see the module docstring)."""

    def __init__(
        self, node_id: str, transport: Transport, submit: Callable[..., None], failed: Failed,
        limit: int = 256 * 1024, submit_limit: int = 4 * 1024 * 1024,
    ) -> None:  # fmt: skip
        self._node_id = node_id
        self._transport = transport
        self._submit = submit
        self._failed = failed
        self.limit = limit  # bytes of DATA queued per peer before callers that may wait do
        # and before those that may not are refused (never below ``limit``)
        self.submit_limit = max(limit, submit_limit)
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, wire.Envelope, int]] = deque()  # (peer, envelope, size)
        self._scheduled = False
        # peers whose transport takes no DATA now: their DATA, in order (infra only), encoded
        # already (a refill hands frames straight over) into buffers of their own size
        self._held: dict[str, deque[tuple[wire.Envelope, bytes, int]]] = {}
        self._bytes: dict[str, int] = {}  # peer -> estimated DATA bytes queued (under _lock)
        self._waiters: dict[str, deque[Go]] = {}  # peer -> callers waiting for room
        # peer -> bytes the transport took in this flush, released together at its end (infra
        # only): one take of the lock per flush, not one per frame (senders wait on that lock)
        self._taken: dict[str, int] = {}
        self._taken_n = 0  # envelopes the transport took in this flush (infra only)
        # envelopes put and not yet taken by the transport nor failed (under _lock): what a
        # stopping node waits for (``pending``), counted whole even while the infrastructure
        # thread holds a batch or a peer's held queue out of the tables
        self._inside = 0
        # peer -> waiters let go whose put has not happened yet: they still come first (a go
        # may wait for a lock the next caller holds; that caller must not overtake it)
        self._going: dict[str, int] = {}
        # (peer, target) -> its calls waiting or let go and not yet put, and each waiter's
        # target: a fail-fast caller is refused only behind a call for its own target
        self._targets: dict[tuple[str, str], int] = {}
        self._target_of: dict[Go, str] = {}
        self._failures = 0  # envelopes failed (infra only)
        # marks of announced envelopes that failed before they left: their notices, right
        # behind them, are not sent (infra only)
        self._unsent: set[int] = set()
        # the marks of what is announced (under _lock): from a random start, so a
        # later incarnation of this node does not repeat an earlier one's
        self._marks = itertools.count(random.getrandbits(48) + 1)

    # -- the put side (any thread, any lock held) -----------------------------------------------
    def put(self, peer: str, envelope: wire.Envelope) -> None:
        """Queue ``envelope`` for ``peer``. Never blocks, never refuses."""
        with self._lock:
            if type(envelope) in ANNOUNCED:
                schedule = self._append_announced(peer, envelope)  # type: ignore[arg-type]
            else:
                size = estimated_size(envelope) if channel_of(envelope) is Channel.DATA else 0
                schedule = self._append(peer, envelope, size)
        if schedule:
            self._submit(self._flush)

    def put_behind_waiters(self, peer: str, fence: wire.FenceEnvelope) -> None:
        """``put`` a route fence for ``peer`` once every caller waiting for room to ``peer``
        now has been let go (at once when none waits): it waits in their line, and never
        refuses. It must not pass the calls made before it, and a caller waiting here has
        made its call (per-sender FIFO, ``zlink.runtime.routing``)."""
        with self._lock:
            if self._waiters.get(peer) or self._going.get(peer):
                self._waiters.setdefault(peer, deque()).append(lambda: self.put(peer, fence))
                return
            schedule = self._append_announced(peer, fence)
        if schedule:
            self._submit(self._flush)

    def _append_announced(self, peer: str, envelope: Announced) -> bool:
        """(Under ``_lock``.) ``_append`` a fence or a move's envelope with a new mark, and
        tell ``peer`` at once (see the module docstring)."""
        envelope = replace(envelope, mark=next(self._marks))
        schedule = self._append(peer, envelope, estimated_size(envelope))
        if isinstance(envelope, wire.FenceEnvelope):
            target, origin = envelope.target, envelope.first_origin
        else:
            target, origin = "", envelope.source_node
        notice = wire.DataAheadEnvelope(envelope.KIND, target, origin, self._node_id,
                                        envelope.mark)  # fmt: skip
        self._append(peer, notice, 0)  # (a flush is scheduled: the envelope's)
        return schedule

    def put_if_room(
        self, peer: str, envelope: wire.Envelope, can_wait: bool = True, target: str = ""
    ) -> bool:
        """``put`` application DATA for ``peer`` if there is room now (see ``has_room``), in one
        take of the lock: ``False``, and nothing queued, if not (the caller then waits, or is
        refused)."""
        size = estimated_size(envelope)
        with self._lock:
            if not self._room(peer, can_wait, target):
                return False
            schedule = self._append(peer, envelope, size)
        if schedule:
            self._submit(self._flush)
        return True

    def _append(self, peer: str, envelope: wire.Envelope, size: int) -> bool:
        """(Under ``_lock``.) Queue ``envelope``, counting its ``size``; ``True`` if a flush
        must be scheduled (none is)."""
        self._queue.append((peer, envelope, size))
        self._inside += 1
        if size:
            self._bytes[peer] = self._bytes.get(peer, 0) + size
        if self._scheduled:
            return False
        self._scheduled = True
        return True

    def has_room(self, peer: str, can_wait: bool = True, target: str = "") -> bool:
        """Whether application DATA for ``peer`` may be put now without waiting: for a caller
        that may wait, under ``limit`` and nobody waiting; for one that may not (a call for
        ``target``), under ``submit_limit`` and no call for ``target`` waiting."""
        with self._lock:
            return self._room(peer, can_wait, target)

    def _room(self, peer: str, can_wait: bool, target: str) -> bool:
        """(Under ``_lock``.) See ``has_room``; a caller that may not wait with no ``target``
        is held to nobody waiting at all."""
        if can_wait or not target:
            return self._free(peer, self.limit if can_wait else self.submit_limit)
        return self._bytes.get(peer, 0) < self.submit_limit and not self._targets.get(
            (peer, target)
        )

    def _free(self, peer: str, limit: int) -> bool:
        """(Under ``_lock``.) Room for ``peer`` under ``limit``, and nobody waiting or let go
        before it."""
        return (
            self._bytes.get(peer, 0) < limit
            and not self._waiters.get(peer)
            and not self._going.get(peer)
        )

    def wait_room(self, peer: str, go: Go, target: str = "", bound: int = 0) -> Room:
        """``NOW``: there is room now (``go`` is not kept). ``WAITS``: ``go`` (a call for
        ``target``) waits, behind whoever waits already, until DATA for ``peer`` is under
        ``limit`` again. ``FULL``: ``bound`` calls for ``target`` wait already (python-api
        §9: waiters are bounded per target, ``NodeConfig.admission_waiters``; a probe had
        any number of them wait here): nothing is kept."""
        with self._lock:
            if self._free(peer, self.limit):
                return Room.NOW
            if bound and target and self._targets.get((peer, target), 0) >= bound:
                return Room.FULL
            waiters = self._waiters.get(peer)
            if waiters is None:
                waiters = self._waiters[peer] = deque()
            waiters.append(go)
            if target:
                key = (peer, target)
                self._targets[key] = self._targets.get(key, 0) + 1
                self._target_of[go] = target
            return Room.WAITS

    def cancel_wait(self, peer: str, go: Go) -> bool:
        """Withdraw a waiter: ``True`` if it was still waiting (it will not be called)."""
        with self._lock:
            waiters = self._waiters.get(peer)
            if not waiters or go not in waiters:
                return False
            waiters.remove(go)
            self._done_with(peer, go)
            return True

    def _done_with(self, peer: str, go: Go) -> None:
        """(Under ``_lock``.) ``go`` no longer waits, nor is it being let go."""
        target = self._target_of.pop(go, None)
        if target is None:
            return
        key = (peer, target)
        left = self._targets[key] - 1
        if left:
            self._targets[key] = left
        else:
            del self._targets[key]

    def refusal(self, peer: str, target: str) -> str:
        """Why a fail-fast call for ``target`` finds no room to ``peer`` (its error says which:
        a queue over ``submit_limit``, or calls for the same target waiting before it)."""
        with self._lock:
            queued = self._bytes.get(peer, 0)
            waiting = self._targets.get((peer, target), 0)
        if queued >= self.submit_limit:
            return f"is full ({queued:,} bytes queued, limit {self.submit_limit:,})"
        return (
            f"holds {queued:,} bytes (fail-fast limit {self.submit_limit:,}) and {waiting} "
            f"call(s) for {target!r} wait for room in it before this one (per-target order)"
        )

    def waiting(self, peer: str) -> int:
        """Callers waiting for room to ``peer``, and fences in their line (tests)."""
        with self._lock:
            return len(self._waiters.get(peer, ()))

    # -- the infrastructure thread --------------------------------------------------------------
    def writable(self, peer: str) -> None:
        """The transport takes DATA for ``peer`` again: what waited here goes first, in order."""
        held = self._held.pop(peer, None)
        while held:
            envelope, data, size = held.popleft()
            if not self._hand_over(peer, envelope, data, size):
                held.appendleft((envelope, data, size))  # refused again: it and the rest
                self._held[peer] = held  # wait for the next writable
                break
        self._release_taken()
        self._serve(peer)

    def pending(self) -> int:
        """Envelopes put here and not yet taken by the transport nor failed (any thread)."""
        with self._lock:
            return self._inside

    def abandon(self, error: ZLinkError) -> None:
        """(Infrastructure thread; the node stops.) Everything still queued or held fails as
        undeliverable with ``error`` (counted by ``failed``), and whoever waits for room goes
        on (and finds the transport gone)."""
        with self._lock:
            queued, self._queue = self._queue, deque()
            self._scheduled = False
        for peer, envelope, size in queued:
            self._release(peer, size)
            self._fail(peer, envelope, error)
        with self._lock:  # every peer with waiters, not only those with DATA held (an
            peers = {*self._held, *self._waiters}  # audit found the others stranded)
        for peer in peers:
            self.peer_down(peer, error)

    def peer_down(self, peer: str, error: ZLinkError | None = None) -> None:
        """``peer`` went away: the DATA held for it fails (each as undeliverable), and whoever
        waits for room to it goes on (and finds it unreachable)."""
        held = self._held.pop(peer, None)
        if error is None:
            error = Unavailable(f"node {peer!r} went away before it took this")
        while held:
            envelope, _data, size = held.popleft()
            self._release(peer, size)
            self._fail(peer, envelope, error)
        with self._lock:
            waiters = self._waiters.pop(peer, None)
        for go in waiters or ():
            try:
                self._call(go)
            finally:
                with self._lock:
                    self._done_with(peer, go)

    def _flush(self) -> None:
        """On the infrastructure thread: encode and send everything queued, in order. Nothing
        an envelope's failure does (its ``failed`` callback included) stops the others."""
        touched: set[str] = set()
        while True:
            with self._lock:
                if not self._queue:
                    self._scheduled = False
                    break
                batch, self._queue = self._queue, deque()
            current: tuple[str, wire.Envelope, int] | None = None
            try:
                while batch:
                    current = peer, envelope, size = batch.popleft()
                    if size:
                        touched.add(peer)
                    self._send_one(peer, envelope, size)
                current = None
            finally:
                self._release_taken()
                if current is not None:  # something escaped (a BaseException) while this one
                    peer, envelope, size = current  # went out: counted as not sent
                    self._release(peer, size)
                    self._fail(peer, envelope, Unavailable("its send was interrupted"))
                if batch:  # and the rest goes first, later (a flush stays scheduled)
                    with self._lock:
                        batch.extend(self._queue)
                        self._queue = batch
                    self._submit(self._flush)
        for peer in touched:
            self._serve(peer)

    def _send_one(self, peer: str, envelope: wire.Envelope, size: int) -> None:
        kind = type(envelope)
        if self._unsent and kind is _AHEAD and _mark(envelope) in self._unsent:
            self._unsent.remove(_mark(envelope))
            with self._lock:  # what it announces failed just before it (right ahead of it,
                self._inside -= 1  # in this flush): it must not lift a pause (review)
            return
        failures = self._failures
        data = self._encode(peer, envelope, size)
        if data is not None:
            held = self._held.get(peer) if size else None
            if held is not None:  # the transport is full for this peer: wait behind the rest
                held.append((envelope, _compact(data), size))
            elif not self._hand_over(peer, envelope, data, size):
                self._held[peer] = deque([(envelope, _compact(data), size)])
        if self._failures != failures and kind in ANNOUNCED:  # (failed, and counted): its
            self._unsent.add(_mark(envelope))  # notice, next in this flush, goes unsent

    def _encode(self, peer: str, envelope: wire.Envelope, size: int) -> bytes | None:
        try:
            return wire.encode(envelope)
        except wire.WireError as exc:
            self._release(peer, size)
            self._fail(peer, envelope, exc)
            return None

    def _hand_over(self, peer: str, envelope: wire.Envelope, data: bytes, size: int) -> bool:
        """Give one frame to the transport; ``False`` if it took nothing (DATA at its limit)."""
        try:
            taken = self._transport.send(self._node_id, peer, channel_of(envelope), data)
        except ZLinkError as exc:  # not reachable, or a frame the transport will not carry
            error: ZLinkError = exc
        except Exception as exc:  # noqa: BLE001 - a transport fault fails this one only
            error = Unavailable(f"transport failed: {exc!r}")
        else:
            if taken:
                self._taken_n += 1
                if size:
                    self._taken[peer] = self._taken.get(peer, 0) + size
            return taken
        self._release(peer, size)
        self._fail(peer, envelope, error)
        return True  # (nothing to hold: it failed)

    def _release(self, peer: str, size: int) -> None:
        if size:
            with self._lock:
                self._give_back(peer, size)

    def _give_back(self, peer: str, size: int) -> None:
        """(Under ``_lock``.) ``size`` bytes for ``peer`` are no longer queued here."""
        left = self._bytes.get(peer, 0) - size
        if left > 0:
            self._bytes[peer] = left
        else:
            self._bytes.pop(peer, None)

    def _release_taken(self) -> None:
        """Give back, in one take of the lock, the bytes of what the transport took."""
        taken, n = self._taken, self._taken_n
        if not n:
            return
        self._taken, self._taken_n = {}, 0
        with self._lock:
            self._inside -= n
            for peer, size in taken.items():
                self._give_back(peer, size)

    def _serve(self, peer: str) -> None:
        """Let waiters for ``peer`` go, in order, while there is room (each one's put counts
        before the next is looked at)."""
        while True:
            with self._lock:
                waiters = self._waiters.get(peer)
                if not waiters or self._bytes.get(peer, 0) >= self.limit:
                    return
                go = waiters.popleft()
                if not waiters:
                    del self._waiters[peer]
                self._going[peer] = self._going.get(peer, 0) + 1
            try:
                self._call(go)
            finally:
                with self._lock:
                    self._done_with(peer, go)
                    left = self._going[peer] - 1
                    if left:
                        self._going[peer] = left
                    else:
                        del self._going[peer]

    def _call(self, go: Go) -> None:
        try:
            go()
        except Exception:  # noqa: BLE001 - one waiter's fault must not strand the rest
            _log.exception("a call waiting for room in the outbox failed")

    def _fail(self, peer: str, envelope: wire.Envelope, error: ZLinkError) -> None:
        self._failures += 1  # (infra only)
        with self._lock:
            self._inside -= 1
        try:
            self._failed(peer, envelope, error)
        except Exception:  # noqa: BLE001 - the flush goes on; the fault is logged
            _log.exception("handling an undeliverable envelope for %s failed", peer)
