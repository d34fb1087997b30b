"""``spots.close(ref)`` from any node of a mesh (python-api §5, kotlin-spot-interface: "Missing
-> false, generation mismatch -> InvalidOperation, sealed -> Unavailable"; the Spot id is
unique across the Location Store's domain). A probe found that a node that does not own the
Spot answered ``False`` ("no such Spot") and closed nothing, and so did a ``zlink.connect``
client attached to such a node, while the Spot served on: close reaches the Spot's owner,
as a send or a request does."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster

CLOSED: list[tuple[str, int, str]] = []  # (spot id, generation, node) per on_closing
_LOCK = threading.Lock()


class Ping(zlink.Request[str], type_name="t.cx.ping"):
    pass


class Generation(zlink.Request[int], type_name="t.cx.generation"):
    pass


class CloseIt(zlink.Request[str], type_name="t.cx.closeit"):
    """Close the Spot ``spot_id`` (generation ``generation``) from this Spot's handler:
    ``how`` is ``"plain"`` (``context.spots.close`` on the turn) or ``"worker"`` (in a
    worker call)."""

    spot_id: str
    generation: int
    how: str


def build_app() -> zlink.App:
    app = zlink.App("close-across")

    @app.user_spot("t.cx.room", relocation=zlink.Relocation.recreate())
    class Room(zlink.UserSpot):
        @zlink.handler
        def ping(self, req: Ping) -> str:
            return self.context.spot_ref.node_rid

        @zlink.handler
        async def close_it(self, req: CloseIt) -> str:
            ref = zlink.SpotRef(req.spot_id, req.generation, "main", "")
            try:
                if req.how == "plain":
                    return str(self.context.spots.close(ref))
                return str(await self.context.workers.io(self.context.spots.close, ref))
            except zlink.ZLinkError as exc:
                return f"{type(exc).__name__}: {exc}"

        def on_closing(self, ctx: zlink.SpotClosingContext) -> None:
            with _LOCK:
                ref = self.context.spot_ref
                CLOSED.append((ref.spot_id, ref.object_generation, ref.node_rid))

    @app.instance_spot("t.cx.board")
    class Board(zlink.InstanceSpot):
        @zlink.handler
        def generation(self, req: Generation) -> int:
            return self.context.spot_ref.object_generation

    return app


def _closed() -> list[tuple[str, int, str]]:
    with _LOCK:
        return list(CLOSED)


@pytest.fixture
def cluster():
    CLOSED.clear()
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        yield cluster


def _made(node: zlink.Node, spot_id: str) -> zlink.SpotRef:
    made = node.client().spots.get_or_create(spot_id, "t.cx.room").wait(WAIT)
    assert made.created
    return made.spot_ref


def test_a_node_that_does_not_own_the_spot_closes_it_at_its_owner(cluster):
    n1, n2, _ = cluster.nodes
    ref = _made(n1, "room")
    assert n2.client().spots.close(ref) is True
    until(lambda: _closed() == [("room", ref.object_generation, "node-1")], "on_closing ran")
    cluster.wait_idle(WAIT)
    again = n2.client().spots.get_or_create("room", "t.cx.room").wait(WAIT)
    assert again.created and again.spot_ref.object_generation != ref.object_generation


def test_missing_and_another_generation_read_the_same_from_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    ref = _made(n1, "room")
    other = zlink.SpotRef("room", ref.object_generation + 1, ref.mesh_name, ref.node_rid)
    nobody = zlink.SpotRef("nobody", 1, ref.mesh_name, ref.node_rid)
    for node in (n1, n2, n3):
        with pytest.raises(zlink.InvalidOperation, match="generation"):
            node.client().spots.close(other)
        assert node.client().spots.close(nobody) is False
    assert n1.client().request_to_spot("room", Ping()).wait(WAIT) == "node-1"  # it serves on
    assert _closed() == []


def test_an_instance_spot_is_not_closed_by_ref_from_any_node(cluster):
    """Only User Spots are closed by ref (python-api §5): an Instance Spot's owner and
    every other node say so alike."""
    n1, n2, _ = cluster.nodes
    gen = n1.client().request_to_spot("board", Generation()).instance_spot().wait(WAIT)
    ref = zlink.SpotRef("board", gen, "main", "node-1")
    for node in cluster.nodes:
        with pytest.raises(zlink.InvalidOperation, match="not a User Spot"):
            node.client().spots.close(ref)
    assert n2.client().request_to_spot("board", Generation()).wait(WAIT) == gen


def test_a_close_follows_the_spot_it_names_when_it_moved(cluster):
    """The ref was taken on node-1; the Spot moved to node-3 since (same incarnation, same
    generation): node-1, its former owner, and node-2 both reach it there."""
    n1, n2, _ = cluster.nodes
    ref = _made(n1, "room")
    n1.relocate_spot("room", "node-3", timeout=WAIT)
    assert n2.client().request_to_spot("room", Ping()).wait(WAIT) == "node-3"
    assert n1.client().spots.close(ref) is True
    until(lambda: _closed() == [("room", ref.object_generation, "node-3")], "closed on node-3")
    cluster.wait_idle(WAIT)
    assert n2.client().spots.close(ref) is False  # gone now, on every node


def test_a_second_close_of_a_closing_spot_from_another_node_is_unavailable_or_false(cluster):
    """Once the close began, the Spot is sealed (``Unavailable``) until it is gone (then
    ``False``): never a second ``on_closing``."""
    n1, n2, _ = cluster.nodes
    ref = _made(n1, "room")
    assert n1.client().spots.close(ref) is True
    try:
        again = n2.client().spots.close(ref)
    except zlink.Unavailable:
        again = False
    assert again is False
    cluster.wait_idle(WAIT)
    assert len(_closed()) == 1


def test_a_handler_closes_a_spot_of_another_node_in_a_worker_call_not_on_its_turn(cluster):
    """The close of a Spot on another node waits for that node's answer: on a turn it would
    hold the gate and a worker for a store question and a round trip (a review: two such
    handlers stalled a node of two workers), and python-api §4 keeps blocking waits out of
    turns. It is ``InvalidOperation`` there, saying what to do; in a worker call it works.
    A Spot of the handler's own node is closed on the turn as before."""
    n1, n2, _ = cluster.nodes
    far = _made(n2, "far")
    near = _made(n1, "near")
    _made(n1, "closer")
    ask = n1.client().request_to_spot
    said = ask("closer", CloseIt(spot_id="far", generation=far.object_generation,
                                 how="plain")).wait(WAIT)  # fmt: skip
    assert said.startswith("InvalidOperation") and "worker call" in said, said
    said = ask("closer", CloseIt(spot_id="far", generation=far.object_generation,
                                 how="worker")).wait(WAIT)  # fmt: skip
    assert said == "True"
    said = ask("closer", CloseIt(spot_id="near", generation=near.object_generation,
                                 how="plain")).wait(WAIT)  # fmt: skip
    assert said == "True"
    until(lambda: sorted(_closed()) == [("far", far.object_generation, "node-2"),
                                        ("near", near.object_generation, "node-1")],
          "both closed")  # fmt: skip


def test_a_close_asked_of_a_node_that_stopped_is_refused_at_once(cluster):
    """A review: once its node had stopped, a close of a Spot of another node waited for
    ever (its store question and its deadline were posted to an infrastructure thread that
    no longer ran). It is ``Unavailable`` at once, as a call made on a stopped node is."""
    n1, n2, _ = cluster.nodes
    ref = _made(n2, "room")
    client = n1.client()
    n1.shutdown(WAIT)
    outcome: list[object] = []

    def close() -> None:
        try:
            outcome.append(client.spots.close(ref))
        except zlink.ZLinkError as exc:
            outcome.append(exc)

    t = threading.Thread(target=close, daemon=True)
    t.start()
    t.join(WAIT)
    assert len(outcome) == 1 and isinstance(outcome[0], zlink.Unavailable), outcome
    assert "shutting down" in str(outcome[0])
    assert n2.client().request_to_spot("room", Ping()).wait(WAIT) == "node-2"


def test_a_client_of_a_node_that_does_not_own_the_spot_closes_it(tmp_path: Path) -> None:
    """The ClientServer path: a ``zlink.connect`` client attached to node B closes a room on
    node A (two node processes' worth of real sockets and a SQLite store, in this process)."""
    CLOSED.clear()
    store = f"sqlite:///{tmp_path / 'mesh.db'}"
    nodes: list[zlink.Node] = []
    client: Any = None
    try:
        for node_id in ("n-a", "n-b"):
            config = zlink.NodeConfig(node_id=node_id, listen="tcp://127.0.0.1:0", store=store,
                                      workers=2)  # fmt: skip
            nodes.append(zlink.Node(build_app(), config).start())
        a, b = nodes
        until(lambda: a.peers() == ["n-b"] and b.peers() == ["n-a"], "the nodes met")
        ref = _made(a, "room")
        client = zlink.connect(b.address, timeout=WAIT)  # type: ignore[arg-type]
        assert client.spots.close(ref) is True
        until(lambda: _closed() == [("room", ref.object_generation, "n-a")], "closed on n-a")
        _made(a, "room2")
        other = zlink.SpotRef("room2", 7, ref.mesh_name, ref.node_rid)
        with pytest.raises(zlink.InvalidOperation, match="generation"):
            client.spots.close(other)
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.shutdown(timeout=WAIT)
