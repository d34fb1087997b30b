"""Faults a fresh-eyes review found in the drop notices of wire 8 and the store audit's fixes
(python-api §9, §10; execution-model §14), each a test that failed on the code as reviewed: a
first record's clear that the store failed is tried again, never on a later tenure of the id;
a claim waits for a release under way; a row left by a release that failed is claimed anew
with a new generation (User and Instance Spots); copies an uncommitted arrival holds are not
told dropped; a SQLite file deleted under two processes is usable again; a Redis node record
of another shape is Unavailable."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, hold_transfer
from zlink.errors import Unavailable
from zlink.mesh.location import InMemoryLocationStore
from zlink.mesh.transport import InProcessTransport
from zlink.testing import LocalCluster, ManualClock

BLOCKING, GO = threading.Event(), threading.Event()
SECOND_RUNS, SECOND_GO = threading.Event(), threading.Event()
HOLDING, HOLD_GO = threading.Event(), threading.Event()
HOLD_CLOSE = [False]  # on_closing holds until HOLD_GO
ADDED: list[str] = []
WHERE_RAN: list[str] = []  # where each Where ran
SEEN: list[tuple[str, int]] = []
SEEN_LOCK = threading.Condition()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    for event in (BLOCKING, GO, SECOND_RUNS, SECOND_GO, HOLDING, HOLD_GO):
        event.clear()
    ADDED.clear()
    WHERE_RAN.clear()
    SEEN.clear()
    HOLD_CLOSE[0] = False
    yield
    GO.set()
    SECOND_GO.set()
    HOLD_GO.set()


def _until(check: Callable[[], bool], what: str, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


# -- an Instance Spot that records its object generation, and closes itself on request ---------


class Note(zlink.Message, type_name="t.rv.note"):
    tag: str


class Quit(zlink.Message, type_name="t.rv.quit"):
    pass


def build_instance_app() -> zlink.App:
    app = zlink.App("review-today-instance")

    @app.instance_spot("t.rv.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        def note(self, msg: Note) -> None:
            if msg.tag == "second":
                SECOND_RUNS.set()
                assert SECOND_GO.wait(3 * WAIT)
            with SEEN_LOCK:
                SEEN.append((msg.tag, self.context.spot_ref.object_generation))
                SEEN_LOCK.notify_all()

        @zlink.handler
        def quit(self, msg: Quit) -> None:
            self.context.close()

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            if HOLD_CLOSE[0]:
                HOLDING.set()
                assert HOLD_GO.wait(3 * WAIT)

    return app


class FlakyStore(InMemoryLocationStore):
    """The in-memory store whose next ``release`` / first ``clear_first`` fail as a store
    outage would (nothing written), each once when armed."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.fail_release = False
        self.fail_releases = 0  # (this many releases fail, one after another)
        self.fail_clear = False
        self.fail_clears = 0  # (this many clears fail, one after another)
        self.released = threading.Event()
        self.clears = 0
        self.cleared = threading.Condition()

    def release(self, spot_id: str, node: str, incarnation: int, authority: int) -> bool:
        try:
            if self.fail_release or self.fail_releases > 0:
                self.fail_release = False
                self.fail_releases = max(0, self.fail_releases - 1)
                raise Unavailable("the location store failed: connection reset (injected)")
            return super().release(spot_id, node, incarnation, authority)
        finally:
            self.released.set()

    def clear_first(self, spot_id: str, node: str, incarnation: int, authority: int) -> bool:
        try:
            if self.fail_clear or self.fail_clears > 0:
                self.fail_clear = False
                self.fail_clears = max(0, self.fail_clears - 1)
                raise Unavailable("the location store failed: connection reset (injected)")
            return super().clear_first(spot_id, node, incarnation, authority)
        finally:
            with self.cleared:
                self.clears += 1
                self.cleared.notify_all()


def _node(
    store: InMemoryLocationStore,
    clock: ManualClock,
    node_id: str = "n1",
    transport: InProcessTransport | None = None,
) -> zlink.Node:
    return zlink.Node(build_instance_app(), zlink.NodeConfig(node_id=node_id, workers=2,
                      lease_seconds=3600), clock=clock, store=store,
                      transport=transport or InProcessTransport())  # fmt: skip


def _seen(tag: str) -> int:
    with SEEN_LOCK:
        assert SEEN_LOCK.wait_for(lambda: any(t == tag for t, _ in SEEN), WAIT), SEEN
        return next(g for t, g in SEEN if t == tag)


def test_an_instance_spot_made_again_by_a_send_after_a_failed_release_gets_a_new_generation(
    clock: ManualClock,
) -> None:
    """b6a8601 gives a leftover row of this incarnation (a close's release the store failed) a
    new object generation in ``Creation._claim`` only (get_or_create of a User Spot). An
    Instance Spot is made again by a send (routing.py ``locate`` -> ``reserve`` ->
    ``_located``): the store answers the leftover row (created=False, owner: this node,
    this incarnation), ``_ours`` holds, and ``_activate_recorded`` registers the new
    activation under the closed one's object generation (execution-model §14: one
    generation names one incarnation), with no durable first record written for its call."""
    store = FlakyStore(clock)
    node = _node(store, clock)
    node.start()
    try:
        client = node.client()
        client.send_to_spot("j", Note(tag="first")).instance_spot().wait(WAIT)
        first = _seen("first")
        store.fail_releases = 1  # the close's release fails (not tried again)
        store.released.clear()
        client.send_to_spot("j", Quit()).instance_spot().wait(WAIT)
        assert store.released.wait(WAIT)  # the close's release was made, and failed
        _until(lambda: "j" not in node._runtime.spots, "the close ended")
        node.wait_idle(WAIT)  # (its failure heard: the try again set on the node's clock)
        for _ in range(3):  # time for a try again, were there one
            clock.advance(8.0)
            node.wait_idle(WAIT)
        assert node.counters().get("store_writes_failed_release") == 1, node.counters()
        assert store.lookup("j") is not None  # the leftover row
        client.send_to_spot("j", Note(tag="again")).instance_spot().wait(WAIT)
        again = _seen("again")
        assert again != first, (
            f"the Instance Spot made again reuses the closed one's object generation {first}"
            f" (store row: {store.lookup('j')})"
        )
    finally:
        node.shutdown(WAIT)


def test_a_retried_clear_first_does_not_clear_the_record_of_a_later_tenure(
    clock: ManualClock,
) -> None:
    """``MeshRouter.fenced_write`` reads ``still()`` (the activation that ran the record is
    the Spot's) when a try fails, then tries again after a backoff without reading it again
    (routing.py ``fenced_write``: the retry calls the store at once). In that backoff the
    Spot closes (its release deletes the row) and a later tenure here claims it again at
    authority 1 with a first record of its own: the old ``clear_first(j, n1, inc, 1)``
    passes the fence and clears that record while its message has not run (the docstring of
    ``record_ran``: "a later tenure here, at authority 1 again, has a record of its own
    that an old clear must not take"). A node that dies then loses that first message."""
    store = FlakyStore(clock)
    node = _node(store, clock)
    node.start()
    try:
        client = node.client()
        store.fail_clear = True
        client.send_to_spot("j", Note(tag="first")).instance_spot().wait(WAIT)
        _seen("first")
        _until(lambda: node.counters().get("store_writes_retried", 0) == 1,
               "the failed clear was scheduled again")  # fmt: skip
        client.send_to_spot("j", Quit()).instance_spot().wait(WAIT)
        _until(lambda: "j" not in node._runtime.spots and store.lookup("j") is None,
               "the close ended and its release deleted the row")  # fmt: skip
        client.send_to_spot("j", Note(tag="second")).instance_spot().wait(WAIT)
        assert SECOND_RUNS.wait(WAIT)  # the later tenure's first message runs, and holds
        found = store.lookup("j")
        assert found is not None and found.first is not None, found  # its record, as it should
        assert found.authority_generation == 1, found
        with store.cleared:
            before = store.clears
        clock.advance(0.3)  # the backoff of the old clear ends: its tenure is gone, so it
        assert node.wait_idle(WAIT, 1)  # is not tried again (the row is the later tenure's;
        # the one busy item: the second message, held)
        with store.cleared:
            assert store.clears == before
        found = store.lookup("j")
        assert found is not None and found.first is not None, (
            f"the old tenure's clear, tried again, took the later tenure's first record before"
            f" its message ran: {found}"
        )
    finally:
        SECOND_GO.set()
        node.shutdown(WAIT)


def test_a_clear_first_that_failed_is_tried_again_after_the_spot_was_made_again_in_place(
    clock: ManualClock,
) -> None:
    """b6a8601 tries a failed ``clear_first`` again only while ``rt.spots.get(target) is act``
    (routing.py ``record_ran``), arguing that once the activation closed "its release took
    the record with its row". An Instance Spot that closes with calls to carry is made again
    in place (closing.py ``_reactivate``): no release, the row stays this node's at the same
    authority with the first record in it, but ``still()`` is now false, so a second store
    failure ends the retries (``first_records_uncleared``). The record of a message that ran
    stays for good: when node n1 dies, n2 takes the Spot over and runs that message again
    (the fault b6a8601 names as fixed: "the next owner ran the already-handled first
    message a second time")."""
    store, transport = FlakyStore(clock), InProcessTransport()
    n1 = _node(store, clock, "n1", transport)
    n2 = _node(store, clock, "n2", transport)
    n1.start()
    n2.start()
    try:
        c1 = n1.client()
        store.fail_clears = 2  # the store is down for the first try and the first retry
        c1.send_to_spot("j", Note(tag="first")).instance_spot().wait(WAIT)
        _seen("first")
        _until(lambda: n1.counters().get("store_writes_retried", 0) == 1,
               "the failed clear was scheduled again")  # fmt: skip
        HOLD_CLOSE[0] = True
        c1.send_to_spot("j", Quit()).instance_spot().wait(WAIT)  # closes itself...
        assert HOLDING.wait(WAIT)  # (held in on_closing)
        c1.send_to_spot("j", Note(tag="x")).instance_spot().wait(WAIT)  # ...with this to carry
        HOLD_GO.set()
        _seen("x")
        assert n1.counters().get("instance_reactivations") == 1, (n1.counters(), SEEN, n1.status())
        with store.cleared:
            before = store.clears
        clock.advance(0.3)  # the retry's backoff ends: the store fails it once more
        with store.cleared:
            assert store.cleared.wait_for(lambda: store.clears > before, WAIT)
        for _ in range(8):  # the further retries (8 tries span ~30 s of the node's clock)
            clock.advance(4.0)
            n1.wait_idle(WAIT)
        found = store.lookup("j")
        uncleared = n1.counters().get("first_records_uncleared")
        store.unregister_node("n1", n1.incarnation)  # n1 dies: n2 takes the Spot over
        n2.client().send_to_spot("j", Note(tag="y")).instance_spot().wait(WAIT)
        _seen("y")
        n2.wait_idle(WAIT)
        with SEEN_LOCK:
            tags = [t for t, _ in SEEN]
        assert tags.count("first") == 1, (
            f"the first message ran again at n2: {tags}; n1 gave the clear up"
            f" (first_records_uncleared={uncleared}) while its row kept the record: {found}"
        )
    finally:
        HOLD_GO.set()
        n1.shutdown(WAIT)
        n2.shutdown(WAIT)


# -- one-way messages a move carried, discarded at a stopping target that never got them -------


class Add(zlink.Message, type_name="t.rv.add"):
    pass


class Block(zlink.Message, type_name="t.rv.block"):
    pass


class Where(zlink.Request[str], type_name="t.rv.where"):
    pass


def build_room_app() -> zlink.App:
    app = zlink.App("review-today-room")

    @app.user_spot("t.rv.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.total = 0

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.total += 1
            ADDED.append(self.context._rt.node_id)  # type: ignore[attr-defined]

        @zlink.handler
        def block(self, msg: Block) -> None:
            BLOCKING.set()
            assert GO.wait(WAIT)

        @zlink.handler
        def where(self, msg: Where) -> str:
            here = str(self.context._rt.node_id)  # type: ignore[attr-defined]
            WHERE_RAN.append(here)
            return here

    return app


def _told(counters: dict[str, int]) -> int:
    return sum(v for k, v in counters.items() if k.startswith("remote_sends_dropped"))


def test_moved_messages_a_stopping_target_discards_uncommitted_are_not_told_dropped() -> None:
    """Five one-way messages made on node-1 move with the room to node-2, which restores and
    queues them (held until the commit). node-1's commit is slow in the store; node-2 stops
    meanwhile: past ``MOVES_AT_STOP`` its ``discard_queued`` drains the arriving room and,
    since 3b06d51 (``RelocMessageJob.origin``), tells node-1 they were dropped. node-2 then
    leaves the store, so node-1's ``transfer(..., node-2, incarnation)`` is refused
    (no_target): the move did not happen and node-1 runs its kept originals. node-1 counts
    five ``remote_sends_dropped_unavailable`` for five messages it handled (python-api §9:
    "either handled at the target, or counted as dropped").

    A later review found the same for a request queued behind them: node-2 answered its
    caller ``Unavailable`` ("shut down before it ran") while node-1 ran it (the caller, who
    may try again, would run it twice). A copy of a request is not answered by the target."""
    with LocalCluster(build_room_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        store = cluster.store
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rv.room").wait(WAIT)
        assert "room" in n1._runtime.spots
        entered, go = hold_transfer(
            store, "room"
        )  # node-2 restored the room; node-1's commit waits here
        moved: list[BaseException | None] = []
        mover: threading.Thread | None = None
        try:
            c1.send_to_spot("room", Block()).submit()
            assert BLOCKING.wait(WAIT)
            for _ in range(5):
                c1.send_to_spot("room", Add()).wait(WAIT)
            where = c1.request_to_spot("room", Where()).future()

            def move() -> None:
                try:
                    n1.relocate_spot("room", "node-2", 4 * WAIT)
                except BaseException as exc:  # noqa: BLE001 - the test reads it
                    moved.append(exc)
                else:
                    moved.append(None)

            mover = threading.Thread(target=move, daemon=True)
            mover.start()
            _until(lambda: n1._runtime.relocator is not None
                   and n1._runtime.relocator.moving("room"), "the move began")  # fmt: skip
            GO.set()
            assert entered.wait(WAIT), "the commit was not reached"
            n2.shutdown(WAIT)  # waits for the arrival MOVES_AT_STOP, then discards it
        finally:
            go.set()
            if mover is not None:
                mover.join(2 * WAIT)
        assert mover is not None and not mover.is_alive()
        _until(lambda: len(ADDED) == 5, f"node-1 ran its originals: {ADDED}, {moved}")
        n1.wait_idle(WAIT)
        assert ADDED == ["node-1"] * 5, ADDED
        assert where.result(WAIT) == "node-1"  # (not node-2's Unavailable for its copy)
        counters, there = n1.counters(), n2.counters()
        assert _told(counters) == 0, (
            f"node-1 handled its 5 messages and was told they were dropped at node-2: "
            f"{ {k: v for k, v in counters.items() if 'dropped' in k} }; node-2: "
            f"{ {k: v for k, v in there.items() if 'discarded' in k} }; move: {moved}"
        )


def test_a_close_release_that_comes_after_the_left_row_was_taken_again_keeps_the_live_row(
    clock: ManualClock,
) -> None:
    """(A race, made deterministic by holding the closing worker thread where a preemption
    would.) ``Closing._end`` forgets the Spot under the directory lock and only then queues
    its ``release`` (closing.py ``_end``: ``directory.forget`` ... ``router.fenced_write(
    "release", ...)``). A ``get_or_create`` in between finds the row still this
    incarnation's and nothing here (creation.py ``_claim`` -> ``_left_row``), takes it with
    ``new_generation`` (same authority) and activates the Spot; the close's release, fenced
    on that same authority, then deletes the live Spot's row (the very outcome the
    ``fenced_write`` docstring says a release must never have). The store then has no owner
    for a live Spot: any node's next get_or_create makes a second activation."""
    store = InMemoryLocationStore(clock)
    node = zlink.Node(build_room_app(), zlink.NodeConfig(node_id="n1", workers=2,
                      lease_seconds=3600), clock=clock, store=store,
                      transport=InProcessTransport())  # fmt: skip
    node.start()
    entered, go, released = threading.Event(), threading.Event(), threading.Event()
    try:
        router = node._runtime.router
        assert router is not None
        real_write, real_release = router.fenced_write, store.release

        def fenced_write(what: str, fn: Any, *args: Any, **kw: Any) -> None:
            if what == "release" and args[0] == "room" and not entered.is_set():
                entered.set()  # the closing thread is descheduled here, for a moment
                assert go.wait(WAIT)
            real_write(what, fn, *args, **kw)

        def release(*args: Any) -> bool:
            try:
                return real_release(*args)
            finally:
                released.set()

        router.fenced_write = fenced_write  # type: ignore[method-assign]
        store.release = release  # type: ignore[method-assign]
        client = node.client()
        first = client.spots.get_or_create("room", "t.rv.room").wait(WAIT).spot_ref
        assert client.spots.close(first)
        assert entered.wait(WAIT), "the close did not reach its release"
        # made in that moment: it waits for the close's release (``Runtime.releasing``)
        pending = client.spots.get_or_create("room", "t.rv.room").future()
        go.set()
        again = pending.result(WAIT).spot_ref
        assert released.wait(WAIT)
        assert again.object_generation != first.object_generation
        assert "room" in node._runtime.spots
        node.wait_idle(WAIT)
        found = store.lookup("room")
        assert found is not None, (
            f"the close's release deleted the row of the live activation {again}: the store"
            f" names no owner for it"
        )
    finally:
        go.set()
        node.shutdown(WAIT)


def test_redis_a_node_record_of_another_shape_is_a_typed_error(
    redis_server: Any, clock: ManualClock
) -> None:
    """f5a74e9 makes a location row of another shape ``Unavailable`` (``_location``), but a
    node record under the prefix is parsed as bare Python too (redis_store.py ``nodes``:
    ``NodeRecord(n, endpoint, int(inc), float(until))``): an incarnation field of another
    shape (another tool or version under the prefix) raises a bare ``ValueError`` from
    ``nodes()``, which every node's membership reads."""
    import redis

    from zlink.errors import ZLinkError
    from zlink.mesh.redis_store import RedisLocationStore

    raw = redis.Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
    store = RedisLocationStore(redis_server.url, clock)
    try:
        raw.hset("zlink:node:n9", mapping={
            "endpoint": "inproc://n9", "incarnation": "nine", "lease_until": "1e12",
        })  # fmt: skip
        raw.sadd("zlink:nodes", "n9")
        try:
            got: Any = store.nodes()
        except Exception as exc:  # noqa: BLE001 - the test reads its type
            got = exc
        assert isinstance(got, ZLinkError), f"nodes() gave {got!r}"
    finally:
        store.close()
        raw.close()


_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
print(conn.execute("SELECT count(*) FROM nodes").fetchone()[0], flush=True)
sys.stdin.readline()  # another node process: its connection (and the WAL) stays open
conn.close()
"""


def test_sqlite_a_store_file_deleted_under_two_processes_is_usable_again_once_they_let_go(
    tmp_path: Any,
) -> None:
    """dc3e053: "a file deleted ... is Unavailable once, and the connection opens the path
    again (made anew if it is gone)". An operator's ``rm store.db`` leaves ``store.db-wal``
    and ``-shm``, held open by the other node processes still on the unlinked file: this
    process's reopen (sqlite_store.py ``_same_file`` -> ``_open_checked``) fails ("disk
    I/O error") and drops the connection; the thread's next call opens a bare one
    (``_enter`` -> ``_connect``, which records the new file's inode in ``conn.file`` and
    makes no schema), so ``_same_file`` never reopens again: the new file has no tables and
    every call on that thread is ``Unavailable`` ("no such table") for good, also once the
    other process has let the old file go. A node's store and lease threads live as long as
    the node: it can never renew nor register again until its process restarts."""
    import os
    import subprocess
    import sys

    from zlink.mesh.sqlite_store import SqliteLocationStore

    path = str(tmp_path / "store.db")
    store = SqliteLocationStore(path)
    holder: subprocess.Popen[str] | None = None
    try:
        store.register_node("a", "inproc://a", 100.0)
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "1"  # it has the file open
        os.remove(path)  # the operator's rm: the -wal and -shm stay
        first: list[str] = []
        for _ in range(2):  # while the other process is still on the old file
            try:
                store.nodes()
                first.append("ok")
            except Unavailable as exc:
                first.append(str(exc))
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(WAIT) == 0  # the other process let the old file go
        answers: list[str] = []
        for _ in range(5):  # bounded: "Unavailable once", then the path opened again
            try:
                answers.append(repr(store.nodes()))
                break
            except Unavailable as exc:
                answers.append(str(exc))
        assert answers[-1] == "[]", (
            f"the store stays unusable after the file was deleted: {answers}"
            f" (while the other process held it: {first})"
        )
    finally:
        if holder is not None:
            if holder.poll() is None:
                holder.kill()
                holder.wait(WAIT)
            for pipe in (holder.stdin, holder.stdout):
                if pipe is not None:
                    pipe.close()
        store.close()
