"""Live objects of one node: Spot, Actor and Channel activations and their states."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidArgument,
    InvalidOperation,
    Unavailable,
)
from ..executor import DeadlineHandle, Owner, OwnerLanes, Turn

if TYPE_CHECKING:
    from .runtime import Runtime

    pass
from ..messaging.completion import Completion
from ..messaging.context import (
    ActorContext,
    ChannelContext,
    EntrySpotContext,
    InstanceSpotContext,
    SpotContext,
)
from ..timers import Timer, TimerManager, TimerOptions
from ..types import SpotKind, SpotRef

if TYPE_CHECKING:
    from ..app import TypeSpec
    from .events import Mark


_log = logging.getLogger("zlink.runtime")


class ActState(Enum):
    """Where an activation is in its life. ACTIVATING and READY admit calls; SEALED
    (relocating), CLOSING and GONE do not (a call that meets them is kept, relayed or refused)."""

    ACTIVATING = "activating"
    READY = "ready"
    SEALED = "sealed"
    CLOSING = "closing"
    GONE = "gone"


ACTIVATING, READY, SEALED = ActState.ACTIVATING, ActState.READY, ActState.SEALED
CLOSING, GONE = ActState.CLOSING, ActState.GONE
PAST_READY = frozenset({SEALED, CLOSING, GONE})  # admits nothing new
_NO_TIMERS = frozenset({CLOSING, GONE})  # registers no timer (sealed: until they are taken)


class Discarded(Exception):
    """Internal: a queued job met a stopping node and never ran its handler."""


class AnsweredElsewhere(Unavailable):
    """Internal: a copy of a request this node lets go unrun, whose caller another node
    answers: the source of a move that is not committed keeps the original, and runs it if
    the move does not happen. Its completion ends with this, and no reply goes out
    (``MeshRouter.reply``): a review found a stopping target answer ``Unavailable`` for a
    request its source then ran."""


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------
class ObjectAct:
    """What Spot and Actor activations share: timers and the last time they did work."""

    __slots__ = ("activity", "authority", "idle_since", "seen_activity", "timers", "timers_closed")
    stats_kind = ""  # how ``/metrics`` and ``node.status()`` name its kind (type_stats)
    rt: Runtime
    instance: Any
    spec: TypeSpec
    owner: Owner
    state: ActState
    context: Any

    def _init_object(self) -> None:
        self.timers: dict[str, Timer] = {}
        self.timers_closed = False  # its timers were taken (a move, a close): none registers
        self.authority = 1  # AuthorityOwnerGeneration in the Location Store (fencing only)
        self.activity = self.seen_activity = 0  # handled messages; idle eviction compares them
        self.idle_since = self.rt.clock.now()
        self.context.timers = TimerManager(self)

    @property
    def name(self) -> str:
        raise NotImplementedError

    def touch(self) -> None:
        """Activity that is not a message (a keep-alive timer tick): idle eviction starts
        counting again from now. ``activity`` itself counts messages only (their handled count,
        ``type_stats``)."""
        self.idle_since = self.rt.clock.now()

    def timer_owner(self, name: str) -> Owner:
        """Where this object's timer ticks queue (§2): its own lanes, unless PerActor."""
        return self.owner

    def add_timer(
        self, name: str, interval: float, options: TimerOptions, first_delay: float | None
    ) -> Timer:
        """Register the timer ``name`` (``context.timers.register``). Checked and made under
        the directory lock, one step with the state changes after which the timers are taken
        (a close, a fence, a failed activation, a move's shipping: each takes them under it):
        a timer registered just before is taken with the rest, one registered after is
        refused; and one name is one timer, also across a PER_ACTOR Spot's gates. A Spot
        sealed for a move registers until its timers are taken to ship: a continuation that
        finishes its turn here first (python-api §11) may register one, and it moves. On the
        node it moves to, a timer it brought is its own as it arrives: its restore
        registering it again as it was gets it (no second one)."""
        fn = self.spec.timer_handlers.get(name)
        if fn is None:
            raise InvalidArgument(f"{self.spec.name!r} has no @timer_handler({name!r})")
        delay = interval if first_delay is None else first_delay
        with self.rt.directory.lock:
            had = self.timers.get(name)
            if had is not None and had.handle is None and self._arriving():
                # arriving with its move, not armed yet: the move restores it, and the app
                # need not register it again (kotlin-spot-interface); a restore that does, as
                # it was, gets it (a recreate()'s on_initialize), else it is a second timer
                if had.runs_as(interval, options):  # (its schedule is the moved one: a
                    return had  # first_delay has nothing to say)
                raise InvalidOperation(
                    f"timer {name!r} of {self.name!r} moved with it and is restored as it was "
                    f"(every {had.interval:g} s); register it only when timers.names() lacks it"
                )
            if had is not None:
                raise InvalidOperation(f"timer {name!r} of {self.name!r} is already registered")
            if self.timers_closed or self.state in _NO_TIMERS or self.rt.stopping:
                raise Unavailable(f"{self.name!r} is closing, closed or leaving this node")
            timer = Timer(name, interval, options, self, self.timer_owner(name), fn,
                          self.rt.clock.now() + delay)  # fmt: skip
            self.timers[name] = timer
        timer.arm()  # (cancelled meanwhile: its first firing does nothing)
        return timer

    def _arriving(self) -> bool:
        """Whether this object arrives here with a move, not open yet (its restore runs)."""
        relocator = self.rt.relocator
        return self.state is SEALED and relocator is not None and relocator.arriving(self.name)

    def cancel_timer(self, name: str, registration: object | None = None) -> bool:
        """Cancel the timer ``name`` (only if it is of ``registration``, when given: a handle
        cancels its own timer only); ``False`` if there is none."""
        with self.rt.directory.lock:
            timer = self.timers.get(name)
            if timer is None or (
                registration is not None and timer.registration is not registration
            ):
                return False
            del self.timers[name]
        timer.cancel()
        return True

    def take_timers(self) -> list[Timer]:
        """(Directory lock held.) Every timer, taken (their caller cancels them), and no more
        registered from now on: a move ships them, a close or a fence ends them. A move that
        does not happen gives them back (``give_timers``)."""
        self.timers_closed = True
        taken = list(self.timers.values())
        self.timers.clear()
        return taken

    def give_timers(self, timers: list[Timer]) -> None:
        """(Directory lock held.) ``timers`` are this object's (restored: arrived with a move,
        or back from one that did not happen); it registers again."""
        self.timers_closed = False
        for timer in timers:
            self.timers[timer.name] = timer

    def cancel_timers(self) -> list[Timer]:
        """Its timers stop, and none registers from now on (no lock held); those it stopped."""
        with self.rt.directory.lock:
            taken = self.take_timers()
        for timer in taken:  # (a tick that still slips in is a no-op)
            timer.cancel()
        return taken


class SpotAct(ObjectAct):
    """One live Spot: its gate, its own lanes, its instance and its members."""

    stats_kind = "spot"

    __slots__ = (
        "activated",
        "close_asked",
        "closing_overdue",
        "closing_start",
        "closing_timer",
        "closing_turn",
        "context",
        "event_marks",
        "gate",
        "held",
        "instance",
        "kind",
        "members",
        "owner",
        "quiet",
        "ref",
        "rt",
        "shared",
        "spec",
        "spot_id",
        "state",
        "tenure",
        "timer_owners",
        "yield_ok",
        "yielded",
    )

    def __init__(self, rt: Runtime, spec: TypeSpec, spot_id: str, generation: int) -> None:
        from ..types import ExecutionMode

        self.rt = rt
        self.spec = spec
        self.spot_id = spot_id
        assert spec.kind is not None
        self.kind: SpotKind = spec.kind
        self.gate = rt.new_gate(spot_id)
        self.owner = Owner(OwnerLanes(rt.limits), self.gate, spot_id, claim_on_yield=False)
        self.owner.ref = self
        self.instance: Any = None
        # an Instance Spot that closes while its node serves: the calls that come meanwhile
        # wait here, where its gate never runs them, for its next activation
        # (``Closing._reactivate``); set with the state CLOSING, under the directory lock
        self.held: OwnerLanes | None = None
        self.state = ACTIVATING
        self.closing_turn: Turn | None = None  # a running on_closing, cancelled at its deadline
        self.closing_overdue = False  # the close's deadline passed: suspensions end at once
        self.closing_timer: DeadlineHandle | None = None  # that deadline, cancelled at the end
        self.closing_start: Callable[[], None] | None = None  # queues on_closing once its
        # members went home (``Closing._start_closing``: once, by them or by a stop)
        # an Instance Spot closed itself while sealed for a move that waits for its barrier:
        # the barrier withdraws the move and the Spot closes (``Closing.close_self``)
        self.close_asked = False
        # turns of this Spot and its members suspended in a Yield whose continuation has not
        # resumed yet: the all-lane barrier of a move or a close waits until there are none
        # (python-api §11); ``quiet`` runs then (both under the runtime's Yield lock). Both
        # are made on first use and dropped when empty: an idle Spot keeps neither (216 + 56
        # bytes).
        self.yielded: set[Turn] | None = None
        # per (origin node, topic), the last Logical Multicast event it was offered
        # (``zlink.runtime.events``; publish lock): made on its first event from a mesh
        self.event_marks: dict[tuple[str, str], Mark] | None = None
        self.timer_owners: list[Owner] | None = None  # a PerActor Spot's timers' own gates
        # an Instance Spot's tenure of its store row (the object generation it was claimed
        # with; its activations made again in place keep it): a first record's clear is
        # tried again only for the tenure that recorded it
        self.tenure: int | None = None
        self.quiet: list[Callable[[], None]] | None = None
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
        """A PerActor User Spot gives each of its timers a gate of its own (§2); it keeps
        them (those not yet quiet) for its close, whose barrier waits for them too."""
        if self.kind is SpotKind.USER and not self.shared:
            gate = self.rt.new_gate(f"{self.spot_id}/timer:{name}")
            # arriving with a move (its restore registers it): held as the Spot is, until it
            # opens here (no tick runs before: kotlin-spot-interface), or is forgotten
            owner = Owner(OwnerLanes(self.rt.limits), gate, gate.name, claim_on_yield=False,
                          held=self._arriving())  # fmt: skip
            owner.ref = self
            # a live timer's gate stays; a cancelled one's goes once it is quiet
            live = {t.owner for t in self.timers.values()}
            kept = [o for o in self.timer_owners or () if o in live or not quiet(o)]
            kept.append(owner)
            self.timer_owners = kept
            return owner
        return self.owner

    @property
    def name(self) -> str:
        return self.spot_id


class ActorAct(ObjectAct):
    """One live Actor: its own lanes (always, §2), its own gate and its current Spot."""

    stats_kind = "actor"

    __slots__ = (
        "activated",
        "actor_id",
        "after_join",
        "context",
        "entry",
        "instance",
        "joining",
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
        self.joining = False  # a deferred Join of it is under way (its Spot does not move)
        self.after_join: list[Callable[[], object]] | None = None  # run once it ends
        self._init_object()

    @property
    def yield_ok(self) -> bool:
        """A member Actor of a SpotWide User Spot may Yield; elsewhere it may not (§3)."""
        return self.spot.shared

    @property
    def name(self) -> str:
        return self.actor_id


class ChannelAct:
    """A Channel: one stateless instance per node, whose records go through a gate of its
    own, in order, as a Spot's do (execution-model §2: "Node handlers, ChannelName handlers,
    each Spot, and each Actor process records in the order of the gate that applies to
    them"; a regular await keeps it, and a Channel offers no Yield, §16), admitted into lanes
    bounded as a Spot's are (python-api §9). An audit found every record a free turn of its
    own: one sender's second message ran while its first was still in its handler. It has
    no timers: ``context.timers`` refuses them (``InvalidOperation``; it was ``None``)."""

    __slots__ = ("activity", "context", "gate", "instance", "owner", "rt", "spec")

    stats_kind = "channel"
    state = READY  # (always: a Channel neither moves nor closes)
    yield_ok = False
    timers: dict[str, Timer] = {}  # (never any: ``add_timer`` refuses)

    def __init__(self, rt: Runtime, spec: TypeSpec) -> None:
        self.rt = rt
        self.spec = spec
        self.gate = rt.new_gate(spec.name)
        self.owner = Owner(OwnerLanes(rt.limits), self.gate, spec.name, claim_on_yield=False)
        self.owner.ref = self
        self.activity = 0  # messages handled (type_stats)
        self.context = ChannelContext(rt, spec.name)
        self.context.timers = TimerManager(self)
        self.instance = spec.cls(self.context)

    @property
    def name(self) -> str:
        return self.spec.name

    def touch(self) -> None:
        pass

    def add_timer(
        self, name: str, interval: float, options: TimerOptions, first_delay: float | None
    ) -> Timer:
        raise InvalidOperation(f"channel {self.name!r} is stateless: a Channel has no timers")

    def cancel_timer(self, name: str, registration: object | None = None) -> bool:
        return False


Act = SpotAct | ActorAct | ChannelAct


def quiet(owner: Owner) -> bool:
    """Whether nothing of ``owner`` runs, waits to run or keeps its gate across an await."""
    return not owner.gate.busy and not owner.lanes.ready()
