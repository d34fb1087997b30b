"""Mistakes that used to pass quietly say what is wrong (issue "Running ZLink as a service"):
a client of a node not started, and a request timeout that names its target and limit."""

from __future__ import annotations

import threading

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import ManualClock

HOLD = threading.Event()
HELD = threading.Event()


class Slow(zlink.Request[str], type_name="t.qm.slow"):
    pass


def _app() -> zlink.App:
    app = zlink.App("quiet-mistakes")

    @app.user_spot("t.qm.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def slow(self, req: Slow) -> str:
            HELD.set()
            HOLD.wait(WAIT)
            return "late"

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
