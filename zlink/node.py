"""``Node``: one ZLink node in this process; wires the engine and the object model.

Threads: ``workers`` application threads (one per core by default, never one per Spot, §10),
one infrastructure thread (deadlines, completions, envelopes, shutdown, §1 and §13), and in a
mesh two store threads (Location Store calls: placement and relocation; the lease).

Lock order: ``_state_lock`` is a leaf (it guards the node's state word only); the runtime's
locks are taken in ``zlink.lock_order``'s order by the parts that own them.
"""

from __future__ import annotations

import datetime
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import psutil

from .addresses import is_loopback
from .app import App
from .config import NodeConfig
from .durations import check_seconds, check_timeout
from .errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    Unavailable,
    ZLinkError,
)
from .executor import (
    Clock,
    DaemonPool,
    InfraExecutor,
    MonotonicClock,
    WorkerPool,
)
from .mesh import wire
from .mesh.client_server import ClientServer, ClientSettings
from .mesh.keys import MeshKeys
from .mesh.location import LocationStore, NodeRecord
from .mesh.membership import NodeMembership
from .mesh.store_worker import StoreWorker
from .mesh.stores import open_store
from .mesh.transport import Transport
from .mesh.zmq_transport import ZmqTransport
from .messaging.calls import check_id, outside_only
from .messaging.completion import Admitted, Completion, expire
from .messaging.context import Client
from .relocation.relocator import Relocator
from .relocation.remote_join import RemoteJoin
from .runtime.acts import CLOSING, GONE
from .runtime.routing import MeshRouter
from .runtime.runtime import Runtime
from .runtime.type_stats import LATENCY_BOUNDS, SAMPLE_EVERY
from .status import NodeStatus, StatusPublisher, StatusSubscription

_log = logging.getLogger("zlink.node")

MOVES_AT_STOP: Final = 2.0
"""Seconds a stop waits at most for the moves past their point of no return (a commit the
store is asked for, an arrival restored and waiting for its commit): a commit takes a store
write; an arrival whose source went silent would hold the stop for good (a review measured
9 s a stop in tests where the source had died)."""


# what a move or a drain called from a handler would wait for: barriers its turn holds up
_MOVE_HINT = (
    "a move waits for barriers a running turn holds up (a Spot moving itself never reaches its own)"
)


class _MeshEvents:
    """What a mesh node does when its membership changes (python-api §10 "Failure"): the
    glue between ``NodeMembership`` and the runtime, router and transport."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._was_draining = False

    def members(self, records: list[NodeRecord]) -> None:
        """The store's members, for the transport to connect to (any thread)."""
        transport = self._node._transport
        if transport is not None:
            transport.learn([(r.node_id, r.incarnation, r.endpoint) for r in records])

    def fenced(self, why: str) -> None:
        """Stop serving: refuse what comes, drop every activation, forget every route."""
        rt = self._node._rt
        if not rt.fenced:  # (fenced again before it served: what it did before stays)
            self._was_draining = rt.draining
        rt.fenced = True
        rt.draining = True  # (the send fast path reads only this flag: it refuses too)
        if rt.router is not None:
            rt.router.forget_routes()
        if rt.relocator is not None:
            rt.relocator.fenced()
        dropped = rt.drop_all(why)
        if dropped:  # (none dropped is no warning: an audit found "dropped 0" at WARNING)
            _log.warning("node %s dropped %d activations", self._node.node_id, dropped)

    def rejoined(self, incarnation: int, records: list[NodeRecord]) -> None:
        """Registered again: the transport meets the members as the new incarnation; then
        the node serves again."""
        node = self._node
        rt = node._rt
        membership = node._membership
        epoch = None if membership is None else membership.epoch

        def serve() -> None:  # (infrastructure thread) only if it did not fence again since
            if membership is not None and (membership.fenced or membership.epoch != epoch):
                return
            rt.fenced = False
            rt.draining = self._was_draining

        if node._transport is None:
            serve()
            return
        members = [(r.node_id, r.incarnation, r.endpoint) for r in records]
        node._transport.reincarnate(node.node_id, incarnation, members, serve)

    def superseded(self, why: str) -> None:
        """Another process took this node's id: it stays fenced, and says so (``superseded``,
        ``not_serving()``, ``/health``); ``zlink run`` then stops and exits non-zero."""
        self._node._superseded_why = why
        self._node.superseded.set()

    def peer_down(self, node_id: str, incarnation: int | None) -> None:
        router = self._node._rt.router
        if router is None:
            return
        ended = getattr(router.transport, "declared_down", None)  # (optional: Transport)
        if ended is not None:  # first: nothing more is taken for it, its session ends
            ended(node_id, incarnation)
        router.declared_down(node_id)

    def said_goodbye(self, node_id: str, incarnation: int | None) -> bool:
        router = self._node._rt.router
        said = None if router is None else getattr(router.transport, "said_goodbye", None)
        return said is not None and bool(said(node_id, incarnation))  # (optional: Transport)

    def still_member(self, node_id: str) -> bool:
        router = self._node._rt.router
        if router is None or not router.transport.reachable(node_id):
            return False
        router.cleared(node_id)
        return True


@dataclass(frozen=True)
class DrainResult:
    """What ``Node.drain()`` did: the Spots moved away, and those that stayed, with why."""

    moved: list[str]
    stayed: dict[str, str]


def default_workers() -> int:
    """One application worker per CPU core (psutil; at least one)."""
    return psutil.cpu_count(logical=True) or 1


class Node:
    """A ZLink node: ``start()``, ``client()``, ``shutdown()``; or use it as a context manager."""

    def __init__(
        self,
        app: App,
        config: NodeConfig | None = None,
        *,
        clock: Clock | None = None,
        store: LocationStore | None = None,
        transport: Transport | None = None,
    ) -> None:
        """``store`` and ``transport`` (both, or neither) make this node part of a mesh."""
        if not isinstance(app, App):
            raise InvalidOperation(f"Node takes a zlink.App, got {type(app).__name__}")
        self.app = app
        if config is not None and not isinstance(config, NodeConfig):
            raise InvalidArgument(f"Node takes a zlink.NodeConfig, got {type(config).__name__}")
        self.config = config or NodeConfig()
        self.clock: Clock = clock or MonotonicClock()
        self._state = "new"
        self._state_lock = threading.Lock()
        self._start_abandoned = threading.Event()  # (``abandon_start``)
        # set when another process registered this node's id again: this one serves nothing
        # for good (python-api §10 "Failure"; ``not_serving`` says why)
        self.superseded = threading.Event()
        self._draining = False  # drain() began: not serving (``not_serving``)
        self._superseded_why = ""
        workers = self.config.workers or default_workers()
        self._pool = WorkerPool(workers, f"zlink-{self.config.node_id}")
        self._infra = InfraExecutor(
            self.clock, f"zlink-infra-{self.config.node_id}", self._infra_failed
        )
        self._rt = Runtime(
            app,
            node_id=self.config.node_id,
            mesh=self.config.mesh,
            limits=self.config.lane_limits(),
            budget=self.config.owner_time_budget,
            request_timeout=self.config.request_timeout,
            admission_timeout=self.config.admission_timeout,
            closing_timeout=self.config.closing_timeout,
            idle_timeout=self.config.idle_timeout,
            clock=self.clock,
            pool=self._pool,
            infra=self._infra,
            io_pool=DaemonPool(self.config.io_workers, f"zlink-io-{self.config.node_id}"),
            cpu_pool=DaemonPool(
                self.config.cpu_workers or default_workers(), f"zlink-cpu-{self.config.node_id}"
            ),
            worker_limit=self.config.worker_calls_in_flight,
        )
        if (store is None) != (transport is None):
            raise InvalidArgument("a mesh node needs both a LocationStore and a Transport")
        self._owned_store: Any = None  # a store this node opened, closed at its shutdown
        self._owned_transport: ZmqTransport | None = None  # (also if it never started)
        if store is None and transport is None and self.config.listen is not None:
            keys = None if self.config.keys is None else MeshKeys.load(self.config.keys)
            store = self._owned_store = open_store(self.config.store)
            try:
                transport = self._owned_transport = ZmqTransport(
                    self.config.listen, mesh=self.config.mesh,
                    data_limit=self.config.data_frames_in_flight,
                    data_bytes=self.config.data_bytes_in_flight,
                    max_frame_bytes=self.config.max_frame_bytes, count=self._rt.metrics.add,
                    keys=keys, advertise=self.config.advertise,
                )  # fmt: skip
            except BaseException:  # (a port in use: the store it opened is closed first)
                close = getattr(store, "close", None)
                if close is not None:
                    close()
                raise
            if keys is None and not is_loopback(self.config.listen):
                _log.warning(
                    "node %s listens on %s WITHOUT encryption or authentication (insecure=True):"
                    " anyone who can reach it can send to every Spot", self.node_id,
                    self.config.listen,
                )  # fmt: skip
        elif self.config.store != "memory" and store is None:
            raise InvalidArgument("a Location Store URL needs listen= (a mesh of processes)")
        elif store is None:  # a node of this process alone: what configures a mesh of
            meshy = [  # processes would be ignored (an operator's probe), so it is refused
                name for name, given in (
                    ("keys= (--keys)", self.config.keys is not None),
                    ("lease_seconds= (--lease)",
                     "lease_seconds" in self.config.model_fields_set),
                    ("mesh= (--mesh)", self.config.mesh != "main"),
                ) if given
            ]  # fmt: skip
            if meshy:
                one = len(meshy) == 1
                raise InvalidArgument(
                    f"{' and '.join(meshy)} configure{'s' if one else ''} a node of a mesh of "
                    f"processes: {'it needs' if one else 'they need'} listen= (zlink run "
                    "--listen, or --nodes)"
                )
        self._transport = transport
        self._relocator: Relocator | None = None
        self._membership: NodeMembership | None = None
        self._lease_worker: InfraExecutor | None = None
        if store is not None and transport is not None:
            worker = StoreWorker(f"zlink-store-{self.node_id}", self._infra.submit)
            # the lease has a thread of its own: a renewal never waits behind placement
            # questions to a slow store, nor behind a long infrastructure task (either would
            # fence a node whose lease still holds)
            self._lease_worker = InfraExecutor(
                self.clock, name=f"zlink-lease-{self.node_id}", on_error=self._lease_failed
            )
            self._membership = NodeMembership(
                self.node_id, f"inproc://{self.node_id}", store, self._lease_worker,
                self._infra, self.clock, self.config.lease_seconds, self._rt.metrics.add,
                _MeshEvents(self), self.config.mesh,
            )  # fmt: skip
            self._rt.membership_lease = self._membership
            router = self._rt.router = MeshRouter(
                self._rt, store, transport, worker,
                backlog_limit=self.config.peer_backlog_items,
                outbound_limit=self.config.peer_outbound_bytes,
                outbound_submit_limit=self.config.peer_outbound_submit_bytes,
            )  # fmt: skip
            relocator = self._relocator = Relocator(
                self._rt, router, self.config.relocation_payload_chunk_limit_bytes
            )
            remote_join = RemoteJoin(self._rt, router, relocator)
            self._rt.relocator, self._rt.remote_join = relocator, remote_join
            for kind, handler in (
                (wire.RelocChunkEnvelope, relocator.on_chunk),
                (wire.RelocEnvelope, relocator.on_relocate),
                (wire.RelocDoneEnvelope, relocator.on_restored),
                (wire.RelocCommitEnvelope, relocator.on_commit),
                (wire.RelocOpenedEnvelope, relocator.on_opened),
                (wire.RelocAbortEnvelope, relocator.on_abort),
                (wire.JoinAskEnvelope, remote_join.on_ask),
            ):
                router.handle(kind, handler)
        self._client = Client(self._rt)
        self._client_server: ClientServer | None = None
        if isinstance(transport, ZmqTransport):  # zlink.connect clients (python-api §10)
            c = self.config
            settings = ClientSettings(
                c.node_id, c.mesh, c.client_window_items, c.client_window_bytes,
                c.client_calls_in_flight, c.admission_timeout, c.request_timeout,
                c.max_frame_bytes,
            )  # fmt: skip
            membership = self._membership
            self._client_server = ClientServer(
                self._rt, transport, self._infra.submit, self._rt.metrics.add, settings,
                None if membership is None else membership.holds,
            )  # fmt: skip
            transport.serve_clients(self._client_server)
        self._publisher: StatusPublisher | None = None  # made by the first subscription
        self._started = ""  # ISO 8601, set by start()

    @property
    def incarnation(self) -> int:
        """This node's incarnation in its mesh's store (new at every start and after it fenced
        itself); ``0`` outside a mesh or before ``start()``."""
        return 0 if self._membership is None else self._membership.incarnation

    def _infra_failed(self, exc: BaseException) -> None:
        """A failure the infrastructure thread survived (python-api §9): counted once."""
        self._rt.metrics.add("infra_task_errors")

    def _lease_failed(self, exc: BaseException) -> None:
        """A failure the lease thread survived: counted once."""
        self._rt.metrics.add("lease_task_errors")

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self.config.node_id

    @property
    def workers(self) -> int:
        """How many application worker threads this node runs."""
        return self._pool.size

    def start(self) -> Node:
        """Validate the app, start the threads and the Entry Spots. Blocks until ready.

        Registration errors surface here as ``InvalidOperation``, before any work is accepted.
        """
        with self._state_lock:
            if self._state != "new":
                raise InvalidOperation(f"node {self.node_id} was already started")
            self.app.validate()
            self._state = "starting"
        try:
            self._start()
        except BaseException:  # what it began stops before the caller hears why (a probe:
            try:  # threads ran on, "starting" for good, and the node stayed in the store)
                self.shutdown(timeout=min(self.config.shutdown_timeout, 10.0))
            except Exception:  # noqa: BLE001 - the start's own error is the one to raise
                _log.exception("node %s: stopping after a failed start failed", self.node_id)
            raise
        self._state = "running"
        self._started = datetime.datetime.now(datetime.UTC).isoformat()
        _log.info("node %s started with %d workers", self.node_id, self._pool.size)
        return self

    def _start(self) -> None:
        """``start``'s body: the threads, the store's registration, the transport, the
        Entry Spots (any of which may fail: ``start`` then stops what began)."""
        self._infra.start()
        self._pool.start()
        incarnation = 0
        if self._membership is not None:  # a new incarnation, and a lease renewed from now on
            assert self._rt.router is not None and self._transport is not None
            self._rt.router.store_worker.start()
            assert self._lease_worker is not None
            self._lease_worker.start()
            endpoint = self._transport.endpoint(self.node_id)
            incarnation = self._membership.register(endpoint).incarnation
        if isinstance(self._transport, ZmqTransport) and self._rt.router is not None:
            # its sockets are polled by the infrastructure thread: a frame in, and a frame
            # out, cross no thread of their own (fewer hand-offs per round trip)
            self._transport.attach(self.node_id, self._rt.router, self._infra.submit,
                                   incarnation, host=self._infra)  # fmt: skip
        elif self._transport is not None and self._rt.router is not None:
            self._transport.attach(self.node_id, self._rt.router, self._infra.submit, incarnation)
        if self._membership is not None:
            self._membership.announce()
            if self.config.store_retention is not None:
                self._infra.call_later(self._prune_every(), self._prune_due)
        for name, activated in self._rt.start():
            self._await_entry(name, activated)

    def _await_entry(self, name: str, activated: Completion) -> None:
        """``start``'s wait for an Entry Spot's activation: within ``request_timeout``
        (``DeadlineExceeded`` naming it), and no longer than until ``abandon_start`` is
        called (``Cancelled``): a stop asked for while an ``on_initialize`` waits on a
        dependency was acted on only once the start gave up (30 s), past a supervisor's
        grace period."""
        done = threading.Event()
        activated.add_callback(lambda _value, _error: done.set())
        end = time.monotonic() + self.config.request_timeout
        while not done.wait(max(0.0, min(0.05, end - time.monotonic()))):
            if self._start_abandoned.is_set():
                raise Cancelled(f"node {self.node_id} was asked to stop while {name!r} started")
            if time.monotonic() >= end:
                raise DeadlineExceeded(
                    f"{name!r} did not finish starting (on_create, on_initialize) within "
                    f"request_timeout ({self.config.request_timeout:g} s)"
                )
        activated.wait(None)  # (done: its outcome, or the error its activation failed with)

    def abandon_start(self) -> None:
        """(Any thread, a signal handler too.) Make a ``start`` still waiting for an Entry
        Spot give up (``Cancelled``): it then stops what began, as after any failed start.
        No effect on a node that started."""
        self._start_abandoned.set()

    @property
    def address(self) -> str | None:
        """Where ``zlink.connect`` reaches this node: ``listen`` with its port resolved (a
        port ``0`` becomes the one bound); ``None`` for a node without a network transport."""
        if isinstance(self._transport, ZmqTransport):
            return self._transport.address
        return None

    def peers(self) -> list[str]:
        """The other nodes of its mesh this node reaches now, sorted (``[]`` outside one)."""
        return [] if self._rt.router is None else self._rt.router.peers()

    def client(self) -> Client:
        """The route client and managers for code outside the runtime (python-api §6).
        ``InvalidOperation`` before ``start()``: nothing could answer its calls yet."""
        if self._state == "new":
            raise InvalidOperation(
                f"node {self.node_id} is not started: call start() first, or use it in a with block"
            )
        return self._client

    def not_serving(self) -> str | None:
        """Why this node does not serve calls now, or ``None`` when it does (cheap: the admin
        endpoint's ``/health`` asks it on every probe): it fenced itself (its lease lapsed or
        was refused; it refuses every call until it registered again), its infrastructure
        thread is not running, it is stopping or not started, or it drains (it refuses calls
        made on it from the moment ``drain()`` begins: a readiness probe must tell)."""
        rt = self._rt
        if self.superseded.is_set():
            return f"superseded: {self._superseded_why}"
        if rt.fenced:
            return "fenced: it lost its lease and serves nothing until it registered again"
        if not self._infra.alive:
            return "the infrastructure thread is not running"
        if rt.stopping:
            return "stopping"
        if rt.draining or self._draining:
            return "draining: it takes no new calls; make them on another node"
        return None

    def status(self) -> NodeStatus:
        """A snapshot: workers, infrastructure backlog, counters and every owner's lanes."""
        rt = self._rt
        return NodeStatus(
            node_id=self.node_id,
            mesh=self.config.mesh,
            at=self.clock.now(),
            time=datetime.datetime.now(datetime.UTC).isoformat(),
            started=self._started,
            workers=self._pool.size,
            workers_busy=self._pool.busy,
            infrastructure_backlog=self._infra.backlog(),
            infrastructure_deadlines=self._infra.deadlines(),
            infrastructure_alive=self._infra.alive,
            worker_calls_in_flight=rt.workers_in_flight,
            counters=rt.metrics.snapshot(),
            spots=len(rt.spots),
            actors=len(rt.actors),
            owners=rt.owner_statuses(),
            address=self.address if self._state != "new" else None,
            peers=self.peers(),
            paused_peers=[] if rt.router is None else rt.router.paused_peers(),
            incarnation=self.incarnation,
            fenced=rt.fenced,
            types=rt.type_statuses(),
            latency_bounds=list(LATENCY_BOUNDS[:-1]),
            latency_sample_every=SAMPLE_EVERY,
        )

    def subscribe_status(
        self, callback: Callable[[NodeStatus], object], *, capacity: int = 16
    ) -> StatusSubscription:
        """Deliver a status every ``status_interval`` (node clock) to ``callback``.

        The callback runs on the subscription's own thread. A slow one never slows message
        processing and is never cut off: when its ``capacity`` slots are full it receives the
        latest status per source, coalesced (§13).
        """
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgument(f"capacity is a whole number >= 1, got {capacity!r}")
        if not callable(callback):
            raise InvalidArgument(f"callback must be callable, got {callback!r}")
        with self._state_lock:
            if self._state in ("stopping", "stopped"):  # (its publisher is closed or closing)
                raise InvalidOperation(f"node {self.node_id} is {self._state}: no status comes")
            publisher = self._publisher
            if publisher is None:
                publisher = self._publisher = StatusPublisher(
                    self.node_id, self.status, self._arm_status
                )
            sub = StatusSubscription(callback, capacity)
        publisher.add(sub)
        return sub

    def _prune_every(self) -> float:
        """How often this node sweeps the store (``store_retention``): a quarter of it, at
        most hourly."""
        assert self.config.store_retention is not None
        return min(3600.0, self.config.store_retention / 4)

    def _prune_due(self) -> None:
        """(Infrastructure thread.) Ask the store, on the store thread, to delete what dead
        nodes left past the retention (``LocationStore.prune``), if this node is the first
        of the mesh's live members by id (one sweep per period, not one per node); then
        again later."""
        router, retention = self._rt.router, self.config.store_retention
        if self._state in ("stopping", "stopped") or router is None or retention is None:
            return
        membership = self._membership
        first = membership is None or all(self.node_id < n for n in membership.others())
        if first and not self._rt.fenced:  # one node sweeps for the mesh: the first by id
            # (a store's sweep is a scan; a fenced node's lease may have lapsed: it waits)
            asked = router.store_worker.call(router.store.prune, retention)
            asked.add_callback(self._pruned)
        self._infra.call_later(self._prune_every(), self._prune_due)

    def _pruned(self, result: Any, error: BaseException | None) -> None:
        metrics = self._rt.metrics
        if error is not None:
            metrics.add("store_prune_failures")
            _log.warning("node %s: the Location Store's retention sweep failed: %s",
                         self.node_id, error)  # fmt: skip
            return
        rows, nodes = result
        if rows:
            metrics.add("store_rows_pruned", rows)
        if nodes:
            metrics.add("store_nodes_pruned", nodes)
        if rows or nodes:
            _log.info("node %s: the Location Store's retention took %d rows and %d nodes"
                      " that dead nodes left", self.node_id, rows, nodes)  # fmt: skip

    def _arm_status(self) -> None:
        self._infra.call_later(self.config.status_interval, self._status_due)

    def _status_due(self) -> None:
        """(Infrastructure thread.) Ask the publisher for a status; it builds it on its own
        thread (``StatusPublisher``)."""
        publisher = self._publisher
        if publisher is not None and self._state not in ("stopping", "stopped"):
            publisher.tick()

    def relocate_spot(self, spot_id: str, target: str, timeout: float | None = None) -> None:
        """Move the User Spot ``spot_id`` (owned here) to node ``target``; blocks until the
        target has committed authority. See ``zlink.relocation.relocator`` for the order and the
        failure rules. ``timeout`` (default: the request timeout) passes on the node's clock or
        in real seconds, whichever comes first, as a blocking ``wait`` does (python-api §9);
        a move that has not reached its commit by then is withdrawn, and ``DeadlineExceeded``
        always means it did not happen: the Spot stays here, admission restored, nothing lost
        (python-api §8).
        ``None`` or ``1e-3 .. 1e7`` seconds."""
        timeout = check_timeout(timeout, "a relocation timeout")
        outside_only("relocate_spot()", _MOVE_HINT)
        if not isinstance(spot_id, str) or not isinstance(target, str):
            raise InvalidArgument(
                f"relocate_spot takes a Spot id and a node id (str), got "
                f"{type(spot_id).__name__} and {type(target).__name__}"
            )
        check_id("a Spot id", spot_id)  # (an empty target was Unavailable, a probe found)
        check_id("a target node id", target)
        rt = self._rt
        if self._relocator is None:
            raise InvalidOperation("relocation needs a mesh (store and transport)")
        budget = self._move_budget(timeout)
        act = rt.spots.get(spot_id)
        if act is None:
            raise NotFound(f"{spot_id!r} is not owned by node {self.node_id}")
        done = self._relocator.start(act, target, budget)
        self._relocator.wait_move(spot_id, done, budget, self.config.request_timeout)

    def _move_budget(self, timeout: float | None) -> float:
        if timeout is None:
            return self.config.request_timeout
        return check_seconds(timeout, "a relocation timeout")

    def drain(self, timeout: float | None = None) -> DrainResult:
        """Relocate every Spot that can move to the other nodes, then stop admission.

        Spots go round-robin to the other reachable nodes, all moves at once; each follows the
        relocation rules (``relocate_spot``); a Spot whose move is under way already is waited
        for, wherever it goes. What cannot move stays, with the reason: Entry
        Spots (and the Actors they hold), ``Relocation.disabled()`` types (a PER_ACTOR Spot
        moves: its shell, then each member), Spots
        not ready, a node with no peers, or a move that failed or did not finish in
        ``timeout`` (default: the request timeout; on the node's clock or in real seconds,
        whichever passes first), which is withdrawn (python-api §8). Afterwards this node refuses
        new calls and creates made on it with ``Unavailable`` but still relays calls routed to
        it to the new owners, and still serves what stayed, until ``shutdown()``.
        ``timeout``: ``None`` or ``1e-3 .. 1e7`` seconds (python-api §9).
        """
        timeout = check_timeout(timeout, "a drain timeout")
        outside_only("drain()", _MOVE_HINT)
        rt = self._rt
        if self._state != "running":
            raise InvalidOperation(f"node {self.node_id} is {self._state}, not running")
        budget = self._move_budget(timeout)
        end = time.monotonic() + budget
        self._draining = True  # (``not_serving``: from now on, before any move)
        if self._client_server is not None:  # a new client goes to another node it was given
            self._client_server.refuse_hellos(
                f"node {self.node_id} is draining: connect to another node of the mesh"
            )
        if self._relocator is not None:  # nothing moves here from now on; what is on its
            self._relocator.refuse_arrivals(f"node {self.node_id} is draining")  # way lands
            self._relocator.wait_arrivals(budget)  # first, and moves on with the rest
        peers = [] if rt.router is None else rt.router.peers()
        nowhere = "no other node to move to"
        if self._membership is not None:  # members by the store's lease, and reachable
            try:
                members = {r.node_id for r in self._membership.members()}
            except ZLinkError as exc:  # no move could commit without the store: all stay
                members, nowhere = set(), f"the location store could not be asked: {exc}"
            peers = [p for p in peers if p in members]
        moving: dict[str, Any] = {}
        targets: dict[str, str] = {}  # where each move this drain began goes
        stayed: dict[str, str] = {}
        turn = 0
        for last in (False, True):
            if last:  # from here calls made on this node are refused; relays go on. A Spot
                rt.draining = True  # made meanwhile (a create taken as the moves began) is
                # moved or reported too (an audit found it in neither list, left to the stop)
            for spot_id, act in list(rt.spots.items()):
                if spot_id in moving or spot_id in stayed:
                    continue
                relocator = self._relocator
                under_way = None if relocator is None else relocator.under_way(spot_id)
                if under_way is not None:  # moving already (relocate_spot): waited for below
                    moving[spot_id] = under_way
                    continue
                if relocator is None or not peers:
                    stayed[spot_id] = nowhere
                    continue
                try:
                    targets[spot_id] = peers[turn % len(peers)]
                    moving[spot_id] = relocator.start(act, targets[spot_id], budget)
                    turn += 1
                except ZLinkError as exc:
                    stayed[spot_id] = str(exc)
        moved = []
        refusing: set[str] = set()  # nodes that took no move (they drain or went away)
        for spot_id, done in moving.items():
            why = self._drain_one(spot_id, done, targets.get(spot_id), peers, refusing, end)
            if why is None:
                moved.append(spot_id)
            else:
                stayed[spot_id] = why
        _log.info("node %s drained: %d moved, %d stayed", self.node_id, len(moved), len(stayed))
        return DrainResult(sorted(moved), stayed)

    def _drain_one(
        self, spot_id: str, done: Any, target: str | None, peers: list[str],
        refusing: set[str], end: float,
    ) -> str | None:  # fmt: skip
        """Wait for one move of a drain: ``None`` once it happened, else why the Spot stayed.
        A target that took no move (``Unavailable``: it drains too, or went away) is passed
        over for another node, within the drain's time (``target``: where this drain sent
        it; ``None``, a move begun before, is only waited for)."""
        relocator = self._relocator
        assert relocator is not None
        while True:
            try:  # one past its deadline is withdrawn: it stays, admission restored
                left = max(0.0, end - time.monotonic())
                relocator.wait_move(spot_id, done, left, self.config.request_timeout)
                return None
            except Unavailable as exc:
                act = self._rt.spots.get(spot_id)
                if act is None or act.state in (CLOSING, GONE):  # it closed (itself) meanwhile:
                    return f"it closed: {exc}"  # no target refused it
                if target is not None:
                    refusing.add(target)
                others = [p for p in peers if p not in refusing]
                if target is None or not others or act is None or time.monotonic() >= end:
                    return f"{type(exc).__name__}: {exc}"
                target = others[0]
                try:
                    done = relocator.start(act, target, end - time.monotonic())
                except ZLinkError as again:
                    return str(again)
            except ZLinkError as exc:
                return f"{type(exc).__name__}: {exc}"

    def counters(self) -> dict[str, int]:
        """Late replies, handler errors, rejected admissions and the like."""
        return self._rt.metrics.snapshot()

    def wait_idle(self, timeout: float = 5.0, busy: int = 0) -> bool:
        """Block until no turn is runnable or running and infrastructure is quiet.

        A turn suspended on a call that has not completed does not count as work; ``busy``
        work items (ones a test keeps blocked on purpose) may still run. ``False`` if
        ``timeout`` (real seconds, ``1e-3 .. 1e7``: python-api §9) passed first.
        """
        timeout = check_seconds(timeout, "a wait_idle timeout")
        outside_only("wait_idle()", "a handler's own turn would never end")
        end = time.monotonic() + timeout
        rt = self._rt
        store = rt.router.store_worker if rt.router is not None else None
        lease = self._lease_worker
        while True:
            if store is not None and not store.wait_quiet(max(0.0, end - time.monotonic())):
                return False  # a store answer still to come continues work
            if lease is not None and not lease.wait_quiet(max(0.0, end - time.monotonic())):
                return False  # (a question about a suspected peer, say)
            left = end - time.monotonic()
            if not self._pool.wait_idle(max(0.0, left), busy):
                return False
            if not self._infra.wait_quiet(max(0.0, end - time.monotonic())):
                return False
            publisher = self._publisher  # a status asked for is part of the work
            if publisher is not None and not publisher.wait_idle(max(0.0, end - time.monotonic())):
                return False
            with rt.workers_idle:  # worker calls in flight will resume turns when done
                if not rt.workers_idle.wait_for(
                    lambda: rt.workers_in_flight == 0, max(0.0, end - time.monotonic())
                ):
                    return False
            if (
                self._pool.pending <= busy
                and (store is None or not store.busy)
                and (lease is None or not lease.busy)
            ):
                return True
            if time.monotonic() >= end:
                return False

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop gracefully: refuse new work, finish running turns, fail what waits.

        Turns that can run, and worker calls (``context.workers.io`` / ``.cpu``) in flight,
        are waited for during the first nine tenths of ``timeout`` (all of it but one second
        at most). Then what still waits fails with ``Unavailable``: calls awaiting a reply or a
        deadline, and worker calls still running, which are abandoned (their threads are
        daemon threads: the interpreter's exit does not wait for them) and counted as
        ``worker_calls_abandoned_at_shutdown`` (never started:
        ``worker_calls_discarded_at_shutdown``). What this node accepted for other nodes is
        waited for in that time too (python-api §9): its outbox empty and its DATA
        acknowledged by the peers that are up (one that paused this node takes it as it
        drains); what is left then is counted (``sends_dropped_shutdown``; sent and never
        acknowledged: ``data_unacknowledged_at_stop``). So are the answers to requests taken
        from peers: a drained node relays calls for the Spots it moved away, and a request it
        relayed, running on the Spot's new node, failed ``Unavailable`` at its caller though
        it ran (a caller that tries again runs it twice). The rest of the time is for the
        turns these failures resume; queued work that never ran then fails with
        ``Unavailable``, counted (``messages_discarded_at_shutdown``,
        ``lifecycle_skipped_<step>``). Returns within
        ``timeout`` (a mesh node's leave from the store takes at least half a second), and no
        thread of the node holds up the interpreter's exit afterwards.
        Safe to call twice. ``timeout``: ``None`` (``NodeConfig.shutdown_timeout``) or
        ``1e-3 .. 1e7`` real seconds, checked before anything stops (python-api §9).
        """
        timeout = check_timeout(timeout, "a shutdown timeout")
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            started = self._state != "new"
            self._state = "stopping"
        if not started:
            self._state = "stopped"
            if self._publisher is not None:  # (subscribed before it started)
                self._publisher.close()
            if self._owned_transport is not None:  # what its constructor opened: a store
                self._owned_transport.detach(self.node_id)  # audit found the file and the
            close = getattr(self._owned_store, "close", None)  # ZeroMQ context left open
            if close is not None:
                close()
            return
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        end = time.monotonic() + timeout
        graceful = end - min(1.0, timeout / 10)  # the rest: for what the forced stop wakes
        moves_until = 0.0
        if self._client_server is not None:  # a new client goes to another node it was given
            self._client_server.refuse_hellos(f"node {self.node_id} is shutting down")
        if self._relocator is not None:  # a move to a node that stops would be closed here
            self._relocator.refuse_arrivals(f"node {self.node_id} is shutting down")
            moves_until = self._end_moves(graceful)
        self._rt.stop_admission()  # admission now refuses; queued jobs are discarded unrun
        self._rt.close_all(min(self.config.closing_timeout, max(0.001, end - time.monotonic())))
        if self._relocator is not None:  # a Spot close_all left to its move closes as it
            self._relocator.wait_moves(  # ends (a commit's store answer: MOVES_AT_STOP more
                max(0.0, min(graceful, moves_until + MOVES_AT_STOP) - time.monotonic()),
                max(0.0, moves_until - time.monotonic()),  # at most; an arrival's commit: no
            )  # later than the first wait's end)
            self._infra.wait_quiet(max(0.0, graceful - time.monotonic()))  # (that close)
        self._settle(graceful)
        self._send_out(graceful)
        router = self._rt.router  # requests taken from peers: answered, and the answers sent
        if router is not None and router.wait_answered(graceful - time.monotonic()):
            self._settle(graceful)
            self._send_out(graceful)
        if self._relocator is not None:  # copies or not: what arrives here uncommitted
            self._relocator.settle_at_stop(max(0.1, graceful - time.monotonic()))
        # Calls awaiting a reply or room fail first, then worker calls are abandoned: a turn
        # that the abandoned call resumes and that fails on it must find its caller answered
        # already (Unavailable, not the HandlerError of a turn cut short by the shutdown).
        error = self._rt.at_stop(f"node {self.node_id} shut down")
        if self._relocator is not None:  # what it kept for Spots that never open here
            self._relocator.stopped(error)
        pending = self._infra.take_pending()
        with self._rt.workers_idle:
            of_workers = {run.completion for run in self._rt.worker_runs}
        failed = functools.partial(self._rt.metrics.add, "calls_failed_at_shutdown")
        for fn, args in pending:
            if fn is expire:
                if args[0] in of_workers:  # a worker call's own deadline: failed and counted
                    continue  # with the rest of them, as abandoned or discarded (an audit
                expire(args[0], error, failed)  # found it counted as a call failed instead)
            elif getattr(fn, "__func__", None) is Admitted.abandon:  # a wait for room
                fn(error)
        self._rt.abandon_workers()  # their waiters get Unavailable; the calls run on, unjoined
        self._rt.cancel_suspended()  # the closing deadlines left the heap too: due now
        self._pool.wait_idle(max(0.0, end - time.monotonic()))
        discarded = self._rt.discard_queued()
        if discarded:
            _log.info("node %s failed %d queued messages at shutdown", self.node_id, discarded)
        self._pool.shutdown(max(0.0, end - time.monotonic()))
        still = self._pool.busy
        if still:  # each left running on its (daemon) worker thread, unjoined
            self._rt.metrics.add("turns_abandoned_at_shutdown", still)
            _log.warning("node %s: %d turns still ran when the shutdown's time ran out; "
                         "abandoned on their worker threads", self.node_id, still)  # fmt: skip
        if self._membership is not None:  # releases and the like first, while the lease holds
            assert self._rt.router is not None
            self._rt.router.store_worker.stop(max(0.25, (end - time.monotonic()) / 2))
            leaving = getattr(self._transport, "leaving", None)  # before the store says "gone":
            if leaving is not None:  # peers that look then hear a clean leave, not a crash
                leaving(self.node_id)
            self._membership.leave(max(0.5, end - time.monotonic()))
        if self._client_server is not None:  # after the last replies: clients hear goodbye
            self._client_server.close()
        if self._transport is not None:  # before the infrastructure thread stops: peers hear
            self._abandon_outbox(error, end)
            self._transport.detach(self.node_id)
        self._infra.stop(max(0.0, end - time.monotonic()))
        close = getattr(self._owned_store, "close", None)
        if close is not None:
            close()
        if self._publisher is not None:
            self._publisher.close()
        self._state = "stopped"
        _log.info("node %s stopped", self.node_id)

    def _send_out(self, until: float) -> None:
        """(Shutdown.) Wait, until ``until`` at most, for what this node accepted for other
        nodes to be out (python-api §9): its outbox empty and its DATA acknowledged by the
        peers that are up (a peer that paused this node takes it as it drains)."""
        router = self._rt.router
        if router is None:
            return
        transport = router.transport
        while router.outbox.pending() or transport.unacknowledged():
            if time.monotonic() >= until:
                return
            time.sleep(0.005)  # two other threads' progress: no one event to wait on

    def _abandon_outbox(self, error: Unavailable, end: float) -> None:
        """(Shutdown.) What is still kept behind a route fence or in the outbox fails,
        counted (``sends_dropped_shutdown``) or answered with ``error``, on the
        infrastructure thread, which owns them."""
        router = self._rt.router
        if router is None or not (router.outbox.pending() or router.holds_kept()):
            return
        done = threading.Event()

        def abandon() -> None:
            try:
                router.abandon_kept(error)  # (first: a request's error answer is sent on)
                router.outbox.abandon(error)
            finally:
                done.set()

        self._infra.submit(abandon)
        done.wait(max(0.0, end - time.monotonic()))

    def _end_moves(self, graceful: float) -> float:
        """(A stop, arrivals refused.) Moves under way end before the stop closes what is
        here: those leaving are withdrawn (their Spots serve here again, and close with the
        rest; their callers hear ``Unavailable``), and those arriving are refused as they
        restore; the ones past their point of no return (a commit under way, an arrival
        restored) are waited for, :data:`MOVES_AT_STOP` seconds (or half the graceful time)
        at most, and then go where their commit puts them. Before, a stop closed a Spot whose
        commit then gave it to the target, and one that arrived as it stopped (found by an
        audit). Returns the end of that wait."""
        relocator = self._relocator
        assert relocator is not None
        relocator.withdraw_all(
            Unavailable(f"node {self.node_id} is shutting down; the move was withdrawn")
        )
        left = max(0.0, graceful - time.monotonic())
        until = time.monotonic() + min(MOVES_AT_STOP, left / 2)
        relocator.wait_moves(max(0.0, until - time.monotonic()))
        return until

    def _settle(self, until: float) -> None:
        """(Shutdown.) Wait, until ``until`` at most, for no turn to be runnable and no worker
        call to be in flight (a worker call that ends resumes its turn)."""
        rt = self._rt
        while True:
            if not self._pool.wait_idle(max(0.0, until - time.monotonic())):
                return
            if not rt.wait_workers(max(0.0, until - time.monotonic())):
                return
            if self._pool.pending == 0 or time.monotonic() >= until:
                return

    def __enter__(self) -> Node:
        if self._state == "new":
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<zlink.Node {self.node_id!r} {self._state} workers={self._pool.size}>"

    # for zlink.testing and white-box tests
    @property
    def _runtime(self) -> Any:
        return self._rt
