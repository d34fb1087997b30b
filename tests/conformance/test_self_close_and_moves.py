"""An Instance Spot's close of itself meets a move (python-api §8, §11; kotlin-spot-interface
lifecycle). Found by review of the change that lets a close asked while a move waits for its
barrier withdraw the move: a close asked while the Spot *arrives* on a target was recorded and
acted on at an unrelated later move; a node's shutdown during such a seal closed the Spot
twice."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import zlink
from tests.conformance.test_relocation_withdrawn import Mover, _node_of
from tests.conftest import WAIT, until
from zlink.testing import LocalCluster, ManualClock

LOG: list[str] = []
CLOSE_ON_INIT = threading.Event()
BLOCK, BLOCKING, BLOCK_AGAIN = threading.Event(), threading.Event(), threading.Event()


class Where(zlink.Request[str], type_name="t.scm.where"):
    pass


class CloseAfterBlock(zlink.Message, type_name="t.scm.close_after_block"):
    pass


class Session(zlink.InstanceSpot):
    def on_initialize(self) -> None:
        LOG.append(f"initialized@{_node_of(self.context)}")
        if CLOSE_ON_INIT.is_set():
            self.context.close()

    @zlink.handler
    def where(self, req: Where) -> str:
        return _node_of(self.context)

    @zlink.handler
    def close_after_block(self, msg: CloseAfterBlock) -> None:
        BLOCKING.set()
        assert BLOCK.wait(WAIT)
        self.context.close()
        assert BLOCK_AGAIN.wait(WAIT)

    def on_closing(self, closing: zlink.SpotClosingContext) -> None:
        LOG.append(f"on_closing@{_node_of(self.context)}")


def build_app() -> zlink.App:
    app = zlink.App("self-close-and-moves")
    app.instance_spot("t.scm.recreated", relocation=zlink.Relocation.recreate())(
        type("Recreated", (Session,), {})
    )
    app.instance_spot(
        "t.scm.kept", relocation=zlink.Relocation.preserve_state(zlink.JsonStateAdapter)
    )(type("Kept", (Session,), {}))
    return app


@pytest.fixture
def cluster(clock: ManualClock) -> Iterator[LocalCluster]:
    LOG.clear()
    for event in (CLOSE_ON_INIT, BLOCK, BLOCKING, BLOCK_AGAIN):
        event.clear()
    with LocalCluster(build_app(), nodes=3, clock=clock, workers=2, request_timeout=20.0,
                      lease_seconds=1e6) as c:  # fmt: skip
        yield c
    BLOCK.set()
    BLOCK_AGAIN.set()


def test_a_close_asked_while_arriving_is_not_left_for_a_later_move(cluster: LocalCluster) -> None:
    """``on_initialize`` on the move's target closes the Spot while it is still sealed there
    (arriving): nothing is left pending (as on a first activation, the close is ignored), and
    its next move goes as any other."""
    n1, n2, _ = cluster.nodes
    c1 = n1.client()
    assert c1.request_to_spot("s", Where()).instance_spot("t.scm.recreated").wait(WAIT) == "node-1"
    CLOSE_ON_INIT.set()
    n1.relocate_spot("s", "node-2", timeout=10.0)
    CLOSE_ON_INIT.clear()
    cluster.wait_idle(WAIT)
    assert not n2._runtime.spots["s"].close_asked
    assert c1.request_to_spot("s", Where()).instance_spot("t.scm.recreated").wait(WAIT) == "node-2"
    n2.relocate_spot("s", "node-3", timeout=10.0)  # not failed by a close long past
    assert c1.request_to_spot("s", Where()).instance_spot("t.scm.recreated").wait(WAIT) == "node-3"
    assert not [e for e in LOG if e.startswith("on_closing")]


def test_a_shutdown_during_the_seal_closes_the_spot_once(cluster: LocalCluster) -> None:
    """The handler closed the Spot while its move waited for the barrier; the node's stop
    then began closing it (``HOST_SHUTDOWN``). The barrier's withdrawal set it ready again
    and closed it a second time (``spots_closed`` 2); it closes once."""
    n1 = cluster.node(0)
    c1 = n1.client()
    assert c1.request_to_spot("s", Where()).instance_spot("t.scm.kept").wait(WAIT) == "node-1"
    c1.send_to_spot("s", CloseAfterBlock()).instance_spot("t.scm.kept").submit()
    assert BLOCKING.wait(WAIT)
    act = n1._runtime.spots["s"]
    mover = Mover(n1, "s", "node-2", timeout=10.0)
    assert mover.sealed.wait(WAIT)
    BLOCK.set()
    until(lambda: act.close_asked, "the close to be asked while sealed")
    stopper = threading.Thread(target=n1.shutdown, args=(WAIT,), daemon=True)
    stopper.start()
    until(lambda: act.state.name == "CLOSING", "the stop to begin closing it")
    BLOCK_AGAIN.set()  # the handler ends: the barrier runs
    stopper.join(3 * WAIT)
    assert not stopper.is_alive()
    assert isinstance(mover.result(), zlink.ZLinkError)
    assert LOG.count("on_closing@node-1") == 1, LOG
    assert n1.counters().get("spots_closed", 0) == 1


def test_a_drain_does_not_take_a_spot_that_closed_itself_for_a_refusing_target(
    cluster: LocalCluster,
) -> None:
    """Found by review: a drain read the close's withdrawal of a move (``Unavailable``) as the
    target refusing moves, and sent no other Spot of that drain there. The Spot is reported
    as closed, and the target still takes the rest."""
    n1 = cluster.node(0)
    c1 = n1.client()
    c1.request_to_spot("a", Where()).instance_spot("t.scm.kept").wait(WAIT)
    c1.send_to_spot("a", CloseAfterBlock()).instance_spot("t.scm.kept").submit()
    assert BLOCKING.wait(WAIT)
    c1.request_to_spot("b", Where()).instance_spot("t.scm.kept").wait(WAIT)
    result: list[zlink.DrainResult] = []
    drainer = threading.Thread(target=lambda: result.append(n1.drain(timeout=10.0)))
    drainer.start()
    until(lambda: n1._runtime.spots["a"].state.name == "SEALED", "the drain to seal it")
    BLOCK.set()
    BLOCK_AGAIN.set()
    drainer.join(3 * WAIT)
    (drained,) = result
    assert drained.moved == ["b"] and list(drained.stayed) == ["a"]
    assert drained.stayed["a"].startswith("it closed")
    assert LOG.count("on_closing@node-1") == 1
