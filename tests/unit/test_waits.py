"""The waits of callers behind what a move's park or a route fence keeps (python-api §9;
``zlink.runtime.waits``)."""

from __future__ import annotations

from typing import Any

import pytest

import zlink
from zlink.executor import LaneLimits
from zlink.messaging.completion import Admitted, Completion
from zlink.runtime.waits import KeptWait, WaitLine, take_waiting, unwait, wait_behind


class _Rt:
    """What ``wait_behind`` asks of a runtime."""

    def __init__(self, waiters: int) -> None:
        self.limits = LaneLimits(waiters=waiters)
        self.counted: list[str] = []
        self.armed: list[str] = []
        self.metrics = self

    def add(self, name: str, n: int = 1) -> None:
        self.counted.append(name)

    def arm_room(self, room: Admitted, what: str) -> None:
        self.armed.append(what)


class _Call:
    kind, target = "spot", "room"


def test_waits_from_peers_do_not_crowd_out_a_caller_here():
    """Found by review: a caller on this node was refused ("N callers wait for it already")
    behind thousands of waits from peers, which their peers' backlogs bound, not
    ``LaneLimits.waiters`` (the lanes count only their own callers since this session)."""
    rt: Any = _Rt(waiters=2)
    waiting: WaitLine[str] = WaitLine()
    never = lambda wait: False  # noqa: E731 - a withdraw that finds nothing (not called here)
    for n in range(3):  # calls from a peer: they wait, whatever their number
        wait_behind(rt, waiting, [f"peer-{n}"], _Call(), None, Admitted(peer="node-2"), never,
                    "is moving, and its park", "the moving")  # fmt: skip
    for n in range(2):  # callers here: up to the limit
        wait_behind(rt, waiting, [f"mine-{n}"], _Call(), None, Admitted(), never,
                    "is moving, and its park", "the moving")  # fmt: skip
    assert [w.items for w in waiting][-2:] == [["mine-0"], ["mine-1"]]
    with pytest.raises(zlink.ResourceExhausted, match="2 callers wait"):
        wait_behind(rt, waiting, ["mine-2"], _Call(), Completion(), None, never,
                    "is moving, and its park", "the moving")  # fmt: skip
    assert len(waiting) == 5 and rt.armed == ["the moving spot 'room'"] * 2


def test_each_call_that_waits_costs_the_same_however_many_wait_before_it(monkeypatch):
    """Found by a probe: past ``LaneLimits.waiters`` waits, every new call summed the
    ``bounded`` flag of every wait before it, under the keeper's lock: a move re-routing
    22,849 waits from peers so held its node's infrastructure thread until the node fenced
    itself. A line counts them as they come and go now: each wait is looked at once."""
    looked = [0]
    bounded = KeptWait.bounded

    def counted(self: KeptWait[Any]) -> bool:
        looked[0] += 1
        return bool(bounded.fget(self))  # type: ignore[attr-defined]

    monkeypatch.setattr(KeptWait, "bounded", property(counted))
    rt: Any = _Rt(waiters=10)
    waiting: WaitLine[str] = WaitLine()
    never = lambda wait: False  # noqa: E731 - not called here
    for n in range(2_000):  # from peers, and some made here (a send's wait)
        room = Admitted() if n % 400 == 0 else Admitted(peer="node-2")
        wait_behind(rt, waiting, [f"c{n}"], _Call(), None, room, never, "is full", "the full")
    assert len(waiting) == 2_000 and waiting.bounded == 5
    assert looked[0] <= 2 * 2_000, f"{looked[0]} looks for 2,000 waits"


def test_a_line_counts_its_bounded_waits_as_they_leave():
    """Withdrawn (``unwait``), or taken in (``take_waiting``): the count follows, so a caller
    here is refused only while ``LaneLimits.waiters`` of them really wait."""
    rt: Any = _Rt(waiters=2)
    waiting: WaitLine[str] = WaitLine()
    never = lambda wait: False  # noqa: E731 - not called here
    mine = [Admitted(), Admitted()]
    for n, room in enumerate(mine):
        wait_behind(rt, waiting, [f"mine-{n}"], _Call(), None, room, never, "is full", "the full")
    with pytest.raises(zlink.ResourceExhausted):
        wait_behind(rt, waiting, ["mine-2"], _Call(), None, Admitted(), never, "is full", "")
    first = next(iter(waiting))
    assert unwait(_NoLock(), waiting, first) and not unwait(_NoLock(), waiting, first)
    assert waiting.bounded == 1
    wait_behind(rt, waiting, ["mine-3"], _Call(), None, Admitted(), never, "is full", "the full")
    taken: list[str] = []
    rooms = take_waiting(waiting, taken.extend)
    assert taken == ["mine-1", "mine-3"] and len(rooms) == 2
    assert not waiting and waiting.bounded == 0


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
