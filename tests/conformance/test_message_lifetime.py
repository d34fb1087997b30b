"""A message lives as long as its turn needs it, no longer (execution-model §7, §8: the lane
returns its reservation once the turn is post-processed; nothing of the message is kept).

The runtime keeps no reference to a message once its handler has finished and the node is
idle: not in a size cache, a finished job or turn left in a slot, a context variable, or a
worker's frame. A large payload would otherwise stay alive until the next send (or forever,
on a node that goes quiet). Messages support weak references (pydantic models do), so each
test holds only a ``weakref`` and asks the garbage collector.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Blob(zlink.Message, type_name="t.ml.blob"):
    data: str


class Tagged(zlink.Message, type_name="t.ml.tagged"):
    data: str


class Slow(zlink.Message, type_name="t.ml.slow"):
    data: str


class Ask(zlink.Request[int], type_name="t.ml.ask"):
    data: str


class Event(zlink.Message, type_name="t.ml.event"):
    data: str


PAYLOAD = "x" * 100_000
HANDLED: list[weakref.ref[zlink.Message]] = []  # every message a handler got (on any node)


def _handled(msg: zlink.Message) -> None:
    if len(getattr(msg, "data", "")) >= len(PAYLOAD):  # not the small ones tests add
        HANDLED.append(weakref.ref(msg))


def build_app() -> zlink.App:
    app = zlink.App("lifetime")

    @app.user_spot("t.ml.box")
    class Box(zlink.UserSpot):
        def on_initialize(self) -> None:
            self.context.subscribe("news")

        @zlink.handler
        def blob(self, msg: Blob) -> None:  # a plain one-way handler: the light path
            _handled(msg)

        @zlink.handler
        def tagged(self, msg: Tagged, context: zlink.MessageContext) -> None:
            _handled(msg)

        @zlink.handler
        async def slow(self, msg: Slow) -> None:  # a coroutine turn with a suspension
            _handled(msg)
            await self.context.outbound.request_to_spot("other", Ask(data="")).yield_()

        @zlink.handler
        def ask(self, req: Ask) -> int:
            _handled(req)
            return len(req.data)

        @zlink.subscription
        def on_event(self, event: Event) -> None:
            _handled(event)

    @app.channel("t.ml.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def ask(self, req: Ask) -> int:
            _handled(req)
            return len(req.data)

    @app.entry_spot("t.ml.lobby", actor="t.ml.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.ml.player")
    class Player(zlink.Actor):
        @zlink.handler
        def blob(self, msg: Blob) -> None:
            _handled(msg)

    return app


Sender = Callable[[zlink.Client, str, Any], None]

SENDS: dict[str, tuple[Callable[[str], Any], Sender]] = {
    "send": (lambda d: Blob(data=d), lambda c, t, m: c.send_to_spot(t, m).submit()),
    "send-wait": (lambda d: Blob(data=d), lambda c, t, m: c.send_to_spot(t, m).wait(WAIT)),
    "send-metadata": (
        lambda d: Tagged(data=d),
        lambda c, t, m: c.send_to_spot(t, m).metadata("k", "v").submit(),
    ),
    "send-async-handler": (lambda d: Slow(data=d), lambda c, t, m: c.send_to_spot(t, m).submit()),
    "send-to-actor": (lambda d: Blob(data=d), lambda c, _t, m: c.send_to_actor("p", m).submit()),
    "request": (lambda d: Ask(data=d), lambda c, t, m: c.request_to_spot(t, m).wait(WAIT)),
    "request-timeout": (
        lambda d: Ask(data=d),
        lambda c, t, m: c.request_to_spot(t, m).timeout(30).wait(WAIT),
    ),
    "request-future": (
        lambda d: Ask(data=d),
        lambda c, t, m: c.request_to_spot(t, m).future().result(WAIT),
    ),
    "channel-request": (
        lambda d: Ask(data=d),
        lambda c, _t, m: c.request("t.ml.api", m).wait(WAIT),
    ),
    "channel-request-future": (
        lambda d: Ask(data=d),
        lambda c, _t, m: c.request("t.ml.api", m).future().result(WAIT),
    ),
    "batch": (
        lambda d: Blob(data=d),
        lambda c, t, m: c.send_many_to_spot(t, [m, Blob(data="")]).submit(),
    ),
    "batch-of-one": (lambda d: Blob(data=d), lambda c, t, m: c.send_many_to_spot(t, [m]).submit()),
    "publish": (lambda d: Event(data=d), lambda c, _t, m: c.publish("news", m).submit()),
}


@pytest.fixture(autouse=True)
def _forget_handled() -> Iterator[None]:
    HANDLED.clear()
    yield
    HANDLED.clear()


@pytest.fixture
def cluster(clock: ManualClock) -> Iterator[LocalCluster]:
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        client = cluster.node(0).client()
        client.spots.get_or_create("box", "t.ml.box").wait(WAIT)
        client.spots.get_or_create("other", "t.ml.box").wait(WAIT)
        client.actors.create("t.ml.player", actor_id="p").wait(WAIT)
        yield cluster


def _sent_and_forgotten(cluster: LocalCluster, node: int, how: str) -> weakref.ref[Any]:
    """Send one message ``how`` from ``node``, wait until every node is idle, and return a
    weak reference to it (the only reference this test keeps)."""
    make, send = SENDS[how]
    msg = make(PAYLOAD)
    ref = weakref.ref(msg)
    send(cluster.node(node).client(), "box", msg)
    del msg
    cluster.wait_idle(WAIT)
    gc.collect()
    return ref


def _assert_gone(ref: weakref.ref[Any], how: str) -> None:
    """The sent message and every copy a handler got are gone (a plain ``assert ref() is
    None`` would print a 100 kB repr)."""
    assert HANDLED, f"{how}: no handler got the message"
    outlived = ref() is not None
    assert not outlived, f"{how}: the sent message outlived its turn"
    kept = sum(r() is not None for r in HANDLED)
    assert not kept, f"{how}: {kept} handled message(s) outlived their turn"


@pytest.mark.parametrize("how", list(SENDS))
def test_a_message_is_collectable_once_its_handler_has_finished(cluster, how):
    ref = _sent_and_forgotten(cluster, 0, how)
    _assert_gone(ref, how)


@pytest.mark.parametrize("how", ["send", "send-metadata", "request", "request-timeout", "batch"])
def test_a_message_sent_to_another_node_is_collectable_once_handled(cluster, how):
    ref = _sent_and_forgotten(cluster, 1, how)
    _assert_gone(ref, how)


def _let_makers_free(cluster: LocalCluster) -> None:
    """On the free-threaded build, a str or bytes whose last reference a thread other than
    its maker drops is freed by its maker when that thread next runs (biased reference
    counting), not at once: give each infrastructure thread (the maker of the wire bytes and
    the decoded payload) one empty task. That also replaces what its loop last held, so the
    loop's own retention shows on the GIL build only; any other reference still shows here."""
    for node in cluster.nodes:
        node._infra.submit(_nothing)
    cluster.wait_idle(WAIT)


def _nothing() -> None:
    pass


def test_the_bytes_of_a_message_from_another_node_are_not_kept_once_handled(cluster):
    """A message from another node arrives as bytes, handed to the router by the
    infrastructure thread; nothing keeps them once the node is idle (bytes take no weak
    reference: the memory still allocated is measured instead)."""
    size = 4_000_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cluster.node(1).client().send_to_spot("box", Blob(data="x" * size)).submit()
        cluster.wait_idle(WAIT)
        if not getattr(sys, "_is_gil_enabled", lambda: True)():
            _let_makers_free(cluster)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert HANDLED, "the message never reached its handler"
    assert kept < size // 4, f"{kept} bytes still allocated after a {size}-byte message"
