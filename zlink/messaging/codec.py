"""JSON bytes for state and the wire: orjson where it is installed, else the standard ``json``.

orjson has no wheel for the free-threaded build; both paths keep one contract: UTF-8 JSON
bytes, compact separators, non-ASCII kept as is, and the same ``TypeError`` text for a value
JSON cannot carry ("Type is not JSON serializable: set"), so an error a user reads does not
depend on the interpreter.
"""

from __future__ import annotations

import json
import re
from json import decoder as _decoder
from json import encoder as _encoder
from typing import Any

_orjson: Any
try:  # pragma: no cover - which branch runs depends on the interpreter
    import orjson as _orjson
except ImportError:  # pragma: no cover - the free-threaded build has no orjson wheel
    _orjson = None

BACKEND = "orjson" if _orjson is not None else "json"

# The standard path, made once: ``json.dumps`` with options builds a ``JSONEncoder`` per call,
# and ``json.loads`` detects an encoding and matches whitespace around the value; on 3.13t that
# was half of a frame's cost (dumps 4.1 -> 2.0 us, loads 3.6 -> 2.2 us for a 250-byte frame).
# The C encoder is made per call because its cycle markers are per call (threads share this).
_C_ENCODER: Any = getattr(_encoder, "c_make_encoder", None)
_SCAN_ONCE: Any = getattr(_decoder.JSONDecoder(), "scan_once")  # noqa: B009 - (no stub)
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # what ``json`` skips around a value


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON bytes."""
    if _orjson is not None:
        out: bytes = _orjson.dumps(value)
        return out
    if _C_ENCODER is None:  # pragma: no cover - CPython always builds the _json module
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_refuse)
        return text.encode()
    chunks = _C_ENCODER(
        {}, _refuse, _encoder.encode_basestring, None, ":", ",", False, False, True
    )(value, 0)
    return "".join(chunks).encode()


def _end_of_space(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    return at if match is None else match.end()


def _refuse(value: Any) -> Any:
    """The standard ``json`` path's answer for a value it cannot carry: orjson's words."""
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def loads(data: bytes | str) -> Any:
    """Decode JSON bytes (or text): UTF-8 only, as orjson reads it."""
    if _orjson is not None:
        return _orjson.loads(data)
    text = data if isinstance(data, str) else str(data, "utf-8")
    try:  # the common case: a value that starts at once and fills the text
        value, end = _SCAN_ONCE(text, 0)
    except StopIteration:  # leading whitespace, or not JSON: the full parser says which
        return json.loads(text)
    if end != len(text) and _end_of_space(text, end) != len(text):
        return json.loads(text)  # extra data after the value: raises, saying where
    return value
