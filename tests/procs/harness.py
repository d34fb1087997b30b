"""Node processes for the mesh tests: started with ``subprocess`` on 127.0.0.1, driven by JSON
lines, every wait bounded, every process stopped (killed if it must be), also when a test fails.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


class NodeProcess:
    """One ``tests.procs.node_main`` process."""

    def __init__(self, node_id: str, store: str, *, wait: bool = True, **options: Any) -> None:
        """Start the process; with ``wait``, return once it serves (else ``wait_ready``)."""
        self.node_id = node_id
        args = [sys.executable, "-m", "tests.procs.node_main", "--node-id", node_id,
                "--store", store]  # fmt: skip
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._ids = itertools.count(1)
        self._answers: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._ready: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.ready: dict[str, Any] = {}
        self.address = ""
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the process serves (its first line); it is killed if it does not in time."""
        try:
            self.ready = self._ready.get(timeout=START_TIMEOUT)
        except queue.Empty:
            self.kill()
            why = "".join(self.stderr)[-3000:]
            raise RuntimeError(f"{self.node_id} did not start: {why}") from None
        self.address = self.ready["address"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "ready" in msg or "stopped" in msg:
                self._ready.put(msg)
                continue
            with self._lock:
                box = self._answers.get(msg.get("id", -1))
            if box is not None:
                box.put(msg)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def ask(self, op: str, timeout: float = 30.0, **args: Any) -> Any:
        """Run ``op`` in the process; its value, or ``CommandFailed`` with its error text."""
        reply = self.ask_raw(op, timeout, **args)
        if not reply["ok"]:
            raise CommandFailed(reply["error"])
        return reply["value"]

    def ask_raw(self, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        n = next(self._ids)
        self.send_line({"id": n, "op": op, **args})
        return self.wait_answer(n, timeout)

    def send_line(self, obj: dict[str, Any]) -> None:
        """Send one command line; one with an ``id`` can be answered (``wait_answer``)."""
        if "id" in obj:
            with self._lock:
                self._answers.setdefault(obj["id"], queue.Queue())
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def wait_answer(self, n: int, timeout: float = 30.0) -> dict[str, Any]:
        """The answer to the command line with id ``n`` (sent with ``send_line``)."""
        with self._lock:
            box = self._answers[n]
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.node_id}: no answer to command {n} in {timeout} s") from None

    def stop(self, timeout: float = 15.0) -> None:
        """Ask it to shut down; kill it if it does not exit in time."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.send_line({"op": "stop"})
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reap()

    def _reap(self) -> None:
        """(Exited.) Let the readers see the end of its output, then close the pipes."""
        for reader in self._readers:
            reader.join(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()


class CommandFailed(Exception):
    """A command the node process answered with an error (its text)."""


@contextlib.contextmanager
def mesh(
    tmp_path: Path, ids: list[str], store: str | None = None, **options: Any
) -> Iterator[dict[str, NodeProcess]]:
    """Node processes ``ids`` sharing one store (``store``: a URL; default one SQLite file in
    ``tmp_path``); all stopped after."""
    store = store or store_url(tmp_path)
    nodes: dict[str, NodeProcess] = {}
    try:
        for node_id in ids:  # started together (an interpreter's start is most of it), as
            nodes[node_id] = NodeProcess(node_id, store, wait=False, **options)  # a mesh's
        for node in nodes.values():  # nodes often are
            node.wait_ready()
        yield nodes
    finally:
        for node in nodes.values():
            with contextlib.suppress(Exception):
                node.stop()
        for node in nodes.values():
            node.kill()


def store_url(tmp_path: Path) -> str:
    """The SQLite store ``mesh(tmp_path, ...)`` uses by default."""
    return f"sqlite:///{tmp_path / 'mesh.db'}"


def start(tmp_path: Path, node_id: str, store: str | None = None, **options: Any) -> NodeProcess:
    """One more node process on the store of ``mesh(tmp_path, ...)`` (or ``store``)."""
    return NodeProcess(node_id, store or store_url(tmp_path), **options)
