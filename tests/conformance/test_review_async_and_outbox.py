"""Review of 300104f, 1ba6f33 and 65705ea (fresh eyes): each test fails on the code as
reviewed. Every wait is bounded; nothing sleeps to wait for the runtime (``until`` polls a
counter where no event exists)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import zlink
from tests.conformance.test_async_probe_faults import _outcomes
from tests.conftest import WAIT, fill


class RvNote(zlink.Message, type_name="t.rva.note"):
    n: int = 0


class RvBlock(zlink.Message, type_name="t.rva.block"):
    pass


class RvSeen(zlink.Request[list[int]], type_name="t.rva.seen"):
    pass


BLOCK_IN = threading.Event()
BLOCK_GO = threading.Event()


def _sink_app() -> zlink.App:
    app = zlink.App("review-today-sink")

    @app.user_spot("t.rva.sink")
    class Sink(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[int] = []

        @zlink.handler
        def note(self, msg: RvNote) -> None:
            self.seen.append(msg.n)

        @zlink.handler
        def block(self, msg: RvBlock) -> None:
            BLOCK_IN.set()
            assert BLOCK_GO.wait(WAIT)

        @zlink.handler
        def seen(self, req: RvSeen) -> list[int]:
            return self.seen

    return app


# -- 1ba6f33 (b): a cancelled asyncio `await send` of a zlink.connect client -------------------
def test_a_cancelled_await_send_of_a_remote_client_says_it_may_still_be_admitted() -> None:
    """errors.md "Cancelled" said a cancelled ``await send`` that raises ``CancelledError``
    queued nothing. A ``zlink.connect`` client's send whose frame left waits for the node's
    verdict (``withdraw = in_progress``), and the node admitted and ran it later: such a
    send cannot be withdrawn, and the guide now says so. Its ``CancelledError`` carries a
    note that it may still be admitted (as a ``wait()``'s ``DeadlineExceeded`` says)."""
    BLOCK_IN.clear()
    BLOCK_GO.clear()
    node = zlink.Node(
        _sink_app(),
        zlink.NodeConfig(workers=2, app_lane_items=2, listen="tcp://127.0.0.1:0"),
    ).start()
    client = None
    try:
        local = node.client()
        local.spots.get_or_create("s", "t.rva.sink").wait(WAIT)
        local.send_to_spot("s", RvBlock()).submit()
        assert BLOCK_IN.wait(WAIT)
        fill(lambda n: local.send_to_spot("s", RvNote(n=1)).submit())
        assert node.address is not None
        client = zlink.connect(node.address, timeout=WAIT)
        waits = node.counters().get("admission_waits", 0)
        notes: list[str] = []

        async def main() -> str:
            task = asyncio.ensure_future(_awaiting(client.send_to_spot("s", RvNote(n=100))))
            # the frame leaves; the node holds the send, waiting for room in the lane
            while node.counters().get("admission_waits", 0) == waits:
                assert not task.done(), task
                await asyncio.sleep(0.002)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError as exc:
                notes.extend(getattr(exc, "__notes__", ()))
                return "cancelled"
            return "admitted"

        outcome = asyncio.run(asyncio.wait_for(main(), WAIT))
        BLOCK_GO.set()
        seen = local.request_to_spot("s", RvSeen()).wait(WAIT)
        if outcome == "cancelled" and 100 in seen:
            assert any("may still admit it" in note for note in notes), (
                f"the send ran, and its CancelledError did not say it might: {notes}"
            )
    finally:
        BLOCK_GO.set()
        if client is not None:
            client.close()
        node.shutdown(WAIT)


async def _awaiting(call: Any) -> Any:
    return await call


# -- 1ba6f33 (c): waits for room in the outbox to another node, bounded per target ---------------
def test_awaited_sends_that_waited_for_the_store_are_not_bounded_in_the_outbox() -> None:
    """README "Waiting for room" / errors.md ``ResourceExhausted``: at most
    ``NodeConfig.admission_waiters`` callers wait per target, "in its lane or in the outbound
    queue to its node" (python-api §9). ``_outbox_room`` bounds a caller only when the route
    is known: a call that first asked the store where its target is (``_answer``) passes
    ``accepted=True`` whatever it is (a request, an awaited send), so any number of awaited
    sends to a target on another node wait in the outbox, here 6 with a bound of 2."""
    from zlink.testing import LocalCluster

    BLOCK_IN.clear()
    BLOCK_GO.clear()
    held_in, held_go = threading.Event(), threading.Event()
    with LocalCluster(
        _sink_app(), nodes=2, workers=2, app_lane_items=2,
        admission_waiters=2, peer_outbound_bytes=1, peer_backlog_items=1,
    ) as cluster:  # fmt: skip
        try:
            far = cluster.node(1).client()
            far.spots.get_or_create("s", "t.rva.sink").wait(WAIT)
            far.spots.get_or_create("t", "t.rva.sink").wait(WAIT)  # no route to it on node 0
            node = cluster.node(0)
            client = node.client()
            client.send_to_spot("s", RvBlock()).submit()
            assert BLOCK_IN.wait(WAIT)
            with pytest.raises(zlink.ResourceExhausted):  # the outbox to node 1 fills up
                for _ in range(100_000):
                    client.send_to_spot("s", RvNote(n=1)).submit()
            base = node.counters().get("admission_waits", 0)
            n = 6

            def hold() -> None:  # the store thread answers no lookup until every call is made
                held_in.set()
                held_go.wait(WAIT)

            router = node._rt.router
            assert router is not None
            router.store_worker.call(hold)
            assert held_in.wait(WAIT)

            async def main() -> list[str]:
                tasks = [
                    asyncio.ensure_future(_awaiting(client.send_to_spot("t", RvNote(n=7))))
                    for _ in range(n)
                ]
                await asyncio.sleep(0)  # each task made its call (it waits for the store)
                assert not any(t.done() for t in tasks)
                held_go.set()

                def settled() -> int:
                    waits = node.counters().get("admission_waits", 0) - base
                    return waits + sum(1 for t in tasks if t.done())

                while settled() < n:  # each waits in the outbox, or is refused
                    await asyncio.sleep(0.002)
                return await _outcomes(tasks)

            outcome = asyncio.run(asyncio.wait_for(main(), WAIT))
            assert outcome.count("waiting") <= 2, outcome
        finally:
            held_go.set()
            BLOCK_GO.set()
