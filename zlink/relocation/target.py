"""The target side of a relocation: restore, refill, commit, open (see ``relocator``).

Guarantees / assumes:
* An arriving move is registered (objects in the directory, the move in the relocator's
  tables) in one critical section under the route lock, so a call sent before it left goes
  the old way and a call made after finds it here (per-sender order).
* A moved queue is refilled whole: it was admitted at the source (``put_app_moved``).
* Until it opens, only the moved queue is in the held lanes; every call that arrives for the
  objects waits in the move's record, in arrival order, and goes in behind it when the target
  opens. So a move the source withdraws, or that this node gives up after its restore retries,
  is forgotten whole (``on_abort``, ``_forget_in``): the objects leave the directory, the kept
  calls go on to the source in their order, the moved queue is dropped unanswered (the source
  kept the originals).
* A source declared down (:meth:`Inbound.source_down`, python-api §10 "Failure") leaves
  nothing waiting here: its chunks are dropped, a move it did not commit is forgotten (its
  kept calls go on by the store, which re-homes the Spot), one the store says it committed
  opens. Nothing here waits for the store but on its thread, with no lock held.
* Lock order (``zlink.lock_order``): route -> relocator -> directory.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import Unavailable, ZLinkError
from ..executor import Lane, Turn
from ..mesh import wire
from ..messaging import codec
from ..messaging.calls import NO_WAIT
from ..messaging.completion import Admitted, Completion
from ..messaging.message import from_wire
from ..timers import TimerJob
from ..types import RelocationReadyStatus, TargetKind

if TYPE_CHECKING:
    from ..runtime.acts import ActorAct, SpotAct

from ..runtime import events
from ..runtime.waits import KeptWait, WaitLine, accepted, take_waiting
from .state import (
    RESTORE_ATTEMPTS,
    STORE_RETRY,
    Arriving,
    Held,
    RelocatorState,
    decode_reply,
    restore_timers,
)

_log = logging.getLogger("zlink.relocation")


class Inbound(RelocatorState):
    """Moves arriving on this node."""

    def on_chunk(self, env: wire.RelocChunkEnvelope) -> None:
        with self._lock:
            key = (env.source_node, env.relocation_id)
            self._chunks.setdefault(key, []).append(env.chunk)

    def on_relocate(self, env: wire.RelocEnvelope) -> None:
        from ..runtime.acts import PAST_READY, SEALED, ActorAct, SpotAct

        rt = self.rt
        key = (env.source_node, env.relocation_id)
        with self._lock:
            chunks = self._chunks.pop(key, [])
        spec = rt.app.spots.get(env.spot_type)
        objects = env.objects
        kind = TargetKind(env.unit)
        actor_objects = objects[1:] if kind == TargetKind.SPOT else objects
        actor_specs = [rt.app.actors.get(o.object_type) for o in actor_objects]
        if (
            spec is None
            or None in actor_specs
            or len(chunks) != env.chunk_count
            or any(o.topics for o in actor_objects)  # an Actor cannot subscribe
        ):
            self._answer(env, "the payload does not match this node's app or is incomplete")
            return
        states: dict[str, str | None] = codec.loads("".join(chunks))
        # lock order (zlink.lock_order): route -> relocator -> directory
        with self.router.route_lock, self._lock:  # sent before this left, or finds it here
            if self.refusing is not None:  # draining or stopping: it would not stay here
                self._answer(env, self.refusing, refused=True)
                return
            with rt.directory.lock:
                here = rt.spots.keys() | rt.actors.keys()
                taken = [o.object_id for o in objects if o.object_id in here]
                shell = rt.spots.get(env.target) if kind == TargetKind.ACTOR else None
                if taken:
                    self._answer(env, f"{taken} already live on {rt.node_id}")
                    return
                if kind == TargetKind.ACTOR and (shell is None or shell.state in PAST_READY):
                    # (it moved on, or closes: Unavailable at the source, not a state fault)
                    self._answer(env, f"the shell of {env.target!r} is not open on {rt.node_id}",
                                 refused=True)  # fmt: skip
                    return
                # this node's own calls so far went elsewhere: fence that path first
                fences = {o.object_id for o in objects if self.router.switch(o.object_id)}
                if shell is None:
                    act = SpotAct(rt, spec, env.target, env.object_generation)
                    act.event_marks = events.from_wire(objects[0].marks)  # (no event is
                    act.state = SEALED  # offered to it before it opens: sealed)
                    act.activated = None  # activated at its source: a get_or_create that
                    arriving: list[SpotAct | ActorAct] = [act]  # finds it here is answered
                else:
                    act, arriving = shell, []
                for o, aspec in zip(actor_objects, actor_specs, strict=True):
                    assert aspec is not None
                    member = ActorAct(rt, aspec, o.object_id, rt.entries[aspec.name])
                    member.state = SEALED  # born held: its queue waits for the commit
                    member.activated = None  # (made on its first node, as its Spot was)
                    member.spot = act
                    act.members[member.actor_id] = member
                    arriving.append(member)
                inc = Arriving(key, act, arriving, kind, env.join, fences=fences,
                          signaled=env.signaled)  # fmt: skip
                self._in[key] = inc  # known as arriving before anyone can find it
                for obj in arriving:
                    self._in_ids[obj.name] = inc
                for member in inc.members:
                    rt.actors[member.actor_id] = member
                if shell is None:
                    rt.spots[act.spot_id] = act
                    # its subscriptions, as on the source; no event reaches it before it opens
                    # (sealed), and forgetting the move (``_forget_in``) drops them again
                    rt.directory.subscribe_all(act.spot_id, objects[0].topics)
            for obj in arriving:
                self.router.arrived(obj.name)
        # its timers are its own from now on (armed once its queue is in, ``_refill``): the
        # restore's constructor or on_initialize registering one of them again as it was gets
        # it, otherwise is refused (the move restores it: kotlin-spot-interface)
        inc.timers_at = rt.clock.now()  # (their times crossed as spans from the move's start)
        for obj, moved in zip(inc.objects, objects, strict=True):
            inc.timers[obj.name] = restore_timers(obj, moved.timers, inc.timers_at)
        self._restore(env, inc, states, 1)

    def _timers_as_moved(self, env: wire.RelocEnvelope, inc: Arriving) -> None:
        """(A restore attempt after a failed one, on the arriving objects' own lanes.) Their
        timers are the moved ones again, as they arrived: what the failed attempt registered,
        cancelled or registered anew goes, and the moved ones are made again."""
        for obj, moved in zip(inc.objects, env.objects, strict=True):
            obj.cancel_timers()
            inc.timers[obj.name] = restore_timers(obj, moved.timers, inc.timers_at)

    def _restore(self, env: wire.RelocEnvelope, inc: Arriving, states: dict[str, str | None],
                 attempt: int) -> None:  # fmt: skip
        from ..runtime.jobs import LifeJob

        act = inc.spot

        def run() -> Any:
            if inc.forgotten:  # withdrawn by the source meanwhile: nothing to restore
                return None
            if attempt > 1:  # what a failed attempt did to the timers is undone: each
                self._timers_as_moved(env, inc)  # attempt starts from the moved ones
            for obj in inc.objects:  # a fresh instance for every attempt
                obj.instance = obj.spec.cls(obj.context)
                data, adapter = states.get(obj.name), obj.spec.relocation.adapter
                if data is not None and adapter is not None:
                    adapter().restore(obj.instance, base64.b64decode(data))  # a fresh copy
            if inc.kind == TargetKind.SPOT and states.get(act.spot_id) is None:
                return act.instance.on_initialize()  # recreate(): a new start, no state
            return None

        def restored(turn: Turn) -> None:
            if inc.forgotten:  # withdrawn by the source meanwhile (see on_abort)
                self._discard(inc)
                return
            if turn.error is not None:
                # a restore discarded unrun (shutdown) is counted as lifecycle_skipped_ instead
                if not (isinstance(turn.job, LifeJob) and turn.job.skipped):
                    self.rt.metrics.add("relocation_restore_errors")
                _log.error("restore of %r failed (attempt %d)", act.spot_id, attempt,
                           exc_info=turn.error)  # fmt: skip
                if attempt < RESTORE_ATTEMPTS:  # same target, same payload
                    self._restore(env, inc, states, attempt + 1)
                    return
                # past its retries the move is aborted (python-api §11): this node forgets
                # its copy, and the source, told, serves again with its queue as it was
                with self.router.route_lock, self._lock:
                    if not inc.forgotten:
                        self._forget_in(inc)
                self._discard(inc)
                self._answer(env, f"restore failed {attempt} times: {turn.error}")
                return
            if inc.kind == TargetKind.ACTOR:  # born held; the open shell goes on meanwhile
                self._refill(env, inc)
            else:
                act.owner.hold(after=lambda: self._refill(env, inc))

        act.owner.put_unreserved(
            LifeJob(act, "relocation restore", run, restored, Lane.UNRESERVED, callback=False)
        )

    def _refill(self, env: wire.RelocEnvelope, inc: Arriving) -> None:
        """The restored objects are held: queue their messages and timers, tell the source.
        (Under the relocator's lock: a withdrawal comes wholly before or wholly after.)"""
        with self.router.route_lock, self._lock:  # (lock order: route -> relocator)
            if inc.forgotten:  # withdrawn by the source meanwhile (see on_abort)
                self._discard(inc)
                return
            refusing = self.refusing
            if refusing is not None:  # this node began to drain or stop as it restored:
                self._forget_in(inc)  # it takes no move now (``refuse_arrivals``); the
            else:  # source serves on (an audit found a stop close a Spot as it arrived)
                self._refill_queues(env, inc)
        if refusing is not None:
            self._discard(inc)
            self._answer(env, refusing, refused=True)
            return
        self._answer(env, None)

    def _refill_queues(self, env: wire.RelocEnvelope, inc: Arriving) -> None:
        """(Route and relocator locks held.) The restored objects' moved messages and ticks
        are queued, their timers armed."""
        for obj, moved in zip(inc.objects, env.objects, strict=True):
            self._queue_jobs(env, obj, moved.jobs)  # pending ticks before any new one
            for timer in inc.timers.get(obj.name, ()):
                timer.arm()
        inc.restored = True

    def _queue_jobs(
        self, env: wire.RelocEnvelope, obj: SpotAct | ActorAct, jobs: tuple[wire.RelocJob, ...]
    ) -> None:
        from ..runtime.jobs import MessageJob, RecordedJob

        now = self.rt.clock.now()
        over = False
        for job in jobs:
            if isinstance(job, wire.RelocTickJob):
                timer = obj.timers.get(job.name)
                if timer is not None:  # its tick is decided when it runs (python-api §11)
                    timer.moved_in()
                    over |= obj.owner.lanes.put_app_moved(TimerJob(timer, now - job.queued_ago), 0)
                continue
            msg = from_wire(job.message_type, job.payload)
            handler = (obj.spec.subscriptions if job.topic else obj.spec.handlers)[type(msg)]
            reply = None
            if job.correlation is not None:  # its caller waits at the source: answer it there
                reply = Completion()
                reply.add_callback(partial(self.router.reply, env.source_node, job.correlation))
            item: MessageJob
            if job.first:  # its Spot's first record moved with it: cleared here once its
                # handler ended, at the authority the commit gave (execution-model §14)
                item = RecordedJob(obj, handler, msg, reply, job.meta, job.sender,
                                   len(job.payload), job.topic)  # fmt: skip
                item.ran = partial(self._first_ran, obj)
            else:
                item = MessageJob(obj, handler, msg, reply, job.meta, job.sender,
                                  len(job.payload), job.topic)  # fmt: skip
            if job.origin is not None and reply is None:  # a discard here is told where it
                item.origin = job.origin  # was admitted (python-api §9: at both ends)
            item.at = now
            over |= obj.owner.lanes.put_app_moved(item, item.size)
        if over:  # taken all the same: it was admitted at the source
            self.rt.metrics.add("moved_past_lane_limit")

    def _first_ran(self, obj: SpotAct | ActorAct) -> None:
        """The handler of the first record's message that moved here ended: clear the record
        (the source's commit kept it in the store for this)."""
        from ..runtime.acts import SpotAct

        assert isinstance(obj, SpotAct)  # (an Instance Spot's)
        if obj.tenure is None:  # its tenure of the row: the object generation it moved with
            obj.tenure = obj.ref.object_generation
        self.router.record_ran(obj.name, obj.authority, obj.tenure)

    def on_commit(self, env: wire.RelocCommitEnvelope) -> None:
        with self._lock:
            inc = self._in.get((env.source_node, env.relocation_id))
            if inc is None or inc.committed:
                return
            for obj in inc.objects:
                obj.authority = env.authority[obj.name]
            inc.committed = True
            if not inc.fences:  # else it opens when this node's last fence is back
                self._open(inc)

    def refuse_arrivals(self, why: str) -> None:
        """From now on this node takes no move (it drains or stops): a source that sends one
        is answered ``refused`` and tries another node, so nothing moves onto a node that
        would close it (as Orleans never places on a silo that is shutting down). Moves
        arriving already go on (``wait_arrivals``)."""
        with self._lock:
            self.refusing = why

    def wait_arrivals(self, seconds: float) -> bool:
        """Block until no move is arriving here (each opened or forgotten), at most
        ``seconds``; ``False`` if some still is."""
        with self._arrived:
            return self._arrived.wait_for(lambda: not self._in, seconds)

    def stopped(self, error: ZLinkError) -> None:
        """(The node's shutdown, admission stopped.) The moves still arriving never open
        here: what was kept for them, accepted, fails with ``error``, each counted once (a
        one-way message as dropped, at both ends, python-api §9; a request hears it, counted
        ``calls_failed_at_shutdown``), and what waited for room behind them hears it too.
        Before, a node that stopped mid-arrival lost the sends it had kept, uncounted. From
        now on a call for an arriving object is refused (``Unavailable``, counted where it
        came from): a stopping node still takes calls relayed to it until its transport goes.
        Those its source relayed for a move not committed (``settle_at_stop``) are copies:
        counted ``arrival_copies_discarded``, not told, a request's not answered here.
        """
        from ..runtime.acts import AnsweredElsewhere

        with self.router.route_lock, self._lock:
            self.stopped_as = str(error)
            kept: list[Held] = []
            copies: list[Held] = []  # relayed by a source that keeps them (settle_at_stop)
            waits: list[KeptWait[Held]] = []
            for inc in self._in.values():
                mine = inc.committed or inc.ours_at_stop
                for held in [*inc.kept, *inc.local]:
                    (kept if mine or not _relayed_by_source(held, inc) else copies).append(held)
                inc.kept, inc.local = [], []
                waits += inc.waiting.take()
        for call, reply, _hops in kept:
            if reply is not None:
                self.rt.metrics.add("calls_failed_at_shutdown")
                reply.set(None, error)
            else:
                self.router.count_dropped(call, error)
        if copies:
            self.rt.metrics.add("arrival_copies_discarded", len(copies))
        for _call, reply, _hops in copies:  # (their source answers them)
            if reply is not None:
                reply.set(None, AnsweredElsewhere(f"{error} (a copy: its source answers it)"))
        for wait in waits:
            if wait.room is not None:
                wait.room.set(None, error)
            if wait.reply is not None:
                wait.reply.set(None, error)

    def _arrival_ended(self, inc: Arriving) -> None:
        """(Relocator lock held.) ``inc`` is no longer arriving: who waits for that hears
        (``wait_arrivals``; what ``after_move`` holds, on the infrastructure thread)."""
        self._in.pop(inc.key, None)
        with self._arrived:
            self._arrived.notify_all()
        after, inc.after = inc.after, []
        for then in after:
            self.rt.infra.submit(then)

    def _open(self, inc: Arriving) -> None:
        """Authority is here and this node's own calls are in line: admission opens."""
        from ..runtime.acts import READY

        with self._lock:
            self._arrival_ended(inc)
            for held in inc.kept:  # in the order they came, behind the moved queue
                self._admit(held)
            inc.kept.clear()
            # then those that waited for room in what it kept (python-api §9), in order
            rooms = take_waiting(inc.waiting, self._admit_all)
            for obj in inc.objects:
                if self._in_ids.get(obj.name) is inc:
                    del self._in_ids[obj.name]
                obj.state = READY
            if inc.kind == TargetKind.SPOT:  # the events it missed on its way: counted
                self.rt.events_caught_up(inc.spot)
        accepted(rooms)  # (the locks of a caller of this are reentrant)
        act = inc.spot
        self.rt.metrics.add("relocated_in")  # counted before anything it held back runs
        if inc.signaled:  # first of all, before the messages and ticks it held back
            self.rt.relocation_ready_completed(act, RelocationReadyStatus.RELOCATED)
        if inc.join is not None:  # a cross-node Join: joined callbacks, then it runs
            reply = None if inc.join.reply is None else decode_reply(inc.join.reply)
            self.rt.joined_here(inc.members[0], act, reply)
        else:
            for member in inc.members:  # SpotWide: on the Spot's gate; PER_ACTOR: its own
                member.owner.unhold(act.gate if act.shared else member.own_gate)
        if inc.kind == TargetKind.SPOT:
            act.owner.unhold()  # queued messages and ticks run now
            for gate in act.timer_owners or ():  # a PER_ACTOR Spot's timer gates its
                if gate.held:  # restore made: held until now (``SpotAct.timer_owner``)
                    gate.unhold()
        with contextlib.suppress(Unavailable):  # the source is gone: nothing waits there
            self.router.post(inc.key[0], wire.RelocOpenedEnvelope(inc.key[1]))

    def on_abort(self, env: wire.RelocAbortEnvelope) -> None:
        """The source withdrew the move before its commit (python-api §8, §11): forget what
        was made of it here. Calls kept for it go on to the source, but those the source
        relayed (it kept them, and serves them itself: a commit the store refused); the
        moved queue is dropped unanswered (the source kept the originals and runs them)."""
        with self.router.route_lock, self._lock:
            inc = self._in.get((env.source_node, env.relocation_id))
            if inc is None or inc.committed:  # gone already (it gave up), or too late
                return
            self._forget_in(inc, drop_relayed=True)
            if inc.restored:  # held and quiescent; else its restore turn drops it
                self._discard(inc)

    def source_down(self, peer: str) -> None:
        """(Infrastructure thread.) The store declared ``peer`` down (python-api §10
        "Failure"): the chunks it sent are dropped, and every move arriving from it that it
        did not commit is settled. One not yet restored cannot have been committed (the
        source commits only once told it was): it is forgotten at once, as an aborted one is
        (its kept calls go on by the store, which re-homes the Spot). One restored asks the
        store first (:meth:`_settle`), since the source may have died between its commit in
        the store and telling this node."""
        with self._lock:
            for key in [k for k in self._chunks if k[0] == peer]:
                del self._chunks[key]
            orphans = [inc for inc in self._in.values() if inc.key[0] == peer]
        for inc in orphans:
            with self.router.route_lock, self._lock:
                if inc.forgotten or inc.committed:
                    continue
                if not inc.restored:  # its restore turn drops it (see ``_restore``)
                    self._forget_in(inc)
                    continue
            self._settle(inc)

    def _settle(self, inc: Arriving) -> None:
        """Ask the store whether the dead source committed ``inc`` to this node: open it if
        so, else forget it (on the infrastructure thread, once the store answers; asked again
        after ``STORE_RETRY`` seconds while the store fails). If the source died between the
        writes of its commit (a Spot moved, some member not yet), what the store still gives
        the dead source is claimed for this node (its lease lapsed): the move opens whole."""
        store, me, incarnation = self.router.store, self.rt.node_id, self.rt.incarnation
        names = [obj.name for obj in inc.objects]

        def ask() -> dict[str, int]:  # store thread, no lock: the authority of what is ours
            found = {name: store.lookup(name) for name in names}
            ours = {name: loc.authority_generation for name, loc in found.items()
                    if loc is not None and loc.owner_node == me
                    and loc.owner_incarnation == incarnation}  # fmt: skip
            if not ours:
                return ours
            for name, loc in found.items():  # the source died between its commit's writes
                if name not in ours and loc is not None and not loc.owner_live:
                    try:
                        got = store.reserve(name, loc.kind, loc.type_name, me, incarnation)
                    except Exception:  # noqa: BLE001 - live here all the same; its writes fenced
                        _log.warning("node %s could not claim %r from its dead source", me,
                                     name, exc_info=True)  # fmt: skip
                        continue
                    if got.location.owner_node == me:
                        ours[name] = got.location.authority_generation
            return ours

        def answered(ours: dict[str, int] | None, error: BaseException | None) -> None:
            if error is not None or ours is None:
                _log.warning("node %s could not ask the store about an arriving move of %r: "
                             "%s; asking again", me, inc.spot.name, error)  # fmt: skip
                self.rt.infra.call_later(STORE_RETRY, self._settle, inc)
                return
            if ours:
                self._adopt(inc, ours)
                return
            with self.router.route_lock, self._lock:
                if inc.forgotten or inc.committed:
                    return
                self._forget_in(inc)
            self._discard(inc)

        with self._lock:
            if inc.forgotten or inc.committed:
                return
        self.router.store_worker.call(ask).add_callback(answered)

    def _adopt(self, inc: Arriving, authority: dict[str, int]) -> None:
        """The store says the dead source committed ``inc`` here: commit it as its commit
        message would have (:meth:`on_commit`)."""
        with self._lock:
            if inc.forgotten or inc.committed or self._in.get(inc.key) is not inc:
                return
            for obj in inc.objects:
                obj.authority = authority.get(obj.name, obj.authority)
            inc.committed = True
            self.rt.metrics.add("relocations_committed_by_store")
            if not inc.fences:  # else it opens when this node's last fence is back
                self._open(inc)

    def _forget_in(self, inc: Arriving, drop_relayed: bool = False) -> None:
        """(Route and relocator locks held.) The arriving objects leave this node's tables
        and directory, so calls for them go the way they went before the move (to the
        source, or by the store); the calls kept for them here are sent on that way now, in
        their order (``drop_relayed``: but those the source relayed, which it kept)."""
        from ..runtime.acts import GONE, AnsweredElsewhere

        rt = self.rt
        inc.forgotten = True
        self._arrival_ended(inc)
        with rt.directory.lock:
            for obj in inc.objects:
                if self._in_ids.get(obj.name) is inc:
                    del self._in_ids[obj.name]
                obj.state = GONE
                rt.directory.forget(obj)
            for member in inc.members:  # an Actor unit joined an open shell: it never came
                if inc.spot.members.get(member.actor_id) is member:
                    del inc.spot.members[member.actor_id]
        kept = [*inc.kept, *inc.local]  # in the order they were kept
        inc.kept, inc.local = [], []
        if drop_relayed:  # the source relayed these and keeps them: it answers their callers
            relayed = [held for held in kept if _relayed_by_source(held, inc)]
            kept = [held for held in kept if not _relayed_by_source(held, inc)]
            for _call, reply, _hops in relayed:  # a request's copy ends here unanswered (left
                if reply is not None:  # open, a stop waited its whole time for it)
                    reply.set(None, AnsweredElsewhere(f"node {inc.key[0]} keeps it"))
        for held in kept:  # routed as if just made: behind any fence, in order; accepted,
            self._admit(held, force=False)  # so one that meets a full keeper waits there
        # (emptied in place: a wait's ``withdraw`` holds this very list, and must find its
        # wait gone once it is routed on, not "still waiting, nothing queued")
        waiting = inc.waiting.take()
        for wait in waiting:  # then those that waited: routed with their own wait, in order
            if not wait.gave_up():
                self._route_again(wait)
            elif wait.room is not None and wait.reply is not None:  # a peer's request that
                wait.room.set(None, wait.reply.error)  # gave up: its backlog lets it go

    def _route_again(self, wait: KeptWait[Held]) -> None:
        """(Route and relocator locks held.) A call that waited for an arrival that did not
        happen goes the way it would have gone (its wait for room, if any, goes on there
        within its deadline); an error ends its wait, or its request."""
        room = wait.room
        if room is not None:
            room.withdraw = None  # no longer waiting here; a wait there sets its own
        call, reply, hops = wait.items[0]
        try:
            if wait.batch is not None:  # all or none, there too (python-api §8)
                self.rt.submit_many(wait.batch, room)
            else:
                self.rt.submit(call, reply, NO_WAIT, hops, room=room)
        except ZLinkError as exc:
            if room is not None:
                room.set(None, exc)
            if reply is not None:
                reply.set(None, exc)

    def _discard(self, inc: Arriving) -> None:
        """Drop the half-made copy of a move that did not happen: its timers, and its queue
        unanswered (the source answers those callers). Its objects are quiescent: held, or
        their restore turn has ended."""
        for obj in inc.objects:
            obj.cancel_timers()
            obj.owner.drain()
        self.rt.metrics.add("relocations_forgotten")

    def _answer(self, env: wire.RelocEnvelope, error: str | None, refused: bool = False) -> None:
        try:
            done = wire.RelocDoneEnvelope(env.relocation_id, error, refused,
                                          self.rt.incarnation)  # fmt: skip
            self.router.post(env.source_node, done)
        except Unavailable:  # the source is gone: its move ends with it
            self.rt.metrics.add("relocation_answers_undeliverable")

    def arriving(self, target: str) -> bool:
        """Whether ``target`` is arriving here, not yet open (a dict read: any thread)."""
        return target in self._in_ids

    def uncommitted(self, target: str) -> bool:
        """Whether ``target`` arrives here and its move is not committed (a dict read): what
        it queued are copies, the source keeps what it took until the store answers (unless
        the store named this node at its stop: ``settle_at_stop``)."""
        inc = self._in_ids.get(target)
        return inc is not None and not inc.committed and not inc.ours_at_stop

    def settle_at_stop(self, seconds: float) -> None:
        """(The node's shutdown, before ``stopped`` and the discard of what is queued; no lock
        held.) For each move arriving here, restored and not committed, ask the store whether
        its source committed it: if the store names this node, what the arrival holds are the
        only copies (they fail here, told, as any call a stop ends); if not, or if the store
        does not answer within ``seconds``, the source keeps the originals and runs them
        should the store refuse its commit, so the copies end here untold
        (``arrival_copies_discarded``; a request's with ``AnsweredElsewhere``). A review
        found a stopping target answer ``Unavailable``, and tell a one-way message dropped,
        for calls its source relayed and then ran. A commit the store makes after this
        question still finds the copies untold (README, known gaps)."""
        with self._lock:
            pending = [inc for inc in self._in.values()
                       if inc.restored and not inc.committed and not inc.forgotten]  # fmt: skip
        if not pending:
            return
        store, me, incarnation = self.router.store, self.rt.node_id, self.rt.incarnation
        # the row that moves: the Spot, or the first Actor that joins a shell already here
        # (a review: the shell's own row, this node's, made every Actor move look committed)
        names = [inc.objects[0].name if inc.objects else inc.spot.name for inc in pending]

        def ask() -> list[bool]:  # store thread, no lock
            found = [store.lookup(name) for name in names]
            return [loc is not None and loc.owner_node == me
                    and loc.owner_incarnation == incarnation for loc in found]  # fmt: skip

        try:
            ours: list[bool] = self.router.store_worker.call(ask).wait(seconds)
        except Exception as exc:  # noqa: BLE001 - unknown: the source keeps the originals
            _log.warning("node %s could not ask the store about %d arriving moves at its "
                         "stop: %s", me, len(pending), exc)  # fmt: skip
            return
        with self._lock:
            for inc, mine in zip(pending, ours, strict=True):
                inc.ours_at_stop = mine

    def fence_back(self, target: str, resend: Callable[[bool], None]) -> bool:
        """This node's fence for an arriving ``target`` is back: the calls kept behind it
        (``resend``) and then those made since may go in. ``False`` if none is arriving.

        Per sender, in the order each was made (per-sender order, python-api §9):

        1. What the router kept of its peers' calls (and fences): they came before the Spot
           started arriving, so before any call of the same peer the arrival kept. Before,
           those went behind the arrival's: an audit's test handled a peer's calls as
           [0, 5, 6, 7, 8, 1, 2, 3, 4].
        2. What came from peers while it arrived, and the waits of such calls: this node's
           own earlier calls may be among them, come back another way (a node they went
           through was changing its own route, kept them behind its fence, and then sent
           them straight here), and they are older than what the router kept of this node's
           own calls behind its fence. Before, those went behind it: a review's test handled
           a sender's calls as [0, 7, 8, 9, 1, ...].
        3. What the router kept of this node's own calls, made after its fence left.
        4. The calls made here since the target arrived, then those that wait for room behind
           them (a bound they count against would have put 1-3 behind both: ``divert``).
        """
        rooms: list[tuple[Admitted, BaseException | None]] = []
        try:
            with self._lock:
                inc = self._in_ids.get(target)
                if inc is None or target not in inc.fences:
                    return False
                later, inc.local = inc.local, []
                peers = [held for held in later if held[2]]  # (hops: come from a peer)
                inc.resending = True  # taken in whatever they count (bounded where kept)
                try:
                    resend(False)
                    inc.local.extend(peers)
                    peers = []
                    rooms = self._take_peer_waits(inc)
                    resend(True)
                finally:  # (a fault in a resend loses nothing accepted; the arrival opens)
                    inc.resending = False
                    inc.local.extend(peers)
                    inc.local.extend(held for held in later if not held[2])
                    inc.fences.discard(target)
                    if not inc.fences:
                        held, inc.local = inc.local, []
                        for item in held:
                            self._take_in(inc, item)
                        if inc.committed:
                            self._open(inc)
        finally:
            accepted(rooms)  # (the locks of a caller of this are reentrant)
        return True

    def _take_peer_waits(self, inc: Arriving) -> list[tuple[Admitted, BaseException | None]]:
        """(Relocator lock held; a fence of this node is back.) The waits of calls that came
        from peers are taken in now, in their order, behind what is kept (``fence_back``);
        the waits of calls made here stay, in theirs. Returns the rooms to tell."""
        waits = inc.waiting.take()  # (emptied in place: a wait's withdraw holds this line)
        peers: WaitLine[Held] = WaitLine()
        for wait in waits:
            (peers if wait.items[0][2] else inc.waiting).append(wait)
        return take_waiting(peers, inc.local.extend)


def _relayed_by_source(held: Held, inc: Arriving) -> bool:
    """Whether ``held``, kept for ``inc``, is a call its source relayed (the source keeps it
    until the store answers the move's commit, and runs it if the move does not happen)."""
    return bool(held[2]) and held[0].via == inc.key[0]
