"""Per-type work counts and handler latency on one node (issue 15: ``/metrics`` and
``node.status()``). Execution-model §13: metric collectors take no progress right, and
observing must not slow message processing: hence exact counts read off what a turn keeps
anyway, and latency sampled. §15: a handler's failure is counted like any other turn.

Guarantees / assumes:
* **Handled counts are exact and cost the hot path nothing new.** Each Spot or Actor
  activation already counts the messages its handlers ran (``ObjectAct.activity``, written
  only by its gate holder). A type's count is the sum over its live activations plus what its
  activations took with them when they left this node (closed, evicted, moved away, never
  made, fenced): ``Directory`` calls ``TypeStats.retire`` wherever an activation leaves its
  table. The same goes for the lanes' ``refused`` and ``waited`` counts.
* **Handler latency is sampled**: one message in ``SAMPLE_EVERY`` per activation (by its own
  count) is timed with ``time.perf_counter`` around the handler (an ``async def`` handler:
  until its coroutine ends, awaits included). The other messages pay one ``&`` and a branch.
  A histogram over the samples estimates the quantiles; its ``count`` is the number of
  samples, never the number of messages (that is the handled count).
* One lock (``_lock``, a leaf: nothing is called while it is held) guards the retired totals
  and the histograms; a sample takes it once, a snapshot once.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .acts import ChannelAct, ObjectAct

SAMPLE_EVERY = 64  # a power of two: the hot path (``SendJob.invoke``) tests ``activity & 63``
# Upper bounds of the latency buckets (seconds), the last one +Inf: handlers run from
# microseconds (a counter) to seconds (a handler that blocks).
LATENCY_BOUNDS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"),
)  # fmt: skip


class TypeRow:
    """One type's numbers at one moment (``TypeStats.rows``)."""

    __slots__ = ("buckets", "handled", "kind", "live", "refused", "sum", "type", "waited")

    def __init__(self, kind: str, type_: str) -> None:
        self.kind = kind
        self.type = type_
        self.live = 0
        self.handled = 0
        self.refused = 0
        self.waited = 0
        self.buckets = [0] * len(LATENCY_BOUNDS)  # per bucket, not cumulative
        self.sum = 0.0

    @property
    def samples(self) -> int:
        return sum(self.buckets)

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile of the samples (None
        without samples; the largest finite bound when it falls in +Inf)."""
        total = self.samples
        if not total:
            return None
        rank = q * total
        seen = 0
        for bound, n in zip(LATENCY_BOUNDS, self.buckets, strict=True):
            seen += n
            if seen >= rank and n:
                return bound if bound != float("inf") else LATENCY_BOUNDS[-2]
        return LATENCY_BOUNDS[-2]  # pragma: no cover - the loop always returns


class TypeStats:
    """A node's per-type totals of activations gone and its latency samples."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gone: dict[tuple[str, str], list[int]] = {}  # -> [handled, refused, waited]
        self._latency: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def retire(self, act: ObjectAct) -> None:
        """``act`` leaves this node's tables: keep what it counted."""
        lanes = act.owner.lanes
        key = (act.stats_kind, act.spec.name)
        with self._lock:
            row = self._gone.get(key)
            if row is None:
                row = self._gone[key] = [0, 0, 0]
            row[0] += act.activity
            row[1] += lanes.refused
            row[2] += lanes.waited

    def sample(self, kind: str, type_: str, seconds: float) -> None:
        """One timed handler run of a ``kind`` object of type ``type_``."""
        at = bisect_left(LATENCY_BOUNDS, seconds)
        key = (kind, type_)
        with self._lock:
            hist = self._latency.get(key)
            if hist is None:
                hist = self._latency[key] = ([0] * len(LATENCY_BOUNDS), [0.0])
            hist[0][at] += 1
            hist[1][0] += seconds

    def rows(self, live: Iterable[ObjectAct | ChannelAct]) -> list[TypeRow]:
        """Every type's row: the live activations given plus those gone."""
        out: dict[tuple[str, str], TypeRow] = {}

        def row(key: tuple[str, str]) -> TypeRow:
            r = out.get(key)
            if r is None:
                r = out[key] = TypeRow(*key)
            return r

        for act in live:
            r = row((act.stats_kind, act.spec.name))
            lanes = act.owner.lanes
            r.live += 1
            r.handled += act.activity
            r.refused += lanes.refused
            r.waited += lanes.waited
        with self._lock:
            for key, (handled, refused, waited) in self._gone.items():
                r = row(key)
                r.handled += handled
                r.refused += refused
                r.waited += waited
            for key, (buckets, total) in self._latency.items():
                r = row(key)
                r.buckets = list(buckets)
                r.sum = total[0]
        return [out[k] for k in sorted(out)]


def timed(act: ObjectAct | ChannelAct, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a handler ``fn(*args)`` and record how long it took, failed or not (a coroutine:
    until it ends)."""
    stats = act.rt.directory.stats
    kind, name = act.stats_kind, act.spec.name
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except BaseException:
        stats.sample(kind, name, time.perf_counter() - t0)
        raise
    if isinstance(out, Coroutine):
        return _timed_coroutine(out, stats, kind, name, t0)
    stats.sample(kind, name, time.perf_counter() - t0)
    return out


async def _timed_coroutine(
    coro: Coroutine[Any, Any, Any], stats: TypeStats, kind: str, name: str, t0: float
) -> Any:
    try:
        return await coro
    finally:
        stats.sample(kind, name, time.perf_counter() - t0)
