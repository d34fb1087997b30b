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
import time
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


class Slow(zlink.Request[int], type_name="t.ir.slow"):
    pass


class Hold(zlink.Request[str], type_name="t.ir.hold"):
    pass


CLOSE_CALLED, HOLD, HOLDING = threading.Event(), threading.Event(), threading.Event()


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
    for event in (CLOSE_CALLED, HOLD, HOLDING):
        event.clear()
    yield
    CLOSE_GO.set()
    HOLD.set()


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
            if every and msg.n >= 0 and msg.n % every == every - 1:
                self.context.close()

        @zlink.handler
        def which(self, req: Which) -> int:
            return self.activation

        @zlink.handler
        def close_me(self, msg: CloseMe) -> None:
            self.context.close()
            CLOSE_CALLED.set()  # (after: a call made once this is set meets the close)

        @zlink.handler
        async def slow(self, req: Slow) -> int:  # suspended in a Yield until HOLD is set
            await self.context.outbound.request("t.ir.api", Hold()).yield_()
            return self.activation

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            SEEN.append((self.activation, "on_closing", -1))
            CLOSING.set()
            assert CLOSE_GO.wait(WAIT)

    @app.channel("t.ir.api")
    class Api:
        def __init__(self, context: zlink.ChannelContext) -> None:
            self.context = context

        @zlink.handler
        def hold(self, req: Hold) -> str:
            HOLDING.set()
            assert HOLD.wait(WAIT)
            return "held"

    @app.user_spot("t.ir.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def which(self, req: Which) -> int:
            return 0

        def on_closing(self, closing: zlink.SpotClosingContext) -> None:
            CLOSING.set()
            assert CLOSE_GO.wait(WAIT)

    return app


class _LockSpy:
    """A lock that says (``asked``) when the thread named ``who`` asks for it."""

    def __init__(self, real: Any, who: str) -> None:
        self.real, self.who, self.asked = real, who, threading.Event()

    def __enter__(self) -> Any:
        if threading.current_thread().name == self.who:
            self.asked.set()
        return self.real.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.real.__exit__(*exc)


def _recorded(outcome: list[Any], call: Any) -> Any:
    """A thread's target: ``call()``, then "taken" or what it raised, in ``outcome``."""

    def run() -> None:
        try:
            call()
            outcome.append("taken")
        except BaseException as exc:  # noqa: BLE001 - the fault under test
            outcome.append(exc)

    return run


def _until(check: Any, what: str) -> None:
    """Poll ``check`` (another thread's result, with no event to wait on), bounded."""
    deadline = time.monotonic() + 2 * WAIT
    while not check():
        assert time.monotonic() < deadline, f"not within {2 * WAIT} s: {what}"
        time.sleep(0.001)


def _notes() -> list[tuple[int, str, int]]:
    return [entry for entry in SEEN if entry[1] != "on_closing"]


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
    assert _notes() == [(2, "a", 0), (2, "a", 1), (2, "a", 2), (2, "a", 3)]
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
    """Three senders, 600 messages each, waiting for room (one of them in batches of 5);
    the Spot closes itself after every 50th message it handles, so dozens of activations
    come and go meanwhile: every message is handled once, each sender's in the order sent,
    each batch whole."""
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

    def send_batches(sender: str) -> None:
        try:
            for n in range(0, 600, 5):
                notes = [Note(sender=sender, n=m) for m in range(n, n + 5)]
                for _ in range(100):
                    try:
                        client.send_many_to_spot("s", notes).wait(WAIT)
                        break
                    except zlink.NotFound:  # closed with nothing queued, so not made again;
                        # a batch makes no Instance Spot (python-api §8): a message does
                        client.send_to_spot("s", Note(sender="-", n=-1)).instance_spot().wait(WAIT)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(s,)) for s in ("a", "b")]
    threads.append(threading.Thread(target=send_batches, args=("c",)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * WAIT)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    node.wait_idle(WAIT)
    for sender in ("a", "b", "c"):
        assert [n for _a, s, n in _notes() if s == sender] == list(range(600))
    activations = [a for a, _s, _n in _notes()]
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
    assert [n for _a, _s, n in _notes()] == list(range(8))
    assert {a for a, _s, _n in _notes()} == {2}


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
    assert _notes() == []
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
        before = cluster.node(0)._runtime.spots["s"].ref.object_generation
        CLOSE_GO.set()
        assert asked.result(WAIT) == 2
        cluster.wait_idle(WAIT)
        # a generation of its own (execution-model §14), from the store, which says so too
        after = cluster.node(0)._runtime.spots["s"].ref.object_generation
        assert after > before
        assert cluster.store.lookup("s").object_generation == after
        for sender in ("far", "near"):
            mine = [(a, n) for a, s, n in _notes() if s == sender]
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
    assert [(a, n) for a, _s, n in _notes()] == [(2, n) for n in range(7)]
    assert node.counters().get("messages_carried_to_next_activation") == 6


def test_calls_after_a_close_never_run_on_the_closing_instance(make_node):
    """Found by review: the closing Spot took calls into its own lanes, and while its
    ``on_closing`` waited for a Yield still suspended (the all-lane barrier, python-api
    §11), its gate ran them on the instance that had asked to close (3 of 3 runs); a
    stream of yielding ones held the close off for seconds. They now wait apart, for the
    next activation, behind ``on_closing``."""
    node = make_node(build_app())
    client = node.client()
    slow = client.request_to_spot("s", Slow()).instance_spot().timeout(WAIT).future()
    assert HOLDING.wait(WAIT)  # "slow" is suspended in its Yield, awaiting the Channel
    client.send_to_spot("s", CloseMe()).instance_spot().wait(WAIT)
    assert CLOSE_CALLED.wait(WAIT)
    for n in range(3):
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().wait(WAIT)
    more = client.request_to_spot("s", Slow()).instance_spot().timeout(WAIT).future()
    HOLD.set()
    assert slow.result(WAIT) == 1
    assert more.result(WAIT) == 2
    node.wait_idle(WAIT)
    assert SEEN == [(1, "on_closing", -1), (2, "a", 0), (2, "a", 1), (2, "a", 2)]


def test_a_batch_that_meets_the_end_of_a_close_goes_whole_to_the_next_activation(
    make_node, monkeypatch
):
    """Found by review: a waiting batch that met the close's end (its admission closed)
    went on message by message, without waiting, into the next activation's lane, full of
    what it carried: ``ResourceExhausted`` with part of the batch handled (4 of 8 runs on
    3.13t). A batch is all or none, and its ``wait()`` waits (python-api §8, §9). The test
    sends the batch right as the close ends, under the directory lock."""
    from zlink.runtime.closing import Closing

    node = make_node(build_app(), app_lane_items=4)
    client = node.client()
    _held_close(client, "self_close", node, ManualClock())
    for n in range(4):  # the next activation's lane is full with them
        client.send_to_spot("s", Note(sender="a", n=n)).instance_spot().submit()
    rt = node._runtime
    real_lock, outcome = rt.directory.lock, []
    spy = _LockSpy(real_lock, "batch")
    waiting = spy.asked

    notes = [Note(sender="a", n=n) for n in range(4, 7)]
    batch = _recorded(outcome, lambda: client.send_many_to_spot("s", notes).wait(WAIT))

    real = Closing._reactivate

    def reactivate(self: Closing, act: Any, *args: Any) -> Any:
        out = real(self, act, *args)  # (the directory lock held: the close's end, under way)
        rt.directory.lock = spy
        sender = threading.Thread(target=batch, name="batch")
        sender.start()
        waiting.wait(WAIT)  # it met the closed admission and waits for this step's end
        return out

    monkeypatch.setattr(Closing, "_reactivate", reactivate)
    CLOSE_GO.set()
    _until(lambda: bool(outcome), "the batch's outcome")
    rt.directory.lock = real_lock
    assert outcome == ["taken"]
    node.wait_idle(WAIT)
    assert [n for _a, _s, n in _notes()] == list(range(7))
    assert {a for a, _s, _n in _notes()} == {2}


def test_a_batch_that_finds_no_spot_as_a_call_activates_it_is_all_or_none(make_node, monkeypatch):
    """Found by a 3.13t soak (1 run in 60 of the 600-message test above): a waiting batch
    that found no Spot (closed, with nothing to carry) went on message by message without
    waiting; a call that activated the Spot again in that moment had filled its lane, and
    the batch's first message was refused, ``ResourceExhausted`` ("nothing was queued"),
    though its caller waited for room, and a later one refused so would have left the first
    ones queued. A batch makes no Instance Spot (python-api §8): finding none, it is
    ``NotFound`` with nothing queued; finding one, all of it is admitted, waiting for room
    (§9). The test runs the other caller's activation right after the batch has looked."""
    from zlink.runtime.runtime import Runtime

    node = make_node(build_app(), app_lane_items=2, workers=1)
    client = node.client()
    rt = node._runtime
    assert rt.relocator is None and "s" not in rt.spots  # one node; no Spot "s" yet
    HOLD.clear()
    held = client.request("t.ir.api", Hold()).future()  # the one worker: nothing drains
    assert HOLDING.wait(WAIT)
    fired: list[BaseException | None] = []

    def relocator(self: Any) -> Any:  # read by the batch path once it found no Spot
        if threading.current_thread().name == "batch" and not fired:
            fired.append(None)
            for n in range(2):  # another caller activates "s" and fills its lane
                client.send_to_spot("s", Note(sender="b", n=n)).instance_spot().submit()
        return self.__dict__["relocator"]

    monkeypatch.setattr(Runtime, "relocator", property(relocator), raising=False)
    outcome: list[Any] = []
    notes = [Note(sender="a", n=n) for n in range(2)]
    batch = _recorded(outcome, lambda: client.send_many_to_spot("s", notes).wait(WAIT))
    sender = threading.Thread(target=batch, name="batch")
    sender.start()
    sender.join(WAIT)
    monkeypatch.undo()
    assert len(outcome) == 1
    assert outcome == ["taken"] or isinstance(outcome[0], zlink.NotFound), outcome
    if not fired:  # (the batch said NotFound before the other caller came: it comes now)
        for n in range(2):
            client.send_to_spot("s", Note(sender="b", n=n)).instance_spot().submit()
    HOLD.set()
    assert held.result(WAIT) == "held"
    node.wait_idle(WAIT)
    expect = [("b", 0), ("b", 1)] + ([("a", 0), ("a", 1)] if outcome == ["taken"] else [])
    assert [(s, n) for _a, s, n in _notes()] == expect


def test_a_drain_that_begins_while_it_closes_loses_nothing_it_took(clock: ManualClock):
    """Found by review: calls a closing Instance Spot took before its node began to drain
    were discarded at the close's end as "spot was closed", counted on that node only. A
    node that drains still serves what stayed (``drain()``): it makes the next activation
    for them."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        home, other = cluster.node(0), cluster.node(1)
        assert home.client().request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1
        assert other.client().request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1
        CLOSE_GO.clear()
        home.client().send_to_spot("s", CloseMe()).instance_spot().wait(WAIT)
        assert CLOSING.wait(WAIT)
        for n in range(3):
            other.client().send_to_spot("s", Note(sender="far", n=n)).instance_spot().wait(WAIT)
        asked = other.client().request_to_spot("s", Which()).instance_spot().timeout(WAIT)
        answer = asked.future()
        drained: list[Any] = []
        drainer = threading.Thread(target=lambda: drained.append(home.drain(WAIT)))
        drainer.start()
        _until(lambda: home._runtime.draining, "the drain begins")
        CLOSE_GO.set()
        drainer.join(WAIT)
        assert answer.result(WAIT) == 2
        cluster.wait_idle(WAIT)
        assert [(a, n) for a, s, n in _notes() if s == "far"] == [(2, 0), (2, 1), (2, 2)]
        for node in cluster.nodes:
            assert not any(
                k.startswith(("messages_discarded", "sends_dropped", "remote_sends_dropped"))
                for k in node.counters()
            )


def test_a_call_that_meets_an_eviction_as_it_looks_is_taken_for_the_next_activation(
    make_node, clock: ManualClock, monkeypatch
):
    """Found by review: an idle eviction closes admission for a moment to look
    (``close_if_idle``, under the directory lock); a call refused in that moment read the
    state before and after the eviction's step and got ``Unavailable``. The test holds
    the eviction right there until the call waits for the directory lock: the call is
    then taken, for the next activation."""
    from zlink.executor import OwnerLanes

    node = make_node(build_app(), idle_timeout=10.0)
    client = node.client()
    client.send_to_spot("s", Note(sender="a", n=0)).instance_spot().wait(WAIT)
    node.wait_idle(WAIT)
    rt = node._runtime
    real_lock, outcome = rt.directory.lock, []
    spy = _LockSpy(real_lock, "sender")
    waiting = spy.asked

    send = _recorded(
        outcome, lambda: client.send_to_spot("s", Note(sender="a", n=1)).instance_spot().submit()
    )

    real = OwnerLanes.close_if_idle

    def look(self: OwnerLanes, is_tick: Any) -> bool:
        idle = real(self, is_tick)
        if idle and not waiting.is_set():  # (the eviction's thread, the directory lock held)
            rt.directory.lock = spy
            threading.Thread(target=send, name="sender").start()
            assert waiting.wait(WAIT), "the call never came to the directory lock"
        return idle

    monkeypatch.setattr(OwnerLanes, "close_if_idle", look)
    CLOSE_GO.clear()
    clock.advance(3.0)
    node.wait_idle(WAIT)
    clock.advance(12.0)
    assert CLOSING.wait(WAIT)
    rt.directory.lock = real_lock
    CLOSE_GO.set()
    _until(lambda: bool(outcome), "the sender's outcome")
    assert outcome == ["taken"]
    node.wait_idle(WAIT)
    assert _notes() == [(1, "a", 0), (2, "a", 1)]


def test_on_a_mesh_a_store_that_gives_no_new_generation_fails_what_was_held(
    clock: ManualClock, monkeypatch
):
    """The next activation on a mesh waits for its generation from the store (execution-
    model §14); a store that refuses it (the owner was fenced, say) means no next
    activation here: what was held fails with ``Unavailable``, each counted."""
    with LocalCluster(build_app(), nodes=2, clock=clock, workers=2) as cluster:
        home = cluster.node(0).client()
        assert home.request_to_spot("s", Which()).instance_spot().wait(WAIT) == 1

        def refuse(*args: Any) -> Any:
            raise zlink.Unavailable("the store says no")

        monkeypatch.setattr(cluster.store, "new_generation", refuse)
        CLOSE_GO.clear()
        home.send_to_spot("s", CloseMe()).instance_spot().wait(WAIT)
        assert CLOSING.wait(WAIT)
        home.send_to_spot("s", Note(sender="a", n=0)).instance_spot().wait(WAIT)
        asked = home.request_to_spot("s", Which()).instance_spot().timeout(WAIT).future()
        CLOSE_GO.set()
        with pytest.raises(zlink.Unavailable, match="could not be made again"):
            asked.result(WAIT)
        cluster.wait_idle(WAIT)
        counters = cluster.node(0).counters()
        assert counters.get("instance_reactivations_refused") == 1
        assert counters.get("messages_discarded_spot_closed") == 2
        assert _notes() == []
        monkeypatch.undo()  # the store answers again: the next call makes it anew
        assert home.request_to_spot("s", Which()).instance_spot().wait(WAIT) == 2
