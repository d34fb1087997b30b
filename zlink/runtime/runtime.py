"""One node's object model, composed; and delivery: validate -> resolve -> deliver.

This is the layer between the public calls (``zlink.messaging``, through ``RuntimePort``) and
the engine (``zlink.executor``). ``Runtime`` composes the ``Directory`` of live Spots, Actors
and Channels (``directory.py``, with its own lock) and its parts, each a class holding the
runtime as its collaborator: ``Creation`` (activation, create), ``Membership`` (Defer, Join,
leave), ``Closing`` (closing, idle eviction, shutdown). Delivery is here: a call is validated,
its destination resolved (local, remote through ``routing.py``, moving through the
relocation port, a cold Instance Spot, or a Channel) and delivered as a job (``jobs.py``) on
the right owner lane (execution-model §2: an Actor payload always goes to the Actor's own
queue, whatever the mode). The live objects are in ``acts.py``.

Guarantees / assumes:
* ``directory.lock`` guards directory *writes* (activation, removal); reads are plain
  ``dict.get``. ``_yield_lock`` is a leaf. Lock order (``zlink.lock_order``): route ->
  relocator -> directory -> leaves.
* Gates: a SpotWide User Spot and an Instance Spot have one gate for the Spot, its member Actors
  and its lifecycle callbacks; an Entry Spot and a PerActor User Spot have a gate for the Spot,
  and each Actor keeps its own gate (§2). Membership changes only while the Actor is held.
* Every refusal (self-wait, Yield where not offered, bad target, full lane, stopping node) is
  raised before any queue changes (§6, §16).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import (
    Admission,
    DaemonPool,
    Entries,
    Gate,
    Job,
    LaneLimits,
    Owner,
    OwnerLanes,
    RoomWaiter,
    Turn,
    current_turn,
    ranked_lock,
)
from ..lock_order import LockRank
from ..mesh import wire
from ..types import SpotRef, TargetKind
from .routing import MAX_HOPS

if TYPE_CHECKING:
    from ..app import App
    from ..executor import Clock, InfraExecutor, WorkerPool
    from ..handlers import HandlerSpec
    from ..messaging.message import Message
    from ..timers import Timer
    from .ports import LeaseHolder, RelocationPort, RemoteJoinPort
    from .routing import MeshRouter
from ..messaging.calls import (
    KEEP_TURN,
    NO_WAIT,
    YIELD_GATE,
    BatchSendCall,
    MessageCall,
    WaitMode,
    WorkerCall,
)
from ..messaging.completion import Admitted, Completion, expire, in_progress
from ..messaging.message import check_reply, lane_size, lane_size_many, to_wire
from ..status import OwnerStatus, TimerStatus, TypeStatus
from ..types import SpotKind
from .acts import (
    CLOSING,
    GONE,
    PAST_READY,
    READY,
    SEALED,
    Act,
    ActorAct,
    ActState,
    ChannelAct,
    Discarded,
    SpotAct,
)
from .closing import Closing
from .creation import Creation
from .directory import Directory
from .events import EventLedger, Marks, forget_node, mark, offered
from .jobs import BatchJob, MessageJob, RecordedJob, SendJob, handler_error, not_serving
from .membership import Membership
from .metrics import Metrics

_log = logging.getLogger("zlink.runtime")
# the kinds as module globals: an enum attribute read costs ~0.1 us per send on 3.11
_SPOT, _ACTOR = TargetKind.SPOT, TargetKind.ACTOR
_CHANNEL, _TOPIC = TargetKind.CHANNEL, TargetKind.TOPIC
# the verdicts read on the hot path, as module globals
ADMITTED, FULL_COUNT, ADMISSION_CLOSED = Admission.ADMITTED, Admission.FULL_COUNT, Admission.CLOSED
WAITING = Admission.WAITING
_new_send_job = SendJob.__new__
_NOT_READY_LOOKS = 3  # a call meeting a target sealed, opened and sealed again: looks again


class Runtime:
    """One node's object model, composed: the directory of live objects, delivery (this
    class: validate -> resolve a destination -> deliver), and its parts ``creation``,
    ``membership`` and ``closing``, each a class with this runtime as its collaborator.

    The parts' public methods are bound here as attributes, so what calls the runtime
    (contexts through ``RuntimePort``, activations, jobs, timers, relocation) sees one object.
    """

    def __init__(
        self,
        app: App,
        *,
        node_id: str,
        mesh: str,
        limits: LaneLimits,
        budget: float,
        request_timeout: float,
        clock: Clock,
        admission_timeout: float = 30.0,
        pool: WorkerPool,
        infra: InfraExecutor,
        closing_timeout: float = 5.0,
        idle_timeout: float | None = None,
        io_pool: DaemonPool | None = None,
        cpu_pool: DaemonPool | None = None,
        worker_limit: int = 1024,
    ) -> None:
        self.app = app
        self.node_id = node_id
        self.mesh = mesh
        self.limits = limits
        self.budget = budget
        self.request_timeout = request_timeout
        self.admission_timeout = admission_timeout
        self.closing_timeout = closing_timeout
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._now = clock.now
        self.pool = pool
        self.infra = infra
        self.io_pool = io_pool or DaemonPool(16, "zlink-io")
        self.cpu_pool = cpu_pool or DaemonPool(pool.size, "zlink-cpu")
        self.worker_limit = worker_limit
        self.worker_slots = threading.BoundedSemaphore(worker_limit)
        self.workers_in_flight = 0
        self.worker_runs: set[WorkerRun] = set()  # in flight: guarded by workers_idle
        self.workers_closed = False  # (shutdown) guarded by workers_idle
        self.workers_idle = threading.Condition(threading.Lock())
        self.metrics = Metrics()
        directory = self.directory = Directory(app)
        # the tables are never rebound: held here too, for the hot path
        self.spots, self.actors = directory.spots, directory.actors
        self.channels, self.entries, self.topics = (
            directory.channels, directory.entries, directory.topics,
        )  # fmt: skip
        self.has_live = directory.has_live
        # ids whose store row this node releases or takes anew now (a close's release, a
        # left row claimed again), each with what waits for that to end (directory lock): a
        # claim that meets such a row waits, never takes it while a late release could
        # still delete it, nor takes it twice
        self.releasing: dict[str, list[Callable[[], None]]] = {}
        self.router: MeshRouter | None = None  # set when the node is part of a mesh
        self.relocator: RelocationPort | None = None  # plugged in by the node (a mesh)
        self.remote_join: RemoteJoinPort | None = None
        self.membership_lease: LeaseHolder | None = None  # set by the node in a mesh
        self._yield_lock = ranked_lock("runtime.yield", LockRank.YIELD)
        # Logical Multicast across a mesh: event numbers, and their locks (``events``)
        self.events = EventLedger()
        self.fenced = False  # self-fenced: its lease may have lapsed, it serves nothing
        self.stopping = False  # read on the hot path
        # the errors the stop itself fails awaited calls with (``at_stop``): a turn that lets
        # one through ended because the node stopped, counted where the stop failed the call
        # the errors the stop fails or cancels turns with (identity; added from the stopping
        # thread and the infrastructure thread: a set's add, no read-modify-write to lose)
        self.stop_errors: set[BaseException] = set()
        self._worker_timed_out = functools.partial(self.metrics.add, "worker_calls_timed_out")
        self.draining = False  # drained: calls made here are refused; relayed calls go on
        self.stopped_admission = threading.Event()  # for those who must wait for it
        # the parts, and their public methods as this runtime's
        creation = self.creation = Creation(self)
        self.register_spot = creation.register_spot
        self.instance_spec = creation.instance_spec
        self.activate_instance = creation.activate_instance
        self.rehome = creation.rehome
        self.deactivate = creation.deactivate
        self.submit_create = creation.submit_create
        self.deadline_of = creation.deadline_of
        self.arm = creation.arm
        membership = self.membership = Membership(self)
        self.close_scope = membership.close_scope
        self.defer_join = membership.defer_join
        self.defer_relocation_ready = membership.defer_relocation_ready
        self.relocation_ready_completed = membership.relocation_ready_completed
        self.joined_here = membership.joined_here
        self.complete_join = membership.complete_join
        self.leave = membership.leave
        self.disconnect = membership.disconnect
        self.actor_spot_id = membership.actor_spot_id
        closing = self.closing = Closing(self)
        self.close_ref = closing.close_ref
        self.close_later = closing.close_later
        self.close_self = closing.close_self
        self.close_spot = closing.close_spot
        self.queue_closing = closing.queue_closing
        self.sweep_idle = closing.sweep_idle
        self.close_all = closing.close_all
        self.stop_admission = closing.stop_admission
        self.owners = closing.owners
        self.discard_queued = closing.discard_queued
        self.drop_all = closing.drop_all
        self.cancel_suspended = closing.cancel_suspended

    def new_gate(self, name: str) -> Gate:
        return Gate(self.pool, self.clock, self.budget, name)

    def _no_reply(self, call: MessageCall) -> str:
        """What a request that timed out says: its target and its limit."""
        return (
            f"no reply from {call.kind} {call.target!r} within"
            f" {self.deadline_of(call.deadline):g} s"
        )

    @property
    def incarnation(self) -> int:
        """This node's incarnation in the store: what its claims and fenced writes name."""
        held = self.membership_lease
        return 0 if held is None else held.incarnation

    def start(self) -> list[tuple[str, Completion]]:
        """Make the Channels and Entry Spots; returns the Entry Spots' names and activations to
        wait on."""
        for spec in self.app.channels.values():
            self.channels[spec.name] = ChannelAct(self, spec)
        waits = []
        for spec in self.app.spots.values():
            if spec.kind is SpotKind.ENTRY:
                activated = Completion()
                act = self.register_spot(spec, f"{spec.name}@{self.node_id}",
                                         then=activated.set, wake=False)  # fmt: skip
                assert spec.actor_type is not None
                self.entries[spec.actor_type] = act  # known as its type's Entry first
                act.owner.wake()
                waits.append((act.name, activated))
        if self.idle_timeout is not None:
            self.infra.call_later(self.idle_timeout / 4, self.sweep_idle)
        return waits

    # -- messages -------------------------------------------------------------------------------
    def submit(
        self,
        call: MessageCall,
        reply: Completion | None,
        mode: WaitMode,
        hops: int = 0,
        force: bool = False,
        plain: bool = False,
        room: Admitted | None = None,
        recorded: Callable[[], None] | None = None,
    ) -> Completion:
        """Route a send or request: the one admission path of every message (any thread).
        Raises before any queue change when it cannot be taken. ``recorded``: the message is
        an Instance Spot's durable first record, cleared by this once its handler ended.

        A full lane refuses a plain send (``ResourceExhausted``); a request, and a send given
        ``room`` (its ``wait``/``future``/``await`` terminals), wait for room instead, first
        come first served, within their deadline (python-api §9). ``room`` completes once the
        send is accepted (admitted, kept for a move, or handed to the mesh).

        The fast path, first: a one-way message with no option (``plain``) for a ready Spot
        or Actor of this node with a plain ``def`` handler goes straight to the lane as a
        light job (one given ``room`` that finds the lane full goes on to the general path,
        and waits there). Everything else takes the general path below, which resolves the
        destination: a target this node does not have is routed to its owner (when the node
        is part of a mesh; ``hops`` counts relays); a target sealed for relocation keeps the
        call for the new owner, and a relocation target holds it until authority is
        committed, so nothing accepted is refused or reordered by a move (``force``: the
        relocator's own refill); a cold Instance Spot is activated; a Channel gets a turn of
        its own.
        """
        if plain and not (self.stopping or self.draining):  # reply is None, hops 0: a send
            kind = call.kind
            if kind == _SPOT:
                act_: SpotAct | ActorAct | None = self.spots.get(call.target)
            elif kind == _ACTOR:
                act_ = self.actors.get(call.target)
            else:
                act_ = None
            if act_ is not None and act_.state is READY:
                fast = act_.spec.handlers.get(type(call.msg))
                if fast is not None and not fast.is_async:
                    turn = current_turn()
                    job = _new_send_job(SendJob)  # slots filled here: no __init__ frame (hot)
                    job.act, job.handler, job.msg = act_, fast, call.msg
                    owner = turn.owner if turn is not None else None
                    job.sender = owner.name if owner is not None else None
                    job.size = lane_size(call.msg)
                    job.at = self._now()
                    if hops and call.origin is not None:  # from another node: a discard
                        job.origin = call.origin  # is counted there too (python-api §9)
                    verdict = act_.owner.lanes.put_app(job, job.size)  # Owner.put_app inline
                    if verdict is ADMITTED:
                        if room is not None:
                            room.set(None, None)
                        return None  # type: ignore[return-value]
                    if room is None:
                        self._refused(act_, call, None, mode, 0, False, verdict)
                        return None  # type: ignore[return-value]
                    # not admitted, and it may wait for room: the general path queues it
        if room is None:
            return self._route(call, reply, mode, hops, force, None, recorded)
        before = room.withdraw
        out = self._route(call, reply, mode, hops, force, room, recorded)
        if room.withdraw is before:  # no wait for room began: accepted already
            room.set(None, None)
        return out

    def _route(
        self, call: MessageCall, reply: Completion | None, mode: WaitMode, hops: int, force: bool,
        room: Admitted | None, recorded: Callable[[], None] | None = None,
    ) -> Completion:  # fmt: skip
        """``submit``'s general path: resolve the destination, then admit (see ``submit``)."""
        if self.fenced:
            raise not_serving(self)
        if (self.stopping or self.draining) and not (hops and self.router is not None):
            raise not_serving(self)  # a drained node relays
        if call.mesh is not None and call.mesh != self.mesh:
            raise NotFound(f"mesh {call.mesh!r} is not reachable from node {self.node_id}")
        turn = current_turn()
        msg = call.msg
        act: Act | None
        held: OwnerLanes | None = None  # a closing Instance Spot's, for its next activation
        if call.kind == _TOPIC:
            router = self.router
            origin, stamp = call.origin, call.event
            if router is None or (hops and (origin is None or stamp is None)):
                self._publish(call, turn, None, None)  # (nothing to number)
            elif hops:  # from a peer: its subscribers here only, in its numbers' order
                with self.events.lock(origin, call.target):  # type: ignore[arg-type]
                    self._publish(call, turn, origin, stamp)
            else:  # made here: refused before anyone has it if it cannot cross
                fits = router.topic_fits(call)
                me = self.node_id
                with self.events.lock(me, call.target):  # (in number order: ``events``)
                    stamp = self.events.next(call.target, self.incarnation)
                    self._publish(call, turn, me, stamp)
                    if fits:
                        router.publish_to_peers(call, stamp)
            return reply  # type: ignore[return-value]
        if call.kind == _CHANNEL:
            act = self.channels.get(call.target)
            if act is None:
                raise NotFound(f"no channel {call.target!r}")
        elif call.kind == _ACTOR:
            act = self.actors.get(call.target)
            if act is None:
                if self.router is not None:
                    return self._remote(call, reply, mode, hops, room)
                raise NotFound(f"no actor {call.target!r}")
            if act.state in PAST_READY and not force:
                return self._not_ready(act, call, reply, mode, hops, room)
        else:
            act = self.spots.get(call.target)
            if act is None:
                if self.router is not None and not call.instance:
                    return self._remote(call, reply, mode, hops, room)
                if not call.instance:
                    raise NotFound(f"no spot {call.target!r}")
            elif act.state in PAST_READY and not force:
                held = self._held(act)
                if held is None:
                    return self._not_ready(act, call, reply, mode, hops, room)
            elif call.instance and act.kind is not SpotKind.INSTANCE:
                raise InvalidArgument(f"spot {call.target!r} is not an Instance Spot")
        spec = act.spec if act is not None else self.instance_spec(call)
        handler = spec.handlers.get(type(msg))
        if handler is None:
            raise InvalidArgument(f"{spec.name!r} has no handler for {type(msg).__qualname__}")
        if mode in (KEEP_TURN, YIELD_GATE) and act is not None:
            self._check_wait(turn, act, mode)
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        if act is None:  # an Instance Spot's first message activates it (cold activation)
            if self.router is not None:  # the owner the store confirms runs the factory: the
                return self._remote(call, reply, mode, hops, room)  # router asks, activates
            act = self.activate_instance(spec, call.target, None)
        if recorded is None:
            job = MessageJob(act, handler, msg, reply, call.meta, sender, 0)
            if reply is None and call.origin is not None:  # (see ``submit``; also a part
                job.origin = call.origin  # of a peer's batch, or a call a move kept)
        else:
            job = RecordedJob(act, handler, msg, reply, call.meta, sender, 0)
            job.ran = recorded
        job.at = self._now()
        if reply is not None and reply.timer is None:  # a diverted call was armed already
            self.arm(reply, call.deadline, self._no_reply(call), not hops)
        owner = act.owner
        job.size = lane_size(msg)
        if call.meta:  # metadata is held with the message: it counts against the byte limit
            job.size += sum(len(k) + len(v) for k, v in call.meta.items())
        # (a handler never runs at the call site: §6, §11)
        verdict = owner.put_app(job) if held is None else held.put_app(job, job.size)
        if verdict != ADMITTED:
            if verdict != ADMISSION_CLOSED and (reply is not None or room is not None):
                return self._wait_for_room(act, job, call, reply, mode, hops, room, held)
            return self._refused(act, call, reply, mode, hops, force, verdict, room, held)
        return reply  # type: ignore[return-value]

    def _refused(
        self, act: Act, call: MessageCall, reply: Completion | None, mode: WaitMode,
        hops: int, force: bool, verdict: Admission, room: Admitted | None = None,
        held: OwnerLanes | None = None,
    ) -> Completion:  # fmt: skip
        """A lane did not admit the call: a seal met after the state check keeps it for the
        move (its deadline stands); otherwise a typed refusal, with nothing queued."""
        if verdict == ADMISSION_CLOSED and not force:
            assert not isinstance(act, ChannelAct)  # (a Channel's lanes never close)
            return self._not_ready(act, call, reply, mode, hops, room)
        if reply is not None and reply.timer is not None:
            reply.timer.cancel()
        if verdict == ADMISSION_CLOSED:
            raise Unavailable(f"{act.name!r} is sealed (closing or relocating)")
        self.metrics.add("rejected_admissions")
        (held or act.owner.lanes).note_refused()
        what = "items" if verdict == FULL_COUNT else "bytes"
        raise ResourceExhausted(
            f"the application lane of {act.name!r} is full ({what}); nothing was queued"
        )

    def _wait_for_room(
        self, act: Act, job: Job | Entries, call: MessageCall | BatchSendCall,
        reply: Completion | None,
        mode: WaitMode, hops: int, room: Admitted | None, held: OwnerLanes | None = None,
    ) -> Completion:  # fmt: skip
        """A full lane: queue the caller as a waiter for room (python-api §9), first come first
        served; a request waits within its own deadline, a send within its wait's timeout or
        ``admission_timeout``. Too many waiters already: ``ResourceExhausted`` at once.
        ``held``: the lanes a closing Instance Spot holds calls in (``Runtime._held``)."""
        if mode in (KEEP_TURN, YIELD_GATE):
            self._check_wait(current_turn(), act, mode)  # room only this turn could make
        if room is None:
            room = Admitted()  # a request's: its reply is what the caller waits on
        lanes = act.owner.lanes if held is None else held

        def notify(verdict: Admission) -> None:
            if verdict == ADMITTED:
                room.set(None, None)
            else:  # sealed while waiting (a move or a close): routed again, now, in the
                self._room_sealed(call, reply, room, hops)  # order the waiters queued

        waiter = RoomWaiter(job, job.size, job.count, notify, bounded=room.peer is None)
        verdict = lanes.wait_room(waiter)
        if verdict == ADMITTED:
            room.set(None, None)  # room came back meanwhile: admitted, nothing to wait for
            return reply  # type: ignore[return-value]
        if verdict == WAITING:
            room.withdraw = functools.partial(lanes.cancel_wait, waiter)
            self.metrics.add("admission_waits")
            if reply is not None:  # its deadline ends the wait too (nothing queued then)
                reply.add_callback(lambda _v, error: error is not None and room.abandon(error))
            elif room.peer is None and room.timer is None:  # (a send from another node
                # waits for room as long as it takes: its node's pause bounds it; one that
                # waited in the outbox keeps the deadline it had there)
                self.arm_room(room, repr(act.name))
            return reply  # type: ignore[return-value]
        if verdict == ADMISSION_CLOSED:  # sealed meanwhile
            if isinstance(call, BatchSendCall):
                assert not isinstance(act, ChannelAct)  # (a batch goes to a Spot or Actor)
                if self._goes_again(act):  # a close changed it: all or none, waiting
                    self._route_many(call, room, mode)
                    return reply  # type: ignore[return-value]
                self._one_by_one(call, act, room, mode)  # the moving path, in order
                return reply  # type: ignore[return-value]
            return self._refused(act, call, reply, mode, hops, False, verdict, room)
        if reply is not None and reply.timer is not None:
            reply.timer.cancel()
        self.metrics.add("rejected_admissions")  # (wait_room counted it for the target)
        if lanes.larger_than_lane(waiter):  # it would never fit: waiting is no use
            raise ResourceExhausted(
                f"{job.count} message(s) of {job.size:,} bytes are more than the application "
                f"lane of {act.name!r} holds at all; nothing was queued"
            )
        raise ResourceExhausted(
            f"the application lane of {act.name!r} is full and {self.limits.waiters} callers "
            "already wait for room; nothing was queued"
        )

    def arm_room(self, room: Admitted, what: str) -> None:
        """Put a send's wait for room on the deadline heap: its own timeout, else
        ``admission_timeout``; when it passes, the wait is withdrawn (nothing queued)."""
        limit = room.deadline if room.deadline is not None else self.admission_timeout
        room.timer = self.infra.call_later(limit, room.abandon, DeadlineExceeded(
            f"no room in {what} within {limit:g} s; nothing was queued"
        ))  # fmt: skip

    def _room_sealed(
        self,
        call: MessageCall | BatchSendCall,
        reply: Completion | None,
        room: Admitted,
        hops: int,
    ) -> None:
        """A call waiting for room met a seal (on the sealing thread, no runtime lock held):
        route it again (kept for the move, or refused as the close refuses it), its deadline
        unchanged."""
        room.withdraw = in_progress  # routed again now: its outcome is on its way
        try:
            if self.stopping:
                raise Unavailable(f"node {self.node_id} shut down before there was room")
            if isinstance(call, BatchSendCall):
                self.submit_many(call, room)
            else:
                self.submit(call, reply, NO_WAIT, hops, room=room)
        except Exception as exc:  # noqa: BLE001 - whatever it is, its waiter must hear it
            room.set(None, exc)
            if reply is not None:
                reply.set(None, exc)

    def submit_many(
        self, call: BatchSendCall, room: Admitted | None = None, mode: WaitMode = NO_WAIT
    ) -> None:
        """The batch send path: a local, ready target admits every message behind one lock
        (all or none) and is woken once; each message is still its own turn, in order.
        Anything else (remote, moving, a Channel) goes one by one through ``submit``.
        Given ``room``, a full lane is waited for (all the batch at once, python-api §9), and
        ``room`` completes once the batch is accepted, as in ``submit``."""
        if room is None:
            self._route_many(call, None, mode)
            return
        before = room.withdraw
        self._route_many(call, room, mode)
        if room.withdraw is before:  # no wait for room began: accepted already
            room.set(None, None)

    def _route_many(self, call: BatchSendCall, room: Admitted | None, mode: WaitMode) -> None:
        """``submit_many``'s body: admit, send to the target's node, go one by one, or wait."""
        if self.stopping or self.draining:  # (a fenced node is marked draining too)
            raise not_serving(self)
        act = (self.actors if call.kind == _ACTOR else self.spots).get(call.target)
        held = None if act is None or act.state not in PAST_READY else self._held(act)
        if act is None or (act.state in PAST_READY and held is None):
            if act is not None and self._goes_again(act):  # a close changed it meanwhile
                self._route_many(call, room, mode)  # (all or none, waiting as asked)
                return
            router = self.router
            if act is None and router is None:  # none here, nor anywhere: a batch makes no
                raise NotFound(f"no {call.kind} {call.target!r}")  # Instance Spot (§8)
            if act is None and router is not None and router.send_batch(call, room):
                return  # one envelope, all or none where the target lives
            relocator = self.relocator
            if act is not None and relocator is not None and relocator.divert_batch(call, room):
                return  # moving: parked whole, or waiting whole for the move (§8, §9)
            self._one_by_one(call, act, room, mode)
            return
        turn = current_turn()
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        msgs = call.msgs
        types = set(map(type, msgs))
        table = act.spec.handlers
        found: dict[type[Message], HandlerSpec] = {}
        for tp in types:
            handler = table.get(tp)
            if handler is None:
                raise InvalidArgument(
                    f"{act.spec.name!r} has no handler for {tp.__qualname__}; "
                    "nothing of the batch was queued"
                )
            found[tp] = handler
        job: Job | Entries
        lanes = act.owner.lanes if held is None else held
        if any(h.is_async for h in found.values()):  # an async handler suspends: each
            job = self._entries(act, found, msgs, sender, call.origin)  # message a job,
            verdict = lanes.put_app_entries(job)  # a turn alone
        else:
            one = next(iter(types)) if len(types) == 1 else None
            handlers = found[one] if one is not None else [found[type(m)] for m in msgs]
            job = BatchJob(act, handlers, msgs, sender, lane_size_many(msgs, one))
            job.origin = call.origin  # a peer's batch: a discard is told there too (§9)
            job.at = self._now()
            verdict = lanes.put_app(job, job.size, job.count)
        if verdict == ADMITTED:
            return
        if verdict == ADMISSION_CLOSED:
            if self._goes_again(act):  # a close changed it meanwhile: all or none, as asked
                self._route_many(call, room, mode)
                return
            self._one_by_one(call, act, room, mode)  # sealed meanwhile: the moving path
            return
        if room is not None:
            self._wait_for_room(act, job, call, None, mode, 0, room, held)
            return
        self.metrics.add("rejected_admissions")
        lanes.note_refused()
        raise ResourceExhausted(
            f"the application lane of {act.name!r} has no room for {len(msgs)} messages; "
            "nothing of the batch was queued"
        )

    def _entries(
        self, act: SpotAct | ActorAct, found: dict[type[Message], HandlerSpec],
        msgs: list[Message], sender: str | None, origin: str | None,
    ) -> Entries:  # fmt: skip
        """A batch as one job per message, admitted together (all or none, python-api §8);
        ``origin``: the node a peer's batch began on (a discard is told there, §9)."""
        now = self._now()
        jobs: list[MessageJob] = []
        size = 0
        for msg in msgs:
            job = MessageJob(act, found[type(msg)], msg, None, None, sender, lane_size(msg))
            if origin is not None:
                job.origin = origin
            job.at = now
            size += job.size
            jobs.append(job)
        return Entries(jobs, size)

    def _one_by_one(
        self, call: BatchSendCall, act: SpotAct | ActorAct | None, room: Admitted | None,
        mode: WaitMode,
    ) -> None:  # fmt: skip
        """A batch whose target ``act`` is moving (or not here) goes message by message, in
        order (``submit_many`` tells ``room``). One that was taken out of the table meanwhile
        (a close ended; another took its place) goes again from the start, all or none,
        waiting as asked: message by message, the first would go to the new one without
        waiting, and a later one refused would leave the first ones queued (§8, §9).

        The target can still change between two parts: a part refused once an earlier one
        was queued is counted dropped (at both ends) and the rest go on; only a refusal of
        the first raises, the batch refused whole. (A ledger run on 3.13t counted a peer's
        batch dropped whole, its queued parts included, when a later part raised.)"""
        if act is not None:
            now = (self.actors if call.kind == _ACTOR else self.spots).get(call.target)
            if act.state is GONE or (now is not None and now is not act):
                self._route_many(call, room, mode)
                return
        queued = False
        for part in call.parts():  # (each knows a peer's batch's origin)
            try:
                self.submit(part, None, NO_WAIT)
            except ZLinkError as exc:
                if not queued or self.router is None:
                    raise
                self.router.count_dropped(part, exc)
                continue
            queued = True

    def _not_ready(
        self, act: SpotAct | ActorAct, call: MessageCall, reply: Completion | None, mode: WaitMode,
        hops: int, room: Admitted | None = None,
    ) -> Completion:  # fmt: skip
        """A sealed, moving or restoring target: the relocator keeps the call, or it is gone
        (routed on), or it is closing (refused before any queue change). Calls still waiting
        for room in its lanes came first: they are routed the same way before this one."""
        lanes = act.owner.lanes
        if self._goes_again(act):  # (to its lanes, those held for its next activation, or
            return self.submit(call, reply, mode, hops, room=room)  # that one, in the table)
        if mode in (KEEP_TURN, YIELD_GATE):  # a wait only this turn's own gate could end is
            self._check_wait(current_turn(), act, mode)  # refused, moving or not (§9)
        if reply is not None and reply.timer is None:  # its deadline runs from now on
            self.arm(reply, call.deadline, self._no_reply(call), not hops)
        relocator = self.relocator  # (a moving target's waiters go first, under its lock)
        for _ in range(_NOT_READY_LOOKS):
            if relocator is not None and relocator.divert(call, reply, hops, lanes, room):
                return reply  # type: ignore[return-value]
            if act.state in PAST_READY and (lanes.app_waiters or lanes.life_waiters):
                # each routed again now, in its order (_room_sealed); not once it is open again
                lanes.end_waits()  # (then they stay in the queue, ahead of this call)
            if act.state == GONE or act.state not in PAST_READY:  # moved or reopened: go again
                # A close or an eviction changes the state, and forgets the object, under the
                # directory lock: waited out here, so the call is not routed again to the same
                # object over and over meanwhile (a probe's caller recursed until its stack ran
                # out, a segfault on 3.13t, while a close took the object out of the table).
                with self.directory.lock:
                    table = self.actors if isinstance(act, ActorAct) else self.spots
                    stale = act.state == GONE and table.get(act.name) is act
                    closed = act.state not in PAST_READY and lanes.closed
                if stale or closed:  # (neither, once a state change is made whole)
                    raise Unavailable(f"{call.kind} {call.target!r} is closing or moving")
                # routed from the start, with the same deadline (sealed again meanwhile, by
                # the next move: kept for that one)
                return self.submit(call, reply, mode, hops, room=room)
            if act.state is not SEALED or relocator is None:
                break  # closing: refused
            # sealed again: a move ended and the next began between the looks (a room moved
            # back and forth under load met it 2 times in 30): look once more
        if reply is not None and reply.timer is not None:
            reply.timer.cancel()
        raise Unavailable(f"{call.kind} {call.target!r} is sealed (closing or relocating)")

    def hold_row(self, object_id: str, waiter: Callable[[], None]) -> bool:
        """Whether this caller takes ``object_id``'s left store row now (``True``: the id is
        held in ``releasing`` until :meth:`released`); else a release or another taking of it
        is under way, and ``waiter`` runs once that ended (``False``)."""
        with self.directory.lock:
            waiting = self.releasing.get(object_id)
            if waiting is None:
                self.releasing[object_id] = []
                return True
            waiting.append(waiter)
            return False

    def released(self, object_id: str) -> None:
        """(Infrastructure thread.) ``object_id``'s release or claim anew has ended: what
        waited for it goes on, each on its own (one that raises is logged; the others
        still run: a review found one stop the rest)."""
        with self.directory.lock:
            waiting = self.releasing.pop(object_id, None)
        for then in waiting or ():
            try:
                then()
            except Exception:  # noqa: BLE001 - each waiter answers its own caller
                _log.exception("node %s: a claim waiting for %r failed", self.node_id,
                               object_id)  # fmt: skip

    def serves_instances(self) -> bool:
        """Whether an Instance Spot that closes here now is made again for the calls that
        meet it (``Closing._hold_calls``): not on a node that stops or fenced itself."""
        return not (self.stopping or self.fenced)

    def _held(self, act: SpotAct | ActorAct) -> OwnerLanes | None:
        """The lanes a closing Instance Spot holds calls in for its next activation, if
        ``act`` is one (``None`` also if it was read a moment before they were set: the
        call then takes the general way, which waits a close's step out)."""
        if act.state is CLOSING and type(act) is SpotAct and self.serves_instances():
            return act.held
        return None

    def _goes_again(self, act: SpotAct | ActorAct) -> bool:
        """Whether a call that met ``act``'s admission closed, or found it gone, goes again
        from the start: an Instance Spot of a node that serves, whose close (or an
        eviction's look, or the end of a close) changed its admission under the directory
        lock, waited out here first: it takes calls again (``READY``), holds them for its
        next activation (``CLOSING``), or that one has taken its place in the table."""
        if type(act) is not SpotAct or act.kind is not SpotKind.INSTANCE:
            return False
        if not self.serves_instances():
            return False
        with self.directory.lock:
            state, held, now = act.state, act.held, self.spots.get(act.spot_id)
            lanes_open = not act.owner.lanes.closed
        return (
            (state is READY and lanes_open)
            or (state is CLOSING and held is not None and not held.closed)
            or (state is GONE and now is not None and now is not act)
        )

    def _remote(
        self, call: MessageCall, reply: Completion | None, mode: WaitMode, hops: int,
        room: Admitted | None = None,
    ) -> Completion:  # fmt: skip
        """Forward ``call`` along this node's route to its target (stale routes relay onward).

        The route is read and the envelope sent under the router's route lock, which the
        relocator also takes when a target arrives here: a call either left before the target
        arrived or finds it local (per-sender FIFO; see ``zlink.runtime.routing``).
        """
        router = self.router
        assert router is not None
        if hops > MAX_HOPS:
            raise Unavailable(f"{call.target!r}: route relayed {hops} times; giving up")
        if call.wire is None:  # serialized before the route lock: senders hold it briefly
            call.wire = to_wire(call.msg)
            if len(call.wire[1]) > wire.FITS_ANY_FRAME or call.meta:  # (a relayed call
                wire.check_fits(call.wire[1], call.meta)  # fitted where it began)
        with router.route_lock:
            local = (self.actors if call.kind == _ACTOR else self.spots).get(call.target)
            if local is None:
                if reply is not None and reply.timer is None:
                    self.arm(reply, call.deadline, self._no_reply(call), not hops)
                try:
                    router.send_call(call, reply, hops, room)
                except ZLinkError as exc:  # unreachable, or no room to it: nothing was sent
                    if reply is not None:
                        reply.set(None, exc)
                    raise
                return reply  # type: ignore[return-value]
        return self.submit(call, reply, mode, hops, room=room)  # it arrived here meanwhile

    def subscribe(self, ref: SpotRef, topic: str, on: bool) -> None:
        """A Spot's subscription to ``topic`` on or off (``Directory.subscribe``). Only the
        incarnation ``ref`` names, living on this node, subscribes: a context whose Spot left
        (closed, moved away) gets ``Unavailable`` and unsubscribes nothing, so the table never
        lists a Spot that is not here, and never changes for an old context of a new Spot
        under the same id."""
        spot_id = ref.spot_id
        with self.directory.lock:
            act = self.spots.get(spot_id)
            gone = (
                act is None
                or act.state == GONE
                or act.ref.object_generation != ref.object_generation
            )
            if gone:
                if on:
                    raise Unavailable(f"spot {spot_id!r} no longer lives on node {self.node_id}")
                return
            self.directory.subscribe(spot_id, topic, on)
        if act is None or self.router is None:  # (off a mesh no event is numbered)
            return
        if on:  # (its marks on the topic: ``events``)
            self.events.subscribed(_marks(act), topic, self.node_id, self.incarnation)
        elif act.event_marks:
            self.events.unsubscribed(act.event_marks, topic)

    def events_caught_up(self, act: SpotAct) -> None:
        """``act`` opens after a move (arrived here, or back from one that did not happen,
        and maybe closing since): the Logical Multicast events it missed while sealed or away
        are counted now (``publish_missed_moving``; ``zlink.runtime.events``). No lock of
        rank PUBLISH or above held."""
        topics = self.directory.subscribed.get(act.spot_id)
        if not topics or self.router is None:
            return
        missed = self.events.catch_up(_marks(act), topics)
        if missed:
            self.metrics.add("publish_missed_moving", missed)

    def events_node_gone(self, node: str) -> None:
        """``node`` is gone for good (declared down, no later incarnation of it met): what
        was heard from it and every subscriber's marks of it go (``events``)."""
        self.events.forget_node(node)
        for act in list(self.spots.values()):
            forget_node(act.event_marks, node)

    def _publish(
        self, call: MessageCall, turn: Turn | None, origin: str | None,
        stamp: wire.EventStamp | None,
    ) -> None:  # fmt: skip
        """Fan a Logical Multicast event out to every subscribed Spot's queue. ``stamp``: its
        number on ``origin`` (that pair's lock held), so a subscriber that moved takes it
        once and counts what it missed (``zlink.runtime.events``); ``None`` off a mesh."""
        msg = call.msg
        topic = call.target
        size = lane_size(msg)
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        before = None if stamp is None else self.events.hear(origin, topic, stamp)  # type: ignore[arg-type]
        for spot_id in self.topics.get(topic, ()):
            act = self.spots.get(spot_id)
            state = GONE if act is None else act.state  # read once: a move's commit may open it
            if act is None or state in PAST_READY:  # closing, sealed for a move, gone
                if stamp is None or state is not SEALED:  # (sealed: its other copy may
                    self.metrics.add(f"publish_missed_{state.value}")  # reach it: ``events``)
                continue
            missed = 0
            if stamp is not None:
                missed = offered(act.event_marks, origin, topic, stamp, before)  # type: ignore[arg-type]
                if missed < 0:
                    self.metrics.add("publish_duplicates_dropped")
                    continue
            handler = act.spec.subscriptions.get(type(msg))
            if handler is None:
                self.metrics.add("publish_unhandled")
            else:
                job = MessageJob(act, handler, msg, None, call.meta, sender, size, topic)
                verdict = act.owner.put_app(job)
                if verdict == ADMISSION_CLOSED:  # sealed or closing since its state was read
                    now = act.state
                    if stamp is None or now is not SEALED:  # (a move: as above)
                        why = now if now in PAST_READY else SEALED
                        self.metrics.add(f"publish_missed_{why.value}")
                    continue
                if verdict != ADMITTED:  # its lane is full
                    self.metrics.add("publish_dropped")
            if stamp is not None:  # offered and accounted for
                if missed:
                    self.metrics.add("publish_missed_moving", missed)
                mark(_marks(act), origin, topic, stamp)  # type: ignore[arg-type]

    def submit_worker(self, call: WorkerCall[Any]) -> Completion:
        """Run ``call.fn`` on its bounded pool; the completion carries its result or error."""
        if self.stopping:
            raise Unavailable(f"node {self.node_id} is shutting down")
        pool = self.io_pool if call.pool == "io" else self.cpu_pool
        if not self.worker_slots.acquire(False):
            self.metrics.add("rejected_admissions")
            raise ResourceExhausted(f"{self.worker_limit} worker calls are already in flight")
        completion = Completion()
        run = WorkerRun(self, call.fn, call.args, call.kwargs, completion)
        if call.deadline is not None:
            completion.timer = self.infra.call_later(
                call.deadline,
                expire,
                completion,
                "the worker call took longer than its timeout",
                self._worker_timed_out,
            )
        with self.workers_idle:  # (then the pool's lock: abandon_workers never nests them)
            refused: ZLinkError = Unavailable(f"node {self.node_id} is shutting down")
            if not self.workers_closed:
                self.workers_in_flight += 1
                self.worker_runs.add(run)
                try:  # open: abandon_workers closes it only after workers_closed
                    pool.submit(run)
                    return completion
                except Exception as exc:  # noqa: BLE001 - no thread could start: not queued
                    self.workers_in_flight -= 1  # (an audit found it counted in flight for
                    self.worker_runs.discard(run)  # good, and run later all the same)
                    refused = ResourceExhausted(f"no worker thread could start: {exc}")
                    self.metrics.add("worker_threads_not_started")
        self.worker_slots.release()  # the node stopped since the check above, or no thread
        if completion.timer is not None:  # could start: nothing runs
            completion.timer.cancel()
        raise refused

    def worker_done(self, run: WorkerRun) -> None:
        """``run`` is over (or will never run): it is no longer in flight."""
        with self.workers_idle:
            self.worker_runs.discard(run)
            self.workers_in_flight -= 1
            if not self.workers_in_flight:
                self.workers_idle.notify_all()

    def wait_workers(self, timeout: float) -> bool:
        """Block until no worker call is in flight; ``False`` if ``timeout`` passed first."""
        with self.workers_idle:
            return self.workers_idle.wait_for(lambda: self.workers_in_flight == 0, timeout)

    def abandon_workers(self) -> None:
        """(Shutdown.) The io and cpu pools take nothing more, and every worker call still in
        flight fails at its waiter with ``Unavailable``, counted once: one never started is
        dropped (``worker_calls_discarded_at_shutdown``); one still running is abandoned to
        its daemon thread, its result dropped when it ends (``worker_calls_abandoned_at_
        shutdown``). A call whose waiter had given up already (its own timeout) is not counted
        again."""
        with self.workers_idle:
            self.workers_closed = True  # no call is submitted from now on (submit_worker)
        never = [*self.io_pool.shutdown(), *self.cpu_pool.shutdown()]
        unrun = self.at_stop(f"node {self.node_id} shut down before the worker call ran")
        discarded = functools.partial(self.metrics.add, "worker_calls_discarded_at_shutdown")
        for run in never:
            if isinstance(run, WorkerRun):
                self.worker_slots.release()
                run.completion.set(None, unrun, discarded)  # (counted before its waiter hears)
                self.worker_done(run)
        with self.workers_idle:
            running = list(self.worker_runs)
        left = self.at_stop(
            f"node {self.node_id} shut down; the worker call was abandoned still running"
        )
        abandoned = functools.partial(self.metrics.add, "worker_calls_abandoned_at_shutdown")
        for run in running:
            run.completion.set(None, left, abandoned)

    def at_stop(self, text: str) -> Unavailable:
        """An ``Unavailable`` the stop fails awaited calls with, each counted where it does
        so: a handler that awaited one and lets it through is neither a handler error nor
        a late reply (``finish_message``; a probe's stop counted one abandoned worker call
        three times)."""
        error = Unavailable(text)
        self.stop_errors.add(error)
        return error

    def _check_wait(self, turn: Turn | None, target: Act, mode: WaitMode) -> None:
        """§6: refuse a wait that needs the caller's own gate or its own Actor claim."""
        if turn is None or turn.owner is None or target.owner is None:
            return
        if mode == KEEP_TURN and target.owner.gate is turn.owner.gate:
            raise InvalidOperation(
                f"awaiting {target.name!r} from a turn that holds the gate it needs would wait on "
                "itself; use `await call.yield_()` in a SpotWide Spot's handler, or send without "
                "waiting"
            )
        if target.owner is turn.owner and turn.owner.claim_on_yield:
            raise InvalidOperation(
                f"actor {target.name!r} cannot wait on a request to itself: it keeps its Actor "
                "claim even across Yield"
            )

    def yield_begin(self) -> tuple[SpotAct, Turn] | None:
        """Count a Spot turn's Yield from before its call is submitted, until its continuation
        resumes (the all-lane barrier of a move or a close waits for none to be left, python-
        api §11); a member Actor's Yield counts on its Spot, whose barrier covers it."""
        turn = current_turn()
        act = turn.owner.ref if turn is not None and turn.owner is not None else None
        if isinstance(act, ActorAct):
            act = act.spot
        if turn is None or not isinstance(act, SpotAct):
            return None
        with self._yield_lock:
            if act.yielded is None:
                act.yielded = set()
            act.yielded.add(turn)
        if act.closing_overdue:  # a close past its deadline waits for no new suspension
            error = Cancelled(f"the close of {act.spot_id!r} passed its deadline")
            if self.stopping:  # the stop's own close: not the handler's fault
                self.stop_errors.add(error)
            turn.cancel(error)
        return act, turn

    def yield_end(self, token: tuple[SpotAct, Turn] | None) -> None:
        """The Yield's continuation resumed, on the gate (or its submission failed); the last
        one of its Spot runs what waits for the Spot to be quiet (``when_quiet``)."""
        if token is None:
            return
        act, turn = token
        with self._yield_lock:
            yielded = act.yielded
            if yielded is not None:
                yielded.discard(turn)
                if yielded:
                    return
                act.yielded = None  # an idle Spot keeps no empty set
            quiet, act.quiet = act.quiet, None
            if not quiet:
                return
        for then in quiet:
            then()

    def when_quiet(self, act: SpotAct, then: Callable[[], None]) -> bool:
        """Whether no turn of ``act`` or its members is suspended in a Yield; if one is,
        ``then()`` runs once none is (on the thread whose continuation resumed last)."""
        with self._yield_lock:
            if not act.yielded:
                return True
            if act.quiet is None:
                act.quiet = []
            act.quiet.append(then)
            return False

    def suspended_yields(self, act: SpotAct) -> list[Turn]:
        """The turns of ``act`` and its members suspended in a Yield now."""
        with self._yield_lock:
            return list(act.yielded or ())

    def check_yield(self, call: Any) -> None:
        """§3, §16: Yield only in SpotWide User Spot / Instance Spot owner turns."""
        turn = current_turn()
        if turn is None or turn.owner is None:
            raise InvalidOperation("yield_() is offered only inside a Spot or Actor turn")
        act = turn.owner.ref
        if not act.yield_ok:
            raise InvalidOperation(
                f"yield_() is not offered in {act.name!r}: only SpotWide User Spots, their "
                "member Actors and Instance Spots have a shared gate to release"
            )
        own = isinstance(call, MessageCall) and call.kind is _ACTOR
        if own and call.target == act.name:
            raise InvalidOperation(f"actor {act.name!r} cannot wait on a request to itself")

    def finish_message(self, job: SendJob, turn: Turn) -> None:
        """Post-processing of a message turn, before the gate moves on (§8)."""
        err = turn.error
        reply = job.reply
        if err is None:
            value = None
            if reply is not None:
                try:
                    value = check_reply(job.handler.reply_type, turn.result)
                except InvalidArgument as exc:  # a reply-encoding failure discards barriers
                    err = exc
            if err is None:
                self.close_scope(turn, True)
                if reply is not None and not reply.set(value, None):
                    self.metrics.add("late_replies")
                return
        self.close_scope(turn, False)
        if isinstance(err, Discarded):
            self.metrics.add("messages_discarded_at_shutdown")
            unrun = Unavailable(f"node {self.node_id} shut down before it ran")
            if reply is not None:
                reply.set(None, unrun)
            else:  # a peer's one-way message: counted there too (``discard_jobs``; a review
                origin = getattr(job, "origin", None)  # found this path told no one)
                if origin is not None and self.router is not None:
                    self.router.tell_dropped(origin, job.act.name, job.msg.zlink_type_name, unrun)
            return
        if self.ended_by_stop(err, f"handler {job.handler.fn.__qualname__} of {job.act.name!r}"):
            if reply is not None:  # (answered by the stop already, as a rule)
                reply.set(None, err)
            return
        self.metrics.add("handler_errors")
        if reply is not None:
            if not reply.set(None, handler_error(err)):
                self.metrics.add("late_replies")
        else:
            _log.error(
                "handler %s of %r failed", job.handler.fn.__qualname__, job.act.name, exc_info=err
            )

    def ended_by_stop(self, err: BaseException, what: str) -> bool:
        """Whether ``err``, which ended the turn of ``what`` (a handler, a timer), is the
        node's stop's own (identity): then it is no handler error. Cut short by the stop's
        close deadline (python-api §11), it is counted ``handlers_cancelled_at_stop`` and said
        at WARNING (an ERROR with a traceback alarmed operators on every rollout); any other
        (an abandoned worker call) was counted where the stop failed it."""
        if not (self.stopping and err in self.stop_errors):
            return False
        if isinstance(err, Cancelled):
            self.metrics.add("handlers_cancelled_at_stop")
            _log.warning("%s was cancelled by the stop: %s", what, err)
        return True

    # -- status ------------------------------------------------------------------------------------
    def type_statuses(self) -> list[TypeStatus]:
        """Per Spot and Actor type: handled, refused, waited and sampled handler latency."""
        with self.directory.lock:  # (then the stats' leaf lock) none counted live and gone
            live: list[Act] = [*self.spots.values(), *self.actors.values(),
                               *self.channels.values()]  # fmt: skip
            rows = self.directory.stats.rows(live)
        return [
            TypeStatus(kind=r.kind, type=r.type, live=r.live, handled=r.handled,
                       refused=r.refused, waited=r.waited, latency_samples=r.samples,
                       latency_sum=r.sum, latency_buckets=r.buckets,
                       latency_p50=r.quantile(0.5), latency_p99=r.quantile(0.99))
            for r in rows
        ]  # fmt: skip

    def owner_statuses(self) -> list[OwnerStatus]:
        """Every owner's lanes, gate and timers, read without stopping any turn."""
        now = self.clock.now()
        out: list[OwnerStatus] = []

        def details(timers: list[Timer]) -> list[TimerStatus]:
            return [
                TimerStatus(name=t.name, interval=t.interval, next_due_in=t.next_due - now,
                            sequence=t.sequence, late_ticks=t.late_ticks, queued=t.queued)
                for t in sorted(timers, key=lambda t: t.name)
            ]  # fmt: skip

        def add(owner: Owner, kind: str, type_: str, state: ActState, timers: list[Timer]) -> None:
            lanes = owner.lanes
            ai, ab, li, lb = lanes.reserved()
            gate = owner.gate
            age = None if gate.running is None else max(0.0, now - gate.running_since)
            app = owner.lanes.app
            try:
                first = app[0] if app else None  # a peek; the gate may pop it meanwhile
                oldest = max(0.0, now - first.at) if first is not None and first.at else None
            except (IndexError, AttributeError):
                oldest = None
            out.append(
                OwnerStatus(
                    owner=owner.name,
                    kind=kind,
                    type=type_,
                    state=state.value,
                    app_items=ai,
                    app_bytes=ab,
                    lifecycle_items=li,
                    lifecycle_bytes=lb,
                    gate_busy=gate.busy,
                    running_turn_age=age,
                    oldest_item_age=oldest,
                    held=owner.held,
                    timers=[t.name for t in timers],
                    timer_details=details(timers),
                    waiters=lanes.waiting(),
                    waited=lanes.waited,
                    refused=lanes.refused,
                )
            )

        for act in list(self.spots.values()):
            own = list(act.timers.values())
            add(act.owner, "spot", act.spec.name, act.state, own)
            for timer in own:
                if timer.owner is not act.owner:
                    add(timer.owner, "timer", act.spec.name, act.state, [timer])
        for actor in list(self.actors.values()):
            add(actor.owner, "actor", actor.spec.name, actor.state, list(actor.timers.values()))
        for channel in list(self.channels.values()):  # (a gate and lanes of its own too)
            add(channel.owner, "channel", channel.spec.name, channel.state, [])
        return out


class WorkerRun:
    """One worker call in flight: run once on its pool thread (``__call__``), or failed at
    shutdown by ``Runtime.abandon_workers`` (never started, or left running)."""

    __slots__ = ("args", "completion", "fn", "kwargs", "rt")

    def __init__(
        self, rt: Runtime, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
        completion: Completion,
    ) -> None:  # fmt: skip
        self.rt = rt
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.completion = completion

    def __call__(self) -> None:
        rt = self.rt
        try:
            result, error = self.fn(*self.args, **self.kwargs), None
        except BaseException as exc:  # noqa: BLE001 - the caller receives it as is
            result, error = None, exc
        # the slot first: whoever sees the result may start the next call at once
        rt.worker_slots.release()
        try:
            if not self.completion.set(result, error) and not rt.stopping:  # its timeout
                rt.metrics.add("worker_results_late")  # came first: dropped, counted (§5;
                if error is not None:  # an audit found it dropped without a trace); one the
                    _log.warning("a worker call's late outcome was dropped (its caller's "
                                 "timeout came first): %r", error)  # fmt: skip
        finally:  # (a stop abandoned: counted there)
            rt.worker_done(self)


def _marks(act: SpotAct) -> Marks:
    """``act``'s Logical Multicast marks, made on first use (``events``)."""
    marks = act.event_marks
    if marks is None:
        marks = act.event_marks = {}
    return marks
