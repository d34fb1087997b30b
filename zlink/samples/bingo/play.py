"""Drive Bingo games on one or several embedded nodes and summarise them (``zlink bingo play``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zlink
from zlink.testing import LocalCluster, ManualClock

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
    nodes: int = 1
    moves: int = 0  # rooms moved between nodes while playing
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
    nodes: int = 1,
    draw_interval: float = 0.005,
    move_every: int = 1,
    workers: int | None = None,
    clock: ManualClock | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 120.0,
) -> Summary:
    """Play one game in each of ``rooms`` rooms with ``players`` players each.

    With ``nodes`` > 1 the rooms start spread over the nodes of a ``LocalCluster`` (players
    are made on other nodes and join across nodes), and while the games run
    the driver moves one room to the next node every ``move_every`` rounds, players, queues
    and draw timer included. With a ``ManualClock`` the driver moves time itself, one draw
    interval per round; otherwise a round is about 10 ms (50 ms on one node).
    """
    if rooms < 1 or players < 1 or nodes < 1:
        raise zlink.InvalidArgument("rooms, players and nodes must each be at least 1")
    if players > bingo.MAX_PLAYERS:  # the rest would be refused and the game never start
        raise zlink.InvalidArgument(f"a room seats at most {bingo.MAX_PLAYERS} players")
    tally = _Tally()
    bingo._observers[:] = [tally]
    started = time.perf_counter()
    cluster = LocalCluster(bingo.app, nodes=nodes, clock=clock, workers=workers)
    with cluster:
        bingo.use_clock(cluster.node(0).clock.now)
        room_ids = [f"room-{i}" for i in range(rooms)]
        home = {r: i % nodes for i, r in enumerate(room_ids)}
        for room_id in room_ids:
            cluster.node(home[room_id]).client().spots.get_or_create(room_id, "bingo.room").wait(
                timeout
            )
        actor_ids = _join_players(cluster, room_ids, home, players, timeout)
        if not tally.wait("joined", len(actor_ids), timeout):
            raise zlink.DeadlineExceeded("players did not all join in time")
        client = cluster.node(0).client()
        for room_id in room_ids:
            client.send_to_spot(room_id, StartGame(draw_interval=draw_interval)).submit()
        deadline = time.monotonic() + timeout
        rounds = moves = 0
        pause = 0.0 if clock else 0.05 if nodes == 1 else 0.01
        while not tally.wait("win", rooms, pause):
            rounds += 1
            if clock is not None:
                clock.advance(draw_interval)
                cluster.wait_idle(timeout)
            if nodes > 1 and rounds % move_every == 0:
                moves += _move_one(cluster, room_ids, home, rounds // move_every, timeout)
            if progress is not None:
                progress(tally.counts.get("win", 0), rooms)
            if time.monotonic() > deadline:
                raise zlink.DeadlineExceeded("the games did not finish in time")
        if progress is not None:
            progress(rooms, rooms)
        summaries: list[RoomSummary] = [
            client.request_to_spot(r, RoomState()).wait(timeout) for r in room_ids
        ]
        cluster.wait_idle(timeout)
        counters: dict[str, int] = {}
        for node in cluster.nodes:
            for key, value in node.counters().items():
                counters[key] = counters.get(key, 0) + value
        used = sum(node.workers for node in cluster.nodes)
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
        nodes=nodes,
        moves=moves,
        counters=counters,
    )


def _join_players(
    cluster: LocalCluster, room_ids: list[str], home: dict[str, int], players: int, timeout: float
) -> list[str]:
    """Make the players on every node in turn and send them in; a player whose room is on
    another node joins across nodes (it moves there)."""
    actor_ids: list[str] = []
    for k, room_id in enumerate(room_ids):
        client = cluster.node((home[room_id] + k) % len(cluster.nodes)).client()
        # all at once: creates past the lobby's lifecycle lane (128) wait for room (§9)
        made = [client.actors.create("bingo.player").future() for _ in range(players)]
        ids = [f.result(timeout).actor_id for f in made]
        for actor_id in ids:
            client.send_to_actor(actor_id, EnterRoom(room_id=room_id)).wait(timeout)
        actor_ids += ids
    return actor_ids


def _move_one(
    cluster: LocalCluster, room_ids: list[str], home: dict[str, int], turn: int, timeout: float
) -> int:
    """Move one room (taking turns) to the next node; 1 if it moved, 0 if it could not now
    (a barrier that meets a Yield in flight, say: the room stays and plays on)."""
    room_id = room_ids[turn % len(room_ids)]
    source = home[room_id]
    target = (source + 1) % len(cluster.nodes)
    try:
        cluster.node(source).relocate_spot(room_id, cluster.node(target).node_id, timeout)
    except zlink.Unavailable:
        return 0
    home[room_id] = target
    return 1
