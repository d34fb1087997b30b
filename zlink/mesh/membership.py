"""A node's place in the mesh: registration, a lease, self-fencing, and which peers are down.

Guarantees / assumes (python-api §10 "Failure"; issue "Node leases"):
* At start the node registers (id, endpoint) in the Location Store, which gives it a new
  ``incarnation``; from then on its lease is renewed about three times per ``lease_seconds``
  by the node's *lease thread*: an executor of its own (its deadlines on the node's clock,
  its tasks store calls that may block it), so that a renewal waits neither behind placement
  questions to a slow store nor behind a long task of the infrastructure thread (a stress
  probe saw one delivery burst hold that thread for 2.4 s of a 3 s lease, and nodes whose
  lease held fence themselves). The lease thread renews and extends how long the node
  serves; what the renewal read (the members) is handled on the infrastructure thread. A
  renewal that fails (the store is slow or down) is counted (``lease_renewals_failed``) and
  tried again sooner.
* Liveness is the infrastructure thread's too: it carries every frame from other nodes, every
  deadline and the fence itself. While it has been inside one task for a whole lease, the
  lease is not renewed (``lease_renewals_withheld``): the store declares the node down as it
  would a stopped process, and when the thread comes back the node fences itself.
* Self-fencing: a lease renewed by a call sent at ``t`` (this node's clock) holds in the store
  until at least ``t + lease_seconds`` by the store's clock, since the store renewed it after
  ``t``. The node stops serving at ``t + FENCE_AT * lease_seconds`` unless a later renewal was
  confirmed by then, and at once when the store refuses a renewal (``NoLease``): so it stops
  before its lease can have lapsed (``FENCE_AT`` leaves a fifth of the lease for clock rate
  differences). Leases are judged on ``lease_clock``: ``CLOCK_BOOTTIME`` for a real node, which
  counts time a suspended host slept. A store clock that *steps* forward (an NTP step on the
  Redis host) shortens leases by the step: keep such steps well below a fifth of a lease.
  Fenced, it fails its calls with ``Unavailable``, stops its timers and admits
  nothing (``MembershipEvents.fenced``), then registers again as a new incarnation (retried
  until the store answers) and serves again (``rejoined``). ``holds()`` lets the places where
  work enters from outside check the lease on their own (a node that was stopped, SIGSTOP, may
  wake with work queued ahead of its fence deadline).
* Failure detection: the store is the one authority that declares a node dead, never a
  dropped connection alone (as Orleans and Akka do). Each renewal also reads the members; a
  peer that was a member and is not any more (its lease lapsed, it left, or it registered
  again with a new incarnation) is declared down (``peer_down``). A peer whose connection
  dropped (``suspect``) is asked about at once and then every sixth of a lease until the store
  declares it down or lists it, at the incarnation it had, while it is reachable again
  (``still_member`` says so).
* Everything here runs on the infrastructure thread except ``register``, ``announce`` and
  ``leave`` (the node's start and shutdown, which block), ``members``, and the renewal and
  store calls on the lease thread. ``_lock`` (a leaf: nothing is called under it) guards
  what both threads write: the epoch, ``fenced``, the record and how long the node serves.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Unavailable
from ..executor import Clock, MonotonicClock
from ..messaging.completion import Completion
from .location import LocationStore, NodeRecord, NoLease

if TYPE_CHECKING:
    from ..executor import DeadlineHandle, InfraExecutor

_log = logging.getLogger("zlink.mesh")

FENCE_AT = 0.8  # of a lease after a renewal was sent: the node stops serving then, unrenewed
RENEW_EVERY = 1 / 3  # of a lease: how often a renewal is sent
RETRY_EVERY = 1 / 6  # of a lease: a failed renewal, a suspect's check, a registration again
_GONE_KEPT = 1024  # peers declared down a node remembers (not to declare one down twice)


def lease_clock(clock: Clock) -> Callable[[], float]:
    """The clock leases are judged on: the node's own, but for the real monotonic clock,
    ``CLOCK_BOOTTIME`` where the system has it (Linux): unlike ``time.monotonic`` it counts
    the time a suspended host or a paused VM spent asleep, which the store's clock counted too
    (found by review: a node woken after several leases would serve on)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if isinstance(clock, MonotonicClock) and boottime is not None:
        return functools.partial(time.clock_gettime, boottime)
    return clock.now


class _Superseded(Exception):
    """(Store thread.) A live incarnation of this node's id, newer than this one's, is listed:
    another process runs under the same id."""

    def __init__(self, incarnation: int) -> None:
        super().__init__(f"a newer incarnation {incarnation} of this node id is live")
        self.incarnation = incarnation


class MembershipEvents(Protocol):
    """What the node does when membership changes (all on the infrastructure thread, but
    ``members``, which may come from the store thread or the node's start)."""

    def members(self, records: list[NodeRecord]) -> None:
        """The store's members now (the transport connects to new ones)."""
        ...

    def fenced(self, why: str) -> None:
        """This node stops serving: its lease may lapse before a renewal is confirmed."""
        ...

    def rejoined(self, incarnation: int, records: list[NodeRecord]) -> None:
        """This node registered again as ``incarnation``: it serves again once it has met
        ``records`` (the members) anew."""
        ...

    def peer_down(self, node_id: str, incarnation: int | None) -> None:
        """The store declares ``node_id`` at ``incarnation`` (the one this node knew;
        ``None``: it met it after its last look at the store) down."""
        ...

    def superseded(self, why: str) -> None:
        """Another process registered this node's id again while it ran: this one stays
        fenced for good (it never registers again: the two would take the lease from each
        other for ever)."""
        ...

    def said_goodbye(self, node_id: str, incarnation: int | None) -> bool:
        """Whether ``node_id`` at ``incarnation`` (the one this node knew), now gone from the
        store, left cleanly (the transport's ``said_goodbye``): a clean stop is logged as
        one, not as a crash."""
        ...

    def still_member(self, node_id: str) -> bool:
        """The store still lists a suspected peer at its incarnation: ``True`` if it is
        reachable again (the suspicion ends), ``False`` to keep asking."""
        ...


class NodeMembership:
    """Registration, lease and failure detection of one node (see the module docstring)."""

    def __init__(
        self, node_id: str, endpoint: str, store: LocationStore, lease: InfraExecutor,
        infra: InfraExecutor, clock: Clock, lease_seconds: float, count: Any,
        events: MembershipEvents, mesh: str,
    ) -> None:  # fmt: skip
        """``lease`` is the node's lease thread (started and stopped by the node: ``leave``
        stops it), ``infra`` its infrastructure thread."""
        self.node_id = node_id
        self.mesh = mesh  # the store must serve this mesh (``LocationStore.join_mesh``)
        self.endpoint = endpoint
        self.store = store
        self.lease_seconds = lease_seconds
        self._infra = infra
        self._now = lease_clock(clock)
        self._count = count
        self._lease = lease
        self._events = events
        self._lock = threading.Lock()  # a leaf (see the module docstring)
        self.record: NodeRecord | None = None
        self._stopped = False
        self._fenced = False
        self._epoch = 0  # +1 at each fence: answers to calls of an earlier epoch are ignored
        self._failed_tries = 0  # registrations again that failed in a row (what is logged)
        self._valid_until = float("-inf")  # this node's clock: it serves until then
        self._refused: str | None = None  # why the store refused this epoch's lease
        # an incarnation registered again on the lease thread and not yet taken on (the
        # infrastructure thread's ``_rejoined``): ``leave`` unregisters it if it never is
        self._unadopted: int | None = None
        self._fence: DeadlineHandle | None = None
        self._known: dict[str, int] = {}  # the other members, at their incarnations
        self._suspects: dict[str, int | None] = {}  # suspected peers, at the incarnation known
        # peers declared down and not listed since (the oldest first, bounded): a connection
        # of theirs that drops again (re-dialled from a list read before the lease lapsed) is
        # not a second death
        self._gone: dict[str, None] = {}
        self._polling = False

    @property
    def incarnation(self) -> int:
        """The incarnation the store gave this node (``0`` before it registered)."""
        return 0 if self.record is None else self.record.incarnation

    @property
    def lease_until(self) -> float | None:
        """When the last confirmed lease ends, on the store's clock (``None``: not yet)."""
        return None if self.record is None else self.record.lease_until

    @property
    def fenced(self) -> bool:
        """Whether this node has fenced itself and not yet registered again."""
        return self._fenced

    @property
    def epoch(self) -> int:
        """How many times this node fenced itself (what a late answer is checked against)."""
        return self._epoch

    def holds(self) -> bool:
        """Whether this node may serve now; if its lease ran out unnoticed (the process was
        stopped), it fences now (infrastructure thread)."""
        if self._fenced:
            return False
        if self._now() < self._valid_until or self.record is None:
            return True
        self._lapse(self._epoch)
        return False

    def register(self, endpoint: str | None = None) -> NodeRecord:
        """Register with a new incarnation and start renewing (the node's start; blocks)."""
        if endpoint is not None:
            self.endpoint = endpoint
        sent = self._now()
        self.store.join_mesh(self.mesh)  # a store of another mesh: InvalidArgument, nothing done
        self.record = self.store.register_node(self.node_id, self.endpoint, self.lease_seconds)
        self._confirmed(sent)
        self._renew_later(RENEW_EVERY, self._epoch)
        return self.record

    def announce(self) -> None:
        """Tell the node who the members are now (the node's start; blocks)."""
        records = self.store.nodes()
        self._know(records)
        self._events.members(records)

    def members(self) -> list[NodeRecord]:
        """The nodes whose lease holds in the store, this one included."""
        return self.store.nodes()

    def others(self) -> list[str]:
        """The other members as this node last heard of them (no store call)."""
        return list(self._known)

    def leave(self, timeout: float) -> None:
        """Stop renewing and unregister (the node's shutdown): the incarnation it serves as,
        or one it registered again as and never took on (a registration the stop overtook)."""
        with self._lock:
            self._stopped = True
        if self._fence is not None:
            self._fence.cancel()
        self._lease.stop(timeout)  # what it was doing ends first
        with self._lock:
            unadopted, self._unadopted = self._unadopted, None
        incarnations = [unadopted] if unadopted is not None else []
        if self.record is not None and not self._fenced:
            incarnations.append(self.record.incarnation)
        for incarnation in dict.fromkeys(incarnations):
            try:
                self.store.unregister_node(self.node_id, incarnation)
            except Exception as exc:  # noqa: BLE001 - its lease lapses anyway
                _log.warning("node %s could not unregister: %s", self.node_id, exc)
                _log.debug("node %s could not unregister", self.node_id, exc_info=True)

    def _on_lease_thread(self, fn: Callable[..., Any], *args: Any) -> Completion:
        """Run the store call ``fn(*args)`` on the lease thread; its completion is set on
        the infrastructure thread (an exception becomes its error)."""
        done = Completion()

        def call() -> None:
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - the caller's completion carries it
                result, error = None, exc
            self._infra.submit(done.set, result, error)

        self._lease.submit(call)
        return done

    # -- the lease (lease thread, but for the fence: infrastructure thread) ---------------------
    def _schedule(self, delay: float, fn: Any, *args: Any) -> None:
        """(Infrastructure thread.) ``fn(epoch, *args)`` there, ``delay`` seconds on."""
        if not self._stopped:
            self._infra.call_later(delay, fn, self._epoch, *args)

    def _renew_later(self, leases: float, epoch: int) -> None:
        """(Any thread.) The renewal of ``epoch``'s lease, ``leases`` of a lease from now."""
        if not self._stopped:
            self._lease.call_later(self.lease_seconds * leases, self._renew, epoch)

    def _confirmed(self, sent: float) -> None:
        """(Infrastructure thread, or the node's start.) A registration sent at ``sent`` was
        confirmed: serve until ``FENCE_AT`` of a lease after it, and have the fence deadline
        there (renewals on the lease thread move the end on; the deadline then moves itself)."""
        until = sent + FENCE_AT * self.lease_seconds
        with self._lock:
            if until <= self._valid_until:
                return
            self._valid_until = until
        if self._fence is not None:
            self._fence.cancel()
        if not self._stopped:  # (relative: the lease clock may run apart from the node's)
            delay = max(0.0, until - self._now())
            self._fence = self._infra.call_later(delay, self._lapse, self._epoch)

    def _renew(self, epoch: int) -> None:
        """(Lease thread.) Renew the lease, unless the infrastructure thread has been inside
        one task for a lease; then read the members for the infrastructure thread to judge."""
        with self._lock:
            if self._stopped or epoch != self._epoch or self.record is None:
                return
            incarnation = self.record.incarnation
        stalled = self._infra.stalled_for()
        if stalled >= self.lease_seconds:  # (the next look is on the heap before the count)
            self._renew_later(RETRY_EVERY, epoch)
            self._count("lease_renewals_withheld")
            _log.warning("node %s: its infrastructure thread has been inside one task for "
                         "%.1f s; its lease is not renewed", self.node_id, stalled)  # fmt: skip
            return
        sent = self._now()
        try:
            record = self.store.renew_node(self.node_id, incarnation, self.lease_seconds)
        except NoLease as error:  # the store says this incarnation holds nothing: serve no more
            with self._lock:
                if self._stopped or epoch != self._epoch:
                    return  # (a renewal late for a shutdown that unregistered)
                self._refused = f"the store refused its lease renewal: {error}"
                self._valid_until = float("-inf")  # (``holds`` says so from now on)
            self._count("lease_renewals_refused")
            self._infra.submit(self._lapse, epoch)
            return
        except Exception as error:  # noqa: BLE001 - the store is slow or down: again sooner
            self._renew_later(RETRY_EVERY, epoch)
            _log.warning("node %s: lease renewal failed: %s", self.node_id, error)
            self._count("lease_renewals_failed")
            return
        with self._lock:
            if self._stopped or epoch != self._epoch:
                return
            self.record = record
            self._valid_until = max(self._valid_until, sent + FENCE_AT * self.lease_seconds)
        self._renew_later(RENEW_EVERY, epoch)
        self._count("lease_renewals")
        try:
            records = self.store.nodes()
        except Exception:  # noqa: BLE001 - a missed look: the next renewal reads it again
            _log.debug("node %s could not list the members", self.node_id, exc_info=True)
            return
        self._infra.submit(self._renewed, epoch, records)

    def _renewed(self, epoch: int, records: list[NodeRecord]) -> None:
        """(Infrastructure thread.) The members a renewal of ``epoch`` read."""
        if self._stopped or epoch != self._epoch:
            return
        self._events.members(records)
        self._judge(records)

    def _lapse(self, epoch: int) -> None:
        """(Infrastructure thread.) The fence deadline: unless a renewal was confirmed in
        time (the deadline moves on to the new end), or the store refused the lease."""
        if self._stopped or self._fenced or epoch != self._epoch:
            return
        with self._lock:  # (the end and the refusal the lease thread wrote, as one)
            until, refused = self._valid_until, self._refused
        now = self._now()
        if now < until:  # renewed meanwhile, on the lease thread
            if self._fence is not None:
                self._fence.cancel()
            self._fence = self._infra.call_later(until - now, self._lapse, epoch)
            return
        late = f"no lease renewal was confirmed within {FENCE_AT:.0%} of its lease"
        self._fence_now(refused or f"{late} ({self.lease_seconds} s)")

    def _fence_now(self, why: str) -> None:
        if self._fenced or self._stopped:
            return
        with self._lock:
            self._fenced = True
            self._epoch += 1  # what is still on its way for the old incarnation is ignored
            self._valid_until = float("-inf")
            self._refused = None
        if self._fence is not None:
            self._fence.cancel()
        self._count("self_fenced")
        _log.warning("node %s fenced itself (incarnation %d): %s", self.node_id,
                     self.incarnation, why)  # fmt: skip
        self._events.fenced(why)
        self._rejoin(self._epoch)

    def _rejoin(self, epoch: int) -> None:
        """Register again as a new incarnation, retried until the store answers."""
        if self._stopped or epoch != self._epoch:
            return
        sent = self._now()
        known = self.incarnation

        def register() -> tuple[NodeRecord, list[NodeRecord]]:  # lease thread
            if self._stopped:  # the node stops: no incarnation it would never unregister
                raise Unavailable(f"node {self.node_id} stops")
            newer = [r.incarnation for r in self.store.nodes()
                     if r.node_id == self.node_id and r.incarnation > known]  # fmt: skip
            if newer:  # another process holds this id now (a second `zlink run --node-id`)
                raise _Superseded(newer[0])
            self.store.join_mesh(self.mesh)  # (a store that lost its data: named again)
            record = self.store.register_node(self.node_id, self.endpoint, self.lease_seconds,
                                              known)  # fmt: skip
            with self._lock:  # (``leave`` unregisters it unless it is taken on)
                self._unadopted = record.incarnation
            return record, self.store.nodes()

        done = self._on_lease_thread(register)
        done.add_callback(lambda result, error: self._rejoined(epoch, sent, result, error))

    def _rejoined(self, epoch: int, sent: float, result: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._stopped:  # (``leave`` unregisters what it registered)
                return
            self._unadopted = None  # taken on below, or registered again (too late)
        if epoch != self._epoch:
            return
        if isinstance(error, _Superseded):
            self._stopped = True  # no renewal, no registration, no polling from now on
            why = (f"node id {self.node_id!r} was registered again, as incarnation "
                   f"{error.incarnation}, by another process; this one (incarnation "
                   f"{self.incarnation}) stays fenced and serves nothing")  # fmt: skip
            _log.error("%s", why)
            self._events.superseded(why)
            self._count("superseded")  # (last: whoever sees it sees the node say so too)
            return
        if error is not None:
            self._failed_tries += 1  # said at the 1st, 2nd, 4th, 8th, ... try in a row: a
            tries = self._failed_tries  # store down for an hour is not 7,200 warnings
            log = _log.warning if tries & (tries - 1) == 0 else _log.debug
            log("node %s could not register again (%d tries): %s", self.node_id, tries, error)
            self._count("registrations_failed")
            self._schedule(self.lease_seconds * RETRY_EVERY, self._rejoin)
            return
        record, records = result
        if self._now() >= sent + FENCE_AT * self.lease_seconds:  # too late to serve on
            with self._lock:
                self.record = record  # (its incarnation: the next try says it had it)
            self._count("registrations_too_late")
            _log.warning("node %s registered again too slowly to serve on that lease; again",
                         self.node_id)  # fmt: skip
            self._rejoin(epoch)
            return
        with self._lock:
            self.record = record
            self._fenced = False
        self._confirmed(sent)
        self._failed_tries = 0
        self._count("registrations_again")
        _log.warning("node %s registered again as incarnation %d", self.node_id,
                     record.incarnation)  # fmt: skip
        self._events.rejoined(record.incarnation, records)
        self._renew_later(RENEW_EVERY, epoch)
        self._judge(records)

    # -- failure detection (infrastructure thread) ----------------------------------------------
    def suspect(self, peer: str) -> None:
        """The connection to ``peer`` dropped: ask the store about it now and until it
        answers (see the module docstring)."""
        if peer == self.node_id or self._stopped:
            return
        if peer in self._gone and peer not in self._known:
            return  # declared down already, and not listed since
        self._suspects.setdefault(peer, self._known.get(peer))
        if not self._polling:
            self._polling = True
            self._poll(self._epoch)

    def _poll(self, epoch: int) -> None:
        if self._stopped or not self._suspects:
            self._polling = False
            return
        done = self._on_lease_thread(self.store.nodes)
        done.add_callback(lambda records, error: self._polled(records, error))

    def _polled(self, records: Any, error: BaseException | None) -> None:
        if self._stopped:
            self._polling = False
            return
        if error is None:
            self._judge(records)
        if self._suspects and not self._stopped:
            self._schedule(self.lease_seconds * RETRY_EVERY, self._poll)
        else:
            self._polling = False

    def _know(self, records: list[NodeRecord]) -> None:
        self._known = {r.node_id: r.incarnation for r in records if r.node_id != self.node_id}

    def _judge(self, records: list[NodeRecord]) -> None:
        """Compare the store's members with what this node knew: who is down, who is back."""
        now = {r.node_id: r.incarnation for r in records if r.node_id != self.node_id}
        knew = {**self._suspects, **self._known}  # the incarnation of each this node knew
        down = [peer for peer, inc in self._known.items() if now.get(peer) != inc]
        for peer, inc in list(self._suspects.items()):
            if inc is None:  # it met this node after the last look: judged from now on
                inc = self._suspects[peer] = now.get(peer)
                if inc is None:
                    down.append(peer)
                    continue
            if now.get(peer) != inc:
                if peer not in down:
                    down.append(peer)
            elif self._events.still_member(peer):
                del self._suspects[peer]
        for peer in down:
            self._suspects.pop(peer, None)
            self._gone.pop(peer, None)
            self._gone[peer] = None  # (the latest last)
        for peer in now:
            self._gone.pop(peer, None)
        while len(self._gone) > _GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        self._known = now
        for peer in down:
            try:
                if self._events.said_goodbye(peer, knew.get(peer)):
                    _log.info("node %s: node %s left the mesh", self.node_id, peer)
                else:
                    _log.warning("node %s: the store declares node %s down", self.node_id, peer)
                self._events.peer_down(peer, knew.get(peer))
            except Exception:  # noqa: BLE001 - the other peers are still declared down
                self._count("peer_down_errors")
                _log.exception("node %s: declaring %s down failed", self.node_id, peer)


__all__ = ["FENCE_AT", "MembershipEvents", "NodeMembership"]
