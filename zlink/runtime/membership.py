"""Defer() barriers, APPLICATION_SIGNALED boundaries, Join and leave (§5; kotlin-spot-
interface relocation paragraphs).

Lock order (``zlink.lock_order``): the directory lock, alone; ``Membership._joins`` (an Actor's
``joining`` flag and what waits for its Join to end) is a leaf, taken with nothing else held.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import CLOSED, Admission, Gate, Lane, Turn, current_turn

if TYPE_CHECKING:
    from .runtime import Runtime
from ..messaging.calls import (
    JoinCall,
    RelocationReadyCall,
)
from ..types import (
    ActorJoinCompletion,
    ActorJoinResult,
    RelocationReadyStatus,
    SpotKind,
    SpotRelocationReadyCompletion,
)
from .acts import CLOSING, GONE, READY, SEALED, ActorAct, SpotAct
from .jobs import LifeJob, ReadyBoundary, discard_jobs, failure, lifecycle_error

if TYPE_CHECKING:
    from ..messaging.message import Message


_log = logging.getLogger("zlink.runtime")


class Membership:
    """Defer() barriers, Join and leave of one node (execution-model §5): the membership
    part of :class:`Runtime`. Collaborators: the runtime (its directory, gates, relocation
    port for cross-node Joins)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._joins = threading.Lock()  # a leaf (the module docstring)

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
        actor = self.rt.actors.get(call.actor_id)
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
        from ..types import ExecutionMode, RelocationCoordination

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
        if any(isinstance(b, ReadyBoundary) for b in turn.barriers):
            raise InvalidOperation("relocation_ready().defer() was already called in this turn")
        turn.barriers.append(ReadyBoundary(self.rt, act))

    def relocation_ready_completed(
        self, act: SpotAct, status: RelocationReadyStatus, error: ZLinkError | None = None
    ) -> None:
        """Queue ``on_relocation_ready_completed`` ahead of everything held for it."""
        done = SpotRelocationReadyCompletion(status, self.rt.node_id, error)
        act.owner.put_first(
            LifeJob(act, "on_relocation_ready_completed",
                    lambda: act.instance.on_relocation_ready_completed(done), lane=Lane.UNRESERVED)
        )  # fmt: skip

    # -- Join and leave --------------------------------------------------------------------------
    def _join_hold(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """The barrier: hold the Actor at its next turn boundary, then ask the target. Until
        the Join completes the Actor is ``joining``: its own Spot does not move then (the
        Join could wait for its room's move, and the Actor must be here when it ends)."""
        with self._joins:
            actor.joining = True
        ask = partial(self._join_ask, actor, target_id, request)
        actor.owner.put_unreserved(
            LifeJob(
                actor, "join", lambda: actor.owner.hold(ask), None, Lane.UNRESERVED, callback=False
            )
        )

    def _join_ask(self, actor: ActorAct, target_id: str, request: Message | None) -> None:
        """Runs once the Actor is quiescent and held: ask the target Spot (§5)."""
        if self.rt.actors.get(actor.actor_id) is not actor:  # gone meanwhile (fenced, say)
            self._end_join(actor)
            return
        target = self.rt.spots.get(target_id)
        error: ZLinkError | None = None
        relocator = self.rt.relocator
        if (
            target is not None
            and target is not actor.spot  # (its own Spot: refused below)
            and target.state == SEALED
            and relocator is not None
        ):  # moving: asked again once the move ended, where the room is then
            relocator.after_move(target_id, partial(self._join_ask, actor, target_id, request))
            self.rt.metrics.add("joins_waiting_for_move")
            return
        if (target is None or target.state == GONE) and self.rt.remote_join is not None:
            room = actor.spot
            if (
                relocator is not None
                and room is not actor.entry
                and relocator.members_follow(room.spot_id)
            ):  # its PER_ACTOR room moves, its members one by one after the shell: this one
                # follows first (an Actor probe: sealed to join elsewhere, it could not follow;
                # the move failed with its shell moved, and it stayed bound to the shell's old
                # place); a Join on this node needs no such wait: its member's move waits for it
                self.rt.metrics.add("joins_refused_room_moving")
                moving = Unavailable(
                    f"actor {actor.actor_id!r} cannot join {target_id!r} on another node while"
                    f" its Spot {room.spot_id!r} is moving; join again after the move"
                )
                done = ActorJoinCompletion(False, target_id, error=moving)
                self.complete_join(actor, done, None)
                return
            self.rt.remote_join.ask(actor, target_id, request)  # it lives on another node
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
            verdict = target.owner.put_life(job)
            if verdict == Admission.ADMITTED:
                return
            error = (
                Unavailable(f"{target_id!r} is sealed or closing")
                if verdict == Admission.CLOSED
                else ResourceExhausted(f"the lifecycle lane of {target_id!r} is full")
            )
        self.complete_join(actor, ActorJoinCompletion(False, target_id, error=error), None)

    def _join_decided(self, actor: ActorAct, target: SpotAct, turn: Turn) -> None:
        res = turn.result if turn.result is not None else ActorJoinResult()
        if turn.error is not None:  # (counted and logged by the job)
            done = ActorJoinCompletion(False, target.spot_id, error=failure(turn))
        elif not isinstance(res, ActorJoinResult):
            error: ZLinkError = InvalidArgument(f"on_actor_join gave {res!r}: not a JoinResult")
            lifecycle_error(target, "on_actor_join", error)
            done = ActorJoinCompletion(False, target.spot_id, error=error)
        elif not res.accept:
            error = InvalidOperation(f"{target.spot_id!r} rejected the join: {res.reason}")
            done = ActorJoinCompletion(False, target.spot_id, res.reply, error)
        else:
            with self.rt.directory.lock:  # (a close or a seal changes the state under it)
                ready = target.state is READY
                if ready:  # a member before any close takes its members' list
                    self._move(actor, target)
            if ready:
                self.joined_here(actor, target, res.reply)
                return
            # it closes or moves now: its close sent its members home already (a growth
            # probe's Actor joined a room that was gone, and stayed bound to it for good)
            error = Unavailable(f"{target.spot_id!r} closed or began to move as it accepted")
            done = ActorJoinCompletion(False, target.spot_id, res.reply, error)
        self.complete_join(actor, done, None)

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
                lambda _t: self.complete_join(actor, done, gate),
                Lane.UNRESERVED,
            )
        )

    def _move(self, actor: ActorAct, target: SpotAct) -> None:
        source = actor.spot
        if source is not actor.entry:
            source.members.pop(actor.actor_id, None)
        if source is not target:  # the Spot it leaves hears so, its Entry Spot too (§3)
            source.owner.put_unreserved(
                LifeJob(
                    source,
                    "on_leave_actor",
                    lambda: source.instance.on_leave_actor(actor.instance),
                    lane=Lane.UNRESERVED,
                )
            )
        actor.spot = target
        if target is not actor.entry:
            target.members[actor.actor_id] = actor

    def complete_join(self, actor: ActorAct, done: ActorJoinCompletion, gate: Gate | None) -> None:
        """``on_join_completed``, then the Actor's next turn (on ``gate``, when it joined).
        Not for an Actor its node dropped meanwhile (its fence: no lifecycle step runs on
        what it dropped, ``Closing.drop_all``; an audit found it run): skipped, counted.
        What waited for the Join to end (``after_join``) runs last."""
        waiting = self._ended(actor)
        try:
            if actor.state is GONE:
                self.rt.metrics.add("lifecycle_skipped_on_join_completed")
                return
            actor.owner.lanes.put_unreserved(
                LifeJob(
                    actor,
                    "on_join_completed",
                    lambda: actor.instance.on_join_completed(done),
                    lane=Lane.UNRESERVED,
                ),
                True,
            )
            actor.owner.unhold(gate)
        finally:
            for then in waiting:
                then()

    def _ended(self, actor: ActorAct) -> list[Callable[[], object]]:
        """``actor``'s Join is over: what waited for that (to be called, no lock held)."""
        with self._joins:
            actor.joining = False
            waiting, actor.after_join = actor.after_join, None
        return waiting or []

    def _end_join(self, actor: ActorAct) -> None:
        """A Join that ends with no callback to run (its Actor went away): who waits hears."""
        for then in self._ended(actor):
            then()

    def joining_of(self, actors: list[ActorAct]) -> list[str]:
        """The ids of those of ``actors`` with a Join under way (a move's seal: it does not
        move them; ``_joins`` is a leaf, taken under the seal's locks)."""
        with self._joins:
            return [a.actor_id for a in actors if a.joining]

    def after_join(self, actor: ActorAct, then: Callable[[], object]) -> None:
        """Call ``then`` once ``actor``'s Join under way has ended (now, if none is): a
        PER_ACTOR Spot's member follows its moved shell only then (``Relocator``)."""
        with self._joins:
            if actor.joining:
                if actor.after_join is None:
                    actor.after_join = []
                actor.after_join.append(then)
                return
        then()

    def leave(
        self, actor_id: str, from_spot: str | None, then: Callable[[], None] | None = None
    ) -> None:
        """Send an Actor back to its Entry Spot after its current turn (python-api §6)."""
        actor = self.rt.actors.get(actor_id)
        if actor is None or actor.state != READY:
            raise NotFound(f"no actor {actor_id!r}")
        if from_spot is not None and actor.spot.spot_id != from_spot:
            raise InvalidOperation(f"actor {actor_id!r} is not a member of {from_spot!r}")
        if actor.spot.state in (SEALED, GONE):  # closing sends members home itself
            raise Unavailable(f"{actor.spot.spot_id!r} is moving; leave after the move")
        go = partial(self._leave_go, actor, then, None if from_spot is None else actor.spot)
        actor.owner.put_unreserved(
            LifeJob(
                actor, "leave", lambda: actor.owner.hold(go), None, Lane.UNRESERVED, callback=False
            )
        )

    def _leave_go(
        self, actor: ActorAct, then: Callable[[], None] | None, member_of: SpotAct | None
    ) -> None:
        """(The Actor held, quiescent.) It goes home from the Spot it is in; ``member_of``:
        only from that one (a close sends its own members home: one that joined another
        Spot since stays there; an audit found it pulled out of the Spot it had just
        joined)."""
        source, entry = actor.spot, actor.entry
        if source is entry or (member_of is not None and source is not member_of):
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
                    Lane.UNRESERVED,
                )
            )

        source.owner.put_unreserved(
            LifeJob(source, "leave", lambda: None, back, Lane.UNRESERVED, callback=False)
        )

    def disconnect(self, actor_id: str, from_spot: str | None) -> None:
        """End an Actor (python-api §3 ``on_disconnect_actor``; execution-model §16
        "destroy"). It is sealed now, as a closing Spot is: a new call for it is refused
        (``Unavailable``), its timers stop, and what is queued for it is discarded and counted
        (``messages_discarded_actor_disconnected``). After its current turn, the Spot it is in
        gets ``on_disconnect_actor(actor)`` (its Entry Spot, if it joined none), and it is
        gone: from then on a call for it meets ``NotFound``, and its Location Store row is
        released. A second disconnect before it went does nothing. Like ``leave``, not while
        the Spot it is in moves (``Unavailable``)."""
        actor = self.rt.actors.get(actor_id)
        if actor is not None and actor.state == CLOSING:
            return  # ending already
        if actor is not None and actor.state == SEALED:  # moving with its Spot: not gone
            raise Unavailable(f"actor {actor_id!r} is moving; disconnect after the move")
        if actor is None or actor.state != READY:
            raise NotFound(f"no actor {actor_id!r}")
        if from_spot is not None and actor.spot.spot_id != from_spot:
            raise InvalidOperation(f"actor {actor_id!r} is not a member of {from_spot!r}")
        with self.rt.directory.lock:
            if actor.spot.state in (SEALED, GONE):
                raise Unavailable(f"{actor.spot.spot_id!r} is moving; disconnect after the move")
            if actor.state != READY:
                return  # (another thread's disconnect, or the node fenced, just now)
            actor.state = CLOSING
        actor.owner.lanes.end_waits()  # who waits for room is refused as a new call is now
        actor.cancel_timers()
        go = partial(self._disconnect_go, actor)
        job = LifeJob(
            actor, "disconnect", lambda: actor.owner.hold(go), None, Lane.UNRESERVED, callback=False
        )
        actor.owner.put_unreserved(job)

    def _disconnect_go(self, actor: ActorAct) -> None:
        """(The Actor held, quiescent.) ``on_disconnect_actor`` on the Spot it is in; not
        on one closing or gone (its ``on_closing`` ran, or runs first: nothing of it runs
        after that, python-api §11), and not once the node fenced itself (no lifecycle step
        then: ``Closing.drop_all``)."""
        if actor.state != CLOSING:  # the node fenced meanwhile: it is gone already
            return
        host = actor.spot
        if host.state in (CLOSING, GONE):
            self.rt.metrics.add("lifecycle_skipped_on_disconnect_actor")
            self._disconnected(actor, host)
            return

        def run() -> Any:
            if actor.state != CLOSING or host.state in (CLOSING, GONE):
                return None  # fenced, or the room closed, since it was queued
            return host.instance.on_disconnect_actor(actor.instance)

        host.owner.put_unreserved(
            LifeJob(
                host,
                "on_disconnect_actor",
                run,
                lambda _t: self._disconnected(actor, host),
                Lane.UNRESERVED,
            )
        )

    def _disconnected(self, actor: ActorAct, host: SpotAct) -> None:
        """``on_disconnect_actor`` ended (a failure was counted by its job), or was discarded
        unrun (the node stops): the Actor leaves the node and the store."""
        rt = self.rt
        with rt.directory.lock:
            if actor.state != CLOSING:  # dropped by the node's fence meanwhile: not ours
                return
            actor.state = GONE
            if host.members.get(actor.actor_id) is actor:
                del host.members[actor.actor_id]
            rt.directory.forget(actor)
            if rt.router is not None:  # its release, from now until it ends
                rt.releasing.setdefault(actor.actor_id, [])
        router = rt.router
        if router is not None:  # on the store thread; fenced: a stale owner's is refused
            router.fenced_write("release", router.store.release, actor.actor_id,
                                rt.node_id, rt.incarnation, actor.authority)  # fmt: skip
        error = NotFound(f"actor {actor.actor_id!r} was disconnected")
        actor.owner.lanes.end_waits()
        discard_jobs(rt, actor.owner.drain(), error, "actor_disconnected")
        rt.metrics.add("actors_disconnected")

    def actor_spot_id(self, actor_id: str) -> str:
        actor = self.rt.actors.get(actor_id)
        if actor is None:
            raise NotFound(f"no actor {actor_id!r}")
        return actor.spot.spot_id
