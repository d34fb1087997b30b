"""CURVE on the mesh (python-api §10): nodes that share a keys folder talk; a peer or client
without the mesh's keys, or with a key the mesh does not know, is refused at the handshake,
counted (``handshakes_refused``), and nothing it sent reaches a Spot."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

import zlink
from tests.procs.app import Bump, Total, app
from zlink.mesh import keys as mesh_keys

pytestmark = pytest.mark.timeout(60)


def _until(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.01)  # a handshake on another thread: nothing to wait on but its effect
    raise AssertionError(f"not within {timeout} s: {what}")


def _node(node_id: str, store: str, folder: Path | None, **extra: Any) -> zlink.Node:
    config = zlink.NodeConfig(
        node_id=node_id, listen="tcp://127.0.0.1:0", store=store, workers=1,
        keys=None if folder is None else str(folder), **extra,
    )  # fmt: skip
    return zlink.Node(app, config).start()


def _peers(node: zlink.Node) -> list[str]:
    return node._runtime.router.transport.peers()  # type: ignore[no-any-return]


def test_nodes_with_the_mesh_keys_talk_over_curve(tmp_path: Path) -> None:
    mesh_keys.generate(tmp_path / "keys")
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, tmp_path / "keys") as n1, _node("n2", store, tmp_path / "keys") as n2:
        _until(lambda: _peers(n1) == ["n2"] and _peers(n2) == ["n1"], "both up")
        n1.client().spots.get_or_create("room", "mp.room").wait(10)
        for seq in range(20):
            n2.client().send_to_spot("room", Bump(sender="n2", seq=seq)).wait(10)
        assert n2.client().request_to_spot("room", Total()).wait(10) == 20
        assert n1.counters().get("handshakes_refused", 0) == 0


def test_a_peer_without_the_mesh_keys_is_refused(tmp_path: Path) -> None:
    mesh_keys.generate(tmp_path / "keys")
    mesh_keys.generate(tmp_path / "other")  # a key pair of another mesh
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, tmp_path / "keys") as n1:
        with _node("plain", store, None) as plain:  # no CURVE at all
            _until(lambda: n1.counters().get("handshakes_refused", 0) >= 1, "plain refused")
            assert _peers(n1) == [] and _peers(plain) == []
        before = n1.counters().get("handshakes_refused", 0)
        with _node("stranger", store, tmp_path / "other") as stranger:  # CURVE, wrong key
            _until(lambda: n1.counters().get("handshakes_refused", 0) > before, "stranger refused")
            assert _peers(n1) == [] and _peers(stranger) == []


def test_a_client_without_a_known_key_reaches_no_spot(tmp_path: Path) -> None:
    """Frames sent to the client port by a DEALER without keys, or with a client key the
    mesh does not know, never reach the node: refused at the handshake and counted."""
    mesh_keys.generate(tmp_path / "keys")
    mesh_keys.generate(tmp_path / "other")
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, tmp_path / "keys") as n1:
        n1.client().spots.get_or_create("room", "mp.room").wait(10)
        assert n1.address is not None
        ctx = zmq.Context()
        try:
            plain = ctx.socket(zmq.DEALER)
            plain.setsockopt(zmq.LINGER, 0)
            plain.connect(n1.address)
            plain.send(b"anything at all", zmq.NOBLOCK)
            _until(lambda: n1.counters().get("handshakes_refused", 0) >= 1, "plain refused")
            server, _ = zmq.auth.load_certificate(tmp_path / "keys" / "mesh.key")
            public, secret = zmq.auth.load_certificate(
                tmp_path / "other" / "clients" / "client.key_secret"
            )
            unknown = ctx.socket(zmq.DEALER)
            unknown.setsockopt(zmq.LINGER, 0)
            unknown.setsockopt(zmq.CURVE_SERVERKEY, server)
            unknown.setsockopt(zmq.CURVE_PUBLICKEY, public)
            assert secret is not None
            unknown.setsockopt(zmq.CURVE_SECRETKEY, secret)
            unknown.connect(n1.address)
            unknown.send(b"anything at all", zmq.NOBLOCK)
            _until(lambda: n1.counters().get("handshakes_refused", 0) >= 2, "unknown refused")
        finally:
            ctx.destroy(linger=0)
        counters = n1.counters()
        assert counters.get("bad_client_frames", 0) == 0  # nothing got as far as the node
        assert n1.client().request_to_spot("room", Total()).wait(10) == 0


def test_a_keys_folder_that_is_not_one_is_refused_when_the_node_is_built(
    tmp_path: Path,
) -> None:
    config = zlink.NodeConfig(listen="tcp://127.0.0.1:0", keys=str(tmp_path / "missing"))
    with pytest.raises(zlink.InvalidArgument, match="zlink keys generate"):
        zlink.Node(app, config)


def test_zlink_connect_with_the_mesh_keys_is_served_and_an_unknown_client_is_refused(
    tmp_path: Path,
) -> None:
    mesh_keys.generate(tmp_path / "keys", ["alice"])
    mesh_keys.generate(tmp_path / "other", ["mallory"])
    (tmp_path / "other" / "mesh.key").unlink()  # mallory knows the right server key ...
    (tmp_path / "other" / "mesh.key").write_bytes((tmp_path / "keys" / "mesh.key").read_bytes())
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, tmp_path / "keys") as n1:
        assert n1.address is not None
        with zlink.connect(n1.address, keys=tmp_path / "keys", client="alice") as alice:
            alice.spots.get_or_create("room", "mp.room").wait(10)
            for seq in range(10):
                alice.send_to_spot("room", Bump(sender="alice", seq=seq)).wait(10)
            assert alice.request_to_spot("room", Total()).timeout(5).wait(10) == 10
        refused = n1.counters().get("handshakes_refused", 0)
        with pytest.raises(zlink.Unavailable):  # ... but not a client key the mesh knows
            zlink.connect(n1.address, timeout=1.0, keys=tmp_path / "other", client="mallory")
        # (counted on the node's own thread, which a loaded machine may run after the
        # client's timeout)
        _until(lambda: n1.counters().get("handshakes_refused", 0) > refused, "the refusal counted")
        before = set(threading.enumerate())
        started = time.monotonic()
        with pytest.raises(zlink.Unavailable):  # no keys at all
            zlink.connect(n1.address, timeout=1.0)
        # its hello never left (no handshake, so no pipe): the failed connect closes at once,
        # its thread ends and its sockets are closed, instead of waiting out close()'s linger
        assert time.monotonic() - started < 3.0
        for thread in set(threading.enumerate()) - before:
            thread.join(10)
            assert not thread.is_alive(), thread.name
        assert n1.client().request_to_spot("room", Total()).wait(10) == 10  # nothing came in


def test_a_client_added_to_a_keys_folder_is_served_once_the_node_restarts(tmp_path: Path) -> None:
    """A service probe: ``zlink keys generate --client`` refused a folder that had a mesh key,
    so a client could not be added to a running mesh's keys. ``add_clients`` (``zlink keys
    add-client``) makes only the client's pair; a node reads client keys when it starts."""
    folder = tmp_path / "keys"
    mesh_keys.generate(folder, ["alice"])
    mesh_before = (folder / "mesh.key_secret").read_bytes()
    written = mesh_keys.add_clients(folder, ["bob"])
    assert sorted(p.name for p in written) == ["bob.key", "bob.key_secret"]
    assert (folder / "mesh.key_secret").read_bytes() == mesh_before  # the mesh key is kept
    assert oct((folder / "clients" / "bob.key_secret").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(zlink.InvalidArgument, match="already"):
        mesh_keys.add_clients(folder, ["alice"])  # never overwritten: it would lock alice out
    with pytest.raises(zlink.InvalidArgument, match="zlink keys generate"):
        mesh_keys.add_clients(tmp_path / "nothing-here", ["carol"])
    for bad in ("", "a/b", ".hidden"):
        with pytest.raises(zlink.InvalidArgument):
            mesh_keys.add_clients(folder, [bad])
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, folder) as n1:
        assert n1.address is not None
        with zlink.connect(n1.address, keys=folder, client="bob") as bob:
            bob.spots.get_or_create("room", "mp.room").wait(10)
            assert bob.request_to_spot("room", Total()).timeout(5).wait(10) == 0


def test_keys_add_client_on_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from zlink.cli import cli

    folder = tmp_path / "keys"
    runner = CliRunner()
    assert runner.invoke(cli, ["keys", "generate", str(folder)]).exit_code == 0
    added = runner.invoke(cli, ["keys", "add-client", str(folder), "web", "worker"])
    assert added.exit_code == 0, added.output
    assert (folder / "clients" / "web.key").exists() and (
        folder / "clients" / "worker.key"
    ).exists()
    again = runner.invoke(cli, ["keys", "add-client", str(folder), "web"])
    assert again.exit_code == 1 and "already" in again.output and "Traceback" not in again.output


def test_a_node_of_another_mesh_is_refused_by_the_store_and_touches_nothing(
    tmp_path: Path,
) -> None:
    """A service probe: nodes of two meshes (``mesh="alpha"``, ``mesh="beta"``) on one
    store: beta's ``get_or_create`` found alpha's Spot and sent to it (the greeting refused,
    the data through all the same), and a node id used in both superseded alpha's node. The
    store serves the mesh that joined it first; a node of another does not start."""
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, None, mesh="alpha") as n1:
        n1.client().spots.get_or_create("user-42", "mp.room").wait(10)
        for mesh_id in ("n1", "n2"):  # the same node id too: it must not supersede n1
            node = zlink.Node(app, zlink.NodeConfig(
                node_id=mesh_id, listen="tcp://127.0.0.1:0", store=store, workers=1,
                mesh="beta",
            ))  # fmt: skip
            with pytest.raises(zlink.InvalidArgument, match=r"'alpha'.*'beta'"):
                node.start()
            node.shutdown(5.0)
        assert n1.not_serving() is None
        assert [r.node_id for r in n1._runtime.router.store.nodes()] == ["n1"]
        n1.client().send_to_spot("user-42", Bump(sender="n1", seq=0)).wait(10)
        assert n1.client().request_to_spot("user-42", Total()).wait(10) == 1


def test_a_node_without_the_mesh_keys_says_its_handshakes_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A service probe: a node started without ``--keys`` in a mesh that has them accepted
    sends for the keyed node's Spots and said nothing but "peer n1 is down: did not answer"
    (INFO). The side whose handshakes fail now counts them (``handshakes_failed``) and logs
    an ERROR naming the peer's endpoint and the likely cause."""
    mesh_keys.generate(tmp_path / "keys")
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    caplog.set_level("ERROR", logger="zlink.mesh.zmq")
    with _node("n1", store, tmp_path / "keys"), _node("plain", store, None) as plain:
        _until(lambda: plain.counters().get("handshakes_failed", 0) >= 1, "plain's failure")
        mine = "node plain: the handshake with the peer at"  # (n1 logs its refusals too)
        _until(lambda: [r for r in caplog.records if mine in r.getMessage()], "a log")
        said = next(r for r in caplog.records if mine in r.getMessage())
        assert said.levelname == "ERROR"
        assert "tcp://127.0.0.1:" in said.getMessage() and "keys" in said.getMessage(), said


def test_a_node_and_a_client_each_given_only_what_they_need_are_served(tmp_path: Path) -> None:
    """docs/guide/mesh.md "Security": a node needs ``mesh.key``, ``mesh.key_secret`` and the
    clients' public keys; a client needs ``mesh.key`` and its own pair, never the mesh's
    secret nor another client's (a probe found the guide saying to give clients the whole
    folder)."""
    full = tmp_path / "keys"
    mesh_keys.generate(full, ["alice", "bob"])
    node_dir, alice_dir = tmp_path / "node", tmp_path / "alice"
    (node_dir / "clients").mkdir(parents=True)
    (alice_dir / "clients").mkdir(parents=True)
    for name in ("mesh.key", "mesh.key_secret", "clients/alice.key", "clients/bob.key"):
        (node_dir / name).write_bytes((full / name).read_bytes())
    for name in ("mesh.key", "clients/alice.key", "clients/alice.key_secret"):
        (alice_dir / name).write_bytes((full / name).read_bytes())
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    with _node("n1", store, node_dir) as n1:
        assert n1.address is not None
        with zlink.connect(n1.address, keys=alice_dir, client="alice") as alice:
            alice.spots.get_or_create("room", "mp.room").wait(10)
            alice.send_to_spot("room", Bump(sender="alice", seq=0)).wait(10)
            assert alice.request_to_spot("room", Total()).timeout(5).wait(10) == 1
        with pytest.raises(zlink.InvalidArgument):  # bob's pair is not in alice's folder
            zlink.connect(n1.address, timeout=1.0, keys=alice_dir, client="bob")
