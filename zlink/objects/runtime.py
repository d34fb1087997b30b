"""The object model on one node: activations, routing, create, Join and leave.

This is the layer between the public calls (``zlink.messaging``) and the engine
(``zlink.executor``). It owns the directory of live Spots, Actors and Channels and turns each
call into a job on the right owner lane (execution-model §2: an Actor payload always goes to the
Actor's own queue, whatever the mode).

Guarantees / assumes:
* ``_lock`` guards directory *writes* (activation, removal); reads are plain ``dict.get``.
* Gates: a SpotWide User Spot and an Instance Spot have one gate for the Spot, its member Actors
  and its lifecycle callbacks; an Entry Spot and a PerActor User Spot have a gate for the Spot,
  and each Actor keeps its own gate (§2). Membership changes only while the Actor is held.
* Every refusal (self-wait, Yield where not offered, bad target, full lane, stopping node) is
  raised before any queue changes (§6, §16).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    Cancelled,
    HandlerError,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import Gate, Job, Owner, OwnerLanes, Turn, current_turn, run_free, run_turns
from ..executor.lanes import (
    ADMISSION_CLOSED,
    ADMITTED,
    APPLICATION,
    FULL_COUNT,
    LIFECYCLE,
    UNRESERVED,
    LaneLimits,
)
from ..executor.turn import CLOSED
from ..mesh.location import Location
from ..mesh.router import _MAX_HOPS, MeshRouter

if TYPE_CHECKING:
    from .relocate import Relocator
    from .remote_join import RemoteJoin
from ..messaging.calls import (
    HELP,
    KEEP,
    NO_WAIT,
    YIELD,
    BatchSendCall,
    CreateCall,
    JoinCall,
    MessageCall,
    RelocationReadyCall,
    SendCall,
    WorkerCall,
)
from ..messaging.completion import Completion, expire
from ..messaging.context import (
    ActorContext,
    ChannelContext,
    EntrySpotContext,
    InstanceSpotContext,
    MessageContext,
    SpotContext,
)
from ..messaging.message import check_reply, wire_size
from ..status import OwnerStatus
from ..timers import Timer, TimerManager, TimerOptions
from .base import (
    ActorCreateResponse,
    ActorCreateResult,
    ActorJoinCompletion,
    ActorJoinResult,
    RelocationReadyStatus,
    SpotCloseReason,
    SpotClosingContext,
    SpotCreateResponse,
    SpotCreateResult,
    SpotKind,
    SpotRef,
    SpotRelocationReadyCompletion,
)
from .metrics import Metrics

if TYPE_CHECKING:
    from ..app import App, TypeSpec
    from ..executor import Clock, InfraExecutor, WorkerPool
    from ..handlers import HandlerSpec
    from ..messaging.message import Message

_log = logging.getLogger("zlink.runtime")

# SEALED (relocating) and CLOSING refuse admission; only READY and ACTIVATING admit
ACTIVATING, READY, SEALED, CLOSING, GONE = 0, 1, 2, 3, 4


class Discarded(Exception):
    """Internal: a queued job met a stopping node and never ran its handler."""


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------
class ObjectAct:
    """What Spot and Actor activations share: timers and the last time they did work."""

    __slots__ = ("activity", "authority", "idle_since", "restored", "seen_activity", "timers")
    rt: Runtime
    instance: Any
    spec: TypeSpec
    owner: Owner
    state: int
    context: Any

    def _init_object(self) -> None:
        self.timers: dict[str, Timer] = {}
        self.authority = 1  # AuthorityOwnerGeneration in the Location Store (fencing only)
        # a relocation target, restored and held until its commit: the source's node id
        self.restored: str | None = None
        self.activity = self.seen_activity = 0  # handled messages; idle eviction compares them
        self.idle_since = self.rt.clock.now()
        self.context.timers = TimerManager(self)

    @property
    def name(self) -> str:
        raise NotImplementedError

    def touch(self) -> None:
        """Record activity (idle eviction reads it); only the owner's gate holder calls it."""
        self.activity += 1

    def timer_owner(self, name: str) -> Owner:
        """Where this object's timer ticks queue (§2): its own lanes, unless PerActor."""
        return self.owner

    def add_timer(
        self, name: str, interval: float, options: TimerOptions, first_delay: float | None
    ) -> Timer:
        fn = self.spec.timer_handlers.get(name)
        if fn is None:
            raise InvalidArgument(f"{self.spec.name!r} has no @timer_handler({name!r})")
        if name in self.timers:
            raise InvalidOperation(f"timer {name!r} of {self.name!r} is already registered")
        if self.state > READY or self.rt.stopping:
            raise Unavailable(f"{self.name!r} is sealed, closing or closed")
        delay = interval if first_delay is None else first_delay
        timer = Timer(
            name, interval, options, self, self.timer_owner(name), fn, self.rt.clock.now() + delay
        )
        self.timers[name] = timer
        timer.arm()
        return timer

    def cancel_timer(self, name: str) -> bool:
        timer = self.timers.pop(name, None)
        if timer is None:
            return False
        timer.cancel()
        return True

    def cancel_timers(self) -> None:
        for name in list(self.timers):
            self.cancel_timer(name)


class SpotAct(ObjectAct):
    """One live Spot: its gate, its own lanes, its instance and its members."""

    __slots__ = (
        "activated",
        "closing_turn",
        "context",
        "gate",
        "instance",
        "kind",
        "members",
        "owner",
        "ref",
        "rt",
        "shared",
        "spec",
        "spot_id",
        "state",
        "yield_ok",
        "yields_out",
    )

    def __init__(self, rt: Runtime, spec: TypeSpec, spot_id: str, generation: int) -> None:
        from ..app import ExecutionMode

        self.rt = rt
        self.spec = spec
        self.spot_id = spot_id
        assert spec.kind is not None
        self.kind: SpotKind = spec.kind
        self.gate = rt.new_gate(spot_id)
        self.owner = Owner(OwnerLanes(rt.limits), self.gate, spot_id, claim_on_yield=False)
        self.owner.ref = self
        self.instance: Any = None
        self.state = ACTIVATING
        self.closing_turn: Turn | None = None  # a running on_closing, cancelled at its deadline
        self.yields_out = 0  # Yields whose completion has not arrived (relocation barrier)
        self.ref = SpotRef(spot_id, generation, rt.mesh, rt.node_id)
        self.members: dict[str, ActorAct] = {}
        # set when on_create / on_initialize have finished, then dropped (idle Spots keep none)
        self.activated: Completion | None = Completion()
        # §2/§3: one shared gate, and Yield, only in SpotWide User Spots and Instance Spots
        self.shared = self.kind is SpotKind.INSTANCE or (
            self.kind is SpotKind.USER and spec.mode is ExecutionMode.SPOT_WIDE
        )
        self.yield_ok = self.shared
        ctx_cls = {
            SpotKind.USER: SpotContext,
            SpotKind.ENTRY: EntrySpotContext,
            SpotKind.INSTANCE: InstanceSpotContext,
        }[self.kind]
        self.context = ctx_cls(rt, spot_id, self.ref, self.kind)
        self._init_object()

    def timer_owner(self, name: str) -> Owner:
        """A PerActor User Spot gives each of its timers a gate of its own (§2)."""
        if self.kind is SpotKind.USER and not self.shared:
            gate = self.rt.new_gate(f"{self.spot_id}/timer:{name}")
            owner = Owner(OwnerLanes(self.rt.limits), gate, gate.name, claim_on_yield=False)
            owner.ref = self
            return owner
        return self.owner

    @property
    def name(self) -> str:
        return self.spot_id


class ActorAct(ObjectAct):
    """One live Actor: its own lanes (always, §2), its own gate and its current Spot."""

    __slots__ = (
        "activated",
        "actor_id",
        "context",
        "entry",
        "instance",
        "own_gate",
        "owner",
        "rt",
        "spec",
        "spot",
        "state",
    )

    def __init__(self, rt: Runtime, spec: TypeSpec, actor_id: str, entry: SpotAct) -> None:
        self.rt = rt
        self.spec = spec
        self.actor_id = actor_id
        self.entry = entry
        self.spot = entry
        self.own_gate = rt.new_gate(actor_id)
        self.owner = Owner(
            OwnerLanes(rt.limits), self.own_gate, actor_id, claim_on_yield=True, held=True
        )
        self.owner.ref = self
        self.instance: Any = None
        self.context = ActorContext(rt, actor_id, spec.name)
        self.state = ACTIVATING
        self.activated: Completion | None = Completion()
        self._init_object()

    @property
    def yield_ok(self) -> bool:
        """A member Actor of a SpotWide User Spot may Yield; elsewhere it may not (§3)."""
        return self.spot.shared

    @property
    def name(self) -> str:
        return self.actor_id


class ChannelAct:
    """A Channel: one stateless instance; every request is its own turn with no gate."""

    __slots__ = ("context", "instance", "owner", "rt", "spec")

    def __init__(self, rt: Runtime, spec: TypeSpec) -> None:
        self.rt = rt
        self.spec = spec
        self.context = ChannelContext(rt, spec.name)
        self.instance = spec.cls(self.context)
        self.owner = None

    @property
    def name(self) -> str:
        return self.spec.name


Act = SpotAct | ActorAct | ChannelAct


# --------------------------------------------------------------------------------------------
# jobs
# --------------------------------------------------------------------------------------------
class MessageJob(Job):
    """An application message (one-way or request) for one handler."""

    __slots__ = ("act", "handler", "meta", "msg", "reply", "sender", "topic")

    def __init__(
        self,
        act: Act,
        handler: HandlerSpec,
        msg: Message,
        reply: Completion | None,
        meta: dict[str, str] | None,
        sender: str | None,
        size: int,
        topic: str | None = None,
    ) -> None:
        self.lane = APPLICATION
        self.at = 0.0
        self.topic = topic
        self.size = size
        self.act = act
        self.handler = handler
        self.msg = msg
        self.reply = reply
        self.meta = meta
        self.sender = sender

    def invoke(self) -> Any:
        act = self.act
        if act.rt.stopping:
            raise Discarded
        if act.owner is not None:
            act.activity += 1  # idle eviction; only the gate holder writes it
        h = self.handler
        if h.wants_context:
            ctx = MessageContext(self.meta or {}, self.sender, h.is_request, self.topic)
            return h.fn(act.instance, self.msg, ctx)
        return h.fn(act.instance, self.msg)

    def finish(self, turn: Turn) -> None:
        if self.reply is None and turn.error is None and turn.barriers is None:
            turn.barriers = CLOSED  # the common case: a one-way message that ended normally
            return
        self.act.rt.finish_message(self, turn)

    def discard(self, error: BaseException) -> None:
        if self.reply is not None:
            self.reply.set(None, error)


class BatchJob(Job):
    """Messages of one batch send (python-api ``send_many_*``): one queue entry that reserves
    one lane item per message and runs them back to back, each as a turn of its own (its own
    Defer() scope, error and current turn) with nothing of the same owner in between. Only
    plain ``def`` handlers and one-way messages; anything else is queued message by message."""

    __slots__ = ("act", "count", "msgs", "sender")

    def __init__(self, act: SpotAct | ActorAct, msgs: list[tuple[HandlerSpec, Message]],
                 sender: str | None, size: int) -> None:  # fmt: skip
        self.lane = APPLICATION
        self.size = size
        self.at = 0.0
        self.act = act
        self.msgs = msgs
        self.count = len(msgs)
        self.sender = sender

    def invoke(self) -> Any:
        act = self.act
        rt = act.rt
        outer = current_turn()
        instance = act.instance
        sender = self.sender
        calls = [
            (h.fn, (instance, msg, MessageContext({}, sender, False, None)))
            if h.wants_context else (h.fn, (instance, msg))
            for h, msg in self.msgs
        ]  # fmt: skip
        act.activity += len(calls)
        run_turns(self, outer.owner if outer is not None else None, calls, self._after,
                  lambda: rt.stopping)  # fmt: skip
        if rt.stopping:
            raise Discarded  # the rest never ran
        return None

    def _after(self, turn: Turn) -> None:
        error = turn.error
        if turn.barriers is not None or error is not None:
            self.act.rt.close_scope(turn, error is None)
        else:
            turn.barriers = CLOSED
        if error is not None:
            self.act.rt.metrics.add("handler_errors")
            _log.error("a batch handler of %r failed", self.act.name, exc_info=error)

    def finish(self, turn: Turn) -> None:
        turn.barriers = CLOSED  # each message closed its own scope

    def messages(self) -> list[MessageJob]:
        """The batch as single message jobs (a relocation moves them one by one)."""
        out = []
        for handler, msg in self.msgs:
            job = MessageJob(self.act, handler, msg, None, None, self.sender, 0)
            job.size, job.at = wire_size(msg), self.at
            out.append(job)
        return out


class LifeJob(Job):
    """A lifecycle callback (or a framework step) on an owner's lifecycle lane (§7)."""

    __slots__ = ("act", "done", "fn", "what")

    def __init__(
        self,
        act: Act,
        what: str,
        fn: Callable[[], Any],
        done: Callable[[Turn], None] | None = None,
        lane: int = LIFECYCLE,
    ) -> None:
        self.lane = lane
        self.size = 0
        self.at = 0.0
        self.act = act
        self.what = what
        self.fn = fn
        self.done = done

    def invoke(self) -> Any:
        return self.fn()

    def finish(self, turn: Turn) -> None:
        rt = self.act.rt
        rt.close_scope(turn, turn.error is None)
        if self.done is not None:
            self.done(turn)
        elif turn.error is not None:
            rt.metrics.add("handler_errors")
            _log.error("%s of %s failed", self.what, self.act.name, exc_info=turn.error)

    def discard(self, error: BaseException) -> None:
        if self.done is not None:
            fake = Turn(self, None)
            fake.error = error
            self.done(fake)


class _ReadyBoundary:
    """The barrier ``relocation_ready().defer()`` registers: a waiting move starts here,
    else the Spot is told it continues."""

    __slots__ = ("act", "rt")

    def __init__(self, rt: Runtime, act: SpotAct) -> None:
        self.rt = rt
        self.act = act

    def __call__(self) -> None:
        relocator = self.rt.relocator
        if relocator is None or not relocator.signaled(self.act):
            self.rt.relocation_ready_completed(self.act, RelocationReadyStatus.CONTINUED)


async def _chain(*steps: Callable[[], Any]) -> Any:
    """Run callbacks in order within one turn, awaiting those that are coroutines."""
    out: Any = None
    for step in steps:
        out = step()
        if isinstance(out, Coroutine):
            out = await out
    return out


def _error_of(exc: BaseException) -> HandlerError:
    err = HandlerError(type(exc).__qualname__, str(exc))
    err.__cause__ = exc
    return err


# --------------------------------------------------------------------------------------------
# the runtime
# --------------------------------------------------------------------------------------------
class Runtime:
    """The directory and the routing of one node."""

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
        pool: WorkerPool,
        infra: InfraExecutor,
        closing_timeout: float = 5.0,
        idle_timeout: float | None = None,
        io_pool: ThreadPoolExecutor | None = None,
        cpu_pool: ThreadPoolExecutor | None = None,
        worker_limit: int = 1024,
    ) -> None:
        self.app = app
        self.node_id = node_id
        self.mesh = mesh
        self.limits = limits
        self.budget = budget
        self.request_timeout = request_timeout
        self.closing_timeout = closing_timeout
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._now = clock.now
        self.pool = pool
        self.infra = infra
        self.io_pool = io_pool or ThreadPoolExecutor(16, thread_name_prefix="zlink-io")
        self.cpu_pool = cpu_pool or ThreadPoolExecutor(pool.size, thread_name_prefix="zlink-cpu")
        self.worker_limit = worker_limit
        self.worker_slots = threading.BoundedSemaphore(worker_limit)
        self.workers_in_flight = 0
        self.workers_idle = threading.Condition(threading.Lock())
        self.metrics = Metrics()
        self.spots: dict[str, SpotAct] = {}
        self.actors: dict[str, ActorAct] = {}
        self.channels: dict[str, ChannelAct] = {}
        self.entries: dict[str, SpotAct] = {}  # actor type -> its Entry Spot
        self.topics: dict[str, frozenset[str]] = {}  # topic -> subscribed Spot ids (copy on write)
        self.router: MeshRouter | None = None  # set when the node is part of a mesh
        self.relocator: Relocator | None = None
        self.remote_join: RemoteJoin | None = None
        self._yield_lock = threading.Lock()
        self.stopping = False  # read on the hot path
        self.draining = False  # drained: calls made here are refused; relayed calls go on
        self.stopped_admission = threading.Event()  # for those who must wait for it
        self._lock = threading.Lock()
        self._generations = itertools.count(1)
        instance_types = [s.name for s in app.spots.values() if s.kind is SpotKind.INSTANCE]
        self._only_instance_type = instance_types[0] if len(instance_types) == 1 else None

    def new_gate(self, name: str) -> Gate:
        return Gate(self.pool, self.clock, self.budget, name)

    # -- start --------------------------------------------------------------------------------
    def start(self) -> list[Completion]:
        """Make the Channels and Entry Spots; returns the Entry Spots' activations to wait on."""
        for spec in self.app.channels.values():
            self.channels[spec.name] = ChannelAct(self, spec)
        waits = []
        for spec in self.app.spots.values():
            if spec.kind is SpotKind.ENTRY:
                act = self._register_spot(spec, f"{spec.name}@{self.node_id}")
                assert spec.actor_type is not None
                self.entries[spec.actor_type] = act
                activated = act.activated  # taken first: activation drops it once done
                assert activated is not None
                waits.append(activated)
                self._activate(act, None)
        if self.idle_timeout is not None:
            self.infra.call_later(self.idle_timeout / 4, self.sweep_idle)
        return waits

    # -- messages -------------------------------------------------------------------------------
    def submit(
        self,
        call: MessageCall,
        reply: Completion | None,
        mode: int,
        hops: int = 0,
        force: bool = False,
    ) -> Completion:
        """Route a send or request; raises before any queue change when it cannot be taken.

        A target this node does not have is routed to its owner (when the node is part of a
        mesh; ``hops`` counts relays). A target sealed for relocation keeps the call for the
        new owner, and a relocation target holds it until authority is committed, so nothing
        accepted is refused or reordered by a move (``force``: the relocator's own refill).
        """
        if (self.stopping or self.draining) and not (hops and self.router is not None):
            raise Unavailable(f"node {self.node_id} is shutting down")  # a drained node relays
        if call.mesh is not None and call.mesh != self.mesh:
            raise NotFound(f"mesh {call.mesh!r} is not reachable from node {self.node_id}")
        turn = current_turn()
        msg = call.msg
        act: Act | None
        if call.kind == "topic":
            self._publish(call, turn)
            return reply  # type: ignore[return-value]
        if call.kind == "channel":
            act = self.channels.get(call.target)
            if act is None:
                raise NotFound(f"no channel {call.target!r}")
        elif call.kind == "actor":
            act = self.actors.get(call.target)
            if act is None:
                if self.router is not None:
                    return self._remote(call, reply, mode, hops)
                raise NotFound(f"no actor {call.target!r}")
            if act.state > READY and not force and not (act.restored and call.via == act.restored):
                return self._not_ready(act, call, reply, mode, hops)
        else:
            act = self.spots.get(call.target)
            if act is None:
                if self.router is not None and not call.instance:
                    return self._remote(call, reply, mode, hops)
                if not call.instance:
                    raise NotFound(f"no spot {call.target!r}")
            elif (
                act.state > READY and not force and not (act.restored and call.via == act.restored)
            ):
                return self._not_ready(act, call, reply, mode, hops)
            elif call.instance and act.kind is not SpotKind.INSTANCE:
                raise InvalidArgument(f"spot {call.target!r} is not an Instance Spot")
        spec = act.spec if act is not None else self._instance_spec(call)
        handler = spec.handlers.get(type(msg))
        if handler is None:
            raise InvalidArgument(f"{spec.name!r} has no handler for {type(msg).__qualname__}")
        if mode in (KEEP, YIELD) and act is not None:
            self._check_wait(turn, act, mode)
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        if act is None:  # an Instance Spot's first message activates it (cold activation)
            generation = None
            if self.router is not None:  # only the owner the store confirms runs the factory
                held = self.router.store.reserve(
                    call.target, "spot", spec.name, self.node_id, self._lease()
                )
                if held.location.owner != self.node_id:
                    return self._remote(call, reply, mode, hops)
                generation = held.location.object_generation
            act = self._activate_instance(spec, call.target, generation)
        job = MessageJob(act, handler, msg, reply, call.meta, sender, 0)
        job.at = self._now()
        if reply is not None and reply.timer is None:  # a diverted call was armed already
            self._arm(reply, call.deadline, "no reply in time")
        owner = act.owner
        if owner is None:  # a Channel: each request is its own turn on any worker
            run_free(job, self.pool, inline=mode == HELP)
            return reply  # type: ignore[return-value]
        job.size = wire_size(msg)
        helped = None
        if mode == HELP:
            verdict, helped = owner.put_app_and_claim(job)
        else:
            verdict = owner.put_app(job)
        if verdict != ADMITTED:
            if reply is not None and reply.timer is not None:
                reply.timer.cancel()
            if verdict == ADMISSION_CLOSED and not force:  # sealed after the state check
                assert not isinstance(act, ChannelAct)  # a Channel has no lanes to close
                return self._not_ready(act, call, reply, mode, hops)
            if verdict == ADMISSION_CLOSED:
                raise Unavailable(f"{act.name!r} is sealed (closing or relocating)")
            self.metrics.add("rejected_admissions")
            what = "items" if verdict == FULL_COUNT else "bytes"
            raise ResourceExhausted(
                f"the application lane of {act.name!r} is full ({what}); nothing was queued"
            )
        if helped is not None:  # the gate was idle: this blocking caller runs it (§10)
            assert reply is not None
            helped.help(lambda: reply.done)
        return reply  # type: ignore[return-value]

    def _lease(self) -> float:
        return self.clock.now() + 3600.0  # no failure detection yet: leases are long

    def submit_many(self, call: BatchSendCall) -> None:
        """The batch send path: a local, ready target admits every message behind one lock
        (all or none) and is woken once; each message is still its own turn, in order.
        Anything else (remote, moving, a Channel) goes one by one through ``submit``."""
        if self.stopping or self.draining:
            raise Unavailable(f"node {self.node_id} is shutting down")
        act = (self.actors if call.kind == "actor" else self.spots).get(call.target)
        if act is None or act.state > READY:
            self._one_by_one(call)
            return
        turn = current_turn()
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        handlers = act.spec.handlers
        items = []
        total = 0
        inline = True
        for msg in call.msgs:
            handler = handlers.get(type(msg))
            if handler is None:
                raise InvalidArgument(
                    f"{act.spec.name!r} has no handler for {type(msg).__qualname__}; "
                    "nothing of the batch was queued"
                )
            inline = inline and not handler.is_async
            total += wire_size(msg)
            items.append((handler, msg))
        if not inline:  # an async handler suspends: its message must be a turn of its own
            self._one_by_one(call)
            return
        job = BatchJob(act, items, sender, total)
        job.at = self._now()
        verdict = act.owner.put_app_many(job)
        if verdict == ADMITTED:
            return
        if verdict == ADMISSION_CLOSED:  # sealed meanwhile: the moving path, in order
            self._one_by_one(call)
            return
        self.metrics.add("rejected_admissions")
        raise ResourceExhausted(
            f"the application lane of {act.name!r} has no room for {len(items)} messages; "
            "nothing of the batch was queued"
        )

    def _one_by_one(self, call: BatchSendCall) -> None:
        for msg in call.msgs:
            self.submit(SendCall(self, call.kind, call.target, msg), None, NO_WAIT)

    def _not_ready(
        self, act: SpotAct | ActorAct, call: MessageCall, reply: Completion | None, mode: int,
        hops: int,
    ) -> Completion:  # fmt: skip
        """A sealed, moving or restoring target: the relocator keeps the call, or it is gone
        (routed on), or it is closing (refused before any queue change)."""
        relocator = self.relocator
        if reply is not None and reply.timer is not None:
            reply.timer.cancel()  # armed for an admission that did not happen
            reply.timer = None
        if relocator is not None:
            if reply is not None:
                self._arm(reply, call.deadline, "no reply in time")
            if relocator.divert(act, call, reply, hops):
                return reply  # type: ignore[return-value]
            if reply is not None and reply.timer is not None:
                reply.timer.cancel()
                reply.timer = None
        if act.state == GONE or act.state <= READY:  # moved or reopened meanwhile: go again
            return self.submit(call, reply, mode, hops)
        raise Unavailable(f"{call.kind} {call.target!r} is sealed (closing or relocating)")

    def _remote(
        self, call: MessageCall, reply: Completion | None, mode: int, hops: int
    ) -> Completion:
        """Forward ``call`` along this node's route to its target (stale routes relay onward).

        The route is read and the envelope sent under the router's route lock, which the
        relocator also takes when a target arrives here: a call either left before the target
        arrived or finds it local (per-sender FIFO; see ``zlink.mesh.router``).
        """
        router = self.router
        assert router is not None
        if hops > _MAX_HOPS:
            raise Unavailable(f"{call.target!r}: route relayed {hops} times; giving up")
        with router.route_lock:
            local = (self.actors if call.kind == "actor" else self.spots).get(call.target)
            if local is None:
                if reply is not None and reply.timer is None:
                    self._arm(reply, call.deadline, "no reply in time")
                try:
                    sent = router.send_call(call, reply, hops)
                except Unavailable as exc:  # the next node is unreachable: nothing was sent
                    if reply is not None:
                        reply.set(None, exc)
                    raise
                if not sent:
                    if reply is not None:
                        reply.set(None, NotFound(f"no {call.kind} {call.target!r}"))
                    raise NotFound(f"no {call.kind} {call.target!r}")
                return reply  # type: ignore[return-value]
        return self.submit(call, reply, mode, hops)  # it arrived here meanwhile

    def has_live(self, target: str) -> bool:
        """Whether a Spot or Actor ``target`` lives on this node (in any state but gone)."""
        act = self.spots.get(target) or self.actors.get(target)
        return act is not None and act.state != GONE

    def subscribe(self, spot_id: str, topic: str, on: bool) -> None:
        with self._lock:
            ids = set(self.topics.get(topic, ()))
            if on:
                ids.add(spot_id)
            else:
                ids.discard(spot_id)
            if ids:
                self.topics[topic] = frozenset(ids)
            else:
                self.topics.pop(topic, None)

    def _publish(self, call: MessageCall, turn: Turn | None) -> None:
        """Fan a Logical Multicast event out to every subscribed Spot's queue."""
        msg = call.msg
        size = wire_size(msg)
        sender = turn.owner.name if turn is not None and turn.owner is not None else None
        for spot_id in self.topics.get(call.target, ()):
            act = self.spots.get(spot_id)
            if act is None or act.state > READY:
                continue
            handler = act.spec.subscriptions.get(type(msg))
            if handler is None:
                self.metrics.add("publish_unhandled")
                continue
            job = MessageJob(act, handler, msg, None, call.meta, sender, size, call.target)
            if act.owner.put_app(job) != ADMITTED:
                self.metrics.add("publish_dropped")

    def submit_worker(self, call: WorkerCall[Any]) -> Completion:
        """Run ``call.fn`` on its bounded pool; the completion carries its result or error."""
        if self.stopping:
            raise Unavailable(f"node {self.node_id} is shutting down")
        pool = self.io_pool if call.pool == "io" else self.cpu_pool
        if not self.worker_slots.acquire(False):
            self.metrics.add("rejected_admissions")
            raise ResourceExhausted(f"{self.worker_limit} worker calls are already in flight")
        with self.workers_idle:
            self.workers_in_flight += 1
        completion = Completion()
        if call.deadline is not None:
            completion.timer = self.infra.call_later(
                call.deadline,
                expire,
                completion,
                "the worker call took longer than its timeout",
            )
        fn, args, kwargs = call.fn, call.args, call.kwargs

        def run() -> None:
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - the caller receives it as is
                completion.set(None, exc)
            else:
                completion.set(result, None)
            finally:
                self.worker_slots.release()
                with self.workers_idle:
                    self.workers_in_flight -= 1
                    if not self.workers_in_flight:
                        self.workers_idle.notify_all()

        pool.submit(run)
        return completion

    def _check_wait(self, turn: Turn | None, target: Act, mode: int) -> None:
        """§6: refuse a wait that needs the caller's own gate or its own Actor claim."""
        if turn is None or turn.owner is None or target.owner is None:
            return
        if mode == KEEP and target.owner.gate is turn.owner.gate:
            raise InvalidOperation(
                f"awaiting {target.name!r} from a turn that holds the gate it needs would wait on "
                "itself; use `await call.yield_()` in a SpotWide Spot, or send without waiting"
            )
        if target.owner is turn.owner and turn.owner.claim_on_yield:
            raise InvalidOperation(
                f"actor {target.name!r} cannot wait on a request to itself: it keeps its Actor "
                "claim even across Yield"
            )

    def yield_begin(self) -> SpotAct | None:
        """Count a Spot turn's Yield from before its call is submitted (relocation barrier);
        a member Actor's Yield counts on its Spot, whose barrier covers it."""
        turn = current_turn()
        act = turn.owner.ref if turn is not None and turn.owner is not None else None
        if isinstance(act, ActorAct):
            act = act.spot
        if not isinstance(act, SpotAct):
            return None
        with self._yield_lock:
            act.yields_out += 1
        return act

    def yield_end(self, act: SpotAct | None) -> None:
        """The Yield's completion arrived (or its submission failed)."""
        if act is not None:
            with self._yield_lock:
                act.yields_out -= 1

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
        if isinstance(call, MessageCall) and call.kind == "actor" and call.target == act.name:
            raise InvalidOperation(f"actor {act.name!r} cannot wait on a request to itself")

    def finish_message(self, job: MessageJob, turn: Turn) -> None:
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
            if reply is not None:
                reply.set(None, Unavailable(f"node {self.node_id} shut down before it ran"))
            return
        self.metrics.add("handler_errors")
        if reply is not None:
            if not reply.set(None, _error_of(err)):
                self.metrics.add("late_replies")
        else:
            _log.error(
                "handler %s of %r failed", job.handler.fn.__qualname__, job.act.name, exc_info=err
            )

    # -- Defer() barriers ------------------------------------------------------------------------
    def close_scope(self, turn: Turn, normal: bool) -> None:
        """End a turn's Defer() scope: run its barriers on a normal end, else discard them."""
        barriers, turn.barriers = turn.barriers, CLOSED
        if normal and barriers and barriers is not CLOSED:
            for barrier in barriers:
                barrier()

    def defer_join(self, call: JoinCall) -> None:
        turn = current_turn()
        if turn is None or call.turn is not turn or turn.barriers is CLOSED:
            raise InvalidOperation("defer() is allowed only in the handler that made the call")
        actor = self.actors.get(call.actor_id)
        if actor is None or actor.state != READY:
            raise NotFound(f"no actor {call.actor_id!r}")
        if turn.owner is not actor.owner and turn.owner is not actor.entry.owner:
            raise InvalidOperation("only the Actor or its Entry Spot may defer its Join")
        if turn.barriers is None:
            turn.barriers = []
        turn.barriers.append(partial(self._join_hold, actor, call.target, call.request_msg))

    # -- APPLICATION_SIGNALED relocation boundaries ---------------------------------------------
    def defer_relocation_ready(self, call: RelocationReadyCall) -> None:
        """``relocation_ready().defer()``: checks first (kotlin-spot-interface), then a barrier."""
        from ..app import ExecutionMode, RelocationCoordination

        turn = current_turn()
        if turn is None or call.turn is not turn or turn.barriers is CLOSED:
            raise InvalidOperation("relocation_ready().defer() belongs in the Spot turn made it")
        act = turn.owner.ref if turn.owner is not None else None
        if not isinstance(act, SpotAct) or act.spot_id != call.spot_id:
            raise InvalidOperation("relocation_ready().defer() runs only in a turn of the Spot")
        if act.kind is not SpotKind.USER:
            raise InvalidOperation("Entry and Instance Spots have no relocation_ready boundary")
        if act.spec.mode is not ExecutionMode.SPOT_WIDE:
            raise InvalidOperation("PER_ACTOR Spots have no relocation_ready boundary")
        if act.spec.coordination is not RelocationCoordination.APPLICATION_SIGNALED:
            raise InvalidOperation(
                f"{act.spec.name!r} is FRAMEWORK_MANAGED; relocation_ready() is for "
                "relocation_coordination=APPLICATION_SIGNALED"
            )
        if turn.barriers is None:
            turn.barriers = []
        if any(isinstance(b, _ReadyBoundary) for b in turn.barriers):
            raise InvalidOperation("relocation_ready().defer() was already called in this turn")
        turn.barriers.append(_ReadyBoundary(self, act))

    def relocation_ready_completed(
        self, act: SpotAct, status: RelocationReadyStatus, error: ZLinkError | None = None
    ) -> None:
        """Queue ``on_relocation_ready_completed`` ahead of everything held for it."""
        done = SpotRelocationReadyCompletion(status, self.node_id, error)
        act.owner.put_first(
            LifeJob(act, "on_relocation_ready_completed",
                    lambda: act.instance.on_relocation_ready_completed(done), lane=UNRESERVED)
        )  # fmt: skip

    # -- Join and leave --------------------------------------------------------------------------
    def _join_hold(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """The barrier: hold the Actor at its next turn boundary, then ask the target."""
        ask = partial(self._join_ask, actor, target_id, request)
        actor.owner.put_unreserved(
            LifeJob(actor, "join", lambda: actor.owner.hold(ask), lane=UNRESERVED)
        )

    def _join_ask(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """Runs once the Actor is quiescent and held: ask the target Spot (§5)."""
        target = self.spots.get(target_id)
        error: ZLinkError | None = None
        if (target is None or target.state == GONE) and self.remote_join is not None:
            self.remote_join.ask(actor, target_id, request)  # it lives on another node
            return
        if target is None or target.state == GONE:
            error = NotFound(f"no spot {target_id!r} to join")
        elif target.kind is not SpotKind.USER:
            error = InvalidOperation(f"{target_id!r} is not a User Spot; only those hold Actors")
        elif target is actor.spot:
            error = InvalidOperation(f"actor {actor.actor_id!r} is already in {target_id!r}")
        else:
            job = LifeJob(
                target,
                "on_actor_join",
                lambda: target.instance.on_actor_join(actor.actor_id, request),
                partial(self._join_decided, actor, target),
            )
            if target.owner.put_life(job) == ADMITTED:
                return
            error = ResourceExhausted(f"the lifecycle lane of {target_id!r} is full")
        self._complete_join(actor, ActorJoinCompletion(False, target_id, error=error), None)

    def _join_decided(self, actor: ActorAct, target: SpotAct, turn: Turn) -> None:
        res = turn.result if turn.result is not None else ActorJoinResult()
        if turn.error is not None:
            done = ActorJoinCompletion(False, target.spot_id, error=_error_of(turn.error))
        elif not isinstance(res, ActorJoinResult):
            error: ZLinkError = InvalidArgument(f"on_actor_join gave {res!r}: not a JoinResult")
            done = ActorJoinCompletion(False, target.spot_id, error=error)
        elif not res.accept:
            error = InvalidOperation(f"{target.spot_id!r} rejected the join: {res.reason}")
            done = ActorJoinCompletion(False, target.spot_id, res.reply, error)
        else:
            self._move(actor, target)
            self.joined_here(actor, target, res.reply)
            return
        self._complete_join(actor, done, None)

    def joined_here(self, actor: ActorAct, target: SpotAct, reply: Any) -> None:
        """The Actor is a member of ``target`` now: ``on_joined_actor``, then its
        ``on_join_completed`` and its first turn on its new gate (§5)."""
        gate = target.gate if target.shared else actor.own_gate
        done = ActorJoinCompletion(True, target.spot_id, reply)
        target.owner.put_unreserved(
            LifeJob(
                target,
                "on_joined_actor",
                lambda: target.instance.on_joined_actor(actor.instance),
                lambda _t: self._complete_join(actor, done, gate),
                UNRESERVED,
            )
        )

    def _move(self, actor: ActorAct, target: SpotAct) -> None:
        source = actor.spot
        if source is not actor.entry:
            source.members.pop(actor.actor_id, None)
            source.owner.put_unreserved(
                LifeJob(
                    source,
                    "on_leave_actor",
                    lambda: source.instance.on_leave_actor(actor.instance),
                    lane=UNRESERVED,
                )
            )
        actor.spot = target
        if target is not actor.entry:
            target.members[actor.actor_id] = actor

    def _complete_join(self, actor: ActorAct, done: ActorJoinCompletion, gate: Gate | None) -> None:
        actor.owner.lanes.put_unreserved(
            LifeJob(
                actor,
                "on_join_completed",
                lambda: actor.instance.on_join_completed(done),
                lane=UNRESERVED,
            ),
            True,
        )
        actor.owner.unhold(gate)

    def leave(
        self, actor_id: str, from_spot: str | None, then: Callable[[], None] | None = None
    ) -> None:
        """Send an Actor back to its Entry Spot after its current turn (python-api §6)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.state != READY:
            raise NotFound(f"no actor {actor_id!r}")
        if from_spot is not None and actor.spot.spot_id != from_spot:
            raise InvalidOperation(f"actor {actor_id!r} is not a member of {from_spot!r}")
        if actor.spot.state in (SEALED, GONE):  # closing sends members home itself
            raise Unavailable(f"{actor.spot.spot_id!r} is moving; leave after the move")
        go = partial(self._leave_go, actor, then)
        actor.owner.put_unreserved(
            LifeJob(actor, "leave", lambda: actor.owner.hold(go), lane=UNRESERVED)
        )

    def _leave_go(self, actor: ActorAct, then: Callable[[], None] | None) -> None:
        source, entry = actor.spot, actor.entry
        if source is entry:
            actor.owner.unhold()
            if then is not None:
                then()
            return

        def back(_t: Turn) -> None:
            self._move(actor, entry)
            if then is not None:
                then()
            entry.owner.put_unreserved(
                LifeJob(
                    entry,
                    "on_joined_actor",
                    lambda: entry.instance.on_joined_actor(actor.instance),
                    lambda _t2: actor.owner.unhold(actor.own_gate),
                    UNRESERVED,
                )
            )

        source.owner.put_unreserved(LifeJob(source, "leave", lambda: None, back, UNRESERVED))

    def actor_spot_id(self, actor_id: str) -> str:
        actor = self.actors.get(actor_id)
        if actor is None:
            raise NotFound(f"no actor {actor_id!r}")
        return actor.spot.spot_id

    # -- activation ----------------------------------------------------------------------------
    def _register_spot(
        self, spec: TypeSpec, spot_id: str, generation: int | None = None
    ) -> SpotAct:
        act = SpotAct(self, spec, spot_id, generation or next(self._generations))
        self.spots[spot_id] = act
        return act

    def _instance_spec(self, call: MessageCall) -> TypeSpec:
        name = call.instance_type or self._only_instance_type
        if name is None:
            raise InvalidArgument(
                "instance_spot() needs a stable type when the app has more than one"
            )
        spec = self.app.spots.get(name)
        if spec is None or spec.kind is not SpotKind.INSTANCE:
            raise InvalidArgument(f"{name!r} is not a registered Instance Spot type")
        return spec

    def _activate_instance(
        self, spec: TypeSpec, spot_id: str, generation: int | None = None
    ) -> SpotAct:
        with self._lock:
            act = self.spots.get(spot_id)
            if act is not None:
                return act
            act = self._register_spot(spec, spot_id, generation)
        self._activate(act, None)
        return act

    def _activate(self, act: SpotAct, request: Message | None) -> None:
        """Queue construction, ``on_create`` (User Spots) and ``on_initialize`` (lifecycle)."""

        def construct() -> None:
            act.instance = act.spec.cls(act.context)

        steps: list[Callable[[], Any]] = [construct]
        if act.kind is SpotKind.USER:
            steps.append(lambda: act.instance.on_create(request))
        steps.append(lambda: act.instance.on_initialize())

        def done(turn: Turn) -> None:
            if turn.error is not None:
                self._deactivate(act, _error_of(turn.error))
                return
            act.state = READY
            reply = turn.result.reply if isinstance(turn.result, SpotCreateResponse) else None
            result = SpotCreateResult(act.spot_id, act.ref, True, reply)
            activated, act.activated = act.activated, None  # idle Spots keep no completion
            assert activated is not None
            activated.set(result, None)

        job = LifeJob(act, "activation", lambda: _chain(*steps), done, UNRESERVED)
        act.owner.put_unreserved(job)

    def _deactivate(self, act: SpotAct, error: Exception) -> None:
        _log.error("activation of %r failed", act.spot_id, exc_info=error)
        act.state = GONE
        with self._lock:
            if self.spots.get(act.spot_id) is act:
                del self.spots[act.spot_id]
        if act.activated is not None:
            act.activated.set(None, error)
        for item in act.owner.drain():
            if isinstance(item, Job):
                item.discard(NotFound(f"spot {act.spot_id!r} failed to activate"))

    # -- create ----------------------------------------------------------------------------------
    def submit_create(self, call: CreateCall[Any], mode: int) -> Completion:
        if self.stopping or self.draining:
            raise Unavailable(f"node {self.node_id} is shutting down")
        if call.mesh is not None and call.mesh != self.mesh:
            raise NotFound(f"mesh {call.mesh!r} is not reachable from node {self.node_id}")
        if call.kind == "actor":
            return self._create_actor(call, mode)
        spec = self.app.spots.get(call.type_name)
        if spec is None or spec.kind is not SpotKind.USER:
            raise InvalidArgument(f"{call.type_name!r} is not a registered User Spot type")
        completion = self._timed(call)
        spot_id = call.object_id or uuid.uuid4().hex
        remote: Location | None = None
        with self._lock:
            existing = self.spots.get(spot_id)
            if existing is None:
                generation = None
                if self.router is not None:  # only the owner the store confirms runs the factory
                    held = self.router.store.reserve(
                        spot_id, "spot", spec.name, self.node_id, self._lease()
                    )
                    if held.location.owner != self.node_id:
                        remote = held.location
                    generation = held.location.object_generation
                if remote is None:
                    act = self._register_spot(spec, spot_id, generation)
        if remote is not None:
            assert self.router is not None
            if not call.get or remote.type_name != spec.name:
                assert completion.timer is not None
                completion.timer.cancel()
                what = "exists already" if not call.get else f"exists as {remote.type_name!r}"
                raise (InvalidOperation if not call.get else InvalidArgument)(
                    f"{spot_id!r} {what} on node {remote.owner}"
                )
            self.router.forward_create(call, completion, remote)
            return completion
        if existing is not None:
            self._existing(existing, spec, call, completion)
            return completion
        assert act.activated is not None  # just made
        act.activated.add_callback(completion.set)
        self._activate(act, call.request_msg)
        return completion

    def _timed(self, call: CreateCall[Any]) -> Completion:
        completion = Completion()
        self._arm(completion, call.deadline, "not created in time")
        return completion

    def deadline_of(self, deadline: float | None) -> float:
        """A call's timeout in seconds: its own, or the node's default."""
        return self.request_timeout if deadline is None else deadline

    def _arm(self, completion: Completion, deadline: float | None, reason: str) -> None:
        """Put the call's deadline on the infrastructure heap (it fails it unless it is done)."""
        completion.timer = self.infra.call_later(
            self.deadline_of(deadline), expire, completion, reason
        )

    def _existing(
        self, act: SpotAct | ActorAct, spec: TypeSpec, call: CreateCall[Any], out: Completion
    ) -> None:
        if not call.get:
            out.timer.cancel()  # type: ignore[union-attr]
            raise InvalidOperation(f"{call.object_id!r} exists already; use get_or_create")
        if act.spec is not spec:
            out.timer.cancel()  # type: ignore[union-attr]
            raise InvalidArgument(f"{call.object_id!r} exists as {act.spec.name!r}")

        def settle(value: Any, error: BaseException | None) -> None:
            if error is not None:
                out.set(None, error)
            elif isinstance(act, SpotAct):
                out.set(SpotCreateResult(act.spot_id, act.ref, False), None)
            else:
                out.set(ActorCreateResult(act.actor_id, False), None)

        activated = act.activated  # one read: activation may drop it meanwhile
        if activated is None:  # activated already
            settle(None, None)
        else:
            activated.add_callback(settle)  # calls back at once if it completed meanwhile

    def _create_actor(self, call: CreateCall[Any], mode: int) -> Completion:
        spec = self.app.actors.get(call.type_name)
        if spec is None:
            raise InvalidArgument(f"{call.type_name!r} is not a registered Actor type")
        entry = self.entries[spec.name]
        turn = current_turn()
        if mode == KEEP and turn is not None and turn.owner is entry.owner:
            raise InvalidOperation("an Entry Spot cannot await an Actor create it must run itself")
        completion = self._timed(call)
        actor_id = call.object_id or uuid.uuid4().hex
        with self._lock:
            existing = self.actors.get(actor_id)
            if existing is None and self.router is not None:
                held = self.router.store.reserve(
                    actor_id, "actor", spec.name, self.node_id, self._lease()
                )
                if held.location.owner != self.node_id:  # it lives on another node
                    assert completion.timer is not None
                    completion.timer.cancel()
                    if not call.get:
                        raise InvalidOperation(f"{actor_id!r} exists already on another node")
                    completion.set(ActorCreateResult(actor_id, False), None)
                    return completion
            if existing is None:
                act = ActorAct(self, spec, actor_id, entry)
                self.actors[actor_id] = act
        if existing is not None:
            self._existing(existing, spec, call, completion)
            return completion
        request = call.request_msg

        def approve() -> Any:
            act.instance = spec.cls(act.context)
            return entry.instance.on_create_actor(act.instance, request)

        def decided(turn: Turn) -> None:
            res = turn.result if turn.result is not None else ActorCreateResponse()
            if turn.error is not None:
                error: Exception = _error_of(turn.error)
            elif not isinstance(res, ActorCreateResponse):
                error = InvalidArgument(f"on_create_actor must return ActorCreateResponse: {res!r}")
            elif not res.accept:
                error = InvalidOperation(f"{entry.spot_id!r} refused to create {actor_id!r}")
            else:
                act.state = READY
                activated, act.activated = act.activated, None
                assert activated is not None
                activated.set(ActorCreateResult(actor_id, True, res.reply), None)
                act.owner.unhold()
                return
            act.state = GONE
            with self._lock:
                if self.actors.get(actor_id) is act:
                    del self.actors[actor_id]
            if act.activated is not None:
                act.activated.set(None, error)
            for item in act.owner.drain():
                if isinstance(item, Job):
                    item.discard(NotFound(f"actor {actor_id!r} was not created"))

        assert act.activated is not None  # just made
        act.activated.add_callback(completion.set)
        job = LifeJob(entry, "on_create_actor", approve, decided)
        if entry.owner.put_life(job) != ADMITTED:
            with self._lock:
                del self.actors[actor_id]
            completion.timer.cancel()  # type: ignore[union-attr]
            raise ResourceExhausted(f"the lifecycle lane of {entry.spot_id!r} is full")
        return completion

    # -- status ------------------------------------------------------------------------------------
    def owner_statuses(self) -> list[OwnerStatus]:
        """Every owner's lanes, gate and timers, read without stopping any turn."""
        now = self.clock.now()
        names = {
            ACTIVATING: "activating", READY: "ready", SEALED: "sealed", CLOSING: "closing",
            GONE: "gone",
        }  # fmt: skip
        out: list[OwnerStatus] = []

        def add(owner: Owner, kind: str, type_: str, state: int, timers: list[str]) -> None:
            ai, ab, li, lb = owner.lanes.reserved()
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
                    state=names[state],
                    app_items=ai,
                    app_bytes=ab,
                    lifecycle_items=li,
                    lifecycle_bytes=lb,
                    gate_busy=gate.busy,
                    running_turn_age=age,
                    oldest_item_age=oldest,
                    held=owner.held,
                    timers=timers,
                )
            )

        for act in list(self.spots.values()):
            add(act.owner, "spot", act.spec.name, act.state, sorted(act.timers))
            for timer in list(act.timers.values()):
                if timer.owner is not act.owner:
                    add(timer.owner, "timer", act.spec.name, act.state, [timer.name])
        for actor in list(self.actors.values()):
            add(actor.owner, "actor", actor.spec.name, actor.state, sorted(actor.timers))
        return out

    # -- closing ----------------------------------------------------------------------------------
    def close_ref(self, ref: SpotRef) -> bool:
        """``spots.close(ref)``: Missing False, generation mismatch InvalidOperation, sealed
        Unavailable, User Spots only (kotlin-spot-interface)."""
        if not isinstance(ref, SpotRef):
            raise InvalidArgument(f"close() takes a SpotRef, got {type(ref).__name__}")
        act = self.spots.get(ref.spot_id)
        if act is None or act.state == GONE:
            return False
        if act.ref.object_generation != ref.object_generation:
            raise InvalidOperation(
                f"{ref.spot_id!r} is generation {act.ref.object_generation}, "
                f"not {ref.object_generation}"
            )
        if act.kind is not SpotKind.USER:
            raise InvalidOperation(f"{ref.spot_id!r} is not a User Spot; only those are closed")
        self.close_spot(act, SpotCloseReason.EXPLICIT_CLOSE)
        return True

    def close_self(self, spot_id: str) -> None:
        act = self.spots.get(spot_id)
        if act is not None and act.state == READY:
            self.close_spot(act, SpotCloseReason.EXPLICIT_CLOSE)

    def close_spot(self, act: SpotAct, reason: SpotCloseReason) -> None:
        """Seal ``act``, send its members home, then run ``on_closing`` (lifecycle lane)."""
        with self._lock:
            if act.state > READY:
                raise Unavailable(f"{act.spot_id!r} is sealed (closing or relocating)")
            act.state = CLOSING
        act.cancel_timers()
        members = list(act.members)
        if not members:
            self._queue_closing(act, reason)
            return
        left = [len(members)]
        lock = threading.Lock()

        def one_left() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._queue_closing(act, reason)

        for actor_id in members:
            self.leave(actor_id, act.spot_id, one_left)

    def _queue_closing(self, act: SpotAct, reason: SpotCloseReason, budget: float = 0) -> None:
        deadline = self.clock.now() + (budget or self.closing_timeout)
        closing = SpotClosingContext(reason, deadline)

        def run() -> Any:
            act.closing_turn = current_turn()
            return None if act.instance is None else act.instance.on_closing(closing)

        act.owner.put_unreserved(
            LifeJob(act, "on_closing", run, partial(self._closed, act), UNRESERVED)
        )
        self.infra.call_at(deadline, self._closing_overdue, act)

    def _closing_overdue(self, act: SpotAct) -> None:
        turn = act.closing_turn
        if act.state == CLOSING and turn is not None and turn.waker is not None:
            turn.waker(None, Cancelled(f"on_closing of {act.spot_id!r} passed its deadline"))

    def _closed(self, act: SpotAct, turn: Turn) -> None:
        if turn.error is not None and not isinstance(turn.error, Cancelled):
            self.metrics.add("handler_errors")
            _log.error("on_closing of %r failed", act.spot_id, exc_info=turn.error)
        act.state = GONE
        act.closing_turn = None
        with self._lock:
            if self.spots.get(act.spot_id) is act:
                del self.spots[act.spot_id]
        for topic, ids in list(self.topics.items()):
            if act.spot_id in ids:
                self.subscribe(act.spot_id, topic, False)
        if self.router is not None:  # fenced: a stale owner's release is refused
            with contextlib.suppress(Unavailable):
                self.router.store.release(act.spot_id, self.node_id, act.authority)
        error: ZLinkError = (
            Unavailable(f"node {self.node_id} shut down before it ran")
            if self.stopping
            else NotFound(f"spot {act.spot_id!r} was closed")
        )
        for item in act.owner.drain():
            if isinstance(item, Job):
                item.discard(error)
        self.metrics.add("spots_closed")

    def sweep_idle(self) -> None:
        """On the infrastructure thread: close User/Instance Spots idle for ``idle_timeout``."""
        now = self.clock.now()
        for act in list(self.spots.values()):
            if act.kind is SpotKind.ENTRY or act.state != READY:
                continue
            if act.activity != act.seen_activity:
                act.seen_activity, act.idle_since = act.activity, now
                continue
            if now - act.idle_since < self.idle_timeout:  # type: ignore[operator]
                continue
            lanes = act.owner.lanes
            ticks = sum(t.queued for t in act.timers.values() if t.owner is act.owner)
            if not act.members and not lanes.life and lanes.reserved()[0] == ticks:
                with contextlib.suppress(Unavailable):  # closed by someone else meanwhile
                    self.close_spot(act, SpotCloseReason.IDLE_EVICTED)
        if not self.stopping and self.idle_timeout is not None:
            self.infra.call_later(self.idle_timeout / 4, self.sweep_idle)

    def close_all(self, budget: float) -> None:
        """Shutdown: every Spot gets ``on_closing(HOST_SHUTDOWN)``; members stay put."""
        for act in list(self.spots.values()):
            with self._lock:
                if act.state >= CLOSING:
                    continue
                act.state = CLOSING
            act.cancel_timers()
            self._queue_closing(act, SpotCloseReason.HOST_SHUTDOWN, budget)

    # -- shutdown ---------------------------------------------------------------------------------
    def stop_admission(self) -> None:
        """Refuse new work from now on; queued jobs will be discarded unrun; timers stop."""
        self.stopping = True
        self.stopped_admission.set()
        for act in [*self.spots.values(), *self.actors.values()]:
            act.cancel_timers()

    def owners(self) -> list[Owner]:
        out = [a.owner for a in list(self.spots.values())]
        out += [a.owner for a in list(self.actors.values())]
        return out

    def discard_queued(self) -> int:
        """Fail every job that never ran with ``Unavailable`` (shutdown, after the workers)."""
        n = 0
        error = Unavailable(f"node {self.node_id} shut down before it ran")
        for owner in self.owners():
            for item in owner.drain():
                if isinstance(item, Job):
                    item.discard(error)
                    n += 1
        return n
