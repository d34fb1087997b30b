"""Moving a Spot, with its member Actors, to another node (kotlin-spot-interface relocation;
§4, §14).

The order is the seed's: seal new admission of the Spot and of every member Actor; reach the
all-lane barrier (a lifecycle turn of the Spot itself: with the shared gate no member turn runs
either; no Yield in flight, no continuation waiting, no Join or leave queued; a barrier turn
that finds a handler of the Spot or a member suspended in a Yield ends and comes again once
every such continuation has resumed and finished its turn on the source, python-api §11, so no
continuation ever runs on the source after the commit); capture with the
Spot adapter and each Actor adapter inside that turn; send the payload (states, logical timers
with their last sequence and next due time, pending ticks, queued messages, per object) in
chunks of at most ``relocation_payload_chunk_limit_bytes`` straight to the target; restore into
fresh instances from fresh defensive copies, with queues and timers held; commit authority in
the Location Store (fenced: a stale owner cannot); open admission on the target. The source
keeps a forwarding pointer, so stale routes relay to the new owner, and requests queued at the
source keep their reply route (the target answers the source, which completes the caller).

Nothing accepted is refused, lost, run twice or reordered per sender by a move:
* a call that meets the seal on the source is parked, in arrival order, and relayed to the
  target before authority is committed (after a failed barrier it runs on the source instead,
  before any call admitted after the reopening);
* on the target, calls relayed by the source queue behind the moved queue, in the order they
  come, with those from elsewhere (kept in the move's record until it opens); a call made on the
  target node itself waits for that node's fence, since its earlier calls went through the
  source (the router's route lock makes "sent before the target arrived" and "found it here"
  exclusive).

Failures: a barrier failure aborts the seal of that generation and restores admission exactly; a
capture failure keeps the source authoritative; a restore failure keeps the target sealed and is
retried on the same target with the same payload (never another target). Past its retries the
move is aborted (python-api §11): the target forgets its half-made copy, and the source, which
kept what it shipped until the commit, serves again with its queue as it was (what was queued
before the seal, then the calls parked during the move, in order), its timers going on; the
caller of the move gets the error. A move aborted after its payload left tells the target so
(``reloc_abort``); calls the target kept for it go on to the source.

A node that dies mid-move (declared down by the store, python-api §10 "Failure"; the router
calls :meth:`Relocator.peer_declared_down` on the infrastructure thread) never leaves a move
waiting: a move to it that is not committed is aborted on the source as a failed one is (its
caller gets ``Unavailable``); one committed stays moved (the target owned the Spot; the store
re-homes it on its next call; its caller gets ``Unavailable``); one whose commit the store is
asked for when the verdict comes is decided by the store's answer. A move from it that it did
not commit is forgotten on the target (the calls kept for it go on by the store, which re-homes
the Spot), unless the store says the commit happened: then it opens. A store that refuses a
commit for sure (the target's lease lapsed) also aborts the move: what was relayed to the
target is served on the source, and the target, told, drops its copies of it. A store that
fails a commit's write (a dropped connection: made or not?) is asked which; a write it made
stands, and while it cannot say, or refuses a member's write after the Spot's was made, the
commit is tried again every ``STORE_RETRY`` seconds (before, the Spot stayed sealed on both
nodes for good).

Deadlines (python-api §8): a move whose deadline passes (on the node's clock, or the caller's
wait in real seconds) before its commit is under way is withdrawn the same way, and its caller
gets ``DeadlineExceeded``, which therefore always means the move did not happen; once the
commit is under way (the point of no return: parked calls relayed, the store asked) the move
finishes and its own outcome is the answer.

APPLICATION_SIGNALED: a requested move waits for the Spot's next ``relocation_ready().defer()``
boundary; then the seal and barrier come first of all, and the Spot is told ``CONTINUED`` on
the source (no move waiting, or it failed) or ``RELOCATED`` on the target, before anything it
held back runs.

PER_ACTOR Spots (``recreate()`` only): the Spot moves first as a stateless shell (same id and
generation; its own queue moves, its own timers do not), authority switches, the shell opens;
then each member Actor moves on its own, as a unit of one, with its state (its own policy),
queue and timers, in the order each finishes its current turn. A failed Actor barrier is tried
again (three times); the shell's move is never rolled back.

Moves: SpotWide User Spots (with members), PER_ACTOR Spots, and Instance Spots.

Where: the source side in ``source.py`` (``Outbound``), the target side in ``target.py``
(``Inbound``), the records both keep in ``state.py``; ``Relocator`` joins them and decides what
a call that meets a move does (``divert``).

Lock order (``zlink.lock_order``): route -> relocator -> directory; ``divert`` is entered with
the route lock held or with none, and takes the relocator's.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import Unavailable
from ..messaging.completion import Admitted, Completion
from ..messaging.message import lane_size

if TYPE_CHECKING:
    from ..executor import OwnerLanes
    from ..messaging.calls import BatchSendCall, MessageCall
    from ..runtime.routing import Relayable

from ..runtime.routing import payload_size
from ..runtime.waits import WaitLine, fits, unwait, wait_behind
from .source import Outbound
from .state import Arriving, Held, Outgoing
from .target import Inbound

_Item = TypeVar("_Item")


class Relocator(Outbound, Inbound):
    """One node's relocation work, as source and as target."""

    def peer_declared_down(self, peer: str) -> None:
        """(Infrastructure thread, no lock held.) The store declared ``peer`` down: the moves
        to it end (:meth:`Outbound.target_down`), those from it are settled
        (:meth:`Inbound.source_down`). A cross-node Join is one of these moves, or a question
        the router fails (python-api §10 "Failure", §11)."""
        self.target_down(peer)
        self.source_down(peer)

    def wait_moves(self, seconds: float, arrivals: float | None = None) -> bool:
        """Block until no move leaves or arrives here, at most ``seconds`` (for arrivals,
        ``arrivals`` if given: one waits for a commit its source may never send); ``False``
        if one still does."""
        end = time.monotonic() + seconds
        with self._lock:
            dones = [out.caller or out.done for out in self._out.values()]
        for done in dones:
            ended = threading.Event()
            done.add_callback(functools.partial(_set, ended))
            if not ended.wait(max(0.0, end - time.monotonic())):
                return False
        if arrivals is not None:
            end = min(end, time.monotonic() + arrivals)
        return self.wait_arrivals(max(0.0, end - time.monotonic()))

    def moving(self, spot_id: str) -> bool:
        """Whether a move of ``spot_id`` arrives here or leaves from here now."""
        return self.arriving(spot_id) or self.leaving(spot_id)

    def fenced(self) -> None:
        """(Infrastructure thread, no lock held.) This node fenced itself (python-api §10
        "Failure"): it may own nothing now, so no move it was part of goes on here. Moves
        arriving are forgotten (never opened: the store may already give their Spots to
        another node); moves leaving end with ``Unavailable`` (their Spots were dropped; a
        commit the store already made stands, the target owns them)."""
        with self.router.route_lock, self._lock:
            arriving = list(self._in.values())
            for inc in arriving:
                if not inc.forgotten:
                    self._forget_in(inc)
            leaving = list(self._out.values())
            for out in leaving:
                self._forget_out(out)
            wanted, self._wanted = list(self._wanted.values()), {}
        for inc in arriving:
            if inc.restored:
                self._discard(inc)
        error = Unavailable(f"node {self.rt.node_id} fenced itself during the move")
        for _target, done in wanted:
            done.set(None, error)
        for out in leaving:
            parked, out.parked = out.parked, []
            waiting = out.waiting.take()
            out.done.set(None, error)
            for env in parked:  # refused here now (fenced): their callers are told
                self.router.redeliver(env)
            for wait in waiting:  # never queued: their callers hear why
                if wait.room is None and wait.reply is None:  # a fence: as one parked
                    for env in wait.items:
                        self.router.redeliver(env)
                if wait.room is not None:
                    wait.room.set(None, error)
                if wait.reply is not None:
                    wait.reply.set(None, error)

    def after_move(self, target: str, then: Callable[[], None]) -> None:
        """``then()`` runs on the infrastructure thread once the move of ``target`` from or
        to this node has ended (done, withdrawn or given up); at once there if none is under
        way (it ended a moment ago: the object's state settles under this lock). What waits
        so is a question a move holds up (a Join's ask meeting its room sealed): asked
        again then, where the room is."""
        infra = self.rt.infra
        with self._lock:
            out = self._out_ids.get(target)
            if out is not None:
                out.done.add_callback(lambda _value, _error: infra.submit(then))
                return
            inc = self._in_ids.get(target)
            if inc is not None:
                inc.after.append(then)
                return
        infra.submit(then)

    def divert(
        self, call: MessageCall, reply: Completion | None, hops: int,
        lanes: OwnerLanes | None = None, room: Admitted | None = None,
    ) -> bool:  # fmt: skip
        """Keep a call for an object that is moving; ``False`` if it is not moving (nothing
        done then). ``lanes``: the object's; calls still waiting for room there came first,
        so their waits end and they are routed again (kept, in their order) before this one,
        all under this lock, which every other call kept for a move takes too (per-sender
        order: a call another thread keeps meanwhile never goes ahead of them).

        A sealed object parks at most what its lane holds (items and payload bytes): past
        that, a call whose caller can wait (``room``: a send's ``wait()``/``future()``/
        ``await``, or a call from a peer; or a request, within its deadline) waits for the
        move to go on, in arrival order, and a plain ``submit()`` is ``ResourceExhausted``
        with nothing queued (python-api §9). Unbounded, a slow barrier let one sender park
        100,000 calls, whose re-admission at the target then held its infrastructure thread
        past a lease renewal. The target bounds what it keeps for an arriving object the same
        way; the calls the source relays are bounded there until the commit (``_park_takes``).
        Waiters go in when the object opens, or go the old way, in order, if the move is
        withdrawn."""
        target = call.target
        with self._lock:
            out = self._out_ids.get(target)
            if lanes is not None and (out is not None or target in self._in_ids):
                if lanes.app_waiters or lanes.life_waiters:
                    lanes.end_waits()  # each comes back here (reentrant), in its order
                out = self._out_ids.get(target)
            if out is not None:  # its reply comes from the move's target: lost with it
                env: Relayable = self.router.envelope(call, reply, hops, peer=out.target)
                if not self._park_takes(out, [env], lanes):
                    return self._wait_for_move(out.waiting, [env], call, reply, room)
                return self.divert_envelope(target, env)
            inc = self._keeping(target)
            if inc is None:
                return False
            held: Held = (call, reply, hops)
            relayed = bool(hops) and call.via == inc.key[0]  # bounded by the source's park
            # (one this node kept behind its fence, sent again now: bounded where it was kept,
            # and it goes ahead of what was kept or waits here since, ``Inbound.fence_back``)
            if not relayed and not inc.resending and not self._keep_takes(inc, [held]):
                return self._wait_for_move(inc.waiting, [held], call, reply, room)
            self._keep(inc, held, relayed)
            return True

    def divert_batch(self, call: BatchSendCall, room: Admitted | None) -> bool:
        """A batch for an object moving from or to this node, decided whole (python-api §8:
        all or none): parked (kept) whole, or waiting whole for the move (``room``), or
        refused whole (a plain ``submit()``: ``ResourceExhausted``). ``False`` if the object
        is not moving here (the batch then goes message by message, as before)."""
        target = call.target
        with self._lock:
            out = self._out_ids.get(target)
            if out is not None:  # parked whole, or relayed whole (in order), or it waits
                envs: list[Relayable] = [
                    self.router.envelope(part, None, 0, peer=out.target) for part in call.parts()
                ]  # (each knows a peer's batch's origin)
                if not self._park_takes(out, envs, None):
                    return self._wait_for_move(out.waiting, envs, call, None, room)
                for env in envs:
                    self.divert_envelope(target, env)
                return True
            inc = self._keeping(target)
            if inc is None:
                return False
            helds: list[Held] = [(part, None, 0) for part in call.parts()]
            if not self._keep_takes(inc, helds):
                return self._wait_for_move(inc.waiting, helds, call, None, room, batch=call)
            for held in helds:
                self._keep(inc, held, relayed=False)
            return True

    def _keeping(self, target: str) -> Arriving | None:
        """(Relocator lock held.) The arrival that keeps calls for ``target``, if it is
        arriving here; ``Unavailable`` once the node stopped (``Inbound.stopped``): it will
        never open here."""
        inc = self._in_ids.get(target)
        if inc is not None and self.stopped_as is not None:
            raise Unavailable(self.stopped_as)
        return inc

    def _keep(self, inc: Arriving, held: Held, relayed: bool) -> None:
        """(Relocator lock held.) Keep a call for an arriving object, counted already.
        Calls made or relayed here went the old way until now: those still on it come back
        through the source, ahead of this node's fence; the rest wait for it (``local``).
        What the source relayed goes in line (``relayed``)."""
        if inc.fences and not relayed:
            inc.local.append(held)
        else:
            self._take_in(inc, held)

    def _park_takes(self, out: Outgoing, envs: list[Relayable], lanes: OwnerLanes | None) -> bool:
        """(Relocator lock held.) Whether ``envs`` fit in what ``out`` holds for its target
        until the commit, behind no waiting call (what the moving object's lane holds: items,
        payload bytes as they travel); if they do, they are counted in it. Past the restore
        that is what the source relayed, which the target keeps until it opens: unbounded, a
        target once kept 36,842 calls so, and opening it held its infrastructure thread for
        1.1 s. Those past it wait for the commit (``Outbound._release``), not for the
        opening: the target opens only once its own route fences are back, and a fence
        comes by DATA, which a peer's waits here may pause. Once committed, calls are
        relayed at once."""
        if out.committed:
            return True
        limits = (lanes or out.unit.owner.lanes).limits
        size = sum(map(payload_size, envs))
        if not fits(limits, out.waiting, out.held, out.held_bytes, len(envs), size):
            return False
        out.held += len(envs)
        out.held_bytes += size
        return True

    def _keep_takes(self, inc: Arriving, helds: list[Held]) -> bool:
        """(Relocator lock held.) Whether ``helds``, made on this node or come from a peer
        other than the source, may be kept for the arriving object, behind no waiting call
        (the target side of ``_park_takes``: what the object's lane holds); if they may,
        they are counted."""
        size = sum(lane_size(call.msg) for call, _reply, _hops in helds)
        limits = inc.spot.owner.lanes.limits
        if not fits(limits, inc.waiting, inc.taken, inc.taken_bytes, len(helds), size):
            return False
        inc.taken += len(helds)
        inc.taken_bytes += size
        return True

    def _wait_for_move(
        self, waiting: WaitLine[_Item], items: list[_Item],
        call: MessageCall | BatchSendCall, reply: Completion | None, room: Admitted | None,
        batch: BatchSendCall | None = None,
    ) -> bool:  # fmt: skip
        """(Relocator lock held.) The move's park (or, on the target, what it keeps) is full:
        ``call`` (as ``items``) waits behind it on ``waiting``, or is refused
        (``zlink.runtime.waits.wait_behind``)."""
        withdraw = functools.partial(unwait, self._lock, waiting)
        wait_behind(self.rt, waiting, items, call, reply, room, withdraw,
                    "is moving, and its park", "the moving", batch)  # fmt: skip
        return True


def _set(event: threading.Event, _value: object, _error: BaseException | None) -> None:
    event.set()
