"""Shared fixtures: nodes that always shut down, a manual clock, and a Redis server."""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import zlink
from tests.redis_server import NO_SERVER, REDIS_SERVER, RedisServer
from zlink.executor import lockorder
from zlink.messaging import calls
from zlink.testing import ManualClock

WAIT = 5.0  # real seconds any test waits for an event or a result before failing

# The processes the tests start (node processes, ``zlink run``, clients: hundreds a run) keep
# their bytecode in a folder of their own outside the tree: where the environment says
# PYTHONDONTWRITEBYTECODE (this machine's does), each compiled zlink from source as it
# started, ~0.25 s a start, a sixth of the mesh tests' time.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault(
    "PYTHONPYCACHEPREFIX", str(pathlib.Path(tempfile.gettempdir()) / "zlink-test-pycache")
)


def warns_unended(match: str = "never given a terminal") -> contextlib.AbstractContextManager[Any]:
    """``pytest.warns`` of a call collected without a terminal, where calls warn of it: not
    where ``zlink.messaging.calls`` runs as Python on the free-threaded build (``WATCHED``)."""
    if calls.WATCHED:
        return pytest.warns(RuntimeWarning, match=match)
    return contextlib.nullcontext()


def until(check: Callable[[], Any], what: str, timeout: float = 2 * WAIT) -> None:
    """Poll ``check`` (another thread's state, with no event to wait on) until it is true;
    fails after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.002)


def fill(submit: Callable[[int], object], most: int = 1000) -> int:
    """Call ``submit(n)`` for n = 0, 1, ... until it is refused (``ResourceExhausted``: a
    full lane), at most ``most`` times; how many went in."""
    for n in range(most):
        try:
            submit(n)
        except zlink.ResourceExhausted:
            return n
    raise AssertionError(f"{most} went in, and none was refused")


def infra_sync(node: zlink.Node, rounds: int = 2) -> None:
    """Until what ``node``'s infrastructure thread had queued has run (``rounds`` over)."""
    for _ in range(rounds):
        passed = threading.Event()
        node._infra.submit(passed.set)
        assert passed.wait(WAIT)


def held_at(
    node: zlink.Node, kind: type[Any], holds: Callable[[Any], bool] = lambda env: True
) -> tuple[threading.Event, Callable[[], None]]:
    """``node`` holds the envelopes of class ``kind`` that reach it and ``holds`` picks (the
    rest go on); returns an event set as the first is held, and a call that lets them go
    on, as they came, ahead of any that came after.

    The release runs on the node's infrastructure thread, where envelopes are dispatched:
    done from the test's thread, an envelope already handed to that thread but not yet
    dispatched met the restored handler and went ahead of the held ones (a test's [2, 1])."""
    router = node._runtime.router
    handle = router._handlers[kind]
    held: list[Any] = []
    at = threading.Event()

    def hold(env: Any) -> None:
        if not holds(env):
            handle(env)
            return
        held.append(env)
        at.set()

    def release() -> None:
        router._handlers[kind] = handle
        for env in held:
            handle(env)

    def go() -> None:
        node._infra.submit(release)

    router._handlers[kind] = hold
    return at, go


def hold_transfer(store: Any, spot_id: str) -> tuple[threading.Event, threading.Event]:
    """The store's first ``transfer`` of ``spot_id`` (a move's commit) waits, at most
    ``4 * WAIT``, until the second event returned is set; the first is set as it starts
    waiting (the target restored the move; the source asks the store to commit it)."""
    real = store.transfer
    entered, go = threading.Event(), threading.Event()

    def transfer(target: str, *rest: Any) -> Any:
        if target == spot_id and not entered.is_set():
            entered.set()
            assert go.wait(4 * WAIT)
        return real(target, *rest)

    store.transfer = transfer
    return entered, go


def refuse_renewals(store: Any, node_id: str) -> None:
    """Make ``store`` refuse ``node_id``'s lease renewals (``Unavailable``), as a store too
    slow for that node would; other nodes renew as before."""
    real = store.renew_node

    def refuse(renewing: str, *args: object) -> object:
        if renewing == node_id:
            raise zlink.Unavailable(f"the store is slow for {node_id}")
        return real(renewing, *args)

    store.renew_node = refuse


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def redis_server(tmp_path: pathlib.Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of this test's own on 127.0.0.1, empty, stopped when the test ends
    however it ends; the test is skipped where no ``redis-server`` is installed."""
    if REDIS_SERVER is None:
        pytest.skip(NO_SERVER)
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def make_node(clock: ManualClock) -> Iterator[Callable[..., zlink.Node]]:
    """``make_node(app, **config)`` starts a node on the manual clock; all are shut down."""
    nodes: list[zlink.Node] = []

    def make(app: zlink.App, **config: Any) -> zlink.Node:
        config.setdefault("workers", 2)
        node = zlink.Node(app, zlink.NodeConfig(**config), clock=clock)
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        node.shutdown(timeout=WAIT)


@pytest.fixture(autouse=True)
def _lock_order() -> Iterator[None]:
    """Every test runs with ranked locks checked; any acquisition against the order fails it
    (``zlink.lock_order``), also one made on a worker or infrastructure thread."""
    lockorder.reset()
    with lockorder.checking():
        yield
    found = lockorder.violations()
    assert not found, "lock order violated:\n" + "\n".join(found)
