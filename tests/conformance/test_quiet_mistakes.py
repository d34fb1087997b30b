"""Mistakes that used to pass quietly say what is wrong (issue "Running ZLink as a service"):
a client of a node not started, a request timeout that names its target and limit, and a
call built and never given a terminal (python-api §4: exactly one terminal per call)."""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT
from zlink.messaging import calls
from zlink.testing import ManualClock

HOLD = threading.Event()
HELD = threading.Event()


class Slow(zlink.Request[str], type_name="t.qm.slow"):
    pass


class Note(zlink.Message, type_name="t.qm.note"):
    n: int = 0


def _app() -> zlink.App:
    app = zlink.App("quiet-mistakes")

    @app.user_spot("t.qm.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def slow(self, req: Slow) -> str:
            HELD.set()
            HOLD.wait(WAIT)
            return "late"

        @zlink.handler
        def note(self, msg: Note) -> None:
            pass

    return app


def test_a_client_of_a_node_not_started_says_so() -> None:
    node = zlink.Node(_app(), zlink.NodeConfig(node_id="n9", workers=1))
    with pytest.raises(zlink.InvalidOperation, match=r"node n9 is not started: call start\(\)"):
        node.client()


def test_a_request_timeout_names_its_target_and_its_limit(make_node, clock: ManualClock) -> None:
    HOLD.clear()
    HELD.clear()
    node = make_node(_app())
    node.client().spots.get_or_create("kitchen", "t.qm.room").wait(WAIT)
    call = node.client().request_to_spot("kitchen", Slow()).timeout(2).future()
    assert HELD.wait(WAIT)
    clock.advance(2)
    with pytest.raises(zlink.DeadlineExceeded, match=r"no reply from spot 'kitchen' within 2 s"):
        call.result(WAIT)
    HOLD.set()


@pytest.mark.skipif(
    not calls.WATCHED,
    reason="calls do not warn where this runs as Python on the free-threaded build (calls.WATCHED)",
)
def test_a_call_never_given_a_terminal_warns_when_it_is_collected(make_node) -> None:
    """As asyncio warns of a coroutine never awaited: ``send_to_spot(...)`` without
    ``.submit()`` sent nothing, and says so, naming the call, its target and its payload."""
    node = make_node(_app())
    client = node.client()
    with pytest.warns(RuntimeWarning, match=r"SendCall to 'r' with Note was never given a ter"):
        client.send_to_spot("r", Note(n=1))
    with pytest.warns(RuntimeWarning, match=r"RequestCall to 'r' with Slow"):
        client.request_to_spot("r", Slow()).timeout(5)  # an option is not a terminal
    with pytest.warns(RuntimeWarning, match=r"BatchSendCall to 'r'"):
        client.send_many_to_spot("r", [Note(n=1), Note(n=2)])
    with pytest.warns(RuntimeWarning, match=r"CreateCall"):
        client.spots.get_or_create("r", "t.qm.room")


def test_a_call_ended_or_refused_does_not_warn(make_node, recwarn) -> None:
    node = make_node(_app())
    client = node.client()
    assert client.spots.get_or_create("r", "t.qm.room").wait(WAIT).created
    client.send_to_spot("r", Note(n=1)).submit()
    client.send_to_spot("r", Note(n=1)).wait(WAIT)
    client.send_many_to_spot("r", [Note(n=1)]).future().result(WAIT)
    with pytest.raises(zlink.InvalidArgument):
        client.request_to_spot("r", Slow()).timeout(-1)  # the caller heard of it already
    with pytest.raises(zlink.InvalidArgument):
        client.send_to_spot("r", Note()).wait(-1)
    assert node.wait_idle(WAIT)
    assert [str(w.message) for w in recwarn.list if w.category is RuntimeWarning] == []
