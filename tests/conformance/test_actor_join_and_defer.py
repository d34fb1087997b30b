"""execution-model §16 "Actor Join and Defer()" (with §5 and python-api §6)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT


class Enter(zlink.Message, type_name="t.jd.enter"):
    room: str
    then: str = "ok"  # "ok", "raise", "bad_reply", "probe"


class EnterAsk(zlink.Request[int], type_name="t.jd.enterask"):
    room: str
    bad_reply: bool = False


class Keep(zlink.Message, type_name="t.jd.keep"):
    room: str


class UseKept(zlink.Request[str], type_name="t.jd.usekept"):
    pass


class Ping(zlink.Request[str], type_name="t.jd.ping"):
    pass


class Leave(zlink.Message, type_name="t.jd.leave"):
    pass


class EnterTwice(zlink.Request[str], type_name="t.jd.entertwice"):
    room: str


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.events: list[str] = []
        self.join_seen = threading.Event()

    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        self.events.append(f"join?{actor_id}")
        self.join_seen.set()
        if self.context.spot_id.startswith("closed"):
            return zlink.ActorJoinResult(accept=False, reason="room closed")
        return zlink.ActorJoinResult(reply=f"welcome {actor_id}")

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        self.events.append(f"joined:{actor.actor_id}")

    def on_leave_actor(self, actor: zlink.Actor) -> None:
        self.events.append(f"left:{actor.actor_id}")


def build_app(probe_room: list[Room] | None = None) -> zlink.App:
    app = zlink.App("join")
    app.user_spot("t.jd.room")(Room)

    @app.entry_spot("t.jd.lobby", actor="t.jd.player")
    class Lobby(zlink.EntrySpot):
        def __init__(self, context: zlink.EntrySpotContext) -> None:
            super().__init__(context)
            self.returned: list[str] = []
            self.left: list[str] = []

        def on_joined_actor(self, actor: zlink.Actor) -> None:
            self.returned.append(actor.actor_id)

        def on_leave_actor(self, actor: zlink.Actor) -> None:
            self.left.append(actor.actor_id)

    @app.actor("t.jd.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.completions: list[zlink.ActorJoinCompletion] = []
            self.completed = threading.Event()
            self.kept: zlink.JoinCall | None = None
            self.defer_result: Any = "unset"
            self.probe: bool | None = None

        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.defer_result = self.context.join(msg.room, Ping()).defer()
            if msg.then == "raise":
                raise RuntimeError("handler failed after defer")
            if msg.then == "probe":  # does the target see anything while we still run?
                assert probe_room is not None
                self.probe = probe_room[0].join_seen.wait(0.2)

        @zlink.handler
        def enter_ask(self, req: EnterAsk) -> int:
            self.context.join(req.room).defer()
            return "not an int" if req.bad_reply else 7  # type: ignore[return-value]

        @zlink.handler
        def keep(self, msg: Keep) -> None:
            self.kept = self.context.join(msg.room)  # not deferred in this handler

        @zlink.handler
        def use_kept(self, req: UseKept) -> str:
            assert self.kept is not None
            try:
                self.kept.defer()
            except zlink.InvalidOperation:
                return "InvalidOperation"
            return "deferred"

        @zlink.handler
        def enter_twice(self, req: EnterTwice) -> str:
            call = self.context.join(req.room)
            call.defer()
            try:
                call.defer()  # python-api §11: a repeated terminal has no effect at all
            except zlink.InvalidOperation as exc:
                return f"InvalidOperation: {exc}"
            return "deferred twice"

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return f"pong from {self.context.spot_id}"

        @zlink.handler
        def leave(self, msg: Leave) -> None:
            self.context.leave()

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            self.completions.append(completion)
            self.completed.set()

    return app


def _setup(make_node: Any, rooms: tuple[str, ...] = ("room",), probe: list[Room] | None = None):
    node = make_node(build_app(probe))
    client = node.client()
    for room in rooms:
        client.spots.get_or_create(room, "t.jd.room").wait(WAIT)
    pid = client.actors.create("t.jd.player").wait(WAIT).actor_id
    actor = node._runtime.actors[pid]
    return node, client, pid, actor


def _room(node: zlink.Node, spot_id: str) -> Room:
    room: Room = node._runtime.spots[spot_id].instance
    return room


def test_defer_returns_none_synchronously_and_starts_no_target_io_until_the_handler_ends(
    make_node,
):
    probe: list[Room] = []
    node, client, pid, actor = _setup(make_node, probe=probe)
    probe.append(_room(node, "room"))
    client.send_to_actor(pid, Enter(room="room", then="probe")).submit()
    assert actor.instance.completed.wait(WAIT)
    assert actor.instance.defer_result is None
    assert actor.instance.probe is False  # on_actor_join did not run while the handler ran
    assert _room(node, "room").events[0] == f"join?{pid}"


@pytest.mark.parametrize("ending", ["exception", "reply_encoding_failure"])
def test_barriers_of_a_handler_that_fails_are_discarded_and_join_never_runs(make_node, ending):
    node, client, pid, actor = _setup(make_node)
    if ending == "exception":
        client.send_to_actor(pid, Enter(room="room", then="raise")).submit()
    else:
        with pytest.raises(zlink.HandlerError):
            client.request_to_actor(pid, EnterAsk(room="room", bad_reply=True)).wait(WAIT)
    # a later request on the same Actor queue proves the failed turn is over
    assert client.request_to_actor(pid, Ping()).wait(WAIT).startswith("pong")
    node.wait_idle(WAIT)
    assert _room(node, "room").events == []
    assert actor.instance.completions == []
    assert actor.spot.spot_id != "room"


def test_join_result_goes_to_the_moved_actors_completion_callback_not_the_handler(make_node):
    node, client, pid, actor = _setup(make_node)
    assert client.request_to_actor(pid, EnterAsk(room="room")).wait(WAIT) == 7
    assert actor.instance.completed.wait(WAIT)
    (done,) = actor.instance.completions
    assert done.joined and done.spot_id == "room" and done.reply == f"welcome {pid}"
    assert _room(node, "room").events == [f"join?{pid}", f"joined:{pid}"]
    assert client.request_to_actor(pid, Ping()).wait(WAIT) == "pong from room"


def test_rejected_or_missing_target_is_reported_to_the_completion_callback(make_node):
    _node, client, pid, actor = _setup(make_node, rooms=("closed-1",))
    client.send_to_actor(pid, Enter(room="closed-1")).submit()
    assert actor.instance.completed.wait(WAIT)
    actor.instance.completed.clear()
    client.send_to_actor(pid, Enter(room="nowhere")).submit()
    assert actor.instance.completed.wait(WAIT)
    rejected, missing = actor.instance.completions
    assert not rejected.joined and isinstance(rejected.error, zlink.InvalidOperation)
    assert not missing.joined and isinstance(missing.error, zlink.NotFound)
    assert client.request_to_actor(pid, Ping()).wait(WAIT).startswith("pong from t.jd.lobby")


def test_defer_after_the_registration_scope_closed_is_invalid_operation(make_node):
    node, client, pid, actor = _setup(make_node)
    client.send_to_actor(pid, Keep(room="room")).submit()
    assert client.request_to_actor(pid, UseKept()).wait(WAIT) == "InvalidOperation"
    with pytest.raises(zlink.InvalidOperation):  # from outside any handler, too
        actor.instance.kept.defer()
    node.wait_idle(WAIT)
    assert _room(node, "room").events == []


def test_leave_returns_the_actor_to_its_entry_spot_with_both_callbacks(make_node):
    node, client, pid, actor = _setup(make_node)
    client.send_to_actor(pid, Enter(room="room")).submit()
    assert actor.instance.completed.wait(WAIT)
    client.send_to_actor(pid, Leave()).submit()
    node.wait_idle(WAIT)
    assert _room(node, "room").events[-1] == f"left:{pid}"
    entry = node._runtime.entries["t.jd.player"]
    assert entry.instance.returned == [pid]
    assert client.request_to_actor(pid, Ping()).wait(WAIT) == f"pong from {entry.spot_id}"


def test_a_second_defer_of_one_join_is_invalid_operation_and_registers_nothing(make_node):
    """python-api §11 "A repeated terminal": the repeat raises and has no effect at all."""
    node, client, pid, actor = _setup(make_node)
    second = client.request_to_actor(pid, EnterTwice(room="room")).wait(WAIT)
    assert second.startswith("InvalidOperation") and "one terminal" in second
    assert actor.instance.completed.wait(WAIT)
    node.wait_idle(WAIT)
    (done,) = actor.instance.completions  # one Join, one on_join_completed
    assert done.joined and done.spot_id == "room"
    assert _room(node, "room").events == [f"join?{pid}", f"joined:{pid}"]


def test_the_entry_spot_hears_an_actor_leave_it_for_a_room(make_node):
    """python-api §3 lists ``on_leave_actor`` for an Entry Spot too (kotlin-spot-interface:
    ``onLeaveActorSuspending`` on ZLinkSuspendingEntrySpot): an Actor that joins a room leaves
    its Entry Spot, which hears so, as it hears ``on_joined_actor`` when the Actor comes back."""
    node, client, pid, actor = _setup(make_node)
    entry = node._runtime.entries["t.jd.player"]
    client.send_to_actor(pid, Enter(room="room")).submit()
    assert actor.instance.completed.wait(WAIT)
    node.wait_idle(WAIT)
    assert entry.instance.left == [pid]
    client.send_to_actor(pid, Leave()).submit()
    node.wait_idle(WAIT)
    assert entry.instance.returned == [pid] and entry.instance.left == [pid]
