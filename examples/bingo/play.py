"""Drive Bingo games on an embedded node and summarise them (``zlink bingo play``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zlink
from zlink.testing import ManualClock

from . import spots as bingo
from .messages import EnterRoom, RoomState, RoomSummary, StartGame


@dataclass
class Summary:
    """What a run of games did."""

    rooms: int
    players: int
    games: int
    winners: dict[str, str]
    marks: int
    messages: int
    p50_ms: float
    p99_ms: float
    seconds: float
    workers: int
    counters: dict[str, int] = field(default_factory=dict)


class _Tally:
    """Counts the sample's events; the driver waits on it (a condition, never a sleep)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.counts: dict[str, int] = {}
        self.latencies: list[float] = []

    def __call__(self, event: str, value: float) -> None:
        with self.cond:
            self.counts[event] = self.counts.get(event, 0) + 1
            if event == "mark":
                self.latencies.append(value)
            self.cond.notify_all()

    def wait(self, event: str, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.counts.get(event, 0) >= n, timeout)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def play(
    rooms: int = 4,
    players: int = 8,
    *,
    draw_interval: float = 0.005,
    workers: int | None = None,
    clock: ManualClock | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 120.0,
) -> Summary:
    """Play one game in each of ``rooms`` rooms with ``players`` players each.

    With a ``ManualClock`` the driver moves time itself, one draw interval at a time.
    """
    if rooms < 1 or players < 1:
        raise zlink.InvalidArgument("rooms and players must each be at least 1")
    tally = _Tally()
    bingo._observers[:] = [tally]
    started = time.perf_counter()
    config = zlink.NodeConfig(node_id="bingo-1", workers=workers)
    with zlink.Node(bingo.app, config, clock=clock) as node:
        bingo.use_clock(node.clock.now)
        client = node.client()
        room_ids = [f"room-{i}" for i in range(rooms)]
        for room_id in room_ids:
            client.spots.get_or_create(room_id, "bingo.room").wait(timeout)
        actor_ids: list[str] = []
        for _ in range(0, rooms * players, 100):  # the lobby's lifecycle lane admits 128
            n = min(100, rooms * players - len(actor_ids))
            batch = [client.actors.create("bingo.player").future() for _ in range(n)]
            actor_ids += [f.result(timeout).actor_id for f in batch]
        for i, actor_id in enumerate(actor_ids):
            client.send_to_actor(actor_id, EnterRoom(room_id=room_ids[i % rooms])).submit()
        if not tally.wait("joined", len(actor_ids), timeout):
            raise zlink.DeadlineExceeded("players did not all join in time")
        for room_id in room_ids:
            client.send_to_spot(room_id, StartGame(draw_interval=draw_interval)).submit()
        deadline = time.monotonic() + timeout
        while not tally.wait("win", rooms, 0 if clock else 0.05):
            if clock is not None:
                clock.advance(draw_interval)
                node.wait_idle(timeout)
            if progress is not None:
                progress(tally.counts.get("win", 0), rooms)
            if time.monotonic() > deadline:
                raise zlink.DeadlineExceeded("the games did not finish in time")
        if progress is not None:
            progress(rooms, rooms)
        summaries: list[RoomSummary] = [
            client.request_to_spot(r, RoomState()).wait(timeout) for r in room_ids
        ]
        node.wait_idle(timeout)
        counters = node.counters()
        used = node.workers
    marks = tally.counts.get("mark", 0)
    drawn = sum(s.drawn for s in summaries)
    return Summary(
        rooms=rooms,
        players=len(actor_ids),
        games=sum(1 for s in summaries if s.finished),
        winners={s.room_id: s.winner for s in summaries if s.winner},
        marks=marks,
        messages=marks + drawn + len(actor_ids) * 3,
        p50_ms=_pct(tally.latencies, 0.50),
        p99_ms=_pct(tally.latencies, 0.99),
        seconds=time.perf_counter() - started,
        workers=used,
        counters=counters,
    )
