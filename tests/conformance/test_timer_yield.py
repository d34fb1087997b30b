"""Timer callbacks that Yield (python-api §11 "Timers behind a slow handler"; kotlin-spot-
interface: a suspending timer handler keeps its gate except in ``yield()``).

A timer callback that awaits a call with ``yield_()`` gives its gate back while it waits. The
ticks that came due meanwhile were delivered at once, each one a new callback that yielded in
turn: with a call slower than the period, the suspended callbacks of one timer piled up
without bound (each holding its call), though a timer "never has more than one undelivered
tick". Now the ticks of one timer never overlap (as Orleans's timers: the next callback waits
for the previous one's task): a tick that finds an earlier one still suspended is not
delivered, its periods stay owed, and they are delivered, late ones counted in
``late_ticks``, when that callback ended. Time moves only by ``ManualClock.advance``.
"""

from __future__ import annotations

import threading
from typing import Any

import zlink
from tests.conftest import WAIT, until
from zlink import OverrunPolicy, TimerOptions, TimerTick
from zlink.testing import ManualClock


class Begin(zlink.Message, type_name="t.tyl.begin"):
    policy: str = "skip"
    catch_up: int = 1


class Slow(zlink.Request[str], type_name="t.tyl.slow"):
    pass


class Count(zlink.Request[int], type_name="t.tyl.count"):
    pass


def _app(ticks: list[TimerTick], inside: list[int], release: threading.Event) -> zlink.App:
    app = zlink.App("timer-yield")
    lock = threading.Lock()

    @app.user_spot("t.tyl.slowpoke")
    class Slowpoke(zlink.UserSpot):
        @zlink.handler
        def slow(self, req: Slow) -> str:
            assert release.wait(WAIT)
            return "done"

    @app.user_spot("t.tyl.ticker")  # SpotWide: only a shared gate is given back by a Yield
    class Ticker(zlink.UserSpot):
        @zlink.handler
        def begin(self, msg: Begin) -> None:
            policy = (
                OverrunPolicy.CATCH_UP_BOUNDED
                if msg.policy == "catch_up"
                else OverrunPolicy.SKIP_LATE_TICKS
            )
            options = TimerOptions(overrun_policy=policy, max_catch_up_ticks=msg.catch_up)
            self.context.timers.register("beat", 1.0, options=options)

        @zlink.handler
        def count(self, req: Count) -> int:
            return len(ticks)

        @zlink.timer_handler("beat")
        async def on_beat(self, tick: TimerTick) -> None:
            with lock:
                ticks.append(tick)
                inside[0] += 1
                inside[1] = max(inside[1], inside[0])
            try:
                await self.context.outbound.request_to_spot("slowpoke", Slow()).timeout(30).yield_()
            finally:
                with lock:
                    inside[0] -= 1

    return app


def test_ticks_of_a_timer_whose_callback_yields_never_overlap(
    make_node: Any, clock: ManualClock
) -> None:
    """python-api §11: while the first tick's callback waits (gate given back), 20 periods
    pass; no second callback of the timer starts, and when the first ends one tick is
    delivered for the periods owed, 19 of them counted late (SKIP_LATE_TICKS)."""
    ticks: list[TimerTick] = []
    inside = [0, 0]  # callbacks suspended now, most at once
    release = threading.Event()
    node = make_node(_app(ticks, inside, release))
    client = node.client()
    try:
        client.spots.get_or_create("slowpoke", "t.tyl.slowpoke").wait(WAIT)
        client.spots.get_or_create("ticker", "t.tyl.ticker").wait(WAIT)
        t0 = clock.now()
        client.send_to_spot("ticker", Begin()).wait(WAIT)
        assert node.wait_idle(WAIT)  # the timer is registered
        clock.advance(1.0)
        until(lambda: inside[0] == 1, "the first tick's callback waits on its call")
        for _ in range(20):  # periods pass while it waits with its gate given back
            clock.advance(1.0)
            assert node._runtime.infra.wait_quiet(WAIT)
        # the Spot still serves its messages meanwhile (the gate was given back)
        assert client.request_to_spot("ticker", Count()).wait(WAIT) == 1
        assert inside[1] == 1, f"{inside[1]} callbacks of one timer were suspended at once"
    finally:
        release.set()
    until(lambda: len(ticks) == 2 and inside[0] == 0, "the owed tick, once the first ended")
    assert node.wait_idle(WAIT)
    assert inside[1] == 1
    assert [(t.sequence, t.scheduled_at, t.late_ticks) for t in ticks] == [
        (1, t0 + 1.0, 0),
        (2, t0 + 21.0, 20 - 1),  # delivered after +21: the 19 periods before it are late
    ]
    assert node.counters().get("timer_late_ticks") == 19


def test_catch_up_ticks_of_a_callback_that_yields_run_one_after_another(
    make_node: Any, clock: ManualClock
) -> None:
    """CATCH_UP_BOUNDED: the periods owed behind a yielding callback are caught up (at most
    ``max_catch_up_ticks`` of them) one callback after another, never two at once."""
    ticks: list[TimerTick] = []
    inside = [0, 0]
    release = threading.Event()
    release.set()  # the slowpoke answers at once: each callback yields briefly
    node = make_node(_app(ticks, inside, release))
    client = node.client()
    client.spots.get_or_create("slowpoke", "t.tyl.slowpoke").wait(WAIT)
    client.spots.get_or_create("ticker", "t.tyl.ticker").wait(WAIT)
    t0 = clock.now()
    client.send_to_spot("ticker", Begin(policy="catch_up", catch_up=3)).wait(WAIT)
    assert node.wait_idle(WAIT)
    clock.advance(10.0)  # ten periods at once: one tick and 3 caught up, 6 late
    until(lambda: len(ticks) == 4 and inside[0] == 0, "the tick and its catch-up ticks")
    assert node.wait_idle(WAIT)
    assert inside[1] == 1, f"{inside[1]} callbacks of one timer were suspended at once"
    assert [(t.sequence, t.scheduled_at, t.late_ticks) for t in ticks] == [
        (1, t0 + 7.0, 6),
        (2, t0 + 8.0, 0),
        (3, t0 + 9.0, 0),
        (4, t0 + 10.0, 0),
    ]
