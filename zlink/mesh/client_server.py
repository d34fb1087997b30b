"""``ClientServer``: a node's side of ``zlink.connect`` (python-api §9, §10; execution-model §13,
§16 "ClientServer").

Frames from clients (``zlink.mesh.client_wire``) arrive on the node's infrastructure thread
(``ClientLink.client_frame``, from the ``ZmqTransport``'s client ROUTER); a ``PACK`` of them
is taken apart there, in order. Each is decoded and its call submitted to the node's runtime
through ``RuntimePort``, exactly as ``node.client()`` would submit it; outcomes go back on the
same connection (``send_client``).

Guarantees / assumes:
* Same admission as ``node.client()`` (python-api §9): a send waits for room in a full lane,
  first come first served, for the time its caller still waits (``Send.wait``), else
  ``NodeConfig.admission_timeout``; a request or create keeps its deadline, which travels as
  time remaining. The node's own deadline for a client's call is that time plus
  ``reply_grace``, so that the client's deadline, not the node's, decides its caller's outcome
  and a handler that outlasts it sends its reply late, where the client drops and counts it
  (§5, execution-model §16).
* Every send gets one verdict (``ACKS``): admitted, or failed with its ``DropReason`` and typed
  error, counted here as ``client_sends_dropped_<reason>`` (python-api §9: at both ends).
  Verdicts are coalesced: the first one of a connection schedules one flush on the
  infrastructure thread, which sends everything decided by then in one frame.
* Bounded per connection: at most ``window_items`` sends / ``window_bytes`` payload bytes
  without a verdict, and ``calls_in_flight`` calls without a reply (the limits a well-behaved
  client keeps itself, announced in ``WELCOME``); past them a call is refused with
  ``ResourceExhausted`` at once. A connection's state lives only while it has work in flight.
* Bad input never stops a thread: a frame that does not decode is counted
  (``bad_client_frames`` and ``bad_client_frames_<reason>``) and dropped; where its kind and
  first number were read, the caller gets a typed error (a ``REPLY`` or a failed verdict); a
  frame of another protocol version is answered with a ``BYE`` naming this node's version.
  Any other failure of a frame is counted (``client_server_errors``). ``client_taken`` is
  called exactly once per frame (the transport's flow control).
* ``_lock`` is a leaf: under it only counters and lists of this module change.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_core import to_json

from ..durations import check_seconds
from ..errors import (
    DeadlineExceeded,
    HandlerError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..messaging.calls import NO_WAIT, BatchSendCall, CreateCall, RequestCall, SendCall, check_id
from ..messaging.completion import Admitted, Completion
from ..messaging.message import Message, decode, message_type
from ..messaging.port import RuntimePort
from ..types import SpotRef, TargetKind
from . import client_wire as cw
from .remote_errors import encode_error

_log = logging.getLogger("zlink.mesh.clients")

_REPLY_ROOM = 64  # bytes of a reply frame that are not its payload (header, correlation)
_MAX_KNOWN_CLIENTS = 65_536  # connections told BYE at shutdown, newest kept
_ONE_WAY_KINDS = frozenset(
    {TargetKind.SPOT, TargetKind.ACTOR, TargetKind.CHANNEL, TargetKind.TOPIC}
)
_UNIT_KINDS = frozenset({TargetKind.SPOT, TargetKind.ACTOR})
_CALL_KINDS = frozenset({TargetKind.SPOT, TargetKind.ACTOR, TargetKind.CHANNEL})


class ClientTransport(Protocol):
    """What the client server needs of the node's transport (``ZmqTransport``)."""

    def send_client(self, client: bytes, data: bytes) -> None:
        """Send one frame to a client (any thread, never blocks)."""
        ...

    def client_taken(self) -> None:
        """One client frame was handled (flow control)."""
        ...

    def client_endpoints(self) -> list[str]:
        """The client endpoints of the other nodes this node reaches now (any thread)."""
        ...


@dataclass(frozen=True)
class ClientSettings:
    """What a node tells its clients, and keeps them to (``WELCOME``)."""

    node_id: str
    mesh: str
    window_items: int = 1024
    window_bytes: int = 16 * 1024 * 1024
    calls_in_flight: int = 4096
    admission_timeout: float = 30.0
    request_timeout: float = 30.0
    max_frame_bytes: int = 64 * 1024 * 1024
    reply_grace: float = 1.0


class _Conn:
    """One client connection while it has work in flight (``_lock`` guards the counts)."""

    __slots__ = ("admitted", "bytes", "calls", "failed", "flush_due", "ident", "items")

    def __init__(self, ident: bytes) -> None:
        self.ident = ident
        self.items = 0  # sends without a verdict
        self.bytes = 0  # their payload bytes
        self.calls = 0  # calls without a reply
        self.admitted: list[int] = []  # verdicts not yet flushed
        self.failed: list[cw.Failure] = []
        self.flush_due = False


def drop_reason(error: BaseException) -> cw.DropReason:
    """Why a send with this error was not admitted."""
    if isinstance(error, NotFound):
        return cw.DropReason.NOT_FOUND
    if isinstance(error, ResourceExhausted):
        return cw.DropReason.LANE_FULL
    if isinstance(error, DeadlineExceeded):
        return cw.DropReason.NO_ROOM_IN_TIME
    if isinstance(error, InvalidArgument):
        return cw.DropReason.BAD_PAYLOAD
    if isinstance(error, Unavailable):
        return cw.DropReason.UNAVAILABLE
    return cw.DropReason.REFUSED


def ranges(seqs: list[int]) -> tuple[tuple[int, int], ...]:
    """``seqs`` as sorted inclusive ``(first, last)`` ranges (most often a single one)."""
    out: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if out and seq == out[-1][1] + 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return tuple(out)


class ClientServer:
    """Serves the clients of one node (a ``ClientLink`` of ``ZmqTransport``)."""

    def __init__(
        self,
        port: RuntimePort,
        transport: ClientTransport,
        submit: Callable[..., None],
        count: Callable[..., None],
        settings: ClientSettings,
        holds: Callable[[], bool] | None = None,
    ) -> None:
        """``submit(fn, *args)`` runs ``fn`` on the node's infrastructure thread; ``count(name,
        n=1)`` bumps a node counter; ``holds()`` checks the node's lease (and fences it if the
        lease ran out unnoticed)."""
        self._holds = holds
        self._port = port
        self._transport = transport
        self._submit = submit
        self._count = count
        self.settings = settings
        self._lock = threading.Lock()
        self._conns: dict[bytes, _Conn] = {}  # under _lock
        self._known: OrderedDict[bytes, None] = OrderedDict()  # said HELLO (under _lock)
        self._closed = False  # (under _lock)
        self._refusing: str | None = None  # why new clients are sent on (a drain, a stop)

    # -- the transport's side (infrastructure thread) -------------------------------------------
    def client_frame(self, client: bytes, data: bytes) -> None:
        """A frame from ``client``: handled, and always taken exactly once. A node whose
        lease ran out unnoticed (its process was stopped) fences first (python-api §10)."""
        try:
            if self._holds is not None:
                self._holds()  # fences now if the lease ran out: then the call is refused
            self._on_frame(client, data)
        except Exception:  # noqa: BLE001 - one frame never stops the infrastructure thread
            self._count("client_server_errors")
            _log.exception("a frame from a client could not be handled")
        finally:
            self._transport.client_taken()

    def close(self) -> None:
        """The node stops: every client that said HELLO is told ``BYE`` (any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            known, self._known = list(self._known), OrderedDict()
        bye = cw.encode(cw.Bye(f"node {self.settings.node_id} shuts down"))
        for client in known:
            self._transport.send_client(client, bye)

    def _on_frame(self, client: bytes, data: bytes, packed: bool = False) -> None:
        try:
            frame = cw.decode(data)
        except cw.FrameError as exc:
            self._bad(client, exc)
            return
        match frame:
            case cw.Pack() if not packed:  # each in order, as if it had come alone
                for inner in frame.frames:
                    self._on_frame(client, inner, True)
            case cw.Send():
                self._on_send(client, frame)
            case cw.Request():
                self._on_request(client, frame)
            case cw.Batch():
                self._on_batch(client, frame)
            case cw.Create():
                self._on_create(client, frame)
            case cw.Close():
                self._on_close(client, frame)
            case cw.Hello():
                self._on_hello(client, frame)
            case cw.Bye():
                with self._lock:
                    self._known.pop(client, None)
            case cw.Pack():
                self._bad(client, cw.FrameError("a pack holds no pack", cw.BadFrame.KIND))
            case _:  # a kind only a node sends
                self._bad(
                    client,
                    cw.FrameError(
                        f"a {frame.KIND.name} frame goes from a node to a client", cw.BadFrame.KIND
                    ),
                )

    def _bad(self, client: bytes, exc: cw.FrameError) -> None:
        """A frame that does not decode: counted; its sender told, where it can be named."""
        self._count("bad_client_frames")
        self._count(f"bad_client_frames_{exc.reason}")
        if exc.reason is cw.BadFrame.VERSION:
            self._transport.send_client(client, cw.encode(cw.Bye(str(exc))))
        elif exc.first is not None and exc.kind in cw.CALL_KINDS:
            self._send(client, cw.Reply(exc.first, encode_error(exc), b""))
        elif exc.first is not None and exc.kind in cw.SEND_KINDS:
            self._count(f"client_sends_dropped_{cw.DropReason.BAD_PAYLOAD}")
            failure = cw.Failure(exc.first, cw.DropReason.BAD_PAYLOAD, encode_error(exc))
            self._send(client, cw.Acks((), (failure,)))

    def _send(self, client: bytes, frame: cw.ClientFrame) -> None:
        self._transport.send_client(client, cw.encode(frame))

    def _on_hello(self, client: bytes, hello: cw.Hello) -> None:
        s = self.settings
        with self._lock:
            closed = self._closed or self._refusing is not None
            if not closed:  # (one answered BYE is not known: it hears nothing more)
                self._known[client] = None
                self._known.move_to_end(client)
                while len(self._known) > _MAX_KNOWN_CLIENTS:
                    self._known.popitem(last=False)
        if closed:  # (a client given other nodes tries them)
            self._send(client, cw.Bye(self._refusing or f"node {s.node_id} shuts down"))
            return
        self._count("client_hellos")
        _log.debug("node %s: client %r says hello", s.node_id, hello.client)
        self._send(client, self._welcome(hello.correlation))
        with self._lock:
            refusing = self._refusing
        if refusing is not None:  # a drain began as it was answered: its notice may have
            self._send(client, self._welcome(cw.GOING_AWAY))  # gone first, and been dropped

    def _welcome(self, correlation: int) -> cw.Welcome:
        s = self.settings
        return cw.Welcome(
            correlation,
            s.node_id,
            s.mesh,
            s.window_items,
            s.window_bytes,
            s.calls_in_flight,
            s.admission_timeout,
            s.request_timeout,
            s.max_frame_bytes,
            tuple(self._transport.client_endpoints()),
            s.reply_grace,
        )

    def refuse_hellos(self, why: str) -> None:
        """The node drains or stops: from now on a client's handshake is answered ``BYE``
        with ``why`` (a client given several endpoints tries the next; a probe's client given
        a draining node and a serving one took the draining one, and every call failed for
        the whole drain), and every client that said hello hears it go away (``WELCOME``
        under ``GOING_AWAY``, naming the other nodes): it connects to one of those and lets
        this connection end once nothing is pending on it. What this node took it answers
        as before; its stop says goodbye to those still connected."""
        with self._lock:
            if self._closed or self._refusing is not None:
                return
            self._refusing = why
            known = list(self._known)
        if not known:
            return
        frame = cw.encode(self._welcome(cw.GOING_AWAY))
        self._count("client_going_away_notices", len(known))
        for client in known:
            self._transport.send_client(client, frame)

    def peers_changed(self) -> None:
        """(Infrastructure thread.) The nodes this node reaches changed: every client that
        said hello hears their client endpoints (``WELCOME`` under ``PEERS_CHANGED``), where
        it connects again should it lose this node. A probe's client, connected while its
        node was alone, learned no node that joined later and was lost for good when its
        node stopped (Akka's cluster client refreshes its contacts too)."""
        with self._lock:
            if self._closed or self._refusing is not None:  # (it said it goes away)
                return
            known = list(self._known)
        if not known:
            return
        frame = cw.encode(self._welcome(cw.PEERS_CHANGED))
        self._count("client_peer_notices", len(known))
        for client in known:
            self._transport.send_client(client, frame)

    # -- connections --------------------------------------------------------------------------
    def _take_send(self, client: bytes, items: int, size: int) -> _Conn | None:
        """Count a send against its connection's window; ``None`` if it is over it."""
        s = self.settings
        with self._lock:
            conn = self._conns.get(client)
            if conn is None:
                conn = self._conns[client] = _Conn(client)
            if conn.items + items > s.window_items or conn.bytes + size > s.window_bytes:
                return None
            conn.items += items
            conn.bytes += size
            return conn

    def _take_call(self, client: bytes) -> _Conn | None:
        """Count a call against its connection; ``None`` if it has too many in flight."""
        with self._lock:
            conn = self._conns.get(client)
            if conn is None:
                conn = self._conns[client] = _Conn(client)
            if conn.calls >= self.settings.calls_in_flight:
                return None
            conn.calls += 1
            return conn

    def _idle(self, conn: _Conn) -> None:
        """(Under ``_lock``.) Forget a connection with nothing in flight."""
        if not (conn.items or conn.calls or conn.flush_due) and self._conns.get(conn.ident) is conn:
            del self._conns[conn.ident]

    def connections(self) -> int:
        """Client connections with work in flight now (status)."""
        with self._lock:
            return len(self._conns)

    # -- sends --------------------------------------------------------------------------------
    def _on_send(self, client: bytes, f: cw.Send) -> None:
        size = len(f.payload)
        conn = self._take_send(client, 1, size)
        if conn is None:
            self._refuse_send(client, f.seq, 1)
            return
        room = None
        try:
            wait = _wait(f.wait, "a send's wait")
            if f.target_kind not in _ONE_WAY_KINDS:
                raise InvalidArgument(
                    f"a send goes to a spot, actor, channel or topic, not {f.target_kind}"
                )
            msg = _message(f.message_type, f.payload)
            call = SendCall(self._port, f.target_kind, check_id("target", f.target), msg)
            _options(call, f.meta, f.instance, f.instance_type)
            room = None if wait == 0 else Admitted(wait)
            plain = not f.meta and not f.instance  # the runtime's fast path, if it fits
            self._port.submit(call, None, NO_WAIT, 0, False, plain, room)
        except Exception as exc:  # noqa: BLE001 - the client hears it, typed
            self._verdict(conn, f.seq, 1, size, None, _typed(exc))
            return
        if room is None:  # a ``submit()``: admitted now, or refused above
            self._verdict(conn, f.seq, 1, size, None, None)
        else:
            room.add_callback(functools.partial(self._verdict, conn, f.seq, 1, size))

    def _on_batch(self, client: bytes, f: cw.Batch) -> None:
        n, size = len(f.payloads), sum(map(len, f.payloads))
        conn = self._take_send(client, max(1, n), size)
        if conn is None:
            self._refuse_send(client, f.seq, max(1, n))
            return
        room = None
        try:
            wait = _wait(f.wait, "a batch's wait")
            if f.target_kind not in _UNIT_KINDS:
                raise InvalidArgument(f"a batch goes to a spot or an actor, not {f.target_kind}")
            if n == 0 or len(f.message_types) != n:
                raise InvalidArgument(f"a batch of {n} payloads and {len(f.message_types)} types")
            msgs = [_message(t, p) for t, p in zip(f.message_types, f.payloads, strict=True)]
            call = BatchSendCall(self._port, f.target_kind, check_id("target", f.target), msgs)
            room = None if wait == 0 else Admitted(wait)
            self._port.submit_many(call, room)
        except Exception as exc:  # noqa: BLE001 - the client hears it, typed
            self._verdict(conn, f.seq, max(1, n), size, None, _typed(exc))
            return
        if room is None:  # a ``submit()``: admitted now, or refused above
            self._verdict(conn, f.seq, n, size, None, None)
        else:
            room.add_callback(functools.partial(self._verdict, conn, f.seq, n, size))

    def _refuse_send(self, client: bytes, seq: int, items: int) -> None:
        """A send past its connection's window: refused at once, counted."""
        s = self.settings
        self._count(f"client_sends_dropped_{cw.DropReason.WINDOW_FULL}", items)
        error = ResourceExhausted(
            f"the client has more than {s.window_items} sends ({s.window_bytes:,} bytes) "
            f"without a verdict from node {s.node_id}; nothing was queued"
        )
        failure = cw.Failure(seq, cw.DropReason.WINDOW_FULL, encode_error(error))
        self._send(client, cw.Acks((), (failure,)))

    def _verdict(
        self,
        conn: _Conn,
        seq: int,
        items: int,
        size: int,
        _value: Any,
        error: BaseException | None,
    ) -> None:
        """A send was admitted or failed (any thread): noted for the connection's next
        ``ACKS``, which the first verdict since the last one schedules."""
        if error is not None:
            reason = drop_reason(error)
            self._count(f"client_sends_dropped_{reason}", items)
        with self._lock:
            conn.items -= items
            conn.bytes -= size
            if error is None:
                conn.admitted.append(seq)
            else:
                conn.failed.append(cw.Failure(seq, reason, encode_error(error)))
            schedule = not conn.flush_due
            conn.flush_due = True
        if schedule:
            self._submit(self._flush, conn)

    def _flush(self, conn: _Conn) -> None:
        """(Infrastructure thread.) Send a connection's verdicts so far, in one frame."""
        with self._lock:
            admitted, conn.admitted = conn.admitted, []
            failed, conn.failed = conn.failed, []
            conn.flush_due = False
            self._idle(conn)
        if admitted or failed:
            self._send(conn.ident, cw.Acks(ranges(admitted), tuple(failed)))

    # -- calls awaiting a reply ---------------------------------------------------------------
    def _on_request(self, client: bytes, f: cw.Request) -> None:
        conn = self._take_call(client)
        if conn is None:
            self._refuse_call(client, f.correlation)
            return
        try:
            deadline = check_seconds(f.deadline, "a request's deadline")
            if f.target_kind not in _CALL_KINDS:
                raise InvalidArgument(
                    f"a request goes to a spot, actor or channel, not {f.target_kind}"
                )
            msg = _message(f.message_type, f.payload)
            call: RequestCall[Any] = RequestCall(
                self._port, f.target_kind, check_id("target", f.target), msg
            )
            _options(call, f.meta, f.instance, f.instance_type)
            call.deadline = deadline + self.settings.reply_grace
            done = self._port.submit(call, Completion(), NO_WAIT)
        except Exception as exc:  # noqa: BLE001 - the client hears it, typed
            self._reply(conn, f.correlation, None, _typed(exc))
            return
        done.add_callback(functools.partial(self._reply, conn, f.correlation))

    def _on_create(self, client: bytes, f: cw.Create) -> None:
        conn = self._take_call(client)
        if conn is None:
            self._refuse_call(client, f.correlation)
            return
        try:
            deadline = check_seconds(f.deadline, "a create's deadline")
            if f.target_kind not in _UNIT_KINDS:
                raise InvalidArgument(f"a create makes a spot or an actor, not {f.target_kind}")
            object_id = None if f.object_id is None else check_id("object id", f.object_id)
            call: CreateCall[Any] = CreateCall(
                self._port, f.target_kind, check_id("type", f.type_name), object_id, f.get
            )
            if f.message_type is not None:
                call.request(_message(f.message_type, f.payload))
            if f.mesh is not None:
                call.in_mesh(f.mesh)
            call.deadline = deadline + self.settings.reply_grace
            done = self._port.submit_create(call, NO_WAIT)
        except Exception as exc:  # noqa: BLE001 - the client hears it, typed
            self._reply(conn, f.correlation, None, _typed(exc))
            return
        done.add_callback(functools.partial(self._reply, conn, f.correlation))

    def _on_close(self, client: bytes, f: cw.Close) -> None:
        conn = self._take_call(client)
        if conn is None:
            self._refuse_call(client, f.correlation)
            return
        try:
            ref = SpotRef(
                check_id("spot_id", f.spot_id), f.object_generation, f.mesh_name, f.node_rid
            )
            done = self._port.close_later(ref)  # (its owner may be another node)
        except Exception as exc:  # noqa: BLE001 - the client hears it, typed
            self._reply(conn, f.correlation, None, _typed(exc))
            return
        done.add_callback(functools.partial(self._reply, conn, f.correlation))

    def _refuse_call(self, client: bytes, correlation: int) -> None:
        self._count("client_calls_refused")
        error = ResourceExhausted(
            f"the client has {self.settings.calls_in_flight} calls in flight at node "
            f"{self.settings.node_id} already; nothing was queued"
        )
        self._send(client, cw.Reply(correlation, encode_error(error), b""))

    def _reply(
        self, conn: _Conn, correlation: int, value: Any, error: BaseException | None
    ) -> None:
        """A call's outcome (any thread): back to the client on its connection. A value that
        does not serialize is a reply-encoding failure: the client gets ``HandlerError``."""
        with self._lock:
            conn.calls -= 1
            self._idle(conn)
        if error is None:
            try:
                payload = to_json(value)
                # past the frame limit the node told its clients: as if it did not encode
                # (a client's request of that size is refused; its reply is not sent either)
                if len(payload) > self.settings.max_frame_bytes - _REPLY_ROOM:
                    raise HandlerError(
                        "WireError",
                        f"the reply does not cross: {len(payload):,} bytes is more than a "
                        f"frame carries ({self.settings.max_frame_bytes:,} bytes)",
                    )
                frame = cw.Reply(correlation, None, payload)
            except Exception as exc:  # noqa: BLE001 - the caller gets it, typed, at once
                self._count("reply_encoding_failures")
                frame = cw.Reply(correlation, encode_error(exc), b"")
        else:
            frame = cw.Reply(correlation, encode_error(error), b"")
        self._send(conn.ident, frame)


def _wait(wait: float | None, what: str) -> float | None:
    """A send's wait for room as it came: ``None`` (the admission timeout), ``0`` (none: a
    ``submit()``, refused at once when there is no room, as ``node.client()``'s is; an audit
    found it waiting as one of the target's bounded waiters), else checked seconds."""
    if wait is None or (wait == 0 and type(wait) in (int, float)):
        return wait
    return check_seconds(wait, what)


def _message(type_name: str, payload: bytes) -> Message:
    """The message a client sent; ``InvalidArgument`` for an unknown type or a bad payload."""
    try:
        return decode(message_type(type_name), payload)
    except ZLinkError as exc:
        raise InvalidArgument(f"bad payload for {type_name!r}: {exc}") from None


def _options(
    call: SendCall | RequestCall[Any],
    meta: dict[str, str] | None,
    instance: bool,
    instance_type: str | None,
) -> None:
    """A call's options as the client set them (checked as the call site checks them)."""
    if meta:
        for key, value in meta.items():
            call.metadata(key, value)
    if instance:
        call.instance_spot(instance_type)


def _typed(exc: BaseException) -> ZLinkError:
    """What the client hears of a failure: a ZLink error as it is, anything else as a node
    fault (``Unavailable``)."""
    if isinstance(exc, ZLinkError):
        return exc
    _log.error("a client's call failed on the node", exc_info=exc)
    return Unavailable(f"the node could not take the call: {type(exc).__name__}: {exc}")


__all__ = ["ClientServer", "ClientSettings", "ClientTransport", "drop_reason", "ranges"]
