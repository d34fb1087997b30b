"""Status snapshots and the bounded, coalescing status stream (execution-model §13).

Guarantees / assumes:
* A snapshot is built on demand (``node.status()``) or by the node's ``StatusPublisher`` on a
  thread of its own, every ``status_interval`` of the node's clock; it reads counters without
  stopping any turn, so it is a consistent-enough picture, not a transaction. It is never
  built on the infrastructure thread: a node of 40,000 Spots takes most of a second to
  describe, and a probe's deadlines fired 0.9 s late, and its lease renewals so late that it
  fenced itself, while that thread built one.
* Each subscriber has its own delivery thread and ``capacity`` slots guarded by ``_cond``.
  ``offer`` never blocks: when the slots are full, the status is kept as the latest for its
  source (coalesced) and delivered after the queued ones. A slow subscriber therefore never slows
  message processing or the infrastructure thread, and is never cut off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

_log = logging.getLogger("zlink.status")

_LOSSES = (  # (counter prefix, kind of loss): what a stop can leave lost, in a node's counters
    ("messages_discarded_", "discarded"),  # never reached their handler here
    ("sends_dropped_", "dropped"),  # accepted here for another node, never handed over
    ("data_unacknowledged_", "unacknowledged"),  # sent, never acknowledged: may have arrived
)

SERVED_FROM_ZERO = (  # the admin endpoint's /metrics serves these at 0 until they count
    "handler_errors",
    "infra_task_errors",
    "lease_task_errors",
    "call_intake_errors",
    "reply_encoding_failures",
    "rejected_admissions",
    "late_replies",
    "calls_failed_at_shutdown",
    "calls_failed_peer_down",
    "calls_never_answered",
    "replies_undeliverable",
    "envelopes_undeliverable",
    "turns_abandoned_at_shutdown",
    "worker_calls_abandoned_at_shutdown",
    "messages_discarded_at_shutdown",
    "messages_discarded_spot_closed",
    "publish_dropped",
    "bad_envelopes",
    "bad_frames",
    "peers_suspected",
    "peers_declared_down",
    "relocation_restore_errors",
    "closing_overdue",
    "timer_late_ticks",
)
"""Counter names (``zlink.runtime.metrics``) of faults and losses: a Prometheus counter whose
series appears only at its first value hides that first increase from ``rate()`` and
``increase()``, and an alert on the first failures never fires."""


def losses(counters: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """What a node's counters say it lost, by kind (``discarded``, ``dropped``,
    ``unacknowledged``) and reason, leaving out what is 0: what ``zlink run`` tells when it
    stops. Counter names: ``zlink.runtime.metrics`` (``frames_dropped_<reason>`` is left
    out: the mesh's own frames and requests, whose callers were told; the one-way messages
    a session kept for a peer that went are ``sends_dropped_peer_gone``)."""
    out: dict[str, dict[str, int]] = {}
    for name, n in counters.items():
        for prefix, kind in _LOSSES:
            if n and name.startswith(prefix):
                out.setdefault(kind, {})[name.removeprefix(prefix)] = n
    return out


class TimerStatus(BaseModel):
    """One timer of an owner (``zlink inspect timers``)."""

    model_config = ConfigDict(frozen=True)

    name: str
    interval: float  # seconds
    next_due_in: float  # seconds until its next tick is due (node clock; negative: late)
    sequence: int  # the last tick delivered
    late_ticks: int  # ticks counted late, never queued (python-api §11)
    queued: int  # ticks admitted and not yet finished (the one running, if any, included)


class OwnerStatus(BaseModel):
    """One serial execution object: its lanes, its gate and its timers."""

    model_config = ConfigDict(frozen=True)

    owner: str
    kind: str  # "spot", "actor" or "timer"
    type: str
    state: str
    app_items: int  # application items admitted and not done: queued, and the one running
    app_bytes: int  # (what its lane's bound counts: python-api §9)
    lifecycle_items: int
    lifecycle_bytes: int
    gate_busy: bool
    running_turn_age: float | None  # seconds the gate's current turn has run (node clock)
    oldest_item_age: float | None  # seconds the first waiting application item has waited
    held: bool
    timers: list[str]
    waiters: int = 0  # callers waiting for room in its lanes now (python-api §9)
    waited: int = 0  # callers that had to wait for room, since it started
    refused: int = 0  # puts refused for want of room (count or bytes), since it started
    timer_details: list[TimerStatus] = []  # its timers: interval, next due, sequence, late


class TypeStatus(BaseModel):
    """One Spot or Actor type on a node since it started (issue 15; ``runtime.type_stats``):
    exact counts, and the handler latency of one message in ``latency_sample_every`` per
    object. ``latency_buckets`` counts samples per bucket (not cumulative): one per upper bound
    of ``NodeStatus.latency_bounds`` (seconds), and a last one past them (+Inf);
    ``latency_p50`` / ``latency_p99`` are the upper bounds of the buckets that hold those
    quantiles (None without samples)."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "spot" or "actor"
    type: str
    live: int  # active on the node now
    handled: int  # messages whose handler ran here (a batch counts each)
    refused: int  # sends refused for want of room in its lanes
    waited: int  # senders that waited for room (python-api §9)
    latency_samples: int
    latency_sum: float  # seconds, over the samples
    latency_buckets: list[int]
    latency_p50: float | None
    latency_p99: float | None


class NodeStatus(BaseModel):
    """A node at one moment: workers, infrastructure backlog, counters and every owner."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    mesh: str
    at: float  # node clock
    time: str = ""  # the wall clock at ``at``, ISO 8601 in UTC
    started: str = ""  # when the node started, ISO 8601 in UTC ("" before it started)
    workers: int
    workers_busy: int
    infrastructure_backlog: int  # tasks waiting for the infrastructure thread now
    infrastructure_deadlines: int = 0  # deadlines it holds (requests, timers, leases), about
    infrastructure_alive: bool  # its thread runs (it survives failures: python-api §9)
    worker_calls_in_flight: int
    counters: dict[str, int]
    spots: int
    actors: int
    owners: list[OwnerStatus]
    address: str | None = None  # where peers and clients reach it (a node that listens)
    peers: list[str] = []  # the other nodes of its mesh it reaches now
    paused_peers: list[str] = []  # peers whose application DATA it does not take now (§9)
    incarnation: int = 0  # its incarnation in the mesh's store (new after it fenced itself)
    fenced: bool = False  # it fenced itself (its lease may lapse) and serves nothing now
    types: list[TypeStatus] = []  # per Spot / Actor type: handled, refused, handler latency
    latency_bounds: list[float] = []  # ``TypeStatus`` buckets' finite upper bounds (seconds)
    latency_sample_every: int = 0  # one message in this many per object is timed


class StatusSubscription:
    """A subscriber's bounded slots and delivery thread; ``close()`` ends it."""

    def __init__(self, callback: Callable[[NodeStatus], object], capacity: int) -> None:
        self._callback = callback
        self.capacity = capacity
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[NodeStatus] = deque()
        self._latest: OrderedDict[str, NodeStatus] = OrderedDict()
        self._closed = False
        self.delivered = 0
        self.coalesced = 0
        self._thread = threading.Thread(target=self._run, name="zlink-status", daemon=True)
        self._thread.start()

    def offer(self, source: str, status: NodeStatus) -> None:
        """Queue ``status``; when the slots are full keep it as the latest for ``source``."""
        with self._cond:
            if self._closed:
                return
            if len(self._queue) < self.capacity:
                self._queue.append(status)
            else:
                self._latest[source] = status
                self._latest.move_to_end(source)
                self.coalesced += 1
            self._cond.notify()

    @property
    def pending(self) -> int:
        """Statuses waiting for the subscriber (never more than capacity + sources)."""
        with self._cond:
            return len(self._queue) + len(self._latest)

    def close(self) -> None:
        """Stop delivering; the thread ends after the callback it is in, if any. The node
        stops building statuses for it."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._queue or self._latest)
                if self._closed:
                    return
                if self._queue:
                    status = self._queue.popleft()
                else:
                    _, status = self._latest.popitem(last=False)
            try:
                self._callback(status)
            except BaseException:  # noqa: BLE001 - a subscriber's failure is its own (even
                # a KeyboardInterrupt from it must not end this thread: it served for good)
                _log.exception("status subscriber %r failed", self._callback)
            self.delivered += 1


_PACE = 9.0  # a build of ``b`` seconds is followed by at least ``_PACE * b`` without one


class StatusPublisher:
    """Builds a node's status for its subscribers (execution-model §13: observation takes
    the progress right of neither domain), on a thread of its own.

    ``tick()`` (the node's infrastructure heap calls it every ``status_interval``) only asks
    for a build and returns. The publisher's thread builds (``build``), offers the snapshot to
    every open subscription, and drops the closed ones; with none left the ticks stop until
    the next ``add``. Builds are paced: after one that took ``b`` seconds the next waits at
    least ``9 b`` more (real time), so describing a large node takes at most about a tenth
    of a CPU; the ticks that come meanwhile ask for one build, not several.
    ``wait_idle`` waits for the builds asked for before it (not for later ticks, nor for
    the pace: it hurries the one that waits).

    Lock order: ``_cond`` is a leaf (``build``, each ``offer`` and a subscription's
    ``close`` run without it).
    """

    def __init__(
        self, source: str, build: Callable[[], NodeStatus],
        arm: Callable[[], Any],
    ) -> None:  # fmt: skip
        self._source = source
        self._build = build
        self._arm = arm  # puts the next ``tick`` on the node's deadline heap
        self._cond = threading.Condition(threading.Lock())
        self._subs: list[StatusSubscription] = []
        self._armed = False
        self._asked = 0  # ticks that asked for a build
        self._done = 0  # of those, the ones a finished build answered
        self._hurry = False  # someone waits (``wait_idle``): no pause before the next build
        self._closed = False
        self._not_before = 0.0  # (monotonic) the pace: no build before this
        self.built = 0
        self._thread: threading.Thread | None = None

    def add(self, sub: StatusSubscription) -> None:
        """Deliver to ``sub`` from the next tick on (the first one arms the ticks)."""
        with self._cond:
            closed = self._closed
            if not closed:
                self._subs.append(sub)
                arm, self._armed = not self._armed, True
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"zlink-status-{self._source}", daemon=True
                    )
                    self._thread.start()
        if closed:
            sub.close()
            return
        if arm:
            self._arm()

    def tick(self) -> None:
        """(Infrastructure thread.) Ask for a build; re-arm while anyone subscribes."""
        with self._cond:
            self._subs = [s for s in self._subs if not s.closed]
            if self._closed or not self._subs:
                self._armed = False
                return
            self._asked += 1
            self._cond.notify_all()
        self._arm()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every build asked for before this call is done (``False`` past
        ``timeout``); the pace is skipped for it."""
        with self._cond:
            target = self._asked
            if self._done >= target or self._closed:
                return True
            self._hurry = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._closed or self._done >= target, timeout)

    def close(self) -> None:
        """Stop building and close every subscription (the node stops)."""
        with self._cond:
            self._closed = True
            subs, self._subs = self._subs, []
            self._cond.notify_all()
        for sub in subs:
            sub.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._asked > self._done)
                if self._closed:
                    return
                pause = self._not_before - time.monotonic()
                if pause > 0 and not self._hurry:  # paced: the ticks meanwhile ask once
                    self._cond.wait_for(lambda: self._closed or self._hurry, pause)
                    if self._closed:
                        return
                answers, self._hurry = self._asked, False
                subs = list(self._subs)
            began = time.monotonic()
            try:
                snapshot = self._build()
                for sub in subs:
                    sub.offer(self._source, snapshot)
            except Exception:  # noqa: BLE001 - a status that cannot be built is skipped
                _log.exception("the status of %s could not be built", self._source)
            ended = time.monotonic()
            with self._cond:
                self.built += 1
                self._done = answers
                self._not_before = ended + _PACE * (ended - began)
                self._cond.notify_all()
