"""The ClientServer protocol: frames between ``zlink.connect`` clients and a node (python-api
§10; execution-model §16 "ClientServer").

What crosses
    One ZeroMQ frame per *client frame*, on the client's DEALER and the node's client ROUTER.
    A frame is a fixed header ``!BBI`` (protocol version, :class:`ClientKind`, head length),
    then the *head*, a JSON array of the kind's fields in order (``None`` is ``null``, nested
    records are arrays, enums are their values), then the *tail*: the raw bytes of the
    application payload(s), exactly as ``zlink.messaging.message.wire_bytes`` made them (a
    batch's head holds the size of each). A payload is thus never escaped inside JSON, and the
    node hands the very bytes to pydantic.

    Client to node: ``HELLO`` (the handshake's question), ``SEND`` and ``BATCH`` (one-way,
    numbered by ``seq``), ``REQUEST``, ``CREATE`` and ``CLOSE`` (awaiting a ``REPLY`` under
    their ``correlation``), ``BYE``, and ``PACK``: several of those in one ZeroMQ frame (what
    the client found queued at once). Node to client: ``WELCOME`` (the limits the client
    keeps), ``REPLY``, ``ACKS`` (the verdicts of sends, coalesced: ranges of ``seq`` admitted,
    and each send that failed, with its reason and typed error), ``BYE`` (the node leaves, or
    does not speak the client's version).

Guarantees / assumes:
* The version rule is the node wire's (``zlink.mesh.wire``): every frame carries
  :data:`CLIENT_VERSION`; a side decodes its own version only; no unknown or missing field is
  taken. The first header byte is the version in every version to come.
* :func:`decode` returns a complete, well-typed frame or raises one :class:`FrameError` (an
  ``InvalidArgument``) with the :class:`BadFrame` reason and, where it could be read, the
  kind and the frame's first number (a call's ``correlation``, a send's ``seq``), so the
  node can answer the caller with a typed error instead of leaving it to its deadline.
* Pure functions of bytes: no socket, no lock, no thread.
"""

from __future__ import annotations

import math
import struct
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import IntEnum, StrEnum
from typing import Any, ClassVar, Final

from ..errors import ErrorCode, InvalidArgument
from ..messaging import codec
from ..types import TargetKind
from .wire import EncodedError

CLIENT_VERSION: Final = 3
"""The version every client frame carries; each side decodes its own version only."""

HEADER: Final = struct.Struct("!BBI")  # version, kind, head length
PEERS_CHANGED: Final = 2**63 - 1
"""The correlation of a ``WELCOME`` a node sends unasked: the nodes it reaches changed."""
GOING_AWAY: Final = 2**63 - 2
"""The correlation of a ``WELCOME`` a node sends unasked as it begins to drain or stop: it
takes no new calls, answers those it took, and names the other nodes; a client connects to
one of those and lets this connection end once nothing is pending on it (as HTTP/2's
``GOAWAY``)."""
_MAX_ID = 2**63 - 1  # seq and correlation numbers are 0 .. 2**63-1


class ClientKind(IntEnum):
    """What a client frame carries (its header's second byte)."""

    HELLO = 1
    WELCOME = 2
    SEND = 3
    BATCH = 4
    REQUEST = 5
    CREATE = 6
    CLOSE = 7
    REPLY = 8
    ACKS = 9
    BYE = 10
    PACK = 11


class BadFrame(StrEnum):
    """Why a frame was refused (the suffix of the ``bad_client_frames_<reason>`` counter)."""

    TRUNCATED = "truncated"  # shorter than its header says
    VERSION = "version"  # another protocol version
    KIND = "kind"  # a kind this version does not have
    GARBAGE = "garbage"  # a head that is not a JSON array of the kind's fields
    FIELD = "field"  # a field of the wrong type or value


class DropReason(StrEnum):
    """Why a node did not admit a client's send (``client_sends_dropped_<reason>`` on the node,
    ``sends_dropped_<reason>`` on the client: python-api §9, at both ends)."""

    NOT_FOUND = "not_found"
    LANE_FULL = "lane_full"
    NO_ROOM_IN_TIME = "no_room_in_time"
    BAD_PAYLOAD = "bad_payload"
    UNAVAILABLE = "unavailable"
    WINDOW_FULL = "window_full"
    REFUSED = "refused"


class FrameError(InvalidArgument):
    """A frame that cannot cross: ``reason``; ``kind`` when the header was read; ``first``,
    the frame's first number (``correlation`` or ``seq``), when it could be read."""

    def __init__(
        self,
        message: str,
        reason: BadFrame,
        kind: ClientKind | None = None,
        first: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.kind = kind
        self.first = first


# -- the frames -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Client to node: the handshake's question; answered by ``WELCOME`` (or ``BYE``)."""

    KIND: ClassVar[ClientKind] = ClientKind.HELLO

    correlation: int
    """Echoed by the ``WELCOME``."""
    client: str
    """Who asks, for the node's logs (``pid@host``)."""


@dataclass(frozen=True, slots=True)
class Welcome:
    """Node to client: the node, and the limits a client keeps with it."""

    KIND: ClassVar[ClientKind] = ClientKind.WELCOME

    correlation: int
    """The ``HELLO`` answered."""
    node_id: str
    mesh: str
    window_items: int
    """Sends (each message of a batch counted) a client may have unacknowledged."""
    window_bytes: int
    """Payload bytes a client may have unacknowledged."""
    calls_in_flight: int
    """Requests, creates and closes a client may have unanswered."""
    admission_timeout: float
    """How long a send waits for room by default (``NodeConfig.admission_timeout``)."""
    request_timeout: float
    """A request's or create's default deadline (``NodeConfig.request_timeout``)."""
    max_frame_bytes: int
    """The largest frame the node takes."""
    peers: tuple[str, ...]
    """The client endpoints of the other nodes of its mesh it reaches now: where a client
    may connect again if it loses this one (version 2). A node also sends a ``WELCOME``
    unasked, under :data:`PEERS_CHANGED`, to the clients that said hello once the nodes it
    reaches change: a client that is up takes its ``peers`` (one made before counts it as
    unexpected)."""
    reply_grace: float
    """How much later than the client's deadline the node's own deadline for its call is:
    a call that ended at the client without its reply still counts at the node until it
    answers, by then at the latest (version 3)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Client to node: a one-way message (also a publish: ``target_kind`` ``topic``)."""

    KIND: ClassVar[ClientKind] = ClientKind.SEND

    seq: int
    """The send's number on its connection; ``ACKS`` name it."""
    target_kind: TargetKind
    target: str
    message_type: str
    """The message's wire type name."""
    meta: dict[str, str] | None
    instance: bool
    instance_type: str | None
    wait: float | None
    """Seconds the caller still waits for room; ``None``: the node's admission timeout; ``0``:
    none (a ``submit()``: refused at once if there is no room; version 3)."""
    payload: bytes
    """The message's JSON bytes (the tail)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Client to node: one-way messages for one Spot or Actor, admitted all or none."""

    KIND: ClassVar[ClientKind] = ClientKind.BATCH

    seq: int
    target_kind: TargetKind
    target: str
    message_types: tuple[str, ...]
    wait: float | None
    """As ``Send.wait``."""
    payloads: tuple[bytes, ...]
    """Each message's JSON bytes (the tail; the head holds their sizes)."""


@dataclass(frozen=True, slots=True)
class Request:
    """Client to node: a request; answered by a ``REPLY`` under ``correlation``."""

    KIND: ClassVar[ClientKind] = ClientKind.REQUEST

    correlation: int
    target_kind: TargetKind
    target: str
    message_type: str
    meta: dict[str, str] | None
    instance: bool
    instance_type: str | None
    deadline: float
    """Seconds the call may still take (the time travels, not a clock reading)."""
    payload: bytes


@dataclass(frozen=True, slots=True)
class Create:
    """Client to node: ``spots``/``actors`` ``create`` or ``get_or_create``."""

    KIND: ClassVar[ClientKind] = ClientKind.CREATE

    correlation: int
    target_kind: TargetKind
    type_name: str
    object_id: str | None
    get: bool
    message_type: str | None
    """The create's request message type, ``None`` when it has none."""
    mesh: str | None
    deadline: float
    payload: bytes
    """The request message's JSON bytes (empty without one)."""


@dataclass(frozen=True, slots=True)
class Close:
    """Client to node: ``spots.close(ref)``; the ``REPLY`` holds the bool."""

    KIND: ClassVar[ClientKind] = ClientKind.CLOSE

    correlation: int
    spot_id: str
    object_generation: int
    mesh_name: str
    node_rid: str


@dataclass(frozen=True, slots=True)
class Reply:
    """Node to client: the outcome of a ``REQUEST``, ``CREATE``, ``CLOSE`` (or of a ``HELLO``
    the node could not read): ``error``, or the value's JSON bytes in the tail."""

    KIND: ClassVar[ClientKind] = ClientKind.REPLY

    correlation: int
    error: EncodedError | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    """A send the node did not admit, with why."""

    seq: int
    reason: DropReason
    error: EncodedError


@dataclass(frozen=True, slots=True)
class Acks:
    """Node to client: the verdicts of sends since the last ``ACKS`` (coalesced)."""

    KIND: ClassVar[ClientKind] = ClientKind.ACKS

    admitted: tuple[tuple[int, int], ...]
    """Inclusive ranges ``(first, last)`` of ``seq`` admitted."""
    failed: tuple[Failure, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    """Either way: this side leaves (or, from a node, does not speak the client's version)."""

    KIND: ClassVar[ClientKind] = ClientKind.BYE

    reason: str


@dataclass(frozen=True, slots=True)
class Pack:
    """Client to node: frames handed over together, in order, as one ZeroMQ frame (what a
    client's I/O thread found queued at once); each is handled as if it came alone. A pack
    holds no pack."""

    KIND: ClassVar[ClientKind] = ClientKind.PACK

    frames: tuple[bytes, ...]


ClientFrame = Hello | Welcome | Send | Batch | Request | Create | Close | Reply | Acks | Bye | Pack
"""Any client frame; ``match`` on the class, or read ``KIND``."""

FRAME_CLASSES: Final[tuple[type[ClientFrame], ...]] = typing.get_args(ClientFrame)
CALL_KINDS: Final = frozenset(
    {ClientKind.HELLO, ClientKind.REQUEST, ClientKind.CREATE, ClientKind.CLOSE}
)
"""The kinds whose first field is a ``correlation`` the sender awaits a ``REPLY`` under."""
SEND_KINDS: Final = frozenset({ClientKind.SEND, ClientKind.BATCH})
"""The kinds whose first field is a ``seq`` the sender awaits a verdict (``ACKS``) for."""


# -- the field tables, built once at import ---------------------------------------------------


class _Bad(Exception):
    """A field that does not decode (or encode); the caller adds which one."""


_Check = Callable[[Any], Any]  # a JSON value -> the field's value, or raises _Bad
_Encode = Callable[[Any], Any]  # a field's value -> its JSON value


def _got(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _check_int(value: Any) -> int:
    if type(value) is not int:
        raise _Bad(f"expected int, got {_got(value)}")
    return value


def _check_id(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_ID:
        raise _Bad(f"expected a number 0 .. 2**63-1, got {value!r}")
    return value


def _check_float(value: Any) -> float:
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is int and abs(value) <= 2**53:
        return float(value)
    raise _Bad(f"expected a finite float, got {value!r}")


def _exact(tp: type) -> _Check:
    def check(value: Any) -> Any:
        if type(value) is not tp:
            raise _Bad(f"expected {tp.__name__}, got {_got(value)}")
        return value

    return check


def _optional(inner: _Check) -> _Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def _check_meta(value: Any) -> dict[str, str]:
    if type(value) is not dict or not all(
        type(k) is str and type(v) is str for k, v in value.items()
    ):
        raise _Bad("expected an object of strings")
    return value


def _check_strs(value: Any) -> tuple[str, ...]:
    if type(value) is not list or not all(type(v) is str for v in value):
        raise _Bad("expected an array of strings")
    return tuple(value)


def _check_ranges(value: Any) -> tuple[tuple[int, int], ...]:
    if type(value) is not list:
        raise _Bad(f"expected an array, got {_got(value)}")
    out = []
    for item in value:
        if type(item) is not list or len(item) != 2:
            raise _Bad("expected [first, last] pairs")
        first, last = _check_id(item[0]), _check_id(item[1])
        if last < first:
            raise _Bad(f"a range ends before it starts: {item!r}")
        out.append((first, last))
    return tuple(out)


_CODES = {code.value: code for code in ErrorCode}
_TARGETS = {kind.value: kind for kind in TargetKind}
_REASONS = {reason.value: reason for reason in DropReason}


def _check_error(value: Any) -> EncodedError:
    if type(value) is not list or len(value) != 3:
        raise _Bad("expected an error [code, type, message]")
    code = _CODES.get(value[0]) if type(value[0]) is str else None
    if code is None or type(value[1]) is not str or type(value[2]) is not str:
        raise _Bad(f"not an error: {value!r}")
    return EncodedError(code, value[1], value[2])


def _encode_error(error: EncodedError) -> list[str]:
    return [error.code.value, error.error_type, error.message]


def _check_target(value: Any) -> TargetKind:
    found = _TARGETS.get(value) if type(value) is str else None
    if found is None:
        raise _Bad(f"expected one of {sorted(_TARGETS)}, got {value!r}")
    return found


def _check_failures(value: Any) -> tuple[Failure, ...]:
    if type(value) is not list:
        raise _Bad(f"expected an array, got {_got(value)}")
    out = []
    for item in value:
        if type(item) is not list or len(item) != 3:
            raise _Bad("expected [seq, reason, error] triples")
        reason = _REASONS.get(item[1]) if type(item[1]) is str else None
        if reason is None:
            raise _Bad(f"unknown drop reason {item[1]!r}")
        out.append(Failure(_check_id(item[0]), reason, _check_error(item[2])))
    return tuple(out)


def _encode_failures(failed: tuple[Failure, ...]) -> list[Any]:
    return [[f.seq, f.reason.value, _encode_error(f.error)] for f in failed]


class _Tail(IntEnum):
    """How a field travels outside the head."""

    NONE = 0  # in the head
    ONE = 1  # ``bytes``: the whole tail
    MANY = 2  # ``tuple[bytes, ...]``: the tail, cut at the sizes the head holds here


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    check: _Check
    encode: _Encode | None  # None: the value is its own JSON value
    tail: _Tail
    inline: str = ""  # a simple check the generated fast path writes out (see _generate)


def _field(name: str, tp: Any) -> _Field:
    """The check and encoder of one field, from its type (so the table cannot drift)."""
    if name in ("seq", "correlation"):
        return _Field(name, _check_id, None, _Tail.NONE, "id")
    simple: dict[Any, tuple[_Check, _Encode | None]] = {
        int: (_check_int, None),
        float: (_check_float, None),
        bool: (_exact(bool), None),
        str: (_exact(str), None),
        str | None: (_optional(_exact(str)), None),
        float | None: (_optional(_check_float), None),
        dict[str, str] | None: (_optional(_check_meta), None),
        tuple[str, ...]: (_check_strs, list),
        tuple[tuple[int, int], ...]: (_check_ranges, lambda v: [list(p) for p in v]),
        TargetKind: (_check_target, lambda v: v.value),
        EncodedError | None: (
            _optional(_check_error),
            lambda v: None if v is None else _encode_error(v),
        ),
        tuple[Failure, ...]: (_check_failures, _encode_failures),
    }
    if tp is bytes:
        return _Field(name, _exact(bytes), None, _Tail.ONE)
    if tp == tuple[bytes, ...]:
        return _Field(name, _exact(tuple), None, _Tail.MANY)
    try:
        check, enc = simple[tp]
    except (KeyError, TypeError):
        raise TypeError(f"no client wire form for {name}: {tp!r}") from None
    inline = {int: "int", bool: "bool", str: "str", str | None: "opt_str", TargetKind: "target",
              float: "float", float | None: "opt_float"}.get(tp, "")  # fmt: skip
    return _Field(name, check, enc, _Tail.NONE, inline)


def _cut(data: bytes, start: int, sizes: Any) -> tuple[bytes, ...]:
    """The tail from ``start``, cut at ``sizes`` (which must add up to all of it)."""
    if type(sizes) is not list or not all(type(n) is int and n >= 0 for n in sizes):
        raise _Bad("expected an array of sizes")
    if start + sum(sizes) != len(data):
        raise _Bad(f"the sizes add up to {sum(sizes)} bytes; the tail has {len(data) - start}")
    out = []
    at = start
    for n in sizes:
        out.append(data[at : at + n])
        at += n
    return tuple(out)


class _Slow(Exception):
    """The generated fast path refuses a frame: the precise path decides, and says why."""


@dataclass(slots=True)
class _Table:
    cls: type[Any]
    fields: tuple[_Field, ...]
    head_len: int  # how many values the head array holds
    tail: _Tail
    fast_decode: Callable[[list[Any], bytes, int], Any] = lambda head, data, end: None
    fast_encode: Callable[[Any], tuple[list[Any], bytes]] = lambda frame: ([], b"")


_INLINE = {  # (guard refusing a value, the value kept) of each inline check, on ``v``
    "id": ("type(v) is not int or v < 0 or v > _MAX_ID", "v"),
    "int": ("type(v) is not int", "v"),
    "bool": ("type(v) is not bool", "v"),
    "str": ("type(v) is not str", "v"),
    "opt_str": ("v is not None and type(v) is not str", "v"),
    "target": ("type(v) is not str or v not in _TARGETS", "_TARGETS[v]"),
    "float": ("type(v) is not float or v - v != 0.0", "v"),
    "opt_float": ("v is not None and (type(v) is not float or v - v != 0.0)", "v"),
}


def _generate(table: _Table) -> None:
    """Write ``table``'s fast paths: straight-line code per kind, the simple checks inlined,
    the frozen instance filled through its slots (as ``zlink.mesh.wire`` does). A frame the
    fast path refuses (``_Slow``, or any error) is judged again by the precise path."""
    cls = table.cls
    env: dict[str, Any] = {
        "_Slow": _Slow, "_new": object.__new__, "_C": cls, "_MAX_ID": _MAX_ID,
        "_TARGETS": _TARGETS, "_cut": _cut, "type": type, "len": len,
    }  # fmt: skip
    dec = [
        "def fast_decode(head, data, end):",
        f"    if len(head) != {table.head_len}: raise _Slow",
    ]
    build = ["    o = _new(_C)"]
    enc_items: list[str] = []
    tail_expr = 'b""'
    for n, f in enumerate(table.fields):
        env[f"_set{n}"] = cls.__dict__[f.name].__set__
        env[f"_check{n}"] = f.check
        if f.tail is _Tail.ONE:
            dec.append(f"    v{n} = data[end:]")
            tail_expr = f"o.{f.name}"
        elif f.tail is _Tail.MANY:
            dec.append(f"    v{n} = _cut(data, end, head[{n}])")
            enc_items.append(f"[len(p) for p in o.{f.name}]")
            tail_expr = f'b"".join(o.{f.name})'
        elif f.inline:
            guard, keep = _INLINE[f.inline]
            dec += [f"    v = head[{n}]", f"    if {guard}: raise _Slow", f"    v{n} = {keep}"]
        else:
            dec.append(f"    v{n} = _check{n}(head[{n}])")
        if f.tail is _Tail.NONE:
            if f.encode is None:
                enc_items.append(f"o.{f.name}")
            else:
                env[f"_enc{n}"] = f.encode
                enc_items.append(f"_enc{n}(o.{f.name})")
        build.append(f"    _set{n}(o, v{n})")
    if table.tail is _Tail.NONE:
        dec.append("    if end != len(data): raise _Slow")
    source = "\n".join([
        *dec, *build, "    return o",
        "def fast_encode(o):", f"    return [{', '.join(enc_items)}], {tail_expr}",
    ])  # fmt: skip
    exec(compile(source, f"<zlink.mesh.client_wire {cls.__name__}>", "exec"), env)
    table.fast_decode = env["fast_decode"]
    table.fast_encode = env["fast_encode"]


_TABLES: dict[int, _Table] = {}
for _cls in FRAME_CLASSES:
    _hints = typing.get_type_hints(_cls)
    _fields = tuple(_field(f.name, _hints[f.name]) for f in fields(_cls))
    _tails = [f for f in _fields if f.tail is not _Tail.NONE]
    if len(_tails) > 1 or (_tails and _fields[-1] is not _tails[0]):  # pragma: no cover
        raise TypeError(f"{_cls.__name__}: at most one tail field, and last")
    _TABLES[_cls.KIND] = _table = _Table(
        _cls,
        _fields,
        len(_fields) - (1 if _tails and _tails[0].tail is _Tail.ONE else 0),
        _tails[0].tail if _tails else _Tail.NONE,
    )
    _generate(_table)
del _cls, _hints, _fields, _tails, _table


# -- the codec ------------------------------------------------------------------------------------


def encode(frame: ClientFrame) -> bytes:
    """``frame`` as the bytes of one ZeroMQ frame. ``InvalidArgument`` for a value JSON
    cannot hold (the fields are typed by their builders: nothing else can fail)."""
    head, tail = _TABLES[frame.KIND].fast_encode(frame)
    try:
        data = codec.dumps(head)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"a {frame.KIND.name} frame does not encode: {exc}") from None
    return HEADER.pack(CLIENT_VERSION, frame.KIND, len(data)) + data + tail


def decode(data: bytes) -> ClientFrame:
    """The frame ``data`` holds; :class:`FrameError` unless it is exactly one (see above)."""
    if len(data) < HEADER.size:
        raise FrameError(f"a frame of {len(data)} bytes has no header", BadFrame.TRUNCATED)
    version, kind_value, head_len = HEADER.unpack_from(data)
    if version != CLIENT_VERSION:
        raise FrameError(
            f"client protocol version {version}; this side speaks {CLIENT_VERSION}",
            BadFrame.VERSION,
        )
    table = _TABLES.get(kind_value)
    if table is None:
        raise FrameError(f"unknown client frame kind {kind_value}", BadFrame.KIND)
    kind = ClientKind(kind_value)
    end = HEADER.size + head_len
    if end > len(data):
        raise FrameError(
            f"a {kind.name} frame says its head has {head_len} bytes; it has "
            f"{len(data) - HEADER.size}",
            BadFrame.TRUNCATED,
            kind,
        )
    try:
        head = codec.loads(data[HEADER.size : end])
    except (ValueError, RecursionError) as exc:
        raise FrameError(
            f"a {kind.name} frame's head is not JSON: {exc}", BadFrame.GARBAGE, kind
        ) from None
    if type(head) is not list:
        raise FrameError(f"a {kind.name} frame's head is not an array", BadFrame.GARBAGE, kind)
    try:
        return table.fast_decode(head, data, end)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - refused: the precise path below says where and why
        pass
    first = head[0] if head and type(head[0]) is int and 0 <= head[0] <= _MAX_ID else None
    if len(head) != table.head_len:
        raise FrameError(
            f"a {kind.name} frame has {len(head)} head fields, not {table.head_len}",
            BadFrame.GARBAGE,
            kind,
            first,
        )
    values: list[Any] = []
    name = ""
    try:
        for f, value in zip(table.fields, head, strict=False):
            name = f.name
            if f.tail is _Tail.MANY:
                values.append(_cut(data, end, value))
            else:
                values.append(f.check(value))
        if table.tail is _Tail.ONE:
            values.append(data[end:])
        elif table.tail is _Tail.NONE and end != len(data):
            name = "tail"
            raise _Bad(f"{len(data) - end} bytes after the head of a frame that has no tail")
        return table.cls(*values)  # type: ignore[no-any-return]
    except _Bad as bad:
        raise FrameError(f"{kind.name}.{name}: {bad}", BadFrame.FIELD, kind, first) from None


__all__ = [
    "CALL_KINDS",
    "CLIENT_VERSION",
    "FRAME_CLASSES",
    "HEADER",
    "SEND_KINDS",
    "Acks",
    "BadFrame",
    "Batch",
    "Bye",
    "ClientFrame",
    "ClientKind",
    "Close",
    "Create",
    "DropReason",
    "Failure",
    "FrameError",
    "Hello",
    "Pack",
    "Reply",
    "Request",
    "Send",
    "Welcome",
    "decode",
    "encode",
]
