"""A ``redis-server`` of a test's own: on a free 127.0.0.1 port, in a temporary folder, keeping
nothing on disk; waited for (bounded), and always stopped, killed if it must be, also when the
test fails (``redis_server`` fixture, ``tests/conftest.py``)."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import signal
import socket
import subprocess
import time

START_TIMEOUT = 10.0  # real seconds a server may take to answer PING
STOP_TIMEOUT = 5.0
REDIS_SERVER = shutil.which("redis-server")
NO_SERVER = "redis-server is not on PATH (CI installs it: apt-get install redis-server)"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (as of now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process at a time on one port; ``start()`` again after ``kill()``
    or ``stop()`` starts a new, empty one on the same port (a restart that lost its data)."""

    def __init__(self, folder: pathlib.Path) -> None:
        assert REDIS_SERVER is not None, NO_SERVER
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING (bounded); a port taken meanwhile
        by someone else is traded for another one, unless a restart needs this one."""
        assert self.proc is None, "already running"
        for _ in range(5):
            if self._start_once():
                return self
            if self.proc is not None:
                break  # it runs but does not answer: do not hide that
            self.port = free_port()
        self.stop()
        log = self.folder / "redis.log"
        raise RuntimeError(
            f"redis-server on port {self.port} did not start:"
            f" {log.read_text()[-2000:] if log.exists() else ''}"
        )

    def _start_once(self) -> bool:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
            str(self.folder), "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(self.folder / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # it ended: the port was taken
                self.proc.wait()
                self.proc = None
                return False
            if _answers_ping(self.port):
                return True
            time.sleep(0.01)  # polling the start of a process: no event to wait on
        return False

    def pause(self) -> None:
        """Stop the process (SIGSTOP): it keeps its port, accepts connections, answers
        nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9``: the server ends at once, its data gone."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
            self.proc = None

    def stop(self) -> None:
        """End the server (SIGTERM; SIGKILL if it does not end in time). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # a paused one could not act on SIGTERM
            proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)
