"""``zlink.connect``: a client of a node from any Python process (python-api §9, §10;
execution-model §16 "ClientServer").

``connect(endpoint)`` returns a ``RemoteClient``: a ``zlink.Client`` whose calls are the very
call builders of ``node.client()`` (``zlink.messaging.calls``), handed to a remote
``RuntimePort``, the ``_Connection`` below, which turns each into a frame of
``zlink.mesh.client_wire`` on a DEALER connected to the node's client ROUTER. The client needs
the message classes, not the App.

Threads: one thread of the client's own, an ``InfraExecutor``, runs the deadline heap, every
completion, and the I/O: it owns the DEALER (ZeroMQ sockets are not thread-safe) and its
monitor, and polls them between its tasks (``InfraExecutor.host``: its idle wait is the poll).
Callers hand frames over with an append under ``_lock`` and, when the thread may be asleep, one
wake-up frame on an inproc PAIR; nothing they call blocks on a socket. A reply read is
completed on the same thread, with no hand-off to another (a round trip crosses one thread
fewer than with an I/O thread of its own); a slow callback of a caller holds the socket until
it returns, as it holds every other completion.

Guarantees / assumes:
* A call completes exactly once (python-api §5, execution-model §16): a request's deadline is
  the client's (its time remaining travels to the node, whose own deadline is later); a reply
  after it is dropped and counted once (``late_replies``).
* Backpressure (python-api §9): at most ``window`` sends (each message of a batch counted) and
  ``window_bytes`` payload bytes are unacknowledged per connection (the smaller of this
  client's limits and the node's). ``send.submit()`` past them is ``ResourceExhausted`` at
  once, nothing sent; ``wait()``/``future()``/``await`` wait for room first come first served
  (a ``submit()`` never overtakes them), then for the node's verdict: they complete once the
  node admitted the message, or fail with its typed error. A wait that ends before its frame
  left is withdrawn (nothing sent); once sent, the node decides within the time the caller
  had left and its verdict is the outcome. A ``wait(timeout)`` still returns by its deadline
  (python-api §11): a verdict not back by then (a node stopped, say) is ``DeadlineExceeded``
  saying the send may still be admitted (``Admitted.wait_admitted``). A send the node did not
  admit is counted (``sends_dropped_<reason>``) here as on the node. Requests and creates
  past the node's ``calls_in_flight`` wait for a call in flight to end, in order, within
  their own deadline (nothing is sent for one whose deadline passes first).
* A lost connection (the node says goodbye, the TCP connection drops, or ZMTP heartbeats go
  unanswered for ``3 * heartbeat`` seconds) fails every pending call and wait at once with
  ``Unavailable``, and every later call too; sends without a verdict then are counted
  (``sends_unconfirmed_connection_lost``: they may or may not have been admitted).
* Every error a caller sees is a ``zlink.errors`` type; a frame from the node that does not
  decode is counted (``bad_frames``) and dropped; the completion thread survives any exception
  of a task (``client_task_errors``); an exception of the I/O thread's own loop ends the
  connection as a loss (``io_errors``, ``Unavailable`` to every caller), never silently.
* ``_lock`` guards the connection's state, windows, tables and the outgoing queue; under it
  only frames are encoded and appended, never a socket call, a completion or a callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..addresses import check_endpoint
from ..durations import check_seconds, check_timeout, poll_ms
from ..errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    InvalidOperation,
    NotFound,
    ResourceExhausted,
    Unavailable,
    ZLinkError,
)
from ..executor import (
    DeadlineHandle,
    InfraExecutor,
    MonotonicClock,
    current_turn,
    in_infrastructure,
)
from ..messaging import codec
from ..messaging.completion import ON_ITS_WAY, Admitted, Completion, expire, in_progress
from ..messaging.context import Client
from ..messaging.message import Message, reply_from_json, reply_type, wire_bytes
from ..types import ActorCreateResult, SpotCreateResult, SpotRef, TargetKind
from . import client_wire as cw
from .client_failover import Connection, Failover
from .keys import ClientKeys
from .remote_errors import decode_error

if TYPE_CHECKING:
    from ..messaging.calls import (
        BatchSendCall,
        CreateCall,
        JoinCall,
        MessageCall,
        RelocationReadyCall,
        WaitMode,
        WorkerCall,
    )

_log = logging.getLogger("zlink.client")
T = TypeVar("T")
_NOTICES = (cw.PEERS_CHANGED, cw.GOING_AWAY)  # WELCOMEs a node sends unasked

_RECV_BATCH = 256  # frames read at once before they go to the completion thread
_CLOSE_LINGER_MS = 1000  # how long close() lets queued frames get out
_ORPHAN_MARGIN = 1.0  # past a node's reply_grace: how long a call's late answer may travel
_ATTEMPT_TIMEOUT = 2.0  # seconds a reconnect attempt waits for a node's handshake, at most
MAX_HEARTBEAT = 2000.0  # seconds: a heartbeat interval connect() takes, at most (ZeroMQ TTL)
_CANCEL_LOOK = 0.05  # seconds between looks at a handshake's cancel event
_PACK_BYTES = 64 * 1024  # frames queued together go as one PACK of at most this many bytes
_PACK_FRAMES = 256  # ... and at most this many frames
_LOST_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_REPLY_TYPES: dict[type, Any] = {}  # request class -> its reply type (reply_type walks the MRO)
_UNSET = object()
_MAX_ID = 2**63 - 1


def _span(seconds: float) -> float:
    """The time a waiting send or call has left, as its frame carries it once it goes: to the
    millisecond, so its JSON is never wider than :func:`_widest` of the span it began as."""
    return round(max(1e-3, seconds), 3)


def _widest(seconds: float) -> float:
    """A span whose JSON is as wide as any :func:`_span` up to ``seconds`` (at most
    ``MAX_SECONDS``): what a waiting frame's size is checked with. An audit found the check
    made with the span itself (``1.0``) and the frame built later with the time left
    (``0.98765...``), larger than the node takes."""
    return math.floor(seconds) + 0.111


class _State(Enum):
    CONNECTING = "connecting"
    UP = "up"
    LOST = "lost"
    CLOSED = "closed"


class _Counters:
    """The client's counters (``RemoteClient.counters()``); exact on every build."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass(slots=True)
class _InFlight:
    """A send on its way: counted in the window until the node's verdict."""

    items: int
    size: int
    room: Admitted | None  # its caller waits for the verdict (``None``: ``submit()``)


@dataclass(slots=True)
class _Waiting:
    """A send waiting for room in the window (``wait``/``future``/``await``)."""

    items: int
    size: int
    room: Admitted
    build: Callable[[int, float | None], bytes]  # (seq, the wait left) -> its frame
    limit: float  # seconds it may wait, from ``since`` (here, then at the node)
    since: float  # monotonic


@dataclass(slots=True)
class _Pending:
    """A call awaiting its reply."""

    completion: Completion
    decode: Callable[[bytes], Any]
    orphan: DeadlineHandle | None = None  # ended without its reply: when its slot frees
    ends: float = 0.0  # (monotonic) when its deadline, as sent, passes


@dataclass(slots=True)
class _CallWaiting:
    """A call waiting for one of the calls in flight to end (python-api §9: a request's wait
    for room counts inside its own timeout, armed on its completion already)."""

    pending: _Pending
    build: Callable[[int, float], bytes]  # (correlation, the time left) -> its frame
    deadline: float  # seconds, from ``since``
    since: float  # monotonic


@dataclass(frozen=True, slots=True)
class _Limits:
    """What this client keeps to on its connection: the node's ``WELCOME``, narrowed by its
    own settings."""

    node_id: str
    mesh: str  # the node's mesh: a call for another is refused here, as the node would
    window_items: int
    window_bytes: int
    calls_in_flight: int
    admission_timeout: float
    request_timeout: float
    max_frame_bytes: int
    reply_grace: float  # how long after a call's deadline the node may still count it


def _decode_bool(data: bytes) -> bool:
    value = codec.loads(data)
    if type(value) is not bool:
        raise InvalidArgument(f"expected true or false, got {value!r}")
    return value


def _reply_type(cls: type[Message]) -> Any:
    found = _REPLY_TYPES.get(cls, _UNSET)
    if found is _UNSET:
        found = _REPLY_TYPES[cls] = reply_type(cls)
    return found


def _secure(sock: zmq.Socket[Any], keys: ClientKeys | None) -> None:
    """CURVE on the DEALER when the mesh has keys (python-api §10): the mesh's public key to
    check the node, and this client's own key pair, which the node must know."""
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


class _Connection:
    """One client connection to one node: the remote ``RuntimePort`` (see the module
    docstring). Callers run on any thread; frames arrive on the I/O thread and are handled on
    the completion thread (``_infra``)."""

    def __init__(
        self,
        endpoint: str,
        window: int,
        window_bytes: int,
        heartbeat: float,
        keys: ClientKeys | None,
        counters: _Counters | None = None,
        on_lost: Callable[[], None] | None = None,
        reconnecting: bool = False,
        on_away: Callable[[], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._own_window = (window, window_bytes)
        self.counters = _Counters() if counters is None else counters
        self._on_lost = on_lost  # (completion thread) told once the connection is lost
        self._on_away = on_away  # (completion thread) told once its node goes away
        self.going_away = False  # its node drains or stops: it takes no new calls
        self.peers: tuple[str, ...] = ()  # the other nodes' client endpoints (WELCOME)
        self._after_loss = "; the client reconnects (wait_connected())" if reconnecting else ""
        self._lock = threading.Lock()
        self._state = _State.CONNECTING
        self._why = ""  # why it was lost
        self.said_goodbye = False  # its node ended it with a BYE (the failover tries it last)
        self._limits: _Limits | None = None
        self._answered = threading.Event()  # WELCOME, BYE or a loss during the handshake
        self._out: deque[bytes] = deque()  # frames for the I/O thread (under _lock)
        self._signalled = False  # a wake-up is on its way (under _lock)
        self._stop_io = False  # the I/O thread ends once _out is written (under _lock)
        self._ended = False  # its threads were ended (_end_threads, under _lock)
        self._linger = 0  # ms the DEALER lets queued frames out at the end
        self._next = 1  # the next seq / correlation (under _lock)
        self._items = 0  # the window's use (under _lock)
        self._bytes = 0
        self._sends: dict[int, _InFlight] = {}  # seq -> send without a verdict (under _lock)
        self._waiting: deque[_Waiting] = deque()  # sends waiting for room (under _lock)
        self._calls: dict[int, _Pending] = {}  # correlation -> call (under _lock)
        self._call_waiting: deque[_CallWaiting] = deque()  # calls waiting for a slot (_lock)
        self._infra = InfraExecutor(MonotonicClock(), "zlink-client", self._failed)
        self._ctx = zmq.Context()
        try:
            dealer = self._dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.SNDHWM, 0)  # bounded by the windows, not by ZeroMQ
            dealer.setsockopt(zmq.RCVHWM, 0)
            ivl = max(1, int(heartbeat * 1000))
            dealer.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl * 3)
            dealer.setsockopt(zmq.HEARTBEAT_TTL, ivl * 3)
            if "[" in endpoint:
                dealer.setsockopt(zmq.IPV6, 1)
            _secure(dealer, keys)
            self._monitor = dealer.get_monitor_socket(_LOST_EVENTS)
            self._wake_r = self._ctx.socket(zmq.PAIR)
            self._wake_w = self._ctx.socket(zmq.PAIR)
            name = f"inproc://zlink-client-wake-{id(self)}"
            self._wake_r.bind(name)
            self._wake_w.connect(name)
            dealer.connect(endpoint)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._wake_lock = threading.Lock()  # the wake-up socket's sending side (leaf)
        self._wake_closed = False
        self._poller = zmq.Poller()
        self._poller.register(dealer, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._blocked = False  # ZeroMQ took not all of _out: the poll also waits for room
        self._hosted = False  # the infrastructure thread turns the I/O (from ``open``)
        self._io_done = threading.Event()  # the last turn closed the sockets

    # -- opening and closing --------------------------------------------------------------------
    def open(self, timeout: float, cancel: threading.Event | None = None) -> None:
        """Start the threads and shake hands: ``Unavailable`` if no node answers in time, or
        once ``cancel`` is set (looked at every 50 ms)."""
        self._infra.start()
        self._infra.host(self)
        self._hosted = True
        hello = cw.Hello(0, f"{os.getpid()}@{socket.gethostname()}")
        with self._lock:
            self._out.append(cw.encode(hello))
            self._signalled = True
        self._wake_now()
        end = time.monotonic() + timeout
        while not self._answered.wait(min(_CANCEL_LOOK, max(0.0, end - time.monotonic()))):
            if time.monotonic() >= end:
                raise Unavailable(f"no node answered at {self.endpoint} within {timeout:.3g} s")
            if cancel is not None and cancel.is_set():
                raise Unavailable(f"the client was closed while it connected to {self.endpoint}")
        with self._lock:
            if self._state is not _State.UP:
                raise Unavailable(f"node at {self.endpoint} did not take the client: {self._why}")

    def close(self) -> None:
        """Leave: what was handed over goes out (a ``BYE`` last); every call still pending
        fails with ``Cancelled`` (a send on its way may still be admitted); the threads
        end."""
        with self._lock:
            if self._state is _State.CLOSED:
                return
            was, self._state = self._state, _State.CLOSED
            self._why = "the client was closed"
            if was is _State.UP:
                self._out.append(cw.encode(cw.Bye("the client closes")))
                self._linger = _CLOSE_LINGER_MS
            lost = self._take_all()
            self._stop_io = True
        self._fail_all(
            lost, Cancelled("the client was closed before the call completed"), "client_closed"
        )
        self._end_threads()

    def retire(self) -> None:
        """End a lost connection's threads, leaving it lost: a caller that still holds it
        hears ``Unavailable``, as from any lost connection (a client that connected again
        retires the one it lost). Nothing else for a connection that is not lost."""
        with self._lock:
            if self._state is not _State.LOST:
                return
        self._end_threads()

    def _end_threads(self) -> None:
        """(Closed or lost: ``_stop_io`` is set.) The last I/O turn, then the threads end;
        once (a connection retired, then closed)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._wake_now()
        if not self._hosted:  # never opened: its sockets are closed here
            self._close_sockets()
        elif self._infra.finish_here(self):
            pass  # no other thread turns it now: its last turn (it closes) was here
        else:  # the last turn writes the goodbye, then closes the sockets on its thread
            self._io_done.wait(_CLOSE_LINGER_MS / 1000 + 5)
        self._infra.stop(5.0)

    def busy(self) -> bool:
        """Whether a call, a send or a wait for room is still pending on this connection."""
        with self._lock:
            return bool(self._calls or self._call_waiting or self._sends or self._waiting)

    def _take_all(self) -> tuple[list[_Pending], list[_InFlight], list[_Waiting]]:
        """(Under ``_lock``.) Empty every table: what a loss or a close fails."""
        calls = [p for p in self._calls.values() if p.orphan is None]  # (an orphan ended:
        self._calls = {}  # its caller heard so, a review found it counted failed again)
        calls += [waiting.pending for waiting in self._call_waiting]  # (never sent)
        self._call_waiting = deque()
        sends, self._sends = list(self._sends.values()), {}
        waiting, self._waiting = list(self._waiting), deque()
        self._items = self._bytes = 0
        return calls, sends, waiting

    def _fail_all(
        self,
        lost: tuple[list[_Pending], list[_InFlight], list[_Waiting]],
        error: Exception,
        why: str,
    ) -> None:
        """Fail what ``_take_all`` took; counted as ``calls_failed_<why>`` and
        ``sends_unconfirmed_<why>`` (sends on their way: they may have been admitted)."""
        calls, sends, waiting = lost
        if calls:
            self.counters.add(f"calls_failed_{why}", len(calls))
        unconfirmed = sum(s.items for s in sends)
        if unconfirmed:
            self.counters.add(f"sends_unconfirmed_{why}", unconfirmed)
        for pending in calls:
            pending.completion.set(None, error)
        for send in sends:
            if send.room is not None:
                send.room.set(None, error)
        for wait in waiting:
            wait.room.set(None, error)

    def _lost(self, why: str) -> None:
        """(Completion thread.) The connection is gone: everything pending fails at once with
        ``Unavailable``, and so does every later call."""
        with self._lock:
            if self._state in (_State.LOST, _State.CLOSED):
                return
            was, self._state = self._state, _State.LOST
            self._why = why
            lost = self._take_all()
            self._stop_io = True
        self._answered.set()
        if was is _State.UP:
            _log.warning(
                "client of node %s at %s: connection lost: %s", self.node_id, self.endpoint, why
            )
            if self._on_lost is not None:  # before any caller hears of it (a caller told
                self._on_lost()  # Unavailable who asks wait_connected() must wait)
        self._fail_all(
            lost,
            Unavailable(
                f"the connection to node {self.node_id} at {self.endpoint} was lost: {why}"
            ),
            "connection_lost",
        )
        self._wake_now()

    @property
    def node_id(self) -> str:
        limits = self._limits
        return "?" if limits is None else limits.node_id

    @property
    def mesh(self) -> str | None:
        """The mesh of the node it shook hands with (``None`` before the handshake)."""
        limits = self._limits
        return None if limits is None else limits.mesh

    @property
    def state(self) -> str:
        return self._state.value

    def _failed(self, exc: BaseException) -> None:
        self.counters.add("client_task_errors")

    # -- what callers call (any thread): the RuntimePort --------------------------------------
    def _ready(self) -> _Limits:
        """(Under ``_lock``.) The limits of a connection that is up; else the typed refusal."""
        limits = self._limits
        if self._state is _State.UP and limits is not None:
            return limits
        if self._state is _State.CLOSED:
            raise InvalidOperation(f"the client of {self.endpoint} is closed")
        raise Unavailable(
            f"the connection to node {self.node_id} at {self.endpoint} was lost: {self._why}"
            f"{self._after_loss}"
        )

    def submit(
        self,
        call: MessageCall,
        reply: Completion | None,
        mode: WaitMode,
        hops: int = 0,
        force: bool = False,
        plain: bool = False,
        room: Admitted | None = None,
    ) -> Completion:
        """A send (``reply`` ``None``) or a request, as a frame to the node."""
        self._same_mesh(call)
        msg = call.msg
        payload = wire_bytes(msg)
        type_name = type(msg).zlink_type_name
        kind, target, meta = call.kind, call.target, call.meta
        instance, instance_type = call.instance, call.instance_type
        if reply is None:

            def send(seq: int, wait: float | None) -> bytes:
                return cw.encode(
                    cw.Send(
                        seq, kind, target, type_name, meta, instance, instance_type, wait, payload
                    )
                )

            self._send(1, len(payload), send, room)
            return None  # type: ignore[return-value]  # a send completes through ``room``
        if kind is TargetKind.TOPIC:
            raise InvalidArgument("a topic takes one-way events only")
        deadline = call.deadline
        tp = _reply_type(type(msg))

        def request(correlation: int, deadline: float) -> bytes:
            return cw.encode(
                cw.Request(
                    correlation,
                    kind,
                    target,
                    type_name,
                    meta,
                    instance,
                    instance_type,
                    deadline,
                    payload,
                )
            )

        self._call(reply, functools.partial(reply_from_json, tp), request, deadline)
        return reply

    def _same_mesh(self, call: MessageCall) -> None:
        """``in_mesh`` names another mesh than the node's: ``NotFound`` at the call site, as
        ``node.client()`` says (a node reaches its own mesh only; the frames of sends and
        requests carry no mesh, the node's is meant)."""
        mesh = call.mesh
        if mesh is None:
            return
        with self._lock:
            limits = self._ready()
        if mesh != limits.mesh:
            raise NotFound(f"mesh {mesh!r} is not reachable from node {limits.node_id}")

    def submit_many(
        self, call: BatchSendCall, room: Admitted | None = None, mode: WaitMode | None = None
    ) -> None:
        """A batch as one frame: admitted all or none at the node."""
        payloads = tuple(map(wire_bytes, call.msgs))
        types = tuple(type(m).zlink_type_name for m in call.msgs)
        kind, target = call.kind, call.target

        def batch(seq: int, wait: float | None) -> bytes:
            return cw.encode(cw.Batch(seq, kind, target, types, wait, payloads))

        self._send(len(payloads), sum(map(len, payloads)), batch, room)

    def submit_create(self, call: CreateCall[Any], mode: WaitMode) -> Completion:
        """A create or get-or-create, answered with its result."""
        msg = call.request_msg
        payload = b"" if msg is None else wire_bytes(msg)
        type_name = None if msg is None else type(msg).zlink_type_name
        result = SpotCreateResult if call.kind is TargetKind.SPOT else ActorCreateResult

        def create(correlation: int, deadline: float) -> bytes:
            return cw.encode(
                cw.Create(
                    correlation,
                    call.kind,
                    call.type_name,
                    call.object_id,
                    call.get,
                    type_name,
                    call.mesh,
                    deadline,
                    payload,
                )
            )

        completion = Completion()
        self._call(completion, functools.partial(reply_from_json, result), create, call.deadline)
        return completion

    def close_ref(self, ref: SpotRef) -> bool:
        """``spots.close(ref)``: one round trip, waited for on the calling thread."""
        if not isinstance(ref, SpotRef):
            raise InvalidArgument(f"close() takes a SpotRef, got {type(ref).__name__}")
        if current_turn() is not None or in_infrastructure():
            raise InvalidOperation(
                "spots.close() of a remote client blocks until the node "
                "answers: not from a handler or an infrastructure thread"
            )
        return self.close_later(ref).wait(None)  # type: ignore[no-any-return]

    def close_later(self, ref: SpotRef) -> Completion:
        """``spots.close(ref)`` without blocking: the node's answer once it came (the node
        the client is attached to asks the Spot's owner, python-api §5)."""
        if not isinstance(ref, SpotRef):
            raise InvalidArgument(f"close() takes a SpotRef, got {type(ref).__name__}")

        def close(correlation: int, deadline: float) -> bytes:
            return cw.encode(
                cw.Close(
                    correlation, ref.spot_id, ref.object_generation, ref.mesh_name, ref.node_rid
                )
            )

        completion = Completion()
        self._call(completion, _decode_bool, close, None)
        return completion

    def _send(
        self,
        items: int,
        size: int,
        build: Callable[[int, float | None], bytes],
        room: Admitted | None,
    ) -> None:
        """Put a send in the window now, or (given ``room``) wait for room there; else
        ``ResourceExhausted`` with nothing sent. Without ``room`` (a ``submit()``) its frame
        says it waits for none at the node either (``wait`` 0: refused at once there too)."""
        wait = 0.0 if room is None else room.deadline
        with self._lock:
            limits = self._ready()
            if items > limits.window_items or size > limits.window_bytes:
                raise InvalidArgument(
                    f"{items} message(s) of {size:,} bytes are more than the client's window "
                    f"({limits.window_items} / {limits.window_bytes:,} bytes) ever holds"
                )
            used = (self._items, self._bytes)
            fits = (
                not self._waiting
                and used[0] + items <= limits.window_items
                and used[1] + size <= limits.window_bytes
            )
            if fits:
                frame = self._frame(build(self._next, wait), limits)
                self._put(items, size, frame, room,
                          wait if wait is not None else limits.admission_timeout)  # fmt: skip
                wake = not self._signalled
                self._signalled = True
            elif room is not None:
                limit = wait if wait is not None else limits.admission_timeout
                self._frame(build(_MAX_ID, _widest(limit)), limits)  # it fits when it goes
                queued = _Waiting(items, size, room, build, limit, time.monotonic())
                self._waiting.append(queued)
                room.withdraw = functools.partial(self._withdraw, queued)
        if fits:
            if wake:
                self._wake_now()
            return
        if room is None:
            self.counters.add("sends_refused_window_full")
            raise ResourceExhausted(
                f"the client's window to node {limits.node_id} is full ({used[0]} sends, "
                f"{used[1]:,} bytes unacknowledged; limits {limits.window_items} / "
                f"{limits.window_bytes:,}); nothing was sent"
            )
        self.counters.add("window_waits")
        room.timer = self._infra.call_later(
            queued.limit,
            room.abandon,
            DeadlineExceeded(
                f"no room in the client's window to node {limits.node_id} within "
                f"{queued.limit:g} s; nothing was sent"
            ),
        )

    @staticmethod
    def _frame(frame: bytes, limits: _Limits) -> bytes:
        """``frame``, unless it is larger than the node takes (``InvalidArgument``)."""
        if len(frame) > limits.max_frame_bytes:
            raise InvalidArgument(
                f"a frame of {len(frame):,} bytes is larger than node "
                f"{limits.node_id} takes ({limits.max_frame_bytes:,})"
            )
        return frame

    def _put(
        self, items: int, size: int, frame: bytes, room: Admitted | None, limit: float
    ) -> None:
        """(Under ``_lock``.) A send numbered ``_next`` into the window and onto the outgoing
        queue. A caller waiting on ``room`` hears the node's verdict, or, if none comes within
        ``limit`` seconds (the time it had left, or the node's admission timeout) and a
        moment more, ``DeadlineExceeded`` saying it may still be admitted (python-api §9,
        §11: every wait has an end)."""
        seq = self._next
        self._next = seq + 1
        self._items += items
        self._bytes += size
        self._sends[seq] = _InFlight(items, size, room)
        self._out.append(frame)
        if room is not None:
            room.withdraw = in_progress  # sent: the node's verdict is its outcome
            if room.timer is not None:  # (its wait for room in the window is over)
                room.timer.cancel()
            node = self.node_id
            room.timer = self._infra.call_later(limit + ON_ITS_WAY, _no_verdict, room, node, limit)

    def _withdraw(self, waiting: _Waiting) -> bool:
        """Take back a send still waiting for room (its caller gave up): ``True`` if it was.
        Those behind it that fit now go (an audit found them waiting for the next verdict,
        and every ``submit()`` refused meanwhile, with room in the window)."""
        with self._lock:
            try:
                self._waiting.remove(waiting)
            except ValueError:
                return False
            wake = self._admit_waiting()
        if wake:
            self._wake_now()
        return True

    def _call(
        self,
        completion: Completion,
        decode: Callable[[bytes], Any],
        build: Callable[[int, float], bytes],
        deadline: float | None,
    ) -> None:
        """Send a call awaiting a reply; its deadline (the node's default if ``None``) is
        this client's, on its own heap. With ``calls_in_flight`` calls on their way already
        it waits for one of them to end, first come first served, within that same deadline
        (python-api §9: a request's wait for room counts inside its timeout); nothing is sent
        for a call whose deadline passes while it waits."""
        with self._lock:
            limits = self._ready()
            if deadline is None:
                deadline = limits.request_timeout
            pending = _Pending(completion, decode)
            if len(self._calls) >= limits.calls_in_flight or self._call_waiting:
                self._frame(build(_MAX_ID, _widest(deadline)), limits)  # fits when it goes
                waiting = _CallWaiting(pending, build, deadline, time.monotonic())
                self._call_waiting.append(waiting)
                self.counters.add("call_waits")
                completion.timer = self._infra.call_later(
                    deadline,
                    expire,
                    completion,
                    f"no room for a call to node {limits.node_id} within {deadline:g} s "
                    f"({limits.calls_in_flight} calls in flight); nothing was sent",
                )
            else:
                waiting = None
                correlation = self._send_call(pending, build, deadline, limits)
                wake = not self._signalled
                self._signalled = True
        if waiting is not None:  # (outside the lock: a callback of a call done already runs
            completion.add_callback(functools.partial(self._unwait, waiting))  # at once)
            return
        completion.add_callback(functools.partial(self._forget, correlation))
        if wake:
            self._wake_now()

    def _send_call(
        self, pending: _Pending, build: Callable[[int, float], bytes], deadline: float,
        limits: _Limits,
    ) -> int:  # fmt: skip
        """(Under ``_lock``.) Number a call, put its frame on the outgoing queue and (unless it
        waited with one armed already) its deadline on the heap; its correlation."""
        correlation = self._next
        frame = self._frame(build(correlation, deadline), limits)
        self._next = correlation + 1
        pending.ends = time.monotonic() + deadline
        self._calls[correlation] = pending
        completion = pending.completion
        if completion.timer is None:
            completion.timer = self._infra.call_later(
                deadline,
                expire,
                completion,
                f"no reply within {deadline:g} s (asked through node {limits.node_id})",
            )
        self._out.append(frame)
        return correlation

    def _unwait(self, waiting: _CallWaiting, _value: Any, _error: BaseException | None) -> None:
        """A call that waited for a slot ended before it had one (its deadline, a cancel)."""
        # (not there: it was sent, and ``_forget`` takes it; or it failed with the connection)
        with self._lock, contextlib.suppress(ValueError):
            self._call_waiting.remove(waiting)

    def _forget(self, correlation: int, _value: Any, _error: BaseException | None) -> None:
        """A call ended. By its reply (taken from ``_calls`` then), its slot goes to the calls
        that wait for one, in order. Before it (its deadline, a cancel), the node still
        counts it until it answers, its own deadline ``reply_grace`` later at the latest: its
        slot stays taken until that answer comes (``_on_reply``), or that time and a moment
        more has passed (an audit found the next call sent at once, and refused there). (A
        callback of the call's completion: nothing may escape it, or the callbacks after it,
        the caller's own, would not run.)"""
        with self._lock:
            pending = self._calls.get(correlation)
            limits = self._limits
            if pending is not None and self._state is _State.UP and limits is not None:
                left = max(0.0, pending.ends - time.monotonic())  # (a cancel ends it early:
                pending.orphan = self._infra.call_later(  # the node counts it till then)
                    left + limits.reply_grace + _ORPHAN_MARGIN,
                    self._orphaned,
                    correlation,
                    pending,
                )
                return
        self._calls_freed()

    def _orphaned(self, correlation: int, pending: _Pending) -> None:
        """A call that ended without its reply has not been answered in time: its slot goes."""
        with self._lock:
            if self._calls.get(correlation) is not pending:
                return
            del self._calls[correlation]
        self.counters.add("calls_never_answered")
        self._calls_freed()

    def _calls_freed(self) -> None:
        """Calls that wait for a slot go, in order, while there are slots."""
        sent: list[tuple[int, Completion]] = []
        refused: list[tuple[Completion, ZLinkError]] = []
        with self._lock:
            limits = self._limits
            if self._state is not _State.UP or limits is None:
                return
            now = time.monotonic()
            while self._call_waiting and len(self._calls) < limits.calls_in_flight:
                waiting = self._call_waiting.popleft()
                completion = waiting.pending.completion
                if completion.done:
                    continue  # (its deadline or a cancel, just now)
                left = _span(waiting.deadline - (now - waiting.since))
                try:
                    number = self._send_call(waiting.pending, waiting.build, left, limits)
                except ZLinkError as exc:  # (it was checked at its widest: not expected)
                    refused.append((completion, exc))
                    continue
                sent.append((number, completion))
            wake = bool(sent) and not self._signalled
            if wake:
                self._signalled = True
        for number, completion in sent:
            completion.add_callback(functools.partial(self._forget, number))
        for completion, error in refused:
            completion.set(None, error)
        if wake:
            self._wake_now()

    # what a remote client has no turn for
    def submit_worker(self, call: WorkerCall[Any]) -> Completion:
        raise InvalidOperation("workers belong to handler contexts, not to a remote client")

    def defer_join(self, call: JoinCall) -> None:
        raise InvalidOperation("join().defer() belongs to a handler's turn, not a remote client")

    def defer_relocation_ready(self, call: RelocationReadyCall) -> None:
        raise InvalidOperation("relocation_ready() belongs to a Spot's turn, not a remote client")

    def check_yield(self, call: Any) -> None:
        raise InvalidOperation(
            "yield_() releases a Spot's gate in a handler; a remote client "
            "has no turn: use `await call`, wait() or future()"
        )

    def yield_begin(self) -> object | None:
        raise InvalidOperation("a remote client has no turn to yield")

    def yield_end(self, token: Any) -> None:
        raise InvalidOperation("a remote client has no turn to yield")

    def subscribe(self, ref: SpotRef, topic: str, on: bool) -> None:
        raise InvalidOperation("subscriptions belong to Spots, not to a remote client")

    def leave(
        self, actor_id: str, from_spot: str | None, then: Callable[[], None] | None = None
    ) -> None:
        raise InvalidOperation("leave belongs to a handler's turn, not a remote client")

    def disconnect(self, actor_id: str, from_spot: str | None) -> None:
        raise InvalidOperation("disconnect belongs to a handler's turn, not a remote client")

    def close_self(self, spot_id: str) -> None:
        raise InvalidOperation("close() of an Instance Spot belongs to its own turn")

    def actor_spot_id(self, actor_id: str) -> str:
        raise InvalidOperation("a remote client has no Actor context")

    # -- what arrives (completion thread) -----------------------------------------------------
    def _on_frames(self, frames: list[bytes]) -> None:
        for data in frames:
            try:
                frame = cw.decode(data)
            except cw.FrameError as exc:
                self.counters.add("bad_frames")
                if exc.reason is cw.BadFrame.VERSION and self._state is _State.CONNECTING:
                    self._lost(f"the node speaks another protocol: {exc}")
                continue
            match frame:
                case cw.Reply():
                    self._on_reply(frame)
                case cw.Acks():
                    self._on_acks(frame)
                case cw.Welcome():
                    self._on_welcome(frame)
                case cw.Bye():
                    self.said_goodbye = True
                    self._lost(f"the node said goodbye: {frame.reason}")
                case _:
                    self.counters.add("unexpected_frames")

    def _on_welcome(self, f: cw.Welcome) -> None:
        items, size = self._own_window
        with self._lock:
            if f.correlation in _NOTICES and self._state is _State.UP:
                notice = True  # the nodes its node reaches changed, or it goes away
            elif self._state is not _State.CONNECTING or f.correlation != 0:
                self.counters.add("unexpected_frames")
                return
            else:
                notice = False
        if notice:
            self.peers = self._checked_peers(f.peers)
            if f.correlation == cw.GOING_AWAY and not self.going_away:
                self.going_away = True
                _log.info("client of node %s at %s: the node goes away (it drains or "
                          "stops); connecting to another", self.node_id, self.endpoint)  # fmt: skip
                if self._on_away is not None:
                    self._on_away()
            return
        with self._lock:
            if self._state is not _State.CONNECTING:  # (lost meanwhile)
                return
            self._limits = _Limits(
                f.node_id,
                f.mesh,
                max(1, min(items, f.window_items)),
                max(1, min(size, f.window_bytes)),
                max(1, f.calls_in_flight),
                max(1e-3, f.admission_timeout),
                max(1e-3, f.request_timeout),
                f.max_frame_bytes,
                min(max(0.0, f.reply_grace), 60.0),  # (a node's word: bounded)
            )
            self._state = _State.UP
        self.peers = self._checked_peers(f.peers)
        self._answered.set()

    def _checked_peers(self, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        """A node's word on its peers' client endpoints: each checked, a bad one counted."""
        peers: list[str] = []
        for endpoint in endpoints:
            try:
                peers.append(check_endpoint(endpoint))
            except InvalidArgument:
                self.counters.add("bad_peer_endpoints")
        return tuple(peers)

    def _on_reply(self, f: cw.Reply) -> None:
        with self._lock:
            pending = self._calls.pop(f.correlation, None)
        if pending is None:  # completed already (its deadline first): never a second time
            self.counters.add("late_replies")  # (and its slot went: ``_orphaned``)
            return
        if pending.orphan is not None:  # it ended before its reply: its slot goes now
            pending.orphan.cancel()
            self.counters.add("late_replies")
            self._calls_freed()
            return
        completion = pending.completion
        if f.error is not None:
            done = completion.set(None, decode_error(f.error))
        else:
            try:
                value = pending.decode(f.value)
            except Exception as exc:  # noqa: BLE001 - the caller gets a typed error instead
                done = completion.set(None, InvalidArgument(f"the reply does not decode: {exc}"))
            else:
                done = completion.set(value, None)
        if not done:
            self.counters.add("late_replies")

    def _on_acks(self, f: cw.Acks) -> None:
        decided: list[tuple[_InFlight, BaseException | None]] = []
        unknown = 0
        with self._lock:
            sends = self._sends
            for first, last in f.admitted:
                seqs = (
                    range(first, last + 1)
                    if last - first < len(sends)
                    else [s for s in sends if first <= s <= last]
                )
                for seq in seqs:
                    send = sends.pop(seq, None)
                    if send is None:
                        unknown += 1
                        continue
                    decided.append((send, None))
            for failure in f.failed:
                send = sends.pop(failure.seq, None)
                if send is None:
                    unknown += 1
                    continue
                self.counters.add(f"sends_dropped_{failure.reason}", send.items)
                decided.append((send, decode_error(failure.error)))
            for send, _error in decided:
                self._items -= send.items
                self._bytes -= send.size
            wake = self._admit_waiting()
        if unknown:
            self.counters.add("unknown_verdicts", unknown)
        if wake:
            self._wake_now()
        for send, error in decided:
            if send.room is not None:
                send.room.set(None, error)
            elif error is not None:
                _log.debug("a send to node %s was not admitted: %s", self.node_id, error)

    def _admit_waiting(self) -> bool:
        """(Under ``_lock``.) Sends waiting for room go out while they fit, in order;
        whether the I/O thread must be woken."""
        limits = self._limits
        if not self._waiting or limits is None:
            return False
        sent = False
        now = time.monotonic()
        while self._waiting:
            head = self._waiting[0]
            if (
                self._items + head.items > limits.window_items
                or self._bytes + head.size > limits.window_bytes
            ):
                break
            self._waiting.popleft()
            if head.room.done:
                continue
            left = _span(head.limit - (now - head.since))
            try:
                frame = self._frame(head.build(self._next, left), limits)
            except ZLinkError as exc:  # (it was checked at its widest: not expected; its
                self._infra.submit(functools.partial(head.room.set, None, exc))  # callbacks
                continue  # take this lock)
            self._put(head.items, head.size, frame, head.room, left)  # (its wait for room
            sent = True  # ends, and the one for the node's verdict begins: an audit found
            # the latter cancelled here, and a send that never heard a verdict never ended)
        if sent and not self._signalled:
            self._signalled = True
            return True
        return False

    # -- the I/O thread -----------------------------------------------------------------------
    def _wake_now(self) -> None:
        with self._wake_lock:
            if self._wake_closed:
                return
            with contextlib.suppress(zmq.ZMQError):  # its peer is gone at the very end
                self._wake_w.send(b"", zmq.NOBLOCK)

    def wake(self) -> None:
        """(``InfraIO``, any thread.) Make the current or next ``turn`` return soon."""
        self._wake_now()

    def turn(self, timeout: float | None) -> bool:
        """(``InfraIO``: the infrastructure thread.) Wait for the DEALER up to ``timeout``
        seconds (``None``: until woken), read what came (completed on this thread, after the
        turn), write what callers handed over. ``False`` once closed or lost: what ZeroMQ took
        leaves within the socket's linger, what it refused (it had no connection) is counted
        (``frames_unsent_at_close``), the sockets are closed, and the thread turns it no more.
        An exception of its own ends the connection as a loss (``io_errors``)."""
        if self._wake_closed:
            return False
        dealer = self._dealer
        try:
            wait = None if timeout is None else poll_ms(timeout)
            ready = dict(self._poller.poll(wait))
            if self._wake_r in ready:
                self._drain_wake()
            if self._monitor in ready:
                self._read_monitor()
            if ready.get(dealer, 0) & zmq.POLLIN:
                self._read()
            now_blocked = self._write()
            if now_blocked != self._blocked:
                self._blocked = now_blocked
                self._poller.modify(dealer, zmq.POLLIN | (zmq.POLLOUT if now_blocked else 0))
            with self._lock:
                stop = self._stop_io
                # ZeroMQ refuses a frame only when it has no pipe to the node at all (no
                # high-water mark here): what it refused as the connection ends never goes
                unsent = len(self._out) if stop else 0
            if unsent:
                self.counters.add("frames_unsent_at_close", unsent)
        except Exception as exc:  # noqa: BLE001 - a failed I/O fails the connection
            self.counters.add("io_errors")
            _log.exception("client of %s: its I/O failed", self.endpoint)
            self._infra.submit(self._lost, f"the client's I/O failed: {exc}")
            stop = True
        if stop:
            try:
                self._close_sockets()
            finally:
                self._io_done.set()
            return False
        return True

    def _drain_wake(self) -> None:
        while True:
            try:
                self._wake_r.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _read_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] & _LOST_EVENTS:
                name = zmq.Event(event["event"]).name
                self._infra.submit(self._lost, f"ZeroMQ reports {name} on {event['endpoint']!r}")

    def _read(self) -> None:
        frames = []
        for _ in range(_RECV_BATCH):
            try:
                frames.append(self._dealer.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        if frames:
            self.counters.add("frames_received", len(frames))
            self._infra.submit(self._on_frames, frames)

    def _write(self) -> bool:
        """Send what callers handed over, in order, several frames found queued together as
        one ``PACK`` (one frame for the node's transport to read and hand on); ``True`` if
        ZeroMQ took not all of it."""
        with self._lock:
            self._signalled = False  # first: a frame handed over after the swap wakes again
            out, self._out = self._out, deque()
            limits = self._limits
        most = _PACK_BYTES if limits is None else min(_PACK_BYTES, limits.max_frame_bytes // 2)
        sent = 0
        try:
            while out:
                group = [out.popleft()]
                size = len(group[0])
                while out and len(group) < _PACK_FRAMES and size + len(out[0]) <= most:
                    size += len(out[0])
                    group.append(out.popleft())
                data = group[0] if len(group) == 1 else cw.encode(cw.Pack(tuple(group)))
                try:
                    self._dealer.send(data, zmq.NOBLOCK)
                except zmq.Again:
                    out.extendleft(reversed(group))
                    with self._lock:
                        out.extend(self._out)
                        self._out = out
                    return True
                sent += len(group)
        finally:
            if sent:
                self.counters.add("frames_sent", sent)
        return False

    def _close_sockets(self) -> None:
        with self._wake_lock:
            self._wake_closed = True
            self._wake_w.close(0)
        self._wake_r.close(0)
        with contextlib.suppress(zmq.ZMQError):
            self._dealer.disable_monitor()
        self._monitor.close(0)
        self._dealer.close(self._linger)
        self._ctx.term()


class RemoteClient(Client):
    """What ``zlink.connect`` returns: a ``zlink.Client`` (the same calls and terminals as
    ``node.client()``) on a connection to a node, plus ``close()``, ``counters()``,
    ``wait_connected()`` and the context manager. Handler-only calls (``yield_()``, workers,
    joins) are ``InvalidOperation``. After a lost connection it reconnects by itself (unless
    made with ``reconnect=False``; see ``zlink.mesh.client_failover``)."""

    __slots__ = ("_failover",)

    def __init__(self, failover: Failover) -> None:
        super().__init__(failover)
        self._failover = failover

    @property
    def _connection(self) -> Connection:
        """The connection calls go to now."""
        return self._failover.current

    @property
    def node_id(self) -> str:
        """The node this client is connected to (the last one, while it reconnects)."""
        return self._failover.current.node_id

    @property
    def endpoint(self) -> str:
        """Where it is connected (where it was, while it reconnects)."""
        return self._failover.current.endpoint

    def counters(self) -> dict[str, int]:
        """Late replies, sends the node dropped (by reason), frames, waits, reconnects and the
        like, over every connection the client had (they share one set)."""
        return self._failover.current.counters.snapshot()

    def wait_connected(self, timeout: float | None = None) -> None:
        """Block until the client is connected (at once, unless it is reconnecting after a
        loss); ``DeadlineExceeded`` after ``timeout`` seconds, ``InvalidOperation`` once it is
        closed, ``Unavailable`` at once if it was lost and does not reconnect."""
        self._failover.wait_connected(check_timeout(timeout, "a wait timeout"))

    def close(self) -> None:
        """Leave the node: frames already handed over still go out (for about a second);
        calls still pending fail with ``Cancelled``; reconnecting ends. Safe to call twice."""
        self._failover.close()

    async def aclose(self) -> None:
        """``close()`` for asyncio code: it runs on a thread of its own (it may take about a
        second while frames still go out) and the event loop runs on meanwhile."""
        await _on_a_thread(self.close, "zlink-client-close")

    def __enter__(self) -> RemoteClient:
        return self

    async def __aenter__(self) -> RemoteClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self._failover.current
        return f"<zlink.RemoteClient of node {c.node_id!r} at {c.endpoint} {c.state}>"


def connect(
    endpoint: str | Sequence[str],
    timeout: float = 5.0,
    *,
    window: int = 1024,
    window_bytes: int = 16 * 1024 * 1024,
    heartbeat: float = 1.0,
    keys: str | os.PathLike[str] | None = None,
    client: str = "client",
    reconnect: bool = True,
) -> RemoteClient:
    """A client of the node listening at ``endpoint`` (``tcp://HOST:PORT``), from any Python
    process (python-api §10). ``Unavailable`` if no node answers within ``timeout`` seconds (a
    handshake round trip); ``InvalidArgument`` for a malformed endpoint or setting.

    ``endpoint`` may be several endpoints (nodes of one mesh): the first that answers is used
    (each tried within its share of ``timeout``), and a reconnect tries them all.
    ``reconnect``: after a lost connection (whose pending calls fail with ``Unavailable``),
    connect again by itself, the lost endpoint first, backing off up to 2 s between rounds;
    calls made meanwhile fail at once with ``Unavailable`` (``wait_connected()`` waits).
    ``window`` / ``window_bytes``: sends (and their payload bytes) this client keeps
    unacknowledged at most (the node may narrow them). ``heartbeat``: seconds between ZMTP
    heartbeats (at most 2,000 s); a node silent for three of them is lost. ``keys``: the
    mesh's keys folder (``zlink keys generate``): the connection is then CURVE-encrypted and
    authenticated with the key pair ``clients/<client>.key_secret`` in it; a node whose mesh
    does not know that key refuses the handshake, and ``connect`` ends with ``Unavailable``
    at ``timeout``.
    """
    failover = _failover(endpoint, timeout, window, window_bytes, heartbeat, keys, client,
                         reconnect)  # fmt: skip
    failover.open()
    return RemoteClient(failover)


def connect_async(
    endpoint: str | Sequence[str],
    timeout: float = 5.0,
    *,
    window: int = 1024,
    window_bytes: int = 16 * 1024 * 1024,
    heartbeat: float = 1.0,
    keys: str | os.PathLike[str] | None = None,
    client: str = "client",
    reconnect: bool = True,
) -> AsyncConnect:
    """:func:`connect` for asyncio code, which it never blocks (python-api §10): ``client =
    await zlink.connect_async(endpoint)`` (then ``await client.aclose()``), or ``async with
    zlink.connect_async(endpoint) as client:``. The handshake waits on a thread of its own
    while the event loop runs on; the client is the same as :func:`connect`'s, its calls
    awaited. Bad arguments raise ``InvalidArgument`` here, at the call; a connect whose task
    is cancelled ends with ``CancelledError`` at once and closes what it made."""
    return AsyncConnect(
        _failover(endpoint, timeout, window, window_bytes, heartbeat, keys, client, reconnect)
    )


class AsyncConnect:
    """What :func:`connect_async` returns: await it for the client, or use it as ``async
    with`` (the client is closed at its end, with ``aclose``). One client per connect."""

    __slots__ = ("_client", "_failover", "_opened")

    def __init__(self, failover: Failover) -> None:
        self._failover = failover
        self._opened = False
        self._client: RemoteClient | None = None

    def __await__(self) -> Generator[Any, None, RemoteClient]:
        return self._open().__await__()

    async def _open(self) -> RemoteClient:
        if self._opened:
            raise InvalidOperation("this connect_async was awaited already: one client each")
        self._opened = True
        try:
            await _on_a_thread(self._failover.open, "zlink-client-connect")
        except asyncio.CancelledError:  # the handshake wait ends within 50 ms of the close,
            threading.Thread(  # and a connection it made meanwhile is closed, not installed
                target=self._failover.close, name="zlink-client-close", daemon=True
            ).start()
            raise
        self._client = RemoteClient(self._failover)
        return self._client

    async def __aenter__(self) -> RemoteClient:
        return await self._open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.aclose()


def _on_a_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run ``fn`` on a thread of its own; its outcome settles the returned future on the
    running loop (unless the future was cancelled meanwhile: the thread then ends unheard)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # (cancelled: its awaiter went away)
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiter
            error = exc
        with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile: nobody waits)
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _failover(
    endpoint: str | Sequence[str],
    timeout: float,
    window: int,
    window_bytes: int,
    heartbeat: float,
    keys: str | os.PathLike[str] | None,
    client: str,
    reconnect: bool,
) -> Failover:
    """A client's connections, every argument checked (``InvalidArgument``), not opened."""
    given: list[object] = [endpoint]
    if not isinstance(endpoint, str) and isinstance(endpoint, (list, tuple)):
        given = list(endpoint)
    if not given or not all(isinstance(e, str) for e in given):
        raise InvalidArgument(f"an endpoint, or a non-empty list of them, got {endpoint!r}")
    endpoints = tuple(dict.fromkeys(check_endpoint(e) for e in given))
    timeout = check_seconds(timeout, "a connect timeout")
    heartbeat = check_seconds(heartbeat, "a heartbeat interval")
    if heartbeat > MAX_HEARTBEAT:  # ZeroMQ carries three of them (the time-to-live a node
        raise InvalidArgument(  # is told) in 16 bits of deciseconds: 6,553 s at most
            f"a heartbeat interval is at most {MAX_HEARTBEAT:g} s, got {heartbeat!r}"
        )
    for what, value in (("window", window), ("window_bytes", window_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"{what} is a whole number >= 1, got {value!r}")
    if not isinstance(reconnect, bool):
        raise InvalidArgument(f"reconnect is True or False, got {reconnect!r}")
    if keys is None and client != "client":  # (it names a key pair in the keys folder)
        raise InvalidArgument(f"client={client!r} names a key pair of keys=: give keys too")
    loaded = None if keys is None else ClientKeys.load(keys, client)
    counters = _Counters()

    def make(at: str, lost: Callable[[], None], away: Callable[[], None]) -> _Connection:
        return _Connection(at, window, window_bytes, heartbeat, loaded, counters, lost,
                           reconnect, away)  # fmt: skip

    return Failover(endpoints, make, timeout, reconnect, min(timeout, _ATTEMPT_TIMEOUT),
                    counters.add)  # fmt: skip


__all__ = ["AsyncConnect", "RemoteClient", "connect", "connect_async"]


def _no_verdict(room: Admitted, node_id: str, limit: float) -> None:
    """(The client's timer.) A send left, and its node gave no verdict in time: its waiter
    hears that it may still be admitted (a verdict after this changes nothing)."""
    if not room.done:
        room.set(
            None,
            DeadlineExceeded(
                f"the send left for node {node_id}, and no verdict on it came within "
                f"{limit:g} s: it may still be admitted"
            ),
        )
