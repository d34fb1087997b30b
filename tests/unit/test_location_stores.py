"""The Location Stores: one behaviour, in memory, in a SQLite file and in Redis (python-api §10,
execution-model §14); the file's own promises; Redis restarts, data loss and outages; several
threads and processes racing to claim; ``open_store`` URLs.

The Redis tests start a ``redis-server`` of their own (``tests/redis_server.py``) and are skipped
where none is installed."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import selectors
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.conftest import until
from tests.redis_server import RedisServer, free_port
from zlink.errors import InvalidArgument, Unavailable
from zlink.mesh.location import InMemoryLocationStore, LocationStore
from zlink.mesh.redis_store import RedisLocationStore
from zlink.mesh.sqlite_store import SCHEMA_VERSION, SqliteLocationStore
from zlink.mesh.stores import open_store
from zlink.testing import ManualClock

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAIT = 60.0  # real seconds a racing thread or process may take before the test fails
SPOTS = 200  # spot ids every racer claims
LEASE = 3.0


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(
    request: pytest.FixtureRequest, clock: ManualClock, tmp_path: pathlib.Path
) -> Iterator[LocationStore]:
    if request.param == "memory":
        yield InMemoryLocationStore(clock)
        return
    opened: SqliteLocationStore | RedisLocationStore
    if request.param == "sqlite":
        opened = SqliteLocationStore(tmp_path / "store.db", clock)
    else:  # leases on the manual clock; counters start from the server's TIME
        opened = RedisLocationStore(request.getfixturevalue("redis_server").url, clock)
    yield opened
    opened.close()


HELD = 1e6  # the lease of nodes the helpers register: it outlasts every clock move here


def _incarnation(store: LocationStore, node: str) -> int:
    """``node``'s live incarnation, registering it (for ``HELD`` seconds) if it has none."""
    for record in store.nodes():
        if record.node_id == node:
            return record.incarnation
    return store.register_node(node, f"inproc://{node}", HELD).incarnation


def _reserve(store: LocationStore, spot: str, node: str) -> Any:
    return store.reserve(spot, "spot", "game.room", node, _incarnation(store, node))


def _release(store: LocationStore, spot: str, node: str, authority: int) -> bool:
    return store.release(spot, node, _incarnation(store, node), authority)


def _transfer(store: LocationStore, spot: str, node: str, authority: int, target: str) -> Any:
    theirs = _incarnation(store, target)
    return store.transfer(spot, node, _incarnation(store, node), authority, target, theirs)


# -- one behaviour, every store -----------------------------------------------------------------


def test_reserve_claims_once_and_then_names_the_owner(store: Any) -> None:
    first = _reserve(store, "room-1", "n1")
    assert first.created
    loc = first.location
    assert (loc.spot_id, loc.kind, loc.type_name) == ("room-1", "spot", "game.room")
    assert (loc.owner_node, loc.authority_generation, loc.lease_until) == ("n1", 1, 1000 + HELD)
    assert loc.owner_incarnation == store.nodes()[0].incarnation and loc.owner_live
    again = _reserve(store, "room-1", "n2")
    assert not again.created
    assert again.location == loc  # n2 is told n1 owns it, nothing about n2 was written


def test_lookup_follows_reserve_and_release(store: Any) -> None:
    assert store.lookup("room-1") is None
    loc = _reserve(store, "room-1", "n1").location
    assert store.lookup("room-1") == loc
    assert _release(store, "room-1", "n1", 1)
    assert store.lookup("room-1") is None
    assert not _release(store, "room-1", "n1", 1)  # nothing left to release


def test_release_is_fenced_by_owner_and_authority(store: Any) -> None:
    loc = _reserve(store, "room-1", "n1").location
    with pytest.raises(Unavailable, match=r"stale owner: 'n2' .*at authority 1 "):
        _release(store, "room-1", "n2", 1)
    with pytest.raises(Unavailable, match=r"stale owner: 'n1' .*at authority 7 "):
        _release(store, "room-1", "n1", 7)
    assert store.lookup("room-1") == loc  # refused, not applied
    assert _release(store, "room-1", "n1", 1)


def test_transfer_bumps_authority_and_fences_the_old_owner(store: Any) -> None:
    loc = _reserve(store, "room-1", "n1").location
    moved = _transfer(store, "room-1", "n1", 1, "n2")
    assert (moved.owner_node, moved.authority_generation) == ("n2", 2)
    assert moved.owner_incarnation == _incarnation(store, "n2") and moved.owner_live
    assert moved.object_generation == loc.object_generation  # same incarnation, new owner
    assert store.lookup("room-1") == moved
    with pytest.raises(Unavailable, match="stale owner"):
        _transfer(store, "room-1", "n1", 1, "n3")  # the old owner, at the old authority
    with pytest.raises(Unavailable, match="stale owner"):
        _transfer(store, "room-1", "n2", 1, "n3")  # the new owner, at the old authority
    with pytest.raises(Unavailable, match="stale owner"):
        _release(store, "room-1", "n1", 1)
    assert store.lookup("room-1") == moved
    again = _transfer(store, "room-1", "n2", 2, "n1")
    assert (again.owner_node, again.authority_generation) == ("n1", 3)
    with pytest.raises(Unavailable, match="no location to transfer"):
        _transfer(store, "room-9", "n1", 1, "n2")


def test_transfer_clears_the_first_record_in_the_same_write(store: Any) -> None:
    """A move hands a Spot on once its first message ran (or with that message in its queue:
    ``keep_first``, below): the record goes with the move, so a clear of the source's that
    failed is never left behind for a later owner to replay (execution-model §14; a review)."""
    store.reserve("inst-1", "spot", "game.inst", "n1", _incarnation(store, "n1"),
                  first=("t.note", '{"tag":"first"}'))  # fmt: skip
    assert store.lookup("inst-1").first == ("t.note", '{"tag":"first"}')
    moved = _transfer(store, "inst-1", "n1", 1, "n2")
    assert moved.first is None and store.lookup("inst-1").first is None
    assert not store.clear_first("inst-1", "n2", _incarnation(store, "n2"), 2)  # none left


def test_transfer_keeps_the_first_record_moving_with_its_message(store: Any) -> None:
    """``keep_first``: the first message moves in the Spot's queue, so its record moves with
    it, for the target to clear once the handler ended (a review found a target that died
    first leave nothing to replay: the message was lost; execution-model §14)."""
    first = ("t.note", '{"tag":"first"}')
    store.reserve("inst-1", "spot", "game.inst", "n1", _incarnation(store, "n1"), first=first)
    moved = store.transfer("inst-1", "n1", _incarnation(store, "n1"), 1, "n2",
                           _incarnation(store, "n2"), True)  # fmt: skip
    assert moved.first == first and store.lookup("inst-1").first == first
    assert (moved.owner_node, moved.authority_generation) == ("n2", 2)
    assert store.clear_first("inst-1", "n2", _incarnation(store, "n2"), 2)  # the target's
    assert store.lookup("inst-1").first is None


def test_transfer_names_the_targets_incarnation_and_refuses_another(store: Any) -> None:
    """A store audit: a move restored on the target's incarnation, committed after that
    node fenced itself and registered again, was given to the new incarnation (which had
    dropped it): the Spot was lost. The transfer names the incarnation that restored it."""
    loc = _reserve(store, "room-1", "n1").location
    old2 = _incarnation(store, "n2")
    assert store.unregister_node("n2", old2)
    new2 = store.register_node("n2", "inproc://n2", HELD).incarnation
    assert new2 != old2
    n1 = _incarnation(store, "n1")
    with pytest.raises(Unavailable, match=f"'n2' holds no lease at incarnation {old2}"):
        store.transfer("room-1", "n1", n1, 1, "n2", old2)
    assert store.lookup("room-1") == loc  # refused, not applied
    moved = store.transfer("room-1", "n1", n1, 1, "n2", new2)
    assert (moved.owner_node, moved.owner_incarnation) == ("n2", new2)


def test_object_generations_are_unique_and_never_reused(store: Any) -> None:
    seen = [_reserve(store, f"room-{i}", "n1").location.object_generation for i in range(5)]
    assert len(set(seen)) == 5
    top = max(seen)
    assert _release(store, "room-4", "n1", 1)  # the highest one goes away
    assert _release(store, "room-2", "n1", 1)
    back = _reserve(store, "room-4", "n2").location.object_generation
    fresh = _reserve(store, "room-9", "n2").location.object_generation
    assert back > top and fresh > back  # neither a released nor a live one came back


def test_incarnations_increase_on_every_registration(store: Any, clock: ManualClock) -> None:
    first = store.register_node("n1", "inproc://n1", LEASE)
    assert (first.node_id, first.endpoint, first.lease_until) == ("n1", "inproc://n1", 1003.0)
    other = store.register_node("n2", "inproc://n2", LEASE)
    clock.advance(1.0)
    again = store.register_node("n1", "inproc://n1-b", LEASE)
    assert first.incarnation < other.incarnation < again.incarnation  # store-wide, never reused
    assert (again.endpoint, again.lease_until) == ("inproc://n1-b", 1004.0)
    assert [r.incarnation for r in store.nodes()] == [again.incarnation, other.incarnation]


def test_renew_extends_the_current_incarnation_only(store: Any, clock: ManualClock) -> None:
    old = store.register_node("n1", "inproc://n1", LEASE)
    new = store.register_node("n1", "inproc://n1", LEASE)
    with pytest.raises(Unavailable, match=f"'n1' at incarnation {old.incarnation} holds no"):
        store.renew_node("n1", old.incarnation, LEASE)
    clock.advance(2.0)
    renewed = store.renew_node("n1", new.incarnation, LEASE)
    assert (renewed.incarnation, renewed.lease_until) == (new.incarnation, 1005.0)
    with pytest.raises(Unavailable, match="holds no lease"):
        store.renew_node("n9", 1, LEASE)  # never registered


def test_renew_is_refused_once_the_lease_lapsed(store: Any, clock: ManualClock) -> None:
    rec = store.register_node("n1", "inproc://n1", LEASE)
    clock.advance(LEASE)  # exactly at the end: still held
    rec = store.renew_node("n1", rec.incarnation, LEASE)
    assert rec.lease_until == 1006.0
    clock.advance(LEASE + 0.5)
    with pytest.raises(Unavailable, match="holds no lease"):
        store.renew_node("n1", rec.incarnation, LEASE)
    assert store.nodes() == []  # the refused renewal wrote nothing
    back = store.register_node("n1", "inproc://n1", LEASE)  # the way back: a new incarnation
    assert back.incarnation > rec.incarnation
    assert store.renew_node("n1", back.incarnation, LEASE).lease_until == 1009.5


def test_nodes_lists_unlapsed_leases_by_id(store: Any, clock: ManualClock) -> None:
    store.register_node("c", "inproc://c", 10.0)
    store.register_node("a", "inproc://a", 2.0)
    store.register_node("b", "inproc://b", 5.0)
    assert [r.node_id for r in store.nodes()] == ["a", "b", "c"]
    clock.advance(3.0)
    assert [r.node_id for r in store.nodes()] == ["b", "c"]
    clock.advance(7.0)
    assert [r.node_id for r in store.nodes()] == ["c"]  # lease_until == now still holds
    clock.advance(0.5)
    assert store.nodes() == []


def test_unregister_only_by_the_current_incarnation(store: Any) -> None:
    old = store.register_node("n1", "inproc://n1", LEASE)
    new = store.register_node("n1", "inproc://n1", LEASE)
    assert not store.unregister_node("n1", old.incarnation)
    assert store.nodes() == [new]
    assert store.unregister_node("n1", new.incarnation)
    assert store.nodes() == []
    assert not store.unregister_node("n1", new.incarnation)
    assert not store.unregister_node("n9", 1)
    # no live row remembers the departed incarnations; the next one is still higher
    assert store.register_node("n1", "inproc://n1", LEASE).incarnation > new.incarnation


# -- leases, re-homing and fencing (python-api §10 "Failure") -----------------------------------


def test_a_spot_whose_owner_lease_lapsed_is_rehomed_with_new_generations(
    store: Any, clock: ManualClock
) -> None:
    """Issue "Node leases": once a node's lease has lapsed, a reserve of one of its Spots takes
    it over with a higher authority generation and a new ObjectGeneration; the stale owner's
    writes are refused."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    n2 = store.register_node("n2", "inproc://n2", 10 * LEASE)
    old = store.reserve("room-1", "spot", "game.room", "n1", n1.incarnation).location
    assert not store.reserve("room-1", "spot", "game.room", "n2", n2.incarnation).created
    clock.advance(LEASE + 0.5)  # n1 stopped renewing
    seen = store.lookup("room-1")
    assert (seen.owner_node, seen.owner_live, seen.lease_until) == ("n1", False, 1003.0)
    taken = store.reserve("room-1", "spot", "game.room", "n2", n2.incarnation)
    assert taken.created and taken.previous == seen
    new = taken.location
    assert (new.owner_node, new.owner_incarnation) == ("n2", n2.incarnation)
    assert new.authority_generation == old.authority_generation + 1
    assert new.object_generation > old.object_generation
    for write in (
        lambda: store.release("room-1", "n1", n1.incarnation, old.authority_generation),
        lambda: store.transfer(
            "room-1",
            "n1",
            n1.incarnation,
            old.authority_generation,
            "n2",
            _incarnation(store, "n2"),
        ),
    ):
        with pytest.raises(Unavailable, match="stale owner: 'n1'"):
            write()
    assert store.lookup("room-1") == new


def test_an_owner_whose_lease_lapsed_writes_nothing_even_before_a_takeover(
    store: Any, clock: ManualClock
) -> None:
    """Self-fencing has a store side: a node whose lease lapsed may not claim, move or release
    (it must register again), even while nobody has taken its Spots yet."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    store.register_node("n2", "inproc://n2", 10 * LEASE)
    store.reserve("room-1", "spot", "game.room", "n1", n1.incarnation)
    clock.advance(LEASE + 0.5)
    for write in (
        lambda: store.reserve("room-2", "spot", "game.room", "n1", n1.incarnation),
        lambda: store.release("room-1", "n1", n1.incarnation, 1),
        lambda: store.transfer("room-1", "n1", n1.incarnation, 1, "n2", _incarnation(store, "n2")),
    ):
        with pytest.raises(Unavailable, match=r"'n1' at incarnation .* holds no lease"):
            write()
    assert store.lookup("room-2") is None
    assert store.lookup("room-1").owner_node == "n1"  # refused, not applied


def test_a_transfer_needs_a_target_that_holds_a_lease(store: Any, clock: ManualClock) -> None:
    n1 = store.register_node("n1", "inproc://n1", 10 * LEASE)
    n2 = store.register_node("n2", "inproc://n2", LEASE)
    store.reserve("room-1", "spot", "game.room", "n1", n1.incarnation)
    clock.advance(LEASE + 0.5)
    with pytest.raises(Unavailable, match="'n2' holds no lease"):
        store.transfer("room-1", "n1", n1.incarnation, 1, "n2", n2.incarnation)
    with pytest.raises(Unavailable, match="'n9' holds no lease"):
        store.transfer("room-1", "n1", n1.incarnation, 1, "n9", 1)
    assert store.lookup("room-1").owner_node == "n1"


def test_a_node_registered_again_takes_its_own_spots_over_once_the_old_lease_ends(
    store: Any, clock: ManualClock
) -> None:
    """A restarted (or self-fenced) node is a new incarnation: the Spots its old one held stay
    the old one's until that lease ends (it may still be serving them: stopped, or cut off
    from its peers), its writes refused at once; then the new one re-homes them with new
    generations (found by review: registering again voided the old lease at once)."""
    old = store.register_node("n1", "inproc://n1", LEASE)
    other = store.register_node("n2", "inproc://n2", 10 * LEASE)
    first = store.reserve("room-1", "spot", "game.room", "n1", old.incarnation).location
    clock.advance(1.0)
    new = store.register_node("n1", "inproc://n1", LEASE)
    seen = store.lookup("room-1")
    assert seen.owner_live and seen.owner_incarnation == old.incarnation
    assert seen.lease_until == old.lease_until
    for claimer, incarnation in (("n1", new.incarnation), ("n2", other.incarnation)):
        assert not store.reserve("room-1", "spot", "game.room", claimer, incarnation).created
    with pytest.raises(Unavailable, match="holds no lease"):  # the old one writes nothing
        store.release("room-1", "n1", old.incarnation, first.authority_generation)
    clock.advance(LEASE)  # the old incarnation's lease has ended
    assert not store.lookup("room-1").owner_live
    again = store.reserve("room-1", "spot", "game.room", "n1", new.incarnation)
    assert again.created and again.location.owner_incarnation == new.incarnation
    assert again.location.object_generation > first.object_generation
    with pytest.raises(Unavailable, match="stale owner"):
        store.release("room-1", "n1", old.incarnation, first.authority_generation)


def test_a_store_that_lost_its_data_grants_no_claim_for_one_lease(
    store: Any, clock: ManualClock
) -> None:
    """Issue "Node leases": after a restart that lost data, nodes register again and no
    incarnation is reused; claims wait one lease (owners from before may still serve)."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    first = store.reserve("room-1", "spot", "game.room", "n1", n1.incarnation).location
    # a node that had an incarnation this store never handed out (above the last one it did):
    # data was lost
    lost = n1.incarnation + 500
    back = store.register_node("n2", "inproc://n2", LEASE, known_incarnation=lost)
    assert back.incarnation > lost
    for claim in (
        lambda: store.reserve("room-2", "spot", "game.room", "n2", back.incarnation),
        lambda: store.transfer("room-1", "n1", n1.incarnation, 1, "n2", _incarnation(store, "n2")),
    ):
        with pytest.raises(Unavailable, match=r"lost its data .* another 3\.0 s"):
            claim()
    assert store.lookup("room-1") == first  # lookups still answer
    clock.advance(LEASE / 2)
    store.renew_node("n2", back.incarnation, LEASE)
    clock.advance(LEASE / 2)  # one lease since the loss was found
    assert store.reserve("room-2", "spot", "game.room", "n2", back.incarnation).created
    # a node that knows an incarnation the store did hand out is no sign of a loss
    again = store.register_node("n3", "inproc://n3", LEASE, known_incarnation=n1.incarnation)
    assert again.incarnation > back.incarnation
    assert store.reserve("room-3", "spot", "game.room", "n2", back.incarnation).created


def test_the_durable_first_record_is_written_with_the_claim_and_kept_for_the_next_owner(
    store: Any, clock: ManualClock
) -> None:
    """execution-model §14 (Instance cold activation, step 1): the claim records the first
    message in the same write; the owner clears it once its handler ended (fenced); a takeover
    of a Spot whose record is still there keeps that record (replayed once) and records
    nothing new."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    n2 = store.register_node("n2", "inproc://n2", 10 * LEASE)
    record = ("mp.where", '{"n": 1}')
    made = store.reserve("c-1", "spot", "mp.counter", "n1", n1.incarnation, record)
    assert made.created and made.location.first == record
    assert store.lookup("c-1").first == record
    with pytest.raises(Unavailable, match="stale owner: 'n2'"):
        store.clear_first("c-1", "n2", n2.incarnation, 1)
    assert store.clear_first("c-1", "n1", n1.incarnation, 1)
    assert store.lookup("c-1").first is None
    assert not store.clear_first("c-1", "n1", n1.incarnation, 1)  # nothing left
    assert not store.clear_first("c-9", "n1", n1.incarnation, 1)
    # n1 records another one, then dies before its handler ended
    store.reserve("c-2", "spot", "mp.counter", "n1", n1.incarnation, record)
    clock.advance(LEASE + 0.5)
    taken = store.reserve("c-2", "spot", "mp.counter", "n2", n2.incarnation, ("mp.other", "{}"))
    assert taken.created and taken.previous.first == record
    assert taken.location.first == record  # kept: n2 replays it, its own message is not kept
    with pytest.raises(Unavailable, match="stale owner: 'n1'"):
        store.clear_first("c-2", "n1", n1.incarnation, 1)
    assert store.clear_first("c-2", "n2", n2.incarnation, 2)
    assert store.lookup("c-2").first is None


def test_every_earlier_incarnation_keeps_its_spots_until_the_last_of_their_leases_ends(
    store: Any, clock: ManualClock
) -> None:
    """Found by review: a store remembered one retired incarnation per node id. A node id
    registered twice more within an incarnation's lease (a crash loop, or the same id
    started twice) left that incarnation's Spots looking lapsed: another node's reserve
    took them over, and retention deleted them, while its lease held (its process may
    still serve them until its next renewal is refused). Likewise when the incarnation that
    replaced it stopped cleanly. Each earlier incarnation's Spots now hold until the latest
    lease of any of them ends."""
    x1 = store.register_node("x", "inproc://x", LEASE)
    b = store.register_node("b", "inproc://b", 1e6)
    store.reserve("s", "spot", "t", "x", x1.incarnation)
    store.register_node("x", "inproc://x", LEASE)  # restarted...
    store.register_node("x", "inproc://x", LEASE)  # ...and again
    clock.advance(1.0)
    assert store.lookup("s").owner_live
    assert not store.reserve("s", "spot", "t", "b", b.incarnation).created
    assert store.prune(3600.0) == (0, 0)
    y1 = store.register_node("y", "inproc://y", LEASE)
    store.reserve("r", "spot", "t", "y", y1.incarnation)
    y2 = store.register_node("y", "inproc://y", LEASE)
    assert store.unregister_node("y", y2.incarnation)  # the restarted one stops cleanly
    assert {n.node_id for n in store.nodes()} == {"b", "x"}
    assert store.lookup("r").owner_live  # y1's lease still holds
    assert not store.reserve("r", "spot", "t", "b", b.incarnation).created
    assert store.prune(3600.0) == (0, 0)
    clock.advance(LEASE + 0.5)  # every lease of x1, x2 and y1 has ended now
    for spot in ("s", "r"):
        assert not store.lookup(spot).owner_live
        assert store.reserve(spot, "spot", "t", "b", b.incarnation).created


def test_new_generation_gives_the_owners_next_activation_a_generation_of_its_own(
    store: Any, clock: ManualClock
) -> None:
    """execution-model §14: an ObjectGeneration names one incarnation. An Instance Spot made
    again where it was (its close had calls to carry) keeps its row and authority and takes
    a new generation, fenced like any write; none repeats."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    n2 = store.register_node("n2", "inproc://n2", 10 * LEASE)
    made = store.reserve("i-1", "spot", "mp.counter", "n1", n1.incarnation).location
    other = store.reserve("x-1", "spot", "game.room", "n2", n2.incarnation).location
    again = store.new_generation("i-1", "n1", n1.incarnation, made.authority_generation)
    assert again.object_generation > max(made.object_generation, other.object_generation)
    assert (again.owner_node, again.authority_generation) == ("n1", made.authority_generation)
    assert store.lookup("i-1").object_generation == again.object_generation
    with pytest.raises(Unavailable, match="stale owner: 'n2'"):
        store.new_generation("i-1", "n2", n2.incarnation, made.authority_generation)
    with pytest.raises(Unavailable):
        store.new_generation("nope", "n1", n1.incarnation, 1)
    clock.advance(LEASE + 0.5)  # n1's lease lapsed: it writes nothing
    with pytest.raises(Unavailable):
        store.new_generation("i-1", "n1", n1.incarnation, made.authority_generation)
    later = store.reserve("y-1", "spot", "game.room", "n2", n2.incarnation).location
    assert later.object_generation > again.object_generation


def test_prune_deletes_what_dead_nodes_left_once_their_lease_lapsed_long_enough(
    store: Any, clock: ManualClock
) -> None:
    """Retention (python-api §10 "Failure", as Orleans cleans up defunct silos): rows of
    Spots and Actors whose owner's lease lapsed more than ``lapsed_for`` seconds ago go, but
    one holding a durable first record (an accepted message, execution-model §14); and the
    node rows whose lease lapsed that long ago. Live owners' rows, and a lapse too recent,
    stay. No generation or incarnation repeats after it."""
    n1 = store.register_node("n1", "inproc://n1", LEASE)
    n2 = store.register_node("n2", "inproc://n2", LEASE)
    n3 = store.register_node("n3", "inproc://n3", 1e6)
    for spot in ("a-1", "a-2"):
        store.reserve(spot, "spot", "game.room", "n1", n1.incarnation)
    store.reserve("u-1", "actor", "game.player", "n1", n1.incarnation)
    store.reserve("i-1", "spot", "mp.counter", "n1", n1.incarnation, ("mp.where", "{}"))
    store.reserve("b-1", "spot", "game.room", "n2", n2.incarnation)
    live = store.reserve("c-1", "spot", "game.room", "n3", n3.incarnation).location
    clock.advance(LEASE + 10)  # n1 and n2 stop renewing; n3 lives on
    assert store.prune(100.0) == (0, 0)  # lapsed 10 s ago: too recent
    clock.advance(50)
    store.renew_node("n3", n3.incarnation, 1e6)
    n2b = store.register_node("n2", "inproc://n2", 1e6)  # n2 restarted; its old rows remain
    clock.advance(60)  # lapsed 120 s ago now
    assert store.prune(100.0) == (4, 1)  # a-1, a-2, u-1, b-1; the node row of n1
    for gone in ("a-1", "a-2", "u-1", "b-1"):
        assert store.lookup(gone) is None
    assert store.lookup("i-1").first == ("mp.where", "{}")  # kept for its next owner
    assert store.lookup("c-1") == replace_lease(live, store.lookup("c-1"))
    assert store.prune(100.0) == (0, 0)  # nothing more
    assert not store.lookup("i-1").owner_live  # (its owner's row went: lapsed for good)
    assert {r.node_id for r in store.nodes()} == {"n2", "n3"}
    again = store.reserve("a-1", "spot", "game.room", "n3", n3.incarnation).location
    assert again.object_generation > live.object_generation  # no generation repeats
    assert store.register_node("n1", "inproc://n1", LEASE).incarnation > n2b.incarnation


def replace_lease(expected: Any, found: Any) -> Any:
    """``expected`` with the lease ``found`` reads now (a live owner's lease moves on)."""
    from dataclasses import replace

    return replace(expected, lease_until=found.lease_until)


# -- the SQLite file ----------------------------------------------------------------------------


def test_the_file_survives_closing_and_reopening(tmp_path: pathlib.Path) -> None:
    clock = ManualClock()
    path = tmp_path / "store.db"
    with SqliteLocationStore(path, clock) as store:
        assert _reserve(store, "room-1", "n1").created
        kept = _transfer(store, "room-1", "n1", 1, "n2")
        gone = _reserve(store, "room-2", "n1").location
        assert _release(store, "room-2", "n1", 1)
        node = store.register_node("n1", "inproc://n1", LEASE)
    with SqliteLocationStore(path, clock) as store:
        assert store.lookup("room-1") == kept
        assert store.lookup("room-2") is None
        assert [r for r in store.nodes() if r.node_id == "n1"] == [node]
        assert store.renew_node("n1", node.incarnation, LEASE).incarnation == node.incarnation
        # the counters were kept too: neither the released generation nor an incarnation returns
        assert _reserve(store, "room-2", "n3").location.object_generation > gone.object_generation
        assert store.register_node("n2", "inproc://n2", LEASE).incarnation > node.incarnation


def test_the_default_clock_is_the_wall_clock(tmp_path: pathlib.Path) -> None:
    with SqliteLocationStore(tmp_path / "store.db") as store:
        before = time.time()
        rec = store.register_node("n1", "inproc://n1", LEASE)
        after = time.time()
    assert before + LEASE <= rec.lease_until <= after + LEASE


def test_a_file_that_is_not_a_sqlite_database_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.db"
    text = "these are my notes, not a database\n" * 50
    path.write_text(text)
    with pytest.raises(InvalidArgument, match="is not a SQLite database"):
        SqliteLocationStore(path)
    assert path.read_text() == text  # left as it was


def test_a_sqlite_database_of_something_else_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    raw.commit()
    raw.close()
    with pytest.raises(InvalidArgument, match="not a ZLink location store"):
        SqliteLocationStore(path)
    raw = sqlite3.connect(path)  # nothing of ours was added
    names = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    raw.close()
    assert names == {"invoices"}


def test_another_schema_version_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    SqliteLocationStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    raw.commit()
    raw.close()
    with pytest.raises(InvalidArgument, match=f"schema version '99'.*version {SCHEMA_VERSION}"):
        SqliteLocationStore(path)


def test_a_path_that_cannot_hold_a_store_is_refused(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "no-such-folder" / "store.db"
    with pytest.raises(InvalidArgument, match="does not exist"):
        SqliteLocationStore(missing)
    assert not missing.parent.exists()  # nothing was created
    with pytest.raises(InvalidArgument, match="is a folder"):
        SqliteLocationStore(tmp_path)
    for shared_by_nobody in (":memory:", ""):
        with pytest.raises(InvalidArgument, match="needs a file"):
            SqliteLocationStore(shared_by_nobody)
    with pytest.raises(InvalidArgument, match="busy_timeout"):
        SqliteLocationStore(tmp_path / "store.db", busy_timeout=-1.0)


def test_calls_after_close_are_unavailable(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteLocationStore(path, ManualClock())
    _reserve(store, "room-1", "n1")
    used, closed, finished = threading.Event(), threading.Event(), threading.Event()
    after: list[BaseException] = []

    def other_thread() -> None:  # a thread with a connection of its own, alive across close()
        store.lookup("room-1")
        used.set()
        closed.wait(WAIT)
        try:
            store.lookup("room-1")
        except Unavailable as exc:
            after.append(exc)
        finished.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert used.wait(WAIT)
        store.close()
    finally:
        closed.set()
        thread.join(WAIT)
    assert finished.is_set() and len(after) == 1
    # every connection is closed, the other thread's too (the store held it, not the thread):
    # the file can leave WAL mode. (Probed once that thread ended: on the free-threaded build
    # a connection closed from another thread lets go of the file only when its own thread
    # runs again, as its statements are freed there.)
    raw = sqlite3.connect(path, timeout=0)
    assert raw.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    raw.close()
    calls = [
        lambda: store.lookup("room-1"),
        lambda: _reserve(store, "room-2", "n1"),
        lambda: _release(store, "room-1", "n1", 1),
        lambda: _transfer(store, "room-1", "n1", 1, "n2"),
        lambda: store.register_node("n1", "e", LEASE),
        lambda: store.renew_node("n1", 1, LEASE),
        lambda: store.unregister_node("n1", 1),
        store.nodes,
    ]
    for call in calls:
        with pytest.raises(Unavailable, match="is closed"):
            call()
    store.close()  # again: nothing happens


def _open_files(path: pathlib.Path) -> int:
    """How many descriptors of this process have ``path`` open (one per connection)."""
    fds = pathlib.Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor)
            count += os.readlink(fd) == str(path)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_threads_that_ended_do_not_leave_connections_open(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteLocationStore(path, ManualClock())
    _reserve(store, "room-1", "n1")
    assert _open_files(path) == 1  # this thread's connection
    for _ in range(20):  # short-lived readers, one after the other, each with a connection
        thread = threading.Thread(target=store.lookup, args=("room-1",))
        thread.start()
        thread.join(WAIT)
    # this thread's, the last reader's, and maybe one descriptor SQLite keeps for reuse (it
    # defers closing a file while another connection of the process holds POSIX locks on it)
    assert _open_files(path) <= 3
    store.close()
    assert _open_files(path) == 0


def test_a_write_that_waits_past_the_busy_timeout_is_unavailable(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "store.db"
    store = SqliteLocationStore(path, ManualClock(), busy_timeout=0.05)
    held = _reserve(store, "room-1", "n1").location
    (node,) = store.nodes()  # n1, registered by _reserve
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
        writes = [
            lambda: _reserve(store, "room-2", "n1"),
            lambda: _transfer(store, "room-1", "n1", 1, "n2"),
            lambda: _release(store, "room-1", "n1", 1),
            lambda: store.register_node("n2", "inproc://n2", LEASE),
            lambda: store.renew_node("n1", node.incarnation, LEASE),
            lambda: store.unregister_node("n1", node.incarnation),
        ]
        for write in writes:
            with pytest.raises(Unavailable, match="database is locked") as caught:
                write()
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert store.lookup("room-1") == held  # readers do not wait for a writer (WAL)
        assert store.nodes() == [node]
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    assert store.lookup("room-1") == held and store.lookup("room-2") is None
    assert store.nodes() == [node]
    # nothing was taken from the counters either
    assert _reserve(store, "room-2", "n1").location.object_generation == held.object_generation + 1
    assert store.register_node("n2", "e", LEASE).incarnation == node.incarnation + 1
    store.close()


def test_a_write_that_fails_halfway_is_rolled_back_whole(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteLocationStore(path, ManualClock())
    first = _reserve(store, "room-1", "n1").location
    raw = sqlite3.connect(path)
    # the claim takes a generation from the counter, then its INSERT fails
    raw.execute(
        "CREATE TRIGGER fail BEFORE INSERT ON locations BEGIN SELECT RAISE(ABORT, 'disk on fire');"
        " END"
    )
    raw.commit()
    try:
        with pytest.raises(Unavailable, match="disk on fire") as caught:
            _reserve(store, "room-2", "n1")
        assert isinstance(caught.value.__cause__, sqlite3.Error)
        assert store.lookup("room-2") is None
    finally:
        raw.execute("DROP TRIGGER fail")
        raw.commit()
        raw.close()
    # the same thread writes again (its transaction was ended), and the counter step was undone
    second = _reserve(store, "room-2", "n1")
    assert second.created and second.location.object_generation == first.object_generation + 1
    store.close()


# -- Redis --------------------------------------------------------------------------------------


def _raw(server: RedisServer) -> redis.Redis:
    """A plain client of the test's server, to act on it behind the store's back."""
    return redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=WAIT)


def test_redis_scripts_are_loaded_again_after_a_script_flush_and_a_restart(
    redis_server: RedisServer, clock: ManualClock
) -> None:
    with RedisLocationStore(redis_server.url, clock) as store:

        def every_script() -> None:  # each of the store's eight scripts runs once
            n1 = store.register_node("n1", "inproc://n1", LEASE)  # register
            n2 = store.register_node("n2", "inproc://n2", LEASE)
            store.renew_node("n1", n1.incarnation, LEASE)  # renew
            assert store.reserve("room-1", "spot", "game.room", "n1", n1.incarnation).created
            assert store.lookup("room-1") is not None  # lookup (reserve ran it, and claim)
            moved = store.transfer(
                "room-1", "n1", n1.incarnation, 1, "n2", n2.incarnation
            )  # transfer
            assert store.release("room-1", "n2", n2.incarnation, moved.authority_generation)
            assert store.unregister_node("n1", n1.incarnation)  # unregister
            assert [r.node_id for r in store.nodes()] == ["n2"]  # nodes

        every_script()
        raw = _raw(redis_server)
        try:
            assert raw.info("memory")["number_of_cached_scripts"] == 8
            raw.script_flush()
            assert raw.info("memory")["number_of_cached_scripts"] == 0
            every_script()  # every EVALSHA met NOSCRIPT, loaded its script and ran it
            assert raw.info("memory")["number_of_cached_scripts"] == 8
        finally:
            raw.close()
        redis_server.stop()  # a real restart: a new process, no scripts, no data (--save '')
        redis_server.start()
        assert store.nodes() == []  # the pooled connections to the old process were replaced
        every_script()


def test_redis_restarted_empty_reuses_no_number_and_grants_no_claim_for_one_lease(
    redis_server: RedisServer, clock: ManualClock
) -> None:
    """Issue "Node leases": a Redis that lost its data (killed, restarted empty) hands out no
    incarnation or object generation twice, and grants no claim until one lease has passed
    since a node told it an incarnation it never handed out."""
    with RedisLocationStore(redis_server.url, clock) as store:
        n1 = store.register_node("n1", "inproc://n1", LEASE)
        n2 = store.register_node("n2", "inproc://n2", LEASE)
        before = [_reserve(store, f"room-{i}", "n1").location for i in range(3)]
        redis_server.kill()  # kill -9: nothing saved
        redis_server.start()  # the same port, empty
        assert store.lookup("room-0") is None and store.nodes() == []  # the data is gone
        back = store.register_node("n1", "inproc://n1", LEASE, known_incarnation=n1.incarnation)
        assert back.incarnation > max(n1.incarnation, n2.incarnation)
        fresh = store.register_node("n3", "inproc://n3", LEASE)  # a node new to the mesh
        assert fresh.incarnation > back.incarnation
        with pytest.raises(Unavailable, match=r"lost its data .* another 3\.0 s"):
            store.reserve("room-0", "spot", "game.room", "n1", back.incarnation)
        assert store.lookup("room-0") is None  # refused, not applied
        clock.advance(LEASE / 2)
        store.renew_node("n1", back.incarnation, LEASE)
        with pytest.raises(Unavailable, match=r"lost its data .* another 1\.5 s"):
            store.reserve("room-0", "spot", "game.room", "n1", back.incarnation)
        clock.advance(LEASE / 2)  # one lease since the loss was found
        taken = store.reserve("room-0", "spot", "game.room", "n1", back.incarnation)
        assert taken.created and taken.previous is None
        other = store.reserve("room-9", "spot", "game.room", "n1", back.incarnation).location
        old = {loc.object_generation for loc in before}
        assert min(taken.location.object_generation, other.object_generation) > max(old)
        assert taken.location.authority_generation == 1  # the store knew nothing of room-0


def test_redis_that_does_not_answer_is_unavailable_within_the_timeout(
    redis_server: RedisServer, clock: ManualClock
) -> None:
    timeout = 0.5
    store = RedisLocationStore(redis_server.url, clock, timeout=timeout)
    node = store.register_node("n1", "inproc://n1", LEASE)
    store.register_node("n2", "inproc://n2", LEASE)
    assert store.reserve("room-1", "spot", "game.room", "n1", node.incarnation).created
    calls = [
        lambda: store.lookup("room-1"),
        lambda: store.reserve("room-2", "spot", "game.room", "n1", node.incarnation),
        lambda: store.release("room-1", "n1", node.incarnation, 1),
        lambda: store.transfer(
            "room-1", "n1", node.incarnation, 1, "n2", _incarnation(store, "n2")
        ),
        lambda: store.register_node("n3", "inproc://n3", LEASE),
        lambda: store.renew_node("n1", node.incarnation, LEASE),
        lambda: store.unregister_node("n1", node.incarnation),
        store.nodes,
        store.owned,
    ]

    def all_unavailable(within: float) -> None:
        for call in calls:
            began = time.monotonic()
            with pytest.raises(Unavailable, match="failed") as caught:
                call()
            assert time.monotonic() - began < within, call
            assert isinstance(caught.value.__cause__, redis.RedisError)

    try:
        redis_server.pause()  # it accepts connections and answers nothing: reads time out
        all_unavailable(within=2 * timeout + 1.0)
        redis_server.kill()  # nothing listens: refused at once
        all_unavailable(within=timeout + 1.0)
        began = time.monotonic()
        with pytest.raises(Unavailable):
            RedisLocationStore(redis_server.url, clock, timeout=timeout)  # asked at once
        assert time.monotonic() - began < timeout + 1.0
    finally:
        store.close()


def test_redis_calls_after_close_are_unavailable_and_leave_no_connection(
    redis_server: RedisServer,
) -> None:
    raw = _raw(redis_server)
    try:
        store = RedisLocationStore(redis_server.url)
        _reserve(store, "room-1", "n1")
        assert len(raw.client_list()) == 2  # the store's connection and this one
        store.close()  # (the server sees the connection end when it reads the socket next)
        until(lambda: len(raw.client_list()) == 1, "the server to drop the store's connection")
        calls = [
            lambda: store.lookup("room-1"),
            lambda: store.reserve("room-2", "spot", "game.room", "n1", 1),
            lambda: store.release("room-1", "n1", 1, 1),
            lambda: store.transfer("room-1", "n1", 1, 1, "n2", 1),
            lambda: store.register_node("n1", "e", LEASE),
            lambda: store.renew_node("n1", 1, LEASE),
            lambda: store.unregister_node("n1", 1),
            store.nodes,
            store.owned,
        ]
        for call in calls:
            with pytest.raises(Unavailable, match="is closed"):
                call()
        store.close()  # again: nothing happens
        assert len(raw.client_list()) == 1  # no call opened one again
    finally:
        raw.close()


def test_redis_default_clock_is_the_server_time(redis_server: RedisServer) -> None:
    with RedisLocationStore(redis_server.url) as store:
        before = time.time()
        rec = store.register_node("n1", "inproc://n1", LEASE)
        after = time.time()
    # the same machine's clock; Redis reads it to the microsecond
    assert before + LEASE - 1e-5 <= rec.lease_until <= after + LEASE + 1e-5


def test_redis_prefixes_keep_meshes_apart(redis_server: RedisServer, clock: ManualClock) -> None:
    # "m*" would match every key of "mx" as a glob: owned() must read it literally
    with (
        RedisLocationStore(redis_server.url, clock, prefix="m*") as first,
        RedisLocationStore(redis_server.url, clock, prefix="mx") as second,
    ):
        assert first.prefix == "m*"
        _reserve(first, "room-1", "a")
        _reserve(second, "room-1", "b")
        _reserve(second, "room-2", "b")
        assert [r.node_id for r in first.nodes()] == ["a"]
        assert [r.node_id for r in second.nodes()] == ["b"]
        assert first.owned() == {("a", _incarnation(first, "a")): 1}
        assert second.owned() == {("b", _incarnation(second, "b")): 2}
        assert first.lookup("room-1").owner_node == "a"
        assert second.lookup("room-1").owner_node == "b"


def test_redis_keys_of_something_else_are_refused(redis_server: RedisServer) -> None:
    raw = _raw(redis_server)
    try:
        raw.set("zlink:schema", "99")
        with pytest.raises(InvalidArgument, match=r"schema version '99'.*version 1"):
            RedisLocationStore(redis_server.url)
        raw.delete("zlink:schema")
        raw.hset("zlink:schema", "a", "b")
        with pytest.raises(InvalidArgument, match="not a ZLink location store mark"):
            RedisLocationStore(redis_server.url)
        assert raw.hgetall("zlink:schema") == {"a": "b"}  # left as it was
        RedisLocationStore(redis_server.url, prefix="other").close()  # another prefix: fine
        assert raw.get("other:schema") == "1"
    finally:
        raw.close()


def test_redis_bad_arguments_are_refused(redis_server: RedisServer) -> None:
    url = redis_server.url
    for timeout in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidArgument, match="timeout"):
            RedisLocationStore(url, timeout=timeout)
    for prefix in ("", " zlink", "zlink:loc"):
        with pytest.raises(InvalidArgument, match="prefix"):
            RedisLocationStore(url, prefix=prefix)
    with RedisLocationStore(url) as store:
        with pytest.raises(InvalidArgument, match="2\\*\\*53"):
            store.register_node("n1", "e", LEASE, known_incarnation=2**53)
        assert store.nodes() == []


# -- racing claims ------------------------------------------------------------------------------


def _check_race(results: dict[str, dict[str, list[Any]]]) -> None:
    """``results[racer][spot] = [created, owner, object_generation]``: each spot created once,
    every racer told the same owner and generation, all generations distinct."""
    spots = [f"spot-{i}" for i in range(SPOTS)]
    generations = set()
    for spot in spots:
        answers = [results[racer][spot] for racer in results]
        creators = [racer for racer in results if results[racer][spot][0]]
        assert len(creators) == 1, (spot, creators)
        assert {(owner, gen) for _, owner, gen in answers} == {(creators[0], answers[0][2])}
        generations.add(answers[0][2])
    assert len(generations) == SPOTS


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_threads_racing_to_claim_each_spot_once(
    kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    store: SqliteLocationStore | RedisLocationStore
    if kind == "sqlite":
        store = SqliteLocationStore(tmp_path / "store.db", ManualClock())
    else:  # on the server's clock: leases of HELD seconds outlast the race
        store = RedisLocationStore(request.getfixturevalue("redis_server").url)
    racers = 8
    start = threading.Barrier(racers, timeout=WAIT)
    results: dict[str, dict[str, list[Any]]] = {}
    errors: list[BaseException] = []

    def race(name: str) -> None:
        try:
            start.wait()
            mine = {}
            for i in range(SPOTS):
                r = _reserve(store, f"spot-{i}", name)
                mine[f"spot-{i}"] = [r.created, r.location.owner_node, r.location.object_generation]
            results[name] = mine
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(f"t{k}",)) for k in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    store.close()
    assert not errors, errors
    assert len(results) == racers
    _check_race(results)


_RACER = """
import json, sys
from zlink.mesh.redis_store import RedisLocationStore
from zlink.mesh.sqlite_store import SqliteLocationStore
where, name, spots = sys.argv[1], sys.argv[2], int(sys.argv[3])
if where.startswith("redis://"):
    store = RedisLocationStore(where)
else:
    store = SqliteLocationStore(where, busy_timeout=30.0)
me = store.register_node(name, "inproc://" + name, 1e6).incarnation
print("ready", flush=True)
sys.stdin.readline()  # the start signal: every racer has opened the file by now
mine = {}
for i in range(spots):
    r = store.reserve(f"spot-{i}", "spot", "game.room", name, me)
    mine[f"spot-{i}"] = [r.created, r.location.owner_node, r.location.object_generation]
store.close()
print(json.dumps(mine), flush=True)
"""


def _line(proc: subprocess.Popen[str], deadline: float) -> str:
    """One line of ``proc``'s output, or fail at ``deadline`` (real seconds, monotonic)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            raise AssertionError(f"racer {proc.args!r} said nothing in time")
    return proc.stdout.readline()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_processes_racing_to_claim_each_spot_once(
    kind: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        where = str(tmp_path / "store.db")
        SqliteLocationStore(where).close()  # the schema exists before anyone races
    else:
        where = request.getfixturevalue("redis_server").url
    deadline = time.monotonic() + WAIT
    procs: list[subprocess.Popen[str]] = []
    try:
        for k in range(4):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _RACER, where, f"p{k}", str(SPOTS)],
                    cwd=ROOT,  # this checkout's zlink comes first on sys.path
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )
        for proc in procs:
            assert _line(proc, deadline) == "ready\n"
        for proc in procs:  # go, all at once
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = {}
        for k, proc in enumerate(procs):
            line = _line(proc, deadline)
            assert proc.wait(max(0.0, deadline - time.monotonic())) == 0
            results[f"p{k}"] = json.loads(line)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WAIT)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
    _check_race(results)


# -- open_store ---------------------------------------------------------------------------------


def test_open_store_memory(clock: ManualClock) -> None:
    store = open_store("memory", clock)
    assert isinstance(store, InMemoryLocationStore)
    assert store.register_node("n1", "inproc://n1", LEASE).lease_until == 1003.0  # its clock


def test_open_store_sqlite_relative_and_absolute(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    relative = open_store("sqlite:///data/main.db", clock)
    assert isinstance(relative, SqliteLocationStore)
    assert relative.path == str(tmp_path / "data" / "main.db")
    assert relative.register_node("n1", "e", LEASE).lease_until == 1003.0  # its clock
    monkeypatch.chdir(ROOT)  # a thread that opens its connection later finds the same file
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(relative.nodes()))
    thread.start()
    thread.join(WAIT)
    assert [r.node_id for r in seen[0]] == ["n1"]
    relative.close()
    absolute = open_store(f"sqlite:///{tmp_path / 'data' / 'main.db'}", clock)
    assert str(tmp_path).startswith("/")  # so the URL had four slashes
    assert isinstance(absolute, SqliteLocationStore)
    assert absolute.path == relative.path
    assert [r.node_id for r in absolute.nodes()] == ["n1"]  # the same file
    absolute.close()
    assert not (ROOT / "data" / "main.db").exists()


def test_open_store_redis(redis_server: RedisServer, clock: ManualClock) -> None:
    store = open_store(redis_server.url, clock)
    try:
        assert isinstance(store, RedisLocationStore)
        assert store.register_node("n1", "e", LEASE).lease_until == 1003.0  # its clock
    finally:
        store.close()


def test_open_store_redis_that_nothing_answers_is_unavailable_at_once() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    began = time.monotonic()
    with pytest.raises(Unavailable, match="Connection refused") as caught:
        open_store(url)  # the server is asked when the store opens, not at its first use
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert time.monotonic() - began < WAIT


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://", "names its host"),
        ("redis:///0", "names its host"),
        ("rediss://:secret@/0", "names its host"),
        ("redis://127.0.0.1:99999/0", "redis://HOST"),
        ("redis://127.0.0.1:port/0", "redis://HOST"),
        ("redis://user:secret@127.0.0.1:port/0", "redis://HOST"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://127.0.0.1:6379/0/1", "database number"),
        ("redis://127.0.0.1:6379/0?socket_timeout=1", "no options"),
        ("redis://user:secret@127.0.0.1:6379/0?db=1", "no options"),
    ],
)
def test_open_store_refuses_bad_redis_urls(url: str, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason) as caught:
        open_store(url)  # nothing is opened: 127.0.0.1:6379 is never asked
    assert "secret" not in str(caught.value)  # a password in the URL is not repeated


def test_open_store_redis_without_redis_py_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis fails
    monkeypatch.delitem(sys.modules, "zlink.mesh.redis_store")
    with pytest.raises(InvalidArgument, match=r"pip install 'zlink\[redis\]'"):
        open_store("redis://127.0.0.1:6379/0")


@pytest.mark.parametrize(
    "url",
    [
        "",
        "Memory",
        "memory://",
        "main.db",
        "/var/lib/zlink/main.db",
        "sqlite://",
        "sqlite:///",
        "sqlite://host/main.db",
        "sqlite:main.db",
        "sqlite:///:memory:",
        "sqlite:///main.db?timeout=5",
        "postgresql://localhost/zlink",
    ],
)
def test_open_store_refuses_other_urls(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        open_store(url)
    assert "sqlite:///" in str(caught.value) or "memory" in str(caught.value)


def test_open_store_names_the_accepted_forms() -> None:
    with pytest.raises(InvalidArgument) as caught:
        open_store("etcd://cluster")
    message = str(caught.value)
    assert "'etcd://cluster'" in message
    forms = ('"memory"', "sqlite:///relative", "sqlite:////", "redis://HOST:PORT/DB")
    assert all(form in message for form in forms)


@pytest.mark.timeout(60)
def test_processes_opening_one_fresh_file_at_the_same_moment_all_get_it(tmp_path):
    """``zlink run --nodes K`` starts K processes that open one new store file at once.
    Switching it to WAL takes an exclusive lock, and SQLite answers "database is locked" there
    without waiting for the busy timeout: 17 of 90 such opens failed before the open was tried
    again within the busy timeout."""
    import subprocess
    import sys
    import time

    files = [str(tmp_path / f"fresh-{i}.db") for i in range(10)]
    start = time.time() + 2.0  # after every process has imported zlink
    code = (
        "import sys, time\n"
        "from zlink.mesh.sqlite_store import SqliteLocationStore\n"
        f"files, start = {files!r}, {start!r}\n"
        "for i, path in enumerate(files):\n"
        "    while time.time() < start + i * 0.25: pass  # the same moment in every process\n"
        "    store = SqliteLocationStore(path)\n"
        "    store.nodes()\n"
        "    store.close()\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    try:
        errors = [p.communicate(timeout=45)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [p.returncode for p in procs] == [0, 0, 0], errors


def test_a_store_serves_one_mesh_and_refuses_a_node_of_another(store: LocationStore) -> None:
    """A service probe: two meshes (``--mesh alpha``, ``--mesh beta``) on one store shared
    its rows: beta's ``get_or_create("user-42")`` found alpha's Spot and sent to it, and a
    node id used in both superseded the other mesh's node. A store now serves the mesh that
    first joined it; a node of another is ``InvalidArgument`` naming both, nothing written."""
    store.join_mesh("alpha")
    store.join_mesh("alpha")  # the same mesh again (another node, a restart): fine
    with pytest.raises(InvalidArgument, match=r"'alpha'.*'beta'"):
        store.join_mesh("beta")
    assert store.nodes() == []
