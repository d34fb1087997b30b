"""Faults a fresh-eyes audit found in the outside client (``zlink.connect``) and the node's
client port (python-api §9, §10, §11; execution-model §16), each reproduced first. Every
wait is bounded.

1. A send that waited for room in the client's window still ends by its limit.
2. A handler error whose text does not encode reaches a remote caller typed, at once.
3. A call the client gave up on keeps its slot until the node answers it.
4. A waiting call is checked at its widest frame, and never breaks another's completion.
5. A remote ``submit()`` waits for no room at the node either.
6. A send behind a waiter that gave up goes once it fits.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

import zlink
from tests.conformance.client_process import Echo, Hold, Note
from tests.conformance.test_client_server import (  # noqa: F401 - fixtures
    HOLD,
    HOLDING,
    _fill_lane,
    _room,
    _seen,
    connect,
    serve,
)
from tests.conftest import WAIT, until
from zlink.mesh import client_wire as cw
from zlink.types import TargetKind

# -- a fake node that lets the test answer as it likes -------------------------------------------


@contextlib.contextmanager
def _scripted_node(
    window_items: int = 8,
    calls_in_flight: int = 8,
    admission_timeout: float = 5.0,
    max_frame_bytes: int = 1 << 20,
) -> Iterator[tuple[Any, zmq.Socket[Any], bytes]]:
    """A client of a fake node (a ROUTER) that welcomes it with the given limits; the test
    then reads and answers frames itself (long heartbeats: the connection is never lost)."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    result: dict[str, Any] = {}
    endpoint = f"tcp://127.0.0.1:{port}"
    opened = threading.Thread(
        target=lambda: result.update(client=zlink.connect(endpoint, heartbeat=60.0))
    )
    opened.start()
    assert router.poll(WAIT * 1000)
    ident, data = router.recv_multipart()
    hello = cw.decode(data)
    assert isinstance(hello, cw.Hello)
    welcome = cw.Welcome(
        hello.correlation, "fake", "main", window_items, 1 << 20, calls_in_flight,
        admission_timeout, 5.0, max_frame_bytes, (), 1.0,
    )  # fmt: skip
    router.send_multipart([ident, cw.encode(welcome)])
    opened.join(WAIT)
    client = result["client"]
    try:
        yield client, router, ident
    finally:
        router.close(0)
        client.close()


def _frames(router: zmq.Socket[Any], n: int) -> list[cw.ClientFrame]:
    """The next ``n`` client frames the fake node reads (packs taken apart)."""
    out: list[cw.ClientFrame] = []
    while len(out) < n:
        assert router.poll(WAIT * 1000), f"only {len(out)} of {n} frames came"
        frame = cw.decode(router.recv_multipart()[1])
        if isinstance(frame, cw.Pack):
            out.extend(cw.decode(inner) for inner in frame.frames)
        else:
            out.append(frame)
    return out


# -- 1. a send that waited for room in the window has no end -------------------------------------


def test_a_send_that_waited_for_window_room_still_ends_by_the_nodes_admission_timeout():
    """python-api §11 (every wait has an end) and the client's own contract: a send that left
    and gets no verdict within its limit ends with ``DeadlineExceeded`` ("may still be
    admitted"). A send that first waited for room in the client's window, and then left, had
    its no-verdict timer cancelled by ``_admit_waiting`` right after ``_put`` armed it: its
    ``future()`` (and ``await``, and ``wait()`` without a timeout) never ended."""
    with _scripted_node(window_items=2, admission_timeout=0.3) as (client, router, ident):
        client.send_to_spot("r", Note(n=1)).submit()
        client.send_to_spot("r", Note(n=2)).submit()  # the window (2) is full
        waiting = client.send_to_spot("r", Note(n=3)).future()  # waits for room
        sent = _frames(router, 2)
        assert [f.seq for f in sent] == [1, 2]  # type: ignore[union-attr]
        router.send_multipart([ident, cw.encode(cw.Acks(((1, 1),), ()))])  # room for one
        assert isinstance(_frames(router, 1)[0], cw.Send)  # the waiter left; no verdict comes
        started = time.monotonic()
        with pytest.raises(zlink.DeadlineExceeded, match="may still be admitted"):
            waiting.result(3.0)  # (on the audited code: concurrent TimeoutError, never ends)
        assert time.monotonic() - started < 2.0


# -- 2. a handler error whose text does not encode: the remote caller never hears it ---------------


class Boom(zlink.Request[str], type_name="t.audit.boom"):
    text: str


def _boom_app() -> zlink.App:
    app = zlink.App("audit-client")

    @app.user_spot("t.audit.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def boom(self, req: Boom) -> str:
            raise ValueError(req.text + "\udc80")  # (a lone surrogate: bytes decoded badly)

        @zlink.handler
        def echo(self, req: Echo) -> str:
            return req.text

    return app


def test_a_handler_error_whose_text_does_not_encode_reaches_the_remote_caller_typed():
    """``node.client()`` gets ``HandlerError`` at once; a ``zlink.connect`` client got no reply
    at all and waited out its deadline (``DeadlineExceeded``): ``ClientServer._reply`` encodes
    an error REPLY outside its try, so ``InvalidArgument`` ("surrogates not allowed") escaped
    into the gate's post-processing, uncounted by the client port, and nothing was sent."""
    node = zlink.Node(
        _boom_app(),
        zlink.NodeConfig(node_id="n1", mesh="main", workers=2, listen="tcp://127.0.0.1:0"),
    ).start()
    try:
        local = node.client()
        local.spots.get_or_create("r", "t.audit.room").wait(WAIT)
        with pytest.raises(zlink.HandlerError):
            local.request_to_spot("r", Boom(text="x")).wait(WAIT)
        assert node.address is not None
        with zlink.connect(node.address) as client:
            started = time.monotonic()
            with pytest.raises(zlink.HandlerError):  # audited code: DeadlineExceeded after 2 s
                client.request_to_spot("r", Boom(text="x")).timeout(2.0).wait(WAIT)
            assert time.monotonic() - started < 1.0
    finally:
        node.shutdown(timeout=WAIT)


# -- 3. calls a client gave up on still count at the node: refused though within the limit -------


def test_a_call_within_the_nodes_limit_is_not_refused_after_earlier_calls_timed_out(
    serve,  # noqa: F811
    connect,  # noqa: F811
):
    """python-api §9: a request's wait for room counts inside its own timeout; the client
    keeps to the node's ``calls_in_flight`` so the node never refuses (the client's contract).
    A call that timed out at the client (or whose ``await`` was cancelled) freed its slot at
    the client at once, while the node still counts it until its own later deadline (plus
    ``reply_grace``) or its reply: the next call went out and was refused with
    ``ResourceExhausted`` ("nothing was queued") at once."""
    node = serve(client_calls_in_flight=2)
    client = connect(node)
    _room(client)
    _room(client, "r2")
    held = [client.request_to_spot("r", Hold()).timeout(0.2).future() for _ in range(2)]
    assert HOLDING.wait(WAIT)
    for call in held:
        with pytest.raises(zlink.DeadlineExceeded):
            call.result(WAIT)
    # two calls the client gave up on are still in flight at the node (its handler holds)
    assert client.request_to_spot("r2", Echo(text="ok")).timeout(WAIT).wait(WAIT) == "ok"
    assert node.counters().get("client_calls_refused", 0) == 0


# -- 4. a waiting call rebuilt larger than its checked frame breaks another call's completion -----


def test_a_call_that_waited_for_a_slot_never_breaks_the_completion_of_the_call_that_freed_it():
    """A call that waits for a slot is checked against the node's frame limit as
    ``build(_MAX_ID, deadline)``, on the assumption that this is its largest form; when a slot
    frees, ``_forget`` builds it again with the time *left*, whose JSON float (``0.98765...``)
    is longer than the deadline's (``1.0``), and ``_frame`` raises ``InvalidArgument`` inside
    ``_forget``, a completion callback of the call that just got its reply: the callbacks
    after it (the caller's future) never run, and the rest of the frames read with that
    reply are dropped. (The correlation is set high to make the sizes deterministic; with
    realistic numbers the same happens whenever a frame is within a few bytes of the limit.)"""
    payload = b'{"text":"x"}'
    probe = cw.Request(2**63 - 1, TargetKind.SPOT, "r", "t.cs.echo", None, False, None,
                       1.111, payload)  # fmt: skip
    limit = len(cw.encode(probe))  # the waiting call's checked frame (at its widest) fits
    with _scripted_node(calls_in_flight=1, max_frame_bytes=limit) as (client, router, ident):
        conn = client._failover.current
        with conn._lock:
            conn._next = 10**18  # (19 digits, as many as the check's _MAX_ID)
        first = client.request_to_spot("r", Echo(text="x")).timeout(WAIT).future()
        second = client.request_to_spot("r", Echo(text="x")).timeout(1.0).future()  # waits
        (asked,) = _frames(router, 1)
        assert isinstance(asked, cw.Request)
        router.send_multipart([ident, cw.encode(cw.Reply(asked.correlation, None, b'"ok"'))])
        assert first.result(WAIT) == "ok"  # audited code: never completes (TimeoutError)
        (then,) = _frames(router, 1)  # the waiting call goes, its time left to the ms
        assert isinstance(then, cw.Request) and then.deadline == round(then.deadline, 3)
        router.send_multipart([ident, cw.encode(cw.Reply(then.correlation, None, b'"ok"'))])
        assert second.result(WAIT) == "ok"
        assert "client_task_errors" not in client.counters()


def test_a_call_whose_frame_could_outgrow_the_limit_while_it_waits_is_refused_at_once():
    """The other side of the check: a call that must wait for a slot and whose frame, built
    with the time it will have left, could be larger than the node takes is refused where it
    is made (``InvalidArgument``), nothing sent, instead of failing later on another call's
    thread."""
    payload = b'{"text":"x"}'
    probe = cw.Request(2**63 - 1, TargetKind.SPOT, "r", "t.cs.echo", None, False, None,
                       1.0, payload)  # fmt: skip
    with _scripted_node(calls_in_flight=1, max_frame_bytes=len(cw.encode(probe))) as (
        client, router, ident,
    ):  # fmt: skip
        conn = client._failover.current
        with conn._lock:
            conn._next = 10**18
        first = client.request_to_spot("r", Echo(text="x")).timeout(WAIT).future()
        with pytest.raises(zlink.InvalidArgument):
            client.request_to_spot("r", Echo(text="x")).timeout(1.0).future()
        (asked,) = _frames(router, 1)
        router.send_multipart([ident, cw.encode(cw.Reply(asked.correlation, None, b'"ok"'))])
        assert first.result(WAIT) == "ok"


# -- 5. a remote submit() into a full lane is queued at the node, not refused ---------------------


def test_a_remote_submit_into_a_full_lane_is_refused_not_queued_at_the_node(
    serve,  # noqa: F811
    connect,  # noqa: F811
):
    """python-api §9: ``send.submit()`` into a full lane raises ``ResourceExhausted`` at once,
    nothing queued (``node.client()`` does). A remote ``submit()`` travels with ``wait=None``,
    which the node reads as "wait ``admission_timeout`` for room": it becomes one of the
    target's bounded admission waiters (here the only one allowed), so another caller's
    ``wait()`` is refused while it sits there, and the message is admitted whenever room
    comes, up to 30 s later, instead of being dropped (``lane_full``) at once."""
    node = serve(app_lane_items=2, admission_waiters=1)
    client = connect(node)
    _room(client)
    _fill_lane(client)
    with pytest.raises(zlink.ResourceExhausted):  # node.client(): refused at once
        node.client().send_to_spot("r", Note(n=98)).submit()
    client.send_to_spot("r", Note(n=99)).submit()  # the same call, remote
    until(lambda: client.counters().get("sends_dropped_lane_full") == 1,
          "the node's lane_full verdict on the remote submit()", timeout=2.0)  # fmt: skip
    HOLD.set()
    assert _seen(client) == ["block:0", "1"]  # 99 was never queued


# -- 6. a withdrawn waiter at the head of the window leaves the room it freed unused --------------


def test_a_send_behind_a_withdrawn_waiter_goes_once_it_fits():
    """python-api §9: waiters are served first come first served; one that gives up is
    withdrawn (``_withdraw`` removes it). Nothing then serves the waiters behind it: a small
    send that fits the window at once stays queued until the next ``ACKS`` (for sends waiting
    at the node, up to its admission timeout), fails with "no room in the client's window"
    though there was room, and every ``submit()`` meanwhile is refused (``ResourceExhausted``:
    a submit never overtakes a waiter)."""
    with _scripted_node(window_items=4) as (client, router, _ident):
        client.send_to_spot("r", Note(n=1)).submit()
        client.send_to_spot("r", Note(n=2)).submit()  # 2 of 4 in the window, no verdict
        assert len(_frames(router, 2)) == 2
        conn = client._failover.current
        big_failed = threading.Event()

        def big() -> None:  # 3 more do not fit: it waits, then gives up (withdrawn)
            with contextlib.suppress(zlink.DeadlineExceeded):
                client.send_many_to_spot("r", [Note(n=3), Note(n=4), Note(n=5)]).wait(0.3)
            big_failed.set()

        waiter = threading.Thread(target=big)
        waiter.start()
        until(lambda: len(conn._waiting) == 1, "the batch waits for room")
        small = client.send_to_spot("r", Note(n=6)).future()  # fits, but queues behind it
        assert big_failed.wait(WAIT)
        waiter.join(WAIT)
        (sent,) = _frames(router, 1)  # audited code: nothing comes (it waits for an ACKS)
        assert isinstance(sent, cw.Send) and not small.done()
        client.send_to_spot("r", Note(n=7)).submit()  # 4 of 4: fits, not refused


def test_a_handler_error_whose_text_does_not_encode_reaches_a_caller_on_another_node_typed():
    """The same error across two nodes of a mesh: the reply's error crosses as text made
    safe to encode (python-api §5: a handler's failure reaches its caller as ``HandlerError``
    at once, never as a deadline)."""
    from zlink.testing import LocalCluster

    with LocalCluster(_boom_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        n2.client().spots.get_or_create("r", "t.audit.room").wait(WAIT)
        assert "r" in n2._runtime.spots
        started = time.monotonic()
        with pytest.raises(zlink.HandlerError, match=r"x\\udc80"):
            n1.client().request_to_spot("r", Boom(text="x")).timeout(2.0).wait(WAIT)
        assert time.monotonic() - started < 1.0


# -- found by a review of the fixes -----------------------------------------------------------


def test_a_call_whose_await_was_cancelled_keeps_its_slot_while_the_node_still_counts_it():
    """python-api §9/§10, ``_forget``'s own contract: a call that ended at the client
    without its reply "still counts at the node until it answers, its own deadline
    ``reply_grace`` later at the latest", so its slot stays taken until then. A call whose
    ``await`` is cancelled ends long before its deadline; ``_forget`` frees its slot
    ``reply_grace + 1`` s after the *cancel*, not after its deadline: with a 30 s call the
    next call goes out ~1 s later while the node still counts the first (it answers
    ``ResourceExhausted``: a refusal the client's limit exists to prevent)."""
    import asyncio
    import contextlib

    import zmq

    from zlink.mesh import client_wire as cw

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = None
    try:
        import threading

        result: dict = {}
        opened = threading.Thread(
            target=lambda: result.update(
                client=zlink.connect(f"tcp://127.0.0.1:{port}", heartbeat=60.0)
            )
        )
        opened.start()
        assert router.poll(WAIT * 1000)
        ident, data = router.recv_multipart()
        hello = cw.decode(data)
        welcome = cw.Welcome(
            hello.correlation, "fake", "main", 8, 1 << 20, 1, 5.0, 5.0, 1 << 20, (), 0.0
        )  # calls_in_flight 1, reply_grace 0
        router.send_multipart([ident, cw.encode(welcome)])
        opened.join(WAIT)
        client = result["client"]

        async def cancel_one() -> None:
            task = asyncio.ensure_future(
                _awaited(client.request_to_spot("r", Echo(text="a")).timeout(30.0))
            )
            loop = asyncio.get_running_loop()
            (asked,) = await loop.run_in_executor(None, _frames, router, 1)
            assert isinstance(asked, cw.Request) and asked.deadline > 29
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, zlink.Cancelled):
                await task

        asyncio.run(cancel_one())
        # the node counts the first call for ~30 s more: the second must wait for its slot
        second = client.request_to_spot("r", Echo(text="b")).timeout(30.0).future()
        went_early = router.poll(2500)
        if went_early:
            (early,) = _frames(router, 1)
            assert not isinstance(early, cw.Request), f"went while the first counts: {early}"
        second.cancel()
    finally:
        router.close(0)
        if client is not None:
            client.close()


async def _awaited(call):
    return await call


def test_a_call_that_timed_out_is_not_counted_again_as_failed_by_the_close():
    """A call that ended by its deadline stays in ``_calls`` (an orphan, its slot kept for
    the node's late answer). ``close()`` (and a lost connection) then fails "every call
    still pending" and counts ``calls_failed_client_closed`` (``calls_failed_connection_lost``)
    with ``len(_calls)``: the orphan, which its caller already heard fail with
    ``DeadlineExceeded``, is counted a second time, as a failure it never had."""

    with _scripted_node() as (client, router, _ident):
        call = client.request_to_spot("r", Echo(text="a")).timeout(0.1).future()
        _frames(router, 1)  # sent; the fake node never answers
        import pytest

        with pytest.raises(zlink.DeadlineExceeded):
            call.result(WAIT)
        client.close()
        counters = client.counters()
        assert counters.get("calls_failed_client_closed", 0) == 0, counters
