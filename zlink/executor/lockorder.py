"""Ranked locks, and a debug mode that fails on any acquisition against the rank order.

Guarantees / assumes:
* Every lock that another lock may be taken under is made with :func:`ranked_lock` and a rank
  (``zlink.lock_order.LockRank`` holds the house's table). A thread may take a lock only while
  every lock it already holds has a *lower* rank; re-entering an ``RLock`` it holds is fine.
  That one rule makes a deadlock between these locks impossible (no cycle can form).
* Off by default: :func:`ranked_lock` returns a plain ``threading.Lock`` / ``RLock``, so the
  hot path pays nothing. With ``ZLINK_LOCK_ORDER=1`` in the environment, or inside
  :func:`checking`, locks made from then on are :class:`CheckedLock` wrappers that keep, per
  thread, the stack of ranked locks held (a debugging tool, not turn state, so a
  ``threading.local`` is right here), record every acquisition edge and every violation, and
  raise :class:`LockOrderViolation` at the offending acquisition (before it blocks).
* The test suite turns it on for every test and fails a test that recorded a violation, so a
  path that only runs under load still cannot take two locks in the wrong order unseen.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = [
    "CheckedLock",
    "LockLike",
    "LockOrderViolation",
    "checking",
    "edges",
    "held",
    "ranked_lock",
    "reset",
    "violations",
]


class LockOrderViolation(AssertionError):
    """A lock was taken while a lock of the same or a higher rank was held."""


class LockLike(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: object) -> None: ...


_enabled = os.environ.get("ZLINK_LOCK_ORDER", "") not in ("", "0")
_held = threading.local()  # .stack: list[CheckedLock] held by this thread, in order
_record_lock = threading.Lock()
_violations: list[str] = []
_edges: set[tuple[str, str]] = set()


def ranked_lock(name: str, rank: int, *, reentrant: bool = False) -> Any:
    """A lock of ``rank`` (lower ranks are taken first); checked when checking is on."""
    if _enabled:
        return CheckedLock(name, rank, reentrant)
    return threading.RLock() if reentrant else threading.Lock()


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Locks made inside this block are checked (nodes started in it check their order)."""
    global _enabled
    before, _enabled = _enabled, True
    try:
        yield
    finally:
        _enabled = before


def held() -> list[str]:
    """The names of the checked locks the calling thread holds, oldest first."""
    return [lock.name for lock in getattr(_held, "stack", None) or []]


def violations() -> list[str]:
    """Every violation recorded since the last :func:`reset`, oldest first."""
    with _record_lock:
        return list(_violations)


def edges() -> set[tuple[str, str]]:
    """Every (held, then taken) pair of lock names seen since the last :func:`reset`."""
    with _record_lock:
        return set(_edges)


def reset() -> None:
    with _record_lock:
        _violations.clear()
        _edges.clear()


class CheckedLock:
    """A ``Lock`` or ``RLock`` that checks the rank order on every acquisition."""

    __slots__ = ("_depth", "_lock", "_owner", "name", "rank", "reentrant")

    def __init__(self, name: str, rank: int, reentrant: bool) -> None:
        self.name = name
        self.rank = rank
        self.reentrant = reentrant
        self._lock = threading.RLock() if reentrant else threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def _check(self) -> None:
        stack: list[CheckedLock] = getattr(_held, "stack", None) or []
        if self.reentrant and self._owner == threading.get_ident():
            return  # re-entry of a held RLock takes nothing new
        bad = [h for h in stack if h.rank >= self.rank]
        with _record_lock:
            for h in stack:
                _edges.add((h.name, self.name))
            if bad:
                text = (
                    f"lock order: took {self.name!r} (rank {self.rank}) while holding "
                    + ", ".join(f"{h.name!r} (rank {h.rank})" for h in bad)
                )
                _violations.append(text)
        if bad:
            raise LockOrderViolation(text)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._check()
        if not self._lock.acquire(blocking, timeout):
            return False
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        self._owner, self._depth = me, 1
        stack = getattr(_held, "stack", None)
        if stack is None:
            stack = _held.stack = []
        stack.append(self)
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            stack: list[CheckedLock] = _held.stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is self:
                    del stack[i]
                    break
        self._lock.release()

    def locked(self) -> bool:
        return self._owner is not None

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<CheckedLock {self.name} rank={self.rank}>"
