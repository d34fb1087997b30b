"""The infrastructure domain: one thread and one deadline heap (execution-model §1, §10, §13).

Guarantees / assumes:
* ``_cond`` (a Condition over one Lock) protects ``_ready``, ``_heap`` and ``_state``; callbacks
  always run with it released, so a callback may submit more infrastructure work.
* The thread never waits on application work: it only pops due entries and runs them. Work
  submitted here must be short and must not block (timeouts, completions, shutdown steps).
* The thread runs inside its own ``contextvars.Context`` in which :func:`in_infrastructure` is
  true: the context marker of §13 that makes a wrong-domain call fail instead of waiting.
* The thread never dies (python-api §9): any exception of a task, of a deadline callback or of
  its own wait is logged, counted once (``task_errors``, and ``on_error``) and the loop goes on.
  Deadlines are finite (``call_at`` refuses anything else) and a real-time wait is capped at
  ``_MAX_WAIT``, so no deadline, however far, asks a lock for a wait it cannot do.
* Hosting I/O (:meth:`InfraExecutor.host`): a node whose transport owns sockets has this
  thread do the transport's polling too, instead of a thread of the transport's own. Its idle
  wait is then the transport's poll (``InfraIO.turn``), woken by ``InfraIO.wake``, and after
  each batch of tasks the transport gets a non-blocking turn. A frame from a peer is then
  handed to the node, and a frame the node sends leaves, with no hand-off between two threads:
  a round trip between two node processes crosses four threads fewer (issue "A mesh of OS
  processes": the round-trip numbers). ``wake`` is called with ``_cond`` released, never from
  under it: the transport calls ``submit`` under its own lock.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .clock import Clock

_log = logging.getLogger("zlink.infra")
_IN_INFRA: contextvars.ContextVar[bool] = contextvars.ContextVar("zlink_in_infra", default=False)
_MAX_WAIT = 3600.0  # real seconds the thread sleeps at most before it re-reads its heap
_FAILED_PAUSE = 0.01  # real seconds it pauses after its own wait failed (no hot loop)


def in_infrastructure() -> bool:
    """True when the caller runs on the infrastructure thread (§13 context marker)."""
    return _IN_INFRA.get()


class InfraIO(Protocol):
    """I/O the infrastructure thread does between its tasks (see :meth:`InfraExecutor.host`)."""

    def turn(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: until woken or its own next event; ``0``:
        not at all) for I/O, and do what is due. ``False``: the I/O is finished; the thread
        stops hosting it. Never raises past one failure of its own (it counts those)."""
        ...

    def wake(self) -> None:
        """Make a ``turn`` waiting now, or the next one, return soon (any thread; never
        blocks; may be called with no turn waiting)."""
        ...


def _nothing(*_args: Any) -> None:
    """What a cancelled deadline would call (it never does): it holds no reference."""


class DeadlineHandle:
    """A scheduled infrastructure callback; ``cancel()`` makes it a no-op (lazy deletion)."""

    __slots__ = ("_owner", "args", "cancelled", "deadline", "fn")

    def __init__(
        self,
        deadline: float,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        owner: InfraExecutor | None = None,
    ) -> None:
        self.deadline = deadline
        self.fn = fn
        self.args = args
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        """Never run this callback, and let go of what it would have been called with (a
        cancelled entry stays in the heap until it reaches the top or the heap is compacted:
        it must not keep a closed Spot, or a fence's envelopes, alive that long). Safe from
        any thread, any number of times."""
        if not self.cancelled:
            self.cancelled = True
            owner = self._owner  # read once: the infrastructure thread may take it off the
            if owner is not None:  # heap meanwhile (CI on 3.13t: AttributeError here)
                owner._cancelled_one(self)
            else:
                self.fn, self.args = _nothing, ()


class InfraExecutor:
    """Runs timeouts, completions and shutdown steps on its own thread, by the injected clock.

    It progresses while every application worker is blocked in a handler: that is the whole
    point of a separate domain (§10: "infrastructure progresses when the application is entirely
    waiting").
    """

    def __init__(
        self,
        clock: Clock,
        name: str = "zlink-infra",
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        """``on_error(exc)`` is called on the thread for each failure it survives (a counter)."""
        self._clock = clock
        self._name = name
        self._on_error = on_error
        self.task_errors = 0  # failures survived (written by the thread only)
        self._cond = threading.Condition(threading.Lock())
        self._ready: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._heap: list[tuple[float, int, DeadlineHandle]] = []
        self._dead = 0  # cancelled entries still in the heap
        self._seq = itertools.count()
        self._state = "new"
        self._busy = False  # a batch is running (read by wait_quiet)
        self._busy_since: float | None = None  # when the task running now began (clock)
        self._sleeping = False  # the thread waits on _cond for work (submit notifies only then)
        self._io: InfraIO | None = None  # hosted I/O: the thread's idle wait is its turn
        self._io_woken = False  # a wake-up is on its way to the hosted I/O's wait
        self._thread: threading.Thread | None = None
        self._ident = 0  # the thread's ident, once it runs
        clock.add_listener(self._wake)

    # -- any thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the infrastructure thread. Idempotent."""
        with self._cond:
            if self._state != "new":
                return
            self._state = "running"
        ctx = contextvars.Context()
        ctx.run(_IN_INFRA.set, True)
        self._thread = threading.Thread(
            target=ctx.run, args=(self._loop,), name=self._name, daemon=True
        )
        self._thread.start()

    def host(self, io: InfraIO) -> None:
        """Have this thread do ``io``'s turns from now on (the module docstring: hosting I/O),
        until a turn returns ``False`` or :meth:`release`. One I/O at a time: a second is the
        node's wiring gone wrong (``RuntimeError``)."""
        with self._cond:
            if self._io is not None:  # (the node's own wiring: never a user's input)
                raise RuntimeError("the infrastructure thread already hosts I/O")
            self._io = io
            self._cond.notify()  # a wait on the condition becomes a wait on the I/O

    def release(self, io: InfraIO) -> None:
        """Do ``io``'s turns no more (it finished its last turn itself, on this thread)."""
        with self._cond:
            if self._io is io:
                self._io = None

    def finish_here(self, io: InfraIO) -> bool:
        """Turn ``io`` a last time on the calling thread and stop hosting it, when no other
        thread will turn it again: the caller is this executor's own thread, or the thread
        has ended. ``False``, nothing done: the thread lives and will do that last turn."""
        if self.runs_here() or not self.alive:
            io.turn(0.0)
            self.release(io)
            return True
        return False

    def runs_here(self) -> bool:
        """Whether the caller runs on this executor's own thread (not just any node's
        infrastructure thread, which :func:`in_infrastructure` tells)."""
        return self._ident == threading.get_ident()

    @property
    def hosting(self) -> bool:
        """Whether the thread runs hosted I/O's turns (and will, while it lives)."""
        return self._io is not None and self.alive

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the infrastructure thread as soon as possible. Never blocks."""
        with self._cond:
            self._ready.append((fn, args))
            if not self._sleeping:  # it takes this with its next batch: no wake-up's cost
                return
            io = self._wake_io()
            if io is None:
                self._cond.notify()
                return
        io.wake()

    def _rouse(self) -> InfraIO | None:
        """(Holds ``_cond``.) Wake the thread for a change it must look at (a new first
        deadline, a clock jump, a stop): the condition is notified, and the hosted I/O to
        wake, if the thread sleeps in it, is returned (woken by the caller, ``_cond``
        released)."""
        self._cond.notify()
        return self._wake_io() if self._sleeping else None

    def _wake_io(self) -> InfraIO | None:
        """(Holds ``_cond``, the thread sleeping.) The hosted I/O to wake, once per sleep;
        ``None`` when there is none (or a wake-up is already on its way)."""
        io = self._io
        if io is None or self._io_woken or self._ident == threading.get_ident():
            return None  # (its own thread is in the turn: it re-reads the queue after it)
        self._io_woken = True
        return io

    def call_at(self, deadline: float, fn: Callable[..., Any], *args: Any) -> DeadlineHandle:
        """Run ``fn(*args)`` on the infrastructure thread once the clock reaches ``deadline``.

        ``ValueError`` for a deadline that is not a finite number: the heap could not order it
        (user durations are refused before this, at their call site: python-api §9).
        """
        if not math.isfinite(deadline):
            raise ValueError(f"a deadline is a finite clock time, got {deadline!r}")
        handle = DeadlineHandle(deadline, fn, args, self)
        io = None
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), handle))
            if self._heap[0][2] is handle:
                io = self._rouse()
        if io is not None:
            io.wake()
        return handle

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> DeadlineHandle:
        """Like :meth:`call_at`, ``delay`` seconds from now on the injected clock."""
        return self.call_at(self._clock.now() + delay, fn, *args)

    @property
    def alive(self) -> bool:
        """Whether the infrastructure thread runs (status shows it: python-api §9)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def busy(self) -> bool:
        """Whether a task is queued or running (deadlines not yet due are not work; a
        stopped executor runs nothing, so holds none)."""
        with self._cond:
            return self._state != "stopped" and (self._busy or bool(self._ready))

    def stalled_for(self) -> float:
        """Seconds (on the injected clock) the thread has been inside the task it runs now
        (or the hosted I/O's turn after a batch); ``0.0`` while it waits for work. A node's
        lease thread reads it (any thread) not to renew the lease of a node whose
        infrastructure has stopped serving."""
        since = self._busy_since
        return 0.0 if since is None else max(0.0, self._clock.now() - since)

    def backlog(self) -> int:
        """Tasks waiting for the thread now (a status figure)."""
        return len(self._ready)

    def deadlines(self) -> int:
        """Deadlines on the heap not cancelled (a status figure, read without a scan)."""
        return max(0, len(self._heap) - self._dead)

    def _cancelled_one(self, handle: DeadlineHandle) -> None:
        """``handle`` was cancelled: it lets go of its call (under ``_cond``, which
        ``_pop_due`` holds while it reads a handle); compact the heap once most of it is dead
        (as asyncio does).

        Most request deadlines are cancelled by their reply long before they are due; without
        this the heap would hold every one of them until its deadline passed.
        """
        with self._cond:
            handle.fn, handle.args = _nothing, ()
            if handle._owner is None:  # off the heap already (it came due): not dead there
                return
            self._dead += 1
            heap = self._heap
            if self._dead > 256 and self._dead * 2 > len(heap):
                self._heap = [e for e in heap if not e[2].cancelled]
                heapq.heapify(self._heap)
                self._dead = 0

    def take_pending(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Remove every live deadline and return its call, read under ``_cond`` (a cancel on
        another thread meanwhile empties a handle, not this copy): shutdown fails them
        itself."""
        with self._cond:
            live = [(e[2].fn, e[2].args) for e in self._heap if not e[2].cancelled]
            for entry in self._heap:
                entry[2]._owner = None  # off the heap
            self._heap.clear()
            self._dead = 0
        return live

    def wait_quiet(self, timeout: float) -> bool:
        """Block until no immediate task is queued or running; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._state == "stopped" or (not self._ready and not self._busy), timeout
            )

    def stop(self, timeout: float | None = 5.0) -> None:
        """Run what is ready, drop pending deadlines, and join the thread (also when it has
        said it stopped: it may still be on its way out, and ``alive`` is read after this)."""
        with self._cond:
            if self._state == "new":  # never started: nothing runs
                self._state = "stopped"
                return
            io = None
            if self._state == "running":  # (stopping already: this call joins it too)
                self._state = "stopping"
                io = self._rouse()
        if io is not None:
            io.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _wake(self) -> None:
        """The clock jumped: move what is now due to the ready queue before returning.

        Done on the thread that moved the clock, so that once ``advance()`` returns, the due
        work is visible to ``wait_quiet`` (tests wait on it, never on sleep).
        """
        with self._cond:
            if self._state == "stopped":  # nothing will run it: it is no work here
                return
            self._ready.extend(self._pop_due())
            io = self._rouse()
        if io is not None:
            io.wake()

    # -- the infrastructure thread ------------------------------------------------------------
    def _loop(self) -> None:
        self._ident = threading.get_ident()
        while True:
            try:
                batch = self._next_batch()
            except BaseException as exc:  # noqa: BLE001 - the infrastructure thread never dies
                self._failed(exc, "the infrastructure thread's wait")
                with self._cond:
                    self._sleeping = True
                    try:
                        self._cond.wait(_FAILED_PAUSE)
                    finally:
                        self._sleeping = False
                        self._io_woken = False
                continue
            if batch is None:
                return
            self._run(batch)
            # Nothing of a batch stays referenced while this thread waits for the next one: a
            # task's arguments may be large (the bytes of a message from another node).
            del batch
            io = self._io
            if io is not None:  # what the batch sent leaves now; what came in is read
                self._busy_since = self._clock.now()
                try:
                    self._turn(io, 0.0)
                except BaseException as exc:  # noqa: BLE001 - the thread never dies
                    self._failed(exc, f"the hosted I/O {io!r}")

    def _turn(self, io: InfraIO, timeout: float | None) -> None:
        """One turn of the hosted I/O; one that says it is finished is hosted no more. What
        it raises goes to ``_loop``, which counts it (and pauses, after a failed wait)."""
        if not io.turn(timeout):
            with self._cond:
                if self._io is io:
                    self._io = None

    def _run(self, batch: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        now = self._clock.now
        for fn, args in batch:
            self._busy_since = now()
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the infrastructure thread never dies
                self._failed(exc, f"infrastructure task {fn!r}")

    def _failed(self, exc: BaseException, what: str) -> None:
        """Log and count one failure the thread survives (python-api §9)."""
        self.task_errors += 1
        _log.error("%s failed; the infrastructure thread goes on", what, exc_info=exc)
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except BaseException:  # noqa: BLE001 - nor of its own error counter
                _log.exception("the infrastructure error hook %r failed", self._on_error)

    def _pop_due(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Pop every due (or cancelled) deadline; the due ones' calls. Holds ``_cond``."""
        now = self._clock.now()
        heap = self._heap
        due = []
        while heap and (heap[0][0] <= now or heap[0][2].cancelled):
            handle = heapq.heappop(heap)[2]
            handle._owner = None  # off the heap: a cancel from now on is no dead entry here
            if handle.cancelled:
                self._dead = max(0, self._dead - 1)
            else:
                due.append((handle.fn, handle.args))
        return due

    def _next_batch(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]] | None:
        with self._cond:
            self._busy = False
            self._busy_since = None
            while True:
                batch: list[tuple[Callable[..., Any], tuple[Any, ...]]] = list(self._ready)
                self._ready.clear()
                batch += self._pop_due()
                heap = self._heap
                if batch:
                    self._busy = True
                    return batch
                self._cond.notify_all()  # wake wait_quiet callers
                if self._state != "running":
                    self._state = "stopped"
                    self._cond.notify_all()  # (wait_quiet: a stopped executor is quiet)
                    return None
                wait = self._clock.real_wait(heap[0][0]) if heap else None
                wait = None if wait is None else min(wait, _MAX_WAIT)
                self._sleeping = True
                io = self._io
                try:
                    if io is None:
                        self._cond.wait(wait)
                    else:  # the I/O's wait, with the condition released (submit wakes it)
                        self._cond.release()
                        try:
                            self._turn(io, wait)
                        finally:
                            self._cond.acquire()
                finally:
                    self._sleeping = False
                    self._io_woken = False
