"""``ZmqTransport``: the mesh between node processes over ZeroMQ (execution-model §4, §13, §16;
python-api §10).

Sockets, all owned by one transport thread per node (pyzmq sockets are not thread-safe):

* For each channel (``Channel.DATA``, ``Channel.COMPLETION``) an *in* ROUTER, bound, that
  announces this node's identity, and an *out* ROUTER connected to the in socket of every peer.
  So each pair of nodes has, per channel and per direction, a ROUTER-ROUTER connection of its
  own: a peer whose DATA is paused never holds a reply, a fence or a credit back.
* The client ROUTER, bound at ``listen`` (the node's address): ``zlink.connect`` DEALERs.
* An inproc PAIR: other threads hand work over with one append under ``_lock`` and, when the
  thread may be asleep, one wake-up frame. Nothing they call ever blocks on a socket.

Identity (python-api §10): a node's routing id names its node id *and* its incarnation (from
the Location Store). Out sockets use ``IMMEDIATE`` and ``ROUTER_MANDATORY``: a pipe exists only
once the handshake is done and is named by the identity the peer announces, so a send to a dead
or restarted peer fails at once (``EHOSTUNREACH``) instead of being queued for seconds and then
handed to its successor; ZMTP heartbeats find a peer that vanished without closing. Every frame
also names the incarnation it is for: one for another incarnation of this node, or from an old
incarnation of a peer, is dropped and counted (``frames_wrong_incarnation``).

Flow control (python-api §9), the same contract as ``InProcessTransport``: at most
``data_limit`` DATA frames and ``data_bytes`` bytes of them (one frame always, however large)
from one node to another are in flight (sent, not yet taken by the receiving node's
infrastructure thread). The receiver returns credit, frames and bytes, on COMPLETION as it
takes them; a paused receiver holds what arrives (at most those limits, since the sender has no
more credit) and takes none, so the sender's ``send`` returns ``False`` and its senders wait at
the source. ZeroMQ's own high-water marks count messages, not bytes; what waits before the
transport is bounded in bytes by the sender's ``Outbox``.

Peers: a node connects to every member the store lists (``learn``) and greets it (HELLO, with
its endpoints, on both channels); a node greeted by one it did not know connects back. A peer is
*up* (``NodeLink.peer_up``) once both of this node's HELLOs to it went through; frames sent
while it connects wait, in order. It is *down* (``peer_down``) when a send to it finds no pipe,
when it says goodbye, or when it does not come up within ``connect_timeout``; its pending calls
then fail with ``Unavailable`` at once (the router's part). Pings on both channels every
``ping_interval`` find a dead peer that nothing else was sent to. Whether a node is a member is
the store's word, never a connection's (issue "Node leases"): a HELLO naming a newer
incarnation than the store listed is not believed until it does. DATA and COMPLETION between
two incarnations are a session that outlives a connection (``_Outgoing``, python-api §9):
numbered, kept until acknowledged, sent again when the peer is met again. A peer met again at
endpoints this
node has just disconnected from (it took the peer down) is connected to, and greeted, once the
old connection's pipe is gone (``_settle``): that pipe still bears the peer's routing id, and
would take the HELLOs into a connection that is ending.

Bad input never stops the thread: a frame with the wrong shape, version or kind, a HELLO that
does not parse or names another mesh, a member (HELLO or store record) at endpoints ZeroMQ will
not connect to, a frame over ``max_frame_bytes`` are dropped and counted (``bad_frames``,
``peers_refused``, ``oversized_frames``); the thread survives any exception of its own loop and
counts it (``transport_errors``).

Lock order: ``_lock`` is a leaf: under it only the infrastructure ``submit`` (a non-blocking
append) and the wake-up are called, never a socket operation of the thread or a callback. The
sessions are the transport thread's alone (other threads only count them:
``unacknowledged``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import secrets
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Protocol

import zmq

from ..addresses import advertised, check_advertise, check_listen
from ..durations import poll_ms
from ..errors import InvalidArgument, ResourceExhausted, Unavailable
from .keys import MeshKeys
from .location import check_counter
from .transport import (
    Channel,
    NodeLink,
    data_resumed,
    data_room,
    keep_latest,
    remember_goodbye,
)

_log = logging.getLogger("zlink.mesh.zmq")

VERSION = 3  # 2: a CREDIT names the bytes it returns too; 3: DATA and COMPLETION are numbered
# version, kind, the receiver's incarnation (0: any), the number of a DATA or COMPLETION
# frame's first body (its others follow it: n + 1, ...; 0 on the other kinds)
# ..., and the sender's session id (``_Outgoing.sid``; 0 on frames that are not numbered)
_HEADER = struct.Struct("!BBQQQ")
# DATA frames, and their bytes, taken; the last DATA and COMPLETION numbers received; the
# session (of the node the CREDIT goes to) all that is about
_CREDIT = struct.Struct("!QQQQQ")
_SESSION_LINGER = 30.0  # seconds a peer's session outlives its connection (see _Outgoing)
_RECV_BATCH = 256  # frames read from one socket before the others get a turn
_REFUSED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
# this node's own handshakes that a peer refused: the mechanism (CURVE on one side only) or
# the keys. Not NO_DETAIL: a connection that drops mid-handshake (a peer killed) says that.
_FAILED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_SAY_AGAIN = 60.0  # seconds before a failing handshake with one endpoint is logged again
_BATCH_BODIES = 256  # frames of one kind to one peer sent as one ZeroMQ message at most
_STRANGER_FRAMES = 64  # frames kept from an unknown sender until its HELLO arrives
# bytes held for one client whose pipe is full (ZeroMQ's 1,000-frame high-water mark) before
# they are given up on (counted); the client protocol's own limits (calls in flight, the send
# window) bound them first, and a client that stopped reading is dropped by its heartbeats
_CLIENT_HELD_BYTES = 256 * 1024 * 1024
_CLIENT_RETRY_MS = 2  # the poll's longest wait while frames are held for a client


class IoHost(Protocol):
    """A thread that runs the transport's turns between tasks of its own (the node's
    infrastructure executor: ``zlink.executor.InfraExecutor.host``)."""

    def host(self, io: Any) -> None: ...

    def finish_here(self, io: Any) -> bool: ...

    @property
    def alive(self) -> bool: ...


class _Kind(IntEnum):
    """What a frame between nodes carries (its header's second byte)."""

    HELLO = 1
    DATA = 2
    COMPLETION = 3
    CREDIT = 4
    PING = 5
    BYE = 6


class _State(Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


class ClientLink(Protocol):
    """What the node's client server gives the transport (python-api §10 ClientServer)."""

    def client_frame(self, client: bytes, data: bytes) -> None:
        """A frame from the client ``client`` (on the infrastructure thread)."""
        ...

    def peers_changed(self) -> None:
        """The peers that are up changed (on the infrastructure thread): clients hear."""
        ...


@dataclass(frozen=True)
class MeshEndpoint:
    """Where a node is reached: its client address and its two in sockets. Kept in the
    Location Store's node registry as one string (``encode`` / ``parse``)."""

    client: str
    data: str
    completion: str
    token: str  # new at every start of a transport: names its in sockets (see ``identity``)

    def encode(self) -> str:
        return f"{self.client} data={self.data} completion={self.completion} token={self.token}"

    @staticmethod
    def parse(text: str) -> MeshEndpoint:
        """The endpoint a node registered; ``InvalidArgument`` if it is not one."""
        parts = text.split()
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if not parts or not {"data", "completion", "token"} <= fields.keys():
            raise InvalidArgument(f"not a mesh endpoint: {text!r}")
        return MeshEndpoint(parts[0], fields["data"], fields["completion"], fields["token"])


def identity(node_id: str, instance: str) -> bytes:
    """A routing id: ``node_id`` and which instance of it (``#<incarnation>`` for what it
    sends, ``@<token>`` for the in sockets it is reached at); readable when short, else a
    digest (ZeroMQ routing ids are 1..255 bytes and may not start with a zero byte).

    Why two: an in socket announces its routing id at ``bind``, before the store has given
    the node its incarnation (the store needs the bound endpoint first), so it announces a
    token new at every start instead, registered with the endpoint; a restarted node thus
    never answers to its predecessor's name, which is what ``IMMEDIATE`` relies on."""
    raw = f"z:{node_id}{instance}".encode()
    if len(raw) <= 255:
        return raw
    digest = hashlib.blake2b(node_id.encode(), digest_size=20).hexdigest()
    return f"z:{digest}{instance}".encode()


@dataclass(eq=False)
class _Outgoing:
    """The DATA this node sent to one incarnation of a peer and that peer has not acknowledged
    yet (python-api §9: never lost without a trace). It outlives a connection: one that drops
    (a ZMTP heartbeat timeout: the peer froze, or the network went) loses what its pipe and
    kernel buffers held, and the peer, alive, is met again; then all of it is sent again,
    first, in order (``_up``), and the peer drops what it had already (by number). It ends,
    its bodies counted as dropped, when a newer incarnation of the peer is met, when the peer
    said goodbye, when this node registers again, when the store declares that incarnation
    down (``declared_down``), or ``_SESSION_LINGER`` after the peer went down without being
    met again. Bounded by the credit window: every CREDIT acknowledges.
    COMPLETION (replies, route hints, returning fences, drop notices, a move's answers) is
    kept the same way, in a stream of its own (it is never paused, so only the
    acknowledgements bound it: one per ping at least). (Transport thread only.)"""

    data: _Stream = field(default_factory=lambda: _Stream())
    completion: _Stream = field(default_factory=lambda: _Stream())  # and credit-bearing CREDITs
    down_since: float | None = None  # monotonic, while no connection to the peer is up
    # names this session on every numbered frame: a receiver that sees another one knows the
    # sender started over (it ended the last one) and numbers from 1 again with it
    sid: int = field(default_factory=lambda: secrets.randbits(63) + 1)
    # DATA handed over and not yet credited back, and their bytes, and whether a send was
    # refused (``writable`` owed): the session's, so a record going down and one met again
    # share them, and a body sent again is not counted twice (under ``_lock``)
    in_flight: int = 0
    in_flight_bytes: int = 0
    blocked: bool = False
    # the last DATA number handed to a pipe: those above were kept while the peer was down
    # or connecting, and never left (a session that ends counts them as not arrived)
    sent_through: int = 0

    def stream(self, kind: _Kind) -> _Stream:
        return self.data if kind is _Kind.DATA else self.completion

    def kept(self) -> int:
        """Messages of both streams not acknowledged yet (the CREDITs kept aside). Any
        thread: it only reads lengths and a count (a transport audit found a walk of the
        deques, which the transport thread changes, raise on a stopping node's thread)."""
        return self.data.messages + self.completion.messages


def _compact(body: bytes) -> bytes:
    """A small ``body`` in a buffer of its own size, to be kept while its peer is down (that
    may be long): orjson's output keeps the 4,096-byte buffer it was written in (``Outbox``
    compacts what it holds for the same reason). Not for the bodies of a peer that is up:
    the credit window bounds them (4 MiB per peer at most, small frames), and a copy of each
    is work on the one-way path. A large one is kept as it is (its buffer is its size)."""
    return memoryview(body).tobytes() if len(body) < 2048 else body


@dataclass(eq=False)
class _Stream:
    """One channel's numbered bodies to one incarnation of a peer, kept until acknowledged."""

    next_seq: int = 1
    unacked: deque[tuple[int, bytes, _Kind]] = field(default_factory=deque)
    # how many of ``unacked`` are not CREDITs: the transport thread keeps it, any thread
    # reads it (``_Outgoing.kept``) as one value (a length less a count of CREDITs, read at
    # two moments, could read 0 for one kept)
    messages: int = 0

    def keep(self, seq: int, bodies: Iterable[bytes], kind: _Kind) -> None:
        n = len(self.unacked)
        self.unacked.extend((seq + i, body, kind) for i, body in enumerate(bodies))
        if kind is not _Kind.CREDIT:
            self.messages += len(self.unacked) - n

    def acknowledged(self, through: int) -> None:
        unacked = self.unacked
        while unacked and unacked[0][0] <= through:
            if unacked.popleft()[2] is not _Kind.CREDIT:
                self.messages -= 1

    def clear(self) -> None:
        self.unacked.clear()
        self.messages = 0


@dataclass(eq=False)
class _Incoming:
    """What this node received of one incarnation of a peer's DATA: the number of the last
    body taken (a copy sent again at or below it is dropped), and the DATA held while this
    node paused that peer when its connection dropped (delivered first when it is met again).
    (Transport thread only.)"""

    taken: int = 0
    acked: int = 0  # the last ``taken`` a CREDIT told the peer
    c_taken: int = 0  # the same for its COMPLETION (and the CREDITs that carry credit)
    c_acked: int = 0
    sid: int = 0  # the sender's session these numbers are of
    # DATA taken here and not yet credited back, and their bytes (under ``_lock``): owed to
    # the incarnation, whichever record of it is up when the credit can go
    credit_due: int = 0
    credit_due_bytes: int = 0
    held: deque[bytes] = field(default_factory=deque)
    down_since: float | None = None


@dataclass(eq=False)
class _Peer:
    """One incarnation of another node, as this node's transport sees it."""

    node_id: str
    incarnation: int
    ident: bytes  # its in sockets' routing id: where this node sends to it
    sender: bytes  # its out sockets' routing id: how what it sends is recognized
    endpoint: MeshEndpoint
    since: float  # monotonic: when connecting began
    state: _State = _State.CONNECTING
    greeted: set[Channel] = field(default_factory=set)  # our HELLOs that went through
    waiting: deque[tuple[_Kind, bytes]] = field(default_factory=deque)  # sent while connecting
    paused: bool = False  # this node takes no DATA from it now
    held: deque[bytes] = field(default_factory=deque)  # its DATA that arrived while paused
    left: bool = False  # it said goodbye (what it sends after is not a reason to meet again)
    byes: set[Channel] = field(default_factory=set)  # the pipes its goodbye came on
    leaving: float | None = None  # monotonic: a send found no pipe after one goodbye came
    out: _Outgoing = field(default_factory=_Outgoing)  # its incarnation's, across connections
    max_frame: int = 0  # the largest frame it takes, as its HELLO said (0: not said yet)
    inc: _Incoming = field(default_factory=_Incoming)  # the same, for what it sends here

    @property
    def in_flight(self) -> int:
        """DATA sent to it and not yet credited back (its session's)."""
        return self.out.in_flight


class ZmqTransport:
    """One node's transport over ZeroMQ (see the module docstring)."""

    def __init__(
        self,
        listen: str,
        *,
        mesh: str = "main",
        data_limit: int = 1024,
        data_bytes: int = 16 * 1024 * 1024,
        max_frame_bytes: int = 64 * 1024 * 1024,
        ping_interval: float = 0.2,
        connect_timeout: float = 5.0,
        client_backlog: int = 1024,
        count: Callable[..., None] | None = None,
        keys: MeshKeys | None = None,
        advertise: str | None = None,
    ) -> None:
        if data_limit < 1 or data_bytes < 1:
            raise InvalidArgument("data_limit and data_bytes are at least 1")
        self._listen = check_listen(listen)
        self._advertise = None if advertise is None else check_advertise(advertise)
        self._mesh = mesh
        self._limit = data_limit
        self._credit_step = max(1, data_limit // 4)
        self._bytes_limit = data_bytes
        self._credit_step_bytes = max(1, data_bytes // 4)
        self._max_frame = max_frame_bytes
        self._ping_interval = ping_interval
        # how long a peer whose goodbye came on one pipe, and which a send then found gone,
        # has for its other pipe's goodbye (what it sent there is in flight: the ZMTP
        # heartbeat timeout, five pings, is how long a live connection may stay silent)
        self._leave_grace = 5 * ping_interval
        self._connect_timeout = connect_timeout
        self._client_backlog_limit = client_backlog
        self._count: Callable[..., None] = count or (lambda name, n=1: None)
        self._keys = keys
        self._ctx = zmq.Context()
        self._auth: Any = None  # the ZAP handler (a thread of pyzmq's) when keys are given
        self._monitors: list[zmq.Socket[Any]] = []  # handshake failures on bound sockets
        # ... and on the out sockets, made with them: this node's own handshakes that fail
        self._out_monitors: list[zmq.Socket[Any]] = []
        self._failed_said: dict[str, float] = {}  # endpoint -> when its failure was logged
        self._token = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._node_id = ""
        self._incarnation = 0
        self._ident = b""
        self._link: NodeLink | None = None
        self._client_link: ClientLink | None = None
        self._submit: Callable[..., None] = lambda fn, *args: None
        self._peers: dict[str, _Peer] = {}  # node id -> its current incarnation (under _lock)
        self._goodbyes: dict[tuple[str, int], None] = {}  # (peer, incarnation) that left (_lock)
        self._met: dict[str, int] = {}  # each peer's latest incarnation met (_lock; bounded)
        self._by_ident: dict[bytes, _Peer] = {}  # routing id -> peer (transport thread)
        self._listed: dict[str, int] = {}  # node id -> its newest incarnation the store listed
        self._other_versions: set[bytes] = set()  # senders told of (logged) as another version
        # (node id, incarnation) -> the sessions with it, which outlive a connection
        # (``_Outgoing``, ``_Incoming``; transport thread)
        self._outgoing: dict[tuple[str, int], _Outgoing] = {}
        self._incoming: dict[tuple[str, int], _Incoming] = {}
        # frames from senders not greeted yet (their HELLO may come on the other pipe): kept
        # until it does, or dropped and counted after ``connect_timeout`` (``_sweep``)
        self._strangers: dict[bytes, tuple[float, list[tuple[bytes, list[bytes], Channel]]]] = {}
        # senders whose HELLO named an incarnation the store has not listed yet: what they send
        # is kept up to a DATA window (their credit bounds it), not ``_STRANGER_FRAMES``
        self._unlisted: set[bytes] = set()
        self._outq: deque[tuple[_Peer | bytes, _Kind, bytes]] = deque()  # under _lock
        self._credits: list[_Peer] = []  # peers owed credit (under _lock)
        self._learned: list[list[tuple[str, int, str]]] = []  # member lists (under _lock)
        # declared down, to end on the transport thread: (node id, incarnation, its record)
        self._declared: list[tuple[str, int | None, _Peer | None]] = []  # (under _lock)
        self._dead: dict[str, int] = {}  # node id -> its newest incarnation declared down
        self._client_backlog = 0  # client frames handed on and not yet taken (under _lock)
        # frames for clients whose pipe was full, in order, and their bytes (transport thread)
        self._client_held: dict[bytes, deque[bytes]] = {}
        self._client_held_bytes: dict[bytes, int] = {}
        self._signalled = False
        # a new incarnation to announce, the members to meet, what to run then (under _lock)
        self._reborn: tuple[int, list[tuple[str, int, str]], Callable[[], None]] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None  # its own thread, when it has no host
        self._host: IoHost | None = None  # the infrastructure executor whose thread turns it
        self._owner = 0  # the ident of the thread that turns it (the only one on its sockets)
        self._finished = threading.Event()  # its last turn is over (detached)
        self._abandoned = False  # detach gave up waiting: the last turn closes (under _lock)
        self._detach_wait = 5.0  # seconds detach waits for the host's last turn
        self._endpoint: MeshEndpoint | None = None
        self._connected: dict[Channel, dict[str, int]] = {Channel.DATA: {}, Channel.COMPLETION: {}}
        # endpoints disconnected whose pipe may still be there, with the routing id it bears:
        # not connected to again until it is gone (``_settle``; transport thread)
        self._lingering: dict[tuple[Channel, str], bytes] = {}
        self._wake_lock = threading.Lock()  # guards the wake-up socket's sending side (leaf)
        self.sent = 0

    # -- start and stop -----------------------------------------------------------------------
    def endpoint(self, node_id: str) -> str:
        """Bind the client and both in sockets; the endpoint the node registers in the store."""
        if self._endpoint is None:
            ctx = self._ctx
            if self._keys is not None:
                self._start_auth(self._keys)
            self._client = self._socket(zmq.ROUTER, serve=True)
            self._client.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._client.bind(self._bind_any(self._listen))
            client = self._client.getsockopt_string(zmq.LAST_ENDPOINT)
            host = client.rsplit(":", 1)[0]
            self._ins: dict[Channel, zmq.Socket[Any]] = {}
            bound = {}
            for channel in Channel:
                sock = self._socket(zmq.ROUTER, serve=True)
                sock.setsockopt(zmq.ROUTING_ID, identity(node_id, "@" + self._token))
                # a peer that connects again under the id of a connection this side has not
                # seen end yet (it was stopped, SIGSTOP, while the peer gave up on it): the new
                # connection takes the id over; refused, all it sends would vanish unseen
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
                sock.bind(f"{host}:*")
                bound[channel] = sock.getsockopt_string(zmq.LAST_ENDPOINT)
                self._ins[channel] = sock
            self._wake_r = ctx.socket(zmq.PAIR)
            self._wake_w = ctx.socket(zmq.PAIR)
            name = f"inproc://zlink-wake-{id(self)}"
            self._wake_r.bind(name)
            self._wake_w.connect(name)
            reached = self._reached
            self._endpoint = MeshEndpoint(
                reached(client), reached(bound[Channel.DATA]),
                reached(bound[Channel.COMPLETION]), self._token,
            )  # fmt: skip
        return self._endpoint.encode()

    def _reached(self, bound: str) -> str:
        """Where others reach what is bound at ``bound``: the advertised host, if any."""
        return bound if self._advertise is None else advertised(bound, self._advertise)

    @staticmethod
    def _bind_any(listen: str) -> str:
        host, _, port = listen.rpartition(":")
        return f"{host}:*" if port in ("0", "*") else listen

    def _socket(self, kind: int, serve: bool = False) -> zmq.Socket[Any]:
        """A socket with this transport's options; ``serve``: it will be bound (with keys:
        a CURVE server whose handshake failures are watched and counted)."""
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_frame * 2)  # past it: the connection drops
        keys = self._keys
        if keys is not None:
            if serve:
                sock.setsockopt(zmq.CURVE_SERVER, 1)
            else:  # a connecting side: every node serves with the mesh's key pair
                sock.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
            if serve:
                self._monitors.append(sock.get_monitor_socket(_REFUSED_EVENTS))
        return sock

    def _start_auth(self, keys: MeshKeys) -> None:
        """Start pyzmq's ZAP handler: a CURVE handshake presenting a key the mesh does not
        know is refused (and counted from the socket monitors, ``handshakes_refused``)."""
        from zmq.auth.thread import ThreadAuthenticator

        class _Allowed:
            def callback(self, domain: str, key: bytes) -> bool:
                return key in keys.allowed

        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("zlink.mesh.auth"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_Allowed())

    def _read_monitor(self, sock: zmq.Socket[Any]) -> None:
        for _ in range(_RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2 and len(frames[0]) >= 2:
                self._count("handshakes_refused")
                _log.warning("node %s refused a connection: it failed the CURVE handshake",
                             self._node_id)  # fmt: skip

    def _read_out_monitor(self, sock: zmq.Socket[Any]) -> None:
        """This node's handshake with a peer failed (counted, ``handshakes_failed``, and
        logged, at most once a minute per endpoint): most often a mesh with CURVE keys that
        this node has not (``--keys``), or the other way round. What is sent to that peer is
        kept for it, and counted when this node stops (``data_unacknowledged_at_stop``)."""
        for _ in range(_RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2 or len(frames[0]) < 2:
                continue
            self._count("handshakes_failed")
            endpoint = frames[1].decode(errors="replace")
            now = time.monotonic()
            if now - self._failed_said.get(endpoint, -math.inf) < _SAY_AGAIN:
                continue
            self._failed_said[endpoint] = now
            _log.error(
                "node %s: the handshake with the peer at %s failed; nothing reaches it. Does "
                "one side have the mesh's CURVE keys (--keys) and the other not, or another "
                "pair?", self._node_id, endpoint,
            )  # fmt: skip

    @property
    def address(self) -> str:
        """The client address (``listen`` with its port resolved)."""
        if self._endpoint is None:
            raise Unavailable("the transport is not bound yet")
        return self._endpoint.client

    def attach(
        self, node_id: str, link: NodeLink, submit: Callable[..., None], incarnation: int = 0,
        host: IoHost | None = None,
    ) -> None:  # fmt: skip
        """Announce ``node_id`` at ``incarnation``, and start the transport thread: with
        ``host`` (the node's infrastructure executor, whose ``submit`` this is), that thread
        is the host's own, which then polls the sockets between its tasks (``turn``); else a
        thread of the transport's."""
        self.endpoint(node_id)
        self._node_id, self._incarnation = node_id, incarnation
        self._ident = identity(node_id, f"#{incarnation}")
        self._link, self._submit = link, submit
        self._outs = self._make_outs()
        self._poller = self._make_poller()
        if host is not None:
            self._host = host
            host.host(self)
            return
        self._thread = threading.Thread(
            target=self._run, name=f"zlink-transport-{node_id}", daemon=True
        )
        self._thread.start()

    def _make_outs(self) -> dict[Channel, zmq.Socket[Any]]:
        """The out sockets, announcing this node at its incarnation (``_ident``)."""
        outs: dict[Channel, zmq.Socket[Any]] = {}
        for channel in self._ins:
            out = self._socket(zmq.ROUTER)
            out.setsockopt(zmq.ROUTING_ID, self._ident)
            out.setsockopt(zmq.ROUTER_MANDATORY, 1)
            # a peer met again at the same endpoint (its in sockets keep their routing id
            # when it registers again): the new pipe takes the id over from the old one,
            # which ZeroMQ may not have torn down yet (else the new one is refused for good)
            out.setsockopt(zmq.ROUTER_HANDOVER, 1)
            out.setsockopt(zmq.IMMEDIATE, 1)
            out.setsockopt(zmq.SNDHWM, 0)  # DATA is bounded by credit, the rest is small
            ivl = max(1, int(self._ping_interval * 1000))
            out.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            out.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl * 5)
            outs[channel] = out
        self._out_monitors = [out.get_monitor_socket(_FAILED_EVENTS) for out in outs.values()]
        return outs

    def reincarnate(
        self, node_id: str, incarnation: int, members: list[tuple[str, int, str]],
        then: Callable[[], None],
    ) -> None:  # fmt: skip
        """This node registered again as ``incarnation`` (it fenced itself): the transport
        thread takes every peer down, makes new out sockets that announce the new
        incarnation, meets ``members`` again (reachable from then: what is sent waits for
        the connection), then has ``then`` run on the infrastructure thread; frames for the
        old incarnation are dropped and counted (``frames_wrong_incarnation``)."""
        with self._lock:
            self._reborn = (incarnation, members, then)
        self._wake()

    def _rebirth(self, poller: zmq.Poller) -> None:
        """(Transport thread.) See ``reincarnate``."""
        with self._lock:
            reborn, self._reborn = self._reborn, None
        if reborn is None:
            return
        incarnation, members, then = reborn
        for peer in list(self._peers.values()):
            self._down(peer, f"this node registered again as incarnation {incarnation}")
        for node_id in {key[0] for key in [*self._outgoing, *self._incoming]}:
            self._end_sessions(node_id, 2**63)  # what the old incarnation sent or held
        for sock in self._outs.values():
            poller.unregister(sock)
            sock.close(linger=0)
        for monitor in self._out_monitors:
            poller.unregister(monitor)
            monitor.close(linger=0)
        self._connected = {Channel.DATA: {}, Channel.COMPLETION: {}}
        self._lingering = {}
        self._by_ident.clear()
        self._strangers.clear()
        self._unlisted.clear()
        self._incarnation = incarnation
        self._ident = identity(self._node_id, f"#{incarnation}")
        self._outs = self._make_outs()
        for sock in [*self._outs.values(), *self._out_monitors]:
            poller.register(sock, zmq.POLLIN)
        with self._lock:
            self._learned.append(members)
        self._take_learned()
        self._submit(then)

    def serve_clients(self, link: ClientLink) -> None:
        """Hand frames from clients to ``link`` (the node's client server)."""
        self._client_link = link

    def said_goodbye(self, peer: str, incarnation: int | None) -> bool:
        """Whether ``peer`` at ``incarnation`` said goodbye (``Transport``'s optional part;
        ``None``: the latest incarnation of it this transport met)."""
        with self._lock:
            if incarnation is None:
                incarnation = self._met.get(peer)
            return (peer, incarnation) in self._goodbyes

    def detach(self, node_id: str) -> None:
        """Say goodbye to every peer, then stop the thread and close the sockets.

        Other threads may still hand work over meanwhile: the wake-up socket they send on is
        closed under ``_wake_lock`` (never under a sender: ZeroMQ sockets are not
        thread-safe); a wake-up after that finds it closed and is a no-op. Hosted, the host's
        last turn says goodbye (here, on the host's thread or once it is gone); a host busy past
        ``_detach_wait`` closes the sockets itself after that turn. A second call is a no-op."""
        with self._lock:
            if self._stopping:  # detached already (a second call is a no-op)
                return
            for peer in self._peers.values():
                if peer.state is _State.UP:
                    self._outq.append((peer, _Kind.BYE, b""))
                    if peer not in self._credits:  # what it sent is acknowledged first
                        self._credits.append(peer)
            self._stopping = True
        host = self._host
        if host is None and self._thread is None:  # never attached (a start that failed
            self._close()  # before it): no thread turns the sockets; only they are left
            return
        if host is None:
            self._wake()
            if self._thread is not None:
                self._thread.join(5.0)
        elif host.finish_here(self):
            pass  # no other thread turns it now: its last turn was this one's
        else:
            self._wake()
            finished = self._finished.wait(self._detach_wait)
            with self._lock:
                if not finished and not self._finished.is_set():
                    # the host is still busy (a long task): its last turn closes the sockets,
                    # on its own thread, since no other thread may touch them while it turns
                    self._abandoned = True
                    _log.warning("node %s: the transport's last turn is late; it closes the "
                                 "sockets itself", self._node_id)  # fmt: skip
                    return
        self._close()

    def _close(self) -> None:
        """Close the sockets (once no thread turns them any more)."""
        if self._auth is not None:
            self._auth.stop()
        if self._endpoint is not None:
            with self._wake_lock:
                self._wake_w.close(linger=0)
        self._ctx.destroy(linger=200)  # the goodbyes get out

    # -- what other threads call --------------------------------------------------------------
    def learn(self, members: list[tuple[str, int, str]]) -> None:
        """The store's members (node id, incarnation, endpoint): connect to the new ones."""
        with self._lock:
            self._learned.append(members)
        self._wake()

    def declared_down(self, node_id: str, incarnation: int | None) -> None:
        """The store declared ``node_id`` at ``incarnation`` (``None``: whichever this node
        knew) down (any thread). From now on nothing more is taken for it (``reachable`` is
        ``False``: a record of it still connecting, or still connected, a frozen process, is
        down, quietly: the node knows already), its session ends on the transport thread
        rather than ``_SESSION_LINGER`` after its connection went, what it kept counted
        (``_end_sessions``: handed to a pipe and never acknowledged, it may have arrived;
        kept while the peer was down, it never left), and that incarnation is not connected
        to again (a member list read a moment before the lease lapsed still names it)."""
        with self._lock:
            live = self._peers.get(node_id)
            if incarnation is None:
                incarnation = live.incarnation if live is not None else None
            if live is not None and (incarnation is None or live.incarnation > incarnation):
                live = None  # a newer incarnation, met already: it stays
            if live is not None:
                live.state = _State.DOWN  # (``_down`` then does nothing: it is done here)
            self._declared.append((node_id, incarnation, live))
        self._wake()

    def _take_declared(self) -> None:
        """(Transport thread.) End what ``declared_down`` named."""
        with self._lock:
            declared, self._declared = self._declared, []
        for node_id, incarnation, live in declared:
            if incarnation is None:  # it knew none: every session of that id not live
                incarnation = max((k[1] for k in self._outgoing if k[0] == node_id), default=0)
            if self._dead.get(node_id, 0) < incarnation:
                self._dead[node_id] = incarnation
            if live is not None:
                with self._lock:
                    unsent = list(live.waiting)  # handed over while it was connecting
                    live.waiting.clear()
                    unsent += [(k, d) for t, k, d in self._outq if t is live]
                    self._outq = deque(item for item in self._outq if item[0] is not live)
                    if self._peers.get(node_id) is live:
                        del self._peers[node_id]
                self._dropped(node_id, unsent)
                lost = self._held_to_session(live, list(live.held))  # counted with it below
                live.held.clear()
                if lost:
                    self._count("frames_dropped_peer_down", lost)
                self._release(live)
                self.resume(self._node_id, node_id)  # (``_gone``'s reason: a later one's)
            self._end_sessions(node_id, incarnation + 1)

    def unacknowledged(self) -> int:
        """DATA and COMPLETION sent to peers that are up and not yet acknowledged by them, or
        waiting for a peer still connecting (any thread)."""
        n = 0
        for peer in list(self._peers.values()):
            if peer.state is _State.UP:
                n += peer.out.kept()
            elif peer.state is _State.CONNECTING:
                n += len(peer.waiting)
        return n

    def reachable(self, peer: str) -> bool:
        found = self._peers.get(peer)
        return found is not None and found.state is not _State.DOWN

    def peers(self, connecting: bool = False) -> list[str]:
        """The peers that are up (``connecting``: also those met and still connecting)."""
        states = (_State.UP, _State.CONNECTING) if connecting else (_State.UP,)
        with self._lock:
            return sorted(p.node_id for p in self._peers.values() if p.state in states)

    def client_endpoints(self) -> list[str]:
        """The client endpoints of the peers that are up (``WELCOME`` tells clients)."""
        with self._lock:
            up = sorted((p.node_id, p.endpoint.client) for p in self._peers.values()
                        if p.state is _State.UP)  # fmt: skip
        return [client for _node, client in up]

    def send(self, sender: str, peer: str, channel: Channel, data: bytes) -> bool:
        """Hand ``data`` to the transport thread (see the ``Transport`` protocol)."""
        with self._lock:
            target = self._peers.get(peer)
            if target is None or target.state is _State.DOWN or self._stopping:
                raise Unavailable(f"node {peer!r} is not reachable")
            if len(data) > self._max_frame:
                raise ResourceExhausted(
                    f"an envelope of {len(data)} bytes is over max_frame_bytes ({self._max_frame})"
                )
            if target.max_frame and len(data) > target.max_frame:  # it would drop it unread
                raise InvalidArgument(
                    f"a frame of {len(data):,} bytes is more than node {peer!r} takes "
                    f"({target.max_frame:,}: its max_frame_bytes)"
                )
            if channel is Channel.DATA:
                out = target.out
                if not data_room(out.in_flight, out.in_flight_bytes, len(data), self._limit,
                             self._bytes_limit):  # fmt: skip
                    out.blocked = True
                    return False
                out.in_flight += 1
                out.in_flight_bytes += len(data)
                kind = _Kind.DATA
            else:
                kind = _Kind.COMPLETION
            self.sent += 1
            if target.state is _State.CONNECTING:
                target.waiting.append((kind, data))
                return True
            self._outq.append((target, kind, data))
            if self._owner == threading.get_ident():
                return True  # the thread itself: its turn flushes this before it waits
            wake = not self._signalled
            self._signalled = True
        if wake:
            self._wake_now()
        return True

    def frame_limit(self, peer: str) -> int | None:
        """The largest frame ``peer`` takes, as its greeting said; ``None`` until it did (any
        thread)."""
        found = self._peers.get(peer)
        return found.max_frame or None if found is not None else None

    def send_client(self, client: bytes, data: bytes) -> None:
        """Send ``data`` to a connected client (any thread; never blocks)."""
        with self._lock:
            self._outq.append((client, _Kind.DATA, data))
            if self._owner == threading.get_ident():
                return  # the thread itself: its turn flushes this before it waits
            wake = not self._signalled
            self._signalled = True
        if wake:
            self._wake_now()

    def client_taken(self) -> None:
        """(The client server, infrastructure thread.) One client frame was handled."""
        with self._lock:
            self._client_backlog -= 1
            wake = self._client_backlog == self._client_backlog_limit // 2
        if wake:
            self._wake()

    def pause(self, node_id: str, peer: str) -> None:
        with self._lock:
            found = self._peers.get(peer)
            if found is not None:
                found.paused = True

    def resume(self, node_id: str, peer: str) -> None:
        with self._lock:  # what waited goes first, before anything that arrives after
            found = self._peers.get(peer)
            if found is None or not found.paused:
                return
            found.paused = False
            if found.held:
                self._submit(self._deliver, found, list(found.held))
                found.held.clear()

    def paused(self, node_id: str, peer: str) -> bool:
        found = self._peers.get(peer)
        return found is not None and found.paused

    def _hand_on(self, peer: _Peer, channel: Channel, bodies: list[bytes]) -> None:
        """(Infrastructure thread.) Hand frames of one channel to the node, in order; one
        that fails is counted, and the frames after it are still handed on."""
        link = self._link
        assert link is not None
        for body in bodies:
            try:
                link.received(peer.node_id, channel, body)
            except Exception:  # noqa: BLE001 - the frames after it are still handed on
                self._count("receive_errors")
                _log.exception("node %s: a %s frame failed", self._node_id, channel.value)

    def _complete(self, peer: _Peer, bodies: list[bytes]) -> None:
        """(Infrastructure thread.) Hand COMPLETION frames to the node, in order."""
        self._hand_on(peer, Channel.COMPLETION, bodies)

    def _deliver(self, peer: _Peer, bodies: list[bytes]) -> None:
        """(Infrastructure thread.) Hand DATA frames to the node, in order; then they are
        credited back."""
        self._hand_on(peer, Channel.DATA, bodies)
        self._credit(peer, len(bodies), sum(map(len, bodies)))

    def _credit(self, peer: _Peer, n: int, size: int) -> None:
        """``n`` DATA frames of ``peer``, ``size`` bytes, were taken: credit them back (in
        steps of a quarter of either limit)."""
        with self._lock:
            inc = peer.inc
            inc.credit_due += n
            inc.credit_due_bytes += size
            owe = (
                inc.credit_due >= self._credit_step
                or inc.credit_due_bytes >= self._credit_step_bytes
            ) and peer not in self._credits
            if owe:
                self._credits.append(peer)
        if owe:
            self._wake()

    def _wake(self) -> None:
        if self._owner == threading.get_ident():
            return  # the thread itself: its turn sends what is due before it waits
        with self._lock:
            if self._signalled:
                return
            self._signalled = True
        self._wake_now()

    def _wake_now(self) -> None:
        with self._wake_lock, contextlib.suppress(zmq.ZMQError):  # closed at shutdown
            self._wake_w.send(b"", zmq.NOBLOCK)

    # -- the transport thread -----------------------------------------------------------------
    def _make_poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        for sock in self._ins.values():
            poller.register(sock, zmq.POLLIN)
        # Out sockets receive nothing, but are polled: polling is where a socket handles
        # ZeroMQ's commands, and a pipe ``_release`` disconnected (with ``IMMEDIATE``) is only
        # gone once they are handled. Until then it keeps the peer's routing id, and a new
        # connection to that peer (met again at the same endpoint) is refused for good.
        for sock in self._outs.values():
            poller.register(sock, zmq.POLLIN)
        poller.register(self._client, zmq.POLLIN)
        self._client_polled = True
        for monitor in [*self._monitors, *self._out_monitors]:
            poller.register(monitor, zmq.POLLIN)
        self._next_ping = time.monotonic() + self._ping_interval
        return poller

    def _flush_held_clients(self) -> None:
        if self._client_held:
            self._flush_clients()

    def _ping_when_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_ping:
            self._next_ping = now + self._ping_interval
            self._ping()
            self._sweep(now)

    def _run(self) -> None:
        """The transport's own thread (no host): turns until it is detached."""
        while self.turn(None):
            pass

    def wake(self) -> None:
        """(``InfraIO``, any thread.) Make the current or next ``turn`` return soon. Takes
        only the wake-up socket's leaf lock: the host calls it for a ``submit`` made under
        ``_lock``."""
        self._wake_now()

    def turn(self, timeout: float | None) -> bool:
        """(The transport thread: the host's, or its own.) Wait for the sockets up to
        ``timeout`` seconds (``None``: until woken, or until the transport's own next ping or
        HELLO), read what came, send what was handed over. ``False`` once detached: the
        goodbyes are out, and the thread turns it no more. Survives any exception of its own
        and counts it (``transport_errors``)."""
        self._owner = threading.get_ident()
        try:
            own = poll_ms(self._next_ping - time.monotonic())
            wait = min(own, self._greet_wait(time.monotonic()))
            if timeout is not None:
                wait = min(wait, poll_ms(timeout))
            if self._client_held:  # (a full pipe says nothing when it has room again)
                wait = min(wait, _CLIENT_RETRY_MS)
            poller = self._poller
            ready = dict(poller.poll(wait))
            if self._wake_r in ready:
                self._drain_wake()
            if self._reborn is not None:  # (asked for on the host's thread: no wake-up)
                self._rebirth(poller)
            for channel, sock in self._ins.items():
                if sock in ready:
                    self._read_peer(channel, sock)
            for sock in self._outs.values():
                if sock in ready:
                    self._read_stray(sock)
            if self._client in ready:
                self._read_clients()
            for monitor in self._monitors:
                if monitor in ready:
                    self._read_monitor(monitor)
            for monitor in self._out_monitors:
                if monitor in ready:
                    self._read_out_monitor(monitor)
            with self._lock:
                full = self._client_backlog >= self._client_backlog_limit
            if full and self._client_polled:
                poller.unregister(self._client)
                self._client_polled = False
            elif not full and not self._client_polled:
                poller.register(self._client, zmq.POLLIN)
                self._client_polled = True
        except Exception:  # noqa: BLE001 - the thread never dies of one frame
            self._count("transport_errors")
            _log.exception("transport of node %s: error in its loop", self._node_id)
        # each phase on its own: one that fails skips none of the others (a transport audit
        # found a greeting that failed every turn, so no turn flushed, pinged or swept again)
        for phase in (self._take_learned, self._take_declared, self._greet,
                      self._flush_held_clients, self._flush, self._ping_when_due):  # fmt: skip
            try:
                phase()
            except Exception:  # noqa: BLE001 - counted like any error of its loop
                self._count("transport_errors")
                _log.exception("transport of node %s: error in %s", self._node_id,
                               phase.__name__)  # fmt: skip
        if self._stopping:
            try:
                if self._client_held:
                    self._flush_clients()
                self._flush()
            except Exception:  # noqa: BLE001 - counted like any error of its loop
                self._count("transport_errors")
                _log.exception("transport of node %s: error in its last flush", self._node_id)
            for peer in [p for p in self._peers.values() if p.state is _State.CONNECTING]:
                self._down(peer, "this node stops")  # (what waited for it: kept, counted)
            held = sum(len(frames) for frames in self._client_held.values())
            if held:  # for clients that read nothing more before this node stopped
                self._count("client_frames_undeliverable", held)
                self._client_held.clear()
            left = sum(out.kept() for out in self._outgoing.values())
            if left:  # sent, and never acknowledged: they may or may not have arrived
                self._count("data_unacknowledged_at_stop", left)
                self._outgoing.clear()
            with self._lock:
                self._finished.set()
                close = self._abandoned
            if close:  # ``detach`` gave up waiting for this turn
                self._close()
            return False
        return True

    def _greet_wait(self, now: float) -> int:
        """Milliseconds until the HELLOs of peers still connecting are tried again: 2 ms in a
        connection's first 0.2 s (a live peer answers within it), then 50 ms (a member the
        store still lists after it died is not worth 500 wake-ups a second until its lease
        lapses)."""
        waits = [2 if now - p.since < 0.2 else 50
                 for p in self._peers.values() if p.state is _State.CONNECTING]  # fmt: skip
        return min(waits, default=3_600_000)

    def _drain_wake(self) -> None:
        # The flag is cleared only once the wake-ups are read: cleared first, a wake-up sent
        # just after could be read here too, leaving the flag set with no wake-up on its way,
        # and every later hand-over would wait for the poll's timeout (the next ping).
        while True:
            try:
                self._wake_r.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        with self._lock:
            self._signalled = False

    def _flush(self) -> None:
        """Send what other threads handed over, and the credit owed, in order.

        Credit owed to a peer still connecting (its DATA came in before this node's HELLOs to
        it went through) stays owed until it is up: dropped, the sender would wait for it
        forever."""
        with self._lock:
            out, self._outq = self._outq, deque()
            owed, self._credits = self._credits, []
            credits: dict[int, tuple[_Peer, int, int, int, int, int]] = {}
            for was in owed:  # (owed to the incarnation: a record met since takes it; one
                peer = self._current(was)  # down and not met again gets it at ``_up``)
                inc = peer.inc
                if peer.state is _State.UP and _owed(inc):
                    credits[id(peer)] = (peer, inc.credit_due, inc.credit_due_bytes, inc.taken,
                                         inc.c_taken, inc.sid)  # fmt: skip
                    inc.credit_due = inc.credit_due_bytes = 0
                    inc.acked, inc.c_acked = inc.taken, inc.c_taken
                elif peer.state is _State.CONNECTING and peer not in self._credits:
                    self._credits.append(peer)
        # DATA and COMPLETION are numbered first, all of them, in the order they were handed
        # over, before anything is sent: a send that finds no pipe takes its peer down, and
        # what another thread handed over meanwhile is kept then, after these. One for a
        # record that is down is kept in its session: the next meeting sends it first.
        items: list[tuple[_Peer | bytes, _Kind, bytes, int]] = []
        for target, kind, data in out:
            seq = 0
            if not isinstance(target, bytes) and (kind is _Kind.DATA or kind is _Kind.COMPLETION):
                seq = self._keep(target, (data,), kind)
                if not seq:  # its session has ended
                    self._dropped(target.node_id, [(kind, data)])
                    continue
            items.append((target, kind, data, seq))
        # DATA and COMPLETION for one peer leave as few messages as they fit in, each run in
        # the order it was handed over (the two channels are separate connections: there is
        # no order between them to keep)
        runs: dict[tuple[int, _Kind], list[bytes]] = {}
        firsts: dict[tuple[int, _Kind], int] = {}  # the number of each run's first body
        peers: dict[int, _Peer] = {}
        for target, kind, data, seq in items:
            if isinstance(target, bytes):
                self._to_client(target, data)
                continue
            if seq:
                if target.state is not _State.UP:
                    continue  # kept for the next meeting
                key = (id(target), kind)
                run = runs.setdefault(key, [])
                if not run:
                    firsts[key] = seq
                run.append(data)
                peers[id(target)] = target
                if len(run) >= _BATCH_BODIES:
                    self._send_run(target, kind, firsts[key], runs.pop(key))
            elif target.state is not _State.UP:
                if kind is not _Kind.BYE:
                    self._count("frames_dropped_peer_down")
            else:  # a goodbye: what was handed over before it leaves first, on each pipe
                for earlier in (_Kind.DATA, _Kind.COMPLETION):
                    key = (id(target), earlier)
                    pending = runs.pop(key, None)
                    if pending:
                        self._send_run(target, earlier, firsts[key], pending)
                owed_here = credits.pop(id(target), None)
                if owed_here is not None:  # what it sent is acknowledged before the goodbye
                    self._send_credit(*owed_here)
                if self._frame(target, kind, data, channel=Channel.DATA):
                    self._frame(target, kind, data)
        for (ref, kind), run in runs.items():
            self._send_run(peers[ref], kind, firsts[(ref, kind)], run)
        # credit last: one that carries credit is numbered in the COMPLETION stream, after the
        # replies numbered above (and so sent after them: a stream goes in its numbers' order)
        for owed_here in credits.values():
            self._send_credit(*owed_here)

    def _send_credit(
        self, peer: _Peer, n: int, size: int, taken: int, c_taken: int, sid: int
    ) -> None:
        """A CREDIT to ``peer`` (if up): ``n`` DATA frames of ``size`` bytes taken, the last
        numbers received, of its session ``sid``. One that carries credit is numbered, kept
        and sent again like a reply (credit is a difference: one lost would strand its sender
        at its window); a bare acknowledgement is not (a later one says as much). A peer
        found down earlier in the same flush owes it still, to its next meeting (``_up``):
        a transport audit found it dropped, and the sender's window shrunk for good."""
        if peer.state is not _State.UP:
            with self._lock:
                inc = peer.inc
                if inc.sid == sid and (n or size):  # (a session that ended: not owed)
                    inc.credit_due += n
                    inc.credit_due_bytes += size
            return
        body = _CREDIT.pack(n, size, taken, c_taken, sid)
        seq = self._keep(peer, (body,), _Kind.CREDIT) if n or size else 0
        if seq:
            self._send(peer, _Kind.CREDIT, seq, [body], Channel.COMPLETION)
        else:
            self._frame(peer, _Kind.CREDIT, body)

    def _send_run(self, peer: _Peer, kind: _Kind, seq: int, bodies: list[bytes]) -> None:
        """DATA or COMPLETION numbered already (``_keep``) from ``seq``, to ``peer`` if it is
        still up (else it stays kept for the next meeting)."""
        if peer.state is _State.UP:
            channel = Channel.DATA if kind is _Kind.DATA else Channel.COMPLETION
            self._send(peer, kind, seq, bodies, channel)

    def _frame(
        self, peer: _Peer, kind: _Kind, *bodies: bytes, channel: Channel | None = None
    ) -> bool:
        """Send ``bodies`` of a kind that is not numbered (a goodbye, a bare acknowledgement, a
        ping: DATA and COMPLETION go through ``_keep`` and ``_send_run``) to ``peer`` as one
        message, on COMPLETION unless ``channel`` says. ``False``: the peer is not up, or it
        has no pipe (then it is down); what was to go is counted as dropped (a ping aside)."""
        lost = 0 if kind is _Kind.PING else len(bodies)
        if peer.state is not _State.UP:
            if lost:
                self._count("frames_dropped_peer_down", lost)
            return False
        if self._send(peer, kind, 0, bodies, channel or Channel.COMPLETION):
            return True
        if lost:
            self._count("frames_dropped_peer_down", lost)
        return False

    def _send(
        self, peer: _Peer, kind: _Kind, seq: int, bodies: tuple[bytes, ...] | list[bytes],
        channel: Channel,
    ) -> bool:  # fmt: skip
        """One message to ``peer`` on ``channel``'s pipe; ``False`` (and the peer is down) if
        there is none."""
        header = _HEADER.pack(VERSION, kind, peer.incarnation, seq, peer.out.sid if seq else 0)
        try:
            self._outs[channel].send_multipart([peer.ident, header, *bodies], zmq.NOBLOCK)
            if kind is _Kind.DATA:
                peer.out.sent_through = max(peer.out.sent_through, seq + len(bodies) - 1)
            return True
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            self._down(peer, f"no connection ({exc.strerror})", lost_pipe=True)
            return False

    def _keep(
        self, peer: _Peer, bodies: tuple[bytes, ...] | list[bytes], kind: _Kind,
        compact: bool = False,
    ) -> int:  # fmt: skip
        """Number DATA or COMPLETION ``bodies`` for ``peer`` and keep them until acknowledged;
        the first one's number, or 0 if ``peer``'s session has ended (nothing is kept)."""
        out = peer.out
        if self._outgoing.get((peer.node_id, peer.incarnation)) is not out:
            return 0
        stream = out.stream(kind)
        seq = stream.next_seq
        stream.next_seq = seq + len(bodies)
        if compact:  # kept while the peer is down: it may be long
            bodies = [_compact(body) for body in bodies]
        stream.keep(seq, bodies, kind)
        return seq

    def _resend(self, peer: _Peer) -> None:
        """(``_up``.) Send again, first and in order, the DATA and COMPLETION ``peer`` has not
        acknowledged: its last connection may have lost it (a copy that did arrive is dropped
        there)."""
        for stream, channel in ((_Kind.DATA, Channel.DATA), (_Kind.COMPLETION, Channel.COMPLETION)):
            kept = list(peer.out.stream(stream).unacked)
            if not kept:
                continue
            self._count(f"{channel.value}_resent", len(kept))
            run: list[tuple[int, bytes, _Kind]] = []
            for item in [*kept, None]:  # runs of one kind (a CREDIT among replies), in order
                if run and (
                    item is None
                    or item[2] is not run[0][2]
                    or run[0][2] is _Kind.CREDIT  # (a CREDIT goes alone)
                    or len(run) >= _BATCH_BODIES
                ):
                    if not self._send(peer, run[0][2], run[0][0], [b for _s, b, _k in run],
                                      channel):  # fmt: skip
                        return  # down again: still kept
                    run = []
                if item is not None:
                    run.append(item)

    def _current(self, peer: _Peer) -> _Peer:
        """``peer``, or, if it went down, the record of the same incarnation met since."""
        if peer.state is _State.DOWN:
            found = self._peers.get(peer.node_id)
            if found is not None and found.incarnation == peer.incarnation:
                return found
        return peer

    def _dropped(
        self, peer: str, frames: list[tuple[_Kind, bytes]], maybe_arrived: bool = False
    ) -> None:
        """Numbered frames for ``peer`` whose session ended unsent, or (``maybe_arrived``)
        sent and never acknowledged: its DATA bodies go to the node, which counts what they
        carried (``NodeLink.data_lost``), the rest are ``frames_dropped_peer_down``."""
        data = [body for kind, body in frames if kind is _Kind.DATA]
        if len(data) < len(frames):
            self._count("frames_dropped_peer_down", len(frames) - len(data))
        lost = getattr(self._link, "data_lost", None)
        if data and lost is not None:
            self._submit(lost, peer, data, maybe_arrived)
        elif data:
            self._count("frames_dropped_peer_down", len(data))

    def _end_sessions(self, node_id: str, below: int) -> None:
        """End the sessions with ``node_id``'s incarnations below ``below`` (it left,
        restarted, or this node did): what they kept is counted as dropped."""
        lost = 0
        for key in [k for k in self._outgoing if k[0] == node_id and k[1] < below]:
            out = self._outgoing.pop(key)
            lost += out.kept() - len(out.data.unacked)
            sent = [(_Kind.DATA, body) for seq, body, _k in out.data.unacked
                    if seq <= out.sent_through]  # fmt: skip
            unsent = [(_Kind.DATA, body) for seq, body, _k in out.data.unacked
                      if seq > out.sent_through]  # fmt: skip
            self._dropped(node_id, sent, maybe_arrived=True)  # (handed to a pipe: it may have)
            self._dropped(node_id, unsent)  # (kept while it was down: it never left)
            out.data.clear()  # let go: a record of the peer may outlive the session
            out.completion.clear()
        for key in [k for k in self._incoming if k[0] == node_id and k[1] < below]:
            inc = self._incoming.pop(key)
            lost += len(inc.held)
            inc.held.clear()
        if lost:
            self._count("frames_dropped_peer_down", lost)

    def _to_client(self, client: bytes, data: bytes) -> None:
        """A frame for a client, in order: sent now, or held while its pipe is full (a
        client a little behind: a GC pause, a burst of replies; dropped, a probe lost up to
        1,502 replies of 3,000 and their callers waited out their timeouts, and a lost ACKS
        shrank the client's send window for good). One whose connection is gone is counted
        (``client_frames_undeliverable``)."""
        if client in self._client_held:
            self._hold_for_client(client, data)
            return
        try:
            self._client.send_multipart([client, data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EAGAIN:
                self._hold_for_client(client, data)
            elif exc.errno == zmq.EHOSTUNREACH:
                self._count("client_frames_undeliverable")
            else:
                raise

    def _hold_for_client(self, client: bytes, data: bytes) -> None:
        held = self._client_held.setdefault(client, deque())
        held.append(data)
        size = self._client_held_bytes[client] = self._client_held_bytes.get(client, 0) + len(data)
        if size > _CLIENT_HELD_BYTES:  # it has not read for long: given up on (its calls
            lost = len(held)  # end at their deadlines, or its connection goes first)
            del self._client_held[client], self._client_held_bytes[client]
            self._count("client_frames_undeliverable", lost)
            _log.warning("node %s: a client read nothing of %d frames (%d bytes) held for it; "
                         "they are dropped", self._node_id, lost, size)  # fmt: skip

    def _flush_clients(self) -> None:
        """Send what is held for clients, each in order, as far as their pipes take it."""
        for client in list(self._client_held):
            held = self._client_held[client]
            sent = 0
            while held:
                try:
                    self._client.send_multipart([client, held[0]], zmq.NOBLOCK)
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EAGAIN:
                        break
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    self._count("client_frames_undeliverable", len(held))
                    held.clear()
                    break
                sent += len(held.popleft())
            if held:
                self._client_held_bytes[client] -= sent
            else:
                del self._client_held[client], self._client_held_bytes[client]

    def _ping(self) -> None:
        """A ping on both pipes of every peer that is up: a pipe that is gone means it is
        down, found even when nothing else is sent to it. Credit owed below the step goes
        too (at the next flush), and so does the number of the last DATA received (held
        while paused, say) when it is not acknowledged yet: its sender keeps it until then."""
        for peer in list(self._peers.values()):
            if peer.state is _State.UP and self._frame(peer, _Kind.PING, b"", channel=Channel.DATA):
                self._frame(peer, _Kind.PING, b"", channel=Channel.COMPLETION)
        with self._lock:
            for peer in self._peers.values():
                owed = _owed(peer.inc)
                if owed and peer not in self._credits:
                    self._credits.append(peer)

    def _sweep(self, now: float) -> None:
        """Drop, and count, what senders that never said HELLO sent, and the sessions
        of peers down for ``_SESSION_LINGER`` and not met again; take down a peer that said
        goodbye on one pipe only, and is gone, ``_leave_grace`` after it was found gone."""
        for ident, (since, kept) in list(self._strangers.items()):
            if now - since > self._connect_timeout:
                del self._strangers[ident]
                self._unlisted.discard(ident)
                self._count(
                    "frames_from_strangers",  # (each body: as its sender counts)
                    sum(len(bodies) for _header, bodies, _channel in kept),
                )
        for peer in list(self._peers.values()):
            if peer.leaving is not None and now - peer.leaving > self._leave_grace:
                self._down(peer, "it said goodbye on one pipe only, and is gone")
        for (node_id, incarnation), out in list(self._outgoing.items()):
            if out.down_since is not None and now - out.down_since > _SESSION_LINGER:
                self._end_sessions(node_id, incarnation + 1)
                if node_id not in self._listed:
                    self._forget(node_id)

    def _forget(self, node_id: str) -> None:
        """The records of ``node_id``'s incarnations other than the live one whose sessions
        ended, once the store no longer lists it: gone (a node id never seen again, a pod
        replaced under a new name, must not stay forever; a late frame of theirs is then a
        stranger's, counted as such). A node the store still lists keeps its record: a frame
        from it (a partition healed) is how it is met again."""
        live = self._peers.get(node_id)
        for ident, old in list(self._by_ident.items()):
            if (
                old.node_id == node_id
                and old is not live
                and (node_id, old.incarnation) not in self._outgoing
            ):
                del self._by_ident[ident]

    def _probe(self, peer: _Peer, channel: Channel) -> bool:
        """Send this node's HELLO to ``peer`` on ``channel``; ``False`` if no pipe yet."""
        assert self._endpoint is not None
        hello = json.dumps(
            {
                "node": self._node_id,
                "incarnation": self._incarnation,
                "mesh": self._mesh,
                "endpoint": self._endpoint.encode(),
                "max_frame": self._max_frame,  # what it sends larger is refused at its source
            }
        ).encode()
        try:
            self._outs[channel].send_multipart(
                [peer.ident, _HEADER.pack(VERSION, _Kind.HELLO, peer.incarnation, 0, 0), hello],
                zmq.NOBLOCK,
            )
            return True
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            if peer.state is _State.UP:
                self._down(peer, "no connection", lost_pipe=True)
            return False

    def _greet(self) -> None:
        """Try the HELLOs of peers still connecting (on the pipes they are connected to, see
        ``_settle``); up once both went through."""
        self._settle()
        now = time.monotonic()
        for peer in list(self._peers.values()):
            if peer.state is not _State.CONNECTING:
                continue
            for channel in Channel:
                if (
                    channel not in peer.greeted
                    and (channel, _address(peer.endpoint, channel)) not in self._lingering
                    and self._probe(peer, channel)
                ):
                    peer.greeted.add(channel)
            if len(peer.greeted) == len(Channel):
                self._up(peer)
            elif now - peer.since > self._connect_timeout:
                self._down(peer, f"did not answer within {self._connect_timeout} s")

    def _up(self, peer: _Peer) -> None:
        with self._lock:
            peer.state = _State.UP
            self._outq.extendleft(
                (peer, kind, data) for kind, data in reversed(peer.waiting)
            )  # ahead of anything handed over since (it was all kept in ``waiting``)
            peer.waiting.clear()
            inc = peer.inc  # credit owed to its incarnation while no record of it was up
            if _owed(inc) and peer not in self._credits:
                self._credits.append(peer)
        peer.out.down_since = None
        self._resend(peer)  # what a dropped connection may have lost goes first
        if peer.state is _State.DOWN:  # it found no pipe: down again, never told up
            return
        link = self._link
        assert link is not None
        self._count("peers_connected")
        self._submit(link.peer_up, peer.node_id)
        self._peers_changed()
        self._flush()

    def _down(self, peer: _Peer, why: str, lost_pipe: bool = False) -> None:
        """Take ``peer`` down (``why``: logged). ``lost_pipe``: a send to it found no pipe;
        if its goodbye came on one pipe already, it is down only once it comes on the other
        (what it sent on that pipe before comes first: the two are separate connections,
        read in either order, and a caller would be failed though its reply came), or
        ``_leave_grace`` later (``_sweep``)."""
        if lost_pipe and peer.byes and peer.state is _State.UP:
            if peer.leaving is None:
                peer.leaving = time.monotonic()
            return
        with self._lock:
            if peer.state is _State.DOWN:
                return
            peer.state = _State.DOWN
            waiting, held = list(peer.waiting), list(peer.held)
            peer.waiting.clear()
            peer.held.clear()
            if any(item[0] is peer for item in self._outq):  # handed over, not yet sent
                waiting += [(k, d) for t, k, d in self._outq if t is peer]
                self._outq = deque(item for item in self._outq if item[0] is not peer)
            if self._peers.get(peer.node_id) is peer:
                del self._peers[peer.node_id]
        # Its sessions outlive the connection (``_Outgoing``, ``_Incoming``): DATA and
        # COMPLETION that waited for it are kept (numbered) for the next meeting, and its
        # DATA held here is delivered then; the rest, and all once the session ended, dropped
        now = time.monotonic()
        peer.out.down_since = peer.inc.down_since = now
        lost = 0
        unkept: list[tuple[_Kind, bytes]] = []
        for kind, body in waiting:  # (a goodbye that waited is not a loss)
            if kind is _Kind.DATA or kind is _Kind.COMPLETION:
                if not self._keep(peer, (body,), kind, compact=True):
                    unkept.append((kind, body))
            elif kind is not _Kind.BYE:
                lost += 1
        self._dropped(peer.node_id, unkept)
        lost += self._held_to_session(peer, held)
        if lost:
            self._count("frames_dropped_peer_down", lost)
        self._release(peer)
        self._count("peers_lost")
        _log.info("node %s: peer %s (incarnation %d) is down: %s", self._node_id,
                  peer.node_id, peer.incarnation, why)  # fmt: skip
        self._submit(self._gone, peer.node_id)
        self._peers_changed()

    def _peers_changed(self) -> None:
        """The client endpoints ``client_endpoints`` names changed: the client server tells
        its clients (on the infrastructure thread)."""
        clients = self._client_link
        if clients is not None:
            self._submit(clients.peers_changed)

    def _held_to_session(self, peer: _Peer, held: list[bytes]) -> int:
        """DATA of ``peer``'s held here while this node paused it, as its record goes down:
        kept in its incarnation's session (delivered if it is met again, counted if the
        session ends); how many could not be (the session had ended already)."""
        if not held:
            return 0
        if self._incoming.get((peer.node_id, peer.incarnation)) is peer.inc:
            peer.inc.held.extend(held)
            return 0
        return len(held)

    def _gone(self, node_id: str) -> None:
        """(Infrastructure thread.) Tell the node that ``node_id`` is down, then lift a pause
        of it still set: the node forgets its pauses of a peer that went down
        (``MeshRouter.peer_down``) and never resumes them, yet one it asked for before it
        heard (for DATA of the incarnation that went down) may have landed on the next
        incarnation, met meanwhile, whose DATA would then be held forever.

        Guarantees / assumes: the node pauses a peer only on its infrastructure thread, for
        DATA it takes (as the router does); the next incarnation's DATA is submitted after
        this call, so any pause there is now was meant for the one that went down."""
        link = self._link
        assert link is not None
        try:
            link.peer_down(node_id)
        finally:
            self.resume(self._node_id, node_id)

    def _release(self, peer: _Peer) -> None:
        """Stop reconnecting to a peer's endpoints once no live peer uses them."""
        self._unuse(((Channel.DATA, peer.endpoint.data),
                     (Channel.COMPLETION, peer.endpoint.completion)), peer.ident)  # fmt: skip

    def _unuse(self, used: Iterable[tuple[Channel, str]], ident: bytes) -> None:
        """``used`` (endpoints of the peer reached at ``ident``) have one user less; those
        left with none are disconnected, and lingering until their pipe is gone."""
        for channel, ep in used:
            users = self._connected[channel]
            users[ep] = users.get(ep, 1) - 1
            if users[ep] <= 0:
                del users[ep]
                self._lingering[(channel, ep)] = ident
                with contextlib.suppress(zmq.ZMQError):
                    self._outs[channel].disconnect(ep)

    def _settle(self) -> None:
        """Forget the endpoints disconnected (``_unuse``) whose old pipe is gone, and connect
        to those that peers met since then use.

        Why wait: with ``IMMEDIATE`` a pipe is not tied to its endpoint, so ``disconnect``
        only ends the connection's session (in ZeroMQ's I/O thread); the pipe stays, writable
        and under the peer's routing id, until the out socket handles the command that ends
        it. Connected again at once, this node sent its HELLOs into that pipe, where they were
        lost, and took the peer for up: what it sent next was lost too, or found no pipe once
        the old one ended before the new one came (``EHOSTUNREACH``) and took the peer down
        again, failing its calls with ``Unavailable``. Before this node connects again, a pipe
        under that routing id can only be the old one; once a send to it fails, it has ended
        for good (a new connection's pipe then takes the id over, ``ROUTER_HANDOVER``), so
        HELLOs go only into the new connection. The probe is a PING (incarnation 0: any): one
        the old pipe takes is dropped with its session, or ignored by the peer."""
        for (channel, ep), ident in list(self._lingering.items()):
            sock = self._outs[channel]
            sock.getsockopt(zmq.EVENTS)  # the socket handles its commands (a send may not)
            try:
                sock.send_multipart([ident, _HEADER.pack(VERSION, _Kind.PING, 0, 0, 0), b""],
                                    zmq.NOBLOCK)  # fmt: skip
                continue  # still there
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EAGAIN:
                    continue  # there, and full
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
            del self._lingering[(channel, ep)]
            if ep not in self._connected[channel]:
                continue  # no peer wants it now
            try:
                sock.connect(ep)
            except zmq.ZMQError as exc:  # it was connected to before: not expected
                self._count("peers_refused")
                for peer in list(self._peers.values()):
                    if _address(peer.endpoint, channel) == ep:
                        self._down(peer, f"cannot connect to {ep}: {exc}")

    def _meet(self, node_id: str, incarnation: int, endpoint: MeshEndpoint) -> _Peer | None:
        """A node at ``incarnation``: the peer to talk to (connecting if new; to endpoints
        just disconnected from, once their old pipe is gone: ``_settle``), or ``None``
        if it is this node, an incarnation older than the one known, or at endpoints ZeroMQ
        will not connect to (counted: ``peers_refused``)."""
        if node_id == self._node_id or incarnation <= self._dead.get(node_id, 0):
            return None  # (this node, or one the store declared down: listed a moment late)
        known = self._peers.get(node_id)
        if known is not None:
            if known.incarnation == incarnation:
                return known
            if known.incarnation > incarnation:
                return None
            self._down(known, f"restarted as incarnation {incarnation}")
        self._end_sessions(node_id, incarnation)  # older incarnations' (restarted)
        with self._lock:  # (said_goodbye reads it for a peer the store never showed here)
            keep_latest(self._met, node_id, incarnation)
        key = (node_id, incarnation)
        peer = _Peer(node_id, incarnation, identity(node_id, "@" + endpoint.token),
                     identity(node_id, f"#{incarnation}"), endpoint, time.monotonic(),
                     out=self._outgoing.setdefault(key, _Outgoing()),
                     inc=self._incoming.setdefault(key, _Incoming()))  # fmt: skip
        used: list[tuple[Channel, str]] = []
        try:
            for channel, ep in ((Channel.DATA, endpoint.data),
                                (Channel.COMPLETION, endpoint.completion)):  # fmt: skip
                users = self._connected[channel]
                if ep not in users and (channel, ep) not in self._lingering:
                    self._outs[channel].connect(ep)  # else once the old pipe is gone
                users[ep] = users.get(ep, 0) + 1
                used.append((channel, ep))
        except zmq.ZMQError as exc:  # raised, it would stop the members after it too
            self._unuse(used, peer.ident)
            self._count("peers_refused")
            _log.warning("node %s cannot connect to %s at %s: %s", self._node_id, node_id,
                         endpoint.encode(), exc)  # fmt: skip
            return None
        with self._lock:
            self._peers[node_id] = peer
        peer.out.down_since = peer.inc.down_since = None  # (a session met again stays)
        if peer.inc.held:  # held here when its last connection dropped: delivered first
            held = list(peer.inc.held)
            peer.inc.held.clear()
            self._submit(self._deliver, peer, held)
        # remember one incarnation back (its late frames are counted), no more: a mesh lives
        # long (and the one back need not be live: a peer declared down comes back too)
        older = sorted((old.incarnation, ident) for ident, old in self._by_ident.items()
                       if old.node_id == node_id)  # fmt: skip
        for _incarnation, ident in older[:-1]:
            del self._by_ident[ident]
        self._by_ident[peer.sender] = peer
        return peer

    def _take_learned(self) -> None:
        with self._lock:
            lists, self._learned = self._learned, []
        for members in lists:
            for node_id, incarnation, text in members:
                try:
                    endpoint = MeshEndpoint.parse(text)
                except InvalidArgument:
                    continue  # a member of the in-process kind: not reachable from here
                if incarnation > self._listed.get(node_id, 0):
                    self._listed[node_id] = incarnation
                peer = self._meet(node_id, incarnation, endpoint)
                if peer is not None:  # what it sent before this node knew it
                    self._replay_strangers(peer)
        if lists:  # each list is all the members: one the store no longer lists, and that
            newest = {member[0] for member in lists[-1]}  # is not up here, is forgotten
            for node_id in [n for n in self._listed if n not in newest and n not in self._peers]:
                del self._listed[node_id]
                self._forget(node_id)

    def _replay_strangers(self, peer: _Peer) -> None:
        """Hand on what ``peer`` sent while this node did not know it yet, in order."""
        self._unlisted.discard(peer.sender)
        for header, kept, channel in self._strangers.pop(peer.sender, (0.0, []))[1]:
            _, kind_value, _, seq, sid = _HEADER.unpack(header)
            self._handle(peer, _Kind(kind_value), kept, seq, channel, sid)

    def _read_stray(self, sock: zmq.Socket[Any]) -> None:
        """Frames on an out socket: no node sends any there; dropped and counted."""
        for _ in range(_RECV_BATCH):
            try:
                sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._count("bad_frames")

    def _read_peer(self, channel: Channel, sock: zmq.Socket[Any]) -> None:
        for _ in range(_RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_frame(channel, frames)

    def _on_frame(self, channel: Channel, frames: list[bytes]) -> None:
        if len(frames) < 3 or not frames[1]:
            self._count("bad_frames")
            return
        ident, header = frames[0], frames[1]
        if header[0] != VERSION:  # (its header's first byte, whatever its size)
            self._count("bad_frames")
            self._other_version(ident, header[0])
            return
        if len(header) != _HEADER.size:
            self._count("bad_frames")
            return
        _version, kind_value, incarnation, seq, sid = _HEADER.unpack(header)
        if kind_value not in _KINDS:
            self._count("bad_frames")
            return
        kind = _Kind(kind_value)
        bodies = frames[2:]
        if len(bodies) > 1 and kind is not _Kind.DATA and kind is not _Kind.COMPLETION:
            self._count("bad_frames")
            return
        numbered = kind is _Kind.DATA or kind is _Kind.COMPLETION
        fitting = [b for b in bodies if len(b) <= self._max_frame]
        if len(fitting) < len(bodies) and not numbered:  # (numbered ones: in ``_fresh``)
            self._count("oversized_frames", len(bodies) - len(fitting))
            if not fitting:
                return
            else:
                bodies = fitting
        body = bodies[0]
        if incarnation not in (0, self._incarnation):  # (each body: as its sender counts)
            self._count("frames_wrong_incarnation", len(bodies))
            return
        if kind is _Kind.HELLO:
            self._on_hello(ident, body)
            return
        peer = self._by_ident.get(ident)
        if peer is None:  # its HELLO is on the other channel, not read yet: keep a few
            if ident not in self._strangers and len(self._strangers) < 1024:
                self._strangers[ident] = (time.monotonic(), [])
            kept = self._strangers.get(ident)
            cap = _STRANGER_FRAMES + (self._limit if ident in self._unlisted else 0)
            if kept is not None and len(kept[1]) < cap:  # (one over the limit: emptied, with
                small = [b if len(b) <= self._max_frame else _emptied(len(b)) for b in bodies]
                big = sum(1 for b in small if type(b) is _Emptied)  # its number and size kept)
                if big:
                    self._count("oversized_frames", big)
                kept[1].append((header, small, channel))
            else:
                self._count("frames_from_strangers", len(bodies))
            return
        if peer.state is _State.DOWN:
            found = self._revived(peer)
            if found is None:
                self._count(
                    "frames_after_goodbye" if peer.left else "frames_wrong_incarnation",
                    len(bodies),
                )
                return
            peer = found
        self._handle(peer, kind, bodies, seq, channel, sid)

    def _other_version(self, ident: bytes, version: int) -> None:
        """A sender of another wire version (a mesh upgraded halfway): its frames are
        dropped, counted, and said once per sender."""
        if ident in self._other_versions:
            return
        if len(self._other_versions) < 1024:
            self._other_versions.add(ident)
        _log.warning("node %s: %r speaks mesh wire version %d, this node %d: what it sends is "
                     "dropped (a mesh's nodes run one version)", self._node_id, ident, version,
                     VERSION)  # fmt: skip

    def _revived(self, gone: _Peer) -> _Peer | None:
        """``gone``, which this node took down, still sends: nobody told it (there is no
        session between peers). Unless it said goodbye or a newer incarnation of it is known,
        meet it again and take what it sends on the new meeting: its frames are handed on and
        credited (owed until this node is up at it again) instead of being dropped, credit
        and all, which would leave it waiting at its limit for good."""
        if gone.left:
            return None
        known = self._peers.get(gone.node_id)
        if known is not None:
            return known if known.incarnation == gone.incarnation else None
        self._count("peers_met_again")
        return self._meet(gone.node_id, gone.incarnation, gone.endpoint)

    def _handle(
        self, peer: _Peer, kind: _Kind, bodies: list[bytes], seq: int,
        channel: Channel | None = None, sid: int = 0,
    ) -> None:  # fmt: skip
        link = self._link
        assert link is not None
        body = bodies[0]
        if kind is _Kind.DATA:
            bodies = self._fresh(peer, seq, bodies, kind, sid)
            if not bodies:
                return
            with self._lock:
                if peer.paused:
                    peer.held.extend(bodies)
                else:
                    self._submit(self._deliver, peer, bodies)
        elif kind is _Kind.COMPLETION:
            bodies = self._fresh(peer, seq, bodies, kind, sid)
            if bodies:
                self._submit(self._complete, peer, bodies)
        elif kind is _Kind.CREDIT:
            if len(body) != _CREDIT.size:
                self._count("bad_frames")
                return
            if seq and not self._fresh(peer, seq, bodies, kind, sid):
                return  # a copy of a credit taken already
            n, size, acked, c_acked, about = _CREDIT.unpack(body)
            out = peer.out
            if about != out.sid:  # about a session of this node's that has ended
                self._count("credits_of_an_old_session")
                return
            out.data.acknowledged(acked)
            out.completion.acknowledged(c_acked)
            with self._lock:
                out.in_flight = max(0, out.in_flight - n)
                out.in_flight_bytes = max(0, out.in_flight_bytes - size)
                wake = out.blocked and data_resumed(
                    out.in_flight, out.in_flight_bytes, self._limit, self._bytes_limit
                )
                if wake:
                    out.blocked = False
            if wake:
                self._submit(link.writable, peer.node_id)
        elif kind is _Kind.BYE:  # on each pipe, after what was sent on it before
            peer.byes.update(Channel if channel is None else (channel,))
            if len(peer.byes) < len(Channel):
                return
            with self._lock:  # what it sent before it left is taken, held or not
                held = list(peer.held)
                peer.held.clear()
            if held:
                self._submit(self._deliver, peer, held)
            peer.left = True
            with self._lock:
                remember_goodbye(self._goodbyes, peer.node_id, peer.incarnation)
            self._down(peer, "it left")
            self._end_sessions(peer.node_id, peer.incarnation + 1)

    def _fresh(
        self, peer: _Peer, seq: int, bodies: list[bytes], kind: _Kind, sid: int
    ) -> list[bytes]:
        """(Transport thread.) The bodies of a DATA or COMPLETION frame numbered from ``seq``
        that this node takes. Copies of bodies received already (sent again after a
        connection dropped: ``_Outgoing``) are dropped and counted (``data_duplicates``,
        ``completion_duplicates``), not credited (the original's credit is, once: CREDITs are
        kept and sent again too), and their acknowledgement is owed again (it may be what was
        lost). Bodies over ``max_frame_bytes`` are dropped, counted and (DATA) credited; a
        stranger's were emptied already (counted by ``_on_frame``). Numbers skipped (not
        expected: a sender keeps what it sent until it is acknowledged) are counted
        (``data_lost_in_transit``, ...). Unnumbered ones are bad frames. A session id the
        receiver has not seen from that incarnation means its sender ended the last session
        (python-api §9: counted there) and numbers from 1 again."""
        if seq == 0:
            self._count("bad_frames")
            return []
        inc = peer.inc
        if sid != inc.sid:
            if inc.sid:
                self._count("sessions_started_over")
            with self._lock:  # (credit owed to the session that ended: its sender counted)
                inc.credit_due = inc.credit_due_bytes = 0
            inc.sid = sid
            inc.taken = inc.acked = inc.c_taken = inc.c_acked = 0
        data = kind is _Kind.DATA
        taken = inc.taken if data else inc.c_taken
        name = "data" if data else "completion"
        skip = min(len(bodies), max(0, taken + 1 - seq))
        if seq > taken + 1:
            self._count(f"{name}_lost_in_transit", seq - taken - 1)
        taken = max(taken, seq + len(bodies) - 1)
        if data:
            inc.taken = taken
        else:
            inc.c_taken = taken
        if skip:  # (a copy's credit came, or comes, with its original: not again)
            self._count(f"{name}_duplicates", skip)
            if data:  # its acknowledgement may be what was lost: owed again
                inc.acked = min(inc.acked, seq - 1)
            else:
                inc.c_acked = min(inc.c_acked, seq - 1)
            bodies = bodies[skip:]
        fitting = [b for b in bodies if b and len(b) <= self._max_frame]
        if len(fitting) == len(bodies):
            return bodies
        # dropped, yet taken (credited: its sender goes on): a body past this node's limit, a
        # stranger's emptied one (counted then; a transport audit found it never credited,
        # its sender stuck at its window) and an empty one (no envelope is empty)
        big = [b for b in bodies if len(b) > self._max_frame]
        emptied = [b.size for b in bodies if type(b) is _Emptied]
        empty = len(bodies) - len(fitting) - len(big) - len(emptied)
        if big:
            self._count("oversized_frames", len(big))
        if empty:
            self._count("bad_frames", empty)
        if data:
            self._credit(peer, len(bodies) - len(fitting), sum(map(len, big)) + sum(emptied))
        return fitting

    def _on_hello(self, ident: bytes, body: bytes) -> None:
        try:
            hello = json.loads(body)
            node_id, incarnation = hello["node"], hello["incarnation"]
            if not isinstance(hello["endpoint"], str):
                raise TypeError("endpoint")
            mesh, endpoint = hello["mesh"], MeshEndpoint.parse(hello["endpoint"])
            if not isinstance(node_id, str):
                raise TypeError("node")
            # an incarnation a store could have given (a transport audit: one past 64 bits
            # made a record whose every greeting failed to pack, and no turn sent again),
            # and a name that encodes (a lone surrogate is a UnicodeEncodeError)
            claimed = identity(node_id, f"#{check_counter(incarnation, 'an incarnation')}")
        except (ValueError, KeyError, TypeError, InvalidArgument):
            self._count("bad_frames")
            return
        if mesh != self._mesh or ident != claimed:
            self._count("peers_refused")
            _log.warning("node %s refused a HELLO from %r of mesh %r", self._node_id,
                         node_id, mesh)  # fmt: skip
            return
        known = self._peers.get(node_id)
        if (
            known is not None
            and incarnation > known.incarnation
            and incarnation > self._listed.get(node_id, 0)
        ):  # a restart only the store may tell (python-api §10): met once it lists it
            self._count("hellos_unlisted")
            if ident in self._strangers or len(self._strangers) < 1024:
                self._unlisted.add(ident)  # what it sends meanwhile is kept for then
                kept = self._strangers.get(ident, (0.0, []))[1]
                self._strangers[ident] = (time.monotonic(), kept)
            _log.info("node %s: a HELLO names %s at incarnation %d, which the store has not "
                      "listed; it is met once it does", self._node_id, node_id,
                      incarnation)  # fmt: skip
            return
        peer = self._meet(node_id, incarnation, endpoint)
        if peer is not None:
            limit = hello.get("max_frame")  # (a peer of an earlier version says nothing)
            if type(limit) is int and limit > 0:
                peer.max_frame = limit
            self._replay_strangers(peer)

    def _read_clients(self) -> None:
        link = self._client_link
        for _ in range(_RECV_BATCH):
            try:
                frames = self._client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if link is None or len(frames) != 2:
                self._count("bad_client_frames")
                continue
            if len(frames[1]) > self._max_frame:
                self._count("oversized_frames")
                self._count("bad_client_frames")  # a client's, counted as its bad frames too
                continue
            with self._lock:
                self._client_backlog += 1
                full = self._client_backlog >= self._client_backlog_limit
            self._submit(link.client_frame, frames[0], frames[1])
            if full:
                return


_KINDS = frozenset(k.value for k in _Kind)


class _Emptied(bytes):
    """A stranger's body past this node's frame limit, kept (until the store lists its
    sender) as an empty stand-in that knows the size it had: taken, it is credited."""

    size: int


def _emptied(size: int) -> _Emptied:
    stand_in = _Emptied()
    stand_in.size = size
    return stand_in


def _address(endpoint: MeshEndpoint, channel: Channel) -> str:
    """Where ``endpoint``'s in socket for ``channel`` is."""
    return endpoint.data if channel is Channel.DATA else endpoint.completion


def _owed(inc: _Incoming) -> bool:
    """Whether a CREDIT is owed to that incarnation: credit, or numbers not acknowledged."""
    return bool(inc.credit_due) or inc.taken > inc.acked or inc.c_taken > inc.c_acked
