"""Several nodes in one process: the Location Store, routing and request/reply (§4, §14)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.mesh import wire
from zlink.mesh.location import InMemoryLocationStore
from zlink.mesh.transport import Channel, InProcessTransport
from zlink.messaging.completion import Completion
from zlink.testing import LocalCluster, ManualClock


class Add(zlink.Message, type_name="t.ms.add"):
    n: int


class Total(zlink.Request[int], type_name="t.ms.total"):
    pass


class Stall(zlink.Request[str], type_name="t.ms.stall"):
    pass


class Where(zlink.Request[str], type_name="t.ms.where"):
    pass


class Opaque(zlink.Request[Any], type_name="t.ms.opaque"):
    pass


class Note(zlink.Message, type_name="t.ms.note"):
    n: int


NOTES: list[int] = []


class IntReply(zlink.Request[int], type_name="t.ms.intreply"):
    how: str


class FloatReply(zlink.Request[float], type_name="t.ms.floatreply"):
    how: str


REPLIES: dict[str, Any] = {"true": True, "false": False, "one": 1, "half": 0.5, "text": "1"}

CREATED: list[str] = []
GATE = threading.Event()
STALLED = threading.Event()


class Blob(zlink.Message, type_name="t.ms.blob"):
    text: str


class BlobAsk(zlink.Request[str], type_name="t.ms.blobask"):
    text: str = ""
    reply_bytes: int = 0


def build_app() -> zlink.App:
    app = zlink.App("mesh")

    @app.user_spot("t.ms.room")
    class Room(zlink.UserSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.total = 0

        def on_create(self, request: Any) -> None:
            CREATED.append(self.context.spot_id)

        @zlink.handler
        def add(self, msg: Add) -> None:
            self.total += msg.n

        @zlink.handler
        def get_total(self, req: Total) -> int:
            return self.total

        @zlink.handler
        def stall(self, req: Stall) -> str:
            STALLED.set()
            assert GATE.wait(WAIT)
            return "late"

        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_ref.node_rid

        @zlink.handler
        def int_reply(self, req: IntReply) -> int:
            return REPLIES[req.how]  # type: ignore[no-any-return]

        @zlink.handler
        def float_reply(self, req: FloatReply) -> float:
            return REPLIES[req.how]  # type: ignore[no-any-return]

        @zlink.handler
        def blob(self, msg: Blob) -> None:
            self.total += 1

        @zlink.handler
        def blob_ask(self, req: BlobAsk) -> str:
            return "x" * req.reply_bytes

        @zlink.handler
        def opaque(self, req: Opaque) -> Any:
            return object()  # no JSON form: it cannot cross to another node

    @app.instance_spot("t.ms.counter")
    class Counter(zlink.InstanceSpot):
        def on_initialize(self) -> None:
            CREATED.append(f"instance:{self.context.spot_id}")

        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_ref.node_rid

    @app.entry_spot("t.ms.lobby", actor="t.ms.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.ms.player")
    class Player(zlink.Actor):
        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_id

        @zlink.handler
        def note(self, msg: Note) -> None:
            NOTES.append(msg.n)

    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    CREATED.clear()
    NOTES.clear()
    GATE.clear()
    STALLED.clear()


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2) as cluster:
        yield cluster
    GATE.set()


def test_a_spot_created_on_one_node_is_reached_from_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.ms.room").wait(WAIT)
    for node in (n1, n2, n3):
        node.client().send_to_spot("room", Add(n=1)).submit()
    cluster.wait_idle(WAIT)
    assert n3.client().request_to_spot("room", Total()).wait(WAIT) == 3
    assert n2.client().request_to_spot("room", Where()).wait(WAIT) == "node-1"
    assert "room" in n1._runtime.spots and "room" not in n2._runtime.spots


def test_only_the_owner_confirmed_by_the_store_runs_the_factory(cluster):
    calls = [n.client().spots.get_or_create("one", "t.ms.room").future() for n in cluster.nodes]
    results = [f.result(WAIT) for f in calls]
    assert CREATED == ["one"]
    assert len({r.spot_ref.object_generation for r in results}) == 1
    assert sum("one" in n._runtime.spots for n in cluster.nodes) == 1


def test_an_instance_spot_is_cold_activated_once_in_the_mesh(cluster):
    answers = {
        n.client().request_to_spot("c", Where()).instance_spot().wait(WAIT) for n in cluster.nodes
    }
    assert len(answers) == 1
    assert CREATED == ["instance:c"]


def test_an_actor_is_reached_from_every_node(cluster):
    n1, n2, _ = cluster.nodes
    pid = n1.client().actors.create("t.ms.player").wait(WAIT).actor_id
    assert n2.client().request_to_actor(pid, Where()).wait(WAIT) == "t.ms.lobby@node-1"
    assert n2.client().actors.get_or_create(pid, "t.ms.player").wait(WAIT).created is False


def test_a_call_of_the_wrong_kind_is_not_found_at_once_on_every_node(cluster):
    """A client probe: a call naming a Spot's id as an Actor's (or an Actor's as a Spot's)
    made the owner ask the store again and again, a CPU core busy until the call's deadline,
    and then failed with ``DeadlineExceeded``. It is ``NotFound`` at once, as for an id that
    names nothing (python-api §5): Spots and Actors share the Location Store's one id space."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("s1", "t.ms.room").wait(WAIT)
    pid = n1.client().actors.create("t.ms.player").wait(WAIT).actor_id
    for node in (n1, n2):  # the owner, and a node that asks the store
        client = node.client()
        with pytest.raises(zlink.NotFound, match="actor 's1'"):
            client.request_to_actor("s1", Where()).timeout(60).wait(WAIT)
        with pytest.raises(zlink.NotFound, match="actor 's1'"):
            client.send_to_actor("s1", Add(n=1)).wait(WAIT)
        with pytest.raises(zlink.NotFound, match=f"spot {pid!r}"):
            client.request_to_spot(pid, Total()).timeout(60).wait(WAIT)
    client.send_to_actor("s1", Add(n=1)).submit()  # no waiter: the store asked, it is dropped
    cluster.wait_idle(WAIT)
    assert n2.counters()["sends_dropped_not_found"] == 1
    assert n1.client().request_to_spot("s1", Total()).wait(WAIT) == 0  # both still serve
    assert n2.client().request_to_actor(pid, Where()).wait(WAIT) == "t.ms.lobby@node-1"
    assert not any(node.counters().get("late_replies") for node in cluster.nodes)


def _id_changed_kind(cluster: LocalCluster) -> tuple[zlink.Node, zlink.Node]:
    """node-2's path for Spot ``x`` (on node-1) outlives it: ``x`` then names an Actor there."""
    n1, n2, _ = cluster.nodes
    ref = n1.client().spots.get_or_create("x", "t.ms.room").wait(WAIT).spot_ref
    assert n2.client().request_to_spot("x", Total()).wait(WAIT) == 0  # node-2 caches a route
    assert n1.client().spots.close(ref)
    cluster.wait_idle(WAIT)
    assert n1.client().actors.create("t.ms.player", actor_id="x").wait(WAIT).created
    return n1, n2


def test_an_id_that_changed_kind_is_found_through_a_stale_route(cluster):
    """A review: a route cached for Spot ``x`` outlived the Spot; once ``x`` named an Actor,
    a node holding that route refused calls to the Actor with ``NotFound`` without asking the
    store. The store is asked; the path goes once it says the id changed kind."""
    _n1, n2 = _id_changed_kind(cluster)
    assert n2.client().request_to_actor("x", Where()).wait(WAIT) == "t.ms.lobby@node-1"
    n2.client().send_many_to_spot("x", [Add(n=1)]).submit()  # a batch: one by one, found not
    cluster.wait_idle(WAIT)
    assert (
        n2.counters().get("remote_sends_dropped_not_found", 0)
        + n2.counters().get("sends_dropped_not_found", 0)
        == 1
    )


def test_calls_for_an_id_that_changed_kind_wait_behind_one_store_question_in_order(cluster):
    """node-2's path for Spot ``x`` outlived it; ``x`` now names an Actor. Calls naming the
    Actor meet that path and wait, in order, behind one store question (python-api §9: the
    path of the Spot stays until the store says the id changed kind; then it goes); a caller
    that gives up meanwhile withdraws its send, nothing queued."""
    n1, n2 = _id_changed_kind(cluster)
    asked, answer, questions = threading.Event(), threading.Event(), []
    lookup = cluster.store.lookup

    def slow_lookup(target: str) -> Any:
        questions.append(target)
        asked.set()
        assert answer.wait(WAIT)
        return lookup(target)

    cluster.store.lookup = slow_lookup  # type: ignore[method-assign]
    client = n2.client()
    sent = [client.send_to_actor("x", Note(n=0)).future()]
    assert asked.wait(WAIT)
    with pytest.raises(zlink.DeadlineExceeded, match=r"within 0\.2 s"):
        client.send_to_actor("x", Note(n=-1)).wait(0.2)  # given up: withdrawn
    sent += [client.send_to_actor("x", Note(n=n)).future() for n in (1, 2, 3)]
    where = client.request_to_actor("x", Where()).future()
    answer.set()
    for future in sent:
        assert future.result(WAIT) is None
    assert where.result(WAIT) == "t.ms.lobby@node-1"
    cluster.wait_idle(WAIT)
    assert NOTES == [0, 1, 2, 3]
    assert questions[0] == "x" and n2._runtime.router._known("x").kind == "actor"
    assert n1.client().request_to_actor("x", Where()).wait(WAIT) == "t.ms.lobby@node-1"


def _one_id_space(client: zlink.Client, pid: str) -> None:
    """Through ``client``: Actor ``pid`` and Spot ``s1`` hold their ids against the other kind."""
    with pytest.raises(zlink.InvalidArgument, match=r"exists as actor 't\.ms\.player'"):
        client.spots.get_or_create(pid, "t.ms.room").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument, match=r"exists as spot 't\.ms\.room'"):
        client.actors.get_or_create("s1", "t.ms.player").wait(WAIT)
    with pytest.raises(zlink.InvalidOperation, match="exists already"):
        client.actors.create("t.ms.player", actor_id="s1").wait(WAIT)


def test_spots_and_actors_share_one_id_space_on_every_node(cluster):
    """A client probe: with Actor ``x`` on node-1, ``get_or_create`` of a Spot ``x`` through
    node-1 made a second object under ``x`` that the store never recorded (through node-2 it
    was refused). The Location Store has one id space; every node keeps to it."""
    n1, n2, _ = cluster.nodes
    pid = n1.client().actors.create("t.ms.player").wait(WAIT).actor_id
    n1.client().spots.get_or_create("s1", "t.ms.room").wait(WAIT)
    for node in (n1, n2):
        _one_id_space(node.client(), pid)
    assert n2.client().request_to_actor(pid, Where()).wait(WAIT) == "t.ms.lobby@node-1"
    assert n2.client().request_to_spot("s1", Total()).wait(WAIT) == 0
    assert n1._rt.spots.get(pid) is None and n1._rt.actors.get("s1") is None


def test_one_node_keeps_one_id_space_too():
    """As a mesh does (the test above): what works on one node works on several, unchanged."""
    with zlink.Node(build_app(), zlink.NodeConfig(workers=1)) as node:
        client = node.client()
        pid = client.actors.create("t.ms.player").wait(WAIT).actor_id
        client.spots.get_or_create("s1", "t.ms.room").wait(WAIT)
        _one_id_space(client, pid)
        with pytest.raises(zlink.NotFound, match="actor 's1'"):
            client.request_to_actor("s1", Where()).wait(WAIT)


def test_every_store_write_is_fenced_and_a_stale_owner_is_refused():
    store = InMemoryLocationStore()
    i1, i2, i3 = (store.register_node(f"node-{k}", "x", 60.0).incarnation for k in (1, 2, 3))
    first = store.reserve("s", "spot", "t", "node-1", i1)
    assert first.created and first.location.authority_generation == 1
    assert not store.reserve("s", "spot", "t", "node-2", i2).created  # owner stays node-1
    moved = store.transfer("s", "node-1", i1, 1, "node-2", i2)
    assert (moved.owner_node, moved.authority_generation) == ("node-2", 2)
    with pytest.raises(zlink.Unavailable, match="stale owner"):
        store.release("s", "node-1", i1, 1)  # node-1 lost authority
    with pytest.raises(zlink.Unavailable):
        store.transfer("s", "node-2", i2, 1, "node-3", i3)  # an old generation
    assert store.release("s", "node-2", i2, 2)
    assert store.lookup("s") is None


def test_a_cross_node_request_keeps_its_deadline_and_a_late_reply_is_counted(
    cluster, clock: ManualClock
):
    n1, n2, _ = cluster.nodes
    n2.client().spots.get_or_create("slow", "t.ms.room").wait(WAIT)
    call = n1.client().request_to_spot("slow", Stall()).timeout(2).future()
    assert STALLED.wait(WAIT)
    clock.advance(2)
    with pytest.raises(zlink.DeadlineExceeded):
        call.result(WAIT)
    GATE.set()
    cluster.wait_idle(WAIT)
    assert n1.counters().get("late_replies") == 1
    # timed out once, counted once, where it was made (a review found node-2 counting the
    # copy of its deadline it keeps as well)
    assert n1.counters().get("calls_timed_out") == 1
    assert not n2.counters().get("calls_timed_out")


def test_a_reply_reaches_its_caller_while_every_worker_of_that_node_is_blocked(clock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=1) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("busy", "t.ms.room").wait(WAIT)
        n2.client().spots.get_or_create("far", "t.ms.room").wait(WAIT)
        stuck = n1.client().request_to_spot("busy", Stall()).future()
        assert STALLED.wait(WAIT)  # node-1's only worker is now held
        far = n1.client().request_to_spot("far", Total()).future()
        assert far.result(WAIT) == 0  # completed by node-1's infrastructure thread
        assert not stuck.done()
        GATE.set()
        assert stuck.result(WAIT) == "late"


def test_a_bad_wire_payload_fails_only_that_request_and_is_counted(cluster):
    n1, n2, _ = cluster.nodes
    bad = wire.RequestEnvelope("spot", "x", "t.ms.total", "{not json", None, "node-1", "node-1",
                               "node-1", 0, False, None, 999, 5.0)  # fmt: skip
    n2._infra.submit(n2._runtime.router.received, "node-1", Channel.DATA, wire.encode(bad))
    cluster.wait_idle(WAIT)
    assert n2.counters()["bad_wire_payloads"] == 1
    assert n1.counters()["late_replies"] == 1  # node-1 had no such call waiting


def test_mesh_bad_input_is_typed(cluster):
    n1, n2, _ = cluster.nodes
    with pytest.raises(zlink.NotFound):
        n2.client().request_to_spot("nowhere", Total()).wait(WAIT)
    n1.client().spots.get_or_create("r", "t.ms.room").wait(WAIT)
    with pytest.raises(zlink.InvalidOperation):
        n2.client().actors.create("t.ms.player", actor_id="p").wait(WAIT)
        n1.client().actors.create("t.ms.player", actor_id="p").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument):
        zlink.Node(build_app(), store=InMemoryLocationStore())
    with pytest.raises(zlink.InvalidArgument):
        zlink.Node(build_app(), transport=InProcessTransport())


@pytest.mark.parametrize(
    "bad", ["\ud800", "é\udfff", "x" * 100 + "\ud800"], ids=["lone", "utf8", "long"]
)
def test_an_id_that_is_not_valid_utf8_is_refused_at_the_call_site_on_every_node(cluster, bad):
    """python-api §5: an id with no UTF-8 form (a lone surrogate) is ``InvalidArgument`` where
    the call is made, on any node; it never leaves a node to fail later (an untyped error, or
    an envelope counted undeliverable)."""
    n1, n2, _ = cluster.nodes
    with pytest.raises(zlink.InvalidArgument):
        n1.client().spots.get_or_create(bad, "t.ms.room")
    for node in (n1, n2):
        client = node.client()
        with pytest.raises(zlink.InvalidArgument):
            client.send_to_spot(bad, Add(n=1))
        with pytest.raises(zlink.InvalidArgument):
            client.request_to_spot(bad, Total())
        with pytest.raises(zlink.InvalidArgument):
            client.send_to_actor(bad, Add(n=1))
        with pytest.raises(zlink.InvalidArgument):
            client.actors.get_or_create(bad, "t.ms.player")
        with pytest.raises(zlink.InvalidArgument):
            client.request_to_spot(bad, Where()).instance_spot("t.ms.counter")
        with pytest.raises(zlink.InvalidArgument):
            client.send_to_spot("r", Add(n=1)).metadata("k", bad)
    cluster.wait_idle(WAIT)
    for node in cluster.nodes:
        assert node.counters().get("envelopes_undeliverable", 0) == 0


@pytest.mark.parametrize(
    "spot_id",
    ["룸-é-🎲", "é" * 127 + "x", "x" * 255, "room"],
    ids=["utf8", "255-utf8", "255", "ascii"],
)
def test_ids_of_valid_utf8_cross_nodes_intact(cluster, spot_id):
    """python-api §5: any valid id of 1..255 UTF-8 bytes (ascii or not, short or long) is
    taken, and reaches its Spot from another node unchanged."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create(spot_id, "t.ms.room").wait(WAIT)
    n2.client().send_to_spot(spot_id, Add(n=2)).submit()
    cluster.wait_idle(WAIT)
    assert n2.client().request_to_spot(spot_id, Total()).wait(WAIT) == 2
    actor_id = "a" + spot_id[1:]  # Spots and Actors share the store's names: not the Spot's
    n2.client().actors.create("t.ms.player", actor_id=actor_id).wait(WAIT)
    assert n1.client().request_to_actor(actor_id, Where()).wait(WAIT) == "t.ms.lobby@node-2"


@pytest.mark.parametrize("caller", [0, 1], ids=["same-node", "other-node"])
def test_a_reply_is_checked_strictly_against_the_requests_type(cluster, caller):
    """Execution-model §5 (a reply that cannot be encoded as ``T`` fails the call): a bool is
    not an int reply, though Python's bool is an int subclass; an int stays a valid float
    reply (as 1.0), and valid replies cross nodes as their ``T``."""
    n1 = cluster.node(0)
    n1.client().spots.get_or_create("typed", "t.ms.room").wait(WAIT)
    client = cluster.node(caller).client()
    for bad in ("true", "false", "half", "text"):
        with pytest.raises(zlink.HandlerError, match="not a valid"):
            client.request_to_spot("typed", IntReply(how=bad)).wait(WAIT)
    for bad in ("true", "text"):
        with pytest.raises(zlink.HandlerError, match="not a valid"):
            client.request_to_spot("typed", FloatReply(how=bad)).wait(WAIT)
    one = client.request_to_spot("typed", IntReply(how="one")).wait(WAIT)
    assert one == 1 and type(one) is int
    for how, value in (("one", 1.0), ("half", 0.5)):
        got = client.request_to_spot("typed", FloatReply(how=how)).wait(WAIT)
        assert got == value and type(got) is float


def test_bytes_that_do_not_decode_are_counted_and_a_reply_route_gets_a_typed_error(cluster):
    """Issue "The runtime, composed", item 3: an envelope that fails to decode is counted and
    answered with a typed error where it carries a reply route, never crashing a thread."""
    n1, n2, _ = cluster.nodes
    waiting = Completion()
    corr = n1._runtime.router.register_pending(waiting, None, "node-2")
    unknown_version = (
        b'{"version": 99, "kind": "request", "origin_node": "node-1", "correlation": %d}' % corr
    )
    router = n2._runtime.router
    for data in (b"\xff garbage", b'{"version": 1, "kind": "send"', unknown_version):
        n2._infra.submit(router.received, "node-1", Channel.DATA, data)
    with pytest.raises(zlink.InvalidArgument, match="version"):
        waiting.wait(WAIT)
    cluster.wait_idle(WAIT)
    assert n2.counters()["bad_envelopes"] == 3
    n1.client().spots.get_or_create("after", "t.ms.room").wait(WAIT)  # threads still serve
    assert n2.client().request_to_spot("after", Total()).wait(WAIT) == 0


def test_a_dropped_connection_alone_declares_no_node_down(cluster):
    """Issue "Node leases": no node is declared dead on a connection drop alone; its calls
    wait while the store still lists it (the manual clock never moves here)."""
    n1, _, _ = cluster.nodes
    waiting = Completion()
    n1._runtime.router.register_pending(waiting, None, "node-2")
    cluster.transport.detach("node-2")  # the connection drops; node-2's lease still holds
    cluster.wait_idle(WAIT)
    assert n1.counters()["peers_suspected"] == 1
    assert not waiting.done and "calls_failed_peer_down" not in n1.counters()
    waiting.set(None, None)


def test_calls_to_a_node_the_store_declares_down_fail_at_once(cluster):
    """python-api §10: calls in flight to a node declared down complete with Unavailable at
    once, not at their deadline: here node-2 leaves the store (its lease is gone) after its
    connection dropped; the next look at the store declares it down."""
    n1, n2, _ = cluster.nodes
    waiting = Completion()
    n1._runtime.router.register_pending(waiting, None, "node-2")
    assert cluster.store.unregister_node("node-2", n2.incarnation)
    cluster.transport.detach("node-2")  # n1 suspects it, asks the store: it is gone
    with pytest.raises(zlink.Unavailable, match="node-2"):
        waiting.wait(WAIT)
    assert n1.counters()["calls_failed_peer_down"] == 1
    assert n1.counters()["peers_declared_down"] == 1


def test_a_node_that_leaves_cleanly_is_not_logged_as_declared_down(cluster, caplog):
    """A service probe: every clean stop of a peer was logged on the others at WARNING as
    "the store declares node ... down", as a crash is; it said goodbye: INFO, "left". A node
    that vanished without one is still a warning."""
    import logging

    n1, n2, n3 = cluster.nodes
    with caplog.at_level(logging.INFO, logger="zlink"):
        n2.shutdown(WAIT)  # unregisters, says goodbye
        cluster.wait_idle(WAIT)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not [m for m in warned if "node-2" in m], warned
        assert "node node-1: node node-2 left the mesh" in caplog.text
        assert n1.counters()["peers_declared_down"] == 1  # counted as before
        caplog.clear()
        assert cluster.store.unregister_node("node-3", n3.incarnation)
        cluster.transport.detach("node-3")  # no goodbye: a connection that dropped
        cluster.wait_idle(WAIT)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert "node node-1: the store declares node node-3 down" in warned


def test_a_paused_peer_never_holds_a_reply_back(cluster):
    """Seed §4, §16: replies travel on COMPLETION, which is never paused; DATA from a paused
    peer waits, in order, and flows again on resume."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("p", "t.ms.room").wait(WAIT)
    cluster.transport.pause("node-2", "node-1")  # node-2 takes no DATA from node-1 now
    assert n2.client().request_to_spot("p", Total()).wait(WAIT) == 0  # reply: COMPLETION
    cluster.transport.pause("node-1", "node-2")  # and node-1 none from node-2
    held = n2.client().request_to_spot("p", Total()).future()
    cluster.wait_idle(WAIT)
    assert not held.done()  # its request waits as DATA
    cluster.transport.resume("node-1", "node-2")
    assert held.result(WAIT) == 0
    cluster.transport.resume("node-2", "node-1")


def test_a_reply_that_cannot_be_encoded_fails_the_remote_caller_at_once(cluster):
    """Execution-model §5 (a reply-encoding failure): the caller on another node gets
    HandlerError at once, not its timeout (the manual clock never moves here)."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("o", "t.ms.room").wait(WAIT)
    with pytest.raises(zlink.HandlerError):
        n2.client().request_to_spot("o", Opaque()).wait(WAIT)
    assert n1.counters()["reply_encoding_failures"] == 1


def test_an_undeliverable_relayed_call_fails_its_own_caller_not_a_local_one(cluster):
    """A relayed request keeps its origin's correlation id; when its next hop is gone, the
    failure goes back to that origin, never to this node's own call with the same number."""
    n1, _, n3 = cluster.nodes
    ours = Completion()
    corr = n1._runtime.router.register_pending(ours, None, "node-2")
    theirs = Completion()
    assert n3._runtime.router.register_pending(theirs, None, "node-1") == corr  # same number
    relayed = wire.RequestEnvelope("spot", "x", "t.ms.total", "{}", None, "node-3", "node-3",
                                   "node-1", 1, False, None, corr, 5.0)  # fmt: skip
    n1._infra.submit(
        n1._runtime.router._undeliverable, "node-9", relayed, zlink.Unavailable("gone")
    )
    with pytest.raises(zlink.Unavailable, match="gone"):
        theirs.wait(WAIT)  # node-3's caller hears at once
    cluster.wait_idle(WAIT)
    assert not ours.done  # node-1's own call is untouched


def test_a_failing_undeliverable_handler_does_not_stop_the_outbox(cluster):
    """One envelope whose failure handling raises neither loses the envelopes behind it nor
    leaves the outbox waiting for a flush that never comes."""
    n1, n2, _ = cluster.nodes
    n2.client().spots.get_or_create("q", "t.ms.room").wait(WAIT)
    outbox = n1._runtime.router.outbox
    real = outbox._failed

    def explode(*args: Any) -> None:
        real(*args)
        raise RuntimeError("a callback failed")

    outbox._failed = explode
    outbox.put("node-9", wire.RouteEnvelope("q", "node-2", 1, 1))  # unknown peer: fails
    assert n1.client().request_to_spot("q", Total()).wait(WAIT) == 0  # later ones still go
    outbox._failed = real


def test_a_call_the_receiving_node_fails_to_take_gets_a_typed_error_not_a_timeout(cluster):
    """The infrastructure thread survives any exception of a task and counts it (python-api
    §9); a request that met one answers ``Unavailable`` at once instead of leaving its caller
    to wait out the deadline (a fault in the intake of a remote call, found in a soak)."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("room", "t.ms.room").wait(WAIT)
    real = n1._runtime.submit

    def broken(*args: object, **kwargs: object) -> object:
        if kwargs.get("hops"):  # a call that came from another node
            raise RuntimeError("a bug in the intake")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    n1._runtime.submit = broken  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(zlink.Unavailable, match="could not take"):
        n2.client().request_to_spot("room", Total()).timeout(60.0).wait(WAIT)
    assert time.monotonic() - started < WAIT
    n2.client().send_to_spot("room", Add(n=1)).submit()
    cluster.wait_idle(WAIT)
    assert n1.counters()["call_intake_errors"] == 2
    assert n1.counters()["sends_dropped_intake_error"] == 1


def test_a_message_too_large_for_a_frame_between_nodes_is_refused_at_the_call_site(
    cluster, monkeypatch
):
    """A service probe: past the frame limit (64 MiB) a one-way send to another node was
    accepted, then dropped by the outbox as "unreachable", counted at the source only; its
    sender had been told it was queued (python-api §9: refused at the source, nothing
    queued, or handled)."""
    from zlink.mesh import wire

    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 64 * 1024)
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("far", "t.ms.room").wait(WAIT)
    c2 = n2.client()
    big = "x" * (80 * 1024)
    for send in (lambda: c2.send_to_spot("far", Blob(text=big)).submit(),
                 lambda: c2.send_to_spot("far", Blob(text=big)).wait(WAIT),
                 lambda: c2.request_to_spot("far", BlobAsk(text=big)).wait(WAIT)):  # fmt: skip
        with pytest.raises(zlink.InvalidArgument, match="frame"):
            send()
    c2.send_to_spot("far", Blob(text="small")).wait(WAIT)
    assert c2.request_to_spot("far", Total()).wait(WAIT) == 1  # only the small one
    assert not any(k.startswith("sends_dropped") for k in n2.counters())


def test_a_reply_too_large_for_a_frame_fails_its_caller_at_once(cluster, monkeypatch):
    """A service probe: a reply past the frame limit was dropped by the replying node, and
    its caller waited out its whole timeout for ``DeadlineExceeded`` ("the handler may still
    run", though it ran). It is a reply-encoding failure: ``HandlerError`` at once (§5)."""
    from zlink.mesh import wire

    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 64 * 1024)
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("far", "t.ms.room").wait(WAIT)
    ask = n2.client().request_to_spot("far", BlobAsk(reply_bytes=80 * 1024))
    with pytest.raises(zlink.HandlerError, match="frame"):
        ask.wait(WAIT)  # (the cluster's clock never moves: no deadline passes)
    small = n2.client().request_to_spot("far", BlobAsk(reply_bytes=10)).wait(WAIT)
    assert small == "x" * 10


def test_data_lost_with_a_peers_session_counts_each_one_way_message_as_a_send_dropped(cluster):
    """python-api §9: every drop is counted with its reason. DATA that a session with a
    peer ended with (``NodeLink.data_lost``) counts each one-way message it carried, a
    batch's each, as ``sends_dropped_peer_gone`` (in the stop summary's losses); a request
    (its caller fails when the peer is declared down) and bytes that do not decode count as
    ``frames_dropped_peer_down``."""
    from zlink.messaging.calls import RequestCall, SendCall
    from zlink.status import losses
    from zlink.types import TargetKind

    n1 = cluster.node(0)
    router = n1._runtime.router
    send = router.envelope(SendCall(n1._runtime, TargetKind.SPOT, "r", Add(n=1)), None)
    ask = router.envelope(
        RequestCall(n1._runtime, TargetKind.SPOT, "r", Total()), Completion(), peer="node-2"
    )
    batch = wire.BatchEnvelope("spot", "r", ("t.ms.add",) * 3, ('{"n":1}',) * 3,
                               "node-1", "node-1", "node-1", 0)  # fmt: skip
    bodies = [wire.encode(e) for e in (send, ask, batch)] + [b"not an envelope"]
    router.data_lost("node-2", bodies)  # never sent
    counters = n1.counters()
    assert counters.get("sends_dropped_peer_gone") == 4
    assert counters.get("frames_dropped_peer_down") == 2
    assert losses(counters)["dropped"] == {"peer_gone": 4}
    router.data_lost("node-2", bodies[:1], maybe_arrived=True)  # sent, never acknowledged
    assert losses(n1.counters())["unacknowledged"] == {"peer_gone": 1}
