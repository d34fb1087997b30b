"""Bad input at the public boundary (python-api §1, §4, §5, §7): a typed error at the call
site, before any queue changes, and the node goes on. Each case here was found by a probe
of every public call and failed before its fix."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock

SEEN: list[str] = []


class Odd:
    """No JSON form."""


class Bag(zlink.Message, type_name="t.bd.bag"):
    model_config = {"arbitrary_types_allowed": True}
    v: Any = None


class Enter(zlink.Message, type_name="t.bd.enter"):
    how: str


class Move(zlink.Request[str], type_name="t.bd.move"):
    what: str


class Fire(zlink.Message, type_name="t.bd.fire"):
    pass


class Get(zlink.Request[int], type_name="t.bd.get"):
    pass


def build_app(node: list[zlink.Node]) -> zlink.App:
    app = zlink.App("boundaries")

    @app.entry_spot("t.bd.lobby", actor="t.bd.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.bd.player")
    class Player(zlink.Actor):
        @zlink.handler
        def enter(self, msg: Enter) -> None:
            try:
                if msg.how == "unencodable":
                    self.context.join("room", Bag(v=Odd()))
                elif msg.how == "not-a-message":
                    self.context.join("room", "hello")  # type: ignore[arg-type]
                SEEN.append("accepted")
            except zlink.ZLinkError as exc:
                SEEN.append(type(exc).__name__)

    @app.user_spot("t.bd.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.n = 0

        @zlink.handler
        def move(self, req: Move) -> str:
            try:
                if req.what == "relocate":
                    node[0].relocate_spot("room", "node-2", timeout=WAIT)
                elif req.what == "drain":
                    node[0].drain(timeout=WAIT)
                elif req.what == "leave-none":
                    self.context.leave_actor(None)  # type: ignore[arg-type]
                elif req.what == "wait-idle":
                    node[0].wait_idle(WAIT)
                elif req.what == "disconnect-id":
                    self.context.disconnect_actor("p1")  # type: ignore[arg-type]
            except zlink.ZLinkError as exc:
                return type(exc).__name__
            return "accepted"

        @zlink.handler
        def fire(self, msg: Fire) -> Any:  # a def that returns a coroutine: a mistake
            self.n += 1
            return self._later()

        async def _later(self) -> None:
            SEEN.append("the coroutine ran")

        @zlink.handler
        def get(self, req: Get) -> int:
            return self.n

    return app


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


def test_a_join_request_that_cannot_cross_is_refused_at_join(make_node):
    """A Join's request that JSON cannot carry was accepted, then failed inside the Join's
    hold when the room was on another node: the Actor stayed held for good, no counter."""
    node = make_node(build_app([]))
    client = node.client()
    client.actors.create("t.bd.player", actor_id="p1").wait(WAIT)
    for how in ("unencodable", "not-a-message"):
        client.send_to_actor("p1", Enter(how=how)).submit()
    assert node.wait_idle(WAIT)
    assert SEEN == ["InvalidArgument", "InvalidArgument"]


def test_moves_and_drains_from_inside_a_handler_are_refused_at_once(clock: ManualClock):
    """``relocate_spot``/``drain`` from a handler blocked its worker for the whole timeout (a
    Spot moving itself never reached its own barrier); refused as ``wait()`` is (§4)."""
    holder: list[zlink.Node] = []
    with LocalCluster(build_app(holder), nodes=2, clock=clock, workers=2) as cluster:
        holder.append(cluster.node(0))
        client = cluster.node(0).client()
        client.spots.get_or_create("room", "t.bd.room").wait(WAIT)
        for what in ("relocate", "drain", "wait-idle"):
            assert client.request_to_spot("room", Move(what=what)).wait(WAIT) == (
                "InvalidOperation"
            )
        with pytest.raises(zlink.InvalidArgument):
            cluster.node(0).relocate_spot(["room"], "node-2")  # type: ignore[arg-type]
        with pytest.raises(zlink.InvalidArgument):
            cluster.node(0).relocate_spot("room", None)  # type: ignore[arg-type]


def test_membership_calls_take_an_actor_not_an_id_or_none(make_node):
    node = make_node(build_app([]))
    client = node.client()
    client.spots.get_or_create("room", "t.bd.room").wait(WAIT)
    for what in ("leave-none", "disconnect-id"):  # were AttributeError
        assert client.request_to_spot("room", Move(what=what)).wait(WAIT) == "InvalidArgument"


def test_a_def_one_way_handler_that_returns_a_coroutine_is_a_counted_error(make_node):
    """It was dropped unseen (a request's ran): now a handler error, counted and logged."""
    node = make_node(build_app([]))
    client = node.client()
    client.spots.get_or_create("room", "t.bd.room").wait(WAIT)
    client.send_to_spot("room", Fire()).submit()
    assert client.request_to_spot("room", Get()).wait(WAIT) == 1
    assert node.counters().get("handler_errors") == 1
    assert SEEN == []


def test_metadata_counts_against_the_lane_byte_limit(make_node):
    """Metadata was held with each message but never counted: 20 sends of 4 MiB metadata
    sat in a 1 MiB lane."""
    node = make_node(build_app([]), app_lane_bytes=64 * 1024)
    client = node.client()
    client.spots.get_or_create("room", "t.bd.room").wait(WAIT)
    with pytest.raises(zlink.ResourceExhausted):
        client.send_to_spot("room", Fire()).metadata("k", "v" * 100_000).submit()


def test_a_status_subscriber_that_raises_keyboard_interrupt_is_served_on(make_node, clock):
    """A BaseException from the callback ended the status thread for good."""
    node = make_node(build_app([]))
    calls: list[int] = []
    again = threading.Event()

    def callback(_status: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # (a subscriber's own failure)
        again.set()

    node.subscribe_status(callback)
    for _ in range(3):  # a status every status_interval, on the node's clock
        clock.advance(node.config.status_interval)
        assert node.wait_idle(WAIT)  # (built, on the publisher's thread: ticks not merged)
    assert again.wait(WAIT)


def test_one_wire_name_for_two_message_classes_of_different_modules_is_refused():
    """Two ``Draw`` classes in two modules with one explicit ``type_name``: the later one
    silently replaced the first (the check compared class names only)."""

    class Draw(zlink.Message, type_name="t.bd.draw"):
        n: int

    namespace = {"__module__": "elsewhere.cards", "__annotations__": {"label": str}}
    with pytest.raises(zlink.InvalidOperation, match="taken"):
        types.new_class(
            "Draw", (zlink.Message,), {"type_name": "t.bd.draw"}, lambda ns: ns.update(namespace)
        )
    assert Draw(n=1).n == 1


def test_constructors_and_registration_refuse_what_they_cannot_use():
    """Each raised an untyped error later (AttributeError at start, TypeError, ZMQError,
    UnicodeEncodeError) or was silently taken as something else (§2, §5)."""
    with pytest.raises(zlink.InvalidArgument, match="NodeConfig"):
        zlink.Node(zlink.App("a"), {"workers": 1})  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument, match="spot_id"):
        zlink.SpotRef(["room"], 1, "main", "node-1")  # type: ignore[arg-type]
    for bad in ("tcp://a\x00b:7000", "tcp://\ud800:7000"):
        with pytest.raises(zlink.InvalidArgument):
            zlink.connect(bad)
    app = zlink.App("bad-registrations")
    with pytest.raises(zlink.InvalidOperation, match="a Relocation"):
        app.user_spot("t.bd.r1", relocation="recreate")  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidOperation, match="a Relocation"):
        app.actor("t.bd.a1", relocation="disabled")  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidOperation, match="RelocationCoordination"):
        app.user_spot("t.bd.r2", relocation_coordination="APPLICATION_SIGNALED")  # type: ignore[arg-type]


def test_decorators_a_class_would_ignore_are_refused_at_registration():
    """A ``@zlink.handler`` under ``@classmethod`` was never bound ("no handler" at the first
    call); ``@timer_handler`` / ``@subscription`` on a Channel, or a subscription on an Actor,
    were ignored in silence (python-api §2: registration mistakes are InvalidOperation)."""
    app = zlink.App("ignored-decorators")

    class Bound(zlink.UserSpot):
        @classmethod
        @zlink.handler
        def get(cls, req: Get) -> int:
            return 1

    with pytest.raises(zlink.InvalidOperation, match="classmethod"):
        app.user_spot("t.bd.bound")(Bound)

    class Ticking:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.timer_handler("tick")
        def on_tick(self, tick: zlink.TimerTick) -> None:
            pass

    with pytest.raises(zlink.InvalidOperation, match="no timers"):
        app.channel("t.bd.ticking")(Ticking)

    class Listening(zlink.Actor):
        @zlink.subscription
        def on_news(self, event: Fire) -> None:
            pass

    with pytest.raises(zlink.InvalidOperation, match="Multicast"):
        app.actor("t.bd.listening")(Listening)


def test_a_timer_option_that_is_not_a_bool_is_refused():
    with pytest.raises(zlink.InvalidArgument, match="keeps_alive"):
        zlink.TimerOptions(keeps_alive="no")  # type: ignore[arg-type]  # (was taken as true)


def test_a_ref_of_another_mesh_closes_nothing_here(make_node):
    """``spots.close(ref)`` compared the id and generation only: a ref naming another mesh
    closed this mesh's Spot of that id."""
    node = make_node(build_app([]))
    ref = node.client().spots.get_or_create("room", "t.bd.room").wait(WAIT).spot_ref
    other = zlink.SpotRef(ref.spot_id, ref.object_generation, "another-mesh", ref.node_rid)
    assert node.client().spots.close(other) is False
    assert node.client().request_to_spot("room", Get()).wait(WAIT) == 0  # still serving
