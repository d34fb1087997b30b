"""Core benchmark: ZLink beside a ThreadPoolExecutor+lock baseline and Pykka, in one run.

    python -m bench.core            # full run (about a minute)
    python -m bench.core --quick    # seconds; CI runs this to check the script still works

Workloads (issues 2 and 5): one-way throughput to one Spot from another thread (one message
instance sent again and again, and a new message per send); the batch send path
(``send_many_to_spot``, 100 per call); request round trip
(p50/p99) from a plain thread; fan-out over 10,000 Spots (throughput, threads, RSS per Spot).
Every number is measured in this process run; ratios compare ZLink with each peer.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

import zlink


class Tick(zlink.Message, type_name="bench.tick"):
    n: int = 0


class Ping(zlink.Request[int], type_name="bench.ping"):
    n: int = 0


def build_app(done: threading.Event, expect: list[int]) -> zlink.App:
    app = zlink.App("bench")

    @app.user_spot("bench.counter")
    class Counter(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.count = 0

        @zlink.handler
        def tick(self, msg: Tick) -> None:
            self.count += 1
            if self.count == expect[0]:
                done.set()

        @zlink.handler
        def ping(self, req: Ping) -> int:
            return req.n

    return app


class Shared:
    """Fan-out completion: counts handled messages across many Spots (lock: rare contention)."""

    def __init__(self, target: int) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.target = target
        self.done = threading.Event()

    def hit(self) -> None:
        with self.lock:
            self.count += 1
            if self.count == self.target:
                self.done.set()


def build_fanout_app(shared: Shared) -> zlink.App:
    app = zlink.App("fanout")

    @app.user_spot("bench.cell")
    class Cell(zlink.UserSpot):
        __slots__ = ()

        @zlink.handler
        def tick(self, msg: Tick) -> None:
            shared.hit()

    return app


# -- ZLink ---------------------------------------------------------------------------------
def zlink_one_way(n: int, workers: int, fresh: bool = False) -> float:
    """One-way sends to one Spot: one message instance again and again, or (``fresh``) a new
    message per send (validated and sized each time)."""
    done, expect = threading.Event(), [n]
    with zlink.Node(build_app(done, expect), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        client.spots.get_or_create("c", "bench.counter").wait(10)
        msg = Tick()
        send = client.send_to_spot
        t0 = time.perf_counter()
        sent = 0
        while sent < n:
            try:
                send("c", Tick(n=sent) if fresh else msg).submit()
                sent += 1
            except zlink.ResourceExhausted:  # the lane is full: the producer outran the Spot
                time.sleep(0)  # let the worker drain; counted in the elapsed time
        assert done.wait(120)
        return n / (time.perf_counter() - t0)


def zlink_batch(n: int, workers: int, size: int = 100) -> float:
    """The batch send path: ``send_many_to_spot`` with ``size`` messages per call."""
    done, expect = threading.Event(), [n]
    with zlink.Node(build_app(done, expect), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        client.spots.get_or_create("c", "bench.counter").wait(10)
        batch = [Tick() for _ in range(size)]
        send_many = client.send_many_to_spot
        t0 = time.perf_counter()
        sent = 0
        while sent < n:
            try:
                send_many("c", batch).submit()
                sent += size
            except zlink.ResourceExhausted:  # all or none: wait for room, send it again
                time.sleep(0)
        assert done.wait(120)
        return n / (time.perf_counter() - t0)


def zlink_idle_bytes(spots: int, workers: int) -> float:
    """Bytes per idle Spot by ``tracemalloc``: Spots made and sent one message (their queues
    were used once), then idle. What the allocator's arenas do to RSS is left out."""
    import tracemalloc

    done, expect = threading.Event(), [-1]
    with zlink.Node(build_app(done, expect), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        client.spots.get_or_create("warm", "bench.counter").wait(10)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for i in range(spots):
            client.spots.get_or_create(f"m{i}", "bench.counter").wait(10)
            client.send_to_spot(f"m{i}", Tick()).submit()
        assert node.wait_idle(60)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
        return grown / spots


def zlink_round_trip(n: int, workers: int) -> list[float]:
    done, expect = threading.Event(), [-1]
    with zlink.Node(build_app(done, expect), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        client.spots.get_or_create("c", "bench.counter").wait(10)
        req = Ping(n=1)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            client.request_to_spot("c", req).wait(10)
            samples.append(time.perf_counter() - t0)
        return samples


def zlink_fanout(spots: int, per_spot: int, workers: int) -> dict[str, float]:
    shared = Shared(spots * per_spot)
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    with zlink.Node(build_fanout_app(shared), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        for i in range(0, spots, 100):
            batch = [
                client.spots.get_or_create(f"s{j}", "bench.cell").future()
                for j in range(i, min(i + 100, spots))
            ]
            for f in batch:
                f.result(30)
        node.wait_idle(30)
        gc.collect()
        rss_idle = proc.memory_info().rss
        threads = proc.num_threads()  # the OS's count: every thread of the process
        msg = Tick()
        ids = [f"s{j}" for j in range(spots)]
        t0 = time.perf_counter()
        for _ in range(per_spot):
            for sid in ids:
                client.send_to_spot(sid, msg).submit()
        assert shared.done.wait(120)
        rate = spots * per_spot / (time.perf_counter() - t0)
        peak = max(proc.memory_info().rss, rss_idle)
    return {
        "rate": rate, "threads": threads, "rss_per_spot": (rss_idle - rss0) / spots,
        "peak_rss_mb": peak / 2**20,
    }  # fmt: skip


# -- ThreadPoolExecutor + lock --------------------------------------------------------------
class LockedCounter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def tick(self, done: threading.Event, expect: int) -> None:
        with self.lock:
            self.count += 1
            if self.count == expect:
                done.set()

    def ping(self, n: int) -> int:
        with self.lock:
            return n


def tpe_one_way(n: int, workers: int) -> float:
    obj, done = LockedCounter(), threading.Event()
    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        for _ in range(n):
            pool.submit(obj.tick, done, n)
        assert done.wait(120)
        return n / (time.perf_counter() - t0)


def tpe_round_trip(n: int, workers: int) -> list[float]:
    obj = LockedCounter()
    samples = []
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(n):
            t0 = time.perf_counter()
            pool.submit(obj.ping, 1).result(10)
            samples.append(time.perf_counter() - t0)
    return samples


def tpe_fanout(spots: int, per_spot: int, workers: int) -> dict[str, float]:
    shared = Shared(spots * per_spot)
    objs = [LockedCounter() for _ in range(spots)]

    def tick(obj: LockedCounter) -> None:
        with obj.lock:
            obj.count += 1
        shared.hit()

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        for _ in range(per_spot):
            for obj in objs:
                pool.submit(tick, obj)
        assert shared.done.wait(120)
        rate = spots * per_spot / (time.perf_counter() - t0)
        threads = threading.active_count()
    return {"rate": rate, "threads": threads, "rss_per_spot": float("nan")}


# -- Pykka (optional) -----------------------------------------------------------------------
def pykka_available() -> bool:
    try:
        import pykka  # noqa: F401
    except ImportError:
        return False
    return True


def pykka_counter(n: int, done: threading.Event) -> Any:
    """A Pykka actor class that counts what it receives and sets ``done`` at ``n``."""
    import pykka

    class Counter(pykka.ThreadingActor):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def on_receive(self, message: Any) -> Any:
            self.count += 1
            if self.count == n:
                done.set()

    return Counter


def pykka_one_way(n: int, fresh: bool = False) -> float:
    """Pykka ``tell`` of one dict again and again, or (``fresh``) a new dict per send."""
    done = threading.Event()
    ref = pykka_counter(n, done).start()
    try:
        msg = {"n": 0}
        t0 = time.perf_counter()
        for i in range(n):
            ref.tell({"n": i} if fresh else msg)
        assert done.wait(120)
        return n / (time.perf_counter() - t0)
    finally:
        ref.stop()


def pykka_round_trip(n: int) -> list[float]:
    import pykka

    class Echo(pykka.ThreadingActor):  # type: ignore[misc]
        def on_receive(self, message: Any) -> Any:
            return message

    ref = Echo.start()
    samples = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            ref.ask(1, timeout=10)
            samples.append(time.perf_counter() - t0)
    finally:
        ref.stop()
    return samples


# -- report ---------------------------------------------------------------------------------
def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


def interleaved(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each contender's rate in each round; within a round they run one after the other."""
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            out[name].append(fn())
    return out


def median_ratio(rounds: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s rate over ``b``'s in the same round."""
    return statistics.median(x / y for x, y in zip(rounds[a], rounds[b], strict=True))


def cpu_set(text: str) -> set[int]:
    """``--cpus``: CPU numbers separated by commas, e.g. ``0`` or ``0,1``."""
    try:
        cpus = {int(c) for c in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"CPU numbers separated by commas, not {text!r}") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"CPU numbers are 0 or more, not {text!r}")
    return cpus


def pin(cpus: set[int]) -> None:
    """Keep this process (every thread it starts) on ``cpus``; Linux only.

    The threaded rates depend on how the OS hands a producer and a worker over: with the
    GIL only one runs at a time, and on one CPU the hand-over is cheaper, for both runtimes.
    """
    if not hasattr(os, "sched_setaffinity"):
        raise SystemExit("--cpus needs os.sched_setaffinity (Linux)")
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise SystemExit(f"--cpus {sorted(cpus)}: {exc.strerror}") from None


def layout() -> str:
    """The CPUs this process may run on, as printed in the header."""
    if not hasattr(os, "sched_getaffinity"):
        return "any"
    return ",".join(map(str, sorted(os.sched_getaffinity(0))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--workers", type=int, default=psutil.cpu_count() or 1)
    parser.add_argument(
        "--cpus", type=cpu_set, default=None,
        help="run on these CPUs only, e.g. 0 or 0,1 (Linux): the thread layout, stated",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.cpus is not None:
        pin(args.cpus)
    n_one, n_rt, spots, per, reps = (
        (2_000, 200, 500, 2, 1) if args.quick else (200_000, 5_000, 10_000, 10, 5)
    )
    w = args.workers
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(
        f"# Python {sys.version.split()[0]} GIL={'on' if gil else 'off'} workers={w} "
        f"cores={psutil.cpu_count()} cpus={layout()}"
    )

    # Throughput: every round runs each contender once, one after the other, so a machine
    # that speeds up or slows down mid-run moves them together; the best round of each is
    # compared, and so is each round on its own (the median of the per-round ratios).
    has_pykka = pykka_available()
    contenders: dict[str, Callable[[], float]] = {
        "zlink": lambda: zlink_one_way(n_one, w),
        "zlink_new": lambda: zlink_one_way(n_one, w, fresh=True),
        "zlink_batch": lambda: zlink_batch(n_one, w),
        "tpe": lambda: tpe_one_way(n_one, w),
    }
    if has_pykka:
        contenders["pykka"] = lambda: pykka_one_way(n_one)
        contenders["pykka_new"] = lambda: pykka_one_way(n_one, fresh=True)
    rounds = interleaved(contenders, reps)
    z1, t1 = max(rounds["zlink"]), max(rounds["tpe"])

    def against_pykka(name: str, pykka: str, label: str = "zlink/pykka", rate: bool = True) -> str:
        """``name``'s best round over Pykka's (``pykka``), and the median per-round ratio."""
        if not has_pykka:
            return ""
        best, base = max(rounds[name]), max(rounds[pykka])
        shown = f" | pykka tell {base:>10,.0f} msg/s" if rate else ""
        return (
            f"{shown} | {label} {best / base:5.2f}x "
            f"(per round: median {median_ratio(rounds, name, pykka):4.2f}x)"
        )

    print(
        f"one-way to one Spot   zlink {z1:>10,.0f} msg/s | tpe+lock {t1:>10,.0f} msg/s "
        f"| zlink/tpe {z1 / t1:5.2f}x" + against_pykka("zlink", "pykka")
    )
    zn = max(rounds["zlink_new"])
    print(
        f"one-way, new message  zlink {zn:>10,.0f} msg/s" + against_pykka("zlink_new", "pykka_new")
    )
    zb = max(rounds["zlink_batch"])
    print(
        f"batch of 100 (many)   zlink {zb:>10,.0f} msg/s | zlink/one-way {zb / z1:5.2f}x"
        + against_pykka("zlink_batch", "pykka", "zlink batch/pykka tell", rate=False)
    )

    zr, tr = zlink_round_trip(n_rt, w), tpe_round_trip(n_rt, w)
    print(
        f"request round trip    zlink p50 {pct(zr, 0.5):6.1f} us p99 {pct(zr, 0.99):7.1f} us | "
        f"tpe+lock p50 {pct(tr, 0.5):6.1f} us p99 {pct(tr, 0.99):7.1f} us | "
        f"p50 zlink/tpe {pct(zr, 0.5) / pct(tr, 0.5):4.2f}",
        end="",
    )
    if pykka_available():
        pr = pykka_round_trip(n_rt)
        print(
            f" | pykka ask p50 {pct(pr, 0.5):6.1f} us p99 {pct(pr, 0.99):7.1f} us | "
            f"p50 zlink/pykka {pct(zr, 0.5) / pct(pr, 0.5):4.2f}",
            end="",
        )
    print()

    zf, tf = zlink_fanout(spots, per, w), tpe_fanout(spots, per, w)
    print(
        f"fan-out {spots:,} Spots    zlink {zf['rate']:>10,.0f} msg/s on {zf['threads']} threads "
        f"({zf['rss_per_spot']:,.0f} B RSS per idle Spot, {zf['peak_rss_mb']:,.0f} MB RSS) "
        f"| tpe+lock {tf['rate']:>10,.0f} msg/s "
        f"| zlink/tpe {zf['rate'] / tf['rate']:5.2f}x"
    )
    idle = zlink_idle_bytes(500 if args.quick else 5_000, w)
    print(f"idle Spot memory      {idle:,.0f} B per Spot by tracemalloc (target < 2,048 B)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
