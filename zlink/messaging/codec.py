"""JSON bytes for state and the wire: orjson where it is installed, else the standard ``json``.

orjson has no wheel for the free-threaded build; both paths keep one contract: UTF-8 JSON
bytes, compact separators, non-ASCII kept as is, and the same ``TypeError`` text for a value
JSON cannot carry ("Type is not JSON serializable: set"), so an error a user reads does not
depend on the interpreter.
"""

from __future__ import annotations

import json
from typing import Any

_orjson: Any
try:  # pragma: no cover - which branch runs depends on the interpreter
    import orjson as _orjson
except ImportError:  # pragma: no cover - the free-threaded build has no orjson wheel
    _orjson = None

BACKEND = "orjson" if _orjson is not None else "json"


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON bytes."""
    if _orjson is not None:
        out: bytes = _orjson.dumps(value)
        return out
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_refuse).encode()


def _refuse(value: Any) -> Any:
    """The standard ``json`` path's answer for a value it cannot carry: orjson's words."""
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def loads(data: bytes | str) -> Any:
    """Decode JSON bytes (or text)."""
    if _orjson is not None:
        return _orjson.loads(data)
    return json.loads(data)
