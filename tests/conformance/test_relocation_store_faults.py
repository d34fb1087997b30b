"""A Location Store that fails while a move commits (python-api §10 "Failure", §11).

The commit is one fenced write per moved object (``transfer``), past the move's point of no
return. A store that fails the write (a dropped connection, a busy file) may have made it or
not: the source asks the store which, and asks again (every ``STORE_RETRY`` seconds) while
the store cannot say. Before, either way the move ended with the room sealed on both nodes for
good: every call to it was ``Unavailable`` ("sealed"), and the calls queued when it moved were
never handled.
"""

from __future__ import annotations

import threading
from typing import Any

import zlink
from tests.conformance.test_relocation_backpressure import HANDLED, Add, _reset, build_app
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster


def _failing(cluster: LocalCluster, *, write: bool, lookups: int) -> threading.Event:
    """node-1's next ``transfer`` fails (having written first if ``write``), and its next
    ``lookups`` lookups on its store thread fail too; the event is set once it failed."""
    failed = threading.Event()
    transfer, lookup = cluster.store.transfer, cluster.store.lookup
    left = {"lookups": lookups}

    def failing_transfer(*args: Any) -> Any:
        if failed.is_set():
            return transfer(*args)
        if write:
            transfer(*args)
        failed.set()
        raise zlink.Unavailable("the location store failed: connection reset")

    def failing_lookup(spot_id: str) -> Any:
        on_node_1 = threading.current_thread().name == "zlink-store-node-1"
        if on_node_1 and failed.is_set() and left["lookups"]:
            left["lookups"] -= 1
            raise zlink.Unavailable("the location store failed: connection reset")
        return lookup(spot_id)

    cluster.store.transfer = failing_transfer  # type: ignore[method-assign]
    cluster.store.lookup = failing_lookup  # type: ignore[method-assign]
    return failed


def _moves_and_serves(cluster: LocalCluster, failed: threading.Event) -> None:
    n1 = cluster.nodes[0]
    c1 = n1.client()
    for seq in range(3):  # queued or parked while the move runs: they move with the room
        c1.send_to_spot("room", Add(sender="n1", seq=seq)).wait(WAIT)
    n1.relocate_spot("room", "node-2", timeout=WAIT)
    assert failed.is_set()
    for seq in range(3, 6):
        c1.send_to_spot("room", Add(sender="n1", seq=seq)).wait(WAIT)
    until(lambda: len(HANDLED) == 6, "every call handled")
    assert [seq for _n, _s, seq in HANDLED] == list(range(6))
    assert cluster.store.lookup("room").owner_node == "node-2"
    assert {n for n, _s, seq in HANDLED if seq >= 3} == {"node-2"}
    assert "room" not in n1._runtime.spots


def test_a_commit_the_store_made_before_it_failed_stands():
    """The write happened, then the store's answer was lost. Before: the move failed with
    ``StateIncompatible`` ("capture failed: ...") and the room stayed sealed on both nodes,
    although the store said node-2 owned it. Now the source reads the store, finds the room
    moved, and the move completes."""
    _reset()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        cluster.nodes[0].client().spots.get_or_create("room", "t.rb.room").wait(WAIT)
        failed = _failing(cluster, write=True, lookups=0)
        _moves_and_serves(cluster, failed)


def test_a_commit_the_store_cannot_speak_for_is_asked_again():
    """The write failed and the store cannot say either (its lookup fails too). Before: the
    move failed, the room sealed on both nodes for good. Now the source asks again, the
    store answers (the room is still the source's), the commit is made, and the move
    completes."""
    _reset()
    with LocalCluster(build_app(), nodes=2, workers=2) as cluster:
        cluster.nodes[0].client().spots.get_or_create("room", "t.rb.room").wait(WAIT)
        failed = _failing(cluster, write=False, lookups=1)
        _moves_and_serves(cluster, failed)
