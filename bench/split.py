"""Per-message CPU, sending apart from handling, ZLink beside Pykka, in one thread.

    python -m bench.split            # 25 interleaved rounds of 1,000 messages each
    python -m bench.split --quick    # seconds; CI runs this to check the script still works

The throughput runs of ``bench.core`` put a producer thread and a worker on the machine at
once. Their rate then also depends on how the OS and the GIL hand the two threads over, and
Pykka's rate in particular moves by 3x from one run to the next (1 core or 2, a long switch
interval or a short one). This benchmark takes that part out and measures what each runtime
does per message:

* sending: 1,000 one-way sends into a queue nobody drains yet (ZLink: the Spot's gate is held,
  as a worker holding it would; Pykka: an actor that was not started);
* handling: draining those 1,000 on this thread (ZLink: the gate's own loop; Pykka: its
  actor loop's ``get`` and ``_handle_receive``);

for ZLink's ``send_to_spot(...).submit()``, its batch path (``send_many_to_spot``, 100 per call)
and Pykka's ``tell``, round after round, keeping the best round of each (the least disturbed
by the machine). It reaches into ZLink's internals (the gate's flag and loop) to hold and then
run the gate on this thread; it measures, it does not test.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import zlink

from .core import Tick, build_app, pykka_available, pykka_counter
from .floor import floor_side

N = 1_000  # messages per round: the lane holds 1,024


def zlink_side() -> tuple[Callable[[], float], Callable[[], float], Callable[[], float], Any]:
    """(send 1,000, batch-send 1,000, handle what was sent), each returning seconds; and the
    node, to close."""
    node = zlink.Node(build_app(threading.Event(), [-1]), zlink.NodeConfig(workers=1))
    node.start()
    client = node.client()
    client.spots.get_or_create("c", "bench.counter").wait(10)
    assert node.wait_idle(10)
    gate = node._rt.spots["c"].owner.gate  # the instrumented part: hold, then run, the gate
    msg, batch = Tick(), [Tick() for _ in range(100)]
    send, send_many = client.send_to_spot, client.send_many_to_spot

    def hold() -> None:
        while not gate._flag.acquire(False):  # a worker may still be letting go of it
            time.sleep(0.001)

    def sending() -> float:
        hold()
        t0 = time.perf_counter()
        for _ in range(N):
            send("c", msg).submit()
        return time.perf_counter() - t0

    def batch_sending() -> float:
        hold()
        t0 = time.perf_counter()
        for _ in range(N // 100):
            send_many("c", batch).submit()
        return time.perf_counter() - t0

    def handling() -> float:
        t0 = time.perf_counter()
        gate._run_batch()  # drains the ring and lets the gate go, as a worker would
        return time.perf_counter() - t0

    return sending, batch_sending, handling, node


def pykka_side() -> tuple[Callable[[], float], Callable[[], float], Any]:
    actor = pykka_counter(-1, threading.Event())()  # not started: this thread drains its inbox
    ref, inbox, stopped = actor.actor_ref, actor.actor_inbox, actor.actor_stopped
    msg = {"n": 0}

    def sending() -> float:
        t0 = time.perf_counter()
        for _ in range(N):
            ref.tell(msg)
        return time.perf_counter() - t0

    def handling() -> float:  # the body of Pykka's actor loop, message by message
        get, handle = inbox.get, actor._handle_receive
        t0 = time.perf_counter()
        for _ in range(N):
            if stopped.is_set():
                break
            envelope = get()
            handle(envelope.message)
        return time.perf_counter() - t0

    return sending, handling, actor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds: checks it runs")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    print(f"# Python {sys.version.split()[0]} GIL={'on' if _gil() else 'off'} rounds={rounds}")
    z_send, z_batch, z_handle, node = zlink_side()
    p = pykka_side() if pykka_available() else None
    act = node._rt.spots["c"]  # the floor calls the same handler on the same instance
    floor = floor_side(Tick(), [Tick() for _ in range(100)], act.spec.handlers[Tick].fn,
                       act.instance)  # fmt: skip
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    try:
        for _ in range(rounds):
            if p is not None:
                keep("pykka send", p[0]())
                keep("pykka handle", p[1]())
            keep("zlink send", z_send())
            keep("zlink handle", z_handle())
            keep("zlink batch send", z_batch())
            keep("zlink batch handle", z_handle())
            for name, timed in floor.items():
                keep(f"floor {name}", timed())
    finally:
        node.shutdown()
    us = {k: v / N * 1e6 for k, v in best.items()}

    def line(label: str, key: str) -> float:
        send, handle = us[f"{key} send"], us[f"{key} handle"]
        print(f"{label:17s} send {send:5.2f} us  handle {handle:5.2f} us  "
              f"total {send + handle:5.2f} us per message")  # fmt: skip
        return send + handle

    one, many = line("zlink one-way", "zlink"), line("zlink batch", "zlink batch")
    floors = [line(f"floor {k}", f"floor {k}") for k in ("contract", "api", "batch")]
    if p is not None:
        pk = line("pykka tell", "pykka")
        print(f"CPU per message, pykka / zlink: one-way {pk / one:4.2f}x  batch {pk / many:4.2f}x")
        print("CPU per message, pykka / floor (the most any Python code of the contract could "
              f"reach): one-way {pk / floors[0]:4.2f}x, through the API {pk / floors[1]:4.2f}x  "
              f"batch {pk / floors[2]:4.2f}x")  # fmt: skip
    return 0


def _gil() -> bool:
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


if __name__ == "__main__":
    raise SystemExit(main())
