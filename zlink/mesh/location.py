"""The Location Store: each Spot's owner, owner lease and generations (execution-model §14).

Guarantees / assumes:
* ``reserve`` is the one place ownership is decided: only the node it confirms runs the
  factory, so a Spot asked for on several nodes at once is activated once.
* Every write after that is fenced by ``authority_generation``: a node that lost ownership
  (a stale owner) has its write refused with ``Unavailable``, never applied.
* ``object_generation`` numbers incarnations across the whole store (public ``SpotRef``);
  ``authority_generation`` numbers owner changes of one Spot (store and runtime fencing only).
* The store is also the membership table: each node registers (id, endpoint) and gets a new
  ``incarnation`` (never reused), then renews its lease, measured on the store's clock.
  ``nodes()`` lists the nodes whose lease has not lapsed. A renewal for an old incarnation, or
  after the lease lapsed, is refused with ``Unavailable`` (the node must register again).
* ``InMemoryLocationStore`` keeps all of it under one lock: the embedded default.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import Unavailable
from ..executor import Clock, MonotonicClock, ranked_lock
from ..lock_order import LockRank


@dataclass(frozen=True, slots=True)
class Location:
    """Where one Spot lives, as the store knows it."""

    spot_id: str
    kind: str  # "spot" or "actor"
    type_name: str
    owner_node: str  # the node that owns it ("owner" alone names a serial queue)
    authority_generation: int
    object_generation: int
    lease_until: float


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node in the membership table."""

    node_id: str
    endpoint: str  # where its peers reach it ("inproc://<id>" in one process)
    incarnation: int  # new at every registration; envelopes name it (python-api §10)
    lease_until: float  # on the store's clock


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to ``reserve``: the location, and whether this caller won the factory."""

    location: Location
    created: bool


class LocationStore(Protocol):
    """What nodes need from the store; any implementation must fence as described above."""

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, lease_until: float
    ) -> Reservation: ...

    def lookup(self, spot_id: str) -> Location | None: ...

    def release(self, spot_id: str, node: str, authority_generation: int) -> bool: ...

    def transfer(
        self, spot_id: str, node: str, authority_generation: int, target: str, lease_until: float
    ) -> Location: ...

    def register_node(self, node_id: str, endpoint: str, lease_seconds: float) -> NodeRecord: ...

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord: ...

    def unregister_node(self, node_id: str, incarnation: int) -> bool: ...

    def nodes(self) -> list[NodeRecord]: ...

    def owned(self) -> dict[str, int]: ...


def check_fence(found: Location, node: str, authority_generation: int) -> None:
    """Refuse a write by anyone but the current owner at the current authority generation
    (the one fence error of every store: ``Unavailable``)."""
    if found.owner_node != node or found.authority_generation != authority_generation:
        raise Unavailable(
            f"stale owner: {node!r} at authority {authority_generation} may not write "
            f"{found.spot_id!r} (owner {found.owner_node!r} at {found.authority_generation})"
        )


class InMemoryLocationStore:
    """The embedded store: one dict under one lock, shared by the nodes of one process."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._lock = ranked_lock("store.memory", LockRank.STORE)
        self._locations: dict[str, Location] = {}
        self._object_generations = itertools.count(1)
        self._now = (clock or MonotonicClock()).now  # the store's clock: leases use it
        self._nodes: dict[str, NodeRecord] = {}
        self._incarnations = itertools.count(1)

    # -- membership -----------------------------------------------------------------------------
    def register_node(self, node_id: str, endpoint: str, lease_seconds: float) -> NodeRecord:
        """Register ``node_id`` with a new incarnation (a restarted node gets a higher one)."""
        with self._lock:
            record = NodeRecord(
                node_id, endpoint, next(self._incarnations), self._now() + lease_seconds
            )
            self._nodes[node_id] = record
            return record

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord:
        """Extend the lease of ``node_id`` at ``incarnation``; refused if it is not the
        current incarnation or its lease lapsed (the node must register again)."""
        with self._lock:
            found = self._nodes.get(node_id)
            now = self._now()
            if found is None or found.incarnation != incarnation or found.lease_until < now:
                raise Unavailable(f"node {node_id!r} at incarnation {incarnation} holds no lease")
            renewed = replace(found, lease_until=now + lease_seconds)
            self._nodes[node_id] = renewed
            return renewed

    def unregister_node(self, node_id: str, incarnation: int) -> bool:
        """Remove ``node_id`` (it stopped); only its current incarnation may."""
        with self._lock:
            found = self._nodes.get(node_id)
            if found is None or found.incarnation != incarnation:
                return False
            del self._nodes[node_id]
            return True

    def nodes(self) -> list[NodeRecord]:
        """The members: registered nodes whose lease has not lapsed, by id."""
        with self._lock:
            now = self._now()
            return sorted(
                (r for r in self._nodes.values() if r.lease_until >= now), key=lambda r: r.node_id
            )

    def owned(self) -> dict[str, int]:
        """How many Spots and Actors each node owns (``zlink mesh``)."""
        with self._lock:
            counts: dict[str, int] = {}
            for location in self._locations.values():
                counts[location.owner_node] = counts.get(location.owner_node, 0) + 1
            return counts

    # -- locations ------------------------------------------------------------------------------

    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, lease_until: float
    ) -> Reservation:
        """Claim ``spot_id`` for ``node`` if nobody owns it; else say who does."""
        with self._lock:
            found = self._locations.get(spot_id)
            if found is not None:
                return Reservation(found, created=False)
            location = Location(
                spot_id, kind, type_name, node, 1, next(self._object_generations), lease_until
            )
            self._locations[spot_id] = location
            return Reservation(location, created=True)

    def lookup(self, spot_id: str) -> Location | None:
        """The current location of ``spot_id``, or ``None``."""
        return self._locations.get(spot_id)

    def release(self, spot_id: str, node: str, authority_generation: int) -> bool:
        """Forget ``spot_id`` (it closed); refused for anyone but its current owner."""
        with self._lock:
            found = self._locations.get(spot_id)
            if found is None:
                return False
            check_fence(found, node, authority_generation)
            del self._locations[spot_id]
            return True

    def transfer(
        self, spot_id: str, node: str, authority_generation: int, target: str, lease_until: float
    ) -> Location:
        """Move authority to ``target`` (relocation); the new authority generation is +1."""
        with self._lock:
            found = self._locations.get(spot_id)
            if found is None:
                raise Unavailable(f"{spot_id!r} has no location to transfer")
            check_fence(found, node, authority_generation)
            moved = replace(
                found,
                owner_node=target,
                authority_generation=found.authority_generation + 1,
                lease_until=lease_until,
            )
            self._locations[spot_id] = moved
            return moved
