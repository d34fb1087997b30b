"""Two node processes on loopback, beside Ray actors.

    python -m bench.mesh              # 3 interleaved rounds
    python -m bench.mesh --quick      # seconds; CI runs this to check the script works

Each round measures, for each system, between two OS processes on 127.0.0.1:

* one-way throughput to one actor: N messages sent without waiting for each, then one
  request whose answer says all N were handled (so the time covers handling, not only
  sending);
* request round trip: sequential requests, p50 of their latencies; beside it the floor, a
  bare pyzmq DEALER -> ROUTER echo between the same two kinds of process;
* fan-out: one message to each of 10,000 Spots, 10 rounds, in one node process, against the
  same over two node processes of one mesh (5,000 Spots each, both sending to their own at
  once): what a second process (a second GIL) adds. Target: >= 1.6x.

ZLink: this process is node ``b`` (``listen`` on 127.0.0.1, a SQLite store in a temp folder);
``bench.mesh_node`` in a subprocess is node ``a``, which owns the counter Spot. Ray: the driver
(this process) and one actor (``ray.init(num_cpus=2)``, its own worker process); skipped when
Ray is not installed. (Thespian's ``multiprocTCPBase`` was left out: on this machine its
ActorSystem never finished starting, and it listens on 0.0.0.0:1900, not on loopback only.)
Ratios are per round; the median of them is printed. Targets (issue "A mesh of OS
processes"): one-way >= 50,000 msg/s and >= 10x Ray; round trip p50 <= 150 us and <= 0.2x Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zlink
from bench.mesh_node import Count, Tick, app
from bench.processes import stop

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def zlink_pair() -> Iterator[Callable[..., Any]]:
    """Node ``a`` in a subprocess, node ``b`` here; yields a client of ``b``."""
    folder = tempfile.mkdtemp(prefix="zlink-bench-")
    store = f"sqlite:///{folder}/mesh.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.mesh_node", store], cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    node = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"node a did not start: {line!r}")
        config = zlink.NodeConfig(node_id="b", listen="tcp://127.0.0.1:0", store=store, workers=2)
        node = zlink.Node(app, config).start()
        client = node.client()
        end = time.monotonic() + 10
        while node._runtime.router.transport.peers() != ["a"]:
            if time.monotonic() > end:
                raise RuntimeError("b never saw a")
            time.sleep(0.01)
        yield client
    finally:
        if node is not None:
            node.shutdown(5)
        stop(proc)


def zlink_oneway(client: Any, n: int) -> float:
    start_count = client.request_to_spot("counter", Count()).wait(30)
    t0 = time.perf_counter()
    for _ in range(n):
        client.send_to_spot("counter", Tick()).wait(30)
    got = client.request_to_spot("counter", Count()).wait(60)
    elapsed = time.perf_counter() - t0
    assert got - start_count == n, (got, start_count, n)
    return n / elapsed


def zlink_rtt(client: Any, n: int) -> float:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.request_to_spot("counter", Count()).wait(30)
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat)


# -- fan-out: one process against two ----------------------------------------------------------
class FanoutNodes:
    """Two node processes of one mesh, each with its own cells: ``one`` fans out over 10,000
    cells of one process; ``two`` over 5,000 cells in each process at once (each process
    sends to its own, as a service with its work spread over processes does)."""

    def __init__(self, spots: int) -> None:
        folder = tempfile.mkdtemp(prefix="zlink-bench-fanout-")
        store = f"sqlite:///{folder}/mesh.db"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.spots = spots
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.mesh_node", "--fanout", name, store],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in ("x", "y")
        ]
        for proc, n in zip(self.procs, (spots, spots // 2), strict=True):
            self._expect(proc, "ready")
            self._say(proc, f"setup {n}")
        for proc in self.procs:
            self._expect(proc, "set")

    @staticmethod
    def _say(proc: Any, line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    @staticmethod
    def _expect(proc: Any, word: str) -> str:
        line: str = proc.stdout.readline()
        if not line.startswith(word):
            raise RuntimeError(f"a fan-out node said {line!r}, not {word!r}")
        return line

    def one(self, rounds: int) -> float:
        """msg/s over all the cells, in one process."""
        self._say(self.procs[0], f"run {self.spots} {rounds}")
        seconds = float(self._expect(self.procs[0], "done").split()[1])
        return self.spots * rounds / seconds

    def two(self, rounds: int) -> float:
        """msg/s over the same number of cells, half in each process, both at once."""
        half = self.spots // 2
        for proc in self.procs:
            self._say(proc, f"run {half} {rounds}")
        seconds = max(float(self._expect(p, "done").split()[1]) for p in self.procs)
        return self.spots * rounds / seconds

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)


# -- the floor: bare pyzmq --------------------------------------------------------------------
def floor_pair() -> Any:
    """A pyzmq ROUTER echo in a subprocess: the round trip no transport over ZeroMQ on this
    machine can beat (two sockets, one TCP connection, no framework)."""
    import zmq

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.mesh_node", "--echo"], cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    endpoint = proc.stdout.readline().split()[1]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return proc, ctx, sock


def floor_rtt(pair: Any, n: int) -> float:
    _, _, sock = pair
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.send(b"x" * 100)
        sock.recv()
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat)


def floor_close(pair: Any) -> None:
    proc, ctx, _ = pair
    ctx.destroy(linger=0)
    stop(proc)


# -- Ray ---------------------------------------------------------------------------------------
def ray_pair() -> Any:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

    @ray.remote
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def tick(self) -> None:
            self.n += 1

        def count(self) -> int:
            return self.n

    return ray, Counter.remote()


def ray_oneway(pair: Any, n: int) -> float:
    ray, actor = pair
    before = ray.get(actor.count.remote())
    t0 = time.perf_counter()
    for _ in range(n):
        actor.tick.remote()
    got = ray.get(actor.count.remote())
    elapsed = time.perf_counter() - t0
    assert got - before == n
    return n / elapsed


def ray_rtt(pair: Any, n: int) -> float:
    ray, actor = pair
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        ray.get(actor.count.remote())
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: checks it runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--zlink-only", action="store_true", help="leave Ray out")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    n_zl, n_peer, n_rtt = (2000, 300, 100) if args.quick else (50_000, 3000, 1000)
    peers: dict[str, tuple[Any, Callable[..., float], Callable[..., float]]] = {}
    for name, make, oneway, rtt in (
        () if args.zlink_only else (("ray", ray_pair, ray_oneway, ray_rtt),)
    ):
        try:
            peers[name] = (make(), oneway, rtt)
        except ImportError:
            print(f"{name}: not installed, skipped")
    results: dict[str, list[float]] = {}
    fan_spots, fan_rounds = (1000, 2) if args.quick else (10_000, 10)
    fan = FanoutNodes(fan_spots)
    floor = floor_pair()
    with zlink_pair() as client:
        zlink_oneway(client, n_zl // 10)  # warm up
        for r in range(rounds):
            row = {"zlink one-way msg/s": zlink_oneway(client, n_zl)}
            row["zlink rtt p50 us"] = zlink_rtt(client, n_rtt) * 1e6
            row["fan-out 1 process msg/s"] = fan.one(fan_rounds)
            row["fan-out 2 processes msg/s"] = fan.two(fan_rounds)
            row["fan-out 2 vs 1"] = (
                row["fan-out 2 processes msg/s"] / row["fan-out 1 process msg/s"]
            )
            row["pyzmq echo rtt p50 us"] = floor_rtt(floor, n_rtt) * 1e6
            row["rtt vs pyzmq echo"] = row["zlink rtt p50 us"] / row["pyzmq echo rtt p50 us"]
            for name, (pair, oneway, rtt) in peers.items():
                row[f"{name} one-way msg/s"] = oneway(pair, n_peer)
                row[f"{name} rtt p50 us"] = rtt(pair, n_rtt) * 1e6
                row[f"one-way vs {name}"] = (
                    row["zlink one-way msg/s"] / row[f"{name} one-way msg/s"]
                )
                row[f"rtt vs {name}"] = row["zlink rtt p50 us"] / row[f"{name} rtt p50 us"]
            print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items()))
            for key, value in row.items():
                results.setdefault(key, []).append(value)
    floor_close(floor)
    fan.close()
    print("median over rounds:")
    for key, values in results.items():
        print(f"  {key:28} {statistics.median(values):>12,.2f}")
    for pair, _, _ in peers.values():
        with contextlib.suppress(Exception):
            pair[0].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
