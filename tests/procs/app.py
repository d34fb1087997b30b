"""The app that the node processes of the mesh tests run (tests/procs/node_main.py).

A room records, per sender, the sequence numbers it got (exactly-once and per-sender order are
checked from it); a gate Spot holds its handler until the test releases it (blocked workers,
a request in flight, a paused peer).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from typing import Any

import zlink

RELEASE = threading.Event()  # set by the node process's "release" command (HoldOne)
RELEASE_HOLD = threading.Event()  # set by "release" with which="hold" (Hold)
RESTORING = threading.Event()  # a HeldRestore started here ("restoring" command)


class Bump(zlink.Message, type_name="mp.bump"):
    sender: str
    seq: int


class Log(zlink.Request[dict[str, list[int]]], type_name="mp.log"):
    pass


class Total(zlink.Request[int], type_name="mp.total"):
    pass


class Hold(zlink.Request[str], type_name="mp.hold"):
    pass


class HoldOne(zlink.Message, type_name="mp.hold_one"):
    pass


class Follow(zlink.Request[bool], type_name="mp.follow"):
    """Subscribe the room to ``topic`` (a request: handled where the room is now)."""

    topic: str


class News(zlink.Message, type_name="mp.news"):
    text: str


class Heard(zlink.Request[list[str]], type_name="mp.heard"):
    """The events the room handled, each ``node:topic:text``."""


app = zlink.App("mp")


@app.user_spot("mp.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: dict[str, list[int]] = {}
        self.heard: list[str] = []

    @zlink.handler
    def follow(self, req: Follow) -> bool:
        self.context.subscribe(req.topic)
        return True

    @zlink.handler
    def get_heard(self, req: Heard) -> list[str]:
        return self.heard

    @zlink.subscription
    def on_news(self, event: News, context: zlink.MessageContext) -> None:
        self.heard.append(f"{_node(self.context)}:{context.topic}:{event.text}")

    @zlink.handler
    def bump(self, msg: Bump) -> None:
        self.seen.setdefault(msg.sender, []).append(msg.seq)

    @zlink.handler
    def log(self, req: Log) -> dict[str, list[int]]:
        return self.seen

    @zlink.handler
    def total(self, req: Total) -> int:
        return sum(len(v) for v in self.seen.values())


class HeldRestore(zlink.JsonStateAdapter):
    """A restore that holds its worker (bounded: 30 s): a move caught at its target."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORING.set()
        RELEASE.wait(30)
        super().restore(instance, data)


@app.user_spot("mp.held_move", relocation=zlink.Relocation.preserve_state(HeldRestore))
class HeldMove(Room):
    """A room whose moves wait at their target's restore until ``RELEASE``."""


@app.user_spot("mp.gate")
class Gate(zlink.UserSpot):
    """Its handlers wait for ``RELEASE`` (bounded: 30 s), holding a worker meanwhile."""

    @zlink.handler
    def hold(self, req: Hold) -> str:
        RELEASE_HOLD.wait(30)
        return "released"

    @zlink.handler
    def hold_one(self, msg: HoldOne) -> None:
        RELEASE.wait(30)


class Where(zlink.Request[str], type_name="mp.where"):
    pass


class Enter(zlink.Message, type_name="mp.enter"):
    room: str


def _node(context: object) -> str:
    return context._rt.node_id  # type: ignore[attr-defined, no-any-return]


@app.instance_spot("mp.counter")
class Counter(zlink.InstanceSpot):
    @zlink.handler
    def where(self, req: Where) -> str:
        return _node(self.context)


@app.entry_spot("mp.lobby", actor="mp.player")
class Lobby(zlink.EntrySpot):
    pass


@app.actor("mp.player", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.joined: list[str] = []

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    @zlink.handler
    def where(self, req: Where) -> str:
        return f"{_node(self.context)}:{self.context.spot_id}:{self.joined}"

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        if completion.joined:
            self.joined.append(completion.spot_id)


class Gen(zlink.Request[list[Any]], type_name="mp.gen"):
    """Answers ``[node, incarnation, object_generation]`` of the Spot that handles it."""


def _audit(context: Any, event: str) -> None:
    """One row per activation and per handled message, in the audit file the test names
    (``ZLINK_TEST_AUDIT``): which node, incarnation and generation, and the wall time."""
    path = os.environ.get("ZLINK_TEST_AUDIT")
    if not path:
        return
    rt = context._rt
    row = (context.spot_id, rt.node_id, rt.incarnation, context.spot_ref.object_generation,
           time.time(), event)  # fmt: skip
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db, db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS audit (spot TEXT, node TEXT, incarnation INTEGER,"
            " generation INTEGER, at REAL, event TEXT)"
        )
        db.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?)", row)


@app.user_spot("mp.audited")
class Audited(zlink.UserSpot):
    """Logs its activations and every message it handles to the audit file."""

    def on_initialize(self) -> None:
        _audit(self.context, "activated")

    @zlink.handler
    def gen(self, req: Gen) -> list[Any]:
        _audit(self.context, "handled")
        rt = self.context._rt  # type: ignore[attr-defined]
        return [rt.node_id, rt.incarnation, self.context.spot_ref.object_generation]


class Mark(zlink.Message, type_name="mp.mark"):
    """Journaled by ``mp.journal``; its handler holds (until ``release``) on ``hold_on``."""

    tag: str
    hold_on: str = ""


@app.instance_spot("mp.journal")
class Journal(zlink.InstanceSpot):
    """An Instance Spot that logs each Mark it handles to the audit file (``mark:<tag>``)."""

    @zlink.handler
    def mark(self, msg: Mark) -> None:
        _audit(self.context, f"mark:{msg.tag}")
        if msg.hold_on == _node(self.context):
            RELEASE_HOLD.wait(30)


FACTORY_CALLS: list[str] = []


def make_app() -> zlink.App:
    """A factory (``zlink run tests.procs.app:make_app --factory``)."""
    FACTORY_CALLS.append("make_app")
    return app


def make_app_unannotated():  # type: ignore[no-untyped-def]
    """A factory whose return type is not written: known only once called."""
    return app
