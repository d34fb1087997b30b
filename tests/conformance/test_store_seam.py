"""The store seam: Location Store reads are completions, never made under a lock or on the
caller's thread (issue "The runtime, composed", item 5; python-api §10: store calls run off the
infrastructure thread and under no runtime lock).

A route-cache miss and an Instance Spot's cold activation ask the store on the node's store
thread; the target's calls wait behind that question, in order, and a call for a target the
store does not know ends with ``NotFound`` (a request) or is counted as dropped (a send).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.executor import lockorder
from zlink.mesh.location import InMemoryLocationStore, Location, Reservation
from zlink.mesh.transport import InProcessTransport
from zlink.testing import ManualClock


class Add(zlink.Message, type_name="t.ss.add"):
    n: int


class Seen(zlink.Request[list[int]], type_name="t.ss.seen"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("store-seam")

    @app.user_spot("t.ss.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[int] = []

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.seen.append(msg.n)

        @zlink.handler
        def get_seen(self, req: Seen) -> list[int]:
            return self.seen

    @app.instance_spot("t.ss.counter")
    class Counter(zlink.InstanceSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.seen: list[int] = []

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.seen.append(msg.n)

        @zlink.handler
        def get_seen(self, req: Seen) -> list[int]:
            return self.seen

    return app


class WatchedStore(InMemoryLocationStore):
    """The in-memory store, recording where each read ran; reads can be held back or failed."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.reads: list[tuple[str, str, list[str]]] = []  # (what, thread, locks held)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def _read(self, what: str) -> None:
        self.reads.append((what, threading.current_thread().name, lockorder.held()))
        self.entered.set()
        assert self.gate.wait(WAIT)
        if self.fail is not None:
            raise self.fail

    def lookup(self, spot_id: str) -> Location | None:
        self._read("lookup")
        return super().lookup(spot_id)

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        self._read("reserve")
        return super().reserve(spot_id, kind, type_name, node, incarnation, first)


@pytest.fixture
def mesh(clock: ManualClock) -> Iterator[tuple[WatchedStore, list[zlink.Node]]]:
    store, transport = WatchedStore(clock), InProcessTransport()
    nodes = [
        zlink.Node(
            build_app(),
            zlink.NodeConfig(node_id=f"node-{i}", workers=2),
            clock=clock,
            store=store,
            transport=transport,
        )
        for i in (1, 2)
    ]
    for node in nodes:
        node.start()
    try:
        yield store, nodes
    finally:
        store.gate.set()
        for node in nodes:
            node.shutdown(WAIT)


def _off_every_lock(store: WatchedStore) -> None:
    assert store.reads, "the store was never read"
    for what, thread, locks in store.reads:
        assert thread.startswith("zlink-store"), f"{what} ran on {thread}"
        assert locks == [], f"{what} ran holding {locks}"


def test_a_route_miss_reads_the_store_on_its_thread_with_no_lock_held(mesh):
    store, (n1, n2) = mesh
    n1.client().spots.get_or_create("room", "t.ss.room").wait(WAIT)
    n2.client().send_to_spot("room", Add(n=1)).submit()
    assert n2.client().request_to_spot("room", Seen()).wait(WAIT) == [1]
    _off_every_lock(store)


def test_calls_wait_behind_a_slow_store_in_order_and_the_sender_never_blocks(mesh):
    store, (n1, n2) = mesh
    n1.client().spots.get_or_create("room", "t.ss.room").wait(WAIT)
    store.gate.clear()
    store.reads.clear()
    client = n2.client()
    for i in range(50):
        client.send_to_spot("room", Add(n=i)).submit()  # returns with the store held back
    answer = client.request_to_spot("room", Seen()).future()
    assert store.entered.wait(WAIT)
    assert not answer.done()
    store.gate.set()
    assert answer.result(WAIT) == list(range(50))
    assert [what for what, _, _ in store.reads] == ["lookup"]  # one question for all of them


def test_a_target_the_store_does_not_know(mesh):
    store, (_n1, n2) = mesh
    with pytest.raises(zlink.NotFound, match="nowhere"):
        n2.client().request_to_spot("nowhere", Seen()).wait(WAIT)
    n2.client().send_to_spot("nowhere", Add(n=1)).submit()  # accepted: the store is asked later
    n2.wait_idle(WAIT)
    assert n2.counters()["sends_dropped_not_found"] == 1
    _off_every_lock(store)


def test_a_store_that_fails_fails_the_calls_waiting_on_it(mesh):
    store, (n1, n2) = mesh
    n1.client().spots.get_or_create("room", "t.ss.room").wait(WAIT)
    store.fail = OSError("the store is down")
    with pytest.raises(zlink.Unavailable, match="store"):
        n2.client().request_to_spot("room", Seen()).wait(WAIT)
    n2.client().send_to_spot("room", Add(n=1)).submit()
    n2.wait_idle(WAIT)
    assert n2.counters()["sends_dropped_store_failed"] == 1
    store.fail = None  # the store is back: the next call asks again and gets through
    assert n2.client().request_to_spot("room", Seen()).wait(WAIT) == []


def test_creates_reserve_on_the_store_thread(mesh):
    store, (n1, n2) = mesh
    assert n2.client().spots.get_or_create("room", "t.ss.room").wait(WAIT).created
    assert not n1.client().spots.get_or_create("room", "t.ss.room").wait(WAIT).created
    assert "room" in n2._runtime.spots and "room" not in n1._runtime.spots
    assert [what for what, _, _ in store.reads] == ["reserve"] * 2
    _off_every_lock(store)


def test_a_create_fails_typed_when_the_store_fails(mesh):
    store, (n1, _n2) = mesh
    store.fail = OSError("the store is down")
    with pytest.raises(zlink.Unavailable, match="store"):
        n1.client().spots.get_or_create("room", "t.ss.room").wait(WAIT)
    assert "room" not in n1._runtime.spots


def test_an_instance_spot_is_reserved_on_the_store_thread(mesh):
    store, (n1, n2) = mesh
    store.gate.clear()
    first = n2.client().send_to_spot("c", Add(n=1)).instance_spot()
    first.submit()  # returns with the reservation held back
    for i in range(2, 20):
        n1.client().send_to_spot("c", Add(n=i)).instance_spot().submit()
    assert store.entered.wait(WAIT)
    store.gate.set()
    for _ in range(2):  # n2's message may still be on its way to n1 (or n1's to n2)
        for node in (n1, n2):
            assert node.wait_idle(WAIT)
    seen: Any = n1.client().request_to_spot("c", Seen()).instance_spot().wait(WAIT)
    assert sorted(seen) == list(range(1, 20))
    assert [n for n in seen if n >= 2] == list(range(2, 20))  # one sender's order kept
    assert sum("c" in n._runtime.spots for n in (n1, n2)) == 1
    _off_every_lock(store)
