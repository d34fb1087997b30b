"""Which Location Store a node uses, named by a URL (python-api §10, ``NodeConfig(store=...)``).

Guarantees / assumes:
* ``"memory"``: the in-memory store, for the nodes of one process (the embedded default).
* ``"sqlite:///PATH"``: a SQLite file shared by the node processes of one machine. As in
  SQLAlchemy, the path is what follows ``sqlite:///``: ``sqlite:///data/main.db`` is relative to
  the working directory (made absolute when the store opens), ``sqlite:////var/lib/main.db`` is
  absolute. The file is checked when the store opens (``SqliteLocationStore``).
* ``"redis://HOST[:PORT][/DB]"`` or ``"rediss://..."`` (TLS): one Redis server shared by the
  node processes of several machines (``RedisLocationStore``; user and password may come in the
  URL). It needs the ``redis`` extra (``pip install 'zlink[redis]'``); without it the URL is
  ``InvalidArgument`` saying so (redis-py is imported only here). The server is asked at once:
  one that does not answer is ``Unavailable``.
* A SQLite URL takes no ``?options``, and no ``:memory:`` (it would not be shared); a Redis URL
  names its host and takes no ``?options`` either (a bad one is ``InvalidArgument``).
* Any other URL is ``InvalidArgument`` naming the accepted forms; nothing is opened.
* ``clock`` is the store's clock for leases: ``None`` means the store's own default (monotonic
  in memory, wall clock in a file that outlives processes, the server's clock in Redis); tests
  pass a manual clock.
"""

from __future__ import annotations

import os

from ..errors import InvalidArgument
from ..executor import Clock
from .location import InMemoryLocationStore, LocationStore
from .sqlite_store import SqliteLocationStore

_SQLITE = "sqlite:///"
_FORMS = (
    '"memory", "sqlite:///relative/path.db", "sqlite:////absolute/path.db" or'
    ' "redis://HOST:PORT/DB"'
)


def shown_url(url: str) -> str:
    """``url`` as it may be printed or logged: without the user and password a Redis URL may
    carry (``redis://:PASSWORD@HOST:PORT/DB``); an operator who keeps it out of ``ps`` in
    ``ZLINK_STORE`` must not find it in the journal either."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path}"


def open_store(url: str, clock: Clock | None = None, *, existing: bool = False) -> LocationStore:
    """The Location Store that ``url`` names (see the module docstring). ``existing``: one
    that is there already, to look at (``zlink mesh``): never made here, so a typo'd path
    is ``InvalidArgument``, not an empty store; nor "memory", a store of this process only."""
    if url == "memory":
        if existing:
            raise InvalidArgument(
                '"memory" is a store of one process: give the URL of the mesh\'s own store'
                " (sqlite:///PATH or redis://HOST:PORT/DB)"
            )
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
        if existing and not os.path.isfile(path):
            raise InvalidArgument(f"no Location Store at {path!r}")
        return SqliteLocationStore(path, clock)
    if scheme in ("redis", "rediss"):
        try:
            from .redis_store import RedisLocationStore
        except ModuleNotFoundError as exc:
            if exc.name != "redis":
                raise
            raise InvalidArgument(
                "the Redis location store needs redis-py: pip install 'zlink[redis]'"
            ) from exc
        return RedisLocationStore(url, clock, existing=existing)
    raise InvalidArgument(f"unknown location store {shown_url(url)!r}; use {_FORMS}")
