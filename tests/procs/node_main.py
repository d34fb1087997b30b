"""One node process of the mesh tests: ``python -m tests.procs.node_main --node-id n1 ...``.

It prints ``{"ready": ...}`` (its addresses) on stdout, then takes JSON commands on stdin, one
per line, each run on a thread of its own, and answers each with one JSON line
(``{"id": n, "ok": true, "value": ...}`` or ``{"id": n, "ok": false, "error": "Type: ..."}``).
It stops on the ``stop`` command, or when stdin closes (the test went away).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import zlink
from tests.procs.app import (
    RELEASE,
    RELEASE_HOLD,
    RESTORING,
    Bump,
    Enter,
    Follow,
    Gen,
    Heard,
    Hold,
    HoldOne,
    Log,
    Mark,
    News,
    Total,
    Where,
    app,
)

_out = threading.Lock()
_pumps: dict[str, dict[str, Any]] = {}


def _say(obj: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def _pump(node: zlink.Node, name: str, spot: str, senders: int, count: int) -> None:
    """``senders`` threads each ``wait()``-send ``count`` numbered Bumps to ``spot``."""
    state: dict[str, Any] = {"sent": 0, "errors": [], "done": threading.Event()}
    _pumps[name] = state
    client = node.client()
    lock = threading.Lock()

    def one(i: int) -> None:
        sender = f"{node.node_id}-{name}-{i}"
        for seq in range(count):
            try:
                client.send_to_spot(spot, Bump(sender=sender, seq=seq)).wait(30)
            except zlink.ZLinkError as exc:
                with lock:
                    state["errors"].append(f"{sender} {seq}: {type(exc).__name__}: {exc}")
                return
            with lock:
                state["sent"] += 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(senders)]
    for t in threads:
        t.start()

    def finish() -> None:
        for t in threads:
            t.join()
        state["done"].set()

    threading.Thread(target=finish, daemon=True).start()


def _run(node: zlink.Node, cmd: dict[str, Any]) -> Any:
    op = cmd["op"]
    client = node.client()
    rt = node._runtime
    if op == "create":
        result = client.spots.get_or_create(cmd["spot"], cmd["type"]).wait(cmd.get("timeout", 10))
        return {"created": result.created, "generation": result.spot_ref.object_generation}
    if op == "create_many":  # all at once, each a get_or_create: [created, generation] each
        calls = [client.spots.get_or_create(s, cmd["type"]).future() for s in cmd["spots"]]
        made = [f.result(30) for f in calls]
        return [[m.created, m.spot_ref.object_generation] for m in made]
    if op == "log":
        return client.request_to_spot(cmd["spot"], Log()).timeout(10).wait(15)
    if op == "total":
        return client.request_to_spot(cmd["spot"], Total()).timeout(10).wait(15)
    if op == "hold":  # a request whose handler waits for RELEASE on the owner
        return client.request_to_spot(cmd["spot"], Hold()).timeout(cmd.get("timeout", 30)).wait(60)
    if op == "hold_one":
        client.send_to_spot(cmd["spot"], HoldOne()).submit()
        return None
    if op == "send":  # with "until_refused": the number accepted before the first refusal
        for seq in range(cmd["count"]):
            try:
                client.send_to_spot(cmd["spot"], Bump(sender=cmd["sender"], seq=seq)).submit()
            except zlink.ZLinkError:
                if not cmd.get("until_refused"):
                    raise
                return seq
        return cmd["count"]
    if op == "send_gate":
        for _ in range(cmd["count"]):
            client.send_to_spot(cmd["spot"], HoldOne()).submit()
        return None
    if op == "where":  # an Instance Spot, cold-activated on its first call
        return client.request_to_spot(cmd["spot"], Where()).instance_spot("mp.counter").wait(15)
    if op == "batch":
        size = cmd["size"]
        for start in range(0, cmd["count"], size):
            msgs = [Bump(sender=cmd["sender"], seq=s) for s in range(start, start + size)]
            client.send_many_to_spot(cmd["spot"], msgs).wait(15)
        return None
    if op == "player":
        return client.actors.create("mp.player").wait(15).actor_id
    if op == "enter":
        client.send_to_actor(cmd["actor"], Enter(room=cmd["room"])).wait(15)
        return None
    if op == "player_where":
        return client.request_to_actor(cmd["actor"], Where()).wait(15)
    if op == "drain":
        result = node.drain(cmd.get("move_timeout", 15))
        return {"moved": result.moved, "stayed": result.stayed}
    if op == "release":
        (RELEASE if cmd.get("which", "all") == "all" else RELEASE_HOLD).set()
        return None
    if op == "pump":
        _pump(node, cmd["name"], cmd["spot"], cmd["senders"], cmd["count"])
        return None
    if op == "pump_wait":
        state = _pumps[cmd["name"]]
        state["done"].wait(cmd.get("timeout", 60))
        return {"sent": state["sent"], "errors": state["errors"], "done": state["done"].is_set()}
    if op == "relocate":
        node.relocate_spot(cmd["spot"], cmd["to"], cmd.get("move_timeout", 10))
        return None
    if op == "follow":  # the room subscribes to a topic, here or where it lives
        return client.request_to_spot(cmd["spot"], Follow(topic=cmd["topic"])).wait(15)
    if op == "publish":  # reaches the subscribers on every node
        client.publish(cmd["topic"], News(text=cmd["text"])).wait(15)
        return None
    if op == "heard":
        return client.request_to_spot(cmd["spot"], Heard()).timeout(10).wait(15)
    if op == "subscribed":  # the topics this process lists the Spot under
        return sorted(rt.directory.subscribed.get(cmd["spot"], ()))
    if op == "restoring":  # a move into this node waits in its restore (mp.held_move)
        return RESTORING.is_set()
    if op == "owns":
        return cmd["spot"] in rt.spots
    if op == "counters":
        return node.counters()
    if op == "peers":
        return rt.router.transport.peers()
    if op == "paused":
        return rt.router.transport.paused(node.node_id, cmd["peer"])
    if op == "status_peers":
        status = node.status()
        return {"address": status.address, "peers": status.peers, "paused": status.paused_peers}
    if op == "gen":  # [node, incarnation, generation] of the Spot that answers
        return client.request_to_spot(cmd["spot"], Gen()).timeout(cmd.get("timeout", 10)).wait(60)
    if op == "mark":  # a one-way Mark to an Instance Spot (mp.journal), accepted or not
        mark = Mark(tag=cmd["tag"], hold_on=cmd.get("hold_on", ""))
        client.send_to_spot(cmd["spot"], mark).instance_spot("mp.journal").wait(15)
        return None
    if op == "incarnation":
        return node.incarnation
    if op == "close_ref":  # close the incarnation named by [spot, generation, node]
        spot, generation, owner = cmd["ref"]
        ref = zlink.SpotRef(spot, generation, node.config.mesh, owner)
        return client.spots.close(ref)
    if op == "busy":
        return node.status().workers_busy
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--listen", default="tcp://127.0.0.1:0")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--peer-backlog", type=int, default=256)
    parser.add_argument("--lane-items", type=int, default=1024)
    parser.add_argument("--max-frame", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--lease", type=float, default=3.0)
    args = parser.parse_args()
    config = zlink.NodeConfig(
        node_id=args.node_id, listen=args.listen, store=args.store, workers=args.workers,
        peer_backlog_items=args.peer_backlog, app_lane_items=args.lane_items,
        max_frame_bytes=args.max_frame, shutdown_timeout=5.0, lease_seconds=args.lease,
    )  # fmt: skip
    node = zlink.Node(app, config).start()
    transport = node._runtime.router.transport
    _say({"ready": node.node_id, "address": transport.address, "pid": _pid()})
    stopping = threading.Event()

    def handle(cmd: dict[str, Any]) -> None:
        try:
            value = _run(node, cmd)
            _say({"id": cmd["id"], "ok": True, "value": value})
        except Exception as exc:  # noqa: BLE001 - reported to the test
            _say({"id": cmd["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "stop":
            stopping.set()
            break
        threading.Thread(target=handle, args=(cmd,), daemon=True).start()
    RELEASE.set()
    RELEASE_HOLD.set()
    started = time.monotonic()
    node.shutdown(5.0)
    _say({"stopped": node.node_id, "seconds": round(time.monotonic() - started, 3)})


def _pid() -> int:
    import os

    return os.getpid()


if __name__ == "__main__":
    main()
