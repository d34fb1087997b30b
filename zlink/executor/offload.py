"""Bounded pools of daemon threads for work run off the application workers (the io and cpu
pools behind ``context.workers``, execution-model §16).

Why not ``concurrent.futures.ThreadPoolExecutor``: the interpreter joins its threads at exit,
so one blocking call still running after its node shut down holds the whole process for as
long as the call takes (and a second Ctrl-C cannot help). These threads are daemon threads,
never joined at exit: a call still running when its node stops is abandoned (the node fails
its waiter and counts it) and the process exits without waiting for it.

Guarantees / assumes:
* At most ``size`` threads, each started when a call finds no idle one (none before the first
  call), kept until ``shutdown``.
* ``_cond`` (a Condition over one plain lock, a leaf: nothing is taken under it, and no call
  runs with it held) guards the queue, the idle count, the thread count and the closed flag.
* A call's exception is logged; a thread never dies of one.
* After ``shutdown()`` nothing more is taken: it returns the calls never started, and each
  thread ends once its current call returns. No thread is ever joined.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable

_log = logging.getLogger("zlink.offload")


class DaemonPool:
    """Up to ``size`` daemon threads running submitted calls in submission order."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one thread, got {size}")
        self.size = size
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Callable[[], None]] = deque()
        self._threads = 0
        self._idle = 0  # threads waiting for a call that no submit has woken yet
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started and not yet ended."""
        return self._threads

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on a pool thread: an idle one, a new one while fewer than ``size``
        run, else the first to finish its call. ``RuntimeError`` after ``shutdown``, and when
        a thread was needed and could not start (the process at its thread limit): then
        ``fn`` is not queued (an audit found it run later by the next thread that started,
        its caller told it failed); with other threads running it waits for one of them."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"pool {self._name} is shut down")
            self._queue.append(fn)
            if self._idle:
                self._idle -= 1
                self._cond.notify()
                return
            if self._threads >= self.size:
                return
            self._threads += 1
            index = self._threads - 1
        thread = threading.Thread(target=self._work, name=f"{self._name}_{index}", daemon=True)
        try:
            thread.start()
        except BaseException:
            with self._cond:
                self._threads -= 1
                if self._threads:  # one of them takes it in its turn: it is queued
                    return
                with contextlib.suppress(ValueError):  # no thread would run it: not queued
                    self._queue.remove(fn)
            raise

    def shutdown(self) -> list[Callable[[], None]]:
        """Take nothing more; return the calls never started, in order. Calls running now go
        on to their end on their (daemon) threads, which then end; none is joined."""
        with self._cond:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        return left

    def _work(self) -> None:
        cond, queue = self._cond, self._queue
        while True:
            with cond:
                while not queue:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1  # a submit takes it back when it wakes this thread
                    cond.wait()
                fn = queue.popleft()
            try:
                fn()
            except BaseException:  # noqa: BLE001 - a pool thread never dies of a call
                _log.exception("a call on pool %s failed", self._name)
            del fn  # not kept while this thread waits: it may hold a large result
