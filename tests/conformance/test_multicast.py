"""Logical Multicast (guide §1: matched payloads go to the Spot queue; Instance Spots refuse
subscription at registration; §16: publish offers no Yield)."""

from __future__ import annotations

import pytest

import zlink
from tests.conftest import WAIT


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
    with pytest.warns(RuntimeWarning, match="never given a terminal"):  # built, not sent
        assert not hasattr(client.publish("t", News(text="x")), "yield_")
    with pytest.raises(zlink.InvalidArgument):
        client.publish("t", Heard())  # a request is not an event
    with pytest.raises(zlink.InvalidArgument):
        client.publish("", News(text="x"))
