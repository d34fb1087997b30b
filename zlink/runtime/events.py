"""Logical Multicast event numbers: a subscriber that moves takes each event once.

A publish goes once to every node (README, "Logical Multicast"), each copy on the connection
between its node and that one, so the copies for two nodes arrive in either order. A subscriber
that moves from one node to another while an event is on its way to both could meet both
copies (its old node's before the move, its new node's after) or neither (its new node's came
before it did, its old node's after it left).

* **Numbers.** Each node numbers the events it makes, per topic (:class:`EventLedger`), under
  the runtime's publish lock, which it holds while it hands the event to its own subscribers
  and to every other node's outbox: so one node's events on one topic reach every node, and
  every subscriber there, in the order of their numbers (one DATA connection per pair of
  nodes, read in order on the receiving node's infrastructure thread). Each node also keeps
  the last number it heard from every node on every topic.
* **Marks.** A subscriber keeps, per (origin node, topic), the stamp of the last event it was
  offered and accounted for (taken, or refused and counted: a full lane, no handler), and its
  move carries them (``RelocObject.marks``). It starts, when it subscribes, from what its
  node had heard on the topic. An event whose stamp is not past its mark is a copy it had:
  dropped, counted ``publish_duplicates_dropped``.
* **Misses.** A subscriber sealed for a move is not offered an event at all (neither marked
  nor counted): its copy on the other node may still reach it. When the subscriber opens
  (on its new node, or back on its old one after a move that did not happen), what that node
  heard on its topics past its marks never reached it (the other copy came while it was
  sealed there, or after it left): counted at once, ``publish_missed_moving``, and marked; an
  event whose number is past its mark by more than one counts the ones between the same way.
  A subscriber with no mark for a node and topic (its node had heard nothing from that node
  on it when it subscribed, and it was offered nothing since) counts from the first event it
  is offered.
* **Why a lock.** Offers write marks under the publish lock, and a move reads them under it
  after its seal (admission closed): an event is either marked before the move reads the marks
  or refused by the seal, never admitted and then forgotten by the move.

Lock: the runtime's publish lock (``LockRank.PUBLISH``) guards :class:`EventLedger` and every
subscriber's marks; nothing else is taken under it but the leaf locks of lanes and outboxes.
"""

from __future__ import annotations

from typing import Final

from ..mesh import wire

MAX_TOPICS: Final = 100_000
"""The topics a node keeps an event count, and what it heard, for; past it the oldest goes
(the topic's next event made here begins a new numbering, with a greater epoch)."""

Mark = tuple[int, int, int]
"""A stamp as a subscriber keeps it: ``(incarnation, epoch, number)``, ordered as sent."""

Marks = dict[tuple[str, str], Mark]
"""A subscriber's marks: per (origin node, topic), the last event it was offered."""


class EventLedger:
    """(Publish lock held, every method.) This node's numbers for the events it makes, and the
    last event it heard from each node (itself too) on each topic."""

    __slots__ = ("_counts", "_epochs", "_heard")

    def __init__(self) -> None:
        self._counts: dict[str, Mark] = {}
        self._epochs = 0
        self._heard: dict[str, dict[str, Mark]] = {}

    def next(self, topic: str, incarnation: int) -> wire.EventStamp:
        """The stamp of the next event made here on ``topic`` (``incarnation``: this node's
        now, which a new numbering records)."""
        counts = self._counts
        count = counts.get(topic)
        if count is None:
            if len(counts) >= MAX_TOPICS:
                del counts[next(iter(counts))]  # (the oldest numbering)
            self._epochs += 1
            count = (incarnation, self._epochs, 1)
        else:
            count = (count[0], count[1], count[2] + 1)
        counts[topic] = count
        return wire.EventStamp(*count)

    def hear(self, origin: str, topic: str, stamp: wire.EventStamp) -> None:
        """This node had ``origin``'s event ``stamp`` on ``topic`` (offered to its subscribers
        there are, or to none): the last of that node and topic so far."""
        heard = self._heard
        nodes = heard.get(topic)
        if nodes is None:
            if len(heard) >= MAX_TOPICS:
                del heard[next(iter(heard))]
            nodes = heard[topic] = {}
        nodes[origin] = (stamp.incarnation, stamp.epoch, stamp.number)

    def subscribed(self, marks: Marks, topic: str) -> None:
        """A subscriber with ``marks`` joined ``topic`` here: what this node heard on it so
        far is before its time (a later gap in the numbers is a miss; without such a mark it
        counts from the first event it is offered). A mark it has already stays."""
        for origin, last in self._heard.get(topic, {}).items():
            marks.setdefault((origin, topic), last)

    def catch_up(self, marks: Marks, topics: frozenset[str] | set[str]) -> int:
        """A subscriber with ``marks`` opens here after a move (arrived, or back from one that
        did not happen): what this node heard on its ``topics`` while it was sealed or away
        is past its marks and never reached it (its copy elsewhere came while it was sealed
        there, or after it left). Counted now (the number returned), and marked."""
        missed = 0
        for topic in topics:
            for origin, last in self._heard.get(topic, {}).items():
                key = (origin, topic)
                had = marks.get(key)
                if had is not None and last <= had:
                    continue
                if had is not None and had[:2] == last[:2]:
                    missed += last[2] - had[2]
                marks[key] = last
        return missed


def missed_before(marks: Marks | None, origin: str, topic: str,
                  stamp: wire.EventStamp) -> int:  # fmt: skip
    """(Publish lock held.) How many events of ``origin`` on ``topic`` a subscriber with
    ``marks`` never got before the one ``stamp`` numbers; ``-1`` if it had that one already
    (or a later one of the same node and topic)."""
    if not marks:
        return 0
    last = marks.get((origin, topic))
    if last is None:
        return 0
    now = (stamp.incarnation, stamp.epoch, stamp.number)
    if now <= last:
        return -1
    if now[:2] != last[:2]:
        return 0  # a new numbering: what came before it cannot be counted
    return stamp.number - last[2] - 1


def mark(marks: Marks, origin: str, topic: str,
         stamp: wire.EventStamp) -> None:  # fmt: skip
    """(Publish lock held.) The subscriber has been offered ``stamp``'s event, and it is
    accounted for (taken, or refused and counted)."""
    marks[(origin, topic)] = (stamp.incarnation, stamp.epoch, stamp.number)


def forget_topic(marks: Marks | None, topic: str) -> None:
    """(Publish lock held.) The subscriber left ``topic``: its marks on it go (subscribed
    again, it takes the next event as it comes)."""
    if marks:
        for key in [k for k in marks if k[1] == topic]:
            del marks[key]


def to_wire(marks: Marks | None, topics: tuple[str, ...]
            ) -> tuple[wire.EventMark, ...]:  # fmt: skip
    """(Publish lock held.) The marks a moving subscriber takes along: those of ``topics``,
    the topics it is subscribed to."""
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
    "EventLedger",
    "Mark",
    "Marks",
    "forget_topic",
    "from_wire",
    "mark",
    "missed_before",
    "to_wire",
]
