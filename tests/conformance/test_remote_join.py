"""A Join into a User Spot on another node (execution-model §5; kotlin-spot-interface: "a
cross-node Join and relocation create it again in the target activation"; "Target not found,
insufficient capacity, relocation policy failure, and callback failure are delivered as the
Actor completion after the handler ends")."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.mesh import wire
from zlink.testing import LocalCluster, ManualClock


class Welcome(zlink.Message, type_name="t.xj.welcome"):
    text: str


class Enter(zlink.Message, type_name="t.xj.enter"):
    room: str


class Mark(zlink.Message, type_name="t.xj.mark"):
    n: int


class Info(zlink.Request[str], type_name="t.xj.info"):
    pass


EVENTS: list[str] = []
DONE: list[zlink.ActorJoinCompletion] = []
COMPLETED = threading.Semaphore(0)


def _node(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


class Room(zlink.UserSpot):
    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        EVENTS.append(f"join?@{_node(self.context)}")
        if self.context.spot_id.startswith("closed"):
            return zlink.ActorJoinResult(accept=False, reason="closed")
        if self.context.spot_id.startswith("quiet"):
            return zlink.ActorJoinResult()  # accepted, with no reply
        return zlink.ActorJoinResult(reply=Welcome(text=f"hi {actor_id[:4]}"))

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"joined@{_node(self.context)}:{actor.marks}")  # type: ignore[attr-defined]

    def on_leave_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"left@{_node(self.context)}:{self.context.spot_id}")


class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.marks: list[int] = []

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    @zlink.handler
    def mark(self, msg: Mark) -> None:
        self.marks.append(msg.n)

    @zlink.handler
    def info(self, req: Info) -> str:
        return f"{_node(self.context)}:{self.context.spot_id}:{self.marks}"

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        DONE.append(completion)
        COMPLETED.release()


class Lobby(zlink.EntrySpot):
    def on_leave_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"lobby-left@{self.context.spot_ref.node_rid}")


def build_app() -> zlink.App:
    app = zlink.App("remote-join")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.xj.room")(Room)
    app.user_spot("t.xj.moving", relocation=zlink.Relocation.recreate())(
        type("MovingRoom", (Room,), {})
    )
    app.entry_spot("t.xj.lobby", actor="t.xj.player")(Lobby)
    app.actor("t.xj.player", relocation=state)(Player)
    app.entry_spot("t.xj.gate", actor="t.xj.fixed")(type("Gate", (zlink.EntrySpot,), {}))
    app.actor("t.xj.fixed")(type("Fixed", (Player,), {}))  # Relocation.disabled() by default
    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    EVENTS.clear()
    DONE.clear()
    while COMPLETED.acquire(blocking=False):
        pass


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        yield cluster


def _player(cluster: LocalCluster, actor_type: str = "t.xj.player") -> str:
    c1 = cluster.node(0).client()
    pid: str = c1.actors.create(actor_type).wait(WAIT).actor_id
    c1.send_to_actor(pid, Mark(n=1)).submit()
    return pid


def _join(cluster: LocalCluster, pid: str, room: str) -> zlink.ActorJoinCompletion:
    cluster.node(0).client().send_to_actor(pid, Enter(room=room)).submit()
    assert COMPLETED.acquire(timeout=WAIT)
    cluster.wait_idle(WAIT)
    return DONE[-1]


def test_an_actor_joins_a_spot_on_another_node_and_moves_there_with_its_state(cluster):
    n1, n2 = cluster.nodes
    n2.client().spots.get_or_create("room", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    done = _join(cluster, pid, "room")
    assert done.joined and done.spot_id == "room"
    assert done.reply == Welcome(text=f"hi {pid[:4]}")  # a Message reply keeps its type
    # its Entry Spot on node-1 hears it leave (python-api §3), as the room hears it join
    assert sorted(EVENTS) == sorted(["join?@node-2", "joined@node-2:[1]", "lobby-left@node-1"])
    assert pid in n2._runtime.actors and pid not in n1._runtime.actors
    assert cluster.store.lookup(pid).owner_node == "node-2"
    assert n1.client().request_to_actor(pid, Info()).wait(WAIT) == "node-2:room:[1]"
    assert n2._runtime.spots["room"].members.keys() == {pid}


def test_get_or_create_finds_an_actor_that_joined_a_spot_on_another_node(cluster):
    """Found by a probe: the Actor's copy on the room's node kept an activation completion
    nobody would complete, and ``get_or_create`` waited out its deadline on both nodes."""
    n2 = cluster.node(1)
    n2.client().spots.get_or_create("room", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    assert _join(cluster, pid, "room").joined
    for node in cluster.nodes:
        got = node.client().actors.get_or_create(pid, "t.xj.player").timeout(WAIT).wait(WAIT)
        assert (got.actor_id, got.created) == (pid, False)


def test_leaving_a_user_spot_for_one_on_another_node_tells_the_old_spot(cluster):
    n1, n2 = cluster.nodes
    n1.client().spots.get_or_create("here", "t.xj.room").wait(WAIT)
    n2.client().spots.get_or_create("there", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    assert _join(cluster, pid, "here").joined
    assert _join(cluster, pid, "there").joined
    assert "left@node-1:here" in EVENTS and pid not in n1._runtime.spots["here"].members


def test_a_rejected_or_impossible_remote_join_completes_as_failed_and_the_actor_stays(cluster):
    n1, n2 = cluster.nodes
    n2.client().spots.get_or_create("closed-room", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    done = _join(cluster, pid, "closed-room")
    assert not done.joined and isinstance(done.error, zlink.InvalidOperation)
    assert "closed" in str(done.error)
    done = _join(cluster, pid, "nowhere")
    assert not done.joined and isinstance(done.error, zlink.NotFound)
    assert n1.client().request_to_actor(pid, Info()).wait(WAIT).startswith("node-1:t.xj.lobby")
    fixed = _player(cluster, "t.xj.fixed")
    done = _join(cluster, fixed, "closed-room")  # a policy failure: asked nothing remotely
    assert not done.joined and "disabled" in str(done.error)
    assert EVENTS == ["join?@node-2"]
    # a Spot that is nowhere is "target not found" for an Actor of any policy: the policy
    # only matters once there is a node to move to
    done = _join(cluster, fixed, "nowhere")
    assert not done.joined and isinstance(done.error, zlink.NotFound), done.error


def test_a_remote_join_accepted_without_a_reply_completes(cluster):
    """An accepted Join whose on_actor_join gives no reply still moves the Actor and completes
    it (the accepted grant travels as its own record; an absent reply once read as 'no Join'
    and left the Actor sealed on the target, its completion never delivered)."""
    n1, n2 = cluster.nodes
    n2.client().spots.get_or_create("quiet-1", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    done = _join(cluster, pid, "quiet-1")
    assert done.joined and done.reply is None and done.error is None
    assert n1.client().request_to_actor(pid, Info()).wait(WAIT) == "node-2:quiet-1:[1]"


def test_a_remote_join_whose_move_never_arrives_is_withdrawn_at_its_deadline(cluster, clock):
    """Execution-model §5, python-api §8: a Join's move has no caller to give up on it, so it
    has a deadline of its own (the request timeout): a move its target never takes (here its
    payload is lost on the way; the target lives on, nobody declares it down) is withdrawn
    then, the Join completes as failed, and the Actor serves in its Entry Spot again, with
    what was sent to it meanwhile."""
    n1, n2 = cluster.nodes
    n2.client().spots.get_or_create("room", "t.xj.room").wait(WAIT)
    pid = _player(cluster)
    cluster.wait_idle(WAIT)
    n2._runtime.router.handle(wire.RelocEnvelope, lambda _env: None)  # lost on the way
    n1.client().send_to_actor(pid, Enter(room="room")).submit()
    cluster.wait_idle(WAIT)
    n1.client().send_to_actor(pid, Mark(n=2)).submit()  # parked at the seal
    cluster.wait_idle(WAIT)
    assert not DONE and n1._runtime.actors[pid].state.value == "sealed"
    clock.advance(n1.config.request_timeout)
    assert COMPLETED.acquire(timeout=WAIT)
    assert not DONE[-1].joined and isinstance(DONE[-1].error, zlink.DeadlineExceeded)
    info = n1.client().request_to_actor(pid, Info()).wait(WAIT)
    assert info.startswith("node-1:t.xj.lobby") and info.endswith(":[1, 2]")
    assert n1._runtime.relocator._out == {}


@pytest.mark.parametrize("room_on", [1, 0])  # another node's room, or the player's own node's
def test_a_join_that_meets_its_room_moving_waits_for_the_move_and_joins_where_it_went(
    clock, room_on
):
    """A probe: Joins from 3 nodes while their room moved 6 times: 2-5 a run failed with
    ``Unavailable("'room' is sealed or closing")`` (once ``StateIncompatible``), where a call
    that meets a move is parked and goes on. A Join's question that meets its room sealed
    for a move waits for the move (within the Join's own deadline) and is asked again where
    the room went."""
    import time

    from zlink.testing import run_until_idle

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2) as cluster:
        n1, n3 = cluster.nodes[0], cluster.nodes[2]
        n2 = cluster.nodes[room_on]  # where the room is before it moves
        n2.client().spots.get_or_create("mover", "t.xj.moving").wait(WAIT)
        run_until_idle(n2, WAIT)
        rt2 = n2._runtime
        act = rt2.spots["mover"]
        assert act.gate._flag.acquire(False)  # hold its gate: the move waits at its barrier
        moving = rt2.relocator.start(act, "node-3")
        pid = _player(cluster)
        n1.client().send_to_actor(pid, Enter(room="mover")).submit()
        end = time.monotonic() + WAIT
        while not rt2.metrics.get("joins_waiting_for_move"):  # (bounded) its ask arrived
            assert time.monotonic() < end and not DONE, DONE
            time.sleep(0.005)  # another node's threads: nothing to wait on but the count
        rt2.pool.submit(act.gate._run)  # the barrier turn runs; the room moves
        moving.wait(WAIT)
        assert COMPLETED.acquire(timeout=WAIT)
        assert DONE[-1].joined, DONE[-1]
        cluster.wait_idle(WAIT)
        assert pid in n3._runtime.actors


def test_a_spot_does_not_move_while_a_member_of_it_joins_another(clock):
    """A review: a Join that waits for its room's move held its Actor for the whole move,
    while nothing kept the Actor's own Spot from moving with it; the Join then ended on the
    copy left behind. A Spot whose member is joining another Spot does not move
    (``Unavailable``, nothing changed) until that Join ends."""
    import time

    from zlink.testing import run_until_idle

    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2) as cluster:
        n1 = cluster.nodes[0]
        c1 = n1.client()
        c1.spots.get_or_create("home", "t.xj.moving").wait(WAIT)
        c1.spots.get_or_create("next", "t.xj.moving").wait(WAIT)
        pid = _player(cluster)
        c1.send_to_actor(pid, Enter(room="home")).submit()
        assert COMPLETED.acquire(timeout=WAIT) and DONE[-1].joined
        run_until_idle(n1, WAIT)
        rt1 = n1._runtime
        nxt = rt1.spots["next"]
        assert nxt.gate._flag.acquire(False)  # "next" waits at its barrier: its move hangs
        moving = rt1.relocator.start(nxt, "node-2")
        c1.send_to_actor(pid, Enter(room="next")).submit()
        end = time.monotonic() + WAIT
        while not rt1.metrics.get("joins_waiting_for_move"):  # (bounded) the Join waits
            assert time.monotonic() < end
            time.sleep(0.005)
        with pytest.raises(zlink.Unavailable, match="joins another Spot"):
            n1.relocate_spot("home", "node-3", timeout=WAIT)
        rt1.pool.submit(nxt.gate._run)
        moving.wait(WAIT)
        assert COMPLETED.acquire(timeout=WAIT) and DONE[-1].joined, DONE[-1]
        cluster.wait_idle(WAIT)
        assert pid in cluster.nodes[1]._runtime.actors  # it joined "next" where it went
        n1.relocate_spot("home", "node-3", timeout=WAIT)  # and "home" moves again now
