"""Ledger audit, part two (python-api §9 "never lost without a trace"; §8 batches; §10
at-most-once across a node's end): the seeded chaos run of ``test_ledger_audit.py`` extended,
one dimension at a time, to what it did not exercise:

* ``batch``: ``send_many_to_spot`` to User Spots (all or none admitted; each message then
  handled or counted);
* ``actor``: Actors joined to SPOT_WIDE and PER_ACTOR User Spots, the Spots moved with their
  members, sends / batches / requests to the Actors;
* ``instance``: Instance Spots activated by sends (``.instance_spot()``, many fresh ids:
  first records) while nodes stop;
* ``channel``: one-way sends and requests to a Channel.

Same ledger as part one: every accepted one-way message handled exactly once or counted lost
once (``zlink.status.losses`` summed over the nodes, less requests discarded), every request
answered once, ``Unavailable`` only for a handler that did not run (but for §10's in-flight
case). ``LEDGER2_SEEDS=N`` runs more seeds (1 in the suite; 6 of each dimension ran clean by
hand). The deterministic tests at the end each failed on the code before its fix (a helper's
audit found the first two; the third explains its unexplained ``instance`` losses).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import sys
import threading
import time
from typing import Any

import pytest

import zlink
from tests.stress.test_ledger_audit import (
    _loss_total,
    _problems,
    _RequestDiscards,
    _sum_counters,
    _verdicts,
)
from zlink.testing import LocalCluster

SEEDS = int(os.environ.get("LEDGER2_SEEDS", "1"))
FIRST_SEED = int(os.environ.get("LEDGER2_FIRST_SEED", "1"))


class Note(zlink.Message, type_name="t.la2.note"):
    sender: str
    seq: int
    mid: str


class Ask(zlink.Request[str], type_name="t.la2.ask"):
    sender: str
    seq: int
    mid: str


class Enter(zlink.Message, type_name="t.la2.enter"):
    room: str


class Held(zlink.Request[str], type_name="t.la2.held"):
    mid: str


_LOCK = threading.Lock()
RAN: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # mid -> [(node, where)]
JOINED: list[tuple[str, bool]] = []
HOLD = threading.Event()
HOLDING = threading.Event()


def _record(context: Any, where: str, mid: str) -> str:
    node = context._rt.node_id
    with _LOCK:
        RAN[mid].append((node, where))
    return node  # type: ignore[no-any-return]


class _Handlers:
    context: Any

    def _where(self) -> str:
        return getattr(self.context, "actor_id", None) or self.context.spot_id

    @zlink.handler
    def note(self, msg: Note) -> None:
        _record(self.context, self._where(), msg.mid)

    @zlink.handler
    def ask(self, req: Ask) -> str:
        return _record(self.context, self._where(), req.mid)

    @zlink.handler
    def held(self, req: Held) -> str:
        node = _record(self.context, self._where(), req.mid)
        HOLDING.set()
        HOLD.wait(10.0)
        return node


class Box(_Handlers, zlink.UserSpot):
    pass


class Room(_Handlers, zlink.UserSpot):
    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        return zlink.ActorJoinResult()


class Player(_Handlers, zlink.Actor):
    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        with _LOCK:
            JOINED.append((self.context.actor_id, completion.joined))


class Lobby(zlink.EntrySpot):
    pass


class Inst(_Handlers, zlink.InstanceSpot):
    pass


class Api(_Handlers):
    def __init__(self, context: zlink.ChannelContext) -> None:
        self.context = context

    def _where(self) -> str:
        return "api"


def build_app() -> zlink.App:
    app = zlink.App("ledger-audit2")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.la2.box", relocation=state)(Box)
    app.user_spot("t.la2.room", relocation=state)(Room)
    app.user_spot("t.la2.hall", mode=zlink.ExecutionMode.PER_ACTOR)(type("Hall", (Room,), {}))
    app.entry_spot("t.la2.lobby", actor="t.la2.player")(Lobby)
    app.actor("t.la2.player", relocation=state)(Player)
    app.instance_spot("t.la2.inst", relocation=state)(Inst)
    app.channel("t.la2.api")(Api)
    return app


def _reset() -> None:
    with _LOCK:
        RAN.clear()
        JOINED.clear()
    HOLD.clear()
    HOLDING.clear()


def _owner(cluster: LocalCluster, name: str, alive: set[int]) -> int | None:
    for i in sorted(alive):
        rt = cluster.node(i)._runtime
        act = rt.spots.get(name)
        if act is not None and getattr(act, "state", None) not in ("closing", "gone"):
            return i
    return None


# ---- the chaos run ---------------------------------------------------------------------
NODES = 4
SENDERS_PER_NODE = 2


def chaos_run(seed: int, dim: str, seconds: float = 2.0) -> dict[str, Any]:
    _reset()
    rng = random.Random(f"{dim}:{seed}")
    accepted: dict[str, str] = {}  # mid -> target (one-way, accepted)
    refused: dict[str, str] = {}  # mid -> error type (one-way refused)
    outcomes: dict[str, list[Any]] = collections.defaultdict(list)
    batches = [0, 0]  # accepted, refused
    chaos_log: list[str] = []
    errors: list[BaseException] = []
    rec_lock = threading.Lock()
    stop_senders = threading.Event()

    with (
        _RequestDiscards() as rdisc,
        LossTracer() as tracer,
        PathTracer(_path_targets()) as paths,
        EventTracer() if os.environ.get("LEDGER2_TRACE") else contextlib.nullcontext(),
    ):
        cluster = LocalCluster(build_app(), nodes=NODES, workers=2, request_timeout=3.0,
                               admission_timeout=0.5, shutdown_timeout=3.0)  # fmt: skip
        cluster.start()
        alive = set(range(NODES))
        movable: list[str] = []
        targets: list[str] = []
        try:
            if dim in ("batch",):
                for k in range(4):
                    cluster.node(k % NODES).client().spots.get_or_create(
                        f"box-{k}", "t.la2.box").wait(5)  # fmt: skip
                    movable.append(f"box-{k}")
                targets = list(movable)
            elif dim == "actor":
                rooms = []
                for k in range(4):
                    kind = "t.la2.room" if k % 2 == 0 else "t.la2.hall"
                    name = f"{'room' if k % 2 == 0 else 'hall'}-{k}"
                    cluster.node(k % NODES).client().spots.get_or_create(name, kind).wait(5)
                    rooms.append(name)
                movable = list(rooms)
                for j in range(8):
                    c = cluster.node(j % NODES).client()
                    pid = c.actors.create("t.la2.player").wait(5).actor_id
                    c.send_to_actor(pid, Enter(room=rooms[j % 4])).wait(5)
                    targets.append(pid)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    with _LOCK:
                        if len(JOINED) >= len(targets):
                            break
                    time.sleep(0.01)
                with _LOCK:
                    assert sorted(p for p, ok in JOINED if ok) == sorted(targets), JOINED
            elif dim == "instance":
                targets = [f"inst-{k}" for k in range(4)]
                movable = list(targets)
            elif dim == "channel":
                targets = ["t.la2.api"]

            def one_way(client: Any, target: str, msg: Note) -> Any:
                if dim == "actor":
                    return client.send_to_actor(target, msg)
                if dim == "channel":
                    return client.send(target, msg)
                call = client.send_to_spot(target, msg)
                return call.instance_spot() if dim == "instance" else call

            def request(client: Any, target: str, req: Ask) -> Any:
                if dim == "actor":
                    return client.request_to_actor(target, req)
                if dim == "channel":
                    return client.request(target, req)
                call = client.request_to_spot(target, req)
                return call.instance_spot() if dim == "instance" else call

            def sender(name: str, node: int, srng: random.Random) -> None:
                client = cluster.node(node).client()
                seq = 0
                fresh = 0
                end = time.monotonic() + seconds + 6.0
                try:
                    for _ in range(3000):
                        if stop_senders.is_set() or time.monotonic() > end:
                            return
                        target = srng.choice(targets)
                        if dim == "instance" and srng.random() < 0.3:
                            fresh += 1  # a new Instance Spot: its first message
                            target = f"fresh-{name}-{fresh}"
                        r = srng.random()
                        if (dim == "batch" or (dim == "actor" and r < 0.3)) and r < 0.8:
                            size = srng.randrange(1, 6)
                            mids = [f"{name}:{seq + i + 1}" for i in range(size)]
                            msgs = [Note(sender=name, seq=seq + i + 1, mid=m)
                                    for i, m in enumerate(mids)]  # fmt: skip
                            seq += size
                            try:
                                if dim == "actor":
                                    call = client.send_many_to_actor(target, msgs)
                                else:
                                    call = client.send_many_to_spot(target, msgs)
                                if srng.random() < 0.5:
                                    call.submit()
                                else:
                                    call.wait(1.0)
                            except zlink.ZLinkError as exc:
                                with rec_lock:
                                    batches[1] += 1
                                    for m in mids:
                                        refused[m] = type(exc).__name__
                                time.sleep(0.002)
                            else:
                                with rec_lock:
                                    batches[0] += 1
                                    for m in mids:
                                        accepted[m] = target
                        elif r < 0.8:
                            seq += 1
                            mid = f"{name}:{seq}"
                            try:
                                call = one_way(client, target, Note(sender=name, seq=seq, mid=mid))
                                if r < 0.4:
                                    call.submit()
                                else:
                                    call.wait(1.0)
                            except zlink.ZLinkError as exc:
                                with rec_lock:
                                    refused[mid] = type(exc).__name__
                                time.sleep(0.002)
                            else:
                                with rec_lock:
                                    accepted[mid] = target
                        else:
                            seq += 1
                            mid = f"{name}:{seq}"
                            try:
                                out: Any = request(client, target, Ask(sender=name, seq=seq,
                                                   mid=mid)).timeout(2.0).wait(4.0)  # fmt: skip
                            except (zlink.ZLinkError, TimeoutError) as exc:
                                out = exc
                            with rec_lock:
                                outcomes[mid].append(out)
                        if seq % 8 == 0:
                            time.sleep(0.001)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

            threads = [
                threading.Thread(target=sender, args=(f"n{n}s{k}", n,
                                 random.Random(f"{dim}:{seed}:n{n}s{k}")), daemon=True)
                for n in range(NODES) for k in range(SENDERS_PER_NODE)
            ]  # fmt: skip
            for t in threads:
                t.start()

            def move(spot: str, target: int) -> None:
                src = _owner(cluster, spot, alive)
                if src is None or src == target:
                    chaos_log.append(f"move {spot} {src}->{target} skipped")
                    return
                try:
                    cluster.node(src).relocate_spot(spot, f"node-{target + 1}", timeout=2.0)
                    chaos_log.append(f"move {spot} {src}->{target} ok")
                except zlink.ZLinkError as exc:
                    chaos_log.append(f"move {spot} {src}->{target} {type(exc).__name__}")
                except BaseException as exc:  # noqa: BLE001
                    chaos_log.append(f"move {spot} raised {exc!r}")

            drained = rng.randrange(1, NODES)
            end = time.monotonic() + seconds
            step = 0
            while time.monotonic() < end and step < 30:
                step += 1
                live = sorted(alive - {drained} if step > 5 else alive)
                if movable:
                    move(rng.choice(movable), rng.choice(live))
                if step == 5:
                    try:
                        res = cluster.node(drained).drain(timeout=3.0)
                        chaos_log.append(f"drain {drained}: moved {res.moved} stayed {res.stayed}")
                    except zlink.ZLinkError as exc:
                        chaos_log.append(f"drain {drained} {type(exc).__name__}")
                time.sleep(rng.random() * 0.05)

            order = list(range(NODES))
            rng.shuffle(order)
            victim = order[0]
            movers = []
            for spot in movable:
                src = _owner(cluster, spot, alive)
                if src is None:
                    continue
                tgt = victim if src != victim else rng.choice([i for i in alive if i != victim])
                movers.append(threading.Thread(target=move, args=(spot, tgt), daemon=True))
            for t in movers:
                t.start()
            time.sleep(rng.random() * 0.01)
            for idx in order:
                cluster.node(idx).shutdown(3.0)
                alive.discard(idx)
                chaos_log.append(f"stopped {idx}")
                if idx == victim:
                    for t in movers:
                        t.join(5.0)
                time.sleep(rng.random() * 0.05)
            stop_senders.set()
            for t in threads:
                t.join(8.0)
            hung = [t.name for t in threads + movers if t.is_alive()]
        finally:
            stop_senders.set()
            HOLD.set()
            cluster.shutdown(3.0)
        counters = _sum_counters(cluster)
        request_discards = rdisc.n
        leftovers = _leftover_jobs(cluster) if os.environ.get("LEDGER2_TRACE") else {}

    with _LOCK:
        ran = {m: list(v) for m, v in RAN.items()}
    loss_total, loss_by = _loss_total(counters)
    handled = sum(1 for m in accepted if m in ran)
    return {
        "seed": seed,
        "dim": dim,
        "accepted_oneway": len(accepted),
        "refused_oneway": len(refused),
        "batches": tuple(batches),
        "handled_oneway": handled,
        "missing_oneway": len(accepted) - handled,
        "oneway_losses": loss_total - request_discards,
        "loss_by": loss_by,
        "request_discards": request_discards,
        "requests": len(outcomes),
        "requests_ran": sum(1 for m in outcomes if m in ran),
        "request_outcomes": dict(
            collections.Counter(
                type(o[0]).__name__ if o and isinstance(o[0], BaseException) else "value"
                for o in outcomes.values()
            )
        ),
        "fresh_instances": len({t for t in accepted.values() if t.startswith("fresh-")}),
        "carried": counters.get("messages_carried_to_next_activation", 0),
        **_verdicts(ran, refused, outcomes),
        "missing": sorted(m for m in accepted if m not in ran)[:20],
        "uncounted": _uncounted([m for m in accepted if m not in ran], tracer),
        "paths": paths.log,
        "leftovers": leftovers,
        "errors": errors,
        "hung": hung,
        "chaos": chaos_log,
    }


EVENTS: list[tuple[float, str, str, str]] = []  # diagnosis: (t, node, what, spot)


class EventTracer:
    """Diagnosis: spot registrations, arrivals, closes and each node's discard, in time."""

    def __enter__(self) -> EventTracer:
        from zlink.relocation import relocator as _reloc
        from zlink.runtime import runtime as _rtm

        EVENTS.clear()
        t0 = time.monotonic()
        self._saved = []

        def find(cls: Any, name: str) -> Any:
            for k in cls.__mro__:
                if name in k.__dict__:
                    return k
            raise AttributeError(name)

        def spot_of(args: tuple[Any, ...]) -> str:
            for a in args[1:]:
                if isinstance(a, str):
                    return a
                for attr in ("spot_id", "target"):
                    v = getattr(a, attr, None)
                    if isinstance(v, str):
                        return v
                v = getattr(getattr(a, "act", None), "spot_id", None)
                if isinstance(v, str):
                    return v
            return ""

        targets = [(_rtm.Runtime, "register_spot"), (_rtm.Runtime, "discard_queued"),
                   (_rtm.Runtime, "close_all"), (_rtm.Runtime, "stop_admission"),
                   (_reloc.Relocator, "on_relocate"), (_reloc.Relocator, "on_commit"),
                   (_reloc.Relocator, "_open"), (_reloc.Relocator, "_close_at_stop")
                   if hasattr(_reloc.Relocator, "_close_at_stop") else None]  # fmt: skip
        for item in targets:
            if item is None or not hasattr(item[0], item[1]):
                continue
            owner = find(*item)
            orig = owner.__dict__[item[1]]

            def wrap(*args: Any, __o: Any = orig, __n: str = item[1], **kw: Any) -> Any:
                me = args[0]
                rt = getattr(me, "rt", None) or me
                EVENTS.append((round(time.monotonic() - t0, 4), getattr(rt, "node_id", "?"),
                               __n, spot_of(args)))  # fmt: skip
                return __o(*args, **kw)

            self._saved.append((owner, item[1], orig))
            setattr(owner, item[1], wrap)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)


def _leftover_jobs(cluster: LocalCluster) -> dict[str, str]:
    """Diagnosis: jobs still alive after every node stopped (never run, never discarded):
    mid -> where they sit."""
    import gc

    from zlink.runtime import jobs as _jobs

    out: dict[str, str] = {}
    for obj in gc.get_objects():
        if isinstance(obj, _jobs.SendJob) and isinstance(getattr(obj, "msg", None), Note):
            act = obj.act
            rt = getattr(act, "rt", None) or getattr(getattr(act, "ref", None), "rt", None)
            node = getattr(rt, "node_id", "?")
            live = None
            if rt is not None:
                live = (rt.actors if getattr(act, "stats_kind", "") == "actor" else rt.spots).get(
                    act.name
                ) is act

            refs = [type(r).__name__ for r in gc.get_referrers(obj)][:4]
            out[obj.msg.mid] = (f"{type(obj).__name__} act={act.name} state={act.state} "
                                f"node={node} live={live} owner={getattr(act.owner, 'name', '?')} "
                                f"refs={refs}")  # fmt: skip
    return out


def _path_targets() -> list[tuple[Any, str]]:
    if not os.environ.get("LEDGER2_TRACE"):
        return []
    from zlink.relocation import relocator as _reloc
    from zlink.runtime import jobs as _jobs
    from zlink.runtime import routing as _routing
    from zlink.runtime import runtime as _rtm

    out: list[tuple[Any, str]] = [
        (_rtm.Runtime, "submit_many"),
        (_rtm.Runtime, "_one_by_one"),
        (_routing.MeshRouter, "send_batch"),
        (_routing.MeshRouter, "post"),
        (_routing.MeshRouter, "_on_batch"),
        (_routing.MeshRouter, "_on_call"),
        (_routing.MeshRouter, "send_call"),
        (_routing.MeshRouter, "_keep"),
        (_routing.MeshRouter, "_outbox_room"),
        (_routing.MeshRouter, "_undeliverable"),
        (_routing.MeshRouter, "data_lost"),
        (_routing.MeshRouter, "received"),
        (_reloc.Relocator, "divert_batch"),
        (_reloc.Relocator, "divert"),
        (_reloc.Relocator, "divert_envelope"),
        (_rtm.Runtime, "submit"),
        (_rtm.Runtime, "_not_ready"),
        (_rtm.Runtime, "_remote"),
        (_rtm.Runtime, "_wait_for_room"),
        (_rtm.Runtime, "_refused"),
        (_reloc.Relocator, "_take_jobs"),
        (_reloc.Relocator, "_queue_jobs"),
        (_reloc.Relocator, "_relay"),
        (_reloc.Relocator, "_admit"),
        (_reloc.Relocator, "_discard"),
        (_reloc.Relocator, "_forget_in"),
        (_reloc.Relocator, "_put_back"),
        (_reloc.Relocator, "_keep"),
        (_jobs.SendJob, "discard"),
        (_jobs.SendJob, "invoke"),
    ]
    found = []
    for o, n in out:
        for k in o.__mro__:
            if n in k.__dict__:
                found.append((k, n))
                break
    return found


def _uncounted(missing: list[str], tracer: LossTracer) -> dict[str, Any]:
    """Missing mids no loss event's frames named, and loss events that named no mid."""
    named = set().union(*(e[2] for e in tracer.events)) if tracer.events else set()
    blind = collections.Counter((e[0], e[3]) for e in tracer.events if not e[2])
    return {"mids": sorted(m for m in missing if m not in named)[:30], "blind_events": dict(blind)}


_SUMMARY = ("accepted_oneway", "refused_oneway", "batches", "handled_oneway", "missing_oneway",
            "oneway_losses", "loss_by", "request_discards", "requests", "requests_ran",
            "request_outcomes", "fresh_instances", "carried", "missing", "uncounted")  # fmt: skip


@pytest.mark.parametrize("dim", ["batch", "actor", "instance", "channel"])
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_chaos_ledger_balances(seed: int, dim: str) -> None:
    led = chaos_run(seed, dim)
    problems = _problems(led)
    summary = {k: led[k] for k in _SUMMARY}
    print(f"{dim} seed {seed}: {summary}\n  chaos: {led['chaos']}")
    for m in led["uncounted"]["mids"][:6]:
        print(f"  path of uncounted {m}:")
        for step in led["paths"].get(m, []):
            print(f"    {step}")
        print(f"    leftover: {led['leftovers'].get(m)}")
    spots = {v.split("act=")[1].split()[0] for v in led.get("leftovers", {}).values()}
    for ev in EVENTS:
        if ev[3] in spots or ev[2] in ("discard_queued", "close_all", "stop_admission"):
            print(f"  event {ev}")
    assert not problems, "\n".join(problems) + f"\n{summary}\n{led['chaos']}"


# ---- diagnosis: which messages each loss counter counted (by the objects in the frames) -----
_MID_RE = __import__("re").compile(rb'"mid":"([^"]+)"')


def _mids_in(obj: Any, depth: int, out: set[str], seen: set[int]) -> None:
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, Note):
        out.add(obj.mid)
        return
    if isinstance(obj, (bytes, bytearray, memoryview)):
        out.update(m.decode() for m in _MID_RE.findall(bytes(obj)))
        return
    if isinstance(obj, str):
        if '"mid"' in obj:
            out.update(m.decode() for m in _MID_RE.findall(obj.encode()))
        return
    if isinstance(obj, (int, float, type, threading.Thread)) or obj is None:
        return
    if isinstance(obj, (list, tuple, set, collections.deque)):
        try:
            items = list(obj)[:2000]
        except RuntimeError:  # (another thread mutated it as it was copied: 3.13t)
            return
        for x in items:
            _mids_in(x, depth - 1, out, seen)
        return
    if isinstance(obj, dict):
        return
    for name in ("msg", "msgs", "call", "calls", "job", "jobs", "payload", "env", "items",
                 "batch", "parts", "body", "frames", "data", "payloads", "bodies"):  # fmt: skip
        try:
            val = getattr(obj, name, None)
        except Exception:  # noqa: BLE001
            continue
        if val is not None and not callable(val):
            _mids_in(val, depth - 1, out, seen)


class LossTracer:
    """Wraps ``Metrics.add``: for each loss counter bump, the mids found in its callers'
    locals (a diagnosis, not a proof: a frame may hold more than what it counts)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, set[str], str]] = []
        self.lock = threading.Lock()

    def __enter__(self) -> LossTracer:
        from zlink.runtime import metrics as _metrics

        self._orig = _metrics.Metrics.add
        orig, me = self._orig, self

        def add(m: Any, name: str, n: int = 1) -> None:
            try:
                me._trace(name, n)
            except Exception:  # noqa: BLE001 - a diagnosis never stops what it watches: a
                pass  # fault here once left a discard uncounted (3.13t CI), failing the run
            finally:
                orig(m, name, n)

        _metrics.Metrics.add = add  # type: ignore[method-assign]
        return self

    def _trace(self, name: str, n: int) -> None:
        """(Inside ``Metrics.add``, through its wrapper.) The mids in the locals of the
        frames that counted."""
        if not name.startswith(("messages_discarded_", "sends_dropped_", "data_unacknowledged_")):
            return
        mids: set[str] = set()
        f: Any = sys._getframe(2)  # (0: here, 1: the wrapper, 2: what counted)
        where = f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}:{f.f_code.co_name}"
        for _ in range(6):
            if f is None:
                break
            seen: set[int] = set()
            for v in list(f.f_locals.values()):
                _mids_in(v, 3, mids, seen)
            if mids:
                break
            f = f.f_back
        with self.lock:
            self.events.append((name, n, mids, where))

    def __exit__(self, *exc: object) -> None:
        from zlink.runtime import metrics as _metrics

        _metrics.Metrics.add = self._orig  # type: ignore[method-assign]


class PathTracer:
    """Diagnosis: wraps methods; each call whose arguments carry mids is logged per mid as
    (time, node, method, outcome)."""

    def __init__(self, targets: list[tuple[Any, str]]) -> None:
        self.targets = targets
        self.log: dict[str, list[tuple[float, str, str, str]]] = collections.defaultdict(list)
        self.lock = threading.Lock()
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PathTracer:
        t0 = time.monotonic()
        for owner, name in self.targets:
            orig = owner.__dict__[name]
            self._saved.append((owner, name, orig))

            def wrap(*args: Any, __orig: Any = orig, __name: str = f"{owner.__name__}.{name}",
                     **kw: Any) -> Any:  # fmt: skip
                mids: set[str] = set()
                seen: set[int] = set()
                for a in args[1:]:
                    _mids_in(a, 3, mids, seen)
                for a in kw.values():
                    _mids_in(a, 3, mids, seen)
                me = args[0]
                rt = getattr(me, "rt", None) or getattr(me, "_rt", None) or me
                node = getattr(rt, "node_id", "?")
                extra = ""
                if mids and (__name.endswith("divert_batch") or __name.endswith("send_batch")):
                    extra = ""
                try:
                    out = __orig(*args, **kw)
                except BaseException as exc:
                    if mids:
                        with self.lock:
                            for m in mids:
                                self.log[m].append((time.monotonic() - t0, node, __name,
                                                    f"raised {exc!r}"[:160]))  # fmt: skip
                    raise
                if mids:
                    with self.lock:
                        for m in mids:
                            self.log[m].append((time.monotonic() - t0, node, __name,
                                                f"-> {out!r}"[:120] + extra))  # fmt: skip
                return out

            setattr(owner, name, wrap)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)


# ---- deterministic reproductions -------------------------------------------------------------
WAIT = 5.0


def _infra_sync(node: zlink.Node, rounds: int = 3) -> None:
    for _ in range(rounds):
        passed = threading.Event()
        node._infra.submit(passed.set)
        if not passed.wait(1.0):
            return  # (its infrastructure thread stopped)


def _ledger(cluster: LocalCluster, mids: list[str]) -> tuple[int, int, dict[str, int]]:
    """(handled, counted losses, the loss counters) for accepted one-way ``mids``."""
    with _LOCK:
        handled = sum(1 for m in mids if m in RAN)
    total, by = _loss_total(_sum_counters(cluster))
    return handled, total, by


def _assert_balanced(cluster: LocalCluster, mids: list[str], diagnosis: str) -> None:
    """Each of the accepted one-way ``mids`` handled or counted lost (``_ledger``)."""
    handled, counted, by = _ledger(cluster, mids)
    assert handled + counted == len(mids), (
        f"{len(mids)} accepted, {handled} handled, {counted} counted as lost ({by}); {diagnosis}"
    )


def _batch_or_single_lost_in_outbox(batch: bool) -> tuple[int, int, int, dict[str, int]]:
    """node-1 knows the box is on node-2; its infrastructure thread is held, so what it
    sends waits in its outbox; node-2 stops meanwhile; then the outbox flushes to a node that
    is gone (the transport: "not reachable"). Returns (accepted, handled, counted, by)."""
    _reset()
    cluster = LocalCluster(build_app(), nodes=2, workers=2, request_timeout=3.0,
                           shutdown_timeout=2.0).start()  # fmt: skip
    a, b = cluster.nodes
    mids = ["a:0"]
    release = threading.Event()
    try:
        b.client().spots.get_or_create("box", "t.la2.box").wait(WAIT)
        ca = a.client()
        ca.send_to_spot("box", Note(sender="a", seq=0, mid="a:0")).wait(WAIT)  # a learns: on b
        cluster.wait_idle(WAIT)
        a._infra.submit(lambda: release.wait(WAIT))  # a's outbox flushes after this
        if batch:
            msgs = [Note(sender="a", seq=i, mid=f"a:{i}") for i in range(1, 4)]
            ca.send_many_to_spot("box", msgs).submit()  # accepted: one BatchEnvelope queued
            mids += [m.mid for m in msgs]
        else:
            ca.send_to_spot("box", Note(sender="a", seq=1, mid="a:1")).submit()
            mids.append("a:1")
        b.shutdown(2.0)  # b is detached now
        release.set()
        _infra_sync(a)
        a.shutdown(2.0)
    finally:
        release.set()
        cluster.shutdown(2.0)
    handled, counted, by = _ledger(cluster, mids)
    return len(mids), handled, counted, by


def test_control_a_single_send_that_fails_in_the_outbox_is_counted_unreachable():
    """The control for the next test: the same loss with a single send is counted."""
    accepted, handled, counted, by = _batch_or_single_lost_in_outbox(batch=False)
    assert handled + counted == accepted, (accepted, handled, counted, by)
    assert by.get("dropped:unreachable") == 1, by


def test_a_batch_that_fails_in_the_outbox_is_counted():
    """A batch accepted on node-1 for a Spot on node-2 goes as one ``BatchEnvelope``; when
    the outbox cannot hand it over (node-2 went away meanwhile), ``MeshRouter._undeliverable``
    counts a ``SendEnvelope`` (``sends_dropped_unreachable``) but has no case for a
    ``BatchEnvelope``: its messages are neither handled nor counted anywhere."""
    accepted, handled, counted, by = _batch_or_single_lost_in_outbox(batch=True)
    assert handled + counted == accepted, (
        f"{accepted} accepted, {handled} handled, {counted} counted as lost ({by})"
    )


def test_a_send_relayed_to_a_stopping_node_after_its_discard_is_counted_for_an_actor():
    """An Actor lives on node-2 (in its Entry Spot); node-1 knows the route. node-2 shuts
    down: past ``discard_queued`` (at the moment its transport is told it is ``leaving``),
    node-1 sends to the Actor. node-2 still takes calls from peers (a stopping node relays,
    hops > 0), finds the Actor READY (a stop closes Spots, not Actors) and queues the message
    in its lane: nothing runs it (the pool is down) and nothing discards it again."""
    _reset()
    cluster = LocalCluster(build_app(), nodes=2, workers=2, request_timeout=3.0,
                           shutdown_timeout=2.0).start()  # fmt: skip
    a, b = cluster.nodes
    mids = ["a:0"]
    try:
        pid = b.client().actors.create("t.la2.player").wait(WAIT).actor_id
        ca = a.client()
        ca.send_to_actor(pid, Note(sender="a", seq=0, mid="a:0")).wait(WAIT)  # a learns: on b
        cluster.wait_idle(WAIT)
        transport = cluster.transport
        leaving = transport.leaving
        injected = threading.Event()

        def hook(node_id: str) -> None:
            if node_id == "node-2" and not injected.is_set():
                injected.set()  # (node-2 discarded what was queued; it is still attached)
                ca.send_to_actor(pid, Note(sender="a", seq=1, mid="a:1")).submit()
                mids.append("a:1")  # accepted
                _infra_sync(a)
                _infra_sync(b)
            leaving(node_id)

        transport.leaving = hook  # type: ignore[method-assign]
        b.shutdown(2.0)
        assert injected.is_set()
        left = list(b._runtime.actors[pid].owner.lanes.app or ())  # (diagnosis)
        a.shutdown(2.0)
    finally:
        cluster.shutdown(2.0)
    _assert_balanced(cluster, mids, f"left in the stopped node's Actor lane: {left}")


def test_an_instance_spot_is_not_made_on_a_stopping_node_for_a_relayed_send():
    """The instance runs' uncounted sends (the audit left them unexplained; found after): an
    Instance Spot on node-2 closes at node-2's stop and its row goes; node-1's route still
    says node-2, so a send made there is relayed to the stopping node, which asked the store
    for the Spot, claimed it for itself and made it (its pool gone, its queues discarded):
    the send was never run nor counted. A node that stops claims no
    Spot now: the send is refused there, and counted."""
    _reset()
    cluster = LocalCluster(build_app(), nodes=2, workers=2, request_timeout=3.0,
                           shutdown_timeout=2.0).start()  # fmt: skip
    a, b = cluster.nodes
    mids = ["b:0", "a:0"]
    try:
        b.client().send_to_spot("inst-x", Note(sender="b", seq=0, mid="b:0")).instance_spot().wait(
            WAIT
        )
        ca = a.client()
        ca.send_to_spot("inst-x", Note(sender="a", seq=0, mid="a:0")).instance_spot().wait(WAIT)
        cluster.wait_idle(WAIT)  # node-1 learned: on node-2
        stop_pool = b._pool.shutdown
        injected = threading.Event()

        def stop_pool_then_send(timeout: float) -> None:
            stop_pool(timeout)
            if not injected.is_set():
                injected.set()  # (node-2 closed its Spots, discarded its queues, its pool ended)
                ca.send_to_spot(
                    "inst-x", Note(sender="a", seq=1, mid="a:1")
                ).instance_spot().submit()
                mids.append("a:1")  # accepted
                for _ in range(3):
                    _infra_sync(a)
                    _infra_sync(b)
                    assert b._rt.router.store_worker.wait_quiet(WAIT)

        b._pool.shutdown = stop_pool_then_send  # type: ignore[method-assign]
        b.shutdown(2.0)
        assert injected.is_set()
        made = b._runtime.spots.get("inst-x")  # (diagnosis)
        a.shutdown(2.0)
    finally:
        cluster.shutdown(2.0)
    _assert_balanced(cluster, mids, f"made on the stopped node: {made}")


def test_a_batch_part_refused_after_earlier_parts_were_queued_is_counted_alone():
    """(The lead for the over-count the batch runs show on 3.13t.) A batch whose target is
    not ready where it is goes one message at a time (``Runtime._one_by_one``); the target
    can change between two parts (here: the second is refused, as if the Spot closed just
    then). Before, that refusal raised out of the batch after its first part was queued:
    a peer's batch was then counted dropped whole (``MeshRouter._on_batch``), the queued
    part included, and a caller on the node heard its batch refused whole though part of it
    ran. Now the refused part alone is counted dropped (at both ends), and the rest go on."""
    from zlink.messaging.calls import NO_WAIT, BatchSendCall
    from zlink.runtime import runtime as rtm
    from zlink.types import TargetKind

    _reset()
    cluster = LocalCluster(build_app(), nodes=2, workers=2, request_timeout=3.0,
                           shutdown_timeout=2.0).start()  # fmt: skip
    _a, b = cluster.nodes
    real_submit = rtm.Runtime.submit
    parts: list[Any] = []

    def submit(rt: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        parts.append(call)
        if len(parts) == 2:  # the Spot "closed" between the first part and the second
            raise zlink.NotFound("no spot 'box' (closed just now)")
        return real_submit(rt, call, *args, **kwargs)

    mids = [f"p:{i}" for i in range(3)]
    try:
        b.client().spots.get_or_create("box", "t.la2.box").wait(WAIT)
        act = b._rt.spots["box"]
        msgs = [Note(sender="p", seq=i, mid=m) for i, m in enumerate(mids)]
        call = BatchSendCall(b._rt, TargetKind.SPOT, "box", msgs)
        call.origin = "node-1"  # a peer's batch: a drop is told there too
        rtm.Runtime.submit = submit  # type: ignore[method-assign]
        try:
            b._rt._one_by_one(call, act, None, NO_WAIT)
        finally:
            rtm.Runtime.submit = real_submit  # type: ignore[method-assign]
        cluster.wait_idle(WAIT)
        _infra_sync(_a)
        told = _a.counters().get("remote_sends_dropped_not_found", 0)
    finally:
        cluster.shutdown(2.0)
    handled, _counted, by = _ledger(cluster, mids)
    assert (handled, by, told) == (2, {"dropped:not_found": 1}, 1), (handled, by, told)
