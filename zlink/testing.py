"""Test helpers: a manual clock and waiting for a node to go idle (python-api §7).

Tests never sleep to wait for the runtime: they move the clock by hand and wait on events,
futures or :func:`run_until_idle`, each with a timeout.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from .app import App
from .config import NodeConfig
from .errors import InvalidArgument
from .mesh.location import InMemoryLocationStore
from .mesh.transport import InProcessTransport
from .node import Node


class ManualClock:
    """A clock that moves only when told to; the node's infrastructure thread follows it."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        return self._now

    def real_wait(self, deadline: float) -> float | None:
        return None  # wait until advance() wakes us

    def add_listener(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(callback)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and let due deadlines fire."""
        if not math.isfinite(seconds) or seconds < 0:  # inf or nan would break the node clock
            raise InvalidArgument(f"a clock moves forward a finite number of seconds: {seconds!r}")
        with self._lock:
            self._now += seconds
            listeners = list(self._listeners)
        for cb in listeners:
            cb()


class LocalCluster:
    """Several nodes of one app in this process, sharing a store, a transport and a clock.

    ``with LocalCluster(app, nodes=3, clock=clock, workers=2) as cluster: cluster.node(0)``.
    Extra keyword arguments become ``NodeConfig`` fields of every node.

    On a ``ManualClock`` the node leases last an hour unless ``lease_seconds`` is given: a
    test that moves the clock to fire a deadline does not mean every lease to lapse (they
    would: the store measures leases on the same clock, python-api §10 "Failure"). A lease
    test names its lease and moves the clock in steps of at most a quarter of it, letting
    the nodes renew in between (``wait_idle``).
    """

    def __init__(
        self, app: App, nodes: int = 2, *, clock: ManualClock | None = None,
        data_limit: int = 1024, **config: Any,
    ) -> None:  # fmt: skip
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.store = InMemoryLocationStore(clock)  # leases on the cluster's clock
        if clock is not None:
            config.setdefault("lease_seconds", 3600.0)
        data_bytes = config.get(
            "data_bytes_in_flight", NodeConfig.model_fields["data_bytes_in_flight"].default
        )  # (the nodes' own setting: the transport is what holds them to it)
        self.transport = InProcessTransport(data_limit, data_bytes)  # in flight per pair
        self.nodes = [
            Node(
                app,
                NodeConfig(node_id=f"node-{i + 1}", **config),
                clock=clock,
                store=self.store,
                transport=self.transport,
            )
            for i in range(nodes)
        ]

    def node(self, index: int) -> Node:
        """The ``index``-th node (0-based)."""
        return self.nodes[index]

    def start(self) -> LocalCluster:
        for node in self.nodes:
            node.start()
        return self

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until every node is idle at once (work may hop between them)."""
        for _ in range(3):
            for node in self.nodes:
                run_until_idle(node, timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        for node in self.nodes:
            node.shutdown(timeout)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def run_until_idle(node: Node, timeout: float = 5.0, busy: int = 0) -> None:
    """Wait until ``node`` has nothing runnable but ``busy`` items a test keeps blocked.

    ``TimeoutError`` after ``timeout`` real seconds.
    """
    if not node.wait_idle(timeout, busy):
        raise TimeoutError(f"{node!r} did not go idle within {timeout} s")
