"""The source side of a relocation: seal, barrier, capture, ship, commit (see ``relocator``).

Guarantees / assumes:
* The seal is taken under the relocator's lock and the directory lock together, and lane
  admission is closed right after: no producer slips past it.
* Parked calls are relayed, in arrival order, before the store commits authority; the commit
  (``transfer``) runs on the store thread, its continuation on the infrastructure thread.
* Lock order (``zlink.lock_order``): route -> relocator -> directory; ``_reopen`` takes route
  first because redelivering a parked call may route it onward.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, InvalidOperation, StateIncompatible, Unavailable, ZLinkError
from ..executor import Job, Lane, Turn
from ..mesh import wire
from ..mesh.location import Location
from ..messaging import codec
from ..messaging.completion import Completion
from ..messaging.message import Message, reply_type, to_wire
from ..runtime.routing import Route
from ..timers import TimerJob
from ..types import (
    RelocationCoordination,
    RelocationPolicy,
    RelocationReadyStatus,
    SpotKind,
    TargetKind,
)

if TYPE_CHECKING:
    from ..runtime.acts import ActorAct, SpotAct
    from ..runtime.routing import Relayable

from .state import (
    RESTORE_ATTEMPTS,
    Outgoing,
    RelocatorState,
    capture_one,
    timers_of,
    typed_error,
)

_log = logging.getLogger("zlink.relocation")


class Outbound(RelocatorState):
    """Moves leaving this node."""

    def start(self, act: SpotAct, target: str) -> Completion:
        """Seal ``act`` and its members and queue the barrier turn; done once committed.

        An ``APPLICATION_SIGNALED`` Spot is only asked: the move waits for its next
        ``relocation_ready().defer()`` boundary (see :meth:`signaled`).
        """
        spec = act.spec
        if act.kind is SpotKind.ENTRY:
            raise InvalidOperation(f"{act.spot_id!r} is an Entry Spot; Entry Spots never move")
        if spec.relocation.kind is RelocationPolicy.DISABLED:
            raise InvalidOperation(f"{spec.name!r} is registered with Relocation.disabled()")
        if target == self.rt.node_id:
            raise InvalidArgument("a Spot relocates to another node, not its own")
        if not self.router.transport.reachable(target):  # before anything is sealed
            raise Unavailable(f"node {target!r} is not reachable from {self.rt.node_id}")
        done = Completion()
        if spec.coordination is RelocationCoordination.APPLICATION_SIGNALED:
            with self._lock:
                if act.spot_id in self._wanted:
                    raise Unavailable(f"a move of {act.spot_id!r} already waits for its signal")
                self._wanted[act.spot_id] = (target, done)
            return done
        if act.kind is SpotKind.USER and not act.shared:  # PER_ACTOR: shell, then each Actor
            shell = Completion()
            shell.add_callback(lambda _v, error: self._shell_moved(act, target, done, error))
            self.seal(act, target, shell, signaled=False)
            return done
        self.seal(act, target, done, signaled=False)
        return done

    def _shell_moved(
        self, act: SpotAct, target: str, done: Completion, error: BaseException | None
    ) -> None:
        """A PER_ACTOR Spot's authority is on the target: now each member Actor moves on its
        own, in the order it finishes its current turn (kotlin-spot-interface)."""
        if error is not None:
            done.set(None, error)
            return
        members = list(act.members.values())
        if not members:
            done.set(None, None)
            return
        left = [len(members)]
        errors: list[BaseException] = []
        lock = threading.Lock()

        def one(_v: Any, err: BaseException | None) -> None:
            with lock:
                left[0] -= 1
                if err is not None:
                    errors.append(err)
                last = left[0] == 0
            if last:
                done.set(None, errors[0] if errors else None)

        for member in members:
            moved = Completion()
            moved.add_callback(one)
            self._move_actor(act, member, target, moved, RESTORE_ATTEMPTS)

    def _move_actor(
        self, spot: SpotAct, actor: ActorAct, target: str, done: Completion, tries: int
    ) -> None:
        """Move one Actor of a moved PER_ACTOR Spot; a failed barrier is tried again."""

        def settled(_v: Any, error: BaseException | None) -> None:
            if error is None or actor.spot is not spot:  # moved, or it left meanwhile
                done.set(None, None)
            elif tries > 1 and isinstance(error, Unavailable):
                self.rt.infra.submit(self._move_actor, spot, actor, target, done, tries - 1)
            else:
                done.set(None, error)

        attempt = Completion()
        attempt.add_callback(settled)
        try:
            self.seal(spot, target, attempt, signaled=False, unit=actor)
        except ZLinkError as exc:
            attempt.set(None, exc)

    def withdraw(self, spot_id: str, done: Completion) -> bool:
        """Give up a move still waiting for its signal; ``False`` if it started meanwhile."""
        with self._lock:
            if self._wanted.get(spot_id, (None, None))[1] is done:
                del self._wanted[spot_id]
                return True
            return False

    def signaled(self, act: SpotAct) -> bool:
        """The Spot reached a ``relocation_ready()`` boundary: start a waiting move now.

        ``False`` when none waits (the Spot is told CONTINUED by the caller).
        """
        with self._lock:
            wanted = self._wanted.pop(act.spot_id, None)
        if wanted is None:
            return False
        target, done = wanted
        try:
            self.seal(act, target, done, signaled=True)
        except ZLinkError as exc:  # it continues here, and is told why
            done.set(None, exc)
            self.rt.relocation_ready_completed(act, RelocationReadyStatus.CONTINUED, exc)
        return True

    def seal(
        self,
        act: SpotAct,
        target: str,
        done: Completion,
        signaled: bool,
        unit: ActorAct | None = None,
        join: tuple[str, wire.JoinGrant] | None = None,
    ) -> None:
        """Seal the objects of one move and queue its barrier turn on ``unit``'s lanes (the
        Spot's, or one Actor's of a PER_ACTOR Spot). ``join``: a cross-node Join of the held
        Actor ``unit`` into that Spot on ``target``; being held, it needs no barrier turn."""
        from ..runtime.acts import READY, SEALED
        from ..runtime.jobs import LifeJob

        with self._lock, self.rt.directory.lock:
            members = list(act.members.values())
            if unit is not None:
                objects: list[SpotAct | ActorAct] = [unit]
                members = [unit]
            elif act.shared or act.kind is not SpotKind.USER:
                objects = [act, *members]  # SpotWide: one unit with its members
            else:
                objects = [act]  # PER_ACTOR: the shell first; each Actor moves later
            for member in members:
                if member.spec.relocation.kind is RelocationPolicy.DISABLED:
                    raise InvalidOperation(
                        f"member {member.actor_id!r} is a {member.spec.name!r}, registered "
                        "with Relocation.disabled(); its Spot cannot move while it is a member"
                    )
            if any(o.state != READY for o in objects):
                raise Unavailable(f"{act.spot_id!r} is not ready (sealed, closing or activating)")
            out = Outgoing(
                next(self._ids), unit or act, act, objects, target, done, signaled=signaled
            )
            if join is not None:
                out.into, out.join = join
            for obj in objects:
                obj.state = SEALED  # from here calls are parked; nothing accepted is lost
                self._out_ids[obj.name] = out
            self._out[out.rid] = out
        for obj in objects:
            obj.owner.lanes.set_closed(True)  # atomic with producers: none slips past
        if join is not None:  # held at its boundary already: capture and ship now
            try:
                states = self._capture(out)
            except Exception as exc:  # noqa: BLE001 - a capture failure keeps it here
                self._reopen(out, exc)
                return
            self._send(out, states)
            return
        owner = out.unit.owner
        barrier = LifeJob(out.unit, "relocation barrier", lambda: self._capture(out),
                          lambda turn: self._ship(out, turn), Lane.UNRESERVED,
                          callback=False)  # fmt: skip
        if signaled:  # the boundary the Spot chose: nothing queued runs before it
            owner.put_first(barrier)
        else:
            owner.put_unreserved(barrier)

    def _capture(self, out: Outgoing) -> dict[str, str | None]:
        """Inside the barrier turn: refuse if anything is in flight, then capture every object."""
        from ..runtime.jobs import LifeJob

        act = out.spot
        if out.kind == TargetKind.SPOT and act.shared:
            if set(act.members) != {o.name for o in out.objects if o is not act}:
                raise Unavailable(f"{act.spot_id!r}: its members changed while sealing")
            if act.yields_out:
                raise Unavailable(f"{act.spot_id!r}: a Yield is still in flight (barrier failed)")
        if out.kind == TargetKind.ACTOR and out.unit.spot is not act:  # type: ignore[union-attr]
            raise Unavailable(f"{out.unit.name!r} left {act.spot_id!r} while sealing")
        for obj in out.objects:
            pending = obj.owner.lanes.snapshot()
            if obj.owner.yield_pending():
                raise Unavailable(f"{obj.name!r}: a Yield is still in flight (barrier failed)")
            if any(isinstance(i, LifeJob) for i in pending):
                raise Unavailable(f"{obj.name!r}: lifecycle work is queued (barrier failed)")
        return {obj.name: capture_one(obj) for obj in out.objects}

    def _ship(self, out: Outgoing, turn: Turn) -> None:
        if turn.error is not None:  # barrier or capture failure: admission back, exactly
            self._reopen(out, turn.error)
            return
        self._send(out, turn.result)

    def _send(self, out: Outgoing, states: dict[str, str | None]) -> None:
        """Queues, timers and states leave for the target, in chunks."""
        timers = {}
        for obj in out.objects:  # stopped first: a tick that still slips in is a no-op here
            # a PER_ACTOR Spot's own timers do not move (kotlin-spot-interface): the shell
            # is recreated and registers what it needs
            keep = obj is not out.spot or out.spot.shared or out.spot.kind is not SpotKind.USER
            timers[obj.name] = list(obj.timers.values()) if keep else []
            obj.cancel_timers()
        objects = tuple(
            wire.RelocObject(obj.name, obj.spec.name, self._take_jobs(obj, out.target),
                             timers_of(timers[obj.name]))
            for obj in out.objects
        )  # fmt: skip
        blob = codec.dumps(states).decode()
        size = self.chunk_limit
        chunks = [blob[i : i + size] for i in range(0, len(blob), size)]
        act, me = out.spot, self.rt.node_id
        try:
            for n, chunk in enumerate(chunks):
                self.router.post(out.target, wire.RelocChunkEnvelope(me, out.rid, n, chunk))
            self.router.post(out.target, wire.RelocEnvelope(
                me, out.rid, out.into or act.spot_id, act.spec.name, act.ref.object_generation,
                len(chunks), objects, out.signaled, str(out.kind), out.join,
            ))  # fmt: skip
        except Unavailable as exc:  # the target is gone: nothing left; keep it sealed here
            _log.error("relocation of %r to %s could not start: %s", act.spot_id, out.target, exc)
            self._finish(out, exc)

    def _take_jobs(self, obj: SpotAct | ActorAct, target: str) -> tuple[wire.RelocJob, ...]:
        """Everything queued behind the barrier, in order, as it will be queued on the target."""
        from ..runtime.jobs import BatchJob, SendJob

        jobs: list[wire.RelocJob] = []
        for item in obj.owner.drain():
            if isinstance(item, Job) and item.lane != Lane.UNRESERVED:  # reserved again on arrival
                obj.owner.lanes.release(item.lane, item.size, item.count)
            if isinstance(item, SendJob):  # a MessageJob is one too
                corr = None
                if item.reply is not None:  # its caller waits here: the target answers us
                    tp = reply_type(type(item.msg))
                    corr = self.router.register_pending(item.reply, tp, target)
                jobs.append(_message_job(item.msg, item.meta, item.sender, corr, item.topic))
            elif isinstance(item, BatchJob):  # a batch moves as its messages, in order
                jobs += [_message_job(msg, None, item.sender) for msg in item.msgs]
            elif isinstance(item, TimerJob):  # a place on the lane: the target decides its
                t = item.timer.pending_tick(item.at)  # tick when it runs (python-api §11)
                jobs.append(wire.RelocTickJob(t.name, t.sequence, t.scheduled_at, t.fired_at,
                                              t.late_ticks))  # fmt: skip
                item.timer.withdraw()
        return tuple(jobs)

    def _reopen(self, out: Outgoing, error: BaseException) -> None:
        """The barrier failed: parked calls run here first, then admission reopens."""
        from ..runtime.acts import READY

        # lock order: route -> relocator (redelivery may route a parked call onward)
        with self.router.route_lock, self._lock:
            for obj in out.objects:
                obj.owner.lanes.set_closed(False)
            self._forget_out(out)
            for env in out.parked:  # still sealed: these go first, in arrival order
                self.router.redeliver(env, force=True)
            out.parked.clear()
            for obj in out.objects:
                obj.state = READY
            if out.signaled:  # told before anything it held back runs
                self.rt.relocation_ready_completed(
                    out.spot, RelocationReadyStatus.CONTINUED, typed_error(error)
                )
        out.done.set(None, typed_error(error))

    def on_restored(self, env: wire.RelocDoneEnvelope) -> None:
        """The target restored (or gave up): commit authority, then let it open admission."""
        out = self._out.get(env.relocation_id)
        if out is None or out.relaying:  # gone, or a repeat while the commit is under way
            return
        if env.error is not None:  # the target stays sealed; so does this node (nothing is lost)
            self._finish(out, StateIncompatible(env.error))
            return
        router, rt = self.router, self.rt
        with self._lock:  # before the commit, in arrival order: per-sender order holds
            for parked in out.parked:
                self._relay(out, parked)
            out.parked.clear()
            out.relaying = True
        claims = [(obj.name, obj.authority) for obj in out.objects]
        lease = rt.lease()

        def transfer() -> tuple[list[Location], BaseException | None]:  # store thread, no lock
            moved: list[Location] = []
            for name, authority in claims:
                try:
                    moved.append(router.store.transfer(name, rt.node_id, authority, out.target,
                                                       lease))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - what moved keeps its pointer
                    return moved, exc
            return moved, None

        committed = router.store_worker.call(transfer)
        committed.add_callback(lambda result, error: self._committed(out, result, error))

    def _committed(
        self, out: Outgoing, result: tuple[list[Location], BaseException | None] | None,
        error: BaseException | None,
    ) -> None:  # fmt: skip
        """On the infrastructure thread: the store moved authority (or refused: fenced, this
        node is a stale owner and commits nothing); the source lets go, the target opens."""
        from ..runtime.acts import GONE

        router, rt = self.router, self.rt
        moved, failed = result if result is not None else ([], error)
        authority: dict[str, int] = {}
        for location in moved:  # moved in the store: relayed there from now on, whatever else
            authority[location.spot_id] = location.authority_generation
            router.moved_away(location.spot_id, Route.at(location))
        if failed is not None:
            _log.error("relocation of %r: the store refused the commit: %s", out.spot.name, failed)
            self._finish(out, failed)
            return
        with router.route_lock, rt.directory.lock:  # from now on stale routes relay to the target
            for obj in out.objects:
                table: dict[str, Any] = rt.spots if obj is out.spot else rt.actors
                if table.get(obj.name) is obj:
                    del table[obj.name]
        for obj in out.objects:
            obj.state = GONE
        rt.metrics.add("relocated_out")
        try:
            router.post(out.target, wire.RelocCommitEnvelope(rt.node_id, out.rid, authority))
        except Unavailable as exc:  # the target went away meanwhile: the move ends here
            _log.error("relocation of %r: the target left before the commit", out.spot.name)
            self._finish(out, exc)

    def on_opened(self, env: wire.RelocOpenedEnvelope) -> None:
        out = self._out.get(env.relocation_id)
        if out is not None:
            self._finish(out, None)

    def _finish(self, out: Outgoing, error: BaseException | None) -> None:
        with self._lock:
            self._forget_out(out)
        out.done.set(None, None if error is None else typed_error(error))

    def _forget_out(self, out: Outgoing) -> None:
        self._out.pop(out.rid, None)
        for obj in out.objects:
            if self._out_ids.get(obj.name) is out:
                del self._out_ids[obj.name]

    def divert_envelope(self, target: str, env: Relayable) -> bool:
        """A call or fence for a target sealed here: park it, or relay it once restored."""
        with self._lock:
            out = self._out_ids.get(target)
            if out is None:
                return False
            if out.relaying:
                self._relay(out, env)
            else:
                out.parked.append(env)
            return True

    def _relay(self, out: Outgoing, env: Relayable) -> None:
        """Hand a call or fence that met the move on to the target, as one more hop."""
        self.router.post(out.target, replace(env, hops=env.hops + 1, via=self.rt.node_id))


def _message_job(
    msg: Message, meta: dict[str, str] | None, sender: str | None, corr: int | None = None,
    topic: str | None = None,
) -> wire.RelocMessageJob:  # fmt: skip
    """A queued message as it moves: its wire form, headers, sender, reply route, topic."""
    return wire.RelocMessageJob(*to_wire(msg), meta, sender, corr, topic)
