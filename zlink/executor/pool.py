"""The application domain's workers: N threads and one shared run queue (execution-model §10).

Guarantees / assumes:
* The run queue is a ``queue.SimpleQueue`` (C, lock-free for callers on both builds). A gate is
  put on it once per scheduling (its own flag sees to that), never once per message.
* The number of threads is fixed at start (cores by default) and never grows with the number of
  gates or owners: 10,000 Spots run on the same N threads (§10).
* ``_lock`` protects only the pending counter (``wait_idle``). Each worker marks itself busy in
  its own slot of ``_running`` (one writer per slot: no lock), which status adds up.
* An exception from a work item is logged; a worker never dies of one.
* Execution is *hand-off*: consecutive turns of one gate may run on different threads, so no
  turn state lives in thread-local storage (§6, §12). We chose hand-off over pinning because
  Python's per-thread cache locality is dwarfed by interpreter overhead (a pool that woke the
  worker idle last, keeping one hot Spot on one thread, measured the same), while pinning would
  concentrate hot Spots on one thread and, on the free-threaded build, waste cores.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

_log = logging.getLogger("zlink.pool")


class WorkerPool:
    """A fixed set of application worker threads draining one run queue."""

    def __init__(self, workers: int, name: str = "zlink-worker") -> None:
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {workers}")
        self.size = workers
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # submitted and not yet finished
        self._running = [0] * workers  # worker i writes only slot i
        self._waiting_idle = 0  # threads in wait_idle: only then do workers notify
        self._started = False

    def start(self) -> None:
        """Start the worker threads. Idempotent."""
        if self._started:
            return
        self._started = True
        for i in range(self.size):
            t = threading.Thread(target=self._work, args=(i,), name=f"{self._name}-{i}",
                                 daemon=True)  # fmt: skip
            t.start()
            self._threads.append(t)

    def submit(self, fn: Callable[[], None]) -> None:
        """Put ``fn`` on the run queue; some worker calls it soon. Never blocks."""
        lock = self._lock  # acquire/release, not ``with``: once per scheduled gate (hot)
        lock.acquire()
        self._pending += 1
        lock.release()
        self._queue.put(fn)

    @property
    def busy(self) -> int:
        """Workers currently running an item."""
        return sum(self._running)

    @property
    def pending(self) -> int:
        """Items submitted and not yet finished (queued or running)."""
        return self._pending

    def wait_idle(self, timeout: float, busy: int = 0) -> bool:
        """Block until at most ``busy`` items are queued or running (0: fully idle).

        ``busy`` lets a test wait for everything except items it keeps blocked on purpose.
        Returns ``False`` if ``timeout`` passed first.
        """
        with self._idle:
            self._waiting_idle += 1
            try:
                return self._idle.wait_for(lambda: self._pending <= busy, timeout)
            finally:
                self._waiting_idle -= 1

    def shutdown(self, timeout: float | None = 5.0) -> None:
        """Stop after the items already queued; join the threads for up to ``timeout``."""
        for _ in self._threads:
            self._queue.put(None)
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)

    def _work(self, index: int) -> None:
        get = self._queue.get
        lock = self._lock
        running = self._running
        while True:
            fn = get()
            if fn is None:
                return
            running[index] = 1
            try:
                fn()
            except BaseException:  # noqa: BLE001 - a worker never dies of a work item
                _log.exception("work item %r failed", fn)
            running[index] = 0
            fn = None  # not kept while this thread waits in get(): it may hold a message
            lock.acquire()  # not ``with``: once per work item, and ``with`` costs twice as much
            self._pending -= 1
            if self._waiting_idle:
                self._idle.notify_all()
            lock.release()
