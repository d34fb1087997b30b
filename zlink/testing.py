"""Test helpers: a manual clock and waiting for a node to go idle (python-api §7).

Tests never sleep to wait for the runtime: they move the clock by hand and wait on events,
futures or :func:`run_until_idle`, each with a timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

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
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        with self._lock:
            self._now += seconds
            listeners = list(self._listeners)
        for cb in listeners:
            cb()


def run_until_idle(node: Node, timeout: float = 5.0, busy: int = 0) -> None:
    """Wait until ``node`` has nothing runnable but ``busy`` items a test keeps blocked.

    ``TimeoutError`` after ``timeout`` real seconds.
    """
    if not node.wait_idle(timeout, busy):
        raise TimeoutError(f"{node!r} did not go idle within {timeout} s")
