"""The house's lock order: one table for every lock that is ever held while taking another.

A thread takes these locks only in increasing rank (``zlink.executor.lockorder`` checks it
under the test suite). Locks not in the table are leaves: nothing is taken while one is held.

    ROUTE (router.route_lock)              which path a remote target's calls take
      -> RELOCATION (relocator._lock)      moves leaving and arriving, parked calls
        -> PUBLISH (runtime.events' stripes) Logical Multicast events of one node and topic
        -> DIRECTORY (runtime._lock)       activation and removal of live objects
          -> YIELD (runtime._yield_lock)   Yields in flight per Spot
          -> PENDING (router._lock)        correlation ids of remote calls awaiting replies
          -> STORE (in-memory store lock)  the Location Store's table

Why this order: a call for a remote target is routed under ROUTE; when it meets a move it is
diverted under RELOCATION; a leaving move passes through the PUBLISH stripes (one at a time:
two are never held) before it reads its subscriber's event marks; an arriving move registers
its objects under DIRECTORY. Every
path that needs two of them goes down this list, never up it (python-api §10, issue
"The runtime, composed").
"""

from __future__ import annotations

from enum import IntEnum


class LockRank(IntEnum):
    ROUTE = 10
    RELOCATION = 20
    PUBLISH = 25
    DIRECTORY = 30
    YIELD = 40
    PENDING = 41
    STORE = 50


__all__ = ["LockRank"]
