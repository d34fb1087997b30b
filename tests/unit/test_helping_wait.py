"""A plain thread blocked in ``wait()`` may run its target's idle gate (§6, §10: which thread
holds the execution right is free); it never does so for a busy gate, and it hands the gate to
the pool at the first turn boundary after its own call completed."""

from __future__ import annotations

import threading

import zlink
from tests.conftest import WAIT
from zlink.executor import Admission, CallJob, Gate, Owner, OwnerLanes, WorkerPool
from zlink.executor.lanes import LaneLimits
from zlink.testing import ManualClock


class Where(zlink.Request[str], type_name="t.hw.where"):
    pass


class Hold(zlink.Message, type_name="t.hw.hold"):
    pass


class Mark(zlink.Message, type_name="t.hw.mark"):
    pass


class WhereThenMark(zlink.Request[str], type_name="t.hw.wherethenmark"):
    pass


def build_app(gate: threading.Event, holding: threading.Event, marks: list[str]) -> zlink.App:
    app = zlink.App("help")

    @app.user_spot("t.hw.box")
    class Box(zlink.UserSpot):
        @zlink.handler
        def where(self, req: Where) -> str:
            return threading.current_thread().name

        @zlink.handler
        def where_then_mark(self, req: WhereThenMark) -> str:
            for _ in range(50):
                self.context.outbound.send_to_spot(self.context.spot_id, Mark()).submit()
            return threading.current_thread().name

        @zlink.handler
        def hold(self, msg: Hold) -> None:
            holding.set()
            assert gate.wait(WAIT)

        @zlink.handler
        def mark(self, msg: Mark) -> None:
            marks.append(threading.current_thread().name)

    @app.channel("t.hw.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def where(self, req: Where) -> str:
            return threading.current_thread().name

    return app


def test_a_blocking_wait_runs_an_idle_gate_on_the_calling_thread(make_node):
    node = make_node(build_app(threading.Event(), threading.Event(), []))
    client = node.client()
    client.spots.get_or_create("b", "t.hw.box").wait(WAIT)
    node.wait_idle(WAIT)  # the activation turn has fully ended: the gate is idle
    me = threading.current_thread().name
    assert client.request_to_spot("b", Where()).wait(WAIT) == me
    assert client.request("t.hw.api", Where()).wait(WAIT) == me
    assert client.request_to_spot("b", Where()).future().result(WAIT) != me  # no helping


def test_a_busy_gate_is_never_claimed_by_a_would_be_helper():
    pool = WorkerPool(1)
    gate = Gate(pool, ManualClock(), 0.010)
    owner = Owner(OwnerLanes(LaneLimits()), gate, "o", claim_on_yield=False)
    other = Owner(OwnerLanes(LaneLimits()), gate, "p", claim_on_yield=False)
    assert gate._flag.acquire(False)  # someone else holds the execution right
    verdict, claimed = owner.put_app_and_claim(CallJob(lambda: None))
    assert verdict is Admission.ADMITTED and claimed is None
    gate._flag.release()
    verdict, claimed = other.put_app_and_claim(CallJob(lambda: None))
    assert claimed is gate and gate.busy  # idle before: now this caller holds it
    ran: list[str] = []
    owner.put_app(CallJob(lambda: ran.append("o")))
    gate.help(lambda: len(ran) >= 1)
    pool.start()
    pool.wait_idle(WAIT)
    pool.shutdown()
    assert not gate.busy


def test_a_helper_hands_the_gate_to_the_pool_once_its_call_is_done(make_node):
    marks: list[str] = []
    node = make_node(build_app(threading.Event(), threading.Event(), marks))
    client = node.client()
    client.spots.get_or_create("b", "t.hw.box").wait(WAIT)
    node.wait_idle(WAIT)
    me = threading.current_thread().name
    assert client.request_to_spot("b", WhereThenMark()).wait(WAIT) == me
    node.wait_idle(WAIT)
    assert len(marks) == 50
    assert me not in marks  # queued behind the helped turn: run by the pool, not the helper
