"""The execution engine of ZLink: a kernel that schedules opaque work.

This package knows nothing of Spots, Actors or messages (architecture: the arrows point
one way, ``node -> objects/messaging -> executor``). It offers:

* :class:`Clock` and :class:`MonotonicClock` (``clock.py``): the time source, injected.
* :class:`InfraExecutor` (``infra.py``): the infrastructure domain (execution-model §1, §10,
  §13): its own thread and one deadline heap; it progresses while every worker is blocked.
* :class:`WorkerPool` (``pool.py``): the application domain's worker threads, one shared run
  queue of runnable gates, sized by cores and never by the number of owners (§10).
* :class:`DaemonPool` (``offload.py``): bounded daemon threads for the io and cpu worker calls;
  never joined at exit, so a call that outlives its node's shutdown cannot hold the process.
* :class:`OwnerLanes` (``lanes.py``): the application and lifecycle FIFOs of one serial
  execution object, with count/byte admission, lifecycle streak and yield debt (§7).
* :class:`Gate` and :class:`Owner` (``gate.py``): the execution right and the serial objects that
  share it (§2, §3, §6, §8, §9, §11).
* :class:`Turn`, :class:`Job` and :class:`Suspension` (``turn.py``): one handler turn; a
  coroutine is stepped across threads inside its own ``contextvars.Context`` (§4, §6);
  :func:`run_turns` runs plain calls back to back as turns of their own (a batch).
"""

from .clock import Clock as Clock
from .clock import MonotonicClock as MonotonicClock
from .gate import Gate as Gate
from .gate import Owner as Owner
from .infra import DeadlineHandle as DeadlineHandle
from .infra import InfraExecutor as InfraExecutor
from .infra import in_infrastructure as in_infrastructure
from .lanes import Admission as Admission
from .lanes import Entries as Entries
from .lanes import Lane as Lane
from .lanes import LaneLimits as LaneLimits
from .lanes import OwnerLanes as OwnerLanes
from .lanes import RoomWaiter as RoomWaiter
from .lockorder import ranked_lock as ranked_lock
from .offload import DaemonPool as DaemonPool
from .pool import WorkerPool as WorkerPool
from .turn import CLOSED as CLOSED
from .turn import CallJob as CallJob
from .turn import Job as Job
from .turn import Step as Step
from .turn import Suspension as Suspension
from .turn import Turn as Turn
from .turn import current_turn as current_turn
from .turn import run_turns as run_turns

__all__ = [
    "CLOSED",
    "Admission",
    "CallJob",
    "Clock",
    "DaemonPool",
    "DeadlineHandle",
    "Entries",
    "Gate",
    "InfraExecutor",
    "Job",
    "Lane",
    "LaneLimits",
    "MonotonicClock",
    "Owner",
    "OwnerLanes",
    "RoomWaiter",
    "Step",
    "Suspension",
    "Turn",
    "WorkerPool",
    "current_turn",
    "in_infrastructure",
    "ranked_lock",
    "run_turns",
]
