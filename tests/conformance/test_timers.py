"""Timers: execution-model §16 timer rows (§2) and the Kotlin timer rules, one test per rule.

Time moves only by ``ManualClock.advance``; tests then wait for the node to go idle.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink import OverrunPolicy, TimerOptions, TimerTick
from zlink.testing import ManualClock


class Start(zlink.Message, type_name="t.tm.start"):
    name: str = "beat"
    interval: float = 1.0
    policy: str = "skip"
    catch_up: int = 1
    first_delay: float | None = None


class Stop(zlink.Request[bool], type_name="t.tm.stop"):
    name: str = "beat"


class Meet(zlink.Request[str], type_name="t.tm.meet"):
    pass


class Register(zlink.Request[str], type_name="t.tm.register"):
    name: str
    interval: Any = 1.0
    first_delay: Any = None


def build_app(ticks: list[TimerTick], meeting: threading.Barrier | None = None) -> zlink.App:
    app = zlink.App("timers")

    class Base(zlink.UserSpot):
        @zlink.handler
        def start(self, msg: Start) -> None:
            policy = (
                OverrunPolicy.CATCH_UP_BOUNDED
                if msg.policy == "catch_up"
                else OverrunPolicy.SKIP_LATE_TICKS
            )
            options = TimerOptions(overrun_policy=policy, max_catch_up_ticks=msg.catch_up)
            self.context.timers.register(
                msg.name, msg.interval, options=options, first_delay=msg.first_delay
            )

        @zlink.handler
        def stop(self, req: Stop) -> bool:
            return self.context.timers.cancel(req.name)

        @zlink.handler
        def register(self, req: Register) -> str:
            try:
                self.context.timers.register(req.name, req.interval, first_delay=req.first_delay)
            except zlink.ZLinkError as exc:
                return type(exc).__name__
            return "ok"

        @zlink.handler
        def meet(self, req: Meet) -> str:
            return _meet(meeting)

        @zlink.timer_handler("beat")
        def on_beat(self, tick: TimerTick) -> None:
            ticks.append(tick)

        @zlink.timer_handler("meet-a")
        def on_meet_a(self, tick: TimerTick) -> None:
            ticks.append(tick)
            self.met = _meet(meeting)

        @zlink.timer_handler("meet-b")
        def on_meet_b(self, tick: TimerTick) -> None:
            ticks.append(tick)
            self.met = _meet(meeting)

    app.user_spot("t.tm.wide")(type("Wide", (Base,), {}))
    app.user_spot("t.tm.per", mode=zlink.ExecutionMode.PER_ACTOR)(type("Per", (Base,), {}))
    return app


def _meet(meeting: threading.Barrier | None) -> str:
    assert meeting is not None
    try:
        meeting.wait(0.3)  # opens only if another callback runs at the same time
    except threading.BrokenBarrierError:
        return "alone"
    return "together"


@pytest.fixture
def ticks() -> list[TimerTick]:
    return []


def _spot(make_node: Any, ticks: list[TimerTick], kind: str = "t.tm.wide", **kw: Any):
    meeting = threading.Barrier(2)
    node = make_node(build_app(ticks, meeting), **kw)
    client = node.client()
    client.spots.get_or_create("s", kind).wait(WAIT)
    return node, client, meeting


def test_default_timer_options_are_skip_late_ticks_with_one_catch_up_tick():
    options = TimerOptions()
    assert options.overrun_policy is OverrunPolicy.SKIP_LATE_TICKS
    assert options.max_catch_up_ticks == 1


def test_max_catch_up_ticks_is_validated_only_under_catch_up_bounded():
    TimerOptions(max_catch_up_ticks=0)  # not used, so not validated
    TimerOptions(max_catch_up_ticks=-5)
    bounded = OverrunPolicy.CATCH_UP_BOUNDED
    for bad in (0, -1, 2**31, True, 1.5):
        with pytest.raises(zlink.InvalidArgument):
            TimerOptions(overrun_policy=bounded, max_catch_up_ticks=bad)  # type: ignore[arg-type]
    assert TimerOptions(overrun_policy=bounded, max_catch_up_ticks=2**31 - 1)


def test_a_tick_carries_name_sequence_scheduled_and_fired_time_and_late_count(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks)
    t0 = clock.now()
    client.send_to_spot("s", Start()).submit()
    node.wait_idle(WAIT)
    clock.advance(1.0)
    node.wait_idle(WAIT)
    clock.advance(1.0)
    node.wait_idle(WAIT)
    assert [(t.name, t.sequence, t.scheduled_at, t.fired_at, t.late_ticks) for t in ticks] == [
        ("beat", 1, t0 + 1.0, t0 + 1.0, 0),
        ("beat", 2, t0 + 2.0, t0 + 2.0, 0),
    ]


def test_skip_late_ticks_delivers_one_tick_and_counts_the_rest_late(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks)
    t0 = clock.now()
    client.send_to_spot("s", Start()).submit()
    node.wait_idle(WAIT)
    clock.advance(5.0)  # due at +1; four more periods pass unseen
    node.wait_idle(WAIT)
    assert [(t.sequence, t.late_ticks, t.scheduled_at) for t in ticks] == [(1, 4, t0 + 5.0)]
    clock.advance(1.0)  # the schedule keeps its phase: the next is due at +6
    node.wait_idle(WAIT)
    assert [(t.sequence, t.late_ticks, t.scheduled_at) for t in ticks][-1] == (2, 0, t0 + 6.0)


def test_catch_up_bounded_delivers_at_most_max_catch_up_late_ticks(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks)
    t0 = clock.now()
    client.send_to_spot("s", Start(policy="catch_up", catch_up=2)).submit()
    node.wait_idle(WAIT)
    clock.advance(5.0)
    node.wait_idle(WAIT)
    assert [(t.sequence, t.late_ticks, t.scheduled_at) for t in ticks] == [
        (1, 2, t0 + 3.0),  # two periods beyond the bound were skipped before it
        (2, 0, t0 + 4.0),
        (3, 0, t0 + 5.0),
    ]


def test_first_delay_sets_the_first_due_time_and_cancel_stops_the_ticks(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks)
    client.send_to_spot("s", Start(first_delay=0.25)).submit()
    node.wait_idle(WAIT)
    clock.advance(0.25)
    node.wait_idle(WAIT)
    assert len(ticks) == 1
    assert client.request_to_spot("s", Stop()).wait(WAIT) is True
    assert client.request_to_spot("s", Stop()).wait(WAIT) is False  # already gone
    clock.advance(10)
    node.wait_idle(WAIT)
    assert len(ticks) == 1


def test_bad_timer_registrations_are_typed_errors(make_node, ticks):
    _node, client, _ = _spot(make_node, ticks)

    def register(**kw: Any) -> str:
        result: str = client.request_to_spot("s", Register(**kw)).wait(WAIT)
        return result

    assert register(name="beat", interval=0) == "InvalidArgument"
    assert register(name="beat", interval=-1) == "InvalidArgument"
    assert register(name="beat", interval=True) == "InvalidArgument"
    assert register(name="beat", interval=1, first_delay=-1) == "InvalidArgument"
    assert register(name="no-such-timer") == "InvalidArgument"
    assert register(name="beat") == "ok"
    assert register(name="beat") == "InvalidOperation"  # registered twice
    with pytest.raises(zlink.InvalidArgument):
        zlink.timer_handler("")


def test_in_a_spotwide_spot_a_timer_callback_never_runs_concurrently_with_a_handler(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks, workers=3)
    client.send_to_spot("s", Start(name="meet-a")).submit()
    node.wait_idle(WAIT)
    pending = client.request_to_spot("s", Meet()).future()
    clock.advance(1.0)  # the tick queues behind (or before) the handler on the shared gate
    assert pending.result(WAIT) == "alone"
    node.wait_idle(WAIT)
    assert node._runtime.spots["s"].instance.met == "alone"


def test_in_a_per_actor_spot_callbacks_of_different_timers_run_concurrently(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks, kind="t.tm.per", workers=3)
    client.send_to_spot("s", Start(name="meet-a")).submit()
    client.send_to_spot("s", Start(name="meet-b")).submit()
    node.wait_idle(WAIT)
    clock.advance(1.0)
    node.wait_idle(WAIT)
    assert len(ticks) == 2
    assert node._runtime.spots["s"].instance.met == "together"


def test_timer_ticks_enter_the_application_lane_behind_waiting_messages(
    make_node, ticks, clock: ManualClock
):
    node, client, _ = _spot(make_node, ticks, app_lane_items=4)
    client.send_to_spot("s", Start()).submit()
    node.wait_idle(WAIT)
    lanes = node._runtime.spots["s"].owner.lanes
    assert node._runtime.spots["s"].gate._flag.acquire(False)  # hold the gate: nothing runs
    clock.advance(1.0)
    node._runtime.infra.wait_quiet(WAIT)
    assert lanes.reserved()[0] == 1 and type(lanes.app[0]).__name__ == "TimerJob"
    node._runtime.pool.submit(node._runtime.spots["s"].gate._run)
    node.wait_idle(WAIT)
    assert len(ticks) == 1


class Arm(zlink.Message, type_name="t.tm.arm"):
    pass


class Go(zlink.Message, type_name="t.tm.go"):
    room: str


def test_an_actors_timer_ticks_in_the_actors_own_queue_on_its_current_gate(
    make_node, clock: ManualClock
):
    app = build_app([], threading.Barrier(2))
    seen: list[str] = []

    @app.entry_spot("t.tm.lobby", actor="t.tm.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.tm.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.in_room = threading.Event()

        @zlink.handler
        def arm(self, msg: Arm) -> None:
            self.context.timers.register("own", 1.0)

        @zlink.handler
        def go(self, msg: Go) -> None:
            self.context.join(msg.room).defer()

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            self.in_room.set()

        @zlink.timer_handler("own")
        def on_own(self, tick: TimerTick) -> None:
            turn = zlink.executor.current_turn()
            assert turn is not None and turn.owner is not None
            seen.append(f"{turn.owner.name}@{turn.owner.gate.name}")

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("room", "t.tm.wide").wait(WAIT)
    pid = client.actors.create("t.tm.player").wait(WAIT).actor_id
    client.send_to_actor(pid, Arm()).submit()
    node.wait_idle(WAIT)
    clock.advance(1.0)
    node.wait_idle(WAIT)
    client.send_to_actor(pid, Go(room="room")).submit()
    assert node._runtime.actors[pid].instance.in_room.wait(WAIT)
    clock.advance(1.0)
    node.wait_idle(WAIT)
    assert seen == [f"{pid}@{pid}", f"{pid}@room"]  # its own gate, then the room's shared one


def test_a_timer_that_keeps_alive_counts_as_activity_for_idle_eviction(
    make_node, clock: ManualClock
):
    app = zlink.App("alive")

    @app.user_spot("t.tm.alive")
    class Alive(zlink.UserSpot):
        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0, options=TimerOptions(keeps_alive=True))

        @zlink.timer_handler("beat")
        def on_beat(self, tick: TimerTick) -> None:
            pass

    node = make_node(app, idle_timeout=5.0)
    node.client().spots.get_or_create("alive", "t.tm.alive").wait(WAIT)
    for _ in range(12):
        clock.advance(1.25)
        node.wait_idle(WAIT)
    assert "alive" in node._runtime.spots


class StartSlow(zlink.Message, type_name="t.tm.slow.start"):
    policy: str = "skip"
    catch_up: int = 1


class Poke(zlink.Message, type_name="t.tm.slow.poke"):
    pass


class Ask(zlink.Request[int], type_name="t.tm.slow.ask"):
    pass


def build_slow_app(
    ticks: list[TimerTick], entered: threading.Event, release: threading.Event
) -> zlink.App:
    """A Spot whose timer handler blocks on its first tick until ``release`` is set."""
    app = zlink.App("slow-timers")

    @app.user_spot("t.tm.slow")
    class Slow(zlink.UserSpot):
        pokes = 0

        @zlink.handler
        def start(self, msg: StartSlow) -> None:
            policy = (
                OverrunPolicy.CATCH_UP_BOUNDED
                if msg.policy == "catch_up"
                else OverrunPolicy.SKIP_LATE_TICKS
            )
            options = TimerOptions(overrun_policy=policy, max_catch_up_ticks=msg.catch_up)
            self.handle = self.context.timers.register("slow", 1.0, options=options)

        @zlink.handler
        def poke(self, msg: Poke) -> None:
            self.pokes += 1

        @zlink.handler
        def ask(self, req: Ask) -> int:
            return len(ticks)

        @zlink.timer_handler("slow")
        def on_slow(self, tick: TimerTick) -> None:
            ticks.append(tick)
            if tick.sequence == 1:
                entered.set()
                assert release.wait(WAIT)

    return app


def _block_the_first_tick_and_fire(
    make_node: Any, ticks: list[TimerTick], clock: ManualClock, start: StartSlow, lane: int
) -> tuple[zlink.Node, threading.Event, float]:
    """Start the slow timer, block its first tick, then let it fire 100 times more."""
    entered, release = threading.Event(), threading.Event()
    node = make_node(build_slow_app(ticks, entered, release), app_lane_items=lane)
    client = node.client()
    client.spots.get_or_create("s", "t.tm.slow").wait(WAIT)
    t0 = clock.now()
    client.send_to_spot("s", start).submit()
    node.wait_idle(WAIT)
    clock.advance(1.0)  # the first tick: its handler blocks the Spot
    assert entered.wait(WAIT)
    for _ in range(100):  # the timer fires every interval while its handler is blocked
        clock.advance(1.0)
        assert node._runtime.infra.wait_quiet(WAIT)
    return node, release, t0


def _undelivered_ticks(node: zlink.Node) -> int:
    lanes = node._runtime.spots["s"].owner.lanes
    return sum(1 for job in lanes.app or () if type(job).__name__ == "TimerJob")


def test_a_slow_handler_never_has_more_than_one_undelivered_tick_under_skip_late_ticks(
    make_node, ticks, clock: ManualClock
):
    """python-api §11 "Timers behind a slow handler": lateness is measured when the tick is
    delivered; under SKIP_LATE_TICKS one undelivered tick at most, the rest are late_ticks."""
    node, release, t0 = _block_the_first_tick_and_fire(make_node, ticks, clock, StartSlow(), 4)
    timer = node._runtime.spots["s"].timers["slow"]
    assert _undelivered_ticks(node) == 1
    assert timer.undelivered == 1
    (owner,) = [o for o in node.status().owners if o.owner == "s"]
    assert owner.app_items == 2  # the running tick and the one queued: never 100
    client = node.client()
    client.send_to_spot("s", Poke()).submit()  # application messages still get in
    asked = client.request_to_spot("s", Ask()).timeout(5).future()
    release.set()
    assert asked.result(WAIT) == 2  # answered, behind the one queued tick
    node.wait_idle(WAIT)
    assert [(t.sequence, t.scheduled_at, t.fired_at, t.late_ticks) for t in ticks] == [
        (1, t0 + 1.0, t0 + 1.0, 0),
        (2, t0 + 101.0, t0 + 101.0, 99),  # delivered at +101: the 99 periods before are late
    ]
    assert node._runtime.spots["s"].instance.pokes == 1
    assert timer.late_ticks == 99
    assert node._runtime.spots["s"].instance.handle.late_ticks == 99  # the public view
    assert node.counters().get("timer_late_ticks") == 99
    assert "timer_ticks_dropped" not in node.counters()


def test_a_slow_handler_never_has_more_than_max_catch_up_undelivered_ticks_under_catch_up(
    make_node, ticks, clock: ManualClock
):
    """python-api §11: under CATCH_UP_BOUNDED at most ``max_catch_up_ticks`` undelivered ticks
    are queued; at delivery the tick stands for up to that many late periods, the rest are
    late_ticks."""
    start = StartSlow(policy="catch_up", catch_up=3)
    node, release, t0 = _block_the_first_tick_and_fire(make_node, ticks, clock, start, 8)
    timer = node._runtime.spots["s"].timers["slow"]
    assert _undelivered_ticks(node) == 3
    assert timer.undelivered == 3
    (owner,) = [o for o in node.status().owners if o.owner == "s"]
    assert owner.app_items == 4
    client = node.client()
    client.send_to_spot("s", Poke()).submit()
    asked = client.request_to_spot("s", Ask()).timeout(5).future()
    release.set()
    assert asked.result(WAIT) >= 1
    node.wait_idle(WAIT)
    assert [(t.sequence, t.scheduled_at, t.late_ticks) for t in ticks] == [
        (1, t0 + 1.0, 0),
        (2, t0 + 98.0, 96),  # 3 late periods are caught up, the 96 before them skipped
        (3, t0 + 99.0, 0),
        (4, t0 + 100.0, 0),
        (5, t0 + 101.0, 0),
    ]
    assert timer.late_ticks == 96
    assert node.counters().get("timer_late_ticks") == 96
    assert timer.undelivered == 0


def test_a_tick_queued_on_time_but_delivered_late_counts_its_lateness_at_delivery(
    make_node, ticks, clock: ManualClock
):
    """python-api §11: a tick that waited in the lane behind a slow handler is late when it is
    delivered, though it was on time when it fired: SKIP_LATE_TICKS delivers the newest due tick
    instead, and no tick is queued behind it meanwhile."""
    node, release, t0 = _block_the_first_tick_and_fire(make_node, ticks, clock, StartSlow(), 4)
    clock.advance(0.5)  # not a period boundary: nothing more comes due
    release.set()
    node.wait_idle(WAIT)
    assert [(t.sequence, t.scheduled_at, t.fired_at, t.late_ticks) for t in ticks][-1] == (
        2,
        t0 + 101,
        t0 + 101.5,  # fired_at: when it was delivered, though its place was queued at +2
        99,
    )
    clock.advance(0.5)  # the schedule keeps its phase: the next is due at +102, on time
    node.wait_idle(WAIT)
    assert [(t.sequence, t.scheduled_at, t.late_ticks) for t in ticks][-1] == (3, t0 + 102, 0)
    assert node._runtime.spots["s"].timers["slow"].late_ticks == 99


class Hold(zlink.Request[str], type_name="t.tm.hold"):
    pass


def _closing_app(events: list[str], in_tick: threading.Event, go: threading.Event) -> zlink.App:
    app = zlink.App("timers-closing")

    class Hall(zlink.UserSpot):
        @zlink.handler
        def start(self, msg: Start) -> None:
            self.context.timers.register(msg.name, msg.interval, first_delay=0)

        @zlink.timer_handler("sync")
        def on_sync(self, tick: TimerTick) -> None:
            events.append("sync tick")
            in_tick.set()
            assert go.wait(WAIT)
            events.append("sync tick ends")

        @zlink.timer_handler("other")
        def on_other(self, tick: TimerTick) -> None:
            events.append("other tick")

        @zlink.timer_handler("async")
        async def on_async(self, tick: TimerTick) -> None:
            events.append("async tick")
            in_tick.set()
            await self.context.outbound.request_to_spot("svc", Hold()).timeout(WAIT)
            events.append("async tick resumed")

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            events.append("on_closing")

    class Svc(zlink.UserSpot):
        @zlink.handler
        def hold(self, req: Hold) -> str:
            assert go.wait(WAIT)
            return "done"

    app.user_spot("t.tm.hall", mode=zlink.ExecutionMode.PER_ACTOR)(Hall)
    app.user_spot("t.tm.svc")(Svc)
    return app


def _close_waits_for_the_tick(
    node: zlink.Node, ref: zlink.SpotRef, events: list[str], go: threading.Event
) -> None:
    """Close the Spot while a tick holds its timer's gate: ``on_closing`` waits for it."""
    assert node.client().spots.close(ref)
    assert not node.wait_idle(0.2)  # the tick holds its gate: on_closing must not run
    assert "on_closing" not in events, events
    go.set()
    assert node.wait_idle(WAIT)


@pytest.mark.parametrize("timer", ["sync", "async"])
def test_closing_a_per_actor_spot_waits_for_its_timer_callbacks(clock: ManualClock, timer: str):
    """A probe: a PER_ACTOR Spot gives each timer a gate of its own, and a close ran
    ``on_closing`` while a tick still ran there (or was suspended in a plain await), whose
    code then ran after it. A close waits for the all-lane barrier before ``on_closing``, the
    timers' lanes too (python-api §11: no continuation ever runs after ``on_closing``)."""
    events: list[str] = []
    in_tick, go = threading.Event(), threading.Event()
    with zlink.Node(_closing_app(events, in_tick, go), zlink.NodeConfig(workers=4),
                    clock=clock) as node:  # fmt: skip
        client = node.client()
        client.spots.get_or_create("svc", "t.tm.svc").wait(WAIT)
        ref = client.spots.get_or_create("hall", "t.tm.hall").wait(WAIT).spot_ref
        client.send_to_spot("hall", Start(name=timer, interval=60.0)).wait(WAIT)
        clock.advance(0)
        assert in_tick.wait(WAIT)
        _close_waits_for_the_tick(node, ref, events, go)
    end = "sync tick ends" if timer == "sync" else "async tick resumed"
    assert events == [f"{timer} tick", end, "on_closing"], events


def test_the_close_of_a_per_actor_spot_waits_for_a_timer_registered_before_another(
    clock: ManualClock,
):
    """A review: the Spot kept its timers' gates but dropped the ones idle when another timer
    was registered, so a close did not wait for a tick of the first timer."""
    events: list[str] = []
    in_tick, go = threading.Event(), threading.Event()
    with zlink.Node(_closing_app(events, in_tick, go), zlink.NodeConfig(workers=4),
                    clock=clock) as node:  # fmt: skip
        client = node.client()
        ref = client.spots.get_or_create("hall", "t.tm.hall").wait(WAIT).spot_ref
        client.send_to_spot("hall", Start(name="sync", interval=60.0)).wait(WAIT)
        clock.advance(0)
        assert in_tick.wait(WAIT)
        go.set()  # the first tick ends; the gate of "sync" is idle now
        assert node.wait_idle(WAIT)
        go.clear()
        in_tick.clear()
        client.send_to_spot("hall", Start(name="other", interval=600.0)).wait(WAIT)
        assert node.wait_idle(WAIT)
        clock.advance(60.0)  # the next tick of "sync" (and one of "other")
        assert in_tick.wait(WAIT)
        _close_waits_for_the_tick(node, ref, events, go)
    assert events[-2:] == ["sync tick ends", "on_closing"], events
