"""Races between self-fencing and the store (python-api §10 "Failure"; found by review of issue
"Node leases"): a claim the store grants to an incarnation that fenced itself while the claim
was on its way is never activated (else: active on two nodes once the lease lapsed), and a
registration confirmed too late to serve on never lets a fenced node serve."""

from __future__ import annotations

import contextlib
import logging
import threading

import pytest

import zlink
from tests.conformance.test_membership import Ping, _app, _wait_counter
from tests.conftest import WAIT, infra_sync
from zlink.errors import Unavailable
from zlink.testing import LocalCluster, ManualClock


def test_a_claim_answered_after_the_fence_is_not_activated(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with LocalCluster(_app(), nodes=2, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        n1, n2 = cluster.nodes
        store = cluster.store
        real_reserve = store.reserve
        entered, release = threading.Event(), threading.Event()

        claimed = threading.Event()
        real_register = store.register_node

        def slow_reserve(spot_id: str, kind: str, type_name: str, node: str, *rest: object):
            if node == "node-1" and spot_id == "r":
                entered.set()
                assert release.wait(WAIT)  # the store is slow for this call
                try:
                    return real_reserve(spot_id, kind, type_name, node, *rest)  # type: ignore[arg-type]
                finally:
                    claimed.set()
            return real_reserve(spot_id, kind, type_name, node, *rest)  # type: ignore[arg-type]

        def late_register(node_id: str, *rest: object):  # type: ignore[no-untyped-def]
            if node_id == "node-1" and entered.is_set():  # registering again: behind the claim
                assert claimed.wait(WAIT)
            return real_register(node_id, *rest)  # type: ignore[arg-type]

        real_renew = store.renew_node

        def slow_renew(node_id: str, *rest: object):  # type: ignore[no-untyped-def]
            if node_id == "node-1" and not release.is_set():
                raise Unavailable("the store is slow for node-1")
            return real_renew(node_id, *rest)  # type: ignore[arg-type]

        store.reserve = slow_reserve  # type: ignore[method-assign]
        store.renew_node = slow_renew  # type: ignore[method-assign]
        store.register_node = late_register  # type: ignore[method-assign]
        made = n1.client().spots.get_or_create("r", "t.mb.room").future()  # not waited on yet
        assert entered.wait(WAIT)
        old = n1.incarnation
        (lease_end,) = [r.lease_until for r in store.nodes() if r.node_id == "node-1"]
        # the claim is stuck, and no renewal is confirmed; 0.8 of the lease
        # later node-1 fences itself (its lease still holds in the store until 3.0)
        for _ in range(10):
            clock.advance(0.25)
            infra_sync(n1, 3)
            if n1.counters().get("self_fenced"):
                break
        assert n1.counters().get("self_fenced") == 1, (clock.now(), n1.counters())
        assert clock.now() < lease_end  # incarnation `old` still holds its lease in the store
        release.set()  # the claim goes through, for (node-1, old): its lease still holds
        _wait_counter(n1, "registrations_again", 1)
        assert n1.incarnation > old
        with contextlib.suppress(Exception):  # whatever the creator was told
            made.result(WAIT)
        infra_sync(n1, 3)
        store.renew_node = real_renew  # type: ignore[method-assign]
        while clock.now() <= lease_end:  # the lease of (node-1, old) ends in the store
            clock.advance(0.25)
            cluster.wait_idle(WAIT)
        # node-2 calls "r": the store says its owner (node-1, old) holds no lease: re-homed
        with caplog.at_level(logging.INFO, logger="zlink"):
            assert n2.client().request_to_spot("r", Ping()).wait(WAIT) == "pong"
        on_n2 = "r" in n2._runtime.spots
        if on_n2:  # the log names the owner whose lease lapsed, not the node that took over
            assert "node node-2 re-homed spot 'r'" in caplog.text
            assert "its owner 'node-1' lost its lease" in caplog.text
        on_n1 = "r" in n1._runtime.spots
        if on_n1:  # and node-1 serves its own copy: calls made there run there
            assert n1.client().request_to_spot("r", Ping()).wait(WAIT) == "pong"
            assert store.lookup("r").owner_node == "node-2"  # type: ignore[union-attr]
        assert not (on_n1 and on_n2), (
            f"'r' is active on both nodes (node-1 now at incarnation {n1.incarnation}, its claim"
            f" made at {old}); the store says {store.lookup('r')}"
        )


def test_a_registration_confirmed_too_late_never_lets_a_fenced_node_serve(
    clock: ManualClock,
) -> None:
    """The registration again takes longer than 0.8 of a lease: the node fences again at once,
    but the first rejoin's ``serve`` (run later by the transport thread with ZeroMQ; emulated
    here by deferring it on the heap) lifts ``rt.fenced`` while the membership is fenced."""
    with LocalCluster(_app(), nodes=1, clock=clock, workers=1, lease_seconds=3.0) as cluster:
        (n1,) = cluster.nodes
        store, transport = cluster.store, cluster.transport
        real_register, real_reincarnate = store.register_node, transport.reincarnate
        calls, second, go_on = [0], threading.Event(), threading.Event()

        def slow_register(*args: object, **kw: object):
            calls[0] += 1
            if calls[0] == 1:  # the first registration again takes 0.9 of a lease
                clock.advance(2.7)
            elif calls[0] == 2:  # the second one waits (the store is slow)
                second.set()
                go_on.wait(WAIT)
            return real_register(*args, **kw)  # type: ignore[arg-type]

        def late_reincarnate(node_id, incarnation, members, then):  # type: ignore[no-untyped-def]
            def later() -> None:  # the transport thread's then comes after the due deadlines
                n1._infra.call_later(0.0, then)

            real_reincarnate(node_id, incarnation, members, later)

        store.register_node = slow_register  # type: ignore[method-assign]
        transport.reincarnate = late_reincarnate  # type: ignore[method-assign]
        assert store.unregister_node("node-1", n1.incarnation)
        clock.advance(1.0)  # the next renewal is refused: fence, register again (slowly)
        _wait_counter(n1, "registrations_too_late", 1)  # so it registers once more
        assert second.wait(WAIT)
        try:
            for _ in range(5):
                infra_sync(n1, 3)
            membership = n1._membership
            assert membership is not None and membership.fenced
            try:
                outcome = n1.client().spots.get_or_create("x", "t.mb.room").future().result(0.5)
            except Exception as exc:  # noqa: BLE001
                outcome = exc
            assert isinstance(outcome, zlink.Unavailable) and "fenced" in str(outcome), outcome
            assert n1._runtime.fenced, (
                "the membership is fenced (registering again) but the runtime serves:"
                f" get_or_create -> {outcome!r}; {n1.counters()}"
            )
        finally:
            go_on.set()
