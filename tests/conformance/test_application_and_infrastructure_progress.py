"""execution-model §16 "Application and infrastructure progress" (with §1, §10, §13).

Every application worker is kept blocked in a handler; the infrastructure thread still fires
timeouts on the injected clock and carries the shutdown through. Peer acceptance, the slow
status subscriber and cross-node completion come with the mesh and status issues.
"""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import ManualClock


class Stall(zlink.Request[str], type_name="t.pr.stall"):
    pass


class Quick(zlink.Request[str], type_name="t.pr.quick"):
    pass


class Relay(zlink.Request[str], type_name="t.pr.relay"):
    to: str


def build_app(gate: threading.Event, stalled: threading.Event) -> zlink.App:
    app = zlink.App("progress")

    @app.user_spot("t.pr.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def stall(self, req: Stall) -> str:
            stalled.set()
            assert gate.wait(WAIT)  # a handler that keeps its worker
            return "late"

        @zlink.handler
        def quick(self, req: Quick) -> str:
            return "quick"

        @zlink.handler
        async def relay(self, req: Relay) -> str:
            try:
                out: str = await self.context.outbound.request_to_spot(req.to, Stall())
            except zlink.ZLinkError as exc:
                return f"{type(exc).__name__}"
            return out

    return app


def test_the_timeout_of_a_call_fires_while_every_application_handler_is_kept_waiting(
    make_node, clock: ManualClock
):
    gate, stalled = threading.Event(), threading.Event()
    node = make_node(build_app(gate, stalled), workers=1)
    client = node.client()
    for room in ("a", "b"):
        client.spots.get_or_create(room, "t.pr.room").wait(WAIT)
    first = client.request_to_spot("a", Stall()).timeout(30).future()
    assert stalled.wait(WAIT)  # the only worker is now held by a's handler
    second = client.request_to_spot("b", Quick()).timeout(1).future()  # queued, cannot run
    clock.advance(1.5)
    with pytest.raises(zlink.DeadlineExceeded):
        second.result(WAIT)
    assert not first.done()
    gate.set()
    assert first.result(WAIT) == "late"


def test_a_late_reply_does_not_create_a_second_terminal_and_is_counted(
    make_node, clock: ManualClock
):
    gate, stalled = threading.Event(), threading.Event()
    node = make_node(build_app(gate, stalled))
    client = node.client()
    client.spots.get_or_create("a", "t.pr.room").wait(WAIT)
    call = client.request_to_spot("a", Stall()).timeout(2).future()
    assert stalled.wait(WAIT)
    clock.advance(2)
    with pytest.raises(zlink.DeadlineExceeded):
        call.result(WAIT)
    gate.set()
    node.wait_idle(WAIT)
    assert node.counters()["late_replies"] == 1
    with pytest.raises(zlink.DeadlineExceeded):  # still the first and only terminal
        call.result(0)


def test_a_turn_awaiting_a_call_resumes_with_the_timeout_while_the_target_is_stuck(
    make_node, clock: ManualClock
):
    gate, stalled = threading.Event(), threading.Event()
    node = make_node(build_app(gate, stalled), workers=2, request_timeout=5)
    client = node.client()
    for room in ("a", "b"):
        client.spots.get_or_create(room, "t.pr.room").wait(WAIT)
    relay = client.request_to_spot("a", Relay(to="b")).timeout(60).future()
    assert stalled.wait(WAIT)
    clock.advance(5)
    assert relay.result(WAIT) == "DeadlineExceeded"
    gate.set()


def test_the_shutdown_procedure_proceeds_while_an_application_handler_is_kept_waiting(
    clock: ManualClock,
):
    gate, stalled = threading.Event(), threading.Event()
    node = zlink.Node(build_app(gate, stalled), zlink.NodeConfig(workers=1), clock=clock).start()
    client = node.client()
    for room in ("a", "b"):
        client.spots.get_or_create(room, "t.pr.room").wait(WAIT)
    stuck = client.request_to_spot("a", Stall()).future()
    assert stalled.wait(WAIT)
    queued = client.request_to_spot("b", Quick()).future()
    try:
        node.shutdown(timeout=0.5)  # the stuck handler cannot finish; shutdown goes on
        with pytest.raises(zlink.Unavailable):
            queued.result(WAIT)
        with pytest.raises(zlink.Unavailable):
            stuck.result(WAIT)  # the caller is told, though the handler still runs
        with pytest.raises(zlink.Unavailable):
            client.request_to_spot("b", Quick()).future()
    finally:
        gate.set()


def test_a_graceful_shutdown_finishes_running_turns_and_fails_what_is_queued(clock):
    gate, stalled = threading.Event(), threading.Event()
    node = zlink.Node(build_app(gate, stalled), zlink.NodeConfig(workers=1), clock=clock).start()
    client = node.client()
    client.spots.get_or_create("a", "t.pr.room").wait(WAIT)
    running = client.request_to_spot("a", Stall()).future()
    assert stalled.wait(WAIT)
    queued = [client.request_to_spot("a", Quick()).future() for _ in range(3)]
    done = threading.Thread(target=node.shutdown, kwargs={"timeout": WAIT})
    done.start()
    assert node._runtime.stopped_admission.wait(WAIT)
    gate.set()  # the running turn may finish: it keeps its reply
    done.join(WAIT)
    assert running.result(WAIT) == "late"
    for fut in queued:
        with pytest.raises(zlink.Unavailable):
            fut.result(WAIT)
