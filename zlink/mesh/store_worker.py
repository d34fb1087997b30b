"""The store's own thread: Location Store calls off the infrastructure thread, never blocking it.

Guarantees / assumes:
* ``call`` never blocks: it queues the store call and returns a ``Completion``. One thread runs
  the calls in order (a store over a network may take milliseconds, or fail for seconds), and
  hands each outcome to ``post`` (the node's infrastructure ``submit``), so continuations run on
  the infrastructure thread and a slow store delays only the work that needs the store.
* A store call's exception becomes the completion's error; the thread never dies of one.
* No lock of the runtime is held on this thread; the queue's own lock is a leaf.
* Once ``stop`` is asked, a call fails at once with ``Unavailable`` (posted as any outcome):
  a ledger audit found a stopping node, still on the transport, ask the store where a relayed
  send goes after this thread had ended, and the send waited for an answer for good, never
  handled and never counted.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ..errors import Unavailable
from ..messaging.completion import Completion

_STOP = object()


class StoreWorker:
    """One node's store thread (see the module docstring)."""

    def __init__(self, name: str, post: Callable[..., None]) -> None:
        self._post = post
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._quiet = threading.Condition()  # a leaf lock: ``_in_flight`` and ``_stopped``
        self._in_flight = 0  # calls queued or running, until their outcome is posted
        self._stopped = False  # (then nothing is queued after the thread's last item)

    def start(self) -> None:
        """Start the thread (the node's start); calls queued before it wait for it."""
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Completion:
        """Run ``fn(*args)`` on the store thread; the completion is set on the infra thread."""
        done = Completion()
        with self._quiet:
            stopped = self._stopped
            if not stopped:
                self._in_flight += 1
                self._queue.put((fn, args, done))
        if stopped:
            self._post(done.set, None, Unavailable("the node's store thread has stopped"))
        return done

    @property
    def busy(self) -> bool:
        """Whether a call is queued or running (its outcome not yet handed on)."""
        return self._in_flight > 0

    def wait_quiet(self, timeout: float) -> bool:
        """Wait until every call so far has handed its outcome on; ``False`` on timeout."""
        with self._quiet:
            return self._quiet.wait_for(lambda: self._in_flight == 0, timeout)

    def stop(self, timeout: float) -> None:
        """Finish the calls queued so far, then end the thread (waits up to ``timeout``);
        later calls fail at once."""
        with self._quiet:
            self._stopped = True
            self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, args, done = item
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - the caller's completion carries it
                result, error = None, exc
            try:
                self._post(done.set, result, error)
            finally:
                with self._quiet:
                    self._in_flight -= 1
                    if not self._in_flight:
                        self._quiet.notify_all()
