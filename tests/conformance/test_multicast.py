"""Logical Multicast (guide §1: matched payloads go to the Spot queue; Instance Spots refuse
subscription at registration; §16: publish offers no Yield).

A subscription belongs to its Spot's incarnation on its node: a Spot that stops living here
(closed, evicted, failed to activate, or dropped when its node fences itself, python-api §10
"Failure") leaves the topic table with it, so a later incarnation under the same id starts
with none. (Relocation, which takes them along: ``test_relocation_subscriptions.py``.)"""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT, refuse_renewals, warns_unended
from zlink.testing import LocalCluster, ManualClock


class News(zlink.Message, type_name="t.mc.news"):
    text: str


class Other(zlink.Message, type_name="t.mc.other"):
    pass


class Join(zlink.Message, type_name="t.mc.join"):
    topic: str
    on: bool = True


class Heard(zlink.Request[list[str]], type_name="t.mc.heard"):
    pass


class Ask(zlink.Request[str], type_name="t.mc.ask"):
    pass


FRAGILE: list[int] = []  # activations of "t.mc.fragile" so far
CLOSING_STARTED, LET_CLOSE = threading.Event(), threading.Event()  # "t.mc.slow_close"


def build_app() -> zlink.App:
    app = zlink.App("multicast")

    @app.user_spot("t.mc.listener")
    class Listener(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.heard: list[str] = []

        @zlink.handler
        def join(self, msg: Join) -> None:
            if msg.on:
                self.context.subscribe(msg.topic)
            else:
                self.context.unsubscribe(msg.topic)

        @zlink.handler
        def heard_(self, req: Heard) -> list[str]:
            return self.heard

        @zlink.subscription
        def on_news(self, event: News, context: zlink.MessageContext) -> None:
            self.heard.append(f"{context.topic}:{event.text}")

    @app.user_spot("t.mc.fragile")
    class Fragile(Listener):
        def on_initialize(self) -> None:  # the first one subscribes, then fails
            FRAGILE.append(1)
            if len(FRAGILE) == 1:
                self.context.subscribe("t")
                raise RuntimeError("first activation fails")

    @app.user_spot("t.mc.slow_close")
    class SlowClose(Listener):
        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSING_STARTED.set()
            assert LET_CLOSE.wait(WAIT)

    @app.instance_spot("t.mc.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        def ask(self, req: Ask) -> str:
            try:
                self.context.subscribe("x")
            except zlink.InvalidOperation:
                return "InvalidOperation"
            return "subscribed"

    return app


def _listeners(node: zlink.Node, *ids: str) -> None:
    client = node.client()
    for spot_id in ids:
        client.spots.get_or_create(spot_id, "t.mc.listener").wait(WAIT)


def _heard(node: zlink.Node, spot_id: str) -> list[str]:
    out: list[str] = node.client().request_to_spot(spot_id, Heard()).wait(WAIT)
    return out


def test_a_published_event_reaches_every_subscribed_spot_through_its_queue(make_node):
    node = make_node(build_app())
    client = node.client()
    _listeners(node, "a", "b", "c")
    client.send_to_spot("a", Join(topic="sports")).submit()
    client.send_to_spot("b", Join(topic="sports")).submit()
    client.send_to_spot("c", Join(topic="weather")).submit()
    node.wait_idle(WAIT)
    client.publish("sports", News(text="goal")).submit()
    client.publish("weather", News(text="rain")).submit()
    client.publish("nobody-listens", News(text="void")).submit()
    node.wait_idle(WAIT)
    assert _heard(node, "a") == ["sports:goal"]
    assert _heard(node, "b") == ["sports:goal"]
    assert _heard(node, "c") == ["weather:rain"]


def test_unsubscribed_and_closed_spots_receive_nothing_more(make_node):
    node = make_node(build_app())
    client = node.client()
    _listeners(node, "a", "b")
    for spot_id in ("a", "b"):
        client.send_to_spot(spot_id, Join(topic="t")).submit()
    node.wait_idle(WAIT)
    client.send_to_spot("a", Join(topic="t", on=False)).submit()
    ref_b = node._runtime.spots["b"].ref
    node.wait_idle(WAIT)
    client.spots.close(ref_b)
    node.wait_idle(WAIT)
    client.publish("t", News(text="late")).submit()
    node.wait_idle(WAIT)
    assert _heard(node, "a") == []
    assert "t" not in node._runtime.topics


def test_an_event_type_a_subscriber_cannot_handle_is_counted_not_delivered(make_node):
    node = make_node(build_app())
    client = node.client()
    _listeners(node, "a")
    client.send_to_spot("a", Join(topic="t")).submit()
    node.wait_idle(WAIT)
    client.publish("t", Other()).submit()
    node.wait_idle(WAIT)
    assert node.counters()["publish_unhandled"] == 1


def test_instance_spots_refuse_subscription_at_registration_and_at_run_time(make_node):
    app = zlink.App("bad")
    with pytest.raises(zlink.InvalidOperation, match="Multicast"):

        @app.instance_spot("t.mc.bad")
        class Bad(zlink.InstanceSpot):
            @zlink.subscription
            def on_news(self, event: News) -> None: ...

    node = make_node(build_app())
    assert node.client().request_to_spot("i", Ask()).instance_spot().wait(WAIT) == (
        "InvalidOperation"
    )


def test_publish_offers_no_yield_and_refuses_bad_payloads(make_node):
    node = make_node(build_app())
    client = node.client()
    with warns_unended():  # built, not sent
        assert not hasattr(client.publish("t", News(text="x")), "yield_")
    with pytest.raises(zlink.InvalidArgument):
        client.publish("t", Heard())  # a request is not an event
    with pytest.raises(zlink.InvalidArgument):
        client.publish("", News(text="x"))


def test_an_evicted_spot_leaves_the_topic_table(make_node, clock: ManualClock):
    node = make_node(build_app(), idle_timeout=10.0)
    _listeners(node, "a")
    node.client().send_to_spot("a", Join(topic="t")).submit()
    node.wait_idle(WAIT)
    assert node._runtime.topics["t"] == {"a"}
    for _ in range(8):
        clock.advance(2.5)
        node.wait_idle(WAIT)
    assert "a" not in node._runtime.spots
    assert "t" not in node._runtime.topics


def test_a_spot_that_fails_to_activate_leaves_no_subscription_behind(make_node):
    """Its next incarnation under the same id hears nothing it did not subscribe to."""
    FRAGILE.clear()
    node = make_node(build_app())
    client = node.client()
    with pytest.raises(zlink.ZLinkError):
        client.spots.get_or_create("f", "t.mc.fragile").wait(WAIT)
    node.wait_idle(WAIT)
    assert "t" not in node._runtime.topics
    client.spots.get_or_create("f", "t.mc.fragile").wait(WAIT)
    client.publish("t", News(text="not for you")).submit()
    node.wait_idle(WAIT)
    assert _heard(node, "f") == []


def test_a_node_that_fences_itself_drops_its_spots_subscriptions(clock: ManualClock):
    """python-api §10 "Failure": a node that cannot renew its lease drops its Spots (they may
    live elsewhere next); their subscriptions go with them."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1 = cluster.node(0)
        _listeners(n1, "a")
        n1.client().send_to_spot("a", Join(topic="t")).submit()
        cluster.wait_idle(WAIT)
        assert n1._runtime.topics["t"] == {"a"}
        refuse_renewals(cluster.store, "node-1")
        for _ in range(12):  # 3 s: it fences itself before its lease can lapse
            if n1.counters().get("self_fenced"):
                break
            clock.advance(0.25)
            cluster.wait_idle(WAIT)
        assert n1.counters().get("self_fenced") == 1
        assert "a" not in n1._runtime.spots
        assert "t" not in n1._runtime.topics


def test_the_context_of_a_spot_that_is_gone_cannot_subscribe_it_again(make_node):
    node = make_node(build_app())
    _listeners(node, "a")
    act = node._runtime.spots["a"]
    context = act.instance.context
    assert node.client().spots.close(act.ref)
    node.wait_idle(WAIT)
    with pytest.raises(zlink.Unavailable, match="no longer lives"):
        context.subscribe("t")
    context.unsubscribe("t")  # a no-op
    assert "t" not in node._runtime.topics


def test_the_context_of_a_closed_spot_touches_not_the_next_one_under_its_id(make_node):
    """A subscription belongs to an incarnation: the context of a closed Spot neither
    subscribes nor unsubscribes the Spot made next under the same id."""
    node = make_node(build_app())
    client = node.client()
    _listeners(node, "a")
    old = node._runtime.spots["a"]
    context = old.instance.context
    assert client.spots.close(old.ref)
    node.wait_idle(WAIT)
    _listeners(node, "a")  # a new incarnation
    client.send_to_spot("a", Join(topic="t")).submit()
    node.wait_idle(WAIT)
    with pytest.raises(zlink.Unavailable, match="no longer lives"):
        context.subscribe("u")
    context.unsubscribe("t")  # a no-op: not its subscription
    assert node._runtime.topics.get("t") == {"a"} and "u" not in node._runtime.topics


def test_an_event_a_closing_subscriber_cannot_take_is_counted(make_node):
    """Nothing accepted is lost silently: a publish that meets a subscriber past READY (closing
    here; sealed for a move the same way) counts it as ``publish_missed_<state>``."""
    CLOSING_STARTED.clear()
    LET_CLOSE.clear()
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("s", "t.mc.slow_close").wait(WAIT).spot_ref
    client.send_to_spot("s", Join(topic="t")).submit()
    node.wait_idle(WAIT)
    closed = threading.Thread(target=client.spots.close, args=(ref,))
    closed.start()
    try:
        assert CLOSING_STARTED.wait(WAIT)
        client.publish("t", News(text="too late")).submit()
    finally:
        LET_CLOSE.set()
        closed.join(WAIT)
    node.wait_idle(WAIT)
    assert node.counters()["publish_missed_closing"] == 1


def test_an_event_that_meets_a_subscriber_sealed_as_it_is_queued_counts_as_missed(make_node):
    """Found by a probe on 3.13t: a publish found the subscriber READY, and a seal (a move,
    a close) came before its queue took the event: the lane said CLOSED and the event was
    counted ``publish_dropped``, the name of a full lane. It is a missed event, counted under
    the subscriber's state (python-api §9: every drop counted once, under a name that says
    what it was). The seal is made here by closing its lanes as a move's seal does."""
    node = make_node(build_app())
    client = node.client()
    _listeners(node, "a")
    client.send_to_spot("a", Join(topic="t")).submit()
    node.wait_idle(WAIT)
    lanes = node._runtime.spots["a"].owner.lanes
    lanes.set_closed(True)  # the state is read READY; the lane refuses
    try:
        client.publish("t", News(text="sealed meanwhile")).submit()
    finally:
        lanes.set_closed(False)
    counters = node.counters()
    assert not counters.get("publish_dropped") and counters["publish_missed_sealed"] == 1
