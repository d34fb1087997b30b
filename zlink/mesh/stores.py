"""Which Location Store a node uses, named by a URL (python-api §10, ``NodeConfig(store=...)``).

Guarantees / assumes:
* ``"memory"``: the in-memory store, for the nodes of one process (the embedded default).
* ``"sqlite:///PATH"``: a SQLite file shared by the node processes of one machine. As in
  SQLAlchemy, the path is what follows ``sqlite:///``: ``sqlite:///data/main.db`` is relative to
  the working directory (made absolute when the store opens), ``sqlite:////var/lib/main.db`` is
  absolute. The file is checked when the store opens (``SqliteLocationStore``).
* ``"redis://HOST:PORT/DB"`` (several machines) is planned as an extra and refused for now.
* A SQLite URL takes no ``?options``, and no ``:memory:`` (it would not be shared).
* Any other URL is ``InvalidArgument`` naming the accepted forms; nothing is opened.
* ``clock`` is the store's clock for leases: ``None`` means the store's own default (monotonic
  in memory, wall clock in a file that outlives processes); tests pass a manual clock.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..executor import Clock
from .location import InMemoryLocationStore, LocationStore
from .sqlite_store import SqliteLocationStore

_SQLITE = "sqlite:///"
_FORMS = '"memory", "sqlite:///relative/path.db" or "sqlite:////absolute/path.db"'


def open_store(url: str, clock: Clock | None = None) -> LocationStore:
    """The Location Store that ``url`` names (see the module docstring)."""
    if url == "memory":
        return InMemoryLocationStore(clock)
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        if url[: len(_SQLITE)].lower() != _SQLITE:
            raise InvalidArgument(
                f"a SQLite store URL is sqlite:/// then a path (no host): {url!r}; use {_FORMS}"
            )
        path = url[len(_SQLITE) :]
        if not path or path == ":memory:":
            raise InvalidArgument(
                f"a SQLite store URL names a file after sqlite:///: {url!r}"
                ' (one process: use "memory")'
            )
        if "?" in path:  # SQLAlchemy would read options there; a file name has none here
            raise InvalidArgument(f"a SQLite store URL takes no options: {url!r}")
        return SqliteLocationStore(path, clock)
    if scheme in ("redis", "rediss"):
        raise InvalidArgument(
            f"the Redis location store is not built yet (it is planned as an extra): {url!r};"
            f" use {_FORMS}"
        )
    raise InvalidArgument(f"unknown location store {url!r}; use {_FORMS}")
