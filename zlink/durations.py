"""Durations given by users: validated once, at the call site (python-api §9 "Durations").

Every ``timeout``/``interval``/``deadline`` argument is a finite number of seconds within
``MIN_SECONDS .. MAX_SECONDS``; anything else is ``InvalidArgument`` where it is given, so that
no value the deadline heap (or a thread wait) cannot hold ever reaches the infrastructure thread.

A leaf: imports only ``zlink.errors``.
"""

from __future__ import annotations

import math

from .errors import InvalidArgument

MIN_SECONDS = 1e-3
MAX_SECONDS = 1e7


def poll_ms(seconds: float) -> int:
    """A wait of ``seconds`` as whole milliseconds for a socket poll, rounded up (a wait for a
    deadline that ended early would spin on ``poll(0)`` until it is due); never negative."""
    return max(0, math.ceil(seconds * 1000))


def check_seconds(value: object, what: str, *, zero_ok: bool = False) -> float:
    """A duration (python-api §9): a real number of seconds within ``1e-3 .. 1e7``, not a bool;
    with ``zero_ok`` also exactly 0 (where the API gives 0 a meaning: "at once")."""
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        if zero_ok and value == 0:
            return 0.0
        if MIN_SECONDS <= value <= MAX_SECONDS:  # False for nan and for +-inf
            return float(value)
    zero = " (or 0)" if zero_ok else ""
    raise InvalidArgument(
        f"{what} is a finite number of seconds within {MIN_SECONDS:g} .. {MAX_SECONDS:g}{zero},"
        f" got {value!r}"
    )


def check_timeout(value: object, what: str) -> float | None:
    """A blocking wait's limit (python-api §9): ``None`` (no limit) or :func:`check_seconds`."""
    return None if value is None else check_seconds(value, what)
