"""The durable first record of an Instance Spot's cold activation (execution-model §14), in
one process: a node that dies between the record and its activation leaves the record, and the
next owner replays it once, ahead of the call that activated it there. (Deaths during and
after the handler, between node processes: ``test_node_leases.py``.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import zlink
from tests.conftest import WAIT
from zlink.errors import Unavailable
from zlink.mesh.location import InMemoryLocationStore, Reservation
from zlink.mesh.transport import InProcessTransport
from zlink.testing import ManualClock, run_until_idle

HANDLED: list[tuple[str, str]] = []  # (node, tag), in the order the journal handled them
SEEN = threading.Condition()


class Mark(zlink.Message, type_name="t.fr.mark"):
    tag: str


def _app() -> zlink.App:
    app = zlink.App("first-record")

    @app.instance_spot("t.fr.journal")
    class Journal(zlink.InstanceSpot):
        @zlink.handler
        def mark(self, msg: Mark) -> None:
            with SEEN:
                HANDLED.append((self.context._rt.node_id, msg.tag))  # type: ignore[attr-defined]
                SEEN.notify_all()

    return app


class DyingStore(InMemoryLocationStore):
    """Node-1 "dies" right after its claim with a first record committed: its lease is gone
    and it never hears the answer (it gets ``Unavailable``)."""

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        held = super().reserve(spot_id, kind, type_name, node, incarnation, first)
        if node == "node-1" and first is not None:
            self.unregister_node(node, incarnation)
            raise Unavailable("node-1 died after its claim was recorded")
        return held


@pytest.fixture
def nodes(clock: ManualClock) -> Iterator[tuple[DyingStore, list[zlink.Node]]]:
    HANDLED.clear()
    store, transport = DyingStore(clock), InProcessTransport()
    made = [
        zlink.Node(
            _app(),
            zlink.NodeConfig(node_id=f"node-{i}", workers=1, lease_seconds=3600),
            clock=clock,
            store=store,
            transport=transport,
        )
        for i in (1, 2)
    ]
    for node in made:
        node.start()
    try:
        yield store, made
    finally:
        for node in made:
            node.shutdown(WAIT)


def test_a_record_left_before_ready_is_replayed_once_by_the_next_owner(nodes) -> None:
    store, (n1, n2) = nodes
    with pytest.raises(Unavailable, match="node-1 died"):  # its caller hears the death
        n1.client().send_to_spot("j", Mark(tag="first")).instance_spot().wait(WAIT)
    left = store.lookup("j")
    assert left is not None and left.owner_node == "node-1" and not left.owner_live
    assert left.first is not None  # recorded before it could activate: it never ran
    n2.client().send_to_spot("j", Mark(tag="second")).instance_spot().wait(WAIT)
    with SEEN:
        assert SEEN.wait_for(lambda: len(HANDLED) == 2, WAIT)
    assert HANDLED == [("node-2", "first"), ("node-2", "second")]  # replayed once, first
    run_until_idle(n2, WAIT)
    now = store.lookup("j")
    assert now is not None and now.owner_node == "node-2" and now.first is None  # cleared
    assert n2.counters()["first_records_replayed"] == 1


def test_a_record_left_behind_is_replayed_by_a_call_that_does_not_name_an_instance_spot(
    nodes,
) -> None:
    """Found by review: re-homing through a plain Spot call (no ``instance_spot()``) also runs
    the record its dead owner left, first."""
    store, (n1, n2) = nodes
    with pytest.raises(Unavailable, match="node-1 died"):
        n1.client().send_to_spot("j", Mark(tag="first")).instance_spot().wait(WAIT)
    n2.client().send_to_spot("j", Mark(tag="second")).wait(WAIT)  # a plain Spot send
    with SEEN:
        assert SEEN.wait_for(lambda: len(HANDLED) == 2, WAIT)
    assert HANDLED == [("node-2", "first"), ("node-2", "second")]
    run_until_idle(n2, WAIT)
    now = store.lookup("j")
    assert now is not None and now.first is None


class SlowStore(InMemoryLocationStore):
    """A store whose claims wait for ``go`` (on the store thread): the caller gives up first."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.go = threading.Event()
        self.asked = threading.Event()

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        self.asked.set()
        assert self.go.wait(WAIT)
        return super().reserve(spot_id, kind, type_name, node, incarnation, first)


def test_a_first_call_whose_caller_gave_up_is_never_run_nor_left_recorded(clock) -> None:
    """Found by a growth probe's reading: a cold activation's first call records its message
    durably with the claim; its caller, told ``DeadlineExceeded`` with nothing queued while
    the store was still answering, must not have it run, here or by a later owner (the record
    is cleared), and nothing of it stays in the router."""
    HANDLED.clear()
    store = SlowStore(clock)
    node = zlink.Node(_app(), zlink.NodeConfig(node_id="node-1", workers=1, lease_seconds=3600),
                      clock=clock, store=store, transport=InProcessTransport())  # fmt: skip
    node.start()
    try:
        first = node.client().send_to_spot("j", Mark(tag="given up")).instance_spot().future()
        assert store.asked.wait(WAIT)
        clock.advance(node.config.admission_timeout + 1)  # the caller gives up
        with pytest.raises(zlink.DeadlineExceeded):
            first.result(WAIT)
        store.go.set()
        run_until_idle(node, WAIT)
        node.client().send_to_spot("j", Mark(tag="later")).instance_spot().wait(WAIT)
        with SEEN:
            assert SEEN.wait_for(lambda: len(HANDLED) == 1, WAIT)
        run_until_idle(node, WAIT)
        assert HANDLED == [("node-1", "later")]
        now = store.lookup("j")
        assert now is not None and now.first is None  # nothing left to replay
        assert node._rt.router._recorded == {}
    finally:
        node.shutdown(WAIT)
