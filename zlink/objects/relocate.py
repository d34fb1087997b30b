"""Moving a SpotWide User Spot to another node (kotlin-spot-interface relocation; §4, §14).

The order is the seed's: seal new admission; reach the all-lane barrier (a lifecycle turn of
the Spot itself: no other turn running, no Yield in flight, no continuation waiting); capture
with the Spot adapter inside that turn; send the payload (state, logical timers with their last
sequence and next due time, pending ticks, queued messages) in chunks of at most
``relocation_payload_chunk_limit_bytes`` straight to the target; restore into a fresh instance
from a fresh defensive copy, with queues and timers held; commit authority in the Location Store
(fenced: a stale owner cannot); open admission on the target. The source then forgets the Spot
and stale routes relay to the new owner. Requests queued at the source keep their reply route:
the target answers the source, which completes the original caller.

Failures: a barrier failure aborts the seal of that generation and restores admission exactly; a
capture failure keeps the source authoritative; a restore failure keeps the target sealed and is
retried on the same target with the same payload (never another target).

Not yet: Spots with member Actors, PER_ACTOR Spots, APPLICATION_SIGNALED coordination.
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..app import ExecutionMode, RelocationCoordination
from ..errors import InvalidArgument, InvalidOperation, StateIncompatible, Unavailable, ZLinkError
from ..executor import Job, Turn
from ..executor.gate import _Resume
from ..executor.lanes import UNRESERVED
from ..messaging.completion import Completion
from ..messaging.message import message_type, reply_type
from ..timers import OverrunPolicy, Timer, TimerJob, TimerOptions, TimerTick
from .base import SpotKind

if TYPE_CHECKING:
    from ..mesh.router import MeshRouter
    from .runtime import Runtime, SpotAct

_log = logging.getLogger("zlink.relocation")
RESTORE_ATTEMPTS = 3


class Relocator:
    """One node's relocation work, as source and as target."""

    def __init__(self, rt: Runtime, router: MeshRouter, chunk_limit: int) -> None:
        self.rt = rt
        self.router = router
        self.chunk_limit = chunk_limit
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._outgoing: dict[int, tuple[SpotAct, str, Completion]] = {}
        self._chunks: dict[tuple[str, int], list[str]] = {}
        self._incoming: dict[tuple[str, int], SpotAct] = {}
        self._parked: dict[str, list[dict[str, Any]]] = {}  # spot -> calls that met the seal

    # -- source ----------------------------------------------------------------------------------
    def start(self, act: SpotAct, target: str) -> Completion:
        """Seal ``act`` and queue the barrier turn; the completion ends when committed."""
        from .runtime import READY, SEALED, LifeJob

        spec = act.spec
        if act.kind is not SpotKind.USER or spec.mode is not ExecutionMode.SPOT_WIDE:
            raise InvalidOperation("only SpotWide User Spots relocate yet")
        if spec.relocation.kind == "disabled":
            raise InvalidOperation(f"{spec.name!r} is registered with Relocation.disabled()")
        if spec.coordination is RelocationCoordination.APPLICATION_SIGNALED:
            raise InvalidOperation("APPLICATION_SIGNALED relocation is not built yet")
        if act.members:
            raise InvalidOperation("relocating a Spot with member Actors is not built yet")
        if target == self.rt.node_id:
            raise InvalidArgument("a Spot relocates to another node, not its own")
        done = Completion()
        rid = next(self._ids)
        with self._lock:  # registered before the seal, so a forwarded call that meets it parks
            self._outgoing[rid] = (act, target, done)
        with self.rt._lock:
            if act.state != READY:
                with self._lock:
                    del self._outgoing[rid]
                raise Unavailable(f"{act.spot_id!r} is not ready (sealed, closing or activating)")
            act.state = SEALED  # from here admission is refused; nothing accepted is lost
        act.owner.lanes.set_closed(True)  # atomic with producers: none slips past the drain
        act.owner.put_unreserved(
            LifeJob(act, "relocation barrier", lambda: self._capture(act),
                    lambda turn: self._ship(rid, turn), UNRESERVED)
        )  # fmt: skip
        return done

    def park(self, spot_id: str, env: dict[str, Any]) -> bool:
        """A forwarded call met this node's seal: keep it for the new owner, if moving."""
        with self._lock:
            if not any(a.spot_id == spot_id for a, _, _ in self._outgoing.values()):
                return False
            self._parked.setdefault(spot_id, []).append(env)
            return True

    def _unpark(self, spot_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return self._parked.pop(spot_id, [])

    def _capture(self, act: SpotAct) -> bytes | None:
        """Inside the barrier turn: refuse if anything is in flight, then capture."""
        from .runtime import LifeJob

        lanes = act.owner.lanes
        pending = list(lanes.app or ()) + list(lanes.life or ())
        if act.yields_out or any(isinstance(i, _Resume) for i in pending):
            raise Unavailable(f"{act.spot_id!r}: a Yield is still in flight (barrier failed)")
        if any(isinstance(i, LifeJob) for i in pending):
            raise Unavailable(f"{act.spot_id!r}: lifecycle work is queued (barrier failed)")
        adapter = act.spec.relocation.adapter
        if adapter is None:
            return None  # recreate(): no state moves
        data = adapter().capture(act.instance)
        if not isinstance(data, (bytes, bytearray)):
            raise StateIncompatible(f"capture returned {type(data).__name__}, not bytes")
        return bytes(data)  # the runtime's own copy; the adapter owns its array

    def _ship(self, rid: int, turn: Turn) -> None:
        from .runtime import READY, MessageJob

        act, target, _done = self._outgoing[rid]
        if turn.error is not None:  # barrier or capture failure: admission back, exactly
            act.owner.lanes.set_closed(False)
            act.state = READY
            self._finish(rid, turn.error)
            for env in self._unpark(act.spot_id):  # what met the seal runs here after all
                self.router._on_call(env)
            return
        data: bytes | None = turn.result
        jobs: list[dict[str, Any]] = []
        for item in act.owner.drain():  # queued behind the barrier: they move, in order
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
                act.owner.lanes.release(item.lane, item.size)
        timers = [
            {"n": t.name, "i": t.interval, "p": t.options.overrun_policy.value,
             "x": t.options.max_catch_up_ticks, "k": t.options.keeps_alive,
             "d": t.next_due, "q": t.sequence}
            for t in act.timers.values()
        ]  # fmt: skip
        act.cancel_timers()
        blob = "" if data is None else base64.b64encode(data).decode()
        chunks = [blob[i : i + self.chunk_limit] for i in range(0, len(blob), self.chunk_limit)]
        try:
            for n, chunk in enumerate(chunks):
                self.router.transport.send(
                    target, {"k": "reloc_chunk", "o": self.rt.node_id, "r": rid, "i": n, "b": chunk}
                )
            self.router.transport.send(target, {
                "k": "reloc", "o": self.rt.node_id, "r": rid, "t": act.spot_id,
                "tn": act.spec.name, "g": act.ref.object_generation, "n": len(chunks),
                "s": data is not None, "timers": timers, "jobs": jobs,
            })  # fmt: skip
        except Unavailable as exc:  # the target is gone: nothing left the source
            _log.error("relocation of %r to %s could not start: %s", act.spot_id, target, exc)
            self._finish(rid, exc)

    def on_restored(self, env: dict[str, Any]) -> None:
        """The target restored (or gave up): commit authority, then let it open admission."""
        from .runtime import GONE

        with self._lock:
            entry = self._outgoing.get(env["r"])
        if entry is None:
            return
        act, target, _done = entry
        if not env["ok"]:  # the target stays sealed; so does this node (nothing is lost)
            self._finish(env["r"], StateIncompatible(env["e"]))
            return
        for parked in self._unpark(act.spot_id):  # before the commit: per-sender order holds
            parked["h"] = parked.get("h", 0) + 1
            self.router.transport.send(target, parked)
        moved = self.router.store.transfer(
            act.spot_id, self.rt.node_id, act.authority, target, self.rt._lease()
        )
        act.state = GONE
        with self.rt._lock:
            if self.rt.spots.get(act.spot_id) is act:
                del self.rt.spots[act.spot_id]  # from now on stale routes relay to the target
        self.router.transport.send(target, {
            "k": "reloc_commit", "o": self.rt.node_id, "r": env["r"], "t": act.spot_id,
            "a": moved.authority_generation,
        })  # fmt: skip
        self.rt.metrics.add("relocated_out")  # done once the target says admission is open

    def on_opened(self, env: dict[str, Any]) -> None:
        self._finish(env["r"], None)

    def _finish(self, rid: int, error: BaseException | None) -> None:
        with self._lock:
            entry = self._outgoing.pop(rid, None)
        if entry is not None:
            err = error
            if err is not None and not isinstance(err, ZLinkError):
                err = StateIncompatible(f"capture failed: {type(err).__name__}: {err}")
            entry[2].set(None, err)

    # -- target ----------------------------------------------------------------------------------
    def on_chunk(self, env: dict[str, Any]) -> None:
        with self._lock:
            self._chunks.setdefault((env["o"], env["r"]), []).append(env["b"])

    def on_relocate(self, env: dict[str, Any]) -> None:
        from .runtime import SEALED, SpotAct

        key = (env["o"], env["r"])
        with self._lock:
            chunks = self._chunks.pop(key, [])
        spec = self.rt.app.spots.get(env["tn"])
        if spec is None or len(chunks) != env["n"]:
            self._answer(env, "the payload does not match this node's app or is incomplete")
            return
        payload = base64.b64decode("".join(chunks)) if env["s"] else None
        with self.rt._lock:
            if env["t"] in self.rt.spots:
                self._answer(env, f"{env['t']!r} already lives on {self.rt.node_id}")
                return
            act = SpotAct(self.rt, spec, env["t"], env["g"])
            act.state = SEALED
            self.rt.spots[act.spot_id] = act
        self._incoming[key] = act
        self._restore(env, act, payload, 1)

    def _restore(self, env: dict[str, Any], act: SpotAct, payload: bytes | None, attempt: int):  # type: ignore[no-untyped-def]
        from .runtime import LifeJob

        def run() -> Any:
            act.instance = act.spec.cls(act.context)  # a fresh instance for every attempt
            adapter = act.spec.relocation.adapter
            if payload is None or adapter is None:
                return act.instance.on_initialize()  # recreate(): a new start, no state
            adapter().restore(act.instance, bytes(payload))  # a fresh defensive copy
            return None

        def restored(turn: Turn) -> None:
            if turn.error is not None:
                _log.error("restore of %r failed (attempt %d)", act.spot_id, attempt,
                           exc_info=turn.error)  # fmt: skip
                if attempt < RESTORE_ATTEMPTS:  # same target, same payload
                    self._restore(env, act, payload, attempt + 1)
                else:  # stays sealed here; the source is told
                    self._answer(env, f"restore failed {attempt} times: {turn.error}")
                return
            act.owner.hold(after=lambda: self._refill(env, act))

        act.owner.put_unreserved(LifeJob(act, "relocation restore", run, restored, UNRESERVED))

    def _refill(self, env: dict[str, Any], act: SpotAct) -> None:
        """The restored Spot is held: queue its messages and timers, then tell the source."""
        from .runtime import MessageJob

        rt = self.rt
        for t in env["timers"]:
            options = TimerOptions(OverrunPolicy(t["p"]), t["x"], t["k"])
            fn = act.spec.timer_handlers[t["n"]]
            timer = Timer(t["n"], t["i"], options, act, act.owner, fn, t["d"])
            timer.sequence = t["q"]
            act.timers[timer.name] = timer
            timer.arm()
        for job in env["jobs"]:
            if job["k"] == "tick":
                owner_timer = act.timers.get(job["n"])
                if owner_timer is not None:
                    tick = TimerTick(job["n"], job["q"], job["sa"], job["fa"], job["l"])
                    owner_timer.queued += 1
                    act.owner.lanes.put_app(TimerJob(owner_timer, tick), 0)
                continue
            msg = message_type(job["tn"]).model_validate_json(job["p"])
            handler = (act.spec.subscriptions if job["tp"] else act.spec.handlers)[type(msg)]
            reply = None
            if job["c"] is not None:
                reply = Completion()
                reply.add_callback(self._answer_to({"c": job["c"], "o": env["o"]}))
            item = MessageJob(act, handler, msg, reply, job["m"], job["s"], 0, job["tp"])
            item.size = len(job["p"])
            item.at = rt.clock.now()
            act.owner.lanes.put_app(item, item.size)
        act.restored = True  # from now on arrivals queue (held) behind the moved messages
        self._answer(env, None)

    def _answer_to(self, route: dict[str, Any]) -> Any:
        def answer(value: Any, error: BaseException | None) -> None:
            self.router._reply(route, value, error)

        return answer

    def on_commit(self, env: dict[str, Any]) -> None:
        from .runtime import READY

        act = self._incoming.pop((env["o"], env["r"]), None)
        if act is None:
            return
        act.authority = env["a"]
        act.restored = False
        act.state = READY  # admission opens
        act.owner.unhold()  # queued messages and ticks run now
        self.rt.metrics.add("relocated_in")
        self.router.transport.send(env["o"], {"k": "reloc_opened", "r": env["r"]})

    def _answer(self, env: dict[str, Any], error: str | None) -> None:
        self.router.transport.send(
            env["o"], {"k": "reloc_done", "r": env["r"], "ok": error is None, "e": error or ""}
        )
