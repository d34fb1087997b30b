"""Timer faults found by a fresh-eyes audit, each reproduced first (kotlin-spot-interface
timers; python-api §8, §9, §11; README "Timers").

1. A timer registered while its Spot activates stops when the activation fails.
2. A registration is one step with the state changes that stop timers (close, fence), and
   one name is one timer, also across a PER_ACTOR Spot's gates.
3. A moved timer keeps its period on a node whose clock counts from another origin.
4. A continuation that finishes its turn on the source during a move (python-api §11) may
   register a timer; it moves with the Spot.
5. A PER_ACTOR Spot's move waits for its timer callbacks as its close does (§11).
6. A timer handle belongs to its timer, not to its name.
7. A timer handler cut short by the node's stop is not a handler error (README).
8. Timer options that cannot cross between nodes are refused where they are made.
"""

import concurrent.futures
import contextlib
import threading
import time
from typing import Any

import pytest

import zlink
import zlink.runtime.acts as acts
from tests.conftest import held_at, until
from zlink.mesh import wire
from zlink.mesh.location import InMemoryLocationStore
from zlink.mesh.transport import InProcessTransport
from zlink.testing import LocalCluster, ManualClock, run_until_idle

WAIT = 5.0


class Start_2a(zlink.Message, type_name="aud2a.start"):
    pass


class StartA_2b(zlink.Message, type_name="aud2b.starta"):
    pass


class RegB_2b(zlink.Request[str], type_name="aud2b.regb"):
    pass


class CancelB_2b(zlink.Request[bool], type_name="aud2b.cancelb"):
    pass


class Go_3(zlink.Message, type_name="aud3.go"):
    pass


class Start_4(zlink.Message, type_name="aud4.start"):
    pass


class Hold_4(zlink.Request[str], type_name="aud4.hold"):
    pass


class Where_4(zlink.Request[str], type_name="aud4.where"):
    pass


class Start_5(zlink.Message, type_name="aud5.start"):
    pass


class Hold_5(zlink.Request[str], type_name="aud5.hold"):
    pass


class Go_6a(zlink.Request[list], type_name="aud6a.go"):
    pass


class Go_6b(zlink.Message, type_name="aud6b.go"):
    pass


class State_6b(zlink.Request[list], type_name="aud6b.state"):
    pass


class Go_7(zlink.Message, type_name="aud7.go"):
    pass


class Slow_7(zlink.Message, type_name="aud7.slow"):
    pass


class Go_8(zlink.Message, type_name="aud8.go"):
    pass


class Where_8(zlink.Request[str], type_name="aud8.where"):
    pass


def _node_id() -> str:
    return zlink.executor.current_turn().owner.ref.rt.node_id  # type: ignore[union-attr]


def _node(app: zlink.App, clock: ManualClock) -> zlink.Node:
    return zlink.Node(app, zlink.NodeConfig(workers=2), clock=clock).start()


# ---------------------------------------------------------------------------------------------
# 1. A timer registered by a Spot whose activation fails ticks forever on the dead instance
# ---------------------------------------------------------------------------------------------
def test_a_timer_of_a_spot_whose_activation_failed_never_ticks():
    """A Spot whose activation fails never was: a timer its on_initialize registered before it
    raised stops with it (it ticked on the dead instance every period, for good)."""
    ticks: list[int] = []
    app = zlink.App("aud1")

    @app.user_spot("aud1.room")
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0)
            raise RuntimeError("cannot start")  # the activation fails: the Spot never is

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    node = _node(app, clock)
    try:
        with pytest.raises(zlink.ZLinkError):
            node.client().spots.get_or_create("room", "aud1.room").wait(WAIT)
        assert "room" not in node._runtime.spots
        for _ in range(3):
            clock.advance(1.0)
            run_until_idle(node)
        assert ticks == []  # now: [1, 2, 3] -- the failed instance's handler keeps running
    finally:
        node.shutdown(WAIT)


# ---------------------------------------------------------------------------------------------
# 2. add_timer checks the state, then inserts, with no lock shared with close / other gates
# ---------------------------------------------------------------------------------------------
def _pause_first_timer(monkeypatch, only: str | None = None):
    """Widen add_timer's window between its state/name check and its insert."""
    inside, go_on, first = threading.Event(), threading.Event(), [True]

    class Paused(acts.Timer):
        __slots__ = ()

        def __init__(self, name, *args, **kw):
            if first[0] and (only is None or name == only):
                first[0] = False
                inside.set()
                assert go_on.wait(WAIT)
            super().__init__(name, *args, **kw)

    monkeypatch.setattr(acts, "Timer", Paused)
    return inside, go_on


def test_a_timer_registered_as_its_spot_begins_to_close_does_not_outlive_the_spot(monkeypatch):
    """A registration and a close are one step each under the directory lock: the timer is
    registered first and the close cancels it, or the close comes first and it is refused;
    it never ticks after ``on_closing`` (it did, every period)."""
    events: list[str] = []
    app = zlink.App("aud2a")
    Start = Start_2a

    @app.user_spot("aud2a.room")
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: Start) -> None:
            with contextlib.suppress(zlink.ZLinkError):
                self.context.timers.register("beat", 1.0)

        def on_closing(self, closing) -> None:
            events.append("on_closing")

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            events.append(f"tick {tick.sequence}")

    inside, go_on = _pause_first_timer(monkeypatch)
    clock = ManualClock()
    node = _node(app, clock)
    try:
        c = node.client()
        ref = c.spots.get_or_create("room", "aud2a.room").wait(WAIT).spot_ref
        c.send_to_spot("room", Start()).wait(WAIT)
        assert inside.wait(WAIT)  # registering: its check made, the timer not yet in
        closer = threading.Thread(target=c.spots.close, args=(ref,))
        closer.start()
        # Before the fix the close finished here, its timers cancelled (none there yet), and
        # the registration then added one; now the close waits for the registration (whose
        # timer it then cancels), so this join runs out: either way the outcome is fixed.
        closer.join(0.5)
        go_on.set()
        closer.join(WAIT)
        assert not closer.is_alive()
        run_until_idle(node)
        for _ in range(3):
            clock.advance(1.0)
            run_until_idle(node)
        # now: ['on_closing', 'tick 1', 'tick 2', 'tick 3'] -- handler runs after on_closing
        assert events == ["on_closing"], events
    finally:
        go_on.set()
        node.shutdown(WAIT)


def test_two_gates_of_a_per_actor_spot_registering_one_name_make_one_timer(monkeypatch):
    """A PER_ACTOR Spot runs timer callbacks on gates of their own, beside its handlers (§2):
    two registering one name at once made two timers, one of them out of ``cancel``'s reach.
    One name is one timer: the second is ``InvalidOperation``."""
    b_ticks: list[int] = []
    app = zlink.App("aud2b")
    StartA = StartA_2b
    RegB = RegB_2b
    CancelB = CancelB_2b

    @app.user_spot("aud2b.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def _register_b(self) -> str:
            try:
                self.context.timers.register("b", 10.0)
            except zlink.ZLinkError as exc:
                return type(exc).__name__
            return "ok"

        @zlink.handler
        def start_a(self, msg: StartA) -> None:
            self.context.timers.register("a", 1.0)

        @zlink.handler
        def reg_b(self, req: RegB) -> str:  # on the Spot's gate
            return self._register_b()

        @zlink.handler
        def cancel_b(self, req: CancelB) -> bool:
            return self.context.timers.cancel("b")

        @zlink.timer_handler("a")  # on timer a's own gate: concurrent with Spot handlers
        def on_a(self, tick: zlink.TimerTick) -> None:
            self.context.timers.cancel("a")
            self._register_b()

        @zlink.timer_handler("b")
        def on_b(self, tick: zlink.TimerTick) -> None:
            b_ticks.append(tick.sequence)

    inside, go_on = _pause_first_timer(monkeypatch, only="b")
    clock = ManualClock()
    node = _node(app, clock)
    try:
        c = node.client()
        c.spots.get_or_create("room", "aud2b.room").wait(WAIT)
        c.send_to_spot("room", StartA()).wait(WAIT)
        run_until_idle(node)
        clock.advance(1.0)  # timer a's callback registers "b" ...
        assert inside.wait(WAIT)
        asked = c.request_to_spot("room", RegB()).future()  # ... and so does the Spot
        # Before the fix the Spot's registration went through at once, a second "b"; now it
        # waits for the first one's (and is refused), so this wait runs out: either way the
        # outcome is fixed.
        with contextlib.suppress(concurrent.futures.TimeoutError):
            asked.result(0.5)
        go_on.set()
        second = asked.result(WAIT)
        run_until_idle(node)
        assert c.request_to_spot("room", CancelB()).wait(WAIT) is True
        clock.advance(10.0)
        run_until_idle(node)
        # now: second == 'ok' and b_ticks == [1]: an orphaned "b" that cancel cannot reach
        assert (second, b_ticks) == ("InvalidOperation", []), (second, b_ticks)
    finally:
        go_on.set()
        node.shutdown(WAIT)


# ---------------------------------------------------------------------------------------------
# 3. A moved timer's next due time is an absolute reading of the source node's monotonic clock
# ---------------------------------------------------------------------------------------------
def test_a_moved_timer_keeps_its_period_when_the_target_clock_has_another_origin():
    """Each machine's monotonic clock counts from its own boot: a moved timer's next due time
    crosses as a span, so it keeps its period (kotlin-spot-interface: the target restores
    "the next scheduled time"); it fired at once with 49,899 late ticks."""
    ticks: list[zlink.TimerTick] = []
    app = zlink.App("aud3")
    Go = Go_3

    @app.user_spot("aud3.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.timers.register("beat", 10.0)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick)

    # two machines: time.monotonic() counts from each one's boot
    clock1, clock2 = ManualClock(1000.0), ManualClock(500_000.0)
    store, transport = InMemoryLocationStore(clock1), InProcessTransport(1024, 1 << 26)
    nodes = [
        zlink.Node(
            app,
            zlink.NodeConfig(node_id=nid, workers=2, lease_seconds=3600.0),
            clock=clk,
            store=store,
            transport=transport,
        )
        for nid, clk in (("n1", clock1), ("n2", clock2))
    ]
    for n in nodes:
        n.start()
    n1, n2 = nodes
    try:
        c = n1.client()
        c.spots.get_or_create("room", "aud3.room").wait(WAIT)
        c.send_to_spot("room", Go()).wait(WAIT)
        run_until_idle(n1)
        n1.relocate_spot("room", "n2", timeout=WAIT)
        run_until_idle(n1)
        run_until_idle(n2)
        # no time passed on either node: nothing is due. Now: one tick, late_ticks=49899
        assert [(t.sequence, t.late_ticks) for t in ticks] == []
        clock2.advance(10.0)
        run_until_idle(n2)
        assert [(t.sequence, t.late_ticks) for t in ticks] == [(1, 0)]
    finally:
        n2.shutdown(WAIT)
        n1.shutdown(WAIT)


# ---------------------------------------------------------------------------------------------
# 4. timers.register is refused (Unavailable) in the continuation python-api §11 says finishes
#    its turn on the source while the move is sealed: the timer is lost with the move
# ---------------------------------------------------------------------------------------------
def test_a_continuation_finishing_its_turn_during_a_move_can_register_a_timer():
    """python-api §11: a handler suspended in a Yield when a move is asked resumes and finishes
    its turn on the source. A timer it registers then moves with the Spot (it was refused,
    ``Unavailable``, and the timer lost)."""
    hold, holding = threading.Event(), threading.Event()
    registered: list[str] = []
    ticks: list[int] = []
    app = zlink.App("aud4")
    Start = Start_4
    Hold = Hold_4
    Where = Where_4

    @app.user_spot("aud4.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        async def start(self, msg: Start) -> None:
            await self.context.outbound.request("aud4.api", Hold()).yield_()
            try:  # resumes and finishes its turn on the source (python-api §11)
                self.context.timers.register("beat", 1.0)
                registered.append("ok")
            except zlink.ZLinkError as exc:
                registered.append(type(exc).__name__)

        @zlink.handler
        def where(self, req: Where) -> str:
            return _node_id()

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    @app.channel("aud4.api")
    class Api:
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            holding.set()
            assert hold.wait(WAIT)
            return "held"

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.node(0)
        c = n1.client()
        c.spots.get_or_create("room", "aud4.room").wait(WAIT)
        c.send_to_spot("room", Start()).wait(WAIT)
        assert holding.wait(WAIT)  # suspended in a Yield
        act = n1._runtime.spots["room"]
        moving = n1._runtime.relocator.start(act, "node-2", timeout=WAIT)  # sealed now
        hold.set()
        moving.wait(WAIT)
        cluster.wait_idle()
        assert c.request_to_spot("room", Where()).wait(WAIT) == "node-2"
        clock.advance(1.0)
        cluster.wait_idle()
        assert (registered, ticks) == (["ok"], [1])  # now: (['Unavailable'], [])


# ---------------------------------------------------------------------------------------------
# 5. A PER_ACTOR shell move commits while a Spot timer callback is suspended on its own gate;
#    the continuation then runs on the source after the commit (a close waits for it)
# ---------------------------------------------------------------------------------------------
def test_no_timer_continuation_of_a_per_actor_spot_runs_on_the_source_after_its_commit():
    """python-api §11: no continuation runs on the source after a move's commit. A PER_ACTOR
    Spot's timer callback suspended on its own gate made no barrier wait, as a close's does:
    it resumed on the source after the commit. The move now waits for it."""
    hold, holding = threading.Event(), threading.Event()
    events: list[Any] = []
    app = zlink.App("aud5")
    Start = Start_5
    Hold = Hold_5

    @app.user_spot("aud5.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: Start) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.timer_handler("beat")
        async def on_beat(self, tick: zlink.TimerTick) -> None:
            await self.context.outbound.request("aud5.api", Hold())  # keeps its timer gate
            here = source._runtime.spots.get("room")  # (still here, sealed: not committed)
            events.append(("continuation", _node_id(), None if here is None else here.state.name))

    @app.channel("aud5.api")
    class Api:
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            holding.set()
            assert hold.wait(WAIT)
            return "held"

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=3) as cluster:
        n1 = source = cluster.node(0)
        c = n1.client()
        c.spots.get_or_create("room", "aud5.room").wait(WAIT)
        c.send_to_spot("room", Start()).wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        assert holding.wait(WAIT)  # the timer callback is suspended on node-1
        moving = threading.Thread(target=n1.relocate_spot, args=("room", "node-2", WAIT))
        moving.start()
        act = n1._runtime.spots["room"]
        until(lambda: act.state.name == "SEALED", "the move sealed it")
        # Before the fix the move committed here, the callback still suspended; now it waits
        # for the callback, so this join runs out: either way the outcome is fixed.
        moving.join(0.5)
        hold.set()  # the callback resumes, and ends its turn, here (before: after the commit)
        moving.join(WAIT)
        assert not moving.is_alive()
        cluster.wait_idle()
        assert events == [("continuation", "node-1", "SEALED")], events
        assert n1._runtime.spots.get("room") is None  # moved, once the callback ended


# ---------------------------------------------------------------------------------------------
# 6. TimerHandle is bound to a name, not to its timer
# ---------------------------------------------------------------------------------------------
def test_cancelling_a_stale_handle_leaves_the_new_timer_of_the_same_name_alone():
    """A handle belongs to its registration: after register, cancel, register of one name, the
    first handle's ``cancel()`` is ``False`` (it cancelled the new timer, and read it active)."""
    ticks: list[int] = []
    app = zlink.App("aud6a")
    Go = Go_6a

    @app.user_spot("aud6a.room")
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, req: Go) -> list:
            old = self.context.timers.register("beat", 1.0)
            self.context.timers.cancel("beat")
            new = self.context.timers.register("beat", 1.0)
            return [old.cancel(), new.active]  # "False if it was already cancelled"

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    node = _node(app, clock)
    try:
        c = node.client()
        c.spots.get_or_create("room", "aud6a.room").wait(WAIT)
        assert c.request_to_spot("room", Go()).wait(WAIT) == [False, True]  # now: [True, False]
        clock.advance(1.0)
        run_until_idle(node)
        assert ticks == [1]
    finally:
        node.shutdown(WAIT)


def test_a_timer_handle_stays_active_after_a_move_that_did_not_happen():
    """A move that did not happen puts the timers back as they were (python-api §8, §11): the
    handle the Spot kept is still its timer's (it read ``active`` False while it ticked)."""
    ticks: list[int] = []
    app = zlink.App("aud6b")
    Go = Go_6b
    State = State_6b

    class Unrestorable(zlink.JsonStateAdapter):
        def capture(self, instance) -> bytes:
            return b""

        def restore(self, instance, data: bytes) -> None:
            raise RuntimeError("cannot restore")

    @app.user_spot("aud6b.room", relocation=zlink.Relocation.preserve_state(Unrestorable))
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context
            self.handle = None

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.handle = self.context.timers.register("beat", 1.0)

        @zlink.handler
        def state(self, req: State) -> list:
            return [self.handle.active, self.context.timers.names()]

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.node(0)
        c = n1.client()
        c.spots.get_or_create("room", "aud6b.room").wait(WAIT)
        c.send_to_spot("room", Go()).wait(WAIT)
        cluster.wait_idle()
        with pytest.raises(zlink.StateIncompatible):  # restore failed 3 times: aborted
            n1.relocate_spot("room", "node-2", timeout=WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]  # the timer goes on on the source ...
        # ... but the Spot's handle says it is cancelled. now: [False, ['beat']]
        assert c.request_to_spot("room", State()).wait(WAIT) == [True, ["beat"]]


# ---------------------------------------------------------------------------------------------
# 7. A timer handler cut short by the node's stop is counted as a handler error
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("via", ["message", "timer"])
def test_a_handler_cut_short_by_the_stop_is_not_a_handler_error(via: str):
    """README: a turn the stop cuts short (its worker call abandoned) is counted as that, "not
    again as a handler error"; a timer handler was (a message handler, the control, was not)."""
    block, in_worker = threading.Event(), threading.Event()
    app = zlink.App(f"aud7{via}")
    Go = Go_7
    Slow = Slow_7

    def blocked() -> None:
        in_worker.set()
        block.wait(10)

    @app.user_spot(f"aud7{via}.room")
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.handler
        async def slow(self, msg: Slow) -> None:
            await self.context.workers.io(blocked)

        @zlink.timer_handler("beat")
        async def on_beat(self, tick: zlink.TimerTick) -> None:
            await self.context.workers.io(blocked)

    clock = ManualClock()
    node = _node(app, clock)
    try:
        c = node.client()
        c.spots.get_or_create("room", f"aud7{via}.room").wait(WAIT)
        if via == "message":
            c.send_to_spot("room", Slow()).wait(WAIT)
        else:
            c.send_to_spot("room", Go()).wait(WAIT)
            run_until_idle(node)
            clock.advance(1.0)
        assert in_worker.wait(WAIT)
        node.shutdown(timeout=1.0)  # abandons the worker call the handler awaits
    finally:
        block.set()
        node.shutdown(WAIT)
    counters = node.counters()
    assert counters.get("worker_calls_abandoned_at_shutdown") == 1, counters
    # README: counted there, "not again as a handler error". now (timer): handler_errors 1
    assert counters.get("handler_errors", 0) == 0, counters


# ---------------------------------------------------------------------------------------------
# 8. An unused max_catch_up_ticks (SKIP_LATE_TICKS) made the Spot unmovable: its move's
#    envelope did not encode, was dropped in the outbox, and the move waited out its deadline
def test_max_catch_up_ticks_is_an_int_under_either_policy():
    """Validated to 1..2**31-1 only under CATCH_UP_BOUNDED (kotlin-spot-interface), but always
    an int: ``None`` was accepted, and then could not cross with its Spot's move."""
    for bad in (None, "3", 1.5, True):
        with pytest.raises(zlink.InvalidArgument):
            zlink.TimerOptions(max_catch_up_ticks=bad)  # type: ignore[arg-type]
    zlink.TimerOptions(max_catch_up_ticks=2**64)  # an int, not used: not range-checked


@pytest.mark.parametrize("unused", [0, -5, 2**64])
def test_a_spot_whose_skip_timer_carries_an_unused_catch_up_value_moves_with_it(unused: int):
    ticks: list[int] = []
    app = zlink.App(f"aud8{unused}")
    Go = Go_8
    Where = Where_8

    @app.user_spot(f"aud8{unused}.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, msg: Go) -> None:
            opts = zlink.TimerOptions(max_catch_up_ticks=unused)  # not used, not validated
            self.context.timers.register("beat", 1.0, options=opts)

        @zlink.handler
        def where(self, req: Where) -> str:
            return _node_id()

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.node(0)
        c = n1.client()
        c.spots.get_or_create("room", f"aud8{unused}.room").wait(WAIT)
        c.send_to_spot("room", Go()).wait(WAIT)
        cluster.wait_idle()
        n1.relocate_spot("room", "node-2", timeout=WAIT)  # (before: DeadlineExceeded)
        assert c.request_to_spot("room", Where()).wait(WAIT) == "node-2"
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]


def test_a_move_whose_state_cannot_be_sent_is_withdrawn_at_once(monkeypatch):
    """Whatever makes a move's envelope fail to encode (found with the value above), the move
    is withdrawn when the outbox finds it, the Spot serving where it was (python-api §8), not
    when its deadline passes: ``StateIncompatible``, at once."""
    app = zlink.App("aud8send")
    Where = Where_8

    @app.user_spot("aud8send.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def where(self, req: Where) -> str:
            return _node_id()

    real = wire.encode

    def encode(envelope: Any) -> bytes:
        if isinstance(envelope, wire.RelocEnvelope):
            raise wire.WireError("reloc does not encode (as the test has it)")
        return real(envelope)

    with LocalCluster(app, nodes=2, workers=2) as cluster:
        n1 = cluster.node(0)
        c = n1.client()
        c.spots.get_or_create("room", "aud8send.room").wait(WAIT)
        monkeypatch.setattr(wire, "encode", encode)
        started = time.monotonic()
        with pytest.raises(zlink.StateIncompatible, match="does not cross"):
            n1.relocate_spot("room", "node-2", timeout=60.0)
        assert time.monotonic() - started < 30.0  # (not its deadline's 60 s)
        monkeypatch.undo()
        assert c.request_to_spot("room", Where()).wait(WAIT) == "node-1"


def test_a_timer_name_that_is_no_text_is_invalid_argument():
    """Found by the audit: an unhashable name reached the timer table and raised
    ``TypeError``; a name is 1..255 bytes of valid UTF-8 or ``InvalidArgument`` (python-api
    §9: bad input gets a typed error at the boundary)."""
    outcomes: list[str] = []
    app = zlink.App("audname")

    @app.user_spot("audname.room")
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, msg: Go_8) -> None:
            for call in (
                lambda: self.context.timers.register(["beat"], 1.0),
                lambda: self.context.timers.cancel({"beat": 1}),
                lambda: self.context.timers.register("\ud800", 1.0),
            ):
                try:
                    call()
                except zlink.InvalidArgument:
                    outcomes.append("InvalidArgument")
                except Exception as exc:  # noqa: BLE001 - what the test looks at
                    outcomes.append(type(exc).__name__)

    clock = ManualClock()
    node = _node(app, clock)
    try:
        c = node.client()
        c.spots.get_or_create("room", "audname.room").wait(WAIT)
        c.send_to_spot("room", Go_8()).wait(WAIT)
        run_until_idle(node)
        assert outcomes == ["InvalidArgument"] * 3
    finally:
        node.shutdown(WAIT)


def test_a_per_actor_spots_timers_go_on_after_a_move_that_did_not_happen():
    """A PER_ACTOR Spot's move now stops its timers at the barrier (none of its callbacks may
    start once it waits for them); a move withdrawn at its deadline (python-api §8) gives them
    back, ticking on as they were."""
    ticks: list[int] = []
    app = zlink.App("audpa")

    @app.user_spot("audpa.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: Start_5) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c = n1.client()
        c.spots.get_or_create("room", "audpa.room").wait(WAIT)
        c.send_to_spot("room", Start_5()).wait(WAIT)
        cluster.wait_idle()  # (registered)
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]
        _at, release = held_at(n2, wire.RelocEnvelope)  # the move never reaches node-2
        try:
            with pytest.raises(zlink.DeadlineExceeded):
                n1.relocate_spot("room", "node-2", timeout=1.0)
        finally:
            release()
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1, 2]
        assert n1._runtime.spots["room"].context.timers.names() == ["beat"]


# ---------------------------------------------------------------------------------------------
# Found by a review of the fixes above


class CancelR(zlink.Request[bool], type_name="audr.cancel"):
    pass


class NamesR(zlink.Request[list], type_name="audr.names"):
    pass


class HoldR(zlink.Request[str], type_name="audr.hold"):
    pass


class StartR(zlink.Message, type_name="audr.start"):
    pass


class GoR5(zlink.Message, type_name="audr5.go"):
    pass


class LateR5(zlink.Request[list], type_name="audr5.late"):
    pass


@pytest.mark.parametrize("again", ["as_it_was", "another_interval"])
def test_a_recreated_spot_that_registers_its_timer_as_it_restores_has_one_timer(again: str):
    """Found by review: a recreate() Spot whose on_initialize registers its timer registered
    it again on the node it moved to, where the move then put the moved one over it: two
    timers under one name, one out of reach of cancel and close (it ticked after on_closing).
    The moved timer is the Spot's as it arrives (kotlin-spot-interface: the move restores
    it, the app does not register it again): registering it again as it was gets it; another
    interval is a second timer, refused, and the move does not happen."""
    ticks: list[int] = []
    app = zlink.App(f"audr1{again}")
    interval = 1.0 if again == "as_it_was" else 2.0

    @app.user_spot(f"audr1{again}.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            moved = "beat" in self.context.timers.names()
            self.context.timers.register("beat", 1.0 if not moved else interval)

        @zlink.handler
        def cancel(self, req: CancelR) -> bool:
            return self.context.timers.cancel("beat")

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("room", f"audr1{again}.room").wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]
        if again == "another_interval":
            with pytest.raises(zlink.StateIncompatible, match="restored as it was"):
                n1.relocate_spot("room", "node-2", timeout=WAIT)
            home = n1  # (it serves where it was, its timer going on)
        else:
            n1.relocate_spot("room", "node-2", timeout=WAIT)
            home = n2
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1, 2]  # one timer, its sequence going on
        assert home.client().request_to_spot("room", CancelR()).wait(WAIT) is True
        assert home.client().spots.close(home._runtime.spots["room"].ref)
        cluster.wait_idle()
        for _ in range(2):
            clock.advance(1.0)
            cluster.wait_idle()
        assert ticks == [1, 2]


def _suspending_per_actor_app(name: str, hold: threading.Event, holding: threading.Event,
                              events: list[Any], cancel_after: bool) -> zlink.App:  # fmt: skip
    app = zlink.App(name)

    @app.user_spot(f"{name}.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: StartR) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.handler
        def names(self, req: NamesR) -> list:
            try:
                self.context.timers.register("other", 5.0)
                ok = "ok"
            except zlink.ZLinkError as exc:
                ok = type(exc).__name__
            return [self.context.timers.names(), ok]

        @zlink.timer_handler("beat")
        async def on_beat(self, tick: zlink.TimerTick) -> None:
            events.append(("tick", tick.sequence))
            if tick.sequence == 1:
                await self.context.outbound.request(f"{name}.api", HoldR())
                if cancel_after:
                    events.append(("cancel", self.context.timers.cancel("beat")))

        @zlink.timer_handler("other")
        def on_other(self, tick: zlink.TimerTick) -> None:
            pass

    @app.channel(f"{name}.api")
    class Api:
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def hold(self, req: HoldR) -> str:
            holding.set()
            assert hold.wait(WAIT)
            return "held"

    return app


@pytest.mark.parametrize("cancel_after", [False, True])
def test_a_per_actor_move_withdrawn_at_its_barrier_leaves_its_timers_as_they_were(
    cancel_after: bool,
):
    """Found by review: a PER_ACTOR Spot's move took its timers at the barrier, then waited
    for a suspended timer callback: withdrawn in between, the timers never came back (none
    could register again), and a callback that cancelled its timer meanwhile found nothing
    (the move that did not happen then brought it back). The barrier now holds the timer
    gates, once their callbacks end, and takes nothing: a move withdrawn meanwhile leaves
    the timers as the callbacks left them (python-api §8)."""
    hold, holding = threading.Event(), threading.Event()
    events: list[Any] = []
    name = f"audr2{int(cancel_after)}"
    app = _suspending_per_actor_app(name, hold, holding, events, cancel_after)
    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=3) as cluster:
        n1, n2 = cluster.nodes
        c = n1.client()
        c.spots.get_or_create("room", f"{name}.room").wait(WAIT)
        c.send_to_spot("room", StartR()).wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        assert holding.wait(WAIT)  # tick 1's callback is suspended on its own gate
        rt = n1._runtime
        at, release = held_at(n2, wire.RelocEnvelope)  # shipped (if it gets so far), no more
        try:
            moving = rt.relocator.start(rt.spots["room"], "node-2")  # its barrier waits
            hold.set()  # the callback resumes (and cancels its timer), then the gate is held
            if cancel_after:
                assert at.wait(WAIT)  # shipped
            assert rt.relocator.withdraw("room", moving, zlink.Unavailable("withdrawn"))
        finally:
            release()
        cluster.wait_idle()
        for _ in range(2):
            clock.advance(1.0)
            cluster.wait_idle()
        names, registered = c.request_to_spot("room", NamesR()).wait(WAIT)
        assert registered == "ok"
        if cancel_after:
            assert events == [("tick", 1), ("cancel", True)]
            assert names == ["other"]
        else:
            assert events == [("tick", 1), ("tick", 2), ("tick", 3)]
            assert names == ["beat", "other"]


def test_a_handles_late_ticks_survive_a_move_that_did_not_happen():
    """Found by review: a handle stays its timer's across a move that did not happen (README)
    and ``late_ticks`` counts the periods skipped so far; the put back made the timer anew
    with none (the move's record carries no count)."""
    app = zlink.App("audr5")

    class Nothing(zlink.JsonStateAdapter):
        def capture(self, instance) -> bytes:
            return b""

        def restore(self, instance, data: bytes) -> None:
            pass

    @app.user_spot("audr5.room", relocation=zlink.Relocation.preserve_state(Nothing))
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context
            self.handle = None

        @zlink.handler
        def go(self, msg: GoR5) -> None:
            self.handle = self.context.timers.register("beat", 1.0)

        @zlink.handler
        def late(self, req: LateR5) -> list:
            return [self.handle.active, self.handle.late_ticks]

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            pass

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c = n1.client()
        c.spots.get_or_create("room", "audr5.room").wait(WAIT)
        c.send_to_spot("room", GoR5()).wait(WAIT)
        cluster.wait_idle()
        clock.advance(3.5)  # one tick, 2 periods skipped
        cluster.wait_idle()
        assert c.request_to_spot("room", LateR5()).wait(WAIT) == [True, 2]
        rt = n1._runtime
        at, release = held_at(n2, wire.RelocEnvelope)
        try:
            moving = rt.relocator.start(rt.spots["room"], "node-2")
            assert at.wait(WAIT)
            assert rt.relocator.withdraw("room", moving, zlink.Unavailable("withdrawn"))
        finally:
            release()
        cluster.wait_idle()
        assert c.request_to_spot("room", LateR5()).wait(WAIT) == [True, 2]  # now: [True, 0]


# ---------------------------------------------------------------------------------------------
# Found by a second review of the fixes


class StartX(zlink.Message, type_name="audx.start"):
    pass


def test_a_move_withdrawn_as_its_barrier_holds_a_timer_gate_leaves_the_gate_working(
    monkeypatch,
):
    """Found by review: the move let a held timer gate go from the withdrawing thread while
    that gate was still ending the turn that held it: the gate released its flag twice
    (``RuntimeError``) and never ran again (the timer stopped, a later close waited for it
    for good). A gate is the move's only once quiescent; one held after the move ended lets
    itself go (python-api §8: a move that did not happen leaves the Spot as it was)."""
    from zlink.relocation.source import Outbound

    ticks: list[int] = []
    app = zlink.App("audx1")

    @app.user_spot("audx1.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: StartX) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    inside, go = threading.Event(), threading.Event()
    original = Outbound._hold_timer_gate

    def paused(self: Any, out: Any, owner: Any, then: Any) -> None:
        original(self, out, owner, then)  # held; its turn not ended yet
        inside.set()
        assert go.wait(WAIT)

    monkeypatch.setattr(Outbound, "_hold_timer_gate", paused)
    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=3) as cluster:
        n1 = cluster.nodes[0]
        c = n1.client()
        c.spots.get_or_create("room", "audx1.room").wait(WAIT)
        c.send_to_spot("room", StartX()).wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]
        rt = n1._runtime
        moving = rt.relocator.start(rt.spots["room"], "node-2")
        assert inside.wait(WAIT)
        assert rt.relocator.withdraw("room", moving, zlink.Unavailable("withdrawn"))
        go.set()
        cluster.wait_idle()
        for _ in range(2):
            clock.advance(1.0)
            cluster.wait_idle()
        assert ticks == [1, 2, 3]
        assert rt.spots["room"].ref  # and it closes: no gate waits for good
        assert c.spots.close(rt.spots["room"].ref)
        until(lambda: "room" not in rt.spots, "closed")


def test_a_per_actor_spots_restore_registered_timer_ticks_only_once_it_opens_there():
    """Found by review: a PER_ACTOR ``recreate()`` Spot whose ``on_initialize`` registers a
    timer, restored on the node it moves to, ran its callback there (on a timer gate of its
    own) before the move committed, and so on a copy that never became the Spot when the
    move was withdrawn (kotlin-spot-interface: nothing of the target runs before it is
    Ready). Such a gate is born held, and let go as the Spot opens there."""
    ticks: list[str] = []
    app = zlink.App("audx2")

    @app.user_spot("audx2.room", mode=zlink.ExecutionMode.PER_ACTOR,
                   relocation=zlink.Relocation.recreate())  # fmt: skip
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(_node_id())

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=3) as cluster:
        n1, _n2 = cluster.nodes
        n1.client().spots.get_or_create("room", "audx2.room").wait(WAIT)
        cluster.wait_idle()
        rt = n1._runtime
        at, release = held_at(n1, wire.RelocDoneEnvelope)  # restored on node-2, no commit
        try:
            moving = rt.relocator.start(rt.spots["room"], "node-2")
            assert at.wait(WAIT)
            cluster.wait_idle()
            clock.advance(1.0)
            cluster.wait_idle()
            assert ticks == []  # neither the held source nor the unopened target
            assert rt.relocator.withdraw("room", moving, zlink.Unavailable("withdrawn"))
        finally:
            release()
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert set(ticks) == {"node-1"}  # the source's timer goes on; nothing on node-2
        n1.relocate_spot("room", "node-2", timeout=WAIT)
        ticks.clear()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == ["node-2"]  # opened there: its timer ticks there


def test_a_restore_that_registers_a_moved_timer_with_a_first_delay_still_moves():
    """Found by review: registering the moved timer again "as it was" (same interval and
    options) with a ``first_delay`` was refused on every restore attempt: the Spot could
    never move. Its schedule is the moved one; the first delay has nothing to say."""
    ticks: list[int] = []
    app = zlink.App("audx3")

    @app.user_spot("audx3.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0, first_delay=0.5)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.nodes[0]
        n1.client().spots.get_or_create("room", "audx3.room").wait(WAIT)
        cluster.wait_idle()
        clock.advance(0.5)
        cluster.wait_idle()
        assert ticks == [1]
        n1.relocate_spot("room", "node-2", timeout=WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1, 2]


def test_each_restore_attempt_starts_from_the_moved_timers():
    """Found by review: a restore attempt that failed after cancelling a moved timer left it
    cancelled for the next attempt (or, registered anew, restarted at sequence 1): the move
    restores "the last completed tick sequence" (kotlin-spot-interface) whatever a failed
    attempt did."""
    ticks: list[int] = []
    attempts: list[int] = []
    app = zlink.App("audx4")

    @app.user_spot("audx4.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            if "beat" not in self.context.timers.names():
                self.context.timers.register("beat", 1.0)
            elif _node_id() == "node-2":
                attempts.append(1)
                if len(attempts) == 1:  # the first attempt there fails, its timer cancelled
                    self.context.timers.cancel("beat")
                    self.context.timers.register("beat", 1.0)  # (anew: sequence 1)
                    raise RuntimeError("the first restore fails")

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.nodes[0]
        n1.client().spots.get_or_create("room", "audx4.room").wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]
        n1.relocate_spot("room", "node-2", timeout=WAIT)
        cluster.wait_idle()
        assert len(attempts) == 2
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1, 2]


@pytest.mark.parametrize("unused", [0, -5, 2**64])
def test_a_restore_that_registers_a_moved_timer_with_an_unused_catch_up_value_still_moves(
    unused: int,
):
    """Found by review: the moved timer's unused ``max_catch_up_ticks`` crosses as 1 (it must
    encode), so a restore registering it again as it was, with 0, -5 or 2**64 under
    SKIP_LATE_TICKS, did not match it and was refused: the Spot could never move. "As it
    was" compares what the timer uses (its catch-up bound only under CATCH_UP_BOUNDED)."""
    ticks: list[int] = []
    app = zlink.App(f"audy1{unused}")
    options = zlink.TimerOptions(max_catch_up_ticks=unused)

    @app.user_spot(f"audy1{unused}.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0, options=options)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            ticks.append(tick.sequence)

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1 = cluster.nodes[0]
        n1.client().spots.get_or_create("room", f"audy1{unused}.room").wait(WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1]
        n1.relocate_spot("room", "node-2", timeout=WAIT)
        cluster.wait_idle()
        clock.advance(1.0)
        cluster.wait_idle()
        assert ticks == [1, 2]


class BlockY(zlink.Message, type_name="audy2.block"):
    pass


class RegY(zlink.Message, type_name="audy2.reg"):
    pass


def test_a_second_registration_on_a_sealed_source_is_refused_not_handed_the_first(
    monkeypatch,
):
    """Found by review: on a PER_ACTOR Spot sealed for a move, a registration of a name whose
    first registration (on a timer gate) had not armed its timer yet looked like a moved
    timer arriving "as it was" and was handed that timer: two handles of one registration,
    no ``InvalidOperation`` (README: one name is one timer). Only an arriving object's moved
    timers are matched so."""
    from zlink import timers as timers_module

    outcome: list[str] = []
    e1, armed, go = threading.Event(), threading.Event(), threading.Event()
    app = zlink.App("audy2")

    @app.user_spot("audy2.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def start(self, msg: StartX) -> None:
            self.context.timers.register("a", 1.0)

        @zlink.handler
        def block(self, msg: BlockY) -> None:
            assert e1.wait(WAIT)

        @zlink.handler
        def reg(self, msg: RegY) -> None:
            try:
                self.context.timers.register("x", 1.0)
                outcome.append("ok")
            except zlink.ZLinkError as exc:
                outcome.append(type(exc).__name__)

        @zlink.timer_handler("a")
        def on_a(self, tick: zlink.TimerTick) -> None:
            if tick.sequence == 1:
                self.context.timers.register("x", 1.0)

        @zlink.timer_handler("x")
        def on_x(self, tick: zlink.TimerTick) -> None:
            pass

    real_arm = timers_module.Timer.arm

    def arm(self: Any) -> None:
        if self.name == "x" and not armed.is_set():
            armed.set()
            assert go.wait(WAIT)
        real_arm(self)

    monkeypatch.setattr(timers_module.Timer, "arm", arm)
    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=3) as cluster:
        n1 = cluster.nodes[0]
        c = n1.client()
        c.spots.get_or_create("room", "audy2.room").wait(WAIT)
        c.send_to_spot("room", StartX()).wait(WAIT)
        cluster.wait_idle()
        c.send_to_spot("room", BlockY()).wait(WAIT)
        c.send_to_spot("room", RegY()).wait(WAIT)
        clock.advance(1.0)  # "a" ticks: its callback registers "x", and waits to arm it
        assert armed.wait(WAIT)
        rt = n1._runtime
        moving = rt.relocator.start(rt.spots["room"], "node-2")  # sealed
        e1.set()  # the Spot's handlers queued before the seal run: RegY registers "x" too
        until(lambda: outcome, "RegY ran")
        go.set()
        rt.relocator.withdraw("room", moving, zlink.Unavailable("withdrawn"))
        cluster.wait_idle()
        assert outcome == ["InvalidOperation"]


def test_a_moved_timer_keeps_its_late_ticks_as_it_keeps_its_sequence():
    """The last note's gap: a moved timer went on with its sequence on the target but counted
    its late ticks from 0 again (the move's record carried no count), so its status row and
    its handle read as if no period had ever been skipped."""
    app = zlink.App("audlt")

    @app.user_spot("audlt.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context):
            self.context = context

        @zlink.handler
        def go(self, msg: GoLT) -> None:
            self.context.timers.register("beat", 1.0)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: zlink.TimerTick) -> None:
            pass

    def beat(node: zlink.Node) -> tuple[int, int]:
        rows = [t for o in node.status().owners for t in o.timer_details if t.name == "beat"]
        assert len(rows) == 1
        return rows[0].sequence, rows[0].late_ticks

    clock = ManualClock()
    with LocalCluster(app, nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c = n1.client()
        c.spots.get_or_create("room", "audlt.room").wait(WAIT)
        c.send_to_spot("room", GoLT()).wait(WAIT)
        cluster.wait_idle()
        clock.advance(3.5)  # one tick, 2 periods skipped
        cluster.wait_idle()
        assert beat(n1) == (1, 2)
        n1.relocate_spot("room", "node-2", timeout=WAIT)
        cluster.wait_idle()
        assert beat(n2) == (1, 2)  # was (1, 0)


class GoLT(zlink.Message, type_name="audlt.go"):
    pass
