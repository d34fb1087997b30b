"""ZLink beside plain asyncio and the interpreter limit, and CPU-bound parallel speedup.

    python -m bench.peers            # full run
    python -m bench.peers --quick    # seconds; CI runs this to check the script still works

Every workload runs in this process, next to ZLink's own numbers (from ``bench.core``):

* asyncio: one event loop, an ``asyncio.Queue`` per actor; producer and consumer are tasks on
  the same loop (no thread is crossed), for one-way and request round trip.
* interpreter limit: ``deque.append`` + ``popleft`` + a method call in one thread: the floor
  under any Python actor runtime.
* fan-out over 1,000 Spots: ZLink's throughput, threads and RSS per idle Spot.
* CPU-bound: 4 Actors in a PER_ACTOR User Spot each run CPU-bound handlers; the time on one
  worker over the time on all cores is the parallel speedup (>1 only without a GIL).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import deque
from typing import Any

import psutil

import zlink

from .core import pct, zlink_fanout, zlink_one_way, zlink_round_trip


def asyncio_one_way(n: int) -> float:
    async def run() -> float:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        count = 0

        async def consumer() -> None:
            nonlocal count
            while count < n:
                await queue.get()
                count += 1

        task = asyncio.create_task(consumer())
        msg = {"n": 0}
        t0 = time.perf_counter()
        for i in range(n):
            queue.put_nowait(msg)
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the consumer drain, as a real producer would
        await task
        return n / (time.perf_counter() - t0)

    return asyncio.run(run())


def asyncio_round_trip(n: int) -> list[float]:
    async def run() -> list[float]:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def server() -> None:
            while True:
                fut, value = await queue.get()
                fut.set_result(value)

        task = asyncio.create_task(server())
        loop = asyncio.get_running_loop()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fut = loop.create_future()
            queue.put_nowait((fut, 1))
            await fut
            samples.append(time.perf_counter() - t0)
        task.cancel()
        return samples

    return asyncio.run(run())


def interpreter_limit(n: int) -> float:
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def tick(self, msg: Any) -> None:
            self.count += 1

    target, queue, msg = Counter(), deque(), {"n": 0}
    t0 = time.perf_counter()
    for _ in range(n):
        queue.append(msg)
        target.tick(queue.popleft())
    return n / (time.perf_counter() - t0)


class Crunch(zlink.Message, type_name="bench.crunch"):
    size: int


class EnterPer(zlink.Message, type_name="bench.enter_per"):
    room: str


def cpu_app(done: threading.Semaphore) -> zlink.App:
    app = zlink.App("cpu")

    @app.user_spot("bench.per", mode=zlink.ExecutionMode.PER_ACTOR)
    class Per(zlink.UserSpot):
        pass

    @app.entry_spot("bench.cpu_lobby", actor="bench.cruncher")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("bench.cruncher")
    class Cruncher(zlink.Actor):
        @zlink.handler
        def enter(self, msg: EnterPer) -> None:
            self.context.join(msg.room).defer()

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            done.release()

        @zlink.handler
        def crunch(self, msg: Crunch) -> None:
            total = 0
            for i in range(msg.size):
                total += i * i
            done.release()

    return app


def cpu_bound(workers: int, per_actor: int, size: int) -> float:
    """Seconds for 4 PerActor Actors to each run ``per_actor`` CPU-bound handlers."""
    done = threading.Semaphore(0)
    with zlink.Node(cpu_app(done), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        client.spots.get_or_create("per", "bench.per").wait(10)
        actors = [client.actors.create("bench.cruncher").wait(10).actor_id for _ in range(4)]
        for a in actors:
            client.send_to_actor(a, EnterPer(room="per")).submit()
        for _ in actors:
            assert done.acquire(timeout=10)
        msg = Crunch(size=size)
        t0 = time.perf_counter()
        for _ in range(per_actor):
            for a in actors:
                client.send_to_actor(a, msg).submit()
        for _ in range(per_actor * len(actors)):
            assert done.acquire(timeout=120)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    args = parser.parse_args(argv)
    cores = psutil.cpu_count() or 1
    n, rt, spots, cpu_n, cpu_size = (
        (2_000, 200, 200, 2, 20_000) if args.quick else (200_000, 5_000, 1_000, 10, 400_000)
    )
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(f"# Python {sys.version.split()[0]} GIL={'on' if gil else 'off'} cores={cores}")

    z1, a1, lim = zlink_one_way(n, cores), asyncio_one_way(n), interpreter_limit(n)
    print(
        f"one-way to one Spot   zlink {z1:>10,.0f} msg/s | asyncio {a1:>10,.0f} msg/s | "
        f"interpreter limit {lim:>11,.0f} msg/s | zlink/asyncio {z1 / a1:4.2f}x | "
        f"zlink/limit {z1 / lim:4.2f}x"
    )
    zr, ar = zlink_round_trip(rt, cores), asyncio_round_trip(rt)
    print(
        f"request round trip    zlink p50 {pct(zr, 0.5):6.1f} us p99 {pct(zr, 0.99):7.1f} us | "
        f"asyncio p50 {pct(ar, 0.5):6.1f} us p99 {pct(ar, 0.99):7.1f} us | "
        f"p50 zlink/asyncio {pct(zr, 0.5) / pct(ar, 0.5):4.2f}"
    )
    zf = zlink_fanout(spots, 10, cores)
    print(
        f"fan-out {spots:,} Spots     zlink {zf['rate']:>10,.0f} msg/s on {zf['threads']} threads "
        f"({zf['rss_per_spot']:,.0f} B RSS per idle Spot, {zf['peak_rss_mb']:,.0f} MB RSS)"
    )
    reps = 1 if args.quick else 3  # best of 3, interleaved: the machine is shared
    t_one = t_all = float("inf")
    for _ in range(reps):
        t_one = min(t_one, cpu_bound(1, cpu_n, cpu_size))
        t_all = min(t_all, cpu_bound(cores, cpu_n, cpu_size))
    print(
        f"CPU-bound, 4 PerActor Actors   1 worker {t_one:6.2f} s | {cores} workers "
        f"{t_all:6.2f} s | speedup {t_one / t_all:4.2f}x (best of {reps} each)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
