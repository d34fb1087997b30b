"""A ``zlink.connect`` client process against a node process, on loopback (python-api §10).

    python -m bench.client            # 3 interleaved rounds
    python -m bench.client --quick    # seconds; CI runs this to check the script still works

This process starts a node in a process of its own (``python -m bench.client --serve``: a node
listening on 127.0.0.1, its workers as ``--workers`` says), connects to it and measures, round
after round:

* round trip: sequential ``request_to_spot(...).wait()`` from one thread, p50 and p99;
* pipelined requests: 64 requests in flight at a time (``future()``), requests per second;
* one-way ``send_to_spot(...).submit()`` of one message instance to one Spot, timed until the
  Spot has handled the last one (a ``Count`` request after them, on the same connection, sees
  them all); a ``submit()`` refused because the client's window is full waits for room instead
  (``wait()``), and is counted;
* the batch path: ``send_many_to_spot`` of 100 messages per call, ``wait()``-ed.

Each one-way run checks exactly once: the Spot's count equals what was sent. The node process
is killed at the end whatever happens.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future
from typing import Any

import zlink

from .core import pct
from .processes import stop

PIPELINE = 64
BATCH = 100


class Tick(zlink.Message, type_name="bench.client.tick"):
    n: int = 0


class Ping(zlink.Request[int], type_name="bench.client.ping"):
    n: int = 0


class Count(zlink.Request[int], type_name="bench.client.count"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("bench-client")

    @app.user_spot("bench.client.counter")
    class Counter(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.count = 0

        @zlink.handler
        def tick(self, msg: Tick) -> None:
            self.count += 1

        @zlink.handler
        def ping(self, req: Ping) -> int:
            return req.n

        @zlink.handler
        def count_(self, req: Count) -> int:
            out, self.count = self.count, 0
            return out

    return app


def serve(workers: int) -> int:
    """The node process: print the address, serve until stdin closes."""
    config = zlink.NodeConfig(node_id="bench", workers=workers, listen="tcp://127.0.0.1:0")
    with zlink.Node(build_app(), config) as node:
        print(node.address, flush=True)
        sys.stdin.read()  # until the parent closes it (or dies)
    return 0


def round_trip(client: zlink.Client, n: int) -> list[float]:
    samples = []
    request = client.request_to_spot
    for i in range(n):
        t0 = time.perf_counter()
        request("c", Ping(n=i)).wait(10)
        samples.append(time.perf_counter() - t0)
    return samples


def pipelined(client: zlink.Client, n: int) -> float:
    request = client.request_to_spot
    t0 = time.perf_counter()
    window: list[Future[Any]] = []
    for i in range(n):
        window.append(request("c", Ping(n=i)).future())
        if len(window) >= PIPELINE:
            window.pop(0).result(10)
    for fut in window:
        fut.result(10)
    return n / (time.perf_counter() - t0)


def one_way(client: zlink.Client, n: int) -> tuple[float, int]:
    """``submit()`` n times; (messages per second until all were handled, refusals). A
    ``submit()`` waits for room nowhere: one the client's window refuses is sent again with
    ``wait()``; one the Spot's full lane dropped at the node (``sends_dropped_lane_full``, a
    verdict that comes later) is sent again so once the Spot has handled the rest."""
    send = client.send_to_spot
    msg = Tick()
    refused = 0
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            send("c", msg).submit()
        except zlink.ResourceExhausted:  # the window is full: wait for room (counted)
            refused += 1
            send("c", msg).wait(10)
    handled = client.request_to_spot("c", Count()).wait(60)  # (all taken before it: handled)
    again = n - handled  # dropped at the node, each counted there and here
    if again > 0:
        refused += again
        for _ in range(again):
            send("c", msg).wait(10)
        handled = client.request_to_spot("c", Count()).wait(60)
    seconds = time.perf_counter() - t0
    if handled != n:
        raise SystemExit(f"exactly once broken: sent {n:,}, handled {handled:,}")
    return n / seconds, refused


def batched(client: zlink.Client, n: int) -> float:
    batch = [Tick() for _ in range(BATCH)]
    send_many = client.send_many_to_spot
    t0 = time.perf_counter()
    for _ in range(n // BATCH):
        send_many("c", batch).wait(10)
    handled = client.request_to_spot("c", Count()).wait(60)
    seconds = time.perf_counter() - t0
    if handled != n // BATCH * BATCH:
        raise SystemExit(f"exactly once broken: sent {n // BATCH * BATCH:,}, handled {handled:,}")
    return handled / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small round: checks it runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="the node's workers")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.workers)
    rounds, trips, sends = (1, 300, 5_000) if args.quick else (args.rounds, 5_000, 100_000)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(f"# Python {sys.version.split()[0]} GIL={'on' if gil else 'off'} rounds={rounds} "
          f"round trips={trips:,} sends={sends:,} node workers={args.workers}; client and node "
          "are two processes on 127.0.0.1")  # fmt: skip
    node = subprocess.Popen(
        [sys.executable, "-m", "bench.client", "--serve", "--workers", str(args.workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    results: dict[str, list[float]] = {"p50": [], "p99": [], "pipe": [], "one": [], "batch": []}
    refusals = 0
    try:
        assert node.stdout is not None
        address = node.stdout.readline().strip()
        if not address.startswith("tcp://"):
            raise SystemExit(f"the node process did not start: {address!r}")
        with zlink.connect(address, timeout=10) as client:
            client.spots.get_or_create("c", "bench.client.counter").wait(10)
            round_trip(client, min(200, trips))  # warm up both processes
            for _ in range(rounds):
                samples = round_trip(client, trips)
                results["p50"].append(pct(samples, 0.5))
                results["p99"].append(pct(samples, 0.99))
                results["pipe"].append(pipelined(client, trips))
                rate, refused = one_way(client, sends)
                results["one"].append(rate)
                refusals += refused
                results["batch"].append(batched(client, sends))
                print(
                    f"round trip p50 {results['p50'][-1]:6.0f} us  p99 "
                    f"{results['p99'][-1]:6.0f} us  pipelined {results['pipe'][-1]:8,.0f} req/s"
                    f"  one-way submit {rate:8,.0f} msg/s ({refused:,} waited for room)  "
                    f"batch {results['batch'][-1]:8,.0f} msg/s"
                )
            counters = client.counters()
    finally:
        stop(node)
    print(
        f"median: round trip p50 {statistics.median(results['p50']):.0f} us, p99 "
        f"{statistics.median(results['p99']):.0f} us; pipelined "
        f"{statistics.median(results['pipe']):,.0f} req/s; one-way submit "
        f"{statistics.median(results['one']):,.0f} msg/s; batch "
        f"{statistics.median(results['batch']):,.0f} msg/s; late replies "
        f"{counters.get('late_replies', 0)}; window waits {refusals:,}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
