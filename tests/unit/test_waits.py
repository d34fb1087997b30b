"""The waits of callers behind what a move's park or a route fence keeps (python-api §9;
``zlink.runtime.waits``)."""

from __future__ import annotations

from typing import Any

import pytest

import zlink
from zlink.executor import LaneLimits
from zlink.messaging.completion import Admitted, Completion
from zlink.runtime.waits import KeptWait, wait_behind


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
    waiting: list[KeptWait[str]] = []
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
