"""Bad input gets a clear, typed error at the boundary, and nothing accepted is lost."""

from __future__ import annotations

import threading

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
    ["", "x" * 256, "é" * 128, 42, None, b"box"],
    ids=["empty", "256", "utf8-256", "int", "none", "bytes"],
)
def test_a_bad_spot_id_is_invalid_argument_at_the_call_site(node, bad):
    client = node.client()
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot(bad, Put(value=1))
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_actor(bad, Get())
    with pytest.raises(zlink.InvalidArgument):
        client.spots.get_or_create(bad, "t.bi.box")


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
