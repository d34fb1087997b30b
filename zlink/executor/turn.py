"""One handler turn: a work item driven to its terminal completion (execution-model §2, §4, §6).

Guarantees / assumes:
* A turn runs every step inside its own ``contextvars.Context``: user context variables travel
  with the handler, not with the thread, and no turn state lives in thread-local storage (§6).
* A ``def`` handler runs to completion in one step. An ``async def`` handler is stepped with
  ``coro.send``; it may await only objects whose ``__await__`` yields a :class:`Suspension`.
  Anything else (an asyncio future, say) is answered with a ``TypeError`` thrown into the
  coroutine, as asyncio itself does for awaits it cannot serve.
* Each suspension gets a fencing number (``wait_seq``) that is never reused; a completion carrying
  an old number, or a second completion for the same number, is dropped (§6), also when two
  threads deliver at once (the once-only check is one atomic step).
* A turn can be cancelled from any thread (``cancel``): its current suspension resumes with the
  error, and so does every later one, at once (the gate re-checks after it subscribes, so a
  cancel that races a suspension is never lost).
* Only the holder of the turn's gate steps it, so a turn needs no lock of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine, Iterable
from enum import Enum
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol

from .lanes import APPLICATION, Lane

if TYPE_CHECKING:
    from .gate import Owner


class Step(Enum):
    """How a step of a turn ended."""

    DONE = "done"  # the handler reached its terminal completion
    KEEP_GATE = "keep_gate"  # suspended on a regular await: the gate (and Actor claim) stay held
    RELEASE_GATE = "release_gate"  # suspended on Yield: the shared gate is released (§3)
    LIGHT = "light"  # (gate only) light jobs' turns: done, post-processed and released


DONE, KEEP_GATE, RELEASE_GATE = Step.DONE, Step.KEEP_GATE, Step.RELEASE_GATE  # hot-path names

CLOSED = ("closed",)  # Turn.barriers once the turn's Defer() registration scope has ended
CURRENT_TURN: contextvars.ContextVar[Turn | None] = contextvars.ContextVar(
    "zlink_turn", default=None
)  # the package's own (gate.py); outside it, ``current_turn``


current_turn: Callable[[], Turn | None] = CURRENT_TURN.get
"""The turn the caller runs in, or ``None`` outside any turn (a C call: hot path)."""


Completion = Callable[[Any, BaseException | None], object]


class Suspension:
    """What a ZLink awaitable yields to the turn driving it.

    ``release_gate`` selects Yield (True) or a regular await (False). ``subscribe(cb)`` is called
    by the driver, as its very last action on the turn, with a callback to call exactly once as
    ``cb(value, None)`` or ``cb(None, error)`` from any thread.
    """

    __slots__ = ("release_gate", "subscribe")

    def __init__(self, release_gate: bool, subscribe: Callable[[Completion], None]) -> None:
        self.release_gate = release_gate
        self.subscribe = subscribe


class Job:
    """An opaque work item of an owner lane; the layer above subclasses it.

    ``invoke()`` runs inside the turn's context and returns the result or a coroutine to step.
    ``finish(turn)`` is the post-processing run at terminal completion, before the gate is
    released (§8). ``discard(error)`` is called instead of ``invoke`` for a job that will never
    run (shutdown). ``lane``, ``size`` and ``count`` name the reservation returned after
    ``finish``.

    A ``light`` job promises that ``invoke()`` is a plain call that never returns a coroutine,
    that ``finish()`` of a turn that ended normally with no Defer() barrier has nothing to do,
    and that it is one item of the application lane: the gate then runs it without the general
    turn machinery (a one-way message), and the light jobs queued behind it back to back.

    A ``whole`` job's turn is one that nothing else of its gate may overtake: a Yield in it
    waits keeping the gate, as a plain ``await`` does (§3; a lifecycle callback before which,
    or after which, nothing of its Spot runs).
    """

    __slots__ = ("at", "size")
    lane = APPLICATION  # a job of another lane (or several) keeps a ``lane`` slot of its own
    count = 1  # lane items it reserved (a batch reserves one per message)
    light = False
    whole = False

    def __init__(self, size: int = 0) -> None:
        self.size = size
        self.at = 0.0  # when it was admitted (clock time), for the oldest-item age in status

    def invoke(self) -> Any:
        raise NotImplementedError

    def finish(self, turn: Turn) -> None:
        """Post-processing at terminal completion; the default does nothing."""

    def discard(self, error: BaseException) -> None:
        """The job will never run; the default does nothing."""


class CallJob(Job):
    """A job made of a plain callable (engine tests, internal housekeeping)."""

    __slots__ = ("fn", "lane")

    def __init__(self, fn: Callable[[], Any], lane: Lane = APPLICATION, size: int = 0) -> None:
        super().__init__(size)
        self.lane = lane
        self.fn = fn

    def invoke(self) -> Any:
        return self.fn()


class Turn:
    """The execution of one job under one gate, from its first step to its terminal completion."""

    # What every turn sets lives in slots; what only some turns set (a result, an error; a
    # coroutine's ctx, the suspension and its waker, the Yield claim) is a class default
    # until then, kept in the instance dict: a plain one-way turn stores 3 attributes, not 11
    # (attribute stores are the cost of a turn, the more so on 3.13t, whose interpreter does
    # not specialize them).
    __slots__ = ("__dict__", "barriers", "job", "owner")

    result: Any = None
    error: BaseException | None = None
    ctx: contextvars.Context | None = None  # made if the handler is a coroutine
    coro: Coroutine[Any, Any, Any] | None = None
    wait_seq = 0
    suspension: Suspension | None = None
    claimed = False  # the owner is held across a Yield (member Actor claim, §3)
    waker: Any = None  # the current suspension's once-only callback
    cancelled: BaseException | None = None  # set by cancel(): every suspension ends with it

    def __init__(self, job: Job, owner: Owner | None) -> None:
        self.job = job
        self.owner = owner
        # Defer() barriers (§5): None, a list, or CLOSED once the registration scope ended
        self.barriers: Any = None

    # -- stepping (gate holder only) ------------------------------------------------------------
    def start(self) -> Step:
        """Run the first step; returns ``DONE``, ``KEEP_GATE`` or ``RELEASE_GATE``.

        A plain function runs in the worker's own context with this turn as the current one;
        a coroutine gets a context of its own for all its steps (its context variables stay
        its own across threads and suspensions).
        """
        token = CURRENT_TURN.set(self)
        try:
            out = self.job.invoke()
        except BaseException as exc:  # noqa: BLE001 - the handler's failure is its result
            self.error = exc
            return DONE
        finally:
            CURRENT_TURN.reset(token)
        if out is not None and (type(out) is CoroutineType or isinstance(out, Coroutine)):
            self.coro = out
            self.ctx = ctx = contextvars.Context()
            return ctx.run(self._first_step)
        if out is not None:
            self.result = out
        return DONE

    def resume(self, value: Any, error: BaseException | None) -> Step:
        """Run the next step with the completion of the last suspension."""
        assert self.ctx is not None
        return self.ctx.run(self._step, value, error)

    def cancel(self, error: BaseException) -> None:
        """Cancel this turn (any thread): its current suspension resumes with ``error`` now,
        and every later one at once (e.g. a close past its deadline, python-api §11: the
        handler sees the error at its ``await``, its ``finally`` runs on the gate). A turn
        that is running or not yet suspended meets it at its next suspension."""
        self.cancelled = error
        waker = self.waker
        if waker is not None:
            waker(None, error)

    def close(self) -> None:
        """Abandon a suspended coroutine (shutdown); its ``finally`` blocks run now."""
        if self.coro is not None and self.ctx is not None:
            with contextlib.suppress(BaseException):  # closing is best effort
                self.ctx.run(self.coro.close)

    def _first_step(self) -> Step:
        CURRENT_TURN.set(self)
        return self._step(None, None)

    def _step(self, value: Any, error: BaseException | None) -> Step:
        coro = self.coro
        assert coro is not None
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self.result = stop.value
                return DONE
            except BaseException as exc:  # noqa: BLE001 - the handler's failure is its result
                self.error = exc
                return DONE
            if type(yielded) is Suspension:
                self.suspension = yielded
                self.wait_seq += 1
                return RELEASE_GATE if yielded.release_gate else KEEP_GATE
            value = None
            error = TypeError(
                f"a ZLink handler can await only ZLink calls, not {yielded!r}; "
                "run other async or blocking work off the gate"
            )

    def completion(self, deliver: Callable[[Turn, Any, BaseException | None], None]) -> Completion:
        """A once-only callback for the current suspension, fenced by its sequence number.

        Kept as ``waker``: calling it with an error (a deadline) resumes the turn with that
        error; the real completion, arriving later, is then dropped by the fence.
        """
        seq = self.wait_seq
        once = threading.Lock()  # taken by the one delivery that counts (an atomic step)

        def complete(value: Any, error: BaseException | None) -> None:
            if self.wait_seq != seq or not once.acquire(False):
                return
            deliver(self, value, error)

        self.waker = complete
        return complete


class Halting(Protocol):
    """What ``run_turns`` asks before each call: whether to stop (a node shutting down)."""

    @property
    def stopping(self) -> bool: ...


def run_turns(
    job: Job,
    owner: Owner | None,
    calls: Iterable[tuple[Callable[[Any, Any], Any], Any]],
    first: Any,
    after: Callable[[Turn], None],
    halt: Halting,
) -> bool:
    """Run ``fn(first, arg)`` for each ``(fn, arg)`` of ``calls``, back to back, each as a turn
    of its own (current while it runs, with its own Defer() scope and outcome), unless
    ``halt.stopping`` (read before each): then it returns ``True`` at once, the pair it took
    from ``calls`` not run (nor the rest); ``False`` once every call ran. A turn that ends
    normally with no Defer() barrier is closed here; ``after(turn)`` gets one that failed or
    registered barriers. For a job that stands for several (a batch); the caller's turn is
    current again afterwards. Only plain functions belong here (the caller checks).

    Each turn is made current by replacing the value of the previous one: a ``ContextVar``
    ``set`` alone costs half a ``set`` and ``reset`` pair, and the caller's value is put back
    once, when the run ends (or before ``after``).
    """
    new = Turn.__new__
    set_current = CURRENT_TURN.set
    outer = CURRENT_TURN.get()
    token = set_current(outer)  # each turn below replaces the value; one reset at the end
    try:
        for fn, arg in calls:
            if halt.stopping:
                return True
            turn = new(Turn)
            turn.job, turn.owner, turn.barriers = job, owner, None
            set_current(turn)
            try:
                fn(first, arg)  # a one-way handler: its result is not kept
            except BaseException as exc:  # noqa: BLE001 - the handler's failure is its result
                turn.error = exc
            if turn.barriers is None and turn.error is None:
                turn.barriers = CLOSED
            else:
                set_current(outer)  # post-processing runs as the caller's turn, as it did
                after(turn)
    finally:
        CURRENT_TURN.reset(token)
    return False
