"""Review session 42: faults found in the changes since ab8bd87, each test failing first.

Deterministic: events and futures with bounded waits; the manual clock never moves unless a
test says so (what ends here ends by a reply or a verdict, never by a deadline).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.mesh import wire
from zlink.testing import LocalCluster, ManualClock

HOLD = threading.Event()  # released: a held handler answers
HOLDING = threading.Event()  # a held handler runs


class Where(zlink.Request[str], type_name="t.rv42.where"):
    pass


class Held(zlink.Request[str], type_name="t.rv42.held"):
    pass


def _node(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


def build_app() -> zlink.App:
    app = zlink.App("review-session-42")

    @app.user_spot("t.rv42.box", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Box(zlink.UserSpot):
        @zlink.handler
        def where(self, req: Where) -> str:
            return _node(self.context)

        @zlink.handler
        def held(self, req: Held) -> str:
            HOLDING.set()
            assert HOLD.wait(4 * WAIT)  # (released by the test, or at its end)
            return _node(self.context)

    return app


@pytest.fixture
def cluster(clock: ManualClock) -> Iterator[LocalCluster]:
    HOLD.clear()
    HOLDING.clear()
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=60.0) as c:
        try:
            yield c
        finally:
            HOLD.set()


def _stale_route(cluster: LocalCluster) -> tuple[zlink.Node, zlink.Node, zlink.Node]:
    """box made on node-2, node-3's route to it learned, then box moved to node-1: node-3's
    route is stale and node-2 relays. (target, relay, caller)."""
    target, relay, caller = cluster.nodes
    relay.client().spots.get_or_create("box", "t.rv42.box").wait(WAIT)
    assert caller.client().request_to_spot("box", Where()).wait(WAIT) == relay.node_id
    relay.relocate_spot("box", target.node_id, timeout=WAIT)
    return target, relay, caller


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
