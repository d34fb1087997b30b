"""Logical Multicast event numbers: a subscriber that moves takes each event once.

A publish goes once to every node (README, "Logical Multicast"), each copy on the connection
between its node and that one, so the copies for two nodes arrive in either order. A subscriber
that moves from one node to another while an event is on its way to both could meet both
copies (its old node's before the move, its new node's after) or neither (its new node's came
before it did, its old node's after it left).

* **Numbers.** Each node numbers the events it makes, per topic (:class:`EventLedger`), and
  holds the lock of that (node, topic) while it hands the event to its own subscribers and to
  every other node's outbox: so one node's events on one topic reach every node, and every
  subscriber there, in the order of their numbers (one DATA connection per pair of nodes,
  read in order on the receiving node's infrastructure thread, which offers them under the
  same lock). Each node also keeps the last number it heard from every node on every topic.
* **Marks.** A subscriber keeps, per (origin node, topic), the stamp of the last event it was
  offered and accounted for (taken, or refused and counted: a full lane, no handler), and its
  move carries them (``RelocObject.marks``). When it subscribes its marks come up to what its
  node had heard on the topic. An event whose stamp is not past its mark is a copy it had:
  dropped, counted ``publish_duplicates_dropped``. When it leaves a topic it keeps only the
  marks still ahead of what its node heard (copies of those may still come).
* **Misses.** A subscriber sealed for a move is not offered an event at all (neither marked
  nor counted): its copy on the other node may still reach it. When the subscriber opens (on
  its new node, or back on its old one after a move that did not happen, also when that one
  then closes it), what that node heard on its topics past its marks never reached it (the
  other copy came while it was sealed there, or after it left): counted at once,
  ``publish_missed_moving``, and marked. An event the node itself never heard (dropped on its
  way: counted where it was dropped) is not counted again by its subscribers. A numbering
  newer than a mark (a restarted node, a count forgotten) began after the marked event: all
  of it that the node heard is counted.
* **Marks of nothing yet.** A subscriber whose node had heard nothing from a node on its topic
  when it subscribed starts from a *zero mark* of that node, ``(incarnation, epoch, 0)``: the
  newest numbering its node had heard from that node on any topic (its own node: whatever it
  numbered, or ``(incarnation, 0)``). The events of any later numbering reach its node after
  it subscribed (one connection per pair of nodes, in order), so one missed while moving is
  counted; those of that numbering or an older one are taken and never counted (its node may
  have missed the start of them, dropped on the way, before it subscribed). A node its node
  had heard nothing from at all (met since, or whose every event so far was dropped on the
  way) has no zero mark: its first events missed while moving are counted nowhere. One
  over-count stays (a review's find): a later numbering whose first events were dropped on
  their way to its node (counted where dropped) *before* it subscribed, then heard on its new
  node, counts them as missed too.
* **Locks.** One lock per stripe of (origin, topic) pairs (:data:`STRIPES`, all
  ``LockRank.PUBLISH``, never two held at once): offers of one pair are serialized, in number
  order, and a node's infrastructure thread waits for another thread's publish only when the
  two pairs share a stripe. A move reads the marks after its seal, once it has passed through
  every stripe (:meth:`EventLedger.barrier`): an offer made before the seal has marked by then,
  one made after it is refused by the seal. ``_shape`` (a leaf) guards the tables' shape.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from ..executor import ranked_lock
from ..lock_order import LockRank
from ..mesh import wire

MAX_TOPICS: Final = 100_000
"""The topics a node keeps an event count, and what it heard, for; past it the oldest goes
(the topic's next event made here begins a new numbering, with a greater epoch)."""

STRIPES: Final = 64
"""Locks over (origin, topic) pairs: one pair's offers are serialized, most pairs' are not."""

Mark = tuple[int, int, int]
"""A stamp as a subscriber keeps it: ``(incarnation, epoch, number)``, ordered as sent."""

Marks = dict[tuple[str, str], Mark]
"""A subscriber's marks: per (origin node, topic), the last event it was offered."""


def _mark(stamp: wire.EventStamp) -> Mark:
    return (stamp.incarnation, stamp.epoch, stamp.number)


class EventLedger:
    """This node's numbers for the events it makes, and the last event it heard from each
    node (itself too) on each topic. Methods that take an ``(origin, topic)`` pair are called
    with :meth:`lock` of that pair held; the rest take the locks they need."""

    __slots__ = ("_counts", "_epochs", "_heard", "_latest", "_shape", "_stripes")

    def __init__(self) -> None:
        self._stripes = tuple(
            ranked_lock("runtime.publish", LockRank.PUBLISH) for _ in range(STRIPES)
        )
        self._shape = threading.Lock()  # (a leaf: adding and evicting topics)
        self._counts: dict[str, Mark] = {}
        self._epochs = 0
        self._heard: dict[str, dict[str, Mark]] = {}
        self._latest: dict[str, tuple[int, int]] = {}  # per node, the newest numbering heard

    def lock(self, origin: str, topic: str) -> Any:
        """The lock of ``origin``'s events on ``topic``."""
        return self._stripes[hash((origin, topic)) % STRIPES]

    def barrier(self) -> None:
        """Pass through every stripe, one at a time: every offer under way when this began
        has ended (a move reads its sealed subscriber's marks after this)."""
        for lock in self._stripes:
            with lock:
                pass

    def next(self, topic: str, incarnation: int) -> wire.EventStamp:
        """(The lock of this node and ``topic`` held.) The stamp of the next event made here
        on ``topic`` (``incarnation``: this node's now, which a new numbering records)."""
        with self._shape:  # (an eviction iterates the table: nothing may change its size)
            count = self._counts.get(topic)
            if count is None:
                if len(self._counts) >= MAX_TOPICS:
                    del self._counts[next(iter(self._counts))]  # (the oldest numbering)
                self._epochs += 1
                count = (incarnation, self._epochs, 1)
            else:
                count = (count[0], count[1], count[2] + 1)
            self._counts[topic] = count
        return wire.EventStamp(*count)

    def hear(self, origin: str, topic: str, stamp: wire.EventStamp) -> Mark | None:
        """(The pair's lock held.) This node had ``origin``'s event ``stamp`` on ``topic``
        (offered to the subscribers there are, or to none); the one it had before, if any."""
        nodes = self._heard.get(topic)
        if nodes is None:  # (topics come and go under ``_shape`` only)
            with self._shape:
                nodes = self._heard.get(topic)
                if nodes is None:
                    if len(self._heard) >= MAX_TOPICS:
                        del self._heard[next(iter(self._heard))]
                    nodes = self._heard[topic] = {}
        before = nodes.get(origin)
        heard = nodes[origin] = _mark(stamp)
        if before is None or before[:2] != heard[:2]:  # (a numbering new here: rare)
            with self._shape:
                latest = self._latest.get(origin)
                if latest is None or latest < heard[:2]:
                    self._latest[origin] = heard[:2]
        return before

    def _origins(self, topic: str) -> list[str]:
        nodes = self._heard.get(topic)
        return [] if nodes is None else list(nodes)

    def _heard_of(self, origin: str, topic: str) -> Mark | None:
        nodes = self._heard.get(topic)
        return None if nodes is None else nodes.get(origin)

    def subscribed(self, marks: Marks, topic: str, me: str, incarnation: int) -> None:
        """A subscriber with ``marks`` joined ``topic`` here (this node: ``me`` in its
        ``incarnation``): what this node heard on it so far is before its time (its marks
        come up to it; one ahead of it stays); a node it heard nothing from on it gives a
        zero mark of the newest numbering heard from that node."""
        with self._shape:
            latest = dict(self._latest)
        latest.setdefault(me, (incarnation, 0))
        for origin in set(latest).union(self._origins(topic)):
            key = (origin, topic)
            with self.lock(origin, topic):
                last = self._heard_of(origin, topic)
                had = marks.get(key)
                if last is not None:
                    if had is None or had < last:
                        marks[key] = last
                elif had is None and origin in latest:
                    marks[key] = (*latest[origin], 0)

    def unsubscribed(self, marks: Marks, topic: str) -> None:
        """A subscriber with ``marks`` left ``topic``: the marks its node has caught up with
        go (subscribed again, it starts from what the node heard); those ahead of it stay,
        as copies of what they mark may still come."""
        for origin, _topic in [k for k in list(marks) if k[1] == topic]:  # (a snapshot:
            # ``list`` copies in one step, while offers of other stripes may add keys)
            with self.lock(origin, topic):
                last = self._heard_of(origin, topic)
                had = marks.get((origin, topic))
                if had is not None and (had[2] == 0 or (last is not None and had <= last)):
                    del marks[(origin, topic)]  # (a zero mark marks no event)

    def catch_up(self, marks: Marks, topics: frozenset[str] | set[str]) -> int:
        """A subscriber with ``marks`` opens here after a move (arrived, or back from one that
        did not happen): what this node heard on its ``topics`` while it was sealed or away
        is past its marks and never reached it (its copy elsewhere came while it was sealed
        there, or after it left). Counted now (the number returned), and marked."""
        missed = 0
        for topic in topics:
            for origin in self._origins(topic):
                with self.lock(origin, topic):
                    last = self._heard_of(origin, topic)
                    key = (origin, topic)
                    had = marks.get(key)
                    if last is None or (had is not None and last <= had):
                        continue
                    if had is not None:
                        missed += _past(had, last)
                    marks[key] = last
        return missed

    def forget_node(self, origin: str) -> None:
        """``origin`` is gone for good (declared down, or left): what was heard from it goes
        (a later incarnation of it numbers anew)."""
        with self._shape:
            tables = list(self._heard.values())
            self._latest.pop(origin, None)
        for nodes in tables:
            nodes.pop(origin, None)


def _past(had: Mark, last: Mark) -> int:
    """How many events of ``last``'s numbering, up to it, are past the mark ``had`` (``last``
    after it): of the same numbering, those after the mark; of a newer numbering than the
    mark's, all of it (it began after the marked event, or after the subscriber subscribed
    for a zero mark); none of an older one, nor of a zero mark's own numbering (its node may
    have missed the start of it before the subscriber subscribed)."""
    if last[:2] == had[:2]:
        return last[2] - had[2] if had[2] else 0
    return last[2] if last[:2] > had[:2] else 0


def offered(marks: Marks | None, origin: str, topic: str, stamp: wire.EventStamp,
            before: Mark | None) -> int:  # fmt: skip
    """(The pair's lock held.) An event ``stamp`` of ``origin`` on ``topic`` is offered to a
    subscriber with ``marks``; ``before``: the one this node heard before it. ``-1``: a copy
    it had (or older than one it had); else how many events this node heard that never
    reached it (sealed, or away), past its mark and before this one."""
    if not marks:
        return 0
    had = marks.get((origin, topic))
    if had is None:
        return 0
    this = _mark(stamp)
    if this <= had:
        return 0 if had[2] == 0 else -1  # (a zero mark: it took nothing of that node yet)
    if before is None or before <= had or before[:2] not in (had[:2], this[:2]):
        return 0  # (a gap this node did not hear was counted where it was dropped)
    return _past(had, before)


def mark(marks: Marks, origin: str, topic: str, stamp: wire.EventStamp) -> None:
    """(The pair's lock held.) The subscriber has been offered ``stamp``'s event, and it is
    accounted for (taken, or refused and counted)."""
    marks[(origin, topic)] = _mark(stamp)


def forget_node(marks: Marks | None, origin: str) -> None:
    """``origin`` is gone for good: a subscriber's marks of it go."""
    if marks:
        for key in [k for k in list(marks) if k[0] == origin]:  # (a snapshot, in one step)
            marks.pop(key, None)


def to_wire(marks: Marks | None, topics: tuple[str, ...]) -> tuple[wire.EventMark, ...]:
    """The marks a moving (sealed, past :meth:`EventLedger.barrier`) subscriber takes along:
    those of ``topics``, the topics it is subscribed to."""
    if not marks:
        return ()
    kept = set(topics)
    return tuple(
        wire.EventMark(origin, topic, *last)
        for (origin, topic), last in sorted(marks.items())
        if topic in kept
    )


def from_wire(marks: tuple[wire.EventMark, ...]) -> Marks | None:
    """A subscriber's marks as its move brought them (``None`` when there are none)."""
    if not marks:
        return None
    return {(m.origin, m.topic): (m.incarnation, m.epoch, m.number) for m in marks}


__all__ = [
    "MAX_TOPICS",
    "STRIPES",
    "EventLedger",
    "Mark",
    "Marks",
    "forget_node",
    "from_wire",
    "mark",
    "offered",
    "to_wire",
]
