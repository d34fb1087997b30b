"""Relocation of a SpotWide User Spot (kotlin-spot-interface relocation paragraphs; §4, §14)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.mesh import wire
from zlink.mesh.transport import Channel
from zlink.testing import LocalCluster, ManualClock, run_until_idle


class Add(zlink.Message, type_name="t.rl.add"):
    n: int = 1
    sender: int = 0
    seq: int = -1


class Total(zlink.Request[int], type_name="t.rl.total"):
    pass


class Where(zlink.Request[str], type_name="t.rl.where"):
    pass


class Beat(zlink.Message, type_name="t.rl.beat"):
    pass


class Slow(zlink.Request[str], type_name="t.rl.slow"):
    pass


class Hold(zlink.Request[str], type_name="t.rl.hold"):
    pass


HOLD = threading.Event()
HOLDING = threading.Event()
RESTORES: list[int] = []


class Exploding(zlink.JsonStateAdapter):
    def capture(self, instance: Any) -> bytes:
        raise RuntimeError("cannot capture")


class Unrestorable(zlink.JsonStateAdapter):
    def restore(self, instance: Any, data: bytes) -> None:
        RESTORES.append(1)
        SEEN.append((id(instance), data))
        raise RuntimeError("cannot restore")


SEEN: list[tuple[int, bytes]] = []


class Nothing(zlink.JsonStateAdapter):
    def capture(self, instance: Any) -> bytes:
        return None  # type: ignore[return-value]  # a contract violation


class Empty(zlink.JsonStateAdapter):
    def capture(self, instance: Any) -> bytes:
        return b""

    def restore(self, instance: Any, data: bytes) -> None:
        SEEN.append((id(instance), data))


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0
        self.beats = 0
        self.last: dict[str, int] = {}
        self.seen: dict[str, list[int]] = {}
        self.disorder = 0
        self.initialized = False

    def on_initialize(self) -> None:
        self.initialized = True

    @zlink.handler
    def add(self, msg: Add) -> None:
        if msg.seq >= 0:
            key = str(msg.sender)
            if msg.seq != self.last.get(key, -1) + 1:
                self.disorder += 1
            self.last[key] = msg.seq
            self.seen.setdefault(key, []).append(msg.seq)
        self.total += msg.n

    @zlink.handler
    def get_total(self, req: Total) -> int:
        return self.total

    @zlink.handler
    def where(self, req: Where) -> str:
        return _node()

    @zlink.handler
    def beat(self, msg: Beat) -> None:
        self.context.timers.register("beat", 1.0)

    @zlink.timer_handler("beat")
    def on_beat(self, tick: zlink.TimerTick) -> None:
        self.beats = tick.sequence

    @zlink.handler
    async def slow(self, req: Slow) -> str:
        out: str = await self.context.outbound.request("t.rl.api", Hold()).yield_()
        return out


def _node() -> str:
    turn = zlink.executor.current_turn()
    assert turn is not None and turn.owner is not None
    return turn.owner.ref.rt.node_id  # type: ignore[no-any-return]


def build_app() -> zlink.App:
    app = zlink.App("relocation")
    json_state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.rl.room", relocation=json_state)(type("R1", (Room,), {}))
    app.user_spot("t.rl.fresh", relocation=zlink.Relocation.recreate())(type("R2", (Room,), {}))
    app.user_spot("t.rl.fixed", relocation=zlink.Relocation.disabled())(type("R3", (Room,), {}))
    app.user_spot("t.rl.boom", relocation=zlink.Relocation.preserve_state(Exploding))(
        type("R4", (Room,), {})
    )
    app.user_spot("t.rl.stuck", relocation=zlink.Relocation.preserve_state(Unrestorable))(
        type("R5", (Room,), {})
    )
    app.user_spot("t.rl.null", relocation=zlink.Relocation.preserve_state(Nothing))(
        type("R6", (Room,), {})
    )
    app.user_spot("t.rl.empty", relocation=zlink.Relocation.preserve_state(Empty))(
        type("R7", (Room,), {})
    )

    @app.channel("t.rl.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "held"

    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    HOLD.clear()
    HOLDING.clear()
    RESTORES.clear()
    SEEN.clear()


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0,
                      relocation_payload_chunk_limit_bytes=16) as cluster:  # fmt: skip
        yield cluster
    HOLD.set()


def _make(cluster: LocalCluster, spot_id: str, spot_type: str) -> None:
    cluster.node(0).client().spots.get_or_create(spot_id, spot_type).wait(WAIT)


def test_a_relocated_spot_keeps_state_queued_messages_timers_and_generation(cluster, clock):
    n1, n2, n3 = cluster.nodes
    _make(cluster, "room", "t.rl.room")
    c1 = n1.client()
    for _ in range(5):
        c1.send_to_spot("room", Add()).submit()
    c1.send_to_spot("room", Beat()).submit()
    cluster.wait_idle(WAIT)
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["room"]
    generation = act.ref.object_generation
    assert act.gate._flag.acquire(False)  # hold the gate: these wait in the queue
    for _ in range(3):
        c1.send_to_spot("room", Add()).submit()
    queued_total = c1.request_to_spot("room", Total()).future()
    moving = n1._runtime.relocator.start(act, "node-2")
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn runs first (lifecycle lane)
    moving.wait(WAIT)
    assert queued_total.result(WAIT) == 8  # answered by node-2, routed back through node-1
    assert n3.client().request_to_spot("room", Total()).wait(WAIT) == 8
    assert c1.request_to_spot("room", Where()).wait(WAIT) == "node-2"  # a stale route relays
    assert "room" not in n1._runtime.spots and "room" in n2._runtime.spots
    moved = n2._runtime.spots["room"]
    assert moved.ref.object_generation == generation
    assert cluster.store.lookup("room").owner_node == "node-2"
    assert moved.instance.beats == 1
    clock.advance(1.0)  # the logical timer moved too: its sequence goes on
    cluster.wait_idle(WAIT)
    assert moved.instance.beats == 2
    assert n1.counters()["relocated_out"] == 1 and n2.counters()["relocated_in"] == 1


def test_get_or_create_finds_a_spot_that_moved_from_every_node(cluster):
    """Found by a probe: the copy a move made on the target kept an activation completion
    nobody would complete, so ``get_or_create`` of a Spot that had moved waited out its
    deadline on every node (errors.md: ``get_or_create`` is safe to repeat)."""
    _make(cluster, "room", "t.rl.room")
    n1 = cluster.node(0)
    n1.relocate_spot("room", "node-2", timeout=WAIT)
    ref = cluster.node(1)._runtime.spots["room"].ref
    for node in cluster.nodes:
        got = node.client().spots.get_or_create("room", "t.rl.room").timeout(WAIT).wait(WAIT)
        assert (got.created, got.spot_ref) == (False, ref)


def test_recreate_starts_a_fresh_instance_on_the_target(cluster):
    n1, n2, _ = cluster.nodes
    _make(cluster, "fresh", "t.rl.fresh")
    n1.client().send_to_spot("fresh", Add(n=5)).submit()
    cluster.wait_idle(WAIT)
    n1.relocate_spot("fresh", "node-2", timeout=WAIT)
    assert n2.client().request_to_spot("fresh", Total()).wait(WAIT) == 0
    assert n2._runtime.spots["fresh"].instance.initialized


def test_disabled_relocation_is_refused_and_nothing_changes(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "fixed", "t.rl.fixed")
    with pytest.raises(zlink.InvalidOperation, match="disabled"):
        n1.relocate_spot("fixed", "node-2")
    with pytest.raises(zlink.NotFound):
        cluster.node(1).relocate_spot("fixed", "node-3")  # not the owner
    assert n1.client().request_to_spot("fixed", Total()).wait(WAIT) == 0


def test_a_capture_failure_keeps_the_source_authoritative_and_admitting(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "boom", "t.rl.boom")
    with pytest.raises(zlink.StateIncompatible):
        n1.relocate_spot("boom", "node-2", timeout=WAIT)
    n1.client().send_to_spot("boom", Add()).submit()
    assert n1.client().request_to_spot("boom", Total()).wait(WAIT) == 1
    assert cluster.store.lookup("boom").owner_node == "node-1"


def test_a_move_that_cannot_reach_its_barrier_in_time_restores_admission_exactly(cluster):
    """python-api §11: the barrier waits for a suspended continuation; a move whose deadline
    passes first (here the caller's wait, in real seconds: a bounded negative) is withdrawn,
    the seal lifted and admission restored exactly (kotlin-spot-interface)."""
    n1, _, _ = cluster.nodes
    _make(cluster, "room", "t.rl.room")
    slow = n1.client().request_to_spot("room", Slow()).future()  # a Yield in flight
    assert HOLDING.wait(WAIT)  # its call runs, so the Yield was counted before it was sent
    with pytest.raises(zlink.DeadlineExceeded, match="withdrawn"):
        n1.relocate_spot("room", "node-2", timeout=0.05)
    n1.client().send_to_spot("room", Add()).submit()  # admission is back
    HOLD.set()
    assert slow.result(WAIT) == "held"
    assert n1.client().request_to_spot("room", Total()).wait(WAIT) == 1
    assert n1.client().request_to_spot("room", Where()).wait(WAIT) == "node-1"


def test_a_restore_failure_is_retried_on_the_same_target_then_the_move_is_aborted(cluster):
    """kotlin-spot-interface: a restore exception "can be retried with the identical payload
    in the same target process while the target is kept in the sealed state. Another target
    is not selected automatically"; python-api §11: past its retries the move is aborted."""
    n1, n2, n3 = cluster.nodes
    _make(cluster, "stuck", "t.rl.stuck")
    with pytest.raises(zlink.StateIncompatible, match="restore failed 3 times"):
        n1.relocate_spot("stuck", "node-2", timeout=WAIT)
    assert len(RESTORES) == 3  # retried on the same target with the same payload
    assert n2.counters()["relocation_restore_errors"] == 3  # each failure counted once
    assert "stuck" not in n2._runtime.spots  # the half-made copy is forgotten
    assert "stuck" not in n3._runtime.spots
    assert cluster.store.lookup("stuck").owner_node == "node-1"  # no commit happened
    c2 = n2.client()
    c2.send_to_spot("stuck", Add()).submit()  # served on the source again
    assert c2.request_to_spot("stuck", Where()).wait(WAIT) == "node-1"
    assert c2.request_to_spot("stuck", Total()).wait(WAIT) == 1


def test_a_null_capture_is_a_contract_violation_and_the_source_stays(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "null", "t.rl.null")
    with pytest.raises(zlink.StateIncompatible, match="NoneType"):
        n1.relocate_spot("null", "node-2", timeout=WAIT)
    assert cluster.store.lookup("null").owner_node == "node-1"
    n1.client().send_to_spot("null", Add()).submit()
    assert n1.client().request_to_spot("null", Total()).wait(WAIT) == 1


def test_empty_bytes_are_a_valid_preserved_state(cluster):
    n1, n2, _ = cluster.nodes
    _make(cluster, "empty", "t.rl.empty")
    source = n1._runtime.spots["empty"].instance
    n1.relocate_spot("empty", "node-2", timeout=WAIT)
    assert [data for _, data in SEEN] == [b""]
    assert SEEN[0][0] != id(source) and "empty" in n2._runtime.spots


def test_every_restore_attempt_gets_a_fresh_instance_and_a_fresh_copy(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "stuck", "t.rl.stuck")
    source = n1._runtime.spots["stuck"].instance
    with pytest.raises(zlink.StateIncompatible):
        n1.relocate_spot("stuck", "node-2", timeout=WAIT)
    payloads = [data for _, data in SEEN]
    assert len(payloads) == 3 and len({id(d) for d in payloads}) == 3  # a copy each time
    assert payloads[0] == payloads[1] == payloads[2]  # ... of the same payload
    assert id(source) not in {i for i, _ in SEEN}  # never the source's instance


def test_the_payload_travels_in_chunks_no_larger_than_the_limit(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "big", "t.rl.room")
    for _ in range(50):
        n1.client().send_to_spot("big", Add(n=7, sender=1, seq=-1)).submit()
    cluster.wait_idle(WAIT)
    sent: list[dict[str, Any]] = []
    real_send = cluster.transport.send

    def spy(sender: str, node_id: str, channel: Channel, data: bytes) -> bool:
        sent.append(wire.decode(data))
        return real_send(sender, node_id, channel, data)

    cluster.transport.send = spy  # type: ignore[method-assign]
    n1.relocate_spot("big", "node-2", timeout=WAIT)
    chunks = [e.chunk for e in sent if isinstance(e, wire.RelocChunkEnvelope)]
    assert len(chunks) > 3 and all(len(c) <= 16 for c in chunks)  # the fixture's limit: 16
    assert n1.client().request_to_spot("big", Total()).wait(WAIT) == 350


def test_a_move_to_a_node_that_is_not_reachable_is_refused_before_any_seal(cluster):
    n1, _, _ = cluster.nodes
    _make(cluster, "room", "t.rl.room")
    with pytest.raises(zlink.Unavailable, match="not reachable"):
        n1.relocate_spot("room", "node-9", timeout=WAIT)
    n1.client().send_to_spot("room", Add()).submit()
    assert n1.client().request_to_spot("room", Total()).wait(WAIT) == 1


def test_calls_kept_behind_a_lost_fence_go_by_the_store_after_a_request_timeout(cluster, clock):
    n1, _, n3 = cluster.nodes
    _make(cluster, "room", "t.rl.room")
    c3 = n3.client()
    c3.send_to_spot("room", Add()).submit()  # node-3 now routes "room" to node-1
    cluster.wait_idle(WAIT)
    real_send = cluster.transport.send

    def lose_fences(sender: str, node_id: str, channel: Channel, data: bytes) -> bool:
        if not isinstance(wire.decode(data), wire.FenceEnvelope):
            return real_send(sender, node_id, channel, data)
        return True  # taken, and lost

    cluster.transport.send = lose_fences  # type: ignore[method-assign]
    n1.relocate_spot("room", "node-2", timeout=WAIT)
    c3.send_to_spot("room", Add()).submit()  # relayed by node-1; node-3 learns, fences, keeps
    cluster.wait_idle(WAIT)
    c3.send_to_spot("room", Add()).submit()  # kept behind the fence that never comes back
    cluster.wait_idle(WAIT)
    assert n3.counters().get("route_fences", 0) == 1
    clock.advance(20.0)  # the fixture's request timeout
    cluster.wait_idle(WAIT)
    assert n3.counters()["route_fences_lost"] == 1
    assert cluster.node(1).client().request_to_spot("room", Total()).wait(WAIT) == 3


def test_a_fence_that_came_back_leaves_no_deadline_behind(cluster):
    """A route switch's fence, once back, takes its deadline with it: an idle node's
    ``infrastructure_deadlines`` stays at its baseline, not moves x ``request_timeout`` (a growth
    probe saw 980 live deadlines on an idle node after 1,000 moves)."""
    n3 = cluster.node(2)
    _make(cluster, "room", "t.rl.room")
    c3 = n3.client()
    c3.send_to_spot("room", Add()).submit()  # node-3 now routes "room" to node-1
    cluster.wait_idle(WAIT)
    before = n3.status().infrastructure_deadlines
    owner = 0
    for _ in range(6):
        target = (owner + 1) % 3
        cluster.node(owner).relocate_spot("room", f"node-{target + 1}", timeout=WAIT)
        owner = target
        c3.send_to_spot("room", Add()).submit()  # relayed: node-3 learns, fences, switches
        cluster.wait_idle(WAIT)
    assert n3.counters().get("route_fences", 0) >= 2
    assert n3.status().infrastructure_deadlines == before
    assert cluster.node(owner).client().request_to_spot("room", Total()).wait(WAIT) == 7


def test_moving_back_and_forth_under_load_refuses_loses_doubles_and_reorders_nothing(cluster):
    _make(cluster, "busy", "t.rl.room")
    sent = [0, 0, 0]
    stop = threading.Event()

    def sender(k: int) -> None:  # one sender on each node, owners and targets included
        client = cluster.node(k).client()
        seq = 0
        while not stop.is_set() and seq < 20_000:
            client.send_to_spot("busy", Add(sender=k, seq=seq)).submit()  # never refused
            seq += 1
            if seq % 50 == 0:  # a request behind them paces the sender (lanes stay short)
                assert client.request_to_spot("busy", Total()).wait(WAIT) >= seq
            if seq == 50:
                started.release()
        sent[k] = seq

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(3)]
    started = threading.Semaphore(0)
    for t in threads:
        t.start()
    for _ in threads:
        assert started.acquire(timeout=WAIT)  # every sender is sending while the Spot moves
    owner = 0
    for _ in range(20):
        target = (owner + 1) % 3
        cluster.node(owner).relocate_spot("busy", f"node-{target + 1}", timeout=WAIT)
        owner = target
    stop.set()
    for t in threads:
        t.join(WAIT)
    cluster.wait_idle(WAIT)
    room = cluster.node(owner)._runtime.spots["busy"].instance
    assert room.total == sum(sent)
    for k in range(3):  # every message of every sender arrived exactly once, in order
        assert room.seen[str(k)] == list(range(sent[k])), k
    assert room.disorder == 0
    counters = [n.counters() for n in cluster.nodes]
    assert sum(c.get("relocated_out", 0) for c in counters) == 20
    print({k: sum(c.get(k, 0) for c in counters) for k in ("relayed_calls", "route_fences")})


def test_a_node_keeps_a_bounded_number_of_forwarding_pointers(cluster, monkeypatch):
    from zlink.runtime import routing as router_module

    monkeypatch.setattr(router_module, "MAX_POINTERS", 2)
    n1 = cluster.node(0)
    for name in ("p1", "p2", "p3"):
        _make(cluster, name, "t.rl.room")
        n1.relocate_spot(name, "node-2", timeout=WAIT)
    assert n1.counters()["pointers_dropped"] == 1
    for name in ("p1", "p2", "p3"):  # all still reached through node-1: pointer or store
        n1.client().send_to_spot(name, Add()).submit()
        assert n1.client().request_to_spot(name, Total()).wait(WAIT) == 1


def test_a_node_keeps_a_bounded_route_cache_the_least_recently_used_dropped_first(
    cluster, clock, monkeypatch
):
    """A node that calls a million short-lived rooms on other nodes keeps at most
    ``MAX_ROUTES`` routes (a growth probe saw one per remote target ever called, closed ones
    too, forever); the one dropped is the one used least recently, and a call for it asks
    the store again."""
    from zlink.runtime import routing as router_module

    monkeypatch.setattr(router_module, "MAX_ROUTES", 2)
    n1, _, n3 = cluster.nodes
    c3 = n3.client()
    for name in ("p1", "p2", "p3", "p4"):
        _make(cluster, name, "t.rl.room")  # on node-1
    for name in ("p1", "p2", "p1", "p3"):  # p1 used again: p2 is the least recent
        if name == "p3":  # none used for two timeouts: now one may go (none went before)
            assert sorted(n3._runtime.router._routes) == ["p1", "p2"]
            rt = n3._runtime
            clock.advance(2 * max(rt.request_timeout, rt.admission_timeout) + 1)
        c3.send_to_spot(name, Add()).submit()
        cluster.wait_idle(WAIT)  # (each one's route learned before the next send)
    assert sorted(n3._runtime.router._routes) == ["p1", "p3"]
    assert n3.counters()["routes_dropped"] == 1
    c3.send_to_spot("p4", Add()).submit()  # p1 unused since before the wait: it goes
    cluster.wait_idle(WAIT)
    c3.send_to_spot("p2", Add()).submit()  # asked of the store again
    cluster.wait_idle(WAIT)
    totals = [n1.client().request_to_spot(p, Total()).wait(WAIT) for p in ("p1", "p2", "p3", "p4")]
    assert totals == [2, 2, 1, 1]
    # past the bound, but each used just now: they stay (the bound is soft, see _remember)
    assert sorted(n3._runtime.router._routes) == ["p2", "p3", "p4"]


def test_a_route_used_lately_is_not_dropped_so_no_later_call_overtakes_an_earlier_one(
    monkeypatch,
):
    """A review: with the route cache full, a route used a moment ago was dropped, and the
    sender's next call, sent where the store said, overtook the one before it still being
    relayed along the old path (python-api §9). A route goes only once no call used it for
    two request timeouts."""
    from zlink.runtime import routing as router_module

    monkeypatch.setattr(router_module, "MAX_ROUTES", 2)
    clock = ManualClock()
    with LocalCluster(
        build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0
    ) as cluster:
        n1, n2, n3 = cluster.nodes
        n1.client().spots.get_or_create("room", "t.rl.room").wait(WAIT)
        for name in ("p1", "p2"):
            n2.client().spots.get_or_create(name, "t.rl.room").wait(WAIT)
        c3 = n3.client()
        c3.send_to_spot("room", Add(sender=3, seq=0)).submit()  # node-3 routes room -> node-1
        cluster.wait_idle(WAIT)
        n1.relocate_spot("room", "node-2", timeout=WAIT)  # node-3 does not know yet
        cluster.wait_idle(WAIT)

        gate = threading.Event()
        n1._runtime.infra.submit(lambda: gate.wait(WAIT))  # node-1 is slow to relay
        c3.send_to_spot("room", Add(sender=3, seq=1)).submit()  # along the old path (node-1)
        run_until_idle(n3, WAIT)
        for name in ("p1", "p2"):  # two other targets: "room" is the least recent, dropped
            c3.send_to_spot(name, Add()).submit()
            run_until_idle(n3, WAIT)
        assert sorted(n3._runtime.router._routes) == ["p1", "p2", "room"]  # over, and kept
        c3.send_to_spot("room", Add(sender=3, seq=2)).submit()  # the store says node-2
        run_until_idle(n3, WAIT)
        run_until_idle(n2, WAIT)
        gate.set()
        cluster.wait_idle(WAIT)
        seen = n2._runtime.spots["room"].instance.seen["3"]
        assert seen == [0, 1, 2]
        assert "routes_dropped" not in n3.counters()
        rt = n3._runtime
        clock.advance(2 * max(rt.request_timeout, rt.admission_timeout) + 1)  # now they may go
        c3.send_to_spot("p1", Add()).submit()  # p1 used again
        n2.client().spots.get_or_create("p3", "t.rl.room").wait(WAIT)
        c3.send_to_spot("p3", Add()).submit()  # a new route: the oldest unused ones go
        cluster.wait_idle(WAIT)
        assert n3.counters()["routes_dropped"] >= 1
        assert len(n3._runtime.router._routes) <= 2


def test_a_moved_queue_larger_than_the_targets_lane_is_refilled_whole(clock):
    """A queue admitted on the source is never refused by the target's smaller lane (nothing
    accepted is lost, §7); the target takes it past its limit and admits nothing new until it
    is below it again."""
    from zlink.mesh.location import InMemoryLocationStore
    from zlink.mesh.transport import InProcessTransport

    store, transport = InMemoryLocationStore(), InProcessTransport()
    nodes = [
        zlink.Node(build_app(), zlink.NodeConfig(node_id=f"node-{i}", workers=2, **extra),
                   clock=clock, store=store, transport=transport)
        for i, extra in ((1, {}), (2, {"app_lane_items": 4}))
    ]  # fmt: skip
    try:
        n1, n2 = (node.start() for node in nodes)
        n1.client().spots.get_or_create("room", "t.rl.room").wait(WAIT)
        run_until_idle(n1, WAIT)  # the activation's last turn settles first
        act = n1._runtime.spots["room"]
        assert act.gate._flag.acquire(False)  # hold the gate: these wait in the queue
        c1 = n1.client()
        for _ in range(10):
            c1.send_to_spot("room", Add()).submit()
        moving = n1._runtime.relocator.start(act, "node-2")
        n1._runtime.pool.submit(act.gate._run)
        moving.wait(WAIT)
        run_until_idle(n2, WAIT)  # over its limit, the lane admits nothing new until drained
        assert n2.client().request_to_spot("room", Total()).timeout(WAIT).wait(WAIT) == 10
        assert n2.counters()["moved_past_lane_limit"] == 1
        run_until_idle(n2, WAIT)  # the reply is set before its turn gives its reservation back
        lanes = n2._runtime.spots["room"].owner.lanes
        assert lanes.reserved()[0] == 0  # every reservation was returned
    finally:
        for node in nodes:
            node.shutdown(WAIT)
