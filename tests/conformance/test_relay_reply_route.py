"""A request relayed by a stale route keeps its reply route (kotlin-spot-interface: "A stale
source route relays, preserving operation identity, generation, deadline, correlation, and
reply route").

Before, the relaying node re-sent the request as its own (a correlation of its own, the reply
coming back through it): its stop failed the call at its caller with ``Unavailable`` though
the handler ran, and its caller could not see the node that ran it go down. Now the reply
goes straight to the caller's node, which the node that took it tells where the reply is
awaited now (``RelayedEnvelope``, on COMPLETION; the notice of the later of two relays wins).
The manual clock never moves: what ends here ends by a reply or by the store's verdict, never
by a deadline. Every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.mesh import wire
from zlink.messaging.completion import Completion
from zlink.testing import LocalCluster, ManualClock

HOLD = threading.Event()  # released: a held handler answers
HOLDING = threading.Event()  # a held handler runs
RAN: list[str] = []  # the nodes a held handler ran on


class Where(zlink.Request[str], type_name="t.rr.where"):
    pass


class Held(zlink.Request[str], type_name="t.rr.held"):
    pass


def _node(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


def build_app() -> zlink.App:
    app = zlink.App("relay-reply-route")

    @app.user_spot("t.rr.box", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Box(zlink.UserSpot):
        @zlink.handler
        def where(self, req: Where) -> str:
            return _node(self.context)

        @zlink.handler
        def held(self, req: Held) -> str:
            RAN.append(_node(self.context))
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return _node(self.context)

    return app


@pytest.fixture
def cluster(clock: ManualClock) -> Iterator[LocalCluster]:
    HOLD.clear()
    HOLDING.clear()
    RAN.clear()
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=60.0) as c:
        try:
            yield c
        finally:
            HOLD.set()


def _stale_route(cluster: LocalCluster) -> tuple[zlink.Node, zlink.Node, zlink.Node]:
    """Box made on node-2, node-3's route to it learned, then box moved to node-1: node-3's
    route is stale and node-2 relays. (target, relay, caller)."""
    target, relay, caller = cluster.nodes
    relay.client().spots.get_or_create("box", "t.rr.box").wait(WAIT)
    assert caller.client().request_to_spot("box", Where()).wait(WAIT) == relay.node_id
    relay.relocate_spot("box", target.node_id, timeout=WAIT)
    return target, relay, caller


def _taken_by(caller: zlink.Node, target: zlink.Node) -> bool:
    """Whether ``caller`` awaits its one pending call from ``target`` alone (it took it)."""
    pending = list(caller._runtime.router._pending.values())
    return len(pending) == 1 and pending[0][2:] == (target.node_id, 3, "")


def test_the_reply_of_a_relayed_request_goes_straight_to_its_caller(
    cluster: LocalCluster,
) -> None:
    target, relay, caller = _stale_route(cluster)
    asked = caller.client().request_to_spot("box", Held()).future()
    assert HOLDING.wait(WAIT)  # relayed by node-2, running on node-1
    until(lambda: _taken_by(caller, target), "the taker's notice")
    assert relay.counters().get("relayed_calls") == 1
    relay.shutdown(WAIT)  # the relay keeps no part of it: its stop fails nothing
    HOLD.set()
    assert asked.result(WAIT) == target.node_id
    assert [target.node_id] == RAN
    for node in (target, caller):
        assert not node.counters().get("replies_undeliverable")
        assert not node.counters().get("late_replies")


def test_a_relayed_request_fails_at_once_when_the_node_running_it_goes_down(
    cluster: LocalCluster,
) -> None:
    """Before, the caller awaited the relay, which awaited the target, and the target's death
    reached the caller through the relay. Now the caller awaits the target itself, and the
    store's verdict on it still fails the call at once (the clock never moves: no deadline
    ends it)."""
    target, _relay, caller = _stale_route(cluster)
    asked = caller.client().request_to_spot("box", Held()).future()
    assert HOLDING.wait(WAIT)
    until(lambda: _taken_by(caller, target), "the taker's notice")
    assert cluster.store.unregister_node(target.node_id, target.incarnation)  # it dies:
    cluster.transport.detach(target.node_id)  # out of the store and out of reach
    with pytest.raises(zlink.Unavailable, match="down"):
        asked.result(WAIT)
    HOLD.set()
    target.shutdown(1.0)


def test_the_notice_of_the_later_relay_wins_in_whatever_order_they_arrive(
    cluster: LocalCluster,
) -> None:
    """A request relayed twice (node A to B, B to C): A says "to B" as it posts it, B says "I
    have it" as it takes it, then "to C", and C "I have it"; they come from three nodes and
    may cross. The last step is where the reply is awaited, whatever the order they come in;
    until a node took it, the loss of the node that relayed it fails the call too."""
    import itertools

    router = cluster.nodes[2]._runtime.router
    steps = [("n-b", 1, "n-a"), ("n-b", 1, None), ("n-c", 2, "n-b"), ("n-c", 2, None)]
    for order in itertools.permutations(steps):
        done = Completion()
        corr = router.register_pending(done, str, "n-a")
        for node, hops, relay in order:
            router.relayed_on(corr, node, hops, relay)
        assert router._pending[corr][2:] == ("n-c", 5, ""), order
        done.set("x", None)
        assert corr not in router._pending
    done = Completion()
    corr = router.register_pending(done, str, "n-a")
    router.relayed_on(corr, "n-b", 1, "n-a")  # in transit: n-a and n-b both await it
    assert router._pending[corr][2:] == ("n-b", 2, "n-a")
    done.set("x", None)
    router.relayed_on(corr, "n-d", 3, None)  # (answered already: nothing awaits it)
    assert corr not in router._pending


# -- a review of the first version (each test failed on it) --------------------------------
def test_a_relay_notice_heard_after_its_node_was_declared_down_still_fails_the_call_at_once(
    cluster: LocalCluster,
) -> None:
    """node-2 relays node-3's request to node-1 and tells node-3 (RelayedEnvelope) where its
    reply is awaited now. node-1 dies, and node-3 hears the store's verdict on it before
    node-2's notice (two different senders: nothing orders them). node-3 then rebinds the
    call to a node it already declared down, which no verdict will ever fail again: the call
    waits for its deadline. Before 77ecdc8, node-2 awaited node-1 itself and failed the call
    at node-3 with Unavailable at once when node-1 was declared down."""
    target, _relay, caller = _stale_route(cluster)
    router = caller._runtime.router
    assert router is not None
    original = router._handlers[wire.RelayedEnvelope]
    notices: list[wire.RelayedEnvelope] = []
    noticed = threading.Event()

    def late(env: wire.RelayedEnvelope) -> None:  # node-2's notice is on its way, slowly
        notices.append(env)
        noticed.set()

    router.handle(wire.RelayedEnvelope, late)
    asked = caller.client().request_to_spot("box", Held()).future()
    assert HOLDING.wait(WAIT)  # relayed by node-2, running on node-1
    assert noticed.wait(WAIT)
    before = caller.counters().get("peers_declared_down", 0)
    assert cluster.store.unregister_node(target.node_id, target.incarnation)  # it dies
    cluster.transport.detach(target.node_id)
    until(
        lambda: caller.counters().get("peers_declared_down", 0) > before,
        "node-3 declares node-1 down",
    )
    assert not asked.done()  # (awaited from node-2 still: not failed by that verdict)
    router.handle(wire.RelayedEnvelope, original)
    caller._runtime.infra.submit(original, notices[0])  # the notice arrives now
    with pytest.raises(zlink.Unavailable):
        asked.result(WAIT)  # fails: it waits for a deadline the clock never reaches
    HOLD.set()
    target.shutdown(1.0)


def test_a_request_relayed_into_a_paused_flow_is_not_left_to_its_deadline_by_the_relays_stop(
    cluster: LocalCluster,
) -> None:
    """node-1 has paused DATA from node-2 (its backlog of node-2's calls is full: the state
    the router's ``pause`` makes, set here directly). node-2 relays node-3's request to
    node-1 by a stale route: the transport holds it in the pause, and node-2 tells node-3
    its reply comes from node-1. node-2 then stops cleanly: nothing of the request is left
    there to wait for (its completion is RELAYED_ON), so the stop does not wait, and its
    detach drops the held frame (``data_lost``: ``frames_dropped_peer_down``, said to be
    failed when "the peer" is declared down, but node-1 is alive). node-3 awaits node-1,
    which never heard of it: the call waits for its deadline. Before 77ecdc8 node-2 awaited
    the reply itself and its stop failed the call with Unavailable at once. (Now the node that
    takes a relayed request tells its origin; until then the origin awaits the relay.)"""
    target, relay, caller = _stale_route(cluster)
    cluster.transport.pause(target.node_id, relay.node_id)
    asked = caller.client().request_to_spot("box", Where()).future()
    until(lambda: relay.counters().get("relayed_calls") == 1, "node-2 relays it")
    relay.shutdown(WAIT)
    try:
        outcome: object = asked.result(WAIT)  # the value (delivered), or Unavailable at once
    except zlink.Unavailable as exc:
        outcome = exc
    assert outcome == target.node_id or isinstance(outcome, zlink.Unavailable)
