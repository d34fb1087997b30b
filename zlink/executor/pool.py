"""The application domain's workers: N threads, one shared run queue and a LIFO slot per
worker (execution-model §10, §12).

Guarantees / assumes:
* The run queue is a ``collections.deque``; a gate is put on it once per scheduling (its own
  flag sees to that), never once per message.
* **Waking.** A worker with nothing to do first *searches* (it looks at the queue and the
  slots; without the GIL it also spins on the queue for a few tens of microseconds, since a
  thread woken from the kernel costs that much), then *parks* on a lock of its own. A submit
  wakes a parked worker only when no worker is searching, and the woken one counts as
  searching until it finds work; a searcher that finds work and sees more queued wakes the
  next (Tokio's rule). So a burst of submits wakes one worker, not one per item, and a
  producer whose items a searching worker picks up makes no system call at all. Every state
  change (queue append, searching count, parked list) happens under ``_lock``, which the
  submit takes anyway for the pending count: a worker re-checks the queue under it before
  parking, so no wake-up is lost. A parked worker also wakes every ``_POLL`` / ``_POLL_IDLE``
  to look at the slots (see below), a floor under any mistake here.
* The number of threads is fixed at start (cores by default) and never grows with the number of
  gates or owners: 10,000 Spots run on the same N threads (§10).
* ``_lock`` protects the pending counter (``wait_idle``), the queue's appends, the searching
  count and the parked list. Lock order: ``_lock`` before a worker's park lock (a park lock is
  only released, never waited on, under ``_lock``). Each worker marks itself busy in its own
  slot of ``_running`` (one writer per slot: no lock), which status adds up.
* An exception from a work item is logged; a worker never dies of one.
* Execution is *hand-off*: consecutive turns of one gate may run on different threads, so no
  turn state lives in thread-local storage (§6, §12). The one thing a worker keeps is
  scheduling state: its **LIFO slot** (Tokio's LIFO slot, Go's ``runnext``). A gate that a
  worker's running turn makes ready (a handler sending to another Spot) goes to that worker's
  slot, not to the shared queue, and runs next on the same worker, so a chain of messages (a
  ping-pong, a token round a ring) does not hand every hop to another thread. A second such
  gate moves the first one to the shared queue, where idle workers take it.
* Nothing waits in a slot for long: an idle worker looks at the other workers' slots every
  ``_POLL`` seconds while slots are in use (``_POLL_IDLE`` after a while without) and takes an
  item it finds there twice in a row (a turn that runs long after making a gate ready). A
  worker that has run ``_SLOT_STREAK`` slot items in a row while the shared queue holds work
  moves its slot item to the back of the shared queue instead, so chains never starve it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable

_log = logging.getLogger("zlink.pool")

_POLL = 0.001  # an idle worker's look at the slots while they are in use (seconds)
_POLL_IDLE = 0.02  # ... and after _QUIET empty looks in a row
_QUIET = 50
_SLOT_STREAK = 16  # slot items in a row before the shared queue, if it holds work, goes first
# Looks at the queue a searching worker spins through before it parks, without the GIL and
# with more than one CPU to run on only (~40 us on 3.13t; with the GIL, or on one CPU, a
# spinning thread would only hold up the one that has work).
_SPIN = 1000


def _gil_enabled() -> bool:
    """Whether the GIL is on now (a C extension that does not support free threading turns
    it back on when imported, so this is asked when a pool is made, not at import)."""
    return bool(getattr(sys, "_is_gil_enabled", lambda: True)())


def _cpus() -> int:
    """CPUs this process may run on (its affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


_STOP: Callable[[], None] = lambda: None  # noqa: E731 - the item that ends a worker

Work = Callable[[], None]


class _Worker(threading.local):
    slot: list[Work] | None = None  # this thread's LIFO slot; None off the pool's workers


class WorkerPool:
    """A fixed set of application worker threads draining one run queue and their slots."""

    def __init__(self, workers: int, name: str = "zlink-worker") -> None:
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {workers}")
        self.size = workers
        self._name = name
        self._queue: deque[Work] = deque()  # appended under _lock, popped anywhere
        self._parked: list[threading.Lock] = []  # park locks of parked workers (under _lock)
        self._searching = 0  # workers looking for work, woken ones included (under _lock)
        self._spin = _SPIN if _cpus() > 1 and not _gil_enabled() else 0
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # submitted and not yet finished
        self._running = [0] * workers  # worker i writes only slot i
        self._slots: list[list[Work]] = [[] for _ in range(workers)]  # at most one item each
        self._taken = [0] * workers  # items worker i took from its own slot (one writer each)
        self._here = _Worker()
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

    def submit(self, fn: Work) -> None:
        """Put ``fn`` at the back of the shared run queue; some worker calls it soon. Never
        blocks. (A gate whose batch budget is spent goes here: to the back, §9.)"""
        lock = self._lock  # acquire/release, not ``with``: once per scheduled gate (hot)
        lock.acquire()
        self._pending += 1
        self._queue.append(fn)
        park = self._take_parked() if self._parked else None  # (no call while none is parked)
        lock.release()
        if park is not None:
            park.release()

    def _requeue(self, fn: Work) -> None:
        """``fn``, already counted as pending, to the back of the shared queue."""
        lock = self._lock
        lock.acquire()
        self._queue.append(fn)
        park = self._take_parked()
        lock.release()
        if park is not None:
            park.release()

    def _take_parked(self) -> threading.Lock | None:
        """(Under ``_lock``.) The park lock of a worker to wake for work just queued, when none
        is searching; it counts as searching from now until it finds work. The caller releases
        it once it has released ``_lock``."""
        if self._parked and not self._searching:
            self._searching += 1
            return self._parked.pop()  # the last to park: its cache is the warmest
        return None

    def submit_next(self, fn: Work) -> None:
        """Run ``fn`` next on this worker if called from one (its LIFO slot), else ``submit``.

        A gate made ready by the running turn; what the slot held before goes to the shared
        queue. Never blocks, never runs ``fn`` here.
        """
        slot = self._here.slot
        if slot is None:
            self.submit(fn)
            return
        lock = self._lock
        lock.acquire()
        self._pending += 1
        lock.release()
        if slot:
            try:
                bumped = slot.pop()
            except IndexError:  # an idle worker took it meanwhile
                bumped = None
            if bumped is not None:
                self._requeue(bumped)
        slot.append(fn)

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
        with self._lock:  # the same list object: a worker's _search holds it
            self._queue.extend([_STOP] * len(self._threads))
            parked = self._parked[:]
            self._parked.clear()
            self._searching += len(parked)
        for park in parked:
            park.release()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout)

    def _work(self, index: int) -> None:
        q = self._queue
        popleft = q.popleft
        lock = self._lock
        running = self._running
        slot = self._here.slot = self._slots[index]
        pop = slot.pop
        taken = self._taken
        streak = 0
        seen: list[tuple[Work | None, int]] = [(None, 0)] * self.size  # slots at the last look
        park = threading.Lock()
        park.acquire()  # held: a park waits on it until a submit (or the poll) lets it go
        while True:
            fn: Work | None = None
            if slot:
                if streak >= _SLOT_STREAK and q:
                    streak = 0  # the shared queue goes first; the slot item to its back
                    try:
                        fn = pop()
                    except IndexError:  # an idle worker took it
                        fn = None
                    if fn is not None:
                        self._requeue(fn)
                        fn = None
                else:
                    try:
                        fn = pop()
                        streak += 1
                        taken[index] += 1
                    except IndexError:  # an idle worker took it
                        pass
            if fn is None:
                streak = 0
                try:
                    fn = popleft()
                except IndexError:
                    fn = self._search(index, seen, park)
                if fn is _STOP:
                    return
            running[index] = 1
            try:
                fn()
            except BaseException:  # noqa: BLE001 - a worker never dies of a work item
                _log.exception("work item %r failed", fn)
            running[index] = 0
            fn = None  # not kept while this thread searches or parks: it may hold a message
            lock.acquire()  # not ``with``: once per work item, and ``with`` costs twice as much
            self._pending -= 1
            if self._waiting_idle:
                self._idle.notify_all()
            lock.release()

    def _search(
        self, index: int, seen: list[tuple[Work | None, int]], park: threading.Lock
    ) -> Work:
        """Nothing in the slot or the queue: search, then park until there is work (see the
        module docstring, "Waking"); returns the item found."""
        q = self._queue
        lock = self._lock
        parked = self._parked
        lock.acquire()
        self._searching += 1
        alone = self._searching == 1
        lock.release()
        quiet = 0
        spin = self._spin
        while True:
            if spin and alone:  # no GIL, and no other worker searching: spin a little
                n = spin
                while n and not q:
                    n -= 1
            fn: Work | None
            try:
                fn = q.popleft()
            except IndexError:
                fn, in_use = self._steal(index, seen)
                quiet = 0 if in_use else quiet + 1
            if fn is not None:
                lock.acquire()
                self._searching -= 1
                wake = self._take_parked() if q else None  # more work: the next one searches
                lock.release()
                if wake is not None:
                    wake.release()
                return fn
            lock.acquire()
            if q:  # queued since the look above: no park
                lock.release()
                continue
            self._searching -= 1
            parked.append(park)
            lock.release()
            woken = park.acquire(timeout=_POLL if quiet < _QUIET else _POLL_IDLE)
            if not woken:
                lock.acquire()
                if park in parked:  # the poll: searching again (the slots)
                    parked.remove(park)
                    self._searching += 1
                    lock.release()
                else:  # a submit took it off the list as the poll ran out: its release comes
                    lock.release()
                    park.acquire()
            alone = False  # woken or polling: look, do not spin

    def _steal(self, index: int, seen: list[tuple[Work | None, int]]) -> tuple[Work | None, bool]:
        """An item that another worker's slot has held since this worker's last look (the
        same item, and its worker took nothing from its slot since), taken; and whether any
        slot held an item. ``seen`` is what each slot held at the last look."""
        in_use = False
        for i, other in enumerate(self._slots):
            if i == index:
                continue
            try:
                head = other[0]
            except IndexError:
                seen[i] = (None, 0)
                continue
            in_use = True
            mark = (head, self._taken[i])
            if mark[0] is seen[i][0] and mark[1] == seen[i][1]:
                seen[i] = (None, 0)
                try:
                    return other.pop(), True
                except IndexError:  # its worker took it meanwhile
                    continue
            seen[i] = mark
        return None, in_use
