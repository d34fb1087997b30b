"""Moves that do not happen: a restore that keeps failing, a deadline that passes first, a
handler suspended when the move is asked for (python-api §8 "A DeadlineExceeded from either
means the move did not happen (it was withdrawn and admission restored)"; §11 "A relocation
whose restore keeps failing" and "Close or move while a SpotWide handler is suspended";
kotlin-spot-interface: "seal new admission and proceed only after the all-lane barrier ...
including all coroutine continuations. A barrier failure aborts the entire seal of the same
generation and restores application admission exactly").

In every case the Spot stays on its source and serves again there, with its queue as it was
(the messages queued before the move first, then those parked during it, in arrival order),
its timers going on, and the target keeps nothing of it; nothing accepted is lost or run twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, fill, until
from zlink.mesh import wire
from zlink.testing import LocalCluster, ManualClock


class Add(zlink.Message, type_name="t.rw.add"):
    sender: str
    seq: int


class Seen(zlink.Request[dict[str, list[int]]], type_name="t.rw.seen"):
    pass


class Block(zlink.Message, type_name="t.rw.block"):
    pass


class Beat(zlink.Message, type_name="t.rw.beat"):
    pass


class Beats(zlink.Request[list[str]], type_name="t.rw.beats"):
    pass


class Slow(zlink.Request[str], type_name="t.rw.slow"):
    pass


class Hold(zlink.Request[str], type_name="t.rw.hold"):
    pass


HANDLED: list[tuple[str, str, str, int]] = []  # (node, spot, sender, seq), every node
RESTORING = threading.Event()  # a restore has started on the target
RESTORE_GO = threading.Event()  # ... and may go on
RESTORES: list[int] = []
BLOCK = threading.Event()  # a running handler holds its Spot's gate until this is set
BLOCKING = threading.Event()
HOLD = threading.Event()  # the call a handler Yields on completes once this is set
HOLDING = threading.Event()
LOG: list[str] = []


def _node() -> str:
    turn = zlink.executor.current_turn()
    assert turn is not None and turn.owner is not None
    return turn.owner.ref.rt.node_id  # type: ignore[no-any-return]


class FailingRestore(zlink.JsonStateAdapter):
    """Every restore fails; the first waits for the test before it does."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORES.append(1)
        RESTORING.set()
        assert RESTORE_GO.wait(WAIT)
        raise RuntimeError("cannot restore")


class SlowRestore(zlink.JsonStateAdapter):
    """A restore that waits for the test, then succeeds."""

    def restore(self, instance: Any, data: bytes) -> None:
        RESTORES.append(1)
        RESTORING.set()
        assert RESTORE_GO.wait(WAIT)
        super().restore(instance, data)


class Room(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: dict[str, list[int]] = {}
        self.beats: list[str] = []  # "node:sequence" of every tick handled

    @zlink.handler
    def add(self, msg: Add) -> None:
        HANDLED.append((_node(), self.context.spot_id, msg.sender, msg.seq))
        self.seen.setdefault(msg.sender, []).append(msg.seq)

    @zlink.handler
    def get_seen(self, req: Seen) -> dict[str, list[int]]:
        return self.seen

    @zlink.handler
    def block(self, msg: Block) -> None:
        BLOCKING.set()
        assert BLOCK.wait(WAIT)

    @zlink.handler
    def beat(self, msg: Beat) -> None:
        self.context.timers.register("beat", 1.0)

    @zlink.timer_handler("beat")
    def on_beat(self, tick: zlink.TimerTick) -> None:
        self.beats.append(f"{_node()}:{tick.sequence}")

    @zlink.handler
    def get_beats(self, req: Beats) -> list[str]:
        return self.beats

    @zlink.handler
    async def slow(self, req: Slow) -> str:
        LOG.append(f"slow:start@{_node()}")
        out: str = await self.context.outbound.request("t.rw.api", Hold()).yield_()
        turn = zlink.executor.current_turn()
        assert turn is not None and turn.owner is not None
        LOG.append(f"slow:resumed@{_node()}:{turn.owner.ref.state.value}")
        return f"{out}@{_node()}"


class CloseAfterBlock(zlink.Message, type_name="t.rw.close_after_block"):
    pass


class First(zlink.Message, type_name="t.rw.first"):
    pass


INIT_GO = threading.Event()  # an Instance Spot's on_initialize on node-1 waits for this
INITIALIZING = threading.Event()
FIRST_HOLD = threading.Event()  # ... and its first message's handler there, for this
FIRST_RUNNING = threading.Event()


class Session(zlink.InstanceSpot):
    """An Instance Spot that closes itself from a handler held until ``BLOCK`` is set."""

    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        LOG.append(f"activated@{_node_of(context)}")

    @zlink.handler
    def add(self, msg: Add) -> None:
        HANDLED.append((_node(), self.context.spot_id, msg.sender, msg.seq))

    @zlink.handler
    def close_after_block(self, msg: CloseAfterBlock) -> None:
        BLOCKING.set()
        assert BLOCK.wait(WAIT)
        self.context.close()

    def on_closing(self, closing: zlink.SpotClosingContext) -> None:
        LOG.append(f"on_closing@{_node()}")


class Late(zlink.InstanceSpot):
    """An Instance Spot whose first activation (node-1) waits in ``on_initialize``, and whose
    first message's handler on node-1 is held: its first record's message stays queued."""

    def on_initialize(self) -> None:
        if _node_of(self.context) == "node-1":
            INITIALIZING.set()
            assert INIT_GO.wait(WAIT)

    @zlink.handler
    def first(self, msg: First) -> None:
        LOG.append(f"first@{_node()}")
        if _node() == "node-1":
            FIRST_RUNNING.set()
            assert FIRST_HOLD.wait(WAIT)


def _node_of(context: zlink.SpotContext) -> str:
    return context._rt.node_id  # type: ignore[attr-defined, no-any-return]


def build_app() -> zlink.App:
    app = zlink.App("withdrawn")
    app.instance_spot(
        "t.rw.session", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    )(Session)
    app.instance_spot("t.rw.late", relocation=zlink.Relocation.preserve_state(SlowRestore))(Late)
    app.user_spot("t.rw.stuck", relocation=zlink.Relocation.preserve_state(FailingRestore))(
        type("Stuck", (Room,), {})
    )
    app.user_spot("t.rw.slow", relocation=zlink.Relocation.preserve_state(SlowRestore))(
        type("Slow", (Room,), {})
    )
    app.user_spot("t.rw.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))(
        type("Plain", (Room,), {})
    )

    @app.channel("t.rw.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "held"

    return app


@pytest.fixture(autouse=True)
def _reset() -> None:
    HANDLED.clear()
    RESTORING.clear()
    RESTORE_GO.clear()
    RESTORES.clear()
    BLOCK.clear()
    BLOCKING.clear()
    HOLD.clear()
    HOLDING.clear()
    LOG.clear()
    INIT_GO.clear()
    INITIALIZING.clear()
    FIRST_HOLD.clear()
    FIRST_RUNNING.clear()


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0,
                      lease_seconds=1e6) as c:  # fmt: skip
        yield c
    RESTORE_GO.set()
    BLOCK.set()
    HOLD.set()
    INIT_GO.set()
    FIRST_HOLD.set()


class Mover:
    """``node.relocate_spot`` on a thread of its own; ``sealed`` is set once the seal is on."""

    def __init__(self, node: zlink.Node, spot_id: str, target: str, timeout: float) -> None:
        self.sealed = threading.Event()
        self.outcome: list[BaseException | None] = []
        relocator = node._runtime.relocator
        seal = relocator.seal

        def sealing(*args: Any, **kwargs: Any) -> None:
            seal(*args, **kwargs)
            self.sealed.set()

        relocator.seal = sealing

        def move() -> None:
            try:
                node.relocate_spot(spot_id, target, timeout=timeout)
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
    """One sender on each node of the cluster, each numbering its messages from 0."""

    def __init__(self, cluster: LocalCluster, spot_id: str) -> None:
        self.clients = [node.client() for node in cluster.nodes]
        self.spot_id = spot_id
        self.sent = [0 for _ in cluster.nodes]

    def send(self, count: int) -> None:
        for k, client in enumerate(self.clients):
            for _ in range(count):
                client.send_to_spot(self.spot_id, Add(sender=str(k), seq=self.sent[k])).submit()
                self.sent[k] += 1

    def check_handled_once_in_order_on(self, *node_ids: str) -> None:
        """Every message handled once, per sender in the order sent (``HANDLED`` is in the
        order of handling, across nodes), on exactly ``node_ids``."""
        mine = [h for h in HANDLED if h[1] == self.spot_id]
        assert {h[0] for h in mine} == set(node_ids)
        for k, sent in enumerate(self.sent):
            assert [h[3] for h in mine if h[2] == str(k)] == list(range(sent)), k
        assert not [h for h, n in Counter(mine).items() if n > 1]


def test_a_restore_that_keeps_failing_aborts_the_move_and_the_source_serves_everything(cluster):
    """python-api §11: "A relocation whose restore keeps failing (past its retries) is aborted:
    the source's seal is lifted, the Spot serves on the source again with its queue intact,
    and the caller of the move gets the error. Nothing parked during the move is dropped." """
    n1, n2, _ = cluster.nodes
    n1.client().spots.get_or_create("stuck", "t.rw.stuck").wait(WAIT)
    senders = Senders(cluster, "stuck")
    senders.send(1)  # every node knows the way now
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["stuck"]
    assert act.gate._flag.acquire(False)  # hold the gate: these wait in the source's queue
    senders.send(20)
    asked = senders.clients[2].request_to_spot("stuck", Seen()).future()  # queued, with a reply
    cluster.wait_idle(WAIT)
    moving = n1._runtime.relocator.start(act, "node-2")
    senders.send(20)  # parked at the seal
    cluster.wait_idle(WAIT)
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn: the queue leaves for node-2
    assert RESTORING.wait(WAIT)
    senders.send(20)  # parked at the source; node-2's own wait there for the commit
    RESTORE_GO.set()
    with pytest.raises(zlink.StateIncompatible, match="restore failed 3 times"):
        moving.wait(WAIT)
    assert len(RESTORES) == 3  # retried on the same target, then given up
    senders.send(20)  # admission is back on the source
    cluster.wait_idle(WAIT)
    assert asked.result(WAIT)["2"] == list(range(21))  # answered once, by the source
    senders.check_handled_once_in_order_on("node-1")
    assert n1.client().request_to_spot("stuck", Seen()).wait(WAIT)["1"] == list(range(81))
    assert act.state.value == "ready" and n1._runtime.spots["stuck"] is act
    assert "stuck" not in n2._runtime.spots  # the target forgot its half-made copy
    assert cluster.store.lookup("stuck").owner_node == "node-1"
    cluster.wait_idle(WAIT)
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)  # admission restored exactly


def test_a_move_whose_deadline_passes_behind_a_running_handler_is_withdrawn(cluster, clock):
    """python-api §8: "A DeadlineExceeded from either means the move did not happen (it was
    withdrawn and admission restored), never that it may still complete later." The barrier
    waits behind a handler that is still running; the deadline (on the node's clock) passes
    first: the seal is lifted, what was parked runs on the source after what was queued."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("room", "t.rw.room").wait(WAIT)
    senders = Senders(cluster, "room")
    senders.send(1)
    c1.send_to_spot("room", Beat()).submit()
    cluster.wait_idle(WAIT)
    c1.send_to_spot("room", Block()).submit()
    assert BLOCKING.wait(WAIT)  # the gate is taken by a running handler
    senders.send(10)  # queued behind it
    mover = Mover(n1, "room", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    senders.send(10)  # parked at the seal
    clock.advance(10.0)  # the deadline passes before the barrier could run
    assert isinstance(mover.result(), zlink.DeadlineExceeded)
    act = n1._runtime.spots["room"]
    assert act.state.value == "ready"  # admission restored, while the handler still runs
    senders.send(10)
    BLOCK.set()
    cluster.wait_idle(WAIT)
    senders.check_handled_once_in_order_on("node-1")
    assert "room" not in n2._runtime.spots and n1._runtime.spots["room"] is act
    assert cluster.store.lookup("room").owner_node == "node-1"
    assert n1.counters().get("relocated_out", 0) == 0  # and it never completes later
    clock.advance(1.0)  # the timer goes on, on the source
    cluster.wait_idle(WAIT)
    beats = c1.request_to_spot("room", Beats()).wait(WAIT)
    assert beats and {b.split(":")[0] for b in beats} == {"node-1"}
    cluster.wait_idle(WAIT)  # the reply is set before its turn gives its reservation back
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)


def test_a_move_whose_deadline_passes_while_the_target_restores_is_withdrawn(cluster, clock):
    """python-api §8: withdrawn also once the payload left: the target's half-made copy is
    dropped, the queue that left runs on the source in its order (its queued request is
    answered there), then what was parked, then what came after; its timer goes on there."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("slow", "t.rw.slow").wait(WAIT)
    senders = Senders(cluster, "slow")
    senders.send(1)
    c1.send_to_spot("slow", Beat()).submit()
    cluster.wait_idle(WAIT)
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    act = n1._runtime.spots["slow"]
    assert act.gate._flag.acquire(False)  # hold the gate: these wait in the source's queue
    senders.send(10)
    asked = senders.clients[1].request_to_spot("slow", Seen()).future()
    cluster.wait_idle(WAIT)
    mover = Mover(n1, "slow", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    n1._runtime.pool.submit(act.gate._run)  # the barrier turn: the queue leaves for node-2
    assert RESTORING.wait(WAIT)  # node-2 restores, and takes its time
    senders.send(10)  # parked at the source; node-2's own wait on node-2
    clock.advance(10.0)
    assert isinstance(mover.result(), zlink.DeadlineExceeded)
    RESTORE_GO.set()  # the restore ends after the move was withdrawn: its copy is dropped
    senders.send(10)
    cluster.wait_idle(WAIT)
    assert asked.result(WAIT)["1"] == list(range(11))  # answered once, by the source
    senders.check_handled_once_in_order_on("node-1")
    assert "slow" not in n2._runtime.spots and n1._runtime.spots["slow"] is act
    assert n2.counters().get("relocations_forgotten") == 1
    assert cluster.store.lookup("slow").owner_node == "node-1"
    clock.advance(1.0)
    cluster.wait_idle(WAIT)
    beats = c1.request_to_spot("slow", Beats()).wait(WAIT)
    assert beats[0] == "node-1:1" and beats[-1].startswith("node-1:") and len(beats) >= 3
    cluster.wait_idle(WAIT)  # the reply is set before its turn gives its reservation back
    assert act.owner.lanes.reserved() == (0, 0, 0, 0)


def test_a_move_asked_while_a_handler_is_suspended_in_yield_waits_for_its_continuation(cluster):
    """python-api §11 "Close or move while a SpotWide handler is suspended": the move seals
    new admission, then waits for the all-lane barrier: the suspended continuation resumes and
    finishes its turn on the source; only then does the Spot move. No continuation runs on
    the source after the commit."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("room", "t.rw.room").wait(WAIT)
    senders = Senders(cluster, "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    slow = c1.request_to_spot("room", Slow()).future()
    assert HOLDING.wait(WAIT)  # suspended in its Yield; the gate is free
    mover = Mover(n1, "room", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    senders.send(10)  # parked at the seal
    for node in cluster.nodes:  # everything that can run has run: the move still waits
        node.wait_idle(WAIT, busy=1 if node is n1 else 0)
    assert mover.outcome == [] and n1._runtime.spots["room"].state.value == "sealed"
    HOLD.set()
    assert mover.result() is None
    assert slow.result(WAIT) == "held@node-1"
    assert LOG == ["slow:start@node-1", "slow:resumed@node-1:sealed"]  # before the commit
    senders.send(10)
    cluster.wait_idle(WAIT)
    senders.check_handled_once_in_order_on("node-1", "node-2")
    assert cluster.store.lookup("room").owner_node == "node-2"
    assert "room" not in n1._runtime.spots and "room" in n2._runtime.spots


def test_a_move_whose_deadline_passes_while_a_handler_is_suspended_is_withdrawn(cluster, clock):
    """python-api §11: "A move whose deadline passes first is withdrawn: the seal is lifted
    and admission restored exactly"; the continuation then finishes on the source."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("room", "t.rw.room").wait(WAIT)
    senders = Senders(cluster, "room")
    senders.send(1)
    cluster.wait_idle(WAIT)
    slow = c1.request_to_spot("room", Slow()).future()
    assert HOLDING.wait(WAIT)
    mover = Mover(n1, "room", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    senders.send(10)  # parked at the seal
    clock.advance(10.0)
    assert isinstance(mover.result(), zlink.DeadlineExceeded)
    senders.send(10)  # admitted on the source again
    HOLD.set()
    assert slow.result(WAIT) == "held@node-1"
    cluster.wait_idle(WAIT)
    assert LOG == ["slow:start@node-1", "slow:resumed@node-1:ready"]
    senders.check_handled_once_in_order_on("node-1")
    assert "room" not in n2._runtime.spots and cluster.store.lookup("room").owner_node == "node-1"
    cluster.wait_idle(WAIT)
    assert n1._runtime.spots["room"].owner.lanes.reserved() == (0, 0, 0, 0)


def test_calls_kept_at_a_withdrawn_arrival_wait_in_line_for_the_outbox(cluster, clock):
    """The calls a node made for a Spot arriving on it, kept until it opens, go on to the
    source when the move is withdrawn. A review asked whether they could be refused there
    (resent as plain ``submit()`` calls while another send of the node waits for room in its
    outbox to the source): they are not lost; here they stay behind the arrival's fence,
    which waits in line behind that send, and follow it in order (python-api §9: nothing
    accepted is lost; §8 a withdrawn move)."""
    n1, n2, _ = cluster.nodes
    c1, c2 = n1.client(), n2.client()
    c1.spots.get_or_create("slow", "t.rw.slow").wait(WAIT)
    c2.send_to_spot("slow", Add(sender="2", seq=0)).wait(WAIT)  # node-2 knows the way
    cluster.wait_idle(WAIT)
    outbox = n2._runtime.router.outbox
    held = 1 << 40
    with outbox._lock:  # node-2's outbox to node-1 is full (for this test's purpose)
        outbox._bytes["node-1"] = outbox._bytes.get("node-1", 0) + held
    first = c2.send_to_spot("slow", Add(sender="2", seq=1)).future()  # it waits for room
    assert n2.wait_idle(WAIT) and outbox.waiting("node-1") == 1 and not first.done()
    mover = Mover(n1, "slow", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    assert RESTORING.wait(WAIT)  # "slow" is arriving on node-2, and restores there
    for seq in (2, 3, 4):  # node-2's own calls: kept for it until it opens
        c2.send_to_spot("slow", Add(sender="2", seq=seq)).submit()
    clock.advance(10.0)  # the move's deadline: withdrawn, the kept calls go to node-1
    assert isinstance(mover.result(), zlink.DeadlineExceeded)
    RESTORE_GO.set()
    assert n2.wait_idle(WAIT)
    with outbox._lock:
        outbox._give_back("node-1", held)
    n2._infra.submit(outbox.writable, "node-1")  # room, as the transport would say
    assert first.result(WAIT) is None
    for _ in range(5):
        cluster.wait_idle(WAIT)
    seen = c1.request_to_spot("slow", Seen()).wait(WAIT)
    assert seen["2"] == [0, 1, 2, 3, 4]
    assert not [k for k in n2.counters() if "refused" in k or "dropped" in k]


def test_calls_that_wait_through_many_withdrawn_moves_are_not_refused_as_relayed(clock):
    """A call kept at a move that is withdrawn is routed again on its node, and each time
    that counted as one more relay (its hops): one that waited through more withdrawn moves
    than a route may relay (8) was refused once the next move took its Spot away ("route
    relayed 9 times; giving up"), its send counted as dropped. A helper tracing a probe's
    moves saw hop counts of 15. Routed again on the node it waits on is not a relay; each
    call is handled once, in order, on the Spot's new node (python-api §8, §9)."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2, app_lane_items=2,
                      request_timeout=20.0, lease_seconds=1e6) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        c1, c2 = n1.client(), n2.client()
        c1.spots.get_or_create("room", "t.rw.room").wait(WAIT)
        c1.send_to_spot("room", Block()).submit()
        assert BLOCKING.wait(WAIT)
        filled = fill(lambda n: c1.send_to_spot("room", Add(sender="1", seq=n)).submit())
        for seq in range(6):  # they wait for room on node-1 (calls from a peer: no timer)
            c2.send_to_spot("room", Add(sender="2", seq=seq)).submit()
        lanes = n1._runtime.spots["room"].owner.lanes
        until(lambda: lanes.waiting() == 6, "node-2's calls wait for room on node-1")
        for _ in range(10):  # each seal parks them, each withdrawal routes them again here
            mover = Mover(n1, "room", "node-2", timeout=10.0)
            assert mover.sealed.wait(WAIT)
            clock.advance(10.0)
            assert isinstance(mover.result(), zlink.DeadlineExceeded)
        router = n2._runtime.router
        arrived: list[int] = []  # the hops of each call node-2 takes in from node-1
        take = router._handlers[wire.SendEnvelope]

        def taken(env: wire.SendEnvelope) -> None:
            arrived.append(env.hops)
            take(env)

        router._handlers[wire.SendEnvelope] = taken
        mover = Mover(n1, "room", "node-2", timeout=10.0)  # parked, and past the park: waiting
        assert mover.sealed.wait(WAIT)
        BLOCK.set()
        assert mover.result() is None
        cluster.wait_idle(WAIT)
        mine = [(who, sender, seq) for who, spot, sender, seq in HANDLED if spot == "room"]
        assert [seq for _n, s, seq in mine if s == "1"] == list(range(filled))
        assert [seq for _n, s, seq in mine if s == "2"] == list(range(6))
        for node in cluster.nodes:
            assert not {k: v for k, v in node.counters().items() if "dropped" in k}
        assert arrived and max(arrived) <= 2, arrived  # node-2 -> node-1, relayed to node-2


def test_an_instance_spot_that_closes_itself_while_its_move_waits_closes_and_stays(cluster):
    """A handler of an Instance Spot closes it (``context.close()``) while a move waits for
    its barrier behind that handler. The close was dropped: the Spot was sealed, so not
    "ready", and the move went on, so the Spot lived on on the target with its state and
    ``on_closing`` never ran. The close wins: the move is withdrawn at its barrier (its
    caller gets ``Unavailable``; python-api §8: a withdrawn move never happens), the Spot
    closes on its source, and what was parked during the seal is handled once, in order (by
    this activation or its next: python-api §11)."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    senders = Senders(cluster, "s")
    c1.send_to_spot("s", Add(sender="0", seq=0)).instance_spot("t.rw.session").wait(WAIT)
    senders.sent[0] = 1
    assert "s" in n1._runtime.spots
    c1.send_to_spot("s", CloseAfterBlock()).instance_spot("t.rw.session").submit()
    assert BLOCKING.wait(WAIT)
    mover = Mover(n1, "s", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    for seq in range(1, 6):  # parked at the seal
        c1.send_to_spot("s", Add(sender="0", seq=seq)).instance_spot("t.rw.session").submit()
    senders.sent[0] = 6
    BLOCK.set()  # the handler closes the Spot, sealed for the move
    assert isinstance(mover.result(), zlink.Unavailable)
    cluster.wait_idle(WAIT)
    assert "on_closing@node-1" in LOG
    assert not [e for e in LOG if e.endswith("@node-2")]  # never arrived there
    assert "s" not in n2._runtime.spots
    assert n1.counters().get("relocated_out", 0) == 0
    senders.check_handled_once_in_order_on("node-1")


def test_a_first_record_taken_by_a_move_that_is_withdrawn_stays_until_its_message_ran(
    cluster, clock
):
    """execution-model §14 (cold activation): an Instance Spot's first record is cleared once
    its message's handler ended, or moved with the Spot (the store's ``transfer`` clears it
    in the commit's write). The source cleared it as soon as a move took its queue: when the
    move was then withdrawn (python-api §8), the message ran on the source with no record
    behind it, and a source that died in that handler left nothing for the next owner to
    replay: the first message was lost."""
    n1, _n2, n3 = cluster.nodes
    n1.client().send_to_spot("late", First()).instance_spot("t.rw.late").submit()
    assert INITIALIZING.wait(WAIT)
    act = n1._runtime.spots["late"]
    until(lambda: act.owner.lanes.reserved()[0] == 1, "its first message queued behind")
    movers: list[Mover] = []

    def move_once_ready(_value: object, _error: BaseException | None) -> None:
        # (on the worker, ready, before the gate moves on to the first message)
        movers.append(Mover(n1, "late", "node-2", timeout=10.0))
        assert movers[0].sealed.wait(WAIT)  # the barrier goes first, then the queue leaves

    assert act.activated is not None
    act.activated.add_callback(move_once_ready)
    INIT_GO.set()
    until(lambda: movers, "the move asked for")
    mover = movers[0]
    assert RESTORING.wait(WAIT)
    clock.advance(10.0)
    assert isinstance(mover.result(), zlink.DeadlineExceeded)  # withdrawn: it runs here
    assert FIRST_RUNNING.wait(WAIT)  # the first message's handler runs on node-1, and hangs
    RESTORE_GO.set()
    n1._runtime.router.store_worker.call(lambda: None).wait(WAIT)  # its writes so far made
    found = cluster.store.lookup("late")
    assert found is not None and found.first is not None, (
        f"the first record was cleared before its message ran: {found}"
    )
    cluster.store.unregister_node("node-1", n1.incarnation)  # node-1 dies in that handler
    n3.client().send_to_spot("late", First()).instance_spot("t.rw.late").wait(WAIT)
    until(lambda: LOG.count("first@node-3") == 2, "the record replayed, then the new message")
    FIRST_HOLD.set()
