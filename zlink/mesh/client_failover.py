"""Which connection a ``zlink.connect`` client's calls go to, and reconnecting after a loss
(python-api §10; execution-model §16 "ClientServer").

A client is given one endpoint or several (nodes of one mesh: any of them routes a call to any
Spot). ``Failover`` is the client's ``RuntimePort``: each call goes to the current connection
(``zlink.mesh.client``), which does all the work; this module only chooses it.

Guarantees / assumes:
* Opening tries the endpoints in the order given, each within its share of the connect
  timeout left; the first node that answers the handshake is the connection. Its ``WELCOME``
  names the client endpoints of the other nodes of its mesh it reaches, and it names them
  again whenever those change: a reconnect tries those too, after the ones given (as
  Orleans' gateway list, or Akka's cluster client that learns the receptionists from its
  initial contacts and refreshes them).
* A lost connection (the node's goodbye, a dropped TCP connection, heartbeats unanswered)
  fails what was pending on it with ``Unavailable`` at once, as it always did (its sends then
  counted as ``sends_unconfirmed_connection_lost``). With ``reconnect`` (the default), a
  thread of the client's own then tries the endpoints in turn, the lost one first (last if
  its node said goodbye: it stopped; a probe's clients lost 2 s to it), each a
  handshake bounded by ``attempt_timeout``, backing off from 50 ms to 2 s between rounds,
  until a node answers: that connection is the current one from then on (``reconnects``
  counted). What was pending is never resent (the node may have taken it: a caller retries
  when it knows it is safe), so per-sender order never spans two connections.
* A node that drains or stops says it goes away (``WELCOME`` under ``GOING_AWAY``): the
  reconnect loop then runs with that connection still up (it answers what it took), tries
  it last, and once another node answers makes that one current; the one left behind is
  closed once nothing is pending on it (``_close_when_idle``), or by ``close()``. A notice
  heard before its connection was installed is acted on as it is installed. Calls made
  meanwhile go to it and are refused; ``wait_connected`` waits. Per-sender order does not
  span the move: what is on its way through the node left may run after what is sent
  through the new one (docs/guide/mesh.md).
* While no connection is up, a call fails at once with ``Unavailable``, saying the client is
  reconnecting; ``wait_connected`` blocks until one is up.
* A client keeps to the mesh its first connection met (as an Orleans client keeps to its
  cluster id): a node of another mesh at an endpoint it tries (one restarted in another mesh,
  say) is refused, counted (``reconnects_refused_other_mesh``) and logged, and the client
  keeps looking.
* ``close()`` ends the reconnect thread and closes the current connection; a connection a
  reconnect opened after the close is closed at once.
* Lock order: ``_lock`` -> the client's counters (a leaf). Under ``_lock`` the current
  connection is read or swapped, a reconnect counted and the reconnect thread started; no
  connection is opened or closed under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Cancelled, DeadlineExceeded, InvalidOperation, Unavailable
from ..messaging.calls import NO_WAIT
from ..messaging.port import RuntimePort

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
    from ..messaging.completion import Admitted, Completion
    from ..types import SpotRef

_log = logging.getLogger("zlink.client")

BACKOFF_FIRST = 0.05  # seconds between the first reconnect rounds
BACKOFF_MOST = 2.0  # ... doubling up to this
_LOOK = 0.05  # seconds between looks while waiting to be connected (bounds a missed change)


class Counts(Protocol):
    """A client's counters (``RemoteClient.counters()``)."""

    def add(self, name: str, n: int = 1) -> None: ...

    def snapshot(self) -> dict[str, int]: ...


class Connection(RuntimePort, Protocol):
    """One connection to one node (``zlink.mesh.client``): the port calls go to."""

    @property
    def endpoint(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    @property
    def mesh(self) -> str | None:
        """The mesh its node is in, once the handshake named it."""
        ...

    @property
    def state(self) -> str: ...

    @property
    def said_goodbye(self) -> bool:
        """Whether its node ended it with a goodbye (it stopped, or drains): tried last."""
        ...

    @property
    def going_away(self) -> bool:
        """Whether its node said it goes away (it drains or stops): it takes no new calls."""
        ...

    def busy(self) -> bool:
        """Whether a call, a send or a wait for room is still pending on it."""
        ...

    @property
    def counters(self) -> Counts:
        """The client's counters, shared by every connection it has had."""
        ...

    @property
    def peers(self) -> tuple[str, ...]:
        """The other nodes' client endpoints its node named when it was opened, or since
        (it names them again as the nodes it reaches change)."""
        ...

    def open(self, timeout: float, cancel: threading.Event | None = None) -> None:
        """Shake hands; ``Unavailable`` if no node answers in time (or ``cancel`` is set)."""
        ...

    def close(self) -> None:
        """Leave (safe on a lost connection, and twice)."""
        ...

    def retire(self) -> None:
        """End a lost connection's threads, leaving it lost."""
        ...


Opener = Callable[[str, Callable[[], None], Callable[[], None]], Connection]
"""Makes a connection (not yet open) to an endpoint, which calls the first function it is
given once it is lost, and the second once its node says it goes away."""

_IDLE_LOOK = 0.05  # seconds between looks at a connection left behind, until it is idle
_IDLE_MOST = 300.0  # ... and at most this long (its calls' deadlines end them before)


class Failover:
    """A client's connections over time: the current one, and the loop that replaces it."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        make: Opener,
        timeout: float,
        reconnect: bool,
        attempt_timeout: float,
        counted: Callable[[str], None],
    ) -> None:
        self.given = endpoints
        self._make = make
        self._timeout = timeout
        self._reconnect = reconnect
        self._attempt_timeout = attempt_timeout
        self._counted = counted
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a swap or the close (notify_all)
        self._current: Connection | None = None
        self._mesh: str | None = None  # the mesh the first connection met: the client's
        self._closed = threading.Event()
        self._loop: threading.Thread | None = None
        # connections whose node goes away, replaced and not yet closed (each closes once
        # idle, ``_close_when_idle``; ``close()`` closes those left)
        self._left: set[Connection] = set()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Where a reconnect looks: the endpoints given, then those the last node named
        (at the handshake, and since, as the nodes it reaches changed)."""
        current = self._current
        named = () if current is None else current.peers
        learned = tuple(e for e in named if e not in self.given)
        return self.given + learned

    # -- opening, losing, reconnecting ------------------------------------------------------
    def open(self) -> None:
        """Connect to the first endpoint that answers within the connect timeout;
        ``Unavailable`` (with each endpoint's reason) if none does."""
        end = time.monotonic() + self._timeout
        reasons: list[str] = []
        for i, endpoint in enumerate(self.given):
            share = max(0.0, end - time.monotonic()) / (len(self.given) - i)
            connection = self._try(endpoint, share)
            if isinstance(connection, str):
                reasons.append(connection)
                continue
            with self._lock:
                closed = self._closed.is_set()
                if not closed:
                    self._current = connection
                    self._mesh = connection.mesh
            if closed:  # a close() from another thread looked before it was installed: it
                connection.close()  # would stay open for good (an asyncio connect cancelled)
                raise Cancelled("the client was closed while it connected")
            if connection.state != "up":  # lost in the moment since: reconnecting
                self._lost()
            elif connection.going_away:  # its node said so before it was installed (a
                self._away([connection])  # review: the notice was dropped then)
            return
        raise Unavailable("; ".join(reasons))

    def _try(self, endpoint: str, timeout: float) -> Connection | str:
        """An open connection to ``endpoint``, or why there is none (a ``close()`` meanwhile
        ends its handshake wait within 50 ms)."""
        made: list[Connection] = []  # (its callbacks name it: it may not be the current one)
        try:  # (making its sockets may fail too: no file descriptor left is EMFILE there;
            connection = self._make(  # raised, it ended the reconnect thread, and the client
                endpoint, lambda: self._lost_one(made), lambda: self._away(made)
            )  # stayed lost for good)
        except Exception as exc:  # noqa: BLE001 - one attempt's fault
            return self._attempt_failed(endpoint, exc)
        made.append(connection)
        try:
            connection.open(timeout, self._closed)
        except Unavailable as exc:
            connection.close()
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - one attempt's fault (say, no file
            connection.close()  # descriptor left) is that attempt's, counted
            return self._attempt_failed(endpoint, exc)
        except BaseException:  # Ctrl-C while it connects: its threads and sockets end too
            connection.close()  # (they outlived it, in a REPL until the process ended)
            raise
        mine, theirs = self._mesh, connection.mesh
        if mine is not None and theirs != mine:  # the client keeps to the mesh it first met
            connection.close()
            self._counted("reconnects_refused_other_mesh")
            _log.warning("client of mesh %r: node %s at %s is of mesh %r; not connecting",
                         mine, connection.node_id, endpoint, theirs)  # fmt: skip
            return f"{endpoint}: node {connection.node_id} is of mesh {theirs!r}, not {mine!r}"
        return connection

    def _attempt_failed(self, endpoint: str, exc: Exception) -> str:
        """One attempt's own fault (counted, ``reconnect_errors``; logged): why it failed."""
        self._counted("reconnect_errors")
        _log.warning("connecting to %s failed: %r", endpoint, exc)
        return f"{endpoint}: {exc!r}"

    def _lost_one(self, made: list[Connection]) -> None:
        """(A connection's own thread.) ``made[0]`` is lost: if it is not the one calls go to
        (one left behind when its node went away), its threads end; else reconnect."""
        with self._lock:
            current = self._current
        if made and current is not None and made[0] is not current:
            threading.Thread(target=made[0].retire, name="zlink-client-retire",
                             daemon=True).start()  # fmt: skip
            return
        self._lost()

    def _away(self, made: list[Connection]) -> None:
        """(A connection's own thread.) ``made[0]``'s node drains or stops: it takes no new
        calls, and answers those it took. If it is the current connection, connect to another
        node (the reconnect loop, which tries it last) and, once one is up, let this one end
        when nothing is pending on it (``_install``); until then calls go to it (refused
        with ``Unavailable``: "make them on another node"). A probe's clients of a draining
        node had every call refused for the whole drain, another node serving."""
        with self._lock:
            if (
                not made or made[0] is not self._current or not self._reconnect
                or self._closed.is_set() or self._loop is not None
            ):  # fmt: skip
                return  # (one not installed yet: ``open`` and ``_install`` look again)
            self._loop = threading.Thread(
                target=self._reconnect_loop, name="zlink-client-reconnect", daemon=True
            )
            self._loop.start()

    def _lost(self) -> None:
        """(A connection's own thread, before its callers hear of the loss; or ``open``.)
        Start reconnecting, unless the client is closed or a loop runs already (it looks at
        what it installs, so one lost before that is never taken for up; ``open`` does the
        same for the first)."""
        with self._lock:
            if (
                not self._reconnect or self._closed.is_set() or self._loop is not None
                or self._current is None  # the first, not yet installed: ``open`` looks
            ):  # fmt: skip
                return
            self._loop = threading.Thread(
                target=self._reconnect_loop, name="zlink-client-reconnect", daemon=True
            )
            self._loop.start()

    def _reconnect_loop(self) -> None:
        """Try the endpoints in turn, the lost one first, until a node answers and its
        connection is still up once it is the current one, or the client is closed."""
        with self._lock:
            lost = self._current
            endpoints = self.endpoints
        if lost is None:
            order = endpoints
        elif lost.said_goodbye or lost.going_away:  # it left, or goes (a graceful stop, a
            # drain): the others first, it last
            order = (*[e for e in endpoints if e != lost.endpoint], lost.endpoint)
        elif lost.endpoint in endpoints:  # the lost one first, then the others in turn
            first = endpoints.index(lost.endpoint)
            order = endpoints[first:] + endpoints[:first]
        else:  # one a node named, and the node after it did not
            order = (lost.endpoint, *endpoints)
        delay = BACKOFF_FIRST
        while not self._closed.is_set():
            try:  # (the loop outlives any fault: ended, nothing would start another)
                if self._round(order):
                    return
            except Exception as exc:  # noqa: BLE001 - counted, and the next round goes on
                self._counted("reconnect_errors")
                _log.exception("client: reconnecting failed: %r", exc)
            self._closed.wait(delay)
            delay = min(delay * 2, BACKOFF_MOST)

    def _round(self, order: tuple[str, ...]) -> bool:
        """One try of each endpoint in ``order``; ``True`` once one is installed and up, or
        the client is closed (the loop is over)."""
        for endpoint in order:
            connection = self._try(endpoint, self._attempt_timeout)
            if isinstance(connection, str):
                if self._closed.is_set():
                    return True
                continue
            if self._install(connection):
                _log.warning("client reconnected to node %s at %s", connection.node_id,
                             endpoint)  # fmt: skip
                return True
            if self._closed.is_set():
                return True
            # lost again before it was the current one: this loop goes on
        return False

    def _install(self, connection: Connection) -> bool:
        """Make ``connection`` the current one (the lost one's threads end first); ``True``
        if it is up then, and this loop is over (a loss from then on starts another). One
        that came while the client closed is closed (``False``)."""
        with self._lock:
            old = self._current
        if old is not None:
            old.retire()  # (lost: a caller holding it still hears Unavailable)
        leaving = (  # a move off a node that goes away, still up (else: a reconnect)
            old is not None and old.going_away and old.state == "up"
        )
        with self._lock:
            closed = self._closed.is_set()
            up = left = False
            if not closed:
                self._current = connection
                # one whose node said it goes away (before it was installed: a review) is
                # current only until another answers: this loop goes on
                up = connection.state == "up" and not connection.going_away
                if up:  # (counted before anyone waiting hears of it)
                    self._counted("moves_on_node_going_away" if leaving else "reconnects")
                    self._loop = None
                    self._changed.notify_all()
                if old is not None and old.state == "up":  # its node goes away: closed
                    left = True  # once idle, whatever its replacement (a review found one
                    self._left.add(old)  # left open for good after a replacement was lost)
        if closed:
            connection.close()
            return False
        if old is not None and left:
            threading.Thread(target=self._close_when_idle, args=(old,),
                             name="zlink-client-leave", daemon=True).start()  # fmt: skip
        return up

    def wait_connected(self, timeout: float | None) -> None:
        """Block until the current connection is up and its node takes calls (not one going
        away: a review found this return at once while every call was refused);
        ``DeadlineExceeded`` after ``timeout`` seconds, ``InvalidOperation`` once the client
        is closed, ``Unavailable`` at once once it is lost for good (``reconnect=False``: a
        client probe's wait blocked for ever)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._closed.is_set():
                    raise InvalidOperation("the client is closed")
                current = self._current
                if current is not None and current.state == "up" and not current.going_away:
                    return
                if current is not None and not self._reconnect:
                    raise Unavailable(
                        f"the connection to node {current.node_id} is lost, and this client "
                        "does not reconnect (reconnect=False)"
                    )
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise DeadlineExceeded(f"no node answered within {timeout:.3g} s")
                # a swap or the close notifies; a poll bounds what a loss between the
                # state's change and its callback could hide
                self._changed.wait(_LOOK if left is None else min(left, _LOOK))

    def close(self) -> None:
        """End reconnecting and close the current connection, and those left behind as their
        node went away (safe twice; a review found one still open when this returned)."""
        with self._lock:
            self._closed.set()
            current, loop = self._current, self._loop
            self._changed.notify_all()
        if current is not None:
            current.close()
        if loop is not None and loop is not threading.current_thread():
            loop.join(self._attempt_timeout + 10.0)
        with self._lock:
            left, self._left = list(self._left), set()
        for connection in left:
            connection.close()

    def _close_when_idle(self, connection: Connection) -> None:
        """(A thread of its own.) Close ``connection``, whose node goes away and which calls
        no longer go to, once nothing is pending on it (its calls answered, its sends
        acknowledged), it is lost, or the client closes; at most ``_IDLE_MOST`` seconds."""
        end = time.monotonic() + _IDLE_MOST
        while connection.state == "up" and connection.busy() and time.monotonic() < end:
            if self._closed.wait(_IDLE_LOOK):
                break
        with self._lock:
            self._left.discard(connection)
        connection.close()

    @property
    def current(self) -> Connection:
        """The connection calls go to now (a lost one says why, as its calls fail)."""
        connection = self._current
        assert connection is not None, "opened first"
        return connection

    # -- the RuntimePort: every call goes to the current connection --------------------------
    def submit(
        self, call: MessageCall, reply: Completion | None, mode: WaitMode, hops: int = 0,
        force: bool = False, plain: bool = False, room: Admitted | None = None,
    ) -> Completion:  # fmt: skip
        return self.current.submit(call, reply, mode, hops, force, plain, room)

    def submit_many(
        self, call: BatchSendCall, room: Admitted | None = None, mode: WaitMode = NO_WAIT
    ) -> None:
        self.current.submit_many(call, room, mode)

    def submit_create(self, call: CreateCall[Any], mode: WaitMode) -> Completion:
        return self.current.submit_create(call, mode)

    def close_ref(self, ref: SpotRef) -> bool:
        return self.current.close_ref(ref)

    def close_later(self, ref: SpotRef) -> Completion:
        return self.current.close_later(ref)

    def submit_worker(self, call: WorkerCall[Any]) -> Completion:
        return self.current.submit_worker(call)

    def defer_join(self, call: JoinCall) -> None:
        self.current.defer_join(call)

    def defer_relocation_ready(self, call: RelocationReadyCall) -> None:
        self.current.defer_relocation_ready(call)

    def check_yield(self, call: Any) -> None:
        self.current.check_yield(call)

    def yield_begin(self) -> object | None:
        return self.current.yield_begin()

    def yield_end(self, token: Any) -> None:
        self.current.yield_end(token)

    def subscribe(self, ref: SpotRef, topic: str, on: bool) -> None:
        self.current.subscribe(ref, topic, on)

    def leave(
        self, actor_id: str, from_spot: str | None, then: Callable[[], None] | None = None
    ) -> None:
        self.current.leave(actor_id, from_spot, then)

    def disconnect(self, actor_id: str, from_spot: str | None) -> None:
        self.current.disconnect(actor_id, from_spot)

    def close_self(self, spot_id: str) -> None:
        self.current.close_self(spot_id)

    def actor_spot_id(self, actor_id: str) -> str:
        return self.current.actor_spot_id(actor_id)


__all__ = ["BACKOFF_FIRST", "BACKOFF_MOST", "Connection", "Counts", "Failover"]
