"""Chains of messages: a two-Spot ping-pong and a token passed round a ring of Spots, beside
Pykka, with 2 workers and with 1 (issue "Performance", target 5).

    python -m bench.chains            # full run
    python -m bench.chains --quick    # seconds; checks it runs

Each hop is a handler that sends one message on (``send_to_spot(...).submit()`` from inside a
turn; Pykka: ``tell`` from inside ``on_receive``), so every hop makes the next Spot ready while
the current turn runs. That is where a scheduler that runs the woken Spot next on the same
worker (a LIFO slot) saves a hand-over to another thread. Rates are hops per second; every
round runs each contender once (interleaved), and the median per-round ratio is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

import zlink

from .core import cpu_set, layout, pin, pykka_available


class Token(zlink.Message, type_name="bench.chains.token"):
    left: int


def build_app(done: threading.Event) -> zlink.App:
    app = zlink.App("chains")

    @app.user_spot("bench.hop")
    class Hop(zlink.UserSpot):
        """Passes the token to ``next`` (read from its id: ``name/i/n``) until it is spent."""

        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            prefix, i, n = context.spot_id.rsplit("/", 2)
            self.next = f"{prefix}/{(int(i) + 1) % int(n)}/{n}"

        @zlink.handler
        def token(self, msg: Token) -> None:
            if msg.left == 0:
                done.set()
                return
            self.context.outbound.send_to_spot(self.next, Token(left=msg.left - 1)).submit()

    return app


def zlink_chain(spots: int, hops: int, workers: int) -> float:
    """Hops per second round a ring of ``spots`` Spots (2: a ping-pong)."""
    done = threading.Event()
    with zlink.Node(build_app(done), zlink.NodeConfig(workers=workers)) as node:
        client = node.client()
        ids = [f"ring/{i}/{spots}" for i in range(spots)]
        for spot_id in ids:
            client.spots.get_or_create(spot_id, "bench.hop").wait(10)
        t0 = time.perf_counter()
        client.send_to_spot(ids[0], Token(left=hops)).submit()
        assert done.wait(120), "the token did not come round"
        return hops / (time.perf_counter() - t0)


def pykka_chain(spots: int, hops: int) -> float:
    import pykka

    done = threading.Event()

    class Hop(pykka.ThreadingActor):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.next: Any = None

        def on_receive(self, message: Any) -> None:
            if "next" in message:
                self.next = message["next"]
                return
            left = message["left"]
            if left == 0:
                done.set()
                return
            self.next.tell({"left": left - 1})

    refs = [Hop.start() for _ in range(spots)]
    try:
        for i, ref in enumerate(refs):
            ref.ask({"next": refs[(i + 1) % spots]}, timeout=10)
        t0 = time.perf_counter()
        refs[0].tell({"left": hops})
        assert done.wait(120), "the token did not come round"
        return hops / (time.perf_counter() - t0)
    finally:
        for ref in refs:
            ref.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--workers", type=int, default=psutil.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cpus", type=cpu_set, default=None,
        help="run on these CPUs only, e.g. 0 or 0,1 (Linux): the thread layout, stated",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.cpus is not None:
        pin(args.cpus)
    hops, rounds = (500, 1) if args.quick else (40_000, args.rounds)
    w = args.workers
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(
        f"# Python {sys.version.split()[0]} GIL={'on' if gil else 'off'} workers={w} "
        f"cores={psutil.cpu_count()} cpus={layout()} load={psutil.getloadavg()[0]:.2f}"
    )
    has_pykka = pykka_available()
    for label, spots in (("ping-pong (2 Spots)", 2), ("ring of 100 Spots", 100)):
        contenders: dict[str, Callable[[], float]] = {
            "zlink": lambda s=spots: zlink_chain(s, hops, w),  # type: ignore[misc]
            "zlink_1": lambda s=spots: zlink_chain(s, hops, 1),  # type: ignore[misc]
        }
        if has_pykka:
            contenders["pykka"] = lambda s=spots: pykka_chain(s, hops)  # type: ignore[misc]
        out: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                out[name].append(fn())

        def ratio(a: str, b: str, out: dict[str, list[float]] = out) -> float:
            return statistics.median(x / y for x, y in zip(out[a], out[b], strict=True))

        line = (
            f"{label:20s} zlink {statistics.median(out['zlink']):>9,.0f} hops/s "
            f"| 1 worker {statistics.median(out['zlink_1']):>9,.0f} hops/s "
            f"| {w} workers/1 worker {ratio('zlink', 'zlink_1'):4.2f}x"
        )
        if has_pykka:
            line += (
                f" | pykka {statistics.median(out['pykka']):>9,.0f} hops/s "
                f"| zlink/pykka median {ratio('zlink', 'pykka'):4.2f}x"
            )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
