"""An Instance Spot's first record moving with its message (execution-model §14, cold
activation: the durable first record is replayed once by the next owner if its node died
before handling it; python-api §8 relocation).

A Spot whose first message is still queued when it moves takes its record along: the
commit's ``transfer`` keeps it in the store (``keep_first``) and the target clears it once
the message's handler ended. A review found the transfer clearing it: a target that died
before it ran the message left nothing for the next owner to replay, and the message was
lost.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conformance.test_relocation_withdrawn import Mover
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster, ManualClock


class Hello(zlink.Message, type_name="t.frm.hello"):
    tag: str


LOG: list[str] = []
INIT_GO = threading.Event()  # the first activation's on_initialize (node-1) waits for this
INITIALIZING = threading.Event()
HOLD = threading.Event()  # a handler on HOLD_ON holds until this is set
HOLDING = threading.Event()
HOLD_ON: list[str] = []  # the node whose handlers hold


def _node_of(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


class Greeter(zlink.InstanceSpot):
    def on_initialize(self) -> None:
        if _node_of(self.context) == "node-1":
            INITIALIZING.set()
            assert INIT_GO.wait(WAIT)

    @zlink.handler
    def hello(self, msg: Hello) -> None:
        node = _node_of(self.context)
        LOG.append(f"{msg.tag}@{node}")
        if node in HOLD_ON:
            HOLDING.set()
            assert HOLD.wait(WAIT)


def build_app() -> zlink.App:
    app = zlink.App("first-record-moves")
    app.instance_spot("t.frm.greeter", relocation=zlink.Relocation.preserve_state(
        zlink.JsonStateAdapter))(Greeter)  # fmt: skip
    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    LOG.clear()
    HOLD_ON.clear()
    for event in (INIT_GO, INITIALIZING, HOLD, HOLDING):
        event.clear()


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0,
                      lease_seconds=1e6) as c:  # fmt: skip
        yield c
    INIT_GO.set()
    HOLD.set()


def _moved_with_its_first_message_queued(cluster: LocalCluster) -> None:
    """node-1 activates "g" for its first message; the Spot moves to node-2 as soon as it
    is ready, before that message runs (asked from the activation's own completion)."""
    n1 = cluster.node(0)
    n1.client().send_to_spot("g", Hello(tag="first")).instance_spot().submit()
    assert INITIALIZING.wait(WAIT)
    act = n1._runtime.spots["g"]
    until(lambda: act.owner.lanes.reserved()[0] == 1, "its first message queued behind")
    movers: list[Mover] = []

    def move_once_ready(_value: object, _error: BaseException | None) -> None:
        movers.append(Mover(n1, "g", "node-2", timeout=10.0))
        assert movers[0].sealed.wait(WAIT)

    assert act.activated is not None
    act.activated.add_callback(move_once_ready)
    INIT_GO.set()
    until(lambda: movers, "the move asked for")
    assert movers[0].result() is None  # moved, its first message in its queue


def test_a_first_record_that_moved_with_its_message_is_replayed_if_the_target_dies_first(
    cluster,
):
    n2, n3 = cluster.node(1), cluster.node(2)
    HOLD_ON.append("node-2")
    _moved_with_its_first_message_queued(cluster)
    assert HOLDING.wait(WAIT)  # the first message runs on node-2, and hangs there
    found = cluster.store.lookup("g")
    assert found is not None and found.owner_node == "node-2"
    assert found.first is not None, f"the move cleared the record of a message not run: {found}"
    cluster.store.unregister_node("node-2", n2.incarnation)  # node-2 dies in that handler
    n3.client().send_to_spot("g", Hello(tag="then")).instance_spot().wait(WAIT)
    until(lambda: "then@node-3" in LOG, "the next message, on node-3")
    assert LOG.count("first@node-3") == 1, LOG  # replayed once, first
    assert LOG.index("first@node-3") < LOG.index("then@node-3")
    HOLD.set()


def test_a_first_record_that_moved_is_cleared_by_its_target_once_its_message_ran(cluster):
    n2, n3 = cluster.node(1), cluster.node(2)
    _moved_with_its_first_message_queued(cluster)
    until(lambda: "first@node-2" in LOG, "the first message, run on node-2")
    n2.wait_idle(WAIT)
    n2._runtime.router.store_worker.call(lambda: None).wait(WAIT)  # its clear made
    found = cluster.store.lookup("g")
    assert found is not None and found.first is None, found
    assert n2.counters().get("first_records_uncleared", 0) == 0
    cluster.store.unregister_node("node-2", n2.incarnation)  # node-2 dies after it ran it
    n3.client().send_to_spot("g", Hello(tag="then")).instance_spot().wait(WAIT)
    until(lambda: "then@node-3" in LOG, "the next message, on node-3")
    n3.wait_idle(WAIT)
    assert "first@node-3" not in LOG, LOG  # ran once, on node-2: never again
