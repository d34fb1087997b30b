"""Moves and route fences under backpressure between nodes (python-api §8, §9).

A node that holds more calls from a peer than ``peer_backlog_items`` stops taking that peer's
application DATA (PAUSED) "while replies and other infrastructure traffic keep flowing"
(python-api §9). A move's own envelopes are such traffic: a move that needs an answer from a
paused peer must still end (commit, or be withdrawn by its deadline, §8), never wait for a
resume that only the move itself could bring. And what a node keeps for a target behind a
route fence is bounded as any queue of calls is: a caller past the bound waits for room, or is
refused at once, with nothing queued (§9).

Found by a probe (3 nodes, one sender per node, a busy room moved): ``relocate_spot`` ran
out its deadline in 8 of 12 runs, and a node kept 298,426 calls behind one fence, whose
sending again held its infrastructure thread for 12.7 s, past its lease: it fenced itself.
"""

from __future__ import annotations

import threading
from typing import Any

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster


class Add(zlink.Message, type_name="t.rb.add"):
    sender: str
    seq: int


class Block(zlink.Message, type_name="t.rb.block"):
    pass


HANDLED: list[tuple[str, str, int]] = []  # (node, sender, seq)
BLOCK, BLOCKING = threading.Event(), threading.Event()


def _node() -> str:
    turn = zlink.executor.current_turn()
    assert turn is not None and turn.owner is not None
    return turn.owner.ref.rt.node_id  # type: ignore[no-any-return]


def build_app() -> zlink.App:
    app = zlink.App("relocation-backpressure")

    @app.user_spot("t.rb.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.count = 0

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.count += 1
            HANDLED.append((_node(), msg.sender, msg.seq))

        @zlink.handler
        def block(self, msg: Block) -> None:
            BLOCKING.set()
            assert BLOCK.wait(WAIT)

    return app


def _reset() -> None:
    HANDLED.clear()
    BLOCK.clear()
    BLOCKING.clear()


def _until(check: Any, what: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT / 0.005)):
        if check():
            return
        done.wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_move_to_a_peer_this_node_paused_commits():
    """The room's node has paused the move's target (calls from it wait for room, past its
    backlog limit). Before, the target's "restored" answer travelled on DATA, which the
    paused source did not read until its backlog drained, and the backlog was calls waiting
    for that very move: the move could only run out its deadline. It travels with the
    infrastructure traffic now, and the move commits; every call is handled once, in order."""
    _reset()
    with LocalCluster(
        build_app(), nodes=2, workers=2, app_lane_items=4, peer_backlog_items=8
    ) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("room", "t.rb.room").wait(WAIT)
        c1, c2 = n1.client(), n2.client()
        c1.send_to_spot("room", Block()).wait(WAIT)
        assert BLOCKING.wait(WAIT)
        sent = [c2.send_to_spot("room", Add(sender="n2", seq=i)).future() for i in range(40)]
        _until(lambda: "node-2" in n1.status().paused_peers, "node-1 to pause node-2")
        moved: list[BaseException | None] = []

        def move() -> None:
            try:
                n1.relocate_spot("room", "node-2", timeout=WAIT)
                moved.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                moved.append(exc)

        mover = threading.Thread(target=move)
        mover.start()
        BLOCK.set()  # the barrier: the move goes on once the blocked turn ends
        mover.join(WAIT + 5)
        assert moved == [None]
        for future in sent:
            assert future.result(WAIT) is None
        n2.wait_idle(WAIT)
        _until(lambda: len(HANDLED) == 40, "every call handled")
        assert [seq for _n, _s, seq in HANDLED] == list(range(40))
        assert n1.status().paused_peers == []
