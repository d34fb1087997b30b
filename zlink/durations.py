"""Durations given by users: validated once, at the call site (python-api §9).

A leaf: imports only ``zlink.errors``.
"""

from __future__ import annotations

from .errors import InvalidArgument


def check_seconds(value: object, what: str, *, zero_ok: bool = False) -> float:
    """A duration: a real number of seconds, positive (or >= 0 with ``zero_ok``), not a bool."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not (value >= 0 if zero_ok else value > 0):  # type: ignore[operator]
        bound = ">= 0" if zero_ok else "positive"
        raise InvalidArgument(f"{what} is a {bound} number of seconds, got {value!r}")
    return float(value)  # type: ignore[arg-type]
