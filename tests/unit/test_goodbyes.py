"""Which peers left cleanly (``Transport.said_goodbye``): a clean stop is logged as one, not as
a crash (``NodeMembership``); the memory of goodbyes is bounded and forgets a node met again."""

from __future__ import annotations

from zlink.mesh.transport import GOODBYES_KEPT, InProcessTransport, remember_goodbye


class _Link:
    def received(self, *args: object) -> None: ...
    def peer_up(self, peer: str) -> None: ...
    def peer_down(self, peer: str) -> None: ...
    def writable(self, peer: str) -> None: ...


def _run(fn, *args):  # type: ignore[no-untyped-def]
    fn(*args)


def test_a_clean_detach_is_a_goodbye_and_a_dropped_link_is_not() -> None:
    transport = InProcessTransport()
    for node in ("a", "b", "c"):
        transport.attach(node, _Link(), _run)  # type: ignore[arg-type]
    transport.detach("b", goodbye=True)
    transport.detach("c")  # a dropped link (what tests do to simulate one)
    assert transport.said_goodbye("b") and transport.said_goodbye("b")  # asked by every peer
    assert not transport.said_goodbye("c") and not transport.said_goodbye("nobody")
    transport.attach("b", _Link(), _run)  # type: ignore[arg-type]
    assert not transport.said_goodbye("b")  # met again: its next leave is judged afresh


def test_goodbyes_are_bounded_oldest_first() -> None:
    goodbyes: dict[str, None] = {}
    for i in range(GOODBYES_KEPT + 5):
        remember_goodbye(goodbyes, f"n{i}", True)
    assert len(goodbyes) == GOODBYES_KEPT
    assert "n0" not in goodbyes and f"n{GOODBYES_KEPT + 4}" in goodbyes
    remember_goodbye(goodbyes, "n10", False)  # a leave without one forgets it
    assert "n10" not in goodbyes
