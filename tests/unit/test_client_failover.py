"""``zlink.mesh.client_failover``: which connection a client's calls go to, and reconnecting
(python-api §10). Connections here are fakes that follow a plan, so each interleaving a
review found is made on purpose; every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import WAIT, until
from zlink.errors import InvalidOperation, Unavailable
from zlink.mesh.client_failover import Failover


class _Fake:
    """A connection whose ``open`` does what its plan says: ``ok``, ``fail`` (no node),
    ``fault`` (an unexpected error), or ``lost_at_once`` (up, then lost before the client
    installs it: its loss callback runs first)."""

    def __init__(
        self, endpoint: str, lost: Callable[[], None], plan: list[str],
        named: dict[str, tuple[str, ...]],
    ) -> None:  # fmt: skip
        self.endpoint, self._lost, self._plan = endpoint, lost, plan
        self.state = "connecting"
        self.node_id = f"node@{endpoint}"
        self.mesh = "main"  # what its node's WELCOME names (one mesh throughout here)
        self.peers = named.get(endpoint, ())  # what its node's WELCOME names
        self.retired = False
        self.said_goodbye = False  # its node's BYE ended it (a graceful stop)
        self.going_away = False  # its node said it goes away (a drain)
        self.pending = False  # something is pending on it

    def busy(self) -> bool:
        return self.pending

    def open(self, timeout: float, cancel: threading.Event | None = None) -> None:
        how = self._plan.pop(0) if self._plan else "fail"
        if how == "fail":
            raise Unavailable(f"no node answered at {self.endpoint}")
        if how == "fault":
            raise OSError("too many open files")
        self.state = "up"
        if how == "lost_at_once":
            self.lose()

    def lose(self) -> None:
        self.state = "lost"
        self._lost()

    def retire(self) -> None:
        self.retired = True

    def close(self) -> None:
        self.state = "closed"


def _failover(
    plan: list[str], endpoints: tuple[str, ...] = ("tcp://127.0.0.1:1",), reconnect: bool = True,
    named: dict[str, tuple[str, ...]] | None = None,
) -> tuple[Failover, list[_Fake], dict[str, int]]:  # fmt: skip
    made: list[_Fake] = []
    counts: dict[str, int] = {}

    def make(endpoint: str, lost: Callable[[], None], away: Callable[[], None]) -> Any:
        made.append(_Fake(endpoint, lost, plan, named or {}))
        made[-1].away = away
        return made[-1]

    def count(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    return Failover(endpoints, make, 1.0, reconnect, 0.2, count), made, counts


def test_a_connection_lost_before_it_was_installed_is_not_taken_for_up():
    """A review's finding: a reconnect whose new connection was lost between its handshake
    and the swap installed it as up, and nobody reconnected again."""
    failover, made, counts = _failover(["ok", "lost_at_once", "ok"])
    failover.open()
    made[0].lose()  # the loop starts
    failover.wait_connected(WAIT)
    assert failover.current is made[2] and made[2].state == "up"
    assert made[1].state == "lost" and counts["reconnects"] == 1
    assert made[0].retired and made[1].retired  # each lost one's threads were ended
    failover.close()


def test_a_loss_after_the_close_never_makes_wait_connected_hang():
    """A review's finding: a loss reported just after close() marked the client as not
    connected again, and wait_connected(None) on the closed client waited forever."""
    failover, made, _counts = _failover(["ok"])
    failover.open()
    failover.close()
    made[0].lose()  # (its callback, just after)
    with pytest.raises(InvalidOperation):
        failover.wait_connected(None)
    assert failover._loop is None


def test_without_reconnect_a_lost_client_stays_lost_and_says_so_at_once():
    """A client probe: ``wait_connected()`` on a lost ``reconnect=False`` client blocked for
    ever (it waited for a reconnect that never comes); it is ``Unavailable`` at once."""
    failover, made, _counts = _failover(["ok", "ok"], reconnect=False)
    failover.open()
    made[0].lose()
    started = time.monotonic()
    with pytest.raises(Unavailable, match="reconnect=False"):
        failover.wait_connected(WAIT)
    assert time.monotonic() - started < WAIT / 2
    assert len(made) == 1
    failover.close()


def test_a_fault_of_one_attempt_is_counted_and_the_loop_goes_on():
    failover, made, counts = _failover(["ok", "fault", "fail", "ok"])
    failover.open()
    made[0].lose()
    failover.wait_connected(WAIT)
    assert counts["reconnect_errors"] == 1 and failover.current is made[3]
    failover.close()


def test_the_lost_endpoint_is_tried_first_then_the_others_in_turn():
    endpoints = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3")
    failover, made, _counts = _failover(["fail", "ok", "fail", "fail", "ok"], endpoints)
    failover.open()  # 1 does not answer, 2 does
    assert failover.current.endpoint == endpoints[1]
    made[1].lose()
    failover.wait_connected(WAIT)
    assert [c.endpoint for c in made[2:]] == [endpoints[1], endpoints[2], endpoints[0]]
    failover.close()


def test_close_while_reconnecting_ends_the_loop_at_once():
    failover, made, _counts = _failover(["ok"])  # then no node answers, ever
    failover.open()
    made[0].lose()
    loop = failover._loop
    assert loop is not None
    failover.close()
    assert not loop.is_alive()
    assert made[0].state == "closed"
    with pytest.raises(InvalidOperation):
        failover.wait_connected(0.05)


def test_open_with_no_node_answering_says_why_for_each_endpoint():
    endpoints = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    failover, _made, _counts = _failover(["fail", "fail"], endpoints)
    with pytest.raises(Unavailable, match=r"127\.0\.0\.1:1.*127\.0\.0\.1:2"):
        failover.open()


def test_a_reconnect_also_tries_the_endpoints_the_last_node_named():
    """Given one endpoint, a client learns the other nodes of the mesh from the node it is
    connected to (``WELCOME``), and fails over to them; then to what that node names."""
    one, two, three = (f"tcp://127.0.0.1:{n}" for n in (1, 2, 3))
    named = {one: (two,), two: (one, three)}
    failover, made, _counts = _failover(
        ["ok", "fail", "ok", "fail", "fail", "ok"], (one,), named=named
    )
    failover.open()
    assert failover.endpoints == (one, two)
    made[0].lose()
    failover.wait_connected(WAIT)  # 1 does not answer, 2 does
    assert [c.endpoint for c in made[1:]] == [one, two]
    assert failover.endpoints == (one, three)  # what 2 names, after what was given
    made[2].lose()
    failover.wait_connected(WAIT)  # the lost one (named by nobody now) first, then 1, then 3
    assert [c.endpoint for c in made[3:]] == [two, one, three]
    failover.close()


def test_a_node_that_said_goodbye_is_tried_last():
    """A service probe: after a node's graceful stop its clients spent 2.1-2.2 s (16 of 16
    runs) trying it again first, every call failing meanwhile, before they turned to the
    node it had named. A node that said goodbye left: the others go first."""
    one, two = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    failover, made, _counts = _failover(["ok", "ok"], (one, two))
    failover.open()
    made[0].said_goodbye = True
    made[0].lose()
    failover.wait_connected(WAIT)
    assert [c.endpoint for c in made[1:]] == [two]  # not the one that left
    failover.close()


def test_a_connection_whose_node_goes_away_is_replaced_and_closed_once_idle():
    """A probe's client of a draining node had every call refused for the whole drain while
    another node served: a node going away (``WELCOME`` under ``GOING_AWAY``) makes the
    client connect to another node (the one going away last), and the connection left
    behind ends once nothing is pending on it; its later loss starts no reconnect."""
    first, second = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    failover, made, counts = _failover(["ok", "ok"], endpoints=(first,),
                                       named={first: (second,)})  # fmt: skip
    failover.open()
    old = made[0]
    old.pending = True  # a call it took is still being answered
    old.going_away = True
    old.away()
    until(lambda: failover.current is not old and failover.current.state == "up", "moved on")
    assert failover.current.endpoint == second and counts.get("moves_on_node_going_away") == 1
    assert old.state == "up"  # it still answers what it took
    old.pending = False
    until(lambda: old.state == "closed", "the connection left behind closed once idle")
    old.lose()  # its node's goodbye, later: not the calls' connection, so no reconnect
    until(lambda: old.retired, "its threads end")
    assert len(made) == 2 and failover.current.state == "up"
    failover.close()


def test_a_going_away_notice_of_a_connection_left_behind_changes_nothing():
    first, second = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    failover, made, _counts = _failover(["ok", "ok"], endpoints=(first, second))
    failover.open()
    made[0].going_away = True
    made[0].away()
    until(lambda: len(made) == 2 and failover.current is made[1], "moved on")
    made[0].away()  # (a repeat, from the one left behind)
    assert len(made) == 2 and failover.current is made[1]
    failover.close()
