"""The errors of ZLink (python-api §5). Every error the framework raises is a ``ZLinkError``::

ZLinkError                  .code: ErrorCode
 +-- InvalidOperation       a call not allowed here: Yield where not offered, self-wait,
 |                          wait() inside a turn, a repeated option or terminal, Defer() out
 |                          of scope, a bad registration (raised before anything is submitted)
 +-- InvalidArgument        bad input: SpotId, payload type, message validation, unknown type
 +-- NotFound               no such Spot, Actor, Channel or handler target
 +-- Unavailable            the node is shutting down, or the target is sealed
 +-- DeadlineExceeded       a request or create timed out (on the node's clock)
 +-- ResourceExhausted      a lane's count or byte limit is full (nothing was queued)
 +-- StateIncompatible      state that cannot be restored or joined
 +-- Cancelled              the call was abandoned before completion
 +-- HandlerError           the remote handler raised; ``remote_type`` and ``remote_message``
"""

from __future__ import annotations

from enum import StrEnum


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
    """The root of every ZLink error."""

    code: ErrorCode = ErrorCode.INVALID_OPERATION


class InvalidOperation(ZLinkError):
    """The call is not allowed in this place or state; nothing was submitted."""

    code = ErrorCode.INVALID_OPERATION


class InvalidArgument(ZLinkError, ValueError):
    """An argument or payload is malformed; nothing was submitted."""

    code = ErrorCode.INVALID_ARGUMENT


class NotFound(ZLinkError, LookupError):
    """The addressed Spot, Actor, Channel or type does not exist."""

    code = ErrorCode.NOT_FOUND


class Unavailable(ZLinkError):
    """The node or target cannot take work now (shutting down, sealed)."""

    code = ErrorCode.UNAVAILABLE


class DeadlineExceeded(ZLinkError, TimeoutError):
    """The call's deadline passed before it completed."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ResourceExhausted(ZLinkError):
    """A bounded queue or capacity is full; the item was not accepted."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class StateIncompatible(ZLinkError):
    """State could not be captured, restored or applied."""

    code = ErrorCode.STATE_INCOMPATIBLE


class Cancelled(ZLinkError):
    """The call was cancelled before it completed."""

    code = ErrorCode.CANCELLED


class HandlerError(ZLinkError):
    """The handler of a request raised; the remote exception's type and message are kept."""

    code = ErrorCode.HANDLER_ERROR

    def __init__(self, remote_type: str, remote_message: str) -> None:
        super().__init__(f"{remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message
