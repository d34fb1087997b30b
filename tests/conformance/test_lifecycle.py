"""Object lifecycle: kotlin-spot-interface rules on closing, SpotRef and kinds, one test each."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

import zlink
from tests.conftest import WAIT
from zlink import SpotCloseReason, SpotClosingContext
from zlink.testing import ManualClock


class Ping(zlink.Request[str], type_name="t.lc.ping"):
    pass


class Hang(zlink.Request[str], type_name="t.lc.hang"):
    pass


class SelfClose(zlink.Message, type_name="t.lc.selfclose"):
    pass


class Enter(zlink.Message, type_name="t.lc.enter"):
    room: str


class Start(zlink.Message, type_name="t.lc.start"):
    pass


class Pause(zlink.Request[str], type_name="t.lc.pause"):
    pass


class Hold(zlink.Request[str], type_name="t.lc.hold"):
    pass


class Stall(zlink.Request[str], type_name="t.lc.stall"):
    pass


CLOSINGS: list[tuple[str, SpotClosingContext]] = []
LOG: list[str] = []  # what ran, in order: handler steps and on_closing
HOLD = threading.Event()  # the call a handler Yields on completes once this is set
HOLDING = threading.Event()


def build_app(mode: str = "plain", release: threading.Event | None = None) -> zlink.App:
    app = zlink.App("lifecycle")

    @app.user_spot("t.lc.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def ping(self, req: Ping) -> str:
            return f"gen {self.context.spot_ref.object_generation}"

        @zlink.handler
        def hang(self, req: Hang) -> str:
            return "never reached while the test holds this gate"

        @zlink.handler
        def start(self, msg: Start) -> None:
            self.context.timers.register("tick", 1.0)

        @zlink.timer_handler("tick")
        def on_tick(self, tick: zlink.TimerTick) -> None:
            pass

        @zlink.handler
        async def pause(self, req: Pause) -> str:
            LOG.append("pause:start")
            try:
                out: str = await self.context.outbound.request("t.lc.api", Hold()).yield_()
                LOG.append("pause:resumed")
                return out
            except zlink.Cancelled:
                LOG.append("pause:cancelled")
                raise
            finally:
                LOG.append(f"pause:finally:{_on_its_gate(self.context.spot_id)}")

        @zlink.handler
        async def stall(self, req: Stall) -> str:  # a plain await: it keeps the gate
            LOG.append("stall:start")
            try:
                out: str = await self.context.outbound.request("t.lc.api", Hold())
                LOG.append("stall:resumed")
                return out
            except zlink.Cancelled:
                LOG.append("stall:cancelled")
                raise
            finally:
                LOG.append(f"stall:finally:{_on_its_gate(self.context.spot_id)}")

        async def on_closing(self, closing: SpotClosingContext) -> None:
            LOG.append("on_closing")
            CLOSINGS.append((self.context.spot_id, closing))
            if mode == "hang":  # a suspending on_closing that never completes by itself
                try:  # "hole" is a Spot whose gate the test holds: the request never runs
                    await self.context.outbound.request_to_spot("hole", Hang())
                except zlink.Cancelled:
                    CLOSINGS.append((self.context.spot_id, "cancelled"))  # type: ignore[arg-type]
                    raise
            if mode == "block":
                assert release is not None
                await self.context.workers.io(release.wait, WAIT)

    @app.channel("t.lc.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "held"

    @app.instance_spot("t.lc.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "inst"

        @zlink.handler
        def self_close(self, msg: SelfClose) -> None:
            self.context.close()

        def on_closing(self, closing: SpotClosingContext) -> None:
            CLOSINGS.append((self.context.spot_id, closing))

    @app.entry_spot("t.lc.lobby", actor="t.lc.player")
    class Lobby(zlink.EntrySpot):
        def on_joined_actor(self, actor: zlink.Actor) -> None:
            CLOSINGS.append(("lobby-got", actor.actor_id))  # type: ignore[arg-type]

    @app.actor("t.lc.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.joined = threading.Event()

        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def ping(self, req: Ping) -> str:
            return self.context.spot_id

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            self.joined.set()

    return app


def _on_its_gate(spot_id: str) -> bool:
    """Whether the running turn is a turn of ``spot_id`` (it holds that Spot's gate)."""
    turn = zlink.executor.current_turn()
    return turn is not None and turn.owner is not None and turn.owner.name == spot_id


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    CLOSINGS.clear()
    LOG.clear()
    HOLD.clear()
    HOLDING.clear()
    yield
    HOLD.set()


def _room(node: zlink.Node, spot_id: str = "r") -> zlink.SpotRef:
    ref: zlink.SpotRef = node.client().spots.get_or_create(spot_id, "t.lc.room").wait(WAIT).spot_ref
    return ref


def test_spot_close_reason_and_kind_have_the_contract_values():
    assert [int(r) for r in SpotCloseReason] == [0, 1, 2, 3]
    assert [r.name for r in SpotCloseReason] == [
        "EXPLICIT_CLOSE", "HOST_SHUTDOWN", "RELOCATION_OUT", "IDLE_EVICTED"
    ]  # fmt: skip
    assert {k.name: int(k) for k in zlink.SpotKind} == {
        "INVALID": 0, "ENTRY": 1, "USER": 2, "INSTANCE": 3
    }  # fmt: skip


def test_object_generation_is_1_to_2_63_minus_1_and_a_decimal_string_in_json():
    ref = zlink.SpotRef("s", 2**63 - 1, "main", "n1")
    assert ref.to_json_dict()["object_generation"] == "9223372036854775807"
    for bad in (0, -1, 2**63, True, "1"):
        with pytest.raises(zlink.InvalidArgument):
            zlink.SpotRef("s", bad, "main", "n1")  # type: ignore[arg-type]


def test_close_of_a_missing_spot_is_false(make_node):
    node = make_node(build_app())
    ref = zlink.SpotRef("nobody", 1, "main", "node-1")
    assert node.client().spots.close(ref) is False


def test_close_with_a_generation_mismatch_is_invalid_operation(make_node):
    node = make_node(build_app())
    ref = _room(node)
    forged = zlink.SpotRef(ref.spot_id, ref.object_generation + 1, ref.mesh_name, ref.node_rid)
    with pytest.raises(zlink.InvalidOperation):
        node.client().spots.close(forged)
    with pytest.raises(zlink.InvalidArgument):
        node.client().spots.close("r")  # type: ignore[arg-type]


def test_close_of_a_sealed_spot_is_unavailable_and_it_admits_nothing_new(make_node):
    release = threading.Event()
    node = make_node(build_app("block", release))
    client = node.client()
    ref = _room(node)
    assert client.spots.close(ref) is True
    with pytest.raises(zlink.Unavailable):
        client.spots.close(ref)  # on_closing still runs: the Spot is sealed
    with pytest.raises(zlink.Unavailable):
        client.request_to_spot("r", Ping()).wait(WAIT)
    release.set()
    node.wait_idle(WAIT)
    assert client.spots.close(ref) is False  # gone now
    assert [(s, c.reason) for s, c in CLOSINGS] == [("r", SpotCloseReason.EXPLICIT_CLOSE)]


def test_close_targets_user_spots_only(make_node):
    node = make_node(build_app())
    client = node.client()
    assert client.request_to_spot("i", Ping()).instance_spot().wait(WAIT) == "inst"
    inst_ref = node._runtime.spots["i"].ref
    with pytest.raises(zlink.InvalidOperation):
        client.spots.close(inst_ref)
    entry_ref = node._runtime.entries["t.lc.player"].ref
    with pytest.raises(zlink.InvalidOperation):
        client.spots.close(entry_ref)


def test_an_instance_spot_closes_itself(make_node):
    node = make_node(build_app())
    client = node.client()
    client.send_to_spot("i", SelfClose()).instance_spot().submit()
    node.wait_idle(WAIT)
    assert "i" not in node._runtime.spots
    assert CLOSINGS[0][0] == "i" and CLOSINGS[0][1].reason is SpotCloseReason.EXPLICIT_CLOSE


def test_the_closing_deadline_is_absolute_and_a_suspending_on_closing_is_cancelled_at_it(
    make_node, clock: ManualClock
):
    node = make_node(build_app("hang"), closing_timeout=3.0)
    client = node.client()
    ref = _room(node)
    _room(node, "hole")
    node.wait_idle(WAIT)
    assert node._runtime.spots["hole"].gate._flag.acquire(False)  # nothing runs there now
    before = clock.now()
    assert client.spots.close(ref)
    node.wait_idle(WAIT)  # on_closing is suspended on its request
    assert "r" in node._runtime.spots
    ((_spot_id, closing),) = CLOSINGS
    assert closing.deadline == before + 3.0
    clock.advance(3.0)
    node.wait_idle(WAIT)
    assert CLOSINGS[-1] == ("r", "cancelled")
    assert "r" not in node._runtime.spots


def test_a_new_incarnation_gets_a_new_generation(make_node):
    node = make_node(build_app())
    client = node.client()
    first = _room(node)
    assert client.spots.close(first)
    node.wait_idle(WAIT)
    second = _room(node)
    assert second.object_generation != first.object_generation
    assert client.request_to_spot("r", Ping()).wait(WAIT) == f"gen {second.object_generation}"
    with pytest.raises(zlink.InvalidOperation):
        client.spots.close(first)  # the old incarnation's ref no longer matches


def test_closing_a_user_spot_sends_its_member_actors_back_to_their_entry_spot(make_node):
    node = make_node(build_app())
    client = node.client()
    ref = _room(node)
    pid = client.actors.create("t.lc.player").wait(WAIT).actor_id
    client.send_to_actor(pid, Enter(room="r")).submit()
    assert node._runtime.actors[pid].instance.joined.wait(WAIT)
    assert client.spots.close(ref)
    node.wait_idle(WAIT)
    entry = node._runtime.entries["t.lc.player"].spot_id
    assert client.request_to_actor(pid, Ping()).wait(WAIT) == entry
    assert ("lobby-got", pid) in CLOSINGS


def test_idle_spots_are_evicted_and_timer_ticks_do_not_count_as_activity(
    make_node, clock: ManualClock
):
    node = make_node(build_app(), idle_timeout=10.0)
    client = node.client()
    _room(node, "busy")
    _room(node, "ticking")
    # The sweep runs every 2.5 s of the node's clock and skips a Spot whose tick is running
    # (as Orleans skips a busy grain until the next pass). A 1 s timer started 0.25 s in
    # ticks at x.25, never when a sweep is due, and steps of 0.25 s fire one or the
    # other, each awaited: nothing left to chance (CI on 3.13t once ran a tick at each of
    # the four sweeps that would have evicted it, when both fired in one 2.5 s step).
    clock.advance(0.25)
    node.wait_idle(WAIT)
    client.send_to_spot("ticking", Start()).submit()  # a 1 s timer that does not keep it alive
    node.wait_idle(WAIT)
    for _ in range(80):
        clock.advance(0.25)
        node.wait_idle(WAIT)
        client.request_to_spot("busy", Ping()).wait(WAIT)  # activity keeps "busy" alive
    node.wait_idle(WAIT)
    assert "busy" in node._runtime.spots
    assert "ticking" not in node._runtime.spots
    assert [(s, c.reason) for s, c in CLOSINGS] == [("ticking", SpotCloseReason.IDLE_EVICTED)]


def test_shutdown_closes_every_spot_with_host_shutdown(clock: ManualClock):
    node = zlink.Node(build_app(), zlink.NodeConfig(workers=2), clock=clock).start()
    client = node.client()
    _room(node)
    client.request_to_spot("i", Ping()).instance_spot().wait(WAIT)
    node.shutdown(timeout=WAIT)
    assert sorted((s, c.reason) for s, c in CLOSINGS) == [
        ("i", SpotCloseReason.HOST_SHUTDOWN),
        ("r", SpotCloseReason.HOST_SHUTDOWN),
    ]


def test_close_while_a_handler_is_suspended_in_yield_lets_its_continuation_finish_first(make_node):
    """python-api §11 "Close or move while a SpotWide handler is suspended": the close seals
    new admission, then waits for the all-lane barrier: the continuation resumes and finishes
    its turn, and only then does on_closing run."""
    node = make_node(build_app())
    client = node.client()
    ref = _room(node)
    pausing = client.request_to_spot("r", Pause()).future()
    assert HOLDING.wait(WAIT)  # suspended in its Yield: the Spot's gate is free
    assert client.spots.close(ref)
    with pytest.raises(zlink.Unavailable):
        client.request_to_spot("r", Ping()).wait(WAIT)  # sealed for new work
    node.wait_idle(WAIT, busy=1)  # all that can run has run: on_closing waits
    assert LOG == ["pause:start"] and "r" in node._runtime.spots
    HOLD.set()
    assert pausing.result(WAIT) == "held"
    node.wait_idle(WAIT)
    assert LOG == ["pause:start", "pause:resumed", "pause:finally:True", "on_closing"]
    assert "r" not in node._runtime.spots


def test_a_close_whose_deadline_passes_cancels_the_suspended_handler_then_runs_on_closing(
    make_node, clock: ManualClock
):
    """python-api §11: "A close whose deadline passes first cancels what is still suspended
    (Cancelled at its await, its finally runs on the gate), then on_closing runs. No
    continuation ever runs after on_closing." """
    node = make_node(build_app(), closing_timeout=3.0)
    client = node.client()
    ref = _room(node)
    pausing = client.request_to_spot("r", Pause()).future()
    assert HOLDING.wait(WAIT)
    before = clock.now()
    assert client.spots.close(ref)
    node.wait_idle(WAIT, busy=1)
    assert LOG == ["pause:start"]
    clock.advance(3.0)
    with pytest.raises(zlink.HandlerError, match="Cancelled"):
        pausing.result(WAIT)
    node.wait_idle(WAIT, busy=1)
    assert LOG == ["pause:start", "pause:cancelled", "pause:finally:True", "on_closing"]
    assert [c.deadline for _, c in CLOSINGS] == [before + 3.0]
    HOLD.set()  # the Yield's own completion comes too late: nothing runs any more
    node.wait_idle(WAIT)
    assert LOG == ["pause:start", "pause:cancelled", "pause:finally:True", "on_closing"]
    assert "r" not in node._runtime.spots


def test_a_close_whose_deadline_passes_cancels_a_handler_suspended_in_a_plain_await(
    make_node, clock: ManualClock
):
    """python-api §11 (a plain await too): the handler keeps the gate, so on_closing waits
    behind it; past the close's deadline it gets Cancelled at its await, its finally runs,
    then on_closing."""
    node = make_node(build_app(), closing_timeout=3.0)
    client = node.client()
    ref = _room(node)
    stalling = client.request_to_spot("r", Stall()).future()
    assert HOLDING.wait(WAIT)
    assert client.spots.close(ref)
    node.wait_idle(WAIT, busy=1)
    assert LOG == ["stall:start"]
    clock.advance(3.0)
    with pytest.raises(zlink.HandlerError, match="Cancelled"):
        stalling.result(WAIT)
    HOLD.set()
    node.wait_idle(WAIT)
    assert LOG == ["stall:start", "stall:cancelled", "stall:finally:True", "on_closing"]
    assert "r" not in node._runtime.spots


def test_a_closed_spot_is_let_go_when_its_close_ends_not_at_its_deadline(make_node):
    """python-api §11: nothing of a Spot runs after its ``on_closing``, so nothing of it is
    kept either: the close's deadline goes with the close, and the instance (its state, lanes
    and gate) is freed then, not ``closing_timeout`` later (found by a growth probe: 300 rooms
    closed held 300 MiB until their deadlines passed)."""
    node = make_node(build_app())
    client = node.client()
    before = node.status().infrastructure_backlog
    refs = [_room(node, f"r{i}") for i in range(20)]
    kept = [weakref.ref(node._rt.spots[f"r{i}"].instance) for i in range(20)]
    for ref in refs:
        assert client.spots.close(ref) is True
    assert node.wait_idle(WAIT)
    gc.collect()
    assert [k for k in kept if k() is not None] == []  # (the clock never moved)
    assert node.status().infrastructure_backlog == before


def _node_threads(node_id: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.is_alive() and node_id in t.name]


@pytest.mark.parametrize("mesh", [False, True])
def test_a_start_that_fails_stops_what_it_started(tmp_path, mesh: bool):
    """An Entry Spot whose ``on_initialize`` raises fails ``start()`` with ``HandlerError``;
    found by a probe: the node's threads ran on, "starting" for good (a ``with`` block never
    reached its ``__exit__``), and on a mesh the node stayed registered in the store. What
    the start began is stopped before the error reaches the caller; the node is stopped."""
    app = zlink.App("failing-start")

    @app.entry_spot("t.lc.lobby", actor="t.lc.guest")
    class Lobby(zlink.EntrySpot):
        def on_initialize(self) -> None:
            raise RuntimeError("cannot initialize")

    @app.actor("t.lc.guest")
    class Guest(zlink.Actor):
        pass

    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    where = {"store": store, "listen": "tcp://127.0.0.1:0"} if mesh else {}
    config = zlink.NodeConfig(node_id="failing", workers=2, **where)
    node = zlink.Node(app, config)
    with pytest.raises(zlink.HandlerError):
        node.start()
    assert _node_threads("failing") == []
    assert repr(node).startswith("<zlink.Node 'failing' stopped")
    if mesh:
        from zlink.mesh.stores import open_store

        opened = open_store(store)
        try:
            assert [r.node_id for r in opened.nodes()] == []  # it left the store
        finally:
            opened.close()  # type: ignore[attr-defined]
    node.shutdown()  # (safe: it is stopped)


def _hung_start_app(release: threading.Event, entered: threading.Event) -> zlink.App:
    app = zlink.App("hung-start")

    @app.entry_spot("t.hs.lobby", actor="t.hs.player")
    class Lobby(zlink.EntrySpot):
        def on_initialize(self) -> None:  # waits on a dependency that does not answer
            entered.set()
            release.wait(WAIT)

    @app.actor("t.hs.player")
    class Player(zlink.Actor):
        pass

    return app


def test_a_start_waiting_on_an_entry_spot_gives_up_when_abandoned_and_stops_what_began():
    """Found by an audit of ``zlink run`` (a stop signal during a slow start was acted on only
    once the start gave up, 30 s): ``abandon_start`` makes a start that waits for an Entry
    Spot's activation raise ``Cancelled`` at once, and stop what began within its shutdown
    time; one that runs out its ``request_timeout`` names the Entry Spot."""
    release, entered = threading.Event(), threading.Event()
    config = zlink.NodeConfig(workers=1, shutdown_timeout=1.0)
    node = zlink.Node(_hung_start_app(release, entered), config)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            node.start()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            failed.append(exc)

    starter = threading.Thread(target=start)
    try:
        starter.start()
        assert entered.wait(WAIT)  # the Entry Spot is starting
        node.abandon_start()
        starter.join(WAIT)
        assert not starter.is_alive()
        assert len(failed) == 1 and isinstance(failed[0], zlink.Cancelled), failed
        assert node.not_serving() is not None
    finally:
        release.set()
        starter.join(WAIT)
    slow = zlink.Node(
        _hung_start_app(release := threading.Event(), threading.Event()),
        zlink.NodeConfig(workers=1, request_timeout=0.2, shutdown_timeout=1.0),
    )
    try:
        with pytest.raises(zlink.DeadlineExceeded, match=r"'t\.hs\.lobby@node-1' did not finish"):
            slow.start()
    finally:
        release.set()
