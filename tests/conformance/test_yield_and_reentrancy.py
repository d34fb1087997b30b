"""execution-model §16 "Yield and reentrancy" (with §3, §4, §6 and kotlin-spot-interface).

Each test is named after the item it proves. Node handlers, CPU/IO workers, publish, timers and
close arrive with later issues; their rows are proven there.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, warns_unended


class Ask(zlink.Request[str], type_name="t.yr.ask"):
    how: str = "await"  # "await" or "yield"
    target: str = "channel"  # "channel", "spot", "actor", "create", "get_or_create"
    target_id: str = ""


class Echo(zlink.Request[str], type_name="t.yr.echo"):
    text: str = ""


class Note(zlink.Message, type_name="t.yr.note"):
    text: str


class Hold(zlink.Request[str], type_name="t.yr.hold"):
    pass


class Go(zlink.Message, type_name="t.yr.go"):
    room: str


class Wait(zlink.Request[str], type_name="t.yr.wait"):
    pass


class SelfAsk(zlink.Request[str], type_name="t.yr.selfask"):
    kind: str


class Start(zlink.Message, type_name="t.yr.start"):
    pass


class Block(zlink.Message, type_name="t.yr.block"):
    pass


async def _ask(ctx: Any, req: Ask) -> str:
    out = ctx.outbound
    if req.target == "channel":
        call = out.request("t.yr.api", Echo(text="c"))
    elif req.target == "spot":
        call = out.request_to_spot(req.target_id, Echo(text="s"))
    elif req.target == "actor":
        call = out.request_to_actor(req.target_id, Echo(text="a"))
    elif req.target == "create":
        call = ctx.spots.create("t.yr.plain")
    else:
        call = ctx.spots.get_or_create(req.target_id, "t.yr.plain")
    result = await (call.yield_() if req.how == "yield" else call)
    return result if isinstance(result, str) else f"created:{result.spot_id}"


def build_app(gate: threading.Event | None = None, log: list[str] | None = None) -> zlink.App:
    app = zlink.App("yield")
    log = log if log is not None else []

    @app.user_spot("t.yr.wide")
    class Wide(zlink.UserSpot):
        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

        @zlink.handler
        def echo(self, req: Echo) -> str:
            return f"wide:{req.text}"

        @zlink.handler
        def note(self, msg: Note) -> None:
            log.append(f"spot:{msg.text}")

    @app.user_spot("t.yr.per", mode=zlink.ExecutionMode.PER_ACTOR)
    class Per(zlink.UserSpot):
        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

    @app.user_spot("t.yr.plain")
    class Plain(zlink.UserSpot):
        @zlink.handler
        def echo(self, req: Echo) -> str:
            return "plain"

    @app.instance_spot("t.yr.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

    @app.entry_spot("t.yr.lobby", actor="t.yr.player")
    class Lobby(zlink.EntrySpot):
        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

    @app.actor("t.yr.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.joined = threading.Event()

        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

        @zlink.handler
        def echo(self, req: Echo) -> str:
            return f"actor:{req.text}"

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def note(self, msg: Note) -> None:
            log.append(f"{self.actor_id}:{msg.text}")

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            assert completion.joined, completion
            self.joined.set()

    @app.channel("t.yr.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def echo(self, req: Echo) -> str:
            return f"channel:{req.text}"

        @zlink.handler
        async def ask(self, req: Ask) -> str:
            return await _ask(self.context, req)

        @zlink.handler
        def hold(self, req: Hold) -> str:
            assert gate is not None and gate.wait(WAIT)
            return "released"

    return app


def _player(node: zlink.Node, room: str | None = None) -> str:
    client = node.client()
    pid: str = client.actors.create("t.yr.player").wait(WAIT).actor_id
    if room is not None:
        client.send_to_actor(pid, Go(room=room)).submit()
        inst = node._runtime.actors[pid].instance
        assert inst.joined.wait(WAIT)
    return pid


@pytest.mark.parametrize("how", ["await", "yield"])
@pytest.mark.parametrize("target", ["channel", "spot", "actor"])
def test_spotwide_and_instance_turns_offer_await_and_yield_for_requests(make_node, how, target):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("wide", "t.yr.wide").wait(WAIT)
    client.spots.get_or_create("other", "t.yr.plain").wait(WAIT)
    pid = _player(node)
    target_id = {"channel": "", "spot": "other", "actor": pid}[target]
    ask = Ask(how=how, target=target, target_id=target_id)
    expected = {"channel": "channel:c", "spot": "plain", "actor": "actor:a"}[target]
    assert client.request_to_spot("wide", ask).wait(WAIT) == expected
    inst = client.request_to_spot("inst-1", ask).instance_spot("t.yr.inst")
    assert inst.wait(WAIT) == expected


@pytest.mark.parametrize("how", ["await", "yield"])
@pytest.mark.parametrize("target", ["create", "get_or_create"])
def test_create_and_get_or_create_in_the_same_turn_offer_await_and_yield(make_node, how, target):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("wide", "t.yr.wide").wait(WAIT)
    ask = Ask(how=how, target=target, target_id=f"made-{how}-{target}")
    out = client.request_to_spot("wide", ask).wait(WAIT)
    assert out.startswith("created:")
    assert out.removeprefix("created:") in node._runtime.spots


@pytest.mark.parametrize("where", ["entry_spot", "per_actor", "entry_actor", "channel"])
def test_entry_peractor_actor_and_channel_handlers_offer_only_the_regular_await(make_node, where):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("per", "t.yr.per").wait(WAIT)
    pid = _player(node)
    entry_id = node._runtime.entries["t.yr.player"].spot_id

    client.spots.get_or_create("p", "t.yr.plain").wait(WAIT)

    def ask(how: str, target: str = "channel") -> Any:
        req = Ask(how=how, target=target, target_id="p")
        if where == "entry_spot":
            return client.request_to_spot(entry_id, req)
        if where == "per_actor":
            return client.request_to_spot("per", req)
        if where == "entry_actor":
            return client.request_to_actor(pid, req)
        return client.request("t.yr.api", req)

    # (a Channel's records pass its own gate in order, execution-model §2: awaiting itself
    # would wait on that gate, so it asks a Spot)
    target, expected = ("spot", "plain") if where == "channel" else ("channel", "channel:c")
    assert ask("await", target).wait(WAIT) == expected
    with pytest.raises(zlink.HandlerError) as info:
        ask("yield", target).wait(WAIT)
    assert info.value.remote_type == "InvalidOperation"
    if where == "channel":  # its own gate: refused, as a Spot's wait on itself is (§6)
        with pytest.raises(zlink.HandlerError) as info:
            ask("await").wait(WAIT)
        assert info.value.remote_type == "InvalidOperation"


def test_member_actor_of_per_actor_spot_offers_only_the_regular_await(make_node):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("per", "t.yr.per").wait(WAIT)
    pid = _player(node, room="per")
    assert client.request_to_actor(pid, Ask(how="await")).wait(WAIT) == "channel:c"
    with pytest.raises(zlink.HandlerError, match="InvalidOperation"):
        client.request_to_actor(pid, Ask(how="yield")).wait(WAIT)


def test_join_send_publish_timer_close_and_destroy_offer_no_yield(make_node):
    node = make_node(build_app())
    client = node.client()
    with warns_unended():
        send = client.send_to_spot("x", Note(text="n"))
        assert not hasattr(send, "yield_")
        del send  # built to look at, never sent: warned of
    assert not hasattr(zlink.JoinCall, "yield_")
    assert not hasattr(zlink.JoinCall, "__await__")


def test_yield_outside_an_owner_turn_is_invalid_operation_before_submission(make_node):
    log: list[str] = []
    node = make_node(build_app(log=log))
    client = node.client()
    client.spots.get_or_create("other", "t.yr.plain").wait(WAIT)
    call = client.request_to_spot("other", Echo(text="x"))
    with pytest.raises(zlink.InvalidOperation):
        call.yield_()
    spot = node._runtime.spots["other"]
    assert not spot.owner.lanes.app and spot.owner.lanes.reserved()[0] == 0
    assert call.wait(WAIT) == "plain"  # nothing was submitted: the call is still usable


def test_member_actor_yield_keeps_its_claim_while_other_actors_spot_handlers_run(make_node):
    release = threading.Event()
    log: list[str] = []
    app = build_app(gate=release, log=log)

    @app.actor("t.yr.waiter")
    class Waiter(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.joined = threading.Event()

        @zlink.handler
        async def wait_(self, req: Wait) -> str:
            log.append("A:start")
            out: str = await self.context.outbound.request("t.yr.api", Hold()).yield_()
            log.append("A:resumed")
            return out

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def note(self, msg: Note) -> None:
            log.append(f"A:{msg.text}")

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            self.joined.set()

    @app.entry_spot("t.yr.waiters", actor="t.yr.waiter")
    class Waiters(zlink.EntrySpot):
        pass

    node = make_node(app, workers=3)
    client = node.client()
    client.spots.get_or_create("wide", "t.yr.wide").wait(WAIT)
    a = client.actors.create("t.yr.waiter").wait(WAIT).actor_id
    client.send_to_actor(a, Go(room="wide")).submit()
    assert node._runtime.actors[a].instance.joined.wait(WAIT)
    b = _player(node, room="wide")
    # B's join ends with a turn of B on the Spot's gate (on_join_completed), which may still be
    # settling when _player returns; until it has, B is not in the gate's ring, and a message
    # to B would be run after one to the Spot sent later. Ring order is the order in which
    # owners become ready (§2), so start from an idle gate to make it the order of the sends.
    assert node.wait_idle(WAIT)

    pending = client.request_to_actor(a, Wait()).future()
    client.send_to_actor(a, Note(text="next")).submit()  # must not run before A resumes
    client.send_to_actor(b, Note(text="B")).submit()
    client.send_to_spot("wide", Note(text="S")).submit()
    # B and the Spot run while A waits: prove it by waiting for their effects first
    assert client.request_to_actor(b, Echo(text="b")).wait(WAIT) == "actor:b"
    assert client.request_to_spot("wide", Echo(text="w")).wait(WAIT) == "wide:w"
    assert log == ["A:start", f"{b}:B", "spot:S"]
    release.set()
    assert pending.result(WAIT) == "released"
    node.wait_idle(WAIT)
    assert log == ["A:start", f"{b}:B", "spot:S", "A:resumed", "A:next"]


def test_waiting_on_itself_within_the_same_execution_right_is_invalid_operation(make_node):
    app = build_app()

    seen: list[str] = []

    @app.user_spot("t.yr.selfy")
    class Selfy(zlink.UserSpot):
        @zlink.handler
        async def self_ask(self, req: SelfAsk) -> str:
            try:
                if req.kind == "own_spot":
                    await self.context.outbound.request_to_spot(self.context.spot_id, Echo())
                else:
                    return "unexpected"
            except zlink.InvalidOperation as exc:
                return f"refused:{exc}"
            return "ran"

        @zlink.handler
        def echo(self, req: Echo) -> str:
            seen.append("echo")
            return "echo"

    @app.actor("t.yr.selfish")
    class Selfish(zlink.Actor):
        @zlink.handler
        async def self_ask(self, req: SelfAsk) -> str:
            try:
                if req.kind == "own_actor_await":
                    await self.context.outbound.request_to_actor(self.actor_id, Echo())
                elif req.kind == "own_actor_yield":
                    await self.context.outbound.request_to_actor(self.actor_id, Echo()).yield_()
                else:  # the member Actor awaits its SpotWide Spot: the same gate
                    await self.context.outbound.request_to_spot(req.kind, Echo())
            except zlink.InvalidOperation as exc:
                return f"refused:{exc}"
            return "ran"

        @zlink.handler
        def echo(self, req: Echo) -> str:
            seen.append("actor-echo")
            return "echo"

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.join(msg.room).defer()

    @app.entry_spot("t.yr.selfish-lobby", actor="t.yr.selfish")
    class SelfishLobby(zlink.EntrySpot):
        pass

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("selfy", "t.yr.selfy").wait(WAIT)
    assert (
        client.request_to_spot("selfy", SelfAsk(kind="own_spot")).wait(WAIT).startswith("refused:")
    )
    actor = client.actors.create("t.yr.selfish").wait(WAIT).actor_id
    for kind in ("own_actor_await", "own_actor_yield"):
        assert client.request_to_actor(actor, SelfAsk(kind=kind)).wait(WAIT).startswith("refused")
    client.send_to_actor(actor, Go(room="selfy")).submit()
    node.wait_idle(WAIT)
    assert node._runtime.actors[actor].spot.spot_id == "selfy"
    assert client.request_to_actor(actor, SelfAsk(kind="selfy")).wait(WAIT).startswith("refused")
    node.wait_idle(WAIT)
    assert seen == []  # refused before submission: no target handler ever ran


def test_yielded_call_resumes_after_completion_in_a_new_turn_at_the_back_of_the_queue(make_node):
    release = threading.Event()
    block = threading.Event()
    blocking = threading.Event()
    log: list[str] = []
    app = build_app(gate=release, log=log)

    @app.user_spot("t.yr.order")
    class Order(zlink.UserSpot):
        @zlink.handler
        async def start(self, msg: Start) -> None:
            log.append("H:start")
            await self.context.outbound.request("t.yr.api", Hold()).yield_()
            log.append("H:resumed")

        @zlink.handler
        def block_(self, msg: Block) -> None:
            log.append("M:block")
            blocking.set()
            assert block.wait(WAIT)

        @zlink.handler
        def note(self, msg: Note) -> None:
            log.append(f"M:{msg.text}")

    node = make_node(app, workers=2)
    client = node.client()
    client.spots.get_or_create("order", "t.yr.order").wait(WAIT)
    client.send_to_spot("order", Start()).submit()
    client.send_to_spot("order", Block()).submit()  # takes the gate H released; holds a worker
    assert blocking.wait(WAIT)  # H has yielded (Hold holds the other worker) and Block runs
    release.set()  # H's completion arrives: its resume record goes to the back of the queue
    # the only free worker runs this after H's completion has queued the resume record
    # (future(), not wait(): a blocking wait() may run the request on this thread instead)
    assert client.request("t.yr.api", Echo(text="sync")).future().result(WAIT) == "channel:sync"
    client.send_to_spot("order", Note(text="after")).submit()
    block.set()
    node.wait_idle(WAIT)
    assert log == ["H:start", "M:block", "H:resumed", "M:after"]
