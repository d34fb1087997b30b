"""Logical Multicast across the mesh: a publish reaches the subscribers on every node.

A publish made on a node is handed to its own subscribers (guide §1: matched payloads go to
the Spot queue) and sent, once, to every other node met then, on DATA, where each hands it to
its own; none relays it further. Each node numbers its events per topic, and a subscriber keeps
(and carries in its moves) the last number it took from each node: a subscriber that moves
while an event is on its way to its old node and its new one takes it once, and one that misses
both copies counts the miss when the next event of that node and topic reaches it
(``publish_missed_moving``). A publish never waits: a subscriber whose lane is full,
or a node whose outbox is past ``peer_outbound_submit_bytes``, misses it, counted
(``publish_dropped``, ``publish_dropped_outbox_full``; python-api §9: every drop counted with
its reason). Per-publisher order per subscriber holds while the publisher stays on its node.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest

import zlink
from tests.conftest import WAIT, held_at, until
from zlink.mesh import wire
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

    @app.user_spot(
        "t.mm.listener", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    )
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


@contextlib.contextmanager
def _outbox_full(node: zlink.Node, peer: str) -> Iterator[None]:
    """``node``'s outbox to ``peer`` counts as full meanwhile (as if it took nothing)."""
    outbox = node._runtime.router.outbox
    with outbox._lock:
        outbox._bytes[peer] = outbox._bytes.get(peer, 0) + outbox.submit_limit
    try:
        yield
    finally:
        with outbox._lock:
            outbox._bytes[peer] -= outbox.submit_limit


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
        with _outbox_full(n1, "node-2"):
            n1.client().publish("news", News(n=1)).wait(WAIT)
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


def _topic_events(env: wire.SendEnvelope) -> bool:
    return env.target_kind == "topic"


def test_a_subscriber_that_moves_while_an_event_is_on_its_way_takes_it_once():
    """Found by review: node-1's event reached the subscriber on node-2, which then moved to
    node-3, where node-1's second copy (another connection, slower) arrived after it: the
    subscriber had the event twice. Its move carries the last number it took from node-1 on
    the topic; the second copy is dropped, counted (``publish_duplicates_dropped``)."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        _listener_on(n2, "mover")
        at, release = held_at(n3, wire.SendEnvelope, _topic_events)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        assert at.wait(WAIT)  # node-3's copy is on its way
        until(lambda: _heard(n2, "mover") == [1], "the mover hears it on node-2")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        release()
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: len(_heard(n3, "mover")) >= 2, "the mover hears the next on node-3")
        cluster.wait_idle(WAIT)
        assert _heard(n3, "mover") == [1, 2]
        assert n3.counters().get("publish_duplicates_dropped") == 1
        assert not n3.counters().get("publish_missed_moving")


def test_a_subscriber_that_moves_past_both_copies_of_an_event_counts_the_miss():
    """Found by review: node-1's copy for node-3 arrived before the subscriber did, and its
    copy for node-2 after the subscriber had left: the event was missed, counted nowhere.
    Node-3 heard it before the subscriber opened there, past the subscriber's last number
    from node-1: counted as it opens, once (``publish_missed_moving``; python-api §9, every
    drop counted with its reason), not again when the next event shows the gap."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        _listener_on(n2, "mover")
        _listener_on(n3, "stays")
        n1.client().publish("news", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "mover") == [0] and _heard(n3, "stays") == [0], "both hear 0")
        at, release = held_at(n2, wire.SendEnvelope, _topic_events)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        assert at.wait(WAIT)  # node-2's copy is on its way
        until(lambda: _heard(n3, "stays") == [0, 1], "node-3 had its copy before the mover came")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        release()
        cluster.wait_idle(WAIT)
        assert n3.counters().get("publish_missed_moving") == 1  # as it opened
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n3, "mover") == [0, 2], "the mover hears the next on node-3")
        cluster.wait_idle(WAIT)
        counters = [node.counters() for node in cluster.nodes]
        assert sum(c.get("publish_missed_moving", 0) for c in counters) == 1
        assert not any(c.get("publish_missed_sealed") for c in counters)


def test_a_subscriber_that_subscribed_after_its_node_heard_the_topic_counts_its_first_miss():
    """A subscriber starts from what its node had heard on the topic when it subscribed: one
    that then misses the next event while moving (it was offered none before) counts it."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        _listener_on(n2, "early")
        _listener_on(n3, "stays")
        n1.client().publish("news", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "early") == [0] and _heard(n3, "stays") == [0], "0 heard")
        _listener_on(n2, "mover")  # after node-2 heard 0
        at, release = held_at(n2, wire.SendEnvelope, _topic_events)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        assert at.wait(WAIT)
        until(lambda: _heard(n3, "stays") == [0, 1], "node-3 had 1 before the mover came")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        release()
        cluster.wait_idle(WAIT)
        assert _heard(n3, "mover") == []
        assert n3.counters().get("publish_missed_moving") == 1


def test_a_first_event_on_a_topic_missed_while_moving_is_counted():
    """The last note's gap: a subscriber offered nothing yet from node-1 on its topic (node-2
    had heard node-1 only on another topic) kept no mark of node-1 there, so node-1's first
    event on it, missed on both nodes as the subscriber moved, was counted nowhere. It starts
    from what its node had heard of node-1 at all (python-api §9: every drop counted)."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        _listener_on(n2, "other", topic="weather")
        n1.client().publish("weather", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "other") == [0], "node-2 heard node-1")
        _listener_on(n2, "mover")
        _listener_on(n3, "stays")
        at, release = held_at(n2, wire.SendEnvelope, _topic_events)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        assert at.wait(WAIT)  # node-2's copy is on its way
        until(lambda: _heard(n3, "stays") == [1], "node-3 had 1 before the mover came")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        release()
        cluster.wait_idle(WAIT)
        assert _heard(n3, "mover") == []
        assert n3.counters().get("publish_missed_moving") == 1, n3.counters()
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n3, "mover") == [2], "the next heard on node-3")
        cluster.wait_idle(WAIT)
        counters = [node.counters() for node in cluster.nodes]
        assert sum(c.get("publish_missed_moving", 0) for c in counters) == 1


def test_an_event_of_the_subscribers_own_node_made_while_it_is_sealed_is_counted():
    """A subscriber's own node had made no event yet: the first, made while the subscriber
    was sealed for a move and heard on its new node before it arrived, was counted nowhere.
    A node knows its own numbers: a subscriber starts from them."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "mover")
        _listener_on(n1, "stays")
        at, release = held_at(n1, wire.RelocEnvelope)  # sealed, not yet arrived

        def move() -> None:
            n2.relocate_spot("mover", "node-1", WAIT)

        moving = threading.Thread(target=move)
        moving.start()
        try:
            assert at.wait(WAIT)
            n2.client().publish("news", News(n=1)).wait(WAIT)
            until(lambda: _heard(n1, "stays") == [1], "node-1 had 1 before the mover came")
        finally:
            release()
        moving.join(WAIT)
        assert not moving.is_alive()
        cluster.wait_idle(WAIT)
        assert _heard(n1, "mover") == []
        assert n1.counters().get("publish_missed_moving") == 1, n1.counters()
        assert not n2.counters().get("publish_missed_moving")


def test_events_made_while_a_subscriber_is_sealed_for_a_move_that_fails_are_counted():
    """A move withdrawn at its deadline (python-api §8): events that came to the subscriber's
    node while it was sealed were not offered to it (a move's other copy may reach it); the
    move did not happen, so they never will: counted as it serves again."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "mover")
        n1.client().publish("news", News(n=0)).wait(WAIT)
        n2.client().publish("news", News(n=10)).wait(WAIT)  # (a number from each node)
        until(lambda: sorted(_heard(n2, "mover")) == [0, 10], "0 and 10 heard")
        at, release = held_at(n1, wire.RelocEnvelope)  # the move never reaches node-1
        _aborted, release_abort = held_at(n1, wire.RelocAbortEnvelope)  # (in their order:
        # an abort handled before its move would leave node-1 a copy that never ends, and
        # its stop waits for arrivals)

        def move() -> None:
            with pytest.raises(zlink.DeadlineExceeded):
                n2.relocate_spot("mover", "node-1", 1.0)

        moving = threading.Thread(target=move)
        moving.start()
        try:
            assert at.wait(WAIT)  # sealed and shipped
            n1.client().publish("news", News(n=1)).wait(WAIT)
            n2.client().publish("news", News(n=2)).wait(WAIT)
            moving.join(WAIT)
            assert not moving.is_alive()
        finally:
            release()
            release_abort()
        cluster.wait_idle(WAIT)
        until(lambda: n2.counters().get("publish_missed_moving") == 2, "both counted")
        n1.client().publish("news", News(n=3)).wait(WAIT)
        until(lambda: _heard(n2, "mover")[2:] == [3], "the next heard")
        assert n2.counters().get("publish_missed_moving") == 2
        assert not n2.counters().get("publish_missed_sealed")


def test_a_subscriber_that_moved_back_and_forth_takes_each_event_once():
    """The last numbers a subscriber took go with it on every move: moved node-2 -> node-3 ->
    node-2 while node-1's copies for node-3 are held, it takes none of them twice."""
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        _listener_on(n2, "mover")
        at, release = held_at(n3, wire.SendEnvelope, _topic_events)
        for n in range(3):
            n1.client().publish("news", News(n=n)).wait(WAIT)
        assert at.wait(WAIT)
        until(lambda: _heard(n2, "mover") == [0, 1, 2], "heard on node-2")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        n3.relocate_spot("mover", "node-2", timeout=WAIT)
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        release()
        n1.client().publish("news", News(n=3)).wait(WAIT)
        until(lambda: len(_heard(n3, "mover")) >= 4, "the next heard on node-3")
        cluster.wait_idle(WAIT)
        assert _heard(n3, "mover") == [0, 1, 2, 3]
        assert n3.counters().get("publish_duplicates_dropped") == 3


def test_events_published_from_many_threads_at_once_reach_a_subscriber_once_each():
    """Events are numbered per node and topic in the order they are sent: publishers on four
    threads at once (a free-threaded node runs them in parallel) never make a subscriber on
    another node drop one as a copy, or count one as missed."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")
        _listener_on(n1, "near")
        client = n1.client()
        start = threading.Barrier(4)

        def publish(first: int) -> None:
            start.wait(WAIT)
            for n in range(first, first + 250):
                client.publish("news", News(n=n)).wait(WAIT)

        threads = [threading.Thread(target=publish, args=(k * 250,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        until(lambda: len(_heard(n2, "far")) >= 1000, "every event heard on node-2")
        cluster.wait_idle(WAIT)
        assert sorted(_heard(n2, "far")) == list(range(1000))
        assert sorted(_heard(n1, "near")) == list(range(1000))
        for node in cluster.nodes:
            assert not any(k.startswith("publish_") for k in node.counters())


class Rejoin(zlink.Message, type_name="t.mm.rejoin"):
    topic: str


def _rejoin_app() -> zlink.App:
    app = build_app()
    listener = app.spots["t.mm.listener"].cls

    class Rejoiner(listener):  # type: ignore[misc,valid-type]
        @zlink.handler
        def rejoin(self, msg: Rejoin) -> None:  # leaves the topic and joins it again
            self.context.unsubscribe(msg.topic)
            self.context.subscribe(msg.topic)

    app.user_spot(
        "t.mm.rejoiner", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    )(Rejoiner)
    return app


def test_an_event_a_node_never_heard_is_not_counted_again_by_its_subscribers():
    """Found by review: node-1's outbox was full for node-2, and the event it did not send was
    counted there (``publish_dropped_outbox_full``); node-2's subscriber, which never moved,
    then counted it again as ``publish_missed_moving`` at the next event (and so would every
    subscriber there: one loss, 1 + N counts under a false reason). A subscriber counts only
    what its node heard and it was not offered (python-api §9: every drop counted once)."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")
        n1.client().publish("news", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [0], "0 heard")
        with _outbox_full(n1, "node-2"):
            n1.client().publish("news", News(n=1)).wait(WAIT)
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [0, 2], "node-2 hears 2")
        cluster.wait_idle(WAIT)
        assert n1.counters().get("publish_dropped_outbox_full") == 1
        assert not n2.counters().get("publish_missed_moving"), n2.counters()


def test_a_subscriber_that_leaves_and_rejoins_its_topic_after_a_move_takes_no_event_twice():
    """Found by review: leaving the topic dropped the marks the subscriber had carried, and
    joining it again started from its new node's table, behind them (node-1's copy for
    node-3 was still on its way): that copy was taken again, ``[1, 1, 2]``. A mark ahead of
    what its node heard stays when it leaves a topic."""
    with LocalCluster(_rejoin_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        client = n2.client()
        client.spots.get_or_create("mover", "t.mm.rejoiner").wait(WAIT)
        client.send_to_spot("mover", Join(topic="news")).wait(WAIT)
        assert _heard(n2, "mover") == []  # (after the Join: joined; a send's wait() is its
        # admission, and a CI run once published before the Join ran)
        at, release = held_at(n3, wire.SendEnvelope, _topic_events)
        n1.client().publish("news", News(n=1)).wait(WAIT)
        assert at.wait(WAIT)  # node-3's copy is on its way
        until(lambda: _heard(n2, "mover") == [1], "the mover hears 1 on node-2")
        n2.relocate_spot("mover", "node-3", timeout=WAIT)
        n3.client().send_to_spot("mover", Rejoin(topic="news")).wait(WAIT)
        assert _heard(n3, "mover") == [1]  # (after the rejoin)
        release()
        n1.client().publish("news", News(n=2)).wait(WAIT)
        until(lambda: _heard(n3, "mover")[-1:] == [2], "2 heard on node-3")
        cluster.wait_idle(WAIT)
        assert _heard(n3, "mover") == [1, 2]


def test_events_skipped_while_sealed_are_counted_when_a_stop_closes_the_subscriber():
    """Found by review: a stop closed a subscriber sealed for a move (which then did not
    happen); the events its node heard while it was sealed were counted nowhere (it never
    opened again, where they are counted). They are counted as the move ends."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "mover")
        n1.client().publish("news", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "mover") == [0], "0 heard")
        at, release = held_at(n1, wire.RelocEnvelope)  # the move never reaches node-1

        def move() -> None:
            with pytest.raises(zlink.ZLinkError):  # (the stop aborts it)
                n2.relocate_spot("mover", "node-1", WAIT)

        moving = threading.Thread(target=move)
        moving.start()
        rt2 = n2._runtime
        try:
            assert at.wait(WAIT)  # sealed and shipped
            n1.client().publish("news", News(n=1)).wait(WAIT)
            until(lambda: rt2.events._heard_of("node-1", "news")[2] == 2, "node-2 had 1")
            assert rt2.spots["mover"].state.name == "SEALED"
            n2.shutdown(WAIT)  # (it closes the sealed subscriber, and the move is aborted)
            moving.join(WAIT)
            assert not moving.is_alive()
        finally:
            release()
        assert n2.counters().get("publish_missed_moving") == 1, n2.counters()


def test_a_node_gone_for_good_is_forgotten_by_the_event_tables_and_the_marks():
    """Found by review: what a node heard from each node, and every subscriber's marks, kept
    every node that ever published, for good (node ids that change at each restart grow them
    without bound). A node declared down, with no later incarnation met, is forgotten."""
    app = build_app()
    with LocalCluster(app, nodes=2, workers=2) as cluster:
        n2 = cluster.nodes[1]
        _listener_on(n2, "far")
        for i in range(3):  # nodes that come, publish once and leave (new ids: pods, say)
            node = zlink.Node(app, zlink.NodeConfig(node_id=f"tmp-{i}", workers=1),
                              store=cluster.store, transport=cluster.transport)  # fmt: skip
            node.start()
            try:
                node.client().publish("news", News(n=i)).wait(WAIT)
                until(lambda i=i: _heard(n2, "far")[-1:] == [i], f"{i} heard")
            finally:
                node.shutdown(WAIT)
        rt = n2._runtime
        live = {"node-1", "node-2"}
        until(lambda: set(rt.events._origins("news")) <= live, "node-2 forgets them")
        assert {origin for origin, _t in rt.spots["far"].event_marks or {}} <= live
        _listener_on(n2, "late")  # subscribes after all of them left
        assert {origin for origin, _t in rt.spots["late"].event_marks or {}} <= live


def test_a_peers_event_does_not_wait_for_a_publish_to_another_topic_on_its_node():
    """Found by review: one publish lock per node made node-2's infrastructure thread (which
    takes every peer's event) wait for any local publish's whole fan-out (69 ms for 5,000
    subscribers), replies and moves behind it. Events of one node and topic are ordered under
    a lock of that pair's stripe: another pair's publish holds another lock (here one that is
    held for good, as a long fan-out would)."""
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")
        events = n2._runtime.events
        theirs = events.lock("node-1", "news")
        other = next(
            t for t in (f"t{k}" for k in range(1000)) if events.lock("node-2", t) is not theirs
        )
        held, done = threading.Event(), threading.Event()

        def fan_out() -> None:  # a worker of node-2 publishing to another topic, at length
            with events.lock("node-2", other):
                held.set()
                done.wait(3 * WAIT)

        worker = threading.Thread(target=fan_out)
        worker.start()
        try:
            assert held.wait(WAIT)
            n1.client().publish("news", News(n=1)).wait(WAIT)
            until(lambda: _heard(n2, "far") == [1], "node-2 takes node-1's event meanwhile")
        finally:
            done.set()
            worker.join(WAIT)


class PausingMarks(dict):
    """A subscriber's marks: a plain dict, whose iteration by the infrastructure thread pauses
    once after its first key (where a thread switch can come inside the list comprehension
    of ``events.forget_node``, which holds no lock)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.armed, self.inside, self.go = False, threading.Event(), threading.Event()

    def __iter__(self):
        first = True
        for key in dict.__iter__(self):
            yield key
            if first and self.armed and threading.current_thread().name.startswith("zlink-infra"):
                first = self.armed = False
                self.inside.set()
                assert self.go.wait(WAIT)


def test_a_fault_forgetting_a_gone_nodes_events_does_not_stop_its_declaration(caplog):
    """Found by review: forgetting a gone node's Logical Multicast marks iterated each
    subscriber's marks on the infrastructure thread with no stripe held, while a local
    publish on another stripe added a key: ``RuntimeError`` (the dict changed size) escaped
    ``MeshRouter.declared_down`` before it dropped the routes, ended the moves and failed the
    calls awaiting the gone node (python-api §10 "Failure"). The marks are read as a
    snapshot taken in one step, and a fault there no longer stops the declaration."""
    app = build_app()
    with LocalCluster(app, nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _listener_on(n2, "far")  # marks: (node-1, news) after the next publish
        _listener_on(n2, "far", topic="other")  # no mark yet for (node-2, other)
        n1.client().publish("news", News(n=0)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [0], "0 heard")
        tmp = zlink.Node(
            app,
            zlink.NodeConfig(node_id="tmp", workers=1),
            store=cluster.store,
            transport=cluster.transport,
        ).start()
        tmp.client().publish("news", News(n=1)).wait(WAIT)
        until(lambda: _heard(n2, "far") == [0, 1], "1 heard")
        rt2 = n2._runtime
        act = rt2.spots["far"]
        marks = act.event_marks = PausingMarks(act.event_marks)
        marks.armed = True
        tmp.shutdown(WAIT)  # node-2 declares it down: events_node_gone -> forget_node(marks)
        assert marks.inside.wait(WAIT)
        n2.client().publish("other", News(n=2)).wait(WAIT)  # a local publish meanwhile
        until(lambda: ("node-2", "other") in dict(marks), "the publish marked the subscriber")
        caplog.set_level(logging.ERROR)
        before = n2.counters().get("peers_declared_down", 0)
        marks.go.set()
        cluster.wait_idle(WAIT)
        counted = n2.counters().get("peers_declared_down", 0) - before
        # the declaration went through: routes, moves and awaited calls of the node ended
        # (a snapshot in one step is how the marks are read now; this dict's own iteration,
        # made to pause, still fails, and is said, not in the way)
        assert counted == 1
