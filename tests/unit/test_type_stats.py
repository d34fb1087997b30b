"""Per-type handled counts and sampled handler latency (issue 15, "Metrics": "messages handled
and refused per Spot type, handler latency histograms ... Handled-message counts and latency
also in ``node.status()``"; ``zlink.runtime.type_stats``)."""

from __future__ import annotations

import time
import urllib.request

import pytest

import zlink
from tests.conftest import WAIT
from zlink.admin import AdminServer
from zlink.runtime.type_stats import LATENCY_BOUNDS, SAMPLE_EVERY, TypeRow, TypeStats
from zlink.testing import LocalCluster, ManualClock


class Poke(zlink.Message, type_name="t.ts.poke"):
    pass


class Slow(zlink.Message, type_name="t.ts.slow"):
    pass


class Boom(zlink.Message, type_name="t.ts.boom"):
    pass


class Count(zlink.Request[int], type_name="t.ts.count"):
    pass


class Later(zlink.Request[int], type_name="t.ts.later"):
    pass


def _app() -> zlink.App:
    app = zlink.App("type-stats")

    @app.user_spot("t.ts.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.n = 0

        @zlink.handler
        def poke(self, msg: Poke) -> None:
            self.n += 1

        @zlink.handler
        def slow(self, msg: Slow) -> None:
            time.sleep(0.003)  # a handler that takes at least 3 ms: a lower bound, no race

        @zlink.handler
        def boom(self, msg: Boom) -> None:
            raise ValueError("boom")

        @zlink.handler
        def count(self, req: Count) -> int:
            return self.n

        @zlink.handler
        async def later(self, req: Later) -> int:
            await self.context.workers.io(time.sleep, 0.003)  # 3 ms off the turn
            return self.n

    @app.user_spot("t.ts.other")
    class Other(zlink.UserSpot):
        @zlink.handler
        def poke(self, msg: Poke) -> None:
            pass

    return app


def _row(node: zlink.Node, type_: str) -> zlink.TypeStatus:
    rows = [t for t in node.status().types if t.type == type_]
    assert len(rows) == 1, node.status().types
    return rows[0]


def test_handled_counts_are_exact_per_type_and_one_message_in_16_is_timed(make_node) -> None:
    node = make_node(_app())
    client = node.client()
    for spot in ("a", "b"):
        client.spots.get_or_create(spot, "t.ts.room").wait(WAIT)
    client.spots.get_or_create("o", "t.ts.other").wait(WAIT)
    for _ in range(2 * SAMPLE_EVERY - 1):
        client.send_to_spot("a", Poke()).submit()
    assert client.request_to_spot("a", Count()).wait(WAIT) == 2 * SAMPLE_EVERY - 1
    client.send_many_to_spot("b", [Poke()] * 10).submit()
    assert client.request_to_spot("b", Count()).wait(WAIT) == 10
    client.send_to_spot("o", Poke()).submit()
    node.wait_idle(WAIT)

    room = _row(node, "t.ts.room")
    assert (room.kind, room.live, room.handled) == ("spot", 2, 2 * SAMPLE_EVERY + 11)
    assert room.latency_samples == 2  # "a"'s messages SAMPLE_EVERY and 2 * SAMPLE_EVERY
    assert sum(room.latency_buckets) == 2
    assert len(room.latency_buckets) == len(node.status().latency_bounds) + 1
    assert room.latency_p50 is not None and room.latency_sum > 0
    other = _row(node, "t.ts.other")
    assert (other.live, other.handled, other.latency_samples) == (1, 1, 0)
    assert other.latency_p50 is None
    assert node.status().latency_sample_every == SAMPLE_EVERY


def test_counts_outlive_a_closed_spot_and_failures_count_as_handled(make_node) -> None:
    node = make_node(_app())
    client = node.client()
    ref = client.spots.get_or_create("a", "t.ts.room").wait(WAIT).spot_ref
    for _ in range(SAMPLE_EVERY):  # the last (a failure) is timed too
        client.send_to_spot("a", Boom()).submit()
    node.wait_idle(WAIT)
    assert node.counters()["handler_errors"] == SAMPLE_EVERY
    assert client.spots.close(ref)
    node.wait_idle(WAIT)
    room = _row(node, "t.ts.room")
    assert (room.live, room.handled, room.latency_samples) == (0, SAMPLE_EVERY, 1)


def test_the_latency_of_a_slow_handler_lands_in_its_bucket(make_node) -> None:
    """Sync handlers are timed around the call; an ``async def`` handler until its coroutine
    ends, its awaits included."""
    node = make_node(_app())
    client = node.client()
    client.spots.get_or_create("a", "t.ts.room").wait(WAIT)
    for _ in range(SAMPLE_EVERY - 1):
        client.send_to_spot("a", Poke()).submit()
    client.send_to_spot("a", Slow()).submit()  # message SAMPLE_EVERY: timed
    for _ in range(SAMPLE_EVERY - 1):
        client.send_to_spot("a", Poke()).submit()
    assert client.request_to_spot("a", Later()).wait(WAIT) == 2 * SAMPLE_EVERY - 2  # timed
    node.wait_idle(WAIT)
    room = _row(node, "t.ts.room")
    assert room.latency_samples == 2
    assert room.latency_sum >= 0.006
    at = LATENCY_BOUNDS.index(0.0025)  # 3 ms falls past the 2.5 ms bound
    assert sum(room.latency_buckets[: at + 1]) == 0, room.latency_buckets
    assert room.latency_p50 is not None and room.latency_p50 >= 0.005


def test_a_moved_spot_leaves_its_count_on_the_source(clock: ManualClock) -> None:
    with LocalCluster(_app(), nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        client = n1.client()
        client.spots.get_or_create("a", "t.ts.room").wait(WAIT)
        for _ in range(5):
            client.send_to_spot("a", Poke()).submit()
        assert client.request_to_spot("a", Count()).wait(WAIT) == 5
        n1.relocate_spot("a", n2.node_id, timeout=WAIT)
        assert client.request_to_spot("a", Count()).wait(WAIT) == 5  # state moved with it
        cluster.wait_idle(WAIT)
        here, there = _row(n1, "t.ts.room"), _row(n2, "t.ts.room")
        assert (here.live, here.handled) == (0, 6)
        assert (there.live, there.handled) == (1, 1)


def test_a_keep_alive_timer_tick_is_not_a_handled_message(make_node, clock: ManualClock) -> None:
    app = zlink.App("type-stats-timer")
    ticked: list[int] = []

    @app.user_spot("t.ts.beat")
    class Beat(zlink.UserSpot):
        def on_initialize(self) -> None:
            self.context.timers.register("beat", 1.0, options=zlink.TimerOptions(keeps_alive=True))

        @zlink.timer_handler("beat")
        def beat(self, tick: zlink.TimerTick) -> None:
            ticked.append(tick.sequence)

    node = make_node(app)
    node.client().spots.get_or_create("b", "t.ts.beat").wait(WAIT)
    for _ in range(3):
        clock.advance(1.0)
        node.wait_idle(WAIT)
    assert len(ticked) == 3
    assert _row(node, "t.ts.beat").handled == 0


def test_metrics_carry_handled_counts_and_a_latency_histogram_per_type(make_node) -> None:
    node = make_node(_app())
    client = node.client()
    client.spots.get_or_create("a", "t.ts.room").wait(WAIT)
    for _ in range(SAMPLE_EVERY):
        client.send_to_spot("a", Poke()).submit()
    node.wait_idle(WAIT)
    server = AdminServer(node, "127.0.0.1", 0).start()
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.stop()
    at = 'kind="spot",mesh="main",node="node-1",type="t.ts.room"'
    assert f"zlink_messages_handled_total{{{at}}} {float(SAMPLE_EVERY)}" in text
    assert f"zlink_handler_seconds_count{{{at}}} 1.0" in text
    inf = 'kind="spot",le="+Inf",mesh="main",node="node-1",type="t.ts.room"'
    assert f"zlink_handler_seconds_bucket{{{inf}}} 1.0" in text
    assert f"zlink_admissions_refused_total{{{at}}} 0.0" in text
    assert "# TYPE zlink_handler_seconds histogram" in text


@pytest.mark.parametrize(
    ("buckets", "p50", "p99"),
    [
        ([0] * len(LATENCY_BOUNDS), None, None),
        ([1] + [0] * (len(LATENCY_BOUNDS) - 1), LATENCY_BOUNDS[0], LATENCY_BOUNDS[0]),
        ([0, 99] + [0] * (len(LATENCY_BOUNDS) - 3) + [1], LATENCY_BOUNDS[1], LATENCY_BOUNDS[1]),
        ([0, 98] + [0] * (len(LATENCY_BOUNDS) - 3) + [2], LATENCY_BOUNDS[1], LATENCY_BOUNDS[-2]),
    ],
)
def test_quantiles_are_the_upper_bound_of_their_bucket(
    buckets: list[int], p50: float | None, p99: float | None
) -> None:
    row = TypeRow("spot", "t")
    row.buckets = buckets
    assert (row.quantile(0.5), row.quantile(0.99)) == (p50, p99)


def test_a_sample_goes_to_the_first_bucket_whose_bound_holds_it() -> None:
    stats = TypeStats()
    for seconds in (0.0, 0.00001, 0.0000101, 1e9):
        stats.sample("spot", "t", seconds)
    (row,) = stats.rows([])
    assert row.buckets[0] == 2 and row.buckets[1] == 1 and row.buckets[-1] == 1
    assert row.samples == 4


def test_the_hot_path_mask_is_sample_every() -> None:
    """``SendJob.invoke`` tests ``activity & 15`` as a literal: it must be SAMPLE_EVERY - 1."""
    import ast
    import pathlib

    import zlink.runtime.jobs

    # the source file, not inspect.getsource: the module may run compiled (zlink/_native.py)
    source = (pathlib.Path(zlink.runtime.jobs.__file__).parent / "jobs.py").read_text()
    job = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "SendJob"
    )
    invoke = next(n for n in job.body if isinstance(n, ast.FunctionDef) and n.name == "invoke")
    assert f"n & {SAMPLE_EVERY - 1}:" in (ast.get_source_segment(source, invoke) or "")
