"""Faults found by a new user driving `zlink run` node processes and `zlink.connect` clients
(docs/guide/mesh.md, docs/guide/cli.md, python-api §9/§10). Each test starts its own
processes on 127.0.0.1 and stops them in a finally; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import zlink

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.conformance.test_user_probe_faults:app"


# -- the probe's own App, served by `zlink run` node processes (importing it is cheap) --------


class PuAdd(zlink.Message, type_name="probe_user.add"):
    amount: int


class PuWhere(zlink.Request[str], type_name="probe_user.where"):
    pass


class PuSlow(zlink.Request[str], type_name="probe_user.slow"):
    seconds: float


app = zlink.App("probe_user")


@app.user_spot("pu.twin", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
class PuTwin(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.total = 0

    @zlink.handler
    def add(self, msg: PuAdd) -> None:
        self.total += msg.amount

    @zlink.handler
    def where(self, req: PuWhere) -> str:
        return self.context.spot_ref.node_rid

    @zlink.handler
    def slow(self, req: PuSlow) -> str:
        time.sleep(min(req.seconds, 20.0))
        return "done"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_consecutive(k: int) -> int:
    """A port P of 127.0.0.1 with P .. P+k-1 all free now."""
    for _ in range(200):
        base = _free_port()
        if base + k > 65535:
            continue
        socks = []
        try:
            for i in range(k):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


class Cli:
    """One `python -m zlink ...` process; stdout/stderr collected by reader threads."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        for var in ("ZLINK_NODES", "ZLINK_ADMIN", "ZLINK_STORE", "ZLINK_LISTEN"):
            env.pop(var, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zlink", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, sink) -> None:
        for line in stream:
            with self._cond:
                sink.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        with self._cond:
            while True:
                for line in self.out:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._cond.wait(0.2)):
                    raise AssertionError(
                        f"no line {pattern!r}; stdout={self.out!r} stderr={self.err[-10:]!r}"
                    )
                self._cond.wait(min(left, 0.2))

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        else:  # make sure no child of a `--nodes` run stays behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for reader in self._readers:
            reader.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        return self.proc.returncode


def test_nodes_with_memory_store_is_not_one_mesh() -> None:
    """cli.md: "`zlink run MODULE:ATTR --nodes K` starts K node processes of one mesh"; mesh.md:
    `"memory"` is "one process" and a Spot "is created ... only once in the whole mesh".
    `--nodes 2 --store memory` starts two unconnected one-node meshes that each create the
    same Spot id (split brain), says "2 node processes serving" and exits 0, where `zlink mesh
    --store memory` refuses the same store ("a store of one process")."""
    port = _free_consecutive(2)
    run = Cli(
        "run",
        "examples.guide.cluster:app",
        "--nodes",
        "2",
        "--store",
        "memory",
        "--listen",
        f"tcp://127.0.0.1:{port}",
        "--workers",
        "1",
    )
    try:
        # refused up front is the expected behaviour: the command ends with an error
        try:
            run.wait_line(r"2 node processes serving", timeout=25)
        except AssertionError:
            assert run.proc.wait(10) != 0
            return
        created = []
        for ep in (f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"):
            with zlink.connect(ep, timeout=5.0, reconnect=False) as client:
                res = client.spots.get_or_create("twin", "cluster.kept").wait(5)
                created.append(res.created)
        assert created.count(True) == 1, (
            f"one Spot id created on both nodes of a `--nodes 2` run: {created}"
        )
    finally:
        run.stop()


def _node(tmp_path: Path, node_id: str, port: int, *extra: str) -> Cli:
    return Cli(
        "run",
        APP,
        "--node-id",
        node_id,
        "--listen",
        f"tcp://127.0.0.1:{port}",
        "--store",
        f"sqlite:///{tmp_path}/mesh.db",
        "--workers",
        "2",
        *extra,
    )


def _ports(k: int) -> list[int]:
    out: list[int] = []
    while len(out) < k:
        p = _free_port()
        if p not in out:
            out.append(p)
    return out


def test_client_given_two_nodes_connects_to_draining_one_and_fails_every_call(tmp_path) -> None:
    """mesh.md: `zlink.connect([endpoint_1, endpoint_2])` "uses the first that answers"; a
    draining node "refuses calls made on it with Unavailable" ("make them on another node").
    A client started during a rolling stop, given [draining node, healthy node], connects to
    the draining node and every call fails with Unavailable for the whole drain (here ~6 s,
    up to --drain-timeout + shutdown), although the other node it was given serves."""
    pa, pb = _ports(2)
    a = _node(tmp_path, "pa", pa, "--drain-timeout", "8")
    b = _node(tmp_path, "pb", pb)
    procs = [a, b]
    try:
        a.wait_line(r"serving"), b.wait_line(r"serving")
        ea, eb = f"tcp://127.0.0.1:{pa}", f"tcp://127.0.0.1:{pb}"
        with zlink.connect(eb, timeout=5.0) as cb:
            cb.spots.get_or_create("other", "pu.twin").wait(5)
        ca = zlink.connect(ea, timeout=5.0, reconnect=False)
        try:
            ca.spots.get_or_create("held", "pu.twin").wait(5)
            busy = ca.request_to_spot("held", PuSlow(seconds=3)).timeout(20).future()
            time.sleep(0.2)  # (the slow turn has started; it holds the drain's move)
            os.kill(a.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while True:  # until node pa refuses calls: it is draining
                try:
                    ca.request_to_spot("other", PuWhere()).timeout(1).wait(2)
                except zlink.Unavailable:
                    break
                assert time.monotonic() < deadline, "pa never started to drain"
                time.sleep(0.05)
            t0 = time.monotonic()
            with zlink.connect([ea, eb], timeout=3.0) as client:
                served = None
                while time.monotonic() - t0 < 10:
                    try:
                        served = client.request_to_spot("other", PuWhere()).timeout(1).wait(2)
                        break
                    except zlink.Unavailable:
                        time.sleep(0.05)
                took = time.monotonic() - t0
            assert served == "pb" and took < 2.0, (
                f"a client given [draining pa, healthy pb] was served after {took:.1f} s"
            )
            with contextlib.suppress(zlink.ZLinkError):  # (completes either way: the drain
                busy.result(20)  # waits for it up to its timeout, then pa stops)
        finally:
            ca.close()
    finally:
        for p in procs:
            p.stop()


def test_rehome_after_same_id_restart_is_on_the_node_the_call_reaches(tmp_path) -> None:
    """mesh.md "Re-homing" said "taken over by the next call for it, on the calling node":
    after `kill -9` of node px and its restart with the same node id, calls made on node py
    (whose route names px) re-homed px's Spot on the restarted px once the old lease lapsed,
    as the guide now says, answered `Unavailable` until then."""
    px, py = _ports(2)
    x = _node(tmp_path, "px", px, "--lease", "5")
    y = _node(tmp_path, "py", py, "--lease", "5")
    procs = [x, y]
    try:
        x.wait_line(r"serving"), y.wait_line(r"serving")
        with zlink.connect(f"tcp://127.0.0.1:{px}", timeout=5.0, reconnect=False) as cx:
            cx.spots.get_or_create("r1", "pu.twin").wait(5)
        os.kill(x.proc.pid, signal.SIGKILL)
        x.proc.wait(5)
        x2 = _node(tmp_path, "px", px, "--lease", "5")
        procs.append(x2)
        x2.wait_line(r"serving")
        with zlink.connect(f"tcp://127.0.0.1:{py}", timeout=5.0) as cy:
            where = None
            t0 = time.monotonic()
            while time.monotonic() - t0 < 15:
                try:
                    where = cy.request_to_spot("r1", PuWhere()).timeout(2).wait(3)
                    break
                except zlink.Unavailable:
                    time.sleep(0.1)
        assert where == "px", f"re-homed on {where!r}, not on the restarted node the route names"
    finally:
        for p in procs:
            p.stop()


def test_client_never_learns_a_node_that_joined_after_it_connected(tmp_path) -> None:
    """mesh.md: a client "learns the others from the node it connects to, which names the
    nodes of its mesh it reaches", and after a lost connection "connects again by itself ...
    to the others it was given or learned". A client connected to pa while pa was alone never
    learns pb, which joined later (it learns only at connect): when pa stops (its Spot drained
    to pb), the client stays lost for good although pb serves the Spot (a rolling restart or
    a scale-out strands every long-lived client)."""
    pa, pb = _ports(2)
    a = _node(tmp_path, "pa", pa)
    procs = [a]
    try:
        a.wait_line(r"serving")
        client = zlink.connect(f"tcp://127.0.0.1:{pa}", timeout=5.0)
        try:
            client.spots.get_or_create("t1", "pu.twin").wait(5)
            b = _node(tmp_path, "pb", pb)
            procs.append(b)
            b.wait_line(r"serving")
            with zlink.connect(f"tcp://127.0.0.1:{pb}", timeout=5.0, reconnect=False) as cb:
                cb.spots.get_or_create("onb", "pu.twin").wait(5)
            deadline = time.monotonic() + 10
            while True:  # until pa reaches pb: a call made on pa is served on pb
                with zlink.connect(f"tcp://127.0.0.1:{pa}", timeout=5.0, reconnect=False) as c2:
                    try:
                        if c2.request_to_spot("onb", PuWhere()).timeout(1).wait(2) == "pb":
                            break
                    except zlink.ZLinkError:
                        pass
                assert time.monotonic() < deadline, "pa never reached pb"
                time.sleep(0.1)
            os.kill(a.proc.pid, signal.SIGTERM)
            assert a.proc.wait(15) == 0
            where = None
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10 and where is None:
                try:
                    where = client.request_to_spot("t1", PuWhere()).timeout(1).wait(2)
                except zlink.Unavailable:
                    time.sleep(0.1)
            assert where == "pb", f"client still lost 10 s after pa stopped: {client!r}"
        finally:
            client.close()
    finally:
        for p in procs:
            p.stop()


def test_bingo_play_processes_leaves_its_store_folder_behind(tmp_path) -> None:
    """cli.md `zlink bingo play ... --processes` (the documented smoke test) exits 0 and leaves
    a `zlink-bingo-*` folder holding its SQLite Location Store in the temp folder on every run
    (zlink/samples/bingo/processes.py makes it with mkdtemp and never removes it; 100+ had
    piled up on this machine). `zlink run --nodes` removes its own temp store when it stops."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlink",
            "bingo",
            "play",
            "--rooms",
            "1",
            "--players",
            "2",
            "--nodes",
            "2",
            "--processes",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    left = sorted(p.name for p in tmp.iterdir())
    assert left == [], f"left behind after a successful run: {left}"


def test_relocate_spot_to_an_empty_node_id_is_invalid_argument() -> None:
    """python-api §5 (bad input gets a typed error at the boundary): ``relocate_spot`` to
    ``""`` was ``Unavailable`` (as if a node were down), not ``InvalidArgument``."""
    from zlink.testing import LocalCluster

    app = zlink.App("probe-user-relocate")
    app.user_spot("pu.room")(type("Room", (zlink.UserSpot,), {}))
    with LocalCluster(app, nodes=2) as cluster:
        cluster.node(0).client().spots.get_or_create("r", "pu.room").wait(5)
        with pytest.raises(zlink.InvalidArgument):
            cluster.node(0).relocate_spot("r", "", timeout=1.0)
        assert "r" in cluster.node(0)._runtime.spots  # nothing moved, nothing sealed


def test_a_client_of_a_draining_node_moves_to_another_and_its_pending_call_is_answered(
    tmp_path,
) -> None:
    """The probe's fault 3, for a client connected already: its node drains (SIGTERM), and
    every call it made was refused ("make them on another node") for the whole drain while
    another node served. The node now says it goes away: the client connects to the other
    node it learned (calls served there within moments), and the call it had running on the
    draining node is still answered with its value on the connection left behind."""
    pa, pb = _ports(2)
    a = _node(tmp_path, "pa", pa, "--drain-timeout", "8")
    b = _node(tmp_path, "pb", pb)
    procs = [a, b]
    try:
        a.wait_line(r"serving"), b.wait_line(r"serving")
        with zlink.connect(f"tcp://127.0.0.1:{pb}", timeout=5.0) as cb:
            cb.spots.get_or_create("other", "pu.twin").wait(5)
        client = zlink.connect(f"tcp://127.0.0.1:{pa}", timeout=5.0)
        try:
            client.spots.get_or_create("held", "pu.twin").wait(5)
            deadline = time.monotonic() + 10
            while f"tcp://127.0.0.1:{pb}" not in client._failover.endpoints:  # learned pb
                assert time.monotonic() < deadline, "the client never learned pb"
                time.sleep(0.05)
            busy = client.request_to_spot("held", PuSlow(seconds=3)).timeout(20).future()
            time.sleep(0.2)  # (the slow turn has started: it holds the drain's move)
            os.kill(a.proc.pid, signal.SIGTERM)
            t0 = time.monotonic()
            served = None
            while time.monotonic() - t0 < 10:
                try:
                    served = client.request_to_spot("other", PuWhere()).timeout(1).wait(2)
                    if client._failover.current.node_id == "pb":
                        break
                except zlink.Unavailable:
                    time.sleep(0.05)
            took = time.monotonic() - t0
            assert client._failover.current.node_id == "pb" and served == "pb", took
            assert took < 2.0, f"moved to pb after {took:.1f} s of a drain"
            assert busy.result(20) == "done"  # answered on the connection left behind
        finally:
            client.close()
    finally:
        for p in procs:
            p.stop()


def test_a_node_id_with_an_at_sign_is_invalid_argument() -> None:
    """An Entry Spot's id is ``TYPE@NODE``: entry type ``lob@x`` on node ``y`` and entry
    type ``lob`` on node ``x@y`` would share the id ``lob@x@y`` (a probe's suspicion, both
    names accepted). A node id has no ``@``."""
    with pytest.raises(zlink.InvalidArgument, match="no '@'"):
        zlink.NodeConfig(node_id="x@y")
    assert zlink.NodeConfig(node_id="x-y").node_id == "x-y"
