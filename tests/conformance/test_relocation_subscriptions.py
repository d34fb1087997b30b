"""A Spot's Logical Multicast subscriptions move with it (python-api §7: ``relocate_spot``
moves the "whole User Spot with actors, queues, timers"; kotlin-spot-interface: "The target
restores the logical timer registration, so the application does not register the timer
again"; guide §1: matched Logical Multicast payloads go to the Spot queue).

The seeds do not name subscriptions in the relocation payload. This file holds them to the
rule the seeds state for the other registration the framework keeps for a Spot, its logical
timers: what the Spot registered is part of the Spot, not of its host, so it travels with the
move and the application does not register it again. After the move, events published on the
node where the Spot now lives reach it as they did before the move, and the source no longer
lists it. A move that does not happen (python-api §8 "A DeadlineExceeded ... means the move did
not happen"; §11 "A relocation whose restore keeps failing ... is aborted") leaves the
subscriptions on the source, and the target keeps none. A publish reaches the subscribers on
the node where it is made (Logical Multicast does not cross nodes), so each test publishes on
the node where the Spot lives.
"""

from __future__ import annotations

from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class News(zlink.Message, type_name="t.rs.news"):
    text: str


class Sub(zlink.Message, type_name="t.rs.sub"):
    topic: str
    on: bool = True


class Heard(zlink.Request[list[str]], type_name="t.rs.heard"):
    pass


def _node() -> str:
    turn = zlink.executor.current_turn()
    assert turn is not None and turn.owner is not None
    return turn.owner.ref.rt.node_id  # type: ignore[no-any-return]


class Listener(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.heard: list[str] = []  # "node:topic:text" of every event handled

    @zlink.handler
    def sub(self, msg: Sub) -> None:
        if msg.on:
            self.context.subscribe(msg.topic)
        else:
            self.context.unsubscribe(msg.topic)

    @zlink.handler
    def get_heard(self, req: Heard) -> list[str]:
        return self.heard

    @zlink.subscription
    def on_news(self, event: News, context: zlink.MessageContext) -> None:
        self.heard.append(f"{_node()}:{context.topic}:{event.text}")


class Unrestorable(zlink.JsonStateAdapter):
    def restore(self, instance: Any, data: bytes) -> None:
        raise RuntimeError("cannot restore")


class SubscribesWhenMade(Listener):
    """A ``recreate()`` Spot that subscribes in ``on_initialize``, which fails on node-2."""

    def on_initialize(self) -> None:
        self.context.subscribe("made")
        if _node() == "node-2":
            raise RuntimeError("cannot start on node-2")


def build_app() -> zlink.App:
    app = zlink.App("relocation-subscriptions")
    json_state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.rs.listener", relocation=json_state)(type("L1", (Listener,), {}))
    app.user_spot("t.rs.fresh", relocation=zlink.Relocation.recreate())(type("L2", (Listener,), {}))
    app.user_spot("t.rs.stuck", relocation=zlink.Relocation.preserve_state(Unrestorable))(
        type("L3", (Listener,), {})
    )
    app.user_spot("t.rs.made", relocation=zlink.Relocation.recreate())(SubscribesWhenMade)
    app.user_spot(
        "t.rs.per_actor", mode=zlink.ExecutionMode.PER_ACTOR, relocation=zlink.Relocation.recreate()
    )(type("L4", (Listener,), {}))
    return app


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, request_timeout=20.0) as c:
        yield c


def _listener(cluster: LocalCluster, spot_id: str, spot_type: str, *topics: str) -> None:
    """``spot_id`` made on node-1 and subscribed there to ``topics``."""
    client = cluster.node(0).client()
    client.spots.get_or_create(spot_id, spot_type).wait(WAIT)
    for topic in topics:
        client.send_to_spot(spot_id, Sub(topic=topic)).submit()
    cluster.wait_idle(WAIT)


def _publish(node: zlink.Node, topic: str, text: str) -> None:
    node.client().publish(topic, News(text=text)).submit()


def _heard(node: zlink.Node, spot_id: str) -> list[str]:
    out: list[str] = node.client().request_to_spot(spot_id, Heard()).wait(WAIT)
    return out


def _listed(node: zlink.Node, spot_id: str) -> set[str]:
    """The topics ``node``'s topic table lists ``spot_id`` under."""
    return {topic for topic, ids in node._runtime.topics.items() if spot_id in ids}


@pytest.mark.parametrize("spot_type", ["t.rs.listener", "t.rs.fresh", "t.rs.per_actor"])
def test_a_moved_spot_hears_events_published_where_it_now_lives(cluster, spot_type):
    n1, n2 = cluster.nodes
    _listener(cluster, "a", spot_type, "sports", "weather")
    _publish(n1, "sports", "before")
    cluster.wait_idle(WAIT)
    assert _heard(n1, "a") == ["node-1:sports:before"]
    n1.relocate_spot("a", "node-2", timeout=WAIT)
    assert _listed(n1, "a") == set()  # the source no longer lists it
    assert _listed(n2, "a") == {"sports", "weather"}
    _publish(n2, "sports", "goal")
    _publish(n2, "weather", "rain")
    _publish(n2, "other", "void")
    cluster.wait_idle(WAIT)
    heard = _heard(n2, "a")
    assert heard[-2:] == ["node-2:sports:goal", "node-2:weather:rain"]
    n2.client().send_to_spot("a", Sub(topic="sports", on=False)).submit()  # still its own
    n2.client().send_to_spot("a", Sub(topic="chess")).submit()
    cluster.wait_idle(WAIT)
    _publish(n2, "sports", "ignored")
    _publish(n2, "chess", "mate")
    cluster.wait_idle(WAIT)
    assert _heard(n2, "a")[len(heard) :] == ["node-2:chess:mate"]
    assert _listed(n2, "a") == {"weather", "chess"}


def test_an_event_queued_when_the_spot_moves_is_handled_on_the_target_with_its_topic(cluster):
    n1, n2 = cluster.nodes
    _listener(cluster, "a", "t.rs.listener", "sports")
    act = n1._runtime.spots["a"]
    assert act.gate._flag.acquire(False)  # hold the gate: the event waits in the queue
    _publish(n1, "sports", "queued")
    moving = n1._runtime.relocator.start(act, "node-2")
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn runs first (lifecycle lane)
    moving.wait(WAIT)
    _publish(n2, "sports", "after")
    cluster.wait_idle(WAIT)
    assert _heard(n2, "a") == ["node-2:sports:queued", "node-2:sports:after"]


def test_an_unsubscribe_on_the_target_holds_when_the_spot_moves_back(cluster):
    """The source keeps nothing of a moved Spot's subscriptions: a topic the Spot left on
    the target does not come back to it when it returns."""
    n1, n2 = cluster.nodes
    _listener(cluster, "a", "t.rs.listener", "sports", "weather")
    n1.relocate_spot("a", "node-2", timeout=WAIT)
    n2.client().send_to_spot("a", Sub(topic="sports", on=False)).submit()
    cluster.wait_idle(WAIT)
    n2.relocate_spot("a", "node-1", timeout=WAIT)
    assert _listed(n1, "a") == {"weather"} and _listed(n2, "a") == set()
    _publish(n1, "sports", "left")
    _publish(n1, "weather", "sun")
    cluster.wait_idle(WAIT)
    assert _heard(n1, "a") == ["node-1:weather:sun"]


def test_a_move_whose_restore_keeps_failing_leaves_the_subscriptions_on_the_source(cluster):
    """python-api §11: the aborted move leaves the Spot serving on the source as it was."""
    n1, n2 = cluster.nodes
    _listener(cluster, "a", "t.rs.stuck", "sports")
    with pytest.raises(zlink.StateIncompatible, match="restore failed"):
        n1.relocate_spot("a", "node-2", timeout=WAIT)
    assert _listed(n1, "a") == {"sports"} and _listed(n2, "a") == set()
    _publish(n1, "sports", "still here")
    cluster.wait_idle(WAIT)
    assert _heard(n1, "a") == ["node-1:sports:still here"]


def test_a_target_that_gives_up_keeps_no_subscription_its_restore_made(cluster):
    """A ``recreate()`` Spot subscribes again in ``on_initialize`` on the target; that restore
    fails past its retries: the target forgets its copy, its subscriptions too."""
    n1, n2 = cluster.nodes
    _listener(cluster, "m", "t.rs.made", "sports")
    with pytest.raises(zlink.StateIncompatible, match="restore failed"):
        n1.relocate_spot("m", "node-2", timeout=WAIT)
    assert _listed(n1, "m") == {"made", "sports"} and _listed(n2, "m") == set()
    assert "m" not in n2._runtime.spots


def test_a_withdrawn_move_leaves_the_subscriptions_on_the_source(cluster, clock):
    """python-api §8: a move whose deadline passes before its commit did not happen."""
    n1, n2 = cluster.nodes
    _listener(cluster, "a", "t.rs.listener", "sports")
    act = n1._runtime.spots["a"]
    assert act.gate._flag.acquire(False)  # hold the gate: the barrier cannot run in time
    moving = n1._runtime.relocator.start(act, "node-2", timeout=10.0)
    clock.advance(10.0)
    with pytest.raises(zlink.DeadlineExceeded, match="withdrawn"):
        moving.wait(WAIT)
    n1._runtime.pool.submit(act.gate._run)  # the gate goes on
    cluster.wait_idle(WAIT)
    assert _listed(n1, "a") == {"sports"} and _listed(n2, "a") == set()
    _publish(n1, "sports", "still here")
    cluster.wait_idle(WAIT)
    assert _heard(n1, "a") == ["node-1:sports:still here"]
