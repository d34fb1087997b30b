"""The time source of a node, injected so that tests drive time by hand.

Guarantees: ``now()`` never goes backwards. A clock that jumps (the manual clock of
``zlink.testing``) tells its listeners, so that the infrastructure thread re-reads its deadlines;
a real clock never needs to, and ``real_wait`` turns a deadline into a thread wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """What the engine needs from time: a monotonic reading and a way to wait for a deadline."""

    def now(self) -> float:
        """Seconds on this clock's monotonic scale."""
        ...

    def real_wait(self, deadline: float) -> float | None:
        """Real seconds a thread may sleep before ``deadline`` could have passed.

        ``None`` means: sleep until woken, because this clock moves only when told to and wakes
        its listeners when it does.
        """
        ...

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Register ``callback`` to be called (on the thread that moved time) after a jump."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    __slots__ = ()

    now = staticmethod(time.monotonic)  # the C function itself: read once per turn

    def real_wait(self, deadline: float) -> float | None:
        return max(0.0, deadline - time.monotonic())

    def add_listener(self, callback: Callable[[], None]) -> None:
        """A real clock never jumps, so it never calls ``callback``."""
