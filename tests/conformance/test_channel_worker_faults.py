"""Faults a fresh-eyes audit found in Channels, worker calls and the admin endpoint, each
reproduced first: a Channel's records pass its own gate in order (execution-model §2); an
``await`` in a cancelled turn submits nothing (python-api §11, §16); a worker call that no
thread can start is refused typed and leaves nothing behind; worker calls at a stop and late
worker outcomes are counted with their reason; a Channel's timers are refused typed; a bad
admin request target is answered 400."""

from __future__ import annotations

import socket
import threading

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.admin import AdminServer


class Block(zlink.Request[str], type_name="t.acw.block"):
    timed: bool = False


class Ping(zlink.Request[str], type_name="t.acw.ping"):
    pass


def _worker_app(release: threading.Event, started: list[str], ran: list[str]) -> zlink.App:
    app = zlink.App("audit-cw")

    def blocking(tag: str) -> str:
        ran.append(tag)
        release.wait(30)
        return tag

    @app.user_spot("t.acw.room", mode=zlink.ExecutionMode.PER_ACTOR)
    class Room(zlink.UserSpot):
        @zlink.handler
        async def block(self, req: Block) -> str:
            call = self.context.workers.io(blocking, self.context.spot_id)
            if req.timed:
                call = call.timeout(1000)
            started.append(self.context.spot_id)
            return await call

    return app


def test_a_timed_worker_call_at_shutdown_is_counted_as_a_worker_call_abandoned_or_discarded(
    make_node,
):
    """Node.shutdown's docstring and zlink.runtime.metrics: a worker call still running when
    the shutdown's time runs out is ``worker_calls_abandoned_at_shutdown``; one never started
    is ``worker_calls_discarded_at_shutdown``. A worker call given ``.timeout()`` is instead
    failed by its deadline entry and counted as ``calls_failed_at_shutdown``: the operator
    cannot tell that its work ran (abandoned) or never did (discarded)."""
    release, started, ran = threading.Event(), [], []
    node = make_node(_worker_app(release, started, ran), io_workers=1)
    client = node.client()
    try:
        for spot in ("a", "b"):
            client.spots.get_or_create(spot, "t.acw.room").wait(WAIT)
        first = client.request_to_spot("a", Block(timed=True)).timeout(1000).future()
        until(lambda: ran == ["a"], "the first worker call runs")
        second = client.request_to_spot("b", Block(timed=True)).timeout(1000).future()
        until(lambda: started == ["a", "b"], "the second worker call is queued")
        node.shutdown(timeout=0.5)
        for fut in (first, second):
            with pytest.raises(zlink.Unavailable):
                fut.result(WAIT)
        counters = node.counters()
        assert counters.get("worker_calls_abandoned_at_shutdown") == 1, counters
        assert counters.get("worker_calls_discarded_at_shutdown") == 1, counters
    finally:
        release.set()


class Fetch(zlink.Request[str], type_name="t.acw.fetch"):
    pass


def test_a_worker_outcome_that_comes_after_its_timeout_is_dropped_and_counted(make_node, clock):
    """python-api §5: "A call completes exactly once: a reply that arrives after its timeout
    is dropped and counted" (``late_replies`` for requests). A ``context.workers`` call past
    its ``.timeout()`` is counted once (``worker_calls_timed_out``), but what the function
    returns or raises after that is dropped without a trace: no counter, no log (here an
    exception from the worker vanishes)."""
    release, entered = threading.Event(), threading.Event()
    app = zlink.App("audit-cw-late")

    def slow() -> str:
        entered.set()
        release.wait(30)
        raise RuntimeError("the worker failed after its caller gave up")

    @app.user_spot("t.acw.late")
    class Late(zlink.UserSpot):
        @zlink.handler
        async def fetch(self, req: Fetch) -> str:
            try:
                return await self.context.workers.io(slow).timeout(1)
            except zlink.DeadlineExceeded:
                return "timed out"

    node = make_node(app)
    client = node.client()
    client.spots.get_or_create("l", "t.acw.late").wait(WAIT)
    answer = client.request_to_spot("l", Fetch()).timeout(100).future()
    assert entered.wait(WAIT)
    clock.advance(2)
    assert answer.result(WAIT) == "timed out"
    assert node.counters().get("worker_calls_timed_out") == 1
    before = node.counters()
    release.set()
    until(lambda: node.status().worker_calls_in_flight == 0, "the worker call ends")
    assert node.counters() != before, "the late worker outcome was dropped without a count"


def _raw(address: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(address, timeout=WAIT) as conn:
        conn.sendall(request)
        out = b""
        while True:
            data = conn.recv(65536)
            if not data:
                return out
            out += data


def test_a_malformed_request_target_is_answered_400_not_dropped(make_node):
    """A request line whose target ``urlsplit`` refuses (``ValueError: Invalid IPv6 URL``)
    escapes ``_answer``: the connection is closed with no answer at all (logged at DEBUG
    only), where every other bad request gets its HTTP status (404, 414, 501)."""
    node = make_node(zlink.App("audit-cw-admin"))
    server = AdminServer(node, "127.0.0.1", 0).start()
    try:
        assert _raw(server.address, b"GET /nope HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 404")
        reply = _raw(server.address, b"GET http://[::1 HTTP/1.0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.0 400"), reply
    finally:
        server.stop()


class Hold(zlink.Message, type_name="t.acw.hold"):
    pass


def test_a_worker_call_awaited_by_a_turn_its_close_cancelled_is_refused_not_run(make_node, clock):
    """python-api §11: a close whose deadline passes cancels what is still suspended
    (``Cancelled`` at its ``await``; its ``finally`` runs on the gate), then ``on_closing``
    runs. The cancelled turn's next ``await workers.io(fn)`` is told ``Cancelled`` at once,
    yet ``fn`` was submitted and runs anyway, off the gate, after ``on_closing`` (the work of
    a closed Spot); the waiter was told it did not happen. A call awaited by a cancelled turn
    must be refused before anything is submitted (as every refusal is, §16)."""
    release, held = threading.Event(), threading.Event()
    ran: list[str] = []
    closed = threading.Event()
    app = zlink.App("audit-cw-cancel")

    later = threading.Event()

    def side_effect() -> None:
        later.wait(30)  # still running when the cancelled turn is told Cancelled
        ran.append("side effect")

    @app.user_spot("t.acw.closing")
    class Room(zlink.UserSpot):
        @zlink.handler
        async def hold(self, msg: Hold) -> None:
            try:
                held.set()
                await self.context.workers.io(release.wait, 30)
            except zlink.Cancelled:
                try:
                    await self.context.workers.io(side_effect)
                except zlink.Cancelled:
                    ran.append("told Cancelled")
                raise

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            closed.set()

    node = make_node(app, closing_timeout=1.0)
    client = node.client()
    made = client.spots.get_or_create("c", "t.acw.closing").wait(WAIT)
    client.send_to_spot("c", Hold()).submit()
    assert held.wait(WAIT)
    assert client.spots.close(made.spot_ref) is True
    try:
        clock.advance(2)  # past the close's deadline: the suspended turn is cancelled
        assert closed.wait(WAIT)
        assert ran == ["told Cancelled"]
    finally:
        release.set()
        later.set()
    until(lambda: node.status().worker_calls_in_flight == 0, "no worker call in flight")
    assert ran == ["told Cancelled"], ran


class Note(zlink.Message, type_name="t.acw.note"):
    text: str


def test_a_channel_takes_one_senders_messages_in_order_without_overlap(make_node):
    """execution-model §2 (seed: "Node handler, ChannelName handler, 각 Spot과 각 Actor는
    자신에게 적용되는 gate의 순서로 record를 처리한다"): a ChannelName handler processes its
    records in the order of its gate, and the regular await keeps that right, so the next
    record does not overlap the current one. Every Channel message ran as a
    turn of its own with no gate: one sender's second one-way message runs while its first
    is still in its handler (and may finish first)."""
    release, entered = threading.Event(), threading.Event()
    log: list[str] = []
    app = zlink.App("audit-cw-channel")

    @app.channel("t.acw.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def note(self, msg: Note) -> None:
            log.append(f"{msg.text}:start")
            if msg.text == "first":
                entered.set()
                release.wait(WAIT)
            log.append(f"{msg.text}:end")

    node = make_node(app, workers=2)
    client = node.client()
    try:
        client.send("t.acw.api", Note(text="first")).submit()
        assert entered.wait(WAIT)
        client.send("t.acw.api", Note(text="second")).submit()
        assert node.wait_idle(WAIT, busy=1)  # all but the blocked first one has settled
        assert log == ["first:start"], log
    finally:
        release.set()
    assert node.wait_idle(WAIT)
    assert log == ["first:start", "first:end", "second:start", "second:end"], log


def test_a_worker_thread_that_cannot_start_fails_the_call_typed_and_leaves_nothing_behind(
    make_node, monkeypatch
):
    """``submit_worker`` counts the call in flight and takes its slot, then ``DaemonPool.submit``
    raises when its new thread cannot start (``RuntimeError: can't start new thread``, a
    process at its thread limit). The untyped ``RuntimeError`` reaches the caller, but the call
    stays queued in the pool, its slot taken and ``workers_in_flight`` counted for good; the
    next thread that does start runs it: the caller was told it failed, and it ran."""
    app = zlink.App("audit-cw-thread")

    @app.user_spot("t.acw.thr")
    class Room(zlink.UserSpot):
        pass

    node = make_node(app, io_workers=2)
    client = node.client()
    client.spots.get_or_create("t", "t.acw.thr").wait(WAIT)
    workers = node._runtime.spots["t"].context.workers
    ran: list[str] = []
    real_start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        if self.name.startswith("zlink-io"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(zlink.ZLinkError):
        workers.io(ran.append, "refused").wait(WAIT)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert workers.io(ran.append, "next").wait(WAIT) is None
    until(lambda: node.status().worker_calls_in_flight == 0, "no worker call in flight")
    assert ran == ["next"], ran


class Tick(zlink.Request[str], type_name="t.acw.tick"):
    pass


def test_timers_on_a_channel_context_are_refused_with_a_zlink_error(make_node):
    """python-api §4 lists ``timers`` on every context, ChannelContext included; a Channel
    is stateless and has no timers (registration refuses a Channel's timer handlers with
    ``InvalidOperation``). At run time ``ChannelContext.timers`` is ``None``: a Channel
    handler's ``context.timers.register(...)`` fails with ``AttributeError``, an untyped
    error, instead of ``InvalidOperation``."""
    app = zlink.App("audit-cw-chtimers")

    @app.channel("t.acw.timers")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def tick(self, req: Tick) -> str:
            try:
                self.context.timers.register("t", 1.0)
            except Exception as exc:  # noqa: BLE001 - what kind of error is the point
                return type(exc).__name__
            return "registered"

    node = make_node(app)
    assert node.client().request("t.acw.timers", Tick()).wait(WAIT) == "InvalidOperation"
