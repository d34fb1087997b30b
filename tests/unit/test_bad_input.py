"""Bad input gets a clear, typed error at the boundary, and nothing accepted is lost."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT


class Put(zlink.Message, type_name="t.bi.put"):
    value: int


class Blob(zlink.Message, type_name="t.bi.blob"):
    data: str


class Get(zlink.Request[int], type_name="t.bi.get"):
    pass


class Unhandled(zlink.Message, type_name="t.bi.unhandled"):
    pass


def build_app(gate: threading.Event | None = None) -> zlink.App:
    app = zlink.App("bad")

    @app.user_spot("t.bi.box")
    class Box(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.values: list[int] = []

        @zlink.handler
        def put(self, msg: Put) -> None:
            if gate is not None:
                assert gate.wait(WAIT)
            self.values.append(msg.value)

        @zlink.handler
        def blob(self, msg: Blob) -> None:
            self.values.append(len(msg.data))

        @zlink.handler
        def get(self, req: Get) -> int:
            return sum(self.values)

    app.user_spot("t.bi.box2")(type("Box2", (Box,), {}))

    @app.entry_spot("t.bi.lobby", actor="t.bi.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.bi.player")
    class Player(zlink.Actor):
        pass

    @app.instance_spot("t.bi.single")
    class Single(zlink.InstanceSpot):
        @zlink.handler
        def get(self, req: Get) -> int:
            return 1

    return app


@pytest.fixture
def node(make_node):
    node = make_node(build_app())
    node.client().spots.get_or_create("box", "t.bi.box").wait(WAIT)
    return node


@pytest.mark.parametrize(
    "bad",
    ["", "x" * 256, "é" * 128, 42, None, b"box", "\ud800", "é\udfff", "x" * 70 + "\ud800"],
    ids=[
        "empty",
        "256",
        "utf8-256",
        "int",
        "none",
        "bytes",
        "surrogate",
        "utf8-surrogate",
        "long-surrogate",
    ],
)
def test_a_bad_spot_id_is_invalid_argument_at_the_call_site(node, bad):
    client = node.client()
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot(bad, Put(value=1))
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_actor(bad, Get())
    with pytest.raises(zlink.InvalidArgument):
        client.spots.get_or_create(bad, "t.bi.box")


class Probe(zlink.Request[list[str]], type_name="t.bi.probe"):
    bad: int  # an index into SURROGATES: a payload with a lone surrogate does not serialize


def _refusal(fn: Callable[[], object]) -> str:
    """The type name of what ``fn()`` raised, or ``"accepted"``."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - which type it is, is the point
        return type(exc).__name__
    return "accepted"


def _probe_app() -> zlink.App:
    """Handlers that hand a bad id to what only a handler can call: subscribe, join."""
    app = zlink.App("probe")

    @app.user_spot("t.bi.probe_spot")
    class ProbeSpot(zlink.UserSpot):
        @zlink.handler
        def probe(self, req: Probe) -> list[str]:
            ctx = self.context
            return [
                _refusal(lambda: ctx.subscribe(SURROGATES[req.bad])),
                _refusal(lambda: ctx.unsubscribe(SURROGATES[req.bad])),
            ]

    @app.entry_spot("t.bi.probe_lobby", actor="t.bi.probe_actor")
    class ProbeLobby(zlink.EntrySpot):
        pass

    @app.actor("t.bi.probe_actor")
    class ProbeActor(zlink.Actor):
        @zlink.handler
        def probe(self, req: Probe) -> list[str]:
            return [_refusal(lambda: self.context.join(SURROGATES[req.bad]))]

    return app


SURROGATES = ["\ud800", "a\udfffb", "é\ud800", "x" * 63 + "\ud800", "x" * 200 + "\udc00"]


@pytest.mark.parametrize("bad", SURROGATES, ids=["lone", "inner", "utf8", "64", "long"])
def test_an_id_that_is_not_valid_utf8_is_invalid_argument_wherever_an_id_is_taken(node, bad):
    """python-api §5: ids are 1..255 bytes of valid UTF-8; a lone surrogate has no UTF-8
    form, so it is refused at the call site whatever its length, never accepted to fail later
    (across nodes) with an untyped error."""
    client = node.client()
    put, get = Put(value=1), Get()
    calls: dict[str, Callable[[], object]] = {
        "send_to_spot": lambda: client.send_to_spot(bad, put),
        "request_to_spot": lambda: client.request_to_spot(bad, get),
        "send_to_actor": lambda: client.send_to_actor(bad, put),
        "request_to_actor": lambda: client.request_to_actor(bad, get),
        "send channel": lambda: client.send(bad, put),
        "request channel": lambda: client.request(bad, get),
        "send_many_to_spot": lambda: client.send_many_to_spot(bad, [put]),
        "send_many_to_actor": lambda: client.send_many_to_actor(bad, [put]),
        "publish topic": lambda: client.publish(bad, put),
        "spots.create type": lambda: client.spots.create(bad),
        "spots.get_or_create id": lambda: client.spots.get_or_create(bad, "t.bi.box"),
        "spots.get_or_create type": lambda: client.spots.get_or_create("box", bad),
        "actors.create type": lambda: client.actors.create(bad),
        "actors.create id": lambda: client.actors.create("t.bi.player", actor_id=bad),
        "actors.get_or_create id": lambda: client.actors.get_or_create(bad, "t.bi.player"),
        "actors.get_or_create type": lambda: client.actors.get_or_create("p", bad),
        "instance_spot type": lambda: client.request_to_spot("i", get).instance_spot(bad),
        "in_mesh": lambda: client.send_to_spot("box", put).in_mesh(bad),
        "create in_mesh": lambda: client.spots.create("t.bi.box").in_mesh(bad),
        "metadata key": lambda: client.send_to_spot("box", put).metadata(bad, "v"),
        "metadata value": lambda: client.send_to_spot("box", put).metadata("k", bad),
        "user_spot type": lambda: zlink.App("x").user_spot(bad),
        "actor type": lambda: zlink.App("x").actor(bad),
        "channel name": lambda: zlink.App("x").channel(bad),
        "timer name": lambda: zlink.timer_handler(bad),
    }
    refused = {what: _refusal(fn) for what, fn in calls.items()}
    assert refused == dict.fromkeys(calls, "InvalidArgument")
    with pytest.raises(zlink.InvalidArgument):

        class Named(zlink.Message, type_name=bad):
            pass

    assert node._runtime.spots["box"].owner.lanes.reserved() == (0, 0, 0, 0)


@pytest.mark.parametrize("bad", range(len(SURROGATES)), ids=["lone", "inner", "utf8", "64", "long"])
def test_a_handler_that_names_an_id_that_is_not_valid_utf8_gets_invalid_argument(make_node, bad):
    """python-api §5, for what a handler alone can do: subscribe, unsubscribe, join."""
    node = make_node(_probe_app())
    client = node.client()
    client.spots.get_or_create("probe", "t.bi.probe_spot").wait(WAIT)
    pid = client.actors.create("t.bi.probe_actor").wait(WAIT).actor_id
    assert client.request_to_spot("probe", Probe(bad=bad)).wait(WAIT) == ["InvalidArgument"] * 2
    assert client.request_to_actor(pid, Probe(bad=bad)).wait(WAIT) == ["InvalidArgument"]


def test_a_spot_id_of_255_utf8_bytes_is_accepted(node):
    client = node.client()
    longest = "é" * 127 + "x"  # 255 bytes
    assert client.spots.get_or_create(longest, "t.bi.box").wait(WAIT).spot_id == longest


def test_wrong_payload_types_are_invalid_argument_and_queue_nothing(node):
    client = node.client()
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot("box", {"value": 1})  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot("box", Get())  # a request sent one-way
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_spot("box", Put(value=1))  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument, match="no handler"):
        client.send_to_spot("box", Unhandled()).submit()
    with pytest.raises(zlink.InvalidArgument):
        Put(value="not a number")  # type: ignore[arg-type]
    assert node._runtime.spots["box"].owner.lanes.reserved() == (0, 0, 0, 0)


def test_unknown_targets_and_types_are_typed_errors(node):
    client = node.client()
    with pytest.raises(zlink.NotFound):
        client.send_to_spot("nobody", Put(value=1)).submit()
    with pytest.raises(zlink.NotFound):
        client.request("no.channel", Get()).wait(WAIT)
    with pytest.raises(zlink.NotFound):
        client.send_to_actor("no-actor", Put(value=1)).submit()
    with pytest.raises(zlink.InvalidArgument):
        client.spots.create("no.such.type").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument):
        client.spots.create("t.bi.single").wait(WAIT)  # Instance Spots are not created so
    with pytest.raises(zlink.InvalidArgument):
        client.actors.create("no.actor.type").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_spot("i-1", Get()).instance_spot("t.bi.box").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument, match="not an Instance Spot"):
        client.request_to_spot("box", Get()).instance_spot().wait(WAIT)
    with pytest.raises(zlink.InvalidArgument, match="exists as"):
        client.spots.get_or_create("box", "t.bi.box2").wait(WAIT)  # same id, other type
    with pytest.raises(zlink.InvalidOperation, match="exists already"):
        client.actors.create("t.bi.player", actor_id="p1").wait(WAIT)
        client.actors.create("t.bi.player", actor_id="p1").wait(WAIT)


def test_an_instance_spot_activates_on_its_first_message(node):
    client = node.client()
    assert client.request_to_spot("single-1", Get()).instance_spot().wait(WAIT) == 1
    assert node._runtime.spots["single-1"].kind is zlink.SpotKind.INSTANCE
    assert client.request_to_spot("single-1", Get()).wait(WAIT) == 1  # now addressable by id


def test_an_oversized_payload_is_resource_exhausted_and_loses_nothing_accepted(make_node):
    gate = threading.Event()
    node = make_node(build_app(gate), app_lane_bytes=4096)
    client = node.client()
    client.spots.get_or_create("box", "t.bi.box").wait(WAIT)
    client.send_to_spot("box", Put(value=1)).submit()  # blocks the gate, holds 256 + bytes
    client.send_to_spot("box", Blob(data="x" * 1000)).submit()
    with pytest.raises(zlink.ResourceExhausted, match="bytes"):
        client.send_to_spot("box", Blob(data="x" * 4000)).submit()
    gate.set()
    assert client.request_to_spot("box", Get()).wait(WAIT) == 1 + 1000


def test_bad_options_and_terminals_are_refused(node):
    client = node.client()
    call = client.request_to_spot("box", Get()).timeout(1)
    with pytest.raises(zlink.InvalidOperation):
        call.timeout(2)
    for bad in (0, -1, "1", True, float("nan")):
        with pytest.raises(zlink.InvalidArgument):
            client.request_to_spot("box", Get()).timeout(bad)  # type: ignore[arg-type]
    assert call.wait(WAIT) == 0
    with pytest.raises(zlink.InvalidOperation):
        call.wait(WAIT)  # one terminal per call
    send = client.send_to_spot("box", Put(value=1)).metadata("k", "v")
    with pytest.raises(zlink.InvalidOperation):
        send.metadata("k", "w")
    with pytest.raises(zlink.NotFound):
        client.send_to_spot("box", Put(value=1)).in_mesh("elsewhere").submit()


def test_bad_node_config_is_invalid_argument():
    for bad in ({"workers": 0}, {"app_lane_items": 0}, {"owner_time_budget": -1}, {"nope": 1}):
        with pytest.raises(zlink.InvalidArgument):
            zlink.NodeConfig(**bad)


@pytest.mark.parametrize(
    "bad",
    [
        # a number is a number: True or "2" was taken as 1 or 2 (lax coercion)
        {"workers": True},
        {"workers": "2"},
        {"app_lane_items": 2.0},
        {"request_timeout": "5"},
        {"lease_seconds": True},
        {"insecure": "yes"},
        {"insecure": 1},
        # ids are valid UTF-8 of 1..255 bytes (python-api §1), as every other id: 255
        # characters of Hangul are 765 bytes; a lone surrogate has no UTF-8 form
        {"node_id": "한" * 100},
        {"mesh": "é" * 128},
        {"node_id": "n\ud8001"},
        {"node_id": "n\n1"},
        {"mesh": "m\x00"},
    ],
)
def test_node_config_takes_numbers_as_numbers_and_ids_in_utf8_bytes(bad: dict[str, Any]):
    with pytest.raises(zlink.InvalidArgument):
        zlink.NodeConfig(**bad)


@pytest.mark.parametrize("field", ["lease_seconds", "request_timeout", "idle_timeout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_duration_is_named_so(field: str, value: float):
    """``--lease nan`` was refused as "less than or equal to 10000000"."""
    with pytest.raises(zlink.InvalidArgument, match="finite"):
        zlink.NodeConfig(**{field: value})


def test_node_config_takes_what_it_always_took():
    config = zlink.NodeConfig(
        node_id="한" * 85, mesh="é" * 127, workers=2, lease_seconds=3, request_timeout=1,
        insecure=False, idle_timeout=None,
    )  # fmt: skip
    assert config.lease_seconds == 3.0 and isinstance(config.lease_seconds, float)
    assert config.node_id == "한" * 85


def test_wait_inside_a_turn_is_invalid_operation(make_node):
    app = zlink.App("inside")
    seen: list[str] = []

    @app.user_spot("t.bi.inner")
    class Inner(zlink.UserSpot):
        @zlink.handler
        def get(self, req: Get) -> int:
            try:
                self.context.outbound.request_to_spot("other", Get()).wait(1)
            except zlink.InvalidOperation:
                seen.append("refused")
            return 0

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("inner", "t.bi.inner").wait(WAIT)
    client.spots.get_or_create("other", "t.bi.inner").wait(WAIT)
    assert client.request_to_spot("inner", Get()).wait(WAIT) == 0
    assert seen == ["refused"]


def test_awaiting_a_foreign_awaitable_in_a_handler_is_a_clear_type_error(make_node):
    import asyncio

    app = zlink.App("foreign")

    @app.user_spot("t.bi.foreign")
    class Foreign(zlink.UserSpot):
        @zlink.handler
        async def get(self, req: Get) -> int:
            await asyncio.sleep(0)
            return 1

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("f", "t.bi.foreign").wait(WAIT)
    with pytest.raises(zlink.HandlerError) as info:
        client.request_to_spot("f", Get()).wait(WAIT)
    assert info.value.remote_type == "TypeError"
    assert "ZLink calls" in info.value.remote_message


class Later(zlink.Request["LaterReply"], type_name="t.bi.later"):
    pass


class LaterReply(zlink.Message, type_name="t.bi.later_reply"):
    value: int


class Opaque:  # a class pydantic has no schema for
    pass


class Odd(zlink.Request[Opaque], type_name="t.bi.odd"):
    pass


def test_a_forward_reference_reply_type_resolves_and_any_bad_reply_is_a_handler_error(make_node):
    app = zlink.App("replies")

    @app.user_spot("t.bi.replies")
    class Replies(zlink.UserSpot):
        @zlink.handler
        def later(self, req: Later) -> LaterReply:
            return LaterReply(value=7)

        @zlink.handler
        def odd(self, req: Odd) -> Opaque:
            return "not an Opaque"  # type: ignore[return-value]  # cannot be checked as one

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("r", "t.bi.replies").wait(WAIT)
    assert client.request_to_spot("r", Later()).wait(WAIT) == LaterReply(value=7)
    with pytest.raises(zlink.HandlerError):
        client.request_to_spot("r", Odd()).wait(WAIT)


def test_a_message_json_cannot_carry_is_invalid_argument_and_nothing_is_queued(node):
    """python-api §1: a str with a lone surrogate has no JSON form; refused at the call site
    with a typed error (it was an untyped PydanticSerializationError), on every send path."""
    client = node.client()
    bad = Blob(data="\ud800")
    with pytest.raises(zlink.InvalidArgument, match="no JSON form"):
        client.send_to_spot("box", bad).submit()  # the fast path
    with pytest.raises(zlink.InvalidArgument, match="no JSON form"):
        client.send_to_spot("box", bad).metadata("k", "v").submit()  # the general path
    with pytest.raises(zlink.InvalidArgument, match="no JSON form"):
        client.send_many_to_spot("box", [Blob(data="ok"), bad]).submit()
    with pytest.raises(zlink.InvalidArgument, match="no JSON form"):
        client.send_many_to_spot("box", [bad, bad]).submit()
    assert node.wait_idle(WAIT)
    assert node._runtime.spots["box"].owner.lanes.reserved()[0] == 0


@pytest.mark.parametrize("seconds", [-1.0, float("inf"), float("nan")])
def test_a_manual_clock_moves_forward_by_finite_seconds_only(seconds):
    from zlink.testing import ManualClock

    clock = ManualClock()
    start = clock.now()
    with pytest.raises(zlink.InvalidArgument):
        clock.advance(seconds)
    assert clock.now() == start
