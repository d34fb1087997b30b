"""Bingo on a mesh of node processes, driven by a client (python-api §10).

``zlink bingo play --nodes 3 --processes`` starts ``nodes`` node processes on 127.0.0.1
(``python -m zlink.samples.bingo.processes --serve ...``), sharing a SQLite Location Store in a
fresh temporary folder. The driver, this process, is no node at all: it reaches every node with
``zlink.connect``, makes the rooms on the nodes in turn and each room's players on the next
node (so they join across processes), starts the games and asks the rooms how they stand until
every game is over. Meanwhile each node process moves one of the rooms it owns to the next node
every ``move_interval`` seconds, players, queues and draw timer included, until the driver
closes its stdin; then it prints how many rooms it moved and its counters, and stops.

Guarantees / assumes: every process this starts is stopped before ``play_processes`` returns
(killed if it does not stop in time), also when a game fails; every wait is bounded by
``timeout``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zlink

from .messages import EnterRoom, RoomState, RoomSummary, StartGame
from .spots import MAX_PLAYERS, app


@dataclass
class ProcessSummary:
    """What a game on node processes did."""

    rooms: int
    players: int
    games: int
    winners: dict[str, str]
    drawn: int
    moves: int
    seconds: float
    nodes: int
    counters: dict[str, int] = field(default_factory=dict)


def play_processes(
    rooms: int = 4,
    players: int = 8,
    *,
    nodes: int = 3,
    draw_interval: float = 0.005,
    move_interval: float = 0.05,
    workers: int | None = None,
    timeout: float = 120.0,
) -> ProcessSummary:
    """Play one game in each of ``rooms`` rooms of ``players`` players on ``nodes`` node
    processes (see the module docstring)."""
    if rooms < 1 or players < 1 or nodes < 1:
        raise zlink.InvalidArgument("rooms, players and nodes must each be at least 1")
    if players > MAX_PLAYERS:
        raise zlink.InvalidArgument(f"a room seats at most {MAX_PLAYERS} players")
    started = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="zlink-bingo-")
    store = f"sqlite:///{folder}/mesh.db"
    procs: list[Any] = []  # subprocess.Popen[str], each with pipes
    clients: list[Any] = []
    reports: list[dict[str, Any]] = []
    try:
        addresses = []
        for i in range(1, nodes + 1):
            proc = _start(f"bingo-{i}", store, move_interval, workers)
            procs.append(proc)
        for proc in procs:
            addresses.append(_ready(proc, timeout))
        clients = [zlink.connect(address, timeout=timeout) for address in addresses]
        room_ids = [f"room-{i}" for i in range(rooms)]
        for i, room_id in enumerate(room_ids):
            clients[i % nodes].spots.get_or_create(room_id, "bingo.room").wait(timeout)
        actors = 0
        for i, room_id in enumerate(room_ids):
            client = clients[(i + 1) % nodes]  # the players join from another process
            made = [client.actors.create("bingo.player").future() for _ in range(players)]
            for future in made:
                actor_id = future.result(timeout).actor_id
                client.send_to_actor(actor_id, EnterRoom(room_id=room_id)).wait(timeout)
                actors += 1
        end = time.monotonic() + timeout
        _until(lambda: all(s.players == players for s in _states(clients[0], room_ids, timeout)),
               end, "the players did not all join in time")  # fmt: skip
        for room_id in room_ids:
            clients[0].send_to_spot(room_id, StartGame(draw_interval=draw_interval)).wait(timeout)
        for proc in procs:  # the games are on: from now on each node moves its rooms
            proc.stdin.write("move\n")
            proc.stdin.flush()
        summaries: list[RoomSummary] = []

        def finished() -> bool:
            summaries[:] = _states(clients[0], room_ids, timeout)
            return all(s.finished for s in summaries)

        _until(finished, end, "the games did not finish in time")
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        try:
            for proc in procs:
                reports.append(_stop(proc))
        finally:  # the store of this game only (a probe found one folder left per run)
            shutil.rmtree(folder, ignore_errors=True)
    counters: dict[str, int] = {}
    for report in reports:
        for key, value in report.get("counters", {}).items():
            counters[key] = counters.get(key, 0) + value
    return ProcessSummary(
        rooms=rooms,
        players=actors,
        games=sum(1 for s in summaries if s.finished),
        winners={s.room_id: s.winner for s in summaries if s.winner},
        drawn=sum(s.drawn for s in summaries),
        moves=sum(int(r.get("moves", 0)) for r in reports),
        seconds=time.perf_counter() - started,
        nodes=nodes,
        counters=counters,
    )


def _states(client: Any, room_ids: list[str], timeout: float) -> list[RoomSummary]:
    futures = [client.request_to_spot(r, RoomState()).timeout(timeout).future() for r in room_ids]
    return [f.result(timeout) for f in futures]


def _until(check: Any, end: float, failure: str) -> None:
    pause = threading.Event()
    while not check():
        if time.monotonic() > end:
            raise zlink.DeadlineExceeded(failure)
        pause.wait(0.02)  # asking rooms in other processes: there is nothing to wait on


def _start(node_id: str, store: str, move_interval: float, workers: int | None) -> Any:
    args = [sys.executable, "-m", "zlink.samples.bingo.processes", "--serve", "--node-id",
            node_id, "--store", store, "--move-interval", str(move_interval)]  # fmt: skip
    if workers is not None:
        args += ["--workers", str(workers)]
    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))  # fmt: skip
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _ready(proc: Any, timeout: float) -> str:
    """The address a node process prints once it serves."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    line = box[0] if box else ""
    if not line.startswith("ready "):
        raise zlink.Unavailable(f"a node process did not start: {line!r}")
    return line.split()[1]


def _stop(proc: Any) -> dict[str, Any]:
    """Close its stdin (it stops) and read its report; kill it if it does not stop."""
    report: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    for line in proc.stdout.read().splitlines():  # it ended: its output is all there
        if line.startswith("{"):
            report = json.loads(line)
    proc.stdout.close()
    return report


# -- a node process ------------------------------------------------------------------------------
def serve(node_id: str, store: str, move_interval: float, workers: int | None) -> None:
    """One Bingo node: serve until stdin closes, moving one of its rooms to the next node
    every ``move_interval`` seconds; then print a JSON report and stop."""
    config = zlink.NodeConfig(
        node_id=node_id, listen="tcp://127.0.0.1:0", store=store, workers=workers,
        shutdown_timeout=5.0,
    )  # fmt: skip
    node = zlink.Node(app, config).start()
    stop = threading.Event()
    moves = [0]

    def mover() -> None:
        turn = 0
        while not stop.wait(move_interval):
            owned = sorted(o.owner for o in node.status().owners if o.type == "bingo.room")
            others = node.peers()
            if not owned or not others:
                continue
            turn += 1
            try:
                node.relocate_spot(owned[turn % len(owned)], others[turn % len(others)], 5.0)
                moves[0] += 1
            except zlink.ZLinkError:  # a barrier that met a Yield, a peer that left: next time
                continue

    thread = threading.Thread(target=mover, name="bingo-mover", daemon=True)
    print(f"ready {node.address}", flush=True)
    for line in sys.stdin:  # until the driver closes it
        if line.strip() == "move" and not thread.is_alive():
            thread.start()  # the games are on: rooms move while they play
    stop.set()
    if thread.is_alive():
        thread.join(10)
    counters = node.counters()
    node.shutdown()
    print(json.dumps({"node": node_id, "moves": moves[0], "counters": counters}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a Bingo node process")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--move-interval", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    serve(args.node_id, args.store, args.move_interval, args.workers)


if __name__ == "__main__":
    main()
