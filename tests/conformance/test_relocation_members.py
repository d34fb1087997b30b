"""Relocation of a SpotWide User Spot with its member Actors, and of an Instance Spot
(kotlin-spot-interface relocation paragraphs: "moves as one unit with its member Actors",
"an Actor adapter for each member Actor", "restores the Actor adapter and the queue·timers,
commits the Location authority·membership, and then starts processing Actor messages";
"none of the member's Entry/User Spot membership callbacks are called"; §4, §14)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Mark(zlink.Message, type_name="t.rm.mark"):
    n: int


class Marks(zlink.Request[list[int]], type_name="t.rm.marks"):
    pass


class Where(zlink.Request[str], type_name="t.rm.where"):
    pass


class Enter(zlink.Message, type_name="t.rm.enter"):
    room: str


class Leave(zlink.Message, type_name="t.rm.leave"):
    pass


class StartTicks(zlink.Message, type_name="t.rm.ticks"):
    pass


class Bump(zlink.Message, type_name="t.rm.bump"):
    pass


class Count(zlink.Request[int], type_name="t.rm.count"):
    pass


class Wait(zlink.Request[str], type_name="t.rm.wait"):
    pass


class Hold(zlink.Request[str], type_name="t.rm.hold"):
    pass


CALLBACKS: list[str] = []
JOINED = threading.Semaphore(0)
LOBBY_BACK = threading.Event()
HOLD = threading.Event()  # the call a member Yields on completes once this is set
HOLDING = threading.Event()


def _node_of(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.joined: list[str] = []

    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        CALLBACKS.append(f"join?{actor_id}")
        return zlink.ActorJoinResult()

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        CALLBACKS.append(f"joined:{actor.actor_id}")
        self.joined.append(actor.actor_id)

    def on_leave_actor(self, actor: zlink.Actor) -> None:
        CALLBACKS.append(f"left:{actor.actor_id}")


class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.marks: list[int] = []
        self.ticks = 0

    @zlink.handler
    def mark(self, msg: Mark) -> None:
        self.marks.append(msg.n)

    @zlink.handler
    def get_marks(self, req: Marks) -> list[int]:
        return self.marks

    @zlink.handler
    def where(self, req: Where) -> str:
        return f"{_node_of(self.context)}:{self.context.spot_id}"

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    @zlink.handler
    def leave(self, msg: Leave) -> None:
        self.context.leave()

    @zlink.handler
    def start_ticks(self, msg: StartTicks) -> None:
        self.context.timers.register("tick", 1.0)

    @zlink.timer_handler("tick")
    def on_tick(self, tick: zlink.TimerTick) -> None:
        self.ticks = tick.sequence

    @zlink.handler
    async def wait_(self, req: Wait) -> str:
        out: str = await self.context.outbound.request("t.rm.api", Hold()).yield_()
        turn = zlink.executor.current_turn()
        assert turn is not None and turn.owner is not None
        return f"{out}@{_node_of(self.context)}:{turn.owner.ref.state.value}"

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        CALLBACKS.append(f"completed:{completion.joined}")
        JOINED.release()


class Lobby(zlink.EntrySpot):
    def on_joined_actor(self, actor: zlink.Actor) -> None:
        CALLBACKS.append(f"lobby@{_node_of(self.context)}:{actor.actor_id}")
        LOBBY_BACK.set()


class Counter(zlink.InstanceSpot):
    def __init__(self, context: zlink.InstanceSpotContext) -> None:
        super().__init__(context)
        self.count = 0

    @zlink.handler
    def bump(self, msg: Bump) -> None:
        self.count += 1

    @zlink.handler
    def get(self, req: Count) -> int:
        return self.count


class Hall(zlink.UserSpot):
    """A PER_ACTOR room: its own fields and timers are not relocated (recreate())."""

    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.fresh = True
        self.beats = 0

    @zlink.handler
    def start(self, msg: StartTicks) -> None:
        self.fresh = False
        self.context.timers.register("beat", 1.0)

    @zlink.handler
    def where(self, req: Where) -> str:
        return f"{_node_of(self.context)}:fresh={self.fresh}"

    @zlink.timer_handler("beat")
    def on_beat(self, tick: zlink.TimerTick) -> None:
        self.beats += 1


def build_app() -> zlink.App:
    app = zlink.App("relocation-members")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.rm.room", relocation=state)(Room)
    app.entry_spot("t.rm.lobby", actor="t.rm.player")(Lobby)
    app.actor("t.rm.player", relocation=state)(Player)
    app.entry_spot("t.rm.gate", actor="t.rm.fixed")(type("Gatehouse", (Lobby,), {}))
    app.actor("t.rm.fixed", relocation=zlink.Relocation.disabled())(type("Fixed", (Player,), {}))
    app.instance_spot("t.rm.counter", relocation=state)(Counter)
    app.user_spot("t.rm.hall", mode=zlink.ExecutionMode.PER_ACTOR)(Hall)

    @app.channel("t.rm.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "held"

    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLBACKS.clear()
    LOBBY_BACK.clear()
    HOLD.clear()
    HOLDING.clear()
    while JOINED.acquire(blocking=False):
        pass


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0,
                      relocation_payload_chunk_limit_bytes=32) as cluster:  # fmt: skip
        yield cluster
    HOLD.set()


def _room_with_players(cluster: LocalCluster, n: int, actor_type: str = "t.rm.player") -> list[str]:
    client = cluster.node(0).client()
    client.spots.get_or_create("room", "t.rm.room").wait(WAIT)
    ids = [client.actors.create(actor_type).wait(WAIT).actor_id for _ in range(n)]
    for pid in ids:
        client.send_to_actor(pid, Enter(room="room")).submit()
    for _ in ids:
        assert JOINED.acquire(timeout=WAIT)
    cluster.wait_idle(WAIT)
    return ids


def test_a_spot_moves_with_its_members_state_queues_timers_and_authority(cluster, clock):
    n1, n2, n3 = cluster.nodes
    ids = _room_with_players(cluster, 3)
    c1 = n1.client()
    for k, pid in enumerate(ids):
        c1.send_to_actor(pid, Mark(n=k)).submit()
    c1.send_to_actor(ids[0], StartTicks()).submit()
    cluster.wait_idle(WAIT)
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    room = n1._runtime.spots["room"]
    assert room.gate._flag.acquire(False)  # hold the shared gate: these wait in the queues
    for k, pid in enumerate(ids):
        c1.send_to_actor(pid, Mark(n=10 + k)).submit()
    queued = c1.request_to_actor(ids[1], Marks()).future()
    CALLBACKS.clear()
    moving = n1._runtime.relocator.start(room, "node-2")
    n1._runtime.pool.submit(room.gate._run)  # the barrier turn runs first (lifecycle lane)
    moving.wait(WAIT)
    assert queued.result(WAIT) == [1, 11]  # answered on node-2, routed back through node-1
    for k, pid in enumerate(ids):
        assert n3.client().request_to_actor(pid, Marks()).wait(WAIT) == [k, 10 + k]
        assert c1.request_to_actor(pid, Where()).wait(WAIT) == "node-2:room"  # stale: relayed
        assert pid not in n1._runtime.actors and pid in n2._runtime.actors
        assert cluster.store.lookup(pid).owner_node == "node-2"
    moved = n2._runtime.spots["room"]
    assert set(moved.members) == set(ids) and sorted(moved.instance.joined) == sorted(ids)
    assert CALLBACKS == []  # no join, joined or leave callback for a relocation
    player = n2._runtime.actors[ids[0]]
    assert player.instance.ticks == 1 and player.owner.gate is moved.gate
    clock.advance(1.0)  # the Actor's logical timer moved too: its sequence goes on
    cluster.wait_idle(WAIT)
    assert player.instance.ticks == 2
    n2.client().send_to_actor(ids[2], Leave()).submit()  # home is the target's Entry Spot now
    assert LOBBY_BACK.wait(WAIT)
    cluster.wait_idle(WAIT)  # the room's on_leave_actor is a turn of its own
    assert f"lobby@node-2:{ids[2]}" in CALLBACKS and f"left:{ids[2]}" in CALLBACKS
    assert n1.client().request_to_actor(ids[2], Where()).wait(WAIT) == "node-2:t.rm.lobby@node-2"


def test_a_member_whose_type_cannot_move_keeps_its_spot_in_place(cluster):
    n1, _, _ = cluster.nodes
    ids = _room_with_players(cluster, 1, "t.rm.fixed")
    with pytest.raises(zlink.InvalidOperation, match="disabled"):
        n1.relocate_spot("room", "node-2", timeout=WAIT)
    n1.client().send_to_actor(ids[0], Mark(n=5)).submit()  # nothing was sealed
    assert n1.client().request_to_actor(ids[0], Marks()).wait(WAIT) == [5]
    assert cluster.store.lookup("room").owner_node == "node-1"


def test_a_member_yield_in_flight_holds_the_barrier_until_its_continuation_ends(cluster):
    """kotlin-spot-interface: SPOT_WIDE relocation proceeds "only after the all-lane barrier
    at which the active lanes, including all coroutine continuations, have reached a safe turn
    boundary"; python-api §11: a member's Yield counts: the move waits, the continuation
    finishes its turn on the source, then the Spot moves with its members."""
    n1, n2, _ = cluster.nodes
    ids = _room_with_players(cluster, 2)
    c1 = n1.client()
    waiting = c1.request_to_actor(ids[0], Wait()).future()
    assert HOLDING.wait(WAIT)  # the member is suspended in its Yield
    moving = n1._runtime.relocator.start(n1._runtime.spots["room"], "node-2")
    c1.send_to_actor(ids[1], Mark(n=1)).submit()  # parked at the seal
    n1.wait_idle(WAIT, busy=1)  # all that can run has run: the barrier still waits
    assert not moving.done
    HOLD.set()
    moving.wait(WAIT)
    assert waiting.result(WAIT) == "held@node-1:sealed"  # on the source, before the commit
    assert n2.client().request_to_actor(ids[1], Marks()).wait(WAIT) == [1]
    for name in ("room", *ids):
        assert cluster.store.lookup(name).owner_node == "node-2"


def test_a_per_actor_spot_moves_as_a_fresh_shell_then_each_actor_with_its_own_state(cluster, clock):
    n1, n2, n3 = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("hall", "t.rm.hall").wait(WAIT)
    ids = [c1.actors.create("t.rm.player").wait(WAIT).actor_id for _ in range(3)]
    for pid in ids:
        c1.send_to_actor(pid, Enter(room="hall")).submit()
    for _ in ids:
        assert JOINED.acquire(timeout=WAIT)
    c1.send_to_spot("hall", StartTicks()).submit()
    c1.send_to_actor(ids[0], StartTicks()).submit()
    for k, pid in enumerate(ids):
        c1.send_to_actor(pid, Mark(n=k)).submit()
    cluster.wait_idle(WAIT)
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    assert n1._runtime.spots["hall"].instance.beats == 1
    CALLBACKS.clear()
    n1.relocate_spot("hall", "node-2", timeout=WAIT)
    hall = n2._runtime.spots["hall"]
    assert c1.request_to_spot("hall", Where()).wait(WAIT) == "node-2:fresh=True"  # recreate()
    assert hall.timers == {}  # the Spot's own timers stay behind
    for k, pid in enumerate(ids):
        player = n2._runtime.actors[pid]
        assert player.spot is hall and player.owner.gate is player.own_gate  # its own gate
        assert n3.client().request_to_actor(pid, Marks()).wait(WAIT) == [k]
        assert cluster.store.lookup(pid).owner_node == "node-2" and pid not in n1._runtime.actors
    assert set(hall.members) == set(ids) and CALLBACKS == []
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    assert n2._runtime.actors[ids[0]].instance.ticks == 2  # the Actor's timer moved on


def test_an_instance_spot_moves_with_its_adapter(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.client()
    for _ in range(3):
        c1.send_to_spot("counter-1", Bump()).instance_spot("t.rm.counter").submit()
    assert c1.request_to_spot("counter-1", Count()).instance_spot().wait(WAIT) == 3
    n1.relocate_spot("counter-1", "node-2", timeout=WAIT)
    assert "counter-1" in n2._runtime.spots
    n3.client().send_to_spot("counter-1", Bump()).instance_spot().submit()
    cluster.wait_idle(WAIT)  # another sender's message: handled before c1 asks, not ordered
    assert c1.request_to_spot("counter-1", Count()).instance_spot().wait(WAIT) == 4
