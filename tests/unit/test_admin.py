"""The admin endpoint and the commands that read it, against a real node in a subprocess."""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import zlink
from zlink.admin import AdminServer, is_loopback, parse_address
from zlink.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_addresses_parse_and_only_loopback_is_served_unless_asked():
    assert parse_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("nope", "127.0.0.1:", ":80", "h:99999"):
        with pytest.raises(zlink.InvalidArgument):
            parse_address(bad)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.org")
    node = zlink.Node(zlink.App("a"), zlink.NodeConfig(workers=1))
    with pytest.raises(zlink.InvalidArgument, match="loopback"):
        AdminServer(node, "0.0.0.0", 0)


@pytest.mark.timeout(60)
def test_run_serves_status_to_inspect_and_status_then_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "zlink", "run", "examples.counter:app", "--admin", "127.0.0.1:0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("admin on http://127.0.0.1:"), line
        address = line.split()[2].removeprefix("http://")
        proc.stdout.readline()  # "serving ..."

        def zl(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "zlink", *args, "--admin", address],
                cwd=ROOT, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout

        owners = json.loads(zl("inspect", "queues", "--json"))
        assert [(o["kind"], o["owner"]) for o in owners] == [
            ("spot", "counter.lobby@node-1"),
            ("channel", "counter.scores"),  # (a Channel has a gate and lanes of its own)
        ]
        assert owners[0]["waiters"] == 0 and owners[0]["refused"] == 0  # python-api §9
        assert "counter.lobby@node-1" in zl("inspect", "spots")
        types = json.loads(zl("inspect", "types", "--json"))
        live = sorted((t["kind"], t["type"], t["live"]) for t in types)  # (a Channel too)
        assert live == [("channel", "counter.scores", 1), ("spot", "counter.lobby", 1)]
        assert "counter.lobby" in zl("inspect", "types")
        assert "workers busy" in zl("status")
        status = json.loads(zl("status", "--json"))
        assert status["node_id"] == "node-1" and status["workers"] >= 1
        assert "workers busy" in zl("status", "--watch", "--count", "1", "--interval", "0.1")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        # one node: nowhere to move to, and said why (an audit: an operator saw only the count)
        assert "drained: 0 Spots moved, 1 stayed (1: no other node to move to)" in out
        assert "stopped: 0 Spots moved, 1 stayed; 0 messages discarded" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_inspect_reports_a_node_that_does_not_answer():
    result = CliRunner().invoke(cli, ["inspect", "queues", "--admin", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "no node answers" in result.output
    result = CliRunner().invoke(cli, ["inspect", "everything"])
    assert result.exit_code == 2


class Poke(zlink.Message, type_name="t.adm.poke"):
    pass


def _admin(make_node, **options):  # type: ignore[no-untyped-def]
    app = zlink.App("admin-metrics")

    @app.user_spot("t.adm.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def poke(self, msg: Poke) -> None:
            pass

    node = make_node(app)
    node.client().spots.get_or_create("r", "t.adm.room").wait(5)
    return node, AdminServer(node, "127.0.0.1", 0, **options).start()


@contextlib.contextmanager
def _holding(server: AdminServer) -> Iterator[list[socket.socket]]:
    """Connections a test holds open to ``server``: closed, and the server stopped, at the
    end; just before, ``/health`` must be served again (their slots freed)."""
    held: list[socket.socket] = []
    try:
        yield held
        _kind, body = _get(server.address, "/health")  # slots freed: served again
        assert json.loads(body)["ok"] is True
    finally:
        for conn in held:
            conn.close()
        server.stop()


def _get(address: tuple[str, int], path: str) -> tuple[str, str]:
    import urllib.request

    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=10) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_an_admin_address_in_use_is_named_and_a_bad_one_refused_before_the_node_starts():
    """A service probe: ``--admin nope`` was checked only after the node had started (and
    registered), and a port in use said "[Errno 98] Address already in use" without the
    address."""
    result = CliRunner().invoke(cli, ["run", "examples.counter:app", "--admin", "nope"])
    assert result.exit_code == 1 and "node-1 started" not in result.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        node = zlink.Node(zlink.App("a"), zlink.NodeConfig(workers=1))
        with pytest.raises(zlink.InvalidArgument, match=f"127.0.0.1:{port}"):
            AdminServer(node, "127.0.0.1", port)


def test_health_says_503_and_why_while_the_node_does_not_serve(make_node):
    """A service probe: /health said ``{"ok": true}`` while the node was fenced and refused
    every call; a load balancer's probe must be able to tell. A query string is ignored."""
    import urllib.error

    node, server = _admin(make_node)
    try:
        _kind, body = _get(server.address, "/health?probe=1")
        assert json.loads(body) == {"ok": True, "node_id": "node-1"}
        node._runtime.fenced = True  # what self-fencing sets (python-api §10 "Failure")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(server.address, "/health")
        assert refused.value.code == 503
        answer = json.loads(refused.value.read().decode())
        assert answer["ok"] is False and answer["why"].startswith("fenced")
        node._runtime.fenced = False
    finally:
        server.stop()


def test_head_answers_as_get_does_without_a_body(make_node):
    """A service probe: ``HEAD /health`` (what some load balancers send) was 501."""
    import http.client

    node, server = _admin(make_node)
    try:
        for path, code in (("/health", 200), ("/status", 200), ("/metrics", 200), ("/x", 404)):
            conn = http.client.HTTPConnection(*server.address, timeout=10)
            try:
                conn.request("HEAD", path)
                answer = conn.getresponse()
                assert (answer.status, answer.read()) == (code, b""), path
                if code == 200:
                    assert int(answer.headers["Content-Length"]) > 0
            finally:
                conn.close()
        node._runtime.fenced = True
        conn = http.client.HTTPConnection(*server.address, timeout=10)
        try:
            conn.request("HEAD", "/health")
            assert conn.getresponse().status == 503
        finally:
            conn.close()
        node._runtime.fenced = False
    finally:
        server.stop()


def test_metrics_are_served_in_the_prometheus_text_format(make_node):
    """Issue "Running ZLink as a service": /metrics (prometheus_client) has the node's
    counters, gauges, and queue depths and admission waiters by Spot type."""
    _node, server = _admin(make_node)
    try:
        kind, text = _get(server.address, "/metrics")
        assert kind.startswith("text/plain; version=0.0.4")
        assert 'zlink_workers{mesh="main",node="node-1"} 2.0' in text
        assert 'zlink_queue_items{kind="spot",mesh="main",node="node-1",type="t.adm.room"}' in text
        assert "zlink_admission_waiters{" in text and "zlink_fenced{" in text
        assert "# TYPE zlink_events_total counter" in text or "# TYPE zlink_events counter" in text
    finally:
        server.stop()


def test_the_metric_names_the_docs_give_are_the_ones_metrics_serves(make_node):
    """Issue 15 review: README and the guide name the series a scrape really has (a counter's
    series ends in ``_total``: ``zlink_events_total``, not ``zlink_events``), and README names
    every series ``/metrics`` serves."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    node, server = _admin(make_node)
    node._runtime.metrics.add("handler_errors")  # so the counter family has a series
    try:
        _kind, text = _get(server.address, "/metrics")
    finally:
        server.stop()
    families = list(text_string_to_metric_families(text))
    served = {s.name for f in families for s in f.samples}
    histograms = {f.name for f in families if f.type == "histogram"}  # as a family
    assert "zlink_events_total" in served and "zlink_admissions_refused_total" in served
    named = re.compile(r"`(zlink_[a-z_]+)")  # a metric as the docs write one: in backticks
    readme = set(named.findall((ROOT / "README.md").read_text()))
    guide = {
        name
        for page in sorted((ROOT / "docs" / "guide").glob("*.md"))
        for name in named.findall(page.read_text())
    }
    assert readme - served - histograms == set(), "README names series /metrics does not serve"
    assert guide - served - histograms == set(), "docs/guide names series /metrics does not serve"
    assert served - readme == set(), "README leaves out series /metrics serves"


def test_a_connection_gives_its_slot_back_before_its_client_sees_the_close(make_node):
    """Else a client that reconnects the moment it sees the close may be refused (a flake of
    the test below under load): when the server closes a served connection, its slot is free."""
    node, server = _admin(make_node, max_connections=1)
    bounded = server._server
    free_at_close: list[int] = []
    closed = threading.Semaphore(0)
    real = bounded.shutdown_request

    def shutdown_request(request: object) -> None:
        free_at_close.append(bounded._slots._value)
        real(request)
        closed.release()

    bounded.shutdown_request = shutdown_request  # type: ignore[method-assign]
    try:
        for _ in range(2):
            _get(server.address, "/health")
            assert closed.acquire(timeout=10)  # the server closed it
    finally:
        server.stop()
    assert free_at_close == [1, 1]
    assert "admin_connections_refused" not in node.counters()


def test_the_admin_endpoint_caps_its_connections_and_closes_idle_ones(make_node):
    """A connection past the cap is closed at once (counted); an idle one is closed after the
    timeout, so a client that connects and says nothing holds no thread for long."""
    import time

    node, server = _admin(make_node, max_connections=2, timeout=0.5)
    with _holding(server) as held:
        for _ in range(2):
            conn = socket.create_connection(server.address, timeout=10)
            held.append(conn)
        extra = socket.create_connection(server.address, timeout=10)
        held.append(extra)
        assert extra.recv(16) == b""  # closed at once: over the cap
        started = time.monotonic()
        assert held[0].recv(16) == b""  # idle past the timeout: closed by the server
        assert time.monotonic() - started < 5.0
        assert node.counters()["admin_connections_refused"] == 1


def test_a_request_that_trickles_in_is_cut_off_and_frees_its_slot(make_node):
    """A client probe: connections that each sent one byte of a request every 2 s were never
    idle for the timeout, so 16 of them held every slot and ``/health`` was refused for as
    long as they went on. A request's head has twice the timeout to arrive, all of it."""
    import time

    _node, server = _admin(make_node, max_connections=2, timeout=0.5)
    with _holding(server) as held:
        held.extend(socket.create_connection(server.address, timeout=10) for _ in range(2))
        started = time.monotonic()
        closed = [False, False]
        while not all(closed) and time.monotonic() - started < 5.0:  # (bounded)
            for i, conn in enumerate(held):  # a byte each, every 0.2 s: never idle 0.5 s
                if not closed[i]:
                    try:
                        conn.sendall(b"G")
                        conn.settimeout(0.2)
                        closed[i] = conn.recv(16) == b""
                    except TimeoutError:
                        pass
                    except OSError:
                        closed[i] = True
        assert all(closed), "a trickling request held its slot for 5 s"
        assert time.monotonic() - started < 3.0  # its 1 s, and a moment


def test_status_and_inspect_say_what_is_wrong_with_the_admin_address_in_one_line():
    """README "Running it as a service": a mistake on the command line ends with one error
    line, not a traceback: a malformed ``--admin``, or one where something other than a
    node answers."""
    for args in (["status", "--admin", "nonsense"], ["inspect", "queues", "--admin", "x:99999"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "HOST:PORT" in result.output and "Traceback" not in result.output

    class NotANode(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"hello": "world"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotANode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        admin = f"127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(cli, ["status", "--admin", admin])
        assert result.exit_code == 2, result.output
        assert "not a zlink node's status" in result.output
        assert "Traceback" not in result.output
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _answering(reply: bytes) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply`` and closes it;
    its ``HOST:PORT``."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:  # (its timeout, each 0.2 s: it looks at ``done``)
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        server.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n",  # a wrong port
        b'HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n{"node_id":',  # cut off mid-answer
    ],
)
@pytest.mark.parametrize("command", [["status"], ["inspect", "queues"]])
def test_status_and_inspect_say_in_one_line_when_what_answers_is_not_http(reply, command):
    """Found by an audit: ``_fetch`` caught ``OSError``, not ``http.client.HTTPException``:
    something that does not speak HTTP (a wrong port: SSH, Redis) or a node that died
    mid-answer gave a traceback, where cli.md promises one line and exit status 2."""
    with _answering(reply) as address:
        result = CliRunner().invoke(cli, [*command, "--admin", address])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("interval", ["inf", "1e10"])
def test_status_watch_refuses_an_interval_it_cannot_wait(interval):
    """Found by the same audit: ``--interval`` had a lower bound only; ``inf`` passed and the
    wait then failed with ``OverflowError`` (python-api §9: durations checked where given)."""
    result = CliRunner().invoke(
        cli, ["status", "--admin", "127.0.0.1:1", "--watch", "--interval", interval]
    )
    assert result.exit_code == 2, (result.output, result.exception)
    assert "--interval" in result.output


def test_stop_of_an_admin_server_never_started_returns():
    """Found by the same audit: ``stop()`` before ``start()`` waited for a serving loop that
    never ran: for ever (``socketserver.shutdown``)."""
    node = zlink.Node(zlink.App("a"), zlink.NodeConfig(workers=1))
    server = AdminServer(node, "127.0.0.1", 0)
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "stop() without start() blocks for ever"


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_admin_endpoint_binds_the_ipv6_loopback_it_accepts(make_node):
    """Found by the same audit: ``--admin [::1]:PORT`` is taken (``parse_address``,
    ``is_loopback``), yet the server bound IPv4 only and refused it."""
    node = make_node(zlink.App("a"))
    server = AdminServer(node, "::1", 0).start()
    try:
        host, port = server.address
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            assert conn.recv(64).startswith(b"HTTP/1.0 200")
    finally:
        server.stop()


def test_health_says_503_draining_from_the_moment_a_drain_begins(make_node):
    """A service probe: ``/health`` said ``{"ok": true}`` for the whole drain of ``zlink
    run``, while the node already refused calls ("node n1 is draining"): a readiness probe
    kept sending clients to it. It is 503 with ``why`` from the drain on."""
    import urllib.error

    node, server = _admin(make_node)
    try:
        node.drain(1.0)  # one node: nothing to move, but it drains (refuses new calls)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(server.address, "/health")
        assert refused.value.code == 503
        assert json.loads(refused.value.read().decode())["why"].startswith("draining")
    finally:
        server.stop()


def test_inspect_folds_a_value_in_a_narrow_terminal_and_never_cuts_it(make_node, monkeypatch):
    """A service probe: in an 80-column terminal ``zlink inspect queues`` cut numbers off
    ("1132…"). A value that does not fit is folded onto the next line, whole."""
    from tests.procs.app import app
    from zlink import cli as cli_module

    node = make_node(app)  # (its Entry Spot: one owner)
    status = node.status()
    owner = status.owners[0] if status.owners else None
    assert owner is not None
    big = {"owner": "a-rather-long-owner-name@node-1", "app_bytes": 1_132_557_312,
           "refused": 987_654_321}  # fmt: skip
    wide = status.model_copy(update={"owners": [owner.model_copy(update=big)]})
    monkeypatch.setattr(cli_module, "_fetch", lambda admin: wide)
    result = CliRunner().invoke(cli, ["inspect", "queues"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output  # (folded digits interleave with the next column's)
