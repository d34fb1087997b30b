"""A completion's outcome is written before its done flag: ``Admitted.wait_admitted`` and the
router read both without its lock (python-api §9: a send told "no room in time" was not
queued; a peer's send that fails is counted as dropped at both ends)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from zlink.errors import DeadlineExceeded
from zlink.messaging.completion import Admitted, Completion


def _states_seen_while_set(room: Completion, error: BaseException) -> list[tuple[bool, Any]]:
    """(done, error) as a reader without the lock sees them at every line of ``set``."""
    seen: list[tuple[bool, Any]] = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            seen.append((room.done, room.error))
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is Completion.set.__code__ else None

    sys.settrace(tracer)
    try:
        assert room.set(None, error)
    finally:
        sys.settrace(None)
    seen.append((room.done, room.error))
    return seen


def test_a_failing_outcome_is_never_seen_as_done_without_its_error() -> None:
    error = DeadlineExceeded("no room in time; nothing was queued")
    seen = _states_seen_while_set(Admitted(), error)
    assert (True, None) not in seen
    assert seen[-1] == (True, error)


def test_wait_admitted_raises_the_error_it_completed_with() -> None:
    room = Admitted()
    room.set(None, DeadlineExceeded("no room in time"))
    try:
        room.wait_admitted(1)
    except DeadlineExceeded:
        pass
    else:  # pragma: no cover - the fault this guards against
        raise AssertionError("a send refused for want of room was reported as admitted")
