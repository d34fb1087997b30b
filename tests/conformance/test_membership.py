"""Node registration and leases in the Location Store (python-api §10; issue "The runtime,
composed", item 5): the store is the membership table, each registration a new incarnation,
each lease renewed from the deadline heap, on the store's thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, refuse_renewals, until
from zlink.errors import Unavailable
from zlink.executor import InfraExecutor
from zlink.testing import LocalCluster, ManualClock


class Ping(zlink.Request[str], type_name="t.mb.ping"):
    pass


class Add(zlink.Message, type_name="t.mb.add"):
    seq: int


class Block(zlink.Message, type_name="t.mb.block"):
    pass


class Seen(zlink.Request[list[int]], type_name="t.mb.seen"):
    pass


GATE = threading.Event()


def _app() -> zlink.App:
    app = zlink.App("membership")

    @app.user_spot("t.mb.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[int] = []

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "pong"

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.seen.append(msg.seq)

        @zlink.handler
        def block(self, msg: Block) -> None:
            assert GATE.wait(WAIT)

        @zlink.handler
        def get_seen(self, req: Seen) -> list[int]:
            return self.seen

    return app


def test_every_node_registers_with_an_incarnation_of_its_own(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=3, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        records = cluster.store.nodes()
        assert [r.node_id for r in records] == ["node-1", "node-2", "node-3"]
        assert len({r.incarnation for r in records}) == 3
        assert all(r.endpoint == f"inproc://{r.node_id}" for r in records)
        assert all(r.lease_until == clock.now() + 3.0 for r in records)
    assert cluster.store.nodes() == []  # each node unregistered at shutdown


def test_the_lease_is_renewed_about_three_times_per_lease(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)
        renewed = threading.Event()
        real = cluster.store.renew_node

        def spy(*args: object) -> object:
            try:
                return real(*args)  # type: ignore[arg-type]
            finally:
                renewed.set()

        cluster.store.renew_node = spy  # type: ignore[method-assign]
        clock.advance(0.9)
        assert not renewed.is_set()  # not before a third of the lease
        for n in range(1, 4):
            renewed.clear()
            clock.advance(1.0)  # each third of the lease
            assert renewed.wait(WAIT)
            _wait_counter(node, "lease_renewals", n)
        (record,) = cluster.store.nodes()
        assert record.lease_until == clock.now() + 3.0  # measured from the last renewal


def test_a_refused_renewal_is_counted_and_tried_again_sooner(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)

        def refuse(*args: object) -> object:
            raise Unavailable("the store is down")

        cluster.store.renew_node = refuse  # type: ignore[method-assign]
        clock.advance(1.0)
        _wait_counter(node, "lease_renewals_failed", 1)
        clock.advance(0.5)  # a sixth of the lease later: again
        _wait_counter(node, "lease_renewals_failed", 2)


def test_a_node_registered_again_gets_a_higher_incarnation(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1) as cluster:
        (first,) = cluster.store.nodes()
        again = cluster.store.register_node("node-1", "inproc://node-1", 3.0)
        assert again.incarnation > first.incarnation
        with pytest.raises(Unavailable):  # the old incarnation's renewal is refused
            cluster.store.renew_node("node-1", first.incarnation, 3.0)


def test_drain_moves_only_to_members_the_store_knows(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("r", "t.mb.room").wait(WAIT)
        record = next(r for r in cluster.store.nodes() if r.node_id == "node-2")
        cluster.store.unregister_node("node-2", record.incarnation)  # connected, not a member
        result = n1.drain(timeout=WAIT)
        assert result.moved == [] and "r" in result.stayed
        assert n2.client().request_to_spot("r", Ping()).wait(WAIT) == "pong"  # still on n1


def test_a_node_that_cannot_renew_fences_itself_before_its_lease_lapses(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """python-api §10 "Failure": a node with no renewal confirmed stops serving (drops its
    Spots, refuses calls) before its lease can have lapsed by the store's clock, then
    registers again as a new incarnation; its Spot is re-homed (new generation) on its next
    call."""
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1, n2 = cluster.nodes
        made = n1.client().spots.get_or_create("r", "t.mb.room").wait(WAIT)
        old = n1.incarnation
        (lease_end,) = [r.lease_until for r in cluster.store.nodes() if r.node_id == "node-1"]
        refuse_renewals(cluster.store, "node-1")
        while not n1.counters().get("self_fenced"):
            assert clock.now() < lease_end, "n1 still served when its lease could have lapsed"
            clock.advance(0.25)  # a quarter of a renewal period: each renewal is handled
            cluster.wait_idle(WAIT)
        assert n1.counters()["activations_dropped_fenced"] == 1
        _wait_counter(n1, "registrations_again", 1)
        assert n1.incarnation > old
        assert "r" not in n1._runtime.spots
        cluster.wait_idle(WAIT)  # it met its peers anew and serves again
        status = n1.status()
        assert (status.incarnation, status.fenced) == (n1.incarnation, False)
        with pytest.raises(zlink.Unavailable, match="earlier incarnation of node node-1"):
            n2.client().request_to_spot("r", Ping()).wait(WAIT)  # its old lease still holds
        while clock.now() <= lease_end:  # the old incarnation's lease ends: "r" can move
            clock.advance(0.25)
            cluster.wait_idle(WAIT)
        with caplog.at_level(logging.INFO, logger="zlink"):
            rehomed = n2.client().request_to_spot("r", Ping()).wait(WAIT)
        assert rehomed == "pong"
        assert "its owner 'node-1' lost its lease" in caplog.text  # the one whose it was
        found = cluster.store.lookup("r")
        assert found is not None and found.owner_live
        assert found.object_generation > made.spot_ref.object_generation
        assert found.authority_generation == 2


def test_a_renewal_the_store_refuses_fences_at_once(clock: ManualClock) -> None:
    """A store that no longer knows this incarnation (it was declared dead, or the store lost
    its data) refuses the renewal: the node fences at once and registers again."""
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)
        node.client().spots.get_or_create("r", "t.mb.room").wait(WAIT)
        old = node.incarnation
        assert cluster.store.unregister_node("node-1", old)
        clock.advance(1.0)  # the next renewal: refused
        _wait_counter(node, "registrations_again", 1)
        counters = node.counters()
        assert counters["lease_renewals_refused"] == 1 and counters["self_fenced"] == 1
        assert node.incarnation > old
        cluster.wait_idle(WAIT)  # it met its peers anew (none here) and serves again
        assert not node.status().fenced
        again = node.client().request_to_spot("r", Ping()).wait(WAIT)  # re-homed here
        assert again == "pong" and node.counters()["spots_rehomed"] == 1


def test_lease_seconds_is_a_validated_duration() -> None:
    for bad in (0, -1.0, float("inf"), float("nan"), 1e8):
        with pytest.raises(zlink.InvalidArgument):
            zlink.NodeConfig(lease_seconds=bad)


def _wait_counter(node: zlink.Node, name: str, at_least: int, infra: bool = True) -> None:
    """Wait, a pass of the lease thread then one of the infrastructure thread at a time (no
    sleeping), for a store call's outcome to be counted where it is handled: a pass queued
    on a thread runs after what was queued there before it (the manual clock's ``advance``
    queues what fell due before it returns). ``infra=False``: the lease thread's only (the
    infrastructure thread is held)."""
    for _ in range(200):  # bounded: each round is one pass of each queue
        if node.counters().get(name, 0) >= at_least:
            return
        for thread in (node._lease_worker, node._infra) if infra else (node._lease_worker,):
            _pass(thread)
    raise AssertionError(f"{name} stayed below {at_least}: {node.counters()}")


def _pass(thread: InfraExecutor | None) -> None:
    """Wait until ``thread`` ran what was queued on it so far."""
    assert thread is not None
    passed = threading.Event()
    thread.submit(passed.set)
    assert passed.wait(WAIT)


def test_leases_are_judged_on_a_clock_that_counts_a_suspended_host() -> None:
    """A real node judges its lease on CLOCK_BOOTTIME where the system has it (time a
    suspended host or paused VM slept counts, as it does on the store's clock); a test's
    manual clock is used as it is."""
    import time

    from zlink.executor import MonotonicClock
    from zlink.mesh.membership import lease_clock

    manual = ManualClock()
    assert lease_clock(manual)() == manual.now()
    real = lease_clock(MonotonicClock())
    if hasattr(time, "CLOCK_BOOTTIME"):
        assert abs(real() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
    else:
        assert abs(real() - time.monotonic()) < 1.0


def test_a_second_process_with_the_same_node_id_supersedes_the_first_for_good(
    clock: ManualClock,
) -> None:
    """A service probe: two ``zlink run`` with one ``--node-id`` on one store took the lease
    from each other every renewal, for ever (each fenced, registered again, and fenced the
    other), dropping their Spots each time. The newer registration wins: the older one,
    refused, finds a newer live incarnation of its own id and stops serving for good
    (``superseded``, its health says so), while the newer one serves on undisturbed."""
    from zlink.mesh.location import InMemoryLocationStore
    from zlink.mesh.transport import InProcessTransport

    store = InMemoryLocationStore(clock)
    config = zlink.NodeConfig(node_id="n1", workers=1, lease_seconds=3.0)
    first = zlink.Node(_app(), config, clock=clock, store=store, transport=InProcessTransport())
    second = zlink.Node(_app(), config, clock=clock, store=store, transport=InProcessTransport())
    try:
        first.start()
        second.start()  # the same id: a newer incarnation
        clock.advance(1.0)  # the renewals, a third of a lease on: the first is refused
        _wait_counter(second, "lease_renewals", 1)
        _wait_counter(first, "superseded", 1)
        assert first.superseded.is_set()
        assert (first.not_serving() or "").startswith("superseded")
        for n in range(2, 5):  # the second renews on, undisturbed
            clock.advance(1.0)
            _wait_counter(second, "lease_renewals", n)
        assert "self_fenced" not in second.counters()  # never disturbed again
        assert first.counters().get("registrations_again", 0) == 0
        assert [(r.node_id, r.incarnation) for r in store.nodes()] == [("n1", second.incarnation)]
    finally:
        second.shutdown(WAIT)
        first.shutdown(WAIT)


def test_the_rows_a_dead_node_left_go_after_the_retention(clock: ManualClock) -> None:
    """Retention (python-api §10 "Failure"; Orleans cleans up defunct silos): a node that
    died leaves its rows in the store; once its lease lapsed ``store_retention`` seconds ago
    the live nodes' sweep deletes them (a durable first record stays), and its node row.
    A call for such a Spot then finds nothing (it was not re-homed meanwhile)."""
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0,
                      store_retention=60.0) as cluster:  # fmt: skip
        store = cluster.store
        n1 = cluster.node(0)
        n1.client().spots.get_or_create("mine", "t.mb.room").wait(WAIT)
        ghost = store.register_node("ghost", "inproc://ghost", 3.0)  # it dies at once
        for spot in ("g-1", "g-2"):
            store.reserve(spot, "spot", "t.mb.room", "ghost", ghost.incarnation)
        store.reserve("g-3", "spot", "t.mb.room", "ghost", ghost.incarnation, ("t.mb.ping", "{}"))
        start = clock.now()
        while clock.now() < start + 3.0 + 60.0 + 20.0:  # its lapse, the retention, a sweep
            clock.advance(0.5)  # the live nodes renew all along
            cluster.wait_idle(WAIT)
        assert n1.counters().get("store_rows_pruned") == 2  # the first live node by id
        assert not cluster.node(1).counters().get("store_rows_pruned")  # sweeps: one a mesh
        assert store.lookup("g-1") is None and store.lookup("g-2") is None
        assert store.lookup("g-3") is not None  # an accepted message waits in it
        assert store.lookup("mine") is not None and store.lookup("mine").owner_live
        assert sum(n.counters().get("store_nodes_pruned", 0) for n in cluster.nodes) == 1
        with pytest.raises(zlink.NotFound):
            n1.client().request_to_spot("g-1", Ping()).wait(WAIT)
        assert n1.client().request_to_spot("mine", Ping()).wait(WAIT) == "pong"


def test_sends_a_peer_held_for_a_node_that_fenced_itself_are_handled_or_counted(
    clock: ManualClock,
) -> None:
    """A probe of moves under load saw a node fence itself (its infrastructure thread was
    late to renew) and 1,290 sends its senders had been told were accepted vanish: neither
    handled nor counted. The peer had paused the node's DATA (python-api §9); the frames it
    held went with the node's old incarnation, and the in-process transport dropped them
    telling nobody. Each is counted now where it was sent (``sends_dropped_peer_gone``), as
    the ZeroMQ transport counts DATA its session ended with (python-api §9: every drop is
    counted with its reason)."""
    GATE.clear()
    with LocalCluster(_app(), nodes=2, clock=clock, workers=2, lease_seconds=3.0,
                      app_lane_items=4, peer_backlog_items=8) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        n2.client().spots.get_or_create("r", "t.mb.room").wait(WAIT)
        c1 = n1.client()
        c1.send_to_spot("r", Block()).wait(WAIT)
        sent = [c1.send_to_spot("r", Add(seq=s)).future() for s in range(20)]
        until(lambda: "node-1" in n2.status().paused_peers, "node-2 to pause node-1")
        sent += [c1.send_to_spot("r", Add(seq=s)).future() for s in range(20, 40)]
        for future in sent:  # each accepted: handed to the mesh (held by node-2's pause)
            assert future.result(WAIT) is None
        old = n1.incarnation
        assert cluster.store.unregister_node("node-1", old)
        clock.advance(1.0)  # node-1's next renewal is refused: it fences itself
        _wait_counter(n1, "registrations_again", 1)
        GATE.set()
        cluster.wait_idle(WAIT)
        seen = n2.client().request_to_spot("r", Seen()).wait(WAIT)
        dropped = sum(v for k, v in n1.counters().items() if k.startswith("sends_dropped_"))
        assert seen == sorted(seen) and len(seen) + dropped == 40, (len(seen), dropped)


def _hold_infra(node: zlink.Node) -> threading.Event:
    """Occupy ``node``'s infrastructure thread with one long task (as one burst of delivery
    did under load) until the returned event is set."""
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        assert release.wait(2 * WAIT)

    node._infra.submit(hold)
    assert busy.wait(WAIT)
    return release


def _lease_until(cluster: LocalCluster, node_id: str) -> float:
    return next(r.lease_until for r in cluster.store.nodes() if r.node_id == node_id)


def test_a_long_infrastructure_task_neither_stops_renewals_nor_fences_the_node(
    clock: ManualClock,
) -> None:
    """A stress probe of moves (3 in-process nodes, lanes of 4) saw nodes fence themselves
    with their lease intact in the store's eyes: one delivery burst held the infrastructure
    thread for 1.5-2.4 s, the renewal was due behind it, and the fence deadline came first.
    The lease is kept by a thread of its own (python-api §10 "Failure"): a task of up to a
    lease on the infrastructure thread delays no renewal, and the node serves on."""
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)
        node.client().spots.get_or_create("r", "t.mb.room").wait(WAIT)
        incarnation = node.incarnation
        release = _hold_infra(node)
        try:
            for n in (1, 2):  # two renewals' worth of time, the infrastructure thread held
                clock.advance(1.0)
                _wait_counter(node, "lease_renewals", n, infra=False)  # (the next is queued)
                assert _lease_until(cluster, "node-1") == clock.now() + 3.0
        finally:
            release.set()
        clock.advance(0.5)  # past the fence deadline the registration alone gave (2.4 s)
        cluster.wait_idle(WAIT)
        counters = node.counters()
        assert counters.get("self_fenced", 0) == 0 and node.incarnation == incarnation
        assert counters["lease_renewals"] >= 2 and not node.status().fenced
        assert node.client().request_to_spot("r", Ping()).wait(WAIT) == "pong"
        assert node.counters().get("activations_dropped_fenced", 0) == 0


def test_an_infrastructure_thread_stuck_for_a_lease_lets_the_lease_lapse(
    clock: ManualClock,
) -> None:
    """The other side of the above: a node whose infrastructure thread has been inside one
    task for a whole lease serves nothing from other nodes, so its lease is not renewed
    (``lease_renewals_withheld``) while that lasts: the store's lease lapses as it would for
    a stopped process, and once the thread comes back the node fences itself (python-api
    §10). (A thread back before the store's lease ended renews it, and the node serves on.)"""
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)
        release = _hold_infra(node)
        try:
            for n in (1, 2):
                clock.advance(1.0)
                _wait_counter(node, "lease_renewals", n, infra=False)
            for step, withheld in ((1.0, 1), (1.0, 2), (1.5, 3)):  # a lease into the task
                clock.advance(step)
                _wait_counter(node, "lease_renewals_withheld", withheld, infra=False)
            assert [r.node_id for r in cluster.store.nodes()] == []  # its lease lapsed
            assert node.counters().get("self_fenced", 0) == 0  # (the fence is this thread's)
        finally:
            release.set()
        _wait_counter(node, "self_fenced", 1)


def test_two_long_infrastructure_tasks_in_one_batch_do_not_fence_the_node(
    clock: ManualClock,
) -> None:
    """Found by review: the stall that withholds renewals was timed per batch of tasks, not
    per task, so two delivery bursts of 2.4 s each (each shorter than the lease) taken in one
    batch withheld renewals and the node fenced itself while the store held its lease."""
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        node = cluster.node(0)
        first = _hold_infra(node)  # the two below queue behind it, to be taken as one batch
        running, release = [threading.Event(), threading.Event()], [first]

        def burst(i: int) -> None:
            running[i].set()
            assert release[i + 1].wait(4 * WAIT)

        release += [threading.Event(), threading.Event()]
        node._infra.submit(burst, 0)
        node._infra.submit(burst, 1)
        try:
            first.set()
            for i in (0, 1):
                assert running[i].wait(WAIT)
                for _ in range(12):  # each burst takes 2.4 s of the clock, in steps of 0.2 s
                    clock.advance(0.2)
                    _pass(node._lease_worker)  # (what fell due on it ran)
                release[i + 1].set()
        finally:
            for event in release:
                event.set()
        cluster.wait_idle(WAIT)
        counters = node.counters()
        assert counters.get("lease_renewals_withheld", 0) == 0
        assert counters.get("self_fenced", 0) == 0 and not node.status().fenced


def test_a_stopped_node_is_idle_after_its_next_renewal_falls_due(clock: ManualClock) -> None:
    """Found by review: a stopped node's lease thread kept its next renewal on its heap; the
    clock's jump made it ready work no thread would run, and the node's ``wait_idle`` (which
    ``LocalCluster.wait_idle`` asks of every node) timed out."""
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1 = cluster.node(0)
        n1.shutdown(WAIT)
        clock.advance(1.0)  # its renewal would have fallen due
        assert n1.wait_idle(WAIT)
        cluster.wait_idle(WAIT)


def test_a_registration_again_that_a_shutdown_overtakes_is_unregistered(clock: ManualClock) -> None:
    """Found by review: a node that fenced itself was registering again on its lease thread
    when its shutdown began; ``leave`` waited for it but, the node being fenced, unregistered
    nothing, and the new incarnation stayed a live member of the store after the node had
    stopped (its peers would later take it for a crash)."""
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1 = cluster.node(0)
        membership, store = n1._membership, cluster.store
        assert membership is not None
        real = store.register_node
        entered = threading.Event()

        def register_node(node_id: str, *args: Any) -> Any:
            if node_id == "node-1":
                entered.set()
                until(lambda: membership._stopped, "the shutdown to begin")
            return real(node_id, *args)

        store.register_node = register_node  # type: ignore[method-assign]
        assert store.unregister_node("node-1", n1.incarnation)
        clock.advance(1.0)  # the renewal is refused: it fences itself and registers again
        assert entered.wait(WAIT)
        n1.shutdown(2 * WAIT)
        assert [r.node_id for r in store.nodes()] == ["node-2"]


@pytest.mark.parametrize("draining", [False, True])
def test_a_node_fenced_twice_before_it_serves_again_serves_as_it_did_before(
    make_node: Any, draining: bool
) -> None:
    """Found by an audit: a node fences itself by draining (it refuses calls), keeping whether
    it drained before, to restore once it registers again. Fenced a second time before it
    served again (a rejoin too slow, or refused), it kept "draining" as what it did before,
    and so stayed draining for good: it refused every call, its timers never fired again."""
    from zlink.node import _MeshEvents

    node = make_node(_app())
    rt = node._runtime
    rt.draining = draining
    events = _MeshEvents(node)
    events.fenced("the first lease lapsed")
    events.fenced("the second registration came too late")  # before it served again
    events.rejoined(3, [])  # (no transport, no membership here: it serves at once)
    assert (rt.fenced, rt.draining) == (False, draining)


def test_a_store_that_keeps_refusing_a_registration_is_not_logged_at_every_try(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's probe: while the store was down, a fenced node logged "could not
    register again" at WARNING every sixth of a lease (7,200 lines an hour at a 3 s lease).
    It says so at the 1st, 2nd, 4th, 8th, ... failed try in a row (the rest at DEBUG), each
    line with its count; ``registrations_failed`` counts every one."""
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1 = cluster.node(0)
        store = cluster.store
        real = store.register_node

        def register_node(node_id: str, *args: Any) -> Any:
            if node_id == "node-1":
                raise Unavailable("the location store is down")
            return real(node_id, *args)

        store.register_node = register_node  # type: ignore[method-assign]
        caplog.set_level(logging.WARNING, logger="zlink.mesh")
        assert store.unregister_node("node-1", n1.incarnation)
        clock.advance(1.0)  # its renewal is refused: it fences itself and registers again
        for tries in range(1, 10):
            if tries > 1:
                clock.advance(0.5)  # (a retry every sixth of the lease)
            until(lambda t=tries: n1.counters().get("registrations_failed", 0) >= t,
                  f"try {tries}")  # fmt: skip
        said = [r.getMessage() for r in caplog.records if "could not register" in r.message]
        assert len(said) == 4, said  # of 9 tries
        assert [line.split("(")[1].split(" ")[0] for line in said] == ["1", "2", "4", "8"], said
        store.register_node = real  # type: ignore[method-assign]
