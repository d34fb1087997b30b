"""Logical Multicast across the mesh: a publish reaches the subscribers on every node.

A publish made on a node is handed to its own subscribers (guide §1: matched payloads go to
the Spot queue) and sent, once, to every other node met then, on DATA, where each hands it to
its own; none relays it further. (A subscriber that moves while an event is on its way may get
it twice or miss it: README's known gap.) A publish never waits: a subscriber whose lane is full,
or a node whose outbox is past ``peer_outbound_submit_bytes``, misses it, counted
(``publish_dropped``, ``publish_dropped_outbox_full``; python-api §9: every drop counted with
its reason). Per-publisher order per subscriber holds while the publisher stays on its node.
"""

from __future__ import annotations

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster


class News(zlink.Message, type_name="t.mm.news"):
    n: int
    text: str = ""


class Join(zlink.Message, type_name="t.mm.join"):
    topic: str


class Heard(zlink.Request[list[int]], type_name="t.mm.heard"):
    pass


class Tell(zlink.Message, type_name="t.mm.tell"):
    topic: str
    first: int
    count: int


def build_app() -> zlink.App:
    app = zlink.App("mesh-multicast")

    @app.user_spot("t.mm.listener")
    class Listener(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.heard: list[int] = []

        @zlink.handler
        def join(self, msg: Join) -> None:
            self.context.subscribe(msg.topic)

        @zlink.handler
        def heard_(self, req: Heard) -> list[int]:
            return self.heard

        @zlink.handler
        def tell(self, msg: Tell) -> None:  # a Spot that publishes
            for n in range(msg.first, msg.first + msg.count):
                self.context.outbound.publish(msg.topic, News(n=n)).submit()

        @zlink.subscription
        def on_news(self, event: News, context: zlink.MessageContext) -> None:
            self.heard.append(event.n)

    return app


def _listener_on(node: zlink.Node, spot: str, topic: str = "news") -> None:
    client = node.client()
    client.spots.get_or_create(spot, "t.mm.listener").wait(WAIT)
    client.send_to_spot(spot, Join(topic=topic)).wait(WAIT)
    assert client.request_to_spot(spot, Heard()).wait(WAIT) == []  # (after the Join: joined)


def _heard(node: zlink.Node, spot: str) -> list[int]:
    return node.client().request_to_spot(spot, Heard()).wait(WAIT)


def test_a_publish_reaches_the_subscribers_on_every_node_once():
    """A subscriber on each of three nodes; a publish made on any node reaches each of them
    exactly once (before, only those on the node where it was made)."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        for node, spot in ((n1, "l1"), (n2, "l2"), (n3, "l3")):
            _listener_on(node, spot)
        n1.client().publish("news", News(n=1)).wait(WAIT)  # from a client of node-1
        n2.client().send_to_spot("l2", Tell(topic="news", first=2, count=1)).wait(WAIT)
        n3.client().publish("news", News(n=3)).submit()
        cluster.wait_idle(WAIT)
        for node, spot in ((n1, "l1"), (n2, "l2"), (n3, "l3")):
            until(lambda node=node, spot=spot: len(_heard(node, spot)) == 3, f"{spot} hears 3")
            assert sorted(_heard(node, spot)) == [1, 2, 3]
        assert not any(k.startswith("publish_") for node in cluster.nodes for k in node.counters())


def test_a_publishers_events_reach_a_subscriber_on_another_node_in_order():
    """Per-publisher order per subscriber: one Spot's 200 events, in the order it made them."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")
        _listener_on(n1, "near")
        n1.client().send_to_spot("near", Tell(topic="news", first=0, count=200)).wait(WAIT)
        until(lambda: len(_heard(n2, "far")) == 200, "every event heard on node-2")
        assert _heard(n2, "far") == list(range(200))
        assert _heard(n1, "near") == list(range(200))


def test_a_publish_too_large_to_cross_fails_at_the_call_site_and_reaches_no_one():
    """A mesh carries an event in one frame: one too large for it is ``InvalidArgument`` where
    the publish is made, before any subscriber, here or elsewhere, has it (as a send's)."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n1, "near")
        _listener_on(n2, "far")
        big = News(n=1, text="x" * (zlink.mesh.wire.MAX_FRAME_BYTES + 1))
        with pytest.raises(zlink.InvalidArgument):
            n1.client().publish("news", big).submit()
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [2], "the next one heard on node-2")
        assert _heard(n1, "near") == [2]


def test_a_publish_that_meets_a_full_outbox_misses_that_node_counted_not_the_others():
    """A publish never waits: a node whose outbox to a peer is past
    ``peer_outbound_submit_bytes`` does not send that peer the event (counted,
    ``publish_dropped_outbox_full``); its own subscribers have it, and the publish succeeds."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n1, "near")
        _listener_on(n2, "far")
        outbox = n1._runtime.router.outbox
        with outbox._lock:  # as if node-2 took nothing for a while
            outbox._bytes["node-2"] = outbox._bytes.get("node-2", 0) + outbox.submit_limit
        try:
            n1.client().publish("news", News(n=1)).wait(WAIT)
        finally:
            with outbox._lock:
                outbox._bytes["node-2"] -= outbox.submit_limit
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [2], "node-2 hears the second only")
        assert _heard(n1, "near") == [1, 2]
        assert n1.counters().get("publish_dropped_outbox_full") == 1


def test_a_node_met_but_not_yet_up_gets_the_publish_once_it_is(monkeypatch):
    """Found by review: over ZeroMQ ``peers()`` lists the nodes that are up, while a send also
    goes to one still connecting (met a moment ago, or again after its connection dropped),
    kept until it is up; a publish skipped such a node, counted nowhere. It goes to every
    node met, as a send would. (The in-process transport has no connecting state: its
    ``peers`` is made to answer as ZeroMQ's would, with node-2 connecting.)"""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")
        real = cluster.transport.peers

        def peers(connecting: bool = False) -> list[str]:
            return real() if connecting else [p for p in real() if p != "node-2"]

        monkeypatch.setattr(cluster.transport, "peers", peers)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        monkeypatch.undo()
        until(lambda: _heard(n2, "far") == [1], "node-2 hears it")
