"""Work caught mid-flight by a node's death ends, never hangs (python-api §10 "Failure", §11;
execution-model §5, §14; issue 14 "Work caught mid-flight by a death ends, never hangs").

Each test holds a move or a Join at one step, then the other node dies: it leaves the store
and the transport (``_declare_down``), the survivors suspect it, ask the store and declare it
down at once. The manual clock never moves, so nothing here ends by a deadline: what ends,
ends because the store declared the peer down. Then the survivor's state is checked:

* a move leaving a node whose target died before the commit is aborted on the source: seal
  lifted, admission restored exactly, the queue (and what was parked) served there in order,
  the caller of the move gets ``Unavailable``;
* a move whose commit happened stays moved: the caller gets ``Unavailable``, the target
  owned the Spot, and the store re-homes it on its next call;
* a move arriving from a source that died before the commit is forgotten (the calls kept
  for it go on by the store, which re-homes the Spot), or, if the store says the commit did
  happen, opened;
* a Join whose Spot's node died completes as failed and the Actor stays in its Entry Spot;
  a Join whose Actor never arrives leaves no member pending in the Spot;
* a route fence through a dead node ends, and the calls kept behind it go by the store.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.mesh import wire
from zlink.testing import LocalCluster, ManualClock


class Add(zlink.Message, type_name="t.md.add"):
    sender: str
    seq: int


class Seen(zlink.Request[dict[str, list[int]]], type_name="t.md.seen"):
    pass


class Ready(zlink.Message, type_name="t.md.ready"):
    pass


class Enter(zlink.Message, type_name="t.md.enter"):
    room: str


class Mark(zlink.Message, type_name="t.md.mark"):
    n: int


class Info(zlink.Request[str], type_name="t.md.info"):
    pass


HANDLED: list[tuple[str, str, str, int]] = []  # (node, spot, sender, seq), every node
EVENTS: list[str] = []
DONE: list[zlink.ActorJoinCompletion] = []
COMPLETED = threading.Semaphore(0)
HOLD_RESTORES = threading.Event()  # while set, every restore waits for RESTORE_GO
RESTORING = threading.Event()
RESTORE_GO = threading.Event()
HOLD_ASKS = threading.Event()  # while set, on_actor_join waits for ASK_GO
ASKED = threading.Event()
ASK_GO = threading.Event()


def _node(context: Any) -> str:
    return context._rt.node_id  # type: ignore[no-any-return]


class SlowRestore(zlink.JsonStateAdapter):
    """A restore that, while ``HOLD_RESTORES`` is set, waits for the test first."""

    def restore(self, instance: Any, data: bytes) -> None:
        if HOLD_RESTORES.is_set():
            RESTORING.set()
            assert RESTORE_GO.wait(WAIT)
        super().restore(instance, data)


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: dict[str, list[int]] = {}

    @zlink.handler
    def add(self, msg: Add) -> None:
        HANDLED.append((_node(self.context), self.context.spot_id, msg.sender, msg.seq))
        self.seen.setdefault(msg.sender, []).append(msg.seq)

    @zlink.handler
    def get_seen(self, req: Seen) -> dict[str, list[int]]:
        return self.seen

    @zlink.handler
    def ready(self, msg: Ready) -> None:
        self.context.relocation_ready().defer()

    def on_relocation_ready_completed(
        self, completion: zlink.SpotRelocationReadyCompletion
    ) -> None:
        error = "" if completion.error is None else f":{type(completion.error).__name__}"
        EVENTS.append(f"{completion.status.name}@{completion.node_id}{error}")

    def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
        EVENTS.append(f"join?@{_node(self.context)}")
        if HOLD_ASKS.is_set():
            ASKED.set()
            assert ASK_GO.wait(WAIT)
        return zlink.ActorJoinResult()

    def on_joined_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"joined@{_node(self.context)}:{self.context.spot_id}")

    def on_leave_actor(self, actor: zlink.Actor) -> None:
        EVENTS.append(f"left@{_node(self.context)}:{self.context.spot_id}")


class Player(zlink.Actor):
    def __init__(self, context: zlink.ActorContext) -> None:
        super().__init__(context)
        self.marks: list[int] = []

    @zlink.handler
    def enter(self, msg: Enter) -> None:
        self.context.join(msg.room).defer()

    @zlink.handler
    def mark(self, msg: Mark) -> None:
        self.marks.append(msg.n)

    @zlink.handler
    def info(self, req: Info) -> str:
        return f"{_node(self.context)}:{self.context.spot_id}:{self.marks}"

    def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
        EVENTS.append(f"completed@{_node(self.context)}:{completion.joined}")
        DONE.append(completion)
        COMPLETED.release()


def build_app() -> zlink.App:
    app = zlink.App("midflight")
    slow = zlink.Relocation.preserve_state(SlowRestore)
    app.user_spot("t.md.room", relocation=slow)(Room)
    app.user_spot(
        "t.md.signaled", relocation=slow,
        relocation_coordination=zlink.RelocationCoordination.APPLICATION_SIGNALED,
    )(type("Signaled", (Room,), {}))  # fmt: skip
    app.entry_spot("t.md.lobby", actor="t.md.player")(type("Lobby", (zlink.EntrySpot,), {}))
    app.actor("t.md.player", relocation=slow)(Player)
    return app


DEAD: list[zlink.Node] = []  # declared down: stopped first, and briefly (see ``cluster``)


@pytest.fixture(autouse=True)
def _reset() -> None:
    DEAD.clear()
    HANDLED.clear()
    EVENTS.clear()
    DONE.clear()
    while COMPLETED.acquire(blocking=False):
        pass
    for event in (HOLD_RESTORES, RESTORING, RESTORE_GO, HOLD_ASKS, ASKED, ASK_GO):
        event.clear()


@pytest.fixture
def cluster(clock: ManualClock) -> Iterator[LocalCluster]:
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=60.0) as c:
        try:
            yield c
        finally:  # nothing a dead node holds may keep the shutdown waiting
            RESTORE_GO.set()
            ASK_GO.set()
            for node in DEAD:  # a node that "died" still runs here, cut off: what its stop
                node.shutdown(1.0)  # would wait for (a move's end, a peer's answer) never
                # comes, and a dead process has no stop to wait through


def _declare_down(cluster: LocalCluster, node: zlink.Node) -> None:
    """``node`` dies: it leaves the store (its lease is gone) and the transport; the others
    suspect it, ask the store, and declare it down at once (python-api §10 "Failure")."""
    assert cluster.store.unregister_node(node.node_id, node.incarnation)
    cluster.transport.detach(node.node_id)
    DEAD.append(node)


def _wait_idle(*nodes: zlink.Node) -> None:
    for _ in range(3):
        for node in nodes:
            assert node.wait_idle(WAIT)


class Mover:
    """``node.relocate_spot`` on a thread of its own; ``sealed`` is set once the seal is on."""

    def __init__(self, node: zlink.Node, spot_id: str, target: str) -> None:
        self.sealed = threading.Event()
        self.outcome: list[BaseException | None] = []
        relocator = node._runtime.relocator
        seal = relocator.seal

        def sealing(*args: Any, **kwargs: Any) -> None:
            seal(*args, **kwargs)
            self.sealed.set()

        relocator.seal = sealing

        def move() -> None:
            try:  # a deadline far away: the move must end by the store's verdict, not by it
                node.relocate_spot(spot_id, target, timeout=60.0)
            except zlink.ZLinkError as exc:
                self.outcome.append(exc)
            else:
                self.outcome.append(None)

        self.thread = threading.Thread(target=move, daemon=True)
        self.thread.start()

    def result(self) -> BaseException | None:
        self.thread.join(WAIT)
        assert self.outcome, "relocate_spot did not return"
        return self.outcome[0]


class Senders:
    """One sender on each of ``nodes``, each numbering its messages from 0."""

    def __init__(self, nodes: list[zlink.Node], spot_id: str) -> None:
        self.clients = {node.node_id: node.client() for node in nodes}
        self.spot_id = spot_id
        self.sent = dict.fromkeys(self.clients, 0)

    def send(self, count: int, only: str | None = None) -> None:
        for name, client in self.clients.items():
            if only is not None and name != only:
                continue
            for _ in range(count):
                client.send_to_spot(self.spot_id, Add(sender=name, seq=self.sent[name])).submit()
                self.sent[name] += 1

    def check_handled_once_in_order_on(self, node_id: str) -> None:
        """Every message handled once, per sender in the order sent, all on ``node_id``."""
        mine = [h for h in HANDLED if h[1] == self.spot_id]
        assert {h[0] for h in mine} == {node_id}
        for name, sent in self.sent.items():
            assert [h[3] for h in mine if h[2] == name] == list(range(sent)), name
        assert not [h for h, n in Counter(mine).items() if n > 1]


def _hold(node: zlink.Node, kind: type[Any]) -> threading.Event:
    """``node`` takes envelopes of ``kind`` from now on and does nothing with them: the
    moment a node dies with one on its way. The event is set when one came."""
    came = threading.Event()
    node._runtime.router.handle(kind, lambda _env: came.set())
    return came


def _player(node: zlink.Node) -> str:
    client = node.client()
    pid: str = client.actors.create("t.md.player").wait(WAIT).actor_id
    client.send_to_actor(pid, Mark(n=1)).submit()
    return pid


def _no_moves_left(node: zlink.Node) -> None:
    relocator = node._runtime.relocator
    assert relocator._out == {} and relocator._out_ids == {}
    assert relocator._in == {} and relocator._in_ids == {} and relocator._chunks == {}


# -- a move leaving a node whose target dies ------------------------------------------------------
def test_a_move_whose_target_dies_while_it_restores_is_aborted_and_served_on_the_source(cluster):
    """The target dies before the commit: the move is aborted on the source at once (not at
    its deadline); the Spot serves there with its queue intact (what was queued before the
    seal, its queued request answered there, once; then what was parked; then what came
    after), admission restored exactly; the caller of the move gets ``Unavailable``."""
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n1, n3], "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["room"]
    assert act.gate._flag.acquire(False)  # hold the gate: these wait in the source's queue
    senders.send(10)
    asked = n3.client().request_to_spot("room", Seen()).future()  # queued, with a reply
    cluster.wait_idle(WAIT)
    HOLD_RESTORES.set()
    mover = Mover(n1, "room", "node-2")
    assert mover.sealed.wait(WAIT)
    senders.send(10)  # parked at the seal
    mine = n1.client().request_to_spot("room", Seen()).future()  # parked; awaited from node-2
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn: the queue leaves for node-2
    assert RESTORING.wait(WAIT)  # node-2 restores, and dies doing it
    senders.send(10)  # parked at the source
    _declare_down(cluster, n2)
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "node-2" in str(error), error
    RESTORE_GO.set()  # the dead node's restore ends: nothing of it reaches the living
    senders.send(10)  # admission is back on the source
    _wait_idle(n1, n3)
    assert asked.result(WAIT)["node-3"] == list(range(11))  # answered once, by the source
    assert mine.result(WAIT)["node-1"] == list(range(21))  # not failed with node-2
    assert n1.counters().get("calls_failed_peer_down", 0) == 0
    senders.check_handled_once_in_order_on("node-1")
    assert act.state.value == "ready" and n1._runtime.spots["room"] is act
    assert cluster.store.lookup("room").owner_node == "node-1"
    assert n1.counters().get("relocated_out", 0) == 0
    _wait_idle(n1, n3)  # the reply is set before its turn gives its reservation back
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)
    _no_moves_left(n1)


def test_a_move_whose_target_dies_before_its_barrier_is_withdrawn_at_once(cluster):
    """The target dies while the move waits for its barrier behind a running turn: withdrawn
    at once; the barrier turn, when it comes, does nothing; all runs on the source."""
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n1, n3], "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["room"]
    assert act.gate._flag.acquire(False)
    senders.send(5)
    mover = Mover(n1, "room", "node-2")
    assert mover.sealed.wait(WAIT)
    senders.send(5)  # parked at the seal
    _declare_down(cluster, n2)
    assert isinstance(mover.result(), zlink.Unavailable)  # while the barrier still waits
    assert act.state.value == "ready"
    senders.send(5)
    n1._runtime.pool.submit(act.gate._run)
    _wait_idle(n1, n3)
    senders.check_handled_once_in_order_on("node-1")
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)
    _no_moves_left(n1)


def test_a_signaled_move_waiting_for_its_boundary_ends_when_its_target_dies(cluster):
    """An APPLICATION_SIGNALED move still waiting for the Spot's boundary ends with
    ``Unavailable`` as its target dies; the boundary, when it comes, says CONTINUED."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("sig", "t.md.signaled").wait(WAIT)
    moving = n1._runtime.relocator.start(n1._runtime.spots["sig"], "node-2")
    _declare_down(cluster, n2)
    with pytest.raises(zlink.Unavailable, match="node-2"):
        moving.wait(WAIT)
    c1.send_to_spot("sig", Ready()).submit()
    c1.send_to_spot("sig", Add(sender="x", seq=0)).submit()
    assert c1.request_to_spot("sig", Seen()).wait(WAIT) == {"x": [0]}
    assert EVENTS == ["CONTINUED@node-1"]
    _no_moves_left(n1)


def test_a_move_whose_target_dies_after_the_commit_stays_moved_and_is_rehomed(cluster):
    """The commit happened, then the target died before it opened the Spot: the move stays
    done (the target owned it), its caller gets ``Unavailable`` at once, and the Spot is
    re-homed by the store on its next call (a new generation; its state went with node-2)."""
    n1, n2, n3 = cluster.nodes
    made = n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    Senders([n1, n3], "room").send(3)
    cluster.wait_idle(WAIT)
    commit = _hold(n2, wire.RelocCommitEnvelope)  # node-2 dies as the commit reaches it
    mover = Mover(n1, "room", "node-2")
    assert commit.wait(WAIT)
    found = cluster.store.lookup("room")
    assert found is not None and found.owner_node == "node-2"
    _declare_down(cluster, n2)
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "commit" in str(error), error
    assert "room" not in n1._runtime.spots
    _no_moves_left(n1)
    assert n3.client().request_to_spot("room", Seen()).wait(WAIT) == {}  # re-homed, fresh
    again = cluster.store.lookup("room")
    assert again is not None and again.owner_node in ("node-1", "node-3")
    assert again.object_generation > made.spot_ref.object_generation


def test_a_commit_the_store_refuses_because_the_target_lost_its_lease_aborts_the_move(cluster):
    """The target's lease lapsed after it restored, before the store moved authority: the
    store refuses the commit (``holds no lease``), so the move did not happen: the Spot
    serves on the source with its queue intact, and the target forgets its copy."""
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n1, n3], "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["room"]
    assert act.gate._flag.acquire(False)
    senders.send(5)
    asked = n1.client().request_to_spot("room", Seen()).future()
    cluster.wait_idle(WAIT)
    HOLD_RESTORES.set()
    mover = Mover(n1, "room", "node-2")
    assert mover.sealed.wait(WAIT)
    senders.send(5)
    n1._runtime.pool.submit(act.gate._run)
    assert RESTORING.wait(WAIT)
    assert cluster.store.unregister_node("node-2", n2.incarnation)  # still connected
    RESTORE_GO.set()
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "no lease" in str(error), error
    senders.send(5)
    cluster.wait_idle(WAIT)
    assert asked.result(WAIT)["node-1"] == list(range(6))
    senders.check_handled_once_in_order_on("node-1")
    assert act.state.value == "ready" and cluster.store.lookup("room").owner_node == "node-1"
    assert "room" not in n2._runtime.spots and n2.counters()["relocations_forgotten"] == 1
    cluster.wait_idle(WAIT)
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)
    _no_moves_left(n1)
    _no_moves_left(n2)


class _StoreGate:
    """``cluster.store.transfer`` as node-1's store thread calls it waits for ``go`` (after
    the real transfer if ``after``): a commit at the store when a verdict comes."""

    def __init__(self, cluster: LocalCluster, after: bool) -> None:
        self.at = threading.Event()
        self.go = threading.Event()
        real = cluster.store.transfer

        def transfer(*args: Any) -> Any:
            if threading.current_thread().name != "zlink-store-node-1":
                return real(*args)
            if after:
                moved = real(*args)
            self.at.set()
            assert self.go.wait(WAIT)
            return moved if after else real(*args)

        cluster.store.transfer = transfer  # type: ignore[method-assign]


def _verdict(node: zlink.Node, peer: str) -> None:
    """The store's verdict on ``peer`` reaches ``node`` now (its membership's poll)."""
    given = threading.Event()

    def declare() -> None:
        node._runtime.router.declared_down(peer)
        given.set()

    node._infra.submit(declare)
    assert given.wait(WAIT)


def _sealed_with_traffic(cluster: LocalCluster) -> tuple[Senders, Any, Any, Mover]:
    """A Spot "room" on node-1, a queue behind its gate (a request from node-3 among it), its move
    to node-2 sealed with calls parked (node-1's own request among them), node-2 restoring."""
    n1, _n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n1, n3], "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["room"]
    assert act.gate._flag.acquire(False)
    senders.send(5)
    queued = n3.client().request_to_spot("room", Seen()).future()
    cluster.wait_idle(WAIT)
    HOLD_RESTORES.set()
    mover = Mover(n1, "room", "node-2")
    assert mover.sealed.wait(WAIT)
    senders.send(5)
    parked = n1.client().request_to_spot("room", Seen()).future()
    n1._runtime.pool.submit(act.gate._run)
    assert RESTORING.wait(WAIT)
    return senders, queued, parked, mover


def test_a_target_declared_down_while_the_store_refuses_the_commit_leaves_the_spot_here(cluster):
    """The verdict on the target comes while the store is asked to commit (the parked calls
    relayed to the target already); the store refuses (the target holds no lease): the move
    did not happen. What was relayed is served here, once (the target, told, drops its copies),
    the queued and parked requests are answered here, not failed with the target."""
    n1, n2, _ = cluster.nodes
    gate = _StoreGate(cluster, after=False)
    senders, queued, parked, mover = _sealed_with_traffic(cluster)
    RESTORE_GO.set()
    assert gate.at.wait(WAIT)  # the parked calls went to node-2; the store is asked
    assert cluster.store.unregister_node("node-2", n2.incarnation)
    _verdict(n1, "node-2")
    gate.go.set()  # the store refuses: node-2 holds no lease
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "no lease" in str(error), error
    senders.send(5)
    cluster.wait_idle(WAIT)
    assert queued.result(WAIT)["node-3"] == list(range(6))
    assert parked.result(WAIT)["node-1"] == list(range(11))
    senders.check_handled_once_in_order_on("node-1")
    act = n1._runtime.spots["room"]
    assert act.state.value == "ready" and cluster.store.lookup("room").owner_node == "node-1"
    assert "room" not in n2._runtime.spots and n2.counters()["relocations_forgotten"] == 1
    assert n1.counters().get("calls_failed_peer_down", 0) == 0
    cluster.wait_idle(WAIT)
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)
    _no_moves_left(n1)
    _no_moves_left(n2)
    # the requests node-1 relayed, which node-2 let go as it forgot the move, are answered
    # by node-1: none is left open on node-2 (its stop waited its whole time for one)
    assert n2._runtime.router._unanswered == 0


def test_a_target_declared_down_while_the_store_commits_leaves_the_spot_moved(cluster):
    """The verdict on the target comes while the store commits the move, and the commit went
    through: the move stays done, its caller and the requests the target was to answer get
    ``Unavailable``; the store re-homes the Spot on its next call."""
    n1, n2, n3 = cluster.nodes
    gate = _StoreGate(cluster, after=True)
    _senders, queued, parked, mover = _sealed_with_traffic(cluster)
    moved = n1._runtime.spots["room"]
    RESTORE_GO.set()
    assert gate.at.wait(WAIT)
    assert cluster.store.unregister_node("node-2", n2.incarnation)
    _verdict(n1, "node-2")
    gate.go.set()
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "committed" in str(error), error
    for request in (queued, parked):
        with pytest.raises(zlink.Unavailable):
            request.result(WAIT)
    # the activation that moved left node-1 (CI on 3.13 once found "room" there again: a
    # call made on node-1 after the commit may re-home it there, fresh, as on any node)
    assert n1._runtime.spots.get("room") is not moved and moved.state.value == "gone"
    _no_moves_left(n1)
    assert n3.client().request_to_spot("room", Seen()).wait(WAIT) == {}  # re-homed, fresh


def test_a_target_unreachable_when_its_answer_comes_leaves_the_spot_here(cluster):
    """The target's connection dropped (suspected, not yet declared down) just as its answer
    came: the parked calls cannot follow it, so the move is aborted before its commit, not
    left half relayed; everything is served on the source, once, in order."""
    n1, n2, n3 = cluster.nodes
    senders, queued, parked, mover = _sealed_with_traffic(cluster)
    cluster.transport.detach("node-2")  # node-1 cannot send to it; it still sends
    DEAD.append(n2)
    RESTORE_GO.set()  # its answer reaches node-1
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "not reachable" in str(error), error
    senders.send(5)
    _wait_idle(n1, n3)
    assert queued.result(WAIT)["node-3"] == list(range(6))
    assert parked.result(WAIT)["node-1"] == list(range(11))
    senders.check_handled_once_in_order_on("node-1")
    assert n1._runtime.spots["room"].state.value == "ready"
    assert cluster.store.lookup("room").owner_node == "node-1"
    _no_moves_left(n1)


# -- a move arriving from a source that dies ------------------------------------------------------
def test_an_arriving_move_whose_source_dies_before_the_commit_is_forgotten(cluster):
    """The source dies after the target restored, before it committed: the target forgets
    its copy; the calls it kept for the Spot go on by the store, which re-homes the Spot
    (a new generation); the request among them is answered there, nothing is run twice."""
    n1, n2, n3 = cluster.nodes
    made = n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n2, n3], "room")
    senders.send(1)  # node-2 and node-3 route "room" to node-1 now
    cluster.wait_idle(WAIT)
    restored = _hold(n1, wire.RelocDoneEnvelope)  # node-1 dies before it can commit
    moving = n1._runtime.relocator.start(n1._runtime.spots["room"], "node-2")
    assert restored.wait(WAIT)
    senders.send(5, only="node-2")  # made on the target: kept there until the move settles
    asked = n2.client().request_to_spot("room", Seen()).future()
    _wait_idle(n2, n3)
    assert not asked.done() and not moving.done
    _declare_down(cluster, n1)
    seen = asked.result(WAIT)  # the re-homed Spot: fresh, with what node-2 kept, in order
    assert seen == {"node-2": [1, 2, 3, 4, 5]}
    assert n2.counters()["relocations_forgotten"] == 1
    again = cluster.store.lookup("room")
    assert again is not None and again.owner_node == "node-2"
    assert again.object_generation > made.spot_ref.object_generation
    _wait_idle(n2, n3)
    _no_moves_left(n2)


def test_an_arriving_move_whose_source_died_after_the_commit_opens_from_the_store(cluster):
    """The source committed authority in the store and died before its commit message
    reached the target: the target asks the store, finds the Spot is its own, and opens it,
    with the state that moved and the calls it kept."""
    n1, n2, n3 = cluster.nodes
    made = n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n1, n2, n3], "room")
    senders.send(2)
    cluster.wait_idle(WAIT)
    commit = _hold(n2, wire.RelocCommitEnvelope)  # lost with node-1
    n1._runtime.relocator.start(n1._runtime.spots["room"], "node-2")
    assert commit.wait(WAIT)
    senders.send(3, only="node-2")  # kept on node-2 until the move settles
    asked = n2.client().request_to_spot("room", Seen()).future()
    _wait_idle(n2, n3)
    assert not asked.done()
    _declare_down(cluster, n1)
    seen = asked.result(WAIT)
    assert seen == {"node-1": [0, 1], "node-2": [0, 1, 2, 3, 4], "node-3": [0, 1]}
    act = n2._runtime.spots["room"]
    assert act.state.value == "ready"
    assert act.ref.object_generation == made.spot_ref.object_generation  # moved, not re-homed
    assert n2.counters()["relocated_in"] == 1
    _wait_idle(n2, n3)
    _no_moves_left(n2)


def test_an_arriving_move_whose_source_died_between_its_commit_writes_opens_whole(cluster):
    """The source moved the Spot's authority in the store, then died before its member's:
    the target finds the Spot is its own, claims the member from the dead source, and opens
    the Spot with its member."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    pid = _player(n1)
    n1.client().send_to_actor(pid, Enter(room="room")).submit()
    assert COMPLETED.acquire(timeout=WAIT) and DONE[-1].joined
    cluster.wait_idle(WAIT)
    real = cluster.store.transfer
    died = threading.Event()

    def dies_between(spot_id: str, *args: Any) -> Any:
        if spot_id == pid and threading.current_thread().name == "zlink-store-node-1":
            died.set()  # (node-1 lives on here: it asks the store again, and fails again,
            raise zlink.Unavailable("node-1 died here")  # as a dead node would not)
        return real(spot_id, *args)

    cluster.store.transfer = dies_between  # type: ignore[method-assign]
    n1._runtime.relocator.start(n1._runtime.spots["room"], "node-2")
    assert died.wait(WAIT)
    _declare_down(cluster, n1)
    info = n2.client().request_to_actor(pid, Info()).wait(WAIT)
    assert info == "node-2:room:[1]"
    assert n2._runtime.spots["room"].members.keys() == {pid}
    assert cluster.store.lookup(pid).owner_node == "node-2"
    assert n2.counters()["relocations_committed_by_store"] == 1
    _wait_idle(n2)
    _no_moves_left(n2)


def test_chunks_of_a_move_whose_source_dies_are_dropped(cluster):
    """Chunks of a payload whose envelope never comes (its source died) are not kept."""
    n1, n2, _ = cluster.nodes
    relocator = n2._runtime.relocator
    n2._infra.submit(relocator.on_chunk, wire.RelocChunkEnvelope("node-1", 7, 0, "abc"))
    cluster.wait_idle(WAIT)
    assert relocator._chunks
    _declare_down(cluster, n1)
    for _ in range(100):  # the verdict, then the infrastructure thread: bounded
        if n2.counters().get("peers_declared_down"):
            break
        assert n2.wait_idle(WAIT)
    _wait_idle(n2)
    assert relocator._chunks == {}


# -- a Join across nodes caught by a death ------------------------------------------------------
def test_a_join_whose_spot_node_dies_before_it_answers_fails_and_the_actor_stays(cluster):
    """The Spot's node dies while ``on_actor_join`` runs there: the Join completes as failed
    at once, and the Actor stays in its Entry Spot, serving."""
    n1, n2, _ = cluster.nodes
    n2.client().spots.get_or_create("hall", "t.md.room").wait(WAIT)
    pid = _player(n1)
    HOLD_ASKS.set()
    n1.client().send_to_actor(pid, Enter(room="hall")).submit()
    assert ASKED.wait(WAIT)
    _declare_down(cluster, n2)
    assert COMPLETED.acquire(timeout=WAIT)
    assert not DONE[-1].joined and isinstance(DONE[-1].error, zlink.Unavailable)
    assert n1.client().request_to_actor(pid, Info()).wait(WAIT).startswith("node-1:t.md.lobby")


def test_a_join_whose_spot_node_dies_while_the_actor_moves_fails_and_the_actor_stays(cluster):
    """The Join was accepted; the Actor's move waits for the Spot's node, which dies while it
    restores: the move is aborted, the Join completes as failed, and the Actor is back in
    its Entry Spot on its node with its queue intact (a message parked during the move)."""
    n1, n2, _ = cluster.nodes
    n2.client().spots.get_or_create("hall", "t.md.room").wait(WAIT)
    pid = _player(n1)
    cluster.wait_idle(WAIT)
    HOLD_RESTORES.set()
    n1.client().send_to_actor(pid, Enter(room="hall")).submit()
    assert RESTORING.wait(WAIT)
    n1.client().send_to_actor(pid, Mark(n=2)).submit()  # parked at the seal
    _declare_down(cluster, n2)
    assert COMPLETED.acquire(timeout=WAIT)
    assert not DONE[-1].joined and isinstance(DONE[-1].error, zlink.Unavailable)
    assert EVENTS == ["join?@node-2", "completed@node-1:False"]
    info = n1.client().request_to_actor(pid, Info()).wait(WAIT)
    assert info.startswith("node-1:t.md.lobby") and info.endswith(":[1, 2]")
    assert n1._runtime.actors[pid].state.value == "ready"
    _wait_idle(n1)
    _no_moves_left(n1)


def test_a_join_whose_actor_never_arrives_leaves_no_member_pending_in_the_spot(cluster):
    """The Spot's node accepted the Join and restored the Actor; the Actor's node dies before
    it commits: the Spot's node forgets the Actor (no member pending; the Actor was lost with
    its node), and the Spot can move again."""
    n1, n2, _ = cluster.nodes
    n2.client().spots.get_or_create("hall", "t.md.room").wait(WAIT)
    pid = _player(n1)
    cluster.wait_idle(WAIT)
    restored = _hold(n1, wire.RelocDoneEnvelope)  # node-1 dies before it can commit
    n1.client().send_to_actor(pid, Enter(room="hall")).submit()
    assert restored.wait(WAIT)
    hall = n2._runtime.spots["hall"]
    assert pid in hall.members and pid in n2._runtime.actors  # arriving, sealed
    _declare_down(cluster, n1)
    for _ in range(100):  # the verdict, then the store's word: bounded
        if n2.counters().get("relocations_forgotten"):
            break
        assert n2.wait_idle(WAIT)
    assert hall.members == {} and pid not in n2._runtime.actors
    _no_moves_left(n2)
    n2.relocate_spot("hall", "node-3", timeout=WAIT)  # nothing pending holds it any more
    assert cluster.store.lookup("hall").owner_node == "node-3"


def test_a_join_whose_spot_node_dies_after_the_commit_leaves_the_actor_moved(cluster):
    """The Actor's move committed, then the Spot's node died before it opened: the Actor
    belongs to that node (lost with it: Actors are not re-homed, python-api §10); its old
    Spot on the source is told it left, and its old copy runs nothing more there."""
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("here", "t.md.room").wait(WAIT)
    n2.client().spots.get_or_create("hall", "t.md.room").wait(WAIT)
    pid = _player(n1)
    n1.client().send_to_actor(pid, Enter(room="here")).submit()
    assert COMPLETED.acquire(timeout=WAIT) and DONE[-1].joined
    cluster.wait_idle(WAIT)
    commit = _hold(n2, wire.RelocCommitEnvelope)  # node-2 dies as the commit reaches it
    n1.client().send_to_actor(pid, Enter(room="hall")).submit()
    assert commit.wait(WAIT)
    _declare_down(cluster, n2)
    for _ in range(100):
        if "left@node-1:here" in EVENTS:
            break
        assert n1.wait_idle(WAIT)
    _wait_idle(n1)
    assert "left@node-1:here" in EVENTS
    assert EVENTS.count("completed@node-1:False") == 0  # nothing runs on the old copy
    assert pid not in n1._runtime.spots["here"].members and pid not in n1._runtime.actors
    _no_moves_left(n1)
    with pytest.raises(zlink.NotFound):
        n1.client().request_to_actor(pid, Info()).wait(WAIT)


# -- a route fence through a dead node ------------------------------------------------------------
def test_a_route_fence_through_a_node_that_dies_ends_and_its_calls_go_by_the_store(cluster):
    """A fence sent along the old path is lost with the node it went to: it ends at once as
    that node is declared down (counted), and the calls kept behind it go by the store."""
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    senders = Senders([n3], "room")
    senders.send(1)  # node-3 routes "room" to node-1
    cluster.wait_idle(WAIT)
    n1.relocate_spot("room", "node-2", timeout=WAIT)
    fence = _hold(n1, wire.FenceEnvelope)  # node-1 dies holding node-3's fence
    senders.send(1)  # relayed by node-1; node-3 learns the new route and fences the old one
    assert fence.wait(WAIT)
    senders.send(5)  # kept behind the fence
    _wait_idle(n2, n3)
    assert n3.counters()["route_fences"] == 1
    _declare_down(cluster, n1)
    seen = n3.client().request_to_spot("room", Seen()).wait(WAIT)
    assert seen == {"node-3": list(range(7))}
    assert n3.counters()["route_fences_lost"] == 1


def test_a_request_relayed_to_a_node_that_dies_fails_at_once_at_its_origin(cluster):
    """python-api §10 "Failure": a request that went by a stale route (node-3 -> node-1,
    relayed to node-2, where the Spot moved) and reached node-2 just before it died ends at
    its origin at once with ``Unavailable``, not at its deadline (the clock never moves
    here): the relaying node awaits the reply from the next hop, and fails what it awaited
    from a node declared down, which its origin then hears."""
    n1, n2, n3 = cluster.nodes
    n1.client().spots.get_or_create("room", "t.md.room").wait(WAIT)
    Senders([n3], "room").send(1)  # node-3 routes "room" to node-1
    cluster.wait_idle(WAIT)
    n1.relocate_spot("room", "node-2", timeout=WAIT)
    came = _hold(n2, wire.RequestEnvelope)  # node-2 dies with the request in hand
    pending = n3.client().request_to_spot("room", Seen()).future()
    assert came.wait(WAIT)
    assert n1.counters()["relayed_calls"] == 1  # it went by node-1
    _declare_down(cluster, n2)
    with pytest.raises(zlink.Unavailable):
        pending.result(WAIT)


def test_a_request_waiting_for_a_commit_whose_target_died_is_served_here(clock):
    """Found by review. A request made on the source waits there, past what the move holds
    for its target, for the commit; the target is declared down meanwhile, and the store
    refuses the commit (the target holds no lease): the room stays here. The request was
    still awaited from the dead target, and failed ``Unavailable`` at once; now it is
    served here, as the calls relayed before it are (python-api §10 "Failure", §11)."""
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=60.0,
                      app_lane_items=4) as cluster:  # fmt: skip
        _request_waits_for_the_commit_and_the_target_dies(cluster)


def _request_waits_for_the_commit_and_the_target_dies(cluster: LocalCluster) -> None:
    n1, n2, _n3 = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("room", "t.md.room").wait(WAIT)
    gate = _StoreGate(cluster, after=False)
    mover = Mover(n1, "room", "node-2")
    assert gate.at.wait(WAIT)  # restored on node-2; node-1 relays; the store is asked
    sends = [c1.send_to_spot("room", Add(sender="n1", seq=s)).future() for s in range(4)]
    asked = c1.request_to_spot("room", Seen()).future()  # past what the move holds
    out = n1._runtime.relocator._out_ids["room"]
    until(lambda: len(out.waiting) == 1, "the request waits for the commit")
    assert cluster.store.unregister_node("node-2", n2.incarnation)
    _verdict(n1, "node-2")
    gate.go.set()  # the store refuses (node-2 holds no lease): the move did not happen
    error = mover.result()
    assert isinstance(error, zlink.Unavailable) and "no lease" in str(error), error
    for future in sends:
        future.result(WAIT)
    assert asked.result(WAIT)["n1"] == [0, 1, 2, 3]  # served here, as the relayed ones
    _no_moves_left(n1)
