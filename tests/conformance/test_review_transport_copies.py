"""Review of 1ddcd43 (transport audit) and ac1a6f0 (copies a target lets go end with
``AnsweredElsewhere``): each test here failed on the code as reviewed (python-api §9: a call
handled at its target or counted dropped, never both; a request answered once)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import zlink
from tests.conformance.test_store_review_faults import (
    ADDED,
    BLOCKING,
    GO,
    WHERE_RAN,
    Add,
    Block,
    Where,
    _told,
    _until,
    build_room_app,
)
from tests.conformance.test_transport_audit_faults import _poll
from tests.conftest import WAIT, hold_transfer
from tests.unit.test_zmq_transport_flow import _counter, _raw_sender
from zlink.mesh.zmq_transport import _HEADER, VERSION, _Kind, identity
from zlink.testing import LocalCluster


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    for event in (BLOCKING, GO):
        event.clear()
    ADDED.clear()
    WHERE_RAN.clear()
    yield
    GO.set()


def _kept_at(node: zlink.Node) -> int:
    relocator = node._runtime.relocator  # type: ignore[attr-defined]
    if relocator is None:
        return 0
    with relocator._lock:
        return sum(len(inc.kept) for inc in relocator._in.values())


# -- F1: the calls the source RELAYED to a stopping target (kept there, ``Inbound.stopped``) ----


def _relayed_then_target_stops(
    send: Callable[[Any], Any], kept: int, check: Callable[[zlink.Node, Any], None]
) -> None:
    """Node-1 moves "room" to node-2; node-2 restores; node-1's commit waits in the store.
    Meanwhile ``send(c1)`` makes calls on node-1 that node-1 RELAYS to node-2 (and keeps in
    ``Outgoing.relayed``, serving them itself should the store refuse). node-2 stops (its
    ``Inbound.stopped`` ends what it kept); then node-1's commit is refused (node-2 left
    the store): node-1 reopens and runs its kept originals of the relayed calls. ``check``
    then runs with node-1 and what ``send`` returned, the cluster still up."""
    results: list[Any] = []
    cluster = LocalCluster(build_room_app(), nodes=2, workers=2)
    with cluster:
        n1, n2 = cluster.nodes
        store = cluster.store
        c1 = n1.client()
        c1.spots.get_or_create("room", "t.rv.room").wait(WAIT)
        entered, go = hold_transfer(
            store, "room"
        )  # node-2 restored; node-1 relayed what it parked, and waits here
        mover: threading.Thread | None = None
        try:
            c1.send_to_spot("room", Block()).submit()
            assert BLOCKING.wait(WAIT)

            def move() -> None:
                with contextlib.suppress(BaseException):  # refused: expected
                    n1.relocate_spot("room", "node-2", 4 * WAIT)

            mover = threading.Thread(target=move, daemon=True)
            mover.start()
            _until(
                lambda: (
                    n1._runtime.relocator is not None  # type: ignore[attr-defined]
                    and n1._runtime.relocator.moving("room")
                ),
                "the move began",
            )  # type: ignore[attr-defined]
            GO.set()
            assert entered.wait(WAIT), "the commit was not reached"
            results.append(send(c1))  # relayed at once (``divert_envelope``: relaying)
            _until(lambda: _kept_at(n2) == kept, "node-2 kept what node-1 relayed")
            n2.shutdown(3.0)  # ``Inbound.stopped`` ends what the arrival kept
        finally:
            go.set()
            if mover is not None:
                mover.join(2 * WAIT)
        assert mover is not None and not mover.is_alive()
        n1.wait_idle(WAIT)
        check(n1, results[0])


def test_a_relayed_request_a_stopping_target_kept_is_not_answered_there() -> None:
    """The sibling of ac1a6f0's fix: a request node-1 RELAYED to the arriving room (kept in
    ``Arriving.kept``, not queued) is answered ``Unavailable`` by node-2's
    ``Inbound.stopped`` while node-1 keeps its original and runs it when the store refuses
    the commit: the caller hears ``Unavailable`` for a request that ran (python-api §9,
    requests answered exactly once; a caller that tries again runs it twice)."""

    def send(c1: Any) -> Any:
        return c1.request_to_spot("room", Where()).future()

    def check(_n1: zlink.Node, where: Any) -> None:
        _until(lambda: WHERE_RAN == ["node-1"], f"node-1 ran its original: {WHERE_RAN}")
        try:
            answer: Any = where.result(WAIT)
        except zlink.ZLinkError as exc:
            answer = exc
        assert answer == "node-1", (
            f"the request ran on {WHERE_RAN} but its caller was answered {answer!r}"
        )

    _relayed_then_target_stops(send, 1, check)


def test_a_relayed_send_a_stopping_target_kept_is_not_told_dropped() -> None:
    """The same path for a one-way message: ``Inbound.stopped`` counts it dropped at both
    ends (``count_dropped`` tells node-1) while node-1 runs its kept original: "handled at
    the target, or counted as dropped", not both (the fault test_store_review_faults fixed
    for the moved queue, on the relayed path)."""

    def send(c1: Any) -> Any:
        return c1.send_to_spot("room", Add()).wait(WAIT)

    def check(n1: zlink.Node, _accepted: Any) -> None:
        _until(lambda: ADDED == ["node-1"], f"node-1 ran its original: {ADDED}")
        n1.wait_idle(WAIT)  # (node-2's notice came before it left the store: its stop)
        assert _told(n1.counters()) == 0, (
            f"node-1 handled the message and was told it was dropped: "
            f"{ {k: v for k, v in n1.counters().items() if 'dropped' in k} }"
        )

    _relayed_then_target_stops(send, 1, check)


# -- transport: counts of a stranger's frames, per body as the audit's fault 7 says ------------


def test_a_strangers_batch_swept_unclaimed_is_counted_per_body(nodes):
    """1ddcd43 made ``frames_wrong_incarnation`` one per body ("its sender one per body"),
    as ``frames_from_strangers`` is for a message past the strangers' cap (``_on_frame``:
    ``len(bodies)``) and a DOWN record's frames are. ``_sweep`` still counts what it drops
    of a stranger one per ZeroMQ message (``len(kept)``): a DATA batch of three bodies from a
    sender that never says HELLO is three messages at its sender, one here."""
    counted, count = _counter()
    a = nodes("a", count=count, connect_timeout=0.2, ping_interval=0.05).attach()
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("ghost", "#1"), a)
        send(_HEADER.pack(VERSION, _Kind.DATA, 0, 1, 7), b"one", b"two", b"three")
        assert _poll(lambda: counted.get("frames_from_strangers", 0) >= 1), counted  # swept
    finally:
        ctx.destroy(linger=0)
    assert counted.get("frames_from_strangers") == 3, counted


def test_an_empty_body_kept_from_a_stranger_is_not_counted_oversized(nodes):
    """``_on_frame`` keeps a stranger's batch with bodies over ``max_frame_bytes`` emptied and
    counts ``oversized_frames`` as the EMPTY bodies of the result: a body that was empty to
    begin with is counted oversized too (and, since 1ddcd43, a bad frame again in ``_fresh``
    once its sender is listed: one body, two counters)."""
    counted, count = _counter()
    a = nodes("a", count=count, max_frame_bytes=1000).attach()
    ctx = zmq.Context()
    try:
        send = _raw_sender(ctx, identity("ghost", "#1"), a)
        send(_HEADER.pack(VERSION, _Kind.DATA, 0, 1, 7), b"", b"x" * 1500)
        assert _poll(lambda: counted.get("oversized_frames", 0) >= 1), counted
    finally:
        ctx.destroy(linger=0)
    assert counted.get("oversized_frames") == 1, counted
