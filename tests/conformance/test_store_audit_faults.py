"""Audit of the Location Stores and how the runtime calls them (python-api §10, execution-model
§14): faults found, each a test that fails on the code as audited and passes once fixed."""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.errors import InvalidArgument, Unavailable, ZLinkError
from zlink.mesh.location import InMemoryLocationStore, NoLease
from zlink.mesh.sqlite_store import SqliteLocationStore
from zlink.mesh.transport import InProcessTransport
from zlink.testing import ManualClock


class Ping(zlink.Request[str], type_name="t.sa.ping"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("store-audit")

    @app.user_spot("t.sa.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "pong"

    return app


class FlakyReleaseStore(InMemoryLocationStore):
    """The in-memory store whose next ``release`` fails as a store outage would (nothing
    written), once; ``released`` is set when that call has been made."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.fail_release = 0  # (this many releases fail, one after another)
        self.released = threading.Event()

    def release(self, spot_id: str, node: str, incarnation: int, authority: int) -> bool:
        try:
            if self.fail_release > 0:
                self.fail_release -= 1
                raise Unavailable("the location store failed: connection reset (injected)")
            return super().release(spot_id, node, incarnation, authority)
        finally:
            self.released.set()


def test_a_spot_made_again_after_a_release_the_store_failed_gets_a_new_object_generation(
    clock: ManualClock,
) -> None:
    """A close's ``release`` is sent and forgotten (closing.py): when the store fails it (a
    Redis blip, a busy SQLite file) the row stays, owned by this node's live incarnation, and
    the next ``get_or_create`` of the id is answered by ``reserve`` with that row
    (created=False, owner: this node), so the new activation is registered under the closed
    one's ``object_generation``: one generation names two incarnations (execution-model §14),
    and the old ``SpotRef`` addresses the new Spot."""
    store = FlakyReleaseStore(clock)
    node = zlink.Node(build_app(), zlink.NodeConfig(node_id="n1", workers=2), clock=clock,
                      store=store, transport=InProcessTransport())  # fmt: skip
    node.start()
    try:
        client = node.client()
        first = client.spots.get_or_create("room", "t.sa.room").wait(WAIT).spot_ref
        store.fail_release = 1  # the release fails (not tried again): the row is left
        store.released.clear()
        assert client.spots.close(first)
        assert store.released.wait(WAIT)  # the close's release was made, and failed
        node.wait_idle(WAIT)  # (its failure heard: the try again set on the node's clock)
        for _ in range(3):  # time for a try again, were there one
            clock.advance(8.0)
            node.wait_idle(WAIT)
        assert node.counters().get("store_writes_failed_release") == 1, node.counters()
        assert store.lookup("room") is not None  # left
        again = client.spots.get_or_create("room", "t.sa.room").wait(WAIT).spot_ref
        assert again.object_generation != first.object_generation, (
            f"the Spot made again reuses the closed one's generation {first.object_generation}"
        )
    finally:
        node.shutdown(WAIT)


class Where(zlink.Request[str], type_name="t.sa.where"):
    pass


def build_moving_app() -> zlink.App:
    app = zlink.App("store-audit-move")

    @app.user_spot("t.sa.mroom", relocation=zlink.Relocation.recreate())
    class MRoom(zlink.UserSpot):
        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context._rt.node_id  # type: ignore[attr-defined]

    return app


def test_a_move_committed_after_its_target_registered_again_does_not_lose_the_spot(
    clock: ManualClock,
) -> None:
    """``transfer(spot, node, incarnation, authority, target)`` names the target by node id
    only, and the store gives the Spot to whatever incarnation of ``target`` is live then
    (location.py ``transfer``: ``to = self._nodes.get(target)``; sqlite_store.py and the Redis
    ``_TRANSFER`` script alike). The move's state went to the target's *earlier*
    incarnation: one that fenced itself and registered again between the restore and the
    commit dropped it. The commit still succeeds, to the new incarnation: the store now names
    a live owner that has no such Spot, so it is never re-homed (its owner's lease holds) and
    every call fails until that node dies. A transfer fenced on the target's incarnation would
    be refused and the Spot would serve on at its source."""
    from zlink.mesh.location import no_lease
    from zlink.testing import LocalCluster

    with LocalCluster(build_moving_app(), nodes=2, clock=clock, workers=1,
                      lease_seconds=3.0) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        store = cluster.store
        n1.client().spots.get_or_create("room", "t.sa.mroom").wait(WAIT)
        old2 = n2.incarnation
        real_transfer, real_renew = store.transfer, store.renew_node
        entered, go = threading.Event(), threading.Event()
        refusing = {"node-2": False}

        def transfer(spot_id: str, *rest: Any) -> Any:
            if spot_id == "room" and not entered.is_set():
                entered.set()  # the target restored the room; the commit is on its way
                assert go.wait(WAIT)
            return real_transfer(spot_id, *rest)

        def renew(node_id: str, incarnation: int, lease: float) -> Any:
            if refusing.get(node_id):  # node-2's lease is refused: it fences itself, and
                refusing[node_id] = False  # registers again as a new incarnation
                raise no_lease(node_id, incarnation)
            return real_renew(node_id, incarnation, lease)

        store.transfer = transfer  # type: ignore[method-assign]
        store.renew_node = renew  # type: ignore[method-assign]
        outcome: list[Any] = []

        def move() -> None:
            try:
                n1.relocate_spot("room", "node-2", timeout=WAIT)
                outcome.append("moved")
            except ZLinkError as exc:
                outcome.append(exc)

        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        try:
            assert entered.wait(WAIT)
            refusing["node-2"] = True
            clock.advance(1.0)  # node-2's next renewal is due: refused
            deadline = threading.Event()
            for _ in range(50):  # bounded: node-2 fenced and registered again
                if n2.incarnation != old2:
                    break
                deadline.wait(0.1)
            assert n2.incarnation != old2, "node-2 did not register again"
        finally:
            go.set()
        mover.join(WAIT)
        assert not mover.is_alive()
        cluster.wait_idle(WAIT)
        for _ in range(4):  # two leases pass, renewed: "re-homed on its next call" never comes
            clock.advance(1.5)
            cluster.wait_idle(WAIT)
        found = store.lookup("room")
        try:
            answer: Any = n1.client().request_to_spot("room", Where()).wait(WAIT)
        except ZLinkError as exc:
            answer = exc
        assert isinstance(answer, str), (
            f"the room is lost after the move ({outcome}): the store names {found}, node-2 is"
            f" at incarnation {n2.incarnation} (the move went to {old2}); a call got {answer!r}"
        )


# -- the SQLite store ----------------------------------------------------------------------------


def _open_files(path: pathlib.Path) -> int:
    """How many descriptors of this process have ``path`` open."""
    count = 0
    for fd in pathlib.Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor)
            count += os.readlink(fd) == str(path)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_node_shut_down_before_it_started_closes_the_store_it_opened(
    tmp_path: pathlib.Path,
) -> None:
    """``Node(config with listen= and store=URL)`` opens the store in its constructor
    (node.py:227, ``self._owned_store = open_store(...)``); only the full stop closes it
    (node.py, the end of ``shutdown``). ``shutdown()`` of a node that never started returns
    early (``if not started: ... return``) and leaves the SQLite connection (a descriptor
    of the file, and its -wal/-shm) open for the life of the process (and ZeroMQ's context
    with it): "Every connection is closed explicitly, never left to the garbage collector"
    (sqlite_store.py docstring) does not hold."""
    path = tmp_path / "mesh.db"
    config = zlink.NodeConfig(node_id="n1", listen="tcp://127.0.0.1:0", store=f"sqlite:///{path}")
    node = zlink.Node(build_app(), config)
    assert _open_files(path) >= 1  # the constructor opened it
    node.shutdown(WAIT)  # never started
    try:
        assert _open_files(path) == 0, f"{_open_files(path)} descriptors of {path} left open"
    finally:
        store = node._owned_store
        if store is not None:
            store.close()
        transport = node._transport
        ctx = getattr(transport, "_ctx", None)
        if ctx is not None:
            ctx.term()


# -- the durable first record ---------------------------------------------------------------------

JOURNAL: list[tuple[str, str]] = []
JOURNAL_SEEN = threading.Condition()


class Mark(zlink.Message, type_name="t.sa.mark"):
    tag: str


def build_journal_app() -> zlink.App:
    app = zlink.App("store-audit-journal")

    @app.instance_spot("t.sa.journal")
    class Journal(zlink.InstanceSpot):
        @zlink.handler
        def mark(self, msg: Mark) -> None:
            with JOURNAL_SEEN:
                JOURNAL.append((self.context._rt.node_id, msg.tag))  # type: ignore[attr-defined]
                JOURNAL_SEEN.notify_all()

    return app


class FlakyClearStore(InMemoryLocationStore):
    """The in-memory store whose first ``clear_first`` fails as a dropped connection would
    (nothing written); ``cleared`` is set once it was tried."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.cleared = threading.Event()

    def clear_first(self, spot_id: str, node: str, incarnation: int, authority: int) -> bool:
        if not self.cleared.is_set():
            self.cleared.set()
            raise Unavailable("the location store failed: connection reset (injected)")
        return super().clear_first(spot_id, node, incarnation, authority)


def test_a_first_record_whose_clear_the_store_failed_once_is_not_run_again_elsewhere(
    clock: ManualClock,
) -> None:
    """An Instance Spot's first message ran to its end on node-1; the one ``clear_first``
    (routing.py ``record_ran``) met a store blip and is never tried again, though node-1's
    lease holds (only ``first_records_uncleared`` is counted). The record stays in the store
    for good; when node-1 later dies, the next owner "replays" a message that already ran:
    it runs twice (README: "A node that dies in between leaves the record", but this node
    did not die in between: the record outlived the handler by a transient failure)."""
    JOURNAL.clear()
    store, transport = FlakyClearStore(clock), InProcessTransport()
    nodes = [
        zlink.Node(build_journal_app(), zlink.NodeConfig(node_id=f"node-{i}", workers=1,
                   lease_seconds=3600), clock=clock, store=store, transport=transport)
        for i in (1, 2)
    ]  # fmt: skip
    for node in nodes:
        node.start()
    n1, n2 = nodes
    try:
        n1.client().send_to_spot("j", Mark(tag="first")).instance_spot().wait(WAIT)
        with JOURNAL_SEEN:
            assert JOURNAL_SEEN.wait_for(lambda: len(JOURNAL) == 1, WAIT)
        assert store.cleared.wait(WAIT)  # the handler ended; its clear failed once
        for _ in range(3):  # time for a clear tried again later (the lease holds: an hour)
            clock.advance(2.0)
            n1.wait_idle(WAIT)
            n2.wait_idle(WAIT)
        # node-1 dies later (its lease ends in the store): node-2 takes the journal over
        store.unregister_node("node-1", n1.incarnation)
        n2.client().send_to_spot("j", Mark(tag="second")).wait(WAIT)
        with JOURNAL_SEEN:
            JOURNAL_SEEN.wait_for(lambda: ("node-2", "second") in JOURNAL, WAIT)
        assert JOURNAL == [("node-1", "first"), ("node-2", "second")], (
            f"the first message ran twice: {JOURNAL}"
        )
    finally:
        for node in nodes:
            node.shutdown(WAIT)


# -- the SQLite store ----------------------------------------------------------------------------


def test_sqlite_a_later_data_loss_registration_never_shortens_the_no_claim_window(
    tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """After a data loss each node that comes back with an incarnation the file never gave
    pushes ``claims_after`` to ``now + its lease``, never back (the in-memory store: ``max``;
    Redis: compares numbers). The SQLite store writes ``MAX(CAST(value AS REAL),
    excluded.value)`` into ``meta.value``, a TEXT column (sqlite_store.py:208-211): the new
    value is stored as TEXT, and SQLite orders every TEXT above every REAL, so ``MAX`` always
    picks the new one. A node with a short lease registering after one with a long lease
    shortens the window, and a Spot the long-lease owner from before may still serve is
    granted to another node."""
    store = SqliteLocationStore(tmp_path / "store.db", clock)
    try:
        long = store.register_node("a", "inproc://a", 30.0, known_incarnation=5)  # until +30
        clock.advance(1.0)
        short = store.register_node("b", "inproc://b", 3.0, known_incarnation=long.incarnation + 5)
        clock.advance(2.0)
        store.renew_node("b", short.incarnation, 3.0)
        clock.advance(2.0)  # 5 s after the first: 25 s of "a"'s window are left
        with pytest.raises(Unavailable, match="lost its data"):
            store.reserve("room", "spot", "t.room", "b", short.incarnation)
    finally:
        store.close()


def test_sqlite_incarnations_never_repeat_near_the_integer_limit(
    tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """``known_incarnation`` is taken unchecked (the Redis store refuses one at or above
    2**53 with ``InvalidArgument``). At 2**63-1, the counter's ``value + 1``
    (sqlite_store.py:100, ``_NEXT``) overflows SQLite's INTEGER and becomes a REAL, which
    ``+ 1`` never moves again: every later registration gets the same incarnation, a float
    (execution-model §14: incarnations are never reused). Either the value is refused, or
    incarnations stay distinct integers."""
    store = SqliteLocationStore(tmp_path / "store.db", clock)
    try:
        try:
            store.register_node("a", "inproc://a", 30.0, known_incarnation=2**63 - 2)
        except InvalidArgument:
            return  # refused at the boundary: fixed
        b = store.register_node("b", "inproc://b", 30.0)
        c = store.register_node("c", "inproc://c", 30.0)
        assert (type(b.incarnation), type(c.incarnation)) == (int, int), (b, c)
        assert b.incarnation != c.incarnation, (b, c)
    finally:
        store.close()


def test_sqlite_an_integer_out_of_range_is_a_typed_error(
    tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """Every store failure is a ``zlink.errors`` error (sqlite_store.py docstring: "any other
    SQLite failure ... is Unavailable"; a bad argument would be ``InvalidArgument``). An
    incarnation or authority above SQLite's 64-bit INTEGER raises Python's ``OverflowError``
    from ``sqlite3`` binding it, untyped: it is not a ``sqlite3.Error``, so ``_write`` lets
    it through as is."""
    store = SqliteLocationStore(tmp_path / "store.db", clock)
    try:
        with pytest.raises(ZLinkError):
            store.register_node("a", "inproc://a", 30.0, known_incarnation=2**64)
        with pytest.raises(ZLinkError):
            store.release("room", "a", 2**64, 1)
    finally:
        store.close()


def test_sqlite_a_store_file_deleted_under_running_nodes_is_not_written_on_in_silence(
    tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """The file is checked at construction, never later (sqlite_store.py docstring). When it
    is deleted (or replaced: a restore, a tmp cleaner, an operator's ``rm``) while nodes run,
    their open connections keep renewing leases and granting claims in the unlinked file,
    while a node started afterwards makes a fresh file at the same path: two stores under one
    URL, and one Spot granted to a node in each. Redis's analogue (restarted empty) is seen
    and answered (no claims for a lease, every old node fences); here nothing notices. A
    store whose path no longer names the file it opened should refuse (``Unavailable``),
    so its nodes fence and register again in the file that is there now."""
    path = tmp_path / "mesh.db"
    old = SqliteLocationStore(path, clock)
    new: SqliteLocationStore | None = None
    try:
        a = old.register_node("a", "inproc://a", 30.0)
        assert old.reserve("room", "spot", "t.room", "a", a.incarnation).created
        for name in ("mesh.db", "mesh.db-wal", "mesh.db-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        clock.advance(1.0)
        new = SqliteLocationStore(path, clock)  # a node process started now
        b = new.register_node("b", "inproc://b", 30.0)
        assert new.reserve("room", "spot", "t.room", "b", b.incarnation).created
        with pytest.raises(Unavailable):  # node "a" must hear that its store is gone
            old.renew_node("a", a.incarnation, 30.0)
        # opened again: the file there now, where "a" holds no lease: it fences itself and
        # registers again with the incarnation it had, which this file never gave (made
        # after it): no claim is granted for one lease, as after any loss of the store's data
        with pytest.raises(NoLease):
            old.renew_node("a", a.incarnation, 30.0)
        again = old.register_node("a", "inproc://a", 30.0, known_incarnation=a.incarnation)
        assert again.incarnation > b.incarnation > a.incarnation
        with pytest.raises(Unavailable, match="lost its data"):
            old.reserve("other", "spot", "t.room", "a", again.incarnation)
    finally:
        old.close()
        if new is not None:
            new.close()


# -- the Redis store ----------------------------------------------------------------------------


def test_redis_open_store_existing_makes_nothing_and_refuses_an_empty_database(
    redis_server: Any,
) -> None:
    """``open_store(url, existing=True)`` (``zlink mesh``) promises "never made here, so a
    typo'd path is InvalidArgument, not an empty store" (stores.py ``open_store``). For a
    Redis URL ``existing`` is not passed on: a typo'd database number opens as an empty mesh
    (``zlink mesh`` lists no node) and the constructor's ``_check`` writes the schema mark
    ``zlink:schema`` into that database."""
    import redis

    from zlink.mesh.stores import open_store

    raw = redis.Redis(host="127.0.0.1", port=redis_server.port, db=3, decode_responses=True)
    try:
        url = f"redis://127.0.0.1:{redis_server.port}/3"  # nothing was ever stored there
        try:
            opened = open_store(url, existing=True)
        except InvalidArgument:
            opened = None
        if opened is not None:
            opened.close()  # type: ignore[attr-defined]
        assert raw.keys("*") == [], f"looking wrote {raw.keys('*')} into database 3"
        assert opened is None, "an empty database opened as an existing store"
    finally:
        raw.close()


def test_redis_a_prefix_nested_in_another_is_refused(redis_server: Any, clock: ManualClock) -> None:
    """Keys are ``PREFIX:loc:<spot>``; ``owned()`` and ``prune()`` scan ``PREFIX:loc:*``. A
    mesh whose prefix was ``zlink:loc`` had every key under ``zlink:loc:``: the ``zlink``
    mesh's ``owned()`` read them (its counters are strings: WRONGTYPE, ``Unavailable`` for
    good) and its ``prune`` judged the other mesh's Spots by its own node table (the audit
    saw it delete live rows). A prefix is a name without ``:``, so none nests in another."""
    from zlink.mesh.redis_store import RedisLocationStore

    with pytest.raises(InvalidArgument, match="without ':'"):
        RedisLocationStore(redis_server.url, clock, prefix="zlink:loc")
    outer = RedisLocationStore(redis_server.url, clock, prefix="zlink")
    other = RedisLocationStore(redis_server.url, clock, prefix="zlinkloc")
    try:
        b = other.register_node("b", "inproc://b", 1e6)
        assert other.reserve("room", "spot", "t.room", "b", b.incarnation).created
        clock.advance(120.0)
        assert outer.owned() == {}
        assert outer.prune(60.0) == (0, 0)
        found = other.lookup("room")
        assert found is not None and found.owner_live
    finally:
        outer.close()
        other.close()


def test_redis_a_location_field_of_another_shape_is_a_typed_error(
    redis_server: Any, clock: ManualClock
) -> None:
    """ "Every Redis failure ... is Unavailable" (redis_store.py docstring), and WRONGTYPE is;
    but a location hash whose number field holds something else (written by another tool
    or version under the prefix) reaches ``_location``'s ``int(...)`` and raises a bare
    ``ValueError`` from ``lookup`` (and ``reserve``): not a ``zlink.errors`` error."""
    import redis

    from zlink.mesh.redis_store import RedisLocationStore

    raw = redis.Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
    store = RedisLocationStore(redis_server.url, clock)
    try:
        raw.hset("zlink:loc:room", mapping={
            "kind": "spot", "type_name": "t.room", "owner_node": "n9",
            "owner_incarnation": "1", "authority_generation": "two", "object_generation": "1",
        })  # fmt: skip
        with pytest.raises(ZLinkError):
            store.lookup("room")
    finally:
        store.close()
        raw.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("lease", [float("nan"), float("inf"), -1.0])
def test_a_lease_that_is_not_a_positive_finite_duration_is_invalid_argument(
    kind: str, lease: float, tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """python-api §9: every duration is a finite number of seconds, anything else
    ``InvalidArgument`` at the call site. The stores take ``lease_seconds`` unchecked: the
    in-memory store registers a node whose lease is NaN (never live, never listed) or
    infinite (never lapses: its Spots are never re-homed), without a word; the SQLite store
    answers NaN with ``Unavailable`` ("NOT NULL constraint failed", a transient-looking
    error for a bad argument) and stores ``inf``."""
    store: Any = (
        InMemoryLocationStore(clock) if kind == "memory"
        else SqliteLocationStore(tmp_path / "store.db", clock)
    )  # fmt: skip
    try:
        with pytest.raises(InvalidArgument):
            store.register_node("a", "inproc://a", lease)
    finally:
        if kind == "sqlite":
            store.close()
