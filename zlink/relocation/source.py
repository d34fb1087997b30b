"""The source side of a relocation: seal, barrier, capture, ship, commit (see ``relocator``).

Guarantees / assumes:
* The seal is taken under the relocator's lock and the directory lock together, and lane
  admission is closed right after: no producer slips past it.
* Parked calls are relayed, in arrival order, before the store commits authority; the commit
  (``transfer``) runs on the store thread, its continuation on the infrastructure thread.
* Until the commit is under way (``Outgoing.relaying``, set under the relocator's lock) the
  move can be undone (:meth:`Outbound._reopen`): the queue and timers that left are kept and
  put back, parked calls follow them, nothing accepted is lost or run twice.
* A store that refuses the commit and still names this node (checked on the store thread)
  undoes the move too, after the relay: what was relayed is kept (``Outgoing.relayed``) until
  the store answers, and served here, in order, before anything admitted after the reopening.
* A target declared down (:meth:`Outbound.target_down`, called before the router fails what
  awaits that peer) ends every move to it at once (python-api §10 "Failure", §11); requests a
  move that did not happen serves here are no longer awaited from the target
  (``MeshRouter.rebind_pending``), so its loss does not fail them.
* Lock order (``zlink.lock_order``): route -> relocator -> directory; ``_reopen`` takes route
  first because redelivering a parked call may route it onward.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    DeadlineExceeded,
    InvalidArgument,
    InvalidOperation,
    StateIncompatible,
    Unavailable,
    ZLinkError,
)
from ..executor import CallJob, Job, Lane, Owner, Turn
from ..mesh import wire
from ..mesh.location import Location
from ..messaging import codec
from ..messaging.completion import Admitted, Completion
from ..messaging.message import Message, reply_type, to_wire
from ..runtime import events
from ..runtime.closing import countdown
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

from ..runtime.waits import KeptWait, accepted, take_waiting
from .state import (
    RESTORE_ATTEMPTS,
    STORE_RETRY,
    Outgoing,
    RelocatorState,
    capture_one,
    restore_timers,
    take_timers,
    typed_error,
)

_log = logging.getLogger("zlink.relocation")


class Outbound(RelocatorState):
    """Moves leaving this node."""

    def start(self, act: SpotAct, target: str, timeout: float | None = None) -> Completion:
        """Seal ``act`` and its members and queue the barrier turn; done once committed.

        An ``APPLICATION_SIGNALED`` Spot is only asked: the move waits for its next
        ``relocation_ready().defer()`` boundary (see :meth:`signaled`). ``timeout``: seconds on
        the node's clock after which a move that has not reached its commit is withdrawn
        (:meth:`withdraw`; python-api §8): ``done`` then fails with ``DeadlineExceeded``.
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
        if timeout is not None:  # cancelled when done completes
            done.timer = self.rt.infra.call_later(timeout, self._overdue, act.spot_id, done,
                                                  timeout)  # fmt: skip
        try:
            self._begin(act, target, done)
        except BaseException:  # refused before anything was sealed: no deadline either
            if done.timer is not None:
                done.timer.cancel()
            raise
        return done

    def _begin(self, act: SpotAct, target: str, done: Completion) -> None:
        if act.spec.coordination is RelocationCoordination.APPLICATION_SIGNALED:
            with self._lock:
                if self.stopping is not None:  # (``withdraw_all`` emptied the wanted ones)
                    raise Unavailable(self.stopping)
                if act.spot_id in self._wanted:
                    raise Unavailable(f"a move of {act.spot_id!r} already waits for its signal")
                self._wanted[act.spot_id] = (target, done)
            return
        if act.kind is SpotKind.USER and not act.shared:  # PER_ACTOR: shell, then each Actor
            spot_id = act.spot_id
            with self._lock:  # (before the seal reads its members' Joins: ``members_follow``)
                self._following.add(spot_id)
            done.add_callback(lambda _v, _e: self._followed(spot_id))
            shell = Completion()
            shell.add_callback(lambda _v, error: self._shell_moved(act, target, done, error))
            try:
                self.seal(act, target, shell, signaled=False, caller=done)
            except BaseException:
                self._followed(spot_id)
                raise
            return
        self.seal(act, target, done, signaled=False)

    def members_follow(self, spot_id: str) -> bool:
        """Whether a move of the PER_ACTOR Spot ``spot_id`` is under way here (its shell's, or
        its members' after it): a member then follows it before it joins a room on another
        node (``Membership._join_ask``; an Actor probe found one sealed to join elsewhere
        that could not follow, the move failed with its shell moved). A set read: any
        thread; set before the seal reads its members' Joins."""
        return spot_id in self._following

    def _followed(self, spot_id: str) -> None:
        with self._lock:
            self._following.discard(spot_id)

    def _overdue(self, spot_id: str, done: Completion, timeout: float) -> None:
        """(Infrastructure thread.) The move's deadline passed on the node's clock."""
        self.withdraw(spot_id, done, DeadlineExceeded(
            f"the move of {spot_id!r} did not finish within {timeout:g} s; it was withdrawn"
        ))  # fmt: skip

    def under_way(self, spot_id: str) -> Completion | None:
        """What the caller of a move of ``spot_id`` already under way waits on (its outcome),
        or ``None``: a node that drains waits for it rather than leave the Spot behind."""
        with self._lock:
            move = self._out_ids.get(spot_id)
            if move is not None and move.spot.spot_id == spot_id:
                return move.caller or move.done
            wanted = self._wanted.get(spot_id)
            return None if wanted is None else wanted[1]

    def wait_move(self, spot_id: str, done: Completion, seconds: float, grace: float) -> None:
        """Block the calling thread for the outcome of the move ``done`` stands for: return
        once it happened, raise why it did not. After ``seconds`` (real time; its deadline on
        the node's clock withdraws it as well) a move not yet at its commit is withdrawn and
        this raises ``DeadlineExceeded``, which always means the move did not happen
        (python-api §8). One past its point of no return is waited for up to ``grace`` more
        seconds; one that still does not confirm then raises ``Unavailable``."""
        if not _settles(done, seconds):
            error = DeadlineExceeded(
                f"the move of {spot_id!r} did not finish within {seconds:g} s; it was withdrawn"
            )
            if not self.withdraw(spot_id, done, error) and not _settles(done, grace):
                raise Unavailable(
                    f"the move of {spot_id!r} is past its commit but did not confirm it "
                    f"within {seconds + grace:g} s"
                )
        done.wait(0)  # its outcome: returns, or raises why it did not happen

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
        if actor.spot is not spot:  # it left meanwhile (a Join on this node ended, say)
            done.set(None, None)
            return

        def settled(_v: Any, error: BaseException | None) -> None:
            if error is None or actor.spot is not spot:  # moved, or it left meanwhile
                done.set(None, None)
            elif tries > 1 and isinstance(error, Unavailable):  # tried again once a Join
                # it began ends (a Join begun as the shell moved fails at once: it follows
                # first; one under way from before keeps it sealed to join: a probe saw
                # every try fail at once, and the move fail with its shell moved)
                again = partial(self.rt.infra.submit, self._move_actor, spot, actor, target,
                                done, tries - 1)  # fmt: skip
                self.rt.membership.after_join(actor, again)
            else:
                done.set(None, error)

        attempt = Completion()
        attempt.add_callback(settled)
        try:  # (it continues a committed shell move: a stop does not refuse it, a review
            self.seal(spot, target, attempt, signaled=False, unit=actor, follows=True)
        except ZLinkError as exc:  # found the members lost, the Spot moved without them)
            attempt.set(None, exc)

    def withdraw(self, spot_id: str, done: Completion, error: ZLinkError) -> bool:
        """Withdraw the move ``done`` stands for, unless it ended or its commit is under way
        (python-api §8): one still waiting for its signal is forgotten; a sealed one is undone
        as a failed one is (:meth:`_reopen`: admission restored, its queue and the calls it
        parked served here in order, the target told to forget its copy). ``True`` when
        withdrawn: ``done`` then fails with ``error`` and the move never happens."""
        with self._lock:
            if self._wanted.get(spot_id, (None, None))[1] is done:
                del self._wanted[spot_id]
                out = None
            else:
                out = next((o for o in self._out.values() if done in (o.done, o.caller)), None)
                if out is None:
                    return False
        if out is None:
            done.set(None, error)
            return True
        return self._reopen(out, error)

    def withdraw_all(self, error: ZLinkError) -> None:
        """(A stop without a drain.) Every move leaving this node is withdrawn as
        :meth:`withdraw` does (its Spot serves here again, to be closed by the stop with the
        rest; its caller hears ``error``), but one whose commit is under way: the store's
        answer decides it (``Relocator.wait_moves``; an audit found the stop run the Spot's
        ``on_closing`` here while the commit gave it to the target). No move begins after."""
        with self._lock:  # from now on no move begins (``start``, ``seal``)
            self.stopping = str(error)
            wanted, self._wanted = list(self._wanted.values()), {}
            outs = list(self._out.values())
        for _target, done in wanted:
            done.set(None, error)
        for out in outs:
            self._reopen(out, error)  # (``False``: its commit is under way, left to the store)

    def leaving(self, spot_id: str) -> bool:
        """Whether a move of ``spot_id`` is leaving this node now (a dict read: any thread)."""
        return spot_id in self._out_ids

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

    def self_close(self, act: SpotAct, close: Callable[[], bool]) -> bool:
        """``RelocationPort.self_close``: the relocator's lock, then the directory's (the
        seal's order), so a seal and a close never cross."""
        from ..runtime.acts import SEALED

        with self._lock:
            out = self._out_ids.get(act.spot_id)
            if out is not None and out.spot is act and not out.shipped:
                with self.rt.directory.lock:
                    if act.state == SEALED:  # (sealed with the move: under these locks)
                        act.close_asked = True  # the barrier withdraws the move
                        return False
            return close()

    def seal(
        self,
        act: SpotAct,
        target: str,
        done: Completion,
        signaled: bool,
        unit: ActorAct | None = None,
        join: tuple[str, wire.JoinGrant] | None = None,
        caller: Completion | None = None,
        follows: bool = False,
    ) -> None:
        """Seal the objects of one move and queue its barrier turn on ``unit``'s lanes (the
        Spot's, or one Actor's of a PER_ACTOR Spot). ``join``: a cross-node Join of the held
        Actor ``unit`` into that Spot on ``target``; being held, it needs no barrier turn.
        ``caller``: what the caller of the move waits on, when not ``done`` (a PER_ACTOR
        Spot's shell move is one step of it). ``follows``: a member's move after its PER_ACTOR
        shell committed (a stop refuses every other move from ``withdraw_all`` on)."""
        with self._lock:  # released only once the waits the seal ends are parked (below)
            if self.stopping is not None and not follows:  # (``withdraw_all``: a review
                raise Unavailable(self.stopping)  # found a move begun just after it left
                # its Spot sealed through the stop)
            with self.rt.directory.lock:
                out = self._seal_objects(act, target, done, signaled, unit, join, caller)
            # Admission closes atomically with every producer, and the calls that waited for
            # room in these lanes are routed again (parked, in their order) while this lock
            # is still held: a call another thread takes for the sealed objects meanwhile is
            # diverted under this lock too, so behind them (per-sender order, python-api §9).
            for obj in out.objects:
                obj.owner.lanes.set_closed(True)
        if join is not None:  # held at its boundary already: capture and ship now
            try:
                states = self._capture(out)
            except Exception as exc:  # noqa: BLE001 - a capture failure keeps it here
                self._reopen(out, exc)
                return
            if states is not None:  # an Actor unit never waits for a barrier
                self._send(out, states)
            return
        self._barrier(out, first=signaled)  # the boundary the Spot chose: nothing runs first

    def _seal_objects(
        self,
        act: SpotAct,
        target: str,
        done: Completion,
        signaled: bool,
        unit: ActorAct | None,
        join: tuple[str, wire.JoinGrant] | None,
        caller: Completion | None,
    ) -> Outgoing:
        """(Relocator and directory locks held.) Mark the objects of one move sealed and
        record the move; ``Unavailable`` / ``InvalidOperation`` with nothing changed."""
        from ..runtime.acts import READY, SEALED

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
        ending = [m.actor_id for m in members if m.state != READY]
        if ending:  # (a PER_ACTOR shell would move, and each member then fail to follow)
            raise Unavailable(
                f"{act.spot_id!r} cannot move while its member {ending[0]!r} is not ready "
                "(ending, sealed or activating)"
            )
        joining = self.rt.membership.joining_of(members) if join is None else []
        if joining:  # its Join may wait for its room's move: it must be here when it ends
            raise Unavailable(
                f"{act.spot_id!r} cannot move while its member {joining[0]!r} joins another Spot"
            )
        out = Outgoing(next(self._ids), unit or act, act, objects, target, done,
                       signaled=signaled, caller=caller)  # fmt: skip
        if join is not None:
            out.into, out.join = join
        for obj in objects:
            obj.state = SEALED  # from here calls are parked; nothing accepted is lost
            self._out_ids[obj.name] = out
        self._out[out.rid] = out
        return out

    def _barrier(self, out: Outgoing, first: bool) -> None:
        """Queue the move's barrier turn on its unit's lifecycle lane (``first``: ahead of
        everything queued)."""
        from ..runtime.jobs import LifeJob

        owner = out.unit.owner
        barrier = LifeJob(out.unit, "relocation barrier", lambda: self._capture(out),
                          lambda turn: self._ship(out, turn), Lane.UNRESERVED,
                          callback=False)  # fmt: skip
        if first:
            owner.put_first(barrier)
        else:
            owner.put_unreserved(barrier)

    def _barrier_again(self, out: Outgoing) -> None:
        """The last suspended continuation of the moving Spot resumed: the barrier turn goes
        again, first, at the next turn boundary (unless the move was withdrawn meanwhile)."""
        if self._out.get(out.rid) is out and not out.shipped:
            self._barrier(out, first=True)

    def _timer_gates_held(self, out: Outgoing, act: SpotAct) -> bool:
        """(The barrier turn.) A PER_ACTOR Spot runs its timer callbacks on gates of their own
        (§2), beside its handlers: the barrier holds each of them, once the callback it runs,
        or keeps across an await, has ended (as a close waits for them; python-api §11: no
        continuation runs here after the commit), so none starts or resumes until the move
        ends. ``True`` once all are held; else the barrier comes again when they are."""
        gates = [o for o in act.timer_owners or () if o not in out.timer_gates]
        if not gates:
            return True
        again = countdown(len(gates), partial(self._barrier_again, out))
        for owner in gates:  # (ahead of its queued ticks: they wait for the move's end)
            owner.put_first(CallJob(partial(self._hold_timer_gate, out, owner, again),
                                    Lane.UNRESERVED))  # fmt: skip
        return False

    def _hold_timer_gate(self, out: Outgoing, owner: Owner, then: Callable[[], None]) -> None:
        """(On that timer gate.) Hold it for the move, unless the move ended meanwhile; it is
        the move's once quiescent (``_timer_gate_held``): only then may another thread let it
        go (``Owner.unhold``), never while its gate still runs this turn."""
        with self._lock:
            current = self._out.get(out.rid) is out
        if current:
            owner.hold(after=partial(self._timer_gate_held, out, owner, then))
        else:
            then()  # (the barrier it would come back to is no more: a no-op)

    def _timer_gate_held(self, out: Outgoing, owner: Owner, then: Callable[[], None]) -> None:
        """(Its gate, the owner quiescent and held.) The move keeps it, or, ended meanwhile
        (its ``_reopen`` did not know of it), lets it go at once."""
        with self._lock:
            current = self._out.get(out.rid) is out
            if current:
                out.timer_gates.append(owner)
        if not current:
            owner.unhold()
        then()

    def _capture(self, out: Outgoing) -> dict[str, str | None] | None:
        """Inside the barrier turn: capture every object, or ``None`` for nothing to ship
        (withdrawn, or the barrier is not reached yet). A SpotWide Spot with a handler
        suspended in a Yield (its own or a member's) is not at the all-lane barrier: the turn
        ends and comes again once every such continuation has resumed and finished its turn
        on this node (python-api §11; kotlin-spot-interface: "including all coroutine
        continuations"); the seal stays, and the move's deadline still withdraws it. Members
        that changed or lifecycle work queued fail the barrier (admission comes back)."""
        from ..runtime.jobs import LifeJob

        act = out.spot
        if self._out.get(out.rid) is not out:  # withdrawn before its barrier: nothing to do
            return None
        if act.close_asked:  # it closed itself meanwhile: the close wins (``_reopen`` closes)
            raise Unavailable(
                f"{act.spot_id!r} closed itself while its move waited for its barrier; the "
                "move was withdrawn"
            )
        if out.kind == TargetKind.SPOT and act.shared:
            if set(act.members) != {o.name for o in out.objects if o is not act}:
                raise Unavailable(f"{act.spot_id!r}: its members changed while sealing")
            if not self.rt.when_quiet(act, partial(self._barrier_again, out)):
                return None  # a continuation is still suspended: again once none is
        if out.kind == TargetKind.SPOT and not self._timer_gates_held(out, act):
            return None  # a timer callback still runs, or is suspended: again once none is
        if out.kind == TargetKind.ACTOR and out.unit.spot is not act:  # type: ignore[union-attr]
            raise Unavailable(f"{out.unit.name!r} left {act.spot_id!r} while sealing")
        for obj in out.objects:
            pending = obj.owner.lanes.snapshot()
            if obj.owner.yield_pending():
                raise Unavailable(f"{obj.name!r} cannot move now: a Yield of it is still in"
                                  " flight; the move was withdrawn, try again")  # fmt: skip
            if any(isinstance(i, LifeJob) for i in pending):
                raise Unavailable(f"{obj.name!r} cannot move now: a lifecycle step (a Join, a"
                                  " leave, a member's callback) is queued for it; the move was"
                                  " withdrawn, try again")  # fmt: skip
        return {obj.name: capture_one(obj) for obj in out.objects}

    def _ship(self, out: Outgoing, turn: Turn) -> None:
        if turn.error is not None:  # barrier or capture failure: admission back, exactly
            self._reopen(out, turn.error)
            return
        if turn.result is not None:  # None: withdrawn, or waiting for the barrier
            self._send(out, turn.result)

    def _send(self, out: Outgoing, states: dict[str, str | None]) -> None:
        """Queues, timers and states leave for the target, in chunks. What leaves is kept
        here too (``Outgoing.taken``) until the commit: a move that does not happen puts it
        back (:meth:`_reopen`). Done under the relocator's lock, so a withdrawal comes wholly
        before (nothing leaves) or wholly after (it is all put back, the target told)."""
        act, me = out.spot, self.rt.node_id
        with self._lock:
            if self._out.get(out.rid) is not out:  # withdrawn meanwhile: nothing leaves
                return
            out.shipped = True
            timers = {}
            now = self.rt.clock.now()
            for obj in out.objects:
                out.timers[obj.name] = take_timers(obj, now)
                # a PER_ACTOR Spot's own timers do not move (kotlin-spot-interface): the shell
                # is recreated and registers what it needs
                keep = obj is not out.spot or act.shared or act.kind is not SpotKind.USER
                timers[obj.name] = out.timers[obj.name].records if keep else ()
            # the Spot's subscriptions go with it (sealed, it changes them no more here); the
            # commit drops them here, a move that does not happen leaves them as they are
            topics = tuple(sorted(self.rt.directory.subscribed.get(act.spot_id, ())))
            self.rt.events.barrier()  # (sealed: every event it was offered is marked now)
            marks = events.to_wire(act.event_marks, topics)
            objects = tuple(
                wire.RelocObject(obj.name, obj.spec.name, self._take_jobs(out, obj, now),
                                 timers[obj.name], topics if obj is act else (),
                                 marks if obj is act else ())
                for obj in out.objects
            )  # fmt: skip
            blob = codec.dumps(states).decode()
            size = self.chunk_limit
            chunks = [blob[i : i + size] for i in range(0, len(blob), size)]
            try:
                for n, chunk in enumerate(chunks):
                    self.router.post(out.target, wire.RelocChunkEnvelope(me, out.rid, n, chunk))
                self.router.post(out.target, wire.RelocEnvelope(
                    me, out.rid, out.into or act.spot_id, act.spec.name,
                    act.ref.object_generation, len(chunks), objects, out.signaled, str(out.kind),
                    out.join,
                ))  # fmt: skip
                return
            except Unavailable as exc:  # the target is gone: the move does not happen
                failed = exc
        _log.error("relocation of %r to %s could not start: %s", act.spot_id, out.target, failed)
        self._reopen(out, failed)

    def _take_jobs(
        self, out: Outgoing, obj: SpotAct | ActorAct, now: float
    ) -> tuple[wire.RelocJob, ...]:
        """Everything queued behind the barrier, in order, as it will be queued on the target
        (a tick's times as spans before ``now``); the items themselves are kept in
        ``out.taken`` (see :meth:`_put_back`). An Instance Spot's first record whose message
        is among them is not cleared here (execution-model §14): it moves with its message
        (``first_moves``: the commit's ``transfer`` keeps it) and the target clears it once
        the handler ended, or, if the move is withdrawn, the handler here does (cleared when
        the move took the queue, a source that then died in that handler left nothing to
        replay; cleared by the transfer, so did a target that died before it ran it)."""
        from ..runtime.jobs import BatchJob, RecordedJob, SendJob

        jobs: list[wire.RelocJob] = []
        taken: list[Any] = []
        for item in obj.owner.drain():
            if isinstance(item, Job) and item.lane != Lane.UNRESERVED:  # reserved again on arrival
                obj.owner.lanes.release(item.lane, item.size, item.count)
            if isinstance(item, SendJob):  # a MessageJob is one too
                corr = None
                if item.reply is not None:  # its caller waits here: the target answers us
                    tp = reply_type(type(item.msg))
                    corr = self.router.register_pending(item.reply, tp, out.target)
                    out.corrs.append(corr)
                origin = None  # a one-way message: where it was admitted, told of a
                if corr is None and item.topic is None:  # discard there (§9: both ends)
                    origin = getattr(item, "origin", None) or self.rt.node_id
                first = isinstance(item, RecordedJob)  # its record moves with it: the
                if first:  # target clears it once its handler ended (a review found the
                    out.first_moves.add(obj.name)  # message lost when its target died first)
                jobs.append(_message_job(item.msg, item.meta, item.sender, corr, item.topic,
                                         origin, first))  # fmt: skip
            elif isinstance(item, BatchJob):  # a batch moves as its messages, in order
                origin = item.origin or self.rt.node_id
                jobs += [_message_job(msg, None, item.sender, None, None, origin, False)
                         for msg in item.msgs]  # fmt: skip
            elif isinstance(item, TimerJob):  # a place on the lane: the target decides its
                t = item.timer.pending_tick(item.at)  # tick when it runs (python-api §11)
                jobs.append(wire.RelocTickJob(t.name, t.sequence, now - t.scheduled_at,
                                              now - t.fired_at, t.late_ticks))  # fmt: skip
                item.timer.withdraw()
            else:
                continue
            taken.append(item)
        out.taken.append((obj, taken))
        return tuple(jobs)

    def _reopen(self, out: Outgoing, error: BaseException, after_relay: bool = False) -> bool:
        """The move does not happen (a failed barrier or capture, a target gone before the
        commit, a restore that kept failing): the Spot serves here again as it was. What left
        for the target is queued again first, in its order, with its timers; then the calls
        parked at the seal (those relayed already first), in arrival order; then admission
        reopens; the target is told to forget its copy (and to drop what this node relayed),
        and the caller gets ``error`` (python-api §11). ``False`` (nothing done) once the
        commit is under way (unless ``after_relay``: the store refused it) or the move already
        ended."""
        from ..runtime.acts import GONE, READY, SEALED

        # lock order: route -> relocator (redelivery may route a parked call onward)
        with self.router.route_lock, self._lock:
            if self._out.get(out.rid) is not out or (out.relaying and not after_relay):
                return False
            self._forget_out(out)
            if out.signaled:  # told before anything it held back runs
                self.rt.relocation_ready_completed(
                    out.spot, RelocationReadyStatus.CONTINUED, typed_error(error)
                )
            self._put_back(out)  # (what was taken: nothing if nothing left)
            for obj in out.objects:
                obj.owner.lanes.set_closed(False)
            for gate in out.timer_gates:  # a PER_ACTOR Spot's timer callbacks go on
                gate.unhold()
            out.timer_gates.clear()
            rooms = self._admit_waiting(out)
            kept = [*out.relayed, *out.parked]
            out.relayed, out.parked = [], []
            self._answered_here(kept)
            for env in kept:  # still sealed: these go next, in arrival order
                self.router.redeliver(env, force=True)
            spot = out.spot
            with self.rt.directory.lock:  # (with ``self_close``: a close asked is seen here)
                for obj in out.objects:
                    if obj.state == SEALED:  # (a node's stop may have begun closing it)
                        obj.state = READY
                close = spot.close_asked and spot.state == READY
                spot.close_asked = False
            if out.kind == TargetKind.SPOT and spot.state != GONE:  # the events it missed
                self.rt.events_caught_up(spot)  # while sealed: counted (a stop closing it too)
            if out.shipped:
                with contextlib.suppress(Unavailable):  # gone: nothing of it is left there
                    self.router.post(out.target, wire.RelocAbortEnvelope(self.rt.node_id, out.rid))
        accepted(rooms)
        if close:  # it closed itself while sealed: it closes now, here (before the caller
            self.rt.close_self(spot.spot_id)  # hears of it: a drain then sees it closing)
        out.done.set(None, typed_error(error))
        return True

    def not_sent(self, rid: int, error: ZLinkError) -> None:
        """(Infrastructure thread.) What move ``rid`` sent its target could not be sent (it
        does not encode, or the target went away): the move is withdrawn now, the Spot
        serving here with its queue (python-api §8), not left to its deadline."""
        out = self._out.get(rid)
        if out is None or out.committed or out.relaying:
            return
        if isinstance(error, InvalidArgument):  # (a frame that does not encode)
            error = StateIncompatible(f"the move of {out.spot.spot_id!r} does not cross: {error}")
        _log.error("relocation of %r to %s could not be sent: %s", out.spot.spot_id, out.target,
                   error)  # fmt: skip
        self._reopen(out, error)

    def _put_back(self, out: Outgoing) -> None:
        """(Relocator lock held.) What left for the target is queued here again, as it was:
        each object's queue in its order (reserved again: it was admitted here once, §7), its
        timers with the same sequence, next due time and counts (each handle still its
        timer's); queued requests are answered here."""
        for corr in out.corrs:  # their callers wait for this node's turns again
            self.router.forget_pending(corr)
        objects = {obj.name: obj for obj in out.objects}
        queues = {obj.name: items for obj, items in out.taken}
        for name, taken in out.timers.items():
            obj = objects[name]
            restored = restore_timers(obj, taken.records, taken.at, taken.registrations)
            timers = {t.name: t for t in restored}  # (its own clock then: due as it was)
            for item in queues.pop(name, ()):
                if isinstance(item, TimerJob):
                    timer = timers.get(item.timer.name)
                    if timer is not None:  # a tick that was pending goes on as it was
                        timer.moved_in()
                        obj.owner.lanes.put_app_moved(TimerJob(timer, item.at), 0)
                else:
                    obj.owner.lanes.put_app_moved(item, item.size, item.count)
            for timer in restored:
                timer.arm()
        out.timers.clear()
        out.taken.clear()
        out.corrs.clear()

    def _answered_here(self, envs: list[Relayable]) -> None:
        """Requests made on this node among ``envs``, which a move that did not happen serves
        here after all: their replies are awaited from this node now, no longer from the
        target (whose loss must not fail them)."""
        me = self.rt.node_id
        for env in envs:
            if isinstance(env, wire.RequestEnvelope) and env.origin_node == me:
                self.router.rebind_pending(env.correlation, "")

    def on_restored(self, env: wire.RelocDoneEnvelope) -> None:
        """The target restored (or gave up): commit authority, then let it open admission."""
        out = self._out.get(env.relocation_id)
        if out is None or out.relaying:  # gone, or a repeat while the commit is under way
            return
        if env.error is not None:  # it gave up (and forgot its copy): the Spot stays here
            refused = Unavailable(f"{out.target} takes no move: {env.error}")
            self._reopen(out, refused if env.refused else StateIncompatible(env.error))
            return
        gone: Unavailable | None = None
        with self._lock:  # before the commit, in arrival order: per-sender order holds
            if self._out.get(out.rid) is not out or out.relaying:  # withdrawn meanwhile
                return
            # what waited for the park goes on at the commit, as what comes past the bound
            # from now on does (``_release``): taken in now, all of it reached the target at
            # once (a probe's target kept 5,558 calls on a lane of 32)
            try:  # each kept here too until the store answers (see ``Outgoing.relayed``)
                while out.parked:
                    self._relay(out, out.parked[0])
                    out.relayed.append(out.parked.pop(0))
                out.relaying = True  # (what it relayed stays counted in ``held``: the
                # target keeps it until it opens)
            except Unavailable as exc:  # the target went away: the move cannot happen
                gone = exc
            out.target_incarnation = env.incarnation
        if gone is not None:
            self._reopen(out, gone)
            return
        self._commit(out, [(obj.name, obj.authority) for obj in out.objects], [])

    def _commit(self, out: Outgoing, claims: list[tuple[str, int]], moved: list[Location]) -> None:
        """Move authority for ``claims`` (those not in ``moved`` yet, which moved already) in
        the store, one fenced write each, on the store thread; :meth:`_committed` goes on.
        A write the store failed may have been made or not: the store is asked which
        (:func:`_settle_write`), and while it cannot say, asked again (:meth:`_committed`)."""
        store, me, incarnation = self.router.store, self.rt.node_id, self.rt.incarnation
        target, theirs = out.target, out.target_incarnation
        keep = frozenset(out.first_moves)

        def transfer() -> _Commit:  # store thread, no lock
            done = list(moved)
            for name, authority in claims[len(done) :]:
                try:
                    done.append(store.transfer(name, me, incarnation, authority, target, theirs,
                                               name in keep))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - what moved keeps its pointer
                    verdict, found = _settle_write(store, name, me, incarnation, authority,
                                                   target, theirs)  # fmt: skip
                    if found is None:
                        return done, exc, verdict
                    done.append(found)  # made before the store failed: it stands
                self.router.cleared_by_move(name)  # (its first record went with it)
            return done, None, _Write.MADE

        committed = self.router.store_worker.call(transfer)
        committed.add_callback(lambda result, error: self._committed(out, claims, result, error))

    def _committed(
        self, out: Outgoing, claims: list[tuple[str, int]], result: _Commit | None,
        error: BaseException | None,
    ) -> None:  # fmt: skip
        """On the infrastructure thread: the store moved authority (or refused: fenced, this
        node is a stale owner and commits nothing); the source lets go, the target opens.

        A refusal that left everything here for sure (the target's lease lapsed meanwhile:
        the store moves nothing to a node that holds none) undoes the move as a failed one
        is (:meth:`_reopen`): the Spot serves here again. A commit that happened while the
        target was declared down (``Outgoing.lost``) stays done: the target owned the Spot,
        the store re-homes it on its next call (python-api §10 "Failure")."""
        from ..runtime.acts import GONE

        router, rt = self.router, self.rt
        moved, failed, verdict = result if result is not None else ([], error, _Write.UNKNOWN)
        # the store cannot say; or it refused a member's write after others moved (the
        # Spot is the target's now: the rest must follow), unless the target is down
        again = verdict is _Write.UNKNOWN or (
            verdict is _Write.NOT_MADE and bool(moved) and not out.lost
        )
        if again and not rt.stopping:  # asked again
            with self._lock:
                current = self._out.get(out.rid) is out  # (else fenced meanwhile: it ended)
            if current:
                _log.warning("relocation of %r: the store failed the commit (%s); asking "
                             "again in %g s", out.spot.name, failed, STORE_RETRY)  # fmt: skip
                rt.metrics.add("relocation_commits_asked_again")
                rt.infra.call_later(STORE_RETRY, self._commit, out, claims, moved)
            return
        stayed = verdict is _Write.NOT_MADE and not moved
        authority: dict[str, int] = {}
        for location in moved:  # moved in the store: relayed there from now on, whatever else
            authority[location.spot_id] = location.authority_generation
            if not out.lost:  # else no pointer to a node that is down: the store says
                router.moved_away(location.spot_id, Route.at(location))
        if failed is not None:
            if stayed and self._reopen(out, failed, after_relay=True):
                _log.warning("relocation of %r: the store refused the commit (%s); it stays "
                             "on %s", out.spot.name, failed, rt.node_id)  # fmt: skip
                return
            _log.error("relocation of %r: the store refused the commit: %s", out.spot.name, failed)
            if out.lost:
                self._fail_adopted(out, typed_error(failed))
            else:
                self._finish(out, failed)
            return
        # lock order: route -> relocator -> directory. From now on stale routes relay to the
        # target, and calls made here go by the pointer; what waited goes on first, all in
        # one step: a call made here between the objects leaving the directory and the
        # commit being marked would go by the pointer ahead of what waited
        with router.route_lock, self._lock:
            with rt.directory.lock:
                for obj in out.objects:
                    rt.directory.forget(obj)  # a Spot's subscriptions too: they live there now
            for obj in out.objects:
                obj.state = GONE
            out.committed = True
            rooms = [] if out.lost else self._release(out)
        accepted(rooms)
        rt.metrics.add("relocated_out")
        if out.lost:
            self._fail_adopted(out, self._down_after_commit(out))
            return
        out.relayed.clear()  # the target has them, and owns them now
        try:
            router.post(out.target, wire.RelocCommitEnvelope(rt.node_id, out.rid, authority))
        except Unavailable:  # the target went away meanwhile: the move ends here
            _log.error("relocation of %r: the target left before the commit", out.spot.name)
            self._finish(out, self._down_after_commit(out))

    def _release(self, out: Outgoing) -> list[tuple[Admitted, BaseException | None]]:
        """(Route and relocator locks held; just committed.) The calls that waited past what
        the move holds for its target go on to it now, in their order (from now on calls are
        relayed at once: ``Relocator._park_takes``). Should the target be unreachable, the
        rest are parked, and go on when the move ends (:meth:`_finish`). Returns the rooms
        to tell once the locks are let go."""

        def relay(envs: list[Relayable]) -> None:
            for env in envs:
                if not out.parked:
                    try:
                        self._relay(out, env)
                        continue
                    except Unavailable:  # the target went away: the move ends soon
                        pass
                out.parked.append(env)

        return take_waiting(out.waiting, relay)

    def _fail_adopted(self, out: Outgoing, error: ZLinkError) -> None:
        """A move whose target went down while the store was asked, and which did not come
        back here: the requests it took over from the router (queued ones the target was to
        answer, and this node's own it relayed) fail with ``error``; the move ends."""
        me = self.rt.node_id
        relayed, out.relayed = out.relayed, []
        mine = [e for e in relayed if isinstance(e, wire.RequestEnvelope) and e.origin_node == me]
        corrs = [*out.corrs, *(e.correlation for e in mine)]
        for corr in corrs:  # answered here: each completes once, on this thread's heap
            self.router.reply(me, corr, error=error)
        self._finish(out, error)

    def _down_after_commit(self, out: Outgoing) -> Unavailable:
        return Unavailable(
            f"the move of {out.unit.name!r} to {out.target!r} was committed, then that node "
            "went down before it opened it; the store re-homes it on its next call"
        )

    def target_down(self, peer: str) -> None:
        """(Infrastructure thread, before the router fails the calls awaited from ``peer``.)
        The store declared ``peer`` down (python-api §10 "Failure"): every move to it ends at
        once. One waiting for its signal fails; one not yet at its commit is aborted
        (:meth:`_reopen`: the seal lifted, admission restored exactly, its queue and parked
        calls served here; ``Unavailable`` to its caller, python-api §11); one committed
        stays moved, its caller told ``Unavailable``; one whose commit the store is asked
        for now is decided by the store's answer (``Outgoing.lost``, :meth:`_committed`)."""
        with self._lock:
            wanted = [(s, done) for s, (target, done) in self._wanted.items() if target == peer]
            for spot_id, _done in wanted:
                del self._wanted[spot_id]
            outs = [out for out in self._out.values() if out.target == peer]
        for spot_id, done in wanted:
            done.set(None, Unavailable(f"node {peer!r}, where {spot_id!r} was to move, is down"))
        for out in outs:
            if self._reopen(out, Unavailable(
                f"node {peer!r} went down (its lease lapsed or it left) before the move of "
                f"{out.unit.name!r} was committed; it stays on {self.rt.node_id}"
            )):  # fmt: skip
                continue
            with self._lock:
                if self._out.get(out.rid) is not out:
                    continue
                if not out.committed:  # the store is being asked: its answer decides
                    out.lost = True
                    # served here if the store refuses: those relayed, and those that wait
                    waiting = [env for wait in out.waiting for env in wait.items]
                    self._answered_here([*out.relayed, *waiting])
                    for corr in out.corrs:
                        self.router.rebind_pending(corr, "")
                    continue
            self._finish(out, self._down_after_commit(out))

    def on_opened(self, env: wire.RelocOpenedEnvelope) -> None:
        """The target opened: the move is done, and the calls that waited for that (past
        what the target may keep before it opens, ``Relocator._park_takes``) go on to it."""
        out = self._out.get(env.relocation_id)
        if out is not None:
            self._finish(out, None)

    def _finish(self, out: Outgoing, error: BaseException | None) -> None:
        """The move ended (done, or failed past its point of no return). Calls that waited
        for it, and those parked while its target was declared down, go on as if just
        arrived (to the target, or by the store now), in their order, before anything routed
        after the move ended (under the route lock: a caller told its call is queued may
        send its next one at once)."""
        # lock order: route -> relocator (redelivery routes each call onward)
        with self.router.route_lock, self._lock:
            self._forget_out(out)
            rooms = self._admit_waiting(out)
            parked, out.parked = out.parked, []
            if error is not None:  # replies no longer awaited from a target that failed
                self._answered_here(parked)
            for env in parked:
                self.router.redeliver(env)
        accepted(rooms)
        out.done.set(None, None if error is None else typed_error(error))

    def _admit_waiting(self, out: Outgoing) -> list[tuple[Admitted, BaseException | None]]:
        """(Relocator lock held, as the park is taken.) The calls that waited for the move
        join the park behind what it holds, in their order (``take_waiting``); their callers
        are told (``accepted``) once the caller of this lets the lock go."""
        return take_waiting(out.waiting, out.parked.extend)

    def _forget_out(self, out: Outgoing) -> None:
        self._out.pop(out.rid, None)
        for obj in out.objects:
            if self._out_ids.get(obj.name) is out:
                del self._out_ids[obj.name]

    def divert_envelope(self, target: str, env: Relayable) -> bool:
        """A call or fence for a target sealed here: park it, or relay it once restored (and
        keep it until the store committed, see ``Outgoing.relayed``)."""
        with self._lock:
            out = self._out_ids.get(target)
            if out is None:
                return False
            if out.waiting:  # (a fence) behind the calls that wait: never ahead of them
                out.waiting.append(KeptWait([env], None, None))
            elif out.relaying and not out.lost and not out.parked:  # (parked: see _release)
                self._relay(out, env)
                if not out.committed:
                    out.relayed.append(env)
            else:  # sealed; or its target went down: it waits for the store's answer
                out.parked.append(env)
            return True

    def _relay(self, out: Outgoing, env: Relayable) -> None:
        """Hand a call or fence that met the move on to the target, as one more hop."""
        self.router.post(out.target, replace(env, hops=env.hops + 1, via=self.rt.node_id))


class _Write(Enum):
    """What became of one fenced write of a commit, as the store says."""

    MADE = "made"  # it moved to the target (perhaps before the store failed to say so)
    NOT_MADE = "not made"  # for sure: the store still names this node, at the same authority
    UNKNOWN = "unknown"  # the store cannot say now (it fails): asked again
    ELSEWHERE = "elsewhere"  # neither: another owner, or no row (this node's lease lapsed)


_Commit = tuple[list[Location], BaseException | None, _Write]
"""What the store did with a commit: what moved (in the order of the claims), why not all
did, and what became of the first that did not."""


def _settle_write(
    store: Any, name: str, me: str, incarnation: int, authority: int, target: str,
    target_incarnation: int,
) -> tuple[_Write, Location | None]:  # fmt: skip
    """(Store thread.) A fenced write of ``name`` to ``target`` failed: was it made, not
    made, or can the store not say? A write the store made and then failed to confirm (a
    dropped connection) stands: the room is the target's, at a newer authority."""
    try:
        found = store.lookup(name)
    except Exception:  # noqa: BLE001 - the store cannot say now
        return _Write.UNKNOWN, None
    if found is None:
        return _Write.ELSEWHERE, None
    if (found.owner_node == target and found.owner_incarnation == target_incarnation
            and found.authority_generation > authority):  # fmt: skip
        return _Write.MADE, found
    if (found.owner_node == me and found.owner_live and found.owner_incarnation == incarnation
            and found.authority_generation == authority):  # fmt: skip
        return _Write.NOT_MADE, None
    return _Write.ELSEWHERE, None


def _settles(done: Completion, seconds: float) -> bool:
    """Whether ``done`` has its outcome within ``seconds`` of real time."""
    with contextlib.suppress(Exception):  # its outcome is read by the caller
        done.wait(seconds)
    return done.done


def _message_job(
    msg: Message, meta: dict[str, str] | None, sender: str | None, corr: int | None,
    topic: str | None, origin: str | None, first: bool,
) -> wire.RelocMessageJob:  # fmt: skip
    """A queued message as it moves: its wire form, headers, sender, reply route, topic,
    the node a one-way message was admitted on, and whether it is its Spot's first record's."""
    return wire.RelocMessageJob(*to_wire(msg), meta, sender, corr, topic, origin, first)
