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
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .durations import check_seconds
from .errors import InvalidArgument, InvalidOperation
from .executor import CLOSED, Admission, DeadlineHandle, Job, Owner, Turn

if TYPE_CHECKING:
    from .executor import Clock, InfraExecutor

_log = logging.getLogger("zlink.timers")
F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__zlink_timer__"
_MAX_CATCH_UP = 2**31 - 1


class OverrunPolicy(Enum):
    """What a timer does with ticks that came due while it could not fire."""

    SKIP_LATE_TICKS = "skip_late_ticks"  # deliver one tick; count the rest as late
    CATCH_UP_BOUNDED = "catch_up_bounded"  # deliver up to max_catch_up_ticks late ticks too


@dataclass(frozen=True, slots=True)
class TimerOptions:
    """Timer options; defaults are the seed's: SKIP_LATE_TICKS, max_catch_up_ticks 1.

    ``max_catch_up_ticks`` is validated to 1..2**31-1 only under ``CATCH_UP_BOUNDED`` and not
    used otherwise. ``keeps_alive``: whether ticks count as activity for idle eviction.
    """

    overrun_policy: OverrunPolicy = OverrunPolicy.SKIP_LATE_TICKS
    max_catch_up_ticks: int = 1
    keeps_alive: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.overrun_policy, OverrunPolicy):
            raise InvalidArgument(
                f"overrun_policy must be an OverrunPolicy: {self.overrun_policy!r}"
            )
        if self.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED:
            n = self.max_catch_up_ticks
            if type(n) is not int or not 1 <= n <= _MAX_CATCH_UP:
                raise InvalidArgument(
                    f"max_catch_up_ticks is 1..2**31-1 under CATCH_UP_BOUNDED: {n!r}"
                )


@dataclass(frozen=True, slots=True)
class TimerTick:
    """One delivered tick: its timer, its sequence, when it was due and when it fired.

    ``late_ticks`` counts the due ticks skipped (never delivered) just before this one: under
    SKIP_LATE_TICKS the one tick delivered after a stall reports every period it stands for;
    under CATCH_UP_BOUNDED the first tick delivered reports those beyond the catch-up bound.
    """

    name: str
    sequence: int
    scheduled_at: float
    fired_at: float
    late_ticks: int


def timer_handler(name: str) -> Callable[[F], F]:
    """Mark a method as the callback of the timer ``name``: ``def on_x(self, tick: TimerTick)``."""
    if not isinstance(name, str) or not 0 < len(name.encode()) <= 255:
        raise InvalidArgument(f"a timer name is 1..255 bytes of UTF-8, got {name!r}")

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
    """One tick on its owner's application lane."""

    __slots__ = ("tick", "timer")

    def __init__(self, timer: Timer, tick: TimerTick) -> None:
        self.size = 0
        self.at = tick.fired_at
        self.timer = timer
        self.tick = tick

    def invoke(self) -> Any:
        timer = self.timer
        if timer.cancelled or timer.host.rt.stopping:
            return None  # cancelled after this tick was queued: it never reaches the handler
        if timer.options.keeps_alive:
            timer.host.touch()  # otherwise a tick is not activity (idle eviction)
        return timer.fn(timer.host.instance, self.tick)

    def finish(self, turn: Turn) -> None:
        self.timer.tick_done()
        rt = self.timer.host.rt
        rt.close_scope(turn, turn.error is None)
        if turn.error is not None:
            rt.metrics.add("handler_errors")
            _log.error(
                "timer %r of %r failed", self.timer.name, self.timer.host.name, exc_info=turn.error
            )
        turn.barriers = CLOSED


class _Metrics(Protocol):
    def add(self, name: str, n: int = 1) -> None: ...


class TimerRuntime(Protocol):
    """What a timer needs of its node's runtime (``zlink.runtime`` implements it)."""

    @property
    def stopping(self) -> bool: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def infra(self) -> InfraExecutor: ...

    @property
    def metrics(self) -> _Metrics: ...

    def close_scope(self, turn: Turn, ok: bool) -> None: ...


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

    def cancel_timer(self, name: str) -> bool: ...


class Timer:
    """A registered timer: its schedule on the infrastructure heap and its tick bookkeeping."""

    __slots__ = (
        "_lock",
        "cancelled",
        "delivered",
        "dropped",
        "fn",
        "handle",
        "host",
        "interval",
        "name",
        "next_due",
        "options",
        "owner",
        "queued",
        "sequence",
        "skipped",
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
    ) -> None:
        self.name = name
        self.interval = interval
        self.options = options
        self.host = host
        self.owner = owner  # where ticks queue: the host's own lanes, or a timer owner (PerActor)
        self.fn = fn
        self.next_due = first_due
        self.sequence = 0  # the last delivered tick
        self.handle: DeadlineHandle | None = None
        self.cancelled = False
        self.delivered = self.skipped = self.dropped = 0
        self.queued = 0  # ticks admitted and not yet finished (idle eviction ignores these)
        self._lock = threading.Lock()  # queued has two writers: the infra thread and the gate

    def tick_done(self) -> None:
        with self._lock:
            self.queued -= 1

    def arm(self) -> None:
        self.handle = self.host.rt.infra.call_at(self.next_due, self._fire)

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def _fire(self) -> None:
        """On the infrastructure thread: queue the due tick(s) by policy, then re-arm."""
        if self.cancelled:
            return
        rt = self.host.rt
        now = rt.clock.now()
        due = self.next_due
        late = int((now - due) // self.interval) if now > due else 0  # periods missed
        opts = self.options
        catch_up = (
            min(late, opts.max_catch_up_ticks)
            if opts.overrun_policy is OverrunPolicy.CATCH_UP_BOUNDED
            else 0
        )
        self.skipped += late - catch_up
        first = late - catch_up  # periods skipped; the oldest one still delivered
        for k in range(first, late + 1):
            self.sequence += 1
            skipped = first if k == first else 0
            tick = TimerTick(self.name, self.sequence, due + k * self.interval, now, skipped)
            with self._lock:
                self.queued += 1
            job = TimerJob(self, tick)
            verdict = self.owner.put_app(job)
            if verdict == Admission.CLOSED:  # sealed for a move: the tick is pending and moves
                # reserved past the seal, as a moved item is: its turn (here, if the move is
                # withdrawn) or the move returns the reservation, which must then exist
                self.owner.lanes.put_app_moved(job, 0)
                verdict = Admission.ADMITTED
            if verdict == Admission.ADMITTED:
                self.delivered += 1
            else:
                self.tick_done()
                self.dropped += 1
                rt.metrics.add("timer_ticks_dropped")
        self.next_due = due + (late + 1) * self.interval
        if not rt.stopping:
            self.arm()


class TimerHandle:
    """What ``timers.register`` returns: the timer's name and a way to cancel it."""

    __slots__ = ("_timer",)

    def __init__(self, timer: Timer) -> None:
        self._timer = timer

    @property
    def name(self) -> str:
        return self._timer.name

    @property
    def active(self) -> bool:
        """Whether the timer is still registered."""
        return not self._timer.cancelled

    def cancel(self) -> bool:
        """Cancel the timer; ``False`` if it was already cancelled."""
        return self._timer.host.cancel_timer(self._timer.name)


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

        The first tick comes ``first_delay`` seconds from now (default: one interval).
        """
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
        return self._host.cancel_timer(name)

    def names(self) -> list[str]:
        """The names of the registered timers."""
        return sorted(self._host.timers)
