"""The errors of ZLink (python-api §5). Every error the framework raises is a ``ZLinkError``::

ZLinkError                  .code: ErrorCode
 +-- InvalidOperation       a call not allowed here: Yield where not offered, self-wait,
 |                          wait() inside a turn, a repeated option or terminal, Defer() out
 |                          of scope, a bad registration (raised before anything is submitted)
 +-- InvalidArgument        bad input: SpotId, payload type, message validation, unknown type
 +-- NotFound               no such Spot, Actor, Channel or type (or it was closed)
 +-- Unavailable            the node is shutting down, draining or fenced, the target is
 |                          sealed, or its node cannot be reached
 +-- DeadlineExceeded       a request, create, wait or move timed out
 +-- ResourceExhausted      a lane's count or byte limit is full (nothing was queued)
 +-- StateIncompatible      state that cannot be captured or restored for a move
 +-- Cancelled              the call was abandoned before completion
 +-- HandlerError           the remote handler raised; ``remote_type`` and ``remote_message``

Each class's docstring says when it is raised and what to do; docs/guide/errors.md has the
full lists.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable error codes, the same on every node and on the wire."""

    INVALID_OPERATION = "INVALID_OPERATION"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    STATE_INCOMPATIBLE = "STATE_INCOMPATIBLE"
    CANCELLED = "CANCELLED"
    HANDLER_ERROR = "HANDLER_ERROR"


class ZLinkError(Exception):
    """The root of every ZLink error (``except zlink.ZLinkError`` catches them all); ``.code``
    is its stable ``ErrorCode``, the same on every node and on the wire.

    What to do: catch a subclass for what you can handle; compare ``.code`` for an error that
    may have crossed a process boundary.
    """

    code: ErrorCode = ErrorCode.INVALID_OPERATION


class InvalidOperation(ZLinkError):
    """The call is not allowed in this place or state, and nothing was submitted: Yield where
    it is not offered, a wait on one's own gate, ``wait()`` inside a turn, a repeated option or
    terminal, a node not running, a registration mistake.

    What to do: it is a bug in the calling code; fix it. Retrying changes nothing.
    """

    code = ErrorCode.INVALID_OPERATION


class InvalidArgument(ZLinkError, ValueError):
    """An argument or payload is malformed, and nothing was submitted: an id that is not 1..255
    bytes of UTF-8, a message that fails validation or is the wrong kind, an unregistered type,
    a duration out of range, a bad setting. Also a ``ValueError``.

    What to do: fix the value; validate untrusted input before it becomes a message.
    """

    code = ErrorCode.INVALID_ARGUMENT


class NotFound(ZLinkError, LookupError):
    """The addressed Spot, Actor, Channel or type does not exist: never created, closed, or
    lost with its node. Also a ``LookupError``.

    What to do: create it first (``get_or_create`` is safe to repeat), or treat it as gone.
    """

    code = ErrorCode.NOT_FOUND


class Unavailable(ZLinkError):
    """The node or the target cannot take the work now: the node is shutting down, draining
    or fenced itself; the target is sealed (closing or moving); its node is down or not
    reachable; a ``zlink.connect`` client lost its node.

    What to do: usually transient: retry later or through another node, and after a crash
    retry only what is safe to repeat (the call may have run).
    """

    code = ErrorCode.UNAVAILABLE


class DeadlineExceeded(ZLinkError, TimeoutError):
    """A deadline passed before the call completed: a request's or create's ``.timeout``, a
    ``wait(timeout)``, a wait for room, a worker call's timeout, a move or drain (which then
    did not happen). Also a ``TimeoutError``.

    What to do: a request's handler may still run or have run; retry only what is safe to
    repeat. A one-way wait queued nothing: retrying it is safe.
    """

    code = ErrorCode.DEADLINE_EXCEEDED


class ResourceExhausted(ZLinkError):
    """A bounded queue or capacity is full and the item was not accepted: a full lane on
    ``submit()``, too many waiters for room, too many worker calls in flight, a client's send
    window.

    What to do: the consumer is slower than its producers; back off, or wait for room with
    ``send.wait()`` / ``await send`` instead of ``submit()``.
    """

    code = ErrorCode.RESOURCE_EXHAUSTED


class StateIncompatible(ZLinkError):
    """State could not be captured or restored during a move: a value JSON cannot carry for
    ``JsonStateAdapter``, an adapter that returned no ``bytes`` or failed to restore. The Spot
    goes on serving on its source.

    What to do: keep relocatable state in JSON types, name the fields to move, or write an
    adapter.
    """

    code = ErrorCode.STATE_INCOMPATIBLE


class Cancelled(ZLinkError):
    """The call was abandoned before it completed: a closing Spot's deadline passed while its
    handler was suspended (raised at the ``await``), a client was closed, or an asyncio task
    awaiting the call was cancelled.

    What to do: clean up and let it propagate; do not swallow it to carry on.
    """

    code = ErrorCode.CANCELLED


class HandlerError(ZLinkError):
    """The handler of a request (or a lifecycle callback of a create or Join) raised; the
    exception's type name and message are kept as ``remote_type`` and ``remote_message``.

    What to do: fix the handler, or, for an expected outcome, return a reply that says so.
    """

    code = ErrorCode.HANDLER_ERROR

    def __init__(self, remote_type: str, remote_message: str) -> None:
        super().__init__(f"{remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message

    def __reduce__(self) -> tuple[Any, ...]:  # (copied and pickled with its own arguments)
        return (type(self), (self.remote_type, self.remote_message), self.__dict__)
