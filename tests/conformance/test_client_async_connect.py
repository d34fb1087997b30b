"""A ``zlink.connect`` client in asyncio code (python-api §10: "``await`` on a call bridges to
the running asyncio loop"): connecting and leaving never block the event loop.

``zlink.connect`` and ``client.close()`` block their caller: a handshake round trip (up to
``timeout`` seconds when no node answers) and the join of the client's threads (up to a
second while frames still go out). Called in asyncio code, the whole event loop stood still
meanwhile. ``zlink.connect_async(...)`` is awaited (or used as ``async with``), and
``await client.aclose()`` (``async with``'s exit) leaves; both do their blocking part on a
thread of their own while the loop runs on. A node listens on 127.0.0.1; every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

import zlink
from tests.conformance.client_process import Echo
from tests.conftest import WAIT, until
from tests.unit.test_client_failover import _failover, _Fake

T = TypeVar("T")


def _app() -> zlink.App:
    app = zlink.App("async-connect")

    @app.user_spot("t.ac.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def echo(self, req: Echo) -> str:
            return req.text

    return app


@pytest.fixture
def endpoint() -> Iterator[str]:
    config = zlink.NodeConfig(node_id="ac-1", listen="tcp://127.0.0.1:0", workers=2)
    with zlink.Node(_app(), config) as node:
        assert node.address is not None
        node.client().spots.get_or_create("room", "t.ac.room").wait(WAIT)
        yield node.address


def _silent_endpoint() -> str:
    """A loopback port where nothing listens (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


async def _with_ticker(work: Awaitable[T]) -> tuple[T | BaseException, float]:
    """``work``'s outcome, and the longest the event loop went without running a 10 ms
    ticker meanwhile (a loop blocked by ``work`` shows as a long gap)."""
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps[0] = max(gaps[0], now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # (the ticker runs before the work begins)
    try:
        outcome: T | BaseException = await work
    except BaseException as exc:  # noqa: BLE001 - the outcome is the test's to judge
        outcome = exc
    done.set()
    await task
    return outcome, gaps[0]


def test_async_with_connects_serves_calls_and_leaves(endpoint: str) -> None:
    async def main() -> tuple[str, zlink.RemoteClient]:
        async with zlink.connect_async(endpoint, timeout=WAIT) as client:
            answer = await client.request_to_spot("room", Echo(text="hi")).timeout(WAIT)
        return answer, client

    answer, client = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert answer == "hi"
    with pytest.raises(zlink.ZLinkError):  # it left: a call after is refused at once
        client.request_to_spot("room", Echo(text="late")).timeout(1).wait(WAIT)


def test_an_awaited_connect_and_aclose_never_block_the_event_loop(endpoint: str) -> None:
    async def main() -> tuple[Any, float, Any, float]:
        client, gap_in = await _with_ticker(zlink.connect_async(endpoint, timeout=WAIT))
        assert isinstance(client, zlink.RemoteClient), client
        assert await client.request_to_spot("room", Echo(text="x")).timeout(WAIT) == "x"
        closed, gap_out = await _with_ticker(client.aclose())
        return client, gap_in, closed, gap_out

    _client, _gap_in, closed, gap_out = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert closed is None
    assert gap_out < 0.5, f"the loop stood still {gap_out:.2f} s while the client left"


def test_a_connect_no_node_answers_fails_without_blocking_the_event_loop() -> None:
    """The sync ``zlink.connect`` held the loop for its whole ``timeout`` (1 s here)."""
    silent = _silent_endpoint()

    async def main() -> tuple[Any, float]:
        return await _with_ticker(zlink.connect_async(silent, timeout=1.0))

    started = time.monotonic()
    outcome, gap = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert isinstance(outcome, zlink.Unavailable), outcome
    assert time.monotonic() - started < WAIT
    assert gap < 0.5, f"the loop stood still {gap:.2f} s while no node answered"


def test_a_connect_whose_task_is_cancelled_leaves_nothing_behind() -> None:
    """Cancelled while no node answers: ``CancelledError`` at once, and the attempt's threads
    end soon after (the client it would have made is closed, not leaked)."""
    silent = _silent_endpoint()
    before = {t.ident for t in threading.enumerate()}

    async def connect() -> zlink.RemoteClient:
        return await zlink.connect_async(silent, timeout=WAIT)

    async def main() -> float:
        task = asyncio.create_task(connect())
        await asyncio.sleep(0.2)  # it is waiting for a handshake answer
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - began

    took = asyncio.run(asyncio.wait_for(main(), 2 * WAIT))
    assert took < 0.5

    def ours() -> list[str]:
        return [
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("zlink")
        ]

    until(lambda: not ours(), f"the attempt's threads end: {ours()}")


def test_bad_arguments_are_refused_where_connect_async_is_called() -> None:
    with pytest.raises(zlink.InvalidArgument):
        zlink.connect_async("not an endpoint")
    with pytest.raises(zlink.InvalidArgument):
        zlink.connect_async("tcp://127.0.0.1:1", timeout=-1)


def test_a_close_while_the_client_connects_closes_what_the_connect_made() -> None:
    """A close from another thread (the cancelled task above) just as a handshake ended:
    ``open`` installed the new connection after ``close`` had looked, and it stayed open for
    good (its threads and sockets). ``open`` now sees the close, closes the connection and
    fails with ``Cancelled``."""
    failover, made, _counts = _failover(["ok"])
    real_open = _Fake.open

    def open_then_closed(self: _Fake, timeout: float, cancel: Any = None) -> None:
        real_open(self, timeout, cancel)
        failover.close()  # (the close lands between the handshake and the install)

    _Fake.open = open_then_closed  # type: ignore[method-assign]
    try:
        with pytest.raises(zlink.Cancelled):
            failover.open()
    finally:
        _Fake.open = real_open  # type: ignore[method-assign]
    assert made[0].state == "closed"
