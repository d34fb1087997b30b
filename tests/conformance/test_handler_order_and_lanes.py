"""execution-model §16 "Handler order and lanes" (with §2, §6, §7, §8).

Concurrency is shown by side effects: a barrier that only opens if two handlers run at once,
and a non-blocking lock that fails if two turns of one gate ever overlap. Timer rows arrive with
the timers issue.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.executor import (
    Admission,
    CallJob,
    Gate,
    MonotonicClock,
    Owner,
    OwnerLanes,
    WorkerPool,
    current_turn,
)
from zlink.executor.lanes import APPLICATION, FULL_BYTES, FULL_COUNT, LIFECYCLE, LaneLimits
from zlink.testing import ManualClock, run_until_idle


class Meet(zlink.Request[str], type_name="t.ho.meet"):
    pass


class Enter(zlink.Message, type_name="t.ho.enter"):
    room: str


class Block(zlink.Message, type_name="t.ho.block"):
    pass


class Empty(zlink.Message, type_name="t.ho.empty"):
    pass


class Blob(zlink.Message, type_name="t.ho.blob"):
    data: str


class Count(zlink.Request[int], type_name="t.ho.count"):
    pass


def build_app(
    meeting: threading.Barrier,
    gate: threading.Event,
    ran: list[str],
    blocking: threading.Event | None = None,
) -> zlink.App:
    app = zlink.App("order")

    class Room(zlink.UserSpot):
        @zlink.handler
        def block(self, msg: Block) -> None:
            ran.append("block")
            if blocking is not None:
                blocking.set()
            assert gate.wait(WAIT)

        @zlink.handler
        def empty(self, msg: Empty) -> None:
            ran.append(f"empty@{threading.current_thread().name}")

        @zlink.handler
        def blob(self, msg: Blob) -> None:
            ran.append("blob")

        @zlink.handler
        def count(self, req: Count) -> int:
            return len(ran)

        def on_actor_join(self, actor_id: str, request: Any) -> zlink.ActorJoinResult:
            ran.append(f"join:{actor_id}")
            return zlink.ActorJoinResult()

    app.user_spot("t.ho.wide")(type("Wide", (Room,), {}))
    app.user_spot("t.ho.per", mode=zlink.ExecutionMode.PER_ACTOR)(type("Per", (Room,), {}))

    @app.entry_spot("t.ho.lobby", actor="t.ho.player")
    class Lobby(zlink.EntrySpot):
        pass

    @app.actor("t.ho.player")
    class Player(zlink.Actor):
        def __init__(self, context: zlink.ActorContext) -> None:
            super().__init__(context)
            self.in_room = threading.Event()

        @zlink.handler
        def meet(self, req: Meet) -> str:
            try:
                meeting.wait(0.3)  # opens only if the other Actor's handler runs at the same time
            except threading.BrokenBarrierError:
                return "alone"
            return "together"

        @zlink.handler
        def enter(self, msg: Enter) -> None:
            self.context.join(msg.room).defer()

        @zlink.handler
        def empty(self, msg: Empty) -> None:
            turn = current_turn()
            assert turn is not None and turn.owner is not None
            ran.append(f"actor-empty in the queue of {turn.owner.name}")

        def on_join_completed(self, completion: zlink.ActorJoinCompletion) -> None:
            self.in_room.set()

    return app


def _two_members(node: zlink.Node, room: str, mode: str) -> list[str]:
    client = node.client()
    client.spots.get_or_create(room, mode).wait(WAIT)
    ids = []
    for _ in range(2):
        pid = client.actors.create("t.ho.player").wait(WAIT).actor_id
        client.send_to_actor(pid, Enter(room=room)).submit()
        assert node._runtime.actors[pid].instance.in_room.wait(WAIT)
        ids.append(pid)
    return ids


@pytest.mark.parametrize(("mode", "expected"), [("t.ho.wide", "alone"), ("t.ho.per", "together")])
def test_spotwide_actors_never_run_concurrently_and_per_actor_actors_do(make_node, mode, expected):
    meeting = threading.Barrier(2)
    node = make_node(build_app(meeting, threading.Event(), []), workers=3)
    a, b = _two_members(node, "room", mode)
    client = node.client()
    fa = client.request_to_actor(a, Meet()).future()
    fb = client.request_to_actor(b, Meet()).future()
    assert {fa.result(WAIT), fb.result(WAIT)} == {expected}


@pytest.mark.parametrize("mode", ["t.ho.wide", "t.ho.per"])
def test_actor_payload_is_submitted_to_that_actors_queue_in_every_mode(make_node, mode):
    gate, ran, blocking = threading.Event(), [], threading.Event()
    node = make_node(build_app(threading.Barrier(2), gate, ran, blocking), workers=2)
    a, _ = _two_members(node, "room", mode)
    client = node.client()
    client.send_to_spot("room", Block()).submit()  # in SpotWide this holds the shared gate
    assert blocking.wait(WAIT)
    client.send_to_actor(a, Empty()).submit()
    rt = node._runtime
    if mode == "t.ho.wide":
        run_until_idle(node, WAIT, busy=1)  # settled, but for the turn holding the gate
        assert rt.actors[a].owner.lanes.reserved()[0] == 1
        assert all(type(job.msg) is not Empty for job in rt.spots["room"].owner.lanes.app)
    gate.set()
    node.wait_idle(WAIT)
    assert f"actor-empty in the queue of {a}" in ran


def test_a_task_submitted_to_a_full_queue_is_not_run_at_the_call_site(make_node):
    gate, ran = threading.Event(), []
    node = make_node(build_app(threading.Barrier(2), gate, ran), app_lane_items=3)
    client = node.client()
    client.spots.get_or_create("room", "t.ho.wide").wait(WAIT)
    client.send_to_spot("room", Block()).submit()  # running: still holds its reservation
    client.send_to_spot("room", Empty()).submit()
    client.send_to_spot("room", Empty()).submit()
    with pytest.raises(zlink.ResourceExhausted):
        client.send_to_spot("room", Empty()).submit()
    asked = client.request_to_spot("room", Count()).future()  # a request waits for room (§9)
    assert not asked.done()
    assert not any(r.endswith("@MainThread") for r in ran)  # never run inline
    gate.set()
    asked.result(WAIT)
    node.wait_idle(WAIT)
    assert sum(r.startswith("empty@") for r in ran) == 2  # nothing accepted was lost
    assert node.counters()["rejected_admissions"] == 1
    assert node.counters()["admission_waits"] == 1


def test_lifecycle_work_has_its_own_limit_and_runs_first_when_both_lanes_are_ready(make_node):
    gate, ran, blocking = threading.Event(), [], threading.Event()
    node = make_node(build_app(threading.Barrier(2), gate, ran, blocking), app_lane_items=2)
    client = node.client()
    client.spots.get_or_create("room", "t.ho.wide").wait(WAIT)
    pid = client.actors.create("t.ho.player").wait(WAIT).actor_id
    client.send_to_spot("room", Block()).submit()
    assert blocking.wait(WAIT)  # Block holds the gate before anything else is queued
    client.send_to_spot("room", Blob(data="x")).submit()  # the application lane is now full
    with pytest.raises(zlink.ResourceExhausted):
        client.send_to_spot("room", Blob(data="y")).submit()
    client.send_to_actor(pid, Enter(room="room")).submit()  # on_actor_join: lifecycle lane
    actor = node._runtime.actors[pid]
    lanes = node._runtime.spots["room"].owner.lanes

    run_until_idle(node, WAIT, busy=1)  # all settled but the blocked turn
    assert lanes.reserved()[2] == 1  # on_actor_join waits in the lifecycle lane
    gate.set()
    assert actor.instance.in_room.wait(WAIT)
    node.wait_idle(WAIT)
    assert ran == ["block", f"join:{pid}", "blob"]


def test_an_application_turn_runs_in_finite_time_under_incessant_lifecycle_work():
    pool = WorkerPool(1)
    pool.start()
    gate = Gate(pool, ManualClock(), 0.010)
    owner = Owner(OwnerLanes(LaneLimits()), gate, "o", claim_on_yield=False)
    order: list[str] = []
    app_ran = threading.Event()
    budget = [40]

    def lifecycle() -> None:
        order.append("L")
        if budget[0] > 0:  # every lifecycle turn submits another: the flood never stops
            budget[0] -= 1
            owner.put_life(CallJob(lifecycle, LIFECYCLE))

    assert gate._flag.acquire(False)  # fill both lanes before the gate may run
    for _ in range(3):
        owner.put_life(CallJob(lifecycle, LIFECYCLE))
    owner.put_app(CallJob(lambda: (order.append("A"), app_ran.set()), APPLICATION))
    pool.submit(gate._run)  # the holder hands the gate to the pool
    assert app_ran.wait(WAIT)
    pool.wait_idle(WAIT)
    pool.shutdown()
    assert order.index("A") <= 8  # at most 8 lifecycle turns in a row, then the owed app turn


def test_a_mass_submission_of_empty_payloads_hits_the_count_limit(make_node):
    gate, ran = threading.Event(), []
    node = make_node(build_app(threading.Barrier(2), gate, ran))
    client = node.client()
    client.spots.get_or_create("room", "t.ho.wide").wait(WAIT)
    client.send_to_spot("room", Block()).submit()
    for _ in range(1023):
        client.send_to_spot("room", Empty()).submit()
    with pytest.raises(zlink.ResourceExhausted, match="items"):
        client.send_to_spot("room", Empty()).submit()
    lanes = node._runtime.spots["room"].owner.lanes
    assert lanes.put_app(object(), 0) == FULL_COUNT
    gate.set()
    node.wait_idle(WAIT)
    assert sum(r.startswith("empty@") for r in ran) == 1023


def test_payload_bytes_count_against_the_byte_limit_with_256_retained_per_item():
    lanes = OwnerLanes(LaneLimits(app_items=100, app_bytes=1000))
    assert lanes.put_app("a", 244) == Admission.ADMITTED  # 244 + 256 = 500
    assert lanes.put_app("b", 244) == Admission.ADMITTED  # 1000: exactly full
    assert lanes.put_app("c", 0) == FULL_BYTES
    lanes.take()
    lanes.release(APPLICATION, 244)
    assert lanes.put_app("c", 244) == Admission.ADMITTED


def test_post_processing_does_not_overlap_the_next_task_nor_change_state_twice():
    pool = WorkerPool(4)
    pool.start()
    gate = Gate(pool, MonotonicClock(), 0.010)
    owner = Owner(OwnerLanes(LaneLimits(app_items=10_000)), gate, "o", claim_on_yield=False)
    state = {"in_post": False, "overlaps": 0, "posts": 0}
    finished = threading.Event()
    n = 500

    class PostJob(CallJob):
        __slots__ = ()

        def finish(self, turn: Any) -> None:
            state["in_post"] = True
            threading.Event().wait(0.0001)  # widen the window a racing task would hit
            state["posts"] += 1
            state["in_post"] = False
            if state["posts"] == n:
                finished.set()

    def body() -> None:
        if state["in_post"]:
            state["overlaps"] += 1

    for _ in range(n):
        owner.put_app(PostJob(body))
    assert finished.wait(WAIT)
    pool.wait_idle(WAIT)
    pool.shutdown()
    assert state == {"in_post": False, "overlaps": 0, "posts": n}
