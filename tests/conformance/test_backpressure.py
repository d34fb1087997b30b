"""Waiting for room (python-api §9; seed §1 "outbound admission waiters", §5 completion timing).

``send.submit()`` stays fail-fast; ``send.wait()``, ``send.future()``, ``await send`` and every
request / create terminal wait for room in a full lane, first come first served per target,
with a bounded number of waiters; a wait that ends without room leaves nothing queued.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Bump(zlink.Message, type_name="t.bp.bump"):
    sender: int
    n: int


class Block(zlink.Message, type_name="t.bp.block"):
    pass


class Seen(zlink.Request[list[list[int]]], type_name="t.bp.seen"):
    pass


class SendToSelf(zlink.Request[str], type_name="t.bp.self"):
    pass


class Forward(zlink.Request[str], type_name="t.bp.forward"):
    target: str
    n: int


GATE = threading.Event()
BLOCKING = threading.Event()


def build_app() -> zlink.App:
    app = zlink.App("backpressure")

    @app.user_spot("t.bp.hot", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Hot(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[list[int]] = []

        @zlink.handler
        def bump(self, msg: Bump) -> None:
            self.seen.append([msg.sender, msg.n])

        @zlink.handler
        def block(self, msg: Block) -> None:
            BLOCKING.set()
            assert GATE.wait(WAIT)

        @zlink.handler
        def get_seen(self, req: Seen) -> list[list[int]]:
            return self.seen

        @zlink.handler
        async def to_self(self, req: SendToSelf) -> str:
            me = self.context.spot_id
            try:
                await self.context.outbound.send_to_spot(me, Bump(sender=9, n=0))
            except zlink.InvalidOperation as exc:
                return f"refused: {exc}"
            return "sent"

        @zlink.handler
        async def forward(self, req: Forward) -> str:
            await self.context.outbound.send_to_spot(req.target, Bump(sender=7, n=req.n))
            return "admitted"

    @app.entry_spot("t.bp.lobby", actor="t.bp.player")
    class Lobby(zlink.EntrySpot):
        def on_create_actor(self, actor: zlink.Actor, request: Any) -> None:
            if isinstance(request, Block):  # holds the lobby while its lane fills up
                BLOCKING.set()
                assert GATE.wait(WAIT)

    @app.actor("t.bp.player")
    class Player(zlink.Actor):
        @zlink.handler
        def bump(self, msg: Bump) -> None:
            pass

    return app


@pytest.fixture(autouse=True)
def _reset() -> Any:
    GATE.clear()
    BLOCKING.clear()
    yield
    GATE.set()


def _blocked(node: zlink.Node, spot: str = "hot") -> zlink.Client:
    """``spot`` made, and its gate held by a running handler (its lane then fills up)."""
    client = node.client()
    client.spots.get_or_create(spot, "t.bp.hot").wait(WAIT)
    client.send_to_spot(spot, Block()).submit()
    assert BLOCKING.wait(WAIT)
    return client


def _fill(client: zlink.Client, spot: str = "hot") -> int:
    """Queue plain sends until the lane refuses one; returns how many went in."""
    n = 0
    while True:
        try:
            client.send_to_spot(spot, Bump(sender=0, n=n)).submit()
        except zlink.ResourceExhausted:
            return n
        n += 1


def test_four_senders_waiting_for_room_lose_nothing_and_keep_their_order(make_node):
    node = make_node(build_app(), app_lane_items=8)
    client = node.client()
    client.spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
    errors: list[BaseException] = []

    def produce(sender: int) -> None:
        try:
            for n in range(400):
                client.send_to_spot("hot", Bump(sender=sender, n=n)).wait(WAIT)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    assert not errors
    assert node.wait_idle(WAIT)
    seen = client.request_to_spot("hot", Seen()).wait(WAIT)
    for sender in range(4):
        assert [n for s, n in seen if s == sender] == list(range(400))  # once each, in order
    assert node.counters().get("rejected_admissions", 0) == 0  # (whether any waited: load)


def test_submit_stays_fail_fast_and_a_wait_without_room_queues_nothing(make_node):
    node = make_node(build_app(), app_lane_items=4)
    client = _blocked(node)
    queued = _fill(client)
    with pytest.raises(zlink.DeadlineExceeded):
        client.send_to_spot("hot", Bump(sender=1, n=0)).wait(0.05)
    GATE.set()
    assert node.wait_idle(WAIT)
    seen = client.request_to_spot("hot", Seen()).wait(WAIT)
    assert [s for s, _ in seen] == [0] * queued  # the timed-out send never ran
    assert node._runtime.spots["hot"].owner.lanes.waiting() == 0


def test_the_admission_deadline_runs_on_the_node_clock(make_node, clock: ManualClock):
    node = make_node(build_app(), app_lane_items=4, admission_timeout=2.0)
    client = _blocked(node)
    _fill(client)
    waiting = client.send_to_spot("hot", Bump(sender=1, n=0)).future()
    clock.advance(1.9)
    assert node.wait_idle(WAIT, busy=1) and not waiting.done()
    clock.advance(0.2)
    with pytest.raises(zlink.DeadlineExceeded, match="no room"):
        waiting.result(WAIT)
    GATE.set()
    assert node.wait_idle(WAIT)
    assert [1, 0] not in client.request_to_spot("hot", Seen()).wait(WAIT)


def test_waiters_are_bounded_and_served_first_come_first_served(make_node):
    node = make_node(build_app(), app_lane_items=4, admission_waiters=3)
    client = _blocked(node)
    queued = _fill(client)
    waits = [client.send_to_spot("hot", Bump(sender=1, n=n)).future() for n in range(3)]
    with pytest.raises(zlink.ResourceExhausted, match="wait for room"):
        client.send_to_spot("hot", Bump(sender=1, n=3)).future()
    with pytest.raises(zlink.ResourceExhausted):  # the room is theirs: no overtaking
        client.send_to_spot("hot", Bump(sender=2, n=0)).submit()
    lanes = node._runtime.spots["hot"].owner.lanes
    assert lanes.waiting() == 3
    (hot,) = [o for o in node.status().owners if o.owner == "hot"]
    assert (hot.waiters, hot.waited, hot.refused) == (3, 3, 3)  # status shows them (§9)
    GATE.set()
    for w in waits:
        assert w.result(WAIT) is None
    assert node.wait_idle(WAIT)
    seen = client.request_to_spot("hot", Seen()).wait(WAIT)
    assert seen == [[0, n] for n in range(queued)] + [[1, 0], [1, 1], [1, 2]]
    assert lanes.refused >= 3  # _fill's last try, the 4th waiter and the overtaking submit


def test_calls_from_peers_waiting_for_room_do_not_crowd_out_a_caller_here(clock: ManualClock):
    """Calls from other nodes that wait for room are bounded by their peer's backlog (which
    pauses that peer), not by ``admission_waiters``. Before, they counted against it all the
    same: a probe's one sender thread, whose ``wait()`` had never been refused, got
    ``ResourceExhausted`` ("1024 callers already wait for room") after a move had relayed a
    lane's worth of parked calls to the Spot's new node (python-api §9)."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, app_lane_items=2,
                      admission_waiters=2, peer_backlog_items=64) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        c1 = _blocked(n1)
        queued = _fill(c1)
        from_peer = [n2.client().send_to_spot("hot", Bump(sender=2, n=n)).future()
                     for n in range(4)]  # fmt: skip
        lanes = n1._runtime.spots["hot"].owner.lanes
        for _ in range(int(WAIT / 0.005)):
            if lanes.waiting() == 4:
                break
            threading.Event().wait(0.005)
        assert lanes.waiting() == 4  # node-2's calls wait for room here
        mine = [c1.send_to_spot("hot", Bump(sender=1, n=n)).future() for n in range(2)]
        with pytest.raises(zlink.ResourceExhausted, match="wait for room"):  # its own bound
            c1.send_to_spot("hot", Bump(sender=1, n=2)).future()
        GATE.set()
        for f in from_peer + mine:
            assert f.result(WAIT) is None
        assert n1.wait_idle(WAIT)
        seen = c1.request_to_spot("hot", Seen()).wait(WAIT)
        assert seen == [[0, n] for n in range(queued)] + [[2, n] for n in range(4)] + [
            [1, 0], [1, 1]
        ]  # fmt: skip


def test_a_request_waits_for_room_within_its_own_timeout(make_node, clock: ManualClock):
    node = make_node(build_app(), app_lane_items=4)
    client = _blocked(node)
    _fill(client)
    patient = client.request_to_spot("hot", Seen()).future()
    hasty = client.request_to_spot("hot", Seen()).timeout(1.0).future()
    clock.advance(1.0)
    with pytest.raises(zlink.DeadlineExceeded):
        hasty.result(WAIT)
    assert node._runtime.spots["hot"].owner.lanes.waiting() == 1  # hasty was withdrawn
    GATE.set()
    assert isinstance(patient.result(WAIT), list)


def test_await_send_in_a_handler_waits_for_room_keeping_its_turn(make_node):
    node = make_node(build_app(), app_lane_items=4)
    client = _blocked(node)
    queued = _fill(client)
    client.spots.get_or_create("relay", "t.bp.hot").wait(WAIT)
    answer = client.request_to_spot("relay", Forward(target="hot", n=1)).future()
    assert node.wait_idle(WAIT, busy=1)
    assert not answer.done()  # its turn waits for room in "hot"
    GATE.set()
    assert answer.result(WAIT) == "admitted"
    assert node.wait_idle(WAIT)
    assert client.request_to_spot("hot", Seen()).wait(WAIT)[-1] == [7, 1]
    assert queued == 3


def test_await_send_to_its_own_full_lane_is_refused(make_node):
    node = make_node(build_app(), app_lane_items=1)
    client = node.client()
    client.spots.get_or_create("me", "t.bp.hot").wait(WAIT)
    answer = client.request_to_spot("me", SendToSelf()).wait(WAIT)
    assert answer.startswith("refused") and "itself" in answer


def test_a_close_ends_the_wait_with_unavailable(make_node):
    node = make_node(build_app(), app_lane_items=4)
    client = _blocked(node)
    _fill(client)
    ref = client.spots.get_or_create("hot", "t.bp.hot").wait(WAIT).spot_ref
    waiting = client.send_to_spot("hot", Bump(sender=1, n=0)).future()
    client.spots.close(ref)
    with pytest.raises(zlink.Unavailable):
        waiting.result(WAIT)
    GATE.set()


def test_shutdown_ends_the_wait_with_unavailable(make_node):
    node = make_node(build_app(), app_lane_items=4)
    client = _blocked(node)
    _fill(client)
    waiting = client.send_to_spot("hot", Bump(sender=1, n=0)).future()
    GATE.set()  # let shutdown finish the running turn
    node.shutdown(WAIT)
    with contextlib.suppress(zlink.Unavailable):  # admitted as the lane drained, or not
        waiting.result(WAIT)


def test_a_batch_waits_for_room_for_all_its_messages(make_node):
    node = make_node(build_app(), app_lane_items=6)
    client = _blocked(node)
    queued = _fill(client)
    batch = [Bump(sender=3, n=n) for n in range(4)]
    with pytest.raises(zlink.ResourceExhausted):
        client.send_many_to_spot("hot", batch).submit()
    waiting = client.send_many_to_spot("hot", batch).future()
    assert not waiting.done()
    GATE.set()
    assert waiting.result(WAIT) is None
    assert node.wait_idle(WAIT)
    seen = client.request_to_spot("hot", Seen()).wait(WAIT)
    assert seen[queued:] == [[3, n] for n in range(4)]


def test_a_wait_refused_for_being_larger_than_the_lane_says_so(make_node):
    """python-api §9: a waiting caller refused because what it brings is more than the lane
    holds at all is told that, not that too many callers wait (none does here)."""
    node = make_node(build_app(), app_lane_items=6)
    client = node.client()
    client.spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
    batch = [Bump(sender=1, n=n) for n in range(7)]
    with pytest.raises(zlink.ResourceExhausted, match="more than the application lane"):
        client.send_many_to_spot("hot", batch).wait(WAIT)
    client.send_many_to_spot("hot", batch[:6]).wait(WAIT)  # one that fits goes in


def test_thousands_of_actor_creates_at_once_wait_instead_of_failing(make_node):
    node = make_node(build_app(), lifecycle_lane_items=4)
    client = node.client()
    first = client.actors.create("t.bp.player").request(Block()).future()
    assert BLOCKING.wait(WAIT)
    creates = [client.actors.create("t.bp.player").future() for _ in range(500)]
    assert node.counters()["admission_waits"] == 500 - 3  # the running one holds 1 of 4
    GATE.set()
    ids = {f.result(WAIT).actor_id for f in [first, *creates]}
    assert len(ids) == 501


def test_a_create_whose_wait_for_room_times_out_leaves_no_half_made_actor(make_node, clock):
    """A review's finding: the Actor was left in the directory, half made, and what was sent
    to it meanwhile was neither run nor counted."""
    node = make_node(build_app(), lifecycle_lane_items=1)
    client = node.client()
    first = client.actors.create("t.bp.player").request(Block()).future()
    assert BLOCKING.wait(WAIT)  # the lobby is held; its lifecycle lane (1) is full
    late = client.actors.create("t.bp.player", actor_id="p").timeout(1.0).future()
    client.send_to_actor("p", Bump(sender=1, n=0)).submit()  # queued for the Actor being made
    again = client.actors.get_or_create("p", "t.bp.player").timeout(60).future()
    clock.advance(1.0)
    with pytest.raises(zlink.DeadlineExceeded):
        late.result(WAIT)
    with pytest.raises(zlink.DeadlineExceeded):  # it waited on the same Actor: told at once
        again.result(WAIT)
    assert "p" not in node._runtime.actors
    assert node.counters()["messages_discarded_not_created"] == 1
    GATE.set()
    assert first.result(WAIT).created


def test_a_send_waiting_at_a_moving_spot_follows_it(clock: ManualClock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, app_lane_items=4) as cluster:
        n1, n2 = cluster.nodes
        client = _blocked(n1)
        queued = _fill(client)
        waiting = client.send_to_spot("hot", Bump(sender=5, n=0)).future()
        moved = threading.Thread(target=n1.relocate_spot, args=("hot", "node-2", WAIT))
        moved.start()
        GATE.set()
        moved.join(WAIT)
        assert waiting.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = n2.client().request_to_spot("hot", Seen()).wait(WAIT)
        assert seen[queued:] == [[5, 0]]


# -- across nodes (python-api §9: bounded per peer, PAUSED, counted at both ends) -------------
def _until_paused(cluster: LocalCluster) -> bool:
    """Let the two nodes move what they can (node-1 has one turn blocked on purpose) until
    node-1 pauses DATA from node-2; bounded: everything stops at the limits."""
    n1, n2 = cluster.nodes
    for _ in range(50):
        assert n2.wait_idle(WAIT) and n1.wait_idle(WAIT, busy=1)
        if cluster.transport.paused("node-1", "node-2"):
            return True
    return False


def _pair(clock: ManualClock) -> LocalCluster:
    return LocalCluster(
        build_app(), nodes=2, clock=clock, workers=2, data_limit=4, app_lane_items=4,
        peer_backlog_items=8, peer_outbound_bytes=2048,
    )  # fmt: skip


def _senders_waiting(cluster: LocalCluster) -> tuple[zlink.Client, list[Any]]:
    """Node-2 ``future()``-sends 200 to "hot" on node-1, whose running handler holds it:
    node-1 pauses DATA from node-2, and node-2's later sends wait for room in its outbox."""
    n1, n2 = cluster.nodes
    _blocked(n1)
    c2 = n2.client()
    futures = [c2.send_to_spot("hot", Bump(sender=2, n=n)).future() for n in range(200)]
    assert _until_paused(cluster)
    return c2, futures


def test_a_slow_spot_on_another_node_pauses_its_sender_and_nothing_is_lost(clock):
    with _pair(clock) as cluster:
        n1, n2 = cluster.nodes
        _blocked(n1)
        c2 = n2.client()
        futures = [c2.send_to_spot("hot", Bump(sender=2, n=n)).future() for n in range(200)]
        assert _until_paused(cluster)  # n1 takes no more DATA from n2
        backlog = n1._runtime.router.backlog()["node-2"]
        assert 8 <= backlog <= 8 + 4 + 4  # the limit, plus frames already on their way
        outbox = n2._runtime.router.outbox
        assert outbox.waiting("node-1") > 0 and not futures[-1].done()  # senders wait
        with pytest.raises(zlink.ResourceExhausted, match="outbound"):
            c2.send_to_spot("hot", Bump(sender=3, n=0)).submit()  # refused at the source
        GATE.set()
        for f in futures:
            assert f.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 2] == list(range(200))  # once each, in order
        assert not cluster.transport.paused("node-1", "node-2")
        for node in cluster.nodes:
            assert not [k for k in node.counters() if "dropped" in k]


def _routed(cluster: LocalCluster, spot: str, sender: int) -> zlink.Client:
    """``spot`` made on node-1, and the last node's client, whose first send (``sender``'s
    0) taught that node the route; returns that client."""
    n1, *_, last = cluster.nodes
    n1.client().spots.get_or_create(spot, "t.bp.hot").wait(WAIT)
    client = last.client()
    client.send_to_spot(spot, Bump(sender=sender, n=0)).wait(WAIT)
    cluster.wait_idle(WAIT)
    return client


def _two_limits(clock: ManualClock) -> LocalCluster:
    """Two nodes whose senders wait past 2 KiB queued for a peer, and whose ``submit()`` is
    refused past 16 KiB; one DATA frame in flight between them."""
    return LocalCluster(
        build_app(), nodes=2, clock=clock, workers=2, data_limit=1,
        peer_outbound_bytes=2048, peer_outbound_submit_bytes=16 * 1024,
    )  # fmt: skip


def test_submit_fills_the_outbox_past_where_waiting_senders_stop(clock):
    """python-api §9 with two limits per peer: senders that may wait (``wait``, ``future``,
    requests) wait once ``peer_outbound_bytes`` are queued; ``submit()`` is refused only past
    ``peer_outbound_submit_bytes``, or while a call for its own target waits."""
    with _two_limits(clock) as cluster:
        _n1, n2 = cluster.nodes
        c2 = _routed(cluster, "hot", 2)
        outbox = n2._runtime.router.outbox
        assert (outbox.limit, outbox.submit_limit) == (2048, 16 * 1024)
        cluster.transport.pause("node-1", "node-2")  # what node-2 sends stays in its outbox
        n = 1
        with pytest.raises(zlink.ResourceExhausted, match="outbound"):
            for n in range(1, 100):  # bounded: 16 KiB hold about 16 of them
                c2.send_to_spot("hot", Bump(sender=2, n=n)).submit()
        submitted = n - 1
        assert submitted > 8  # well past the 2 KiB where a waiting sender stops
        assert n2.wait_idle(WAIT)
        waiting = c2.send_to_spot("hot", Bump(sender=2, n=n)).future()
        assert not waiting.done() and outbox.waiting("node-1") == 1
        cluster.transport.resume("node-1", "node-2")
        assert waiting.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [m for s, m in seen if s == 2] == list(range(n + 1))
        assert n2.counters()["admission_waits"] >= 1


def test_submits_that_waited_for_the_store_fit_under_the_submit_limit(clock):
    """A burst of ``submit()`` sends that waited for the Location Store (the first calls to a
    Spot this node has no route to) is judged as submits are once answered: under
    ``peer_outbound_submit_bytes`` nobody waits, and the next ``submit()`` is taken. (They
    were held to ``peer_outbound_bytes``, waited, and the next submit was refused.)"""
    with _two_limits(clock) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
        answer, lookup = threading.Event(), cluster.store.lookup
        cluster.store.lookup = lambda target: (answer.wait(WAIT), lookup(target))[1]  # type: ignore[method-assign]
        cluster.transport.pause("node-1", "node-2")  # what node-2 sends stays in its outbox
        c2 = n2.client()
        for n in range(6):  # all wait for the store, accepted
            c2.send_to_spot("hot", Bump(sender=2, n=n)).submit()
        answer.set()
        assert n2.wait_idle(WAIT)
        outbox = n2._runtime.router.outbox
        assert outbox.waiting("node-1") == 0
        c2.send_to_spot("hot", Bump(sender=2, n=6)).submit()  # room for it: taken
        cluster.transport.resume("node-1", "node-2")
        cluster.wait_idle(WAIT)
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [m for s, m in seen if s == 2] == list(range(7))


def test_a_submit_waits_for_nobody_but_calls_for_its_own_target(clock):
    """python-api §9: ``submit()`` is refused when the outbound queue is full, and, under
    ``peer_outbound_submit_bytes``, while a call for its own target waits there (it would
    overtake it: per-sender order of ``future()`` then ``submit()``); calls waiting for
    another Spot of that node do not refuse it (per-sender order is per target)."""
    with _pair(clock) as cluster:
        outbox = cluster.nodes[1]._runtime.router.outbox
        _routed(cluster, "cold", 3)
        c2, futures = _senders_waiting(cluster)  # sends for "hot" wait for room
        assert outbox.waiting("node-1") > 0
        with outbox._lock:
            queued = outbox._bytes.get("node-1", 0)
        assert queued < outbox.submit_limit  # room for a submit, were nobody waiting
        c2.send_to_spot("cold", Bump(sender=3, n=1)).submit()  # nothing waits for "cold"
        with pytest.raises(zlink.ResourceExhausted, match="'hot' wait"):
            c2.send_to_spot("hot", Bump(sender=2, n=999)).submit()
        GATE.set()
        for f in futures:
            assert f.result(WAIT) is None
        cluster.wait_idle(WAIT)
        assert c2.request_to_spot("cold", Seen()).wait(WAIT) == [[3, 0], [3, 1]]
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 2] == list(range(200))


def test_the_submit_limit_is_never_below_the_wait_limit(clock):
    with LocalCluster(
        build_app(), nodes=1, clock=clock, peer_outbound_bytes=8192,
        peer_outbound_submit_bytes=1024,
    ) as cluster:  # fmt: skip
        outbox = cluster.nodes[0]._runtime.router.outbox
        assert (outbox.limit, outbox.submit_limit) == (8192, 8192)


def test_replies_still_flow_while_data_from_that_peer_is_paused(clock):
    with _pair(clock) as cluster:
        n1, n2 = cluster.nodes
        n2.client().spots.get_or_create("far", "t.bp.hot").wait(WAIT)
        _blocked(n1)
        c2 = n2.client()
        for n in range(100):
            c2.send_to_spot("hot", Bump(sender=2, n=n)).future()
        assert _until_paused(cluster)
        # node-1 -> node-2 is DATA the other way; the reply comes back on COMPLETION
        assert n1.client().request_to_spot("far", Seen()).wait(WAIT) == []
        GATE.set()


def test_a_send_another_node_cannot_deliver_is_counted_at_both_ends(clock):
    with _pair(clock) as cluster:
        n1, n2 = cluster.nodes
        ref = n1.client().spots.get_or_create("gone", "t.bp.hot").wait(WAIT).spot_ref
        c2 = n2.client()
        c2.send_to_spot("gone", Bump(sender=2, n=0)).submit()  # node-2 learns the route
        cluster.wait_idle(WAIT)
        n1.client().spots.close(ref)
        cluster.wait_idle(WAIT)
        c2.send_to_spot("gone", Bump(sender=2, n=1)).submit()  # accepted: the route is cached
        cluster.wait_idle(WAIT)
        assert n1.counters()["sends_dropped_not_found"] == 1
        assert n2.counters()["remote_sends_dropped_not_found"] == 1


# -- a blocking wait returns by its deadline (python-api §11; issue fault 2) ------------------
class Slow(zlink.Request[str], type_name="t.bp.slow"):
    pass


def test_a_blocking_wait_returns_by_its_deadline_and_never_runs_the_handler_itself(make_node):
    import time

    app = zlink.App("deadline")
    ran_on: list[str] = []

    @app.user_spot("t.bp.slowpoke")
    class Slowpoke(zlink.UserSpot):
        @zlink.handler
        def slow(self, req: Slow) -> str:
            ran_on.append(threading.current_thread().name)
            assert GATE.wait(WAIT)
            return "late"

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("s", "t.bp.slowpoke").wait(WAIT)
    t0 = time.monotonic()
    with pytest.raises(zlink.DeadlineExceeded):
        client.request_to_spot("s", Slow()).wait(0.2)  # the gate is idle: nobody else waits
    assert time.monotonic() - t0 < WAIT / 2  # by its deadline, not when the handler ends
    GATE.set()
    assert node.wait_idle(WAIT)
    assert ran_on and ran_on[0] != threading.current_thread().name  # a worker ran it


def test_shutdown_ends_a_wait_for_room_in_the_outbox(clock):
    with _pair(clock) as cluster:
        _c2, futures = _senders_waiting(cluster)
        assert not futures[-1].done()
        # node-1's Spot is held: what node-2 accepted for it waits there, and the graceful
        # stop sends it (or waits) until its time is up: a short one ends the waits sooner
        cluster.nodes[1].shutdown(1.0)
        for f in futures:
            with contextlib.suppress(zlink.Unavailable):  # sent before, or refused by the stop
                f.result(WAIT)
        GATE.set()


def test_a_send_waiting_for_room_keeps_its_place_when_its_spot_is_sealed_for_a_move(clock):
    """A fresh-eyes review's finding: a waiter ended by the seal was routed again from the
    infrastructure thread, behind a later send of the same sender parked at once."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, app_lane_items=4) as cluster:
        n1, n2 = cluster.nodes
        client = _blocked(n1)
        _fill(client)
        waiting = client.send_to_spot("hot", Bump(sender=5, n=0)).future()
        done = n1._relocator.start(n1._runtime.spots["hot"], "node-2", WAIT)  # sealed now
        client.send_to_spot("hot", Bump(sender=5, n=1)).submit()  # parked for the move
        GATE.set()
        n1._relocator.wait_move("hot", done, WAIT, WAIT)
        assert waiting.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = n2.client().request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 5] == [0, 1]  # per-sender order across the seal
        assert not [k for k in n2.counters() if "refused" in k or "dropped" in k]


def test_a_send_waiting_in_the_outbox_stays_ahead_of_calls_kept_behind_a_later_fence(clock):
    """A fresh-eyes review's finding: calls waiting for outbox room were appended behind calls
    kept by a route fence that started after them (per-sender order, python-api §9)."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, data_limit=1) as cluster:
        n1, _n2, n3 = cluster.nodes
        n1.client().spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
        c3 = n3.client()
        c3.send_to_spot("hot", Bump(sender=3, n=0)).wait(WAIT)  # node-3 learns the route
        cluster.wait_idle(WAIT)
        router3 = n3._runtime.router
        cluster.transport.pause("node-1", "node-3")  # DATA from node-3 is held
        router3.outbox.limit = 1  # and node-3's outbox to node-1 is full with one frame
        sent = [c3.send_to_spot("hot", Bump(sender=3, n=n)).future() for n in (1, 2, 3, 4)]
        assert n3.wait_idle(WAIT) and router3.outbox.waiting("node-1") == 2  # 3 and 4 wait
        hint = wire.RouteEnvelope("hot", "node-2", 999, 999)  # "it moved": a fence starts
        n3._infra.submit(router3.received, "node-2", Channel.COMPLETION, wire.encode(hint))
        assert n3.wait_idle(WAIT) and n3.counters()["route_fences"] == 1
        late = c3.send_to_spot("hot", Bump(sender=3, n=5)).future()  # kept behind the fence
        router3.outbox.limit = 4 * 1024 * 1024
        cluster.transport.resume("node-1", "node-3")
        for f in [*sent, late]:
            assert f.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = c3.request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 3] == [0, 1, 2, 3, 4, 5]


def test_a_fence_that_finds_its_spot_not_where_the_hint_said_keeps_the_path_it_fenced(clock):
    """The rare order failure of the process mesh (a room moved 50 times under 4 senders: a
    sender's last 36 messages ran ahead of ~100 earlier ones, about 1 run in 40-60 on 3.11).
    A hint said the Spot went to node-2; the fence node-3 sent along its path found it live
    on node-1 (it had come back), where node-3's earlier calls were still waiting for room
    in its lane. The fence came back at once, and node-3 dropped its path and asked the
    store for its next calls: once the Spot moved on, the store named the new node, and
    node-3 sent straight there while its earlier calls were still relayed to it by node-1,
    so they could arrive after. The path the fence proved (every earlier call is on it)
    stays the path: later calls follow the earlier ones through node-1, which parks or
    relays them behind those (per-sender order, python-api §9)."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, app_lane_items=4) as cluster:
        n1, _n2, n3 = cluster.nodes
        c3 = _routed(cluster, "hot", 3)  # node-3 sends by node-1
        n1.client().send_to_spot("hot", Block()).submit()
        assert BLOCKING.wait(WAIT)
        sent = [c3.send_to_spot("hot", Bump(sender=3, n=n)).future() for n in range(1, 9)]
        for f in sent:  # accepted at node-3; at node-1 some wait for room in the lane
            assert f.result(WAIT) is None
        lanes = n1._runtime.spots["hot"].owner.lanes
        for _ in range(50):  # (bounded) they reach node-1, where the running Block holds "hot"
            if n3.wait_idle(WAIT) and n1.wait_idle(WAIT, busy=1) and lanes.waiting():
                break
        assert lanes.waiting()
        router3 = n3._runtime.router
        hint = wire.RouteEnvelope("hot", "node-2", 999, 999)  # "it went to node-2"
        n3._infra.submit(router3.received, "node-2", Channel.COMPLETION, wire.encode(hint))
        for _ in range(50):  # node-1 answers the fence: "hot" is here
            if n3.wait_idle(WAIT) and n1.wait_idle(WAIT, busy=1) and not router3._switching:
                break
        assert n3.counters()["route_fences"] == 1
        known = router3._known("hot")
        assert known is not None and known.node == "node-1"  # not "ask the store"
        later = [c3.send_to_spot("hot", Bump(sender=3, n=n)).future() for n in (9, 10)]
        finish = _move_to_node_2(n1)  # the seal parks the waiting calls, in their order
        GATE.set()
        finish()
        for f in later:
            assert f.result(WAIT) is None
        assert _sender_3(cluster, 11) == list(range(11))


def test_a_fence_back_from_elsewhere_drops_an_old_path_that_broke_meanwhile(clock):
    """A review's finding on the test above: the old path is kept only while it works. One
    whose node this node cannot reach any more would refuse every call until that node's
    lease lapsed; what went along it is lost with it, so the store may say where to go."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2) as cluster:
        _n1, _n2, n3 = cluster.nodes
        _routed(cluster, "hot", 3)
        cluster.transport.pause("node-1", "node-3")  # the fence waits at node-1's door
        router3 = n3._runtime.router
        hint = wire.RouteEnvelope("hot", "node-2", 999, 999)
        n3._infra.submit(router3.received, "node-2", Channel.COMPLETION, wire.encode(hint))
        assert n3.wait_idle(WAIT) and n3.counters()["route_fences"] == 1
        real = router3.transport

        class _NotToNode1:  # node-3's view only: node-1 is unreachable from now on
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def reachable(self, peer: str) -> bool:
                return peer != "node-1" and real.reachable(peer)

        router3.transport = _NotToNode1()  # type: ignore[assignment]
        cluster.transport.resume("node-1", "node-3")
        _settled(cluster, lambda: not router3._switching)
        assert router3._known("hot") is None  # the store says, when next asked


def _sender_3(cluster: LocalCluster, count: int) -> list[int]:
    """What "hot" saw of sender 3, once it saw ``count`` of its messages (bounded)."""
    client = cluster.nodes[0].client()
    seen: list[int] = []
    for _ in range(50):
        _settled(cluster)
        seen = [n for s, n in client.request_to_spot("hot", Seen()).wait(WAIT) if s == 3]
        if len(seen) >= count:
            break
    return seen


def _waiting_in_the_outbox(cluster: LocalCluster, wait: Any) -> Any:
    """Sender 2 of the last node sends 0, 1, 2 to "hot" on node-1 and then ``wait(client)``
    (made by the caller), which waits for room in the outbox to node-1: DATA from it is
    paused, and nobody waiting for node-1 is let go until ``_let_go``."""
    n2 = cluster.nodes[-1]
    c2 = _routed(cluster, "hot", 2)
    outbox = n2._runtime.router.outbox
    cluster.transport.pause("node-1", n2.node_id)  # DATA from it is held
    outbox.limit = 1
    c2.send_to_spot("hot", Bump(sender=2, n=1)).wait(WAIT)  # the transport holds it
    c2.send_to_spot("hot", Bump(sender=2, n=2)).wait(WAIT)  # the outbox holds it
    waiting = wait(c2)
    assert n2.wait_idle(WAIT) and outbox.waiting("node-1") == 1 and not waiting.done()
    with outbox._lock:  # nobody waiting for node-1 is let go while the path changes; other
        outbox._bytes["node-1"] = outbox._bytes.get("node-1", 0) + _HELD  # peers have room
    outbox.limit = 4 * 1024 * 1024
    return waiting


_HELD = 1 << 40  # bytes an outbox is told it holds for node-1 until ``_let_go``


def _let_go(node: zlink.Node) -> None:
    outbox = node._runtime.router.outbox
    with outbox._lock:
        outbox._give_back("node-1", _HELD)
    node._infra.submit(outbox.writable, "node-1")  # room, as the transport would say


def _settled(cluster: LocalCluster, until: Any = None) -> None:
    """Let the nodes move what they can until all are idle in one pass and ``until()``
    holds. Bounded: a hop between nodes is queued on the next node before the node that
    made it goes idle, so each pass either finds work or ends it."""
    for _ in range(50):
        if all(node.wait_idle(WAIT) for node in cluster.nodes) and (until is None or until()):
            return
    raise AssertionError("the nodes did not settle")


def _here_and_fenced(node: zlink.Node) -> Any:
    """ "hot" lives on ``node`` now, open, or its arrival's fence waits in line behind the
    waiting send (the outbox lists two waiters to node-1 then)."""
    rt = node._runtime

    def done() -> bool:
        act = rt.spots.get("hot")
        return act is not None and (
            act.state.value == "ready" or rt.router.outbox.waiting("node-1") == 2
        )

    return done


def _move_to_node_2(node: zlink.Node) -> Any:
    """Start moving "hot" from ``node`` to node-2 (sealed and under way when this returns);
    returns a call that waits for the move to finish."""
    relocator = node._relocator
    done = relocator.start(node._runtime.spots["hot"], "node-2", WAIT)
    return lambda: relocator.wait_move("hot", done, WAIT, WAIT)


def _sender_2(cluster: LocalCluster, count: int) -> list[int]:
    """What "hot" saw of sender 2, once it saw ``count`` of its messages (or the nodes went
    idle 50 times without it: then what it saw)."""
    client = cluster.nodes[0].client()
    seen: list[int] = []
    for _ in range(50):  # a hop between nodes can land just after a node went idle
        _settled(cluster)
        seen = [n for s, n in client.request_to_spot("hot", Seen()).wait(WAIT) if s == 2]
        if len(seen) >= count:
            break
    return seen


@pytest.mark.parametrize("how", ["after", "future", "submit"])
def test_a_send_waiting_in_the_outbox_while_its_spot_arrives_here_keeps_its_order(clock, how):
    """The 50-moves process-mesh test on 3.13t with a smaller outbox found it: a send waiting
    for room in the outbox to the Spot's old node, let go after the Spot had moved onto the
    sender's own node, asked the store where to go and told its caller it was queued; the
    sender's next send found the Spot here and ran first. A fresh-eyes review found the same
    for a sender that goes on while its send waits (``future()``, ``submit()``, every client
    send): the arrival's fence passed the waiting send. The fence now waits in line behind it
    (per-sender order across a move, kotlin-spot-interface relocation; python-api §9)."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, data_limit=1) as cluster:
        n1, n2 = cluster.nodes
        c2 = n2.client()
        waiting = _waiting_in_the_outbox(
            cluster, lambda c: c.send_to_spot("hot", Bump(sender=2, n=3)).future()
        )
        finish = _move_to_node_2(n1)
        cluster.transport.resume("node-1", "node-2")
        _settled(cluster, _here_and_fenced(n2))
        later = None
        if how == "future":
            later = c2.send_to_spot("hot", Bump(sender=2, n=4)).future()
        elif how == "submit":
            c2.send_to_spot("hot", Bump(sender=2, n=4)).submit()
        _let_go(n2)
        assert waiting.result(WAIT) is None
        if how == "after":  # a sender that waited for it first
            c2.send_to_spot("hot", Bump(sender=2, n=4)).wait(WAIT)
        elif later is not None:
            assert later.result(WAIT) is None
        finish()
        assert n2._runtime.spots["hot"].state.value == "ready"
        assert _sender_2(cluster, 5) == [0, 1, 2, 3, 4]


def test_a_batch_waiting_in_the_outbox_while_its_spot_arrives_here_is_not_lost(clock):
    """The same with a batch: let go after the move, it found no route to the old node and
    was dropped without a word while its caller heard it was accepted (python-api §8, §9)."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, data_limit=1) as cluster:
        n1, n2 = cluster.nodes
        batch = [Bump(sender=2, n=3), Bump(sender=2, n=4)]
        waiting = _waiting_in_the_outbox(
            cluster, lambda c: c.send_many_to_spot("hot", batch).future()
        )
        finish = _move_to_node_2(n1)
        cluster.transport.resume("node-1", "node-2")
        _settled(cluster, _here_and_fenced(n2))
        later = n2.client().send_to_spot("hot", Bump(sender=2, n=5)).future()
        _let_go(n2)
        assert waiting.result(WAIT) is None and later.result(WAIT) is None
        finish()
        assert _sender_2(cluster, 6) == [0, 1, 2, 3, 4, 5]


def test_a_send_waiting_in_the_outbox_stays_ahead_when_its_route_changes(clock):
    """A fresh-eyes review's finding (before the smaller outbox too): node-3's send waits for
    room to node-1; "hot" moves on to node-2 and node-3 hears of it; its fence passed the
    waiting send, came back, and the sender's next send (``future()``) went straight to
    node-2, ahead of the waiting one. The fence now waits in line behind it (python-api §9)."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, data_limit=1) as cluster:
        n1, _n2, n3 = cluster.nodes
        waiting = _waiting_in_the_outbox(
            cluster, lambda c: c.send_to_spot("hot", Bump(sender=2, n=3)).future()
        )
        cluster.transport.resume("node-1", "node-3")  # 1 and 2 arrive; 3 still waits
        _settled(cluster)
        n1.relocate_spot("hot", "node-2", WAIT)
        _settled(cluster)
        found = cluster.store.lookup("hot")
        assert found is not None and found.owner_node == "node-2"
        hint = wire.RouteEnvelope("hot", "node-2", found.object_generation,
                                  found.authority_generation)  # fmt: skip
        router = n3._runtime.router
        n3._infra.submit(router.received, "node-1", Channel.COMPLETION, wire.encode(hint))
        outbox = router.outbox  # the fence is back, or it waits in line behind the send
        _settled(cluster, lambda: "hot" not in router._switching or outbox.waiting("node-1") == 2)
        assert n3.counters()["route_fences"] == 1
        later = n3.client().send_to_spot("hot", Bump(sender=2, n=4)).future()
        _settled(cluster)
        _let_go(n3)
        assert waiting.result(WAIT) is None and later.result(WAIT) is None
        assert _sender_2(cluster, 5) == [0, 1, 2, 3, 4]


def test_a_batch_waiting_in_the_outbox_while_its_route_is_forgotten_is_not_lost(clock):
    """A batch let go after its node forgot the route (a fence found the Spot elsewhere than
    the hint said) was dropped without a word while its caller heard it was accepted. Now
    the fence waits behind it, and it is kept ahead of what the fence keeps; once the fence
    is back its messages ask the store, in order, ahead of the sender's next send
    (python-api §8, §9)."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, data_limit=1) as cluster:
        _n1, n2 = cluster.nodes
        batch = [Bump(sender=2, n=3), Bump(sender=2, n=4)]
        waiting = _waiting_in_the_outbox(
            cluster, lambda c: c.send_many_to_spot("hot", batch).future()
        )
        router = n2._runtime.router
        hint = wire.RouteEnvelope("hot", "node-3", 999, 999)  # "it moved": a fence starts
        n2._infra.submit(router.received, "node-3", Channel.COMPLETION, wire.encode(hint))
        cluster.transport.resume("node-1", "node-2")
        _settled(cluster)
        assert n2.counters()["route_fences"] == 1
        _let_go(n2)
        assert waiting.result(WAIT) is None
        later = n2.client().send_to_spot("hot", Bump(sender=2, n=5)).future()
        assert later.result(WAIT) is None
        assert _sender_2(cluster, 6) == [0, 1, 2, 3, 4, 5]
        assert router._known("hot") is None or router._known("hot").node == "node-1"


def test_an_accepted_send_let_go_onto_a_full_lane_here_waits_and_is_never_lost(clock):
    """A fresh-eyes review's finding: a ``submit()`` accepted while the store was asked, then
    waiting for room in the outbox, let go after its Spot came to this node with no fence to
    wait for (no path was known: forgotten here on purpose), found the lane full and waited
    there under ``admission_timeout``, as if a caller waited: at the deadline it was dropped,
    counted nowhere. An accepted send waits as long as it takes, as a call from a peer does
    (python-api §9: nothing accepted is lost without a trace)."""
    with LocalCluster(
        build_app(), nodes=2, clock=clock, workers=2, data_limit=1, app_lane_items=4,
        admission_timeout=2.0,
    ) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
        c2 = n2.client()
        answer, lookup = threading.Event(), cluster.store.lookup
        cluster.store.lookup = lambda target: (answer.wait(WAIT), lookup(target))[1]  # type: ignore[method-assign]
        cluster.transport.pause("node-1", "node-2")
        router = n2._runtime.router
        outbox = router.outbox
        for n in range(3):  # accepted while the store is asked; then 0 and 1 go, 2 waits
            c2.send_to_spot("hot", Bump(sender=2, n=n)).submit()
        outbox.limit = outbox.submit_limit = 1  # (set before, it bounds them there too)
        answer.set()
        assert n2.wait_idle(WAIT) and outbox.waiting("node-1") == 1
        with outbox._lock:
            outbox._bytes["node-1"] += _HELD
        outbox.limit = outbox.submit_limit = 4 * 1024 * 1024
        with router.route_lock:
            router._routes.pop("hot")  # no path to fence when it arrives
        finish = _move_to_node_2(n1)
        cluster.transport.resume("node-1", "node-2")
        finish()
        # 0 and 1, relayed by node-1 on DATA, may land after the commit (on COMPLETION) opened
        # the room here; with the route forgotten no fence orders Block behind them: wait
        assert _sender_2(cluster, 2) == [0, 1]
        c2.send_to_spot("hot", Block()).submit()  # its lane fills up behind a held turn
        assert BLOCKING.wait(WAIT)
        _fill(c2)
        _let_go(n2)
        assert n2.wait_idle(WAIT, busy=1) and n1.wait_idle(WAIT)
        assert len(n2._runtime.spots["hot"].owner.lanes.app_waiters) == 1  # it waits for room
        clock.advance(3.0)  # past admission_timeout
        assert n2.wait_idle(WAIT, busy=1)
        GATE.set()
        assert _sender_2(cluster, 3) == [0, 1, 2]
        assert not [k for node in cluster.nodes for k in node.counters() if "dropped" in k]


def test_a_batch_to_another_node_is_all_or_none_there_and_waits_for_room(clock):
    """A batch to a Spot on another node travels as one envelope: admitted all or none
    where the Spot lives (python-api §8), and it waits for room there (§9); a plain batch
    that finds the outbox full is refused at the source with nothing sent."""
    with _pair(clock) as cluster:
        n1, n2 = cluster.nodes
        _blocked(n1)
        c2 = n2.client()
        c2.send_to_spot("hot", Bump(sender=9, n=-1)).wait(WAIT)  # node-2 learns the route
        batches = [
            c2.send_many_to_spot("hot", [Bump(sender=2, n=3 * b + i) for i in range(3)]).future()
            for b in range(40)
        ]
        assert _until_paused(cluster)
        assert not batches[-1].done()
        with pytest.raises(zlink.ResourceExhausted, match="outbound"):  # all or none: none
            c2.send_many_to_spot("hot", [Bump(sender=4, n=0), Bump(sender=4, n=1)]).submit()
        GATE.set()
        for f in batches:
            assert f.result(WAIT) is None
        assert n2.counters()["batches_sent"] == 40  # one envelope each
        cluster.wait_idle(WAIT)
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 2] == list(range(120))  # once each, in order
        assert not [n for s, n in seen if s == 4]  # the refused batch: nothing of it
        assert not [k for node in cluster.nodes for k in node.counters() if "dropped" in k]


def test_a_plain_send_that_waited_for_the_store_keeps_its_place_in_the_outbox(clock):
    """A review's finding: after the store answered, a plain send (accepted already) went
    straight into the outbox, ahead of an earlier send of the same sender still waiting there
    for room."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, data_limit=1) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
        answer, lookup = threading.Event(), cluster.store.lookup
        cluster.store.lookup = lambda target: (answer.wait(WAIT), lookup(target))[1]  # type: ignore[method-assign]
        cluster.transport.pause("node-1", "node-2")
        n2._runtime.router.outbox.limit = 1  # one frame fills it
        c2 = n2.client()
        first = c2.send_to_spot("hot", Bump(sender=2, n=0)).future()  # all wait for the store
        second = c2.send_to_spot("hot", Bump(sender=2, n=1)).future()
        c2.send_to_spot("hot", Bump(sender=2, n=2)).submit()  # accepted: it waits in line
        fourth = c2.send_to_spot("hot", Bump(sender=2, n=3)).future()
        answer.set()
        assert n2.wait_idle(WAIT) and n1.wait_idle(WAIT)
        n2._runtime.router.outbox.limit = 4 * 1024 * 1024
        cluster.transport.resume("node-1", "node-2")
        for f in (first, second, fourth):
            assert f.result(WAIT) is None
        cluster.wait_idle(WAIT)
        seen = c2.request_to_spot("hot", Seen()).wait(WAIT)
        assert [n for s, n in seen if s == 2] == [0, 1, 2, 3]


def test_an_await_send_cancelled_by_an_overdue_close_withdraws_its_wait(make_node, clock):
    """A review's finding: a handler waiting for room in ``await send`` and cancelled by its
    Spot's overdue close left its waiter queued, so the message went in after all."""
    node = make_node(build_app(), app_lane_items=4, closing_timeout=1.0)
    client = _blocked(node)
    _fill(client)
    ref = client.spots.get_or_create("relay", "t.bp.hot").wait(WAIT).spot_ref
    answer = client.request_to_spot("relay", Forward(target="hot", n=1)).future()
    assert node.wait_idle(WAIT, busy=1)  # relay's turn waits for room in "hot" (suspended)
    assert node._runtime.spots["hot"].owner.lanes.waiting() == 1
    client.spots.close(ref)
    clock.advance(1.0)  # the close is overdue: the waiting turn is cancelled
    with pytest.raises(zlink.ZLinkError):
        answer.result(WAIT)
    assert node._runtime.spots["hot"].owner.lanes.waiting() == 0  # withdrawn, not admitted
    GATE.set()
    assert node.wait_idle(WAIT)
    assert [7, 1] not in client.request_to_spot("hot", Seen()).wait(WAIT)


def test_a_wait_for_room_that_finds_room_at_its_second_try_completes_at_once(make_node):
    """A review's finding: when room came back between the refused put and the wait (a race
    a test cannot schedule), a batch's wait never completed. Driven here directly: the lane has
    room when the wait is asked for, so it must complete at once."""
    from zlink.executor import CallJob
    from zlink.messaging.calls import NO_WAIT, BatchSendCall
    from zlink.messaging.completion import Admitted
    from zlink.types import TargetKind

    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
    rt = node._runtime
    room = Admitted()
    call = BatchSendCall(rt, TargetKind.SPOT, "hot", [Bump(sender=1, n=0)])
    rt._wait_for_room(rt.spots["hot"], CallJob(lambda: None), call, None, NO_WAIT, 0, room)
    assert room.done and room.wait(0) is None


def test_a_peer_is_paused_and_resumed_under_the_routers_lock(clock):
    """A review's finding: the pause was told to the transport after the router's lock was let
    go, so a resume decided meanwhile could come first and leave the peer paused for good. The
    transport now hears both under that lock, in the order they were decided."""
    with _pair(clock) as cluster:
        n1, n2 = cluster.nodes
        router = n1._runtime.router
        told: list[tuple[str, bool]] = []
        pause, resume = cluster.transport.pause, cluster.transport.resume

        def spy(name: str, real: Any) -> Any:
            def call(node_id: str, peer: str) -> None:
                if node_id == "node-1":
                    told.append((name, router._lock.locked()))
                real(node_id, peer)

            return call

        cluster.transport.pause = spy("pause", pause)  # type: ignore[method-assign]
        cluster.transport.resume = spy("resume", resume)  # type: ignore[method-assign]
        _blocked(n1)
        futures = [n2.client().send_to_spot("hot", Bump(sender=2, n=n)).future() for n in range(60)]
        assert _until_paused(cluster)
        GATE.set()
        for f in futures:
            assert f.result(WAIT) is None
        cluster.wait_idle(WAIT)
        assert told and told[0] == ("pause", True) and ("resume", True) in told
        assert all(held for _, held in told)
        assert not cluster.transport.paused("node-1", "node-2")


def test_a_relayed_request_waiting_for_the_store_is_not_withdrawn_by_a_send_timer(clock):
    """A review's finding: a request that reached a node which had to ask the store got a
    send's admission deadline there; when it passed, the request was dropped unanswered."""
    from zlink.mesh import wire
    from zlink.mesh.transport import Channel

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, admission_timeout=1.0) as c:
        n1, n2, _n3 = c.nodes
        n1.client().spots.get_or_create("hot", "t.bp.hot").wait(WAIT)
        hint = wire.RouteEnvelope("hot", "node-3", 999, 999)  # node-2 believes node-3 has it
        n2._infra.submit(n2._runtime.router.received, "node-3", Channel.COMPLETION,
                         wire.encode(hint))  # fmt: skip
        assert n2.wait_idle(WAIT)
        asking, answer, lookup = threading.Event(), threading.Event(), c.store.lookup

        def held_lookup(target: str) -> Any:
            asking.set()
            assert answer.wait(WAIT)
            return lookup(target)

        c.store.lookup = held_lookup  # type: ignore[method-assign]
        asked = n2.client().request_to_spot("hot", Seen()).future()  # relayed by node-3
        assert asking.wait(WAIT)  # node-3 asks the store where "hot" is; the request waits
        clock.advance(1.0)  # a send's admission deadline: not this request's
        answer.set()
        assert asked.result(WAIT) == []
