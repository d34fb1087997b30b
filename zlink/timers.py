"""Timers: options, ticks, and the runtime timer (kotlin-spot-interface timers; §2, §16).

A timer's deadline lives on the infrastructure heap; each tick enters the application lane of
the object that registered it (execution-model §1, §7). In a SpotWide User Spot, an Instance
Spot or an Entry Spot the Spot's timers share the Spot gate, so a tick never overlaps a handler;
an Actor's timers share the Actor's current gate; a PerActor User Spot gives each of its own
timers a gate of its own, so two timers run at the same time (§2).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from .durations import check_seconds
from .errors import InvalidArgument, InvalidOperation
from .executor import CLOSED, Admission, DeadlineHandle, Job, Owner, Turn

if TYPE_CHECKING:
    from .executor import Clock, InfraExecutor

_log = logging.getLogger("zlink.timers")
F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__zlink_timer__"
_MAX_CATCH_UP = 2**31 - 1
MAX_CATCH_UP: Final = _MAX_CATCH_UP


class OverrunPolicy(Enum):
    """What a timer does with ticks that came due while it could not fire."""

    SKIP_LATE_TICKS = "skip_late_ticks"  # deliver one tick; count the rest as late
    CATCH_UP_BOUNDED = "catch_up_bounded"  # deliver up to max_catch_up_ticks late ticks too

    # Either way, lateness is measured when a tick is delivered, and the lane never holds more
    # undelivered ticks of a timer than 1 (SKIP_LATE_TICKS) or max_catch_up_ticks (python-api
    # §11): see ``Timer``.


@dataclass(frozen=True, slots=True)
class TimerOptions:
    """Timer options; defaults are the seed's: SKIP_LATE_TICKS, max_catch_up_ticks 1.

    ``max_catch_up_ticks`` is an ``int`` (a ``bool`` is not), validated to 1..2**31-1 only
    under ``CATCH_UP_BOUNDED`` and not used otherwise (kotlin-spot-interface; python-api §8):
    a value that is no int at all could not cross between nodes with its Spot's move.
    ``keeps_alive``: whether ticks count as activity for idle eviction.
    """

    overrun_policy: OverrunPolicy = OverrunPolicy.SKIP_LATE_TICKS
    max_catch_up_ticks: int = 1
    keeps_alive: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.keeps_alive, bool):  # ("no" was taken as true)
            raise InvalidArgument(f"keeps_alive is True or False, got {self.keeps_alive!r}")
        if not isinstance(self.overrun_policy, OverrunPolicy):
            raise InvalidArgument(
                f"overrun_policy must be an OverrunPolicy: {self.overrun_policy!r}"
            )
        n = self.max_catch_up_ticks
        if type(n) is not int:
            raise InvalidArgument(f"max_catch_up_ticks is an int, got {n!r}")
        if self.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED and not 1 <= n <= _MAX_CATCH_UP:
            raise InvalidArgument(f"max_catch_up_ticks is 1..2**31-1 under CATCH_UP_BOUNDED: {n!r}")


@dataclass(frozen=True, slots=True)
class TimerTick:
    """One delivered tick: its timer, its sequence, when it was due and when it fired.

    ``late_ticks`` counts the due ticks skipped (never delivered) just before this one, measured
    when it is delivered (python-api §11): under SKIP_LATE_TICKS the one tick delivered after a
    stall reports every period it stands for; under CATCH_UP_BOUNDED the first tick delivered
    reports those beyond the catch-up bound. ``fired_at``: when the tick was delivered, so
    ``fired_at - scheduled_at`` is how late it ran.
    """

    name: str
    sequence: int
    scheduled_at: float
    fired_at: float
    late_ticks: int


def _utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8; -1 if it has no UTF-8 form (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def _check_name(name: object) -> None:
    """``InvalidArgument`` unless ``name`` is a timer name: 1..255 bytes of valid UTF-8."""
    if not isinstance(name, str) or not 0 < _utf8_size(name) <= 255:
        raise InvalidArgument(f"a timer name is 1..255 bytes of valid UTF-8, got {name!r}")


def timer_handler(name: str) -> Callable[[F], F]:
    """Mark a method as the callback of the timer ``name``: ``def on_x(self, tick: TimerTick)``."""
    _check_name(name)

    def mark(fn: F) -> F:
        if not inspect.isfunction(fn):
            raise InvalidOperation(f"@timer_handler decorates a function, not {fn!r}")
        params = [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
        if len(params) != 2:
            raise InvalidOperation(f"timer handler {fn.__qualname__} must take (self, tick)")
        setattr(fn, _MARK, name)
        return fn

    return mark


def collect_timer_handlers(cls: type) -> dict[str, Callable[..., Any]]:
    """The ``@timer_handler`` methods of ``cls`` by timer name; two for one name are refused."""
    found: dict[str, Callable[..., Any]] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for attr, fn in vars(klass).items():
            name = getattr(fn, _MARK, None)
            if attr in seen or name is None:
                continue
            seen.add(attr)
            if name in found:
                raise InvalidOperation(f"{cls.__qualname__}: two handlers for timer {name!r}")
            found[name] = fn
    return found


class TimerJob(Job):
    """A tick of its timer waiting on its owner's application lane.

    Which tick it delivers is decided when its turn runs, not when it was queued (python-api
    §11): :meth:`Timer.deliver` measures lateness then, against the scheduled times due by now.
    """

    __slots__ = ("timer",)

    def __init__(self, timer: Timer, queued_at: float) -> None:
        self.size = 0
        self.at = queued_at  # when the timer queued it (status: the oldest item's age)
        self.timer = timer

    def invoke(self) -> Any:
        timer = self.timer
        tick = timer.deliver()
        if tick is None:
            return None  # cancelled or stopping since it was queued; or nothing due any more
        if timer.options.keeps_alive:
            timer.host.touch()  # otherwise a tick is not activity (idle eviction)
        return timer.fn(timer.host.instance, tick)

    def finish(self, turn: Turn) -> None:
        self.timer.tick_done()
        rt = self.timer.host.rt
        error = turn.error
        rt.close_scope(turn, error is None)
        if error is not None:
            what = f"timer {self.timer.name!r} of {self.timer.host.name!r}"
            if not rt.ended_by_stop(error, what):  # (the stop's own: no handler error)
                rt.metrics.add("handler_errors")
                _log.error("%s failed", what, exc_info=error)
        turn.barriers = CLOSED

    def discard(self, error: BaseException) -> None:
        """Never delivered (shutdown, a Spot that did not start): its place is given back."""
        self.timer.withdraw()


class _Metrics(Protocol):
    def add(self, name: str, n: int = 1) -> None: ...


class TimerRuntime(Protocol):
    """What a timer needs of its node's runtime (``zlink.runtime`` implements it)."""

    @property
    def stopping(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def infra(self) -> InfraExecutor: ...

    @property
    def metrics(self) -> _Metrics: ...

    def close_scope(self, turn: Turn, ok: bool) -> None: ...

    def ended_by_stop(self, err: BaseException, what: str) -> bool: ...


class TimerHost(Protocol):
    """The Spot or Actor activation a timer belongs to (``zlink.runtime.acts``)."""

    @property
    def rt(self) -> TimerRuntime: ...

    @property
    def name(self) -> str: ...

    @property
    def instance(self) -> Any: ...

    @property
    def timers(self) -> dict[str, Timer]: ...

    def touch(self) -> None: ...

    def add_timer(
        self, name: str, interval: float, options: TimerOptions, first_delay: float | None
    ) -> Timer: ...

    def cancel_timer(self, name: str, registration: object | None = None) -> bool: ...


class Timer:
    """A registered timer: its schedule on the infrastructure heap and its tick bookkeeping.

    Ticks behind a slow handler (python-api §11): the timer never has more undelivered ticks on
    its lane than its policy's bound (one under SKIP_LATE_TICKS, ``max_catch_up_ticks`` under
    CATCH_UP_BOUNDED); a queued tick is only a place in the lane. When its turn runs,
    :meth:`deliver` takes the periods due by then from ``next_due`` on: a tick stands for the
    newest one (SKIP_LATE_TICKS) or, under CATCH_UP_BOUNDED, the oldest of the newest
    ``max_catch_up_ticks + 1`` (the others follow as ticks of their own); the periods before it
    are ``late_ticks``, counted once, per timer and in the node counter ``timer_late_ticks``.
    The callbacks of one timer never overlap: one suspended in a Yield (its gate given back)
    holds the next tick back until it ends, and the periods that pass meanwhile are owed, as
    behind a slow handler (python-api §11).

    ``_lock`` guards ``next_due``, ``sequence``, the counts and ``undelivered``/``queued``: the
    infrastructure thread (:meth:`_fire`) and the gate (:meth:`deliver`) both write them; puts
    to the lane happen with it released.
    """

    __slots__ = (
        "_lock",
        "cancelled",
        "delivered",
        "fn",
        "handle",
        "host",
        "interval",
        "late_ticks",
        "name",
        "next_due",
        "options",
        "owner",
        "queued",
        "registration",
        "sequence",
        "undelivered",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        interval: float,
        options: TimerOptions,
        host: TimerHost,
        owner: Owner,
        fn: Callable[..., Any],
        first_due: float,
        registration: object | None = None,
    ) -> None:
        self.name = name
        # which ``register`` made it: its handle's, kept by a move that did not happen
        self.registration = object() if registration is None else registration
        self.interval = interval
        self.options = options
        self.host = host
        self.owner = owner  # where ticks queue: the host's own lanes, or a timer owner (PerActor)
        self.fn = fn
        self.next_due = first_due  # the oldest period neither delivered nor counted late
        self.sequence = 0  # the last delivered tick
        self.handle: DeadlineHandle | None = None
        self.cancelled = False
        self.delivered = self.late_ticks = 0
        self.undelivered = 0  # ticks on the lane whose turn has not run yet (<= the bound)
        self.queued = 0  # ticks admitted and not yet finished (idle eviction ignores these)
        self._lock = threading.Lock()

    def runs_as(self, interval: float, options: TimerOptions) -> bool:
        """Whether a timer of ``interval`` and ``options`` would run as this one does (its
        catch-up bound counts only under CATCH_UP_BOUNDED: elsewhere it is not used)."""
        mine = self.options
        return (
            interval == self.interval
            and options.overrun_policy is mine.overrun_policy
            and options.keeps_alive == mine.keeps_alive
            and (
                mine.overrun_policy is not OverrunPolicy.CATCH_UP_BOUNDED
                or options.max_catch_up_ticks == mine.max_catch_up_ticks
            )
        )

    def _bound(self) -> int:
        """Undelivered ticks the lane may hold for this timer (python-api §11)."""
        opts = self.options
        if opts.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED:
            return opts.max_catch_up_ticks
        return 1

    def _due(self, now: float) -> int:
        """Periods due by ``now`` from ``next_due`` on. Holds ``_lock``."""
        if now < self.next_due:
            return 0
        return int((now - self.next_due) // self.interval) + 1

    def _reserve(self, due: int) -> int:
        """Places to take on the lane for ``due`` owed periods, taken now. Holds ``_lock``."""
        n = min(due, self._bound()) - self.undelivered
        if n <= 0:
            return 0
        self.undelivered += n
        self.queued += n
        return n

    def _put(self, n: int, now: float) -> None:
        """Queue ``n`` reserved ticks; a full lane leaves the periods owed (lock released)."""
        for i in range(n):
            job = TimerJob(self, now)
            verdict = self.owner.put_app(job)
            if verdict == Admission.CLOSED:  # sealed for a move: the tick is pending and moves
                # reserved past the seal, as a moved item is: its turn (here, if the move is
                # withdrawn) or the move returns the reservation, which must then exist
                self.owner.lanes.put_app_moved(job, 0)
            elif verdict != Admission.ADMITTED:  # full: its periods stay owed, for later ticks
                with self._lock:
                    self.undelivered -= n - i
                    self.queued -= n - i
                self.owner.lanes.note_refused()
                return

    def tick_done(self) -> None:
        """A tick's turn ended. When no other tick of this timer is queued or running, the
        periods owed by now are queued: a tick that found an earlier callback suspended
        (:meth:`deliver`) left them owed, and they are due once that callback ended."""
        rt = self.host.rt
        with self._lock:
            self.queued -= 1
            if self.queued or self.cancelled or rt.stopping or rt.draining:
                return  # (a tick still queued takes them; a drain leaves them owed)
            now = rt.clock.now()
            n = self._reserve(self._due(now))
        if n:
            self._put(n, now)

    def withdraw(self) -> None:
        """A queued tick left the lane undelivered (discarded, or moved to another node)."""
        with self._lock:
            self.undelivered -= 1
            self.queued -= 1

    def moved_in(self) -> None:
        """A tick that was queued on another node is queued here (relocation)."""
        with self._lock:
            self.undelivered += 1
            self.queued += 1

    def pending_tick(self, queued_at: float) -> TimerTick:
        """What a queued tick would deliver next, as far as known now (relocation's record;
        the target decides the tick again when it runs, and keeps only ``queued_at``)."""
        with self._lock:
            return TimerTick(self.name, self.sequence + 1, self.next_due, queued_at, 0)

    def arm(self) -> None:
        self.handle = self.host.rt.infra.call_at(self.next_due, self._fire)

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def deliver(self) -> TimerTick | None:
        """On the gate, as a queued tick's turn starts: the tick it delivers (python-api §11).

        Lateness is measured now, against the periods due by now: the ones beyond the policy's
        catch-up are skipped and counted in ``late_ticks``. ``None`` when the timer was
        cancelled or the node stops, or nothing is due any more.
        """
        rt = self.host.rt
        now = rt.clock.now()
        with self._lock:
            self.undelivered -= 1
            if self.cancelled or rt.stopping:
                return None
            if rt.draining:  # the node drains (or fenced itself): no tick runs here now; the
                return None  # periods stay owed, and go with a Spot that moves (its policy)
            if self.queued - self.undelivered > 1:  # an earlier tick's callback is suspended
                return None  # in a Yield: ticks never overlap; the periods stay owed until
                # that callback ends (tick_done), as Orleans's timers wait for its task
            due = self._due(now)
            if due == 0:
                return None
            allowed = 1  # the tick itself, and under CATCH_UP_BOUNDED the late ones it catches up
            if self.options.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED:
                allowed += self.options.max_catch_up_ticks
            late = max(0, due - allowed)
            scheduled = self.next_due + late * self.interval
            self.next_due = scheduled + self.interval
            self.sequence += 1
            self.delivered += 1
            self.late_ticks += late
            tick = TimerTick(self.name, self.sequence, scheduled, now, late)
            more = self._reserve(due - late - 1)  # caught-up periods still owed: their ticks
        if late:
            rt.metrics.add("timer_late_ticks", late)
        if more:
            self._put(more, now)
        return tick

    def _fire(self) -> None:
        """On the infrastructure thread, at a period: queue ticks up to the bound, re-arm."""
        if self.cancelled:
            return
        rt = self.host.rt
        now = rt.clock.now()
        with self._lock:
            due = self._due(now)
            n = self._reserve(due)
            following = self.next_due + due * self.interval  # the first period after now
        if n:
            self._put(n, now)
        if not rt.stopping:
            self.handle = rt.infra.call_at(following, self._fire)


class TimerHandle:
    """What ``timers.register`` returns: the timer's name and a way to cancel it. It belongs
    to that registration, not to the name: once the timer is cancelled, a timer registered
    again under the name is not this handle's (it neither cancels it nor reads it active)."""

    __slots__ = ("_timer",)

    def __init__(self, timer: Timer) -> None:
        self._timer = timer

    def _current(self) -> Timer | None:
        """The timer of this registration now (a move that did not happen made it anew)."""
        now = self._timer.host.timers.get(self._timer.name)
        return now if now is not None and now.registration is self._timer.registration else None

    @property
    def name(self) -> str:
        return self._timer.name

    @property
    def active(self) -> bool:
        """Whether the timer is still registered."""
        now = self._current()
        return now is not None and not now.cancelled

    @property
    def late_ticks(self) -> int:
        """Due periods skipped so far, never delivered (python-api §11)."""
        return (self._current() or self._timer).late_ticks

    def cancel(self) -> bool:
        """Cancel the timer; ``False`` if it was already cancelled."""
        return self._timer.host.cancel_timer(self._timer.name, self._timer.registration)


class TimerManager:
    """``context.timers``: register and cancel this object's timers. Never offers Yield (§16)."""

    __slots__ = ("_host",)

    def __init__(self, host: TimerHost) -> None:
        self._host = host

    def register(
        self,
        name: str,
        interval: float,
        *,
        options: TimerOptions | None = None,
        first_delay: float | None = None,
    ) -> TimerHandle:
        """Start the timer ``name`` (its ``@timer_handler`` must exist) every ``interval`` s.

        The first tick comes ``first_delay`` seconds from now (default: one interval). A
        timer is never replaced: ``InvalidOperation`` if ``name`` is registered already
        (``cancel(name)`` first).
        """
        _check_name(name)
        interval = check_seconds(interval, "a timer interval")
        if first_delay is not None:
            first_delay = check_seconds(first_delay, "first_delay", zero_ok=True)
        if options is None:
            options = TimerOptions()
        elif not isinstance(options, TimerOptions):
            raise InvalidArgument(f"options must be TimerOptions, got {options!r}")
        timer = self._host.add_timer(name, interval, options, first_delay)
        return TimerHandle(timer)

    def cancel(self, name: str) -> bool:
        """Cancel the timer ``name``; ``False`` if no such timer is registered."""
        _check_name(name)
        return self._host.cancel_timer(name)

    def names(self) -> list[str]:
        """The names of the registered timers."""
        return sorted(self._host.timers)
