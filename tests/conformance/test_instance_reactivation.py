"""Calls that meet an Instance Spot while it deactivates go to its next activation.

An Instance Spot is addressed by id and activated by its first message (execution-model
§14); it goes when it is idle (``IDLE_EVICTED``) or closes itself (kotlin-spot-interface
lifecycle). A caller cannot see either coming, so a call that arrives while ``on_closing``
runs is neither refused nor lost: it queues as any call does, within what the Spot's lane
holds (python-api §9), and with what the Spot took and never ran it is the first work of the
next activation, made at once when the close has ended (as Orleans forwards the messages a
deactivating grain received to its next activation). Per-sender order holds across the two
activations (§6). Calls for a closing *User* Spot are still refused (``Unavailable``): it is
not made again by a call.

Before this, each such call ended with ``Unavailable`` ("closing or moving"), a send's
message lost to its sender unless it looked at the error.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink.testing import LocalCluster, ManualClock


class Note(zlink.Message, type_name="t.ir.note"):
    sender: str
    n: int


class Which(zlink.Request[int], type_name="t.ir.which"):
    pass


class CloseMe(zlink.Message, type_name="t.ir.close"):
    pass


INCARNATIONS = itertools.count(1)
SEEN: list[tuple[int, str, int]] = []  # (activation, sender, n)
CLOSING, CLOSE_GO = threading.Event(), threading.Event()
CLOSE_EVERY = [0]  # a Note whose n is a multiple of this closes the Spot (0: never)


@pytest.fixture(autouse=True)
def _clear(make_node: Any) -> Iterator[None]:  # (set up after ``make_node``: torn down
    # first, so a test that fails with a close held lets it go before its node stops)
    global INCARNATIONS
    INCARNATIONS = itertools.count(1)
    SEEN.clear()
    CLOSING.clear()
    CLOSE_GO.set()  # on_closing goes on at once unless a test holds it
    CLOSE_EVERY[0] = 0
    yield
    CLOSE_GO.set()


def build_app() -> zlink.App:
    app = zlink.App("instance-reactivation")

    @app.instance_spot("t.ir.session")
    class Session(zlink.InstanceSpot):
        def __init__(self, context: zlink.SpotContext) -> None:
            super().__init__(context)
            self.activation = next(INCARNATIONS)

        @zlink.handler
        def note(self, msg: Note) -> None:
            SEEN.append((self.activation, msg.sender, msg.n))
            every = CLOSE_EVERY[0]
            if every and msg.n % every == every - 1:
                self.context.close()

        @zlink.handler
        def which(self, req: Which) -> int:
            return self.activation

        @zlink.handler
        def close_me(self, msg: CloseMe) -> None:
            self.context.close()

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSING.set()
            assert CLOSE_GO.wait(WAIT)

    @app.user_spot("t.ir.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def which(self, req: Which) -> int:
            return 0

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSING.set()
            assert CLOSE_GO.wait(WAIT)

    return app


def _held_close(client: Any, how: str, node: zlink.Node, clock: ManualClock) -> None:
    """Activation 1 of "s", then its close begun and held in ``on_closing``."""
    assert client.request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1
    CLOSE_GO.clear()
    if how == "self_close":
        client.send_to_spot("s", CloseMe()).instance_spot().wait(WAIT)
    else:  # idle eviction: the sweep sees it idle, then finds it idle for the whole timeout
        node.wait_idle(WAIT)
        clock.advance(3.0)
        node.wait_idle(WAIT)
        clock.advance(12.0)
    assert CLOSING.wait(WAIT), "on_closing never ran"


@pytest.mark.parametrize("how", ["self_close", "idle_eviction"])
def test_calls_that_meet_a_deactivating_instance_spot_run_on_its_next_activation(
    make_node, clock: ManualClock, how: str
):
    node = make_node(build_app(), idle_timeout=10.0)
    client = node.client()
    _held_close(client, how, node, clock)
    for n in range(3):  # fail-fast sends are taken: queued for the next activation
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().submit()
    asked = client.request_to_spot("s", Which()).instance_spot().timeout(WAIT).future()
    waited = client.send_to_spot("s", Note(sender="a", n=3)).instance_spot().future()
    assert waited.result(WAIT) is None  # accepted at once, not waiting for room
    assert not asked.done()
    CLOSE_GO.set()
    assert asked.result(WAIT) == 2
    node.wait_idle(WAIT)
    assert SEEN == [(2, "a", 0), (2, "a", 1), (2, "a", 2), (2, "a", 3)]
    counters = node.counters()
    assert counters.get("messages_carried_to_next_activation") == 5
    assert counters.get("instance_reactivations") == 1
    assert not counters.get("handler_errors")
    assert not any(k.startswith(("messages_discarded", "sends_dropped")) for k in counters)


def test_a_closing_user_spot_still_refuses_calls(make_node):
    """A User Spot is made by ``create``, never by a call: one closing refuses (§5)."""
    node = make_node(build_app())
    client = node.client()
    ref = client.spots.get_or_create("r", "t.ir.room").wait(WAIT).spot_ref
    CLOSE_GO.clear()
    assert client.spots.close(ref)
    assert CLOSING.wait(WAIT)
    with pytest.raises(zlink.Unavailable):
        client.request_to_spot("r", Which()).wait(WAIT)
    CLOSE_GO.set()


def test_a_spot_that_closes_itself_under_load_loses_nothing_and_keeps_each_senders_order(
    make_node,
):
    """Two senders, 600 messages each, waiting for room; the Spot closes itself after every
    50th message it handles, so about two dozen activations come and go meanwhile: every
    message is handled once, each sender's in the order sent."""
    CLOSE_EVERY[0] = 50
    node = make_node(build_app(), app_lane_items=16)
    client = node.client()
    errors: list[BaseException] = []

    def send(sender: str) -> None:
        try:
            for n in range(600):
                client.send_to_spot("s", Note(sender=sender, n=n)).instance_spot().wait(WAIT)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    node.wait_idle(WAIT)
    for sender in ("a", "b"):
        assert [n for _a, s, n in SEEN if s == sender] == list(range(600))
    activations = [a for a, _s, _n in SEEN]
    assert activations == sorted(activations)  # each activation's work before the next's
    assert activations[-1] > 2
    assert not node.counters().get("handler_errors")


def test_what_a_deactivating_spot_takes_is_bounded_by_its_lane(make_node):
    """Calls taken while it closes count against what the Spot's lane holds (python-api
    §9): past it a plain send is refused at once, nothing queued; a waiting send waits for
    room, in order, is routed to the next activation, and is handled."""
    node = make_node(build_app(), app_lane_items=4)
    client = node.client()
    _held_close(client, "self_close", node, ManualClock())
    for n in range(4):
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().submit()
    with pytest.raises(zlink.ResourceExhausted):
        client.send_to_spot("s", Note(sender="a", n=99)).instance_spot().submit()
    waiting = [
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().future()
        for n in range(4, 8)
    ]
    assert not any(f.done() for f in waiting)  # no room yet: they wait for it
    CLOSE_GO.set()
    for f in waiting:
        assert f.result(WAIT) is None
    node.wait_idle(WAIT)
    assert [n for _a, _s, n in SEEN] == list(range(8))
    assert {a for a, _s, _n in SEEN} == {2}


def test_what_a_deactivating_spot_took_when_the_node_stops_is_refused_and_counted(make_node):
    node = make_node(build_app())
    client = node.client()
    _held_close(client, "self_close", node, ManualClock())
    client.send_to_spot("s", Note(sender="a", n=0)).instance_spot().submit()
    asked = client.request_to_spot("s", Which()).instance_spot().timeout(WAIT).future()
    stopper = threading.Thread(target=node.shutdown, args=(WAIT,))
    stopper.start()
    try:
        assert node._runtime.stopped_admission.wait(WAIT)
    finally:
        CLOSE_GO.set()
        stopper.join(WAIT)
    with pytest.raises(zlink.Unavailable):
        asked.result(WAIT)
    assert SEEN == []
    assert node.counters().get("messages_discarded_at_shutdown") == 2  # the send, the request
    assert not node.counters().get("instance_reactivations")


def test_calls_from_another_node_meet_the_deactivation_and_run_on_the_next_activation(
    clock: ManualClock,
):
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        home, other = cluster.node(0).client(), cluster.node(1).client()
        assert home.request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1
        assert other.request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1  # a route
        CLOSE_GO.clear()
        home.send_to_spot("s", CloseMe()).instance_spot().wait(WAIT)
        assert CLOSING.wait(WAIT)
        for n in range(3):
            other.send_to_spot("s", Note(sender="far", n=n)).instance_spot().wait(WAIT)
            home.send_to_spot("s", Note(sender="near", n=n)).instance_spot().wait(WAIT)
        asked = other.request_to_spot("s", Which()).instance_spot().timeout(WAIT).future()
        CLOSE_GO.set()
        assert asked.result(WAIT) == 2
        cluster.wait_idle(WAIT)
        for sender in ("far", "near"):
            mine = [(a, n) for a, s, n in SEEN if s == sender]
            assert mine == [(2, 0), (2, 1), (2, 2)], SEEN
        for node in cluster.nodes:
            dropped = ("sends_dropped", "remote_sends_dropped")
            assert not any(k.startswith(dropped) for k in node.counters())


def test_callers_waiting_for_room_in_a_deactivating_spot_go_to_the_next_one_in_order(make_node):
    """A send that waits for room in the closing activation's full lane keeps waiting
    there (it is not refused as a closing User Spot's waiter is) and is taken in by the next
    activation right behind what was queued, in order, before any later call."""
    node = make_node(build_app(), app_lane_items=2)
    client = node.client()
    _held_close(client, "self_close", node, ManualClock())
    for n in range(2):
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().submit()
    waiting = [
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().future()
        for n in range(2, 6)
    ]
    assert not any(f.done() for f in waiting)
    CLOSE_GO.set()
    for f in waiting:
        assert f.result(WAIT) is None
    client.send_to_spot("s", Note(sender="a", n=6)).instance_spot().wait(WAIT)
    node.wait_idle(WAIT)
    assert [(a, n) for a, _s, n in SEEN] == [(2, n) for n in range(7)]
    assert node.counters().get("messages_carried_to_next_activation") == 6
