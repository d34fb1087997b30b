"""The Location Store: each Spot's owner, owner lease and generations (execution-model §14).

Guarantees / assumes:
* ``reserve`` is the one place ownership is decided: only the node it confirms runs the
  factory, so a Spot asked for on several nodes at once is activated once.
* An owner is a node *and its incarnation*; its claim holds while that incarnation's lease
  holds in the store. Once the lease lapsed (the node died, stalled or was fenced), the next
  ``reserve`` takes the Spot over (re-homing, python-api §10 "Failure"): a higher authority
  generation and a new ``object_generation``.
* A node that registers again (restarted, or fenced) under the id of an incarnation whose lease
  still holds does not void that lease: the old incarnation's Spots stay its own until its
  lease ends (it may still be serving them: stopped, or cut off from its peers), and only then
  can they be taken over. Its writes are refused at once (it is not the current incarnation).
  A store keeps, per node id, the latest lease end of all its earlier incarnations (not only
  the last one's: an id registered twice within a lease, or whose newer incarnation stopped
  cleanly, left Spots that looked lapsed while their owner's lease held), and every earlier
  incarnation's Spots hold until then.
* Every write after that is fenced by owner node, owner incarnation and
  ``authority_generation``, and needs the writer's lease to hold: a stale owner (one that lost
  ownership, or whose lease lapsed) has its write refused with ``Unavailable``, never applied.
* ``object_generation`` numbers incarnations across the whole store (public ``SpotRef``);
  ``authority_generation`` numbers owner changes of one Spot (store and runtime fencing only).
* The store is also the membership table: each node registers (id, endpoint) and gets a new
  ``incarnation`` (never reused), then renews its lease, measured on the store's clock.
  ``nodes()`` lists the nodes whose lease has not lapsed. A renewal for an old incarnation, or
  after the lease lapsed, is refused with ``Unavailable`` (the node must register again).
* Data loss: a node registers again giving the incarnation it had (``known_incarnation``). A
  store that never handed that one out has lost its data (a Redis restarted empty): it hands
  out incarnations above it and grants no claim (reserve, transfer) for one lease, until every
  owner from before has stopped serving (each self-fences when its renewal is refused).
* The durable first record (execution-model §14, Instance cold activation): a claim may
  record the message that activates the Spot (``first``) in the same write; the owner clears
  it (``clear_first``, fenced) once that message's handler has ended. A claim that takes over
  a Spot whose record is still there keeps that record (the new owner replays it once, ahead
  of everything) and records nothing new.
* ``InMemoryLocationStore`` keeps all of it under one lock: the embedded default.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, replace
from typing import Protocol

from ..durations import check_seconds
from ..errors import InvalidArgument, Unavailable
from ..executor import Clock, MonotonicClock, ranked_lock
from ..lock_order import LockRank


@dataclass(frozen=True, slots=True)
class Location:
    """Where one Spot lives, as the store knows it.

    ``owner_incarnation`` is the incarnation of ``owner_node`` that holds it: the claim is good
    while that incarnation's lease holds (``owner_live``, read on the store's clock when the
    location was read; ``lease_until`` is that lease's end, ``0.0`` once it holds none)."""

    spot_id: str
    kind: str  # "spot" or "actor"
    type_name: str
    owner_node: str  # the node that owns it ("owner" alone names a serial queue)
    owner_incarnation: int
    authority_generation: int
    object_generation: int
    lease_until: float
    owner_live: bool = True
    first: tuple[str, str] | None = None  # the durable first record: (message type, payload)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node in the membership table."""

    node_id: str
    endpoint: str  # where its peers reach it ("inproc://<id>" in one process)
    incarnation: int  # new at every registration; envelopes name it (python-api §10)
    lease_until: float  # on the store's clock


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to ``reserve``: the location, and whether this caller won the factory
    (``previous``: the location it took over from an owner whose lease had lapsed)."""

    location: Location
    created: bool
    previous: Location | None = None


class LocationStore(Protocol):
    """What nodes need from the store; any implementation must fence as described above."""

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation: ...  # fmt: skip

    def clear_first(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> bool: ...

    def lookup(self, spot_id: str) -> Location | None: ...

    def release(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> bool: ...

    def transfer(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int, target: str,
        target_incarnation: int, keep_first: bool = False,
    ) -> Location:  # fmt: skip
        """Move authority to ``target``'s incarnation ``target_incarnation`` (relocation:
        the one that restored the move); the new authority generation is +1. Refused for a
        stale owner, an owner whose lease lapsed, a target that holds no lease, and a target
        live as another incarnation (one that fenced itself and registered again dropped
        what it restored: given the Spot, it would name an owner without it).

        The first record (execution-model §14, cold activation) is cleared in the same
        write, unless ``keep_first``: a Spot moves once its first message ran (its record
        then goes here: a clear of the source's that failed, or is under way, is so never
        left behind; a review found one retried after the move find the Spot gone, and the
        next owner after the target ran the message again), or with that message in its
        queue (``keep_first``: the record moves with it, and the target clears it once its
        handler ended; one that dies first leaves it for the next owner to replay, as a
        review found the message lost when the move had cleared it)."""
        ...

    def new_generation(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> Location:
        """A new ``object_generation`` for the owner's next activation of ``spot_id`` in the
        same place (an Instance Spot made again at its close, execution-model §14: a
        generation names one incarnation); owner and authority stay. Fenced as ``release``
        is; ``Unavailable`` if there is no row."""
        ...

    def join_mesh(self, mesh: str) -> None:
        """This store serves the mesh named ``mesh``: the first node to join records it; a
        node of another mesh is ``InvalidArgument`` (each mesh needs a store of its own),
        with nothing written."""
        ...

    def register_node(
        self, node_id: str, endpoint: str, lease_seconds: float, known_incarnation: int = 0
    ) -> NodeRecord: ...

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord: ...

    def unregister_node(self, node_id: str, incarnation: int) -> bool: ...

    def nodes(self) -> list[NodeRecord]: ...

    def now(self) -> float:
        """The store's clock, the one its leases are on (``zlink mesh``'s "lease left": a
        Redis server's clock, not the machine's that asks)."""
        ...

    def owned(self) -> dict[tuple[str, int], int]: ...

    def prune(self, lapsed_for: float) -> tuple[int, int]:
        """Retention (python-api §10 "Failure"; Orleans cleans up defunct silos): delete
        what nodes that died left behind, once their lease lapsed more than ``lapsed_for``
        seconds ago on the store's clock: each Spot and Actor row such an incarnation owns,
        but one that holds a durable first record (an accepted message, kept until a call
        runs it: execution-model §14), and each node row whose lease lapsed that long ago.
        A later call for such a Spot finds nothing (``NotFound``; ``get_or_create`` makes
        it anew) instead of re-homing it empty. Object generations and incarnations come
        from store-wide counters: none repeats (an authority generation starts at 1 again,
        as after a release; the fence holds because the incarnation it pairs with never
        comes back). Returns how many (locations, nodes) went."""
        ...


def refuse_other_mesh(store: str, theirs: str, mesh: str) -> None:
    """``InvalidArgument`` if ``store``, serving the mesh ``theirs``, is asked to serve the
    mesh ``mesh`` too (``LocationStore.join_mesh``)."""
    if theirs != mesh:
        raise InvalidArgument(
            f"{store} serves the mesh {theirs!r}; a node of the mesh {mesh!r} cannot use it:"
            " each mesh needs a Location Store of its own (another file; in Redis another"
            " database or key prefix)"
        )


class NoLease(Unavailable):
    """A node wrote or renewed without a live lease: it must register again (and, a renewal
    refused, fence itself: python-api §10 "Failure")."""


def no_lease(node: str, incarnation: int) -> NoLease:
    """The error of a node that writes without a live lease (it must register again)."""
    return NoLease(f"node {node!r} at incarnation {incarnation} holds no lease")


def no_target(spot_id: str, target: str, incarnation: int) -> Unavailable:
    """The error of a transfer to a node that holds no lease as the incarnation named (it
    went down, or fenced itself and registered again, dropping what it restored)."""
    return Unavailable(
        f"node {target!r} holds no lease at incarnation {incarnation}: {spot_id!r} stays"
    )


def recovering(left: float) -> Unavailable:
    """The error of a claim while the store waits out one lease after losing its data."""
    return Unavailable(
        f"the location store lost its data and grants no claims for another {left:.1f} s"
        " (owners from before may still be serving)"
    )


COUNTER_LIMIT = 2**53
"""Incarnations and generations a store takes are integers below this: exact in every store
(Lua's numbers in Redis are doubles; SQLite's INTEGER holds 2**63 - 1, and a counter at the
limit would turn into a REAL that ``+ 1`` never moves)."""


def check_counter(value: object, what: str) -> int:
    """An incarnation or generation given to a store: an ``int`` (not a bool) within
    ``0 .. COUNTER_LIMIT - 1``, else ``InvalidArgument`` (a store audit found SQLite's
    incarnations repeat, as floats, past its INTEGER, and an untyped ``OverflowError``)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < COUNTER_LIMIT:
        return value
    raise InvalidArgument(f"{what} is an integer within 0 .. 2**53 - 1, got {value!r}")


def check_counters(*values: object) -> None:
    """:func:`check_counter` for a write's incarnation and generation(s)."""
    for value in values:
        check_counter(value, "an incarnation or generation")


def take_left_row(
    store: LocationStore, spot_id: str, kind: str, type_name: str, node: str,
    incarnation: int, authority_generation: int, first: tuple[str, str] | None = None,
) -> Reservation:  # fmt: skip
    """(A node's store thread.) Claim anew a row of ``node``'s ``incarnation`` that nothing
    on that node has (a close whose ``release`` the store failed): released (fenced at
    ``authority_generation``; one gone or taken meanwhile is left to the claim), then
    reserved, with a new object generation (and ``first`` recorded, for an Instance Spot).
    The caller holds the id against a second claim meanwhile (``Runtime.releasing``)."""
    with contextlib.suppress(StaleOwner):  # (gone, or taken: the claim tells)
        store.release(spot_id, node, incarnation, authority_generation)
    return store.reserve(spot_id, kind, type_name, node, incarnation, first)


def check_lease(value: object) -> float:
    """A lease given to a store (python-api §9, durations): a finite number of seconds
    within ``1e-3 .. 1e7``, else ``InvalidArgument`` (not stored as NaN or infinity)."""
    return check_seconds(value, "a node's lease")


class StaleOwner(Unavailable):
    """A fenced write by anyone but the current owner at the current authority generation:
    the store's state is another owner's to settle (a write tried again meets it again)."""


def check_fence(found: Location, node: str, incarnation: int, authority_generation: int) -> None:
    """Refuse a write by anyone but the current owner (node and incarnation) at the current
    authority generation (the one fence error of every store: :class:`StaleOwner`, an
    ``Unavailable``)."""
    if (
        found.owner_node != node
        or found.owner_incarnation != incarnation
        or found.authority_generation != authority_generation
    ):
        raise StaleOwner(
            f"stale owner: {node!r} (incarnation {incarnation}) at authority"
            f" {authority_generation} may not write {found.spot_id!r} (owner"
            f" {found.owner_node!r}, incarnation {found.owner_incarnation}, at"
            f" {found.authority_generation})"
        )


class InMemoryLocationStore:
    """The embedded store: one dict under one lock, shared by the nodes of one process."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._lock = ranked_lock("store.memory", LockRank.STORE)
        self._locations: dict[str, Location] = {}
        self._object_generations = itertools.count(1)
        self._now = (clock or MonotonicClock()).now  # the store's clock: leases use it
        self._nodes: dict[str, NodeRecord] = {}
        self._mesh: str | None = None  # the mesh it serves: the first to join names it
        # node -> the incarnation registering again replaced, and its lease (see above)
        self._retired: dict[str, tuple[int, float]] = {}
        self._incarnation = 0  # the last one handed out
        self._claims_after = -math.inf  # no claim before it: the store lost data (never here)

    # -- membership -----------------------------------------------------------------------------
    def join_mesh(self, mesh: str) -> None:
        with self._lock:
            if self._mesh is None:
                self._mesh = mesh
        refuse_other_mesh("this in-memory store", self._mesh, mesh)

    def register_node(
        self, node_id: str, endpoint: str, lease_seconds: float, known_incarnation: int = 0
    ) -> NodeRecord:
        """Register ``node_id`` with a new incarnation, higher than any handed out and than
        ``known_incarnation`` (the one it had: a store that never gave it lost its data, and
        then grants no claims for one lease)."""
        lease_seconds = check_lease(lease_seconds)
        known_incarnation = check_counter(known_incarnation, "known_incarnation")
        with self._lock:
            now = self._now()
            if known_incarnation > self._incarnation:
                self._claims_after = max(self._claims_after, now + lease_seconds)
            self._incarnation = max(self._incarnation, known_incarnation) + 1
            record = NodeRecord(node_id, endpoint, self._incarnation, now + lease_seconds)
            old = self._nodes.get(node_id)
            if old is not None:  # every earlier incarnation's Spots hold until the latest
                before = self._retired.get(node_id)  # of their leases ends
                until = max(old.lease_until, 0.0 if before is None else before[1])
                self._retired[node_id] = (old.incarnation, until)
            self._nodes[node_id] = record
            return record

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord:
        """Extend the lease of ``node_id`` at ``incarnation``; refused if it is not the
        current incarnation or its lease lapsed (the node must register again)."""
        incarnation = check_counter(incarnation, "incarnation")
        lease_seconds = check_lease(lease_seconds)
        with self._lock:
            now = self._now()
            if not self._live(node_id, incarnation, now):
                raise no_lease(node_id, incarnation)
            renewed = replace(self._nodes[node_id], lease_until=now + lease_seconds)
            self._nodes[node_id] = renewed
            return renewed

    def unregister_node(self, node_id: str, incarnation: int) -> bool:
        """Remove ``node_id`` (it stopped); only its current incarnation may."""
        incarnation = check_counter(incarnation, "incarnation")
        with self._lock:
            found = self._nodes.get(node_id)
            if found is None or found.incarnation != incarnation:
                return False
            del self._nodes[node_id]
            return True

    def now(self) -> float:
        return self._now()

    def nodes(self) -> list[NodeRecord]:
        """The members: registered nodes whose lease has not lapsed, by id."""
        with self._lock:
            now = self._now()
            return sorted(
                (r for r in self._nodes.values() if r.lease_until >= now), key=lambda r: r.node_id
            )

    def owned(self) -> dict[tuple[str, int], int]:
        """How many Spots and Actors each node incarnation owns (``zlink mesh``: a node
        restarted with its id owns none of what its dead incarnation left)."""
        with self._lock:
            counts: dict[tuple[str, int], int] = {}
            for location in self._locations.values():
                key = (location.owner_node, location.owner_incarnation)
                counts[key] = counts.get(key, 0) + 1
            return counts

    def new_generation(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> Location:
        """See ``LocationStore.new_generation``."""
        check_counters(incarnation, authority_generation)
        with self._lock:
            found = self._writable(spot_id, node, incarnation, authority_generation)
            if found is None:
                raise Unavailable(f"{spot_id!r} has no location")
            again = replace(found, object_generation=next(self._object_generations))
            self._locations[spot_id] = again
            return self._as_now(again, self._now())

    def prune(self, lapsed_for: float) -> tuple[int, int]:
        """See ``LocationStore.prune``."""
        with self._lock:
            before = self._now() - lapsed_for
            gone = [
                spot_id for spot_id, found in self._locations.items()
                if found.first is None and self._lapsed_before(found, before)
            ]  # fmt: skip
            for spot_id in gone:
                del self._locations[spot_id]
            dead = [n for n, r in self._nodes.items() if r.lease_until < before]
            for node_id in dead:
                del self._nodes[node_id]
            for node_id in [n for n, (_i, until) in self._retired.items() if until < before]:
                del self._retired[node_id]
            return len(gone), len(dead)

    def _lapsed_before(self, found: Location, before: float) -> bool:
        """(Under ``_lock``.) Whether ``found``'s owner's lease lapsed before ``before``."""
        until = self._as_now(found, before).lease_until
        return until < before

    def _live(self, node_id: str, incarnation: int, now: float) -> bool:
        found = self._nodes.get(node_id)
        return found is not None and found.incarnation == incarnation and found.lease_until >= now

    def _as_now(self, found: Location, now: float) -> Location:
        """``found`` with its owner's lease as it is now (a retired incarnation's included)."""
        owner = self._nodes.get(found.owner_node)
        until = 0.0
        if owner is not None and owner.incarnation == found.owner_incarnation:
            until = owner.lease_until
        else:  # an earlier incarnation: the latest lease of those
            retired = self._retired.get(found.owner_node)
            if retired is not None and found.owner_incarnation <= retired[0]:
                until = retired[1]
        return replace(found, lease_until=until, owner_live=until >= now and until > 0.0)

    # -- locations ------------------------------------------------------------------------------

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        """Claim ``spot_id`` for ``node`` at ``incarnation`` if nobody owns it, or its owner's
        lease lapsed (re-homing: a new authority and object generation); else say who owns
        it. The claimer must hold a live lease. ``first``: the durable first record, written
        with the claim (a record left by the previous owner is kept instead)."""
        incarnation = check_counter(incarnation, "incarnation")
        with self._lock:
            now = self._now()
            found = self._locations.get(spot_id)
            if found is not None:
                found = self._as_now(found, now)
                if found.owner_live:
                    return Reservation(found, created=False)
            if not self._live(node, incarnation, now):
                raise no_lease(node, incarnation)
            if now < self._claims_after:
                raise recovering(self._claims_after - now)
            location = Location(
                spot_id, kind, type_name, node, incarnation,
                1 if found is None else found.authority_generation + 1,
                next(self._object_generations), self._nodes[node].lease_until, True,
                found.first if found is not None and found.first is not None else first,
            )  # fmt: skip
            self._locations[spot_id] = location
            return Reservation(location, created=True, previous=found)

    def clear_first(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> bool:
        """The first record's handler ended: forget the record (fenced like any write);
        ``False`` if there was none."""
        check_counters(incarnation, authority_generation)
        with self._lock:
            found = self._writable(spot_id, node, incarnation, authority_generation)
            if found is None or found.first is None:
                return False
            self._locations[spot_id] = replace(found, first=None)
            return True

    def _writable(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> Location | None:
        """(Under ``_lock``.) ``spot_id``'s location if ``node`` may write it (``None``: there
        is none); a stale owner, or one whose lease lapsed, is refused (raises)."""
        found = self._locations.get(spot_id)
        if found is None:
            return None
        check_fence(found, node, incarnation, authority_generation)
        if not self._live(node, incarnation, self._now()):
            raise no_lease(node, incarnation)
        return found

    def lookup(self, spot_id: str) -> Location | None:
        """The current location of ``spot_id``, or ``None``."""
        with self._lock:
            found = self._locations.get(spot_id)
            return None if found is None else self._as_now(found, self._now())

    def release(self, spot_id: str, node: str, incarnation: int, authority_generation: int) -> bool:
        """Forget ``spot_id`` (it closed); refused for anyone but its current owner, and for
        an owner whose lease lapsed."""
        check_counters(incarnation, authority_generation)
        with self._lock:
            if self._writable(spot_id, node, incarnation, authority_generation) is None:
                return False
            del self._locations[spot_id]
            return True

    def transfer(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int, target: str,
        target_incarnation: int, keep_first: bool = False,
    ) -> Location:  # fmt: skip
        """See ``LocationStore.transfer``."""
        check_counters(incarnation, authority_generation, target_incarnation)
        with self._lock:
            found = self._locations.get(spot_id)
            if found is None:
                raise Unavailable(f"{spot_id!r} has no location to transfer")
            check_fence(found, node, incarnation, authority_generation)
            now = self._now()
            if not self._live(node, incarnation, now):
                raise no_lease(node, incarnation)
            to = self._nodes.get(target)
            if to is None or to.lease_until < now or to.incarnation != target_incarnation:
                raise no_target(spot_id, target, target_incarnation)
            if now < self._claims_after:
                raise recovering(self._claims_after - now)
            moved = replace(
                found,
                owner_node=target,
                owner_incarnation=to.incarnation,
                authority_generation=found.authority_generation + 1,
                lease_until=to.lease_until,
                first=found.first if keep_first else None,  # (``LocationStore.transfer``)
            )
            self._locations[spot_id] = moved
            return moved
