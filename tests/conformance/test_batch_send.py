"""The batch send path (issue 5): ``send_many_to_spot`` / ``send_many_to_actor``.

A batch is admitted all or none (execution-model §7 admission: nothing is queued when it does
not fit), runs in order, and each message is still a turn of its own: its own Defer() scope
(§5), its own failure (an exception does not stop the rest), its own current turn.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock, run_until_idle


class Add(zlink.Message, type_name="t.bs.add"):
    n: int


class Boom(zlink.Message, type_name="t.bs.boom"):
    pass


class Later(zlink.Message, type_name="t.bs.later"):
    n: int


class Seen(zlink.Request[list[int]], type_name="t.bs.seen"):
    pass


class Who(zlink.Message, type_name="t.bs.who"):
    n: int


class Senders(zlink.Request[list[str]], type_name="t.bs.senders"):
    pass


class Relay(zlink.Message, type_name="t.bs.relay"):
    n: int


class Turns(zlink.Request[int], type_name="t.bs.turns"):
    pass


HOLD = threading.Event()


class Box(zlink.UserSpot):
    def __init__(self, context: zlink.SpotContext) -> None:
        super().__init__(context)
        self.seen: list[int] = []
        self.senders: list[str] = []
        self._turns: list[Any] = []

    @zlink.handler
    def add(self, msg: Add) -> None:
        turn = zlink.executor.current_turn()
        assert turn is not None and turn.barriers is None  # a fresh scope for each message
        self._turns.append(turn)  # kept alive: ids of dead turns are reused
        self.seen.append(msg.n)

    @zlink.handler
    def who(self, msg: Who, context: zlink.MessageContext) -> None:
        self.seen.append(msg.n)
        self.senders.append(f"{context.sender}:{dict(context.metadata)}:{context.is_request}")

    @zlink.handler
    def relay(self, msg: Relay) -> None:  # a batch sent from inside a handler
        self.context.outbound.send_many_to_spot("b2", [Who(n=msg.n), Who(n=msg.n + 1)]).submit()

    @zlink.handler
    def get_senders(self, req: Senders) -> list[str]:
        return self.senders

    @zlink.handler
    def boom(self, msg: Boom) -> None:
        raise RuntimeError("this one fails alone")

    @zlink.handler
    async def later(self, msg: Later) -> None:
        self.seen.append(msg.n)

    @zlink.handler
    def get_seen(self, req: Seen) -> list[int]:
        return self.seen

    @zlink.handler
    def turns_seen(self, req: Turns) -> int:
        return len({id(t) for t in self._turns})


def build_app() -> zlink.App:
    app = zlink.App("batch")
    state = zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    app.user_spot("t.bs.box", relocation=state)(Box)
    return app


def test_a_batch_runs_in_order_each_message_a_turn_and_a_failure_stays_its_own(make_node):
    node = make_node(build_app())
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    c.send_to_spot("b", Add(n=0)).submit()
    c.send_many_to_spot("b", [Add(n=1), Boom(), Add(n=2), Add(n=3)]).submit()
    c.send_to_spot("b", Add(n=4)).submit()
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [0, 1, 2, 3, 4]
    assert c.request_to_spot("b", Turns()).wait(WAIT) >= 3  # distinct turn objects (alive ids)
    assert node.counters()["handler_errors"] == 1


def test_a_batch_that_does_not_fit_is_refused_whole_and_nothing_is_queued(make_node):
    node = make_node(build_app(), app_lane_items=5)
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    act = node._runtime.spots["b"]
    run_until_idle(node, WAIT)  # the gate is free: nothing runs or is scheduled
    assert act.gate._flag.acquire(False)  # hold the gate: the lane fills
    c.send_many_to_spot("b", [Add(n=1), Add(n=2), Add(n=3)]).submit()
    with pytest.raises(zlink.ResourceExhausted, match="nothing of the batch"):
        c.send_many_to_spot("b", [Add(n=4), Add(n=5), Add(n=7)]).submit()
    c.send_to_spot("b", Add(n=6)).submit()  # one more still fits: the refusal took nothing
    assert act.owner.lanes.reserved()[0] == 4  # and the request below takes the last place
    node._runtime.pool.submit(act.gate._run)
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 2, 3, 6]


def test_bad_batches_are_refused_before_anything_is_queued(make_node):
    node = make_node(build_app())
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    with pytest.raises(zlink.InvalidArgument, match="at least one"):
        c.send_many_to_spot("b", [])
    with pytest.raises(zlink.InvalidArgument, match="iterable"):
        c.send_many_to_spot("b", Add(n=1))  # type: ignore[arg-type]
    with pytest.raises(zlink.InvalidArgument, match="is a request"):
        c.send_many_to_spot("b", [Add(n=1), Seen()])
    with pytest.raises(zlink.InvalidArgument, match="no handler"):
        c.send_many_to_spot("b", [Add(n=1), zlink.Message()]).submit()
    run_until_idle(node, WAIT)
    assert c.request_to_spot("b", Seen()).wait(WAIT) == []


def test_an_async_handler_in_a_batch_gets_a_queued_turn_of_its_own(make_node):
    node = make_node(build_app())
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    c.send_many_to_spot("b", [Add(n=1), Later(n=2), Add(n=3)]).submit()
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 2, 3]


def test_a_batch_with_an_async_handler_that_does_not_fit_is_refused_whole(make_node):
    """§8 "all or none admitted" holds for a batch queued message by message too (an async
    handler's message is a turn alone): a refusal partway used to leave the first ones queued
    while the caller heard that the batch failed."""
    node = make_node(build_app(), app_lane_items=5)
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    act = node._runtime.spots["b"]
    run_until_idle(node, WAIT)
    assert act.gate._flag.acquire(False)  # hold the gate: the lane fills
    c.send_many_to_spot("b", [Add(n=1), Later(n=2)]).submit()
    with pytest.raises(zlink.ResourceExhausted, match="nothing of the batch"):
        c.send_many_to_spot("b", [Later(n=3), Add(n=4), Later(n=5), Add(n=6)]).submit()
    assert act.owner.lanes.reserved()[0] == 2  # the refusal queued nothing
    c.send_many_to_spot("b", [Later(n=7), Add(n=8), Later(n=9)]).submit()  # fits whole
    assert act.owner.lanes.reserved()[0] == 5
    node._runtime.pool.submit(act.gate._run)
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 2, 7, 8, 9]


def test_a_waiting_batch_with_an_async_handler_waits_for_room_for_all_of_it(make_node):
    """python-api §9: ``wait()`` on a batch waits for room for the whole batch, whichever way
    its messages are queued; then all of it runs, in order, behind what was there."""
    node = make_node(build_app(), app_lane_items=4)
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    act = node._runtime.spots["b"]
    run_until_idle(node, WAIT)
    assert act.gate._flag.acquire(False)
    c.send_many_to_spot("b", [Add(n=1), Add(n=2), Later(n=3)]).submit()
    waiting = c.send_many_to_spot("b", [Later(n=4), Add(n=5), Later(n=6)]).future()
    assert not waiting.done()  # no room for three: it waits, as one, with nothing queued
    assert act.owner.lanes.waiting() == 1 and act.owner.lanes.reserved()[0] == 3
    node._runtime.pool.submit(act.gate._run)
    assert waiting.result(WAIT) is None
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 2, 3, 4, 5, 6]


def test_a_queued_batch_moves_with_its_spot_message_by_message(clock: ManualClock):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        n1, n2 = cluster.nodes
        c = n1.client()
        c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
        act = n1._runtime.spots["b"]
        cluster.wait_idle(WAIT)  # the gate is free: nothing runs or is scheduled
        assert act.gate._flag.acquire(False)
        c.send_many_to_spot("b", [Add(n=1), Add(n=2)]).submit()
        moving = n1._runtime.relocator.start(act, "node-2")
        n1._runtime.pool.submit(act.gate._run)
        moving.wait(WAIT)
        c.send_many_to_spot("b", [Add(n=3), Add(n=4)]).submit()  # remote: one by one, in order
        cluster.wait_idle(WAIT)
        assert n2.client().request_to_spot("b", Seen()).wait(WAIT) == [1, 2, 3, 4]
        assert "b" not in n1._runtime.spots


def test_a_handler_that_takes_a_context_gets_one_per_message_with_its_sender(make_node):
    """One context per message, batched or not, with its sender and its metadata."""
    node = make_node(build_app())
    c = node.client()
    for sid in ("b", "b2"):
        c.spots.get_or_create(sid, "t.bs.box").wait(WAIT)
    c.send_many_to_spot("b2", [Who(n=1), Add(n=2), Who(n=3)]).submit()  # two types
    c.send_to_spot("b", Relay(n=4)).submit()
    assert c.request_to_spot("b", Seen()).wait(WAIT) == []  # its relay is queued on b2 by now
    tagged = c.send_to_spot("b2", Who(n=6)).metadata("k", "v")  # an option: the general path
    tagged.submit()
    with pytest.raises(zlink.InvalidOperation, match="one terminal"):
        tagged.submit()  # a call takes one terminal, on either path
    plain = c.send_to_spot("b2", Who(n=7))
    plain.submit()
    with pytest.raises(zlink.InvalidOperation, match="one terminal"):
        plain.submit()
    assert c.request_to_spot("b2", Seen()).wait(WAIT) == [1, 2, 3, 4, 5, 6, 7]
    assert c.request_to_spot("b2", Senders()).wait(WAIT) == [
        "None:{}:False", "None:{}:False", "b:{}:False", "b:{}:False", "None:{'k': 'v'}:False",
        "None:{}:False",
    ]  # fmt: skip


def test_a_batch_of_one_type_reserves_its_wire_bytes_and_256_per_message(make_node):
    """§7: payload bytes plus the retained cost of each item, taken all at once. A local lane
    reserves each payload's bound (never less than its wire bytes: ``lane_size``), which for
    a message of one int is at most 19 bytes more than its JSON."""
    node = make_node(build_app())
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    act = node._runtime.spots["b"]
    run_until_idle(node, WAIT)
    assert act.gate._flag.acquire(False)
    batch = [Add(n=i) for i in (1, 22, 333)]
    c.send_many_to_spot("b", batch).submit()
    size = sum(len(m.model_dump_json()) for m in batch)
    count, reserved = act.owner.lanes.reserved()[:2]
    assert count == 3
    assert size + 3 * 256 <= reserved <= size + 3 * (256 + 19)
    node._runtime.pool.submit(act.gate._run)
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 22, 333]
    run_until_idle(node, WAIT)  # the reply is sent before its own reservation goes back (§8)
    assert act.owner.lanes.reserved()[:2] == (0, 0)


def test_a_failing_one_way_handler_is_counted_and_logged_and_the_next_message_runs(
    make_node, caplog
):
    """A one-way message's failure is its own (§4): logged with its handler, counted, and
    the messages behind it run, whether sent one by one or in a batch."""
    node = make_node(build_app())
    c = node.client()
    c.spots.get_or_create("b", "t.bs.box").wait(WAIT)
    c.send_to_spot("b", Boom()).submit()
    c.send_to_spot("b", Add(n=1)).submit()
    c.send_many_to_spot("b", [Boom(), Add(n=2)]).submit()
    assert c.request_to_spot("b", Seen()).wait(WAIT) == [1, 2]
    assert node.counters()["handler_errors"] == 2
    assert "this one fails alone" in caplog.text and "Box.boom" in caplog.text
