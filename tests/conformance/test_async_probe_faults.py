"""Faults found by a probe of async handlers, Yield, ``await`` on ZLink calls and asyncio
callers (python-api §4, §9, §10, §11; execution-model §3; kotlin-spot-interface lifecycle).

Each test fails on the code as it was probed; none sleeps to wait for the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import ManualClock, run_until_idle


class PAdd(zlink.Message, type_name="t.pa.add"):
    n: int = 0


class PBlock(zlink.Message, type_name="t.pa.block"):
    pass


class PAsk(zlink.Message, type_name="t.pa.ask"):
    pass


class PHold(zlink.Request[str], type_name="t.pa.hold"):
    who: str


class PLog(zlink.Request[list[str]], type_name="t.pa.log"):
    pass


def _events(*names: str) -> dict[str, threading.Event]:
    return {name: threading.Event() for name in names}


# -- on_closing that Yields ------------------------------------------------------------------
def _closing_app(log: list[str], ev: dict[str, threading.Event]) -> zlink.App:
    app = zlink.App("probe-async-closing")

    @app.user_spot("t.pa.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def add(self, msg: PAdd) -> None:
            log.append(f"add {msg.n}")

        @zlink.handler
        def block(self, msg: PBlock) -> None:
            log.append("block")
            ev["block_in"].set()
            assert ev["block_go"].wait(WAIT)

        @zlink.handler
        async def ask(self, msg: PAsk) -> None:
            log.append("ask start")
            await self.context.outbound.request("t.pa.api", PHold(who="ask")).yield_()
            log.append("ask resumed")

        async def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            log.append("closing start")
            await self.context.outbound.request("t.pa.api", PHold(who="closing")).yield_()
            log.append("closing end")
            ev["closing_end"].set()

    @app.channel("t.pa.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: PHold) -> str:
            if req.who == "closing":
                ev["closing_in"].set()
                # (a queued message that runs while on_closing waits asks first; bounded wait)
                ev["ask_in"].wait(2.0)
                return "closing"
            ev["ask_in"].set()
            assert ev["ask_go"].wait(WAIT)
            return "ask"

    return app


def test_messages_queued_before_a_close_do_not_run_while_on_closing_yields(clock: ManualClock):
    """A close discards what was queued (``messages_discarded_spot_closed``) and runs no
    handler after ``on_closing`` began: so it does when ``on_closing`` awaits (keeping the
    turn), but when it Yields, the messages queued before the close run while it waits,
    after ``on_closing`` started (kotlin-spot-interface lifecycle; python-api §11)."""
    log: list[str] = []
    ev = _events("block_in", "block_go", "closing_in", "closing_end", "ask_in", "ask_go")
    ev["ask_in"].set()  # (no ask here)
    node = zlink.Node(_closing_app(log, ev), zlink.NodeConfig(workers=3), clock=clock).start()
    try:
        client = node.client()
        ref = client.spots.get_or_create("r", "t.pa.room").wait(WAIT).spot_ref
        client.send_to_spot("r", PBlock()).submit()
        assert ev["block_in"].wait(WAIT)
        for n in range(3):
            client.send_to_spot("r", PAdd(n=n)).submit()
        assert client.spots.close(ref)
        ev["block_go"].set()
        assert ev["closing_end"].wait(WAIT)
        run_until_idle(node)
        assert log[:2] == ["block", "closing start"]
        assert [e for e in log if e.startswith("add")] == [], log
        assert node.status().counters.get("messages_discarded_spot_closed") == 3
    finally:
        ev["block_go"].set()
        ev["ask_go"].set()
        node.shutdown(WAIT)


def test_no_continuation_runs_after_an_on_closing_that_yielded(clock: ManualClock):
    """python-api §11: "No continuation ever runs after ``on_closing``". A message queued
    before the close starts while ``on_closing`` Yields, Yields itself, and its continuation
    resumes after ``on_closing`` ended and the Spot is gone."""
    log: list[str] = []
    ev = _events("block_in", "block_go", "closing_in", "closing_end", "ask_in", "ask_go")
    node = zlink.Node(_closing_app(log, ev), zlink.NodeConfig(workers=3), clock=clock).start()
    try:
        client = node.client()
        ref = client.spots.get_or_create("r", "t.pa.room").wait(WAIT).spot_ref
        client.send_to_spot("r", PBlock()).submit()
        assert ev["block_in"].wait(WAIT)
        client.send_to_spot("r", PAsk()).submit()
        assert client.spots.close(ref)
        ev["block_go"].set()
        assert ev["closing_end"].wait(WAIT)
        ev["ask_go"].set()
        run_until_idle(node)
        assert "closing end" in log
        after = log[log.index("closing end") + 1 :]
        assert after == [], f"ran after on_closing ended: {after} (log {log})"
    finally:
        ev["block_go"].set()
        ev["ask_go"].set()
        node.shutdown(WAIT)


# -- on_create / on_initialize that Yield ---------------------------------------------------
def _init_app(log: list[str], ev: dict[str, threading.Event], where: str) -> zlink.App:
    app = zlink.App("probe-async-init")

    @app.user_spot("t.pa.room")
    class Room(zlink.UserSpot):
        async def on_create(self, request: zlink.Message | None) -> None:
            log.append("create start")
            if where == "create":
                await self.context.outbound.request("t.pa.api", PHold(who="init")).yield_()
            log.append("create end")

        async def on_initialize(self) -> None:
            log.append("init start")
            if where == "init":
                await self.context.outbound.request("t.pa.api", PHold(who="init")).yield_()
            log.append("init end")

        @zlink.handler
        def add(self, msg: PAdd) -> None:
            log.append(f"add {msg.n}")

    _holding_api(app, ev)

    return app


def _holding_api(app: zlink.App, ev: dict[str, threading.Event]) -> None:
    """The ``t.pa.api`` Channel: its ``hold`` sets ``held`` and answers once ``go`` is set."""

    @app.channel("t.pa.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: PHold) -> str:
            ev["held"].set()
            assert ev["go"].wait(WAIT)
            return "ok"


@pytest.mark.parametrize("where", ["create", "init"])
def test_no_message_runs_before_on_initialize_ended_when_a_lifecycle_callback_yields(
    clock: ManualClock, where: str
) -> None:
    """docs/guide/concepts.md "Lifecycle": a User Spot hears ``on_create``, then
    ``on_initialize()``, "before any message". Yield is offered in a SpotWide Spot's lifecycle
    callbacks (concepts "Yield or await"), but a Yield there lets a message that arrived
    meanwhile run before ``on_create``/``on_initialize`` ended (with ``on_create`` even
    before ``on_initialize`` started)."""
    log: list[str] = []
    ev = _events("held", "go")
    node = zlink.Node(_init_app(log, ev, where), zlink.NodeConfig(workers=3), clock=clock).start()
    try:
        client = node.client()
        made = client.spots.get_or_create("r", "t.pa.room").future()
        assert ev["held"].wait(WAIT)
        with contextlib.suppress(zlink.ZLinkError):  # refused while not ready: acceptable
            client.send_to_spot("r", PAdd(n=1)).submit()
        ev["go"].set()
        made.result(WAIT)
        run_until_idle(node)
        if "add 1" in log:
            assert log.index("add 1") > log.index("init end"), log
    finally:
        ev["go"].set()
        node.shutdown(WAIT)


# -- asyncio callers outside the runtime -----------------------------------------------------
def _sink_app(seen: list[int], ev: dict[str, threading.Event]) -> zlink.App:
    app = zlink.App("probe-async-sink")

    @app.user_spot("t.pa.sink")
    class Sink(zlink.UserSpot):
        @zlink.handler
        def add(self, msg: PAdd) -> None:
            seen.append(msg.n)
            if msg.n == 100:
                ev["added"].set()

        @zlink.handler
        def block(self, msg: PBlock) -> None:
            ev["block_in"].set()
            assert ev["block_go"].wait(WAIT)

    return app


def test_an_asyncio_send_whose_await_is_cancelled_is_not_reported_cancelled_once_admitted(
    clock: ManualClock,
) -> None:
    """errors.md "Cancelled" / python-api §9: an asyncio ``await send`` that is cancelled
    gives up a send still waiting for room, so the caller may take the cancellation as "not
    sent". When the send was admitted before the task saw its cancellation, the wait cannot
    be withdrawn (``Admitted.abandon`` says so), yet the task still raises
    ``CancelledError`` (``asyncio.wait_for``: ``TimeoutError``): the caller is told it gave the
    send up, and the message is handled anyway. A probe with 600 concurrent awaits under
    ``wait_for`` across two nodes had 186 of 283 "timed out" sends handled."""
    seen: list[int] = []
    ev = _events("added", "block_in", "block_go")
    node = zlink.Node(
        _sink_app(seen, ev), zlink.NodeConfig(workers=2, app_lane_items=2), clock=clock
    ).start()
    try:
        client = node.client()
        client.spots.get_or_create("s", "t.pa.sink").wait(WAIT)
        client.send_to_spot("s", PBlock()).submit()
        assert ev["block_in"].wait(WAIT)
        queued = 0
        with pytest.raises(zlink.ResourceExhausted):
            for _ in range(10):
                client.send_to_spot("s", PAdd(n=1)).submit()
                queued += 1

        async def main() -> str:
            task = asyncio.ensure_future(_awaiting(client.send_to_spot("s", PAdd(n=100))))
            await asyncio.sleep(0)  # the task submits and waits for room
            await asyncio.sleep(0)
            ev["block_go"].set()
            # (the loop's thread, on purpose: the admission reaches the task only later)
            assert ev["added"].wait(WAIT)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
            return "admitted"

        outcome = asyncio.run(main())
        run_until_idle(node)
        assert 100 in seen  # the message was admitted and handled
        assert outcome == "admitted", "the caller was told its send was cancelled, and it ran"
    finally:
        ev["block_go"].set()
        node.shutdown(WAIT)


async def _awaiting(call: Any) -> Any:
    return await call


async def _outcomes(tasks: list[asyncio.Future[Any]]) -> list[str]:
    """Each task's outcome now: ``admitted``, its error's type name, or ``waiting`` (then
    cancelled, and all of them awaited)."""
    out = []
    for task in tasks:
        if task.done():
            exc = task.exception()
            out.append(type(exc).__name__ if exc is not None else "admitted")
        else:
            out.append("waiting")
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return out


def test_asyncio_waits_for_room_in_the_outbox_to_another_node_are_bounded_per_target(
    clock: ManualClock,
) -> None:
    """python-api §9: waiters for room "in the target's lane (or, for a remote target, the
    source's outbound queue to that peer)" are bounded, ``NodeConfig.admission_waiters`` per
    target; past it, ``ResourceExhausted`` at once. A full lane here refuses the third of
    three awaits with ``admission_waiters=2``; a full outbox to another node lets every one
    of them wait (the outbox's waiter queue has no bound)."""
    from zlink.testing import LocalCluster

    seen: list[int] = []
    ev = _events("added", "block_in", "block_go")
    with LocalCluster(
        _sink_app(seen, ev), nodes=2, clock=clock, workers=2, app_lane_items=2,
        admission_waiters=2, peer_outbound_bytes=1, peer_backlog_items=1,
    ) as cluster:  # fmt: skip
        try:
            cluster.node(1).client().spots.get_or_create("s", "t.pa.sink").wait(WAIT)
            client = cluster.node(0).client()
            client.send_to_spot("s", PBlock()).submit()
            assert ev["block_in"].wait(WAIT)
            with pytest.raises(zlink.ResourceExhausted):  # the outbox to node-2 fills up
                for _ in range(100_000):
                    client.send_to_spot("s", PAdd(n=1)).submit()

            async def main() -> list[str]:
                tasks = [
                    asyncio.ensure_future(_awaiting(client.send_to_spot("s", PAdd(n=7))))
                    for _ in range(4)
                ]
                for _ in range(3):
                    await asyncio.sleep(0)  # each task submits: it waits or is refused
                return await _outcomes(tasks)

            outcome = asyncio.run(main())
            assert outcome.count("waiting") <= 2, outcome
        finally:
            ev["block_go"].set()


# -- on_relocation_ready_completed that Yields ---------------------------------------------------
class PReady(zlink.Request[str], type_name="t.pa.ready"):
    pass


def _signaled_app(log: list[str], ev: dict[str, threading.Event]) -> zlink.App:
    app = zlink.App("probe-async-signaled")

    @app.user_spot(
        "t.pa.table",
        relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter),
        relocation_coordination=zlink.RelocationCoordination.APPLICATION_SIGNALED,
    )
    class Table(zlink.UserSpot):
        @zlink.handler
        def ready(self, req: PReady) -> str:
            log.append("ready")
            self.context.relocation_ready().defer()
            assert ev["add_sent"].wait(WAIT)  # a message arrives behind the boundary
            return "ok"

        @zlink.handler
        def add(self, msg: PAdd) -> None:
            log.append(f"add {msg.n}")

        async def on_relocation_ready_completed(
            self, completion: zlink.SpotRelocationReadyCompletion
        ) -> None:
            log.append(f"{completion.status.name} start")
            await self.context.outbound.request("t.pa.api", PHold(who="cb")).yield_()
            log.append(f"{completion.status.name} end")

    _holding_api(app, ev)

    return app


def test_held_messages_do_not_run_before_a_yielding_relocation_ready_callback_completes(
    clock: ManualClock,
) -> None:
    """kotlin-spot-interface (APPLICATION_SIGNALED): "Held messages and timers are not
    executed before the callback completes" (``onRelocationReadyCompletedSuspending``, a
    suspending callback). When ``on_relocation_ready_completed`` Yields, the message held
    behind the boundary runs while the callback waits, before it completes."""
    from zlink.testing import LocalCluster

    log: list[str] = []
    ev = _events("add_sent", "held", "go")
    with LocalCluster(_signaled_app(log, ev), nodes=2, clock=clock, workers=3) as cluster:
        try:
            client = cluster.node(0).client()
            client.spots.get_or_create("t", "t.pa.table").wait(WAIT)
            ready = client.request_to_spot("t", PReady()).future()
            client.send_to_spot("t", PAdd(n=1)).submit()
            ev["add_sent"].set()
            assert ready.result(WAIT) == "ok"
            assert ev["held"].wait(WAIT)  # the callback waits on its Yield
            ev["go"].set()
            cluster.wait_idle(WAIT)
            assert log.index("add 1") > log.index("CONTINUED end"), log
        finally:
            ev["add_sent"].set()
            ev["go"].set()


# -- asyncio code run inside a turn --------------------------------------------------------------
class PGo(zlink.Request[str], type_name="t.pa.go"):
    pass


class PPing(zlink.Request[str], type_name="t.pa.ping"):
    pass


def test_await_in_asyncio_code_inside_a_def_handler_is_refused_before_submission(
    clock: ManualClock,
) -> None:
    """python-api §4: a terminal that blocks (``call.wait``) "inside a turn raises
    ``InvalidOperation`` without submitting"; refusals come before anything is submitted.
    A ``def`` handler that runs asyncio code (``asyncio.run``) awaiting a call is inside a
    turn too, but the call takes the handler path: it is submitted (the target runs it),
    then the asyncio task dies of ``RuntimeError: Task got bad yield`` (the Suspension meant
    for the runtime), not a typed ``zlink.errors`` error."""
    pings: list[int] = []
    app = zlink.App("probe-async-nested-loop")

    @app.user_spot("t.pa.nest")
    class Nest(zlink.UserSpot):
        @zlink.handler
        def go(self, req: PGo) -> str:
            async def main() -> str:
                return await self.context.outbound.request("t.pa.pinger", PPing())  # type: ignore[no-any-return]

            try:
                return asyncio.run(main())
            except zlink.InvalidOperation:
                return "refused"

    @app.channel("t.pa.pinger")
    class Pinger:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def ping(self, req: PPing) -> str:
            pings.append(1)
            return "pong"

    node = zlink.Node(app, zlink.NodeConfig(workers=2), clock=clock).start()
    try:
        client = node.client()
        client.spots.get_or_create("n", "t.pa.nest").wait(WAIT)
        outcome = client.request_to_spot("n", PGo()).wait(WAIT)
        run_until_idle(node)
        assert outcome == "refused" and pings == []
    finally:
        node.shutdown(WAIT)
