"""An Actor that ends (python-api §3 ``on_disconnect_actor``, execution-model §16 "destroy"):
the Spot it is in is told, what was queued for it is discarded and counted, and it is gone,
from the node and from the Location Store. Without it, one Actor per session that ever
connected stayed on its node for good (a growth probe: 20,000 sessions, 20,000 Actors)."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster

EVENTS: list[str] = []


class Enter(zlink.Message, type_name="t.ad.enter"):
    room: str


class Quit(zlink.Message, type_name="t.ad.quit"):
    then_work: int = 0  # messages the Actor sends itself first: queued behind the disconnect
    twice: bool = False
    block: bool = False  # then its turn waits for RELEASE (it is ending meanwhile)


class Work(zlink.Message, type_name="t.ad.work"):
    n: int


class Ping(zlink.Request[str], type_name="t.ad.ping"):
    pass


class Kick(zlink.Request[bool], type_name="t.ad.kick"):
    actor_id: str


class Block(zlink.Request[str], type_name="t.ad.block"):
    pass


RELEASE = threading.Event()
BLOCKING = threading.Event()
CLOSED = threading.Event()


class Lobby(zlink.EntrySpot):
    def on_joined_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"lobby-joined:{actor.actor_id}")

    @zlink.handler
    def block(self, req: Block) -> str:
        BLOCKING.set()
        assert RELEASE.wait(WAIT)
        return "released"

    def on_disconnect_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"lobby-disconnect:{actor.actor_id}")


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.members: dict[str, zlink.Actor] = {}

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        self.members[actor.actor_id] = actor

    def on_disconnect_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"room-disconnect:{actor.actor_id}")
        self.members.pop(actor.actor_id, None)

    def on_closing(self, closing: zlink.SpotClosingContext) -> None:
        EVENTS.append(f"room-closing:{sorted(self.members)}")
        CLOSED.set()

    @zlink.handler
    def block(self, req: Block) -> str:
        BLOCKING.set()
        assert RELEASE.wait(WAIT)
        return "released"

    @zlink.handler
    def kick(self, req: Kick) -> bool:
        actor = self.members.get(req.actor_id)
        if actor is None:
            return False
        self.context.disconnect_actor(actor)
        return True


class Wide(zlink.UserSpot):
    """A SpotWide room that moves (its state is JSON: it keeps no Actor objects)."""

    @zlink.handler
    def block(self, req: Block) -> str:
        BLOCKING.set()
        assert RELEASE.wait(WAIT)
        return "released"


class Player(zlink.Actor):
    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        EVENTS.append(f"joined:{self.actor_id}:{completion.joined}")

    @zlink.handler
    def quit(self, msg: Quit) -> None:
        for n in range(msg.then_work):
            self.context.outbound.send_to_actor(self.actor_id, Work(n=n)).submit()
        self.context.disconnect()
        if msg.twice:
            self.context.disconnect()
        if msg.block:
            BLOCKING.set()
            assert RELEASE.wait(WAIT)

    @zlink.handler
    def work(self, msg: Work) -> None:
        EVENTS.append(f"work:{msg.n}")

    @zlink.handler
    def ping(self, req: Ping) -> str:
        return "pong"


def build_app() -> zlink.App:
    app = zlink.App("actor-disconnect")
    app.entry_spot("t.ad.lobby", actor="t.ad.player")(Lobby)
    movable = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.ad.room")(Room)
    app.user_spot("t.ad.wide", relocation=movable)(Wide)
    app.user_spot("t.ad.hall", mode=zlink.ExecutionMode.PER_ACTOR)(type("Hall", (Room,), {}))
    app.actor("t.ad.player", relocation=movable)(Player)
    return app


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    EVENTS.clear()
    RELEASE.clear()
    BLOCKING.clear()
    CLOSED.clear()
    yield
    RELEASE.set()


def _player(node: zlink.Node, actor_id: str = "p1") -> Any:
    node.client().actors.create("t.ad.player", actor_id=actor_id).wait(WAIT)
    assert node.wait_idle(WAIT)
    return node._rt.actors[actor_id]


def test_an_actor_that_disconnects_itself_is_gone_and_its_entry_spot_is_told(make_node):
    node = make_node(build_app())
    client = node.client()
    kept = weakref.ref(_player(node).instance)
    assert client.request_to_actor("p1", Ping()).wait(WAIT) == "pong"
    client.send_to_actor("p1", Quit()).submit()
    assert node.wait_idle(WAIT)
    assert EVENTS == ["lobby-disconnect:p1"]
    assert "p1" not in node._rt.actors
    with pytest.raises(zlink.NotFound):
        client.request_to_actor("p1", Ping()).wait(WAIT)
    assert node.counters()["actors_disconnected"] == 1
    gc.collect()
    assert kept() is None  # nothing of it is kept


def test_what_was_queued_behind_a_disconnect_is_discarded_and_counted(make_node):
    node = make_node(build_app())
    _player(node)
    node.client().send_to_actor("p1", Quit(then_work=5, twice=True)).submit()
    assert node.wait_idle(WAIT)
    assert EVENTS == ["lobby-disconnect:p1"]  # no work ran; told once for two disconnects
    assert node.counters()["messages_discarded_actor_disconnected"] == 5


def test_a_spot_disconnects_a_member_and_is_told(make_node):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("r1", "t.ad.room").wait(WAIT)
    _player(node)
    client.send_to_actor("p1", Enter(room="r1")).submit()
    assert node.wait_idle(WAIT)
    assert client.request_to_spot("r1", Kick(actor_id="p1")).wait(WAIT) is True
    assert node.wait_idle(WAIT)
    assert EVENTS == ["joined:p1:True", "room-disconnect:p1"]
    assert node._rt.spots["r1"].members == {}
    assert "p1" not in node._rt.actors


def test_disconnect_is_refused_where_it_cannot_be(make_node):
    node = make_node(build_app())
    client = node.client()
    client.spots.get_or_create("r1", "t.ad.room").wait(WAIT)
    client.spots.get_or_create("r2", "t.ad.room").wait(WAIT)
    _player(node)
    client.send_to_actor("p1", Enter(room="r1")).submit()
    assert node.wait_idle(WAIT)
    rt = node._rt
    with pytest.raises(zlink.InvalidOperation):  # p1 is in r1, not in r2
        rt.disconnect("p1", "r2")
    with pytest.raises(zlink.NotFound):
        rt.disconnect("nobody", None)
    app = zlink.App("bad")

    class Inst(zlink.InstanceSpot):
        def on_disconnect_actor(self, actor: zlink.Actor) -> None:
            pass

    with pytest.raises(zlink.InvalidOperation):  # an Instance Spot holds no Actors
        app.instance_spot("t.ad.inst")(Inst)


def test_a_disconnected_actor_leaves_the_location_store_too(clock):
    with LocalCluster(build_app(), nodes=2, clock=clock) as cluster:
        n1, n2 = cluster.nodes
        n1.client().actors.create("t.ad.player", actor_id="p1").wait(WAIT)
        assert n2.client().request_to_actor("p1", Ping()).wait(WAIT) == "pong"
        n2.client().send_to_actor("p1", Quit()).submit()
        cluster.wait_idle(WAIT)
        assert EVENTS == ["lobby-disconnect:p1"]
        assert cluster.store.lookup("p1") is None
        with pytest.raises(zlink.NotFound):
            n2.client().request_to_actor("p1", Ping()).wait(WAIT)


def test_a_room_closed_while_a_member_is_disconnecting_closes(make_node):
    """The room's close sends its members home; one that is ending is not sent (it would
    wait behind its own end for good, and the close with it): the close goes on, and the
    Actor still goes (its ``on_disconnect_actor`` may be skipped by the close, counted)."""
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("r1", "t.ad.room").wait(WAIT).spot_ref
    _player(node)
    client.send_to_actor("p1", Enter(room="r1")).submit()
    assert node.wait_idle(WAIT)
    blocked = client.request_to_spot("r1", Block()).future()  # holds the room's gate
    assert BLOCKING.wait(WAIT)
    node._rt.disconnect("p1", None)  # sealed now; its end waits for the gate
    with pytest.raises(zlink.Unavailable):
        client.request_to_actor("p1", Ping()).wait(WAIT)  # sealed: refused at once
    assert client.spots.close(ref) is True
    RELEASE.set()
    assert blocked.result(WAIT) == "released"
    assert node.wait_idle(WAIT)
    assert "p1" not in node._rt.actors and "r1" not in node._rt.spots
    assert [e for e in EVENTS if e.startswith("room-closing")] == ["room-closing:['p1']"]
    assert node.counters()["actors_disconnected"] == 1


# -- a review's findings: each failed before its fix ---------------------------------------
def _in_room(node: zlink.Node, room: str, room_type: str) -> zlink.SpotRef:
    client = node.client()
    ref: zlink.SpotRef = client.spots.get_or_create(room, room_type).wait(WAIT).spot_ref
    _player(node)
    client.send_to_actor("p1", Enter(room=room)).submit()
    assert node.wait_idle(WAIT)
    return ref


def test_a_per_actor_room_closed_while_a_member_ends_hears_nothing_after_on_closing(make_node):
    """python-api §11: nothing of a Spot runs after its ``on_closing``. A member ending on its
    own gate while its PER_ACTOR room closed meanwhile: the room is not told (counted as
    skipped), and the Actor still goes."""
    node = make_node(build_app())
    ref = _in_room(node, "h", "t.ad.hall")
    node.client().send_to_actor("p1", Quit(block=True)).submit()
    assert BLOCKING.wait(WAIT)  # disconnect() was called; its turn goes on (its own gate)
    assert node.client().spots.close(ref) is True
    assert CLOSED.wait(WAIT)  # the room's on_closing ran, on the room's gate
    RELEASE.set()
    assert node.wait_idle(WAIT)
    assert [e for e in EVENTS if "disconnect" in e] == []
    assert "p1" not in node._rt.actors
    assert node.counters()["lifecycle_skipped_on_disconnect_actor"] == 1


def test_a_per_actor_room_with_an_ending_member_does_not_move(clock):
    """A review: the PER_ACTOR shell moved, its ending member could not follow, the move was
    reported failed though the room had moved, and the member's end then ran on the source."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _in_room(n1, "h", "t.ad.hall")
        n1.client().send_to_actor("p1", Quit(block=True)).submit()
        assert BLOCKING.wait(WAIT)
        with pytest.raises(zlink.Unavailable, match="'p1' is not ready"):
            n1.relocate_spot("h", "node-2", timeout=WAIT)
        RELEASE.set()
        cluster.wait_idle(WAIT)
        assert EVENTS[-1] == "room-disconnect:p1" and "h" not in n2._rt.spots
        assert "p1" not in n1._rt.actors and n1._rt.spots["h"].members == {}


def test_disconnect_while_the_room_moves_is_unavailable_not_not_found(clock):
    """A review: a member sealed with its moving SpotWide room was told ``NotFound`` (gone),
    though it moves on and lives: the same ``Unavailable`` as ``leave`` gives."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _in_room(n1, "r1", "t.ad.wide")
        held = n1.client().request_to_spot("r1", Block()).future()
        assert BLOCKING.wait(WAIT)  # the room's gate (and p1's, SpotWide) is held
        moving = threading.Thread(target=n1.relocate_spot, args=("r1", "node-2", WAIT))
        moving.start()
        end = time.monotonic() + WAIT
        while n1._rt.actors["p1"].state.value != "sealed" and time.monotonic() < end:
            time.sleep(0.005)  # the move seals at once, then waits for the gate: no event
        with pytest.raises(zlink.Unavailable, match="moving"):
            n1._rt.disconnect("p1", None)
        RELEASE.set()
        assert held.result(WAIT) == "released"
        moving.join(WAIT)
        cluster.wait_idle(WAIT)
        assert "p1" in n2._rt.actors  # moved with its room, and lives


def test_a_node_that_fenced_itself_runs_no_on_disconnect_actor_for_what_it_dropped(make_node):
    """A review: ``drop_all`` forgets every Actor "with no lifecycle step"; an Entry Spot
    survives it, and still ran a dropped Actor's queued ``on_disconnect_actor``."""
    node = make_node(build_app())
    rt = node._rt
    client = node.client()
    _player(node)
    lobby_id = rt.actors["p1"].entry.spot_id
    held = client.request_to_spot(lobby_id, Block()).future()
    assert BLOCKING.wait(WAIT)  # the Entry Spot's gate is held
    client.send_to_actor("p1", Quit()).submit()
    lobby = rt.spots[lobby_id].owner.lanes
    end = time.monotonic() + WAIT
    while not lobby.ready() and time.monotonic() < end:  # on_disconnect_actor queued there
        time.sleep(0.005)  # (on the actor's own gate, then queued: no event to wait on)
    assert lobby.ready()
    rt.fenced = True  # what self-fencing does (python-api §10 "Failure")
    assert rt.drop_all("test") == 1
    RELEASE.set()
    assert held.result(WAIT) == "released"
    assert node.wait_idle(WAIT)
    assert [e for e in EVENTS if "disconnect" in e] == []
    assert "actors_disconnected" not in node.counters()
    rt.fenced = False
