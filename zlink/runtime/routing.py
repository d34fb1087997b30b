"""Routing between nodes: forward a call to the Spot's owner, carry its reply back.

Guarantees / assumes:
* A forwarded request keeps its deadline (the remaining time travels with it), its correlation
  id and its reply route (the origin node); the origin's own deadline on its infrastructure heap
  decides the caller's outcome, and a reply after it is dropped and counted (python-api §5).
* Everything a node receives is handled on its infrastructure thread: decoding, local
  submission (admission never waits), and completing the waiting call, so a reply reaches the
  waiting turn even while every application worker of that node is blocked (§13, §16).
* A node that receives a call for a Spot it no longer owns forwards it again (stale routes
  relay to the current owner) and tells the call's origin the better route.
* Per-sender FIFO across a relocation: each node sends a remote target along one path at a
  time: its own forwarding pointer if it moved the target away, else its route cache, else the
  Location Store. A path changes only behind a fence: when a node learns a better route (a
  relaying node tells it), or the target arrives on it, it sends a fence along the old path and
  keeps its new calls for that target until the fence comes back from the owner. The fence is
  relayed, parked and flushed exactly like a call, so it reaches the owner after every call
  sent before it; only then do the kept calls leave, along the new path. A call that waits
  for room in the outbox (python-api §9) was made before the fence: the fence joins the line
  of waiters to that peer, and a waiter let go while its fence is out is kept ahead of what
  the fence keeps. A fence that finds the target elsewhere than the hint said (it came back,
  or went on) leaves the old path as it was: the calls before it are all with the target,
  come that way, and the next ones follow them. Transports need only per-connection order.
  A path leads to one kind of object: a call that names its target as the other kind (a
  Spot's id called as an Actor's) asks the store what the id names in a question of its
  own, and the path stays with the calls on it unless the id changed kind (``_ask_kind``).
* A fence is infrastructure traffic (python-api §9) though it rides on DATA, and so are a
  move's envelopes: each is announced on COMPLETION as it is queued (``zlink.mesh.outbox``),
  and a receiver that paused its sender and waits for it (a fence of its own, or one for a
  Spot arriving here; a move to it) takes that sender's DATA up to it, then pauses again
  (``_crossing``). Else the pause could wait for the fence: calls that wait for a Spot
  arriving here, which opens only once this node's own fence is back.
* Envelopes are typed (``zlink.mesh.wire``) and leave through the node's ``Outbox``: posting
  never blocks and may happen under ``route_lock``; the transport is called only by the
  infrastructure thread. What arrives is decoded there; bytes that do not decode are counted
  (``bad_envelopes``) and, where they carry a reply route, answered with a typed error.
* Failure (python-api §10 "Failure", issue "Node leases"): a peer whose connection drops
  (``peer_down``) is only *suspected*; the Location Store's lease is the one authority that
  declares a node dead (as in Orleans and Akka). Once the node's membership says a suspected
  or listed peer is down (its lease lapsed, it left, or it registered again as a new
  incarnation: ``declared_down``), every call this node awaited from it then fails at once
  with ``Unavailable`` instead of at its deadline, routes and forwarding pointers to it are
  dropped, and a route fence sent along it ends as lost. A location whose owner's lease
  lapsed is taken over by the next call here (re-homing: ``_located``).
* The Location Store is asked only on the node's store thread, with no lock held (python-api
  §10): a target this node has no path for is *located* (``locate``): its calls wait behind one
  question to the store, in the order they came, and go on from the infrastructure thread
  once it answers. A call for a target the store does not know ends with ``NotFound`` (a
  request) or is counted as dropped (``sends_dropped_not_found``; a one-way send was accepted
  before the store could be asked); a store that fails fails them with ``Unavailable``
  (``sends_dropped_store_failed``). An Instance Spot's first call reserves it the same way,
  and the node the store confirms activates it (cold activation, execution-model §14).
* Lock order (``zlink.lock_order``): ``route_lock`` (ROUTE) -> the relocator's (RELOCATION) ->
  the runtime's directory lock; ``_lock`` (PENDING) is a leaf, and so is ``_answered`` (the
  count of requests taken from peers and not yet answered).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast

from pydantic_core import to_json

from ..errors import (
    HandlerError,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import Admission, DeadlineHandle, Entries, RoomWaiter, ranked_lock
from ..lock_order import LockRank
from ..mesh import wire
from ..mesh.location import (
    Location,
    LocationStore,
    NoLease,
    Reservation,
    StaleOwner,
    take_left_row,
)
from ..mesh.outbox import ANNOUNCED, Announced, Outbox, Room
from ..mesh.remote_errors import decode_error, encode_error
from ..mesh.store_worker import StoreWorker
from ..mesh.transport import Channel, Transport
from ..messaging.calls import (
    NO_WAIT,
    BatchSendCall,
    CreateCall,
    MessageCall,
    RequestCall,
    SendCall,
    check_id,
)
from ..messaging.completion import Admitted, Completion, in_progress
from ..messaging.message import from_wire, reply_from_json, reply_type, to_wire
from ..types import SpotCreateResult, SpotKind, SpotRef, TargetKind
from .acts import READY, AnsweredElsewhere
from .waits import KeptWait, WaitLine, accepted, fits, take_waiting, unwait, wait_behind

if TYPE_CHECKING:
    from ..app import TypeSpec
    from .runtime import Runtime

MAX_HOPS = 8  # a route that relays more often than this is a loop
MAX_POINTERS = 100_000  # forwarding pointers a node keeps for Spots and Actors it moved away
MAX_ROUTES = 100_000  # routes a node keeps for targets on other nodes (least recent dropped,
# and only one unused for two request or admission timeouts: see ``MeshRouter._remember``)

CallEnvelope = wire.SendEnvelope | wire.RequestEnvelope
Relayable = wire.SendEnvelope | wire.RequestEnvelope | wire.FenceEnvelope
EnvelopeHandler = Any  # Callable[[<one envelope class>], None]
Located = Callable[["Route | None", BaseException | None], None]
"""What waits for ``locate``: called with the route (``None``: no other node owns the target)
or the store's error."""

_log = logging.getLogger("zlink.mesh")
_TARGET_KINDS: dict[str, TargetKind] = {str(kind): kind for kind in TargetKind}
_ROUTED_KINDS = (str(TargetKind.SPOT), str(TargetKind.ACTOR))  # (what a path may lead to)
_new_send = wire.maker(wire.SendEnvelope)  # (no frozen __setattr__ per field: a send is hot)
_new_request = wire.maker(wire.RequestEnvelope)
_WRITE_TRIES = 8  # a fenced write no caller waits for: tries in all, on store failures
_WRITE_BACKOFF = 0.25  # seconds before the second try, doubled for each after it
_WRITE_BACKOFF_MOST = 8.0  # (the eight tries span ~24 s of the node's clock)
_TOPIC_KEY = "\x00" * 256  # (the outbox's per-target key of a publish: longer than any id)


class MeshRouter:
    """One node's side of the mesh."""

    def __init__(
        self, rt: Runtime, store: LocationStore, transport: Transport, store_worker: StoreWorker,
        backlog_limit: int = 256, outbound_limit: int = 256 * 1024,
        outbound_submit_limit: int = 4 * 1024 * 1024,
    ) -> None:  # fmt: skip
        self.rt = rt
        self.store = store
        self.store_worker = store_worker  # store writes off every lock and off this thread
        self.transport = transport
        self.outbox = Outbox(rt.node_id, transport, rt.infra.submit, self._undeliverable,
                             outbound_limit, outbound_submit_limit)  # fmt: skip
        # corr -> (call, reply type, the peer its reply is awaited from, the rank of the last
        # relay notice taken, a second peer whose loss fails it too: ``relayed_on``)
        self._pending: dict[int, tuple[Completion, Any, str, int, str]] = {}
        self._lock = ranked_lock("router.pending", LockRank.PENDING)
        self._ids = itertools.count(1)
        # routing: one path per remote target at a time (see the module docstring)
        self.route_lock = ranked_lock("router.route", LockRank.ROUTE, reentrant=True)
        self._routes: dict[str, Route] = {}  # target -> where this node sends it (LRU order)
        self._route_used: dict[str, float] = {}  # target -> when its route was last used
        self._tracking = False  # (past half of MAX_ROUTES: each use moves and stamps a route)
        self._moved: dict[str, Route] = {}  # forwarding pointers: targets this node moved away
        self._switching: dict[str, list[Relayable]] = {}  # target -> kept behind a fence
        self._kept_bytes: dict[str, int] = {}  # target -> payload bytes kept behind its fence
        # target -> callers waiting for room behind its fence (``_keep``), once it is full
        self._fence_waiting: dict[str, WaitLine[Relayable]] = {}
        self._ahead: dict[str, int] = {}  # target -> calls put ahead in its kept list (below)
        self._learned: dict[str, Route] = {}  # target -> the route a running switch goes to
        self._locating: dict[str, list[Located]] = {}  # target -> waiting for the store
        # target (or (target, kind)) -> bytes of plain sends waiting for its store question
        self._waiting_bytes: dict[str | tuple[str, str], int] = {}  # (``_check_room_to_wait``)
        # (target, kind) -> calls naming it as the other kind than its path (``_ask_kind``)
        self._kind_questions: dict[tuple[str, str], list[tuple[MessageCall, Admitted | None,
                                                               Located]]] = {}  # fmt: skip
        self._fence_via: dict[str, str] = {}  # target -> the node its running fence went to
        self._fence_timers: dict[str, DeadlineHandle] = {}  # target -> its fence's deadline
        self._suspected: dict[str, set[int]] = {}  # peer -> calls awaited when it dropped
        self._down: set[str] = set()  # peers declared down and not reachable since
        self._recorded: dict[str, Callable[[], None]] = {}  # target -> its first record's end
        self._clearing: dict[str, int] = {}  # target -> the tenure whose record's clear is on
        # calls from each peer waiting for room here; past ``backlog_limit`` DATA from that
        # peer is paused until half of them got in (python-api §9: bounded per peer)
        self._backlog: dict[str, int] = {}  # under _lock
        # requests taken from peers not answered yet (a leaf lock: ``wait_answered``)
        self._answered = threading.Condition()
        self._unanswered = 0
        self._paused: set[str] = set()  # under _lock
        # route fences and a move's envelopes coming from a peer on its DATA (under _lock):
        # peer -> mark -> the notice (``DataAheadEnvelope``) or the envelope, whichever came
        # first; and peer -> how many notices of what this node waits for wait for it (a
        # paused peer's DATA is taken up to them: ``_crossing``)
        self._marks: dict[str, dict[int, _Mark]] = {}
        self._lifting: dict[str, int] = {}
        self.backlog_limit = backlog_limit
        self._handlers: dict[type[Any], EnvelopeHandler] = {
            wire.SendEnvelope: self._on_call,
            wire.RequestEnvelope: self._on_call,
            wire.ReplyEnvelope: self._on_reply,
            wire.RouteEnvelope: self._on_route,
            wire.FenceEnvelope: self._on_fence,
            wire.FencedEnvelope: self._on_fenced,
            wire.CreateEnvelope: self._on_create,
            wire.CloseEnvelope: self._on_close,
            wire.DroppedEnvelope: self._on_dropped,
            wire.BatchEnvelope: self._on_batch,
            wire.RelayedEnvelope: self._on_relayed,
        }

    def handle(self, kind: type[Any], handler: EnvelopeHandler) -> None:
        """Have ``handler`` receive envelopes of class ``kind`` (on the infrastructure thread);
        how relocation and cross-node Join plug in without this module importing them."""
        self._handlers[kind] = handler

    def post(self, peer: str, envelope: wire.Envelope) -> None:
        """Send ``envelope`` to ``peer`` through the outbox; ``Unavailable`` at once if the
        peer is not reachable (nothing is queued then). Never blocks; any lock may be held."""
        self._check_reachable(peer)
        self.outbox.put(peer, envelope)

    def _check_reachable(self, peer: str) -> None:
        """``Unavailable`` if the transport cannot reach ``peer`` now."""
        if not self.transport.reachable(peer):
            raise Unavailable(f"node {peer!r} is not reachable")

    def peers(self, connecting: bool = False) -> list[str]:
        """The other nodes reachable now (``connecting``: also those still connecting)."""
        return [p for p in self.transport.peers(connecting) if p != self.rt.node_id]

    # -- routes ------------------------------------------------------------------------------
    def _remember(self, target: str, route: Route) -> None:
        """(``route_lock`` held.) Cache ``route`` as the most recently used. Past
        ``MAX_ROUTES``, the least recently used go, but only one no call used for two request
        or admission timeouts (a node that calls a million short-lived rooms elsewhere must
        not keep a route for each): a route is a path, and a call for a dropped target asks
        the store, which may name another node than the one earlier calls went to; only
        when every one of those is long done can a later call take another path without a
        fence and keep per-sender order (python-api §9). So the bound is soft: routes used
        within that time stay, whatever their number. A target whose path is being settled
        (a store question, a fence) keeps its route."""
        routes = self._routes
        routes.pop(target, None)
        routes[target] = route  # the most recent last: dicts keep insertion order
        if len(routes) <= MAX_ROUTES // 2:  # uses are not tracked (``_touch``): no cost yet
            if self._tracking:
                self._tracking, self._route_used = False, {}
            return
        now = self.rt.clock.now()
        used = self._route_used
        if not self._tracking:  # from here each use is: until now, count them all as used now
            self._tracking = True  # (later than their last use: never dropped too soon)
            self._route_used = used = dict.fromkeys(routes, now)
        used[target] = now
        if len(used) > 2 * len(routes) + 1024:  # times of routes dropped by other paths
            self._route_used = used = {t: u for t, u in used.items() if t in routes}
        if len(routes) <= MAX_ROUTES:
            return
        idle = 2 * max(self.rt.request_timeout, self.rt.admission_timeout)
        asked = {target for target, _kind in self._kind_questions}  # (rarely any)
        busy: tuple[dict[str, Any] | set[str], ...] = (
            self._switching, self._locating, self._learned, self._fence_via, asked,
        )  # fmt: skip
        excess = len(routes) - MAX_ROUTES
        oldest = list(itertools.islice(routes, excess + sum(len(t) for t in busy) + 1))
        for old in oldest:
            if excess <= 0 or now - used.get(old, now) < idle:
                break  # (in order of use: the rest were used more recently still)
            if old != target and not any(old in table for table in busy):
                del routes[old]
                used.pop(old, None)
                excess -= 1
                self.rt.metrics.add("routes_dropped")

    def _touch(self, target: str) -> None:
        """(``route_lock`` held.) A call goes along ``target``'s cached route: the most
        recently used now. Called once the cache is past half its bound (``_tracking``): below
        it nothing is dropped, and a send pays nothing for it (``_remember`` stamps them all
        when it passes half)."""
        routes = self._routes
        route = routes.pop(target, None)
        if route is not None:
            routes[target] = route
            self._route_used[target] = self.rt.clock.now()

    def _known(self, target: str) -> Route | None:
        """This node's own path for ``target``: its forwarding pointer, else its route cache."""
        return self._moved.get(target) or self._routes.get(target)

    def locate(
        self, target: str, then: Located, reserve: TypeSpec | None = None,
        first: Any = None,
    ) -> None:  # fmt: skip
        """Call ``then(route, error)`` with where to send ``target``: at once when this node
        has a path for it, else once the store has answered (asked on the store thread, no
        lock held; answered on the infrastructure thread, or on this one if the answer is in
        first). Every question for one target waits behind the first, and they are answered
        in the order they were asked. ``route`` is ``None`` when no other node owns it.
        ``reserve``: the Instance Spot type to claim ``target`` for this node if nobody owns
        it yet; this node then activates it before anyone is answered. ``first``: the message
        of that call, recorded durably with the claim (execution-model §14, cold activation:
        the durable first record, then Ready, then that message at the head of the queue,
        then the others); its handler's end clears the record.
        """
        with self.route_lock:
            waiting = self._locating.get(target)
            if waiting is not None:
                waiting.append(then)
                return
            hit = self._known(target)
            if hit is not None and hit.node != self.rt.node_id:
                if self._tracking:
                    self._touch(target)
                then(hit, None)
                return
            if reserve is not None and self._claims_nothing():  # (it asks where it is, to
                then(None, self._claims_nothing())  # relay, but places nothing here)
                return
            # waiting before the question leaves: the answer may come back on this very thread
            waiting = self._locating[target] = [then]
            record = None if first is None else to_wire(first)
            if reserve is not None:
                self._reserve(target, waiting, reserve, then if first is not None else None,
                              record)  # fmt: skip
                return
            asked = self.store_worker.call(self.store.lookup, target)
            asked.add_callback(functools.partial(self._located, target, waiting, None, None,
                                                 None))  # fmt: skip

    def _located(
        self, target: str, waiting: list[Located], reserve: TypeSpec | None,
        recorder: Located | None, record: tuple[str, str] | None, found: Any,
        error: BaseException | None, taken: bool = False,
    ) -> None:  # fmt: skip
        """The store answered (infrastructure thread): set the route, answer who waited.
        ``recorder``: the call whose message the claim recorded (``record``), if any (it may
        have been withdrawn meanwhile: then its record is cleared, never run). ``taken``:
        the answer of :meth:`_claim_again`, which is not claimed again."""
        me = self.rt.node_id
        with self.route_lock:
            if self._locating.get(target) is not waiting:
                return  # the target arrived here meanwhile: ``arrived`` answered them
            del self._locating[target]
            route = None
            if error is None:
                location: Location | None = (
                    found.location if isinstance(found, Reservation) else found
                )
                if (
                    location is not None
                    and not location.owner_live
                    and not isinstance(found, Reservation)
                ):  # its owner's lease lapsed: take it over, and answer once that is settled
                    error = self._claims_nothing()
                    if error is None:
                        self._locating[target] = waiting
                        self._take_over(target, waiting, reserve, location)
                        return
                    location = None  # (a node that stops takes nothing over)
                elif (
                    isinstance(found, Reservation) and location is not None
                    and location.owner_node == me and self._ours(location)
                    and not self.rt.has_live(target) and self._claims_nothing() is not None
                ):  # fmt: skip
                    # claimed for this node, which began to stop meanwhile: given
                    # back (a ledger audit found an Instance Spot made on a stopped node, its
                    # calls queued and never run nor counted); the call hears it is refused
                    error = self._claims_nothing()
                    self.fenced_write("release", self.store.release, target, me,
                                      self.rt.incarnation,
                                      location.authority_generation)  # fmt: skip
                    location = None
                if (
                    location is not None and location.owner_node == me
                    and not self._ours(location) and not self.rt.has_live(target)
                ):  # fmt: skip
                    error = _NotYours(  # (a claim made before this node fenced itself, or
                        f"{target!r} belongs to an earlier incarnation of node {me} until"
                        " its lease lapses; it is re-homed then"  # its previous life's)
                    )
                    location = None
                if location is not None and location.owner_node != me:
                    route = Route.at(location)
                    known = self._routes.get(target)
                    if known is None or known.generation < route.generation:
                        self._remember(target, route)
                    else:
                        route = known
                elif (
                    location is not None and reserve is not None and not taken
                    and isinstance(found, Reservation) and not found.created
                    and not self.rt.has_live(target)
                ):  # fmt: skip
                    self._locating[target] = waiting  # (answered once claimed anew, or asked
                    if self.rt.hold_row(target, functools.partial(  # again after its close's
                        self._reserve, target, waiting, reserve, recorder, record,  # release)
                    )):  # fmt: skip
                        self._claim_again(target, waiting, reserve, recorder, record, location)
                    return
                elif location is not None and reserve is not None:  # the store chose this node
                    self._activate_recorded(reserve, found, location, recorder in waiting)
                elif isinstance(found, Reservation) and found.created and location is not None:
                    instance = self._instance_type(location)
                    if instance is not None:  # an Instance Spot re-homed by a call that did
                        # not name it as one: a first record its dead owner left runs first
                        self._activate_recorded(instance, found, location)
                    elif not self.rt.rehome(location, _previous_owner(found)):
                        lost = _previous_owner(found) or "?"
                        error = NotFound(  # an Actor is not re-homed: its node is gone, with it
                            f"{location.kind} {target!r} was lost with node {lost!r}"
                        )
                        self.fenced_write("release", self.store.release, target, me,
                                          self.rt.incarnation,
                                          location.authority_generation)  # fmt: skip
            self._waiting_bytes.pop(target, None)
            self._answer(waiting, route, error)

    def _claims_nothing(self) -> Unavailable | None:
        """Why this node claims no Spot now (it stops: a Spot it made would never run), else
        ``None``. A node that drains still claims: it makes the next activation for what a
        closing Instance Spot took (``drain()`` serves what stayed)."""
        rt = self.rt
        if rt.stopping:
            return Unavailable(f"node {rt.node_id} is stopping: it takes no Spot on")
        return None

    def _reserve(
        self,
        target: str,
        waiting: list[Located],
        reserve: TypeSpec,
        recorder: Located | None,
        record: tuple[str, str] | None,
    ) -> None:
        """Claim Instance Spot ``target`` in the store (``locate``), recording ``record``;
        also once a release of it this node made has ended (``_located``: the row is gone,
        or it is left: then claimed anew). ``_located`` answers."""
        asked = self.store_worker.call(
            self.store.reserve, target, str(TargetKind.SPOT), reserve.name, self.rt.node_id,
            self.rt.incarnation, record,
        )  # fmt: skip
        asked.add_callback(functools.partial(self._located, target, waiting, reserve,
                                             recorder, record))  # fmt: skip

    def _claim_again(
        self, target: str, waiting: list[Located], reserve: TypeSpec,
        recorder: Located | None, record: tuple[str, str] | None, left: Location,
    ) -> None:  # fmt: skip
        """(``_located``, route lock held.) An Instance Spot's row is this incarnation's and
        nothing here has it: a close whose ``release`` the store failed (a review found the
        next activation take the closed one's object generation, and its first message not
        recorded). No release of it is under way here (``Runtime.releasing``): released
        (fenced) and claimed anew, recording the call's message, with a new object
        generation."""
        take = functools.partial(take_left_row, self.store, target, str(TargetKind.SPOT),
                                 reserve.name, self.rt.node_id, self.rt.incarnation,
                                 left.authority_generation, record)  # fmt: skip

        def taken(found: Reservation | None, error: BaseException | None) -> None:
            try:
                if error is None:
                    self.rt.metrics.add("store_rows_taken_again")
                self._located(target, waiting, reserve, recorder, record, found, error,
                              taken=True)  # fmt: skip
            finally:  # (after the activation is in the table)
                self.rt.released(target)

        self.store_worker.call(take).add_callback(taken)

    def _instance_type(self, location: Location) -> TypeSpec | None:
        """The Instance Spot type ``location`` names, if it names one."""
        spec = self.rt.app.spots.get(location.type_name)
        if location.kind != str(TargetKind.SPOT) or spec is None:
            return None
        return spec if spec.kind is SpotKind.INSTANCE else None

    def _activate_recorded(
        self, spec: TypeSpec, held: Any, location: Location, waits: bool = True
    ) -> None:
        """Cold activation of an Instance Spot this node won (execution-model §14): the
        store holds its first record already (step 1); activation makes it Ready (step 2);
        the record's message goes first into its queue (step 3: the first waiter's, or one
        the previous owner left unfinished, replayed once as a one-way message), then the
        others are answered (step 4). A node that loses its lease first drops it all (the
        record stays for the next owner): that is the admission deadline from the owner's
        lease. ``waits``: the call whose message this node recorded still waits (its caller
        may have given up meanwhile, told that nothing was queued: its record is then
        cleared, and it never runs, here or at a later owner)."""
        target = location.spot_id
        act = self.rt.activate_instance(spec, target, location.object_generation,
                                        location.authority_generation)  # fmt: skip
        if location.first is None:
            return
        if act.tenure is None:
            act.tenure = location.object_generation
        ran = functools.partial(self.record_ran, target, location.authority_generation,
                                act.tenure)  # fmt: skip
        previous = held.previous if isinstance(held, Reservation) else None
        if previous is not None and previous.first is not None:  # left by an owner that died
            self.rt.metrics.add("first_records_replayed")
            type_name, payload = location.first
            try:
                msg = from_wire(type_name, payload)
                call = SendCall(self.rt, TargetKind.SPOT, target, msg)
                call.instance, call.instance_type = True, spec.name
                self.rt.submit(call, None, NO_WAIT, recorded=ran)
            except Exception:  # noqa: BLE001 - a record that cannot run is dropped, counted
                self.rt.metrics.add("first_records_dropped")
                _log.exception("the first record of %r could not be replayed", target)
                ran()
            return
        if not waits:
            self.rt.metrics.add("first_records_withdrawn")
            ran()
            return
        self._recorded[target] = ran  # the first waiter, the call recorded, carries it

    def record_ran(self, target: str, authority: int, tenure: int) -> None:
        """The first record's handler ended (here, or on a move's target, whose source's
        commit kept the record for it): clear it in the store (on its thread), tried
        again on a store failure while the Spot's row is still the ``tenure`` that recorded
        it (an audit found one failed clear leave the record for good, and the next owner ran
        the message again once this node died; a review found a retry take the record of a
        later tenure, claimed here at authority 1 again, and retries end when the Spot was
        only made again in place, its row and record unchanged)."""
        rt = self.rt
        clearing = self._clearing
        clearing[target] = tenure

        def still() -> bool:  # (infrastructure thread, before each try again)
            act = rt.spots.get(target)
            return act is not None and act.tenure == tenure

        def ended(made: bool) -> None:  # (not made: counted, unless a move cleared it)
            mine = clearing.get(target) == tenure and clearing.pop(target, None) is not None
            if mine and not made:
                rt.metrics.add("first_records_uncleared")

        self.fenced_write("clear_first", self.store.clear_first, target, rt.node_id,
                          rt.incarnation, authority, still=still, ended=ended)  # fmt: skip

    def cleared_by_move(self, target: str) -> None:
        """(Any thread.) ``target`` moved away: the store cleared its first record with the
        move (``LocationStore.transfer``), so a clear of it still under way here, or failed
        and waiting to be tried again, leaves nothing behind."""
        self._clearing.pop(target, None)

    def fenced_write(
        self, what: str, fn: Callable[..., Any], *args: Any,
        still: Callable[[], bool] | None = None, attempt: int = 0,
        ended: Callable[[bool], None] | None = None,
    ) -> None:  # fmt: skip
        """A fenced store write that no caller waits for (a close's ``release``, a first
        record's ``clear_first``), on the store thread. With ``still``, a store failure (a
        dropped connection, a busy file) is tried again after a backoff on the node's clock,
        ``_WRITE_TRIES`` times in all, while the node serves and ``still()`` holds (read on
        the infrastructure thread before each try again: the store thread takes calls in
        order, so what it reads is what the try meets): a first record whose clear failed
        ran again at the next owner. A release is not tried again: its answer may be lost
        after it ran, and a try again would then delete the row of a Spot claimed since at
        authority 1 again (a review); a row it left is claimed anew by the next claim
        (``Creation._left_row``). A fence verdict (``StaleOwner``, ``NoLease``) ends it: the
        row is another owner's to settle. One not made is counted,
        ``store_writes_failed_<what>`` (``first_records_uncleared`` for a record). A release
        ends its id's entry in ``Runtime.releasing`` once it ends either way (a claim that
        meets the row waits for that: ``Creation._reserved``)."""
        rt = self.rt
        if attempt and (rt.fenced or rt.stopping or (still is not None and not still())):
            self._write_ended(what, args[0], False, ended)  # (the node serves no longer, or
            return  # the write is not the row's any more: not tried again)
        done = self.store_worker.call(fn, *args)

        def after(_value: Any, error: BaseException | None) -> None:
            if error is None:
                self._write_ended(what, args[0], True, ended)
                return
            fenced = isinstance(error, (StaleOwner, NoLease))
            if (fenced or still is None or rt.fenced or rt.stopping
                    or attempt + 1 >= _WRITE_TRIES):  # fmt: skip
                if not fenced:
                    _log.warning("node %s: the store's %s of %r failed %d times: %s",
                                 rt.node_id, what, args[0], attempt + 1, error)  # fmt: skip
                self._write_ended(what, args[0], False, ended)
                return
            rt.metrics.add("store_writes_retried")
            delay = min(_WRITE_BACKOFF * 2**attempt, _WRITE_BACKOFF_MOST)
            rt.infra.call_later(delay, functools.partial(
                self.fenced_write, what, fn, *args, still=still, attempt=attempt + 1,
                ended=ended,
            ))  # fmt: skip

        done.add_callback(after)

    def _write_ended(
        self, what: str, target: str, made: bool, ended: Callable[[bool], None] | None
    ) -> None:
        """(Infrastructure thread.) A ``fenced_write`` ended: told to ``ended`` if given,
        else counted if not made; a release lets what waited for it go on
        (``Runtime.releasing``)."""
        rt = self.rt
        if ended is not None:
            ended(made)
        elif not made:
            rt.metrics.add(f"store_writes_failed_{what}")
        if what == "release":
            rt.released(target)

    def _ours(self, location: Location) -> bool:
        """Whether a claim the store granted is this node's to activate now: made under its
        current incarnation, and it has not fenced itself since (a claim granted to an
        incarnation that fenced meanwhile is never activated: the store gives the Spot to
        another node once that lease lapses)."""
        return not self.rt.fenced and location.owner_incarnation == self.rt.incarnation

    def _take_over(
        self, target: str, waiting: list[Located], reserve: TypeSpec | None, lapsed: Location
    ) -> None:
        """Re-homing (python-api §10): ``target``'s owner lost its lease; claim it for this
        node (the store decides which claimer wins), then answer as ``_located`` does. The
        caller holds ``route_lock``."""
        self.rt.metrics.add("rehome_claims")
        kind, type_name = lapsed.kind, lapsed.type_name
        if reserve is not None:
            kind, type_name = str(TargetKind.SPOT), reserve.name
        asked = self.store_worker.call(self.store.reserve, target, kind, type_name,
                                       self.rt.node_id, self.rt.incarnation)  # fmt: skip
        asked.add_callback(functools.partial(self._located, target, waiting, reserve, None, None))

    def _answer(self, waiting: list[Located], route: Route | None,
                error: BaseException | None) -> None:  # fmt: skip
        self._each(functools.partial(then, route, error) for then in waiting)

    def _each(self, steps: Iterable[Callable[[], object]]) -> None:
        """Run each waiter's next step, in order: one waiter's fault (counted, logged) must
        not strand the rest."""
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 - counted; the next waiter goes on
                self.rt.metrics.add("locate_waiter_errors")
                _log.exception("a call waiting for the location store failed")

    def moved_away(self, target: str, route: Route) -> None:
        """This node relocated ``target`` to ``route.node``: relay along it from now on.

        At most ``MAX_POINTERS`` are kept, the oldest dropped first: a call that still comes
        here for one of those is relayed by the Location Store instead (delivered, but no
        longer behind a fence, so its order with later calls is not guaranteed).
        """
        with self.route_lock:
            self._moved.pop(target, None)
            self._moved[target] = route  # the newest last: dicts keep insertion order
            self._routes.pop(target, None)
            while len(self._moved) > MAX_POINTERS:
                del self._moved[next(iter(self._moved))]
                self.rt.metrics.add("pointers_dropped")

    def arrived(self, target: str) -> None:
        """``target`` relocated onto this node: no pointer, no route; it is local now."""
        with self.route_lock:
            self._moved.pop(target, None)
            self._routes.pop(target, None)
            for kind in _ROUTED_KINDS:  # calls that wait for a kind question came before
                asked = self._kind_questions.pop((target, kind), None)  # any that waits for
                if asked is not None:  # the store (they would have joined it): first
                    self._waiting_bytes.pop((target, kind), None)
                    self._answer([then for _call, _room, then in asked], None, None)
            self._waiting_bytes.pop(target, None)
            waiting = self._locating.pop(target, None)
            if waiting is not None:  # asked before it arrived: they go first, and find it here
                self._answer(waiting, None, None)
            self._arriving_now(target)  # a notice for it that came first lifts now

    def send_call(
        self, call: MessageCall, reply: Completion | None, hops: int,
        room: Admitted | None = None, admitted: bool = False,
    ) -> None:  # fmt: skip
        """Send (or keep, behind a fence or a store question) a call for a remote target.

        The caller holds ``route_lock``. ``Unavailable`` now if the known next node is
        unreachable (nothing was sent); what goes wrong once the call has waited for the store
        completes ``reply`` (a request) or is counted as dropped with its reason (a send).
        A call made here (not relayed) needs room in the outbox to its node (python-api §9):
        a plain send without it is ``ResourceExhausted``; a request, or a send given ``room``,
        waits for it (``admitted``: it waited already).
        """
        target = call.target
        kept = self._switching.get(target)
        if kept is not None:
            if admitted:  # it waited in the outbox since before this fence: ahead of what
                at = self._ahead.get(target, 0)  # the fence kept, behind others like it
                kept.insert(at, self.envelope(call, reply, hops))
                self._ahead[target] = at + 1
            else:
                self._keep(target, kept, [self.envelope(call, reply, hops)], call, reply, room)
            return
        if self._kind_questions and (target, str(call.kind)) in self._kind_questions:
            self._ask_kind(call, reply, hops, room, admitted)  # behind the open question,
            return  # whatever the path is now (it may have gone meanwhile)
        route = self._known(target)
        if route is not None and route.kind not in (None, call.kind):  # a path for the
            if target not in self._locating:  # other kind's object: it stays with the
                self._ask_kind(call, reply, hops, room, admitted)  # calls on it; the store
                return  # says what this call names
            route = None  # (the open question answers it, behind the calls before it)
        if route is not None and route.node != self.rt.node_id and target not in self._locating:
            if not hops:
                self._check_peer_takes(call, route.node)
            if self._tracking:  # (a send pays for the route cache's order only when it is big)
                self._touch(target)
            if hops or admitted:
                self._post_call(call, reply, hops, route)
            elif reply is None and self._post_send_if_room(call, route.node, room is not None):
                pass  # a one-way message made here, and room for it: queued (the common case)
            elif self._outbox_room(call, reply, room, route.node):
                self._post_call(call, reply, hops, route)
            return
        if not hops and not admitted:
            self._check_room_to_wait(call, reply, room, target, target in self._locating)
        waiter = functools.partial(self._send_located, call, reply, hops, room)
        self._locate_for(call, waiter, room, reply)

    def _check_room_to_wait(
        self, call: MessageCall, reply: Completion | None, room: Admitted | None,
        key: str | tuple[str, str], waiting: bool,
    ) -> None:  # fmt: skip
        """(``route_lock`` held.) A plain ``submit()`` made here that is to wait behind a
        store question (``key``: its target's, or its kind's, ``_ask_kind``; ``waiting``: one
        is open) counts its bytes against that question; past the outbox's ``submit_limit``
        (``peer_outbound_submit_bytes``) it is ``ResourceExhausted``, nothing queued, counted
        (``rejected_admissions``), as the outbox refuses it (python-api §9). Before, nothing
        bounded them: a ``submit()`` loop against a slow store grew the queue as long as it
        ran. Callers that wait (a request, a send's ``wait()``) are bounded by their deadlines,
        as in the outbox; a peer's calls by its backlog (it is paused)."""
        if reply is not None or room is not None:
            return
        size = self.rt.limits.app_retained_per_item + (
            len(call.wire[1]) if call.wire is not None else 0
        )
        held = self._waiting_bytes.get(key, 0) if waiting else 0
        if held and held + size > self.outbox.submit_limit:
            self.rt.metrics.add("rejected_admissions")
            raise ResourceExhausted(
                f"{held:,} bytes of sends for {call.kind} {call.target!r} wait for the location "
                f"store already (peer_outbound_submit_bytes: {self.outbox.submit_limit:,}); "
                "nothing was queued"
            )
        self._waiting_bytes[key] = held + size

    def _arm(self, call: MessageCall, reply: Completion | None, room: Admitted | None) -> None:
        """(``route_lock`` held, its ``withdraw`` set.) A caller waiting until ``call`` is
        really queued (``room``) waits for the store with a deadline of its own, unless it is
        a request (its deadline is the request's) or a peer's call (that just waits)."""
        if room is not None and not room.done and room.peer is None and reply is None:
            self.rt.arm_room(room, f"a route to {call.target!r}")

    def _locate_for(
        self, call: MessageCall, waiter: Located, room: Admitted | None,
        reply: Completion | None = None, arm: bool = True,
    ) -> None:  # fmt: skip
        """(``route_lock`` held.) ``locate`` ``call``'s target for ``waiter`` (``arm``: its
        caller's wait gets its deadline now): an Instance Spot's first call reserves it (cold
        activation)."""
        target = call.target
        if room is not None and not room.done:  # its caller may withdraw it meanwhile
            room.withdraw = functools.partial(self._cancel_locate, target, waiter)
            if arm:  # (before it is asked: the answer may come on this very thread)
                self._arm(call, reply, room)
        if call.instance:
            self.locate(target, waiter, self.rt.instance_spec(call), call.msg)
        else:
            self.locate(target, waiter)

    def _ask_kind(
        self, call: MessageCall, reply: Completion | None, hops: int, room: Admitted | None,
        admitted: bool,
    ) -> None:  # fmt: skip
        """(``route_lock`` held.) ``call`` names its target as the other kind of object than
        this node's path for it leads to (a Spot's id called as an Actor's, or the reverse).
        Under one id they are two objects (one id space, python-api §5): the path stays with
        the calls on it, and the store is asked what the id names now, in a question of its
        own, which the calls of that kind made meanwhile wait behind, in order. Before, the
        path was dropped: calls made next went by the store, past those still on it
        (per-sender order, python-api §9)."""
        key = (call.target, str(call.kind))
        if not hops and not admitted:
            self._check_room_to_wait(call, reply, room, key, key in self._kind_questions)
        waiter = functools.partial(self._send_located, call, reply, hops, room)
        if room is not None and not room.done:
            room.withdraw = functools.partial(self._cancel_kind_question, key, waiter)
        self._arm(call, reply, room)
        waiting = self._kind_questions.get(key)
        if waiting is not None:
            waiting.append((call, room, waiter))
            return
        waiting = self._kind_questions[key] = [(call, room, waiter)]
        asked = self.store_worker.call(self.store.lookup, call.target)
        asked.add_callback(functools.partial(self._kind_answered, key, waiting))

    def _cancel_kind_question(self, key: tuple[str, str], waiter: Located) -> bool:
        """Withdraw a call waiting for its kind's question, or, once that was answered, for
        the store's (its caller gave up): ``True`` if it was still waiting."""
        with self.route_lock:
            for at, (_call, _room, then) in enumerate(self._kind_questions.get(key, ())):
                if then is waiter:
                    del self._kind_questions[key][at]
                    return True
            return self._cancel_locate(key[0], waiter)  # answered: located now, maybe

    def _kind_answered(
        self, key: tuple[str, str], waiting: list[tuple[MessageCall, Admitted | None, Located]],
        found: Any, error: BaseException | None,
    ) -> None:  # fmt: skip
        """The store answered a question of ``_ask_kind`` (infrastructure thread). The id
        still names the other kind: each call waiting is ``NotFound`` (``_send_located``
        checks the kind), the path unchanged. It names nothing, and the path leads to a
        Spot: the path stays (an Instance Spot that closed itself is activated again by the
        next call along it), and the calls, an Actor's, are ``NotFound``. Else (it names this
        kind, or nothing and the path led to an Actor, which never comes back) the object the
        path led to is gone, so is the path, and the calls are located as any call with no
        path, in order (an Instance Spot's first call activates it)."""
        target, kind = key
        with self.route_lock:
            if self._kind_questions.get(key) is not waiting:
                return
            del self._kind_questions[key]
            self._waiting_bytes.pop(key, None)
            thens = [then for _call, _room, then in waiting]
            location = found if isinstance(found, Location) else None
            if error is not None or (location is not None and location.kind != kind):
                route = None if location is None else Route.at(location)
                self._answer(thens, route, error)
                return
            known = self._known(target)
            if location is None and known is not None and known.kind == str(TargetKind.SPOT):
                self._answer(thens, None, None)  # (nothing here of their kind: NotFound)
                return
            if known is not None and known.kind not in (None, kind):  # the other kind's
                self._moved.pop(target, None)  # object is gone: so is its path
                self._routes.pop(target, None)
            self._each(  # (each armed as it came)
                functools.partial(self._locate_for, call, then, room, arm=False)
                for call, room, then in waiting
            )

    def _keep(
        self, target: str, kept: list[Relayable], envs: list[Relayable],
        call: MessageCall | BatchSendCall, reply: Completion | None, room: Admitted | None,
    ) -> None:  # fmt: skip
        """(``route_lock`` held.) Keep ``envs`` for ``target`` until its fence is back, as
        much as its lane would hold (``zlink.runtime.waits``): past that its caller waits
        behind them, first come first served, and is taken in when the fence is back; a plain
        ``submit()`` is ``ResourceExhausted``, nothing queued (python-api §9)."""
        size = sum(map(payload_size, envs))
        waiting = self._fence_waiting[target]
        held = self._kept_bytes.get(target, 0)
        if fits(self.rt.limits, waiting, len(kept), held, len(envs), size):
            kept.extend(envs)
            self._kept_bytes[target] = held + size
            return
        wait_behind(self.rt, waiting, envs, call, reply, room,
                    functools.partial(unwait, self.route_lock, waiting),
                    "is being re-routed, and what waits for its route fence", "the route "
                    "fence of")  # fmt: skip

    def _cancel_locate(self, target: str, waiter: Located) -> bool:
        """Withdraw a call waiting for the store (its caller gave up): ``True`` if it was
        still waiting."""
        with self.route_lock:
            waiting = self._locating.get(target)
            if waiting is None or waiter not in waiting:
                return False
            waiting.remove(waiter)
            return True

    def send_batch(
        self, call: BatchSendCall, room: Admitted | None, admitted: bool = False
    ) -> bool:
        """Send a batch for a remote target as one envelope, admitted all or none where the
        target lives (python-api §8), after waiting for room in the outbox as one call does
        (§9). ``False`` (nothing done) when the target's path is not settled (a store question
        or a fence under way, or no route): the caller then sends it message by message, which
        keeps its order behind what waits. Any thread; takes ``route_lock``. A message too
        large for a frame refuses the batch (``InvalidArgument``, nothing queued); a batch too
        large for one goes message by message."""
        wires = [to_wire(m) for m in call.msgs]  # (serialized before the route lock)
        size = sum(wire.check_fits(payload) for _t, payload in wires)
        with self.route_lock:
            target = call.target
            kept = self._switching.get(target)
            if kept is not None and not admitted:  # whole behind the fence (or waiting whole;
                envs: list[Relayable] = [  # each of its messages goes on alone after it)
                    self.envelope(SendCall(self.rt, call.kind, target, msg), None, 0)
                    for msg in call.msgs
                ]  # fmt: skip
                self._keep(target, kept, envs, call, None, room)
                return True
            if size > wire.MAX_FRAME_BYTES * 3 // 4:
                return False  # each fits, not all in one frame: one by one
            route = self._known(target)
            settled = (
                kept is None and target not in self._locating
                and (target, str(call.kind)) not in self._kind_questions
            )  # fmt: skip
            if (
                not settled or route is None or route.node == self.rt.node_id
                or route.kind not in (None, call.kind)  # (the other kind's path: each of
            ):  # its messages asks the store what the id names, ``_ask_kind``)  # fmt: skip
                if admitted:  # it waited in the outbox: its messages go on, in order (an
                    for msg in call.msgs:  # admitted batch is never left: it was accepted)
                        self.send_call(SendCall(self.rt, call.kind, target, msg), None, 0,
                                       admitted=True)  # fmt: skip
                    return True
                return False
            if self._tracking:
                self._touch(target)
            if not admitted and not self._outbox_room(call, None, room, route.node):
                return True  # it waits for room in the outbox (``room`` tells its caller)
            me = self.rt.node_id
            envelope = wire.BatchEnvelope(
                str(call.kind), target, tuple(t for t, _ in wires), tuple(p for _, p in wires),
                me, me, me, 0,
            )  # fmt: skip
            self.post(route.node, envelope)
            self.rt.metrics.add("batches_sent")
            return True

    def _outbox_room(
        self, call: MessageCall | BatchSendCall, reply: Completion | None,
        room: Admitted | None, peer: str, accepted: bool = False,
    ) -> bool:  # fmt: skip
        """Whether ``call`` may go into the outbox to ``peer`` now; else it waits for room
        there (``False``), or, a plain send, is refused at the source. ``accepted``: a plain
        send its caller was told is accepted (it waited for the store): it waits, in order,
        as long as it takes, never refused."""
        outbox = self.outbox
        plain = reply is None and room is None  # its caller does not wait (``submit()``)
        if outbox.has_room(peer, not plain, call.target):  # (accepted: as its submit() did)
            return True
        if plain and not accepted:
            self.rt.metrics.add("rejected_admissions")
            raise ResourceExhausted(
                f"the outbound queue to node {peer!r} {outbox.refusal(peer, call.target)}; "
                "nothing was queued"
            )
        timed = room is not None and room.peer is None  # (a peer's, or accepted: it waits)
        # bounded per target as a lane's waiters are (python-api §9), but for a peer's call
        # (its node's pause bounds it) and a send its caller was told is accepted
        peers = accepted or (room is not None and room.peer is not None)
        bound = 0 if peers else self.rt.limits.waiters
        if room is None:
            room = self._room_for(call, reply)

        def go() -> None:  # (infrastructure thread) there is room now
            if room.done:
                return  # it gave up meanwhile
            try:
                with self.route_lock:
                    here = self._arrived_here(call)  # (then it stays until it moves on, and
                    if not here:  # submit follows it then)
                        if isinstance(call, BatchSendCall):
                            self.send_batch(call, None, admitted=True)
                        else:
                            self.send_call(call, reply, 0, admitted=True)
                if here:  # (no lock held: ``room`` completes once it is queued here)
                    self._submit_here(call, reply, room)
                    return
            except ZLinkError as exc:
                if reply is not None:
                    reply.set(None, exc)
                room.set(None, exc)  # (accepted already: counted as lost, its callback)
                return
            room.set(None, None)

        verdict = outbox.wait_room(peer, go, call.target, bound)
        if verdict is Room.NOW:
            return True
        if verdict is Room.FULL:
            self.rt.metrics.add("rejected_admissions")
            if reply is not None and reply.timer is not None:
                reply.timer.cancel()
            raise ResourceExhausted(
                f"the outbound queue to node {peer!r} is full and {bound} callers already wait"
                f" for room in it for {call.target!r}; nothing was queued"
            )
        room.withdraw = functools.partial(outbox.cancel_wait, peer, go)
        self.rt.metrics.add("admission_waits")
        if reply is None and timed and room.timer is None:
            self.rt.arm_room(room, f"the outbound queue to node {peer!r}")
        return False

    def _arrived_here(self, call: MessageCall | BatchSendCall) -> bool:
        """(``route_lock`` held.) Whether ``call``'s target lives on this node now, with no
        fence of this node out for it, though the call waited for room to another node. An
        arrival's fence waits behind such a call (``switch``), which then finds the fence
        out and is kept ahead of what it keeps; this is for a target that came here with no
        fence (no path to fence: re-homed, activated). The caller's next call finds the
        target here (``Runtime._remote``), so this one must be queued here before its caller
        is told it is: asking the store first let that next call overtake it (per-sender
        order, python-api §9)."""
        target = call.target
        if target in self._switching:
            return False
        rt = self.rt
        return (rt.actors if call.kind == TargetKind.ACTOR else rt.spots).get(target) is not None

    def _submit_here(
        self, call: MessageCall | BatchSendCall, reply: Completion | None, room: Admitted
    ) -> None:
        """Queue a call that waited for outbox room on this node instead, where its target
        arrived meanwhile: it waits for room in the lane as it did in the outbox, and
        ``room`` completes once it is queued (``Runtime.submit``)."""
        if isinstance(call, BatchSendCall):
            self.rt.submit_many(call, room)
        else:
            self.rt.submit(call, reply, NO_WAIT, 0, room=room)

    def _room_for(self, call: MessageCall | BatchSendCall, reply: Completion | None) -> Admitted:
        """The wait of a call whose caller does not wait for room itself: a request (its own
        deadline ends the wait), or a send accepted already (nobody waits to hear; no timer
        ends it, nor its wait in a lane if it lands here: the peer mark; a failure is counted
        as a drop, with its reason)."""
        if reply is not None:
            room = Admitted()
            reply.add_callback(lambda _v, error: error is not None and room.abandon(error))
            return room
        accepted = Admitted(peer=self.rt.node_id)

        def lost(_value: object, error: BaseException | None) -> None:
            if error is None:
                return
            msgs = call.msgs if isinstance(call, BatchSendCall) else (call.msg,)
            for msg in msgs:
                self._count_drop(call.target, msg.zlink_type_name, self.rt.node_id,
                                 _drop_reason(error))  # fmt: skip

        accepted.add_callback(lost)
        return accepted

    def _post_send_if_room(self, call: MessageCall, peer: str, can_wait: bool) -> bool:
        """Queue a one-way message made here for ``peer`` if the outbox has room for it now
        (``can_wait``: its caller may wait for room, so it stops at the lower limit), in one
        take of the outbox lock (senders hold ``route_lock`` meanwhile); ``False``, and
        nothing queued, if it has not. ``Unavailable`` if ``peer`` is not reachable."""
        self._check_reachable(peer)
        return self.outbox.put_if_room(peer, self.envelope(call, None), can_wait, call.target)

    def _check_peer_takes(self, call: MessageCall, peer: str) -> None:
        """``InvalidArgument`` (nothing sent) when ``call`` is larger than ``peer`` takes (a
        peer whose ``max_frame_bytes`` is below the wire's: it would drop it unread)."""
        if call.wire is None or len(call.wire[1]) <= wire.FITS_ANY_FRAME:
            return  # (most messages: no look at the peer at all)
        frame = self.transport.frame_limit(peer)
        if frame is not None and frame < wire.MAX_FRAME_BYTES:
            wire.check_fits(call.wire[1], call.meta, frame)  # (the wire's own: at _remote)

    def _post_call(
        self, call: MessageCall, reply: Completion | None, hops: int, route: Route
    ) -> None:
        back = call.reply_route if hops and reply is not None else None
        if back is None:
            self.post(route.node, self.envelope(call, reply, hops, peer=route.node))
        else:  # a request relayed by a stale route keeps its reply route (kotlin-spot-
            # interface: "preserving operation identity, generation, deadline, correlation,
            # and reply route"): its reply goes straight to its origin, told where it is
            # awaited now, and this node's stop or loss no longer fails it
            self.post(route.node, self.envelope(call, None, hops, reply_route=back))
            assert reply is not None
            reply.set(RELAYED_ON, None)  # (answered from elsewhere: nothing waits here)
            self._tell_relayed(back, route.node, hops, self.rt.node_id)
        if hops:
            self.rt.metrics.add("relayed_calls")
            self.tell_origin(call.origin, call.target, route)

    def _tell_relayed(self, back: tuple[str, int], node: str, hops: int, relay: str | None) -> None:
        """Tell a relayed request's origin where its reply comes from now: the relaying node
        as it posted it (``relay``: itself; until ``node`` has it, the loss of either fails
        the call), then the node that took it (``relay`` None: only its loss does). A review
        found each half alone short: told only by the relay, a request that died unsent with
        the relay's stop left its origin awaiting a node that never had it; told only by the
        taker, one that died with a node before it took it left its origin awaiting the
        relay, alive and unaware. Either way the call waited out its deadline."""
        origin, corr = back
        if origin == self.rt.node_id:
            self.relayed_on(corr, node, hops, relay)
            return
        with contextlib.suppress(Unavailable):  # its origin is gone, and the call with it
            self.post(origin, wire.RelayedEnvelope(corr, node, hops, relay))

    def _on_relayed(self, env: wire.RelayedEnvelope) -> None:
        self.relayed_on(env.correlation, env.node, env.hops, env.relay)

    def relayed_on(self, corr: int, node: str, hops: int, relay: str | None) -> None:
        """A request this node awaits under ``corr`` was relayed (``hops``) to ``node`` by
        ``relay``, or (``relay`` None) ``node`` took it: its reply is awaited from ``node``,
        and until ``node`` took it the loss of ``relay`` fails it too. The notices come on
        COMPLETION from several nodes and may cross: a relay's ranks below its taker's, and
        both below a later relay's; a lower one than the last taken changes nothing. A
        notice naming a node declared down already fails the call at once (no verdict will
        come again); a reply that came first ended the wait."""
        rank = 2 * hops + (relay is None)
        also = relay or ""
        with self._lock:
            entry = self._pending.get(corr)
            if entry is None or rank <= entry[3]:
                return
            gone = next((n for n in (node, also) if n and n in self._down), None)
            if gone is not None:  # (two senders: nothing orders its notice and the verdict)
                del self._pending[corr]
            else:
                self._pending[corr] = (entry[0], entry[1], node, rank, also)
        if gone is not None:
            self.rt.metrics.add("calls_failed_peer_down")
            entry[0].set(None, Unavailable(f"node {gone!r} is down (its lease lapsed or it"
                                           " left) and will not answer"))  # fmt: skip
            return
        self.rt.metrics.add("relayed_replies_rebound")

    def _send_located(
        self, call: MessageCall, reply: Completion | None, hops: int, room: Admitted | None,
        route: Route | None, error: BaseException | None,
    ) -> None:  # fmt: skip
        """A call that waited for the store goes on (infrastructure thread, ``route_lock``).
        A caller still waiting (``room``) gets the outcome: queued, or the error."""
        target = call.target
        if room is not None:
            if room.done:
                return  # its caller gave up (withdrawn) meanwhile
            room.withdraw = in_progress  # from now on its outcome is on its way
        fault: ZLinkError
        try:
            if route is not None:  # a call made here takes its turn in the outbox (§9)
                _check_kind(call, route)
                if not hops:
                    self._check_peer_takes(call, route.node)
                accepted = reply is None and room is None  # (a plain send: told so)
                if not hops and not self._outbox_room(call, reply, room, route.node, accepted):
                    return  # it waits for room in the outbox now
                self._post_call(call, reply, hops, route)
                if room is not None:
                    room.set(None, None)
                return
            if self.rt.has_live(target, call.kind) or (error is None and call.instance):
                recorded = self._recorded.pop(target, None) if call.instance else None
                if room is None and reply is None:  # a plain submit(), accepted already:
                    room = self._accepted_room(call)  # it waits for room, as in the outbox
                self.rt.submit(call, reply, NO_WAIT, hops, room=room,
                               recorded=recorded)  # here, or activated  # fmt: skip
                return
            if isinstance(error, (NotFound, _NotYours)):  # the store knew it: gone, or not
                fault = error  # this incarnation's yet
            elif error is not None:
                fault = Unavailable(
                    f"the location store could not say where {call.kind} {target!r} is: {error}"
                )
            else:
                fault = NotFound(f"no {call.kind} {target!r}")
        except ZLinkError as exc:  # refused where it went on: as if refused at the call site
            fault = exc
        if room is not None:
            room.set(None, fault)
        if reply is not None:
            reply.set(None, fault)
        if room is not None or reply is not None:
            return  # its caller has the error
        store_failed = error is not None and not isinstance(error, NotFound)
        reason = "store_failed" if store_failed else _drop_reason(fault)
        self._count_drop(target, call.msg.zlink_type_name, call.origin, reason)

    def _accepted_room(self, call: MessageCall) -> Admitted:
        """A room for a one-way ``call`` accepted before it could be queued (it waited for
        the store), that meets a full lane or arrival here: it waits, however long that
        takes, and a refusal after that (a close) is counted as a drop with its reason.
        Before, one made with ``submit()`` while the store was asked was refused once the
        Spot arrived here past what the arrival keeps (``sends_dropped_lane_full``)."""
        room = Admitted(peer=call.via or self.rt.node_id)  # (a peer's: no timer, it waits)

        def refused(_value: object, error: BaseException | None) -> None:
            if error is not None:
                self.count_dropped(call, error)

        room.add_callback(refused)
        return room

    def switch(self, target: str) -> bool:
        """Start changing ``target``'s path: a fence goes along the old one, and calls wait.

        The caller holds ``route_lock``. ``False`` if there is no old path to fence (nothing
        can be overtaken); ``fenced`` ends the switch when the fence is back.
        """
        if target in self._switching:
            return True
        route = self._known(target)
        if route is None or route.node == self.rt.node_id:
            return False
        me = self.rt.node_id
        try:
            self._check_reachable(route.node)
        except Unavailable:  # the old path is gone, and what went along it with it
            return False
        # behind the calls made here that wait for room to that node: they were made first
        self.outbox.put_behind_waiters(route.node, wire.FenceEnvelope(target, me, me, 0))
        kept: list[Relayable] = []
        self._switching[target] = kept
        self._fence_waiting[target] = WaitLine()  # (callers past what ``kept`` may hold: ``_keep``)
        self._fence_via[target] = route.node
        self.rt.metrics.add("route_fences")
        # a fence lost with a node must not keep the calls behind it forever
        self._fence_timers[target] = self.rt.infra.call_later(
            self.rt.request_timeout, self._fence_overdue, target, kept
        )
        return True

    def _fence_overdue(self, target: str, kept: list[Relayable]) -> None:
        """No fence came back in a request timeout: give up the old path (counted); the kept
        calls go by the Location Store. Order is kept only while the old path works."""
        with self.route_lock:
            if self._switching.get(target) is not kept:
                return  # it came back
            self.rt.metrics.add("route_fences_lost")
            self._on_fenced(wire.FencedEnvelope(target, None))

    def _on_route(self, env: wire.RouteEnvelope) -> None:
        """A relaying node says where ``target`` went: a newer generation starts a switch."""
        learned = Route(env.route_node, (env.object_generation, env.authority_generation))
        target = env.target
        with self.route_lock:
            known = self._known(target)
            if known is not None and learned.generation <= known.generation:
                return
            if learned.node == self.rt.node_id:  # it is arriving here: its own fence decides
                return
            # while the store is asked, every call made waits behind the question
            # (``send_call``): the path known meanwhile carried none, and a fence along it
            # only kept the calls made after it; if the Spot then arrived here, the answered
            # question went in behind them: [0, 2, 1, 3] (python-api §9)
            if target not in self._locating and self.switch(target):
                self._learned[target] = learned  # where the calls go once the fence is back
            else:
                self._remember(target, learned)

    def _on_fence(self, env: wire.FenceEnvelope) -> None:
        """A fence travels like a call: parked with a moving target, relayed along the route,
        kept behind this node's own fence; at the owner it goes back to where it started."""
        target = env.target
        relocator = self.rt.relocator
        if relocator is not None and relocator.divert_envelope(target, env):
            return
        with self.route_lock:
            if self.rt.has_live(target):
                if not self._fence_waits_for_room(env):
                    self._fence_back(env)
                return
            env = replace(env, hops=env.hops + 1)
            kept = self._switching.get(target)
            if kept is not None:
                waiting = self._fence_waiting[target]
                if waiting:  # behind the calls that wait: never ahead of them
                    waiting.append(KeptWait([env], None, None))
                else:
                    kept.append(env)
                return
            if env.hops > MAX_HOPS:
                self._fence_back(env, gone=True)
                return
            self.locate(target, functools.partial(self._fence_located, env))

    def _fence_waits_for_room(self, env: wire.FenceEnvelope) -> bool:
        """(``route_lock`` held; the target lives here.) A fence that reaches the owner while
        calls wait for room in the target's lane waits behind them, as a waiter of no size,
        and goes back only once they are queued: they came first (the calls before the fence
        among them), and until they are queued a seal routes them again, parked for a move
        and relayed to its target after what that node took in meanwhile. A fence back
        before them let the origin, once the target moved there, queue calls made after the
        fence ahead of those made before it (a move withdrawn here had put its queue back and
        the calls it parked waited for room behind it; python-api §9, execution-model §6).
        ``False``: nothing waits (or the lane closed, not for a move): it goes back now."""
        rt = self.rt
        act = rt.spots.get(env.target) or rt.actors.get(env.target)
        owner = None if act is None else act.owner
        if owner is None or not owner.lanes.app_waiters:
            return False
        relocator = rt.relocator

        def notify(verdict: Admission) -> None:
            if verdict == Admission.ADMITTED:  # those before it are queued now
                rt.infra.submit(self._fence_back, env)
            elif relocator is not None and relocator.divert_envelope(env.target, env):
                pass  # sealed for a move: parked behind the waiters routed again before it
            else:  # closed: as if it arrived now (on the infrastructure thread)
                rt.infra.submit(self._on_fence, env)

        waiter = RoomWaiter(Entries([], 0), 0, 0, notify, bounded=False)
        verdict = owner.lanes.wait_room(waiter)
        if verdict == Admission.CLOSED:  # sealed meanwhile: parked, if for a move
            return relocator is not None and relocator.divert_envelope(env.target, env)
        return verdict == Admission.WAITING

    def _fence_located(
        self, env: wire.FenceEnvelope, route: Route | None, error: BaseException | None
    ) -> None:
        """Where a fence goes on: the way the calls before it went (``route_lock`` held)."""
        if route is None and self.rt.has_live(env.target):  # it arrived here meanwhile
            self._fence_back(env)
            return
        if route is None or error is not None:  # nowhere: the calls before it met that too
            self._fence_back(env, gone=True)
            return
        try:
            self.post(route.node, replace(env, via=self.rt.node_id))
        except Unavailable:  # the calls before it went that way too, and are lost with it
            self._fence_back(env, gone=True)

    def _fence_back(self, env: wire.FenceEnvelope, gone: bool = False) -> None:
        back = wire.FencedEnvelope(env.target, None if gone else self.rt.node_id)
        if env.first_origin == self.rt.node_id:
            self._on_fenced(back)
            return
        with contextlib.suppress(Unavailable):  # the origin is gone, and its calls with it
            self.post(env.first_origin, back)

    def _on_fenced(self, env: wire.FencedEnvelope) -> None:
        """The fence is back: the new path is safe (or, found elsewhere than the hint said,
        the old one stays); the calls kept behind it go, in order."""
        target = env.target
        with self.route_lock:
            kept = self._switching.pop(target, None)
            learned = self._learned.pop(target, None)
            self._ahead.pop(target, None)
            self._fence_via.pop(target, None)
            self._kept_bytes.pop(target, None)
            waiting = self._fence_waiting.pop(target, None) or WaitLine()
            timer = self._fence_timers.pop(target, None)
            if timer is not None:  # (its deadline would keep ``kept`` until it passed)
                timer.cancel()
            if kept is None:
                return
            rooms = take_waiting(waiting, kept.extend)  # those that waited go after it, in order
            owner = env.owner_node
            if learned is not None and owner == learned.node:
                self._moved.pop(target, None)  # a pointer is a route too: the fence replaced it
                self._remember(target, learned)
            elif owner is None or owner == self.rt.node_id or not self._old_path_works(target):
                self._moved.pop(target, None)  # gone, here, or the old path broke since:
                self._routes.pop(target, None)  # the store says, when next asked
            # else not where the hint said (it went back, or on): every call made before the
            # fence is with it now, come by the old path, so the old path stays; later calls
            # follow them along it, and a newer hint fences again. Asking the store instead
            # let later calls go straight to where the Spot moved next while the earlier ones
            # were still relayed there (per-sender order, python-api §9).

            me = self.rt.node_id

            def resend(mine: bool) -> None:  # re-routed from here, as if they had just come
                for item in kept:  # (in their order: those of one sender never part)
                    if (item.first_origin == me) is mine:
                        self.redeliver(item)

            relocator = self.rt.relocator
            if relocator is None or not relocator.fence_back(target, resend):
                for item in kept:
                    self.redeliver(item)
        accepted(rooms)

    def holds_kept(self) -> bool:
        """Whether calls are kept behind a route fence (or wait behind those)."""
        with self.route_lock:
            return bool(self._switching or any(self._fence_waiting.values()))

    def abandon_kept(self, error: ZLinkError) -> None:
        """(Shutdown, infrastructure thread.) The calls kept behind route fences that did
        not come back fail as undeliverable: each one-way message counted
        (``sends_dropped_shutdown``), each request answered with ``error`` (at its origin);
        a caller that waited behind them hears ``error`` (nothing of its call was queued).
        A ledger audit found a stopping node's kept calls neither handled nor counted."""
        with self.route_lock:
            kept, self._switching = self._switching, {}
            waiting, self._fence_waiting = self._fence_waiting, {}
            timers = list(self._fence_timers.values())
            for table in (self._kept_bytes, self._ahead, self._learned, self._fence_via,
                          self._fence_timers):  # fmt: skip
                table.clear()
        for timer in timers:
            timer.cancel()
        for target, items in kept.items():
            for env in items:
                self._undeliverable(target, env, error)
        rooms: list[tuple[Admitted, BaseException | None]] = []
        for line in waiting.values():
            for wait in line.take():
                if wait.room is not None and not wait.room.done:
                    rooms.append((wait.room, error))
                if wait.reply is not None:
                    wait.reply.set(None, error)
        accepted(rooms)

    def _old_path_works(self, target: str) -> bool:
        """(``route_lock`` held.) Whether this node's path for ``target`` leads to a node it
        can reach now (one it cannot reach would refuse every call until its lease lapses;
        what went along it is lost with it, so nothing can be overtaken)."""
        old = self._known(target)
        return old is not None and self.transport.reachable(old.node)

    def tell_origin(self, origin: str | None, target: str, route: Route) -> None:
        """After relaying a call of ``origin``: tell it the better route (it relayed first)."""
        if origin is None or origin == self.rt.node_id:
            return
        hint = wire.RouteEnvelope(target, route.node, *route.generation)
        with contextlib.suppress(Unavailable):  # a hint only: the relay already happened
            self.post(origin, hint)

    # -- the origin side -----------------------------------------------------------------------
    def envelope(
        self,
        call: MessageCall,
        reply: Completion | None,
        hops: int = 0,
        peer: str = "",
        reply_route: tuple[str, int] | None = None,
    ) -> CallEnvelope:
        """``call`` as it crosses the boundary; a request's reply is awaited here from now
        (``peer``: where it goes first, whose loss fails it at once; "" while not yet known),
        or, given its ``reply_route`` (origin node, correlation), at its origin as before."""
        type_name, payload = call.wire or to_wire(call.msg)
        me = self.rt.node_id
        common = (
            str(call.kind), call.target, type_name, payload, call.meta or None,
            me if reply_route is None else reply_route[0],  # where the reply goes
            call.origin or me,  # the first node: route updates go there
            me,  # the node handing it over (a relocation target asks)
            hops, bool(call.instance), call.instance_type if call.instance else None,
        )  # fmt: skip
        if reply_route is not None:
            return _new_request(*common, reply_route[1],
                                float(self.rt.deadline_of(call.deadline)))  # fmt: skip
        if reply is None:
            return _new_send(*common, None)
        corr = self.register_pending(reply, reply_type(type(call.msg)), peer)
        return _new_request(*common, corr, float(self.rt.deadline_of(call.deadline)))

    def topic_fits(self, call: MessageCall) -> bool:
        """Whether a publish made on this node goes to other nodes (Logical Multicast across
        the mesh: README): ``False`` when no other node is met. ``InvalidArgument`` (nothing
        delivered anywhere yet) if it cannot cross in one frame, as for a send."""
        if not self.peers(connecting=True):
            return False
        if call.wire is None:
            call.wire = to_wire(call.msg)
        wire.check_fits(call.wire[1], call.meta)
        return True

    def publish_to_peers(self, call: MessageCall, stamp: wire.EventStamp) -> None:
        """(The runtime's publish lock held.) Send a publish made here (``topic_fits``), with
        its number ``stamp``, once to every other node met now (one still connecting takes it
        once it is up, as a send), on DATA; each hands it to its own subscribers and relays it
        no further (``zlink.runtime.events``: a subscriber that moves while it is on its way
        takes it once). Per publisher, per subscriber, events keep their order (one DATA
        connection per pair of nodes). A publish never waits (python-api §9): a node whose
        outbox is past ``peer_outbound_submit_bytes`` misses the event
        (``publish_dropped_outbox_full``), as a subscriber whose lane is full does
        (``publish_dropped``); so does one that went away meanwhile
        (``publish_dropped_unreachable``), or takes smaller frames than this event
        (``publish_dropped_too_large``). Any thread."""
        type_name, payload = call.wire or to_wire(call.msg)
        me = self.rt.node_id
        event = _new_send(str(TargetKind.TOPIC), call.target, type_name, payload,
                          call.meta or None, me, me, me, 0, False, None, stamp)  # fmt: skip
        key = _TOPIC_KEY + event.target  # (never a call's target: no call waits under it)
        for peer in self.peers(connecting=True):  # (one still connecting takes it once up)
            frame = self.transport.frame_limit(peer)
            if frame is not None and frame < wire.MAX_FRAME_BYTES:
                try:
                    wire.check_fits(event.payload, event.meta, frame)
                except InvalidArgument:
                    self.rt.metrics.add("publish_dropped_too_large")
                    continue
            try:
                self._check_reachable(peer)
            except Unavailable:
                self.rt.metrics.add("publish_dropped_unreachable")
                continue
            if not self.outbox.put_if_room(peer, event, False, key):
                self.rt.metrics.add("publish_dropped_outbox_full")

    def forward_create(self, call: CreateCall[Any], completion: Completion, at: Location) -> None:
        """``get_or_create`` of a User Spot that another node owns: ask that node."""
        self._check_reachable(at.owner_node)
        corr = self.register_pending(completion, SpotCreateResult, at.owner_node)
        ask = wire.CreateEnvelope(call.object_id or "", call.type_name, self.rt.node_id, corr, 0)
        self.outbox.put(at.owner_node, ask)

    def close_elsewhere(self, ref: SpotRef, hops: int, deadline: float | None = None) -> Completion:
        """``spots.close(ref)`` of a Spot that does not live here (python-api §5): the store
        says where it lives, and that node decides, as for a call. On this node's word alone
        a Spot of another node read as missing (a probe: ``False``, and it served on).
        Answered from the store without a hop: no row, an Actor's, or one whose owner's lease
        lapsed (that incarnation is gone: re-homed, it would be a new one) -> ``False``;
        another generation, or not a User Spot -> ``InvalidOperation``. ``deadline``: the
        seconds it may take (the asker's remaining time, as a request's travels; ``None``: the
        node's request timeout), counted as a call's timeout only here where it was asked
        (``hops`` 0)."""
        done = Completion()
        if hops > MAX_HOPS:
            done.set(None, Unavailable(f"the close of {ref.spot_id!r} was sent on {hops} times"
                                       " (the Spot keeps moving); try again"))  # fmt: skip
            return done
        seconds = self.rt.deadline_of(deadline)
        ends = self.rt.clock.now() + seconds
        self.rt.arm(done, seconds, f"the close of {ref.spot_id!r} was not answered within"
                    f" {seconds:g} s", counted=hops == 0)  # fmt: skip
        asked = self.store_worker.call(self.store.lookup, ref.spot_id)
        asked.add_callback(functools.partial(self._close_located, ref, hops, ends, done))
        return done

    def _close_located(
        self, ref: SpotRef, hops: int, ends: float, done: Completion, found: Location | None,
        error: BaseException | None,
    ) -> None:  # fmt: skip
        """(Infrastructure thread.) The store answered where the Spot ``ref`` names lives."""
        if done.done:  # (its deadline came first)
            return
        me = self.rt.node_id
        try:
            if isinstance(error, ZLinkError):
                raise error
            if error is not None:
                raise Unavailable(f"the Location Store could not say where {ref.spot_id!r} is:"
                                  f" {error!r}")  # fmt: skip
            if (
                found is None or found.kind != str(TargetKind.SPOT) or not found.owner_live
                or (found.owner_node == me and found.owner_incarnation != self.rt.incarnation)
            ):  # fmt: skip
                done.set(False, None)
            elif found.object_generation != ref.object_generation:
                raise InvalidOperation(
                    f"{ref.spot_id!r} is generation {found.object_generation}, not"
                    f" {ref.object_generation}"
                )
            elif self._not_user_spot(found):  # (an Instance Spot not active has a row too)
                raise InvalidOperation(f"{ref.spot_id!r} is not a User Spot; only those are"
                                       " closed")  # fmt: skip
            elif found.owner_node == me:  # here after all (it arrived meanwhile), or not yet
                here = self.rt.closing.close_here(ref)
                if here is None:
                    raise Unavailable(f"{ref.spot_id!r} is not live on node {me} now (arriving,"
                                      " leaving or closing); try again")  # fmt: skip
                done.set(here, None)
            else:
                self._check_reachable(found.owner_node)
                corr = self.register_pending(done, bool, found.owner_node)
                left = max(ends - self.rt.clock.now(), 1e-3)
                ask = wire.CloseEnvelope(ref.spot_id, ref.object_generation, me, corr, hops, left)
                self.outbox.put(found.owner_node, ask)
        except ZLinkError as exc:
            done.set(None, exc)

    def _not_user_spot(self, found: Location) -> bool:
        spec = self.rt.app.spots.get(found.type_name)
        return spec is not None and spec.kind is not SpotKind.USER

    def register_pending(self, completion: Completion, tp: Any, peer: str = "") -> int:
        """Await a reply for ``completion`` under a new correlation id; forgotten once done.
        If ``peer`` goes away first, the call fails with ``Unavailable`` at once."""
        corr = next(self._ids)
        with self._lock:
            self._pending[corr] = (completion, tp, peer, 0, "")
        completion.add_callback(lambda _v, _e: self._forget(corr))
        return corr

    def rebind_pending(self, corr: int, peer: str) -> bool:
        """Await the reply under ``corr`` from ``peer`` from now on ("": from no other node),
        so that the loss of the node it was awaited from no longer fails it (a call a move
        that did not happen serves here after all). ``False`` if it is not awaited."""
        with self._lock:
            entry = self._pending.get(corr)
            if entry is None:
                return False
            self._pending[corr] = (entry[0], entry[1], peer, entry[3], "")
            return True

    def forget_pending(self, corr: int) -> None:
        """Stop awaiting a reply under ``corr``; one that still comes is dropped and counted
        (a queued request that a withdrawn move answers here after all)."""
        self._forget(corr)

    def _forget(self, corr: int) -> None:
        with self._lock:
            self._pending.pop(corr, None)

    def _undeliverable(self, peer: str, env: wire.Envelope, error: ZLinkError) -> None:
        """The outbox could not encode or send ``env``: complete the call it carried, here if
        this node made it, else at the node that did (a relayed call keeps its origin's
        correlation id, which means nothing among this node's own)."""
        self.rt.metrics.add("envelopes_undeliverable")
        if isinstance(env, wire.ReplyEnvelope):
            if isinstance(error, InvalidArgument) and env.error is None:  # too large for it:
                too_large = HandlerError("ReplyTooLarge", f"the reply does not cross: {error}")
                self.reply(peer, env.correlation, error=too_large)  # its caller hears at once
            return  # (else unreachable: the caller's own deadline completes it; counted above)
        if isinstance(env, (wire.SendEnvelope, wire.BatchEnvelope)):  # (at a stop: still in
            reason = (  # the outbox)
                "shutdown" if self.rt.stopping
                else "does_not_cross" if isinstance(error, InvalidArgument)
                else "unreachable"
            )  # fmt: skip
            if isinstance(env, wire.BatchEnvelope):  # each of its messages (a ledger audit
                self.rt.metrics.add(f"sends_dropped_{reason}", len(env.payloads))  # found a
                return  # batch counted only as an envelope undeliverable, no loss)
            publish = env.target_kind == TargetKind.TOPIC  # (counted as a publish's misses)
            self.rt.metrics.add(
                f"publish_dropped_{reason}" if publish else f"sends_dropped_{reason}"
            )
            return
        if isinstance(env, (wire.RelocEnvelope, wire.RelocChunkEnvelope)):  # a move's own
            relocator = self.rt.relocator  # state: the move is withdrawn now, not at its
            if relocator is not None and env.source_node == self.rt.node_id:  # deadline
                relocator.not_sent(env.relocation_id, error)
            return
        corr = getattr(env, "correlation", None)
        origin = getattr(env, "origin_node", self.rt.node_id)
        if corr is None:
            return
        if origin != self.rt.node_id:
            self.reply(origin, corr, error=error)
            return
        with self._lock:
            entry = self._pending.pop(corr, None)
        if entry is not None:
            entry[0].set(None, error)

    # -- peers ----------------------------------------------------------------------------------
    def peer_up(self, peer: str) -> None:
        """``peer`` is reachable (infrastructure thread). Nothing waits on it yet."""
        with self._lock:
            self._down.discard(peer)  # (a new incarnation of a node declared down)

    def writable(self, peer: str) -> None:
        """The transport takes DATA for ``peer`` again (infrastructure thread)."""
        self.outbox.writable(peer)

    def peer_down(self, peer: str) -> None:
        """The connection to ``peer`` dropped: it is suspected, not declared dead (python-api
        §10). The calls awaiting it now wait for the store's verdict (``declared_down``) or
        their deadline; the node's membership asks the store about it at once."""
        self.outbox.peer_down(peer)
        with self._lock:
            self._backlog.pop(peer, None)
            self._paused.discard(peer)
            awaited = {corr for corr, entry in self._pending.items() if _awaits(entry, peer)}
            self._suspected.setdefault(peer, set()).update(awaited)
        # (the halves of this node's fences it was to bring stay: a session outlives its
        # connection, python-api §10; those it never brings are dropped in a request timeout)
        self.rt.metrics.add("peers_suspected")
        held = self.rt.membership_lease
        if held is not None:
            held.suspect(peer)

    def cleared(self, peer: str) -> None:
        """The store says ``peer`` (the incarnation suspected) still holds its lease and it is
        reachable again: its calls go on waiting for their replies or deadlines."""
        with self._lock:
            self._suspected.pop(peer, None)

    def declared_down(self, peer: str) -> None:
        """(Infrastructure thread.) The store declared ``peer`` down: routes, pointers and
        fences through it are dropped; the relocator ends the moves and Joins that wait on
        it (``RelocationPort.peer_declared_down``); then every call still awaiting it since
        its connection dropped (or now, if it never dropped) fails with ``Unavailable`` at
        once. In that order: what a move gives back here is routed by the store, never to
        the dead node, and the calls a move that did not happen serves here after all are
        no longer awaited from it (``rebind_pending``). What the outbox holds for it, and
        the pause of it, go as at a dropped connection (``peer_down``), unless a newer
        incarnation is reachable (they are its then)."""
        if not self.transport.reachable(peer):  # (a frozen peer's connection may still be up:
            self.outbox.peer_down(peer)  # the transport has let it go by now, when it can)
            with self._lock:
                self._backlog.pop(peer, None)
                self._paused.discard(peer)
            self._forget_marks(peer)
            try:  # (Logical Multicast: what was heard from it; never in the way of the rest)
                self.rt.events_node_gone(peer)
            except Exception:  # noqa: BLE001 - the calls awaited from it still fail below
                _log.exception("forgetting the events of node %s failed", peer)
        with self.route_lock:
            for table in (self._routes, self._moved):
                for target in [t for t, r in table.items() if r.node == peer]:
                    del table[target]
            for target in [t for t, via in self._fence_via.items() if via == peer]:
                self.rt.metrics.add("route_fences_lost")
                self._on_fenced(wire.FencedEnvelope(target, None))
        relocator = self.rt.relocator
        if relocator is not None:
            try:
                relocator.peer_declared_down(peer)
            except Exception:  # noqa: BLE001 - the calls awaited from it still fail below
                _log.exception("ending the moves that wait on node %s failed", peer)
        with self._lock:
            if not self.transport.reachable(peer):
                self._down.add(peer)
            awaited = self._suspected.pop(peer, None)
            if awaited is None or self.transport.reachable(peer) is False:
                more = {corr for corr, entry in self._pending.items() if _awaits(entry, peer)}
                awaited = more if awaited is None else awaited | more
            entries = [self._pending.pop(c) for c in awaited
                       if c in self._pending and _awaits(self._pending[c], peer)]  # fmt: skip
        if entries:  # counted first: whoever the failure wakes sees the count
            self.rt.metrics.add("calls_failed_peer_down", len(entries))
        self.rt.metrics.add("peers_declared_down")
        for completion, *_ in entries:
            completion.set(None, Unavailable(f"node {peer!r} is down (its lease lapsed or it"
                                             " left) and will not answer"))  # fmt: skip

    def forget_routes(self) -> None:
        """Self-fencing: every route and forwarding pointer goes (this node owns nothing now;
        where things live is asked of the store again)."""
        with self.route_lock:
            self._routes.clear()
            self._moved.clear()

    # -- the receiving side (infrastructure thread) --------------------------------------------
    def data_lost(self, peer: str, bodies: list[bytes], maybe_arrived: bool = False) -> None:
        """(Infrastructure thread.) DATA for ``peer`` its session ended with: each one-way
        message it carried is counted (a batch's each) as ``sends_dropped_peer_gone`` if it
        was never sent, or as ``data_unacknowledged_peer_gone`` if it was sent and never
        acknowledged (``maybe_arrived``: it may have been handled); the rest (requests,
        whose callers fail with ``Unavailable`` when the peer is declared down, and the
        mesh's own envelopes) as ``frames_dropped_peer_down``."""
        sends = other = 0
        for body in bodies:
            try:
                env = wire.decode(body)
            except wire.WireError:
                other += 1
                continue
            if isinstance(env, wire.SendEnvelope):
                sends += 1
            elif isinstance(env, wire.BatchEnvelope):
                sends += len(env.message_types)
            else:
                other += 1  # (a request relayed here with its origin's reply route: that
                # origin awaits this node and ``peer`` both until ``peer`` took it)
        if sends:
            name = "data_unacknowledged_peer_gone" if maybe_arrived else "sends_dropped_peer_gone"
            self.rt.metrics.add(name, sends)
            _log.warning("node %s: %d one-way messages for node %s were %s with its session",
                         self.rt.node_id, sends, peer,
                         "left unacknowledged" if maybe_arrived else "lost")  # fmt: skip
        if other:
            self.rt.metrics.add("frames_dropped_peer_down", other)

    def received(self, peer: str, channel: Channel, data: bytes) -> None:
        """Bytes from ``peer``: decoded and handled here; bad bytes are counted and, where
        they carry a reply route, answered with a typed error (never raised). A node whose
        lease ran out unnoticed (its process was stopped) fences first (python-api §10)."""
        held = self.rt.membership_lease
        if held is not None:
            held.holds()  # fences now if the lease ran out: calls are then refused
        try:
            env = wire.decode(data)
        except wire.WireError as exc:
            self.rt.metrics.add("bad_envelopes")
            if exc.reply_route is not None:
                origin, corr = exc.reply_route
                self.reply(origin, corr, error=exc)
            return
        kind = type(env)
        if kind in ANNOUNCED:  # (counted as it crosses, however it is handled)
            mark = cast(Announced, env).mark
            if mark:  # (0: not from an outbox, which marks each one it sends)
                self._crossing(peer, mark, arrived=True)
        elif kind is wire.DataAheadEnvelope:
            notice = cast(wire.DataAheadEnvelope, env)
            lifts = self._waits_for(notice)
            fence_for = notice.target if notice.announces is wire.EnvelopeKind.FENCE else None
            self._crossing(peer, notice.mark, False, lifts, None if lifts else fence_for)
            return
        handler = self._handlers.get(kind)
        if handler is None:  # a kind this node has no part for (no mesh relocation)
            self.rt.metrics.add("unhandled_envelopes")
            return
        handler(env)

    def _on_create(self, env: wire.CreateEnvelope) -> None:
        call: CreateCall[Any] = CreateCall(self.rt, TargetKind.SPOT, env.spot_type, env.target,
                                           True)  # fmt: skip
        try:
            done = self.rt.submit_create(call, NO_WAIT)
        except ZLinkError as exc:
            self.reply(env.origin_node, env.correlation, error=exc)
            return
        done.add_callback(
            lambda value, error: self.reply(env.origin_node, env.correlation, value, error)
        )

    def _on_close(self, env: wire.CloseEnvelope) -> None:
        """A node's ``close_elsewhere`` found the Spot here: close it, or, gone from here
        since, ask the store again and send it on."""
        try:
            ref = SpotRef(check_id("spot_id", env.target), env.object_generation, self.rt.mesh,
                          self.rt.node_id)  # fmt: skip
            done = self.rt.closing.close_later(ref, env.hops + 1, env.deadline)
        except ZLinkError as exc:
            self.reply(env.origin_node, env.correlation, error=exc)
            return
        done.add_callback(
            lambda value, error: self.reply(env.origin_node, env.correlation, value, error)
        )
        self._answering(done)  # (a graceful stop waits for it, as for a request it took)

    def redeliver(self, env: Relayable, force: bool = False) -> None:
        """Handle a kept call or fence here again, as if it had just arrived (``force``: past
        this node's own seal, for calls parked at a move that did not happen)."""
        if isinstance(env, wire.FenceEnvelope):
            self._on_fence(env)
        else:
            self._on_call(env, force, again=True)

    def _on_call(self, env: CallEnvelope, force: bool = False, again: bool = False) -> None:
        """A call that arrived (or, ``again``, that this node kept and routes again: that is
        no relay, so it counts no hop; a call kept at every one of many withdrawn moves
        counted one each, and was refused as relayed too often when it next went on)."""
        request = isinstance(env, wire.RequestEnvelope)
        try:
            msg = from_wire(env.message_type, env.payload)
        except Exception as exc:  # noqa: BLE001 - a bad payload fails that request only
            self.rt.metrics.add("bad_wire_payloads")
            self._not_taken(env, InvalidArgument(f"bad payload for {env.message_type}: {exc}"))
            return
        call_cls = RequestCall if request else SendCall
        kind = _TARGET_KINDS[env.target_kind]  # (the envelope's decoder checked the name)
        call: MessageCall = call_cls(self.rt, kind, env.target, msg)
        call.meta = env.meta
        call.origin = env.first_origin
        call.via = env.via
        call.instance, call.instance_type = env.instance, env.instance_type
        call.wire = (env.message_type, env.payload)  # a relay sends it on as it came
        if not request and cast(wire.SendEnvelope, env).event is not None:  # a Logical
            call.event = cast(wire.SendEnvelope, env).event  # Multicast event's number
        if isinstance(env, wire.RequestEnvelope):
            call.deadline = env.deadline
            call.reply_route = (env.origin_node, env.correlation)  # kept if relayed on
        peer = env.via
        room = Admitted(peer=peer)  # a full lane: it waits, bounded by the peer's backlog
        reply = Completion() if request else None
        # a one-way message with no option, not kept for a move: the runtime's fast path may
        # take it (a ready target here with a plain handler); anything else routes as usual
        plain = not request and env.meta is None and not env.instance and not force
        done: Completion | None
        try:
            hops = max(env.hops, 1) if again else env.hops + 1
            done = self.rt.submit(call, reply, NO_WAIT, hops=hops, force=force, plain=plain,
                                  room=room)  # fmt: skip
        except ZLinkError as exc:
            self._not_taken(env, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a fault of the intake itself, not a refusal
            self.rt.metrics.add("call_intake_errors")
            _log.error("node %s could not take a call for %r", self.rt.node_id, env.target,
                       exc_info=exc)  # fmt: skip
            fault = _IntakeError(f"node {self.rt.node_id} could not take the call: {exc!r}")
            if room.abandon(fault):  # nothing was queued: its caller may safely try again
                self._not_taken(env, fault)
                return
            done = reply  # queued before the fault: it runs, and its outcome stands
        if isinstance(env, wire.RequestEnvelope):
            if env.origin_node != env.via:  # relayed on with its origin's reply route: this
                # node took it, and its origin awaits the reply from here only now
                back = (env.origin_node, env.correlation)
                self._tell_relayed(back, self.rt.node_id, env.hops, None)
            if done is not None:
                origin, corr = env.origin_node, env.correlation
                done.add_callback(
                    lambda value, error: self._answer_peer(origin, corr, value, error)
                )
                self._answering(done)
            self._follow(peer, room, None)  # (its reply carries a failure back)
        elif not room.done or room.error is not None:  # (else admitted: nothing to follow)
            send = env
            self._follow(peer, room, lambda error: self._dropped(send, error))

    def _answer_peer(self, origin: str, corr: int, value: Any, error: BaseException | None) -> None:
        """A request taken from a peer ended here: its reply goes to its origin, unless it
        was relayed on with its reply route (``_post_call``: answered from there)."""
        if value is not RELAYED_ON:
            self.reply(origin, corr, value, error)

    def _answering(self, done: Completion) -> None:
        """A request taken from a peer: unanswered until ``done`` (a graceful stop waits for
        it, ``wait_answered``; its reply is posted before it counts as answered)."""
        with self._answered:
            self._unanswered += 1
        done.add_callback(self._one_answered)

    def _one_answered(self, _value: object, _error: BaseException | None) -> None:
        with self._answered:
            self._unanswered -= 1
            if not self._unanswered:
                self._answered.notify_all()

    def wait_answered(self, seconds: float) -> bool:
        """(A graceful stop.) Wait, ``seconds`` at most, until every request taken from a
        peer is answered (run here, or relayed and its reply come back): a drained node that
        relays failed them as it stopped, though they ran on the room's new node, and a
        caller that tries again on ``Unavailable`` runs such a request twice. ``True`` if
        there were some and all are answered."""
        with self._answered:
            if not self._unanswered:
                return False
            return self._answered.wait_for(lambda: not self._unanswered, max(0.0, seconds))

    def _not_taken(self, env: CallEnvelope, error: ZLinkError) -> None:
        """A call from another node this node did not take: a request hears ``error``, a
        one-way message is counted as dropped at both ends."""
        if isinstance(env, wire.RequestEnvelope):
            self.reply(env.origin_node, env.correlation, error=error)
        else:
            self._dropped(env, error)

    def _on_batch(self, env: wire.BatchEnvelope) -> None:
        """A batch for a target here: admitted all or none (waiting for room as a call from
        a peer does); for a target elsewhere, or not ready here, its messages go on one by
        one, each as a send that arrived (relayed, parked or refused as such)."""
        try:
            msgs = [from_wire(t, p) for t, p in zip(env.message_types, env.payloads, strict=True)]
        except Exception:  # noqa: BLE001 - a bad payload drops the batch, counted at both ends
            self.rt.metrics.add("bad_wire_payloads")
            self._count_drops(env.target, env.message_types, env.first_origin, "bad_payload")
            return
        kind = _TARGET_KINDS[env.target_kind]
        act = (self.rt.actors if kind == TargetKind.ACTOR else self.rt.spots).get(env.target)
        if act is None or act.state is not READY:
            for message_type, payload in zip(env.message_types, env.payloads, strict=True):
                self._on_call(wire.SendEnvelope(
                    env.target_kind, env.target, message_type, payload, None, env.origin_node,
                    env.first_origin, env.via, env.hops, False, None, None,
                ))  # fmt: skip
            return
        peer = env.via
        room = Admitted(peer=peer)
        call = BatchSendCall(self.rt, kind, env.target, msgs)
        call.origin = env.first_origin  # a discard after admission is told there (§9)
        try:
            self.rt.submit_many(call, room)
        except ZLinkError as exc:
            self._batch_dropped(env, exc)
            return
        self._follow(peer, room, lambda error: self._batch_dropped(env, error))

    def _follow(
        self, peer: str, room: Admitted, dropped: Callable[[BaseException], None] | None
    ) -> None:
        """After a call from ``peer`` was submitted: while it waits for room it is one item of
        that peer's backlog; if it fails (now or later), ``dropped`` counts it."""
        waiting = not room.done
        if waiting:
            self._backlog_add(peer, 1)

        def done(_value: Any, error: BaseException | None) -> None:
            if error is not None and dropped is not None:
                dropped(error)
            if waiting:
                self._backlog_release(peer)

        room.add_callback(done)

    def _batch_dropped(self, env: wire.BatchEnvelope, error: BaseException) -> None:
        self._count_drops(env.target, env.message_types, env.first_origin, _drop_reason(error))

    def _count_drops(self, target: str, message_types: Iterable[str], origin: str | None,
                     reason: str) -> None:  # fmt: skip
        """A batch's messages dropped: counted here and told to ``origin`` in one notice per
        message type (a batch of 100 is not 100 notices)."""
        for message_type, count in Counter(message_types).items():
            self._count_drop(target, message_type, origin, reason, count)

    def _backlog_add(self, peer: str, n: int) -> None:
        with self._lock:  # the transport is told under it: a pause and a resume never cross
            count = self._backlog[peer] = self._backlog.get(peer, 0) + n
            pause = count >= self.backlog_limit and peer not in self._paused
            if pause:  # stop taking DATA from it; replies still flow (§9, seed §16)
                took = self._takes_data(peer)
                self._paused.add(peer)
                self._tell_transport(peer, took)
        if pause:
            self.rt.metrics.add("peers_paused")

    def _backlog_release(self, peer: str) -> None:
        """One call of ``peer``'s backlog is done waiting: resume it at half the limit."""
        with self._lock:
            count = self._backlog.get(peer, 0) - 1
            if count > 0:
                self._backlog[peer] = count
            else:
                self._backlog.pop(peer, None)
            if peer in self._paused and count <= self.backlog_limit // 2:
                took = self._takes_data(peer)
                self._paused.discard(peer)
                self._tell_transport(peer, took)

    def _takes_data(self, peer: str) -> bool:
        """(Under ``_lock``.) Whether the transport takes ``peer``'s DATA now: it is not
        paused, or a fence or move's envelope this node waits for comes behind it
        (``_crossing``)."""
        return peer not in self._paused or peer in self._lifting

    def _tell_transport(self, peer: str, took: bool) -> bool:
        """(Under ``_lock``: a pause and a resume never cross.) Pause or resume ``peer`` at
        the transport if whether it takes its DATA changed from ``took``; ``True`` if a
        pause was lifted."""
        takes = self._takes_data(peer)
        if takes == took:
            return False
        if takes:
            self.transport.resume(self.rt.node_id, peer)
        else:
            self.transport.pause(self.rt.node_id, peer)
        return takes

    def _waits_for(self, notice: wire.DataAheadEnvelope) -> bool:
        """Whether this node may wait for what ``notice`` announces: a move's envelope (this
        node is its target), or a fence of its own (its switch, or an arrival here, waits for
        it) or for a Spot arriving here (whose opening may wait for it: this node's own fence
        for it may be kept behind it)."""
        if notice.announces is not wire.EnvelopeKind.FENCE:
            return True
        if notice.first_origin == self.rt.node_id:
            return True
        relocator = self.rt.relocator
        return relocator is not None and relocator.arriving(notice.target)

    def _crossing(self, peer: str, mark: int, arrived: bool, lifts: bool = False,
                  fence_for: str | None = None) -> None:  # fmt: skip
        """A route fence or a move's envelope is on its way here on ``peer``'s DATA (its
        notice came, on COMPLETION), or came (``arrived``); ``mark`` pairs the two, in
        either order. Those are infrastructure traffic (python-api §9): if this node waits
        for it (``lifts``, ``_waits_for``), a pause of ``peer`` is lifted from the notice
        until it is in, and holds again after.

        Before, a node kept the peer its own fence came back through paused over calls that
        waited for the very Spot that fence kept from opening (an arrival opens once its
        node's fences are back): nothing moved until the fence's deadline
        (``route_fences_lost``), and a sender's order could break then (4 of 53 stress runs);
        and so did one whose own fence was kept, at another node, behind that node's fence
        for the same Spot, which the pause held. A move to a node that had paused its
        source waited for the pause to end, or ran out its deadline. Bounded: what the peer
        queued for this node before it (``zlink.mesh.outbox``) and the transport's window,
        per envelope this node waits for. A half whose other half does not come within a
        request timeout (lost with its connection's session) is dropped
        (``ahead_notices_expired``), so a lifted pause holds again. The notice of a fence this
        node does not wait for yet keeps its target (``fence_for``): a Spot that starts
        arriving here later waits for it too (``_arriving_now``)."""
        with self._lock:
            took = self._takes_data(peer)
            marks = self._marks.setdefault(peer, {})
            first = marks.pop(mark, None)
            if first is not None and first.lifts:
                self._lift(peer, -1)
            if first is not None and first.arrived != arrived:  # its other half: done
                new = None
            else:  # the first half (or, impossibly, the same half again: the later counts)
                new = marks[mark] = _Mark(peer, mark, arrived, lifts and not arrived,
                                          None if arrived else fence_for)  # fmt: skip
                if new.lifts:
                    self._lift(peer, 1)
            if not marks:
                del self._marks[peer]
            lifted = self._tell_transport(peer, took)
        if first is not None and first.stale is not None:
            first.stale.cancel()
        if lifted:
            self.rt.metrics.add("pauses_lifted_for_infrastructure")
        if new is not None:  # dropped if its other half does not come
            timer: DeadlineHandle | None = self.rt.infra.call_later(
                self.rt.request_timeout, self._mark_stale, new
            )
            with self._lock:  # (crossings come on this thread only; a peer's end may not)
                if self._marks.get(peer, {}).get(mark) is new:
                    new.stale, timer = timer, None
            if timer is not None:
                timer.cancel()

    def _arriving_now(self, target: str) -> None:
        """(``route_lock`` held.) ``target`` starts arriving here: the notices of fences for
        it that came before, when this node did not wait for them, lift their peer's pause
        now (``_crossing``). Notices travel on COMPLETION and outrun DATA: a paused source
        sends a move's payload and then a fence of another node parked for the move, and the
        fence's notice can come before the payload. This node's own fence for the Spot may
        be kept behind that fence (where its origin switches), and the arrival opens only
        once its own fences are back (execution-model §6)."""
        lifted = 0
        with self._lock:
            for peer, marks in self._marks.items():
                took = self._takes_data(peer)
                for half in marks.values():
                    if half.fence_for == target:
                        half.fence_for, half.lifts = None, True
                        self._lift(peer, 1)
                lifted += self._tell_transport(peer, took)
        if lifted:
            self.rt.metrics.add("pauses_lifted_for_infrastructure", lifted)

    def _lift(self, peer: str, step: int) -> None:
        """(Under ``_lock``.) One more (or one fewer) notice that lifts ``peer``'s pause."""
        left = self._lifting.get(peer, 0) + step
        if left > 0:
            self._lifting[peer] = left
        else:
            self._lifting.pop(peer, None)

    def _mark_stale(self, half: _Mark) -> None:
        """(Infrastructure thread.) See ``_crossing``: ``half``'s other half did not
        come within a request timeout."""
        peer = half.peer
        with self._lock:
            marks = self._marks.get(peer)
            if marks is None or marks.get(half.mark) is not half:
                return
            took = self._takes_data(peer)
            del marks[half.mark]
            if not marks:
                del self._marks[peer]
            if half.lifts:
                self._lift(peer, -1)
            self._tell_transport(peer, took)
        self.rt.metrics.add("ahead_notices_expired")

    def _forget_marks(self, peer: str) -> None:
        """``peer`` is down for good: the halves of what it was to bring go with it."""
        with self._lock:
            marks = self._marks.pop(peer, None)
            self._lifting.pop(peer, None)
        for half in (marks or {}).values():
            if half.stale is not None:
                half.stale.cancel()

    def paused_peers(self) -> list[str]:
        """The peers whose application DATA this node does not take now (status)."""
        with self._lock:
            return sorted(self._paused)

    def backlog(self) -> dict[str, int]:
        """Calls from each peer waiting for room on this node (status)."""
        with self._lock:
            return dict(self._backlog)

    def _dropped(self, env: wire.SendEnvelope, error: BaseException) -> None:
        """A one-way message from another node that will not be handled: counted here, and
        at its first origin (python-api §9: at both ends, with its reason)."""
        self._count_drop(env.target, env.message_type, env.first_origin, _drop_reason(error))

    def count_dropped(self, call: MessageCall, error: BaseException) -> None:
        """A one-way ``call`` this node accepted (or took from another) cannot be delivered:
        counted here and at its first origin, with the reason ``error`` gives (python-api §9:
        at both ends, never in silence)."""
        self._count_drop(call.target, call.msg.zlink_type_name, call.origin, _drop_reason(error))

    def tell_dropped(self, origin: str, target: str, message_type: str,
                    error: BaseException, count: int = 1) -> None:  # fmt: skip
        """``count`` one-way messages admitted on ``origin`` (from there, or carried here by
        a move) that this node took were dropped and counted here (a stop, a close or a
        fence discarded them unrun): ``origin`` counts them too
        (``remote_sends_dropped_<reason>``; python-api §9: at both ends)."""
        if origin == self.rt.node_id:
            return
        notice = wire.DroppedEnvelope(target, message_type, _drop_reason(error), count)
        with contextlib.suppress(Unavailable):  # the origin is gone: counted here
            self.post(origin, notice)

    def _count_drop(self, target: str, message_type: str, origin: str | None,
                    reason: str, count: int = 1) -> None:  # fmt: skip
        """Count dropped one-way messages here and, if they came from another node, there."""
        self.rt.metrics.add(f"sends_dropped_{reason}", count)
        if origin is None or origin == self.rt.node_id:
            return
        notice = wire.DroppedEnvelope(target, message_type, reason, count)
        with contextlib.suppress(Unavailable):  # the origin is gone: counted here
            self.post(origin, notice)

    def _on_dropped(self, env: wire.DroppedEnvelope) -> None:
        """Another node could not deliver one-way messages sent from here: counted (a count
        below 1 would take from the counter: a bad envelope)."""
        if env.count < 1:
            self.rt.metrics.add("bad_envelopes")
            return
        self.rt.metrics.add(f"remote_sends_dropped_{env.reason}", env.count)
        _log.debug("%d send(s) to %r (%s) dropped: %s", env.count, env.target,
                   env.message_type, env.reason)  # fmt: skip

    def reply(
        self, origin: str, correlation: int, value: Any = None, error: BaseException | None = None
    ) -> None:
        """Answer the call ``origin`` awaits under ``correlation`` (any thread). A value that
        does not serialize is a reply-encoding failure: the caller gets ``HandlerError``. A
        copy let go unrun (``AnsweredElsewhere``) is not answered from here."""
        if error is None:
            try:
                text = to_json(value).decode()
                if origin != self.rt.node_id:  # too large for a frame: as if it did not encode
                    wire.check_fits(text, None, self.transport.frame_limit(origin))
                out = wire.ReplyEnvelope(correlation, text, None)
            except Exception as exc:  # noqa: BLE001 - the caller gets it, typed, at once
                self.rt.metrics.add("reply_encoding_failures")
                cause: BaseException = (
                    HandlerError(type(exc).__qualname__, f"the reply does not cross: {exc}")
                    if isinstance(exc, ZLinkError)
                    else exc
                )  # (a handler's reply that cannot cross is its failure, not the caller's)
                out = wire.ReplyEnvelope(correlation, None, encode_error(cause))
        elif isinstance(error, AnsweredElsewhere):
            return
        else:
            out = wire.ReplyEnvelope(correlation, None, encode_error(error))
        if origin == self.rt.node_id:  # answered here: completed on this infrastructure thread
            self.rt.infra.submit(self._on_reply, out)
            return
        try:
            self.post(origin, out)
        except Unavailable:
            self.rt.metrics.add("replies_undeliverable")

    def _on_reply(self, env: wire.ReplyEnvelope) -> None:
        with self._lock:
            entry = self._pending.pop(env.correlation, None)
        if entry is None:  # timed out (or never ours): a reply never completes a call twice
            self.rt.metrics.add("late_replies")
            return
        completion, tp = entry[0], entry[1]
        if env.error is not None:
            completion.set(None, decode_error(env.error))
            return
        assert env.value is not None
        try:
            value = reply_from_json(tp, env.value)
        except Exception as exc:  # noqa: BLE001 - the caller gets a typed error instead
            completion.set(None, InvalidArgument(f"reply does not decode as {tp!r}: {exc}"))
            return
        if not completion.set(value, None):
            self.rt.metrics.add("late_replies")


def _awaits(entry: tuple[Completion, Any, str, int, str], peer: str) -> bool:
    """Whether the loss of ``peer`` fails a pending call: the node its reply comes from, or
    the node that relayed it there until that one took it (``MeshRouter.relayed_on``)."""
    return entry[2] == peer or entry[4] == peer


class _RelayedOn:
    """What a relayed request's completion on the relaying node is set to once it went on
    with its reply route: its reply comes from elsewhere (``MeshRouter._post_call``)."""

    def __repr__(self) -> str:
        return "RELAYED_ON"


RELAYED_ON: Final = _RelayedOn()


class _NotYours(Unavailable):
    """A target the store gives an earlier incarnation of this node (not re-homed before that
    lease ends): the caller may try again then."""


class _IntakeError(Unavailable):
    """A call a node failed to take for a fault of its own (counted ``call_intake_errors``);
    its caller sees ``Unavailable``, only when nothing of the call was queued (so trying again
    cannot run it twice)."""


@dataclass(eq=False, slots=True)
class _Mark:
    """The half of a route fence or a move's envelope coming from ``peer`` that came first
    (``MeshRouter._crossing``): the envelope itself (``arrived``: DATA may outrun
    COMPLETION), or its notice (``lifts``: a pause of ``peer`` is lifted until it is in)."""

    peer: str
    mark: int
    arrived: bool
    lifts: bool
    fence_for: str | None = None  # a notice of a fence that lifts nothing: for which target
    stale: DeadlineHandle | None = None  # when it is dropped, if its other half never comes


def _drop_reason(error: BaseException) -> str:
    """The counter suffix for why a one-way message was dropped."""
    if isinstance(error, _IntakeError):
        return "intake_error"
    if isinstance(error, NotFound):
        return "not_found"
    if isinstance(error, ResourceExhausted):
        return "lane_full"
    if isinstance(error, InvalidArgument):
        return "bad_payload"
    if isinstance(error, Unavailable):
        return "unavailable"
    return "refused"


class Route(NamedTuple):
    """Where a node sends a remote target: a node, at an (object, authority) generation;
    ``kind``: what the store says lives under the id (``None``: a relaying node's hint)."""

    node: str
    generation: tuple[int, int]
    kind: str | None = None

    @staticmethod
    def at(location: Location) -> Route:
        """The route to where the Location Store says the target is."""
        generation = (location.object_generation, location.authority_generation)
        return Route(location.owner_node, generation, location.kind)


__all__ = ["MAX_HOPS", "MAX_POINTERS", "MAX_ROUTES", "MeshRouter", "Route"]


def _check_kind(call: MessageCall | BatchSendCall, route: Route) -> None:
    """``NotFound`` for a call whose target id the store holds for the other kind (a Spot's
    id called as an Actor's, or the reverse): Spots and Actors share the store's one id space,
    and a call names the kind it means (python-api §5). Nothing is sent. (A call that meets
    this node's path for the other kind asks the store first, ``_ask_kind``: the id may have
    changed kind; the path stays unless it did.)"""
    if route.kind is not None and route.kind != call.kind:
        raise NotFound(f"no {call.kind} {call.target!r}")


def _previous_owner(found: object) -> str | None:
    """The node that owned what a re-homing reservation took over (its lease had lapsed)."""
    previous = found.previous if isinstance(found, Reservation) else None
    return None if previous is None else previous.owner_node


def payload_size(env: Relayable) -> int:
    """What a kept envelope counts against a lane's byte limit: its payload's bytes as they
    travel (UTF-8; its length where it is ASCII, a flag); a fence: 0."""
    if isinstance(env, wire.FenceEnvelope):
        return 0
    text = env.payload
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
