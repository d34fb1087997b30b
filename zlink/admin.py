"""The admin endpoint of a node: read-only HTTP on loopback (``zlink run --admin``).

``GET /status`` returns ``NodeStatus`` as JSON; ``GET /health`` returns ``{"ok": true}``. It runs
on its own thread (``http.server``), never on an application worker or the infrastructure
thread, so looking at a node never slows it. It binds a loopback address only, unless the caller
asks for another one explicitly with ``allow_remote=True``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument

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


class AdminServer:
    """Serves a node's status over HTTP on its own thread."""

    def __init__(self, node: Node, host: str, port: int, *, allow_remote: bool = False) -> None:
        if not is_loopback(host) and not allow_remote:
            raise InvalidArgument(
                f"the admin endpoint binds loopback addresses only, not {host!r}; "
                "pass allow_remote (--admin-allow-remote) to expose it deliberately"
            )
        node_ref = node

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/status":
                    body = node_ref.status().model_dump_json().encode()
                elif self.path == "/health":
                    body = json.dumps({"ok": True, "node_id": node_ref.node_id}).encode()
                else:
                    self.send_error(404, "try /status or /health")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                _log.debug("admin: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
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
        self._server.shutdown()
        self._server.server_close()
