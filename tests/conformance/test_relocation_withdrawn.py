"""Moves that do not happen: a restore that keeps failing, a deadline that passes first, a
handler suspended when the move is asked for (python-api §8 "A DeadlineExceeded from either
means the move did not happen (it was withdrawn and admission restored)"; §11 "A relocation
whose restore keeps failing" and "Close or move while a SpotWide handler is suspended";
kotlin-spot-interface: "seal new admission and proceed only after the all-lane barrier ...
including all coroutine continuations. A barrier failure aborts the entire seal of the same
generation and restores application admission exactly").

In every case the Spot stays on its source and serves again there, with its queue as it was
(the messages queued before the move first, then those parked during it, in arrival order),
its timers going on, and the target keeps nothing of it; nothing accepted is lost or run twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Add(zlink.Message, type_name="t.rw.add"):
    sender: str
    seq: int


class Seen(zlink.Request[dict[str, list[int]]], type_name="t.rw.seen"):
    pass


HANDLED: list[tuple[str, str, str, int]] = []  # (node, spot, sender, seq), every node
RESTORING = threading.Event()  # a restore has started on the target
RESTORE_GO = threading.Event()  # ... and may go on
RESTORES: list[int] = []


def _node() -> str:
    turn = zlink.executor.current_turn()
    assert turn is not None and turn.owner is not None
    return turn.owner.ref.rt.node_id  # type: ignore[no-any-return]


class FailingRestore(zlink.JsonStateAdapter):
    """Every restore fails; the first waits for the test before it does."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORES.append(1)
        RESTORING.set()
        assert RESTORE_GO.wait(WAIT)
        raise RuntimeError("cannot restore")


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: dict[str, list[int]] = {}

    @zlink.handler
    def add(self, msg: Add) -> None:
        HANDLED.append((_node(), self.context.spot_id, msg.sender, msg.seq))
        self.seen.setdefault(msg.sender, []).append(msg.seq)

    @zlink.handler
    def get_seen(self, req: Seen) -> dict[str, list[int]]:
        return self.seen


def build_app() -> zlink.App:
    app = zlink.App("withdrawn")
    app.user_spot("t.rw.stuck", relocation=zlink.Relocation.preserve_state(FailingRestore))(
        type("Stuck", (Room,), {})
    )
    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    HANDLED.clear()
    RESTORING.clear()
    RESTORE_GO.clear()
    RESTORES.clear()


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0) as c:
        yield c
    RESTORE_GO.set()


class Senders:
    """One sender on each node of the cluster, each numbering its messages from 0."""

    def __init__(self, cluster: LocalCluster, spot_id: str) -> None:
        self.clients = [node.client() for node in cluster.nodes]
        self.spot_id = spot_id
        self.sent = [0 for _ in cluster.nodes]

    def send(self, count: int) -> None:
        for k, client in enumerate(self.clients):
            for _ in range(count):
                client.send_to_spot(self.spot_id, Add(sender=str(k), seq=self.sent[k])).submit()
                self.sent[k] += 1

    def check_handled_once_in_order_on(self, node_id: str) -> None:
        mine = [h for h in HANDLED if h[1] == self.spot_id]
        assert {h[0] for h in mine} == {node_id}
        for k, sent in enumerate(self.sent):
            assert [h[3] for h in mine if h[2] == str(k)] == list(range(sent)), k
        assert not [h for h, n in Counter(mine).items() if n > 1]


def test_a_restore_that_keeps_failing_aborts_the_move_and_the_source_serves_everything(cluster):
    """python-api §11: "A relocation whose restore keeps failing (past its retries) is aborted:
    the source's seal is lifted, the Spot serves on the source again with its queue intact,
    and the caller of the move gets the error. Nothing parked during the move is dropped." """
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("stuck", "t.rw.stuck").wait(WAIT)
    senders = Senders(cluster, "stuck")
    senders.send(1)  # every node knows the way now
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["stuck"]
    assert act.gate._flag.acquire(False)  # hold the gate: these wait in the source's queue
    senders.send(20)
    asked = senders.clients[2].request_to_spot("stuck", Seen()).future()  # queued, with a reply
    cluster.wait_idle(WAIT)
    moving = n1._runtime.relocator.start(act, "node-2")
    senders.send(20)  # parked at the seal
    cluster.wait_idle(WAIT)
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn: the queue leaves for node-2
    assert RESTORING.wait(WAIT)
    senders.send(20)  # parked at the source; node-2's own wait there for the commit
    RESTORE_GO.set()
    with pytest.raises(zlink.StateIncompatible, match="restore failed 3 times"):
        moving.wait(WAIT)
    assert len(RESTORES) == 3  # retried on the same target, then given up
    senders.send(20)  # admission is back on the source
    cluster.wait_idle(WAIT)
    assert asked.result(WAIT)["2"] == list(range(21))  # answered once, by the source
    senders.check_handled_once_in_order_on("node-1")
    assert n1.client().request_to_spot("stuck", Seen()).wait(WAIT)["1"] == list(range(81))
    assert act.state.value == "ready" and n1._runtime.spots["stuck"] is act
    assert "stuck" not in n2._runtime.spots  # the target forgot its half-made copy
    assert cluster.store.lookup("stuck").owner_node == "node-1"
    cluster.wait_idle(WAIT)
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)  # admission restored exactly
