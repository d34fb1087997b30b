"""Senders that wait for room, against the Spot's own drain rate (python-api §9).

    python -m bench.backpressure            # 3 interleaved rounds, 200,000 messages each way
    python -m bench.backpressure --quick    # seconds; CI runs this to check the script works

Four producer threads ``wait()``-send 200,000 messages in all to one Spot whose handler spins
for 20 us, on one node and across the two nodes of a ``LocalCluster`` (the Spot on node-1, the
producers on node-2). For each run it checks that every message was handled exactly once and
in per-sender order, that no send was refused, and the growth of the process's RSS; it prints
the senders' throughput beside the Spot's own drain rate, measured in the same round on the
same node (1,000 messages queued while its gate is held, then drained), and the median of the
per-round ratios. Target: a ratio of at least 0.9, RSS growth under 50 MB.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

import zlink
from zlink.testing import LocalCluster

SPIN = 20e-6  # seconds each handler call spins
PRODUCERS = 4


class Work(zlink.Message, type_name="bench.bp.work"):
    sender: int
    n: int


class Tally:
    """What the Spot saw: counts, per-sender order, and when the last one came."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.handled = 0
        self.out_of_order = 0
        self.last: dict[int, int] = {}
        self.done = threading.Event()

    def reset(self, expect: int) -> None:
        self.expect, self.handled, self.out_of_order = expect, 0, 0
        self.last.clear()
        self.done.clear()


TALLY = Tally(0)


def build_app() -> zlink.App:
    app = zlink.App("bench-backpressure")

    @app.user_spot("bench.bp.sink")
    class Sink(zlink.UserSpot):
        @zlink.handler
        def work(self, msg: Work) -> None:
            end = time.perf_counter() + SPIN
            while time.perf_counter() < end:
                pass
            tally = TALLY
            if tally.last.get(msg.sender, -1) != msg.n - 1:
                tally.out_of_order += 1
            tally.last[msg.sender] = msg.n
            tally.handled += 1
            if tally.handled == tally.expect:
                tally.done.set()

    return app


def drain_rate(node: zlink.Node, client: zlink.Client, n: int = 1000) -> float:
    """Messages per second the Spot drains with a full queue: ``n`` queued behind its held
    gate (the instrumented part, as in ``bench.split``), then let go."""
    gate = node._rt.spots["sink"].owner.gate
    while not gate._flag.acquire(False):  # a worker may still be letting go of it
        time.sleep(0.001)
    TALLY.reset(n)
    for i in range(n):
        client.send_to_spot("sink", Work(sender=99, n=i)).submit()
    t0 = time.perf_counter()
    gate._run_batch()  # drains the ring on this thread, as a worker would, and lets it go
    if not TALLY.done.wait(60):
        raise RuntimeError("the drain did not finish")
    return n / (time.perf_counter() - t0)


def produce(client: zlink.Client, total: int) -> tuple[float, int]:
    """``total`` messages from ``PRODUCERS`` threads with ``wait()``; (seconds, refusals)."""
    per = total // PRODUCERS
    TALLY.reset(per * PRODUCERS)
    refused = [0]
    start = threading.Barrier(PRODUCERS + 1)

    def run(sender: int) -> None:
        send = client.send_to_spot
        start.wait()
        for i in range(per):
            try:
                send("sink", Work(sender=sender, n=i)).wait(60)
            except zlink.ResourceExhausted:
                refused[0] += 1

    threads = [threading.Thread(target=run, args=(s,)) for s in range(PRODUCERS)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if not TALLY.done.wait(120):
        raise RuntimeError(f"only {TALLY.handled} of {TALLY.expect} were handled")
    return time.perf_counter() - t0, refused[0]


class Peak:
    """The process's peak RSS while a run lasts (sampled every 10 ms)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> Peak:
        gc.collect()
        self.base = self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 1e6


def one_round(name: str, node: zlink.Node, producer: zlink.Client, total: int,
              drainer: zlink.Client) -> dict[str, Any]:  # fmt: skip
    rate = drain_rate(node, drainer)
    with Peak() as peak:
        seconds, refused = produce(producer, total)
    got = {"handled": TALLY.handled, "expect": TALLY.expect, "order": TALLY.out_of_order}
    throughput = TALLY.handled / seconds
    print(
        f"{name:9s} drain {rate:9,.0f}/s  senders {throughput:9,.0f}/s  "
        f"ratio {throughput / rate:5.2f}  refused {refused}  out of order {got['order']}  "
        f"handled {got['handled']:,}/{got['expect']:,}  RSS +{peak.growth_mb:5.1f} MB"
    )
    return {"ratio": throughput / rate, "refused": refused, "rss": peak.growth_mb, **got}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small round: checks it runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args(argv)
    rounds, total = (1, 4_000) if args.quick else (args.rounds, args.messages)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(f"# Python {sys.version.split()[0]} GIL={'on' if gil else 'off'} rounds={rounds} "
          f"messages={total:,} spin={SPIN * 1e6:.0f} us producers={PRODUCERS}")  # fmt: skip
    node = zlink.Node(build_app(), zlink.NodeConfig(workers=2)).start()
    cluster = LocalCluster(build_app(), nodes=2, workers=2).start()
    results: dict[str, list[dict[str, Any]]] = {"one node": [], "two nodes": []}
    try:
        client = node.client()
        client.spots.get_or_create("sink", "bench.bp.sink").wait(10)
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("sink", "bench.bp.sink").wait(10)
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("one node", lambda: one_round("one node", node, client, total, client)),
            ("two nodes", lambda: one_round("two nodes", n1, n2.client(), total, n1.client())),
        ]
        for _ in range(rounds):
            for name, run in runs:
                results[name].append(run())
    finally:
        node.shutdown()
        cluster.shutdown()
    ok = True
    for name, rs in results.items():
        median = statistics.median(r["ratio"] for r in rs)
        exact = all(r["handled"] == r["expect"] and r["order"] == 0 for r in rs)
        refused = sum(r["refused"] for r in rs)
        rss = max(r["rss"] for r in rs)
        print(
            f"{name}: median senders/drain {median:.2f} (target >= 0.90); exactly once in "
            f"order: {exact}; refused: {refused}; peak RSS growth {rss:.1f} MB (< 50)"
        )
        ok = ok and exact and refused == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
