"""A node's place in the mesh: registration, a lease renewed from the deadline heap, members.

Guarantees / assumes:
* At start the node registers (id, endpoint) in the Location Store, which gives it a new
  ``incarnation``; from then on its lease is renewed about three times per ``lease_seconds``
  (python-api §10), each renewal a store call on the store thread, its outcome handled on the
  infrastructure thread. A renewal the store refuses or fails is counted
  (``lease_renewals_failed``) and tried again sooner; self-fencing on a lapsed lease belongs to
  failure detection (issue "Node leases").
* The store is the membership table: ``members()`` are the nodes whose lease holds there,
  never inferred from who happens to be connected.
* Everything here runs on the infrastructure or store thread except ``register``/``leave``
  (the node's start and shutdown) and ``members`` (a caller's thread, no lock held).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .location import LocationStore, NodeRecord
from .store_worker import StoreWorker

if TYPE_CHECKING:
    from ..executor import InfraExecutor

_log = logging.getLogger("zlink.mesh")


class NodeMembership:
    """Registration and lease of one node (see the module docstring)."""

    def __init__(
        self, node_id: str, endpoint: str, store: LocationStore, worker: StoreWorker,
        infra: InfraExecutor, lease_seconds: float, count: Callable[[str], None],
        on_members: Callable[[list[NodeRecord]], None] | None = None,
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.endpoint = endpoint
        self.store = store
        self.lease_seconds = lease_seconds
        self._infra = infra
        self._count = count
        self._worker = worker
        self._on_members = on_members  # told the members at start and after each renewal
        self.record: NodeRecord | None = None
        self._stopped = False

    @property
    def incarnation(self) -> int:
        """The incarnation the store gave this node (``0`` before it registered)."""
        return 0 if self.record is None else self.record.incarnation

    @property
    def lease_until(self) -> float | None:
        """When the last confirmed lease ends, on the store's clock (``None``: not yet)."""
        return None if self.record is None else self.record.lease_until

    def register(self, endpoint: str | None = None) -> NodeRecord:
        """Register with a new incarnation and start renewing (the node's start; blocks)."""
        if endpoint is not None:
            self.endpoint = endpoint
        self.record = self.store.register_node(self.node_id, self.endpoint, self.lease_seconds)
        self._schedule(self.lease_seconds / 3)
        return self.record

    def announce(self) -> None:
        """Tell ``on_members`` who the members are now (the node's start; blocks)."""
        if self._on_members is not None:
            self._on_members(self.store.nodes())

    def members(self) -> list[NodeRecord]:
        """The nodes whose lease holds in the store, this one included."""
        return self.store.nodes()

    def leave(self, timeout: float) -> None:
        """Stop renewing and unregister (the node's shutdown)."""
        self._stopped = True
        self._worker.stop(timeout)  # what it was doing ends first
        if self.record is not None:
            try:
                self.store.unregister_node(self.node_id, self.record.incarnation)
            except Exception:  # noqa: BLE001 - its lease lapses anyway
                _log.warning("node %s could not unregister", self.node_id, exc_info=True)

    def _schedule(self, delay: float) -> None:
        if not self._stopped:
            self._infra.call_later(delay, self._renew)

    def _renew(self) -> None:
        """On the infrastructure thread: ask the store thread to renew the lease."""
        if self._stopped or self.record is None:
            return
        done = self._worker.call(self._renew_and_list, self.record.incarnation)
        done.add_callback(self._renewed)

    def _renew_and_list(self, incarnation: int) -> NodeRecord:
        """(Store thread.) Renew, then read the members for ``on_members`` (a member list
        that fails to read is only a missed hint: peers also greet this node themselves)."""
        record = self.store.renew_node(self.node_id, incarnation, self.lease_seconds)
        if self._on_members is not None:
            try:
                self._on_members(self.store.nodes())
            except Exception:  # noqa: BLE001 - the renewal itself succeeded
                _log.debug("node %s could not list the members", self.node_id, exc_info=True)
        return record

    def _renewed(self, record: Any, error: BaseException | None) -> None:
        # the next attempt is on the heap before the outcome is counted (what watches the
        # counters then sees a node that will try again)
        if error is not None:
            self._schedule(self.lease_seconds / 6)  # sooner, while the lease may still hold
            _log.warning("node %s: lease renewal failed: %s", self.node_id, error)
            self._count("lease_renewals_failed")
            return
        self.record = record
        self._schedule(self.lease_seconds / 3)
        self._count("lease_renewals")
