"""What one node knows: its live objects, limits, pools and links (the runtime's state).

The runtime is this plus its parts (``Membership``, ``Creation``, ``Closing``, routing in
``Runtime``); each part inherits this class, so it sees the state with its types.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..executor import Gate, LaneLimits, ranked_lock
from ..lock_order import LockRank
from .routing import MeshRouter

if TYPE_CHECKING:
    from .ports import RelocationPort, RemoteJoinPort
from ..types import SpotKind
from .metrics import Metrics

if TYPE_CHECKING:
    from ..app import App
    from ..executor import Clock, InfraExecutor, WorkerPool

from .acts import GONE, ActorAct, ChannelAct, SpotAct

if TYPE_CHECKING:
    from .runtime import Runtime


class Directory:
    """The state of one node's runtime (see the module docstring)."""

    def __init__(
        self,
        app: App,
        *,
        node_id: str,
        mesh: str,
        limits: LaneLimits,
        budget: float,
        request_timeout: float,
        clock: Clock,
        pool: WorkerPool,
        infra: InfraExecutor,
        closing_timeout: float = 5.0,
        idle_timeout: float | None = None,
        io_pool: ThreadPoolExecutor | None = None,
        cpu_pool: ThreadPoolExecutor | None = None,
        worker_limit: int = 1024,
    ) -> None:
        self.app = app
        self.node_id = node_id
        self.mesh = mesh
        self.limits = limits
        self.budget = budget
        self.request_timeout = request_timeout
        self.closing_timeout = closing_timeout
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._now = clock.now
        self.pool = pool
        self.infra = infra
        self.io_pool = io_pool or ThreadPoolExecutor(16, thread_name_prefix="zlink-io")
        self.cpu_pool = cpu_pool or ThreadPoolExecutor(pool.size, thread_name_prefix="zlink-cpu")
        self.worker_limit = worker_limit
        self.worker_slots = threading.BoundedSemaphore(worker_limit)
        self.workers_in_flight = 0
        self.workers_idle = threading.Condition(threading.Lock())
        self.metrics = Metrics()
        self.spots: dict[str, SpotAct] = {}
        self.actors: dict[str, ActorAct] = {}
        self.channels: dict[str, ChannelAct] = {}
        self.entries: dict[str, SpotAct] = {}  # actor type -> its Entry Spot
        self.topics: dict[str, frozenset[str]] = {}  # topic -> subscribed Spot ids (copy on write)
        self.router: MeshRouter | None = None  # set when the node is part of a mesh
        self.relocator: RelocationPort | None = None  # plugged in by the node (a mesh)
        self.remote_join: RemoteJoinPort | None = None
        self._yield_lock = ranked_lock("runtime.yield", LockRank.YIELD)
        self.stopping = False  # read on the hot path
        self.draining = False  # drained: calls made here are refused; relayed calls go on
        self.stopped_admission = threading.Event()  # for those who must wait for it
        self._lock = ranked_lock("runtime.directory", LockRank.DIRECTORY)
        self._generations = itertools.count(1)
        instance_types = [s.name for s in app.spots.values() if s.kind is SpotKind.INSTANCE]
        self._only_instance_type = instance_types[0] if len(instance_types) == 1 else None

    @property
    def whole(self) -> Runtime:
        """This runtime with all its parts (what the objects it makes hold on to)."""
        return self  # type: ignore[return-value]

    def new_gate(self, name: str) -> Gate:
        return Gate(self.pool, self.clock, self.budget, name)

    # -- start --------------------------------------------------------------------------------
    def lease(self) -> float:
        return self.clock.now() + 3600.0  # no failure detection yet: leases are long

    def has_live(self, target: str) -> bool:
        """Whether a Spot or Actor ``target`` lives on this node (in any state but gone)."""
        act = self.spots.get(target) or self.actors.get(target)
        return act is not None and act.state != GONE
