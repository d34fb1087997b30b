"""Errors as they cross nodes: a ``ZLinkError`` (or a handler's exception) and its wire form.

The code, the type name and the message travel (``wire.EncodedError``); the receiver raises the
``ZLinkError`` subclass of the code, and a handler's exception as ``HandlerError`` keeping the
remote type name and message (python-api §3, §5).
"""

from __future__ import annotations

from .. import errors
from ..errors import ErrorCode, HandlerError, ZLinkError
from .wire import EncodedError

_BY_CODE: dict[ErrorCode, type[ZLinkError]] = {
    cls.code: cls
    for cls in (
        errors.InvalidOperation,
        errors.InvalidArgument,
        errors.NotFound,
        errors.Unavailable,
        errors.DeadlineExceeded,
        errors.ResourceExhausted,
        errors.StateIncompatible,
        errors.Cancelled,
    )
}


def encode_error(exc: BaseException) -> EncodedError:
    """``exc`` as it crosses: a ZLinkError keeps its code; anything else is a handler error."""
    if isinstance(exc, HandlerError):
        return EncodedError(exc.code, exc.remote_type, exc.remote_message)
    code = exc.code if isinstance(exc, ZLinkError) else ErrorCode.HANDLER_ERROR
    return EncodedError(code, type(exc).__qualname__, str(exc))


def decode_error(data: EncodedError) -> ZLinkError:
    """The error the caller receives for ``data``."""
    if data.code is ErrorCode.HANDLER_ERROR:
        return HandlerError(data.error_type, data.message)
    return _BY_CODE.get(data.code, errors.Unavailable)(data.message)
