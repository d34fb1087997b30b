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
    """``exc`` as it crosses: a ZLinkError keeps its code; anything else is a handler error.
    Its text crosses as valid UTF-8: a lone surrogate (text made from badly decoded bytes, a
    file name say) would not encode, and the caller heard nothing until its deadline (found
    by an audit), so it crosses escaped (``\\udc80``)."""
    if isinstance(exc, HandlerError):
        return EncodedError(exc.code, _text(exc.remote_type), _text(exc.remote_message))
    code = exc.code if isinstance(exc, ZLinkError) else ErrorCode.HANDLER_ERROR
    return EncodedError(code, _text(type(exc).__qualname__), _text(str(exc)))


def _text(text: str) -> str:
    """``text``, with what UTF-8 cannot carry (lone surrogates) escaped."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def decode_error(data: EncodedError) -> ZLinkError:
    """The error the caller receives for ``data``."""
    if data.code is ErrorCode.HANDLER_ERROR:
        return HandlerError(data.error_type, data.message)
    return _BY_CODE.get(data.code, errors.Unavailable)(data.message)
