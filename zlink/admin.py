"""The admin endpoint of a node: read-only HTTP on loopback (``zlink run --admin``).

``GET /status`` returns ``NodeStatus`` as JSON; ``GET /health`` returns ``{"ok": true}``, or
503 with ``{"ok": false, "why": ...}`` while the node does not serve (``Node.not_serving``:
fenced, stopping, its infrastructure thread gone), so a load balancer's probe can tell;
``GET /metrics`` returns the node's counters and gauges in the Prometheus text format
(``prometheus_client``, read from ``node.status()`` when scraped: per Spot / Actor type the
messages handled and refused and a histogram of handler latency, one message in 64 per object
timed, ``runtime.type_stats``).
It runs on its own threads (``http.server``), never on an application worker or the
infrastructure thread, and its description of the node is paced (``_PacedStatus``): a build
of ``node.status()`` that took t seconds serves every request for the next 9t, so looking at
a node takes at most about a tenth of its time whatever scrapes it how often (an operator's
probe: a node of 20,000 Spots scraped in a loop by two clients fell from 8,605 requests a
second to 58, each scrape building the whole description anew). ``/health`` is never paced.
It binds a loopback address only, unless the caller asks for another one explicitly with
``allow_remote=True``.

Guarantees / assumes: at most ``max_connections`` connections are served at once (one more is
closed at once, counted as ``admin_connections_refused``), a connection idle or half-open
for ``timeout`` seconds is closed, and so is one whose request has not arrived whole within
twice that (a thread per connection, bounded).
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .errors import InvalidArgument
from .status import SERVED_FROM_ZERO, NodeStatus

if TYPE_CHECKING:
    from .node import Node

_log = logging.getLogger("zlink.admin")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ``InvalidArgument`` if bad."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"an admin address is HOST:PORT, got {text!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _PacedStatus:
    """``node.status()`` for the admin endpoint, built at most about a tenth of the time: a
    build that took t seconds is served to every request for the next ``(1/share - 1) * t``
    seconds, and requests that come during a build wait for it (one build at a time), so
    neither many scrapers nor a large node make looking slow the node (cli.md). A small node
    (a build of a millisecond) is described afresh for nearly every request."""

    def __init__(
        self, node: Node, share: float = 0.1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._node = node
        self._clock = clock
        self._reuse = 1.0 / share - 1.0
        self._lock = threading.Lock()  # (one build at a time; the only lock here)
        self._latest: NodeStatus | None = None
        self._fresh_until = 0.0
        self._json: bytes | None = None

    def get(self) -> NodeStatus:
        with self._lock:
            return self._current()

    def json(self) -> bytes:
        """The latest description as JSON (encoded once per build)."""
        with self._lock:
            status = self._current()
            if self._json is None:
                self._json = status.model_dump_json().encode()
            return self._json

    def _current(self) -> NodeStatus:
        now = self._clock()
        if self._latest is not None and now < self._fresh_until:
            return self._latest
        self._latest = self._node.status()
        self._json = None
        done = self._clock()
        self._fresh_until = done + (done - now) * self._reuse
        return self._latest


class _NodeCollector(Collector):
    """The node's status as Prometheus metrics, read when scraped (``status``: how it is
    read; the admin endpoint's is paced)."""

    def __init__(self, node: Node, status: Callable[[], NodeStatus] | None = None) -> None:
        self._node = node
        self._status = node.status if status is None else status

    def collect(self) -> Iterator[Metric]:
        s = self._status()
        labels = ["node", "mesh"]
        who = [s.node_id, s.mesh]
        counters = CounterMetricFamily(
            "zlink_events", "Node counters: messages refused and dropped (by reason), late "
            "replies, relocations, lease renewals, ...", labels=[*labels, "name"],
        )  # fmt: skip
        # the fault and loss counters are served from 0: a series that appears at its first
        # value hides that increase from rate() and increase(), and an alert on the first
        # burst of failures never fires (Prometheus: initialise counters at 0)
        served = {**dict.fromkeys(SERVED_FROM_ZERO, 0), **s.counters}
        for name, value in sorted(served.items()):
            counters.add_metric([*who, name], value)
        yield counters
        for name, doc, value in (
            ("zlink_workers", "Application worker threads", s.workers),
            ("zlink_workers_busy", "Workers running a turn now", s.workers_busy),
            ("zlink_spots", "Spots active on the node", s.spots),
            ("zlink_actors", "Actors active on the node", s.actors),
            ("zlink_infrastructure_backlog", "Tasks waiting for the infrastructure thread",
             s.infrastructure_backlog),
            ("zlink_infrastructure_deadlines", "Deadlines the infrastructure thread holds",
             s.infrastructure_deadlines),
            ("zlink_worker_calls_in_flight", "context.workers calls running",
             s.worker_calls_in_flight),
            ("zlink_fenced", "1 while the node has fenced itself (its lease)", int(s.fenced)),
            ("zlink_serving", "1 while the node serves (not fenced, draining, stopping or "
             "superseded: /health says why not)", int(self._node.not_serving() is None)),
            ("zlink_infrastructure_alive", "1 while its infrastructure thread runs",
             int(s.infrastructure_alive)),
            ("zlink_peers", "Other nodes of its mesh it reaches now", len(s.peers)),
            ("zlink_peers_paused", "Peers whose application DATA it does not take now (§9)",
             len(s.paused_peers)),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(who, value)
            yield gauge
        by_type: dict[tuple[str, str], list[int]] = {}
        for o in s.owners:
            row = by_type.setdefault((o.kind, o.type), [0, 0, 0])
            row[0] += o.app_items
            row[1] += o.app_bytes
            row[2] += o.waiters
        typed = [*labels, "kind", "type"]
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily("zlink_queue_items",
                              "Messages queued or running, by owner kind and type",
                              labels=typed),
            GaugeMetricFamily("zlink_queue_bytes", "Bytes of those, by owner kind and type",
                              labels=typed),
            GaugeMetricFamily("zlink_admission_waiters", "Senders waiting for room (§9)",
                              labels=typed),
        ]  # fmt: skip
        for (kind, type_), values in sorted(by_type.items()):
            for family, value in zip(families, values, strict=True):
                family.add_metric([*who, kind, type_], value)
        yield from families
        handled = CounterMetricFamily(
            "zlink_messages_handled", "Messages whose handler ran, by Spot / Actor type",
            labels=typed,
        )  # fmt: skip
        refused = CounterMetricFamily(
            "zlink_admissions_refused",
            "Sends refused for a full lane of a Spot or Actor, by type (a PerActor Spot's timer "
            "lanes, which take only ticks, are not counted)",
            labels=typed,
        )
        waited = CounterMetricFamily(
            "zlink_admissions_waited", "Senders that waited for room (§9), by type", labels=typed
        )
        latency = HistogramMetricFamily(
            "zlink_handler_seconds",
            f"Handler latency, one message in {s.latency_sample_every} per object timed "
            "(the count is of samples; zlink_messages_handled counts messages)",
            labels=typed,
        )
        bounds = [*(f"{b:g}" for b in s.latency_bounds), "+Inf"]
        for t in s.types:
            at = [*who, t.kind, t.type]
            handled.add_metric(at, t.handled)
            refused.add_metric(at, t.refused)
            waited.add_metric(at, t.waited)
            cumulative, total = [], 0
            for bound, n in zip(bounds, t.latency_buckets, strict=True):
                total += n
                cumulative.append((bound, total))
            latency.add_metric(at, cumulative, t.latency_sum)
        yield from (handled, refused, waited, latency)


class AdminServer:
    """Serves a node's status over HTTP on its own threads (see the module docstring)."""

    def __init__(
        self, node: Node, host: str, port: int, *, allow_remote: bool = False,
        max_connections: int = 16, timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """``clock``: what paces the node's description (seconds; tests pass a manual one)."""
        if not is_loopback(host) and not allow_remote:
            raise InvalidArgument(
                f"the admin endpoint binds loopback addresses only, not {host!r}; "
                "pass allow_remote (--admin-allow-remote) to expose it deliberately"
            )
        node_ref = node
        paced = _PacedStatus(node, clock=clock)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_NodeCollector(node, paced.get))

        class Handler(BaseHTTPRequestHandler):
            def setup(self) -> None:
                super().setup()  # its reads: each given what is left of the request's time
                self._budget = _Budget(self.connection, 2 * timeout)
                self.rfile = io.BufferedReader(self._budget)

            def handle_one_request(self) -> None:
                self._budget.restart()  # (each request of a kept-alive connection anew)
                super().handle_one_request()

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def do_HEAD(self) -> None:  # a load balancer's probe: GET's status and headers
                self._answer(with_body=False)

            def _answer(self, with_body: bool) -> None:
                self.connection.settimeout(timeout)  # (the answer: the idle timeout again)
                kind = "application/json"
                code = 200
                try:
                    path = urlsplit(self.path).path  # (a query string is ignored)
                except ValueError:  # a target no URL parser takes (``http://[::1``): an
                    self.send_error(400, "Bad request target")  # answer, as every bad
                    return  # request gets one (an audit found the connection just closed)
                if path == "/status":
                    body = paced.json()
                elif path == "/health":
                    why = node_ref.not_serving()
                    code = 200 if why is None else 503  # a probe takes it out of rotation
                    health: dict[str, object] = {"ok": why is None, "node_id": node_ref.node_id}
                    if why is not None:
                        health["why"] = why
                    body = json.dumps(health).encode()
                elif path == "/metrics":
                    body = generate_latest(registry)
                    kind = "text/plain; version=0.0.4; charset=utf-8"
                else:
                    self.send_error(404, "try /status, /health or /metrics")
                    return
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                _log.debug("admin: " + format, *args)

        Handler.timeout = timeout  # idle or half-open connections end (socket timeout)
        try:
            self._server = _BoundedServer((host, port), Handler, max_connections, node)
        except OSError as exc:  # a port in use, say: name the address (a service probe)
            raise InvalidArgument(
                f"the admin endpoint cannot bind {host}:{port}: {exc.strerror or exc}"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="zlink-admin", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is real even when 0 was asked for."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> AdminServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (a server never started: only the close; its
        ``shutdown`` waited for a serving loop that never ran, for ever)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Budget(io.RawIOBase):
    """A connection's reads, each given what is left of its request's time: a request that
    trickled in a byte every few seconds was never idle for the timeout, and 16 of them held
    every slot (``/health`` refused for as long as they went on)."""

    def __init__(self, sock: socket.socket, limit: float) -> None:
        super().__init__()
        self._sock, self._limit = sock, limit
        self._end = time.monotonic() + limit

    def restart(self) -> None:
        self._end = time.monotonic() + self._limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long to arrive")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``limit`` at once: one more is closed at once."""

    def __init__(self, address: tuple[str, int], handler: Any, limit: int, node: Node) -> None:
        if ":" in address[0]:  # an IPv6 address (``[::1]:PORT``, which ``parse_address``
            self.address_family = socket.AF_INET6  # takes): bound IPv4 only, it was refused
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(limit)
        self._node = node

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._node._runtime.metrics.add("admin_connections_refused")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """``ThreadingMixIn``'s, with the slot given back *before* the connection closes: a
        client that sees the close and connects again at once finds the slot free (the
        other order refused it now and then, under load)."""
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - as ThreadingMixIn: reported, the thread ends
            self.handle_error(request, client_address)
        finally:
            self._slots.release()
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.debug("admin: a connection from %s failed", client_address, exc_info=True)
