"""A call that names an id as the other kind of object than the node's path for it leads to
(a Spot's id called as an Actor's, or the reverse): one id space (python-api §5), and the
per-sender order of the calls on that path (python-api §9).

Such a call asks the store in a question of its own (``MeshRouter._ask_kind``); calls of its
kind made meanwhile wait behind it whatever happens to the path, and the path stays with the
calls on it unless the store says the id changed kind. Found by a fresh-eyes review of that
change (each test below failed first).
"""

from __future__ import annotations

from typing import Any

import pytest

import zlink
from tests.conftest import WAIT, held_at, infra_sync, until
from zlink.mesh import wire
from zlink.mesh.outbox import Room
from zlink.messaging.completion import Completion
from zlink.testing import LocalCluster


class Add(zlink.Message, type_name="t.rk.add"):
    seq: int


class Where(zlink.Request[str], type_name="t.rk.where"):
    pass


class Bye(zlink.Message, type_name="t.rk.bye"):
    pass


HANDLED: list[int] = []


def build_app() -> zlink.App:
    app = zlink.App("review-kind")

    @app.user_spot("t.rk.room", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter))
    class Room(zlink.UserSpot):
        @zlink.handler
        def add(self, msg: Add) -> None:
            HANDLED.append(msg.seq)

    @app.instance_spot("t.rk.session")
    class Session(zlink.InstanceSpot):
        @zlink.handler
        def add(self, msg: Add) -> None:
            HANDLED.append(msg.seq)

        @zlink.handler
        def bye(self, msg: Bye) -> None:
            self.context.close()

    @app.entry_spot("t.rk.lobby", actor="t.rk.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.rk.player")
    class Player(zlink.Actor):
        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context.spot_id

        @zlink.handler
        def add(self, msg: Add) -> None:
            HANDLED.append(msg.seq)

        @zlink.handler
        def bye(self, msg: Bye) -> None:
            self.context.disconnect()

    return app


def _hold_kind_question(node: zlink.Node, target: str) -> Any:
    """The first store lookup of ``target`` that ``node``'s router makes is held (its store
    thread stays free); returns a call that asks the store now and answers it."""
    router = node._runtime.router
    real = router.store_worker.call
    held: list[Completion] = []

    def call(fn: Any, *args: Any) -> Completion:
        if getattr(fn, "__name__", "") == "lookup" and args == (target,) and not held:
            done = Completion()
            held.append(done)
            return done
        return real(fn, *args)

    router.store_worker.call = call  # type: ignore[method-assign]

    def answer() -> None:
        router.store_worker.call = real  # type: ignore[method-assign]
        real(router.store.lookup, target).add_callback(held[0].set)

    return held, answer


def _stale_actor_route_then_spot(n1: zlink.Node, n2: zlink.Node) -> None:
    """node-2 routes ``x`` as an Actor's (on node-1); that Actor ends, and ``x`` names a
    Spot on node-1 now."""
    assert n1.client().actors.create("t.rk.player", actor_id="x").wait(WAIT).created
    assert n2.client().request_to_actor("x", Where()).wait(WAIT) == "t.rk.lobby@node-1"
    assert n2._runtime.router._known("x").kind == "actor"
    n1.client().send_to_actor("x", Bye()).wait(WAIT)
    until(lambda: "x" not in n1._runtime.actors, "the actor to end")
    until(lambda: n1._runtime.router.store.lookup("x") is None, "the store to forget it")
    n1.client().spots.get_or_create("x", "t.rk.room").wait(WAIT)


def test_calls_waiting_for_a_kind_question_go_first_when_their_target_arrives():
    """A1 met node-2's stale Actor path for ``x`` and waits for its kind question; Spot ``x``
    then moves onto node-2 (``arrived`` drops the path and answered only the calls waiting
    for a plain store question). A2, made after, was queued locally; A1 followed once the
    question was answered: [2, 1]. ``arrived`` answers the kind questions too, first."""
    HANDLED.clear()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        _stale_actor_route_then_spot(n1, n2)
        held, answer = _hold_kind_question(n2, "x")
        c2 = n2.client()
        a1 = c2.send_to_spot("x", Add(seq=1)).future()
        until(lambda: held, "A1's kind question")
        n1.relocate_spot("x", "node-2", timeout=WAIT)
        a2 = c2.send_to_spot("x", Add(seq=2)).future()
        assert a2.result(WAIT) is None
        answer()
        assert a1.result(WAIT) is None
        until(lambda: len(HANDLED) == 2, "both handled")
        assert HANDLED == [1, 2]


def test_calls_waiting_for_a_kind_question_stay_ahead_when_the_path_goes():
    """node-2's path for ``x`` is Spot ``x``'s on node-1; ``x`` names an Actor on node-3 now.
    A1 waits for its kind question; node-1 leaves, so node-2 drops its routes to it
    (``declared_down``). A2, made after, found no path, asked the store and went straight to
    node-3; A1 followed once its question was answered: [2, 1]. A call of a kind with a
    question open waits behind it, whatever the path is by then."""
    HANDLED.clear()
    with LocalCluster(build_app(), nodes=3, workers=2) as cluster:
        n1, n2, n3 = cluster.nodes
        ref = n1.client().spots.get_or_create("x", "t.rk.room").wait(WAIT).spot_ref
        n2.client().send_to_spot("x", Add(seq=0)).wait(WAIT)  # node-2 routes x by node-1
        until(lambda: HANDLED == [0], "the spot's call")
        assert n1.client().spots.close(ref)
        cluster.wait_idle(WAIT)
        HANDLED.clear()
        assert n3.client().actors.create("t.rk.player", actor_id="x").wait(WAIT).created
        router = n2._runtime.router
        assert router._known("x").kind == "spot" and router._known("x").node == "node-1"
        held, answer = _hold_kind_question(n2, "x")
        c2 = n2.client()
        a1 = c2.send_to_actor("x", Add(seq=1)).future()
        until(lambda: held, "A1's kind question")
        n1.shutdown(WAIT)
        until(lambda: router._known("x") is None, "node-2 to drop its routes to node-1")
        a2 = c2.send_to_actor("x", Add(seq=2)).future()
        router.store_worker.wait_quiet(WAIT)
        infra_sync(n2)
        n3.wait_idle(WAIT)
        answer()
        assert a1.result(WAIT) is None and a2.result(WAIT) is None
        until(lambda: len(HANDLED) == 2, "both handled")
        assert HANDLED == [1, 2]


def test_a_spots_path_stays_when_the_store_says_its_id_names_nothing():
    """Instance Spot ``s`` was on node-1 and deactivated (the store forgets it); node-2's
    route still leads there, and a call along it activates it again. S1 is on that path
    (node-1 holds it a moment). A call naming ``s`` as an Actor's gets ``NotFound``; its kind
    question's answer, "nothing", dropped the Spot's path, so S2, made next, reserved ``s``
    by the store and activated it on node-2; S1, at node-1, then found it there and was
    relayed behind S2: [2, 1]. A Spot's path stays then (an Actor's goes: none comes back)."""
    HANDLED.clear()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        n1.client().send_to_spot("s", Add(seq=0)).instance_spot().wait(WAIT)
        c2 = n2.client()
        c2.send_to_spot("s", Add(seq=0)).instance_spot().wait(WAIT)
        until(lambda: HANDLED == [0, 0], "activated on node-1, routed there by node-2")
        assert n2._runtime.router._known("s").node == "node-1"
        n1.client().send_to_spot("s", Bye()).instance_spot().wait(WAIT)
        until(lambda: n1._runtime.router.store.lookup("s") is None, "the deactivation")
        HANDLED.clear()
        at, go = held_at(n1, wire.SendEnvelope, lambda env: env.first_origin == "node-2")
        s1 = c2.send_to_spot("s", Add(seq=1)).instance_spot().future()
        assert at.wait(WAIT)
        with pytest.raises(zlink.NotFound):
            c2.send_to_actor("s", Add(seq=-1)).wait(WAIT)
        s2 = c2.send_to_spot("s", Add(seq=2)).instance_spot().future()
        assert s1.result(WAIT) is None and s2.result(WAIT) is None
        n2.wait_idle(WAIT)
        go()
        until(lambda: len(HANDLED) == 2, "both handled")
        assert HANDLED == [1, 2]


def test_a_batch_that_waited_for_the_outbox_goes_on_when_its_path_changed_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the same review: a batch that waited for room in the outbox went on as one
    envelope only while its path still led to its kind; else nothing was sent, its caller was
    told it was queued, and no drop was counted (python-api §9: nothing accepted is lost). It
    goes on message by message, each asking the store what the id names."""
    HANDLED.clear()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        n1, n2 = cluster.nodes
        n1.client().spots.get_or_create("x", "t.rk.room").wait(WAIT)
        c2 = n2.client()
        c2.send_to_spot("x", Add(seq=0)).wait(WAIT)  # node-2 routes x by node-1
        until(lambda: HANDLED == [0], "the first call")
        router = n2._runtime.router
        waits: list[Any] = []
        monkeypatch.setattr(router.outbox, "has_room", lambda *args: False)  # full, and
        monkeypatch.setattr(router.outbox, "wait_room", lambda _peer, go, _target, _bound: (
            waits.append(go) or Room.WAITS))  # the batch waits  # fmt: skip
        batch = c2.send_many_to_spot("x", [Add(seq=1), Add(seq=2)]).future()
        until(lambda: waits, "the batch to wait for room in the outbox")
        monkeypatch.undo()
        with router.route_lock:  # as if the store had said meanwhile that x names an Actor
            router._routes["x"] = router._routes["x"]._replace(kind="actor")
        n2._infra.submit(waits[0])  # room in the outbox
        assert batch.result(WAIT) is None
        until(lambda: len(HANDLED) == 3, "the batch handled")
        assert HANDLED == [0, 1, 2]
