"""Node counters: late replies, handler errors, rejected admissions (python-api §5)."""

from __future__ import annotations

import threading


class Metrics:
    """Counters bumped off the hot path; ``_lock`` keeps increments exact on every build."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def get(self, name: str) -> int:
        """The counter ``name`` (0 if never bumped)."""
        return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counts)
