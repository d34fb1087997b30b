"""200,000 messages over 1,000 Spots and 5,000 Actors from 4 threads (both interpreters).

Each gate has a detector: a lock taken with ``acquire(False)`` by every turn of that gate. If two
turns of one gate ever overlapped, the second would fail to take it. Each (sender, target) pair
carries a sequence number, so loss, duplication and reordering within one sender are all seen.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict

import pytest

import zlink

SPOTWIDE_ROOMS, PER_ACTOR_ROOMS = 800, 200
ACTORS = 5000
JOIN_WIDE, JOIN_PER = 2000, 1000  # the rest stay in the Entry Spot
SENDERS, PER_SENDER = 4, 50_000


class Hit(zlink.Message, type_name="t.st.hit"):
    sender: int
    seq: int


class Enter(zlink.Message, type_name="t.st.enter"):
    room: str


class Board:
    """What every handler reports to; its lock is taken only for rare events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.guards: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self.overlaps = 0
        self.disorder = 0
        self.joined = 0
        self.all_joined = threading.Event()
        self.received: dict[str, dict[int, int]] = {}

    def guard(self, gate_key: str) -> threading.Lock:
        with self.lock:
            return self.guards[gate_key]

    def hit(self, guard: threading.Lock, target: str, msg: Hit) -> None:
        if not guard.acquire(False):
            with self.lock:
                self.overlaps += 1
            return
        try:
            seen = self.received.setdefault(target, {})  # only this gate writes this entry
            if seen.get(msg.sender, -1) + 1 != msg.seq:
                with self.lock:
                    self.disorder += 1
            seen[msg.sender] = msg.seq
        finally:
            guard.release()


def build_app(board: Board) -> zlink.App:
    app = zlink.App("stress")

    class Room(zlink.UserSpot):
        shared = True

        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.guard = board.guard(context.spot_id)

        @zlink.handler
        def hit(self, msg: Hit) -> None:
            board.hit(self.guard, self.context.spot_id, msg)

    app.user_spot("t.st.wide")(type("Wide", (Room,), {}))
    app.user_spot("t.st.per", mode=zlink.ExecutionMode.PER_ACTOR)(
        type("Per", (Room,), {"shared": False})
    )

    @app.entry_spot("t.st.lobby", actor="t.st.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.st.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.guard = board.guard(self.actor_id)

        @zlink.handler
        def hit(self, msg: Hit) -> None:
            board.hit(self.guard, self.actor_id, msg)

        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            assert completion.joined, completion
            if completion.spot_id.startswith("wide-"):  # now behind the room's shared gate
                self.guard = board.guard(completion.spot_id)
            with board.lock:
                board.joined += 1
                if board.joined == JOIN_WIDE + JOIN_PER:
                    board.all_joined.set()

    return app


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_no_gate_ever_runs_two_turns_at_once_and_no_message_is_lost(make_node):
    board = Board()
    node = make_node(build_app(board), workers=4)
    client = node.client()
    rooms = [f"wide-{i}" for i in range(SPOTWIDE_ROOMS)] + [
        f"per-{i}" for i in range(PER_ACTOR_ROOMS)
    ]
    futures = [
        client.spots.get_or_create(r, "t.st.wide" if r.startswith("wide") else "t.st.per").future()
        for r in rooms
    ]
    for f in futures:
        f.result(30)
    actor_ids: list[str] = []
    for _ in range(ACTORS // 100):  # the Entry Spot's lifecycle lane admits 128 at a time
        batch = [client.actors.create("t.st.player").future() for _ in range(100)]
        actor_ids += [f.result(30).actor_id for f in batch]
    for i, aid in enumerate(actor_ids[: JOIN_WIDE + JOIN_PER]):
        room = f"wide-{i % SPOTWIDE_ROOMS}" if i < JOIN_WIDE else f"per-{i % PER_ACTOR_ROOMS}"
        client.send_to_actor(aid, Enter(room=room)).submit()
    assert board.all_joined.wait(60)

    targets = [("spot", r) for r in rooms] + [("actor", a) for a in actor_ids]
    sent: list[dict[str, int]] = [defaultdict(int) for _ in range(SENDERS)]
    errors: list[BaseException] = []

    def sender(k: int) -> None:
        rnd = random.Random(k)
        counts = sent[k]
        try:
            for _ in range(PER_SENDER):
                kind, target = targets[rnd.randrange(len(targets))]
                msg = Hit(sender=k, seq=counts[target])
                if kind == "spot":
                    client.send_to_spot(target, msg).submit()
                else:
                    client.send_to_actor(target, msg).submit()
                counts[target] += 1
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert node.wait_idle(120)

    assert board.overlaps == 0
    assert board.disorder == 0
    for k in range(SENDERS):
        for target, n in sent[k].items():
            assert board.received[target][k] == n - 1, (k, target)
    assert sum(sum(s.values()) for s in sent) == SENDERS * PER_SENDER
    assert node.counters().get("handler_errors", 0) == 0
