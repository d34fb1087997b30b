"""Moving a Spot, with its member Actors, to another node (kotlin-spot-interface relocation;
§4, §14).

The order is the seed's: seal new admission of the Spot and of every member Actor; reach the
all-lane barrier (a lifecycle turn of the Spot itself: with the shared gate no member turn runs
either; no Yield in flight, no continuation waiting, no Join or leave queued); capture with the
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
* on the target, calls relayed by the source queue behind the moved queue; a call made on the
  target node itself waits until the commit, since that node's earlier calls went through the
  source (the router's route lock makes "sent before the target arrived" and "found it here"
  exclusive).

Failures: a barrier failure aborts the seal of that generation and restores admission exactly; a
capture failure keeps the source authoritative; a restore failure keeps the target sealed and is
retried on the same target with the same payload (never another target).

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
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..app import RelocationCoordination
from ..errors import InvalidArgument, InvalidOperation, StateIncompatible, Unavailable, ZLinkError
from ..executor import Job, Turn
from ..executor.gate import _Resume
from ..executor.lanes import UNRESERVED
from ..messaging import codec
from ..messaging.calls import NO_WAIT
from ..messaging.completion import Completion
from ..messaging.message import message_type, reply_type
from ..timers import OverrunPolicy, Timer, TimerJob, TimerOptions, TimerTick
from .base import RelocationReadyStatus, SpotKind

if TYPE_CHECKING:
    from ..mesh.router import MeshRouter
    from ..messaging.calls import MessageCall
    from .acts import ActorAct, ObjectAct, SpotAct
    from .runtime import Runtime

_log = logging.getLogger("zlink.relocation")
RESTORE_ATTEMPTS = 3

_Held = tuple["MessageCall", "Completion | None", int]  # a call kept for later admission


@dataclass(eq=False)
class _Out:
    """One move leaving this node: a Spot (with its SpotWide members, or alone as a PER_ACTOR
    shell), or one Actor of a PER_ACTOR Spot whose shell has moved already."""

    rid: int
    unit: SpotAct | ActorAct  # whose lanes the barrier turn runs on
    spot: SpotAct
    objects: list[SpotAct | ActorAct]
    target: str
    done: Completion
    relaying: bool = False  # parked calls went to the target; later ones follow at once
    signaled: bool = False  # APPLICATION_SIGNALED: the Spot gets CONTINUED or RELOCATED
    into: str | None = None  # a cross-node Join: the Spot the Actor joins on the target
    join: dict[str, Any] | None = None  # ... and the accepted join's reply, as sent
    parked: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "spot" if self.unit is self.spot else "actor"


@dataclass(eq=False)
class _In:
    """One move arriving on this node."""

    key: tuple[str, int]
    spot: SpotAct  # arriving with this move, or the shell an arriving Actor joins
    objects: list[SpotAct | ActorAct]
    kind: str  # "spot" or "actor"
    join: dict[str, Any] | None = None  # a cross-node Join completes when this opens
    restored: bool = False
    committed: bool = False
    signaled: bool = False
    fences: set[str] = field(default_factory=set)  # this node's fences still travelling
    early: list[_Held] = field(default_factory=list)  # relayed before the restore finished
    local: list[_Held] = field(default_factory=list)  # made here: wait for this node's fences

    @property
    def members(self) -> list[ActorAct]:
        return [o for o in self.objects if o is not self.spot]  # type: ignore[misc]


class Relocator:
    """One node's relocation work, as source and as target."""

    def __init__(self, rt: Runtime, router: MeshRouter, chunk_limit: int) -> None:
        self.rt = rt
        self.router = router
        self.chunk_limit = chunk_limit
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # admission of diverted calls; re-entered by refills
        self._out: dict[int, _Out] = {}
        self._out_ids: dict[str, _Out] = {}  # spot and member ids -> their move
        self._chunks: dict[tuple[str, int], list[str]] = {}
        self._in: dict[tuple[str, int], _In] = {}
        self._in_ids: dict[str, _In] = {}
        self._wanted: dict[str, tuple[str, Completion]] = {}  # APPLICATION_SIGNALED: waiting

    # -- calls that meet a move ------------------------------------------------------------------
    def divert(self, act: Any, call: MessageCall, reply: Completion | None, hops: int) -> bool:
        """Keep a call for an object that is moving; ``False`` if it is not moving."""
        target = call.target
        with self._lock:
            if target in self._out_ids:
                return self.divert_envelope(target, self.router.envelope(call, reply, hops))
            inc = self._in_ids.get(target)
            if inc is None:
                return False
            if inc.fences and not (hops and call.via == inc.key[0]):
                # Calls made or relayed here went the old way until now: those still on it
                # come back through the source, ahead of this node's fence; the rest wait.
                inc.local.append((call, reply, hops))
            elif not inc.restored:
                inc.early.append((call, reply, hops))
            else:
                self._admit((call, reply, hops))
            return True

    def divert_envelope(self, target: str, env: dict[str, Any]) -> bool:
        """A call or fence for a target sealed here: park it, or relay it once restored."""
        with self._lock:
            out = self._out_ids.get(target)
            if out is None:
                return False
            if out.relaying:
                env["h"] += 1
                env["v"] = self.rt.node_id
                self.router.transport.send(out.target, env)
            else:
                out.parked.append(env)
            return True

    def fence_back(self, target: str, resend: Callable[[], None]) -> bool:
        """This node's fence for an arriving ``target`` is back: the calls kept behind it
        (``resend``) and then those made since may go in. ``False`` if none is arriving."""
        with self._lock:
            inc = self._in_ids.get(target)
            if inc is None or target not in inc.fences:
                return False
            later, inc.local = inc.local, []
            resend()  # older than anything made here since the target arrived: first in line
            inc.local.extend(later)
            inc.fences.discard(target)
            if inc.fences:
                return True
            held, inc.local = inc.local, []
            for item in held:
                if inc.restored:
                    self._admit(item)
                else:
                    inc.early.append(item)
            if inc.committed:
                self._open(inc)
        return True

    def _admit(self, held: _Held) -> None:
        """Admit a kept call now (force: past the seal); a refusal completes its reply."""
        call, reply, hops = held
        try:
            self.rt.submit(call, reply, NO_WAIT, hops, force=True)
        except ZLinkError as exc:
            if reply is not None:
                reply.set(None, exc)
            else:
                self.rt.metrics.add("remote_sends_refused")

    # -- source ----------------------------------------------------------------------------------
    def start(self, act: SpotAct, target: str) -> Completion:
        """Seal ``act`` and its members and queue the barrier turn; done once committed.

        An ``APPLICATION_SIGNALED`` Spot is only asked: the move waits for its next
        ``relocation_ready().defer()`` boundary (see :meth:`signaled`).
        """
        spec = act.spec
        if act.kind is SpotKind.ENTRY:
            raise InvalidOperation(f"{act.spot_id!r} is an Entry Spot; Entry Spots never move")
        if spec.relocation.kind == "disabled":
            raise InvalidOperation(f"{spec.name!r} is registered with Relocation.disabled()")
        if target == self.rt.node_id:
            raise InvalidArgument("a Spot relocates to another node, not its own")
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
            self._seal(act, target, shell, signaled=False)
            return done
        self._seal(act, target, done, signaled=False)
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
            self._seal(spot, target, attempt, signaled=False, unit=actor)
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
            self._seal(act, target, done, signaled=True)
        except ZLinkError as exc:  # it continues here, and is told why
            done.set(None, exc)
            self.rt.relocation_ready_completed(act, RelocationReadyStatus.CONTINUED, exc)
        return True

    def _seal(
        self,
        act: SpotAct,
        target: str,
        done: Completion,
        signaled: bool,
        unit: ActorAct | None = None,
        join: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """Seal the objects of one move and queue its barrier turn on ``unit``'s lanes (the
        Spot's, or one Actor's of a PER_ACTOR Spot). ``join``: a cross-node Join of the held
        Actor ``unit`` into that Spot on ``target``; being held, it needs no barrier turn."""
        from .acts import READY, SEALED
        from .jobs import LifeJob

        with self._lock, self.rt._lock:
            members = list(act.members.values())
            if unit is not None:
                objects: list[SpotAct | ActorAct] = [unit]
                members = [unit]
            elif act.shared or act.kind is not SpotKind.USER:
                objects = [act, *members]  # SpotWide: one unit with its members
            else:
                objects = [act]  # PER_ACTOR: the shell first; each Actor moves later
            for member in members:
                if member.spec.relocation.kind == "disabled":
                    raise InvalidOperation(
                        f"member {member.actor_id!r} is a {member.spec.name!r}, registered "
                        "with Relocation.disabled(); its Spot cannot move while it is a member"
                    )
            if any(o.state != READY for o in objects):
                raise Unavailable(f"{act.spot_id!r} is not ready (sealed, closing or activating)")
            out = _Out(next(self._ids), unit or act, act, objects, target, done, signaled=signaled)
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
                          lambda turn: self._ship(out, turn), UNRESERVED)  # fmt: skip
        if signaled:  # the boundary the Spot chose: nothing queued runs before it
            owner.put_first(barrier)
        else:
            owner.put_unreserved(barrier)

    def _capture(self, out: _Out) -> dict[str, str | None]:
        """Inside the barrier turn: refuse if anything is in flight, then capture every object."""
        from .jobs import LifeJob

        act = out.spot
        if out.kind == "spot" and act.shared:
            if set(act.members) != {o.name for o in out.objects if o is not act}:
                raise Unavailable(f"{act.spot_id!r}: its members changed while sealing")
            if act.yields_out:
                raise Unavailable(f"{act.spot_id!r}: a Yield is still in flight (barrier failed)")
        if out.kind == "actor" and out.unit.spot is not act:  # type: ignore[union-attr]
            raise Unavailable(f"{out.unit.name!r} left {act.spot_id!r} while sealing")
        for obj in out.objects:
            pending = obj.owner.lanes.snapshot()
            if obj.owner._resume is not None or any(isinstance(i, _Resume) for i in pending):
                raise Unavailable(f"{obj.name!r}: a Yield is still in flight (barrier failed)")
            if any(isinstance(i, LifeJob) for i in pending):
                raise Unavailable(f"{obj.name!r}: lifecycle work is queued (barrier failed)")
        return {obj.name: _capture_one(obj) for obj in out.objects}

    def _ship(self, out: _Out, turn: Turn) -> None:
        if turn.error is not None:  # barrier or capture failure: admission back, exactly
            self._reopen(out, turn.error)
            return
        self._send(out, turn.result)

    def _send(self, out: _Out, states: dict[str, str | None]) -> None:
        """Queues, timers and states leave for the target, in chunks."""
        timers = {}
        for obj in out.objects:  # stopped first: a tick that still slips in is a no-op here
            # a PER_ACTOR Spot's own timers do not move (kotlin-spot-interface): the shell
            # is recreated and registers what it needs
            keep = obj is not out.spot or out.spot.shared or out.spot.kind is not SpotKind.USER
            timers[obj.name] = list(obj.timers.values()) if keep else []
            obj.cancel_timers()
        objects = [
            {"id": obj.name, "tn": obj.spec.name, "jobs": self._take_jobs(obj),
             "timers": _timers_of(timers[obj.name])}
            for obj in out.objects
        ]  # fmt: skip
        blob = codec.dumps(states).decode()
        size = self.chunk_limit
        chunks = [blob[i : i + size] for i in range(0, len(blob), size)]
        act = out.spot
        try:
            for n, chunk in enumerate(chunks):
                self.router.transport.send(out.target, {
                    "k": "reloc_chunk", "o": self.rt.node_id, "r": out.rid, "i": n, "b": chunk,
                })  # fmt: skip
            self.router.transport.send(out.target, {
                "k": "reloc", "o": self.rt.node_id, "r": out.rid, "t": out.into or act.spot_id,
                "tn": act.spec.name, "g": act.ref.object_generation, "n": len(chunks),
                "objects": objects, "sig": out.signaled, "unit": out.kind, "join": out.join,
            })  # fmt: skip
        except Unavailable as exc:  # the target is gone: nothing left; keep it sealed here
            _log.error("relocation of %r to %s could not start: %s", act.spot_id, out.target, exc)
            self._finish(out, exc)

    def _take_jobs(self, obj: SpotAct | ActorAct) -> list[dict[str, Any]]:
        """Everything queued behind the barrier, in order, as it will be queued on the target."""
        from .jobs import BatchJob, MessageJob

        jobs: list[dict[str, Any]] = []
        drained: list[Any] = []
        for item in obj.owner.drain():
            if isinstance(item, BatchJob):  # a batch moves as its messages, in order
                obj.owner.lanes.release(item.lane, item.size, item.count)
                drained.extend(item.messages())
                for single in drained[-item.count :]:  # reserved again on the target
                    single.lane = UNRESERVED
            else:
                drained.append(item)
        for item in drained:
            if isinstance(item, MessageJob):
                corr = None
                if item.reply is not None:  # its caller waits here: the target answers us
                    corr = self.router.register_pending(item.reply, reply_type(type(item.msg)))
                payload = item.msg.__pydantic_serializer__.to_json(item.msg).decode()
                jobs.append(
                    {"k": "msg", "tn": type(item.msg).zlink_type_name, "p": payload,
                     "m": item.meta, "s": item.sender, "c": corr, "tp": item.topic}
                )  # fmt: skip
            elif isinstance(item, TimerJob):
                t = item.tick
                jobs.append({"k": "tick", "n": t.name, "q": t.sequence, "sa": t.scheduled_at,
                             "fa": t.fired_at, "l": t.late_ticks})  # fmt: skip
                item.timer.tick_done()
            if isinstance(item, Job) and item.lane != UNRESERVED:
                obj.owner.lanes.release(item.lane, item.size)
        return jobs

    def _reopen(self, out: _Out, error: BaseException) -> None:
        """The barrier failed: parked calls run here first, then admission reopens."""
        from .acts import READY

        with self._lock:
            for obj in out.objects:
                obj.owner.lanes.set_closed(False)
            self._forget_out(out)
            for env in out.parked:  # still sealed: these go first, in arrival order
                if env["k"] == "fence":
                    self.router._on_fence(env)
                else:
                    self.router._on_call(env, force=True)
            out.parked.clear()
            for obj in out.objects:
                obj.state = READY
            if out.signaled:  # told before anything it held back runs
                self.rt.relocation_ready_completed(
                    out.spot, RelocationReadyStatus.CONTINUED, _typed(error)
                )
        out.done.set(None, _typed(error))

    def on_restored(self, env: dict[str, Any]) -> None:
        """The target restored (or gave up): commit authority, then let it open admission."""
        from .acts import GONE

        out = self._out.get(env["r"])
        if out is None:
            return
        if not env["ok"]:  # the target stays sealed; so does this node (nothing is lost)
            self._finish(out, StateIncompatible(env["e"]))
            return
        router, rt = self.router, self.rt
        with self._lock:  # before the commit, in arrival order: per-sender order holds
            for parked in out.parked:
                parked["h"] += 1
                parked["v"] = rt.node_id
                router.transport.send(out.target, parked)
            out.parked.clear()
            out.relaying = True
        authority: dict[str, int] = {}
        try:
            for obj in out.objects:
                moved = router.store.transfer(
                    obj.name, rt.node_id, obj.authority, out.target, rt._lease()
                )
                authority[obj.name] = moved.authority_generation
                router.moved_away(
                    obj.name,
                    _route(out.target, moved.object_generation, moved.authority_generation),
                )
        except Unavailable as exc:  # fenced: this node is a stale owner; it commits nothing
            _log.error("relocation of %r: the store refused the commit: %s", out.spot.name, exc)
            self._finish(out, exc)
            return
        with router.route_lock, rt._lock:  # from now on stale routes relay to the target
            for obj in out.objects:
                table: dict[str, Any] = rt.spots if obj is out.spot else rt.actors
                if table.get(obj.name) is obj:
                    del table[obj.name]
        for obj in out.objects:
            obj.state = GONE
        router.transport.send(out.target, {
            "k": "reloc_commit", "o": rt.node_id, "r": out.rid, "a": authority,
        })  # fmt: skip
        rt.metrics.add("relocated_out")

    def on_opened(self, env: dict[str, Any]) -> None:
        out = self._out.get(env["r"])
        if out is not None:
            self._finish(out, None)

    def _finish(self, out: _Out, error: BaseException | None) -> None:
        with self._lock:
            self._forget_out(out)
        out.done.set(None, None if error is None else _typed(error))

    def _forget_out(self, out: _Out) -> None:
        self._out.pop(out.rid, None)
        for obj in out.objects:
            if self._out_ids.get(obj.name) is out:
                del self._out_ids[obj.name]

    # -- target ----------------------------------------------------------------------------------
    def on_chunk(self, env: dict[str, Any]) -> None:
        with self._lock:
            self._chunks.setdefault((env["o"], env["r"]), []).append(env["b"])

    def on_relocate(self, env: dict[str, Any]) -> None:
        from .acts import READY, SEALED, ActorAct, SpotAct

        rt = self.rt
        key = (env["o"], env["r"])
        with self._lock:
            chunks = self._chunks.pop(key, [])
        spec = rt.app.spots.get(env["tn"])
        objects = env["objects"]
        kind = env.get("unit", "spot")
        actor_objects = objects[1:] if kind == "spot" else objects
        actor_specs = [rt.app.actors.get(o["tn"]) for o in actor_objects]
        if spec is None or None in actor_specs or len(chunks) != env["n"]:
            self._answer(env, "the payload does not match this node's app or is incomplete")
            return
        states: dict[str, str | None] = codec.loads("".join(chunks))
        with self.router.route_lock:  # a call sent before this left; after it, finds it here
            with rt._lock:
                taken = [o["id"] for o in objects if o["id"] in rt.spots or o["id"] in rt.actors]
                shell = rt.spots.get(env["t"]) if kind == "actor" else None
                if taken:
                    self._answer(env, f"{taken} already live on {rt.node_id}")
                    return
                if kind == "actor" and (shell is None or shell.state > READY):
                    self._answer(env, f"the shell of {env['t']!r} is not open on {rt.node_id}")
                    return
                # this node's own calls so far went elsewhere: fence that path first
                fences = {o["id"] for o in objects if self.router.switch(o["id"])}
                if shell is None:
                    act = SpotAct(rt, spec, env["t"], env["g"])
                    act.state = SEALED
                    arriving: list[SpotAct | ActorAct] = [act]
                else:
                    act, arriving = shell, []
                for o, aspec in zip(actor_objects, actor_specs, strict=True):
                    assert aspec is not None
                    member = ActorAct(rt, aspec, o["id"], rt.entries[aspec.name])
                    member.state = SEALED  # born held: its queue waits for the commit
                    member.spot = act
                    act.members[member.actor_id] = member
                    arriving.append(member)
                inc = _In(key, act, arriving, kind, env.get("join"), fences=fences,
                          signaled=env.get("sig", False))  # fmt: skip
                with self._lock:  # known as arriving before anyone can find it
                    self._in[key] = inc
                    for obj in arriving:
                        self._in_ids[obj.name] = inc
                for member in inc.members:
                    rt.actors[member.actor_id] = member
                if shell is None:
                    rt.spots[act.spot_id] = act
            for obj in arriving:
                self.router.arrived(obj.name)
        self._restore(env, inc, states, 1)

    def _restore(self, env: dict[str, Any], inc: _In, states: dict[str, str | None],
                 attempt: int) -> None:  # fmt: skip
        from .jobs import LifeJob

        act = inc.spot

        def run() -> Any:
            for obj in inc.objects:  # a fresh instance for every attempt
                obj.instance = obj.spec.cls(obj.context)
                data, adapter = states.get(obj.name), obj.spec.relocation.adapter
                if data is not None and adapter is not None:
                    adapter().restore(obj.instance, base64.b64decode(data))  # a fresh copy
            if inc.kind == "spot" and states.get(act.spot_id) is None:
                return act.instance.on_initialize()  # recreate(): a new start, no state
            return None

        def restored(turn: Turn) -> None:
            if turn.error is not None:
                _log.error("restore of %r failed (attempt %d)", act.spot_id, attempt,
                           exc_info=turn.error)  # fmt: skip
                if attempt < RESTORE_ATTEMPTS:  # same target, same payload
                    self._restore(env, inc, states, attempt + 1)
                else:  # stays sealed here; the source is told
                    self._answer(env, f"restore failed {attempt} times: {turn.error}")
                return
            if inc.kind == "actor":  # born held; the open shell goes on meanwhile
                self._refill(env, inc)
            else:
                act.owner.hold(after=lambda: self._refill(env, inc))

        act.owner.put_unreserved(LifeJob(act, "relocation restore", run, restored, UNRESERVED))

    def _refill(self, env: dict[str, Any], inc: _In) -> None:
        """The restored objects are held: queue their messages and timers, tell the source."""
        for obj, moved in zip(inc.objects, env["objects"], strict=True):
            timers = _restore_timers(obj, moved["timers"])
            self._queue_jobs(env, obj, moved["jobs"])  # pending ticks before any new one
            for timer in timers:
                timer.arm()
        with self._lock:
            for held in inc.early:  # still unrestored: nothing else gets in before these
                self._admit(held)
            inc.early.clear()
            for obj in inc.objects:
                obj.restored = inc.key[0]  # from now on the source's calls queue (held) here
            inc.restored = True
        self._answer(env, None)

    def _queue_jobs(
        self, env: dict[str, Any], obj: SpotAct | ActorAct, jobs: list[dict[str, Any]]
    ) -> None:
        from .jobs import MessageJob

        now = self.rt.clock.now()
        for job in jobs:
            if job["k"] == "tick":
                timer = obj.timers.get(job["n"])
                if timer is not None:
                    tick = TimerTick(job["n"], job["q"], job["sa"], job["fa"], job["l"])
                    timer.queued += 1
                    obj.owner.lanes.put_app(TimerJob(timer, tick), 0)
                continue
            msg = message_type(job["tn"]).model_validate_json(job["p"])
            handler = (obj.spec.subscriptions if job["tp"] else obj.spec.handlers)[type(msg)]
            reply = None
            if job["c"] is not None:
                reply = Completion()
                reply.add_callback(self._answer_to({"c": job["c"], "o": env["o"]}))
            item = MessageJob(obj, handler, msg, reply, job["m"], job["s"], 0, job["tp"])
            item.size = len(job["p"])
            item.at = now
            obj.owner.lanes.put_app(item, item.size)

    def _answer_to(self, route: dict[str, Any]) -> Any:
        def answer(value: Any, error: BaseException | None) -> None:
            self.router._reply(route, value, error)

        return answer

    def on_commit(self, env: dict[str, Any]) -> None:
        with self._lock:
            inc = self._in.get((env["o"], env["r"]))
            if inc is None or inc.committed:
                return
            for obj in inc.objects:
                obj.authority = env["a"][obj.name]
            inc.committed = True
            if not inc.fences:  # else it opens when this node's last fence is back
                self._open(inc)

    def _open(self, inc: _In) -> None:
        """Authority is here and this node's own calls are in line: admission opens."""
        from .acts import READY

        with self._lock:
            self._in.pop(inc.key, None)
            for obj in inc.objects:
                if self._in_ids.get(obj.name) is inc:
                    del self._in_ids[obj.name]
                obj.restored = None
                obj.state = READY
        act = inc.spot
        if inc.signaled:  # first of all, before the messages and ticks it held back
            self.rt.relocation_ready_completed(act, RelocationReadyStatus.RELOCATED)
        if inc.join is not None:  # a cross-node Join: joined callbacks, then it runs
            self.rt.joined_here(inc.members[0], act, decode_reply(inc.join))
        else:
            for member in inc.members:  # SpotWide: on the Spot's gate; PER_ACTOR: its own
                member.owner.unhold(act.gate if act.shared else member.own_gate)
        if inc.kind == "spot":
            act.owner.unhold()  # queued messages and ticks run now
        self.rt.metrics.add("relocated_in")
        self.router.transport.send(inc.key[0], {"k": "reloc_opened", "r": inc.key[1]})

    def _answer(self, env: dict[str, Any], error: str | None) -> None:
        self.router.transport.send(
            env["o"], {"k": "reloc_done", "r": env["r"], "ok": error is None, "e": error or ""}
        )


def _route(node: str, object_generation: int, authority_generation: int) -> Any:
    from ..mesh.router import Route

    return Route(node, (object_generation, authority_generation))


def _capture_one(obj: ObjectAct) -> str | None:
    """One object's state as base64 text, or ``None`` for ``recreate()``."""
    adapter = obj.spec.relocation.adapter
    if adapter is None:
        return None
    data = adapter().capture(obj.instance)
    if not isinstance(data, (bytes, bytearray)):
        raise StateIncompatible(f"capture of {obj.name!r} returned {type(data).__name__}")
    return base64.b64encode(bytes(data)).decode()  # the runtime's own copy


def _timers_of(timers: list[Timer]) -> list[dict[str, Any]]:
    return [
        {"n": t.name, "i": t.interval, "p": t.options.overrun_policy.value,
         "x": t.options.max_catch_up_ticks, "k": t.options.keeps_alive,
         "d": t.next_due, "q": t.sequence}
        for t in timers
    ]  # fmt: skip


def _restore_timers(obj: ObjectAct, timers: list[dict[str, Any]]) -> list[Timer]:
    """The logical timers go on: same sequence, same next due time; the app registers none.
    They are armed by the caller, once the pending ticks are queued."""
    out = []
    for t in timers:
        options = TimerOptions(OverrunPolicy(t["p"]), t["x"], t["k"])
        fn = obj.spec.timer_handlers[t["n"]]
        timer = Timer(t["n"], t["i"], options, obj, obj.timer_owner(t["n"]), fn, t["d"])
        timer.sequence = t["q"]
        obj.timers[timer.name] = timer
        out.append(timer)
    return out


def _typed(error: BaseException) -> ZLinkError:
    if isinstance(error, ZLinkError):
        return error
    return StateIncompatible(f"capture failed: {type(error).__name__}: {error}")


def encode_reply(value: Any) -> dict[str, Any]:
    """A join reply as it crosses nodes: a ``zlink.Message`` keeps its type, else JSON."""
    from ..messaging.message import Message

    if isinstance(value, Message):
        body = value.__pydantic_serializer__.to_json(value).decode()
        return {"tn": type(value).zlink_type_name, "p": body}
    return {"v": codec.dumps(value).decode()}


def decode_reply(data: dict[str, Any]) -> Any:
    if "tn" in data:
        return message_type(data["tn"]).model_validate_json(data["p"])
    return codec.loads(data["v"])
