"""Failure and the Location Store: how soon a killed node's Spot serves again, and what the
store costs a call (issue "Node leases, failure detection and a Redis Location Store").

    python -m bench.rehome              # 3 interleaved rounds
    python -m bench.rehome --quick      # seconds; CI runs this to check the script works

* Re-homing: node ``a`` (a subprocess, ``bench.mesh_node``) owns the counter Spot; node ``b``
  (this process) calls it, then ``a`` is killed (SIGKILL) and ``b`` calls again and again
  (each call with a short timeout) until one succeeds: the Spot re-homed, a new generation.
  Printed: seconds from the kill to that first success, and its ratio to the lease, for
  leases of 1 s and 3 s, on each store (SQLite; Redis where ``redis-server`` is installed).
  Target: at most 1.5x the lease.
* Store cost (Redis): a request from ``b`` to a Spot of ``a`` with ``b``'s route cached,
  against the same request after ``b`` forgot its routes (every call asks the store first):
  the per-call time of each and their ratio, and the store round trips per cached call,
  counted by the server (``INFO commandstats``), less what the nodes' lease renewals sent
  meanwhile. Target: a cached route adds no store round trip (0.0 per call). Beside it, one
  ``lookup`` and one claim of the Redis store alone, per call.

Ratios are per round; the median of them is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zlink
from bench.mesh_node import Count, app
from bench.processes import stop

ROOT = Path(__file__).resolve().parents[1]
RETRY_TIMEOUT = 0.25  # seconds each call after the kill may take before the next is tried


def _node_a(store: str, lease: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.mesh_node", store, "--lease", str(lease)], cwd=ROOT,
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        stop(proc)
        raise RuntimeError(f"node a did not start: {line!r}")
    return proc


def _node_b(store: str, lease: float) -> zlink.Node:
    config = zlink.NodeConfig(
        node_id="b", listen="tcp://127.0.0.1:0", store=store, workers=2, lease_seconds=lease
    )
    node = zlink.Node(app, config).start()
    end = time.monotonic() + 10
    while "a" not in node.peers():
        if time.monotonic() > end:
            raise RuntimeError("b never met a")
        time.sleep(0.01)  # polling another process's start: nothing to wait on
    return node


def rehome_seconds(store: str, lease: float) -> float:
    """Kill ``a`` (owning the counter) and time ``b``'s calls until one succeeds."""
    proc = _node_a(store, lease)
    node = None
    try:
        node = _node_b(store, lease)
        client = node.client()
        client.request_to_spot("counter", Count()).wait(10)  # served by a; b knows the route
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        end = killed + 20 * lease
        while True:
            try:
                client.request_to_spot("counter", Count()).timeout(RETRY_TIMEOUT).wait(
                    10 * RETRY_TIMEOUT
                )
                return time.monotonic() - killed
            except (zlink.Unavailable, zlink.DeadlineExceeded):
                if time.monotonic() > end:
                    raise RuntimeError(f"the counter never served again ({store})") from None
    finally:
        if node is not None:
            node.shutdown(5)
        stop(proc)


def _redis_calls(url: str) -> int:
    """Script calls the server ran so far (``EVALSHA`` and ``EVAL``)."""
    import redis

    with redis.Redis.from_url(url) as conn:
        stats: dict[str, Any] = conn.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("evalsha", "eval"))  # fmt: skip


class StoreCost:
    """Node ``a`` (subprocess) and ``b`` (here) on one Redis server, lease 3 s."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc = _node_a(url, 3.0)
        self.node = _node_b(url, 3.0)
        self.client = self.node.client()
        self.client.request_to_spot("counter", Count()).wait(10)

    def cached(self, n: int) -> tuple[float, float]:
        """Seconds per call with the route cached, and store round trips per call."""
        renewals = self.node.counters().get("lease_renewals", 0)
        before = _redis_calls(self.url)
        t0 = time.perf_counter()
        for _ in range(n):
            self.client.request_to_spot("counter", Count()).wait(10)
        took = (time.perf_counter() - t0) / n
        # each renewal of either node is two scripts (renew, then the members); a's run at
        # about the same rate as b's
        renewed = self.node.counters().get("lease_renewals", 0) - renewals
        extra = max(0, _redis_calls(self.url) - before - 2 * 2 * renewed)
        return took, extra / n

    def uncached(self, n: int) -> float:
        """Seconds per call when every call first asks the store where the Spot is."""
        router = self.node._runtime.router
        t0 = time.perf_counter()
        for _ in range(n):
            router.forget_routes()
            self.client.request_to_spot("counter", Count()).wait(10)
        return (time.perf_counter() - t0) / n

    def close(self) -> None:
        self.node.shutdown(5)
        stop(self.proc)


def store_alone(url: str, n: int) -> tuple[float, float]:
    """Seconds per ``lookup`` and per claim of the Redis store alone."""
    from zlink.mesh.redis_store import RedisLocationStore

    with RedisLocationStore(url, prefix="bench-alone") as store:
        me = store.register_node("x", "inproc://x", 60.0).incarnation
        t0 = time.perf_counter()
        for i in range(n):
            store.reserve(f"s-{i}", "spot", "t", "x", me)
        claim = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for i in range(n):
            store.lookup(f"s-{i}")
        lookup = (time.perf_counter() - t0) / n
        for i in range(n):
            store.release(f"s-{i}", "x", me, 1)
    return lookup, claim


def _db(url: str, number: int) -> str:
    """``url`` (``redis://HOST:PORT/0``) with another database number."""
    return f"{url.rsplit('/', 1)[0]}/{number}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: checks it runs")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    leases = (1.0,) if args.quick else (1.0, 3.0)
    n_calls = 50 if args.quick else 1000
    have_redis = shutil.which("redis-server") is not None
    folder = Path(tempfile.mkdtemp(prefix="zlink-bench-rehome-"))
    server = None
    if have_redis:
        from tests.redis_server import RedisServer

        (folder / "redis").mkdir()
        server = RedisServer(folder / "redis").start()
    else:
        print("redis-server: not installed, the Redis rows are skipped")
    results: dict[str, list[float]] = {}
    cost = None
    try:
        if server is not None:
            cost = StoreCost(_db(server.url, 1))  # each part a database of its own
            cost.cached(n_calls // 10)  # warm up
        for r in range(rounds):
            row: dict[str, float] = {}
            for lease in leases:
                stores = {"sqlite": f"sqlite:///{folder}/r{r}-{lease}.db"}
                if server is not None:
                    stores["redis"] = _db(server.url, 2 if lease == 1.0 else 3)
                for name, url in stores.items():
                    seconds = rehome_seconds(url, lease)
                    row[f"{name} lease {lease:g}s: kill to served s"] = seconds
                    row[f"{name} lease {lease:g}s: vs lease"] = seconds / lease
            if cost is not None and server is not None:
                took, trips = cost.cached(n_calls)
                uncached = cost.uncached(n_calls)
                row["redis cached call us"] = took * 1e6
                row["redis uncached call us"] = uncached * 1e6
                row["uncached vs cached"] = uncached / took
                row["store round trips per cached call"] = trips
                lookup, claim = store_alone(server.url, n_calls)
                row["redis lookup us"] = lookup * 1e6
                row["redis claim us"] = claim * 1e6
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.3f}" for k, v in row.items()))
            for key, value in row.items():
                results.setdefault(key, []).append(value)
    finally:
        if cost is not None:
            cost.close()
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print("median of rounds:")
    for key, values in results.items():
        print(f"  {key}: {statistics.median(values):,.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
