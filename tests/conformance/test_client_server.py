"""ClientServer: ``zlink.connect`` clients of a node (python-api §9, §10; execution-model §16
"ClientServer", "late reply"). A node listens on 127.0.0.1; clients connect from this process
(and, once, from a process of their own). Every wait is bounded; nothing sleeps to wait for
the runtime: order on the one connection (a later reply comes after an earlier frame) and
events set by handlers say when something happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import zlink
from tests.conformance.client_process import Echo, Fail, Hold, News, Note, Seen
from tests.conftest import WAIT, until
from zlink.errors import ErrorCode
from zlink.mesh import client as client_module
from zlink.mesh import client_wire as cw
from zlink.mesh.client import _Connection
from zlink.types import TargetKind

ROOT = Path(__file__).resolve().parents[2]


def _label(msg: Note) -> str:
    return f"{msg.who}:{msg.n}" if msg.who else str(msg.n)


HOLD = threading.Event()  # released: blocked handlers go on
HOLDING = threading.Event()  # a handler is blocked on HOLD
CHANNEL_NOTES: list[str] = []
CHANNEL_HEARD = threading.Event()  # the Channel handled a note (admitted is not handled)


def build_app() -> zlink.App:
    app = zlink.App("client-server")

    @app.user_spot("t.cs.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[str] = []

        def on_initialize(self) -> None:
            self.context.subscribe("news")

        @zlink.handler
        def note(self, msg: Note) -> None:
            if msg.who == "block":
                HOLDING.set()
                HOLD.wait(WAIT)
            self.seen.append(_label(msg))

        @zlink.handler
        def seen_(self, req: Seen) -> list[str]:
            return self.seen

        @zlink.handler
        def echo(self, req: Echo, context: zlink.MessageContext) -> str:
            return req.text + "".join(f" {k}={v}" for k, v in sorted(context.metadata.items()))

        @zlink.handler
        def fail(self, req: Fail) -> int:
            raise ValueError("no luck")

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            HOLD.wait(WAIT)
            return "held"

        @zlink.subscription
        def news(self, event: News) -> None:
            self.seen.append(f"news:{event.text}")

    @app.entry_spot("t.cs.lobby", actor="t.cs.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.cs.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.seen: list[str] = []

        @zlink.handler
        def note(self, msg: Note) -> None:
            self.seen.append(_label(msg))

        @zlink.handler
        def seen_(self, req: Seen) -> list[str]:
            return self.seen

    @app.instance_spot("t.cs.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        def echo(self, req: Echo) -> str:
            return f"instance {self.context.spot_id}: {req.text}"

    @app.channel("t.cs.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def echo(self, req: Echo) -> str:
            return f"channel: {req.text}"

        @zlink.handler
        def note(self, msg: Note) -> None:
            CHANNEL_NOTES.append(_label(msg))
            CHANNEL_HEARD.set()

    return app


@pytest.fixture
def serve() -> Iterator[Callable[..., zlink.Node]]:
    """``serve(**config)`` starts a node of ``build_app()`` listening on 127.0.0.1 (real
    clock); every node is shut down at the end, after blocked handlers are let go."""
    HOLD.clear()
    HOLDING.clear()
    CHANNEL_NOTES.clear()
    CHANNEL_HEARD.clear()
    nodes: list[zlink.Node] = []

    def make(**config: Any) -> zlink.Node:
        config.setdefault("workers", 2)
        config.setdefault("listen", "tcp://127.0.0.1:0")
        node = zlink.Node(build_app(), zlink.NodeConfig(**config))
        nodes.append(node)
        return node.start()

    yield make
    HOLD.set()
    for node in nodes:
        node.shutdown(timeout=WAIT)


@pytest.fixture
def connect() -> Iterator[Callable[..., Any]]:
    """``connect(node, **options)``: a client of ``node``; all are closed at the end."""
    clients: list[Any] = []

    def make(node: zlink.Node, **options: Any) -> Any:
        assert node.address is not None
        client = zlink.connect(node.address, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _room(client: zlink.Client, spot_id: str = "r") -> zlink.SpotCreateResult:
    result: zlink.SpotCreateResult = client.spots.get_or_create(spot_id, "t.cs.room").wait(WAIT)
    return result


def _seen(client: zlink.Client, spot_id: str = "r") -> list[str]:
    out: list[str] = client.request_to_spot(spot_id, Seen()).wait(WAIT)
    return out


# -- every method --------------------------------------------------------------------------------


def test_a_remote_client_has_every_method_of_node_client(serve, connect):
    node = serve()
    client = connect(node)
    assert isinstance(client, zlink.Client) and client.node_id == node.node_id

    created = _room(client)
    assert created.created and created.spot_id == "r" and created.spot_ref.spot_id == "r"
    again = client.spots.get_or_create("r", "t.cs.room").wait(WAIT)
    assert not again.created and again.spot_ref == created.spot_ref
    fresh = client.spots.create("t.cs.room").timeout(WAIT).future().result(WAIT)
    assert fresh.created and fresh.spot_id != "r"

    client.send_to_spot("r", Note(n=1)).submit()
    client.send_to_spot("r", Note(n=2)).wait(WAIT)
    assert client.send_to_spot("r", Note(n=3)).future().result(WAIT) is None
    client.send_many_to_spot("r", [Note(n=4), Note(n=5)]).submit()
    client.send_many_to_spot("r", [Note(n=6)]).wait(WAIT)
    client.publish("news", News(text="hi")).wait(WAIT)
    assert client.request_to_spot("r", Echo(text="x")).metadata("k", "v").wait(WAIT) == "x k=v"
    assert _seen(client) == ["1", "2", "3", "4", "5", "6", "news:hi"]
    assert _seen(client, fresh.spot_id) == ["news:hi"]  # every subscriber hears it

    actor = client.actors.create("t.cs.player").wait(WAIT)
    assert actor.created and actor.actor_id
    named = client.actors.get_or_create("pl-1", "t.cs.player").timeout(WAIT).wait()
    assert named.actor_id == "pl-1" and named.created
    assert not client.actors.get_or_create("pl-1", "t.cs.player").wait(WAIT).created
    client.send_to_actor("pl-1", Note(n=1)).submit()
    client.send_many_to_actor("pl-1", [Note(n=2), Note(n=3)]).wait(WAIT)
    client.send_to_actor("pl-1", Note(n=4)).wait(WAIT)
    assert client.request_to_actor("pl-1", Seen()).timeout(WAIT).wait() == ["1", "2", "3", "4"]

    assert client.request("t.cs.api", Echo(text="c")).wait(WAIT) == "channel: c"
    client.send("t.cs.api", Note(n=9, who="ch")).wait(WAIT)
    assert CHANNEL_HEARD.wait(WAIT) and CHANNEL_NOTES == ["ch:9"]
    assert (
        client.request_to_spot("i-1", Echo(text="i")).instance_spot("t.cs.inst").wait(WAIT)
        == "instance i-1: i"
    )
    assert client.request_to_spot("r", Echo(text="m")).in_mesh(node.config.mesh).wait(WAIT) == "m"
    for call in (  # another mesh: refused as node.client() refuses it, nothing sent
        client.request_to_spot("r", Echo(text="x")).in_mesh("elsewhere"),
        client.send_to_spot("r", Note(n=0)).in_mesh("elsewhere"),
        client.spots.get_or_create("r", "t.cs.room").in_mesh("elsewhere"),
    ):
        with pytest.raises(zlink.NotFound, match="mesh 'elsewhere' is not reachable"):
            call.wait(WAIT)

    assert client.spots.close(fresh.spot_ref) is True
    missing = zlink.SpotRef("nowhere", 1, fresh.spot_ref.mesh_name, fresh.spot_ref.node_rid)
    assert client.spots.close(missing) is False
    counters = client.counters()
    assert counters.get("late_replies", 0) == 0 and not any(
        name.startswith("sends_dropped") for name in counters
    )


def test_connect_refuses_bad_endpoints_and_times_out_where_nobody_answers():
    for bad in ("127.0.0.1:7101", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://:7101", 7101):
        with pytest.raises(zlink.InvalidArgument):
            zlink.connect(bad)  # type: ignore[arg-type]
    with socket.socket() as probe:  # a port nobody listens on (bound, never accepting)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(zlink.Unavailable) as refused:
            zlink.connect(f"tcp://127.0.0.1:{port}", timeout=0.3)
        assert time.monotonic() - started < WAIT
        assert "within 0.3 s" in str(refused.value)  # (a probe read "within 0.299999 s")
    with pytest.raises(zlink.InvalidArgument, match="zlink keys generate"):
        zlink.connect("tcp://127.0.0.1:7101", keys="somewhere")  # not a keys folder
    # a client probe: heartbeats of 2,200 s and 1e5 s raised ZMQError, 1e7 s OverflowError
    # (ZeroMQ carries a heartbeat's time-to-live, three of them, in 16 bits of deciseconds)
    for heartbeat in (2200, 1e5, 1e7):
        with pytest.raises(zlink.InvalidArgument, match="heartbeat"):
            zlink.connect("tcp://127.0.0.1:7101", heartbeat=heartbeat)
    # an IPv6 address waited out the whole timeout (the mesh speaks IPv4 only): said at once
    for ipv6 in ("tcp://[::1]:7101", "tcp://::1:7101"):
        started = time.monotonic()
        with pytest.raises(zlink.InvalidArgument, match="IPv6"):
            zlink.connect(ipv6, timeout=5)
        assert time.monotonic() - started < 1


def test_a_client_closed_with_frames_zeromq_refused_closes_at_once_and_counts_them():
    """A frame ZeroMQ refuses as the connection ends (it has no pipe to the node: a handshake
    that failed, say) never goes: close() counts it and closes the sockets at once, instead of
    waiting for room that never comes (its thread then stopped with the sockets open)."""
    with socket.socket() as probe:  # a port nobody listens on (bound, never accepting)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        conn = _Connection(f"tcp://127.0.0.1:{port}", 8, 1 << 20, 1.0, None)

        def refuse(data: Any, flags: int = 0, **_: Any) -> None:
            raise zmq.Again()

        conn._dealer.send = refuse  # type: ignore[method-assign]
        with pytest.raises(zlink.Unavailable):
            conn.open(0.2)  # its hello is refused, and nobody answers
        started = time.monotonic()
        conn.close()
    assert time.monotonic() - started < 3.0
    assert conn._dealer.closed
    assert conn.counters.snapshot().get("frames_unsent_at_close") == 1
    assert not conn._infra.alive


def test_a_closed_client_refuses_calls_and_closes_twice(serve):
    node = serve()
    assert node.address is not None
    with zlink.connect(node.address) as client:
        _room(client)
    with pytest.raises(zlink.InvalidOperation):
        client.send_to_spot("r", Note(n=1)).submit()
    client.close()
    with zlink.connect(node.address) as other:  # the node serves the next client as before
        assert _seen(other) == []


def test_one_client_thread_reads_and_completes_and_a_close_from_a_callback_ends_it(serve):
    """The client's own thread polls its socket and completes what it reads (no I/O thread
    beside it); a client closed from a completion callback, on that very thread, closes."""
    node = serve()
    assert node.address is not None
    before = set(threading.enumerate())
    client = zlink.connect(node.address)
    mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("zlink-c")]
    assert [t.name for t in mine] == ["zlink-client"]
    _room(client)
    on: list[threading.Thread] = []
    closed = threading.Event()

    def done(_: Any) -> None:
        on.append(threading.current_thread())
        client.close()  # its last turns run here, on the thread being closed
        closed.set()

    asked = client.request_to_spot("r", Hold()).future()  # its handler waits for HOLD
    asked.add_done_callback(done)  # (before the reply can come: it completes on that thread)
    assert HOLDING.wait(WAIT)
    HOLD.set()
    assert closed.wait(WAIT)
    assert on == mine
    mine[0].join(WAIT)
    assert not mine[0].is_alive()
    with pytest.raises(zlink.InvalidOperation):
        client.send_to_spot("r", Note(n=1)).submit()


def test_callers_failed_together_each_raise_an_error_of_their_own(serve):
    """A client probe: 300 threads blocked in ``wait()`` as the client closed all raised one
    exception object, whose traceback then grew with every raise (900 frames of other
    threads' stacks in one caller's, kept alive with them). Each waiter raises its own copy,
    of the same type and text, with its own stack."""
    node = serve()
    assert node.address is not None
    client = zlink.connect(node.address)
    _room(client)
    asked = client.request_to_spot("r", Hold()).future()  # the room's gate: taken
    assert HOLDING.wait(WAIT)
    caught: list[BaseException] = []
    started = threading.Barrier(9)

    def wait_one() -> None:
        call = client.request_to_spot("r", Echo(text="x"))
        started.wait(WAIT)
        try:
            call.wait(WAIT)
        except zlink.ZLinkError as exc:
            caught.append(exc)

    threads = [threading.Thread(target=wait_one) for _ in range(8)]
    for t in threads:
        t.start()
    started.wait(WAIT)
    _until_waiting = time.monotonic() + WAIT
    while time.monotonic() < _until_waiting and len(client._failover.current._calls) < 9:
        time.sleep(0.005)  # (the eight calls are on their way: nothing to wait on)
    client.close()
    for t in threads:
        t.join(WAIT)
    HOLD.set()
    assert len(caught) == 8 and {type(e) for e in caught} == {zlink.Cancelled}
    assert len({id(e) for e in caught}) == 8  # one each
    assert len({str(e) for e in caught}) == 1
    for exc in caught:
        depth = len(traceback.extract_tb(exc.__traceback__))
        assert depth < 25, depth  # its own stack, not everyone's
    with pytest.raises(zlink.Cancelled):
        asked.result(WAIT)


# -- typed errors --------------------------------------------------------------------------------


def test_errors_cross_typed(serve, connect):
    node = serve()
    client = connect(node)
    _room(client)
    with pytest.raises(zlink.NotFound):
        client.request_to_spot("nowhere", Echo(text="x")).wait(WAIT)
    with pytest.raises(zlink.NotFound):
        client.send_to_spot("nowhere", Note(n=1)).wait(WAIT)
    with pytest.raises(zlink.HandlerError) as info:
        client.request_to_spot("r", Fail()).wait(WAIT)
    assert info.value.remote_type == "ValueError" and info.value.remote_message == "no luck"
    with pytest.raises(zlink.InvalidArgument):
        client.spots.create("t.cs.no-such-type").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument):  # a Spot with no handler for the message
        client.request_to_spot("r", Hold()).instance_spot("t.cs.inst").wait(WAIT)
    ref = _room(client).spot_ref
    stale = zlink.SpotRef("r", ref.object_generation + 1, ref.mesh_name, ref.node_rid)
    with pytest.raises(zlink.InvalidOperation):
        client.spots.close(stale)
    with pytest.raises(zlink.InvalidOperation):  # no turn to yield on a remote client
        client.request_to_spot("r", Echo(text="x")).yield_()
    with pytest.raises(zlink.DeadlineExceeded):
        client.request_to_spot("r", Hold()).timeout(0.05).wait(WAIT)
    HOLD.set()
    assert _seen(client) == []  # the connection serves on after every error
    assert client.counters().get("sends_dropped_not_found") == 1
    assert node.counters().get("client_sends_dropped_not_found") == 1


# -- backpressure (python-api §9) ----------------------------------------------------------------


def _fill_lane(client: zlink.Client) -> None:
    """Block the room's handler on HOLD and fill its two-item lane (a reservation is held
    until its handler ends: both sends admitted)."""
    client.send_to_spot("r", Note(n=0, who="block")).wait(WAIT)
    assert HOLDING.wait(WAIT)
    client.send_to_spot("r", Note(n=1)).wait(WAIT)


def test_submit_is_refused_at_once_when_the_window_is_full(serve, connect):
    node = serve(app_lane_items=2)
    client = connect(node, window=4)
    _room(client)
    _fill_lane(client)
    for n in range(2, 6):  # they wait for room at the node: no verdict, the window fills
        client.send_to_spot("r", Note(n=n)).future()  # (a submit() would be refused there)
    started = time.monotonic()
    with pytest.raises(zlink.ResourceExhausted):
        client.send_to_spot("r", Note(n=99)).submit()
    assert time.monotonic() - started < 1.0  # at once, not after a wait
    HOLD.set()
    assert _seen(client) == ["block:0", *(str(n) for n in range(1, 6))]  # 99 never went
    assert client.counters()["sends_refused_window_full"] == 1


def test_wait_and_future_wait_for_room_in_the_window_in_order(serve, connect):
    node = serve(app_lane_items=2)
    client = connect(node, window=2)
    _room(client)
    _fill_lane(client)
    client.send_to_spot("r", Note(n=2)).future()  # they wait for room at the node
    client.send_to_spot("r", Note(n=3)).future()  # the window is full now
    waiting = client.send_to_spot("r", Note(n=4)).future()
    with pytest.raises(zlink.ResourceExhausted):  # submit() never overtakes a waiter
        client.send_to_spot("r", Note(n=98)).submit()
    with pytest.raises(zlink.DeadlineExceeded):  # no room in time: withdrawn, never sent
        client.send_to_spot("r", Note(n=99)).wait(0.1)
    assert not waiting.done()
    HOLD.set()
    assert waiting.result(WAIT) is None  # admitted at the node
    assert _seen(client) == ["block:0", "1", "2", "3", "4"]
    assert client.counters()["window_waits"] == 2


def test_a_send_with_no_room_at_the_node_in_time_fails_and_is_counted_at_both_ends(serve, connect):
    node = serve(app_lane_items=2)
    client = connect(node)
    _room(client)
    _fill_lane(client)
    with pytest.raises(zlink.DeadlineExceeded):  # its wait travelled: the node gave up
        client.send_to_spot("r", Note(n=99)).wait(0.2)
    # (the node's verdict may come a moment after the caller's own wait ran out: .ci/run on
    # 3.13t under load found the client's count not there yet)
    until(lambda: client.counters().get("sends_dropped_no_room_in_time") == 1,
          "the node's verdict counted at the client")  # fmt: skip
    assert node.counters()["client_sends_dropped_no_room_in_time"] == 1
    HOLD.set()
    assert _seen(client) == ["block:0", "1"]


def test_calls_past_the_nodes_limit_wait_for_a_slot_within_their_deadline(serve, connect):
    """python-api §9: a request's wait for room counts inside its own timeout. A client probe
    found calls past the node's ``client_calls_in_flight`` refused at once with
    ``ResourceExhausted`` (500 concurrent awaits in asyncio code lose some); they wait for a
    call in flight to end, in order, and one whose deadline passes first is never sent."""
    node = serve(client_calls_in_flight=2)
    client = connect(node)
    _room(client)
    held = [client.request_to_spot("r", Hold()).future() for _ in range(2)]
    with pytest.raises(zlink.DeadlineExceeded, match="no room for a call"):
        client.request_to_spot("r", Echo(text="gives up")).timeout(0.2).wait(WAIT)
    waiting = [client.request_to_spot("r", Echo(text=f"w{i}")).future() for i in range(3)]
    HOLD.set()
    assert [call.result(WAIT) for call in held] == ["held", "held"]
    assert [call.result(WAIT) for call in waiting] == ["w0", "w1", "w2"]
    assert client.counters()["call_waits"] == 4
    assert node.counters().get("client_calls_refused", 0) == 0  # the node never saw too many
    assert client.request_to_spot("r", Echo(text="again")).wait(WAIT) == "again"


# -- exactly once: the late reply (execution-model §16) ------------------------------------------


def test_a_reply_after_the_clients_deadline_is_dropped_and_counted_once(serve, connect):
    node = serve()
    client = connect(node)
    _room(client)
    call = client.request_to_spot("r", Hold()).timeout(0.2).future()
    assert HOLDING.wait(WAIT)
    with pytest.raises(zlink.DeadlineExceeded):
        call.result(WAIT)
    assert client.counters().get("late_replies", 0) == 0
    HOLD.set()  # the handler now replies, after the call completed
    assert _seen(client) == []  # answered after the late reply, on the same connection
    assert client.counters()["late_replies"] == 1
    assert isinstance(call.exception(0), zlink.DeadlineExceeded)  # still: completed once


def test_a_cancelled_await_completes_the_call_and_its_reply_is_late(serve, connect):
    node = serve()
    client = connect(node)
    _room(client)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.request_to_spot("r", Hold()).timeout(WAIT), 0.2)

    asyncio.run(main())
    assert HOLDING.wait(WAIT)
    HOLD.set()
    assert _seen(client) == []
    assert client.counters()["late_replies"] == 1


# -- a lost connection ---------------------------------------------------------------------------


def _until_lost(client: Any, failing_over_from: str | None = None) -> None:
    """Bounded: until the client's connection says it is lost (the node's goodbye came), or,
    given ``failing_over_from``, the client is on another node's connection already (a node
    that said goodbye is tried last: the next may answer before this looks)."""
    end = time.monotonic() + WAIT
    while client._connection.state != "lost" and (
        failing_over_from is None or client._connection.endpoint == failing_over_from
    ):
        assert time.monotonic() < end, "the client never noticed the node went away"
        threading.Event().wait(0.01)  # polling the client's own thread's verdict, bounded


def test_a_node_shut_down_under_a_client_fails_its_pending_calls_at_once(serve, connect):
    node = serve()
    client = connect(node)
    _room(client)
    _room(client, "other")
    pending = client.request_to_spot("other", Hold()).timeout(60).future()
    assert HOLDING.wait(WAIT)
    started = time.monotonic()
    node.shutdown(timeout=0.5)
    with pytest.raises(zlink.Unavailable):
        pending.result(WAIT)
    assert time.monotonic() - started < WAIT  # not at its deadline, a minute away
    _until_lost(client)  # the node's goodbye may come just after the failed reply did
    with pytest.raises(zlink.Unavailable):
        client.send_to_spot("r", Note(n=1)).submit()
    with pytest.raises(zlink.Unavailable):
        client.request_to_spot("r", Echo(text="x")).wait(WAIT)


def test_a_client_reconnects_to_a_node_restarted_at_its_endpoint(serve, connect):
    """A demanding user's expectation (Orleans' gateway client, redis-py): a node restarted
    under a running client does not leave the client dead. What was pending fails at once
    (it may or may not have been taken); calls made while the node is away fail at once with
    ``Unavailable``, saying the client reconnects; once the node is back the client is
    connected again by itself (python-api §10)."""
    node = serve(node_id="n-a")
    client = connect(node)
    _room(client)
    assert client.request_to_spot("r", Echo(text="x")).wait(WAIT) == "x"
    address = node.address
    node.shutdown(timeout=WAIT)
    _until_lost(client)
    with pytest.raises(zlink.Unavailable, match="reconnects"):
        client.send_to_spot("r", Note(n=1)).submit()
    with pytest.raises(zlink.DeadlineExceeded):
        client.wait_connected(0.01)  # (nobody listens there now)
    again = serve(node_id="n-a", listen=address)
    client.wait_connected(WAIT)
    _room(client)  # a new node: a new room
    assert client.request_to_spot("r", Echo(text="y")).wait(WAIT) == "y"
    assert client.node_id == "n-a" and client.endpoint == address == again.address
    assert client.counters()["reconnects"] == 1


def test_a_client_does_not_reconnect_to_a_node_of_another_mesh(serve, connect):
    """A client probe: the node at a client's endpoint replaced by a node of mesh "other",
    the client reconnected to it in silence, and its calls went on in the wrong mesh (a
    ``get_or_create`` made a second room there). A client stays in the mesh it first met, as
    an Orleans client keeps to its cluster id: another mesh's node is refused (counted,
    logged) and the client keeps looking."""
    node = serve(node_id="n-a", mesh="main")
    client = connect(node)
    _room(client)
    address = node.address
    node.shutdown(timeout=WAIT)
    _until_lost(client)
    stranger = serve(node_id="n-x", mesh="other", listen=address)
    end = time.monotonic() + WAIT
    while not client.counters().get("reconnects_refused_other_mesh"):
        assert time.monotonic() < end, "the client never met the other mesh's node"
        threading.Event().wait(0.01)  # polling the reconnect thread's verdict, bounded
    with pytest.raises(zlink.Unavailable, match="reconnects"):
        client.request_to_spot("r", Echo(text="x")).wait(WAIT)
    assert client.counters().get("reconnects", 0) == 0
    stranger.shutdown(timeout=WAIT)
    again = serve(node_id="n-b", mesh="main", listen=address)
    client.wait_connected(WAIT)
    assert client.node_id == "n-b" and again.address == address
    _room(client)
    assert client.request_to_spot("r", Echo(text="y")).wait(WAIT) == "y"


def test_a_client_of_several_endpoints_takes_the_first_that_answers_and_fails_over(serve):
    """Nodes of one mesh each route any call, so a client may be given several: it connects
    to the first that answers (a dead one costs only its share of the timeout) and, when that
    node goes away, to the next one that answers."""
    first, second = serve(node_id="n-1"), serve(node_id="n-2")
    with socket.socket() as probe:  # an endpoint nobody answers at (bound, never accepting)
        probe.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        started = time.monotonic()
        client = zlink.connect([dead, first.address, second.address], timeout=1.5)
        assert time.monotonic() - started < WAIT
    try:
        assert client.node_id == "n-1"
        first.shutdown(timeout=WAIT)
        _until_lost(client, failing_over_from=first.address)
        client.wait_connected(WAIT)
        assert client.node_id == "n-2" and client.endpoint == second.address
        _room(client)
        assert client.request_to_spot("r", Echo(text="z")).wait(WAIT) == "z"
    finally:
        client.close()
    assert not [t for t in threading.enumerate() if t.name == "zlink-client-reconnect"]


def test_a_client_given_one_node_learns_the_mesh_and_fails_over_to_another(serve, tmp_path):
    """The node a client connects to names the other nodes of its mesh in its ``WELCOME``
    (their client endpoints): when it goes away, the client connects to one of them by
    itself, though it was given only the first (Orleans' gateway list, Akka's cluster client
    receptionists)."""
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    first, second = serve(node_id="n-1", store=store), serve(node_id="n-2", store=store)
    transport = first._runtime.router.transport
    end = time.monotonic() + WAIT
    while transport.peers() != ["n-2"]:  # (bounded) the two nodes meet through the store
        assert time.monotonic() < end, "the nodes never met"
        threading.Event().wait(0.01)
    client = zlink.connect(first.address, timeout=WAIT)
    try:
        assert client._failover.endpoints == (first.address, second.address)
        first.shutdown(timeout=WAIT)
        _until_lost(client, failing_over_from=first.address)
        client.wait_connected(WAIT)
        assert client.node_id == "n-2" and client.endpoint == second.address
        _room(client, "after")
        assert client.request_to_spot("after", Echo(text="a")).wait(WAIT) == "a"
    finally:
        client.close()


def test_a_client_made_not_to_reconnect_stays_lost_and_close_ends_reconnecting(serve, connect):
    node = serve()
    address = node.address
    stays = connect(node, reconnect=False)
    tries = connect(node)
    node.shutdown(timeout=WAIT)
    _until_lost(stays)
    _until_lost(tries)
    with pytest.raises(zlink.Unavailable) as refused:
        stays.send_to_spot("r", Note(n=1)).submit()
    assert "reconnects" not in str(refused.value)
    end = time.monotonic() + WAIT  # (bounded) its loop starts as the loss is reported, just
    while not any(t.name == "zlink-client-reconnect" for t in threading.enumerate()):  # after
        assert time.monotonic() < end, "no reconnect began"  # the state says lost
        threading.Event().wait(0.01)
    tries.close()  # while it reconnects: the loop ends with it
    assert not [t for t in threading.enumerate() if t.name == "zlink-client-reconnect"]
    with pytest.raises(zlink.InvalidOperation):
        tries.wait_connected(WAIT)
    serve(listen=address)
    with pytest.raises(zlink.Unavailable, match="reconnect=False"):  # at once: it is back,
        stays.wait_connected(WAIT)  # and this client does not come back


def test_connect_refuses_bad_endpoint_lists_and_settings():
    for bad in ([], ["tcp://127.0.0.1:7101", 7101], ("tcp://127.0.0.1",)):
        with pytest.raises(zlink.InvalidArgument):
            zlink.connect(bad)  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument, match="reconnect"):
        zlink.connect("tcp://127.0.0.1:7101", reconnect="yes")  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument, match="give keys too"):  # (a service probe: it
        zlink.connect("tcp://127.0.0.1:7101", client="web")  # was silently ignored)


def _fake_node() -> tuple[zmq.Socket[Any], str]:
    """A ROUTER that answers one HELLO like a node does (and then does what the test says)."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    return router, f"tcp://127.0.0.1:{port}"


def _welcome(router: zmq.Socket[Any], admission_timeout: float = 5.0) -> bytes:
    assert router.poll(WAIT * 1000)
    ident, data = router.recv_multipart()
    hello = cw.decode(data)
    assert isinstance(hello, cw.Hello)
    welcome = cw.Welcome(
        hello.correlation, "fake", "main", 8, 1 << 20, 8, admission_timeout, 5.0, 1 << 20, (), 1.0
    )
    router.send_multipart([ident, cw.encode(welcome)])
    return ident


@contextlib.contextmanager
def _silent_node(admission_timeout: float = 5.0) -> Iterator[Any]:
    """A client of a fake node that welcomes it and then says nothing more: no verdict, no
    reply (long heartbeats: the connection is not lost meanwhile)."""
    router, endpoint = _fake_node()
    result: dict[str, Any] = {}
    opened = threading.Thread(
        target=lambda: result.update(client=zlink.connect(endpoint, heartbeat=60.0))
    )
    opened.start()
    _welcome(router, admission_timeout=admission_timeout)
    opened.join(WAIT)
    client = result["client"]
    try:
        yield client
    finally:
        router.close(0)
        client.close()


def test_a_connection_that_drops_without_goodbye_fails_pending_calls_at_once():
    router, endpoint = _fake_node()
    result: dict[str, Any] = {}
    opened = threading.Thread(
        target=lambda: result.update(client=zlink.connect(endpoint, window=1))
    )
    opened.start()
    _welcome(router)
    opened.join(WAIT)
    client = result["client"]
    try:
        pending = client.request_to_spot("r", Echo(text="x")).timeout(60).future()
        sent = client.send_to_spot("r", Note(n=1)).future()  # on the wire: no verdict comes
        waiting = client.send_to_spot("r", Note(n=2)).future()  # waits for room in the window
        arrived = 0
        while arrived < 2:  # the request and the send arrived; the node now vanishes
            assert router.poll(WAIT * 1000)
            frame = cw.decode(router.recv_multipart()[1])
            arrived += len(frame.frames) if isinstance(frame, cw.Pack) else 1
        router.close(0)
        for call in (pending, sent, waiting):
            with pytest.raises(zlink.Unavailable):
                call.result(WAIT)
        counters = client.counters()
        assert counters["calls_failed_connection_lost"] == 1
        assert counters["sends_unconfirmed_connection_lost"] == 1
    finally:
        router.close(0)
        client.close()


def test_a_send_wait_returns_by_its_deadline_when_its_node_gives_no_verdict():
    """A client probe: ``send(...).wait(0.5)`` to a node that had stopped (SIGSTOP) returned
    only when heartbeats declared the connection lost, 3.4 s later (20 s with a heartbeat of
    5 s). A blocking wait returns by its deadline (python-api §11): the send left, so its
    outcome is the node's, and the caller is told it may still be admitted."""
    with _silent_node() as client:
        for make in (
            lambda: client.send_to_spot("r", Note(n=1)),
            lambda: client.send_many_to_spot("r", [Note(n=2), Note(n=3)]),
        ):
            started = time.monotonic()
            with pytest.raises(zlink.DeadlineExceeded, match="may still be admitted"):
                make().wait(0.3)
            assert time.monotonic() - started < 1.0  # its 0.3 s, and a moment for a verdict


def test_a_send_wait_without_a_verdict_adds_nothing_to_its_deadline():
    """A client probe: with its node silent, ``send(...).wait(t)`` returned 0.1 s after its
    deadline (``wait(0.001)`` after 0.102 s, where a request's returned after 0.002 s): a
    send that had left waited a grace for its verdict past the caller's time. It returns by
    its deadline (python-api §11); a verdict on its way then is the node's. Median of 15 (a
    loaded machine wakes a thread late now and then, never 15 times in a row by 0.1 s)."""
    with _silent_node() as client:
        took = []
        for n in range(15):
            started = time.monotonic()
            with pytest.raises(zlink.DeadlineExceeded):  # (left, or not yet: either way)
                client.send_to_spot("r", Note(n=n)).wait(0.001)
            took.append(time.monotonic() - started)
        assert statistics.median(took) < 0.05, took


def test_a_send_with_no_timeout_of_its_own_ends_by_the_nodes_admission_timeout():
    """A review: ``send.wait()`` (no timeout: the node's ``admission_timeout``, python-api §9)
    and ``future()`` of a send that left for a node that gives no verdict waited until the
    connection was declared lost, or for ever with long heartbeats."""
    with _silent_node(admission_timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(zlink.DeadlineExceeded, match="may still be admitted"):
            client.send_to_spot("r", Note(n=1)).wait()
        waiting = client.send_to_spot("r", Note(n=2)).future()
        with pytest.raises(zlink.DeadlineExceeded, match="may still be admitted"):
            waiting.result(WAIT)
        assert time.monotonic() - started < 2.0  # twice its 0.3 s, and moments for verdicts


def test_a_node_that_stops_answering_heartbeats_is_lost():
    script = (
        "import sys, zmq\n"
        "from tests.conformance.test_client_server import _fake_node, _welcome\n"
        "router, endpoint = _fake_node()\n"
        "print(endpoint, flush=True)\n"
        "_welcome(router)\n"
        "print('welcomed', flush=True)\n"
        "router.poll(60000)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    client = None
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("tcp://127.0.0.1:")
        client = zlink.connect(endpoint, timeout=WAIT, heartbeat=0.1)
        assert proc.stdout.readline().strip() == "welcomed"
        pending = client.request_to_spot("r", Echo(text="x")).timeout(60).future()
        os.kill(proc.pid, signal.SIGSTOP)  # alive, connected, silent: only heartbeats tell
        started = time.monotonic()
        with pytest.raises(zlink.Unavailable):
            pending.result(WAIT)
        assert time.monotonic() - started < WAIT
    finally:
        proc.kill()
        proc.wait(WAIT)
        if proc.stdout is not None:
            proc.stdout.close()
        if client is not None:
            client.close()


# -- bad input at the client port ----------------------------------------------------------------


def _raw(node: zlink.Node) -> zmq.Socket[Any]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    assert node.address is not None
    sock.connect(node.address)
    return sock


def _answer(sock: zmq.Socket[Any]) -> cw.ClientFrame:
    assert sock.poll(WAIT * 1000), "no answer from the node"
    return cw.decode(sock.recv())


def test_replies_to_a_client_that_falls_behind_are_held_not_dropped(serve, connect):
    """A client probe: a client that read nothing for a moment (a GC pause, SIGSTOP for
    1.5 s) lost up to 1,502 of 3,000 replies, and the callers waited out their timeouts: once
    ZeroMQ's pipe to it held 1,000 frames, the node dropped the rest (counted only as
    ``client_frames_undeliverable``), and a lost ``ACKS`` shrank the client's send window for
    good. A reply reaches its caller (python-api §10). Here a raw client asks 3,000 echoes of
    8 kB and reads nothing until the node has answered them all: every reply comes, once.
    (Room for all 3,000 at the Spot: by default its lane takes 1,024 and as many wait for
    room, and a caller past that is refused (python-api §9), which a loaded 3.13t run saw.)"""
    node = serve(admission_waiters=4096)
    client = connect(node)
    _room(client)  # (made by a real client: the raw one only asks)
    raw = _raw(node)
    raw.setsockopt(zmq.RCVHWM, 10)  # what it does not read stays in the node's pipe
    try:
        raw.send(cw.encode(cw.Hello(1, "raw")))
        assert isinstance(_answer(raw), cw.Welcome)
        text = json.dumps({"text": "x" * 8000}).encode()
        n = 3000
        for corr in range(2, 2 + n):
            raw.send(cw.encode(cw.Request(corr, TargetKind.SPOT, "r", "t.cs.echo", None, False,
                                          None, WAIT * 6, text)))  # fmt: skip
        handled = 0
        for _ in range(int(WAIT * 6 / 0.01)):  # (bounded) the node answers them all
            handled = sum(t.handled for t in node.status().types if t.type == "t.cs.room")
            if handled >= n:
                break
            threading.Event().wait(0.01)
        assert handled >= n, node.counters()
        replies: set[int] = set()
        while len(replies) < n:
            frame = _answer(raw)
            for one in frame.frames if isinstance(frame, cw.Pack) else (frame,):
                reply = cw.decode(one) if isinstance(one, bytes) else one
                assert isinstance(reply, cw.Reply) and reply.error is None
                assert reply.correlation not in replies  # once
                replies.add(reply.correlation)
    finally:
        raw.close(0)
    assert "client_frames_undeliverable" not in node.counters()


def test_bad_frames_are_counted_and_the_node_keeps_serving(serve, connect):
    node = serve(max_frame_bytes=1024)
    raw = _raw(node)
    try:
        head = cw.HEADER.pack
        v = cw.CLIENT_VERSION
        raw.send(b"\x01")  # truncated: no header
        raw.send(head(v, cw.ClientKind.REQUEST, 40) + b"[1,2")  # shorter than it says
        raw.send(head(v, cw.ClientKind.SEND, 9) + b"\xff\xfe garbage")  # garbage
        raw.send(head(v, 99, 2) + b"[]")  # an unknown kind
        raw.send(b"x" * 1500)  # oversized (max_frame_bytes=1024)
        raw.send(head(7, cw.ClientKind.HELLO, 2) + b"[]")  # an unknown version: told BYE
        bye = _answer(raw)
        assert isinstance(bye, cw.Bye) and "version 7" in bye.reason
        # a request with a wrong field: its correlation is read, its caller answered typed
        bad = b'[7,"spot","r","t.cs.echo",null,"not a bool",null,1.0]'
        raw.send(head(v, cw.ClientKind.REQUEST, len(bad)) + bad + b'{"text":"x"}')
        reply = _answer(raw)
        assert isinstance(reply, cw.Reply) and reply.correlation == 7
        assert reply.error is not None and reply.error.code is ErrorCode.INVALID_ARGUMENT
        # a send whose payload does not validate: its seq gets a typed failure
        send = cw.Send(5, TargetKind.SPOT, "r", "t.cs.note", None, False, None, None, b'{"n":"x"}')
        raw.send(cw.encode(send))
        acks = _answer(raw)
        assert isinstance(acks, cw.Acks) and acks.failed[0].seq == 5
        assert acks.failed[0].reason is cw.DropReason.BAD_PAYLOAD
        # a pack: each frame handled alone, in order; a bad one (or a pack in it) counted
        nested = cw.encode(cw.Pack((cw.encode(cw.Hello(9, "nested")),)))
        raw.send(cw.encode(cw.Pack((b"\x01", nested, cw.encode(cw.Hello(3, "raw"))))))
        welcome = _answer(raw)  # after all of them, in order
        assert isinstance(welcome, cw.Welcome) and welcome.correlation == 3
    finally:
        raw.close(0)
    counters = node.counters()
    assert counters["bad_client_frames"] == 9
    assert counters["bad_client_frames_truncated"] == 3
    assert counters["bad_client_frames_garbage"] == 1
    assert counters["bad_client_frames_kind"] == 2
    assert counters["bad_client_frames_version"] == 1
    assert counters["bad_client_frames_field"] == 1
    assert counters["oversized_frames"] == 1
    assert counters["client_sends_dropped_bad_payload"] == 1
    assert "client_server_errors" not in counters and "infra_task_errors" not in counters
    client = connect(node)  # and it serves a real client as before
    _room(client)
    assert client.request_to_spot("r", Echo(text="ok")).wait(WAIT) == "ok"


# -- asyncio -------------------------------------------------------------------------------------


def test_await_in_asyncio_code_on_a_remote_client(serve, connect):
    node = serve()
    client = connect(node)

    async def main() -> tuple[Any, ...]:
        created = await client.spots.get_or_create("r", "t.cs.room")
        await client.send_to_spot("r", Note(n=1))
        await client.send_many_to_spot("r", [Note(n=2), Note(n=3)])
        echoed = await client.request_to_spot("r", Echo(text="a"))
        with pytest.raises(zlink.HandlerError):
            await client.request_to_spot("r", Fail())
        seen = await asyncio.gather(*(client.request_to_spot("r", Seen()) for _ in range(3)))
        return created.created, echoed, seen

    assert asyncio.run(main()) == (True, "a", [["1", "2", "3"]] * 3)


def test_await_in_asyncio_code_on_node_client_waits_for_admission(serve):
    node = serve(app_lane_items=2)
    client = node.client()
    _room(client)
    _fill_lane(client)

    async def send() -> None:
        await client.send_to_spot("r", Note(n=2))

    async def main() -> list[str]:
        sending = asyncio.ensure_future(send())
        done, _ = await asyncio.wait({sending}, timeout=0.2)
        assert not done  # the lane is full: it waits for room, it is not refused
        HOLD.set()
        await sending
        assert await client.request_to_spot("r", Echo(text="e")) == "e"
        seen: list[str] = await client.request_to_spot("r", Seen())
        return seen

    assert asyncio.run(main()) == ["block:0", "1", "2"]
    with pytest.raises(zlink.InvalidOperation):  # no turn and no running loop
        client.request_to_spot("r", Seen()).__await__().send(None)


# -- a client of its own process -----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_client_process_gets_every_reply_once_and_its_sends_in_order(serve):
    node = serve()
    n = 300
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.client_process", str(node.address), str(n)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        proc.wait(WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    for who in ("a", "b"):
        assert result["replies"][who] == [f"{who}:{i}" for i in range(0, n, 10)]
        mine = [s for s in result["seen"] if s.startswith(f"{who}:")]
        assert mine == [f"{who}:{i}" for i in range(n)]  # exactly once, in order
    assert len(result["seen"]) == 2 * n
    assert result["counters"].get("late_replies", 0) == 0
    assert not any(name.startswith("sends_dropped") for name in result["counters"])


# A ``zlink.connect`` client whose connection cannot even be made (python-api §10).
#
# Found by a fresh-eyes audit of the client (each test failed first): making a connection's
# sockets can fail (no file descriptor left is ``EMFILE`` there, not at ``open``; an endpoint
# ZeroMQ refuses is ``EINVAL`` at ``connect``), and that fault escaped the reconnect loop, whose
# thread died: the client stayed lost for good, even once its node was back. And ``connect()``
# let through hosts ZeroMQ refuses, so the caller got a raw ``zmq.ZMQError``: bad input is
# ``InvalidArgument`` at the call site.


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://-a:7101", "tcp://%:7101", "tcp://*:7101", "tcp://node\u00e9:7101", "tcp://a@b:7101"],
)
def test_connect_to_a_malformed_host_is_a_typed_error(endpoint):
    """A bad endpoint is ``InvalidArgument`` at the call site, never a raw ``zmq.ZMQError``."""
    with pytest.raises(zlink.InvalidArgument):
        zlink.connect(endpoint, timeout=0.2, reconnect=False)


def test_a_connection_that_cannot_be_made_does_not_end_reconnecting(serve, monkeypatch):
    """``connect([good, other])`` succeeds; once the good node goes away and comes back, the
    client reconnects, though making a connection to the other fails (here: an endpoint
    ZeroMQ refuses, let through as the check did before this fix). The reconnect thread died
    of that ``ZMQError`` and never ran again: the client stayed lost for good."""
    died = threading.Event()
    old_hook = threading.excepthook

    def hook(args: Any) -> None:
        if args.thread is not None and args.thread.name == "zlink-client-reconnect":
            died.set()
        old_hook(args)

    monkeypatch.setattr(client_module, "check_endpoint", lambda endpoint: endpoint)
    threading.excepthook = hook
    try:
        node = serve(node_id="n-a")
        address = node.address
        client = zlink.connect([address, "tcp://-a:7101"], timeout=0.3)
        try:
            _room(client)
            node.shutdown(timeout=WAIT)  # (a goodbye: the other endpoint is tried first)
            until(lambda: client.counters().get("reconnect_errors", 0) >= 1, "the other tried")
            serve(node_id="n-a", listen=address)
            client.wait_connected(WAIT)
            _room(client)
            assert client.request_to_spot("r", Echo(text="y")).wait(WAIT) == "y"
            assert not died.is_set()
        finally:
            client.close()
    finally:
        threading.excepthook = old_hook


def test_running_out_of_file_descriptors_once_does_not_end_reconnecting(serve, monkeypatch):
    """The reconnect loop survives a fault of one attempt, also where the connection is made:
    when the file descriptors run out it is ``zmq.Context()`` / ``ctx.socket()`` that raise
    ``ZMQError(EMFILE)``; that escaped, and the reconnect thread died for good."""
    node = serve(node_id="n-a")
    address = node.address
    client = zlink.connect(address, timeout=0.5)
    try:
        _room(client)
        real = zmq.Context
        failures = [zmq.ZMQError(errno.EMFILE)]  # the next context made: no fd left, once

        def context(*args, **kwargs):
            if failures:
                raise failures.pop()
            return real(*args, **kwargs)

        class _Zmq:  # the client's view of zmq only (the nodes here make contexts too)
            Context = staticmethod(context)

            def __getattr__(self, name):
                return getattr(zmq, name)

        monkeypatch.setattr(client_module, "zmq", _Zmq())
        node.shutdown(timeout=WAIT)
        serve(node_id="n-a", listen=address)
        client.wait_connected(WAIT)  # (before: DeadlineExceeded, nobody reconnected)
        assert client.counters().get("reconnects") == 1
    finally:
        client.close()


def test_ctrl_c_while_connecting_leaves_no_thread_behind(serve, monkeypatch):
    """The same audit: a ``KeyboardInterrupt`` in ``connect()`` (Ctrl-C while it waits for the
    node's answer) left the half-open connection's threads and sockets running; in a REPL
    they lived until the process ended."""
    node = serve(node_id="n-a")
    before = set(threading.enumerate())

    def interrupted(self: Any, timeout: float, cancel: Any = None) -> None:
        opened(self, timeout, cancel)
        raise KeyboardInterrupt

    opened = _Connection.open
    monkeypatch.setattr(_Connection, "open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zlink.connect(node.address, timeout=WAIT)
    until(lambda: not [t for t in threading.enumerate() if t not in before], "no thread left")
