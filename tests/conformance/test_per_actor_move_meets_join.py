"""A PER_ACTOR Spot's move meets a member's Join that begins during it (kotlin-spot-interface:
a PER_ACTOR Spot moves its shell first, then each member Actor "in the order it finishes its
current turn"; a Join's source hears ``on_leave_actor``, §5).

An Actor probe (11 of 40 runs): a member that began a Join to a room on another node while
its room's shell was moving could not be sealed to follow it ("joins another Spot"), so the
move raised ``Unavailable`` though the shell had moved; the member stayed bound to the shell's
old place, the room never heard it leave (``lifecycle_skipped_on_leave_actor``), and with its
Join refused it could neither leave nor disconnect ("'r0' is moving") for good. A Join that
begins while its Actor's PER_ACTOR Spot moves fails at once with ``Unavailable`` (the Actor
follows its room first, and joins again from there); a member's move waits for a Join under
way to end before it is tried again."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster

HOLD = threading.Event()  # the room's own handler (its shell's gate) ends once set
HOLDING = threading.Event()
ADMIT = threading.Event()  # the far room's on_actor_join answers once set
COMPLETIONS: list[zlink.ActorJoinCompletion] = []
COMPLETED = threading.Event()
LEFT: list[str] = []


class JoinTo(zlink.Message, type_name="t.pj.jointo"):
    room: str
    stall: bool = False  # the handler holds its turn (on HOLD) after it deferred the Join


class Where(zlink.Request[str], type_name="t.pj.where"):
    pass


class Stall(zlink.Request[str], type_name="t.pj.stall"):
    pass


class GoHome(zlink.Request[str], type_name="t.pj.gohome"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("per-actor-move-join")

    @app.entry_spot("t.pj.lobby", actor="t.pj.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.pj.player", relocation=zlink.Relocation.recreate())
    class Player(zlink.Actor):
        @zlink.handler
        def join_to(self, msg: JoinTo) -> None:
            self.context.join(msg.room).defer()
            if msg.stall:
                HOLDING.set()
                assert HOLD.wait(WAIT)

        @zlink.handler
        def where(self, req: Where) -> str:
            return f"{self.context._rt.node_id}:{self.context.spot_id}"  # type: ignore[attr-defined]

        @zlink.handler
        def go_home(self, req: GoHome) -> str:
            self.context.leave()
            return "left"

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            COMPLETIONS.append(completion)
            COMPLETED.set()

    @app.user_spot("t.pj.hall", mode=zlink.ExecutionMode.PER_ACTOR)
    class Hall(zlink.UserSpot):
        @zlink.handler
        def stall(self, req: Stall) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "done"

        def on_leave_actor(self, actor: zlink.Actor) -> None:
            LEFT.append(actor.actor_id)

    @app.entry_spot("t.pj.gate", actor="t.pj.stuck")
    class Gate(zlink.EntrySpot):
        pass

    class NoCapture(zlink.JsonStateAdapter):
        def capture(self, instance: Any) -> bytes:
            raise zlink.StateIncompatible("no capture")

    app.actor("t.pj.stuck", relocation=zlink.Relocation.preserve_state(NoCapture))(
        type("Stuck", (Player,), {})
    )

    @app.user_spot("t.pj.room")
    class Room(zlink.UserSpot):
        def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
            assert ADMIT.wait(WAIT)
            return zlink.ActorJoinResult()

    return app


def _state(node: zlink.Node, spot_id: str) -> str | None:
    return next((o.state for o in node.status().owners if o.owner == spot_id), None)


def _member_of_r0(node: zlink.Node, actor_type: str = "t.pj.player") -> str:
    """A new Actor of ``actor_type``, a member of the PER_ACTOR room ``r0`` on ``node``."""
    client = node.client()
    client.spots.get_or_create("r0", "t.pj.hall").wait(WAIT)
    actor_id = client.actors.create(actor_type).wait(WAIT).actor_id
    ADMIT.set()
    client.send_to_actor(actor_id, JoinTo(room="r0")).wait(WAIT)
    assert COMPLETED.wait(WAIT) and COMPLETIONS[-1].joined
    COMPLETED.clear()
    return actor_id


def _move_r0(node: zlink.Node) -> tuple[threading.Thread, list[BaseException | None]]:
    """``node.relocate_spot("r0", "node-2")`` on a thread: the thread, and its outcome once
    it ended (``None``: moved)."""
    moved: list[BaseException | None] = []

    def move() -> None:
        try:
            node.relocate_spot("r0", "node-2", timeout=WAIT)
            moved.append(None)
        except zlink.ZLinkError as exc:
            moved.append(exc)

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    return mover, moved


@pytest.fixture
def cluster():
    for event in (HOLD, HOLDING, ADMIT, COMPLETED):
        event.clear()
    COMPLETIONS.clear()
    LEFT.clear()
    with LocalCluster(build_app(), nodes=2, workers=4) as cluster:
        yield cluster
    HOLD.set()
    ADMIT.set()


def test_a_join_begun_while_its_per_actor_room_moves_fails_and_the_member_follows(cluster):
    n1, n2 = cluster.nodes
    c1 = n1.client()
    n2.client().spots.get_or_create("r1", "t.pj.room").wait(WAIT)
    a = _member_of_r0(n1)
    ADMIT.clear()  # the far room's answer waits from now on

    stalled = c1.request_to_spot("r0", Stall()).timeout(WAIT).future()
    assert HOLDING.wait(WAIT)  # the shell's gate is busy: the move's barrier waits for it
    mover, moved = _move_r0(n1)
    until(lambda: _state(n1, "r0") == "sealed", "the move sealed r0")
    c1.send_to_actor(a, JoinTo(room="r1")).wait(WAIT)  # its handler defers a Join to node-2
    COMPLETED.wait(2.0)  # (the fix answers it at once; before, the far room held it)
    HOLD.set()
    ADMIT.set()
    assert stalled.result(WAIT) == "done"
    mover.join(WAIT)
    assert moved == [None], f"the move of r0 said {moved}"
    assert COMPLETED.wait(WAIT)
    done = COMPLETIONS[-1]
    assert not done.joined and isinstance(done.error, zlink.Unavailable), done
    assert "moving" in str(done.error)
    # the member followed its room, is served there, and can leave and join again
    assert c1.request_to_actor(a, Where()).wait(WAIT) == "node-2:r0"
    for node in cluster.nodes:
        assert not node.counters().get("lifecycle_skipped_on_leave_actor"), node.counters()
    assert c1.request_to_actor(a, GoHome()).wait(WAIT) == "left"
    until(lambda: [a] == LEFT, "r0 heard its member leave")
    COMPLETED.clear()
    c1.send_to_actor(a, JoinTo(room="r1")).wait(WAIT)
    assert COMPLETED.wait(WAIT) and COMPLETIONS[-1].joined, COMPLETIONS[-1]


def test_a_join_on_the_same_node_under_way_as_the_room_moves_goes_ahead(cluster):
    """A review of the first fix: a member whose turn deferred a Join to a room on its own
    node while its PER_ACTOR room began to move had that Join refused; it needs no refusal
    (its move waits for the Join, ``Membership.after_join``, and then finds it gone)."""
    n1, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("r2", "t.pj.room").wait(WAIT)
    a = _member_of_r0(n1)
    c1.send_to_actor(a, JoinTo(room="r2", stall=True)).wait(WAIT)
    assert HOLDING.wait(WAIT)  # its turn holds: the Join is asked once it ends
    mover, moved = _move_r0(n1)
    until(lambda: _state(cluster.nodes[1], "r0") is not None, "r0's shell moved")
    HOLD.set()  # the member's move waits behind this turn, then for the Join it deferred
    mover.join(WAIT)
    assert moved == [None], f"the move of r0 said {moved}"
    assert COMPLETED.wait(WAIT) and COMPLETIONS[-1].joined, COMPLETIONS[-1]
    assert c1.request_to_actor(a, Where()).wait(WAIT) == "node-1:r2"
    until(lambda: [a] == LEFT, "r0 heard its member leave")


def test_a_member_left_behind_by_a_failed_move_may_still_join_its_way_out(cluster):
    """A review of the first fix: a member whose own move failed for good after its shell
    moved (here its capture raises) stays bound to the shell's old place, and a Join was its
    way out; the first fix refused that Join as long as it lived ("is moving")."""
    n1, _ = cluster.nodes
    c1 = n1.client()
    c1.spots.get_or_create("r2", "t.pj.room").wait(WAIT)
    a = _member_of_r0(n1, "t.pj.stuck")
    with pytest.raises(zlink.StateIncompatible):
        n1.relocate_spot("r0", "node-2", timeout=WAIT)
    c1.send_to_actor(a, JoinTo(room="r2")).wait(WAIT)
    assert COMPLETED.wait(WAIT)
    assert COMPLETIONS[-1].joined, COMPLETIONS[-1]
    assert c1.request_to_actor(a, Where()).wait(WAIT) == "node-1:r2"
