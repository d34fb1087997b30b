"""A node that stops with calls kept behind a route fence (python-api §9: nothing accepted is
lost untold; README "Several nodes": a route switch keeps later calls behind a fence until it
is back). A ledger audit on 3.13t found a stopping node's kept calls neither handled nor
counted: 3 to 10 one-way messages in about one run of five of its seed 3. They fail as
undeliverable now: each one-way message counted (``sends_dropped_shutdown``), each request
answered ``Unavailable``. The manual clock never moves (no fence's deadline ends anything)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.mesh import wire
from zlink.testing import LocalCluster, ManualClock

HANDLED: list[int] = []


class Poke(zlink.Message, type_name="t.skc.poke"):
    n: int


class Ask(zlink.Request[int], type_name="t.skc.ask"):
    pass


def _app() -> zlink.App:
    app = zlink.App("stop-kept-calls")

    @app.user_spot("t.skc.box", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Box(zlink.UserSpot):
        @zlink.handler
        def poke(self, msg: Poke) -> None:
            HANDLED.append(msg.n)

        @zlink.handler
        def ask(self, req: Ask) -> int:
            return len(HANDLED)

    return app


def test_calls_kept_behind_a_fence_at_a_stop_are_counted_or_answered(clock: ManualClock) -> None:
    HANDLED.clear()
    with LocalCluster(_app(), nodes=3, clock=clock, workers=2, request_timeout=60.0) as cluster:
        n1, n2, n3 = cluster.nodes
        n1.client().spots.get_or_create("box", "t.skc.box").wait(WAIT)
        c3 = n3.client()
        c3.send_to_spot("box", Poke(n=0)).wait(WAIT)  # node-3's route: node-1
        cluster.wait_idle(WAIT)
        n1.relocate_spot("box", n2.node_id, timeout=WAIT)
        fenced = threading.Event()

        def swallow(env: Any) -> None:  # node-1 never sends the fence back
            fenced.set()

        n1._runtime.router.handle(wire.FenceEnvelope, swallow)
        c3.send_to_spot("box", Poke(n=1)).wait(WAIT)  # relayed by node-1: a hint, a fence
        assert fenced.wait(WAIT)
        until(lambda: 1 in HANDLED, "the relayed one is handled on node-2")
        for n in range(2, 6):  # kept behind the fence, on node-3
            c3.send_to_spot("box", Poke(n=n)).wait(WAIT)
        asked = c3.request_to_spot("box", Ask()).future()
        assert len(n3._runtime.router._switching.get("box", [])) >= 5  # (the fence, 4 sends, ...)
        n3.shutdown(WAIT)
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)
        counted = n3.counters().get("sends_dropped_shutdown", 0)
        assert sorted(HANDLED) == [0, 1] and counted == 4, (HANDLED, n3.counters())
