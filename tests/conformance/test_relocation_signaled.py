"""APPLICATION_SIGNALED relocation (kotlin-spot-interface relocation paragraphs: "In a Spot turn
in this mode, context.relocationReady().defer() registers the boundary after the current turn.
The Framework delivers the source's CONTINUED or the target's RELOCATED completion ... Held
messages and timers are not executed before the callback completes. defer() in the default
mode, in PER_ACTOR, in Entry·Instance Spots, or outside a Spot turn, and a duplicate defer() in
the same turn, are INVALID_OPERATION before queue mutation.")."""

from __future__ import annotations

from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Ready(zlink.Request[str], type_name="t.rs2.ready"):
    twice: bool = False
    keep: bool = False
    same_twice: bool = False  # defer() twice on one call object


class UseKept(zlink.Request[str], type_name="t.rs2.usekept"):
    pass


class Add(zlink.Message, type_name="t.rs2.add"):
    pass


class Events(zlink.Request[list[str]], type_name="t.rs2.events"):
    pass


def _try(fn: Any) -> str:
    try:
        fn()
    except zlink.InvalidOperation as exc:
        return f"InvalidOperation: {exc}"
    return "ok"


class Table(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.events: list[str] = []
        self._kept: Any = None

    @zlink.handler
    def ready(self, req: Ready) -> str:
        self.events.append("ready")
        if req.keep:
            self._kept = self.context.relocation_ready()
            return "kept"
        if req.same_twice:
            call = self.context.relocation_ready()
            call.defer()
            return _try(call.defer)
        self.context.relocation_ready().defer()
        if req.twice:
            return _try(lambda: self.context.relocation_ready().defer())
        return "ok"

    @zlink.handler
    def use_kept(self, req: UseKept) -> str:
        return _try(self._kept.defer)

    @zlink.handler
    def add(self, msg: Add) -> None:
        self.events.append("add")

    @zlink.handler
    def get_events(self, req: Events) -> list[str]:
        return self.events

    def on_relocation_ready_completed(
        self, completion: zlink.SpotRelocationReadyCompletion
    ) -> None:
        error = "" if completion.error is None else f":{type(completion.error).__name__}"
        self.events.append(f"{completion.status.name}@{completion.node_id}{error}")


class Broken(zlink.JsonStateAdapter):
    def capture(self, instance: Any) -> bytes:
        raise RuntimeError("no")


def build_app() -> zlink.App:
    app = zlink.App("signaled")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    signaled = zlink.RelocationCoordination.APPLICATION_SIGNALED
    app.user_spot("t.rs2.table", relocation=state, relocation_coordination=signaled)(Table)
    app.user_spot("t.rs2.managed", relocation=state)(type("M", (Table,), {}))
    app.user_spot("t.rs2.per", mode=zlink.ExecutionMode.PER_ACTOR)(type("P", (Table,), {}))
    app.user_spot(
        "t.rs2.broken",
        relocation=zlink.Relocation.preserve_state(Broken),
        relocation_coordination=signaled,
    )(type("B", (Table,), {}))

    @app.instance_spot("t.rs2.inst")
    class Inst(zlink.InstanceSpot):
        @zlink.handler
        def ready(self, req: Ready) -> str:
            return _try(lambda: self.context.relocation_ready().defer())

    return app


@pytest.fixture
def cluster(clock: ManualClock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        yield cluster


def _events(client: zlink.Client, spot: str) -> list[str]:
    return client.request_to_spot(spot, Events()).wait(WAIT)  # type: ignore[no-any-return]


def test_defer_is_refused_in_the_default_mode_per_actor_instance_spots_and_twice(cluster):
    c = cluster.node(0).client()
    for spot_type, word in (("t.rs2.managed", "FRAMEWORK_MANAGED"), ("t.rs2.per", "PER_ACTOR")):
        c.spots.get_or_create(spot_type, spot_type).wait(WAIT)
        with pytest.raises(zlink.HandlerError, match=word):
            c.request_to_spot(spot_type, Ready()).wait(WAIT)
    inst = c.request_to_spot("i", Ready()).instance_spot("t.rs2.inst").wait(WAIT)
    assert inst.startswith("InvalidOperation") and "Instance" in inst
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    assert (
        c.request_to_spot("t", Ready(twice=True))
        .wait(WAIT)
        .startswith("InvalidOperation: relocation_ready().defer() was already called")
    )
    assert c.request_to_spot("t", Ready(keep=True)).wait(WAIT) == "kept"
    assert c.request_to_spot("t", UseKept()).wait(WAIT).startswith("InvalidOperation")
    # one boundary was registered (the first of "twice"): one CONTINUED, nothing else queued
    assert _events(c, "t").count("CONTINUED@node-1") == 1


def test_a_second_defer_of_one_call_is_refused_as_a_repeated_terminal(cluster):
    """python-api §11 "A repeated terminal": refused as such, before any other check, and
    without effect: the first defer()'s one boundary, one CONTINUED."""
    c = cluster.node(0).client()
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    second = c.request_to_spot("t", Ready(same_twice=True)).wait(WAIT)
    assert second.startswith("InvalidOperation: a call takes exactly one terminal")
    cluster.wait_idle(WAIT)
    assert _events(c, "t") == ["ready", "CONTINUED@node-1"]


def test_with_no_move_waiting_the_spot_is_told_it_continues_before_held_messages(cluster):
    n1 = cluster.node(0)
    c = n1.client()
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    act = n1._runtime.spots["t"]
    cluster.wait_idle(WAIT)  # the gate is free: nothing runs or is scheduled
    assert act.gate._flag.acquire(False)  # hold the gate: the next three queue up
    ready = c.request_to_spot("t", Ready()).future()
    c.send_to_spot("t", Add()).submit()
    c.send_to_spot("t", Add()).submit()
    n1._runtime.pool.submit(act.gate._run)
    assert ready.result(WAIT) == "ok"
    assert _events(c, "t") == ["ready", "CONTINUED@node-1", "add", "add"]


def test_a_requested_move_waits_for_the_signal_then_the_target_is_told_first(cluster):
    n1, n2 = cluster.nodes
    c = n1.client()
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    moving = n1._runtime.relocator.start(n1._runtime.spots["t"], "node-2")
    c.send_to_spot("t", Add()).submit()  # the move waits: work goes on at the source
    assert _events(c, "t") == ["add"] and not moving.done
    act = n1._runtime.spots["t"]
    cluster.wait_idle(WAIT)  # the gate is free: nothing runs or is scheduled
    assert act.gate._flag.acquire(False)
    ready = c.request_to_spot("t", Ready()).future()
    c.send_to_spot("t", Add()).submit()  # queued behind the boundary: it moves, held
    n1._runtime.pool.submit(act.gate._run)
    assert ready.result(WAIT) == "ok"
    moving.wait(WAIT)
    assert cluster.store.lookup("t").owner_node == "node-2"
    assert _events(n2.client(), "t") == ["add", "ready", "RELOCATED@node-2", "add"]


def test_an_unsignaled_move_times_out_and_is_withdrawn(cluster):
    n1 = cluster.node(0)
    c = n1.client()
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    with pytest.raises(zlink.DeadlineExceeded):
        n1.relocate_spot("t", "node-2", timeout=0.05)  # real seconds: a bounded negative
    assert c.request_to_spot("t", Ready()).wait(WAIT) == "ok"
    assert _events(c, "t") == ["ready", "CONTINUED@node-1"]
    assert cluster.store.lookup("t").owner_node == "node-1"


def test_a_move_that_fails_at_the_boundary_continues_at_the_source_and_says_why(cluster):
    n1 = cluster.node(0)
    c = n1.client()
    c.spots.get_or_create("b", "t.rs2.broken").wait(WAIT)
    moving = n1._runtime.relocator.start(n1._runtime.spots["b"], "node-2")
    assert c.request_to_spot("b", Ready()).wait(WAIT) == "ok"
    with pytest.raises(zlink.StateIncompatible):
        moving.wait(WAIT)
    assert _events(c, "b") == ["ready", "CONTINUED@node-1:StateIncompatible"]


def test_drain_gives_up_a_move_that_is_never_signaled(cluster):
    n1 = cluster.node(0)
    c = n1.client()
    c.spots.get_or_create("t", "t.rs2.table").wait(WAIT)
    result = n1.drain(timeout=0.05)  # real seconds: a bounded negative
    assert result.moved == [] and "DeadlineExceeded" in result.stayed["t"]
    assert n1._runtime.relocator._wanted == {}  # withdrawn: a later boundary moves nothing
    n1._runtime.draining = False  # reopen, to show the Spot hears CONTINUED and stays
    assert c.request_to_spot("t", Ready()).wait(WAIT) == "ok"
    assert _events(c, "t") == ["ready", "CONTINUED@node-1"]
