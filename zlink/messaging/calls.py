"""Call builders and their terminals (python-api §4; execution-model §3-§6, kotlin interface).

A call is built with single-use fluent options and ended by exactly one terminal:

* ``await call``: inside a handler; submits and waits, **keeping the turn** (gate and claim).
  Outside the runtime, in asyncio code (a running event loop, no turn), ``await call`` bridges
  to that loop (python-api §10): as ``await asyncio.wrap_future(call.future())``, and a
  one-way call waits for admission as ``future()`` does; a cancelled ``await`` gives up the
  call (a request completes with ``Cancelled``; a send still waiting for room is withdrawn).
* ``await call.yield_()``: SpotWide User Spot and Instance Spot turns only; releases the shared
  gate while waiting and resumes in a new turn at the back of the queue (§3).
* ``call.wait(timeout)`` / ``call.future()``: code outside the runtime.
* ``send.submit()``: the one-way terminal without waiting, usable anywhere (admission of a
  local lane is immediate: accepted, or ``ResourceExhausted``).

Every check that can refuse a call (wrong context, self-wait, bad target, bad payload, full
lane) raises **before** anything is submitted or any queue changes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import sysconfig
import warnings
from collections.abc import Callable, Generator
from enum import Enum
from types import FunctionType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from ..durations import check_seconds, check_timeout
from ..errors import Cancelled, InvalidArgument, InvalidOperation, ZLinkError
from ..executor import Suspension, current_turn, in_infrastructure
from ..types import TargetKind
from .completion import ON_ITS_WAY, Admitted, Completion
from .message import Message

if TYPE_CHECKING:
    from ..executor import Turn
    from .port import RuntimePort as Runtime

T = TypeVar("T")

# the kinds as module globals: an enum attribute read costs ~0.1 us per send on 3.11
_SPOT, _ACTOR = TargetKind.SPOT, TargetKind.ACTOR
_CHANNEL, _TOPIC = TargetKind.CHANNEL, TargetKind.TOPIC


def _refuse_if_cancelled() -> None:
    """An ``await`` in a turn that was cancelled (a close past its deadline, python-api §11)
    submits nothing: it raises the turn's cancellation at once, as its suspension would have
    (an audit found the call submitted first, and a worker's work run after ``on_closing``,
    its caller told ``Cancelled``). §16: a refusal comes before anything is submitted."""
    turn = current_turn()
    if turn is not None and turn.cancelled is not None:
        raise turn.cancelled


def _refuse_unstepped(turn: Turn) -> None:
    """An ``await`` in a turn is stepped by the runtime only in the handler's own coroutine:
    asyncio code that a ``def`` handler runs (``asyncio.run``) would be handed the runtime's
    suspension (a probe's call was submitted, then its task died of "bad yield"). Refused
    before anything is submitted, as ``wait()`` in a turn is (python-api §4, §16)."""
    if turn.coro is None:
        raise InvalidOperation(
            "a ZLink call is awaited inside a handler's turn but outside its own coroutine "
            "(asyncio code run by a def handler?): declare the handler async def and await "
            "the call there, or submit() it"
        )


class WaitMode(Enum):
    """How the submitter of a call will wait for it (python-api §4 terminals)."""

    NO_WAIT = "no_wait"  # submitted by a thread outside the runtime, or without waiting
    KEEP_TURN = "keep_turn"  # awaited with the regular terminal: the turn is kept
    YIELD_GATE = "yield_gate"  # awaited with yield_(): the shared gate is released meanwhile


NO_WAIT, KEEP_TURN, YIELD_GATE = WaitMode.NO_WAIT, WaitMode.KEEP_TURN, WaitMode.YIELD_GATE


def check_id(what: str, value: object) -> str:
    """A SpotId / ActorId (and a type name, topic, channel, mesh name) is a str of 1..255
    bytes of valid UTF-8 (python-api §5); anything else is ``InvalidArgument``.

    The common case costs no encoding: an ascii str (``isascii()`` reads a flag the str
    keeps) is its own UTF-8, one byte a character. Any other str is encoded strictly, which
    both counts its bytes and refuses what has no UTF-8 form (a lone surrogate), so nothing
    accepted here can fail to encode later, on the wire to another node.
    """
    if type(value) is str and value.isascii() and 0 < len(value) <= 255:
        return value
    if type(value) is not str:
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    n = len(value)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{what} must be valid UTF-8, got {n} characters with a lone surrogate at {exc.start}"
        ) from None
    if n == 0 or size > 255:
        raise InvalidArgument(f"{what} must be 1..255 bytes of UTF-8, got {size} bytes")
    return value


def _check_text(what: str, value: object) -> str:
    """A str with a UTF-8 form (metadata travels to other nodes as UTF-8 JSON)."""
    if type(value) is not str:
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"{what} must be valid UTF-8, got a lone surrogate at {exc.start}"
            ) from None
    return value


def outside_only(
    what: str, hint: str = "in a handler use `await call` or `await call.yield_()`"
) -> None:
    """``InvalidOperation`` when ``what``, which blocks its thread, is called inside a turn
    (it would wait for work that turn holds up: python-api §4) or on the infrastructure
    thread; ``hint`` says what to do instead."""
    if current_turn() is not None:
        raise InvalidOperation(
            f"{what} blocks the thread and is for code outside the runtime; {hint}"
        )
    if in_infrastructure():
        raise InvalidOperation(f"{what} would block the infrastructure thread")


def _bridge_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running asyncio loop an ``await`` outside the runtime bridges to (python-api §10);
    ``InvalidOperation`` where there is none (or on the infrastructure thread)."""
    if in_infrastructure():
        raise InvalidOperation(f"{what} would wait on the infrastructure thread")
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise InvalidOperation(
            f"{what} works inside ZLink handlers and in asyncio code (a running event loop); "
            "elsewhere use call.wait(timeout) or call.future()"
        ) from None


_F = TypeVar("_F", bound=Callable[..., Any])


def _option_method(method: _F) -> _F:
    """An option that refuses a bad value marks its call as one a terminal was tried on: the
    caller has heard of the call already, so it is not also warned of as never ended."""

    @functools.wraps(method)
    def checked(self: _Call, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._attempt()
            raise

    return checked  # type: ignore[return-value]


class _Call:
    __slots__ = ("_ended", "_options", "_rt")

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._options: set[str] | None = None  # made on the first option: most calls have none
        self._ended: bool | None = False  # None: a terminal was tried and refused (no warning)

    def _option(self, name: str) -> None:
        if self._ended:
            raise InvalidOperation(f"option {name} after the call's terminal")
        if self._options is None:
            self._options = set()
        elif name in self._options:
            raise InvalidOperation(f"option {name} given twice on one call")
        self._options.add(name)

    def _attempt(self) -> None:
        """A terminal is being tried: if it is refused, the call is not one never ended."""
        if self._ended is False:
            self._ended = None

    def _unspent(self) -> None:
        """Refuse a repeated terminal before it does anything (python-api §11)."""
        if self._ended:
            raise InvalidOperation("a call takes exactly one terminal")

    def _terminal(self) -> None:
        self._unspent()
        self._ended = True


class _Completing(_Call, Generic[T]):
    """The terminals of a call that completes with a value; subclasses say how to submit."""

    __slots__ = ()

    def _submit(self, mode: WaitMode) -> Completion:
        raise NotImplementedError

    def __await__(self) -> Generator[Any, Any, T]:
        self._attempt()
        turn = current_turn()
        if turn is None:  # asyncio code outside the runtime: bridge to its loop
            return (yield from self._await_bridged())
        if turn.cancelled is not None:  # (``_refuse_if_cancelled``, inline: hot)
            raise turn.cancelled
        if turn.coro is None:
            _refuse_unstepped(turn)
        self._terminal()
        completion = self._submit(KEEP_TURN)
        return (yield Suspension(False, completion.add_callback))  # type: ignore[no-any-return]

    def _await_bridged(self) -> Generator[Any, Any, T]:
        """``await call`` in asyncio code: submit, then wait on the running loop without
        blocking it. A cancelled ``await`` completes the call with ``Cancelled`` (a reply
        that still comes is then dropped and counted, as a late one is)."""
        _bridge_loop(f"`await {type(self).__name__}`")
        self._terminal()
        completion = self._submit(NO_WAIT)
        waiting = asyncio.wrap_future(completion.future())
        try:
            return (yield from waiting.__await__())  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            completion.set(None, Cancelled("the awaiting asyncio task was cancelled"))
            raise

    def yield_(self) -> _Yielding[T]:
        """Wait releasing the shared gate (SpotWide User Spot / Instance Spot turns only)."""
        self._attempt()
        self._rt.check_yield(self)
        self._terminal()
        return _Yielding(self)

    def wait(self, timeout: float | None = None) -> T:
        """Outside the runtime: submit and block up to ``timeout`` real seconds (``None``: no
        limit but the call's own; python-api §9: else ``1e-3 .. 1e7``, checked first)."""
        self._attempt()
        outside_only(f"{type(self).__name__}.wait()")
        timeout = check_timeout(timeout, "a wait timeout")
        self._terminal()
        return self._submit(NO_WAIT).wait(timeout)  # type: ignore[no-any-return]

    def future(self) -> concurrent.futures.Future[T]:
        """Outside the runtime: a ``concurrent.futures.Future`` of the result."""
        self._attempt()
        outside_only(f"{type(self).__name__}.future()")
        self._terminal()
        return self._submit(NO_WAIT).future()


class MessageCall(_Call):
    """Options shared by sends and requests to a Spot, an Actor or a Channel."""

    # What every call sets is a slot; options and routing notes most calls never set are class
    # defaults until set (then in the instance dict): a send stores 6 attributes, not 13.
    __slots__ = ("__dict__", "kind", "msg", "target")

    meta: dict[str, str] | None = None
    instance = False
    instance_type: str | None = None
    mesh: str | None = None
    deadline: float | None = None  # seconds (requests)
    origin: str | None = None  # the node a relayed call started on (mesh routing)
    via: str | None = None  # the node that handed it over last (mesh routing)
    # a request from a peer: (the node its reply goes to, the id it is awaited under), kept
    # when a stale route relays it on (mesh routing)
    reply_route: tuple[str, int] | None = None
    wire: tuple[str, str] | None = None  # the message's wire form, once made (mesh routing)
    event: Any = None  # a Logical Multicast event's number from a peer (a mesh.wire.EventStamp)

    def __init__(self, rt: Runtime, kind: TargetKind, target: str, msg: Message) -> None:
        self._rt = rt  # _Call.__init__ inlined: this runs once per message
        self._options = None
        self._ended = False
        self.kind = kind
        self.target = target
        self.msg = msg

    @_option_method
    def metadata(self, key: str, value: str) -> Self:
        """Attach a string header, once per key; keys and values are str of valid UTF-8."""
        _check_text("a metadata key", key)
        _check_text("a metadata value", value)
        self._option(f"metadata[{key}]")
        if self.meta is None:
            self.meta = {}
        self.meta[key] = value
        return self

    @_option_method
    def instance_spot(self, stable_type: str | None = None) -> Self:
        """Address an Instance Spot, activating it (of ``stable_type``) on its first message."""
        if self.kind != _SPOT:
            raise InvalidOperation("instance_spot() applies to Spot calls only")
        if stable_type is not None:
            check_id("instance spot type", stable_type)
        self._option("instance_spot")
        self.instance, self.instance_type = True, stable_type
        return self

    @_option_method
    def in_mesh(self, mesh_name: str) -> Self:
        """Route within the mesh named ``mesh_name``."""
        check_id("mesh name", mesh_name)
        self._option("in_mesh")
        self.mesh = mesh_name
        return self


class _OneWay(_Call):
    """The terminals of one-way calls besides ``submit()``: each waits for room in a full
    lane (python-api §9); subclasses say how to submit while waiting (``_queue``)."""

    __slots__ = ()

    def submit(self) -> None:
        raise NotImplementedError

    def _queue(self, room: Admitted, mode: WaitMode) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> None:
        """Outside the runtime: submit, waiting up to ``timeout`` seconds (default
        ``NodeConfig.admission_timeout``) for room in a full lane; returns once admitted.
        ``DeadlineExceeded`` if there was no room in time (nothing was queued);
        ``ResourceExhausted`` at once if too many callers wait for room already."""
        self._attempt()
        outside_only(f"{type(self).__name__}.wait()")
        timeout = check_timeout(timeout, "a wait timeout")
        self._waiting(timeout, NO_WAIT).wait_admitted(timeout)

    def future(self) -> concurrent.futures.Future[None]:
        """Outside the runtime: a future that completes once admitted, waiting for room as
        ``wait()`` does."""
        self._attempt()
        outside_only(f"{type(self).__name__}.future()")
        return self._waiting(None, NO_WAIT).future()

    def __await__(self) -> Generator[Any, Any, None]:
        """In a handler: wait for room keeping the turn, then go on; a wait only this turn's
        own gate could end is ``InvalidOperation``. In asyncio code outside the runtime: wait
        for admission on the running loop, as ``future()`` does (python-api §10). A task
        cancelled meanwhile raises ``CancelledError`` if the send was withdrawn (nothing
        queued), returns if it was admitted, and raises ``CancelledError`` with a note if it
        had left for another node whose verdict had not come (it may still be admitted, as
        a ``wait()``'s ``DeadlineExceeded`` then says)."""
        self._attempt()
        turn = current_turn()
        if turn is None:
            _bridge_loop(f"`await {type(self).__name__}`")
            room = self._waiting(None, NO_WAIT)
            waiting = asyncio.wrap_future(room.future())
            try:
                yield from waiting.__await__()
            except asyncio.CancelledError as cancelled:  # given up: withdrawn if it waits
                if room.abandon(Cancelled("the awaiting asyncio task was cancelled")):
                    raise  # nothing was queued: the cancellation stands
                with contextlib.suppress(ZLinkError):  # admitted as the task was cancelled
                    room.wait(ON_ITS_WAY)  # (or its verdict on its way from another node)
                    return None  # sent: a cancelled await means nothing was queued (as in
                if not room.done:  # trio; a probe's caller took 186 sends it was told
                    cancelled.add_note(  # cancelled as unsent). Left for another node, with
                        "the send had left for another node, which may still admit it"
                    )  # no verdict yet: as a wait's DeadlineExceeded, it may be admitted
                raise
            return None
        _refuse_if_cancelled()
        _refuse_unstepped(turn)
        room = self._waiting(None, KEEP_TURN)
        if not room.done:
            try:
                yield Suspension(False, room.add_callback)
            except BaseException as exc:  # cancelled (a close past its deadline): the wait
                room.abandon(exc)  # is withdrawn first, so nothing is queued after all
                raise
        room.wait(0)  # raises the wait's error, if it ended with one
        return None

    def _waiting(self, timeout: float | None, mode: WaitMode) -> Admitted:
        self._terminal()
        room = Admitted(timeout)
        self._queue(room, mode)
        return room


class SendCall(MessageCall, _OneWay):
    """A one-way send; completes when the target lane admits it."""

    __slots__ = ()

    def submit(self) -> None:
        """Admit the message now, anywhere (handler or plain thread), without waiting."""
        if self._ended:
            raise InvalidOperation("a call takes exactly one terminal")
        self._ended = True
        self._rt.submit(self, None, NO_WAIT, 0, False, self._options is None)

    def _queue(self, room: Admitted, mode: WaitMode) -> None:
        # (from a plain thread: the fast path, as submit() takes it; an await in a handler
        # goes the general way, which refuses a wait on the turn's own gate, room or not)
        plain = mode is NO_WAIT and self._options is None
        self._rt.submit(self, None, mode, plain=plain, room=room)


class BatchSendCall(_OneWay):
    """Several one-way messages to one Spot or Actor, admitted together (all or none); its
    ``wait()`` / ``future()`` / ``await`` wait for room for all of them at once."""

    __slots__ = ("kind", "msgs", "origin", "target")

    def __init__(self, rt: Runtime, kind: TargetKind, target: str, msgs: list[Message]) -> None:
        super().__init__(rt)
        self.kind = kind
        self.target = target
        self.msgs = msgs
        self.origin: str | None = None  # a batch from another node: the node it began on

    def parts(self) -> list[SendCall]:
        """Its messages as single sends, in order, each knowing the batch's origin (a drop
        is told there: python-api §9)."""
        calls = [SendCall(self._rt, self.kind, self.target, msg) for msg in self.msgs]
        if self.origin is not None:
            for call in calls:
                call.origin = self.origin
        return calls

    def submit(self) -> None:
        """Admit every message now, in order, behind one lock and one wake-up of the target;
        ``ResourceExhausted`` if they do not all fit (then none was queued). A target on
        another node, or one that is moving, gets them one by one, in order."""
        self._terminal()
        self._rt.submit_many(self)

    def _queue(self, room: Admitted, mode: WaitMode) -> None:
        self._rt.submit_many(self, room, mode)


class RequestCall(MessageCall, _Completing[T]):
    """A request whose reply is a ``T``."""

    __slots__ = ()

    @_option_method
    def timeout(self, seconds: float) -> Self:
        """Fail with ``DeadlineExceeded`` after ``seconds`` on the node's clock."""
        value = check_seconds(seconds, "a timeout")
        self._option("timeout")
        self.deadline = value
        return self

    def _submit(self, mode: WaitMode) -> Completion:
        return self._rt.submit(self, Completion(), mode)


class _Yielding(Generic[T]):
    """The awaitable ``yield_()`` returns: submits on ``await`` and releases the gate."""

    __slots__ = ("_call", "_spent")

    def __init__(self, call: _Completing[T]) -> None:
        self._call, self._spent = call, False

    def __await__(self) -> Generator[Any, Any, T]:
        if self._spent:
            raise InvalidOperation("a yield_() awaitable can be awaited once")
        self._spent = True
        turn = current_turn()
        if turn is not None:
            _refuse_unstepped(turn)
        if turn is not None and turn.job.whole:  # a lifecycle callback nothing may overtake:
            _refuse_if_cancelled()  # it waits keeping the gate, as ``await call`` does
            completion = self._call._submit(KEEP_TURN)
            return (yield Suspension(False, completion.add_callback))  # type: ignore[no-any-return]
        rt = self._call._rt
        counted = rt.yield_begin()
        try:
            _refuse_if_cancelled()  # (a Yield past its close's deadline is cancelled here)
            completion = self._call._submit(YIELD_GATE)
        except BaseException:
            rt.yield_end(counted)
            raise
        try:
            value = yield Suspension(True, completion.add_callback)
        except GeneratorExit:  # closed unresumed (dropped at shutdown): no lock taken here,
            raise  # a garbage collection may run this on any thread, under any lock
        except BaseException:  # resumed with its error (a failure, a close's Cancelled)
            rt.yield_end(counted)
            raise
        rt.yield_end(counted)  # the continuation resumed, on the gate
        return value  # type: ignore[no-any-return]


class CreateCall(_Completing[T]):
    """A Spot or Actor create / get-or-create; the result is a create result."""

    __slots__ = ("deadline", "get", "kind", "mesh", "object_id", "request_msg", "type_name")

    def __init__(
        self, rt: Runtime, kind: TargetKind, type_name: str, object_id: str | None, get: bool
    ) -> None:
        super().__init__(rt)
        self.kind = kind
        self.type_name = type_name
        self.object_id = object_id
        self.get = get  # get_or_create
        self.request_msg: Message | None = None
        self.deadline: float | None = None
        self.mesh: str | None = None

    @_option_method
    def request(self, msg: Message) -> Self:
        """The message ``on_create`` / ``on_create_actor`` receives."""
        if not isinstance(msg, Message):
            raise InvalidArgument(f"a create request is a zlink.Message, got {type(msg).__name__}")
        self._option("request")
        self.request_msg = msg
        return self

    @_option_method
    def timeout(self, seconds: float) -> Self:
        """Fail with ``DeadlineExceeded`` after ``seconds`` on the node's clock."""
        value = check_seconds(seconds, "a timeout")
        self._option("timeout")
        self.deadline = value
        return self

    @_option_method
    def in_mesh(self, mesh_name: str) -> Self:
        """Create within the mesh named ``mesh_name``."""
        check_id("mesh name", mesh_name)
        self._option("in_mesh")
        self.mesh = mesh_name
        return self

    def _submit(self, mode: WaitMode) -> Completion:
        return self._rt.submit_create(self, mode)


class WorkerCall(_Completing[T]):
    """Blocking (``io``) or CPU-bound (``cpu``) work run off the gate on a bounded pool (§16).

    The function runs on a worker pool thread, never on an application worker, so the turn's
    gate is not occupied by it: ``await`` keeps the turn while waiting; ``yield_()`` (SpotWide
    User Spots and Instance Spots) releases the shared gate. Its exception is raised as is.
    """

    __slots__ = ("args", "deadline", "fn", "kwargs", "pool")

    def __init__(
        self, rt: Runtime, pool: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if not callable(fn):  # before anything is set: a half-made call warns of nothing
            raise InvalidArgument(f"workers.{pool}() takes a callable, got {fn!r}")
        super().__init__(rt)
        self.pool = pool  # "io" or "cpu"
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.deadline: float | None = None

    @_option_method
    def timeout(self, seconds: float) -> Self:
        """Fail the wait with ``DeadlineExceeded`` after ``seconds`` (the work still runs)."""
        value = check_seconds(seconds, "a timeout")
        self._option("timeout")
        self.deadline = value
        return self

    def _submit(self, mode: WaitMode) -> Completion:
        return self._rt.submit_worker(self)


class JoinCall(_Call):
    """An Actor Join; its single terminal is the synchronous ``defer()`` (execution-model §5)."""

    __slots__ = ("actor_id", "request_msg", "target", "turn")

    def __init__(
        self, rt: Runtime, actor_id: str, target: str, request_msg: Message | None
    ) -> None:
        super().__init__(rt)
        self.actor_id = actor_id
        self.target = target
        self.request_msg = request_msg
        self.turn = current_turn()  # the registration scope: the handler that made the call

    def defer(self) -> None:
        """Register the Join to run after this handler ends normally. Returns ``None``.

        Starts no I/O and keeps the gate and the Actor claim. Outside the handler's scope:
        ``InvalidOperation``. A second ``defer()`` is ``InvalidOperation`` and registers
        nothing (python-api §11): the call is checked unspent before the Join is registered,
        and marked spent only once it is.
        """
        self._unspent()
        self._attempt()
        self._rt.defer_join(self)
        self._ended = True


class RelocationReadyCall(_Call):
    """``context.relocation_ready()``: its single terminal ``defer()`` marks the end of this
    turn as a boundary where an ``APPLICATION_SIGNALED`` Spot may move (kotlin-spot-interface)."""

    __slots__ = ("spot_id", "turn")

    def __init__(self, rt: Runtime, spot_id: str) -> None:
        super().__init__(rt)
        self.spot_id = spot_id
        self.turn = current_turn()

    def defer(self) -> None:
        """Register the boundary after this handler ends normally. Returns ``None``.

        ``InvalidOperation`` before any queue change in the default mode, in PER_ACTOR, in
        Entry and Instance Spots, outside the Spot's own turn, and the second time in a turn;
        a second ``defer()`` of this call is refused as a repeated terminal before any other
        check (python-api §11).
        """
        self._unspent()
        self._attempt()
        self._rt.defer_relocation_ready(self)
        self._ended = True


# -- calls never given a terminal ------------------------------------------------------------
def _warn_unended(call: _Call) -> None:
    """``__del__`` of the calls the public builders return: a call collected without a
    terminal was never sent, which is almost always a forgotten ``.submit()`` (as asyncio
    warns of a coroutine never awaited). Internal calls are the plain classes: no cost."""
    if getattr(call, "_ended", None) is not False:  # ended, tried, or never fully made
        return
    target = getattr(call, "target", None) or getattr(call, "spot_id", None)
    what = type(call).__mro__[1].__name__
    msg = getattr(call, "msg", None)
    detail = f" with {type(msg).__qualname__}" if msg is not None else ""
    # At interpreter exit the warnings module may be gone; a warning turned into an error
    # (``-W error``) still propagates, and Python reports it as raised in __del__.
    with contextlib.suppress(AttributeError, TypeError, ImportError):
        warnings.warn(
            f"{what} to {target!r}{detail} was never given a terminal (.submit(), .wait(), "
            ".future() or await): nothing was sent",
            RuntimeWarning,
            stacklevel=2,
        )


# Whether the public builders' calls warn when collected without a terminal. Not where this
# module runs as Python on the free-threaded build: there an object freed for another thread
# (biased reference counting) is freed at the owner's next check for pending work, which a
# Python ``__del__`` itself reaches, so under load each nests the next (thousands of
# RecursionErrors; a probe). Compiled (the default there) it runs no such check.
WATCHED = not (
    sysconfig.get_config_var("Py_GIL_DISABLED") and isinstance(_warn_unended, FunctionType)
)


class WatchedSendCall(SendCall):
    """A ``SendCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended


class WatchedBatchSendCall(BatchSendCall):
    """A ``BatchSendCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended


class WatchedRequestCall(RequestCall[T]):
    """A ``RequestCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended


class WatchedCreateCall(CreateCall[T]):
    """A ``CreateCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended


class WatchedWorkerCall(WorkerCall[T]):
    """A ``WorkerCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended


class WatchedJoinCall(JoinCall):
    """A ``JoinCall`` from a public builder; warns if collected without a terminal."""

    __slots__ = ()
    if WATCHED:
        __del__ = _warn_unended
