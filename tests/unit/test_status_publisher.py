"""The publisher that builds a node's status for its subscribers (execution-model §13), off
the infrastructure thread: found by review, ``Node.wait_idle`` could never return once
builds took longer than ``status_interval`` (a tick always came during the build or its
pace), waited out the pace otherwise (up to 2 s), and a subscription made after the node
stopped left two threads running for good."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import zlink
from tests.conftest import WAIT
from zlink import status
from zlink.status import NodeStatus, StatusPublisher, StatusSubscription


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("zlink-status")}


def test_wait_idle_waits_for_the_builds_asked_before_it_not_later_ticks_nor_the_pace(
    make_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(zlink.App("publisher"))
    snapshot = node.status()
    publisher: list[StatusPublisher] = []

    def build() -> NodeStatus:
        publisher[0].tick()  # a tick lands during every build (builds slower than ticks)
        return snapshot

    monkeypatch.setattr(status, "_PACE", 1e6)  # a pace no wait could sit out
    pub = StatusPublisher("n", build, lambda: None)
    publisher.append(pub)
    got: list[NodeStatus] = []
    pub.add(StatusSubscription(got.append, 4))
    try:
        for _ in range(3):
            pub.tick()
            assert pub.wait_idle(WAIT)  # answered, though more builds are asked for now
        assert pub.built >= 3
    finally:
        pub.close()


def test_a_subscription_after_the_node_stopped_is_refused_and_leaves_no_thread(
    make_node: Any,
) -> None:
    before = _threads()
    node = make_node(zlink.App("publisher"))
    node.subscribe_status(lambda _s: None)
    node.shutdown(WAIT)
    with pytest.raises(zlink.InvalidOperation):
        node.subscribe_status(lambda _s: None)
    for thread in threading.enumerate():
        if thread.name.startswith("zlink-status") and thread.name not in before:
            thread.join(WAIT)
    assert _threads() <= before


def test_a_node_stopped_before_it_started_closes_its_publisher() -> None:
    before = _threads()
    node = zlink.Node(zlink.App("publisher"))
    node.subscribe_status(lambda _s: None)
    node.shutdown()
    for thread in threading.enumerate():
        if thread.name.startswith("zlink-status") and thread.name not in before:
            thread.join(WAIT)
    assert _threads() <= before
