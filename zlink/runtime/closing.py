"""Closing, idle eviction and shutdown of Spots (kotlin-spot-interface lifecycle).

Guarantees / assumes:
* A closing Spot admits nothing new, stops its timers and sends its members home before
  ``on_closing`` runs; the store's release runs on the store thread.
* ``on_closing`` runs only at the all-lane barrier (python-api §11 "Close or move while a
  SpotWide handler is suspended"): every continuation suspended in a Yield has resumed and
  finished its turn first. The close has one deadline, taken when it is asked for: past it,
  what is still suspended (a Yield, a plain await, ``on_closing`` itself) is cancelled with
  ``Cancelled`` at its ``await`` (its ``finally`` runs on the gate), then ``on_closing`` runs.
  No continuation runs after ``on_closing``: the Spot's queue is discarded after it, and a
  Yield's late completion meets a turn that already ended.
* Lock order (``zlink.lock_order``): the directory lock, alone; the local counter lock of
  ``close_spot`` is a leaf taken with nothing else held.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import (
    Cancelled,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    Unavailable,
    ZLinkError,
)
from ..executor import (
    Admission,
    CallJob,
    Entries,
    Lane,
    Owner,
    OwnerLanes,
    RoomWaiter,
    Turn,
    current_turn,
)
from ..messaging.calls import outside_only
from ..messaging.completion import Completion

if TYPE_CHECKING:
    from .runtime import Runtime
from ..timers import TimerJob
from ..types import SpotCloseReason, SpotClosingContext, SpotKind, SpotRef
from .acts import CLOSING, GONE, PAST_READY, READY, SEALED, SpotAct, quiet
from .jobs import BatchJob, LifeJob, SendJob, discard_jobs, not_serving

_log = logging.getLogger("zlink.runtime")


def _is_tick(item: object) -> bool:
    """Whether a queued item is a timer tick (ticks alone do not keep a Spot alive)."""
    return isinstance(item, TimerJob)


class Closing:
    """Closing, idle eviction and shutdown of one node's objects (kotlin-spot-interface
    lifecycle): the closing part of :class:`Runtime`. Collaborators: the runtime (its directory,
    membership for sending members back, the store for releases)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    # -- closing ----------------------------------------------------------------------------------
    def close_ref(self, ref: SpotRef) -> bool:
        """``spots.close(ref)``: Missing False, generation mismatch InvalidOperation, sealed
        Unavailable, User Spots only (kotlin-spot-interface; python-api §5). A Spot id names
        one Spot across the Location Store's domain: in a mesh, a Spot that does not live
        here is closed by the node that owns it (``MeshRouter.close_elsewhere``), and this
        call waits for its answer, up to the node's request timeout: so only outside the
        runtime (python-api §4: a handler uses ``context.workers.io`` for it)."""
        here = self.close_here(ref)
        if here is not None:
            return here
        outside_only(
            f"spots.close() of {ref.spot_id!r}, which does not live on this node,",
            "close it from a worker call (`await self.context.workers.io(...)`)",
        )
        done = self._elsewhere(ref, 0)
        bound = self.rt.request_timeout + 1.0  # (its own deadline fails it first)
        return done.wait(bound)  # type: ignore[no-any-return]

    def close_later(self, ref: SpotRef, hops: int = 0, deadline: float | None = None) -> Completion:
        """``close_ref`` that never blocks (a client's close, a peer's): its outcome, or the
        error, once known; ``hops``: how often a peer sent it on, ``deadline``: the seconds
        its asker has left (``None``: the node's request timeout)."""
        done = Completion()
        try:
            here = self.close_here(ref)
            if here is None:
                return self._elsewhere(ref, hops, deadline)
        except ZLinkError as exc:
            done.set(None, exc)
            return done
        done.set(here, None)
        return done

    def _elsewhere(self, ref: SpotRef, hops: int, deadline: float | None = None) -> Completion:
        """Ask the Spot's owner (a node that stops or fenced itself asks no other node: the
        stop would leave the question unanswered; one that drains refuses a close made on
        it, as it refuses calls made on it)."""
        rt = self.rt
        if rt.fenced or rt.stopping or (rt.draining and not hops):  # (a drained node
            raise not_serving(rt)  # still sends on what peers routed to it)
        assert rt.router is not None
        return rt.router.close_elsewhere(ref, hops, deadline)

    def close_here(self, ref: SpotRef) -> bool | None:
        """``close_ref`` as this node alone decides it; ``None`` when the Spot does not live
        here and there is a mesh to ask (a ref of another mesh names no Spot of this one)."""
        if not isinstance(ref, SpotRef):
            raise InvalidArgument(f"close() takes a SpotRef, got {type(ref).__name__}")
        act = self.rt.spots.get(ref.spot_id)
        if ref.mesh_name != self.rt.mesh:
            return False
        if act is None or act.state == GONE:
            return False if self.rt.router is None else None
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
        """An Instance Spot's ``context.close()`` (idempotent): it closes after the current
        turn. Sealed for a move that waits for its barrier behind this turn, the close wins:
        the barrier withdraws the move and the Spot closes on its source then
        (``RelocationPort.self_close``; a close dropped there let the Spot live on on the
        target, ``on_closing`` never run). Closing already, activating, or sealed otherwise
        (arriving here, or past its barrier: a call from outside its turns), nothing
        changes."""
        act = self.rt.spots.get(spot_id)
        if act is None:
            return
        relocator = self.rt.relocator
        mark = partial(self._mark_closing, act)
        if mark() if relocator is None else relocator.self_close(act, mark):
            self._begin_close(act, SpotCloseReason.EXPLICIT_CLOSE)

    def _mark_closing(self, act: SpotAct) -> bool:
        """``act`` closes now if it is ready (``True``: its close is to begin)."""
        with self.rt.directory.lock:
            if act.state != READY:
                return False
            self._hold_calls(act)
            act.state = CLOSING
        return True

    def close_spot(self, act: SpotAct, reason: SpotCloseReason) -> None:
        """Seal ``act``, send its members home, then run ``on_closing`` (lifecycle lane) at
        the all-lane barrier; the close's deadline runs from now."""
        with self.rt.directory.lock:
            if act.state in PAST_READY:
                raise Unavailable(f"{act.spot_id!r} is sealed (closing or relocating)")
            self._hold_calls(act)
            act.state = CLOSING
        self._begin_close(act, reason)

    def _hold_calls(self, act: SpotAct) -> None:
        """(Directory lock held; ``act`` about to be CLOSING.) An Instance Spot that closes
        while its node serves takes the calls that come from now on into lanes of their own
        (``act.held``), bounded as its own (python-api §9), where its gate never runs them:
        they are its next activation's (``_reactivate``). Its own lanes admit nothing more
        (a caller that found it ready and is put only now is held then); the callers that
        wait for room there keep waiting, for the next activation too."""
        if act.kind is SpotKind.INSTANCE and self.rt.serves_instances():
            act.held = OwnerLanes(self.rt.limits)
            act.owner.lanes.set_closed(True, end_waits=False)

    def _begin_close(self, act: SpotAct, reason: SpotCloseReason) -> None:
        """(``act`` is CLOSING now.) Its timers stop, its members go home, then
        ``on_closing`` is queued. A member sealed by a cross-node Join (leaving for a Spot on
        another node, or arriving from one) goes home once its move ended, if it is still
        here then (a withdrawn move, an arrival committed): skipped, it was left bound to the
        closed Spot, or heard leaving it after its ``on_closing`` (found by an audit)."""
        if act.held is None:  # (an Instance Spot's wait on, for its next activation)
            act.owner.lanes.end_waits()  # who waits for room is refused as a new call now is
        act.cancel_timers()
        deadline = self._deadline(act, 0)
        members = list(act.members)
        if not members:
            self.queue_closing(act, reason, deadline=deadline)
            return
        act.closing_start = partial(self.queue_closing, act, reason, deadline=deadline)
        one_left = countdown(len(members), partial(self._start_closing, act))
        relocator = self.rt.relocator
        for actor_id in members:
            member = act.members.get(actor_id)
            if member is not None and member.state is SEALED and relocator is not None:
                relocator.after_move(actor_id, partial(self._send_home, act, actor_id, one_left))
                continue
            self._send_home(act, actor_id, one_left)

    def _start_closing(self, act: SpotAct) -> None:
        """``act``'s members went home (or a stop goes on without them): its ``on_closing``
        is queued, once."""
        with self.rt.directory.lock:
            start, act.closing_start = act.closing_start, None
        if start is not None:
            start()

    def _send_home(self, act: SpotAct, actor_id: str, one_left: Callable[[], None]) -> None:
        """A member of the closing ``act`` goes back to its Entry Spot (``one_left`` once it
        left); one that is not its ready member now counts at once: ending (``disconnect``:
        it goes by itself; sent home, it would wait behind its own end), moved away, gone.
        Nothing, once its node dropped ``act`` (its fence: no step of it runs then, a
        review found its ``on_closing`` run)."""
        if self.rt.fenced or act.state is not CLOSING:
            return
        member = act.members.get(actor_id)
        if member is None or member.state is not READY or member.spot is not act:
            one_left()
            return
        try:
            self.rt.leave(actor_id, act.spot_id, one_left)
        except ZLinkError:  # (not its member any more, just now)
            one_left()

    def _deadline(self, act: SpotAct, budget: float) -> float:
        """The close's deadline, ``budget`` (or the closing timeout) from now, armed (and
        cancelled by ``_closed``: the heap would otherwise keep the whole Spot until then)."""
        deadline = self.rt.clock.now() + (budget or self.rt.closing_timeout)
        act.closing_timer = self.rt.infra.call_at(deadline, self._closing_overdue, act)
        return deadline

    def queue_closing(
        self, act: SpotAct, reason: SpotCloseReason, budget: float = 0,
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        """Queue ``on_closing``; it runs once no continuation of ``act`` is suspended."""
        if deadline is None:
            deadline = self._deadline(act, budget)
        self._on_closing(act, SpotClosingContext(reason, deadline), first=False)

    def _on_closing(
        self, act: SpotAct, closing: SpotClosingContext, first: bool,
        timers_checked: bool = False,
    ) -> None:  # fmt: skip
        """The ``on_closing`` turn, on the lifecycle lane (``first``: at its head). If a
        handler of the Spot or of a member is still suspended in a Yield, the turn ends at
        once and is queued again, first, when the last such continuation has resumed; so it
        does while a timer callback of a PER_ACTOR Spot (each timer on a gate of its own,
        §2) still runs there (``timers_checked``: they have all ended; the close cancelled
        the timers, so no new callback starts)."""
        ran = [False]

        def run() -> Any:
            again = partial(self._on_closing, act, closing, True, True)
            stop = closing.reason is SpotCloseReason.HOST_SHUTDOWN  # (members stay put)
            if not timers_checked and not self._timers_quiet(act, again, stop):
                return None  # a timer callback on a gate of its own must finish first
            if not self.rt.when_quiet(act, partial(self._on_closing, act, closing, True,
                                                   timers_checked)):  # fmt: skip
                return None  # not at the barrier yet: a continuation must finish first
            ran[0] = True
            turn = act.closing_turn = current_turn()
            if act.closing_overdue and turn is not None:  # past its deadline already
                turn.cancel(Cancelled(f"on_closing of {act.spot_id!r} passed its deadline"))
            return None if act.instance is None else act.instance.on_closing(closing)

        def done(turn: Turn) -> None:
            if ran[0] or turn.owner is None:  # it ran, or it never will (discarded unrun)
                self._closed(act, turn)

        job = LifeJob(act, "on_closing", run, done, Lane.UNRESERVED)
        if first:
            act.owner.put_first(job)
        else:
            act.owner.put_unreserved(job)

    def _timers_quiet(self, act: SpotAct, then: Callable[[], None], stop: bool) -> bool:
        """Whether no timer callback of ``act`` runs, waits or is suspended on a timer's own
        gate (a PER_ACTOR Spot, §2), nor, at a stop (``stop``: its members stay put, where a
        close sends them home first), a turn of a member on its own gate (an audit found one
        resume after ``on_closing``); else ``then()`` runs once each such gate has let its
        current turn go (a turn queued behind it on its own lanes says so)."""
        owners = list(act.timer_owners or ())
        if stop and not act.shared:
            owners += [member.owner for member in list(act.members.values())]
        busy = [owner for owner in owners if not quiet(owner)]
        if not busy:
            return True
        one_ended = countdown(len(busy), then)
        for owner in busy:
            owner.put_unreserved(CallJob(one_ended, Lane.UNRESERVED))
        return False

    def _closing_overdue(self, act: SpotAct) -> None:
        """(Infrastructure thread.) The close's deadline passed: every turn of the Spot (and
        of its members) still suspended, in a Yield or a plain await, and ``on_closing``
        itself, is cancelled; ``on_closing`` runs once the cancelled continuations have
        finished (python-api §11)."""
        if act.state != CLOSING:
            return
        act.closing_overdue = True
        error = Cancelled(f"the close of {act.spot_id!r} passed its deadline")
        if self.rt.stopping:  # the stop's own close: what it cancels is not a handler's fault
            self.rt.stop_errors.add(error)  # (``finish_message``: counted and said once)
        turns = self.rt.suspended_yields(act)
        gates = {act.gate, *(m.owner.gate for m in list(act.members.values()))}
        gates.update(owner.gate for owner in act.timer_owners or ())  # a PER_ACTOR Spot's
        for gate in gates:
            if gate.running is not None:  # a plain await keeps the gate (or a turn runs)
                turns.append(gate.running)
        if act.closing_turn is not None:
            turns.append(act.closing_turn)
        closing = act.closing_turn  # an on_closing that started and now waits: cancelled
        if closing is not None and isinstance(closing.job, LifeJob) and not closing.job.overdue:
            closing.job.overdue = True  # its Cancelled is this, not a fault of its own
            self.rt.metrics.add("closing_overdue")
        for turn in turns:
            turn.cancel(error)

    def cancel_suspended(self) -> None:
        """Shutdown, past its budget: what the closing deadlines would do, for every Spot
        still closing (its deadlines left the infrastructure heap with the node's calls)."""
        for act in list(self.rt.spots.values()):
            self._closing_overdue(act)

    def _closed(self, act: SpotAct, turn: Turn) -> None:
        """``on_closing`` ended (a failure was counted by its job) or was discarded unrun."""
        act.closing_turn = None
        timer, act.closing_timer = act.closing_timer, None
        if timer is not None:
            timer.cancel()
        self._end(act, None, None)

    def _end(
        self, act: SpotAct, generation: int | None, refused: BaseException | None
    ) -> None:  # fmt: skip
        """The close's end: ``act`` leaves the node, its next activation (``_reactivate``)
        in its place if it is an Instance Spot with calls to carry. On a mesh that one needs
        a generation of its own from the store first (execution-model §14): the calls stay
        held meanwhile, and this runs again with it (``generation``), or with why the store
        gave none (``refused``: then nothing is made, and what it held fails with it)."""
        router = self.rt.router
        with self.rt.directory.lock:  # its subscriptions go with it (``Directory.forget``)
            act.owner.lanes.set_closed(True, end_waits=False)  # all it took is queued now
            held = act.held
            if held is not None:
                held.set_closed(True, end_waits=False)  # and all that waits for the next one
            ask = (
                router is not None
                and generation is None
                and refused is None
                and held is not None
                and self.rt.serves_instances()
                and _has_work(act, held)
            )
            if ask:  # still held (a call refused a moment ago looks again, ``_goes_again``)
                assert held is not None
                held.set_closed(False, end_waits=False)
            else:
                again, left, taken = self._reactivate(act, generation, refused)
                self.rt.directory.forget(act, again)  # (``again`` in its place, in one step)
                act.state = GONE  # (under the lock, once forgotten: ``Runtime._not_ready``)
                if router is not None and again is None:  # its release, from now until it
                    self.rt.releasing.setdefault(act.spot_id, [])  # ends (``fenced_write``)
        if ask:
            assert router is not None
            asked = router.store_worker.call(router.store.new_generation, act.spot_id,
                                             self.rt.node_id, self.rt.incarnation,
                                             act.authority)  # fmt: skip
            asked.add_callback(partial(self._generation, act))
            return
        if router is not None and again is None:  # on the store thread; fenced: a stale
            router.fenced_write(  # owner's is refused; one the store failed is counted
                "release",
                router.store.release,
                act.spot_id,
                self.rt.node_id,
                self.rt.incarnation,
                act.authority,
            )
        stopping = self.rt.stopping
        error: ZLinkError
        if stopping:
            error = Unavailable(f"node {self.rt.node_id} shut down before it ran")
        elif refused is not None:
            error = Unavailable(f"spot {act.spot_id!r} could not be made again: {refused}")
        else:
            error = NotFound(f"spot {act.spot_id!r} was closed")
        reason = "at_shutdown" if stopping else "spot_closed"
        act.owner.lanes.end_waits()  # one that queued after the close began: routed again now
        if held is not None:
            held.end_waits()  # (none, once a next activation took them)
        discard_jobs(self.rt, left, error, reason)  # (to the next activation, if there is one)
        self.rt.metrics.add("spots_closed")
        if again is not None:
            again.owner.wake()
            for waiter in taken:
                waiter.notify(Admission.ADMITTED)
        else:  # (a fence that waited: routed again, as if it had just arrived)
            for waiter in taken:
                waiter.notify(Admission.CLOSED)

    def _generation(self, act: SpotAct, found: Any, error: BaseException | None) -> None:
        """(Infrastructure thread.) The store's answer for ``act``'s next activation."""
        if error is not None:
            self.rt.metrics.add("instance_reactivations_refused")
            _log.warning("node %s: the Location Store gave %r no new generation, so it is not"
                         " made again: %s", self.rt.node_id, act.spot_id, error)  # fmt: skip
            self._end(act, None, error)
            return
        self._end(act, found.object_generation, None)

    def _reactivate(
        self, act: SpotAct, generation: int | None, refused: BaseException | None
    ) -> tuple[SpotAct | None, list[Any], list[RoomWaiter]]:
        """(Directory lock held; ``act``'s admission closed.) An Instance Spot is activated by
        the calls made to it (execution-model §14), and its callers cannot see a close
        coming (it was idle, or it closed itself): the messages it took and never ran are
        the first work of its next activation, made here at once, in their order and before
        anyone can find it (per sender FIFO, §6), as Orleans forwards what a deactivating
        grain received to its next activation: those queued before the close, the callers
        that waited for room then, the calls held while it closed (``_hold_calls``), and
        the callers that waited for room among those (python-api §9), past the new lane's
        limit if need be (it then admits nothing new until it drains below it, as a moved
        queue does). It keeps the placement (its Location Store row stays this node's) with
        a new ``ObjectGeneration`` (on a mesh ``generation``, the store's; one node numbers
        its own); its state starts anew (the constructor and ``on_initialize`` run first).
        Not on a node that stops or fenced itself (one that drains still serves what stayed,
        this among it), nor on a mesh without a generation from the store. Returns that
        activation (``None``: none made; else not published yet), what else was queued, to
        discard, and the waiters it took in, to tell."""
        queued = act.owner.drain()
        held = act.held
        came = [] if held is None else _popped(held)  # what was held while it closed
        rt = self.rt
        if (
            held is None
            or refused is not None
            or (rt.router is not None and generation is None)
            or rt.stopping
            or rt.fenced
            or rt.spots.get(act.spot_id) is not act  # (dropped meanwhile: nothing to replace)
        ):
            return None, queued + came, []
        mine, theirs = act.owner.lanes.take_waiters(), held.take_waiters()
        carried: list[SendJob | BatchJob] = []
        left: list[Any] = []
        for group in (queued, _items(mine), came, _items(theirs)):
            for item in group:
                (carried if isinstance(item, (SendJob, BatchJob)) else left).append(item)
        taken = [*mine, *theirs]
        if not carried:  # (what waits with nothing to queue, a route fence behind the calls
            return None, left, [w for w in taken if not w.count]  # before it, hears CLOSED)
        again = rt.register_spot(act.spec, act.spot_id, generation, act.authority,
                                 carried=carried, publish=False)  # fmt: skip
        again.tenure = act.tenure  # (the same store row: a first record's clear goes on)
        rt.metrics.add("instance_reactivations")
        rt.metrics.add("messages_carried_to_next_activation", sum(j.count for j in carried))
        return again, left, taken

    def sweep_idle(self) -> None:
        """On the infrastructure thread: close User/Instance Spots idle for ``idle_timeout``."""
        now = self.rt.clock.now()
        for act in list(self.rt.spots.values()):
            if act.kind is SpotKind.ENTRY or act.state != READY:
                continue
            if act.activity != act.seen_activity:
                act.seen_activity, act.idle_since = act.activity, now
                continue
            if now - act.idle_since < self.rt.idle_timeout:  # type: ignore[operator]
                continue
            self._evict(act)
        if not self.rt.stopping and self.rt.idle_timeout is not None:
            self.rt.infra.call_later(self.rt.idle_timeout / 4, self.sweep_idle)

    def _evict(self, act: SpotAct) -> None:
        """Close ``act`` (``IDLE_EVICTED``) if it is idle: no member, nothing queued but its
        own timer ticks. Its admission closes in the same step as that check, with every
        producer (``OwnerLanes.close_if_idle``), under the directory lock (as a close's
        state changes are): a call admitted a moment before is not discarded by a close the
        framework began (a probe lost 5-16 sends a run on 3.13t); one a moment after meets
        a closing Spot, as for any close."""
        lanes = act.owner.lanes
        with self.rt.directory.lock:
            if act.state != READY or act.members or not lanes.close_if_idle(_is_tick):
                return
            self._hold_calls(act)  # (its lanes are closed already: it was idle)
            act.state = CLOSING
        self._begin_close(act, SpotCloseReason.IDLE_EVICTED)

    def close_all(self, budget: float) -> None:
        """Shutdown: every Spot gets ``on_closing(HOST_SHUTDOWN)`` (at its barrier, as a close
        does); members stay put. One closing already whose members have not all gone home
        (one waits for a move that a stop may never end) gets its own ``on_closing`` now (a
        review found it neither run nor counted). One still moving (arriving here, or leaving
        with its commit under way: the stop withdrew the others first) is not this node's to
        close: the commit decides where it lives (an audit found ``on_closing`` run on the
        source of a move the commit then completed); it closes once its move ended, if it is
        here then (a commit the store refused, an arrival that opened: a review found those
        never closed)."""
        for act in list(self.rt.spots.values()):
            self._close_at_stop(act, budget)

    def _close_at_stop(self, act: SpotAct, budget: float, moved: bool = False) -> None:
        """``close_all`` for one Spot: not one another node owns now; one moving once its
        move ends. ``moved``: its move just ended; one that left it sealed (a commit the store
        made or not, unconfirmed) is the store's to settle, never closed here (a review found
        ``on_closing`` run on a source the store then named the target)."""
        relocator = self.rt.relocator
        if self.rt.spots.get(act.spot_id) is not act:
            return  # (moved away, or forgotten as an arrival that did not happen)
        if moved and act.state is SEALED:
            return
        if relocator is not None and relocator.moving(act.spot_id):
            relocator.after_move(act.spot_id, partial(self._close_at_stop, act, budget, True))
            return
        with self.rt.directory.lock:
            closing = act.state in (CLOSING, GONE)
            if not closing:
                sealed, act.state = act.state is SEALED, CLOSING
        if closing:
            if act.closing_start is not None:  # (its members' wait may never end now)
                self._start_closing(act)
            return
        if sealed:  # (its move ends here: the events it missed meanwhile are counted)
            self.rt.events_caught_up(act)
        act.cancel_timers()
        self.queue_closing(act, SpotCloseReason.HOST_SHUTDOWN, budget)

    # -- shutdown ---------------------------------------------------------------------------------
    def stop_admission(self) -> None:
        """Refuse new work from now on; queued jobs will be discarded unrun; timers stop."""
        self.rt.stopping = True
        self.rt.stopped_admission.set()
        for act in [*self.rt.spots.values(), *self.rt.actors.values()]:
            act.cancel_timers()

    def owners(self) -> list[Owner]:
        out = [a.owner for a in list(self.rt.spots.values())]
        out += [a.owner for a in list(self.rt.actors.values())]
        out += [a.owner for a in list(self.rt.channels.values())]  # (each has lanes too)
        return out

    def drop_all(self, why: str) -> int:
        """Self-fencing (python-api §10 "Failure"): forget every Spot and Actor the store may
        give another node now, with no lifecycle step (this node may no longer own them):
        their timers stop, and what waits for them fails with ``Unavailable``, counted
        (``messages_discarded_fenced``). Entry Spots stay (they are this node's own) and lose
        their members. A turn running now ends on its worker; what it sends is refused.
        Returns how many Spots and Actors were dropped."""
        rt = self.rt
        with rt.directory.lock:
            spots = [a for a in rt.spots.values() if a.kind is not SpotKind.ENTRY]
            actors = list(rt.actors.values())
            for spot in spots:
                spot.state = GONE
                rt.directory.forget(spot)  # with its subscriptions
            for actor in actors:
                actor.state = GONE
                rt.directory.forget(actor)
            for entry in rt.spots.values():
                entry.members.clear()
        error = Unavailable(f"node {rt.node_id} fenced itself ({why}); nothing it held runs")
        for act in [*spots, *actors]:
            act.cancel_timers()
            act.owner.lanes.end_waits()
            discard_jobs(rt, act.owner.drain(), error, "fenced")
        for spot in spots:
            discard_jobs(rt, _let_go(spot), error, "fenced")
        dropped = len(spots) + len(actors)
        if dropped:
            rt.metrics.add("activations_dropped_fenced", dropped)
        return dropped

    def discard_queued(self) -> int:
        """Fail every job that never ran with ``Unavailable`` (shutdown, after the workers);
        each counted (``messages_discarded_at_shutdown``, ``lifecycle_skipped_<step>``).
        Returns how many messages were discarded."""
        n = 0
        error = Unavailable(f"node {self.rt.node_id} shut down before it ran")
        relocator = self.rt.relocator
        acts: list[Any] = [*self.rt.spots.values(), *self.rt.actors.values()]
        for act in [*acts, *self.rt.channels.values()]:
            owner = act.owner
            # closed first: a stopping node still takes its peers' calls (it relays) until its
            # transport goes, and one queued after this discard would never run nor be counted
            # (a ledger audit found them in its Actors' lanes); now it is refused, and counted
            owner.lanes.set_closed(True, end_waits=False)
            owner.lanes.end_waits()  # the node stops: callers waiting for room get Unavailable
            copies = relocator is not None and relocator.uncommitted(act.name)  # (the source
            gone = discard_jobs(self.rt, owner.drain(), error, "at_shutdown", copies)  # keeps
            n += 0 if copies else gone  # what it took until the store answers: no loss)
        for act in list(self.rt.spots.values()):  # held for a next activation that never was
            n += discard_jobs(self.rt, _let_go(act), error, "at_shutdown")
        return n


def _has_work(act: SpotAct, held: OwnerLanes) -> bool:
    """Whether a closing Instance Spot has calls to carry to a next activation (read as
    producers put: one that comes right after is held, and looks again then)."""
    mine = act.owner.lanes
    return bool(mine.app or held.app) or any(
        w.count for lanes in (mine, held) for w in lanes.app_waiters or ()
    )  # (a waiter with nothing to queue, a route fence, is no call to carry)


def _let_go(act: SpotAct) -> list[Any]:
    """What ``act`` held for its next activation (``_hold_calls``), taken out to discard
    (the node stops or fenced itself); its held waiters are refused."""
    held = act.held
    if held is None:
        return []
    held.set_closed(True)  # (ends their waits: they are routed again, and refused)
    return _popped(held)


def _popped(held: OwnerLanes) -> list[Any]:
    """Every item of lanes that hold calls apart (``act.held``: no gate takes from them),
    in order, taken out (their admission is closed first: nothing is put meanwhile)."""
    out: list[Any] = []
    app = held.app
    while app:
        out.append(app.popleft())
    return out


def _items(waiters: list[RoomWaiter]) -> list[Any]:
    """What ``waiters`` would have queued, in their order (a batch of entries, each)."""
    out: list[Any] = []
    for waiter in waiters:
        item = waiter.item
        out.extend(item.items if isinstance(item, Entries) else [item])
    return out


def countdown(n: int, then: Callable[[], None]) -> Callable[[], None]:
    """A function to call ``n`` times, from any threads: the last call runs ``then()``."""
    left = [n]
    lock = threading.Lock()

    def one() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    return one
