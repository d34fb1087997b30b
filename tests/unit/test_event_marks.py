"""The Logical Multicast marks' rules (``zlink.runtime.events``): what a subscriber counts as
missed, what it drops as a copy it had, and what it takes without counting."""

from __future__ import annotations

from zlink.mesh import wire
from zlink.runtime.events import EventLedger, Marks, offered


def _stamp(incarnation: int, epoch: int, number: int) -> wire.EventStamp:
    return wire.EventStamp(incarnation, epoch, number)


def _hear(ledger: EventLedger, origin: str, topic: str, *stamp: int) -> None:
    with ledger.lock(origin, topic):
        ledger.hear(origin, topic, _stamp(*stamp))


def test_a_subscriber_starts_from_what_its_node_heard_and_zero_marks_of_the_rest():
    ledger = EventLedger()
    _hear(ledger, "a", "news", 1, 1, 3)  # node a's numbering 1 of "news": 3 events heard
    _hear(ledger, "b", "other", 2, 7, 1)  # node b: only on another topic
    marks: Marks = {}
    ledger.subscribed(marks, "news", "me", 5)
    assert marks == {("a", "news"): (1, 1, 3), ("b", "news"): (2, 7, 0), ("me", "news"): (5, 0, 0)}


def test_a_zero_mark_counts_a_later_numbering_whole_and_never_its_own_or_an_older_one():
    ledger = EventLedger()
    _hear(ledger, "b", "other", 2, 7, 1)
    marks: Marks = {}
    ledger.subscribed(marks, "news", "me", 5)
    _hear(ledger, "b", "news", 2, 8, 2)  # a later numbering: both its events came after
    assert ledger.catch_up(marks, {"news"}) == 2
    assert marks[("b", "news")] == (2, 8, 2)

    older: Marks = {("b", "news"): (2, 9, 0)}  # numbering 8 may have begun before it joined
    assert ledger.catch_up(older, {"news"}) == 0
    assert older[("b", "news")] == (2, 9, 0)


def test_a_zero_mark_drops_nothing_as_a_copy():
    marks: Marks = {("b", "news"): (2, 9, 0)}
    assert offered(marks, "b", "news", _stamp(2, 8, 5), None) == 0  # taken, not a copy
    assert offered(marks, "b", "news", _stamp(2, 9, 1), None) == 0
    assert offered({("b", "news"): (2, 9, 1)}, "b", "news", _stamp(2, 9, 1), None) == -1


def test_a_newer_numbering_than_a_real_mark_began_after_it():
    """A node that forgot a topic's count (or restarted) numbers it anew: what the subscriber's
    node heard of the new numbering, and it was not offered, is past its mark."""
    ledger = EventLedger()
    marks: Marks = {("a", "news"): (1, 1, 3)}
    _hear(ledger, "a", "news", 1, 4, 2)
    assert ledger.catch_up(marks, {"news"}) == 2
    assert offered({("a", "news"): (1, 1, 3)}, "a", "news", _stamp(1, 4, 3), (1, 4, 2)) == 2
    assert offered({("a", "news"): (1, 1, 3)}, "a", "news", _stamp(1, 4, 1), (1, 1, 5)) == 2


def test_leaving_a_topic_drops_its_zero_marks():
    ledger = EventLedger()
    marks: Marks = {}
    ledger.subscribed(marks, "news", "me", 5)
    assert marks
    ledger.unsubscribed(marks, "news")
    assert marks == {}


def test_a_node_forgotten_gives_no_zero_mark():
    ledger = EventLedger()
    _hear(ledger, "b", "other", 2, 7, 1)
    ledger.forget_node("b")
    marks: Marks = {}
    ledger.subscribed(marks, "news", "me", 5)
    assert ("b", "news") not in marks
