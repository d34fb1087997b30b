"""A once-only completion shared by a call, its timeout and its reply route.

Guarantees / assumes:
* ``_lock`` protects ``_done``, the outcome, ``_callbacks`` and ``_waiter``. Callbacks and the
  waiter's wake-up run after it is released, on the thread that completed the call.
* A call completes exactly once: the first ``set`` wins; a later one (a late reply after the
  timeout, say) returns ``False`` so the caller can count it (python-api §5).
* ``wait`` blocks only the calling thread, on a private lock made on demand.
"""

from __future__ import annotations

import concurrent.futures
import copy
import threading
from collections.abc import Callable
from typing import Any

from ..errors import DeadlineExceeded
from ..executor import DeadlineHandle

Callback = Callable[[Any, BaseException | None], object]


class Completion:
    """The outcome of one call: a value or an error, set once, observed many ways."""

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_value", "_waiter", "timer")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callback] | None = None
        self._waiter: threading.Lock | None = None
        self.timer: DeadlineHandle | None = None  # the deadline on the infrastructure heap

    @property
    def done(self) -> bool:
        """Whether the outcome is set."""
        return self._done

    @property
    def error(self) -> BaseException | None:
        """The error it completed with; ``None`` while it is not done, or done with a value."""
        return self._error

    def set(
        self, value: Any, error: BaseException | None, won: Callable[[], object] | None = None
    ) -> bool:
        """Set the outcome; ``False`` (and nothing happens) if it was already set. ``won``:
        called once this call set it, before any waiter or callback hears of it (a counter
        of why it ended is then already counted when the caller sees the outcome)."""
        lock = self._lock
        lock.acquire()  # not ``with``: every call completes one of these
        try:
            if self._done:
                return False
            # the outcome first, then the flag: ``wait_admitted`` and the router read both
            # without the lock, and must never see it done with no error while one is set
            self._value, self._error = value, error
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
            waiter = self._waiter
        finally:
            lock.release()
        if won is not None:
            won()
        timer = self.timer
        if timer is not None:
            timer.cancel()
        if waiter is not None:
            waiter.release()
        if callbacks:
            for cb in callbacks:
                cb(value, error)
        return True

    def add_callback(self, cb: Callback) -> None:
        """Call ``cb(value, error)`` once the outcome is set (now, if it already is)."""
        lock = self._lock
        lock.acquire()
        try:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [cb]
                else:
                    self._callbacks.append(cb)
                return
        finally:
            lock.release()
        cb(self._value, self._error)

    def wait(self, timeout: float | None) -> Any:
        """Block the calling thread for the outcome; ``DeadlineExceeded`` after ``timeout``."""
        with self._lock:
            waiter = None
            if not self._done:
                if self._waiter is None:
                    self._waiter = threading.Lock()
                    self._waiter.acquire()
                waiter = self._waiter
        if waiter is not None:
            if not waiter.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
                raise DeadlineExceeded(f"no result within {timeout} s of waiting")
            waiter.release()  # let any other waiter through
        if self._error is not None:
            raise own_error(self._error)
        return self._value

    def future(self) -> concurrent.futures.Future[Any]:
        """A ``concurrent.futures.Future`` that mirrors this completion."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()

        def mirror(value: Any, error: BaseException | None) -> None:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

        self.add_callback(mirror)
        return fut


# (seconds) what a wait for admission gives an outcome already on its way when its own time
# is up: a moment, for one being set on another thread of this process right now (a wait
# returns by its deadline, python-api §11: 0.1 s here had a client's ``wait(0.001)`` return
# after 0.102 s); a frame to another process without a verdict by then is the other end's to
# decide (``Admitted.wait_admitted``)
ON_ITS_WAY = 0.002


def in_progress() -> bool:
    """``Admitted.withdraw`` while a waiter is being admitted: it can no longer be withdrawn
    (its outcome is on its way)."""
    return False


class Admitted(Completion):
    """Completes (with ``None``) when a send waiting for room is admitted (python-api §9).

    ``withdraw`` is set by whoever queued the wait: it takes the waiter back and says whether
    it still waited. ``abandon`` ends the wait with an error only then: a send the lane took
    meanwhile succeeds, so a caller told "no room in time" never has its message queued.
    """

    __slots__ = ("deadline", "peer", "withdraw")

    def __init__(self, deadline: float | None = None, peer: str | None = None) -> None:
        super().__init__()
        self.withdraw: Callable[[], bool] | None = None
        self.deadline = deadline  # seconds to wait for room; None: the node's default
        self.peer = peer  # a call that came from this node: its wait is bounded per peer

    def abandon(self, error: BaseException) -> bool:
        """Fail the wait with ``error`` if the message was not admitted; ``False`` if it was."""
        withdraw = self.withdraw
        if withdraw is not None and not withdraw():
            return False  # admitted (or ended) first: its own outcome stands
        return self.set(None, error)

    def wait_admitted(self, timeout: float | None) -> None:
        """Block until admitted; ``DeadlineExceeded`` (nothing queued) after ``timeout`` real
        seconds, or the node's admission deadline, whichever comes first.

        A send that can no longer be withdrawn when the wait ends has its outcome on its way
        (it left for another node, or a client's node, which decides): that outcome if it
        comes within a moment more (``ON_ITS_WAY``), else ``DeadlineExceeded`` saying it may
        still be admitted. A wait returns by its deadline (python-api §11), whatever the node
        at the other end does; its verdict, if it comes later, is that node's."""
        if self._done and self._error is None:  # admitted at once (the common case): no lock
            return
        try:
            self.wait(timeout)
        except DeadlineExceeded as exc:
            if self.abandon(exc):
                raise
            try:
                self.wait(ON_ITS_WAY)  # admitted (or failed) as we gave up: that outcome
                return
            except DeadlineExceeded:
                if self._done:
                    self.wait(0)  # its own outcome, come meanwhile: returned, or raised
                    return
            raise DeadlineExceeded(
                f"the send left, and no verdict on it came within {timeout} s of waiting:"
                " it may still be admitted"
            ) from None


def own_error(error: BaseException) -> BaseException:
    """``error`` to raise in one waiting thread: a copy of its own (same type, text, cause,
    and the origin's traceback to start from), so that callers failed together with one
    error (a close, a lost connection, a stop) do not raise one object whose traceback grows
    with every raise and holds every thread's frames (a client probe: 900 frames in one
    caller's). ``error`` itself where it does not copy (a constructor that takes other
    arguments than its ``args``)."""
    try:
        own = copy.copy(error)
    except Exception:  # noqa: BLE001 - raised as it is then
        return error
    if type(own) is not type(error):
        return error
    own.__cause__, own.__context__ = error.__cause__, error.__context__
    own.__suppress_context__ = error.__suppress_context__
    return own.with_traceback(error.__traceback__)


def expire(
    completion: Completion, reason: BaseException | str,
    counted: Callable[[], object] | None = None,
) -> None:  # fmt: skip
    """The infrastructure deadline of a call: fail it unless it already completed.

    ``reason`` is the error, or the text of a ``DeadlineExceeded`` made only if it fires (most
    deadlines are cancelled by their reply, so most never need the exception object).
    ``counted``: called once if this failed it (the node's ``calls_timed_out``), before the
    caller hears of it: counted after, a caller that read the counters on its
    ``DeadlineExceeded`` sometimes found none (3.13t CI).
    """
    if not completion.done:
        error = reason if isinstance(reason, BaseException) else DeadlineExceeded(reason)
        completion.set(None, error, counted)
