"""The Location Store in one SQLite file: the store of several node processes on one machine.

``SqliteLocationStore`` keeps exactly the semantics of ``InMemoryLocationStore`` (``location.py``,
execution-model §14) in a file that several processes open at once, with no server
(``store="sqlite:///PATH"``, python-api §10).

Guarantees / assumes:
* Every write is one ``BEGIN IMMEDIATE`` transaction: it takes the file's write lock before it
  reads, so the check and the change it guards cannot be split by another process or thread.
  Fenced writes compare-and-set on the owner node and the authority generation (node rows: on
  the incarnation), and refuse a stale writer with the same ``Unavailable`` as the in-memory
  store. A transaction that fails is rolled back: nothing is ever half-applied.
* ``object_generation`` (store-wide) and the node ``incarnation`` come from counters kept in the
  file and advanced inside the claiming transaction, never from the live rows, so a released
  Spot's generation or a departed node's incarnation is never handed out again, also across
  closing and reopening the file; they never fall below the store's clock in microseconds
  (as in the Redis store), so a file made again after one was lost repeats none, and an
  incarnation below the one the file started at is one it never gave.
* ``reserve`` of a Spot that already has an owner answers from a plain read, without the write
  lock; only a claim takes it (and looks again under it).
* Leases are measured on the store's clock. The file is shared by processes and outlives them,
  so the default clock is the wall clock (``time.time``); a test may inject a manual clock.
* The file is in WAL mode (readers never wait for the writer), ``synchronous=NORMAL`` (a commit
  survives a crash of the process; a power loss may lose the last ones, never corrupt the file).
  A write that cannot get the lock within ``busy_timeout`` seconds, and any other SQLite
  failure (disk full, I/O error), is ``Unavailable`` raised from the original error.
* The file is checked at construction: a folder that does not exist, a file that is not a
  SQLite database, a database that is not a ZLink store or has another schema version are
  ``InvalidArgument``. An empty or missing file gets the schema (one transaction). Each call
  checks that the path still names the file its connection opened (one ``stat``): a file
  deleted or replaced under running nodes (an operator's ``rm``, a restore, a temp cleaner)
  is ``Unavailable`` once, and the connection opens the path again (made anew if it is gone):
  the node's next renewal there is refused, so it fences itself and registers again with
  the incarnation it had, which the file never gave (a store that lost its data grants no
  claims for one lease). Before, the old connections went on in the unlinked file while new
  processes made another at the same path: two stores behind one URL (a store audit).
* Calls come from several threads of one process (a node's store thread, its start and stop,
  status readers): each thread has its own connection (``threading.local``). ``close()`` closes
  every one of them (one in use is closed by its thread as its call ends); after it, every call
  is ``Unavailable``. The connection of a thread that ended is closed when another thread opens
  one, so short-lived threads do not pile up open files. Every connection is closed explicitly,
  never left to the garbage collector (Python 3.13 warns of that). A process that forks must
  open its own store in the child.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from ..errors import InvalidArgument, Unavailable
from ..executor import Clock
from .location import (
    Location,
    NodeRecord,
    Reservation,
    check_counter,
    check_counters,
    check_fence,
    check_lease,
    no_lease,
    no_target,
    recovering,
    refuse_other_mesh,
)

SCHEMA_VERSION = 2  # the ``meta`` row ``schema_version``; a file with another is refused

_T = TypeVar("_T")

_TABLES = frozenset({"meta", "counters", "locations", "nodes"})
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # counters whose values are never handed out twice: object_generation, incarnation
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS locations (spot_id TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " type_name TEXT NOT NULL, owner_node TEXT NOT NULL, owner_incarnation INTEGER NOT NULL,"
    " authority_generation INTEGER NOT NULL, object_generation INTEGER NOT NULL UNIQUE,"
    " first_type TEXT, first_payload TEXT) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, endpoint TEXT NOT NULL,"
    " incarnation INTEGER NOT NULL, lease_until REAL NOT NULL, retired_incarnation INTEGER,"
    " retired_lease_until REAL) WITHOUT ROWID",
)

_LOCATION = (
    "spot_id, kind, type_name, owner_node, owner_incarnation, authority_generation,"
    " object_generation, first_type, first_payload"
)
_NODE = "node_id, endpoint, incarnation, lease_until"
# a location with its owner's lease (0.0: that incarnation holds none)
_SELECT_LOCATION = (
    "SELECT l.spot_id, l.kind, l.type_name, l.owner_node, l.owner_incarnation,"
    " l.authority_generation, l.object_generation, l.first_type, l.first_payload,"
    " CASE WHEN n.incarnation = l.owner_incarnation THEN n.lease_until"
    " WHEN l.owner_incarnation <= n.retired_incarnation THEN n.retired_lease_until ELSE 0.0"
    " END FROM locations l LEFT JOIN nodes n ON n.node_id = l.owner_node WHERE l.spot_id = ?"
)
_LIVE = "SELECT lease_until FROM nodes WHERE node_id = ? AND incarnation = ? AND lease_until >= ?"
# retention: the rows of owners whose lease lapsed before ?, but a durable first record
_PRUNE_LOCATIONS = (
    "DELETE FROM locations WHERE first_type IS NULL AND spot_id IN (SELECT l.spot_id"
    " FROM locations l LEFT JOIN nodes n ON n.node_id = l.owner_node WHERE"
    " CASE WHEN n.incarnation = l.owner_incarnation THEN n.lease_until"
    " WHEN l.owner_incarnation <= n.retired_incarnation THEN n.retired_lease_until ELSE 0.0"
    " END < ?)"
)
# the next of a counter: above the last, and at least the store's clock in microseconds (as in
# the Redis store): a file made again after one was lost never hands out what the old one did
_NEXT = "UPDATE counters SET value = MAX(value + 1, ?) WHERE name = ? RETURNING value"

# SQLite's primary result codes that mean "this path is not a store we can use": refused at
# construction with InvalidArgument; every other failure is Unavailable (it may pass).
_NOT_A_STORE = {
    sqlite3.SQLITE_NOTADB: "is not a SQLite database",
    sqlite3.SQLITE_CORRUPT: "is a damaged SQLite database",
    sqlite3.SQLITE_CANTOPEN: "cannot be opened",
    sqlite3.SQLITE_READONLY: "cannot be written",
}


class _Connection(sqlite3.Connection):
    """One thread's connection: which thread, and whether a call is using it (``close()``
    leaves that one to its thread)."""

    busy = False
    thread: threading.Thread | None = None
    file: tuple[int, int] | None = None  # (device, inode) of the file it opened

    def idle_and_orphaned(self) -> bool:
        """Whether its thread has ended (no call can be using it then)."""
        return not self.busy and self.thread is not None and not self.thread.is_alive()


def _micros(now: float) -> int:
    """The store's clock in whole microseconds: where its counters start (never below)."""
    return max(0, int(now * 1e6))


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path`` now, ``None`` if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    # fetchall steps every statement to its end, so none is left holding a read snapshot
    return conn.execute(sql, args).fetchall()


def _one(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
    rows = _rows(conn, sql, args)
    return rows[0] if rows else None


class SqliteLocationStore:
    """The Location Store in a SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        clock: Clock | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        if not (math.isfinite(busy_timeout) and busy_timeout >= 0):
            raise InvalidArgument(f"busy_timeout is a finite number of seconds: {busy_timeout!r}")
        given = os.fspath(path)
        if given in ("", ":memory:"):
            raise InvalidArgument(
                f"a SQLite location store needs a file that processes share, not {given!r}"
                " (one process: use the in-memory store)"
            )
        # absolute now: connections are opened later, per thread, whatever the cwd is then
        self._path = os.path.abspath(given)
        folder = os.path.dirname(self._path)
        if not os.path.isdir(folder):
            raise InvalidArgument(
                f"the folder of the location store {self._path!r} does not exist: {folder!r}"
            )
        if os.path.isdir(self._path):
            raise InvalidArgument(f"the location store {self._path!r} is a folder, not a file")
        self._busy_timeout = busy_timeout
        self._now: Callable[[], float] = time.time if clock is None else clock.now
        self._local = threading.local()
        self._lock = threading.Lock()  # a leaf: guards _closed, _connections and .busy
        # every open connection, held here so that each is closed explicitly: by close(), or
        # once its thread has ended, when another thread opens one
        self._connections: set[_Connection] = set()
        self._closed = False
        conn = self._open_checked()
        self._file = conn.file  # the file the path named when it was last opened and checked
        self._connections.add(conn)
        self._local.conn = conn

    @property
    def path(self) -> str:
        """The absolute path of the file."""
        return self._path

    def __repr__(self) -> str:
        return f"SqliteLocationStore({self._path!r})"

    # -- membership -----------------------------------------------------------------------------
    def join_mesh(self, mesh: str) -> None:
        """(``LocationStore.join_mesh``) The mesh is a row of ``meta``, written once."""

        def join(conn: sqlite3.Connection) -> str:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('mesh', ?) ON CONFLICT(key) DO NOTHING",
                (mesh,),
            )
            return str(_one(conn, "SELECT value FROM meta WHERE key = 'mesh'")[0])

        refuse_other_mesh(f"the Location Store {self._path!r}", self._write(join), mesh)

    def register_node(
        self, node_id: str, endpoint: str, lease_seconds: float, known_incarnation: int = 0
    ) -> NodeRecord:
        """Register ``node_id`` with a new incarnation, higher than any handed out and than
        ``known_incarnation`` (the one it had: a file that never gave it lost its data, and
        then grants no claims for one lease)."""
        lease_seconds = check_lease(lease_seconds)
        known_incarnation = check_counter(known_incarnation, "known_incarnation")

        def register(conn: sqlite3.Connection) -> NodeRecord:
            now = self._now()
            last = _one(conn, "SELECT value FROM counters WHERE name = 'incarnation'")[0]
            base = _one(conn, "SELECT value FROM meta WHERE key = 'incarnation_base'")
            base = 0 if base is None else int(base[0])  # (a file from before has none)
            if known_incarnation > last or 0 < known_incarnation < base:  # handed out by a
                # store that was lost: one before this file was made, or one past its counter
                conn.execute(  # (never lower: one below the base was handed out before)
                    "UPDATE counters SET value = MAX(value, ?) WHERE name = 'incarnation'",
                    (known_incarnation,),
                )
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('claims_after', ?) ON CONFLICT(key)"
                    " DO UPDATE SET value = MAX(CAST(value AS REAL), CAST(excluded.value AS REAL))",
                    (now + lease_seconds,),
                )
            incarnation = _one(conn, _NEXT, (_micros(now), "incarnation"))[0]
            record = NodeRecord(node_id, endpoint, incarnation, now + lease_seconds)
            # every earlier incarnation's Spots hold until the latest of their leases ends
            old = _one(conn, "SELECT incarnation, MAX(lease_until, COALESCE("
                       "retired_lease_until, 0.0)) FROM nodes WHERE node_id = ?",
                       (node_id,))  # fmt: skip
            conn.execute(
                f"INSERT OR REPLACE INTO nodes ({_NODE}, retired_incarnation,"
                " retired_lease_until) VALUES (?, ?, ?, ?, ?, ?)",
                (*_record_row(record), *((None, None) if old is None else old)),
            )
            return record

        return self._write(register)

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord:
        """Extend the lease of ``node_id`` at ``incarnation``; refused if it is not the
        current incarnation or its lease lapsed (the node must register again)."""
        incarnation = check_counter(incarnation, "incarnation")
        lease_seconds = check_lease(lease_seconds)

        def renew(conn: sqlite3.Connection) -> NodeRecord:
            now = self._now()
            row = _one(
                conn,
                "UPDATE nodes SET lease_until = ?"
                " WHERE node_id = ? AND incarnation = ? AND lease_until >= ?"
                f" RETURNING {_NODE}",
                (now + lease_seconds, node_id, incarnation, now),
            )
            if row is None:
                raise no_lease(node_id, incarnation)
            return _record(row)

        return self._write(renew)

    def unregister_node(self, node_id: str, incarnation: int) -> bool:
        """Remove ``node_id`` (it stopped); only its current incarnation may."""
        incarnation = check_counter(incarnation, "incarnation")

        def unregister(conn: sqlite3.Connection) -> bool:
            # an earlier incarnation's lease that still holds stays with the row (its Spots
            # are its own until it ends): the row then only stops naming a member
            # (a lease of 0.0: it left already)
            kept = conn.execute(
                "UPDATE nodes SET lease_until = 0.0 WHERE node_id = ? AND incarnation = ?"
                " AND lease_until > 0.0 AND retired_lease_until >= ?",
                (node_id, incarnation, self._now()),
            )
            if kept.rowcount == 1:
                return True
            done = conn.execute(
                "DELETE FROM nodes WHERE node_id = ? AND incarnation = ? AND lease_until > 0.0",
                (node_id, incarnation),
            )
            return done.rowcount == 1

        return self._write(unregister)

    def now(self) -> float:
        """The store's clock (the wall clock, which the node processes sharing the file
        share)."""
        return self._now()

    def nodes(self) -> list[NodeRecord]:
        """The members: registered nodes whose lease has not lapsed, by id."""

        def members(conn: sqlite3.Connection) -> list[NodeRecord]:
            # ORDER BY compares UTF-8 bytes: the same order as Python's str comparison
            rows = _rows(
                conn,
                f"SELECT {_NODE} FROM nodes WHERE lease_until >= ? ORDER BY node_id",
                (self._now(),),
            )
            return [_record(row) for row in rows]

        return self._read(members)

    def owned(self) -> dict[tuple[str, int], int]:
        """How many Spots and Actors each node incarnation owns (``zlink mesh``)."""

        def count(conn: sqlite3.Connection) -> dict[tuple[str, int], int]:
            rows = conn.execute(
                "SELECT owner_node, owner_incarnation, COUNT(*) FROM locations"
                " GROUP BY owner_node, owner_incarnation"
            ).fetchall()
            return {(str(node), int(inc)): int(n) for node, inc, n in rows}

        return self._read(count)

    def new_generation(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> Location:
        """See ``LocationStore.new_generation``: one write transaction."""
        check_counters(incarnation, authority_generation)

        def renew(conn: sqlite3.Connection) -> Location:
            found = self._writable(conn, spot_id, node, incarnation, authority_generation)
            if found is None:
                raise Unavailable(f"{spot_id!r} has no location")
            generation = _one(conn, _NEXT, (_micros(self._now()), "object_generation"))[0]
            conn.execute(
                "UPDATE locations SET object_generation = ? WHERE spot_id = ?",
                (generation, spot_id),
            )
            return replace(found, object_generation=int(generation))

        return self._write(renew)

    def prune(self, lapsed_for: float) -> tuple[int, int]:
        """See ``LocationStore.prune``: one write transaction."""

        def prune(conn: sqlite3.Connection) -> tuple[int, int]:
            before = self._now() - lapsed_for
            rows = conn.execute(_PRUNE_LOCATIONS, (before,)).rowcount
            nodes = conn.execute(
                "DELETE FROM nodes WHERE lease_until < ? AND COALESCE(retired_lease_until, 0.0)"
                " < ?",
                (before, before),
            ).rowcount
            return rows, nodes

        return self._write(prune)

    # -- locations ------------------------------------------------------------------------------
    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        """Claim ``spot_id`` for ``node`` at ``incarnation`` if nobody owns it, or its owner's
        lease lapsed (re-homing: a new authority and object generation); else say who owns
        it. The claimer must hold a live lease. ``first``: the durable first record, written
        with the claim (a record left by the previous owner is kept instead)."""
        incarnation = check_counter(incarnation, "incarnation")
        found = self.lookup(spot_id)  # the usual answer: no write lock needed to give it
        if found is not None and found.owner_live:
            return Reservation(found, created=False)

        def claim(conn: sqlite3.Connection) -> Reservation:
            now = self._now()
            row = _one(conn, _SELECT_LOCATION, (spot_id,))  # again, under the write lock
            previous = None if row is None else _location(row, now)
            if previous is not None and previous.owner_live:
                return Reservation(previous, created=False)
            lease = _one(conn, _LIVE, (node, incarnation, now))
            if lease is None:
                raise no_lease(node, incarnation)
            self._check_claims(conn, now)
            generation = _one(conn, _NEXT, (_micros(now), "object_generation"))[0]
            authority = 1 if previous is None else previous.authority_generation + 1
            kept = previous.first if previous is not None else None
            location = Location(spot_id, kind, type_name, node, incarnation, authority,
                                generation, float(lease[0]), True, kept or first)  # fmt: skip
            conn.execute(
                f"INSERT OR REPLACE INTO locations ({_LOCATION})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _location_row(location),
            )
            return Reservation(location, created=True, previous=previous)

        return self._write(claim)

    def clear_first(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> bool:
        """The first record's handler ended: forget the record (fenced like any write);
        ``False`` if there was none."""
        check_counters(incarnation, authority_generation)

        def clear(conn: sqlite3.Connection) -> bool:
            found = self._writable(conn, spot_id, node, incarnation, authority_generation)
            if found is None or found.first is None:
                return False
            conn.execute(
                "UPDATE locations SET first_type = NULL, first_payload = NULL WHERE spot_id = ?",
                (spot_id,),
            )
            return True

        return self._write(clear)

    def lookup(self, spot_id: str) -> Location | None:
        """The current location of ``spot_id``, or ``None``."""

        def find(conn: sqlite3.Connection) -> Location | None:
            row = _one(conn, _SELECT_LOCATION, (spot_id,))
            return None if row is None else _location(row, self._now())

        return self._read(find)

    def release(self, spot_id: str, node: str, incarnation: int, authority_generation: int) -> bool:
        """Forget ``spot_id`` (it closed); refused for anyone but its current owner, and for
        an owner whose lease lapsed."""
        check_counters(incarnation, authority_generation)

        def forget(conn: sqlite3.Connection) -> bool:
            if self._writable(conn, spot_id, node, incarnation, authority_generation) is None:
                return False
            conn.execute("DELETE FROM locations WHERE spot_id = ?", (spot_id,))
            return True

        return self._write(forget)

    def transfer(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int, target: str,
        target_incarnation: int, keep_first: bool = False,
    ) -> Location:  # fmt: skip
        """See ``LocationStore.transfer``."""
        check_counters(incarnation, authority_generation, target_incarnation)

        def move(conn: sqlite3.Connection) -> Location:
            now = self._now()
            found = self._writable(conn, spot_id, node, incarnation, authority_generation)
            if found is None:
                raise Unavailable(f"{spot_id!r} has no location to transfer")
            to = _one(
                conn,
                "SELECT incarnation, lease_until FROM nodes"
                " WHERE node_id = ? AND incarnation = ? AND lease_until >= ?",
                (target, target_incarnation, now),
            )
            if to is None:
                raise no_target(spot_id, target, target_incarnation)
            self._check_claims(conn, now)
            conn.execute(
                "UPDATE locations SET owner_node = ?, owner_incarnation = ?,"
                " authority_generation = authority_generation + 1 WHERE spot_id = ?",
                (target, to[0], spot_id),
            )
            if not keep_first:  # (``LocationStore.transfer``)
                conn.execute(
                    "UPDATE locations SET first_type = NULL, first_payload = NULL"
                    " WHERE spot_id = ?",
                    (spot_id,),
                )
            return replace(
                found, owner_node=target, owner_incarnation=int(to[0]),
                authority_generation=found.authority_generation + 1,
                lease_until=float(to[1]), owner_live=True,
                first=found.first if keep_first else None,
            )  # fmt: skip

        return self._write(move)

    def _writable(
        self, conn: sqlite3.Connection, spot_id: str, node: str, incarnation: int,
        authority_generation: int,
    ) -> Location | None:  # fmt: skip
        """(In a write.) ``spot_id``'s location if ``node`` may write it (``None``: there is
        none); a stale owner, or one whose lease lapsed, is refused (raises)."""
        now = self._now()
        row = _one(conn, _SELECT_LOCATION, (spot_id,))
        if row is None:
            return None
        found = _location(row, now)
        check_fence(found, node, incarnation, authority_generation)
        if _one(conn, _LIVE, (node, incarnation, now)) is None:
            raise no_lease(node, incarnation)
        return found

    def _check_claims(self, conn: sqlite3.Connection, now: float) -> None:
        """Refuse a claim while the store waits out one lease after losing its data."""
        row = _one(conn, "SELECT value FROM meta WHERE key = 'claims_after'")
        if row is not None and now < float(row[0]):
            raise recovering(float(row[0]) - now)

    # -- the file -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every thread's connection; later calls are ``Unavailable`` (idempotent)."""
        with self._lock:
            self._closed = True
            idle = [conn for conn in self._connections if not conn.busy]
            for conn in idle:
                self._connections.discard(conn)
        for conn in idle:
            conn.close()

    def __enter__(self) -> SqliteLocationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction: committed whole, or rolled
        back whole (whatever it raised is raised; a SQLite failure as ``Unavailable``)."""
        conn = self._enter()
        try:
            self._same_file(conn)
            conn.execute("BEGIN IMMEDIATE")  # the write lock, or busy_timeout, then an error
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        self._discard(conn)  # closing it rolls back and frees the lock
                raise
            return result
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        finally:
            self._leave(conn)

    def _read(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body``, one statement in its own snapshot (WAL: it never waits for a writer)."""
        conn = self._enter()
        try:
            self._same_file(conn)
            return body(conn)
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        finally:
            self._leave(conn)

    def _same_file(self, conn: _Connection) -> None:
        """``Unavailable`` if the path no longer names the file ``conn`` opened (deleted or
        replaced): this thread's connection is dropped, and its next call opens the path
        again, checked (the schema made in a new file; tried again at each call while that
        fails: a review found a bare connection left on a file with no tables when the
        first try met the deleted file's WAL still held by another process)."""
        if _identity(self._path) == conn.file:
            return
        self._discard(conn)  # (this thread's next call opens the path again: ``_enter``)
        raise Unavailable(
            f"the location store file {self._path!r} was deleted or replaced since it was"
            " opened: what was written there is gone (the next call opens it again)"
        )

    def _enter(self) -> _Connection:
        """This thread's connection, marked in use; ``Unavailable`` once closed."""
        conn: _Connection | None = getattr(self._local, "conn", None)
        with self._lock:
            if self._closed:
                raise Unavailable(f"the location store {self._path!r} is closed")
            if conn is not None:
                conn.busy = True
                return conn
        try:
            conn = self._connect()  # this thread's first call: outside the lock
            if conn.file != self._file:  # the path names another file than the one opened
                conn.close()  # and checked (deleted or replaced: see ``_same_file``): it is
                conn = self._open_checked()  # checked first, its schema made if it is new
                with self._lock:
                    self._file = conn.file
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        except InvalidArgument as exc:  # (a file of another kind there now)
            raise Unavailable(f"the location store {self._path!r} cannot be used: {exc}") from exc
        with self._lock:
            if self._closed:
                conn.close()
                raise Unavailable(f"the location store {self._path!r} is closed")
            conn.busy = True
            orphans = [c for c in self._connections if c.idle_and_orphaned()]
            self._connections.difference_update(orphans)
            self._connections.add(conn)
        for orphan in orphans:  # left by threads that ended (short-lived status readers)
            orphan.close()
        self._local.conn = conn
        return conn

    def _leave(self, conn: _Connection) -> None:
        with self._lock:
            conn.busy = False
            closing = self._closed and conn in self._connections
            if closing:
                self._connections.discard(conn)
        if closing:  # close() came while this call ran: the connection ends with it
            conn.close()

    def _discard(self, conn: _Connection) -> None:
        """Close this thread's connection (it is in a state no call should meet); the
        thread's next call opens a new one."""
        self._local.conn = None
        with self._lock:
            self._connections.discard(conn)
        conn.close()

    def _connect(self) -> _Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,  # SQLite's busy timeout: how long a write waits
            isolation_level=None,  # no implicit transactions: BEGIN IMMEDIATE is ours
            check_same_thread=False,  # close() may come from another thread (never a call)
            factory=_Connection,
        )
        assert isinstance(conn, _Connection)
        conn.thread = threading.current_thread()
        conn.file = _identity(self._path)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_checked(self) -> _Connection:
        """The first connection: WAL mode, and the schema created or checked.

        Several node processes often open one fresh file at the same moment (``zlink run
        --nodes K``). Switching a file to WAL takes an exclusive lock, and SQLite answers
        "database is locked" there without waiting for its busy timeout; so the open is tried
        again, every few milliseconds, until ``busy_timeout`` has passed."""
        end = time.monotonic() + self._busy_timeout
        pause = 0.002
        while True:
            try:
                return self._open_once()
            except Unavailable as exc:
                locked = isinstance(exc.__cause__, sqlite3.OperationalError) and (
                    "locked" in str(exc.__cause__) or "busy" in str(exc.__cause__)
                )
                if not locked or time.monotonic() + pause > end:
                    raise
            time.sleep(pause)  # another process holds the lock for a moment: no event to wait on
            pause = min(pause * 2, 0.05)

    def _open_once(self) -> _Connection:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._refused(exc) from exc
        try:
            mode = _one(conn, "PRAGMA journal_mode=WAL")[0]
            if str(mode).lower() != "wal":
                raise InvalidArgument(
                    f"the location store {self._path!r} cannot use WAL mode (it stays {mode!r})"
                )
            self._prepare(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._refused(exc) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Create the schema in an empty file, or check the one there (one transaction)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {
                row[0]
                for row in _rows(
                    conn, "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            }
            if "meta" not in tables:
                if tables:
                    raise InvalidArgument(
                        f"{self._path!r} is a SQLite database but not a ZLink location store"
                        f" (it has {', '.join(sorted(tables))})"
                    )
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
                base = _micros(self._now())  # every counter starts there: an incarnation
                conn.executemany(  # below it is from before this file, which knows none
                    "INSERT INTO counters (name, value) VALUES (?, ?)",
                    [("object_generation", base), ("incarnation", base)],
                )
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('incarnation_base', ?)", (str(base),)
                )
            else:
                self._check_version(conn, tables)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _check_version(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        try:
            row = _one(conn, "SELECT value FROM meta WHERE key = 'schema_version'")
        except sqlite3.OperationalError as exc:  # a "meta" table of some other shape
            raise InvalidArgument(
                f"{self._path!r} is a SQLite database but not a ZLink location store ({exc})"
            ) from exc
        if row is None:
            raise InvalidArgument(
                f"{self._path!r} is a SQLite database but not a ZLink location store"
                " (no schema_version)"
            )
        if row[0] != str(SCHEMA_VERSION):
            raise InvalidArgument(
                f"the location store {self._path!r} has schema version {row[0]!r}; this ZLink"
                f" reads version {SCHEMA_VERSION} only"
            )
        missing = _TABLES - tables
        if missing:
            raise InvalidArgument(
                f"the location store {self._path!r} lacks the tables {', '.join(sorted(missing))}"
            )

    def _refused(self, exc: sqlite3.Error) -> InvalidArgument | Unavailable:
        """A failure while opening: a path that can never work is InvalidArgument."""
        reason = _NOT_A_STORE.get(getattr(exc, "sqlite_errorcode", -1) & 0xFF)
        if reason is None:
            return self._failed(exc)
        return InvalidArgument(f"the location store {self._path!r} {reason} ({exc})")

    def _failed(self, exc: sqlite3.Error) -> Unavailable:
        return Unavailable(f"the location store {self._path!r} failed: {exc}")


def _location(row: Any, now: float) -> Location:
    """A ``_SELECT_LOCATION`` row as it is at ``now`` (the store's clock)."""
    (spot_id, kind, type_name, owner, incarnation, authority, generation, first_type,
     first_payload, lease_until) = row  # fmt: skip
    until = float(lease_until)  # a REAL may come back as an int when it is whole
    first = None if first_type is None else (str(first_type), str(first_payload))
    return Location(spot_id, kind, type_name, owner, incarnation, authority, generation, until,
                    until >= now and until > 0.0, first)  # fmt: skip


def _record(row: Any) -> NodeRecord:
    node_id, endpoint, incarnation, lease_until = row
    return NodeRecord(node_id, endpoint, incarnation, float(lease_until))


def _location_row(location: Location) -> tuple[Any, ...]:
    """The ``locations`` columns of ``location``, in ``_LOCATION`` order."""
    return (
        location.spot_id,
        location.kind,
        location.type_name,
        location.owner_node,
        location.owner_incarnation,
        location.authority_generation,
        location.object_generation,
        None if location.first is None else location.first[0],
        None if location.first is None else location.first[1],
    )


def _record_row(record: NodeRecord) -> tuple[Any, ...]:
    """The ``nodes`` columns of ``record``, in ``_NODE`` order."""
    return (record.node_id, record.endpoint, record.incarnation, record.lease_until)
