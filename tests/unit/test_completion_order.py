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


def test_a_deadline_counts_its_timeout_before_the_caller_hears_of_it():
    """``expire``'s counter (``calls_timed_out``, ``worker_calls_timed_out``) is counted before
    any waiter or callback of the call hears of the ``DeadlineExceeded``: counted after, a
    caller that read the node's counters on its timeout sometimes found none (3.13t CI)."""
    from zlink.messaging.completion import expire

    call = Completion()
    seen: list[str] = []
    call.add_callback(lambda _value, error: seen.append(type(error).__name__))
    expire(call, "too late", lambda: seen.append("counted"))
    assert seen == ["counted", "DeadlineExceeded"]
    expire(call, "again", lambda: seen.append("counted twice"))  # done: nothing, no count
    assert seen == ["counted", "DeadlineExceeded"]
    assert isinstance(call.error, DeadlineExceeded)
