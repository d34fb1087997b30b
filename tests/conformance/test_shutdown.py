"""Shutdown with work that outlives it (issue "Backpressure, and the faults found under load,
bad input and shutdown", item 11; python-api §7 ``node.shutdown``, execution-model §16 "with
an application handler kept waiting, the shutdown procedure proceeds").

A worker call (``context.workers.io`` / ``.cpu``) still running when ``shutdown(timeout)``
runs out is abandoned: its waiter gets ``Unavailable``, it is counted, and its thread never
holds up the interpreter's exit. A call that finishes within the timeout is waited for.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

import zlink
from tests.conftest import WAIT

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Work(zlink.Request[str], type_name="t.sd.work"):
    pool: str = "io"


class Stuck(zlink.Request[str], type_name="t.sd.stuck"):
    pass


class Relay(zlink.Request[str], type_name="t.sd.relay"):
    pass


class Probe:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()  # set only at the end of a test
        self.waiter = threading.Event()
        self.seen: list[str] = []

    def hold(self) -> str:
        self.started.set()
        self.release.wait(60)
        return "done"


@pytest.fixture
def probe() -> Iterator[Probe]:
    p = Probe()
    yield p
    p.release.set()  # the abandoned calls end too, also when the test failed


def build_app(probe: Probe) -> zlink.App:
    app = zlink.App("shutdown")

    @app.user_spot("t.sd.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        async def work(self, req: Work) -> str:
            pool = self.context.workers.io if req.pool == "io" else self.context.workers.cpu
            try:
                out: str = await pool(probe.hold)
            except zlink.ZLinkError as exc:
                probe.seen.append(type(exc).__name__)
                probe.waiter.set()
                raise
            return out

        @zlink.handler
        def stuck(self, req: Stuck) -> str:  # holds its worker past any shutdown's timeout
            return probe.hold()

        @zlink.handler
        async def relay(self, req: Relay) -> str:  # awaits a Spot that holds its worker
            out: str = await self.context.outbound.request_to_spot("s", Stuck())
            return out

    return app


def _node_threads_holding_exit() -> list[str]:
    """Threads of a node that the interpreter would join at exit."""
    return [t.name for t in threading.enumerate() if t.name.startswith("zlink") and not t.daemon]


@pytest.mark.parametrize("pool", ["io", "cpu"])
def test_shutdown_returns_in_time_and_abandons_a_worker_call_that_outlives_it(
    probe: Probe, pool: str
):
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=2)).start()
    try:
        client = node.client()
        client.spots.get_or_create("r", "t.sd.room").wait(WAIT)
        asked = client.request_to_spot("r", Work(pool=pool)).timeout(60).future()
        assert probe.started.wait(WAIT)
        began = time.monotonic()
        node.shutdown(timeout=0.5)
        took = time.monotonic() - began
        assert took < 0.5 + 0.4, took  # within its timeout (and a little bookkeeping)
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)  # the caller: a typed error
        assert probe.waiter.wait(WAIT)
        assert probe.seen == ["Unavailable"]  # the worker call's waiter, too
        counters = node.counters()
        assert counters.get("worker_calls_abandoned_at_shutdown") == 1
        # counted once (a probe's stop counted it again as a handler error and a late reply:
        # the handler the abandoned call resumed let its Unavailable through)
        assert not counters.get("handler_errors") and not counters.get("late_replies")
        assert _node_threads_holding_exit() == []  # the call still runs, on a daemon thread
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


def test_a_handler_whose_awaited_request_the_shutdown_fails_is_not_a_handler_error(
    probe: Probe,
):
    """The shutdown fails what waits for a reply with ``Unavailable``, its caller's own
    request first: the handler that awaited one and lets that error through ended because
    the node stopped, which is neither its fault nor a late reply."""
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=2)).start()
    try:
        client = node.client()
        for spot in ("r", "s"):
            client.spots.get_or_create(spot, "t.sd.room").wait(WAIT)
        asked = client.request_to_spot("r", Relay()).timeout(60).future()
        assert probe.started.wait(WAIT)  # "s" holds its worker; "r" awaits it
        node.shutdown(timeout=0.5)
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)
        counters = node.counters()
        assert counters.get("turns_abandoned_at_shutdown") == 1  # "s", still running
        assert not counters.get("handler_errors") and not counters.get("late_replies")
        # counted where the stop failed them (the review: else counted nowhere): the
        # client's request and the one "r" awaited
        assert counters.get("calls_failed_at_shutdown") == 2
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


def test_a_worker_call_that_ends_within_the_timeout_is_waited_for(probe: Probe):
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=2)).start()
    try:
        client = node.client()
        client.spots.get_or_create("r", "t.sd.room").wait(WAIT)
        asked = client.request_to_spot("r", Work()).timeout(60).future()
        assert probe.started.wait(WAIT)
        stopper = threading.Thread(target=node.shutdown, kwargs={"timeout": WAIT})
        stopper.start()
        assert node._runtime.stopped_admission.wait(WAIT)
        probe.release.set()  # the call ends while shutdown waits for it
        stopper.join(WAIT)
        assert not stopper.is_alive()
        assert asked.result(WAIT) == "done"
        assert probe.seen == []
        assert "worker_calls_abandoned_at_shutdown" not in node.counters()
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


def test_worker_calls_queued_behind_a_full_pool_are_discarded_at_shutdown(probe: Probe):
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=1, io_workers=1)).start()
    try:
        client = node.client()
        client.spots.get_or_create("r", "t.sd.room").wait(WAIT)
        workers = node._runtime.spots["r"].context.workers
        ran: list[str] = []
        first = workers.io(probe.hold).future()
        assert probe.started.wait(WAIT)
        queued = workers.io(ran.append, "queued").future()  # no thread free: it waits
        node.shutdown(timeout=0.2)
        for future in (first, queued):
            with pytest.raises(zlink.Unavailable):
                future.result(WAIT)
        counters = node.counters()
        assert counters.get("worker_calls_abandoned_at_shutdown") == 1
        assert counters.get("worker_calls_discarded_at_shutdown") == 1
        probe.release.set()
        assert ran == []  # and it never runs
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


_SCRIPT = """
import threading, time
import zlink

class Work(zlink.Request[str], type_name="t.sd.work"):
    pass

started = threading.Event()

def hold() -> str:
    started.set()
    threading.Event().wait(30)  # never set: only the process's exit ends it
    return "done"

app = zlink.App("shutdown-process")

@app.user_spot("t.sd.room")
class Room(zlink.UserSpot):
    @zlink.handler
    async def work(self, req: Work) -> str:
        return await self.context.workers.io(hold)

node = zlink.Node(app, zlink.NodeConfig(workers=2)).start()
node.client().spots.get_or_create("r", "t.sd.room").wait(5)
asked = node.client().request_to_spot("r", Work()).timeout(60).future()
assert started.wait(5)
began = time.monotonic()
node.shutdown(timeout=0.5)
print(f"shutdown returned after {time.monotonic() - began:.2f} s", flush=True)
try:
    asked.result(5)
except zlink.ZLinkError as exc:
    print(f"caller got {type(exc).__name__}", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_process_exits_promptly_after_shutdown_abandoned_a_worker_call():
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        began = time.monotonic()
        out, err = proc.communicate(timeout=20)  # the held call would keep it 30 s
        assert time.monotonic() - began < 20
        assert proc.returncode == 0, err
        assert "shutdown returned" in out and "caller got Unavailable" in out, (out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)


def test_a_turn_that_outlives_the_shutdown_is_counted_and_logged(
    probe: Probe, caplog: pytest.LogCaptureFixture
):
    """A service probe: a handler that ran past the shutdown's timeout was cut off (its
    worker left running), the process exited 0 saying "0 messages discarded", and nothing
    counted or logged it. It is counted (``turns_abandoned_at_shutdown``) and logged."""
    node = zlink.Node(build_app(probe), zlink.NodeConfig(workers=2)).start()
    try:
        client = node.client()
        client.spots.get_or_create("r", "t.sd.room").wait(WAIT)
        asked = client.request_to_spot("r", Stuck()).timeout(60).future()
        assert probe.started.wait(WAIT)
        caplog.set_level("WARNING", logger="zlink.node")
        node.shutdown(timeout=0.5)
        assert node.counters().get("turns_abandoned_at_shutdown") == 1
        assert any("abandoned" in r.getMessage() for r in caplog.records), caplog.records
        with pytest.raises(zlink.Unavailable):
            asked.result(WAIT)
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)


class Hold(zlink.Message, type_name="t.sd.hold"):
    pass


def test_a_handler_the_stops_close_deadline_cancels_is_no_handler_error(
    probe: Probe, caplog: pytest.LogCaptureFixture
):
    """Found by an audit of ``zlink run``: an Entry Spot's handler suspended on a worker call
    when the node stops is cancelled by its close's deadline (python-api §11), the stop's own
    doing; that was logged at ERROR with a traceback and counted as ``handler_errors`` on
    every rollout (an operator alerting on either got a false alarm). It is counted as
    ``handlers_cancelled_at_stop`` and said in one WARNING line."""
    app = zlink.App("shutdown-entry")

    @app.entry_spot("t.sd.lobby", actor="t.sd.player")
    class Lobby(zlink.EntrySpot):
        def on_initialize(self) -> None:
            self.context.outbound.send_to_spot(self.context.spot_id, Hold()).submit()

        @zlink.handler
        async def hold(self, msg: Hold) -> None:
            await self.context.workers.io(probe.hold)

    @app.actor("t.sd.player")
    class Player(zlink.Actor):
        pass

    caplog.set_level("INFO")
    node = zlink.Node(app, zlink.NodeConfig(workers=2, closing_timeout=0.2)).start()
    try:
        assert probe.started.wait(WAIT)
        node.shutdown(timeout=2.0)  # (the close's deadline first, then the worker call's end)
        counters = node.counters()
        assert not counters.get("handler_errors"), counters
        assert counters.get("handlers_cancelled_at_stop") == 1, counters
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.records
        assert not [r for r in caplog.records if r.exc_info], caplog.records
    finally:
        probe.release.set()
        node.shutdown(timeout=WAIT)
