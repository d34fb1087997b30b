"""Audit of the Location Stores and how the runtime calls them (python-api §10, execution-model
§14): faults found, each a test that fails on the code as audited and passes once fixed."""

from __future__ import annotations

import threading
from typing import Any

import zlink
from tests.conftest import WAIT
from zlink.errors import ZLinkError
from zlink.testing import ManualClock


class Ping(zlink.Request[str], type_name="t.sa.ping"):
    pass


def build_app() -> zlink.App:
    app = zlink.App("store-audit")

    @app.user_spot("t.sa.room")
    class Room(zlink.UserSpot):
        @zlink.handler
        def ping(self, req: Ping) -> str:
            return "pong"

    return app


class Where(zlink.Request[str], type_name="t.sa.where"):
    pass


def build_moving_app() -> zlink.App:
    app = zlink.App("store-audit-move")

    @app.user_spot("t.sa.mroom", relocation=zlink.Relocation.recreate())
    class MRoom(zlink.UserSpot):
        @zlink.handler
        def where(self, req: Where) -> str:
            return self.context._rt.node_id  # type: ignore[attr-defined]

    return app


def test_a_move_committed_after_its_target_registered_again_does_not_lose_the_spot(
    clock: ManualClock,
) -> None:
    """``transfer(spot, node, incarnation, authority, target)`` names the target by node id
    only, and the store gives the Spot to whatever incarnation of ``target`` is live then
    (location.py ``transfer``: ``to = self._nodes.get(target)``; sqlite_store.py and the Redis
    ``_TRANSFER`` script alike). The move's state went to the target's *earlier*
    incarnation: one that fenced itself and registered again between the restore and the
    commit dropped it. The commit still succeeds, to the new incarnation: the store now names
    a live owner that has no such Spot, so it is never re-homed (its owner's lease holds) and
    every call fails until that node dies. A transfer fenced on the target's incarnation would
    be refused and the Spot would serve on at its source."""
    from zlink.mesh.location import no_lease
    from zlink.testing import LocalCluster

    with LocalCluster(build_moving_app(), nodes=2, clock=clock, workers=1,
                      lease_seconds=3.0) as cluster:  # fmt: skip
        n1, n2 = cluster.nodes
        store = cluster.store
        n1.client().spots.get_or_create("room", "t.sa.mroom").wait(WAIT)
        old2 = n2.incarnation
        real_transfer, real_renew = store.transfer, store.renew_node
        entered, go = threading.Event(), threading.Event()
        refusing = {"node-2": False}

        def transfer(spot_id: str, *rest: Any) -> Any:
            if spot_id == "room" and not entered.is_set():
                entered.set()  # the target restored the room; the commit is on its way
                assert go.wait(WAIT)
            return real_transfer(spot_id, *rest)

        def renew(node_id: str, incarnation: int, lease: float) -> Any:
            if refusing.get(node_id):  # node-2's lease is refused: it fences itself, and
                refusing[node_id] = False  # registers again as a new incarnation
                raise no_lease(node_id, incarnation)
            return real_renew(node_id, incarnation, lease)

        store.transfer = transfer  # type: ignore[method-assign]
        store.renew_node = renew  # type: ignore[method-assign]
        outcome: list[Any] = []

        def move() -> None:
            try:
                n1.relocate_spot("room", "node-2", timeout=WAIT)
                outcome.append("moved")
            except ZLinkError as exc:
                outcome.append(exc)

        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        try:
            assert entered.wait(WAIT)
            refusing["node-2"] = True
            clock.advance(1.0)  # node-2's next renewal is due: refused
            deadline = threading.Event()
            for _ in range(50):  # bounded: node-2 fenced and registered again
                if n2.incarnation != old2:
                    break
                deadline.wait(0.1)
            assert n2.incarnation != old2, "node-2 did not register again"
        finally:
            go.set()
        mover.join(WAIT)
        assert not mover.is_alive()
        cluster.wait_idle(WAIT)
        for _ in range(4):  # two leases pass, renewed: "re-homed on its next call" never comes
            clock.advance(1.5)
            cluster.wait_idle(WAIT)
        found = store.lookup("room")
        try:
            answer: Any = n1.client().request_to_spot("room", Where()).wait(WAIT)
        except ZLinkError as exc:
            answer = exc
        assert isinstance(answer, str), (
            f"the room is lost after the move ({outcome}): the store names {found}, node-2 is"
            f" at incarnation {n2.incarnation} (the move went to {old2}); a call got {answer!r}"
        )


# -- the SQLite store ----------------------------------------------------------------------------
