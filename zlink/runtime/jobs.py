"""What owners queue: a message, a batch, a lifecycle step (execution-model §7, §8)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..errors import (
    Cancelled,
    HandlerError,
    Unavailable,
    ZLinkError,
)
from ..executor import CLOSED, Job, Lane, Turn, current_turn, run_turns

if TYPE_CHECKING:
    from .runtime import Runtime
from ..messaging.completion import Completion
from ..messaging.context import (
    MessageContext,
)
from ..types import RelocationReadyStatus
from .acts import Act, ActorAct, AnsweredElsewhere, Discarded, SpotAct
from .type_stats import timed

if TYPE_CHECKING:
    from ..handlers import HandlerSpec
    from ..messaging.message import Message


_log = logging.getLogger("zlink.runtime")


# --------------------------------------------------------------------------------------------
# jobs
# --------------------------------------------------------------------------------------------
class SendJob(Job):
    """A one-way message, without metadata, for a plain ``def`` handler of a Spot or Actor:
    a ``light`` job (the gate runs it without the general turn machinery). Only the fast
    path of ``Runtime.submit`` makes one (a ``submit()`` or a plain thread's ``wait()``, or a
    send from another node), filling its slots without an ``__init__`` frame (the hottest
    path)."""

    __slots__ = ("act", "handler", "msg", "origin", "sender")
    light = True
    reply: Completion | None = None  # what a MessageJob adds, as seen on a SendJob
    meta: dict[str, str] | None = None
    topic: str | None = None

    act: Act
    handler: HandlerSpec
    msg: Message
    sender: str | None
    origin: str  # set only for a one-way message from another node: the node it began on

    def invoke(self) -> Any:
        act = self.act
        if act.rt.stopping:
            raise Discarded
        h = self.handler
        fn = h.fn
        if act.owner is not None:  # a Channel (a MessageJob's) has none
            # messages handled (idle eviction, type_stats); only the gate holder writes it
            n = act.activity = act.activity + 1
            if not n & 63:  # one in SAMPLE_EVERY is timed (a literal: no global on this path)
                fn = partial(timed, act, fn)
        if h.wants_context:
            ctx = MessageContext(self.meta or {}, self.sender, h.is_request, self.topic)
            return fn(act.instance, self.msg, ctx)
        return fn(act.instance, self.msg)

    def finish(self, turn: Turn) -> None:
        if self.reply is None and turn.error is None and turn.barriers is None:
            turn.barriers = CLOSED  # the common case: a one-way message that ended normally
            return
        self.act.rt.finish_message(self, turn)

    def discard(self, error: BaseException) -> None:
        if self.reply is not None:
            self.reply.set(None, error)


class MessageJob(SendJob):
    """An application message (one-way or request, with metadata or a topic, for any
    handler) for one handler."""

    __slots__ = ("meta", "reply", "topic")
    light = False

    def __init__(
        self,
        act: Act,
        handler: HandlerSpec,
        msg: Message,
        reply: Completion | None,
        meta: dict[str, str] | None,
        sender: str | None,
        size: int,
        topic: str | None = None,
    ) -> None:
        self.at = 0.0
        self.topic = topic
        self.size = size
        self.act = act
        self.handler = handler
        self.msg = msg
        self.reply = reply
        self.meta = meta
        self.sender = sender


class RecordedJob(MessageJob):
    """The message of an Instance Spot's durable first record (execution-model §14, cold
    activation): once its handler has ended, normally or not, ``ran`` clears the record; a
    job discarded unrun (the node fenced itself or stopped) leaves it for the next owner."""

    __slots__ = ("ran",)

    ran: Callable[[], None]

    def finish(self, turn: Turn) -> None:
        try:
            super().finish(turn)
        finally:
            self.ran()


class BatchJob(Job):
    """Messages of one batch send (python-api ``send_many_*``): one queue entry that reserves
    one lane item per message and runs them back to back, each as a turn of its own (its own
    Defer() scope, error and current turn) with nothing of the same owner in between. Only
    plain ``def`` handlers and one-way messages; anything else is queued message by message.

    ``handlers`` is the one handler of a batch of one message type, else one per message.
    """

    __slots__ = ("act", "count", "handlers", "msgs", "origin", "sender")

    def __init__(self, act: SpotAct | ActorAct, handlers: HandlerSpec | list[HandlerSpec],
                 msgs: list[Message], sender: str | None, size: int) -> None:  # fmt: skip
        self.size = size
        self.at = 0.0
        self.act = act
        self.handlers = handlers
        self.msgs = msgs
        self.count = len(msgs)
        self.sender = sender
        self.origin: str | None = None  # a peer's batch (or one a move carried): the node
        # it was admitted on, told of a discard (python-api §9: at both ends)

    def invoke(self) -> Any:
        act = self.act
        rt = act.rt
        outer = current_turn()
        handlers = self.handlers
        calls: Iterable[tuple[Callable[[Any, Any], Any], Message]]
        if type(handlers) is list:
            calls = [(self._bound(h), msg) for h, msg in zip(handlers, self.msgs, strict=True)]
        else:
            calls = zip(repeat(self._bound(handlers)), self.msgs)  # type: ignore[arg-type]
        act.activity += self.count
        calls = iter(calls)
        if run_turns(self, outer.owner if outer is not None else None, calls, act.instance,
                     self._after, rt):  # fmt: skip
            # the node stopped: the message in hand and the rest never ran
            unrun = 1 + sum(1 for _ in calls)
            rt.metrics.add("messages_discarded_at_shutdown", unrun)
            self.tell_discarded(Unavailable(f"node {rt.node_id} shut down before it ran"),
                                self.msgs[-unrun:])  # fmt: skip
        return None

    def tell_discarded(self, error: BaseException, msgs: list[Message] | None = None) -> None:
        """Messages of a batch (``msgs``: all) discarded unrun (a stop, a close, a fence):
        the node it was admitted on, if another, counts them too (python-api §9: at both
        ends), in one notice per message type."""
        router = self.act.rt.router
        if self.origin is None or router is None:
            return
        unrun = self.msgs if msgs is None else msgs
        for message_type, count in Counter(m.zlink_type_name for m in unrun).items():
            router.tell_dropped(self.origin, self.act.name, message_type, error, count)

    def _bound(self, h: HandlerSpec) -> Callable[[Any, Any], Any]:
        """``h`` as ``fn(instance, msg)``: a handler that takes a context gets one per message."""
        if not h.wants_context:
            return h.fn
        fn, sender = h.fn, self.sender
        return lambda instance, msg: fn(instance, msg, MessageContext({}, sender, False, None))

    def _after(self, turn: Turn) -> None:
        """A message turn that failed or registered Defer() barriers (``run_turns``)."""
        error = turn.error
        self.act.rt.close_scope(turn, error is None)
        if error is not None:
            self.act.rt.metrics.add("handler_errors")
            _log.error("a batch handler of %r failed", self.act.name, exc_info=error)

    def finish(self, turn: Turn) -> None:
        turn.barriers = CLOSED  # each message closed its own scope


_WHOLE = frozenset({"activation", "on_closing", "on_relocation_ready_completed"})


class LifeJob(Job):
    """A lifecycle callback (or a framework step) on an owner's lifecycle lane (§7).

    ``what`` names it: the application callback it runs (``on_closing``), or a framework step
    (``callback=False``: a Join's hold, a relocation barrier). A callback that raises is
    logged and counted here, once, as ``lifecycle_errors_<step>`` before ``done`` decides what
    follows; ``step`` is the callback that raised (an activation runs several: ``constructor``,
    ``on_create``, ``on_initialize``). A framework step reports its failures through ``done``.
    A job discarded unrun is counted by ``discard_jobs`` (``lifecycle_skipped_<what>``), never
    as an error: ``done`` then sees ``skipped`` set and the discard's own error (``failure``).

    An activation (constructor, ``on_create``, ``on_initialize``), ``on_closing`` and
    ``on_relocation_ready_completed`` are ``whole``: a ``yield_()`` in them keeps the gate
    (concepts "Lifecycle": ``on_initialize`` before any message; kotlin-spot-interface: held
    messages and timers do not run before the relocation callback completes; python-api §11:
    no continuation runs after ``on_closing``). A probe found messages run in the Yield of
    each, and a continuation they started resume after ``on_closing`` had ended.
    """

    __slots__ = ("act", "callback", "done", "fn", "lane", "overdue", "skipped", "step", "what",
                 "whole")  # fmt: skip

    def __init__(
        self,
        act: Act,
        what: str,
        fn: Callable[[], Any],
        done: Callable[[Turn], None] | None = None,
        lane: Lane = Lane.LIFECYCLE,
        callback: bool = True,
    ) -> None:
        self.lane = lane
        self.size = 0
        self.at = 0.0
        self.act = act
        self.what = what
        self.step = what
        self.fn = fn
        self.done = done
        self.callback = callback
        self.skipped = False
        self.overdue = False  # on_closing cancelled at its deadline (counted as closing_overdue)
        self.whole = what in _WHOLE

    def invoke(self) -> Any:
        return self.fn()

    def finish(self, turn: Turn) -> None:
        rt = self.act.rt
        error = turn.error
        rt.close_scope(turn, error is None)
        overdue = self.overdue and isinstance(error, Cancelled)  # counted as closing_overdue
        if error is not None and self.callback and not overdue:
            lifecycle_error(self.act, self.step, error)
        if self.done is not None:
            self.done(turn)

    def discard(self, error: BaseException) -> None:
        self.skipped = True
        if self.done is not None:
            fake = Turn(self, None)
            fake.error = error
            self.done(fake)


def lifecycle_error(act: Act, step: str, error: BaseException) -> None:
    """A lifecycle callback of ``act`` failed (raised, or gave what it must not): logged and
    counted once, as ``lifecycle_errors_<step>``."""
    act.rt.metrics.add(f"lifecycle_errors_{step}")
    _log.error("%s of %s failed", step, act.name, exc_info=error)


def failure(turn: Turn) -> ZLinkError:
    """What a lifecycle step's ``done`` passes on for a failed ``turn``: the discard's own
    error for a job that never ran (``Unavailable`` at shutdown), else a ``HandlerError``."""
    job = turn.job
    error = turn.error
    assert error is not None
    if isinstance(job, LifeJob) and job.skipped and isinstance(error, ZLinkError):
        return error
    return handler_error(error)


def discard_jobs(
    rt: Runtime, items: Iterable[Any], error: ZLinkError, reason: str, copies: bool = False
) -> int:
    """Fail every job of ``items`` (drained from an owner) that will never run, each counted
    once: its messages as ``messages_discarded_<reason>`` (a batch counts each), a lifecycle
    step as ``lifecycle_skipped_<what>``, a Yield continuation (its coroutine closed, its
    caller failed) as ``continuations_discarded_<reason>``. A timer tick only gives its place
    back: its timer was cancelled first (closing, shutdown). One-way messages of another node
    are told there. ``copies``: the queue of an arrival whose move is not committed, which
    the source keeps until the store answers: not told, and counted as
    ``arrival_copies_discarded`` (not a loss: a review found them told dropped to their
    origin, which then ran them). Returns how many messages were discarded."""
    messages = continuations = 0
    for item in items:
        if not isinstance(item, Job):
            turn = getattr(item, "turn", None)
            if isinstance(turn, Turn):  # a Yield continuation that will never run: its
                turn.close()  # coroutine is closed (its ``finally`` runs, here) and its
                turn.job.discard(error)  # caller told, as for a message never run
                continuations += 1
            continue
        item.discard(
            AnsweredElsewhere(f"{error} (a copy: its source answers it)")
            if copies and isinstance(item, SendJob) and item.reply is not None
            else error
        )  # (a copy of a request: its source answers it, from the original it keeps)
        if isinstance(item, BatchJob):
            messages += item.count
            if not copies:
                item.tell_discarded(error)  # (a peer's batch: counted there too)
        elif isinstance(item, SendJob):
            messages += item.count
            origin = None if copies else getattr(item, "origin", None)  # (a one-way message
            if origin is not None and rt.router is not None:  # of another node: counted there)
                assert item.reply is None
                rt.router.tell_dropped(origin, item.act.name, item.msg.zlink_type_name, error)
        elif isinstance(item, LifeJob):
            rt.metrics.add("lifecycle_skipped_" + item.what.replace(" ", "_"))
    if messages:
        rt.metrics.add("arrival_copies_discarded" if copies else f"messages_discarded_{reason}",
                       messages)  # fmt: skip
    if continuations:
        rt.metrics.add(f"continuations_discarded_{reason}", continuations)
    return messages


class ReadyBoundary:
    """The barrier ``relocation_ready().defer()`` registers: a waiting move starts here,
    else the Spot is told it continues."""

    __slots__ = ("act", "rt")

    def __init__(self, rt: Runtime, act: SpotAct) -> None:
        self.rt = rt
        self.act = act

    def __call__(self) -> None:
        relocator = self.rt.relocator
        if relocator is None or not relocator.signaled(self.act):
            self.rt.relocation_ready_completed(self.act, RelocationReadyStatus.CONTINUED)


async def run_steps(job: LifeJob, *steps: tuple[str, Callable[[], Any]]) -> Any:
    """Run named callbacks in order within one turn, awaiting those that are coroutines;
    ``job.step`` names the one running (what a failure is counted as)."""
    out: Any = None
    for name, step in steps:
        job.step = name
        out = step()
        if isinstance(out, Coroutine):
            out = await out
    return out


def not_serving(rt: Runtime) -> Unavailable:
    """Why ``rt`` refuses a call made on it, for a node that is fenced, stopping or drained.

    Checked in that order: a node that fenced itself is also marked draining, and a drained
    node that then shuts down is stopping. A drained node still relays calls routed to it and
    serves what stayed (python-api §8 ``node.drain``); only calls made on it are refused.
    """
    if rt.fenced:
        return Unavailable(f"node {rt.node_id} fenced itself: it could not renew its lease")
    if rt.stopping:
        return Unavailable(f"node {rt.node_id} is shutting down")
    return Unavailable(
        f"node {rt.node_id} is draining: it takes no new calls; make them on another node"
    )


def handler_error(exc: BaseException) -> HandlerError:
    err = HandlerError(type(exc).__qualname__, str(exc))
    err.__cause__ = exc
    return err
