"""What owners queue: a message, a batch, a lifecycle step (execution-model §7, §8)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..errors import (
    HandlerError,
)
from ..executor import CLOSED, Job, Lane, Turn, current_turn, run_turns

if TYPE_CHECKING:
    from .runtime import Runtime
from ..messaging.completion import Completion
from ..messaging.context import (
    MessageContext,
)
from ..types import RelocationReadyStatus
from .acts import Act, ActorAct, Discarded, SpotAct

if TYPE_CHECKING:
    from ..handlers import HandlerSpec
    from ..messaging.message import Message


_log = logging.getLogger("zlink.runtime")


# --------------------------------------------------------------------------------------------
# jobs
# --------------------------------------------------------------------------------------------
class SendJob(Job):
    """A one-way message, without metadata, for a plain ``def`` handler of a Spot or Actor:
    a ``light`` job (the gate runs it without the general turn machinery). Only
    ``Runtime.send`` makes one, filling its slots without an ``__init__`` frame (the hottest
    path)."""

    __slots__ = ("act", "handler", "msg", "sender")
    light = True
    reply: Completion | None = None  # what a MessageJob adds, as seen on a SendJob
    meta: dict[str, str] | None = None
    topic: str | None = None

    act: Act
    handler: HandlerSpec
    msg: Message
    sender: str | None

    def invoke(self) -> Any:
        act = self.act
        if act.rt.stopping:
            raise Discarded
        if act.owner is not None:  # a Channel (a MessageJob's) has none
            act.activity += 1  # idle eviction; only the gate holder writes it
        h = self.handler
        if h.wants_context:
            ctx = MessageContext(self.meta or {}, self.sender, h.is_request, self.topic)
            return h.fn(act.instance, self.msg, ctx)
        return h.fn(act.instance, self.msg)

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


class BatchJob(Job):
    """Messages of one batch send (python-api ``send_many_*``): one queue entry that reserves
    one lane item per message and runs them back to back, each as a turn of its own (its own
    Defer() scope, error and current turn) with nothing of the same owner in between. Only
    plain ``def`` handlers and one-way messages; anything else is queued message by message.

    ``handlers`` is the one handler of a batch of one message type, else one per message.
    """

    __slots__ = ("act", "count", "handlers", "msgs", "sender")

    def __init__(self, act: SpotAct | ActorAct, handlers: HandlerSpec | list[HandlerSpec],
                 msgs: list[Message], sender: str | None, size: int) -> None:  # fmt: skip
        self.size = size
        self.at = 0.0
        self.act = act
        self.handlers = handlers
        self.msgs = msgs
        self.count = len(msgs)
        self.sender = sender

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
        run_turns(self, outer.owner if outer is not None else None, calls, act.instance,
                  self._after, rt)  # fmt: skip
        if rt.stopping:
            raise Discarded  # the rest never ran
        return None

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


class LifeJob(Job):
    """A lifecycle callback (or a framework step) on an owner's lifecycle lane (§7)."""

    __slots__ = ("act", "done", "fn", "lane", "what")

    def __init__(
        self,
        act: Act,
        what: str,
        fn: Callable[[], Any],
        done: Callable[[Turn], None] | None = None,
        lane: Lane = Lane.LIFECYCLE,
    ) -> None:
        self.lane = lane
        self.size = 0
        self.at = 0.0
        self.act = act
        self.what = what
        self.fn = fn
        self.done = done

    def invoke(self) -> Any:
        return self.fn()

    def finish(self, turn: Turn) -> None:
        rt = self.act.rt
        rt.close_scope(turn, turn.error is None)
        if self.done is not None:
            self.done(turn)
        elif turn.error is not None:
            rt.metrics.add("handler_errors")
            _log.error("%s of %s failed", self.what, self.act.name, exc_info=turn.error)

    def discard(self, error: BaseException) -> None:
        if self.done is not None:
            fake = Turn(self, None)
            fake.error = error
            self.done(fake)


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


async def run_steps(*steps: Callable[[], Any]) -> Any:
    """Run callbacks in order within one turn, awaiting those that are coroutines."""
    out: Any = None
    for step in steps:
        out = step()
        if isinstance(out, Coroutine):
            out = await out
    return out


def handler_error(exc: BaseException) -> HandlerError:
    err = HandlerError(type(exc).__qualname__, str(exc))
    err.__cause__ = exc
    return err
