"""The records and helpers a relocation keeps on both sides (see ``relocate``)."""

from __future__ import annotations

import base64
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import StateIncompatible, ZLinkError
from ..executor import Owner, ranked_lock
from ..lock_order import LockRank
from ..mesh import wire
from ..messaging import codec
from ..messaging.calls import NO_WAIT
from ..messaging.completion import Admitted, Completion
from ..messaging.message import Message, from_wire, to_wire
from ..runtime.waits import WaitLine
from ..timers import MAX_CATCH_UP, OverrunPolicy, Timer, TimerOptions
from ..types import TargetKind

if TYPE_CHECKING:
    from ..messaging.calls import MessageCall
    from ..runtime.acts import ActorAct, ObjectAct, SpotAct
    from ..runtime.routing import MeshRouter, Relayable
    from ..runtime.runtime import Runtime


_log = logging.getLogger("zlink.relocation")
RESTORE_ATTEMPTS = 3
STORE_RETRY = 1.0  # seconds: a store question that failed is asked again (a dead peer's move)

Held = tuple["MessageCall", "Completion | None", int]  # a call kept for later admission


@dataclass(eq=False)
class Outgoing:
    """One move leaving this node: a Spot (with its SpotWide members, or alone as a PER_ACTOR
    shell), or one Actor of a PER_ACTOR Spot whose shell has moved already."""

    rid: int
    unit: SpotAct | ActorAct  # whose lanes the barrier turn runs on
    spot: SpotAct
    objects: list[SpotAct | ActorAct]
    target: str
    done: Completion
    # the point of no return: parked calls went to the target and the commit is under way
    # (later calls follow at once); until then the move can still be withdrawn
    relaying: bool = False
    signaled: bool = False  # APPLICATION_SIGNALED: the Spot gets CONTINUED or RELOCATED
    into: str | None = None  # a cross-node Join: the Spot the Actor joins on the target
    join: wire.JoinGrant | None = None  # ... and the accepted join's reply, as sent
    parked: list[Relayable] = field(default_factory=list)
    # what the move holds for its target until the commit (parked here, then relayed: the
    # target keeps those until it opens) counts against what the moving Spot's lane holds
    # (items, payload bytes): past it a call waits here, in arrival order, behind them, and
    # goes on at the commit (python-api §9)
    held: int = 0
    held_bytes: int = 0
    waiting: WaitLine[Relayable] = field(default_factory=WaitLine)
    # what was relayed to the target once the commit got under way, kept until the store
    # answers: a commit the store refuses puts these back here, in order (the target, told
    # to forget its copy, drops what came from this node)
    relayed: list[Relayable] = field(default_factory=list)
    committed: bool = False  # the store moved authority; the target has yet to open
    # the target's incarnation that restored it: the commit names that one (an audit found
    # a move committed to the target's next incarnation, which had dropped it: lost)
    target_incarnation: int = 0
    lost: bool = False  # the target was declared down while the store was asked to commit
    caller: Completion | None = None  # what the move's caller waits on, if not ``done``
    # What left for the target, kept here until the commit so a move that does not happen
    # puts it back as it was (python-api §11): each object's queue, in order, its timers,
    # and the correlation ids its queued requests await the target's replies under.
    shipped: bool = False
    taken: list[tuple[SpotAct | ActorAct, list[Any]]] = field(default_factory=list)
    # per object: its timers as taken (each one's record, the node's clock then, and each
    # one's registration, which a put back keeps: ``TimerHandle``)
    timers: dict[str, TakenTimers] = field(default_factory=dict)
    corrs: list[int] = field(default_factory=list)
    # the objects whose first record's message moves in their queue: their commit keeps the
    # record in the store (``LocationStore.transfer``'s ``keep_first``), for the target
    first_moves: set[str] = field(default_factory=set)
    # a PER_ACTOR Spot's timer gates, held by its barrier (none starts or resumes a callback)
    # until the move ends: a move that does not happen lets them go again
    timer_gates: list[Owner] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return TargetKind.SPOT if self.unit is self.spot else TargetKind.ACTOR


@dataclass(eq=False)
class Arriving:
    """One move arriving on this node."""

    key: tuple[str, int]
    spot: SpotAct  # arriving with this move, or the shell an arriving Actor joins
    objects: list[SpotAct | ActorAct]
    kind: str  # "spot" or "actor"
    join: wire.JoinGrant | None = None  # a cross-node Join completes when this opens
    restored: bool = False
    committed: bool = False
    signaled: bool = False
    fences: set[str] = field(default_factory=set)  # this node's fences still travelling
    local: list[Held] = field(default_factory=list)  # made here: wait for this node's fences
    # a fence of this node is back, and what it kept is routed again (``fence_back``): made
    # before anything in ``local`` or ``waiting``, and accepted already, so taken in ahead of
    # them whatever they count (bounded where it was kept)
    resending: bool = False
    # every call for it that may go in, in the order it came (relayed by the source or not):
    # queued behind the moved queue when it opens, or, if the move is withdrawn before its
    # commit, sent on whole to the source (python-api §8)
    kept: list[Held] = field(default_factory=list)
    # the calls kept here that the source did not relay (it bounds those) count against what
    # the arriving object's lane holds (items, bytes): past it a call waits, in arrival
    # order, for the object to open (python-api §9), as at the source's park
    taken: int = 0
    taken_bytes: int = 0
    waiting: WaitLine[Held] = field(default_factory=WaitLine)
    # questions the arrival holds up (``Relocator.after_move``): run once it opens or is
    # forgotten, on the infrastructure thread
    after: list[Callable[[], None]] = field(default_factory=list)
    forgotten: bool = False  # withdrawn or given up: what was made of it is dropped
    # at this node's stop, the store named this node the owner (the source committed, and
    # its commit had not come): what the arrival holds are then the only copies
    ours_at_stop: bool = False
    # each object's timers, restored as it arrives (``timers_at``: this node's clock then)
    # and armed once its queue is in
    timers: dict[str, list[Timer]] = field(default_factory=dict)
    timers_at: float = 0.0

    @property
    def members(self) -> list[ActorAct]:
        return [o for o in self.objects if o is not self.spot]  # type: ignore[misc]


class RelocatorState:
    """What a node's relocator keeps, as source (moves leaving) and as target (arriving)."""

    def __init__(self, rt: Runtime, router: MeshRouter, chunk_limit: int) -> None:
        self.rt = rt
        self.router = router
        self.chunk_limit = chunk_limit
        self._ids = itertools.count(1)
        # admission of diverted calls; re-entered by refills
        self._lock = ranked_lock("relocator", LockRank.RELOCATION, reentrant=True)
        self._out: dict[int, Outgoing] = {}
        self._out_ids: dict[str, Outgoing] = {}  # spot and member ids -> their move
        self._chunks: dict[tuple[str, int], list[str]] = {}
        self._in: dict[tuple[str, int], Arriving] = {}
        self._arrived = threading.Condition()  # a leaf: notified as an arrival ends
        self.refusing: str | None = None  # why this node takes no move now (it drains)
        self.stopping: str | None = None  # why no move leaves this node now (it stops)
        self.stopped_as: str | None = None  # the node stopped: arrivals keep nothing more
        self._in_ids: dict[str, Arriving] = {}
        self._wanted: dict[str, tuple[str, Completion]] = {}  # APPLICATION_SIGNALED: waiting
        # PER_ACTOR Spots whose move is under way: the shell's, then its members' (under _lock)
        self._following: set[str] = set()

    def _take_in(self, inc: Arriving, held: Held) -> None:
        """A call for an arriving target that may go in: kept, in arrival order, until the
        target opens (it then queues behind the moved queue, as it would have in the held
        lanes: a call taken in here, so before any fence this node answered for the target,
        stays ahead of what comes after that fence through the source)."""
        inc.kept.append(held)

    def _admit_all(self, helds: list[Held]) -> None:
        for held in helds:
            self._admit(held)

    def _admit(self, held: Held, force: bool = True) -> None:
        """Admit a kept call now (``force``: past the seal; without it, routed the way it
        would have gone). It was accepted before, so a full lane (or a full keeper: a route
        fence this node has out) is waited for, as long as it takes (python-api §9: nothing
        accepted is lost); a refusal completes its reply, or counts the dropped send."""
        call, reply, hops = held
        room = Admitted(peer=call.via or self.rt.node_id)  # bounded by the move, not a timer
        try:
            self.rt.submit(call, reply, NO_WAIT, hops, force=force, room=room)
        except ZLinkError as exc:
            if reply is not None:
                reply.set(None, exc)
            else:  # counted here and where it was sent from, with its reason (§9)
                self.router.count_dropped(call, exc)
            return
        if reply is None:
            router = self.router

            def refused(_value: Any, error: BaseException | None) -> None:
                if error is not None:  # the Spot was sealed again, or closed, meanwhile
                    router.count_dropped(call, error)

            room.add_callback(refused)


def capture_one(obj: ObjectAct) -> str | None:
    """One object's state as base64 text, or ``None`` for ``recreate()``."""
    adapter = obj.spec.relocation.adapter
    if adapter is None:
        return None
    data = adapter().capture(obj.instance)
    if not isinstance(data, (bytes, bytearray)):
        raise StateIncompatible(f"capture of {obj.name!r} returned {type(data).__name__}")
    return base64.b64encode(bytes(data)).decode()  # the runtime's own copy


@dataclass(frozen=True, slots=True)
class TakenTimers:
    """An object's timers as a move took them (:func:`take_timers`)."""

    records: tuple[wire.RelocTimer, ...]
    at: float  # the node's clock when they were taken
    registrations: dict[str, object]


def take_timers(obj: ObjectAct, now: float) -> TakenTimers:
    """Take ``obj``'s timers for a move (none registers from then on; ``give_timers``
    reopens), stopped, as records whose times are spans from ``now``."""
    taken = obj.cancel_timers()
    return TakenTimers(timers_of(taken, now), now, {t.name: t.registration for t in taken})


def timers_of(timers: list[Timer], now: float) -> tuple[wire.RelocTimer, ...]:
    """The logical timers as they move: schedule, policy, last sequence, counts, and when each
    is next due as a span from ``now`` (the node's clock as they leave): each node's clock
    counts from an origin of its own (a machine's boot), so a time crosses as a span."""
    return tuple(
        wire.RelocTimer(t.name, t.interval, t.options.overrun_policy, _catch_up(t.options),
                        t.options.keeps_alive, t.next_due - now, t.sequence, t.late_ticks,
                        t.delivered)
        for t in timers
    )  # fmt: skip


def _catch_up(options: TimerOptions) -> int:
    """``max_catch_up_ticks`` as it crosses: as given where it is used (CATCH_UP_BOUNDED:
    1..2**31-1), else 1 when it is out of that range (not used, and not validated:
    kotlin-spot-interface; 2**64 would not encode)."""
    n = options.max_catch_up_ticks
    if options.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED or 1 <= n <= MAX_CATCH_UP:
        return n
    return 1


def restore_timers(
    obj: ObjectAct, timers: tuple[wire.RelocTimer, ...], now: float,
    registrations: dict[str, object] | None = None,
) -> list[Timer]:  # fmt: skip
    """The logical timers go on: same sequence and counts, next due the same span after
    ``now`` (this node's clock as they are restored) as it was after they left; the app
    registers none. ``registrations``: the timers' own (a move that did not happen: their
    handles stay theirs). They are armed by the caller, once the pending ticks are queued."""
    out = []
    for t in timers:
        options = TimerOptions(t.overrun_policy, t.max_catch_up_ticks, t.keeps_alive)
        fn = obj.spec.timer_handlers[t.name]
        kept = None if registrations is None else registrations.get(t.name)
        out.append(Timer(t.name, t.interval, options, obj, obj.timer_owner(t.name), fn,
                         now + t.due_in, kept))  # fmt: skip
        out[-1].sequence, out[-1].late_ticks, out[-1].delivered = (
            t.sequence,
            t.late_ticks,
            t.delivered,
        )
    with obj.rt.directory.lock:
        obj.give_timers(out)
    return out


def typed_error(error: BaseException) -> ZLinkError:
    if isinstance(error, ZLinkError):
        return error
    return StateIncompatible(f"capture failed: {type(error).__name__}: {error}")


def encode_reply(value: Any) -> wire.EncodedValue:
    """A join request or reply as it crosses nodes: a ``zlink.Message`` keeps its type, any
    other value travels as JSON (``TypeError`` if it is not JSON)."""
    if isinstance(value, Message):
        return wire.EncodedValue(*to_wire(value))
    return wire.EncodedValue(None, codec.dumps(value).decode())


def decode_reply(data: wire.EncodedValue) -> Any:
    if data.message_type is not None:
        return from_wire(data.message_type, data.payload)
    return codec.loads(data.payload)
